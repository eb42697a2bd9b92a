/* SPDX-License-Identifier: MIT */
/*
 * Synthetic device data for benchmarks and tests: filling gigabytes from
 * the host would cost more than the measurements.  Counter-based hashing,
 * so every element is independent of launch shape.
 */
#include "common.cuh"

__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* approximately N(0, 1): sum of four uniforms, centred and scaled */
__device__ __forceinline__ float gauss(uint64_t seed, uint64_t i)
{
	uint64_t a = mix64(seed ^ mix64(i)), b = mix64(a + 0x9e3779b97f4a7c15ull);
	float s = (float)(a & 0xffffffffu) + (float)(a >> 32) + (float)(b & 0xffffffffu) +
		  (float)(b >> 32);
	return (s * 2.3283064e-10f - 2.0f) * 1.7320508f;
}

__global__ void k_synth_bf16(uint16_t *p, uint64_t n, float scale, float offset, uint64_t seed)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		p[i] = f2bf_rn(offset + scale * gauss(seed, i));
}

__global__ void k_synth_minmax(uint16_t *mn, uint16_t *mx, uint64_t n, uint64_t seed)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		float a = gauss(seed, 2 * i), w = fabsf(gauss(seed, 2 * i + 1));
		mn[i] = f2bf_down(a);
		mx[i] = f2bf_up(a + w);
	}
}

__global__ void k_synth_bitmaps(uint32_t *bm, uint64_t nvec, uint32_t bw, uint32_t ngroups,
				uint32_t nbits, uint64_t seed)
{
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint32_t w[4] = {0, 0, 0, 0};
		uint64_t st = mix64(seed ^ mix64(i));
		for (uint32_t k = 0; k < nbits;) {
			st = mix64(st + 0x9e3779b97f4a7c15ull);
			uint32_t c = (uint32_t)((st >> 32) % ngroups);
			if (!(w[c >> 5] & (1u << (c & 31)))) {
				w[c >> 5] |= 1u << (c & 31);
				k++;
			}
		}
		for (uint32_t j = 0; j < bw; j++)
			bm[i * bw + j] = w[j];
	}
}

static unsigned grid_for(uint64_t n)
{
	uint64_t g = (n + 255) / 256;
	return (unsigned)(g > 65536 ? 65536 : (g ? g : 1));
}

int gpu_synth_bf16(uint16_t *p, uint64_t n, float scale, float offset, uint64_t seed,
		   cudaStream_t s)
{
	if (!p)
		return -EINVAL;
	k_synth_bf16<<<grid_for(n), 256, 0, s>>>(p, n, scale, offset, seed);
	GPU_CKL();
	return 0;
}

int gpu_synth_minmax(uint16_t *mn, uint16_t *mx, uint64_t n, uint64_t seed, cudaStream_t s)
{
	if (!mn || !mx)
		return -EINVAL;
	k_synth_minmax<<<grid_for(n), 256, 0, s>>>(mn, mx, n, seed);
	GPU_CKL();
	return 0;
}

int gpu_synth_bitmaps(uint32_t *bm, uint64_t nvec, uint32_t bw, uint32_t ngroups,
		      uint32_t nbits, uint64_t seed, cudaStream_t s)
{
	if (!bm || bw == 0 || bw > 4 || ngroups > 32 * bw || nbits > ngroups)
		return -EINVAL;
	k_synth_bitmaps<<<grid_for(nvec), 256, 0, s>>>(bm, nvec, bw, ngroups, nbits, seed);
	GPU_CKL();
	return 0;
}
