"""Prototypes of channel-compression variants on captured real Q/K/V.

Numpy only (no library call): for every layer and KV head of a capture made
by capture.py (which also stores each KV head's prefill query second
moment), the history is cut into --segment-token segments, K and V are
rotated by their segment's second-moment eigenvectors and every vector
keeps its r largest rotated elements, and all tokens are attended, so only
the channel compression is measured.  Reports the attention-output
relative error against exact attention for each variant, and per layer
with --per-layer.  Variants at the same bytes per vector as r = d/4 in
bf16 spend them on more values at lower precision (one bf16 scale per
vector).
"""
import argparse
import sys

import numpy as np


def attn(q, k, v):
    s = q @ k.T / np.sqrt(q.shape[1])
    s -= s.max(1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(1, keepdims=True)
    return p @ v


def sqrtm(S, eps):
    w, U = np.linalg.eigh(S)
    w = np.maximum(w, 0) + eps * w.max()
    return (U * np.sqrt(w)) @ U.T


def compress(x, r, bits=16, center=False, A=None):
    """x (n, d) -> reconstruction after rotation + per-vector top-r."""
    mu = x.mean(0, keepdims=True) if center else 0.0
    y = x - mu
    if A is not None:
        y = y @ A.T
    _, U = np.linalg.eigh(y.T @ y)
    yr = y @ U
    order = np.argsort(-np.abs(yr), 1)
    m = np.zeros_like(yr)
    np.put_along_axis(m, order[:, :r], 1, 1)
    yr = yr * m
    if bits < 16:
        qmax = 2 ** (bits - 1) - 1
        sc = np.abs(yr).max(1, keepdims=True) / qmax
        sc[sc == 0] = 1
        yr = np.round(yr / sc) * sc
    y = yr @ U.T
    if A is not None:
        y = np.linalg.solve(A, y.T).T
    return y + mu


def segmented(x, nh, seg, fn):
    return np.concatenate([fn(x[i:min(i + seg, nh)]) for i in range(0, nh, seg)] + [x[nh:]])


def loss_r(x, tau):
    """Smallest r whose relative energy loss is <= tau."""
    _, U = np.linalg.eigh(x.T @ x)
    e = np.sort((x @ U) ** 2, 1)[:, ::-1].sum(0)
    lost = 1 - np.cumsum(e) / e.sum()
    return int(np.argmax(lost <= tau)) + 1


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("capture")
    ap.add_argument("--segment", type=int, default=1024)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--per-layer", action="store_true")
    a = ap.parse_args()
    z = np.load(a.capture)
    Q, K, V = z["q"], z["k"], z["v"]
    QC = z["qcov"] if "qcov" in z else None
    L, hq, d = Q.shape
    hkv, n = K.shape[1], K.shape[2]
    grp, nh, r = hq // hkv, n - a.window, d // 4
    variants = {
        f"r={r} bf16": lambda k, v, h: (r, 16, False, None, True, True),
        f"r={r} K only": lambda k, v, h: (r, 16, False, None, True, False),
        f"r={r} V only": lambda k, v, h: (r, 16, False, None, False, True),
        f"r={r} centered, K only": lambda k, v, h: (r, 16, True, None, True, False),
        f"r={2 * r} bf16 (1.6x bytes)": lambda k, v, h: (2 * r, 16, False, None, True, True),
        f"r={2 * r} 8-bit + scale": lambda k, v, h: (2 * r, 8, False, None, True, True),
        f"r={5 * r // 2} 6-bit + scale": lambda k, v, h: (5 * r // 2, 6, False, None, True, True),
    }
    if QC is not None:
        variants[f"r={r} query-whitened K"] = lambda k, v, h: (r, 16, False, h, True, True)
    errs, per_layer = {}, {}
    for layer in range(L):
        for h in range(hkv):
            q = Q[layer, h * grp:(h + 1) * grp].astype(np.float64)
            k = K[layer, h].astype(np.float64)
            v = V[layer, h].astype(np.float64)
            ref = attn(q, k, v)
            nr = np.linalg.norm(ref)
            A = sqrtm(QC[layer, h], 1e-2) if QC is not None else None
            for name, spec in variants.items():
                rr, bits, center, use_a, ck, cv = spec(k, v, A)
                kh = segmented(k, nh, a.segment, lambda x: compress(x, rr, bits, center, use_a)) if ck else k
                vh = segmented(v, nh, a.segment, lambda x: compress(x, rr, bits)) if cv else v
                e = float(np.linalg.norm(attn(q, kh, vh) - ref) / nr)
                errs.setdefault(name, []).append(e)
                per_layer.setdefault(name, {}).setdefault(layer, []).append(e)
            # r per segment from a loss threshold (K and V), mean r reported
            for tau in (0.02,):
                rs = []

                def dyn(x):
                    rr = loss_r(x, tau)
                    rs.append(rr)
                    return compress(x, rr)
                kh = segmented(k, nh, a.segment, dyn)
                vh = segmented(v, nh, a.segment, dyn)
                name = f"loss threshold {tau}"
                errs.setdefault(name, []).append(float(np.linalg.norm(attn(q, kh, vh) - ref) / nr))
                errs.setdefault(name + " mean r", []).extend(rs)
    if a.per_layer:
        names = [n for n in variants]
        print("layer " + " ".join(f"{n[:14]:>14}" for n in names))
        for layer in range(L):
            print(f"{layer:5d} " + " ".join(f"{np.mean(per_layer[n][layer]):14.4f}" for n in names))
    print(f"{'variant':>32} {'mean':>7} {'median':>7} {'p90':>7}")
    for name, e in errs.items():
        e = np.array(e)
        if name.endswith("mean r"):
            print(f"{name:>32} {e.mean():7.2f}")
        else:
            print(f"{name:>32} {e.mean():7.4f} {np.median(e):7.4f} {np.percentile(e, 90):7.4f}")


if __name__ == "__main__":
    sys.exit(main())
