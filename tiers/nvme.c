/* SPDX-License-Identifier: MIT */
/*
 * tiers/nvme.c — the bottom tier: segment frames (io/segfile) packed into a
 * few large preallocated slab files, written and read with O_DIRECT
 * through io_uring.
 *
 * Why slabs: one file per segment cost a create, a rename and a directory
 * fsync per segment (a journal commit each); at queue depth 128 that held
 * writes to a fraction of what the device does for one plain O_DIRECT
 * file.  Here the data path touches no file system metadata: frames are
 * overwritten in place inside files that already exist.
 *
 * Layout.  The directory holds "slab-NNNNNN.mkv" files.  A slab is created
 * whole: "<name>.tmp" is fallocate()d to its size, fsynced, renamed and
 * the directory fsynced, so a slab under its final name always has its full
 * size, and a leftover ".tmp" is an interrupted creation (scan removes it
 * and reports it -EINPROGRESS).  Slabs are NVME_SLAB_BYTES (less when the
 * capacity is smaller, more when one frame needs it); the first is made
 * with the tier in an empty directory, the others when space runs out
 * while their total is below the capacity.  Inside a slab frames
 * lie at 4 KiB aligned offsets; each slab keeps a free-extent list (sorted,
 * coalesced, first fit).  Every frame names its own place (slab number and
 * offset) and a generation (a per-tier counter) in its header.
 *
 * Durability of a put (the store drops the copy above only after this):
 *   1. every frame of the batch is written into its extent with O_DIRECT
 *      through the caller's ring (WRITE_FIXED from the ring's registered
 *      area when the batch fits it), later frames being encoded while the
 *      earlier ones are in flight;
 *   2. the put then joins a group commit: one fdatasync() per written
 *      slab, shared by every put and drop whose writes completed before it
 *      started.  O_DIRECT bypasses the page cache but not the device's
 *      volatile write cache, and the first write into a fallocated extent
 *      changes extent metadata (unwritten -> written): fdatasync flushes
 *      both.  put() returns 0 only after an fdatasync that started after
 *      its writes completed has returned 0;
 *   3. the store reads the payload back (O_DIRECT, checksummed) and
 *      compares its XXH3 with its own, and only then drops the copy above.
 *
 * Deletion: a tombstone by overwriting the header.  drop writes zeros over
 * the frame's first 4 KiB block and waits for a group commit covering that
 * write; only then is the extent free for reuse.  So a dropped frame is
 * never found again by a scan, even after a power loss.  If the zero block
 * cannot be written or synced, the extent is deallocated instead
 * (FALLOC_FL_PUNCH_HOLE, then fsync); if that fails too, the extent is
 * withheld from reuse for the tier's lifetime (quarantined): a device that
 * fails writes cannot promise more, and such a frame may reappear at the
 * next reopen.  A failed put scrubs the extents it wrote the same way, so
 * a frame whose put failed does not come back either.
 *
 * Reopen (scan): slabs found at create take no new frames until scanned.
 * Scan reads each slab in large chunks (skipping never-written ranges with
 * SEEK_DATA) and, at every 4 KiB boundary not inside an adopted frame,
 * looks for a frame header naming this very place.  Such a frame is
 * verified whole (header+payload checksum, lz4, payload hash) and adopted,
 * or else reported -MKV_ECORRUPT and ignored.  A write torn by a crash
 * (kill -9 or power loss mid-spill) only touches its own extent, which was
 * free: older frames stay intact, and the new frame fails its checksum or
 * has no header.  Its bytes cannot tell a torn frame from one corrupted
 * later, so both count as corrupt.  Zeroed headers, never-written space
 * and payload bytes are not frames; everything not adopted is free space.
 * Adopted frames are reported newest generation first, so a caller that
 * keeps the first of two frames with one key keeps the newest.
 *
 * Partial reads (gather) of an uncompressed frame read only the 4 KiB-
 * aligned extents covering the ranges; they are not checksummed (the
 * checksum covers the whole frame; the whole-frame read-back at write time
 * and the device's own ECC cover them).  Frames stored with lz4 are read
 * whole and verified.
 *
 * Locks, in order: ring_lock (the fallback ring, held for a whole I/O
 * step) before sync_lock before alloc_lock.  No lock is held across a scan
 * callback, and none while waiting for a group commit except sync_lock's
 * condition variable.
 */
#include "tiers/tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mosaickv/common.h>

#include "io/uring.h"

#define NVME_DEPTH 64
#define NVME_FALLBACK_BUF ((size_t)4 << 20)
#define NVME_BLK ((uint64_t)SEGFILE_ALIGN)
#define NVME_SLAB_BYTES ((uint64_t)1 << 30)
/* Encoded bytes per submission while a batch is being written: small
 * enough that the device starts early, large enough to stay batched. */
#define NVME_BATCH_BYTES ((size_t)2 << 20)
#define NVME_SCAN_CHUNK ((size_t)8 << 20)
#define NVME_NAME_MAX 48
#define NVME_MAX_ID 999999u /* six digits in the slab's name */

static uint64_t blk_up(uint64_t x)
{
	return (x + NVME_BLK - 1) & ~(NVME_BLK - 1);
}

struct nvme_ext {
	uint64_t off, len; /* bytes, 4 KiB multiples */
};

struct nvme_slab {
	int fd;
	uint32_t id;
	uint64_t size;
	int usable;           /* alloc_lock: 0 until scanned (found at create) */
	int dirty;            /* sync_lock: written since its last sync began */
	struct nvme_ext *fr;  /* alloc_lock: free extents, sorted, coalesced */
	unsigned n_fr, cap_fr;
};

struct nvme_obj {
	struct tier_obj base;
	struct nvme_slab *slab;
	uint64_t off, gen;   /* frame offset in the slab, its generation */
	uint32_t flags;      /* SEGFILE_F_* */
	uint64_t stored_len; /* payload bytes on disk */
	size_t frame_len;
};

/* One caller waiting in a group commit (on its stack). */
struct nvme_waiter {
	uint64_t ticket;
	int rc, done;
	struct nvme_waiter *next;
};

struct nvme_tier {
	struct tier base;
	int dirfd;
	int lz4;
	uint64_t slab_bytes;
	_Atomic uint64_t gen;
	pthread_mutex_t ring_lock; /* the fallback ring below */
	struct uring_engine *ring; /* for callers without their own */

	pthread_mutex_t alloc_lock; /* slabs[], free lists, the counters */
	struct nvme_slab **slabs;
	unsigned n_slabs, cap_slabs;
	uint64_t slab_total;        /* bytes in all slabs */
	uint32_t next_id;
	uint64_t quarantined;       /* bytes withheld from reuse */
	uint32_t *stale_tmp;        /* interrupted slab creations found */
	unsigned n_stale_tmp;

	pthread_mutex_t sync_lock;  /* the group commit */
	pthread_cond_t sync_cond;
	uint64_t tickets;
	int syncing;
	struct nvme_waiter *waiters;
	uint64_t syncs, commits;
};

static struct nvme_tier *nvme_of(struct tier *t)
{
	return container_of(t, struct nvme_tier, base);
}

static void slab_name(char *dst, uint32_t id, const char *ext)
{
	snprintf(dst, NVME_NAME_MAX, "slab-%06" PRIu32 ".mkv%s", id, ext);
}

/* "slab-N.mkv" or "slab-N.mkv.tmp": 0 and *@id, *@tmp; else -1. */
static int slab_parse_name(const char *name, uint32_t *id, int *tmp)
{
	char again[NVME_NAME_MAX];
	unsigned v;
	int used = 0;

	if (sscanf(name, "slab-%6u.mkv%n", &v, &used) != 1 || used == 0)
		return -1;
	*tmp = strcmp(name + used, ".tmp") == 0;
	if (!*tmp && name[used])
		return -1;
	slab_name(again, v, *tmp ? ".tmp" : "");
	if (strcmp(again, name)) /* one spelling only: "slab-000007.mkv" */
		return -1;
	*id = v;
	return 0;
}

static void place_name(char *dst, uint32_t id, uint64_t off)
{
	snprintf(dst, NVME_NAME_MAX, "slab-%06" PRIu32 ".mkv@0x%" PRIx64, id,
		 off);
}

/* ---------------------------------------------------------------------- */
/* I/O context                                                             */

/*
 * One operation's I/O context: the caller's ring (a worker's), or the
 * tier's fallback ring held under ring_lock until nvme_end(); and a bounce
 * buffer of @need bytes, which is the ring's registered area when it fits
 * (READ_FIXED / WRITE_FIXED: no per-I/O page pinning), else an aligned
 * allocation.
 */
struct nvme_ctx {
	struct nvme_tier *n;
	struct uring_engine *ring;
	int locked;
	char *bounce;
	int bounce_owned;
};

static int nvme_begin(struct nvme_ctx *c, struct nvme_tier *n,
		      struct tier_io *io, size_t need)
{
	size_t alen = 0;
	char *area;

	c->n = n;
	c->locked = 0;
	if (io && io->ring) {
		c->ring = io->ring;
	} else {
		pthread_mutex_lock(&n->ring_lock);
		c->locked = 1;
		c->ring = n->ring;
	}
	area = uring_engine_buf(c->ring, &alen);
	c->bounce_owned = !(area && alen >= need);
	if (c->bounce_owned) {
		c->bounce = NULL;
		if (posix_memalign((void **)&c->bounce, SEGFILE_ALIGN,
				   need ? need : SEGFILE_ALIGN)) {
			if (c->locked)
				pthread_mutex_unlock(&n->ring_lock);
			return -ENOMEM;
		}
	} else {
		c->bounce = area;
	}
	return 0;
}

static void nvme_end(struct nvme_ctx *c)
{
	if (c->bounce_owned)
		free(c->bounce);
	if (c->locked)
		pthread_mutex_unlock(&c->n->ring_lock);
}

/* ---------------------------------------------------------------------- */
/* Slabs and extents (alloc_lock held)                                     */

/* Give [off, off+len) back to @s, merged with its neighbours.  Returns 0 or
 * -ENOMEM (the extent is then lost until the next scan). */
static int slab_free_locked(struct nvme_slab *s, uint64_t off, uint64_t len)
{
	unsigned lo = 0, hi = s->n_fr;
	int prev, next;

	if (!len)
		return 0;
	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;

		if (s->fr[mid].off < off)
			lo = mid + 1;
		else
			hi = mid;
	}
	prev = lo > 0 && s->fr[lo - 1].off + s->fr[lo - 1].len == off;
	next = lo < s->n_fr && off + len == s->fr[lo].off;
	if (prev && next) {
		s->fr[lo - 1].len += len + s->fr[lo].len;
		memmove(&s->fr[lo], &s->fr[lo + 1],
			(s->n_fr - lo - 1) * sizeof *s->fr);
		s->n_fr--;
	} else if (prev) {
		s->fr[lo - 1].len += len;
	} else if (next) {
		s->fr[lo].off = off;
		s->fr[lo].len += len;
	} else {
		if (s->n_fr == s->cap_fr) {
			unsigned cap = s->cap_fr ? 2 * s->cap_fr : 16;
			struct nvme_ext *f = realloc(s->fr, cap * sizeof *f);

			if (!f)
				return -ENOMEM;
			s->fr = f;
			s->cap_fr = cap;
		}
		memmove(&s->fr[lo + 1], &s->fr[lo],
			(s->n_fr - lo) * sizeof *s->fr);
		s->fr[lo] = (struct nvme_ext){ off, len };
		s->n_fr++;
	}
	return 0;
}

static void nvme_free_ext(struct nvme_tier *n, struct nvme_slab *s,
			  uint64_t off, uint64_t len)
{
	pthread_mutex_lock(&n->alloc_lock);
	if (slab_free_locked(s, off, len))
		n->quarantined += len;
	pthread_mutex_unlock(&n->alloc_lock);
}

static void slab_close(struct nvme_slab *s)
{
	if (!s)
		return;
	if (s->fd >= 0)
		close(s->fd);
	free(s->fr);
	free(s);
}

static int slabs_append_locked(struct nvme_tier *n, struct nvme_slab *s)
{
	if (n->n_slabs == n->cap_slabs) {
		unsigned cap = n->cap_slabs ? 2 * n->cap_slabs : 8;
		struct nvme_slab **a = realloc(n->slabs, cap * sizeof *a);

		if (!a)
			return -ENOMEM;
		n->slabs = a;
		n->cap_slabs = cap;
	}
	n->slabs[n->n_slabs++] = s;
	n->slab_total += s->size;
	return 0;
}

/*
 * Create a slab with room for @need bytes.  Created under a temporary name
 * and renamed once its size and allocation are durable, so a crash never
 * leaves a short slab under a final name.  Returns 0 or -errno (-ENOSPC:
 * the slabs already reach the capacity, or the file system is full).
 */
static int slab_create_locked(struct nvme_tier *n, uint64_t need,
			      struct nvme_slab **out)
{
	uint64_t cap = n->base.capacity, room, size;
	char tmp[NVME_NAME_MAX], name[NVME_NAME_MAX];
	struct nvme_slab *s;
	int fd, rc;

	room = cap > n->slab_total ? cap - n->slab_total : 0;
	if (room == 0 || n->next_id > NVME_MAX_ID) /* the name must parse back */
		return -ENOSPC;
	size = blk_up(room) < n->slab_bytes ? blk_up(room) : n->slab_bytes;
	if (size < need)
		size = need;
	s = calloc(1, sizeof *s);
	if (!s)
		return -ENOMEM;
	s->fd = -1;
	s->id = n->next_id;
	s->size = size;
	s->usable = 1;
	if (slab_free_locked(s, 0, size)) {
		slab_close(s);
		return -ENOMEM;
	}
	slab_name(tmp, s->id, ".tmp");
	slab_name(name, s->id, "");
	fd = openat(n->dirfd, tmp, O_CREAT | O_EXCL | O_RDWR | O_DIRECT |
				   O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		slab_close(s);
		return rc;
	}
	s->fd = fd;
	rc = fallocate(fd, 0, 0, (off_t)size);
	if (rc && (errno == EOPNOTSUPP || errno == ENOSYS))
		rc = ftruncate(fd, (off_t)size); /* sparse: ENOSPC at write */
	if (rc || fsync(fd) || renameat(n->dirfd, tmp, n->dirfd, name) ||
	    fsync(n->dirfd)) {
		rc = -errno;
		unlinkat(n->dirfd, tmp, 0);
		unlinkat(n->dirfd, name, 0);
		slab_close(s);
		return rc;
	}
	rc = slabs_append_locked(n, s);
	if (rc) {
		unlinkat(n->dirfd, name, 0);
		slab_close(s);
		return rc;
	}
	n->next_id++;
	*out = s;
	return 0;
}

/* First fit over the usable slabs, then a new slab (@within_room: only
 * one that the capacity left has room for, never an oversized one).
 * 0 or -errno. */
static int nvme_alloc_ex(struct nvme_tier *n, uint64_t len, int within_room,
			 struct nvme_slab **out, uint64_t *off)
{
	struct nvme_slab *s = NULL;
	int rc;

	pthread_mutex_lock(&n->alloc_lock);
	for (unsigned i = 0; i < n->n_slabs; i++) {
		s = n->slabs[i];
		if (!s->usable)
			continue;
		for (unsigned k = 0; k < s->n_fr; k++) {
			struct nvme_ext *e = &s->fr[k];

			if (e->len < len)
				continue;
			*off = e->off;
			e->off += len;
			e->len -= len;
			if (e->len == 0) {
				memmove(e, e + 1,
					(s->n_fr - k - 1) * sizeof *e);
				s->n_fr--;
			}
			*out = s;
			pthread_mutex_unlock(&n->alloc_lock);
			return 0;
		}
	}
	if (within_room && (n->base.capacity < n->slab_total ||
			    n->base.capacity - n->slab_total < len)) {
		pthread_mutex_unlock(&n->alloc_lock);
		return -ENOSPC;
	}
	rc = slab_create_locked(n, len, &s);
	if (rc == 0) {
		*off = s->fr[0].off;
		s->fr[0].off += len;
		s->fr[0].len -= len;
		if (s->fr[0].len == 0)
			s->n_fr = 0;
		*out = s;
	}
	pthread_mutex_unlock(&n->alloc_lock);
	return rc;
}

static int nvme_alloc(struct nvme_tier *n, uint64_t len,
		      struct nvme_slab **out, uint64_t *off)
{
	return nvme_alloc_ex(n, len, 0, out, off);
}

/* ---------------------------------------------------------------------- */
/* Group commit                                                            */

/*
 * Make every write to the slabs @sl[0..ns) that completed before this call
 * durable: wait for an fdatasync of each that started after this call.
 * One caller at a time leads a round that syncs every slab marked so far;
 * everyone who arrived before the round began is released by it.  Returns
 * 0 or the round's first -errno (a failed round fails all its callers:
 * which slab's writes were lost is not known to them).
 */
static int nvme_commit(struct nvme_tier *n, struct nvme_slab *const *sl,
		       unsigned ns)
{
	struct nvme_waiter w = { 0 };

	pthread_mutex_lock(&n->sync_lock);
	for (unsigned i = 0; i < ns; i++)
		sl[i]->dirty = 1;
	w.ticket = ++n->tickets;
	w.next = n->waiters;
	n->waiters = &w;
	n->commits++;
	while (!w.done) {
		struct nvme_slab **todo;
		unsigned nt = 0;
		uint64_t upto;
		int rc = 0;

		if (n->syncing) {
			pthread_cond_wait(&n->sync_cond, &n->sync_lock);
			continue;
		}
		/* Lead a round for every ticket handed out so far. */
		n->syncing = 1;
		upto = n->tickets;
		pthread_mutex_lock(&n->alloc_lock);
		todo = malloc((n->n_slabs ? n->n_slabs : 1) * sizeof *todo);
		for (unsigned i = 0; todo && i < n->n_slabs; i++) {
			if (n->slabs[i]->dirty) {
				n->slabs[i]->dirty = 0;
				todo[nt++] = n->slabs[i];
			}
		}
		pthread_mutex_unlock(&n->alloc_lock);
		pthread_mutex_unlock(&n->sync_lock);
		if (!todo)
			rc = -ENOMEM; /* the slabs stay dirty for a later round */
		for (unsigned i = 0; i < nt; i++)
			if (fdatasync(todo[i]->fd) && !rc)
				rc = -errno;
		free(todo);
		pthread_mutex_lock(&n->sync_lock);
		n->syncs++;
		n->syncing = 0;
		for (struct nvme_waiter **pp = &n->waiters; *pp;) {
			struct nvme_waiter *x = *pp;

			if (x->ticket <= upto) {
				x->rc = rc;
				x->done = 1;
				*pp = x->next;
			} else {
				pp = &x->next;
			}
		}
		pthread_cond_broadcast(&n->sync_cond);
	}
	pthread_mutex_unlock(&n->sync_lock);
	return w.rc;
}

/* Add @s to the set @sl (@ns entries) unless there. */
static void slab_set_add(struct nvme_slab **sl, unsigned *ns,
			 struct nvme_slab *s)
{
	for (unsigned i = 0; i < *ns; i++)
		if (sl[i] == s)
			return;
	sl[(*ns)++] = s;
}

/* ---------------------------------------------------------------------- */
/* Scrubbing: making an extent's old frame unfindable before reuse         */

struct nvme_xt {
	struct nvme_slab *slab;
	uint64_t off, len;
};

/*
 * Tombstone the frames that may lie at the @k extents @x (zero their
 * header blocks, durably), then free the extents.  What cannot be zeroed
 * is punched out; what cannot be punched is quarantined (see the top).
 */
static void nvme_scrub(struct nvme_tier *n, struct tier_io *io,
		       const struct nvme_xt *x, unsigned k)
{
	struct uring_op op1, *ops;
	struct nvme_slab *sl1, **sl;
	int ok1, *ok;
	unsigned ns = 0;
	struct nvme_ctx c;

	if (k == 0)
		return;
	ops = k == 1 ? &op1 : calloc(k, sizeof *ops);
	sl = k == 1 ? &sl1 : calloc(k, sizeof *sl);
	ok = k == 1 ? &ok1 : calloc(k, sizeof *ok);
	if (ops && sl && ok && nvme_begin(&c, n, io, NVME_BLK) == 0) {
		/* One zero block is the source of every write. */
		memset(c.bounce, 0, NVME_BLK);
		for (unsigned i = 0; i < k; i++)
			ops[i] = (struct uring_op){ .fd = x[i].slab->fd,
				.opcode = URING_OP_WRITE, .buf = c.bounce,
				.len = NVME_BLK, .off = x[i].off };
		uring_engine_run(c.ring, ops, k); /* per-op results below */
		nvme_end(&c);
		for (unsigned i = 0; i < k; i++) {
			ok[i] = ops[i].res == (int64_t)NVME_BLK;
			if (ok[i])
				slab_set_add(sl, &ns, x[i].slab);
		}
		if (ns && nvme_commit(n, sl, ns))
			for (unsigned i = 0; i < k; i++)
				ok[i] = 0;
	} else if (ok) {
		for (unsigned i = 0; i < k; i++)
			ok[i] = 0;
	}
	for (unsigned i = 0; i < k; i++) {
		int good = ok && ok[i];

		if (!good)
			good = fallocate(x[i].slab->fd, FALLOC_FL_PUNCH_HOLE |
					 FALLOC_FL_KEEP_SIZE, (off_t)x[i].off,
					 (off_t)x[i].len) == 0 &&
			       fsync(x[i].slab->fd) == 0;
		if (good) {
			nvme_free_ext(n, x[i].slab, x[i].off, x[i].len);
		} else {
			pthread_mutex_lock(&n->alloc_lock);
			n->quarantined += x[i].len;
			pthread_mutex_unlock(&n->alloc_lock);
		}
	}
	if (k > 1) {
		free(ops);
		free(sl);
		free(ok);
	}
}

/* ---------------------------------------------------------------------- */
/* put                                                                     */

/*
 * Space reserved for one submission's frames: they are placed one after
 * the other from @off, so that a later batched get finds them adjacent
 * and reads them with one op (nvme_getv).  Without it, writers running at
 * once take turns in the free list and interleave their frames.
 */
struct nvme_resv {
	struct nvme_slab *s; /* NULL: none, each frame allocates its own */
	uint64_t off, end;
};

/*
 * Place and encode one frame into @dst: at the reservation's cursor when
 * the frame's bound fits there, else in an extent of that bound allocated
 * first (its place goes into the header the checksum covers) whose unused
 * tail is given back; the frame is then charged.  Fills @o.  Returns the
 * frame length or -errno, with nothing held on failure.
 */
static int64_t nvme_encode_one(struct nvme_tier *n, const struct tier_meta *m,
			       const void *src, char *dst, struct nvme_obj *o,
			       struct nvme_resv *rv)
{
	size_t bound = segfile_bound(m->len);
	int reserved = rv && rv->s && rv->end - rv->off >= bound;
	struct segfile_meta sm;
	struct nvme_slab *s;
	uint64_t off;
	int64_t fl;
	int rc;

	if (reserved) {
		s = rv->s;
		off = rv->off;
	} else {
		rc = nvme_alloc(n, bound, &s, &off);
		if (rc)
			return rc;
	}
	memset(&sm, 0, sizeof sm);
	sm.key = m->key;
	memcpy(sm.shape, m->shape, sizeof sm.shape);
	sm.payload_hash = m->hash; /* a hint: saves encode a pass */
	sm.gen = atomic_fetch_add(&n->gen, 1);
	sm.place = off;
	sm.container = s->id;
	fl = segfile_encode(&sm, src, m->len, dst, bound, n->lz4);
	if (fl < 0) {
		if (!reserved)
			nvme_free_ext(n, s, off, bound);
		return fl;
	}
	if ((size_t)fl < bound && !reserved)
		nvme_free_ext(n, s, off + (uint64_t)fl, bound - (size_t)fl);
	if (!tier_charge(&n->base, (size_t)fl)) {
		if (!reserved)
			nvme_free_ext(n, s, off, (uint64_t)fl);
		return -ENOSPC;
	}
	if (reserved)
		rv->off += (uint64_t)fl;
	o->base.meta = *m;
	o->base.footprint = (size_t)fl;
	o->slab = s;
	o->off = off;
	o->gen = sm.gen;
	o->flags = sm.flags;
	o->stored_len = sm.stored_len;
	o->frame_len = (size_t)fl;
	return fl;
}

/* A batch being written: what the ring's more() hook works on. */
struct nvme_putjob {
	struct nvme_tier *n;
	const struct tier_meta *m;
	const void *const *src;
	unsigned items, next;
	char *bounce;
	const size_t *boff;
	struct nvme_obj **o;
	int *rcs;
	struct uring_op *ops;
	unsigned *op_item;
};

/* Encode frames until a submission's worth is ready; the ring writes them
 * while the next ones are encoded.  The submission's frames go into one
 * reserved extent where one is free (or a new slab within the capacity
 * can hold it); what they leave of it is given back at once. */
static unsigned nvme_put_more(void *arg, unsigned ready, int *last)
{
	struct nvme_putjob *j = arg;
	struct nvme_resv rv = { 0 };
	size_t bytes = 0;
	uint64_t want = 0;
	unsigned k = ready;

	for (unsigned i = j->next; i < j->items && want < NVME_BATCH_BYTES; i++)
		if (!j->rcs[i])
			want += segfile_bound(j->m[i].len);
	if (want > 0 && nvme_alloc_ex(j->n, want, 1, &rv.s, &rv.off) == 0)
		rv.end = rv.off + want;
	else
		rv.s = NULL;
	while (j->next < j->items && bytes < NVME_BATCH_BYTES) {
		unsigned i = j->next;
		int64_t fl;

		/* lz4 frames come out shorter than their bounds, so the
		 * bytes can run short of the batch with the reservation full:
		 * the next frame starts the next submission (and its own
		 * reservation) rather than landing elsewhere alone */
		if (rv.s && k > ready && !j->rcs[i] &&
		    rv.end - rv.off < segfile_bound(j->m[i].len))
			break;
		j->next++;
		if (j->rcs[i])
			continue;
		fl = nvme_encode_one(j->n, &j->m[i], j->src[i],
				     j->bounce + j->boff[i], j->o[i], &rv);
		if (fl < 0) {
			j->rcs[i] = (int)fl;
			continue;
		}
		j->ops[k] = (struct uring_op){ .fd = j->o[i]->slab->fd,
			.opcode = URING_OP_WRITE, .buf = j->bounce + j->boff[i],
			.len = (size_t)fl, .off = j->o[i]->off };
		j->op_item[k++] = i;
		bytes += (size_t)fl;
	}
	if (rv.s && rv.off < rv.end)
		nvme_free_ext(j->n, rv.s, rv.off, rv.end - rv.off);
	*last = j->next == j->items;
	return k;
}

/*
 * Batched put: frames encoded into slices of one bounce (the ring's
 * registered area when they fit) and written as they are encoded, then
 * one group commit for the batch.  Items that fail alone are scrubbed and
 * report their own error.
 */
static int nvme_putv(struct tier *t, struct tier_io *io,
		     const struct tier_meta *m, const void *const *src,
		     unsigned n, struct tier_obj **out, int *rcs)
{
	struct nvme_tier *nv = nvme_of(t);
	size_t cnt = n ? n : 1, total = 0;
	struct nvme_obj **o = calloc(cnt, sizeof *o);
	struct uring_op *ops = calloc(cnt, sizeof *ops);
	unsigned *op_item = calloc(cnt, sizeof *op_item);
	size_t *boff = calloc(cnt, sizeof *boff);
	struct nvme_slab **sl = calloc(cnt, sizeof *sl);
	struct nvme_xt *scrub = calloc(cnt, sizeof *scrub);
	unsigned nops = 0, ns = 0, nscrub = 0;
	struct nvme_ctx c;
	int first = 0, rc;

	for (unsigned i = 0; i < n; i++)
		out[i] = NULL;
	if (!o || !ops || !op_item || !boff || !sl || !scrub) {
		rc = -ENOMEM;
		goto fail_all;
	}
	for (unsigned i = 0; i < n; i++) {
		rcs[i] = 0;
		boff[i] = total;
		if (m[i].len > SEGFILE_MAX_PAYLOAD) {
			rcs[i] = -EINVAL;
			continue;
		}
		total += segfile_bound(m[i].len);
		o[i] = calloc(1, sizeof *o[i]);
		if (!o[i])
			rcs[i] = -ENOMEM;
	}
	rc = nvme_begin(&c, nv, io, total);
	if (rc)
		goto fail_all;
	{
		struct nvme_putjob j = { .n = nv, .m = m, .src = src,
			.items = n, .bounce = c.bounce, .boff = boff, .o = o,
			.rcs = rcs, .ops = ops, .op_item = op_item };
		struct uring_hooks h = { .more = nvme_put_more, .arg = &j };

		rc = uring_engine_run_hooks(c.ring, ops, n, &h, &nops);
		/* Items the ring never reached (it failed early). */
		for (unsigned i = j.next; i < n; i++)
			if (!rcs[i])
				rcs[i] = rc ? rc : -EIO;
	}
	nvme_end(&c);
	for (unsigned k = 0; k < nops; k++) {
		unsigned i = op_item[k];

		if (ops[k].res != (int64_t)ops[k].len)
			rcs[i] = ops[k].res < 0 ? (int)ops[k].res : -EIO;
		else
			slab_set_add(sl, &ns, o[i]->slab);
	}
	if (ns) {
		rc = nvme_commit(nv, sl, ns);
		for (unsigned k = 0; rc && k < nops; k++)
			if (!rcs[op_item[k]])
				rcs[op_item[k]] = rc;
	}
	/* Every extent written to by a failed item may hold a frame. */
	for (unsigned k = 0; k < nops; k++) {
		unsigned i = op_item[k];

		if (!rcs[i])
			continue;
		scrub[nscrub++] = (struct nvme_xt){ o[i]->slab, o[i]->off,
						    o[i]->frame_len };
		tier_uncharge(t, o[i]->base.footprint);
	}
	nvme_scrub(nv, io, scrub, nscrub);
	for (unsigned i = 0; i < n; i++) {
		if (rcs[i]) {
			free(o[i]);
			if (!first)
				first = rcs[i];
		} else {
			out[i] = &o[i]->base;
		}
	}
	goto out;

fail_all:
	for (unsigned i = 0; i < n; i++) {
		rcs[i] = rc;
		if (o)
			free(o[i]);
	}
	first = n ? rc : 0;
out:
	free(o);
	free(ops);
	free(op_item);
	free(boff);
	free(sl);
	free(scrub);
	return first;
}

static int nvme_put(struct tier *t, struct tier_io *io,
		    const struct tier_meta *m, const void *src,
		    struct tier_obj **out)
{
	int rc;

	if (m->len > SEGFILE_MAX_PAYLOAD)
		return -EINVAL;
	return nvme_putv(t, io, m, &src, 1, out, &rc);
}

/* ---------------------------------------------------------------------- */
/* get                                                                     */

/* Verify the frame of @o read into @buf and unpack it into @dst. */
static int64_t nvme_decode(const struct nvme_obj *o, const void *buf,
			   void *dst, size_t cap)
{
	struct segfile_meta sm;
	int64_t r = segfile_decode(buf, o->frame_len, &sm, dst, cap);

	/* A valid frame, but not this object's: the extent was reused or
	 * the frame came from elsewhere. */
	if (r >= 0 && (memcmp(&sm.key, &o->base.meta.key, sizeof sm.key) ||
		       sm.gen != o->gen || sm.place != o->off ||
		       sm.container != o->slab->id))
		r = -MKV_ECORRUPT;
	return r;
}

/* Frames adjacent on disk are read by one op up to this size: the virtual
 * disks we run on serve a few large reads faster than many 380 KB ones
 * (bench/tiers: plain 4 MiB O_DIRECT reads beat one read per frame at
 * queue depth 128 by 15-20 % on the H200 machine). */
#define NVME_READ_MERGE ((size_t)4 << 20)

struct nvme_place {
	const struct nvme_obj *o;
	unsigned i;
};

struct nvme_getjob {
	struct nvme_obj *const *o;
	void *const *dst;
	const size_t *cap;
	int64_t *res;
	char *bounce;
	const size_t *boff;
	const struct uring_op *ops;
	const struct nvme_place *by; /* items by place on disk */
	const unsigned *op_first; /* op k reads by[op_first[k]..op_first[k+1]) */
};

/* An op has landed: verify and unpack its frames while the others fly.  A
 * frame the op did not read in full fails; the others still decode. */
static void nvme_get_done(void *arg, unsigned k)
{
	struct nvme_getjob *j = arg;
	int64_t got = j->ops[k].res;
	size_t at = 0;

	for (unsigned q = j->op_first[k]; q < j->op_first[k + 1]; q++) {
		unsigned i = j->by[q].i;
		size_t fl = j->o[i]->frame_len;

		if (got < 0)
			j->res[i] = got;
		else if ((uint64_t)got < at + fl)
			j->res[i] = -EIO;
		else
			j->res[i] = nvme_decode(j->o[i], j->bounce + j->boff[i],
						j->dst[i], j->cap[i]);
		at += fl;
	}
}

static int place_cmp(const void *a, const void *b)
{
	const struct nvme_place *x = a, *y = b;

	if (x->o->slab->id != y->o->slab->id)
		return x->o->slab->id < y->o->slab->id ? -1 : 1;
	if (x->o->off != y->o->off)
		return x->o->off < y->o->off ? -1 : 1;
	return x->i < y->i ? -1 : x->i > y->i;
}

/* Batched get: the frames sorted by place, runs of adjacent ones read by
 * one op each, all in one ring run; each frame verified as soon as its op
 * is in. */
static int nvme_getv(struct tier *t, struct tier_io *io, struct tier_obj **ob,
		     void **dst, const size_t *cap, unsigned n, int64_t *res)
{
	struct nvme_tier *nv = nvme_of(t);
	size_t cnt = n ? n : 1, total = 0;
	struct nvme_obj **o = calloc(cnt, sizeof *o);
	struct nvme_place *by = calloc(cnt, sizeof *by);
	struct uring_op *ops = calloc(cnt, sizeof *ops);
	unsigned *op_first = calloc(cnt + 1, sizeof *op_first);
	size_t *boff = calloc(cnt, sizeof *boff);
	unsigned nops = 0, nq = 0;
	struct nvme_ctx c;
	int first = 0, rc;

	if (!o || !by || !ops || !op_first || !boff) {
		rc = -ENOMEM;
		goto fail_all;
	}
	for (unsigned i = 0; i < n; i++) {
		o[i] = container_of(ob[i], struct nvme_obj, base);
		res[i] = 0;
		if (cap[i] < o[i]->base.meta.len)
			res[i] = -ENOSPC;
		else
			by[nq++] = (struct nvme_place){ o[i], i };
		total += o[i]->frame_len;
	}
	qsort(by, nq, sizeof *by, place_cmp);
	rc = nvme_begin(&c, nv, io, total);
	if (rc)
		goto fail_all;
	total = 0;
	for (unsigned q = 0; q < nq; q++) {
		unsigned i = by[q].i;
		struct uring_op *cur = nops ? &ops[nops - 1] : NULL;

		boff[i] = total;
		total += o[i]->frame_len;
		if (cur && cur->fd == o[i]->slab->fd &&
		    cur->off + cur->len == o[i]->off &&
		    cur->len + o[i]->frame_len <= NVME_READ_MERGE) {
			cur->len += o[i]->frame_len;
			continue;
		}
		op_first[nops] = q;
		ops[nops++] = (struct uring_op){ .fd = o[i]->slab->fd,
			.opcode = URING_OP_READ, .buf = c.bounce + boff[i],
			.len = o[i]->frame_len, .off = o[i]->off };
	}
	op_first[nops] = nq;
	{
		struct nvme_getjob j = { .o = o, .dst = dst, .cap = cap,
			.res = res, .bounce = c.bounce, .boff = boff,
			.ops = ops, .by = by, .op_first = op_first };
		struct uring_hooks h = { .done = nvme_get_done, .arg = &j };
		unsigned ran = 0;

		rc = uring_engine_run_hooks(c.ring, ops, nops, &h, &ran);
		if (ran == 0 && nops) /* refused whole: no done() ran */
			for (unsigned q = 0; q < nq; q++)
				res[by[q].i] = rc;
	}
	nvme_end(&c);
	for (unsigned i = 0; i < n; i++)
		if (res[i] < 0 && !first)
			first = (int)res[i];
	goto out;
fail_all:
	for (unsigned i = 0; i < n; i++)
		res[i] = rc;
	first = n ? rc : 0;
out:
	free(o);
	free(by);
	free(ops);
	free(op_first);
	free(boff);
	return first;
}

static int64_t nvme_get(struct tier *t, struct tier_io *io, struct tier_obj *o,
			void *dst, size_t cap)
{
	int64_t res;

	nvme_getv(t, io, &o, &dst, &cap, 1, &res);
	return res;
}

/* ---------------------------------------------------------------------- */
/* gather                                                                  */

/* One aligned extent of a slab to read, and where it lands. */
struct nvme_rd {
	int fd;
	uint64_t off, len, pos;
};

/*
 * Gather ranges of several objects in ONE ring batch: aligned extents
 * covering each object's ranges (neighbours merged, across objects too
 * when their frames are adjacent in a slab), read into a bounce buffer,
 * then copied out back to back in request order.  lz4 frames are read
 * whole and verified instead (their ranges do not map to offsets).
 */
static int64_t nvme_gatherv(struct tier *t, struct tier_io *io,
			    const struct tier_gather_req *rq, unsigned nrq,
			    void *dst)
{
	struct nvme_tier *n = nvme_of(t);
	struct nvme_rd *ext = NULL;
	struct uring_op *ops = NULL;
	unsigned *rext = NULL, ne = 0, nr = 0, ri = 0;
	uint64_t total = 0;
	char *d = dst;
	int64_t rc = 0;
	struct nvme_ctx c;

	for (unsigned i = 0; i < nrq; i++)
		nr += rq[i].n;
	ext = calloc(nr ? nr : 1, sizeof *ext);
	rext = calloc(nr ? nr : 1, sizeof *rext); /* range -> its extent */
	if (!ext || !rext) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned i = 0; i < nrq; i++) {
		struct nvme_obj *no = container_of(rq[i].obj, struct nvme_obj,
						   base);

		if (no->flags & SEGFILE_F_LZ4) {
			ri += rq[i].n;
			continue;
		}
		for (unsigned k = 0; k < rq[i].n; k++) {
			const struct tier_range *r = &rq[i].r[k];
			uint64_t a = no->off + ((SEGFILE_HDR_SIZE + r->off) &
						~(NVME_BLK - 1));
			uint64_t b = no->off + blk_up(SEGFILE_HDR_SIZE + r->off +
						      r->len);
			struct nvme_rd *e = ne ? &ext[ne - 1] : NULL;

			if (e && e->fd == no->slab->fd && a >= e->off &&
			    a <= e->off + e->len) {
				if (b > e->off + e->len) {
					total += b - (e->off + e->len);
					e->len = b - e->off;
				}
			} else {
				ext[ne++] = (struct nvme_rd){ no->slab->fd, a,
							      b - a, 0 };
				total += b - a;
			}
			rext[ri++] = ne - 1;
		}
	}
	rc = nvme_begin(&c, n, io, total);
	if (rc)
		goto out;
	ops = calloc(ne ? ne : 1, sizeof *ops);
	if (!ops) {
		nvme_end(&c);
		rc = -ENOMEM;
		goto out;
	}
	{
		uint64_t pos = 0;

		for (unsigned e = 0; e < ne; e++) {
			ext[e].pos = pos;
			ops[e] = (struct uring_op){ .fd = ext[e].fd,
				.opcode = URING_OP_READ, .buf = c.bounce + pos,
				.len = ext[e].len, .off = ext[e].off };
			pos += ext[e].len;
		}
	}
	rc = uring_engine_run(c.ring, ops, ne);
	/* Copy out the uncompressed requests at their output positions. */
	ri = 0;
	for (unsigned i = 0; rc == 0 && i < nrq; i++) {
		struct nvme_obj *no = container_of(rq[i].obj, struct nvme_obj,
						   base);

		for (unsigned k = 0; k < rq[i].n; k++, ri++) {
			const struct tier_range *r = &rq[i].r[k];
			uint64_t fo = no->off + SEGFILE_HDR_SIZE + r->off;
			const struct nvme_rd *e = &ext[rext[ri]];

			if (!(no->flags & SEGFILE_F_LZ4))
				memcpy(d, c.bounce + e->pos + (fo - e->off),
				       r->len);
			d += r->len;
		}
	}
	nvme_end(&c); /* the bounce may be the ring's area: free it now */
	/* lz4 frames: read whole and verified, then their ranges. */
	d = dst;
	for (unsigned i = 0; rc == 0 && i < nrq; i++) {
		struct nvme_obj *no = container_of(rq[i].obj, struct nvme_obj,
						   base);
		char *tmp;
		int64_t r;

		if (!(no->flags & SEGFILE_F_LZ4)) {
			for (unsigned k = 0; k < rq[i].n; k++)
				d += rq[i].r[k].len;
			continue;
		}
		tmp = malloc(no->base.meta.len);
		if (!tmp) {
			rc = -ENOMEM;
			break;
		}
		r = nvme_get(t, io, &no->base, tmp, no->base.meta.len);
		if (r >= 0 && (uint64_t)r != no->base.meta.len)
			r = -EIO;
		for (unsigned k = 0; r >= 0 && k < rq[i].n; k++) {
			memcpy(d, tmp + rq[i].r[k].off, rq[i].r[k].len);
			d += rq[i].r[k].len;
		}
		free(tmp);
		if (r < 0)
			rc = r;
	}
	if (rc == 0)
		rc = d - (char *)dst;
out:
	free(ops);
	free(ext);
	free(rext);
	return rc;
}

static int64_t nvme_gather(struct tier *t, struct tier_io *io,
			   struct tier_obj *o, const struct tier_range *r,
			   unsigned cnt, void *dst)
{
	struct tier_gather_req rq = { .obj = o, .r = r, .n = cnt };

	return nvme_gatherv(t, io, &rq, 1, dst);
}

/* ---------------------------------------------------------------------- */
/* drop, forget                                                            */

static void nvme_drop(struct tier *t, struct tier_io *io, struct tier_obj *o)
{
	struct nvme_obj *no = container_of(o, struct nvme_obj, base);
	struct nvme_xt x = { no->slab, no->off, no->frame_len };

	nvme_scrub(nvme_of(t), io, &x, 1);
	tier_uncharge(t, o->footprint);
	free(no);
}

/* The frame stays (and its extent stays taken) for a later scan. */
static void nvme_forget(struct tier *t, struct tier_obj *o)
{
	tier_uncharge(t, o->footprint);
	free(container_of(o, struct nvme_obj, base));
}

/* ---------------------------------------------------------------------- */
/* scan                                                                    */

/* What a scan found, reported once all I/O is over and no lock is held. */
struct nvme_found {
	struct nvme_obj *o; /* NULL: a report */
	int status;
	char name[NVME_NAME_MAX];
};

struct nvme_scan {
	struct nvme_tier *n;
	struct uring_engine *ring;
	char *chunk;               /* NVME_SCAN_CHUNK bytes, aligned */
	char *big;                 /* a frame larger than a chunk */
	size_t big_cap;
	void *raw;                 /* unpacked payload, to verify */
	size_t raw_cap;
	struct nvme_found *f;
	unsigned nf, cap_f;
	struct nvme_ext *live;     /* this slab's taken extents, in order */
	unsigned n_live, cap_live;
	uint64_t max_gen;
	uint64_t unreadable;       /* bytes taken because they could not be read */
};

static int scan_push(struct nvme_scan *sc, struct nvme_obj *o, int status,
		     uint32_t id, uint64_t off)
{
	if (sc->nf == sc->cap_f) {
		unsigned cap = sc->cap_f ? 2 * sc->cap_f : 64;
		struct nvme_found *f = realloc(sc->f, cap * sizeof *f);

		if (!f)
			return -ENOMEM;
		sc->f = f;
		sc->cap_f = cap;
	}
	sc->f[sc->nf].o = o;
	sc->f[sc->nf].status = status;
	place_name(sc->f[sc->nf].name, id, off);
	sc->nf++;
	return 0;
}

static int scan_take(struct nvme_scan *sc, uint64_t off, uint64_t len)
{
	if (sc->n_live == sc->cap_live) {
		unsigned cap = sc->cap_live ? 2 * sc->cap_live : 64;
		struct nvme_ext *l = realloc(sc->live, cap * sizeof *l);

		if (!l)
			return -ENOMEM;
		sc->live = l;
		sc->cap_live = cap;
	}
	sc->live[sc->n_live++] = (struct nvme_ext){ off, len };
	return 0;
}

static int scan_read(struct nvme_scan *sc, int fd, void *buf, size_t len,
		     uint64_t off)
{
	struct uring_op op = { .fd = fd, .opcode = URING_OP_READ, .buf = buf,
			       .len = len, .off = off };

	return uring_engine_run(sc->ring, &op, 1);
}

/*
 * Verify the frame at @frame (@fl bytes, header parsed into @sm) found at
 * @off of @s, and take it.  Returns 1 if adopted, 0 if it failed a check,
 * or -ENOMEM.
 */
static int scan_frame(struct nvme_scan *sc, struct nvme_slab *s,
		      const char *frame, uint64_t fl, uint64_t off,
		      const struct segfile_meta *sm)
{
	struct segfile_meta got;
	struct nvme_obj *o;

	if (sc->raw_cap < sm->raw_len) {
		void *r = realloc(sc->raw, sm->raw_len);

		if (!r)
			return -ENOMEM;
		sc->raw = r;
		sc->raw_cap = sm->raw_len;
	}
	if (segfile_decode(frame, fl, &got, sc->raw, sc->raw_cap) < 0 ||
	    got.place != off || got.container != s->id)
		return 0;
	o = calloc(1, sizeof *o);
	if (!o)
		return -ENOMEM;
	o->base.meta.key = got.key;
	memcpy(o->base.meta.shape, got.shape, sizeof got.shape);
	o->base.meta.len = got.raw_len;
	o->base.meta.hash = got.payload_hash;
	o->base.footprint = fl;
	o->slab = s;
	o->off = off;
	o->gen = got.gen;
	o->flags = got.flags;
	o->stored_len = got.stored_len;
	o->frame_len = fl;
	if (scan_take(sc, off, fl) || scan_push(sc, o, 0, s->id, off)) {
		free(o);
		return -ENOMEM;
	}
	return 1;
}

/* Walk one slab (see the top of the file); fills sc->live.  0 or -ENOMEM. */
static int scan_slab(struct nvme_scan *sc, struct nvme_slab *s)
{
	uint64_t pos = 0, end = s->size;
	int rc;

	sc->n_live = 0;
	while (pos < end) {
		off_t d = lseek(s->fd, (off_t)pos, SEEK_DATA);
		size_t len, q = 0;

		/* Ranges never written read as zeros: no frame there. */
		if (d < 0 && errno == ENXIO)
			break;
		if (d > (off_t)pos)
			pos = (uint64_t)d & ~(NVME_BLK - 1);
		if (pos >= end)
			break;
		len = end - pos < NVME_SCAN_CHUNK ? (size_t)(end - pos)
						  : NVME_SCAN_CHUNK;
		if (scan_read(sc, s->fd, sc->chunk, len, pos)) {
			/* Unreadable: whatever lies there is neither
			 * returned nor overwritten. */
			if (scan_push(sc, NULL, -MKV_ECORRUPT, s->id, pos) ||
			    scan_take(sc, pos, len))
				return -ENOMEM;
			sc->unreadable += len;
			pos += len;
			continue;
		}
		while (q < len) {
			const char *h = sc->chunk + q, *frame = h;
			uint64_t p = pos + q, fl;
			struct segfile_meta sm;

			if (memcmp(h, SEGFILE_MAGIC, 8)) {
				q += NVME_BLK;
				continue;
			}
			if (segfile_parse_header(h, len - q, &sm) ||
			    sm.container != s->id || sm.place != p ||
			    (fl = segfile_frame_len(&sm)) > end - p) {
				if (scan_push(sc, NULL, -MKV_ECORRUPT, s->id, p))
					return -ENOMEM;
				q += NVME_BLK;
				continue;
			}
			/* New frames must be newer than any header here,
			 * adopted or not. */
			if (sm.gen >= sc->max_gen)
				sc->max_gen = sm.gen + 1;
			if (fl > len - q) {
				if (q > 0)
					break; /* read again from its start */
				if (sc->big_cap < fl) {
					free(sc->big);
					sc->big_cap = 0;
					if (posix_memalign((void **)&sc->big,
							   SEGFILE_ALIGN, fl)) {
						sc->big = NULL;
						return -ENOMEM;
					}
					sc->big_cap = fl;
				}
				frame = sc->big;
				if (scan_read(sc, s->fd, sc->big, fl, p))
					frame = NULL;
			}
			rc = frame ? scan_frame(sc, s, frame, fl, p, &sm) : 0;
			if (rc < 0)
				return rc;
			if (rc == 0) {
				if (scan_push(sc, NULL, -MKV_ECORRUPT, s->id, p))
					return -ENOMEM;
				q += NVME_BLK;
				continue;
			}
			q += fl;
		}
		pos += q;
	}
	return 0;
}

/* Newest generation first. */
static int found_cmp(const void *a, const void *b)
{
	const struct nvme_found *x = a, *y = b;
	uint64_t gx = x->o ? x->o->gen : 0, gy = y->o ? y->o->gen : 0;

	if (!x->o != !y->o)
		return x->o ? 1 : -1; /* reports first */
	return gx < gy ? 1 : gx > gy ? -1 : 0;
}

static int nvme_scan(struct tier *t, struct tier_io *io, tier_scan_cb cb,
		     void *arg)
{
	struct nvme_tier *n = nvme_of(t);
	struct nvme_scan sc = { .n = n };
	struct nvme_slab **todo = NULL;
	unsigned nt = 0;
	struct nvme_ctx c;
	int adopted = 0, rc;

	/* The slabs found at create and not scanned yet: only they can hold
	 * frames this tier has no handle for. */
	pthread_mutex_lock(&n->alloc_lock);
	todo = malloc((n->n_slabs ? n->n_slabs : 1) * sizeof *todo);
	for (unsigned i = 0; todo && i < n->n_slabs; i++)
		if (!n->slabs[i]->usable)
			todo[nt++] = n->slabs[i];
	for (unsigned i = 0; i < n->n_stale_tmp; i++) {
		char name[NVME_NAME_MAX];

		slab_name(name, n->stale_tmp[i], ".tmp");
		unlinkat(n->dirfd, name, 0);
		if (scan_push(&sc, NULL, -EINPROGRESS, 0, 0) == 0)
			snprintf(sc.f[sc.nf - 1].name, NVME_NAME_MAX, "%s",
				 name);
	}
	n->n_stale_tmp = 0;
	pthread_mutex_unlock(&n->alloc_lock);
	if (!todo)
		return -ENOMEM;
	if (posix_memalign((void **)&sc.chunk, SEGFILE_ALIGN, NVME_SCAN_CHUNK)) {
		free(todo);
		free(sc.f);
		return -ENOMEM;
	}
	rc = nvme_begin(&c, n, io, 0);
	if (rc)
		goto out;
	sc.ring = c.ring;
	for (unsigned i = 0; i < nt && rc == 0; i++) {
		struct nvme_slab *s = todo[i];
		struct nvme_ext *fr = NULL;
		unsigned nfr = 0;
		uint64_t at = 0;

		rc = scan_slab(&sc, s);
		if (rc)
			break;
		/* Free space: the gaps between the frames taken. */
		fr = calloc(sc.n_live + 1, sizeof *fr);
		if (!fr) {
			rc = -ENOMEM;
			break;
		}
		for (unsigned k = 0; k <= sc.n_live; k++) {
			uint64_t next = k < sc.n_live ? sc.live[k].off : s->size;

			if (next > at)
				fr[nfr++] = (struct nvme_ext){ at, next - at };
			if (k < sc.n_live)
				at = sc.live[k].off + sc.live[k].len;
		}
		pthread_mutex_lock(&n->alloc_lock);
		free(s->fr);
		s->fr = fr;
		s->n_fr = nfr;
		s->cap_fr = sc.n_live + 1;
		s->usable = 1;
		n->quarantined += sc.unreadable;
		sc.unreadable = 0;
		pthread_mutex_unlock(&n->alloc_lock);
	}
	nvme_end(&c);
	{
		uint64_t g = atomic_load(&n->gen);

		while (g < sc.max_gen &&
		       !atomic_compare_exchange_weak(&n->gen, &g, sc.max_gen))
			;
	}
	if (rc)
		goto out;
	if (sc.nf)
		qsort(sc.f, sc.nf, sizeof *sc.f, found_cmp);
	for (unsigned i = 0; i < sc.nf; i++) {
		struct nvme_obj *o = sc.f[i].o;

		if (!o) {
			cb(arg, sc.f[i].status, sc.f[i].name, NULL, NULL);
			continue;
		}
		/* Found data is charged even past capacity: it exists. */
		atomic_fetch_add(&t->used, o->base.footprint);
		sc.f[i].o = NULL;
		if (cb(arg, 0, sc.f[i].name, &o->base.meta, &o->base) == 0) {
			adopted++;
		} else {
			/* Refused: the frame stays for a later scan. */
			tier_uncharge(t, o->base.footprint);
			free(o);
		}
	}
out:
	for (unsigned i = 0; i < sc.nf; i++)
		free(sc.f[i].o); /* not reported: the scan failed */
	free(sc.f);
	free(sc.live);
	free(sc.chunk);
	free(sc.big);
	free(sc.raw);
	free(todo);
	return rc ? rc : adopted;
}

/* ---------------------------------------------------------------------- */
/* create, destroy                                                         */

static void nvme_destroy(struct tier *t)
{
	struct nvme_tier *n = nvme_of(t);

	uring_engine_destroy(n->ring);
	for (unsigned i = 0; i < n->n_slabs; i++)
		slab_close(n->slabs[i]);
	free(n->slabs);
	free(n->stale_tmp);
	if (n->dirfd >= 0)
		close(n->dirfd);
	pthread_mutex_destroy(&n->ring_lock);
	pthread_mutex_destroy(&n->alloc_lock);
	pthread_mutex_destroy(&n->sync_lock);
	pthread_cond_destroy(&n->sync_cond);
	free(n);
}

static const struct tier_ops nvme_ops = {
	.name = "nvme",
	.put = nvme_put,
	.putv = nvme_putv,
	.get = nvme_get,
	.getv = nvme_getv,
	.gather = nvme_gather,
	.gatherv = nvme_gatherv,
	.addr = NULL, /* not addressable */
	.drop = nvme_drop,
	.forget = nvme_forget,
	.scan = nvme_scan,
	.destroy = nvme_destroy,
};

/* Open the slabs already in the directory; they take frames once scanned. */
static int nvme_open_slabs(struct nvme_tier *n)
{
	int dfd = dup(n->dirfd), rc = 0;
	struct dirent *de;
	DIR *d;

	if (dfd < 0)
		return -errno;
	d = fdopendir(dfd);
	if (!d) {
		rc = -errno;
		close(dfd);
		return rc;
	}
	while (rc == 0 && (de = readdir(d))) {
		struct nvme_slab *s;
		struct stat st;
		uint32_t id;
		int tmp;

		if (slab_parse_name(de->d_name, &id, &tmp))
			continue;
		if (id >= n->next_id)
			n->next_id = id + 1;
		if (tmp) {
			uint32_t *a = realloc(n->stale_tmp, (n->n_stale_tmp + 1) *
						      sizeof *a);

			if (!a) {
				rc = -ENOMEM;
				break;
			}
			n->stale_tmp = a;
			a[n->n_stale_tmp++] = id;
			continue;
		}
		s = calloc(1, sizeof *s);
		if (!s) {
			rc = -ENOMEM;
			break;
		}
		s->id = id;
		s->fd = openat(n->dirfd, de->d_name,
			       O_RDWR | O_DIRECT | O_CLOEXEC);
		if (s->fd < 0 || fstat(s->fd, &st)) {
			rc = -errno;
			slab_close(s);
			break;
		}
		s->size = (uint64_t)st.st_size & ~(NVME_BLK - 1);
		rc = slabs_append_locked(n, s);
		if (rc)
			slab_close(s);
	}
	closedir(d);
	return rc;
}

int nvme_tier_create2(const char *dir, size_t capacity, int lz4,
		      size_t slab_bytes, struct tier **out)
{
	struct nvme_tier *n;
	int rc;

	if (!dir || !*dir || !out || capacity == 0 ||
	    slab_bytes > ((size_t)1 << 62))
		return -EINVAL;
	if (mkdir(dir, 0700) && errno != EEXIST)
		return -errno;
	n = calloc(1, sizeof *n);
	if (!n)
		return -ENOMEM;
	tier_init(&n->base, &nvme_ops, capacity);
	n->base.persistent = 1;
	n->lz4 = !!lz4;
	n->slab_bytes = slab_bytes ? blk_up(slab_bytes) : NVME_SLAB_BYTES;
	atomic_init(&n->gen, 1);
	pthread_mutex_init(&n->ring_lock, NULL);
	pthread_mutex_init(&n->alloc_lock, NULL);
	pthread_mutex_init(&n->sync_lock, NULL);
	pthread_cond_init(&n->sync_cond, NULL);
	n->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (n->dirfd < 0) {
		rc = -errno;
		nvme_destroy(&n->base);
		return rc;
	}
	/*
	 * One owner per directory: a second store (another process, or
	 * tierctl beside a running server) would allocate the same free
	 * extents and remove slabs it takes for interrupted.  The lock goes
	 * with the descriptor, so a killed owner leaves none behind.
	 */
	if (flock(n->dirfd, LOCK_EX | LOCK_NB)) {
		rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
		nvme_destroy(&n->base);
		return rc;
	}
	rc = nvme_open_slabs(n);
	if (rc) {
		nvme_destroy(&n->base);
		return rc;
	}
	if (n->n_slabs == 0) {
		/* The first slab now, so that the first spill does not pay
		 * for its fallocate and fsyncs.  Best effort: a put that
		 * finds no slab creates one and reports why it cannot. */
		struct nvme_slab *s;

		pthread_mutex_lock(&n->alloc_lock);
		(void)slab_create_locked(n, NVME_BLK, &s);
		pthread_mutex_unlock(&n->alloc_lock);
	}
	/* The fallback ring gets a registered bounce area when the memlock
	 * limit allows; without one it still works, unregistered. */
	rc = uring_engine_create(NVME_DEPTH, NVME_FALLBACK_BUF, &n->ring);
	if (rc == -ENOMEM || rc == -EPERM || rc == -EFAULT)
		rc = uring_engine_create(NVME_DEPTH, 0, &n->ring);
	if (rc) {
		nvme_destroy(&n->base);
		return rc;
	}
	*out = &n->base;
	return 0;
}

int nvme_tier_create(const char *dir, size_t capacity, int lz4,
		     struct tier **out)
{
	return nvme_tier_create2(dir, capacity, lz4, 0, out);
}

int nvme_tier_get_info(const struct tier *t, struct nvme_tier_info *info)
{
	struct nvme_tier *n;

	if (!t || !info || t->ops != &nvme_ops)
		return -EINVAL;
	n = nvme_of((struct tier *)t);
	memset(info, 0, sizeof *info);
	pthread_mutex_lock(&n->sync_lock);
	info->syncs = n->syncs;
	info->commits = n->commits;
	pthread_mutex_unlock(&n->sync_lock);
	pthread_mutex_lock(&n->alloc_lock);
	info->slabs = n->n_slabs;
	info->slab_bytes = n->slab_total;
	info->quarantined = n->quarantined;
	for (unsigned i = 0; i < n->n_slabs; i++) {
		const struct nvme_slab *s = n->slabs[i];

		if (!s->usable)
			continue;
		for (unsigned k = 0; k < s->n_fr; k++) {
			info->free_bytes += s->fr[k].len;
			if (s->fr[k].len > info->largest_free)
				info->largest_free = s->fr[k].len;
		}
		info->free_extents += s->n_fr;
	}
	pthread_mutex_unlock(&n->alloc_lock);
	return 0;
}
