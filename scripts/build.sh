#!/bin/sh
# Configures (once) and builds mosaickv in build/ (or the directory given as
# $1, with any further meson options after it).  CUDA code is compiled when
# nvcc is found (-Dcuda=auto); nothing needs a GPU to build.
set -eu
cd "$(dirname "$0")/.."
dir=${1:-build}
[ $# -gt 0 ] && shift
if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dcuda=auto "$@"
fi
meson compile -C "$dir"
