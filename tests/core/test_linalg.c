/* SPDX-License-Identifier: MIT */
/*
 * The compression core's small kernels on the append path, against
 * independent references:
 *  - mkv_sort_desc (and mkv_sort_desc_quick) sorts like qsort with a
 *    float comparator, whatever the length, ties, zeros or order of the
 *    input;
 *  - mkv_rotate_t gives, bit for bit, the plain channel-ordered float sum
 *    of each output, whatever the number of rows asked for, in its AVX2
 *    and its SSE2 build, and stays within float rounding of a double
 *    reference;
 *  - mkv_cov_accumulate_f64 adds a single row with the bits of BLAS's
 *    SYRK over that row, fills the upper triangle only, and its chunked
 *    path with and without caller scratch agree;
 *  - mkv_rotation_of gives mkv_strategy_choose's rotation, bit for bit.
 */
#include <cblas.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mosaickv.h>
#include "mosaickv/internal.h"

struct rng {
	uint64_t s;
};

static uint64_t next(struct rng *r)
{
	r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
	uint64_t x = r->s;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static double uni(struct rng *r)
{
	return ((next(r) >> 11) + 0.5) / 9007199254740992.0;
}

static double normal(struct rng *r)
{
	return sqrt(-2.0 * log(uni(r))) * cos(6.283185307179586 * uni(r));
}

static uint64_t seed_of(void)
{
	return (uint64_t)time(NULL) * 2654435761u;
}

static int cmp_desc(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x < y) - (x > y);
}

/* One draw of @n non-negative floats of kind @kind (see the cases). */
static void draw(struct rng *r, float *v, uint32_t n, int kind)
{
	for (uint32_t i = 0; i < n; i++) {
		double g = normal(r) * exp(-(double)i / 40.0);
		switch (kind) {
		case 0: /* group energies of a rotated vector */
			v[i] = (float)(g * g);
			break;
		case 1: /* a few values, many ties */
			v[i] = (float)(next(r) % 5);
			break;
		case 2: /* zeros and denormals among normals */
			v[i] = next(r) % 3 ? 0.0f : (next(r) % 2 ? 1e-40f : (float)(g * g));
			break;
		case 3: { /* equal top 16 bits, low bits ascending: the tie pass's
			   * worst case */
			uint32_t b = 0x3f800000u | (i & 0xffffu);
			memcpy(&v[i], &b, 4);
			break;
		}
		case 4: /* already descending, then ascending */
			v[i] = (float)(n - i);
			break;
		default:
			v[i] = (float)i;
			break;
		}
	}
	if (kind == 2 && n > 3) {
		v[0] = INFINITY;
		v[n - 1] = 3.0e38f;
	}
}

Test(linalg, sort_desc_matches_qsort)
{
	uint64_t seed = seed_of();
	struct rng r = {seed};
	const uint32_t sizes[] = {1, 2, 3, 23, 24, 25, 31, 96, 127, 128, 200, 255, 256, 257, 300, 1000};
	float v[1000], ref[1000], w[1000];
	for (int kind = 0; kind < 6; kind++)
		for (size_t si = 0; si < sizeof(sizes) / sizeof(*sizes); si++)
			for (int rep = 0; rep < 20; rep++) {
				uint32_t n = sizes[si];
				if (rep >= 10) /* and random lengths */
					n = 1 + (uint32_t)(next(&r) % 300);
				draw(&r, v, n, kind);
				memcpy(ref, v, sizeof(float) * n);
				qsort(ref, n, sizeof(float), cmp_desc);
				memcpy(w, v, sizeof(float) * n);
				mkv_sort_desc(v, n);
				cr_assert(memcmp(v, ref, sizeof(float) * n) == 0,
					  "seed %llu kind %d n %u: differs from qsort",
					  (unsigned long long)seed, kind, n);
				mkv_sort_desc_quick(w, n);
				cr_assert(memcmp(w, ref, sizeof(float) * n) == 0,
					  "seed %llu kind %d n %u: the quicksort differs from qsort",
					  (unsigned long long)seed, kind, n);
			}
}

Test(linalg, rotate_t_is_the_channel_ordered_sum)
{
	uint64_t seed = seed_of();
	struct rng r = {seed};
	const uint32_t dims[] = {64, 128, 256};
	for (size_t di = 0; di < 3; di++) {
		uint32_t d = dims[di];
		float *R = malloc(sizeof(float) * d * d), *RT = malloc(sizeof(float) * d * d);
		float x[256], y[256], ym[256];
		for (uint32_t i = 0; i < d * d; i++)
			R[i] = (float)(normal(&r) / sqrt(d));
		for (uint32_t i = 0; i < d; i++)
			x[i] = (float)(normal(&r) * (1.0 + 4.0 * (i < 4)));
		mkv_transpose(R, d, d, RT);
		for (uint32_t j = 0; j < d; j++)
			for (uint32_t i = 0; i < d; i++)
				cr_assert(RT[(size_t)i * d + j] == R[(size_t)j * d + i]);
		mkv_rotate_t(RT, d, d, x, y);
		/* both builds, whichever this CPU runs */
		mkv_rotate_t_sse2(RT, d, d, x, ym);
		cr_assert(memcmp(y, ym, sizeof(float) * d) == 0,
			  "seed %llu d %u: the SSE2 build differs", (unsigned long long)seed, d);
		for (uint32_t j = 0; j < d; j++) {
			float a = x[0] * R[(size_t)j * d];
			double ad = 0.0, mag = 0.0;
			for (uint32_t i = 1; i < d; i++)
				a += x[i] * R[(size_t)j * d + i];
			for (uint32_t i = 0; i < d; i++) {
				ad += (double)x[i] * R[(size_t)j * d + i];
				mag += fabs((double)x[i] * R[(size_t)j * d + i]);
			}
			cr_assert(memcmp(&a, &y[j], 4) == 0,
				  "seed %llu d %u row %u: %.9g, the ordered sum %.9g",
				  (unsigned long long)seed, d, j, y[j], a);
			cr_assert(fabs(y[j] - ad) <= 1e-6 * d * mag,
				  "seed %llu d %u row %u: %.9g, double %.9g", (unsigned long long)seed,
				  d, j, y[j], ad);
		}
		/* fewer rows (a segment's d_keep, or not a multiple of the
		 * block): the same bits for the same rows */
		const uint32_t ms[] = {d - d / 4, d / 2 + 5, 7, 1};
		float *RTm = malloc(sizeof(float) * d * d);
		for (size_t mi = 0; mi < 4; mi++) {
			uint32_t m = ms[mi];
			mkv_transpose(R, m, d, RTm);
			mkv_rotate_t(RTm, m, d, x, ym);
			cr_assert(memcmp(ym, y, sizeof(float) * m) == 0,
				  "seed %llu d %u: rows 0..%u differ from the d-row rotation",
				  (unsigned long long)seed, d, m);
			mkv_rotate_t_sse2(RTm, m, d, x, ym);
			cr_assert(memcmp(ym, y, sizeof(float) * m) == 0,
				  "seed %llu d %u: SSE2 rows 0..%u differ", (unsigned long long)seed,
				  d, m);
		}
		free(RTm);
		free(R);
		free(RT);
	}
}

Test(linalg, cov_one_row_is_syrk_upper_only)
{
	uint64_t seed = seed_of();
	struct rng r = {seed};
	const uint32_t d = 128, n = 300;
	double *a = malloc(sizeof(double) * d * d), *b = malloc(sizeof(double) * d * d);
	double *c = malloc(sizeof(double) * d * d), *e = malloc(sizeof(double) * d * d);
	float *x = malloc(sizeof(float) * n * d);
	double xd[128];
	for (uint32_t i = 0; i < n * d; i++)
		x[i] = (float)(normal(&r) * (1 + (i % d) / 16));
	for (uint32_t i = 0; i < d * d; i++) {
		a[i] = b[i] = 0.0;
		/* the lower triangle poisoned: never read, never written */
		if (i / d > i % d)
			a[i] = NAN;
	}
	for (uint32_t t = 0; t < n; t++) {
		cr_assert_eq(mkv_cov_accumulate_f64(a, x + (size_t)t * d, 1, d, NULL), 0);
		for (uint32_t k = 0; k < d; k++)
			xd[k] = x[(size_t)t * d + k];
		cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)d, 1, 1.0, xd, (int)d, 1.0,
			    b, (int)d);
	}
	for (uint32_t i = 0; i < d; i++)
		for (uint32_t j = 0; j < d; j++) {
			if (j < i) {
				cr_assert(isnan(a[i * d + j]), "(%u, %u) below the diagonal written", i,
					  j);
				continue;
			}
			cr_assert(memcmp(&a[i * d + j], &b[i * d + j], 8) == 0,
				  "seed %llu (%u, %u): %.17g one row at a time, SYRK %.17g",
				  (unsigned long long)seed, i, j, a[i * d + j], b[i * d + j]);
		}
	/* the chunked path, with the caller's scratch and without: the same
	 * bits, within double rounding of the row-by-row sums */
	double *scratch = malloc(sizeof(double) * 256 * d);
	memset(c, 0, sizeof(double) * d * d);
	memset(e, 0, sizeof(double) * d * d);
	cr_assert_eq(mkv_cov_accumulate_f64(c, x, n, d, NULL), 0);
	cr_assert_eq(mkv_cov_accumulate_f64(e, x, 256, d, scratch), 0);
	cr_assert_eq(mkv_cov_accumulate_f64(e, x + 256 * d, n - 256, d, scratch), 0);
	for (uint32_t i = 0; i < d; i++)
		for (uint32_t j = i; j < d; j++) {
			double ref = b[i * d + j], tol = 1e-12 * sqrt(b[i * d + i] * b[j * d + j]);
			cr_assert(fabs(c[i * d + j] - ref) <= tol && fabs(e[i * d + j] - ref) <= tol,
				  "seed %llu (%u, %u): chunked %.17g / %.17g, rows %.17g",
				  (unsigned long long)seed, i, j, c[i * d + j], e[i * d + j], ref);
		}
	free(scratch);
	free(a);
	free(b);
	free(c);
	free(e);
	free(x);
}

Test(linalg, rotation_of_is_strategy_choose_rotation)
{
	uint64_t seed = seed_of();
	struct rng r = {seed};
	const uint32_t dims[] = {64, 128, 256};
	for (size_t di = 0; di < 3; di++) {
		uint32_t d = dims[di], n = 100 + (uint32_t)(next(&r) % 1500);
		float *x = malloc(sizeof(float) * n * d), *Ra = malloc(sizeof(float) * d * d);
		float *Rb = malloc(sizeof(float) * d * d);
		for (uint32_t i = 0; i < n * d; i++)
			x[i] = (float)(normal(&r) * (1.0 + 8.0 * ((i % d) % 11 == 0)));
		struct mkv_strategy_opts so;
		cr_assert_eq(mkv_strategy_opts_init(&so, sizeof so), 0);
		so.d = d;
		so.drop = (uint32_t)(next(&r) % 2);
		struct mkv_strategy st;
		cr_assert_eq(mkv_strategy_choose(&so, x, MKV_DTYPE_F32, n, Ra, &st), 0);
		cr_assert_eq(mkv_rotation_of(x, n, d, Rb), 0);
		cr_assert(memcmp(Ra, Rb, sizeof(float) * d * d) == 0,
			  "seed %llu d %u n %u: the rotations differ", (unsigned long long)seed, d,
			  n);
		free(x);
		free(Ra);
		free(Rb);
	}
}
