/* SPDX-License-Identifier: MIT */
/*
 * bench/kgather_probe.cu — the question behind gpu/NOTES.md's "scores
 * without K̂" (thirty-third session): does gathering a replicated q' table
 * at each K value's position, with V's expansion spread over all 32 lanes,
 * cost the shared-memory pipe and the issue slots less than today's
 * expansion of K and V rows into dense tiles, and than the positions'
 * scatter?  Three kernels over the same packed rows (the bench's format:
 * d_keep 96 rotated channels, r = 32 bf16 values a vector in rank order, a
 * 96-bit bitmap in 4 words, K's and V's value positions a byte each),
 * 16-token sub-blocks a warp, each staging (one load and one store a
 * 16-byte piece) the rows and what else it reads:
 *   expand  lanes 0-15 expand K row t, lanes 16-31 V row t, into
 *           [token][channel] bf16 tiles by the attention kernel's own
 *           expand_direct (gpu/expand.cuh: groups of 8 channels, a bit
 *           test, a predicated 16-bit load and a pointer step a channel,
 *           one 16-byte store a group), then read both
 *           tiles back by ldmatrix.x4 as the products would (the products
 *           themselves left out: this side is the cheaper one)
 *   gather  two lanes a K row, each over 16 of its values: the byte
 *           position, one 16-byte load of q' for the 4 heads from a table
 *           replicated 8 times ([channel][lane & 7]: a quarter warp meets 8
 *           bank groups whatever channels it asks for), 4 FMAs; one
 *           shfl_xor sums the halves; V's expansion over all 32 lanes (two
 *           lanes a row, 48 channels each) and its tile read back
 *   scatter the positions' path (the attention kernel's st_sub with POS,
 *           bench/attn's ours_pos): lanes 0-15 K row t, lanes 16-31 V row
 *           t, each zeroes its tile row and stores its 32 values at their
 *           positions (16-bit stores), both tiles read back; added in the
 *           thirty-fourth session, since the gather needs K positions and
 *           so competes with this path, not with the expansion
 * Checks: the XOR of every tile word read back against the host's
 * expansion of the same rows (exact; the scatter's tiles are the
 * expansion's), and the gathered scores against the host's in double
 * (relative to |score| + mean |score|, 1e-5).  Times:
 * median of REPS launches by events, a persistent grid (SMs × CTAS).
 * For ncu: `ncu --kernel-name regex:'^k_(expand|gather|scatter)$' --metrics
 * smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,
 * l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,gpu__time_duration.sum`.
 * The kernels take the same shared memory a CTA (the table's 12 KB
 * included), so they run at the same occupancy (4 CTAs an SM at ~53 KB;
 * the attention kernel's small layout runs 5): the probe compares the
 * work a sub-block, not what the table would cost in CTAs.
 * Built by meson as build/bench/kgather_probe (CUDA builds), or alone:
 * nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Igpu
 * bench/kgather_probe.cu -o kgather_probe; run `kgather_probe [blocks]`.
 * Written without a GPU (thirty-third session; the scatter in the
 * thirty-fourth, not yet run): every CUDA call checked, and every check
 * runs before any time is printed.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include <cuda_runtime.h>
#include "expand.cuh" /* gpu/: the expansion attn.cu runs */

#define CK(x)                                                                     \
	do {                                                                      \
		cudaError_t e_ = (x);                                             \
		if (e_ != cudaSuccess) {                                          \
			fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, \
				cudaGetErrorString(e_));                          \
			exit(1);                                                  \
		}                                                                 \
	} while (0)

enum { DK = 96, R = 32, NQ = 4, TOK = 16, WARPS = 4, CTAS = 5, REPS = 20 };
enum { ROWB = 2 * R, BMB = 16, POSB = R, LD = 104 /* tile row: 96 + 8 halves */ };

/* A sub-block's rows in global memory: K rows, V rows, K bitmaps, V
 * bitmaps, K positions, each 16 rows in a row (so a warp's copy is
 * coalesced). */
struct sub {
	uint4 krow[TOK * ROWB / 16], vrow[TOK * ROWB / 16];
	uint4 kbm[TOK], vbm[TOK];
	uint4 kpos[TOK * POSB / 16];
	uint4 vpos[TOK * POSB / 16]; /* the scatter's (the positions' path) */
};

struct warp_smem {
	struct sub st;
	__align__(16) uint16_t kt[TOK * LD], vt[TOK * LD];
};

struct cta_smem {
	float4 qtab[DK * 8]; /* the gather's table: [c][j] = q' of 4 heads */
	struct warp_smem w[WARPS];
};

/* Which parts of a sub-block a kernel stages: the rows (always), the
 * bitmaps, K's and V's positions. */
enum { ST_BM = 1, ST_KPOS = 2, ST_VPOS = 4 };

/* Piece @q (16 bytes) of a sub-block: whether a kernel staging @parts
 * reads it. */
__host__ __device__ constexpr bool staged(int q, int parts)
{
	return q < (int)(offsetof(struct sub, kbm) / 16) ||
	       (q < (int)(offsetof(struct sub, kpos) / 16) ? (parts & ST_BM) != 0
	       : q < (int)(offsetof(struct sub, vpos) / 16) ? (parts & ST_KPOS) != 0
							     : (parts & ST_VPOS) != 0);
}

/* The warp's copy of sub-block @s into its stage, the pieces @parts names
 * (every kernel alike: all loads, then all stores). */
template <int PARTS>
__device__ __forceinline__ void stage(const struct sub *s, struct sub &st, int lane)
{
	const uint4 *g = (const uint4 *)s;
	uint4 *d = (uint4 *)&st;
	constexpr int N = (int)(sizeof(struct sub) / 16);
	uint4 v[(N + 31) / 32];
#pragma unroll
	for (int i = 0; i < (N + 31) / 32; i++)
		if (lane + 32 * i < N && staged(lane + 32 * i, PARTS))
			v[i] = __ldcs(g + lane + 32 * i);
	__syncwarp();
#pragma unroll
	for (int i = 0; i < (N + 31) / 32; i++)
		if (lane + 32 * i < N && staged(lane + 32 * i, PARTS))
			d[lane + 32 * i] = v[i];
	__syncwarp();
}

/* Group @gi (channels 8 gi .. 8 gi + 7) of a row (bitmap words @b, their
 * start indices @base; values at shared @src in rank order) to tile row
 * @dst: expand_group (gpu/expand.cuh) for a run-time @gi, whose word and
 * start are picked by selects (expand_group indexes its arrays by @gi,
 * which at run time would put them in local memory). */
__device__ __forceinline__ void group(uint32_t src, uint32_t dst, const uint32_t (&b)[3],
				      const uint32_t (&base)[3], int gi)
{
	const int wi = gi >> 2, sh = (gi & 3) * 8;
	const uint32_t wd = wi == 0 ? b[0] : wi == 1 ? b[1] : b[2];
	const uint32_t b0 = wi == 0 ? base[0] : wi == 1 ? base[1] : base[2];
	uint32_t p = src + 2 * (b0 + __popc(wd & ((1u << sh) - 1u)));
	uint32_t v[8];
#pragma unroll
	for (int e = 0; e < 8; e++)
		v[e] = take_bit(wd, 1u << (sh + e), p);
	sts128(dst + 16 * gi, __byte_perm(v[0], v[1], 0x5410), __byte_perm(v[2], v[3], 0x5410),
	       __byte_perm(v[4], v[5], 0x5410), __byte_perm(v[6], v[7], 0x5410));
}

/* Groups g0 .. g0 + NG - 1 of a row (bitmap @bm) from shared @src into
 * tile row @dst (the gather's V half rows). */
template <int NG>
__device__ __forceinline__ void expand_rt(const uint4 bm, uint32_t src, uint32_t dst, int g0)
{
	const uint32_t b[3] = {bm.x, bm.y, bm.z};
	const uint32_t base[3] = {0u, (uint32_t)__popc(b[0]), (uint32_t)(__popc(b[0]) + __popc(b[1]))};
#pragma unroll
	for (int j = 0; j < NG; j++)
		group(src, dst, b, base, g0 + j);
}

/* A tile's 16 rows × 96 channels read by ldmatrix.x4 as the products' A
 * operand would, XORed into @x. */
__device__ __forceinline__ uint32_t readback(const uint16_t *tile, int lane, uint32_t x)
{
	const int r = (lane & 7) + 8 * ((lane >> 3) & 1), c = 8 * (lane >> 4);
#pragma unroll
	for (int kc = 0; kc < DK / 16; kc++) {
		uint32_t a = (uint32_t)__cvta_generic_to_shared(tile + r * LD + 16 * kc + c), v0, v1,
			 v2, v3;
		asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
			     : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3)
			     : "r"(a));
		x ^= v0 ^ v1 ^ v2 ^ v3;
	}
	return x;
}

__device__ __forceinline__ void xor_out(uint32_t x, uint32_t *out)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		x ^= __shfl_xor_sync(0xffffffffu, x, o);
	if ((threadIdx.x & 31) == 0)
		atomicXor(out, x);
}

__global__ void __launch_bounds__(32 * WARPS, CTAS)
	k_expand(const struct sub *subs, uint32_t n, uint32_t *xout)
{
	extern __shared__ __align__(16) unsigned char raw[];
	struct cta_smem &sm = *(struct cta_smem *)raw;
	const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, t = lane & 15, kv = lane >> 4;
	struct warp_smem &W = sm.w[wi];
	uint32_t x = 0;
	for (uint32_t i = blockIdx.x * WARPS + wi; i < n; i += gridDim.x * WARPS) {
		stage<ST_BM>(subs + i, W.st, lane);
		const uint4 bm = kv ? W.st.vbm[t] : W.st.kbm[t];
		const uint16_t *row = (const uint16_t *)(kv ? W.st.vrow : W.st.krow) + t * R;
		const uint32_t b4[4] = {bm.x, bm.y, bm.z, bm.w};
		/* the attention kernel's own expansion (bits past d_keep clear) */
		expand_direct<DK / 8, true>((uint32_t)__cvta_generic_to_shared(row),
					    (uint32_t)__cvta_generic_to_shared((kv ? W.vt : W.kt) + t * LD),
					    b4, DK);
		__syncwarp();
		x = readback(W.kt, lane, x);
		x = readback(W.vt, lane, x);
		__syncwarp();
	}
	xor_out(x, xout);
}

__global__ void __launch_bounds__(32 * WARPS, CTAS)
	k_gather(const struct sub *subs, uint32_t n, const float *qp, float *scores, uint32_t *xout)
{
	extern __shared__ __align__(16) unsigned char raw[];
	struct cta_smem &sm = *(struct cta_smem *)raw;
	const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, t = lane & 15, half = lane >> 4;
	for (int i = threadIdx.x; i < DK * 8; i += blockDim.x) {
		const int c = i >> 3;
		sm.qtab[i] = make_float4(qp[c], qp[DK + c], qp[2 * DK + c], qp[3 * DK + c]);
	}
	__syncthreads();
	const uint32_t tab = (uint32_t)__cvta_generic_to_shared(sm.qtab) + 16u * (lane & 7);
	struct warp_smem &W = sm.w[wi];
	uint32_t x = 0;
	for (uint32_t i = blockIdx.x * WARPS + wi; i < n; i += gridDim.x * WARPS) {
		stage<ST_BM | ST_KPOS>(subs + i, W.st, lane);
		/* K: values [16 half, 16 half + 16) of row t */
		const uint4 P = W.st.kpos[(t * POSB + 16 * half) / 16];
		const uint4 v0 = W.st.krow[(t * ROWB + 32 * half) / 16];
		const uint4 v1 = W.st.krow[(t * ROWB + 32 * half) / 16 + 1];
		const uint32_t pw[4] = {P.x, P.y, P.z, P.w};
		const uint32_t vw[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
		float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
		for (int k = 0; k < 16; k++) {
			const uint32_t c = (pw[k >> 2] >> (8 * (k & 3))) & 0xffu;
			float4 q;
			asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];"
				     : "=f"(q.x), "=f"(q.y), "=f"(q.z), "=f"(q.w)
				     : "r"(tab + 128u * c));
			const uint32_t u = vw[k >> 1];
			const float v = __uint_as_float((k & 1) ? (u & 0xffff0000u) : (u << 16));
			s0 = fmaf(v, q.x, s0);
			s1 = fmaf(v, q.y, s1);
			s2 = fmaf(v, q.z, s2);
			s3 = fmaf(v, q.w, s3);
		}
		s0 += __shfl_xor_sync(0xffffffffu, s0, 16);
		s1 += __shfl_xor_sync(0xffffffffu, s1, 16);
		s2 += __shfl_xor_sync(0xffffffffu, s2, 16);
		s3 += __shfl_xor_sync(0xffffffffu, s3, 16);
		if (half == 0)
			__stcs((float4 *)scores + (size_t)i * TOK + t, make_float4(s0, s1, s2, s3));
		/* V: channels [48 half, 48 half + 48) of row t */
		const uint32_t trow = (uint32_t)__cvta_generic_to_shared(W.vt + t * LD);
		const uint16_t *row = (const uint16_t *)W.st.vrow + t * R;
		/* the same code in both halves (a branch on half would run the
		 * two one after the other) */
		expand_rt<DK / 16>(W.st.vbm[t], (uint32_t)__cvta_generic_to_shared(row), trow,
				   (DK / 16) * half);
		__syncwarp();
		x = readback(W.vt, lane, x);
		__syncwarp();
	}
	xor_out(x, xout);
}

/* The positions' path as the attention kernel runs it (st_sub with POS):
 * lane t of each half zeroes its tile row (K rows in lanes 0-15, V rows in
 * 16-31), then stores each of its 32 values at its position, 8 at a time:
 * a 16-byte load of 8 values and an 8-byte load of their positions, the
 * piece rotated by the row (t >> 1) so that a quarter warp's 16-byte loads
 * meet 8 bank groups (the kernel swizzles its stage to the same end);
 * both tiles read back as k_expand does.  Its tiles are k_expand's. */
__global__ void __launch_bounds__(32 * WARPS, CTAS)
	k_scatter(const struct sub *subs, uint32_t n, uint32_t *xout)
{
	extern __shared__ __align__(16) unsigned char raw[];
	struct cta_smem &sm = *(struct cta_smem *)raw;
	const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, t = lane & 15, kv = lane >> 4;
	struct warp_smem &W = sm.w[wi];
	const uint32_t trow = (uint32_t)__cvta_generic_to_shared((kv ? W.vt : W.kt) + t * LD);
	const uint32_t vrow = (uint32_t)__cvta_generic_to_shared(kv ? W.st.vrow : W.st.krow) +
			      t * ROWB;
	const uint32_t prow = (uint32_t)__cvta_generic_to_shared(kv ? W.st.vpos : W.st.kpos) +
			      t * POSB;
	uint32_t x = 0;
	for (uint32_t i = blockIdx.x * WARPS + wi; i < n; i += gridDim.x * WARPS) {
		stage<ST_KPOS | ST_VPOS>(subs + i, W.st, lane);
		uint4 v[R / 8];
		uint2 p[R / 8];
#pragma unroll
		for (int m = 0; m < R / 8; m++) {
			const uint32_t pc = (uint32_t)(m + (t >> 1)) & (R / 8 - 1);
			asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
				     : "=r"(v[m].x), "=r"(v[m].y), "=r"(v[m].z), "=r"(v[m].w)
				     : "r"(vrow + 16 * pc)
				     : "memory");
			asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];"
				     : "=r"(p[m].x), "=r"(p[m].y)
				     : "r"(prow + 8 * pc)
				     : "memory");
		}
#pragma unroll
		for (int gi = 0; gi < DK / 8; gi++)
			sts128(trow + 16 * gi, 0u, 0u, 0u, 0u);
#pragma unroll
		for (int m = 0; m < R / 8; m++) {
			const uint32_t vw[4] = {v[m].x, v[m].y, v[m].z, v[m].w};
#pragma unroll
			for (int e = 0; e < 8; e++) {
				const uint32_t c = __byte_perm(e < 4 ? p[m].x : p[m].y, 0u,
							       0x4440u + (e & 3));
				const uint32_t u = (e & 1) ? vw[e >> 1] >> 16 : vw[e >> 1];
				sts16(trow + 2 * c, u);
			}
		}
		__syncwarp();
		x = readback(W.kt, lane, x);
		x = readback(W.vt, lane, x);
		__syncwarp();
	}
	xor_out(x, xout);
}

/* ---- host ---- */

static uint64_t rng_s = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
	rng_s ^= rng_s << 13;
	rng_s ^= rng_s >> 7;
	rng_s ^= rng_s << 17;
	return (uint32_t)(rng_s >> 16);
}

static float bf2f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* One vector: R of DK channels (the bitmap), R bf16 values in rank
 * order, their positions. */
static void make_vec(uint32_t bm[4], uint16_t *vals, uint8_t *pos)
{
	uint8_t ch[DK];
	for (int c = 0; c < DK; c++)
		ch[c] = (uint8_t)c;
	for (int k = 0; k < R; k++) { /* the first R of a shuffle */
		int j = k + (int)(rnd() % (DK - k));
		std::swap(ch[k], ch[j]);
	}
	std::sort(ch, ch + R);
	memset(bm, 0, 16);
	for (int k = 0; k < R; k++) {
		bm[ch[k] >> 5] |= 1u << (ch[k] & 31);
		pos[k] = ch[k];
		/* bf16 of a value in about [-2, 2], never a NaN */
		vals[k] = (uint16_t)(0x3c00u + (rnd() % 0x0400u)) | (uint16_t)((rnd() & 1u) << 15);
	}
}

/* The XOR of a vector's expanded row, 48 words of channel pairs. */
static uint32_t row_xor(const uint32_t bm[4], const uint16_t *vals)
{
	uint16_t d[DK] = {0};
	for (int c = 0, k = 0; c < DK; c++)
		if (bm[c >> 5] >> (c & 31) & 1u)
			d[c] = vals[k++];
	uint32_t x = 0;
	for (int c = 0; c < DK; c += 2)
		x ^= (uint32_t)d[c] | (uint32_t)d[c + 1] << 16;
	return x;
}

static float median(std::vector<float> v)
{
	std::sort(v.begin(), v.end());
	return v[v.size() / 2];
}

int main(int argc, char **argv)
{
	/* default: the selected blocks of bench/attn's 1M tokens, batch 1
	 * (8 heads × 6,554 blocks of 16) */
	const uint32_t n = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 52432u;
	if (n == 0) {
		fprintf(stderr, "kgather_probe: blocks must be > 0\n");
		return 2;
	}
	int dev = 0, nsm = 0;
	CK(cudaSetDevice(dev));
	CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
	std::vector<struct sub> hs(n);
	uint32_t x_exp = 0, x_v = 0;
	std::vector<float> q(NQ * DK);
	for (auto &v : q)
		v = (float)((int)(rnd() % 2001) - 1000) / 1000.0f;
	std::vector<double> ref((size_t)n * TOK * NQ);
	for (uint32_t i = 0; i < n; i++) {
		struct sub &s = hs[i];
		for (int t = 0; t < TOK; t++) {
			uint32_t kb[4], vb[4];
			uint16_t *kr = (uint16_t *)s.krow + t * R, *vr = (uint16_t *)s.vrow + t * R;
			uint8_t *kp = (uint8_t *)s.kpos + t * POSB, *vp = (uint8_t *)s.vpos + t * POSB;
			make_vec(kb, kr, kp);
			make_vec(vb, vr, vp);
			memcpy(&s.kbm[t], kb, 16);
			memcpy(&s.vbm[t], vb, 16);
			uint32_t xk = row_xor(kb, kr), xv = row_xor(vb, vr);
			x_exp ^= xk ^ xv;
			x_v ^= xv;
			for (int h = 0; h < NQ; h++) {
				double a = 0.0;
				for (int k = 0; k < R; k++)
					a += (double)bf2f(kr[k]) * (double)q[h * DK + kp[k]];
				ref[((size_t)i * TOK + t) * NQ + h] = a;
			}
		}
	}
	struct sub *ds;
	float *dq, *dsc;
	uint32_t *dx;
	CK(cudaMalloc(&ds, sizeof(struct sub) * n));
	CK(cudaMalloc(&dq, sizeof(float) * NQ * DK));
	CK(cudaMalloc(&dsc, sizeof(float) * n * TOK * NQ));
	CK(cudaMalloc(&dx, 12));
	CK(cudaMemcpy(ds, hs.data(), sizeof(struct sub) * n, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dq, q.data(), sizeof(float) * NQ * DK, cudaMemcpyHostToDevice));
	const size_t smem = sizeof(struct cta_smem);
	CK(cudaFuncSetAttribute(k_expand, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	CK(cudaFuncSetAttribute(k_gather, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	CK(cudaFuncSetAttribute(k_scatter, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
	int oe = 0, og = 0, os = 0;
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&oe, k_expand, 32 * WARPS, smem));
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&og, k_gather, 32 * WARPS, smem));
	CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&os, k_scatter, 32 * WARPS, smem));
	const int occ = std::min(std::min(oe, og), os);
	if (occ < 1) {
		fprintf(stderr, "kgather_probe: no CTA fits (%zu bytes of shared memory)\n", smem);
		return 1;
	}
	const uint32_t grid = (uint32_t)(nsm * occ);

	/* the checks first */
	CK(cudaMemset(dx, 0, 12));
	k_expand<<<grid, 32 * WARPS, smem>>>(ds, n, dx);
	CK(cudaGetLastError());
	k_gather<<<grid, 32 * WARPS, smem>>>(ds, n, dq, dsc, dx + 1);
	CK(cudaGetLastError());
	k_scatter<<<grid, 32 * WARPS, smem>>>(ds, n, dx + 2);
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
	uint32_t hx[3];
	CK(cudaMemcpy(hx, dx, 12, cudaMemcpyDeviceToHost));
	std::vector<float> sc((size_t)n * TOK * NQ);
	CK(cudaMemcpy(sc.data(), dsc, sizeof(float) * sc.size(), cudaMemcpyDeviceToHost));
	double mean = 0.0, worst = 0.0;
	for (double v : ref)
		mean += fabs(v);
	mean /= (double)ref.size();
	for (size_t i = 0; i < ref.size(); i++)
		worst = std::max(worst, fabs((double)sc[i] - ref[i]) / (fabs(ref[i]) + mean));
	int bad = 0;
	if (hx[0] != x_exp) {
		fprintf(stderr, "expand: tiles' XOR %08x, host %08x\n", hx[0], x_exp);
		bad = 1;
	}
	if (hx[2] != x_exp) {
		fprintf(stderr, "scatter: tiles' XOR %08x, host %08x\n", hx[2], x_exp);
		bad = 1;
	}
	if (hx[1] != x_v) {
		fprintf(stderr, "gather: V tiles' XOR %08x, host %08x\n", hx[1], x_v);
		bad = 1;
	}
	if (!(worst < 1e-5)) {
		fprintf(stderr, "gather: scores' worst relative error %g\n", worst);
		bad = 1;
	}
	if (bad)
		return 1;

	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	std::vector<float> te, tg, ts;
	for (int rep = 0; rep < REPS; rep++) {
		float ms;
		CK(cudaEventRecord(e0));
		k_expand<<<grid, 32 * WARPS, smem>>>(ds, n, dx);
		CK(cudaEventRecord(e1));
		CK(cudaEventSynchronize(e1));
		CK(cudaEventElapsedTime(&ms, e0, e1));
		te.push_back(ms * 1e3f);
		CK(cudaEventRecord(e0));
		k_gather<<<grid, 32 * WARPS, smem>>>(ds, n, dq, dsc, dx + 1);
		CK(cudaEventRecord(e1));
		CK(cudaEventSynchronize(e1));
		CK(cudaEventElapsedTime(&ms, e0, e1));
		tg.push_back(ms * 1e3f);
		CK(cudaEventRecord(e0));
		k_scatter<<<grid, 32 * WARPS, smem>>>(ds, n, dx + 2);
		CK(cudaEventRecord(e1));
		CK(cudaEventSynchronize(e1));
		CK(cudaEventElapsedTime(&ms, e0, e1));
		ts.push_back(ms * 1e3f);
	}
	const float me = median(te), mg = median(tg), msc = median(ts);
	printf("kgather_probe: %u sub-blocks of %d tokens (K and V rows: r = %d of %d bf16), "
	       "grid %u (%d a SM), %zu bytes of shared memory a CTA\n",
	       n, TOK, R, DK, grid, occ, smem);
	printf("checks: tile XORs equal the host's, scores' worst relative error %.2e\n", worst);
	printf("expand %.1f us, gather %.1f us, scatter %.1f us (median of %d)\n", me, mg, msc,
	       REPS);
	printf("RESULT name=kgather_probe blocks=%u expand_us=%.1f gather_us=%.1f scatter_us=%.1f "
	       "gather_over_expand=%.3f gather_over_scatter=%.3f\n",
	       n, me, mg, msc, mg / me, mg / msc);
	CK(cudaFree(ds));
	CK(cudaFree(dq));
	CK(cudaFree(dsc));
	CK(cudaFree(dx));
	return 0;
}
