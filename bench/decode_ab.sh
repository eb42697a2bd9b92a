#!/bin/bash
# On the GPU machine (see ../shared/device/README.md; .devdeps carried):
# bench/decode on the working tree ("head") and on every overlay under ab/
# (bench/attn_ab_prep.sh writes them), built in parallel, the variants
# interleaved REPS times (default 1), so that host-side changes are
# compared on the same VM: its CPU speed differs between calls.  TESTS=1
# first runs test_gpu_seq on the working tree.  NCU=1 then times each
# variant's attention kernel under Nsight Compute (NCU_ARGS: bench/decode's
# arguments there, by default one layer at 1M tokens at the decode
# defaults; four launches after two, ncu-<variant>.csv).  Output under
# $OUT (or ./out): one log per variant and repetition; the step lines of
# all of them in summary.txt.
#
# Usage: DECODE_ARGS="--tokens 256" bash bench/decode_ab.sh
#        NCU=1 REPS=0 bash bench/decode_ab.sh
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
case "${PKG_CONFIG_PATH:-}" in
  *.devdeps*) ;;
  *) . .devdeps/env.sh ;;
esac
. bench/ab_trees.sh
ab_names
t0=$(date +%s)
extra=
[ "${TESTS:-0}" = 1 ] && extra=tests/gpu/test_gpu_seq
ab_build dab bench/decode "$extra"
echo "built in $(( $(date +%s) - t0 )) s"
status=0
if [ "${TESTS:-0}" = 1 ]; then
	timeout ${TEST_T:-300} /tmp/dab-build-head/tests/gpu/test_gpu_seq -j4 \
		> "$OUT/test_gpu_seq.log" 2>&1 || status=$?
	grep -E "Synthesis|\[FAIL\]|compares," "$OUT/test_gpu_seq.log" | head -30
fi
if [ "${NCU:-0}" = 1 ]; then
	for n in $names; do
		echo "== ncu $n (a line per launch)"
		# shellcheck disable=SC2086
		ab_ncu "$OUT/ncu-$n.csv" '^k_attn_packed_tc$' "--launch-skip 2 --launch-count 4" \
			/tmp/dab-build-$n/bench/decode ${NCU_ARGS:---layers 1 --context 1048576 --tokens 4 --warmup 1 --workers 14 --host-gib 16}
	done
fi
: > "$OUT/summary.txt"
for i in $(seq 1 "${REPS:-1}"); do
	for n in $names; do
		timeout ${BENCH_T:-300} /tmp/dab-build-$n/bench/decode ${DECODE_ARGS:-} \
			> "$OUT/decode-$n-$i.log" 2>&1 || { echo "decode $n rc=$?"; status=1; }
		{ echo "== $n ($i)"; grep -E "step p50|of a step|swap_overhead|^RESULT" \
			"$OUT/decode-$n-$i.log"; } | tee -a "$OUT/summary.txt"
	done
done
exit $status
