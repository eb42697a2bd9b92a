/* SPDX-License-Identifier: MIT */
/*
 * CPU decode attention: dense, Quest and PackedAttention.  These are the
 * references the GPU kernels are tested against, so they favour a plain,
 * checkable structure over speed: one online-softmax state per query head,
 * fed token by token, merged across segments flash-decoding style.
 */
#include <cblas.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

/* Version 1 of struct mkv_attn_opts ended at quest_b: its sizeof, padding
 * included, is where refine begins. */
#define ATTN_OPTS_V1 offsetof(struct mkv_attn_opts, refine)
/* Version 2 ended at refine; summary_bits begins version 3. */
#define ATTN_OPTS_V2 offsetof(struct mkv_attn_opts, summary_bits)

int mkv_attn_opts_init(struct mkv_attn_opts *o, size_t size)
{
	if (!o || (size != ATTN_OPTS_V1 && size != ATTN_OPTS_V2 && size != sizeof(*o)))
		return -EINVAL;
	memset(o, 0, size);
	o->size = size;
	o->n_q = 1;
	o->d = 128;
	o->scale = 0.0f;
	o->token_frac = 0.1;
	o->quest_b = 16;
	if (size == sizeof(*o))
		o->summary_bits = 16;
	return 0;
}

/* o->summary_bits, 16 for a struct of an earlier version. */
static uint32_t attn_sum_bits(const struct mkv_attn_opts *o)
{
	return o->size == sizeof(*o) ? o->summary_bits : 16;
}

double attn_refine(const struct mkv_attn_opts *o)
{
	return o->size >= offsetof(struct mkv_attn_opts, refine) + sizeof(double)
		       ? o->refine : 0.0;
}

static int attn_opts_check(const struct mkv_attn_opts *o, const float *q)
{
	if (!o || !q)
		return -EINVAL;
	bool known = o->size == ATTN_OPTS_V1 || o->size == ATTN_OPTS_V2 || o->size == sizeof(*o);
	double f = known ? attn_refine(o) : -1.0;
	uint32_t sb = attn_sum_bits(o);
	if (!(f == 0.0 || (f >= 1.0 && f <= 16.0)) || (sb != 8 && sb != 16) || o->n_q == 0 ||
	    o->n_q > MKV_MAX_QHEADS || !mkv_d_valid(o->d) ||
	    !mkv_b_valid(o->quest_b) || !(o->token_frac > 0.0 && o->token_frac <= 1.0) ||
	    !isfinite(o->scale) || o->scale < 0.0f)
		return -EINVAL;
	return mkv_all_finite(q, (size_t)o->n_q * o->d) ? 0 : -MKV_ENONFINITE;
}

static float attn_scale(const struct mkv_attn_opts *o)
{
	return o->scale > 0.0f ? o->scale : 1.0f / sqrtf((float)o->d);
}

/* A dense window/history must be well-formed when given. */
static int dense_check(const struct mkv_dense_kv *kv)
{
	if (!kv || kv->n == 0)
		return 0;
	if (!kv->k || !kv->v || !mkv_dtype_valid(kv->dtype))
		return -EINVAL;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Online softmax state of one query head over vectors of length @w. */

struct osm {
	float m; /* running max of scores */
	float l; /* running sum of exp(score - m) */
	float *acc;
};

static void osm_init(struct osm *s, float *acc, uint32_t w)
{
	s->m = -INFINITY;
	s->l = 0.0f;
	s->acc = acc;
	memset(acc, 0, sizeof(float) * w);
}

/* Feed one token with score @sc and value @v (w floats). */
static void osm_push(struct osm *s, float sc, const float *v, uint32_t w)
{
	if (sc > s->m) {
		float f = expf(s->m - sc); /* 0 when m was -inf */
		s->l *= f;
		for (uint32_t c = 0; c < w; c++)
			s->acc[c] *= f;
		s->m = sc;
	}
	float p = expf(sc - s->m);
	s->l += p;
	for (uint32_t c = 0; c < w; c++)
		s->acc[c] += p * v[c];
}

/* Merge partial (m, l, o[d]) into the total (M, L, O[d]). */
static void osm_merge(struct osm *tot, float m, float l, const float *o,
		      uint32_t d)
{
	if (l == 0.0f)
		return;
	float nm = m > tot->m ? m : tot->m;
	float a = expf(tot->m - nm), b = expf(m - nm);
	for (uint32_t c = 0; c < d; c++)
		tot->acc[c] = tot->acc[c] * a + o[c] * b;
	tot->l = tot->l * a + l * b;
	tot->m = nm;
}

/* Eight partial sums, added pairwise at the end: the compiler keeps them
 * in one vector register, where a single running sum is a chain of
 * dependent adds (d of them per score).  A fixed order, so the same
 * inputs give the same score everywhere this is used (the second stage's
 * scores are reused by the attention: they must match its own). */
static float dot(const float *a, const float *b, uint32_t n)
{
	float p[8] = { 0 };
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (uint32_t u = 0; u < 8; u++)
			p[u] += a[i + u] * b[i + u];
	for (; i < n; i++)
		p[i & 7] += a[i] * b[i];
	return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

/* Attend dense tokens [i0, i1) of @kv into one osm per head (original
 * space).  Rows are converted on the fly; returns -MKV_ENONFINITE on a
 * NaN/Inf row. */
static int dense_feed(const struct mkv_attn_opts *o, const float *q,
		      const struct mkv_dense_kv *kv, size_t i0, size_t i1,
		      struct osm *st, float *kbuf, float *vbuf)
{
	uint32_t d = o->d;
	size_t es = mkv_dtype_size(kv->dtype);
	float scale = attn_scale(o);
	for (size_t i = i0; i < i1; i++) {
		if (!mkv_load_f32(kbuf, (const char *)kv->k + i * d * es, kv->dtype, d) ||
		    !mkv_load_f32(vbuf, (const char *)kv->v + i * d * es, kv->dtype, d))
			return -MKV_ENONFINITE;
		for (uint32_t h = 0; h < o->n_q; h++)
			osm_push(&st[h], scale * dot(q + (size_t)h * d, kbuf, d), vbuf, d);
	}
	return 0;
}

static void osm_finish(const struct mkv_attn_opts *o, const struct osm *st,
		       float *out)
{
	for (uint32_t h = 0; h < o->n_q; h++)
		for (uint32_t c = 0; c < o->d; c++)
			out[(size_t)h * o->d + c] = st[h].l > 0 ? st[h].acc[c] / st[h].l : 0.0f;
}

/* Per-call scratch: n_q osm totals of width d plus row buffers. */
struct scratch {
	struct osm tot[MKV_MAX_QHEADS];
	struct osm part[MKV_MAX_QHEADS];
	float *mem;
	float *kbuf, *vbuf, *tmp;
	float *qt; /* a segment's rotated queries, channel-major (packed_dot_row) */
};

static int scratch_init(struct scratch *s, const struct mkv_attn_opts *o)
{
	uint32_t d = o->d, nq = o->n_q;
	s->mem = malloc(sizeof(float) * ((size_t)3 * nq * d + 3 * d));
	if (!s->mem)
		return -ENOMEM;
	for (uint32_t h = 0; h < nq; h++) {
		osm_init(&s->tot[h], s->mem + (size_t)h * d, d);
		osm_init(&s->part[h], s->mem + (size_t)(nq + h) * d, d);
	}
	s->kbuf = s->mem + (size_t)2 * nq * d;
	s->vbuf = s->kbuf + d;
	s->tmp = s->vbuf + d;
	s->qt = s->tmp + d;
	return 0;
}

int mkv_attend_dense(const struct mkv_attn_opts *o, const float *q,
		     const struct mkv_dense_kv *kv, float *out)
{
	int rc = attn_opts_check(o, q);
	if (rc)
		return rc;
	if (!kv || !out || kv->n == 0 || dense_check(kv))
		return -EINVAL;
	struct scratch s;
	if ((rc = scratch_init(&s, o)))
		return rc;
	rc = dense_feed(o, q, kv, 0, kv->n, s.tot, s.kbuf, s.vbuf);
	if (rc == 0)
		osm_finish(o, s.tot, out);
	free(s.mem);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Block selection, shared by Quest and PackedAttention. */

struct cand {
	float score;
	uint32_t seg, block, ntok;
	uint32_t idx; /* position in (seg, block) order */
};

/* Descending score; ties to the earlier block, so selection is a pure
 * function of the scores. */
static int cand_cmp(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	if (x->score != y->score)
		return x->score < y->score ? 1 : -1;
	return (x->idx > y->idx) - (x->idx < y->idx);
}

/*
 * @c holds every history block in (seg, block) order, c[0] the sink.
 * Sets mask[i] for the selected ones: the sink, then blocks by descending
 * score until the selected tokens reach the budget.  @c is reordered.
 * Returns the number selected.
 */
static size_t select_blocks(struct cand *c, size_t nc, size_t n_hist,
			    double frac, uint8_t *mask)
{
	memset(mask, 0, nc);
	if (nc == 0)
		return 0;
	size_t budget = frac >= 1.0 ? n_hist : (size_t)ceil(frac * (double)n_hist);
	mask[0] = 1;
	size_t taken = c[0].ntok, nsel = 1;
	if (taken < budget)
		qsort(c + 1, nc - 1, sizeof(*c), cand_cmp);
	for (size_t i = 1; i < nc && taken < budget; i++) {
		mask[c[i].idx] = 1;
		taken += c[i].ntok;
		nsel++;
	}
	return nsel;
}

/*
 * Score of a block under its min/max bounds, max over the query heads.
 * With @qperp (per head, the query's norm outside the S bounded channels)
 * the block's remainder bound @rest is added: the score then bounds every
 * q·k of the block, where the S channels alone miss keys whose weight
 * lies in the other channels (docs/ACCURACY.md: the needle's block).
 */
static float bound_score(const float *qr, uint32_t nq, uint32_t ldq,
			 const void *mn, const void *mx, enum mkv_dtype dt,
			 size_t off, uint32_t S, const float *qperp, float rest)
{
	float best = -INFINITY;
	for (uint32_t h = 0; h < nq; h++) {
		const float *qh = qr + (size_t)h * ldq;
		float s = 0.0f;
		for (uint32_t c = 0; c < S; c++) {
			float a = qh[c] * mkv_elem(mn, dt, off + c);
			float b = qh[c] * mkv_elem(mx, dt, off + c);
			s += a > b ? a : b;
		}
		if (qperp)
			s += qperp[h] * rest;
		best = s > best ? s : best;
	}
	return best;
}

/*
 * bound_score for every block of a segment, the heads W (4 or 8) at a
 * time: the block's summaries widened once (bound_score widens them once
 * per head), the rotated query transposed once per segment (@qt: S rows of
 * @nqp floats, nqp = nq rounded up to W, heads nq..nqp - 1 zero).  Per head
 * the same products, maximum and channel-ordered sums as bound_score, so
 * the same bits; the fixed-width loop over heads vectorizes
 * (bench/hostscore: bound against scalar).
 */
#define BS_QT 2048 /* floats of the transposed query: S x nqp */

static uint32_t bound_w(uint32_t nq)
{
	return nq <= 4 ? 4 : 8;
}

/* The first @S channels of @nq rotated queries @qr (head-major, S apart)
 * channel-major into @qt: S rows of @nqp floats, heads nq..nqp - 1 zero
 * (bound_score_t's and packed_dot_row's layout). */
static void qr_channel_major(const float *qr, uint32_t nq, uint32_t S, uint32_t nqp, float *qt)
{
	for (uint32_t c = 0; c < S; c++)
		for (uint32_t h = 0; h < nqp; h++)
			qt[(size_t)c * nqp + h] = h < nq ? qr[(size_t)h * S + c] : 0.0f;
}

static inline float bound_score_w(const float *qt, uint32_t nq, uint32_t nqp, const void *mn,
				  const void *mx, enum mkv_dtype dt, size_t off, uint32_t S,
				  const float *qperp, float rest, const int W)
{
	float lo[BS_QT / 4], hi[BS_QT / 4];
	for (uint32_t c = 0; c < S; c++) {
		lo[c] = mkv_elem(mn, dt, off + c);
		hi[c] = mkv_elem(mx, dt, off + c);
	}
	float best = -INFINITY;
	for (uint32_t h0 = 0; h0 < nq; h0 += (uint32_t)W) {
		float sum[8];
		for (int k = 0; k < W; k++)
			sum[k] = 0.0f;
		for (uint32_t c = 0; c < S; c++) {
			const float *q = qt + (size_t)c * nqp + h0;
			for (int k = 0; k < W; k++) {
				float a = q[k] * lo[c], b = q[k] * hi[c];
				sum[k] += a > b ? a : b;
			}
		}
		for (uint32_t k = 0; k < (uint32_t)W && h0 + k < nq; k++) {
			float v = sum[k];
			if (qperp)
				v += qperp[h0 + k] * rest;
			best = v > best ? v : best;
		}
	}
	return best;
}

static float bound_score_t(const float *qt, uint32_t nq, uint32_t nqp, const void *mn,
			   const void *mx, enum mkv_dtype dt, size_t off, uint32_t S,
			   const float *qperp, float rest)
{
	if (bound_w(nq) == 4)
		return bound_score_w(qt, nq, nqp, mn, mx, dt, off, S, qperp, rest, 4);
	return bound_score_w(qt, nq, nqp, mn, mx, dt, off, S, qperp, rest, 8);
}

/* Per query head, the norm of q outside the first S rotated channels
 * @qr (ldq apart): sqrt(max(0, |q|² - |q'_{0..S-1}|²)). */
static void query_perp(const struct mkv_attn_opts *o, const float *q,
		       const float *qr, uint32_t S, float *qperp)
{
	for (uint32_t h = 0; h < o->n_q; h++)
		qperp[h] = mkv_rest_norm(q + (size_t)h * o->d, o->d, qr + (size_t)h * S, S);
}

/* ---------------------------------------------------------------------- */
/* Quest */

int mkv_attend_quest(const struct mkv_attn_opts *o, const float *q,
		     const struct mkv_dense_kv *hist,
		     const struct mkv_dense_kv *win, float *out,
		     struct mkv_attn_stats *st)
{
	int rc = attn_opts_check(o, q);
	if (rc)
		return rc;
	size_t nh = hist ? hist->n : 0, nw = win ? win->n : 0;
	if (!out || dense_check(hist) || dense_check(win) || nh + nw == 0)
		return -EINVAL;
	uint32_t d = o->d, b = o->quest_b;
	size_t nb = (nh + b - 1) / b;
	struct scratch s;
	if ((rc = scratch_init(&s, o)))
		return rc;
	struct cand *c = malloc(sizeof(*c) * (nb ? nb : 1));
	uint8_t *mask = malloc(nb ? nb : 1);
	float *mn = malloc(sizeof(float) * d), *mx = malloc(sizeof(float) * d);
	rc = -ENOMEM;
	if (!c || !mask || !mn || !mx)
		goto out;
	size_t es = nh ? mkv_dtype_size(hist->dtype) : 0;
	/* Quest keeps per-block bounds of the dense keys over all d channels;
	 * a server computes them once at insertion, the reference here. */
	for (size_t j = 0; j < nb; j++) {
		size_t i0 = j * b, i1 = i0 + b < nh ? i0 + b : nh;
		rc = -MKV_ENONFINITE;
		for (size_t i = i0; i < i1; i++) {
			if (!mkv_load_f32(s.kbuf, (const char *)hist->k + i * d * es,
					  hist->dtype, d))
				goto out;
			for (uint32_t ch = 0; ch < d; ch++) {
				float x = s.kbuf[ch];
				if (i == i0 || x < mn[ch])
					mn[ch] = x;
				if (i == i0 || x > mx[ch])
					mx[ch] = x;
			}
		}
		c[j] = (struct cand){
			.score = bound_score(q, o->n_q, d, mn, mx, MKV_DTYPE_F32, 0, d,
					     NULL, 0.0f),
			.seg = 0, .block = (uint32_t)j, .ntok = (uint32_t)(i1 - i0),
			.idx = (uint32_t)j,
		};
	}
	size_t nsel = select_blocks(c, nb, nh, o->token_frac, mask);
	size_t toks = 0;
	for (size_t j = 0; j < nb; j++) {
		if (!mask[j])
			continue;
		size_t i0 = j * b, i1 = i0 + b < nh ? i0 + b : nh;
		rc = dense_feed(o, q, hist, i0, i1, s.tot, s.kbuf, s.vbuf);
		if (rc)
			goto out;
		toks += i1 - i0;
	}
	if (nw && (rc = dense_feed(o, q, win, 0, nw, s.tot, s.kbuf, s.vbuf)))
		goto out;
	osm_finish(o, s.tot, out);
	if (st) {
		size_t wes = nw ? mkv_dtype_size(win->dtype) : 0;
		st->blocks_total = nb;
		st->blocks_selected = nsel;
		st->tokens_attended = toks + nw;
		/* bounds in the history dtype, selected K+V, the window */
		st->bytes_read = nb * 2 * d * es + toks * 2 * d * es + nw * 2 * d * wes;
	}
	rc = 0;
out:
	free(c);
	free(mask);
	free(mn);
	free(mx);
	free(s.mem);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* PackedAttention */

static int packed_check(const struct mkv_attn_opts *o,
			const struct mkv_segment *const *k,
			const struct mkv_segment *const *v, size_t nseg,
			size_t *n_hist, size_t *n_blocks)
{
	*n_hist = *n_blocks = 0;
	if (nseg && (!k || !v))
		return -EINVAL;
	for (size_t i = 0; i < nseg; i++) {
		if (!k[i] || !v[i])
			return -EINVAL;
		const struct mkv_packed_view *kv = &k[i]->v, *vv = &v[i]->v;
		if (kv->kind != MKV_KIND_KEY || vv->kind != MKV_KIND_VALUE)
			return -EINVAL;
		if (kv->n != vv->n || kv->d != o->d || vv->d != o->d)
			return -MKV_ESHAPE;
		*n_hist += kv->n;
		*n_blocks += kv->n_blocks;
	}
	if (*n_blocks > UINT32_MAX)
		return -EINVAL;
	return 0;
}

/* q'_h = R q_h for the first @rows rows of a segment's rotation. */
static void rotate_queries(const struct mkv_attn_opts *o, const float *q,
			   const struct mkv_segment *s, uint32_t rows, float *qr)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)o->n_q,
		    (int)rows, (int)o->d, 1.0f, q, (int)o->d, s->rot_f32,
		    (int)o->d, 0.0f, qr, (int)rows);
}

/* ---------------------------------------------------------------------- */
/* 8-bit scores (mkv_summary8, mkv_query8, mkv_score8).  Each step is one
 * IEEE operation (a division, a floor or ceiling, a round to nearest
 * even) that the GPU repeats exactly, so both sides quantize alike. */

static int8_t clamp127(float x)
{
	return (int8_t)(x < -127.0f ? -127 : x > 127.0f ? 127 : (int)x);
}

/* Block @j of @kv to 8 bits: @row (S minima, S maxima) and its scale.
 * False where a summary is not finite. */
static bool block8(const struct mkv_packed_view *kv, uint32_t j, int8_t *row, float *scale)
{
	uint32_t S = kv->summary_channels;
	size_t off = (size_t)j * S;
	float a = 0.0f;
	for (uint32_t c = 0; c < S; c++) {
		float lo = mkv_elem(kv->sum_min, kv->store_dtype, off + c);
		float hi = mkv_elem(kv->sum_max, kv->store_dtype, off + c);
		if (!isfinite(lo) || !isfinite(hi))
			return false;
		a = fmaxf(a, fmaxf(fabsf(lo), fabsf(hi)));
	}
	float sc = a > 0.0f ? mkv_bf16_to_f32(mkv_f32_to_bf16_up(a / 127.0f)) : 1.0f;
	for (uint32_t c = 0; c < S; c++) {
		row[c] = clamp127(floorf(mkv_elem(kv->sum_min, kv->store_dtype, off + c) / sc));
		row[S + c] = clamp127(ceilf(mkv_elem(kv->sum_max, kv->store_dtype, off + c) / sc));
	}
	*scale = sc;
	return true;
}

int mkv_summary8(const struct mkv_segment *k, int8_t *rows, float *scale)
{
	if (!k || !rows || !scale || k->v.kind != MKV_KIND_KEY || k->v.summary_channels == 0 ||
	    (k->v.n_blocks && (!k->v.sum_min || !k->v.sum_max)))
		return -EINVAL;
	const struct mkv_packed_view *kv = &k->v;
	uint32_t S = kv->summary_channels;
	int8_t row[2 * 256];
	float sc;
	if (S > 256)
		return -EINVAL;
	for (uint32_t j = 0; j < kv->n_blocks; j++)
		if (!block8(kv, j, row, &sc))
			return -MKV_ENONFINITE;
	for (uint32_t j = 0; j < kv->n_blocks; j++)
		block8(kv, j, rows + (size_t)j * 2 * S, &scale[j]);
	return 0;
}

int seg_make_sum8(struct mkv_segment *k)
{
	if (!k || k->v.kind != MKV_KIND_KEY || k->v.summary_channels == 0 ||
	    k->v.summary_channels > 256 || k->proj_f32 ||
	    (k->v.n_blocks && (!k->v.sum_min || !k->v.sum_max)))
		return -EINVAL;
	if (k->sum8)
		return 0;
	const struct mkv_packed_view *kv = &k->v;
	uint32_t S = kv->summary_channels;
	size_t nb = kv->n_blocks ? kv->n_blocks : 1;
	int8_t *rows = malloc(nb * 2 * S);
	float *sc = malloc(nb * sizeof(float));
	if (!rows || !sc) {
		free(rows);
		free(sc);
		return -ENOMEM;
	}
	for (uint32_t j = 0; j < kv->n_blocks; j++)
		if (!block8(kv, j, rows + (size_t)j * 2 * S, &sc[j]))
			sc[j] = NAN;
	k->sum8 = rows;
	k->sum8_scale = sc;
	return 0;
}

int mkv_segment_keep_summary8(struct mkv_segment *k)
{
	return seg_make_sum8(k);
}

int mkv_query8(const float *qr, uint32_t S, int8_t *qi, float *scale)
{
	if (!qr || !qi || !scale || S == 0 || S > 256)
		return -EINVAL;
	if (!mkv_all_finite(qr, S))
		return -MKV_ENONFINITE;
	float m = 0.0f;
	for (uint32_t c = 0; c < S; c++)
		m = fmaxf(m, fabsf(qr[c]));
	float sc = m > 0.0f ? m / 127.0f : 1.0f;
	for (uint32_t c = 0; c < S; c++)
		qi[c] = clamp127(rintf(qr[c] / sc));
	*scale = sc;
	return 0;
}

/* mkv_score8 without the checks. */
static float score8(uint32_t nq, uint32_t S, const int8_t *qi, const float *qscale,
		    const float *qperp, const int8_t *row, float scale, float rest)
{
	float best = -INFINITY;
	for (uint32_t h = 0; h < nq; h++) {
		const int8_t *qh = qi + (size_t)h * S;
		int32_t isum = 0;
		for (uint32_t c = 0; c < S; c++)
			isum += qh[c] > 0 ? qh[c] * row[S + c] : qh[c] * row[c];
		float s = qscale[h] * scale;
		s = s * (float)isum;
		if (qperp)
			s += qperp[h] * rest;
		best = s > best ? s : best;
	}
	return best;
}

int mkv_score8(uint32_t nq, uint32_t S, const int8_t *qi, const float *qscale,
	       const float *qperp, const int8_t *row, float scale, float rest, float *score)
{
	if (!qi || !qscale || !row || !score || nq == 0 || nq > MKV_MAX_QHEADS || S == 0 ||
	    S > 256)
		return -EINVAL;
	*score = score8(nq, S, qi, qscale, qperp, row, scale, rest);
	return 0;
}

/* Score every block of every segment into @c, in (seg, block) order.
 * With o->summary_bits = 8, segment i in 8 bits where @use8 is NULL or
 * use8[i] is set (the others by the bound). */
static void score_all(const struct mkv_attn_opts *o, const float *q,
		      const struct mkv_segment *const *k, size_t nseg,
		      struct cand *c, float *qr, const uint8_t *use8)
{
	size_t ci = 0;
	float qperp[MKV_MAX_QHEADS];
	for (size_t i = 0; i < nseg; i++) {
		const struct mkv_packed_view *kv = &k[i]->v;
		uint32_t S = kv->summary_channels;
		rotate_queries(o, q, k[i], S, qr);
		query_perp(o, q, qr, S, qperp);
		bool b8 = attn_sum_bits(o) == 8 && S <= 256 && (!use8 || use8[i]);
		/* the bound by bound_score_t where the transposed query fits */
		const uint32_t bw = bound_w(o->n_q), nqp = (o->n_q + bw - 1) / bw * bw;
		float qt[BS_QT];
		const bool tq = (size_t)S * nqp <= BS_QT;
		if (tq)
			qr_channel_major(qr, o->n_q, S, nqp, qt);
		int8_t qi[MKV_MAX_QHEADS * 256], row[2 * 256];
		float qsc[MKV_MAX_QHEADS];
		for (uint32_t h = 0; b8 && h < o->n_q; h++)
			if (mkv_query8(qr + (size_t)h * S, S, qi + (size_t)h * S, &qsc[h]))
				b8 = false; /* a non-finite q': the bound, which carries it */
		/* the segment's rows where it keeps them (seg_make_sum8), else
		 * each made here */
		const int8_t *rows8 = k[i]->sum8;
		for (uint32_t j = 0; j < kv->n_blocks; j++, ci++) {
			uint32_t i0 = j * kv->b;
			float rest = mkv_elem(kv->sum_rest, kv->store_dtype, j), sc8 = NAN;
			const int8_t *r8 = row;
			if (b8 && rows8) {
				r8 = rows8 + (size_t)j * 2 * S;
				sc8 = k[i]->sum8_scale[j];
			} else if (b8 && !block8(kv, j, row, &sc8)) {
				sc8 = NAN;
			}
			float sc = b8 && !isnan(sc8)
					   ? score8(o->n_q, S, qi, qsc, qperp, r8, sc8, rest)
				   : tq ? bound_score_t(qt, o->n_q, nqp, kv->sum_min, kv->sum_max,
							kv->store_dtype, (size_t)j * S, S, qperp,
							rest)
					: bound_score(qr, o->n_q, S, kv->sum_min, kv->sum_max,
						      kv->store_dtype, (size_t)j * S, S, qperp, rest);
			c[ci] = (struct cand){
				.score = sc,
				.seg = (uint32_t)i, .block = j,
				.ntok = (kv->n - i0 < kv->b ? kv->n - i0 : kv->b),
				.idx = (uint32_t)ci,
			};
		}
	}
}

int attend_blocks(const struct mkv_attn_opts *o, const float *q,
		  const struct attn_src *src, size_t nsrc,
		  const struct mkv_dense_kv *win, float *out,
		  struct mkv_attn_stats *st)
{
	uint32_t d = o->d, nq = o->n_q;
	size_t nw = win ? win->n : 0;
	struct scratch s;
	int rc = scratch_init(&s, o);
	if (rc)
		return rc;
	float *qr = malloc(sizeof(float) * nq * d);
	float *pacc = malloc(sizeof(float) * nq * d); /* rotated-V accumulators */
	float *po = malloc(sizeof(float) * nq * d);   /* back-rotated partials */
	rc = -ENOMEM;
	if (!qr || !pacc || !po)
		goto out;
	float scale = attn_scale(o);
	size_t toks = 0, bytes = 0, nsel = 0, nb = 0;
	for (size_t i = 0; i < nsrc; i++) {
		const struct attn_src *a = &src[i];
		const struct mkv_packed_view *kv = &a->k->v, *vv = &a->v->v;
		size_t kes = mkv_dtype_size(kv->store_dtype);
		size_t ves = mkv_dtype_size(vv->store_dtype);
		bytes += (2 * (size_t)kv->summary_channels + 1) * kv->n_blocks * kes;
		nb += kv->n_blocks;
		nsel += a->n_sel;
		if (!a->n_sel)
			continue;
		size_t seg_toks = 0;
		for (uint32_t h = 0; h < nq; h++)
			osm_init(&s.part[h], pacc + (size_t)h * vv->d_keep, vv->d_keep);
		rotate_queries(o, q, a->k, kv->d_keep, qr);
		qr_channel_major(qr, nq, kv->d_keep, nq, s.qt);
		for (uint32_t bi = 0; bi < a->n_sel; bi++) {
			uint32_t j = a->blocks[bi];
			uint32_t i0 = j * kv->b;
			uint32_t rows = kv->n - i0 < kv->b ? kv->n - i0 : kv->b;
			for (uint32_t t = 0; t < rows; t++) {
				const float *ks = a->ksc ? a->ksc + (seg_toks + t) * nq : NULL;
				/* the keys' dots straight from the packed row where it
				 * can (the same bits as dot over the unpacked row) */
				float kd[MKV_MAX_QHEADS];
				const bool kp = !ks && packed_dot_row(kv, a->kaddr[bi].values,
								      a->kaddr[bi].bitmaps, t,
								      s.qt, nq, kd);
				if (!ks && !kp)
					packed_unpack_row(kv, a->kaddr[bi].values,
							  a->kaddr[bi].bitmaps, t, s.kbuf);
				packed_unpack_row(vv, a->vaddr[bi].values,
						  a->vaddr[bi].bitmaps, t, s.vbuf);
				for (uint32_t h = 0; h < nq; h++) {
					float sc = ks   ? ks[h]
						   : kp ? scale * kd[h]
							: scale * dot(qr + (size_t)h * kv->d_keep,
								      s.kbuf, kv->d_keep);
					osm_push(&s.part[h], sc, s.vbuf, vv->d_keep);
				}
			}
			seg_toks += rows;
		}
		/* One inverse V rotation per segment: o = o' R_v. */
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq,
			    (int)d, (int)vv->d_keep, 1.0f, pacc, (int)vv->d_keep,
			    a->v->rot_f32, (int)d, 0.0f, po, (int)d);
		for (uint32_t h = 0; h < nq; h++)
			osm_merge(&s.tot[h], s.part[h].m, s.part[h].l,
				  po + (size_t)h * d, d);
		toks += seg_toks;
		bytes += seg_toks * ((size_t)kv->row_bytes + kv->bitmap_bytes +
				     (size_t)vv->row_bytes + vv->bitmap_bytes);
		bytes += ((size_t)kv->d_keep * kes + (size_t)vv->d_keep * ves) * d;
	}
	if (nw) {
		for (uint32_t h = 0; h < nq; h++)
			osm_init(&s.part[h], po + (size_t)h * d, d);
		rc = dense_feed(o, q, win, 0, nw, s.part, s.kbuf, s.vbuf);
		if (rc)
			goto out;
		for (uint32_t h = 0; h < nq; h++)
			osm_merge(&s.tot[h], s.part[h].m, s.part[h].l, s.part[h].acc, d);
		bytes += nw * 2 * d * mkv_dtype_size(win->dtype);
	}
	osm_finish(o, s.tot, out);
	if (st) {
		st->blocks_total = nb;
		st->blocks_selected = nsel;
		st->tokens_attended = toks + nw;
		st->bytes_read = bytes;
	}
	rc = 0;
out:
	free(qr);
	free(pacc);
	free(po);
	free(s.mem);
	return rc;
}

double attn_stage1_frac(const struct mkv_attn_opts *o)
{
	double f = attn_refine(o), x = o->token_frac;

	if (f > 1.0)
		x *= f;
	return x < 1.0 ? x : 1.0;
}

struct rcand {
	float mass;
	uint32_t src, bi, idx, ntok;
};

static int rcand_cmp(const void *a, const void *b)
{
	const struct rcand *x = a, *y = b;
	if (x->mass != y->mass)
		return x->mass < y->mass ? 1 : -1;
	return (x->idx > y->idx) - (x->idx < y->idx);
}

/*
 * Why mass and not the bound: the bound is an upper limit of q.k over a
 * block's 16 keys in a box, loose where a block's keys spread, so at 10%
 * of the tokens it drops blocks a head is reading (a copied UUID's next
 * characters: docs/ACCURACY.md).  The candidates' packed keys give the
 * scores attention itself will use; their softmax mass, summed over the
 * query heads, ranks like the oracle (the blocks of most exact mass).
 */
int attn_refine_sel(const struct mkv_attn_opts *o, const float *q,
		    struct attn_src *src, size_t nsrc, float **ksc_mem)
{
	*ksc_mem = NULL;
	if (attn_refine(o) <= 1.0)
		return 0;
	uint32_t nq = o->n_q;
	size_t n_hist = 0, nc = 0, ntok = 0;
	for (size_t i = 0; i < nsrc; i++) {
		n_hist += src[i].k->v.n;
		nc += src[i].n_sel;
	}
	if (!nc)
		return 0;
	size_t budget = o->token_frac >= 1.0 ? n_hist
					     : (size_t)ceil(o->token_frac * (double)n_hist);
	struct rcand *c = malloc(sizeof(*c) * nc);
	uint32_t dk_max = 0;
	for (size_t i = 0; i < nsrc; i++)
		if (src[i].n_sel && src[i].k->v.d_keep > dk_max)
			dk_max = src[i].k->v.d_keep;
	float *qr = malloc(sizeof(float) * nq * (dk_max ? dk_max : 1));
	float *kb = malloc(sizeof(float) * (dk_max ? dk_max : 1));
	float *qt = malloc(sizeof(float) * nq * (dk_max ? dk_max : 1));
	size_t btok = 0;
	for (size_t i = 0; i < nsrc; i++)
		btok += (size_t)src[i].n_sel * src[i].k->v.b;
	float *sc = malloc(sizeof(float) * nq * (btok ? btok : 1));
	float *mx = malloc(sizeof(float) * nq), *z = malloc(sizeof(float) * nq);
	uint8_t *keep = calloc(nc, 1);
	int rc = -ENOMEM;
	if (!c || !qr || !kb || !qt || !sc || !mx || !z || !keep)
		goto out;
	float scale = attn_scale(o);
	for (uint32_t h = 0; h < nq; h++) {
		mx[h] = -INFINITY;
		z[h] = 0.0f;
	}
	/* Scores of every candidate token, per head (token-major). */
	size_t ci = 0;
	for (size_t i = 0; i < nsrc; i++) {
		const struct mkv_packed_view *kv = &src[i].k->v;
		if (!src[i].n_sel)
			continue;
		rotate_queries(o, q, src[i].k, kv->d_keep, qr);
		qr_channel_major(qr, nq, kv->d_keep, nq, qt);
		for (uint32_t bi = 0; bi < src[i].n_sel; bi++, ci++) {
			uint32_t j = src[i].blocks[bi], i0 = j * kv->b;
			uint32_t rows = kv->n - i0 < kv->b ? kv->n - i0 : kv->b;
			c[ci] = (struct rcand){.src = (uint32_t)i, .bi = bi,
					       .idx = (uint32_t)ci, .ntok = rows};
			for (uint32_t t = 0; t < rows; t++, ntok++) {
				float kd[MKV_MAX_QHEADS];
				const bool kp = packed_dot_row(kv, src[i].kaddr[bi].values,
							       src[i].kaddr[bi].bitmaps, t, qt,
							       nq, kd);
				if (!kp)
					packed_unpack_row(kv, src[i].kaddr[bi].values,
							  src[i].kaddr[bi].bitmaps, t, kb);
				for (uint32_t h = 0; h < nq; h++) {
					float s = scale * (kp ? kd[h]
							      : dot(qr + (size_t)h * kv->d_keep, kb,
								    kv->d_keep));
					sc[ntok * nq + h] = s;
					mx[h] = s > mx[h] ? s : mx[h];
				}
			}
		}
	}
	for (size_t t = 0; t < ntok; t++)
		for (uint32_t h = 0; h < nq; h++)
			z[h] += expf(sc[t * nq + h] - mx[h]);
	/* Each block's mass, summed over the heads. */
	size_t t = 0;
	for (ci = 0; ci < nc; ci++) {
		float m = 0.0f;
		for (uint32_t r = 0; r < c[ci].ntok; r++, t++)
			for (uint32_t h = 0; h < nq; h++)
				m += expf(sc[t * nq + h] - mx[h]) / z[h];
		c[ci].mass = m;
	}
	/* The sink first, as in one stage: the first stage always selects
	 * the history's first block, so it is the first candidate (whichever
	 * source holds it: a leading segment may be empty). */
	keep[0] = 1;
	size_t taken = c[0].ntok;
	qsort(c + 1, nc - 1, sizeof(*c), rcand_cmp);
	for (size_t k = 1; k < nc && taken < budget; k++) {
		keep[c[k].idx] = 1;
		taken += c[k].ntok;
	}
	/* Compact each source in place, order kept, and its kept rows'
	 * scores to the front of sc (never ahead of where they are read:
	 * the write position trails the read position). */
	ci = 0;
	t = 0;
	size_t wt = 0;
	for (size_t i = 0; i < nsrc; i++) {
		uint32_t *bl = (uint32_t *)src[i].blocks;
		struct blk_addr *ka = (struct blk_addr *)src[i].kaddr;
		struct blk_addr *va = (struct blk_addr *)src[i].vaddr;
		uint32_t w = 0;
		size_t first = wt;
		for (uint32_t bi = 0; bi < src[i].n_sel; bi++, ci++) {
			/* c[] is sorted now: row counts come from the block */
			const struct mkv_packed_view *kv = &src[i].k->v;
			uint32_t i0 = bl[bi] * kv->b;
			uint32_t rows = kv->n - i0 < kv->b ? kv->n - i0 : kv->b;
			if (keep[ci]) {
				memmove(sc + wt * nq, sc + t * nq, sizeof(float) * rows * nq);
				wt += rows;
				bl[w] = bl[bi];
				ka[w] = ka[bi];
				va[w] = va[bi];
				w++;
			}
			t += rows;
		}
		src[i].n_sel = w;
		src[i].ksc = w ? sc + first * nq : NULL;
	}
	*ksc_mem = sc;
	sc = NULL;
	rc = 0;
out:
	free(keep);
	free(c);
	free(qr);
	free(kb);
	free(qt);
	free(sc);
	free(mx);
	free(z);
	return rc;
}

int attn_select8(const struct mkv_attn_opts *o, const float *q,
		 const struct mkv_segment *const *k, size_t nseg, uint8_t *mask,
		 const uint8_t *use8)
{
	size_t n_hist = 0, nb = 0;
	for (size_t i = 0; i < nseg; i++) {
		n_hist += k[i]->v.n;
		nb += k[i]->v.n_blocks;
	}
	if (nb > UINT32_MAX)
		return -EINVAL;
	struct cand *c = malloc(sizeof(*c) * (nb ? nb : 1));
	float *qr = malloc(sizeof(float) * o->n_q * o->d);
	if (!c || !qr) {
		free(c);
		free(qr);
		return -ENOMEM;
	}
	score_all(o, q, k, nseg, c, qr, use8);
	select_blocks(c, nb, n_hist, o->token_frac, mask);
	free(c);
	free(qr);
	return 0;
}

int attn_select(const struct mkv_attn_opts *o, const float *q,
		const struct mkv_segment *const *k, size_t nseg, uint8_t *mask)
{
	return attn_select8(o, q, k, nseg, mask, NULL);
}

int attn_check(const struct mkv_attn_opts *o, const float *q)
{
	return attn_opts_check(o, q);
}

int mkv_attend_packed(const struct mkv_attn_opts *o, const float *q,
		      const struct mkv_segment *const *k,
		      const struct mkv_segment *const *v, size_t nseg,
		      const struct mkv_dense_kv *win, float *out,
		      struct mkv_attn_stats *st)
{
	int rc = attn_opts_check(o, q);
	if (rc)
		return rc;
	size_t n_hist, nb, nw = win ? win->n : 0;
	if (!out || dense_check(win))
		return -EINVAL;
	if ((rc = packed_check(o, k, v, nseg, &n_hist, &nb)))
		return rc;
	if (n_hist + nw == 0)
		return -EINVAL;
	uint8_t *mask = malloc(nb ? nb : 1);
	struct attn_src *src = calloc(nseg ? nseg : 1, sizeof(*src));
	uint32_t *blocks = malloc(sizeof(uint32_t) * (nb ? nb : 1));
	struct blk_addr *ka = malloc(sizeof(*ka) * (nb ? nb : 1));
	struct blk_addr *va = malloc(sizeof(*va) * (nb ? nb : 1));
	rc = -ENOMEM;
	if (!mask || !src || !blocks || !ka || !va)
		goto out;
	{
		struct mkv_attn_opts o1 = *o;

		o1.token_frac = attn_stage1_frac(o);
		if ((rc = attn_select(&o1, q, k, nseg, mask)))
			goto out;
	}
	/* In-memory segments: every block's address is in place. */
	size_t ci = 0, w = 0;
	for (size_t i = 0; i < nseg; i++) {
		src[i] = (struct attn_src){.k = k[i], .v = v[i], .blocks = blocks + w,
					   .kaddr = ka + w, .vaddr = va + w};
		for (uint32_t j = 0; j < k[i]->v.n_blocks; j++, ci++) {
			if (!mask[ci])
				continue;
			blocks[w] = j;
			ka[w] = seg_block_addr(k[i], j);
			va[w] = seg_block_addr(v[i], j);
			src[i].n_sel++;
			w++;
		}
	}
	float *ksc = NULL;
	if ((rc = attn_refine_sel(o, q, src, nseg, &ksc)))
		goto out;
	rc = attend_blocks(o, q, src, nseg, win, out, st);
	free(ksc);
out:
	free(mask);
	free(src);
	free(blocks);
	free(ka);
	free(va);
	return rc;
}

int mkv_score_blocks(const struct mkv_attn_opts *o, const float *q,
		     const struct mkv_segment *k, float *scores)
{
	int rc = attn_opts_check(o, q);
	if (rc)
		return rc;
	if (!k || !scores || k->v.kind != MKV_KIND_KEY)
		return -EINVAL;
	if (k->v.d != o->d)
		return -MKV_ESHAPE;
	struct cand *c = malloc(sizeof(*c) * k->v.n_blocks);
	float *qr = malloc(sizeof(float) * o->n_q * o->d);
	if (!c || !qr) {
		free(c);
		free(qr);
		return -ENOMEM;
	}
	score_all(o, q, &k, 1, c, qr, NULL);
	for (uint32_t j = 0; j < k->v.n_blocks; j++)
		scores[j] = c[j].score;
	free(c);
	free(qr);
	return 0;
}

int64_t mkv_select_blocks(const struct mkv_attn_opts *o, const float *q,
			  const struct mkv_segment *const *k, size_t nseg,
			  struct mkv_block_ref *sel, size_t cap)
{
	int rc = attn_opts_check(o, q);
	if (rc)
		return rc;
	if (!k || !nseg || (cap && !sel))
		return -EINVAL;
	size_t n_hist = 0, nb = 0;
	for (size_t i = 0; i < nseg; i++) {
		if (!k[i] || k[i]->v.kind != MKV_KIND_KEY)
			return -EINVAL;
		if (k[i]->v.d != o->d)
			return -MKV_ESHAPE;
		n_hist += k[i]->v.n;
		nb += k[i]->v.n_blocks;
	}
	if (nb > UINT32_MAX)
		return -EINVAL;
	struct cand *c = malloc(sizeof(*c) * nb);
	uint8_t *mask = malloc(nb);
	float *qr = malloc(sizeof(float) * o->n_q * o->d);
	if (!c || !mask || !qr) {
		free(c);
		free(mask);
		free(qr);
		return -ENOMEM;
	}
	score_all(o, q, k, nseg, c, qr, NULL);
	size_t nsel = select_blocks(c, nb, n_hist, attn_stage1_frac(o), mask);
	size_t w = 0, ci = 0;
	for (size_t i = 0; i < nseg; i++)
		for (uint32_t j = 0; j < k[i]->v.n_blocks; j++, ci++)
			if (mask[ci] && w < cap)
				sel[w++] = (struct mkv_block_ref){(uint32_t)i, j};
	free(c);
	free(mask);
	free(qr);
	return (int64_t)nsel;
}
