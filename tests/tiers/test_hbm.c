/* SPDX-License-Identifier: MIT */
/* tests/tiers/test_hbm.c — tiers/hbm.c (host memory without a device). */
#include <errno.h>

#include <criterion/criterion.h>

#include "tierutil.h"

Test(hbm, roundtrip_sizes)
{
	struct tier *t = NULL;

	cr_assert_eq(hbm_tier_create(64 << 20, -1, &t), 0);
	cr_assert_eq(hbm_tier_on_device(t), 0);
	size_t sizes[] = { 300, 4096, 81920 + 17, 1 << 20, 5 << 20 };
	for (unsigned i = 0; i < 5; i++)
		tu_roundtrip(t, NULL, sizes[i], 0);
	cr_assert_eq(tier_used(t), 0);
	tier_destroy(t);
}

/* addr() points at the stored bytes; footprints are size classes with
 * < 25% waste (plus the 256 B floor). */
Test(hbm, addr_and_size_classes)
{
	struct tier *t = NULL;
	char src[5000];
	struct tier_obj *o[40];

	cr_assert_eq(hbm_tier_create(16 << 20, -1, &t), 0);
	for (int i = 0; i < 40; i++) {
		size_t len = 100 + (size_t)i * 123;
		tu_fill(src, len, (uint64_t)i);
		struct tier_meta m = tu_meta(1, (uint32_t)i, src, len);
		cr_assert_eq(tier_put(t, NULL, &m, src, &o[i]), 0);
		cr_assert_eq(memcmp(tier_addr(t, o[i]), src, len), 0);
		cr_assert_geq(o[i]->footprint, len);
		cr_assert(o[i]->footprint <= len + 256 || o[i]->footprint * 4 <= len * 5,
			  "len %zu footprint %zu", len, o[i]->footprint);
	}
	/* Stored bytes are not disturbed by neighbours. */
	for (int i = 0; i < 40; i++) {
		size_t len = 100 + (size_t)i * 123;
		tu_fill(src, len, (uint64_t)i);
		tu_check_get(t, NULL, o[i], src, len);
	}
	for (int i = 0; i < 40; i++)
		tier_drop(t, NULL, o[i]);
	cr_assert_eq(tier_used(t), 0);
	tier_destroy(t);
}

/* Freed space is reused: cycling puts and drops never runs out. */
Test(hbm, reuse_and_capacity)
{
	struct tier *t = NULL;
	enum { SZ = 100000 };
	char *src = malloc(SZ);
	struct tier_obj *o[64];
	int n = 0;

	cr_assert_eq(hbm_tier_create(1 << 20, -1, &t), 0);
	tu_fill(src, SZ, 3);
	struct tier_meta m = tu_meta(1, 1, src, SZ);
	while (n < 64 && tier_put(t, NULL, &m, src, &o[n]) == 0)
		n++;
	cr_assert_geq(n, 8); /* 1 MiB / 112 KiB class */
	cr_assert_lt(n, 11);
	struct tier_obj *x;
	cr_assert_eq(tier_put(t, NULL, &m, src, &x), -ENOMEM);
	for (int round = 0; round < 100; round++) {
		int i = round % n;
		tier_drop(t, NULL, o[i]);
		cr_assert_eq(tier_put(t, NULL, &m, src, &o[i]), 0);
	}
	for (int i = 0; i < n; i++) {
		tu_check_get(t, NULL, o[i], src, SZ);
		tier_drop(t, NULL, o[i]);
	}
	struct tier_stats st;
	tier_get_stats(t, &st);
	cr_assert_eq(st.put_errors, 2); /* the loop's last and the explicit one */
	cr_assert_eq(st.puts, (uint64_t)n + 2 + 100);
	tier_destroy(t);
	free(src);
}

Test(hbm, invalid)
{
	struct tier *t = NULL;

	cr_assert_eq(hbm_tier_create(0, -1, &t), -EINVAL);
	cr_assert_eq(hbm_tier_create(1 << 20, -1, NULL), -EINVAL);
	cr_assert_eq(hbm_tier_create(1 << 20, -1, &t), 0);
	char *big = calloc(1, 2 << 20);
	struct tier_meta m = tu_meta(1, 1, big, 2 << 20);
	struct tier_obj *o;
	cr_assert_eq(tier_put(t, NULL, &m, big, &o), -ENOMEM); /* > region */
	cr_assert_eq(tier_put(t, NULL, NULL, big, &o), -EINVAL);
	tier_destroy(t);
	tier_destroy(NULL);
	free(big);
}
