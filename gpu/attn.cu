/* SPDX-License-Identifier: MIT */
/*
 * Decode attention on the GPU: block scoring and selection, PackedAttention,
 * and the dense flash-decoding and Quest baselines.  CPU references:
 * mkv_score_blocks, mkv_select_blocks, mkv_attend_packed, mkv_attend_dense,
 * mkv_attend_quest (mosaickv/attention.c).
 *
 * One step over H contexts (sequence × KV head) is six or seven launches
 * (select is one launch, or two for few long contexts):
 *   qrot    q'_seg = R_k,seg q for every segment (R_k read once per step),
 *           and per query head qperp = sqrt(max(0, |q|² − |q'_{0..S-1}|²));
 *           also q' split by sign and the score tiles' descriptors;
 *   score   one thread per block, tiles of 256 blocks staged in shared
 *           memory one ahead: Σ_c max(q'_c min_c, q'_c max_c) over the
 *           first S channels plus qperp · rest (the block's remainder
 *           bound), max over the group's query heads — the CPU's operation
 *           order and rounded products, so equal q' give equal scores;
 *   select  one CTA per context: weighted radix select (3 passes of 11/11/10
 *           bits over L2-resident scores, weights = tokens per block) for the
 *           cut-off key, ties to the lower block index, then an ordered
 *           compaction and the chunk list (selected blocks of one segment in
 *           one aligned window of 256 or 512 blocks: chunk_lg);
 *   attn    one CTA per chunk (+ buffer chunks + window tiles): warps take
 *           blocks, split-K with online softmax in exp2 domain, values
 *           accumulated in the segment's rotated V space and CTA-merged
 *           (tensor cores: the partial stays rotated; CUDA cores: rotated
 *           back here, o = o' R_v);
 *   segrot  (tensor cores) per segment: its chunks' partials combined and
 *           rotated back once;
 *   merge   flash-decoding merge of all partials.
 */
#include <math.h>
#include <string.h>
#include <cuda_fp16.h>
#include "common.cuh"
#include "expand.cuh"

/* ------------------------------------------------------------------ */
/* Scratch layout (per context, offsets in bytes, 256-aligned).        */

#define WIN_TILE 256   /* window tokens per CTA */
#define HIST_HI 2048   /* bins of key bits 31..21 */
#define HIST_LO 65536  /* bins of key bits 31..16 */
/* After the histograms, per context: the many-CTA select's state (tickets,
 * candidate count, cut-off, per-CTA counts and offsets); cleared with them. */
#define SELX_WORDS 256
#define HIST_WORDS (HIST_HI + HIST_LO + SELX_WORDS)
/* The score kernel's fine bins a CTA at a time (hist_add_ht): a table of
 * HT_SLOTS, bin b first tried at slot b % HT_SLOTS (a context's scores
 * crowd into a few hundred consecutive fine bins: they meet no
 * collision), HT_PROBES slots tried before the global histograms take the
 * weight directly. */
#define HT_SLOTS (HIST_HI / 2)
#define HT_PROBES 8
#define DENSE_T 1024   /* dense-kernel tokens per CTA */
#define NQP(nq) ((nq) == 3 ? 4 : (nq))
/* Rows of one segment's rotated query in the scratch: q'[c][P] for
 * c < dk, then row GPU_MAX_D holds qperp[h] (the remainder's norm). */
#define QR_ROWS (GPU_MAX_D + 1)
/* The score's query split by sign, per segment: row c holds q'⁺ (P floats)
 * then q'⁻ (P floats). */
#define QPM_FLOATS(P) (GPU_MAX_D * 2 * (P))
#define SCORE_T 256    /* score kernel: blocks per tile (a thread each) */
#define SCORE_SMAX 32  /* summary channels a tile stages in shared memory */

/* A score tile: SCORE_T consecutive blocks of a context, described by qrot
 * for the segment holding its first block (rows past that segment's end
 * are scored from global memory). */
struct score_tile {
	union { /* the segment's summaries at row j0: bf16, or 8-bit rows (q8) */
		const uint16_t *mn;
		const uint4 *r8;
	};
	union { /* bf16 maxima, or the 8-bit rows' scales (q8) */
		const uint16_t *mx;
		const float *sc8;
	};
	const uint16_t *rest;    /* remainder bounds at row j0, or NULL */
	uint32_t si, j0, nrow, S; /* segment, first row, rows in it, channels */
	uint32_t b, n, staged, q8; /* staged: summaries copied by cp.async;
				    * q8: scored in integers (seg_q8) */
	uint32_t pad2_[2];
};

struct ws_layout {
	size_t qr, qpm, tiles, scores, ntok, sel, selseg, selkey, chunk, wdesc, counts, part_o,
		part_ml, g32, order;
	size_t per_head;
	size_t base; /* per-head regions start here; histograms and segment notes before */
	uint32_t max_chunks, buf_chunks, win_tiles, slots;
	uint32_t max_segs; /* segment notes per context: max_segs + 1 */
	uint32_t cwl;      /* blocks per work chunk: 1 << cwl (chunk_lg) */
	uint32_t cut_only; /* select: leave the cut for the attention kernel,
			    * no list (set by the launch, not by ws_plan) */
	uint32_t pl;       /* slots a window, log2 (parts_lg; 0 but where the
			    * select leaves the cut: packed and Quest) */
	uint32_t lpt;      /* nonzero: the count pass writes g32 and the
			    * select the attention CTAs' order (lpt_order;
			    * set by the launch); bit 1: with idle marks;
			    * bit 2: the count's tail in its serial order */
	uint32_t pb;       /* a window's part holds at least this many
			    * selected blocks where it has more than one
			    * (PART_BLOCKS, or 64 with GPU_ATTN_PART_64) */
	uint32_t wc, wm;   /* the attention kernel's first wave where the
			    * CTAs are ordered: CTAs an SM and SMs
			    * (gpu_wave_rank; 0: rank order; set by the
			    * launch, wave_of) */
};

/* Bytes cleared at the start of every step: the histograms (and select
 * state) of every context, then every context's segment notes (seg_note:
 * two words per segment and the update buffer). */
static size_t clear_bytes(const struct gpu_attn_args *a)
{
	return (size_t)a->n_heads * (HIST_WORDS + 2 * ((size_t)a->max_segs + 1)) * 4;
}

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

enum ws_mode { WS_PACKED = 0, WS_QUEST = 1, WS_DENSE = 2 };

/* Attribute @attr of the current device into *@v: 0 or a negative errno. */
static int dev_attr(enum cudaDeviceAttr attr, int *v)
{
	int dev = 0;
	GPU_CK(cudaGetDevice(&dev));
	GPU_CK(cudaDeviceGetAttribute(v, attr, dev));
	return 0;
}

/* The current device's SMs in *@nsm: 0 or a negative errno. */
static int sm_count(int *nsm)
{
	return dev_attr(cudaDevAttrMultiProcessorCount, nsm);
}

/*
 * Blocks per work chunk (a CTA's share of one segment's selection), log2.
 * A wider chunk cuts the fixed work per selected block (the queries'
 * setup, the warps' merge, the partial and its note) but gives fewer CTAs.
 * 512 where the contexts together hold 2^19 blocks or more (1,024 windows
 * of 512: ~8 an SM).  The eighth session set 2^20 (7 % faster at 1M
 * tokens, batch 8; 4-25 % slower at batch 1); since windows split over two
 * slots and the CTAs run longest first, 512 is the faster at 1M batch 1
 * too: 6-7 % on three H100 runs (thirty-fourth and thirty-fifth sessions:
 * 203.2 / 217.1, 205.2 / 219.9, 202.2 / 218.0 µs; g = 2 rows 184.5 /
 * 198.9) while still 21 % slower at 512K batch 1 (2^18 blocks);
 * below, the widest of 256, 128, 64 whose windows number at least three
 * per SM, so that a small step still spreads over the GPU (sixteenth
 * session, 1M-token H200 bench at 10 %: 32K batch 1 77.4 -> 64.7 µs with
 * 64, 128K batch 1 96.0 -> 82.6 µs with 128; 256 stays best from 256K
 * and at batch 8).  GPU_ATTN_CHUNK_64 .. _512 force one.
 */
#define CHUNK_WIDE_BLOCKS (1u << 20) /* histories' blocks over all contexts: the
					* lists (cut_only_of) */
#define CHUNK_512_BLOCKS (1u << 19)  /* and chunks of 512 (the ours_512 runs
					* above were cut-only, as every step
					* below CHUNK_WIDE_BLOCKS is) */
#define CHUNK_WINS_PER_SM 3
static uint32_t chunk_lg(const struct gpu_attn_args *a)
{
	if (a->flags & GPU_ATTN_CHUNK_512)
		return 9;
	if (a->flags & GPU_ATTN_CHUNK_256)
		return 8;
	if (a->flags & GPU_ATTN_CHUNK_128)
		return 7;
	if (a->flags & GPU_ATTN_CHUNK_64)
		return 6;
	uint64_t tot = (uint64_t)a->n_heads * a->max_blocks;
	if (tot >= CHUNK_512_BLOCKS)
		return 9;
	int nsm = 0;
	if (sm_count(&nsm) || nsm <= 0)
		return 8;
	uint32_t lg = 8;
	while (lg > 6 && (tot >> lg) < (uint64_t)CHUNK_WINS_PER_SM * (uint64_t)nsm)
		lg--;
	return lg;
}

/*
 * Whether a step's select leaves only the cut (each attention CTA then
 * takes its window's blocks from the scores: window_take) or writes the
 * lists.  The cut where the contexts hold fewer than CHUNK_WIDE_BLOCKS
 * blocks: at 1M tokens, batch 1, 273 -> 259 us on the H200.  At batch 8
 * (1M) a build with the cut everywhere measured its score stage ~75 us
 * slower, and so did the list mode while k_qrot held the window table's
 * code (run-time disabled); cause not found (k_qrot's CUT instances).
 * GPU_ATTN_SELECT_LIST forces the lists.
 */
static int cut_only_of(const struct gpu_attn_args *a)
{
	return !(a->flags & GPU_ATTN_SELECT_LIST) &&
	       (uint64_t)a->n_heads * a->max_blocks < CHUNK_WIDE_BLOCKS;
}

/*
 * Slots (CTAs) a window of the cut-only path, log2: a window that holds
 * n > PART_BLOCKS selected blocks is split in ceil(n / PART_BLOCKS) equal
 * parts, as many as it has slots (window_take).  Why: a CTA's time is
 * about a fixed cost plus a per-block one (H200, 1M tokens, batch 1:
 * 23,000 + 1,300 cycles a selected block), and where the selection
 * clusters some windows hold five times the mean; the step then waits on
 * them (1M: the SMs' busy cycles averaged 0.77 of the busiest's; 256K,
 * fewer windows than CTA slots: the kernel lasted as long as its
 * heaviest window, twice the mean).  Two where windows are wider than 64 blocks; one for windows of
 * 64, which hold two parts at most and where the second slot's CTA cost
 * more than it saved (H200, batch 1, µs with one / two / four slots:
 * 32K 59.4 / 62.1 / 69.2; 128K 79.9 / 77.1 / 82.2; 256K 114.2 / 95.7 /
 * 97.3; 1M 227.4 / 218.3 / 224.0).  Quest (@quest) keeps one unless
 * forced: two made its step slower (1M 323.6 -> 331.6 µs, 256K 113.6 ->
 * 117.4; its CTAs stream dense rows, a smaller fixed share), and the
 * baseline runs as it runs fastest.  GPU_ATTN_PARTS_1 / _2 / _4 force one.
 */
#define PART_BLOCKS 32
static uint32_t parts_lg(const struct gpu_attn_args *a, uint32_t cwl, bool quest)
{
	if (a->flags & GPU_ATTN_PARTS_1)
		return 0;
	if (a->flags & GPU_ATTN_PARTS_2)
		return 1;
	if (a->flags & GPU_ATTN_PARTS_4)
		return 2;
	return !quest && cwl > 6 ? 1 : 0;
}

/*
 * The window table (cut-only steps; k_qrot writes it, the attention
 * kernel reads it): an entry a window, x its segment, [y, z) its blocks
 * among the head's; the count of windows at word WDESC_COUNT(max_chunks).
 * The range sits in the entry, and the entry is read whether or not the
 * window exists (entries up to max_chunks >> pl lie in the table's words),
 * so that a CTA's scores are one load after its entry: read as (segment,
 * window index) behind the count, the entry, the segment's block0 and
 * the scores were four dependent round trips before the list (H200, 1M
 * tokens: 4,700 cycles of a CTA's ~47,000, bench/cta_probe.py).
 */
#define WDESC_COUNT(max_chunks) (4 * (size_t)(max_chunks))

static struct ws_layout ws_plan(const struct gpu_attn_args *a, enum ws_mode m)
{
	struct ws_layout L;
	memset(&L, 0, sizeof L);
	size_t nb = a->max_blocks, ns = a->max_segs;
	L.cwl = chunk_lg(a);
	L.pb = a->flags & GPU_ATTN_PART_64 ? 64 : PART_BLOCKS;
	const size_t cw = (size_t)1 << L.cwl;
	L.win_tiles = (a->max_win + WIN_TILE - 1) / WIN_TILE;
	if (m == WS_DENSE) {
		size_t ntok = (size_t)a->max_blocks * a->quest_b;
		L.max_chunks = (uint32_t)((ntok + DENSE_T - 1) / DENSE_T);
	} else {
		L.max_chunks = (uint32_t)(nb / cw + (m == WS_PACKED ? ns : 1) + 1);
		if (m == WS_PACKED)
			L.buf_chunks = (uint32_t)((a->max_buf_blocks + cw - 1) / cw);
		/* the window table keeps a word a window: its count stays at
		 * [max_chunks], past them */
		L.pl = cut_only_of(a) ? parts_lg(a, L.cwl, m == WS_QUEST) : 0;
		L.max_chunks <<= L.pl;
	}
	L.slots = L.max_chunks + L.buf_chunks + L.win_tiles;
	L.max_segs = a->max_segs;
	L.base = al256(clear_bytes(a));
	size_t off = 0;
	L.qr = off;
	off += al256((ns + 1) * QR_ROWS * NQP(a->nq) * sizeof(float));
	L.qpm = off;
	off += al256(ns * QPM_FLOATS(NQP(a->nq)) * sizeof(float));
	L.tiles = off;
	off += al256((nb / SCORE_T + 1) * sizeof(struct score_tile));
	L.scores = off;
	off += al256(nb * sizeof(float));
	L.ntok = off;
	off += al256(nb);
	L.sel = off;
	off += al256(nb * 4);
	L.selseg = off;
	off += al256(nb * 4);
	L.selkey = off;
	off += al256(nb * 4);
	L.counts = off;
	off += 256;
	L.chunk = off;
	/* the chunk list (max_chunks + 1 words), or the window table: four
	 * words a window and the count at word WDESC_COUNT(max_chunks), past
	 * any table */
	off += al256((WDESC_COUNT(L.max_chunks) + 1) * 4);
	/* the window table shares the chunk list's words: a step reads one or
	 * the other (L.cut_only), and the list is built after qrot writes it */
	L.wdesc = L.chunk;
	L.part_o = off;
	off += al256((size_t)L.slots * a->nq * a->d * sizeof(float));
	L.part_ml = off;
	off += al256((size_t)L.slots * a->nq * 2 * sizeof(float));
	/* blocks at or above the cut's bin, a byte per 32 (the count pass),
	 * and the attention CTAs' order (lpt_order) */
	L.g32 = off;
	off += al256(nb / 32 + 1);
	L.order = off;
	off += al256((size_t)L.slots * 4);
	L.per_head = off;
	return L;
}

size_t gpu_attn_ws_bytes(const struct gpu_attn_args *a)
{
	if (!a)
		return 0;
	/* the narrowest chunks have the most slots: the size for any width */
	struct gpu_attn_args b = *a;
	b.flags = (a->flags & ~(GPU_ATTN_CHUNK_512 | GPU_ATTN_CHUNK_256 | GPU_ATTN_CHUNK_128 |
				GPU_ATTN_SELECT_LIST | GPU_ATTN_PARTS_1 | GPU_ATTN_PARTS_2)) |
		  GPU_ATTN_CHUNK_64 | GPU_ATTN_PARTS_4;
	size_t m = 0;
	for (int i = 0; i < 3; i++) {
		struct ws_layout L = ws_plan(&b, (enum ws_mode)i);
		size_t t = L.base + L.per_head * a->n_heads;
		m = t > m ? t : m;
	}
	return m;
}

int gpu_attn_ws_init(const struct gpu_attn_args *a, cudaStream_t s)
{
	if (!a || !a->ws || a->ws_bytes < gpu_attn_ws_bytes(a))
		return -EINVAL;
	GPU_CK(cudaMemsetAsync(a->ws, 0, clear_bytes(a), s));
	return 0;
}

int gpu_device_ok(void)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
		cudaGetLastError();
		return 0;
	}
	if (e != cudaSuccess)
		return gpu_errno(e);
	return n > 0;
}

#define WSP(T, L, field, ws, h) \
	((T *)((char *)(ws) + (L).base + (size_t)(h) * (L).per_head + (L).field))
/* Per-context weight histograms of the score keys: cleared by a memset at
 * the start of each step, filled by the score kernel, read by select. */
#define HIST(ws, h) ((uint32_t *)(ws) + (size_t)(h) * HIST_WORDS)
/* Context h's note of segment si (si == nseg: the update buffer): [0] its
 * chunks attended, [1] ~(the first chunk's slot). */
#define SEGNOTE(ws, L, n_heads, h, si)                                         \
	((uint32_t *)(ws) + (size_t)(n_heads) * HIST_WORDS +                   \
	 2 * ((size_t)(h) * ((L).max_segs + 1) + (si)))

/* The slot (context *@hi, slot *@x) an attention CTA works on where the
 * select ordered them (ws_layout.lpt, lpt_order): the CTA at dispatch
 * position p takes b = gpu_wave_rank(p), rank b / heads of context
 * b % heads's order, so that every context's heaviest slots go first, the
 * contexts interleave and the first wave's SMs share the heavy ones.  True
 * where the slot has no work (GPU_ORDER_IDLE): the CTA then only marks its
 * partial empty.  Read after pdl_begin (the select wrote it). */
__device__ __forceinline__ bool lpt_slot(const char *ws, const struct ws_layout &L, uint32_t *hi,
					 uint32_t *x)
{
	const uint32_t b = gpu_wave_rank(blockIdx.y * gridDim.x + blockIdx.x, L.wc, L.wm),
		       h = b % gridDim.y;
	const uint32_t v = __ldcg(WSP(const uint32_t, L, order, ws, h) + b / gridDim.y);
	*hi = h;
	*x = v & ~GPU_ORDER_IDLE;
	return (v & GPU_ORDER_IDLE) != 0u;
}

/* The slot (context *@hi, slot *@x) an attention CTA works on: by the
 * select's order (lpt_slot; true where idle), else its own.  (Spreading
 * the slot order's first wave over the SMs by gpu_wave_rank, as the
 * ordered CTAs are, was within ±0.4 µs at 64K-256K batch 1: H100, paired,
 * forty-ninth session; retired.) */
__device__ __forceinline__ bool slot_of(const char *ws, const struct ws_layout &L, uint32_t *hi,
					uint32_t *x)
{
	if (L.lpt)
		return lpt_slot(ws, L, hi, x);
	*hi = blockIdx.y;
	*x = blockIdx.x;
	return false;
}

/* Orderable key of a float score; -0 and +0 compare equal as on the CPU. */
__device__ __forceinline__ uint32_t fkey(float f)
{
	uint32_t u = __float_as_uint(f + 0.0f);
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* NQ floats from @p (16-byte aligned); LDG: read-only global data. */
template <int NQ, bool LDG = false>
__device__ __forceinline__ void loadq(const float *p, float (&v)[NQ])
{
	if constexpr (NQ % 4 == 0) {
#pragma unroll
		for (int i = 0; i < NQ; i += 4) {
			float4 t = LDG ? __ldg((const float4 *)(p + i)) : *(const float4 *)(p + i);
			v[i] = t.x; v[i + 1] = t.y; v[i + 2] = t.z; v[i + 3] = t.w;
		}
	} else if constexpr (NQ == 3) {
		float4 t = LDG ? __ldg((const float4 *)p) : *(const float4 *)p;
		v[0] = t.x; v[1] = t.y; v[2] = t.z;
	} else if constexpr (NQ == 2) {
		float2 t = LDG ? __ldg((const float2 *)p) : *(const float2 *)p;
		v[0] = t.x; v[1] = t.y;
	} else {
		v[0] = LDG ? __ldg(p) : p[0];
	}
}

/* bf16x2 of (lo, hi): lo in the low half (the lower k index). */
__device__ __forceinline__ uint32_t dn_bf2(float lo, float hi)
{
	uint32_t r;
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
	return r;
}

/* D = A B + D, m16n8k16, fp16 inputs, fp32 accumulators. */
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
					uint32_t a3, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* D = A B + D, m16n8k16, bf16 inputs, fp32 accumulators. */
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
					 uint32_t a3, uint32_t b0, uint32_t b1)
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* a, b as bf16 pairs: *h the rounded values, *l the remainders. */
__device__ __forceinline__ void dn_split(float a, float b, uint32_t *h, uint32_t *l)
{
	uint32_t x = dn_bf2(a, b);
	*h = x;
	*l = dn_bf2(a - __uint_as_float(x << 16), b - __uint_as_float(x & 0xffff0000u));
}

template <bool BF>
__device__ __forceinline__ void mma_t(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
				      uint32_t a3, uint32_t b0, uint32_t b1)
{
	if (BF)
		mma_bf16(c, a0, a1, a2, a3, b0, b1);
	else
		mma_f16(c, a0, a1, a2, a3, b0, b1);
}

/* fp16 pair of (a, b) (@lo: of their remainders after rounding). */
__device__ __forceinline__ uint32_t h2split(float a, float b, bool lo)
{
	__half2 h = __floats2half2_rn(a, b);
	if (lo) {
		float2 f = __half22float2(h);
		h = __floats2half2_rn(a - f.x, b - f.y);
	}
	return *(uint32_t *)&h;
}

/* The same in bf16 (hi + lo carries 16 bits of mantissa). */
template <bool BF>
__device__ __forceinline__ uint32_t split_t(float a, float b, bool lo)
{
	if (!BF)
		return h2split(a, b, lo);
	uint32_t h, l;
	dn_split(a, b, &h, &l);
	return lo ? l : h;
}

/* ------------------------------------------------------------------ */
/* qrot: q'[seg][c][h] = Σ_j R_k[c][j] q_h[j], c < dk (unscaled).      */

#define QROT_LD (GPU_MAX_D + 8) /* padded bf16 row: conflict-free 16-byte reads */

/* Whether a history segment is scored in integers: it has 8-bit
 * summaries of a shape the score kernel takes (gpu_seg's s8). */
__device__ __forceinline__ bool seg_q8(const struct gpu_seg *sg)
{
	return sg->s8 && sg->s8_scale && sg->S >= 8 && sg->S <= SCORE_SMAX && !(sg->S & 7) &&
	       sg->S <= sg->k_dk;
}

/* Score tile @t's descriptor (struct score_tile) for segment @si (@sg, a
 * history segment holding the tile's first block, t · SCORE_T).  k_qrot
 * writes every tile's; k_score builds its first two itself before its
 * programmatic-launch wait (the segments are the caller's, not k_qrot's). */
__device__ __forceinline__ struct score_tile score_tile_of(const struct gpu_seg *sg, uint32_t si,
							   uint32_t t)
{
	struct score_tile x = {};
	x.j0 = t * SCORE_T - sg->block0;
	x.S = sg->S;
	x.mn = sg->s_min + (size_t)x.j0 * x.S;
	x.mx = sg->s_max + (size_t)x.j0 * x.S;
	x.rest = sg->s_rest ? sg->s_rest + x.j0 : NULL;
	x.si = si;
	x.nrow = min(SCORE_T, sg->n_blocks - x.j0);
	x.b = sg->b;
	x.n = sg->n;
	x.staged = x.S <= SCORE_SMAX && x.S <= sg->k_dk && (x.S & 7) == 0 &&
		   (((uintptr_t)x.mn | (uintptr_t)x.mx) & 15) == 0;
	if (seg_q8(sg)) {
		x.r8 = (const uint4 *)(sg->s8 + (size_t)x.j0 * 2 * x.S);
		x.sc8 = sg->s8_scale + x.j0;
		x.q8 = 1;
		x.staged = ((uintptr_t)x.r8 & 15) == 0;
	}
	return x;
}

/* Words of a segment's 8-bit query in the qpm region: S / 4 channel
 * words of max(qi, 0) and min(qi, 0) for P heads, then P scales. */
__host__ __device__ constexpr uint32_t q8_words(uint32_t S, uint32_t P)
{
	return S / 4 * 2 * P + P;
}

/* Windows of 1 << @cwl blocks in the segments before segment @si (all of
 * them for si = nseg), counted by every thread of the CTA, a segment each
 * (one round trip for up to blockDim.x segments); each warp's sum into
 * @wpart[warp] (the caller adds them after a barrier). */
__device__ void wins_before_cta(const struct gpu_head *H, uint32_t si, uint32_t cwl,
				uint32_t *wpart)
{
	const struct gpu_seg *segs = H->segs;
	const uint32_t nseg = H->nseg;
	uint32_t wn = 0;
	for (uint32_t t = threadIdx.x; t < si && t < nseg; t += blockDim.x)
		wn += (segs[t].n_blocks + (1u << cwl) - 1) >> cwl;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		wn += __shfl_xor_sync(0xffffffffu, wn, o);
	if ((threadIdx.x & 31) == 0)
		wpart[threadIdx.x >> 5] = wn;
}

/* The step's histograms, select state and segment notes (clear_bytes),
 * zeroed by k_qrot's whole grid, a slice a CTA, where a memset node before
 * it was a launch and a dependency of its own in the step's chain (the
 * score kernel, which adds into them, starts after that grid has
 * completed; k_qrot reads none of them).  The stores go out and are not
 * waited on.  @clear_words 0: the launch cleared them (a memset node). */
__device__ __forceinline__ void qrot_clear(char *ws, uint32_t clear_words)
{
	if (!clear_words)
		return;
	const size_t nc = (size_t)gridDim.x * gridDim.y * blockDim.x;
	const size_t t = ((size_t)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
	for (size_t i = t; i < clear_words / 4; i += nc)
		((uint4 *)ws)[i] = make_uint4(0u, 0u, 0u, 0u);
	if (t < (clear_words & 3u))
		((uint32_t *)ws)[clear_words / 4 * 4 + t] = 0u;
}

/* CUT: the step leaves only the cut (L.cut_only), so qrot also writes the
 * window table.  A separate instance, not a run-time test: on the H200 the
 * list-mode step (1M tokens, batch 8) measured its score stage ~70 µs
 * slower after k_qrot merely contained the table's code (qrot itself was
 * faster: 48 registers instead of 51), with the kernels alone equal in
 * ncu; the CUT = false instance is the kernel of the list-only build. */
template <int NQ, bool CUT>
__global__ void __launch_bounds__(256) k_qrot(const struct gpu_head *heads, const float *q,
					      uint32_t d, char *ws, struct ws_layout L,
					      uint32_t clear_words)
{
	pdl_begin();
	__shared__ __align__(16) uint16_t Rs[GPU_MAX_D * QROT_LD];
	__shared__ float qrs[GPU_MAX_D * 8];                /* q'[c][h] */
	__shared__ uint32_t wpart[256 / 32];
	__shared__ uint2 qb[3][GPU_MAX_D / 16][32]; /* the query's B fragments */
	__shared__ float qn2[8]; /* |q|² per head */
	static_assert(GPU_MAX_D / 16 * 32 <= 256 && NQ <= 8, "k_qrot: a k-step a warp");
	/* the query's fragment (below) first: it does not depend on the
	 * context's segments, so its loads fly beside theirs instead of after
	 * the rotation's address arrives */
	const uint32_t ks = threadIdx.x >> 5, ln = threadIdx.x & 31;
	const uint32_t h = ln >> 2, j = 16 * ks + 2 * (ln & 3);
	const bool on = ks < d / 16;
	const float *qh = q + (size_t)blockIdx.y * NQ * d;
	float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
	if (on && h < NQ) {
		const float *p = qh + (size_t)h * d + j;
		if (((uintptr_t)qh & 7) == 0) {
			const float2 a = *(const float2 *)p, b = *(const float2 *)(p + 8);
			x[0] = a.x; x[1] = a.y; x[2] = b.x; x[3] = b.y;
		} else {
			x[0] = p[0]; x[1] = p[1]; x[2] = p[8]; x[3] = p[9];
		}
	}
	const struct gpu_head *H = &heads[blockIdx.y];
	uint32_t si = blockIdx.x, nseg = H->nseg;
	const struct gpu_seg *sg;
	if (si < nseg) {
		sg = &H->segs[si];
	} else if (si == nseg && H->buf) {
		sg = H->buf;
	} else {
		if (CUT && si == nseg) { /* no buffer: the count (CTA-uniform) */
			wins_before_cta(H, si, L.cwl, wpart);
			__syncthreads();
			if (threadIdx.x == 0) {
				uint32_t n = 0;
				for (uint32_t w = 0; w < blockDim.x / 32; w++)
					n += wpart[w];
				WSP(uint32_t, L, wdesc, ws, blockIdx.y)[WDESC_COUNT(L.max_chunks)] = n;
			}
		}
		qrot_clear(ws, clear_words);
		return;
	}
	const uint16_t *R = sg->k_rot;
	uint32_t dk = sg->k_dk;
	/* the whole rotation in one round trip */
	uint32_t cpr = d / 8; /* 16-byte pieces per row */
	for (uint32_t i = threadIdx.x; i < dk * cpr; i += blockDim.x) {
		uint32_t c = i / cpr, k = i % cpr;
		uint32_t sa = (uint32_t)__cvta_generic_to_shared(Rs + c * QROT_LD + k * 8);
		asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa),
			     "l"(R + (size_t)c * d + k * 8));
	}
	asm volatile("cp.async.commit_group;");
	qrot_clear(ws, clear_words); /* behind the loads that the CTA waits on */
	constexpr int P = NQP(NQ);
	/* the window table (wdesc, for the attention kernel): segment si's
	 * windows of 1 << cwl blocks come after those of the segments before
	 * it, counted by every thread (a segment each, all loads in one round
	 * trip while the rotation arrives: warp 1 alone, 32 segments a round
	 * trip, held the CTA's barrier, 33 % of k_qrot's stall samples at 1M
	 * tokens in 4,096-token segments; 11 % since, though the kernel's time
	 * did not move: gpu/NOTES.md, twenty-fifth session) and written by
	 * warp 1 after the barrier; CTA nseg writes the count at [max_chunks] */
	{
		/* thread t < d / 16 · 32 holds k-step t / 32's four channels of
		 * head (t % 32) / 4 as the B fragments take them (lane t % 32):
		 * channels 16ks + 2tig, + 1, + 8, + 9 (x, loaded at the top);
		 * the segments' loads beside them, then the fragments: the
		 * query split in three bf16 parts */
		if (CUT)
			wins_before_cta(H, si, L.cwl, wpart);
		/* qperp's |q|² (the CPU's order: sequential, unfused) while R_k
		 * is in flight, by the last warp (idle in the product when d_keep
		 * <= 112); after the product it was a 128-step chain the CTA
		 * waited on: 51 -> 41 µs a layer at 1M tokens with the rest of
		 * this change (gpu/NOTES.md, twenty-sixth session).  From the
		 * fragments' values staged in qrs (free until the product): read
		 * from global memory it was d / 16 round trips, a batch of 16
		 * loads each, in one thread */
		if (on && h < NQ) {
			float *qq = qrs + h * d + j;
			qq[0] = x[0];
			qq[1] = x[1];
			qq[8] = x[2];
			qq[9] = x[3];
		}
		__syncthreads();
		if (threadIdx.x >= 224 && threadIdx.x < 224 + NQ) {
			const uint32_t hq = threadIdx.x - 224;
			float n2 = 0.0f;
#pragma unroll 16
			for (uint32_t jj = 0; jj < d; jj++)
				n2 = __fadd_rn(n2, __fmul_rn(qrs[hq * d + jj], qrs[hq * d + jj]));
			qn2[hq] = n2;
		}
		if (on) {
#pragma unroll
			for (int part = 0; part < 3; part++) {
				const uint32_t b0 = dn_bf2(x[0], x[1]), b1 = dn_bf2(x[2], x[3]);
				qb[part][ks][ln] = make_uint2(b0, b1);
				/* the remainders are exact in fp32 */
				x[0] -= __uint_as_float(b0 << 16);
				x[1] -= __uint_as_float(b0 & 0xffff0000u);
				x[2] -= __uint_as_float(b1 << 16);
				x[3] -= __uint_as_float(b1 & 0xffff0000u);
			}
		}
	}
	asm volatile("cp.async.wait_group 0;" ::: "memory");
	__syncthreads();
	if (CUT && threadIdx.x >= 32 && threadIdx.x < 64) {
		uint32_t n = 0, lane = threadIdx.x & 31;
		for (uint32_t w = 0; w < blockDim.x / 32; w++)
			n += wpart[w];
		uint32_t *wd = WSP(uint32_t, L, wdesc, ws, blockIdx.y);
		if (si < nseg) {
			const uint32_t b0 = sg->block0, nb = sg->n_blocks;
			const uint32_t nw = (nb + (1u << L.cwl) - 1) >> L.cwl;
			for (uint32_t i = lane; i < nw; i += 32)
				((uint4 *)wd)[n + i] =
					make_uint4(si, b0 + (i << L.cwl),
						   b0 + min(nb, (i + 1) << L.cwl), 0u);
		} else if (lane == 0) {
			wd[WDESC_COUNT(L.max_chunks)] = n;
		}
	}
	float *qr = WSP(float, L, qr, ws, blockIdx.y) + (size_t)si * QR_ROWS * P;
	/* for the score: q' split by sign over the summary channels, and the
	 * segment of each score tile's first block (a hint the score checks) */
	float *qpm = si < nseg ? WSP(float, L, qpm, ws, blockIdx.y) + (size_t)si * QPM_FLOATS(P)
			       : NULL;
	uint32_t S = min(sg->S, dk);
	const bool q8 = si < nseg && seg_q8(sg); /* CTA-uniform */
	if (si < nseg) {
		struct score_tile *tl = WSP(struct score_tile, L, tiles, ws, blockIdx.y);
		uint32_t t0 = (sg->block0 + SCORE_T - 1) / SCORE_T;
		uint32_t t1 = (sg->block0 + sg->n_blocks + SCORE_T - 1) / SCORE_T;
		for (uint32_t t = t0 + threadIdx.x; t < t1; t += blockDim.x)
			tl[t] = score_tile_of(sg, si, t);
	}
	/* q' = R_k q on tensor cores: R_k (bf16, in Rs) is A, warp w its rows
	 * 16w .. 16w + 15; the query is B, n-tile `part` holding that part
	 * of every head (column h: head h), so that hi + mid + lo carry its
	 * fp32 value and the bf16 products are exact: q' to fp32 rounding of
	 * the sums, not the CPU's operations (the scores' tests hold by
	 * tolerance, the 8-bit query is checked against mkv_query8 of this
	 * q').  It was per (row half, head) a 64-step fmaf chain fed by an
	 * LDS.128 of q a step: the kernel's short-scoreboard and MIO stalls */
	{
		const uint32_t w = threadIdx.x >> 5, lane = threadIdx.x & 31;
		const uint32_t g = lane >> 2, tig = lane & 3;
		if (16 * w < dk) {
			float c[3][4];
#pragma unroll
			for (int part = 0; part < 3; part++)
				c[part][0] = c[part][1] = c[part][2] = c[part][3] = 0.0f;
			const uint32_t aa = (uint32_t)__cvta_generic_to_shared(
				Rs + (16 * w + ((lane >> 3) & 1) * 8 + (lane & 7)) * QROT_LD +
				(lane >> 4) * 8);
#pragma unroll
			for (int ks = 0; ks < GPU_MAX_D / 16; ks++) {
				if ((uint32_t)ks >= d / 16)
					break;
				uint32_t a0, a1, a2, a3;
				asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
					     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
					     : "r"(aa + ks * 32)
					     : "memory");
#pragma unroll
				for (int part = 0; part < 3; part++) {
					const uint2 b = qb[part][ks][lane];
					mma_bf16(c[part], a0, a1, a2, a3, b.x, b.y);
				}
			}
			/* lane (g, tig): rows g and g + 8 of the warp's 16, heads 2tig
			 * and 2tig + 1 */
#pragma unroll
			for (int e = 0; e < 4; e++) {
				const uint32_t cr = 16 * w + g + 8 * (e >> 1), h = 2 * tig + (e & 1);
				const float v = (c[2][e] + c[1][e]) + c[0][e];
				if (cr < dk && h < NQ) {
					qr[(size_t)cr * P + h] = v;
					qrs[cr * 8 + h] = v;
					if (qpm && cr < S && !q8) {
						qpm[cr * 2 * P + h] = fmaxf(v, 0.0f);
						qpm[cr * 2 * P + P + h] = fminf(v, 0.0f);
					}
				}
			}
		}
	}
	__syncthreads();
	/* qperp: the CPU's sums (query_perp), sequential, unfused (unrolled:
	 * the same order, without a loop's branch per term) */
	if (threadIdx.x < NQ) {
		uint32_t h = threadIdx.x;
		float nq = qn2[h], ns = 0.0f;
#pragma unroll 8
		for (uint32_t c = 0; c < S; c++)
			ns = __fadd_rn(ns, __fmul_rn(qrs[c * 8 + h], qrs[c * 8 + h]));
		qr[(size_t)GPU_MAX_D * P + h] = sqrtf(fmaxf(0.0f, nq - ns));
	}
	if (q8) {
		/* the 8-bit query, mkv_query8's steps: per head the largest
		 * |q'_c| over 127, then each channel's nearest integer on it
		 * (q8_words' layout, words of four channels) */
		__shared__ float qsc8[8];
		uint32_t *w8 = (uint32_t *)qpm;
		if (threadIdx.x >= 32 && threadIdx.x < 32 + P) {
			uint32_t h = threadIdx.x - 32;
			float m = 0.0f;
			for (uint32_t c = 0; h < NQ && c < S; c++)
				m = fmaxf(m, fabsf(qrs[c * 8 + h]));
			float sc = m > 0.0f ? __fdiv_rn(m, 127.0f) : 1.0f;
			qsc8[h] = sc;
			w8[S / 4 * 2 * P + h] = __float_as_uint(sc);
		}
		__syncthreads();
		for (uint32_t i = threadIdx.x; i < S / 4 * P; i += blockDim.x) {
			uint32_t u = i / P, h = i % P, wp = 0, wn = 0;
			for (uint32_t e = 0; h < NQ && e < 4; e++) {
				float x = rintf(__fdiv_rn(qrs[(4 * u + e) * 8 + h], qsc8[h]));
				int v = (int)fminf(fmaxf(x, -127.0f), 127.0f);
				wp |= (uint32_t)(max(v, 0) & 0xff) << (8 * e);
				wn |= (uint32_t)(min(v, 0) & 0xff) << (8 * e);
			}
			w8[u * 2 * P + h] = wp;
			w8[u * 2 * P + P + h] = wn;
		}
	}
}

/* ------------------------------------------------------------------ */
/* score: one thread per history block.                                */

__device__ __forceinline__ uint32_t seg_of_block(const struct gpu_seg *segs, uint32_t nseg,
						 uint32_t gb)
{
	return last_le(segs, nseg, &gpu_seg::block0, gb);
}

/* seg_of_block by a whole warp (every lane gets it): a sample of 32 of
 * the segments' starts, then the ≤ 32 between two samples, two round
 * trips (one up to 32 segments) where the binary search takes log2(nseg)
 * dependent loads; past 1,024 segments the lanes' first pick narrows
 * seg_of_block's search. */
__device__ __forceinline__ uint32_t seg_of_block_warp(const struct gpu_seg *segs, uint32_t nseg,
						      uint32_t gb)
{
	const uint32_t lane = threadIdx.x & 31, step = (nseg + 31) / 32;
	uint32_t k = min(lane * step, nseg - 1);
	uint32_t m = __ballot_sync(0xffffffffu, lane * step < nseg && segs[k].block0 <= gb) | 1u;
	const uint32_t base = (31 - __clz(m)) * step;
	if (step == 1)
		return base;
	if (step > 32) {
		const uint32_t end = min(nseg, base + step);
		return base + seg_of_block(segs + base, end - base, gb);
	}
	k = min(base + lane, nseg - 1);
	m = __ballot_sync(0xffffffffu, lane < step && segs[k].block0 <= gb) | 1u;
	return base + (31 - __clz(m));
}

/* Row of channel c in a split query: q⁺ then q⁻, P floats each (all
 * lanes read the same row: broadcasts). */
template <int NQ>
__device__ __forceinline__ uint32_t qpm_row(uint32_t c)
{
	return c * 2 * NQP(NQ);
}

/* q⁺ and q⁻ of channel c from a split query (qpm_row's layout): in shared
 * memory, or (LDG) in read-only global memory. */
template <int NQ, bool LDG>
__device__ __forceinline__ void load_pm(const float *q, uint32_t c, float (&qp)[NQ],
					float (&qn)[NQ])
{
	loadq<NQ, LDG>(q + qpm_row<NQ>(c), qp);
	loadq<NQ, LDG>(q + qpm_row<NQ>(c) + NQP(NQ), qn);
}

/* One channel's terms of a block score into its sum (bound_score_pm), in
 * the CPU's order: the product with mx rounded, fused with q⁻·mn, then
 * added to @ap.  (As two sums of fused products, q⁺·mx and q⁻·mn, two
 * instructions a channel and head where this takes three: within ±0.7
 * µs at 32K-1M batch 1 once the score CTAs were spread, +6.7 µs at 256K
 * without, and not the CPU's bits: H100, paired, forty-ninth session;
 * retired.) */
__device__ __forceinline__ void score_terms(float &ap, float qp, float qn, float fa, float fb)
{
	ap = __fadd_rn(ap, __fmaf_rn(qn, fa, __fmul_rn(qp, fb)));
}

/* A 32-channel piece of a block's summaries (channels c32 .. c32 + 31 of
 * @mn and @mx, those below S), loaded at once. */
struct sum32 {
	uint4 a[4], b[4];
};

__device__ __forceinline__ void sum32_load(struct sum32 &r, const uint16_t *mn, const uint16_t *mx,
					   uint32_t c32, uint32_t S)
{
#pragma unroll
	for (int u = 0; u < 4; u++)
		if (c32 + 8 * u < S) {
			r.a[u] = __ldg((const uint4 *)(mn + c32 + 8 * u));
			r.b[u] = __ldg((const uint4 *)(mx + c32 + 8 * u));
		}
}

template <int NQ, bool LDG>
__device__ __forceinline__ void sum32_acc(float (&ap)[NQ], const float *qpm,
					  const struct sum32 &r, uint32_t c32, uint32_t S)
{
#pragma unroll
	for (int u = 0; u < 4; u++) {
		if (c32 + 8 * u >= S)
			break;
		float fa[8], fb[8];
		unpack8(r.a[u], fa);
		unpack8(r.b[u], fb);
#pragma unroll
		for (int e = 0; e < 8; e++) {
			float qp[NQ], qn[NQ];
			load_pm<NQ, LDG>(qpm, c32 + 8 * u + e, qp, qn);
#pragma unroll
			for (int h = 0; h < NQ; h++)
				score_terms(ap[h], qp[h], qn[h], fa[e], fb[e]);
		}
	}
}

/* The remainder term and the maximum over the heads. */
template <int NQ, bool LDG>
__device__ __forceinline__ float score_finish(float (&acc)[NQ], const float *qperp, float rest)
{
	if (qperp) {
		float qv[NQ];
		loadq<NQ, LDG>(qperp, qv);
#pragma unroll
		for (int h = 0; h < NQ; h++)
			acc[h] = __fadd_rn(acc[h], __fmul_rn(qv[h], rest));
	}
	float best = acc[0];
#pragma unroll
	for (int h = 1; h < NQ; h++)
		best = fmaxf(best, acc[h]);
	return best;
}

/* Summaries loadable as 16-byte vectors. */
__device__ __forceinline__ bool sum_vec(const uint16_t *mn, const uint16_t *mx, uint32_t S)
{
	return (S & 7) == 0 && (((uintptr_t)mn | (uintptr_t)mx) & 15) == 0;
}

/*
 * A block's score: Σ_c max(q_c mn_c, q_c mx_c) over S channels, plus
 * @qperp (NQ floats, may be NULL: Quest) times @rest, max over the heads.
 * @qpm holds the query split by sign: per channel c, q⁺ = max(q, 0) at
 * qpm_row(c) and q⁻ = min(q, 0) P floats later; in shared memory, or in
 * global memory when LDG (then @qperp too).
 * max(q·mn, q·mx) is the product with mx where q ≥ 0 and with mn where
 * q < 0 (mn ≤ mx), so q⁻·mn + q⁺·mx — one of them an exact zero — is that
 * product rounded once: the CPU's score (which takes the max of both
 * products) in three instructions per channel and head instead of four.
 * Vector loads where S is a multiple of 8 and @mn, @mx are 16-byte
 * aligned, else one by one.
 */
template <int NQ, bool LDG = false>
__device__ __forceinline__ float bound_score_pm(const float *qpm, const uint16_t *mn,
						const uint16_t *mx, uint32_t S,
						const float *qperp = NULL, float rest = 0.0f)
{
	float ap[NQ];
#pragma unroll
	for (int h = 0; h < NQ; h++)
		ap[h] = 0.0f;
	const bool vec = sum_vec(mn, mx, S);
	for (uint32_t c = 0; !vec && c < S; c++) {
		float qp[NQ], qn[NQ], fa = bf1(mn[c]), fb = bf1(mx[c]);
		load_pm<NQ, LDG>(qpm, c, qp, qn);
#pragma unroll
		for (int h = 0; h < NQ; h++)
			score_terms(ap[h], qp[h], qn[h], fa, fb);
	}
	for (uint32_t c32 = 0; vec && c32 < S; c32 += 32) {
		struct sum32 r; /* up to 8 loads in flight before the math */
		sum32_load(r, mn, mx, c32, S);
		sum32_acc<NQ, LDG>(ap, qpm, r, c32, S);
	}
	return score_finish<NQ, LDG>(ap, qperp, rest);
}

/* Stage @n channels of a query (@q: c·@ldq + h) split by sign into @qpm
 * (qpm_row's layout).  All threads; no barrier. */
template <int NQ>
__device__ __forceinline__ void stage_qpm(float *qpm, const float *q, uint32_t n, uint32_t ldq,
					  uint32_t hstride)
{
	constexpr int P = NQP(NQ);
	for (uint32_t i = threadIdx.x; i < n * P; i += blockDim.x) {
		uint32_t c = i / P, h = i % P;
		float v = h < NQ ? q[(size_t)c * ldq + (size_t)h * hstride] : 0.0f;
		qpm[qpm_row<NQ>(c) + h] = fmaxf(v, 0.0f);
		qpm[qpm_row<NQ>(c) + P + h] = fminf(v, 0.0f);
	}
}

/* A warp's weights (@wv, 0 where not @valid): whether every valid lane's
 * is the same (then a group's sum is a popcount times it).  All lanes. */
__device__ __forceinline__ bool warp_uniform(bool valid, uint32_t wv)
{
	const uint32_t all = 0xffffffffu;
	uint32_t w0 = __shfl_sync(all, wv, __ffs(__ballot_sync(all, valid) | 0x80000000u) - 1);
	return __all_sync(all, !valid || wv == w0);
}

/* The weights of the warp's lanes with this lane's @bin, summed; *@lead:
 * this lane is valid and the lowest of them (the one to add the sum).
 * All lanes. */
__device__ __forceinline__ uint32_t bin_sum(uint32_t bin, uint32_t wv, bool uni, bool valid,
					    bool *lead)
{
	uint32_t peers = __match_any_sync(0xffffffffu, bin);
	*lead = valid && (threadIdx.x & 31) == (uint32_t)(__ffs(peers) - 1);
	return uni ? __popc(peers) * wv : __reduce_add_sync(peers, wv);
}

/*
 * Add a block's weight to the context's key histograms: the coarse one
 * (bits 31..21) in shared memory, flushed by hist_flush (scores crowd into
 * a few of its bins: global atomics would queue on them), the fine one
 * (bits 31..16) straight to global memory.  Lanes with equal bins add
 * once; their sum is a popcount times the weight when the warp's weights
 * are equal (full blocks: nearly always), else a reduction (which, over a
 * non-uniform mask, the compiler makes a loop over the lane groups).  All
 * lanes of the warp must call it.  Quest's form (a tile a CTA); the
 * score kernel takes hist_add_ht.
 */
__device__ __forceinline__ void hist_add(uint32_t *sh_hi, uint32_t *g_lo, bool valid, float sc,
					 uint32_t w)
{
	const uint32_t all = 0xffffffffu;
	uint32_t k = fkey(sc);
	uint32_t hb = valid ? k >> 21 : all, lb = valid ? k >> 16 : all;
	uint32_t wv = valid ? w : 0u;
	bool uni = warp_uniform(valid, wv), lead;
	uint32_t sum = bin_sum(hb, wv, uni, valid, &lead);
	if (lead)
		atomicAdd(&sh_hi[hb], sum);
	sum = bin_sum(lb, wv, uni, valid, &lead);
	if (lead)
		atomicAdd(&g_lo[lb], sum);
}

__device__ __forceinline__ void hist_flush(const uint32_t *sh_hi, uint32_t *g_hi)
{
	__syncthreads();
	for (uint32_t i = threadIdx.x; i < HIST_HI; i += blockDim.x)
		if (sh_hi[i])
			atomicAdd(&g_hi[i], sh_hi[i]);
}

/*
 * hist_add's work with both histograms' adds kept in the CTA: the warp's
 * lanes of equal fine bin add once (as hist_add), into the CTA's table
 * of fine bins (@key, @cnt: HT_SLOTS each), which hist_flush_ht adds to
 * the global histograms once per bin.  Why: the fine bins' global
 * reductions, ~25 a warp and tile into a context's few hundred hot bins,
 * were 5 µs of the bf16 score kernel at 1M tokens, batch 1, and 10 of the
 * 8-bit one (thirty-ninth session); a CTA meets the same bins tile after
 * tile.  The coarse bins are the fine ones' top 11 bits, so they come
 * from the table at the flush and need no adds here.  A bin that finds
 * no slot in HT_PROBES goes to global memory at once (both histograms).
 * The totals are the same integers in any order: the selection does not
 * change.  All lanes of the warp must call it.
 */
__device__ __forceinline__ void hist_add_ht(uint32_t *key, uint32_t *cnt, uint32_t *g_hist,
					    bool valid, float sc, uint32_t w)
{
	uint32_t lb = valid ? fkey(sc) >> 16 : 0xffffffffu;
	uint32_t wv = valid ? w : 0u;
	bool lead;
	uint32_t sum = bin_sum(lb, wv, warp_uniform(valid, wv), valid, &lead);
	if (!lead)
		return;
	const uint32_t tag = lb + 1;
	uint32_t sl = lb % HT_SLOTS;
	for (int p = 0; p < HT_PROBES; p++) {
		/* a slot's key, once set, never changes: a stale 0 only costs
		 * the compare-and-swap, which returns the key as it is */
		uint32_t k = *(volatile uint32_t *)&key[sl];
		if (k == 0)
			k = atomicCAS(&key[sl], 0u, tag);
		if (k == 0 || k == tag) {
			atomicAdd(&cnt[sl], sum);
			return;
		}
		sl = (sl + 1) % HT_SLOTS;
	}
	atomicAdd(&g_hist[lb >> 5], sum);
	atomicAdd(&g_hist[HIST_HI + lb], sum);
}

/* The table to the global histograms (@g_hist: coarse, then fine), the
 * coarse bins summed first in @co (HIST_HI words of the CTA's shared
 * memory that the table does not use: a stage, the tiles all scored). */
__device__ __forceinline__ void hist_flush_ht(const uint32_t *key, const uint32_t *cnt,
					      uint32_t *co, uint32_t *g_hist)
{
	for (uint32_t i = threadIdx.x; i < HIST_HI; i += blockDim.x)
		co[i] = 0;
	__syncthreads();
	for (uint32_t i = threadIdx.x; i < HT_SLOTS; i += blockDim.x) {
		uint32_t k = key[i];
		if (k) {
			atomicAdd(&g_hist[HIST_HI + k - 1], cnt[i]);
			atomicAdd(&co[(k - 1) >> 5], cnt[i]);
		}
	}
	hist_flush(co, g_hist); /* the coarse bins, as hist_add's */
}

/* A segment's fields the score reads, in one round trip. */
struct score_seg {
	const uint16_t *mn, *mx, *rest;
	const int8_t *s8;
	const float *sc8;
	uint32_t block0, S, b, n;
	bool q8;
};

__device__ __forceinline__ struct score_seg score_seg_of(const struct gpu_seg *sg)
{
	struct score_seg v;
	v.mn = sg->s_min;
	v.mx = sg->s_max;
	v.rest = sg->s_rest;
	v.s8 = sg->s8;
	v.sc8 = sg->s8_scale;
	v.block0 = sg->block0;
	v.S = sg->S;
	v.b = sg->b;
	v.n = sg->n;
	v.q8 = seg_q8(sg);
	return v;
}

/*
 * A block's 8-bit score (mkv_score8): @w its row's words (gpu_seg's s8
 * layout: minima 4u.. at 2u, maxima at 2u + 1), @q8 the segment's 8-bit
 * query (q8_words' layout) in shared memory, or in read-only global
 * memory when LDG (then @qperp too); @sc the row's scale.  Per head the
 * integer sum by dp4a, exact in any order (|sum| < 2^19), then the
 * CPU's three roundings.
 */
template <int NQ, bool LDG>
__device__ __forceinline__ float score8_row(const uint32_t *q8, const uint32_t (&w)[16],
					    uint32_t S, float sc, const float *qperp, float rest)
{
	constexpr int P = NQP(NQ);
	int acc[NQ];
#pragma unroll
	for (int h = 0; h < NQ; h++)
		acc[h] = 0;
#pragma unroll
	for (int u = 0; u < SCORE_SMAX / 4; u++) {
		if ((uint32_t)u >= S / 4)
			break;
		float fp[NQ], fn[NQ];
		loadq<NQ, LDG>((const float *)q8 + u * 2 * P, fp);
		loadq<NQ, LDG>((const float *)q8 + u * 2 * P + P, fn);
#pragma unroll
		for (int h = 0; h < NQ; h++) {
			acc[h] = __dp4a((int)__float_as_uint(fp[h]), (int)w[2 * u + 1], acc[h]);
			acc[h] = __dp4a((int)__float_as_uint(fn[h]), (int)w[2 * u], acc[h]);
		}
	}
	float qs[NQ], qv[NQ];
	loadq<NQ, LDG>((const float *)q8 + S / 4 * 2 * P, qs);
	if (qperp)
		loadq<NQ, LDG>(qperp, qv);
	float best = 0.0f;
#pragma unroll
	for (int h = 0; h < NQ; h++) {
		float x = __fmul_rn(__fmul_rn(qs[h], sc), __int2float_rn(acc[h]));
		if (qperp)
			x = __fadd_rn(x, __fmul_rn(qv[h], rest));
		best = h ? fmaxf(best, x) : x;
	}
	return best;
}

__device__ __forceinline__ void cp16(void *dst, const void *src)
{
	uint32_t sa = (uint32_t)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(src));
}

/* A tile's staged copy: summaries (16-byte pieces, swizzled so that the
 * lanes' row reads hit distinct banks) and the segment's split query. */
template <int P>
struct score_stage {
	uint4 mn[SCORE_T * SCORE_SMAX / 8], mx[SCORE_T * SCORE_SMAX / 8];
	float q[SCORE_SMAX * 2 * P];
};

/* The score kernel's pipeline: @NS stages of tiles (tile i + NS - 1's rows
 * are issued while tile i is scored), descriptors score_desc_ahead tiles
 * ahead in a ring of score_ring slots.  Two stages keep one tile in
 * flight a CTA between the waits; three (GPU_ATTN_SCORE_3STAGE) two, at
 * two CTAs an SM instead of three. */
__host__ __device__ constexpr uint32_t score_desc_ahead(int NS)
{
	return NS == 2 ? 2u : (uint32_t)NS + 1u;
}
__host__ __device__ constexpr uint32_t score_ring(int NS)
{
	return NS == 2 ? 4u : 8u;
}

template <int P, int NS = 2>
struct score_smem {
	struct score_stage<P> st[NS];
	struct score_tile d[score_ring(NS)]; /* descriptors, a ring: tile i at i % ring */
	struct {
		uint32_t key[HT_SLOTS]; /* fine bin + 1; 0: free */
		uint32_t cnt[HT_SLOTS];
	} ht;
};

/* Descriptor of tile @i to the ring (4 lanes, 16 bytes each). */
template <int P, int NS>
__device__ __forceinline__ void score_desc(struct score_smem<P, NS> &sm,
					   const struct score_tile *tl, uint32_t i)
{
	static_assert(sizeof(struct score_tile) == 64, "four 16-byte pieces");
	if (threadIdx.x < 4)
		cp16((uint4 *)&sm.d[i % score_ring(NS)] + threadIdx.x,
		     (const uint4 *)&tl[i] + threadIdx.x);
}

/* Piece p of a tile's rows lives at sw16(p): an XOR within each 128-byte
 * line, by the line's index, so 8 lanes reading 16 bytes of 8 consecutive
 * rows (1, 2 or 4 pieces a row) touch 8 distinct bank groups. */
__device__ __forceinline__ uint32_t sw16(uint32_t p) { return p ^ ((p >> 3) & 7); }

/* A tile's summaries (the caller's: may be issued before the programmatic-
 * launch wait) ... */
template <int P>
__device__ __forceinline__ void score_issue_rows(struct score_stage<P> &st,
						const struct score_tile &t)
{
	if (!t.staged)
		return;
	uint32_t np = t.nrow * (t.S / 8);
	if (t.q8) { /* 2S bytes a row, the rows after one another */
		for (uint32_t p = threadIdx.x; p < np; p += SCORE_T)
			cp16(&st.mn[sw16(p)], t.r8 + p);
		return;
	}
	for (uint32_t p = threadIdx.x; p < np; p += SCORE_T) {
		cp16(&st.mn[sw16(p)], t.mn + 8 * p);
		cp16(&st.mx[sw16(p)], t.mx + 8 * p);
	}
}

/* ... and its segment's split (or 8-bit) query, which k_qrot writes. */
template <int P>
__device__ __forceinline__ void score_issue_q(struct score_stage<P> &st, const struct score_tile &t,
					     const float *qpm)
{
	if (!t.staged)
		return;
	const uint32_t nq = t.q8 ? (q8_words(t.S, P) + 3) / 4 : t.S * 2 * P / 4;
	for (uint32_t p = threadIdx.x; p < nq; p += SCORE_T)
		cp16(&st.q[4 * p], qpm + 4 * p);
}

template <int P>
__device__ __forceinline__ void score_issue(struct score_stage<P> &st, const struct score_tile &t,
					   const float *qpm)
{
	score_issue_rows<P>(st, t);
	score_issue_q<P>(st, t, qpm);
}

/* A block scored from global memory: a tile that is not staged (@here),
 * or a row past the tile's segment.  Returns the score and, in .y, the
 * block's tokens.  Out of line: the staged path's registers stay its own. */
template <int NQ>
static __device__ __noinline__ float2 score_global(const struct gpu_head *H,
						   const struct score_tile &cur, const float *qr,
						   const float *qpm, uint32_t gb, uint32_t row, bool here)
{
	constexpr int P = NQP(NQ);
	uint32_t si = cur.si, j = cur.j0 + row, S = cur.S, b = cur.b, n = cur.n;
	const uint16_t *mn = cur.mn + (size_t)row * S, *mx = cur.mx + (size_t)row * S;
	const uint16_t *rest = cur.rest ? cur.rest + row : NULL;
	/* the tile's rows only where the row is in its segment (@here): past
	 * it, the next segment's below */
	bool q8 = here && cur.q8;
	const uint4 *r8 = q8 ? cur.r8 + (size_t)row * (S / 8) : NULL;
	float s8 = q8 ? __ldg(cur.sc8 + row) : 0.0f;
	if (!here) {
		si = seg_of_block(H->segs, H->nseg, gb);
		struct score_seg v = score_seg_of(&H->segs[si]);
		j = gb - v.block0;
		S = v.S;
		b = v.b;
		n = v.n;
		mn = v.mn + (size_t)j * S;
		mx = v.mx + (size_t)j * S;
		rest = v.rest ? v.rest + j : NULL;
		q8 = v.q8;
		r8 = q8 ? (const uint4 *)(v.s8 + (size_t)j * 2 * S) : NULL;
		s8 = q8 ? __ldg(v.sc8 + j) : 0.0f;
	}
	const float *qperp = qr + (size_t)si * QR_ROWS * P + (size_t)GPU_MAX_D * P;
	float rv = rest ? bf1(*rest) : 0.0f;
	if (q8) {
		uint32_t w[16];
#pragma unroll
		for (int k = 0; k < SCORE_SMAX / 8; k++) {
			uint4 x = (uint32_t)k < S / 8 ? __ldg(r8 + k) : make_uint4(0, 0, 0, 0);
			w[4 * k] = x.x; w[4 * k + 1] = x.y; w[4 * k + 2] = x.z; w[4 * k + 3] = x.w;
		}
		float sc = score8_row<NQ, true>((const uint32_t *)(qpm + (size_t)si * QPM_FLOATS(P)),
						w, S, s8, qperp, rv);
		return make_float2(sc, __uint_as_float(min(b, n - j * b)));
	}
	float sc = bound_score_pm<NQ, true>(qpm + (size_t)si * QPM_FLOATS(P), mn, mx, S, qperp,
						rv);
	return make_float2(sc, __uint_as_float(min(b, n - j * b)));
}

/*
 * The score: one thread per block of a tile, K tiles per CTA (the host
 * sizes K so that one wave of CTAs covers the contexts).  A tile's
 * summaries are copied to shared memory by cp.async one tile ahead, so
 * each CTA keeps a whole tile's bytes in flight while it scores the
 * previous one; the tiles' descriptors (qrot's) are loaded two ahead.
 * Rows past the tile's segment (a tile across a segment boundary), and
 * tiles whose summaries cannot be staged (S > SCORE_SMAX, or S not a
 * multiple of 8), are scored from global memory.  Same arithmetic as
 * bound_score_pm either way.
 */
template <int NQ, int NS = 2>
__global__ void __launch_bounds__(SCORE_T, 3) k_score(const struct gpu_head *heads, char *ws,
						   struct ws_layout L, uint32_t K)
{
	pdl_trigger();
	constexpr int P = NQP(NQ);
	constexpr uint32_t RING = score_ring(NS), DA = score_desc_ahead(NS);
	static_assert(NS >= 2 && NS <= 3, "k_score: two or three stages");
	extern __shared__ __align__(16) unsigned char score_dyn[];
	struct score_smem<P, NS> &sm = *(struct score_smem<P, NS> *)score_dyn;
	const struct gpu_head *H = &heads[blockIdx.y];
	uint32_t nb = H->n_blocks;
	uint32_t ntile = (nb + SCORE_T - 1) / SCORE_T, T0 = blockIdx.x * K;
	if (T0 >= ntile) {
		pdl_wait(); /* whole CTA */
		return;
	}
	uint32_t nt = min(K, ntile - T0);
	const struct score_tile *tl = WSP(const struct score_tile, L, tiles, ws, blockIdx.y) + T0;
	const float *qpm = WSP(const float, L, qpm, ws, blockIdx.y);
	const float *qr = WSP(const float, L, qr, ws, blockIdx.y);
	float *scores = WSP(float, L, scores, ws, blockIdx.y);
	uint8_t *ntok = WSP(uint8_t, L, ntok, ws, blockIdx.y);
	uint32_t *hist = HIST(ws, blockIdx.y);
	/* two stages take the early loads below, three none (not const: a
	 * constant 0 makes nvcc warn at each comparison with npre) */
	bool pre = NS == 2;
	for (uint32_t i = threadIdx.x; i < HT_SLOTS; i += SCORE_T) {
		sm.ht.key[i] = 0;
		sm.ht.cnt[i] = 0;
	}
	/* prologue.  @pre (two stages): the first two tiles'
	 * descriptors are built here (score_tile_of, the segment by a search
	 * in the caller's table, as k_qrot builds them) and their summaries
	 * issued into both stages before the programmatic-launch wait, so
	 * that where the CTA is resident while k_qrot runs those bytes arrive
	 * meanwhile; only the queries wait for k_qrot.  Else descriptors 0
	 * and 1 from k_qrot's table, then tile 0 (NS = 3: descriptors 0 to 3,
	 * then tiles 0 and 1; no early loads) */
	const uint32_t npre = pre && H->nseg ? min(nt, 2u) : 0u;
	if (npre) {
		const uint32_t w = threadIdx.x >> 5;
		if (w < npre) { /* a warp a tile */
			const uint32_t t = T0 + w;
			const uint32_t si = seg_of_block_warp(H->segs, H->nseg, t * SCORE_T);
			if ((threadIdx.x & 31) == 0)
				sm.d[w] = score_tile_of(&H->segs[si], si, t);
		}
		__syncthreads();
		score_issue_rows<P>(sm.st[0], sm.d[0]);
		if (npre > 1)
			score_issue_rows<P>(sm.st[1], sm.d[1]);
		asm volatile("cp.async.commit_group;");
		pdl_wait();
		score_issue_q<P>(sm.st[0], sm.d[0], qpm + (size_t)sm.d[0].si * QPM_FLOATS(P));
		asm volatile("cp.async.commit_group;");
	} else {
		pdl_wait();
		for (uint32_t t = 0; t < DA && t < nt; t++)
			score_desc<P, NS>(sm, tl, t);
		asm volatile("cp.async.commit_group;");
		asm volatile("cp.async.wait_group 0;" ::: "memory");
		__syncthreads();
#pragma unroll
		for (uint32_t t = 0; t + 1 < (uint32_t)NS; t++) {
			if (t < nt)
				score_issue<P>(sm.st[t], sm.d[t],
					       qpm + (size_t)sm.d[t].si * QPM_FLOATS(P));
			asm volatile("cp.async.commit_group;");
		}
	}
	const uint32_t row = threadIdx.x;
	for (uint32_t i = 0; i < nt; i++) {
		/* the row's remainder bound and 8-bit scale, issued before the
		 * wait (descriptor i is visible since the last barrier, and its
		 * slot is rewritten two tiles on): at their use they were 13 % of
		 * the 8-bit kernel's stall samples */
		uint16_t rest_raw = 0;
		float sc8_pre = 0.0f;
		{
			const struct score_tile &pre = sm.d[i % RING];
			const bool h0 = (T0 + i) * SCORE_T + row < nb && row < pre.nrow &&
					pre.staged;
			if (h0 && pre.rest)
				rest_raw = __ldg(pre.rest + row);
			if (h0 && pre.q8)
				sc8_pre = __ldg(pre.sc8 + row);
		}
		/* tile i's rows and descriptor i + NS - 1 have landed (the NS -
		 * 2 groups after tile i's may still fly); stage (i + NS - 1) % NS
		 * and ring slot (i + DA) % RING were last read before this
		 * barrier */
		asm volatile("cp.async.wait_group %0;" ::"n"(NS - 2) : "memory");
		__syncthreads();
		if (i + NS - 1 < nt) {
			const uint32_t j = i + NS - 1;
			const struct score_tile &dn = sm.d[j % RING];
			const float *qn = qpm + (size_t)dn.si * QPM_FLOATS(P);
			if (j < npre) /* its rows are on the way */
				score_issue_q<P>(sm.st[j % NS], dn, qn);
			else
				score_issue<P>(sm.st[j % NS], dn, qn);
		}
		if (i + DA < nt)
			score_desc<P, NS>(sm, tl, i + DA);
		asm volatile("cp.async.commit_group;");
		const struct score_tile &cur = sm.d[i % RING];
		uint32_t gb = (T0 + i) * SCORE_T + row;
		bool valid = gb < nb, here = valid && row < cur.nrow;
		const float *qperp = qr + (size_t)cur.si * QR_ROWS * P + (size_t)GPU_MAX_D * P;
		float sc = 0.0f;
		uint32_t w = 0;
		if (here && cur.staged && cur.q8) {
			float rest = cur.rest ? bf1(rest_raw) : 0.0f;
			const struct score_stage<P> &st = sm.st[i % NS];
			uint32_t pr = cur.S / 8, rw[16];
#pragma unroll
			for (int k = 0; k < SCORE_SMAX / 8; k++) {
				uint4 x = (uint32_t)k < pr ? st.mn[sw16(row * pr + k)]
							   : make_uint4(0, 0, 0, 0);
				rw[4 * k] = x.x; rw[4 * k + 1] = x.y;
				rw[4 * k + 2] = x.z; rw[4 * k + 3] = x.w;
			}
			sc = score8_row<NQ, false>((const uint32_t *)st.q, rw, cur.S, sc8_pre,
						   qperp, rest);
			w = min(cur.b, cur.n - (cur.j0 + row) * cur.b);
		} else if (here && cur.staged) {
			float rest = cur.rest ? bf1(rest_raw) : 0.0f;
			const struct score_stage<P> &st = sm.st[i % NS];
			uint32_t S = cur.S, pr = S / 8;
			float ap[NQ];
#pragma unroll
			for (int h = 0; h < NQ; h++)
				ap[h] = 0.0f;
			/* a piece at a time (bound_score_pm's order): no arrays of
			 * pieces held across the products */
#pragma unroll
			for (int u = 0; u < SCORE_SMAX / 8; u++) {
				if ((uint32_t)u >= pr)
					break;
				float fa[8], fb[8];
				unpack8(st.mn[sw16(row * pr + u)], fa);
				unpack8(st.mx[sw16(row * pr + u)], fb);
#pragma unroll
				for (int e = 0; e < 8; e++) {
					float qp[NQ], qn[NQ];
					load_pm<NQ, false>(st.q, 8 * u + e, qp, qn);
#pragma unroll
					for (int h = 0; h < NQ; h++)
						score_terms(ap[h], qp[h], qn[h], fa[e], fb[e]);
				}
			}
			sc = score_finish<NQ, true>(ap, qperp, rest);
			w = min(cur.b, cur.n - (cur.j0 + row) * cur.b);
		} else if (valid) {
			float2 r = score_global<NQ>(H, cur, qr, qpm, gb, row, here);
			sc = r.x;
			w = __float_as_uint(r.y);
		}
		if (valid) {
			scores[gb] = sc;
			ntok[gb] = (uint8_t)w;
		}
		hist_add_ht(sm.ht.key, sm.ht.cnt, hist, valid && gb >= 1, sc, w);
	}
	static_assert(sizeof(sm.st[0]) >= HIST_HI * sizeof(uint32_t), "the coarse bins in a stage");
	asm volatile("cp.async.wait_group 0;" ::: "memory");
	__syncthreads(); /* every lane's last tile read, every table add done */
	hist_flush_ht(sm.ht.key, sm.ht.cnt, (uint32_t *)&sm.st[0], hist);
}

/* Tiles per score CTA (@kern, one of k_score's instances): one wave of
 * CTAs over all contexts.  @pad: the dynamic shared memory asked for, if
 * more than the kernel uses (GPU_ATTN_SCORE_SPREAD: fewer CTAs an SM).
 * @nsm_out, if not NULL: the GPU's SMs. */
template <int NQ, int NS = 2, class KF>
static int score_grid(const struct gpu_attn_args *a, KF kern, uint32_t *K, uint32_t *gx,
		      size_t *smem, size_t pad = 0, int *nsm_out = NULL)
{
	*smem = sizeof(struct score_smem<NQP(NQ), NS>);
	if (pad > *smem)
		*smem = pad;
	GPU_CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    (int)*smem));
	int nsm = 0, per = 0, rc = sm_count(&nsm);
	if (rc)
		return rc;
	if (nsm_out)
		*nsm_out = nsm;
	GPU_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, SCORE_T, *smem));
	uint64_t slots = (uint64_t)(nsm > 0 ? nsm : 1) * (per > 0 ? per : 1);
	uint64_t tph = (a->max_blocks + SCORE_T - 1) / SCORE_T;
	uint64_t cph = slots / a->n_heads;
	if (cph < 1)
		cph = 1;
	uint64_t k = (tph + cph - 1) / cph;
	if (k < 1)
		k = 1;
	*K = (uint32_t)k;
	*gx = (uint32_t)((tph + k - 1) / k);
	return 0;
}

/* Whether the score kernel runs three stages of tiles: 1, or 0 (two
 * stages as the flags say), or -1 (two stages, spread or not as the
 * spread grid decides: launch_score_select).  The caller sizes other
 * grids only where they are launched or decide: the decode path launches
 * the step's kernels every step, not from a graph.  GPU_ATTN_SCORE_3STAGE
 * and GPU_ATTN_SCORE_2STAGE force them.
 *
 * By default two stages, spread (two CTAs an SM, as three stages have,
 * by shared memory the kernel does not use; its grid sized for that)
 * where the spread grid has more CTAs than SMs.  Paired on an H100
 * (forty-sixth session, bench/attn --pair), two stages spread against
 * three: 1.8 µs faster at 128K and 3.7 at 256K, batch 1; at batch 4
 * 1.2-4.2 faster from 128K to 1M, at batch 8 2.0-6.7 faster from 32K to
 * 1M (medians of 51 rounds; three was the default where the two-stage
 * grid gave a CTA eight tiles or more, the thirty-ninth session's 20-28 %
 * over two unspread, and at 128K-256K batch 1).  So three stages won by
 * the spread of their CTAs over the SMs, not by their second tile in
 * flight, and two spread keep their early loads.  Spread against two
 * unspread: 3.3 and 7.1 µs faster at 128K and 256K batch 1, even at
 * 512K-1M batch 1 (where the spread grid has fewer CTAs of more tiles);
 * 0.6 slower at 32K batch 1, where the grid (64 CTAs) is below the SMs
 * and is left unspread. */
static int score_three_stages(const struct gpu_attn_args *a)
{
	if (a->flags & (GPU_ATTN_SCORE_3STAGE | GPU_ATTN_SCORE_2STAGE))
		return (a->flags & GPU_ATTN_SCORE_3STAGE) ? 1 : 0;
	return -1;
}

/* Quest: bounds over all d channels of the dense keys, q unrotated. */
template <int NQ>
__global__ void __launch_bounds__(256) k_score_quest(const struct gpu_dense_head *heads,
						     const float *q, uint32_t d, uint32_t qb,
						     char *ws, struct ws_layout L)
{
	pdl_begin();
	__shared__ uint32_t sh_hi[HIST_HI];
	const struct gpu_dense_head *H = &heads[blockIdx.y];
	uint32_t nb = (uint32_t)((H->n + qb - 1) / qb);
	if (blockIdx.x * blockDim.x >= nb)
		return;
	constexpr int P = NQP(NQ);
	/* q split by sign (bound_score_pm, as PackedAttention's score) */
	__shared__ __align__(16) float qpm[QPM_FLOATS(P)];
	stage_qpm<NQ>(qpm, q + (size_t)blockIdx.y * NQ * d, d, 1, d);
	for (uint32_t i = threadIdx.x; i < HIST_HI; i += blockDim.x)
		sh_hi[i] = 0;
	__syncthreads();
	uint32_t gb = blockIdx.x * blockDim.x + threadIdx.x;
	bool valid = gb < nb;
	float sc = 0.0f;
	uint32_t w = 0;
	if (valid) {
		sc = bound_score_pm<NQ, false>(qpm, H->q_min + (size_t)gb * d,
						   H->q_max + (size_t)gb * d, d);
		w = (uint32_t)min((uint64_t)qb, H->n - (uint64_t)gb * qb);
		WSP(float, L, scores, ws, blockIdx.y)[gb] = sc;
		WSP(uint8_t, L, ntok, ws, blockIdx.y)[gb] = (uint8_t)w;
	}
	uint32_t *hist = HIST(ws, blockIdx.y);
	hist_add(sh_hi, hist + HIST_HI, valid && gb >= 1, sc, w);
	hist_flush(sh_hi, hist);
}

/* ------------------------------------------------------------------ */
/* select: one CTA of 1024 threads per context.                        */

#define SEL_T 1024
#define SEL_U 8 /* loads in flight per lane in the passes over the scores */

struct sel_src {
	uint32_t nb, nseg;
	uint64_t n_hist;
	const struct gpu_seg *segs; /* NULL: one segment starting at block 0 */
	const struct score_tile *tiles; /* qrot's tile descriptors (with segs) */
	uint32_t cwl; /* chunk width, log2 (ws_layout.cwl) */
	/* for lpt_order only (the count kernels set them): the update buffer
	 * (PackedAttention; NULL: none) and the dense window's tokens */
	const struct gpu_seg *buf;
	uint32_t win_n;
};

/* Select state of context h after the histograms (cleared every step):
 * the many-CTA select's tickets and counts, and the cut (SX_KSTAR,
 * SX_TMAX) every select leaves there for sel_take. */
enum { SX_DONE_B = 0, SX_DONE_D, SX_NCAND, SX_SLOW, SX_KSTAR, SX_TMAX, SX_NSEL,
       SX_CNT = 64, SX_OFF = 128 };
#define SELX(ws, h) (HIST(ws, h) + HIST_HI + HIST_LO)

__device__ __forceinline__ uint32_t block0_of(const struct sel_src &s, uint32_t si)
{
	return s.segs ? s.segs[si].block0 : 0;
}

/* Chunk key of a selected block: segment and aligned window of 1 << @cwl
 * blocks.  A segment of ours has fewer than 256 windows (at most 8,192
 * blocks: 128 windows of the narrowest chunks, 64 blocks); Quest's one
 * segment (si = 0) may have more, and its key is then the window index
 * alone: distinct windows, distinct keys either way. */
__device__ __forceinline__ uint32_t chunk_key(uint32_t si, uint32_t i, uint32_t blk0,
					      uint32_t cwl)
{
	return (si << 8) | ((i - blk0) >> cwl);
}

/* select_slow's take rule, one block at a time in index order: 0 not
 * taken, 1 taken, 2 taken as a tie (key == @kstar while the budget lasts:
 * *@P, the tie weight before @i, grows by block @i's tokens).  Both of its
 * passes call it so the count and the write cannot disagree. */
__device__ __forceinline__ int slow_take(uint32_t i, int mode, const float *scores,
					 const uint8_t *ntok, uint32_t kstar, uint64_t above,
					 uint64_t need, uint32_t *P)
{
	if (i == 0 || mode == 1)
		return 1;
	if (mode == 2)
		return 0;
	uint32_t k = fkey(scores[i]);
	if (k > kstar)
		return 1;
	if (k != kstar)
		return 0;
	bool s = above + *P < need;
	*P += ntok[i];
	return s ? 2 : 0;
}

/* The general path (v1): three radix passes over all scores in global
 * memory (L2), then an ordered compaction over contiguous per-thread
 * ranges.  Used when the histogram path finds too many candidates (many
 * equal scores).  Returns the number selected. */
__device__ uint32_t select_slow(const struct sel_src &src, uint64_t need, int mode, char *ws,
				const struct ws_layout &L, uint32_t h)
{
	__shared__ uint32_t hist[2048];
	__shared__ uint32_t scan_sh[33];
	__shared__ uint32_t sh_digit, sh_above;
	const float *scores = WSP(float, L, scores, ws, h);
	const uint8_t *ntok = WSP(uint8_t, L, ntok, ws, h);
	uint32_t *sel = WSP(uint32_t, L, sel, ws, h);
	uint32_t *selseg = WSP(uint32_t, L, selseg, ws, h);
	uint32_t tid = threadIdx.x, nb = src.nb;
	uint32_t prefix = 0, pmask = 0;
	uint64_t above = 0;
	const int shifts[3] = {21, 10, 0};
	const uint32_t dmasks[3] = {0x7ffu, 0x7ffu, 0x3ffu};
	for (int pass = 0; pass < 3 && mode == 0; pass++) {
		int sh = shifts[pass];
		uint32_t dm = dmasks[pass];
		for (uint32_t i = tid; i < 2048; i += SEL_T)
			hist[i] = 0;
		__syncthreads();
		for (uint32_t b0 = 0; b0 < nb; b0 += SEL_T) {
			uint32_t i = b0 + tid, bin = 0xffffffffu, wt = 0;
			if (i >= 1 && i < nb) {
				uint32_t k = fkey(scores[i]);
				if ((k & pmask) == prefix) {
					bin = (k >> sh) & dm;
					wt = ntok[i];
				}
			}
			/* aggregate equal bins of a warp: scores cluster in few bins */
			uint32_t peers = __match_any_sync(0xffffffffu, bin);
			uint32_t sum = __reduce_add_sync(peers, wt);
			if (bin != 0xffffffffu && (tid & 31) == (uint32_t)(__ffs(peers) - 1))
				atomicAdd(&hist[bin], sum);
		}
		__syncthreads();
		/* thread t owns bins hb0 = 2047-2t and hb1 = 2046-2t (descending) */
		uint32_t hb0 = 2047 - 2 * tid, hb1 = hb0 - 1;
		uint32_t v0 = hist[hb0], v1 = hist[hb1], tot;
		uint32_t ex = block_excl_scan(v0 + v1, scan_sh, &tot);
		if (pass == 0 && (uint64_t)tot < need) {
			mode = 1; /* everything fits the budget */
			break;
		}
		uint64_t a0 = above + ex;
		if (a0 < need && a0 + v0 >= need) {
			sh_digit = hb0;
			sh_above = ex;
		} else if (a0 + v0 < need && a0 + v0 + v1 >= need) {
			sh_digit = hb1;
			sh_above = ex + v0;
		}
		__syncthreads();
		prefix |= sh_digit << sh;
		pmask |= dm << sh;
		above += sh_above;
		__syncthreads();
	}
	uint32_t kstar = prefix;
	/* Final pass over contiguous ranges, in block order. */
	uint32_t E = (nb + SEL_T - 1) / SEL_T;
	uint32_t i0 = min(nb, tid * E), i1 = min(nb, i0 + E);
	uint32_t tiew = 0;
	if (mode == 0)
		for (uint32_t i = max(i0, 1u); i < i1; i++)
			if (fkey(scores[i]) == kstar)
				tiew += ntok[i];
	uint32_t tot;
	uint32_t P0 = block_excl_scan(tiew, scan_sh, &tot), P = P0;
	uint32_t cnt = 0, tmax = 0;
	for (uint32_t i = i0; i < i1; i++) {
		int t = slow_take(i, mode, scores, ntok, kstar, above, need, &P);
		if (t == 2)
			tmax = i; /* ties are taken in index order */
		cnt += t != 0;
	}
	/* the cut as sel_take reads it (every select leaves it) */
	__syncthreads();
	if (tid == 0)
		sh_digit = 0;
	__syncthreads();
	if (tmax)
		atomicMax(&sh_digit, tmax);
	__syncthreads();
	if (tid == 0) {
		uint32_t *X = SELX(ws, h);
		X[SX_KSTAR] = mode == 1 ? 0u : mode == 2 ? 0xffffffffu : kstar;
		X[SX_TMAX] = mode == 0 ? sh_digit : 0u;
	}
	__syncthreads();
	if (L.cut_only)
		return 0;
	uint32_t nsel;
	uint32_t off = block_excl_scan(cnt, scan_sh, &nsel);
	P = P0;
	if (i0 < i1) {
		uint32_t si = src.segs ? seg_of_block(src.segs, src.nseg, i0) : 0;
		uint32_t *selkey = WSP(uint32_t, L, selkey, ws, h);
		for (uint32_t i = i0; i < i1; i++) {
			while (src.segs && si + 1 < src.nseg && src.segs[si + 1].block0 <= i)
				si++;
			if (slow_take(i, mode, scores, ntok, kstar, above, need, &P)) {
				sel[off] = i;
				selseg[off] = si;
				selkey[off] = chunk_key(si, i, block0_of(src, si), src.cwl);
				off++;
			}
		}
	}
	__syncthreads();
	return nsel;
}

/* Chunks: a new one where the chunk key (segment, aligned window of
 * 1 << cwl blocks) changes.  Warp w handles list positions
 * [w Q, (w+1) Q): count its chunk starts, scan the 32 counts, write the
 * starts in order. */
__device__ void build_chunks(const struct sel_src &src, uint32_t nsel, char *ws,
			     const struct ws_layout &L, uint32_t h, uint32_t *scan_sh)
{
	const uint32_t *key = WSP(uint32_t, L, selkey, ws, h);
	uint32_t *chunk = WSP(uint32_t, L, chunk, ws, h);
	uint32_t *counts = WSP(uint32_t, L, counts, ws, h);
	uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	uint32_t Q = (((nsel + 31) / 32) + 31) & ~31u;
	uint32_t p0 = min(nsel, w * Q), p1 = min(nsel, p0 + Q);
	uint32_t cnt = 0;
	for (uint32_t b0 = p0; b0 < p1; b0 += 32 * SEL_U) {
		uint32_t k1[SEL_U], k0[SEL_U];
#pragma unroll
		for (int u = 0; u < SEL_U; u++) {
			uint32_t p = b0 + 32 * u + lane;
			k1[u] = p < p1 ? __ldcg(&key[p]) : 0;
			k0[u] = p < p1 && p > 0 ? __ldcg(&key[p - 1]) : ~0u;
		}
#pragma unroll
		for (int u = 0; u < SEL_U; u++) {
			uint32_t p = b0 + 32 * u + lane;
			cnt += p < p1 && (p == 0 || k1[u] != k0[u]);
		}
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
	if (lane == 0)
		scan_sh[w] = cnt;
	__syncthreads();
	if (w == 0) {
		uint32_t v = scan_sh[lane], x = warp_incl_scan(v);
		scan_sh[lane] = x - v;
		if (lane == 31)
			scan_sh[32] = x;
	}
	__syncthreads();
	uint32_t off = scan_sh[w];
	for (uint32_t b0 = p0; b0 < p1; b0 += 32 * SEL_U) {
		uint32_t k1[SEL_U], k0[SEL_U];
#pragma unroll
		for (int u = 0; u < SEL_U; u++) {
			uint32_t p = b0 + 32 * u + lane;
			k1[u] = p < p1 ? __ldcg(&key[p]) : 0;
			k0[u] = p < p1 && p > 0 ? __ldcg(&key[p - 1]) : ~0u;
		}
#pragma unroll
		for (int u = 0; u < SEL_U; u++) {
			uint32_t p = b0 + 32 * u + lane;
			bool f = p < p1 && (p == 0 || k1[u] != k0[u]);
			uint32_t bal = __ballot_sync(0xffffffffu, f);
			if (f)
				chunk[off + __popc(bal & ((1u << lane) - 1u))] = p;
			off += __popc(bal);
		}
	}
	if (threadIdx.x == 0) {
		chunk[scan_sh[32]] = nsel;
		counts[0] = nsel;
		counts[1] = scan_sh[32];
	}
}

#define SEL_CAP 8192

struct sel_smem {
	uint32_t ckey[SEL_CAP]; /* candidate keys */
	uint32_t ciw[SEL_CAP];  /* candidate (index << 8) | tokens */
	uint32_t h[HIST_HI];
	uint32_t wcnt[64], woff[32]; /* per warp (one CTA) or per CTA range (many) */
	uint32_t scan[33];
	uint32_t ncand, digit, abv, tie_max, ntie;
	uint32_t lwn[SEL_T]; /* msel_count's early window entries (lpt_window) */
};

/*
 * From the score kernel's histograms (@ghist: top 11 bits, then top 16
 * bits, weights in tokens): the 16-bit key prefix of the bin where the
 * budget @need runs out and, in *@abovep, the weight of the blocks above
 * that bin.  *@modep: 0 radix select (may become 1: everything fits), 1 take
 * all (prefix 0), 2 only the sink (prefix 0xffff).  All SEL_T threads.
 */
__device__ uint32_t sel_cut16(const uint32_t *ghist, uint64_t need, int *modep,
			      uint64_t *abovep, struct sel_smem &sm)
{
	uint32_t tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	uint64_t above = 0;
	uint32_t prefix16 = 0xffffu; /* mode 2: nothing but the sink */
	int mode = *modep;
	if (mode == 0) {
		for (uint32_t i = tid; i < HIST_HI; i += SEL_T)
			sm.h[i] = ghist[i];
		__syncthreads();
		uint32_t hb0 = 2047 - 2 * tid, hb1 = hb0 - 1;
		uint32_t v0 = sm.h[hb0], v1 = sm.h[hb1], tot;
		uint32_t ex = block_excl_scan(v0 + v1, sm.scan, &tot);
		if ((uint64_t)tot < need) {
			mode = 1;
		} else {
			uint64_t a0 = ex;
			if (a0 < need && a0 + v0 >= need) {
				sm.digit = hb0;
				sm.abv = ex;
			} else if (a0 + v0 < need && a0 + v0 + v1 >= need) {
				sm.digit = hb1;
				sm.abv = ex + v0;
			}
		}
		__syncthreads();
		if (mode == 0) {
			uint32_t d1 = sm.digit;
			above = sm.abv;
			__syncthreads();
			if (w == 0) {
				uint32_t v = ghist[HIST_HI + (d1 << 5) + 31 - lane], x = warp_incl_scan(v);
				if (above + x - v < need && above + x >= need) {
					sm.digit = 31 - lane;
					sm.abv = x - v;
				}
			}
			__syncthreads();
			prefix16 = (d1 << 5) | sm.digit;
			above += sm.abv;
		}
	}
	if (mode == 1)
		prefix16 = 0; /* every real key's top 16 bits are above 0 */
	*modep = mode;
	*abovep = above;
	return prefix16;
}

/*
 * The exact cut-off key among the @nc candidates in sm.ckey / sm.ciw (the
 * blocks of the 16-bit bin @prefix16, weight @above above it): two 8-bit
 * radix passes; then the candidates taken (above the cut-off, and ties in
 * index order while the budget lasts) are counted into sm.wcnt[index / @R]
 * and the largest tie taken goes to sm.tie_max.  Returns the cut-off key.
 * All SEL_T threads.
 */
__device__ uint32_t sel_exact(uint32_t nc, uint32_t prefix16, int mode, uint64_t need,
			      uint64_t above, uint32_t R, struct sel_smem &sm)
{
	uint32_t tid = threadIdx.x;
	uint32_t kstar = 0xffffffffu;
	if (mode == 1)
		kstar = 0;
	if (mode == 0) {
		uint32_t prefix = prefix16 << 16, pmask = 0xffff0000u;
		for (int sh = 8; sh >= 0; sh -= 8) {
			for (uint32_t i = tid; i < 256; i += SEL_T)
				sm.h[i] = 0;
			__syncthreads();
			for (uint32_t c = tid; c < nc; c += SEL_T) {
				uint32_t k = sm.ckey[c];
				if ((k & pmask) == prefix)
					atomicAdd(&sm.h[(k >> sh) & 255u], sm.ciw[c] & 255u);
			}
			__syncthreads();
			uint32_t v = tid < 256 ? sm.h[255 - tid] : 0, tot;
			uint32_t ex = block_excl_scan(v, sm.scan, &tot);
			if (tid < 256 && above + ex < need && above + ex + v >= need) {
				sm.digit = 255 - tid;
				sm.abv = ex;
			}
			__syncthreads();
			prefix |= sm.digit << sh;
			pmask |= 255u << sh;
			above += sm.abv;
			__syncthreads();
		}
		kstar = prefix;
	}
	/* ties (key == K*) in index order; per-warp counts of candidates
	 * taken.  A tie's weight before it sums over the ties alone, gathered
	 * first into sm.h (free after the radix passes): summed over every
	 * candidate, it was a serial O(nc) loop in the thread of each tie (the
	 * cut-off block itself is one), and where the cut's bin is full that
	 * loop was most of the select: Quest's count kernel at 1M tokens,
	 * batch 1, 44-45 µs with it, 16.5 without; ours 16-17.6 -> 13.6-15
	 * (ncu on the H200, gpu/NOTES.md, twenty-ninth session) */
	if (tid == 0) {
		sm.tie_max = 0;
		sm.ntie = 0;
	}
	__syncthreads();
	if (mode == 0)
		for (uint32_t c = tid; c < nc; c += SEL_T)
			if (sm.ckey[c] == kstar) {
				uint32_t t = atomicAdd(&sm.ntie, 1u);
				if (t < HIST_HI)
					sm.h[t] = sm.ciw[c];
			}
	__syncthreads();
	const uint32_t nt = sm.ntie; /* > HIST_HI: the list is partial */
	for (uint32_t c = tid; c < nc; c += SEL_T) {
		uint32_t k = sm.ckey[c], iw = sm.ciw[c], idx = iw >> 8;
		bool take = k > kstar;
		if (k == kstar && mode == 0) {
			uint64_t P = 0;
			if (nt <= HIST_HI) {
				for (uint32_t t = 0; t < nt; t++)
					if ((sm.h[t] >> 8) < idx)
						P += sm.h[t] & 255u;
			} else {
				for (uint32_t c2 = 0; c2 < nc; c2++)
					if (sm.ckey[c2] == kstar && (sm.ciw[c2] >> 8) < idx)
						P += sm.ciw[c2] & 255u;
			}
			take = above + P < need;
			if (take)
				atomicMax(&sm.tie_max, idx);
		}
		if (take)
			atomicAdd(&sm.wcnt[idx / R], 1u);
	}
	return kstar;
}

/*
 * Candidate pass of one warp over blocks [@r0, @r1), SEL_U loads in flight
 * per lane: returns (in every lane) the count of blocks whose key's top 16
 * bits are above @prefix16 (the sink, block 0, not counted); the blocks
 * of that bin are appended at *@ncand (a shared or global counter) to
 * @ckey (keys) and @ciw ((index << 8) | tokens) while below SEL_CAP.
 * @g32 (lpt_order's granules; @r0 a multiple of 32), unless NULL: for
 * each 32 blocks from @r0 the count of those at or above the bin, the sink
 * included.
 */
__device__ uint32_t sel_scan_warp(const float *scores, const uint8_t *ntok, uint32_t r0,
				  uint32_t r1, uint32_t prefix16, uint32_t *ncand, uint32_t *ckey,
				  uint32_t *ciw, uint8_t *g32 = NULL)
{
	uint32_t lane = threadIdx.x & 31, cnt = 0;
	for (uint32_t b0 = r0; b0 < r1; b0 += 32 * SEL_U) {
		float sc[SEL_U];
		uint32_t wt[SEL_U];
#pragma unroll
		for (int u = 0; u < SEL_U; u++) {
			uint32_t i = b0 + u * 32 + lane;
			sc[u] = i < r1 ? scores[i] : 0.0f;
			wt[u] = i < r1 ? ntok[i] : 0;
		}
#pragma unroll
		for (int u = 0; u < SEL_U; u++) {
			uint32_t i = b0 + u * 32 + lane;
			bool ok = i < r1 && i >= 1;
			uint32_t k = fkey(sc[u]), t16 = k >> 16;
			cnt += ok && t16 > prefix16;
			bool cand = ok && t16 == prefix16;
			if (g32) { /* @r0 is a multiple of 32: lane 0's block starts a granule */
				uint32_t up = __ballot_sync(0xffffffffu,
							    i < r1 && (i == 0 || t16 >= prefix16));
				if (lane == 0 && i < r1)
					g32[i >> 5] = (uint8_t)__popc(up);
			}
			uint32_t bal = __ballot_sync(0xffffffffu, cand);
			if (bal) {
				uint32_t basepos = 0;
				if (lane == 0)
					basepos = atomicAdd(ncand, (uint32_t)__popc(bal));
				basepos = __shfl_sync(0xffffffffu, basepos, 0);
				uint32_t pos = basepos + __popc(bal & ((1u << lane) - 1u));
				if (cand && pos < SEL_CAP) {
					ckey[pos] = k;
					ciw[pos] = (i << 8) | wt[u];
				}
			}
		}
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
	return cnt;
}

/* Whether block @i of key @k is selected once the cut-off is known: the
 * sink, keys above the cut-off, and ties up to the last one taken. */
__device__ __forceinline__ bool sel_take(uint32_t i, uint32_t k, uint32_t kstar, uint32_t tmax)
{
	return i == 0 || k > kstar || (k == kstar && tmax && i <= tmax);
}

/* Write pass of one warp over [@r0, @r1) from list position @pos: the
 * selected ids, their segments and chunk keys, in block order (@sel NULL:
 * count only).  Returns (every lane) the number selected. */
__device__ uint32_t sel_write_warp(const struct sel_src &src, const float *scores, uint32_t r0,
				   uint32_t r1, uint32_t kstar, uint32_t tmax, uint32_t pos,
				   uint32_t *sel, uint32_t *selseg, uint32_t *selkey)
{
	uint32_t lane = threadIdx.x & 31, si = 0, pos0 = pos;
	if (sel && src.segs && r0 + lane < r1) {
		/* the segment of the lane's first block: from its score tile's
		 * descriptor (one load; then walked forward as blocks are taken),
		 * searched for only where that is not at or before the block
		 * (a chain of six dependent loads at 64 segments: ncu, 30 % of
		 * k_msel_write's stall samples) */
		uint32_t i = r0 + lane;
		si = src.tiles ? src.tiles[i / SCORE_T].si : src.nseg;
		if (si >= src.nseg || src.segs[si].block0 > i)
			si = seg_of_block(src.segs, src.nseg, i);
	}
	uint32_t blk0 = block0_of(src, si);
	for (uint32_t b0 = r0; b0 < r1; b0 += 32 * SEL_U) {
		float sc[SEL_U];
#pragma unroll
		for (int u = 0; u < SEL_U; u++) {
			uint32_t i = b0 + u * 32 + lane;
			sc[u] = i < r1 ? scores[i] : 0.0f;
		}
#pragma unroll
		for (int u = 0; u < SEL_U; u++) {
			uint32_t i = b0 + u * 32 + lane;
			bool take = i < r1 && sel_take(i, fkey(sc[u]), kstar, tmax);
			uint32_t bal = __ballot_sync(0xffffffffu, take);
			if (take && sel) {
				while (src.segs && si + 1 < src.nseg && src.segs[si + 1].block0 <= i) {
					si++;
					blk0 = src.segs[si].block0;
				}
				uint32_t p = pos + __popc(bal & ((1u << lane) - 1u));
				sel[p] = i;
				selseg[p] = si;
				selkey[p] = chunk_key(si, i, blk0, src.cwl);
			}
			pos += __popc(bal);
		}
	}
	return pos - pos0;
}

/*
 * The fast path.  The score kernel left weight histograms of the keys' top
 * 11 and top 16 bits; two look-ups narrow the cut-off to one 16-bit bin
 * (1/128 of an octave), one coalesced pass collects that bin's blocks
 * (typically a few hundred) into shared memory and counts, per warp, the
 * blocks above it; two 8-bit passes over the candidates give the exact
 * cut-off key; ties go to the lower index; a second coalesced pass writes
 * the selection in block order.  Returns the number selected, or
 * UINT32_MAX (nothing written) when the candidates overflow SEL_CAP.
 * The cut goes to SELX (sel_take); L.cut_only: no second pass (returns 0).
 */
__device__ uint32_t select_fast(const struct sel_src &src, uint64_t need, int mode, char *ws,
				const struct ws_layout &L, uint32_t h, struct sel_smem &sm)
{
	const float *scores = WSP(float, L, scores, ws, h);
	const uint8_t *ntok = WSP(uint8_t, L, ntok, ws, h);
	uint32_t *sel = WSP(uint32_t, L, sel, ws, h);
	uint32_t *selseg = WSP(uint32_t, L, selseg, ws, h);
	const uint32_t *ghist = HIST(ws, h);
	uint32_t tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nb = src.nb;
	uint64_t above = 0;
	uint32_t prefix16 = sel_cut16(ghist, need, &mode, &above, sm);
	if (tid == 0)
		sm.ncand = 0;
	__syncthreads();
	/* candidate pass, warp-contiguous ranges */
	uint32_t R = (((nb + 31) / 32) + 31) & ~31u;
	uint32_t r0 = min(nb, w * R), r1 = min(nb, r0 + R);
	uint32_t cnt = sel_scan_warp(scores, ntok, r0, r1, prefix16, &sm.ncand, sm.ckey, sm.ciw,
				     L.lpt ? WSP(uint8_t, L, g32, ws, h) : NULL);
	if (lane == 0)
		sm.wcnt[w] = cnt + (w == 0 && nb > 0); /* the sink */
	__syncthreads();
	uint32_t nc = sm.ncand;
	if (nc > SEL_CAP)
		return UINT32_MAX; /* uniform */
	uint32_t kstar = sel_exact(nc, prefix16, mode, need, above, R, sm);
	__syncthreads();
	if (tid == 0) { /* the cut as sel_take reads it (every select leaves it) */
		uint32_t *X = SELX(ws, h);
		X[SX_KSTAR] = kstar;
		X[SX_TMAX] = sm.tie_max;
	}
	if (L.cut_only)
		return 0;
	if (w == 0) {
		uint32_t v = sm.wcnt[lane], x = warp_incl_scan(v);
		sm.woff[lane] = x - v;
		if (lane == 31)
			sm.ncand = x; /* reused: the total */
	}
	__syncthreads();
	uint32_t nsel = sm.ncand, tmax = sm.tie_max;
	sel_write_warp(src, scores, r0, r1, kstar, tmax, sm.woff[w], sel, selseg,
		       WSP(uint32_t, L, selkey, ws, h));
	__syncthreads();
	return nsel;
}

/* Tokens still wanted after the sink (block 0, whose @ntok[0] tokens are
 * always kept) and the mode: 0 radix select, 2 nothing but the sink. */
__device__ uint64_t sel_need(const struct sel_src &src, double frac, const uint8_t *ntok,
			     int *mode)
{
	uint64_t budget = frac >= 1.0 ? src.n_hist : (uint64_t)ceil(frac * (double)src.n_hist);
	uint64_t w0 = ntok[0];
	uint64_t need = budget > w0 ? budget - w0 : 0;
	*mode = need == 0 ? 2 : 0;
	return need;
}

static __device__ __forceinline__ void lpt_order(const struct sel_src &src, char *ws,
					       const struct ws_layout &L, uint32_t h, uint32_t nh,
					       struct sel_smem &sm, bool bound);

/* One CTA's select of context @h, in a launch of one CTA a context along
 * x (k_select, k_select_quest: gridDim.x contexts, which lpt_order needs
 * for the segment notes' stride).  Where L.lpt is set (cut-only steps
 * with windows of 512 or GPU_ATTN_SELECT_ORDER: lpt_of) it then orders the attention CTAs
 * as the many-CTA select's last CTA does (lpt_order), from the granules
 * its candidate pass wrote. */
__device__ void select_run(const struct sel_src src, double frac, char *ws,
			   const struct ws_layout &L, uint32_t h)
{
	extern __shared__ __align__(16) unsigned char sel_raw[];
	struct sel_smem &sm = *(struct sel_smem *)sel_raw;
	uint32_t nb = src.nb;
	uint32_t nsel = 0;
	bool slow = false;
	if (nb > 0) {
		int mode;
		uint64_t need = sel_need(src, frac, WSP(uint8_t, L, ntok, ws, h), &mode);
		nsel = select_fast(src, need, mode, ws, L, h, sm);
		if (nsel == UINT32_MAX) { /* uniform */
			nsel = select_slow(src, need, mode, ws, L, h);
			slow = true;
		}
	} else if (threadIdx.x == 0) { /* nothing to take */
		SELX(ws, h)[SX_KSTAR] = 0xffffffffu;
		SELX(ws, h)[SX_TMAX] = 0;
	}
	if (L.lpt) {
		/* the select's shared arrays and granules are done; without
		 * the exact cut (select_slow) no idle marks, as msel_count */
		__syncthreads();
		lpt_order(src, ws, L, h, gridDim.x, sm, !slow);
	}
	if (!L.cut_only)
		build_chunks(src, nsel, ws, L, h, sm.scan);
}

__global__ void __launch_bounds__(SEL_T) k_select(const struct gpu_head *heads, double frac,
						  char *ws, struct ws_layout L)
{
	pdl_begin();
	const struct gpu_head *H = &heads[blockIdx.x];
	struct sel_src s = {H->n_blocks, H->nseg, H->n_hist, H->segs,
			    WSP(const struct score_tile, L, tiles, ws, blockIdx.x), L.cwl,
			    H->buf, H->win_n};
	select_run(s, frac, ws, L, blockIdx.x);
}

__global__ void __launch_bounds__(SEL_T) k_select_quest(const struct gpu_dense_head *heads,
							uint32_t qb, double frac, char *ws,
							struct ws_layout L)
{
	pdl_begin();
	const struct gpu_dense_head *H = &heads[blockIdx.x];
	struct sel_src s = {(uint32_t)((H->n + qb - 1) / qb), 1, H->n, NULL, NULL, L.cwl};
	select_run(s, frac, ws, L, blockIdx.x);
}

/* ------------------------------------------------------------------ */
/* select over many CTAs per context (for few, long contexts; see     */
/* msel_grid).                                                          */
/*
 * One CTA per context left ~47 µs at 1M tokens on the H200 (ncu, eight
 * CTAs of 1024 threads on eight SMs, 13.7 cycles per issue: every pass
 * over 65,536 scores ran on one SM).  Here each context's blocks are cut
 * into ranges of R (a multiple of 1024), one CTA each, in two launches:
 *   count  every CTA derives the 16-bit bin from the histograms (the same
 *          arithmetic everywhere), counts its blocks above the bin and
 *          appends the bin's blocks to a candidate list; the last CTA of
 *          the context to finish (ticket after a fence) copies the
 *          candidates to shared memory, cuts them exactly (sel_exact), and
 *          turns the per-CTA counts into list offsets;
 *   write  every CTA writes its selected blocks at its offset, in block
 *          order; the last one builds the chunk list.
 * The selection is the one k_select makes (same cut, same ties), bit for
 * bit (test: select_many_ctas_equals_one_cta).  When the bin holds more
 * than SEL_CAP candidates the count launch's last CTA runs select_slow
 * itself and the write launch only builds the chunks.
 */
#define MSEL_MAXC 64 /* CTAs per context at most */

/* After each thread's writes: true in the CTA that finished last among
 * the grid's row (blockIdx.y), which then sees every CTA's writes. */
__device__ bool last_cta_in_row(uint32_t *ticket, bool *sh_last)
{
	/* the barrier orders the CTA's writes before thread 0's fence, which
	 * is cumulative: one fence a CTA, not 1024 (ncu: the fence was the
	 * count kernel's most sampled instruction) */
	__syncthreads();
	if (threadIdx.x == 0) {
		__threadfence();
		*sh_last = atomicAdd(ticket, 1u) == gridDim.x - 1;
	}
	__syncthreads();
	bool last = *sh_last;
	if (last)
		__threadfence();
	return last;
}

/*
 * The attention kernel's dispatch order (ws_layout.lpt): context @h's
 * slots by decreasing work, so that the step's last CTAs are its lightest
 * (longest processing time first).  Why: a CTA's time is a fixed cost plus
 * ~1,300 cycles a selected block, windows hold 20 ± 9 blocks at 1M tokens
 * (bench/attn), and in slot order the CTAs dispatched last were as heavy
 * as any: the SMs drained for the last ~20 % of the kernel
 * (bench/cta_probe.py; a replay of the recorded CTA times in this order
 * came out 15 % shorter).  Measured (H200, 1M tokens, batch 1, one run):
 * the step 219.5 -> 217.1 µs, this function's cost in the select
 * included, whose granule loop then waited a round trip a granule (its
 * loads go out at once since: not yet run on a GPU); with one slot a
 * window instead of two (the second slots' empty CTAs gone) 211.7.
 *
 * A window's work is its granules' counts from the count pass (blocks at
 * or above the cut's bin: what window_take takes, but for the bin's few
 * candidates), a granule counted in every window it meets, so that the
 * count is at least what window_take will take; its parts split it as
 * window_take does; a chunk of the update buffer counts its blocks, a
 * tile of the dense window its tokens / 16.  All SEL_T threads of the
 * context's last count CTA; sm.h, sm.ckey and sm.ciw are free by then.
 *
 * A slot of no work is written as slot | GPU_ORDER_IDLE: its CTA marks its
 * partial empty and returns after reading its entry, where it waited on
 * two more round trips and two barriers (the window's entry, its scores:
 * an empty CTA took 2,828 cycles, H200, 1M tokens, bench/cta_probe.py;
 * half the slots at 1M are empty, and the order runs them last, where
 * the SMs drain).  Exact for the dense window's tiles, the buffer's
 * chunks and windows past the table's count.  For a window's parts it
 * holds only where @bound (the cut lies in the count pass's bin: not after
 * select_slow, whose cut was found apart from that bin), and those parts
 * then count in their segment's note here, as packed_cta_work would have
 * counted them (k_segrot reads the notes after the attention kernel).
 * GPU_ATTN_NO_IDLE (L.lpt without bit 1) writes no marks.
 *
 * In parts: lpt_heads and lpt_window read (the buffer, the window count,
 * each window's entry and granules), lpt_rank orders.  lpt_order runs
 * them one after another; msel_count issues the reads beside its
 * candidates' before the exact cut, and ranks after it.
 */

/* Whether lpt_order has room for context @src's order in its scratch
 * (else the slot order), and its windows' table entries (mw). */
static __device__ __forceinline__ bool lpt_room(const struct sel_src &src,
						const struct ws_layout &L)
{
	static_assert(SEL_CAP >= 1u << 9 && HIST_HI > 1u << 9, "lpt_order's scratch");
	return L.slots <= SEL_CAP && src.cwl <= 9 && L.max_segs < 1u << 22;
}

static __device__ __forceinline__ uint32_t lpt_mw(const struct ws_layout &L)
{
	return min(L.max_chunks >> L.pl, (uint32_t)SEL_CAP);
}

/* What lpt_order reads before the windows: the update buffer's size and
 * block (for its chunks) and the window count. */
struct lpt_in {
	uint32_t bn, bb, nw;
};

static __device__ __forceinline__ struct lpt_in lpt_heads(const struct sel_src &src, char *ws,
							 const struct ws_layout &L, uint32_t h)
{
	const uint32_t *wd = WSP(const uint32_t, L, wdesc, ws, h);
	struct lpt_in in = {0, 1, 0};
	if (src.buf) {
		in.bn = src.buf->n;
		in.bb = src.buf->b;
	}
	in.nw = src.segs ? __ldcg(&wd[WDESC_COUNT(L.max_chunks)])
			 : (src.nb + (1u << src.cwl) - 1) >> src.cwl;
	return in;
}

/* Window @wx's entry for the order: its segment (<< 10) beside the blocks
 * its granules hold at or above the cut's bin (<= 512).  @e: its
 * descriptor (with segments; read whether or not the window exists: the
 * table's words hold max_chunks >> pl entries). */
static __device__ __forceinline__ uint32_t lpt_window(const struct sel_src &src,
						      const uint8_t *g32, uint32_t wx,
						      uint32_t nw, uint4 e)
{
	uint32_t a0, a1, si = 0;
	if (src.segs) { /* the segment's index in e.x (< 2^22: lpt_room) */
		a0 = e.y;
		a1 = e.z;
		si = e.x;
	} else {
		a0 = wx << src.cwl;
		a1 = min(src.nb, a0 + (1u << src.cwl));
	}
	if (wx >= nw)
		a1 = a0;
	/* the granules [a0, a1) meets: the one it starts inside (if any: a
	 * window's start need not be a multiple of 32), then those starting
	 * in it, at most cw / 32 + 1; every load of a thread issued at once
	 * (a loop over granules was a round trip each) */
	const uint32_t g0 = (a0 + 31) >> 5, g1 = a1 > a0 ? (a1 + 31) >> 5 : g0;
	uint32_t n = a1 > a0 && (a0 & 31u) ? __ldcg(g32 + (a0 >> 5)) : 0u;
#pragma unroll
	for (uint32_t k = 0; k < (1u << 9) / 32 + 1; k++)
		if (g0 + k < g1)
			n += __ldcg(g32 + g0 + k);
	return si << 10 | min(n, a1 - a0);
}

/* The order from the windows' entries @wn (lpt_window's, lpt_mw of them,
 * in shared memory, written before a barrier) and @in; @key (L.slots
 * words) and @bins (cw + 1 words) are shared scratch.  @nh: the step's
 * contexts (SEGNOTE's stride), gridDim.y in the many-CTA select but
 * gridDim.x in k_select, whose gridDim.y is 1: reading gridDim.y here
 * (3bc5c7d) put k_select's notes over the second context's histograms
 * wherever a step had more than one context. */
static __device__ __forceinline__ void lpt_rank(const struct sel_src &src, char *ws,
					      const struct ws_layout &L, uint32_t h, uint32_t nh,
					      const uint32_t *wn, struct lpt_in in, uint32_t *key,
					      uint32_t *bins, bool bound)
{
	const uint32_t tid = threadIdx.x, cw = 1u << src.cwl, np1 = 1u << L.pl, ns = L.slots;
	uint32_t *order = WSP(uint32_t, L, order, ws, h);
	const uint32_t nw = min(in.nw, lpt_mw(L)), bn = in.bn, bb = in.bb;
	for (uint32_t k = tid; k <= cw; k += SEL_T)
		bins[k] = 0;
	__syncthreads();
	const uint32_t nbb = (bn + bb - 1) / bb;
	const bool marks = (L.lpt & 2u) != 0u;
	for (uint32_t x = tid; x < ns; x += SEL_T) {
		uint32_t k = 0;
		bool mark = marks; /* k == 0 is then no work */
		if (x < L.max_chunks) {
			const uint32_t wx = x >> L.pl, part = x & (np1 - 1u);
			if (wx < nw) {
				const uint32_t n = wn[wx] & 1023u;
				const uint32_t np = min(np1, (n + L.pb - 1) / L.pb);
				k = part < np ? (part + 1) * n / np - part * n / np : 0u;
				mark = marks && bound;
				if (mark && k == 0 && src.segs) {
					/* as packed_cta_work counts an empty part */
					uint32_t *note = SEGNOTE(ws, L, nh, h, wn[wx] >> 10);
					atomicAdd(&note[0], 1u);
					atomicMax(&note[1], ~x);
				}
			}
		} else if (x < L.max_chunks + L.buf_chunks) {
			const uint32_t b0 = (x - L.max_chunks) << src.cwl;
			k = b0 < nbb ? min(nbb - b0, cw) : 0u;
		} else {
			const uint32_t t0 = (x - L.max_chunks - L.buf_chunks) * WIN_TILE;
			k = t0 < src.win_n ? (min(src.win_n - t0, (uint32_t)WIN_TILE) + 15) / 16 : 0u;
		}
		k = min(k, cw);
		key[x] = k | (k == 0 && mark ? GPU_ORDER_IDLE : 0u);
		atomicAdd(&bins[cw - k], 1u);
	}
	__syncthreads();
	if (tid < 32) { /* bins to offsets, the heaviest key first */
		const uint32_t per = (cw + 32) / 32, k0 = tid * per;
		uint32_t v = 0;
		for (uint32_t k = k0; k < k0 + per && k <= cw; k++)
			v += bins[k];
		uint32_t o = warp_incl_scan(v) - v;
		for (uint32_t k = k0; k < k0 + per && k <= cw; k++) {
			const uint32_t c = bins[k];
			bins[k] = o;
			o += c;
		}
	}
	__syncthreads();
	for (uint32_t x = tid; x < ns; x += SEL_T) {
		const uint32_t k = key[x];
		order[atomicAdd(&bins[cw - (k & ~GPU_ORDER_IDLE)], 1u)] = x | (k & GPU_ORDER_IDLE);
	}
}

static __device__ __forceinline__ void lpt_order(const struct sel_src &src, char *ws,
					       const struct ws_layout &L, uint32_t h, uint32_t nh,
					       struct sel_smem &sm, bool bound)
{
	if (!lpt_room(src, L)) { /* no room: slot order */
		uint32_t *order = WSP(uint32_t, L, order, ws, h);
		for (uint32_t x = threadIdx.x; x < L.slots; x += SEL_T)
			order[x] = x;
		return;
	}
	const uint8_t *g32 = WSP(const uint8_t, L, g32, ws, h);
	const uint4 *wd = WSP(const uint4, L, wdesc, ws, h);
	const struct lpt_in in = lpt_heads(src, ws, L, h);
	for (uint32_t wx = threadIdx.x; wx < lpt_mw(L); wx += SEL_T)
		sm.ciw[wx] = lpt_window(src, g32, wx, in.nw,
					src.segs ? __ldcg(wd + wx) : make_uint4(0, 0, 0, 0));
	lpt_rank(src, ws, L, h, nh, sm.ciw, in, sm.ckey, sm.h, bound);
}

__device__ void msel_count(const struct sel_src src, double frac, char *ws,
			   const struct ws_layout &L, uint32_t h, uint32_t R)
{
	extern __shared__ __align__(16) unsigned char sel_raw[];
	struct sel_smem &sm = *(struct sel_smem *)sel_raw;
	__shared__ bool sh_last;
	uint32_t *X = SELX(ws, h);
	uint32_t *ckey = WSP(uint32_t, L, selkey, ws, h), *ciw = WSP(uint32_t, L, selseg, ws, h);
	uint32_t tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nb = src.nb, c = blockIdx.x;
	int mode = 2;
	uint64_t need = 0, above = 0;
	uint32_t prefix16 = 0xffffu;
	if (nb > 0) { /* uniform over the CTA */
		need = sel_need(src, frac, WSP(uint8_t, L, ntok, ws, h), &mode);
		prefix16 = sel_cut16(HIST(ws, h), need, &mode, &above, sm);
	}
	uint32_t r0 = min(nb, c * R), r1 = min(nb, r0 + R), Rw = R / 32;
	uint32_t w0 = min(r1, r0 + w * Rw), w1 = min(r1, w0 + Rw);
	uint32_t cnt = sel_scan_warp(WSP(float, L, scores, ws, h), WSP(uint8_t, L, ntok, ws, h),
				     w0, w1, prefix16, &X[SX_NCAND], ckey, ciw,
				     L.lpt ? WSP(uint8_t, L, g32, ws, h) : NULL);
	if (lane == 0)
		sm.wcnt[w] = cnt;
	__syncthreads();
	if (tid == 0) {
		uint32_t t = c == 0 && nb > 0; /* the sink */
		for (int k = 0; k < 32; k++)
			t += sm.wcnt[k];
		X[SX_CNT + c] = t;
	}
	if (!last_cta_in_row(&X[SX_DONE_B], &sh_last))
		return;
	/* the tail's global loads in two round trips, before the exact cut:
	 * the candidates, the per-CTA counts (the offsets: warp 0, two CTAs
	 * a lane, MSEL_MAXC = 64) and the order's window entries, then those
	 * windows' granules; after the cut they were four (candidates;
	 * counts; entries; granules: about 1 % slower at 512K in the
	 * thirty-seventh session, within noise paired in the forty-fifth;
	 * kept as the shorter chain).  Where the order's windows outnumber
	 * the threads, or with GPU_ATTN_SEL_TAIL_SERIAL (L.lpt bit 2, the
	 * tests' way onto that path), they wait for lpt_order after the cut */
	uint32_t nc = __ldcg(&X[SX_NCAND]);
	const uint32_t gx = gridDim.x, k0 = 2 * lane, k1 = k0 + 1;
	uint32_t v0 = 0, v1 = 0;
	if (w == 0) {
		v0 = k0 < gx ? __ldcg(&X[SX_CNT + k0]) : 0;
		v1 = k1 < gx ? __ldcg(&X[SX_CNT + k1]) : 0;
	}
	const bool early = L.lpt && !(L.lpt & 4u) && lpt_room(src, L) && lpt_mw(L) <= SEL_T;
	struct lpt_in in = {0, 1, 0};
	uint4 e = make_uint4(0, 0, 0, 0);
	if (early) {
		in = lpt_heads(src, ws, L, h);
		if (src.segs && tid < lpt_mw(L))
			e = __ldcg(WSP(const uint4, L, wdesc, ws, h) + tid);
	}
	if (nb > 0 && nc > SEL_CAP) {
		uint32_t nsel = select_slow(src, need, mode, ws, L, h);
		if (tid == 0) {
			X[SX_SLOW] = 1;
			X[SX_NSEL] = nsel;
		}
		if (L.lpt) {
			__syncthreads(); /* select_slow's shared arrays are done */
			lpt_order(src, ws, L, h, gridDim.y, sm, false);
		}
		return;
	}
	uint32_t ck = 0, ci = 0;
	if (tid < nc) {
		ck = __ldcg(&ckey[tid]);
		ci = __ldcg(&ciw[tid]);
	}
	if (early && tid < lpt_mw(L))
		sm.lwn[tid] = lpt_window(src, WSP(const uint8_t, L, g32, ws, h), tid, in.nw, e);
	if (tid < nc) {
		sm.ckey[tid] = ck;
		sm.ciw[tid] = ci;
	}
	for (uint32_t i = tid + SEL_T; i < nc; i += SEL_T) {
		sm.ckey[i] = __ldcg(&ckey[i]);
		sm.ciw[i] = __ldcg(&ciw[i]);
	}
	for (uint32_t i = tid; i < MSEL_MAXC; i += SEL_T)
		sm.wcnt[i] = 0;
	__syncthreads();
	uint32_t kstar = 0xffffffffu;
	if (nb > 0)
		kstar = sel_exact(nc, prefix16, mode, need, above, R, sm);
	else if (tid == 0)
		sm.tie_max = 0;
	__syncthreads();
	/* list offsets: one warp, two CTAs a lane (the counts loaded above: a
	 * loop over them was a chain of L2 loads) */
	if (w == 0) {
		v0 += k0 < gx ? sm.wcnt[k0] : 0;
		v1 += k1 < gx ? sm.wcnt[k1] : 0;
		uint32_t v = v0 + v1, x = warp_incl_scan(v);
		if (k0 < gx)
			X[SX_OFF + k0] = x - v;
		if (k1 < gx)
			X[SX_OFF + k1] = x - v + v0;
		if (lane == 31) {
			X[SX_NSEL] = x;
			X[SX_KSTAR] = kstar;
			X[SX_TMAX] = sm.tie_max;
			X[SX_SLOW] = 0;
		}
	}
	if (L.lpt) {
		__syncthreads(); /* warp 0 has read sm.wcnt; sel_exact is done */
		if (early)
			lpt_rank(src, ws, L, h, gridDim.y, sm.lwn, in, sm.ckey, sm.h, true);
		else
			lpt_order(src, ws, L, h, gridDim.y, sm, true);
	}
}

__device__ void msel_write(const struct sel_src src, char *ws, const struct ws_layout &L,
			   uint32_t h, uint32_t R)
{
	__shared__ uint32_t wc[32], scan_sh[33];
	__shared__ bool sh_last;
	const uint32_t *X = SELX(ws, h);
	uint32_t tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nb = src.nb, c = blockIdx.x;
	uint32_t r0 = min(nb, c * R), r1 = min(nb, r0 + R), Rw = R / 32;
	uint32_t w0 = min(r1, r0 + w * Rw), w1 = min(r1, w0 + Rw);
	const float *scores = WSP(float, L, scores, ws, h);
	if (!X[SX_SLOW] && r0 < r1) { /* uniform over the CTA */
		uint32_t kstar = X[SX_KSTAR], tmax = X[SX_TMAX];
		uint32_t n = sel_write_warp(src, scores, w0, w1, kstar, tmax, 0, NULL, NULL, NULL);
		if (lane == 0)
			wc[w] = n;
		__syncthreads();
		if (w == 0) {
			uint32_t v = wc[lane], x = warp_incl_scan(v);
			wc[lane] = x - v;
		}
		__syncthreads();
		sel_write_warp(src, scores, w0, w1, kstar, tmax, X[SX_OFF + c] + wc[w],
			       WSP(uint32_t, L, sel, ws, h), WSP(uint32_t, L, selseg, ws, h),
			       WSP(uint32_t, L, selkey, ws, h));
	}
	if (!last_cta_in_row((uint32_t *)&X[SX_DONE_D], &sh_last))
		return;
	build_chunks(src, __ldcg(&X[SX_NSEL]), ws, L, h, scan_sh);
}

__global__ void __launch_bounds__(SEL_T) k_msel_count(const struct gpu_head *heads, double frac,
						      char *ws, struct ws_layout L, uint32_t R)
{
	pdl_begin();
	const struct gpu_head *H = &heads[blockIdx.y];
	struct sel_src s = {H->n_blocks, H->nseg, H->n_hist, H->segs,
			    WSP(const struct score_tile, L, tiles, ws, blockIdx.y), L.cwl,
			    H->buf, H->win_n};
	msel_count(s, frac, ws, L, blockIdx.y, R);
}

__global__ void __launch_bounds__(SEL_T) k_msel_write(const struct gpu_head *heads, char *ws,
						      struct ws_layout L, uint32_t R)
{
	pdl_begin();
	const struct gpu_head *H = &heads[blockIdx.y];
	struct sel_src s = {H->n_blocks, H->nseg, H->n_hist, H->segs,
			    WSP(const struct score_tile, L, tiles, ws, blockIdx.y), L.cwl};
	msel_write(s, ws, L, blockIdx.y, R);
}

__global__ void __launch_bounds__(SEL_T) k_msel_count_quest(const struct gpu_dense_head *heads,
							    uint32_t qb, double frac, char *ws,
							    struct ws_layout L, uint32_t R)
{
	pdl_begin();
	const struct gpu_dense_head *H = &heads[blockIdx.y];
	struct sel_src s = {(uint32_t)((H->n + qb - 1) / qb), 1, H->n, NULL, NULL, L.cwl, NULL,
			    H->win_n};
	msel_count(s, frac, ws, L, blockIdx.y, R);
}

__global__ void __launch_bounds__(SEL_T) k_msel_write_quest(const struct gpu_dense_head *heads,
							    uint32_t qb, char *ws,
							    struct ws_layout L, uint32_t R)
{
	pdl_begin();
	const struct gpu_dense_head *H = &heads[blockIdx.y];
	struct sel_src s = {(uint32_t)((H->n + qb - 1) / qb), 1, H->n, NULL, NULL, L.cwl};
	msel_write(s, ws, L, blockIdx.y, R);
}

/* ------------------------------------------------------------------ */
/* Dense tiles: 16 tokens per warp step, original space.               */

template <int NQ, int D>
struct dstate {
	float m[NQ], l[NQ];
	float acc[NQ][8]; /* channels (lane % (D/8)) * 8 + e, this lane's tokens */
};

template <int NQ, int D>
__device__ __forceinline__ void dstate_init(dstate<NQ, D> &st)
{
#pragma unroll
	for (int h = 0; h < NQ; h++) {
		st.m[h] = -INFINITY;
		st.l[h] = 0.0f;
#pragma unroll
		for (int e = 0; e < 8; e++)
			st.acc[h][e] = 0.0f;
	}
}

/* q2[h][e]: this lane's 8 channels of the query, pre-scaled by scale·log2e. */
template <int NQ, int D, int TILE = 16>
__device__ __forceinline__ void dense_tile(const uint16_t *K, const uint16_t *V, int ntok,
					   const float (&q2)[NQ][8], dstate<NQ, D> &st)
{
	constexpr int LPT = D / 8, TPI = 32 / LPT, NI = TILE / TPI;
	int lane = threadIdx.x & 31, sub = lane / LPT, cl = lane % LPT;
	uint4 kr[NI], vr[NI];
#pragma unroll
	for (int i = 0; i < NI; i++) {
		int t = i * TPI + sub;
		if (t < ntok) {
			kr[i] = __ldg((const uint4 *)(K + (size_t)t * D + cl * 8));
			vr[i] = __ldg((const uint4 *)(V + (size_t)t * D + cl * 8));
		} else {
			kr[i] = make_uint4(0, 0, 0, 0);
			vr[i] = make_uint4(0, 0, 0, 0);
		}
	}
	float s[NI][NQ];
#pragma unroll
	for (int i = 0; i < NI; i++) {
		float k[8];
		unpack8(kr[i], k);
#pragma unroll
		for (int h = 0; h < NQ; h++) {
			float x = 0.0f;
#pragma unroll
			for (int e = 0; e < 8; e++)
				x = fmaf(q2[h][e], k[e], x);
			s[i][h] = x;
		}
	}
#pragma unroll
	for (int o = LPT / 2; o > 0; o >>= 1)
#pragma unroll
		for (int i = 0; i < NI; i++)
#pragma unroll
			for (int h = 0; h < NQ; h++)
				s[i][h] += __shfl_xor_sync(0xffffffffu, s[i][h], o);
	float mx[NQ];
#pragma unroll
	for (int h = 0; h < NQ; h++) {
		mx[h] = -INFINITY;
#pragma unroll
		for (int i = 0; i < NI; i++) {
			if (i * TPI + sub >= ntok)
				s[i][h] = -INFINITY;
			mx[h] = fmaxf(mx[h], s[i][h]);
		}
#pragma unroll
		for (int o = LPT; o < 32; o <<= 1)
			mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], o));
		float mn = fmaxf(st.m[h], mx[h]);
		float al = exp2f(st.m[h] - mn);
		st.m[h] = mn;
		st.l[h] *= al;
#pragma unroll
		for (int e = 0; e < 8; e++)
			st.acc[h][e] *= al;
	}
#pragma unroll
	for (int i = 0; i < NI; i++) {
		float v[8];
		unpack8(vr[i], v);
#pragma unroll
		for (int h = 0; h < NQ; h++) {
			float p = exp2f(s[i][h] - st.m[h]);
			st.l[h] += p;
#pragma unroll
			for (int e = 0; e < 8; e++)
				st.acc[h][e] = fmaf(p, v[e], st.acc[h][e]);
		}
	}
}

/* Combine the warps' dense states and write the CTA's partial (o, m, l).
 * @sm: shared scratch of 4 * NQ * (D + 2) floats. */
template <int NQ, int D>
__device__ void dense_finish(dstate<NQ, D> &st, float *sm, float *po, float *pml)
{
	constexpr int LPT = D / 8;
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, sub = lane / LPT, cl = lane % LPT;
	/* reduce over the lanes holding other tokens of the same channels */
#pragma unroll
	for (int h = 0; h < NQ; h++) {
#pragma unroll
		for (int o = LPT; o < 32; o <<= 1) {
			st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], o);
#pragma unroll
			for (int e = 0; e < 8; e++)
				st.acc[h][e] += __shfl_xor_sync(0xffffffffu, st.acc[h][e], o);
		}
	}
	float *sacc = sm, *sml = sm + 4 * NQ * D;
	if (sub == 0)
#pragma unroll
		for (int h = 0; h < NQ; h++)
#pragma unroll
			for (int e = 0; e < 8; e++)
				sacc[(w * NQ + h) * D + cl * 8 + e] = st.acc[h][e];
	if (lane == 0)
#pragma unroll
		for (int h = 0; h < NQ; h++) {
			sml[(w * NQ + h) * 2] = st.m[h];
			sml[(w * NQ + h) * 2 + 1] = st.l[h];
		}
	__syncthreads();
	for (int i = threadIdx.x; i < NQ * D; i += blockDim.x) {
		int h = i / D, c = i % D;
		float M = -INFINITY;
		for (int ww = 0; ww < 4; ww++)
			M = fmaxf(M, sml[(ww * NQ + h) * 2]);
		float o = 0.0f, l = 0.0f;
		for (int ww = 0; ww < 4; ww++) {
			float mw = sml[(ww * NQ + h) * 2];
			float f = mw == -INFINITY ? 0.0f : exp2f(mw - M);
			o += f * sacc[(ww * NQ + h) * D + c];
			l += f * sml[(ww * NQ + h) * 2 + 1];
		}
		po[i] = o;
		if (c == 0) {
			pml[2 * h] = M;
			pml[2 * h + 1] = l;
		}
	}
}

template <int NQ, int D>
__device__ __forceinline__ void load_q2(const float *q, float scale2, float (&q2)[NQ][8])
{
	constexpr int LPT = D / 8;
	int cl = (threadIdx.x & 31) % LPT;
#pragma unroll
	for (int h = 0; h < NQ; h++)
#pragma unroll
		for (int e = 0; e < 8; e++)
			q2[h][e] = q[h * D + cl * 8 + e] * scale2;
}

__device__ __forceinline__ void mark_empty(float *pml, int nq)
{
	for (int i = threadIdx.x; i < nq; i += blockDim.x) {
		pml[2 * i] = -INFINITY;
		pml[2 * i + 1] = 0.0f;
	}
}

/*
 * The blocks of [@a0, @a1) (at most 512) the select's cut takes
 * (sel_take), in block order: of the n taken, part @part of
 * min(1 << @pl, ceil(n / @pb)) equal parts (all of them where @pl is 0;
 * @pb: ws_layout.pb), at their places in the window's list @out, *@lo on: shared
 * memory (PackedAttention) or the window's range of the sel array
 * (Quest: the parts of a window write disjoint entries), read back with
 * ordinary loads after the barrier (never __ldg: written in this kernel).
 * Returns the part's count (every thread; all 128 threads call it).  Why
 * here and not in the select: a list and a chunk list written by the
 * select cost a launch (many-CTA select) or a pass (one-CTA) and their
 * reads; a window's scores are 1-2 KB in L2.
 */
__device__ uint32_t window_take(const float *scores, uint32_t a0, uint32_t a1,
				uint32_t kstar, uint32_t tmax, uint32_t part, uint32_t pl,
				uint32_t pb, uint32_t *out, uint32_t *lo)
{
	__shared__ uint32_t wsum[4];
	constexpr int M = 4; /* blocks per thread: 512 / 128 */
	uint32_t tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
	uint32_t m = (a1 - a0 + 127) / 128, i0 = a0 + tid * m;
	float sc[M];
#pragma unroll
	for (int u = 0; u < M; u++)
		sc[u] = (uint32_t)u < m && i0 + u < a1 ? __ldg(scores + i0 + u) : 0.0f;
	bool tk[M];
	uint32_t c = 0;
#pragma unroll
	for (int u = 0; u < M; u++) {
		uint32_t i = i0 + u;
		tk[u] = (uint32_t)u < m && i < a1 && sel_take(i, fkey(sc[u]), kstar, tmax);
		c += tk[u];
	}
	uint32_t x = warp_incl_scan(c);
	if (lane == 31)
		wsum[w] = x;
	__syncthreads();
	uint32_t before = 0, tot = 0;
#pragma unroll
	for (uint32_t k = 0; k < 4; k++) {
		uint32_t v = wsum[k];
		before += k < w ? v : 0u;
		tot += v;
	}
	uint32_t p = before + x - c;
	const uint32_t np = min(1u << pl, (tot + pb - 1) / pb);
	const uint32_t l0 = part < np ? part * tot / np : tot;
	const uint32_t l1 = part < np ? (part + 1) * tot / np : tot;
#pragma unroll
	for (int u = 0; u < M; u++)
		if (tk[u]) {
			if (p >= l0 && p < l1)
				out[p] = i0 + u;
			p++;
		}
	__syncthreads();
	*lo = l0;
	return l1 - l0;
}

/* Dense window tile range [t0, t1) by the CTA's 4 warps. */
template <int NQ, int D, int TILE = 16>
__device__ void window_cta(const uint16_t *wk, const uint16_t *wv, uint32_t t0, uint32_t t1,
			   const float *q, float scale2, float *sm, float *po, float *pml)
{
	float q2[NQ][8];
	load_q2<NQ, D>(q, scale2, q2);
	dstate<NQ, D> st;
	dstate_init(st);
	int w = threadIdx.x >> 5;
	/* 8-token steps: the window is short, and fewer registers here leave
	 * more for the packed path sharing the kernel */
	for (uint32_t t = t0 + TILE * w; t < t1; t += 4 * TILE)
		dense_tile<NQ, D, TILE>(wk + (size_t)t * D, wv + (size_t)t * D,
					(int)min((uint32_t)TILE, t1 - t), q2, st);
	dense_finish<NQ, D>(st, sm, po, pml);
}

/* ------------------------------------------------------------------ */
/* PackedAttention.                                                    */

/* Position of the k-th (0-based) set bit of w (k < popc(w)). */
__device__ __forceinline__ int select_in_word(uint32_t w, int k)
{
	int pos = 0, c;
	c = __popc(w & 0xffffu);
	if (k >= c) { k -= c; w >>= 16; pos += 16; }
	c = __popc(w & 0xffu);
	if (k >= c) { k -= c; w >>= 8; pos += 8; }
	c = __popc(w & 0xfu);
	if (k >= c) { k -= c; w >>= 4; pos += 4; }
	c = __popc(w & 0x3u);
	if (k >= c) { k -= c; w >>= 2; pos += 2; }
	c = w & 1u;
	if (k >= c) pos += 1;
	return pos;
}

/* Iterator over the channels of a packed vector, from group index k0. */
struct bititer {
	uint32_t w0, w1, w2, w3;
	uint32_t m;  /* remaining bits of the current word */
	int wi;      /* current word */
	int base, left, g;
	__device__ __forceinline__ uint32_t word(int i) const
	{
		return i == 0 ? w0 : i == 1 ? w1 : i == 2 ? w2 : w3;
	}
	__device__ __forceinline__ void start(int k0)
	{
		int k = k0;
		wi = 0;
		uint32_t w = w0;
		for (;;) {
			int pc = __popc(w);
			if (k < pc || wi == 3)
				break;
			k -= pc;
			wi++;
			w = word(wi);
		}
		m = w;
		if (k > 0) {
			int p = select_in_word(w, k);
			m = w & (uint32_t)(~0ull << p);
		}
		left = 0;
	}
	/* next channel when g == 1: one find-first-set per value */
	__device__ __forceinline__ int next1()
	{
		while (m == 0 && wi < 3) {
			wi++;
			m = word(wi);
		}
		int p = __ffs(m) - 1;
		m &= m - 1;
		return wi * 32 + p;
	}
	/* next channel */
	__device__ __forceinline__ int next()
	{
		if (left == 0) {
			while (m == 0 && wi < 3) {
				wi++;
				m = word(wi);
			}
			int p = __ffs(m) - 1;
			m &= m - 1;
			base = (wi * 32 + p) * g;
			left = g;
		}
		return base + (g - left--);
	}
};

__device__ __forceinline__ void load_bm(bititer &it, const uint32_t *bm, uint32_t bw)
{
	it.w0 = bm[0];
	it.w1 = bw > 1 ? bm[1] : 0;
	it.w2 = bw > 2 ? bm[2] : 0;
	it.w3 = bw > 3 ? bm[3] : 0;
}

#define VT_STRIDE 129 /* floats per token row of the decoded V tile */

template <int NQ>
struct pstate {
	float m[NQ], l[NQ];
	float acc[NQ][4]; /* rotated channels lane + 32 k */
};

/*
 * Quantized rows (value bits w = 4..8, the host's row format): fields
 * 8m .. 8m+7 (group m) are the w bytes from byte 2 + w·m.  qgroup returns
 * them as one 64-bit word, field 8m+e at bit e·w, from two or three
 * aligned 32-bit loads (rows start 16-byte aligned; the third word may lie
 * past the row: gpu.cuh's slack).  A lane of a sub-block decodes groups
 * where the bf16 path decodes 8-value chunks, so the halves split a row
 * the same way.
 */
template <bool SHARED = false>
__device__ __forceinline__ uint64_t qgroup(const uint32_t *row, uint32_t w, uint32_t m)
{
	uint32_t byte = 2 + w * m, wi = byte >> 2, sh = (byte & 3) * 8;
	uint32_t a = SHARED ? row[wi] : __ldg(row + wi), b = SHARED ? row[wi + 1] : __ldg(row + wi + 1);
	uint32_t c = sh + 8 * w > 64 ? (SHARED ? row[wi + 2] : __ldg(row + wi + 2)) : 0u;
	return ((uint64_t)__funnelshift_r(b, c, sh) << 32) | __funnelshift_r(a, b, sh);
}

/* The row's scale (bf16 in its first two bytes). */
__device__ __forceinline__ float qscale(const uint32_t *row)
{
	return bf1((uint16_t)(__ldg(row) & 0xffffu));
}

/* Field e of a group, as the signed integer it stores. */
__device__ __forceinline__ int qfield(uint64_t x, int e, uint32_t w)
{
	return (int)((uint32_t)(x >> (e * w)) & ((1u << w) - 1u)) - (1 << (w - 1));
}

/* Values of one half-vector: chunks [c0, c1) of 8, the first two preloaded
 * in @pre (so that K and V of a block are requested together); with @w
 * (quantized rows), groups [c0, c1) of 8 fields, decoded exactly
 * (field × @sf). */
template <int NQ, bool IS_K>
__device__ __forceinline__ void half_vector(const uint4 *vp, const uint4 (&pre)[2], uint32_t c0,
					    uint32_t c1, uint32_t r, uint32_t w, float sf,
					    bititer &it, const float *qs, float (&sc)[NQ], float *row)
{
	constexpr int P = NQP(NQ);
	for (uint32_t ck = c0; ck < c1; ck++) {
		float x[8];
		if (w) {
			uint64_t q = qgroup((const uint32_t *)vp, w, ck);
#pragma unroll
			for (int e = 0; e < 8; e++)
				x[e] = (float)qfield(q, e, w) * sf;
		} else {
			uint4 u = ck == c0 ? pre[0] : ck == c0 + 1 ? pre[1] : __ldg(vp + ck);
			unpack8(u, x);
		}
#pragma unroll
		for (int e = 0; e < 8; e++) {
			if (ck * 8 + e < r) {
				int c = it.next();
				if constexpr (IS_K) {
					float qv[NQ];
					loadq<NQ>(qs + c * P, qv);
#pragma unroll
					for (int h = 0; h < NQ; h++)
						sc[h] = fmaf(x[e], qv[h], sc[h]);
				} else {
					row[c] = x[e];
				}
			}
		}
	}
}

/*
 * One sub-block of up to 16 tokens (rows t0 .. t0+nt of segment @sg) by one
 * warp.  Lane = token (lane / 2) × half (lane % 2).  @qs: q' pre-scaled,
 * [c][P]; @vt: this warp's V tile (16 × VT_STRIDE floats); @ps: 16 × P.
 */
template <int NQ>
__device__ __forceinline__ void packed_sub(const struct gpu_seg &sg, uint32_t t0, int nt,
					   const float *qs, float *vt, float *ps,
					   pstate<NQ> &st)
{
	constexpr int P = NQP(NQ);
	int lane = threadIdx.x & 31, t = lane >> 1, half = lane & 1;
	bool valid = t < nt;
	uint32_t tok = t0 + t;
	/* chunks of 8 values (bf16) or groups of 8 fields (quantized) */
	uint32_t knck = (sg.k_r + 7) >> 3, kc0 = half ? (knck + 1) >> 1 : 0;
	uint32_t kc1 = half ? knck : (knck + 1) >> 1;
	uint32_t vnck = (sg.v_r + 7) >> 3, vc0 = half ? (vnck + 1) >> 1 : 0;
	uint32_t vc1 = half ? vnck : (vnck + 1) >> 1;
	const uint4 *kp = (const uint4 *)(sg.k_val + (size_t)tok * sg.k_rs);
	const uint4 *vp = (const uint4 *)(sg.v_val + (size_t)tok * sg.v_rs);
	/* every load of the block first: one memory round trip, not two */
	bititer ki, vi;
	uint4 kpre[2], vpre[2];
	float ksf = 0.0f, vsf = 0.0f;
	if (valid) {
		load_bm(ki, sg.k_bm + (size_t)tok * sg.k_bw, sg.k_bw);
		load_bm(vi, sg.v_bm + (size_t)tok * sg.v_bw, sg.v_bw);
#pragma unroll
		for (int u = 0; u < 2; u++) {
			kpre[u] = !sg.k_vb && kc0 + u < kc1 ? __ldg(kp + kc0 + u) : make_uint4(0, 0, 0, 0);
			vpre[u] = !sg.v_vb && vc0 + u < vc1 ? __ldg(vp + vc0 + u) : make_uint4(0, 0, 0, 0);
		}
		if (sg.k_vb)
			ksf = qscale((const uint32_t *)kp);
		if (sg.v_vb)
			vsf = qscale((const uint32_t *)vp);
	}
	/* ---- K: partial dot over this lane's half of the stored values ---- */
	float sc[NQ];
#pragma unroll
	for (int h = 0; h < NQ; h++)
		sc[h] = 0.0f;
	if (valid && kc0 < kc1) {
		ki.g = (int)sg.k_g;
		ki.start((int)(kc0 * 8 / sg.k_g));
		half_vector<NQ, true>(kp, kpre, kc0, kc1, sg.k_r, sg.k_vb, ksf, ki, qs, sc, NULL);
	}
#pragma unroll
	for (int h = 0; h < NQ; h++) {
		sc[h] += __shfl_xor_sync(0xffffffffu, sc[h], 1);
		if (!valid)
			sc[h] = -INFINITY;
	}
	/* ---- online softmax ---- */
	float p[NQ];
#pragma unroll
	for (int h = 0; h < NQ; h++) {
		float mx = warp_max(sc[h]);
		float mn = fmaxf(st.m[h], mx);
		float al = exp2f(st.m[h] - mn);
		st.m[h] = mn;
		st.l[h] *= al;
#pragma unroll
		for (int k = 0; k < 4; k++)
			st.acc[h][k] *= al;
		p[h] = valid ? exp2f(sc[h] - mn) : 0.0f;
		if (half == 0)
			st.l[h] += p[h];
	}
	/* ---- V: decode this sub-block into the dense rotated tile ---- */
	uint32_t vdk = sg.v_dk;
	{
		float4 *v4 = (float4 *)vt;
		for (int i = lane; i < 16 * VT_STRIDE / 4; i += 32)
			v4[i] = make_float4(0.f, 0.f, 0.f, 0.f);
	}
	if (half == 0) {
#pragma unroll
		for (int h = 0; h < NQ; h++)
			ps[t * P + h] = p[h];
	}
	__syncwarp();
	if (valid && vc0 < vc1) {
		vi.g = (int)sg.v_g;
		vi.start((int)(vc0 * 8 / sg.v_g));
		half_vector<NQ, false>(vp, vpre, vc0, vc1, sg.v_r, sg.v_vb, vsf, vi, qs, sc,
				       vt + t * VT_STRIDE);
	}
	__syncwarp();
	/* ---- acc[h][c] += Σ_t p[t][h] · V̂[t][c], lane owns c = lane + 32 k ---- */
	for (int tt = 0; tt < nt; tt++) {
		float pv[NQ];
		loadq<NQ>(ps + tt * P, pv);
#pragma unroll
		for (int k = 0; k < 4; k++) {
			uint32_t c = lane + 32 * k;
			if (c < vdk) {
				float v = vt[tt * VT_STRIDE + c];
#pragma unroll
				for (int h = 0; h < NQ; h++)
					st.acc[h][k] = fmaf(pv[h], v, st.acc[h][k]);
			}
		}
	}
	__syncwarp();
}

struct pk_smem {
	float qs[GPU_MAX_D * 8];
	float ps[4][16 * 8];
	uint16_t rv[GPU_MAX_D * GPU_MAX_D]; /* R_v, copied while attending */
	union { /* tiles while attending, reduction scratch at the end */
		float vt[4][16 * VT_STRIDE];
		struct {
			float red[4 * 8 * (GPU_MAX_D + 2)];
			float orot[8 * GPU_MAX_D];
		};
	};
};

__device__ __forceinline__ void prefetch_l2(const void *p, uint32_t bytes)
{
	uint32_t lane = threadIdx.x & 31;
	for (uint32_t o = lane * 128; o < bytes; o += 32 * 128)
		asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + o));
}

/* cp.async of @bytes (multiple of 16, both 16-aligned) by the whole CTA. */
__device__ __forceinline__ void cta_copy_async(void *dst, const void *src, uint32_t bytes)
{
	for (uint32_t o = threadIdx.x * 16; o < bytes; o += blockDim.x * 16) {
		uint32_t sa = (uint32_t)__cvta_generic_to_shared((char *)dst + o);
		asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa),
			     "l"((const char *)src + o));
	}
	asm volatile("cp.async.commit_group;");
}

__device__ __forceinline__ void cta_copy_wait(void)
{
	asm volatile("cp.async.wait_group 0;" ::: "memory");
}

/* The K and V slabs of block j of @sg, prefetched into L2. */
__device__ __forceinline__ void prefetch_block(const struct gpu_seg &sg, uint32_t j)
{
	uint32_t t0 = j * sg.b, nt = min(sg.b, sg.n - t0);
	prefetch_l2(sg.k_val + (size_t)t0 * sg.k_rs, nt * sg.k_rs * 2);
	prefetch_l2(sg.v_val + (size_t)t0 * sg.v_rs, nt * sg.v_rs * 2);
	prefetch_l2(sg.k_bm + (size_t)t0 * sg.k_bw, nt * sg.k_bw * 4);
	prefetch_l2(sg.v_bm + (size_t)t0 * sg.v_bw, nt * sg.v_bw * 4);
}


/* o = o' R_v for NQ heads: @orot [c][8] (c < vdk) by R_v (bf16, vdk × D,
 * shared) to po[h][D]; the CTA's threads over output channels. */
template <int NQ, int D>
static __device__ __forceinline__ void rotate_back(const uint16_t *rv, const float *orot,
						   uint32_t vdk, float *po)
{
	for (uint32_t j = threadIdx.x; j < D; j += blockDim.x) {
		float o[NQ];
#pragma unroll
		for (int h = 0; h < NQ; h++)
			o[h] = 0.0f;
		const uint16_t *R = rv + j;
#pragma unroll 4
		for (uint32_t c = 0; c < vdk; c++) {
			float r = bf1(R[(size_t)c * D]), ov[NQ];
			loadq<NQ>(&orot[c * 8], ov);
#pragma unroll
			for (int h = 0; h < NQ; h++)
				o[h] = fmaf(ov[h], r, o[h]);
		}
#pragma unroll
		for (int h = 0; h < NQ; h++)
			po[h * D + j] = o[h];
	}
}

/* R_v (@vdk rows of D bf16) as cta_copy_async, each row's 16-byte chunk q
 * stored at q ^ (row & 7): the eight rows an ldmatrix reads then fall in
 * eight different bank groups (unswizzled, rows 2D bytes apart share
 * theirs: eight ways of conflict, more shared-memory wavefronts than the
 * scalar rotation's loads).  rotate_back_tc reads this layout only. */
template <int D>
__device__ __forceinline__ void cta_copy_rv_swz(uint16_t *dst, const uint16_t *src, uint32_t vdk)
{
	constexpr uint32_t QN = D / 8, QS = D == 128 ? 4 : 3; /* chunks a row, log2 */
	static_assert(D == 64 || D == 128, "R_v rows of 8 or 16 chunks");
	const uint32_t base = (uint32_t)__cvta_generic_to_shared(dst);
	for (uint32_t o = threadIdx.x; o < vdk * QN; o += blockDim.x) {
		const uint32_t c = o >> QS, q = o & (QN - 1);
		asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
				     base + 16 * (c * QN + (q ^ (c & 7)))),
			     "l"(src + 8 * (size_t)o));
	}
	asm volatile("cp.async.commit_group;");
}

/*
 * rotate_back on the tensor cores, R_v in shared memory as cta_copy_rv_swz
 * left it, 128 threads: po[h][j] = Σ_c o'[c][h] R_v[c][j] as m16n8k16
 * products with M the output channels j (A = R_vᵀ by ldmatrix.trans of
 * its rows), K the rotated channels c, N four heads × (hi, lo): each o'
 * split into its bf16 rounding and the remainder (16 bits of mantissa, as
 * the attention's P), the two columns summed by one shuffle at the end.
 * The scalar loop is a dependent chain of vdk shared loads and FMAs a
 * thread: 2.9 of the ~5.3 µs a k_segrot CTA spent past its wait at 1M
 * tokens, 1.8 at 256K; this takes 1.8 and 1.3 (H200, bench/tail_probe.py,
 * forty-second session: still more than its instructions explain).
 * Rows c >= vdk (garbage in R_v's buffer and in @orot) enter as zeros.
 */
template <int NQ, int D>
static __device__ __forceinline__ void rotate_back_tc(const uint16_t *rv, const float *orot,
						      uint32_t vdk, float *po)
{
	constexpr int NU = (NQ + 3) / 4, MW = D / 64; /* n-tiles; m-tiles a warp */
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	const int g = lane >> 2, tig = lane & 3;
	const bool lo = g >= 4; /* this lane's B column: head 4u + (g & 3), hi or lo */
	const uint32_t ks = (vdk + 15) >> 4;
	/* ldmatrix.trans: lanes 8i .. 8i + 7 give matrix i's rows, i = (rows
	 * +8: bit 1, channels +8: bit 0); the chunk swizzled by row & 7 */
	const uint32_t rrow = (uint32_t)__cvta_generic_to_shared(rv) +
			      (((lane >> 4) & 1) * 8 + (lane & 7)) * D * 2;
	uint32_t rch[MW];
#pragma unroll
	for (int i = 0; i < MW; i++)
		rch[i] = 16 * ((2 * (w + 4 * i) + ((lane >> 3) & 1)) ^ (lane & 7));
	float acc[MW][NU][4];
#pragma unroll
	for (int i = 0; i < MW; i++)
#pragma unroll
		for (int u = 0; u < NU; u++)
			acc[i][u][0] = acc[i][u][1] = acc[i][u][2] = acc[i][u][3] = 0.0f;
	for (uint32_t k = 0; k < ks; k++) {
		const uint32_t c0 = 16 * k, ca = c0 + 2 * tig, cb = ca + 8;
		uint32_t b[NU][2];
#pragma unroll
		for (int u = 0; u < NU; u++) {
			const int h = 4 * u + (g & 3);
			const bool hv = h < NQ;
			const float x0 = hv && ca < vdk ? orot[ca * 8 + h] : 0.0f;
			const float x1 = hv && ca + 1 < vdk ? orot[(ca + 1) * 8 + h] : 0.0f;
			const float x2 = hv && cb < vdk ? orot[cb * 8 + h] : 0.0f;
			const float x3 = hv && cb + 1 < vdk ? orot[(cb + 1) * 8 + h] : 0.0f;
			b[u][0] = split_t<true>(x0, x1, lo);
			b[u][1] = split_t<true>(x2, x3, lo);
		}
		/* A's rows past vdk: zero their halves (the buffer may hold NaN) */
		const uint32_t ma = ca + 1 < vdk ? ~0u : ca < vdk ? 0xffffu : 0u;
		const uint32_t mb = cb + 1 < vdk ? ~0u : cb < vdk ? 0xffffu : 0u;
#pragma unroll
		for (int i = 0; i < MW; i++) {
			uint32_t a0, a1, a2, a3;
			asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
				     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
				     : "r"(rrow + c0 * D * 2 + rch[i])
				     : "memory");
			a0 &= ma;
			a1 &= ma;
			a2 &= mb;
			a3 &= mb;
#pragma unroll
			for (int u = 0; u < NU; u++)
				mma_bf16(acc[i][u], a0, a1, a2, a3, b[u][0], b[u][1]);
		}
	}
	/* columns 2tig, 2tig + 1: hi of heads 4u + 2tig (+1) where tig < 2,
	 * their remainders in lanes tig + 2 */
#pragma unroll
	for (int i = 0; i < MW; i++) {
		const uint32_t j = 16 * (w + 4 * i) + g;
#pragma unroll
		for (int u = 0; u < NU; u++) {
			float v[4];
#pragma unroll
			for (int e = 0; e < 4; e++)
				v[e] = acc[i][u][e] + __shfl_xor_sync(0xffffffffu, acc[i][u][e], 2);
			const int h = 4 * u + 2 * tig;
			if (tig < 2 && h < NQ) {
				po[h * D + j] = v[0];
				po[h * D + j + 8] = v[2];
			}
			if (tig < 2 && h + 1 < NQ) {
				po[(h + 1) * D + j] = v[1];
				po[(h + 1) * D + j + 8] = v[3];
			}
		}
	}
}

/*
 * A chunk's state stays in rotated space (v_dk channels) when the CTA has
 * a note: k_segrot combines the chunks of each segment and rotates back
 * once, so R_v is read and multiplied once per segment instead of once per
 * chunk (1M tokens: four chunks a segment; with no rotation at all the
 * step took 6 % less time at batch 1 and 9 % at batch 8, H200).  The CTA
 * counts itself into the segment's note and leaves the lowest slot there
 * (reductions, nothing waited for).
 */
struct seg_note {
	uint32_t *note; /* SEGNOTE of the segment; NULL: the CTA holds the
			 * whole segment (seg_whole) and rotates back itself */
	uint32_t x;     /* this CTA's slot */
};

/*
 * Whether one work chunk (1 << @cwl blocks, aligned to the segment's
 * start) holds every block of @sg (@buf: the update buffer, whose blocks
 * count from n).  Its one CTA then rotates its state back itself and
 * k_segrot leaves the segment alone: with 4,096-token segments at 1M
 * tokens (the serving defaults, windows of 256 blocks) that is every
 * segment, and k_segrot's second read of each R_v (the attention CTA
 * had prefetched it into L2 for k_segrot; ncu saw k_segrot read 72 MB
 * from DRAM a layer anyway) and its launch go.
 */
__device__ __forceinline__ bool seg_whole(const struct gpu_seg &sg, bool buf, uint32_t cwl)
{
	const uint32_t nb = buf ? (sg.n + sg.b - 1) / sg.b : sg.n_blocks;
	return nb <= (1u << cwl);
}

/*
 * The end of a PackedAttention CTA: the warps' accumulators (sacc, [warp][head]
 * rows of GPU_MAX_D) and softmax states (sml, [warp][head] × (m, l)) are in
 * shared memory; merge them and write the CTA's partial: with @N in
 * rotated space (k_segrot finishes it), else rotated back by R_v here
 * (staged through @rv; @load_rv false: the caller has put it there).
 * Starts with a barrier.  Both kernels end here.
 */
template <int NQ, int D>
static __device__ __forceinline__ void tc_finish(const struct gpu_seg &sg, const float *sacc,
						 const float *sml, uint16_t *rv, float *orot,
						 float *po, float *pml, bool load_rv = true,
						 const struct seg_note *N = NULL)
{
	uint32_t vdk = sg.v_dk;
	if (N && !N->note)
		N = NULL; /* the whole segment: rotate back here */
	__syncthreads();
	/* R_v into shared memory by cp.async (L2, prefetched), in flight while
	 * the warps' states merge (a load-then-store loop waited one L2 round
	 * trip per 16 bytes: ncu, 8 % of the staged kernel's stall samples) */
	if (load_rv && !N)
		cta_copy_rv_swz<D>(rv, sg.v_rot, vdk);
	/* the warps' weights, a thread per (head, warp), then a head at a
	 * time without a division by vdk (every thread computing all of them
	 * was 3.4 % of the staged kernel's instructions at 1M tokens) */
	__shared__ float fw[8 * 4];
	if (threadIdx.x < 4 * NQ) {
		const uint32_t h = threadIdx.x >> 2, ww = threadIdx.x & 3;
		float M = -INFINITY;
		for (int k = 0; k < 4; k++)
			M = fmaxf(M, sml[(k * NQ + h) * 2]);
		const float mw = sml[(ww * NQ + h) * 2];
		const float f = mw != -INFINITY ? exp2f(mw - M) : 0.0f;
		fw[threadIdx.x] = f;
		const uint32_t m4 = 4 * NQ >= 32 ? 0xffffffffu : (1u << (4 * NQ)) - 1u;
		float ll = f * sml[(ww * NQ + h) * 2 + 1];
		ll += __shfl_xor_sync(m4, ll, 1);
		ll += __shfl_xor_sync(m4, ll, 2);
		if (ww == 0) {
			pml[2 * h] = M;
			pml[2 * h + 1] = ll;
		}
	}
	__syncthreads();
	for (uint32_t h = 0; h < NQ; h++) {
		const float4 f = *(const float4 *)&fw[4 * h];
		for (uint32_t c = threadIdx.x; c < vdk; c += blockDim.x) {
			const float *a = sacc + h * GPU_MAX_D + c;
			float o = 0.0f;
			if (f.x != 0.0f)
				o += f.x * a[0];
			if (f.y != 0.0f)
				o += f.y * a[NQ * GPU_MAX_D];
			if (f.z != 0.0f)
				o += f.z * a[2 * NQ * GPU_MAX_D];
			if (f.w != 0.0f)
				o += f.w * a[3 * NQ * GPU_MAX_D];
			if (N)
				po[h * D + c] = o;
			else
				orot[c * 8 + h] = o;
		}
	}
	if (N) {
		if (threadIdx.x == 0) {
			atomicAdd(&N->note[0], 1u);
			atomicMax(&N->note[1], ~N->x);
		}
		return;
	}
	cta_copy_wait();
	__syncthreads();
	if (load_rv)
		rotate_back_tc<NQ, D>(rv, orot, vdk, po);
	else
		rotate_back<NQ, D>(rv, orot, vdk, po);
}

/* The CTA's warps processed blocks of @sg; merge, rotate back, write. */
template <int NQ, int D>
__device__ void packed_finish(const struct gpu_seg &sg, pstate<NQ> &st, pk_smem &sm, float *po,
			      float *pml)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
	uint32_t vdk = sg.v_dk;
	float *sacc = sm.red, *sml = sm.red + 4 * NQ * GPU_MAX_D;
	cta_copy_wait(); /* this thread's part of R_v */
	__syncthreads(); /* red aliases the other warps' V tiles; R_v complete */
#pragma unroll
	for (int h = 0; h < NQ; h++) {
		float l = warp_sum(st.l[h]);
#pragma unroll
		for (int k = 0; k < 4; k++) {
			uint32_t c = lane + 32 * k;
			if (c < vdk)
				sacc[(w * NQ + h) * GPU_MAX_D + c] = st.acc[h][k];
		}
		if (lane == 0) {
			sml[(w * NQ + h) * 2] = st.m[h];
			sml[(w * NQ + h) * 2 + 1] = l;
		}
	}
	tc_finish<NQ, D>(sg, sacc, sml, sm.rv, sm.orot, po, pml, false);
}

/*
 * What CTA @x of head @hi of a PackedAttention launch works on, for both
 * kernels (CUDA cores and tensor cores): a tile of the dense window
 * (attended here), nothing (its partial marked empty), a chunk of selected
 * blocks of one segment (*list, *cnt), or a chunk of the update buffer's
 * blocks from *b0 on (*list NULL).  Returns false when the CTA is done.
 */
template <int NQ, int D>
static __device__ __forceinline__ bool
packed_cta_work(const struct gpu_head *H, const uint32_t *counts, uint32_t x, uint32_t hi,
		char *ws, const struct ws_layout &L, const float *qh, float scale2, float *red,
		float *po, float *pml, const struct gpu_seg **sgp, const uint32_t **list,
		uint32_t *si, uint32_t *b0, uint32_t *cnt)
{
	if (x >= L.max_chunks + L.buf_chunks) { /* dense window tile */
		uint32_t t0 = (x - L.max_chunks - L.buf_chunks) * WIN_TILE;
		if (t0 >= H->win_n) {
			mark_empty(pml, NQ);
			return false;
		}
		window_cta<NQ, D, 8>(H->win_k, H->win_v, t0, min(H->win_n, t0 + WIN_TILE), qh, scale2,
				     red, po, pml);
		return false;
	}
	if (x < L.max_chunks && L.cut_only) { /* part of window x >> pl of qrot's table */
		/* its blocks in shared memory (read back at ~30 cycles; in the
		 * sel array they cost an L2 round trip before the first fill
		 * and a stall on each next block's index: 2.5 % of the stall
		 * samples at 256K, batch 1) */
		__shared__ uint32_t wlist[1u << 9];
		const uint32_t *wd = WSP(uint32_t, L, wdesc, ws, hi);
		const uint32_t *X = SELX(ws, hi);
		const uint32_t wx = x >> L.pl, part = x & ((1u << L.pl) - 1u);
		/* the count, the entry (WDESC_COUNT: read either way), the cut and
		 * the segments' array in one round trip */
		const uint32_t nwin = wd[WDESC_COUNT(L.max_chunks)];
		const uint4 e = ((const uint4 *)wd)[wx];
		const struct gpu_seg *segs = H->segs;
		uint32_t kstar = X[SX_KSTAR], tmax = X[SX_TMAX];
		uint32_t n = 0, lo = 0;
		if (wx < nwin) {
			*si = e.x;
			*sgp = &segs[e.x];
			/* the descriptor into L1 while the scores come: the CTA's
			 * first loads after the list read it */
			if (threadIdx.x < 3) /* its lines: it spans two or three */
				asm volatile("prefetch.global.L1 [%0];" ::"l"(
					(const char *)*sgp + (threadIdx.x == 2 ? sizeof(struct gpu_seg) - 1
										: 96u * threadIdx.x)));
			n = window_take(WSP(float, L, scores, ws, hi), e.y, e.z, kstar, tmax, part,
					L.pl, L.pb, wlist, &lo);
			if (n == 0 && threadIdx.x == 0) {
				/* an empty window (or part) still counts in its segment's
				 * note: k_segrot combines slots xa .. xa + n - 1,
				 * which holds only while a segment's counted slots
				 * are consecutive (with a hole the last window's
				 * partial was left rotated and merged as is) */
				uint32_t *note = SEGNOTE(ws, L, gridDim.y, hi, *si);
				atomicAdd(&note[0], 1u);
				atomicMax(&note[1], ~x);
			}
		}
		if (n == 0) {
			mark_empty(pml, NQ);
			return false;
		}
		*cnt = n;
		*list = wlist + lo;
		return true;
	}
	if (x < L.max_chunks) {
		uint32_t nch = counts[1];
		if (x >= nch) {
			mark_empty(pml, NQ);
			return false;
		}
		const uint32_t *chunk = WSP(uint32_t, L, chunk, ws, hi);
		uint32_t s0 = chunk[x];
		*cnt = chunk[x + 1] - s0;
		*list = WSP(uint32_t, L, sel, ws, hi) + s0;
		*si = WSP(uint32_t, L, selseg, ws, hi)[s0];
		*sgp = &H->segs[*si];
		return true;
	}
	if (!H->buf) {
		mark_empty(pml, NQ);
		return false;
	}
	*sgp = H->buf;
	*si = H->nseg;
	uint32_t nbb = (H->buf->n + H->buf->b - 1) / H->buf->b;
	*b0 = (x - L.max_chunks) << L.cwl;
	if (*b0 >= nbb) {
		mark_empty(pml, NQ);
		return false;
	}
	*cnt = min(nbb - *b0, 1u << L.cwl);
	return true;
}

/* The partial of a segment the kernel cannot read as it is laid out: NaN
 * values in a slot the merge takes (l > 0), so the output shows it; no
 * row is read. */
template <int NQ, int D>
__device__ void nan_partial(float *po, float *pml)
{
	for (uint32_t i = threadIdx.x; i < NQ * D; i += blockDim.x)
		po[i] = NAN;
	if (threadIdx.x < NQ) {
		pml[2 * threadIdx.x] = 0.0f;
		pml[2 * threadIdx.x + 1] = 1.0f;
	}
}

template <int NQ, int D>
__global__ void __launch_bounds__(128) k_attn_packed(const struct gpu_head *heads, const float *q,
						     float scale2, char *ws, struct ws_layout L)
{
	pdl_begin();
	extern __shared__ __align__(16) unsigned char smraw[];
	pk_smem &sm = *(pk_smem *)smraw;
	uint32_t hi, x;
	const bool idle = slot_of(ws, L, &hi, &x);
	const struct gpu_head *H = &heads[hi];
	const uint32_t *counts = WSP(uint32_t, L, counts, ws, hi);
	float *po = WSP(float, L, part_o, ws, hi) + (size_t)x * NQ * D;
	float *pml = WSP(float, L, part_ml, ws, hi) + (size_t)x * NQ * 2;
	if (idle) {
		mark_empty(pml, NQ);
		return;
	}
	const float *qh = q + (size_t)hi * NQ * D;
	constexpr int P = NQP(NQ);
	int w = threadIdx.x >> 5;

	const struct gpu_seg *sgp;
	const uint32_t *list = NULL;
	uint32_t si, b0 = 0, cnt;
	if (!packed_cta_work<NQ, D>(H, counts, x, hi, ws, L, qh, scale2, sm.red, po, pml, &sgp,
				    &list, &si, &b0, &cnt))
		return;
	const struct gpu_seg sg = *sgp;
	if (sg.sched) { /* scheduled rows: the positions' path only */
		nan_partial<NQ, D>(po, pml);
		return;
	}
	/* R_v arrives in shared memory while the blocks are attended */
	cta_copy_async(sm.rv, sg.v_rot, sg.v_dk * D * 2);
	/* q' of this segment, pre-scaled, [c][P] */
	const float *qr = WSP(float, L, qr, ws, hi) + (size_t)si * QR_ROWS * P;
	for (uint32_t i = threadIdx.x; i < sg.k_dk * P; i += blockDim.x)
		sm.qs[i] = qr[i] * scale2;
	__syncthreads();
	pstate<NQ> st;
#pragma unroll
	for (int h = 0; h < NQ; h++) {
		st.m[h] = -INFINITY;
		st.l[h] = 0.0f;
#pragma unroll
		for (int k = 0; k < 4; k++)
			st.acc[h][k] = 0.0f;
	}
	uint32_t base_blk = list ? 0 : b0;
	if (w < cnt)
		prefetch_block(sg, list ? list[w] - sg.block0 : base_blk + w);
	for (uint32_t i = w; i < cnt; i += 4) {
		uint32_t j = list ? list[i] - sg.block0 : base_blk + i;
		if (i + 4 < cnt) /* this warp's next block, into L2 */
			prefetch_block(sg, list ? list[i + 4] - sg.block0 : base_blk + i + 4);
		uint32_t t0 = j * sg.b, t1 = min(sg.n, t0 + sg.b);
		for (uint32_t t = t0; t < t1; t += 16)
			packed_sub<NQ>(sg, t, (int)min(16u, t1 - t), sm.qs, sm.vt[w], sm.ps[w], st);
	}
	packed_finish<NQ, D>(sg, st, sm, po, pml);
}

/* ------------------------------------------------------------------ */
/* PackedAttention on the tensor cores.                                 */
/*
 * Per warp and 16-token sub-block: the packed K and V vectors are scattered
 * (bitmap positions) into dense fp16 tiles in shared memory, K̂ as
 * [token][channel] and V̂ as [channel][token]; then S = Q' K̂ᵀ and
 * O' += P V̂ are mma.m16n8k16 (fp16 operands, fp32 accumulation) with the
 * group's query heads as rows 0..NQ-1 of the 16-row A operand.  P stays in
 * registers between the two products (the C fragment of S is the A
 * fragment of P).  fp16 keeps 11 significant bits: bf16 values convert
 * exactly (|x| < 65504), p in [0, 1] loses < 2^-11.
 */
#define TK_LD 136 /* K̂ row: 128 channels + 8 (68 words: conflict-free) */
#define TV_LD 24  /* V̂ᵀ row: 16 tokens + 8 (12 words: conflict-free) */

struct tc_warp_tiles {
	__half k[16 * TK_LD];
	union {
		__half v[GPU_MAX_D * TV_LD]; /* V̂ᵀ [channel][token] (tc_sub) */
		__half vr[16 * TK_LD];       /* V̂ [token][channel] (tc_sub_g1) */
	};
};

struct tc_smem {
	float qs[GPU_MAX_D * 8];
	union {
		struct tc_warp_tiles t[4];
		struct {
			float red[4 * 8 * (GPU_MAX_D + 2)];
			uint16_t rv[GPU_MAX_D * GPU_MAX_D];
		};
	};
	float orot[8 * GPU_MAX_D];
	uint4 qf[4][32]; /* Q' A fragments, [ks / 2][lane] (read per sub-block:
			  * 16 fewer registers live across the loop) */
};

__device__ __forceinline__ uint32_t h2pack(float lo, float hi)
{
	__half2 h = __floats2half2_rn(lo, hi);
	return *(uint32_t *)&h;
}

/* D = A B + C on rows 0..7 only: A's rows 8..15 are zero here, so the
 * lower half of C/D is a throw-away pair (fewer live registers). */
__device__ __forceinline__ void mma16816_top(float &c0, float &c1, uint32_t a0, uint32_t a2,
					     uint32_t b0, uint32_t b1)
{
	float z2 = 0.0f, z3 = 0.0f;
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		     : "+f"(c0), "+f"(c1), "+f"(z2), "+f"(z3)
		     : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
}

/* Scatter one half-vector's values into a tile: element c of token t at
 * tile[t * st_t + c * st_c]. */
__device__ __forceinline__ void scatter_half(const uint4 *vp, const uint4 (&pre)[2], uint32_t c0,
					     uint32_t c1, uint32_t r, bititer &it, __half *tile,
					     uint32_t st_c)
{
	if (it.g == 1) {
		for (uint32_t ck = c0; ck < c1; ck++) {
			uint4 w = ck == c0 ? pre[0] : ck == c0 + 1 ? pre[1] : __ldg(vp + ck);
			float x[8];
			unpack8(w, x);
			if (ck * 8 + 8 <= r) {
#pragma unroll
				for (int e = 0; e < 8; e++)
					tile[it.next1() * st_c] = __float2half_rn(x[e]);
			} else {
#pragma unroll
				for (int e = 0; e < 8; e++)
					if (ck * 8 + e < r)
						tile[it.next1() * st_c] = __float2half_rn(x[e]);
			}
		}
		return;
	}
	for (uint32_t ck = c0; ck < c1; ck++) {
		uint4 w = ck == c0 ? pre[0] : ck == c0 + 1 ? pre[1] : __ldg(vp + ck);
		float x[8];
		unpack8(w, x);
#pragma unroll
		for (int e = 0; e < 8; e++)
			if (ck * 8 + e < r)
				tile[it.next() * st_c] = __float2half_rn(x[e]);
	}
}

/* Branch-free iterator over the set bits of a bitmap of up to 128 bits
 * (g == 1: one channel per bit).  The per-value step has no loop, so no
 * warp reconvergence per value. */
struct bits128 {
	uint64_t lo, hi;
	__device__ __forceinline__ void init(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3)
	{
		lo = (uint64_t)w0 | ((uint64_t)w1 << 32);
		hi = (uint64_t)w2 | ((uint64_t)w3 << 32);
	}
	/* drop the k lowest set bits */
	__device__ __forceinline__ void skip(int k)
	{
		int cl = __popcll(lo);
		if (k >= cl) {
			k -= cl;
			lo = 0;
			uint32_t h0 = (uint32_t)hi;
			int c0 = __popc(h0), p;
			p = k < c0 ? select_in_word(h0, k) : 32 + select_in_word((uint32_t)(hi >> 32), k - c0);
			hi = k > 0 ? hi & (~0ull << p) : hi;
		} else if (k > 0) {
			uint32_t l0 = (uint32_t)lo;
			int c0 = __popc(l0), p;
			p = k < c0 ? select_in_word(l0, k) : 32 + select_in_word((uint32_t)(lo >> 32), k - c0);
			lo &= ~0ull << p;
		}
	}
	__device__ __forceinline__ int next()
	{
		bool ul = lo != 0;
		uint64_t v = ul ? lo : hi;
		int p = __ffsll((long long)v) - 1 + (ul ? 0 : 64);
		v &= v - 1;
		lo = ul ? v : lo;
		hi = ul ? hi : v;
		return p;
	}
};

/* g == 1 and r a multiple of 8: scatter with the branch-free iterator. */
__device__ __forceinline__ void scatter_half_g1(const uint4 *vp, const uint4 (&pre)[2],
						uint32_t c0, uint32_t c1, const bititer &words,
						__half *tile, uint32_t st_c)
{
	bits128 b;
	b.init(words.w0, words.w1, words.w2, words.w3);
	b.skip((int)(c0 * 8));
	for (uint32_t ck = c0; ck < c1; ck++) {
		uint4 w = ck == c0 ? pre[0] : ck == c0 + 1 ? pre[1] : __ldg(vp + ck);
		float x[8];
		unpack8(w, x);
#pragma unroll
		for (int e = 0; e < 8; e++)
			tile[b.next() * st_c] = __float2half_rn(x[e]);
	}
}

/*
 * Quantized rows on the tensor cores: the values of groups [c0, c1)
 * scattered in fp16 as field × scale.  0x6400 | u is 1024 + u in fp16, one
 * subtraction of 1024 + 2^(w−1) leaves the signed field exactly, and one
 * multiplication by the row's scale @sf (bf16, exact in fp16 when >= 2^-14)
 * rounds the value once to fp16's 11 bits (the bf16 path's values convert
 * exactly; this is the rounding Q' already has): two values per HSUB2 and
 * HMUL2, and the products then run as for bf16 rows.  G1: g == 1
 * (branch-free iterator from the bitmap words in @it); else @it must be
 * started at group c0's channel.  WC: the width at compile time (immediate
 * shifts), 0: @wr at run time.
 */
template <bool G1, int WC>
__device__ __forceinline__ void scatter_q(const uint32_t *row, uint32_t wr, float sf,
					  uint32_t c0, uint32_t c1, uint32_t r, bititer &it,
					  __half *tile, uint32_t st_c)
{
	const uint32_t w = WC ? (uint32_t)WC : wr, mask = (1u << w) - 1u;
	const uint32_t bb = 0x6400u | (1u << (w - 1));
	const __half2 bias = __halves2half2(__ushort_as_half((uint16_t)bb),
					    __ushort_as_half((uint16_t)bb));
	const __half2 s2 = __float2half2_rn(sf);
	bits128 b;
	if (G1) {
		b.init(it.w0, it.w1, it.w2, it.w3);
		b.skip((int)(c0 * 8));
	}
	for (uint32_t ck = c0; ck < c1; ck++) {
		uint64_t x = qgroup(row, w, ck);
		if (ck * 8 + 8 <= r) {
#pragma unroll
			for (int e = 0; e < 8; e += 2) {
				uint32_t u0 = (uint32_t)(x >> (e * w)) & mask;
				uint32_t u1 = (uint32_t)(x >> ((e + 1) * w)) & mask;
				uint32_t pr = 0x64006400u | u0 | (u1 << 16);
				__half2 h = __hmul2(__hsub2(*(const __half2 *)&pr, bias), s2);
				tile[(G1 ? b.next() : it.next()) * st_c] = __low2half(h);
				tile[(G1 ? b.next() : it.next()) * st_c] = __high2half(h);
			}
		} else {
#pragma unroll
			for (int e = 0; e < 8; e++)
				if (ck * 8 + e < r) {
					uint32_t u = (uint32_t)(x >> (e * w)) & mask;
					__half h = __hmul(__hsub(__ushort_as_half((uint16_t)(0x6400u | u)),
								 __low2half(bias)),
							  __low2half(s2));
					tile[(G1 ? b.next() : it.next()) * st_c] = h;
				}
		}
	}
}

/* One half (K or V) of a lane's token into its tile: bf16 values or
 * quantized fields, chunks/groups [c0, c1). */
__device__ __forceinline__ void scatter_any(const uint4 *vp, const uint4 (&pre)[2], uint32_t c0,
					    uint32_t c1, uint32_t r, uint32_t g, uint32_t vb,
					    float sf, bititer &it, __half *tile, uint32_t st_c)
{
	bool g1 = g == 1 && (r & 7) == 0;
	if (vb) {
		const uint32_t *row = (const uint32_t *)vp;
		if (g == 1) { /* 6 bits: the serving default, immediate shifts */
			if (vb == 6)
				scatter_q<true, 6>(row, vb, sf, c0, c1, r, it, tile, st_c);
			else
				scatter_q<true, 0>(row, vb, sf, c0, c1, r, it, tile, st_c);
		} else {
			it.g = (int)g;
			it.start((int)(c0 * 8 / g));
			scatter_q<false, 0>(row, vb, sf, c0, c1, r, it, tile, st_c);
		}
	} else if (g1) {
		scatter_half_g1(vp, pre, c0, c1, it, tile, st_c);
	} else {
		it.g = (int)g;
		it.start((int)(c0 * 8 / g));
		scatter_half(vp, pre, c0, c1, r, it, tile, st_c);
	}
}

__device__ __forceinline__ void load_qa(const uint4 (&qf)[4][32], uint32_t (&qa)[8][2])
{
	int lane = threadIdx.x & 31;
#pragma unroll
	for (int k2 = 0; k2 < 4; k2++) {
		uint4 u = qf[k2][lane];
		qa[2 * k2][0] = u.x;
		qa[2 * k2][1] = u.y;
		qa[2 * k2 + 1][0] = u.z;
		qa[2 * k2 + 1][1] = u.w;
	}
}

template <int NQ>
struct tcstate {
	float m, l;         /* head g = lane / 4 (rows >= NQ are padding) */
	float acc[16][2];   /* O' fragment per 8-channel tile (rows 0..7) */
};

/* A 16-token sub-block's online softmax for this lane's head (g): S in
 * @s, two 8-token tiles (tokens 2tig, 2tig + 1 and 8 + 2tig, 9 + 2tig),
 * tokens at or past @nt masked.  Updates st.m and st.l; returns the old
 * state's rescale factor, P as two fp16 pairs in @pa0, @pa2. */
template <int NQ>
__device__ __forceinline__ float tc_softmax(const float (&s)[2][2], int nt, int tig,
					    tcstate<NQ> &st, uint32_t &pa0, uint32_t &pa2)
{
	float x0 = 2 * tig < nt ? s[0][0] : -INFINITY;
	float x1 = 2 * tig + 1 < nt ? s[0][1] : -INFINITY;
	float x2 = 8 + 2 * tig < nt ? s[1][0] : -INFINITY;
	float x3 = 9 + 2 * tig < nt ? s[1][1] : -INFINITY;
	float mx = fmaxf(fmaxf(x0, x1), fmaxf(x2, x3));
	mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
	mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
	float mn = fmaxf(st.m, mx);
	float al = exp2f(st.m - mn);
	st.m = mn;
	float p0 = exp2f(x0 - mn), p1 = exp2f(x1 - mn), p2 = exp2f(x2 - mn), p3 = exp2f(x3 - mn);
	st.l = st.l * al + (p0 + p1 + p2 + p3);
	pa0 = h2pack(p0, p1);
	pa2 = h2pack(p2, p3);
	return al;
}

template <int NQ>
__device__ __forceinline__ void tc_sub(const struct gpu_seg &sg, uint32_t t0, int nt,
				       const uint32_t (&qa)[8][2], struct tc_warp_tiles &T,
				       tcstate<NQ> &st)
{
	int lane = threadIdx.x & 31, t = lane >> 1, half = lane & 1;
	int g = lane >> 2, tig = lane & 3;
	bool valid = t < nt;
	uint32_t tok = t0 + t;
	uint32_t knck = (sg.k_r + 7) >> 3, kc0 = half ? (knck + 1) >> 1 : 0;
	uint32_t kc1 = half ? knck : (knck + 1) >> 1;
	uint32_t vnck = (sg.v_r + 7) >> 3, vc0 = half ? (vnck + 1) >> 1 : 0;
	uint32_t vc1 = half ? vnck : (vnck + 1) >> 1;
	const uint4 *kp = (const uint4 *)(sg.k_val + (size_t)tok * sg.k_rs);
	const uint4 *vp = (const uint4 *)(sg.v_val + (size_t)tok * sg.v_rs);
	bititer ki, vi;
	uint4 kpre[2], vpre[2];
	float ksf = 0.0f, vsf = 0.0f; /* quantized rows: this lane's token's scales */
	if (valid) {
		load_bm(ki, sg.k_bm + (size_t)tok * sg.k_bw, sg.k_bw);
		load_bm(vi, sg.v_bm + (size_t)tok * sg.v_bw, sg.v_bw);
#pragma unroll
		for (int u = 0; u < 2; u++) {
			kpre[u] = !sg.k_vb && kc0 + u < kc1 ? __ldg(kp + kc0 + u) : make_uint4(0, 0, 0, 0);
			vpre[u] = !sg.v_vb && vc0 + u < vc1 ? __ldg(vp + vc0 + u) : make_uint4(0, 0, 0, 0);
		}
		if (sg.k_vb)
			ksf = qscale((const uint32_t *)kp);
		if (sg.v_vb)
			vsf = qscale((const uint32_t *)vp);
	}
	/* zero both tiles, then scatter the stored values */
	{
		/* K̂: 16 rows × nks·16 channels; V̂ᵀ: nnt·8 rows × 16 tokens */
		uint32_t kq = ((sg.k_dk + 15) >> 4) * 2, vr = ((sg.v_dk + 7) >> 3) * 8;
		for (uint32_t i = lane; i < 16 * kq; i += 32)
			*(uint4 *)(T.k + (i / kq) * TK_LD + (i % kq) * 8) = make_uint4(0, 0, 0, 0);
		for (uint32_t i = lane; i < vr * 2; i += 32)
			*(uint4 *)(T.v + (i >> 1) * TV_LD + (i & 1) * 8) = make_uint4(0, 0, 0, 0);
	}
	__syncwarp();
	if (valid) {
		if (kc0 < kc1)
			scatter_any(kp, kpre, kc0, kc1, sg.k_r, sg.k_g, sg.k_vb, ksf, ki,
				    T.k + t * TK_LD, 1);
		if (vc0 < vc1)
			scatter_any(vp, vpre, vc0, vc1, sg.v_r, sg.v_g, sg.v_vb, vsf, vi, T.v + t,
				    TV_LD);
	}
	__syncwarp();
	/* S = Q' K̂ᵀ: two 8-token tiles */
	float s[2][2];
	uint32_t nks = (sg.k_dk + 15) >> 4;
#pragma unroll
	for (int n = 0; n < 2; n++) {
		s[n][0] = s[n][1] = 0.0f;
		const __half *row = T.k + (n * 8 + g) * TK_LD + 2 * tig;
#pragma unroll
		for (int ks = 0; ks < 8; ks++)
			if ((uint32_t)ks < nks) {
				uint32_t b0 = *(const uint32_t *)(row + ks * 16);
				uint32_t b1 = *(const uint32_t *)(row + ks * 16 + 8);
				mma16816_top(s[n][0], s[n][1], qa[ks][0], qa[ks][1], b0, b1);
			}
	}
	uint32_t pa0, pa2;
	const float al = tc_softmax(s, nt, tig, st, pa0, pa2);
	uint32_t nnt = (sg.v_dk + 7) >> 3;
	const __half *vrow = T.v + g * TV_LD + 2 * tig;
	/* O' = O' al + P V̂ */
#pragma unroll
	for (int n = 0; n < 16; n++)
		if ((uint32_t)n < nnt) {
			st.acc[n][0] *= al;
			st.acc[n][1] *= al;
			uint32_t b0 = *(const uint32_t *)(vrow + n * 8 * TV_LD);
			uint32_t b1 = *(const uint32_t *)(vrow + n * 8 * TV_LD + 8);
			mma16816_top(st.acc[n][0], st.acc[n][1], pa0, pa2, b0, b1);
		}
	__syncwarp();
}

/*
 * g == 1 on both halves and at least half the channels stored (the
 * serving formats, r = 5d/8): a channel-major walk instead of the
 * per-value set-bit iterator.  Lane = token (lane % 16) ×
 * half (lane / 16: K, V); a lane owns its token's whole row of the K̂ or
 * V̂ tile, both [token][channel] here.  It first writes the vector's r
 * stored values, decoded to fp16, contiguously at the row's start
 * (16-byte stores), then expands the row in place from the top channel
 * down: channel c takes the value at the count of set bits below it, or
 * zero.  That count never exceeds c and only channels above c were
 * written before, so every value is read before it is overwritten; a group
 * of 8 channels reads all its values before its one 16-byte store.  Per
 * channel: a predicate from the bitmap (R2P sets seven at once), a
 * predicated pointer step and a predicated 16-bit shared load, ~3.5
 * instructions with the packing (the scatter: a 64-bit find-first-set and
 * its bookkeeping per stored value, ~20 instructions).  The expansion
 * writes the zeros too, so the tiles need no clearing, and V̂ fragments
 * come by ldmatrix.trans.  Rows of tokens past the sub-block's end are
 * expanded from an empty bitmap (zeros: p = 0 must not meet a NaN).
 */

/* 8 bf16 values as 8 fp16 (exact for |x| < 65504, as __float2half_rn) */
__device__ __forceinline__ uint4 bf8_to_h8(uint4 u)
{
	float x[8];
	unpack8(u, x);
	return make_uint4(h2pack(x[0], x[1]), h2pack(x[2], x[3]), h2pack(x[4], x[5]),
			  h2pack(x[6], x[7]));
}

/* Two w-bit fields, unsigned, at bits 0 and 16 of @f, as the fp16 pair of
 * the signed integers they store: under the exponent of 1024 (exact for
 * w <= 10), then minus @bias = 1024 + 2^(w - 1) in both halves. */
__device__ __forceinline__ __half2 q_fields(uint32_t f, __half2 bias)
{
	const uint32_t pr = 0x64006400u | f;
	return __hsub2(*(const __half2 *)&pr, bias);
}

/* Group m's 8 fields (w bits each, in x from bit 0) as field × scale, or
 * (MUL false) as the signed integers they store (exact in fp16). */
template <int WC, bool MUL = true>
__device__ __forceinline__ uint4 q8_to_h8(uint64_t x, uint32_t wr, __half2 s2)
{
	const uint32_t w = WC ? (uint32_t)WC : wr, mask = (1u << w) - 1u;
	const uint32_t bb = 0x6400u | (1u << (w - 1));
	const __half2 bias = __halves2half2(__ushort_as_half((uint16_t)bb),
					    __ushort_as_half((uint16_t)bb));
	uint32_t o[4];
#pragma unroll
	for (int e = 0; e < 4; e++) {
		uint32_t u0 = (uint32_t)(x >> (2 * e * w)) & mask;
		uint32_t u1 = (uint32_t)(x >> ((2 * e + 1) * w)) & mask;
		__half2 h = q_fields(u0 | (u1 << 16), bias);
		if (MUL)
			h = __hmul2(h, s2);
		o[e] = *(uint32_t *)&h;
	}
	return make_uint4(o[0], o[1], o[2], o[3]);
}

/* The r values of a row, decoded to fp16, at shared address @dst (16-byte
 * groups; the last may run past r: never read as a value).  One group per
 * iteration, not unrolled: the kernel is at its register limit. */
__device__ __forceinline__ void g1_compact(const uint16_t *rowp, uint32_t r, uint32_t vb,
					   uint32_t dst)
{
	const uint32_t ng = (r + 7) >> 3;
	const uint32_t *row = (const uint32_t *)rowp;
	const __half2 s2 = __float2half2_rn(vb ? qscale(row) : 0.0f);
	for (uint32_t m = 0; m < ng; m++) {
		uint4 h;
		if (vb == 0)
			h = bf8_to_h8(__ldg((const uint4 *)rowp + m));
		else if (vb == 6) /* the serving width: immediate shifts */
			h = q8_to_h8<6>(qgroup(row, 6, m), 6, s2);
		else
			h = q8_to_h8<0>(qgroup(row, vb, m), vb, s2);
		sts128(dst + 16 * m, h.x, h.y, h.z, h.w);
	}
}

/* One channel of the walk: if @wd has bit @bit, step @p back to the next
 * value and load it, else 0 (a predicate, a predicated add and a
 * predicated load: no select). */
__device__ __forceinline__ uint32_t expand_step(uint32_t wd, uint32_t bit, uint32_t &p)
{
	uint32_t v;
	asm volatile("{\n\t.reg .pred q;\n\t.reg .b32 t;\n\t"
		     "and.b32 t, %2, %3;\n\t"
		     "setp.ne.u32 q, t, 0;\n\t"
		     "@q sub.u32 %1, %1, 2;\n\t"
		     "mov.u32 %0, 0;\n\t"
		     "@q ld.shared.u16 %0, [%1];\n\t}"
		     : "=r"(v), "+r"(p)
		     : "r"(wd), "r"(bit));
	return v;
}

/* Expand the r compact values at @row in place to channels [0, nch)
 * (nch a multiple of 16) by the bitmap @bm (no bits at or above nch). */
template <int D>
__device__ __forceinline__ void g1_expand(uint32_t row, const uint32_t (&bm)[4], uint32_t r,
					  uint32_t nch)
{
	uint32_t p = row + 2 * r; /* one past the next value to place */
#pragma unroll
	for (int gi = D / 8 - 1; gi >= 0; gi--) {
		if ((uint32_t)gi * 8 >= nch)
			continue;
		const uint32_t wd = bm[gi >> 2];
		uint32_t v[8];
#pragma unroll
		for (int e = 7; e >= 0; e--)
			v[e] = expand_step(wd, 1u << ((gi & 3) * 8 + e), p);
		sts128(row + 16 * gi, __byte_perm(v[0], v[1], 0x5410), __byte_perm(v[2], v[3], 0x5410),
		       __byte_perm(v[4], v[5], 0x5410), __byte_perm(v[6], v[7], 0x5410));
	}
}

template <int NQ, int D>
__device__ __forceinline__ void tc_sub_g1(const struct gpu_seg &sg, uint32_t t0, int nt,
					  const uint4 (&qf)[4][32], struct tc_warp_tiles &T,
					  tcstate<NQ> &st)
{
	int lane = threadIdx.x & 31, t = lane & 15, kv = lane >> 4;
	int g = lane >> 2, tig = lane & 3;
	bool valid = t < nt;
	uint32_t tok = t0 + t;
	const uint16_t *val = kv ? sg.v_val : sg.k_val;
	const uint32_t *bmp = kv ? sg.v_bm : sg.k_bm;
	uint32_t rs = kv ? sg.v_rs : sg.k_rs, bw = kv ? sg.v_bw : sg.k_bw;
	uint32_t dk = kv ? sg.v_dk : sg.k_dk, vb = kv ? sg.v_vb : sg.k_vb;
	uint32_t r = valid ? (kv ? sg.v_r : sg.k_r) : 0u;
	uint32_t nch = (dk + 15) & ~15u;
	uint32_t bm[4] = {0u, 0u, 0u, 0u};
	if (valid) {
		const uint32_t *b = bmp + (size_t)tok * bw;
#pragma unroll
		for (int i = 0; i < D / 32; i++) {
			uint32_t x = (uint32_t)i < bw ? __ldg(b + i) : 0u;
			uint32_t lo = 32u * i;
			bm[i] = dk >= lo + 32 ? x : dk > lo ? x & ((1u << (dk - lo)) - 1u) : 0u;
		}
	}
	const uint32_t row =
		(uint32_t)__cvta_generic_to_shared((kv ? T.vr : T.k) + t * TK_LD);
	if (valid)
		g1_compact(val + (size_t)tok * rs, r, vb, row);
	g1_expand<D>(row, bm, r, nch);
	__syncwarp();
	/* S = Q' K̂ᵀ: two 8-token tiles */
	uint32_t qa[8][2];
	load_qa(qf, qa);
	float s[2][2];
#pragma unroll
	for (int n = 0; n < 2; n++) {
		s[n][0] = s[n][1] = 0.0f;
		const __half *krow = T.k + (n * 8 + g) * TK_LD + 2 * tig;
#pragma unroll
		for (int ks = 0; ks < D / 16; ks++) {
			uint32_t b0 = *(const uint32_t *)(krow + ks * 16);
			uint32_t b1 = *(const uint32_t *)(krow + ks * 16 + 8);
			mma16816_top(s[n][0], s[n][1], qa[ks][0], qa[ks][1], b0, b1);
		}
	}
	uint32_t pa0, pa2;
	const float al = tc_softmax(s, nt, tig, st, pa0, pa2);
	/* O' = O' al + P V̂; ldmatrix lane address: matrix lane / 8 = tokens
	 * +0 / +8 (bit 0), n-tile +0 / +1 (bit 1), row lane % 8 */
	const uint32_t vaddr = (uint32_t)__cvta_generic_to_shared(
		T.vr + (((lane >> 3) & 1) * 8 + (lane & 7)) * TK_LD + (lane >> 4) * 8);
#pragma unroll
	for (int n = 0; n < D / 8; n += 2) {
		uint32_t b0, b1, b2, b3;
		asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
			     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
			     : "r"(vaddr + n * 16)
			     : "memory");
		st.acc[n][0] *= al;
		st.acc[n][1] *= al;
		mma16816_top(st.acc[n][0], st.acc[n][1], pa0, pa2, b0, b1);
		st.acc[n + 1][0] *= al;
		st.acc[n + 1][1] *= al;
		mma16816_top(st.acc[n + 1][0], st.acc[n + 1][1], pa0, pa2, b2, b3);
	}
	__syncwarp();
}


/*
 * Staged PackedAttention (g == 1 on both halves, or g == 2 on both halves
 * of bf16 rows; rows of at most ST_ROWB bytes: every serving format and
 * the bench's bf16 r = d/4).
 *
 * Why: the walk and the scatter above load each sub-block from global
 * memory one dependent group at a time and multiply with half of every
 * HMMA wasted (queries as the 16 rows of A: 4 real, 12 zero or copied);
 * ncu saw ~2,000 instructions per 16-token sub-block at 8.6 cycles each,
 * 38 % of the stalls on L1TEX.  Here:
 *   - a warp's next sub-block (K and V rows and bitmaps, four contiguous
 *     ranges) goes to shared memory by cp.async while it computes the
 *     current one (two stages per warp);
 *   - a lane owns one vector (lane % 16 = token, lane / 16 = K or V) and
 *     decodes it from the stage: values to fp16 at the start of its tile
 *     row (quantized fields as the exact integers they store), then the
 *     expansion in place, a group of 8 channels at a time (expand_inplace);
 *   - the products are transposed, tokens as the 16 rows:
 *     Sᵀ = K̂ Q'ᵀ with K̂ by ldmatrix and Q'ᵀ as B, O'ᵀ += V̂ᵀ Pᵀ with V̂ᵀ by
 *     ldmatrix.trans and Pᵀ from S's accumulators by movmatrix.trans.  The
 *     8 columns of B are 4 queries × (hi, lo): x = hi + lo, both fp16, so
 *     Q' and P enter the products with ~22 bits (one fp16 would round them
 *     to 11); the two halves of a query are summed by one shuffle;
 *   - quantized rows: the scale of token t multiplies S's row t (K) and
 *     P's row t before the split (V), exactly, in fp32.
 * A lane's accumulator columns are its S columns (the same two queries),
 * so the rescale by exp2(m_old − m_new) needs no shuffle, and is skipped
 * when no maximum grew.
 */
#define ST_ROWB 128 /* staged row bytes at most: bf16 r <= 64, 6-bit r <= 168 */
#define ST_NB 4     /* bitmap words per vector at most (d_keep <= 128, g <= 2) */

#define ST_SMALL_ROWB 64 /* rows of the small layout (the bench's bf16 r = 32,
			  * 6-bit r <= 80) */

/* One stage: RB = row bytes at most; at least 80 bytes a row, room for
 * rows of 64 bytes and their padding (st_rs). */
template <int RB>
struct st_stage {
	static constexpr int CAP = 16 * (RB < 80 ? 80 : RB) / 16; /* 16-byte pieces */
	uint32_t kbm[16 * ST_NB], vbm[16 * ST_NB];
	uint4 krow[CAP];
	uint4 vrow[CAP + 1]; /* +1: a field group's third word may reach past
			      * the last row */
};

/*
 * A stage's row stride in halves.  Rows of 32 or 64 bytes filled by the
 * aligned path (@pad: 16-byte-aligned arrays and 16 tokens) get one
 * 16-byte piece of padding.  Why: a lane expands its own row with 16-bit
 * loads at its own offsets; unpadded, rows t and t + 2 of 64 bytes (and
 * K row t and V row t) start on the same bank, so a load of the warp
 * meets ~3.6 lanes on its busiest bank for random bitmaps of 32 of 96
 * bits, ~2 with a stride of 80 bytes (a simulation of the lanes'
 * addresses; gpu/NOTES.md).
 */
__host__ __device__ __forceinline__ uint32_t st_pad_lg(uint32_t rs)
{
	return rs == 32 ? 6u : rs == 16 ? 5u : 0u; /* log2 of the row's bytes; 0: no padding */
}

__host__ __device__ __forceinline__ uint32_t st_rs(uint32_t rs, bool pad)
{
	return pad && st_pad_lg(rs) ? rs + 8 : rs;
}

/*
 * Stages a warp of the small layout keeps, and its CTAs per SM: one stage,
 * refilled as soon as its rows are expanded (the next sub-block is in
 * flight during the products and the softmax), at five CTAs: 20 warps an
 * SM at <= 96 registers, R_v read from L2 where a CTA rotates back.  The
 * kernel is latency-bound (~0.45 issues a scheduler cycle at 16 warps), so
 * the fifth CTA pays: at 1M tokens on the H200 the attention kernel took
 * 7-13 % less time than with two stages at four CTAs (-DST_SMALL_NS=2,
 * kept for comparison; gpu/NOTES.md, twenty-seventh session).
 */
#ifndef ST_SMALL_NS
#define ST_SMALL_NS 1
#endif
#define ST_SMALL_CTAS (ST_SMALL_NS == 1 ? 5 : 4)

__host__ __device__ constexpr int st_nstages(int rb)
{
	return rb == ST_SMALL_ROWB ? ST_SMALL_NS : 2;
}

/* whether R_v is staged in shared memory for a CTA's rotation back */
__host__ __device__ constexpr bool st_rv_smem(int rb)
{
	return st_nstages(rb) == 2;
}

/* LD = 16 KC + 8 halves a tile row: a stride of 32 KC + 16 bytes, an odd
 * multiple of 16, so the 16-byte pieces of eight consecutive rows cover
 * all 32 banks: ldmatrix and the expansion's 16-byte stores are
 * conflict-free. */
template <int KC, int RB>
struct st_warp {
	static constexpr int LD = 16 * KC + 8;
	__half k[16 * LD]; /* K̂ [token][channel] */
	__half v[16 * LD]; /* V̂ [token][channel] */
	struct st_stage<RB> s[st_nstages(RB)];
};

/* The staged kernel's shared memory.  KC = D / 16, RB = ST_ROWB: 74 KB,
 * three CTAs per SM; KC = 6 (d_keep <= 96 of 128), RB = 64: 40 KB, five
 * (the small layout, GPU_ATTN_SMALL_ROWS; 52 KB and four with two
 * stages). */
template <int NU, int KC, int RB>
struct st_smem {
	union {
		struct st_warp<KC, RB> w[4];
		struct {
			float red[4 * 8 * (GPU_MAX_D + 2)];
			float orot[8 * GPU_MAX_D];
			/* R_v: v_dk <= 16 KC rows */
			uint16_t rv[st_rv_smem(RB) ? 16 * KC * GPU_MAX_D : 8];
		} f;
		float qs[GPU_MAX_D * 8];
	};
	uint2 qb[NU][KC][32]; /* Q'ᵀ B fragments, [4 heads][k-step][lane] */
	struct gpu_seg seg; /* the CTA's segment (tc_cta_st) */
};

/* The bitmaps' group sizes the staged path expands: g = 1 on both halves,
 * or g = 2 on both halves of bf16 rows with an even d_keep (a pair of
 * channels a bit, expand_direct_g2). */
__host__ __device__ __forceinline__ bool st_g1(const struct gpu_seg &sg)
{
	return sg.k_g == 1 && sg.v_g == 1;
}

__host__ __device__ __forceinline__ bool st_g2(const struct gpu_seg &sg)
{
	return sg.k_g == 2 && sg.v_g == 2 && sg.k_vb == 0 && sg.v_vb == 0 && !(sg.k_dk & 1) &&
	       !(sg.v_dk & 1);
}

__device__ __forceinline__ bool st_ok(const struct gpu_seg &sg, uint32_t flags)
{
	return !(flags & (GPU_ATTN_SCATTER | GPU_ATTN_WALK)) && (st_g1(sg) || st_g2(sg)) &&
	       sg.k_rs * 2 <= ST_ROWB && sg.v_rs * 2 <= ST_ROWB && sg.k_bw <= ST_NB &&
	       sg.v_bw <= ST_NB;
}

/* What GPU_ATTN_SMALL_ROWS promises of every segment (and buffer); the
 * host's gpu_seg_small_rows is this test. */
__host__ __device__ __forceinline__ bool st_small_ok(const struct gpu_seg &sg, uint32_t d)
{
	return (st_g1(sg) || st_g2(sg)) && sg.k_rs * 2 <= ST_SMALL_ROWB &&
	       sg.v_rs * 2 <= ST_SMALL_ROWB && sg.k_bw <= ST_NB && sg.v_bw <= ST_NB &&
	       sg.k_dk <= 3 * d / 4 && sg.v_dk <= 3 * d / 4 && sg.k_dk > 0 && sg.v_dk > 0;
}

int gpu_seg_small_rows(const struct gpu_seg *sg, uint32_t d)
{
	return sg && st_small_ok(*sg, d);
}

/* One 16-byte cp.async from global @src to shared address @dst (both
 * 16-aligned), ordered as a memory operation for the compiler. */
__device__ __forceinline__ void cps16(uint32_t dst, const void *src)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

/* @bytes (a multiple of 4) from @src to shared @dst (16-aligned) by the
 * warp, 16 bytes a copy where the source allows. */
__device__ __forceinline__ void st_copy(uint32_t dst, const void *src, uint32_t bytes, int lane)
{
	const char *s = (const char *)src;
	if ((((uintptr_t)s | bytes) & 15u) == 0) {
		for (uint32_t o = lane * 16; o < bytes; o += 512)
			cps16(dst + o, s + o);
	} else {
		for (uint32_t o = lane * 4; o < bytes; o += 128)
			asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst + o),
				     "l"(s + o)
				     : "memory");
	}
}

/* The padding before byte @o of the aligned fill's rows of @rs halves
 * (st_rs with pad). */
__host__ __device__ __forceinline__ uint32_t st_pad_of(uint32_t o, uint32_t rs)
{
	uint32_t lg = st_pad_lg(rs);
	return lg ? (o >> lg) << 4 : 0u;
}

/* Tokens [t0, t0 + nt) of @sg into stage @S; one commit group.  The rows
 * of the aligned path are padded (st_rs). */
template <int RB>
__device__ __forceinline__ void st_fill(const struct gpu_seg &sg, uint32_t t0, uint32_t nt,
					struct st_stage<RB> &S, int lane, bool al16)
{
	if (al16 && nt == 16) { /* the common case: four 16-byte-aligned ranges */
		const char *kr = (const char *)(sg.k_val + (size_t)t0 * sg.k_rs);
		const char *vr = (const char *)(sg.v_val + (size_t)t0 * sg.v_rs);
		const char *kb = (const char *)(sg.k_bm + (size_t)t0 * sg.k_bw);
		const char *vb = (const char *)(sg.v_bm + (size_t)t0 * sg.v_bw);
		const uint32_t d = (uint32_t)__cvta_generic_to_shared(&S);
		const uint32_t dkr = d + offsetof(struct st_stage<RB>, krow);
		const uint32_t dvr = d + offsetof(struct st_stage<RB>, vrow);
		const uint32_t dvb = d + offsetof(struct st_stage<RB>, vbm);
		if (sg.k_rs == 32 && sg.v_rs == 32) {
			/* rows of 64 bytes (the bench's bf16 r = 32, the decode
			 * default's 6-bit rows): two pieces a lane a half, their
			 * padded places fixed (st_pad_of: 16 bytes after every
			 * row, so piece o + 512 lands 640 past piece o) */
			const uint32_t o = lane * 16, at = o + ((o >> 6) << 4);
#pragma unroll
			for (uint32_t i = 0; i < 2; i++) {
				cps16(dkr + at + 640 * i, kr + o + 512 * i);
				cps16(dvr + at + 640 * i, vr + o + 512 * i);
			}
		} else {
#pragma unroll 1
			for (uint32_t o = lane * 16; o < sg.k_rs * 32; o += 512)
				cps16(dkr + o + st_pad_of(o, sg.k_rs), kr + o);
#pragma unroll 1
			for (uint32_t o = lane * 16; o < sg.v_rs * 32; o += 512)
				cps16(dvr + o + st_pad_of(o, sg.v_rs), vr + o);
		}
		if ((uint32_t)lane < sg.k_bw * 4)
			cps16(d + lane * 16, kb + lane * 16);
		if ((uint32_t)lane < sg.v_bw * 4)
			cps16(dvb + lane * 16, vb + lane * 16);
		asm volatile("cp.async.commit_group;" ::: "memory");
		return;
	}
	st_copy((uint32_t)__cvta_generic_to_shared(S.krow), sg.k_val + (size_t)t0 * sg.k_rs,
		nt * sg.k_rs * 2, lane);
	st_copy((uint32_t)__cvta_generic_to_shared(S.vrow), sg.v_val + (size_t)t0 * sg.v_rs,
		nt * sg.v_rs * 2, lane);
	st_copy((uint32_t)__cvta_generic_to_shared(S.kbm), sg.k_bm + (size_t)t0 * sg.k_bw,
		nt * sg.k_bw * 4, lane);
	st_copy((uint32_t)__cvta_generic_to_shared(S.vbm), sg.v_bm + (size_t)t0 * sg.v_bw,
		nt * sg.v_bw * 4, lane);
	asm volatile("cp.async.commit_group;" ::: "memory");
}

/*
 * Value positions (gpu_seg's k_pos / v_pos; bf16 rows of the small layout
 * only): the stage holds the K then the V positions (16 rows of at most
 * 32 bytes each), then the K and V rows unpadded (at most 64 bytes).  A
 * lane reads its row and its positions in 16-byte pieces, so where the
 * aligned fill lays them out, piece m of row t goes to piece m ^
 * st_swz(t, pieces a row): the eight rows of a quarter warp's load then
 * cover all 32 banks (unswizzled, rows of 64 bytes put four lanes on the
 * same banks).
 */
#define SP_KPOS 0u
#define SP_VPOS 512u
#define SP_KROW 1024u
#define SP_VROW 2048u
static_assert(sizeof(struct st_stage<ST_SMALL_ROWB>) >= SP_VROW + 1024u,
	      "the positions' stage fits the small layout's");

__host__ __device__ __forceinline__ uint32_t st_swz(uint32_t t, uint32_t np)
{
	return np == 2u || np == 4u ? ((t * np) >> 3) & (np - 1u) : 0u;
}

/* Tokens [t0, t0 + nt) of @sg (positions, bf16 rows of <= 64 bytes) into
 * stage @S; one commit group.  Swizzled where @al16 and nt == 16. */
__device__ __forceinline__ void st_fill_pos(const struct gpu_seg &sg, uint32_t t0, uint32_t nt,
					    struct st_stage<ST_SMALL_ROWB> &S, int lane,
					    bool al16)
{
	const uint32_t d = (uint32_t)__cvta_generic_to_shared(&S);
	const uint32_t krb = sg.k_rs * 2, vrb = sg.v_rs * 2;
	const uint32_t kpb = GPU_POS_STRIDE(sg.k_r), vpb = GPU_POS_STRIDE(sg.v_r);
	const char *kr = (const char *)(sg.k_val + (size_t)t0 * sg.k_rs);
	const char *vr = (const char *)(sg.v_val + (size_t)t0 * sg.v_rs);
	const char *kp = (const char *)(sg.k_pos + (size_t)t0 * kpb);
	const char *vp = (const char *)(sg.v_pos + (size_t)t0 * vpb);
	if (al16 && nt == 16 && krb == 64 && vrb == 64 && kpb == 32 && vpb == 32) {
		/* the bench's rows (bf16 r 25..32): 64 + 32 pieces of 16 bytes
		 * a half, three a lane, their places fixed (the loop below
		 * spent ~15 % of the kernel's instructions on them) */
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const uint32_t q = lane + 32 * i, row = q >> 2, m = q & 3;
			const uint32_t at = row * 64 + ((m ^ ((row >> 1) & 3)) << 4);
			cps16(d + SP_KROW + at, kr + 16 * q);
			cps16(d + SP_VROW + at, vr + 16 * q);
		}
		const uint32_t row = lane >> 1, m = lane & 1;
		const uint32_t at = row * 32 + ((m ^ ((row >> 2) & 1)) << 4);
		cps16(d + SP_KPOS + at, kp + 16 * lane);
		cps16(d + SP_VPOS + at, vp + 16 * lane);
		asm volatile("cp.async.commit_group;" ::: "memory");
		return;
	}
	if (al16 && nt == 16) {
		/* four arrays of 16 rows: piece o / 16 of array a */
#pragma unroll
		for (int a = 0; a < 4; a++) {
			const uint32_t rb = a == 0 ? kpb : a == 1 ? vpb : a == 2 ? krb : vrb;
			const uint32_t dst = d + (a == 0 ? SP_KPOS : a == 1 ? SP_VPOS
						 : a == 2 ? SP_KROW : SP_VROW);
			const char *src = a == 0 ? kp : a == 1 ? vp : a == 2 ? kr : vr;
			const uint32_t np = rb >> 4, lg = np == 4 ? 2 : np == 2 ? 1 : 0;
#pragma unroll 1
			for (uint32_t o = lane * 16; o < rb * 16; o += 512) {
				uint32_t row = lg || np == 1 ? (o >> 4) >> lg : (o >> 4) / np;
				uint32_t m = (o >> 4) - row * np;
				uint32_t at = row * rb + ((m ^ st_swz(row, np)) << 4);
				cps16(dst + at, src + o);
			}
		}
		asm volatile("cp.async.commit_group;" ::: "memory");
		return;
	}
	st_copy(d + SP_KROW, kr, nt * krb, lane);
	st_copy(d + SP_VROW, vr, nt * vrb, lane);
	st_copy(d + SP_KPOS, kp, nt * kpb, lane);
	st_copy(d + SP_VPOS, vp, nt * vpb, lane);
	asm volatile("cp.async.commit_group;" ::: "memory");
}


/*
 * Quantized rows: the r values st_compact left at the start of tile row
 * @row, expanded in place to channels [0, 8 NG) by the bitmap @bm (no
 * bits at or above d_keep), every group of 8 channels from its own start
 * index as expand_direct does, so NG short chains the compiler may
 * interleave instead of g1_expand's one chain over every channel (the
 * in-place walk's pointer steps were the staged kernel's top stall when
 * the bf16 rows still used it).  In place is safe in any interleaving of
 * the loads as long as each group stores after its own loads and the
 * groups store from the top down (the sts128 are ordered): group g's
 * values lie at indices popc(bits below 8g) .. popc(bits below 8g + 8) - 1,
 * all below 8g + 8, so no higher group's store (channels 8(g + 1) and up)
 * touches them, and a group's own store comes after its loads (it stores
 * them).  Groups past d_keep store zeros.  The loads are not volatile
 * (take_bit): their addresses come from @row passed through a volatile
 * move placed after st_compact's stores, which keeps them behind those.
 */
template <int NG>
__device__ __forceinline__ void expand_inplace(uint32_t row, const uint32_t (&bm)[4])
{
	uint32_t src;
	asm volatile("mov.u32 %0, %1;" : "=r"(src) : "r"(row) : "memory");
	uint32_t base[4];
	expand_bases<NG>(bm, base);
#pragma unroll
	for (int gi = NG - 1; gi >= 0; gi--)
		expand_group(src, row, bm, base, gi);
}

/* Two 6-bit fields at bits 0 and 6 of @t as q_fields' pair. */
__device__ __forceinline__ uint32_t q6_pair(uint32_t t)
{
	const __half2 h = q_fields((t & 0x3fu) | ((t << 10) & 0x3f0000u),
				   __float2half2_rn(1056.0f));
	return *(const uint32_t *)&h;
}

/* The r values of a staged row as fp16 at shared @dst (quantized: the
 * fields' integers; the scale is applied to S or P).  One loop per width,
 * not a test per group: the loop's body was 50 instructions a group at the
 * serving width, a quarter of the kernel's. */
__device__ __forceinline__ void st_compact(const uint32_t *row, uint32_t r, uint32_t vb,
					   uint32_t dst)
{
	const uint32_t ng = (r + 7) >> 3;
	if (vb == 0) {
		for (uint32_t m = 0; m < ng; m++) {
			const uint4 h = bf8_to_h8(((const uint4 *)row)[m]);
			sts128(dst + 16 * m, h.x, h.y, h.z, h.w);
		}
	} else if (vb == 6) {
		/* the serving width, two groups (16 fields, 12 bytes) at a time:
		 * they start at byte 2 + 12k, always 2 mod 4, so their three
		 * words are byte permutes of four loaded ones and every field
		 * pair sits at a fixed shift.  A last group alone loads the two
		 * words it needs (the words the group-wise decode loaded) */
		for (uint32_t k = 0; 16 * k < r; k++) {
			const uint32_t *p = row + 3 * k;
			const uint32_t a = p[0], b = p[1];
			const uint32_t w0 = __byte_perm(a, b, 0x5432);
			if (16 * k + 8 < r) {
				const uint32_t c = p[2], e = p[3];
				const uint32_t w1 = __byte_perm(b, c, 0x5432);
				const uint32_t w2 = __byte_perm(c, e, 0x5432);
				sts128(dst + 32 * k, q6_pair(w0), q6_pair(w0 >> 12),
				       q6_pair(__funnelshift_r(w0, w1, 24)), q6_pair(w1 >> 4));
				sts128(dst + 32 * k + 16, q6_pair(w1 >> 16),
				       q6_pair(__funnelshift_r(w1, w2, 28)), q6_pair(w2 >> 8),
				       q6_pair(w2 >> 20));
			} else {
				const uint32_t w1 = b >> 16;
				sts128(dst + 32 * k, q6_pair(w0), q6_pair(w0 >> 12),
				       q6_pair(__funnelshift_r(w0, w1, 24)), q6_pair(w1 >> 4));
			}
		}
	} else {
		const __half2 one = __float2half2_rn(1.0f);
		for (uint32_t m = 0; m < ng; m++) {
			const uint4 h = q8_to_h8<0, false>(qgroup<true>(row, vb, m), vb, one);
			sts128(dst + 16 * m, h.x, h.y, h.z, h.w);
		}
	}
}

/* KC: 16-channel steps of K̂ and V̂ the products cover (D / 16, or fewer
 * when both halves' d_keep fit: the bench's 96 of 128 runs 6, not 8) */
template <int NQ, int D, int KC = D / 16>
struct ststate {
	static constexpr int NU = (NQ + 3) / 4; /* n-tiles: 4 heads × (hi, lo) each */
	float acc[NU][KC][4]; /* O'ᵀ: rows = channels, columns as S's */
	float m[NU][2], l[NU][2]; /* this lane's two heads per n-tile; l over its tokens */
};

/* A lane's constants of the positions' scatter, set once a CTA (in the
 * sub-block loop they were ~5 % of the kernel's instructions): its
 * vector's r, its row and positions in a stage (byte offsets) and their
 * swizzle keys where the aligned fill laid them out. */
struct pos_lane {
	uint32_t r, row, pos, rk, pk;
};

__device__ __forceinline__ struct pos_lane pos_lane_of(const struct gpu_seg &sg, int lane)
{
	const uint32_t t = lane & 15, kv = lane >> 4;
	const uint32_t rb = 2 * (kv ? sg.v_rs : sg.k_rs);
	const uint32_t pb = kv ? GPU_POS_STRIDE(sg.v_r) : GPU_POS_STRIDE(sg.k_r);
	struct pos_lane pl;
	pl.r = kv ? sg.v_r : sg.k_r;
	pl.row = (kv ? SP_VROW : SP_KROW) + t * rb;
	pl.pos = (kv ? SP_VPOS : SP_KPOS) + t * pb;
	pl.rk = st_swz(t, rb >> 4);
	pl.pk = st_swz(t, pb >> 4);
	return pl;
}

/* The scales of a sub-block's rows g and g + 8 (quantized rows: their
 * first value; 1 for bf16 rows), from stage @S. */
template <int RB>
__device__ __forceinline__ void st_scales(const struct gpu_seg &sg, const struct st_stage<RB> &S,
					  bool pad, int g, bool va, bool vb8, float (&sc)[4])
{
	sc[0] = sc[1] = sc[2] = sc[3] = 1.0f;
	if (sg.k_vb) {
		const uint16_t *kr = (const uint16_t *)S.krow;
		const uint32_t krs = st_rs(sg.k_rs, pad);
		sc[0] = bf1(kr[g * krs]);
		sc[1] = bf1(kr[(g + 8) * krs]);
	}
	if (sg.v_vb) {
		const uint16_t *vr = (const uint16_t *)S.vrow;
		/* stale rows past nt: p = 0 there must not meet a NaN */
		const uint32_t vrs = st_rs(sg.v_rs, pad);
		sc[2] = va ? bf1(vr[g * vrs]) : 0.0f;
		sc[3] = vb8 ? bf1(vr[(g + 8) * vrs]) : 0.0f;
	}
}

/* One sub-block (nt <= 16 tokens) from stage @S; BF: both halves bf16
 * rows, expanded straight from the stage, bf16 products; POS: their
 * values scattered by their positions (st_fill_pos's stage, @pl); G: the
 * group size of both halves' bitmaps (2: bf16 rows only, expand_direct_g2).
 * @after runs once the stage has been read (a single-stage layout refills
 * it there). */
template <int NQ, int D, bool BF, int KC, int RB, bool POS = false, int G = 1, class F>
__device__ __forceinline__ void st_sub(const struct gpu_seg &sg, int nt, bool al16,
				       const struct st_stage<RB> &S, struct st_warp<KC, RB> &W,
				       const uint2 (*qb)[KC][32], ststate<NQ, D, KC> &st,
				       const struct pos_lane &pl, F &&after)
{
	constexpr bool ONE = st_nstages(RB) == 1;
	const bool pad = al16 && nt == 16; /* as st_fill laid the stage out */
	constexpr int LDT = st_warp<KC, RB>::LD;
	constexpr int NU = ststate<NQ, D, KC>::NU;
	int lane = threadIdx.x & 31, t = lane & 15, kv = lane >> 4;
	int g = lane >> 2, tig = lane & 3;
	/* ---- decode: this lane's vector into its tile row ---- */
	if constexpr (POS) {
		/* zero the row, then each value to its channel (st_fill_pos's
		 * layout): ~4 instructions a stored value where the expansion
		 * spends ~6 a channel.  Groups of 8 values; a group's padding
		 * (r not a multiple of 8) holds value 0 at channel d_keep. */
		const uint32_t r = t < nt ? pl.r : 0u;
		const uint32_t rk = pad ? pl.rk : 0u, pk = pad ? pl.pk : 0u;
		const uint32_t trow = (uint32_t)__cvta_generic_to_shared((kv ? W.v : W.k) + t * LDT);
		/* every load of a phase first: the stores below are barriers to
		 * the compiler.  One phase, or one group a phase in the
		 * single-stage layout (at 96 registers all four groups at once
		 * spilled; two at a time spilled less, and the positions' step
		 * ran 3-7 % slower than a group at a time: H200, 1M tokens) */
		constexpr int NG = RB / 16, PH = ONE ? NG : 1, NGP = NG / PH;
		const char *sp = (const char *)&S;
#pragma unroll
		for (int ph = 0; ph < PH; ph++) {
			uint4 v[NGP];
			uint2 p[NGP];
#pragma unroll
			for (int i = 0; i < NGP; i++) {
				const int m = ph * NGP + i;
				if (8u * m < r) {
					v[i] = *(const uint4 *)(sp + pl.row + ((m ^ rk) << 4));
					p[i] = *(const uint2 *)(sp + pl.pos +
								 (((m >> 1) ^ pk) << 4) + 8 * (m & 1));
				}
			}
			if (ph == 0) {
#pragma unroll
				for (int gi = 0; gi < 2 * KC; gi++)
					sts128(trow + 16 * gi, 0u, 0u, 0u, 0u);
			}
#pragma unroll
			for (int i = 0; i < NGP; i++) {
				const int m = ph * NGP + i;
				if (8u * m >= r)
					break;
				const uint32_t vw[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
				for (int e = 0; e < 8; e++) {
					uint32_t c = __byte_perm(e < 4 ? p[i].x : p[i].y, 0u,
								 0x4440u + (e & 3));
					uint32_t x = (e & 1) ? vw[e >> 1] >> 16 : vw[e >> 1];
					sts16(trow + 2 * c, x);
				}
			}
		}
	} else {
		bool valid = t < nt;
		uint32_t rs = kv ? sg.v_rs : sg.k_rs, bw = kv ? sg.v_bw : sg.k_bw;
		uint32_t dk = kv ? sg.v_dk : sg.k_dk, vb = kv ? sg.v_vb : sg.k_vb;
		uint32_t r = valid ? (kv ? sg.v_r : sg.k_r) : 0u;
		uint32_t nch = (dk + 15) & ~15u;
		const uint32_t nbit = G == 2 ? dk / 2 : dk; /* the bitmap's bits */
		const uint32_t *bmp = (kv ? S.vbm : S.kbm) + t * bw;
		const uint32_t *row = (const uint32_t *)(kv ? S.vrow : S.krow) + t * (st_rs(rs, pad) >> 1);
		uint32_t bm[4] = {0u, 0u, 0u, 0u};
		if (valid) {
#pragma unroll
			for (int i = 0; i < D / 32; i++) {
				uint32_t x = (uint32_t)i < bw ? bmp[i] : 0u;
				uint32_t lo = 32u * i;
				bm[i] = nbit >= lo + 32 ? x
					: nbit > lo	? x & ((1u << (nbit - lo)) - 1u)
							: 0u;
			}
		}
		const uint32_t trow = (uint32_t)__cvta_generic_to_shared((kv ? W.v : W.k) + t * LDT);
		if (BF && G == 2) {
			expand_direct_g2<2 * KC, (KC < D / 16)>(
				(uint32_t)__cvta_generic_to_shared(row), trow, bm, nch);
		} else if (BF) {
			expand_direct<2 * KC, (KC < D / 16)>((uint32_t)__cvta_generic_to_shared(row),
							     trow, bm, nch);
		} else {
			if (valid)
				st_compact(row, r, vb, trow);
			expand_inplace<2 * KC>(trow, bm);
		}
	}
	/* rows g and g + 8 are tokens; the scales of quantized rows */
	const bool va = g < nt, vb8 = g + 8 < nt;
	float sc[4];
	if constexpr (ONE)
		st_scales(sg, S, pad, g, va, vb8, sc);
	__syncwarp();
	if constexpr (ONE)
		after();
	/* ---- Sᵀ = K̂ Q'ᵀ (all KC k-steps: columns past d_keep are zero) ---- */
	float s[NU][4];
#pragma unroll
	for (int u = 0; u < NU; u++)
		s[u][0] = s[u][1] = s[u][2] = s[u][3] = 0.0f;
	const uint32_t kaddr = (uint32_t)__cvta_generic_to_shared(
		W.k + (((lane >> 3) & 1) * 8 + (lane & 7)) * LDT + (lane >> 4) * 8);
#pragma unroll
	for (int ks = 0; ks < KC; ks++) {
		uint32_t a0, a1, a2, a3;
		asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
			     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
			     : "r"(kaddr + ks * 32)
			     : "memory");
#pragma unroll
		for (int u = 0; u < NU; u++) {
			uint2 b = qb[u][ks][lane];
			mma_t<BF>(s[u], a0, a1, a2, a3, b.x, b.y);
		}
	}
	if constexpr (!ONE)
		st_scales(sg, S, pad, g, va, vb8, sc);
	const float ksa = sc[0], ksb = sc[1], vsa = sc[2], vsb = sc[3];
	uint32_t pb[NU][2];
#pragma unroll
	for (int u = 0; u < NU; u++) {
		bool grew = false;
		float x[4];
#pragma unroll
		for (int e = 0; e < 4; e++) /* hi + lo halves of the same head */
			x[e] = s[u][e] + __shfl_xor_sync(0xffffffffu, s[u][e], 2);
		x[0] = va ? x[0] * ksa : -INFINITY;
		x[1] = va ? x[1] * ksa : -INFINITY;
		x[2] = vb8 ? x[2] * ksb : -INFINITY;
		x[3] = vb8 ? x[3] * ksb : -INFINITY;
		float p[4];
#pragma unroll
		for (int c = 0; c < 2; c++) {
			float mx = fmaxf(x[c], x[c + 2]);
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
			float mn = fmaxf(st.m[u][c], mx);
			float al = exp2f(st.m[u][c] - mn);
			grew |= mn > st.m[u][c];
			st.m[u][c] = mn;
			p[c] = exp2f(x[c] - mn);
			p[c + 2] = exp2f(x[c + 2] - mn);
			st.l[u][c] = st.l[u][c] * al + (p[c] + p[c + 2]);
			x[c] = al; /* kept for the rescale */
		}
		if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
			for (int mt = 0; mt < KC; mt++) {
				st.acc[u][mt][0] *= x[0];
				st.acc[u][mt][1] *= x[1];
				st.acc[u][mt][2] *= x[0];
				st.acc[u][mt][3] *= x[1];
			}
		}
		/* Pᵀ as B: this lane gives row g (g + 8) of an 8 × 8 [token][column]
		 * matrix, columns 2tig, 2tig + 1 (its heads; hi for tig < 2, lo
		 * above); movmatrix.trans hands lane (g, tig) tokens 2tig, 2tig + 1
		 * of column g */
		bool lo = tig >= 2;
		uint32_t ra = split_t<BF>(p[0] * vsa, p[1] * vsa, lo);
		uint32_t rb = split_t<BF>(p[2] * vsb, p[3] * vsb, lo);
		asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(pb[u][0]) : "r"(ra));
		asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(pb[u][1]) : "r"(rb));
	}
	/* ---- O'ᵀ += V̂ᵀ Pᵀ; ldmatrix.trans lane address: matrix lane / 8 =
	 * channels +0 / +8 (bit 0), tokens +0 / +8 (bit 1) ---- */
	const uint32_t vaddr = (uint32_t)__cvta_generic_to_shared(
		W.v + (((lane >> 4) & 1) * 8 + (lane & 7)) * LDT + ((lane >> 3) & 1) * 8);
#pragma unroll
	for (int mt = 0; mt < KC; mt++) {
		uint32_t a0, a1, a2, a3;
		asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
			     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
			     : "r"(vaddr + mt * 32)
			     : "memory");
#pragma unroll
		for (int u = 0; u < NU; u++)
			mma_t<BF>(st.acc[u][mt], a0, a1, a2, a3, pb[u][0], pb[u][1]);
	}
	__syncwarp();
}

/*
 * A CTA's blocks by the staged path (the list or the range as tc_cta),
 * then tc_finish.  @qr: the segment's rotated queries (QR_ROWS × P).  BF:
 * both halves bf16 rows (st_sub).
 */
template <int NQ, int D, bool BF, int KC = D / 16, int RB = ST_ROWB, bool POS = false, int G = 1>
static __device__ __noinline__ void tc_cta_st(const struct gpu_seg *sgp, const uint32_t *list,
					      uint32_t base_blk, uint32_t cnt, const float *qr,
					      float scale2, float *po, float *pml,
					      struct seg_note J)
{
	constexpr int NU = ststate<NQ, D, KC>::NU, P = NQP(NQ);
	extern __shared__ __align__(16) unsigned char smraw[];
	st_smem<NU, KC, RB> &sm = *(st_smem<NU, KC, RB> *)smraw;
	constexpr int LDT = st_warp<KC, RB>::LD;
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
	/* the descriptor in shared memory, read where used: a copy in
	 * registers was 184 bytes of every thread's stack, reloaded in the
	 * loop */
	static_assert(sizeof(struct gpu_seg) % 8 == 0, "descriptor copied in 8-byte words");
	if (threadIdx.x < sizeof(struct gpu_seg) / 8)
		((uint64_t *)&sm.seg)[threadIdx.x] = ((const uint64_t *)sgp)[threadIdx.x];
	__syncthreads();
	const struct gpu_seg &sg = sm.seg;
	static_assert(!POS || (BF && RB == ST_SMALL_ROWB), "positions: bf16 rows, small layout");
	static_assert(G == 1 || (G == 2 && BF && !POS), "g = 2: bf16 rows by their bitmaps");
	const bool al16 = (((uintptr_t)sg.k_val | (uintptr_t)sg.v_val |
			    (POS ? (uintptr_t)sg.k_pos | (uintptr_t)sg.v_pos
				 : (uintptr_t)sg.k_bm | (uintptr_t)sg.v_bm)) & 15u) == 0;
	struct st_warp<KC, RB> &W = sm.w[w];
	/* this warp's sub-blocks: blocks w, w + 4, ..., 16 tokens at a time;
	 * the first token of its block after next is loaded a block ahead
	 * (@nxt), so that no fill waits on a global load.  (Those first
	 * tokens kept in a shared array instead made every staged test fail
	 * under nvcc 13.0; the SASS looked as if it read element i + 8 for
	 * i + 4.  Not reduced to a reproducer: gpu/NOTES.md.)
	 * The first fill goes out before the queries are set up (the stages
	 * do not overlap sm.qs). */
	uint32_t i = w, t = 0, t1 = 0, nxt = 0;
	if (i < cnt) {
		t = (list ? list[i] - sg.block0 : base_blk + i) * sg.b;
		t1 = min(sg.n, t + sg.b);
		if constexpr (POS)
			st_fill_pos(sg, t, min(16u, t1 - t), W.s[0], lane, al16);
		else
			st_fill(sg, t, min(16u, t1 - t), W.s[0], lane, al16);
		if (i + 4 < cnt)
			nxt = (list ? list[i + 4] - sg.block0 : base_blk + i + 4) * sg.b;
	}
	/* Q'ᵀ fragments: column g of n-tile u is head 4u + g % 4, part g / 4.
	 * Every load first, then the stores: one round trip to L2, not one
	 * per element (the loop stalled on each: 3.5 % of the samples). */
	{
		constexpr int QN = (D * P + 127) / 128; /* blockDim.x == 128 */
		const uint32_t nqs = sg.k_dk * P;
		float qv[QN];
#pragma unroll
		for (int e = 0; e < QN; e++) {
			uint32_t i = threadIdx.x + 128 * e;
			qv[e] = i < nqs ? __ldg(qr + i) : 0.0f;
		}
#pragma unroll
		for (int e = 0; e < QN; e++) {
			uint32_t i = threadIdx.x + 128 * e;
			if (i < nqs)
				sm.qs[i] = qv[e] * scale2;
		}
	}
	__syncthreads();
	for (uint32_t i = threadIdx.x; i < NU * KC * 32; i += blockDim.x) {
		uint32_t ln = i & 31, ks = (i >> 5) % KC, u = (i >> 5) / KC;
		uint32_t h = 4 * u + ((ln >> 2) & 3), c0 = ks * 16 + 2 * (ln & 3);
		bool lo = (ln >> 2) >= 4;
		float q[4];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			uint32_t c = c0 + (e & 1) + (e >> 1) * 8;
			q[e] = h < NQ && c < sg.k_dk ? sm.qs[c * P + (h < NQ ? h : 0)] : 0.0f;
		}
		sm.qb[u][ks][ln] =
			make_uint2(split_t<BF>(q[0], q[1], lo), split_t<BF>(q[2], q[3], lo));
	}
	__syncthreads();
	/* tiles zero once: columns at and past d_keep are never written */
	for (uint32_t i = lane; i < 2 * 16 * LDT / 8; i += 32)
		((uint4 *)W.k)[i] = make_uint4(0, 0, 0, 0);
	ststate<NQ, D, KC> st;
#pragma unroll
	for (int u = 0; u < NU; u++) {
#pragma unroll
		for (int mt = 0; mt < KC; mt++)
			st.acc[u][mt][0] = st.acc[u][mt][1] = st.acc[u][mt][2] = st.acc[u][mt][3] = 0.0f;
		st.m[u][0] = st.m[u][1] = -INFINITY;
		st.l[u][0] = st.l[u][1] = 0.0f;
	}
	__syncwarp();
	constexpr bool ONE = st_nstages(RB) == 1;
	for (int cur = 0; i < cnt; cur ^= ONE ? 0 : 1) {
		uint32_t ni = i, nt0 = t + 16, nt1 = t1;
		if (nt0 >= t1) {
			ni = i + 4;
			if (ni < cnt) {
				nt0 = nxt;
				nt1 = min(sg.n, nt0 + sg.b);
				if (ni + 4 < cnt)
					nxt = (list ? list[ni + 4] - sg.block0
						    : base_blk + ni + 4) * sg.b;
			}
		}
		/* the next sub-block into the other stage now, or (one stage)
		 * into this one as soon as its rows are expanded */
		auto refill = [&](int to) {
			if (ni < cnt) {
				if constexpr (POS)
					st_fill_pos(sg, nt0, min(16u, nt1 - nt0), W.s[to], lane, al16);
				else
					st_fill(sg, nt0, min(16u, nt1 - nt0), W.s[to], lane, al16);
			}
		};
		if constexpr (ONE) {
			asm volatile("cp.async.wait_group 0;" ::: "memory");
		} else if (ni < cnt) {
			refill(cur ^ 1);
			asm volatile("cp.async.wait_group 1;" ::: "memory");
		} else {
			asm volatile("cp.async.wait_group 0;" ::: "memory");
		}
		/* a lane's places, from the descriptor (shared) each sub-block:
		 * kept across the loop they were spilled and reloaded */
		struct pos_lane pl = {0u, 0u, 0u, 0u, 0u};
		if constexpr (POS)
			pl = pos_lane_of(sg, lane);
		__syncwarp();
		st_sub<NQ, D, BF, KC, RB, POS, G>(sg, (int)min(16u, t1 - t), al16, W.s[cur], W,
						  sm.qb, st, pl, [&] { refill(0); });
		i = ni;
		t = nt0;
		t1 = nt1;
	}
	/* ---- the warp's state into the reduction scratch ---- */
	float lsum[NU][2];
#pragma unroll
	for (int u = 0; u < NU; u++)
#pragma unroll
		for (int c = 0; c < 2; c++) {
			float l = st.l[u][c];
			l += __shfl_xor_sync(0xffffffffu, l, 4);
			l += __shfl_xor_sync(0xffffffffu, l, 8);
			l += __shfl_xor_sync(0xffffffffu, l, 16);
			lsum[u][c] = l;
		}
#pragma unroll
	for (int u = 0; u < NU; u++)
#pragma unroll
		for (int mt = 0; mt < KC; mt++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				st.acc[u][mt][e] += __shfl_xor_sync(0xffffffffu, st.acc[u][mt][e], 2);
	__syncthreads(); /* the tiles become the reduction scratch */
	float *sacc = sm.f.red, *sml = sm.f.red + 4 * NQ * GPU_MAX_D;
	uint32_t vdk = sg.v_dk;
	if (tig < 2) {
#pragma unroll
		for (int u = 0; u < NU; u++)
#pragma unroll
			for (int c = 0; c < 2; c++) {
				uint32_t h = 4 * u + 2 * tig + c;
				if (h >= NQ)
					continue;
#pragma unroll
				for (int mt = 0; mt < KC; mt++) {
					uint32_t ch = mt * 16 + g;
					if (ch < vdk)
						sacc[(w * NQ + h) * GPU_MAX_D + ch] = st.acc[u][mt][c];
					if (ch + 8 < vdk)
						sacc[(w * NQ + h) * GPU_MAX_D + ch + 8] = st.acc[u][mt][c + 2];
				}
				if (g == 0) {
					sml[(w * NQ + h) * 2] = st.m[u][c];
					sml[(w * NQ + h) * 2 + 1] = lsum[u][c];
				}
			}
	}
	/* without room for R_v a CTA that rotates back reads it from L2 (the
	 * kernel prefetched it there at the CTA's start) */
	constexpr bool RVS = st_rv_smem(RB);
	tc_finish<NQ, D>(sg, sacc, sml, RVS ? sm.f.rv : (uint16_t *)sg.v_rot, sm.f.orot, po, pml,
			 RVS, &J);
}

/*
 * A CTA's blocks (list[0 .. cnt) or blocks base_blk .. + cnt of *sgp), then
 * the warps' merge and the partial (rotated: @J).  Not inlined, one
 * instance per sub-block kind: each gets its own register allocation, so
 * the walk's registers do not spill the scatter's accumulators (inlined
 * together they did: 104-312 B of stack in every instance).  Q' fragments
 * are in sm.qf.
 */
template <int NQ, int D, bool WALK>
static __device__ __noinline__ void tc_cta(const struct gpu_seg *sgp, const uint32_t *list,
					   uint32_t base_blk, uint32_t cnt, float *po, float *pml,
					   struct seg_note J)
{
	extern __shared__ __align__(16) unsigned char smraw[];
	tc_smem &sm = *(tc_smem *)smraw;
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
	const struct gpu_seg sg = *sgp;
	uint32_t qa[8][2]; /* the scatter keeps them in registers */
	if constexpr (!WALK)
		load_qa(sm.qf, qa);
	tcstate<NQ> st;
	st.m = -INFINITY;
	st.l = 0.0f;
#pragma unroll
	for (int n = 0; n < 16; n++)
		st.acc[n][0] = st.acc[n][1] = 0.0f;
	/* The walk's products read all D / 16 k-steps of K̂ (no per-step
	 * guard: guarded, the mma chains compiled to predicated HMMAs with
	 * register copies); its columns at and past d_keep are never written:
	 * zero them once.  V̂ columns past v_dk only feed accumulators that
	 * are never read.  (The scatter keeps its guards: unguarded, it
	 * spilled 96 bytes at D = 128 and ran 3 % slower.) */
	if constexpr (WALK) {
		for (uint32_t i = lane; i < 16 * TK_LD / 8; i += 32)
			((uint4 *)sm.t[w].k)[i] = make_uint4(0, 0, 0, 0);
		__syncwarp();
	}
	if (w < cnt)
		prefetch_block(sg, list ? list[w] - sg.block0 : base_blk + w);
	for (uint32_t i = w; i < cnt; i += 4) {
		uint32_t j = list ? list[i] - sg.block0 : base_blk + i;
		if (i + 4 < cnt) /* this warp's next block, into L2 */
			prefetch_block(sg, list ? list[i + 4] - sg.block0 : base_blk + i + 4);
		uint32_t t0 = j * sg.b, t1 = min(sg.n, t0 + sg.b);
		for (uint32_t t = t0; t < t1; t += 16) {
			if constexpr (WALK)
				tc_sub_g1<NQ, D>(sg, t, (int)min(16u, t1 - t), sm.qf, sm.t[w], st);
			else
				tc_sub<NQ>(sg, t, (int)min(16u, t1 - t), qa, sm.t[w], st);
		}
	}
	/* ---- merge the warps, write the partial (k_segrot rotates it) ---- */
	float l = st.l;
	l += __shfl_xor_sync(0xffffffffu, l, 1);
	l += __shfl_xor_sync(0xffffffffu, l, 2);
	__syncthreads(); /* the tiles become the reduction scratch */
	float *sacc = sm.red, *sml = sm.red + 4 * NQ * GPU_MAX_D;
	uint32_t vdk = sg.v_dk;
	if (g < NQ) {
#pragma unroll
		for (int n = 0; n < 16; n++) {
			uint32_t c = n * 8 + 2 * tig;
			if (c < vdk) {
				sacc[(w * NQ + g) * GPU_MAX_D + c] = st.acc[n][0];
				sacc[(w * NQ + g) * GPU_MAX_D + c + 1] = st.acc[n][1];
			}
		}
		if (tig == 0) {
			sml[(w * NQ + g) * 2] = st.m;
			sml[(w * NQ + g) * 2 + 1] = l;
		}
	}
	tc_finish<NQ, D>(sg, sacc, sml, sm.rv, sm.orot, po, pml, true, &J);
}

/*
 * SMALL (GPU_ATTN_SMALL_ROWS: the caller promises st_small_ok of every
 * segment and buffer): the staged path only, in the small layout at 96
 * registers, five CTAs per SM instead of three (more warps to hide the
 * kernel's latencies; ST_SMALL_NS).  A segment that
 * breaks the promise gets a NaN partial (the output shows it; nothing is
 * read or written out of bounds).
 */
template <int NQ, int D, bool SMALL>
__global__ void __launch_bounds__(128, SMALL ? ST_SMALL_CTAS : 3)
	k_attn_packed_tc(const struct gpu_head *heads, const float *q, float scale2, char *ws,
			 struct ws_layout L, uint32_t flags)
{
	pdl_begin();
	extern __shared__ __align__(16) unsigned char smraw[];
	tc_smem &sm = *(tc_smem *)smraw;
	uint32_t hi, x;
	const bool idle = slot_of(ws, L, &hi, &x);
	const struct gpu_head *H = &heads[hi];
	const uint32_t *counts = WSP(uint32_t, L, counts, ws, hi);
	float *po = WSP(float, L, part_o, ws, hi) + (size_t)x * NQ * D;
	float *pml = WSP(float, L, part_ml, ws, hi) + (size_t)x * NQ * 2;
	if (idle) {
		mark_empty(pml, NQ);
		return;
	}
	const float *qh = q + (size_t)hi * NQ * D;
	constexpr int P = NQP(NQ);
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;

	const struct gpu_seg *sgp;
	const uint32_t *list = NULL;
	uint32_t si, b0 = 0, cnt;
	if (!packed_cta_work<NQ, D>(H, counts, x, hi, ws, L, qh, scale2, sm.red, po, pml, &sgp,
				    &list, &si, &b0, &cnt))
		return;
	const struct gpu_seg sg = *sgp;
	/* the chunk's state stays rotated (k_segrot rotates back), unless the
	 * CTA holds the whole segment (seg_whole: tc_finish rotates) */
	const struct seg_note J = {seg_whole(sg, si == H->nseg, L.cwl)
					   ? (uint32_t *)NULL
					   : SEGNOTE(ws, L, gridDim.y, hi, si),
				   x};
	/* R_v into L2 for this CTA's own rotation, a line a thread (a line a
	 * lane of every warp was 4x the prefetches: 2.6 % of the stall
	 * samples at 1M).  Not where k_segrot rotates: there every CTA of the
	 * segment prefetched the same 24 KB for a kernel that, by the time it
	 * ran, read R_v from DRAM anyway (ncu, twenty-fifth session), and
	 * without them the step is 1-2 % faster (H200, 1M batch 1 214.2 against
	 * 218.0 µs, 256K 92.2 against 94.2, every packed column alike:
	 * thirty-first session) */
	if (!J.note)
		for (uint32_t o = threadIdx.x * 128; o < sg.v_dk * D * 2; o += blockDim.x * 128)
			asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)sg.v_rot + o));
	const float *qr = WSP(float, L, qr, ws, hi) + (size_t)si * QR_ROWS * P;
	const bool pos = sg.k_vb == 0 && sg.v_vb == 0 && sg.k_pos && sg.v_pos;
	if constexpr (SMALL) {
		if (!st_small_ok(sg, D) || (sg.sched && !(st_g1(sg) && pos))) {
			nan_partial<NQ, D>(po, pml);
		} else if (st_g2(sg)) {
			tc_cta_st<NQ, D, true, 3 * D / 64, ST_SMALL_ROWB, false, 2>(
				sgp, list, list ? 0 : b0, cnt, qr, scale2, po, pml, J);
		} else if (pos) {
			tc_cta_st<NQ, D, true, 3 * D / 64, ST_SMALL_ROWB, true>(
				sgp, list, list ? 0 : b0, cnt, qr, scale2, po, pml, J);
		} else if (sg.k_vb == 0 && sg.v_vb == 0) {
			tc_cta_st<NQ, D, true, 3 * D / 64, ST_SMALL_ROWB>(sgp, list, list ? 0 : b0, cnt,
									  qr, scale2, po, pml, J);
		} else {
			tc_cta_st<NQ, D, false, 3 * D / 64, ST_SMALL_ROWB>(sgp, list, list ? 0 : b0,
									   cnt, qr, scale2, po, pml, J);
		}
		return;
	}
	if (sg.sched) { /* scheduled rows: the positions' path only */
		nan_partial<NQ, D>(po, pml);
		return;
	}
	if (st_ok(sg, flags)) {
		/* bf16 rows with d_keep <= 3d/4 on both halves (the bench's):
		 * 6 of 8 steps at d 128, no test per expansion group */
		if (st_g2(sg))
			tc_cta_st<NQ, D, true, D / 16, ST_ROWB, false, 2>(sgp, list, list ? 0 : b0, cnt,
									  qr, scale2, po, pml, J);
		else if (sg.k_vb == 0 && sg.v_vb == 0 && sg.k_dk <= 3 * D / 4 && sg.v_dk <= 3 * D / 4)
			tc_cta_st<NQ, D, true, 3 * D / 64>(sgp, list, list ? 0 : b0, cnt, qr, scale2,
							   po, pml, J);
		else if (sg.k_vb == 0 && sg.v_vb == 0)
			tc_cta_st<NQ, D, true>(sgp, list, list ? 0 : b0, cnt, qr, scale2, po, pml, J);
		else
			tc_cta_st<NQ, D, false>(sgp, list, list ? 0 : b0, cnt, qr, scale2, po, pml, J);
		return;
	}
	for (uint32_t i = threadIdx.x; i < sg.k_dk * P; i += blockDim.x)
		sm.qs[i] = qr[i] * scale2;
	__syncthreads();
	/* A fragments of Q' (rows = heads; rows >= NQ and 8..15 zero) */
	uint32_t qa[8][2];
#pragma unroll
	for (int ks = 0; ks < 8; ks++) {
		float a[4];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			uint32_t c = ks * 16 + 2 * tig + (e & 1) + (e >> 1) * 8;
			a[e] = (g < NQ && c < sg.k_dk) ? sm.qs[c * P + (g < NQ ? g : 0)] : 0.0f;
		}
		qa[ks][0] = h2pack(a[0], a[1]);
		qa[ks][1] = h2pack(a[2], a[3]);
	}
	if (w == 0)
#pragma unroll
		for (int k2 = 0; k2 < 4; k2++)
			sm.qf[k2][lane] = make_uint4(qa[2 * k2][0], qa[2 * k2][1], qa[2 * k2 + 1][0],
						     qa[2 * k2 + 1][1]);
	__syncthreads();
	uint32_t base_blk = list ? 0 : b0;
	/* the channel-major walk for g == 1 where at least half the channels
	 * hold a value (measured: slower than the scatter at r = 32 of 96) */
	bool walk = sg.k_g == 1 && sg.v_g == 1 && 2 * sg.k_r >= sg.k_dk &&
		    2 * sg.v_r >= sg.v_dk && !(flags & GPU_ATTN_SCATTER);
	if (walk)
		tc_cta<NQ, D, true>(sgp, list, base_blk, cnt, po, pml, J);
	else
		tc_cta<NQ, D, false>(sgp, list, base_blk, cnt, po, pml, J);
}

/*
 * The chunks of segment blockIdx.x (nseg: the update buffer) of context
 * blockIdx.y, left in rotated space by k_attn_packed_tc: their states
 * combined into the lowest slot, rotated back once, the other slots
 * emptied (l = 0) for k_merge.  Grid (max_segs + 1, n_heads).
 */
/* chunks of a segment k_segrot loads at once (a batch): 6 × SR_U values
 * in registers.  Six CTAs per SM (37 KB of shared memory each) at <= 80
 * registers. */
#define SR_U 8

template <int NQ, int D>
__global__ void __launch_bounds__(128, 6) k_segrot(const struct gpu_head *heads, char *ws,
						struct ws_layout L)
{
	__shared__ __align__(16) uint16_t rv[GPU_MAX_D * GPU_MAX_D];
	__shared__ __align__(16) float orot[8 * GPU_MAX_D];
	__shared__ float mh[NQ], lh[NQ];
	uint32_t si = blockIdx.x, hi = blockIdx.y;
	pdl_trigger();
	/* the context's segments and R_v are the caller's, not the attention
	 * kernel's: R_v is copied while that kernel finishes */
	const struct gpu_head *H = &heads[hi];
	uint32_t nseg = H->nseg;
	const struct gpu_seg *sgp = si < nseg ? &H->segs[si] : si == nseg ? H->buf : NULL;
	if (sgp && seg_whole(*sgp, si == nseg, L.cwl)) {
		/* its attention CTA rotated it back.  The wait all the same:
		 * k_merge waits for this grid only, and where every segment and
		 * the buffer are whole every CTA would end here, without having
		 * waited for the attention kernel (whether a grid can then end
		 * before the grid it depends on is not documented; the wait
		 * costs nothing where the attention kernel is the longer) */
		pdl_wait();
		return;
	}
	uint32_t vdk = sgp ? sgp->v_dk : 0;
	if (sgp)
		cta_copy_rv_swz<D>(rv, sgp->v_rot, vdk);
	pdl_wait();
	const uint32_t *note = SEGNOTE(ws, L, gridDim.y, hi, si);
	uint32_t n = __ldcg(&note[0]), xa = ~__ldcg(&note[1]);
	if (n == 0 || !sgp) {
		cta_copy_wait();
		return;
	}
	float *po0 = WSP(float, L, part_o, ws, hi), *pml0 = WSP(float, L, part_ml, ws, hi);
	/* the chunks are slots xa .. xa + n - 1: a segment's are consecutive
	 * (its empty windows count too: packed_cta_work) */
	const float2 *ml0 = (const float2 *)(pml0 + (size_t)xa * NQ * 2);
	/* a thread per head and 4 channels (looping where NQ × vdk / 4 passes
	 * 128), the chunks SR_U at a time: each batch's (m, l) and values
	 * loaded before any math (one L2 round trip a batch: segments of 16K
	 * tokens have 4-8 chunks of 256 blocks at the bench's shapes, 16-32
	 * of 64), folded online (the running maximum rescales what came
	 * before); no barrier before the rotation.  A thread per channel
	 * and every head loaded each slot's (m, l) in every thread and its
	 * values a float at a time: 32 loads a thread where this issues 2U
	 * (bench/tail_probe.py, H200, 1M tokens: the batch's round trip
	 * stayed at 1.3-1.4 µs, the fold after it fell 0.77 -> 0.61; at 256K
	 * one batch of eight slots replaced two of four, 1.66 -> 0.54).
	 * (Two passes over the chunks, a loop of L2 loads each, cost 2n
	 * round trips: the narrow chunks of small steps made that the long
	 * path.) */
	constexpr int U = SR_U;
	/* channels past vdk (none at d_keep = d or 3d/4) are read from the
	 * slot's D and folded into orot rows the rotation ignores */
	const uint32_t nc4 = (vdk + 3) >> 2;
	for (uint32_t it = threadIdx.x; it < NQ * nc4; it += blockDim.x) {
		const uint32_t h = it / nc4, c = 4 * (it - h * nc4);
		float M = -INFINITY, ll = 0.0f;
		float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		for (uint32_t x0 = 0; x0 < n; x0 += U) {
			float2 ml[U];
			float4 pv[U];
#pragma unroll
			for (int u = 0; u < U; u++) {
				const bool ok = x0 + u < n;
				ml[u] = ok ? ml0[(x0 + u) * NQ + h] : make_float2(-INFINITY, 0.0f);
				pv[u] = ok ? *(const float4 *)&po0[((size_t)(xa + x0 + u) * NQ + h) * D + c]
					   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
			}
			float mb = M;
#pragma unroll
			for (int u = 0; u < U; u++)
				if (ml[u].y > 0.0f)
					mb = fmaxf(mb, ml[u].x);
			if (mb == -INFINITY) /* no slot with l > 0 yet */
				continue;
			const float f0 = exp2f(M - mb); /* 0 while M is -inf */
			o.x *= f0;
			o.y *= f0;
			o.z *= f0;
			o.w *= f0;
			ll *= f0;
#pragma unroll
			for (int u = 0; u < U; u++)
				if (ml[u].y > 0.0f) {
					const float f = exp2f(ml[u].x - mb);
					o.x = fmaf(f, pv[u].x, o.x);
					o.y = fmaf(f, pv[u].y, o.y);
					o.z = fmaf(f, pv[u].z, o.z);
					o.w = fmaf(f, pv[u].w, o.w);
					ll += f * ml[u].y;
				}
			M = mb;
		}
		orot[c * 8 + h] = o.x;
		orot[(c + 1) * 8 + h] = o.y;
		orot[(c + 2) * 8 + h] = o.z;
		orot[(c + 3) * 8 + h] = o.w;
		if (c == 0) {
			mh[h] = M;
			lh[h] = ll;
		}
	}
	cta_copy_wait();
	__syncthreads(); /* every slot read; R_v, orot, mh and lh complete */
	if (threadIdx.x < NQ) {
		uint32_t h = threadIdx.x;
		for (uint32_t x = xa + 1; x < xa + n; x++)
			pml0[((size_t)x * NQ + h) * 2 + 1] = 0.0f;
		pml0[((size_t)xa * NQ + h) * 2] = mh[h];
		pml0[((size_t)xa * NQ + h) * 2 + 1] = lh[h];
	}
	rotate_back_tc<NQ, D>(rv, orot, vdk, po0 + (size_t)xa * NQ * D);
}

/* ------------------------------------------------------------------ */
/* merge: grid (H, NQ); a thread per 4 channels and slot group.          */

#define MERGE_T 1024
#define MERGE_U 8      /* slots in flight per thread */
#define MERGE_PRE 4    /* slot states a thread loads before the compaction */
#define MERGE_LIVE 1024 /* live slots the compaction keeps */
#define MERGE_UL 4     /* live slots in flight per thread */

/*
 * Flash-decoding merge of a context's partial states (slots: m in the exp2
 * domain, l, unnormalized o); slots with l = 0 are empty.
 *
 * After k_segrot most slots are empty (at 1M tokens, batch 1: ~66 live of
 * 2,576), so the merge first compacts the live slots, in slot order, with
 * their (m, l): one round of 8-byte loads and a block scan.  With the
 * maximum known it then reads only the live slots' values, each thread a
 * slot group, every weight exp2(m - M) final: one round of L2 loads where
 * the scan over every slot took ceil(slots / 256) (~7 us of a ~200 us
 * step).  The order of the sums is fixed, so the output is the same run
 * to run.  Where more than MERGE_T * MERGE_PRE slots exist or more than
 * MERGE_LIVE are live (dense and Quest steps), or with @all
 * (GPU_ATTN_MERGE_ALL), merge_all folds every slot online instead.
 */
template <int D>
static __device__ __noinline__ void merge_all(const float *po, const float *pml, uint32_t ns,
						 uint32_t nq, uint32_t h, float4 (*so)[D / 4],
						 float (*sm)[D / 4], float (*sl)[D / 4], float *out)
{
	constexpr int NC = D / 4, G = MERGE_T / NC;
	uint32_t q4 = threadIdx.x % NC, g = threadIdx.x / NC;
	float M = -INFINITY, l = 0.0f;
	float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	for (uint32_t s0 = g; s0 < ns; s0 += G * MERGE_U) {
		float2 ml[MERGE_U];
		float4 ov[MERGE_U];
#pragma unroll
		for (int u = 0; u < MERGE_U; u++) {
			uint32_t sl_ = s0 + G * u;
			if (sl_ < ns) {
				ml[u] = __ldg((const float2 *)(pml + ((size_t)sl_ * nq + h) * 2));
				ov[u] = __ldg((const float4 *)(po + ((size_t)sl_ * nq + h) * D) + q4);
			} else {
				ml[u] = make_float2(0.0f, 0.0f);
			}
		}
#pragma unroll
		for (int u = 0; u < MERGE_U; u++) {
			if (!(ml[u].y > 0.0f))
				continue;
			if (ml[u].x > M) {
				float r = exp2f(M - ml[u].x); /* 0 for the first */
				M = ml[u].x;
				l *= r;
				o.x *= r; o.y *= r; o.z *= r; o.w *= r;
			}
			float f = exp2f(ml[u].x - M);
			l = fmaf(f, ml[u].y, l);
			o.x = fmaf(f, ov[u].x, o.x);
			o.y = fmaf(f, ov[u].y, o.y);
			o.z = fmaf(f, ov[u].z, o.z);
			o.w = fmaf(f, ov[u].w, o.w);
		}
	}
	so[g][q4] = o;
	sm[g][q4] = M;
	sl[g][q4] = l;
	__syncthreads();
	if (g != 0)
		return;
	float MM = -INFINITY;
	for (int k = 0; k < G; k++)
		if (sl[k][q4] > 0.0f)
			MM = fmaxf(MM, sm[k][q4]);
	float L_ = 0.0f;
	float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	for (int k = 0; k < G; k++)
		if (sl[k][q4] > 0.0f) {
			float f = exp2f(sm[k][q4] - MM);
			float4 v = so[k][q4];
			L_ = fmaf(f, sl[k][q4], L_);
			O.x = fmaf(f, v.x, O.x);
			O.y = fmaf(f, v.y, O.y);
			O.z = fmaf(f, v.z, O.z);
			O.w = fmaf(f, v.w, O.w);
		}
	float4 r = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	if (L_ > 0.0f)
		r = make_float4(O.x / L_, O.y / L_, O.z / L_, O.w / L_);
	((float4 *)(out + ((size_t)blockIdx.x * nq + h) * D))[q4] = r;
}

/* grid (H, NQ): a context and head each */
template <int D>
__global__ void __launch_bounds__(MERGE_T) k_merge(uint32_t nq, char *ws, struct ws_layout L,
						   float *out, uint32_t all)
{
	pdl_begin();
	constexpr int NC = D / 4, G = MERGE_T / NC, NW = MERGE_T / 32;
	uint32_t hi = blockIdx.x, h = blockIdx.y;
	const float *po = WSP(float, L, part_o, ws, hi);
	const float *pml = WSP(float, L, part_ml, ws, hi);
	__shared__ float4 so[G][NC];
	__shared__ float sm[G][NC], sl[G][NC];
	__shared__ uint32_t lv[MERGE_LIVE];
	__shared__ float lw[MERGE_LIVE], lm[MERGE_LIVE];
	__shared__ uint32_t wcnt[NW];
	__shared__ float wmax[NW];
	const uint32_t ns = L.slots, lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	if (all || ns > MERGE_T * MERGE_PRE) {
		merge_all<D>(po, pml, ns, nq, h, so, sm, sl, out);
		return;
	}
	/* ---- the live slots, in slot order, with their m and l ---- */
	float2 ml[MERGE_PRE];
#pragma unroll
	for (int k = 0; k < MERGE_PRE; k++) {
		uint32_t x = threadIdx.x + MERGE_T * k;
		ml[k] = x < ns ? __ldg((const float2 *)(pml + ((size_t)x * nq + h) * 2))
			       : make_float2(0.0f, 0.0f);
	}
	uint32_t nlive = 0;
	float mx = -INFINITY;
#pragma unroll
	for (int k = 0; k < MERGE_PRE; k++) {
		if (MERGE_T * k >= ns) /* CTA-uniform */
			break;
		const bool live = ml[k].y > 0.0f;
		const uint32_t bal = __ballot_sync(0xffffffffu, live);
		if (lane == 0)
			wcnt[wid] = __popc(bal);
		__syncthreads();
		uint32_t c = lane < NW ? wcnt[lane] : 0u, inc = c;
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			uint32_t v = __shfl_up_sync(0xffffffffu, inc, o);
			if (lane >= (uint32_t)o)
				inc += v;
		}
		const uint32_t before = __shfl_sync(0xffffffffu, inc - c, wid);
		const uint32_t tot = __shfl_sync(0xffffffffu, inc, 31);
		const uint32_t at = nlive + before + __popc(bal & ((1u << lane) - 1u));
		if (live && at < MERGE_LIVE) {
			lv[at] = threadIdx.x + MERGE_T * k;
			lm[at] = ml[k].x;
			lw[at] = ml[k].y;
		}
		if (live)
			mx = fmaxf(mx, ml[k].x);
		nlive += tot;
		__syncthreads(); /* wcnt is read before the next round writes it */
	}
	if (nlive > MERGE_LIVE) { /* CTA-uniform */
		merge_all<D>(po, pml, ns, nq, h, so, sm, sl, out);
		return;
	}
	for (int o = 16; o > 0; o >>= 1)
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
	if (lane == 0)
		wmax[wid] = mx;
	__syncthreads();
	float M = -INFINITY;
	for (int k = 0; k < NW; k++)
		M = fmaxf(M, wmax[k]);
	/* each live slot's weight (lm: m, then the weight; lw: l) */
	for (uint32_t i = threadIdx.x; i < nlive; i += MERGE_T)
		lm[i] = exp2f(lm[i] - M);
	__syncthreads();
	/* ---- the values: thread (q4, g) takes live slots g, g + G, ... ---- */
	const uint32_t q4 = threadIdx.x % NC, g = threadIdx.x / NC;
	float l = 0.0f;
	float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	for (uint32_t i0 = g; i0 < nlive; i0 += G * MERGE_UL) {
		float4 ov[MERGE_UL];
#pragma unroll
		for (int u = 0; u < MERGE_UL; u++) {
			uint32_t i = i0 + G * u;
			if (i < nlive)
				ov[u] = __ldg((const float4 *)(po + ((size_t)lv[i] * nq + h) * D) + q4);
		}
#pragma unroll
		for (int u = 0; u < MERGE_UL; u++) {
			uint32_t i = i0 + G * u;
			if (i < nlive) {
				float f = lm[i];
				l = fmaf(f, lw[i], l);
				o.x = fmaf(f, ov[u].x, o.x);
				o.y = fmaf(f, ov[u].y, o.y);
				o.z = fmaf(f, ov[u].z, o.z);
				o.w = fmaf(f, ov[u].w, o.w);
			}
		}
	}
	so[g][q4] = o;
	sl[g][q4] = l;
	__syncthreads();
	if (g != 0)
		return;
	float L_ = 0.0f;
	float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	for (int k = 0; k < G; k++) {
		float4 v = so[k][q4];
		L_ += sl[k][q4];
		O.x += v.x;
		O.y += v.y;
		O.z += v.z;
		O.w += v.w;
	}
	float4 r = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
	if (L_ > 0.0f)
		r = make_float4(O.x / L_, O.y / L_, O.z / L_, O.w / L_);
	((float4 *)(out + ((size_t)hi * nq + h) * D))[q4] = r;
}

/* ------------------------------------------------------------------ */
/* Quest attention, and the first dense flash-decoding kernel (CUDA     */
/* cores; gpu_attend_dense with GPU_ATTN_CUDA_CORES, kept to compare).  */

template <int NQ, int D>
__global__ void __launch_bounds__(128) k_attn_dense(const struct gpu_dense_head *heads,
						    const float *q, float scale2, char *ws,
						    struct ws_layout L, int quest, uint32_t qb)
{
	pdl_begin();
	__shared__ __align__(16) float sm[4 * NQ * (D + 2)];
	uint32_t hi, x;
	const bool idle = slot_of(ws, L, &hi, &x);
	const struct gpu_dense_head *H = &heads[hi];
	float *po = WSP(float, L, part_o, ws, hi) + (size_t)x * NQ * D;
	float *pml = WSP(float, L, part_ml, ws, hi) + (size_t)x * NQ * 2;
	if (idle) {
		mark_empty(pml, NQ);
		return;
	}
	const float *qh = q + (size_t)hi * NQ * D;
	int w = threadIdx.x >> 5;
	if (x >= L.max_chunks) {
		uint32_t t0 = (x - L.max_chunks) * WIN_TILE;
		if (t0 >= H->win_n) {
			mark_empty(pml, NQ);
			return;
		}
		window_cta<NQ, D>(H->win_k, H->win_v, t0, min(H->win_n, t0 + WIN_TILE), qh, scale2,
				  sm, po, pml);
		return;
	}
	float q2[NQ][8];
	load_q2<NQ, D>(qh, scale2, q2);
	dstate<NQ, D> st;
	dstate_init(st);
	if (!quest) {
		uint64_t t0 = (uint64_t)x * DENSE_T;
		if (t0 >= H->n) {
			mark_empty(pml, NQ);
			return;
		}
		uint64_t t1 = min(H->n, t0 + DENSE_T);
		/* keep two more tiles per warp on their way into L2 */
		for (uint64_t t = t0 + 16 * w; t < t1 && t < t0 + 16 * w + 128; t += 64) {
			uint32_t nb = (uint32_t)min((uint64_t)16, t1 - t) * D * 2;
			prefetch_l2(H->k + t * D, nb);
			prefetch_l2(H->v + t * D, nb);
		}
		for (uint64_t t = t0 + 16 * w; t < t1; t += 64) {
			uint64_t tp = t + 128;
			if (tp < t1) {
				uint32_t nb = (uint32_t)min((uint64_t)16, t1 - tp) * D * 2;
				prefetch_l2(H->k + tp * D, nb);
				prefetch_l2(H->v + tp * D, nb);
			}
			dense_tile<NQ, D>(H->k + t * D, H->v + t * D, (int)min((uint64_t)16, t1 - t), q2, st);
		}
	} else {
		const uint32_t *sel = WSP(uint32_t, L, sel, ws, hi);
		uint32_t s0, s1;
		if (L.cut_only) { /* part of window x >> pl of 1 << cwl blocks (packed_cta_work) */
			uint32_t nb = (uint32_t)((H->n + qb - 1) / qb), a0 = (x >> L.pl) << L.cwl;
			const uint32_t *X = SELX(ws, hi);
			uint32_t lo = 0;
			uint32_t n = a0 < nb ? window_take(WSP(float, L, scores, ws, hi), a0,
							   min(nb, a0 + (1u << L.cwl)), X[SX_KSTAR],
							   X[SX_TMAX], x & ((1u << L.pl) - 1u), L.pl,
							   L.pb, WSP(uint32_t, L, sel, ws, hi) + a0, &lo)
					     : 0u;
			if (n == 0) {
				mark_empty(pml, NQ);
				return;
			}
			s0 = a0 + lo;
			s1 = s0 + n;
		} else {
			const uint32_t *counts = WSP(uint32_t, L, counts, ws, hi);
			if (x >= counts[1]) {
				mark_empty(pml, NQ);
				return;
			}
			const uint32_t *chunk = WSP(uint32_t, L, chunk, ws, hi);
			s0 = chunk[x];
			s1 = chunk[x + 1];
		}
		/* warps take 16-token tiles of the chunk's blocks round-robin */
		uint32_t tpb = (qb + 15) / 16, ntiles = (s1 - s0) * tpb;
		for (uint32_t i = w; i < ntiles && i < w + 8; i += 4) {
			uint64_t t = (uint64_t)sel[s0 + i / tpb] * qb + (i % tpb) * 16;
			uint32_t nb = (uint32_t)(min(H->n, t + 16) - min(H->n, t)) * D * 2;
			prefetch_l2(H->k + t * D, nb);
			prefetch_l2(H->v + t * D, nb);
		}
		for (uint32_t i = w; i < ntiles; i += 4) {
			uint32_t blk = sel[s0 + i / tpb];
			uint64_t t = (uint64_t)blk * qb + (i % tpb) * 16;
			uint64_t te = min(H->n, (uint64_t)blk * qb + qb);
			if (i + 8 < ntiles) { /* the same tile of the warp's block after next */
				uint64_t tp = (uint64_t)sel[s0 + (i + 8) / tpb] * qb + ((i + 8) % tpb) * 16;
				uint32_t nb = (uint32_t)(min(H->n, tp + 16) - min(H->n, tp)) * D * 2;
				prefetch_l2(H->k + tp * D, nb);
				prefetch_l2(H->v + tp * D, nb);
			}
			if (t < te)
				dense_tile<NQ, D>(H->k + t * D, H->v + t * D, (int)min((uint64_t)16, te - t), q2, st);
		}
	}
	dense_finish<NQ, D>(st, sm, po, pml);
}

/* ------------------------------------------------------------------ */
/* Dense flash-decoding on the tensor cores (gpu_attend_dense).         */
/*
 * A context's token stream is its n history tokens followed by its window;
 * it is cut into nsplit equal ranges (multiples of DN_T tokens), one CTA
 * each, so that n_heads × nsplit CTAs fill whole waves of the GPU.  A CTA
 * streams its range through a ST-deep pipeline of DN_T-token K and V tiles
 * in shared memory (no registers held by loads in flight); its 4 warps take
 * 16 tokens of each tile.  Per warp and 16 tokens: S = Q Kᵀ and O += P V by
 * mma.m16n8k16 (bf16 operands, fp32 accumulation).  Rows 0..7 of A are the
 * group's queries rounded to bf16 and rows 8..15 what that rounding left
 * (q = hi + lo, to ~2^-17), likewise for p: the two halves of each
 * accumulator row pair are summed by the thread that holds both, so the
 * products lose nothing a CPU-reference test can see.  The C fragment of S
 * is the A fragment of P (no shuffles).  K fragments are 16-byte shared
 * loads (the 4 lanes of a token read 4 of its 16-byte chunks each: a
 * channel permutation that Q's fragments mirror), V fragments
 * ldmatrix.trans.  Softmax in the exp2 domain; the accumulators are
 * rescaled only when a row's maximum grows (warp vote).  Partials (o, m, l)
 * go to the dense slots of the scratch and k_merge combines them.
 *
 * Two ways to fill a stage (template TMA):
 *   cp.async  16 bytes per thread-copy (zero-fill past the range), rows
 *             XOR-swizzled per token (dn_sw) so that the K loads and
 *             ldmatrix are conflict-free;
 *   bulk      cp.async.bulk (the copy engine) of 8-token sub-tiles, 16
 *             copies per stage issued by one warp, completion on an
 *             mbarrier; sub-tile i sits at i × (8 rows + 16 bytes), and
 *             a warp's 16 tokens are rows 2w, 2w+1 of the 8 sub-tiles, so
 *             the 8 tokens of a fragment lie in 8 different bank groups.
 *             A partial last tile is read over zeroed (or earlier, finite)
 *             rows, masked in S.
 */
#define DN_T 64 /* tokens per pipeline stage (K and V tiles) */
/* Default: cp.async, 2 stages (64 KiB at d = 128: 3 CTAs per SM).  On the
 * H200 at 1M tokens (gpu/NOTES.md) it and the bulk fill with 3 stages
 * (2 CTAs per SM) were the two best, within run-to-run spread of each
 * other: 1022-1023 us vs 1013-1019 us at batch 1, 8006-8054 us vs
 * 7896-8113 us at batch 8; one CTA per SM (4 or 6 stages) was 8-20 %
 * slower.  The bulk fill needs sm_90; cp.async builds for sm_80 too. */
#define DN_ST 2
#define DN_TMA 0

__device__ __forceinline__ uint32_t dn_sw(uint32_t tok)
{
	return ((tok & 1u) << 2) | ((tok >> 1) & 3u);
}

__device__ __forceinline__ void dn_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
				       uint32_t b1)
{
	asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
	    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
	    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
	    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void dn_cp16(uint32_t dst, const void *src, uint32_t bytes)
{
	asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
		     "r"(bytes)
		     : "memory");
}

__device__ __forceinline__ void dn_bulk(uint32_t dst, const void *src, uint32_t bytes,
					uint32_t bar)
{
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
		     "[%0], [%1], %2, [%3];" ::"r"(dst),
		     "l"(src), "r"(bytes), "r"(bar)
		     : "memory");
}

__device__ __forceinline__ void dn_wait(uint32_t bar, uint32_t parity)
{
	asm volatile("{\n\t.reg .pred p;\n"
		     "DN_WAIT:\n\t"
		     "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
		     "@!p bra DN_WAIT;\n}" ::"r"(bar),
		     "r"(parity)
		     : "memory");
}

/* bytes of one K (or V) tile in shared memory */
template <int D, bool TMA>
__host__ __device__ constexpr uint32_t dn_tile_bytes()
{
	return TMA ? 8 * (8 * D * 2 + 16) : DN_T * D * 2;
}

template <int D, bool TMA>
__host__ __device__ constexpr size_t dn_smem_bytes(int st)
{
	return (size_t)st * 2 * dn_tile_bytes<D, TMA>();
}

/* minBlocks keeps the CTAs per SM that the stage count's smem allows */
template <int NQ, int D, int ST, bool TMA>
__global__ void __launch_bounds__(128, ST <= 2 ? 3 : ST == 3 ? 2 : 1)
	k_attn_dense_tc(const struct gpu_dense_head *heads, const float *q, float scale2,
			char *ws, struct ws_layout L, uint32_t nsplit)
{
	pdl_begin();
	extern __shared__ __align__(128) char dsm[];
	__shared__ __align__(8) uint64_t dbar[ST];
	constexpr int CH = D / 8;    /* 16-byte chunks per row */
	constexpr int KS = D / 16;   /* k-steps of S = Q Kᵀ */
	constexpr int RP = 128 / CH; /* rows per cp.async pass */
	constexpr uint32_t RB = D * 2;           /* bytes per row */
	constexpr uint32_t SUB = 8 * RB + 16;    /* bulk: padded 8-token sub-tile */
	constexpr uint32_t TB = dn_tile_bytes<D, TMA>();
	static_assert(NQ <= 8, "rows 8..15 hold the remainders");
	const uint32_t hi = blockIdx.y, x = blockIdx.x;
	const struct gpu_dense_head *H = &heads[hi];
	float *po = WSP(float, L, part_o, ws, hi) + (size_t)x * NQ * D;
	float *pml = WSP(float, L, part_ml, ws, hi) + (size_t)x * NQ * 2;
	const uint64_t n = H->n, N = n + H->win_n;
	const uint64_t cl = ((N + nsplit - 1) / nsplit + DN_T - 1) / DN_T * DN_T;
	const uint64_t t0 = (uint64_t)x * cl, t1 = min(N, t0 + cl);
	if (t0 >= t1) {
		mark_empty(pml, NQ);
		return;
	}
	const uint16_t *kb = H->k, *vb = H->v, *wk = H->win_k, *wv = H->win_v;
	const uint32_t ntile = (uint32_t)((t1 - t0 + DN_T - 1) / DN_T);
	const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
	const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(dsm);

	/* cp.async: copy tile @it of the range into stage it % ST (all threads) */
	auto issue_cp = [&](uint32_t it) {
		const uint64_t ts = t0 + (uint64_t)it * DN_T;
		const uint32_t Ks = sbase + (it % ST) * 2 * TB, Vs = Ks + TB;
		const uint32_t part = threadIdx.x % CH;
		if (ts + DN_T <= n && ts + DN_T <= t1) { /* all history: plain strides */
			const uint32_t tok = threadIdx.x / CH; /* dn_sw(tok + RP j) = dn_sw(tok) */
			const uint32_t off = tok * RB + ((part ^ dn_sw(tok)) * 16);
			const uint16_t *ks = kb + (ts + tok) * D + part * 8;
			const uint16_t *vs = vb + (ts + tok) * D + part * 8;
#pragma unroll
			for (int j = 0; j < DN_T / RP; j++) {
				dn_cp16(Ks + off + j * RP * RB, ks + j * RP * D, 16);
				dn_cp16(Vs + off + j * RP * RB, vs + j * RP * D, 16);
			}
			return;
		}
		/* a valid address for the zero-filling copies (nothing is read) */
		const uint16_t *k0 = t0 < n ? kb + t0 * D : wk + (t0 - n) * D;
#pragma unroll
		for (int j = 0; j < DN_T / RP; j++) {
			const uint32_t tok = threadIdx.x / CH + RP * j;
			const uint64_t u = ts + tok;
			const uint16_t *ks = k0, *vs = k0;
			uint32_t sz = 16;
			if (u < n) {
				ks = kb + u * D + part * 8;
				vs = vb + u * D + part * 8;
			} else if (u < t1) {
				ks = wk + (u - n) * D + part * 8;
				vs = wv + (u - n) * D + part * 8;
			} else {
				sz = 0;
			}
			const uint32_t off = tok * RB + ((part ^ dn_sw(tok)) * 16);
			dn_cp16(Ks + off, ks, sz);
			dn_cp16(Vs + off, vs, sz);
		}
	};
	/* bulk: warp 0 copies tile @it (lanes 0..7 K's sub-tiles, 8..15 V's) */
	auto issue_bulk = [&](uint32_t it) {
		if (w != 0)
			return;
		const uint64_t ts = t0 + (uint64_t)it * DN_T;
		const uint32_t Ks = sbase + (it % ST) * 2 * TB;
		const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&dbar[it % ST]);
		const uint32_t sub = lane & 7, isv = (lane >> 3) & 1;
		const uint64_t u0 = ts + 8 * sub, ue = min(u0 + 8, t1);
		uint32_t bytes = lane < 16 && u0 < ue ? (uint32_t)(ue - u0) * RB : 0u;
		uint32_t tot = bytes;
#pragma unroll
		for (int o = 1; o < 32; o <<= 1)
			tot += __shfl_xor_sync(0xffffffffu, tot, o);
		if (lane == 0)
			asm volatile("{\n\t.reg .b64 st;\n\t"
				     "mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}" ::"r"(bar),
				     "r"(tot)
				     : "memory");
		__syncwarp();
		if (bytes) {
			const uint32_t dst = Ks + isv * TB + sub * SUB;
			const uint16_t *hsrc = isv ? vb : kb, *wsrc = isv ? wv : wk;
			if (u0 < n) {
				const uint64_t e = min(ue, n);
				dn_bulk(dst, hsrc + u0 * D, (uint32_t)(e - u0) * RB, bar);
			}
			if (ue > n) {
				const uint64_t b = max(u0, n);
				dn_bulk(dst + (uint32_t)(b - u0) * RB, wsrc + (b - n) * D,
					(uint32_t)(ue - b) * RB, bar);
			}
		}
	};

	if constexpr (TMA) {
		if (threadIdx.x == 0) {
#pragma unroll
			for (int s = 0; s < ST; s++)
				asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
					(uint32_t)__cvta_generic_to_shared(&dbar[s])));
			asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
		}
		if ((t1 - t0) % DN_T) {
			/* a partial last tile leaves rows unwritten: make them
			 * finite (0 · NaN would poison O) */
			for (uint32_t i = threadIdx.x; i < ST * 2 * TB / 16; i += blockDim.x)
				*(uint4 *)(dsm + 16 * i) = make_uint4(0, 0, 0, 0);
			asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
		}
		__syncthreads();
#pragma unroll
		for (int s = 0; s < ST - 1; s++)
			if ((uint32_t)s < ntile)
				issue_bulk(s);
	} else {
#pragma unroll
		for (int s = 0; s < ST - 1; s++) {
			if ((uint32_t)s < ntile)
				issue_cp(s);
			asm volatile("cp.async.commit_group;");
		}
	}

	/* Q fragments (pre-scaled by scale·log2e): k-step 2jj+h reads channels
	 * 8c+4h .. +3 of row g, c = dn_chunk(jj), as K's fragment does */
	auto dn_chunk = [&](int jj) -> uint32_t {
		return TMA ? 2 * t + (jj & 1) + 8 * (jj >> 1) : 4 * jj + t;
	};
	uint32_t qa[KS][4];
	{
		const float *qh = q + (size_t)hi * NQ * D;
#pragma unroll
		for (int jj = 0; jj < D / 32; jj++)
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const int ch = 8 * dn_chunk(jj) + 4 * h;
				float v[4];
#pragma unroll
				for (int e = 0; e < 4; e++)
					v[e] = g < NQ ? qh[g * D + ch + e] * scale2 : 0.0f;
				dn_split(v[0], v[1], &qa[2 * jj + h][0], &qa[2 * jj + h][1]);
				dn_split(v[2], v[3], &qa[2 * jj + h][2], &qa[2 * jj + h][3]);
			}
	}
	float acc[D / 8][4];
#pragma unroll
	for (int p = 0; p < D / 8; p++)
		acc[p][0] = acc[p][1] = acc[p][2] = acc[p][3] = 0.0f;
	float m = -INFINITY, l = 0.0f;
	/* K row of n-tile nt: byte offset krow + nt * kstep; this lane's
	 * ldmatrix row (matrix lane/8: tokens +0/+8, chunk +0/+1): vrow */
	uint32_t krow, kstep, vrow, vsw;
	if constexpr (TMA) {
		krow = g * SUB + 2 * w * RB;
		kstep = RB;
		vrow = (lane & 7) * SUB + (2 * w + ((lane >> 3) & 1)) * RB;
		vsw = 0;
	} else {
		krow = (w * 16 + g) * RB;
		kstep = 8 * RB;
		vrow = (w * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * RB;
		vsw = dn_sw(lane & 7);
	}
	const uint32_t ksw = TMA ? 0u : dn_sw(g);

	for (uint32_t it = 0; it < ntile; it++) {
		if constexpr (TMA) {
			__syncthreads(); /* tile it-1 is consumed: its stage is free */
			if (it + ST - 1 < ntile)
				issue_bulk(it + ST - 1);
			dn_wait((uint32_t)__cvta_generic_to_shared(&dbar[it % ST]), (it / ST) & 1);
		} else {
			asm volatile("cp.async.wait_group %0;" ::"n"(ST - 2) : "memory");
			__syncthreads();
			if (it + ST - 1 < ntile)
				issue_cp(it + ST - 1);
			asm volatile("cp.async.commit_group;");
		}
		const uint32_t stg = (it % ST) * 2 * TB;
		const char *Kst = dsm + stg;
		const uint64_t ts = t0 + (uint64_t)it * DN_T;

		/* S = Q Kᵀ for the warp's 16 tokens (two n-tiles of 8) */
		float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
		for (int jj = 0; jj < D / 32; jj++) {
			uint4 kv[2];
#pragma unroll
			for (int nt = 0; nt < 2; nt++)
				kv[nt] = *(const uint4 *)(Kst + krow + nt * kstep +
							  ((dn_chunk(jj) ^ ksw) * 16));
#pragma unroll
			for (int nt = 0; nt < 2; nt++) {
				dn_mma(sc[nt], qa[2 * jj], kv[nt].x, kv[nt].y);
				dn_mma(sc[nt], qa[2 * jj + 1], kv[nt].z, kv[nt].w);
			}
		}
		/* this lane: row g, columns 2t + e of n-tiles 0 and 1 */
		float s[2][2];
#pragma unroll
		for (int nt = 0; nt < 2; nt++)
#pragma unroll
			for (int e = 0; e < 2; e++)
				s[nt][e] = sc[nt][e] + sc[nt][2 + e];
		if (ts + DN_T > t1) {
#pragma unroll
			for (int nt = 0; nt < 2; nt++)
#pragma unroll
				for (int e = 0; e < 2; e++) {
					const uint32_t tk = TMA ? 8 * (2 * t + e) + 2 * w + nt
								: w * 16 + nt * 8 + 2 * t + e;
					if (ts + tk >= t1)
						s[nt][e] = -INFINITY;
				}
		}
		float mx = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
		const float mn = fmaxf(m, mx);
		if (__any_sync(0xffffffffu, mn > m)) {
			const float al = mn > m ? exp2f(m - mn) : 1.0f;
			l *= al;
#pragma unroll
			for (int p = 0; p < D / 8; p++)
#pragma unroll
				for (int e = 0; e < 4; e++)
					acc[p][e] *= al;
		}
		m = mn;
		const float ref = m == -INFINITY ? 0.0f : m;
		float pr[2][2];
#pragma unroll
		for (int nt = 0; nt < 2; nt++)
#pragma unroll
			for (int e = 0; e < 2; e++) {
				pr[nt][e] = exp2f(s[nt][e] - ref);
				l += pr[nt][e];
			}
		uint32_t pa[4];
		dn_split(pr[0][0], pr[0][1], &pa[0], &pa[1]);
		dn_split(pr[1][0], pr[1][1], &pa[2], &pa[3]);

		/* O += P V: V fragments by ldmatrix.trans, two n-tiles each */
		const uint32_t vaddr = sbase + stg + TB + vrow;
#pragma unroll
		for (int qq = 0; qq < D / 16; qq++) {
			uint32_t b0, b1, b2, b3;
			const uint32_t addr = vaddr + (((2 * qq + (lane >> 4)) ^ vsw) * 16);
			asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
				     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
				     : "r"(addr)
				     : "memory");
			dn_mma(acc[2 * qq], pa, b0, b1);
			dn_mma(acc[2 * qq + 1], pa, b2, b3);
		}
	}
	if constexpr (!TMA)
		asm volatile("cp.async.wait_group 0;" ::: "memory");
	__syncthreads(); /* the tiles are free: reuse them for the warps' states */

	l += __shfl_xor_sync(0xffffffffu, l, 1);
	l += __shfl_xor_sync(0xffffffffu, l, 2);
	float *so = (float *)dsm, *sml = so + 4 * NQ * D;
	if (g < NQ) {
#pragma unroll
		for (int p = 0; p < D / 8; p++)
			*(float2 *)&so[(w * NQ + g) * D + p * 8 + 2 * t] =
				make_float2(acc[p][0] + acc[p][2], acc[p][1] + acc[p][3]);
		if (t == 0) {
			sml[(w * NQ + g) * 2] = m;
			sml[(w * NQ + g) * 2 + 1] = l;
		}
	}
	__syncthreads();
	for (int i = threadIdx.x; i < NQ * D; i += blockDim.x) {
		const int h = i / D, c = i % D;
		float M = -INFINITY;
#pragma unroll
		for (int ww = 0; ww < 4; ww++)
			M = fmaxf(M, sml[(ww * NQ + h) * 2]);
		float o = 0.0f, ls = 0.0f;
#pragma unroll
		for (int ww = 0; ww < 4; ww++) {
			const float mw = sml[(ww * NQ + h) * 2];
			const float f = mw == -INFINITY ? 0.0f : exp2f(mw - M);
			o += f * so[(ww * NQ + h) * D + c];
			ls += f * sml[(ww * NQ + h) * 2 + 1];
		}
		po[i] = o;
		if (c == 0) {
			pml[2 * h] = M;
			pml[2 * h + 1] = ls;
		}
	}
}

/* Quest bounds: one thread per (block, channel). */
__global__ void k_quest_bounds(const uint16_t *k, uint64_t n, uint32_t d, uint32_t qb,
			       uint16_t *mn, uint16_t *mx)
{
	uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	uint64_t nb = (n + qb - 1) / qb;
	if (i >= nb * d)
		return;
	uint64_t j = i / d, c = i % d;
	uint64_t t1 = min(n, (j + 1) * qb);
	float a = INFINITY, b = -INFINITY;
	for (uint64_t t = j * qb; t < t1; t++) {
		float x = bf1(k[t * d + c]);
		a = fminf(a, x);
		b = fmaxf(b, x);
	}
	mn[i] = f2bf_rn(a); /* exact: a is a bf16 value */
	mx[i] = f2bf_rn(b);
}

/* ------------------------------------------------------------------ */
/* Launchers and entries.                                              */

static int args_ok(const struct gpu_attn_args *a)
{
	if (!a || !a->q || !a->out || !a->ws || a->n_heads == 0 || a->n_heads > 65535)
		return 0;
	if (!(a->nq == 1 || a->nq == 2 || a->nq == 3 || a->nq == 4 || a->nq == 8))
		return 0;
	if (!(a->d == 64 || a->d == 128))
		return 0;
	if (!(a->token_frac > 0.0 && a->token_frac <= 1.0) || !(a->scale >= 0.0f))
		return 0;
	/* chunk keys hold the segment in 24 bits (chunk_key): more segments
	 * would merge two segments' chunks */
	if (a->max_segs >= 1u << 24)
		return 0;
	return a->ws_bytes >= gpu_attn_ws_bytes(a);
}

/* Programmatic dependent launch between a step's kernels (pdl_begin). */
static bool pdl_of(const struct gpu_attn_args *a)
{
	return !(a->flags & GPU_ATTN_NO_PDL);
}

static float scale2_of(const struct gpu_attn_args *a)
{
	float sc = a->scale > 0.0f ? a->scale : 1.0f / sqrtf((float)a->d);
	return sc * LOG2E;
}

/*
 * The many-CTA select's grid: ranges of R blocks (a multiple of 1024, so
 * each of a CTA's 32 warps scans a whole number of 32-block rows), one
 * wave over all contexts (as many CTAs per SM as fit), at most MSEL_MAXC
 * per context.
 */
static int msel_grid(const struct gpu_attn_args *a, uint32_t *R, uint32_t *gx, int *many)
{
	int nsm = 0, rc = sm_count(&nsm);
	if (rc)
		return rc;
	/* H200, bench/attn (os_1cta against os_many, since the grid is one
	 * wave): many CTAs win at 512K and 1M tokens with 8 contexts (-6,
	 * -23 µs) and at 1M with 64 (-12 µs), tie at 512K with 64, lose at
	 * 256K and below (the extra steps of the last CTA; with 64 contexts
	 * one CTA per context already spreads the work). */
	if (a->flags & GPU_ATTN_SELECT_MANY_CTAS)
		*many = 1;
	else if (a->flags & GPU_ATTN_SELECT_ONE_CTA)
		*many = 0;
	else
		*many = a->max_blocks >= 65536 ||
			((uint64_t)a->n_heads * 8 <= (uint64_t)nsm && a->max_blocks >= 32768);
	/* one wave: at 60 registers a thread one 1024-thread CTA fits per SM
	 * (ncu, 1M batch 1: 32 CTAs a context made 256 CTAs, two waves on 132
	 * SMs, and the select cost 36 µs of the step) */
	int occ = 0;
	GPU_CK(cudaFuncSetAttribute(k_msel_count, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    (int)sizeof(struct sel_smem)));
	GPU_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, k_msel_count, SEL_T,
							     sizeof(struct sel_smem)));
	uint64_t nb = a->max_blocks ? a->max_blocks : 1,
		 ctas = (uint64_t)(occ > 0 ? occ : 1) * (uint64_t)(nsm > 0 ? nsm : 1);
	uint64_t per = (nb * a->n_heads + ctas - 1) / ctas;
	uint64_t least = (nb + MSEL_MAXC - 1) / MSEL_MAXC;
	uint64_t r = per > least ? per : least;
	r = (r + 1023) & ~(uint64_t)1023;
	*R = (uint32_t)r;
	*gx = (uint32_t)((nb + r - 1) / r);
	return 0;
}

/* Whether the step's select orders the attention CTAs (lpt_order) where
 * it leaves only the cut, unless GPU_ATTN_SLOT_ORDER: the many-CTA select
 * always; ours by one CTA where the windows are 512 blocks wide
 * (LPT_ONE_CTA_CWL) or GPU_ATTN_SELECT_ORDER forces it.  Why 512: the
 * order's gain is the tail of CTAs of unequal work, and a window's work
 * spreads with its width, while its cost (lpt_order after the one CTA's
 * exact cut, and each attention CTA's load of its entry) does not.
 * Measured (H100, forty-seventh session, bench/attn --pair, B - A in µs
 * with the one-CTA select ordered): windows of 512, batch 8 at 128K
 * -10.1 and batch 4 at 256K -5.6; of 128-256, +1.3 to +7.3 at batch 1,
 * 4 and 8 from 32K to 256K.  For Quest (@quest) only the many-CTA
 * select, with GPU_ATTN_WORK_ORDER (H200, 1M tokens, batch 1, one run:
 * 328.9 µs ordered, 325.6 in slot order; ours 217.1 and 219.5). */
#define LPT_ONE_CTA_CWL 9
static uint32_t lpt_of(const struct gpu_attn_args *a, const struct ws_layout &L, int many,
		       bool quest)
{
	if (!L.cut_only || (a->flags & GPU_ATTN_SLOT_ORDER))
		return 0;
	if (!many && (quest || !((a->flags & GPU_ATTN_SELECT_ORDER) || L.cwl >= LPT_ONE_CTA_CWL)))
		return 0;
	if (quest && !(a->flags & GPU_ATTN_WORK_ORDER))
		return 0;
	/* bit 1: idle marks; bit 2: the count's tail in its serial order */
	return (a->flags & GPU_ATTN_NO_IDLE ? 1u : 3u) |
	       (a->flags & GPU_ATTN_SEL_TAIL_SERIAL ? 4u : 0u);
}

/* The attention kernel's first wave for gpu_wave_rank (L.wc, L.wm) where
 * its CTAs are ordered (L.lpt): @kern's 128-thread CTAs an SM at @smem
 * bytes, and the SMs they fill (fewer where the grid is smaller). */
template <typename K>
static int wave_of(const struct gpu_attn_args *a, struct ws_layout &L, K kern, size_t smem)
{
	L.wc = L.wm = 0;
	if (!L.lpt)
		return 0;
	int nsm = 0, occ = 0, rc = sm_count(&nsm);
	if (rc)
		return rc;
	GPU_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 128, smem));
	const uint64_t n = (uint64_t)L.slots * a->n_heads;
	if (occ < 1 || nsm < 1 || n < (uint64_t)occ)
		return 0;
	L.wc = (uint32_t)occ;
	L.wm = (uint32_t)(n / (uint64_t)occ < (uint64_t)nsm ? n / (uint64_t)occ : (uint64_t)nsm);
	return 0;
}

template <int NQ>
static int launch_score_select(const struct gpu_attn_args *a, const struct gpu_head *heads,
			       struct ws_layout &L, cudaStream_t s, int upto = 3)
{
	char *ws = (char *)a->ws;
	/* the score kernel adds into the histograms: k_qrot clears them (a
	 * memset node before it where the words overflow its count) */
	uint32_t clear_words = (uint32_t)(clear_bytes(a) / 4);
	if (clear_bytes(a) / 4 >= UINT32_MAX / 2) {
		GPU_CK(cudaMemsetAsync(ws, 0, clear_bytes(a), s));
		clear_words = 0;
	}
	auto qrot = L.cut_only ? k_qrot<NQ, true> : k_qrot<NQ, false>;
	qrot<<<dim3(a->max_segs + 1, a->n_heads), 256, 0, s>>>(heads, a->q, a->d, ws, L,
							      clear_words);
	GPU_CKL();
	if (upto < 2)
		return 0;
	if (a->max_blocks) {
		uint32_t K, gx;
		size_t smem;
		auto score = k_score<NQ>;
		const int st3 = score_three_stages(a);
		int rc = 0;
		if (st3 > 0) {
			score = k_score<NQ, 3>;
			rc = score_grid<NQ, 3>(a, score, &K, &gx, &smem);
		} else {
			/* two stages: spread where forced or, undecided, where the
			 * device can give the padding (before sm_90 some cap a
			 * CTA below it) and the spread grid has more CTAs than
			 * SMs; else nothing is left to spread (a CTA there takes
			 * one tile either way, as a rule) */
			const size_t pad = sizeof(struct score_smem<NQP(NQ), 3>);
			const bool forced = (a->flags & GPU_ATTN_SCORE_SPREAD) != 0;
			bool spread = forced;
			int nsm = 0, optin = 0;
			if (st3 < 0 && !forced && !(rc = dev_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin,
								  &optin)))
				spread = pad <= (size_t)optin;
			if (!rc && spread)
				rc = score_grid<NQ>(a, score, &K, &gx, &smem, pad, &nsm);
			if (!rc && spread && !forced && (uint64_t)gx * a->n_heads <= (uint64_t)nsm)
				spread = false;
			if (!rc && !spread)
				rc = score_grid<NQ>(a, score, &K, &gx, &smem);
		}
		if (rc)
			return rc;
		GPU_CK(gpu_launch(pdl_of(a), score, dim3(gx, a->n_heads), SCORE_T, smem, s, heads,
				  ws, L, K));
	}
	if (upto < 3)
		return 0;
	uint32_t R, gx;
	int many, rc = msel_grid(a, &R, &gx, &many);
	if (rc)
		return rc;
	L.lpt = lpt_of(a, L, many, false);
	if (!many) {
		GPU_CK(cudaFuncSetAttribute(k_select, cudaFuncAttributeMaxDynamicSharedMemorySize,
					    (int)sizeof(struct sel_smem)));
		GPU_CK(gpu_launch(pdl_of(a), k_select, dim3(a->n_heads), SEL_T,
				  sizeof(struct sel_smem), s, heads, a->token_frac, ws, L));
		return 0;
	}
	GPU_CK(cudaFuncSetAttribute(k_msel_count, cudaFuncAttributeMaxDynamicSharedMemorySize,
				    (int)sizeof(struct sel_smem)));
	GPU_CK(gpu_launch(pdl_of(a), k_msel_count, dim3(gx, a->n_heads), SEL_T,
			  sizeof(struct sel_smem), s, heads, a->token_frac, ws, L, R));
	if (!L.cut_only)
		GPU_CK(gpu_launch(pdl_of(a), k_msel_write, dim3(gx, a->n_heads), SEL_T, 0, s, heads,
				  ws, L, R));
	return 0;
}

template <int NQ, int D>
static int launch_packed(const struct gpu_attn_args *a, const struct gpu_head *heads,
			 cudaStream_t s)
{
	struct ws_layout L = ws_plan(a, WS_PACKED);
	L.cut_only = cut_only_of(a);
	int rc = launch_score_select<NQ>(a, heads, L, s);
	if (rc)
		return rc;
	if (a->flags & GPU_ATTN_CUDA_CORES) {
		size_t smem = sizeof(pk_smem);
		GPU_CK(cudaFuncSetAttribute(k_attn_packed<NQ, D>,
					    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
		if ((rc = wave_of(a, L, k_attn_packed<NQ, D>, smem)))
			return rc;
		GPU_CK(gpu_launch(pdl_of(a), k_attn_packed<NQ, D>, dim3(L.slots, a->n_heads), 128,
				  smem, s, heads, a->q, scale2_of(a), (char *)a->ws, L));
	} else {
		constexpr int NU = (NQ + 3) / 4;
		/* the window's and the empty CTAs' scratch (tc_smem.red) fits in
		 * the small layout too */
		static_assert(offsetof(tc_smem, red) + sizeof(((tc_smem *)0)->red) <=
				      sizeof(st_smem<NU, 3 * D / 64, ST_SMALL_ROWB>),
			      "small staged layout too small for the window");
		const bool small = a->flags & GPU_ATTN_SMALL_ROWS;
		auto attn = small ? k_attn_packed_tc<NQ, D, true> : k_attn_packed_tc<NQ, D, false>;
		size_t smem = small ? sizeof(st_smem<NU, 3 * D / 64, ST_SMALL_ROWB>)
				    : sizeof(tc_smem) > sizeof(st_smem<NU, D / 16, ST_ROWB>)
					      ? sizeof(tc_smem)
					      : sizeof(st_smem<NU, D / 16, ST_ROWB>);
		GPU_CK(cudaFuncSetAttribute(attn, cudaFuncAttributeMaxDynamicSharedMemorySize,
					    (int)smem));
		if ((rc = wave_of(a, L, attn, smem)))
			return rc;
		GPU_CK(gpu_launch(pdl_of(a), attn, dim3(L.slots, a->n_heads), 128, smem, s, heads,
				  a->q, scale2_of(a), (char *)a->ws, L, a->flags));
		/* every segment in one chunk (seg_whole): nothing left for k_segrot */
		const uint32_t cw = 1u << L.cwl;
		if (!(a->max_seg_blocks && a->max_seg_blocks <= cw && a->max_buf_blocks <= cw))
			GPU_CK(gpu_launch(pdl_of(a), k_segrot<NQ, D>,
					  dim3(a->max_segs + 1, a->n_heads), 128, 0, s, heads,
					  (char *)a->ws, L));
	}
	GPU_CK(gpu_launch(pdl_of(a), k_merge<D>, dim3(a->n_heads, NQ), MERGE_T, 0, s, (uint32_t)NQ,
			  (char *)a->ws, L, a->out, (uint32_t)!!(a->flags & GPU_ATTN_MERGE_ALL)));
	return 0;
}

/* Splits per context for k_attn_dense_tc: n_heads × S a multiple of the
 * CTAs the GPU holds at once (@slots) where one of the first few is, so that
 * equal ranges end together; else about 4 waves.  1 <= S <= cap. */
static uint32_t dn_splits(uint32_t n_heads, uint32_t slots, uint32_t waves, uint32_t cap)
{
	uint64_t S = 0;
	for (uint64_t W = waves; W <= 8u * waves && !S; W += waves)
		if ((uint64_t)slots * W % n_heads == 0)
			S = (uint64_t)slots * W / n_heads;
	if (!S)
		S = ((uint64_t)slots * 4 * waves + n_heads - 1) / n_heads;
	S = S < cap ? S : cap;
	return S ? (uint32_t)S : 1u;
}

/* The dense step on the tensor cores: k_attn_dense_tc then k_merge over
 * its S slots.  @waves: resident-CTA waves to aim for (1 by default). */
template <int NQ, int D, int ST = DN_ST, bool TMA = DN_TMA>
static int launch_dense_tc(const struct gpu_attn_args *a, const struct gpu_dense_head *heads,
			   cudaStream_t s, uint32_t waves = 1)
{
	struct ws_layout L = ws_plan(a, WS_DENSE);
	const size_t smem = dn_smem_bytes<D, TMA>(ST);
	auto kern = k_attn_dense_tc<NQ, D, ST, TMA>;
	GPU_CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	int nsm = 0, occ = 0, rc = sm_count(&nsm);
	if (rc)
		return rc;
	GPU_CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 128, smem));
	if (occ < 1)
		return -EIO;
	uint64_t maxn = (uint64_t)a->max_blocks * a->quest_b + a->max_win;
	uint64_t cap = (maxn + DN_T - 1) / DN_T;
	cap = cap < L.slots ? cap : L.slots; /* the scratch holds L.slots partials */
	uint32_t S = dn_splits(a->n_heads, (uint32_t)(nsm * occ), waves, (uint32_t)cap);
	L.max_chunks = S; /* offsets stay ws_plan's: only the merge's slot count changes */
	L.buf_chunks = 0;
	L.win_tiles = 0;
	L.slots = S;
	kern<<<dim3(S, a->n_heads), 128, smem, s>>>(heads, a->q, scale2_of(a), (char *)a->ws, L, S);
	GPU_CKL();
	GPU_CK(gpu_launch(pdl_of(a), k_merge<D>, dim3(a->n_heads, NQ), MERGE_T, 0, s, (uint32_t)NQ,
			  (char *)a->ws, L, a->out, (uint32_t)!!(a->flags & GPU_ATTN_MERGE_ALL)));
	return 0;
}

template <int NQ, int D>
static int launch_dense(const struct gpu_attn_args *a, const struct gpu_dense_head *heads,
			int quest, int attend, cudaStream_t s)
{
	if (!quest && !(a->flags & GPU_ATTN_CUDA_CORES))
		return launch_dense_tc<NQ, D>(a, heads, s);
	struct ws_layout L = ws_plan(a, quest ? WS_QUEST : WS_DENSE);
	L.cut_only = quest && (attend || (a->flags & GPU_ATTN_STAGE_CUT)) && cut_only_of(a);
	char *ws = (char *)a->ws;
	if (quest) {
		GPU_CK(cudaMemsetAsync(ws, 0, clear_bytes(a), s));
		auto score = k_score_quest<NQ>;
		score<<<dim3((a->max_blocks + 255) / 256, a->n_heads), 256, 0, s>>>(
			heads, a->q, a->d, a->quest_b, ws, L);
		GPU_CKL();
		uint32_t R, gx;
		int many, rc = msel_grid(a, &R, &gx, &many);
		if (rc)
			return rc;
		L.lpt = lpt_of(a, L, many, true);
		if (!many) {
			GPU_CK(cudaFuncSetAttribute(k_select_quest,
						    cudaFuncAttributeMaxDynamicSharedMemorySize,
						    (int)sizeof(struct sel_smem)));
			GPU_CK(gpu_launch(pdl_of(a), k_select_quest, dim3(a->n_heads), SEL_T,
					  sizeof(struct sel_smem), s, heads, a->quest_b,
					  a->token_frac, ws, L));
		} else {
			GPU_CK(cudaFuncSetAttribute(k_msel_count_quest,
						    cudaFuncAttributeMaxDynamicSharedMemorySize,
						    (int)sizeof(struct sel_smem)));
			GPU_CK(gpu_launch(pdl_of(a), k_msel_count_quest, dim3(gx, a->n_heads),
					  SEL_T, sizeof(struct sel_smem), s, heads, a->quest_b,
					  a->token_frac, ws, L, R));
			if (!L.cut_only)
				GPU_CK(gpu_launch(pdl_of(a), k_msel_write_quest,
						  dim3(gx, a->n_heads), SEL_T, 0, s, heads,
						  a->quest_b, ws, L, R));
		}
	}
	if (!attend)
		return 0;
	/* (dense: the step's first kernel, launched plainly) */
	if (int rc = wave_of(a, L, k_attn_dense<NQ, D>, 0))
		return rc;
	GPU_CK(gpu_launch(quest && pdl_of(a), k_attn_dense<NQ, D>, dim3(L.slots, a->n_heads), 128,
			  0, s, heads, a->q, scale2_of(a), ws, L, quest, a->quest_b));
	GPU_CK(gpu_launch(pdl_of(a), k_merge<D>, dim3(a->n_heads, NQ), MERGE_T, 0, s, (uint32_t)NQ,
			  ws, L, a->out, (uint32_t)!!(a->flags & GPU_ATTN_MERGE_ALL)));
	return 0;
}

#define DISPATCH_NQ_D(F, ...)                                        \
	switch (a->nq * 1000 + a->d) {                               \
	case 1064: return F<1, 64>(__VA_ARGS__);                     \
	case 1128: return F<1, 128>(__VA_ARGS__);                    \
	case 2064: return F<2, 64>(__VA_ARGS__);                     \
	case 2128: return F<2, 128>(__VA_ARGS__);                    \
	case 3064: return F<3, 64>(__VA_ARGS__);                     \
	case 3128: return F<3, 128>(__VA_ARGS__);                    \
	case 4064: return F<4, 64>(__VA_ARGS__);                     \
	case 4128: return F<4, 128>(__VA_ARGS__);                    \
	case 8064: return F<8, 64>(__VA_ARGS__);                     \
	case 8128: return F<8, 128>(__VA_ARGS__);                    \
	default: return -EINVAL;                                     \
	}

int gpu_attend_packed(const struct gpu_attn_args *a, const struct gpu_head *heads,
		      cudaStream_t s)
{
	if (!args_ok(a) || !heads)
		return -EINVAL;
	DISPATCH_NQ_D(launch_packed, a, heads, s);
}

template <int NQ, int D>
static int launch_ss(const struct gpu_attn_args *a, const struct gpu_head *heads, cudaStream_t s,
		     int upto)
{
	struct ws_layout L = ws_plan(a, WS_PACKED);
	if (a->flags & GPU_ATTN_STAGE_CUT)
		L.cut_only = cut_only_of(a);
	return launch_score_select<NQ>(a, heads, L, s, upto);
}

int gpu_score_select(const struct gpu_attn_args *a, const struct gpu_head *heads,
		     cudaStream_t s)
{
	if (!args_ok(a) || !heads)
		return -EINVAL;
	DISPATCH_NQ_D(launch_ss, a, heads, s, 3);
}

int gpu_score_select_upto(const struct gpu_attn_args *a, const struct gpu_head *heads,
			  int stage, cudaStream_t s)
{
	if (!args_ok(a) || !heads || stage < 1 || stage > 3)
		return -EINVAL;
	DISPATCH_NQ_D(launch_ss, a, heads, s, stage);
}

static int quest_b_ok(uint32_t b)
{
	return b == 8 || b == 16 || b == 32 || b == 64;
}

int gpu_attend_dense(const struct gpu_attn_args *a, const struct gpu_dense_head *heads,
		     cudaStream_t s)
{
	if (!args_ok(a) || !heads || !quest_b_ok(a->quest_b))
		return -EINVAL;
	DISPATCH_NQ_D(launch_dense, a, heads, 0, 1, s);
}

int gpu_attend_quest(const struct gpu_attn_args *a, const struct gpu_dense_head *heads,
		     cudaStream_t s)
{
	if (!args_ok(a) || !heads || !quest_b_ok(a->quest_b))
		return -EINVAL;
	DISPATCH_NQ_D(launch_dense, a, heads, 1, 1, s);
}

int gpu_quest_score_select(const struct gpu_attn_args *a, const struct gpu_dense_head *heads,
			   cudaStream_t s)
{
	if (!args_ok(a) || !heads || !quest_b_ok(a->quest_b))
		return -EINVAL;
	DISPATCH_NQ_D(launch_dense, a, heads, 1, 0, s);
}

int gpu_quest_bounds(const uint16_t *k, uint64_t n, uint32_t d, uint32_t qb, uint16_t *mn,
		     uint16_t *mx, cudaStream_t s)
{
	if (!k || !mn || !mx || n == 0 || !quest_b_ok(qb) || d == 0 || d > GPU_MAX_D)
		return -EINVAL;
	uint64_t tot = (n + qb - 1) / qb * d;
	k_quest_bounds<<<(unsigned)((tot + 255) / 256), 256, 0, s>>>(k, n, d, qb, mn, mx);
	GPU_CKL();
	return 0;
}

uint32_t *gpu_ws_hist(const struct gpu_attn_args *a, uint32_t head)
{
	static_assert(HIST_HI == GPU_HIST_COARSE && HIST_LO == GPU_HIST_FINE, "gpu.cuh's sizes");
	return HIST(a->ws, head);
}

float *gpu_ws_scores(const struct gpu_attn_args *a, uint32_t head)
{
	struct ws_layout L = ws_plan(a, WS_PACKED);
	return WSP(float, L, scores, a->ws, head);
}

uint32_t *gpu_ws_selected(const struct gpu_attn_args *a, uint32_t head)
{
	struct ws_layout L = ws_plan(a, WS_PACKED);
	return WSP(uint32_t, L, sel, a->ws, head);
}

uint32_t *gpu_ws_counts(const struct gpu_attn_args *a, uint32_t head)
{
	struct ws_layout L = ws_plan(a, WS_PACKED);
	return WSP(uint32_t, L, counts, a->ws, head);
}

uint32_t *gpu_ws_chunks(const struct gpu_attn_args *a, uint32_t head)
{
	struct ws_layout L = ws_plan(a, WS_PACKED);
	return WSP(uint32_t, L, chunk, a->ws, head);
}

void gpu_ws_qrot(const struct gpu_attn_args *a, uint32_t head, uint32_t si, const float **qr,
		 const float **qperp, const uint32_t **q8, uint32_t *ldq)
{
	struct ws_layout L = ws_plan(a, WS_PACKED);
	uint32_t P = NQP(a->nq);
	const float *r = WSP(const float, L, qr, a->ws, head) + (size_t)si * QR_ROWS * P;
	*qr = r;
	*qperp = r + (size_t)GPU_MAX_D * P;
	*q8 = (const uint32_t *)(WSP(const float, L, qpm, a->ws, head) +
				 (size_t)si * QPM_FLOATS(P));
	*ldq = P;
}

uint32_t *gpu_ws_cut(const struct gpu_attn_args *a, uint32_t head)
{
	return SELX((char *)a->ws, head) + SX_KSTAR;
}

uint32_t *gpu_ws_order(const struct gpu_attn_args *a, uint32_t head, int quest, uint32_t *slots)
{
	struct ws_layout L = ws_plan(a, quest ? WS_QUEST : WS_PACKED);
	*slots = L.slots;
	return WSP(uint32_t, L, order, a->ws, head);
}
