#!/usr/bin/env python3
"""Where a kernel's instructions and stalls go, from Nsight Compute's SASS
source page (`ncu -i REP --page source --csv --print-source sass > src.csv`,
as bench/decode_ncu.sh and bench/attn_ncu.sh write it).

Per profiled launch: the stall reasons' shares, the opcodes' shares of the
warp instructions and of the stall samples, the basic blocks that execute
the most instructions (runs of consecutive SASS lines executed equally
often: a loop's body shows as one block with its trip count in
"executions"), and the lines with the most stall samples.

Usage: bench/ncu_src.py src.csv [--blocks N] [--lines N]
"""
import argparse
import collections
import csv
import os
import sys

STALL_ALL = "Warp Stall Sampling (All Samples)"
EXEC = "Instructions Executed"


def num(x):
    try:
        return float(x.replace(",", ""))
    except (ValueError, AttributeError):
        return 0.0


def tables(rows):
    """(kernel name, header, body rows) per launch: a header row (the one
    naming the stall samples) starts each table; a "Kernel Name" row may
    come before it."""
    out, name, cur = [], "", None
    for r in rows:
        if not r:
            continue
        if r[0] == "Kernel Name":
            name = r[1] if len(r) > 1 else ""
            continue
        if STALL_ALL in r:
            cur = (name, r, [])
            out.append(cur)
        elif cur is not None:
            cur[2].append(r)
    return out


def opcode(src):
    t = src.split()
    if not t:
        return ""
    o = t[1] if t[0].startswith("@") and len(t) > 1 else t[0]
    return o.split(".")[0]


def report(name, hdr, body, nblocks, nlines, out):
    ix = {h: i for i, h in enumerate(hdr)}
    src = ix.get("Source", 1)
    si, ei = ix[STALL_ALL], ix.get(EXEC)
    body = [r for r in body if len(r) > si]
    if ei is None:
        print("no '%s' column: instruction shares left out" % EXEC, file=out)
    stall = [num(r[si]) for r in body]
    ex = [num(r[ei]) if ei is not None else 0.0 for r in body]
    ts, ti = sum(stall) or 1.0, sum(ex) or 1.0
    print("%s: %d SASS lines, %.0f warp instructions, %.0f stall samples"
          % (name[:100] or "kernel", len(body), sum(ex), sum(stall)), file=out)
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    rs = sorted(((sum(num(r[ix[h]]) for r in body), h) for h in reasons), reverse=True)
    print("  stalls: " + ", ".join("%s %.1f%%" % (h[6:], 100 * v / ts)
                                   for v, h in rs[:8] if v > 0), file=out)
    oi, os_ = collections.Counter(), collections.Counter()
    for r, s, e in zip(body, stall, ex):
        o = opcode(r[src])
        oi[o] += e
        os_[o] += s
    print("  opcodes (% of instructions / % of stall samples):", file=out)
    print("    " + "  ".join("%s %.1f/%.1f" % (o, 100 * v / ti, 100 * os_[o] / ts)
                             for o, v in oi.most_common(16)), file=out)
    # basic blocks: maximal runs of lines executed equally often
    blocks, a = [], 0
    for i in range(1, len(body) + 1):
        if i == len(body) or ex[i] != ex[a]:
            if ex[a] > 0:
                blocks.append((ex[a] * (i - a), a, i))
            a = i
    blocks.sort(reverse=True)
    print("  blocks by instructions (lines, executions, % instructions, % stalls, top opcodes):",
          file=out)
    for tot, a, b in blocks[:nblocks]:
        c = collections.Counter(opcode(r[src]) for r in body[a:b])
        print("    %5d-%-5d %4d lines x %9.0f  %5.1f%%  %5.1f%%  %s"
              % (a, b - 1, b - a, ex[a], 100 * tot / ti, 100 * sum(stall[a:b]) / ts,
                 " ".join("%s:%d" % kv for kv in c.most_common(5))), file=out)
    print("  lines by stall samples:", file=out)
    for i in sorted(range(len(body)), key=lambda i: -stall[i])[:nlines]:
        print("    %5.1f%%  %5d  %s" % (100 * stall[i] / ts, i, body[i][src][:100]), file=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--lines", type=int, default=20)
    a = ap.parse_args(argv)
    with open(a.csv, errors="replace") as f:
        tabs = tables(csv.reader(f))
    if not tabs:
        print("%s: no SASS source table (was it written with --page source --csv?)" % a.csv,
              file=sys.stderr)
        return 1
    for n, (name, hdr, body) in enumerate(tabs):
        print("launch %d" % n)
        report(name, hdr, body, a.blocks, a.lines, sys.stdout)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        # a reader that stops early (`| head`): not an error; stdout is
        # pointed at /dev/null so the interpreter's own flush stays quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
