#!/bin/bash
# A compile-time variant of the GPU code against the tree as it is, on the
# GPU machine (for knobs that are #defines, not GPU_ATTN_* flags, so that
# bench/attn --pair cannot pair them in one binary).  Builds bench/attn
# twice, the second from a copy of the tree with VAR_SED applied to
# VAR_FILE (default gpu/attn.cu), then runs the two binaries in turn
# ROUNDS times (default 3) with ATTN_ARGS (default --ctx 262144,1048576
# --batch 1), keeping the table rows.  Run from the repository root with
# .devdeps/ carried; logs go to $OUT (or ./out).  Example:
#   VAR_SED='s/^#define ST_SMALL_NS 1$/#define ST_SMALL_NS 2/' bash bench/variant_ab.sh
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
. .devdeps/env.sh
: "${VAR_SED:?VAR_SED: the sed expression that makes the variant}"
F=${VAR_FILE:-gpu/attn.cu}
A=/tmp/vab_a B=/tmp/vab_b S=/tmp/vab_src
rm -rf "$S" && mkdir -p "$S" && git ls-files -z | xargs -0 cp --parents -t "$S"
cp -r .devdeps "$S/"
sed -i "$VAR_SED" "$S/$F"
if cmp -s "$F" "$S/$F"; then
  echo "variant_ab: VAR_SED changed nothing in $F"
  exit 1
fi
diff "$F" "$S/$F" | head -20
(meson setup $A -Dcuda=enabled > "$OUT/vab_setup_a.log" 2>&1 && ninja -C $A bench/attn > "$OUT/vab_build_a.log" 2>&1) &
(cd "$S" && meson setup $B -Dcuda=enabled > "$OUT/vab_setup_b.log" 2>&1 && ninja -C $B bench/attn > "$OUT/vab_build_b.log" 2>&1) &
wait
for t in $A $B; do
  [ -x $t/bench/attn ] || { echo "variant_ab: $t did not build"; tail -20 "$OUT"/vab_build_*.log; exit 1; }
done
for i in $(seq 1 "${ROUNDS:-3}"); do
  for t in a b; do
    bin=/tmp/vab_$t/bench/attn
    # shellcheck disable=SC2086 # the argument set, split on purpose
    timeout "${VAB_T:-150}" $bin ${ATTN_ARGS:---ctx 262144,1048576 --batch 1} > "$OUT/vab_$t$i.log" 2>&1
    echo "-- $t round $i rc=$?"
    grep -E "^ +[0-9]+ +[0-9]+ \|" "$OUT/vab_$t$i.log"
  done
done
grep -E "^batch" "$OUT/vab_a1.log" | head -1 > "$OUT/vab_header.txt"
