/* SPDX-License-Identifier: MIT */
/*
 * Internal hooks of the store (mosaickv/store.c) for tests and benchmarks
 * that need to hand the store their own tiers (e.g. fault-injecting
 * wrappers).  Never installed.
 */
#ifndef MKV_STORE_INTERNAL_H
#define MKV_STORE_INTERNAL_H

#include <stdbool.h>
#include <mosaickv/store.h>

struct tier;

/*
 * As mkv_store_create(), but with the tiers given: @tiers[MKV_TIER_*] (any
 * may be NULL except HBM; an NVMe tier must be persistent).  The store
 * takes ownership of the given tiers, also on failure.  The budgets in @o
 * are ignored (the tiers' capacities count); nvme_dir is ignored.
 */
int store_create_with_tiers(const struct mkv_store_opts *o,
			    struct tier *tiers[MKV_TIER_COUNT],
			    struct mkv_store **out);

/* The store's tier @level (NULL if absent), e.g. to arm a fault tier. */
struct tier *store_tier(struct mkv_store *s, int level);

/*
 * Run @fn(@arg) on one of the store's worker threads (the same pool that
 * moves segments), for the sequences' finalization jobs.  Returns 0 (then
 * @fn runs exactly once), -EINVAL, -ENOMEM, or -ESHUTDOWN when the store
 * is being destroyed (then @fn never runs).  @fn must not call
 * mkv_store_destroy() or mkv_store_drain().
 */
int store_submit_call(struct mkv_store *s, void (*fn)(void *arg), void *arg);

/*
 * Test and benchmark hook: while paused, the workers take no new job from
 * the queue (jobs already running finish); submissions still queue.
 * Resuming wakes them.  While paused, anything that waits for the queue
 * to empty waits until the resume: mkv_store_drain(), mkv_store_destroy(),
 * mkv_seq_sync(), mkv_seq_close(), and a sequence's back-pressure when its
 * lag passes the cap.  NULL is ignored.
 */
void store_pause(struct mkv_store *s, bool pause);

/* The CUDA device the HBM tier lives on, or -1 when HBM is host memory
 * (built without CUDA, no usable device, or opts.gpu = -1). */
int store_device(const struct mkv_store *s);

#ifndef MKV_FETCH_TRACE
#define MKV_FETCH_TRACE 0
#endif
#if MKV_FETCH_TRACE
/* The last fetch's phase times (store.c, above mkv_store_fetch). */
void store_fetch_trace(const struct mkv_fetch *f, double out[8]);
#endif

#endif
