# Sourced by bench/attn_ab.sh and bench/decode_ab.sh (GPU machine): the
# variants of an A/B run, "head" (the working tree) and one per overlay
# under ab/ (bench/attn_ab_prep.sh), each copied to /tmp/<prefix>-tree-<n>
# with its overlay on top and built in parallel in /tmp/<prefix>-build-<n>.
#
# ab_names                       -> sets $names
# ab_build PREFIX "TARGETS" ["HEAD_TARGETS"]
#     builds TARGETS of every variant (plus HEAD_TARGETS for head); a
#     failed build is reported, with its log in $OUT/build-<n>.log
ab_names() {
	names="head"
	for d in ab/*/; do
		[ -d "$d" ] && names="$names $(basename "$d")"
	done
}

ab_build() {
	local prefix=$1 targets=$2 extra=${3:-} n T t
	for n in $names; do
		T=/tmp/$prefix-tree-$n
		rm -rf "$T"
		mkdir -p "$T"
		tar --exclude=.devdeps --exclude=ab -cf - . | tar -xf - -C "$T"
		[ "$n" = head ] || cp -r "ab/$n/." "$T/"
		t=$targets
		[ "$n" = head ] && t="$t $extra"
		(cd "$T" && meson setup /tmp/$prefix-build-$n -Dcuda=enabled -Dtests=true > /dev/null &&
		 ninja -C /tmp/$prefix-build-$n $t > "$OUT/build-$n.log" 2>&1 ||
		 echo "build $n failed: $(grep -m3 error "$OUT/build-$n.log")") &
	done
	wait
}
