/* SPDX-License-Identifier: MIT */
/*
 * Compression on the GPU: the update-buffer append (rotate, per-vector
 * top-r, pack, extend block summaries) and prefill encoding (covariance by
 * cuBLAS, eigen-decomposition by cuSOLVER, then the same packing kernel).
 * CPU reference: mkv_segment_encode with a given rotation.
 */
#include <stdlib.h>
#include <string.h>
#include <cublas_v2.h>
#include <cusolverDn.h>
#include "common.cuh"

/* One run of tokens to pack into one half (K or V) of a segment. */
struct pack_job {
	const uint16_t *x; /* ntok × d bf16 */
	const uint16_t *R; /* dk × d bf16 */
	const float *C;    /* append: P − R (dk × d, fp32) added to R, or NULL */
	uint16_t *val;     /* segment values (token 0): rows of rs 16-bit units */
	uint32_t *bm;      /* segment bitmaps (token 0) */
	uint16_t *smin, *smax; /* NULL for values */
	uint16_t *srest;   /* block remainder bounds (keys; NULL for values) */
	float *rest;       /* per token of the run: its remainder norm (keys) */
	float *xs;         /* exact rotated keys: row t at xs + t * xs_ld */
	const float *xr;   /* prefill: rotated vectors, ntok × dk (k_pack_rot) */
	const uint16_t *xc; /* prefill: bf16 x Cᵀ to add to xr (same layout), or NULL */
	uint32_t tok0, ntok, dk, r, g, rs, bw, S, b, xs_ld;
	uint32_t d, vb;    /* head dim; value bits (0: bf16 rows) */
	uint8_t *pos;      /* value positions (token 0; gpu_seg k_pos), or NULL;
			    * written for g == 1 only */
};

/*
 * |x|² − |x'_{0..S-1}|² of a key (the square of segment.c's rest_norm
 * before its clamp at 0) from this lane's channels j = lane + 32 k of x
 * (@xo, d of them) and of x' (@xr, c < S): one warp sum of the lanes'
 * differences, so the last bits may differ from the CPU's sequential
 * sums; the bound is rounded up to bf16 after.
 */
__device__ __forceinline__ float rest_sq(const float (&xo)[4], const float (&xr)[4], uint32_t d,
					 uint32_t S, int lane)
{
	float v = 0.0f;
#pragma unroll
	for (int k = 0; k < 4; k++) {
		uint32_t c = lane + 32 * k;
		if (c < d)
			v = fmaf(xo[k], xo[k], v);
		if (c < S)
			v = fmaf(-xr[k], xr[k], v);
	}
	return warp_sum(v);
}

/* The remainder norm of a key: sqrt(max(0, rest_sq)). */
__device__ __forceinline__ float rest_norm(const float (&xo)[4], const float (&xr)[4],
					   uint32_t d, uint32_t S, int lane)
{
	return sqrtf(fmaxf(0.0f, rest_sq(xo, xr, d, S, lane)));
}

/*
 * Write token @tok's bitmap and packed row: W[] the bitmap words, kidx[k]
 * the index among the stored values of rotated channel lane + 32 k (-1:
 * not stored), xr[k] its value.  Rows are bf16 values (vb == 0)
 * or segment.c's quantized row (quantize_row): scale s = the kept values'
 * largest magnitude / (2^(w-1) - 1) rounded up to bf16, fields
 * u = 2^(w-1) + clamp(rint(x / s)), LSB-first from bit 16; the whole
 * device row (rs units) is written, padding zero.  @qsh: this warp's
 * GPU_MAX_D bytes of shared scratch.
 */
__device__ __forceinline__ void pack_write(const struct pack_job &J, size_t tok,
					   const uint32_t (&W)[4], const int (&kidx)[4],
					   const float (&xr)[4], int lane, uint8_t *qsh)
{
	if (lane < (int)J.bw)
		J.bm[tok * J.bw + lane] = lane == 0 ? W[0] : lane == 1 ? W[1] : lane == 2 ? W[2] : W[3];
	if (J.pos && J.g == 1) {
		/* as gpu_seg_positions would find them in the bitmap just
		 * written: value i's channel, then d_keep to the stride */
		const uint32_t ps = GPU_POS_STRIDE(J.r);
		uint8_t *pp = J.pos + tok * ps;
#pragma unroll
		for (int k = 0; k < 4; k++)
			if (kidx[k] >= 0)
				pp[kidx[k]] = (uint8_t)(lane + 32 * k);
		for (uint32_t sl = J.r + lane; sl < ps; sl += 32)
			pp[sl] = (uint8_t)J.dk;
	}
	if (!J.vb) {
		uint16_t *out = J.val + tok * J.rs;
#pragma unroll
		for (int k = 0; k < 4; k++)
			if (kidx[k] >= 0)
				out[kidx[k]] = f2bf_rn(xr[k]);
		for (uint32_t sl = J.r + lane; sl < J.rs; sl += 32)
			out[sl] = 0;
		return;
	}
	uint32_t w = J.vb, half = 1u << (w - 1);
	int qmax = (int)half - 1;
	float amax = 0.0f;
#pragma unroll
	for (int k = 0; k < 4; k++)
		if (kidx[k] >= 0)
			amax = fmaxf(amax, fabsf(xr[k]));
	amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(amax)));
	uint16_t sb = amax > 0.0f ? f2bf_up(__fdiv_rn(amax, (float)qmax)) : 0;
	float sf = bf1(sb);
#pragma unroll
	for (int k = 0; k < 4; k++)
		if (kidx[k] >= 0) {
			int q = 0;
			if (sf > 0.0f) {
				float t = rintf(__fdiv_rn(xr[k], sf));
				q = t > (float)qmax ? qmax : t < (float)-qmax ? -qmax : (int)t;
			}
			qsh[kidx[k]] = (uint8_t)(q + (int)half);
		}
	__syncwarp();
	/* word wd holds row bits [32 wd, 32 wd + 32): field k at 16 + k w */
	uint32_t *out = (uint32_t *)(J.val + tok * J.rs);
	for (uint32_t wd = lane; wd < J.rs / 2; wd += 32) {
		uint32_t v = wd == 0 ? sb : 0u;
		int b0 = 32 * (int)wd - 16;
		int k0 = b0 < 0 ? 0 : b0 / (int)w;
		int k1 = min((int)J.r, (b0 + 31) / (int)w + 1);
		for (int k = k0; k < k1; k++) {
			int fb = 16 + k * (int)w - 32 * (int)wd;
			uint32_t u = qsh[k];
			v |= fb >= 0 ? u << fb : u >> -fb;
		}
		out[wd] = v;
	}
	__syncwarp();
}

/* pack_write with @sel marking the kept groups (one flag per group). */
__device__ __forceinline__ void pack_out(const struct pack_job &J, size_t tok, const uint8_t *sel,
					 const float (&xr)[4], int lane, uint8_t *qsh)
{
	uint32_t dk = J.dk, g = J.g, ng = dk / g;
	uint32_t W[4];
#pragma unroll
	for (int wd = 0; wd < 4; wd++) {
		uint32_t j = 32 * wd + lane;
		W[wd] = __ballot_sync(0xffffffffu, j < ng && sel[j]);
	}
	int kidx[4];
#pragma unroll
	for (int k = 0; k < 4; k++) {
		uint32_t c = lane + 32 * k;
		kidx[k] = -1;
		if (c < dk) {
			uint32_t j = c / g;
			if (sel[j]) {
				uint32_t pos = 0, wj = j >> 5;
#pragma unroll
				for (int wd = 0; wd < 4; wd++)
					if ((uint32_t)wd < wj)
						pos += __popc(W[wd]);
				uint32_t ww = wj == 0 ? W[0] : wj == 1 ? W[1] : wj == 2 ? W[2] : W[3];
				pos += __popc(ww & ((1u << (j & 31)) - 1u));
				kidx[k] = (int)(pos * g + c % g);
			}
		}
	}
	pack_write(J, tok, W, kidx, xr, lane, qsh);
}

/*
 * The energy of this lane's channels c = lane + 32 k as ordered integers:
 * at a group's lead channel Σ_t x'(c+t)² in the CPU's order (t sequential),
 * elsewhere and past d_keep 0, which no candidate (>= 1) of pack_keep
 * counts; a negative NaN is clamped so that its signed count holds.
 */
template <bool G1>
__device__ __forceinline__ void pack_energies(const float (&xr)[4], uint32_t dk, uint32_t g,
					      int lane, uint32_t (&eb)[4])
{
#pragma unroll
	for (int k = 0; k < 4; k++) {
		uint32_t c = lane + 32 * k;
		float e;
		if (G1) {
			e = __fmul_rn(xr[k], xr[k]);
		} else {
			int ld = lane & ~(int)(g - 1);
			e = 0.0f;
			for (uint32_t tt = 0; tt < g; tt++) {
				float v = __shfl_sync(0xffffffffu, xr[k], ld + (int)tt);
				e = __fadd_rn(e, __fmul_rn(v, v));
			}
		}
		eb[k] = c < dk && (c % g) == 0 ? min(__float_as_uint(e), 0x7fffffffu) : 0u;
	}
}

/*
 * The kept groups of one vector (keep[k]: this lane's channel lane + 32 k
 * leads a kept group): the kg largest energies, ties to the lower group
 * index as mkv_topk_mask.  T = the kg-th largest energy, the largest value
 * with >= kg at or above it, by a bitwise radix search (energies are
 * non-negative, so their bits order them).  Stop as soon as exactly kg lie
 * at or above a prefix: the final T is >= it, so the same kg are at or
 * above the final T and no tie is left to break (with distinct energies
 * that happens after ~13 of the 31 bits on the bench's data).  A lane
 * counts its channels at or above cand by the sign of cand - 1 - e (both
 * below 2^31).  KN: the k that can hold a channel (dk <= 32 KN).
 */
template <int KN>
__device__ __forceinline__ void pack_keep(const uint32_t (&eb)[4], uint32_t dk, uint32_t g,
					  uint32_t kg, int lane, bool (&keep)[4])
{
	uint32_t T = 0;
	bool exact = false;
	for (int bit = 30; bit >= 0; bit--) {
		uint32_t cand = T | (1u << bit), n = 0;
#pragma unroll
		for (int k = 0; k < KN; k++)
			n += (cand - 1u - eb[k]) >> 31;
		uint32_t cnt = __reduce_add_sync(0xffffffffu, n);
		if (cnt >= kg) {
			T = cand;
			if (cnt == kg) { /* warp-uniform */
				exact = true;
				break;
			}
		}
	}
	/* kept: at or above T, and of the ties at T the first ones in (k,
	 * lane) order (none left to break when exact) */
	uint32_t ties_left = 0, tie_before = 0;
	if (!exact) {
		uint32_t ngt = 0;
#pragma unroll
		for (int k = 0; k < 4; k++)
			ngt += __popc(__ballot_sync(0xffffffffu, eb[k] > T));
		ties_left = kg - ngt;
	}
#pragma unroll
	for (int k = 0; k < 4; k++) {
		bool lead = lane + 32 * k < dk && ((lane + 32 * k) % g) == 0;
		if (exact) {
			keep[k] = lead && eb[k] >= T;
		} else {
			uint32_t tb = __ballot_sync(0xffffffffu, lead && eb[k] == T);
			keep[k] = lead && (eb[k] > T ||
					   (eb[k] == T &&
					    tie_before + __popc(tb & ((1u << lane) - 1u)) < ties_left));
			tie_before += __popc(tb);
		}
	}
}

/*
 * Token @tok's bitmap and row from pack_keep's flags: for g == 1 the bitmap
 * words are the flags' ballots and a value's index the kept channels
 * before it; otherwise through @selsh (this warp's GPU_MAX_D flags, one a
 * group) and pack_out.
 */
__device__ __forceinline__ void pack_emit(const struct pack_job &J, size_t tok, uint32_t g,
					  const bool (&keep)[4], const float (&xr)[4], int lane,
					  uint8_t *selsh, uint8_t *qsh)
{
	if (g == 1) {
		uint32_t W[4];
		int kidx[4];
		uint32_t before = 0, lt = (1u << lane) - 1u;
#pragma unroll
		for (int k = 0; k < 4; k++) {
			W[k] = __ballot_sync(0xffffffffu, keep[k]);
			kidx[k] = keep[k] ? (int)(before + __popc(W[k] & lt)) : -1;
			before += __popc(W[k]);
		}
		pack_write(J, tok, W, kidx, xr, lane, qsh);
		return;
	}
	__syncwarp(); /* the previous vector's pack_out has read selsh */
#pragma unroll
	for (int k = 0; k < 4; k++) {
		uint32_t c = lane + 32 * k;
		if (c < J.dk && (c % g) == 0)
			selsh[c / g] = keep[k];
	}
	__syncwarp();
	pack_out(J, tok, selsh, xr, lane, qsh);
}

/*
 * Rotated channels c < dk of the CTA's nt <= 4 tokens (xsh, d floats each)
 * into xrsh: x Rᵀ (+ x Cᵀ), a warp a channel at a time with the lanes
 * splitting the d products (4 each), so that R's and C's rows are read
 * once by the CTA, coalesced, for all its tokens, U rows in flight a warp.
 * It was a lane a channel, each lane's row read alone (d / 8 + d / 4
 * dependent loads): a decode step's one-token append ran 16 warps on the
 * whole device, 46 µs a layer at 1M tokens on the H200 (ncu, twenty-fourth
 * session).  The order of the sums differs from the CPU's (cblas) as
 * before.
 */
template <int U>
__device__ __forceinline__ void pack_project(const struct pack_job &J, uint32_t d, uint32_t nt,
					     const float (*xsh)[GPU_MAX_D], float (*xrsh)[GPU_MAX_D],
					     int w, int lane)
{
	const uint32_t dk = J.dk, j0 = 4 * (uint32_t)lane;
	const bool on = j0 < d; /* d 64: lanes 16..31 hold no products */
	float x[4][4];
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int e = 0; e < 4; e++)
			x[i][e] = on && (uint32_t)i < nt ? xsh[i][j0 + e] : 0.0f;
	for (uint32_t c0 = (uint32_t)w; c0 < dk; c0 += 4 * U) {
		uint2 rv[U];
		float4 cv[U];
#pragma unroll
		for (int u = 0; u < U; u++) {
			uint32_t c = c0 + 4 * u;
			bool ok = on && c < dk;
			rv[u] = ok ? __ldg((const uint2 *)(J.R + (size_t)c * d + j0)) : make_uint2(0, 0);
			cv[u] = ok && J.C ? __ldg((const float4 *)(J.C + (size_t)c * d + j0))
					  : make_float4(0.f, 0.f, 0.f, 0.f);
		}
#pragma unroll
		for (int u = 0; u < U; u++) {
			uint32_t c = c0 + 4 * u;
			float p[4] = {bf_lo(rv[u].x) + cv[u].x, bf_hi(rv[u].x) + cv[u].y,
				      bf_lo(rv[u].y) + cv[u].z, bf_hi(rv[u].y) + cv[u].w};
#pragma unroll
			for (int i = 0; i < 4; i++) {
				if ((uint32_t)i >= nt)
					break;
				float s = p[0] * x[i][0];
				s = fmaf(p[1], x[i][1], s);
				s = fmaf(p[2], x[i][2], s);
				s = fmaf(p[3], x[i][3], s);
				s = warp_sum(s);
				if (lane == 0 && c < dk)
					xrsh[i][c] = s;
			}
		}
	}
}

/* One warp per token after the CTA's shared projection.  Matches
 * encode_select/pack_vector of segment.c. */
__global__ void __launch_bounds__(128) k_pack(const struct pack_job *jobs, uint32_t d)
{
	__shared__ __align__(16) float xsh[4][GPU_MAX_D];
	__shared__ float xrsh[4][GPU_MAX_D];
	__shared__ uint8_t selsh[4][GPU_MAX_D];
	__shared__ uint8_t qsh[4][GPU_MAX_D];
	const struct pack_job &J = jobs[blockIdx.y];
	int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const uint32_t tb = blockIdx.x * 4;
	if (tb >= J.ntok)
		return; /* CTA-uniform: before the barriers */
	const uint32_t nt = min(4u, J.ntok - tb);
	/* R's and C's rows into L2 at once: pack_project's rounds then wait
	 * on L2, not each on DRAM */
	{
		const size_t rb = (size_t)J.dk * d * 2, cb = J.C ? (size_t)J.dk * d * 4 : 0;
		for (size_t o = (size_t)threadIdx.x * 128; o < rb + cb; o += (size_t)blockDim.x * 128) {
			const char *a = o < rb ? (const char *)J.R + o : (const char *)J.C + (o - rb);
			asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
		}
	}
	const uint16_t *xb = J.x + (size_t)tb * d;
	for (uint32_t i = threadIdx.x; i < nt * d; i += blockDim.x)
		xsh[i / d][i % d] = bf1(xb[i]);
	__syncthreads();
	pack_project<8>(J, d, nt, xsh, xrsh, w, lane);
	__syncthreads();
	const uint32_t t = tb + (uint32_t)w;
	if (t >= J.ntok)
		return; /* warp-uniform, past the last barrier */
	uint32_t dk = J.dk, g = J.g, kg = J.r / g;
	float xr[4];
#pragma unroll
	for (int k = 0; k < 4; k++) {
		uint32_t c = lane + 32 * k;
		xr[k] = c < dk ? xrsh[w][c] : 0.0f;
	}
	uint32_t eb[4];
	bool keep[4];
	if (g == 1)
		pack_energies<true>(xr, dk, 1, lane, eb);
	else
		pack_energies<false>(xr, dk, g, lane, eb);
	pack_keep<4>(eb, dk, g, kg, lane, keep);
	pack_emit(J, (size_t)J.tok0 + t, g, keep, xr, lane, selsh[w], qsh[w]);
#pragma unroll
	for (int k = 0; k < 4; k++) {
		uint32_t c = lane + 32 * k;
		if (J.xs && c < dk && c < J.S)
			J.xs[(size_t)t * J.xs_ld + c] = xr[k];
	}
	if (J.rest) {
		float xo[4];
#pragma unroll
		for (int k = 0; k < 4; k++)
			xo[k] = lane + 32 * k < d ? xsh[w][lane + 32 * k] : 0.0f;
		float rn = rest_norm(xo, xr, d, J.S, lane);
		if (lane == 0)
			J.rest[t] = rn;
	}
}

/* Block summaries of the keys just packed: thread per (block, channel). */
__global__ void k_summ(const struct pack_job *jobs)
{
	const struct pack_job &J = jobs[blockIdx.y];
	if (!J.smin || J.ntok == 0)
		return;
	uint32_t b = J.b, fb = J.tok0 / b, lb = (J.tok0 + J.ntok - 1) / b;
	uint32_t blk = fb + blockIdx.x;
	if (blk > lb)
		return;
	uint32_t t0 = max(J.tok0, blk * b), t1 = min(J.tok0 + J.ntok, (blk + 1) * b);
	bool merge = blk * b < J.tok0; /* the block already holds tokens */
	if (J.srest && threadIdx.x == blockDim.x - 1) { /* the remainder bound */
		float m = 0.0f;
		for (uint32_t t = t0; t < t1; t++)
			m = fmaxf(m, J.rest[t - J.tok0]);
		uint16_t z = f2bf_up(m);
		if (merge && bf1(J.srest[blk]) > bf1(z))
			z = J.srest[blk];
		J.srest[blk] = z;
	}
	for (uint32_t c = threadIdx.x; c < J.S; c += blockDim.x) {
		float mn = INFINITY, mx = -INFINITY;
		for (uint32_t t = t0; t < t1; t++) {
			size_t o = (size_t)(t - J.tok0) * J.xs_ld + c;
			float v = J.xs[o];
			if (J.xc) /* the sum k_pack_rot packs */
				v += bf1(J.xc[o]);
			mn = fminf(mn, v);
			mx = fmaxf(mx, v);
		}
		uint16_t a = f2bf_down(mn), z = f2bf_up(mx);
		size_t o = (size_t)blk * J.S + c;
		if (merge) {
			if (bf1(J.smin[o]) < bf1(a))
				a = J.smin[o];
			if (bf1(J.smax[o]) > bf1(z))
				z = J.smax[o];
		}
		J.smin[o] = a;
		J.smax[o] = z;
	}
}

/*
 * Prefill packing from rotated vectors (cuBLAS did x' = x Rᵀ and x Cᵀ).
 * One warp per block of b tokens, so that the keys' block summaries and
 * remainder bounds come from the warp's registers (a second kernel over
 * x' cost 78 µs of the 64K-token layer on the H200); each vector's loads
 * go out while the one before it is worked (one vector per warp left
 * every warp waiting on its loads: 1.06 ms for that layer).  Per vector,
 * the r/g largest group energies by a bitwise radix search (energies are
 * non-negative, so their bits order them), ties to the lower group index
 * as mkv_topk_mask.  Jobs by value: no upload and no host wait before
 * the launch.  Prefill only: tok0 == 0, so no block holds older tokens.
 */
#define PACK_JOBS 16
struct pack_jobs {
	struct pack_job j[PACK_JOBS];
};

template <bool G1, int KN>
__global__ void __launch_bounds__(128) k_pack_rot(const __grid_constant__ struct pack_jobs P)
{
	__shared__ uint8_t selsh[4][GPU_MAX_D];
	__shared__ uint8_t qsh[4][GPU_MAX_D];
	const struct pack_job &J = P.j[blockIdx.y];
	int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
	uint32_t blk = blockIdx.x * 4 + w, t0 = blk * J.b;
	if (t0 >= J.ntok)
		return; /* warp-uniform */
	const uint32_t t1 = min(J.ntok, t0 + J.b), dk = J.dk, d = J.d, g = G1 ? 1 : J.g,
		       kg = J.r / g, S = J.S;
	const bool sums = J.smin != NULL, rest = J.srest != NULL;
	/* this lane's columns of the three inputs; the next vector's loads
	 * go out before this one is worked */
	const float *pr = J.xr + lane;
	const uint16_t *pc = J.xc ? J.xc + lane : NULL, *px = J.x + lane;
	float ra[4];
	uint16_t ca[4], xa[4];
	auto issue = [&](uint32_t t) {
		const float *r = pr + (size_t)t * dk;
		const uint16_t *c = pc ? pc + (size_t)t * dk : NULL, *x = px + (size_t)t * d;
#pragma unroll
		for (int k = 0; k < 4; k++) {
			bool in = lane + 32 * k < dk;
			ra[k] = in ? __ldg(r + 32 * k) : 0.0f;
			ca[k] = in && c ? __ldg(c + 32 * k) : (uint16_t)0;
			xa[k] = rest && lane + 32 * k < d ? __ldg(x + 32 * k) : (uint16_t)0;
		}
	};
	issue(t0);
	float mn[4], mx[4], mrest = 0.0f;
#pragma unroll
	for (int k = 0; k < 4; k++) {
		mn[k] = INFINITY;
		mx[k] = -INFINITY;
	}
	for (uint32_t t = t0; t < t1; t++) {
		float xr[4], xo[4];
#pragma unroll
		for (int k = 0; k < 4; k++) {
			xr[k] = ra[k] + bf1(ca[k]); /* x Pᵀ = x Rᵀ + x Cᵀ */
			xo[k] = bf1(xa[k]);
		}
		if (t + 1 < t1)
			issue(t + 1);
		uint32_t eb[4];
		bool keep[4];
		pack_energies<G1>(xr, dk, g, lane, eb);
		pack_keep<KN>(eb, dk, g, kg, lane, keep);
		pack_emit(J, t, g, keep, xr, lane, selsh[w], qsh[w]);
		if (sums) {
#pragma unroll
			for (int k = 0; k < 4; k++)
				if (lane + 32 * k < S) {
					mn[k] = fminf(mn[k], xr[k]);
					mx[k] = fmaxf(mx[k], xr[k]);
				}
		}
		if (rest) /* the largest over the block, its root at the end
			   (the root is monotone) */
			mrest = fmaxf(mrest, rest_sq(xo, xr, d, S, lane));
	}
	if (sums) {
#pragma unroll
		for (int k = 0; k < 4; k++) {
			uint32_t c = lane + 32 * k;
			if (c < S) {
				J.smin[(size_t)blk * S + c] = f2bf_down(mn[k]);
				J.smax[(size_t)blk * S + c] = f2bf_up(mx[k]);
			}
		}
	}
	if (rest && lane == 0)
		J.srest[blk] = f2bf_up(sqrtf(mrest));
}

/* Append: thread per buffer builds its two jobs and advances n. */
__global__ void k_append_setup(struct gpu_seg *bufs, const uint32_t *cap, uint32_t n_buf,
			       uint32_t n_new, uint32_t d, const uint16_t *kn, const uint16_t *vn,
			       struct pack_job *jobs, float *xs, float *rest, uint32_t *overflow)
{
	uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= n_buf)
		return;
	struct gpu_seg &B = bufs[i];
	uint32_t n = B.n, cnt = n_new;
	if (n + n_new > cap[i]) {
		cnt = cap[i] > n ? cap[i] - n : 0;
		if (overflow)
			*overflow = 1;
	}
	struct pack_job k, v;
	k.x = kn + (size_t)i * n_new * d;
	k.R = B.k_rot;
	k.C = B.rot_dl ? (const float *)(B.k_rot + B.rot_dl) : NULL;
	k.val = (uint16_t *)B.k_val;
	k.bm = (uint32_t *)B.k_bm;
	k.smin = (uint16_t *)B.s_min;
	k.smax = (uint16_t *)B.s_max;
	k.srest = (uint16_t *)B.s_rest;
	k.rest = B.s_rest ? rest + (size_t)i * n_new : NULL;
	k.xs = xs + (size_t)i * n_new * GPU_MAX_D;
	k.tok0 = n;
	k.ntok = cnt;
	k.dk = B.k_dk;
	k.r = B.k_r;
	k.g = B.k_g;
	k.rs = B.k_rs;
	k.bw = B.k_bw;
	k.S = B.S;
	k.b = B.b;
	k.xs_ld = B.S;
	k.xr = NULL;
	k.xc = NULL;
	k.d = d;
	k.vb = B.k_vb;
	k.pos = (uint8_t *)B.k_pos;
	v = k;
	v.x = vn + (size_t)i * n_new * d;
	v.R = B.v_rot;
	v.C = B.rot_dl ? (const float *)(B.v_rot + B.rot_dl) : NULL;
	v.val = (uint16_t *)B.v_val;
	v.bm = (uint32_t *)B.v_bm;
	v.smin = v.smax = NULL;
	v.srest = NULL;
	v.rest = NULL;
	v.vb = B.v_vb;
	v.pos = (uint8_t *)B.v_pos;
	v.xs = NULL;
	v.dk = B.v_dk;
	v.r = B.v_r;
	v.g = B.v_g;
	v.rs = B.v_rs;
	v.bw = B.v_bw;
	v.S = 0;
	jobs[2 * i] = k;
	jobs[2 * i + 1] = v;
	B.n = n + cnt;
	B.n_blocks = (n + cnt + B.b - 1) / B.b;
}

/* Scratch: the jobs, the new keys' first S rotated channels, their
 * remainder norms. */
size_t gpu_append_ws_bytes(uint32_t n_buf, uint32_t n_new)
{
	size_t jobs = ((size_t)2 * n_buf * sizeof(struct pack_job) + 255) & ~(size_t)255;
	return jobs + (size_t)n_buf * n_new * (GPU_MAX_D + 1) * sizeof(float);
}

int gpu_append(const struct gpu_append_args *a, cudaStream_t s)
{
	if (!a || !a->bufs || !a->cap || !a->k_new || !a->v_new || !a->ws || a->n_buf == 0 ||
	    a->n_new == 0 || a->n_buf > 65535 || !(a->d == 64 || a->d == 128) ||
	    a->ws_bytes < gpu_append_ws_bytes(a->n_buf, a->n_new))
		return -EINVAL;
	struct pack_job *jobs = (struct pack_job *)a->ws;
	size_t joff = ((size_t)2 * a->n_buf * sizeof(struct pack_job) + 255) & ~(size_t)255;
	float *xs = (float *)((char *)a->ws + joff);
	float *rest = xs + (size_t)a->n_buf * a->n_new * GPU_MAX_D;
	k_append_setup<<<(a->n_buf + 127) / 128, 128, 0, s>>>(a->bufs, a->cap, a->n_buf, a->n_new,
								a->d, a->k_new, a->v_new, jobs, xs,
								rest, a->overflow);
	GPU_CKL();
	k_pack<<<dim3((a->n_new + 3) / 4, 2 * a->n_buf), 128, 0, s>>>(jobs, a->d);
	GPU_CKL();
	/* blocks touched by n_new tokens starting anywhere: n_new/8 + 2 at b >= 8 */
	k_summ<<<dim3(a->n_new / 8 + 2, 2 * a->n_buf), 128, 0, s>>>(jobs);
	GPU_CKL();
	return 0;
}

/* ------------------------------------------------------------------ */
/* Prefill encoding.                                                   */

struct gpu_encoder {
	cublasHandle_t blas;
	cusolverDnHandle_t sol;
	cusolverDnParams_t params;
	uint32_t d, nmat;
	void *dwork;   /* batched syev workspace, device */
	size_t dwork_bytes;
	void *hwork;   /* and host */
	size_t hwork_bytes;
	float *work;   /* per-matrix syevd workspace (fallback) */
	int lwork;
	int *info;     /* nmat ints */
	float *eigv;   /* nmat × d eigenvalues */
	uint16_t *rot; /* nmat × d × d bf16 staging of the rounded rotations */
	/* The projection's correction C = (I − R Rᵀ) R of each rounded R
	 * (nmat × d × d each): R in float, R Rᵀ, C in float, C in bf16. */
	float *rf, *gm, *cf;
	uint16_t *cb;
	float *xr;     /* rotated vectors, nmat × n × d_keep */
	size_t xr_bytes;
	uint16_t *xc;  /* their corrections x Cᵀ in bf16, the same layout */
	size_t xc_bytes;
};

int gpu_encoder_create(uint32_t d, uint32_t nmat, struct gpu_encoder **out)
{
	if (!out || !(d == 64 || d == 128) || nmat == 0 || nmat % 2)
		return -EINVAL;
	struct gpu_encoder *e = (struct gpu_encoder *)calloc(1, sizeof *e);
	if (!e)
		return -ENOMEM;
	e->d = d;
	e->nmat = nmat;
	int rc = -EIO;
	cudaError_t ce;
	float *tmp = NULL;
	if (cublasCreate(&e->blas) != CUBLAS_STATUS_SUCCESS)
		goto fail;
	if (cusolverDnCreate(&e->sol) != CUSOLVER_STATUS_SUCCESS ||
	    cusolverDnCreateParams(&e->params) != CUSOLVER_STATUS_SUCCESS)
		goto fail;
	if ((ce = cudaMalloc(&e->info, sizeof(int) * nmat)) != cudaSuccess ||
	    (ce = cudaMalloc(&e->eigv, sizeof(float) * d * nmat)) != cudaSuccess ||
	    (ce = cudaMalloc(&e->rot, (size_t)2 * d * d * nmat)) != cudaSuccess ||
	    (ce = cudaMalloc(&e->rf, sizeof(float) * d * d * nmat)) != cudaSuccess ||
	    (ce = cudaMalloc(&e->gm, sizeof(float) * d * d * nmat)) != cudaSuccess ||
	    (ce = cudaMalloc(&e->cf, sizeof(float) * d * d * nmat)) != cudaSuccess ||
	    (ce = cudaMalloc(&e->cb, (size_t)2 * d * d * nmat)) != cudaSuccess ||
	    (ce = cudaMalloc(&tmp, sizeof(float) * d * d * nmat)) != cudaSuccess) {
		rc = gpu_errno(ce);
		goto fail;
	}
	{
		int lw = 0;
		if (cusolverDnSsyevd_bufferSize(e->sol, CUSOLVER_EIG_MODE_VECTOR,
						CUBLAS_FILL_MODE_LOWER, (int)d, tmp, (int)d,
						e->eigv, &lw) != CUSOLVER_STATUS_SUCCESS)
			goto fail;
		e->lwork = lw;
		if ((ce = cudaMalloc(&e->work, sizeof(float) * (size_t)lw * nmat)) != cudaSuccess) {
			rc = gpu_errno(ce);
			goto fail;
		}
		size_t db = 0, hb = 0;
		if (cusolverDnXsyevBatched_bufferSize(e->sol, e->params, CUSOLVER_EIG_MODE_VECTOR,
						      CUBLAS_FILL_MODE_LOWER, d, CUDA_R_32F, tmp, d,
						      CUDA_R_32F, e->eigv, CUDA_R_32F, &db, &hb,
						      nmat) == CUSOLVER_STATUS_SUCCESS) {
			if ((ce = cudaMalloc(&e->dwork, db ? db : 1)) != cudaSuccess) {
				rc = gpu_errno(ce);
				goto fail;
			}
			e->dwork_bytes = db;
			e->hwork = malloc(hb ? hb : 1);
			if (!e->hwork) {
				rc = -ENOMEM;
				goto fail;
			}
			e->hwork_bytes = hb;
		}
	}
	cudaFree(tmp);
	*out = e;
	return 0;
fail:
	cudaFree(tmp);
	gpu_encoder_destroy(e);
	return rc;
}

void gpu_encoder_destroy(struct gpu_encoder *e)
{
	if (!e)
		return;
	if (e->blas)
		cublasDestroy(e->blas);
	if (e->params)
		cusolverDnDestroyParams(e->params);
	if (e->sol)
		cusolverDnDestroy(e->sol);
	cudaFree(e->dwork);
	free(e->hwork);
	cudaFree(e->work);
	cudaFree(e->info);
	cudaFree(e->eigv);
	cudaFree(e->rot);
	cudaFree(e->rf);
	cudaFree(e->gm);
	cudaFree(e->cf);
	cudaFree(e->cb);
	cudaFree(e->xr);
	cudaFree(e->xc);
	free(e);
}

int gpu_encode_cov(struct gpu_encoder *e, const uint16_t *x, uint32_t nmat, uint32_t n,
		   float *cov, cudaStream_t s)
{
	if (!e || !x || !cov || nmat == 0 || nmat > e->nmat || n == 0)
		return -EINVAL;
	if (cublasSetStream(e->blas, s) != CUBLAS_STATUS_SUCCESS)
		return -EIO;
	/* Row-major X (n × d) is column-major Xᵀ (d × n, ld d): C = Xᵀ (Xᵀ)ᵀ. */
	float one = 1.0f, zero = 0.0f;
	int d = (int)e->d;
	cublasStatus_t st = cublasGemmStridedBatchedEx(
		e->blas, CUBLAS_OP_N, CUBLAS_OP_T, d, d, (int)n, &one, x, CUDA_R_16BF, d,
		(long long)n * d, x, CUDA_R_16BF, d, (long long)n * d, &zero, cov, CUDA_R_32F, d,
		(long long)d * d, (int)nmat, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (st != CUBLAS_STATUS_SUCCESS)
		return st == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO;
	GPU_CKL();
	return 0;
}

/* R[m] row i = eigenvector d-1-i (syevd: ascending, in columns). */
__global__ void k_eig_rows(const float *A, float *R, uint32_t d)
{
	uint32_t m = blockIdx.y, i = blockIdx.x;
	for (uint32_t j = threadIdx.x; j < d; j += blockDim.x)
		R[((size_t)m * d + i) * d + j] = A[((size_t)m * d + (d - 1 - i)) * d + j];
}

int gpu_encode_eig(struct gpu_encoder *e, float *cov, uint32_t nmat, float *R, cudaStream_t s)
{
	if (!e || !cov || !R || nmat == 0 || nmat > e->nmat)
		return -EINVAL;
	if (cusolverDnSetStream(e->sol, s) != CUSOLVER_STATUS_SUCCESS)
		return -EIO;
	int d = (int)e->d;
	/* one batched call where the library has it, else one syevd each */
	if (!e->dwork || nmat != e->nmat ||
	    cusolverDnXsyevBatched(e->sol, e->params, CUSOLVER_EIG_MODE_VECTOR,
				   CUBLAS_FILL_MODE_LOWER, d, CUDA_R_32F, cov, d, CUDA_R_32F,
				   e->eigv, CUDA_R_32F, e->dwork, e->dwork_bytes, e->hwork,
				   e->hwork_bytes, e->info, nmat) != CUSOLVER_STATUS_SUCCESS) {
		for (uint32_t m = 0; m < nmat; m++) {
			cusolverStatus_t st = cusolverDnSsyevd(
				e->sol, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, d,
				cov + (size_t)m * d * d, d, e->eigv + (size_t)m * d,
				e->work + (size_t)m * e->lwork, e->lwork, e->info + m);
			if (st != CUSOLVER_STATUS_SUCCESS)
				return -EIO;
		}
	}
	k_eig_rows<<<dim3(e->d, nmat), 128, 0, s>>>(cov, R, e->d);
	GPU_CKL();
	return 0;
}

/* Round the first dk rows of R[m] (float, d × d) to bf16 into the
 * segment's rotation (matrix m = blockIdx.y: pair m / 2 of @dev, its key
 * rotation at @koff, its value rotation at @voff) and stage, and the
 * rounded values as floats into rf and cf. */
__global__ void k_rot_bf16(const float *R, char *dev, size_t per_pair, size_t koff, size_t voff,
			   uint16_t *stage, float *rf, float *cf, uint32_t dk, uint32_t d)
{
	uint32_t m = blockIdx.y, i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < dk * d) {
		uint16_t v = f2bf_rn(R[(size_t)m * d * d + i]);
		uint16_t *rot = (uint16_t *)(dev + (m / 2) * per_pair + (m % 2 ? voff : koff));
		size_t o = (size_t)m * dk * d + i;
		rot[i] = v;
		stage[o] = v;
		rf[o] = cf[o] = bf1(v);
	}
}

__global__ void k_f2bf(const float *x, uint16_t *y, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		y[i] = f2bf_rn(x[i]);
}

/*
 * The CPU encoder projects with P = (R Rᵀ)⁻¹ R of the rounded R (linalg.c)
 * so that X' R gives X back at r = d.  Here P = R + C to first order,
 * C = (I − R Rᵀ) R: R Rᵀ − I is ~2^-9, so the second order is ~2^-18 of
 * x, and C (~2^-9 of R) in bf16 carries P to ~2^-17.  @e->cf holds R on
 * entry; fp32 products (no TF32: the difference cancels 9 bits).
 */
static int enc_correction(struct gpu_encoder *e, uint32_t nmat, uint32_t dk, uint32_t d,
			  cudaStream_t s)
{
	float one = 1.0f, zero = 0.0f, mone = -1.0f;
	long long sr = (long long)dk * d, sg = (long long)dk * dk;
	/* row-major R (dk × d) is column-major A = Rᵀ (d × dk): G = Aᵀ A */
	cublasStatus_t st = cublasSgemmStridedBatched(
		e->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)dk, (int)dk, (int)d, &one, e->rf,
		(int)d, sr, e->rf, (int)d, sr, &zero, e->gm, (int)dk, sg, (int)nmat);
	/* Cᵀ = A − A G (G symmetric): column-major d × dk, row-major C */
	if (st == CUBLAS_STATUS_SUCCESS)
		st = cublasSgemmStridedBatched(e->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)d, (int)dk,
					       (int)dk, &mone, e->rf, (int)d, sr, e->gm, (int)dk,
					       sg, &one, e->cf, (int)d, sr, (int)nmat);
	if (st != CUBLAS_STATUS_SUCCESS)
		return st == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO;
	size_t m = (size_t)nmat * dk * d;
	k_f2bf<<<(unsigned)((m + 255) / 256), 256, 0, s>>>(e->cf, e->cb, m);
	GPU_CKL();
	return 0;
}

struct enc_plan {
	size_t k_val, k_bm, k_rot, s_min, s_max, s_rest, v_val, v_bm, v_rot, per_pair;
	uint32_t dk, rs, bw, nb;
};

static size_t al(size_t x) { return (x + 255) & ~(size_t)255; }

static int enc_plan_of(const struct gpu_encode_args *a, struct enc_plan *p)
{
	if (!a || a->nmat == 0 || a->nmat % 2 || a->n == 0 || a->n > MKV_MAX_N ||
	    !(a->d == 64 || a->d == 128) || !(a->g == 1 || a->g == 2 || a->g == 4 || a->g == 8) ||
	    !(a->b == 8 || a->b == 16 || a->b == 32 || a->b == 64) || a->drop > 1 ||
	    (a->value_bits && (a->value_bits < 4 || a->value_bits > 8)))
		return -EINVAL;
	p->dk = a->drop ? a->d - a->d / 4 : a->d;
	if (a->r == 0 || a->r > p->dk || a->r % a->g || a->S == 0 || a->S > p->dk)
		return -EINVAL;
	if (a->value_bits) { /* the host row rounded up to 16 bytes (gpu.cuh) */
		uint32_t rb = 2 + (a->r * a->value_bits + 7) / 8;
		p->rs = ((rb + (rb & 1) + 15) & ~15u) / 2;
	} else {
		p->rs = (a->r + 7) & ~7u;
	}
	p->bw = (p->dk / a->g + 31) / 32;
	p->nb = (a->n + a->b - 1) / a->b;
	size_t n = a->n, off = 0;
	p->k_val = off; off += al(n * p->rs * 2 + 16);
	p->k_bm = off; off += al(n * p->bw * 4);
	p->k_rot = off; off += al((size_t)p->dk * a->d * 2);
	p->s_min = off; off += al((size_t)p->nb * a->S * 2);
	p->s_max = off; off += al((size_t)p->nb * a->S * 2);
	p->s_rest = off; off += al((size_t)p->nb * 2);
	p->v_val = off; off += al(n * p->rs * 2 + 16);
	p->v_bm = off; off += al(n * p->bw * 4);
	p->v_rot = off; off += al((size_t)p->dk * a->d * 2);
	p->per_pair = off;
	return 0;
}

/* Job @m of a layer's encode (m even: a head's K, odd: its V); for K also
 * the head's segment view in a->segs. */
static void enc_job(struct gpu_encoder *e, const struct gpu_encode_args *a,
		    const struct enc_plan &p, uint32_t m, struct pack_job *j)
{
	uint32_t d = a->d, dk = p.dk;
	char *base = (char *)a->dev + (m / 2) * p.per_pair;
	int key = (m % 2) == 0;
	uint16_t *rot = (uint16_t *)(base + (key ? p.k_rot : p.v_rot));
	float *xr = e->xr + (size_t)m * a->n * dk;
	j->x = a->x + (size_t)m * a->n * d;
	j->R = rot;
	j->xr = xr;
	j->xc = e->xc + (size_t)m * a->n * dk;
	j->val = (uint16_t *)(base + (key ? p.k_val : p.v_val));
	j->bm = (uint32_t *)(base + (key ? p.k_bm : p.v_bm));
	j->smin = key ? (uint16_t *)(base + p.s_min) : NULL;
	j->smax = key ? (uint16_t *)(base + p.s_max) : NULL;
	j->srest = key ? (uint16_t *)(base + p.s_rest) : NULL;
	j->rest = NULL; /* k_pack_rot keeps each block's largest */
	j->d = d;
	j->vb = a->value_bits;
	j->xs = NULL; /* k_pack_rot sums up x' + x Cᵀ itself */
	j->xs_ld = 0;
	j->tok0 = 0;
	j->ntok = a->n;
	j->dk = dk;
	j->r = a->r;
	j->g = a->g;
	j->rs = p.rs;
	j->bw = p.bw;
	j->S = key ? a->S : 0;
	j->b = a->b;
	if (key) {
		struct gpu_seg *sg = &a->segs[m / 2];
		memset(sg, 0, sizeof *sg);
		sg->k_val = j->val;
		sg->k_bm = j->bm;
		sg->k_rot = rot;
		sg->s_min = j->smin;
		sg->s_max = j->smax;
		sg->s_rest = j->srest;
		sg->k_vb = sg->v_vb = a->value_bits;
		sg->v_val = (const uint16_t *)(base + p.v_val);
		sg->v_bm = (const uint32_t *)(base + p.v_bm);
		sg->v_rot = (const uint16_t *)(base + p.v_rot);
		sg->n = a->n;
		sg->b = a->b;
		sg->n_blocks = p.nb;
		sg->S = a->S;
		sg->k_dk = sg->v_dk = dk;
		sg->k_r = sg->v_r = a->r;
		sg->k_g = sg->v_g = a->g;
		sg->k_rs = sg->v_rs = p.rs;
		sg->k_bw = sg->v_bw = p.bw;
	}
}

size_t gpu_encode_pack_bytes(const struct gpu_encode_args *a)
{
	struct enc_plan p;
	return enc_plan_of(a, &p) ? 0 : p.per_pair * (a->nmat / 2);
}

int gpu_encode_pack(struct gpu_encoder *e, const struct gpu_encode_args *a, cudaStream_t s)
{
	struct enc_plan p;
	if (!e || enc_plan_of(a, &p) || !a->x || !a->R || !a->dev || !a->segs ||
	    a->d != e->d || a->nmat > e->nmat || a->dev_bytes < p.per_pair * (a->nmat / 2))
		return -EINVAL;
	uint32_t d = a->d, dk = p.dk;
	size_t need = (size_t)a->nmat * a->n * dk * sizeof(float);
	if (need > e->xr_bytes) {
		cudaFree(e->xr);
		e->xr = NULL;
		e->xr_bytes = 0;
		GPU_CK(cudaMalloc(&e->xr, need));
		e->xr_bytes = need;
	}
	need = (size_t)a->nmat * a->n * dk * 2;
	if (need > e->xc_bytes) {
		cudaFree(e->xc);
		e->xc = NULL;
		e->xc_bytes = 0;
		GPU_CK(cudaMalloc(&e->xc, need));
		e->xc_bytes = need;
	}
	k_rot_bf16<<<dim3((dk * d + 255) / 256, a->nmat), 256, 0, s>>>(
		a->R, (char *)a->dev, p.per_pair, p.k_rot, p.v_rot, e->rot, e->rf, e->cf, dk, d);
	GPU_CKL();
	/* x' = x Rᵀ on the tensor cores: column-major X'ᵀ (dk × n) = R (as
	 * (Rᵀ)ᵀ, ld d) · Xᵀ (d × n, ld d); bf16 products are exact in fp32. */
	if (cublasSetStream(e->blas, s) != CUBLAS_STATUS_SUCCESS)
		return -EIO;
	int rc = enc_correction(e, a->nmat, dk, d, s);
	if (rc)
		return rc;
	/* then x Cᵀ the same way, into bf16 (it is ~2^-9 of x', so bf16 is
	 * ample, and half the bytes of adding it into x' in fp32 in place);
	 * the packing adds it: x' + x Cᵀ = x Pᵀ */
	float one = 1.0f, zero = 0.0f;
	cublasStatus_t bs = cublasGemmStridedBatchedEx(
		e->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)dk, (int)a->n, (int)d, &one, e->rot,
		CUDA_R_16BF, (int)d, (long long)dk * d, a->x, CUDA_R_16BF, (int)d,
		(long long)a->n * d, &zero, e->xr, CUDA_R_32F, (int)dk, (long long)a->n * dk,
		(int)a->nmat, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (bs == CUBLAS_STATUS_SUCCESS)
		bs = cublasGemmStridedBatchedEx(
			e->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)dk, (int)a->n, (int)d, &one, e->cb,
			CUDA_R_16BF, (int)d, (long long)dk * d, a->x, CUDA_R_16BF, (int)d,
			(long long)a->n * d, &zero, e->xc, CUDA_R_16BF, (int)dk,
			(long long)a->n * dk, (int)a->nmat, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
	if (bs != CUBLAS_STATUS_SUCCESS)
		return bs == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : -EIO;
	/* jobs by value, PACK_JOBS a launch */
	for (uint32_t m0 = 0; m0 < a->nmat; m0 += PACK_JOBS) {
		uint32_t nj = a->nmat - m0 < PACK_JOBS ? a->nmat - m0 : PACK_JOBS;
		struct pack_jobs pj;
		memset(&pj, 0, sizeof pj);
		for (uint32_t i = 0; i < nj; i++)
			enc_job(e, a, p, m0 + i, &pj.j[i]);
		dim3 grid((p.nb + 3) / 4, nj);
		if (a->g == 1 && dk <= 96)
			k_pack_rot<true, 3><<<grid, 128, 0, s>>>(pj);
		else if (a->g == 1)
			k_pack_rot<true, 4><<<grid, 128, 0, s>>>(pj);
		else
			k_pack_rot<false, 4><<<grid, 128, 0, s>>>(pj);
		cudaError_t ce = cudaGetLastError();
		if (ce != cudaSuccess)
			return gpu_errno(ce);
	}
	return 0;
}
