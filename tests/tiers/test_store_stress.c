/* SPDX-License-Identifier: MIT */
/*
 * tests/tiers/test_store_stress.c — 8 threads × 8 sequences each (64 in
 * all) append segments, fetch selected blocks, demote and promote, and
 * rebalance at once; at the end every segment is verified.  Meant for
 * ThreadSanitizer too: meson setup -Db_sanitize=thread.  Duration:
 * MKV_STRESS_SECONDS (default 3; the CI run under TSan uses >= 30).
 */
#include <errno.h>
#include <stdatomic.h>
#include <time.h>

#include <criterion/criterion.h>

#include <mosaickv/common.h>
#include "storeutil.h"

enum { THREADS = 8, SEQS = 8, NB = 16, MAXSEG = 4096 };

struct shared {
	struct mkv_store *s;
	double seconds;
	_Atomic uint32_t nseg[THREADS * SEQS]; /* segments appended per seq */
	_Atomic int fails;
	_Atomic uint64_t ops;
};

struct targ {
	struct shared *sh;
	int id;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t seed_of(uint32_t seq, uint32_t seg)
{
	return ((uint64_t)seq << 32) | seg;
}

static void noop_cb(void *arg, int status)
{
	_Atomic int *moves = arg;

	(void)status; /* EBUSY / watermark refusals are expected here */
	atomic_fetch_add(moves, 1);
}

static void *worker(void *p)
{
	struct targ *a = p;
	struct shared *sh = a->sh;
	struct mkv_store_layout l = su_layout(NB);
	struct mkv_fetch *f;
	uint64_t x = 88172645463325252ull ^ (uint64_t)a->id, step = 0;
	_Atomic int moves = 0;
	int submitted = 0;
	double end = now_s() + sh->seconds;

	if (mkv_fetch_create(sh->s, 1 << 20, &f)) {
		atomic_fetch_add(&sh->fails, 1);
		return NULL;
	}
	while (now_s() < end) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		uint32_t seq = (uint32_t)(a->id * SEQS + (int)(x % SEQS));
		uint32_t n = atomic_load(&sh->nseg[seq]);
		unsigned op = (unsigned)(x >> 20) % 10;

		if (op < 3 && n < MAXSEG) { /* append */
			struct mkv_seg_key k = su_key(seq, n);
			char *pl = malloc(su_len(NB));
			tu_fill(pl, su_len(NB), seed_of(seq, n));
			if (mkv_store_put(sh->s, &k, pl, su_len(NB), &l))
				atomic_fetch_add(&sh->fails, 1);
			else
				atomic_store(&sh->nseg[seq], n + 1);
			free(pl);
		} else if (op < 7) { /* fetch from any thread's sequences */
			uint32_t oseq = (uint32_t)((x >> 33) % (THREADS * SEQS));
			uint32_t on = atomic_load(&sh->nseg[oseq]);
			if (!on)
				continue;
			uint32_t blocks[3] = { 0, (uint32_t)(x >> 40) % 7 + 1, 15 };
			struct mkv_fetch_req rq = {
				su_key(oseq, (uint32_t)(x >> 45) % on), blocks, 3 };
			struct mkv_block_addr ad[3];
			int64_t r = mkv_store_fetch(f, &rq, 1, ++step, ad);
			if (r < 0) {
				atomic_fetch_add(&sh->fails, 1);
				continue;
			}
			char *ref = malloc(su_len(NB));
			tu_fill(ref, su_len(NB), seed_of(oseq, rq.key.seg));
			for (int i = 0; i < 3; i++)
				if (memcmp(ad[i].values,
					   ref + l.values_off + blocks[i] * SU_VB,
					   SU_VB) ||
				    memcmp(ad[i].bitmaps,
					   ref + l.bitmaps_off + blocks[i] * SU_BB,
					   SU_BB))
					atomic_fetch_add(&sh->fails, 1);
			free(ref);
			mkv_fetch_release(f);
		} else if (op < 9 && n &&
			   submitted - atomic_load(&moves) < 4) {
			/* demote / promote, at most 4 in flight per thread */
			struct mkv_seg_key k = su_key(seq, (uint32_t)(x >> 40) % n);
			int dst = (int)((x >> 50) % 3);
			if (mkv_store_move(sh->s, &k, (enum mkv_tier)dst, noop_cb,
					   (void *)&moves) == 0)
				submitted++;
		} else if ((x >> 56) % 16 == 0 &&
			   submitted - atomic_load(&moves) < 4) {
			if (mkv_store_balance(sh->s, noop_cb, (void *)&moves) == 0)
				submitted++;
		}
		atomic_fetch_add(&sh->ops, 1);
	}
	mkv_fetch_destroy(f);
	while (atomic_load(&moves) < submitted)
		sched_yield(); /* every submitted call calls back exactly once */
	if (atomic_load(&moves) != submitted)
		atomic_fetch_add(&sh->fails, 1);
	return NULL;
}

Test(store_stress, threads_append_fetch_move, .timeout = 600)
{
	char dir[256];
	struct shared *sh = calloc(1, sizeof *sh);
	struct mkv_store_opts o = su_opts();
	pthread_t th[THREADS];
	struct targ ta[THREADS];
	const char *env = getenv("MKV_STRESS_SECONDS");

	sh->seconds = env ? atof(env) : 3.0;
	tu_mkdtemp(dir, sizeof dir);
	o.nvme_dir = dir;
	o.hbm_bytes = 2 << 20;
	o.host_bytes = 4 << 20;
	o.workers = 4;
	int rc = mkv_store_create(&o, &sh->s);
	if (rc == -ENOSYS || rc == -EPERM)
		cr_skip_test("io_uring unavailable");
	cr_assert_eq(rc, 0);
	for (int i = 0; i < THREADS; i++) {
		ta[i] = (struct targ){ sh, i };
		cr_assert_eq(pthread_create(&th[i], NULL, worker, &ta[i]), 0);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	cr_assert_eq(mkv_store_drain(sh->s), 0);
	cr_assert_eq(atomic_load(&sh->fails), 0);
	uint64_t total = 0;
	for (uint32_t q = 0; q < THREADS * SEQS; q++) {
		for (uint32_t g = 0; g < atomic_load(&sh->nseg[q]); g++)
			su_check(sh->s, su_key(q, g), NB, seed_of(q, g));
		total += atomic_load(&sh->nseg[q]);
	}
	struct mkv_store_stats st = { .size = sizeof st };
	cr_assert_eq(mkv_store_get_stats(sh->s, &st), 0);
	cr_assert_eq(st.tier[0].segments + st.tier[1].segments +
			     st.tier[2].segments, total);
	cr_assert_gt(total, 64);
	cr_assert_gt(st.moves_done, 0);
	cr_assert_gt(st.tier[2].segments, 0);
	cr_assert_leq((double)(st.tier[0].used - st.hot_bytes),
		      o.high_wm[0] * (1 - o.hot_fraction) * (double)o.hbm_bytes);
	mkv_store_destroy(sh->s);
	tu_rmtree(dir);
	free(sh);
}
