#!/usr/bin/env python3
"""bench/cta_probe.py: `patch` on copies of the tree's own gpu/attn.cu and
bench/attn.c (so that an edit moving the text it hooks into fails here, not
in a GPU session), and on a file without its anchor; `summary` on a
hand-made dump whose figures are worked out here."""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import benchcheck
from benchcheck import ROOT, check
import cta_probe  # noqa: E402


# patch: every probe piece lands once, the rest of the files unchanged
with tempfile.TemporaryDirectory() as t:
    for d in ("gpu", "bench"):
        os.makedirs(os.path.join(t, d))
    shutil.copy(os.path.join(ROOT, "gpu", "attn.cu"), os.path.join(t, "gpu"))
    shutil.copy(os.path.join(ROOT, "bench", "attn.c"), os.path.join(t, "bench"))
    a0 = open(os.path.join(t, "gpu", "attn.cu")).read()
    b0 = open(os.path.join(t, "bench", "attn.c")).read()
    cta_probe.patch(t)
    a1 = open(os.path.join(t, "gpu", "attn.cu")).read()
    b1 = open(os.path.join(t, "bench", "attn.c")).read()
    check(a1.count("__device__ unsigned long long g_tr[") == 1, "the record array")
    check(a1.count("tr_guard TG{g_tr[") == 1, "the kernel's stamp")
    check(a1.count("TG.p[3] |= (unsigned long long)cnt << 16") == 1, "the block count")
    check(a1.count('"/tmp/tr_%d.bin"') == 1, "the dump")
    check(a1.count("TG.p[4] = clock64();") == 1, "the list's stamp")
    check(a1.count("bool tr_first = true;") == 1 and
          a1.count("if (tr_first && lane == 0)") == 1, "the first rows' stamp")
    check(a1.count("atomicMax(&tp[6], ~tc);") == 1, "the loop's end")
    check(len(a1) - len(a0) == len(cta_probe.PROBE) - len(cta_probe.HEAD)
          + len(cta_probe.KSTAMP) - len(cta_probe.KOPEN)
          + len(cta_probe.KWORK_P) - len(cta_probe.KWORK)
          + len(cta_probe.KLOOP0_P) - len(cta_probe.KLOOP0)
          + len(cta_probe.KLOOP_P) - len(cta_probe.KLOOP)
          + len(cta_probe.KEND_P) - len(cta_probe.KEND)
          + len(cta_probe.DUMP) - len(cta_probe.LAUNCH), "attn.cu grew by the pieces alone")
    check(b1.count("RC(f_packed(&a, dheads, st));\n\t\t\t\tRC(f_packed(&a, dheads, st));") == 1,
          "ours run twice under --once")
    check(len(b1) - len(b0) == len("\t\t\t\tRC(f_packed(&a, dheads, st));\n"), "attn.c")
    # a tree without the anchors: a clear stop, the file untouched
    open(os.path.join(t, "gpu", "attn.cu"), "w").write("int x;\n")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "cta_probe.py"),
                        "patch", t], capture_output=True, text=True)
    check(r.returncode != 0 and "common.cuh" in r.stderr, "stop without an anchor")
    check(open(os.path.join(t, "gpu", "attn.cu")).read() == "int x;\n", "left as it was")

# summary: 2 heads x 3 slots on SMs 0 and 1; work CTAs cost 1000 + 50 a
# block: listed at +300, first rows 200 later, the warps' loops end 40 a
# block after that (the earliest 100 before the latest), the tail the rest
recs = [  # (start clock, end clock, sm, blocks)
    (100, 100 + 1000 + 50 * 10, 0, 10),
    (200, 200 + 1000 + 50 * 30, 1, 30),
    (300, 300 + 400, 0, 0),
    (1700, 1700 + 1000 + 50 * 20, 0, 20),
    (2800, 2800 + 600, 1, 0),
    (3000, 3000 + 1000 + 50 * 40, 1, 40),
]
M64 = (1 << 64) - 1
b = struct.pack("4I", 3, 2, 3, 0x20)
for c0, c1, sm, n in recs:
    if n:
        lst, first = c0 + 300, c0 + 500
        hi = first + 40 * n
        stamps = (lst, first, ~(hi - 100) & M64, hi)
    else:
        stamps = (0, 0, 0, 0)
    b += struct.pack("8Q", 5000 + c0, c0, c1, sm | n << 16 | 7 << 32, *stamps)
r = cta_probe.summary(b)
# SM 0: 100 .. 3700; SM 1: 200 .. 6000
check(r["sms"] == 2 and r["span_max"] == 5800 and r["span_min"] == 3600, "spans")
check(abs(r["balance"] - (3600 + 5800) / 2 / 5800) < 1e-12, "balance")
check(r["work"] == 4 and r["idle"] == 2 and r["idle_mean"] == 500, "CTAs with and without work")
check(r["blocks_mean"] == 25 and r["blocks_max"] == 40 and r["cycles_max"] == 3000, "counts")
check(abs(r["fixed"] - 1000) < 1e-9 and abs(r["per_block"] - 50) < 1e-9, "the fit")
check(r["resid_sd"] < 1e-9, "an exact fit")
# phases: mean blocks 25, so the loop 40 * 25 and the tail 1000 + 50 * 25 - 500 - 1000
check(r["staged"] == 4 and r["t_list"] == 300 and r["t_first"] == 200, "the opening")
check(r["t_loop"] == 1000 and r["t_spread"] == 100 and r["t_tail"] == 750, "loop and tail")
check(abs(r["loop_fixed"]) < 1e-9 and abs(r["loop_per_block"] - 40) < 1e-9, "the loop's fit")

# profile, two parts of the longest span (SM 1's 5800): SM 0 from 100 holds
# [0, 1500], [200, 600] (no work), [1600, 3600]; SM 1 from 200 holds
# [0, 2500], [2600, 3200] (no work), [2800, 5800].  Loops run from the
# first rows (start + 500) to their end (start + 500 + 40 blocks).
p = cta_probe.profile(b, nb=2)
W = 2900.0
res0 = ((1500 + 400 + (2900 - 1600)) + (2500 + 300 + (2900 - 2800))) / W / 2
res1 = ((3600 - 2900) + ((3200 - 2900) + (5800 - 2900))) / W / 2
# loops, relative to each SM's origin: SM 0 [500, 900], [2100, 2900];
# SM 1 [500, 1700], [3300, 4900]
loop0 = ((400 + 800) + 1200) / W / 2
loop1 = (0 + (4900 - 3300)) / W / 2
check(len(p) == 2 and abs(p[0][0] - res0) < 1e-12 and abs(p[1][0] - res1) < 1e-12,
      "profile: resident CTAs")
check(abs(p[0][1] - loop0) < 1e-12 and abs(p[1][1] - loop1) < 1e-12, "profile: CTAs in their loop")
# replay on 2 slots: record order 1500, 2500, 400, 2000, 600, 3000 ends at
# 6100; longest first 3000, 2500, 2000, 1500, 600, 400 at 5100; 10000 / 2
q = cta_probe.replay(b, slots=2)
check(q["record_order"] == 6100 and q["longest_first"] == 5100 and q["bound"] == 5000,
      "replay on two slots")
# by default the slots are the SMs times the most CTAs an SM held at once
# (two on each: SM 0 from 300 to 700, SM 1 from 3000 to 3400): 4.  Record
# order: 1500, 2500, 400, 2000 start at once, 600 after the 400 (at 1000),
# 3000 after it (4000); longest first: 3000, 2500, 2000, 1500, then 600 on
# the 1500's slot (2100) and 400 on the 2000's (2400)
q = cta_probe.replay(b)
check(q["slots"] == 4 and q["record_order"] == 4000, "replay on the default four slots")
check(q["longest_first"] == 3000 and q["bound"] == 2500, "replay longest first on four slots")

print("cta_probe:", "FAIL" if benchcheck.fails else "ok")
sys.exit(1 if benchcheck.fails else 0)
