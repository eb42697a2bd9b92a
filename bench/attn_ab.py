#!/usr/bin/env python3
"""The columns of bench/attn's table that an A/B call compares, side by
side, with each one's ratio to the first: `python3 bench/attn_ab.py
bench.log [column ...]` (default: the ordered path's variants).  Reads the
header row (the line starting with "batch") and every data row under it;
a column the log lacks prints as "-" (an older binary's table).  The
default since the forty-first session: ours_us and g2_s8, each beside
its variant with k_segrot after the whole attention kernel (ours_srw,
g28_srw: GPU_ATTN_SEGROT_WAIT), then the score kernel's fine histogram
added by every warp (ours_fg, os_fg: GPU_ATTN_FINE_GLOBAL), the score
stage (oscore, os_s8: their ratios to ours_us mean nothing), g = 2,
the many-CTA select forced, slot order, the select alone with one or
many CTAs, and Quest.  Any other column of the table can be named."""
import sys

DEFAULT = ["ours_us", "ours_srw", "g2_s8", "g28_srw", "ours_fg", "oscore", "os_fg", "os_s8",
           "ours_g2", "ours_mny", "ours_so", "os_1cta", "os_many", "quest_us"]


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
