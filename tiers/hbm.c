/* SPDX-License-Identifier: MIT */
/*
 * tiers/hbm.c — the top tier.  One region per store (one cudaMalloc when a
 * device is usable, host memory otherwise), carved by size class so the
 * decode path never calls the CUDA allocator.
 *
 * Size classes: 256, 512, 768, 1024, then four per power of two
 * (1280, 1536, 1792, 2048, 2560, ...): internal waste below 25%.  Freed
 * blocks go to their class's free list and are reused by that class only;
 * fresh space comes from a bump pointer.  Segments of one model have few
 * distinct sizes, so per-class reuse keeps external fragmentation low; a
 * workload that changes sizes can exhaust the bump space before the budget
 * (put then fails with -ENOMEM and the store keeps the data below).
 * Metadata (free lists) lives on the host: the region may be device memory.
 */
#include "tiers/tier.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tiers/tcuda.h"

#define HBM_MIN_CLASS 256u

struct hbm_block {
	struct tier_obj base;
	size_t off;
	unsigned cls;
};

struct hbm_freelist {
	size_t *off;
	size_t n, cap;
};

struct hbm_tier {
	struct tier base;
	int gpu;       /* device index, or -1 for host memory */
	char *region;
	size_t region_len;
	pthread_mutex_t lock; /* bump, free lists */
	size_t bump;
	unsigned n_cls;
	size_t *cls_size;
	struct hbm_freelist *fl;
};

static struct hbm_tier *hbm_of(struct tier *t)
{
	return container_of(t, struct hbm_tier, base);
}

static unsigned hbm_class(const struct hbm_tier *h, size_t len)
{
	unsigned lo = 0, hi = h->n_cls; /* first class >= len */

	while (lo < hi) {
		unsigned mid = (lo + hi) / 2;

		if (h->cls_size[mid] < len)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo; /* == n_cls: larger than the region */
}

static int hbm_copy_in(struct hbm_tier *h, size_t off, const void *src,
		       size_t len)
{
	if (h->gpu >= 0)
		return tcuda_h2d(h->gpu, h->region + off, src, len);
	memcpy(h->region + off, src, len);
	return 0;
}

static int hbm_copy_out(struct hbm_tier *h, void *dst, size_t off, size_t len)
{
	if (h->gpu >= 0)
		return tcuda_d2h(h->gpu, dst, h->region + off, len);
	memcpy(dst, h->region + off, len);
	return 0;
}

static int hbm_put(struct tier *t, struct tier_io *io,
		   const struct tier_meta *m, const void *src,
		   struct tier_obj **out)
{
	struct hbm_tier *h = hbm_of(t);
	struct hbm_block *b;
	unsigned c = hbm_class(h, m->len);
	size_t off;
	int rc;

	(void)io;
	if (c >= h->n_cls)
		return -ENOMEM;
	b = calloc(1, sizeof *b);
	if (!b)
		return -ENOMEM;
	if (!tier_charge(t, h->cls_size[c])) {
		free(b);
		return -ENOMEM;
	}
	pthread_mutex_lock(&h->lock);
	if (h->fl[c].n) {
		off = h->fl[c].off[--h->fl[c].n];
	} else if (h->bump + h->cls_size[c] <= h->region_len) {
		off = h->bump;
		h->bump += h->cls_size[c];
	} else {
		pthread_mutex_unlock(&h->lock);
		tier_uncharge(t, h->cls_size[c]);
		free(b);
		return -ENOMEM;
	}
	pthread_mutex_unlock(&h->lock);
	b->base.meta = *m;
	b->base.footprint = h->cls_size[c];
	b->off = off;
	b->cls = c;
	rc = hbm_copy_in(h, off, src, m->len);
	if (rc) {
		t->ops->drop(t, io, &b->base);
		return rc;
	}
	*out = &b->base;
	return 0;
}

static int64_t hbm_get(struct tier *t, struct tier_io *io, struct tier_obj *o,
		       void *dst, size_t cap)
{
	struct hbm_block *b = container_of(o, struct hbm_block, base);
	int rc;

	(void)io;
	if (cap < o->meta.len)
		return -ENOSPC;
	rc = hbm_copy_out(hbm_of(t), dst, b->off, o->meta.len);
	return rc ? rc : (int64_t)o->meta.len;
}

static int64_t hbm_gather(struct tier *t, struct tier_io *io,
			  struct tier_obj *o, const struct tier_range *r,
			  unsigned n, void *dst)
{
	struct hbm_block *b = container_of(o, struct hbm_block, base);
	char *d = dst;
	int64_t tot = 0;

	(void)io;
	/* Gathering *from* the top tier only happens on demotion checks;
	 * on a device it is one copy per range. */
	for (unsigned i = 0; i < n; i++) {
		int rc = hbm_copy_out(hbm_of(t), d, b->off + r[i].off,
				      r[i].len);
		if (rc)
			return rc;
		d += r[i].len;
		tot += (int64_t)r[i].len;
	}
	return tot;
}

static void *hbm_addr(struct tier *t, struct tier_obj *o)
{
	struct hbm_block *b = container_of(o, struct hbm_block, base);

	return hbm_of(t)->region + b->off;
}

static void hbm_drop(struct tier *t, struct tier_io *io, struct tier_obj *o)
{
	struct hbm_tier *h = hbm_of(t);
	struct hbm_block *b = container_of(o, struct hbm_block, base);
	struct hbm_freelist *f = &h->fl[b->cls];

	(void)io;
	pthread_mutex_lock(&h->lock);
	if (b->off + h->cls_size[b->cls] == h->bump) {
		h->bump = b->off; /* top of the bump space: give it back */
	} else {
		if (f->n == f->cap) {
			size_t nc = f->cap ? 2 * f->cap : 16;
			size_t *p = realloc(f->off, nc * sizeof *p);

			if (!p) {
				/* Leak the space rather than fail a drop. */
				pthread_mutex_unlock(&h->lock);
				goto out;
			}
			f->off = p;
			f->cap = nc;
		}
		f->off[f->n++] = b->off;
	}
	pthread_mutex_unlock(&h->lock);
out:
	tier_uncharge(t, o->footprint);
	free(b);
}

static void hbm_destroy(struct tier *t)
{
	struct hbm_tier *h = hbm_of(t);

	if (h->gpu >= 0)
		tcuda_free(h->gpu, h->region);
	else if (h->region)
		munmap(h->region, h->region_len);
	for (unsigned i = 0; i < h->n_cls; i++)
		free(h->fl[i].off);
	free(h->fl);
	free(h->cls_size);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

static const struct tier_ops hbm_ops = {
	.name = "hbm",
	.put = hbm_put,
	.get = hbm_get,
	.gather = hbm_gather,
	.putv = NULL,    /* memcpy: nothing to batch */
	.getv = NULL,
	.gatherv = NULL, /* gather per object: memcpy */
	.addr = hbm_addr,
	.drop = hbm_drop,
	.forget = NULL, /* nothing outlives the process: drop */
	.scan = NULL, /* not persistent */
	.destroy = hbm_destroy,
};

int hbm_tier_create(size_t capacity, int gpu, struct tier **out)
{
	struct hbm_tier *h;
	size_t s;
	unsigned n = 0;

	if (!out || capacity < HBM_MIN_CLASS)
		return -EINVAL;
	h = calloc(1, sizeof *h);
	if (!h)
		return -ENOMEM;
	tier_init(&h->base, &hbm_ops, capacity);
	pthread_mutex_init(&h->lock, NULL);
	h->region_len = (capacity + HBM_MIN_CLASS - 1) & ~(size_t)(HBM_MIN_CLASS - 1);
	/* Count, then fill, the classes up to the region size. */
	for (s = HBM_MIN_CLASS; s <= h->region_len; n++) {
		size_t step = s < 1024 ? HBM_MIN_CLASS : (size_t)1 << (63 - __builtin_clzll(s)) >> 2;

		s += step;
	}
	h->n_cls = n;
	h->cls_size = calloc(n, sizeof *h->cls_size);
	h->fl = calloc(n, sizeof *h->fl);
	if (!h->cls_size || !h->fl)
		goto nomem;
	s = HBM_MIN_CLASS;
	for (unsigned i = 0; i < n; i++) {
		size_t step = s < 1024 ? HBM_MIN_CLASS : (size_t)1 << (63 - __builtin_clzll(s)) >> 2;

		h->cls_size[i] = s;
		s += step;
	}
	h->gpu = -1;
	if (gpu >= 0 && tcuda_usable(gpu)) {
		void *p = NULL;
		int rc = tcuda_malloc(gpu, h->region_len, &p);

		if (rc) {
			hbm_destroy(&h->base);
			return rc;
		}
		h->region = p;
		h->gpu = gpu;
		h->base.device = 1;
	} else {
		h->region = mmap(NULL, h->region_len, PROT_READ | PROT_WRITE,
				 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (h->region == MAP_FAILED) {
			h->region = NULL;
			goto nomem;
		}
	}
	*out = &h->base;
	return 0;
nomem:
	hbm_destroy(&h->base);
	return -ENOMEM;
}

int hbm_tier_on_device(const struct tier *t)
{
	return t && t->ops == &hbm_ops && t->device;
}
