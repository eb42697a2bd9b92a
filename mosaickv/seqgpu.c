/* SPDX-License-Identifier: MIT */
/*
 * The GPU mirror of a sequence (see include/mosaickv/sequence.h, "Where
 * attention runs").  The host pipeline (sequence.c) stays the source of
 * truth; the device holds, per (layer, KV head):
 *   - one device copy (struct dseg) per history segment, in the kernels'
 *     layout (gpu/seqbuf.cu: the host's rows as they are, bf16 or
 *     quantized to value_bits, and the key blocks' remainder bounds):
 *     final segments as uploaded images (made by the thread that encoded
 *     them: a store worker or prefill), pending and open segments as
 *     update buffers with spare capacity that new tokens are appended to
 *     on the device (gpu_append quantizes them as the host would);
 *   - per layer, a ring of the dense window (bf16), shared by the heads
 *     (all heads of a layer hold the same tokens).
 *
 * A device attend (caller thread, stream X) first brings the device up to
 * the host's state, then queues everything on X in this order:
 *   1. one H2D copy of a pinned staging area (per layer): the heads'
 *      descriptors, each head's history views (segments cut where the
 *      window starts, exactly as the CPU path cuts them), and the update
 *      buffers' new tokens;
 *   2. gpu_append of those tokens;
 *   3. the window ring's update (at most one D2D and one H2D 2-D copy);
 *   4. gpu_attend_packed;
 *   5. events: the staging may be rewritten once the copy is done; the next
 *      attend, if on another stream, waits for this one.
 * Swaps reach the device only here: apply_done() replaced the host's
 * segment and handed the temporary device copy to seqgpu_retire(), which
 * frees it on X at the next attend, after every kernel that read it.
 * The descriptors a step's kernels read are all in its own upload, so no
 * kernel ever sees a half-swapped history, and a segment is attended once,
 * in the form the host holds at that step.
 *
 * Memory comes from a pool owned by the sequence (stream-ordered
 * allocations; its release threshold keeps freed memory for reuse rather
 * than returning it to the driver).  Uploads from workers use the
 * thread's per-thread default stream and wait for it, so a device copy is
 * complete before the job publishes it.
 *
 * Threads: seqgpu_upload and seqgpu_drop run on any thread; everything
 * else on the sequence's caller thread.  g->bytes and g->upload_failed are
 * updated atomically.
 */
#include "mkv_config.h"

#include <stdlib.h>
#include <string.h>
#include "seq_internal.h"
#include "store_internal.h"

#if MKV_HAVE_CUDA
#include <cuda_runtime_api.h>
#include "gpu/gpu.cuh"

/* Tokens an update buffer may lag behind the host and still catch up by
 * gpu_append; further behind, it is uploaded again from the host copy. */
#define CATCHUP_MAX 256u
/* First capacity of an update buffer, in tokens (doubled as it grows). */
#define BUF_CAP0 1024u

struct dseg {
	void *mem;
	size_t bytes;
	struct gpu_seg g; /* g.n, g.n_blocks: tokens on the device */
	uint32_t cap;     /* token capacity */
};

/* A head's history views that the next attend of its layer may reuse:
 * segments [0, seg) are final and were wholly inside the history at the
 * last upload, and their views [0, views) are still in stage and in dreg
 * at the head's row.  Segments are only appended and only become final,
 * a final segment's device copy changes only when the sequence drops
 * them all (mkv_seq.dev_epoch), and the history only grows: so they are
 * that attend's first views too, unchanged.  At 1M tokens a layer has
 * ~2,000 views; rebuilding and uploading all of them every step cost more
 * host time than the step's kernels. */
struct vkeep {
	uint32_t seg, views, blocks;
	uint64_t tokens;
	int small;        /* every kept view keeps GPU_ATTN_SMALL_ROWS' promise */
	uint32_t maxb;    /* the kept views' largest n_blocks */
};

struct dlayer {
	char *stage;      /* pinned: what one attend uploads */
	char *dreg;       /* its device twin */
	size_t cap;       /* bytes of each */
	cudaEvent_t ev;   /* recorded after the upload out of stage */
	int ev_live, ev_rec;
	uint16_t *ring;   /* dense window, [2][H][wcap][d] bf16 (K, then V) */
	uint32_t wcap, wcount;
	uint64_t wfirst;  /* token held in ring row 0 */
	uint32_t vstride; /* views a head's row holds in stage and dreg */
	struct vkeep *keep; /* [H] */
	uint64_t epoch;   /* mkv_seq.dev_epoch that keep was made under */
};

struct seqgpu {
	int dev;
	uint32_t H, nq, d, window, layers, max_segment;
	uint32_t positions; /* mkv_seq_opts.device_positions */
	uint32_t sum8;      /* mkv_seq_opts.summary_bits == 8 */
	double frac;
	cudaMemPool_t pool;
	struct dlayer *L;
	void *ws;         /* attention scratch */
	size_t ws_bytes;
	void *aws;        /* append scratch */
	size_t aws_bytes;
	float *dq, *dout; /* for host-pointer attends */
	cudaEvent_t ev_last;
	/* An attend's uploads (staging -> dreg, the window ring) run on cs,
	 * after the previous attend of the same layer (its ev) and not after
	 * the other layers' kernels, so that they overlap the kernels of the
	 * layer before; the caller's stream waits for them (ev_up).  ev_x:
	 * where an attend allocated on the caller's stream, cs waits for
	 * that too. */
	cudaStream_t cs;
	cudaEvent_t ev_up, ev_x;
	int have_last;
	cudaStream_t last;
	struct dseg **ret; /* retired copies, freed at the next attend */
	size_t nret, capret;
	uint64_t bytes;         /* atomic */
	uint64_t upload_failed; /* atomic */
	/* Copies in store order (gpu_seg_schedule), atomic: live now (the
	 * attend looks for them only when there are any), made, and put back
	 * in channel order by an attend that could not run the small layout. */
	uint64_t nsched, ordered, unordered;
};

static int cu_errno(cudaError_t e)
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

/* A failed runtime call also leaves the thread's last error set, which the
 * kernels' launch checks (cudaGetLastError) would then report: clear it. */
static int cu_fail(cudaError_t e)
{
	(void)cudaGetLastError();
	return cu_errno(e);
}

#define CK(call)                                        \
	do {                                            \
		cudaError_t e_ = (call);                \
		if (e_ != cudaSuccess) {                \
			rc = cu_fail(e_);               \
			goto fail;                      \
		}                                       \
	} while (0)

static size_t al256(size_t x)
{
	return (x + 255) & ~(size_t)255;
}

static void bytes_add(struct seqgpu *g, size_t b)
{
	__atomic_fetch_add(&g->bytes, (uint64_t)b, __ATOMIC_RELAXED);
}

static void bytes_sub(struct seqgpu *g, size_t b)
{
	__atomic_fetch_sub(&g->bytes, (uint64_t)b, __ATOMIC_RELAXED);
}

static int dalloc(struct seqgpu *g, void **p, size_t bytes, cudaStream_t st)
{
	*p = NULL;
	cudaError_t e = cudaMallocFromPoolAsync(p, bytes ? bytes : 256, g->pool, st);
	if (e != cudaSuccess) {
		*p = NULL;
		return cu_fail(e);
	}
	return 0;
}

static void dfree(void *p, cudaStream_t st)
{
	if (p && cudaFreeAsync(p, st) != cudaSuccess)
		(void)cudaGetLastError();
}

/* Select the mirror's device on this thread; *prev gets the old one (or -1
 * when there was none to restore). */
static int dev_enter(const struct seqgpu *g, int *prev)
{
	*prev = -1;
	if (cudaGetDevice(prev) != cudaSuccess) {
		(void)cudaGetLastError();
		*prev = -1;
	}
	if (*prev == g->dev)
		return 0;
	cudaError_t e = cudaSetDevice(g->dev);
	if (e != cudaSuccess) {
		*prev = -1;
		return cu_fail(e);
	}
	return 0;
}

static void dev_leave(const struct seqgpu *g, int prev)
{
	if (prev >= 0 && prev != g->dev && cudaSetDevice(prev) != cudaSuccess)
		(void)cudaGetLastError();
}

int seqgpu_create(int dev, const struct mkv_seq_opts *o, struct seqgpu **out)
{
	*out = NULL;
	if (dev < 0 || !o->device_attend)
		return 0;
	if (!(o->d == 64 || o->d == 128) || o->store_dtype != MKV_DTYPE_BF16)
		return 0;
	if (!(o->q_per_kv == 1 || o->q_per_kv == 2 || o->q_per_kv == 3 ||
	      o->q_per_kv == 4 || o->q_per_kv == 8))
		return 0;
	if (gpu_device_ok() <= 0)
		return 0;
	struct seqgpu *g = calloc(1, sizeof(*g));
	if (!g)
		return -ENOMEM;
	g->L = calloc(o->layers, sizeof(*g->L));
	if (!g->L) {
		free(g);
		return -ENOMEM;
	}
	g->dev = dev;
	g->H = o->kv_heads;
	g->nq = o->q_per_kv;
	g->d = o->d;
	g->window = o->window;
	g->layers = o->layers;
	g->max_segment = o->max_segment;
	g->frac = o->token_frac;
	g->positions = o->device_positions;
	g->sum8 = o->summary_bits == 8;
	int prev;
	if (dev_enter(g, &prev))
		goto off;
	struct cudaMemPoolProps pp;
	memset(&pp, 0, sizeof pp);
	pp.allocType = cudaMemAllocationTypePinned;
	pp.handleTypes = cudaMemHandleTypeNone;
	pp.location.type = cudaMemLocationTypeDevice;
	pp.location.id = dev;
	if (cudaMemPoolCreate(&g->pool, &pp) != cudaSuccess) {
		(void)cudaGetLastError();
		dev_leave(g, prev);
		goto off;
	}
	uint64_t keep = UINT64_MAX;
	if (cudaMemPoolSetAttribute(g->pool, cudaMemPoolAttrReleaseThreshold, &keep) !=
		    cudaSuccess ||
	    cudaEventCreateWithFlags(&g->ev_last, cudaEventDisableTiming) != cudaSuccess) {
		(void)cudaGetLastError();
		cudaMemPoolDestroy(g->pool);
		dev_leave(g, prev);
		goto off;
	}
	if (cudaStreamCreateWithFlags(&g->cs, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaEventCreateWithFlags(&g->ev_up, cudaEventDisableTiming) != cudaSuccess ||
	    cudaEventCreateWithFlags(&g->ev_x, cudaEventDisableTiming) != cudaSuccess) {
		(void)cudaGetLastError();
		/* what was made of the three, made in this order */
		if (g->cs) {
			if (g->ev_up)
				cudaEventDestroy(g->ev_up);
			cudaStreamDestroy(g->cs);
		}
		cudaEventDestroy(g->ev_last);
		cudaMemPoolDestroy(g->pool);
		dev_leave(g, prev);
		goto off;
	}
	dev_leave(g, prev);
	*out = g;
	return 0;
off:
	/* The device refused the basics: run on the CPU, as without one. */
	free(g->L);
	free(g);
	return 0;
}

/* Bytes of value positions for @cap tokens of these views (a closed
 * segment, or an update buffer: gpu_append writes the positions of the
 * rows it appends; mkv_seq_opts.device_positions), 0 where they get none:
 * the formats the kernels' scatter takes (bf16 values, g 1, rows of <= 64
 * bytes). */
static size_t pos_bytes(const struct seqgpu *g, const struct mkv_packed_view *k,
			const struct mkv_packed_view *v, uint32_t cap)
{
	if (!g->positions || k->value_bits || v->value_bits || k->g != 1 ||
	    v->g != 1 || k->r > 32 || v->r > 32 || k->r == 0 || v->r == 0)
		return 0;
	return al256((size_t)cap * GPU_POS_STRIDE(k->r)) + al256((size_t)cap * GPU_POS_STRIDE(v->r));
}

/* Bytes of 8-bit summaries for a final segment's device copy
 * (mkv_seq_opts.summary_bits = 8; rows, then scales), 0 where it gets
 * none: other shapes (seq_sum8_ok), or not final (summaries that still
 * change keep the bound on both paths). */
static size_t sum8_bytes(const struct seqgpu *g, const struct mkv_packed_view *k, bool final)
{
	if (!g->sum8 || !final || !seq_sum8_ok(k->summary_channels) || k->n_blocks == 0)
		return 0;
	return al256((size_t)k->n_blocks * 2 * k->summary_channels) +
	       al256((size_t)k->n_blocks * sizeof(float));
}

/* Device copy of a K/V pair with room for @cap tokens (@final: a final
 * segment, given 8-bit summaries where the option asks); synchronous on
 * this thread's default stream. */
static struct dseg *dseg_make(struct seqgpu *g, const struct mkv_segment *k,
			      const struct mkv_segment *v, uint32_t cap, bool final, int *prc)
{
	cudaStream_t st = cudaStreamPerThread;
	struct dseg *x = calloc(1, sizeof(*x));
	size_t bytes = gpu_seg_cap_bytes(&k->v, &v->v, cap);
	size_t pbytes = bytes ? pos_bytes(g, &k->v, &v->v, cap) : 0;
	size_t sbytes = bytes ? sum8_bytes(g, &k->v, final) : 0;
	void *img = bytes ? malloc(bytes) : NULL;
	int rc = -ENOMEM;
	if (!x || !img) {
		rc = bytes ? -ENOMEM : -EINVAL;
		goto fail;
	}
	if ((rc = dalloc(g, &x->mem, bytes + pbytes + sbytes, st)))
		goto fail;
	/* An update buffer (growable segments) carries its projections, so
	 * rows appended on the device are the ones the CPU would append. */
	bool proj = k->proj_f32 && v->proj_f32;
	if ((rc = gpu_seg_image_proj(&k->v, &v->v, proj ? k->proj_f32 : NULL,
				     proj ? v->proj_f32 : NULL, cap, img, x->mem, &x->g)))
		goto fail;
	CK(cudaMemcpyAsync(x->mem, img, bytes, cudaMemcpyHostToDevice, st));
	if (pbytes) {
		/* the present rows' from the bitmaps just copied, behind them
		 * on the stream (a buffer's later rows: gpu_append) */
		uint8_t *kp = (uint8_t *)x->mem + bytes;
		uint8_t *vp = kp + al256((size_t)cap * GPU_POS_STRIDE(x->g.k_r));
		if (x->g.n &&
		    ((rc = gpu_seg_positions(x->g.k_bm, x->g.k_bw, x->g.k_dk, x->g.k_r, x->g.n, kp,
					     st)) ||
		     (rc = gpu_seg_positions(x->g.v_bm, x->g.v_bw, x->g.v_dk, x->g.v_r, x->g.n, vp,
					     st))))
			goto fail;
		x->g.k_pos = kp;
		x->g.v_pos = vp;
		/* A final segment the positions' path reads in the small
		 * layout gets its pairs in store order, in place: the same
		 * output with fewer shared-memory wavefronts (gpu/NOTES.md,
		 * forty-ninth session).  An attend that cannot run that layout
		 * puts it back first (unorder_layer).  A warp a block: the
		 * thread-a-block kernel took ~2 ms a segment at upload. */
		if (final && x->g.n && gpu_seg_schedulable(&x->g, g->d)) {
			struct gpu_seg o;
			if ((rc = gpu_seg_schedule_warp(&x->g, g->d, (uint16_t *)x->g.k_val,
							(uint16_t *)x->g.v_val, kp, vp, &o, st)))
				goto fail;
			x->g = o;
		}
	}
	if (sbytes) {
		/* from the bf16 summaries just copied, behind them */
		int8_t *rows = (int8_t *)x->mem + bytes + pbytes;
		float *sc = (float *)(rows + al256((size_t)x->g.n_blocks * 2 * x->g.S));
		if ((rc = gpu_seg_sum8(x->g.s_min, x->g.s_max, x->g.S, x->g.n_blocks, rows, sc, st)))
			goto fail;
		x->g.s8 = rows;
		x->g.s8_scale = sc;
	}
	CK(cudaStreamSynchronize(st));
	free(img);
	if (x->g.sched) {
		__atomic_fetch_add(&g->nsched, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&g->ordered, 1, __ATOMIC_RELAXED);
	}
	bytes += pbytes + sbytes;
	x->bytes = bytes;
	x->cap = cap;
	bytes_add(g, bytes);
	return x;
fail:
	if (x && x->mem) {
		dfree(x->mem, st);
		if (cudaStreamSynchronize(st) != cudaSuccess)
			(void)cudaGetLastError();
	}
	free(img);
	free(x);
	*prc = rc;
	return NULL;
}

struct dseg *seqgpu_upload(struct seqgpu *g, const struct mkv_segment *k,
			   const struct mkv_segment *v)
{
	if (!g || !k || !v)
		return NULL;
	int prev, rc = 0;
	struct dseg *x = NULL;
	if (dev_enter(g, &prev) == 0) {
		x = dseg_make(g, k, v, k->v.n, true, &rc);
		dev_leave(g, prev);
	}
	if (!x)
		__atomic_fetch_add(&g->upload_failed, 1, __ATOMIC_RELAXED);
	return x;
}

void seqgpu_drop(struct seqgpu *g, struct dseg *x)
{
	if (!g || !x)
		return;
	int prev;
	if (dev_enter(g, &prev) == 0) {
		dfree(x->mem, cudaStreamPerThread);
		dev_leave(g, prev);
	}
	bytes_sub(g, x->bytes);
	if (x->g.sched)
		__atomic_fetch_sub(&g->nsched, 1, __ATOMIC_RELAXED);
	free(x);
}

void seqgpu_retire(struct seqgpu *g, struct dseg *x)
{
	if (!g || !x)
		return;
	if (g->nret == g->capret) {
		size_t nc = g->capret ? 2 * g->capret : 64;
		struct dseg **p = realloc(g->ret, nc * sizeof(*p));
		if (!p) {
			/* No room to defer: wait for the last attend instead. */
			if (g->have_last && cudaEventSynchronize(g->ev_last) != cudaSuccess)
				(void)cudaGetLastError();
			seqgpu_drop(g, x);
			return;
		}
		g->ret = p;
		g->capret = nc;
	}
	g->ret[g->nret++] = x;
}

static void flush_retired(struct seqgpu *g, cudaStream_t st)
{
	for (size_t i = 0; i < g->nret; i++) {
		dfree(g->ret[i]->mem, st);
		bytes_sub(g, g->ret[i]->bytes);
		if (g->ret[i]->g.sched)
			__atomic_fetch_sub(&g->nsched, 1, __ATOMIC_RELAXED);
		free(g->ret[i]);
	}
	g->nret = 0;
}

void seqgpu_destroy(struct seqgpu *g)
{
	if (!g)
		return;
	int prev;
	int on = dev_enter(g, &prev) == 0;
	if (on) {
		cudaStream_t st = cudaStreamPerThread;
		/* Everything below may still be read by the last attend. */
		if (g->have_last && cudaEventSynchronize(g->ev_last) != cudaSuccess)
			(void)cudaGetLastError();
		if (cudaStreamSynchronize(g->cs) != cudaSuccess)
			(void)cudaGetLastError();
		flush_retired(g, st);
		dfree(g->ws, st);
		dfree(g->aws, st);
		dfree(g->dq, st);
		dfree(g->dout, st);
		for (uint32_t i = 0; i < g->layers; i++) {
			struct dlayer *D = &g->L[i];
			if (D->ev_live && D->ev_rec && cudaEventSynchronize(D->ev) != cudaSuccess)
				(void)cudaGetLastError();
			dfree(D->dreg, st);
			dfree(D->ring, st);
		}
		if (cudaStreamSynchronize(st) != cudaSuccess)
			(void)cudaGetLastError();
		for (uint32_t i = 0; i < g->layers; i++) {
			struct dlayer *D = &g->L[i];
			if (D->stage)
				cudaFreeHost(D->stage);
			if (D->ev_live)
				cudaEventDestroy(D->ev);
		}
		cudaEventDestroy(g->ev_last);
		cudaEventDestroy(g->ev_up);
		cudaEventDestroy(g->ev_x);
		cudaStreamDestroy(g->cs);
		cudaMemPoolDestroy(g->pool);
		(void)cudaGetLastError();
		dev_leave(g, prev);
	} else {
		for (size_t i = 0; i < g->nret; i++)
			free(g->ret[i]);
	}
	free(g->ret);
	for (uint32_t i = 0; i < g->layers; i++)
		free(g->L[i].keep);
	free(g->L);
	free(g);
}

uint64_t seqgpu_bytes(const struct seqgpu *g)
{
	return g ? __atomic_load_n(&g->bytes, __ATOMIC_RELAXED) : 0;
}

uint64_t seqgpu_upload_failed(const struct seqgpu *g)
{
	return g ? __atomic_load_n(&g->upload_failed, __ATOMIC_RELAXED) : 0;
}

void seqgpu_order_counts(const struct seqgpu *g, uint64_t *ordered, uint64_t *unordered)
{
	*ordered = g ? __atomic_load_n(&g->ordered, __ATOMIC_RELAXED) : 0;
	*unordered = g ? __atomic_load_n(&g->unordered, __ATOMIC_RELAXED) : 0;
}

int seqgpu_is_device_ptr(int dev, const void *p)
{
	(void)dev;
	struct cudaPointerAttributes a;
	memset(&a, 0, sizeof a);
	if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	return a.type == cudaMemoryTypeDevice;
}

int seqgpu_to_host(int dev, void *dst, const void *src, size_t len)
{
	(void)dev;
	/* The legacy stream: ordered after the caller's blocking streams. */
	cudaError_t e = cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost);
	return e == cudaSuccess ? 0 : cu_fail(e);
}

/* ---------------------------------------------------------------------- */
/* Device attend                                                           */

/* One segment of a head, final, pending or open, seen uniformly. */
struct sref {
	struct dseg **dev;
	const struct mkv_segment *k, *v;
	uint32_t start, len, id;
	int final, open;
};

static void sref_of(struct lh *l, size_t i, struct sref *r)
{
	if (i < l->nsegs) {
		struct hseg *h = &l->segs[i];
		*r = (struct sref){&h->dev, h->k, h->v, h->start, h->n, h->id, h->final, 0};
	} else {
		*r = (struct sref){&l->odev, l->ok, l->ov, l->ostart,
				   l->ok ? l->ok->v.n : 0, 0, 0, 1};
	}
}

static uint32_t buf_cap(uint32_t len, uint32_t max_segment)
{
	uint32_t c = BUF_CAP0;
	while (c < len + 64 && c < MKV_MAX_N)
		c *= 2;
	if (c > max_segment)
		c = max_segment;
	if (c > MKV_MAX_N)
		c = MKV_MAX_N;
	return c < len ? len : c;
}

/* Make sure segment @r of (@layer, @head) has a device copy that holds, or
 * can catch up by gpu_append to, its host tokens. */
static int seg_ready(struct mkv_seq *s, struct seqgpu *g, uint32_t layer,
		     uint32_t head, const struct sref *r)
{
	struct dseg *x = *r->dev;
	int rc = 0;
	if (r->len == 0)
		return 0;
	if (r->final) {
		if (x)
			return 0;
		/* Its upload failed when it was made: read it back. */
		struct mkv_segment *K = NULL, *V = NULL;
		struct mkv_seg_key kk = seq_key(s, layer, head, r->id, MKV_KIND_KEY);
		struct mkv_seg_key vk = seq_key(s, layer, head, r->id, MKV_KIND_VALUE);
		rc = mkv_store_get_segment(s->store, &kk, &K);
		if (rc == 0)
			rc = mkv_store_get_segment(s->store, &vk, &V);
		if (rc == 0)
			x = dseg_make(g, K, V, K->v.n, true, &rc);
		mkv_segment_destroy(K);
		mkv_segment_destroy(V);
		if (!x)
			return rc;
		*r->dev = x;
		return 0;
	}
	if (x && x->cap >= r->len && r->len - x->g.n <= CATCHUP_MAX)
		return 0;
	/* New, too small, or too far behind: upload the host's packed copy. */
	uint32_t cap = r->open ? buf_cap(r->len, g->max_segment) : r->len;
	struct dseg *y = dseg_make(g, r->k, r->v, cap, false, &rc);
	if (!y)
		return rc;
	seqgpu_retire(g, x);
	*r->dev = y;
	return 0;
}

/* Window ring plan of one attend: optionally move @keep rows from row
 * @src_row to the front, then write tokens [a, a + m) at row @count. */
struct wplan {
	uint64_t a;       /* first token to write */
	uint32_t m;       /* tokens to write */
	int compact;
	uint32_t keep;    /* rows a compaction keeps */
	uint64_t src_row; /* where they are before it */
	uint64_t first;   /* token of ring row 0 after the compaction */
	uint32_t count;   /* rows held after the compaction */
};

static void window_plan(const struct dlayer *D, uint64_t hist, uint64_t n,
			struct wplan *p)
{
	uint64_t end = D->wfirst + D->wcount;
	memset(p, 0, sizeof(*p));
	p->first = D->wfirst;
	p->count = D->wcount;
	if (D->wcount == 0 || hist < D->wfirst || end < hist || end > n) {
		p->first = hist;
		p->count = 0;
		p->a = hist;
	} else {
		p->a = end;
	}
	p->m = (uint32_t)(n - p->a);
	if (p->count + p->m > D->wcap) {
		/* Tokens [hist, a) move to the front.  Source and destination
		 * never overlap: keep = window - m at most and src_row =
		 * count - keep > wcap - window >= window + 64. */
		p->compact = 1;
		p->keep = (uint32_t)(p->a - hist);
		p->src_row = hist - p->first;
		p->first = hist;
		p->count = p->keep;
	}
}

static int grow_dev(struct seqgpu *g, void **p, size_t *have, size_t need,
		    cudaStream_t X)
{
	if (need <= *have)
		return 0;
	void *np;
	size_t nb = need + need / 4 + 4096;
	int rc = dalloc(g, &np, nb, X);
	if (rc)
		return rc;
	dfree(*p, X); /* kernels that used it are earlier on X */
	bytes_sub(g, *have);
	bytes_add(g, nb);
	*p = np;
	*have = nb;
	return 0;
}

static void to_bf16(uint16_t *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = mkv_f32_to_bf16(src[i]);
}

/* Nothing of the last upload is reused: every view is written again. */
static void keep_forget(struct dlayer *D, uint32_t H)
{
	memset(D->keep, 0, H * sizeof(*D->keep));
}

/* Every device copy of @layer in store order back in channel order, in
 * place on @X: after every earlier attend (chain() orders X after the
 * last one), before this one's kernels.  For good: the copies keep their
 * order from here on. */
static int unorder_layer(struct mkv_seq *s, struct seqgpu *g, uint32_t layer, cudaStream_t X)
{
	for (uint32_t h = 0; h < g->H; h++) {
		struct lh *l = seq_lh(s, layer, h);
		for (size_t i = 0; i <= l->nsegs; i++) {
			struct sref r;
			sref_of(l, i, &r);
			struct dseg *x = *r.dev;
			if (!x || !x->g.sched)
				continue;
			struct gpu_seg o;
			int rc = gpu_seg_unschedule(&x->g, g->d, &o, X);
			if (rc)
				return rc;
			x->g = o;
			__atomic_fetch_sub(&g->nsched, 1, __ATOMIC_RELAXED);
			__atomic_fetch_add(&g->unordered, 1, __ATOMIC_RELAXED);
		}
	}
	return 0;
}

/* What is queued on @X so far is the last work on the copies: an attend
 * on another stream waits for it (chain()).  A failed record leaves the
 * previous mark. */
static void mark_last(struct seqgpu *g, cudaStream_t X)
{
	if (cudaEventRecord(g->ev_last, X) == cudaSuccess) {
		g->have_last = 1;
		g->last = X;
	} else {
		(void)cudaGetLastError();
	}
}

static int attend_enqueue(struct mkv_seq *s, struct seqgpu *g, uint32_t layer,
			  const float *q, float *out, cudaStream_t X)
{
	const uint32_t H = g->H, d = g->d;
	struct dlayer *D = &g->L[layer];
	struct dseg **ix = NULL; /* the update buffers appended to */
	int rc = 0, copied = 0;
	int fresh = 0;      /* allocated on X here: cs waits for X */
	int up_pending = 0; /* uploads queued on cs that X does not wait for yet */
	const cudaStream_t C = g->cs;
	flush_retired(g, X);
	const uint32_t n = seq_lh(s, layer, 0)->n;
	const uint32_t w = n < g->window ? n : g->window, hist = n - w;

	/* 0. What the last upload left that this one reuses (struct vkeep). */
	if (!D->keep && !(D->keep = calloc(H, sizeof(*D->keep))))
		return -ENOMEM;
	if (D->epoch != s->dev_epoch) {
		keep_forget(D, H);
		D->epoch = s->dev_epoch;
	}

	/* 1. Device copies, and how much this attend uploads.  Kept segments
	 * are final with a device copy: nothing to do for them. */
	size_t nitems = 0;
	uint32_t n_new = 0, vneed = 0;
	for (uint32_t h = 0; h < H; h++) {
		struct lh *l = seq_lh(s, layer, h);
		if (l->n != n)
			return -EIO; /* heads of a layer always agree */
		if (D->keep[h].seg > l->nsegs)
			memset(&D->keep[h], 0, sizeof(D->keep[h])); /* never: segments only grow */
		if (l->nsegs + 1 > vneed)
			vneed = (uint32_t)l->nsegs + 1;
		for (size_t i = D->keep[h].seg; i <= l->nsegs; i++) {
			struct sref r;
			sref_of(l, i, &r);
			if (r.len == 0)
				continue;
			if ((rc = seg_ready(s, g, layer, h, &r)))
				return rc;
			struct dseg *x = *r.dev;
			if (!r.final && x->g.n < r.len) {
				nitems++;
				if (r.len - x->g.n > n_new)
					n_new = r.len - x->g.n;
			}
		}
	}
	if (vneed > D->vstride) {
		/* Rows move: every view is written again. */
		D->vstride = vneed + vneed / 8 + 8;
		keep_forget(D, H);
	}
	struct wplan wp;
	memset(&wp, 0, sizeof wp);
	if (w) {
		if (!D->ring) {
			D->wcap = 2 * g->window + 64;
			size_t rb = (size_t)2 * H * D->wcap * d * 2;
			if ((rc = dalloc(g, (void **)&D->ring, rb, X)))
				return rc;
			bytes_add(g, rb);
			fresh = 1;
			D->wcount = 0;
			D->wfirst = 0;
		}
		window_plan(D, hist, n, &wp);
		if (wp.first > hist || wp.first + wp.count + wp.m != n ||
		    wp.count + wp.m > D->wcap)
			return -EIO; /* the ring must end with token n - 1 */
	}

	/* 2. The staging layout: the heads, then a row of vstride views per
	 * head (kept views stay where they are), then the update buffers. */
	const size_t vsz = sizeof(struct gpu_seg), vrow = (size_t)D->vstride * vsz;
	size_t off_heads = 0;
	size_t off_segs = al256(sizeof(struct gpu_head) * H);
	size_t off_bufs = off_segs + al256(vrow * H);
	size_t off_caps = off_bufs + al256(sizeof(struct gpu_seg) * nitems);
	size_t off_knew = off_caps + al256(sizeof(uint32_t) * nitems);
	size_t tokb = (size_t)nitems * n_new * d * 2;
	size_t off_vnew = off_knew + al256(tokb);
	size_t main_bytes = off_vnew + al256(tokb);
	size_t off_win = main_bytes;
	size_t total = off_win + (size_t)2 * H * wp.m * d * 2;
	if (!D->ev_live) {
		CK(cudaEventCreateWithFlags(&D->ev, cudaEventDisableTiming));
		D->ev_live = 1;
	}
	/* The previous upload out of this staging must be done. */
	if (D->ev_rec)
		CK(cudaEventSynchronize(D->ev));
	if (total > D->cap) {
		size_t nc = total + total / 2 + 4096;
		char *ns = NULL;
		void *nd = NULL;
		CK(cudaHostAlloc((void **)&ns, nc, cudaHostAllocDefault));
		if ((rc = dalloc(g, &nd, nc, X))) {
			cudaFreeHost(ns);
			return rc;
		}
		if (D->stage)
			cudaFreeHost(D->stage);
		dfree(D->dreg, X);
		bytes_sub(g, D->cap);
		bytes_add(g, nc);
		D->stage = ns;
		D->dreg = nd;
		D->cap = nc;
		fresh = 1;
		keep_forget(D, H); /* both are new */
	}

	/* 3. Fill it: items and views, head by head; D->keep as it goes. */
	struct gpu_head *hh = (struct gpu_head *)(D->stage + off_heads);
	struct gpu_seg *bf = (struct gpu_seg *)(D->stage + off_bufs);
	uint32_t *cp = (uint32_t *)(D->stage + off_caps);
	uint16_t *kn = (uint16_t *)(D->stage + off_knew);
	uint16_t *vn = (uint16_t *)(D->stage + off_vnew);
	ix = nitems ? malloc(nitems * sizeof(*ix)) : NULL;
	if (nitems && !ix)
		return -ENOMEM;
	size_t it = 0;
	uint32_t max_segs = 0, max_blocks = 0, max_segb = 0;
	uint32_t col0 = D->vstride, col1 = 0; /* the view columns written */
	int small = 1; /* every view keeps GPU_ATTN_SMALL_ROWS' promise */
	for (uint32_t h = 0; h < H; h++) {
		struct lh *l = seq_lh(s, layer, h);
		struct vkeep k = D->keep[h];
		struct gpu_seg *sv = (struct gpu_seg *)(D->stage + off_segs + h * vrow);
		uint32_t nb = k.blocks, ns = k.views;
		uint64_t nh = k.tokens;
		int hsmall = k.views ? k.small : 1, growing = 1;
		uint32_t hmaxb = k.views ? k.maxb : 0;
		col0 = k.views < col0 ? k.views : col0;
		for (size_t i = k.seg; i <= l->nsegs; i++) {
			struct sref r;
			sref_of(l, i, &r);
			if (r.len == 0) {
				if (growing && r.final && i < l->nsegs)
					k.seg = (uint32_t)i + 1;
				else
					growing = 0;
				continue;
			}
			struct dseg *x = *r.dev;
			if (!x) {
				rc = -EIO; /* seg_ready made it, or it is kept */
				goto fail;
			}
			if (!r.final && x->g.n < r.len) {
				uint32_t a = x->g.n, cnt = r.len - a;
				if (r.start + a < l->raw_start) {
					rc = -EIO; /* raw rows of non-final tokens are kept */
					goto fail;
				}
				bf[it] = x->g;
				cp[it] = a + cnt;
				size_t row = r.start + a - l->raw_start;
				to_bf16(kn + it * n_new * d, l->rawk + row * d, (size_t)cnt * d);
				to_bf16(vn + it * n_new * d, l->rawv + row * d, (size_t)cnt * d);
				ix[it++] = x;
			}
			if (r.start >= hist) {
				growing = 0;
				continue;
			}
			if (r.start != nh) {
				rc = -EIO; /* the history must tile [0, hist) */
				goto fail;
			}
			uint32_t use = hist - r.start < r.len ? hist - r.start : r.len;
			struct gpu_seg vw = x->g;
			vw.n = use;
			vw.n_blocks = (use + vw.b - 1) / vw.b;
			vw.block0 = nb;
			hsmall &= gpu_seg_small_rows(&vw, d);
			hmaxb = vw.n_blocks > hmaxb ? vw.n_blocks : hmaxb;
			sv[ns++] = vw;
			nb += vw.n_blocks;
			nh += use;
			if (growing && r.final && use == r.len)
				k = (struct vkeep){(uint32_t)i + 1, ns, nb, nh, hsmall, hmaxb};
			else
				growing = 0;
		}
		if (nh != hist) {
			rc = -EIO; /* every token once: history then window */
			goto fail;
		}
		D->keep[h] = k;
		col1 = ns > col1 ? ns : col1;
		small &= hsmall;
		struct gpu_head gh;
		memset(&gh, 0, sizeof gh);
		gh.segs = (const struct gpu_seg *)(D->dreg + off_segs + h * vrow);
		gh.buf = NULL;
		gh.n_hist = nh;
		gh.nseg = ns;
		gh.n_blocks = nb;
		gh.win_n = w;
		gh.buf_cap_blocks = 0;
		if (w) {
			size_t r0 = hist - wp.first;
			gh.win_k = D->ring + ((size_t)h * D->wcap + r0) * d;
			gh.win_v = D->ring + ((size_t)(H + h) * D->wcap + r0) * d;
		}
		hh[h] = gh;
		max_segs = ns > max_segs ? ns : max_segs;
		max_blocks = nb > max_blocks ? nb : max_blocks;
		max_segb = hmaxb > max_segb ? hmaxb : max_segb;
	}
	/* A step that cannot run the small layout reads every row by its
	 * bitmap: copies in store order go back to channel order first, and
	 * every view of them, kept or written now, says so (all columns are
	 * uploaded again). */
	if (!small && __atomic_load_n(&g->nsched, __ATOMIC_RELAXED)) {
		rc = unorder_layer(s, g, layer, X);
		/* What it queued rewrites rows in place: a later attend on
		 * another stream must wait for it even if this one fails
		 * before its own event */
		mark_last(g, X);
		if (rc)
			goto fail;
		for (uint32_t h = 0; h < H; h++) {
			struct gpu_seg *sv = (struct gpu_seg *)(D->stage + off_segs + h * vrow);
			for (uint32_t j = 0; j < hh[h].nseg; j++)
				sv[j].sched = 0;
		}
		col0 = 0;
	}
	/* Window rows [a, n) of every head, K then V. */
	if (w && wp.m) {
		uint16_t *wr = (uint16_t *)(D->stage + off_win);
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t h = 0; h < H; h++) {
				struct lh *l = seq_lh(s, layer, h);
				if (wp.a < l->raw_start) {
					rc = -EIO; /* the window's raw rows are kept */
					goto fail;
				}
				const float *src = (kv ? l->rawv : l->rawk) +
						   (size_t)(wp.a - l->raw_start) * d;
				to_bf16(wr + ((size_t)kv * H + h) * wp.m * d, src, (size_t)wp.m * d);
			}
	}

	/* 4. Queue the step. */
	struct gpu_attn_args A;
	memset(&A, 0, sizeof A);
	A.n_heads = H;
	A.nq = g->nq;
	A.d = d;
	A.scale = 0.0f;
	A.token_frac = g->frac;
	A.max_segs = max_segs;
	A.max_blocks = max_blocks;
	A.max_buf_blocks = 0;
	A.max_seg_blocks = max_segb;
	A.max_win = g->window;
	A.quest_b = 0;
	A.q = q;
	A.out = out;
	A.flags = small ? GPU_ATTN_SMALL_ROWS : 0;
	{
		/* Scratch with headroom, so that it is not regrown every step
		 * as the history grows. */
		struct gpu_attn_args T = A;
		T.max_segs = max_segs + 16;
		T.max_blocks = max_blocks + max_blocks / 4 + 256;
		if ((rc = grow_dev(g, &g->ws, &g->ws_bytes, gpu_attn_ws_bytes(&A) >
				   g->ws_bytes ? gpu_attn_ws_bytes(&T) : 0, X)))
			goto fail;
	}
	A.ws = g->ws;
	A.ws_bytes = g->ws_bytes;
	if (nitems &&
	    (rc = grow_dev(g, &g->aws, &g->aws_bytes,
			   gpu_append_ws_bytes((uint32_t)nitems, n_new), X)))
		goto fail;
	/* 5. The uploads on cs (struct seqgpu): after the last attend of this
	 * layer, which read dreg and the ring (the host already waited for
	 * it: D->ev above), and after allocations made here on X.  The heads,
	 * the view columns written (rows of kept views start past them; a
	 * column past a row's views copies what nothing reads), the update
	 * buffers, the window ring. */
	if (fresh) {
		CK(cudaEventRecord(g->ev_x, X));
		CK(cudaStreamWaitEvent(C, g->ev_x, 0));
	}
	if (D->ev_rec)
		CK(cudaStreamWaitEvent(C, D->ev, 0));
	up_pending = 1;
	CK(cudaMemcpyAsync(D->dreg, D->stage, sizeof(struct gpu_head) * H,
			   cudaMemcpyHostToDevice, C));
	if (col1 > col0)
		CK(cudaMemcpy2DAsync(D->dreg + off_segs + col0 * vsz, vrow,
				     D->stage + off_segs + col0 * vsz, vrow, (col1 - col0) * vsz,
				     H, cudaMemcpyHostToDevice, C));
	if (main_bytes > off_bufs)
		CK(cudaMemcpyAsync(D->dreg + off_bufs, D->stage + off_bufs, main_bytes - off_bufs,
				   cudaMemcpyHostToDevice, C));
	if (w) {
		size_t pitch = (size_t)D->wcap * d * 2;
		if (wp.compact && wp.keep)
			CK(cudaMemcpy2DAsync(D->ring, pitch, D->ring + wp.src_row * d, pitch,
					     (size_t)wp.keep * d * 2, (size_t)2 * H,
					     cudaMemcpyDeviceToDevice, C));
		if (wp.m)
			CK(cudaMemcpy2DAsync(D->ring + (size_t)wp.count * d, pitch,
					     D->stage + off_win, (size_t)wp.m * d * 2,
					     (size_t)wp.m * d * 2, (size_t)2 * H,
					     cudaMemcpyHostToDevice, C));
		D->wfirst = wp.first;
		D->wcount = wp.count + wp.m;
	}
	CK(cudaEventRecord(g->ev_up, C));
	CK(cudaStreamWaitEvent(X, g->ev_up, 0));
	up_pending = 0;
	copied = 1;

	/* 6. The kernels, on X. */
	if (nitems) {
		struct gpu_append_args aa;
		memset(&aa, 0, sizeof aa);
		aa.n_buf = (uint32_t)nitems;
		aa.n_new = n_new;
		aa.d = d;
		aa.bufs = (struct gpu_seg *)(D->dreg + off_bufs);
		aa.cap = (const uint32_t *)(D->dreg + off_caps);
		aa.k_new = (const uint16_t *)(D->dreg + off_knew);
		aa.v_new = (const uint16_t *)(D->dreg + off_vnew);
		aa.overflow = NULL;
		aa.ws = g->aws;
		aa.ws_bytes = g->aws_bytes;
		if ((rc = gpu_append(&aa, X)))
			goto fail;
		/* Queued: the device holds these tokens from here on. */
		for (size_t i = 0; i < nitems; i++) {
			ix[i]->g.n = cp[i];
			ix[i]->g.n_blocks = (cp[i] + ix[i]->g.b - 1) / ix[i]->g.b;
		}
	}
	if ((rc = gpu_attend_packed(&A, (const struct gpu_head *)(D->dreg + off_heads), X)))
		goto fail;
fail:
	if (up_pending) {
		/* Uploads may be queued on cs: X waits for them before the
		 * events below say the staging is free again. */
		copied = 1;
		if (cudaEventRecord(g->ev_up, C) != cudaSuccess ||
		    cudaStreamWaitEvent(X, g->ev_up, 0) != cudaSuccess) {
			(void)cudaGetLastError();
			if (cudaStreamSynchronize(C) != cudaSuccess)
				(void)cudaGetLastError();
		}
	}
	if (rc && w)
		D->wcount = 0; /* rewritten in full by the next attend */
	if (rc)
		keep_forget(D, H); /* and every view */
	if (copied) {
		/* Whatever was queued reads the staging and the copies: the
		 * next attend must wait for it. */
		if (cudaEventRecord(D->ev, X) == cudaSuccess)
			D->ev_rec = 1;
		else
			(void)cudaGetLastError();
		mark_last(g, X);
	}
	free(ix);
	return rc;
}

/* Order this attend after the previous one when the stream changed. */
static int chain(struct seqgpu *g, cudaStream_t X)
{
	if (g->have_last && X != g->last) {
		cudaError_t e = cudaStreamWaitEvent(X, g->ev_last, 0);
		if (e != cudaSuccess)
			return cu_fail(e);
	}
	return 0;
}

int seqgpu_attend(struct mkv_seq *s, uint32_t layer, const float *q, float *out,
		  void *stream)
{
	struct seqgpu *g = s->gpu;
	cudaStream_t X = (cudaStream_t)stream;
	int prev, rc = dev_enter(g, &prev);
	if (rc)
		return rc;
	rc = chain(g, X);
	if (rc == 0)
		rc = attend_enqueue(s, g, layer, q, out, X);
	dev_leave(g, prev);
	if (rc == 0) {
		s->st.device_attends++;
		s->st.fetch_bytes_last = 0;
		s->st.attend_bytes_last = 0;
	}
	return rc;
}

int seqgpu_attend_host(struct mkv_seq *s, uint32_t layer, const float *q,
		       float *out, void *stream)
{
	struct seqgpu *g = s->gpu;
	cudaStream_t X = (cudaStream_t)stream;
	size_t qb = sizeof(float) * g->H * g->nq * g->d;
	int prev, rc = dev_enter(g, &prev);
	if (rc)
		return rc;
	if ((rc = chain(g, X)))
		goto out;
	if (!g->dq) {
		if ((rc = dalloc(g, (void **)&g->dq, qb, X)))
			goto out;
		if ((rc = dalloc(g, (void **)&g->dout, qb, X))) {
			dfree(g->dq, X);
			g->dq = NULL;
			goto out;
		}
		bytes_add(g, 2 * qb);
	}
	cudaError_t e = cudaMemcpyAsync(g->dq, q, qb, cudaMemcpyHostToDevice, X);
	if (e != cudaSuccess) {
		rc = cu_fail(e);
		goto out;
	}
	rc = attend_enqueue(s, g, layer, g->dq, g->dout, X);
	if (rc == 0) {
		e = cudaMemcpyAsync(out, g->dout, qb, cudaMemcpyDeviceToHost, X);
		if (e == cudaSuccess)
			e = cudaStreamSynchronize(X);
		if (e != cudaSuccess)
			rc = cu_fail(e);
	}
	if (rc == 0) {
		s->st.device_attends++;
		s->st.fetch_bytes_last = 0;
		s->st.attend_bytes_last = 0;
	}
out:
	dev_leave(g, prev);
	return rc;
}

#else /* !MKV_HAVE_CUDA */

int seqgpu_create(int dev, const struct mkv_seq_opts *o, struct seqgpu **out)
{
	(void)dev;
	(void)o;
	*out = NULL;
	return 0;
}

void seqgpu_destroy(struct seqgpu *g)
{
	(void)g;
}

struct dseg *seqgpu_upload(struct seqgpu *g, const struct mkv_segment *k,
			   const struct mkv_segment *v)
{
	(void)g;
	(void)k;
	(void)v;
	return NULL;
}

void seqgpu_drop(struct seqgpu *g, struct dseg *x)
{
	(void)g;
	(void)x;
}

void seqgpu_retire(struct seqgpu *g, struct dseg *x)
{
	(void)g;
	(void)x;
}

int seqgpu_attend(struct mkv_seq *s, uint32_t layer, const float *q, float *out,
		  void *stream)
{
	(void)s;
	(void)layer;
	(void)q;
	(void)out;
	(void)stream;
	return -MKV_ENODEV;
}

int seqgpu_attend_host(struct mkv_seq *s, uint32_t layer, const float *q,
		       float *out, void *stream)
{
	return seqgpu_attend(s, layer, q, out, stream);
}

uint64_t seqgpu_bytes(const struct seqgpu *g)
{
	(void)g;
	return 0;
}

uint64_t seqgpu_upload_failed(const struct seqgpu *g)
{
	(void)g;
	return 0;
}

void seqgpu_order_counts(const struct seqgpu *g, uint64_t *ordered, uint64_t *unordered)
{
	(void)g;
	*ordered = 0;
	*unordered = 0;
}

int seqgpu_is_device_ptr(int dev, const void *p)
{
	(void)dev;
	(void)p;
	return 0;
}

int seqgpu_to_host(int dev, void *dst, const void *src, size_t len)
{
	(void)dev;
	(void)dst;
	(void)src;
	(void)len;
	return -MKV_ENODEV;
}

#endif /* MKV_HAVE_CUDA */
