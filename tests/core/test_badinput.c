/* SPDX-License-Identifier: MIT */
/*
 * Bad inputs: one test per case.  Each asserts the documented return code
 * AND that nothing changed: out-pointers and output buffers untouched, and
 * pre-existing segments and segstats give identical results afterwards
 * (segments compared by their serialized bytes, segstats by count, every
 * loss and the eigen-decomposition).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"

#define D 64
#define N 100

#define EXPECT_RC(call, want)                                                        \
	do {                                                                         \
		int64_t rc_ = (int64_t)(call);                                       \
		cr_assert_eq(rc_, (int64_t)(want), "%s: returned %lld (%s), want %lld (%s)", \
			     #call, (long long)rc_, mkv_strerror((int)rc_),          \
			     (long long)(want), mkv_strerror((int)(want)));          \
	} while (0)

static char sentinel_obj;
#define SEG_SENTINEL ((struct mkv_segment *)(void *)&sentinel_obj)
#define STATS_SENTINEL ((struct mkv_segstats *)(void *)&sentinel_obj)

/* ---- fixture: a key/value segment pair and a segstats, with snapshots ---- */

struct fx {
	uint64_t seed;
	float x[N * D];
	float q[4 * D];
	struct mkv_encode_opts eo;
	struct mkv_segment *k, *v;
	struct mkv_segstats *st;
	struct mkv_strategy_opts so;
	unsigned char *snap_k, *snap_v;
	int64_t len_k, len_v;
	double snap_loss[4][D + 1];
	double snap_eig[D];
	float snap_R[D * D];
	size_t snap_count;
};

static struct fx *F;

static unsigned char *serialize(const struct mkv_segment *s, int64_t *len)
{
	*len = mkv_segment_serialize(s, NULL, 0);
	cr_assert(*len > 0);
	unsigned char *b = th_alloc((size_t)*len);
	cr_assert_eq(mkv_segment_serialize(s, b, (size_t)*len), *len);
	return b;
}

static void stats_snapshot(const struct mkv_segstats *st, double loss[4][D + 1],
			   double *eig, float *R, size_t *count)
{
	*count = mkv_segstats_count(st);
	for (uint32_t gi = 0; gi < 4; gi++) {
		uint32_t g = 1u << gi;
		for (uint32_t r = g; r <= D; r += g)
			cr_assert_eq(mkv_segstats_loss(st, r, g, &loss[gi][r]), 0);
	}
	cr_assert_eq(mkv_segstats_eigen(st, R, eig), 0);
}

static void fx_setup(void)
{
	F = th_alloc(sizeof *F);
	F->seed = th_seed();
	struct th_rng rng;
	th_rng_init(&rng, F->seed);
	th_gaussian(&rng, F->x, N * D, 1.0);
	th_gaussian(&rng, F->q, 4 * D, 1.0);
	cr_assert_eq(mkv_encode_opts_init(&F->eo, sizeof F->eo), 0);
	F->eo.d = D;
	F->eo.r = 16;
	F->eo.kind = MKV_KIND_KEY;
	cr_assert_eq(mkv_segment_encode(&F->eo, F->x, MKV_DTYPE_F32, N, &F->k), 0);
	F->eo.kind = MKV_KIND_VALUE;
	cr_assert_eq(mkv_segment_encode(&F->eo, F->x, MKV_DTYPE_F32, N, &F->v), 0);
	F->eo.kind = MKV_KIND_KEY;
	cr_assert_eq(mkv_strategy_opts_init(&F->so, sizeof F->so), 0);
	F->so.d = D;
	F->so.drop = 0;
	cr_assert_eq(mkv_segstats_create(&F->so, &F->st), 0);
	cr_assert_eq(mkv_segstats_append(F->st, F->x, MKV_DTYPE_F32, N), 0);
	F->snap_k = serialize(F->k, &F->len_k);
	F->snap_v = serialize(F->v, &F->len_v);
	stats_snapshot(F->st, F->snap_loss, F->snap_eig, F->snap_R, &F->snap_count);
}

/* Everything pre-existing is exactly as it was. */
static void fx_unchanged(void)
{
	int64_t lk, lv;
	unsigned char *bk = serialize(F->k, &lk), *bv = serialize(F->v, &lv);
	cr_assert(lk == F->len_k && memcmp(bk, F->snap_k, (size_t)lk) == 0,
		  "seed=%llu: key segment changed by a failed call", (unsigned long long)F->seed);
	cr_assert(lv == F->len_v && memcmp(bv, F->snap_v, (size_t)lv) == 0,
		  "seed=%llu: value segment changed by a failed call", (unsigned long long)F->seed);
	free(bk);
	free(bv);
	static double loss[4][D + 1];
	double eig[D];
	static float R[D * D];
	size_t count;
	stats_snapshot(F->st, loss, eig, R, &count);
	cr_assert_eq(count, F->snap_count, "seed=%llu: segstats count %zu, was %zu",
		     (unsigned long long)F->seed, count, F->snap_count);
	cr_assert(memcmp(loss, F->snap_loss, sizeof loss) == 0,
		  "seed=%llu: segstats losses changed by a failed call", (unsigned long long)F->seed);
	cr_assert(memcmp(eig, F->snap_eig, sizeof eig) == 0,
		  "seed=%llu: segstats covariance changed by a failed call", (unsigned long long)F->seed);
	cr_assert(memcmp(R, F->snap_R, sizeof R) == 0);
}

static void fx_teardown(void)
{
	if (!F)
		return;
	mkv_segment_destroy(F->k);
	mkv_segment_destroy(F->v);
	mkv_segstats_destroy(F->st);
	free(F->snap_k);
	free(F->snap_v);
	free(F);
	F = NULL;
}

TestSuite(badinput, .init = fx_setup, .fini = fx_teardown);

/* Encode with @o and expect @want; *out stays the sentinel. */
static void encode_fails(const struct mkv_encode_opts *o, const void *x,
			 enum mkv_dtype dt, size_t n, int want, const char *what)
{
	struct mkv_segment *out = SEG_SENTINEL;
	int rc = mkv_segment_encode(o, x, dt, n, &out);
	if (rc == 0 && out != SEG_SENTINEL)
		mkv_segment_destroy(out);
	cr_assert_eq(rc, want, "seed=%llu: %s: encode returned %d (%s), want %d (%s)",
		     (unsigned long long)F->seed, what, rc, mkv_strerror(rc), want,
		     mkv_strerror(want));
	cr_assert_eq(out, SEG_SENTINEL, "seed=%llu: %s: *out written on failure",
		     (unsigned long long)F->seed, what);
}

static struct mkv_encode_opts good_opts(void)
{
	struct mkv_encode_opts o;
	cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
	o.d = D;
	o.r = 16;
	return o;
}

/* ---- non-finite inputs --------------------------------------------------- */

static void nonfinite_case(float bad, uint16_t bad_f16, uint16_t bad_bf16)
{
	struct th_rng rng;
	th_rng_init(&rng, F->seed + 1);
	struct mkv_encode_opts o = good_opts();
	for (int t = 0; t < 3; t++) {
		float *x = th_alloc(N * D * sizeof *x);
		memcpy(x, F->x, sizeof F->x);
		uint16_t *h = th_alloc(N * D * sizeof *h);
		size_t pos = t == 0 ? 0 : t == 1 ? N * D - 1 : th_below(&rng, N * D);
		x[pos] = bad;
		encode_fails(&o, x, MKV_DTYPE_F32, N, -MKV_ENONFINITE, "f32 input");
		th_encode_dt(F->x, N * D, MKV_DTYPE_F16, h, NULL);
		h[pos] = bad_f16;
		encode_fails(&o, h, MKV_DTYPE_F16, N, -MKV_ENONFINITE, "f16 input");
		th_encode_dt(F->x, N * D, MKV_DTYPE_BF16, h, NULL);
		h[pos] = bad_bf16;
		encode_fails(&o, h, MKV_DTYPE_BF16, N, -MKV_ENONFINITE, "bf16 input");
		/* strategy_choose: R and *s untouched */
		float R[D * D];
		memset(R, 0x7b, sizeof R);
		struct mkv_strategy s, s0;
		memset(&s, 0x3c, sizeof s);
		s0 = s;
		EXPECT_RC(mkv_strategy_choose(&F->so, x, MKV_DTYPE_F32, N, R, &s), -MKV_ENONFINITE);
		cr_assert(memcmp(&s, &s0, sizeof s) == 0, "strategy written on failure");
		for (size_t i = 0; i < D * D; i++)
			cr_assert(((unsigned char *)R)[i * 4] == 0x7b, "R written on failure");
		free(x);
		free(h);
	}
	fx_unchanged();
}

Test(badinput, nan_in_vectors) { nonfinite_case(NAN, 0x7e00, 0x7fc0); }
Test(badinput, inf_in_vectors)
{
	nonfinite_case(INFINITY, 0x7c00, 0x7f80);
	nonfinite_case(-INFINITY, 0xfc00, 0xff80);
}

Test(badinput, nonfinite_given_rotation)
{
	float R[D * D];
	memset(R, 0, sizeof R);
	for (int i = 0; i < D; i++)
		R[i * D + i] = 1.0f;
	R[5 * D + 7] = NAN;
	struct mkv_encode_opts o = good_opts();
	o.rotation = R;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -MKV_ENONFINITE, "NaN in the rotation");
	R[5 * D + 7] = INFINITY;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -MKV_ENONFINITE, "Inf in the rotation");
	fx_unchanged();
}

/* ---- r, g, d, b, n ------------------------------------------------------- */

Test(badinput, r_zero)
{
	struct mkv_encode_opts o = good_opts();
	o.r = 0;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "r = 0");
	double l = 7.0;
	EXPECT_RC(mkv_segstats_loss(F->st, 0, 1, &l), -EINVAL);
	cr_assert_eq(l, 7.0);
	fx_unchanged();
}

Test(badinput, r_above_d_keep)
{
	struct mkv_encode_opts o = good_opts();
	o.r = D + 1;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "r = d + 1");
	o.r = D + 8;
	o.g = 8;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "r = d + g");
	o = good_opts();
	o.drop = 1;
	o.r = D - D / 4 + 1; /* <= d but > d_keep */
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "r = d_keep + 1");
	o.r = D;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "r = d with the drop");
	double l = 7.0;
	EXPECT_RC(mkv_segstats_loss(F->st, D + 1, 1, &l), -EINVAL);
	cr_assert_eq(l, 7.0);
	fx_unchanged();
}

Test(badinput, d_not_multiple_of_g)
{
	struct mkv_encode_opts o = good_opts();
	uint32_t bad_g[] = {0, 3, 5, 6, 7, 16, 64};
	for (size_t i = 0; i < sizeof bad_g / sizeof *bad_g; i++) {
		o.g = bad_g[i];
		o.r = 16 * (bad_g[i] ? bad_g[i] : 1) <= D ? 2 * (bad_g[i] ? bad_g[i] : 1) : 16;
		encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "unsupported g");
		double l = 7.0;
		EXPECT_RC(mkv_segstats_loss(F->st, o.r, bad_g[i], &l), -EINVAL);
		cr_assert_eq(l, 7.0);
	}
	fx_unchanged();
}

Test(badinput, r_not_multiple_of_g)
{
	struct mkv_encode_opts o = good_opts();
	o.g = 4;
	o.r = 6;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "r = 6, g = 4");
	o.g = 8;
	o.r = 12;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "r = 12, g = 8");
	double l = 7.0;
	EXPECT_RC(mkv_segstats_loss(F->st, 6, 4, &l), -EINVAL);
	cr_assert_eq(l, 7.0);
	fx_unchanged();
}

Test(badinput, value_bits_unsupported)
{
	uint32_t bad[] = {1, 2, 3, 9, 16, 32};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct mkv_encode_opts o = good_opts();
		o.value_bits = bad[i];
		encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "value_bits");
		cr_assert_eq(mkv_row_bytes(16, bad[i], MKV_DTYPE_BF16), 0u,
			     "row bytes of value_bits %u", bad[i]);
	}
	cr_assert_eq(mkv_row_bytes(0, 6, MKV_DTYPE_BF16), 0u);
	cr_assert_eq(mkv_row_bytes(16, 0, MKV_DTYPE_F16), 0u);
	fx_unchanged();
}

Test(badinput, unsupported_d)
{
	uint32_t bad_d[] = {0, 32, 65, 96, 192, 512};
	float *big = th_alloc(N * 512 * sizeof *big);
	for (size_t i = 0; i < sizeof bad_d / sizeof *bad_d; i++) {
		struct mkv_encode_opts o = good_opts();
		o.d = bad_d[i];
		o.r = 8;
		encode_fails(&o, big, MKV_DTYPE_F32, N, -EINVAL, "unsupported d");
		struct mkv_strategy_opts so;
		cr_assert_eq(mkv_strategy_opts_init(&so, sizeof so), 0);
		so.d = bad_d[i];
		struct mkv_segstats *st = STATS_SENTINEL;
		EXPECT_RC(mkv_segstats_create(&so, &st), -EINVAL);
		cr_assert_eq(st, STATS_SENTINEL);
		struct mkv_strategy s;
		EXPECT_RC(mkv_strategy_choose(&so, big, MKV_DTYPE_F32, N, NULL, &s), -EINVAL);
		struct mkv_attn_opts ao;
		cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
		ao.d = bad_d[i];
		struct mkv_dense_kv kv = {.k = big, .v = big, .dtype = MKV_DTYPE_F32, .n = N};
		float out[4 * 512];
		memset(out, 0x11, sizeof out);
		EXPECT_RC(mkv_attend_dense(&ao, big, &kv, out), -EINVAL);
		cr_assert_eq(((unsigned char *)out)[0], 0x11);
	}
	free(big);
	fx_unchanged();
}

Test(badinput, unsupported_b)
{
	uint32_t bad_b[] = {0, 1, 4, 12, 24, 128};
	for (size_t i = 0; i < sizeof bad_b / sizeof *bad_b; i++) {
		struct mkv_encode_opts o = good_opts();
		o.b = bad_b[i];
		encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "unsupported b");
	}
	struct mkv_attn_opts ao;
	cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
	ao.d = D;
	ao.quest_b = 12;
	struct mkv_dense_kv kv = {.k = F->x, .v = F->x, .dtype = MKV_DTYPE_F32, .n = N};
	float out[D];
	memset(out, 0x11, sizeof out);
	EXPECT_RC(mkv_attend_quest(&ao, F->q, &kv, NULL, out, NULL), -EINVAL);
	cr_assert_eq(((unsigned char *)out)[0], 0x11);
	fx_unchanged();
}

Test(badinput, bad_enums)
{
	struct mkv_encode_opts o = good_opts();
	encode_fails(&o, F->x, (enum mkv_dtype)7, N, -EINVAL, "input dtype 7");
	o.store_dtype = MKV_DTYPE_F16;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "store dtype f16");
	o.store_dtype = (enum mkv_dtype)9;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "store dtype 9");
	o = good_opts();
	o.kind = (enum mkv_kind)2;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "kind 2");
	o = good_opts();
	o.select = (enum mkv_select)2;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "select 2");
	EXPECT_RC(mkv_segstats_append(F->st, F->x, (enum mkv_dtype)5, N), -EINVAL);
	cr_assert_eq(mkv_dtype_size(MKV_DTYPE_F32), 4);
	cr_assert_eq(mkv_dtype_size(MKV_DTYPE_F16), 2);
	cr_assert_eq(mkv_dtype_size(MKV_DTYPE_BF16), 2);
	cr_assert_eq(mkv_dtype_size((enum mkv_dtype)7), 0);
	fx_unchanged();
}

Test(badinput, summary_channels_above_d_keep)
{
	struct mkv_encode_opts o = good_opts();
	o.summary_channels = D + 1;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "S = d + 1");
	o.drop = 1;
	o.summary_channels = D - D / 4 + 1;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "S = d_keep + 1");
	fx_unchanged();
}

Test(badinput, rotate_zero_with_rotation)
{
	float R[D * D];
	memset(R, 0, sizeof R);
	for (int i = 0; i < D; i++)
		R[i * D + i] = 1.0f;
	struct mkv_encode_opts o = good_opts();
	o.rotate = 0;
	o.rotation = R;
	encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "rotate 0 with a rotation");
	fx_unchanged();
}

Test(badinput, n_zero)
{
	struct mkv_encode_opts o = good_opts();
	encode_fails(&o, F->x, MKV_DTYPE_F32, 0, -EINVAL, "encode n = 0");
	EXPECT_RC(mkv_segstats_append(F->st, F->x, MKV_DTYPE_F32, 0), -EINVAL);
	struct mkv_strategy s;
	EXPECT_RC(mkv_strategy_choose(&F->so, F->x, MKV_DTYPE_F32, 0, NULL, &s), -EINVAL);
	struct mkv_attn_opts ao;
	cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
	ao.d = D;
	struct mkv_dense_kv kv = {.k = F->x, .v = F->x, .dtype = MKV_DTYPE_F32, .n = 0};
	float out[D];
	memset(out, 0x11, sizeof out);
	EXPECT_RC(mkv_attend_dense(&ao, F->q, &kv, out), -EINVAL);
	/* Quest and packed need at least one token */
	EXPECT_RC(mkv_attend_quest(&ao, F->q, &kv, NULL, out, NULL), -EINVAL);
	EXPECT_RC(mkv_attend_quest(&ao, F->q, &kv, &kv, out, NULL), -EINVAL);
	EXPECT_RC(mkv_attend_packed(&ao, F->q, NULL, NULL, 0, NULL, out, NULL), -EINVAL);
	EXPECT_RC(mkv_attend_packed(&ao, F->q, NULL, NULL, 0, &kv, out, NULL), -EINVAL);
	cr_assert_eq(((unsigned char *)out)[0], 0x11);
	/* segstats with nothing appended */
	struct mkv_segstats *e = NULL;
	cr_assert_eq(mkv_segstats_create(&F->so, &e), 0);
	double l = 7.0;
	EXPECT_RC(mkv_segstats_loss(e, 8, 1, &l), -EINVAL);
	cr_assert_eq(l, 7.0);
	float R[D * D];
	EXPECT_RC(mkv_segstats_eigen(e, R, NULL), -EINVAL);
	EXPECT_RC(mkv_segstats_choose(e, &s), -EINVAL);
	mkv_segstats_destroy(e);
	fx_unchanged();
}

Test(badinput, n_above_max)
{
	size_t n = (size_t)MKV_MAX_N + 1;
	float *x = th_alloc(n * D * sizeof *x); /* readable, in case it reads */
	struct mkv_encode_opts o = good_opts();
	encode_fails(&o, x, MKV_DTYPE_F32, n, -EINVAL, "n = MKV_MAX_N + 1");
	free(x);
	fx_unchanged();
}

/* ---- NULL pointers ------------------------------------------------------- */

Test(badinput, null_encode)
{
	struct mkv_encode_opts o = good_opts();
	struct mkv_segment *out = SEG_SENTINEL;
	EXPECT_RC(mkv_segment_encode(NULL, F->x, MKV_DTYPE_F32, N, &out), -EINVAL);
	cr_assert_eq(out, SEG_SENTINEL);
	EXPECT_RC(mkv_segment_encode(&o, NULL, MKV_DTYPE_F32, N, &out), -EINVAL);
	cr_assert_eq(out, SEG_SENTINEL);
	EXPECT_RC(mkv_segment_encode(&o, F->x, MKV_DTYPE_F32, N, NULL), -EINVAL);
	mkv_segment_destroy(NULL);
	fx_unchanged();
}

Test(badinput, null_segment_accessors)
{
	struct mkv_packed_view v;
	memset(&v, 0x22, sizeof v);
	struct mkv_packed_view v0 = v;
	EXPECT_RC(mkv_segment_view(NULL, &v), -EINVAL);
	cr_assert(memcmp(&v, &v0, sizeof v) == 0);
	EXPECT_RC(mkv_segment_view(F->k, NULL), -EINVAL);
	struct mkv_segment_bytes b;
	memset(&b, 0x22, sizeof b);
	struct mkv_segment_bytes b0 = b;
	EXPECT_RC(mkv_segment_bytes(NULL, &b), -EINVAL);
	cr_assert(memcmp(&b, &b0, sizeof b) == 0);
	EXPECT_RC(mkv_segment_bytes(F->k, NULL), -EINVAL);
	float out[N * D];
	memset(out, 0x33, sizeof out);
	EXPECT_RC(mkv_segment_decode(NULL, 0, 1, MKV_SPACE_ORIGINAL, out), -EINVAL);
	EXPECT_RC(mkv_segment_decode(F->k, 0, 1, MKV_SPACE_ORIGINAL, NULL), -EINVAL);
	EXPECT_RC(mkv_segment_rotation(NULL, out), -EINVAL);
	EXPECT_RC(mkv_segment_rotation(F->k, NULL), -EINVAL);
	for (size_t i = 0; i < sizeof out; i++)
		cr_assert_eq(((unsigned char *)out)[i], 0x33, "output written on failure");
	fx_unchanged();
}

Test(badinput, null_serialize)
{
	unsigned char buf[64];
	memset(buf, 0x44, sizeof buf);
	EXPECT_RC(mkv_segment_serialize(NULL, buf, sizeof buf), -EINVAL);
	EXPECT_RC(mkv_segment_serialize(NULL, NULL, 0), -EINVAL);
	for (size_t i = 0; i < sizeof buf; i++)
		cr_assert_eq(buf[i], 0x44);
	struct mkv_segment *out = SEG_SENTINEL;
	EXPECT_RC(mkv_segment_deserialize(NULL, (size_t)F->len_k, &out), -EINVAL);
	cr_assert_eq(out, SEG_SENTINEL);
	EXPECT_RC(mkv_segment_deserialize(F->snap_k, (size_t)F->len_k, NULL), -EINVAL);
	fx_unchanged();
}

Test(badinput, null_opts_init)
{
	EXPECT_RC(mkv_encode_opts_init(NULL, sizeof(struct mkv_encode_opts)), -EINVAL);
	EXPECT_RC(mkv_strategy_opts_init(NULL, sizeof(struct mkv_strategy_opts)), -EINVAL);
	EXPECT_RC(mkv_attn_opts_init(NULL, sizeof(struct mkv_attn_opts)), -EINVAL);
}

Test(badinput, null_segstats)
{
	struct mkv_segstats *st = STATS_SENTINEL;
	EXPECT_RC(mkv_segstats_create(NULL, &st), -EINVAL);
	cr_assert_eq(st, STATS_SENTINEL);
	EXPECT_RC(mkv_segstats_create(&F->so, NULL), -EINVAL);
	EXPECT_RC(mkv_segstats_append(NULL, F->x, MKV_DTYPE_F32, N), -EINVAL);
	EXPECT_RC(mkv_segstats_append(F->st, NULL, MKV_DTYPE_F32, N), -EINVAL);
	float R[D * D];
	memset(R, 0x55, sizeof R);
	EXPECT_RC(mkv_segstats_set_rotation(NULL, R), -EINVAL);
	double eig[D];
	memset(eig, 0x55, sizeof eig);
	EXPECT_RC(mkv_segstats_eigen(NULL, R, eig), -EINVAL);
	EXPECT_RC(mkv_segstats_eigen(F->st, NULL, eig), -EINVAL);
	for (size_t i = 0; i < sizeof R; i++)
		cr_assert_eq(((unsigned char *)R)[i], 0x55);
	for (size_t i = 0; i < sizeof eig; i++)
		cr_assert_eq(((unsigned char *)eig)[i], 0x55);
	double l = 7.0;
	EXPECT_RC(mkv_segstats_loss(NULL, 8, 1, &l), -EINVAL);
	cr_assert_eq(l, 7.0);
	EXPECT_RC(mkv_segstats_loss(F->st, 8, 1, NULL), -EINVAL);
	struct mkv_strategy s;
	EXPECT_RC(mkv_segstats_choose(NULL, &s), -EINVAL);
	EXPECT_RC(mkv_segstats_choose(F->st, NULL), -EINVAL);
	EXPECT_RC(mkv_strategy_choose(NULL, F->x, MKV_DTYPE_F32, N, R, &s), -EINVAL);
	EXPECT_RC(mkv_strategy_choose(&F->so, NULL, MKV_DTYPE_F32, N, R, &s), -EINVAL);
	EXPECT_RC(mkv_strategy_choose(&F->so, F->x, MKV_DTYPE_F32, N, R, NULL), -EINVAL);
	mkv_segstats_destroy(NULL);
	mkv_segstats_reset(NULL);
	cr_assert_eq(mkv_segstats_count(NULL), 0);
	fx_unchanged();
}

Test(badinput, null_attention)
{
	struct mkv_attn_opts ao;
	cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
	ao.d = D;
	struct mkv_dense_kv kv = {.k = F->x, .v = F->x, .dtype = MKV_DTYPE_F32, .n = N};
	float out[D];
	memset(out, 0x66, sizeof out);
	EXPECT_RC(mkv_attend_dense(NULL, F->q, &kv, out), -EINVAL);
	EXPECT_RC(mkv_attend_dense(&ao, NULL, &kv, out), -EINVAL);
	EXPECT_RC(mkv_attend_dense(&ao, F->q, NULL, out), -EINVAL);
	EXPECT_RC(mkv_attend_dense(&ao, F->q, &kv, NULL), -EINVAL);
	struct mkv_dense_kv nk = kv, nv = kv;
	nk.k = NULL;
	nv.v = NULL;
	EXPECT_RC(mkv_attend_dense(&ao, F->q, &nk, out), -EINVAL);
	EXPECT_RC(mkv_attend_dense(&ao, F->q, &nv, out), -EINVAL);

	EXPECT_RC(mkv_attend_quest(NULL, F->q, &kv, NULL, out, NULL), -EINVAL);
	EXPECT_RC(mkv_attend_quest(&ao, NULL, &kv, NULL, out, NULL), -EINVAL);
	EXPECT_RC(mkv_attend_quest(&ao, F->q, &kv, NULL, NULL, NULL), -EINVAL);
	EXPECT_RC(mkv_attend_quest(&ao, F->q, &nk, NULL, out, NULL), -EINVAL);
	EXPECT_RC(mkv_attend_quest(&ao, F->q, &kv, &nv, out, NULL), -EINVAL);

	const struct mkv_segment *ks[1] = {F->k}, *vs[1] = {F->v};
	const struct mkv_segment *nul[1] = {NULL};
	struct mkv_attn_stats st, st0;
	memset(&st, 0x66, sizeof st);
	st0 = st;
	EXPECT_RC(mkv_attend_packed(NULL, F->q, ks, vs, 1, NULL, out, &st), -EINVAL);
	EXPECT_RC(mkv_attend_packed(&ao, NULL, ks, vs, 1, NULL, out, &st), -EINVAL);
	EXPECT_RC(mkv_attend_packed(&ao, F->q, NULL, vs, 1, NULL, out, &st), -EINVAL);
	EXPECT_RC(mkv_attend_packed(&ao, F->q, ks, NULL, 1, NULL, out, &st), -EINVAL);
	EXPECT_RC(mkv_attend_packed(&ao, F->q, nul, vs, 1, NULL, out, &st), -EINVAL);
	EXPECT_RC(mkv_attend_packed(&ao, F->q, ks, nul, 1, NULL, out, &st), -EINVAL);
	EXPECT_RC(mkv_attend_packed(&ao, F->q, ks, vs, 1, NULL, NULL, &st), -EINVAL);
	EXPECT_RC(mkv_attend_packed(&ao, F->q, ks, vs, 1, &nk, out, &st), -EINVAL);
	cr_assert(memcmp(&st, &st0, sizeof st) == 0, "stats written on failure");

	float sc[64];
	memset(sc, 0x66, sizeof sc);
	EXPECT_RC(mkv_score_blocks(NULL, F->q, F->k, sc), -EINVAL);
	EXPECT_RC(mkv_score_blocks(&ao, NULL, F->k, sc), -EINVAL);
	EXPECT_RC(mkv_score_blocks(&ao, F->q, NULL, sc), -EINVAL);
	EXPECT_RC(mkv_score_blocks(&ao, F->q, F->k, NULL), -EINVAL);
	struct mkv_block_ref sel[64];
	memset(sel, 0x66, sizeof sel);
	EXPECT_RC(mkv_select_blocks(NULL, F->q, ks, 1, sel, 64), -EINVAL);
	EXPECT_RC(mkv_select_blocks(&ao, NULL, ks, 1, sel, 64), -EINVAL);
	EXPECT_RC(mkv_select_blocks(&ao, F->q, NULL, 1, sel, 64), -EINVAL);
	EXPECT_RC(mkv_select_blocks(&ao, F->q, nul, 1, sel, 64), -EINVAL);
	EXPECT_RC(mkv_select_blocks(&ao, F->q, ks, 1, NULL, 64), -EINVAL);
	for (size_t i = 0; i < sizeof out; i++)
		cr_assert_eq(((unsigned char *)out)[i], 0x66, "out written on failure");
	for (size_t i = 0; i < sizeof sc; i++)
		cr_assert_eq(((unsigned char *)sc)[i], 0x66, "scores written on failure");
	for (size_t i = 0; i < sizeof sel; i++)
		cr_assert_eq(((unsigned char *)sel)[i], 0x66, "sel written on failure");
	fx_unchanged();
}

/* ---- options sizes ------------------------------------------------------- */

/* @v1: the size of the struct's first version (smaller sizes are wrong). */
#define INIT_SIZE_CASE_V(type, init, v1)                                               \
	do {                                                                           \
		union {                                                                \
			type o;                                                        \
			unsigned char raw[sizeof(type) + 64];                          \
		} u, u0;                                                               \
		size_t sizes[] = {0, 3, sizeof(size_t), (v1) - 1,                      \
				  sizeof(type) + 1, sizeof(type) + 8};                 \
		for (size_t i_ = 0; i_ < sizeof sizes / sizeof *sizes; i_++) {         \
			memset(&u, 0xa7, sizeof u);                                    \
			u0 = u;                                                        \
			EXPECT_RC(init(&u.o, sizes[i_]), -EINVAL);                     \
			cr_assert(memcmp(&u, &u0, sizeof u) == 0,                      \
				  #init " wrote into the struct with size %zu", sizes[i_]); \
		}                                                                      \
		EXPECT_RC(init(&u.o, sizeof(type)), 0);                                \
		cr_assert_eq(u.o.size, sizeof(type));                                  \
	} while (0)
#define INIT_SIZE_CASE(type, init) INIT_SIZE_CASE_V(type, init, sizeof(type))

/* Version 1 of struct mkv_encode_opts ended at .rotation. */
#define ENC_V1 (offsetof(struct mkv_encode_opts, rotation) + sizeof(const float *))

Test(badinput, opts_init_wrong_size)
{
	INIT_SIZE_CASE_V(struct mkv_encode_opts, mkv_encode_opts_init, ENC_V1);
	/* A version-1 caller: its size is accepted, nothing past it written,
	 * and encoding with it gives the version-2 defaults (element rows). */
	union {
		struct mkv_encode_opts o;
		unsigned char raw[sizeof(struct mkv_encode_opts)];
	} w;
	memset(&w, 0xa7, sizeof w);
	EXPECT_RC(mkv_encode_opts_init(&w.o, ENC_V1), 0);
	cr_assert_eq(w.o.size, ENC_V1);
	for (size_t i = ENC_V1; i < sizeof w; i++)
		cr_assert_eq(w.raw[i], 0xa7, "byte %zu past a version-1 struct written", i);
	w.o.d = D;
	w.o.r = 16;
	struct mkv_segment *s = NULL;
	EXPECT_RC(mkv_segment_encode(&w.o, F->x, MKV_DTYPE_F32, N, &s), 0);
	struct mkv_packed_view v;
	cr_assert_eq(mkv_segment_view(s, &v), 0);
	cr_assert_eq(v.value_bits, 0);
	cr_assert_eq(v.row_bytes, 16 * 2);
	mkv_segment_destroy(s);
	INIT_SIZE_CASE(struct mkv_strategy_opts, mkv_strategy_opts_init);
	/* Version 1 of struct mkv_attn_opts ended at quest_b (no refine). */
	INIT_SIZE_CASE_V(struct mkv_attn_opts, mkv_attn_opts_init,
			 offsetof(struct mkv_attn_opts, refine));
	struct mkv_attn_opts a1;
	EXPECT_RC(mkv_attn_opts_init(&a1, offsetof(struct mkv_attn_opts, refine) + 4), -EINVAL);
}

Test(badinput, opts_struct_wrong_size)
{
	size_t bad[] = {0, 3, ENC_V1 - 1, sizeof(struct mkv_encode_opts) + 8};
	for (size_t i = 0; i < 4; i++) {
		struct mkv_encode_opts o = good_opts();
		o.size = bad[i];
		encode_fails(&o, F->x, MKV_DTYPE_F32, N, -EINVAL, "encode opts .size wrong");
	}
	size_t bads[] = {0, 3, sizeof(struct mkv_strategy_opts) - 1,
			 sizeof(struct mkv_strategy_opts) + 8};
	for (size_t i = 0; i < 4; i++) {
		struct mkv_strategy_opts so = F->so;
		so.size = bads[i];
		struct mkv_segstats *st = STATS_SENTINEL;
		EXPECT_RC(mkv_segstats_create(&so, &st), -EINVAL);
		cr_assert_eq(st, STATS_SENTINEL);
		struct mkv_strategy s;
		EXPECT_RC(mkv_strategy_choose(&so, F->x, MKV_DTYPE_F32, N, NULL, &s), -EINVAL);
	}
	size_t bada[] = {0, 3, sizeof(struct mkv_attn_opts) - 1,
			 sizeof(struct mkv_attn_opts) + 8};
	const struct mkv_segment *ks[1] = {F->k}, *vs[1] = {F->v};
	struct mkv_dense_kv kv = {.k = F->x, .v = F->x, .dtype = MKV_DTYPE_F32, .n = N};
	for (size_t i = 0; i < 4; i++) {
		struct mkv_attn_opts ao;
		cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
		ao.d = D;
		ao.size = bada[i];
		float out[D], sc[64];
		struct mkv_block_ref sel[64];
		EXPECT_RC(mkv_attend_dense(&ao, F->q, &kv, out), -EINVAL);
		EXPECT_RC(mkv_attend_quest(&ao, F->q, &kv, NULL, out, NULL), -EINVAL);
		EXPECT_RC(mkv_attend_packed(&ao, F->q, ks, vs, 1, NULL, out, NULL), -EINVAL);
		EXPECT_RC(mkv_score_blocks(&ao, F->q, F->k, sc), -EINVAL);
		EXPECT_RC(mkv_select_blocks(&ao, F->q, ks, 1, sel, 64), -EINVAL);
	}
	fx_unchanged();
}

/* ---- segstats ------------------------------------------------------------ */

Test(badinput, segstats_append_nonfinite_leaves_state)
{
	const float bads[3] = {NAN, INFINITY, -INFINITY};
	for (int t = 0; t < 3; t++) {
		float *x = th_alloc(N * D * sizeof *x);
		memcpy(x, F->x, sizeof F->x);
		x[N * D - 1] = bads[t]; /* last: a partial accumulation would show */
		EXPECT_RC(mkv_segstats_append(F->st, x, MKV_DTYPE_F32, N), -MKV_ENONFINITE);
		x[N * D - 1] = F->x[N * D - 1];
		x[D * 37 + 5] = bads[t];
		EXPECT_RC(mkv_segstats_append(F->st, x, MKV_DTYPE_F32, N), -MKV_ENONFINITE);
		uint16_t *h = th_alloc(N * D * sizeof *h);
		th_encode_dt(F->x, N * D, MKV_DTYPE_BF16, h, NULL);
		h[N * D - 1] = t == 0 ? 0x7fc0 : t == 1 ? 0x7f80 : 0xff80;
		EXPECT_RC(mkv_segstats_append(F->st, h, MKV_DTYPE_BF16, N), -MKV_ENONFINITE);
		th_encode_dt(F->x, N * D, MKV_DTYPE_F16, h, NULL);
		h[N * D - 1] = t == 0 ? 0x7e00 : t == 1 ? 0x7c00 : 0xfc00;
		EXPECT_RC(mkv_segstats_append(F->st, h, MKV_DTYPE_F16, N), -MKV_ENONFINITE);
		free(h);
		free(x);
	}
	cr_assert_eq(mkv_segstats_count(F->st), N);
	fx_unchanged();
}

Test(badinput, segstats_bad_rotation)
{
	float R[D * D];
	memcpy(R, F->snap_R, sizeof R);
	R[D * D - 1] = NAN;
	EXPECT_RC(mkv_segstats_set_rotation(F->st, R), -MKV_ENONFINITE);
	R[D * D - 1] = INFINITY;
	EXPECT_RC(mkv_segstats_set_rotation(F->st, R), -MKV_ENONFINITE);
	fx_unchanged();
}

Test(badinput, strategy_opts_bad_values)
{
	struct mkv_strategy_opts base;
	cr_assert_eq(mkv_strategy_opts_init(&base, sizeof base), 0);
	base.d = D;
	struct mkv_strategy_opts cases[12];
	for (int i = 0; i < 12; i++)
		cases[i] = base;
	cases[0].loss_threshold = 0;
	cases[1].loss_threshold = 1.5;
	cases[2].loss_threshold = NAN;
	cases[3].var_threshold = 0;
	cases[4].var_threshold = 2;
	cases[5].var_threshold = NAN;
	cases[6].g_mask = 0;
	cases[7].g_mask = 1u << 3; /* g = 3 */
	cases[8].b_mask = 0;
	cases[9].b_mask = 1u << 2; /* b = 4 */
	cases[10].b_mask = 1u << 7; /* b = 128 */
	cases[11].summary_channels = D + 1;
	for (int i = 0; i < 12; i++) {
		struct mkv_segstats *st = STATS_SENTINEL;
		int rc = mkv_segstats_create(&cases[i], &st);
		if (rc == 0 && st != STATS_SENTINEL)
			mkv_segstats_destroy(st);
		cr_assert_eq(rc, -EINVAL, "strategy opts case %d: segstats_create returned %d", i, rc);
		cr_assert_eq(st, STATS_SENTINEL);
		struct mkv_strategy s;
		memset(&s, 0x77, sizeof s);
		rc = mkv_strategy_choose(&cases[i], F->x, MKV_DTYPE_F32, N, NULL, &s);
		cr_assert_eq(rc, -EINVAL, "strategy opts case %d: strategy_choose returned %d", i, rc);
		cr_assert_eq(((unsigned char *)&s)[0], 0x77);
	}
	fx_unchanged();
}

/* ---- decode -------------------------------------------------------------- */

Test(badinput, decode_bad_range)
{
	float *out = th_alloc((N + 1) * D * sizeof *out);
	memset(out, 0x88, (N + 1) * D * sizeof *out);
	EXPECT_RC(mkv_segment_decode(F->k, 0, 0, MKV_SPACE_ORIGINAL, out), -EINVAL);
	EXPECT_RC(mkv_segment_decode(F->k, N, 1, MKV_SPACE_ORIGINAL, out), -EINVAL);
	EXPECT_RC(mkv_segment_decode(F->k, N - 1, 2, MKV_SPACE_ORIGINAL, out), -EINVAL);
	EXPECT_RC(mkv_segment_decode(F->k, 0, N + 1, MKV_SPACE_ROTATED, out), -EINVAL);
	EXPECT_RC(mkv_segment_decode(F->k, SIZE_MAX, 2, MKV_SPACE_ROTATED, out), -EINVAL);
	EXPECT_RC(mkv_segment_decode(F->k, 0, 1, (enum mkv_space)5, out), -EINVAL);
	for (size_t i = 0; i < (N + 1) * D * sizeof *out; i++)
		cr_assert_eq(((unsigned char *)out)[i], 0x88, "decode wrote on failure");
	free(out);
	fx_unchanged();
}

/* ---- attention ----------------------------------------------------------- */

Test(badinput, attention_bad_options)
{
	struct mkv_dense_kv kv = {.k = F->x, .v = F->x, .dtype = MKV_DTYPE_F32, .n = N};
	const struct mkv_segment *ks[1] = {F->k}, *vs[1] = {F->v};
	for (int c = 0; c < 6; c++) {
		struct mkv_attn_opts ao;
		cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
		ao.d = D;
		switch (c) {
		case 0: ao.n_q = 0; break;
		case 1: ao.n_q = MKV_MAX_QHEADS + 1; break;
		case 2: ao.token_frac = 0; break;
		case 3: ao.token_frac = 1.5; break;
		case 4: ao.token_frac = NAN; break;
		case 5: ao.token_frac = -0.1; break;
		}
		static float q[(MKV_MAX_QHEADS + 1) * D];
		static float out[(MKV_MAX_QHEADS + 1) * D];
		memset(out, 0x99, sizeof out);
		float sc[64];
		struct mkv_block_ref sel[64];
		int64_t rcs[5] = {
			mkv_attend_dense(&ao, q, &kv, out),
			mkv_attend_quest(&ao, q, &kv, NULL, out, NULL),
			mkv_attend_packed(&ao, q, ks, vs, 1, NULL, out, NULL),
			mkv_score_blocks(&ao, q, F->k, sc),
			mkv_select_blocks(&ao, q, ks, 1, sel, 64),
		};
		/* dense ignores token_frac; every other entry must refuse */
		for (int e = 0; e < 5; e++) {
			if (e == 0 && c >= 2 && c <= 5)
				continue;
			cr_assert_eq(rcs[e], -EINVAL, "attention option case %d, entry %d: rc=%lld",
				     c, e, (long long)rcs[e]);
		}
		for (size_t i = 0; i < sizeof out; i++)
			cr_assert_eq(((unsigned char *)out)[i], 0x99, "case %d: out written", c);
	}
	fx_unchanged();
}

Test(badinput, attention_nonfinite_query)
{
	struct mkv_attn_opts ao;
	cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
	ao.d = D;
	ao.n_q = 4;
	struct mkv_dense_kv kv = {.k = F->x, .v = F->x, .dtype = MKV_DTYPE_F32, .n = N};
	const struct mkv_segment *ks[1] = {F->k}, *vs[1] = {F->v};
	float q[4 * D];
	memcpy(q, F->q, sizeof q);
	q[3 * D + 9] = NAN;
	for (int t = 0; t < 2; t++) {
		float out[4 * D], sc[64];
		struct mkv_block_ref sel[64];
		memset(out, 0x99, sizeof out);
		EXPECT_RC(mkv_attend_dense(&ao, q, &kv, out), -MKV_ENONFINITE);
		EXPECT_RC(mkv_attend_quest(&ao, q, &kv, NULL, out, NULL), -MKV_ENONFINITE);
		EXPECT_RC(mkv_attend_packed(&ao, q, ks, vs, 1, NULL, out, NULL), -MKV_ENONFINITE);
		EXPECT_RC(mkv_score_blocks(&ao, q, F->k, sc), -MKV_ENONFINITE);
		EXPECT_RC(mkv_select_blocks(&ao, q, ks, 1, sel, 64), -MKV_ENONFINITE);
		for (size_t i = 0; i < sizeof out; i++)
			cr_assert_eq(((unsigned char *)out)[i], 0x99);
		q[3 * D + 9] = -INFINITY;
	}
	fx_unchanged();
}

Test(badinput, attention_bad_dense_kv)
{
	struct mkv_attn_opts ao;
	cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
	ao.d = D;
	struct mkv_dense_kv kv = {.k = F->x, .v = F->x, .dtype = (enum mkv_dtype)9, .n = N};
	float out[D];
	memset(out, 0x99, sizeof out);
	EXPECT_RC(mkv_attend_dense(&ao, F->q, &kv, out), -EINVAL);
	EXPECT_RC(mkv_attend_quest(&ao, F->q, &kv, NULL, out, NULL), -EINVAL);
	const struct mkv_segment *ks[1] = {F->k}, *vs[1] = {F->v};
	EXPECT_RC(mkv_attend_packed(&ao, F->q, ks, vs, 1, &kv, out, NULL), -EINVAL);
	cr_assert_eq(((unsigned char *)out)[0], 0x99);
	fx_unchanged();
}

Test(badinput, attention_shape_mismatch)
{
	struct mkv_attn_opts ao;
	cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
	ao.d = D;
	float out[D], sc[64];
	struct mkv_block_ref sel[64];
	memset(out, 0x99, sizeof out);
	struct mkv_attn_stats st, st0;
	memset(&st, 0x99, sizeof st);
	st0 = st;
	/* a value segment of a different n */
	struct mkv_encode_opts o = good_opts();
	o.kind = MKV_KIND_VALUE;
	struct mkv_segment *v2 = NULL;
	cr_assert_eq(mkv_segment_encode(&o, F->x, MKV_DTYPE_F32, N - 1, &v2), 0);
	const struct mkv_segment *ks[1] = {F->k}, *vs2[1] = {v2};
	EXPECT_RC(mkv_attend_packed(&ao, F->q, ks, vs2, 1, NULL, out, &st), -MKV_ESHAPE);
	/* segments of another d than o->d */
	struct mkv_encode_opts o128 = good_opts();
	o128.d = 128;
	float *x128 = th_alloc(N * 128 * sizeof *x128);
	memcpy(x128, F->x, sizeof F->x);
	memcpy(x128 + N * D, F->x, sizeof F->x);
	struct mkv_segment *k128 = NULL, *v128 = NULL;
	o128.kind = MKV_KIND_KEY;
	cr_assert_eq(mkv_segment_encode(&o128, x128, MKV_DTYPE_F32, N, &k128), 0);
	o128.kind = MKV_KIND_VALUE;
	cr_assert_eq(mkv_segment_encode(&o128, x128, MKV_DTYPE_F32, N, &v128), 0);
	const struct mkv_segment *kb[1] = {k128}, *vb[1] = {v128}, *vs[1] = {F->v};
	EXPECT_RC(mkv_attend_packed(&ao, F->q, kb, vb, 1, NULL, out, &st), -MKV_ESHAPE);
	EXPECT_RC(mkv_attend_packed(&ao, F->q, ks, vb, 1, NULL, out, &st), -MKV_ESHAPE);
	memset(sc, 0x99, sizeof sc);
	memset(sel, 0x99, sizeof sel);
	EXPECT_RC(mkv_score_blocks(&ao, F->q, k128, sc), -MKV_ESHAPE);
	EXPECT_RC(mkv_select_blocks(&ao, F->q, kb, 1, sel, 64), -MKV_ESHAPE);
	/* a value segment where a key segment belongs */
	const struct mkv_segment *vk[1] = {F->v};
	EXPECT_RC(mkv_attend_packed(&ao, F->q, vk, vs, 1, NULL, out, &st), -EINVAL);
	EXPECT_RC(mkv_score_blocks(&ao, F->q, F->v, sc), -EINVAL);
	EXPECT_RC(mkv_select_blocks(&ao, F->q, vk, 1, sel, 64), -EINVAL);
	cr_assert_eq(((unsigned char *)out)[0], 0x99);
	cr_assert(memcmp(&st, &st0, sizeof st) == 0, "stats written on failure");
	for (size_t i = 0; i < sizeof sc; i++)
		cr_assert_eq(((unsigned char *)sc)[i], 0x99);
	for (size_t i = 0; i < sizeof sel; i++)
		cr_assert_eq(((unsigned char *)sel)[i], 0x99);
	mkv_segment_destroy(v2);
	mkv_segment_destroy(k128);
	mkv_segment_destroy(v128);
	free(x128);
	fx_unchanged();
}

/* ---- error text ---------------------------------------------------------- */

Test(badinput, strerror_distinct_for_every_code)
{
	const int codes[] = {EINVAL, ENOMEM, ENOSPC, MKV_ENONFINITE, MKV_ELAPACK,
			     MKV_ECORRUPT, MKV_ESHAPE, MKV_ENODEV};
	const size_t nc = sizeof codes / sizeof *codes;
	for (size_t i = 0; i < nc; i++) {
		const char *a = mkv_strerror(-codes[i]);
		cr_assert_not_null(a);
		cr_assert(strlen(a) > 3, "code %d: text '%s'", codes[i], a);
		cr_assert_null(strstr(a, "nknown"), "code %d: '%s'", codes[i], a);
		cr_assert_str_eq(mkv_strerror(codes[i]), a, "code %d: text differs by sign",
				 codes[i]);
		for (size_t j = 0; j < i; j++)
			cr_assert_str_neq(a, mkv_strerror(-codes[j]),
					  "codes %d and %d share the text '%s'", codes[i], codes[j], a);
	}
	cr_assert_not_null(mkv_strerror(-123456));
	cr_assert_not_null(mkv_strerror(0));
	cr_assert_not_null(mkv_version());
}
