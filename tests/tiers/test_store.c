/* SPDX-License-Identifier: MIT */
/* tests/tiers/test_store.c — mosaickv/store.c: directory, moves through
 * every tier, fetch, prefetch, pins, reopen, argument checks.  Real tiers:
 * mlock'ed jemalloc arena, O_DIRECT files through io_uring. */
#include <errno.h>
#include <stddef.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <criterion/criterion.h>

#include <mosaickv/common.h>
#include "io/segfile.h"
#include "storeutil.h"

static struct mkv_store *open_store(const char *dir, struct mkv_store_opts *o)
{
	struct mkv_store *s = NULL;
	int rc;

	o->nvme_dir = dir;
	rc = mkv_store_create(o, &s);
	if (rc == -ENOSYS || rc == -EPERM)
		cr_skip_test("io_uring unavailable (%d)", rc);
	cr_assert_eq(rc, 0, "mkv_store_create: %d (%s)", rc, mkv_strerror(rc));
	return s;
}

/* Every tier, down and up, returns the payload bit-exactly. */
Test(store, roundtrip_through_every_tier)
{
	char dir[256];
	struct mkv_store_opts o = su_opts();
	struct mkv_seg_key k = su_key(1, 0);
	char *p = su_payload(16, 77);
	struct mkv_store_layout l = su_layout(16);

	tu_mkdtemp(dir, sizeof dir);
	struct mkv_store *s = open_store(dir, &o);
	cr_assert_eq(mkv_store_put(s, &k, p, su_len(16), &l), 0);
	cr_assert_eq(su_tier(s, k), MKV_TIER_HBM);
	su_check(s, k, 16, 77);
	int path[] = { MKV_TIER_HOST, MKV_TIER_NVME, MKV_TIER_HOST, MKV_TIER_HBM,
		       MKV_TIER_NVME, MKV_TIER_HBM };
	for (unsigned i = 0; i < 6; i++) {
		cr_assert_eq(su_move(s, k, path[i]), 0, "move to %d", path[i]);
		cr_assert_eq(su_tier(s, k), path[i]);
		su_check(s, k, 16, 77);
	}
	cr_assert_eq(su_move(s, k, MKV_TIER_HBM), -EALREADY);
	struct mkv_store_stats st = { .size = sizeof st };
	cr_assert_eq(mkv_store_get_stats(s, &st), 0);
	cr_assert_eq(st.moves_done, 6);
	cr_assert_eq(st.moves_failed, 0);
	cr_assert_eq(st.tier[MKV_TIER_HBM].segments, 1);
	cr_assert_eq(st.tier[MKV_TIER_NVME].segments, 0);
	cr_assert_eq(st.tier[MKV_TIER_NVME].used, 0); /* file removed */
	cr_assert_gt(st.pinned_host_bytes, 0);
	cr_assert_eq(st.host_jemalloc, 1); /* this test links jemalloc */
	cr_assert_eq(st.balance_skipped, 0);
	/* The stats' previous version (before balance_skipped): the same
	 * fields, nothing written past its size; other sizes refused. */
	const size_t v1 = offsetof(struct mkv_store_stats, balance_skipped);
	union {
		struct mkv_store_stats st;
		unsigned char b[sizeof(struct mkv_store_stats)];
	} old;
	memset(&old, 0xab, sizeof old);
	old.st.size = v1;
	cr_assert_eq(mkv_store_get_stats(s, &old.st), 0);
	cr_assert_eq(old.st.size, v1);
	cr_assert_eq(old.st.moves_done, 6);
	cr_assert_eq(old.st.host_jemalloc, 1);
	cr_assert_eq(old.st.tier[MKV_TIER_HBM].segments, 1);
	for (size_t i = v1; i < sizeof old; i++)
		cr_assert_eq(old.b[i], 0xab, "byte %zu written", i);
	size_t bad[] = { 0, v1 - 8, v1 + 4, sizeof st + 8 };
	for (unsigned i = 0; i < 4; i++) {
		memset(&old, 0xab, sizeof old);
		old.st.size = bad[i];
		cr_assert_eq(mkv_store_get_stats(s, &old.st), -EINVAL, "size %zu", bad[i]);
		cr_assert_eq(old.b[sizeof old - 1], 0xab);
	}
	cr_assert_eq(mkv_store_remove(s, &k), 0);
	cr_assert_eq(mkv_store_remove(s, &k), -ENOENT);
	mkv_store_destroy(s);
	tu_rmtree(dir);
	free(p);
}

/* A real encoded segment goes through the tiers and comes back equal;
 * @value_bits 0: bf16 element rows, else quantized rows. */
static void real_segment_roundtrip(uint32_t value_bits)
{
	char dir[256];
	struct mkv_store_opts o = su_opts();
	struct mkv_encode_opts eo;
	struct mkv_segment *seg = NULL, *back = NULL;
	enum { N = 256, D = 128 };
	float *x = malloc(sizeof(float) * N * D);

	for (int i = 0; i < N * D; i++)
		x[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f +
		       (float)(i % D) * 0.01f;
	cr_assert_eq(mkv_encode_opts_init(&eo, sizeof eo), 0);
	eo.value_bits = value_bits;
	if (value_bits)
		eo.r = 82;
	int rc = mkv_segment_encode(&eo, x, MKV_DTYPE_F32, N, &seg);
	if (rc == -ENOSYS)
		cr_skip_test("compression core not built");
	cr_assert_eq(rc, 0, "encode: %d", rc);
	tu_mkdtemp(dir, sizeof dir);
	struct mkv_store *s = open_store(dir, &o);
	struct mkv_seg_key k = su_key(9, 2);
	cr_assert_eq(mkv_store_put_segment(s, &k, seg), 0);
	struct mkv_seg_info info;
	cr_assert_eq(mkv_store_info(s, &k, &info), 0);
	cr_assert_eq(info.n_blocks, N / 16, "block layout found");
	cr_assert_eq(su_move(s, k, MKV_TIER_NVME), 0);
	cr_assert_eq(mkv_store_get_segment(s, &k, &back), 0);
	int64_t a = mkv_segment_serialize(seg, NULL, 0);
	int64_t b = mkv_segment_serialize(back, NULL, 0);
	cr_assert_eq(a, b);
	char *sa = malloc((size_t)a), *sb = malloc((size_t)b);
	mkv_segment_serialize(seg, sa, (size_t)a);
	mkv_segment_serialize(back, sb, (size_t)b);
	cr_assert_eq(memcmp(sa, sb, (size_t)a), 0);
	/* Fetch block 3 from NVMe: its values are the segment's. */
	struct mkv_packed_view v;
	cr_assert_eq(mkv_segment_view(seg, &v), 0);
	struct mkv_fetch *f;
	cr_assert_eq(mkv_fetch_create(s, 1 << 20, &f), 0);
	uint32_t blk = 3;
	struct mkv_fetch_req rq = { .key = k, .blocks = &blk, .n_blocks = 1 };
	struct mkv_block_addr ad;
	cr_assert_eq(mkv_store_fetch(f, &rq, 1, 1, &ad), 1);
	/* a row's bytes from the format's definition (compress.h) */
	size_t row = value_bits ? 2 + ((size_t)v.r * value_bits + 7) / 8
				: v.r * mkv_dtype_size(v.store_dtype);
	row += value_bits ? row & 1 : 0;
	cr_assert_eq(ad.values_bytes, v.b * row);
	cr_assert_eq(memcmp(ad.values, (const char *)v.values + 3 * v.b * row,
			    ad.values_bytes), 0);
	cr_assert_eq(memcmp(ad.bitmaps, v.bitmaps + 3 * v.b * v.bitmap_bytes,
			    ad.bitmaps_bytes), 0);
	mkv_fetch_destroy(f);
	mkv_segment_destroy(seg);
	mkv_segment_destroy(back);
	mkv_store_destroy(s);
	tu_rmtree(dir);
	free(x);
	free(sa);
	free(sb);
}

Test(store, real_segment_roundtrip) { real_segment_roundtrip(0); }
Test(store, real_segment_roundtrip_quantized) { real_segment_roundtrip(6); }

/* Fetch: HBM and host blocks in place (no CUDA), NVMe blocks gathered into
 * the staging buffer; the bytes are the payload's; fetched segments are
 * pinned until the next fetch. */
Test(store, fetch_selected_blocks)
{
	char dir[256];
	struct mkv_store_opts o = su_opts();
	struct mkv_store_layout l = su_layout(32);
	struct mkv_seg_key k[4];
	char *p[4];
	const int tier_of[4] = { 0, 1, 2, 2 };

	o.auto_balance = 0;
	tu_mkdtemp(dir, sizeof dir);
	struct mkv_store *s = open_store(dir, &o);
	for (int i = 0; i < 4; i++) {
		k[i] = su_key(5, (uint32_t)i);
		p[i] = su_payload(32, 100 + (uint64_t)i);
		cr_assert_eq(mkv_store_put(s, &k[i], p[i], su_len(32), &l), 0);
		if (tier_of[i])
			cr_assert_eq(su_move(s, k[i], tier_of[i]), 0);
	}
	struct mkv_fetch *f;
	cr_assert_eq(mkv_fetch_create(s, 1 << 20, &f), 0);
	uint32_t b0[] = { 0, 5, 31 }, b1[] = { 1, 2 }, b2[] = { 0, 7, 8, 30 },
		 b3[] = { 4, 6 };
	struct mkv_fetch_req rq[4] = {
		{ k[2], b2, 4 }, { k[0], b0, 3 }, { k[3], b3, 2 }, { k[1], b1, 2 } };
	struct mkv_block_addr ad[11];
	struct mkv_store_stats st0 = { .size = sizeof st0 }, st1 = st0;
	cr_assert_eq(mkv_store_get_stats(s, &st0), 0);
	cr_assert_eq(mkv_store_fetch(f, rq, 4, 10, ad), 6); /* NVMe ones */
	cr_assert_eq(mkv_store_get_stats(s, &st1), 0);
	/* One gathered transfer for both NVMe segments. */
	cr_assert_eq(st1.tier[2].gets - st0.tier[2].gets, 1);
	cr_assert_eq(st1.fetch_blocks_staged - st0.fetch_blocks_staged, 6);
	int o_ = 0;
	for (int q = 0; q < 4; q++) {
		int i = (int)rq[q].key.seg;
		for (uint32_t b = 0; b < rq[q].n_blocks; b++, o_++) {
			uint32_t j = rq[q].blocks[b];
			cr_assert_eq(ad[o_].tier, tier_of[i]);
			cr_assert_eq(ad[o_].device, 0);
			cr_assert_eq(ad[o_].values_bytes, SU_VB);
			cr_assert_eq(ad[o_].bitmaps_bytes, SU_BB);
			cr_assert_eq(memcmp(ad[o_].values,
					    p[i] + l.values_off + j * SU_VB,
					    SU_VB), 0);
			cr_assert_eq(memcmp(ad[o_].bitmaps,
					    p[i] + l.bitmaps_off + j * SU_BB,
					    SU_BB), 0);
		}
	}
	/* Segments handed out in place are pinned: no move, no remove until
	 * released; staged ones (NVMe) are not. */
	cr_assert_eq(mkv_store_move(s, &k[0], MKV_TIER_HOST, su_cb, NULL), -EBUSY);
	cr_assert_eq(mkv_store_remove(s, &k[1]), -EBUSY);
	struct mkv_seg_info info;
	cr_assert_eq(mkv_store_info(s, &k[1], &info), 0);
	cr_assert_eq(info.pins, 1);
	cr_assert_eq(mkv_store_info(s, &k[2], &info), 0);
	cr_assert_eq(info.pins, 0);
	cr_assert_eq(info.hits, 4);
	cr_assert_eq(info.last_step, 10);
	mkv_fetch_release(f);
	cr_assert_eq(mkv_store_info(s, &k[1], &info), 0);
	cr_assert_eq(info.pins, 0);
	/* Errors leave no pins and no stats. */
	uint32_t bad[] = { 3, 2 }, past[] = { 32 };
	struct mkv_fetch_req e1 = { k[0], bad, 2 }, e2 = { k[0], past, 1 };
	cr_assert_eq(mkv_store_fetch(f, &e1, 1, 11, ad), -EINVAL);
	cr_assert_eq(mkv_store_fetch(f, &e2, 1, 11, ad), -EINVAL);
	struct mkv_seg_key nokey = su_key(99, 0);
	struct mkv_fetch_req e3[2] = { { k[1], b1, 2 }, { nokey, b1, 2 } };
	cr_assert_eq(mkv_store_fetch(f, e3, 2, 11, ad), -ENOENT);
	cr_assert_eq(mkv_store_info(s, &k[1], &info), 0);
	cr_assert_eq(info.pins, 0);
	cr_assert_eq(info.hits, 2);
	struct mkv_fetch *tiny;
	cr_assert_eq(mkv_fetch_create(s, 1000, &tiny), 0);
	cr_assert_eq(mkv_store_fetch(tiny, &rq[0], 1, 12, ad), -ENOSPC);
	mkv_fetch_destroy(tiny);
	mkv_fetch_destroy(f);
	mkv_store_destroy(s);
	tu_rmtree(dir);
	for (int i = 0; i < 4; i++)
		free(p[i]);
}

/* Prefetch from the previous selection admits blocks selected at least
 * twice into the HBM hot cache; the next fetch reads them in place. */
Test(store, prefetch_admits_hot_blocks)
{
	char dir[256];
	struct mkv_store_opts o = su_opts();
	struct mkv_store_layout l = su_layout(16);
	struct mkv_seg_key k = su_key(6, 0);
	char *p = su_payload(16, 5);
	struct su_wait w;

	o.auto_balance = 0;
	tu_mkdtemp(dir, sizeof dir);
	struct mkv_store *s = open_store(dir, &o);
	cr_assert_eq(mkv_store_put(s, &k, p, su_len(16), &l), 0);
	cr_assert_eq(su_move(s, k, MKV_TIER_NVME), 0);
	struct mkv_fetch *f;
	cr_assert_eq(mkv_fetch_create(s, 1 << 20, &f), 0);
	uint32_t sel1[] = { 2, 3, 9 }, sel2[] = { 3, 9, 12 };
	struct mkv_fetch_req r1 = { k, sel1, 3 }, r2 = { k, sel2, 3 };
	struct mkv_block_addr ad[3];
	cr_assert_eq(mkv_store_fetch(f, &r1, 1, 1, ad), 3);
	cr_assert_eq(mkv_store_fetch(f, &r2, 1, 2, ad), 3);
	mkv_fetch_release(f);
	/* Prefetch the previous selection: 3 and 9 were selected twice. */
	su_wait_init(&w);
	cr_assert_eq(mkv_store_prefetch(s, &r2, 1, 3, su_cb, &w), 0);
	cr_assert_eq(su_wait(&w), 0);
	uint8_t res[16];
	cr_assert_eq(mkv_store_block_residency(s, &k, res, 16), 16);
	cr_assert_eq(res[3], MKV_TIER_HBM);
	cr_assert_eq(res[9], MKV_TIER_HBM);
	cr_assert_eq(res[12], MKV_TIER_NVME); /* selected once: doorkeeper */
	cr_assert_eq(res[2], MKV_TIER_NVME);
	cr_assert_eq(mkv_store_fetch(f, &r2, 1, 3, ad), 1); /* only 12 staged */
	cr_assert_eq(ad[0].tier, MKV_TIER_HBM);
	cr_assert_eq(ad[1].tier, MKV_TIER_HBM);
	cr_assert_eq(ad[2].tier, MKV_TIER_NVME);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(memcmp(ad[i].values, p + l.values_off + sel2[i] * SU_VB,
				    SU_VB), 0);
		cr_assert_eq(memcmp(ad[i].bitmaps, p + l.bitmaps_off + sel2[i] * SU_BB,
				    SU_BB), 0);
	}
	struct mkv_store_stats st = { .size = sizeof st };
	cr_assert_eq(mkv_store_get_stats(s, &st), 0);
	cr_assert_eq(st.hot_blocks, 2);
	cr_assert_eq(st.hot_admitted, 2);
	cr_assert_geq(st.hot_bytes, 2 * (SU_VB + SU_BB));
	mkv_fetch_release(f);
	/* Promoting the whole segment to HBM frees its hot copies. */
	cr_assert_eq(su_move(s, k, MKV_TIER_HBM), 0);
	cr_assert_eq(mkv_store_get_stats(s, &st), 0);
	cr_assert_eq(st.hot_blocks, 0);
	cr_assert_eq(st.hot_bytes, 0);
	mkv_fetch_destroy(f);
	mkv_store_destroy(s);
	tu_rmtree(dir);
	free(p);
}

Test(store, pins_block_moves)
{
	struct mkv_store_opts o = su_opts();
	struct mkv_store *s;
	struct mkv_seg_key k = su_key(2, 0);
	char *p = su_payload(4, 3);

	cr_assert_eq(mkv_store_create(&o, &s), 0);
	cr_assert_eq(mkv_store_put(s, &k, p, su_len(4), NULL), 0);
	cr_assert_eq(mkv_store_pin(s, &k), 0);
	cr_assert_eq(mkv_store_pin(s, &k), 0);
	cr_assert_eq(su_move(s, k, MKV_TIER_HOST), -EBUSY);
	cr_assert_eq(mkv_store_remove(s, &k), -EBUSY);
	cr_assert_eq(mkv_store_unpin(s, &k), 0);
	cr_assert_eq(su_move(s, k, MKV_TIER_HOST), -EBUSY);
	cr_assert_eq(mkv_store_unpin(s, &k), 0);
	cr_assert_eq(mkv_store_unpin(s, &k), -EALREADY);
	cr_assert_eq(su_move(s, k, MKV_TIER_HOST), 0);
	/* No NVMe tier in this store. */
	cr_assert_eq(su_move(s, k, MKV_TIER_NVME), -EINVAL);
	su_check(s, k, 4, 3);
	mkv_store_destroy(s);
	free(p);
}

/* Reopen lists every complete segment, reads it back, reports a corrupt
 * frame and an interrupted slab creation without returning them. */
Test(store, reopen_lists_complete_segments)
{
	char dir[256];
	struct mkv_store_opts o = su_opts();
	struct mkv_store_layout l = su_layout(8);
	enum { N = 12 };

	tu_mkdtemp(dir, sizeof dir);
	struct mkv_store *s = open_store(dir, &o);
	for (int i = 0; i < N; i++) {
		struct mkv_seg_key k = su_key(40, (uint32_t)i);
		char *p = su_payload(8, 1000 + (uint64_t)i);
		cr_assert_eq(mkv_store_put(s, &k, p, su_len(8), &l), 0);
		cr_assert_eq(su_move(s, k, MKV_TIER_NVME), 0);
		free(p);
	}
	struct mkv_seg_key hk = su_key(41, 0); /* stays in HBM: lost */
	char *hp = su_payload(8, 1);
	cr_assert_eq(mkv_store_put(s, &hk, hp, su_len(8), &l), 0);
	free(hp);
	mkv_store_destroy(s);

	/* Corrupt one frame's payload in the slab, and leave an interrupted
	 * slab creation. */
	su_flip_first_frame(dir);
	int fd;
	char tmp[512];
	snprintf(tmp, sizeof tmp, "%s/slab-000005.mkv.tmp", dir);
	fd = open(tmp, O_CREAT | O_WRONLY, 0600);
	close(fd);

	s = open_store(dir, &o);
	struct mkv_store_stats st = { .size = sizeof st };
	cr_assert_eq(mkv_store_get_stats(s, &st), 0);
	cr_assert_eq(st.reopen_adopted, N - 1);
	cr_assert_eq(st.reopen_corrupt, 1);
	cr_assert_eq(st.reopen_incomplete, 1);
	cr_assert_eq(st.tier[MKV_TIER_NVME].segments, N - 1);
	int found = 0;
	for (int i = 0; i < N; i++) {
		struct mkv_seg_key k = su_key(40, (uint32_t)i);
		struct mkv_seg_info info;
		int rc = mkv_store_info(s, &k, &info);
		if (rc == -ENOENT)
			continue;
		cr_assert_eq(rc, 0);
		cr_assert_eq(info.tier, MKV_TIER_NVME);
		cr_assert_eq(info.n_blocks, 8); /* layout survived */
		su_check(s, k, 8, 1000 + (uint64_t)i);
		found++;
	}
	cr_assert_eq(found, N - 1);
	cr_assert_eq(mkv_store_info(s, &hk, &(struct mkv_seg_info){ 0 }), -ENOENT);
	/* Adopted segments move up like any other. */
	struct mkv_seg_key k0 = su_key(40, 0), k1 = su_key(40, 1);
	struct mkv_seg_key ku = mkv_store_info(s, &k0, &(struct mkv_seg_info){ 0 }) ? k1 : k0;
	cr_assert_eq(su_move(s, ku, MKV_TIER_HBM), 0);
	mkv_store_destroy(s);
	tu_rmtree(dir);
}

/*
 * One owner per NVMe directory: a second store on it (here in the same
 * process, as a second process or tierctl would be) gets -EBUSY and
 * changes nothing; once the owner is gone the directory opens again with
 * every segment.  A child killed with the store open leaves no lock.
 */
Test(store, nvme_directory_has_one_owner)
{
	char dir[256];
	struct mkv_store_opts o = su_opts();
	struct mkv_store_layout l = su_layout(8);
	struct mkv_store *s2 = (struct mkv_store *)&o; /* must stay as is */

	tu_mkdtemp(dir, sizeof dir);
	struct mkv_store *s = open_store(dir, &o);
	for (int i = 0; i < 3; i++) {
		struct mkv_seg_key k = su_key(50, (uint32_t)i);
		char *p = su_payload(8, 2000 + (uint64_t)i);
		cr_assert_eq(mkv_store_put(s, &k, p, su_len(8), &l), 0);
		cr_assert_eq(su_move(s, k, MKV_TIER_NVME), 0);
		free(p);
	}
	o.nvme_dir = dir;
	cr_assert_eq(mkv_store_create(&o, &s2), -EBUSY);
	cr_assert_eq(s2, (struct mkv_store *)&o);
	for (int i = 0; i < 3; i++) /* the owner is untouched */
		su_check(s, su_key(50, (uint32_t)i), 8, 2000 + (uint64_t)i);
	mkv_store_destroy(s);

	/* The child opens the store, says so through a pipe, and waits to
	 * be killed (the parent must not race it for the lock). */
	int pfd[2];
	char ready = 0;

	cr_assert_eq(pipe(pfd), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct mkv_store *c = NULL;
		char ok = mkv_store_create(&o, &c) == 0 ? 'y' : 'n';

		close(pfd[0]);
		if (write(pfd[1], &ok, 1) != 1)
			_exit(2);
		for (;;)
			pause(); /* killed with the store open */
	}
	close(pfd[1]);
	cr_assert_eq(read(pfd[0], &ready, 1), 1);
	close(pfd[0]);
	cr_assert_eq(ready, 'y', "the child could not open the store");
	struct mkv_store *p = NULL;
	cr_assert_eq(mkv_store_create(&o, &p), -EBUSY, "the child holds the directory");
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	s = open_store(dir, &o);
	for (int i = 0; i < 3; i++)
		su_check(s, su_key(50, (uint32_t)i), 8, 2000 + (uint64_t)i);
	mkv_store_destroy(s);
	tu_rmtree(dir);
}

/* Public entries validate arguments and change nothing on error. */
Test(store, invalid_arguments)
{
	struct mkv_store_opts o = su_opts(), bad;
	struct mkv_store *s = NULL;
	struct mkv_seg_key k = su_key(1, 1);
	char p[64] = { 0 };

	cr_assert_eq(mkv_store_opts_init(NULL, sizeof o), -EINVAL);
	cr_assert_eq(mkv_store_opts_init(&bad, 8), -EINVAL);
	bad = o; bad.size = 8;
	cr_assert_eq(mkv_store_create(&bad, &s), -EINVAL);
	bad = o; bad.workers = 0;
	cr_assert_eq(mkv_store_create(&bad, &s), -EINVAL);
	bad = o; bad.high_wm[1] = 0.5; bad.low_wm[1] = 0.6;
	cr_assert_eq(mkv_store_create(&bad, &s), -EINVAL);
	bad = o; bad.hbm_bytes = 0;
	cr_assert_eq(mkv_store_create(&bad, &s), -EINVAL);
	bad = o; bad.half_life = 0;
	cr_assert_eq(mkv_store_create(&bad, &s), -EINVAL);
	bad = o; bad.numa_node = 4096;
	cr_assert_eq(mkv_store_create(&bad, &s), -EINVAL);
	cr_assert_null(s);
	cr_assert_eq(mkv_store_create(&o, NULL), -EINVAL);
	cr_assert_eq(mkv_store_create(&o, &s), 0);

	struct mkv_store_layout l = su_layout(4); /* larger than 64 bytes */
	cr_assert_eq(mkv_store_put(s, &k, p, sizeof p, &l), -EINVAL);
	cr_assert_eq(mkv_store_put(s, &k, NULL, sizeof p, NULL), -EINVAL);
	cr_assert_eq(mkv_store_put(s, &k, p, 0, NULL), -EINVAL);
	cr_assert_eq(mkv_store_put(NULL, &k, p, sizeof p, NULL), -EINVAL);
	struct mkv_seg_key kk = k; kk.kind = 7;
	cr_assert_eq(mkv_store_put(s, &kk, p, sizeof p, NULL), -EINVAL);
	struct mkv_store_stats st = { .size = sizeof st };
	cr_assert_eq(mkv_store_get_stats(s, &st), 0);
	cr_assert_eq(st.tier[0].segments + st.tier[1].segments, 0);
	cr_assert_eq(st.tier[0].puts, 0);

	cr_assert_eq(mkv_store_put(s, &k, p, sizeof p, NULL), 0);
	cr_assert_eq(mkv_store_put(s, &k, p, sizeof p, NULL), -EEXIST);
	char small[8];
	cr_assert_eq(mkv_store_read(s, &k, small, sizeof small), -ENOSPC);
	cr_assert_eq(mkv_store_read(s, &k, NULL, 64), -EINVAL);
	cr_assert_eq(mkv_store_move(s, &k, MKV_TIER_COUNT, su_cb, NULL), -EINVAL);
	cr_assert_eq(mkv_store_move(s, &k, MKV_TIER_HOST, NULL, NULL), -EINVAL);
	cr_assert_eq(mkv_store_balance(s, NULL, NULL), -EINVAL);
	cr_assert_eq(mkv_store_pin(s, NULL), -EINVAL);
	cr_assert_eq(mkv_store_info(s, &k, NULL), -EINVAL);
	struct mkv_fetch *f = NULL;
	cr_assert_eq(mkv_fetch_create(s, 0, &f), -EINVAL);
	cr_assert_eq(mkv_fetch_create(NULL, 10, &f), -EINVAL);
	cr_assert_eq(mkv_store_fetch(NULL, NULL, 0, 0, NULL), -EINVAL);
	uint32_t b = 0;
	struct mkv_fetch_req rq = { k, &b, 1 };
	cr_assert_eq(mkv_fetch_create(s, 4096, &f), 0);
	struct mkv_block_addr ad;
	cr_assert_eq(mkv_store_fetch(f, &rq, 1, 1, &ad), -EINVAL); /* no layout */
	cr_assert_eq(mkv_store_prefetch(s, &rq, 1, 1, NULL, NULL), -EINVAL);
	struct mkv_seg_info info;
	cr_assert_eq(mkv_store_info(s, &k, &info), 0);
	cr_assert_eq(info.tier, MKV_TIER_HBM);
	cr_assert_eq(info.pins, 0);
	cr_assert_eq(info.hits, 0);
	cr_assert_eq(mkv_store_get_stats(s, &(struct mkv_store_stats){ .size = 3 }), -EINVAL);
	/* Device maps: arguments first, then the missing device (su_opts
	 * puts HBM in host memory); nothing pinned either way. */
	struct mkv_devmap *dm = NULL;
	cr_assert_eq(mkv_devmap_create(NULL, &k, 1, &dm), -EINVAL);
	cr_assert_eq(mkv_devmap_create(s, NULL, 1, &dm), -EINVAL);
	cr_assert_eq(mkv_devmap_create(s, &k, 0, &dm), -EINVAL);
	cr_assert_eq(mkv_devmap_create(s, &k, 1, NULL), -EINVAL);
	cr_assert_eq(mkv_devmap_create(s, &kk, 1, &dm), -EINVAL);
	cr_assert_eq(mkv_devmap_create(s, &k, 1, &dm), -MKV_ENODEV);
	cr_assert_null(dm);
	cr_assert_eq(mkv_devmap_fetch(NULL, &b, NULL, 1, p, sizeof p, &ad, NULL), -EINVAL);
	cr_assert_eq(mkv_devmap_sync(NULL, 1), -EINVAL);
	cr_assert_eq(mkv_devmap_blocks(NULL), 0);
	cr_assert_eq(mkv_devmap_slot_bytes(NULL), 0);
	mkv_devmap_destroy(NULL);
	cr_assert_eq(mkv_store_info(s, &k, &info), 0);
	cr_assert_eq(info.pins, 0);
	mkv_fetch_destroy(f);
	mkv_fetch_destroy(NULL);
	mkv_store_destroy(s);
	mkv_store_destroy(NULL);
}
