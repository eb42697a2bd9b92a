#!/bin/bash
# Build, test and run bench/tiers on the GPU machine in one go.  Run from
# the repository root after `. .devdeps/env.sh` (sourced again here if
# present); logs go to $OUT (or ./out).
#   1. meson setup /tmp/bt -Dcuda=enabled -Dtests=true; ninja (whole tree)
#   2. meson test --suite gpu (test_gather, the kernels, tiers_store_gpu)
#   3. compute-sanitizer memcheck on test_gather and on the store's device
#      map test (SANITIZE=0 skips)
#   4. /tmp/bt/bench/tiers $TIERS_ARGS (NVMe under /var/tmp unless --dir;
#      default --nvme-mib 256 --rounds 5 --steps 80: the VM's disk moves
#      between rounds by more than the goal's margin, so the median needs
#      more than two)
# Exit status: 0 when every step passed, else that of the first failure.
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
B=/tmp/bt
case "${PKG_CONFIG_PATH:-}" in
  *.devdeps*) ;;
  *) [ -f .devdeps/env.sh ] && . .devdeps/env.sh ;;
esac
status=0
fail() { [ $status -ne 0 ] || status=$1; }

{ date -u; uname -a; nproc; free -g; df -h /var/tmp; } > "$OUT/machine.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current,driver_version \
  --format=csv >> "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

echo "== build"
if [ -d $B ]; then
  meson setup --reconfigure $B -Dcuda=enabled -Dtests=true > "$OUT/setup.log" 2>&1
else
  meson setup $B -Dcuda=enabled -Dtests=true > "$OUT/setup.log" 2>&1
fi || { tail -30 "$OUT/setup.log"; exit 1; }
ninja -C $B > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -40; exit 1; }
grep -iE "warning" "$OUT/build.log" | grep -v "^ptxas warning : Registers are spilled" | head -20

echo "== tests (suite gpu)"
timeout ${TEST_T:-300} meson test -C $B --no-rebuild --suite gpu --print-errorlogs \
  > "$OUT/test_gpu.log" 2>&1 || fail $?
cp $B/meson-logs/testlog.txt "$OUT/testlog.txt" 2>/dev/null
grep -E "^ *[0-9]+/[0-9]+ |^Ok:|^Fail:|^Skipped:|^Timeout:" "$OUT/test_gpu.log"
grep -E "\[FAIL\]|Assertion|failed" "$OUT/test_gpu.log" | head -30

if [ "${SANITIZE:-1}" = 1 ] && command -v compute-sanitizer > /dev/null; then
  echo "== compute-sanitizer memcheck test_gather"
  timeout ${SAN_T:-150} compute-sanitizer --tool memcheck --target-processes all \
    --print-limit 20 $B/tests/gpu/test_gather > "$OUT/san_memcheck_test_gather.log" 2>&1
  rc=$?
  echo "rc=$rc $(grep -E 'ERROR SUMMARY|Synthesis' "$OUT/san_memcheck_test_gather.log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || fail $rc
  echo "== compute-sanitizer memcheck tiers_store_gpu (device map)"
  timeout ${SAN_T:-150} compute-sanitizer --tool memcheck --print-limit 20 \
    $B/tests/tiers/test_tiers_store_gpu --filter 'store_gpu/devmap*' \
    > "$OUT/san_memcheck_devmap.log" 2>&1
  rc=$?
  echo "rc=$rc $(grep -E 'ERROR SUMMARY|Synthesis' "$OUT/san_memcheck_devmap.log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || fail $rc
fi

echo "== bench/tiers"
timeout ${BENCH_T:-400} $B/bench/tiers ${TIERS_ARGS:---nvme-mib 256 --rounds 5 --steps 80} > "$OUT/tiers.log" 2>&1 || fail $?
cat "$OUT/tiers.log"
exit $status
