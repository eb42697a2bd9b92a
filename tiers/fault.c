/* SPDX-License-Identifier: MIT */
/*
 * tiers/fault.c — a tier that wraps another and injects failures through
 * the vtable (never through #ifdef in production code).  Tests only.
 *
 * put faults model the write side of a boundary (ENOSPC, EIO, allocation
 * failure, a short write that stores half the payload, a bit flipped on the
 * way down); get/gather faults model the read side (EIO, short read, a bit
 * flipped on the way up).  A silently corrupted or short copy is stored as
 * if it succeeded: catching it is the store's verification's job.
 */
#include "tiers/tier.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct fault_arm {
	int armed;
	unsigned calls; /* calls of this op since arming */
	unsigned nth, count;
	enum fault_kind kind;
	int err;
};

struct fault_tier {
	struct tier base;
	struct tier *inner;
	pthread_mutex_t lock;
	struct fault_arm arm[FAULT_OP_COUNT];
	_Atomic uint64_t injected;
};

static struct fault_tier *fault_of(struct tier *t)
{
	return container_of(t, struct fault_tier, base);
}

/* Whether this call of @op fails, and how. */
static int fault_fire(struct fault_tier *f, enum fault_op op,
		      enum fault_kind *kind, int *err)
{
	struct fault_arm *a = &f->arm[op];
	int fire = 0;

	pthread_mutex_lock(&f->lock);
	if (a->armed) {
		a->calls++;
		if (a->calls >= a->nth &&
		    (a->count == 0 || a->calls < a->nth + a->count)) {
			fire = 1;
			*kind = a->kind;
			*err = a->err;
		}
	}
	pthread_mutex_unlock(&f->lock);
	if (fire)
		atomic_fetch_add(&f->injected, 1);
	return fire;
}

/* The inner tier's accounting is what counts: mirror it. */
static void fault_sync_used(struct fault_tier *f)
{
	atomic_store(&f->base.used, tier_used(f->inner));
}

static int fault_put(struct tier *t, struct tier_io *io,
		     const struct tier_meta *m, const void *src,
		     struct tier_obj **out)
{
	struct fault_tier *f = fault_of(t);
	enum fault_kind kind;
	int err, rc;

	if (!fault_fire(f, FAULT_OP_PUT, &kind, &err)) {
		rc = tier_put(f->inner, io, m, src, out);
		fault_sync_used(f);
		return rc;
	}
	switch (kind) {
	case FAULT_ERRNO:
		return err ? -err : -EIO;
	case FAULT_NOMEM:
		return -ENOMEM;
	case FAULT_BITFLIP: {
		char *copy = malloc(m->len);

		if (!copy)
			return -ENOMEM;
		memcpy(copy, src, m->len);
		copy[m->len / 2] ^= 0x04;
		rc = tier_put(f->inner, io, m, copy, out);
		free(copy);
		fault_sync_used(f);
		return rc;
	}
	case FAULT_SHORT: {
		struct tier_meta half = *m;

		half.len = m->len > 1 ? m->len / 2 : 1;
		rc = tier_put(f->inner, io, &half, src, out);
		if (rc == 0)
			(*out)->meta.len = half.len; /* what really is there */
		fault_sync_used(f);
		return rc;
	}
	}
	return -EIO;
}

/* Batched calls: the fault applies per item, as if put()/get() each
 * (a batch is many calls of the op). */
static int fault_putv(struct tier *t, struct tier_io *io,
		      const struct tier_meta *m, const void *const *src,
		      unsigned n, struct tier_obj **out, int *rcs)
{
	int first = 0;

	for (unsigned i = 0; i < n; i++) {
		rcs[i] = t->ops->put(t, io, &m[i], src[i], &out[i]);
		if (rcs[i] && !first)
			first = rcs[i];
	}
	return first;
}

static int fault_getv(struct tier *t, struct tier_io *io, struct tier_obj **o,
		      void **dst, const size_t *cap, unsigned n, int64_t *res)
{
	int first = 0;

	for (unsigned i = 0; i < n; i++) {
		res[i] = t->ops->get(t, io, o[i], dst[i], cap[i]);
		if (res[i] < 0 && !first)
			first = (int)res[i];
	}
	return first;
}

/* A read fault the wrapper answers without the inner tier: -errno, or 0
 * when the read must go through (bit flip, short read). */
static int64_t read_fault_early(enum fault_kind kind, int err)
{
	if (kind == FAULT_ERRNO)
		return err ? -err : -EIO;
	if (kind == FAULT_NOMEM)
		return -ENOMEM;
	return 0;
}

/* Corrupt what the inner tier read into @dst (@rc bytes), as armed. */
static int64_t read_fault_late(enum fault_kind kind, void *dst, int64_t rc)
{
	if (rc <= 0)
		return rc;
	if (kind == FAULT_BITFLIP)
		((char *)dst)[rc / 2] ^= 0x10;
	else if (kind == FAULT_SHORT)
		rc /= 2;
	return rc;
}

static int64_t fault_get(struct tier *t, struct tier_io *io,
			 struct tier_obj *o, void *dst, size_t cap)
{
	struct fault_tier *f = fault_of(t);
	enum fault_kind kind;
	int err;
	int64_t rc;

	if (!fault_fire(f, FAULT_OP_GET, &kind, &err))
		return tier_get(f->inner, io, o, dst, cap);
	if ((rc = read_fault_early(kind, err)))
		return rc;
	return read_fault_late(kind, dst, tier_get(f->inner, io, o, dst, cap));
}

static int64_t fault_gather(struct tier *t, struct tier_io *io,
			    struct tier_obj *o, const struct tier_range *r,
			    unsigned n, void *dst)
{
	struct fault_tier *f = fault_of(t);
	enum fault_kind kind;
	int err;
	int64_t rc;

	if (!fault_fire(f, FAULT_OP_GATHER, &kind, &err))
		return tier_gather(f->inner, io, o, r, n, dst);
	if ((rc = read_fault_early(kind, err)))
		return rc;
	return read_fault_late(kind, dst, tier_gather(f->inner, io, o, r, n, dst));
}

static int64_t fault_gatherv(struct tier *t, struct tier_io *io,
			     const struct tier_gather_req *rq, unsigned n,
			     void *dst)
{
	struct fault_tier *f = fault_of(t);
	enum fault_kind kind;
	int err;
	int64_t rc;

	if (!fault_fire(f, FAULT_OP_GATHER, &kind, &err))
		return tier_gatherv(f->inner, io, rq, n, dst);
	if ((rc = read_fault_early(kind, err)))
		return rc;
	return read_fault_late(kind, dst, tier_gatherv(f->inner, io, rq, n, dst));
}

static void *fault_addr(struct tier *t, struct tier_obj *o)
{
	return tier_addr(fault_of(t)->inner, o);
}

static void fault_drop(struct tier *t, struct tier_io *io, struct tier_obj *o)
{
	struct fault_tier *f = fault_of(t);

	tier_drop(f->inner, io, o);
	fault_sync_used(f);
}

static void fault_forget(struct tier *t, struct tier_obj *o)
{
	struct fault_tier *f = fault_of(t);

	tier_forget(f->inner, o);
	fault_sync_used(f);
}

static int fault_scan(struct tier *t, struct tier_io *io, tier_scan_cb cb,
		      void *arg)
{
	struct fault_tier *f = fault_of(t);
	int rc;

	if (!f->inner->ops->scan)
		return 0;
	rc = f->inner->ops->scan(f->inner, io, cb, arg);
	fault_sync_used(f);
	return rc;
}

static void fault_destroy(struct tier *t)
{
	struct fault_tier *f = fault_of(t);

	tier_destroy(f->inner);
	pthread_mutex_destroy(&f->lock);
	free(f);
}

static const struct tier_ops fault_ops = {
	.name = "fault",
	.put = fault_put,
	.get = fault_get,
	.putv = fault_putv,
	.getv = fault_getv,
	.gather = fault_gather,
	.gatherv = fault_gatherv,
	.addr = fault_addr,
	.drop = fault_drop,
	.forget = fault_forget,
	.scan = fault_scan,
	.destroy = fault_destroy,
};

int fault_tier_create(struct tier *inner, struct tier **out)
{
	struct fault_tier *f;

	if (!inner || !out)
		return -EINVAL;
	f = calloc(1, sizeof *f);
	if (!f)
		return -ENOMEM;
	tier_init(&f->base, &fault_ops, inner->capacity);
	f->base.device = inner->device;
	f->base.persistent = inner->persistent;
	f->inner = inner;
	pthread_mutex_init(&f->lock, NULL);
	atomic_init(&f->injected, 0);
	*out = &f->base;
	return 0;
}

void fault_tier_arm(struct tier *t, enum fault_op op, unsigned nth,
		    enum fault_kind kind, int err, unsigned count)
{
	struct fault_tier *f;

	if (!t || t->ops != &fault_ops || op >= FAULT_OP_COUNT)
		return;
	f = fault_of(t);
	pthread_mutex_lock(&f->lock);
	f->arm[op] = (struct fault_arm){ .armed = 1, .calls = 0,
		.nth = nth ? nth : 1, .count = count, .kind = kind,
		.err = err };
	pthread_mutex_unlock(&f->lock);
}

void fault_tier_disarm(struct tier *t)
{
	struct fault_tier *f;

	if (!t || t->ops != &fault_ops)
		return;
	f = fault_of(t);
	pthread_mutex_lock(&f->lock);
	memset(f->arm, 0, sizeof f->arm);
	pthread_mutex_unlock(&f->lock);
}

uint64_t fault_tier_injected(const struct tier *t)
{
	if (!t || t->ops != &fault_ops)
		return 0;
	return atomic_load(&fault_of((struct tier *)t)->injected);
}
