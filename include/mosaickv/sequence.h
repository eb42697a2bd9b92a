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
 * Prefill cuts the tokens into segments of opts.prefill_segment tokens,
 * each encoded at once with a strategy of its own; the remainder is a
 * segment of its own from opts.min_segment tokens up, else the last
 * segment's tail, and the open segment starts empty.  A decode segment
 * grows until the loss of its temporary compression (‖X − X̂‖_F / ‖X‖_F
 * of the channels its rows do not keep, dropped ones included, measured
 * on its own encoding as each token is packed) passes
 * opts.loss_threshold (after opts.min_segment tokens) or it reaches
 * opts.max_segment tokens; it then
 * closes and its raw copy goes to the store's worker threads, which choose
 * the final strategy (rotation, r, g, b) from the raw vectors, recompress,
 * put the final segment in the store and publish it.  The swap from
 * temporary to final happens on the caller's thread at the next append,
 * attend, flush or sync of that sequence: attention never sees a
 * half-swapped segment, and every token is attended exactly once.  The new
 * strategy becomes the default of the next decode segment.
 *
 * Back-pressure: the raw copies of tokens not yet finalized ("lag") are
 * bounded by opts.lag_cap bytes per sequence.  Once the open segments
 * hold half of it, each append closes the largest open segment of at
 * least opts.min_segment tokens and queues it to the workers, whatever its
 * loss (a fixed strategy's loss may never pass the threshold), so the
 * finalization stays off the caller's thread.  When an append would pass
 * the cap itself (workers paused or behind), the oldest pending segments
 * are finalized synchronously on the caller's thread (and, if none is
 * pending, the open segment is closed and finalized), so memory stays
 * bounded while decode keeps going.
 *
 * A failed finalization (the store refused the segment, out of memory)
 * loses nothing: the temporary segment stays in service, the failure is
 * counted in mkv_seq_stats, and it is retried at the next flush or sync.
 *
 * Where attention runs.  When the library is built with CUDA, the
 * store's HBM tier is on a device (mkv_store_opts.gpu) and the shape is
 * one the kernels take (d 64 or 128, q_per_kv 1, 2, 3, 4 or 8,
 * store_dtype BF16; opts.device_attend left at 1), the sequence keeps a
 * device copy of everything it attends over, in the kernels' layout: each
 * final segment is uploaded once, by the thread that encoded it (a store
 * worker, or prefill), and freed when it is replaced or closed; each
 * update buffer grows on the device, new tokens compressed there with the
 * segment's strategy (the host keeps its own packed copy for the CPU
 * path); the dense window is a ring on the device.  mkv_seq_attend_dev()
 * and mkv_seq_attend() with a stream then run PackedAttention on the GPU.
 * A swap becomes visible to the device at the next device attend, which
 * uploads the history's descriptors on the caller's stream before its
 * kernels, and frees the replaced copy in stream order after the last
 * attend that read it: no kernel ever sees a half-swapped segment, and
 * the device attends exactly the tokens the CPU path would.  Otherwise
 * everything runs on the CPU, as mkv_seq_stats.on_device says.
 *
 * Thread safety: one thread at a time per sequence (the one driving its
 * decode); different sequences may be driven from different threads at
 * once, on one store.  With opts.attend_threads > 1 a CPU-path attend
 * also runs on the sequence's own helper threads (its KV heads shared
 * out), all of them done before it returns.  Shapes: K, V and queries are row-major with the KV
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
	uint32_t r;              /* values per vector, 1..d_keep, a multiple
	                          * of g; 0 (default): the default budget,
	                          * about the bytes of d/4 bf16 values per
	                          * vector: at value_bits 6, r = 40 of 64 and
	                          * 82 of 128 (mkv_seq_default_r: the largest
	                          * r whose row fits d/2 bytes; d/4 with
	                          * value_bits 0).  Ignored when adaptive */
	uint32_t g;              /* group size.  Default 1.  With value_bits
	                          * 0, g = 2 (a bitmap bit a pair of channels)
	                          * decodes on the GPU with half the loads:
	                          * 7-12 % less decode time at 256K-1M tokens
	                          * on an H100, at a price in accuracy
	                          * (docs/PERF.md, docs/ACCURACY.md) */
	uint32_t b;              /* block size.  Default 16 */
	uint32_t drop;           /* 1: drop the 25% lowest-variance channels.
	                          * Default 0 (see docs/ACCURACY.md) */
	double loss_threshold;   /* relative loss target.  Default 0.3 */
	double var_threshold;    /* block-variance target.  Default 0.5 */
	enum mkv_dtype store_dtype; /* MKV_DTYPE_BF16 (default) or F32 */
	size_t lag_cap;          /* bytes of raw K/V awaiting finalization per
	                          * sequence, >= 1 MiB; open segments are
	                          * closed early from half of it (above).
	                          * Default 256 MiB */
	size_t staging_bytes;    /* fetch staging per sequence.  Default 64 MiB */
	uint32_t device_attend;  /* 1 (default): keep device copies and attend
	                          * on the GPU where possible (see the top of
	                          * this file); 0: never touch CUDA */
	/* Version 2 of this struct.  A caller passing version 1's size gets
	 * version 1's behaviour: adaptive = 1, value_bits = 0. */
	uint32_t value_bits;     /* 0: packed values in store_dtype; 4..8:
	                          * that many bits each plus one bf16 scale per
	                          * vector (mkv_encode_opts).  Default 6 */
	uint32_t adaptive;       /* 1: r, g and b chosen per segment from
	                          * loss_threshold and var_threshold (the
	                          * strategy generator); 0 (default): fixed */
	uint32_t summary_channels; /* S, rotated key channels bounded per
	                          * block, 1..d_keep; 0 (default): min(r, d/4).
	                          * The block score adds a bound on the rest,
	                          * so S trades score bytes for tightness
	                          * (docs/ACCURACY.md).  Version 1: S = r */
	/* Version 3 (a version-1 or -2 caller gets refine = 0). */
	double refine;           /* 0 (default) or 1: blocks chosen by their
	                          * bound score alone; f in (1, 16]: two-stage
	                          * selection (mkv_attn_opts.refine): the bound
	                          * names f x token_frac of the history, the
	                          * candidates' keys are fetched and scored,
	                          * the top token_frac attended.  The host path
	                          * only: a sequence with refine > 1 attends on
	                          * the CPU even with device copies, and
	                          * mkv_seq_attend_dev refuses it (-EINVAL) */
	/* Version 4 (earlier versions get 1). */
	uint32_t attend_threads; /* threads sharing the KV heads of a CPU-
	                          * path attend and of an append (each head's
	                          * token encoded into its open segment: the
	                          * decode thread's main cost, on the GPU
	                          * path too): the caller and up to this
	                          * many less one that the sequence starts at
	                          * open (no more than kv_heads in all), each
	                          * with its own fetch context of
	                          * staging_bytes.  Results do not depend on
	                          * it.  0 or 1 (default): the caller alone.
	                          * At most 64 */
	/* Version 5 (earlier versions get 0). */
	uint32_t device_positions; /* 1: device copies of segments and
	                          * update buffers whose halves both hold
	                          * bf16 values (value_bits 0), g 1 and at
	                          * most 32 values a vector also keep each
	                          * value's channel as a byte (r bytes a
	                          * vector, about 40 % more device bytes at
	                          * r = 32; a buffer's written as tokens are
	                          * appended), and the GPU attends them with
	                          * a scatter instead of ranking every
	                          * channel: 7-16 % less decode time at
	                          * 32K-1M tokens on the H200 (docs/PERF.md).
	                          * Other formats keep bitmaps alone.  A
	                          * final segment's copy with 16-token
	                          * blocks and at most 3 d / 4 kept channels
	                          * (drop) also has each block's values put
	                          * in the GPU's store order when it is
	                          * uploaded (mkv_seq_stats.device_ordered;
	                          * ~0.5 ms of GPU time a 16K-token segment
	                          * on an H100).
	                          * 0 (default): bitmaps alone.  Results are
	                          * the same */
	/* Version 6 (earlier versions get 16). */
	uint32_t summary_bits;   /* 16 (default): blocks scored by their bf16
	                          * summaries' bound.  8: final segments whose
	                          * S is 8, 16, 24 or 32 are scored in integers
	                          * on 8-bit summaries and an 8-bit rotated
	                          * query (mkv_attn_opts.summary_bits; the GPU
	                          * keeps the 8-bit summaries beside the bf16
	                          * ones, 2S + 4 bytes a block, and its score
	                          * stage is ~13 % shorter at 1M tokens on the
	                          * H200, docs/PERF.md), on the host and the
	                          * device path alike; the open and pending
	                          * segments keep the bound.  On the host path
	                          * (no device copies, or refine > 1) the
	                          * final segments keep their 8-bit rows in
	                          * host memory too (2S + 4 bytes a block,
	                          * made once by the workers: the host score
	                          * then takes under a quarter of the time
	                          * it takes making them per step,
	                          * bench/hostscore; the bf16 bound's is
	                          * faster still on the CPU).  Selection
	                          * moves little (docs/ACCURACY.md
	                          * "All-integer scores") */
};

MKV_API int mkv_seq_opts_init(struct mkv_seq_opts *o, size_t size);

/*
 * The r that r = 0 stands for at head dim @d, @value_bits and group size
 * @g: the largest multiple of g whose packed row fits d/2 bytes (the bytes
 * of d/4 bf16 values), d/4 with value_bits 0; capped at d_keep by
 * mkv_seq_open when channels are dropped.  0 for invalid arguments.
 */
MKV_API uint32_t mkv_seq_default_r(uint32_t d, uint32_t value_bits, uint32_t g);

struct mkv_seq;

/*
 * Open sequence @id on @store (which must outlive it).  Returns 0, or
 * -EINVAL (NULL, bad options: r > d_keep or r % g, value_bits not 0 or
 * 4..8, adaptive > 1, summary_channels > d_keep, a size no version of the
 * struct had; an id already open on this store is not detected here but
 * fails at the first put with -EEXIST), -ENOMEM.
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
 * Prefill @n tokens of @layer: @k and @v are [kv_heads][n][d] arrays of
 * @dt (F32, F16 or BF16), in host memory or, when the store's HBM is on a
 * device, in device memory (cudaMalloc: detected, and copied to the host
 * first by cudaMemcpy on the legacy default stream, so work writing them
 * on a non-blocking stream must have finished).  Allowed once per layer,
 * before any append to it.  The prefill segments are encoded in parallel
 * by the store's workers and the calling thread (which does them all
 * itself if the workers are busy), and uploaded to the device when the
 * sequence attends there.  Returns 0, or
 * -EINVAL (NULL, bad layer or dtype, n == 0, the layer already holds
 * tokens), -MKV_ENONFINITE, -ENOSPC (the store is full), -ENOMEM, -EIO (a
 * failed copy from the device); on error the layer holds nothing.
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
 * the same shape, both in host memory.  Selects blocks on the summaries
 * and runs PackedAttention over the selected blocks of the history (final,
 * pending and open segments) and the dense window.
 * @stream NULL: on the CPU, fetching the selected blocks of stored
 * segments from their tiers (the only path without a device; the stats'
 * fetch and attend byte counts describe it).  When the store's HBM is on
 * a device its fetches hand out device addresses, so this path then reads
 * the stored segments it selected from back whole instead
 * (mkv_store_get_segment): correct, but meant for checks, not speed.
 * @stream a cudaStream_t (cudaStreamLegacy for the legacy default stream)
 * and the sequence on the device (mkv_seq_stats.on_device): on the GPU, as
 * mkv_seq_attend_dev() with copies of @q and @out, returning once @out is
 * written (the stream is synchronized); otherwise the CPU path.
 * Both paths attend the same tokens with the same selection rule; they
 * differ only by rounding (the device packs new tokens itself and keeps
 * the window in bf16).
 * Returns 0, or -EINVAL (NULL, bad layer, no tokens), -MKV_ENONFINITE,
 * -ENOMEM, an error of the store's fetch, or of the device path (as
 * mkv_seq_attend_dev).  With refine > 1 the CPU path runs: both stages
 * fetch from the store at once (the candidates' K and V blocks), so its
 * fetch_bytes count refine x the budget's blocks.
 */
MKV_API int mkv_seq_attend(struct mkv_seq *s, uint32_t layer, const float *q,
			   float *out, void *stream);

/*
 * Decode attention of @layer on the GPU, asynchronously on @stream (a
 * cudaStream_t of the store's device; NULL is the legacy default stream):
 * @q and @out are device pointers to [kv_heads*q_per_kv][d] floats (@q is
 * not checked for NaN).
 * Before its kernels, the call makes the device copy current (swaps
 * published since the last call, tokens appended since, the window) and
 * uploads the history's descriptors, all in stream order; @out is written
 * when the stream reaches the end of the call's work.  @q must stay
 * valid, and @out untouched, until then.  Successive device attends of one
 * sequence are ordered even across streams: a call on another stream than
 * the previous one first makes its stream wait for the previous call.
 * The call cannot be captured in a CUDA graph (it uploads this step's
 * descriptors from pinned staging and may wait for the previous upload
 * of the same layer to finish).  The calling thread's current device is
 * left as it was.  Device memory is held by the sequence until
 * mkv_seq_close().  Returns 0 (work queued), or -EINVAL (NULL pointers,
 * bad layer, no tokens), -MKV_ENODEV (the sequence is not on the device:
 * see on_device), -ENOMEM (device or pinned memory), -EIO (another CUDA
 * error), or an error of the store when a final segment's device copy had
 * to be read back from it.
 */
MKV_API int mkv_seq_attend_dev(struct mkv_seq *s, uint32_t layer,
			       const float *q, float *out, void *stream);

/*
 * Close the open segment of every KV head of @layer (all layers when
 * @layer is UINT32_MAX) now and queue its finalization, and retry failed
 * ones.  Returns 0 or -EINVAL.
 */
MKV_API int mkv_seq_flush(struct mkv_seq *s, uint32_t layer);

/*
 * Layer offload, the way an engine's offloaded cache keeps only the layer
 * it computes in device memory, mapped onto the store's tiers.
 *
 * mkv_seq_offload asks the store to move @layer's final segments that sit
 * in the top tier down to pinned host memory (mkv_store_move, run by the
 * store's workers).  Decode attention then fetches only the blocks it
 * selects from there.  Segments not yet final (the prefill segments being
 * encoded, pending and open decode segments) are the sequence's own and
 * stay where they are; pinned or moving segments are skipped.  Returns the
 * number of moves submitted (0 when there is nothing to move), or -EINVAL
 * (NULL, bad layer, or the store has no host tier), -ENOMEM.  A move that
 * fails leaves its segment where it was (counted in offload_failed).
 *
 * mkv_seq_prefetch asks the store to bring into its top tier, ahead of
 * @layer's next attend, the blocks @layer's last attend selected in final
 * segments (mkv_store_prefetch: the predicted selection; where the policy
 * admits them they are copied into the HBM hot-block cache).  Only the CPU
 * attend path (mkv_seq_attend without a stream) records selections: a
 * sequence that attends on the GPU reads its own device copies and has
 * nothing to prefetch.  Returns the number of blocks asked for (K and V
 * counted apart; 0 when there is no prediction), or -EINVAL, -ENOMEM.
 *
 * Both return at once; mkv_seq_sync() and mkv_seq_close() wait for what
 * they submitted.  Caller thread, as the rest of a sequence's calls.
 */
MKV_API int mkv_seq_offload(struct mkv_seq *s, uint32_t layer);
MKV_API int mkv_seq_prefetch(struct mkv_seq *s, uint32_t layer);

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
	uint64_t attend_bytes_last; /* K/V/summary bytes the last attend read
	                             * (CPU path) */
	uint32_t on_device;         /* 1: device copies kept, GPU attends */
	uint64_t device_bytes;      /* device memory held by the sequence */
	uint64_t device_upload_failed; /* final segments whose upload failed
	                                * (read back from the store later) */
	uint64_t device_attends;    /* attends run on the GPU */
	/* Version 2 of this struct (a version-1 caller passes its size and
	 * gets the fields it knows). */
	uint64_t offload_moves;     /* segment moves mkv_seq_offload submitted */
	uint64_t offload_failed;    /* of those, failed (the segment stayed) */
	uint64_t prefetch_blocks;   /* blocks mkv_seq_prefetch asked for */
	uint64_t prefetch_failed;   /* prefetch requests that failed */
	/* Version 3. */
	uint64_t device_ordered;    /* final segments whose device copy holds
	                             * each block's values in the order the
	                             * GPU stores them (device_positions, bf16
	                             * values, r <= 32, g 1, b 16, drop: 3 d /
	                             * 4 kept channels): the same output, 2-7 %
	                             * less attention time on the H100
	                             * (docs/PERF.md) */
	uint64_t device_unordered;  /* of those, put back in channel order
	                             * (once, on the attend's stream) because
	                             * an attend of their layer met a segment
	                             * in a format the positions' layout does
	                             * not take (adaptive strategies with r >
	                             * 32, say) */
};

/* Fill *@st (st->size set by the caller: this version's size or an
 * earlier one's).  Returns 0 or -EINVAL. */
MKV_API int mkv_seq_get_stats(struct mkv_seq *s, struct mkv_seq_stats *st);

#ifdef __cplusplus
}
#endif
#endif
