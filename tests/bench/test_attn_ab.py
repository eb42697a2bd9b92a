#!/usr/bin/env python3
"""bench/attn_ab.py: every default column is one bench/attn prints (a
renamed column fails here, not in a GPU session), and a hand-made table
(the bench's row layout, bars and a split line included) reads back with
the ratios worked out here."""
import io
import os
import re
import sys
import tempfile
from contextlib import redirect_stdout

import benchcheck
from benchcheck import ROOT, check
import attn_ab  # noqa: E402


src = open(os.path.join(ROOT, "bench", "attn.c")).read()
i = src.index('printf("\\n%5s %8s')
names = set(re.findall(r'"([a-z][a-z0-9_/]*)"', src[i:src.index(");", i)]))
for c in attn_ab.DEFAULT:
    check(c in names, "column %s is in bench/attn's header" % c)

LOG = """bench/attn on a made-up GPU
batch  context |  ours_us   ours_so | quest_us
    1   262144 |     90.0      99.0 |    180.0
      split: clear+qrot 11.0 us, +score 23.3 us
    1  1048576 |    200.0     210.0 |    300.0
(legend)
"""
with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
    f.write(LOG)
try:
    rs = attn_ab.rows(f.name)
    check(len(rs) == 2, "two data rows, got %d" % len(rs))
    check(rs[1]["context"] == "1048576" and rs[1]["ours_so"] == "210.0", "row 2 by name")
    out = io.StringIO()
    with redirect_stdout(out):
        attn_ab.main(["attn_ab", f.name, "ours_us", "ours_so", "quest_us", "ours_ni"])
    lines = out.getvalue().splitlines()
    check(len(lines) == 3, "a header and two rows, got %d lines" % len(lines))
    check("99.0 (1.10)" in lines[1] and "180.0 (2.00)" in lines[1], "row 1's ratios: " + lines[1])
    check("210.0 (1.05)" in lines[2] and "300.0 (1.50)" in lines[2], "row 2's ratios: " + lines[2])
    check(lines[1].rstrip().endswith("-"), "a missing column prints as -: " + lines[1])
finally:
    os.unlink(f.name)

sys.exit(1 if benchcheck.fails else 0)
