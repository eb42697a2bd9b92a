/* SPDX-License-Identifier: MIT */
/*
 * Sequences: double compression buffering over the store (see
 * include/mosaickv/sequence.h for the model).
 *
 * Concurrency.  A sequence is driven by one caller thread; the store's
 * workers run finalization jobs.  A job owns a private copy of its raw
 * vectors and touches nothing of the sequence but the `done` list, under
 * `lock` (and, on a device, the mirror's thread-safe upload: the final
 * segment's device copy travels in the `done` entry).  The caller thread
 * applies finished jobs (the swap) at its next entry point, so the history
 * it attends is only ever changed by itself, between steps; the device
 * learns of a swap at the next device attend (seqgpu.c).  Prefill jobs
 * (one per prefill segment, run by the workers and the caller alike)
 * touch only their own job slot until the caller publishes them in order.
 * Lock order: seq->lock, then the store's locks (taken inside store
 * calls); a job never holds seq->lock while calling the store.
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "seq_internal.h"
#include "store_internal.h"

/* Version 1 of the options ended at device_attend. */
#define SEQ_OPTS_V1 (offsetof(struct mkv_seq_opts, device_attend) + sizeof(uint32_t))

static void seq_opts_defaults(struct mkv_seq_opts *o, size_t size)
{
	memset(o, 0, sizeof(*o));
	o->size = size;
	o->layers = 32;
	o->kv_heads = 8;
	o->q_per_kv = 4;
	o->d = 128;
	o->prefill_segment = 4096;
	o->min_segment = 256;
	o->max_segment = MKV_MAX_N;
	o->window = 64;
	o->token_frac = 0.1;
	o->r = 0;
	o->g = 1;
	o->b = 16;
	o->drop = 0;
	o->loss_threshold = 0.3;
	o->var_threshold = 0.5;
	o->store_dtype = MKV_DTYPE_BF16;
	o->lag_cap = (size_t)256 << 20;
	o->staging_bytes = (size_t)64 << 20;
	o->device_attend = 1;
	o->value_bits = size > SEQ_OPTS_V1 ? 6 : 0;
	o->adaptive = size > SEQ_OPTS_V1 ? 0 : 1;
	o->summary_channels = 0;
	o->refine = 0.0;
	o->attend_threads = 1;
	o->device_positions = 0;
	o->summary_bits = 16;
}

/* Internal: summary_channels of a version-1 caller, "S = r". */
#define SEQ_S_IS_R UINT32_MAX

int mkv_seq_opts_init(struct mkv_seq_opts *o, size_t size)
{
	if (!o || !mkv_opts_size_ok(size, SEQ_OPTS_V1, sizeof(*o)))
		return -EINVAL;
	struct mkv_seq_opts full;
	seq_opts_defaults(&full, size);
	memcpy(o, &full, size);
	return 0;
}

/* The caller's options as this version's struct (fields its version did
 * not have: that version's behaviour), with r resolved.  False on a size
 * no version had. */
static bool seq_opts_full(const struct mkv_seq_opts *o, struct mkv_seq_opts *f)
{
	if (!mkv_opts_size_ok(o->size, SEQ_OPTS_V1, sizeof(*o)))
		return false;
	seq_opts_defaults(f, o->size);
	memcpy(f, o, o->size);
	if (o->size == SEQ_OPTS_V1 && o->r)
		f->adaptive = 0; /* version 1: r != 0 meant fixed */
	if (o->size == SEQ_OPTS_V1)
		f->summary_channels = SEQ_S_IS_R;
	f->size = sizeof(*f);
	return true;
}

uint32_t mkv_seq_default_r(uint32_t d, uint32_t value_bits, uint32_t g)
{
	if (!mkv_d_valid(d) || !mkv_g_valid(g) ||
	    (value_bits && (value_bits < 4 || value_bits > 8)))
		return 0;
	uint32_t r = value_bits ? (d / 2 - 2) * 8 / value_bits : d / 4;
	r = r > d ? d : r;
	/* the largest multiple of g whose row still fits d/2 bytes */
	r -= r % g;
	while (r > g && mkv_row_bytes(r, value_bits, MKV_DTYPE_BF16) > d / 2)
		r -= g;
	return r;
}

static bool seq_opts_valid(const struct mkv_seq_opts *o)
{
	if (o->size != sizeof(*o) || o->layers == 0 || o->layers > 1024 ||
	    o->kv_heads == 0 || o->kv_heads > 256 || o->q_per_kv == 0 ||
	    o->q_per_kv > MKV_MAX_QHEADS || !mkv_d_valid(o->d))
		return false;
	if (o->prefill_segment < 64 || o->prefill_segment > MKV_MAX_N ||
	    o->max_segment == 0 || o->max_segment > MKV_MAX_N ||
	    o->min_segment == 0 || o->min_segment > o->max_segment ||
	    o->window > 4096 || o->drop > 1 || o->device_attend > 1)
		return false;
	if (!(o->refine == 0.0 || (o->refine >= 1.0 && o->refine <= 16.0)))
		return false;
	if (!(o->token_frac > 0 && o->token_frac <= 1) ||
	    !(o->loss_threshold > 0 && o->loss_threshold <= 1) ||
	    !(o->var_threshold > 0 && o->var_threshold <= 1))
		return false;
	if (o->store_dtype != MKV_DTYPE_BF16 && o->store_dtype != MKV_DTYPE_F32)
		return false;
	if (o->adaptive > 1 ||
	    (o->value_bits && (o->value_bits < 4 || o->value_bits > 8)))
		return false;
	uint32_t dk = mkv_d_keep(o->d, o->drop);
	if (o->summary_channels > dk && o->summary_channels != SEQ_S_IS_R)
		return false;
	if (!o->adaptive && (!mkv_g_valid(o->g) || !mkv_b_valid(o->b) ||
			     o->r > dk || o->r % o->g || dk % o->g))
		return false;
	return o->lag_cap >= ((size_t)1 << 20) && o->staging_bytes > 0 &&
	       o->attend_threads <= 64 && o->device_positions <= 1 &&
	       (o->summary_bits == 8 || o->summary_bits == 16);
}

static void strat_free(struct strat *s)
{
	free(s->Rk);
	free(s->Rv);
	s->Rk = s->Rv = NULL;
}

static int strat_copy(struct strat *dst, const struct strat *src, uint32_t d)
{
	struct strat t = *src;
	t.Rk = malloc(sizeof(float) * d * d);
	t.Rv = malloc(sizeof(float) * d * d);
	if (!t.Rk || !t.Rv) {
		strat_free(&t);
		return -ENOMEM;
	}
	memcpy(t.Rk, src->Rk, sizeof(float) * d * d);
	memcpy(t.Rv, src->Rv, sizeof(float) * d * d);
	strat_free(dst);
	*dst = t;
	return 0;
}

static struct lh *lh_of(struct mkv_seq *s, uint32_t layer, uint32_t head)
{
	return seq_lh(s, layer, head);
}

/* Give up @l's device copies: retired (freed after the last attend) when
 * an attend may have read them, else dropped at once. */
static void lh_drop_dev(struct mkv_seq *s, struct lh *l, bool attended)
{
	s->dev_epoch++;
	for (size_t i = 0; i < l->nsegs; i++) {
		if (attended)
			seqgpu_retire(s->gpu, l->segs[i].dev);
		else
			seqgpu_drop(s->gpu, l->segs[i].dev);
		l->segs[i].dev = NULL;
	}
	if (attended)
		seqgpu_retire(s->gpu, l->odev);
	else
		seqgpu_drop(s->gpu, l->odev);
	l->odev = NULL;
}

static void lh_free(struct lh *l)
{
	for (size_t i = 0; i < l->nsegs; i++) {
		mkv_segment_destroy(l->segs[i].k);
		mkv_segment_destroy(l->segs[i].v);
	}
	free(l->segs);
	mkv_segment_destroy(l->ok);
	mkv_segment_destroy(l->ov);
	strat_free(&l->open);
	strat_free(&l->next);
	free(l->dropk_t);
	free(l->dropv_t);
	free(l->rawk);
	free(l->rawv);
	free(l->pred_id);
	free(l->pred_n);
	free(l->pred_blocks);
	memset(l, 0, sizeof(*l));
}

/* Remember that the attend selected @n blocks of final segment @id.  The
 * prediction is a hint: out of memory, it is dropped, never an error. */
static void pred_record(struct lh *l, uint32_t id, const uint32_t *blocks,
			uint32_t n)
{
	if (l->npred == l->pred_cap) {
		size_t cap = l->pred_cap ? 2 * l->pred_cap : 8;
		uint32_t *a = realloc(l->pred_id, cap * sizeof(*a));
		if (a)
			l->pred_id = a;
		uint32_t *b = a ? realloc(l->pred_n, cap * sizeof(*b)) : NULL;
		if (b)
			l->pred_n = b;
		if (!a || !b) {
			l->npred = l->npblocks = 0;
			return;
		}
		l->pred_cap = cap;
	}
	if (l->npblocks + n > l->pblocks_cap) {
		size_t cap = l->pblocks_cap ? 2 * l->pblocks_cap : 64;
		while (cap < l->npblocks + n)
			cap *= 2;
		uint32_t *c = realloc(l->pred_blocks, cap * sizeof(*c));
		if (!c) {
			l->npred = l->npblocks = 0;
			return;
		}
		l->pred_blocks = c;
		l->pblocks_cap = cap;
	}
	l->pred_id[l->npred] = id;
	l->pred_n[l->npred++] = n;
	memcpy(l->pred_blocks + l->npblocks, blocks, n * sizeof(*blocks));
	l->npblocks += n;
}

struct attend_pool;
static int pool_create(struct mkv_store *store, unsigned nt, size_t staging,
		       struct attend_pool **out);
static void pool_destroy(struct attend_pool *p);
typedef int (*head_fn)(void *ctx, uint32_t head, struct mkv_fetch *f);
static int pool_call(struct attend_pool *p, head_fn fn, void *ctx, uint32_t heads,
		     struct mkv_fetch *f);

int mkv_seq_open(struct mkv_store *store, const struct mkv_seq_opts *o,
		 uint64_t id, struct mkv_seq **out)
{
	struct mkv_seq_opts full;
	if (!store || !o || !out || !seq_opts_full(o, &full) ||
	    !seq_opts_valid(&full))
		return -EINVAL;
	if (!full.adaptive && !full.r) {
		uint32_t dk = mkv_d_keep(full.d, full.drop);
		full.r = mkv_seq_default_r(full.d, full.value_bits, full.g);
		if (full.r > dk)
			full.r = dk - dk % full.g;
	}
	struct mkv_seq *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->store = store;
	s->o = full;
	o = &s->o;
	s->id = id;
	s->d_keep = mkv_d_keep(o->d, o->drop);
	s->lh = calloc((size_t)o->layers * o->kv_heads, sizeof(*s->lh));
	int rc = -ENOMEM;
	if (!s->lh)
		goto fail;
	rc = mkv_fetch_create(store, o->staging_bytes, &s->fetch);
	if (rc)
		goto fail;
	if (o->attend_threads > 1 && o->kv_heads > 1) {
		unsigned nt = o->attend_threads < o->kv_heads ? o->attend_threads : o->kv_heads;
		rc = pool_create(store, nt, o->staging_bytes, &s->pool);
		if (rc) {
			mkv_fetch_destroy(s->fetch);
			goto fail;
		}
	}
	rc = seqgpu_create(store_device(store), o, &s->gpu);
	if (rc) {
		pool_destroy(s->pool);
		mkv_fetch_destroy(s->fetch);
		goto fail;
	}
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	*out = s;
	return 0;
fail:
	free(s->lh);
	free(s);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Raw copies */

static size_t raw_row_bytes(const struct mkv_seq *s)
{
	return 2 * sizeof(float) * s->o.d; /* K and V */
}

/* Make room for rows up to @end (absolute token index). */
static int raw_reserve(struct mkv_seq *s, struct lh *l, size_t end)
{
	size_t need = end - l->raw_start;
	if (need <= l->raw_cap)
		return 0;
	size_t cap = l->raw_cap ? l->raw_cap : 256;
	while (cap < need)
		cap *= 2;
	size_t d = s->o.d;
	float *k = realloc(l->rawk, sizeof(float) * cap * d);
	if (!k)
		return -ENOMEM;
	l->rawk = k;
	float *v = realloc(l->rawv, sizeof(float) * cap * d);
	if (!v)
		return -ENOMEM;
	l->rawv = v;
	l->raw_cap = cap;
	return 0;
}

/* Drop raw rows before token @upto (nothing of the window is dropped). */
static void raw_release(struct mkv_seq *s, struct lh *l, size_t upto)
{
	size_t keep_from = l->n > s->o.window ? l->n - s->o.window : 0;
	if (upto > keep_from)
		upto = keep_from;
	if (upto <= l->raw_start)
		return;
	size_t d = s->o.d, drop = upto - l->raw_start, rest = l->n - upto;
	memmove(l->rawk, l->rawk + drop * d, sizeof(float) * rest * d);
	memmove(l->rawv, l->rawv + drop * d, sizeof(float) * rest * d);
	l->raw_start = upto;
}

/* First token not yet final (the lag starts there).  The scan resumes
 * where the last one stopped: from the start it walked every final
 * segment (256 a head at 1M tokens) two or three times an append, which
 * made a 1M-token append about twice a 128K one on the same H200 host. */
static size_t lh_first_unfinal(struct lh *l)
{
	size_t i = l->first_unfinal;
	while (i < l->nsegs && l->segs[i].final)
		i++;
	l->first_unfinal = i;
	return i < l->nsegs ? l->segs[i].start : l->ostart;
}

static void lag_update(struct mkv_seq *s)
{
	uint64_t toks = 0;
	for (size_t i = 0; i < (size_t)s->o.layers * s->o.kv_heads; i++)
		toks += s->lh[i].n - lh_first_unfinal(&s->lh[i]);
	s->st.lag_tokens = toks;
	s->st.lag_bytes = toks * raw_row_bytes(s);
	if (s->st.lag_bytes > s->st.max_lag_bytes)
		s->st.max_lag_bytes = s->st.lag_bytes;
}

/* ---------------------------------------------------------------------- */
/* Strategy and encoding */

/* The strategy of one segment from its raw vectors: rotation from the
 * data; r, g, b chosen by loss (opts.r == 0) or fixed. */
static int choose(const struct mkv_seq *s, const float *x, size_t n, float *R,
		  uint32_t *r, uint32_t *g, uint32_t *b)
{
	if (!s->o.adaptive) {
		/* r, g and b are fixed: only the rotation is chosen, without
		 * the loss and variance tables (a rotation and a sort per
		 * vector) that choosing them takes */
		*r = s->o.r;
		*g = s->o.g;
		*b = s->o.b;
		return mkv_rotation_of(x, n, s->o.d, R);
	}
	struct mkv_strategy_opts so;
	mkv_strategy_opts_init(&so, sizeof so);
	so.d = s->o.d;
	so.drop = s->o.drop;
	so.loss_threshold = s->o.loss_threshold;
	so.var_threshold = s->o.var_threshold;
	struct mkv_strategy st;
	int rc = mkv_strategy_choose(&so, x, MKV_DTYPE_F32, n, R, &st);
	if (rc)
		return rc;
	*r = st.r;
	*g = st.g;
	*b = st.b;
	return 0;
}

static void encode_opts(const struct mkv_seq *s, struct mkv_encode_opts *eo,
			enum mkv_kind kind, const float *R, uint32_t r,
			uint32_t g, uint32_t b)
{
	mkv_encode_opts_init(eo, sizeof *eo);
	eo->d = s->o.d;
	eo->r = r;
	eo->g = g;
	eo->b = b;
	eo->drop = s->o.drop;
	eo->kind = kind;
	eo->store_dtype = s->o.store_dtype;
	eo->value_bits = s->o.value_bits;
	uint32_t S = s->o.summary_channels;
	if (kind == MKV_KIND_KEY && S != SEQ_S_IS_R)
		eo->summary_channels = S ? S : (r < s->o.d / 4 ? r : s->o.d / 4);
	eo->rotation = R;
}

/* Encode a final K/V pair from raw rows with a fresh strategy. */
static int encode_final(const struct mkv_seq *s, const float *k, const float *v,
			size_t n, struct mkv_segment **ko, struct mkv_segment **vo,
			struct strat *st)
{
	size_t dd = (size_t)s->o.d * s->o.d;
	struct strat t = {.Rk = malloc(sizeof(float) * dd),
			  .Rv = malloc(sizeof(float) * dd)};
	struct mkv_segment *ks = NULL, *vs = NULL;
	int rc = -ENOMEM;
	if (!t.Rk || !t.Rv)
		goto fail;
	if ((rc = choose(s, k, n, t.Rk, &t.rk, &t.gk, &t.b)))
		goto fail;
	uint32_t bv;
	if ((rc = choose(s, v, n, t.Rv, &t.rv, &t.gv, &bv)))
		goto fail;
	struct mkv_encode_opts eo;
	encode_opts(s, &eo, MKV_KIND_KEY, t.Rk, t.rk, t.gk, t.b);
	if ((rc = mkv_segment_encode(&eo, k, MKV_DTYPE_F32, n, &ks)))
		goto fail;
	encode_opts(s, &eo, MKV_KIND_VALUE, t.Rv, t.rv, t.gv, t.b);
	if ((rc = mkv_segment_encode(&eo, v, MKV_DTYPE_F32, n, &vs)))
		goto fail;
	*ko = ks;
	*vo = vs;
	*st = t;
	return 0;
fail:
	mkv_segment_destroy(ks);
	mkv_segment_destroy(vs);
	strat_free(&t);
	return rc;
}

static struct mkv_seg_key seg_key(const struct mkv_seq *s, uint32_t layer,
				  uint32_t head, uint32_t id, enum mkv_kind kind)
{
	return seq_key(s, layer, head, id, kind);
}

/* With 8-bit scores on the host path (no device copies, or refine > 1),
 * a final key skeleton keeps its blocks' 8-bit rows, made here on the
 * worker before the swap publishes it: the attends read them without a
 * lock, where they made each row per step (2S divisions a block: the
 * host score 4.6x the time with the rows kept, bench/hostscore).  The
 * device path makes its own on the device.  Out of memory leaves them to
 * be made per step. */
static void keep_sum8(const struct mkv_seq *s, struct mkv_segment *k)
{
	if (s->o.summary_bits == 8 && (!s->gpu || s->o.refine > 1.0) &&
	    seq_sum8_ok(k->v.summary_channels))
		(void)seg_make_sum8(k);
}

/* Put a K/V pair in the store and strip them to skeletons.  On failure
 * nothing stays in the store. */
static int store_pair(struct mkv_seq *s, uint32_t layer, uint32_t head,
		      uint32_t id, struct mkv_segment *k, struct mkv_segment *v)
{
	struct mkv_seg_key kk = seg_key(s, layer, head, id, MKV_KIND_KEY);
	struct mkv_seg_key vk = seg_key(s, layer, head, id, MKV_KIND_VALUE);
	int rc = mkv_store_put_segment(s->store, &kk, k);
	if (rc)
		return rc;
	rc = mkv_store_put_segment(s->store, &vk, v);
	if (rc) {
		mkv_store_remove(s->store, &kk);
		return rc;
	}
	seg_strip(k);
	seg_strip(v);
	return 0;
}

static int lh_push(struct lh *l, const struct hseg *h)
{
	if (l->nsegs == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 8;
		struct hseg *p = realloc(l->segs, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		l->segs = p;
		l->cap = cap;
	}
	l->segs[l->nsegs++] = *h;
	return 0;
}

/* Start a new, empty open segment at token @start with strategy l->next. */
static int open_begin(struct mkv_seq *s, struct lh *l, uint32_t start)
{
	struct mkv_encode_opts eo;
	struct mkv_segment *k = NULL, *v = NULL;
	float *dk = NULL, *dv = NULL;
	size_t kc = 0, vc = 0;
	const uint32_t d = s->o.d, dkeep = s->d_keep;
	encode_opts(s, &eo, MKV_KIND_KEY, l->next.Rk, l->next.rk, l->next.gk, l->next.b);
	int rc = seg_grow_create(&eo, &k);
	if (rc)
		goto fail;
	encode_opts(s, &eo, MKV_KIND_VALUE, l->next.Rv, l->next.rv, l->next.gv, l->next.b);
	if ((rc = seg_grow_create(&eo, &v)))
		goto fail;
	if (dkeep < d) {
		rc = -ENOMEM;
		dk = malloc(sizeof(float) * (d - dkeep) * d);
		dv = malloc(sizeof(float) * (d - dkeep) * d);
		if (!dk || !dv)
			goto fail;
		mkv_transpose(l->next.Rk + (size_t)dkeep * d, d - dkeep, d, dk);
		mkv_transpose(l->next.Rv + (size_t)dkeep * d, d - dkeep, d, dv);
	}
	if ((rc = strat_copy(&l->open, &l->next, s->o.d)))
		goto fail;
	mkv_segment_destroy(l->ok);
	mkv_segment_destroy(l->ov);
	free(l->dropk_t);
	free(l->dropv_t);
	l->ok = k;
	l->ov = v;
	l->okcap = kc;
	l->ovcap = vc;
	l->dropk_t = dk;
	l->dropv_t = dv;
	l->ek = l->lk = l->ev = l->lv = 0.0;
	l->ostart = start;
	return 0;
fail:
	mkv_segment_destroy(k);
	mkv_segment_destroy(v);
	free(dk);
	free(dv);
	return rc;
}

/* The open segment takes @n rows of K and V (validated, room reserved):
 * packed into its buffers, and their energy and what the encoding loses
 * added to its loss. */
static int open_append(struct mkv_seq *s, struct lh *l, const float *k, const float *v,
		       size_t n)
{
	const uint32_t d = s->o.d, dkeep = s->d_keep;
	int rc = seg_grow_append(l->ok, &l->okcap, k, n, &l->lk);
	if (rc == 0)
		rc = seg_grow_append(l->ov, &l->ovcap, v, n, &l->lv);
	if (rc)
		return rc;
	float xr[MKV_MAX_D];
	for (size_t t = 0; t < n; t++) {
		const float *kt = k + t * d, *vt = v + t * d;
		double ek = 0.0, ev = 0.0;
		for (uint32_t c = 0; c < d; c++) {
			ek += (double)kt[c] * kt[c];
			ev += (double)vt[c] * vt[c];
		}
		l->ek += ek;
		l->ev += ev;
		if (dkeep == d)
			continue;
		/* the dropped channels' energy summed directly, not as the
		 * difference to the kept ones (which would cancel) */
		double lk = 0.0, lv = 0.0;
		mkv_rotate_t(l->dropk_t, d - dkeep, d, kt, xr);
		for (uint32_t c = 0; c < d - dkeep; c++)
			lk += (double)xr[c] * xr[c];
		mkv_rotate_t(l->dropv_t, d - dkeep, d, vt, xr);
		for (uint32_t c = 0; c < d - dkeep; c++)
			lv += (double)xr[c] * xr[c];
		l->lk += lk;
		l->lv += lv;
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Finalization jobs */

struct job {
	struct mkv_seq *s;
	uint32_t layer, head, id;
	size_t n;
	float *k, *v;   /* private raw copies */
	struct done *d; /* the result, allocated by the submitter so a
			 * finished job can always be published */
};

static void job_run(void *arg)
{
	struct job *j = arg;
	struct mkv_seq *s = j->s;
	struct done *d = j->d;
	struct mkv_segment *ks = NULL, *vs = NULL;
	struct dseg *dev = NULL;
	int rc = encode_final(s, j->k, j->v, j->n, &ks, &vs, &d->st);
	if (rc == 0) {
		/* The device copy is made here, off the decode thread, before
		 * store_pair strips the values; the swap only attaches it. */
		dev = seqgpu_upload(s->gpu, ks, vs);
		rc = store_pair(s, j->layer, j->head, j->id, ks, vs);
		if (rc) {
			mkv_segment_destroy(ks);
			mkv_segment_destroy(vs);
			seqgpu_drop(s->gpu, dev);
			strat_free(&d->st);
			ks = vs = NULL;
			dev = NULL;
		} else {
			keep_sum8(s, ks);
		}
	}
	free(j->k);
	free(j->v);
	d->layer = j->layer;
	d->head = j->head;
	d->id = j->id;
	d->status = rc;
	d->k = ks;
	d->v = vs;
	d->dev = dev;
	pthread_mutex_lock(&s->lock);
	d->next = s->done;
	s->done = d;
	s->inflight--;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	free(j);
}

static struct hseg *find_seg(struct lh *l, uint32_t id)
{
	for (size_t i = 0; i < l->nsegs; i++)
		if (l->segs[i].id == id)
			return &l->segs[i];
	return NULL;
}

/* The swap: publish finished jobs.  Caller thread only. */
static void apply_done(struct mkv_seq *s)
{
	pthread_mutex_lock(&s->lock);
	struct done *d = s->done;
	s->done = NULL;
	pthread_mutex_unlock(&s->lock);
	while (d) {
		struct done *next = d->next;
		struct lh *l = lh_of(s, d->layer, d->head);
		struct hseg *h = find_seg(l, d->id);
		if (h)
			h->queued = 0;
		if (d->status == 0 && h) {
			mkv_segment_destroy(h->k);
			mkv_segment_destroy(h->v);
			h->k = d->k;
			h->v = d->v;
			h->final = 1;
			/* The temporary device copy may still be read by an
			 * attend in flight: freed in stream order. */
			seqgpu_retire(s->gpu, h->dev);
			h->dev = d->dev;
			s->st.swaps++;
			/* The final strategy becomes the next segment's. */
			strat_free(&l->next);
			l->next = d->st;
			d->st.Rk = d->st.Rv = NULL;
			raw_release(s, l, lh_first_unfinal(l));
		} else {
			s->st.finalize_failed++;
			s->st.last_error = d->status ? d->status : -ENOENT;
			mkv_segment_destroy(d->k);
			mkv_segment_destroy(d->v);
			seqgpu_drop(s->gpu, d->dev);
		}
		strat_free(&d->st);
		free(d);
		d = next;
	}
	lag_update(s);
}

/* Copy the raw rows of @h for a job. */
static struct job *job_make(struct mkv_seq *s, struct lh *l, uint32_t layer,
			    uint32_t head, const struct hseg *h)
{
	struct job *j = calloc(1, sizeof(*j));
	size_t bytes = sizeof(float) * h->n * s->o.d;
	if (!j)
		return NULL;
	j->k = malloc(bytes);
	j->v = malloc(bytes);
	j->d = calloc(1, sizeof(*j->d));
	if (!j->k || !j->v || !j->d) {
		free(j->k);
		free(j->v);
		free(j->d);
		free(j);
		return NULL;
	}
	size_t off = (h->start - l->raw_start) * (size_t)s->o.d;
	memcpy(j->k, l->rawk + off, bytes);
	memcpy(j->v, l->rawv + off, bytes);
	*j = (struct job){.s = s, .layer = layer, .head = head, .id = h->id,
			  .n = h->n, .k = j->k, .v = j->v, .d = j->d};
	return j;
}

/* Queue the finalization of pending segment @h on the store's workers, or
 * run it here when @sync. */
static int finalize(struct mkv_seq *s, struct lh *l, uint32_t layer,
		    uint32_t head, struct hseg *h, bool sync)
{
	struct job *j = job_make(s, l, layer, head, h);
	if (!j)
		return -ENOMEM;
	h->queued = 1;
	pthread_mutex_lock(&s->lock);
	s->inflight++;
	pthread_mutex_unlock(&s->lock);
	int rc = sync ? -EAGAIN : store_submit_call(s->store, job_run, j);
	if (rc) {
		/* Run it on this thread: synchronous finalization. */
		job_run(j);
		if (sync)
			s->st.sync_finalized++;
		apply_done(s);
	}
	return 0;
}

/* Close the open segment of @l: it becomes pending and is queued. */
static int close_open(struct mkv_seq *s, struct lh *l, uint32_t layer,
		      uint32_t head, bool sync)
{
	if (!l->ok || l->ok->v.n == 0)
		return 0;
	/* The update buffer's device copy becomes the pending segment's. */
	struct hseg h = {.k = l->ok, .v = l->ov, .dev = l->odev, .start = l->ostart,
			 .n = l->ok->v.n, .id = l->next_id};
	/* Open the successor first so a failure leaves everything as it was. */
	struct mkv_segment *ok = l->ok, *ov = l->ov;
	l->ok = l->ov = NULL;
	int rc = open_begin(s, l, l->n);
	if (rc == 0)
		rc = lh_push(l, &h);
	if (rc) {
		mkv_segment_destroy(l->ok);
		mkv_segment_destroy(l->ov);
		l->ok = ok;
		l->ov = ov;
		return rc;
	}
	l->odev = NULL; /* the next device attend makes the new one */
	l->next_id++;
	return finalize(s, l, layer, head, &l->segs[l->nsegs - 1], sync);
}

/* ---------------------------------------------------------------------- */
/* Prefill */

/*
 * Prefill segments are independent: each is one job (convert its tokens,
 * choose its strategy, encode, upload to the device, put in the store),
 * run by the store's workers and by the calling thread alike, which then
 * publishes them in order.  A batch is reference-counted because runners
 * queued behind other work may start after the caller has finished every
 * job itself (e.g. with the workers busy or paused); they then find
 * nothing to do and drop their reference.
 */
struct pjob {
	uint32_t head;
	size_t a, m;          /* tokens [a, a + m) of the head */
	struct hseg h;        /* on success: final, stored, skeletons */
	struct strat st;      /* its strategy */
	int rc;
};

struct pbatch {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct mkv_seq *s;
	uint32_t layer;
	const char *k, *v;    /* the caller's [kv_heads][n][d] of dt */
	enum mkv_dtype dt;
	size_t n;
	struct pjob *jobs;
	size_t njobs, next, done; /* under mu */
	unsigned refs;            /* under mu */
};

static void pjob_run(struct pbatch *b, struct pjob *j)
{
	struct mkv_seq *s = b->s;
	size_t d = s->o.d, es = mkv_dtype_size(b->dt);
	size_t off = ((size_t)j->head * b->n + j->a) * d * es;
	float *kf = malloc(sizeof(float) * j->m * d), *vf = malloc(sizeof(float) * j->m * d);
	int rc = -ENOMEM;
	if (!kf || !vf)
		goto out;
	rc = -MKV_ENONFINITE;
	if (!mkv_load_f32(kf, b->k + off, b->dt, j->m * d) ||
	    !mkv_load_f32(vf, b->v + off, b->dt, j->m * d))
		goto out;
	rc = encode_final(s, kf, vf, j->m, &j->h.k, &j->h.v, &j->st);
	if (rc)
		goto out;
	/* Upload before store_pair strips the values. */
	j->h.dev = seqgpu_upload(s->gpu, j->h.k, j->h.v);
	rc = store_pair(s, b->layer, j->head, j->h.id, j->h.k, j->h.v);
	if (rc) {
		mkv_segment_destroy(j->h.k);
		mkv_segment_destroy(j->h.v);
		seqgpu_drop(s->gpu, j->h.dev);
		strat_free(&j->st);
		j->h.k = j->h.v = NULL;
		j->h.dev = NULL;
	} else {
		keep_sum8(s, j->h.k);
	}
out:
	free(kf);
	free(vf);
	j->rc = rc;
}

static void pbatch_loop(struct pbatch *b)
{
	for (;;) {
		pthread_mutex_lock(&b->mu);
		if (b->next >= b->njobs) {
			pthread_mutex_unlock(&b->mu);
			return;
		}
		size_t i = b->next++;
		pthread_mutex_unlock(&b->mu);
		pjob_run(b, &b->jobs[i]);
		pthread_mutex_lock(&b->mu);
		if (++b->done == b->njobs)
			pthread_cond_broadcast(&b->cv);
		pthread_mutex_unlock(&b->mu);
	}
}

static void pbatch_unref(struct pbatch *b)
{
	pthread_mutex_lock(&b->mu);
	unsigned left = --b->refs;
	pthread_mutex_unlock(&b->mu);
	if (left)
		return;
	pthread_mutex_destroy(&b->mu);
	pthread_cond_destroy(&b->cv);
	free(b->jobs);
	free(b);
}

static void pbatch_runner(void *arg)
{
	pbatch_loop(arg);
	pbatch_unref(arg);
}

/* Run every job of @b on the workers and this thread; return when all are
 * done (the caller still holds its reference). */
static void pbatch_run(struct pbatch *b)
{
	size_t runners = b->njobs > 1 ? b->njobs - 1 : 0;
	if (runners > 64)
		runners = 64;
	for (size_t i = 0; i < runners; i++) {
		pthread_mutex_lock(&b->mu);
		b->refs++;
		pthread_mutex_unlock(&b->mu);
		if (store_submit_call(b->s->store, pbatch_runner, b)) {
			pthread_mutex_lock(&b->mu);
			b->refs--;
			pthread_mutex_unlock(&b->mu);
			break;
		}
	}
	pbatch_loop(b);
	pthread_mutex_lock(&b->mu);
	while (b->done < b->njobs)
		pthread_cond_wait(&b->cv, &b->mu);
	pthread_mutex_unlock(&b->mu);
}

/* Undo the stored segments of a job that succeeded. */
static void pjob_undo(struct mkv_seq *s, uint32_t layer, struct pjob *j)
{
	struct mkv_seg_key kk = seg_key(s, layer, j->head, j->h.id, MKV_KIND_KEY);
	struct mkv_seg_key vk = seg_key(s, layer, j->head, j->h.id, MKV_KIND_VALUE);
	mkv_store_remove(s->store, &kk);
	mkv_store_remove(s->store, &vk);
	mkv_segment_destroy(j->h.k);
	mkv_segment_destroy(j->h.v);
	seqgpu_drop(s->gpu, j->h.dev);
	strat_free(&j->st);
	j->h.k = j->h.v = NULL;
	j->h.dev = NULL;
}

/*
 * After the head's final segments are in l->segs: the strategy of the last
 * becomes the next one's, the remainder [covered, n) starts the open
 * segment, and the raw rows the window needs are kept.  @kt, @vt hold the
 * head's float rows [ta, n), ta = min(covered, n - window).
 */
static int prefill_tail(struct mkv_seq *s, struct lh *l, const float *kt,
			const float *vt, size_t ta, size_t covered, size_t n,
			struct strat *last)
{
	size_t d = s->o.d;
	strat_free(&l->next);
	l->next = *last;
	last->Rk = last->Rv = NULL;
	l->n = (uint32_t)n;
	l->raw_start = ta;
	int rc = open_begin(s, l, (uint32_t)covered);
	if (rc == 0 && ta < n)
		rc = raw_reserve(s, l, n);
	if (rc == 0 && ta < n) {
		memcpy(l->rawk, kt, sizeof(float) * (n - ta) * d);
		memcpy(l->rawv, vt, sizeof(float) * (n - ta) * d);
	}
	if (rc == 0 && covered < n) {
		const float *kr = kt + (covered - ta) * d, *vr = vt + (covered - ta) * d;
		size_t m = n - covered;
		rc = open_append(s, l, kr, vr, m);
	}
	return rc;
}

/* Undo a layer's prefill: remove stored segments, free everything.  Its
 * device copies were never attended. */
static void layer_reset(struct mkv_seq *s, uint32_t layer)
{
	for (uint32_t h = 0; h < s->o.kv_heads; h++) {
		struct lh *l = lh_of(s, layer, h);
		for (size_t i = 0; i < l->nsegs; i++) {
			if (!l->segs[i].final)
				continue;
			struct mkv_seg_key kk = seg_key(s, layer, h, l->segs[i].id, MKV_KIND_KEY);
			struct mkv_seg_key vk = seg_key(s, layer, h, l->segs[i].id, MKV_KIND_VALUE);
			mkv_store_remove(s->store, &kk);
			mkv_store_remove(s->store, &vk);
		}
		lh_drop_dev(s, l, false);
		lh_free(l);
	}
}

/* Prefill from host arrays (see mkv_seq_prefill). */
static int prefill_host(struct mkv_seq *s, uint32_t layer, const void *k,
			const void *v, enum mkv_dtype dt, size_t n)
{
	size_t d = s->o.d, es = mkv_dtype_size(dt), ps = s->o.prefill_segment;
	uint32_t H = s->o.kv_heads;
	/*
	 * Every prefill token goes into a final segment with a strategy of its
	 * own: segments of ps tokens, and the remainder a segment of its own
	 * when it has at least min_segment tokens, else the last segment's
	 * tail.  (The remainder once started the open segment, compressed
	 * with the previous segment's rotation until the segment closed: on
	 * SmolLM2 at 8K that lost every needle in its 3.5K tokens.)  The open
	 * segment then starts empty, for the decode tokens.
	 */
	size_t nfull = n <= ps ? 1 : n / ps;
	size_t rem = n <= ps ? 0 : n - nfull * ps;
	bool rem_alone = rem && (rem >= s->o.min_segment || ps + rem > MKV_MAX_N);
	size_t nch = nfull + (rem_alone ? 1 : 0);
	size_t covered = n;
	size_t w0 = n > s->o.window ? n - s->o.window : 0;
	size_t ta = covered < w0 ? covered : w0;
	struct pbatch *b = calloc(1, sizeof(*b));
	float *kt = malloc(sizeof(float) * ((n - ta) ? (n - ta) : 1) * d);
	float *vt = malloc(sizeof(float) * ((n - ta) ? (n - ta) : 1) * d);
	int rc = -ENOMEM;
	if (!b || !kt || !vt) {
		free(b);
		goto out;
	}
	b->jobs = calloc(nch * H, sizeof(*b->jobs));
	if (!b->jobs) {
		free(b);
		goto out;
	}
	pthread_mutex_init(&b->mu, NULL);
	pthread_cond_init(&b->cv, NULL);
	b->s = s;
	b->layer = layer;
	b->k = k;
	b->v = v;
	b->dt = dt;
	b->n = n;
	b->njobs = nch * H;
	b->refs = 1;
	for (uint32_t h = 0; h < H; h++)
		for (size_t i = 0; i < nch; i++) {
			struct pjob *j = &b->jobs[h * nch + i];
			j->head = h;
			j->a = i * ps;
			j->m = n <= ps ? n : i == nfull ? rem : ps;
			if (rem && !rem_alone && i + 1 == nfull)
				j->m += rem; /* a short remainder joins the last segment */
			j->h = (struct hseg){.start = (uint32_t)j->a, .n = (uint32_t)j->m,
					     .id = lh_of(s, layer, h)->next_id + (uint32_t)i,
					     .final = 1};
		}
	pbatch_run(b);
	/* The first failure in (head, segment) order is the one reported. */
	rc = 0;
	for (size_t i = 0; i < b->njobs && rc == 0; i++)
		rc = b->jobs[i].rc;
	for (uint32_t h = 0; h < H && rc == 0; h++) {
		struct lh *l = lh_of(s, layer, h);
		const char *kh = (const char *)k + ((size_t)h * n + ta) * d * es;
		const char *vh = (const char *)v + ((size_t)h * n + ta) * d * es;
		if (!mkv_load_f32(kt, kh, dt, (n - ta) * d) ||
		    !mkv_load_f32(vt, vh, dt, (n - ta) * d)) {
			rc = -MKV_ENONFINITE;
			break;
		}
		for (size_t i = 0; i < nch && rc == 0; i++) {
			struct pjob *j = &b->jobs[h * nch + i];
			rc = lh_push(l, &j->h);
			if (rc == 0) {
				/* The sequence owns it now. */
				j->h.k = j->h.v = NULL;
				j->h.dev = NULL;
				j->rc = 1;
				l->next_id++;
				if (i + 1 < nch)
					strat_free(&j->st);
			}
		}
		if (rc == 0)
			rc = prefill_tail(s, l, kt, vt, ta, covered, n,
					  &b->jobs[h * nch + nch - 1].st);
	}
	if (rc) {
		/* Jobs not taken over by a head are undone here, the rest by
		 * layer_reset. */
		for (size_t i = 0; i < b->njobs; i++)
			if (b->jobs[i].rc == 0)
				pjob_undo(s, layer, &b->jobs[i]);
		layer_reset(s, layer);
	}
	for (size_t i = 0; i < b->njobs; i++)
		strat_free(&b->jobs[i].st);
	pbatch_unref(b);
out:
	free(kt);
	free(vt);
	return rc;
}

int mkv_seq_prefill(struct mkv_seq *s, uint32_t layer, const void *k,
		    const void *v, enum mkv_dtype dt, size_t n)
{
	if (!s || !k || !v || n == 0 || layer >= s->o.layers ||
	    !mkv_dtype_valid(dt) || n > UINT32_MAX / 2)
		return -EINVAL;
	for (uint32_t h = 0; h < s->o.kv_heads; h++)
		if (lh_of(s, layer, h)->n)
			return -EINVAL;
	apply_done(s);
	/* Device inputs: copied to the host first. */
	int dev = store_device(s->store);
	void *hk = NULL, *hv = NULL;
	int rc = 0;
	if (dev >= 0 && (seqgpu_is_device_ptr(dev, k) || seqgpu_is_device_ptr(dev, v))) {
		size_t bytes = (size_t)s->o.kv_heads * n * s->o.d * mkv_dtype_size(dt);
		hk = malloc(bytes);
		hv = malloc(bytes);
		rc = -ENOMEM;
		if (hk && hv) {
			rc = seqgpu_is_device_ptr(dev, k) ? seqgpu_to_host(dev, hk, k, bytes)
							  : (memcpy(hk, k, bytes), 0);
			if (rc == 0)
				rc = seqgpu_is_device_ptr(dev, v) ? seqgpu_to_host(dev, hv, v, bytes)
								  : (memcpy(hv, v, bytes), 0);
		}
		k = hk;
		v = hv;
	}
	if (rc == 0)
		rc = prefill_host(s, layer, k, v, dt, n);
	if (rc == 0 && layer == 0)
		s->st.tokens = n;
	free(hk);
	free(hv);
	lag_update(s);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Append */

static bool open_should_close(const struct mkv_seq *s, const struct lh *l)
{
	uint32_t n = l->ok->v.n;
	if (n >= s->o.max_segment)
		return true;
	if (n < s->o.min_segment)
		return false;
	/* the relative loss ‖X − X̂‖_F / ‖X‖_F of the buffers' own encoding */
	double lk = l->ek > 0.0 ? sqrt(l->lk / l->ek) : 0.0;
	double lv = l->ev > 0.0 ? sqrt(l->lv / l->ev) : 0.0;
	return lk > s->o.loss_threshold || lv > s->o.loss_threshold;
}

/* One token of a layer, the work of head @h (on the head pool with
 * attend_threads > 1: it writes only that head's state).  Its room is
 * reserved, so it cannot fail. */
struct append_call {
	struct mkv_seq *s;
	uint32_t layer;
	const float *k, *v;
};

static int append_head(void *ctx, uint32_t h, struct mkv_fetch *f)
{
	(void)f;
	const struct append_call *c = ctx;
	struct mkv_seq *s = c->s;
	const size_t d = s->o.d;
	struct lh *l = lh_of(s, c->layer, h);
	const float *kh = c->k + h * d, *vh = c->v + h * d;
	(void)open_append(s, l, kh, vh, 1);
	size_t off = (l->n - l->raw_start) * d;
	memcpy(l->rawk + off, kh, sizeof(float) * d);
	memcpy(l->rawv + off, vh, sizeof(float) * d);
	l->n++;
	raw_release(s, l, lh_first_unfinal(l));
	return 0;
}

static int append_one(struct mkv_seq *s, uint32_t layer, const float *k,
		      const float *v)
{
	/* Reserve for every head first: once a head takes the token, all do
	 * (the input is already known to be finite). */
	for (uint32_t h = 0; h < s->o.kv_heads; h++) {
		struct lh *l = lh_of(s, layer, h);
		if (!l->ok)
			return -EINVAL; /* layer never prefilled */
		int rc = raw_reserve(s, l, (size_t)l->n + 1);
		if (!rc)
			rc = seg_grow_reserve(l->ok, (size_t)l->ok->v.n + 1, &l->okcap);
		if (!rc)
			rc = seg_grow_reserve(l->ov, (size_t)l->ov->v.n + 1, &l->ovcap);
		if (rc)
			return rc;
	}
	struct append_call c = {s, layer, k, v};
	if (s->pool && s->o.kv_heads > 1)
		(void)pool_call(s->pool, append_head, &c, s->o.kv_heads, s->fetch);
	else
		for (uint32_t h = 0; h < s->o.kv_heads; h++)
			(void)append_head(&c, h, NULL);
	/* Closing is after the token is in every head; a failed close leaves
	 * the segment open and is retried at the next token. */
	for (uint32_t h = 0; h < s->o.kv_heads; h++) {
		struct lh *l = lh_of(s, layer, h);
		if (open_should_close(s, l))
			(void)close_open(s, l, layer, h, false);
	}
	return 0;
}

/*
 * Early close: from half of lag_cap held by open segments, the largest open
 * segment of at least min_segment tokens is closed and queued to the
 * workers, one per call.  A low-loss strategy (the fixed default r keeps
 * ~0.1 of relative loss against a 0.3 threshold) never closes a segment on
 * loss, and without this the raw copies would grow until the hard cap
 * below finalizes them synchronously on the decode thread, a stall of one
 * whole finalization per step.  With it the cap is reached only when the
 * workers fall behind.  Nothing is queued past half the cap of pending
 * segments: then the open ones grow instead, into fewer and longer jobs.
 */
static void close_early(struct mkv_seq *s)
{
	uint64_t open = 0;
	struct lh *big = NULL;
	uint32_t bl = 0, bhd = 0;
	for (uint32_t layer = 0; layer < s->o.layers; layer++)
		for (uint32_t h = 0; h < s->o.kv_heads; h++) {
			struct lh *l = lh_of(s, layer, h);
			if (!l->ok)
				continue;
			uint32_t n = l->ok->v.n;
			open += n;
			if (n >= s->o.min_segment && (!big || n > big->ok->v.n)) {
				big = l;
				bl = layer;
				bhd = h;
			}
		}
	uint64_t row = raw_row_bytes(s), half = s->o.lag_cap / 2;
	if (!big || open * row <= half)
		return;
	lag_update(s);
	uint64_t pending = s->st.lag_bytes - open * row;
	if (pending + (uint64_t)big->ok->v.n * row <= half)
		(void)close_open(s, big, bl, bhd, false); /* a failure is retried */
}

/* Back-pressure: finalize the oldest pending segments on this thread while
 * the raw copies exceed the cap. */
static void backpressure(struct mkv_seq *s)
{
	lag_update(s);
	while (s->st.lag_bytes > s->o.lag_cap) {
		struct lh *best = NULL;
		struct hseg *bh = NULL;
		uint32_t bl = 0, bhd = 0;
		for (uint32_t layer = 0; layer < s->o.layers; layer++)
			for (uint32_t h = 0; h < s->o.kv_heads; h++) {
				struct lh *l = lh_of(s, layer, h);
				for (size_t i = 0; i < l->nsegs; i++) {
					struct hseg *x = &l->segs[i];
					if (x->final || x->queued)
						continue;
					if (!bh || x->start < bh->start) {
						best = l;
						bh = x;
						bl = layer;
						bhd = h;
					}
					break;
				}
			}
		if (!bh) {
			/* Nothing idle is pending: wait for queued jobs, then
			 * close the largest open segment synchronously. */
			mkv_seq_sync(s);
			lag_update(s);
			if (s->st.lag_bytes <= s->o.lag_cap)
				break;
			struct lh *big = NULL;
			for (uint32_t layer = 0; layer < s->o.layers; layer++)
				for (uint32_t h = 0; h < s->o.kv_heads; h++) {
					struct lh *l = lh_of(s, layer, h);
					if (l->ok && l->ok->v.n && (!big || l->ok->v.n > big->ok->v.n)) {
						big = l;
						bl = layer;
						bhd = h;
					}
				}
			if (!big || close_open(s, big, bl, bhd, true))
				break;
			lag_update(s);
			continue;
		}
		uint64_t before = s->st.lag_bytes;
		finalize(s, best, bl, bhd, bh, true);
		lag_update(s);
		if (s->st.lag_bytes >= before)
			break; /* finalization failed: keep serving, counted */
	}
}

int mkv_seq_append(struct mkv_seq *const *seqs, size_t n, uint32_t layer,
		   const void *k, const void *v, enum mkv_dtype dt)
{
	if (!seqs || n == 0 || !k || !v || !mkv_dtype_valid(dt))
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (!seqs[i] || layer >= seqs[i]->o.layers)
			return -EINVAL;
		if (seqs[i]->o.kv_heads != seqs[0]->o.kv_heads ||
		    seqs[i]->o.d != seqs[0]->o.d)
			return -MKV_ESHAPE;
	}
	size_t row = (size_t)seqs[0]->o.kv_heads * seqs[0]->o.d;
	size_t es = mkv_dtype_size(dt);
	float *kf = malloc(sizeof(float) * row * n), *vf = malloc(sizeof(float) * row * n);
	int rc = -ENOMEM;
	if (!kf || !vf)
		goto out;
	/* All or nothing on bad input. */
	rc = -MKV_ENONFINITE;
	if (!mkv_load_f32(kf, k, dt, row * n) || !mkv_load_f32(vf, v, dt, row * n))
		goto out;
	rc = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct mkv_seq *s = seqs[i];
		apply_done(s);
		rc = append_one(s, layer, kf + i * row, vf + i * row);
		if (rc == 0 && layer == 0)
			s->st.tokens++;
		if (rc == 0) {
			close_early(s);
			backpressure(s);
		}
	}
out:
	free(kf);
	free(vf);
	(void)es;
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Attention */

/* A read-only view of the first @n rows of @seg (n <= seg->v.n). */
static void seg_prefix(struct mkv_segment *dst, const struct mkv_segment *src,
		       uint32_t n)
{
	*dst = *src;
	dst->v.n = n;
	dst->v.n_blocks = (n + src->v.b - 1) / src->v.b;
}

/*
 * Attention of KV head @h of @layer on the CPU path: select on the
 * summaries, fetch the selected blocks through @f, refine, attend.  Reads
 * the sequence and writes only head @h's state (its predictions) and its
 * output rows, so heads may run on different threads, each with its own
 * fetch context.
 */
static int attend_head(struct mkv_seq *s, uint32_t layer, uint32_t h,
		       const struct mkv_attn_opts *aop, const float *q, float *out,
		       struct mkv_fetch *fc, bool host_read, uint64_t *fetch_bytes,
		       uint64_t *attend_bytes)
{
	const struct mkv_attn_opts ao = *aop;
	const size_t d = s->o.d, gq = (size_t)s->o.q_per_kv * d;
	int rc;
	struct lh *l = lh_of(s, layer, h);
	uint32_t n = l->n, w = n < s->o.window ? n : s->o.window;
	uint32_t hist = n - w;
	/* History views: every segment cut at n - window. */
	size_t ns = l->nsegs + 1;
	struct mkv_segment *kv = calloc(2 * ns, sizeof(*kv));
	const struct mkv_segment **kp = calloc(ns, sizeof(*kp));
	struct hseg **hp = calloc(ns, sizeof(*hp));
	size_t m = 0, nb = 0;
	rc = -ENOMEM;
	if (!kv || !kp || !hp)
		goto next;
	for (size_t i = 0; i <= l->nsegs; i++) {
		const struct mkv_segment *K = i < l->nsegs ? l->segs[i].k : l->ok;
		const struct mkv_segment *V = i < l->nsegs ? l->segs[i].v : l->ov;
		uint32_t start = i < l->nsegs ? l->segs[i].start : l->ostart;
		uint32_t len = K->v.n;
		if (start >= hist || len == 0)
			continue;
		uint32_t use = hist - start < len ? hist - start : len;
		seg_prefix(&kv[2 * m], K, use);
		seg_prefix(&kv[2 * m + 1], V, use);
		kp[m] = &kv[2 * m];
		hp[m] = i < l->nsegs ? &l->segs[i] : NULL;
		nb += kv[2 * m].v.n_blocks;
		m++;
	}
	{
		uint8_t *mask = malloc(nb ? nb : 1);
		struct attn_src *src = calloc(m ? m : 1, sizeof(*src));
		uint32_t *blocks = malloc(sizeof(uint32_t) * (nb ? nb : 1));
		struct blk_addr *ka = malloc(sizeof(*ka) * (nb ? nb : 1));
		struct blk_addr *va = malloc(sizeof(*va) * (nb ? nb : 1));
		struct mkv_fetch_req *req = calloc(2 * (m ? m : 1), sizeof(*req));
		struct mkv_block_addr *fa = malloc(sizeof(*fa) * 2 * (nb ? nb : 1));
		struct mkv_segment **full = calloc(2 * (m ? m : 1), sizeof(*full));
		const float *qh = q + h * gq;
		if (!mask || !src || !blocks || !ka || !va || !req || !fa || !full)
			goto inner;
		{
			/* Refined: the bound names the candidates here,
			 * attn_refine_sel keeps the budget below. */
			struct mkv_attn_opts o1 = ao;

			o1.token_frac = attn_stage1_frac(&ao);
			/* 8-bit scores on final segments alone, as on the device */
			uint8_t *use8 = calloc(m ? m : 1, 1);
			if (!use8) {
				rc = -ENOMEM;
				goto inner;
			}
			for (size_t i = 0; i < m; i++)
				use8[i] = hp[i] && hp[i]->final && seq_sum8_ok(kp[i]->v.summary_channels);
			rc = attn_select8(&o1, qh, kp, m, mask, use8);
			free(use8);
			if (rc)
				goto inner;
		}
		l->npred = l->npblocks = 0;
		size_t ci = 0, wpos = 0, nreq = 0, nfetch = 0;
		for (size_t i = 0; i < m; i++) {
			const struct mkv_segment *K = &kv[2 * i], *V = &kv[2 * i + 1];
			src[i] = (struct attn_src){.k = K, .v = V, .blocks = blocks + wpos,
						   .kaddr = ka + wpos, .vaddr = va + wpos};
			for (uint32_t j = 0; j < K->v.n_blocks; j++, ci++)
				if (mask[ci])
					blocks[wpos + src[i].n_sel++] = j;
			if (src[i].n_sel && hp[i] && hp[i]->final)
				pred_record(l, hp[i]->id, src[i].blocks, src[i].n_sel);
			if (src[i].n_sel && hp[i] && hp[i]->final && !host_read) {
				struct mkv_seg_key kk = seg_key(s, layer, h, hp[i]->id, MKV_KIND_KEY);
				struct mkv_seg_key vk = seg_key(s, layer, h, hp[i]->id, MKV_KIND_VALUE);
				if ((rc = mkv_store_get_segment(s->store, &kk, &full[2 * i])) ||
				    (rc = mkv_store_get_segment(s->store, &vk, &full[2 * i + 1])))
					goto inner;
				for (uint32_t bi = 0; bi < src[i].n_sel; bi++) {
					ka[wpos + bi] = seg_block_addr(full[2 * i], src[i].blocks[bi]);
					va[wpos + bi] = seg_block_addr(full[2 * i + 1], src[i].blocks[bi]);
				}
			} else if (src[i].n_sel && hp[i] && hp[i]->final) {
				req[nreq++] = (struct mkv_fetch_req){
					.key = seg_key(s, layer, h, hp[i]->id, MKV_KIND_KEY),
					.blocks = src[i].blocks, .n_blocks = src[i].n_sel};
				req[nreq++] = (struct mkv_fetch_req){
					.key = seg_key(s, layer, h, hp[i]->id, MKV_KIND_VALUE),
					.blocks = src[i].blocks, .n_blocks = src[i].n_sel};
				nfetch += 2 * src[i].n_sel;
			} else {
				for (uint32_t bi = 0; bi < src[i].n_sel; bi++) {
					ka[wpos + bi] = seg_block_addr(K, src[i].blocks[bi]);
					va[wpos + bi] = seg_block_addr(V, src[i].blocks[bi]);
				}
			}
			wpos += src[i].n_sel;
		}
		if (nreq) {
			int64_t f = mkv_store_fetch(fc, req, nreq, s->step, fa);
			if (f < 0) {
				rc = (int)f;
				goto inner;
			}
			/* Map the fetched addresses back, request order. */
			size_t fi = 0;
			for (size_t i = 0; i < m; i++) {
				if (!(src[i].n_sel && hp[i] && hp[i]->final && host_read))
					continue;
				struct blk_addr *kd = (struct blk_addr *)src[i].kaddr;
				struct blk_addr *vd = (struct blk_addr *)src[i].vaddr;
				for (uint32_t bi = 0; bi < src[i].n_sel; bi++, fi++) {
					kd[bi] = (struct blk_addr){fa[fi].values, fa[fi].bitmaps};
					if (fa[fi].tier != MKV_TIER_HBM)
						*fetch_bytes += fa[fi].values_bytes + fa[fi].bitmaps_bytes;
				}
				for (uint32_t bi = 0; bi < src[i].n_sel; bi++, fi++) {
					vd[bi] = (struct blk_addr){fa[fi].values, fa[fi].bitmaps};
					if (fa[fi].tier != MKV_TIER_HBM)
						*fetch_bytes += fa[fi].values_bytes + fa[fi].bitmaps_bytes;
				}
			}
			(void)nfetch;
		}
		/* The dense window from the raw copies. */
		struct mkv_dense_kv win = {
			.k = l->rawk + (size_t)(hist - l->raw_start) * d,
			.v = l->rawv + (size_t)(hist - l->raw_start) * d,
			.dtype = MKV_DTYPE_F32, .n = w};
		struct mkv_attn_stats ast = {0};
		float *ksc = NULL;
		rc = attn_refine_sel(&ao, qh, src, m, &ksc);
		if (!rc) {
			rc = attend_blocks(&ao, qh, src, m, w ? &win : NULL,
					   out + h * gq, &ast);
			*attend_bytes += ast.bytes_read;
		}
		free(ksc);
		if (nreq)
			mkv_fetch_release(fc);
inner:
		for (size_t i = 0; full && i < 2 * m; i++)
			mkv_segment_destroy(full[i]);
		free(full);
		free(mask);
		free(src);
		free(blocks);
		free(ka);
		free(va);
		free(req);
		free(fa);
	}
next:
	free(kv);
	free(kp);
	free(hp);
	return rc;
}

/*
 * The head pool: with attend_threads > 1, that many threads less one (the
 * caller is the last) take KV heads from a shared counter and run one
 * call's function on each: the CPU path's attends (attend_head), each
 * helper with its own fetch context (a context serves one thread at a
 * time, and its pins last until its next fetch), and appends' per-head
 * work (append_head: the open segment's encoding of the token and its raw
 * copy).  Either reads the sequence and writes only that head's state and
 * output rows, so the heads need no other coordination.  The caller waits
 * for all before it returns, so nothing of a call outlives it.
 */
struct attend_pool {
	pthread_t *th;
	struct mkv_fetch **f;   /* per helper */
	unsigned n;             /* helpers started */
	pthread_mutex_t mu;
	pthread_cond_t go, done;
	uint64_t gen;           /* bumped per call */
	int stop;
	/* the call in progress (set under mu before go, read by helpers
	 * after it; not changed until every helper is done with it) */
	head_fn fn;
	void *ctx;
	uint32_t heads;
	uint32_t next;          /* next head to take */
	unsigned busy;          /* helpers still in this call */
	int rc;                 /* first failure */
};

/* Take heads until none is left or one failed. */
static void pool_run(struct attend_pool *p, struct mkv_fetch *f)
{
	for (;;) {
		pthread_mutex_lock(&p->mu);
		uint32_t h = p->rc ? UINT32_MAX : p->next++;
		pthread_mutex_unlock(&p->mu);
		if (h >= p->heads)
			break;
		int rc = p->fn(p->ctx, h, f);
		if (rc) {
			pthread_mutex_lock(&p->mu);
			if (!p->rc)
				p->rc = rc;
			pthread_mutex_unlock(&p->mu);
			break;
		}
	}
}

/* @fn on heads [0, @heads), shared by the caller (fetch context @f) and
 * the helpers; the first failure, after every head taken is done. */
static int pool_call(struct attend_pool *p, head_fn fn, void *ctx, uint32_t heads,
		     struct mkv_fetch *f)
{
	pthread_mutex_lock(&p->mu);
	p->fn = fn;
	p->ctx = ctx;
	p->heads = heads;
	p->next = 0;
	p->rc = 0;
	p->busy = p->n;
	p->gen++;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	pool_run(p, f);
	pthread_mutex_lock(&p->mu);
	while (p->busy)
		pthread_cond_wait(&p->done, &p->mu);
	int rc = p->rc;
	pthread_mutex_unlock(&p->mu);
	return rc;
}

struct pool_arg {
	struct attend_pool *p;
	unsigned i;
};

static void *pool_main(void *arg)
{
	struct attend_pool *p = ((struct pool_arg *)arg)->p;
	unsigned i = ((struct pool_arg *)arg)->i;
	uint64_t seen = 0;

	free(arg);
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->stop && p->gen == seen)
			pthread_cond_wait(&p->go, &p->mu);
		if (p->stop)
			break;
		seen = p->gen;
		pthread_mutex_unlock(&p->mu);
		pool_run(p, p->f[i]);
		pthread_mutex_lock(&p->mu);
		if (--p->busy == 0)
			pthread_cond_broadcast(&p->done);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static void pool_destroy(struct attend_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_broadcast(&p->go);
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < p->n; i++)
		pthread_join(p->th[i], NULL);
	for (unsigned i = 0; p->f && i < p->n + 1; i++)
		mkv_fetch_destroy(p->f[i]);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->go);
	pthread_cond_destroy(&p->done);
	free(p->th);
	free(p->f);
	free(p);
}

/* @nt - 1 helpers, each with a fetch context of @staging bytes.  Returns
 * 0 or -errno (nothing left running). */
static int pool_create(struct mkv_store *store, unsigned nt, size_t staging,
		       struct attend_pool **out)
{
	struct attend_pool *p = calloc(1, sizeof(*p));
	int rc = -ENOMEM;

	if (!p)
		return rc;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->go, NULL);
	pthread_cond_init(&p->done, NULL);
	p->th = calloc(nt, sizeof(*p->th));
	p->f = calloc(nt, sizeof(*p->f));
	if (!p->th || !p->f)
		goto fail;
	for (unsigned i = 0; i + 1 < nt; i++) {
		rc = mkv_fetch_create(store, staging, &p->f[i]);
		if (rc)
			goto fail;
		struct pool_arg *a = malloc(sizeof(*a));
		rc = -ENOMEM;
		if (!a)
			goto fail;
		*a = (struct pool_arg){p, i};
		if (pthread_create(&p->th[i], NULL, pool_main, a)) {
			free(a);
			rc = -EAGAIN;
			goto fail;
		}
		p->n++;
	}
	*out = p;
	return 0;
fail:
	/* started helpers have their contexts at [0, n); a context made for
	 * a helper that did not start sits at [n] */
	pool_destroy(p);
	return rc;
}

/* One CPU-path attend on the pool (attend_head per head). */
struct attend_call {
	struct mkv_seq *s;
	uint32_t layer;
	const struct mkv_attn_opts *ao;
	const float *q;
	float *out;
	bool host_read;
	uint64_t fetch_bytes, attend_bytes; /* atomic */
};

static int attend_fn(void *ctx, uint32_t h, struct mkv_fetch *f)
{
	struct attend_call *c = ctx;
	uint64_t fb = 0, ab = 0;
	int rc = attend_head(c->s, c->layer, h, c->ao, c->q, c->out, f, c->host_read, &fb, &ab);
	__atomic_fetch_add(&c->fetch_bytes, fb, __ATOMIC_RELAXED);
	__atomic_fetch_add(&c->attend_bytes, ab, __ATOMIC_RELAXED);
	return rc;
}

/* Every KV head of @layer on the CPU path: on the caller alone, or shared
 * with the pool's helpers. */
static int attend_heads(struct mkv_seq *s, uint32_t layer, const struct mkv_attn_opts *ao,
			const float *q, float *out, bool host_read, uint64_t *fetch_bytes,
			uint64_t *attend_bytes)
{
	struct attend_call c = {s, layer, ao, q, out, host_read, 0, 0};
	int rc = 0;
	if (s->pool && s->o.kv_heads > 1)
		rc = pool_call(s->pool, attend_fn, &c, s->o.kv_heads, s->fetch);
	else
		for (uint32_t h = 0; h < s->o.kv_heads && rc == 0; h++)
			rc = attend_fn(&c, h, s->fetch);
	*fetch_bytes += c.fetch_bytes;
	*attend_bytes += c.attend_bytes;
	return rc;
}

int mkv_seq_attend(struct mkv_seq *s, uint32_t layer, const float *q,
		   float *out, void *stream)
{
	if (!s || !q || !out || layer >= s->o.layers)
		return -EINVAL;
	struct mkv_attn_opts ao;
	mkv_attn_opts_init(&ao, sizeof ao);
	ao.n_q = s->o.q_per_kv;
	ao.d = s->o.d;
	ao.token_frac = s->o.token_frac;
	ao.refine = s->o.refine;
	ao.summary_bits = s->o.summary_bits;
	int rc = attn_check(&ao, q);
	if (rc)
		return rc;
	if (!lh_of(s, layer, 0)->n)
		return -EINVAL;
	apply_done(s);
	s->step++;
	if (stream && s->gpu && attn_refine(&ao) <= 1.0)
		return seqgpu_attend_host(s, layer, q, out, stream);
	uint64_t fetch_bytes = 0, attend_bytes = 0;
	/* With the store's HBM on a device, fetched blocks come back as device
	 * addresses, which this CPU path cannot read: it then reads the
	 * stored segments it selected from back whole (mkv_store_get_segment
	 * copies them to the host). */
	const bool host_read = store_device(s->store) < 0;
	rc = attend_heads(s, layer, &ao, q, out, host_read, &fetch_bytes, &attend_bytes);
	s->st.fetch_bytes_last = fetch_bytes;
	s->st.fetch_bytes_total += fetch_bytes;
	s->st.attend_bytes_last = attend_bytes;
	return rc;
}

int mkv_seq_attend_dev(struct mkv_seq *s, uint32_t layer, const float *q,
		       float *out, void *stream)
{
	if (!s || !q || !out || layer >= s->o.layers)
		return -EINVAL;
	if (!s->gpu)
		return -MKV_ENODEV;
	if (!lh_of(s, layer, 0)->n || s->o.refine > 1.0)
		return -EINVAL;
	apply_done(s);
	s->step++;
	return seqgpu_attend(s, layer, q, out, stream);
}

/* ---------------------------------------------------------------------- */
/* Offload and prefetch: store operations the sequence waits for in sync
 * and close (tier_ops), their failures counted in the stats. */

static void tier_op_done(struct mkv_seq *s, uint64_t *failed, int status)
{
	pthread_mutex_lock(&s->lock);
	if (status)
		(*failed)++;
	s->tier_ops--;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

static void offload_cb(void *arg, int status)
{
	struct mkv_seq *s = arg;
	/* The segment was removed, or got there by another way: no failure. */
	if (status == -ENOENT || status == -EALREADY)
		status = 0;
	tier_op_done(s, &s->st.offload_failed, status);
}

static void prefetch_cb(void *arg, int status)
{
	struct mkv_seq *s = arg;
	tier_op_done(s, &s->st.prefetch_failed, status);
}

static void tier_op_begin(struct mkv_seq *s)
{
	pthread_mutex_lock(&s->lock);
	s->tier_ops++;
	pthread_mutex_unlock(&s->lock);
}

int mkv_seq_offload(struct mkv_seq *s, uint32_t layer)
{
	if (!s || layer >= s->o.layers)
		return -EINVAL;
	struct mkv_store_stats ss = {.size = sizeof ss};
	if (mkv_store_get_stats(s->store, &ss) || ss.tier[MKV_TIER_HOST].capacity == 0)
		return -EINVAL;
	apply_done(s);
	int moved = 0;
	for (uint32_t h = 0; h < s->o.kv_heads; h++) {
		struct lh *l = lh_of(s, layer, h);
		for (size_t i = 0; i < l->nsegs; i++) {
			if (!l->segs[i].final)
				continue;
			for (int kind = MKV_KIND_KEY; kind <= MKV_KIND_VALUE; kind++) {
				struct mkv_seg_key k = seg_key(s, layer, h, l->segs[i].id,
							       (enum mkv_kind)kind);
				struct mkv_seg_info info;
				if (mkv_store_info(s->store, &k, &info) ||
				    info.tier != MKV_TIER_HBM || info.state != MKV_SEG_RESIDENT ||
				    info.pins)
					continue;
				tier_op_begin(s);
				int rc = mkv_store_move(s->store, &k, MKV_TIER_HOST, offload_cb, s);
				if (rc) {
					/* never submitted: no callback will come */
					tier_op_done(s, &s->st.offload_failed,
						     rc == -EBUSY || rc == -EALREADY ||
						     rc == -ENOENT ? 0 : rc);
					if (rc == -ENOMEM)
						return moved ? moved : rc;
					continue;
				}
				moved++;
			}
		}
	}
	pthread_mutex_lock(&s->lock);
	s->st.offload_moves += (uint64_t)moved;
	pthread_mutex_unlock(&s->lock);
	return moved;
}

int mkv_seq_prefetch(struct mkv_seq *s, uint32_t layer)
{
	if (!s || layer >= s->o.layers)
		return -EINVAL;
	int asked = 0;
	for (uint32_t h = 0; h < s->o.kv_heads; h++) {
		struct lh *l = lh_of(s, layer, h);
		if (!l->npred)
			continue;
		struct mkv_fetch_req *req = calloc(2 * l->npred, sizeof(*req));
		if (!req)
			return asked ? asked : -ENOMEM;
		size_t off = 0, nb = 0;
		for (size_t i = 0; i < l->npred; i++) {
			for (int kind = MKV_KIND_KEY; kind <= MKV_KIND_VALUE; kind++)
				req[2 * i + (size_t)kind] = (struct mkv_fetch_req){
					.key = seg_key(s, layer, h, l->pred_id[i], (enum mkv_kind)kind),
					.blocks = l->pred_blocks + off, .n_blocks = l->pred_n[i]};
			off += l->pred_n[i];
			nb += 2 * (size_t)l->pred_n[i];
		}
		tier_op_begin(s);
		/* The store copies the requests; the next attend is step + 1. */
		int rc = mkv_store_prefetch(s->store, req, 2 * l->npred, s->step + 1,
					    prefetch_cb, s);
		free(req);
		if (rc) {
			tier_op_done(s, &s->st.prefetch_failed, rc);
			if (rc == -ENOMEM)
				return asked ? asked : rc;
			continue;
		}
		asked += (int)nb;
	}
	pthread_mutex_lock(&s->lock);
	s->st.prefetch_blocks += (uint64_t)asked;
	pthread_mutex_unlock(&s->lock);
	return asked;
}

/* ---------------------------------------------------------------------- */

int mkv_seq_flush(struct mkv_seq *s, uint32_t layer)
{
	if (!s || (layer != UINT32_MAX && layer >= s->o.layers))
		return -EINVAL;
	apply_done(s);
	int first = 0;
	for (uint32_t ly = 0; ly < s->o.layers; ly++) {
		if (layer != UINT32_MAX && ly != layer)
			continue;
		for (uint32_t h = 0; h < s->o.kv_heads; h++) {
			struct lh *l = lh_of(s, ly, h);
			/* Retry failed finalizations, then close the open one. */
			for (size_t i = 0; i < l->nsegs; i++)
				if (!l->segs[i].final && !l->segs[i].queued) {
					int rc = finalize(s, l, ly, h, &l->segs[i], false);
					if (rc && !first)
						first = rc;
				}
			int rc = close_open(s, l, ly, h, false);
			if (rc && !first)
				first = rc;
		}
	}
	lag_update(s);
	return first;
}

int mkv_seq_sync(struct mkv_seq *s)
{
	if (!s)
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	while (s->inflight || s->tier_ops)
		pthread_cond_wait(&s->cond, &s->lock);
	pthread_mutex_unlock(&s->lock);
	apply_done(s);
	return 0;
}

/* Version 1 of the stats ended at device_attends. */
#define SEQ_STATS_V1 (offsetof(struct mkv_seq_stats, device_attends) + sizeof(uint64_t))

int mkv_seq_get_stats(struct mkv_seq *s, struct mkv_seq_stats *out)
{
	if (!s || !out || !mkv_opts_size_ok(out->size, SEQ_STATS_V1, sizeof(*out)))
		return -EINVAL;
	size_t size = out->size;
	struct mkv_seq_stats full, *st = &full;
	lag_update(s);
	uint64_t fin = 0, pend = 0;
	for (size_t i = 0; i < (size_t)s->o.layers * s->o.kv_heads; i++)
		for (size_t j = 0; j < s->lh[i].nsegs; j++) {
			if (s->lh[i].segs[j].final)
				fin++;
			else
				pend++;
		}
	pthread_mutex_lock(&s->lock);
	*st = s->st;
	st->queue_depth = s->inflight;
	pthread_mutex_unlock(&s->lock);
	st->size = sizeof(*st);
	st->segments_final = fin;
	st->segments_pending = pend;
	st->on_device = s->gpu != NULL;
	st->device_bytes = seqgpu_bytes(s->gpu);
	st->device_upload_failed = seqgpu_upload_failed(s->gpu);
	seqgpu_order_counts(s->gpu, &st->device_ordered, &st->device_unordered);
	st->size = size;
	memcpy(out, st, size);
	return 0;
}

int mkv_seq_close(struct mkv_seq *s)
{
	if (!s)
		return 0;
	mkv_seq_sync(s);
	int first = 0;
	for (uint32_t ly = 0; ly < s->o.layers; ly++)
		for (uint32_t h = 0; h < s->o.kv_heads; h++) {
			struct lh *l = lh_of(s, ly, h);
			for (size_t i = 0; i < l->nsegs; i++) {
				if (!l->segs[i].final)
					continue;
				struct mkv_seg_key kk = seg_key(s, ly, h, l->segs[i].id, MKV_KIND_KEY);
				struct mkv_seg_key vk = seg_key(s, ly, h, l->segs[i].id, MKV_KIND_VALUE);
				int rc = mkv_store_remove(s->store, &kk);
				if (rc && !first)
					first = rc;
				rc = mkv_store_remove(s->store, &vk);
				if (rc && !first)
					first = rc;
			}
			lh_drop_dev(s, l, true);
			lh_free(l);
		}
	/* Waits for the last device attend before freeing its copies. */
	seqgpu_destroy(s->gpu);
	pool_destroy(s->pool);
	mkv_fetch_destroy(s->fetch);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	free(s->lh);
	free(s);
	return first;
}
