/* SPDX-License-Identifier: MIT */
/*
 * mosaickv/store.c — the tiered segment store: directory, placement, moves,
 * fetch, prefetch, reopen.  It asks policy/ and commands tiers/.
 *
 * Locking: one mutex, s->lock, guards the directory (hash table), every
 * descriptor, the hot-block cache bookkeeping, the job queue and the
 * counters.  It is never held across a tier's data operation (put, get,
 * gather, or an NVMe drop); tiers have their own leaf locks and never call
 * back.  So the order is s->lock -> (tier-internal locks), nothing else.
 *
 * Descriptor life: a segment is created by put (invisible until its first
 * copy is verified: `ready`) or by reopen, and freed by remove.  Remove
 * refuses (-EBUSY) while the segment is pinned, moving, or being read
 * (`readers`), so a pointer taken under the lock with readers++ or pins++
 * stays valid after the lock is dropped.
 *
 * Moves: the source copy stays the committed one (seg->obj) until the
 * destination copy is complete, durable and verified by read-back hash;
 * the commit then waits for in-flight readers of the source to finish,
 * swaps the pointer, and only then drops the source.  A pin that arrives
 * during a move aborts it at the commit (status -EBUSY).
 */
#include <mosaickv/store.h>

#include <errno.h>
#include <numa.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <xxhash.h>

#include "io/uring.h"
#include "mkv_config.h"
#include "mosaickv/packpool.h"
#include "mosaickv/store_internal.h"
#include "policy/policy.h"
#include "tiers/tcuda.h"
#include "tiers/tier.h"

#if MKV_HAVE_CUDA
#include "gpu/gather.cuh"
#endif

#define STORE_MAX_WORKERS 64
#define LAYOUT_TAG 0x4C590001u /* shape[7]: "LY" v1 */

struct seg {
	struct seg *next; /* hash chain */
	struct mkv_seg_key key;
	int ready;        /* first copy verified (put) */
	int tier;
	struct tier_obj *obj;
	enum mkv_seg_state state;
	uint32_t pins;
	uint32_t readers;
	uint64_t len, hash;
	struct mkv_store_layout layout;
	struct policy_stats st;
	struct policy_stats *bst;  /* per block, n_blocks (NULL: no layout) */
	struct tier_obj **hot;     /* per block HBM copy or NULL (lazy) */
	uint32_t n_hot;
};

enum job_kind { JOB_MOVE, JOB_BALANCE, JOB_PREFETCH, JOB_CALL };

struct job {
	struct job *next;
	enum job_kind kind;
	mkv_store_cb cb;
	void *arg;
	struct seg *seg; /* MOVE: reserved (state set) at submit */
	int dst;
	struct mkv_fetch_req *reqs; /* PREFETCH: deep copies */
	size_t n;
	uint64_t step;
	void (*fn)(void *arg); /* CALL: run on a worker, no callback */
};

struct worker {
	struct mkv_store *s;
	pthread_t th;
	struct tier_io io;
	int started;
};

struct store_counters {
	uint64_t moves_done, moves_failed;
	uint64_t move_errors[MKV_TIER_COUNT][MKV_TIER_COUNT];
	uint64_t verify_failures;
	int64_t last_error;
	uint64_t balances, fetches, fetch_blocks, fetch_blocks_staged;
	uint64_t hot_admitted, hot_evicted;
	uint64_t reopen_adopted, reopen_corrupt, reopen_incomplete;
	uint64_t segments[MKV_TIER_COUNT];
	uint64_t move_batches;
	uint64_t balance_skipped;
};

struct mkv_store {
	struct tier *tiers[MKV_TIER_COUNT];
	int gpu;        /* device of HBM, -1 when HBM is host memory */
	int host_mapped; /* fetches return host-tier blocks as mapped memory */
	unsigned fetch_threads, fetch_spin_us; /* per fetch context */
	double fetch_kernel_share;
	int numa_node;
	struct policy pol;
	int auto_balance;

	pthread_mutex_t lock;
	pthread_cond_t cond;   /* readers drop to 0, jobs finish */
	pthread_cond_t q_cond; /* work for the workers */
	struct seg **buckets;
	size_t n_buckets, n_segs;
	uint64_t step;         /* latest decode step seen */
	size_t hot_budget, hot_used, hot_blocks;
	size_t incoming[MKV_TIER_COUNT]; /* reserved by puts/moves in flight */
	struct store_counters c;

	struct job *q_head, *q_tail;
	unsigned pending;      /* queued + running jobs */
	int balance_queued;
	int stopping;
	int paused;            /* test hook: workers take no job (store_pause) */
	struct worker *workers;
	unsigned n_workers;
};

/* ---------------------------------------------------------------------- */
/* Directory                                                               */

static uint64_t key_hash(const struct mkv_seg_key *k)
{
	return XXH3_64bits(k, sizeof *k);
}

static bool key_eq(const struct mkv_seg_key *a, const struct mkv_seg_key *b)
{
	return a->seq == b->seq && a->layer == b->layer && a->head == b->head &&
	       a->seg == b->seg && a->kind == b->kind;
}

/* Under s->lock.  @any: also segments not yet ready. */
static struct seg *dir_find(struct mkv_store *s, const struct mkv_seg_key *k,
			    bool any)
{
	struct seg *g = s->buckets[key_hash(k) & (s->n_buckets - 1)];

	for (; g; g = g->next)
		if (key_eq(&g->key, k))
			return (g->ready || any) ? g : NULL;
	return NULL;
}

static int dir_grow(struct mkv_store *s)
{
	size_t nb = s->n_buckets * 2;
	struct seg **b = calloc(nb, sizeof *b);

	if (!b)
		return -ENOMEM;
	for (size_t i = 0; i < s->n_buckets; i++) {
		struct seg *g = s->buckets[i], *nx;

		for (; g; g = nx) {
			size_t h = key_hash(&g->key) & (nb - 1);

			nx = g->next;
			g->next = b[h];
			b[h] = g;
		}
	}
	free(s->buckets);
	s->buckets = b;
	s->n_buckets = nb;
	return 0;
}

/* Under s->lock. */
static int dir_insert(struct mkv_store *s, struct seg *g)
{
	size_t h;

	if (s->n_segs + 1 > s->n_buckets && dir_grow(s))
		return -ENOMEM;
	h = key_hash(&g->key) & (s->n_buckets - 1);
	g->next = s->buckets[h];
	s->buckets[h] = g;
	s->n_segs++;
	return 0;
}

/* Under s->lock. */
static void dir_unlink(struct mkv_store *s, struct seg *g)
{
	struct seg **pp = &s->buckets[key_hash(&g->key) & (s->n_buckets - 1)];

	for (; *pp; pp = &(*pp)->next) {
		if (*pp == g) {
			*pp = g->next;
			s->n_segs--;
			return;
		}
	}
}

static void seg_free(struct seg *g)
{
	if (!g)
		return;
	free(g->bst);
	free(g->hot);
	free(g);
}

static struct seg *seg_new(const struct mkv_seg_key *k,
			   const struct mkv_store_layout *lay)
{
	struct seg *g = calloc(1, sizeof *g);

	if (!g)
		return NULL;
	g->key = *k;
	if (lay && lay->n_blocks) {
		g->layout = *lay;
		g->bst = calloc(lay->n_blocks, sizeof *g->bst);
		if (!g->bst) {
			free(g);
			return NULL;
		}
	}
	return g;
}

static void layout_to_shape(const struct mkv_store_layout *l, uint32_t *sh)
{
	memset(sh, 0, SEGFILE_SHAPE_WORDS * sizeof *sh);
	if (!l || !l->n_blocks)
		return;
	sh[0] = l->n_blocks;
	sh[1] = (uint32_t)l->values_off;
	sh[2] = (uint32_t)l->values_block;
	sh[3] = (uint32_t)l->values_len;
	sh[4] = (uint32_t)l->bitmaps_off;
	sh[5] = (uint32_t)l->bitmaps_block;
	sh[6] = (uint32_t)l->bitmaps_len;
	sh[7] = LAYOUT_TAG;
}

static bool layout_valid(const struct mkv_store_layout *l, uint64_t len)
{
	if (!l || l->n_blocks == 0)
		return true;
	if (l->values_block == 0 || l->bitmaps_block == 0 ||
	    l->values_off > len || l->values_len > len - l->values_off ||
	    l->bitmaps_off > len || l->bitmaps_len > len - l->bitmaps_off)
		return false;
	/* Every block must have bytes: n_blocks blocks of the given size. */
	return (l->values_len + l->values_block - 1) / l->values_block ==
		       l->n_blocks &&
	       (l->bitmaps_len + l->bitmaps_block - 1) / l->bitmaps_block ==
		       l->n_blocks;
}

static void shape_to_layout(const uint32_t *sh, uint64_t len,
			    struct mkv_store_layout *l)
{
	memset(l, 0, sizeof *l);
	if (sh[7] != LAYOUT_TAG)
		return;
	l->n_blocks = sh[0];
	l->values_off = sh[1];
	l->values_block = sh[2];
	l->values_len = sh[3];
	l->bitmaps_off = sh[4];
	l->bitmaps_block = sh[5];
	l->bitmaps_len = sh[6];
	if (!layout_valid(l, len))
		memset(l, 0, sizeof *l);
}

/* Block j's two ranges within the payload. */
static void block_ranges(const struct mkv_store_layout *l, uint32_t j,
			 struct tier_range r[2])
{
	uint64_t vo = j * l->values_block, bo = j * l->bitmaps_block;

	r[0].off = l->values_off + vo;
	r[0].len = l->values_len - vo < l->values_block ? l->values_len - vo
							: l->values_block;
	r[1].off = l->bitmaps_off + bo;
	r[1].len = l->bitmaps_len - bo < l->bitmaps_block ? l->bitmaps_len - bo
							  : l->bitmaps_block;
}

static void count_error(struct mkv_store *s, int from, int to, int err)
{
	s->c.moves_failed++;
	if (from >= 0 && to >= 0)
		s->c.move_errors[from][to]++;
	s->c.last_error = err;
}

/* Capacity the placement may fill in tier @t (HBM minus the hot cache). */
static size_t place_capacity(const struct mkv_store *s, int t)
{
	size_t cap = s->tiers[t]->capacity;

	if (t == MKV_TIER_HBM)
		cap = cap > s->hot_budget ? cap - s->hot_budget : 0;
	return cap;
}

/* Upper bound of the footprint of @len payload bytes in any tier (size
 * classes waste < 25%, frames add a header and padding). */
static size_t footprint_bound(uint64_t len)
{
	return (size_t)(len + len / 4 + 2 * SEGFILE_ALIGN);
}

static bool is_bottom(const struct mkv_store *s, int t)
{
	for (int u = t + 1; u < MKV_TIER_COUNT; u++)
		if (s->tiers[u])
			return false;
	return true;
}

/*
 * Under s->lock: reserve room for @len bytes in tier @t within its high
 * watermark (the bottom tier has no watermark to keep: its capacity is
 * enforced by the tier itself).  The watermark is a hard bound: puts and
 * moves in flight hold reservations, so concurrent ones cannot overshoot
 * together.  Returns false if it does not fit.
 */
static bool reserve_locked(struct mkv_store *s, int t, uint64_t len)
{
	size_t b = footprint_bound(len), used = tier_used(s->tiers[t]);

	if (t == MKV_TIER_HBM)
		used = used > s->hot_used ? used - s->hot_used : 0;
	if (!is_bottom(s, t) &&
	    used + s->incoming[t] + b >
		    policy_high_bytes(&s->pol, t, place_capacity(s, t)))
		return false;
	s->incoming[t] += b;
	return true;
}

static void unreserve_locked(struct mkv_store *s, int t, uint64_t len)
{
	s->incoming[t] -= footprint_bound(len);
}

/* ---------------------------------------------------------------------- */
/* Copies with verification                                                */

/*
 * Read @o's whole payload from tier @t into a new buffer and check it
 * against @len/@hash.  Returns 0 with *bufp (caller frees), or -errno
 * (-MKV_ECORRUPT: wrong bytes; -EIO: short).
 */
static int read_verified(struct tier *t, struct tier_io *io,
			 struct tier_obj *o, uint64_t len, uint64_t hash,
			 void **bufp)
{
	char *buf = malloc(len ? len : 1);
	int64_t r;

	if (!buf)
		return -ENOMEM;
	r = tier_get(t, io, o, buf, len);
	if (r >= 0 && (uint64_t)r != len)
		r = -EIO;
	if (r >= 0 && XXH3_64bits(buf, len) != hash)
		r = -MKV_ECORRUPT;
	if (r < 0) {
		free(buf);
		return (int)r;
	}
	*bufp = buf;
	return 0;
}

/*
 * Put @src (@len bytes, hash @hash) into tier @t and verify the copy by
 * reading it back.  Returns 0 with *out, or -errno with nothing left
 * behind.  *@verify_failed is set when the put succeeded but the copy was
 * wrong.
 */
static void seg_meta(const struct seg *g, struct tier_meta *m);

static int put_verified(struct tier *t, struct tier_io *io,
			const struct seg *g, const void *src,
			struct tier_obj **out, int *verify_failed)
{
	struct tier_meta m;
	struct tier_obj *o = NULL;
	void *back = NULL;
	int rc;

	seg_meta(g, &m);
	rc = tier_put(t, io, &m, src, &o);
	if (rc)
		return rc;
	rc = read_verified(t, io, o, g->len, g->hash, &back);
	if (rc) {
		*verify_failed = 1;
		tier_drop(t, io, o);
		return rc;
	}
	free(back);
	*out = o;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Moves                                                                   */

static void hot_drop_all_locked(struct mkv_store *s, struct seg *g,
				struct tier_obj ***dropped, uint32_t *nd);

/* A segment's tier descriptor. */
static void seg_meta(const struct seg *g, struct tier_meta *m)
{
	memset(m, 0, sizeof *m);
	m->key.seq = g->key.seq;
	m->key.layer = g->key.layer;
	m->key.head = g->key.head;
	m->key.seg = g->key.seg;
	m->key.kind = g->key.kind;
	layout_to_shape(&g->layout, m->shape);
	m->len = g->len;
	m->hash = g->hash;
}

/* Moves in one batch at most (NVMe: one putv, its frames' writes in
 * flight together, then one group-commit fdatasync per slab). */
#define MOVE_BATCH 32

struct move_item {
	int src;
	struct tier_obj *sobj, *nobj;
	void *buf;           /* source bytes read back, when not in place */
	const void *data;
	int active, vfail;
	struct tier_obj **hot;
	uint32_t n_hot;
};

/*
 * Move @n segments (each already set MOVING_* by the caller, under the
 * lock) to tier @dst as one batch: sources read (in place for host
 * memory, else read back and checked against the hash), one batched put
 * below (tier_putv: for NVMe every frame's writes in flight together and
 * one shared fdatasync per slab written), one batched read-back
 * (tier_getv) whose bytes must match the hash, then per segment the
 * commit (waiting out readers of the source) and only then the source's
 * drop.  rcs[i] gets each segment's
 * 0 or -errno; every segment ends RESIDENT, in @dst on success and where
 * it was otherwise, except for a balance (@from_balance) the ones that
 * found @dst at its high watermark: -EAGAIN, left reserved (MOVING_*) for
 * the balance to retry or release.  Returns the first error (not -EAGAIN).
 */
static int do_move_many(struct mkv_store *s, struct tier_io *io,
			struct seg **g, unsigned n, int dst, bool from_balance,
			int *rcs)
{
	struct tier *td = s->tiers[dst];
	struct move_item *mv = calloc(n ? n : 1, sizeof *mv);
	struct tier_meta *meta = calloc(n ? n : 1, sizeof *meta);
	const void **srcs = calloc(n ? n : 1, sizeof *srcs);
	struct tier_obj **objs = calloc(n ? n : 1, sizeof *objs);
	void **bufs = calloc(n ? n : 1, sizeof *bufs);
	size_t *caps = calloc(n ? n : 1, sizeof *caps);
	int64_t *res = calloc(n ? n : 1, sizeof *res);
	int *prc = calloc(n ? n : 1, sizeof *prc);
	unsigned *idx = calloc(n ? n : 1, sizeof *idx), k = 0;
	int first = 0;

	if (!mv || !meta || !srcs || !objs || !bufs || !caps || !res || !prc ||
	    !idx) {
		pthread_mutex_lock(&s->lock);
		for (unsigned i = 0; i < n; i++) {
			g[i]->state = MKV_SEG_RESIDENT;
			rcs[i] = -ENOMEM;
			count_error(s, g[i]->tier, dst, -ENOMEM);
		}
		pthread_cond_broadcast(&s->cond);
		pthread_mutex_unlock(&s->lock);
		first = n ? -ENOMEM : 0;
		goto out;
	}

	pthread_mutex_lock(&s->lock);
	for (unsigned i = 0; i < n; i++) {
		mv[i].src = g[i]->tier;
		mv[i].sobj = g[i]->obj;
		rcs[i] = 0;
		if (!reserve_locked(s, dst, g[i]->len)) {
			/* The destination is at its high watermark: the move
			 * would break it.  A balance gets -EAGAIN with the
			 * segment still reserved (MOVING_*), to retry it once
			 * its other moves are done, or release it. */
			if (from_balance) {
				rcs[i] = -EAGAIN;
				continue;
			}
			g[i]->state = MKV_SEG_RESIDENT;
			count_error(s, mv[i].src, dst, -ENOSPC);
			rcs[i] = -ENOSPC;
			continue;
		}
		g[i]->readers++;
		mv[i].active = 1;
	}
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);

	/* Source bytes, then one batched put of everything readable. */
	for (unsigned i = 0; i < n; i++) {
		struct tier *ts = s->tiers[mv[i].src];

		if (!mv[i].active)
			continue;
		mv[i].data = !ts->device && mv[i].sobj->meta.len == g[i]->len
				     ? tier_addr(ts, mv[i].sobj) : NULL;
		if (!mv[i].data) {
			rcs[i] = read_verified(ts, io, mv[i].sobj, g[i]->len,
					       g[i]->hash, &mv[i].buf);
			mv[i].data = mv[i].buf;
		}
		if (rcs[i])
			continue;
		seg_meta(g[i], &meta[k]);
		srcs[k] = mv[i].data;
		idx[k++] = i;
	}
	if (k)
		tier_putv(td, io, meta, srcs, k, objs, prc);
	for (unsigned j = 0; j < k; j++) {
		if (prc[j])
			rcs[idx[j]] = prc[j];
		else
			mv[idx[j]].nobj = objs[j];
	}
	for (unsigned i = 0; i < n; i++) {
		free(mv[i].buf);
		mv[i].buf = NULL;
	}

	/* One batched read-back of every new copy: it must hash right. */
	k = 0;
	for (unsigned i = 0; i < n; i++) {
		if (!mv[i].nobj)
			continue;
		bufs[k] = malloc(g[i]->len);
		if (!bufs[k]) {
			rcs[i] = -ENOMEM;
			continue;
		}
		objs[k] = mv[i].nobj;
		caps[k] = g[i]->len;
		idx[k++] = i;
	}
	if (k)
		tier_getv(td, io, objs, bufs, caps, k, res);
	for (unsigned j = 0; j < k; j++) {
		unsigned i = idx[j];
		int64_t r = res[j];

		if (r >= 0 && (uint64_t)r != g[i]->len)
			r = -EIO;
		if (r >= 0 && XXH3_64bits(bufs[j], g[i]->len) != g[i]->hash)
			r = -MKV_ECORRUPT;
		if (r < 0) {
			rcs[i] = (int)r;
			mv[i].vfail = 1;
		}
		free(bufs[j]);
	}

	/* Commit, per segment. */
	pthread_mutex_lock(&s->lock);
	for (unsigned i = 0; i < n; i++) {
		if (!mv[i].active)
			continue;
		g[i]->readers--;
		unreserve_locked(s, dst, g[i]->len);
		if (rcs[i] == 0 && g[i]->pins)
			rcs[i] = -EBUSY; /* pinned meanwhile: keep that copy */
		if (rcs[i]) {
			if (mv[i].vfail)
				s->c.verify_failures++;
			count_error(s, mv[i].src, dst, rcs[i]);
			g[i]->state = MKV_SEG_RESIDENT;
			continue;
		}
		while (g[i]->readers)
			pthread_cond_wait(&s->cond, &s->lock);
		g[i]->obj = mv[i].nobj;
		g[i]->tier = dst;
		g[i]->state = MKV_SEG_RESIDENT;
		s->c.segments[mv[i].src]--;
		s->c.segments[dst]++;
		s->c.moves_done++;
		if (dst == MKV_TIER_HBM) /* a whole copy now: no hot blocks */
			hot_drop_all_locked(s, g[i], &mv[i].hot, &mv[i].n_hot);
	}
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);

	/* Drops outside the lock: failed new copies, replaced sources. */
	for (unsigned i = 0; i < n; i++) {
		if (!mv[i].active)
			goto next;
		if (rcs[i]) {
			if (mv[i].nobj)
				tier_drop(td, io, mv[i].nobj);
		} else {
			tier_drop(s->tiers[mv[i].src], io, mv[i].sobj);
			for (uint32_t h = 0; h < mv[i].n_hot; h++)
				tier_drop(s->tiers[MKV_TIER_HBM], io, mv[i].hot[h]);
			free(mv[i].hot);
		}
next:
		if (rcs[i] && rcs[i] != -EAGAIN && !first)
			first = rcs[i];
	}
out:
	free(mv);
	free(meta);
	free(srcs);
	free(objs);
	free(bufs);
	free(caps);
	free(res);
	free(prc);
	free(idx);
	return first;
}

static int do_move(struct mkv_store *s, struct tier_io *io, struct seg *g,
		   int dst, bool from_balance)
{
	int rc;

	do_move_many(s, io, &g, 1, dst, from_balance, &rc);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Hot-block cache                                                         */

/* Under s->lock: detach every hot copy of @g into a new array. */
static void hot_drop_all_locked(struct mkv_store *s, struct seg *g,
				struct tier_obj ***dropped, uint32_t *nd)
{
	struct tier_obj **arr;
	uint32_t k = 0;

	*dropped = NULL;
	*nd = 0;
	if (!g->hot || !g->n_hot)
		return;
	arr = malloc(g->n_hot * sizeof *arr);
	for (uint32_t j = 0; j < g->layout.n_blocks; j++) {
		struct tier_obj *o = g->hot[j];

		if (!o)
			continue;
		g->hot[j] = NULL;
		s->hot_used -= o->footprint;
		s->hot_blocks--;
		if (arr)
			arr[k++] = o;
		else
			tier_drop(s->tiers[MKV_TIER_HBM], NULL, o); /* fast */
	}
	g->n_hot = 0;
	*dropped = arr;
	*nd = k;
}

/*
 * Under s->lock: the coldest evictable hot block (its segment neither
 * pinned nor being read) and its score; false if none.  A linear scan:
 * the hot set is bounded by hot_budget / block size.
 */
static bool hot_coldest(struct mkv_store *s, struct seg **gp, uint32_t *jp,
			double *score)
{
	bool found = false;

	for (size_t b = 0; b < s->n_buckets; b++) {
		for (struct seg *g = s->buckets[b]; g; g = g->next) {
			if (!g->n_hot || g->pins || g->readers)
				continue;
			for (uint32_t j = 0; j < g->layout.n_blocks; j++) {
				double sc;

				if (!g->hot[j])
					continue;
				sc = policy_score(&s->pol, &g->bst[j], s->step);
				if (!found || sc < *score) {
					found = true;
					*score = sc;
					*gp = g;
					*jp = j;
				}
			}
		}
	}
	return found;
}

/*
 * Admit block @j of @g (its values||bitmaps bytes in @data, @len) into the
 * HBM hot cache if the policy says so, evicting colder blocks.  The caller
 * holds a reader reference on @g.  Returns 1 admitted, 0 not, or -errno.
 */
static int hot_admit(struct mkv_store *s, struct tier_io *io, struct seg *g,
		     uint32_t j, const void *data, uint64_t len)
{
	struct tier *hbm = s->tiers[MKV_TIER_HBM];
	struct tier_meta m;
	struct tier_obj *o = NULL, *victim = NULL;
	int rc;

	pthread_mutex_lock(&s->lock);
	for (;;) {
		struct seg *vg = NULL; /* set with coldest >= 0; gcc 13 cannot see it */
		uint32_t vj = 0;
		double coldest = -1;

		if (g->tier == MKV_TIER_HBM || (g->hot && g->hot[j])) {
			pthread_mutex_unlock(&s->lock);
			return 0;
		}
		if (s->hot_used + len <= s->hot_budget)
			coldest = -1;
		else if (!hot_coldest(s, &vg, &vj, &coldest)) {
			pthread_mutex_unlock(&s->lock);
			return 0;
		}
		if (!policy_admit(&s->pol, &g->bst[j], coldest, s->step)) {
			pthread_mutex_unlock(&s->lock);
			return 0;
		}
		if (coldest < 0)
			break;
		/* Evict the colder block, then look again. */
		victim = vg->hot[vj];
		vg->hot[vj] = NULL;
		vg->n_hot--;
		s->hot_used -= victim->footprint;
		s->hot_blocks--;
		s->c.hot_evicted++;
		pthread_mutex_unlock(&s->lock);
		tier_drop(hbm, io, victim);
		pthread_mutex_lock(&s->lock);
	}
	if (!g->hot) {
		g->hot = calloc(g->layout.n_blocks, sizeof *g->hot);
		if (!g->hot) {
			pthread_mutex_unlock(&s->lock);
			return -ENOMEM;
		}
	}
	s->hot_used += len; /* reserve; corrected to the footprint below */
	pthread_mutex_unlock(&s->lock);

	memset(&m, 0, sizeof m);
	m.key.seq = g->key.seq;
	m.key.layer = g->key.layer;
	m.key.head = g->key.head;
	m.key.seg = g->key.seg;
	m.key.kind = g->key.kind;
	m.shape[0] = j;
	m.len = len;
	m.hash = XXH3_64bits(data, len);
	rc = tier_put(hbm, io, &m, data, &o);

	pthread_mutex_lock(&s->lock);
	s->hot_used -= len;
	if (rc == 0 && (g->hot[j] || g->tier == MKV_TIER_HBM)) {
		pthread_mutex_unlock(&s->lock);
		tier_drop(hbm, io, o); /* lost a race: already there */
		return 0;
	}
	if (rc == 0) {
		g->hot[j] = o;
		g->n_hot++;
		s->hot_used += o->footprint;
		s->hot_blocks++;
		s->c.hot_admitted++;
	}
	pthread_mutex_unlock(&s->lock);
	return rc ? rc : 1;
}

/* ---------------------------------------------------------------------- */
/* Workers                                                                 */

static int run_balance(struct mkv_store *s, struct tier_io *io);
static int run_prefetch(struct mkv_store *s, struct tier_io *io,
			struct job *j);

/* Under s->lock. */
static void enqueue(struct mkv_store *s, struct job *j)
{
	j->next = NULL;
	if (s->q_tail)
		s->q_tail->next = j;
	else
		s->q_head = j;
	s->q_tail = j;
	s->pending++;
	pthread_cond_signal(&s->q_cond);
}

static void free_reqs(struct mkv_fetch_req *r, size_t n)
{
	if (!r)
		return;
	for (size_t i = 0; i < n; i++)
		free((void *)r[i].blocks);
	free(r);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct mkv_store *s = w->s;

	if (s->numa_node >= 0 && numa_available() >= 0)
		numa_run_on_node(s->numa_node);
	pthread_mutex_lock(&s->lock);
	for (;;) {
		struct job *j;
		int rc = 0;

		while ((!s->q_head || s->paused) && !s->stopping)
			pthread_cond_wait(&s->q_cond, &s->lock);
		if (!s->q_head)
			break; /* stopping and nothing left */
		j = s->q_head;
		s->q_head = j->next;
		if (!s->q_head)
			s->q_tail = NULL;
		if (j->kind == JOB_BALANCE)
			s->balance_queued = 0;
		pthread_mutex_unlock(&s->lock);

		switch (j->kind) {
		case JOB_MOVE:
			rc = do_move(s, &w->io, j->seg, j->dst, false);
			break;
		case JOB_BALANCE:
			rc = run_balance(s, &w->io);
			break;
		case JOB_PREFETCH:
			rc = run_prefetch(s, &w->io, j);
			break;
		case JOB_CALL:
			j->fn(j->arg);
			break;
		}
		if (j->cb)
			j->cb(j->arg, rc);
		free_reqs(j->reqs, j->n);
		free(j);

		pthread_mutex_lock(&s->lock);
		s->pending--;
		pthread_cond_broadcast(&s->cond);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

int store_submit_call(struct mkv_store *s, void (*fn)(void *arg), void *arg)
{
	struct job *j;

	if (!s || !fn)
		return -EINVAL;
	j = calloc(1, sizeof *j);
	if (!j)
		return -ENOMEM;
	j->kind = JOB_CALL;
	j->fn = fn;
	j->arg = arg;
	pthread_mutex_lock(&s->lock);
	if (s->stopping) {
		pthread_mutex_unlock(&s->lock);
		free(j);
		return -ESHUTDOWN;
	}
	enqueue(s, j);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

void store_pause(struct mkv_store *s, bool pause)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	s->paused = pause;
	if (!pause)
		pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->lock);
}

int store_device(const struct mkv_store *s)
{
	return s ? s->gpu : -1;
}

/* Under s->lock: queue a background rebalance (if none is queued) when a
 * put found a tier at its high watermark. */
static void maybe_balance_locked(struct mkv_store *s, bool full)
{
	struct job *j;

	if (!s->auto_balance || s->balance_queued || s->stopping || !full)
		return;
	j = calloc(1, sizeof *j);
	if (!j)
		return; /* best effort: the next put tries again */
	j->kind = JOB_BALANCE;
	s->balance_queued = 1;
	enqueue(s, j);
}

/* ---------------------------------------------------------------------- */
/* Balance                                                                 */

struct plan_ent {
	struct seg *g;
	struct policy_item it;
};

static int tier_index_present(const struct mkv_store *s, int t)
{
	return t >= 0 && t < MKV_TIER_COUNT && s->tiers[t];
}

static int run_balance(struct mkv_store *s, struct tier_io *io)
{
	struct plan_ent *pe = NULL;
	struct policy_item *items = NULL;
	size_t *order = NULL, n = 0, k = 0;
	size_t cap[MKV_TIER_COUNT];
	int map[MKV_TIER_COUNT], n_tiers = 0, first_err = 0;

	/* Present tiers, top down, as a dense index for the planner. */
	for (int t = 0; t < MKV_TIER_COUNT; t++)
		if (s->tiers[t]) {
			map[n_tiers] = t;
			cap[n_tiers] = place_capacity(s, t);
			n_tiers++;
		}
	pthread_mutex_lock(&s->lock);
	s->c.balances++;
	n = s->n_segs;
	pe = calloc(n ? n : 1, sizeof *pe);
	items = calloc(n ? n : 1, sizeof *items);
	order = calloc(n ? n : 1, sizeof *order);
	if (!pe || !items || !order) {
		pthread_mutex_unlock(&s->lock);
		free(pe);
		free(items);
		free(order);
		return -ENOMEM;
	}
	for (size_t b = 0; b < s->n_buckets; b++) {
		for (struct seg *g = s->buckets[b]; g; g = g->next) {
			int dt = 0;

			if (!g->ready)
				continue;
			while (map[dt] != g->tier)
				dt++;
			pe[k].g = g;
			items[k] = (struct policy_item){
				.bytes = g->obj->footprint, .tier = dt,
				.pinned = g->pins || g->state != MKV_SEG_RESIDENT ||
					  g->readers,
				.st = &g->st };
			k++;
		}
	}
	n = k;
	policy_plan(&s->pol, items, n, cap, n_tiers, s->step, order);
	/* Reserve every segment to move (state), so nothing else moves or
	 * removes them while we work through the list. */
	for (size_t i = 0; i < n; i++) {
		struct seg *g = pe[i].g;
		int to = map[items[i].target];

		pe[i].it = items[i];
		if (items[i].pinned || to == g->tier)
			continue;
		g->state = to > g->tier ? MKV_SEG_MOVING_DOWN : MKV_SEG_MOVING_UP;
	}
	pthread_mutex_unlock(&s->lock);

	/* Demotions first (coldest first), to make room; then promotions
	 * (hottest first).  order[] is hottest first.  Consecutive moves to
	 * one tier go as one batch (NVMe: one ring submission for all their
	 * writes and syncs, queue depth 2 x MOVE_BATCH).  A move that finds
	 * its destination at the high watermark (the plan counts footprints
	 * where segments are, a move reserves a bound on the new one, and a
	 * batch reserves all its moves at once) is retried once after the
	 * two passes, in the same order, when the moves out of that tier
	 * have been made; then left out.  (Left out at once, such a skip once
	 * kept a cold segment in HBM and a hot one below after a balance:
	 * store_watermark, 1 run in ~400.) */
	struct seg **retry = calloc(n ? n : 1, sizeof *retry);
	int *retry_dst = calloc(n ? n : 1, sizeof *retry_dst);
	size_t n_retry = 0;
	uint64_t left_out = 0;

	for (int pass = 0; pass < 3; pass++) {
		struct seg *batch[MOVE_BATCH];
		int rcs[MOVE_BATCH], bdst = -1;
		unsigned nb = 0;
		size_t len = pass < 2 ? n : n_retry;

		for (size_t q = 0; q <= len; q++) {
			struct seg *g = NULL;
			int to = -1;

			if (q < len && pass < 2) {
				size_t i = pass == 0 ? order[n - 1 - q] : order[q];

				to = map[pe[i].it.target];
				if (pe[i].it.pinned || to == map[pe[i].it.tier] ||
				    (pass == 0) != (to > map[pe[i].it.tier]))
					continue;
				g = pe[i].g;
			} else if (q < len) {
				g = retry[q];
				to = retry_dst[q];
			}
			if (nb && (q == len || to != bdst || nb == MOVE_BATCH)) {
				int rc;

				if (nb > 1) {
					pthread_mutex_lock(&s->lock);
					s->c.move_batches++;
					pthread_mutex_unlock(&s->lock);
				}
				rc = do_move_many(s, io, batch, nb, bdst, true, rcs);
				if (rc && !first_err)
					first_err = rc;
				pthread_mutex_lock(&s->lock);
				for (unsigned j = 0; j < nb; j++) {
					if (rcs[j] != -EAGAIN)
						continue;
					if (pass < 2 && retry && retry_dst) {
						retry[n_retry] = batch[j];
						retry_dst[n_retry++] = bdst;
					} else {
						/* released: still where it was */
						batch[j]->state = MKV_SEG_RESIDENT;
						left_out++;
					}
				}
				pthread_cond_broadcast(&s->cond);
				pthread_mutex_unlock(&s->lock);
				nb = 0;
			}
			if (q < len) {
				bdst = to;
				batch[nb++] = g;
			}
		}
	}
	pthread_mutex_lock(&s->lock);
	s->c.balance_skipped += left_out;
	pthread_mutex_unlock(&s->lock);
	free(retry);
	free(retry_dst);
	free(pe);
	free(items);
	free(order);
	return first_err;
}

/* ---------------------------------------------------------------------- */
/* Prefetch                                                                */

static int run_prefetch(struct mkv_store *s, struct tier_io *io,
			struct job *jb)
{
	int first_err = 0;

	for (size_t r = 0; r < jb->n; r++) {
		const struct mkv_fetch_req *q = &jb->reqs[r];
		struct seg *g;
		struct tier_range *rg;
		uint32_t *want, nw = 0;
		char *buf;
		uint64_t total = 0;
		int64_t got;

		pthread_mutex_lock(&s->lock);
		g = dir_find(s, &q->key, false);
		if (!g || !g->bst || g->tier == MKV_TIER_HBM) {
			pthread_mutex_unlock(&s->lock);
			continue;
		}
		want = malloc(q->n_blocks * sizeof *want);
		rg = malloc(2 * (size_t)q->n_blocks * sizeof *rg);
		if (!want || !rg) {
			pthread_mutex_unlock(&s->lock);
			free(want);
			free(rg);
			first_err = first_err ? first_err : -ENOMEM;
			continue;
		}
		for (uint32_t i = 0; i < q->n_blocks; i++) {
			uint32_t j = q->blocks[i];

			if (j >= g->layout.n_blocks || (g->hot && g->hot[j]))
				continue;
			/* Doorkeeper first: blocks selected only once are
			 * not worth reading for the hot cache. */
			if (g->bst[j].hits < s->pol.admit_min_hits)
				continue;
			want[nw] = j;
			block_ranges(&g->layout, j, &rg[2 * nw]);
			total += rg[2 * nw].len + rg[2 * nw + 1].len;
			nw++;
		}
		if (!nw) {
			pthread_mutex_unlock(&s->lock);
			free(want);
			free(rg);
			continue;
		}
		g->readers++;
		int t = g->tier;
		struct tier_obj *o = g->obj;
		pthread_mutex_unlock(&s->lock);

		buf = malloc(total);
		got = buf ? tier_gather(s->tiers[t], io, o, rg, 2 * nw, buf)
			  : -ENOMEM;
		if (got >= 0 && (uint64_t)got != total)
			got = -EIO;
		if (got >= 0) {
			uint64_t pos = 0;

			for (uint32_t i = 0; i < nw; i++) {
				uint64_t l = rg[2 * i].len + rg[2 * i + 1].len;
				int rc = hot_admit(s, io, g, want[i], buf + pos, l);

				if (rc < 0 && !first_err)
					first_err = rc;
				pos += l;
			}
		} else if (!first_err) {
			first_err = (int)got;
		}
		free(buf);
		free(want);
		free(rg);
		pthread_mutex_lock(&s->lock);
		g->readers--;
		pthread_cond_broadcast(&s->cond);
		pthread_mutex_unlock(&s->lock);
	}
	return first_err;
}

/* ---------------------------------------------------------------------- */
/* Create / destroy                                                        */

int mkv_store_opts_init(struct mkv_store_opts *o, size_t size)
{
	if (!o || size != sizeof(*o))
		return -EINVAL;
	memset(o, 0, size);
	o->size = size;
	o->hbm_bytes = (size_t)256 << 20;
	o->host_bytes = (size_t)1 << 30;
	o->nvme_bytes = (size_t)64 << 30;
	o->nvme_dir = NULL;
	o->gpu = 0;
	o->numa_node = -1;
	o->workers = 2;
	o->io_depth = 64;
	o->lz4 = 1;
	o->half_life = 64;
	for (int t = 0; t < MKV_TIER_COUNT; t++) {
		o->high_wm[t] = 0.90;
		o->low_wm[t] = 0.75;
	}
	o->auto_balance = 1;
	o->hot_fraction = 0.25;
	o->io_buf_bytes = (size_t)4 << 20;
	o->fetch_mapped = 0;
	o->fetch_threads = 0;
	o->fetch_spin_us = 200;
	o->fetch_kernel_share = 0.5;
	return 0;
}

static int opts_valid(const struct mkv_store_opts *o)
{
	if (!o || o->size != sizeof(*o))
		return 0;
	if (o->workers < 1 || o->workers > STORE_MAX_WORKERS ||
	    o->io_depth < 1 || o->io_depth > 4096 || !(o->half_life > 0) ||
	    o->numa_node < -1 || o->gpu < -1 ||
	    !(o->hot_fraction >= 0 && o->hot_fraction <= 0.9) ||
	    o->fetch_threads > 64 || o->fetch_spin_us > 100000 ||
	    !(o->fetch_kernel_share >= 0 && o->fetch_kernel_share <= 1))
		return 0;
	for (int t = 0; t < MKV_TIER_COUNT; t++)
		if (!(o->low_wm[t] > 0) || !(o->low_wm[t] <= o->high_wm[t]) ||
		    !(o->high_wm[t] <= 1))
			return 0;
	if (o->numa_node >= 0 &&
	    (numa_available() < 0 || o->numa_node > numa_max_node()))
		return 0;
	return 1;
}

/* A ring with a registered area if the memlock limit allows, else one
 * without (it still works, with unregistered buffers). */
static int ring_create(unsigned depth, size_t buf, struct uring_engine **out)
{
	int rc = uring_engine_create(depth, buf, out);

	if (rc && buf && (rc == -ENOMEM || rc == -EPERM || rc == -EFAULT))
		rc = uring_engine_create(depth, 0, out);
	return rc;
}

static void store_free(struct mkv_store *s)
{
	if (!s)
		return;
	for (size_t b = 0; s->buckets && b < s->n_buckets; b++) {
		struct seg *g = s->buckets[b], *nx;

		for (; g; g = nx) {
			nx = g->next;
			for (uint32_t j = 0; g->hot && j < g->layout.n_blocks; j++)
				if (g->hot[j])
					tier_drop(s->tiers[MKV_TIER_HBM], NULL,
						  g->hot[j]);
			if (g->obj)
				tier_forget(s->tiers[g->tier], g->obj);
			seg_free(g);
		}
	}
	free(s->buckets);
	for (unsigned i = 0; s->workers && i < s->n_workers; i++)
		uring_engine_destroy(s->workers[i].io.ring);
	free(s->workers);
	for (int t = 0; t < MKV_TIER_COUNT; t++)
		tier_destroy(s->tiers[t]);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	pthread_cond_destroy(&s->q_cond);
	free(s);
}

/* Reopen: adopt what the NVMe tier holds. */
static int reopen_cb(void *arg, int status, const char *name,
		     const struct tier_meta *m, struct tier_obj *o)
{
	struct mkv_store *s = arg;
	struct mkv_seg_key k;
	struct mkv_store_layout lay;
	struct seg *g;

	(void)name;
	if (status == -EINPROGRESS) {
		s->c.reopen_incomplete++;
		return 1;
	}
	if (status) {
		s->c.reopen_corrupt++;
		return 1;
	}
	k.seq = m->key.seq;
	k.layer = m->key.layer;
	k.head = m->key.head;
	k.seg = m->key.seg;
	k.kind = m->key.kind;
	if (dir_find(s, &k, true)) {
		/* Two complete copies of one key (a crash between a new
		 * copy's commit and the old one's unlink): same bytes, keep
		 * one, remove the other. */
		tier_drop(s->tiers[MKV_TIER_NVME], NULL, o);
		return 0;
	}
	shape_to_layout(m->shape, m->len, &lay);
	g = seg_new(&k, &lay);
	if (!g || dir_insert(s, g)) {
		seg_free(g);
		return 1; /* the scan frees the handle; the file stays */
	}
	g->ready = 1;
	g->tier = MKV_TIER_NVME;
	g->obj = o;
	g->len = m->len;
	g->hash = m->hash;
	s->c.segments[MKV_TIER_NVME]++;
	s->c.reopen_adopted++;
	return 0;
}

int store_create_with_tiers(const struct mkv_store_opts *o,
			    struct tier *tiers[MKV_TIER_COUNT],
			    struct mkv_store **out)
{
	struct mkv_store *s;
	int rc;

	if (!tiers || !out || !opts_valid(o) || !tiers[MKV_TIER_HBM] ||
	    (tiers[MKV_TIER_NVME] && !tiers[MKV_TIER_NVME]->persistent)) {
		for (int t = 0; tiers && t < MKV_TIER_COUNT; t++)
			tier_destroy(tiers[t]);
		return -EINVAL;
	}
	s = calloc(1, sizeof *s);
	if (!s) {
		for (int t = 0; t < MKV_TIER_COUNT; t++)
			tier_destroy(tiers[t]);
		return -ENOMEM;
	}
	memcpy(s->tiers, tiers, sizeof s->tiers);
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	pthread_cond_init(&s->q_cond, NULL);
	s->gpu = tiers[MKV_TIER_HBM]->device ? o->gpu : -1;
	s->numa_node = o->numa_node;
	if (s->numa_node < 0 && s->gpu >= 0)
		s->numa_node = tcuda_numa_node(s->gpu);
	s->auto_balance = !!o->auto_balance;
	s->host_mapped = s->gpu >= 0 && o->fetch_mapped &&
			 tcuda_host_ptr_usable(s->gpu);
	s->fetch_threads = o->fetch_threads;
	s->fetch_spin_us = o->fetch_spin_us;
	s->fetch_kernel_share = o->fetch_kernel_share;
	policy_init(&s->pol, &policy_lrfu_ops, o->half_life);
	for (int t = 0; t < MKV_TIER_COUNT; t++) {
		s->pol.high_wm[t] = o->high_wm[t];
		s->pol.low_wm[t] = o->low_wm[t];
	}
	/* Part of HBM for hot blocks when lower tiers exist. */
	s->hot_budget = (tiers[MKV_TIER_HOST] || tiers[MKV_TIER_NVME])
		? (size_t)((double)tiers[MKV_TIER_HBM]->capacity * o->hot_fraction)
		: 0;
	s->n_buckets = 64;
	s->buckets = calloc(s->n_buckets, sizeof *s->buckets);
	s->n_workers = o->workers;
	s->workers = calloc(s->n_workers, sizeof *s->workers);
	if (!s->buckets || !s->workers) {
		store_free(s);
		return -ENOMEM;
	}
	/* One ring per worker (only NVMe needs one), made here so a failure
	 * is reported by create. */
	if (s->tiers[MKV_TIER_NVME]) {
		for (unsigned i = 0; i < s->n_workers; i++) {
			rc = ring_create(o->io_depth, o->io_buf_bytes,
					 &s->workers[i].io.ring);
			if (rc) {
				store_free(s);
				return rc;
			}
		}
		rc = s->tiers[MKV_TIER_NVME]->ops->scan(s->tiers[MKV_TIER_NVME],
							NULL, reopen_cb, s);
		if (rc < 0) {
			store_free(s);
			return rc;
		}
	}
	for (unsigned i = 0; i < s->n_workers; i++) {
		s->workers[i].s = s;
		if (pthread_create(&s->workers[i].th, NULL, worker_main,
				   &s->workers[i])) {
			pthread_mutex_lock(&s->lock);
			s->stopping = 1;
			pthread_cond_broadcast(&s->q_cond);
			pthread_mutex_unlock(&s->lock);
			for (unsigned k = 0; k < i; k++)
				pthread_join(s->workers[k].th, NULL);
			store_free(s);
			return -ENOMEM;
		}
		s->workers[i].started = 1;
	}
	*out = s;
	return 0;
}

int mkv_store_create(const struct mkv_store_opts *o, struct mkv_store **out)
{
	struct tier *t[MKV_TIER_COUNT] = { NULL, NULL, NULL };
	int gpu, node, rc;

	if (!out || !opts_valid(o) || o->hbm_bytes == 0 ||
	    o->host_bytes == 0 || (o->nvme_dir && o->nvme_bytes == 0))
		return -EINVAL;
	gpu = o->gpu >= 0 && tcuda_usable(o->gpu) ? o->gpu : -1;
	node = o->numa_node;
	if (node < 0 && gpu >= 0)
		node = tcuda_numa_node(gpu);
	rc = hbm_tier_create(o->hbm_bytes, gpu, &t[MKV_TIER_HBM]);
	if (!rc)
		rc = host_tier_create(o->host_bytes, node, gpu,
				      &t[MKV_TIER_HOST]);
	if (!rc && o->nvme_dir)
		rc = nvme_tier_create(o->nvme_dir, o->nvme_bytes, (int)o->lz4,
				      &t[MKV_TIER_NVME]);
	if (rc) {
		for (int i = 0; i < MKV_TIER_COUNT; i++)
			tier_destroy(t[i]);
		return rc;
	}
	return store_create_with_tiers(o, t, out);
}

int mkv_store_drain(struct mkv_store *s)
{
	if (!s)
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	while (s->pending)
		pthread_cond_wait(&s->cond, &s->lock);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

void mkv_store_destroy(struct mkv_store *s)
{
	if (!s)
		return;
	mkv_store_drain(s);
	pthread_mutex_lock(&s->lock);
	s->stopping = 1;
	pthread_cond_broadcast(&s->q_cond);
	pthread_mutex_unlock(&s->lock);
	for (unsigned i = 0; i < s->n_workers; i++)
		if (s->workers[i].started)
			pthread_join(s->workers[i].th, NULL);
	store_free(s);
}

struct tier *store_tier(struct mkv_store *s, int level)
{
	if (!s || level < 0 || level >= MKV_TIER_COUNT)
		return NULL;
	return s->tiers[level];
}

/* ---------------------------------------------------------------------- */
/* Put / read / remove                                                     */

static bool key_valid(const struct mkv_seg_key *k)
{
	return k && k->kind <= MKV_KIND_VALUE;
}

/*
 * Synchronous calls (put, read, remove) run on the caller's thread, which
 * has no ring of ours: they pass io = NULL and the NVMe tier uses its own
 * fallback ring, serialized.  The data path (fetch) has its own ring per
 * struct mkv_fetch, and moves run on the workers' rings.
 */

int mkv_store_put(struct mkv_store *s, const struct mkv_seg_key *k,
		  const void *payload, size_t len,
		  const struct mkv_store_layout *layout)
{
	struct seg *g;
	struct tier_obj *o = NULL;
	int rc = -ENOSPC, placed = -1;
	bool full = false;

	if (!s || !key_valid(k) || !payload || len == 0 ||
	    len > SEGFILE_MAX_PAYLOAD || !layout_valid(layout, len))
		return -EINVAL;
	if (layout && layout->n_blocks &&
	    (layout->values_off + layout->values_len > UINT32_MAX ||
	     layout->bitmaps_off + layout->bitmaps_len > UINT32_MAX))
		return -EINVAL;
	g = seg_new(k, layout);
	if (!g)
		return -ENOMEM;
	g->len = len;
	g->hash = XXH3_64bits(payload, len);
	pthread_mutex_lock(&s->lock);
	if (dir_find(s, k, true)) {
		pthread_mutex_unlock(&s->lock);
		seg_free(g);
		return -EEXIST;
	}
	if (dir_insert(s, g)) { /* reserved, not ready: invisible */
		pthread_mutex_unlock(&s->lock);
		seg_free(g);
		return -ENOMEM;
	}
	pthread_mutex_unlock(&s->lock);

	for (int t = 0; t < MKV_TIER_COUNT && placed < 0; t++) {
		struct tier *tt = s->tiers[t];
		int vfail = 0;
		bool ok;

		if (!tt)
			continue;
		/* Within the high watermark, unless nothing is below. */
		pthread_mutex_lock(&s->lock);
		ok = reserve_locked(s, t, len);
		pthread_mutex_unlock(&s->lock);
		if (!ok) {
			full = true;
			continue;
		}
		rc = put_verified(tt, NULL, g, payload, &o, &vfail);
		pthread_mutex_lock(&s->lock);
		unreserve_locked(s, t, len);
		if (rc == 0) {
			placed = t;
			pthread_mutex_unlock(&s->lock);
			break;
		}
		if (vfail)
			s->c.verify_failures++;
		s->c.last_error = rc;
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_lock(&s->lock);
	if (placed < 0) {
		dir_unlink(s, g);
		pthread_mutex_unlock(&s->lock);
		seg_free(g);
		return rc == -ENOMEM || rc == -ENOSPC ? -ENOSPC : rc;
	}
	g->tier = placed;
	g->obj = o;
	g->ready = 1;
	s->c.segments[placed]++;
	maybe_balance_locked(s, full);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* Find the values and bitmaps arrays inside a serialized segment: they are
 * copied verbatim, after a header, at 16-byte aligned offsets. */
static int find_layout(const char *buf, size_t len,
		       const struct mkv_packed_view *v,
		       struct mkv_store_layout *l)
{
	size_t vl = (size_t)v->n * v->row_bytes, bl = (size_t)v->n * v->bitmap_bytes;

	if (!vl || !bl)
		return -1;
	for (size_t off = 16; off <= 4096 && off + vl <= len; off += 16) {
		size_t boff = (off + vl + 15) & ~(size_t)15;

		if (boff + bl > len || memcmp(buf + off, v->values, vl) ||
		    memcmp(buf + boff, v->bitmaps, bl))
			continue;
		l->n_blocks = v->n_blocks;
		l->values_off = off;
		l->values_block = (uint64_t)v->b * v->row_bytes;
		l->values_len = vl;
		l->bitmaps_off = boff;
		l->bitmaps_block = (uint64_t)v->b * v->bitmap_bytes;
		l->bitmaps_len = bl;
		return 0;
	}
	return -1;
}

int mkv_store_put_segment(struct mkv_store *s, const struct mkv_seg_key *k,
			  const struct mkv_segment *seg)
{
	struct mkv_packed_view v;
	struct mkv_store_layout l;
	int64_t len;
	char *buf;
	int rc;

	if (!s || !key_valid(k) || !seg || mkv_segment_view(seg, &v))
		return -EINVAL;
	len = mkv_segment_serialize(seg, NULL, 0);
	if (len <= 0)
		return len < 0 ? (int)len : -EINVAL;
	buf = malloc((size_t)len);
	if (!buf)
		return -ENOMEM;
	if (mkv_segment_serialize(seg, buf, (size_t)len) != len) {
		free(buf);
		return -EINVAL;
	}
	memset(&l, 0, sizeof l);
	rc = find_layout(buf, (size_t)len, &v, &l);
	rc = mkv_store_put(s, k, buf, (size_t)len, rc ? NULL : &l);
	free(buf);
	return rc;
}

int64_t mkv_store_read(struct mkv_store *s, const struct mkv_seg_key *k,
		       void *buf, size_t cap)
{
	struct seg *g;
	struct tier_obj *o;
	int64_t r;
	int t;

	if (!s || !key_valid(k) || !buf)
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	g = dir_find(s, k, false);
	if (!g) {
		pthread_mutex_unlock(&s->lock);
		return -ENOENT;
	}
	if (cap < g->len) {
		pthread_mutex_unlock(&s->lock);
		return -ENOSPC;
	}
	g->readers++;
	t = g->tier;
	o = g->obj;
	pthread_mutex_unlock(&s->lock);

	r = tier_get(s->tiers[t], NULL, o, buf, cap);
	if (r >= 0 && (uint64_t)r != g->len)
		r = -EIO;
	if (r >= 0 && XXH3_64bits(buf, g->len) != g->hash)
		r = -MKV_ECORRUPT;

	pthread_mutex_lock(&s->lock);
	g->readers--;
	if (r < 0)
		s->c.last_error = r;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return r;
}

int mkv_store_get_segment(struct mkv_store *s, const struct mkv_seg_key *k,
			  struct mkv_segment **out)
{
	struct mkv_seg_info info;
	char *buf;
	int64_t r;
	int rc;

	if (!s || !key_valid(k) || !out)
		return -EINVAL;
	rc = mkv_store_info(s, k, &info);
	if (rc)
		return rc;
	buf = malloc(info.len);
	if (!buf)
		return -ENOMEM;
	r = mkv_store_read(s, k, buf, info.len);
	if (r >= 0)
		r = mkv_segment_deserialize(buf, (size_t)r, out);
	free(buf);
	return (int)r;
}

int mkv_store_remove(struct mkv_store *s, const struct mkv_seg_key *k)
{
	struct seg *g;
	struct tier_obj **hot = NULL;
	uint32_t n_hot = 0;

	if (!s || !key_valid(k))
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	g = dir_find(s, k, false);
	if (!g) {
		pthread_mutex_unlock(&s->lock);
		return -ENOENT;
	}
	if (g->pins || g->readers || g->state != MKV_SEG_RESIDENT) {
		pthread_mutex_unlock(&s->lock);
		return -EBUSY;
	}
	dir_unlink(s, g);
	s->c.segments[g->tier]--;
	hot_drop_all_locked(s, g, &hot, &n_hot);
	pthread_mutex_unlock(&s->lock);
	tier_drop(s->tiers[g->tier], NULL, g->obj);
	for (uint32_t i = 0; i < n_hot; i++)
		tier_drop(s->tiers[MKV_TIER_HBM], NULL, hot[i]);
	free(hot);
	seg_free(g);
	return 0;
}

/* Under s->lock. */
static void info_fill(struct mkv_store *s, const struct seg *g,
		      struct mkv_seg_info *info)
{
	memset(info, 0, sizeof *info);
	info->tier = (enum mkv_tier)g->tier;
	info->state = g->state;
	info->pins = g->pins;
	info->n_blocks = g->layout.n_blocks;
	info->hot_blocks = g->n_hot;
	info->len = g->len;
	info->hash = g->hash;
	info->hits = g->st.hits;
	info->last_step = g->st.last;
	info->score = policy_score(&s->pol, &g->st, s->step);
}

int mkv_store_info(struct mkv_store *s, const struct mkv_seg_key *k,
		   struct mkv_seg_info *info)
{
	struct seg *g;

	if (!s || !key_valid(k) || !info)
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	g = dir_find(s, k, false);
	if (g)
		info_fill(s, g, info);
	pthread_mutex_unlock(&s->lock);
	return g ? 0 : -ENOENT;
}

int mkv_store_block_residency(struct mkv_store *s, const struct mkv_seg_key *k,
			      uint8_t *res, size_t n)
{
	struct seg *g;
	int rc;

	if (!s || !key_valid(k) || !res)
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	g = dir_find(s, k, false);
	if (!g) {
		rc = -ENOENT;
	} else if (n < g->layout.n_blocks) {
		rc = -ENOSPC;
	} else {
		for (uint32_t j = 0; j < g->layout.n_blocks; j++)
			res[j] = (g->hot && g->hot[j]) ? MKV_TIER_HBM
						       : (uint8_t)g->tier;
		rc = (int)g->layout.n_blocks;
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int64_t mkv_store_list(struct mkv_store *s,
		       void (*fn)(void *arg, const struct mkv_seg_key *k,
				  const struct mkv_seg_info *info),
		       void *arg)
{
	int64_t n = 0;

	if (!s || !fn)
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	for (size_t b = 0; b < s->n_buckets; b++) {
		for (struct seg *g = s->buckets[b]; g; g = g->next) {
			struct mkv_seg_info info;

			if (!g->ready)
				continue;
			info_fill(s, g, &info);
			fn(arg, &g->key, &info);
			n++;
		}
	}
	pthread_mutex_unlock(&s->lock);
	return n;
}

int mkv_store_pin(struct mkv_store *s, const struct mkv_seg_key *k)
{
	struct seg *g;

	if (!s || !key_valid(k))
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	g = dir_find(s, k, false);
	if (g)
		g->pins++;
	pthread_mutex_unlock(&s->lock);
	return g ? 0 : -ENOENT;
}

int mkv_store_unpin(struct mkv_store *s, const struct mkv_seg_key *k)
{
	struct seg *g;
	int rc = 0;

	if (!s || !key_valid(k))
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	g = dir_find(s, k, false);
	if (!g)
		rc = -ENOENT;
	else if (!g->pins)
		rc = -EALREADY;
	else
		g->pins--;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int mkv_store_move(struct mkv_store *s, const struct mkv_seg_key *k,
		   enum mkv_tier dst, mkv_store_cb cb, void *arg)
{
	struct seg *g;
	struct job *j;

	if (!s || !key_valid(k) || !cb || !tier_index_present(s, (int)dst))
		return -EINVAL;
	j = calloc(1, sizeof *j);
	if (!j)
		return -ENOMEM;
	pthread_mutex_lock(&s->lock);
	g = dir_find(s, k, false);
	if (!g || g->pins || g->state != MKV_SEG_RESIDENT ||
	    g->tier == (int)dst) {
		int rc = !g ? -ENOENT : g->tier == (int)dst &&
				 g->state == MKV_SEG_RESIDENT ? -EALREADY
							      : -EBUSY;

		pthread_mutex_unlock(&s->lock);
		free(j);
		return rc;
	}
	g->state = (int)dst > g->tier ? MKV_SEG_MOVING_DOWN : MKV_SEG_MOVING_UP;
	j->kind = JOB_MOVE;
	j->seg = g;
	j->dst = (int)dst;
	j->cb = cb;
	j->arg = arg;
	enqueue(s, j);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int mkv_store_balance(struct mkv_store *s, mkv_store_cb cb, void *arg)
{
	struct job *j;

	if (!s || !cb)
		return -EINVAL;
	j = calloc(1, sizeof *j);
	if (!j)
		return -ENOMEM;
	j->kind = JOB_BALANCE;
	j->cb = cb;
	j->arg = arg;
	pthread_mutex_lock(&s->lock);
	enqueue(s, j);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Fetch                                                                   */

struct mkv_fetch {
	struct mkv_store *s;
	char *staging;      /* pinned host */
	int staging_arena;  /* 1: from the host tier's pinned arena */
	size_t staging_locked; /* else: bytes mlock'ed (0: not locked) */
	uint64_t *soff;     /* per output block: staging offset or ~0 */
	size_t cap_soff;
	void *dev_staging;  /* device, when HBM is on a device */
	size_t staging_len;
	/* Host-tier blocks packed into staging by these threads, each chunk
	 * copied to dev_staging on @stream as soon as it is packed ... */
	struct packpool *pool;
	void *stream;
	struct pp_piece *pp;
	uint32_t cap_pp;
#if MKV_HAVE_CUDA
	/* ... or gathered by one kernel straight from the mapped pinned
	 * chunks into dev_staging; neither: packed serially + one H2D. */
	struct gpu_gather_ctx *gather;
	struct gpu_bg_args *bga; /* the kernel's work list, by value */
#endif
	struct tier_io io;  /* this context's own ring */
#if MKV_FETCH_TRACE
	double trace[8];    /* microseconds at the phases of the last fetch */
#endif
	struct seg **pinned;
	size_t n_pinned, cap_pinned;
};

/* The pool's copy function: packed staging bytes to the device. */
static int fetch_copy(void *arg, uint64_t off, uint64_t len)
{
	struct mkv_fetch *f = arg;

	return tcuda_h2d_async(f->s->gpu, (char *)f->dev_staging + off,
			       f->staging + off, len, f->stream);
}

int mkv_fetch_create(struct mkv_store *s, size_t staging_bytes,
		     struct mkv_fetch **out)
{
	struct mkv_fetch *f;
	struct tier *host;
	int rc;

	if (!s || !out || staging_bytes == 0)
		return -EINVAL;
	f = calloc(1, sizeof *f);
	if (!f)
		return -ENOMEM;
	f->s = s;
	f->staging_len = staging_bytes;
	host = s->tiers[MKV_TIER_HOST];
	f->staging = host ? host_tier_alloc_pinned(host, staging_bytes) : NULL;
	f->staging_arena = f->staging != NULL;
	if (!f->staging) {
		/* No pinned arena (no host tier, or a wrapped one in tests):
		 * page-aligned memory, locked if the limit allows. */
		size_t l = (staging_bytes + 4095) & ~(size_t)4095;

		f->staging = aligned_alloc(4096, l);
		if (f->staging && mlock(f->staging, l) == 0)
			f->staging_locked = l;
	}
	if (!f->staging) {
		free(f);
		return -ENOMEM;
	}
	if (s->gpu >= 0) {
		rc = tcuda_malloc(s->gpu, staging_bytes, &f->dev_staging);
		if (rc) {
			mkv_fetch_destroy(f);
			return rc;
		}
		/*
		 * The threads' copies are asynchronous, so the staging must be
		 * pinned (the arena's is); a pool or stream that cannot be
		 * made leaves the kernel or the serial path, which work.
		 */
		if (f->staging_arena && s->fetch_threads &&
		    tcuda_stream_create(s->gpu, &f->stream) == 0 &&
		    packpool_create(s->fetch_threads, s->numa_node,
				    s->fetch_spin_us, fetch_copy, f,
				    &f->pool) != 0)
			f->pool = NULL;
	}
#if MKV_HAVE_CUDA
	if (s->gpu >= 0 && (!f->pool || s->fetch_kernel_share > 0)) {
		/*
		 * The kernel reads host-tier payloads where they lie, which
		 * needs them mapped at the same address on the device: true
		 * when the real host tier pinned them (its staging scratch
		 * comes from the same registered chunks) on a device with
		 * unified addressing.  Otherwise, or if the context cannot be
		 * made, fetches keep the packed path.
		 */
		if (f->staging_arena &&
		    tcuda_host_ptr_usable(s->gpu) &&
		    tcuda_is_mapped_host(f->staging) &&
		    gpu_gather_ctx_create(s->gpu, 1, &f->gather))
			f->gather = NULL;
		if (f->gather && !(f->bga = malloc(sizeof *f->bga))) {
			gpu_gather_ctx_destroy(f->gather);
			f->gather = NULL;
		}
	}
#endif
	if (s->tiers[MKV_TIER_NVME]) {
		/* Its registered area is the bounce of the NVMe gathers: the
		 * covering 4 KiB extents of the staged blocks. */
		rc = ring_create(64, 2 * staging_bytes + ((size_t)1 << 20),
				 &f->io.ring);
		if (rc) {
			mkv_fetch_destroy(f);
			return rc;
		}
	}
	*out = f;
	return 0;
}

void mkv_fetch_release(struct mkv_fetch *f)
{
	struct mkv_store *s;

	if (!f || !f->n_pinned)
		return;
	s = f->s;
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < f->n_pinned; i++)
		f->pinned[i]->pins--;
	pthread_mutex_unlock(&s->lock);
	f->n_pinned = 0;
}

void mkv_fetch_destroy(struct mkv_fetch *f)
{
	if (!f)
		return;
	mkv_fetch_release(f);
	packpool_destroy(f->pool);
	if (f->stream)
		tcuda_stream_destroy(f->s->gpu, f->stream);
	free(f->pp);
	if (f->staging_arena)
		host_tier_free_pinned(f->s->tiers[MKV_TIER_HOST], f->staging);
	else {
		if (f->staging_locked)
			munlock(f->staging, f->staging_locked);
		free(f->staging);
	}
	free(f->soff);
	if (f->dev_staging)
		tcuda_free(f->s->gpu, f->dev_staging);
#if MKV_HAVE_CUDA
	if (f->gather)
		gpu_gather_ctx_destroy(f->gather);
	free(f->bga);
#endif
	uring_engine_destroy(f->io.ring);
	free(f->pinned);
	free(f);
}

/* The kernel's share of host-tier bytes when both movers exist. */
static double s_share(const struct mkv_fetch *f)
{
	return f->pool ? f->s->fetch_kernel_share : 1.0;
}

/* Blocks in the gather kernel's first launch: it starts copying while the
 * fetch resolves the rest (which the next launch, at the end, takes). */
#define FETCH_LAUNCH_BLOCKS 512

/*
 * Phase timestamps of a fetch, for bench/tiers only: a build with
 * -DMKV_FETCH_TRACE=1 records them (clock_gettime may be a system call in
 * a VM: off by default).  trace[k] = microseconds since the call began at:
 * 1 locked, 2 phase 1 done, 3 last launch queued, 4 phase 3a done (the
 * selection recorded), 5 copies waited for, 6 return.
 */
#if MKV_FETCH_TRACE
#include <time.h>
static double fetch_now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}
#define FTRACE(f, k, t0) ((f)->trace[k] = fetch_now_us() - (t0))
void store_fetch_trace(const struct mkv_fetch *f, double out[8])
{
	memcpy(out, f->trace, sizeof f->trace);
}
#else
#define FTRACE(f, k, t0) ((void)0)
#endif

#if MKV_HAVE_CUDA
/* Queue the kernel's work list so far and start a new one. */
static int bg_flush(struct mkv_fetch *f)
{
	struct gpu_bg_args *a = f->bga;
	int rc = 0;

	if (a->nseg && a->first[a->nseg])
		rc = gpu_gather_ctx_launch_blocks(f->gather, a, f->dev_staging);
	a->nseg = 0;
	a->first[0] = 0;
	return rc;
}

/* Open an entry for segment bytes @src of layout @l whose next staged
 * block lands at staging byte @dst. */
static void bg_open(struct gpu_bg_args *a, const char *src, uint64_t dst,
		    const struct mkv_store_layout *l)
{
	struct gpu_bg_seg *g = &a->seg[a->nseg];

	*g = (struct gpu_bg_seg){
		.src = src, .dst = dst,
		.values_off = (uint32_t)l->values_off,
		.values_block = (uint32_t)l->values_block,
		.values_len = (uint32_t)l->values_len,
		.bitmaps_off = (uint32_t)l->bitmaps_off,
		.bitmaps_block = (uint32_t)l->bitmaps_block,
		.bitmaps_len = (uint32_t)l->bitmaps_len,
	};
	a->first[a->nseg + 1] = a->first[a->nseg];
	a->nseg++;
}
#endif

/* Whether tier @t's bytes can be handed out in place by this store. */
static bool in_place(const struct mkv_store *s, int t)
{
	if (t == MKV_TIER_HBM)
		return true;
	return t == MKV_TIER_HOST && (s->gpu < 0 || s->host_mapped);
}

int64_t mkv_store_fetch(struct mkv_fetch *f, const struct mkv_fetch_req *req,
			size_t n, uint64_t step, struct mkv_block_addr *out)
{
	struct mkv_store *s;
	struct seg **segs;
	size_t total_blocks = 0, staged_bytes = 0, staged = 0, o = 0;
	uint64_t tier_bytes[MKV_TIER_COUNT] = { 0 };
	int64_t rc = 0;
	/* Host-tier blocks gathered by the kernel: its work list (segments
	 * and block indices, passed by value) is built while resolving
	 * (phase 1), and the kernel runs while the rest of the fetch does its
	 * bookkeeping. */
	uint32_t npub = 0, npp = 0;
	bool kernel = false, launched = false, break_kernel = false;
#if MKV_HAVE_CUDA
	/* break_kernel by a layout the kernel cannot take, not by a device
	 * error: the context stays for the next fetch. */
	bool break_layout = false;
#endif
	/* And/or by the context's threads, into staging + async H2D: with
	 * both, segments go to one or the other by byte share, the pool's
	 * bytes laid out from the bottom of the staging (its chunks must be
	 * contiguous), the kernel's from the top, NVMe's after the pool's. */
	bool pool = false, pool_sync = false, movers;
	uint64_t pb = 0, kb = 0;
	double share;
#if MKV_HAVE_CUDA
	uint32_t queued = 0; /* blocks in the work list, launched or not */
	bool first_launch = true;
#endif

	if (!f || (!req && n) || !out)
		return -EINVAL;
#if MKV_FETCH_TRACE
	const double t0 = fetch_now_us();
#endif
	s = f->s;
	share = s_share(f);
	for (size_t i = 0; i < n; i++) {
		if (!key_valid(&req[i].key) || (!req[i].blocks && req[i].n_blocks))
			return -EINVAL;
		for (uint32_t b = 1; b < req[i].n_blocks; b++)
			if (req[i].blocks[b] <= req[i].blocks[b - 1])
				return -EINVAL;
		total_blocks += req[i].n_blocks;
	}
	if (total_blocks > UINT32_MAX / 2)
		return -EINVAL;
	mkv_fetch_release(f);
	if (f->cap_soff < total_blocks) {
		uint64_t *p = realloc(f->soff, total_blocks * sizeof *p);

		if (!p)
			return -ENOMEM;
		f->soff = p;
		f->cap_soff = total_blocks;
	}
	segs = calloc(n ? n : 1, sizeof *segs);
	if (!segs)
		return -ENOMEM;
	if (f->cap_pinned < n) {
		struct seg **p = realloc(f->pinned, n * sizeof *p);

		if (!p) {
			free(segs);
			return -ENOMEM;
		}
		f->pinned = p;
		f->cap_pinned = n;
	}
	if (f->pool && total_blocks) {
		if (f->cap_pp < 2 * total_blocks) {
			struct pp_piece *p = realloc(f->pp, 2 * total_blocks *
							     sizeof *p);

			if (!p) {
				free(segs);
				return -ENOMEM;
			}
			f->pp = p;
			f->cap_pp = (uint32_t)(2 * total_blocks);
		}
		pool = true;
		packpool_begin(f->pool, f->pp, f->staging);
	}
#if MKV_HAVE_CUDA
	if (f->gather && f->bga && s->gpu >= 0 && total_blocks) {
		kernel = true;
		f->bga->nseg = 0;
		f->bga->first[0] = 0;
	}
#endif

	/*
	 * Phase 1, under the lock: resolve, pin, lay out the staging (HBM
	 * blocks are never staged).  Host blocks the movers take get their
	 * offsets here: the pool's from 0 up, the kernel's from the top of
	 * the staging down.  Without movers the host blocks come first from
	 * 0, in request order, laid out in phase 2; NVMe blocks follow the
	 * pool's or the host blocks, also laid out in phase 2.
	 */
	pthread_mutex_lock(&s->lock);
	FTRACE(f, 1, t0);
	for (size_t i = 0; i < n; i++) {
		struct seg *g = dir_find(s, &req[i].key, false);

		if (!g) {
			rc = -ENOENT;
			break;
		}
		if (req[i].n_blocks &&
		    (!g->layout.n_blocks ||
		     req[i].blocks[req[i].n_blocks - 1] >= g->layout.n_blocks)) {
			rc = -EINVAL;
			break;
		}
		segs[i] = g;
		g->pins++; /* nothing moves or goes while we read it */
		f->pinned[f->n_pinned++] = g;
		/* Per segment, not per block: a fetch touches thousands of
		 * blocks, and these were a sixth of its CPU time. */
		const bool here = in_place(s, g->tier);
		const bool host_st = !here && g->tier == MKV_TIER_HOST;
#if MKV_HAVE_CUDA
		/* The kernel's work list holds 32-bit layouts: a segment past
		 * that sends the whole fetch down the packed path. */
		if (kernel && host_st &&
		    (g->layout.values_off > UINT32_MAX || g->layout.values_len > UINT32_MAX ||
		     g->layout.bitmaps_off > UINT32_MAX ||
		     g->layout.bitmaps_len > UINT32_MAX ||
		     g->layout.values_block > UINT32_MAX ||
		     g->layout.bitmaps_block > UINT32_MAX)) {
			kernel = false;
			break_kernel = true;
			break_layout = true;
		}
#endif
		/* The kernel takes this segment while its byte share is
		 * behind (the first one: it is slower to start). */
		const bool to_k = host_st && kernel &&
				  (!pool || share >= 1 ||
				   (share > 0 && (double)kb * (1 - share) <=
							 (double)pb * share));
		const bool to_p = host_st && pool && !to_k;
		const bool gath = to_k || to_p;
		char *const base = here || gath ? tier_addr(s->tiers[g->tier], g->obj)
					       : NULL;
		const uint8_t here_dev = (uint8_t)(s->tiers[g->tier]->device ||
						   (g->tier == MKV_TIER_HOST &&
						    s->host_mapped));

		if (gath && !base) {
			rc = -EIO;
			break;
		}
#if MKV_HAVE_CUDA
		/* The kernel's blocks of this segment land back to back from
		 * k_dst (only the last can be short: blocks are ascending),
		 * below the kernel's earlier segments at the top of the
		 * staging.  Past the staging: -ENOSPC below, never launched. */
		uint64_t k_dst = 0, k_step = (uint64_t)g->layout.values_block +
					     g->layout.bitmaps_block;
		uint32_t k_p = 0;

		if (to_k) {
			uint64_t sb = 0;

			for (uint32_t b = 0; b < req[i].n_blocks; b++) {
				uint32_t j = req[i].blocks[b];
				struct tier_range r[2];

				if (g->hot && g->hot[j])
					continue;
				block_ranges(&g->layout, j, r);
				sb += r[0].len + r[1].len;
			}
			kb += sb;
			k_dst = kb <= f->staging_len ? f->staging_len - kb : 0;
		}
		bool k_open = false;
#endif
		for (uint32_t b = 0; b < req[i].n_blocks; b++) {
			uint32_t j = req[i].blocks[b];
			struct tier_range r[2];
			struct mkv_block_addr *a = &out[o];

			f->soff[o++] = UINT64_MAX;
			block_ranges(&g->layout, j, r);
			a->values_bytes = (uint32_t)r[0].len;
			a->bitmaps_bytes = (uint32_t)r[1].len;
			if (g->hot && g->hot[j]) {
				char *p = tier_addr(s->tiers[MKV_TIER_HBM],
						    g->hot[j]);

				a->values = p;
				a->bitmaps = p + r[0].len;
				a->tier = MKV_TIER_HBM;
				a->device = (uint8_t)s->tiers[MKV_TIER_HBM]->device;
				continue;
			}
			a->tier = (uint8_t)g->tier;
			if (here) {
				a->values = base + r[0].off;
				a->bitmaps = base + r[1].off;
				a->device = here_dev;
				continue;
			}
			/* staged: host offsets now, NVMe ones in phase 2 */
			a->values = a->bitmaps = NULL;
			a->device = 0;
			if (to_p) {
				uint64_t at = pb;

				f->soff[o - 1] = at;
				if (r[0].len)
					f->pp[npp++] = (struct pp_piece){
						base + r[0].off, at, r[0].len };
				if (r[1].len)
					f->pp[npp++] = (struct pp_piece){
						base + r[1].off, at + r[0].len,
						r[1].len };
				pb += r[0].len + r[1].len;
			} else if (to_k) {
#if MKV_HAVE_CUDA
				struct gpu_bg_args *ka = f->bga;
				const uint64_t at = k_dst + k_p * k_step;

				f->soff[o - 1] = at;
				/* A full list goes now (within the staging:
				 * else it is refused below); the segment
				 * continues in the next. */
				if (ka->nseg &&
				    (ka->first[ka->nseg] >= GPU_BG_MAXBLK ||
				     (!k_open && ka->nseg >= GPU_BG_MAXSEG))) {
					if (pb + kb <= f->staging_len &&
					    !break_kernel) {
						if (bg_flush(f) == 0) {
							launched = true;
						} else {
							kernel = false;
							break_kernel = true;
						}
					}
					ka->nseg = 0;
					ka->first[0] = 0;
					k_open = false;
				}
				if (!k_open) {
					bg_open(ka, base, at, &g->layout);
					k_open = true;
				}
				ka->blk[ka->first[ka->nseg]++] = j;
				k_p++;
				queued++;
#endif
			} else {
				f->soff[o - 1] = 0;
			}
			tier_bytes[g->tier] += r[0].len + r[1].len;
			staged_bytes += r[0].len + r[1].len;
			staged++;
		}
		/* The threads start on what is laid out so far (the pool
		 * cuts a chunk once enough bytes are in), within the
		 * staging: nothing may land past it. */
		if (pool && npp > npub && pb + kb <= f->staging_len) {
			packpool_publish(f->pool, npp);
			npub = npp;
		}
#if MKV_HAVE_CUDA
		/* Start copying the first blocks while this phase resolves
		 * the rest (one more launch takes those at the end).  Bounded
		 * by the staging size first: nothing may land past it. */
		if (kernel && first_launch && queued >= FETCH_LAUNCH_BLOCKS &&
		    pb + kb <= f->staging_len) {
			first_launch = false;
			if (bg_flush(f) == 0) {
				launched = true;
			} else {
				kernel = false; /* the rest is packed */
				break_kernel = true;
			}
		}
#endif
	}
	if (!rc && staged_bytes > f->staging_len)
		rc = -ENOSPC;
	FTRACE(f, 2, t0);
	pthread_mutex_unlock(&s->lock);
	if (rc)
		goto fail;

#if MKV_HAVE_CUDA
	/*
	 * The remaining blocks.  A launch that fails leaves the host blocks
	 * to the packed path below (all of them: the packed copy rewrites
	 * the ones already queued with the same bytes), and the context is
	 * dropped for good after the wait (a device error is no reason to
	 * retry it on every step).
	 */
	if (!break_kernel && f->bga && f->bga->nseg) {
		if (bg_flush(f) == 0)
			launched = true;
		else
			break_kernel = true;
	}
	FTRACE(f, 3, t0);
#endif
	/*
	 * After a failed launch every host block is packed below, the
	 * pool's too: let the pool's chunks and copies land first (the
	 * packed layout differs and reuses the same bytes).
	 */
	if (break_kernel && pool) {
		(void)packpool_finish(f->pool, npub);
		(void)tcuda_stream_sync(s->gpu, f->stream);
		pool = false;
	}
#if MKV_HAVE_CUDA
	/* Likewise the kernel's launches made before the break: their bytes
	 * must land before the packed copy writes the same staging. */
	if (break_kernel && launched && f->gather)
		(void)gpu_gather_ctx_wait(f->gather);
#endif
	movers = (launched || pool) && !break_kernel;

	/*
	 * Phase 2: one gathered transfer per source tier for what the movers
	 * do not move: NVMe blocks from one ring submission covering every
	 * extent of every segment (gatherv), host blocks packed with memcpy
	 * when there is neither kernel nor pool.  With CUDA, one
	 * host-to-device copy of the packed part follows.  The segments are
	 * pinned: their tier and copy cannot change.
	 */
	if (staged) {
		uint64_t base[MKV_TIER_COUNT], pos, on_dev = 0;

		base[MKV_TIER_HBM] = 0; /* never staged */
		base[MKV_TIER_HOST] = 0;
		base[MKV_TIER_NVME] = movers ? pb : tier_bytes[MKV_TIER_HOST];
		if (movers)
			on_dev = pb;
		for (int t = 0; t < MKV_TIER_COUNT && !rc; t++) {
			struct tier_gather_req *gr;
			struct tier_range *rg;
			unsigned ng = 0, nr = 0;
			int64_t got;

			if (!tier_bytes[t] || (t == MKV_TIER_HOST && movers))
				continue;
			gr = calloc(n, sizeof *gr);
			rg = calloc(2 * total_blocks, sizeof *rg);
			if (!gr || !rg) {
				free(gr);
				free(rg);
				rc = -ENOMEM;
				break;
			}
			pos = base[t];
			o = 0;
			for (size_t i = 0; i < n; i++) {
				struct seg *g = segs[i];
				unsigned r0 = nr;

				if (g->tier != t) {
					o += req[i].n_blocks;
					continue;
				}
				for (uint32_t b = 0; b < req[i].n_blocks; b++, o++) {
					if (f->soff[o] == UINT64_MAX)
						continue;
					f->soff[o] = pos;
					block_ranges(&g->layout, req[i].blocks[b],
						     &rg[nr]);
					pos += rg[nr].len + rg[nr + 1].len;
					nr += 2;
				}
				if (nr > r0)
					gr[ng++] = (struct tier_gather_req){
						g->obj, &rg[r0], nr - r0 };
			}
			got = tier_gatherv(s->tiers[t], &f->io, gr, ng,
					   f->staging + base[t]);
			if (got >= 0 && (uint64_t)got != tier_bytes[t])
				got = -EIO;
			if (got < 0)
				rc = got;
			free(gr);
			free(rg);
		}
		const uint64_t packed_end = base[MKV_TIER_NVME] +
					    tier_bytes[MKV_TIER_NVME];

		if (!rc && s->gpu >= 0 && packed_end > on_dev)
			rc = tcuda_h2d(s->gpu, (char *)f->dev_staging + on_dev,
				       f->staging + on_dev, packed_end - on_dev);
		if (!rc) {
			char *sbase = s->gpu >= 0 ? f->dev_staging : f->staging;

			for (size_t b = 0; b < total_blocks; b++) {
				if (f->soff[b] == UINT64_MAX)
					continue;
				out[b].values = sbase + f->soff[b];
				out[b].bitmaps = sbase + f->soff[b] +
						 out[b].values_bytes;
				out[b].device = s->gpu >= 0;
			}
		}
	}

	/*
	 * The threads' part: wait until every chunk is packed and its copy
	 * queued (the caller helps), then record the selection while the
	 * copy engine finishes, then wait for it.  An error queueing a copy
	 * fails the fetch before any statistic changes.
	 */
	if (pool) {
		int pr = packpool_finish(f->pool, npp);

		pool = false; /* finished: the fail path must not again */
		if (pr) {
			(void)tcuda_stream_sync(s->gpu, f->stream);
			rc = rc ? rc : pr;
		} else {
			pool_sync = true;
		}
	}

	/* Phase 3a: record the selection while the kernel or the copy
	 * engine copies. */
	pthread_mutex_lock(&s->lock);
	if (!rc) {
		if (step > s->step)
			s->step = step;
		for (size_t i = 0; i < n; i++) {
			struct seg *g = segs[i];

			policy_touch(&s->pol, &g->st, req[i].n_blocks, step);
			for (uint32_t b = 0; b < req[i].n_blocks; b++)
				policy_touch(&s->pol, &g->bst[req[i].blocks[b]], 1,
					     step);
		}
		s->c.fetches++;
		s->c.fetch_blocks += total_blocks;
		s->c.fetch_blocks_staged += staged;
	}
	pthread_mutex_unlock(&s->lock);
	FTRACE(f, 4, t0);

	if (pool_sync) {
		int sr = tcuda_stream_sync(s->gpu, f->stream);

		if (!rc && sr)
			rc = sr;
		if (!sr) {
			struct tier *t = s->tiers[MKV_TIER_HOST];

			atomic_fetch_add(&t->st.gathers, 1);
			atomic_fetch_add(&t->st.bytes_out, pb);
		}
	}
#if MKV_HAVE_CUDA
	/* The kernel reads the pinned segments: wait before unpinning. */
	if (launched) {
		int wr = gpu_gather_ctx_wait(f->gather);

		if (wr || (break_kernel && !break_layout)) {
			gpu_gather_ctx_destroy(f->gather);
			f->gather = NULL;
			if (!rc && !break_kernel)
				rc = wr;
		} else if (!break_kernel) {
			struct tier *t = s->tiers[MKV_TIER_HOST];

			/* one gather per fetch, whichever movers ran */
			if (!pool_sync)
				atomic_fetch_add(&t->st.gathers, 1);
			atomic_fetch_add(&t->st.bytes_out, kb);
		}
	} else if (break_kernel && !break_layout) {
		gpu_gather_ctx_destroy(f->gather);
		f->gather = NULL;
	}
#endif
	FTRACE(f, 5, t0);
	if (rc)
		goto fail;

	/* Phase 3b: keep pins only on segments whose addresses were handed
	 * out in place (staged copies are ours). */
	pthread_mutex_lock(&s->lock);
	{
		size_t keep = 0;

		o = 0;
		for (size_t i = 0; i < n; i++) {
			bool in_place_any = false;

			for (uint32_t b = 0; b < req[i].n_blocks; b++, o++)
				in_place_any |= f->soff[o] == UINT64_MAX;
			if (in_place_any)
				f->pinned[keep++] = segs[i];
			else
				segs[i]->pins--;
		}
		f->n_pinned = keep;
	}
	pthread_mutex_unlock(&s->lock);
	free(segs);
	FTRACE(f, 6, t0);
	return (int64_t)staged;

fail:
	/* Chunks already published read the pinned segments: let them and
	 * their copies finish before the pins go. */
	if (pool) {
		(void)packpool_finish(f->pool, npub);
		(void)tcuda_stream_sync(s->gpu, f->stream);
	}
#if MKV_HAVE_CUDA
	/* A launch made before a later error still reads the pinned
	 * segments: let it finish before the pins go. */
	if (launched && f->gather)
		(void)gpu_gather_ctx_wait(f->gather);
#endif
	pthread_mutex_lock(&s->lock);
	s->c.last_error = rc;
	pthread_mutex_unlock(&s->lock);
	mkv_fetch_release(f);
	free(segs);
	return rc;
}

int mkv_store_prefetch(struct mkv_store *s, const struct mkv_fetch_req *req,
		       size_t n, uint64_t step, mkv_store_cb cb, void *arg)
{
	struct job *j;

	if (!s || (!req && n) || !cb)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!key_valid(&req[i].key) || (!req[i].blocks && req[i].n_blocks))
			return -EINVAL;
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < n; i++) {
		if (!dir_find(s, &req[i].key, false)) {
			pthread_mutex_unlock(&s->lock);
			return -ENOENT;
		}
	}
	pthread_mutex_unlock(&s->lock);
	j = calloc(1, sizeof *j);
	if (!j)
		return -ENOMEM;
	j->reqs = calloc(n ? n : 1, sizeof *j->reqs);
	if (!j->reqs) {
		free(j);
		return -ENOMEM;
	}
	j->n = n;
	for (size_t i = 0; i < n; i++) {
		uint32_t *b = malloc((req[i].n_blocks ? req[i].n_blocks : 1) *
				     sizeof *b);

		if (!b) {
			free_reqs(j->reqs, n);
			free(j);
			return -ENOMEM;
		}
		memcpy(b, req[i].blocks, req[i].n_blocks * sizeof *b);
		j->reqs[i] = req[i];
		j->reqs[i].blocks = b;
	}
	j->kind = JOB_PREFETCH;
	j->step = step;
	j->cb = cb;
	j->arg = arg;
	pthread_mutex_lock(&s->lock);
	enqueue(s, j);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Stats                                                                   */

int mkv_store_get_stats(struct mkv_store *s, struct mkv_store_stats *st)
{
	struct mkv_store_stats v;

	/* This version's size, or the one before balance_skipped (callers
	 * built against that header keep working and get what they know). */
	size_t want = st ? st->size : 0;
	if (!s || !st ||
	    (want != sizeof(*st) && want != offsetof(struct mkv_store_stats, balance_skipped)))
		return -EINVAL;
	memset(&v, 0, sizeof v);
	v.size = want;
	pthread_mutex_lock(&s->lock);
	for (int t = 0; t < MKV_TIER_COUNT; t++) {
		struct tier_stats ts;
		struct mkv_tier_stats *o = &v.tier[t];

		if (!s->tiers[t])
			continue;
		tier_get_stats(s->tiers[t], &ts);
		o->present = 1;
		o->on_device = (uint32_t)s->tiers[t]->device;
		o->capacity = s->tiers[t]->capacity;
		o->used = tier_used(s->tiers[t]);
		o->segments = s->c.segments[t];
		o->puts = ts.puts;
		o->put_errors = ts.put_errors;
		o->gets = ts.gets + ts.gathers;
		o->get_errors = ts.get_errors;
		o->bytes_in = ts.bytes_in;
		o->bytes_out = ts.bytes_out;
	}
	v.moves_done = s->c.moves_done;
	v.moves_failed = s->c.moves_failed;
	memcpy(v.move_errors, s->c.move_errors, sizeof v.move_errors);
	v.verify_failures = s->c.verify_failures;
	v.last_error = s->c.last_error;
	v.balances = s->c.balances;
	v.fetches = s->c.fetches;
	v.fetch_blocks = s->c.fetch_blocks;
	v.fetch_blocks_staged = s->c.fetch_blocks_staged;
	v.hot_blocks = s->hot_blocks;
	v.hot_bytes = s->hot_used;
	v.hot_admitted = s->c.hot_admitted;
	v.hot_evicted = s->c.hot_evicted;
	v.reopen_adopted = s->c.reopen_adopted;
	v.reopen_corrupt = s->c.reopen_corrupt;
	v.reopen_incomplete = s->c.reopen_incomplete;
	v.move_batches = s->c.move_batches;
	v.balance_skipped = s->c.balance_skipped;
	pthread_mutex_unlock(&s->lock);
	if (s->tiers[MKV_TIER_HOST]) {
		v.pinned_host_bytes = host_tier_pinned_bytes(s->tiers[MKV_TIER_HOST]);
		v.host_jemalloc = (uint32_t)host_tier_uses_jemalloc(
			s->tiers[MKV_TIER_HOST]);
	}
	memcpy(st, &v, want);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Fetches driven from the device                                          */

struct mkv_devmap {
	struct mkv_store *s;
	struct seg **segs;  /* pinned, one per key */
	size_t n;
	uint64_t blocks, slot;
	uint32_t *hits;     /* host, per block: collected, not yet recorded */
	/* The last pointers found device-readable (sel, count, staging,
	 * out): a decode loop passes the same ones every step, and each
	 * check is a driver call. */
	const void *ok[4];
#if MKV_HAVE_CUDA
	struct gpu_devmap *g;
#endif
};

#if MKV_HAVE_CUDA
_Static_assert(sizeof(struct gpu_dm_addr) == sizeof(struct mkv_block_addr) &&
		       offsetof(struct gpu_dm_addr, values) ==
			       offsetof(struct mkv_block_addr, values) &&
		       offsetof(struct gpu_dm_addr, bitmaps) ==
			       offsetof(struct mkv_block_addr, bitmaps) &&
		       offsetof(struct gpu_dm_addr, values_bytes) ==
			       offsetof(struct mkv_block_addr, values_bytes) &&
		       offsetof(struct gpu_dm_addr, bitmaps_bytes) ==
			       offsetof(struct mkv_block_addr, bitmaps_bytes) &&
		       offsetof(struct gpu_dm_addr, tier) ==
			       offsetof(struct mkv_block_addr, tier) &&
		       offsetof(struct gpu_dm_addr, device) ==
			       offsetof(struct mkv_block_addr, device),
	       "the kernel writes struct mkv_block_addr as struct gpu_dm_addr");

/* Waits for the promotions a map submits. */
struct dm_wait {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned left;
	int err;
};

static void dm_moved(void *arg, int status)
{
	struct dm_wait *w = arg;

	pthread_mutex_lock(&w->mu);
	if (status && status != -EALREADY && !w->err)
		w->err = status;
	w->left--;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

/* Promote the NVMe segments among @keys to host memory and wait for the
 * moves.  Returns 0 or the first failure of a move. */
static int dm_promote(struct mkv_store *s, const struct mkv_seg_key *keys, size_t n)
{
	struct dm_wait w = { .left = 0, .err = 0 };
	int rc = 0, busy = 0;

	pthread_mutex_init(&w.mu, NULL);
	pthread_cond_init(&w.cv, NULL);
	for (size_t i = 0; i < n && !rc; i++) {
		struct seg *g;
		int tier;

		pthread_mutex_lock(&s->lock);
		g = dir_find(s, &keys[i], false);
		tier = g ? g->tier : -1;
		pthread_mutex_unlock(&s->lock);
		if (tier != MKV_TIER_NVME)
			continue; /* gone: the caller's next look reports it */
		pthread_mutex_lock(&w.mu);
		w.left++;
		pthread_mutex_unlock(&w.mu);
		int mr = mkv_store_move(s, &keys[i], MKV_TIER_HOST, dm_moved, &w);

		if (mr) {
			pthread_mutex_lock(&w.mu);
			w.left--;
			pthread_mutex_unlock(&w.mu);
			if (mr == -EBUSY)
				busy = 1; /* already moving: let it end */
			else if (mr != -EALREADY)
				rc = mr;
		}
	}
	pthread_mutex_lock(&w.mu);
	while (w.left)
		pthread_cond_wait(&w.cv, &w.mu);
	pthread_mutex_unlock(&w.mu);
	pthread_mutex_destroy(&w.mu);
	pthread_cond_destroy(&w.cv);
	if (!rc && busy)
		(void)mkv_store_drain(s);
	return rc ? rc : w.err;
}
#endif

static void dm_unpin(struct mkv_devmap *m, size_t n)
{
	pthread_mutex_lock(&m->s->lock);
	for (size_t i = 0; i < n; i++)
		m->segs[i]->pins--;
	pthread_mutex_unlock(&m->s->lock);
}

int mkv_devmap_create(struct mkv_store *s, const struct mkv_seg_key *keys, size_t n,
		      struct mkv_devmap **out)
{
	if (!s || !keys || !out || n == 0 || n > UINT32_MAX)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!key_valid(&keys[i]))
			return -EINVAL;
#if !MKV_HAVE_CUDA
	return -MKV_ENODEV;
#else
	struct mkv_devmap *m;
	struct gpu_dm_seg *t;
	int rc = 0;
	size_t pinned = 0;

	if (s->gpu < 0 || !s->tiers[MKV_TIER_HBM]->device)
		return -MKV_ENODEV;
	m = calloc(1, sizeof *m);
	t = calloc(n, sizeof *t);
	if (!m || !t || !(m->segs = calloc(n, sizeof *m->segs))) {
		free(t);
		free(m);
		return -ENOMEM;
	}
	m->s = s;
	m->n = n;
	/* Pin everything once nothing is on NVMe; a balance may send a
	 * segment back down between the promotion and the pin: retry. */
	for (int attempt = 0;; attempt++) {
		bool nvme = false;

		pthread_mutex_lock(&s->lock);
		for (size_t i = 0; i < n && !rc; i++) {
			struct seg *g = dir_find(s, &keys[i], false);

			if (!g)
				rc = -ENOENT;
			else if (!g->layout.n_blocks)
				rc = -EINVAL;
			else if (g->tier == MKV_TIER_NVME && g->pins)
				rc = -EBUSY; /* pinned there by someone else */
			else if (g->tier == MKV_TIER_NVME)
				nvme = true;
		}
		if (!rc && !nvme) {
			for (size_t i = 0; i < n; i++) {
				m->segs[i] = dir_find(s, &keys[i], false);
				m->segs[i]->pins++;
			}
			pinned = n;
		}
		pthread_mutex_unlock(&s->lock);
		if (rc || !nvme)
			break;
		if (attempt == 3) {
			rc = -EAGAIN;
			break;
		}
		rc = dm_promote(s, keys, n);
		if (rc)
			break;
	}
	if (rc)
		goto fail;

	/* Pinned: tier and copy are fixed, and readable without the lock. */
	uint64_t first = 0, slot = 0;
	const bool host_ok = tcuda_host_ptr_usable(s->gpu);

	for (size_t i = 0; i < n && !rc; i++) {
		const struct seg *g = m->segs[i];
		const struct mkv_store_layout *l = &g->layout;
		const char *src = tier_addr(s->tiers[g->tier], g->obj);

		if (!src) {
			rc = -EIO;
			break;
		}
		if (g->tier == MKV_TIER_HOST && (!host_ok || !tcuda_is_mapped_host(src))) {
			rc = -EOPNOTSUPP;
			break;
		}
		if (l->values_block > UINT32_MAX || l->bitmaps_block > UINT32_MAX) {
			rc = -EINVAL;
			break;
		}
		t[i] = (struct gpu_dm_seg){
			.src = src, .first = first,
			.values_off = l->values_off, .values_len = l->values_len,
			.bitmaps_off = l->bitmaps_off, .bitmaps_len = l->bitmaps_len,
			.values_block = (uint32_t)l->values_block,
			.bitmaps_block = (uint32_t)l->bitmaps_block,
			.n_blocks = l->n_blocks,
			.copy = (uint8_t)(g->tier != MKV_TIER_HBM),
			.tier = (uint8_t)g->tier,
		};
		first += l->n_blocks;
		if (t[i].copy && l->values_block + l->bitmaps_block > slot)
			slot = l->values_block + l->bitmaps_block;
	}
	if (!rc && first > UINT32_MAX)
		rc = -EINVAL;
	if (rc)
		goto fail;
	m->blocks = first;
	/* 16-byte slots keep every copy on the kernel's wide path */
	m->slot = slot ? (slot + 15) & ~(uint64_t)15 : 16;
	m->hits = calloc(first, sizeof *m->hits);
	if (!m->hits) {
		rc = -ENOMEM;
		goto fail;
	}
	rc = gpu_devmap_create(s->gpu, t, (uint32_t)n, &m->g);
	if (rc)
		goto fail;
	free(t);
	*out = m;
	return 0;
fail:
	if (pinned)
		dm_unpin(m, pinned);
	free(m->hits);
	free(m->segs);
	free(m);
	free(t);
	return rc;
#endif
}

void mkv_devmap_destroy(struct mkv_devmap *m)
{
	if (!m)
		return;
#if MKV_HAVE_CUDA
	/* waits for the kernels that read the pinned segments */
	gpu_devmap_destroy(m->g);
#endif
	dm_unpin(m, m->n);
	free(m->hits);
	free(m->segs);
	free(m);
}

uint64_t mkv_devmap_blocks(const struct mkv_devmap *m)
{
	return m ? m->blocks : 0;
}

uint64_t mkv_devmap_slot_bytes(const struct mkv_devmap *m)
{
	return m ? m->slot : 0;
}

int mkv_devmap_fetch(struct mkv_devmap *m, const uint32_t *sel, const uint32_t *count,
		     uint32_t max_sel, void *staging, size_t staging_bytes,
		     struct mkv_block_addr *out, void *stream)
{
	if (!m || !sel || !staging || !out)
		return -EINVAL;
	if (max_sel == 0)
		return 0;
	if (staging_bytes / m->slot < max_sel)
		return -ENOSPC;
#if MKV_HAVE_CUDA
	const int dev = m->s->gpu;

	/* A host pointer handed to the kernel would fault the whole context:
	 * refuse it here instead.  (A freed allocation cannot be told from a
	 * live one by any check: that stays the caller's to avoid.) */
	const void *const ptr[4] = { sel, count, staging, out };

	for (int i = 0; i < 4; i++) {
		if (!ptr[i] || ptr[i] == m->ok[i])
			continue;
		if (!tcuda_device_readable(dev, ptr[i]))
			return -EINVAL;
		m->ok[i] = ptr[i];
	}
	return gpu_devmap_gather(m->g, sel, count, max_sel, staging, m->slot,
				 (struct gpu_dm_addr *)out, (struct CUstream_st *)stream);
#else
	(void)count;
	(void)stream;
	return -MKV_ENODEV; /* no map exists without CUDA */
#endif
}

int64_t mkv_devmap_sync(struct mkv_devmap *m, uint64_t step)
{
	uint64_t refused = 0;

	if (!m)
		return -EINVAL;
#if MKV_HAVE_CUDA
	int rc = gpu_devmap_collect(m->g, m->hits, &refused);

	if (rc)
		return rc;
#endif
	struct mkv_store *s = m->s;
	uint64_t b0 = 0, total = 0, staged = 0;

	pthread_mutex_lock(&s->lock);
	if (step > s->step)
		s->step = step;
	for (size_t i = 0; i < m->n; i++) {
		struct seg *g = m->segs[i];
		uint64_t sum = 0;

		for (uint32_t j = 0; j < g->layout.n_blocks; j++) {
			uint32_t h = m->hits[b0 + j];

			if (h) {
				policy_touch(&s->pol, &g->bst[j], h, step);
				sum += h;
				m->hits[b0 + j] = 0;
			}
		}
		if (sum)
			policy_touch(&s->pol, &g->st, (uint32_t)(sum < UINT32_MAX ? sum : UINT32_MAX),
				     step);
		total += sum;
		if (g->tier != MKV_TIER_HBM)
			staged += sum;
		b0 += g->layout.n_blocks;
	}
	if (total) {
		s->c.fetches++;
		s->c.fetch_blocks += total;
		s->c.fetch_blocks_staged += staged;
	}
	pthread_mutex_unlock(&s->lock);
	return (int64_t)refused;
}
