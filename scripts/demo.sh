#!/bin/sh
# The main job: install what is missing, build, run the demo with its
# defaults (extra arguments go to the demo; --help lists them).
set -eu
cd "$(dirname "$0")/.."
sh scripts/setup.sh --no-model  # the demo needs no torch
sh scripts/build.sh build
exec build/tools/mosaickv-demo "$@"
