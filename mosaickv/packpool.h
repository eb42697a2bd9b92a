/* SPDX-License-Identifier: MIT */
/*
 * mosaickv/packpool — pack many small pieces into one buffer on several
 * threads while the pieces are still being listed, handing each packed
 * chunk to a copy function as soon as it is complete.
 *
 * Why: a fetch gathers ~1,600 pieces of ~1 KiB (the selected blocks of 64
 * segments) from pinned host memory to the device.  One copy per piece
 * runs at ~1 GB/s; a kernel reading mapped memory tops out at 32-38 GB/s
 * on the H200 against 42-45 GB/s for the copy engine; one thread packs at
 * only 6-9 GB/s.  So the fetch packs on N threads into pinned staging, in
 * chunks cut while the caller is still resolving blocks, and each chunk
 * goes to the device in one asynchronous copy the moment it is packed:
 * the copy engine runs at its own rate, overlapped with both.
 *
 * Internal (not exported).  One producer thread drives a pool: begin,
 * publish (any number of times), finish; then the next job.  The pool's
 * threads only read the pieces and write the destination; they take no
 * lock of the caller's.  Functions return 0 or -errno and never abort.
 */
#ifndef MKV_PACKPOOL_H
#define MKV_PACKPOOL_H

#include <stddef.h>
#include <stdint.h>

/* One piece: @len bytes from @src to byte @dst of the destination (the
 * layout of struct gpu_piece, so one table can serve both movers). */
struct pp_piece {
	const void *src;
	uint64_t dst;
	uint64_t len;
};

/*
 * Called once destination bytes [@off, @off + @len) are packed, on a pool
 * thread or on the producer (which helps in finish).  Ranges are disjoint,
 * passed in destination order, one call at a time: 64 KiB first, then
 * doubling to 512 KiB, and the rest at the end.  Returns 0 or -errno; the
 * first error is what finish reports.
 */
typedef int (*pp_copy_fn)(void *arg, uint64_t off, uint64_t len);

struct packpool;

/*
 * @threads pool threads (1..64), bound to NUMA node @numa_node when >= 0;
 * they spin for up to @spin_us microseconds looking for work before they
 * sleep (decode fetches come every few hundred microseconds: a sleeping
 * thread takes tens of microseconds to wake).  @fn (may be NULL) and
 * @arg are fixed for the pool's life.
 * Returns 0, -EINVAL, -ENOMEM, or -errno of pthread_create.
 */
int packpool_create(unsigned threads, int numa_node, unsigned spin_us,
		    pp_copy_fn fn, void *arg, struct packpool **out);
/* Joins the threads.  No job may be running.  NULL is accepted. */
void packpool_destroy(struct packpool *p);

/*
 * Start a job over @pieces (owned by the caller, unchanged from publish
 * until finish returns) into @dst.  The pieces must be laid out in
 * destination order without gaps: piece i+1 starts where piece i ends, so
 * that a run of pieces is one range of @dst.
 */
void packpool_begin(struct packpool *p, const struct pp_piece *pieces,
		    char *dst);
/*
 * Pieces [0, @n) are final.  Cuts a chunk (the unit one thread packs)
 * once 32 KiB have accumulated since the last cut.
 */
void packpool_publish(struct packpool *p, uint32_t n);
/*
 * Pieces [0, @n) are the whole job (@n not below any published count):
 * publish the rest, help pack, and return once every chunk is packed and
 * its copy function has returned.  Returns 0 or the first -errno of the
 * copy function.
 */
int packpool_finish(struct packpool *p, uint32_t n);

#endif
