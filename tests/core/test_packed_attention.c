/* SPDX-License-Identifier: MIT */
/*
 * PackedAttention, dense and Quest attention against a double-precision
 * dense softmax attention written here.
 *
 * Lossless setting (r = d, no drop, f32 storage, every block selected): the
 * packed result must equal dense attention to 1e-5 relative, for every
 * supported d, every input dtype, 1 and 4 query heads, and several segments
 * of different lengths and block sizes plus a dense window.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

static const uint32_t block_sizes[4] = {8, 16, 32, 64};

/* One attention context: segments followed by a dense window. */
struct ctx {
	uint32_t d, nq, nseg;
	enum mkv_dtype dt;
	size_t lens[8];
	uint32_t bs[8];
	size_t nwin, ntot;
	void *kbuf, *vbuf;      /* ntot × d in dt */
	double *kref, *vref;    /* ntot × d, the values the library sees */
	float *q;               /* nq × d */
	double *qref;
	struct mkv_segment *ks[8], *vs[8];
};

/*
 * Keys and values: Gaussian with a per-channel scale and a shared offset,
 * so that the covariance has a real spread of eigenvalues; for
 * @low_rank, a rank-d/8 latent mixed into d channels plus 5% noise.
 */
static void fill_kv(struct th_rng *g, float *x, size_t n, uint32_t d,
		    bool low_rank)
{
	if (!low_rank) {
		double *sc = th_alloc(d * sizeof *sc), *off = th_alloc(d * sizeof *off);
		for (uint32_t c = 0; c < d; c++) {
			sc[c] = exp(-2.0 * c / d) * (0.5 + th_uniform(g));
			off[c] = 0.3 * th_normal(g);
		}
		for (size_t i = 0; i < n; i++)
			for (uint32_t c = 0; c < d; c++)
				x[i * d + c] = (float)(off[c] + sc[c] * th_normal(g));
		free(sc);
		free(off);
		return;
	}
	uint32_t k = d / 8;
	double *mix = th_alloc((size_t)k * d * sizeof *mix);
	double *z = th_alloc(k * sizeof *z);
	for (size_t i = 0; i < (size_t)k * d; i++)
		mix[i] = th_normal(g) / sqrt((double)k);
	for (size_t i = 0; i < n; i++) {
		for (uint32_t a = 0; a < k; a++)
			z[a] = th_normal(g);
		for (uint32_t c = 0; c < d; c++) {
			double acc = 0.05 * th_normal(g);
			for (uint32_t a = 0; a < k; a++)
				acc += z[a] * mix[(size_t)a * d + c];
			x[i * d + c] = (float)acc;
		}
	}
	free(z);
	free(mix);
}

static void ctx_init(struct ctx *c, struct th_rng *g, uint32_t d, uint32_t nq,
		     enum mkv_dtype dt, uint32_t nseg, size_t nwin, bool low_rank)
{
	memset(c, 0, sizeof *c);
	c->d = d;
	c->nq = nq;
	c->dt = dt;
	c->nseg = nseg;
	c->nwin = nwin;
	c->ntot = nwin;
	for (uint32_t s = 0; s < nseg; s++) {
		/* lengths not multiples of the block size, one short segment */
		c->lens[s] = s == 1 ? 1 + th_below(g, 20) : 60 + th_below(g, 300);
		c->bs[s] = block_sizes[th_below(g, 4)];
		c->ntot += c->lens[s];
	}
	size_t nd = c->ntot * d;
	float *k = th_alloc(nd * sizeof *k), *v = th_alloc(nd * sizeof *v);
	fill_kv(g, k, c->ntot, d, low_rank);
	fill_kv(g, v, c->ntot, d, low_rank);
	c->kbuf = th_alloc(nd * 4);
	c->vbuf = th_alloc(nd * 4);
	c->kref = th_alloc(nd * sizeof(double));
	c->vref = th_alloc(nd * sizeof(double));
	th_encode_dt(k, nd, dt, c->kbuf, c->kref);
	th_encode_dt(v, nd, dt, c->vbuf, c->vref);
	free(k);
	free(v);
	c->q = th_alloc((size_t)nq * d * sizeof(float));
	c->qref = th_alloc((size_t)nq * d * sizeof(double));
	th_gaussian(g, c->q, (size_t)nq * d, 1.5);
	for (size_t i = 0; i < (size_t)nq * d; i++)
		c->qref[i] = c->q[i];
}

static const void *ptr_at(const void *buf, enum mkv_dtype dt, size_t elem)
{
	return (const char *)buf + elem * th_dtype_size(dt);
}

/* Encode every segment's K and V with @base (kind and b are set here). */
static int ctx_encode(struct ctx *c, const struct mkv_encode_opts *base)
{
	size_t off = 0;
	for (uint32_t s = 0; s < c->nseg; s++) {
		struct mkv_encode_opts o = *base;
		o.b = c->bs[s];
		o.kind = MKV_KIND_KEY;
		int rc = mkv_segment_encode(&o, ptr_at(c->kbuf, c->dt, off * c->d),
					    c->dt, c->lens[s], &c->ks[s]);
		if (rc)
			return rc;
		o.kind = MKV_KIND_VALUE;
		rc = mkv_segment_encode(&o, ptr_at(c->vbuf, c->dt, off * c->d),
					c->dt, c->lens[s], &c->vs[s]);
		if (rc)
			return rc;
		off += c->lens[s];
	}
	return 0;
}

static struct mkv_dense_kv ctx_window(const struct ctx *c)
{
	size_t off = (c->ntot - c->nwin) * c->d;
	struct mkv_dense_kv w = {
		.k = ptr_at(c->kbuf, c->dt, off),
		.v = ptr_at(c->vbuf, c->dt, off),
		.dtype = c->dt,
		.n = c->nwin,
	};
	return w;
}

static void ctx_free(struct ctx *c)
{
	for (uint32_t s = 0; s < c->nseg; s++) {
		mkv_segment_destroy(c->ks[s]);
		mkv_segment_destroy(c->vs[s]);
	}
	free(c->kbuf);
	free(c->vbuf);
	free(c->kref);
	free(c->vref);
	free(c->q);
	free(c->qref);
}

static size_t ctx_blocks(const struct ctx *c)
{
	size_t nb = 0;
	for (uint32_t s = 0; s < c->nseg; s++)
		nb += (c->lens[s] + c->bs[s] - 1) / c->bs[s];
	return nb;
}

static void lossless_opts(struct mkv_encode_opts *o, uint32_t d, uint32_t g)
{
	cr_assert_eq(mkv_encode_opts_init(o, sizeof *o), 0);
	o->d = d;
	o->r = d;
	o->g = g; /* r = d keeps every group whatever g is */
	o->drop = 0;
	o->rotate = 1;
	o->store_dtype = MKV_DTYPE_F32;
}

static void attn_opts(struct mkv_attn_opts *a, uint32_t d, uint32_t nq,
		      double frac)
{
	cr_assert_eq(mkv_attn_opts_init(a, sizeof *a), 0);
	a->d = d;
	a->n_q = nq;
	a->token_frac = frac;
}

/* The packed, dense and Quest paths at one (d, dtype, n_q). */
static void check_exact(uint32_t d, enum mkv_dtype dt, uint32_t nq)
{
	uint64_t seed = th_seed();
	struct th_rng g;
	th_rng_init(&g, seed);
	struct ctx c;
	uint32_t nseg = 2 + th_below(&g, 3);
	ctx_init(&c, &g, d, nq, dt, nseg, th_below(&g, 40), false);

	struct mkv_encode_opts eo;
	lossless_opts(&eo, d, 1u << th_below(&g, 4));
	int rc = ctx_encode(&c, &eo);
	cr_assert_eq(rc, 0, "seed=%llu d=%u dt=%s: encode returned %d (%s)",
		     (unsigned long long)seed, d, th_dtype_name(dt), rc,
		     mkv_strerror(rc));

	double *ref = th_alloc((size_t)nq * d * sizeof *ref);
	th_attention(nq, d, 1.0 / sqrt((double)d), c.qref, c.kref, c.vref, c.ntot,
		     ref);

	struct mkv_attn_opts ao;
	attn_opts(&ao, d, nq, 1.0);
	float *out = th_alloc((size_t)nq * d * sizeof *out);
	struct mkv_dense_kv win = ctx_window(&c);
	struct mkv_attn_stats st;
	memset(&st, 0xa5, sizeof st);
	rc = mkv_attend_packed(&ao, c.q, (const struct mkv_segment *const *)c.ks,
			       (const struct mkv_segment *const *)c.vs, c.nseg,
			       c.nwin ? &win : NULL, out, &st);
	cr_assert_eq(rc, 0, "seed=%llu d=%u dt=%s nq=%u: attend_packed rc=%d (%s)",
		     (unsigned long long)seed, d, th_dtype_name(dt), nq, rc,
		     mkv_strerror(rc));
	double err = th_rel_err_fd(out, ref, (size_t)nq * d);
	cr_assert(err < 1e-5,
		  "seed=%llu d=%u g=%u dt=%s nq=%u nseg=%u win=%zu: packed rel err %.3g >= 1e-5",
		  (unsigned long long)seed, d, eo.g, th_dtype_name(dt), nq, c.nseg,
		  c.nwin, err);
	size_t nb = ctx_blocks(&c);
	cr_assert_eq(st.blocks_total, nb, "seed=%llu: blocks_total %zu, want %zu",
		     (unsigned long long)seed, st.blocks_total, nb);
	cr_assert_eq(st.blocks_selected, nb, "seed=%llu: blocks_selected %zu, want %zu",
		     (unsigned long long)seed, st.blocks_selected, nb);
	cr_assert_eq(st.tokens_attended, c.ntot, "seed=%llu: tokens_attended %zu, want %zu",
		     (unsigned long long)seed, st.tokens_attended, c.ntot);

	/* Dense attention over every token. */
	struct mkv_dense_kv all = {.k = c.kbuf, .v = c.vbuf, .dtype = dt, .n = c.ntot};
	memset(out, 0, (size_t)nq * d * sizeof *out);
	rc = mkv_attend_dense(&ao, c.q, &all, out);
	cr_assert_eq(rc, 0, "seed=%llu: attend_dense rc=%d", (unsigned long long)seed, rc);
	err = th_rel_err_fd(out, ref, (size_t)nq * d);
	cr_assert(err < 1e-5, "seed=%llu d=%u dt=%s nq=%u: dense rel err %.3g >= 1e-5",
		  (unsigned long long)seed, d, th_dtype_name(dt), nq, err);

	/* Quest with every block selected, history + window. */
	ao.quest_b = block_sizes[th_below(&g, 4)];
	struct mkv_dense_kv hist = {.k = c.kbuf, .v = c.vbuf, .dtype = dt,
				    .n = c.ntot - c.nwin};
	memset(out, 0, (size_t)nq * d * sizeof *out);
	memset(&st, 0xa5, sizeof st);
	rc = mkv_attend_quest(&ao, c.q, &hist, &win, out, &st);
	cr_assert_eq(rc, 0, "seed=%llu: attend_quest rc=%d", (unsigned long long)seed, rc);
	err = th_rel_err_fd(out, ref, (size_t)nq * d);
	cr_assert(err < 1e-5, "seed=%llu d=%u dt=%s nq=%u quest_b=%u: quest rel err %.3g >= 1e-5",
		  (unsigned long long)seed, d, th_dtype_name(dt), nq, ao.quest_b, err);
	size_t qb = (hist.n + ao.quest_b - 1) / ao.quest_b;
	cr_assert_eq(st.blocks_total, qb, "seed=%llu: quest blocks_total %zu, want %zu",
		     (unsigned long long)seed, st.blocks_total, qb);
	cr_assert_eq(st.blocks_selected, qb, "seed=%llu: quest blocks_selected %zu, want %zu",
		     (unsigned long long)seed, st.blocks_selected, qb);
	cr_assert_eq(st.tokens_attended, c.ntot, "seed=%llu: quest tokens_attended %zu, want %zu",
		     (unsigned long long)seed, st.tokens_attended, c.ntot);

	free(out);
	free(ref);
	ctx_free(&c);
}

static void check_all_dtypes(uint32_t d)
{
	const enum mkv_dtype dts[3] = {MKV_DTYPE_F32, MKV_DTYPE_F16, MKV_DTYPE_BF16};
	for (int i = 0; i < 3; i++) {
		check_exact(d, dts[i], 1);
		check_exact(d, dts[i], 4);
	}
}

Test(packed_attention, lossless_equals_dense_d64) { check_all_dtypes(64); }
Test(packed_attention, lossless_equals_dense_d128) { check_all_dtypes(128); }
Test(packed_attention, lossless_equals_dense_d256) { check_all_dtypes(256); }

/* Only segments (no window), and only a window (no segments). */
Test(packed_attention, segments_only_and_window_only)
{
	uint64_t seed = th_seed();
	struct th_rng g;
	th_rng_init(&g, seed);
	uint32_t d = 128, nq = 4;
	struct ctx c;
	ctx_init(&c, &g, d, nq, MKV_DTYPE_BF16, 3, 0, false);
	struct mkv_encode_opts eo;
	lossless_opts(&eo, d, 1u << th_below(&g, 4));
	cr_assert_eq(ctx_encode(&c, &eo), 0, "seed=%llu", (unsigned long long)seed);
	double *ref = th_alloc((size_t)nq * d * sizeof *ref);
	float *out = th_alloc((size_t)nq * d * sizeof *out);
	th_attention(nq, d, 1.0 / sqrt(d), c.qref, c.kref, c.vref, c.ntot, ref);
	struct mkv_attn_opts ao;
	attn_opts(&ao, d, nq, 1.0);
	int rc = mkv_attend_packed(&ao, c.q, (const struct mkv_segment *const *)c.ks,
				   (const struct mkv_segment *const *)c.vs, c.nseg,
				   NULL, out, NULL);
	cr_assert_eq(rc, 0, "seed=%llu: rc=%d", (unsigned long long)seed, rc);
	double err = th_rel_err_fd(out, ref, (size_t)nq * d);
	cr_assert(err < 1e-5, "seed=%llu: no window: rel err %.3g", (unsigned long long)seed, err);
	ctx_free(&c);

	ctx_init(&c, &g, d, nq, MKV_DTYPE_F16, 0, 77, false);
	th_attention(nq, d, 1.0 / sqrt(d), c.qref, c.kref, c.vref, c.ntot, ref);
	struct mkv_dense_kv win = ctx_window(&c);
	rc = mkv_attend_packed(&ao, c.q, NULL, NULL, 0, &win, out, NULL);
	cr_assert_eq(rc, 0, "seed=%llu: window only rc=%d", (unsigned long long)seed, rc);
	err = th_rel_err_fd(out, ref, (size_t)nq * d);
	cr_assert(err < 1e-5, "seed=%llu: window only: rel err %.3g", (unsigned long long)seed, err);
	ctx_free(&c);
	free(ref);
	free(out);
}

/* The largest group of query heads a KV head may have. */
Test(packed_attention, max_query_heads)
{
	uint64_t seed = th_seed();
	struct th_rng g;
	th_rng_init(&g, seed);
	uint32_t d = 64, nq = MKV_MAX_QHEADS;
	struct ctx c;
	ctx_init(&c, &g, d, nq, MKV_DTYPE_BF16, 3, 20, false);
	struct mkv_encode_opts eo;
	lossless_opts(&eo, d, 1u << th_below(&g, 4));
	cr_assert_eq(ctx_encode(&c, &eo), 0);
	double *ref = th_alloc((size_t)nq * d * sizeof *ref);
	float *out = th_alloc((size_t)nq * d * sizeof *out);
	th_attention(nq, d, 1.0 / sqrt(d), c.qref, c.kref, c.vref, c.ntot, ref);
	struct mkv_attn_opts ao;
	attn_opts(&ao, d, nq, 1.0);
	struct mkv_dense_kv win = ctx_window(&c);
	int rc = mkv_attend_packed(&ao, c.q, (const struct mkv_segment *const *)c.ks,
				   (const struct mkv_segment *const *)c.vs, c.nseg,
				   &win, out, NULL);
	cr_assert_eq(rc, 0, "seed=%llu: rc=%d", (unsigned long long)seed, rc);
	double err = th_rel_err_fd(out, ref, (size_t)nq * d);
	cr_assert(err < 1e-5, "seed=%llu: 64 heads: rel err %.3g", (unsigned long long)seed, err);
	ctx_free(&c);
	free(ref);
	free(out);
}

/* A custom softmax scale is honoured by all three paths. */
Test(packed_attention, custom_scale)
{
	uint64_t seed = th_seed();
	struct th_rng g;
	th_rng_init(&g, seed);
	uint32_t d = 64, nq = 2;
	struct ctx c;
	ctx_init(&c, &g, d, nq, MKV_DTYPE_F32, 2, 10, false);
	struct mkv_encode_opts eo;
	lossless_opts(&eo, d, 1u << th_below(&g, 4));
	cr_assert_eq(ctx_encode(&c, &eo), 0);
	double *ref = th_alloc((size_t)nq * d * sizeof *ref);
	float *out = th_alloc((size_t)nq * d * sizeof *out);
	struct mkv_attn_opts ao;
	attn_opts(&ao, d, nq, 1.0);
	ao.scale = 0.37f;
	th_attention(nq, d, (double)ao.scale, c.qref, c.kref, c.vref, c.ntot, ref);
	struct mkv_dense_kv win = ctx_window(&c);
	int rc = mkv_attend_packed(&ao, c.q, (const struct mkv_segment *const *)c.ks,
				   (const struct mkv_segment *const *)c.vs, c.nseg,
				   &win, out, NULL);
	cr_assert_eq(rc, 0);
	double err = th_rel_err_fd(out, ref, (size_t)nq * d);
	cr_assert(err < 1e-5, "seed=%llu: packed, scale 0.37: rel err %.3g",
		  (unsigned long long)seed, err);
	struct mkv_dense_kv all = {.k = c.kbuf, .v = c.vbuf, .dtype = c.dt, .n = c.ntot};
	cr_assert_eq(mkv_attend_dense(&ao, c.q, &all, out), 0);
	err = th_rel_err_fd(out, ref, (size_t)nq * d);
	cr_assert(err < 1e-5, "seed=%llu: dense, scale 0.37: rel err %.3g",
		  (unsigned long long)seed, err);
	ctx_free(&c);
	free(ref);
	free(out);
}

/*
 * Lossy settings.  bf16 storage with r = d: only the values' rounding,
 * error < 1e-3 (the encoder inverts the rounded rotation: projecting with
 * it instead left ~1.7e-3).
 * Default compression (bf16, r = d/4, 25% channels dropped) on correlated
 * data: finite, error < 1 (a sanity bound), both with every block and with
 * the default 10% of tokens.
 */
static void check_lossy(uint32_t d, bool full_r)
{
	uint64_t seed = th_seed();
	struct th_rng g;
	th_rng_init(&g, seed);
	uint32_t nq = 4;
	struct ctx c;
	ctx_init(&c, &g, d, nq, MKV_DTYPE_BF16, 3, 16, !full_r);
	struct mkv_encode_opts eo;
	cr_assert_eq(mkv_encode_opts_init(&eo, sizeof eo), 0);
	eo.d = d;
	if (full_r) {
		eo.r = d;
		eo.drop = 0;
	} else {
		eo.drop = 1;
	}
	cr_assert_eq(eo.store_dtype, MKV_DTYPE_BF16, "default store dtype is bf16");
	int rc = ctx_encode(&c, &eo);
	cr_assert_eq(rc, 0, "seed=%llu: encode rc=%d", (unsigned long long)seed, rc);
	double *ref = th_alloc((size_t)nq * d * sizeof *ref);
	float *out = th_alloc((size_t)nq * d * sizeof *out);
	th_attention(nq, d, 1.0 / sqrt(d), c.qref, c.kref, c.vref, c.ntot, ref);
	struct mkv_dense_kv win = ctx_window(&c);
	struct mkv_attn_opts ao;
	attn_opts(&ao, d, nq, 1.0);
	rc = mkv_attend_packed(&ao, c.q, (const struct mkv_segment *const *)c.ks,
			       (const struct mkv_segment *const *)c.vs, c.nseg,
			       &win, out, NULL);
	cr_assert_eq(rc, 0, "seed=%llu: rc=%d", (unsigned long long)seed, rc);
	for (size_t i = 0; i < (size_t)nq * d; i++)
		cr_assert(isfinite(out[i]), "seed=%llu: out[%zu] not finite",
			  (unsigned long long)seed, i);
	double err = th_rel_err_fd(out, ref, (size_t)nq * d);
	double bound = full_r ? 1e-3 : 1.0;
	cr_assert(err < bound, "seed=%llu d=%u %s: rel err %.3g >= %g",
		  (unsigned long long)seed, d, full_r ? "bf16 r=d" : "default", err,
		  bound);
	cr_log_info("d=%u %s: rel err %.3g (all blocks)\n", d,
		    full_r ? "bf16 r=d" : "default compression", err);
	if (!full_r) {
		/* default token fraction as well */
		cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
		ao.d = d;
		ao.n_q = nq;
		rc = mkv_attend_packed(&ao, c.q, (const struct mkv_segment *const *)c.ks,
				       (const struct mkv_segment *const *)c.vs,
				       c.nseg, &win, out, NULL);
		cr_assert_eq(rc, 0);
		for (size_t i = 0; i < (size_t)nq * d; i++)
			cr_assert(isfinite(out[i]), "seed=%llu: out[%zu] not finite (10%%)",
				  (unsigned long long)seed, i);
		/* No error bound here: with 10% of the tokens the output is a
		 * different average; only finiteness is a property. */
	}
	ctx_free(&c);
	free(ref);
	free(out);
}

Test(packed_attention, bf16_full_r_error_small)
{
	check_lossy(64, true);
	check_lossy(128, true);
	check_lossy(256, true);
}

Test(packed_attention, default_compression_bounded)
{
	check_lossy(64, false);
	check_lossy(128, false);
	check_lossy(256, false);
}

/*
 * Two-stage selection (mkv_attn_opts.refine): the first stage is the
 * bound's selection at refine x token_frac (mkv_select_blocks gives it);
 * the reference then scores those candidates' keys, reconstructed in
 * double from the views, ranks them by softmax mass over the candidates
 * summed over the heads, keeps the sink and the top ones until the
 * budget, and attends them plus the window.  Over the trials the refined
 * set must differ from the one-stage set at least once, or the test would
 * not exercise the second stage.
 */
static int refine_trial(struct th_rng *g, uint64_t seed, uint32_t d, double refine)
{
	uint32_t nq = 4;
	struct ctx c;
	ctx_init(&c, g, d, nq, MKV_DTYPE_BF16, 3, 16, true);
	struct mkv_encode_opts eo;
	cr_assert_eq(mkv_encode_opts_init(&eo, sizeof eo), 0);
	eo.d = d;
	eo.value_bits = 6;
	eo.r = d * 5 / 8;
	cr_assert_eq(ctx_encode(&c, &eo), 0);
	struct mkv_attn_opts ao;
	attn_opts(&ao, d, nq, 0.1);
	ao.refine = refine;
	size_t nb = ctx_blocks(&c), n_hist = c.ntot - c.nwin;
	struct mkv_block_ref *cand = th_alloc(nb * sizeof *cand);
	struct mkv_block_ref *one = th_alloc(nb * sizeof *one);
	int64_t nc = mkv_select_blocks(&ao, c.q, (const struct mkv_segment *const *)c.ks,
				       c.nseg, cand, nb);
	cr_assert_gt(nc, 0);
	struct mkv_attn_opts a1 = ao;
	a1.refine = 0.0;
	int64_t n1 = mkv_select_blocks(&a1, c.q, (const struct mkv_segment *const *)c.ks,
				       c.nseg, one, nb);
	cr_assert_gt(n1, 0);
	cr_assert_geq(nc, n1, "the first stage names at least the budget");
	/* Reconstructed K and V of every segment, and each one's first token. */
	double *kr[8], *vr[8];
	for (uint32_t s = 0; s < c.nseg; s++) {
		struct mkv_packed_view kv, vv;
		cr_assert_eq(mkv_segment_view(c.ks[s], &kv), 0);
		cr_assert_eq(mkv_segment_view(c.vs[s], &vv), 0);
		kr[s] = th_alloc(c.lens[s] * d * sizeof(double));
		vr[s] = th_alloc(c.lens[s] * d * sizeof(double));
		th_view_reconstruct(&kv, kr[s]);
		th_view_reconstruct(&vv, vr[s]);
	}
	/* Scores of the candidates' tokens, per head. */
	double scale = 1.0 / sqrt(d);
	size_t ntok = 0;
	for (int64_t i = 0; i < nc; i++) {
		uint32_t s = cand[i].seg, b = c.bs[s], i0 = cand[i].block * b;
		ntok += c.lens[s] - i0 < b ? c.lens[s] - i0 : b;
	}
	double *sc = th_alloc(ntok * nq * sizeof *sc), mx[4], z[4] = {0};
	for (uint32_t h = 0; h < nq; h++)
		mx[h] = -INFINITY;
	size_t t = 0;
	for (int64_t i = 0; i < nc; i++) {
		uint32_t s = cand[i].seg, b = c.bs[s], i0 = cand[i].block * b;
		uint32_t rows = c.lens[s] - i0 < b ? (uint32_t)(c.lens[s] - i0) : b;
		for (uint32_t r = 0; r < rows; r++, t++)
			for (uint32_t h = 0; h < nq; h++) {
				double x = 0;
				for (uint32_t e = 0; e < d; e++)
					x += c.qref[h * d + e] * kr[s][(size_t)(i0 + r) * d + e];
				sc[t * nq + h] = scale * x;
				mx[h] = fmax(mx[h], scale * x);
			}
	}
	for (size_t u = 0; u < ntok; u++)
		for (uint32_t h = 0; h < nq; h++)
			z[h] += exp(sc[u * nq + h] - mx[h]);
	double *mass = th_alloc((size_t)nc * sizeof *mass);
	t = 0;
	for (int64_t i = 0; i < nc; i++) {
		uint32_t s = cand[i].seg, b = c.bs[s], i0 = cand[i].block * b;
		uint32_t rows = c.lens[s] - i0 < b ? (uint32_t)(c.lens[s] - i0) : b;
		for (uint32_t r = 0; r < rows; r++, t++)
			for (uint32_t h = 0; h < nq; h++)
				mass[i] += exp(sc[t * nq + h] - mx[h]) / z[h];
	}
	/* The sink, then by mass (ties: the earlier block) to the budget. */
	size_t budget = (size_t)ceil(0.1 * (double)n_hist), taken = 0;
	uint8_t *keep = th_alloc((size_t)nc);
	cr_assert(cand[0].seg == 0 && cand[0].block == 0, "the sink is a candidate");
	keep[0] = 1;
	taken = c.lens[0] < c.bs[0] ? c.lens[0] : c.bs[0];
	while (taken < budget) {
		int64_t best = -1;
		for (int64_t i = 1; i < nc; i++)
			if (!keep[i] && (best < 0 || mass[i] > mass[best]))
				best = i;
		if (best < 0)
			break;
		keep[best] = 1;
		uint32_t s = cand[best].seg, b = c.bs[s], i0 = cand[best].block * b;
		taken += c.lens[s] - i0 < b ? c.lens[s] - i0 : b;
	}
	/* The reference: the kept blocks' tokens and the window. */
	double *K = th_alloc(c.ntot * d * sizeof(double)), *V = th_alloc(c.ntot * d * sizeof(double));
	size_t n = 0, kept = 0;
	int differs = 0;
	for (int64_t i = 0; i < nc; i++) {
		bool in_one = false;
		for (int64_t j = 0; j < n1; j++)
			in_one |= one[j].seg == cand[i].seg && one[j].block == cand[i].block;
		differs |= (keep[i] != 0) != in_one;
		if (!keep[i])
			continue;
		kept++;
		uint32_t s = cand[i].seg, b = c.bs[s], i0 = cand[i].block * b;
		uint32_t rows = c.lens[s] - i0 < b ? (uint32_t)(c.lens[s] - i0) : b;
		memcpy(K + n * d, kr[s] + (size_t)i0 * d, rows * d * sizeof(double));
		memcpy(V + n * d, vr[s] + (size_t)i0 * d, rows * d * sizeof(double));
		n += rows;
	}
	memcpy(K + n * d, c.kref + (c.ntot - c.nwin) * d, c.nwin * d * sizeof(double));
	memcpy(V + n * d, c.vref + (c.ntot - c.nwin) * d, c.nwin * d * sizeof(double));
	n += c.nwin;
	double *ref = th_alloc((size_t)nq * d * sizeof *ref);
	th_attention(nq, d, scale, c.qref, K, V, n, ref);
	float *out = th_alloc((size_t)nq * d * sizeof *out);
	struct mkv_dense_kv win = ctx_window(&c);
	struct mkv_attn_stats st;
	cr_assert_eq(mkv_attend_packed(&ao, c.q, (const struct mkv_segment *const *)c.ks,
				       (const struct mkv_segment *const *)c.vs, c.nseg, &win,
				       out, &st), 0);
	cr_assert_eq(st.blocks_selected, kept, "seed=%llu: %zu blocks attended, want %zu",
		     (unsigned long long)seed, st.blocks_selected, kept);
	double err = th_rel_err_fd(out, ref, (size_t)nq * d);
	cr_assert(err < 1e-3, "seed=%llu d=%u refine %g: rel err %.3g",
		  (unsigned long long)seed, d, refine, err);
	for (uint32_t s = 0; s < c.nseg; s++) {
		free(kr[s]);
		free(vr[s]);
	}
	free(cand);
	free(one);
	free(sc);
	free(mass);
	free(keep);
	free(K);
	free(V);
	free(ref);
	free(out);
	ctx_free(&c);
	return differs;
}

Test(packed_attention, refine_two_stages_match_reference)
{
	uint64_t seed = th_seed();
	struct th_rng g;
	th_rng_init(&g, seed);
	int differs = 0;
	for (int trial = 0; trial < 12; trial++)
		differs += refine_trial(&g, seed, trial % 2 ? 128 : 64, trial % 3 ? 2.0 : 3.0);
	cr_assert_gt(differs, 0, "seed=%llu: the second stage never changed the set",
		     (unsigned long long)seed);
	cr_log_info("refine: the set differed from one stage's in %d of 12 trials\n", differs);
}

Test(packed_attention, refine_bad_values_refused)
{
	struct mkv_attn_opts ao;
	float q[64] = {1};
	struct mkv_dense_kv win = {.k = q, .v = q, .dtype = MKV_DTYPE_F32, .n = 1};
	float out[64];
	attn_opts(&ao, 64, 1, 0.1);
	const double bad[] = {-1.0, 0.5, 16.5, NAN, INFINITY};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		ao.refine = bad[i];
		cr_assert_eq(mkv_attend_packed(&ao, q, NULL, NULL, 0, &win, out, NULL), -EINVAL,
			     "refine %g", bad[i]);
	}
	/* A version-1 caller (no refine field) is accepted: one stage. */
	struct mkv_attn_opts v1;
	size_t v1_size = offsetof(struct mkv_attn_opts, refine);
	memset(&v1, 0xff, sizeof v1);
	cr_assert_eq(mkv_attn_opts_init(&v1, v1_size), 0);
	v1.d = 64;
	cr_assert_eq(mkv_attend_packed(&v1, q, NULL, NULL, 0, &win, out, NULL), 0);
}
