/* SPDX-License-Identifier: MIT */
/* Helpers for the store tests: synthetic payloads with a block layout. */
#ifndef MKV_TEST_STOREUTIL_H
#define MKV_TEST_STOREUTIL_H

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <mosaickv/store.h>
#include "mosaickv/store_internal.h"
#include "io/segfile.h"
#include "tierutil.h"

/* A payload of HDR bytes, n_blocks × VB values, n_blocks × BB bitmaps and
 * a trailer, like a serialized segment. */
#define SU_HDR 256u
#define SU_VB 1024u
#define SU_BB 64u
#define SU_TRAIL 512u

static inline size_t su_len(uint32_t nb)
{
	return SU_HDR + (size_t)nb * (SU_VB + SU_BB) + SU_TRAIL;
}

static inline struct mkv_store_layout su_layout(uint32_t nb)
{
	struct mkv_store_layout l = {
		.n_blocks = nb,
		.values_off = SU_HDR, .values_block = SU_VB,
		.values_len = (uint64_t)nb * SU_VB,
		.bitmaps_off = SU_HDR + (uint64_t)nb * SU_VB,
		.bitmaps_block = SU_BB, .bitmaps_len = (uint64_t)nb * SU_BB,
	};
	return l;
}

static inline char *su_payload(uint32_t nb, uint64_t seed)
{
	char *p = malloc(su_len(nb));

	cr_assert(p);
	tu_fill(p, su_len(nb), seed);
	return p;
}

static inline struct mkv_seg_key su_key(uint64_t seq, uint32_t seg)
{
	struct mkv_seg_key k = { .seq = seq, .layer = 3, .head = 1,
				 .seg = seg, .kind = 1 };
	return k;
}

/* Read @k back and compare with payload(seed). */
static inline void su_check(struct mkv_store *s, struct mkv_seg_key k,
			    uint32_t nb, uint64_t seed)
{
	size_t len = su_len(nb);
	char *ref = su_payload(nb, seed), *buf = malloc(len);

	cr_assert_eq(mkv_store_read(s, &k, buf, len), (int64_t)len,
		     "read seq %llu seg %u", (unsigned long long)k.seq, k.seg);
	cr_assert_eq(memcmp(ref, buf, len), 0, "payload differs");
	free(ref);
	free(buf);
}

/* Synchronous wrapper of the async calls: waits for the callback. */
struct su_wait {
	pthread_mutex_t m;
	pthread_cond_t c;
	int done, status, calls;
};

static inline void su_cb(void *arg, int status)
{
	struct su_wait *w = arg;

	pthread_mutex_lock(&w->m);
	w->done = 1;
	w->calls++;
	w->status = status;
	pthread_cond_broadcast(&w->c);
	pthread_mutex_unlock(&w->m);
}

static inline void su_wait_init(struct su_wait *w)
{
	pthread_mutex_init(&w->m, NULL);
	pthread_cond_init(&w->c, NULL);
	w->done = w->status = w->calls = 0;
}

static inline int su_wait(struct su_wait *w)
{
	pthread_mutex_lock(&w->m);
	while (!w->done)
		pthread_cond_wait(&w->c, &w->m);
	w->done = 0;
	pthread_mutex_unlock(&w->m);
	return w->status;
}

/* Move and wait; returns the callback status (or the submit error). */
static inline int su_move(struct mkv_store *s, struct mkv_seg_key k, int dst)
{
	struct su_wait w;
	int rc;

	su_wait_init(&w);
	rc = mkv_store_move(s, &k, (enum mkv_tier)dst, su_cb, &w);
	if (rc)
		return rc;
	rc = su_wait(&w);
	cr_assert_eq(w.calls, 1);
	return rc;
}

static inline int su_tier(struct mkv_store *s, struct mkv_seg_key k)
{
	struct mkv_seg_info info;

	cr_assert_eq(mkv_store_info(s, &k, &info), 0);
	return (int)info.tier;
}

static inline struct mkv_store_opts su_opts(void)
{
	struct mkv_store_opts o;

	cr_assert_eq(mkv_store_opts_init(&o, sizeof o), 0);
	o.gpu = -1;
	o.hbm_bytes = 8 << 20;
	o.host_bytes = 16 << 20;
	o.nvme_bytes = 1 << 30;
	o.workers = 2;
	return o;
}

/*
 * Flip one payload bit of the first complete frame of @dir's first slab
 * (found by a plain walk of its first MiB), durably, as corruption on disk
 * would: a reopen must report that frame and adopt the others.
 */
static inline void su_flip_first_frame(const char *dir)
{
	char slab[512];
	unsigned char *blk = aligned_alloc(4096, 1 << 20);
	off_t victim = -1;
	int fd;

	cr_assert(blk);
	snprintf(slab, sizeof slab, "%s/slab-000000.mkv", dir);
	fd = open(slab, O_RDWR | O_DIRECT);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pread(fd, blk, 1 << 20, 0), 1 << 20);
	for (size_t q = 0; q < (1 << 20) && victim < 0; q += 4096) {
		struct segfile_meta sm;

		if (segfile_parse_header(blk + q, 4096, &sm) == 0 && sm.place == q)
			victim = (off_t)q;
	}
	cr_assert_geq(victim, 0);
	cr_assert_eq(pread(fd, blk, 4096, victim), 4096);
	blk[1000] ^= 1;
	cr_assert_eq(pwrite(fd, blk, 4096, victim), 4096);
	cr_assert_eq(fsync(fd), 0);
	close(fd);
	free(blk);
}

#endif
