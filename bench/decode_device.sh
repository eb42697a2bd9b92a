#!/bin/bash
# Build, test and run bench/decode on the GPU machine in one go (issue 5).
# Run from the repository root after `. .devdeps/env.sh` (sourced here if
# present and not done yet); every log goes to $OUT (or ./out).
#   1. meson setup /tmp/bd -Dcuda=enabled -Dtests=true; ninja of the GPU
#      tests and bench/decode only (others' work in progress elsewhere in
#      the tree cannot stop it)
#   2. meson test test_gpu_seq (the sequence's GPU attend against its CPU
#      attend and exact attention), test_gpu_attn, test_gpu_pack, test_gather
#   3. compute-sanitizer memcheck on two quick test_gpu_seq tests
#      (SANITIZE=0 skips)
#   4. /tmp/bd/bench/decode $DECODE_ARGS (default: 32 layers x 8 KV heads,
#      128K context, 1,024 tokens per phase); its last line is the RESULT
# Knobs: SKIP_TESTS=1, SANITIZE=0, SKIP_BENCH=1, DECODE_ARGS="...",
# TEST_T / SAN_T / BENCH_T (timeouts, s).  Everything in one call can pass
# the 10-minute limit of one device command: then make two calls,
# `SKIP_BENCH=1 bash bench/decode_device.sh` and
# `SKIP_TESTS=1 SANITIZE=0 bash bench/decode_device.sh`.
# Exit status: 0 when every step passed, else that of the first failure.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
B=/tmp/bd
case "${PKG_CONFIG_PATH:-}" in
  *.devdeps*) ;;
  *) [ -f .devdeps/env.sh ] && . .devdeps/env.sh ;;
esac
status=0
fail() { [ $status -ne 0 ] || status=$1; }

{ date -u; uname -a; nproc; free -g; lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)"; } \
  > "$OUT/machine.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version \
  --format=csv >> "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

echo "== build"
t0=$(date +%s)
if [ -d $B ]; then
  meson setup --reconfigure $B -Dcuda=enabled -Dtests=true > "$OUT/setup.log" 2>&1
else
  meson setup $B -Dcuda=enabled -Dtests=true > "$OUT/setup.log" 2>&1
fi || { tail -30 "$OUT/setup.log"; exit 1; }
TESTS="test_gpu_seq test_gpu_attn test_gpu_pack test_gather"
ninja -C $B tests/gpu/test_gpu_seq tests/gpu/test_gpu_attn tests/gpu/test_gpu_pack \
  tests/gpu/test_gather bench/decode > "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
grep -iE "warning" "$OUT/build.log" | grep -v "^ptxas warning : Registers are spilled" | head -20
echo "built in $(( $(date +%s) - t0 )) s"

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== tests ($TESTS)"
  timeout ${TEST_T:-420} meson test -C $B --no-rebuild --print-errorlogs $TESTS \
    > "$OUT/test_gpu.log" 2>&1 || fail $?
  cp $B/meson-logs/testlog.txt "$OUT/testlog.txt" 2>/dev/null
  grep -E "^ *[0-9]+/[0-9]+ |^Ok:|^Fail:|^Skipped:|^Timeout:" "$OUT/test_gpu.log"
  grep -E "\[FAIL\]|Assertion|failed" "$OUT/test_gpu.log" | head -30
  # What each sequence test measured (its cr_log_info lines).
  grep -E "compares," $B/meson-logs/testlog.txt
fi

if [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  echo "== compute-sanitizer memcheck test_gpu_seq (exact_d64_no_window, prefill_from_device_memory)"
  for t in exact_d64_no_window prefill_from_device_memory; do
    timeout ${SAN_T:-240} compute-sanitizer --tool memcheck --target-processes all \
      --print-limit 20 $B/tests/gpu/test_gpu_seq --filter "gpu_seq/$t" \
      > "$OUT/san_memcheck_$t.log" 2>&1
    rc=$?
    echo "$t rc=$rc $(grep -E 'ERROR SUMMARY|Synthesis' "$OUT/san_memcheck_$t.log" | tr '\n' ' ')"
    [ $rc -eq 0 ] || fail $rc
  done
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "== bench/decode ${DECODE_ARGS:-}"
  timeout ${BENCH_T:-540} $B/bench/decode ${DECODE_ARGS:-} > "$OUT/decode.log" 2>&1 || fail $?
  cat "$OUT/decode.log"
fi
exit $status
