#!/bin/bash
# On the GPU machine (see ../shared/device/README.md; .devdeps carried):
# build HEAD's tree and every overlay under ab/ (bench/attn_ab_prep.sh) in
# parallel, run test_gpu_attn on each variant (TESTS=0 skips), then
# bench/attn on each, the variants interleaved, REPS times (default 2).
# With NCU=1, first the attention kernel of each variant under Nsight
# Compute: one `bench/attn --once 1` at NCU_CTX tokens (default 1M),
# batch 1, every k_attn_packed_tc launch (ours, ours_q6, ours_pos, ours_s8,
# pos_s8, ps8_ma in that order) with its time, warp instructions and
# registers (ncu-<variant>.csv).  Output under $OUT (or ./out): one log
# per variant and repetition, and the table rows of all of them in
# summary.txt.
#
# Usage: ATTN_ARGS="--ctx 262144,1048576 --batch 1,8" bash bench/attn_ab.sh
#        NCU=1 REPS=1 ATTN_ARGS="--ctx 1048576 --batch 1,8" bash bench/attn_ab.sh
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
. .devdeps/env.sh
ARGS=${ATTN_ARGS:---ctx 262144,1048576 --batch 1,8}
. bench/ab_trees.sh
ab_names
ab_build ab "tests/gpu/test_gpu_attn bench/attn"
if [ "${TESTS:-1}" = 1 ]; then
	for n in $names; do
		timeout 300 /tmp/ab-build-$n/tests/gpu/test_gpu_attn > "$OUT/test-$n.log" 2>&1
		echo "test $n: $(grep -E 'Synthesis' "$OUT/test-$n.log")"
		grep -E "\[FAIL\]" "$OUT/test-$n.log" | head -5
	done
fi
if [ "${NCU:-0}" = 1 ]; then
	for n in $names; do
		echo "== ncu $n (a line per launch)"
		ab_ncu "$OUT/ncu-$n.csv" '^k_attn_packed_tc$' "" \
			/tmp/ab-build-$n/bench/attn --ctx "${NCU_CTX:-1048576}" --batch 1 --once 1
	done
fi
: > "$OUT/summary.txt"
for i in $(seq 1 "${REPS:-2}"); do
	for n in $names; do
		timeout 200 /tmp/ab-build-$n/bench/attn $ARGS > "$OUT/bench-$n-$i.log" 2>&1
		{ echo "== $n ($i)"; grep -E "^batch|^ +[0-9]+ +[0-9]+ \||split:" "$OUT/bench-$n-$i.log"; } >> "$OUT/summary.txt"
	done
done
cat "$OUT/summary.txt"
