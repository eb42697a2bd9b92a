/* SPDX-License-Identifier: MIT */
/*
 * 8-bit block scores (mkv_attn_opts.summary_bits = 8).
 *  - mkv_summary8: each block's scale is the bf16 rounding up of its
 *    largest |bound| / 127 and its rows are the floor / ceiling of the
 *    bounds on that grid (checked here in double against the view);
 *  - mkv_query8: the nearest integer on the grid of max |q'| / 127;
 *  - mkv_score8: the integer sums against a double computation;
 *  - mkv_score_blocks with 8 bits stays within the quantization's own
 *    error bound of the 16-bit scores (derived here from the view and a
 *    double rotation of the query), and selection follows the 8-bit scores;
 *  - bad arguments are refused and write nothing;
 *  - a segment keeping its rows (mkv_segment_keep_summary8) scores, selects
 *    and attends as one making them per call, bit for bit.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

struct seg8 {
	uint32_t d, nq, S, dk;
	size_t n;
	float *k, *q;
	double *qr; /* nq × dk: R q in double */
	struct mkv_segment *ks;
	struct mkv_packed_view v;
};

static void seg8_make(struct seg8 *s, struct th_rng *rng, uint64_t seed, enum mkv_dtype st)
{
	memset(s, 0, sizeof *s);
	s->d = 64u << th_below(rng, 2);
	s->nq = 1 + th_below(rng, 8);
	s->n = 40 + th_below(rng, 400);
	s->k = th_alloc(s->n * s->d * sizeof(float));
	s->q = th_alloc((size_t)s->nq * s->d * sizeof(float));
	th_gaussian(rng, s->k, s->n * s->d, 1.0);
	/* a few channels much larger: blocks with a wide range of bounds */
	for (size_t i = 0; i < s->n; i++)
		s->k[i * s->d + i % 5] *= 6.0f;
	th_gaussian(rng, s->q, (size_t)s->nq * s->d, 1.0);
	struct mkv_encode_opts o;
	cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
	o.d = s->d;
	o.r = s->d / 4;
	o.b = 8u << th_below(rng, 3);
	o.store_dtype = st;
	o.kind = MKV_KIND_KEY;
	o.summary_channels = 1 + th_below(rng, 40);
	int rc = mkv_segment_encode(&o, s->k, MKV_DTYPE_F32, s->n, &s->ks);
	cr_assert_eq(rc, 0, "seed=%llu: encode rc=%d", (unsigned long long)seed, rc);
	cr_assert_eq(mkv_segment_view(s->ks, &s->v), 0);
	s->S = s->v.summary_channels;
	s->dk = s->v.d_keep;
	double *R = th_alloc((size_t)s->dk * s->d * sizeof *R);
	th_view_rotation(&s->v, R);
	s->qr = th_alloc((size_t)s->nq * s->dk * sizeof(double));
	for (uint32_t h = 0; h < s->nq; h++)
		for (uint32_t a = 0; a < s->dk; a++) {
			double acc = 0;
			for (uint32_t c = 0; c < s->d; c++)
				acc += R[(size_t)a * s->d + c] * s->q[(size_t)h * s->d + c];
			s->qr[(size_t)h * s->dk + a] = acc;
		}
	free(R);
}

static void seg8_free(struct seg8 *s)
{
	mkv_segment_destroy(s->ks);
	free(s->k);
	free(s->q);
	free(s->qr);
}

/* x is floor(t) of a float division t = a / b: the double quotient's floor,
 * or one more where the float division rounded onto the next integer. */
static bool floor_of(int x, double a, double b, int up)
{
	double t = a / b;
	double f = up ? ceil(t) : floor(t);
	if (f > 127)
		f = 127;
	if (f < -127)
		f = -127;
	if (x == (int)f)
		return true;
	double near = up ? floor(t) : ceil(t); /* the other side */
	return x == (int)near && fabs(t - near) <= 1e-6 * fmax(1.0, fabs(t));
}

Test(score8, summary8_rows_bound_on_the_grid)
{
	for (int it = 0; it < 6; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		struct seg8 s;
		seg8_make(&s, &rng, seed, it & 1 ? MKV_DTYPE_F32 : MKV_DTYPE_BF16);
		uint32_t S = s.S, nb = s.v.n_blocks;
		int8_t *rows = th_alloc((size_t)nb * 2 * S);
		float *sc = th_alloc(nb * sizeof(float));
		cr_assert_eq(mkv_summary8(s.ks, rows, sc), 0);
		for (uint32_t j = 0; j < nb; j++) {
			double a = 0;
			for (uint32_t c = 0; c < S; c++) {
				a = fmax(a, fabs(th_elem(s.v.sum_min, s.v.store_dtype, (size_t)j * S + c)));
				a = fmax(a, fabs(th_elem(s.v.sum_max, s.v.store_dtype, (size_t)j * S + c)));
			}
			double want = a / 127.0;
			/* a bf16 value: the smallest one at or above a / 127 */
			uint32_t u;
			memcpy(&u, &sc[j], 4);
			cr_assert_eq(u & 0xffffu, 0u, "seed=%llu block %u: scale %.9g is not bf16",
				     (unsigned long long)seed, j, sc[j]);
			if (a == 0) {
				cr_assert_eq(sc[j], 1.0f);
			} else {
				cr_assert(sc[j] >= want * (1 - 1e-7) && sc[j] <= want * (1 + 0x1p-7),
					  "seed=%llu block %u: scale %.9g for a/127 = %.9g",
					  (unsigned long long)seed, j, sc[j], want);
			}
			for (uint32_t c = 0; c < S; c++) {
				double mn = th_elem(s.v.sum_min, s.v.store_dtype, (size_t)j * S + c);
				double mx = th_elem(s.v.sum_max, s.v.store_dtype, (size_t)j * S + c);
				int lo = rows[(size_t)j * 2 * S + c], hi = rows[(size_t)j * 2 * S + S + c];
				cr_assert(lo >= -127 && hi <= 127 && lo <= hi);
				cr_assert(floor_of(lo, mn, sc[j], 0) && floor_of(hi, mx, sc[j], 1),
					  "seed=%llu block %u ch %u: [%d, %d] x %.9g for [%.9g, %.9g]",
					  (unsigned long long)seed, j, c, lo, hi, sc[j], mn, mx);
			}
		}
		free(rows);
		free(sc);
		seg8_free(&s);
	}
}

Test(score8, query8_nearest_on_its_grid)
{
	uint64_t seed = th_seed();
	struct th_rng rng;
	th_rng_init(&rng, seed);
	for (int it = 0; it < 200; it++) {
		uint32_t S = 1 + th_below(&rng, 256);
		float qr[256];
		int8_t qi[256];
		float sc;
		th_gaussian(&rng, qr, S, 0.01 + 10 * th_uniform(&rng));
		if (it % 7 == 0)
			qr[th_below(&rng, S)] = 0.0f;
		cr_assert_eq(mkv_query8(qr, S, qi, &sc), 0);
		double m = 0;
		for (uint32_t c = 0; c < S; c++)
			m = fmax(m, fabs(qr[c]));
		if (m == 0) { /* S = 1 and its channel zeroed: scale 1, a zero */
			cr_assert(sc == 1.0f && qi[0] == 0, "seed=%llu: a zero query gives %.9g, %d",
				  (unsigned long long)seed, sc, qi[0]);
			continue;
		}
		cr_assert(fabs(sc - m / 127.0) <= 1e-7 * m, "seed=%llu: scale %.9g, max %.9g",
			  (unsigned long long)seed, sc, m);
		int top = 0;
		for (uint32_t c = 0; c < S; c++) {
			double t = qr[c] / (double)sc;
			cr_assert(abs(qi[c]) <= 127);
			cr_assert(fabs(qi[c] - t) <= 0.5 + 1e-5, "seed=%llu ch %u: %d for %.9g",
				  (unsigned long long)seed, c, qi[c], t);
			top = abs(qi[c]) > top ? abs(qi[c]) : top;
		}
		cr_assert_eq(top, 127, "seed=%llu: the largest |q'| maps to 127",
			     (unsigned long long)seed);
	}
	/* an all-zero query: scale 1, zeros */
	float z[8] = {0};
	int8_t qi[8];
	float sc;
	memset(qi, 5, sizeof qi);
	cr_assert_eq(mkv_query8(z, 8, qi, &sc), 0);
	cr_assert_eq(sc, 1.0f);
	for (int c = 0; c < 8; c++)
		cr_assert_eq(qi[c], 0);
}

Test(score8, score8_integer_sums)
{
	uint64_t seed = th_seed();
	struct th_rng rng;
	th_rng_init(&rng, seed);
	for (int it = 0; it < 300; it++) {
		uint32_t nq = 1 + th_below(&rng, MKV_MAX_QHEADS), S = 1 + th_below(&rng, 256);
		int8_t *qi = th_alloc((size_t)nq * S), row[512];
		float qs[MKV_MAX_QHEADS], qp[MKV_MAX_QHEADS];
		for (size_t i = 0; i < (size_t)nq * S; i++)
			qi[i] = (int8_t)((int)th_below(&rng, 255) - 127);
		for (uint32_t c = 0; c < S; c++) {
			int a = (int)th_below(&rng, 255) - 127, b = (int)th_below(&rng, 255) - 127;
			row[c] = (int8_t)(a < b ? a : b);
			row[S + c] = (int8_t)(a < b ? b : a);
		}
		for (uint32_t h = 0; h < nq; h++) {
			qs[h] = (float)(0.001 + th_uniform(&rng));
			qp[h] = (float)th_uniform(&rng);
		}
		float scale = (float)(0.01 + th_uniform(&rng)), rest = (float)th_uniform(&rng);
		int with_perp = it & 1;
		float got;
		cr_assert_eq(mkv_score8(nq, S, qi, qs, with_perp ? qp : NULL, row, scale, rest, &got),
			     0);
		double best = -INFINITY, mag = 0;
		for (uint32_t h = 0; h < nq; h++) {
			long long isum = 0;
			for (uint32_t c = 0; c < S; c++) {
				int q = qi[(size_t)h * S + c];
				isum += (long long)q * (q > 0 ? row[S + c] : row[c]);
			}
			double sh = (double)qs[h] * scale * (double)isum;
			double m = fabs(sh);
			if (with_perp) {
				sh += (double)qp[h] * rest;
				m += fabs((double)qp[h] * rest);
			}
			best = fmax(best, sh);
			mag = fmax(mag, m);
		}
		/* three float roundings at most */
		cr_assert(fabs(got - best) <= 4 * 0x1p-24 * mag, "seed=%llu: %.9g want %.9g",
			  (unsigned long long)seed, got, best);
		free(qi);
	}
}

Test(score8, scores_near_the_bound_and_select_by_them)
{
	for (int it = 0; it < 6; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		struct seg8 s;
		seg8_make(&s, &rng, seed, it & 1 ? MKV_DTYPE_F32 : MKV_DTYPE_BF16);
		uint32_t S = s.S, nb = s.v.n_blocks, nq = s.nq;
		struct mkv_attn_opts o16, o8;
		cr_assert_eq(mkv_attn_opts_init(&o16, sizeof o16), 0);
		cr_assert_eq(o16.summary_bits, 16u);
		o16.d = s.d;
		o16.n_q = nq;
		o16.token_frac = 0.2;
		o8 = o16;
		o8.summary_bits = 8;
		float *s16 = th_alloc(nb * sizeof(float)), *s8 = th_alloc(nb * sizeof(float));
		cr_assert_eq(mkv_score_blocks(&o16, s.q, s.ks, s16), 0);
		cr_assert_eq(mkv_score_blocks(&o8, s.q, s.ks, s8), 0);
		int8_t *rows = th_alloc((size_t)nb * 2 * S);
		float *sc = th_alloc(nb * sizeof(float));
		cr_assert_eq(mkv_summary8(s.ks, rows, sc), 0);
		uint32_t moved = 0;
		for (uint32_t j = 0; j < nb; j++) {
			/* per term q_c b_c -> (qsc qi_c)(sc B_c): |qsc qi_c - q_c| <=
			 * qsc / 2, |sc B_c - b_c| <= sc, so the term moves by at most
			 * |q_c| sc + qsc / 2 (|b_c| + sc); the max over heads moves by
			 * at most the largest head's sum */
			double tol = 0;
			for (uint32_t h = 0; h < nq; h++) {
				const double *q = s.qr + (size_t)h * s.dk;
				double m = 0, t = 0, mag = 0;
				for (uint32_t c = 0; c < S; c++)
					m = fmax(m, fabs(q[c]));
				double qsc = m / 127.0 * (1 + 1e-5);
				for (uint32_t c = 0; c < S; c++) {
					double b = fmax(fabs(th_elem(s.v.sum_min, s.v.store_dtype,
								     (size_t)j * S + c)),
							fabs(th_elem(s.v.sum_max, s.v.store_dtype,
								     (size_t)j * S + c)));
					t += fabs(q[c]) * sc[j] + qsc / 2 * (b + sc[j]);
					mag += fabs(q[c]) * b;
				}
				tol = fmax(tol, t + 1e-5 * mag);
			}
			double gap = fabs((double)s8[j] - s16[j]);
			cr_assert(gap <= tol + 1e-5 * fabs(s16[j]),
				  "seed=%llu S=%u block %u: 8-bit %.9g, bound %.9g, allowed %.3g",
				  (unsigned long long)seed, S, j, s8[j], s16[j], tol);
			moved += s8[j] != s16[j];
		}
		cr_assert(moved > 0, "seed=%llu: no score changed", (unsigned long long)seed);
		/* the selection is the top of the 8-bit scores: every selected
		 * block but the sink scores at least every unselected one */
		struct mkv_block_ref *sel = th_alloc(nb * sizeof(*sel));
		const struct mkv_segment *ks[1] = {s.ks};
		int64_t ns = mkv_select_blocks(&o8, s.q, ks, 1, sel, nb);
		cr_assert(ns >= 1 && ns <= nb);
		uint8_t *in = th_alloc(nb);
		for (int64_t i = 0; i < ns; i++)
			in[sel[i].block] = 1;
		cr_assert(in[0], "sink");
		float lo = INFINITY, hi = -INFINITY;
		for (uint32_t j = 1; j < nb; j++) {
			if (in[j])
				lo = fminf(lo, s8[j]);
			else
				hi = fmaxf(hi, s8[j]);
		}
		cr_assert(ns == 1 || hi <= lo, "seed=%llu: unselected %.9g above selected %.9g",
			  (unsigned long long)seed, hi, lo);
		free(in);
		free(sel);
		free(rows);
		free(sc);
		free(s16);
		free(s8);
		seg8_free(&s);
	}
}

Test(score8, bad_arguments_write_nothing)
{
	uint64_t seed = th_seed();
	struct th_rng rng;
	th_rng_init(&rng, seed);
	struct seg8 s;
	seg8_make(&s, &rng, seed, MKV_DTYPE_BF16);
	uint32_t nb = s.v.n_blocks, S = s.S;
	int8_t *rows = th_alloc((size_t)nb * 2 * S);
	float *sc = th_alloc(nb * sizeof(float));
	memset(rows, 0x5a, (size_t)nb * 2 * S);
	cr_assert_eq(mkv_summary8(NULL, rows, sc), -EINVAL);
	cr_assert_eq(mkv_summary8(s.ks, NULL, sc), -EINVAL);
	cr_assert_eq(mkv_summary8(s.ks, rows, NULL), -EINVAL);
	/* a value segment has no summaries */
	struct mkv_encode_opts o;
	cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
	o.d = s.d;
	o.r = s.d / 4;
	o.kind = MKV_KIND_VALUE;
	struct mkv_segment *vs = NULL;
	cr_assert_eq(mkv_segment_encode(&o, s.k, MKV_DTYPE_F32, s.n, &vs), 0);
	cr_assert_eq(mkv_summary8(vs, rows, sc), -EINVAL);
	mkv_segment_destroy(vs);
	for (size_t i = 0; i < (size_t)nb * 2 * S; i++)
		cr_assert_eq(rows[i], 0x5a);
	float q[4] = {1, NAN, 2, 3}, qs = 7.0f;
	int8_t qi[4] = {9, 9, 9, 9};
	cr_assert_eq(mkv_query8(q, 4, qi, &qs), -MKV_ENONFINITE);
	cr_assert_eq(mkv_query8(q, 0, qi, &qs), -EINVAL);
	cr_assert_eq(mkv_query8(q, 257, qi, &qs), -EINVAL);
	cr_assert_eq(mkv_query8(NULL, 4, qi, &qs), -EINVAL);
	cr_assert(qi[0] == 9 && qi[3] == 9 && qs == 7.0f);
	float out = 3.0f, one = 1.0f;
	int8_t row[8] = {0};
	cr_assert_eq(mkv_score8(0, 4, qi, &one, NULL, row, 1, 0, &out), -EINVAL);
	cr_assert_eq(mkv_score8(MKV_MAX_QHEADS + 1, 4, qi, &one, NULL, row, 1, 0, &out), -EINVAL);
	cr_assert_eq(mkv_score8(1, 0, qi, &one, NULL, row, 1, 0, &out), -EINVAL);
	cr_assert_eq(mkv_score8(1, 4, NULL, &one, NULL, row, 1, 0, &out), -EINVAL);
	cr_assert_eq(mkv_score8(1, 4, qi, &one, NULL, NULL, 1, 0, &out), -EINVAL);
	cr_assert_eq(out, 3.0f);
	/* summary_bits other than 8 and 16; a version-2 struct gets 16 */
	struct mkv_attn_opts ao;
	cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
	ao.d = s.d;
	ao.n_q = s.nq;
	float *scores = th_alloc(nb * sizeof(float));
	uint32_t bad[] = {0, 4, 12, 32};
	for (int i = 0; i < 4; i++) {
		ao.summary_bits = bad[i];
		cr_assert_eq(mkv_score_blocks(&ao, s.q, s.ks, scores), -EINVAL);
	}
	ao.summary_bits = 16;
	float *ref = th_alloc(nb * sizeof(float));
	cr_assert_eq(mkv_score_blocks(&ao, s.q, s.ks, ref), 0);
	union {
		struct mkv_attn_opts o;
		unsigned char raw[sizeof(struct mkv_attn_opts)];
	} w;
	size_t v2 = offsetof(struct mkv_attn_opts, summary_bits);
	memset(&w, 0xa7, sizeof w);
	cr_assert_eq(mkv_attn_opts_init(&w.o, v2), 0);
	for (size_t i = v2; i < sizeof w; i++)
		cr_assert_eq(w.raw[i], 0xa7, "byte %zu past a version-2 struct written", i);
	w.o.d = s.d;
	w.o.n_q = s.nq;
	cr_assert_eq(mkv_score_blocks(&w.o, s.q, s.ks, scores), 0);
	cr_assert(memcmp(scores, ref, nb * sizeof(float)) == 0,
		  "a version-2 caller scores with 16 bits");
	free(ref);
	free(scores);
	free(rows);
	free(sc);
	seg8_free(&s);
}

/*
 * mkv_segment_keep_summary8: a segment that keeps its 8-bit rows scores,
 * selects and attends as an identical one that makes them per call, bit for
 * bit; keeping twice is keeping once; the 16-bit scores do not change;
 * NULL and value segments are refused.
 */
Test(score8, keep_summary8_same_bits_as_per_call)
{
	uint64_t seed = th_seed();
	struct th_rng rng;
	th_rng_init(&rng, seed);
	const uint32_t d = 128, nq = 4, nseg = 3;
	const size_t n = 300 + th_below(&rng, 500);
	float *x = th_alloc(n * d * sizeof(float)), *y = th_alloc(n * d * sizeof(float));
	float *q = th_alloc((size_t)nq * d * sizeof(float));
	th_gaussian(&rng, q, (size_t)nq * d, 1.0);
	struct mkv_segment *ka[3], *kb[3], *vs[3];
	struct mkv_encode_opts o;
	cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
	o.d = d;
	o.r = d / 4;
	o.b = 16;
	const uint32_t S = 8 * (1 + th_below(&rng, 4));
	for (uint32_t s = 0; s < nseg; s++) {
		th_gaussian(&rng, x, n * d, 1.0);
		th_gaussian(&rng, y, n * d, 1.0);
		for (size_t i = 0; i < n; i++)
			x[i * d + (i + s) % 7] *= 5.0f;
		o.kind = MKV_KIND_KEY;
		o.summary_channels = S;
		cr_assert_eq(mkv_segment_encode(&o, x, MKV_DTYPE_F32, n, &ka[s]), 0);
		cr_assert_eq(mkv_segment_encode(&o, x, MKV_DTYPE_F32, n, &kb[s]), 0);
		o.kind = MKV_KIND_VALUE;
		o.summary_channels = 0;
		cr_assert_eq(mkv_segment_encode(&o, y, MKV_DTYPE_F32, n, &vs[s]), 0);
		cr_assert_eq(mkv_segment_keep_summary8(kb[s]), 0);
		cr_assert_eq(mkv_segment_keep_summary8(kb[s]), 0);
	}
	cr_assert_eq(mkv_segment_keep_summary8(NULL), -EINVAL);
	cr_assert_eq(mkv_segment_keep_summary8(vs[0]), -EINVAL);
	struct mkv_attn_opts ao;
	cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
	ao.d = d;
	ao.n_q = nq;
	ao.token_frac = 0.2;
	struct mkv_packed_view kv0;
	cr_assert_eq(mkv_segment_view(ka[0], &kv0), 0);
	uint32_t nb = kv0.n_blocks;
	float *sa = th_alloc(nb * sizeof(float)), *sb = th_alloc(nb * sizeof(float));
	for (int bits = 8; bits <= 16; bits += 8) {
		ao.summary_bits = (uint32_t)bits;
		for (uint32_t s = 0; s < nseg; s++) {
			cr_assert_eq(mkv_score_blocks(&ao, q, ka[s], sa), 0);
			cr_assert_eq(mkv_score_blocks(&ao, q, kb[s], sb), 0);
			cr_assert(memcmp(sa, sb, nb * sizeof(float)) == 0,
				  "seed %llu bits %d segment %u: scores differ",
				  (unsigned long long)seed, bits, s);
		}
		struct mkv_block_ref ra[3 * 64], rb[3 * 64];
		int64_t na = mkv_select_blocks(&ao, q, (const struct mkv_segment *const *)ka, nseg,
					       ra, 3 * 64);
		int64_t nb2 = mkv_select_blocks(&ao, q, (const struct mkv_segment *const *)kb, nseg,
						rb, 3 * 64);
		cr_assert(na > 0 && na == nb2 && na <= 3 * 64, "selected %lld and %lld",
			  (long long)na, (long long)nb2);
		cr_assert(memcmp(ra, rb, (size_t)na * sizeof ra[0]) == 0,
			  "seed %llu bits %d: selections differ", (unsigned long long)seed, bits);
		float oa[4 * 128], ob[4 * 128];
		cr_assert_eq(mkv_attend_packed(&ao, q, (const struct mkv_segment *const *)ka,
					       (const struct mkv_segment *const *)vs, nseg, NULL, oa,
					       NULL), 0);
		cr_assert_eq(mkv_attend_packed(&ao, q, (const struct mkv_segment *const *)kb,
					       (const struct mkv_segment *const *)vs, nseg, NULL, ob,
					       NULL), 0);
		cr_assert(memcmp(oa, ob, sizeof oa) == 0, "seed %llu bits %d: outputs differ",
			  (unsigned long long)seed, bits);
	}
	for (uint32_t s = 0; s < nseg; s++) {
		mkv_segment_destroy(ka[s]);
		mkv_segment_destroy(kb[s]);
		mkv_segment_destroy(vs[s]);
	}
	free(sa);
	free(sb);
	free(x);
	free(y);
	free(q);
}
