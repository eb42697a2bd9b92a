/* SPDX-License-Identifier: MIT */
/* Helpers for the tier tests: a payload with its descriptor, checks. */
#ifndef MKV_TEST_TIERUTIL_H
#define MKV_TEST_TIERUTIL_H

#include <stdlib.h>
#include <string.h>

#include <xxhash.h>
#include <jemalloc/jemalloc.h>

#include "../io/testutil.h"
#include "tiers/tier.h"

/* Reference jemalloc so --as-needed keeps it linked: the host tier then
 * finds it in the process (dlopen RTLD_NOLOAD) and runs its arena path. */
__attribute__((used)) static void *const tu_keep_jemalloc = (void *)mallctl;

static inline struct tier_meta tu_meta(uint64_t seq, uint32_t seg,
				       const void *p, size_t len)
{
	struct tier_meta m;

	memset(&m, 0, sizeof m);
	m.key.seq = seq;
	m.key.layer = 1;
	m.key.head = 2;
	m.key.seg = seg;
	m.key.kind = 0;
	m.shape[0] = (uint32_t)len;
	m.len = len;
	m.hash = XXH3_64bits(p, len);
	return m;
}

/* get() the whole payload and compare with @ref. */
static inline void tu_check_get(struct tier *t, struct tier_io *io,
				struct tier_obj *o, const void *ref, size_t len)
{
	char *buf = malloc(len + 1);

	cr_assert(buf);
	cr_assert_eq(tier_get(t, io, o, buf, len + 1), (int64_t)len);
	cr_assert_eq(memcmp(buf, ref, len), 0, "payload differs");
	free(buf);
}

/* Put / get / gather / drop on one tier, with data checks. */
static inline void tu_roundtrip(struct tier *t, struct tier_io *io,
				size_t len, int compressible)
{
	char *src = malloc(len), *out = malloc(2 * len);
	struct tier_meta m;
	struct tier_obj *o = NULL;
	size_t used0 = tier_used(t);

	cr_assert(src && out);
	if (compressible)
		tu_fill_compressible(src, len, 1);
	else
		tu_fill(src, len, len);
	m = tu_meta(7, 3, src, len);
	cr_assert_eq(tier_put(t, io, &m, src, &o), 0);
	cr_assert(o);
	cr_assert_gt(tier_used(t), used0);
	cr_assert_eq(o->meta.len, len);
	cr_assert_eq(o->meta.hash, m.hash);
	tu_check_get(t, io, o, src, len);
	/* Three ranges, out of order, one unaligned, back to back. */
	struct tier_range r[3] = {
		{ len / 2, len / 8 }, { 1, len / 16 }, { len - 100, 100 } };
	size_t tot = len / 8 + len / 16 + 100;
	cr_assert_eq(tier_gather(t, io, o, r, 3, out), (int64_t)tot);
	cr_assert_eq(memcmp(out, src + len / 2, len / 8), 0);
	cr_assert_eq(memcmp(out + len / 8, src + 1, len / 16), 0);
	cr_assert_eq(memcmp(out + len / 8 + len / 16, src + len - 100, 100), 0);
	/* A range past the end is refused. */
	struct tier_range bad = { len - 10, 11 };
	cr_assert_eq(tier_gather(t, io, o, &bad, 1, out), -EINVAL);
	tier_drop(t, io, o);
	cr_assert_eq(tier_used(t), used0);
	free(src);
	free(out);
}

#endif
