/* SPDX-License-Identifier: MIT */
/*
 * Per-vector selection keeps exactly the r values (r/g groups) of largest
 * magnitude (group energy) of the rotated vector X' = X Pᵀ, P = (R Rᵀ)⁻¹ R,
 * which is computed here in double from mkv_segment_rotation(); the global mask keeps
 * the r/g groups of largest total energy.  Bitmaps carry r/g bits.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "projection.h"

static const uint32_t dims[3] = {64, 128, 256};
static const uint32_t groups[4] = {1, 2, 4, 8};

/* X' = X Rᵀ: n × dk doubles from n × d doubles and dk × d floats. */
/* The encoder's coefficients: X Pᵀ with P the projection of R. */
static void rotate_rows(const double *x, size_t n, uint32_t d, const float *Rf,
			uint32_t dk, double *xr)
{
	double *Rd = th_alloc((size_t)dk * d * sizeof *Rd);
	double *R = th_alloc((size_t)dk * d * sizeof *R);
	for (size_t i = 0; i < (size_t)dk * d; i++)
		Rd[i] = Rf[i];
	th_projection(Rd, dk, d, R);
	free(Rd);
	for (size_t i = 0; i < n; i++)
		for (uint32_t a = 0; a < dk; a++) {
			double acc = 0;
			for (uint32_t c = 0; c < d; c++)
				acc += x[i * d + c] * R[(size_t)a * d + c];
			xr[i * dk + a] = acc;
		}
	free(R);
}

struct sel_case {
	uint64_t seed;
	uint32_t d, g, r, drop, b;
	enum mkv_select select;
	enum mkv_dtype in_dt;
	size_t n;
};

static void check_selection(const struct sel_case *k)
{
	struct th_rng rng;
	th_rng_init(&rng, k->seed ^ 0x5e1ec7ull);
	uint32_t d = k->d, g = k->g, r = k->r;
	size_t n = k->n;
	float *x = th_alloc(n * d * sizeof *x);
	th_gaussian(&rng, x, n * d, 1.0);
	/* a few vectors with a large offset so magnitudes vary across vectors */
	for (size_t i = 0; i < n; i += 7)
		for (uint32_t c = 0; c < d; c++)
			x[i * d + c] *= 4.0f;
	void *buf = th_alloc(n * d * 4);
	double *ref = th_alloc(n * d * sizeof *ref);
	th_encode_dt(x, n * d, k->in_dt, buf, ref);

	struct mkv_encode_opts o;
	cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
	o.d = d;
	o.g = g;
	o.r = r;
	o.b = k->b;
	o.drop = k->drop;
	o.select = k->select;
	o.store_dtype = MKV_DTYPE_F32;
	struct mkv_segment *s = NULL;
	int rc = mkv_segment_encode(&o, buf, k->in_dt, n, &s);
	cr_assert_eq(rc, 0, "seed=%llu d=%u g=%u r=%u drop=%u: encode rc=%d (%s)",
		     (unsigned long long)k->seed, d, g, r, k->drop, rc, mkv_strerror(rc));
	struct mkv_packed_view v;
	cr_assert_eq(mkv_segment_view(s, &v), 0);
	uint32_t dk = v.d_keep, ng = dk / g, kg = r / g;
	cr_assert_eq(dk, k->drop ? d - d / 4 : d);
	cr_assert_eq(v.r, r);
	cr_assert_eq(v.g, g);
	cr_assert_eq(v.bitmap_bytes, (ng + 7) / 8);

	float *R = th_alloc((size_t)dk * d * sizeof *R);
	cr_assert_eq(mkv_segment_rotation(s, R), 0);
	double *xr = th_alloc(n * dk * sizeof *xr);
	rotate_rows(ref, n, d, R, dk, xr);
	float *dec = th_alloc(n * dk * sizeof *dec);
	rc = mkv_segment_decode(s, 0, n, MKV_SPACE_ROTATED, dec);
	cr_assert_eq(rc, 0, "seed=%llu: decode rc=%d", (unsigned long long)k->seed, rc);

	double *energy = th_alloc(ng * sizeof *energy);
	double *total = th_alloc(ng * sizeof *total);
	double *sorted = th_alloc(ng * sizeof *sorted);
	for (size_t i = 0; i < n; i++) {
		const uint8_t *bm = v.bitmaps + i * v.bitmap_bytes;
		const double *xi = xr + i * dk;
		double norm2 = 0, emax = 0;
		for (uint32_t j = 0; j < ng; j++) {
			double e = 0;
			for (uint32_t t = 0; t < g; t++)
				e += xi[j * g + t] * xi[j * g + t];
			energy[j] = e;
			total[j] += e;
			norm2 += e;
			if (e > emax)
				emax = e;
		}
		uint32_t pc = th_popcount_bits(bm, v.bitmap_bytes * 8);
		cr_assert_eq(pc, kg, "seed=%llu d=%u g=%u r=%u: vector %zu has %u bits, want %u",
			     (unsigned long long)k->seed, d, g, r, i, pc, kg);
		/* the kept groups are the top kg by energy (float ties aside) */
		double min_kept = INFINITY, max_drop = 0;
		for (uint32_t j = 0; j < ng; j++) {
			if (th_bit(bm, j)) {
				if (energy[j] < min_kept)
					min_kept = energy[j];
			} else if (energy[j] > max_drop) {
				max_drop = energy[j];
			}
		}
		if (k->select == MKV_SELECT_PER_VECTOR) {
			/* same statement by sorting: the kg-th largest energy */
			memcpy(sorted, energy, ng * sizeof *sorted);
			for (uint32_t a = 0; a < ng; a++) /* selection sort, descending */
				for (uint32_t b2 = a + 1; b2 < ng; b2++)
					if (sorted[b2] > sorted[a]) {
						double t = sorted[a];
						sorted[a] = sorted[b2];
						sorted[b2] = t;
					}
			double tol = 1e-5 * emax + 1e-30;
			cr_assert(max_drop <= min_kept + tol,
				  "seed=%llu d=%u g=%u r=%u drop=%u: vector %zu dropped a group of energy %.9g but kept one of %.9g",
				  (unsigned long long)k->seed, d, g, r, k->drop, i,
				  max_drop, min_kept);
			cr_assert(fabs(min_kept - sorted[kg - 1]) <= tol,
				  "seed=%llu: vector %zu smallest kept energy %.9g, top-%u threshold %.9g",
				  (unsigned long long)k->seed, i, min_kept, kg, sorted[kg - 1]);
		}
		/* decoded rotated values: X' at the kept channels, 0 elsewhere */
		double tolv = 1e-5 * sqrt(norm2) + 1e-30;
		for (uint32_t j = 0; j < ng; j++)
			for (uint32_t t = 0; t < g; t++) {
				uint32_t ch = j * g + t;
				float got = dec[i * dk + ch];
				if (th_bit(bm, j))
					cr_assert(fabs(got - xi[ch]) <= tolv,
						  "seed=%llu: vector %zu channel %u decoded %.9g, X' %.9g",
						  (unsigned long long)k->seed, i, ch, got, xi[ch]);
				else
					cr_assert(got == 0.0f,
						  "seed=%llu: vector %zu channel %u not kept but decoded %g",
						  (unsigned long long)k->seed, i, ch, got);
			}
		if (k->select == MKV_SELECT_GLOBAL)
			cr_assert(memcmp(bm, v.bitmaps, v.bitmap_bytes) == 0,
				  "seed=%llu: global mask: vector %zu bitmap differs from vector 0",
				  (unsigned long long)k->seed, i);
	}
	if (k->select == MKV_SELECT_GLOBAL) {
		double min_kept = INFINITY, max_drop = 0, tmax = 0;
		for (uint32_t j = 0; j < ng; j++) {
			if (total[j] > tmax)
				tmax = total[j];
			if (th_bit(v.bitmaps, j)) {
				if (total[j] < min_kept)
					min_kept = total[j];
			} else if (total[j] > max_drop) {
				max_drop = total[j];
			}
		}
		cr_assert(max_drop <= min_kept + 1e-5 * tmax,
			  "seed=%llu d=%u g=%u r=%u: global mask dropped a group of total energy %.9g, kept %.9g",
			  (unsigned long long)k->seed, d, g, r, max_drop, min_kept);
	}
	free(energy);
	free(total);
	free(sorted);
	free(dec);
	free(xr);
	free(R);
	mkv_segment_destroy(s);
	free(x);
	free(buf);
	free(ref);
}

static void run_cases(enum mkv_select sel)
{
	for (int di = 0; di < 3; di++)
		for (int gi = 0; gi < 4; gi++) {
			struct sel_case k = {.seed = th_seed(), .select = sel};
			struct th_rng rng;
			th_rng_init(&rng, k.seed);
			k.d = dims[di];
			k.g = groups[gi];
			k.drop = th_below(&rng, 2);
			uint32_t dk = k.drop ? k.d - k.d / 4 : k.d;
			/* r: a random multiple of g, including the extremes */
			uint32_t m = dk / k.g;
			uint32_t pick = th_below(&rng, 4);
			k.r = k.g * (pick == 0 ? 1 : pick == 1 ? m : 1 + th_below(&rng, m));
			k.b = 8u << th_below(&rng, 4);
			k.in_dt = (enum mkv_dtype)th_below(&rng, 3);
			k.n = k.d == 256 ? 90 + th_below(&rng, 40) : 150 + th_below(&rng, 100);
			check_selection(&k);
		}
}

Test(select, per_vector_keeps_top_r) { run_cases(MKV_SELECT_PER_VECTOR); }
Test(select, global_mask_keeps_top_total_energy) { run_cases(MKV_SELECT_GLOBAL); }

/* Without rotation the selection is over the original channels: the kept
 * values are the inputs themselves, bit for bit (f32 in, f32 stored). */
Test(select, unrotated_keeps_largest_inputs_exactly)
{
	uint64_t seed = th_seed();
	struct th_rng rng;
	th_rng_init(&rng, seed);
	for (int gi = 0; gi < 4; gi++) {
		uint32_t d = 128, g = groups[gi], r = 32;
		size_t n = 200;
		float *x = th_alloc(n * d * sizeof *x);
		th_gaussian(&rng, x, n * d, 1.0);
		struct mkv_encode_opts o;
		cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
		o.d = d;
		o.g = g;
		o.r = r;
		o.rotate = 0;
		o.drop = 0;
		o.store_dtype = MKV_DTYPE_F32;
		struct mkv_segment *s = NULL;
		cr_assert_eq(mkv_segment_encode(&o, x, MKV_DTYPE_F32, n, &s), 0);
		float *dec = th_alloc(n * d * sizeof *dec);
		cr_assert_eq(mkv_segment_decode(s, 0, n, MKV_SPACE_ROTATED, dec), 0);
		double e[128];
		for (size_t i = 0; i < n; i++) {
			uint32_t kept = 0;
			double min_kept = INFINITY, max_drop = 0;
			for (uint32_t j = 0; j < d / g; j++) {
				e[j] = 0;
				for (uint32_t t = 0; t < g; t++)
					e[j] += (double)x[i * d + j * g + t] * x[i * d + j * g + t];
				bool k0 = dec[i * d + j * g] != 0.0f;
				for (uint32_t t = 0; t < g; t++) {
					float got = dec[i * d + j * g + t];
					if (k0)
						cr_assert(memcmp(&got, &x[i * d + j * g + t], 4) == 0,
							  "seed=%llu g=%u: vector %zu channel %u: %a, input %a",
							  (unsigned long long)seed, g, i, j * g + t,
							  got, x[i * d + j * g + t]);
					else
						cr_assert(got == 0.0f);
				}
				if (k0) {
					kept++;
					if (e[j] < min_kept)
						min_kept = e[j];
				} else if (e[j] > max_drop) {
					max_drop = e[j];
				}
			}
			cr_assert_eq(kept, r / g, "seed=%llu g=%u: vector %zu kept %u groups",
				     (unsigned long long)seed, g, i, kept);
			cr_assert(max_drop <= min_kept * (1 + 1e-6),
				  "seed=%llu g=%u: vector %zu dropped energy %.9g > kept %.9g",
				  (unsigned long long)seed, g, i, max_drop, min_kept);
		}
		free(dec);
		free(x);
		mkv_segment_destroy(s);
	}
}

/* The view describes the segment as encoded. */
Test(select, view_fields)
{
	uint64_t seed = th_seed();
	struct th_rng rng;
	th_rng_init(&rng, seed);
	for (int it = 0; it < 12; it++) {
		uint32_t d = dims[th_below(&rng, 3)];
		uint32_t g = groups[th_below(&rng, 4)];
		uint32_t drop = th_below(&rng, 2);
		uint32_t dk = drop ? d - d / 4 : d;
		uint32_t r = g * (1 + th_below(&rng, dk / g));
		uint32_t b = 8u << th_below(&rng, 4);
		enum mkv_kind kind = th_below(&rng, 2) ? MKV_KIND_KEY : MKV_KIND_VALUE;
		enum mkv_dtype sd = th_below(&rng, 2) ? MKV_DTYPE_BF16 : MKV_DTYPE_F32;
		/* S is for keys; the library refuses it on value segments */
		uint32_t S = kind == MKV_KIND_VALUE || th_below(&rng, 2) ? 0 : 1 + th_below(&rng, dk);
		size_t n = 1 + th_below(&rng, 200);
		float *x = th_alloc(n * d * sizeof *x);
		th_gaussian(&rng, x, n * d, 1.0);
		struct mkv_encode_opts o;
		cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
		o.d = d;
		o.g = g;
		o.r = r;
		o.b = b;
		o.drop = drop;
		o.kind = kind;
		o.store_dtype = sd;
		o.summary_channels = S;
		struct mkv_segment *s = NULL;
		int rc = mkv_segment_encode(&o, x, MKV_DTYPE_F32, n, &s);
		cr_assert_eq(rc, 0, "seed=%llu it=%d: rc=%d (%s)", (unsigned long long)seed,
			     it, rc, mkv_strerror(rc));
		struct mkv_packed_view v;
		cr_assert_eq(mkv_segment_view(s, &v), 0);
		cr_assert_eq(v.n, n);
		cr_assert_eq(v.d, d);
		cr_assert_eq(v.d_keep, dk);
		cr_assert_eq(v.r, r);
		cr_assert_eq(v.g, g);
		cr_assert_eq(v.b, b);
		cr_assert_eq(v.n_blocks, (n + b - 1) / b);
		cr_assert_eq(v.bitmap_bytes, (dk / g + 7) / 8);
		cr_assert_eq(v.kind, kind);
		cr_assert_eq(v.store_dtype, sd);
		cr_assert_eq(v.rotated, 1);
		cr_assert_not_null(v.values);
		cr_assert_not_null(v.bitmaps);
		cr_assert_not_null(v.rotation);
		if (kind == MKV_KIND_KEY) {
			uint32_t want = S ? S : (r < dk ? r : dk);
			cr_assert_eq(v.summary_channels, want,
				     "seed=%llu: summary_channels %u, want %u",
				     (unsigned long long)seed, v.summary_channels, want);
			cr_assert_not_null(v.sum_min);
			cr_assert_not_null(v.sum_max);
		} else {
			cr_assert_eq(v.summary_channels, 0);
			cr_assert_null(v.sum_min);
			cr_assert_null(v.sum_max);
		}
		/* the padding bits past d_keep/g are clear: popcount = r/g */
		for (size_t i = 0; i < n; i++)
			cr_assert_eq(th_popcount_bits(v.bitmaps + i * v.bitmap_bytes,
						      v.bitmap_bytes * 8), r / g,
				     "seed=%llu it=%d: vector %zu popcount", (unsigned long long)seed,
				     it, i);
		mkv_segment_destroy(s);
		free(x);
	}
}
