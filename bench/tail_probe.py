#!/usr/bin/env python3
"""The PackedAttention step's tail on one clock: when the attention CTAs end,
when k_segrot's and k_merge's CTAs start, get past their programmatic-launch
wait and end.  A probe build, never the library's (a __device__ array and a
host-side dump in gpu/attn.cu, which the library keeps free of globals and
files).

    bench/tail_probe.py patch TREE   # TREE: a copy of the repository
    (build TREE's bench/attn, run it with --once 1: the first four
     PackedAttention steps of the process write /tmp/tl_<n>.bin: tl_0
     `ours` cold (the added first step), tl_1 `ours`, tl_2 ours_q6,
     tl_3 ours_pos)
    bench/tail_probe.py report /tmp/tl_1.bin [...]

`patch` edits TREE/gpu/attn.cu: thread 0 of every CTA of k_attn_packed_tc,
k_segrot and k_merge records %globaltimer (ns) at its entry and once past
its wait for the kernel before it, and lane 0 of each warp the latest
%globaltimer at its return (a destructor on the kernel's scope: every
return path); k_segrot's thread 0 four more (words 3-6, below).
launch_packed, after k_merge's launch, waits for the step, copies the
records to /tmp/tl_<n>.bin (16-byte header: slots, heads,
max_segs + 1, flags; then for each of the three kernels 8,192 records of
eight u64 in blockIdx.y-major order: entry, past the wait, end, then
k_segrot's inner stamps) and clears them.  It edits
TREE/bench/attn.c so that --once runs `ours` once more first.

`report` prints, per file, each kernel's CTAs (those that recorded an
entry): first entry, first and last past the wait, 90th percentile and last
end, in µs from the first attention CTA past its wait; k_segrot's CTAs with a
segment by their inner stamps (the note in, the first batch of states in,
the fold done, R_v's copy waited and the barrier passed: medians of each
step); then the chain after
the attention kernel's last CTA: k_segrot's first CTA past its wait, its
last end, k_merge's first past its wait and its last end.  Written in the
forty-first session (gpu/NOTES.md): where the ~8 µs that k_segrot adds at
1M tokens, batch 1, go.  The edits match gpu/attn.cu's text: if it moved,
`patch` stops with the piece it could not find.
"""
import statistics as st
import struct
import sys

import probe_edit

NREC = 8192
KERNELS = ("attention", "k_segrot", "k_merge")

HEAD = '#include "common.cuh"\n'
PROBE = HEAD + '''#include <stdio.h>
__device__ unsigned long long g_tl[3][8192][8];
__device__ __forceinline__ unsigned long long tl_now(void)
{
	unsigned long long t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}
struct tl_guard {
	unsigned long long *p;
	__device__ ~tl_guard()
	{
		if ((threadIdx.x & 31) == 0)
			atomicMax(&p[2], tl_now());
	}
};
#define TL_GUARD(k) tl_guard TLG{g_tl[k][blockIdx.y * gridDim.x + blockIdx.x]}
#define TL_STAMP(i)                                  \\
	do {                                         \\
		if (threadIdx.x == 0)                \\
			TLG.p[i] = tl_now();         \\
	} while (0)
'''
AOPEN = '''	pdl_begin();
	extern __shared__ __align__(16) unsigned char smraw[];
	tc_smem &sm = *(tc_smem *)smraw;
'''
AOPEN_P = '''	TL_GUARD(0);
	TL_STAMP(0);
	pdl_begin();
	TL_STAMP(1);
	extern __shared__ __align__(16) unsigned char smraw[];
	tc_smem &sm = *(tc_smem *)smraw;
'''
SOPEN = '''	uint32_t si = blockIdx.x, hi = blockIdx.y;
	pdl_trigger();
'''
SOPEN_P = '''	uint32_t si = blockIdx.x, hi = blockIdx.y;
	TL_GUARD(1);
	TL_STAMP(0);
	pdl_trigger();
'''
SWAIT = '''	pdl_wait();
	const uint32_t *note = SEGNOTE(ws, L, gridDim.y, hi, si);
'''
SWAIT_P = '''	pdl_wait();
	TL_STAMP(1);
	const uint32_t *note = SEGNOTE(ws, L, gridDim.y, hi, si);
'''
# inside k_segrot: the note in (the branch on it waited), the last of the
# first batch's states in (thread 0: its first head and channels), the
# fold done, R_v's copy waited and the barrier passed
SNOTE = '''	if (n == 0 || !sgp) {
		cta_copy_wait();
		return;
	}
'''
SNOTE_P = SNOTE + '''	TL_STAMP(3);
'''
SLOADS = '''					   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			}
			float mb = M;
'''
SLOADS_P = '''					   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			}
			if (it == 0 && !TLG.p[4]) {
				asm volatile("" ::"f"(ml[U - 1].y), "f"(pv[U - 1].w));
				TLG.p[4] = tl_now();
			}
			float mb = M;
'''
SFOLD = '''	cta_copy_wait();
	__syncthreads(); /* every slot read; R_v, orot, mh and lh complete */
'''
SFOLD_P = '''	TL_STAMP(5);
	cta_copy_wait();
	__syncthreads(); /* every slot read; R_v, orot, mh and lh complete */
	TL_STAMP(6);
'''
MOPEN = '''	pdl_begin();
	constexpr int NC = D / 4, G = MERGE_T / NC, NW = MERGE_T / 32;
'''
MOPEN_P = '''	TL_GUARD(2);
	TL_STAMP(0);
	pdl_begin();
	TL_STAMP(1);
	constexpr int NC = D / 4, G = MERGE_T / NC, NW = MERGE_T / 32;
'''
LAUNCH = '''		if (!(a->max_seg_blocks && a->max_seg_blocks <= cw && a->max_buf_blocks <= cw))
			GPU_CK(gpu_launch(pdl_of(a), k_segrot<NQ, D>,
					  dim3(a->max_segs + 1, a->n_heads), 128, 0, s, heads,
					  (char *)a->ws, L));
	}
	GPU_CK(gpu_launch(pdl_of(a), k_merge<D>, dim3(a->n_heads, NQ), MERGE_T, 0, s, (uint32_t)NQ,
			  (char *)a->ws, L, a->out, (uint32_t)!!(a->flags & GPU_ATTN_MERGE_ALL)));
'''
DUMP = LAUNCH + '''	{
		static int tln = 0;
		if (tln < 4) {
			GPU_CK(cudaStreamSynchronize(s));
			static unsigned long long h[3][8192][8];
			GPU_CK(cudaMemcpyFromSymbol(h, g_tl, sizeof(h)));
			char nm[64];
			snprintf(nm, sizeof nm, "/tmp/tl_%d.bin", tln++);
			FILE *f = fopen(nm, "wb");
			unsigned hdr[4] = {L.slots, a->n_heads, a->max_segs + 1, (unsigned)a->flags};
			fwrite(hdr, 4, 4, f);
			fwrite(h, sizeof(h), 1, f);
			fclose(f);
			static unsigned long long z[3][8192][8];
			GPU_CK(cudaMemcpyToSymbol(g_tl, z, sizeof(z)));
		}
	}
'''
BONCE = '''				RC(f_packed(&a, dheads, st));
				RC(f_quest(&a, ddense, st));
'''


def patch(tree):
    probe_edit.edit(f"{tree}/gpu/attn.cu", "tail_probe", [
        (HEAD, PROBE, "the include of common.cuh"),
        (AOPEN, AOPEN_P, "k_attn_packed_tc's opening"),
        (SOPEN, SOPEN_P, "k_segrot's opening"),
        (SWAIT, SWAIT_P, "k_segrot's wait"),
        (SNOTE, SNOTE_P, "k_segrot's note"),
        (SLOADS, SLOADS_P, "k_segrot's states"),
        (SFOLD, SFOLD_P, "k_segrot's barrier"),
        (MOPEN, MOPEN_P, "k_merge's opening"),
        (LAUNCH, DUMP, "launch_packed's last launches"),
    ])
    probe_edit.edit(f"{tree}/bench/attn.c", "tail_probe", [
        (BONCE, "\t\t\t\tRC(f_packed(&a, dheads, st));\n" + BONCE, "bench --once"),
    ])


def load(path):
    b = open(path, "rb").read()
    hdr = struct.unpack_from("<4I", b, 0)
    recs = []
    for k in range(3):
        rk = []
        for i in range(NREC):
            t = struct.unpack_from("<8Q", b, 16 + (k * NREC + i) * 64)
            if t[0]:
                rk.append(t)
        recs.append(rk)
    return hdr, recs


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summary(path):
    """Lines of the report for one dump; also returns the chain's figures."""
    hdr, recs = load(path)
    out = [f"{path}: slots {hdr[0]}, contexts {hdr[1]}, segment notes {hdr[2]}, "
           f"flags {hdr[3]:#x}"]
    if not recs[0]:
        return out + ["  no attention CTA recorded"], None
    t0 = min(r[1] for r in recs[0] if r[1])
    us = lambda t: (t - t0) / 1000.0  # noqa: E731
    fig = {}
    for name, rk in zip(KERNELS, recs):
        if not rk:
            out.append(f"  {name:9s}: no CTA")
            continue
        past = [r[1] for r in rk if r[1]]
        ends = [r[2] for r in rk if r[2]]
        f = {"n": len(rk), "entry": us(min(r[0] for r in rk)),
             "wait0": us(min(past)) if past else float("nan"),
             "wait1": us(max(past)) if past else float("nan"),
             "end90": us(pct(ends, 0.9)) if ends else float("nan"),
             "end": us(max(ends)) if ends else float("nan")}
        fig[name] = f
        out.append(f"  {name:9s}: {f['n']:5d} CTAs, first entry {f['entry']:8.2f}, past the "
                   f"wait {f['wait0']:8.2f} .. {f['wait1']:8.2f}, end p90 {f['end90']:8.2f}, "
                   f"last {f['end']:8.2f} us")
    # k_segrot's CTAs with a segment (every inner stamp): medians of the
    # steps between them
    full = [r for r in recs[1] if r[1] and all(r[3:7]) and r[2]]
    if full:
        med = lambda i, j: st.median((r[j] - r[i]) / 1000.0 for r in full)  # noqa: E731
        fig["steps"] = [med(1, 3), med(3, 4), med(4, 5), med(5, 6), med(6, 2)]
        out.append("  k_segrot, %d CTAs with a segment, medians: note %.2f, states %.2f, "
                   "fold %.2f, R_v's copy and the barrier %.2f, rotation and stores %.2f us"
                   % (len(full), *fig["steps"]))
    a = fig.get("attention")
    if a:
        chain = [f"attention's last end {a['end']:.2f}"]
        for name in ("k_segrot", "k_merge"):
            f = fig.get(name)
            if f:
                chain.append(f"{name} past its wait +{f['wait0'] - a['end']:.2f}, "
                             f"its last end +{f['end'] - a['end']:.2f}")
        out.append("  chain: " + "; ".join(chain) + " us")
    return out, fig


def main(argv):
    if len(argv) >= 3 and argv[1] == "patch":
        patch(argv[2])
    elif len(argv) >= 3 and argv[1] == "report":
        for p in argv[2:]:
            print("\n".join(summary(p)[0]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
