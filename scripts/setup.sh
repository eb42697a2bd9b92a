#!/bin/sh
# Installs what a fresh Debian 12 machine lacks to build and test mosaickv.
# Idempotent: it asks apt only for packages that are missing.
set -eu
pkgs="meson ninja-build pkg-config gcc g++ liburing-dev libnuma-dev libjemalloc-dev
      liblz4-dev liblapacke-dev libopenblas-dev libcriterion-dev libxxhash-dev
      python3 python3-pip"
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
