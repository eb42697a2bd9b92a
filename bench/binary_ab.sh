#!/bin/bash
# Two builds of bench/attn against each other on the GPU machine, for a
# change that is not a GPU_ATTN_* flag (so that --pair cannot pair it in
# one binary) when there is no device time to build (bench/variant_ab.sh
# builds both trees there).  Build both on the CPU machine, carry them
# (e.g. in .devbin/, beside .devdeps), then:
#   A=.devbin/attn B=.devbin/attn_b bash bench/binary_ab.sh
# Each round runs A then B (B then A every other round) with ARGS
# (default: --pair 0 --pair-modes 0,7 --ctx 1048576 --batch 1
# --pair-rounds 11), each a paired run inside one binary whose two
# medians are the two columns (modes) compared; the summary is, per
# shape and column, the median over rounds of B's median less A's.
# ROUNDS (default 2), RUN_T (seconds a run, default 60).  The last line:
# RESULT name=binary_ab key=value ..., one key per shape and column.
set -u
: "${A:?A: the first bench/attn binary}" "${B:?B: the second bench/attn binary}"
ARGS=${ARGS:---pair 0 --pair-modes 0,7 --ctx 1048576 --batch 1 --pair-rounds 11}
ROUNDS=${ROUNDS:-2}
[ -f .devdeps/env.sh ] && . .devdeps/env.sh
T=$(mktemp)
for r in $(seq 1 "$ROUNDS"); do
  order="A B"
  [ $((r % 2)) = 0 ] && order="B A"
  for w in $order; do
    bin=$A
    [ "$w" = B ] && bin=$B
    # shellcheck disable=SC2086 # ARGS split on purpose
    timeout "${RUN_T:-60}" "$bin" $ARGS 2>&1 | grep "^pair batch" | sed "s/^/$w $r /" | tee -a "$T"
  done
done
# "W R pair batch 1 context 1048576 flags 0: A 193.1 us, B 186.6 us ..."
python3 - "$T" <<'EOF'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S) (\d+) pair batch (\d+) context (\d+) flags (\S+): A ([\d.]+) us, B ([\d.]+) us", line)
    if m:
        w, r, b, c, f, a, bb = m.groups()
        runs.setdefault((b, c, f.rstrip(':')), {}).setdefault(int(r), {})[w] = (float(a), float(bb))
keys = []
for (b, c, f), rr in sorted(runs.items()):
    for col, name in ((0, "colA"), (1, "colB")):
        d = [v["B"][col] - v["A"][col] for v in rr.values() if "A" in v and "B" in v]
        if not d:
            continue
        md = statistics.median(d)
        print(f"batch {b} context {c} flags {f} {name}: B - A over {len(d)} rounds "
              f"{', '.join(f'{x:+.2f}' for x in d)} (median {md:+.2f} us)")
        keys.append(f"diff_us_b{b}_{c}_{name}={md:.2f}")
print("RESULT name=binary_ab rounds=%d %s" % (len(next(iter(runs.values()), {})), " ".join(keys)))
EOF
rm -f "$T"
