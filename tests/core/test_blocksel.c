/* SPDX-License-Identifier: MIT */
/*
 * Block scoring and selection.
 *  - mkv_score_blocks() equals the bound computed here from the view's
 *    sum_min/sum_max and rotation, and the summaries bound the exact
 *    rotated keys (so the score bounds every token's partial dot product).
 *  - token_frac = 1 selects every block, and PackedAttention then equals
 *    dense attention over the segments' reconstructions (computed here from
 *    the views), even with lossy compression.
 *  - A planted block (keys large along a query's direction) is selected at
 *    token_frac = 0.05; the sink is always selected; the selection is the
 *    top-scored blocks up to the token budget; attention over it equals
 *    dense attention over exactly the selected tokens.
 *  - Quest: the same rule over dense blocks, against a reference selection
 *    computed here.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "projection.h"

#define MAXSEG 6

struct hist {
	uint32_t d, nq, nseg;
	size_t lens[MAXSEG], off[MAXSEG];
	uint32_t bs[MAXSEG];
	size_t ntot, nwin, nhist;
	float *k, *v, *q;           /* ntot × d, nq × d */
	double *qd, *kwin, *vwin;   /* q, and the window as doubles */
	struct mkv_segment *ks[MAXSEG], *vs[MAXSEG];
	double *khat, *vhat;        /* nhist × d reconstructions from the views */
};

static void hist_encode(struct hist *h, const struct mkv_encode_opts *base,
			uint64_t seed)
{
	h->nhist = 0;
	for (uint32_t s = 0; s < h->nseg; s++) {
		h->off[s] = h->nhist;
		h->nhist += h->lens[s];
	}
	h->khat = th_alloc(h->nhist * h->d * sizeof(double));
	h->vhat = th_alloc(h->nhist * h->d * sizeof(double));
	for (uint32_t s = 0; s < h->nseg; s++) {
		struct mkv_encode_opts o = *base;
		o.d = h->d;
		o.b = h->bs[s];
		o.kind = MKV_KIND_KEY;
		int rc = mkv_segment_encode(&o, h->k + h->off[s] * h->d, MKV_DTYPE_F32,
					    h->lens[s], &h->ks[s]);
		cr_assert_eq(rc, 0, "seed=%llu: encode K rc=%d (%s)", (unsigned long long)seed,
			     rc, mkv_strerror(rc));
		o.kind = MKV_KIND_VALUE;
		o.summary_channels = 0; /* keys only */
		rc = mkv_segment_encode(&o, h->v + h->off[s] * h->d, MKV_DTYPE_F32,
					h->lens[s], &h->vs[s]);
		cr_assert_eq(rc, 0, "seed=%llu: encode V rc=%d", (unsigned long long)seed, rc);
		struct mkv_packed_view kv, vv;
		cr_assert_eq(mkv_segment_view(h->ks[s], &kv), 0);
		cr_assert_eq(mkv_segment_view(h->vs[s], &vv), 0);
		th_view_reconstruct(&kv, h->khat + h->off[s] * h->d);
		th_view_reconstruct(&vv, h->vhat + h->off[s] * h->d);
	}
	size_t w0 = h->nhist * h->d;
	h->kwin = th_alloc((h->nwin + 1) * h->d * sizeof(double));
	h->vwin = th_alloc((h->nwin + 1) * h->d * sizeof(double));
	for (size_t i = 0; i < h->nwin * h->d; i++) {
		h->kwin[i] = h->k[w0 + i];
		h->vwin[i] = h->v[w0 + i];
	}
}

static void hist_alloc(struct hist *h, uint32_t d, uint32_t nq, uint32_t nseg,
		       size_t nwin, struct th_rng *rng, size_t len_min, size_t len_var)
{
	memset(h, 0, sizeof *h);
	h->d = d;
	h->nq = nq;
	h->nseg = nseg;
	h->nwin = nwin;
	h->ntot = nwin;
	for (uint32_t s = 0; s < nseg; s++) {
		h->lens[s] = len_min + th_below(rng, (uint32_t)len_var);
		h->bs[s] = 8u << th_below(rng, 4);
		h->ntot += h->lens[s];
	}
	h->k = th_alloc(h->ntot * d * sizeof(float));
	h->v = th_alloc(h->ntot * d * sizeof(float));
	h->q = th_alloc((size_t)nq * d * sizeof(float));
	h->qd = th_alloc((size_t)nq * d * sizeof(double));
	th_gaussian(rng, h->k, h->ntot * d, 1.0);
	th_gaussian(rng, h->v, h->ntot * d, 1.0);
	th_gaussian(rng, h->q, (size_t)nq * d, 1.0);
}

static void hist_free(struct hist *h)
{
	for (uint32_t s = 0; s < h->nseg; s++) {
		mkv_segment_destroy(h->ks[s]);
		mkv_segment_destroy(h->vs[s]);
	}
	free(h->k);
	free(h->v);
	free(h->q);
	free(h->qd);
	free(h->kwin);
	free(h->vwin);
	free(h->khat);
	free(h->vhat);
}

static void sync_q(struct hist *h)
{
	for (size_t i = 0; i < (size_t)h->nq * h->d; i++)
		h->qd[i] = h->q[i];
}

static size_t blk_tokens(const struct hist *h, uint32_t s, uint32_t j)
{
	size_t start = (size_t)j * h->bs[s];
	size_t end = start + h->bs[s];
	return (end > h->lens[s] ? h->lens[s] : end) - start;
}

static uint32_t seg_blocks(const struct hist *h, uint32_t s)
{
	return (uint32_t)((h->lens[s] + h->bs[s] - 1) / h->bs[s]);
}

/*
 * Reference attention over the selected history blocks (reconstructed
 * from the views) plus the window.
 */
static void ref_attention_sel(const struct hist *h, const struct mkv_block_ref *sel,
			      size_t nsel, double *out)
{
	size_t cap = h->nhist + h->nwin;
	double *K = th_alloc(cap * h->d * sizeof *K), *V = th_alloc(cap * h->d * sizeof *V);
	size_t m = 0;
	for (size_t t = 0; t < nsel; t++) {
		uint32_t s = sel[t].seg, j = sel[t].block;
		size_t start = h->off[s] + (size_t)j * h->bs[s];
		size_t cnt = blk_tokens(h, s, j);
		memcpy(K + m * h->d, h->khat + start * h->d, cnt * h->d * sizeof *K);
		memcpy(V + m * h->d, h->vhat + start * h->d, cnt * h->d * sizeof *V);
		m += cnt;
	}
	memcpy(K + m * h->d, h->kwin, h->nwin * h->d * sizeof *K);
	memcpy(V + m * h->d, h->vwin, h->nwin * h->d * sizeof *V);
	m += h->nwin;
	th_attention(h->nq, h->d, 1.0 / sqrt((double)h->d), h->qd, K, V, m, out);
	free(K);
	free(V);
}

static struct mkv_dense_kv hist_window(const struct hist *h)
{
	struct mkv_dense_kv w = {
		.k = h->k + h->nhist * h->d,
		.v = h->v + h->nhist * h->d,
		.dtype = MKV_DTYPE_F32,
		.n = h->nwin,
	};
	return w;
}

static void attn_opts(struct mkv_attn_opts *a, uint32_t d, uint32_t nq, double frac)
{
	cr_assert_eq(mkv_attn_opts_init(a, sizeof *a), 0);
	a->d = d;
	a->n_q = nq;
	a->token_frac = frac;
}

/* ---- scoring ------------------------------------------------------------- */

Test(blocksel, score_blocks_matches_bound)
{
	for (int it = 0; it < 8; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		uint32_t d = 64u << th_below(&rng, 3);
		uint32_t nq = 1 + th_below(&rng, 12); /* W = 4, 8 and the unvectorized bound past S x 16 > 2048 */
		struct hist h;
		hist_alloc(&h, d, nq, 1, 0, &rng, 30, 300);
		sync_q(&h);
		struct mkv_encode_opts o;
		cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
		o.drop = th_below(&rng, 2);
		o.store_dtype = it & 1 ? MKV_DTYPE_F32 : MKV_DTYPE_BF16;
		uint32_t dk = o.drop ? d - d / 4 : d;
		o.g = 1u << th_below(&rng, 4);
		o.r = o.g * (1 + th_below(&rng, dk / o.g));
		o.summary_channels = th_below(&rng, 2) ? 0 : 1 + th_below(&rng, dk);
		hist_encode(&h, &o, seed);

		struct mkv_packed_view v;
		cr_assert_eq(mkv_segment_view(h.ks[0], &v), 0);
		uint32_t S = v.summary_channels, nb = v.n_blocks;
		double *R = th_alloc((size_t)dk * d * sizeof *R);
		th_view_rotation(&v, R);
		/* R from the view equals mkv_segment_rotation */
		float *Rf = th_alloc((size_t)dk * d * sizeof *Rf);
		cr_assert_eq(mkv_segment_rotation(h.ks[0], Rf), 0);
		for (size_t i = 0; i < (size_t)dk * d; i++)
			cr_assert_eq((double)Rf[i], R[i]);
		free(Rf);
		double *qr = th_alloc((size_t)nq * dk * sizeof *qr);
		for (uint32_t hh = 0; hh < nq; hh++)
			for (uint32_t a = 0; a < dk; a++) {
				double acc = 0;
				for (uint32_t c = 0; c < d; c++)
					acc += R[(size_t)a * d + c] * h.qd[(size_t)hh * d + c];
				qr[(size_t)hh * dk + a] = acc;
			}
		/* exact rotated keys, to check the summaries bound them: the
		 * encoder's coefficients, X Pᵀ with P = (R Rᵀ)⁻¹ R */
		double *P = th_alloc((size_t)dk * d * sizeof *P);
		th_projection(R, dk, d, P);
		size_t n = h.lens[0];
		double *kr = th_alloc(n * S * sizeof *kr);
		for (size_t i = 0; i < n; i++)
			for (uint32_t a = 0; a < S; a++) {
				double acc = 0;
				for (uint32_t c = 0; c < d; c++)
					acc += P[(size_t)a * d + c] * h.k[i * d + c];
				kr[i * S + a] = acc;
			}
		free(P);
		/* float rounding of a rotated channel scales with the key norm
		 * (channels past the rank of a short segment are pure rounding) */
		double knorm = 0;
		for (size_t i = 0; i < n; i++) {
			double s2 = 0;
			for (uint32_t c = 0; c < d; c++)
				s2 += (double)h.k[i * d + c] * h.k[i * d + c];
			knorm = fmax(knorm, sqrt(s2));
		}
		float *scores = th_alloc(nb * sizeof *scores);
		struct mkv_attn_opts ao;
		attn_opts(&ao, d, nq, 0.1);
		int rc = mkv_score_blocks(&ao, h.q, h.ks[0], scores);
		cr_assert_eq(rc, 0, "seed=%llu: score_blocks rc=%d", (unsigned long long)seed, rc);
		/* per head: |q| and its norm outside the S bounded channels */
		double qn[16], qp[16];
		for (uint32_t hh = 0; hh < nq; hh++) {
			double n2 = 0, s2 = 0;
			for (uint32_t c = 0; c < d; c++)
				n2 += h.qd[(size_t)hh * d + c] * h.qd[(size_t)hh * d + c];
			for (uint32_t c = 0; c < S; c++)
				s2 += qr[(size_t)hh * dk + c] * qr[(size_t)hh * dk + c];
			qn[hh] = sqrt(n2);
			qp[hh] = sqrt(fmax(0.0, n2 - s2));
		}
		for (uint32_t j = 0; j < nb; j++) {
			/* the remainder bound: the largest norm of a key outside
			 * its S bounded channels, rounded up */
			size_t u0 = (size_t)j * v.b, u1 = u0 + v.b > n ? n : u0 + v.b;
			double rest_ref = 0;
			for (size_t i = u0; i < u1; i++) {
				double n2 = 0, s2 = 0;
				for (uint32_t c = 0; c < d; c++)
					n2 += (double)h.k[i * d + c] * h.k[i * d + c];
				for (uint32_t a = 0; a < S; a++)
					s2 += kr[i * S + a] * kr[i * S + a];
				rest_ref = fmax(rest_ref, sqrt(fmax(0.0, n2 - s2)));
			}
			double rest = th_elem(v.sum_rest, v.store_dtype, j);
			/* float cancellation in |k|² - |k'_S|² costs up to
			 * sqrt(eps)·|k| */
			double rtol = 1e-3 * knorm;
			cr_assert(rest >= rest_ref - rtol &&
				  rest <= rest_ref * (1 + 0x1p-6) + rtol,
				  "seed=%llu d=%u S=%u store=%s: block %u remainder bound %.9g, want %.9g",
				  (unsigned long long)seed, d, S, th_dtype_name(v.store_dtype),
				  j, rest, rest_ref);
			double best = -INFINITY, mag = 0, ptol = 0;
			for (uint32_t hh = 0; hh < nq; hh++) {
				double acc = qp[hh] * rest;
				ptol = fmax(ptol, (1e-3 * qn[hh] + 1e-5 * qp[hh]) * rest);
				for (uint32_t c = 0; c < S; c++) {
					double mn = th_elem(v.sum_min, v.store_dtype, (size_t)j * S + c);
					double mx = th_elem(v.sum_max, v.store_dtype, (size_t)j * S + c);
					double qc = qr[(size_t)hh * dk + c];
					acc += fmax(qc * mn, qc * mx);
					mag += fabs(qc) * fmax(fabs(mn), fabs(mx));
				}
				if (acc > best)
					best = acc;
			}
			cr_assert(fabs(scores[j] - best) <= 1e-5 * mag / nq + ptol + 1e-6,
				  "seed=%llu d=%u nq=%u S=%u store=%s: block %u score %.9g, bound %.9g",
				  (unsigned long long)seed, d, nq, S,
				  th_dtype_name(v.store_dtype), j, scores[j], best);
			/* summaries bound the exact rotated keys, and are tight */
			size_t t0 = (size_t)j * v.b, t1 = t0 + v.b > n ? n : t0 + v.b;
			for (uint32_t c = 0; c < S; c++) {
				double mn = th_elem(v.sum_min, v.store_dtype, (size_t)j * S + c);
				double mx = th_elem(v.sum_max, v.store_dtype, (size_t)j * S + c);
				double lo = INFINITY, hi = -INFINITY;
				for (size_t i = t0; i < t1; i++) {
					double x = kr[i * S + c];
					lo = fmin(lo, x);
					hi = fmax(hi, x);
				}
				double tol = 1e-5 * (fabs(lo) + fabs(hi)) + 1e-6 * knorm;
				cr_assert(mn <= lo + tol && mx >= hi - tol,
					  "seed=%llu store=%s: block %u channel %u: [%.9g, %.9g] does not bound keys [%.9g, %.9g]",
					  (unsigned long long)seed, th_dtype_name(v.store_dtype), j,
					  c, mn, mx, lo, hi);
				/* f32: the exact min/max; bf16: within 2 ulp (2^-6 relative) */
				double slack = v.store_dtype == MKV_DTYPE_F32 ? tol
					       : 0x1p-6 * fmax(fabs(lo), fabs(hi)) + 1e-6 * knorm;
				cr_assert(mn >= lo - slack && mx <= hi + slack,
					  "seed=%llu store=%s: block %u channel %u: [%.9g, %.9g] is loose around [%.9g, %.9g]",
					  (unsigned long long)seed, th_dtype_name(v.store_dtype), j,
					  c, mn, mx, lo, hi);
			}
		}
		free(scores);
		free(kr);
		free(qr);
		free(R);
		hist_free(&h);
	}
}

/* ---- selecting every block ---------------------------------------------- */

Test(blocksel, frac_one_selects_all_and_equals_full_attention)
{
	for (int it = 0; it < 8; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		uint32_t d = 64u << (it % 3);
		uint32_t nq = 1 + th_below(&rng, 4);
		struct hist h;
		hist_alloc(&h, d, nq, 1 + th_below(&rng, MAXSEG), th_below(&rng, 30), &rng,
			   5, 250);
		for (size_t i = 0; i < (size_t)nq * d; i++)
			h.q[i] *= 1.5f;
		sync_q(&h);
		struct mkv_encode_opts o; /* lossy compression, every g */
		cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
		o.d = d;
		o.drop = th_below(&rng, 2);
		o.g = 1u << (it % 4);
		o.r = o.g * (1 + th_below(&rng, (o.drop ? d - d / 4 : d) / o.g));
		o.store_dtype = th_below(&rng, 2) ? MKV_DTYPE_BF16 : MKV_DTYPE_F32;
		/* element rows and quantized rows of every width */
		o.value_bits = it % 3 == 0 ? 0 : 4 + th_below(&rng, 5);
		hist_encode(&h, &o, seed);

		size_t nb = 0;
		for (uint32_t s = 0; s < h.nseg; s++)
			nb += seg_blocks(&h, s);
		struct mkv_attn_opts ao;
		attn_opts(&ao, d, nq, 1.0);
		struct mkv_block_ref *sel = th_alloc((nb + 4) * sizeof *sel);
		int64_t cnt = mkv_select_blocks(&ao, h.q, (const struct mkv_segment *const *)h.ks,
						h.nseg, sel, nb + 4);
		cr_assert_eq(cnt, (int64_t)nb, "seed=%llu: %lld blocks selected of %zu",
			     (unsigned long long)seed, (long long)cnt, nb);
		size_t t = 0;
		for (uint32_t s = 0; s < h.nseg; s++)
			for (uint32_t j = 0; j < seg_blocks(&h, s); j++, t++)
				cr_assert(sel[t].seg == s && sel[t].block == j,
					  "seed=%llu: ref %zu is (%u, %u), want (%u, %u)",
					  (unsigned long long)seed, t, sel[t].seg, sel[t].block, s, j);
		/* a short @sel gets the first @cap refs and the full count */
		struct mkv_block_ref two[2];
		cnt = mkv_select_blocks(&ao, h.q, (const struct mkv_segment *const *)h.ks,
					h.nseg, two, 1);
		cr_assert_eq(cnt, (int64_t)nb);
		cr_assert(two[0].seg == 0 && two[0].block == 0);

		double *ref = th_alloc((size_t)nq * d * sizeof *ref);
		ref_attention_sel(&h, sel, nb, ref);
		float *out = th_alloc((size_t)nq * d * sizeof *out);
		struct mkv_dense_kv win = hist_window(&h);
		struct mkv_attn_stats st;
		int rc = mkv_attend_packed(&ao, h.q, (const struct mkv_segment *const *)h.ks,
					   (const struct mkv_segment *const *)h.vs, h.nseg,
					   &win, out, &st);
		cr_assert_eq(rc, 0, "seed=%llu: attend rc=%d", (unsigned long long)seed, rc);
		double err = th_rel_err_fd(out, ref, (size_t)nq * d);
		cr_assert(err < 1e-5,
			  "seed=%llu d=%u nq=%u nseg=%u: packed attention vs dense attention on the reconstruction: rel err %.3g",
			  (unsigned long long)seed, d, nq, h.nseg, err);
		cr_assert_eq(st.blocks_total, nb);
		cr_assert_eq(st.blocks_selected, nb);
		cr_assert_eq(st.tokens_attended, h.ntot);
		free(out);
		free(ref);
		free(sel);
		hist_free(&h);
	}
}

/* ---- planted block ------------------------------------------------------- */

/*
 * Checks on one selection: sorted by (seg, block), no duplicates, sink
 * included, the non-sink blocks are the top-scored ones, and the token
 * budget is met and minimal.
 */
static void check_selection(uint64_t seed, const struct hist *h,
			    const struct mkv_attn_opts *ao,
			    const struct mkv_block_ref *sel, size_t nsel)
{
	cr_assert(nsel >= 1);
	cr_assert(sel[0].seg == 0 && sel[0].block == 0,
		  "seed=%llu: the sink block (0, 0) is not selected", (unsigned long long)seed);
	for (size_t t = 1; t < nsel; t++)
		cr_assert(sel[t - 1].seg < sel[t].seg ||
			  (sel[t - 1].seg == sel[t].seg && sel[t - 1].block < sel[t].block),
			  "seed=%llu: refs not ordered by (seg, block) at %zu",
			  (unsigned long long)seed, t);
	/* scores of every block, from the library (checked elsewhere) */
	float *sc[MAXSEG];
	uint8_t *in[MAXSEG];
	for (uint32_t s = 0; s < h->nseg; s++) {
		sc[s] = th_alloc(seg_blocks(h, s) * sizeof(float));
		in[s] = th_alloc(seg_blocks(h, s));
		cr_assert_eq(mkv_score_blocks(ao, h->q, h->ks[s], sc[s]), 0);
	}
	size_t tok = 0;
	for (size_t t = 0; t < nsel; t++) {
		cr_assert(sel[t].seg < h->nseg && sel[t].block < seg_blocks(h, sel[t].seg));
		in[sel[t].seg][sel[t].block] = 1;
		tok += blk_tokens(h, sel[t].seg, sel[t].block);
	}
	double min_sel = INFINITY, max_unsel = -INFINITY;
	size_t low_tok = 0;
	for (uint32_t s = 0; s < h->nseg; s++)
		for (uint32_t j = 0; j < seg_blocks(h, s); j++) {
			if (s == 0 && j == 0)
				continue;
			if (in[s][j]) {
				if (sc[s][j] < min_sel) {
					min_sel = sc[s][j];
					low_tok = blk_tokens(h, s, j);
				}
			} else if (sc[s][j] > max_unsel) {
				max_unsel = sc[s][j];
			}
		}
	cr_assert(max_unsel <= min_sel,
		  "seed=%llu: an unselected block scores %.9g above a selected one (%.9g)",
		  (unsigned long long)seed, max_unsel, min_sel);
	size_t target = (size_t)ceil(ao->token_frac * (double)h->nhist);
	cr_assert(tok >= target, "seed=%llu: %zu tokens selected, budget %zu",
		  (unsigned long long)seed, tok, target);
	if (nsel > 1)
		cr_assert(tok - low_tok < target,
			  "seed=%llu: selection not minimal: %zu tokens without its lowest block, budget %zu",
			  (unsigned long long)seed, tok - low_tok, target);
	for (uint32_t s = 0; s < h->nseg; s++) {
		free(sc[s]);
		free(in[s]);
	}
}

Test(blocksel, planted_block_is_selected)
{
	for (int it = 0; it < 6; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		uint32_t d = 64u << (it % 3);
		uint32_t nq = it < 3 ? 1 : 4;
		struct hist h;
		hist_alloc(&h, d, nq, 3, 8, &rng, 400, 200);
		/* a unit direction u; head `aligned` is 3u, the others small */
		double *u = th_alloc(d * sizeof *u);
		th_random_orthonormal(&rng, 1, d, u);
		uint32_t aligned = th_below(&rng, nq);
		for (uint32_t hh = 0; hh < nq; hh++)
			for (uint32_t c = 0; c < d; c++)
				h.q[(size_t)hh * d + c] = hh == aligned ? (float)(3.0 * u[c])
						   : (float)(0.1 * th_normal(&rng));
		sync_q(&h);
		/* the planted block: not the sink, in a random segment */
		uint32_t ps = th_below(&rng, 3), pb;
		h.bs[ps] = 16;
		h.bs[0] = 16; /* the 5% budget then exceeds the sink block */
		uint32_t nbs = (uint32_t)((h.lens[ps] + 15) / 16);
		pb = 1 + th_below(&rng, nbs - 2);
		size_t start = 0;
		for (uint32_t s = 0; s < ps; s++)
			start += h.lens[s];
		start += (size_t)pb * 16;
		for (size_t i = start; i < start + 16; i++)
			for (uint32_t c = 0; c < d; c++)
				h.k[i * d + c] = (float)(2.0 * sqrt((double)d) * u[c] +
							 0.3 * th_normal(&rng));
		struct mkv_encode_opts o; /* default compression: bf16, r = d/4 */
		cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
		o.d = d;
		o.drop = 1;
		o.g = 1u << (it % 4);
		o.r = d / 4;
		hist_encode(&h, &o, seed);

		struct mkv_attn_opts ao;
		attn_opts(&ao, d, nq, 0.05);
		size_t cap = 4096;
		struct mkv_block_ref *sel = th_alloc(cap * sizeof *sel);
		int64_t cnt = mkv_select_blocks(&ao, h.q, (const struct mkv_segment *const *)h.ks,
						h.nseg, sel, cap);
		cr_assert(cnt > 0 && (size_t)cnt <= cap, "seed=%llu: select returned %lld",
			  (unsigned long long)seed, (long long)cnt);
		bool found = false;
		for (int64_t t = 0; t < cnt; t++)
			found |= sel[t].seg == ps && sel[t].block == pb;
		cr_assert(found, "seed=%llu d=%u nq=%u: planted block (%u, %u) not selected among %lld",
			  (unsigned long long)seed, d, nq, ps, pb, (long long)cnt);
		check_selection(seed, &h, &ao, sel, (size_t)cnt);

		/* attention over the selection equals dense attention over
		 * exactly those tokens (reconstructed) plus the window */
		double *ref = th_alloc((size_t)nq * d * sizeof *ref);
		ref_attention_sel(&h, sel, (size_t)cnt, ref);
		float *out = th_alloc((size_t)nq * d * sizeof *out);
		struct mkv_dense_kv win = hist_window(&h);
		struct mkv_attn_stats st;
		int rc = mkv_attend_packed(&ao, h.q, (const struct mkv_segment *const *)h.ks,
					   (const struct mkv_segment *const *)h.vs, h.nseg,
					   &win, out, &st);
		cr_assert_eq(rc, 0);
		double err = th_rel_err_fd(out, ref, (size_t)nq * d);
		cr_assert(err < 1e-5,
			  "seed=%llu d=%u nq=%u: packed attention vs attention over the selected tokens: rel err %.3g",
			  (unsigned long long)seed, d, nq, err);
		cr_assert_eq(st.blocks_selected, (size_t)cnt);
		size_t tok = h.nwin;
		for (int64_t t = 0; t < cnt; t++)
			tok += blk_tokens(&h, sel[t].seg, sel[t].block);
		cr_assert_eq(st.tokens_attended, tok, "seed=%llu: tokens_attended %zu, want %zu",
			     (unsigned long long)seed, st.tokens_attended, tok);
		/* at least the packed K and V of the attended tokens, and the
		 * dense window, were read */
		size_t min_bytes = h.nwin * 2 * d * sizeof(float);
		for (int64_t t = 0; t < cnt; t++) {
			struct mkv_packed_view kv, vv;
			cr_assert_eq(mkv_segment_view(h.ks[sel[t].seg], &kv), 0);
			cr_assert_eq(mkv_segment_view(h.vs[sel[t].seg], &vv), 0);
			min_bytes += blk_tokens(&h, sel[t].seg, sel[t].block) *
				     (kv.r * th_dtype_size(kv.store_dtype) + kv.bitmap_bytes +
				      vv.r * th_dtype_size(vv.store_dtype) + vv.bitmap_bytes);
		}
		cr_assert(st.bytes_read >= min_bytes, "seed=%llu: bytes_read %zu < %zu",
			  (unsigned long long)seed, st.bytes_read, min_bytes);
		free(out);
		free(ref);
		free(sel);
		free(u);
		hist_free(&h);
	}
}

/* The sink is selected even when it scores lowest of all. */
Test(blocksel, sink_always_selected)
{
	for (int it = 0; it < 4; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		uint32_t d = 128, nq = 2;
		struct hist h;
		hist_alloc(&h, d, nq, 2, 0, &rng, 300, 100);
		double *u = th_alloc(d * sizeof *u);
		th_random_orthonormal(&rng, 1, d, u);
		for (uint32_t hh = 0; hh < nq; hh++)
			for (uint32_t c = 0; c < d; c++)
				h.q[(size_t)hh * d + c] = (float)(2.0 * u[c]);
		sync_q(&h);
		for (size_t i = 0; i < h.bs[0] && i < h.lens[0]; i++)
			for (uint32_t c = 0; c < d; c++)
				h.k[i * d + c] = (float)(-10.0 * u[c] + 0.1 * th_normal(&rng));
		struct mkv_encode_opts o;
		cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
		hist_encode(&h, &o, seed);
		struct mkv_attn_opts ao;
		attn_opts(&ao, d, nq, it == 0 ? 1e-6 : 0.02 * it);
		struct mkv_block_ref sel[512];
		int64_t cnt = mkv_select_blocks(&ao, h.q, (const struct mkv_segment *const *)h.ks,
						h.nseg, sel, 512);
		cr_assert(cnt >= 1 && cnt <= 512);
		cr_assert(sel[0].seg == 0 && sel[0].block == 0,
			  "seed=%llu frac=%g: sink not selected (first ref (%u, %u))",
			  (unsigned long long)seed, ao.token_frac, sel[0].seg, sel[0].block);
		check_selection(seed, &h, &ao, sel, (size_t)cnt);
		free(u);
		hist_free(&h);
	}
}

/* ---- Quest --------------------------------------------------------------- */

struct qblk {
	double score;
	uint32_t j;
};

static int qblk_desc(const void *a, const void *b)
{
	double x = ((const struct qblk *)a)->score, y = ((const struct qblk *)b)->score;
	return (x < y) - (x > y);
}

Test(blocksel, quest_matches_reference_selection)
{
	for (int it = 0; it < 6; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		uint32_t d = 64u << (it % 3);
		uint32_t nq = 1 + th_below(&rng, 4);
		uint32_t qb = 8u << th_below(&rng, 4);
		size_t nh = 500 + th_below(&rng, 700), nw = th_below(&rng, 20);
		size_t nt = nh + nw;
		float *k = th_alloc(nt * d * sizeof *k), *v = th_alloc(nt * d * sizeof *v);
		float *q = th_alloc((size_t)nq * d * sizeof *q);
		th_gaussian(&rng, k, nt * d, 1.0);
		th_gaussian(&rng, v, nt * d, 1.0);
		th_gaussian(&rng, q, (size_t)nq * d, 1.0);
		/* plant one block along head 0 */
		size_t nb = (nh + qb - 1) / qb;
		uint32_t pb = 1 + th_below(&rng, (uint32_t)nb - 2);
		double qn = 0;
		for (uint32_t c = 0; c < d; c++)
			qn += (double)q[c] * q[c];
		qn = sqrt(qn);
		for (size_t i = (size_t)pb * qb; i < (size_t)pb * qb + qb && i < nh; i++)
			for (uint32_t c = 0; c < d; c++)
				k[i * d + c] = (float)(4.0 * sqrt((double)d) * q[c] / qn +
						       0.3 * th_normal(&rng));
		/* reference scores: bounds over all d channels of the dense keys */
		struct qblk *bl = th_alloc(nb * sizeof *bl);
		for (uint32_t j = 0; j < nb; j++) {
			size_t t0 = (size_t)j * qb, t1 = t0 + qb > nh ? nh : t0 + qb;
			double best = -INFINITY;
			for (uint32_t hh = 0; hh < nq; hh++) {
				double acc = 0;
				for (uint32_t c = 0; c < d; c++) {
					double mn = INFINITY, mx = -INFINITY;
					for (size_t i = t0; i < t1; i++) {
						mn = fmin(mn, k[i * d + c]);
						mx = fmax(mx, k[i * d + c]);
					}
					double qc = q[(size_t)hh * d + c];
					acc += fmax(qc * mn, qc * mx);
				}
				best = fmax(best, acc);
			}
			bl[j].score = best;
			bl[j].j = j;
		}
		/* a budget of 2.5 to 5.5 blocks: more than the sink alone */
		double frac = (2.5 + 3.0 * th_uniform(&rng)) * qb / (double)nh;
		size_t target = (size_t)ceil(frac * (double)nh);
		uint8_t *in = th_alloc(nb);
		in[0] = 1;
		size_t tok = qb < nh ? qb : nh;
		qsort(bl, nb, sizeof *bl, qblk_desc);
		for (size_t t = 0; t < nb && tok < target; t++) {
			if (bl[t].j == 0)
				continue;
			in[bl[t].j] = 1;
			size_t t0 = (size_t)bl[t].j * qb;
			tok += (t0 + qb > nh ? nh : t0 + qb) - t0;
		}
		cr_assert(in[pb], "seed=%llu: test data: planted block not in the reference selection",
			  (unsigned long long)seed);
		size_t nsel = 0, m = 0;
		double *K = th_alloc(nt * d * sizeof *K), *V = th_alloc(nt * d * sizeof *V);
		for (uint32_t j = 0; j < nb; j++) {
			if (!in[j])
				continue;
			nsel++;
			size_t t0 = (size_t)j * qb, t1 = t0 + qb > nh ? nh : t0 + qb;
			for (size_t i = t0; i < t1; i++, m++)
				for (uint32_t c = 0; c < d; c++) {
					K[m * d + c] = k[i * d + c];
					V[m * d + c] = v[i * d + c];
				}
		}
		for (size_t i = nh; i < nt; i++, m++)
			for (uint32_t c = 0; c < d; c++) {
				K[m * d + c] = k[i * d + c];
				V[m * d + c] = v[i * d + c];
			}
		double *qd = th_alloc((size_t)nq * d * sizeof *qd);
		for (size_t i = 0; i < (size_t)nq * d; i++)
			qd[i] = q[i];
		double *ref = th_alloc((size_t)nq * d * sizeof *ref);
		/* the planted logits are ~4 sqrt(d); scale them down so that the
		 * comparison is not dominated by float rounding of huge scores */
		float scale = 1.0f / (float)d;
		th_attention(nq, d, (double)scale, qd, K, V, m, ref);

		struct mkv_attn_opts ao;
		attn_opts(&ao, d, nq, frac);
		ao.quest_b = qb;
		ao.scale = scale;
		struct mkv_dense_kv hist = {.k = k, .v = v, .dtype = MKV_DTYPE_F32, .n = nh};
		struct mkv_dense_kv win = {.k = k + nh * d, .v = v + nh * d,
					   .dtype = MKV_DTYPE_F32, .n = nw};
		float *out = th_alloc((size_t)nq * d * sizeof *out);
		struct mkv_attn_stats st;
		int rc = mkv_attend_quest(&ao, q, &hist, nw ? &win : NULL, out, &st);
		cr_assert_eq(rc, 0, "seed=%llu: quest rc=%d", (unsigned long long)seed, rc);
		cr_assert_eq(st.blocks_total, nb);
		cr_assert_eq(st.blocks_selected, nsel,
			     "seed=%llu d=%u qb=%u frac=%.4f: quest selected %zu blocks, reference %zu",
			     (unsigned long long)seed, d, qb, frac, st.blocks_selected, nsel);
		cr_assert_eq(st.tokens_attended, m);
		double err = th_rel_err_fd(out, ref, (size_t)nq * d);
		cr_assert(err < 1e-5,
			  "seed=%llu d=%u nq=%u qb=%u: quest vs reference over its selection: rel err %.3g",
			  (unsigned long long)seed, d, nq, qb, err);
		free(out);
		free(ref);
		free(qd);
		free(K);
		free(V);
		free(in);
		free(bl);
		free(q);
		free(k);
		free(v);
	}
}
