/* SPDX-License-Identifier: MIT */
/* tests/tiers/test_fault.c — tiers/fault.c: each fault does what it says. */
#include <errno.h>

#include <criterion/criterion.h>

#include "tierutil.h"

static struct tier *wrapped(void)
{
	struct tier *in = NULL, *f = NULL;

	cr_assert_eq(hbm_tier_create(8 << 20, -1, &in), 0);
	cr_assert_eq(fault_tier_create(in, &f), 0);
	return f;
}

enum { SZ = 10000 };

Test(fault, passthrough_unarmed)
{
	struct tier *f = wrapped();

	tu_roundtrip(f, NULL, SZ, 0);
	cr_assert_eq(fault_tier_injected(f), 0);
	tier_destroy(f);
}

Test(fault, nth_put_fails_with_errno)
{
	struct tier *f = wrapped();
	char a[SZ];
	struct tier_obj *o[4];

	tu_fill(a, SZ, 1);
	struct tier_meta m = tu_meta(1, 1, a, SZ);
	fault_tier_arm(f, FAULT_OP_PUT, 2, FAULT_ERRNO, ENOSPC, 1);
	cr_assert_eq(tier_put(f, NULL, &m, a, &o[0]), 0);
	cr_assert_eq(tier_put(f, NULL, &m, a, &o[1]), -ENOSPC);
	cr_assert_eq(tier_put(f, NULL, &m, a, &o[1]), 0);
	cr_assert_eq(fault_tier_injected(f), 1);
	cr_assert_eq(tier_used(f), 2 * o[0]->footprint);
	tier_drop(f, NULL, o[0]);
	tier_drop(f, NULL, o[1]);
	cr_assert_eq(tier_used(f), 0);
	tier_destroy(f);
}

Test(fault, put_bitflip_and_short_store_bad_copies)
{
	struct tier *f = wrapped();
	char a[SZ], b[SZ];
	struct tier_obj *o;

	tu_fill(a, SZ, 2);
	struct tier_meta m = tu_meta(1, 1, a, SZ);
	fault_tier_arm(f, FAULT_OP_PUT, 1, FAULT_BITFLIP, 0, 1);
	cr_assert_eq(tier_put(f, NULL, &m, a, &o), 0);
	cr_assert_eq(tier_get(f, NULL, o, b, SZ), SZ);
	cr_assert_neq(XXH3_64bits(b, SZ), m.hash);
	cr_assert_eq(memcmp(a, b, SZ / 2), 0);
	tier_drop(f, NULL, o);
	fault_tier_arm(f, FAULT_OP_PUT, 1, FAULT_SHORT, 0, 1);
	cr_assert_eq(tier_put(f, NULL, &m, a, &o), 0);
	cr_assert_eq(tier_get(f, NULL, o, b, SZ), SZ / 2);
	tier_drop(f, NULL, o);
	cr_assert_eq(fault_tier_injected(f), 2);
	tier_destroy(f);
}

Test(fault, get_faults)
{
	struct tier *f = wrapped();
	char a[SZ], b[SZ];
	struct tier_obj *o;

	tu_fill(a, SZ, 3);
	struct tier_meta m = tu_meta(1, 1, a, SZ);
	cr_assert_eq(tier_put(f, NULL, &m, a, &o), 0);
	fault_tier_arm(f, FAULT_OP_GET, 1, FAULT_ERRNO, EIO, 1);
	cr_assert_eq(tier_get(f, NULL, o, b, SZ), -EIO);
	fault_tier_arm(f, FAULT_OP_GET, 1, FAULT_SHORT, 0, 1);
	cr_assert_eq(tier_get(f, NULL, o, b, SZ), SZ / 2);
	fault_tier_arm(f, FAULT_OP_GET, 1, FAULT_BITFLIP, 0, 1);
	cr_assert_eq(tier_get(f, NULL, o, b, SZ), SZ);
	cr_assert_neq(memcmp(a, b, SZ), 0);
	fault_tier_arm(f, FAULT_OP_GET, 1, FAULT_NOMEM, 0, 0);
	cr_assert_eq(tier_get(f, NULL, o, b, SZ), -ENOMEM);
	cr_assert_eq(tier_get(f, NULL, o, b, SZ), -ENOMEM); /* count 0: all */
	fault_tier_disarm(f);
	cr_assert_eq(tier_get(f, NULL, o, b, SZ), SZ);
	cr_assert_eq(memcmp(a, b, SZ), 0); /* the stored copy is intact */
	struct tier_range r = { 10, 100 };
	fault_tier_arm(f, FAULT_OP_GATHER, 1, FAULT_ERRNO, EIO, 1);
	cr_assert_eq(tier_gather(f, NULL, o, &r, 1, b), -EIO);
	cr_assert_eq(tier_gather(f, NULL, o, &r, 1, b), 100);
	cr_assert_eq(memcmp(a + 10, b, 100), 0);
	cr_assert_eq(fault_tier_injected(f), 6);
	tier_drop(f, NULL, o);
	tier_destroy(f);
}
