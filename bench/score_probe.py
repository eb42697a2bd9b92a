#!/usr/bin/env python3
"""What the score kernel (k_score) waits on: timing-only variants of it, in
a scratch copy of the repository, never the library's (their scores and
histograms are wrong, so the select after them is meaningless).

    bench/score_probe.py patch TREE VARIANT
    (build TREE's bench/attn, run it with --score-only 1: the score kernel
     alone, from CUDA graphs of the stage cut after it, less the stage cut
     before it)

VARIANT:
  nofine   the fine histogram's global reductions left out (hist_add's
           atomicAdd into g_lo; the coarse one in shared memory stays)
  nohist   no histogram in k_score at all (neither form, nor a flush)
  nostore  the scores and token counts not stored
  nomatch  the fine histogram's reductions a lane each (no match_any and
           no warp sum before them): the same histogram
  nomatch2 nomatch, and the coarse one's shared-memory adds a lane each
nofine, nomatch and nomatch2 edit hist_add, the form that runs with
GPU_ATTN_FINE_GLOBAL (--score-only's "fine global" figures) since the
fortieth session; nohist and nostore edit both forms.
Each prints nothing; it exits non-zero, naming the edit, where the text it
edits is gone or found more than once (bench/probe_edit.py).
Used in the thirty-ninth session (gpu/NOTES.md).
"""
import sys

import probe_edit


FINE = '\tsum = bin_sum(lb, wv, uni, valid, &lead);\n\tif (lead)\n\t\tatomicAdd(&g_lo[lb], sum);\n'
ADDS = ('\t\tif (fine_g)\n\t\t\thist_add(sm.hi, hist + HIST_HI, valid && gb >= 1, sc, w);\n'
        '\t\telse\n\t\t\thist_add_ht(sm.ht.key, sm.ht.cnt, hist, valid && gb >= 1, sc, w);\n')
COARSE = '\tuint32_t sum = bin_sum(hb, wv, uni, valid, &lead);\n\tif (lead)\n\t\tatomicAdd(&sh_hi[hb], sum);\n'


def patch(tree, variant):
    edits = {
        "nofine": [("\t\tatomicAdd(&g_lo[lb], sum);\n", "\t\t(void)sum;\n")],
        "nohist": [(ADDS, "\t\tif (valid && sc == 12345.0f && w == 77u)\n"
                    "\t\t\tscores[0] = 0.0f;\n"),
                   ("\tif (fine_g) {\n\t\thist_flush(sm.hi, hist);\n\t\treturn;\n\t}\n",
                    "\tif (fine_g)\n\t\treturn;\n"),
                   ("\thist_flush_ht(sm.ht.key, sm.ht.cnt, (uint32_t *)&sm.st[0], hist);\n",
                    "")],
        "nostore": [("\t\tif (valid) {\n\t\t\tscores[gb] = sc;\n\t\t\tntok[gb] = (uint8_t)w;\n\t\t}\n"
                     "\t\tif (fine_g)\n",
                     "\t\tif (fine_g)\n")],
        "nomatch": [(FINE, "\tif (valid)\n\t\tatomicAdd(&g_lo[lb], wv);\n")],
        "nomatch2": [(FINE, "\tif (valid)\n\t\tatomicAdd(&g_lo[lb], wv);\n"),
                     (COARSE, "\tif (valid)\n\t\tatomicAdd(&sh_hi[hb], wv);\n"
                      "\t(void)uni;\n\t(void)lead;\n")],
    }[variant]
    probe_edit.edit(tree + "/gpu/attn.cu", "score_probe",
                    [(old, new, "%s's edit %d" % (variant, i + 1))
                     for i, (old, new) in enumerate(edits)])


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "patch":
        sys.exit(__doc__)
    patch(sys.argv[2], sys.argv[3])
