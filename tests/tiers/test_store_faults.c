/* SPDX-License-Identifier: MIT */
/*
 * tests/tiers/test_store_faults.c — every fault at every tier boundary.
 *
 * The store runs on real tiers (host memory, mlock'ed jemalloc arena,
 * O_DIRECT files through io_uring), each wrapped in a fault tier.  For each
 * fault kind there is one test; it walks all six boundaries (three down,
 * three up), injects the fault into the destination's write or read-back,
 * and asserts: the move reports the error, the segment is still in its
 * source tier and reads back bit-exactly, the error is counted at that
 * boundary, nothing is left behind in the destination, and a retry
 * without the fault succeeds.
 */
#include <errno.h>

#include <criterion/criterion.h>

#include <mosaickv/common.h>
#include "storeutil.h"

struct fx {
	char dir[256];
	struct mkv_store *s;
	struct tier *t[MKV_TIER_COUNT];
};

static void fx_open(struct fx *x)
{
	struct mkv_store_opts o = su_opts();
	struct tier *in[MKV_TIER_COUNT], *w[MKV_TIER_COUNT];
	int rc;

	tu_mkdtemp(x->dir, sizeof x->dir);
	o.auto_balance = 0;
	cr_assert_eq(hbm_tier_create(8 << 20, -1, &in[0]), 0);
	cr_assert_eq(host_tier_create(16 << 20, -1, -1, &in[1]), 0);
	rc = nvme_tier_create(x->dir, 1 << 30, 1, &in[2]);
	if (rc == -ENOSYS || rc == -EPERM)
		cr_skip_test("io_uring unavailable (%d)", rc);
	cr_assert_eq(rc, 0);
	for (int i = 0; i < MKV_TIER_COUNT; i++)
		cr_assert_eq(fault_tier_create(in[i], &w[i]), 0);
	cr_assert_eq(store_create_with_tiers(&o, w, &x->s), 0);
	for (int i = 0; i < MKV_TIER_COUNT; i++)
		x->t[i] = store_tier(x->s, i);
}

static void fx_close(struct fx *x)
{
	mkv_store_destroy(x->s);
	tu_rmtree(x->dir);
}

static const int bounds[6][2] = {
	{ MKV_TIER_HBM, MKV_TIER_HOST },  { MKV_TIER_HOST, MKV_TIER_NVME },
	{ MKV_TIER_HBM, MKV_TIER_NVME },  { MKV_TIER_NVME, MKV_TIER_HOST },
	{ MKV_TIER_HOST, MKV_TIER_HBM },  { MKV_TIER_NVME, MKV_TIER_HBM },
};

/*
 * At every boundary: arm @op/@kind/@err on the destination, move, expect
 * @want; then check data, counters, leftovers and a clean retry.
 */
static void fault_every_boundary(enum fault_op op, enum fault_kind kind,
				 int err, int want, int verify_fail)
{
	struct fx x;
	struct mkv_store_layout l = su_layout(8);

	fx_open(&x);
	for (int b = 0; b < 6; b++) {
		int src = bounds[b][0], dst = bounds[b][1];
		struct mkv_seg_key k = su_key(70, (uint32_t)b);
		uint64_t seed = 500 + (uint64_t)b;
		char *p = su_payload(8, seed);
		struct mkv_store_stats st0 = { .size = sizeof st0 },
				       st1 = { .size = sizeof st1 };

		cr_assert_eq(mkv_store_put(x.s, &k, p, su_len(8), &l), 0);
		free(p);
		if (src != MKV_TIER_HBM)
			cr_assert_eq(su_move(x.s, k, src), 0);
		cr_assert_eq(mkv_store_get_stats(x.s, &st0), 0);
		size_t used0 = tier_used(x.t[dst]);
		uint64_t inj0 = fault_tier_injected(x.t[dst]);

		fault_tier_arm(x.t[dst], op, 1, kind, err, 1);
		int rc = su_move(x.s, k, dst);
		fault_tier_disarm(x.t[dst]);

		cr_assert_eq(rc, want, "boundary %d->%d: got %d (%s), want %d",
			     src, dst, rc, mkv_strerror(rc), want);
		cr_assert_eq(fault_tier_injected(x.t[dst]), inj0 + 1);
		cr_assert_eq(su_tier(x.s, k), src, "segment left its tier");
		struct mkv_seg_info info;
		cr_assert_eq(mkv_store_info(x.s, &k, &info), 0);
		cr_assert_eq(info.state, MKV_SEG_RESIDENT);
		su_check(x.s, k, 8, seed); /* readable from the tier above */
		cr_assert_eq(tier_used(x.t[dst]), used0, "left behind");
		cr_assert_eq(mkv_store_get_stats(x.s, &st1), 0);
		cr_assert_eq(st1.move_errors[src][dst],
			     st0.move_errors[src][dst] + 1);
		cr_assert_eq(st1.moves_failed, st0.moves_failed + 1);
		cr_assert_eq(st1.verify_failures,
			     st0.verify_failures + (uint64_t)verify_fail);
		cr_assert_eq(st1.last_error, want);
		/* Without the fault the same move goes through. */
		cr_assert_eq(su_move(x.s, k, dst), 0);
		cr_assert_eq(su_tier(x.s, k), dst);
		su_check(x.s, k, 8, seed);
	}
	fx_close(&x);
}

Test(store_faults, enospc_on_write)
{
	fault_every_boundary(FAULT_OP_PUT, FAULT_ERRNO, ENOSPC, -ENOSPC, 0);
}

Test(store_faults, eio_on_write)
{
	fault_every_boundary(FAULT_OP_PUT, FAULT_ERRNO, EIO, -EIO, 0);
}

Test(store_faults, eio_on_read_back)
{
	fault_every_boundary(FAULT_OP_GET, FAULT_ERRNO, EIO, -EIO, 1);
}

Test(store_faults, short_write)
{
	fault_every_boundary(FAULT_OP_PUT, FAULT_SHORT, 0, -EIO, 1);
}

Test(store_faults, short_read)
{
	fault_every_boundary(FAULT_OP_GET, FAULT_SHORT, 0, -EIO, 1);
}

Test(store_faults, bit_flip_on_write)
{
	fault_every_boundary(FAULT_OP_PUT, FAULT_BITFLIP, 0, -MKV_ECORRUPT, 1);
}

Test(store_faults, bit_flip_on_read_back)
{
	fault_every_boundary(FAULT_OP_GET, FAULT_BITFLIP, 0, -MKV_ECORRUPT, 1);
}

Test(store_faults, allocation_failure)
{
	fault_every_boundary(FAULT_OP_PUT, FAULT_NOMEM, 0, -ENOMEM, 0);
}

/* A corrupt or unreadable source is never propagated: promotion from NVMe
 * with the source read failing leaves the segment where it is. */
Test(store_faults, source_read_failure)
{
	struct fx x;
	struct mkv_store_layout l = su_layout(8);
	struct mkv_seg_key k = su_key(71, 0);
	char *p = su_payload(8, 9);

	fx_open(&x);
	cr_assert_eq(mkv_store_put(x.s, &k, p, su_len(8), &l), 0);
	cr_assert_eq(su_move(x.s, k, MKV_TIER_NVME), 0);
	fault_tier_arm(x.t[2], FAULT_OP_GET, 1, FAULT_BITFLIP, 0, 1);
	cr_assert_eq(su_move(x.s, k, MKV_TIER_HOST), -MKV_ECORRUPT);
	fault_tier_arm(x.t[2], FAULT_OP_GET, 1, FAULT_ERRNO, EIO, 1);
	cr_assert_eq(su_move(x.s, k, MKV_TIER_HBM), -EIO);
	fault_tier_disarm(x.t[2]);
	cr_assert_eq(su_tier(x.s, k), MKV_TIER_NVME);
	cr_assert_eq(tier_used(x.t[0]), 0);
	cr_assert_eq(tier_used(x.t[1]), 0);
	su_check(x.s, k, 8, 9);
	/* The read path reports a bad copy instead of returning it. */
	char *buf = malloc(su_len(8));
	fault_tier_arm(x.t[2], FAULT_OP_GET, 1, FAULT_BITFLIP, 0, 1);
	cr_assert_eq(mkv_store_read(x.s, &k, buf, su_len(8)), -MKV_ECORRUPT);
	fault_tier_arm(x.t[2], FAULT_OP_GET, 1, FAULT_SHORT, 0, 1);
	cr_assert_eq(mkv_store_read(x.s, &k, buf, su_len(8)), -EIO);
	fault_tier_disarm(x.t[2]);
	su_check(x.s, k, 8, 9);
	free(buf);
	free(p);
	fx_close(&x);
}

/* Insert: a tier that fails (HBM exhausted, or a bad copy) makes the put
 * fall through to the next tier; all failing gives -ENOSPC, nothing kept. */
Test(store_faults, put_falls_through)
{
	struct fx x;
	struct mkv_store_layout l = su_layout(8);
	char *p = su_payload(8, 10);

	fx_open(&x);
	struct mkv_seg_key k1 = su_key(72, 1), k2 = su_key(72, 2),
			   k3 = su_key(72, 3);
	fault_tier_arm(x.t[0], FAULT_OP_PUT, 1, FAULT_NOMEM, 0, 1);
	cr_assert_eq(mkv_store_put(x.s, &k1, p, su_len(8), &l), 0);
	cr_assert_eq(su_tier(x.s, k1), MKV_TIER_HOST);
	fault_tier_arm(x.t[0], FAULT_OP_PUT, 1, FAULT_BITFLIP, 0, 1);
	fault_tier_arm(x.t[1], FAULT_OP_GET, 1, FAULT_SHORT, 0, 1);
	cr_assert_eq(mkv_store_put(x.s, &k2, p, su_len(8), &l), 0);
	cr_assert_eq(su_tier(x.s, k2), MKV_TIER_NVME);
	su_check(x.s, k1, 8, 10);
	su_check(x.s, k2, 8, 10);
	for (int i = 0; i < 3; i++)
		fault_tier_arm(x.t[i], FAULT_OP_PUT, 1, FAULT_ERRNO, ENOSPC, 1);
	cr_assert_eq(mkv_store_put(x.s, &k3, p, su_len(8), &l), -ENOSPC);
	cr_assert_eq(mkv_store_info(x.s, &k3, &(struct mkv_seg_info){ 0 }),
		     -ENOENT);
	struct mkv_store_stats st = { .size = sizeof st };
	cr_assert_eq(mkv_store_get_stats(x.s, &st), 0);
	cr_assert_eq(st.verify_failures, 2);
	cr_assert_eq(st.tier[0].put_errors, 2);
	free(p);
	fx_close(&x);
}
