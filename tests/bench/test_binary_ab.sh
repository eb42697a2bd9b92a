#!/bin/bash
# bench/binary_ab.sh on two made-up bench/attn binaries (scripts that
# print --pair lines, each round's medians its own), against the medians
# of the rounds' differences worked out here by hand.
# Usage: test_binary_ab.sh SOURCE_ROOT
set -eu
root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# a binary that prints, run n (its count in $tmp/$1.n), the medians given
# for that run: colA colB at 1M, then at 256K
fake() { # name, then 4 numbers a run
	local name=$1
	shift
	{
		echo '#!/bin/bash'
		echo "n=\$(cat $tmp/$name.n 2>/dev/null || echo 0); echo \$((n + 1)) > $tmp/$name.n"
		echo "set -- $*"
		echo 'shift $((4 * n))'
		echo 'echo "pos_sch: scheduled"'
		echo 'echo "pair batch 1 context 1048576 flags 0: A $1 us, B $2 us (medians); B - A median 0 us"'
		echo 'echo "pair batch 1 context 262144 flags 0: A $3 us, B $4 us (medians); B - A median 0 us"'
	} > "$tmp/$name"
	chmod +x "$tmp/$name"
}
fake a 193.0 187.0 90.0 87.0  194.0 186.0 91.0 86.0  192.0 188.0 90.5 86.5
fake b 190.0 186.0 89.0 88.0  193.0 183.0 90.0 87.0  192.5 185.0 89.0 86.0
out=$(cd "$root" && A="$tmp/a" B="$tmp/b" ROUNDS=3 bash bench/binary_ab.sh)
# 1M colA: -3.0, -1.0, +0.5 -> -1.00; colB: -1.0, -3.0, -3.0 -> -3.00
# 256K colA: -1.0, -1.0, -1.5 -> -1.00; colB: +1.0, +1.0, -0.5 -> +1.00
want='RESULT name=binary_ab rounds=3 diff_us_b1_1048576_colA=-1.00 diff_us_b1_1048576_colB=-3.00 diff_us_b1_262144_colA=-1.00 diff_us_b1_262144_colB=1.00'
got=$(printf '%s\n' "$out" | tail -1)
if [ "$got" != "$want" ]; then
	printf 'binary_ab.sh printed:\n%s\nwanted last:\n%s\n' "$out" "$want" >&2
	exit 1
fi
# the order alternates: round 2 runs B first
order=$(printf '%s\n' "$out" | grep -E '^[AB] [0-9] pair batch 1 context 1048576' | cut -c1-3 | tr '\n' ' ')
[ "$order" = "A 1 B 1 B 2 A 2 A 3 B 3 " ] || { echo "order: $order" >&2; exit 1; }
echo "binary_ab: 3 rounds, 4 differences"
