/* SPDX-License-Identifier: MIT */
/* tests/policy/test_policy.c — policy/policy.c: LRFU score, plan, admission,
 * prefetch. */
#include <errno.h>
#include <math.h>

#include <criterion/criterion.h>

#include "policy/policy.h"

static struct policy pol(double h)
{
	struct policy p;

	cr_assert_eq(policy_init(&p, &policy_lrfu_ops, h), 0);
	return p;
}

Test(policy, lrfu_decays_by_half_life)
{
	struct policy p = pol(10);
	struct policy_stats s = { 0 };

	policy_touch(&p, &s, 4, 100);
	cr_assert_float_eq(policy_score(&p, &s, 100), 4.0, 1e-12);
	cr_assert_float_eq(policy_score(&p, &s, 110), 2.0, 1e-12);
	cr_assert_float_eq(policy_score(&p, &s, 120), 1.0, 1e-12);
	policy_touch(&p, &s, 1, 110); /* 4·½ + 1 */
	cr_assert_float_eq(policy_score(&p, &s, 110), 3.0, 1e-12);
	cr_assert_eq(s.hits, 5);
	/* A late report of step 100 counts decayed to 110. */
	policy_touch(&p, &s, 2, 100);
	cr_assert_float_eq(policy_score(&p, &s, 110), 4.0, 1e-12);
}

/* Frequency and recency both count: a segment selected every step beats
 * one selected once recently, which beats one selected often long ago. */
Test(policy, frequency_and_recency)
{
	struct policy p = pol(16);
	struct policy_stats every = { 0 }, once = { 0 }, old = { 0 };

	for (uint64_t t = 1; t <= 100; t++)
		policy_touch(&p, &every, 1, t);
	policy_touch(&p, &once, 3, 100);
	for (uint64_t t = 1; t <= 20; t++)
		policy_touch(&p, &old, 5, t);
	double a = policy_score(&p, &every, 100), b = policy_score(&p, &once, 100),
	       c = policy_score(&p, &old, 100);
	cr_assert_gt(a, b);
	cr_assert_gt(b, c);
}

Test(policy, plan_fills_hottest_first_to_low_watermark)
{
	struct policy p = pol(8);
	enum { N = 20 };
	struct policy_stats st[N] = { 0 };
	struct policy_item it[N];
	size_t order[N], cap[3] = { 1000, 2000, 1 << 20 };

	for (int i = 0; i < N; i++) {
		policy_touch(&p, &st[i], (uint32_t)(i * 7 % N) + 1, 50);
		it[i] = (struct policy_item){ .bytes = 100, .tier = 2,
			.st = &st[i] };
	}
	it[3].pinned = 1; /* stays in tier 2 */
	size_t moves = policy_plan(&p, it, N, cap, 3, 50, order);
	/* tier 0: low 750 -> 7 items; tier 1: low 1500 -> 15 items, rest 2 */
	int cnt[3] = { 0 };
	for (int i = 0; i < N; i++)
		cnt[it[i].target]++;
	cr_assert_eq(cnt[0], 7);
	cr_assert_eq(cnt[1], 12); /* 19 unpinned - 7 */
	cr_assert_eq(cnt[2], 1);
	cr_assert_eq(it[3].target, 2);
	cr_assert_eq(moves, 19);
	/* Everything in tier 0 scores >= everything unpinned below it. */
	double min0 = 1e300, max_below = -1;
	for (int i = 0; i < N; i++) {
		if (it[i].target == 0 && it[i].score < min0)
			min0 = it[i].score;
		if (it[i].target > 0 && !it[i].pinned && it[i].score > max_below)
			max_below = it[i].score;
	}
	cr_assert_geq(min0, max_below);
	/* order[] is hottest first */
	for (int i = 1; i < N; i++)
		cr_assert_geq(it[order[i - 1]].score, it[order[i]].score);
}

Test(policy, pinned_bytes_count_in_their_tier)
{
	struct policy p = pol(8);
	struct policy_stats st[3] = { 0 };
	struct policy_item it[3];
	size_t order[3], cap[2] = { 1000, 100000 };

	for (int i = 0; i < 3; i++)
		it[i] = (struct policy_item){ .bytes = 400, .tier = 0,
			.st = &st[i] };
	it[0].pinned = 1;
	policy_touch(&p, &st[1], 9, 1);
	/* 750 low: pinned 400 + one more 400 = 800 > 750: both others go down */
	cr_assert_eq(policy_plan(&p, it, 3, cap, 2, 1, order), 2);
	cr_assert_eq(it[0].target, 0);
	cr_assert_eq(it[1].target, 1);
	cr_assert_eq(it[2].target, 1);
}

Test(policy, admission_doorkeeper_and_coldest)
{
	struct policy p = pol(8);
	struct policy_stats s = { 0 };

	policy_touch(&p, &s, 1, 10);
	cr_assert_eq(policy_admit(&p, &s, -1, 10), 0); /* one-off: no */
	policy_touch(&p, &s, 1, 11);
	cr_assert_eq(policy_admit(&p, &s, -1, 11), 1); /* room: yes */
	double sc = policy_score(&p, &s, 11);
	cr_assert_eq(policy_admit(&p, &s, sc + 0.1, 11), 0);
	cr_assert_eq(policy_admit(&p, &s, sc - 0.1, 11), 1);
}

static int odd_resident(void *arg, uint32_t b)
{
	(void)arg;
	return b & 1;
}

Test(policy, prefetch_from_previous_selection)
{
	struct policy p = pol(8);
	uint32_t prev[] = { 9, 4, 4, 7, 2, 10, 2, 3 }, out[8];

	size_t n = policy_prefetch(&p, prev, 8, odd_resident, NULL, out);
	cr_assert_eq(n, 3);
	cr_assert_eq(out[0], 2);
	cr_assert_eq(out[1], 4);
	cr_assert_eq(out[2], 10);
}

Test(policy, invalid)
{
	struct policy p;

	cr_assert_eq(policy_init(&p, &policy_lrfu_ops, 0), -EINVAL);
	cr_assert_eq(policy_init(NULL, &policy_lrfu_ops, 1), -EINVAL);
	cr_assert_eq(policy_init(&p, NULL, 1), -EINVAL);
	cr_assert_eq(policy_init(&p, &policy_lrfu_ops, NAN), -EINVAL);
}
