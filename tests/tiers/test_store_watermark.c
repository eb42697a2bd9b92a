/* SPDX-License-Identifier: MIT */
/*
 * tests/tiers/test_store_watermark.c — watermarks hold under a workload
 * that writes 4x the top tier's budget, and after a rebalance the segments
 * in HBM are the hottest by the policy's own score.
 */
#include <errno.h>

#include <criterion/criterion.h>

#include <mosaickv/common.h>
#include "storeutil.h"

struct rank {
	double min_hbm, max_below;
	int n_hbm, n_below;
	uint64_t hbm_bytes;
};

static void rank_fn(void *arg, const struct mkv_seg_key *k,
		    const struct mkv_seg_info *info)
{
	struct rank *r = arg;

	(void)k;
	if (info->tier == MKV_TIER_HBM) {
		if (!r->n_hbm++ || info->score < r->min_hbm)
			r->min_hbm = info->score;
		r->hbm_bytes += info->len;
	} else {
		if (!r->n_below++ || info->score > r->max_below)
			r->max_below = info->score;
	}
}

Test(store_watermark, four_times_top_budget_hottest_resident)
{
	char dir[256];
	struct mkv_store_opts o = su_opts();
	struct mkv_store *s;
	enum { NB = 64 };
	const size_t hbm = 4 << 20, len = su_len(NB);
	const int n = (int)(4 * hbm / len) + 1; /* 4x the top tier */
	struct mkv_store_layout l = su_layout(NB);
	int rc;

	tu_mkdtemp(dir, sizeof dir);
	o.nvme_dir = dir;
	o.hbm_bytes = hbm;
	o.host_bytes = 8 << 20;
	o.half_life = 16;
	rc = mkv_store_create(&o, &s);
	if (rc == -ENOSYS || rc == -EPERM)
		cr_skip_test("io_uring unavailable");
	cr_assert_eq(rc, 0);
	/* What whole segments may fill in HBM: (1 - hot_fraction) of it. */
	const double place_hbm = (double)hbm * (1 - o.hot_fraction);

	struct mkv_fetch *f;
	cr_assert_eq(mkv_fetch_create(s, 8 << 20, &f), 0);
	uint32_t sel[] = { 0, 1, 2, 40 };
	struct mkv_fetch_req *rq = calloc((size_t)n, sizeof *rq);
	struct mkv_block_addr *ad = calloc((size_t)n * 4, sizeof *ad);
	for (int t = 0; t < n; t++) {
		struct mkv_seg_key k = su_key(100 + (uint64_t)(t % 7), (uint32_t)t);
		char *p = su_payload(NB, (uint64_t)t);
		cr_assert_eq(mkv_store_put(s, &k, p, len, &l), 0, "put %d", t);
		free(p);
		/* A decode step: the "hot" segments (every 8th) are selected
		 * every step, the newest one once, the rest never. */
		int m = 0;
		for (int i = 0; i <= t; i += 8)
			rq[m++] = (struct mkv_fetch_req){
				su_key(100 + (uint64_t)(i % 7), (uint32_t)i), sel, 4 };
		rq[m++] = (struct mkv_fetch_req){ k, sel, 1 };
		int64_t got = mkv_store_fetch(f, rq, (size_t)m, (uint64_t)t + 1, ad);
		cr_assert_geq(got, 0, "fetch step %d: %lld", t, (long long)got);
		mkv_fetch_release(f);
		/* The watermarks hold at every step. */
		struct mkv_store_stats st = { .size = sizeof st };
		cr_assert_eq(mkv_store_get_stats(s, &st), 0);
		cr_assert_leq((double)(st.tier[0].used - st.hot_bytes),
			      o.high_wm[0] * place_hbm, "step %d", t);
		cr_assert_leq((double)st.tier[1].used,
			      o.high_wm[1] * (double)st.tier[1].capacity,
			      "step %d", t);
	}
	cr_assert_eq(mkv_store_drain(s), 0);
	struct mkv_store_stats st0 = { .size = sizeof st0 };
	cr_assert_eq(mkv_store_get_stats(s, &st0), 0);
	struct su_wait w;
	su_wait_init(&w);
	cr_assert_eq(mkv_store_balance(s, su_cb, &w), 0);
	cr_assert_eq(su_wait(&w), 0);
	cr_assert_eq(mkv_store_drain(s), 0);

	struct rank r = { 0 };
	struct mkv_store_stats st = { .size = sizeof st };
	cr_assert_eq(mkv_store_get_stats(s, &st), 0);
	cr_assert_eq(mkv_store_list(s, rank_fn, &r), n);
	uint64_t skip_last = st.balance_skipped - st0.balance_skipped;
	cr_log_info("balances %llu, moves %llu, skipped at a watermark %llu (the last "
		    "balance: %llu of %llu moves), failed %llu",
		    (unsigned long long)st.balances, (unsigned long long)st.moves_done,
		    (unsigned long long)st.balance_skipped, (unsigned long long)skip_last,
		    (unsigned long long)(st.moves_done - st0.moves_done),
		    (unsigned long long)st.moves_failed);
	cr_assert_gt(r.n_hbm, 4);
	cr_assert_gt(r.n_below, n / 2);
	/* (once in CI, 2026-12-01: "1 < 45.63"; the counts say whether the
	 * final balance left moves out at a watermark or lost them) */
	cr_assert_geq(r.min_hbm, r.max_below,
		      "a colder segment is in HBM: %g < %g (the last balance's moves skipped "
		      "at a watermark %llu, moves failed %llu, last error %lld)", r.min_hbm,
		      r.max_below, (unsigned long long)skip_last,
		      (unsigned long long)st.moves_failed, (long long)st.last_error);
	cr_assert_gt(r.min_hbm, 0); /* the hot ones, not never-selected ones */
	cr_assert_leq((double)(st.tier[0].used - st.hot_bytes),
		      o.high_wm[0] * place_hbm);
	cr_assert_gt(st.tier[2].segments, 0);
	cr_assert_gt(st.balances, 1); /* background ones ran too */
	cr_assert_gt(st.move_batches, 0); /* moves went down in batches */
	/* Background moves may lose races with the fetches' pins (-EBUSY);
	 * nothing else may fail. */
	cr_assert(st.moves_failed == 0 || st.last_error == -EBUSY,
		  "failed %llu, last %lld", (unsigned long long)st.moves_failed,
		  (long long)st.last_error);
	cr_assert_eq(st.verify_failures, 0);
	cr_assert_eq(st.tier[0].segments + st.tier[1].segments +
			     st.tier[2].segments, (uint64_t)n);
	/* Nothing lost: every segment reads back. */
	for (int t = 0; t < n; t++)
		su_check(s, su_key(100 + (uint64_t)(t % 7), (uint32_t)t), NB,
			 (uint64_t)t);
	mkv_fetch_destroy(f);
	mkv_store_destroy(s);
	free(rq);
	free(ad);
	tu_rmtree(dir);
}
