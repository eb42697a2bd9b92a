# Sourced by bench/attn_ab.sh and bench/decode_ab.sh (GPU machine): the
# variants of an A/B run, "head" (the working tree) and one per overlay
# under ab/ (bench/attn_ab_prep.sh), each copied to /tmp/<prefix>-tree-<n>
# with its overlay on top and built in parallel in /tmp/<prefix>-build-<n>.
#
# ab_names                       -> sets $names
# ab_build PREFIX "TARGETS" ["HEAD_TARGETS"]
#     builds TARGETS of every variant (plus HEAD_TARGETS for head); a
#     failed build is reported, with its log in $OUT/build-<n>.log
# ab_ncu CSV REGEX "NCU_OPTIONS" COMMAND...
#     COMMAND under Nsight Compute, the kernels matching REGEX (with
#     NCU_OPTIONS, e.g. --launch-skip), their time, registers and warp
#     instructions kept in CSV and printed a line per launch
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

ab_ncu() {
	local csv=$1 re=$2 opts=$3
	shift 3
	# shellcheck disable=SC2086
	timeout "${NCU_T:-150}" ncu --clock-control none --kernel-name-base function \
		--kernel-name "regex:$re" $opts --csv --print-units base \
		--metrics gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread \
		"$@" > "$csv" 2>&1
	# a launch's metrics come in this order: time, registers, instructions
	grep -E '"(gpu__time_duration|smsp__inst_executed|launch__registers)' "$csv" |
		awk -F'","' '{v = $NF; gsub(/[",]/, "", v); printf "%s%s", v, (++k % 3 ? " " : "\n")}' |
		awk '{printf "  %.1f us  %s regs  %s inst\n", $1 / 1000, $2, $3}'
}
