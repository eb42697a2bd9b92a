"""Per-vector top-r against structured (N:M) element selection, on captured
SmolLM2 Q/K/V (capture.py).  A numpy model, not the library: per (prompt,
layer, KV head) the history (all but the last --window tokens) is cut into
--segment-token segments, each with its own PCA rotation of K and of V
(eigenvectors of the segment's x^T x, descending); every rotated vector
keeps r values by one of the rules below, is rotated back, and the last
position's queries (the KV head's group) attend over all of the history so
compressed plus the dense window.  Reports the output's relative error
against exact attention, mean and worst over the cases.

Why: the GPU kernel spends most of its time expanding bitmap-packed rows
(gpu/NOTES.md).  A structured rule (N of every M channels) packs positions
in a few bits per value at fixed offsets and, for N:M = 2:4, is what the
tensor cores' sparse MMA (mma.sp) reads directly for K.  This measures what
the structure costs in accuracy before any kernel is written.

Rules, r = --r values per vector (d = 64 on SmolLM2-135M):
  free@K   the r largest |x'_c| among the first K rotated channels (the
           library's rule; K = d_keep)
  first    the first r rotated channels (no selection, no positions)
  N:M@K    groups of M consecutive channels over the first K, the N largest
           of each (r = N K / M)
  N:M@Ki   the same with the channels dealt to the groups by energy rank
           (group j holds channels j, j + K/M, j + 2K/M, ...)
  gG@K     the library's g = G rule: groups of G adjacent rotated channels
           (group j = channels G j .. G j + G - 1) over the first K, the r/G
           groups of largest energy sum x'_c^2 (segment.c's group_energy);
           the GPU kernel's g = 2 fast path expands such bitmaps (one bit
           a pair of channels), so this is the accuracy it costs
  g2i@K    g = 2 with other pairs of channels (sorted by variance as the
  g2r@K    rotation gives them): "i" pairs j with j + K/2 (j < K/2), "r"
  g2v@K    pairs j with K - 1 - j, "v" pairs per segment, from the
           segment's own rotated vectors as the encoder would see them
           at prefill, the channels whose |x'_c| are most correlated over
           its tokens (greedy: the most correlated free pair first).  A
           fixed or per-segment pairing is a row permutation of the
           segment's rotation, so the format and the GPU kernel's g = 2
           expansion (bit j = channels 2j, 2j + 1 of the permuted
           rotation) are unchanged: this asks whether another pairing
           recovers what adjacent pairs lose against free@K

--rules picks rules by name (comma-separated, e.g. free@64,g2@64,g2i@64),
so a run over a few of them takes minutes instead of ten.

    python3 capture.py --tokens 8000 --prompts 2 --out /tmp/captures
    python3 structured_topr.py --captures /tmp/captures
    python3 structured_topr.py --captures /tmp/captures --rules free@64,g2@64,g2i@64,g2r@64,g2v@64
"""
import argparse

import numpy as np

from summary_bits import captured_cases, rotation


def pairs(xr, k, G, pairing):
    """The groups (k/G x G channel indices) of the first @k rotated
    channels under @pairing: "" adjacent, "i" interleaved (G = 2: j and
    j + k/2), "r" reversed rank (G = 2: j and k - 1 - j), "v" greedy on
    the correlation of |x'_c| over the rows of @xr (G = 2)."""
    if pairing == "":
        return np.arange(k).reshape(k // G, G)
    if pairing == "i":
        return np.arange(k).reshape(G, k // G).T
    if pairing == "r":
        return np.stack([np.arange(k // 2), k - 1 - np.arange(k // 2)], 1)
    c = np.nan_to_num(np.corrcoef(np.abs(xr[:, :k]).T), nan=-2.0)
    iu, ju = np.triu_indices(k, 1)
    used, out = np.zeros(k, bool), []
    for t in np.argsort(-c[iu, ju], kind="stable"):
        i, j = iu[t], ju[t]
        if not (used[i] or used[j]):
            used[i] = used[j] = True
            out.append((i, j))
    return np.array(out)


def keep_mask(xr, rule, r):
    """Boolean mask (n x d) of the kept rotated elements under @rule."""
    n, d = xr.shape
    a = np.abs(xr)
    m = np.zeros((n, d), bool)
    if rule[0] == "free":
        k = rule[1]
        idx = np.argsort(-a[:, :k], axis=1, kind="stable")[:, :r]
        np.put_along_axis(m, idx, True, axis=1)
    elif rule[0] == "first":
        m[:, :r] = True
    elif rule[0] == "grp":  # ("grp", G, K, pairing): whole groups by energy
        G, k, pairing = rule[1:]
        cols = pairs(xr, k, G, pairing)
        e = (xr[:, cols] ** 2).sum(2)
        idx = np.argsort(-e, axis=1, kind="stable")[:, :r // G]
        gm = np.zeros(e.shape, bool)
        np.put_along_axis(gm, idx, True, axis=1)
        m[:, cols.ravel()] = np.repeat(gm, G, axis=1)
    else:  # ("nm", N, M, K, interleaved)
        N, M, K, inter = rule[1:]
        G = K // M
        if inter:
            cols = np.array([[j + G * t for t in range(M)] for j in range(G)])
        else:
            cols = np.arange(K).reshape(G, M)
        for j in range(G):
            sub = a[:, cols[j]]
            idx = np.argsort(-sub, axis=1, kind="stable")[:, :N]
            np.put_along_axis(m, cols[j][idx], True, axis=1)
    return m


def compress(x, seg, rule, r):
    out = np.empty_like(x)
    for s0 in range(0, len(x), seg):
        xs = x[s0:s0 + seg]
        R = rotation(xs)
        xr = xs @ R.T
        out[s0:s0 + seg] = np.where(keep_mask(xr, rule, r), xr, 0.0) @ R
    return out


def attend(q, k, v):
    lg = q @ k.T / np.sqrt(q.shape[1])
    p = np.exp(lg - lg.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)) @ v


def rules_for(d, r):
    dk = 3 * d // 4
    out = [("free", dk), ("free", d), ("first",)]
    # g = 2 and 4 at both d_keep the bench and the library use (3d/4, d)
    out += [("grp", G, K, "") for G in (2, 4) for K in (dk, d)
            if r % G == 0 and K % G == 0 and r <= K]
    # other pairs for g = 2 (row permutations of the rotation)
    out += [("grp", 2, K, p) for p in ("i", "r", "v") for K in (dk, d)
            if r % 2 == 0 and K % 2 == 0 and r <= K]
    for K in sorted({2 * r, dk, d}):
        for M in (3, 4, 6, 8, 12, 16):
            if K > d or K % M or (r * M) % K:
                continue
            N = r * M // K
            if 0 < N < M:
                out += [("nm", N, M, K, False), ("nm", N, M, K, True)]
    return out


def name(rule):
    if rule[0] == "free":
        return f"free@{rule[1]}"
    if rule[0] == "first":
        return "first"
    if rule[0] == "grp":
        return f"g{rule[1]}{rule[3]}@{rule[2]}"
    return f"{rule[1]}:{rule[2]}@{rule[3]}{'i' if rule[4] else ''}"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--captures", default="captures")
    ap.add_argument("--segment", type=int, default=4096)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--rules", default="",
                    help="comma-separated rule names to run (default: all)")
    a = ap.parse_args()
    want = set(a.rules.split(",")) - {""}
    errs = {}
    for k, q, v in captured_cases(a.captures):
        nh = len(k) - a.window
        o = attend(q, k, v)
        rules = [u for u in rules_for(k.shape[1], a.r) if not want or name(u) in want]
        if want - {name(u) for u in rules}:
            raise SystemExit(f"no such rule at r = {a.r}: "
                             f"{sorted(want - {name(u) for u in rules})}")
        for rule in rules:
            kc, vc = k.copy(), v.copy()
            kc[:nh] = compress(k[:nh], a.segment, rule, a.r)
            vc[:nh] = compress(v[:nh], a.segment, rule, a.r)
            e = np.linalg.norm(attend(q, kc, vc) - o) / np.linalg.norm(o)
            errs.setdefault(name(rule), []).append(e)
    for n, e in errs.items():
        e = np.array(e)
        print(f"{n:10s} r={a.r}: output rel. error mean {e.mean():.4f}, median "
              f"{np.median(e):.4f}, worst {e.max():.4f} ({len(e)} cases)")


if __name__ == "__main__":
    main()
