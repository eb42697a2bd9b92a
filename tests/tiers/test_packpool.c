/* SPDX-License-Identifier: MIT */
/*
 * mosaickv/packpool: the fetch's multi-threaded packer.  Every job is
 * checked against a serial memcpy of the same pieces, and the copy
 * function's chunks must cover the destination exactly once (they stand
 * in for the host-to-device copies, so a byte copied twice or never would
 * be a block missing on the device).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mosaickv/packpool.h"

#define SRC_BYTES ((size_t)8 << 20)
#define MAX_DST ((size_t)4 << 20)

struct sink {
	const char *dst;  /* the pool's destination */
	char *mirror;     /* what the "device" received */
	uint8_t *cover;   /* times each byte was handed over */
	uint64_t fail_at; /* chunk containing this offset fails; UINT64_MAX */
	_Atomic unsigned calls;
	_Atomic int inside;  /* calls running now: must never exceed 1 */
	uint64_t next_off;   /* where the next call must start (in order) */
	_Atomic int bad;     /* a call overlapped another or came out of order */
};

static int sink_copy(void *arg, uint64_t off, uint64_t len)
{
	struct sink *k = arg;

	/* One call at a time, in destination order: the ranges must tile
	 * the destination from 0. */
	if (atomic_fetch_add(&k->inside, 1) != 0)
		k->bad = 1;
	if (off != k->next_off)
		k->bad = 1;
	k->next_off = off + len;
	memcpy(k->mirror + off, k->dst + off, len);
	for (uint64_t i = 0; i < len; i++)
		k->cover[off + i]++;
	k->calls++;
	atomic_fetch_sub(&k->inside, 1);
	if (k->fail_at >= off && k->fail_at < off + len)
		return -EIO;
	return 0;
}

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* Random pieces: lengths 1..3000 (mostly block-sized), random sources,
 * laid out back to back up to @max bytes.  Returns the count. */
static uint32_t make_pieces(struct pp_piece *pc, uint32_t cap, const char *src,
			    size_t max, uint64_t *bytes)
{
	uint64_t at = 0;
	uint32_t n = 0;

	while (n < cap) {
		uint64_t len = rnd() % 4 ? 1024 + rnd() % 257 : 1 + rnd() % 3000;
		uint64_t from = rnd() % (SRC_BYTES - len);

		if (at + len > max)
			break;
		pc[n++] = (struct pp_piece){ src + from, at, len };
		at += len;
	}
	*bytes = at;
	return n;
}

static void run_jobs(unsigned threads, unsigned spin_us, int jobs)
{
	char *src = malloc(SRC_BYTES), *dst = malloc(MAX_DST),
	     *ref = malloc(MAX_DST), *mirror = malloc(MAX_DST);
	uint8_t *cover = malloc(MAX_DST);
	struct pp_piece *pc = malloc(8192 * sizeof *pc);
	struct sink k = { dst, mirror, cover, UINT64_MAX, 0, 0, 0, 0 };
	struct packpool *p;

	cr_assert(src && dst && ref && mirror && cover && pc);
	for (size_t i = 0; i < SRC_BYTES; i++)
		src[i] = (char)rnd();
	cr_assert_eq(packpool_create(threads, -1, spin_us, sink_copy, &k, &p), 0);
	for (int j = 0; j < jobs; j++) {
		uint64_t bytes;
		size_t max = 1 + rnd() % MAX_DST;
		uint32_t n = make_pieces(pc, 8192, src, max, &bytes), pub = 0;

		memset(dst, 0xa5, MAX_DST);
		memset(mirror, 0x5a, MAX_DST);
		memset(cover, 0, MAX_DST);
		k.calls = 0;
		k.next_off = 0;
		for (uint32_t i = 0; i < n; i++)
			memcpy(ref + pc[i].dst, pc[i].src, pc[i].len);
		packpool_begin(p, pc, dst);
		/* Publish in uneven steps, as a fetch does per segment. */
		while (pub < n) {
			uint32_t step = 1 + (uint32_t)(rnd() % 64);

			pub = pub + step > n ? n : pub + step;
			packpool_publish(p, pub);
		}
		cr_assert_eq(packpool_finish(p, n), 0, "job %d", j);
		cr_assert_eq(k.bad, 0, "job %d: copies overlapped or out of order", j);
		cr_assert_eq(k.next_off, bytes, "job %d: copies end at the end", j);
		cr_assert(memcmp(dst, ref, bytes) == 0, "job %d: packed bytes", j);
		cr_assert(memcmp(mirror, ref, bytes) == 0, "job %d: copied bytes", j);
		for (uint64_t i = 0; i < bytes; i++)
			cr_assert_eq(cover[i], 1, "job %d: byte %llu copied %u times",
				     j, (unsigned long long)i, cover[i]);
		for (uint64_t i = bytes; i < MAX_DST; i++)
			cr_assert_eq(cover[i], 0);
		if (bytes >= ((uint64_t)2 << 20))
			cr_assert_gt(k.calls, 3, "chunks are cut while publishing");
	}
	packpool_destroy(p);
	free(src);
	free(dst);
	free(ref);
	free(mirror);
	free(cover);
	free(pc);
}

Test(packpool, one_thread_many_jobs) { run_jobs(1, 0, 40); }
Test(packpool, four_threads_spinning) { run_jobs(4, 200, 80); }
Test(packpool, three_threads_sleeping) { run_jobs(3, 0, 80); }

Test(packpool, empty_job_and_bad_args)
{
	struct sink k = { 0 };
	struct packpool *p;

	cr_assert_eq(packpool_create(0, -1, 0, sink_copy, &k, &p), -EINVAL);
	cr_assert_eq(packpool_create(65, -1, 0, sink_copy, &k, &p), -EINVAL);
	cr_assert_eq(packpool_create(2, -1, 0, sink_copy, &k, NULL), -EINVAL);
	cr_assert_eq(packpool_create(2, -1, 0, sink_copy, &k, &p), 0);
	packpool_begin(p, NULL, NULL);
	cr_assert_eq(packpool_finish(p, 0), 0);
	cr_assert_eq(k.calls, 0);
	packpool_destroy(p);
	packpool_destroy(NULL);
}

/* A failing copy is reported, and the job still completes: every chunk is
 * packed and handed over (the fetch waits for all before unpinning). */
Test(packpool, copy_error_reported)
{
	char *src = malloc(SRC_BYTES), *dst = malloc(MAX_DST),
	     *mirror = calloc(1, MAX_DST);
	uint8_t *cover = calloc(1, MAX_DST);
	struct pp_piece *pc = malloc(4096 * sizeof *pc);
	struct sink k = { dst, mirror, cover, 0, 0, 0, 0, 0 };
	struct packpool *p;
	uint64_t bytes;
	uint32_t n;

	cr_assert(src && dst && mirror && cover && pc);
	memset(src, 7, SRC_BYTES);
	n = make_pieces(pc, 4096, src, (size_t)3 << 20, &bytes);
	k.fail_at = bytes / 2;
	cr_assert_eq(packpool_create(2, -1, 50, sink_copy, &k, &p), 0);
	packpool_begin(p, pc, dst);
	for (uint32_t i = 1; i <= n; i++)
		packpool_publish(p, i);
	cr_assert_eq(packpool_finish(p, n), -EIO);
	for (uint64_t i = 0; i < bytes; i++)
		cr_assert_eq(cover[i], 1);
	/* The next job starts clean. */
	cr_assert_eq(k.bad, 0);
	k.fail_at = UINT64_MAX;
	k.next_off = 0;
	memset(cover, 0, MAX_DST);
	packpool_begin(p, pc, dst);
	cr_assert_eq(packpool_finish(p, n), 0);
	for (uint64_t i = 0; i < bytes; i++)
		cr_assert_eq(cover[i], 1);
	packpool_destroy(p);
	free(src);
	free(dst);
	free(mirror);
	free(cover);
	free(pc);
}
