/* SPDX-License-Identifier: MIT */
/*
 * tiers/host.c — pinned host RAM through a dedicated jemalloc arena.
 *
 * The arena's extent hooks map anonymous chunks, bind them to the GPU's NUMA
 * node (mbind through libnuma) and pin them: cudaHostRegister when a device
 * is usable, mlock otherwise.  Every allocation from the arena is therefore
 * already DMA-able and no segment needs its own registration.
 *
 * Chunk lifetime: the hooks never give memory back to the OS while the tier
 * lives (dalloc opts out, purge hooks are absent, so jemalloc keeps pinned
 * pages for reuse and never madvises them away); merges are refused across
 * chunk boundaries so an extent never spans two registrations.  The tier
 * records every chunk and unpins/unmaps them itself after arena.destroy.
 *
 * Limits: chunks are only mapped while the pinned total stays within the
 * pin limit (capacity + 1/4 + 8 MiB for jemalloc's slabs and retained
 * growth, plus what staging buffers asked for).  Pinned memory grows in
 * steps of capacity / 1024 (4 to 256 MiB: the built-in allocator's chunk,
 * jemalloc's retain_grow_limit), so a large tier is a thousand or so
 * chunks, not one registration per 4 MiB, and the chunk table grows with
 * it (it had a fixed 4,096 entries: a tier stopped at 16 GiB whatever its
 * capacity, found by a 1M-token bench/decode).  If pinning fails
 * (RLIMIT_MEMLOCK without CAP_IPC_LOCK, or cudaHostRegister failing) the
 * chunk is unmapped and the allocation fails: put() returns -ENOMEM.  We
 * never fall back to unpinned memory, since a later DMA from it would be
 * silently slow (pageable copies) or wrong (mapped access).
 *
 * jemalloc is found at run time, not linked: its initial-exec TLS (2.6 KB)
 * makes any dlopen() of a library that depends on it fail ("cannot
 * allocate memory in static TLS block": Python's ctypes, plugins).  So the
 * tier uses the jemalloc already in the process (linked by the program or
 * LD_PRELOADed), or dlopens it when the TLS surplus allows, and otherwise
 * falls back to a built-in allocator over the same pinned chunks: size
 * classes (4 per power of two, 256 B granularity, as in hbm.c) carved from
 * 4 MiB pinned chunks, larger blocks in chunks of their own.
 * host_tier_uses_jemalloc() says which one runs.
 */
#include "tiers/tier.h"

#include <dlfcn.h>
#include <errno.h>
#include <numa.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <jemalloc/jemalloc.h>

#include "tiers/tcuda.h"

#define HOST_CHUNKS0 16 /* the chunk table's first size; it doubles */
#define HOST_ALIGN 64
#define HOST_CHUNK ((size_t)4 << 20) /* the smallest growth step */
#define HOST_GROW_MAX ((size_t)256 << 20)
#define HOST_MIN_CLASS 256u

/* The jemalloc entry points, resolved at run time. */
struct host_je {
	void *dl;
	int (*mallctl)(const char *, void *, size_t *, void *, size_t);
	void *(*mallocx)(size_t, int);
	void (*dallocx)(void *, int);
	size_t (*nallocx)(size_t, int);
};

/* The built-in allocator's state. */
struct host_builtin {
	unsigned n_cls;
	size_t cls_size[160];
	struct { void **p; size_t n, cap; } fl[160];
	char *cur;          /* current chunk being carved */
	size_t cur_len, cur_used;
};

struct host_chunk {
	char *addr;
	size_t len;
};

struct host_obj {
	struct tier_obj base;
	void *p;
	unsigned cls;   /* built-in: size class, or UINT32_MAX: own chunk */
};

struct host_tier {
	struct tier base;
	extent_hooks_t hooks; /* jemalloc hands this back: container_of */
	unsigned arena;
	int arena_ok;
	int flags;            /* MALLOCX_ARENA | MALLOCX_TCACHE_NONE */
	int numa_node;
	int cuda;             /* pin with cudaHostRegister */
	pthread_mutex_t lock; /* chunks, pinned */
	struct host_chunk *chunks;
	unsigned n_chunks, cap_chunks;
	size_t grow;          /* pinned growth step (see the top) */
	size_t pinned, pin_limit;
	uint64_t pin_failures;
	int use_je;
	struct host_je je;
	struct host_builtin bi; /* under lock */
};

static struct host_tier *host_of_hooks(extent_hooks_t *h)
{
	return container_of(h, struct host_tier, hooks);
}

static struct host_tier *host_of(struct tier *t)
{
	return container_of(t, struct host_tier, base);
}

/*
 * Map @size bytes aligned to @alignment, bind them to the NUMA node, pin
 * them and record the chunk.  NULL when the pin limit is reached, or
 * pinning or growing the chunk table failed.  Takes h->lock itself.
 */
static char *host_map_pinned(struct host_tier *h, size_t size,
			     size_t alignment)
{
	size_t map_len;
	char *p, *a;

	if (alignment < 4096)
		alignment = 4096;
	pthread_mutex_lock(&h->lock);
	if (h->pinned + size > h->pin_limit) {
		pthread_mutex_unlock(&h->lock);
		return NULL;
	}
	h->pinned += size; /* reserve before the (slow) pinning */
	pthread_mutex_unlock(&h->lock);

	map_len = size + alignment;
	p = mmap(NULL, map_len, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		goto fail;
	a = (char *)(((uintptr_t)p + alignment - 1) & ~(uintptr_t)(alignment - 1));
	if (a > p)
		munmap(p, (size_t)(a - p));
	if (a + size < p + map_len)
		munmap(a + size, (size_t)(p + map_len - (a + size)));
	if (h->numa_node >= 0 && numa_available() >= 0)
		numa_tonode_memory(a, size, h->numa_node);
	if (h->cuda ? tcuda_host_register(a, size) != 0 : mlock(a, size) != 0) {
		munmap(a, size);
		pthread_mutex_lock(&h->lock);
		h->pin_failures++;
		pthread_mutex_unlock(&h->lock);
		goto fail;
	}
	pthread_mutex_lock(&h->lock);
	if (h->n_chunks == h->cap_chunks) {
		/* grown here, under the lock, where the slot is taken */
		unsigned nc = 2 * h->cap_chunks;
		struct host_chunk *np = realloc(h->chunks, nc * sizeof *np);

		if (!np) {
			pthread_mutex_unlock(&h->lock);
			if (h->cuda)
				tcuda_host_unregister(a);
			else
				munlock(a, size);
			munmap(a, size);
			goto fail;
		}
		h->chunks = np;
		h->cap_chunks = nc;
	}
	h->chunks[h->n_chunks].addr = a;
	h->chunks[h->n_chunks].len = size;
	h->n_chunks++;
	pthread_mutex_unlock(&h->lock);
	return a;
fail:
	pthread_mutex_lock(&h->lock);
	h->pinned -= size;
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

/* Unpin and unmap chunk @i (under h->lock). */
static void host_unmap_locked(struct host_tier *h, unsigned i)
{
	if (h->cuda)
		tcuda_host_unregister(h->chunks[i].addr);
	else
		munlock(h->chunks[i].addr, h->chunks[i].len);
	munmap(h->chunks[i].addr, h->chunks[i].len);
	h->pinned -= h->chunks[i].len;
	h->chunks[i] = h->chunks[--h->n_chunks];
}

static void *host_hook_alloc(extent_hooks_t *eh, void *new_addr, size_t size,
			     size_t alignment, bool *zero, bool *commit,
			     unsigned arena_ind)
{
	struct host_tier *h = host_of_hooks(eh);
	char *a;

	(void)arena_ind;
	if (new_addr)
		return NULL; /* cannot map at a chosen address */
	a = host_map_pinned(h, size, alignment);
	if (!a)
		return NULL;
	*zero = true;   /* fresh anonymous pages */
	*commit = true;
	return a;
}

/* ---- built-in allocator (no jemalloc in the process) ---------------- */

static void host_bi_init(struct host_builtin *bi)
{
	size_t s = HOST_MIN_CLASS;

	bi->n_cls = 0;
	while (s <= HOST_CHUNK / 4 && bi->n_cls < 160) {
		size_t step = s < 1024 ? HOST_MIN_CLASS
				       : (size_t)1 << (63 - __builtin_clzll(s)) >> 2;

		bi->cls_size[bi->n_cls++] = s;
		s += step;
	}
}

/* Footprint of @len: its class size, or its own page-rounded chunk. */
static unsigned host_bi_class(const struct host_builtin *bi, size_t len,
			      size_t *fp)
{
	for (unsigned c = 0; c < bi->n_cls; c++)
		if (bi->cls_size[c] >= len) {
			*fp = bi->cls_size[c];
			return c;
		}
	*fp = (len + 4095) & ~(size_t)4095;
	return UINT32_MAX;
}

static void *host_bi_alloc(struct host_tier *h, size_t len, unsigned *clsp)
{
	struct host_builtin *bi = &h->bi;
	size_t fp;
	unsigned c = host_bi_class(bi, len, &fp);
	void *p = NULL;

	*clsp = c;
	if (c == UINT32_MAX)
		return host_map_pinned(h, fp, 4096);
	pthread_mutex_lock(&h->lock);
	if (bi->fl[c].n) {
		p = bi->fl[c].p[--bi->fl[c].n];
	} else if (bi->cur && bi->cur_used + fp <= bi->cur_len) {
		p = bi->cur + bi->cur_used;
		bi->cur_used += fp;
	}
	pthread_mutex_unlock(&h->lock);
	if (p)
		return p;
	/* A new chunk; the rest of the old one stays unused (< 1 class). */
	char *ch = host_map_pinned(h, h->grow, 4096);

	if (!ch)
		return NULL;
	pthread_mutex_lock(&h->lock);
	bi->cur = ch;
	bi->cur_len = h->grow;
	bi->cur_used = fp;
	pthread_mutex_unlock(&h->lock);
	return ch;
}

static void host_bi_free(struct host_tier *h, void *p, unsigned c)
{
	struct host_builtin *bi = &h->bi;

	pthread_mutex_lock(&h->lock);
	if (c == UINT32_MAX) {
		for (unsigned i = 0; i < h->n_chunks; i++)
			if (h->chunks[i].addr == p) {
				host_unmap_locked(h, i);
				break;
			}
	} else {
		if (bi->fl[c].n == bi->fl[c].cap) {
			size_t nc = bi->fl[c].cap ? 2 * bi->fl[c].cap : 64;
			void **np = realloc(bi->fl[c].p, nc * sizeof *np);

			if (np) {
				bi->fl[c].p = np;
				bi->fl[c].cap = nc;
			}
		}
		if (bi->fl[c].n < bi->fl[c].cap)
			bi->fl[c].p[bi->fl[c].n++] = p;
		/* else: leaked until destroy rather than failing a free */
	}
	pthread_mutex_unlock(&h->lock);
}

/* Opt out: jemalloc keeps the (pinned) extent for reuse. */
static bool host_hook_dalloc(extent_hooks_t *eh, void *addr, size_t size,
			     bool committed, unsigned arena_ind)
{
	(void)eh; (void)addr; (void)size; (void)committed; (void)arena_ind;
	return true;
}

/* Chunks are released by host_destroy() after arena.destroy. */
static void host_hook_destroy(extent_hooks_t *eh, void *addr, size_t size,
			      bool committed, unsigned arena_ind)
{
	(void)eh; (void)addr; (void)size; (void)committed; (void)arena_ind;
}

static bool host_hook_split(extent_hooks_t *eh, void *addr, size_t size,
			    size_t size_a, size_t size_b, bool committed,
			    unsigned arena_ind)
{
	(void)eh; (void)addr; (void)size; (void)size_a; (void)size_b;
	(void)committed; (void)arena_ind;
	return false; /* splitting inside one chunk is always fine */
}

static int host_chunk_of(struct host_tier *h, const char *p)
{
	for (unsigned i = 0; i < h->n_chunks; i++)
		if (p >= h->chunks[i].addr &&
		    p < h->chunks[i].addr + h->chunks[i].len)
			return (int)i;
	return -1;
}

static bool host_hook_merge(extent_hooks_t *eh, void *addr_a, size_t size_a,
			    void *addr_b, size_t size_b, bool committed,
			    unsigned arena_ind)
{
	struct host_tier *h = host_of_hooks(eh);
	int a, b;

	(void)size_a; (void)size_b; (void)committed; (void)arena_ind;
	pthread_mutex_lock(&h->lock);
	a = host_chunk_of(h, addr_a);
	b = host_chunk_of(h, addr_b);
	pthread_mutex_unlock(&h->lock);
	return !(a >= 0 && a == b); /* true refuses */
}

static int host_put(struct tier *t, struct tier_io *io,
		    const struct tier_meta *m, const void *src,
		    struct tier_obj **out)
{
	struct host_tier *h = host_of(t);
	struct host_obj *o;
	size_t fp;

	(void)io;
	if (h->use_je)
		fp = h->je.nallocx(m->len, h->flags);
	else
		host_bi_class(&h->bi, m->len, &fp);
	if (fp == 0)
		return -ENOMEM;
	o = calloc(1, sizeof *o);
	if (!o)
		return -ENOMEM;
	if (!tier_charge(t, fp)) {
		free(o);
		return -ENOMEM;
	}
	o->p = h->use_je ? h->je.mallocx(m->len, h->flags)
			 : host_bi_alloc(h, m->len, &o->cls);
	if (!o->p) {
		tier_uncharge(t, fp);
		free(o);
		return -ENOMEM;
	}
	memcpy(o->p, src, m->len);
	o->base.meta = *m;
	o->base.footprint = fp;
	*out = &o->base;
	return 0;
}

static int64_t host_get(struct tier *t, struct tier_io *io, struct tier_obj *o,
			void *dst, size_t cap)
{
	(void)t; (void)io;
	if (cap < o->meta.len)
		return -ENOSPC;
	memcpy(dst, container_of(o, struct host_obj, base)->p, o->meta.len);
	return (int64_t)o->meta.len;
}

static int64_t host_gather(struct tier *t, struct tier_io *io,
			   struct tier_obj *o, const struct tier_range *r,
			   unsigned n, void *dst)
{
	const char *p = container_of(o, struct host_obj, base)->p;
	char *d = dst;

	(void)t; (void)io;
	for (unsigned i = 0; i < n; i++) {
		memcpy(d, p + r[i].off, r[i].len);
		d += r[i].len;
	}
	return d - (char *)dst;
}

static void *host_addr(struct tier *t, struct tier_obj *o)
{
	(void)t;
	return container_of(o, struct host_obj, base)->p;
}

static void host_drop(struct tier *t, struct tier_io *io, struct tier_obj *o)
{
	struct host_obj *ho = container_of(o, struct host_obj, base);

	struct host_tier *h = host_of(t);

	(void)io;
	if (h->use_je)
		h->je.dallocx(ho->p, h->flags);
	else
		host_bi_free(h, ho->p, ho->cls);
	tier_uncharge(t, o->footprint);
	free(ho);
}

static void host_destroy(struct tier *t)
{
	struct host_tier *h = host_of(t);

	if (h->arena_ok) {
		char name[64];

		snprintf(name, sizeof name, "arena.%u.destroy", h->arena);
		h->je.mallctl(name, NULL, NULL, NULL, 0);
	}
	while (h->n_chunks)
		host_unmap_locked(h, h->n_chunks - 1);
	for (unsigned c = 0; c < h->bi.n_cls; c++)
		free(h->bi.fl[c].p);
	if (h->je.dl)
		dlclose(h->je.dl);
	free(h->chunks);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

static const struct tier_ops host_ops = {
	.name = "host",
	.put = host_put,
	.get = host_get,
	.gather = host_gather,
	.putv = NULL,    /* memcpy: nothing to batch */
	.getv = NULL,
	.gatherv = NULL, /* gather per object: memcpy */
	.addr = host_addr,
	.drop = host_drop,
	.forget = NULL, /* nothing outlives the process: drop */
	.scan = NULL, /* not persistent */
	.destroy = host_destroy,
};

/*
 * Find jemalloc's entry points: the copy already loaded (RTLD_NOLOAD: the
 * program linked or preloaded it), else a dlopen (works when the static
 * TLS surplus is big enough).  Returns 0 or -ENOENT.
 */
static int host_je_load(struct host_je *je)
{
	static const char *const names[] = { "libjemalloc.so.2",
					     "libjemalloc.so" };
	void *dl = NULL;

	for (int pass = 0; pass < 2 && !dl; pass++)
		for (unsigned i = 0; i < 2 && !dl; i++)
			dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL |
						       (pass ? 0 : RTLD_NOLOAD));
	if (!dl)
		return -ENOENT;
	*(void **)&je->mallctl = dlsym(dl, "mallctl");
	*(void **)&je->mallocx = dlsym(dl, "mallocx");
	*(void **)&je->dallocx = dlsym(dl, "dallocx");
	*(void **)&je->nallocx = dlsym(dl, "nallocx");
	if (!je->mallctl || !je->mallocx || !je->dallocx || !je->nallocx) {
		dlclose(dl);
		memset(je, 0, sizeof *je);
		return -ENOENT;
	}
	je->dl = dl;
	return 0;
}

int host_tier_create(size_t capacity, int numa_node, int gpu,
		     struct tier **out)
{
	return host_tier_create2(capacity, numa_node, gpu, 1, out);
}

int host_tier_create2(size_t capacity, int numa_node, int gpu,
		      int use_jemalloc, struct tier **out)
{
	struct host_tier *h;
	extent_hooks_t *hp;
	size_t sz = sizeof(unsigned);
	int rc;

	if (!out || capacity == 0 || numa_node < -1)
		return -EINVAL;
	if (numa_node >= 0 && numa_available() >= 0 &&
	    numa_node > numa_max_node())
		return -EINVAL;
	h = calloc(1, sizeof *h);
	if (!h)
		return -ENOMEM;
	tier_init(&h->base, &host_ops, capacity);
	pthread_mutex_init(&h->lock, NULL);
	h->chunks = calloc(HOST_CHUNKS0, sizeof *h->chunks);
	if (!h->chunks) {
		host_destroy(&h->base);
		return -ENOMEM;
	}
	h->cap_chunks = HOST_CHUNKS0;
	h->grow = (capacity / 1024 + HOST_CHUNK - 1) & ~(HOST_CHUNK - 1);
	if (h->grow < HOST_CHUNK)
		h->grow = HOST_CHUNK;
	if (h->grow > HOST_GROW_MAX)
		h->grow = HOST_GROW_MAX;
	h->numa_node = numa_node;
	h->cuda = gpu >= 0 && tcuda_usable(gpu);
	h->pin_limit = capacity + capacity / 4 + ((size_t)8 << 20);
	h->hooks = (extent_hooks_t){
		.alloc = host_hook_alloc,
		.dalloc = host_hook_dalloc,
		.destroy = host_hook_destroy,
		.commit = NULL,       /* always committed */
		.decommit = NULL,     /* never decommit pinned pages */
		.purge_lazy = NULL,   /* never purge pinned pages */
		.purge_forced = NULL,
		.split = host_hook_split,
		.merge = host_hook_merge,
	};
	hp = &h->hooks;
	host_bi_init(&h->bi);
	if (use_jemalloc && host_je_load(&h->je) == 0) {
		rc = h->je.mallctl("arenas.create", &h->arena, &sz, &hp,
				   sizeof hp);
		if (rc) {
			host_destroy(&h->base);
			return -rc;
		}
		h->arena_ok = 1;
		h->use_je = 1;
		/* Grow retained virtual memory in steps of at most h->grow
		 * so one growth never asks for much more pinned memory than
		 * needed. */
		char name[64];
		size_t lim = h->grow;

		snprintf(name, sizeof name, "arena.%u.retain_grow_limit",
			 h->arena);
		h->je.mallctl(name, NULL, NULL, &lim, sizeof lim);
		h->flags = MALLOCX_ARENA(h->arena) | MALLOCX_TCACHE_NONE |
			   MALLOCX_ALIGN(HOST_ALIGN);
	}
	*out = &h->base;
	return 0;
}

size_t host_tier_pinned_bytes(const struct tier *t)
{
	struct host_tier *h;
	size_t v;

	if (!t || t->ops != &host_ops)
		return 0;
	h = host_of((struct tier *)t);
	pthread_mutex_lock(&h->lock);
	v = h->pinned;
	pthread_mutex_unlock(&h->lock);
	return v;
}

void *host_tier_alloc_pinned(struct tier *t, size_t len)
{
	struct host_tier *h;
	void *p;

	if (!t || t->ops != &host_ops || len == 0)
		return NULL;
	h = host_of(t);
	/* Staging is outside the payload budget: raise the pin limit. */
	pthread_mutex_lock(&h->lock);
	h->pin_limit += len + ((size_t)4 << 20);
	pthread_mutex_unlock(&h->lock);
	if (h->use_je)
		return h->je.mallocx(len, MALLOCX_ARENA(h->arena) |
					  MALLOCX_TCACHE_NONE | MALLOCX_ALIGN(4096));
	/* built-in: a chunk of its own, page-aligned */
	p = host_map_pinned(h, (len + 4095) & ~(size_t)4095, 4096);
	return p;
}

void host_tier_free_pinned(struct tier *t, void *p)
{
	struct host_tier *h;

	if (!t || !p || t->ops != &host_ops)
		return;
	h = host_of(t);
	if (h->use_je)
		h->je.dallocx(p, MALLOCX_ARENA(h->arena) | MALLOCX_TCACHE_NONE);
	else
		host_bi_free(h, p, UINT32_MAX);
}

int host_tier_uses_jemalloc(const struct tier *t)
{
	return t && t->ops == &host_ops &&
	       host_of((struct tier *)t)->use_je;
}
