#!/bin/sh
# Extracts the first ```c block of README.md, compiles it against the
# freshly built library and runs it: the README's example must stay true.
set -eu
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
awk '/^```c$/{f=1;next} /^```$/{if(f){exit}} f' "$src/README.md" > "$tmp/example.c"
[ -s "$tmp/example.c" ] || { echo "no C example in README.md"; exit 1; }
${CC:-cc} -std=c11 -Wall -Wextra -Werror -I"$src/include" "$tmp/example.c" \
    -L"$build" -lmosaickv -lm -o "$tmp/example"
out=$(LD_LIBRARY_PATH="$build" "$tmp/example")
echo "$out"
# The example prints "memory X of dense, ... error E": check both are sane.
echo "$out" | awk '/^memory/ { if ($2 > 0 && $2 < 0.5 && $NF >= 0 && $NF < 1) ok=1 } END { exit !ok }'
