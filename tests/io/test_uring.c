/* SPDX-License-Identifier: MIT */
/* tests/io/test_uring.c — io/uring.c on real O_DIRECT files. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "io/uring.h"
#include "testutil.h"

static struct uring_engine *engine(unsigned depth, size_t buf)
{
	struct uring_engine *e = NULL;
	int rc = uring_engine_create(depth, buf, &e);

	if (rc == -ENOSYS || rc == -EPERM || rc == -EOPNOTSUPP)
		cr_skip_test("io_uring unavailable here (%d)", rc);
	cr_assert_eq(rc, 0, "uring_engine_create: %d", rc);
	return e;
}

static int open_direct(const char *dir, const char *name)
{
	char p[512];
	int fd;

	snprintf(p, sizeof p, "%s/%s", dir, name);
	fd = open(p, O_CREAT | O_RDWR | O_DIRECT, 0600);
	cr_assert_geq(fd, 0);
	return fd;
}

/* 64 writes of 64 KiB batched at depth 16 from the registered area, a
 * drained fdatasync, and 64 reads back: bytes identical, all fixed ops. */
Test(uring, batched_fixed_write_sync_read)
{
	char dir[256];
	enum { N = 64, SZ = 65536 };
	struct uring_engine *e;
	struct uring_op ops[N + 1];
	struct uring_engine_stats st;
	uint8_t *buf;
	size_t blen;
	int fd;

	tu_mkdtemp(dir, sizeof dir);
	e = engine(16, (size_t)N * SZ);
	buf = uring_engine_buf(e, &blen);
	cr_assert(buf && blen >= (size_t)N * SZ);
	fd = open_direct(dir, "f");
	tu_fill(buf, (size_t)N * SZ, 42);
	for (int i = 0; i < N; i++)
		ops[i] = (struct uring_op){ .fd = fd, .opcode = URING_OP_WRITE,
			.buf = buf + (size_t)i * SZ, .len = SZ,
			.off = (uint64_t)(N - 1 - i) * SZ };
	ops[N] = (struct uring_op){ .fd = fd, .opcode = URING_OP_FDATASYNC };
	cr_assert_eq(uring_engine_run(e, ops, N + 1), 0);
	for (int i = 0; i < N; i++)
		cr_assert_eq(ops[i].res, SZ);
	cr_assert_eq(ops[N].res, 0);

	uint8_t *ref = malloc((size_t)N * SZ);
	memcpy(ref, buf, (size_t)N * SZ);
	memset(buf, 0, (size_t)N * SZ);
	for (int i = 0; i < N; i++)
		ops[i] = (struct uring_op){ .fd = fd, .opcode = URING_OP_READ,
			.buf = buf + (size_t)i * SZ, .len = SZ,
			.off = (uint64_t)(N - 1 - i) * SZ };
	cr_assert_eq(uring_engine_run(e, ops, N), 0);
	cr_assert_eq(memcmp(ref, buf, (size_t)N * SZ), 0);
	uring_engine_get_stats(e, &st);
	cr_assert_eq(st.fixed_ops, 2 * N);
	/* 64 ops at depth 16: batches of at most 16, so >= 4 per pass, and
	 * never one submission per op */
	cr_assert_geq(st.submits, 2 * N / 16);
	cr_assert_lt(st.submits, 2 * N);
	cr_assert_eq(st.bytes_written, (uint64_t)N * SZ);
	cr_assert_eq(st.bytes_read, (uint64_t)N * SZ);
	close(fd);
	free(ref);
	uring_engine_destroy(e);
	tu_rmtree(dir);
}

/* Buffers outside the registered area still work (plain READ/WRITE). */
Test(uring, unregistered_buffer)
{
	char dir[256];
	struct uring_engine *e;
	struct uring_engine_stats st;
	uint8_t *a = aligned_alloc(4096, 8192), *b = aligned_alloc(4096, 8192);
	int fd;

	tu_mkdtemp(dir, sizeof dir);
	e = engine(4, 0);
	fd = open_direct(dir, "g");
	tu_fill(a, 8192, 5);
	struct uring_op w = { .fd = fd, .opcode = URING_OP_WRITE, .buf = a,
			      .len = 8192, .off = 4096 };
	cr_assert_eq(uring_engine_run(e, &w, 1), 0);
	struct uring_op r = { .fd = fd, .opcode = URING_OP_READ, .buf = b,
			      .len = 8192, .off = 4096 };
	cr_assert_eq(uring_engine_run(e, &r, 1), 0);
	cr_assert_eq(memcmp(a, b, 8192), 0);
	uring_engine_get_stats(e, &st);
	cr_assert_eq(st.fixed_ops, 0);
	close(fd);
	free(a);
	free(b);
	uring_engine_destroy(e);
	tu_rmtree(dir);
}

/* A read past end of file completes short and the run reports -EIO; an
 * error of one op (bad fd) is reported as its own -errno. */
Test(uring, short_read_and_errors_reported)
{
	char dir[256];
	struct uring_engine *e;
	uint8_t *buf;
	int fd;

	tu_mkdtemp(dir, sizeof dir);
	e = engine(8, 65536);
	buf = uring_engine_buf(e, NULL);
	fd = open_direct(dir, "h");
	tu_fill(buf, 4096, 1);
	struct uring_op w = { .fd = fd, .opcode = URING_OP_WRITE, .buf = buf,
			      .len = 4096, .off = 0 };
	cr_assert_eq(uring_engine_run(e, &w, 1), 0);
	struct uring_op r[2] = {
		{ .fd = fd, .opcode = URING_OP_READ, .buf = buf, .len = 16384,
		  .off = 0 },
		{ .fd = 9999, .opcode = URING_OP_READ, .buf = buf + 16384,
		  .len = 4096, .off = 0 },
	};
	cr_assert_eq(uring_engine_run(e, r, 2), -EIO);
	cr_assert_eq(r[0].res, 4096);
	cr_assert_eq(r[1].res, -EBADF);
	/* Misaligned O_DIRECT I/O fails with the kernel's -EINVAL. */
	struct uring_op m = { .fd = fd, .opcode = URING_OP_READ,
			      .buf = buf + 1, .len = 4096, .off = 0 };
	cr_assert_eq(uring_engine_run(e, &m, 1), -EINVAL);
	close(fd);
	uring_engine_destroy(e);
	tu_rmtree(dir);
}

/* Linked write->fdatasync chains for many files run in one batch; a chain
 * longer than the ring, or a link on the last op, is refused. */
Test(uring, linked_write_sync_chains)
{
	char dir[256];
	enum { N = 32, SZ = 16384 };
	struct uring_engine *e;
	struct uring_op ops[2 * N];
	struct uring_engine_stats st;
	int fds[N];
	uint8_t *buf;

	tu_mkdtemp(dir, sizeof dir);
	e = engine(64, (size_t)N * SZ);
	buf = uring_engine_buf(e, NULL);
	tu_fill(buf, (size_t)N * SZ, 8);
	for (int i = 0; i < N; i++) {
		char name[16];
		snprintf(name, sizeof name, "c%d", i);
		fds[i] = open_direct(dir, name);
		ops[2 * i] = (struct uring_op){ .fd = fds[i],
			.opcode = URING_OP_WRITE, .flags = URING_OP_F_LINK,
			.buf = buf + (size_t)i * SZ, .len = SZ, .off = 0 };
		ops[2 * i + 1] = (struct uring_op){ .fd = fds[i],
			.opcode = URING_OP_FDATASYNC };
	}
	cr_assert_eq(uring_engine_run(e, ops, 2 * N), 0);
	uring_engine_get_stats(e, &st);
	cr_assert_eq(st.submits, 1); /* all 64 SQEs in one submission */
	for (int i = 0; i < N; i++) {
		cr_assert_eq(ops[2 * i].res, SZ);
		cr_assert_eq(ops[2 * i + 1].res, 0);
		uint8_t *chk = aligned_alloc(4096, SZ);
		cr_assert_eq(pread(fds[i], chk, SZ, 0), SZ);
		cr_assert_eq(memcmp(chk, buf + (size_t)i * SZ, SZ), 0);
		free(chk);
	}
	/* A failed write cancels its sync: the run reports the failure. */
	struct uring_op bad[2] = {
		{ .fd = fds[0], .opcode = URING_OP_WRITE, .flags = URING_OP_F_LINK,
		  .buf = buf + 1, .len = 4096, .off = 0 }, /* misaligned */
		{ .fd = fds[0], .opcode = URING_OP_FDATASYNC } };
	cr_assert_eq(uring_engine_run(e, bad, 2), -EINVAL);
	cr_assert_eq(bad[1].res, -ECANCELED);
	struct uring_op last = { .fd = fds[0], .opcode = URING_OP_FDATASYNC,
				 .flags = URING_OP_F_LINK };
	cr_assert_eq(uring_engine_run(e, &last, 1), -EINVAL);
	for (int i = 0; i < N; i++)
		close(fds[i]);
	uring_engine_destroy(e);
	tu_rmtree(dir);
}

Test(uring, invalid_arguments)
{
	struct uring_engine *e = NULL;
	struct uring_op op = { .fd = 0, .opcode = URING_OP_READ, .buf = NULL,
			       .len = 10 };

	cr_assert_eq(uring_engine_create(0, 0, &e), -EINVAL);
	cr_assert_eq(uring_engine_create(5000, 0, &e), -EINVAL);
	cr_assert_eq(uring_engine_create(4, 0, NULL), -EINVAL);
	e = engine(4, 0);
	cr_assert_eq(uring_engine_run(e, &op, 1), -EINVAL);
	cr_assert_eq(uring_engine_run(NULL, &op, 1), -EINVAL);
	cr_assert_eq(uring_engine_run(e, NULL, 0), 0);
	uring_engine_destroy(e);
	uring_engine_destroy(NULL);
}

/* The hooks: more() hands out ops a few at a time (filling their buffers
 * as it goes) and may skip ahead; done() sees each op exactly once with its
 * result set; the file then holds exactly what was made ready. */
struct hk {
	struct uring_op *ops;
	uint8_t *buf;
	int fd;
	unsigned made, calls, stop_at;
	unsigned done_count[40];
	int64_t done_res[40];
};

static unsigned hk_more(void *arg, unsigned ready, int *last)
{
	struct hk *h = arg;
	unsigned k = ready;

	cr_assert_eq(ready, h->made, "more() must resume where it stopped");
	h->calls++;
	for (unsigned i = 0; i < 3 && k < h->stop_at; i++, k++) {
		tu_fill(h->buf + (size_t)k * 4096, 4096, 1000 + k);
		h->ops[k] = (struct uring_op){ .fd = h->fd,
			.opcode = URING_OP_WRITE, .buf = h->buf + (size_t)k * 4096,
			.len = 4096, .off = (uint64_t)k * 4096 };
		if (k == 7) /* an invalid op: refused, not issued */
			h->ops[k].len = 0;
	}
	h->made = k;
	*last = k == h->stop_at;
	return k;
}

static void hk_done(void *arg, unsigned i)
{
	struct hk *h = arg;

	cr_assert_lt(i, h->made, "done() for an op never made ready");
	h->done_count[i]++;
	h->done_res[i] = h->ops[i].res;
}

Test(uring, hooks_produce_and_complete)
{
	char dir[256];
	enum { N = 40 };
	struct uring_engine *e;
	struct uring_op ops[N];
	struct hk h = { 0 };
	unsigned ran = 0;

	tu_mkdtemp(dir, sizeof dir);
	e = engine(4, (size_t)N * 4096);
	h.ops = ops;
	h.buf = uring_engine_buf(e, NULL);
	h.fd = open_direct(dir, "h");
	h.stop_at = 20; /* of the 40 slots, only 20 ops come */
	struct uring_hooks hooks = { hk_more, hk_done, &h };
	cr_assert_eq(uring_engine_run_hooks(e, ops, N, &hooks, &ran), -EINVAL);
	cr_assert_eq(ran, 20);
	cr_assert_geq(h.calls, 7); /* 3 per call */
	for (unsigned i = 0; i < N; i++) {
		cr_assert_eq(h.done_count[i], i < 20 ? 1u : 0u, "op %u", i);
		if (i < 20)
			cr_assert_eq(h.done_res[i], i == 7 ? -EINVAL : 4096);
	}
	/* What is on disk: every written block, and block 7 never written */
	uint8_t *back = aligned_alloc(4096, 20 * 4096), ref[4096];
	cr_assert_eq(pread(h.fd, back, 20 * 4096, 0), 20 * 4096);
	for (unsigned i = 0; i < 20; i++) {
		if (i == 7) {
			memset(ref, 0, sizeof ref);
		} else {
			tu_fill(ref, 4096, 1000 + i);
		}
		cr_assert_eq(memcmp(back + (size_t)i * 4096, ref, 4096), 0,
			     "block %u", i);
	}
	free(back);
	struct uring_engine_stats st;
	uring_engine_get_stats(e, &st);
	cr_assert_eq(st.ops, 19);
	cr_assert_eq(st.fixed_ops, 19);
	close(h.fd);
	uring_engine_destroy(e);
	tu_rmtree(dir);
}
