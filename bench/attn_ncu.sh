#!/bin/bash
# Profile PackedAttention's attention kernel on the GPU machine (1M
# tokens unless NCU_CTX says, batch 1, one step of ours and one of ours_q6) with Nsight
# Compute (NCU_ONCE picks bench/attn's --once order, 1 by default: ours
# first; 2: ours_g2 first; NCU_MEM=1 adds the memory sections;
# NCU_METRICS=a,b adds metrics to the run and to the summary): the
# summary sections, then bench/ncu_src.py's report of the
# SASS source counters (stall reasons, opcode mix, hottest basic blocks
# and lines; src.csv keeps every line).
# Assumes bench/attn built in $B (bench/attn_device.sh or by hand).
set -u
OUT=${OUT:-out}
B=${B:-/tmp/b}
mkdir -p "$OUT"
K=${NCU_KERNEL:-attn_packed_tc}
timeout ${NCU_T:-300} ncu --clock-control none --kernel-name-base function \
  --kernel-name regex:"^k_${K}\$" --launch-count ${NCU_N:-2} \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
  --section SchedulerStats --section SourceCounters \
  $([ "${NCU_MEM:-0}" = 1 ] && echo --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables) \
  --metrics smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,dram__bytes_read.sum${NCU_METRICS:+,$NCU_METRICS} \
  -o "$OUT/attn" -f $B/bench/attn --ctx ${NCU_CTX:-1048576} --batch 1 --once ${NCU_ONCE:-1} > "$OUT/ncu_run.log" 2>&1
echo "ncu rc=$?"
ncu -i "$OUT/attn.ncu-rep" > "$OUT/ncu.txt" 2>&1
grep -E "^  k_|Duration|Registers Per|Achieved Occupancy|DRAM Throughput|L2 Hit|L1/TEX Hit|Mem Busy|Max Bandwidth|Mem Pipes|Theoretical Occupancy|Block Limit|inst_executed|bank_conflicts|dram__bytes|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Dynamic Shared${NCU_METRICS:+|${NCU_METRICS//,/|}}" "$OUT/ncu.txt" | head -${NCU_LINES:-60}
ncu -i "$OUT/attn.ncu-rep" --page source --csv --print-source sass > "$OUT/src.csv" 2>&1
echo "src.csv: $(wc -l < "$OUT/src.csv") lines"
python3 bench/ncu_src.py "$OUT/src.csv"
rm -f "$OUT/attn.ncu-rep"
