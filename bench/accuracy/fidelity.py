"""Attention-level fidelity of mosaickv on captured real Q/K/V.

For every layer and KV head of each capture: the history (all but the last
--window tokens) is encoded in --segment-token segments, the window stays
dense, and the last position's queries (the KV head's GQA group) attend.
Reports, per method and per layer and over everything:
  err     the output relative error against exact attention,
          ||o - o_exact|| / ||o_exact|| over the group's query heads;
  recall  attention-mass recall: the fraction of the exact softmax mass
          (over all tokens) that falls on the tokens the method attends
          (its selected history blocks, the sink block among them, plus the
          window), averaged over the group's query heads.  Packed methods'
          selections come from the library (mkv_select_blocks, the selection
          mkv_attend_packed makes); Quest's is recomputed here and checked
          against mkv_attend_quest's output.
"""
import argparse
import ctypes as C
import glob
import math
import sys

import numpy as np

import mosaickv as mkv
from mosaickv import _lib

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
from budget import budget_r  # noqa: E402

_L = mkv._L


class BlockRef(C.Structure):
    _fields_ = [("seg", C.c_uint32), ("block", C.c_uint32)]


_L.mkv_select_blocks.restype = C.c_int64
_L.mkv_select_blocks.argtypes = [C.POINTER(_lib.AttnOpts), C.c_void_p, C.c_void_p,
                                 C.c_size_t, C.POINTER(BlockRef), C.c_size_t]


def select_packed(q, ksegs, frac):
    """Token mask over the history of the blocks mkv_attend_packed selects."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    o = _lib.AttnOpts()
    mkv._check(_L.mkv_attn_opts_init(C.byref(o), C.sizeof(o)), "opts")
    o.n_q, o.d, o.token_frac, o.quest_b = q.shape[0], q.shape[1], frac, 16
    KA = (C.c_void_p * len(ksegs))(*[sg.handle for sg in ksegs])
    cap = sum(math.ceil(sg.n / sg.view()["b"]) for sg in ksegs)
    sel = (BlockRef * cap)()
    n = mkv._check(_L.mkv_select_blocks(C.byref(o), q.ctypes.data, KA, len(ksegs), sel, cap),
                   "select")
    starts = np.cumsum([0] + [sg.n for sg in ksegs])
    mask = np.zeros(starts[-1], dtype=bool)
    for ref in sel[:n]:
        b = ksegs[ref.seg].view()["b"]
        a = starts[ref.seg] + ref.block * b
        mask[a:min(a + b, starts[ref.seg + 1])] = True
    return mask


def select_quest(q, k, frac, b=16):
    """Quest's selection over dense keys k (the rule of mkv_attend_quest):
    the sink block, then blocks by their min/max bound (max over the query
    heads) until ceil(frac * n) tokens."""
    n = k.shape[0]
    nb = (n + b - 1) // b
    pad = np.concatenate([k, np.repeat(k[-1:], nb * b - n, axis=0)]).reshape(nb, b, -1)
    mn, mx = pad.min(1), pad.max(1)
    score = np.maximum(q[:, None, :] * mn[None], q[:, None, :] * mx[None]).sum(-1).max(0)
    budget = n if frac >= 1 else math.ceil(frac * n)
    mask = np.zeros(n, dtype=bool)
    mask[:b] = True
    taken = min(b, n)
    for j in sorted(range(1, nb), key=lambda j: (-score[j], j)):
        if taken >= budget:
            break
        mask[j * b:(j + 1) * b] = True
        taken += min(b, n - j * b)
    return mask


def exact_probs(q, k):
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) / math.sqrt(q.shape[1])
    s -= s.max(1, keepdims=True)
    p = np.exp(s)
    return p / p.sum(1, keepdims=True)


def methods(d, chan, frac, g=1):
    # --g: every packed method selects whole groups of g adjacent rotated
    # channels by group energy (the GPU's g = 2 fast path); r must be a
    # multiple of g, so it is rounded down to one (at d = 64, 25 %: 16 and
    # 40 already are)
    r = max(g, int(round(d * chan)) // g * g)
    rq = max(g, budget_r(d, chan) // g * g)
    return {k: (dict(kw, g=g) if kw is not None else None, tf)
            for k, (kw, tf) in _methods(d, r, rq, frac).items()}


def _methods(d, r, rq, frac):
    return {
        # name: (segment kwargs or None for Quest, token_frac)
        # the library's defaults: 6-bit rows at the same bytes, S = min(r, d/4)
        # with the remainder term, no drop
        "mosaickv_q6": (dict(r=rq, drop=False, rotate=True, select="per_vector",
                             value_bits=6, summary_channels=min(rq, d // 4)), frac),
        "mosaickv_q6_channels_only": (dict(r=rq, drop=False, rotate=True,
                                           select="per_vector", value_bits=6,
                                           summary_channels=min(rq, d // 4)), 1.0),
        "mosaickv": (dict(r=r, drop=True, rotate=True, select="per_vector"), frac),
        "mosaickv_nodrop": (dict(r=r, drop=False, rotate=True, select="per_vector"), frac),
        "uniform": (dict(r=r, drop=False, rotate=False, select="per_vector"), frac),
        "globalmask": (dict(r=r, drop=True, rotate=True, select="global"), frac),
        "quest": (None, frac),
        "channels_only": (dict(r=r, drop=True, rotate=True, select="per_vector"), 1.0),
    }


def run(paths, seg, window, chan, frac, layers=None, g=1):
    errs, rec = {}, {}
    per_layer, per_layer_rec = {}, {}
    quest_check = 0.0
    for path in paths:
        z = np.load(path)
        q_all, k_all, v_all = z["q"], z["k"], z["v"]
        L, hq, d = q_all.shape
        hkv, n = k_all.shape[1], k_all.shape[2]
        grp = hq // hkv
        nh = n - window
        for layer in (layers if layers is not None else range(L)):
            for h in range(hkv):
                q = q_all[layer, h * grp:(h + 1) * grp]
                k, v = k_all[layer, h], v_all[layer, h]
                ref = mkv.attend_dense(q, k, v)
                nref = np.linalg.norm(ref)
                p = exact_probs(q, k)
                for name, (kw, tf) in methods(d, chan, frac, g).items():
                    if kw is None:
                        out, _ = mkv.attend_quest(q, k[:nh], v[:nh], k[nh:], v[nh:],
                                                  token_frac=tf)
                        sel = select_quest(q, k[:nh], tf)
                        # The recomputed selection must be Quest's: exact
                        # attention over it reproduces attend_quest.
                        m = np.concatenate([sel, np.ones(n - nh, dtype=bool)])
                        chk = mkv.attend_dense(q, k[m], v[m])
                        quest_check = max(quest_check,
                                          float(np.abs(chk - out).max() / np.abs(out).max()))
                    else:
                        ks = [mkv.Segment(k[i:min(i + seg, nh)], kind="key", **kw)
                              for i in range(0, nh, seg)]
                        vkw = dict(kw, summary_channels=0)  # keys only
                        vs = [mkv.Segment(v[i:min(i + seg, nh)], kind="value", **vkw)
                              for i in range(0, nh, seg)]
                        out, _ = mkv.attend_packed(q, ks, vs, k[nh:], v[nh:],
                                                   token_frac=tf)
                        sel = select_packed(q, ks, tf)
                    e = float(np.linalg.norm(out - ref) / nref)
                    r = float((p[:, :nh][:, sel].sum(1) + p[:, nh:].sum(1)).mean())
                    errs.setdefault(name, []).append(e)
                    rec.setdefault(name, []).append(r)
                    per_layer.setdefault(name, {}).setdefault(layer, []).append(e)
                    per_layer_rec.setdefault(name, {}).setdefault(layer, []).append(r)
    return errs, per_layer, rec, per_layer_rec, quest_check


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("captures", nargs="+")
    ap.add_argument("--segment", type=int, default=1024)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--channels", type=float, default=0.25)
    ap.add_argument("--tokens-frac", type=float, default=0.1)
    ap.add_argument("--per-layer", action="store_true")
    ap.add_argument("--layers", help="comma-separated subset of layers (default all)")
    ap.add_argument("--g", type=int, default=1,
                    help="element-group size of the packed methods (1, 2, 4, 8)")
    a = ap.parse_args()
    paths = sorted(p for c in a.captures for p in glob.glob(c))
    errs, per_layer, rec, per_layer_rec, qchk = run(paths, a.segment, a.window,
                                                    a.channels, a.tokens_frac,
                                                    [int(x) for x in a.layers.split(",")]
                                                    if a.layers else None, a.g)
    names = list(errs)
    if a.per_layer:
        print("per layer, mean over KV heads and captures: output relative error / "
              "attention-mass recall")
        print("| layer | " + " | ".join(names) + " |")
        print("| --- |" + " --- |" * len(names))
        for layer in sorted(per_layer[names[0]]):
            print(f"| {layer} | " + " | ".join(
                f"{np.mean(per_layer[n][layer]):.3f} / {np.mean(per_layer_rec[n][layer]):.3f}"
                for n in names) + " |")
    print(f"{'method':>14} {'mean err':>9} {'median':>8} {'p90':>8} {'recall':>8} "
          f"{'median':>8} {'p10':>8}")
    for n in names:
        e, r = np.array(errs[n]), np.array(rec[n])
        print(f"{n:>14} {e.mean():9.4f} {np.median(e):8.4f} {np.percentile(e, 90):8.4f} "
              f"{r.mean():8.4f} {np.median(r):8.4f} {np.percentile(r, 10):8.4f}")
    print(f"Quest selection recomputed here vs mkv_attend_quest: max relative output "
          f"difference {qchk:.1e}")
    print("RESULT name=fidelity " + " ".join(
        f"err_{n}={np.mean(errs[n]):.4f}" for n in names) + " " + " ".join(
        f"recall_{n}={np.mean(rec[n]):.4f}" for n in names))


if __name__ == "__main__":
    sys.exit(main())
