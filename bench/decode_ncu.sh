#!/bin/bash
# What the device does in a decode step, kernel by kernel (gpu/NOTES.md,
# twenty-fourth session): bench/decode under Nsight Compute, every kernel
# whose name starts with k_ after the prefill, with the caches left as the
# step leaves them (--cache-control none: the attention kernel's L2
# prefetch of R_v is what k_segrot reads) and the clocks as found.  Prints
# per kernel name: launches, total and mean duration, DRAM bytes read,
# warp instructions; then the sum of the means (a layer's step, where each
# kernel runs once a layer and step).
# Run from the repository root on the GPU machine after `. .devdeps/env.sh`;
# builds bench/decode in $B if it is not there.  Knobs: DECODE_ARGS (default
# 4 layers at 1M tokens, 2 + 2 timed tokens after 1 warm-up), NCU_N (how many
# launches to profile), NCU_T (timeout, s), NCU_SUM=0 (skip this table).
set -u
OUT=${OUT:-out}
B=${B:-/tmp/bd}
mkdir -p "$OUT"
if [ ! -x $B/bench/decode ]; then
  { meson setup $B -Dcuda=enabled -Dtests=false > "$OUT/setup.log" 2>&1 &&
    ninja -C $B bench/decode > "$OUT/build.log" 2>&1; } ||
    { tail -30 "$OUT/setup.log" "$OUT/build.log"; exit 1; }
fi
ARGS=${DECODE_ARGS:---layers 4 --context 1048576 --tokens 2 --warmup 1 --workers 14 --host-gib 16}
KRE=${NCU_KRE:-^k_}
if [ "${NCU_SUM:-1}" = 1 ]; then
# shellcheck disable=SC2086
timeout ${NCU_T:-420} ncu --clock-control none --cache-control none \
  --kernel-name-base function --kernel-name regex:"$KRE" --launch-count ${NCU_N:-600} \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum \
  -o "$OUT/decode" -f $B/bench/decode $ARGS > "$OUT/ncu_run.log" 2>&1
echo "ncu rc=$?"
tail -5 "$OUT/ncu_run.log"
ncu -i "$OUT/decode.ncu-rep" --page raw --csv \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum \
  > "$OUT/raw.csv" 2>&1
rm -f "$OUT/decode.ncu-rep"
python3 - "$OUT/raw.csv" <<'EOF'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[0]
def col(name):
    return hdr.index(name)
kn, tm, by, ins = (col("Kernel Name"), col("gpu__time_duration.sum"),
                   col("dram__bytes_read.sum"), col("smsp__inst_executed.sum"))
units = rows[1]
agg = collections.OrderedDict()
for r in rows[2:]:
    if len(r) <= max(kn, tm, by, ins):
        continue
    def num(i):
        try:
            return float(r[i].replace(",", ""))
        except ValueError:
            return 0.0
    t = num(tm) * {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0,
                   "ms": 1e3, "msecond": 1e3}[units[tm]]
    b = num(by) * {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}[units[by]]
    a = agg.setdefault(r[kn], [0, 0.0, 0.0, 0.0])
    a[0] += 1; a[1] += t; a[2] += b; a[3] += num(ins)
print("%-28s %6s %10s %9s %10s %12s" % ("kernel", "n", "total_us", "mean_us", "MB_read", "warp_inst"))
for k, (n, t, b, i) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print("%-28s %6d %10.1f %9.2f %10.1f %12.0f" % (k[:28], n, t, t / n, b / 1e6, i))
print("sum of the means: %.1f us" % sum(t / n for n, t, b, i in agg.values()))
EOF
fi
# NCU_SRC=regex (optional): a second pass over at most NCU_SRC_N (default 4)
# launches of the kernels it names, with the stall sections and the SASS
# source counters: the summary lines, then per launch bench/ncu_src.py's
# report (stall reasons, opcode mix, the hottest basic blocks and lines;
# src.csv keeps every line).
if [ -n "${NCU_SRC:-}" ]; then
  # shellcheck disable=SC2086
  timeout ${NCU_T:-420} ncu --clock-control none --cache-control none \
    --kernel-name-base function --kernel-name regex:"$NCU_SRC" \
    --launch-skip ${NCU_SRC_SKIP:-40} --launch-count ${NCU_SRC_N:-4} \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section SchedulerStats --section SourceCounters --section MemoryWorkloadAnalysis \
    -o "$OUT/src" -f $B/bench/decode $ARGS > "$OUT/ncu_src_run.log" 2>&1
  echo "ncu (source) rc=$?"
  ncu -i "$OUT/src.ncu-rep" > "$OUT/ncu_src.txt" 2>&1
  grep -E "^  k_|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Dynamic Shared|Static Shared|DRAM Throughput|Memory Throughput|Waves Per SM" \
    "$OUT/ncu_src.txt" | head -80
  ncu -i "$OUT/src.ncu-rep" --page source --csv --print-source sass > "$OUT/src.csv" 2>&1
  rm -f "$OUT/src.ncu-rep"
  python3 bench/ncu_src.py "$OUT/src.csv"
fi
