/* SPDX-License-Identifier: MIT */
/*
 * Reconstruction quality, measured here as ‖X − X̂‖_F / ‖X‖_F from the
 * MKV_SPACE_ORIGINAL decode:
 *  (a) vectors whose large values sit in different channels: per-vector
 *      selection's error is at most half the global mask's at the same r;
 *  (b) correlated vectors (low-rank latent × mixing + noise): rotation
 *      lowers the error against no rotation at the same r;
 *  (c) per-vector selection is never worse than the global mask under the
 *      same rotation (it is optimal per vector).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static const uint32_t dims[3] = {64, 128, 256};

static double encode_err(const float *x, const double *ref, size_t n,
			 const struct mkv_encode_opts *o, uint64_t seed)
{
	struct mkv_segment *s = NULL;
	int rc = mkv_segment_encode(o, x, MKV_DTYPE_F32, n, &s);
	cr_assert_eq(rc, 0, "seed=%llu: encode rc=%d (%s)", (unsigned long long)seed, rc,
		     mkv_strerror(rc));
	float *dec = th_alloc(n * o->d * sizeof *dec);
	cr_assert_eq(mkv_segment_decode(s, 0, n, MKV_SPACE_ORIGINAL, dec), 0);
	double e = th_frob_rel(ref, dec, n * o->d);
	free(dec);
	mkv_segment_destroy(s);
	return e;
}

/*
 * n vectors, each with its own random set of d/4 channels (in groups of
 * @g adjacent channels) carrying large values, small noise elsewhere.
 */
static void scattered(struct th_rng *rng, float *x, double *ref, size_t n,
		      uint32_t d, uint32_t g)
{
	uint32_t ng = d / g, big = d / 4 / g;
	uint32_t *perm = th_alloc(ng * sizeof *perm);
	for (size_t i = 0; i < n; i++) {
		float *xi = x + i * d;
		for (uint32_t c = 0; c < d; c++)
			xi[c] = (float)(0.1 * th_normal(rng));
		for (uint32_t j = 0; j < ng; j++)
			perm[j] = j;
		for (uint32_t j = 0; j < big; j++) { /* partial Fisher-Yates */
			uint32_t t = j + th_below(rng, ng - j);
			uint32_t tmp = perm[j];
			perm[j] = perm[t];
			perm[t] = tmp;
			for (uint32_t u = 0; u < g; u++) {
				double m = 2.0 + fabs(th_normal(rng));
				xi[perm[j] * g + u] = (float)(th_uniform(rng) < 0.5 ? -m : m);
			}
		}
	}
	for (size_t i = 0; i < n * d; i++)
		ref[i] = x[i];
	free(perm);
}

Test(quality, per_vector_beats_global_mask_by_2x)
{
	for (int di = 0; di < 3; di++) {
		for (uint32_t g = 1; g <= 8; g *= 2) {
			uint64_t seed = th_seed();
			struct th_rng rng;
			th_rng_init(&rng, seed);
			uint32_t d = dims[di];
			size_t n = 512;
			float *x = th_alloc(n * d * sizeof *x);
			double *ref = th_alloc(n * d * sizeof *ref);
			scattered(&rng, x, ref, n, d, g);
			struct mkv_encode_opts o;
			cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
			o.d = d;
			o.r = d / 4;
			o.g = g;
			o.drop = 0;
			o.rotate = 0; /* isolate selection */
			o.select = MKV_SELECT_PER_VECTOR;
			double e_pv = encode_err(x, ref, n, &o, seed);
			o.select = MKV_SELECT_GLOBAL;
			double e_gl = encode_err(x, ref, n, &o, seed);
			cr_log_info("d=%u g=%u: per-vector %.4f, global %.4f\n", d, g, e_pv, e_gl);
			cr_assert(e_pv <= 0.5 * e_gl,
				  "seed=%llu d=%u g=%u: per-vector error %.4g is not at most half the global mask's %.4g",
				  (unsigned long long)seed, d, g, e_pv, e_gl);
			/* and with bf16 storage the ordering holds as well */
			o.store_dtype = MKV_DTYPE_BF16;
			o.select = MKV_SELECT_PER_VECTOR;
			double e_pv16 = encode_err(x, ref, n, &o, seed);
			cr_assert(e_pv16 <= 0.5 * e_gl,
				  "seed=%llu d=%u g=%u: bf16 per-vector error %.4g vs global %.4g",
				  (unsigned long long)seed, d, g, e_pv16, e_gl);
			free(x);
			free(ref);
		}
	}
}

/* Rank-k latent mixed into d channels, plus noise. */
static void correlated(struct th_rng *rng, float *x, double *ref, size_t n,
		       uint32_t d, uint32_t k, double noise)
{
	double *mix = th_alloc((size_t)k * d * sizeof *mix);
	double *z = th_alloc(k * sizeof *z);
	for (size_t i = 0; i < (size_t)k * d; i++)
		mix[i] = th_normal(rng) / sqrt((double)k);
	for (size_t i = 0; i < n; i++) {
		for (uint32_t a = 0; a < k; a++)
			z[a] = th_normal(rng) * (1.0 + 2.0 * (k - a) / k);
		for (uint32_t c = 0; c < d; c++) {
			double acc = noise * th_normal(rng);
			for (uint32_t a = 0; a < k; a++)
				acc += z[a] * mix[(size_t)a * d + c];
			x[i * d + c] = (float)acc;
		}
	}
	for (size_t i = 0; i < n * d; i++)
		ref[i] = x[i];
	free(z);
	free(mix);
}

Test(quality, rotation_lowers_error_on_correlated_data)
{
	for (int di = 0; di < 3; di++) {
		for (uint32_t drop = 0; drop < 2; drop++) {
			uint64_t seed = th_seed();
			struct th_rng rng;
			th_rng_init(&rng, seed);
			uint32_t d = dims[di];
			size_t n = 600;
			float *x = th_alloc(n * d * sizeof *x);
			double *ref = th_alloc(n * d * sizeof *ref);
			correlated(&rng, x, ref, n, d, d / 8, 0.05);
			struct mkv_encode_opts o;
			cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
			o.d = d;
			o.r = d / 4;
			o.g = 1u << th_below(&rng, 3);
			o.drop = 0;
			o.rotate = 0;
			double e_plain = encode_err(x, ref, n, &o, seed);
			o.rotate = 1;
			o.drop = drop;
			double e_rot = encode_err(x, ref, n, &o, seed);
			cr_log_info("d=%u g=%u drop=%u: no rotation %.4f, rotation %.4f\n", d,
				    o.g, drop, e_plain, e_rot);
			cr_assert(e_rot < e_plain,
				  "seed=%llu d=%u g=%u drop=%u: rotated error %.4g not below unrotated %.4g",
				  (unsigned long long)seed, d, o.g, drop, e_rot, e_plain);
			free(x);
			free(ref);
		}
	}
}

Test(quality, per_vector_never_worse_than_global)
{
	for (int it = 0; it < 6; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		uint32_t d = dims[th_below(&rng, 3)];
		size_t n = 300;
		float *x = th_alloc(n * d * sizeof *x);
		double *ref = th_alloc(n * d * sizeof *ref);
		if (it & 1)
			correlated(&rng, x, ref, n, d, d / 4, 0.3);
		else
			scattered(&rng, x, ref, n, d, 1);
		struct mkv_encode_opts o;
		cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
		o.d = d;
		o.g = 1u << th_below(&rng, 4);
		o.drop = th_below(&rng, 2);
		uint32_t dk = o.drop ? d - d / 4 : d;
		o.r = o.g * (1 + th_below(&rng, dk / o.g));
		o.store_dtype = MKV_DTYPE_F32;
		o.rotate = th_below(&rng, 2);
		if (!o.rotate)
			o.drop = 0, o.r = o.g * (1 + th_below(&rng, d / o.g));
		double e_pv = encode_err(x, ref, n, &o, seed);
		o.select = MKV_SELECT_GLOBAL;
		double e_gl = encode_err(x, ref, n, &o, seed);
		cr_assert(e_pv <= e_gl + 1e-6,
			  "seed=%llu d=%u g=%u r=%u rotate=%u drop=%u: per-vector %.6g worse than global %.6g",
			  (unsigned long long)seed, d, o.g, o.r, o.rotate, o.drop, e_pv, e_gl);
		free(x);
		free(ref);
	}
}
