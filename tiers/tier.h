/* SPDX-License-Identifier: MIT */
/*
 * tiers/tier — the tier abstraction: a place that holds opaque segment
 * payloads (bytes) with a small descriptor, and its backends.
 *
 *   backend   top-tier memory          addressable   persistent
 *   hbm       cudaMalloc region, or    yes (device,   no
 *             host memory w/o CUDA      or host)
 *   host      pinned jemalloc arena    yes (host)     no
 *   nvme      O_DIRECT slabs/io_uring  no             yes
 *   fault     wraps any of the above   as inner       as inner
 *
 * Tiers know nothing of rotations or bitmaps: a payload is bytes, a
 * descriptor is (key, 8 opaque shape words, length, XXH3-64 of the bytes).
 * Moving between tiers and verifying copies is the store's job
 * (mosaickv/store.c); a tier only puts, gets, gathers and drops.
 *
 * Ownership: a struct tier_obj is created by put (or scan) and freed by
 * drop; between the two the caller (the store's directory) owns the handle.
 * Thread safety: every op may be called from any thread concurrently,
 * except on the same object while it is being dropped (the store's
 * directory guarantees that).  Per-thread resources (the worker's io_uring)
 * come in through struct tier_io; io may be NULL, the tier then uses its
 * own, serialized, fallback.
 *
 * Backends: designated-initializer vtables, optional slots marked
 * "may be NULL", embedding struct tier and recovered with container_of.
 */
#ifndef MKV_TIERS_TIER_H
#define MKV_TIERS_TIER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "io/segfile.h"

#ifndef container_of
#define container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))
#endif

struct uring_engine;

/*
 * Per-calling-thread context: the worker's private ring (may be NULL).  A
 * tier may use the ring's registered buffer area as its bounce buffer
 * during a call: callers never pass pointers into that area as payloads.
 */
struct tier_io {
	struct uring_engine *ring;
};

/* What describes a payload; the same words the NVMe frame carries. */
struct tier_meta {
	struct segfile_key key;
	uint32_t shape[SEGFILE_SHAPE_WORDS];
	uint64_t len;  /* payload bytes */
	uint64_t hash; /* XXH3-64 of the payload, from the caller */
};

/* A stored payload in one tier.  Backends embed it (container_of). */
struct tier_obj {
	struct tier_meta meta;
	size_t footprint; /* bytes charged against the tier's capacity */
};

struct tier_range {
	uint64_t off, len; /* within the payload */
};

/* The ranges of one object, for gatherv(). */
struct tier_gather_req {
	struct tier_obj *obj;
	const struct tier_range *r;
	unsigned n;
};

struct tier_stats {
	uint64_t puts, gets, gathers, drops;
	uint64_t put_errors, get_errors;
	uint64_t bytes_in, bytes_out;
};

struct tier;

/*
 * scan callback: one persisted object found (status 0, @o a new handle the
 * callback adopts by returning 0; any other return makes the scan drop the
 * handle but keep the stored copy), or one that is unusable (status
 * -MKV_ECORRUPT for a failed check, -EINPROGRESS for an incomplete write;
 * @o NULL, @m as far as it could be parsed or NULL, @name where it lies:
 * nvme names "slab-NNNNNN.mkv@0xOFFSET", or an interrupted slab file).
 * Callbacks run with no tier lock held and may call the tier (drop).
 */
typedef int (*tier_scan_cb)(void *arg, int status, const char *name,
			    const struct tier_meta *m, struct tier_obj *o);

struct tier_ops {
	const char *name;
	/*
	 * Store a copy of @m->len bytes at host address @src under @m.
	 * On return 0 the copy is complete and, for a persistent tier,
	 * durable; *@out is its handle.  Errors: -ENOMEM / -ENOSPC (over
	 * capacity or allocation failed), -EIO and the like; nothing stays
	 * allocated on failure.
	 */
	int (*put)(struct tier *t, struct tier_io *io, const struct tier_meta *m,
		   const void *src, struct tier_obj **out);
	/*
	 * put() of @n payloads as one batch (nvme: the frames written as
	 * they are encoded, a few MiB per ring submission, then one group
	 * commit).  rcs[i] gets each put's 0 or -errno, out[i]
	 * its handle.  Returns 0 if all succeeded, else the first error.
	 * May be NULL: put() each.
	 */
	int (*putv)(struct tier *t, struct tier_io *io,
		    const struct tier_meta *m, const void *const *src,
		    unsigned n, struct tier_obj **out, int *rcs);
	/*
	 * Copy the whole payload of @o into host memory @dst of @cap bytes.
	 * Returns the number of bytes copied (o->meta.len unless the stored
	 * copy is short), or -errno (-MKV_ECORRUPT: failed the tier's own
	 * check; -ENOSPC: @cap too small).
	 */
	int64_t (*get)(struct tier *t, struct tier_io *io, struct tier_obj *o,
		       void *dst, size_t cap);
	/*
	 * get() of @n objects as one batch (nvme: every frame read in one
	 * ring submission); res[i] as get()'s return.  Returns 0 or the
	 * first error.  May be NULL: get() each.
	 */
	int (*getv)(struct tier *t, struct tier_io *io, struct tier_obj **o,
		    void **dst, const size_t *cap, unsigned n, int64_t *res);
	/*
	 * Copy @n byte ranges of @o's payload back to back into host @dst, in
	 * one batched operation.  Returns the total bytes or -errno.
	 * May be NULL: callers get() the whole payload and copy.
	 */
	int64_t (*gather)(struct tier *t, struct tier_io *io, struct tier_obj *o,
			  const struct tier_range *r, unsigned n, void *dst);
	/*
	 * gather() over several objects at once, output back to back in
	 * request order, as ONE batched transfer (nvme: one ring submission
	 * for every extent of every object).  Returns total bytes or -errno.
	 * May be NULL: gather() per object.
	 */
	int64_t (*gatherv)(struct tier *t, struct tier_io *io,
			   const struct tier_gather_req *rq, unsigned n,
			   void *dst);
	/*
	 * Address of the payload in place (device memory if t->device), valid
	 * until drop.  May be NULL: the tier is not addressable (nvme).
	 */
	void *(*addr)(struct tier *t, struct tier_obj *o);
	/* Remove and free @o (nvme: its frame too, durably).  Never fails. */
	void (*drop)(struct tier *t, struct tier_io *io, struct tier_obj *o);
	/*
	 * Free the handle @o but keep what it names (a persistent tier's frame
	 * stays for a later scan).  May be NULL: same as drop.
	 */
	void (*forget)(struct tier *t, struct tier_obj *o);
	/*
	 * Enumerate what a persistent tier already holds (reopen).  Returns
	 * the number of objects adopted, or -errno.  nvme: only what was
	 * there at create is enumerated, once; a second scan finds nothing.
	 * May be NULL.
	 */
	int (*scan)(struct tier *t, struct tier_io *io, tier_scan_cb cb,
		    void *arg);
	/* Free the tier.  Every object must have been dropped or abandoned
	 * (an abandoned persistent object stays on disk). */
	void (*destroy)(struct tier *t);
};

struct tier {
	const struct tier_ops *ops;
	size_t capacity;      /* budget in bytes */
	_Atomic size_t used;  /* bytes charged (footprints) */
	int device;           /* 1: addr() returns device memory */
	int persistent;       /* 1: survives the process (nvme) */
	struct {
		_Atomic uint64_t puts, gets, gathers, drops;
		_Atomic uint64_t put_errors, get_errors;
		_Atomic uint64_t bytes_in, bytes_out;
	} st;
};

/* Base initialisation for backends. */
static inline void tier_init(struct tier *t, const struct tier_ops *ops,
			     size_t capacity)
{
	t->ops = ops;
	t->capacity = capacity;
	atomic_init(&t->used, 0);
	t->device = 0;
	t->persistent = 0;
	atomic_init(&t->st.puts, 0);
	atomic_init(&t->st.gets, 0);
	atomic_init(&t->st.gathers, 0);
	atomic_init(&t->st.drops, 0);
	atomic_init(&t->st.put_errors, 0);
	atomic_init(&t->st.get_errors, 0);
	atomic_init(&t->st.bytes_in, 0);
	atomic_init(&t->st.bytes_out, 0);
}

/* Charge @bytes against the capacity; false (nothing charged) if it would
 * exceed it. */
static inline int tier_charge(struct tier *t, size_t bytes)
{
	size_t cur = atomic_load(&t->used);

	do {
		if (cur + bytes > t->capacity || cur + bytes < cur)
			return 0;
	} while (!atomic_compare_exchange_weak(&t->used, &cur, cur + bytes));
	return 1;
}

static inline void tier_uncharge(struct tier *t, size_t bytes)
{
	atomic_fetch_sub(&t->used, bytes);
}

static inline size_t tier_used(const struct tier *t)
{
	return atomic_load(&((struct tier *)t)->used);
}

/* Dispatch helpers: count stats, so backends stay small.  */
int tier_put(struct tier *t, struct tier_io *io, const struct tier_meta *m,
	     const void *src, struct tier_obj **out);
int64_t tier_get(struct tier *t, struct tier_io *io, struct tier_obj *o,
		 void *dst, size_t cap);
int tier_putv(struct tier *t, struct tier_io *io, const struct tier_meta *m,
	      const void *const *src, unsigned n, struct tier_obj **out,
	      int *rcs);
int tier_getv(struct tier *t, struct tier_io *io, struct tier_obj **o,
	      void **dst, const size_t *cap, unsigned n, int64_t *res);
/* gather() through the slot, or get() + copy when the slot is NULL. */
int64_t tier_gather(struct tier *t, struct tier_io *io, struct tier_obj *o,
		    const struct tier_range *r, unsigned n, void *dst);
int64_t tier_gatherv(struct tier *t, struct tier_io *io,
		     const struct tier_gather_req *rq, unsigned n, void *dst);
void *tier_addr(struct tier *t, struct tier_obj *o);
void tier_drop(struct tier *t, struct tier_io *io, struct tier_obj *o);
void tier_forget(struct tier *t, struct tier_obj *o);
void tier_destroy(struct tier *t);
void tier_get_stats(const struct tier *t, struct tier_stats *st);

/* ---------------------------------------------------------------------- */
/* Backends                                                                */

/*
 * hbm: one region of @capacity bytes, sub-allocated by size class (4 classes
 * per power of two, 256-byte granularity, so at most 25% internal waste and
 * no allocation call on the data path).  With CUDA and a usable device
 * @gpu the region is one cudaMalloc on that device and addr() returns
 * device pointers; otherwise (@gpu < 0, CUDA absent or no device) it is
 * plain host memory behind the same vtable.  Returns 0, -EINVAL, -ENOMEM.
 */
int hbm_tier_create(size_t capacity, int gpu, struct tier **out);
/* 1 when the hbm tier is really device memory. */
int hbm_tier_on_device(const struct tier *t);

/*
 * host: pinned host memory from a dedicated jemalloc arena (or, without
 * jemalloc in the process, a built-in size-class allocator) whose extent
 * hooks map chunks and pin them (cudaHostRegister with CUDA and a usable
 * device @gpu; mlock otherwise), bound to NUMA node @numa_node (-1: no
 * binding).  @capacity is the payload budget; pinned chunks are limited to
 * @capacity plus jemalloc's slack (the pin limit; see host.c).
 * Returns 0, -EINVAL, -ENOMEM, or -errno of mallctl.  When pinning fails
 * (RLIMIT_MEMLOCK) put() returns -ENOMEM: the memory is never silently
 * unpinned.
 */
int host_tier_create(size_t capacity, int numa_node, int gpu,
		     struct tier **out);
/* As host_tier_create; @use_jemalloc 0 forces the built-in allocator
 * (jemalloc is used only if it is in the process or can be dlopened: see
 * host.c for why it is not linked). */
int host_tier_create2(size_t capacity, int numa_node, int gpu,
		      int use_jemalloc, struct tier **out);
/* 1 when the tier allocates through its jemalloc arena. */
int host_tier_uses_jemalloc(const struct tier *t);
/* Bytes currently mapped and pinned by the arena's hooks. */
size_t host_tier_pinned_bytes(const struct tier *t);
/* Pinned scratch from the same arena (for staging buffers), freed with
 * host_tier_free_pinned.  Not charged against the payload budget. */
void *host_tier_alloc_pinned(struct tier *t, size_t len);
void host_tier_free_pinned(struct tier *t, void *p);

/*
 * nvme: payloads framed by io/segfile, packed into a few large preallocated
 * slab files ("slab-NNNNNN.mkv") in directory @dir (created if missing),
 * written and read with O_DIRECT through io_uring.  A put writes its frames
 * into free extents of the slabs and joins a group commit (one fdatasync
 * per written slab, shared by the puts and drops in flight): on return 0
 * the payload is durable.  drop overwrites the frame's header with zeros,
 * durably, before its extent is reused, so a dropped frame never comes
 * back; a crash mid-write leaves older frames intact and the new one
 * failing its checksum.  scan adopts the complete frames of the slabs that
 * were there at create (until then those slabs take no new frames) and
 * reports the others; see nvme.c for the whole argument.  Slabs are 1 GiB
 * (less if @capacity is smaller); the first is made here when @dir has
 * none, others as needed while their total is below @capacity.  @lz4: compress frames where it saves >= 10%.
 * The directory is locked (flock) for the tier's life: -EBUSY while
 * another tier, in any process, has it.
 * Returns 0, -EINVAL, -ENOMEM, -EBUSY, or -errno of mkdir/open.
 */
int nvme_tier_create(const char *dir, size_t capacity, int lz4,
		     struct tier **out);
/* As nvme_tier_create, with slabs of @slab_bytes (rounded up to 4 KiB;
 * 0: the default). */
int nvme_tier_create2(const char *dir, size_t capacity, int lz4,
		      size_t slab_bytes, struct tier **out);

/* What the nvme tier's slabs look like now (tests, tools). */
struct nvme_tier_info {
	unsigned slabs;
	uint64_t slab_bytes;    /* all slabs together */
	uint64_t free_bytes;    /* free extents of the scanned slabs */
	uint64_t free_extents;
	uint64_t largest_free;
	uint64_t quarantined;   /* bytes withheld from reuse after a failed
				 * scrub or an unreadable range */
	uint64_t syncs;         /* group-commit rounds (fdatasync batches) */
	uint64_t commits;       /* callers that waited for one */
};
/* Returns 0, or -EINVAL (NULL, or @t is not an nvme tier). */
int nvme_tier_get_info(const struct tier *t, struct nvme_tier_info *info);

/*
 * fault: wraps @inner (taking ownership) and injects failures; tests only.
 * Arm with fault_tier_arm(): the @nth (1-based) call of @op from now on
 * fails with @kind; @count consecutive calls fail (0 means every call
 * from the nth on).
 */
enum fault_op { FAULT_OP_PUT = 0, FAULT_OP_GET = 1, FAULT_OP_GATHER = 2,
		FAULT_OP_COUNT = 3 };
enum fault_kind {
	FAULT_ERRNO = 0,  /* return -err without calling the inner tier */
	FAULT_BITFLIP = 1,/* put: store a copy with one bit flipped;
			   * get/gather: flip one bit of what was read */
	FAULT_SHORT = 2,  /* put: store only the first half of the payload;
			   * get/gather: report half the bytes */
	FAULT_NOMEM = 3,  /* allocation failure: -ENOMEM */
};
int fault_tier_create(struct tier *inner, struct tier **out);
void fault_tier_arm(struct tier *t, enum fault_op op, unsigned nth,
		    enum fault_kind kind, int err, unsigned count);
void fault_tier_disarm(struct tier *t);
/* Faults injected so far. */
uint64_t fault_tier_injected(const struct tier *t);

#endif
