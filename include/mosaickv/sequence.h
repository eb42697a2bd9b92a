/* SPDX-License-Identifier: MIT */
/*
 * mosaickv — sequences: the KV cache of one request, layer by layer, with
 * heterogeneous double compression buffering.
 *
 * Per (layer, KV head) a sequence holds, oldest first:
 *   final segments      compressed with their own strategy and kept in the
 *                       store's tiers (only their rotations and block
 *                       summaries stay in the sequence, for scoring);
 *   pending segments    closed decode segments still in their temporary
 *                       compression, waiting for a worker to finalize them;
 *   the open segment    the update buffer: each new token is compressed at
 *                       once with the current strategy and appended;
 * and the last `window` tokens are also kept dense and always attended.
 *
 * Prefill cuts the tokens into fixed-size segments encoded at once (the
 * remainder starts the open segment).  A decode segment grows until the
 * loss of its temporary compression passes opts.loss_threshold (after
 * opts.min_segment tokens) or it reaches opts.max_segment tokens; it then
 * closes and its raw copy goes to the store's worker threads, which choose
 * the final strategy (rotation, r, g, b) from the raw vectors, recompress,
 * put the final segment in the store and publish it.  The swap from
 * temporary to final happens on the caller's thread at the next append,
 * attend, flush or sync of that sequence: attention never sees a
 * half-swapped segment, and every token is attended exactly once.  The new
 * strategy becomes the default of the next decode segment.
 *
 * Back-pressure: the raw copies of tokens not yet finalized ("lag") are
 * bounded by opts.lag_cap bytes per sequence.  When an append would pass
 * it, the oldest pending segments are finalized synchronously on the
 * caller's thread (and, if none is pending, the open segment is closed and
 * finalized), so memory stays bounded while decode keeps going.
 *
 * A failed finalization (the store refused the segment, out of memory)
 * loses nothing: the temporary segment stays in service, the failure is
 * counted in mkv_seq_stats, and it is retried at the next flush or sync.
 *
 * Thread safety: one thread at a time per sequence (the one driving its
 * decode); different sequences may be driven from different threads at
 * once, on one store.  Shapes: K, V and queries are row-major with the KV
 * head (or query head) outermost: prefill K is [kv_heads][n][d], an
 * appended token is [kv_heads][d], queries and outputs are
 * [kv_heads * q_per_kv][d] floats, query head h belonging to KV head
 * h / q_per_kv.
 */
#ifndef MOSAICKV_SEQUENCE_H
#define MOSAICKV_SEQUENCE_H

#include <mosaickv/common.h>
#include <mosaickv/compress.h>
#include <mosaickv/attention.h>
#include <mosaickv/store.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mkv_seq_opts {
	size_t size;             /* sizeof(struct mkv_seq_opts), set by _init */
	uint32_t layers;         /* 1..1024.  Default 32 */
	uint32_t kv_heads;       /* 1..256.  Default 8 */
	uint32_t q_per_kv;       /* query heads per KV head, 1..64.  Default 4 */
	uint32_t d;              /* head dim: 64, 128, 256.  Default 128 */
	uint32_t prefill_segment;/* tokens per prefill segment, 64..65536.
	                          * Default 4096 */
	uint32_t min_segment;    /* a decode segment closes on loss only from
	                          * this many tokens, 1..max.  Default 256 */
	uint32_t max_segment;    /* decode segment cap, ..65536.  Default 65536 */
	uint32_t window;         /* recent tokens attended dense, 0..4096.
	                          * Default 64 */
	double token_frac;       /* history share selected, (0, 1].  Default 0.1 */
	uint32_t r;              /* values per vector; 0 (default): chosen per
	                          * segment from loss_threshold */
	uint32_t g;              /* group size when r != 0.  Default 1 */
	uint32_t b;              /* block size when r != 0.  Default 16 */
	uint32_t drop;           /* 1: drop the 25% lowest-variance channels.
	                          * Default 0 (see docs/ACCURACY.md) */
	double loss_threshold;   /* relative loss target.  Default 0.3 */
	double var_threshold;    /* block-variance target.  Default 0.5 */
	enum mkv_dtype store_dtype; /* MKV_DTYPE_BF16 (default) or F32 */
	size_t lag_cap;          /* bytes of raw K/V awaiting finalization per
	                          * sequence, >= 1 MiB.  Default 256 MiB */
	size_t staging_bytes;    /* fetch staging per sequence.  Default 64 MiB */
};

MKV_API int mkv_seq_opts_init(struct mkv_seq_opts *o, size_t size);

struct mkv_seq;

/*
 * Open sequence @id on @store (which must outlive it).  Returns 0, or
 * -EINVAL (NULL, bad options, r > d or r % g, an id already open on this
 * store is not detected here but fails at the first put with -EEXIST),
 * -ENOMEM.
 */
MKV_API int mkv_seq_open(struct mkv_store *store, const struct mkv_seq_opts *o,
			 uint64_t id, struct mkv_seq **out);

/*
 * Wait for the sequence's pending work, remove its segments from the store
 * and free it.  NULL is accepted.  Returns 0, or the first error met while
 * removing (the sequence is freed regardless).
 */
MKV_API int mkv_seq_close(struct mkv_seq *s);

/*
 * Prefill @n tokens of @layer: @k and @v are [kv_heads][n][d] host arrays
 * of @dt (F32, F16 or BF16).  Allowed once per layer, before any append to
 * it.  Returns 0, or -EINVAL (NULL, bad layer or dtype, n == 0, the layer
 * already holds tokens), -MKV_ENONFINITE, -ENOSPC (the store is full),
 * -ENOMEM; on error the layer holds nothing.
 */
MKV_API int mkv_seq_prefill(struct mkv_seq *s, uint32_t layer, const void *k,
			    const void *v, enum mkv_dtype dt, size_t n);

/*
 * Append one decode token to @layer of each of the @n sequences: @k and
 * @v are [n][kv_heads][d] of @dt.  All sequences must share kv_heads and
 * d.  Returns 0, or -EINVAL, -MKV_ESHAPE (sequences of different shapes),
 * -MKV_ENONFINITE (nothing appended to any sequence), -ENOSPC (a segment
 * reached 65536 tokens without closing: cannot happen with max_segment
 * at its bound), -ENOMEM.  Sequences before the failing one keep their
 * token.
 */
MKV_API int mkv_seq_append(struct mkv_seq *const *seqs, size_t n,
			   uint32_t layer, const void *k, const void *v,
			   enum mkv_dtype dt);

/*
 * Decode attention of @layer: @q is [kv_heads*q_per_kv][d] floats, @out
 * the same shape.  Selects blocks on the summaries, fetches the selected
 * blocks of stored segments from their tiers, and runs PackedAttention
 * over them, the pending and open segments and the dense window.
 * @stream is a cudaStream_t for the GPU path (NULL: the CPU path; this
 * build runs attention on the CPU).  Returns 0, or -EINVAL (NULL, bad
 * layer, no tokens), -MKV_ENONFINITE, -ENOMEM, or an error of the store's
 * fetch.
 */
MKV_API int mkv_seq_attend(struct mkv_seq *s, uint32_t layer, const float *q,
			   float *out, void *stream);

/*
 * Close the open segment of every KV head of @layer (all layers when
 * @layer is UINT32_MAX) now and queue its finalization, and retry failed
 * ones.  Returns 0 or -EINVAL.
 */
MKV_API int mkv_seq_flush(struct mkv_seq *s, uint32_t layer);

/*
 * Wait until every finalization queued for @s has finished, then publish
 * the finished ones (the swap).  Returns 0, or -EINVAL.
 */
MKV_API int mkv_seq_sync(struct mkv_seq *s);

struct mkv_seq_stats {
	size_t size;             /* set by the caller: sizeof(*st) */
	uint64_t tokens;         /* tokens of layer 0 */
	uint64_t swaps;          /* temporary segments replaced by final ones */
	uint64_t finalize_failed;/* finalizations that failed (kept temporary) */
	int64_t last_error;      /* negative errno of the last failure, or 0 */
	uint64_t lag_tokens;     /* tokens not yet finalized, over all layers
	                          * and heads */
	uint64_t lag_bytes;      /* their raw copies */
	uint64_t max_lag_bytes;  /* high-water mark of lag_bytes */
	uint64_t sync_finalized; /* finalized on the caller's thread by
	                          * back-pressure */
	uint32_t queue_depth;    /* finalizations queued or running */
	uint64_t segments_final, segments_pending;
	uint64_t fetch_bytes_last;  /* bytes of selected blocks the last
	                             * attend read from below the top tier */
	uint64_t fetch_bytes_total;
	uint64_t attend_bytes_last; /* K/V/summary bytes the last attend read */
};

/* Fill *@st (st->size set by the caller).  Returns 0 or -EINVAL. */
MKV_API int mkv_seq_get_stats(struct mkv_seq *s, struct mkv_seq_stats *st);

#ifdef __cplusplus
}
#endif
#endif
