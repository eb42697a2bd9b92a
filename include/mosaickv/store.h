/* SPDX-License-Identifier: MIT */
/*
 * mosaickv — the tiered segment store.
 *
 * A store owns packed segments and keeps each one in exactly one of three
 * tiers, moving them by policy without ever losing one:
 *
 *   MKV_TIER_HBM   device memory: one cudaMalloc per store, carved by size
 *                  class (plain host memory when built without CUDA or
 *                  when no device is usable: the whole store then runs on
 *                  the CPU behind the same interface);
 *   MKV_TIER_HOST  pinned host RAM from a dedicated jemalloc arena whose
 *                  chunks are pinned (cudaHostRegister, or mlock without
 *                  CUDA) and bound to the GPU's NUMA node.  jemalloc is
 *                  not linked (its TLS model would make this library
 *                  impossible to dlopen): it is used when the program
 *                  links or preloads it, else a built-in size-class
 *                  allocator carves the same pinned chunks;
 *   MKV_TIER_NVME  self-describing, checksummed frames packed into a few
 *                  preallocated slab files in a directory, written and
 *                  read with O_DIRECT through io_uring, lz4-compressed
 *                  where that saves >= 10% (docs/NVME.md).
 *
 * Segments are keyed by (sequence, layer, KV head, segment, kind).  The
 * store treats a segment as an opaque payload (the bytes of
 * mkv_segment_serialize()) plus a block layout saying where block j's
 * packed values and bitmaps lie inside it, so that the blocks a decode step
 * selects can be fetched without the rest.
 *
 * Moving a segment (demotion HBM -> host -> NVMe, or promotion) copies it
 * to the destination, makes the copy durable (NVMe: O_DIRECT write, then
 * a group-commit fdatasync shared by the moves in flight), reads the copy
 * back and compares its XXH3-64 with the hash taken when the segment
 * entered the store, and only then drops the source copy.  Any failure
 * (ENOSPC, EIO, a short write or read, a flipped bit, pinned memory or HBM
 * exhausted) leaves the segment where it was, counts the error in the
 * stats and reports it to the move's callback.
 *
 * Asynchronous calls follow one contract (SPDK's): when the submitting
 * call returns 0 the callback runs exactly once, on a store worker thread,
 * with status 0 or a negative errno; when it returns an error the callback
 * never runs.  Callbacks may call any store function except
 * mkv_store_destroy() and mkv_store_drain().
 *
 * Thread safety: every function may be called concurrently from any
 * thread on the same store, except mkv_store_destroy(); a struct mkv_fetch
 * is used by one thread at a time.  Every public call validates its
 * arguments and, on error, returns a negative errno without changing any
 * state.  Nothing prints; statistics come through mkv_store_get_stats().
 */
#ifndef MOSAICKV_STORE_H
#define MOSAICKV_STORE_H

#include <mosaickv/common.h>
#include <mosaickv/compress.h>

#ifdef __cplusplus
extern "C" {
#endif

enum mkv_tier {
	MKV_TIER_HBM = 0,
	MKV_TIER_HOST = 1,
	MKV_TIER_NVME = 2,
	MKV_TIER_COUNT = 3,
};

/* A segment's state in the directory. */
enum mkv_seg_state {
	MKV_SEG_RESIDENT = 0,    /* in one tier, no move under way */
	MKV_SEG_MOVING_UP = 1,   /* being promoted; still readable */
	MKV_SEG_MOVING_DOWN = 2, /* being demoted; still readable */
};

struct mkv_seg_key {
	uint64_t seq;   /* sequence (request) id */
	uint32_t layer;
	uint32_t head;  /* KV head */
	uint32_t seg;   /* segment index within (seq, layer, head) */
	uint32_t kind;  /* enum mkv_kind: keys or values */
};

struct mkv_store_opts {
	size_t size;           /* sizeof(struct mkv_store_opts), set by _init */
	size_t hbm_bytes;      /* top-tier budget.  Default 256 MiB */
	size_t host_bytes;     /* pinned host budget.  Default 1 GiB */
	size_t nvme_bytes;     /* NVMe budget.  Default 64 GiB */
	/*
	 * Directory of the NVMe tier, created if missing; NULL (default):
	 * no NVMe tier.  Segments already there are adopted (reopen).
	 * Borrowed for the duration of mkv_store_create().
	 */
	const char *nvme_dir;
	int gpu;               /* CUDA device for HBM, -1: never use CUDA.
	                        * Default 0 (host memory if unusable) */
	int numa_node;         /* node of pinned memory and workers; -1
	                        * (default): the GPU's node when CUDA is
	                        * usable, otherwise no binding */
	uint32_t workers;      /* worker threads, 1..64.  Default 2 */
	uint32_t io_depth;     /* io_uring entries per worker, 1..4096.
	                        * Default 64 */
	uint32_t lz4;          /* 1: lz4 on NVMe where it saves >= 10%.
	                        * Default 1 */
	double half_life;      /* policy score half-life, decode steps, > 0.
	                        * Default 64 */
	/* Watermarks per tier, fractions of the budget, 0 < low <= high <= 1.
	 * Defaults: high 0.90, low 0.75 for every tier. */
	double high_wm[MKV_TIER_COUNT];
	double low_wm[MKV_TIER_COUNT];
	/*
	 * 1 (default): when a put finds a tier at its high watermark (and so
	 * places the segment lower), the workers rebalance by policy in the
	 * background (see mkv_store_balance).
	 */
	uint32_t auto_balance;
	/*
	 * Share of hbm_bytes kept for the HBM hot-block cache (blocks of
	 * lower-tier segments admitted by prefetch), in [0, 0.9]; used only
	 * when the store has a lower tier.  Whole segments are placed in
	 * the rest, to which the HBM watermarks apply.  Default 0.25.
	 */
	double hot_fraction;
	/*
	 * Bytes of registered (fixed) buffer per worker ring, used as the
	 * bounce buffer of NVMe reads and writes that fit (READ_FIXED /
	 * WRITE_FIXED: no per-I/O page pinning).  0: none.  If registration
	 * fails (RLIMIT_MEMLOCK), the rings run without.  Default 4 MiB.
	 */
	size_t io_buf_bytes;
	/*
	 * With HBM on a device: 1 makes fetches return blocks of the host
	 * tier in place, as addresses of mapped pinned memory that kernels
	 * read over PCIe (zero-copy), instead of packing them into the
	 * staging buffer and copying that to the device.  Ignored (staged)
	 * when the device cannot use host pointers directly.  Default 0.
	 */
	uint32_t fetch_mapped;
	/*
	 * With HBM on a device, how host-tier blocks that are not returned
	 * in place reach it.  N >= 1: each fetch context has N threads that
	 * pack the blocks into its pinned staging while the fetch is still
	 * resolving them, and each packed chunk goes to the device in one
	 * asynchronous copy-engine transfer at once.  0: one gather kernel
	 * reads them over PCIe from the mapped pinned memory (zero-copy).
	 * See fetch_kernel_share for both at once.  0..64.  Default 0: on
	 * the H200 machine the kernel alone was fastest (docs/PERF.md); the
	 * threads pay where one core packs faster than the 6-8 GB/s
	 * measured there.
	 */
	uint32_t fetch_threads;
	/*
	 * Microseconds an idle fetch thread spins looking for the next
	 * fetch before it sleeps (waking a sleeping thread costs tens of
	 * microseconds; decode fetches come every few hundred).  The spin
	 * is CPU time: 0 sleeps at once.  0..100000.  Default 200.
	 */
	uint32_t fetch_spin_us;
	/*
	 * With both fetch threads and a usable gather kernel (mapped pinned
	 * host memory), the kernel moves this share of the host-tier bytes
	 * (whole segments, balanced as the fetch resolves them) and the
	 * threads + copy engine the rest, both at once over the link.  0:
	 * threads only; 1: kernel only.  [0, 1].  Default 0.5.
	 */
	double fetch_kernel_share;
};

/*
 * Fill @o with the defaults.  @size must be sizeof(*o) as the caller
 * compiled it.  Returns 0, or -EINVAL (NULL, or a size this library does
 * not know).
 */
MKV_API int mkv_store_opts_init(struct mkv_store_opts *o, size_t size);

struct mkv_store;

/*
 * Create a store.  With o->nvme_dir set, every complete segment frame
 * already in the directory's slab files is verified (checksum and payload
 * hash) and adopted in the NVMe tier; frames that fail a check (torn by a
 * crash mid-spill, or corrupted since) are counted in
 * mkv_store_stats.reopen_corrupt, interrupted slab creations (removed) in
 * reopen_incomplete; neither is ever returned, and their space is reused.
 * Returns 0 with the store in *@out, or:
 *   -EINVAL   NULL pointers, a bad options size, a zero budget, workers or
 *             io_depth out of range, bad watermarks, half-life,
 *             hot_fraction or fetch options, a NUMA node that does not
 *             exist;
 *   -ENOMEM   out of memory (including the HBM region or jemalloc arena);
 *   -ENOSYS, -EPERM  io_uring is not available (an NVMe tier needs it);
 *   -EBUSY    another store (in this or another process) has the NVMe
 *             directory open: one owner per directory, held by a lock on
 *             it that ends with the store or its process;
 *   other -errno from creating or opening the NVMe directory.
 * On failure *@out is untouched and nothing is left behind (except a
 * created NVMe directory).
 */
MKV_API int mkv_store_create(const struct mkv_store_opts *o,
			     struct mkv_store **out);

/*
 * Wait for every submitted asynchronous operation to complete (their
 * callbacks run), stop the workers and free the store.  Segments in HBM
 * and host memory are gone; NVMe segments stay for a later reopen.
 * Outstanding struct mkv_fetch and struct mkv_devmap objects must have
 * been destroyed first.
 * NULL is accepted.
 */
MKV_API void mkv_store_destroy(struct mkv_store *s);

/*
 * Where block j of a payload lives, for partial fetches.  Block j's values
 * are the bytes [values_off + j*values_block, min(+values_block,
 * values_off + values_len)), its bitmaps likewise.  n_blocks == 0 means
 * "no block layout": fetches of this segment are refused.
 */
struct mkv_store_layout {
	uint32_t n_blocks;
	uint64_t values_off, values_block, values_len;
	uint64_t bitmaps_off, bitmaps_block, bitmaps_len;
};

/*
 * Insert @len bytes at @payload (copied) under @k with block layout
 * @layout (may be NULL: no partial fetch).  The segment is placed in the
 * highest tier that stays within its high watermark with it (HBM, then
 * host, then NVMe).  Synchronous: on return 0 the copy is complete and
 * verified (and durable when it went to NVMe).
 * Returns 0, or:
 *   -EINVAL   NULL pointers, len 0 or above 2016 MiB, a layout whose
 *             ranges fall outside the payload;
 *   -EEXIST   @k is already in the store;
 *   -ENOSPC   no tier has room (every tier's put failed: see the stats);
 *   -ENOMEM   out of memory.
 * Thread-safe.  The caller keeps @payload.
 */
MKV_API int mkv_store_put(struct mkv_store *s, const struct mkv_seg_key *k,
			  const void *payload, size_t len,
			  const struct mkv_store_layout *layout);

/*
 * Serialize @seg (mkv_segment_serialize) and insert it as above, with the
 * block layout of its packed values and bitmaps.  Returns as
 * mkv_store_put(), or -EINVAL if @seg is NULL.
 */
MKV_API int mkv_store_put_segment(struct mkv_store *s,
				  const struct mkv_seg_key *k,
				  const struct mkv_segment *seg);

/*
 * Copy the payload of @k into @buf of @cap bytes (from whichever tier holds
 * it, verified against its XXH3-64).  Returns the payload length, or:
 *   -EINVAL (NULL), -ENOENT (no such key), -ENOSPC (@cap too small; the
 *   length is in mkv_store_info), -MKV_ECORRUPT (the stored copy failed
 *   verification), -EIO and other -errno of the tier.
 * Thread-safe; does not block moves for longer than the copy.
 */
MKV_API int64_t mkv_store_read(struct mkv_store *s,
			       const struct mkv_seg_key *k, void *buf,
			       size_t cap);

/*
 * Read @k back as a new segment (mkv_segment_deserialize of the payload)
 * into *@out, owned by the caller.  Returns 0 or as mkv_store_read(),
 * and -MKV_ECORRUPT if the payload is not a serialized segment.
 */
MKV_API int mkv_store_get_segment(struct mkv_store *s,
				  const struct mkv_seg_key *k,
				  struct mkv_segment **out);

/*
 * Remove @k from the store (every tier's copy; its NVMe frame too,
 * durably: a reopen never finds it again).
 * Returns 0, -EINVAL, -ENOENT, or -EBUSY (pinned, or a move is under way:
 * retry after it completes).
 */
MKV_API int mkv_store_remove(struct mkv_store *s, const struct mkv_seg_key *k);

/* Descriptor of one segment, as returned by mkv_store_info(). */
struct mkv_seg_info {
	enum mkv_tier tier;
	enum mkv_seg_state state;
	uint32_t pins;
	uint32_t n_blocks;
	uint32_t hot_blocks;  /* blocks with a copy in the HBM hot cache */
	uint64_t len;         /* payload bytes */
	uint64_t hash;        /* XXH3-64 of the payload */
	uint64_t hits;        /* blocks selected so far */
	uint64_t last_step;   /* step of the last selection, 0 if never */
	double score;         /* the policy's score at the store's step */
};

/* Fill *@info for @k.  Returns 0, -EINVAL, -ENOENT. */
MKV_API int mkv_store_info(struct mkv_store *s, const struct mkv_seg_key *k,
			   struct mkv_seg_info *info);

/*
 * Block residency of @k: @res[j] (n_blocks bytes) receives the tier block
 * j would be read from by a fetch now (MKV_TIER_HBM for a hot-cached
 * block).  Returns n_blocks, -EINVAL, -ENOENT, -ENOSPC (@n too small).
 */
MKV_API int mkv_store_block_residency(struct mkv_store *s,
				      const struct mkv_seg_key *k,
				      uint8_t *res, size_t n);

/* Call @fn for every segment (order unspecified) with the directory
 * locked: @fn must not call into the store.  Returns the count, -EINVAL. */
MKV_API int64_t mkv_store_list(struct mkv_store *s,
			       void (*fn)(void *arg, const struct mkv_seg_key *k,
					  const struct mkv_seg_info *info),
			       void *arg);

/*
 * Pin @k: until the matching mkv_store_unpin() it is never moved or
 * removed, so an address obtained from a fetch stays valid.  Pins nest.
 * Returns 0, -EINVAL, -ENOENT.  A move in flight when the pin arrives is
 * abandoned at its commit (its callback gets -EBUSY), never half-done.
 */
MKV_API int mkv_store_pin(struct mkv_store *s, const struct mkv_seg_key *k);
/* Returns 0, -EINVAL, -ENOENT, or -EALREADY if @k is not pinned. */
MKV_API int mkv_store_unpin(struct mkv_store *s, const struct mkv_seg_key *k);

/* Completion callback of the asynchronous calls; see the contract above. */
typedef void (*mkv_store_cb)(void *arg, int status);

/*
 * Move @k to tier @dst asynchronously (demotion or promotion).  The
 * callback's status is 0 on success, or: -EBUSY (pinned while moving),
 * -ENOSPC / -ENOMEM / -EIO / -MKV_ECORRUPT (the copy below or its
 * verification failed: the segment stays in its tier), or -ENOENT (removed
 * meanwhile).  Submit errors: -EINVAL (NULL, bad tier, the store has no
 * such tier), -ENOENT, -EBUSY (pinned or already moving), -EALREADY
 * (already in @dst), -ENOMEM.
 */
MKV_API int mkv_store_move(struct mkv_store *s, const struct mkv_seg_key *k,
			   enum mkv_tier dst, mkv_store_cb cb, void *arg);

/*
 * Rebalance every tier by the policy: unpinned segments are ranked by score
 * (hottest first) and placed in the highest tier that stays within its low
 * watermark; the moves run on the workers (demotions before promotions).
 * The callback gets 0 when every move succeeded, or the first failure
 * (the segments concerned stay where they were).  Submit errors: -EINVAL,
 * -ENOMEM.
 */
MKV_API int mkv_store_balance(struct mkv_store *s, mkv_store_cb cb,
			      void *arg);

/* Wait until no asynchronous operation is queued or running (callbacks of
 * completed ones have returned).  Returns 0 or -EINVAL. */
MKV_API int mkv_store_drain(struct mkv_store *s);

/* ---------------------------------------------------------------------- */
/* Fetching selected blocks                                                */

/* The blocks of one segment selected in a decode step. */
struct mkv_fetch_req {
	struct mkv_seg_key key;
	const uint32_t *blocks; /* block ids, ascending, no duplicates */
	uint32_t n_blocks;
};

/* Where one fetched block is. */
struct mkv_block_addr {
	const void *values;    /* packed values of the block */
	const void *bitmaps;   /* its bitmaps */
	uint32_t values_bytes;
	uint32_t bitmaps_bytes;
	uint8_t tier;          /* enum mkv_tier it was read from */
	uint8_t device;        /* 1: addresses a kernel can read: device
	                        * memory, or (tier MKV_TIER_HOST with
	                        * fetch_mapped) mapped pinned host memory */
};

struct mkv_fetch; /* a fetch context: staging buffers, one thread's ring */

/*
 * Create a fetch context with @staging_bytes of pinned staging (a device
 * staging buffer of the same size too when HBM is on a device).  With
 * HBM on a device and fetch_threads > 0 it also starts the context's
 * fetch threads (on the store's NUMA node; mkv_fetch_destroy joins them);
 * if they cannot start, the context uses the gather kernel instead.
 * Returns 0, -EINVAL (NULL, 0 bytes), -ENOMEM, or -errno of io_uring
 * setup.
 */
MKV_API int mkv_fetch_create(struct mkv_store *s, size_t staging_bytes,
			     struct mkv_fetch **out);
/* Release the context's pins and free it.  NULL is accepted. */
MKV_API void mkv_fetch_destroy(struct mkv_fetch *f);

/*
 * Fetch the selected blocks of @n requests for decode step @step, and
 * record the selection in the segments' statistics.  @out receives, in
 * request order then block order, one address per block (sum of n_blocks
 * entries).  Blocks resident in HBM (whole segment or hot-cached) and,
 * without CUDA or with fetch_mapped, in host memory are returned in
 * place; the others are gathered with one batched transfer per source
 * tier into the context's staging: NVMe blocks with one ring submission,
 * host blocks, with HBM on a device, by the context's fetch threads in
 * chunks that the copy engine moves as they are packed (or by one gather
 * kernel: fetch_threads = 0), and NVMe ones in one host-to-device copy.  The segments
 * returned in place are pinned until the next mkv_store_fetch() or
 * mkv_fetch_release() on @f; staged addresses are valid until then too.
 * Returns the number of blocks fetched from below the top tier (0 when
 * everything was already in place), or:
 *   -EINVAL   NULL pointers, a block id past the segment, unordered ids,
 *             a segment stored without block layout;
 *   -ENOENT   a key is not in the store;
 *   -ENOSPC   the staging buffer is too small for the non-resident blocks;
 *   -EIO and other -errno of a tier.
 * On error no statistics change and no pins are held; the one exception
 * is a CUDA error reported when the fetch waits for its copies (the
 * device failed after they were queued and the selection recorded).
 */
MKV_API int64_t mkv_store_fetch(struct mkv_fetch *f,
				const struct mkv_fetch_req *req, size_t n,
				uint64_t step, struct mkv_block_addr *out);

/* Drop the pins of the last fetch on @f.  NULL is accepted. */
MKV_API void mkv_fetch_release(struct mkv_fetch *f);

/*
 * Prefetch: the same request, for a predicted selection (the previous
 * step's), run asynchronously on a worker.  Blocks not already in HBM are
 * read and, where the policy admits them, copied into the HBM hot-block
 * cache, so that the next step's fetch finds them in place.  The requests
 * are copied.  Callback status: 0, or the first error.  Submit errors:
 * -EINVAL, -ENOENT, -ENOMEM.
 */
MKV_API int mkv_store_prefetch(struct mkv_store *s,
			       const struct mkv_fetch_req *req, size_t n,
			       uint64_t step, mkv_store_cb cb, void *arg);

/* ---------------------------------------------------------------------- */
/* Fetches driven from the device                                          */

/*
 * In decode the blocks are selected on the GPU.  mkv_store_fetch() needs
 * that selection on the host, resolves it under the store's lock and then
 * launches the copy; a device map instead keeps a table of its segments
 * in device memory, and its fetch is one kernel that reads the selection
 * where the GPU wrote it and copies host-tier blocks into device staging
 * (HBM blocks are handed out in place).  Nothing of the host's lies
 * between the selection and the copy, and the call only queues work on a
 * stream.  The price: the map's segments are pinned for its lifetime
 * (they never move, so the balancer works around them), and selections
 * reach the store's statistics when mkv_devmap_sync() collects them.
 *
 * Blocks are numbered across the map: keys[0]'s blocks first, then
 * keys[1]'s, and so on (block j of keys[i] is the sum of the earlier
 * segments' block counts, plus j).
 *
 * Needs HBM on a device and host-tier memory the device can read in
 * place (the real host tier's pinned arena on a device with unified
 * addressing).  A map is used by one thread at a time.
 */
struct mkv_devmap;

/*
 * Map the @n segments of @keys (each with a block layout; a key may
 * repeat).  Segments on NVMe are promoted to host memory first (moves on
 * the workers, waited for).  On return 0 every segment is pinned until
 * mkv_devmap_destroy().
 * Returns 0, or:
 *   -EINVAL      NULL pointers, n == 0, an invalid key, a segment without
 *                block layout, more than 2^32 - 1 blocks in all;
 *   -ENOENT      a key is not in the store;
 *   -MKV_ENODEV  the store's HBM is not on a device (or no CUDA build);
 *   -EOPNOTSUPP  host-tier memory the device cannot read in place;
 *   -EAGAIN      a segment kept going back to NVMe while being mapped;
 *   -EBUSY       an NVMe segment is pinned by someone else (cannot come up);
 *   -ENOMEM, -EIO, and the errors of a failed promotion.
 * On error nothing stays pinned (promotions already done stay done).
 */
MKV_API int mkv_devmap_create(struct mkv_store *s, const struct mkv_seg_key *keys,
			      size_t n, struct mkv_devmap **out);

/* Waits for the map's queued fetches, unpins its segments and frees it.
 * Selections not yet collected by mkv_devmap_sync() are dropped.  NULL is
 * accepted. */
MKV_API void mkv_devmap_destroy(struct mkv_devmap *m);

/* Blocks in the map (0 for NULL). */
MKV_API uint64_t mkv_devmap_blocks(const struct mkv_devmap *m);
/* Staging bytes one selected block takes (0 for NULL): a fetch of up to
 * max_sel blocks needs max_sel times this. */
MKV_API uint64_t mkv_devmap_slot_bytes(const struct mkv_devmap *m);

/*
 * Queue, on CUDA stream @stream (a cudaStream_t; NULL: the legacy default
 * stream), the fetch of the blocks numbered @sel[0..c-1], c = *@count, or
 * @max_sel when @count is NULL.  For entry k, @out[k] receives the block's
 * address: host-tier blocks copied to @staging + k * slot (values, then
 * bitmaps), HBM blocks in place; tier and sizes as mkv_store_fetch()
 * reports them, device = 1.  Entries may repeat and need no order.  An id
 * past the map gets an all-zero @out[k], and entries past @max_sel are
 * not fetched: both are counted as refused (mkv_devmap_sync()).
 * @sel, @count, @staging and @out must be memory the device reads (and,
 * for the last two, writes): device memory of the store's GPU or mapped
 * pinned host memory; @count's value is read by the kernel, never by the
 * host, so it can come from the GPU's own selection.  Not capturable in
 * a CUDA graph.  @max_sel == 0 queues nothing.
 * Returns 0 once queued (the blocks are in place when @stream reaches
 * this point), or:
 *   -EINVAL  NULL @m, @sel, @staging or @out, a pointer the device cannot
 *            read;
 *   -ENOSPC  @staging_bytes < @max_sel * mkv_devmap_slot_bytes(m);
 *   -EIO     a CUDA error.
 */
MKV_API int mkv_devmap_fetch(struct mkv_devmap *m, const uint32_t *sel,
			     const uint32_t *count, uint32_t max_sel, void *staging,
			     size_t staging_bytes, struct mkv_block_addr *out,
			     void *stream);

/*
 * Wait for every fetch queued on @m, then record their selections in the
 * store's statistics as made at decode step @step (per segment and per
 * block, as mkv_store_fetch() records its own) and reset the map's
 * counters.  Returns the number of entries refused since the last sync
 * (0 when none), or -EINVAL, -ENOMEM, -EIO (the counters are then kept).
 */
MKV_API int64_t mkv_devmap_sync(struct mkv_devmap *m, uint64_t step);

/* ---------------------------------------------------------------------- */
/* Statistics                                                              */

struct mkv_tier_stats {
	uint64_t capacity;   /* budget, bytes */
	uint64_t used;       /* bytes charged (allocator footprints) */
	uint64_t segments;   /* segments resident */
	uint64_t puts, put_errors;
	uint64_t gets, get_errors;
	uint64_t bytes_in, bytes_out;
	uint32_t present;    /* 0: the store has no such tier */
	uint32_t on_device;  /* HBM: 1 when it is device memory */
};

struct mkv_store_stats {
	size_t size; /* set by the caller: sizeof(struct mkv_store_stats) */
	struct mkv_tier_stats tier[MKV_TIER_COUNT];
	uint64_t moves_done;
	uint64_t moves_failed;
	/* failed moves by boundary: [from][to] */
	uint64_t move_errors[MKV_TIER_COUNT][MKV_TIER_COUNT];
	uint64_t verify_failures; /* read-back hash mismatch or short copy */
	int64_t last_error;       /* negative errno of the last failure */
	uint64_t balances;
	uint64_t fetches, fetch_blocks, fetch_blocks_staged;
	uint64_t hot_blocks, hot_bytes, hot_admitted, hot_evicted;
	uint64_t reopen_adopted, reopen_corrupt, reopen_incomplete;
	uint64_t pinned_host_bytes; /* pinned by the host arena */
	uint64_t move_batches;      /* batched move groups (balance) */
	/* 1: the host tier allocates from a jemalloc arena (jemalloc was in
	 * the process or could be loaded); 0: its built-in allocator. */
	uint32_t host_jemalloc;
	/* balance moves left out because the destination was at its high
	 * watermark when the move came and again when it was retried after
	 * the balance's other moves (the plan counts the segments'
	 * footprints where they are, a move reserves a bound on the new
	 * one) */
	uint64_t balance_skipped;
};

/* Fill *@st.  st->size must be set: sizeof(*st), or the size before
 * balance_skipped (offsetof(struct mkv_store_stats, balance_skipped)),
 * which fills the fields before it only.  Returns 0 or -EINVAL (any
 * other size, NULL). */
MKV_API int mkv_store_get_stats(struct mkv_store *s,
				struct mkv_store_stats *st);

#ifdef __cplusplus
}
#endif
#endif
