/* SPDX-License-Identifier: MIT */
/*
 * policy/policy — placement decisions, pure: scores, victims, admission,
 * prefetch sets, from statistics the store hands in.  Owns no memory of the
 * store and moves nothing.
 *
 * Score (the default "lrfu" policy): a segment's (or block's) combined
 * recency-frequency, as in LRFU (Lee et al., IEEE TC 2001):
 *
 *     crf(t) = Σ_i hits_i · 2^(-(t - t_i) / H)
 *
 * over its past selections at decode steps t_i, with half-life H steps.  It
 * is kept in O(1) per selection: crf ← crf · 2^(-(t - last)/H) + hits,
 * last ← t; the score at step now is crf · 2^(-(now - last)/H).
 *
 * Why: top-k selection is sticky step to step (recency) and a few blocks —
 * the sink, heavy hitters — are selected nearly every step (frequency).
 * LRFU spans LRU (small H) to LFU (large H) with one parameter, scores of
 * segments touched at different times are directly comparable, and a hot
 * segment that stops being selected cools off exponentially instead of
 * squatting in HBM forever (plain LFU's failure).  Counting selected blocks
 * (hits) rather than touches favours segments that supply many of the
 * step's blocks, which is what a byte of HBM saves in PCIe traffic.
 * Default H = 64 steps (about the lifetime of a selection pattern over a
 * few sentences of generation).
 */
#ifndef MKV_POLICY_POLICY_H
#define MKV_POLICY_POLICY_H

#include <stddef.h>
#include <stdint.h>

#define POLICY_TIERS 3
#define POLICY_DECAY_TAB 256

/* Access statistics of one segment (or block), kept by the store. */
struct policy_stats {
	double crf;    /* decayed selection count at step `last` */
	uint64_t last; /* step of the last selection (0: never) */
	uint64_t hits; /* total blocks selected, undecayed (reporting) */
};

/* One placement candidate handed to policy_plan(). */
struct policy_item {
	double score;    /* filled by policy_plan from stats */
	size_t bytes;
	int tier;        /* current tier */
	int pinned;      /* nonzero: stays where it is */
	int target;      /* out: tier it should live in */
	const struct policy_stats *st;
};

struct policy;

struct policy_ops {
	const char *name;
	/* Score at step @now; higher is hotter. */
	double (*score)(const struct policy *p, const struct policy_stats *s,
			uint64_t now);
	/* Record @hits selected blocks at step @now.  May be NULL: LRFU. */
	void (*touch)(const struct policy *p, struct policy_stats *s,
		      uint32_t hits, uint64_t now);
	/*
	 * Admit a block with score @cand into the HBM hot-block cache, whose
	 * coldest resident scores @coldest (or -1 if the cache has room).
	 * May be NULL: admit when the block was selected at least
	 * admit_min_hits times and it is hotter than the coldest resident.
	 */
	int (*admit)(const struct policy *p, const struct policy_stats *cand,
		     double coldest, uint64_t now);
};

struct policy {
	const struct policy_ops *ops;
	double half_life;               /* H, in steps */
	double high_wm[POLICY_TIERS];   /* fractions of capacity */
	double low_wm[POLICY_TIERS];
	uint32_t admit_min_hits;        /* default 2: a doorkeeper against
					 * one-off selections */
	/* 2^(-k/H) for k < POLICY_DECAY_TAB: every fetch touches each
	 * selected block, and exp2 per block was a fifth of a fetch's CPU
	 * time.  Steps apart beyond the table take exp2. */
	double decay_tab[POLICY_DECAY_TAB];
};

/* The default LRFU policy with half-life @half_life steps (> 0). */
extern const struct policy_ops policy_lrfu_ops;
int policy_init(struct policy *p, const struct policy_ops *ops,
		double half_life);

double policy_score(const struct policy *p, const struct policy_stats *s,
		    uint64_t now);
void policy_touch(const struct policy *p, struct policy_stats *s,
		  uint32_t hits, uint64_t now);
int policy_admit(const struct policy *p, const struct policy_stats *cand,
		 double coldest, uint64_t now);

/* Bytes above which tier @tier is over its high watermark. */
size_t policy_high_bytes(const struct policy *p, int tier, size_t capacity);
size_t policy_low_bytes(const struct policy *p, int tier, size_t capacity);

/*
 * Placement plan: sets items[i].target for all @n items.  Pinned items stay
 * in their tier and their bytes count there.  The others are taken hottest
 * first (ties: smaller bytes, then lower index) and each goes to the
 * highest tier whose fill stays within its low watermark; what fits
 * nowhere goes to the bottom tier (tiers 0..n_tiers-1, n_tiers <= 3).
 * Once an item does not fit in a tier, no colder item is placed there:
 * every tier holds a prefix of the ranking (by the policy's own score),
 * even with items of different sizes.
 * The store runs a plan only when a tier passes its high watermark (or
 * on an explicit balance), and plans fill to the low watermark: the gap
 * between the two is the hysteresis that keeps plans from thrashing.
 * @order (n entries) receives the items' indices, hottest first.
 * Returns the number of items whose target differs from their tier.
 */
size_t policy_plan(const struct policy *p, struct policy_item *items,
		   size_t n, const size_t *capacity, int n_tiers, uint64_t now,
		   size_t *order);

/*
 * Prefetch set: from the previous step's selection @prev (n block ids,
 * any order, duplicates allowed) keep the ones for which @resident returns
 * 0, deduplicated, in ascending order, into @out.  Returns the count.
 */
size_t policy_prefetch(const struct policy *p, const uint32_t *prev, size_t n,
		       int (*resident)(void *arg, uint32_t block), void *arg,
		       uint32_t *out);

#endif
