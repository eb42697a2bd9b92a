/* SPDX-License-Identifier: MIT */
/*
 * Test helpers of the compression-core suite: a seeded RNG, element-type
 * conversions written independently of the library, and double-precision
 * reference computations (dense attention, eigenvalues, reconstruction from
 * a packed view).  Nothing here calls into the library except where a
 * function's name says so (th_view_*).
 */
#ifndef MKV_TESTS_CORE_HELPERS_H
#define MKV_TESTS_CORE_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <mosaickv.h>

/* ---- seeded RNG (splitmix64 seeding, xoshiro256**) ---------------------- */

struct th_rng {
	uint64_t s[4];
};

/*
 * A fresh seed per call: MKV_TEST_SEED from the environment when set (to
 * replay a failure; each later call adds 1), otherwise time, pid and a
 * counter.  Every test prints the seed in its failure messages.
 */
uint64_t th_seed(void);
void th_rng_init(struct th_rng *g, uint64_t seed);
uint64_t th_u64(struct th_rng *g);
double th_uniform(struct th_rng *g);          /* [0, 1) */
double th_normal(struct th_rng *g);           /* N(0, 1) */
uint32_t th_below(struct th_rng *g, uint32_t n); /* [0, n) */

/* ---- element types ------------------------------------------------------- */

uint16_t th_f32_to_bf16(float f); /* nearest, ties to even; finite inputs */
float th_bf16_to_f32(uint16_t h);
uint16_t th_f32_to_f16(float f);  /* nearest, ties to even; |f| < 65504 */
float th_f16_to_f32(uint16_t h);
size_t th_dtype_size(enum mkv_dtype dt);
const char *th_dtype_name(enum mkv_dtype dt);

/*
 * Convert @n floats @src to @dt into @dst and write the exact values the
 * library will see (after rounding to @dt) as doubles into @ref (may be NULL).
 */
void th_encode_dt(const float *src, size_t n, enum mkv_dtype dt, void *dst,
		  double *ref);

/* Read element i of an array of @dt (F32/F16/BF16) as double. */
double th_elem(const void *p, enum mkv_dtype dt, size_t i);

/* ---- allocation ---------------------------------------------------------- */

/* calloc that never returns NULL (aborts the test on failure). */
void *th_alloc(size_t bytes);

/* ---- references ---------------------------------------------------------- */

/*
 * Softmax attention in double: @nq queries (nq × d doubles), @n tokens of K
 * and V (n × d doubles), scale @scale, into @out (nq × d doubles).
 */
void th_attention(uint32_t nq, uint32_t d, double scale, const double *q,
		  const double *k, const double *v, size_t n, double *out);

/* ‖a − b‖₂ / ‖b‖₂ over n elements. */
double th_rel_err_fd(const float *a, const double *b, size_t n);
double th_rel_err_dd(const double *a, const double *b, size_t n);

/* Eigenvalues of the symmetric d × d matrix @a (copied), descending, by
 * cyclic Jacobi rotations. */
void th_sym_eigvals(const double *a, uint32_t d, double *eig);

/* Covariance XᵀX (d × d, full) of n rows of x (doubles). */
void th_covariance(const double *x, size_t n, uint32_t d, double *cov);

/* A random m × d matrix with orthonormal rows (m <= d), Gram-Schmidt. */
void th_random_orthonormal(struct th_rng *g, uint32_t m, uint32_t d,
			   double *out);

/* Number of set bits of the first @nbits bits (LSB first) of @p. */
uint32_t th_popcount_bits(const uint8_t *p, uint32_t nbits);
static inline bool th_bit(const uint8_t *p, uint32_t j)
{
	return (p[j / 8] >> (j % 8)) & 1u;
}

/*
 * Unpack vector i of a packed view into rotated space: @out receives
 * d_keep doubles, the stored values at the set-bit groups, zero elsewhere.
 * Reads only the view's arrays (independent of mkv_segment_decode).
 */
void th_view_unpack(const struct mkv_packed_view *v, size_t i, double *out);

/* Stored value @k of vector @i of a view, decoded from the row as the
 * format defines it (quantized fields read bit by bit). */
double th_view_value(const struct mkv_packed_view *v, size_t i, size_t k);

/*
 * Reconstruct vectors [0, n) of a view in the original channels, in double,
 * from the view's values, bitmaps and rotation: x̂ = x̂' R.  @out: n × d.
 */
void th_view_reconstruct(const struct mkv_packed_view *v, double *out);

/* Rotation of a view as doubles, d_keep × d. */
void th_view_rotation(const struct mkv_packed_view *v, double *R);

/* Gaussian n × d matrix scaled by @sigma. */
void th_gaussian(struct th_rng *g, float *x, size_t n, double sigma);

/* ‖X − Y‖_F / ‖X‖_F for n × d doubles X (reference) and floats Y. */
double th_frob_rel(const double *x, const float *y, size_t nd);

#endif
