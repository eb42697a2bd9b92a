#!/usr/bin/env python3
"""Where PackedAttention's attention CTAs spend their time, one record a CTA:
a probe build, never the library's (a __device__ array and a host-side dump
in gpu/attn.cu, which the library keeps free of globals and files).

    bench/cta_probe.py patch TREE    # TREE: a copy of the repository
    (build TREE's bench/attn, run it with --once 1: each of the first six
     k_attn_packed_tc launches of the process writes /tmp/tr_<n>.bin)
    bench/cta_probe.py report /tmp/tr_1.bin [...]

`patch` edits TREE/gpu/attn.cu: each CTA of k_attn_packed_tc records, after
its programmatic-launch wait, %globaltimer, clock64 and %smid; when it has
work, its selected-block count and segment and the clock once its work is
known (packed_cta_work's end: the window's list built); in the staged
path (tc_cta_st), the latest of its warps' clocks once their first
sub-block's rows have arrived, and the earliest and latest of their loops'
ends; and, by a destructor on the kernel's scope (every return path), the
latest clock64 of its warps' ends.  After each of the first six launches
the host waits, copies the records to /tmp/tr_<n>.bin (16-byte header:
slots, heads, max_chunks, flags; then 64 bytes a CTA in blockIdx.y-major
order, eight u64: globaltimer, start, end, sm | blocks << 16 | segment <<
32, listed, first rows (latest warp), ~loop end (earliest warp), loop end
(latest warp)) and clears them.  It
edits TREE/bench/attn.c so that --once runs `ours` twice first (tr_0 is
the cold first launch, tr_1 the one to read; then ours_q6, ours_pos,
ours_s8, pos_s8).

`report` prints, per file: the SMs' busy spans (avg / max: the share a
perfect balance would keep), the CTAs' block counts, their times and a fit
time = a + b * blocks (a: the fixed cost of a CTA under the SM's load);
then, for the staged path's CTAs, where that time goes: the opening (to
the list), the first rows (to the last warp's first sub-block), the loop
(to the last warp's end, with its own fit), the warps' spread at the loop's
end (the CTA waiting for its slowest warp) and the tail (merge, partial);
then how many CTAs an SM held, and how many of them were in their loop,
over the kernel (`profile`), and the recorded times replayed in record
order and longest first (`replay`; records are in dispatch order, also
where the select ordered the CTAs: gpu/attn.cu lpt_order).

Used in the thirtieth session (gpu/NOTES.md): 1M tokens, batch 1, a CTA
cost 23,100 + 1,309 cycles a selected block and the windows' counts had a
standard deviation of 18.2 around 25.7.  The edits match gpu/attn.cu's
text: if it moved, `patch` stops with the piece it could not find.
"""
import statistics as st
import struct
import sys

import probe_edit

HEAD = '#include "common.cuh"\n'
PROBE = HEAD + '''#include <stdio.h>
__device__ unsigned long long g_tr[1 << 16][8];
struct tr_guard {
	unsigned long long *p;
	__device__ ~tr_guard()
	{
		if ((threadIdx.x & 31) == 0) {
			unsigned long long t = clock64();
			atomicMax(&p[2], t);
		}
	}
};
'''
KOPEN = '''{
	pdl_begin();
	extern __shared__ __align__(16) unsigned char smraw[];
	tc_smem &sm = *(tc_smem *)smraw;
	uint32_t hi, x;
'''
KSTAMP = '''{
	pdl_begin();
	tr_guard TG{g_tr[blockIdx.y * gridDim.x + blockIdx.x]};
	if (threadIdx.x == 0) {
		unsigned long long gt; unsigned smid;
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
		asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
		TG.p[0] = gt; TG.p[1] = clock64(); TG.p[3] = smid;
	}
	extern __shared__ __align__(16) unsigned char smraw[];
	tc_smem &sm = *(tc_smem *)smraw;
	uint32_t hi, x;
'''
KWORK = '''		return;
	const struct gpu_seg sg = *sgp;
	/* the chunk's state stays rotated (k_segrot rotates back), unless the'''
KWORK_P = '''		return;
	if (threadIdx.x == 0) {
		TG.p[3] |= (unsigned long long)cnt << 16 | (unsigned long long)si << 32;
		TG.p[4] = clock64();
	}
	const struct gpu_seg sg = *sgp;
	/* the chunk's state stays rotated (k_segrot rotates back), unless the'''
# tc_cta_st's loop: the first sub-block's rows in (per warp, the latest
# kept), and the loop's end (earliest as ~clock under atomicMax, latest)
KLOOP = '''		__syncwarp();
		st_sub<NQ, D, BF, KC, RB, POS, G>(sg, (int)min(16u, t1 - t), al16, W.s[cur], W,
						  sm.qb, st, pl, [&] { refill(0); });
'''
KLOOP_P = '''		__syncwarp();
		if (tr_first && lane == 0)
			atomicMax(&g_tr[blockIdx.y * gridDim.x + blockIdx.x][5], clock64());
		tr_first = false;
		st_sub<NQ, D, BF, KC, RB, POS, G>(sg, (int)min(16u, t1 - t), al16, W.s[cur], W,
						  sm.qb, st, pl, [&] { refill(0); });
'''
KLOOP0 = '''	constexpr bool ONE = st_nstages(RB) == 1;
	for (int cur = 0; i < cnt; cur ^= ONE ? 0 : 1) {
'''
KLOOP0_P = '''	constexpr bool ONE = st_nstages(RB) == 1;
	bool tr_first = true;
	for (int cur = 0; i < cnt; cur ^= ONE ? 0 : 1) {
'''
KEND = '''	/* ---- the warp's state into the reduction scratch ---- */
	float lsum[NU][2];
'''
KEND_P = '''	if (lane == 0) {
		unsigned long long *tp = g_tr[blockIdx.y * gridDim.x + blockIdx.x];
		unsigned long long tc = clock64();
		atomicMax(&tp[6], ~tc);
		atomicMax(&tp[7], tc);
	}
	/* ---- the warp's state into the reduction scratch ---- */
	float lsum[NU][2];
'''
LAUNCH = '''		GPU_CK(gpu_launch(pdl_of(a), attn, dim3(L.slots, a->n_heads), 128, smem, s, heads,
				  a->q, scale2_of(a), (char *)a->ws, L, a->flags));
'''
DUMP = LAUNCH + '''		{
			static int trn = 0;
			if (trn < 6) {
				GPU_CK(cudaStreamSynchronize(s));
				static unsigned long long h[1 << 16][8];
				GPU_CK(cudaMemcpyFromSymbol(h, g_tr, sizeof(h)));
				char nm[64];
				snprintf(nm, sizeof nm, "/tmp/tr_%d.bin", trn++);
				FILE *f = fopen(nm, "wb");
				unsigned hdr[4] = {L.slots, a->n_heads, L.max_chunks, (unsigned)a->flags};
				fwrite(hdr, 4, 4, f);
				fwrite(h, 64, (size_t)L.slots * a->n_heads, f);
				fclose(f);
				static unsigned long long z[1 << 16][8];
				GPU_CK(cudaMemcpyToSymbol(g_tr, z, sizeof(z)));
			}
		}
'''
BONCE = '''				}
				RC(f_packed(&a, dheads, st));
'''  # the end of --once 2's ours_g2, then ours


def patch(tree):
    probe_edit.edit(f"{tree}/gpu/attn.cu", "cta_probe", [
        (HEAD, PROBE, "the include of common.cuh"),
        (KOPEN, KSTAMP, "k_attn_packed_tc's opening"),
        (KWORK, KWORK_P, "the end of packed_cta_work's call"),
        (KLOOP0, KLOOP0_P, "tc_cta_st's loop"),
        (KLOOP, KLOOP_P, "tc_cta_st's sub-block call"),
        (KEND, KEND_P, "tc_cta_st's reduction"),
        (LAUNCH, DUMP, "the attention kernel's launch"),
    ])
    probe_edit.edit(f"{tree}/bench/attn.c", "cta_probe", [
        (BONCE, BONCE + "\t\t\t\tRC(f_packed(&a, dheads, st));\n", "bench --once"),
    ])


def fit(xs, ys):
    """Least squares y = a + b x: (a, b, residual sd), or None."""
    mx, my = st.mean(xs), st.mean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - slope * mx
    return a, slope, st.pstdev([y - (a + slope * x) for x, y in zip(xs, ys)])


MASK64 = (1 << 64) - 1


def records(b):
    """The dump's CTAs in record (dispatch) order: (sm, blocks, start, end,
    listed, first rows, ~earliest loop end, latest loop end), clocks of the
    CTA's SM."""
    slots, nh = struct.unpack("2I", b[:8])
    out = []
    for i in range(slots * nh):
        _, c0, c1, m, cl, cf, cmn, cmx = struct.unpack("8Q", b[16 + 64 * i:80 + 64 * i])
        out.append((m & 0xFFFF, (m >> 16) & 0xFFFF, c0, c1, cl, cf, cmn, cmx))
    return out


def summary(b):
    """The figures `report` prints, from a dump's bytes: a dict."""
    slots, nh, maxc, flags = struct.unpack("4I", b[:16])
    per_sm, rows, phases = {}, [], []
    for sm, cnt, c0, c1, cl, cf, cmn, cmx in records(b):
        rows.append((cnt, c1 - c0 if c1 >= c0 else 0))
        per_sm.setdefault(sm, []).append((c0, c1))
        if cnt and cl and cf and cmn and cmx:  # a staged CTA with every stamp
            lo = ~cmn & MASK64
            phases.append((cnt, cl - c0, cf - c0, lo - c0, cmx - c0, c1 - c0))
    spans = [max(e for _, e in v) - min(s for s, _ in v) for v in per_sm.values()]
    r = {"slots": slots, "heads": nh, "max_chunks": maxc, "flags": flags,
         "sms": len(per_sm), "span_avg": st.mean(spans), "span_max": max(spans),
         "span_min": min(spans), "balance": st.mean(spans) / max(spans)}
    work = [w for w in rows if w[0] > 0]
    rest = [w[1] for w in rows if w[0] == 0]
    r["idle"] = len(rest)
    r["idle_mean"] = st.mean(rest) if rest else 0.0
    r["work"] = len(work)
    if len(work) < 2:
        return r
    xs, ys = [w[0] for w in work], [w[1] for w in work]
    r.update(blocks_mean=st.mean(xs), blocks_sd=st.pstdev(xs), blocks_max=max(xs),
             cycles_mean=st.mean(ys), cycles_max=max(ys))
    f = fit(xs, ys)
    if f:
        r["fixed"], r["per_block"], r["resid_sd"] = f
    if len(phases) >= 2:
        # means, cycles from the CTA's start: listed, first rows, the loop
        # (first rows to the latest warp's end), the warps' spread at the
        # loop's end, the tail (latest loop end to the CTA's end)
        r["staged"] = len(phases)
        r["t_list"] = st.mean(p[1] for p in phases)
        r["t_first"] = st.mean(p[2] - p[1] for p in phases)
        r["t_loop"] = st.mean(p[4] - p[2] for p in phases)
        r["t_spread"] = st.mean(p[4] - p[3] for p in phases)
        r["t_tail"] = st.mean(p[5] - p[4] for p in phases)
        f = fit([p[0] for p in phases], [p[4] - p[2] for p in phases])
        if f:
            r["loop_fixed"], r["loop_per_block"], _ = f
    return r


def profile(b, nb=20):
    """Mean CTAs resident, and mean CTAs in their loop (first rows to the
    latest warp's loop end), per SM over nb equal parts of the longest SM
    span, each SM's time from its first CTA's start: [(resident, loop)]."""
    per = {}
    for r in records(b):
        per.setdefault(r[0], []).append(r)
    span = max(max(r[3] for r in v) - min(r[2] for r in v) for v in per.values())
    w = span / nb
    acc = [[0.0, 0.0] for _ in range(nb)]
    for v in per.values():
        o = min(r[2] for r in v)
        for sm, cnt, c0, c1, _, cf, _, cmx in v:
            ivs = [(0, c0, c1)]
            if cnt and cf and cmx > cf:
                ivs.append((1, cf, cmx))
            for k, a, e in ivs:
                for j in range(nb):
                    lo, hi = o + w * j, o + w * (j + 1)
                    acc[j][k] += max(0.0, min(hi, e) - max(lo, a))
    n = len(per)
    return [(x / w / n, y / w / n) for x, y in acc]


def replay(b, slots=None):
    """The recorded CTA times dispatched again onto `slots` CTA slots (by
    default the SMs times the most CTAs an SM held at once), each to the
    first slot free: the makespan in record order, in decreasing-time order
    (longest first), and the bound sum / slots.  Times stay as recorded,
    under the load they ran with: a first-order estimate of what an order
    buys, not a prediction."""
    import heapq
    rs = records(b)
    if slots is None:
        per, most = {}, 0
        for r in rs:
            per.setdefault(r[0], []).append((r[2], r[3]))
        for v in per.values():
            ev = sorted([(a, 1) for a, _ in v] + [(e, -1) for _, e in v], key=lambda x: (x[0], x[1]))
            c = 0
            for _, d in ev:
                c += d
                most = max(most, c)
        slots = len(per) * most

    def run(ds):
        h = [0] * slots
        end = 0
        for d in ds:
            t = heapq.heappop(h) + d
            end = max(end, t)
            heapq.heappush(h, t)
        return end
    ds = [max(0, r[3] - r[2]) for r in rs]
    return {"slots": slots, "record_order": run(ds), "longest_first": run(sorted(ds, reverse=True)),
            "bound": sum(ds) / slots}


def report(fn):
    b = open(fn, "rb").read()
    r = summary(b)
    print(f"{fn}: {r['slots']} slots x {r['heads']} heads (max_chunks {r['max_chunks']}, "
          f"flags {r['flags']:#x}), {r['sms']} SMs")
    print(f"  SM busy span, cycles: avg {r['span_avg']:.0f} max {r['span_max']} "
          f"min {r['span_min']}  avg/max {r['balance']:.3f}")
    if "blocks_mean" in r:
        print(f"  CTAs with work {r['work']}: blocks mean {r['blocks_mean']:.1f} "
              f"sd {r['blocks_sd']:.1f} max {r['blocks_max']}; cycles mean "
              f"{r['cycles_mean']:.0f} max {r['cycles_max']}")
    if "fixed" in r:
        print(f"  cycles = {r['fixed']:.0f} + {r['per_block']:.0f} * blocks "
              f"(residual sd {r['resid_sd']:.0f})")
    if r["idle"]:
        print(f"  CTAs without work {r['idle']}: cycles mean {r['idle_mean']:.0f}")
    if "staged" in r:
        print(f"  staged CTAs {r['staged']}, mean cycles: list {r['t_list']:.0f}, "
              f"first rows +{r['t_first']:.0f}, loop +{r['t_loop']:.0f} (of which the "
              f"warps' spread {r['t_spread']:.0f}), tail +{r['t_tail']:.0f}")
    if "loop_fixed" in r:
        print(f"  loop cycles = {r['loop_fixed']:.0f} + {r['loop_per_block']:.0f} * blocks")
    p = profile(b)
    print("  CTAs an SM, resident / in their loop, by twentieths of the longest span: " +
          " ".join(f"{x:.1f}/{y:.1f}" for x, y in p))
    q = replay(b)
    print(f"  replayed on {q['slots']} slots: record order {q['record_order']:.0f}, longest "
          f"first {q['longest_first']:.0f}, bound {q['bound']:.0f} cycles")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("patch", "report"):
        sys.exit(__doc__)
    if sys.argv[1] == "patch":
        patch(sys.argv[2])
    else:
        for f in sys.argv[2:]:
            report(f)
