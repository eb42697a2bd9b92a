/* SPDX-License-Identifier: MIT */
/*
 * Upload of a K/V pair of packed views into the device layout of
 * struct gpu_seg (see gpu.cuh): values padded to a multiple of 8 per
 * vector, bitmaps to whole 32-bit words, every array 256-byte aligned.
 * Host repacking happens once per segment, never per decode step.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common.cuh"

/* The layout is seqbuf.cu's image with room for exactly n tokens. */
size_t gpu_seg_bytes(const struct mkv_packed_view *k, const struct mkv_packed_view *v)
{
	if (!k || !v || k->n > UINT32_MAX)
		return 0;
	return gpu_seg_cap_bytes(k, v, (uint32_t)k->n);
}

int gpu_seg_upload(const struct mkv_packed_view *k, const struct mkv_packed_view *v, void *dev,
		   struct gpu_seg *out)
{
	struct gpu_seg g;
	size_t total = gpu_seg_bytes(k, v);
	if (!dev || !out || !total)
		return -EINVAL;
	char *h = (char *)malloc(total);
	if (!h)
		return -ENOMEM;
	int rc = gpu_seg_image(k, v, (uint32_t)k->n, h, dev, &g);
	if (rc == 0) {
		cudaError_t e = cudaMemcpy(dev, h, total, cudaMemcpyHostToDevice);
		if (e != cudaSuccess)
			rc = gpu_errno(e);
	}
	free(h);
	if (rc == 0)
		*out = g;
	return rc;
}

/* One thread a vector: its first r set bits below dk, in increasing
 * order, then dk to the stride (a channel no product reads: the K tile's
 * columns from d_keep meet zero queries, the V tile's feed accumulators
 * nobody reads). */
__global__ void k_seg_positions(const uint32_t *bm, uint32_t bw, uint32_t dk, uint32_t r,
				uint32_t ps, uint64_t n, uint8_t *pos)
{
	uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n)
		return;
	uint32_t out[32]; /* ps <= 128 bytes, as 32 words */
	for (uint32_t k = 0; k < ps / 4; k++)
		out[k] = dk * 0x01010101u;
	uint32_t k = 0;
	for (uint32_t w = 0; w < bw && k < r; w++) {
		uint32_t x = bm[i * bw + w];
		uint32_t lo = 32u * w;
		x = dk >= lo + 32 ? x : dk > lo ? x & ((1u << (dk - lo)) - 1u) : 0u;
		for (; x && k < r; k++, x &= x - 1u) {
			uint32_t c = lo + (uint32_t)(__ffs(x) - 1);
			uint32_t sh = 8u * (k & 3u);
			out[k >> 2] = (out[k >> 2] & ~(0xffu << sh)) | (c << sh);
		}
	}
	uint4 *dst = (uint4 *)(pos + i * ps);
	for (uint32_t q = 0; q < ps / 16; q++)
		dst[q] = make_uint4(out[4 * q], out[4 * q + 1], out[4 * q + 2], out[4 * q + 3]);
}

int gpu_seg_positions(const uint32_t *bm, uint32_t bw, uint32_t dk, uint32_t r, uint64_t n,
		      uint8_t *pos, cudaStream_t s)
{
	if (!bm || !pos || n == 0 || bw < 1 || bw > 4 || dk > 32 * bw || dk > 128 || r == 0 ||
	    r > dk || ((uintptr_t)pos & 15u))
		return -EINVAL;
	uint64_t nblk = (n + 255) / 256;
	if (nblk > 0x7fffffffu)
		return -EINVAL;
	k_seg_positions<<<(uint32_t)nblk, 256, 0, s>>>(bm, bw, dk, r, GPU_POS_STRIDE(r), n, pos);
	return gpu_errno(cudaGetLastError());
}

/* Row @row of the K (@kv 0) or V half put in the order @ord (its S
 * slots' indices): read whole before it is written, so that the output
 * may be the input; the bytes past the slots as they were. */
__device__ void sched_permute_row(const uint16_t *kv_in, const uint16_t *vv_in,
				  const uint8_t *kp_in, const uint8_t *vp_in, uint16_t *kv_out,
				  uint16_t *vv_out, uint8_t *kp_out, uint8_t *vp_out, uint32_t krs,
				  uint32_t vrs, uint32_t kps, uint32_t vps, uint32_t sk, uint32_t sv,
				  size_t row, uint32_t kv, const uint8_t *ord)
{
	const uint32_t S = kv ? sv : sk;
	const uint16_t *vi = (kv ? vv_in + row * vrs : kv_in + row * krs);
	const uint8_t *pi = (kv ? vp_in + row * vps : kp_in + row * kps);
	uint16_t *vo = (kv ? vv_out + row * vrs : kv_out + row * krs);
	uint8_t *po = (kv ? vp_out + row * vps : kp_out + row * kps);
	uint16_t val[GPU_SCHED_SLOTS];
	uint8_t pos[GPU_SCHED_SLOTS];
	for (uint32_t i = 0; i < S; i++) {
		val[i] = vi[i];
		pos[i] = pi[i];
	}
	for (uint32_t j = 0; j < S; j++) {
		uint32_t i = ord[j];
		vo[j] = val[i];
		po[j] = pos[i];
	}
	if (vo != vi)
		for (uint32_t i = S; i < (kv ? vrs : krs); i++)
			vo[i] = vi[i];
	if (po != pi)
		for (uint32_t i = S; i < (kv ? vps : kps); i++)
			po[i] = pi[i];
}

/* One thread a 16-token block: its schedule (gpu_sched_block), then each
 * row read whole before it is written back permuted, so that the arrays
 * may be the ones they replace. */
__global__ void k_seg_schedule(const uint16_t *kv_in, const uint16_t *vv_in,
			       const uint8_t *kp_in, const uint8_t *vp_in, uint16_t *kv_out,
			       uint16_t *vv_out, uint8_t *kp_out, uint8_t *vp_out, uint32_t n,
			       uint32_t krs, uint32_t vrs, uint32_t kps, uint32_t vps, uint32_t sk,
			       uint32_t sv, uint32_t ld)
{
	uint32_t blk = blockIdx.x * blockDim.x + threadIdx.x;
	if (blk >= (n + 15) / 16)
		return;
	uint32_t t0 = 16 * blk, nt = min(16u, n - t0);
	uint8_t ord[32 * GPU_SCHED_SLOTS];
	gpu_sched_block(kp_in + (size_t)t0 * kps, kps, vp_in + (size_t)t0 * vps, vps, nt, sk, sv,
			ld, ord);
	for (uint32_t l = 0; l < 32; l++)
		if ((l & 15u) < nt)
			sched_permute_row(kv_in, vv_in, kp_in, vp_in, kv_out, vv_out, kp_out, vp_out,
					  krs, vrs, kps, vps, sk, sv, (size_t)t0 + (l & 15u), l >> 4,
					  ord + l * GPU_SCHED_SLOTS);
}

/*
 * One warp a 16-token block, lane l the store lane of gpu_sched_block
 * (lane t < 16: K row t; 16 + t: V row t), computing the very schedule
 * that function computes (the test compares the bytes with the host's),
 * so that a block takes microseconds, not the ~2 ms one thread's serial
 * search took (one segment's upload waits for its slowest block).  What
 * is serial in the rule stays so, with its values uniform across the warp:
 * the augmenting paths (each step's matching: lanes' bank masks by
 * shuffle, the bank owners one a lane, the path's stack in shared
 * memory) and the left-out lanes in lane order (each one's least loaded
 * bank by a warp-wide minimum of (load, slot)).  Each lane then permutes
 * its own row, read whole before it is written, so that the arrays may
 * be the ones they replace.
 */
#define SCHED_WARPS 4
struct sched_warp {
	uint8_t first[32][32]; /* lane, bank: the lowest slot left there */
	uint8_t nxt[32][GPU_SCHED_SLOTS]; /* lane, slot: the next slot in its bank */
	uint8_t ord[32][GPU_SCHED_SLOTS]; /* lane, step: the slot it stores */
	uint8_t stl[33], stb[33];         /* the path: lanes, and banks taken */
	int8_t pick[32];
	uint8_t pb[32];
};

__global__ void __launch_bounds__(32 * SCHED_WARPS)
	k_seg_schedule_warp(const uint16_t *kv_in, const uint16_t *vv_in, const uint8_t *kp_in,
		       const uint8_t *vp_in, uint16_t *kv_out, uint16_t *vv_out,
		       uint8_t *kp_out, uint8_t *vp_out, uint32_t n, uint32_t krs, uint32_t vrs,
		       uint32_t kps, uint32_t vps, uint32_t sk, uint32_t sv, uint32_t ld)
{
	__shared__ struct sched_warp W[SCHED_WARPS];
	const uint32_t lane = threadIdx.x & 31u, wi = threadIdx.x >> 5;
	const uint32_t blk = blockIdx.x * SCHED_WARPS + wi;
	if (blk >= (n + 15) / 16)
		return; /* a whole warp: no barrier below is CTA-wide */
	struct sched_warp &w = W[wi];
	const uint32_t t0 = 16 * blk, nt = min(16u, n - t0), t = lane & 15u;
	const uint8_t *kp = kp_in + (size_t)t0 * kps, *vp = vp_in + (size_t)t0 * vps;
	/* this lane's banks with slots left (lm), as gpu_sched_block builds them */
	const uint32_t ns = t < nt ? (lane < 16 ? sk : sv) : 0u;
	uint32_t lm = 0u;
	for (uint32_t i = ns; i-- > 0;) {
		uint32_t b = gpu_sched_bank(kp, kps, vp, vps, ld, lane, i);
		w.nxt[lane][i] = lm >> b & 1u ? w.first[lane][b] : 0xffu;
		w.first[lane][b] = (uint8_t)i;
		lm |= 1u << b;
	}
	__syncwarp();
	const uint32_t steps = sk > sv ? sk : sv;
	for (uint32_t step = 0; step < steps; step++) {
		int own = -1; /* the lane that owns bank `lane` at this step */
		w.pick[lane] = -1;
		uint32_t dead = 0u, owned = 0u;
		for (uint32_t root = 0; root < 32; root++) {
			if (!__shfl_sync(0xffffffffu, lm, root))
				continue;
			uint32_t seen = dead;
			int dep = 0;
			uint32_t l = root;
			if (lane == 0)
				w.stl[0] = (uint8_t)root;
			dead = 0u;
			while (dep >= 0) {
				uint32_t cand = __shfl_sync(0xffffffffu, lm, l) & ~seen;
				if (!cand) {
					if (--dep >= 0) {
						__syncwarp();
						l = w.stl[dep];
					}
					continue;
				}
				uint32_t fr = cand & ~owned;
				uint32_t b = (uint32_t)__ffs((int)(fr ? fr : cand)) - 1u;
				seen |= 1u << b;
				int o = __shfl_sync(0xffffffffu, own, b);
				if (o < 0) {
					/* the path's banks change hands: bank b to l,
					 * each earlier bank to the lane before it */
					if (lane == b)
						own = (int)l;
					owned |= 1u << b;
					__syncwarp();
					for (int e = 0; e < dep; e++)
						if (lane == w.stb[e])
							own = w.stl[e];
					break;
				}
				__syncwarp(); /* every lane has read the entries it replaces */
				if (lane == 0) {
					w.stb[dep] = (uint8_t)b;
					w.stl[dep + 1] = (uint8_t)o;
				}
				dep++;
				l = (uint32_t)o;
			}
			if (dep < 0)
				dead = seen;
			__syncwarp();
		}
		/* the matched lanes' picks, from their banks' owners */
		if (own >= 0) {
			w.pick[own] = (int8_t)w.first[own][lane];
			w.pb[own] = (uint8_t)lane;
		}
		uint32_t load = own >= 0 ? 1u : 0u; /* of bank `lane` */
		__syncwarp();
		int pick = w.pick[lane];
		uint32_t pb = w.pb[lane];
		/* the lanes left out, in lane order: the least loaded bank, the
		 * lowest slot among equals */
		uint32_t left = __ballot_sync(0xffffffffu, lm && pick < 0);
		for (; left; left &= left - 1u) {
			uint32_t l = (uint32_t)__ffs((int)left) - 1u;
			uint32_t m = __shfl_sync(0xffffffffu, lm, l);
			uint32_t key = m >> lane & 1u ? load << 8 | w.first[l][lane] : 0xffffffffu;
			uint32_t k = __reduce_min_sync(0xffffffffu, key);
			uint32_t bb = (uint32_t)__ffs((int)__ballot_sync(0xffffffffu, key == k)) - 1u;
			if (lane == bb)
				load++;
			if (lane == l) {
				pick = (int)(k & 0xffu);
				pb = bb;
			}
		}
		/* the loop's reads of other lanes' first[] before the writes
		 * below: the collectives converge the warp but do not order
		 * its shared-memory accesses (racecheck, fifty-first session) */
		__syncwarp();
		if (pick >= 0) {
			uint32_t i = (uint32_t)pick;
			w.ord[lane][step] = (uint8_t)i;
			if (w.nxt[lane][i] == 0xffu)
				lm &= ~(1u << pb);
			else
				w.first[lane][pb] = w.nxt[lane][i];
		}
		__syncwarp();
	}
	if (t < nt)
		sched_permute_row(kv_in, vv_in, kp_in, vp_in, kv_out, vv_out, kp_out, vp_out, krs,
				  vrs, kps, vps, sk, sv, (size_t)t0 + t, lane >> 4, w.ord[lane]);
}

/* [a, a + na) and [b, b + nb) share a byte but do not start together */
static bool part_overlap(const void *a, size_t na, const void *b, size_t nb)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
	return x != y && x < y + nb && y < x + na;
}

/* The segments gpu_seg_schedule puts in store order, and so the ones
 * gpu_seg_unschedule takes back: the positions' path's format at head
 * dimension @d (only the small layout reads scheduled rows). */
static bool sched_seg_ok(const struct gpu_seg &g, uint32_t d)
{
	const uint32_t sk = (g.k_r + 7) & ~7u, sv = (g.v_r + 7) & ~7u;
	return (d == 64 || d == 128) && g.k_val && g.v_val && g.k_pos && g.v_pos && g.n != 0 &&
	       g.b == 16 && g.k_g == 1 && g.v_g == 1 && g.k_vb == 0 && g.v_vb == 0 && g.k_r != 0 &&
	       g.v_r != 0 && g.k_r <= g.k_dk && g.v_r <= g.v_dk && g.k_dk <= 3 * d / 4 &&
	       g.v_dk <= 3 * d / 4 && sk <= GPU_SCHED_SLOTS && sv <= GPU_SCHED_SLOTS &&
	       g.k_rs >= sk && g.v_rs >= sv && !(g.k_rs & 7u) && !(g.v_rs & 7u) &&
	       gpu_seg_small_rows(&g, d);
}

int gpu_seg_schedulable(const struct gpu_seg *sg, uint32_t d)
{
	return sg && sched_seg_ok(*sg, d);
}

static int seg_schedule(const struct gpu_seg *sg, uint32_t d, uint16_t *k_val, uint16_t *v_val,
			uint8_t *k_pos, uint8_t *v_pos, struct gpu_seg *out, cudaStream_t s,
			bool warp)
{
	if (!sg || !out || !k_val || !v_val || !k_pos || !v_pos || !sched_seg_ok(*sg, d))
		return -EINVAL;
	const struct gpu_seg g = *sg;
	const uint32_t sk = (g.k_r + 7) & ~7u, sv = (g.v_r + 7) & ~7u;
	const void *arr[8] = {g.k_val, g.v_val, g.k_pos, g.v_pos, k_val, v_val, k_pos, v_pos};
	for (int i = 0; i < 8; i++)
		if ((uintptr_t)arr[i] & 15u)
			return -EINVAL;
	const uint32_t kps = GPU_POS_STRIDE(g.k_r), vps = GPU_POS_STRIDE(g.v_r);
	const size_t len[4] = {(size_t)g.n * g.k_rs * 2, (size_t)g.n * g.v_rs * 2,
			       (size_t)g.n * kps, (size_t)g.n * vps};
	/* each output either is its input or meets none of the inputs, and
	 * no two outputs meet */
	for (int o = 0; o < 4; o++) {
		for (int i = 0; i < 4; i++) {
			if (i == o ? part_overlap(arr[4 + o], len[o], arr[i], len[i])
				   : (arr[4 + o] == arr[i] ||
				      part_overlap(arr[4 + o], len[o], arr[i], len[i])))
				return -EINVAL;
			if (i != o && (arr[4 + o] == arr[4 + i] ||
				       part_overlap(arr[4 + o], len[o], arr[4 + i], len[i])))
				return -EINVAL;
		}
	}
	const uint32_t ld = 16u * (3u * d / 64u) + 8u, nb = (g.n + 15) / 16;
	int rc;
	if (warp) {
		k_seg_schedule_warp<<<(nb + SCHED_WARPS - 1) / SCHED_WARPS, 32 * SCHED_WARPS, 0,
				      s>>>(g.k_val, g.v_val, g.k_pos, g.v_pos, k_val, v_val, k_pos,
					   v_pos, g.n, g.k_rs, g.v_rs, kps, vps, sk, sv, ld);
	} else {
		/* A thread's block is a serial search over ~3 KB of its own
		 * arrays (local memory): L1 all the way and CTAs of one warp,
		 * so that a segment's blocks spread over more SMs */
		if ((rc = gpu_errno(cudaFuncSetAttribute(
			     k_seg_schedule, cudaFuncAttributePreferredSharedMemoryCarveout, 0))))
			return rc;
		k_seg_schedule<<<(nb + 31) / 32, 32, 0, s>>>(g.k_val, g.v_val, g.k_pos, g.v_pos,
							      k_val, v_val, k_pos, v_pos, g.n,
							      g.k_rs, g.v_rs, kps, vps, sk, sv, ld);
	}
	rc = gpu_errno(cudaGetLastError());
	if (rc)
		return rc;
	struct gpu_seg o = g;
	o.k_val = k_val;
	o.v_val = v_val;
	o.k_pos = k_pos;
	o.v_pos = v_pos;
	o.sched = ld;
	*out = o;
	return 0;
}

int gpu_seg_schedule(const struct gpu_seg *sg, uint32_t d, uint16_t *k_val, uint16_t *v_val,
		     uint8_t *k_pos, uint8_t *v_pos, struct gpu_seg *out, cudaStream_t s)
{
	return seg_schedule(sg, d, k_val, v_val, k_pos, v_pos, out, s, false);
}

int gpu_seg_schedule_warp(const struct gpu_seg *sg, uint32_t d, uint16_t *k_val,
			  uint16_t *v_val, uint8_t *k_pos, uint8_t *v_pos, struct gpu_seg *out,
			  cudaStream_t s)
{
	return seg_schedule(sg, d, k_val, v_val, k_pos, v_pos, out, s, true);
}

/* One thread a row: the K rows, then the V rows. */
__global__ void k_seg_unschedule(uint16_t *kv, uint16_t *vv, uint8_t *kp, uint8_t *vp,
				 uint32_t n, uint32_t krs, uint32_t vrs, uint32_t kps, uint32_t vps,
				 uint32_t sk, uint32_t sv)
{
	uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= 2ull * n)
		return;
	if (i < n)
		gpu_unsched_row(kv + i * krs, kp + i * kps, sk);
	else
		gpu_unsched_row(vv + (i - n) * vrs, vp + (i - n) * vps, sv);
}

int gpu_seg_unschedule(const struct gpu_seg *sg, uint32_t d, struct gpu_seg *out, cudaStream_t s)
{
	if (!sg || !out || !sg->sched || !sched_seg_ok(*sg, d))
		return -EINVAL;
	struct gpu_seg g = *sg;
	g.sched = 0;
	const uint32_t sk = (g.k_r + 7) & ~7u, sv = (g.v_r + 7) & ~7u;
	const uint64_t nt = 2ull * g.n;
	k_seg_unschedule<<<(uint32_t)((nt + 127) / 128), 128, 0, s>>>(
		(uint16_t *)g.k_val, (uint16_t *)g.v_val, (uint8_t *)g.k_pos, (uint8_t *)g.v_pos, g.n,
		g.k_rs, g.v_rs, GPU_POS_STRIDE(g.k_r), GPU_POS_STRIDE(g.v_r), sk, sv);
	int rc = gpu_errno(cudaGetLastError());
	if (rc)
		return rc;
	*out = g;
	return 0;
}

/* One thread a block: mkv_summary8's steps in its order (mosaickv/
 * attention.c, block8): the largest |bound|, its bf16 rounding up over
 * 127, the floor and ceiling of each bound on that grid; the words
 * interleaved (gpu_seg's s8). */
__global__ void k_seg_sum8(const uint16_t *mn, const uint16_t *mx, uint32_t S, uint32_t nb,
			   int8_t *rows, float *scale)
{
	uint32_t j = blockIdx.x * blockDim.x + threadIdx.x;
	if (j >= nb)
		return;
	const uint16_t *lo = mn + (size_t)j * S, *hi = mx + (size_t)j * S;
	float a = 0.0f;
	for (uint32_t c = 0; c < S; c++)
		a = fmaxf(a, fmaxf(fabsf(bf1(lo[c])), fabsf(bf1(hi[c]))));
	float sc = 1.0f;
	if (a > 0.0f) {
		uint32_t u = __float_as_uint(__fdiv_rn(a, 127.0f));
		sc = __uint_as_float(((u & 0xffffu) ? u + 0x10000u : u) & 0xffff0000u);
	}
	uint32_t w[16];
	for (uint32_t c = 0; c < 2 * S; c++) {
		float x = c < S ? floorf(__fdiv_rn(bf1(lo[c]), sc))
				: ceilf(__fdiv_rn(bf1(hi[c - S]), sc));
		int v = (int)fminf(fmaxf(x, -127.0f), 127.0f);
		/* channel e of the minima (e = c) or the maxima (e = c - S):
		 * word 2 (e / 4) or 2 (e / 4) + 1, byte e % 4 */
		uint32_t e = c < S ? c : c - S, wi = 2u * (e >> 2) + (c < S ? 0u : 1u);
		uint32_t sh = 8u * (e & 3u);
		w[wi] = (e & 3u ? w[wi] : 0u) | ((uint32_t)(v & 0xff) << sh);
	}
	uint4 *dst = (uint4 *)(rows + (size_t)j * 2 * S);
	for (uint32_t q = 0; q < S / 8; q++)
		dst[q] = make_uint4(w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]);
	scale[j] = sc;
}

int gpu_seg_sum8(const uint16_t *mn, const uint16_t *mx, uint32_t S, uint32_t nb, int8_t *rows,
		 float *scale, cudaStream_t s)
{
	if (!mn || !mx || !rows || !scale || nb == 0 || S < 8 || S > 32 || (S & 7) ||
	    ((uintptr_t)rows & 15u))
		return -EINVAL;
	k_seg_sum8<<<(nb + 255) / 256, 256, 0, s>>>(mn, mx, S, nb, rows, scale);
	return gpu_errno(cudaGetLastError());
}
