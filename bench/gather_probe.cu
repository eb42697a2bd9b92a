/* SPDX-License-Identifier: MIT */
/*
 * bench/gather_probe.cu — how fast can the device read scattered pieces of
 * mapped pinned host memory?  Issue 3's gather moves ~2 MiB of selected
 * blocks per fetch; the warp-load kernel (gpu/gather.cu) tops out near
 * 34 GB/s there while the copy engine does ~44 GB/s on one 2 MiB copy.
 * This probe times, side by side on the same pieces:
 *   ce_one      one cudaMemcpyAsync of the same byte count (the yardstick)
 *   ce_64m      one 64 MiB copy (the link's large-copy rate)
 *   ld4         the warp-load kernel: 16 B per lane, 4 loads in flight
 *   ld8         the same with 8 loads in flight
 *   tma         Hopper bulk copies (cp.async.bulk) global->shared->global:
 *               one thread per piece issues a whole-piece read, so the
 *               reads leave the SM as a few large requests, not 16-B ones
 * Pieces: the store's layout, a selected block = values (1024 B) + bitmaps
 * (256 B) as two pieces ("split"), or both adjacent as one 1280-B piece
 * ("joined").  Standalone: nvcc -O3 -gencode=arch=compute_90,code=sm_90.
 * Prints medians and a RESULT line; every CUDA call checked.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include <sys/mman.h>
#include <time.h>
#include <cuda_runtime.h>

#define CK(x)                                                                     \
	do {                                                                      \
		cudaError_t e_ = (x);                                             \
		if (e_ != cudaSuccess) {                                          \
			fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, \
				cudaGetErrorString(e_));                          \
			exit(1);                                                  \
		}                                                                 \
	} while (0)

struct piece {
	const char *src; /* device view of mapped host memory */
	uint64_t dst, len;
};

template <int U>
__global__ void __launch_bounds__(256) k_ld(const piece *p, uint32_t n, char *dst)
{
	uint32_t w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
	uint32_t nw = (gridDim.x * blockDim.x) >> 5;
	for (uint32_t i = w; i < n; i += nw) {
		const uint4 *s = (const uint4 *)p[i].src;
		uint4 *d = (uint4 *)(dst + p[i].dst);
		uint64_t m = p[i].len / 16;
		for (uint64_t j = lane; j < m; j += 32 * U) {
			uint4 v[U];
#pragma unroll
			for (int u = 0; u < U; u++)
				if (j + 32 * u < m)
					v[u] = s[j + 32 * u];
#pragma unroll
			for (int u = 0; u < U; u++)
				if (j + 32 * u < m)
					d[j + 32 * u] = v[u];
		}
	}
}

/* ---- bulk copies (sm_90) ---- */
__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t *b, uint32_t count)
{
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void mbar_expect(uint64_t *b, uint32_t bytes)
{
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)),
		     "r"(bytes)
		     : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity)
{
	asm volatile("{\n"
		     ".reg .pred p;\n"
		     "W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
		     "@!p bra W;\n"
		     "}\n" ::"r"(smem_u32(b)),
		     "r"(parity)
		     : "memory");
}
__device__ __forceinline__ void bulk_g2s(void *sm, const void *g, uint32_t bytes, uint64_t *b)
{
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
		     "%2, [%3];" ::"r"(smem_u32(sm)),
		     "l"(g), "r"(bytes), "r"(smem_u32(b))
		     : "memory");
}
__device__ __forceinline__ void bulk_s2g(void *g, const void *sm, uint32_t bytes)
{
	asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(g),
		     "r"(smem_u32(sm)), "r"(bytes)
		     : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read()
{
	asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

/* One thread per warp drives NS slots of SLOT bytes: reads up to NS
 * pieces ahead, writes each back out as soon as it has landed.  Pieces
 * longer than SLOT are cut into SLOT-sized parts. */
#define SLOT 2048
#define NS 8
#define TMA_WARPS 4
__global__ void __launch_bounds__(TMA_WARPS * 32) k_tma(const piece *p, uint32_t n, char *dst)
{
	extern __shared__ __align__(128) char sm[];
	__shared__ __align__(8) uint64_t bar[TMA_WARPS][NS];
	uint32_t wi = threadIdx.x >> 5, lane = threadIdx.x & 31;
	char *buf = sm + (size_t)wi * NS * SLOT;
	if (lane == 0)
		for (int s = 0; s < NS; s++)
			mbar_init(&bar[wi][s], 1);
	asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
	__syncwarp();
	if (lane != 0)
		return;
	uint32_t gw = blockIdx.x * TMA_WARPS + wi, nw = gridDim.x * TMA_WARPS;
	/* The warp's parts: pieces gw, gw+nw, ..., each cut into SLOT parts. */
	struct part {
		const char *s;
		char *d;
		uint32_t len;
	};
	uint32_t pi = gw;
	uint64_t off = 0;
	auto next = [&](part &x) -> bool {
		while (pi < n && off >= p[pi].len) {
			pi += nw;
			off = 0;
		}
		if (pi >= n)
			return false;
		uint64_t l = p[pi].len - off;
		x.len = (uint32_t)(l < SLOT ? l : SLOT);
		x.s = p[pi].src + off;
		x.d = dst + p[pi].dst + off;
		off += x.len;
		return true;
	};
	part q[NS];
	uint32_t phase[NS] = {0};
	int issued = 0, done = 0;
	bool more = true;
	/* prime */
	for (int s = 0; s < NS && more; s++) {
		if ((more = next(q[s]))) {
			mbar_expect(&bar[wi][s], q[s].len);
			bulk_g2s(buf + s * SLOT, q[s].s, q[s].len, &bar[wi][s]);
			issued++;
		}
	}
	while (done < issued) {
		int s = done % NS;
		mbar_wait(&bar[wi][s], phase[s]);
		phase[s] ^= 1;
		bulk_s2g(q[s].d, buf + s * SLOT, q[s].len);
		bulk_commit();
		done++;
		if (more && (more = next(q[s]))) {
			/* the slot is free once its write has read the shared copy */
			bulk_wait_read<0>();
			mbar_expect(&bar[wi][s], q[s].len);
			bulk_g2s(buf + s * SLOT, q[s].s, q[s].len, &bar[wi][s]);
			issued++;
		}
	}
	bulk_wait_read<0>();
	asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}


/* Streaming: the kernel runs while the host is still writing the table.
 * Warps claim pieces with an atomic counter and wait until the host has
 * published them (ctl[0] = pieces published, ctl[1] = closed). */
__device__ __forceinline__ uint32_t ld_acq_sys(const uint32_t *p)
{
	uint32_t v;
	asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}
__device__ __forceinline__ uint32_t ld_acq_gpu(const uint32_t *p)
{
	uint32_t v;
	asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
	return v;
}
__device__ __forceinline__ void st_rel_gpu(uint32_t *p, uint32_t v)
{
	asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/* dev[0] = claim counter, dev[1] = published (device copy), dev[2] = closed */
__global__ void __launch_bounds__(256) k_stream(const piece *p, const uint32_t *ctl,
						uint32_t *dev, char *dst)
{
	__shared__ volatile uint32_t s_pub, s_closed;
	uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	if (threadIdx.x == 0) {
		s_pub = 0;
		s_closed = 0;
	}
	__syncthreads();
	if (warp == 0) {
		if (lane)
			return;
		uint32_t last = 0;
		for (;;) {
			uint32_t pub, cl;
			if (blockIdx.x == 0) {
				/* the one reader of host memory */
				cl = ld_acq_sys(ctl + 1);
				pub = ld_acq_sys(ctl);
				if (pub != last)
					st_rel_gpu(dev + 1, pub);
				if (cl)
					st_rel_gpu(dev + 2, 1);
			} else {
				cl = ld_acq_gpu(dev + 2);
				pub = ld_acq_gpu(dev + 1);
			}
			if (pub != last) {
				s_pub = pub;
				last = pub;
			}
			if (cl) {
				s_closed = 1;
				return;
			}
			if (blockIdx.x)
				__nanosleep(256);
		}
	}
	for (;;) {
		uint32_t i = 0;
		if (lane == 0)
			i = atomicAdd(dev, 1);
		i = __shfl_sync(0xffffffffu, i, 0);
		uint32_t ok = 0;
		if (lane == 0) {
			for (;;) {
				if (i < s_pub) {
					ok = 1;
					break;
				}
				if (s_closed) {
					ok = i < s_pub;
					break;
				}
				__nanosleep(64);
			}
			asm volatile("fence.acq_rel.sys;" ::: "memory");
		}
		ok = __shfl_sync(0xffffffffu, ok, 0);
		if (!ok)
			return;
		uint64_t e = 0;
		if (lane < 3)
			asm volatile("ld.relaxed.sys.global.u64 %0, [%1];"
				     : "=l"(e)
				     : "l"((const uint64_t *)(p + i) + lane)
				     : "memory");
		const uint4 *sp = (const uint4 *)__shfl_sync(0xffffffffu, e, 0);
		uint64_t off = __shfl_sync(0xffffffffu, e, 1);
		uint64_t len = __shfl_sync(0xffffffffu, e, 2);
		uint4 *d = (uint4 *)(dst + off);
		uint64_t m = len / 16;
		for (uint64_t j = lane; j < m; j += 32 * 8) {
			uint4 v[8];
#pragma unroll
			for (int u = 0; u < 8; u++)
				if (j + 32 * u < m)
					v[u] = sp[j + 32 * u];
#pragma unroll
			for (int u = 0; u < 8; u++)
				if (j + 32 * u < m)
					d[j + 32 * u] = v[u];
		}
	}
}


/* Blocks by value: the kernel's whole work list travels in its
 * parameters (no table read over the link before the data). */
#define PMAXSEG 64
#define PMAXBLK 2048
struct pargs {
	const char *src[PMAXSEG]; /* segment base, device view */
	uint32_t first[PMAXSEG + 1];
	uint32_t nseg, vblk, bblk, nblk_seg;
	uint16_t blk[PMAXBLK];
};
__global__ void __launch_bounds__(256) k_param(const __grid_constant__ pargs a, char *dst)
{
	uint32_t w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
	uint32_t nw = (gridDim.x * blockDim.x) >> 5, n = a.first[a.nseg];
	for (uint32_t k = w; k < n; k += nw) {
		uint32_t lo = 0, hi = a.nseg - 1;
		while (lo < hi) {
			uint32_t mid = (lo + hi + 1) >> 1;
			if (a.first[mid] <= k)
				lo = mid;
			else
				hi = mid - 1;
		}
		uint32_t j = a.blk[k];
		uint64_t at = (uint64_t)k * (a.vblk + a.bblk);
		const uint4 *sv = (const uint4 *)(a.src[lo] + (size_t)j * a.vblk);
		const uint4 *sb = (const uint4 *)(a.src[lo] + (size_t)a.nblk_seg * a.vblk + (size_t)j * a.bblk);
		uint4 *dv = (uint4 *)(dst + at), *db = (uint4 *)(dst + at + a.vblk);
		uint32_t mv = a.vblk / 16, mb = a.bblk / 16;
		/* both pieces' loads in flight together */
		uint4 v[4], b[2];
#pragma unroll
		for (int u = 0; u < 4; u++)
			if (lane + 32 * u < mv)
				v[u] = sv[lane + 32 * u];
#pragma unroll
		for (int u = 0; u < 2; u++)
			if (lane + 32 * u < mb)
				b[u] = sb[lane + 32 * u];
#pragma unroll
		for (int u = 0; u < 4; u++)
			if (lane + 32 * u < mv)
				dv[lane + 32 * u] = v[u];
#pragma unroll
		for (int u = 0; u < 2; u++)
			if (lane + 32 * u < mb)
				db[lane + 32 * u] = b[u];
	}
}

/* Simulated bookkeeping: @it rounds of a dependent LCG. */
static volatile uint32_t sink;
static inline void work(uint32_t it)
{
	uint32_t x = sink;
	for (uint32_t k = 0; k < it; k++)
		x = x * 1664525u + 1013904223u;
	sink = x;
}

static inline void spin_ns(double ns)
{
	if (ns <= 0)
		return;
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	do
		clock_gettime(CLOCK_MONOTONIC, &b);
	while ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec) < ns);
}

static double wall_us(struct timespec a, struct timespec b)
{
	return (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) * 1e-3;
}

static double now_us_events(cudaEvent_t a, cudaEvent_t b)
{
	float ms;
	CK(cudaEventElapsedTime(&ms, a, b));
	return ms * 1e3;
}

int main(int argc, char **argv)
{
	int steps = argc > 1 ? atoi(argv[1]) : 40;
	cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	CK(cudaSetDevice(0));
	/* 64 segments x 4096 tokens, per block 1024 B values + 256 B bitmaps,
	 * K and V: 128 segments' worth of blocks of 1280 B, laid out as the
	 * host tier holds them (values region then bitmaps region). */
	const uint32_t nseg = argc > 2 ? (uint32_t)atoi(argv[2]) : 128, nblk = 256, sel = 26, vb = 1024, bb = 256;
	size_t seg_bytes = (size_t)nblk * (vb + bb);
	size_t host_bytes = nseg * seg_bytes;
	/* argv[3]: how the host bytes are pinned: alloc (cudaHostAlloc),
	 * reg4k (mmap, no huge pages, cudaHostRegister: the host tier's way
	 * without THP), regthp (the same with MADV_HUGEPAGE) */
	const char *mode = argc > 3 ? argv[3] : "alloc";
	char *h;
	if (!strcmp(mode, "alloc")) {
		CK(cudaHostAlloc((void **)&h, host_bytes, cudaHostAllocMapped));
	} else {
		size_t al = (host_bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
		char *m = (char *)mmap(NULL, al + (2u << 20), PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return 1;
		h = (char *)(((uintptr_t)m + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1));
		madvise(h, al, !strcmp(mode, "regthp") ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
		CK(cudaHostRegister(h, al, cudaHostRegisterMapped));
	}
	for (size_t i = 0; i < host_bytes; i++)
		h[i] = (char)(i * 2654435761u >> 13);
	char *hd;
	CK(cudaHostGetDevicePointer((void **)&hd, h, 0));
	size_t total = (size_t)nseg * sel * (vb + bb);
	char *d, *big_d, *big_h;
	CK(cudaMalloc(&d, total + 4096));
	CK(cudaMalloc(&big_d, 64u << 20));
	CK(cudaHostAlloc((void **)&big_h, 64u << 20, 0));
	memset(big_h, 1, 64u << 20);
	piece *tab_split, *tab_join;
	CK(cudaHostAlloc((void **)&tab_split, sizeof(piece) * nseg * sel * 2, cudaHostAllocMapped));
	CK(cudaHostAlloc((void **)&tab_join, sizeof(piece) * nseg * sel, cudaHostAllocMapped));
	piece *dtab_split, *dtab_join;
	CK(cudaMalloc(&dtab_split, sizeof(piece) * nseg * sel * 2));
	CK(cudaMalloc(&dtab_join, sizeof(piece) * nseg * sel));
	cudaStream_t st;
	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	size_t tma_smem = (size_t)TMA_WARPS * NS * SLOT;
	CK(cudaFuncSetAttribute(k_tma, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tma_smem));
	int tma_grid = 3 * prop.multiProcessorCount;
	srand(7);
	std::vector<double> t[16];
	const char *names[16] = {"ce_one", "ce_64m", "ld4_split", "ld8_split", "tma_split",
				 "ld4_join", "ld8_join", "tma_join", "wall_ce", "wall_ld8",
				 "wall_ld8_maptab", "book_then_ld8", "stream", "book8_then_ld8",
				 "stream_book8", "param_wall"};
	pargs *pa = new pargs;
	/* argv[4]: simulated bookkeeping, ns per piece (the store resolves
	 * a block, two pieces, in ~15 ns) */
	double book_ns = argc > 4 ? atof(argv[4]) : 8.0;
	piece *tab_stream, *dtab_stream;
	uint32_t *ctl, *dctl, *claim;
	CK(cudaHostAlloc((void **)&tab_stream, sizeof(piece) * nseg * sel * 2, cudaHostAllocMapped));
	CK(cudaHostGetDevicePointer((void **)&dtab_stream, tab_stream, 0));
	CK(cudaHostAlloc((void **)&ctl, 64, cudaHostAllocMapped));
	CK(cudaHostGetDevicePointer((void **)&dctl, ctl, 0));
	CK(cudaMalloc(&claim, 16));
	/* calibrate the simulated bookkeeping: iterations per ns */
	double it_per_ns;
	{
		struct timespec a, b;
		clock_gettime(CLOCK_MONOTONIC, &a);
		work(10000000);
		clock_gettime(CLOCK_MONOTONIC, &b);
		it_per_ns = 1e7 / (wall_us(a, b) * 1e3);
	}
	uint32_t book_it = (uint32_t)(book_ns * it_per_ns);
	int stream_grid = 2 * prop.multiProcessorCount;
	piece *htab_dev;
	CK(cudaHostGetDevicePointer((void **)&htab_dev, tab_split, 0));
	char *check = (char *)malloc(total);
	int bad = 0;
	for (int step = 0; step < steps; step++) {
		/* fresh random selection; joined pieces point at a layout where a
		 * block's values and bitmaps are adjacent (the same bytes count) */
		uint32_t ns = 0, nj = 0;
		uint64_t at = 0;
		for (uint32_t s = 0; s < nseg; s++) {
			std::vector<uint32_t> b(nblk);
			for (uint32_t i = 0; i < nblk; i++)
				b[i] = i;
			for (uint32_t i = 0; i < sel; i++)
				std::swap(b[i], b[i + rand() % (nblk - i)]);
			std::sort(b.begin(), b.begin() + sel);
			const char *base = hd + s * seg_bytes;
			for (uint32_t i = 0; i < sel; i++) {
				tab_split[ns++] = {base + (size_t)b[i] * vb, at, vb};
				tab_split[ns++] = {base + (size_t)nblk * vb + (size_t)b[i] * bb, at + vb, bb};
				tab_join[nj++] = {base + (size_t)b[i] * (vb + bb), at, vb + bb};
				at += vb + bb;
			}
		}
		CK(cudaMemcpyAsync(dtab_split, tab_split, sizeof(piece) * ns, cudaMemcpyHostToDevice, st));
		CK(cudaMemcpyAsync(dtab_join, tab_join, sizeof(piece) * nj, cudaMemcpyHostToDevice, st));
		CK(cudaStreamSynchronize(st));
		for (int v = 0; v < 8; v++) {
			CK(cudaMemsetAsync(d, 0, total, st));
			CK(cudaEventRecord(e0, st));
			switch (v) {
			case 0:
				CK(cudaMemcpyAsync(d, big_h, total, cudaMemcpyHostToDevice, st));
				break;
			case 1:
				CK(cudaMemcpyAsync(big_d, big_h, 64u << 20, cudaMemcpyHostToDevice, st));
				break;
			case 2:
				k_ld<4><<<(ns + 7) / 8, 256, 0, st>>>(dtab_split, ns, d);
				break;
			case 3:
				k_ld<8><<<(ns + 7) / 8, 256, 0, st>>>(dtab_split, ns, d);
				break;
			case 4:
				k_tma<<<tma_grid, TMA_WARPS * 32, tma_smem, st>>>(dtab_split, ns, d);
				break;
			case 5:
				k_ld<4><<<(nj + 7) / 8, 256, 0, st>>>(dtab_join, nj, d);
				break;
			case 6:
				k_ld<8><<<(nj + 7) / 8, 256, 0, st>>>(dtab_join, nj, d);
				break;
			case 7:
				k_tma<<<tma_grid, TMA_WARPS * 32, tma_smem, st>>>(dtab_join, nj, d);
				break;
			}
			CK(cudaGetLastError());
			CK(cudaEventRecord(e1, st));
			CK(cudaStreamSynchronize(st));
			double us = now_us_events(e0, e1);
			t[v].push_back(v == 1 ? (64u << 20) / us / 1e3 : total / us / 1e3);
			/* verify the kernels' bytes against the pieces */
			if (v >= 2 && step < 3) {
				CK(cudaMemcpy(check, d, total, cudaMemcpyDeviceToHost));
				piece *tb = v < 5 ? tab_split : tab_join;
				uint32_t np = v < 5 ? ns : nj;
				for (uint32_t i = 0; i < np; i++)
					if (memcmp(check + tb[i].dst, h + (tb[i].src - hd), tb[i].len)) {
						bad++;
						break;
					}
			}
			if (v == 7) {
				/* wall clock, launch to completion seen by the host */
				struct timespec a, b;
				for (int w = 0; w < 3; w++) {
					CK(cudaStreamSynchronize(st));
					clock_gettime(CLOCK_MONOTONIC, &a);
					if (w == 0)
						CK(cudaMemcpyAsync(d, big_h, total, cudaMemcpyHostToDevice, st));
					else
						k_ld<8><<<(ns + 7) / 8, 256, 0, st>>>(w == 1 ? dtab_split : htab_dev, ns, d);
					CK(cudaGetLastError());
					CK(cudaStreamSynchronize(st));
					clock_gettime(CLOCK_MONOTONIC, &b);
					double wu = (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) * 1e-3;
					t[8 + w].push_back(total / wu / 1e3);
				}
			}
			if (v == 7) {
				/* bookkeeping then launch, against streaming, at 0 and
				 * book_ns per piece; checked like the others */
				for (int w = 0; w < 4; w++) {
					double bk = w < 2 ? 0.0 : book_ns;
					bool strm = w & 1;
					struct timespec a, b;
					CK(cudaMemsetAsync(d, 0, total, st));
					CK(cudaMemsetAsync(claim, 0, 16, st));
					CK(cudaStreamSynchronize(st));
					clock_gettime(CLOCK_MONOTONIC, &a);
					if (strm) {
						__atomic_store_n(&ctl[0], 0u, __ATOMIC_RELEASE);
						__atomic_store_n(&ctl[1], 0u, __ATOMIC_RELEASE);
						k_stream<<<stream_grid, 256, 0, st>>>(dtab_stream, dctl, claim, d);
						CK(cudaGetLastError());
					}
					for (uint32_t i = 0; i < ns; i++) {
						tab_stream[i] = tab_split[i];
						if (bk > 0)
							work(book_it);
						if (strm && (i & 63) == 63)
							__atomic_store_n(&ctl[0], i + 1, __ATOMIC_RELEASE);
					}
					if (strm) {
						__atomic_store_n(&ctl[0], ns, __ATOMIC_RELEASE);
						__atomic_store_n(&ctl[1], 1u, __ATOMIC_RELEASE);
					} else {
						k_ld<8><<<(ns + 7) / 8, 256, 0, st>>>(dtab_stream, ns, d);
						CK(cudaGetLastError());
					}
					CK(cudaStreamSynchronize(st));
					clock_gettime(CLOCK_MONOTONIC, &b);
					t[11 + w].push_back(total / wall_us(a, b) / 1e3);
					if (step < 3) {
						CK(cudaMemcpy(check, d, total, cudaMemcpyDeviceToHost));
						for (uint32_t i = 0; i < ns; i++)
							if (memcmp(check + tab_split[i].dst,
								   h + (tab_split[i].src - hd), tab_split[i].len)) {
								bad++;
								break;
							}
					}
				}
				if (nseg <= PMAXSEG && nseg * sel <= PMAXBLK) {
					struct timespec a, b;
					CK(cudaMemsetAsync(d, 0, total, st));
					CK(cudaStreamSynchronize(st));
					clock_gettime(CLOCK_MONOTONIC, &a);
					/* build the arguments from the selection (the
					 * split table holds it: values piece per block) */
					pa->nseg = nseg;
					pa->vblk = vb;
					pa->bblk = bb;
					pa->nblk_seg = nblk;
					for (uint32_t s2 = 0; s2 < nseg; s2++) {
						pa->src[s2] = hd + s2 * seg_bytes;
						pa->first[s2] = s2 * sel;
						for (uint32_t i = 0; i < sel; i++)
							pa->blk[s2 * sel + i] = (uint16_t)((tab_split[2 * (s2 * sel + i)].src - pa->src[s2]) / vb);
					}
					pa->first[nseg] = nseg * sel;
					k_param<<<(nseg * sel + 7) / 8, 256, 0, st>>>(*pa, d);
					CK(cudaGetLastError());
					CK(cudaStreamSynchronize(st));
					clock_gettime(CLOCK_MONOTONIC, &b);
					t[15].push_back(total / wall_us(a, b) / 1e3);
					if (step < 3) {
						CK(cudaMemcpy(check, d, total, cudaMemcpyDeviceToHost));
						for (uint32_t i = 0; i < ns; i++)
							if (memcmp(check + tab_split[i].dst,
								   h + (tab_split[i].src - hd), tab_split[i].len)) {
								bad++;
								break;
							}
					}
				} else {
					t[15].push_back(0);
				}
			}
		}
	}
	printf("gather_probe on %s: %zu bytes per fetch (%u split pieces / %u joined), %d steps, "
	       "medians in GB/s\n",
	       prop.name, total, nseg * sel * 2, nseg * sel, steps);
	double med[16];
	for (int v = 0; v < 16; v++) {
		std::sort(t[v].begin(), t[v].end());
		med[v] = t[v][t[v].size() / 2];
		printf("  %-10s %7.2f GB/s  %.3fx ce_one\n", names[v], med[v], med[v] / med[0]);
	}
	printf("verify: %d mismatching runs\n", bad);
	printf("RESULT name=gather_probe ce_one=%.2f ce_64m=%.2f ld4_split=%.2f ld8_split=%.2f "
	       "tma_split=%.2f ld4_join=%.2f ld8_join=%.2f tma_join=%.2f wall_ce=%.2f wall_ld8=%.2f wall_ld8_maptab=%.2f book_then_ld8=%.2f stream=%.2f book%g_then_ld8=%.2f stream_book%g=%.2f param_wall=%.2f mode=%s bad=%d\n",
	       med[0], med[1], med[2], med[3], med[4], med[5], med[6], med[7], med[8], med[9],
	       med[10], med[11], med[12], book_ns, med[13], book_ns, med[14], med[15], mode, bad);
	return bad != 0;
}
