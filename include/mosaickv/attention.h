/* SPDX-License-Identifier: MIT */
/*
 * mosaickv — decode attention for one KV head and its group of query heads,
 * on the CPU.  These are the reference implementations that the GPU kernels
 * are tested against, and usable as they are on machines without a GPU.
 *
 * A KV head's context is a history of encoded segments (oldest first) plus a
 * dense recent window of tokens not yet encoded.  Three modes:
 *   dense   exact attention over every token;
 *   quest   Quest: score each block of b dense keys by its channel-wise
 *           min/max bound, keep the top blocks, exact attention on them;
 *   packed  MosaicKV PackedAttention: the same block selection on the
 *           segments' rotated, channel-compressed summaries, attention on the
 *           packed K/V of the selected blocks.
 * Selection: the first block of the history (the attention sink) and the
 * whole window are always attended.  Besides them, blocks are taken in
 * descending score until the selected history tokens reach
 * ceil(token_frac × history tokens).  With GQA a block's score is the
 * largest of its query heads' scores: one selection per KV head, so each
 * block is read once for the whole group.
 * All arithmetic is float with fp32 accumulation; softmax is online across
 * blocks and segments, and values are accumulated in each segment's rotated
 * V space and rotated back once per segment.
 */
#ifndef MOSAICKV_ATTENTION_H
#define MOSAICKV_ATTENTION_H

#include <mosaickv/common.h>
#include <mosaickv/compress.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MKV_MAX_QHEADS 64 /* query heads per KV head */

struct mkv_attn_opts {
	size_t size;         /* sizeof(struct mkv_attn_opts) */
	uint32_t n_q;        /* query heads sharing this KV head, 1..64.  Default 1 */
	uint32_t d;          /* head dim: 64, 128 or 256.  Default 128 */
	float scale;         /* softmax scale; 0 = 1/sqrt(d).  Default 0 */
	double token_frac;   /* share of history tokens selected, in (0, 1];
	                      * 1 selects every block.  Default 0.1 */
	uint32_t quest_b;    /* Quest's block size: 8, 16, 32 or 64.  Default 16 */
	/* Version 2 (a caller passing version 1's size gets refine = 0). */
	double refine;       /* 0 or 1: blocks by their bound score alone.
	                      * f in (1, 16]: two stages.  The bound names
	                      * blocks until f x the budget's tokens are
	                      * candidates; their packed keys then score them
	                      * exactly (softmax mass over the candidates,
	                      * summed over the n_q heads) and the budget is
	                      * filled from the top.  Reads the keys of f x
	                      * the budget, attends the budget.  CPU paths
	                      * only (the GPU ones refuse it).  Default 0 */
	/* Version 3 (a caller passing an earlier size gets 16). */
	uint32_t summary_bits; /* 16: blocks scored by the bound above, on
	                        * the summaries as stored.  8: on 8-bit
	                        * summaries and an 8-bit rotated query, summed
	                        * in integers (mkv_score8: no longer a bound;
	                        * docs/ACCURACY.md "All-integer scores").
	                        * Default 16 */
};

MKV_API int mkv_attn_opts_init(struct mkv_attn_opts *o, size_t size);

/* Dense K and V of n tokens, each n × d row-major in @dtype. */
struct mkv_dense_kv {
	const void *k;
	const void *v;
	enum mkv_dtype dtype;
	size_t n;
};

/* What a call attended; every field is filled on success. */
struct mkv_attn_stats {
	size_t blocks_total;    /* history blocks */
	size_t blocks_selected; /* history blocks attended (sink included) */
	size_t tokens_attended; /* history tokens attended + window tokens */
	size_t bytes_read;      /* K/V/summary/rotation bytes the step read */
};

/* A selected block: segment index in the history and block index in it. */
struct mkv_block_ref {
	uint32_t seg;
	uint32_t block;
};

/*
 * Exact attention of the @o->n_q queries @q (n_q × d floats) over all @kv->n
 * tokens, into @out (n_q × d floats).  Returns 0, or -EINVAL (NULL, bad
 * options, n == 0, bad dtype), -MKV_ENONFINITE (NaN/Inf in q).  @out is
 * written only on success.
 */
MKV_API int mkv_attend_dense(const struct mkv_attn_opts *o, const float *q,
			     const struct mkv_dense_kv *kv, float *out);

/*
 * Quest over the dense history @hist (blocks of o->quest_b tokens, bounds
 * over all d channels) plus the window @win (may be NULL or empty).  @st may
 * be NULL.  Errors as mkv_attend_dense; at least one token must exist.
 */
MKV_API int mkv_attend_quest(const struct mkv_attn_opts *o, const float *q,
			     const struct mkv_dense_kv *hist,
			     const struct mkv_dense_kv *win, float *out,
			     struct mkv_attn_stats *st);

/*
 * PackedAttention over @nseg segment pairs (@k[i] a KEY segment and @v[i] a
 * VALUE segment of the same n and d; @nseg may be 0) plus the window @win
 * (may be NULL).  Segments are borrowed for the call.  @st may be NULL.
 * Returns 0, -EINVAL (NULL, bad options, no tokens at all, a K segment
 * that is not a key segment), -MKV_ESHAPE (a pair with different n, or d
 * different from o->d), -MKV_ENONFINITE, -ENOMEM.
 */
MKV_API int mkv_attend_packed(const struct mkv_attn_opts *o, const float *q,
			      const struct mkv_segment *const *k,
			      const struct mkv_segment *const *v, size_t nseg,
			      const struct mkv_dense_kv *win, float *out,
			      struct mkv_attn_stats *st);

/*
 * Block scores of one key segment for the n_q queries @q: @scores receives
 * n_blocks floats, score[j] = max over heads h of
 * Σ_{c<S} max(q'_hc · min_jc, q'_hc · max_jc) + |q_⊥h| · rest_j with
 * q'_h = R q_h (o->summary_bits = 8: mkv_score8 on mkv_query8(q'_h) and
 * mkv_summary8's rows).
 * Returns 0, -EINVAL, -MKV_ESHAPE, -MKV_ENONFINITE.
 */
MKV_API int mkv_score_blocks(const struct mkv_attn_opts *o, const float *q,
			     const struct mkv_segment *k, float *scores);

/*
 * The selection mkv_attend_packed() makes over @k[0..nseg) by the bound
 * (with o->refine > 1: its first stage, at refine x token_frac; the
 * second needs the packed keys and is not applied here): writes up to
 * @cap refs into @sel, ordered by (seg, block), and returns how many blocks
 * are selected (which may exceed @cap; then only @cap are written).
 * Returns -EINVAL, -MKV_ESHAPE, -MKV_ENONFINITE, -ENOMEM on failure.
 */
MKV_API int64_t mkv_select_blocks(const struct mkv_attn_opts *o,
				  const float *q,
				  const struct mkv_segment *const *k,
				  size_t nseg, struct mkv_block_ref *sel,
				  size_t cap);

/*
 * The 8-bit scores (o->summary_bits = 8).  Integer rounding everywhere a
 * GPU can repeat it exactly: the GPU score kernel's results equal
 * mkv_score8's bit for bit for the same quantized query.
 *
 * A block's summaries to 8 bits: a = the largest |min_c|, |max_c| over its
 * S channels, scale = a / 127 rounded up to bf16 (1 where a is 0), then
 * min_c -> floor(min_c / scale) and max_c -> ceil(max_c / scale), each
 * clamped to [-127, 127].  mkv_summary8 writes every block of the key
 * segment @k: @rows (n_blocks × 2S: the S minima, then the S maxima) and
 * @scale (n_blocks).  Returns 0, or -EINVAL (NULL, not a key segment, S
 * of 0) or -MKV_ENONFINITE (a summary NaN or infinite).  Nothing is
 * written on failure.
 */
MKV_API int mkv_summary8(const struct mkv_segment *k, int8_t *rows, float *scale);

/*
 * Keep the key segment @k's 8-bit rows (mkv_summary8's, and their scales)
 * with the segment, made once here: 8-bit scoring of @k (mkv_score_blocks,
 * mkv_select_blocks, mkv_attend_packed with o->summary_bits = 8) then
 * reads them instead of making each block's row on every call (on the CPU
 * the score then takes under a quarter of the time: bench/hostscore).  The
 * scores are the same bits either way; a block whose summaries are not
 * finite keeps no row and is scored as without.  Costs 2S + 4 bytes a
 * block until mkv_segment_destroy (not counted by mkv_segment_bytes, not
 * serialized).  It writes @k: call it before @k is shared between threads;
 * readers then need no lock.  Returns 0 (also when they are kept already),
 * -EINVAL (NULL, not a key segment, S of 0 or over 256), -ENOMEM (nothing
 * kept).
 */
MKV_API int mkv_segment_keep_summary8(struct mkv_segment *k);

/*
 * A rotated query's first @S channels @qr to 8 bits: *@scale = the largest
 * |qr_c| / 127 (1 where all are 0), qi_c = rint(qr_c / scale) clamped to
 * [-127, 127].  Returns 0, -EINVAL (NULL, S of 0 or over 256) or
 * -MKV_ENONFINITE; nothing is written on failure.
 */
MKV_API int mkv_query8(const float *qr, uint32_t S, int8_t *qi, float *scale);

/*
 * One block's 8-bit score for @nq query heads: per head h, with integer
 * sum I_h = Σ_c max(qi_hc, 0)·max_c + min(qi_hc, 0)·min_c over the row's
 * S channels (@qi: nq × S, @qscale: nq), s_h = (qscale_h · @scale) · I_h,
 * plus qperp_h · @rest where @qperp (nq floats) is given, each product
 * and sum rounded once in that order; *@score = max over h.  @row is one
 * block of mkv_summary8's rows.  Returns 0, -EINVAL (NULL, nq of 0 or
 * over MKV_MAX_QHEADS, S of 0 or over 256).
 */
MKV_API int mkv_score8(uint32_t nq, uint32_t S, const int8_t *qi, const float *qscale,
		       const float *qperp, const int8_t *row, float scale, float rest,
		       float *score);

#ifdef __cplusplus
}
#endif
#endif
