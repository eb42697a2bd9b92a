"""Block selection with 8-bit block summaries against bf16 ones, on
captured SmolLM2 Q/K (capture.py).  A numpy model of the library's
selection, not the library itself: per (layer, KV head), segments of
--segment tokens with their own PCA rotation, blocks of 16, the min/max
of the S leading rotated channels rounded outward to bf16, the remainder
bound, score = max over the group's query heads of
sum_c max(q'_c mn_c, q'_c mx_c) + |q_perp| rest, the top --frac of the
history blocks plus the sink block; the last --window tokens always
attended.  8-bit: per block one scale (its largest |bound| / 127, rounded
up to bf16), the min floored and the max ceiled to that grid, so they
still bound the keys.  8-bit integer (--int): the same 8-bit bounds with
the rotated query also rounded to 8 bits (per query head and segment,
its largest |q'_c| / 127), the sum taken in integers as a dp4a kernel
would (q+ against the max, q- against the min), then scaled: no longer a
bound, a model of an all-integer score.  Prints how many selected blocks
each shares with bf16 and the attention-mass recall of each (the exact
softmax mass on the attended tokens, averaged over the group's heads).

    python3 capture.py --tokens 8000 --prompts 2 --out /tmp/captures
    python3 summary_bits.py --captures /tmp/captures --S 16
"""
import argparse
import glob

import numpy as np


def bf16_up(x):
    """The smallest bf16 value >= x (finite x)."""
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    h = (u >> 16) << 16
    r = np.where((u & 0xffff) == 0, h, np.where(x > 0, h + 0x10000, h))
    return r.astype(np.uint32).view(np.float32)


def bf16_down(x):
    """The largest bf16 value <= x (finite x)."""
    return -bf16_up(-np.asarray(x, np.float32))


def rotation(x):
    """The segment's PCA rotation: rows are the eigenvectors of x^T x,
    largest eigenvalue first."""
    _, vec = np.linalg.eigh(x.T @ x)
    return vec[:, ::-1].T


def block_scores(k, q, S, seg, b, win):
    """Per history block, its score with bf16 summaries ([16]) and with
    8-bit ones ([8]), segments of @seg tokens each with its own rotation."""
    n, d = k.shape
    nh = n - win
    scores = {16: [], 8: [], "8q": []}
    for s0 in range(0, nh, seg):
        ks = k[s0:min(nh, s0 + seg)]
        R = rotation(ks)
        xr, qr = ks @ R.T, q @ R.T
        qperp = np.sqrt(np.maximum(0, (q * q).sum(1) - (qr[:, :S] ** 2).sum(1)))
        qsc = np.abs(qr[:, :S]).max(1) / 127
        qsc[qsc == 0] = 1.0
        qi = np.rint(qr[:, :S] / qsc[:, None])  # integers in [-127, 127]
        for j in range((len(ks) + b - 1) // b):
            blk, xo = xr[j * b:(j + 1) * b], ks[j * b:(j + 1) * b]
            mn = bf16_down(blk[:, :S].min(0)).astype(np.float64)
            mx = bf16_up(blk[:, :S].max(0)).astype(np.float64)
            rest = np.sqrt(np.maximum(0, (xo * xo).sum(1) - (blk[:, :S] ** 2).sum(1))).max()
            rest = float(bf16_up(rest))
            sc = float(bf16_up(max(np.abs(mn).max(), np.abs(mx).max()) / 127)) or 1.0
            for tag, lo, hi in ((16, mn, mx), (8, np.floor(mn / sc) * sc, np.ceil(mx / sc) * sc)):
                s = np.maximum(qr[:, :S] * lo, qr[:, :S] * hi).sum(1) + qperp * rest
                scores[tag].append(s.max())
            mi, Mi = np.floor(mn / sc), np.ceil(mx / sc)
            isum = (np.maximum(qi, 0) * Mi + np.minimum(qi, 0) * mi).sum(1)
            scores["8q"].append((qsc * sc * isum + qperp * rest).max())
    return scores


def top_blocks(scores, frac):
    """The selection: the top @frac of the blocks by score plus the sink
    (block 0), ties to the lower index."""
    s = np.array(scores, np.float64)
    s[0] = np.inf  # the sink block
    kk = max(1, int(round(frac * len(s))))
    return set(np.argsort(-s, kind="stable")[:kk].tolist())


def captured_cases(captures):
    """(k, q, v) in float64 for every (prompt, layer, KV head) of the
    captures in directory @captures: the head's keys and values (n x d)
    and its GQA group's last-position queries (g x d)."""
    for f in sorted(glob.glob(f"{captures}/qkv_*.npz")):
        z = np.load(f)
        Q, K, V = z["q"], z["k"], z["v"]
        g = Q.shape[1] // K.shape[1]
        for l in range(Q.shape[0]):
            for h in range(K.shape[1]):
                yield (K[l, h].astype(np.float64), Q[l, h * g:(h + 1) * g].astype(np.float64),
                       V[l, h].astype(np.float64))


def case(k, q, S, seg, b, win, frac):
    """Selections (bf16, 8-bit) and their mass recalls for one KV head."""
    n, d = k.shape
    nh = n - win
    scores = block_scores(k, q, S, seg, b, win)
    kk = max(1, int(round(frac * len(scores[16]))))
    logits = (q @ k.T) / np.sqrt(d)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    sel, rec = {}, {}
    for tag in (16, 8, "8q"):
        sel[tag] = top_blocks(scores[tag], frac)
        m = np.zeros(n, bool)
        m[nh:] = True
        for j in sel[tag]:
            m[j * b:min(nh, (j + 1) * b)] = True
        rec[tag] = p[:, m].sum(1).mean()
    return (len(sel[16] & sel[8]) / kk, rec[16], rec[8], len(sel[16] & sel["8q"]) / kk,
            rec["8q"])


def selection_args(doc):
    """An argument parser with the selection model's options (captures,
    S, segment, window, frac), for this script and those that share its
    model."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--captures", default="captures")
    ap.add_argument("--S", type=int, default=16)
    ap.add_argument("--segment", type=int, default=4096)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--frac", type=float, default=0.10)
    return ap


def main():
    ap = selection_args(__doc__)
    a = ap.parse_args()
    rows = [case(k, q, a.S, a.segment, 16, a.window, a.frac)
            for k, q, _ in captured_cases(a.captures)]
    r = np.array(rows)
    print(f"S={a.S}: {len(r)} (prompt, layer, KV head) cases; blocks both select: mean "
          f"{r[:, 0].mean():.4f}, least {r[:, 0].min():.4f}; mass recall bf16 {r[:, 1].mean():.4f}, "
          f"8-bit {r[:, 2].mean():.4f}; largest loss in one case {np.max(r[:, 1] - r[:, 2]):.4f}")
    print(f"  8-bit integer (q' in 8 bits too): blocks shared with bf16: mean {r[:, 3].mean():.4f}, "
          f"least {r[:, 3].min():.4f}; mass recall {r[:, 4].mean():.4f}; largest loss in one case "
          f"{np.max(r[:, 1] - r[:, 4]):.4f}")


if __name__ == "__main__":
    main()
