"""Attention-level fidelity of mosaickv on captured real Q/K/V.

For every layer and KV head of each capture: the history (all but the last
--window tokens) is encoded in --segment-token segments, the window stays
dense, and the last position's queries (the KV head's GQA group) attend.
Reports the output relative error against exact attention, per method and
per layer, and the mean over everything.
"""
import argparse
import glob
import sys

import numpy as np

import mosaickv as mkv


def methods(d, chan, frac):
    r = max(1, int(round(d * chan)))
    return {
        # name: (segment kwargs or None for Quest, token_frac)
        "mosaickv": (dict(r=r, drop=True, rotate=True, select="per_vector"), frac),
        "mosaickv_nodrop": (dict(r=r, drop=False, rotate=True, select="per_vector"), frac),
        "uniform": (dict(r=r, drop=False, rotate=False, select="per_vector"), frac),
        "globalmask": (dict(r=r, drop=True, rotate=True, select="global"), frac),
        "quest": (None, frac),
        "channels_only": (dict(r=r, drop=True, rotate=True, select="per_vector"), 1.0),
    }


def run(paths, seg, window, chan, frac):
    errs = {}
    per_layer = {}
    for path in paths:
        z = np.load(path)
        q_all, k_all, v_all = z["q"], z["k"], z["v"]
        L, hq, d = q_all.shape
        hkv, n = k_all.shape[1], k_all.shape[2]
        grp = hq // hkv
        nh = n - window
        for layer in range(L):
            for h in range(hkv):
                q = q_all[layer, h * grp:(h + 1) * grp]
                k, v = k_all[layer, h], v_all[layer, h]
                ref = mkv.attend_dense(q, k, v)
                nref = np.linalg.norm(ref)
                for name, (kw, tf) in methods(d, chan, frac).items():
                    if kw is None:
                        out, _ = mkv.attend_quest(q, k[:nh], v[:nh], k[nh:], v[nh:],
                                                  token_frac=tf)
                    else:
                        ks = [mkv.Segment(k[i:min(i + seg, nh)], kind="key", **kw)
                              for i in range(0, nh, seg)]
                        vs = [mkv.Segment(v[i:min(i + seg, nh)], kind="value", **kw)
                              for i in range(0, nh, seg)]
                        out, _ = mkv.attend_packed(q, ks, vs, k[nh:], v[nh:],
                                                   token_frac=tf)
                    e = float(np.linalg.norm(out - ref) / nref)
                    errs.setdefault(name, []).append(e)
                    per_layer.setdefault(name, {}).setdefault(layer, []).append(e)
    return errs, per_layer


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("captures", nargs="+")
    ap.add_argument("--segment", type=int, default=1024)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--channels", type=float, default=0.25)
    ap.add_argument("--tokens-frac", type=float, default=0.1)
    ap.add_argument("--per-layer", action="store_true")
    a = ap.parse_args()
    paths = sorted(p for c in a.captures for p in glob.glob(c))
    errs, per_layer = run(paths, a.segment, a.window, a.channels, a.tokens_frac)
    names = list(errs)
    if a.per_layer:
        print("layer " + " ".join(f"{n:>13}" for n in names))
        for layer in sorted(per_layer[names[0]]):
            print(f"{layer:5d} " + " ".join(f"{np.mean(per_layer[n][layer]):13.4f}" for n in names))
    print(f"{'method':>14} {'mean err':>9} {'median':>8} {'p90':>8}")
    for n in names:
        e = np.array(errs[n])
        print(f"{n:>14} {e.mean():9.4f} {np.median(e):8.4f} {np.percentile(e, 90):8.4f}")
    print("RESULT name=fidelity " + " ".join(
        f"err_{n}={np.mean(errs[n]):.4f}" for n in names))


if __name__ == "__main__":
    sys.exit(main())
