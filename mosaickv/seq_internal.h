/* SPDX-License-Identifier: MIT */
/*
 * The inside of a sequence, shared by the host pipeline (sequence.c) and
 * its GPU mirror (seqgpu.c).  Never installed.
 */
#ifndef MKV_SEQ_INTERNAL_H
#define MKV_SEQ_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include "internal.h"
#include <mosaickv/sequence.h>

struct dseg;   /* a segment's device copy (seqgpu.c) */
struct seqgpu; /* a sequence's GPU mirror (seqgpu.c) */

/* One history segment of one (layer, KV head). */
struct hseg {
	struct mkv_segment *k, *v; /* full (pending) or skeleton (final) */
	struct dseg *dev;          /* device copy, or NULL (GPU off, or not
				    * made yet: made at the next device attend) */
	uint32_t start, n;         /* token range */
	uint32_t id;               /* segment index in the store key */
	uint8_t final;             /* in the store; k/v hold no values */
	uint8_t queued;            /* a finalization job is in flight */
};

/* A strategy to compress new tokens with: full d × d rotations (the first
 * d_keep rows are used), r, g, b. */
struct strat {
	float *Rk, *Rv;
	uint32_t rk, rv, gk, gv, b;
};

struct lh {
	struct hseg *segs;
	size_t nsegs, cap;
	size_t first_unfinal;       /* no segment before it is pending:
	                             * segments are only appended, and only
	                             * become final (lh_first_unfinal) */
	/* The open segment (update buffer). */
	struct mkv_segment *ok, *ov;
	size_t okcap, ovcap;
	struct dseg *odev;          /* its device copy (as hseg.dev) */
	uint32_t ostart;
	struct strat open;          /* the open segment's strategy */
	struct strat next;          /* strategy for the next open segment */
	/* The open segment's loss under its own encoding (open_should_close):
	 * its tokens' Σ‖x‖² (ek, ev) and the energy the encoding loses (lk,
	 * lv): the groups each vector does not keep (seg_grow_append) and
	 * the dropped channels, by the rotation's last d - d_keep rows
	 * (dropk_t, dropv_t, transposed for mkv_rotate_t; NULL without a
	 * drop). */
	double ek, lk, ev, lv;
	float *dropk_t, *dropv_t;
	/* Raw float copies of tokens [raw_start, n). */
	float *rawk, *rawv;
	size_t raw_start, raw_cap;
	/* The blocks the last CPU attend selected in final segments, the
	 * predicted selection mkv_seq_prefetch hands the store: per entry a
	 * segment id and a run of pred_blocks. */
	uint32_t *pred_id, *pred_n, *pred_blocks;
	size_t npred, pred_cap, npblocks, pblocks_cap;
	uint32_t n;                 /* tokens held */
	uint32_t next_id;
};

/* A finished finalization, published to the caller thread. */
struct done {
	struct done *next;
	uint32_t layer, head, id;
	int status;
	struct mkv_segment *k, *v; /* skeletons on success */
	struct dseg *dev;          /* device copy of the final segment */
	struct strat st;           /* the final strategy on success */
};

struct attend_pool;

struct mkv_seq {
	struct mkv_store *store;
	struct mkv_seq_opts o;
	uint64_t id;
	uint32_t d_keep;
	struct lh *lh;               /* layers × kv_heads */
	struct mkv_fetch *fetch;
	struct attend_pool *pool;    /* NULL: the caller attends every head */
	struct seqgpu *gpu;          /* NULL: attention on the CPU only */
	uint64_t dev_epoch;          /* bumped when final segments' device
				      * copies are dropped (seqgpu's kept
				      * views); caller thread */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct done *done;           /* under lock */
	uint32_t inflight;           /* under lock */
	uint32_t tier_ops;           /* store moves and prefetches submitted
				      * and not completed; under lock */
	struct mkv_seq_stats st;
	uint64_t step;
};

/* Whether a final segment of S summary channels is scored in 8 bits
 * under mkv_seq_opts.summary_bits = 8: the shapes the device's score
 * kernel takes (gpu_seg's s8), so that both paths score alike. */
static inline bool seq_sum8_ok(uint32_t S)
{
	return S >= 8 && S <= 32 && S % 8 == 0;
}

static inline struct lh *seq_lh(struct mkv_seq *s, uint32_t layer, uint32_t head)
{
	return &s->lh[(size_t)layer * s->o.kv_heads + head];
}

static inline struct mkv_seg_key seq_key(const struct mkv_seq *s, uint32_t layer,
					 uint32_t head, uint32_t id, enum mkv_kind kind)
{
	return (struct mkv_seg_key){.seq = s->id, .layer = layer, .head = head,
				    .seg = id, .kind = (uint32_t)kind};
}

/* ---------------------------------------------------------------------- */
/* The GPU mirror (seqgpu.c).  Built without CUDA, seqgpu_create() leaves
 * it off and the rest are never reached (or do nothing).                  */

/*
 * Make the mirror of a sequence with options @o whose store's HBM is on
 * CUDA device @dev (-1: none).  *@out stays NULL, with 0 returned, when
 * the GPU path does not apply: built without CUDA, dev < 0,
 * o->device_attend == 0, no usable device, or a shape the kernels do not
 * take (d not 64 or 128, q_per_kv not 1, 2, 3, 4 or 8, store_dtype not
 * BF16).  Returns 0 or -ENOMEM.
 */
int seqgpu_create(int dev, const struct mkv_seq_opts *o, struct seqgpu **out);
/* Wait for the last device attend, free every device copy retired or
 * still listed, and the mirror.  Caller thread.  NULL is accepted. */
void seqgpu_destroy(struct seqgpu *g);

/* Device copy of a full (not stripped) segment pair, synchronous, from
 * any thread; NULL if @g is NULL or on failure (counted). */
struct dseg *seqgpu_upload(struct seqgpu *g, const struct mkv_segment *k,
			   const struct mkv_segment *v);
/* Free a device copy no attend has used.  Any thread; NULL is accepted. */
void seqgpu_drop(struct seqgpu *g, struct dseg *x);
/* Free a device copy an attend may still be reading: in stream order at
 * the next device attend, or at destroy.  Caller thread; NULL accepted. */
void seqgpu_retire(struct seqgpu *g, struct dseg *x);

/* Device attention of @layer: @q and @out device pointers, on @stream.
 * Caller thread, after apply_done.  Returns 0 or -errno. */
int seqgpu_attend(struct mkv_seq *s, uint32_t layer, const float *q, float *out,
		  void *stream);
/* The same with host @q and @out: copies, runs, waits for @stream. */
int seqgpu_attend_host(struct mkv_seq *s, uint32_t layer, const float *q,
		       float *out, void *stream);

/* Device bytes held and failed uploads, for the stats. */
uint64_t seqgpu_bytes(const struct seqgpu *g);
uint64_t seqgpu_upload_failed(const struct seqgpu *g);
/* Final segments' device copies put in store order, and of those, put
 * back by an attend (mkv_seq_stats.device_ordered, _unordered). */
void seqgpu_order_counts(const struct seqgpu *g, uint64_t *ordered, uint64_t *unordered);

/* 1 if @p is device memory the host cannot read (a cudaMalloc pointer),
 * 0 otherwise (host memory, or no CUDA).  Only asked when @dev >= 0. */
int seqgpu_is_device_ptr(int dev, const void *p);
/* Synchronous copy of @len bytes of device memory to the host: 0 or
 * -errno. */
int seqgpu_to_host(int dev, void *dst, const void *src, size_t len);

#endif
