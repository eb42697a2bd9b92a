#!/usr/bin/env python3
"""bench/tail_probe.py: `patch` on copies of the tree's own gpu/attn.cu and
bench/attn.c (so that an edit moving the text it hooks into fails here, not
in a GPU session), and on a file without its anchor; `report` on a
hand-made dump whose figures are worked out here."""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import benchcheck
from benchcheck import ROOT, check
import tail_probe  # noqa: E402


with tempfile.TemporaryDirectory() as t:
    for d in ("gpu", "bench"):
        os.makedirs(os.path.join(t, d))
    shutil.copy(os.path.join(ROOT, "gpu", "attn.cu"), os.path.join(t, "gpu"))
    shutil.copy(os.path.join(ROOT, "bench", "attn.c"), os.path.join(t, "bench"))
    a0 = open(os.path.join(t, "gpu", "attn.cu")).read()
    b0 = open(os.path.join(t, "bench", "attn.c")).read()
    tail_probe.patch(t)
    a1 = open(os.path.join(t, "gpu", "attn.cu")).read()
    b1 = open(os.path.join(t, "bench", "attn.c")).read()
    check(a1.count("__device__ unsigned long long g_tl[") == 1, "the record array")
    for k in range(3):
        check(a1.count(f"TL_GUARD({k});") == 1, f"kernel {k}'s guard")
    check(a1.count("TL_STAMP(1);") == 3, "three stamps past the waits")
    check(all(a1.count(f"TL_STAMP({i});") == 1 for i in (3, 5, 6)) and
          a1.count("TLG.p[4] = tl_now();") == 1, "k_segrot's inner stamps")
    check(a1.count('"/tmp/tl_%d.bin"') == 1, "the dump")
    check(len(b1) > len(b0) and b1.count("RC(f_packed(&a, dheads, st));") ==
          b0.count("RC(f_packed(&a, dheads, st));") + 1, "one more ours in --once")
    # without an anchor: exits non-zero, naming the piece
    open(os.path.join(t, "gpu", "attn.cu"), "w").write(a0.replace("pdl_trigger();", ""))
    open(os.path.join(t, "bench", "attn.c"), "w").write(b0)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "tail_probe.py"), "patch",
                        t], capture_output=True, text=True)
    check(r.returncode != 0 and "k_segrot's opening" in r.stderr, "a missing anchor stops it")

    # report: attention CTAs past the wait at 1,000 ns (t0) and 1,500; their
    # ends 101,000 and 121,000; k_segrot past its wait at 123,000, ends at
    # 127,000 and 129,500; k_merge past at 130,000, ends 136,000
    # (the first k_segrot CTA with its inner stamps: note at 123,500,
    # states 124,500, fold 125,000, barrier 126,000; the second without)
    z = (0, 0, 0, 0, 0)
    recs = [[(500, 1000, 101000) + z, (600, 1500, 121000) + z],
            [(50000, 123000, 127000, 123500, 124500, 125000, 126000, 0),
             (50100, 0, 129500) + z],
            [(60000, 130000, 136000) + z]]
    p = os.path.join(t, "tl.bin")
    with open(p, "wb") as f:
        f.write(struct.pack("<4I", 660, 8, 65, 0))
        for rk in recs:
            for i in range(tail_probe.NREC):
                f.write(struct.pack("<8Q", *(rk[i] if i < len(rk) else (0,) * 8)))
    lines, fig = tail_probe.summary(p)
    a, s, m = fig["attention"], fig["k_segrot"], fig["k_merge"]
    check(a["n"] == 2 and abs(a["entry"] + 0.5) < 1e-9 and abs(a["end"] - 120.0) < 1e-9,
          "attention's figures")
    check(abs(s["wait0"] - 122.0) < 1e-9 and abs(s["wait1"] - 122.0) < 1e-9 and
          abs(s["end"] - 128.5) < 1e-9, "k_segrot's figures (a CTA without a wait stamp)")
    check(abs(m["end"] - 135.0) < 1e-9, "k_merge's end")
    check(all(abs(x - y) < 1e-9 for x, y in zip(fig["steps"], (0.5, 1.0, 0.5, 1.0, 1.0))),
          "k_segrot's steps: %s" % (fig.get("steps"),))
    chain = [x for x in lines if x.startswith("  chain:")]
    check(len(chain) == 1 and "k_segrot past its wait +2.00" in chain[0] and
          "its last end +8.50" in chain[0] and "k_merge past its wait +9.00" in chain[0],
          "the chain: " + (chain[0] if chain else "none"))

if benchcheck.fails:
    sys.exit(1)
print("tail_probe: ok")
