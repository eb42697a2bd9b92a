/* SPDX-License-Identifier: MIT */
/* Internal helpers shared by the .cu files of gpu/ (C++ only). */
#ifndef MKV_GPU_COMMON_CUH
#define MKV_GPU_COMMON_CUH

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <cuda_runtime.h>
#include <mosaickv/common.h>
#include "gpu.cuh"

/* A CUDA error as a negative errno.  Never aborts, never prints. */
static inline int gpu_errno(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return -ENOMEM;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorInvalidDevice:
		return -MKV_ENODEV;
	case cudaErrorInvalidValue:
		return -EINVAL;
	default:
		return -EIO;
	}
}

/* Check a CUDA call; return its errno from the enclosing function. */
#define GPU_CK(call)                                  \
	do {                                          \
		cudaError_t e_ = (call);              \
		if (e_ != cudaSuccess)                \
			return gpu_errno(e_);         \
	} while (0)
/* Check the last error after a launch. */
#define GPU_CKL() GPU_CK(cudaGetLastError())

/*
 * Programmatic dependent launch (sm_90): a kernel of a step's chain lets
 * its successor be scheduled once all of its CTAs have started
 * (pdl_begin's trigger), and waits for its predecessor's completion and
 * memory before touching anything (pdl_begin's wait): the successor's
 * launch and CTA start-up overlap the predecessor's last wave instead of
 * following it.  Every CTA waits before its first access, early exits
 * included, so a chain's completion implies its predecessors'.  Without
 * the launch attribute (gpu_launch with pdl false) both are no-ops.
 */
__device__ __forceinline__ void pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_begin(void)
{
	pdl_trigger();
	pdl_wait();
}

/* Launch @k with programmatic stream serialization when @pdl (see
 * pdl_begin), else as <<<>>> does. */
template <typename... K, typename... A>
static cudaError_t gpu_launch(bool pdl, void (*k)(K...), dim3 g, dim3 b, size_t smem,
			      cudaStream_t s, A... args)
{
	if (!pdl) {
		k<<<g, b, smem, s>>>(args...);
		return cudaGetLastError();
	}
	cudaLaunchConfig_t c;
	memset(&c, 0, sizeof c);
	c.gridDim = g;
	c.blockDim = b;
	c.dynamicSmemBytes = smem;
	c.stream = s;
	cudaLaunchAttribute at;
	memset(&at, 0, sizeof at);
	at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
	at.val.programmaticStreamSerializationAllowed = 1;
	c.attrs = &at;
	c.numAttrs = 1;
	return cudaLaunchKernelEx(&c, k, static_cast<K>(args)...);
}

#define LOG2E 1.4426950408889634f

/* Index of the last of @n >= 1 elements, ascending in @key with the first
 * one <= @x, whose @key is <= @x: the segment holding block (or id) @x. */
template <class T, class K>
__host__ __device__ inline uint32_t last_le(const T *a, uint32_t n, K T::*key, K x)
{
	uint32_t lo = 0, hi = n - 1;
	while (lo < hi) {
		uint32_t mid = (lo + hi + 1) >> 1;
		if (a[mid].*key <= x)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf1(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* Nearest-even float -> bf16 (finite inputs), and outward roundings. */
__device__ __forceinline__ uint16_t f2bf_rn(float f)
{
	uint32_t u = __float_as_uint(f);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}
__device__ __forceinline__ uint16_t f2bf_down(float f)
{
	uint32_t u = __float_as_uint(f);
	uint16_t h = (uint16_t)(u >> 16);
	if ((u & 0xffffu) && (u & 0x80000000u))
		h++;
	return h;
}
__device__ __forceinline__ uint16_t f2bf_up(float f)
{
	uint32_t u = __float_as_uint(f);
	uint16_t h = (uint16_t)(u >> 16);
	if ((u & 0xffffu) && !(u & 0x80000000u))
		h++;
	return h;
}

__device__ __forceinline__ void unpack8(const uint4 &w, float *x)
{
	x[0] = bf_lo(w.x); x[1] = bf_hi(w.x);
	x[2] = bf_lo(w.y); x[3] = bf_hi(w.y);
	x[4] = bf_lo(w.z); x[5] = bf_hi(w.z);
	x[6] = bf_lo(w.w); x[7] = bf_hi(w.w);
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}
__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* Inclusive prefix sum over the warp's lanes (all 32 lanes call it). */
__device__ __forceinline__ uint32_t warp_incl_scan(uint32_t v)
{
	uint32_t lane = threadIdx.x & 31;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		uint32_t y = __shfl_up_sync(0xffffffffu, v, o);
		if (lane >= (uint32_t)o)
			v += y;
	}
	return v;
}

/* Block-wide exclusive scan of one uint32 per thread (blockDim.x a multiple
 * of 32, at most 1024).  @sh: 33 words of shared memory.  Returns the
 * exclusive prefix; *total gets the block sum.  Contains barriers. */
__device__ __forceinline__ uint32_t block_excl_scan(uint32_t v, uint32_t *sh,
						    uint32_t *total)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	uint32_t x = v;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		uint32_t y = __shfl_up_sync(0xffffffffu, x, o);
		if (lane >= o)
			x += y;
	}
	if (lane == 31)
		sh[w] = x;
	__syncthreads();
	if (w == 0) {
		uint32_t s = lane < nw ? sh[lane] : 0, t = s;
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			uint32_t y = __shfl_up_sync(0xffffffffu, t, o);
			if (lane >= o)
				t += y;
		}
		if (lane < nw)
			sh[lane] = t - s;
		if (lane == 31)
			sh[32] = t;
	}
	__syncthreads();
	uint32_t r = sh[w] + x - v;
	*total = sh[32];
	__syncthreads();
	return r;
}

#endif
