#!/usr/bin/env python3
"""What the score kernel (k_score) waits on: timing-only variants of it, in
a scratch copy of the repository, never the library's (their scores and
histograms are wrong, so the select after them is meaningless).

    bench/score_probe.py patch TREE VARIANT
    (build TREE's bench/attn, run it with --score-only 1: the score kernel
     alone, from CUDA graphs of the stage cut after it, less the stage cut
     before it)

VARIANT:
  nohist   no histogram in k_score at all (neither the table's adds nor
           its flush)
  nostore  the scores and token counts not stored
The thirty-ninth session's nofine, nomatch and nomatch2 edited hist_add,
the form k_score took with GPU_ATTN_FINE_GLOBAL; the forty-eighth session
retired that flag, and hist_add is Quest's alone now.
Each prints nothing; it exits non-zero, naming the edit, where the text it
edits is gone or found more than once (bench/probe_edit.py).
tests/bench/test_score_probe.py applies each to the tree's own source.
"""
import sys

import probe_edit


ADDS = "\t\thist_add_ht(sm.ht.key, sm.ht.cnt, hist, valid && gb >= 1, sc, w);\n"
FLUSH = "\thist_flush_ht(sm.ht.key, sm.ht.cnt, (uint32_t *)&sm.st[0], hist);\n"
STORE = "\t\tif (valid) {\n\t\t\tscores[gb] = sc;\n\t\t\tntok[gb] = (uint8_t)w;\n\t\t}\n"
VARIANTS = ("nohist", "nostore")


def patch(tree, variant):
    edits = {
        # a use of sc and w the compiler cannot drop, that never stores
        "nohist": [(ADDS, "\t\tif (valid && sc == 12345.0f && w == 77u)\n"
                    "\t\t\tscores[0] = 0.0f;\n"),
                   (FLUSH, "")],
        "nostore": [(STORE + ADDS, ADDS)],
    }[variant]
    probe_edit.edit(tree + "/gpu/attn.cu", "score_probe",
                    [(old, new, "%s's edit %d" % (variant, i + 1))
                     for i, (old, new) in enumerate(edits)])


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "patch" or sys.argv[3] not in VARIANTS:
        sys.exit(__doc__)
    patch(sys.argv[2], sys.argv[3])
