/* SPDX-License-Identifier: MIT */
#include "io/uring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <liburing.h>

struct uring_engine {
	struct io_uring ring;
	unsigned depth;
	void *buf;
	size_t buf_len;
	struct uring_engine_stats st;
};

int uring_engine_create(unsigned depth, size_t buf_bytes,
			struct uring_engine **out)
{
	struct uring_engine *e;
	long pg = sysconf(_SC_PAGESIZE);
	int rc;

	if (!out || depth == 0 || depth > 4096)
		return -EINVAL;
	e = calloc(1, sizeof *e);
	if (!e)
		return -ENOMEM;
	e->depth = depth;
	rc = io_uring_queue_init(depth, &e->ring, 0);
	if (rc < 0) {
		free(e);
		return rc;
	}
	if (buf_bytes) {
		struct iovec iov;

		e->buf_len = (buf_bytes + (size_t)pg - 1) & ~((size_t)pg - 1);
		e->buf = mmap(NULL, e->buf_len, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (e->buf == MAP_FAILED) {
			io_uring_queue_exit(&e->ring);
			free(e);
			return -ENOMEM;
		}
		iov.iov_base = e->buf;
		iov.iov_len = e->buf_len;
		/* Registration pins the pages (charged to RLIMIT_MEMLOCK
		 * without CAP_IPC_LOCK): a failure is reported, not hidden. */
		rc = io_uring_register_buffers(&e->ring, &iov, 1);
		if (rc < 0) {
			munmap(e->buf, e->buf_len);
			io_uring_queue_exit(&e->ring);
			free(e);
			return rc;
		}
	}
	*out = e;
	return 0;
}

void uring_engine_destroy(struct uring_engine *e)
{
	if (!e)
		return;
	if (e->buf) {
		io_uring_unregister_buffers(&e->ring);
		munmap(e->buf, e->buf_len);
	}
	io_uring_queue_exit(&e->ring);
	free(e);
}

void *uring_engine_buf(struct uring_engine *e, size_t *len)
{
	if (len)
		*len = e ? e->buf_len : 0;
	return e ? e->buf : NULL;
}

void uring_engine_get_stats(const struct uring_engine *e,
			    struct uring_engine_stats *st)
{
	if (e && st)
		*st = e->st;
}

/* Per-op progress while in flight. */
struct op_state {
	size_t done;
	int finished;
};

static int in_fixed(const struct uring_engine *e, const void *p, size_t len)
{
	const char *b = e->buf, *q = p;

	return b && q >= b && q + len <= b + e->buf_len;
}

static void prep(struct uring_engine *e, struct io_uring_sqe *sqe,
		 struct uring_op *op, size_t done, unsigned idx, int drain)
{
	char *buf = (char *)op->buf + done;
	unsigned len = (unsigned)(op->len - done);
	uint64_t off = op->off + done;

	switch (op->opcode) {
	case URING_OP_READ:
		if (in_fixed(e, buf, len)) {
			io_uring_prep_read_fixed(sqe, op->fd, buf, len, off, 0);
			e->st.fixed_ops++;
		} else {
			io_uring_prep_read(sqe, op->fd, buf, len, off);
		}
		break;
	case URING_OP_WRITE:
		if (in_fixed(e, buf, len)) {
			io_uring_prep_write_fixed(sqe, op->fd, buf, len, off,
						  0);
			e->st.fixed_ops++;
		} else {
			io_uring_prep_write(sqe, op->fd, buf, len, off);
		}
		break;
	case URING_OP_FDATASYNC:
		io_uring_prep_fsync(sqe, op->fd, IORING_FSYNC_DATASYNC);
		break;
	}
	if (drain)
		sqe->flags |= IOSQE_IO_DRAIN;
	io_uring_sqe_set_data64(sqe, idx);
	e->st.ops++;
}

/* Largest single transfer: the SQE length field is 32 bits. */
#define MAX_XFER ((size_t)1 << 30)

static int op_invalid(const struct uring_op *op)
{
	return (op->flags & ~URING_OP_F_LINK) ||
	       op->opcode > URING_OP_FDATASYNC ||
	       (op->opcode != URING_OP_FDATASYNC &&
		(!op->buf || op->len == 0 || op->len > MAX_XFER));
}

int uring_engine_run(struct uring_engine *e, struct uring_op *ops, unsigned n)
{
	return uring_engine_run_hooks(e, ops, n, NULL, NULL);
}

int uring_engine_run_hooks(struct uring_engine *e, struct uring_op *ops,
			   unsigned n, const struct uring_hooks *h,
			   unsigned *n_out)
{
	struct op_state *s;
	unsigned next = 0, inflight = 0, left, resub = 0, ready, nfin = 0;
	unsigned *fin;
	int first_err = 0, last = 1;
	unsigned (*more)(void *, unsigned, int *) = h ? h->more : NULL;
	void (*done)(void *, unsigned) = h ? h->done : NULL;

	if (n_out)
		*n_out = 0;
	if (!e || (!ops && n))
		return -EINVAL;
	for (unsigned i = 0; !more && i < n; i++) {
		if (op_invalid(&ops[i]) ||
		    (ops[i].flags & URING_OP_F_LINK && i + 1 == n))
			return -EINVAL;
	}
	for (unsigned i = 0, chain = 1; !more && i < n; i++) {
		/* a chain must fit the ring, or it could never be issued */
		chain = (i && (ops[i - 1].flags & URING_OP_F_LINK)) ? chain + 1 : 1;
		if (chain > e->depth)
			return -EINVAL;
	}
	if (n == 0)
		return 0;
	s = calloc(n, sizeof *s);
	fin = calloc(n, sizeof *fin); /* finished since the last done() calls */
	if (!s || !fin) {
		free(s);
		free(fin);
		return -ENOMEM;
	}
	left = n;
	ready = n;
	if (more) {
		/* The hooks' ops are checked as they come: the first batch now,
		 * later ones after each call below. */
		last = 0;
		ready = 0;
		goto produce;
	}

	while (left) {
		/* Fill the ring: a batch of new ops, one submit. */
		unsigned queued = 0;
		int producing;

		while (next < ready) {
			unsigned chain = 1;

			/* A linked chain goes into one submission whole: a
			 * chain cut at the end of a submission is broken. */
			while (next + chain - 1 < ready &&
			       (ops[next + chain - 1].flags & URING_OP_F_LINK))
				chain++;
			if (next + chain > ready)
				chain = ready - next;
			if (inflight + chain > e->depth ||
			    io_uring_sq_space_left(&e->ring) < chain)
				break;
			for (unsigned c = 0; c < chain; c++, next++) {
				struct io_uring_sqe *sqe;
				const struct uring_op *op = &ops[next];
				int linked_prev = next > 0 &&
					(ops[next - 1].flags & URING_OP_F_LINK);

				if (s[next].finished)
					continue; /* refused when made ready */
				sqe = io_uring_get_sqe(&e->ring);
				prep(e, sqe, &ops[next], 0, next,
				     op->opcode == URING_OP_FDATASYNC &&
					     !linked_prev);
				if (op->flags & URING_OP_F_LINK && c + 1 < chain)
					sqe->flags |= IOSQE_IO_LINK;
				inflight++;
				queued++;
			}
		}
		/* With more ops to prepare, do not wait: submit, reap what is
		 * there, and let the caller work while these fly. */
		producing = !last && next == ready;
		if (queued || resub || (inflight && !producing)) {
			int rc = producing ? io_uring_submit(&e->ring)
					   : io_uring_submit_and_wait(&e->ring, 1);

			if (queued || resub)
				e->st.submits++;
			else
				e->st.waits++;
			resub = 0;
			if (rc < 0 && rc != -EINTR) {
				/* The ring itself failed: nothing in flight
				 * can be trusted to complete; fail the lot. */
				first_err = rc;
				for (unsigned i = 0; i < ready; i++)
					if (!s[i].finished)
						ops[i].res = rc;
				goto out_drain;
			}
		}
		/* Reap whatever completed. */
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;

		io_uring_for_each_cqe(&e->ring, head, cqe) {
			unsigned i = (unsigned)io_uring_cqe_get_data64(cqe);
			struct uring_op *op = &ops[i];
			int res = cqe->res;

			seen++;
			inflight--;
			if (op->opcode == URING_OP_FDATASYNC || res < 0) {
				op->res = res < 0 ? res : 0;
				s[i].finished = 1;
				fin[nfin++] = i;
				left--;
				continue;
			}
			if (op->opcode == URING_OP_READ)
				e->st.bytes_read += (uint64_t)res;
			else
				e->st.bytes_written += (uint64_t)res;
			s[i].done += (size_t)res;
			if (s[i].done == op->len || res == 0) {
				op->res = (int64_t)s[i].done;
				s[i].finished = 1;
				fin[nfin++] = i;
				left--;
				continue;
			}
			/* Short transfer: resubmit the remainder. */
			struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);

			if (!sqe) {
				/* Cannot happen with inflight <= depth, but
				 * never spin: report it as an I/O error. */
				op->res = -EIO;
				s[i].finished = 1;
				fin[nfin++] = i;
				left--;
				continue;
			}
			e->st.retries++;
			prep(e, sqe, op, s[i].done, i, 0);
			inflight++;
			resub++;
		}
		io_uring_cq_advance(&e->ring, seen);
		/* The caller's work runs with the CQ ring already freed. */
		for (unsigned k = 0; done && k < nfin; k++)
			done(h->arg, fin[k]);
		nfin = 0;
		if (!producing)
			continue;
produce:
		{
			unsigned r = more(h->arg, ready, &last);

			if (r > n)
				r = n;
			if (r < ready)
				r = ready;
			for (unsigned i = ready; i < r; i++) {
				if (!op_invalid(&ops[i]) &&
				    !(ops[i].flags & URING_OP_F_LINK))
					continue;
				ops[i].res = -EINVAL;
				s[i].finished = 1;
				left--;
				if (done)
					done(h->arg, i);
			}
			if (r == ready && !last)
				last = 1; /* no progress: take it as the end */
			if (last) {
				left -= n - r;
				n = r;
			}
			ready = r;
		}
	}
	for (unsigned i = 0; i < n; i++) {
		if (first_err)
			break;
		if (ops[i].res < 0)
			first_err = (int)ops[i].res;
		else if (ops[i].opcode != URING_OP_FDATASYNC &&
			 (size_t)ops[i].res != ops[i].len)
			first_err = -EIO;
	}
	if (n_out)
		*n_out = n;
	free(s);
	free(fin);
	return first_err;

out_drain:
	/* Wait out what is in flight so no completion outlives the ops. */
	while (inflight) {
		struct io_uring_cqe *cqe;

		if (io_uring_wait_cqe(&e->ring, &cqe) < 0)
			break;
		io_uring_cqe_seen(&e->ring, cqe);
		inflight--;
	}
	for (unsigned i = 0; done && i < ready; i++)
		if (!s[i].finished)
			done(h->arg, i);
	if (n_out)
		*n_out = ready;
	free(s);
	free(fin);
	return first_err;
}
