#!/bin/sh
# Every test: install what is missing, build, run the whole suite, then the
# same suite again under AddressSanitizer + UndefinedBehaviorSanitizer, and
# the concurrent sequence tests under ThreadSanitizer.  The model tests
# (tests/model: SmolLM2 through transformers on the CPU) run in the first,
# plain run only, with the venv and model that setup.sh caches outside the
# clone.  GPU tests skip on machines without a usable GPU.  The last line is
# "N passed, N failed, N skipped" over both runs.
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh
sh scripts/build.sh build
# CUDA is left out of the sanitizer build: nothing CUDA runs under ASan,
# and the CPU paths are what the sanitizers are for.
sh scripts/build.sh build-asan -Dcuda=disabled -Dbench=false \
    -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debugoptimized
# ThreadSanitizer: only the 'tsan' suite runs there (Criterion itself
# cannot run under TSan; see tests/seq/meson.build).
sh scripts/build.sh build-tsan -Dcuda=disabled -Dbench=false \
    -Db_sanitize=thread -Dbuildtype=debugoptimized

status=0
# The model tests (suite 'model': SmolLM2 through transformers, on the CPU,
# one at a time after the rest) must run here, not skip: setup.sh made their
# venv and fetched the model.
MOSAICKV_REQUIRE_MODEL=1 \
    meson test -C build --print-errorlogs --num-processes 2 || status=1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
LSAN_OPTIONS=suppressions=$(pwd)/tests/lsan.supp \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    meson test -C build-asan --print-errorlogs --num-processes 2 || status=1

meson test -C build-tsan --suite tsan --print-errorlogs || status=1

python3 - build/meson-logs/testlog.json build-asan/meson-logs/testlog.json \
    build-tsan/meson-logs/testlog.json <<'PY'
import json, sys
count = {"OK": 0, "FAIL": 0, "SKIP": 0}
for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line)["result"]
        key = {"OK": "OK", "EXPECTEDFAIL": "OK", "SKIP": "SKIP"}.get(r, "FAIL")
        count[key] += 1
    if path.startswith("build/"):
        # The model tests, one line each, with their RESULT line if any.
        for line in open(path):
            r = json.loads(line)
            suites, _, name = r["name"].rpartition(" / ")  # "proj:a+b / name"
            if "model" in suites.partition(":")[2].split("+"):
                res = [l for l in r.get("stdout", "").splitlines() if l.startswith("RESULT")]
                print(f"{name}: {r['result']} in {r['duration']:.0f} s", *res[-1:], sep="; ")
print(f"{count['OK']} passed, {count['FAIL']} failed, {count['SKIP']} skipped")
PY
exit $status
