#!/usr/bin/env python3
"""A model of the positions' scatter in the staged attention kernel
(gpu/attn.cu st_sub, POS): how many shared-memory wavefronts a sub-block's
16-bit stores take with each row's values stored in ascending channel
order (today), and with a per-block store schedule (the same values, each
row's order chosen so that the 32 lanes of each store meet distinct
banks where a matching allows).  A planning tool: it times nothing and
builds nothing.

    bench/scatter_model.py [--blocks N] [--kc 6] [--dk 96] [--r 32]
                           [--source uniform|encoder] [--seed S]

Layout, as st_sub's: lane t < 16 stores K row t's values, lane 16 + t V
row t's, one value a lane a store instruction, into tiles of 16 rows of
LD = 16 KC + 8 halves (st_warp), the V tile right after the K tile; a
value at channel c of row t of the K tile is the 32-bit word
t LD / 2 + c / 2, bank word % 32.  A store instruction takes as many
wavefronts as the most distinct words one bank receives (lanes writing
the two halves of one word meet in that word).  Sources: `uniform` is
bench/attn's rows (gpu_synth_bitmaps: r of dk channels uniformly at
random); `encoder` is mosaickv's own per-vector top-r on low-rank
Gaussian K and V (a power-law spectrum, so the selection leans to the
leading rotated channels), the library loaded as python/mosaickv loads it.

The schedule: store step by store step, a maximum matching of the lanes
that have values left to the banks of those values (augmenting paths:
a lane's lowest free bank if it has one, else its banks in increasing
order; a bank's lowest value); a lane
left out stores the value whose bank is least loaded so far, so every
schedule keeps 32 store instructions for 32 values.  gpu_sched_block
(gpu/gpu.cuh, gpu_seg_schedule's) is this rule in C.  Not an
optimum (an edge colouring of the lanes × banks multigraph reaches the
most loaded bank's degree), a bound from above on what a format that
stores each block's values in scheduled order could give.

Its last line: RESULT name=scatter_model source=... asc_wf=<wavefronts a
sub-block, ascending> sched_wf=<scheduled> bound_wf=<the most stores one
bank receives: no schedule goes below it> asc_per_store=... ratio=<asc /
sched>.  tests/bench/test_scatter_model.py checks the counting and the
schedule on hand-made blocks.
"""
import argparse
import os
import sys


def words_of(pos_k, pos_v, kc):
    """Per lane (32), the word of each value in store order: @pos_k, @pos_v
    are 16 rows of channel lists (K then V rows)."""
    ld = 16 * kc + 8
    vbase = 16 * ld // 2
    out = []
    for kv, rows in ((0, pos_k), (1, pos_v)):
        for t, row in enumerate(rows):
            out.append([kv * vbase + t * ld // 2 + c // 2 for c in row])
    return out


def store_wavefronts(words):
    """Wavefronts of one store instruction: @words, each lane's word (None:
    the lane stores nothing)."""
    per_bank = {}
    for w in set(x for x in words if x is not None):
        per_bank[w % 32] = per_bank.get(w % 32, 0) + 1
    return max(per_bank.values()) if per_bank else 0


def ascending(lanes):
    """Wavefronts of the stores in each lane's given order, step i storing
    every lane's value i."""
    n = max(len(x) for x in lanes)
    return sum(store_wavefronts([x[i] if i < len(x) else None for x in lanes])
               for i in range(n))


def schedule(lanes):
    """(order, wavefronts): per lane, the indices of its values in the
    scheduled store order, and the wavefronts of those stores.  The rule of
    gpu_sched_block (gpu/gpu.cuh), step for step."""
    rem = [list(range(len(x))) for x in lanes]
    order = [[] for _ in lanes]
    total = 0
    while any(rem):
        # each lane's banks with a value left, and the lowest such value
        first = []
        for lane in range(len(lanes)):
            f = {}
            for i in rem[lane]:
                f.setdefault(lanes[lane][i] % 32, i)
            first.append(f)
        owner = {}  # bank -> lane

        def augment(lane, seen):
            free = [b for b in sorted(first[lane]) if b not in seen and b not in owner]
            if free:  # a free bank first: the path ends here
                seen.add(free[0])
                owner[free[0]] = lane
                return True
            for b in sorted(first[lane]):
                if b in seen:
                    continue
                seen.add(b)
                if augment(owner[b], seen):
                    owner[b] = lane
                    return True
            return False

        for lane in range(len(lanes)):
            if rem[lane]:
                augment(lane, set())
        pick = {lane: first[lane][b] for b, lane in owner.items()}
        load = {b: 1 for b in owner}
        for lane in range(len(lanes)):
            if rem[lane] and lane not in pick:
                b = min(first[lane], key=lambda c: (load.get(c, 0), first[lane][c]))
                pick[lane] = first[lane][b]
                load[b] = load.get(b, 0) + 1
        total += store_wavefronts([lanes[lane][pick[lane]] if lane in pick else None
                                   for lane in range(len(lanes))])
        for lane, i in pick.items():
            order[lane].append(i)
            rem[lane].remove(i)
    return order, total


def bound(lanes):
    """The most stores one bank receives: a schedule of one store a lane a
    step takes at least that many wavefronts."""
    cnt = {}
    for x in lanes:
        for w in x:
            cnt[w % 32] = cnt.get(w % 32, 0) + 1
    return max(cnt.values())


def uniform_rows(rng, n, dk, r):
    return [sorted(rng.sample(range(dk), r)) for _ in range(n)]


def encoder_rows(n_blocks, dk_want, r, seed):
    import numpy as np
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "python"))
    import mosaickv
    rng = np.random.default_rng(seed)
    d, n = 128, 16 * n_blocks
    out = []
    for kind in ("key", "value"):
        basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
        spec = (np.arange(d) + 1.0) ** -0.8
        x = (rng.standard_normal((n, d)) * spec) @ basis.T
        seg = mosaickv.Segment(x.astype(np.float32), kind=kind, r=r, drop=dk_want < d)
        rot = seg.decode(space="rotated")
        rows = [sorted(np.flatnonzero(row).tolist())[:r] for row in rot]
        out.append((rows, seg.view()["d_keep"]))
    return out


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--kc", type=int, default=6)
    ap.add_argument("--dk", type=int, default=96)
    ap.add_argument("--r", type=int, default=32)
    ap.add_argument("--source", choices=("uniform", "encoder"), default="uniform")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if a.r < 1 or a.dk < a.r or a.dk > 16 * a.kc or a.blocks < 1:
        sys.exit("scatter_model: need 1 <= r <= dk <= 16 kc and blocks >= 1")
    import random
    rng = random.Random(a.seed)
    if a.source == "uniform":
        krows = uniform_rows(rng, 16 * a.blocks, a.dk, a.r)
        vrows = uniform_rows(rng, 16 * a.blocks, a.dk, a.r)
        dk = a.dk
    else:
        (krows, dk), (vrows, _) = encoder_rows(a.blocks, a.dk, a.r, a.seed)
        if dk > 16 * a.kc:
            sys.exit(f"scatter_model: the encoder kept {dk} channels, over 16 kc")
    asc = sch = bnd = 0
    for b in range(a.blocks):
        lanes = words_of(krows[16 * b:16 * b + 16], vrows[16 * b:16 * b + 16], a.kc)
        asc += ascending(lanes)
        sch += schedule(lanes)[1]
        bnd += bound(lanes)
    n = a.blocks
    print(f"scatter_model: {n} blocks of 16 K and 16 V rows, r {a.r} of dk {dk}, "
          f"LD {16 * a.kc + 8} halves, source {a.source}")
    print(f"  wavefronts a sub-block: ascending {asc / n:.1f} ({asc / n / a.r:.2f} a store), "
          f"scheduled {sch / n:.1f}, bound {bnd / n:.1f}")
    print(f"RESULT name=scatter_model source={a.source} asc_wf={asc / n:.1f} "
          f"sched_wf={sch / n:.1f} bound_wf={bnd / n:.1f} asc_per_store={asc / n / a.r:.2f} "
          f"ratio={asc / sch:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
