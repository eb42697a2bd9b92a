"""The ctypes binding against numpy references; run by meson test.

Skips (exit 77) when numpy is missing, fails on any mismatch."""
import os
import sys

try:
    import numpy as np
except ImportError:
    print("numpy not installed: skipping")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import mosaickv as mkv  # noqa: E402


def softmax_attention(q, k, v):
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) / np.sqrt(q.shape[1])
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=1, keepdims=True)
    return p @ v.astype(np.float64)


def main():
    rng = np.random.default_rng()
    failures = 0

    def check(cond, what):
        nonlocal failures
        if not cond:
            failures += 1
            print("FAIL:", what)

    for d in (64, 128):
        k = rng.standard_normal((700, d)).astype(np.float32)
        v = rng.standard_normal((700, d)).astype(np.float32)
        q = rng.standard_normal((3, d)).astype(np.float32)
        ref = softmax_attention(q, k, v)
        out = mkv.attend_dense(q, k, v)
        check(np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5, f"dense d={d}")
        # r = d, f32 storage, every block: PackedAttention is exact.
        ks = [mkv.Segment(k[:400], kind="key", r=d, store="f32"),
              mkv.Segment(k[400:650], kind="key", r=d, store="f32")]
        vs = [mkv.Segment(v[:400], kind="value", r=d, store="f32"),
              mkv.Segment(v[400:650], kind="value", r=d, store="f32")]
        out, st = mkv.attend_packed(q, ks, vs, k[650:], v[650:], token_frac=1.0)
        check(np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5, f"packed exact d={d}")
        check(st["tokens_attended"] == 700, f"packed attended all d={d}")
        # Decoding in rotated space keeps exactly r elements per vector,
        # the largest of X' = X Rᵀ computed here.
        s = mkv.Segment(k, kind="key", r=d // 4, store="f32")
        view = s.view()
        xr = s.decode("rotated")
        check(((xr != 0).sum(axis=1) == d // 4).all(), f"r kept d={d}")
        R = np.empty((view["d_keep"], d), dtype=np.float32)
        mkv._L.mkv_segment_rotation(s.handle, R.ctypes.data)
        full = k.astype(np.float64) @ R.T.astype(np.float64)
        top = np.argsort(-np.abs(full), axis=1)[:, : d // 4]
        mask = np.zeros_like(full, dtype=bool)
        np.put_along_axis(mask, top, True, axis=1)
        check(((xr != 0) == mask).mean() > 0.999, f"top-r set d={d}")
    # The sequence API through a store: with r = d and every block,
    # attention over prefill + appended tokens equals the reference.
    from mosaickv.seq import Sequence, Store
    st = Store(gpu=-1, hbm_bytes=4 << 20, host_bytes=64 << 20)
    H, G, d, n0 = 2, 3, 64, 300
    seq = Sequence(st, 77, layers=2, kv_heads=H, q_per_kv=G, d=d, r=d,
                   token_frac=1.0, store_dtype="f32", value_bits=0, prefill_segment=128,
                   min_segment=16, max_segment=32, window=8)
    k = rng.standard_normal((2, H, n0 + 40, d)).astype(np.float32)
    v = rng.standard_normal((2, H, n0 + 40, d)).astype(np.float32)
    for layer in range(2):
        seq.prefill(layer, k[layer, :, :n0], v[layer, :, :n0])
    worst = 0.0
    for t in range(n0, n0 + 40):
        for layer in range(2):
            seq.append(layer, k[layer, :, t], v[layer, :, t])
            q = rng.standard_normal((H * G, d)).astype(np.float32)
            out = seq.attend(layer, q)
            ref = np.concatenate([softmax_attention(q[h * G:(h + 1) * G],
                                                    k[layer, h, :t + 1], v[layer, h, :t + 1])
                                  for h in range(H)])
            worst = max(worst, np.linalg.norm(out - ref) / np.linalg.norm(ref))
    seq.sync()
    stats = seq.stats()
    check(worst < 1e-5, f"sequence exact (worst {worst:.3g})")
    check(stats["tokens"] == n0 + 40, "sequence token count")
    check(stats["swaps"] > 0, "sequence swapped")
    seq.close()
    st.close()
    # Two-stage selection (refine): with refine = 1 / token_frac every
    # block is a candidate, so the attended blocks are the sink and the
    # blocks of most softmax mass (summed over the group) up to the budget;
    # lossless keys (r = d, f32) make that computable here exactly.
    st = Store(gpu=-1, hbm_bytes=4 << 20, host_bytes=64 << 20)
    H, G, d, n0, w, frac = 2, 3, 64, 300, 8, 0.2
    seq = Sequence(st, 79, layers=1, kv_heads=H, q_per_kv=G, d=d, r=d, token_frac=frac,
                   refine=1 / frac, store_dtype="f32", value_bits=0, prefill_segment=128,
                   min_segment=16, window=w)
    k = rng.standard_normal((H, n0, d)).astype(np.float32)
    v = rng.standard_normal((H, n0, d)).astype(np.float32)
    seq.prefill(0, k, v)
    seq.sync()
    q = 2 * rng.standard_normal((H * G, d)).astype(np.float32)
    out = seq.attend(0, q)
    hist = n0 - w
    budget = int(np.ceil(frac * hist))
    worst = 0.0
    for h in range(H):
        qh = q[h * G:(h + 1) * G].astype(np.float64)
        s_ = qh @ k[h, :hist].T.astype(np.float64) / np.sqrt(d)
        p_ = np.exp(s_ - s_.max(1, keepdims=True))
        p_ /= p_.sum(1, keepdims=True)
        nb = (hist + 15) // 16
        mass = np.array([p_[:, 16 * j:16 * j + 16].sum() for j in range(nb)])
        keep, taken = [0], min(16, hist)
        for j in sorted(range(1, nb), key=lambda j: (-mass[j], j)):
            if taken >= budget:
                break
            keep.append(j)
            taken += min(16, hist - 16 * j)
        toks = np.concatenate([np.arange(16 * j, min(16 * j + 16, hist)) for j in sorted(keep)]
                              + [np.arange(hist, n0)])
        ref = softmax_attention(q[h * G:(h + 1) * G], k[h, toks], v[h, toks])
        worst = max(worst, np.linalg.norm(out[h * G:(h + 1) * G] - ref) / np.linalg.norm(ref))
    check(worst < 1e-5, f"refine: the top-mass blocks attended (worst {worst:.3g})")
    # the same on two threads (attend_threads), and with device_positions
    # (version 5 of the options; on the CPU path it changes nothing): the
    # very same floats
    same = dict(layers=1, kv_heads=H, q_per_kv=G, d=d, r=d, token_frac=frac,
                refine=1 / frac, store_dtype="f32", value_bits=0, prefill_segment=128,
                min_segment=16, window=w)
    for sid, extra in ((81, dict(attend_threads=2)), (82, dict(device_positions=True))):
        seq2 = Sequence(st, sid, **same, **extra)
        seq2.prefill(0, k, v)
        seq2.sync()
        check(np.array_equal(seq2.attend(0, q), out), f"{extra}: the same output")
        seq2.close()
    seq.close()
    for sid, bad in ((80, dict(refine=0.5)), (83, dict(device_positions=2)),
                     (84, dict(summary_bits=12))):
        try:
            Sequence(st, sid, layers=1, kv_heads=H, q_per_kv=G, d=d, **bad)
            check(False, f"{bad} accepted")
        except mkv.MosaicError as e:
            check(e.errno == 22, f"{bad} gives EINVAL")
    st.close()
    # Offload and prefetch at the default compression: the offloaded
    # layer attends to the same output from pinned host memory, and the
    # prefetched selection is read from the top tier again.
    st = Store(gpu=-1, hbm_bytes=16 << 20, host_bytes=64 << 20)
    seq = Sequence(st, 78, layers=2, kv_heads=H, q_per_kv=G, d=d, prefill_segment=256)
    n1 = 1024
    k = rng.standard_normal((2, H, n1, d)).astype(np.float32)
    v = rng.standard_normal((2, H, n1, d)).astype(np.float32)
    for layer in range(2):
        seq.prefill(layer, k[layer], v[layer])
    seq.sync()
    q = rng.standard_normal((H * G, d)).astype(np.float32)
    before = seq.attend(0, q)
    moved = seq.offload(0)
    seq.sync()
    after = seq.attend(0, q)
    s1 = seq.stats()
    check(moved > 0 and s1["offload_moves"] == moved and s1["offload_failed"] == 0,
          f"offload moved {moved} segments")
    check(np.array_equal(before, after) and s1["fetch_bytes_last"] > 0,
          "offloaded layer: same output, blocks fetched from the host tier")
    asked = seq.prefetch(0)
    seq.sync()
    again = seq.attend(0, q)
    s2 = seq.stats()
    check(asked > 0 and s2["prefetch_blocks"] == asked and s2["prefetch_failed"] == 0,
          f"prefetch asked for {asked} blocks")
    check(np.array_equal(before, again) and s2["fetch_bytes_last"] < s1["fetch_bytes_last"],
          f"prefetched: same output, {s2['fetch_bytes_last']} bytes from below "
          f"(before {s1['fetch_bytes_last']})")
    seq.close()
    st.close()
    try:
        mkv.Segment(np.full((10, 64), np.nan, dtype=np.float32))
        check(False, "NaN accepted")
    except mkv.MosaicError as e:
        check("NaN" in str(e), "NaN error text")
    try:
        mkv.Segment(np.zeros((10, 64), dtype=np.float32), r=0)
        check(False, "r=0 accepted")
    except mkv.MosaicError as e:
        check(e.errno == 22, "r=0 gives EINVAL")
    print(f"{'ok' if not failures else 'FAILED'}: python binding ({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
