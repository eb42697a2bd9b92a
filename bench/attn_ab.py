#!/usr/bin/env python3
"""The columns of bench/attn's table that an A/B call compares, side by
side, with each one's ratio to the first: `python3 bench/attn_ab.py
bench.log [column ...]` (default: the ordered path's variants).  Reads the
header row (the line starting with "batch") and every data row under it;
a column the log lacks prints as "-" (an older binary's table).  The
default since the thirty-fifth session: the formats side by side (g = 2
bitmaps, 8-bit summaries, value positions, and their combinations), the
two score stages (their ratios to ours_us mean nothing: read their
values), the one-run leads of the thirty-fourth session (wider chunks,
one slot a window) and Quest; since the thirty-seventh session the
many-CTA select forced where the step takes the one-CTA select (ours_mny,
g28_mny, beside the stage's os_1cta and os_many; ours_mso, ours_mni: that
in slot order and without idle marks); the score kernel's stages forced
(ours_2st, ours_3st, os_2st, os_3st).  The forty-seventh session dropped
the columns of retired flags (ours_cm, os_cm, g28_cm: the clear's memset
node; ours_lt, os_lt, g28_lt: no early loads; ours_ofl, ours_mfl: the
first wave in rank order) and of the serial select tail (ours_sts,
g28_sts), settled by pairs; the forty-eighth those of the fine histogram
added to global memory by every warp (ours_fg, os_fg, os8_fg, g28_fg:
GPU_ATTN_FINE_GLOBAL); the forty-ninth those of the fused-product scores
(ours_fma, os_fma, qs_fma: GPU_ATTN_SCORE_FMA) and added pos_sch (value
positions in store order, beside ours_pos); an older log's columns print
if named."""
import sys

DEFAULT = ["ours_us", "oscore", "os_s8", "g2_s8", "ours_2st", "ours_3st", "os_2st", "os_3st",
           "ours_g2", "ours_mny", "os_1cta", "os_many", "ours_pos", "pos_sch", "quest_us"]


def rows(path):
    head, out = None, []
    for line in open(path):
        cells = [c for c in line.replace("|", " ").split()]
        if cells and cells[0] == "batch":
            head = cells
        elif head and len(cells) == len(head) and cells[0].isdigit():
            out.append(dict(zip(head, cells)))
    return out


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    cols = argv[2:] or DEFAULT
    print("%5s %8s " % ("batch", "context") + " ".join("%14s" % c for c in cols))
    for r in rows(argv[1]):
        base = float(r[cols[0]]) if cols[0] in r else None
        cells = []
        for c in cols:
            if c not in r:
                cells.append("%14s" % "-")
                continue
            v = float(r[c])
            cells.append("%7.1f (%4.2f)" % (v, v / base) if base else "%14.1f" % v)
        print("%5s %8s " % (r["batch"], r["context"]) + " ".join(cells))


if __name__ == "__main__":
    main(sys.argv)
