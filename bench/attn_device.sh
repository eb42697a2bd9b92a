#!/bin/bash
# Build, test and time the GPU part on the GPU machine in one go (see
# ../shared/device/README.md).  Run from the repository root with
# .devdeps/ carried; logs go to $OUT (or ./out).  Builds only the GPU
# targets, outside the tree, so that other components' work in progress
# does not stop it.  Knobs: SKIP_TESTS, SKIP_BENCH, BENCH_T, ATTN_ARGS,
# SANITIZE (default on), SAN_TESTS (binaries), SAN_ARGS (their arguments,
# e.g. --filter 'gpu/*3stage*'), SAN_T, NCU, NCU_N, NCU_T, and PAIRS:
# bench/attn argument sets separated by ';', each run first, before the
# tests (the paired mode: e.g. PAIRS="--pair 0,SELECT_ORDER --batch 8;
# --pair 0,SELECT_ORDER --batch 1 --ctx 131072,262144"), their lines
# in pairs.log and in the output (PAIR_T: seconds a set, 150).  PREBUILT:
# a folder with test_gpu_attn, test_gpu_pack, test_gpu_seq and attn
# built on the CPU machine (carried), used instead of building here.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
B=/tmp/b
# the GPU test binaries this script builds (or takes from PREBUILT) and runs
TESTS="test_gpu_attn test_gpu_pack test_gpu_seq"
. .devdeps/env.sh
# the GPU machine has no libxxhash and ../shared/device/pack-deps packs
# it only when asked (a first call lost 89 s at meson setup so)
if ! pkg-config --exists libxxhash; then
  echo "attn_device: no libxxhash; on the CPU machine run ../shared/device/pack-deps libxxhash0 libxxhash-dev"
  exit 1
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
if [ -n "${PREBUILT:-}" ]; then
  # binaries built on the CPU machine (same CUDA; carried beside
  # .devdeps), laid out as a build tree so that the rest runs unchanged:
  # saves the ~100 s build when little device time is left
  mkdir -p $B/tests/gpu $B/bench
  for t in $TESTS; do
    [ -x "$PREBUILT/$t" ] && cp "$PREBUILT/$t" $B/tests/gpu/
  done
  cp "$PREBUILT/attn" $B/bench/ || exit 1
else
  meson setup $B -Dcuda=enabled -Dtests=true > "$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
  # shellcheck disable=SC2046 # one target a test, split on purpose
  ninja -C $B $(printf "tests/gpu/%s " $TESTS) bench/attn > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
fi
if [ -n "${PAIRS:-}" ]; then
  echo "== pairs"
  echo "$PAIRS" | tr ';' '\n' | while read -r args; do
    [ -n "$args" ] || continue
    echo "-- bench/attn $args" | tee -a "$OUT/pairs.log"
    # shellcheck disable=SC2086 # one argument set, split on purpose
    timeout "${PAIR_T:-150}" $B/bench/attn $args > "$OUT/pair.tmp" 2>&1
    rc=$?
    grep -E "^pair|^attn:|^pos_sch|RESULT" "$OUT/pair.tmp" | tee -a "$OUT/pairs.log"
    # a set that timed out (124) or failed says so, with its last words
    [ $rc = 0 ] || { echo "-- rc=$rc"; tail -3 "$OUT/pair.tmp"; } | tee -a "$OUT/pairs.log"
  done
  rm -f "$OUT/pair.tmp"
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== tests"
  if [ -n "${PREBUILT:-}" ]; then
    for t in $TESTS; do
      [ -x $B/tests/gpu/$t ] || continue
      (CRITERION_NO_EARLY_EXIT=1 OPENBLAS_NUM_THREADS=1 timeout 200 $B/tests/gpu/$t > "$OUT/test_$t.log" 2>&1; echo "$t rc=$?" >> "$OUT/test_$t.log") &
    done
    wait
    cat "$OUT"/test_test_gpu_*.log > "$OUT/test.log"
  else
    timeout 200 meson test -C $B --no-rebuild --print-errorlogs $TESTS > "$OUT/test.log" 2>&1
    # the tests' counts (criterion's summaries are in meson's log only)
    grep -h "Synthesis" $B/meson-logs/testlog.txt >> "$OUT/test.log" 2>/dev/null
  fi
  grep -E "^ *[0-9]+/[0-9]+ |Ok:|Fail:|Skipped:| rc=" "$OUT/test.log"
  grep -E "\[FAIL\]|Assertion|Synthesis|rel err" "$OUT/test.log" | head -30
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "== sdpa"
  PYTHONUNBUFFERED=1 timeout 150 python3 bench/attn_sdpa.py > "$OUT/sdpa.txt" 2>&1
  cat "$OUT/sdpa.txt"
  echo "== bench"
  timeout ${BENCH_T:-200} $B/bench/attn --sdpa "$OUT/sdpa.txt" ${ATTN_ARGS:-} > "$OUT/bench.log" 2>&1
  cat "$OUT/bench.log"
  echo "== the A/B columns side by side (bench/attn_ab.py)"
  python3 bench/attn_ab.py "$OUT/bench.log" | tee "$OUT/ab.txt"
fi
if [ "${SANITIZE:-1}" = 1 ]; then
  echo "== compute-sanitizer"
  for tool in memcheck racecheck; do
    for t in ${SAN_TESTS:-test_gpu_attn test_gpu_pack}; do
      timeout ${SAN_T:-200} compute-sanitizer --tool $tool --target-processes all --print-limit 20 \
        $B/tests/gpu/$t ${SAN_ARGS:-} > "$OUT/san_${tool}_$t.log" 2>&1
      echo "$tool $t rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Synthesis' "$OUT/san_${tool}_$t.log" | tr '\n' ' ')"
    done
  done
fi
if [ "${NCU:-0}" = 1 ]; then
  echo "== ncu"
  timeout ${NCU_T:-200} ncu --clock-control none --kernel-name-base function \
    --kernel-name regex:'^k_(qrot|score|select|msel_count|attn_packed_tc|attn_packed|segrot|merge)$' --launch-count ${NCU_N:-7} \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters \
    --metrics smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,dram__bytes_read.sum \
    $B/bench/attn --ctx 1048576 --batch 1 --once 1 > "$OUT/ncu.log" 2>&1
  echo "ncu rc=$?"
  grep -E "^  k_|Duration|DRAM Throughput|Achieved Occupancy|inst_executed|bank_conflicts|Warp Cycles Per Issued|Stall|stall" "$OUT/ncu.log" | head -80
fi
# The test results again, so that the end of the output (all the device
# tool returns of it) holds them; then every log in one archive beside
# bench.log and ab.txt, since the tool brings back 8 files at most (the
# thirty-fourth session lost test.log so).
echo "== tests"
grep -hE "Synthesis|\[FAIL\]" "$OUT/test.log" 2>/dev/null | head -10
(cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz ./*.log ./*.txt 2>/dev/null &&
 find . -maxdepth 1 -type f ! -name logs.tgz ! -name bench.log ! -name ab.txt ! -name pairs.log -delete)
