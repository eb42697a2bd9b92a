/* SPDX-License-Identifier: MIT */
/*
 * gpu/gather.cu — many small pieces into one device buffer in one launch.
 *
 * Work split: a warp copies one span (up to GATHER_SPAN bytes) of one
 * piece; warps walk the pieces with a grid stride along x, and the spans of
 * a long piece along y (the launch sizes y from the longest piece, so
 * blocks of 1 KiB use one warp each and a 1 MiB piece 16).  Inside a span
 * the lanes read 16 bytes each, four loads in flight per lane before the
 * stores, which is what keeps enough reads outstanding over PCIe when the
 * source is mapped host memory (~55 GB/s × ~1.5 µs ≈ 80 KB in flight).
 * Pieces whose source and destination disagree modulo 16 fall back to
 * 4-byte or byte copies; unaligned heads and tails are copied bytewise.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>

#include "common.cuh"
#include "gather.cuh"

#define GATHER_SPAN (64u << 10) /* bytes per warp and piece, multiple of 16 */
#define GATHER_WARPS 8          /* warps per CTA */
#define GATHER_MAX_X 8192       /* CTAs along x (grid stride beyond) */
#define GATHER_MAX_Y 4096       /* spans along y (warp stride beyond) */

/* GPU_CK, also clearing a non-sticky error so that the caller's fallback
 * path does not trip over it. */
#define GATHER_CK(call)                                       \
	do {                                                  \
		cudaError_t e_ = (call);                      \
		if (e_ != cudaSuccess) {                      \
			(void)cudaGetLastError();             \
			return gpu_errno(e_);                 \
		}                                             \
	} while (0)

/* Copy @n elements of T, lane-strided, four loads in flight per lane. */
template <typename T>
__device__ __forceinline__ void copy_elems(T *__restrict__ d, const T *__restrict__ s,
					   uint64_t n, unsigned lane)
{
	/* All loads of a round before its stores, also in the partial last
	 * round: a 1 KiB block is 2 loads per lane, both in flight at once. */
	for (uint64_t i = lane; i < n; i += 128) {
		const bool h1 = i + 32 < n, h2 = i + 64 < n, h3 = i + 96 < n;
		T a = s[i], b, c, e;

		if (h1)
			b = s[i + 32];
		if (h2)
			c = s[i + 64];
		if (h3)
			e = s[i + 96];
		d[i] = a;
		if (h1)
			d[i + 32] = b;
		if (h2)
			d[i + 64] = c;
		if (h3)
			d[i + 96] = e;
	}
}

/* One span: @m bytes from @s to @d, T-wide where they agree modulo sizeof(T). */
template <typename T>
__device__ __forceinline__ void copy_span(char *d, const char *s, uint64_t m,
					  unsigned lane)
{
	const uint64_t w = sizeof(T);
	uint64_t head = (w - ((uintptr_t)d & (w - 1))) & (w - 1);

	if (head > m)
		head = m;
	if (lane < head)
		d[lane] = s[lane];
	d += head;
	s += head;
	m -= head;
	uint64_t nv = m / w;
	copy_elems<T>((T *)d, (const T *)s, nv, lane);
	uint64_t tail = m - nv * w;
	if (lane < tail)
		d[nv * w + lane] = s[nv * w + lane];
}

/* One span of any alignment (copy_span by what source and destination
 * agree on). */
__device__ __forceinline__ void copy_any(char *d, const char *s, uint64_t m,
					 unsigned lane)
{
	uintptr_t x = (uintptr_t)s ^ (uintptr_t)d;

	if (!(x & 15))
		copy_span<uint4>(d, s, m, lane);
	else if (!(x & 3))
		copy_span<uint32_t>(d, s, m, lane);
	else
		copy_span<uint8_t>(d, s, m, lane);
}

static __global__ void __launch_bounds__(GATHER_WARPS * 32)
gather_kernel(const struct gpu_piece *__restrict__ pieces, uint32_t n,
	      char *__restrict__ dst)
{
	const unsigned lane = threadIdx.x & 31;
	const uint64_t warp0 = (uint64_t)blockIdx.x * GATHER_WARPS + (threadIdx.x >> 5);
	const uint64_t wstride = (uint64_t)gridDim.x * GATHER_WARPS;

	for (uint64_t p = warp0; p < n; p += wstride) {
		const char *src = (const char *)pieces[p].src;
		const uint64_t len = pieces[p].len;
		char *d0 = dst + pieces[p].dst;

		for (uint64_t off = (uint64_t)blockIdx.y * GATHER_SPAN; off < len;
		     off += (uint64_t)gridDim.y * GATHER_SPAN) {
			uint64_t m = len - off < GATHER_SPAN ? len - off : GATHER_SPAN;
			copy_any(d0 + off, src + off, m, lane);
		}
	}
}

static int gather_launch(const struct gpu_piece *pieces, uint32_t n,
			 uint64_t max_len, void *dst, cudaStream_t s)
{
	uint64_t gx = ((uint64_t)n + GATHER_WARPS - 1) / GATHER_WARPS;
	uint64_t gy = (max_len + GATHER_SPAN - 1) / GATHER_SPAN;

	if (!n)
		return 0;
	if (gx > GATHER_MAX_X)
		gx = GATHER_MAX_X;
	if (gy < 1)
		gy = 1;
	if (gy > GATHER_MAX_Y)
		gy = GATHER_MAX_Y;
	gather_kernel<<<dim3((unsigned)gx, (unsigned)gy), GATHER_WARPS * 32, 0, s>>>(
		pieces, n, (char *)dst);
	GATHER_CK(cudaGetLastError());
	return 0;
}

extern "C" int gpu_gather(const struct gpu_piece *pieces, uint32_t n,
			  uint64_t max_len, void *dst, struct CUstream_st *s)
{
	if ((!pieces && n) || (!dst && n))
		return -EINVAL;
	return gather_launch(pieces, n, max_len, dst, (cudaStream_t)s);
}

extern "C" void gpu_gather_ref(const struct gpu_piece *pieces, uint32_t n,
			       void *dst)
{
	for (uint32_t i = 0; i < n; i++)
		memcpy((char *)dst + pieces[i].dst, pieces[i].src, pieces[i].len);
}

struct gpu_gather_ctx {
	int dev;
	int upload;   /* 1: copy the table to dev_tab first; 0: the kernel
		       * reads the pinned table in place (unified addressing) */
	uint32_t cap;
	struct gpu_piece *host; /* pinned */
	struct gpu_piece *dev_tab;
	cudaStream_t stream;
};

static void ctx_free_tables(struct gpu_gather_ctx *c)
{
	if (c->host)
		(void)cudaFreeHost(c->host);
	if (c->dev_tab)
		(void)cudaFree(c->dev_tab);
	c->host = NULL;
	c->dev_tab = NULL;
	c->cap = 0;
	(void)cudaGetLastError();
}

static int ctx_alloc_tables(struct gpu_gather_ctx *c, uint32_t cap)
{
	size_t bytes = (size_t)cap * sizeof(struct gpu_piece);

	ctx_free_tables(c);
	GATHER_CK(cudaMallocHost((void **)&c->host, bytes));
	GATHER_CK(cudaMalloc((void **)&c->dev_tab, bytes));
	c->cap = cap;
	return 0;
}

extern "C" int gpu_gather_ctx_create(int dev, uint32_t cap,
				     struct gpu_gather_ctx **out)
{
	struct gpu_gather_ctx *c;
	int rc;

	if (!out || dev < 0)
		return -EINVAL;
	GATHER_CK(cudaSetDevice(dev));
	c = (struct gpu_gather_ctx *)calloc(1, sizeof *c);
	if (!c)
		return -ENOMEM;
	c->dev = dev;
	{
		/* With unified addressing every pinned allocation is mapped
		 * at its host address: the kernel reads the table where it
		 * is, saving a copy and its latency on every run. */
		int ua = 0;

		if (cudaDeviceGetAttribute(&ua, cudaDevAttrUnifiedAddressing,
					   dev) != cudaSuccess) {
			(void)cudaGetLastError();
			ua = 0;
		}
		c->upload = !ua;
	}
	if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) {
		(void)cudaGetLastError();
		free(c);
		return -EIO;
	}
	rc = ctx_alloc_tables(c, cap ? cap : 256);
	if (rc) {
		gpu_gather_ctx_destroy(c);
		return rc;
	}
	*out = c;
	return 0;
}

extern "C" void gpu_gather_ctx_destroy(struct gpu_gather_ctx *c)
{
	if (!c)
		return;
	if (cudaSetDevice(c->dev) == cudaSuccess) {
		ctx_free_tables(c);
		if (c->stream)
			(void)cudaStreamDestroy(c->stream);
	}
	(void)cudaGetLastError();
	free(c);
}

extern "C" int gpu_gather_ctx_set_upload(struct gpu_gather_ctx *c, int upload)
{
	if (!c)
		return -EINVAL;
	if (!upload) {
		int ua = 0;

		GATHER_CK(cudaDeviceGetAttribute(&ua, cudaDevAttrUnifiedAddressing,
						 c->dev));
		if (!ua)
			return -EINVAL;
	}
	c->upload = !!upload;
	return 0;
}

extern "C" struct gpu_piece *gpu_gather_ctx_table(struct gpu_gather_ctx *c,
						  uint32_t n)
{
	if (!c)
		return NULL;
	if (n > c->cap) {
		uint32_t cap = c->cap > 256 ? c->cap : 256;

		while (cap < n)
			cap = cap > UINT32_MAX / 2 ? n : 2 * cap;
		if (cudaSetDevice(c->dev) != cudaSuccess ||
		    ctx_alloc_tables(c, cap)) {
			(void)cudaGetLastError();
			return NULL;
		}
	}
	return c->host;
}

extern "C" int gpu_gather_ctx_launch(struct gpu_gather_ctx *c, uint32_t first,
				     uint32_t n, void *dst)
{
	uint64_t max_len = 0;
	int rc;

	if (!c || first > c->cap || n > c->cap - first || (!dst && n))
		return -EINVAL;
	if (!n)
		return 0;
	for (uint32_t i = first; i < first + n; i++)
		if (c->host[i].len > max_len)
			max_len = c->host[i].len;
	GATHER_CK(cudaSetDevice(c->dev));
	if (c->upload)
		GATHER_CK(cudaMemcpyAsync(c->dev_tab + first, c->host + first,
					  (size_t)n * sizeof(struct gpu_piece),
					  cudaMemcpyHostToDevice, c->stream));
	rc = gather_launch((c->upload ? c->dev_tab : c->host) + first, n,
			   max_len, dst, c->stream);
	if (rc) {
		/* the table copy may still be reading c->host */
		(void)cudaStreamSynchronize(c->stream);
		(void)cudaGetLastError();
	}
	return rc;
}

extern "C" int gpu_gather_ctx_wait(struct gpu_gather_ctx *c)
{
	if (!c)
		return -EINVAL;
	GATHER_CK(cudaStreamSynchronize(c->stream));
	return 0;
}

extern "C" int gpu_gather_ctx_run(struct gpu_gather_ctx *c, uint32_t n,
				  void *dst)
{
	int rc = gpu_gather_ctx_launch(c, 0, n, dst);

	return rc ? rc : (n ? gpu_gather_ctx_wait(c) : 0);
}

/* ------------------------------------------------------------------ */
/* Blocks by value (gpu_gather_ctx_launch_blocks)                      */

/* Both pieces of a block with all their loads in flight at once, where
 * source and destination are 16-byte aligned and the lengths multiples
 * of 16 (the store's layouts); up to BG_ROUND uint4 per lane per round. */
#define BG_ROUND 8
__device__ __forceinline__ void bg_copy2(char *dv, const char *sv, uint32_t nv,
					 char *db, const char *sb, uint32_t nb,
					 unsigned lane)
{
	const uint32_t mv = nv / 16, m = mv + nb / 16;

	for (uint32_t i0 = 0; i0 < m; i0 += 32 * BG_ROUND) {
		uint4 v[BG_ROUND];
#pragma unroll
		for (int u = 0; u < BG_ROUND; u++) {
			uint32_t i = i0 + lane + 32 * u;
			if (i < mv)
				v[u] = ((const uint4 *)sv)[i];
			else if (i < m)
				v[u] = ((const uint4 *)sb)[i - mv];
		}
#pragma unroll
		for (int u = 0; u < BG_ROUND; u++) {
			uint32_t i = i0 + lane + 32 * u;
			if (i < mv)
				((uint4 *)dv)[i] = v[u];
			else if (i < m)
				((uint4 *)db)[i - mv] = v[u];
		}
	}
}

static __global__ void __launch_bounds__(GATHER_WARPS * 32)
gather_blocks_kernel(const __grid_constant__ struct gpu_bg_args a, char *__restrict__ dst)
{
	const unsigned lane = threadIdx.x & 31;
	const uint32_t n = a.first[a.nseg];
	const uint32_t w0 = blockIdx.x * GATHER_WARPS + (threadIdx.x >> 5);
	const uint32_t ws = gridDim.x * GATHER_WARPS;

	for (uint32_t k = w0; k < n; k += ws) {
		uint32_t lo = 0, hi = a.nseg - 1;

		while (lo < hi) {
			uint32_t mid = (lo + hi + 1) >> 1;

			if (a.first[mid] <= k)
				lo = mid;
			else
				hi = mid - 1;
		}
		const struct gpu_bg_seg &g = a.seg[lo];
		const uint64_t j = a.blk[k], p = k - a.first[lo];
		const uint64_t vo = j * g.values_block, bo = j * g.bitmaps_block;
		const uint32_t vl = (uint32_t)min((uint64_t)g.values_block, g.values_len - vo);
		const uint32_t bl = (uint32_t)min((uint64_t)g.bitmaps_block, g.bitmaps_len - bo);
		char *dv = dst + g.dst + p * ((uint64_t)g.values_block + g.bitmaps_block);
		char *db = dv + vl;
		const char *sv = g.src + g.values_off + vo, *sb = g.src + g.bitmaps_off + bo;

		if (!(((uintptr_t)dv | (uintptr_t)sv | (uintptr_t)db | (uintptr_t)sb |
		       vl | bl) & 15)) {
			bg_copy2(dv, sv, vl, db, sb, bl, lane);
		} else {
			copy_any(dv, sv, vl, lane);
			copy_any(db, sb, bl, lane);
		}
	}
}

/* Arguments a kernel can take without reading past a segment. */
static int bg_check(const struct gpu_bg_args *a)
{
	if (!a || a->nseg < 1 || a->nseg > GPU_BG_MAXSEG || a->first[0] != 0 ||
	    a->first[a->nseg] > GPU_BG_MAXBLK)
		return -EINVAL;
	for (uint32_t i = 0; i < a->nseg; i++) {
		const struct gpu_bg_seg *g = &a->seg[i];

		if (a->first[i + 1] < a->first[i] || !g->src)
			return -EINVAL;
		for (uint32_t k = a->first[i]; k < a->first[i + 1]; k++) {
			uint64_t j = a->blk[k];

			if ((k > a->first[i] && j <= a->blk[k - 1]) ||
			    j * g->values_block >= g->values_len ||
			    j * g->bitmaps_block >= g->bitmaps_len)
				return -EINVAL;
		}
	}
	return 0;
}

extern "C" int gpu_gather_blocks_ref(const struct gpu_bg_args *a, void *dst)
{
	int rc = bg_check(a);

	if (rc || !dst)
		return rc ? rc : -EINVAL;
	for (uint32_t i = 0; i < a->nseg; i++) {
		const struct gpu_bg_seg *g = &a->seg[i];

		for (uint32_t k = a->first[i]; k < a->first[i + 1]; k++) {
			uint64_t j = a->blk[k], p = k - a->first[i];
			uint64_t vo = j * g->values_block, bo = j * g->bitmaps_block;
			uint64_t vl = g->values_len - vo < g->values_block ? g->values_len - vo
									   : g->values_block;
			uint64_t bl = g->bitmaps_len - bo < g->bitmaps_block
					      ? g->bitmaps_len - bo
					      : g->bitmaps_block;
			char *d = (char *)dst + g->dst +
				  p * ((uint64_t)g->values_block + g->bitmaps_block);

			memcpy(d, g->src + g->values_off + vo, vl);
			memcpy(d + vl, g->src + g->bitmaps_off + bo, bl);
		}
	}
	return 0;
}

extern "C" int gpu_gather_ctx_launch_blocks(struct gpu_gather_ctx *c,
					    const struct gpu_bg_args *a, void *dst)
{
	int rc;

	if (!c || !dst || (rc = bg_check(a)))
		return c && dst ? rc : -EINVAL;
	const uint32_t n = a->first[a->nseg];

	if (!n)
		return 0;
	GATHER_CK(cudaSetDevice(c->dev));
	/* one warp per block: every block's reads go out in the first wave */
	gather_blocks_kernel<<<(n + GATHER_WARPS - 1) / GATHER_WARPS, GATHER_WARPS * 32, 0,
			       c->stream>>>(*a, (char *)dst);
	GATHER_CK(cudaGetLastError());
	return 0;
}

/* ------------------------------------------------------------------ */
/* Device-driven gather (gpu_devmap_*)                                 */

struct gpu_devmap {
	int dev;
	uint32_t n;
	uint64_t blocks;
	struct gpu_dm_seg *segs;  /* device */
	/* Counters, one allocation so that collect is one copy and one
	 * memset: per-block hits (u32), then the refused count (u64). */
	char *cnt, *hcnt;         /* device; pinned host mirror */
	size_t cnt_bytes, refused_off;
	cudaStream_t stream;      /* collect and destroy wait on it */
	cudaEvent_t ev;           /* recorded after the last gather ... */
	cudaStream_t last;        /* ... on this stream */
	int have_last;
};

/* The segment holding block @id (< the table's blocks): the last with
 * first <= id.  Same code on both sides, so the reference resolves as the
 * kernel does. */
__host__ __device__ static inline uint32_t dm_find(const struct gpu_dm_seg *segs,
						   uint32_t n, uint64_t id)
{
	return last_le(segs, n, &gpu_dm_seg::first, id);
}

/* Block @j of @g: byte offsets and lengths of its values and bitmaps. */
__host__ __device__ static inline void dm_ranges(const struct gpu_dm_seg *g, uint64_t j,
						 uint64_t *vo, uint32_t *vl,
						 uint64_t *bo, uint32_t *bl)
{
	const uint64_t v = j * g->values_block, b = j * g->bitmaps_block;

	*vo = g->values_off + v;
	*bo = g->bitmaps_off + b;
	*vl = (uint32_t)(g->values_len - v < g->values_block ? g->values_len - v
							     : g->values_block);
	*bl = (uint32_t)(g->bitmaps_len - b < g->bitmaps_block ? g->bitmaps_len - b
							       : g->bitmaps_block);
}

/* One warp per selected entry; a grid of max_sel warps, those past the
 * count leave at once.  The table and the selection are in device memory
 * (L2 after the first warps), so every warp's first data load goes out
 * after a few on-chip round trips. */
static __global__ void __launch_bounds__(GATHER_WARPS * 32)
devmap_kernel(const struct gpu_dm_seg *__restrict__ segs, uint32_t nseg, uint64_t blocks,
	      const uint32_t *__restrict__ sel, const uint32_t *__restrict__ count,
	      uint32_t max_sel, char *__restrict__ staging, uint64_t slot,
	      struct gpu_dm_addr *__restrict__ out, uint32_t *__restrict__ hits,
	      unsigned long long *__restrict__ refused)
{
	const unsigned lane = threadIdx.x & 31;
	const uint32_t k = blockIdx.x * GATHER_WARPS + (threadIdx.x >> 5);
	const uint32_t c = count ? *count : max_sel;

	if (k == 0 && lane == 0 && c > max_sel)
		atomicAdd(refused, (unsigned long long)(c - max_sel));
	if (k >= max_sel || k >= c)
		return;
	const uint64_t id = sel[k];
	struct gpu_dm_addr a = {};

	if (id >= blocks) {
		if (lane == 0) {
			out[k] = a;
			atomicAdd(refused, 1ull);
		}
		return;
	}
	const struct gpu_dm_seg *g = &segs[dm_find(segs, nseg, id)];
	uint64_t vo, bo;
	uint32_t vl, bl;

	dm_ranges(g, id - g->first, &vo, &vl, &bo, &bl);
	const char *sv = g->src + vo, *sb = g->src + bo;

	a.values_bytes = vl;
	a.bitmaps_bytes = bl;
	a.tier = g->tier;
	a.device = 1;
	if (g->copy) {
		char *dv = staging + (uint64_t)k * slot, *db = dv + vl;

		if (!(((uintptr_t)dv | (uintptr_t)sv | (uintptr_t)db | (uintptr_t)sb | vl |
		       bl) & 15)) {
			bg_copy2(dv, sv, vl, db, sb, bl, lane);
		} else {
			copy_any(dv, sv, vl, lane);
			copy_any(db, sb, bl, lane);
		}
		a.values = dv;
		a.bitmaps = db;
	} else {
		a.values = sv;
		a.bitmaps = sb;
	}
	if (lane == 0) {
		out[k] = a;
		atomicAdd(&hits[id], 1u);
	}
}

static int dm_check(const struct gpu_dm_seg *segs, uint32_t n)
{
	uint64_t next = 0;

	if (!segs || n == 0)
		return -EINVAL;
	for (uint32_t i = 0; i < n; i++) {
		const struct gpu_dm_seg *g = &segs[i];

		if (!g->src || g->first != next || g->n_blocks == 0 ||
		    (uint64_t)(g->n_blocks - 1) * g->values_block >= g->values_len ||
		    (uint64_t)(g->n_blocks - 1) * g->bitmaps_block >= g->bitmaps_len ||
		    (g->values_block == 0 && g->bitmaps_block == 0))
			return -EINVAL;
		next += g->n_blocks;
	}
	/* selections are 32-bit ids */
	return next > UINT32_MAX ? -EINVAL : 0;
}

extern "C" void gpu_devmap_destroy(struct gpu_devmap *m)
{
	if (!m)
		return;
	if (cudaSetDevice(m->dev) == cudaSuccess) {
		if (m->stream && m->have_last)
			(void)cudaStreamWaitEvent(m->stream, m->ev, 0);
		if (m->stream)
			(void)cudaStreamSynchronize(m->stream);
		if (m->ev)
			(void)cudaEventDestroy(m->ev);
		if (m->stream)
			(void)cudaStreamDestroy(m->stream);
		(void)cudaFree(m->segs);
		(void)cudaFree(m->cnt);
		if (m->hcnt)
			(void)cudaFreeHost(m->hcnt);
	}
	(void)cudaGetLastError();
	free(m);
}

extern "C" int gpu_devmap_create(int dev, const struct gpu_dm_seg *segs, uint32_t n,
				 struct gpu_devmap **out)
{
	struct gpu_devmap *m;
	int rc;

	if (!out || dev < 0 || (rc = dm_check(segs, n)))
		return out && dev >= 0 ? rc : -EINVAL;
	GATHER_CK(cudaSetDevice(dev));
	m = (struct gpu_devmap *)calloc(1, sizeof *m);
	if (!m)
		return -ENOMEM;
	m->dev = dev;
	m->n = n;
	m->blocks = segs[n - 1].first + segs[n - 1].n_blocks;
#define DM_CK(call)                                     \
	do {                                            \
		cudaError_t e_ = (call);                \
		if (e_ != cudaSuccess) {                \
			(void)cudaGetLastError();       \
			gpu_devmap_destroy(m);          \
			return gpu_errno(e_);           \
		}                                       \
	} while (0)
	DM_CK(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking));
	DM_CK(cudaEventCreateWithFlags(&m->ev, cudaEventDisableTiming));
	m->refused_off = ((size_t)m->blocks * sizeof(uint32_t) + 7) & ~(size_t)7;
	m->cnt_bytes = m->refused_off + sizeof(unsigned long long);
	DM_CK(cudaMalloc((void **)&m->segs, (size_t)n * sizeof *segs));
	DM_CK(cudaMalloc((void **)&m->cnt, m->cnt_bytes));
	DM_CK(cudaMallocHost((void **)&m->hcnt, m->cnt_bytes));
	DM_CK(cudaMemcpyAsync(m->segs, segs, (size_t)n * sizeof *segs,
			      cudaMemcpyHostToDevice, m->stream));
	DM_CK(cudaMemsetAsync(m->cnt, 0, m->cnt_bytes, m->stream));
	/* @segs is the caller's: the copy must be done before we return */
	DM_CK(cudaStreamSynchronize(m->stream));
#undef DM_CK
	*out = m;
	return 0;
}

extern "C" uint64_t gpu_devmap_blocks(const struct gpu_devmap *m)
{
	return m ? m->blocks : 0;
}

extern "C" int gpu_devmap_gather(struct gpu_devmap *m, const uint32_t *sel,
				 const uint32_t *count, uint32_t max_sel, void *staging,
				 uint64_t slot, struct gpu_dm_addr *out, struct CUstream_st *s)
{
	if (!m || !sel || !staging || !out || slot == 0)
		return -EINVAL;
	if (max_sel == 0)
		return 0;
	GATHER_CK(cudaSetDevice(m->dev));
	/* The map's stream must end up waiting for every gather: the event
	 * marks the last one on the last stream, and a change of stream first
	 * hands the previous stream's last gather to the map's stream (one
	 * event record per call on the usual single stream). */
	if (m->have_last && m->last != (cudaStream_t)s)
		GATHER_CK(cudaStreamWaitEvent(m->stream, m->ev, 0));
	devmap_kernel<<<(max_sel + GATHER_WARPS - 1) / GATHER_WARPS, GATHER_WARPS * 32, 0,
			(cudaStream_t)s>>>(m->segs, m->n, m->blocks, sel, count, max_sel,
					   (char *)staging, slot, out, (uint32_t *)m->cnt,
					   (unsigned long long *)(m->cnt + m->refused_off));
	GATHER_CK(cudaGetLastError());
	GATHER_CK(cudaEventRecord(m->ev, (cudaStream_t)s));
	m->last = (cudaStream_t)s;
	m->have_last = 1;
	return 0;
}

extern "C" int gpu_devmap_collect(struct gpu_devmap *m, uint32_t *hits, uint64_t *refused)
{
	unsigned long long r;

	if (!m || !hits || !refused)
		return -EINVAL;
	GATHER_CK(cudaSetDevice(m->dev));
	if (m->have_last)
		GATHER_CK(cudaStreamWaitEvent(m->stream, m->ev, 0));
	GATHER_CK(cudaMemcpyAsync(m->hcnt, m->cnt, m->cnt_bytes, cudaMemcpyDeviceToHost,
				  m->stream));
	GATHER_CK(cudaMemsetAsync(m->cnt, 0, m->cnt_bytes, m->stream));
	GATHER_CK(cudaStreamSynchronize(m->stream));
	const uint32_t *h = (const uint32_t *)m->hcnt;

	for (uint64_t b = 0; b < m->blocks; b++)
		hits[b] += h[b];
	memcpy(&r, m->hcnt + m->refused_off, sizeof r);
	*refused += r;
	return 0;
}

extern "C" void gpu_devmap_gather_ref(const struct gpu_dm_seg *segs, uint32_t n,
				      const uint32_t *sel, uint32_t count, uint32_t max_sel,
				      char *staging, uint64_t slot, struct gpu_dm_addr *out,
				      uint32_t *hits, uint64_t *refused)
{
	const uint64_t blocks = segs[n - 1].first + segs[n - 1].n_blocks;

	if (count > max_sel) {
		*refused += count - max_sel;
		count = max_sel;
	}
	for (uint32_t k = 0; k < count; k++) {
		const uint64_t id = sel[k];
		struct gpu_dm_addr a;

		memset(&a, 0, sizeof a);
		if (id >= blocks) {
			out[k] = a;
			++*refused;
			continue;
		}
		const struct gpu_dm_seg *g = &segs[dm_find(segs, n, id)];
		uint64_t vo, bo;
		uint32_t vl, bl;

		dm_ranges(g, id - g->first, &vo, &vl, &bo, &bl);
		a.values_bytes = vl;
		a.bitmaps_bytes = bl;
		a.tier = g->tier;
		a.device = 1;
		if (g->copy) {
			char *d = staging + (uint64_t)k * slot;

			memcpy(d, g->src + vo, vl);
			memcpy(d + vl, g->src + bo, bl);
			a.values = d;
			a.bitmaps = d + vl;
		} else {
			a.values = g->src + vo;
			a.bitmaps = g->src + bo;
		}
		out[k] = a;
		hits[id]++;
	}
}
