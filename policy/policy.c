/* SPDX-License-Identifier: MIT */
#include "policy/policy.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static double lrfu_decay(const struct policy *p, uint64_t from, uint64_t to)
{
	if (to <= from)
		return 1.0;
	if (to - from < POLICY_DECAY_TAB)
		return p->decay_tab[to - from];
	return exp2(-(double)(to - from) / p->half_life);
}

static double lrfu_score(const struct policy *p, const struct policy_stats *s,
			 uint64_t now)
{
	return s->crf * lrfu_decay(p, s->last, now);
}

static void lrfu_touch(const struct policy *p, struct policy_stats *s,
		       uint32_t hits, uint64_t now)
{
	if (now >= s->last) {
		s->crf = s->crf * lrfu_decay(p, s->last, now) + hits;
		s->last = now;
	} else {
		/* A late report of an older step: decay it to `last`. */
		s->crf += hits * lrfu_decay(p, now, s->last);
	}
	s->hits += hits;
}

static int lrfu_admit(const struct policy *p, const struct policy_stats *cand,
		      double coldest, uint64_t now)
{
	if (cand->hits < p->admit_min_hits)
		return 0;
	return coldest < 0 || lrfu_score(p, cand, now) > coldest;
}

const struct policy_ops policy_lrfu_ops = {
	.name = "lrfu",
	.score = lrfu_score,
	.touch = lrfu_touch,
	.admit = lrfu_admit,
};

int policy_init(struct policy *p, const struct policy_ops *ops,
		double half_life)
{
	if (!p || !ops || !ops->score || !(half_life > 0))
		return -EINVAL;
	memset(p, 0, sizeof *p);
	p->ops = ops;
	p->half_life = half_life;
	for (int k = 0; k < POLICY_DECAY_TAB; k++)
		p->decay_tab[k] = exp2(-(double)k / half_life);
	for (int i = 0; i < POLICY_TIERS; i++) {
		p->high_wm[i] = 0.90;
		p->low_wm[i] = 0.75;
	}
	p->admit_min_hits = 2;
	return 0;
}

double policy_score(const struct policy *p, const struct policy_stats *s,
		    uint64_t now)
{
	return p->ops->score(p, s, now);
}

void policy_touch(const struct policy *p, struct policy_stats *s,
		  uint32_t hits, uint64_t now)
{
	if (p->ops->touch)
		p->ops->touch(p, s, hits, now);
	else
		lrfu_touch(p, s, hits, now);
}

int policy_admit(const struct policy *p, const struct policy_stats *cand,
		 double coldest, uint64_t now)
{
	if (p->ops->admit)
		return p->ops->admit(p, cand, coldest, now);
	return lrfu_admit(p, cand, coldest, now);
}

size_t policy_high_bytes(const struct policy *p, int tier, size_t capacity)
{
	return (size_t)((double)capacity * p->high_wm[tier]);
}

size_t policy_low_bytes(const struct policy *p, int tier, size_t capacity)
{
	return (size_t)((double)capacity * p->low_wm[tier]);
}

/* qsort has no context argument: sort (score, bytes, index) keys. */
struct plan_key {
	double score;
	size_t bytes;
	size_t idx;
};

static int plan_cmp(const void *a, const void *b)
{
	const struct plan_key *x = a, *y = b;

	if (x->score != y->score)
		return x->score > y->score ? -1 : 1;
	if (x->bytes != y->bytes)
		return x->bytes < y->bytes ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

size_t policy_plan(const struct policy *p, struct policy_item *items,
		   size_t n, const size_t *capacity, int n_tiers, uint64_t now,
		   size_t *order)
{
	size_t fill[POLICY_TIERS] = {0}, moves = 0;
	int closed[POLICY_TIERS] = {0};
	struct plan_key *k;

	if (n_tiers < 1 || n_tiers > POLICY_TIERS)
		return 0;
	for (size_t i = 0; i < n; i++) {
		items[i].score = items[i].st ? policy_score(p, items[i].st, now)
					     : 0.0;
		if (items[i].pinned) {
			items[i].target = items[i].tier;
			fill[items[i].tier] += items[i].bytes;
		}
	}
	k = malloc((n ? n : 1) * sizeof *k);
	if (!k) {
		/* No plan without memory: everything stays. */
		for (size_t i = 0; i < n; i++)
			items[i].target = items[i].tier;
		return 0;
	}
	for (size_t i = 0; i < n; i++)
		k[i] = (struct plan_key){ items[i].score, items[i].bytes, i };
	qsort(k, n, sizeof *k, plan_cmp);
	for (size_t i = 0; i < n; i++)
		order[i] = k[i].idx;
	free(k);
	for (size_t j = 0; j < n; j++) {
		struct policy_item *it = &items[order[j]];
		int t;

		if (it->pinned)
			continue;
		/* A tier that turned down a hotter item is closed to colder
		 * ones, so each tier holds a prefix of the ranking even when
		 * sizes differ. */
		for (t = 0; t < n_tiers - 1; t++) {
			if (closed[t])
				continue;
			if (fill[t] + it->bytes <=
			    policy_low_bytes(p, t, capacity[t]))
				break;
			closed[t] = 1;
		}
		it->target = t;
		fill[t] += it->bytes;
	}
	for (size_t i = 0; i < n; i++)
		moves += items[i].target != items[i].tier;
	return moves;
}

static int u32_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

size_t policy_prefetch(const struct policy *p, const uint32_t *prev, size_t n,
		       int (*resident)(void *arg, uint32_t block), void *arg,
		       uint32_t *out)
{
	size_t m = 0, k = 0;

	(void)p;
	if (!prev || !out || !resident)
		return 0;
	memcpy(out, prev, n * sizeof *out);
	qsort(out, n, sizeof *out, u32_cmp);
	for (size_t i = 0; i < n; i++) {
		if (i && out[i] == out[i - 1])
			continue;
		out[m++] = out[i];
	}
	for (size_t i = 0; i < m; i++)
		if (!resident(arg, out[i]))
			out[k++] = out[i];
	return k;
}
