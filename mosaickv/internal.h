/* SPDX-License-Identifier: MIT */
/* Internal definitions of the compression core; never installed. */
#ifndef MKV_CORE_INTERNAL_H
#define MKV_CORE_INTERNAL_H

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <mosaickv/compress.h>
#include <mosaickv/attention.h>

#define MKV_HIDDEN __attribute__((visibility("hidden")))

struct mkv_segment {
	struct mkv_packed_view v; /* pointers below, exported read-only */
	void *values;
	uint8_t *bitmaps;
	void *rotation;
	void *sum_min;
	void *sum_max;
	void *sum_rest;
	float *rot_f32; /* rotation expanded to float once, d_keep × d */
	/* Growable segments: the projection appends encode with (d_keep × d,
	 * mkv_rot_projection of rot_f32); NULL otherwise. */
	float *proj_f32;
	float *proj_t; /* proj_f32 transposed (d × d_keep), for mkv_rotate_t */
	/* A key segment that no longer changes (a sequence's final
	 * skeletons, or a caller's after mkv_segment_keep_summary8): its
	 * blocks' 8-bit rows, made once by seg_make_sum8
	 * (n_blocks × 2S bytes: mkv_summary8's) and their scales (NaN for a
	 * block with a non-finite summary: scored by the bound).  NULL
	 * otherwise; the 8-bit score then makes each row per step.  Never
	 * set on a segment that can still grow: its last block's summaries
	 * change. */
	int8_t *sum8;
	float *sum8_scale;
};

/*
 * Make @k's 8-bit rows once (struct mkv_segment's sum8), before @k is
 * shared with any reader: attend threads read them without a lock.
 * Returns 0 (also when they exist), -EINVAL (not a key segment, no
 * summaries, more than 256 summary channels, or a growable segment),
 * -ENOMEM (nothing set).
 */
MKV_HIDDEN int seg_make_sum8(struct mkv_segment *k);

/*
 * Growable segments (segment.c), for the update buffer of a decode segment.
 * Created empty with o->rotation (required) fixing the strategy; each
 * append compresses rows at once.  *cap is the caller-held row capacity
 * (start at 0).  @lost (may be NULL) gains, for each appended row, the
 * energy of the rotated groups its encoding does not keep (Σ of their
 * squares, in group order, in double): with the rows' Σ‖x‖² and the
 * dropped channels' energy, the relative loss of the segment's own
 * encoding.  Returns 0, -EINVAL, -MKV_ENONFINITE (nothing appended),
 * -ENOSPC past MKV_MAX_N rows, -ENOMEM (nothing appended).
 */
MKV_HIDDEN int seg_grow_create(const struct mkv_encode_opts *o,
			       struct mkv_segment **out);
MKV_HIDDEN int seg_grow_append(struct mkv_segment *s, size_t *cap,
			       const float *x, size_t n, double *lost);
/* Make room for @rows rows in total; then appends up to @rows cannot fail
 * but on non-finite input.  Returns 0, -ENOSPC, -ENOMEM. */
MKV_HIDDEN int seg_grow_reserve(struct mkv_segment *s, size_t rows,
				size_t *cap);

/*
 * Attention over selected blocks wherever they are (attention.c).  @k and
 * @v give the segments' shape, rotation and summaries (their values and
 * bitmaps need not be present); block @blocks[i] of the segment has its
 * packed K at kaddr[i] and V at vaddr[i].  Blocks ascending.
 */
struct blk_addr {
	const void *values;
	const uint8_t *bitmaps;
};
struct attn_src {
	const struct mkv_segment *k, *v;
	uint32_t n_sel;
	const uint32_t *blocks;
	const struct blk_addr *kaddr, *vaddr;
	/* Scaled scores of the selected rows already computed (the second
	 * stage's, reused: the same products in the same order), n_q per
	 * token in block then row order; NULL: attend_blocks scores them. */
	const float *ksc;
};
/* Block @block's packed values and bitmaps in an in-memory segment. */
MKV_HIDDEN struct blk_addr seg_block_addr(const struct mkv_segment *s,
					  uint32_t block);
MKV_HIDDEN int attend_blocks(const struct mkv_attn_opts *o, const float *q,
			     const struct attn_src *src, size_t nsrc,
			     const struct mkv_dense_kv *win, float *out,
			     struct mkv_attn_stats *st);
/* The selection of mkv_attend_packed over @k[0..nseg): mask[] per block in
 * (seg, block) order.  Returns 0, -EINVAL, -ENOMEM. */
MKV_HIDDEN int attn_select(const struct mkv_attn_opts *o, const float *q,
			   const struct mkv_segment *const *k, size_t nseg,
			   uint8_t *mask);
/* attn_select with o->summary_bits = 8 applied to segment i only where
 * use8[i] is set (NULL: to all); a sequence scores its final segments in
 * 8 bits, as its device copies do (mkv_seq_opts.summary_bits). */
MKV_HIDDEN int attn_select8(const struct mkv_attn_opts *o, const float *q,
			    const struct mkv_segment *const *k, size_t nseg,
			    uint8_t *mask, const uint8_t *use8);
/* Validate attention options and queries as the public entries do. */
MKV_HIDDEN int attn_check(const struct mkv_attn_opts *o, const float *q);
/* o->refine, 0 for a version-1 struct. */
MKV_HIDDEN double attn_refine(const struct mkv_attn_opts *o);
/* The share of the history the first stage selects: token_frac, times
 * refine when that is > 1 (at most 1). */
MKV_HIDDEN double attn_stage1_frac(const struct mkv_attn_opts *o);
/*
 * The second stage of a refined selection (o->refine > 1): @src holds the
 * first stage's candidates (their packed K at kaddr, readable here); keep
 * the sink and the blocks of most attention mass until o->token_frac of
 * the history, dropping the others from @src in place (its blocks, kaddr
 * and vaddr arrays must be the caller's own, writable), and point each
 * source's ksc at the kept rows' scores in *@ksc_mem (the caller frees it
 * after attend_blocks).  Nothing happens for refine <= 1 (*@ksc_mem
 * NULL).  Returns 0 or -ENOMEM (src unchanged).
 */
MKV_HIDDEN int attn_refine_sel(const struct mkv_attn_opts *o, const float *q,
			       struct attn_src *src, size_t nsrc, float **ksc_mem);

/* Decode row @t of packed rows starting at @vals/@bms (a whole segment's
 * arrays, or one block's) into v->d_keep floats, rotated space. */
MKV_HIDDEN void packed_unpack_row(const struct mkv_packed_view *v,
				  const void *vals, const uint8_t *bms,
				  size_t t, float *dst);

/*
 * The @nq dot products of packed row @t with the rotated queries @qt
 * (d_keep rows of @nq floats: qt[c * nq + h] = q'_h[c]) into @out, as
 * attention.c's dot() over the unpacked row computes them: channel c's
 * product added to partial c % 8 in channel order, the partials summed in
 * dot's tree.  The row is not widened: its zero channels are skipped, and
 * their products (+-0) would have left a partial as it was (partials start
 * at +0 and never become -0), so the results are the same bits.  Returns
 * false (nothing written) where the row is not g = 1 with quantized or
 * bf16 values, or @nq is 0 or over MKV_MAX_QHEADS.
 */
MKV_HIDDEN bool packed_dot_row(const struct mkv_packed_view *v, const void *vals,
			       const uint8_t *bms, size_t t, const float *qt, uint32_t nq,
			       float *out);

/*
 * Free a segment's packed values and bitmaps, keeping its shape, rotation
 * and summaries: what a sequence keeps of a segment that lives in the
 * store.  Only attend_blocks() may read a stripped segment.
 */
MKV_HIDDEN void seg_strip(struct mkv_segment *s);

/* dtype.c */
MKV_HIDDEN bool mkv_dtype_valid(enum mkv_dtype dt);
/* Inline: it sits in the inner loops of scoring and decoding. */
static inline float mkv_bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, sizeof f);
	return f;
}
MKV_HIDDEN uint16_t mkv_f32_to_bf16(float f);      /* nearest, ties to even */
MKV_HIDDEN uint16_t mkv_f32_to_bf16_down(float f); /* toward -inf */
MKV_HIDDEN uint16_t mkv_f32_to_bf16_up(float f);   /* toward +inf */
MKV_HIDDEN float mkv_f16_to_f32(uint16_t h);
MKV_HIDDEN uint16_t mkv_f32_to_f16(float f);
/* Convert n elements of @dt at @src to float; returns false if any is
 * NaN or Inf (dst is then partially written). */
MKV_HIDDEN bool mkv_load_f32(float *dst, const void *src, enum mkv_dtype dt,
			     size_t n);
/* Store n floats into @dst as @dt (F32 or BF16), rounding to nearest. */
MKV_HIDDEN void mkv_store(void *dst, const float *src, enum mkv_dtype dt,
			  size_t n);
/* Read element i of an F32 or BF16 array. */
static inline float mkv_elem(const void *p, enum mkv_dtype dt, size_t i)
{
	if (dt == MKV_DTYPE_F32)
		return ((const float *)p)[i];
	return mkv_bf16_to_f32(((const uint16_t *)p)[i]);
}
MKV_HIDDEN bool mkv_all_finite(const float *x, size_t n);

/*
 * The norm of @x (d channels) outside its first S rotated channels @xr:
 * sqrt(max(0, |x|² - |x'_{0..S-1}|²)), sums in channel order.  For a key,
 * what the block's S-channel bounds leave out of every q·x; for a query,
 * the factor of that remainder in the block score (the GPU sums alike).
 */
static inline float mkv_rest_norm(const float *x, uint32_t d, const float *xr,
				  uint32_t S)
{
	float nx = 0.0f, ns = 0.0f;
	for (uint32_t c = 0; c < d; c++)
		nx += x[c] * x[c];
	for (uint32_t c = 0; c < S; c++)
		ns += xr[c] * xr[c];
	float r = nx - ns;
	return sqrtf(r > 0.0f ? r : 0.0f);
}

/* The same for a key, summed in double: the block's remainder bound.  The
 * difference cancels where a key lies almost wholly in its S channels,
 * and float sums over d = 256 squares left ~1e-3 |x| there (queries keep
 * the float sums above, which the GPU's scores repeat bit for bit). */
static inline float mkv_key_rest_norm(const float *x, uint32_t d, const float *xr,
				      uint32_t S)
{
	double nx = 0.0, ns = 0.0;
	for (uint32_t c = 0; c < d; c++)
		nx += (double)x[c] * x[c];
	for (uint32_t c = 0; c < S; c++)
		ns += (double)xr[c] * xr[c];
	double r = nx - ns;
	return (float)sqrt(r > 0.0 ? r : 0.0);
}

/* Options validation shared by the entry points. */
MKV_HIDDEN bool mkv_d_valid(uint32_t d);
MKV_HIDDEN bool mkv_g_valid(uint32_t g);
MKV_HIDDEN bool mkv_b_valid(uint32_t b);
static inline uint32_t mkv_d_keep(uint32_t d, uint32_t drop)
{
	return drop ? d - d / 4 : d;
}
/* Versioned-options helper: @size must cover at least @min bytes and at
 * most @max (what this library knows). */
static inline bool mkv_opts_size_ok(size_t size, size_t min, size_t max)
{
	return size >= min && size <= max;
}

/*
 * Top-@k selection over @m non-negative energies @e: sets sel[j] = 1 for the
 * k largest (ties go to the lower index), 0 elsewhere.  @tmp holds m floats.
 */
MKV_HIDDEN void mkv_topk_mask(const float *e, uint32_t m, uint32_t k,
			      uint8_t *sel, float *tmp);

/* Sort @n non-negative finite floats descending, in place. */
MKV_HIDDEN void mkv_sort_desc(float *v, uint32_t n);
/* The same by quicksort with an insertion finish: what mkv_sort_desc does
 * outside 25..256 elements (and did for every length before its radix
 * passes; bench/append times the two). */
MKV_HIDDEN void mkv_sort_desc_quick(float *v, uint32_t n);

/* Covariance XᵀX of n float rows of dimension d, added to @cov (d × d,
 * double, full symmetric).  Returns 0 or -ENOMEM (cov untouched). */
MKV_HIDDEN int mkv_cov_accumulate(double *cov, const float *x, size_t n,
				   uint32_t d);
/* XᵀX with exact products and double sums throughout (the incremental
 * statistics), added to the upper triangle of @cov (row-major: element
 * (a, b), b >= a, at a * d + b); the lower triangle is neither read nor
 * written (mkv_eigen_rows reads the upper one).  One row is added as its
 * own rank-1 update (the bits SYRK gives for it).  @scratch: NULL, or
 * min(n, 512) × d doubles for more than one row (then it cannot fail).
 * Returns 0 or -ENOMEM (cov untouched). */
MKV_HIDDEN int mkv_cov_accumulate_f64(double *cov, const float *x, size_t n,
				      uint32_t d, double *scratch);
/* The rotation mkv_strategy_choose picks for @n finite float rows (d × d
 * into @R, the same bits), without the loss and variance tables it also
 * builds: for callers whose r, g and b are fixed.  Returns 0, -ENOMEM,
 * -MKV_ELAPACK. */
MKV_HIDDEN int mkv_rotation_of(const float *x, size_t n, uint32_t d, float *R);

/* RT (d × m) = the transpose of R (m × d), both row-major. */
MKV_HIDDEN void mkv_transpose(const float *R, uint32_t m, uint32_t d, float *RT);
/* y = R x for one vector x of d floats, R's m rows given transposed (RT,
 * d × m: mkv_transpose).  Each output is x[0] R[j][0] + x[1] R[j][1] + ...
 * added in channel order, one rounding a step, whatever m is: a vector
 * rotated alone or in a chunk, and by R's first m or all rows, gets the
 * same bits for the same row of R (unlike BLAS, whose order depends on
 * the shape and the build). */
MKV_HIDDEN void mkv_rotate_t(const float *RT, uint32_t m, uint32_t d,
			     const float *x, float *y);
/* mkv_rotate_t's build for CPUs without AVX2 (which mkv_rotate_t picks
 * there); the same bits. */
MKV_HIDDEN void mkv_rotate_t_sse2(const float *RT, uint32_t m, uint32_t d,
				  const float *x, float *y);
/* Eigenvectors of the d × d covariance as rows of @R (float), eigenvalues
 * descending into @eig (may be NULL).  Reads @cov's upper triangle only
 * (row-major, as LAPACKE's 'U').  Returns 0, -MKV_ELAPACK, -ENOMEM. */
MKV_HIDDEN int mkv_eigen_rows(const double *cov, uint32_t d, float *R,
			      double *eig);

/* The encoder's projection P = (R Rᵀ)⁻¹ R of a stored rotation R (dk × d
 * floats) into @P (may not alias R), or P = R where R Rᵀ is not within
 * 2^-4 of I.  Returns 0, -EINVAL (dk = 0 or > d) or -ENOMEM (P
 * untouched). */
MKV_HIDDEN int mkv_rot_projection(const float *R, uint32_t dk, uint32_t d,
				  float *P);

#endif
