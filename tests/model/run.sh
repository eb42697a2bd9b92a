#!/bin/sh
# Runs one model test with a Python that has torch and transformers 5.x:
#     run.sh PYTHON SCRIPT [ARGS...]
# PYTHON is meson's -Dmodel_python; empty means the venv that
# scripts/setup.sh makes: $MOSAICKV_PY_CACHE/venv (default
# ~/.cache/mosaickv-py/venv).  Exits 77 (meson: skipped) saying why when that
# Python is missing or cannot import torch and transformers; with
# MOSAICKV_REQUIRE_MODEL=1 (scripts/test.sh, whose setup.sh provides them)
# that is a failure instead.
py=$1
script=$2
shift 2
if [ -z "$py" ]; then
    py=${MOSAICKV_PY_CACHE:-$HOME/.cache/mosaickv-py}/venv/bin/python
fi
skip() {
    if [ "${MOSAICKV_REQUIRE_MODEL:-}" = 1 ]; then
        echo "FAIL: $1"
        echo "(MOSAICKV_REQUIRE_MODEL=1: the model tests must run here)"
        exit 1
    fi
    echo "SKIP: $1"
    exit 77
}
[ -x "$py" ] ||
    skip "no Python at $py; \`sh scripts/setup.sh\` makes that venv (torch, transformers 5.x), or configure -Dmodel_python=PATH"
err=$("$py" -c 'import torch, transformers' 2>&1) ||
    skip "$py cannot import torch and transformers: $(printf '%s' "$err" | tail -n 1); \`sh scripts/setup.sh\` installs them"
exec "$py" "$script" "$@"
