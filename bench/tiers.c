/* SPDX-License-Identifier: MIT */
/*
 * bench/tiers — the store's transfers against the plain transfers of the
 * same bytes, measured side by side in one run (issue 3, "Must be shown").
 *
 * 1. GPU (built with CUDA and a usable device; otherwise figures are nan):
 *    64 segments x 4096 tokens (d = 128, r = 32, b = 16, bf16 packed,
 *    mkv_segment_encode of random data with decaying channel scales) held
 *    in the pinned host tier, HBM on the device.  Each step fetches a fresh
 *    random 10% of every segment's blocks, and each contender moves exactly
 *    those block bytes to the device:
 *      fetch_gather   mkv_store_fetch with the defaults: one gather
 *                     kernel reads the mapped pinned chunks into the
 *                     device staging (zero-copy), launched in parts while
 *                     the fetch still resolves blocks;
 *      fetch_threads  mkv_store_fetch with fetch_threads = 8: the threads
 *                     pack the blocks into pinned staging while the fetch
 *                     resolves them, each run of chunks copied by the
 *                     copy engine as soon as it is packed, and half the
 *                     bytes (whole segments) left to the kernel at once
 *                     (fetch_kernel_share 0.5), or none (share 0);
 *      fetch_mapped   mkv_store_fetch with fetch_mapped = 1 (addresses in
 *                     place) + the gather kernel reading them, i.e. what a
 *                     consumer kernel reading them over PCIe moves;
 *      kernel_only    that gather kernel alone (no store bookkeeping),
 *                     its table read in place, and uploaded first;
 *      h2d_pinned     one cudaMemcpy of the same byte count, pinned source;
 *                     for reference also one 64 MiB copy (the link's rate
 *                     for large copies, not the denominator);
 *      per_block      one cudaMemcpyAsync per block range (values, bitmaps).
 *      devmap_fetch   mkv_devmap_fetch: the selection already in device
 *                     memory (where the GPU's block selection leaves it),
 *                     one kernel resolves it against the map's device
 *                     table and copies; timed call to stream end.
 *    gather_frac_h2d = devmap_fetch / h2d_pinned (goal >= 0.8);
 *    host_fetch_frac_h2d = fetch_gather / h2d_pinned (selection on the
 *    host, mkv_store_fetch).
 * 2. NVMe (any machine; --dir, default a temp dir under /var/tmp): the
 *    nvme tier (io_uring, O_DIRECT, self-describing frames packed into
 *    preallocated slab files, one group-commit fdatasync per batch; see
 *    tiers/nvme.c) writing and reading
 *    --batch segments per ring submission from each of --threads threads
 *    with their own ring (as the store's workers; queue depth = threads x
 *    batch, default 2 x 64), against a plain O_DIRECT file of the same
 *    total bytes written with 4 MiB pwrite + fdatasync and read with
 *    4 MiB pread (queue depth 1), which of the two first alternating by
 *    round.  For reference, also files like the
 *    tier's (the first 256) written and read plainly one after the other
 *    (per-file QD1).
 *    Both bypass the page cache.  Throughput counts payload bytes; the
 *    median of --rounds rounds, contenders interleaved.
 *    nvme_frac_odirect = min(write frac, read frac) (goal >= 0.9).
 *
 * Usage: tiers [--dir DIR] [--nvme-mib N] [--batch N] [--threads N]
 *              [--rounds N] [--steps N] [--lz4] [--no-gpu]
 * The last line: RESULT name=tiers gather_gbps=... gather_frac_h2d=...
 * host_fetch_gbps=... host_fetch_frac_h2d=... nvme_frac_odirect=...
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include <mosaickv.h>
#include "io/uring.h"
#include "mkv_config.h"
#include "mosaickv/packpool.h"
#include "mosaickv/store_internal.h"
#include "tiers/tier.h"

#if MKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "gpu/gather.cuh"
#endif

#define D 128
#define R 32
#define B 16
#define TOKENS 4096
#define NSEG 64
#define FRAC 0.10

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, cmp_d);
	return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t rng_s = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
	uint64_t z = (rng_s += 0x9E3779B97F4A7C15ull);

	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static double gauss(void)
{
	double u = ((double)(rnd() >> 11) + 0.5) * 0x1p-53;
	double v = ((double)(rnd() >> 11) + 0.5) * 0x1p-53;

	return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

#define CK(call)                                                              \
	do {                                                                  \
		long long rc_ = (long long)(call);                            \
		if (rc_ < 0) {                                                \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, \
				#call, mkv_strerror((int)rc_));               \
			exit(1);                                              \
		}                                                             \
	} while (0)

/* One packed segment of TOKENS random vectors (channel scales decaying,
 * as real keys and values have). */
static struct mkv_segment *make_segment(enum mkv_kind kind)
{
	struct mkv_encode_opts o;
	struct mkv_segment *s = NULL;
	float *x = malloc((size_t)TOKENS * D * sizeof *x);

	if (!x)
		exit(1);
	for (size_t i = 0; i < TOKENS; i++)
		for (int c = 0; c < D; c++)
			x[i * D + c] = (float)(gauss() * exp(-c / 24.0) +
					       0.1 * (c % 7));
	CK(mkv_encode_opts_init(&o, sizeof o));
	o.d = D;
	o.r = R;
	o.b = B;
	o.kind = kind;
	o.store_dtype = MKV_DTYPE_BF16;
	CK(mkv_segment_encode(&o, x, MKV_DTYPE_F32, TOKENS, &s));
	free(x);
	return s;
}

/* ---------------------------------------------------------------------- */
/* GPU: gathered fetch against plain pinned H2D                            */

struct gpu_fig {
	double gather, gather4, gather2, mapped, kernel, kernel_up;
	double h2d, h2d_big, per_block;
	double bytes, blocks;
	double book_us; /* mkv_store_fetch with fetch_mapped: bookkeeping alone */
	double devmap;  /* mkv_devmap_fetch: selection in device memory */
	double devmap_sync_us; /* mkv_devmap_sync after a step */
};

#if MKV_HAVE_CUDA
static int gpu_present(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
		(void)cudaGetLastError();
		return 0;
	}
	return cudaSetDevice(0) == cudaSuccess;
}

#define CU(call)                                                              \
	do {                                                                  \
		cudaError_t e_ = (call);                                      \
		if (e_ != cudaSuccess) {                                      \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, \
				#call, cudaGetErrorString(e_));               \
			exit(1);                                              \
		}                                                             \
	} while (0)

static struct mkv_store *gpu_store(struct mkv_segment **segs, int mapped,
				   uint32_t threads, double share)
{
	struct mkv_store_opts o;
	struct mkv_store *s = NULL;
	struct mkv_store_stats st = { .size = sizeof st };

	CK(mkv_store_opts_init(&o, sizeof o));
	o.gpu = 0;
	o.hbm_bytes = 256 << 10; /* smaller than a segment: all go to host */
	o.host_bytes = (size_t)1 << 30;
	o.auto_balance = 0;
	o.fetch_mapped = (uint32_t)mapped;
	o.fetch_threads = threads;
	o.fetch_kernel_share = share;
	CK(mkv_store_create(&o, &s));
	for (uint32_t i = 0; i < NSEG; i++) {
		struct mkv_seg_key k = { .seq = 1, .seg = i, .kind = i % 2 };
		struct mkv_seg_info info;

		CK(mkv_store_put_segment(s, &k, segs[i]));
		CK(mkv_store_info(s, &k, &info));
		if (info.tier != MKV_TIER_HOST) {
			fprintf(stderr, "segment %u not in the host tier\n", i);
			exit(1);
		}
	}
	CK(mkv_store_get_stats(s, &st));
	if (!st.tier[MKV_TIER_HBM].on_device) {
		fprintf(stderr, "HBM is not on the device\n");
		exit(1);
	}
	return s;
}

/* The selections of @steps steps: 10% of each segment's blocks. */
static uint32_t *make_selections(uint32_t nb, uint32_t per, int steps)
{
	uint32_t *sel = malloc((size_t)steps * NSEG * per * sizeof *sel);
	uint8_t *mark = malloc(nb);

	for (int st = 0; st < steps; st++)
		for (int i = 0; i < NSEG; i++) {
			uint32_t *out = sel + ((size_t)st * NSEG + i) * per, k = 0;

			memset(mark, 0, nb);
			for (uint32_t c = 0; c < per;) {
				uint32_t j = (uint32_t)(rnd() % nb);

				if (!mark[j]) {
					mark[j] = 1;
					c++;
				}
			}
			for (uint32_t j = 0; j < nb; j++)
				if (mark[j])
					out[k++] = j;
		}
	free(mark);
	return sel;
}

static void reqs_for(struct mkv_fetch_req *req, const uint32_t *sel, int st,
		     uint32_t per)
{
	for (uint32_t i = 0; i < NSEG; i++)
		req[i] = (struct mkv_fetch_req){
			.key = { .seq = 1, .seg = i, .kind = i % 2 },
			.blocks = sel + ((size_t)st * NSEG + i) * per,
			.n_blocks = per };
}

/*
 * The fetched blocks @out as a back-to-back piece table (values, then
 * bitmaps, block after block) in @pc; returns the piece count, the byte
 * count in *@bytes.  struct pp_piece has the same layout (the pool's
 * contenders cast).
 */
static uint32_t pieces_of(const struct mkv_block_addr *out, uint32_t nblk,
			  struct gpu_piece *pc, uint64_t *bytes)
{
	uint64_t pos = 0;
	uint32_t np = 0;

	for (uint32_t k = 0; k < nblk; k++) {
		pc[np++] = (struct gpu_piece){ out[k].values, pos,
					       out[k].values_bytes };
		pos += out[k].values_bytes;
		pc[np++] = (struct gpu_piece){ out[k].bitmaps, pos,
					       out[k].bitmaps_bytes };
		pos += out[k].bitmaps_bytes;
	}
	*bytes = pos;
	return np;
}
_Static_assert(sizeof(struct gpu_piece) == sizeof(struct pp_piece),
	       "piece layouts");

struct diag_copy {
	char *dev, *host;
	cudaStream_t st;
};

static int diag_copy_fn(void *arg, uint64_t off, uint64_t len)
{
	struct diag_copy *d = arg;

	return cudaMemcpyAsync(d->dev + off, d->host + off, len,
			       cudaMemcpyHostToDevice, d->st) == cudaSuccess ?
		       0 : -EIO;
}

/*
 * Where a threaded fetch's time goes, on the same pieces without the
 * store: one thread packing, the pool packing (no copy), the pool packing
 * and copying (no store bookkeeping).  Printed, not in the RESULT line.
 */
static void diag_pieces(struct mkv_fetch *fm, struct mkv_fetch_req *req,
			const uint32_t *sel, uint32_t per, uint32_t nblk,
			int st, struct mkv_block_addr *out, struct pp_piece *pc,
			uint32_t *np, uint64_t *bytes)
{
	reqs_for(req, sel, st, per);
	CK(mkv_store_fetch(fm, req, NSEG, (uint64_t)st + 2, out));
	*np = pieces_of(out, nblk, (struct gpu_piece *)pc, bytes);
}

/*
 * Where a threaded fetch's time goes, on the same pieces without the
 * store: one thread packing (memcpy), the pool packing (no copy), the
 * pool packing and copying (no store bookkeeping); one pass each, the
 * pool's threads kept spinning between steps.  Printed, not in RESULT.
 */
static void diag_pack(struct mkv_fetch *fm, struct mkv_fetch_req *req,
		      const uint32_t *sel, uint32_t per, uint32_t nblk,
		      char *dbuf, int steps, unsigned threads)
{
	struct mkv_block_addr *out = calloc(nblk, sizeof *out);
	struct pp_piece *pc = calloc(2 * nblk, sizeof *pc);
	double *t = calloc(3 * (size_t)steps, sizeof *t);
	struct diag_copy dc = { dbuf, NULL, NULL };
	char *stage;

	CU(cudaMallocHost((void **)&stage, 32 << 20));
	dc.host = stage;
	CU(cudaStreamCreateWithFlags(&dc.st, cudaStreamNonBlocking));
	for (int mode = 0; mode < 3; mode++) {
		struct packpool *pp = NULL;

		if (mode)
			CK(packpool_create(threads, -1, 5000,
					   mode == 2 ? diag_copy_fn : NULL, &dc,
					   &pp));
		for (int st = 0; st <= steps; st++) {
			uint32_t np;
			uint64_t bytes;
			double t0;

			diag_pieces(fm, req, sel, per, nblk, st, out, pc, &np,
				    &bytes);
			t0 = now();
			if (!mode) {
				for (uint32_t k = 0; k < np; k++)
					memcpy(stage + pc[k].dst, pc[k].src,
					       pc[k].len);
			} else {
				packpool_begin(pp, pc, stage);
				for (uint32_t k = 52; k < np; k += 52)
					packpool_publish(pp, k);
				CK(packpool_finish(pp, np));
				if (mode == 2)
					CU(cudaStreamSynchronize(dc.st));
			}
			if (st)
				t[mode * steps + st - 1] =
					(double)bytes / (now() - t0);
		}
		packpool_destroy(pp);
	}
	printf("diag: pack 1 thread %.2f GB/s, pool of %u pack only %.2f GB/s, "
	       "pool pack + async H2D %.2f GB/s (no store)\n",
	       median(t, steps) * 1e-9, threads, median(t + steps, steps) * 1e-9,
	       median(t + 2 * steps, steps) * 1e-9);
	cudaStreamDestroy(dc.st);
	cudaFreeHost(stage);
	mkv_fetch_release(fm);
	free(out);
	free(pc);
	free(t);
}

/* @steps timed fetches on @f (after one untimed), each followed by one
 * pinned H2D of the same bytes: bytes/s into @tf and @th. */
static void fetch_pass(struct mkv_fetch *f, struct mkv_fetch_req *req,
		       const uint32_t *sel, uint32_t per, uint32_t nblk,
		       char *dbuf, const char *hbuf, int steps, double *tf,
		       double *th, double *tr)
{
	(void)tr; /* phase times (steps x 8), in a -DMKV_FETCH_TRACE=1 build */
	struct mkv_block_addr *out = calloc(nblk, sizeof *out);

	for (int st = 0; st <= steps; st++) {
		size_t sb = 0;
		double t0, dt_f, dt_h;
		int64_t got;

		reqs_for(req, sel, st, per);
		t0 = now();
		got = mkv_store_fetch(f, req, NSEG, (uint64_t)st + 2, out);
		dt_f = now() - t0;
		CK(got);
		if ((uint32_t)got != nblk || !out[0].device) {
			fprintf(stderr, "fetch staged %lld of %u blocks\n",
				(long long)got, nblk);
			exit(1);
		}
		for (uint32_t k = 0; k < nblk; k++)
			sb += out[k].values_bytes + out[k].bitmaps_bytes;
#if MKV_FETCH_TRACE
		if (tr && st > 0)
			store_fetch_trace(f, tr + 8 * (st - 1));
#endif
		t0 = now();
		CU(cudaMemcpy(dbuf, hbuf, sb, cudaMemcpyHostToDevice));
		dt_h = now() - t0;
		if (st == 0)
			continue;
		tf[st - 1] = (double)sb / dt_f;
		th[st - 1] = (double)sb / dt_h;
	}
	free(out);
}

/*
 * The device-driven fetch (mkv_devmap_fetch) over the same store and
 * selections: every step's selection is written to device memory before
 * the timing, as the GPU's block selection leaves it (global ids: segment
 * i's block j is i * nb + j; copied into one fixed buffer before each
 * step, the selection workspace of a decode loop), and a step is timed
 * from the call to the end of its stream.  Each followed by one pinned H2D of the same bytes.
 * mkv_devmap_sync (statistics) is timed apart: a decode loop runs it once
 * every few steps, not inside the fetch.
 */
static void devmap_pass(struct mkv_store *s, struct mkv_fetch *f,
			struct mkv_fetch_req *req, const uint32_t *sel, uint32_t nb,
			uint32_t per, uint32_t nblk, char *dbuf, const char *hbuf,
			int steps, double *td, double *th, double *tsync)
{
	struct mkv_seg_key keys[NSEG];
	struct mkv_devmap *m;
	struct mkv_block_addr *out = calloc(nblk, sizeof *out), *dout;
	uint32_t *ids = malloc((size_t)(steps + 1) * nblk * sizeof *ids), *dsel, *dcur;
	char *dst;
	cudaStream_t cs;

	for (uint32_t i = 0; i < NSEG; i++)
		keys[i] = (struct mkv_seg_key){ .seq = 1, .seg = i, .kind = i % 2 };
	CK(mkv_devmap_create(s, keys, NSEG, &m));
	if (mkv_devmap_blocks(m) != (uint64_t)NSEG * nb) {
		fprintf(stderr, "devmap: %llu blocks, want %u\n",
			(unsigned long long)mkv_devmap_blocks(m), NSEG * nb);
		exit(1);
	}
	const uint64_t slot = mkv_devmap_slot_bytes(m);
	for (int st = 0; st <= steps; st++)
		for (uint32_t i = 0; i < NSEG; i++)
			for (uint32_t b = 0; b < per; b++)
				ids[(size_t)st * nblk + i * per + b] =
					i * nb + sel[((size_t)st * NSEG + i) * per + b];
	CU(cudaMalloc((void **)&dsel, (size_t)(steps + 1) * nblk * sizeof *dsel));
	CU(cudaMemcpy(dsel, ids, (size_t)(steps + 1) * nblk * sizeof *dsel,
		      cudaMemcpyHostToDevice));
	CU(cudaMalloc((void **)&dcur, nblk * sizeof *dcur));
	CU(cudaMalloc((void **)&dst, nblk * slot));
	CU(cudaMalloc((void **)&dout, nblk * sizeof *dout));
	CU(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
	for (int st = 0; st <= steps; st++) {
		size_t sb = 0;
		double t0, dt_d, dt_h, dt_s;

		/* the step's selection into the one buffer the fetch reads,
		 * as a selection kernel would leave it there */
		CU(cudaMemcpyAsync(dcur, dsel + (size_t)st * nblk, nblk * sizeof *dcur,
				   cudaMemcpyDeviceToDevice, cs));
		CU(cudaStreamSynchronize(cs));
		t0 = now();
		CK(mkv_devmap_fetch(m, dcur, NULL, nblk, dst, nblk * slot, dout, cs));
		CU(cudaStreamSynchronize(cs));
		dt_d = now() - t0;
		t0 = now();
		int64_t refused = mkv_devmap_sync(m, (uint64_t)st + 2);
		dt_s = now() - t0;
		CK(refused);
		CU(cudaMemcpy(out, dout, nblk * sizeof *out, cudaMemcpyDeviceToHost));
		for (uint32_t k = 0; k < nblk; k++)
			sb += out[k].values_bytes + out[k].bitmaps_bytes;
		/* check the step against the host-driven fetch's blocks */
		if (st == 0) {
			struct mkv_block_addr *ho = calloc(nblk, sizeof *ho);
			char *a = malloc(4096), *b = malloc(4096);

			reqs_for(req, sel, st, per);
			CK(mkv_store_fetch(f, req, NSEG, 1, ho));
			for (uint32_t k = 0; k < nblk; k++) {
				uint32_t vl = out[k].values_bytes, bl = out[k].bitmaps_bytes;

				if (refused || vl != ho[k].values_bytes ||
				    bl != ho[k].bitmaps_bytes || vl > 4096 || bl > 4096) {
					fprintf(stderr, "devmap: block %u differs\n", k);
					exit(1);
				}
				CU(cudaMemcpy(a, out[k].values, vl, cudaMemcpyDeviceToHost));
				CU(cudaMemcpy(b, ho[k].values, vl, cudaMemcpyDeviceToHost));
				if (memcmp(a, b, vl)) {
					fprintf(stderr, "devmap: values of block %u differ\n", k);
					exit(1);
				}
				CU(cudaMemcpy(a, out[k].bitmaps, bl, cudaMemcpyDeviceToHost));
				CU(cudaMemcpy(b, ho[k].bitmaps, bl, cudaMemcpyDeviceToHost));
				if (memcmp(a, b, bl)) {
					fprintf(stderr, "devmap: bitmaps of block %u differ\n", k);
					exit(1);
				}
			}
			mkv_fetch_release(f);
			free(ho);
			free(a);
			free(b);
		}
		t0 = now();
		CU(cudaMemcpy(dbuf, hbuf, sb, cudaMemcpyHostToDevice));
		dt_h = now() - t0;
		if (st == 0)
			continue;
		td[st - 1] = (double)sb / dt_d;
		th[st - 1] = (double)sb / dt_h;
		tsync[st - 1] = dt_s * 1e6;
	}
	mkv_devmap_destroy(m);
	cudaStreamDestroy(cs);
	cudaFree(dsel);
	cudaFree(dcur);
	cudaFree(dst);
	cudaFree(dout);
	free(ids);
	free(out);
}

static void run_gpu(struct gpu_fig *fig, int steps)
{
	struct mkv_segment *segs[NSEG];
	struct mkv_packed_view pv;
	struct mkv_fetch_req req[NSEG];
	struct mkv_fetch *fg, *fm, *f4, *f2;
	struct gpu_gather_ctx *gc;
	struct mkv_block_addr *out;
	struct cudaDeviceProp prop;
	double *tg, *tm, *tk, *tu, *th, *tp, *t4, *t2, *tbk, t0;
	uint32_t nb, per, nblk;
	size_t bytes = 0, max_bytes = 0;
	char *hbuf, *dbuf;
	cudaStream_t cs;

	CU(cudaGetDeviceProperties(&prop, 0));
	for (int i = 0; i < NSEG; i++)
		segs[i] = make_segment(i % 2 ? MKV_KIND_VALUE : MKV_KIND_KEY);
	CK(mkv_segment_view(segs[0], &pv));
	nb = (uint32_t)((pv.n + B - 1) / B);
	per = (uint32_t)(nb * FRAC + 0.5);
	nblk = NSEG * per;
	struct mkv_store *sg = gpu_store(segs, 0, 0, 0.5),
			 *sm = gpu_store(segs, 1, 0, 1);
	struct mkv_store *s4 = gpu_store(segs, 0, 8, 0.5),
			 *s2 = gpu_store(segs, 0, 8, 0);
	uint32_t *sel = make_selections(nb, per, steps + 1);

	out = calloc(nblk, sizeof *out);
	tg = calloc((size_t)steps, sizeof *tg);
	tm = calloc((size_t)steps, sizeof *tm);
	tk = calloc((size_t)steps, sizeof *tk);
	tu = calloc((size_t)steps, sizeof *tu);
	th = calloc((size_t)steps * 5, sizeof *th);
	tp = calloc((size_t)steps, sizeof *tp);
	t4 = calloc((size_t)steps, sizeof *t4);
	t2 = calloc((size_t)steps, sizeof *t2);
	tbk = calloc((size_t)steps, sizeof *tbk);
	/* Byte count of a step (equal for every step up to the odd short
	 * last block: take the largest for the staging sizes). */
	CK(mkv_fetch_create(sm, (size_t)32 << 20, &fm));
	for (int st = 0; st <= steps; st++) {
		size_t b = 0;

		reqs_for(req, sel, st, per);
		CK(mkv_store_fetch(fm, req, NSEG, 1, out));
		for (uint32_t k = 0; k < nblk; k++)
			b += out[k].values_bytes + out[k].bitmaps_bytes;
		if (st == 0)
			bytes = b;
		max_bytes = b > max_bytes ? b : max_bytes;
	}
	mkv_fetch_release(fm);
	CK(mkv_fetch_create(sg, max_bytes, &fg));
	CK(mkv_fetch_create(s4, max_bytes, &f4));
	CK(mkv_fetch_create(s2, max_bytes, &f2));
	CK(gpu_gather_ctx_create(0, 2 * nblk, &gc));
	CU(cudaMallocHost((void **)&hbuf, max_bytes));
	memset(hbuf, 1, max_bytes);
	CU(cudaMalloc((void **)&dbuf, max_bytes));
	CU(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));

	/*
	 * The store's fetches, one contender per pass over the same
	 * selections, each fetch followed by a plain H2D of its bytes: a
	 * pass of its own because idle fetch threads spin for a while, and
	 * another store's spinning threads would take the cores this one's
	 * need (the H2D figure is the median over all passes).
	 */
	double *trace = calloc((size_t)steps * 8, sizeof *trace);

	fetch_pass(f2, req, sel, per, nblk, dbuf, hbuf, steps, t2,
		   th + 2 * steps, NULL);
	fetch_pass(fg, req, sel, per, nblk, dbuf, hbuf, steps, tg, th, trace);
	fetch_pass(f4, req, sel, per, nblk, dbuf, hbuf, steps, t4, th + steps, NULL);
	double *tdm = calloc((size_t)steps, sizeof *tdm), *tds = calloc((size_t)steps, sizeof *tds);

	devmap_pass(sg, fg, req, sel, nb, per, nblk, dbuf, hbuf, steps, tdm, th + 4 * steps,
		    tds);
#if MKV_FETCH_TRACE
	{
		double col[1024];
		int ns = steps < 1024 ? steps : 1024;

		printf("trace: fetch_gather phases, median us since the call:");
		for (int k = 1; k <= 6; k++) {
			for (int i = 0; i < ns; i++)
				col[i] = trace[8 * i + k];
			printf(" %d=%.1f", k, median(col, ns));
		}
		printf("  (1 locked, 2 phase 1 done, 3 last launch, 4 selection "
		       "recorded, 5 copies done, 6 return)\n");
	}
#endif
	free(trace);
	{
		/* Drift check: the first pass again. */
		double *tr = calloc(steps, sizeof *tr), *hr = calloc(steps, sizeof *hr);

		fetch_pass(f2, req, sel, per, nblk, dbuf, hbuf, steps, tr, hr, NULL);
		printf("diag: threads-only pass repeated last: %.2f GB/s "
		       "(first: %.2f)\n", median(tr, steps) * 1e-9,
		       median(t2, steps) * 1e-9);
		free(tr);
		free(hr);
	}
	/* Step 0 warms every path; steps 1..steps are timed, interleaved. */
	for (int st = 0; st <= steps; st++) {
		size_t sb = 0;
		uint32_t np = 0;
		struct gpu_piece *pc;

		reqs_for(req, sel, st, per);
		/* fetch_mapped + the kernel that reads the blocks in place */
		t0 = now();
		int64_t got = mkv_store_fetch(fm, req, NSEG, (uint64_t)st + 2, out);
		double dt_b = now() - t0;
		CK(got);
		for (uint32_t k = 0; k < nblk; k++)
			sb += out[k].values_bytes + out[k].bitmaps_bytes;
		if (got && st == 0)
			printf("note: fetch_mapped not honored on this device "
			       "(blocks staged)\n");
		pc = gpu_gather_ctx_table(gc, 2 * nblk);
		if (!pc)
			exit(1);
		{
			uint64_t pb;

			np = pieces_of(out, nblk, pc, &pb);
		}
		CK(gpu_gather_ctx_run(gc, np, dbuf));
		double dt_m = now() - t0;
		/* the kernel alone, same pieces: table read in place (the
		 * store's way), then uploaded first */
		t0 = now();
		CK(gpu_gather_ctx_run(gc, np, dbuf));
		double dt_k = now() - t0;
		CK(gpu_gather_ctx_set_upload(gc, 1));
		t0 = now();
		CK(gpu_gather_ctx_run(gc, np, dbuf));
		double dt_u = now() - t0;
		CK(gpu_gather_ctx_set_upload(gc, 0));
		/* plain pinned H2D of the same byte count */
		t0 = now();
		CU(cudaMemcpy(dbuf, hbuf, sb, cudaMemcpyHostToDevice));
		double dt_h = now() - t0;

		if (st == 0)
			continue;

		tm[st - 1] = (double)sb / dt_m;
		tbk[st - 1] = dt_b * 1e6;
		tk[st - 1] = (double)sb / dt_k;
		tu[st - 1] = (double)sb / dt_u;
		th[3 * steps + st - 1] = (double)sb / dt_h;
	}
	/*
	 * Per-block copies from the same pinned host addresses, in a pass of
	 * their own: thousands of queued copies leave the copy engines and
	 * the driver busy for a while after the stream is idle, which slowed
	 * whatever ran next (both the fetch and the plain H2D by 20-40% when
	 * this ran inside the loop above).
	 */
	for (int st = 1; st <= steps; st++) {
		size_t sb = 0;
		uint32_t np = 0;
		struct gpu_piece *pc;

		reqs_for(req, sel, st, per);
		CK(mkv_store_fetch(fm, req, NSEG, (uint64_t)st + 2, out));
		pc = gpu_gather_ctx_table(gc, 2 * nblk);
		if (!pc)
			exit(1);
		{
			uint64_t pb;

			np = pieces_of(out, nblk, pc, &pb);
			sb = pb;
		}
		t0 = now();
		for (uint32_t k = 0; k < np; k++)
			CU(cudaMemcpyAsync(dbuf + pc[k].dst, pc[k].src, pc[k].len,
					   cudaMemcpyDefault, cs));
		CU(cudaStreamSynchronize(cs));
		tp[st - 1] = (double)sb / (now() - t0);
	}
	diag_pack(fm, req, sel, per, nblk, dbuf, steps, 8);
	fig->gather = median(tg, steps) * 1e-9;
	fig->gather4 = median(t4, steps) * 1e-9;
	fig->gather2 = median(t2, steps) * 1e-9;
	fig->mapped = median(tm, steps) * 1e-9;
	fig->kernel = median(tk, steps) * 1e-9;
	fig->kernel_up = median(tu, steps) * 1e-9;
	fig->per_block = median(tp, steps) * 1e-9;
	fig->book_us = median(tbk, steps);
	fig->h2d = median(th, 5 * steps) * 1e-9;
	fig->devmap = median(tdm, steps) * 1e-9;
	fig->devmap_sync_us = median(tds, steps);
	fig->bytes = (double)bytes;
	fig->blocks = nblk;
	printf("gpu: %s, %d segments x %d tokens (d=%d r=%d b=%d bf16), "
	       "%u of %u blocks each (10%%), %.2f MiB per fetch, %d steps\n",
	       prop.name, NSEG, TOKENS, D, R, B, per, nb,
	       (double)bytes / 1048576.0, steps);

	cudaStreamDestroy(cs);
	cudaFree(dbuf);
	cudaFreeHost(hbuf);
	gpu_gather_ctx_destroy(gc);
	/* The link's rate for large copies, for reference. */
	{
		size_t big = (size_t)64 << 20;
		char *hb, *db;
		double tb[5];

		CU(cudaMallocHost((void **)&hb, big));
		memset(hb, 2, big);
		CU(cudaMalloc((void **)&db, big));
		CU(cudaMemcpy(db, hb, big, cudaMemcpyHostToDevice));
		for (int i = 0; i < 5; i++) {
			t0 = now();
			CU(cudaMemcpy(db, hb, big, cudaMemcpyHostToDevice));
			tb[i] = (double)big / (now() - t0);
		}
		fig->h2d_big = median(tb, 5) * 1e-9;
		cudaFree(db);
		cudaFreeHost(hb);
	}
	mkv_fetch_destroy(fg);
	mkv_fetch_destroy(f4);
	mkv_fetch_destroy(f2);
	mkv_fetch_destroy(fm);
	mkv_store_destroy(sg);
	mkv_store_destroy(sm);
	mkv_store_destroy(s4);
	mkv_store_destroy(s2);
	for (int i = 0; i < NSEG; i++)
		mkv_segment_destroy(segs[i]);
	free(sel);
	free(out);
	free(tg);
	free(tm);
	free(tk);
	free(tu);
	free(th);
	free(tp);
	free(t4);
	free(t2);
	free(tbk);
	free(tdm);
	free(tds);
}
#endif /* MKV_HAVE_CUDA */

/* ---------------------------------------------------------------------- */
/* NVMe: the tier through io_uring against plain O_DIRECT                  */

#define ODIRECT_BLOCK ((size_t)4 << 20)

struct nvme_fig {
	double tier_w, tier_r, od_w, od_r; /* GB/s */
	double file_w, file_r;             /* per-file plain O_DIRECT */
	size_t objs, obj_len, total;
	double read_op_kib; /* mean bytes per read op of the tier's gets */
};

static double odirect_write(const char *path, const char *buf, size_t total)
{
	double t0 = now();
	int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_DIRECT | O_CLOEXEC,
		      0600);

	if (fd < 0) {
		perror(path);
		exit(1);
	}
	for (size_t off = 0; off < total; off += ODIRECT_BLOCK) {
		size_t n = total - off < ODIRECT_BLOCK ? total - off : ODIRECT_BLOCK;

		if (pwrite(fd, buf, n, (off_t)off) != (ssize_t)n) {
			perror("pwrite");
			exit(1);
		}
	}
	if (fdatasync(fd)) {
		perror("fdatasync");
		exit(1);
	}
	close(fd);
	return now() - t0;
}

static double odirect_read(const char *path, char *buf, size_t total)
{
	double t0 = now();
	int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);

	if (fd < 0) {
		perror(path);
		exit(1);
	}
	for (size_t off = 0; off < total; off += ODIRECT_BLOCK) {
		size_t n = total - off < ODIRECT_BLOCK ? total - off : ODIRECT_BLOCK;

		if (pread(fd, buf, n, (off_t)off) != (ssize_t)n) {
			perror("pread");
			exit(1);
		}
	}
	close(fd);
	return now() - t0;
}

/*
 * The same files the tier writes (one per segment, same sizes rounded to
 * 4 KiB), plainly: open, one O_DIRECT pwrite, fdatasync, close, one after
 * the other (queue depth 1), or open, pread, close.  Not the RESULT's
 * reference; it separates the per-file cost of the filesystem from the
 * tier's own.
 */
static double odirect_files(const char *dir, size_t n, const size_t *plen,
			    size_t npay, char *buf, int reading)
{
	char path[4200];
	double t0 = now();

	for (size_t o = 0; o < n; o++) {
		size_t l = (plen[o % npay] + 4095) & ~(size_t)4095;
		int fd;

		snprintf(path, sizeof path, "%s/plain-%zu.bin", dir, o);
		fd = reading ? open(path, O_RDONLY | O_DIRECT | O_CLOEXEC)
			     : open(path, O_CREAT | O_TRUNC | O_WRONLY | O_DIRECT |
						  O_CLOEXEC, 0600);
		if (fd < 0 ||
		    (reading ? pread(fd, buf, l, 0) : pwrite(fd, buf, l, 0)) !=
			    (ssize_t)l ||
		    (!reading && fdatasync(fd))) {
			perror(path);
			exit(1);
		}
		close(fd);
	}
	return now() - t0;
}

static void odirect_files_rm(const char *dir, size_t n)
{
	char path[4200];

	for (size_t o = 0; o < n; o++) {
		snprintf(path, sizeof path, "%s/plain-%zu.bin", dir, o);
		unlink(path);
	}
}

/*
 * The tier's slab files ("slab-*.mkv") in @dir: counted (@remove 0), or
 * removed (@remove 1).  The tier keeps its slabs when every segment has
 * been dropped (they are preallocated space, not data); the bench removes
 * them only from a directory that had none before it ran.
 */
static unsigned slab_files(const char *dir, int remove)
{
	char path[4200];
	DIR *d = opendir(dir);
	struct dirent *de;
	unsigned n = 0;

	if (!d)
		return 0;
	while ((de = readdir(d))) {
		if (strncmp(de->d_name, "slab-", 5))
			continue;
		n++;
		if (remove) {
			snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
			unlink(path);
		}
	}
	closedir(d);
	return n;
}

/* What the worker threads share, and each one's ring and buffers. */
struct nvme_job {
	struct tier *nv;
	struct tier_obj **objs;
	char *const *pay;
	const size_t *plen;
	const uint64_t *hash;
	size_t nobj, npay;
	unsigned batch, nthreads;
	uint64_t round;
	int reading;
};

struct nvme_worker {
	const struct nvme_job *j;
	unsigned id;
	pthread_t th;
	struct uring_engine *ring;
	struct tier_meta *m;
	const void **src;
	int *rcs;
	void **dst;
	size_t *caps;
	int64_t *res;
	struct uring_engine_stats st0;
	size_t last_o; /* first object of the last batch read */
	unsigned last_n;
	int err;
};

/* Thread @w->id spills or reads batches id, id + nthreads, ... */
static void *nvme_work(void *arg)
{
	struct nvme_worker *w = arg;
	const struct nvme_job *j = w->j;
	struct tier_io io = { w->ring };
	size_t step = (size_t)j->batch * j->nthreads;

	w->last_n = 0;
	for (size_t o = (size_t)w->id * j->batch; o < j->nobj && !w->err;
	     o += step) {
		unsigned n = (unsigned)(j->nobj - o < j->batch ? j->nobj - o
							       : j->batch);

		if (!j->reading) {
			for (unsigned i = 0; i < n; i++) {
				size_t p = (o + i) % j->npay;

				memset(&w->m[i], 0, sizeof w->m[i]);
				w->m[i].key = (struct segfile_key){
					.seq = j->round, .seg = (uint32_t)(o + i),
					.kind = (uint32_t)(p % 2) };
				w->m[i].len = j->plen[p];
				w->m[i].hash = j->hash[p];
				w->src[i] = j->pay[p];
			}
			w->err = tier_putv(j->nv, &io, w->m, w->src, n,
					   j->objs + o, w->rcs);
			continue;
		}
		w->err = tier_getv(j->nv, &io, j->objs + o, w->dst, w->caps, n,
				   w->res);
		for (unsigned i = 0; i < n && !w->err; i++)
			if (w->res[i] != (int64_t)j->plen[(o + i) % j->npay])
				w->err = -EIO;
		w->last_o = o;
		w->last_n = n;
	}
	return NULL;
}

/* Run every worker over the job; returns the seconds taken. */
static double nvme_run(struct nvme_worker *w, unsigned nt)
{
	double t0 = now();

	for (unsigned t = 0; t < nt; t++)
		if (pthread_create(&w[t].th, NULL, nvme_work, &w[t]))
			exit(1);
	for (unsigned t = 0; t < nt; t++)
		pthread_join(w[t].th, NULL);
	double dt = now() - t0;

	for (unsigned t = 0; t < nt; t++)
		CK(w[t].err);
	return dt;
}

static void run_nvme(struct nvme_fig *fig, const char *dir, size_t total_mib,
		     unsigned batch, unsigned nthreads, int rounds, int lz4)
{
	enum { NPAY = 8 };
	char *pay[NPAY];
	uint64_t hash[NPAY];
	size_t plen[NPAY], len = 0, cap = (size_t)8 << 20;
	struct tier *nv;
	char odpath[4096], *odbuf;
	double *tw = calloc((size_t)rounds, sizeof *tw);
	double *tr = calloc((size_t)rounds, sizeof *tr);
	double *ow = calloc((size_t)rounds, sizeof *ow);
	double *orr = calloc((size_t)rounds, sizeof *orr);
	double *fw = calloc((size_t)rounds, sizeof *fw);
	double *fr = calloc((size_t)rounds, sizeof *fr);
	uint64_t rd_ops = 0, rd_bytes = 0;

	/* Real serialized segments (K and V alternating), reused as the
	 * payloads of many keys: what the store spills. */
	for (int i = 0; i < NPAY; i++) {
		struct mkv_segment *s = make_segment(i % 2 ? MKV_KIND_VALUE
							   : MKV_KIND_KEY);
		int64_t l;

		pay[i] = malloc(cap);
		l = mkv_segment_serialize(s, pay[i], cap);
		CK(l);
		plen[i] = (size_t)l;
		len = plen[i] > len ? plen[i] : len; /* the largest */
		hash[i] = XXH3_64bits(pay[i], plen[i]);
		mkv_segment_destroy(s);
	}
	size_t nobj = (total_mib << 20) / len, total = 0;

	if (nobj < batch)
		nobj = batch;
	for (size_t o = 0; o < nobj; o++)
		total += plen[o % NPAY];
	size_t nf = nobj < 256 ? nobj : 256, nf_bytes = 0;

	for (size_t o = 0; o < nf; o++)
		nf_bytes += plen[o % NPAY];
	/* O_DIRECT moves whole 4 KiB blocks */
	size_t od_total = (total + 4095) & ~(size_t)4095;

	fig->objs = nobj;
	fig->obj_len = total / nobj;
	fig->total = total;
	unsigned slabs_before = slab_files(dir, 0);

	CK(nvme_tier_create(dir, (size_t)1 << 40, lz4, &nv));
	snprintf(odpath, sizeof odpath, "%s/odirect.bin", dir);
	if (posix_memalign((void **)&odbuf, 4096, ODIRECT_BLOCK))
		exit(1);
	for (size_t i = 0; i < ODIRECT_BLOCK; i++)
		odbuf[i] = (char)rnd();

	struct tier_obj **objs = calloc(nobj, sizeof *objs);
	struct nvme_job job = { .nv = nv, .objs = objs, .pay = pay,
		.plen = plen, .hash = hash, .nobj = nobj, .npay = NPAY,
		.batch = batch, .nthreads = nthreads };
	struct nvme_worker *w = calloc(nthreads, sizeof *w);

	for (unsigned t = 0; t < nthreads; t++) {
		/* The batch's frames fit the registered area (WRITE_FIXED /
		 * READ_FIXED); one SQE per segment (the fdatasync is a group
		 * commit outside the ring): room for two batches in flight. */
		size_t area = (size_t)batch * segfile_bound(len);

		w[t].j = &job;
		w[t].id = t;
		if (uring_engine_create(2 * batch, area, &w[t].ring))
			CK(uring_engine_create(2 * batch, 0, &w[t].ring));
		w[t].m = calloc(batch, sizeof *w[t].m);
		w[t].src = calloc(batch, sizeof *w[t].src);
		w[t].rcs = calloc(batch, sizeof *w[t].rcs);
		w[t].dst = calloc(batch, sizeof *w[t].dst);
		w[t].caps = calloc(batch, sizeof *w[t].caps);
		w[t].res = calloc(batch, sizeof *w[t].res);
		for (unsigned i = 0; i < batch; i++) {
			w[t].dst[i] = malloc(len);
			w[t].caps[i] = len;
		}
	}
	for (int rd = 0; rd < rounds; rd++) {
		struct tier_io io = { w[0].ring };

		job.round = (uint64_t)rd;
		/* Plain O_DIRECT and the tier, writes then reads; which of the
		 * two goes first alternates by round, so that what the disk is
		 * still doing for the one before (write-back below the VM, a
		 * cache just filled) falls on each contender equally often. */
		const bool od_first = rd % 2 == 0;
		if (od_first)
			ow[rd] = (double)od_total / odirect_write(odpath, odbuf, od_total);
		job.reading = 0;
		tw[rd] = (double)total / nvme_run(w, nthreads);
		if (!od_first)
			ow[rd] = (double)od_total / odirect_write(odpath, odbuf, od_total);
		if (od_first)
			orr[rd] = (double)od_total / odirect_read(odpath, odbuf, od_total);
		job.reading = 1;
		for (unsigned t = 0; t < nthreads; t++)
			uring_engine_get_stats(w[t].ring, &w[t].st0);
		tr[rd] = (double)total / nvme_run(w, nthreads);
		for (unsigned t = 0; t < nthreads; t++) {
			struct uring_engine_stats s1;

			uring_engine_get_stats(w[t].ring, &s1);
			rd_ops += s1.ops - w[t].st0.ops;
			rd_bytes += s1.bytes_read - w[t].st0.bytes_read;
		}
		if (!od_first)
			orr[rd] = (double)od_total / odirect_read(odpath, odbuf, od_total);
		/* what each thread read last is what was written */
		for (unsigned t = 0; t < nthreads; t++)
			for (unsigned i = 0; i < w[t].last_n; i++) {
				size_t p = (w[t].last_o + i) % NPAY;

				if (memcmp(w[t].dst[i], pay[p], plen[p])) {
					fprintf(stderr, "read back differs\n");
					exit(1);
				}
			}
		for (size_t o = 0; o < nobj; o++)
			tier_drop(nv, &io, objs[o]);
		unlink(odpath);
		/* the per-file reference, on the first 256 files only (it is
		 * slow: one fdatasync after another) */
		fw[rd] = (double)nf_bytes / odirect_files(dir, nf, plen, NPAY,
							  odbuf, 0);
		fr[rd] = (double)nf_bytes / odirect_files(dir, nf, plen, NPAY,
							  odbuf, 1);
		odirect_files_rm(dir, nf);
		printf("nvme round %d: tier write %.2f read %.2f GB/s, "
		       "O_DIRECT 4 MiB write %.2f read %.2f GB/s, "
		       "O_DIRECT per-file QD1 write %.2f read %.2f GB/s\n", rd,
		       tw[rd] * 1e-9, tr[rd] * 1e-9, ow[rd] * 1e-9, orr[rd] * 1e-9,
		       fw[rd] * 1e-9, fr[rd] * 1e-9);
	}
	fig->tier_w = median(tw, rounds) * 1e-9;
	fig->tier_r = median(tr, rounds) * 1e-9;
	fig->od_w = median(ow, rounds) * 1e-9;
	fig->od_r = median(orr, rounds) * 1e-9;
	fig->file_w = median(fw, rounds) * 1e-9;
	fig->file_r = median(fr, rounds) * 1e-9;
	fig->read_op_kib = rd_ops ? (double)rd_bytes / (double)rd_ops / 1024 : 0;
	free(fw);
	free(fr);

	for (unsigned t = 0; t < nthreads; t++) {
		for (unsigned i = 0; i < batch; i++)
			free(w[t].dst[i]);
		free(w[t].dst);
		free(w[t].caps);
		free(w[t].res);
		free(w[t].m);
		free(w[t].src);
		free(w[t].rcs);
		uring_engine_destroy(w[t].ring);
	}
	free(w);
	free(objs);
	free(odbuf);
	tier_destroy(nv);
	if (slabs_before == 0)
		slab_files(dir, 1);
	for (int i = 0; i < NPAY; i++)
		free(pay[i]);
	free(tw);
	free(tr);
	free(ow);
	free(orr);
}

int main(int argc, char **argv)
{
	const char *dir = NULL;
	char tmpl[] = "/var/tmp/mkv-bench-tiers-XXXXXX";
	size_t nvme_mib = 0;
	unsigned batch = 64, nthreads = 2;
	int rounds = 3, steps = 50, lz4 = 0, no_gpu = 0, have_gpu = 0;
	struct gpu_fig g = { NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN,
			     0, 0, NAN, NAN, NAN };
	struct nvme_fig nf;
	struct utsname un;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--dir") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--nvme-mib") && i + 1 < argc)
			nvme_mib = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
			batch = (unsigned)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			nthreads = (unsigned)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			steps = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--lz4"))
			lz4 = 1;
		else if (!strcmp(argv[i], "--no-gpu"))
			no_gpu = 1;
		else {
			fprintf(stderr, "usage: %s [--dir DIR] [--nvme-mib N] "
				"[--batch N] [--threads N] [--rounds N] [--steps N] [--lz4] "
				"[--no-gpu]\n", argv[0]);
			return 2;
		}
	}
	if (batch < 1 || batch > 2048 || nthreads < 1 || nthreads > 64 ||
	    rounds < 1 || steps < 1)
		return 2;
	uname(&un);
	printf("bench/tiers: %s %s, %ld CPUs, CUDA build %d\n", un.nodename,
	       un.release, sysconf(_SC_NPROCESSORS_ONLN), MKV_HAVE_CUDA);

#if MKV_HAVE_CUDA
	have_gpu = !no_gpu && gpu_present();
	if (have_gpu) {
		run_gpu(&g, steps);
		printf("  %-34s %8.2f GB/s\n", "h2d_pinned (one cudaMemcpy)", g.h2d);
		printf("  %-34s %8.2f GB/s\n", "h2d_pinned, one 64 MiB copy",
		       g.h2d_big);
		printf("  %-34s %8.2f GB/s  %.2fx h2d  (%.2fx 64 MiB)\n",
		       "devmap fetch (selection on device)", g.devmap,
		       g.devmap / g.h2d, g.devmap / g.h2d_big);
		printf("  %-34s %8.1f us per call\n", "devmap sync (statistics)",
		       g.devmap_sync_us);
		printf("  %-34s %8.2f GB/s  %.2fx h2d  (%.2fx 64 MiB)\n",
		       "fetch_gather (defaults: kernel)", g.gather,
		       g.gather / g.h2d, g.gather / g.h2d_big);
		printf("  %-34s %8.2f GB/s  %.2fx h2d\n",
		       "fetch, 8 threads + kernel half", g.gather4,
		       g.gather4 / g.h2d);
		printf("  %-34s %8.2f GB/s  %.2fx h2d\n",
		       "fetch, 8 threads only", g.gather2, g.gather2 / g.h2d);
		printf("  %-34s %8.2f GB/s  %.2fx h2d\n",
		       "fetch_mapped + in-place read", g.mapped, g.mapped / g.h2d);
		printf("  %-34s %8.2f GB/s  %.2fx h2d\n",
		       "piece kernel alone (table read)", g.kernel, g.kernel / g.h2d);
		printf("  %-34s %8.1f us per fetch\n",
		       "store bookkeeping (fetch_mapped)", g.book_us);
		printf("  %-34s %8.2f GB/s  %.2fx h2d\n",
		       "piece kernel, table uploaded", g.kernel_up,
		       g.kernel_up / g.h2d);
		printf("  %-34s %8.2f GB/s  %.3fx h2d\n",
		       "per-block cudaMemcpyAsync", g.per_block,
		       g.per_block / g.h2d);
	}
#endif
	if (!have_gpu)
		printf("gpu: none (%s): GPU figures are nan\n",
		       MKV_HAVE_CUDA ? "no usable device" : "built without CUDA");
	(void)no_gpu;

	if (!nvme_mib)
		nvme_mib = have_gpu ? 2048 : 1024;
	if (!dir) {
		if (!mkdtemp(tmpl)) {
			perror("mkdtemp");
			return 1;
		}
		dir = tmpl;
	}
	run_nvme(&nf, dir, nvme_mib, batch, nthreads, rounds, lz4);
	if (dir == tmpl)
		rmdir(tmpl);
	printf("nvme: %s, %zu segments of %zu B on average (%.0f MiB), %u "
	       "threads x batch %u (queue depth %u), lz4 %s, median of %d "
	       "rounds\n", dir, nf.objs, nf.obj_len,
	       (double)nf.total / 1048576.0, nthreads, batch,
	       nthreads * batch, lz4 ? "on" : "off", rounds);
	printf("  %-34s %8.2f GB/s\n", "O_DIRECT 4 MiB pwrite+fdatasync", nf.od_w);
	printf("  %-34s %8.2f GB/s  %.2fx\n", "nvme tier putv (io_uring)",
	       nf.tier_w, nf.tier_w / nf.od_w);
	printf("  %-34s %8.2f GB/s\n", "O_DIRECT 4 MiB pread", nf.od_r);
	printf("  %-34s %8.2f GB/s  %.2fx  (%.0f KiB per read op: adjacent "
	       "frames merged)\n", "nvme tier getv (io_uring)",
	       nf.tier_r, nf.tier_r / nf.od_r, nf.read_op_kib);
	printf("  %-34s %8.2f GB/s  (tier %.2fx)\n",
	       "O_DIRECT per-file write QD1 (256)", nf.file_w,
	       nf.tier_w / nf.file_w);
	printf("  %-34s %8.2f GB/s  (tier %.2fx)\n",
	       "O_DIRECT per-file read QD1 (256)", nf.file_r,
	       nf.tier_r / nf.file_r);

	double wf = nf.tier_w / nf.od_w, rf = nf.tier_r / nf.od_r;

	printf("RESULT name=tiers gather_gbps=%.2f gather_frac_h2d=%.3f "
	       "host_fetch_gbps=%.2f host_fetch_frac_h2d=%.3f "
	       "nvme_frac_odirect=%.3f\n", g.devmap, g.devmap / g.h2d, g.gather,
	       g.gather / g.h2d, wf < rf ? wf : rf);
	return 0;
}
