#!/usr/bin/env python3
"""bench/score_probe.py: each variant's `patch` on a copy of the tree's own
gpu/attn.cu (so that an edit moving the text it hooks into fails here, not
in a GPU session), what each takes out counted against the original, and
an unknown variant refused."""
import os
import shutil
import subprocess
import sys
import tempfile

import benchcheck
from benchcheck import ROOT, check
import score_probe  # noqa: E402


SRC = os.path.join(ROOT, "gpu", "attn.cu")
a0 = open(SRC).read()
with tempfile.TemporaryDirectory() as t:
    os.makedirs(os.path.join(t, "gpu"))
    dst = os.path.join(t, "gpu", "attn.cu")
    for v in score_probe.VARIANTS:
        shutil.copy(SRC, dst)
        score_probe.patch(t, v)
        a1 = open(dst).read()
        if v == "nohist":
            check(a1.count("hist_add_ht(sm.ht.key") == 0 and
                  a1.count("hist_flush_ht(sm.ht.key") == 0, "nohist: no table adds, no flush")
            check(a0.count("hist_add_ht(") - a1.count("hist_add_ht(") == 1,
                  "nohist: only k_score's call goes")
        else:
            check(a1.count("ntok[gb] = (uint8_t)w;") == a0.count("ntok[gb] = (uint8_t)w;") - 1,
                  "nostore: k_score's store goes")
            check(a1.count("hist_add_ht(sm.ht.key") == 1, "nostore: the adds stay")
    # an anchor gone: exits non-zero, naming the edit
    open(dst, "w").write(a0.replace("hist_flush_ht(sm.ht.key", "hist_flush_ht(sm.ht.kez"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "score_probe.py"), "patch",
                        t, "nohist"], capture_output=True, text=True)
    check(r.returncode != 0 and "nohist's edit 2" in r.stderr, "a missing anchor stops it")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "score_probe.py"), "patch",
                        t, "nofine"], capture_output=True, text=True)
    check(r.returncode != 0 and "VARIANT" in r.stderr, "a retired variant is refused")

if benchcheck.fails:
    sys.exit(1)
print("score_probe: both variants patch the tree's attn.cu")
