/* SPDX-License-Identifier: MIT */
/*
 * mosaickv — the compression core: segment encoding into the packed format,
 * decoding back to dense, and per-segment strategy generation.
 *
 * A segment holds the K (or the V) vectors of one (layer, KV head) over a run
 * of tokens.  Encoding:
 *   1. covariance C = XᵀX and its eigen-decomposition; the rotation R has the
 *      eigenvectors as rows, largest eigenvalue first, so X' = X Rᵀ packs the
 *      energy into the leading channels (with R rounded to store_dtype, the
 *      encoder uses X' = X Pᵀ, P = (R Rᵀ)⁻¹ R: mkv_segment_rotation);
 *   2. optionally the 25% lowest-variance rotated channels are dropped
 *      (R keeps its first d_keep = 3d/4 rows);
 *   3. every vector keeps its own r largest-magnitude rotated elements, or
 *      r/g groups of g adjacent channels ranked by group energy;
 *   4. packed storage: per vector r values, contiguous, plus a bitmap of
 *      d_keep/g bits (bit j set: group j is stored), no per-element index;
 *      the values either in store_dtype or, with value_bits = 4..8, as
 *      signed integers of that many bits with one bf16 scale per vector
 *      (more values in the same bytes: on d = 64 heads the number of
 *      values kept, not their precision, limits accuracy; docs/ACCURACY.md);
 *   5. for keys, per block of b tokens the channel-wise min and max of the
 *      exact rotated keys over the first S rotated channels, and the
 *      largest norm of a key's remainder outside those S channels (the
 *      block summaries used to score blocks against a query).
 */
#ifndef MOSAICKV_COMPRESS_H
#define MOSAICKV_COMPRESS_H

#include <mosaickv/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Supported head dimensions, group sizes and block sizes. */
#define MKV_MAX_D 256
#define MKV_MAX_N 65536 /* tokens per segment */

/* Whether a segment holds keys (block summaries are built) or values. */
enum mkv_kind {
	MKV_KIND_KEY = 0,
	MKV_KIND_VALUE = 1,
};

/* How the kept elements are chosen. */
enum mkv_select {
	/* Each vector keeps its own top-r (MosaicKV). */
	MKV_SELECT_PER_VECTOR = 0,
	/*
	 * One channel set for the whole segment: the r/g groups of largest
	 * total energy (ThinK's global mask).  Kept for comparison.
	 */
	MKV_SELECT_GLOBAL = 1,
};

struct mkv_encode_opts {
	size_t size;          /* sizeof(struct mkv_encode_opts), set by _init */
	uint32_t d;           /* head dim: 64, 128 or 256.  Default 128 */
	uint32_t r;           /* values kept per vector: multiple of g, 1..d_keep.
	                       * Default 32 (a quarter of the default d) */
	uint32_t g;           /* element-group size: 1, 2, 4 or 8.  Default 1 */
	uint32_t b;           /* block size in tokens: 8, 16, 32 or 64.  Default 16 */
	uint32_t drop;        /* 1: drop the 25% lowest-variance channels.  Default 0 */
	uint32_t rotate;      /* 1: rotate by the segment's eigenvectors; 0: keep
	                       * the original channels.  Default 1 */
	enum mkv_select select; /* default MKV_SELECT_PER_VECTOR */
	enum mkv_kind kind;   /* default MKV_KIND_KEY */
	enum mkv_dtype store_dtype; /* packed values, rotation and summaries:
	                             * MKV_DTYPE_BF16 (default) or MKV_DTYPE_F32 */
	uint32_t summary_channels; /* S, rotated channels summarised per block
	                            * (keys only): 1..d_keep, 0 = min(r, d_keep).
	                            * Default 0 */
	/*
	 * May be NULL (default): the rotation is computed from the segment.
	 * Otherwise d_keep × d floats, row-major, rows orthonormal: the segment
	 * is encoded with this rotation (decode segments reuse the previous
	 * segment's).  Borrowed for the duration of the call; copied.
	 */
	const float *rotation;
	/*
	 * Added in version 2 of this struct (a caller compiled against
	 * version 1 passes the smaller size and gets the default).
	 * 0 (default): the kept values are stored as store_dtype elements.
	 * 4..8: each vector's kept values are stored as signed integers of
	 * this many bits with one scale per vector (the packed row format
	 * under struct mkv_packed_view).  Ignored fields of other versions:
	 * none.
	 */
	uint32_t value_bits;
};

/*
 * Fill @o with the defaults above.  @size must be sizeof(*o) as the caller
 * compiled it.  Returns 0, or -EINVAL if @o is NULL or @size is smaller than
 * the first version of the struct or larger than this library knows.
 */
MKV_API int mkv_encode_opts_init(struct mkv_encode_opts *o, size_t size);

struct mkv_segment; /* opaque: one encoded, packed segment */

/*
 * Encode @n vectors of dimension @o->d, row-major and contiguous, of element
 * type @dt, into a new packed segment returned in *@out.
 *
 * Returns 0 on success, or:
 *   -EINVAL        a NULL pointer, a wrong options size, n == 0 or
 *                  n > MKV_MAX_N, an unsupported d, g, b, dtype, kind or
 *                  select, r == 0, r > d_keep, r not a multiple of g, a
 *                  summary_channels > d_keep (or != 0 for a VALUE
 *                  segment), a value_bits other than 0 or 4..8, or
 *                  rotate == 0 with a rotation;
 *   -MKV_ENONFINITE the input (or the given rotation) holds NaN or Inf;
 *   -MKV_ELAPACK   the eigen-solver failed;
 *   -ENOMEM        out of memory.
 * On failure *@out is untouched.  The caller owns the segment and frees it
 * with mkv_segment_destroy().  Thread-safe: calls on different outputs may
 * run concurrently; the function reads @x only.
 */
MKV_API int mkv_segment_encode(const struct mkv_encode_opts *o, const void *x,
			       enum mkv_dtype dt, size_t n,
			       struct mkv_segment **out);

/* Free a segment.  NULL is accepted. */
MKV_API void mkv_segment_destroy(struct mkv_segment *s);

/*
 * A read-only view of a segment's packed arrays, for the GPU kernels, the
 * tiers and tools.  Pointers are borrowed: valid until the segment is
 * destroyed.  All arrays are densely packed, row-major:
 *   values    n rows of row_bytes bytes; vector i at values + i*row_bytes;
 *             block j's rows are contiguous (b*row_bytes bytes).  A row is
 *             - value_bits == 0: r elements of store_dtype;
 *             - value_bits == w (4..8): a bf16 scale s (>= 0, finite),
 *               then r fields of w bits, LSB-first from the third byte
 *               (field k at bit 16 + k*w of the row), zero padding to an
 *               even row_bytes = 2 + ceil(r*w/8) (+1).  Field u holds the
 *               value (u - 2^(w-1)) * s; encoding takes s = the vector's
 *               largest kept magnitude / (2^(w-1) - 1) rounded up to bf16
 *               and u = 2^(w-1) + rint(x / s);
 *   bitmaps   n × bitmap_bytes; bit j (byte j/8, bit j%8, LSB first) set
 *             means group j (rotated channels j*g .. j*g+g-1) is stored; the
 *             stored values follow the order of the set bits;
 *   rotation  d_keep × d elements of store_dtype, row i = i-th principal axis
 *             (identity rows when rotate == 0);
 *   sum_min,  n_blocks × summary_channels elements of store_dtype (keys only,
 *   sum_max   NULL for values); rounded outward so they bound the exact
 *             rotated keys.
 *   sum_rest  n_blocks elements of store_dtype (keys only, NULL for
 *             values): the largest, over the block's tokens, of
 *             sqrt(max(0, |x|² - |x'_{0..S-1}|²)) for the exact key x and
 *             its first S rotated channels, rounded up.  A query q scores
 *             the block as sum_c max(q'_c min_c, q'_c max_c) +
 *             sqrt(max(0, |q|² - |q'_{0..S-1}|²)) * rest, which bounds
 *             every q·x of the block (Cauchy-Schwarz on the remainder).
 *             Zero in segments serialized by version 1 of the format.
 */
struct mkv_packed_view {
	uint32_t n, d, d_keep, r, g, b;
	uint32_t n_blocks;         /* ceil(n / b) */
	uint32_t bitmap_bytes;     /* ceil(d_keep / g / 8) */
	uint32_t summary_channels; /* 0 for values */
	enum mkv_kind kind;
	enum mkv_dtype store_dtype;
	uint32_t rotated;          /* 0 when encoded with rotate == 0 */
	const void *values;
	const uint8_t *bitmaps;
	const void *rotation;
	const void *sum_min;
	const void *sum_max;
	/* Added with quantized values and remainder bounds. */
	uint32_t value_bits;       /* 0 or 4..8, as in mkv_encode_opts */
	uint32_t row_bytes;        /* bytes of one vector's packed values */
	const void *sum_rest;
};

/*
 * Bytes of one packed row of @r values: r * sizeof(store_dtype) when
 * @value_bits is 0, else 2 + ceil(r * value_bits / 8) rounded up to even.
 * 0 for an invalid combination.
 */
MKV_API uint32_t mkv_row_bytes(uint32_t r, uint32_t value_bits,
			       enum mkv_dtype store_dtype);

/* Fill *@v.  Returns 0, or -EINVAL on NULL arguments. */
MKV_API int mkv_segment_view(const struct mkv_segment *s,
			     struct mkv_packed_view *v);

/* Memory accounting of one segment, in bytes. */
struct mkv_segment_bytes {
	size_t values;    /* packed values */
	size_t bitmaps;   /* position bitmaps */
	size_t rotation;  /* the rotation matrix */
	size_t summaries; /* block min/max and remainder bounds (keys) */
	size_t total;     /* sum of the above */
	size_t dense;     /* the same vectors dense in bf16: n * d * 2 */
};

/* Fill *@b.  Returns 0, or -EINVAL on NULL arguments. */
MKV_API int mkv_segment_bytes(const struct mkv_segment *s,
			      struct mkv_segment_bytes *b);

/* Which space mkv_segment_decode() returns vectors in. */
enum mkv_space {
	/* The stored elements at their rotated-channel positions, converted
	 * to float exactly, zeros elsewhere; d_keep floats per vector. */
	MKV_SPACE_ROTATED = 0,
	/* The reconstruction x̂ = x̂' R in the original channels; d floats. */
	MKV_SPACE_ORIGINAL = 1,
};

/*
 * Decode vectors [@first, @first + @count) of @s to dense float rows in
 * @out (count × d_keep or count × d floats by @space).  Returns 0, or
 * -EINVAL on NULL pointers, a bad space, count == 0 or a range past n.
 */
MKV_API int mkv_segment_decode(const struct mkv_segment *s, size_t first,
			       size_t count, enum mkv_space space, float *out);

/*
 * Copy the rotation used by @s, as floats, into @R (d_keep × d).  Returns 0
 * or -EINVAL.  With store_dtype BF16 this is the rounded rotation, the one
 * decoding and attention multiply by.  Rounded rows are orthonormal only
 * to ~2^-9, so the encoder projects with P = (R Rᵀ)⁻¹ R rather than R
 * (X' = X Pᵀ, and X' R is X's projection onto R's rows, X itself at
 * r = d_keep = d); where R Rᵀ is not within 2^-4 of I (a given rotation
 * far from orthonormal) it projects with R.
 */
MKV_API int mkv_segment_rotation(const struct mkv_segment *s, float *R);

/*
 * Serialize @s into @buf of @cap bytes.  Returns the number of bytes
 * written, or the number needed when @buf is NULL; -EINVAL on a NULL
 * segment; -ENOSPC if @cap is too small (nothing written past @cap).
 * The format is position-independent and little-endian; it carries its
 * own magic, version and a checksum.
 */
MKV_API int64_t mkv_segment_serialize(const struct mkv_segment *s, void *buf,
				      size_t cap);

/*
 * Rebuild a segment from @len bytes written by mkv_segment_serialize().
 * Returns 0 with a new segment in *@out, or -EINVAL on NULL arguments,
 * -MKV_ECORRUPT if the bytes fail the magic, version, size or checksum
 * checks, -ENOMEM.
 */
MKV_API int mkv_segment_deserialize(const void *buf, size_t len,
				    struct mkv_segment **out);

/* ---------------------------------------------------------------------- */
/* Strategy generation                                                     */

struct mkv_strategy_opts {
	size_t size;           /* sizeof(struct mkv_strategy_opts) */
	uint32_t d;            /* head dim: 64, 128 or 256.  Default 128 */
	uint32_t drop;         /* 1: strategies drop the 25% lowest-variance
	                        * channels.  Default 1 */
	double loss_threshold; /* largest accepted relative reconstruction
	                        * error ‖X − X̂‖_F / ‖X‖_F, in (0, 1].  Default 0.3 */
	double var_threshold;  /* largest accepted within-block share of the
	                        * variance of the summarised rotated keys,
	                        * in (0, 1].  Default 0.5 */
	uint32_t g_mask;       /* allowed group sizes, bit (1<<g): any of
	                        * 2|4|16|256 = g 1,2,4,8.  Default all */
	uint32_t b_mask;       /* allowed block sizes, bit (1<<log2 b): any of
	                        * 8|16|32|64 = b 8..64.  Default all */
	uint32_t summary_channels; /* S used for the block variance, 0 = d/4 */
};

MKV_API int mkv_strategy_opts_init(struct mkv_strategy_opts *o, size_t size);

/* A chosen strategy for one segment of K or V. */
struct mkv_strategy {
	uint32_t d, d_keep; /* head dim and channels kept after the drop */
	uint32_t r, g, b;   /* values per vector, group size, block size */
	double loss;        /* relative reconstruction error at (r, g) */
	double block_var;   /* within-block variance share at b */
	uint32_t met;       /* 1 if loss <= threshold; 0 if no (r, g) could
	                     * meet it (then r = d_keep and g is the smallest
	                     * allowed group size) */
};

struct mkv_segstats; /* opaque: incremental statistics of a growing segment */

/*
 * Create incremental statistics for segments of dimension @o->d.  Appending
 * vectors updates, in O(d²) each and never from scratch:
 *   - the covariance XᵀX (double precision);
 *   - under the current rotation (identity until mkv_segstats_set_rotation):
 *     the kept energy of every candidate (r, g), hence the relative loss of
 *     every strategy, and the within-block variance of every candidate b.
 * Returns 0, -EINVAL (NULL, bad size, bad option values) or -ENOMEM.
 * Not thread-safe: one thread at a time per object.
 */
MKV_API int mkv_segstats_create(const struct mkv_strategy_opts *o,
				struct mkv_segstats **out);
MKV_API void mkv_segstats_destroy(struct mkv_segstats *st);

/*
 * Append @n vectors (row-major, @dt).  All or nothing: on -MKV_ENONFINITE
 * (NaN/Inf anywhere) or -EINVAL (NULL, n == 0, bad dtype) nothing is
 * accumulated.
 */
MKV_API int mkv_segstats_append(struct mkv_segstats *st, const void *x,
				enum mkv_dtype dt, size_t n);

/* Number of vectors appended since creation or the last reset. */
MKV_API size_t mkv_segstats_count(const struct mkv_segstats *st);

/*
 * Set the rotation under which losses and block variances are tracked
 * from now on (d × d floats, rows orthonormal, largest-variance first; the
 * first d_keep rows are the kept channels), or NULL for the identity.
 * Clears the loss and variance tables (not the covariance): they describe
 * the vectors appended after this call.  Returns 0, -EINVAL,
 * -MKV_ENONFINITE.
 */
MKV_API int mkv_segstats_set_rotation(struct mkv_segstats *st, const float *R);

/*
 * Eigen-decomposition of the accumulated covariance: @R receives d × d
 * floats, eigenvectors as rows, eigenvalues descending; @eig (may be NULL)
 * receives the d eigenvalues.  Returns 0, -EINVAL (NULL, or no vectors
 * appended), -MKV_ELAPACK, -ENOMEM.
 */
MKV_API int mkv_segstats_eigen(const struct mkv_segstats *st, float *R,
			       double *eig);

/*
 * Relative loss of keeping @r values in groups of @g under the current
 * rotation, over the tracked vectors, into *@loss.  Returns 0, or -EINVAL
 * (bad r or g, or no tracked vectors).
 */
MKV_API int mkv_segstats_loss(const struct mkv_segstats *st, uint32_t r,
			      uint32_t g, double *loss);

/*
 * Choose the strategy for the tracked vectors: among the allowed (r, g)
 * whose loss meets the threshold, the one with the fewest packed bytes per
 * vector (r values + bitmap); ties go to the larger g, then the smaller r.
 * b is the largest allowed block size whose within-block variance share
 * meets the variance threshold (the smallest allowed one if none does).
 * The share is measured over the complete blocks of each size (per token,
 * against the variance over all tracked tokens); a size with no complete
 * block yet counts as not meeting it.
 * Returns 0, -EINVAL (NULL, or no tracked vectors).
 */
MKV_API int mkv_segstats_choose(const struct mkv_segstats *st,
				struct mkv_strategy *s);

/* Forget every appended vector; the options and rotation stay. */
MKV_API void mkv_segstats_reset(struct mkv_segstats *st);

/*
 * One-shot strategy for a prefill segment: covariance, eigen-decomposition,
 * loss tables under the new rotation, choice.  @R (may be NULL) receives the
 * d × d rotation to hand to mkv_segment_encode() (its first d_keep rows).
 * Returns 0 or as mkv_segstats_append/_eigen.
 */
MKV_API int mkv_strategy_choose(const struct mkv_strategy_opts *o,
				const void *x, enum mkv_dtype dt, size_t n,
				float *R, struct mkv_strategy *s);

#ifdef __cplusplus
}
#endif
#endif
