#!/bin/bash
# The gpu suite under compute-sanitizer, one test per process, so that a
# slow test (racecheck multiplies a test's time by 10-50) costs only its own
# time limit and every other test is still covered.  On the GPU machine,
# from the repository root, .devdeps/ carried (../shared/device/README.md):
#
#   TOOLS="memcheck racecheck" BINS="tests/gpu/test_gpu_seq" T=100 \
#     bash bench/sanitize_device.sh
#
# Writes one line per (tool, binary, test) to $OUT/san.txt: the test's exit
# status (124: past T seconds), PASS, FAIL or SKIP, the tool's summary; and for
# any test with a report, its first lines to $OUT/san_detail.txt.  FILTER
# (a grep -E pattern) keeps only the tests whose names match; SKIP drops
# those that do.  Builds in $B (default /tmp/b) unless it is built.
set -u
OUT=${OUT:-out}
B=${B:-/tmp/b}
T=${T:-120}
TOOLS=${TOOLS:-memcheck racecheck}
BINS=${BINS:-tests/gpu/test_gpu_attn tests/gpu/test_gpu_pack tests/gpu/test_gather tests/gpu/test_gpu_seq tests/tiers/test_tiers_store_gpu}
mkdir -p "$OUT"
[ -f .devdeps/env.sh ] && . .devdeps/env.sh
if [ ! -f "$B/build.ninja" ]; then
  meson setup "$B" -Dcuda=enabled -Dbench=false > "$OUT/setup.log" 2>&1 ||
    { tail -20 "$OUT/setup.log"; exit 1; }
fi
ninja -C "$B" $BINS > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
: > "$OUT/san.txt"
: > "$OUT/san_detail.txt"
log=$(mktemp)
for tool in $TOOLS; do
  for bin in $BINS; do
    # Criterion's --list: "suite: N tests" then one "├── name" per test
    suite=$("$B/$bin" --list 2>/dev/null | sed -n '1s/:.*//p')
    tests=$("$B/$bin" --list 2>/dev/null | sed -n 's/^[├└]── //p')
    [ -n "${FILTER:-}" ] && tests=$(printf '%s\n' $tests | grep -E "$FILTER")
    [ -n "${SKIP:-}" ] && tests=$(printf '%s\n' $tests | grep -vE "$SKIP")
    for t in $tests; do
      timeout "$T" compute-sanitizer --tool "$tool" --target-processes all --print-limit 20 \
        "$B/$bin" --filter "$suite/$t" > "$log" 2>&1
      rc=$?
      sum=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | sed 's/^========= //' | tr '\n' ' ')
      res=FAIL
      grep -qE "Passing: 1 \| Failing: 0" "$log" && res=PASS
      grep -qE "Tested: 0 \| Passing: 0 \| Failing: 0 \| Crashing: 0" "$log" && res=SKIP
      echo "$tool $(basename "$bin") $t rc=$rc $res $sum" | tee -a "$OUT/san.txt"
      if grep -qE "^========= (Error|Warning|Invalid|Program hit)" "$log"; then
        { echo "== $tool $(basename "$bin") $t"; grep -E "^========= " "$log" | head -40; } >> "$OUT/san_detail.txt"
      fi
    done
  done
done
rm -f "$log"
echo "san: $(grep -c . "$OUT/san.txt") runs, $(grep -c ' PASS ' "$OUT/san.txt") passed," \
  "$(grep -cE 'rc=124' "$OUT/san.txt") past ${T} s," \
  "$(grep -cvE '(ERROR SUMMARY: 0 errors|0 hazards displayed)' "$OUT/san.txt") with a report or no summary"
