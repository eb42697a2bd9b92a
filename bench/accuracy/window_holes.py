"""How often a real model's block selection leaves a hole: a window of
--chunk blocks (the GPU attention kernel's work chunk) with no selected
block between selected windows of the same segment.  Such a hole is
what k_segrot mishandled before `b22a44d` (gpu/NOTES.md, sixteenth
session).  The same numpy model of the selection as summary_bits.py
(bf16 summaries), on captured SmolLM2 Q/K (capture.py): per (prompt,
layer, KV head) the top --frac of the history blocks plus the sink.

    python3 capture.py --tokens 8000 --prompts 2 --out /tmp/captures
    python3 window_holes.py --captures /tmp/captures --segment 4096 --chunk 64
"""

from summary_bits import block_scores, captured_cases, selection_args, top_blocks


def holes(sel, nblk, seg_blocks, chunk):
    """Windows with nothing selected and a selected window on each side,
    inside one segment; and the windows counted."""
    n_holes = n_win = 0
    for s0 in range(0, nblk, seg_blocks):
        s1 = min(nblk, s0 + seg_blocks)
        taken = [any(j in sel for j in range(w0, min(s1, w0 + chunk)))
                 for w0 in range(s0, s1, chunk)]
        n_win += len(taken)
        on = [i for i, t in enumerate(taken) if t]
        if on:
            n_holes += sum(1 for i in range(on[0], on[-1] + 1) if not taken[i])
    return n_holes, n_win


def main():
    ap = selection_args(__doc__)
    ap.add_argument("--chunk", type=int, nargs="+", default=[64, 128, 256])
    a = ap.parse_args()
    b = 16
    cases = {c: [0, 0, 0] for c in a.chunk}  # cases with a hole, holes, windows
    n = 0
    for k, q, _ in captured_cases(a.captures):
        s = block_scores(k, q, a.S, a.segment, b, a.window)[16]
        sel = top_blocks(s, a.frac)
        n += 1
        for c in a.chunk:
            nh, nw = holes(sel, len(s), a.segment // b, c)
            cases[c][0] += nh > 0
            cases[c][1] += nh
            cases[c][2] += nw
    for c in a.chunk:
        hc, nh, nw = cases[c]
        print(f"segments of {a.segment} tokens, chunks of {c} blocks: {hc} of {n} "
              f"(prompt, layer, KV head) cases have a hole; {nh} holes in {nw} windows")


if __name__ == "__main__":
    main()
