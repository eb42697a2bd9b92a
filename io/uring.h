/* SPDX-License-Identifier: MIT */
/*
 * io/uring — a small io_uring engine: one ring per worker thread, one
 * registered (fixed) buffer area per ring, batched submission.
 *
 * Thread safety: an engine belongs to one thread at a time (it is the
 * worker's private ring); nothing in it is locked.  Different engines are
 * independent.
 *
 * Buffers: uring_engine_buf() hands out the registered area (page-aligned,
 * suitable for O_DIRECT).  An op whose buffer lies entirely inside it is
 * issued as READ_FIXED / WRITE_FIXED (no per-I/O page pinning); any other
 * buffer is issued as a plain READ / WRITE, which still works but costs the
 * kernel a get_user_pages per I/O.
 */
#ifndef MKV_IO_URING_H
#define MKV_IO_URING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum uring_opcode {
	URING_OP_READ = 0,
	URING_OP_WRITE = 1,
	URING_OP_FDATASYNC = 2, /* buf, len, off ignored */
};

/* uring_op.flags */
#define URING_OP_F_LINK 0x1u /* the next op starts only after this one
			      * completes in full (IOSQE_IO_LINK); a failed
			      * or short op cancels the rest of its chain
			      * (-ECANCELED) */

struct uring_op {
	int fd;
	enum uring_opcode opcode;
	uint32_t flags;      /* URING_OP_F_* */
	void *buf;
	size_t len;
	uint64_t off;
	/* out: bytes transferred (== len unless a read hit end of file), 0 for
	 * a sync, or -errno */
	int64_t res;
};

struct uring_engine;

struct uring_engine_stats {
	uint64_t submits;   /* submissions that carried new SQEs (batches) */
	uint64_t waits;     /* waits for completions without new SQEs */
	uint64_t ops;       /* SQEs issued, retries included */
	uint64_t fixed_ops; /* of which READ_FIXED / WRITE_FIXED */
	uint64_t retries;   /* short transfers resubmitted */
	uint64_t bytes_read, bytes_written;
};

/*
 * Create a ring of @depth entries (1..4096) and register one page-aligned
 * buffer area of @buf_bytes (0: none; rounded up to pages).  Returns 0,
 * -EINVAL, -ENOMEM, or the -errno of io_uring_queue_init /
 * io_uring_register_buffers (-ENOSYS / -EPERM where io_uring is not
 * available or disabled; callers skip or fall back).
 */
int uring_engine_create(unsigned depth, size_t buf_bytes,
			struct uring_engine **out);
void uring_engine_destroy(struct uring_engine *e);

/* The registered area and its size (NULL, 0 if none).  Owned by the
 * engine, valid until destroy. */
void *uring_engine_buf(struct uring_engine *e, size_t *len);

/*
 * Issue the @n ops, at most depth in flight, submitting them in batches, and
 * wait for all.  A short read or write that is not at end of file is
 * resubmitted for the remainder (it counts as a retry); a read returning 0
 * before len completes the op short.  An FDATASYNC op is ordered after
 * every op before it in the array (IOSQE_IO_DRAIN), so "write…, fdatasync"
 * in one call means the sync covers the writes — unless the op before it
 * is linked to it (URING_OP_F_LINK): then it waits for that op only, which
 * lets "write₁→sync₁, write₂→sync₂, …" for many files run in parallel.
 * A linked chain is never split across submissions.  A short transfer in a
 * chain is resubmitted, but its successors were already cancelled.
 * Returns 0 when every op completed in full, else the first failure: the
 * op's -errno, or -EIO for a short transfer.  Every op's res is set.
 */
int uring_engine_run(struct uring_engine *e, struct uring_op *ops, unsigned n);

/*
 * Hooks that let a caller overlap its own work with the I/O of one run.
 * Both run in the calling thread, between waits for completions.
 */
struct uring_hooks {
	/*
	 * May be NULL: all @n ops are ready at the start.  Otherwise called
	 * first with @ready 0, then each time every ready op has been issued
	 * while earlier ones are still in flight: prepare ops from index
	 * @ready on (encode their buffers, say) and return how many are ready
	 * now (a batch, issued with one submission).  Set *@last when no op
	 * will follow: the run then ends at the returned count (ops past it
	 * are never looked at and their res is left alone); returning @ready
	 * itself ends it too.  Ops made ready this way cannot be linked
	 * (URING_OP_F_LINK).
	 */
	unsigned (*more)(void *arg, unsigned ready, int *last);
	/* May be NULL.  Called once per op as soon as it finished (its res
	 * set), so the caller can use its buffer while others fly. */
	void (*done)(void *arg, unsigned i);
	void *arg;
};

/*
 * uring_engine_run() with hooks (@h may be NULL).  An op made ready by
 * more() that is invalid gets res -EINVAL and is not issued.  Returns as
 * uring_engine_run() over the ops that were made ready; *@n_out (may be
 * NULL) receives their count.
 */
int uring_engine_run_hooks(struct uring_engine *e, struct uring_op *ops,
			   unsigned n, const struct uring_hooks *h,
			   unsigned *n_out);

void uring_engine_get_stats(const struct uring_engine *e,
			    struct uring_engine_stats *st);

#endif
