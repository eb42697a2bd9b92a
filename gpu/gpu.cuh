/* SPDX-License-Identifier: MIT */
/*
 * gpu/ — CUDA kernels of mosaickv: block scoring and selection,
 * PackedAttention, the dense flash-decoding and Quest baselines, the update
 * buffer append and prefill encoding.
 *
 * This header is plain C (it is included by C callers, tests and benchmarks
 * as well as by the .cu files) and internal: entry names start with gpu_,
 * are hidden, and never leave libmosaickv.so.  Every entry returns 0 or a
 * negative errno (-EINVAL bad arguments, -ENOMEM device allocation,
 * -MKV_ENODEV no usable device, -EIO any other CUDA error) and never aborts.
 *
 * Device layout (struct gpu_seg).  A KV head's history is an array of
 * segments, each a K half and a V half of the same n tokens, uploaded from
 * two mkv_packed_view (gpu_seg_upload) or built on the device.  Differences
 * from the host's packed view, all to keep every load 16 bytes wide and
 * aligned:
 *   - values: vector i's row at val + i * rs (rs in 16-bit units, a
 *     multiple of 8: every row starts 16-byte aligned); block j's rows
 *     are contiguous.  A row holds what the host row holds, zero padded:
 *       vb == 0: r bf16 values, rs = r rounded up to 8;
 *       vb == w (4..8): the host's quantized row byte for byte (bf16
 *       scale, then r fields of w bits LSB-first from bit 16), rs =
 *       row_bytes rounded up to 16 bytes (r = 40, w = 6: 32 bytes a row,
 *       against 80 in bf16).  The kernels decode fields in registers;
 *       rows stay quantized in HBM.  The values array is followed by at
 *       least 16 bytes of slack (a field group's 32-bit loads may reach
 *       past the last row);
 *   - bitmaps: vector i at bm + i * bw 32-bit little-endian words,
 *     bw = ceil(bitmap_bytes / 4) (bit j of the host's byte stream is bit
 *     j % 32 of word j / 32; padding bits zero);
 *   - rotation (dk × d), summaries (n_blocks × S) and remainder bounds
 *     (s_rest, n_blocks) exactly as on the host (s_rest zero, or NULL in
 *     a hand-built segment, where the host view has none);
 *   - storage is bf16 only (uint16_t here).
 * A block's score is Σ_{c<S} max(q'_c min_c, q'_c max_c) + qperp · rest,
 * qperp = sqrt(max(0, |q|² − |q'_{0..S-1}|²)) per query head, max over the
 * group's heads (mkv_score_blocks).
 * Queries, outputs and scores are fp32.  Scores and softmax states use the
 * CPU reference's arithmetic order where it is cheap (block scores are
 * bitwise equal given equal rotated queries).
 */
#ifndef MKV_GPU_CUH
#define MKV_GPU_CUH

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include <mosaickv/compress.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GPU_HIDDEN __attribute__((visibility("hidden")))
#else
#define GPU_HIDDEN
#endif

#ifdef __CUDACC__
#define GPU_HD __host__ __device__
#else
#define GPU_HD
#endif

#define GPU_MAX_D 128   /* head dims 64 and 128 */
#define GPU_MAX_NQ 8    /* query heads per KV head: 1, 2, 3, 4 or 8 */

/* One segment on the device (K and V of the same tokens). */
struct gpu_seg {
	const uint16_t *k_val, *v_val;  /* rows of rs 16-bit units, n rows */
	const uint32_t *k_bm, *v_bm;    /* n × bw words */
	const uint16_t *k_rot, *v_rot;  /* bf16, dk × d */
	const uint16_t *s_min, *s_max;  /* bf16, n_blocks × S (keys) */
	const uint16_t *s_rest;         /* bf16, n_blocks (keys); may be NULL */
	uint32_t n, b, n_blocks, S;
	uint32_t k_dk, k_r, k_g, k_rs, k_bw;
	uint32_t v_dk, v_r, v_g, v_rs, v_bw;
	uint32_t block0; /* its first block's index among the head's blocks */
	uint32_t k_vb, v_vb; /* value bits of each half: 0 (bf16) or 4..8 */
	/* Update buffers: the correction C = P − R of each half (fp32, dk ×
	 * d) lies rot_dl 16-bit units past its rotation, P = (R Rᵀ)⁻¹ R the
	 * encoder's projection (mosaickv/linalg.c), and appends rotate by
	 * R + C.  0: none (closed segments, which are never appended to). */
	uint32_t rot_dl;
	/* Optional, NULL where absent: each vector's value positions, r
	 * bytes (the channels of its bitmap's set bits, increasing; past its
	 * set bits and up to the stride: d_keep), vector i's at pos + i *
	 * GPU_POS_STRIDE(r) (16-byte aligned); gpu_seg_positions fills them
	 * from the bitmaps, which stay valid and are still read by every
	 * other path, and gpu_append writes them for the rows it appends to
	 * a buffer that has them (g == 1).  Where both halves have them, are bf16 (vb 0) and the
	 * step runs GPU_ATTN_SMALL_ROWS, PackedAttention scatters each value
	 * to its channel instead of ranking every channel of the bitmap
	 * (gpu/NOTES.md, "Value positions").  The caller owns them, as the
	 * other arrays. */
	const uint8_t *k_pos, *v_pos;
	/* Optional, NULL where absent (history segments only; S a multiple
	 * of 8 up to 32 and at most k_dk, else ignored): 8-bit summaries,
	 * n_blocks rows of 2S bytes (16-byte aligned) and n_blocks float
	 * scales, mkv_summary8's values from s_min / s_max with each row's
	 * words interleaved: word 2u holds minima 4u .. 4u + 3, word 2u + 1
	 * maxima 4u .. 4u + 3, the lowest channel in the low byte (the
	 * integer sums then index their words by constants; gpu_seg_sum8
	 * fills them on the device).  Where a segment has
	 * them, the step scores its blocks in integers against an 8-bit
	 * rotated query (mkv_score8's arithmetic, mkv_attn_opts.summary_bits
	 * = 8); other segments keep the bf16 bound.  The caller owns them. */
	const int8_t *s8;
	const float *s8_scale;
	/* 0, or the tile row (halves) each 16-token block's (value, position)
	 * pairs were put in store order for (gpu_seg_schedule): each row is
	 * a permutation of its pairs, so its values are no longer in their
	 * bitmap's order and only the positions' path reads them.  A kernel
	 * that would read such a segment any other way (no
	 * GPU_ATTN_SMALL_ROWS, the CUDA-core path) gives it a NaN partial,
	 * as a segment that breaks GPU_ATTN_SMALL_ROWS' promise. */
	uint32_t sched;
};

/* Bytes of one vector's positions in a gpu_seg's k_pos / v_pos. */
#define GPU_POS_STRIDE(r) (((uint32_t)(r) + 15u) & ~15u)

/*
 * The store schedule of one block (gpu_seg_schedule runs this function a
 * thread a block; gpu_seg_schedule_warp computes the same rule a warp a
 * block, and the test seg_schedule_matches_host holds both to this
 * function's bytes; tests check this function against its own
 * properties, not against itself).  The positions' path stores a
 * sub-block's values with lane t < 16 on K row t and lane 16 + t on V row
 * t, one value a lane a store instruction, into tiles of rows of @ld
 * halves (the V tile 16 rows after the K tile's start); value j of a row
 * goes to channel pos[j], the 32-bit word row * ld / 2 + pos[j] / 2, and a
 * store takes as many shared-memory wavefronts as the most words one of
 * the 32 banks receives.  In ascending channel order that is ~3.4 a store
 * on top-r rows (bench/scatter_model.py).  Here each store step gets a
 * maximum matching of the lanes that still have values to the banks of
 * those values (Kuhn's augmenting paths: lanes in increasing order; at
 * each lane its lowest free bank if it has one, else its banks in
 * increasing order; a bank's lowest slot); a lane left
 * out stores the value whose bank is least loaded so far (the lowest
 * slot among equals).  The same rule as scatter_model.py's schedule(),
 * so its counts are this code's (checked on one set of rows: 47.5 a
 * block both).
 *
 * @kp, @vp: the block's K and V positions, row t at kp + t * @kps (vp + t *
 * @vps); @nt rows (1..16); @sk, @sv: the slots a K and a V row stores (r
 * rounded up to 8, at most GPU_SCHED_SLOTS).  Out: @ord[lane *
 * GPU_SCHED_SLOTS + step] is the slot (index into the row's pairs) that
 * lane stores at that step.  Returns the wavefronts of the scheduled
 * stores.
 */
/* 32: the small layout's rows (r <= 32) are the only ones scheduled, and
 * the thread-a-block kernel's arrays scale with it (7.8 KB a thread at
 * 96; at 32 a block still takes ~2 ms: the serial rule, not its arrays'
 * place, is the cost) */
#define GPU_SCHED_SLOTS 32
static inline GPU_HD uint32_t gpu_sched_bank(const uint8_t *kp, uint32_t kps, const uint8_t *vp,
					     uint32_t vps, uint32_t ld, uint32_t lane, uint32_t i)
{
	uint32_t t = lane & 15u, kv = lane >> 4;
	uint32_t c = kv ? vp[t * vps + i] : kp[t * kps + i];
	return (kv * 8u * ld + t * (ld / 2u) + c / 2u) & 31u;
}

static inline GPU_HD uint32_t gpu_sched_ffs(uint32_t x)
{
#ifdef __CUDA_ARCH__
	return (uint32_t)__ffs((int)x);
#else
	return (uint32_t)__builtin_ffs((int)x);
#endif
}

static inline GPU_HD uint32_t gpu_sched_block(const uint8_t *kp, uint32_t kps, const uint8_t *vp,
					      uint32_t vps, uint32_t nt, uint32_t sk, uint32_t sv,
					      uint32_t ld, uint8_t *ord)
{
	/* each lane's banks with a value left (lm), the lowest such slot of
	 * each bank (first) and, a slot's successor in its bank (nxt): a
	 * bank's slots go in increasing order, so taking first[b] moves it
	 * to nxt[first[b]] and nothing is searched again */
	uint32_t lm[32];
	uint8_t first[32][32], nxt[32][GPU_SCHED_SLOTS];
	uint32_t total = 0, steps = sk > sv ? sk : sv;
	for (uint32_t l = 0; l < 32; l++) {
		uint32_t ns = (l & 15u) < nt ? (l < 16 ? sk : sv) : 0u;
		lm[l] = 0u;
		for (uint32_t i = ns; i-- > 0;) {
			uint32_t b = gpu_sched_bank(kp, kps, vp, vps, ld, l, i);
			nxt[l][i] = lm[l] >> b & 1u ? first[l][b] : 0xffu;
			first[l][b] = (uint8_t)i;
			lm[l] |= 1u << b;
		}
	}
	for (uint32_t step = 0; step < steps; step++) {
		int8_t own_l[32];
		uint8_t load[32], pb[32];
		int16_t pick[32];
		for (uint32_t l = 0; l < 32; l++) {
			own_l[l] = -1;
			load[l] = 0;
			pick[l] = -1;
		}
		/* one augmenting path from each lane with values left: a
		 * depth-first search over banks in increasing order, kept on an
		 * explicit stack (each level claims a new bank: at most 33).
		 * The banks a failed search saw lead to no free bank until a
		 * path is found, so later searches skip them (the same
		 * matching, without searching them again) */
		uint32_t dead = 0u, owned = 0u;
		for (uint32_t root = 0; root < 32; root++) {
			if (!lm[root])
				continue;
			uint32_t seen = dead;
			uint8_t st_l[33], st_b[33];
			int dep = 0;
			st_l[0] = (uint8_t)root;
			dead = 0u; /* unless the search fails, below */
			while (dep >= 0) {
				uint32_t l = st_l[dep], cand = lm[l] & ~seen;
				if (!cand) {
					dep--;
					continue;
				}
				/* a free bank first: the path ends here */
				uint32_t fr = cand & ~owned;
				uint32_t b = gpu_sched_ffs(fr ? fr : cand) - 1u;
				seen |= 1u << b;
				if (own_l[b] < 0) {
					own_l[b] = (int8_t)l;
					owned |= 1u << b;
					for (int e = dep - 1; e >= 0; e--)
						own_l[st_b[e]] = (int8_t)st_l[e];
					break;
				}
				st_b[dep] = (uint8_t)b;
				st_l[dep + 1] = (uint8_t)own_l[b];
				dep++;
			}
			if (dep < 0)
				dead = seen;
		}
		for (uint32_t b = 0; b < 32; b++)
			if (own_l[b] >= 0) {
				pick[own_l[b]] = first[own_l[b]][b];
				pb[own_l[b]] = (uint8_t)b;
				load[b] = 1;
			}
		/* lanes the matching left out: the least loaded bank, the lowest
		 * slot among equals */
		for (uint32_t l = 0; l < 32; l++) {
			if (!lm[l] || pick[l] >= 0)
				continue;
			uint32_t best = 0, bl = 256, bb = 0;
			for (uint32_t m = lm[l]; m; m &= m - 1u) {
				uint32_t b = gpu_sched_ffs(m) - 1u;
				if (load[b] < bl || (load[b] == bl && first[l][b] < best)) {
					bl = load[b];
					best = first[l][b];
					bb = b;
				}
			}
			pick[l] = (int16_t)best;
			pb[l] = (uint8_t)bb;
			load[bb]++;
		}
		uint32_t wf = 0;
		for (uint32_t b = 0; b < 32; b++)
			wf = load[b] > wf ? load[b] : wf;
		total += wf;
		for (uint32_t l = 0; l < 32; l++)
			if (pick[l] >= 0) {
				uint32_t i = (uint32_t)pick[l], b = pb[l];
				ord[l * GPU_SCHED_SLOTS + step] = (uint8_t)i;
				if (nxt[l][i] == 0xffu)
					lm[l] &= ~(1u << b);
				else
					first[l][b] = nxt[l][i];
			}
	}
	return total;
}

/* One (sequence, KV head) context: history segments, an optional update
 * buffer (a packed segment attended in full, not scored; its n lives on
 * the device and grows by gpu_append) and an optional dense window. */
struct gpu_head {
	const struct gpu_seg *segs; /* device array [nseg] */
	const struct gpu_seg *buf;  /* device pointer or NULL */
	const uint16_t *win_k, *win_v; /* bf16, win_n × d, or NULL */
	uint64_t n_hist;   /* history tokens */
	uint32_t nseg, n_blocks; /* history segments and blocks */
	uint32_t win_n;
	uint32_t buf_cap_blocks; /* capacity of buf in blocks (0: no buffer) */
};

/* Dense context for the baselines: K and V (bf16, n × d) plus the Quest
 * block bounds (bf16, ceil(n / qb) × d, exact: bf16 inputs) and a window. */
struct gpu_dense_head {
	const uint16_t *k, *v;
	const uint16_t *q_min, *q_max;
	const uint16_t *win_k, *win_v;
	uint64_t n;
	uint32_t win_n, pad_;
};

/*
 * Arguments of one decode-attention step over @n_heads contexts (batch ×
 * KV heads).  All pointers are device pointers.  Scratch (ws) is sized by
 * gpu_attn_ws_bytes() for the maxima given here and is reused across calls
 * (not concurrently).
 */
struct gpu_attn_args {
	uint32_t n_heads, nq, d;
	float scale;        /* 0: 1/sqrt(d) */
	double token_frac;  /* (0, 1] */
	uint32_t max_segs;  /* >= every head's nseg; below 2^24 (-EINVAL) */
	uint32_t max_blocks;/* >= every head's n_blocks (history) */
	uint32_t max_buf_blocks; /* >= every head's buf_cap_blocks */
	uint32_t max_win;   /* >= every head's win_n */
	uint32_t quest_b;   /* dense/quest: block size of the bounds (8..64) */
	const float *q;     /* n_heads × nq × d */
	float *out;         /* n_heads × nq × d */
	void *ws;           /* scratch */
	size_t ws_bytes;
	uint32_t flags;     /* GPU_ATTN_* */
	/* >= every head's segments' n_blocks, or 0 (not known).  Where it
	 * and max_buf_blocks fit one work chunk, PackedAttention's CTAs rotate
	 * their segments back themselves and k_segrot is not launched; a
	 * segment larger than promised then stays rotated (a wrong output, no
	 * bad access). */
	uint32_t max_seg_blocks;
};

/* PackedAttention on CUDA cores only (the first version; kept to compare):
 * by default the products run on the tensor cores. */
#define GPU_ATTN_CUDA_CORES 1u
/* Tensor-core PackedAttention with the per-value set-bit scatter (the
 * version before the channel-major walk; kept to compare) also where both
 * halves have g == 1. */
#define GPU_ATTN_SCATTER 2u
/* Tensor-core PackedAttention without the staged path (g == 1 rows by the
 * channel-major walk from global memory where r >= d_keep / 2, else the
 * scatter: the version before staging; kept to compare). */
#define GPU_ATTN_WALK 16u
/* A promise by the caller: every segment and update buffer of every head
 * has g == 1 on both halves (or g == 2 on both halves of bf16 rows with an
 * even d_keep), device rows of at most 64 bytes and d_keep
 * <= 3d/4 (the bench's bf16 r = 32 of 96, 6-bit rows of r <= 80 of 96).
 * PackedAttention then runs the staged path in its 48 KB layout, four CTAs
 * per SM.  A segment that breaks it makes the output NaN (nothing else is
 * read or written).  GPU_ATTN_SCATTER / GPU_ATTN_WALK are ignored with it. */
#define GPU_ATTN_SMALL_ROWS 32u
/* Launch a step's kernels one after another as <<<>>> does, without
 * programmatic dependent launch (kept to compare; see pdl_begin). */
#define GPU_ATTN_NO_PDL 64u
/* Work chunks (a CTA's share: the selected blocks of one segment inside
 * one aligned window) of 64, 128, 256 or 512 blocks.  No flag: chosen by
 * shape and the GPU's SM count (chunk_lg in attn.cu: wide where the step
 * has blocks enough to fill the GPU many times over, narrow where it has
 * few; gpu/NOTES.md).
 * The scratch size does not depend on them.  Narrow chunks assume what
 * the library's segments keep: at most 8,192 blocks a segment (65,536
 * tokens of b >= 8), so at most 128 windows of 64. */
#define GPU_ATTN_CHUNK_256 128u
#define GPU_ATTN_CHUNK_512 256u
#define GPU_ATTN_CHUNK_64 1024u
#define GPU_ATTN_CHUNK_128 2048u
/* The step's select writes the selected blocks' list and the chunk list
 * (as gpu_score_select does), one more launch or pass, and the attention
 * kernel reads them.  By default that holds where all contexts together
 * hold 2^20 blocks or more; below, the select leaves only the cut (the
 * key and the last tie taken) and each attention CTA takes the blocks of
 * its window from the scores itself (faster on the H200 at batch 1;
 * gpu/NOTES.md). */
#define GPU_ATTN_SELECT_LIST 512u
/* The merge folds every slot online (the version before it compacted the
 * live slots first; kept to compare, and the path of steps with more than
 * 4,096 slots or 1,024 live ones). */
#define GPU_ATTN_MERGE_ALL 4096u
/* gpu_score_select / gpu_quest_score_select run the stage as a step of
 * this shape runs it: where the step leaves only the cut (see
 * GPU_ATTN_SELECT_LIST), so does the stage, and no list is written
 * (gpu_ws_selected, gpu_ws_counts and gpu_ws_chunks are then stale; the
 * cut, gpu_ws_cut, is the same).  Without it the stage always writes the
 * lists.  To time the stage that a step contains (bench/attn). */
#define GPU_ATTN_STAGE_CUT 8192u
/* Where the select leaves only the cut, each window of selected blocks
 * has 1, 2 or 4 slots (CTAs), in PackedAttention and in Quest: a window
 * holding more than PART_BLOCKS (attn.cu) of them is split in equal
 * parts over its slots, so that a window where the selection clusters is
 * not the step's last CTA.  No flag: chosen by shape for PackedAttention,
 * one slot for Quest (attn.cu parts_lg; gpu/NOTES.md, thirtieth
 * session).  The scratch size does not depend on them. */
#define GPU_ATTN_PARTS_1 16384u
#define GPU_ATTN_PARTS_2 32768u
#define GPU_ATTN_PARTS_4 65536u
/* A window is split over its slots only past 64 selected blocks a part,
 * not PART_BLOCKS (32): with the CTAs ordered by work (GPU_ATTN_SLOT_ORDER
 * unset) the heaviest windows no longer come last, and fewer parts carry
 * fewer fixed costs (a model of the H200's 1M-token windows: 5 % off the
 * attention kernel; gpu/NOTES.md, thirty-second session; to measure). */
#define GPU_ATTN_PART_64 524288u
/* The select writes no idle marks (GPU_ORDER_IDLE) into the order: every
 * attention CTA finds its own work, as before the marks (to measure them). */
#define GPU_ATTN_NO_IDLE 1048576u
/* Where the score kernel runs two stages of tiles, it asks for the
 * three-stage kernel's shared memory (unused past its own), so that an
 * SM holds two of its CTAs, not three, and its grid is sized for that
 * (more tiles a CTA where the contexts are long), forced.  By default
 * wherever that grid has more CTAs than SMs (attn.cu score_three_stages:
 * at the bench's shape all but batch 1 at 32K tokens).  Paired on an
 * H100 (forty-sixth session) it beat three stages by 1.2-6.7 µs over
 * batch 1-8 and 32K-1M where they were the default, and two unspread by
 * 3.3-7.1 µs at 128K-256K batch 1. */
#define GPU_ATTN_SCORE_SPREAD 1073741824u
/* The many-CTA select's last CTA loads the order's windows after its
 * exact cut (lpt_order), as where a context's windows outnumber its
 * threads; by default it loads them beside the candidates, before the
 * cut.  Kept for the tests, which reach that path with no 1M-token
 * context; its speed was settled (within noise, paired: forty-fifth
 * session). */
#define GPU_ATTN_SEL_TAIL_SERIAL 16777216u
/* 1 if @sg (a host copy) keeps GPU_ATTN_SMALL_ROWS' promise at head
 * dimension @d, else 0 (also for NULL). */
GPU_HIDDEN int gpu_seg_small_rows(const struct gpu_seg *sg, uint32_t d);
/* Block selection by one CTA per context, or by many CTAs per context:
 * the same selection either way.  Neither flag: chosen by shape (many
 * CTAs for histories of 65,536 blocks and more, and from 32,768 blocks
 * when the contexts are few: where they measured faster on the H200;
 * gpu/NOTES.md). */
#define GPU_ATTN_SELECT_ONE_CTA 4u
#define GPU_ATTN_SELECT_MANY_CTAS 8u
/* Where the many-CTA select leaves only the cut, PackedAttention's select
 * also orders the attention kernel's CTAs by their work, the heaviest
 * first and the contexts interleaved (attn.cu lpt_order: the step's last
 * CTAs are then its lightest).  GPU_ATTN_SLOT_ORDER keeps them in slot
 * order (the version before; kept to compare).  Quest keeps slot order,
 * where it measured 1 % faster (gpu/NOTES.md, thirty-second session: the
 * baseline runs as it runs fastest), unless GPU_ATTN_WORK_ORDER.  The
 * output is the same bits either way. */
#define GPU_ATTN_SLOT_ORDER 131072u
#define GPU_ATTN_WORK_ORDER 262144u
/* PackedAttention's one-CTA select (GPU_ATTN_SELECT_ONE_CTA, or chosen by
 * shape) orders the attention CTAs too, where it leaves only the cut: the
 * many-CTA select's order (lpt_order) without its launches.  By default
 * it does so only where the windows are 512 blocks wide (the contexts
 * together hold 2^19 blocks or more: 128K tokens at batch 8, 256K at
 * batch 4), where it measured 5.6-10.1 µs faster on the H100; below, it
 * measured 1.3-7.3 µs slower (forty-seventh session).  This flag forces
 * it at every width (GPU_ATTN_SLOT_ORDER turns every order off).  The
 * output is the same bits either way. */
#define GPU_ATTN_SELECT_ORDER 8388608u
/* The score kernel with two stages of tiles (one in flight a CTA while
 * one is scored), three CTAs an SM unless GPU_ATTN_SCORE_SPREAD: the
 * version before the spread became the default; kept to compare. */
#define GPU_ATTN_SCORE_2STAGE 67108864u
/* The score kernel with three stages of tiles (two in flight a CTA while
 * one is scored; two CTAs an SM by shared memory) instead of two, forced;
 * three stages take no early loads
 * (the two-stage kernel issues its first two tiles' summaries before it
 * waits for k_qrot).  The default from the thirty-ninth to the
 * forty-fifth session where the two-stage grid gave each CTA eight tiles
 * or more (and at 128K-256K batch 1 from `66d1424`); two stages spread
 * (GPU_ATTN_SCORE_SPREAD) replaced it.  Kept to compare. */
#define GPU_ATTN_SCORE_3STAGE 134217728u
/* Free bits: 1 << 21, 1 << 22, 1 << 25, 1 << 28, 1 << 29 and 1 << 31.
 * The forty-seventh session retired three flags whose pairs had settled them,
 * each the version before a change kept since: GPU_ATTN_CLEAR_MEMSET (the
 * step's clear as a memset node, before k_qrot cleared it), _SCORE_LATE
 * (no early loads in the score kernel) and _ORDER_FLAT (the first wave in
 * rank order, before gpu_wave_rank spread it); the forty-eighth retired
 * _FINE_GLOBAL (the score kernel's fine bins added to global memory by
 * every warp, before each CTA summed them in its table, hist_add_ht);
 * the forty-ninth _SCORE_FMA (the block scores as two sums of fused
 * products: within noise once the score CTAs were spread, and not the
 * CPU's bits) and _SLOT_SPREAD (the slot order's first wave spread over
 * the SMs: within noise at 64K-256K batch 1).  gpu/NOTES.md and
 * docs/PERF.md keep their figures. */

/*
 * The rank (in the order's sequence: rank r of context h at r · n_heads
 * + h) that the attention CTA at dispatch position @b takes.  Why: the
 * hardware fills an SM's slots from a few consecutive positions of the
 * first wave (bench/cta_probe.py, H100, 1M tokens: each of 4 SMs took 5 of
 * 20 consecutive positions), so in rank order the heaviest CTAs shared
 * the first SMs and those SMs ran longest (at 256K tokens the work is one
 * wave: busy span max/avg 1.48 ordered, 1.26 in slot order).  The first
 * @wc · @wm positions (@wc: CTAs an SM, @wm: SMs) are read as @wm columns
 * of @wc rows: position b, row b % wc, column b / wc, takes rank
 * row · wm + column, odd rows reversed, so that a run of consecutive
 * positions holds ranks from every row, heavy beside light; the positions
 * after keep their rank and the longest-first order.  A bijection of
 * [0, n) for every n >= wc · wm (wc = 0: the identity).
 */
static inline GPU_HD uint32_t gpu_wave_rank(uint32_t b, uint32_t wc, uint32_t wm)
{
	if (b >= wc * wm)
		return b;
	const uint32_t row = b % wc, col = b / wc;
	return row * wm + (row & 1u ? wm - 1u - col : col);
}

/* Bytes of scratch a call with these maxima needs (packed, quest or dense;
 * for dense, max_blocks counts tokens / quest_b). */
GPU_HIDDEN size_t gpu_attn_ws_bytes(const struct gpu_attn_args *a);
/* Zero the score histograms of fresh scratch.  Optional: every call clears
 * them itself (PackedAttention's first kernel, k_qrot, a slice a CTA, or a
 * memset node where they pass 2^33 bytes; Quest's step by a memset node). */
GPU_HIDDEN int gpu_attn_ws_init(const struct gpu_attn_args *a, cudaStream_t s);

/* 1 if a CUDA device is usable, 0 if none, negative errno on error.  Touches
 * CUDA: call it from a test body, never from a constructor. */
GPU_HIDDEN int gpu_device_ok(void);

/* --- PackedAttention ---------------------------------------------------- */

/* Score, select and attend (5 kernels on @s, capturable in a graph). */
GPU_HIDDEN int gpu_attend_packed(const struct gpu_attn_args *a,
				 const struct gpu_head *heads, cudaStream_t s);

/* Only the score and select stages: afterwards gpu_ws_scores() holds the
 * block scores (max over the group's heads) and gpu_ws_selected() the
 * selected global block indices in increasing order, count from
 * gpu_ws_counts(). */
GPU_HIDDEN int gpu_score_select(const struct gpu_attn_args *a,
				const struct gpu_head *heads, cudaStream_t s);
/* The same chain cut short, to time its parts in a graph (bench/attn
 * --split): @stage 1 the histograms' clear and qrot, 2 and the score
 * kernel, 3 and the select (= gpu_score_select).  -EINVAL for another
 * stage or bad arguments. */
GPU_HIDDEN int gpu_score_select_upto(const struct gpu_attn_args *a,
				     const struct gpu_head *heads, int stage,
				     cudaStream_t s);

/* Views into the scratch after a call (device pointers). */
GPU_HIDDEN float *gpu_ws_scores(const struct gpu_attn_args *a, uint32_t head);
GPU_HIDDEN uint32_t *gpu_ws_selected(const struct gpu_attn_args *a, uint32_t head);
/* counts[0] = selected blocks, counts[1] = chunks */
GPU_HIDDEN uint32_t *gpu_ws_counts(const struct gpu_attn_args *a, uint32_t head);
/* chunk starts: counts[1] + 1 list positions, the last one counts[0] */
GPU_HIDDEN uint32_t *gpu_ws_chunks(const struct gpu_attn_args *a, uint32_t head);
/* After a step or gpu_score_select (every select leaves it): the cut, two
 * words: the key (scores mapped to ordered uint32)
 * and the last tied block taken (0: none).  Block i is selected iff i == 0,
 * its key is above the first word, or equal to it with i <= the second. */
GPU_HIDDEN uint32_t *gpu_ws_cut(const struct gpu_attn_args *a, uint32_t head);
/* After gpu_score_select (or the stage cut after the score kernel,
 * gpu_score_select_upto's 2): the score kernel's histograms of context
 * @head, GPU_HIST_COARSE words of the keys' bits 31..21 (keys as in
 * gpu_ws_cut), then GPU_HIST_FINE of their bits 31..16, each bin the
 * tokens of the blocks whose key falls in it, block 0 (the sink) left
 * out.  Device pointer. */
#define GPU_HIST_COARSE 2048u
#define GPU_HIST_FINE 65536u
GPU_HIDDEN uint32_t *gpu_ws_hist(const struct gpu_attn_args *a, uint32_t head);
/* After a step that ordered its attention CTAs (GPU_ATTN_SLOT_ORDER
 * unset, the many-CTA select leaving the cut): the order, *@slots words
 * for context @head, the slot index of each rank (@quest: Quest's step's
 * layout), | GPU_ORDER_IDLE where the select found the slot without work.
 * Device pointer. */
#define GPU_ORDER_IDLE 0x80000000u
GPU_HIDDEN uint32_t *gpu_ws_order(const struct gpu_attn_args *a, uint32_t head, int quest,
				  uint32_t *slots);
/* After a step or gpu_score_select: segment @si's rotated query (floats,
 * q'[c] at c * @ldq + h for the group's heads h, c below its d_keep;
 * *@ldq set), its remainder norms (*@qperp: ldq floats, head h at h),
 * and, for a segment with 8-bit summaries, its 8-bit query (*@q8: words,
 * channel word u of head h at q8[u * 2 ldq + h] for max(qi, 0) and
 * q8[u * 2 ldq + ldq + h] for min(qi, 0), four channels a word, the
 * lowest in the low byte; the scales as floats from word S / 4 · 2 ldq,
 * head h at h).  Device pointers. */
GPU_HIDDEN void gpu_ws_qrot(const struct gpu_attn_args *a, uint32_t head, uint32_t si,
			    const float **qr, const float **qperp, const uint32_t **q8,
			    uint32_t *ldq);

/* --- Baselines ---------------------------------------------------------- */

/* Dense flash-decoding over all n tokens plus the window (tensor cores;
 * flags & GPU_ATTN_CUDA_CORES: the first, CUDA-core kernel, to compare). */
GPU_HIDDEN int gpu_attend_dense(const struct gpu_attn_args *a,
				const struct gpu_dense_head *heads, cudaStream_t s);
/* Quest: score blocks of quest_b on the dense bounds, same selection rule,
 * dense attention on the selected blocks plus the window. */
GPU_HIDDEN int gpu_attend_quest(const struct gpu_attn_args *a,
				const struct gpu_dense_head *heads, cudaStream_t s);
GPU_HIDDEN int gpu_quest_score_select(const struct gpu_attn_args *a,
				      const struct gpu_dense_head *heads,
				      cudaStream_t s);
/* Quest's block bounds (exact min/max per block and channel) of n × d bf16
 * keys, written to mn/mx (ceil(n / qb) × d bf16). */
GPU_HIDDEN int gpu_quest_bounds(const uint16_t *k, uint64_t n, uint32_t d,
				uint32_t qb, uint16_t *mn, uint16_t *mx,
				cudaStream_t s);

/* --- Device layout ------------------------------------------------------ */

/* Device bytes gpu_seg_upload needs for this pair of views. */
GPU_HIDDEN size_t gpu_seg_bytes(const struct mkv_packed_view *k,
				const struct mkv_packed_view *v);
/*
 * Copy a K/V pair of packed views into @dev (device memory of
 * gpu_seg_bytes(), 256-byte aligned) in the device layout, and describe it
 * in *@out (host struct with device pointers; copy it into a device array
 * of segments).  Synchronous.  -EINVAL unless both are bf16, same n and d,
 * d <= GPU_MAX_D, kinds right.
 */
GPU_HIDDEN int gpu_seg_upload(const struct mkv_packed_view *k,
			      const struct mkv_packed_view *v, void *dev,
			      struct gpu_seg *out);

/*
 * Value positions of @n vectors from their bitmaps (@bm: n × @bw words, as
 * gpu_seg's k_bm; only channels below @dk count) into @pos (n ×
 * GPU_POS_STRIDE(@r) bytes, device; see gpu_seg's k_pos): the first @r set
 * bits of each vector, then dk up to the stride.  Asynchronous on @s.
 * -EINVAL for NULL arrays, @pos not 16-byte aligned, n == 0, bw outside
 * 1..4, dk > 32 bw or dk > 128, r == 0 or r > dk.
 */
GPU_HIDDEN int gpu_seg_positions(const uint32_t *bm, uint32_t bw, uint32_t dk, uint32_t r,
				 uint64_t n, uint8_t *pos, cudaStream_t s);

/*
 * One scheduled row back in channel order: its first @S (value, position)
 * pairs sorted by position, stably.  The positions' layout puts a row's
 * channels in increasing order and its padding (r up to S) at d_keep, past
 * every channel, so this restores the row gpu_seg_positions and the image
 * laid out, byte for byte, wherever the pads hold equal values (zeros in
 * every image the library writes).
 */
static inline GPU_HD void gpu_unsched_row(uint16_t *val, uint8_t *pos, uint32_t S)
{
	for (uint32_t i = 1; i < S; i++) {
		uint16_t v = val[i];
		uint8_t p = pos[i];
		uint32_t j = i;
		for (; j > 0 && pos[j - 1] > p; j--) {
			val[j] = val[j - 1];
			pos[j] = pos[j - 1];
		}
		val[j] = v;
		pos[j] = p;
	}
}

/*
 * Put each 16-token block of segment @sg (a host copy: g = 1 and bf16 rows
 * on both halves, positions on both, b = 16, and GPU_ATTN_SMALL_ROWS'
 * promise at @d 64 or 128 (gpu_seg_small_rows: r <= 32, d_keep <= 3 d /
 * 4): what the positions' path reads) in store order for the
 * positions' path (gpu_sched_block, tile rows of 16 (3 d / 64) + 8
 * halves): each K and V row's (value, position) pairs permuted, the same
 * permutation on both arrays, written to @k_val, @v_val (n rows of k_rs,
 * v_rs units) and @k_pos, @v_pos (n × GPU_POS_STRIDE(r) bytes), device
 * memory 16-byte aligned, each either the very array it replaces (in
 * place) or one that does not overlap it.  Slots past r rounded up to 8
 * keep their bytes.  *@out gets @sg with those four arrays and sched set;
 * it is written at once, the arrays when the work on @s is done.  -EINVAL
 * for NULL arguments, a segment of another format, r over
 * GPU_SCHED_SLOTS, misaligned or partly overlapping arrays, n == 0;
 * nothing is written then.
 */
GPU_HIDDEN int gpu_seg_schedule(const struct gpu_seg *sg, uint32_t d, uint16_t *k_val,
				uint16_t *v_val, uint8_t *k_pos, uint8_t *v_pos,
				struct gpu_seg *out, cudaStream_t s);
/*
 * gpu_seg_schedule with the same arguments, results and errors, its
 * blocks computed a warp each (gpu/layout.cu, k_seg_schedule_warp) where
 * gpu_seg_schedule gives each a thread, whose serial rule takes ~2 ms a
 * block: the latency of a segment's schedule at upload (one 16,384-token
 * segment 0.50-0.56 ms against 1.96 on an H100; gpu/NOTES.md, fifty-first
 * session).  dseg_make's choice.
 */
GPU_HIDDEN int gpu_seg_schedule_warp(const struct gpu_seg *sg, uint32_t d, uint16_t *k_val,
				     uint16_t *v_val, uint8_t *k_pos, uint8_t *v_pos,
				     struct gpu_seg *out, cudaStream_t s);
/* 1 if gpu_seg_schedule takes segment @sg (a host copy) at head dimension
 * @d, else 0 (NULL included): the format test alone, not the arrays'
 * alignment. */
GPU_HIDDEN int gpu_seg_schedulable(const struct gpu_seg *sg, uint32_t d);
/*
 * Undo gpu_seg_schedule on segment @sg (a host copy with sched set), in
 * place: every row back in channel order (gpu_unsched_row), so the bitmap
 * paths read it again.  *@out gets @sg with sched 0 at once, the arrays
 * when the work on @s is done.  Why: a step that cannot run the small
 * layout must not meet a scheduled segment (gpu_seg.sched).  -EINVAL for
 * NULL arguments, sched 0, or a segment gpu_seg_schedule would refuse;
 * nothing is written then.
 */
GPU_HIDDEN int gpu_seg_unschedule(const struct gpu_seg *sg, uint32_t d, struct gpu_seg *out,
				  cudaStream_t s);

/*
 * 8-bit summaries of @nb blocks from their bf16 ones (@mn, @mx: nb × @S,
 * as gpu_seg's s_min / s_max) into @rows (nb × 2S bytes, 16-byte
 * aligned, gpu_seg's s8 layout) and @scale (nb floats): mkv_summary8's
 * rule by the same IEEE operations, so the values are equal.  Asynchronous on @s.  -EINVAL for
 * NULL arrays, nb == 0, S not a multiple of 8 in 8..32, @rows not
 * 16-byte aligned.
 */
GPU_HIDDEN int gpu_seg_sum8(const uint16_t *mn, const uint16_t *mx, uint32_t S, uint32_t nb,
			    int8_t *rows, float *scale, cudaStream_t s);

/* --- Sequence images (seqbuf.cu) --------------------------------------- */

/* Device bytes of a K/V pair in the layout above with room for @cap >= n
 * tokens (an update buffer that gpu_append grows in place, with room for
 * the rotations' corrections: gpu_seg_image_proj; cap = n for a closed
 * segment).  0 when the views cannot be laid out (as gpu_seg_bytes,
 * or different b, or n > cap). */
GPU_HIDDEN size_t gpu_seg_cap_bytes(const struct mkv_packed_view *k,
				    const struct mkv_packed_view *v, uint32_t cap);
/*
 * Write into host memory @img (gpu_seg_cap_bytes bytes; may be NULL: only
 * describe) the device image of the pair: tokens [0, n) packed, summaries
 * and remainder bounds of their blocks (zero where the view has no
 * sum_rest), both rotations, zeros elsewhere.  -EINVAL also for
 * value_bits other than 0 or 4..8, or a row_bytes that does not match
 * them (0 is accepted for bf16 rows).  *@out describes the
 * arrays as they will be once the image is copied to device address @dev
 * (256-byte aligned); out->n = n.  Host only: no CUDA call.  Returns 0 or
 * -EINVAL.
 */
GPU_HIDDEN int gpu_seg_image(const struct mkv_packed_view *k,
			     const struct mkv_packed_view *v, uint32_t cap, void *img,
			     const void *dev, struct gpu_seg *out);
/*
 * As gpu_seg_image, for an update buffer (cap > n) that gpu_append fills:
 * @kP / @vP (d_keep × d floats each, or both NULL) are the projections the
 * CPU encoder uses for the halves' rotations (struct mkv_segment's
 * proj_f32), and the image carries P − R (fp32) behind each rotation
 * (out->rot_dl), so that appended rows match rows the CPU appends.  With
 * cap == n, or NULL projections, out->rot_dl = 0 and appends rotate by R.
 * Returns 0 or -EINVAL (also: one projection NULL, the other not, or a
 * non-finite one).
 */
GPU_HIDDEN int gpu_seg_image_proj(const struct mkv_packed_view *k,
				  const struct mkv_packed_view *v, const float *kP,
				  const float *vP, uint32_t cap, void *img, const void *dev,
				  struct gpu_seg *out);

/* --- Update buffer and prefill encoding --------------------------------- */

/*
 * Append @n_new new tokens to each of @n_buf update buffers (one per layer ×
 * KV head).  A buffer is a gpu_seg in device memory (bufs[i]) whose arrays
 * have room for cap[i] tokens (the kernels write through its pointers);
 * its rotation, r, g, b, S are the current segment's.  Each new K and V
 * vector is rotated (x' = R x), keeps its top-r rotated elements (groups of
 * g by energy, ties to the lower index, as mkv_segment_encode), is packed
 * at index n (bf16 or quantized, by the buffer's k_vb / v_vb), and the
 * block summaries and remainder bounds of the keys are extended (outward
 * rounded, merged into a partly filled block; the remainder only where
 * s_rest is not NULL).  n and n_blocks advance on
 * the device, so attention launched after it on the same stream covers
 * the new tokens with no gap and a captured graph stays valid.  Tokens past
 * cap are dropped and *overflow (device, may be NULL) is set to 1.
 * k_new, v_new: bf16, n_buf × n_new × d, device.  ws: gpu_append_ws_bytes.
 */
struct gpu_append_args {
	uint32_t n_buf, n_new, d;
	struct gpu_seg *bufs;      /* device array [n_buf] */
	const uint32_t *cap;       /* device array [n_buf]: token capacity */
	const uint16_t *k_new, *v_new;
	uint32_t *overflow;
	void *ws;
	size_t ws_bytes;
};
GPU_HIDDEN size_t gpu_append_ws_bytes(uint32_t n_buf, uint32_t n_new);
GPU_HIDDEN int gpu_append(const struct gpu_append_args *a, cudaStream_t s);

/*
 * Prefill encoding of a layer on the GPU, in stages so that the eigen-
 * decomposition can run either on the GPU (cuSOLVER) or on CPU workers.
 * An encoder holds the cuBLAS/cuSOLVER handles and workspaces.
 */
struct gpu_encoder;
GPU_HIDDEN int gpu_encoder_create(uint32_t d, uint32_t nmat, struct gpu_encoder **out);
GPU_HIDDEN void gpu_encoder_destroy(struct gpu_encoder *e);
/* cov[m] = X_mᵀ X_m (d × d float, device) for nmat matrices X_m (n × d bf16,
 * device, contiguous one after the other). */
GPU_HIDDEN int gpu_encode_cov(struct gpu_encoder *e, const uint16_t *x, uint32_t nmat,
			      uint32_t n, float *cov, cudaStream_t s);
/* Eigenvectors of each cov[m] (destroyed) as rows of R[m] (d × d float,
 * device), eigenvalues descending, by cuSOLVER syevd. */
GPU_HIDDEN int gpu_encode_eig(struct gpu_encoder *e, float *cov, uint32_t nmat, float *R,
			      cudaStream_t s);

/*
 * Pack: matrices 2i (keys) and 2i+1 (values) of x become segment pair i,
 * rotated by the first d_keep rows of R[m] (rounded to bf16), per-vector
 * top-r in groups of g, rows in bf16 or quantized to value_bits (4..8; the
 * same for K and V), block summaries over the first S channels and the
 * keys' remainder bounds.  The arrays live in @dev
 * (gpu_encode_pack_bytes); segs receives nmat/2 host descriptors with
 * device pointers.  Asynchronous on @s (the host does not wait): x, R and
 * dev must stay valid, and the encoder must not be used on another
 * stream, until the stream has passed it.
 */
struct gpu_encode_args {
	uint32_t nmat, n, d, r, g, b, S, drop;
	uint32_t value_bits; /* 0: bf16 rows; 4..8: quantized rows */
	const uint16_t *x;  /* device, nmat × n × d bf16 */
	const float *R;     /* device, nmat × d × d */
	void *dev;
	size_t dev_bytes;
	struct gpu_seg *segs; /* host array [nmat / 2] */
};
GPU_HIDDEN size_t gpu_encode_pack_bytes(const struct gpu_encode_args *a);
GPU_HIDDEN int gpu_encode_pack(struct gpu_encoder *e, const struct gpu_encode_args *a,
			       cudaStream_t s);

/* --- Synthetic device data (benchmarks, tests) ------------------------- */

/* p[i] = bf16(offset + scale · N(0,1)-like), reproducible from @seed. */
GPU_HIDDEN int gpu_synth_bf16(uint16_t *p, uint64_t n, float scale, float offset,
			      uint64_t seed, cudaStream_t s);
/* Block bounds: mn[i] <= mx[i], random. */
GPU_HIDDEN int gpu_synth_minmax(uint16_t *mn, uint16_t *mx, uint64_t n, uint64_t seed,
				cudaStream_t s);
/* nvec bitmaps of bw words, each with exactly nbits of the first ngroups
 * bits set. */
GPU_HIDDEN int gpu_synth_bitmaps(uint32_t *bm, uint64_t nvec, uint32_t bw, uint32_t ngroups,
				 uint32_t nbits, uint64_t seed, cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
