/* SPDX-License-Identifier: MIT */
/*
 * Packed-to-dense round trip, serialization and memory accounting.
 *  - Decoding to MKV_SPACE_ROTATED returns, at the positions the bitmap
 *    names, exactly the stored values (compared as float bits after
 *    converting bf16 here), in set-bit order, and zero elsewhere.
 *  - MKV_SPACE_ORIGINAL equals x̂' R computed here in double.
 *  - serialize → deserialize gives identical views; any flipped byte or a
 *    truncation gives -MKV_ECORRUPT; a short buffer gives -ENOSPC without
 *    writing past it.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <xxhash.h>

#include "helpers.h"

static const uint32_t dims[3] = {64, 128, 256};

struct seg_case {
	uint64_t seed;
	uint32_t d, g, r, b, drop, rotate, S;
	uint32_t value_bits; /* 0, or 4..8: quantized rows */
	enum mkv_kind kind;
	enum mkv_dtype store, in_dt;
	size_t n;
};

static void random_case(struct th_rng *rng, struct seg_case *k, uint64_t seed)
{
	memset(k, 0, sizeof *k);
	k->seed = seed;
	k->d = dims[th_below(rng, 3)];
	k->g = 1u << th_below(rng, 4);
	k->drop = th_below(rng, 2);
	uint32_t dk = k->drop ? k->d - k->d / 4 : k->d;
	k->r = k->g * (1 + th_below(rng, dk / k->g));
	k->b = 8u << th_below(rng, 4);
	k->rotate = th_below(rng, 4) != 0;
	k->kind = th_below(rng, 2) ? MKV_KIND_KEY : MKV_KIND_VALUE;
	k->store = th_below(rng, 2) ? MKV_DTYPE_BF16 : MKV_DTYPE_F32;
	k->in_dt = (enum mkv_dtype)th_below(rng, 3);
	/* S is for keys; the library refuses it on value segments */
	k->S = k->kind == MKV_KIND_VALUE || th_below(rng, 2) ? 0 : 1 + th_below(rng, dk);
	k->n = 1 + th_below(rng, 300);
	static const uint32_t vb[] = {0, 0, 0, 4, 5, 6, 7, 8};
	k->value_bits = vb[th_below(rng, 8)];
}

/* Bytes of one packed row, from the format's definition. */
static size_t row_bytes_ref(uint32_t r, uint32_t w, enum mkv_dtype store)
{
	if (!w)
		return (size_t)r * th_dtype_size(store);
	size_t bytes = 2 + ((size_t)r * w + 7) / 8;
	return bytes + (bytes & 1);
}

static struct mkv_segment *encode_case(const struct seg_case *k, double **ref_out)
{
	struct th_rng rng;
	th_rng_init(&rng, k->seed ^ 0xabcdefull);
	float *x = th_alloc(k->n * k->d * sizeof *x);
	th_gaussian(&rng, x, k->n * k->d, 1.0);
	void *buf = th_alloc(k->n * k->d * 4);
	double *ref = th_alloc(k->n * k->d * sizeof *ref);
	th_encode_dt(x, k->n * k->d, k->in_dt, buf, ref);
	struct mkv_encode_opts o;
	cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
	o.d = k->d;
	o.g = k->g;
	o.r = k->r;
	o.b = k->b;
	o.drop = k->drop;
	o.rotate = k->rotate;
	o.kind = k->kind;
	o.store_dtype = k->store;
	o.summary_channels = k->kind == MKV_KIND_KEY ? k->S : 0;
	o.value_bits = k->value_bits;
	struct mkv_segment *s = NULL;
	int rc = mkv_segment_encode(&o, buf, k->in_dt, k->n, &s);
	cr_assert_eq(rc, 0,
		     "seed=%llu d=%u g=%u r=%u b=%u drop=%u rotate=%u: encode rc=%d (%s)",
		     (unsigned long long)k->seed, k->d, k->g, k->r, k->b, k->drop,
		     k->rotate, rc, mkv_strerror(rc));
	free(x);
	free(buf);
	if (ref_out)
		*ref_out = ref;
	else
		free(ref);
	return s;
}

Test(roundtrip, rotated_decode_is_bit_exact)
{
	for (int it = 0; it < 24; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		struct seg_case k;
		random_case(&rng, &k, seed);
		k.store = it & 1 ? MKV_DTYPE_BF16 : MKV_DTYPE_F32; /* both, always */
		k.g = 1u << ((it >> 1) & 3);                       /* every g */
		uint32_t dk = k.drop ? k.d - k.d / 4 : k.d;
		k.r = k.g * (1 + th_below(&rng, dk / k.g));
		struct mkv_segment *s = encode_case(&k, NULL);
		struct mkv_packed_view v;
		cr_assert_eq(mkv_segment_view(s, &v), 0);
		float *dec = th_alloc(k.n * dk * sizeof *dec);
		cr_assert_eq(mkv_segment_decode(s, 0, k.n, MKV_SPACE_ROTATED, dec), 0);
		for (size_t i = 0; i < k.n; i++) {
			const uint8_t *bm = v.bitmaps + i * v.bitmap_bytes;
			size_t next = 0; /* index of the next stored value of vector i */
			for (uint32_t j = 0; j < dk / k.g; j++) {
				bool set = th_bit(bm, j);
				for (uint32_t t = 0; t < k.g; t++) {
					uint32_t ch = j * k.g + t;
					float got = dec[i * dk + ch];
					if (set) {
						cr_assert(next < k.r, "seed=%llu: vector %zu has more than r stored values",
							  (unsigned long long)seed, i);
						float want = (float)th_view_value(&v, i, next++);
						cr_assert(memcmp(&got, &want, 4) == 0,
							  "seed=%llu store=%s g=%u bits=%u: vector %zu channel %u decoded %a, stored %a",
							  (unsigned long long)seed,
							  th_dtype_name(k.store), k.g, k.value_bits, i, ch,
							  got, want);
					} else {
						cr_assert(got == 0.0f,
							  "seed=%llu: vector %zu channel %u unset but decoded %a",
							  (unsigned long long)seed, i, ch, got);
					}
				}
			}
			cr_assert_eq(next, k.r, "seed=%llu: vector %zu: %zu values named by the bitmap, r=%u",
				     (unsigned long long)seed, i, next, k.r);
		}
		/* a sub-range decodes to the same rows */
		size_t first = th_below(&rng, (uint32_t)k.n);
		size_t count = 1 + th_below(&rng, (uint32_t)(k.n - first));
		float *part = th_alloc(count * dk * sizeof *part);
		cr_assert_eq(mkv_segment_decode(s, first, count, MKV_SPACE_ROTATED, part), 0);
		cr_assert(memcmp(part, dec + first * dk, count * dk * sizeof *part) == 0,
			  "seed=%llu: decode of [%zu, +%zu) differs from the full decode",
			  (unsigned long long)seed, first, count);
		free(part);
		free(dec);
		mkv_segment_destroy(s);
	}
}

Test(roundtrip, original_decode_is_rotated_back)
{
	for (int it = 0; it < 12; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		struct seg_case k;
		random_case(&rng, &k, seed);
		struct mkv_segment *s = encode_case(&k, NULL);
		struct mkv_packed_view v;
		cr_assert_eq(mkv_segment_view(s, &v), 0);
		double *want = th_alloc(k.n * k.d * sizeof *want);
		th_view_reconstruct(&v, want);
		float *dec = th_alloc(k.n * k.d * sizeof *dec);
		cr_assert_eq(mkv_segment_decode(s, 0, k.n, MKV_SPACE_ORIGINAL, dec), 0);
		for (size_t i = 0; i < k.n; i++) {
			double e = th_rel_err_fd(dec + i * k.d, want + i * k.d, k.d);
			cr_assert(e < 1e-5,
				  "seed=%llu d=%u store=%s: vector %zu: original decode rel err %.3g vs x̂'R",
				  (unsigned long long)seed, k.d, th_dtype_name(k.store), i, e);
		}
		free(dec);
		free(want);
		mkv_segment_destroy(s);
	}
}

/* r = d_keep = d, f32 storage: decoding to the original space gives the
 * input back (up to float rotation error). */
Test(roundtrip, full_r_reconstructs_input)
{
	uint64_t seed = th_seed();
	struct th_rng rng;
	th_rng_init(&rng, seed);
	for (int di = 0; di < 3; di++) {
		struct seg_case k;
		random_case(&rng, &k, seed + (uint64_t)di);
		k.d = dims[di];
		k.drop = 0;
		k.g = 1;
		k.r = k.d;
		k.S = 0;
		k.store = MKV_DTYPE_F32;
		k.value_bits = 0;
		double *ref = NULL;
		struct mkv_segment *s = encode_case(&k, &ref);
		float *dec = th_alloc(k.n * k.d * sizeof *dec);
		cr_assert_eq(mkv_segment_decode(s, 0, k.n, MKV_SPACE_ORIGINAL, dec), 0);
		double e = th_frob_rel(ref, dec, k.n * k.d);
		cr_assert(e < 1e-5, "seed=%llu d=%u: r=d reconstruction rel err %.3g",
			  (unsigned long long)seed, k.d, e);
		free(dec);
		free(ref);
		mkv_segment_destroy(s);
	}
}

/*
 * Quantized rows against the same segment encoded with f32 element rows:
 * the same rotation and bitmaps, a per-vector scale in
 * [amax/qmax, amax/qmax * (1 + 2^-7)] and every value within half a step.
 */
Test(roundtrip, quantized_rows_within_half_a_step)
{
	for (int it = 0; it < 20; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		struct seg_case k;
		random_case(&rng, &k, seed);
		k.store = MKV_DTYPE_F32;
		k.value_bits = 4 + (uint32_t)(it % 5);
		struct mkv_segment *q = encode_case(&k, NULL);
		struct seg_case e = k;
		e.value_bits = 0;
		struct mkv_segment *f = encode_case(&e, NULL);
		struct mkv_packed_view vq, vf;
		cr_assert_eq(mkv_segment_view(q, &vq), 0);
		cr_assert_eq(mkv_segment_view(f, &vf), 0);
		cr_assert_eq(vq.value_bits, k.value_bits);
		cr_assert_eq(vq.row_bytes, row_bytes_ref(k.r, k.value_bits, k.store));
		cr_assert(memcmp(vq.rotation, vf.rotation, (size_t)vq.d_keep * vq.d * 4) == 0);
		cr_assert(memcmp(vq.bitmaps, vf.bitmaps, (size_t)vq.n * vq.bitmap_bytes) == 0,
			  "seed=%llu: quantizing changed the selection", (unsigned long long)seed);
		double qmax = (double)((1 << (k.value_bits - 1)) - 1);
		for (size_t i = 0; i < k.n; i++) {
			double amax = 0;
			for (uint32_t j = 0; j < k.r; j++)
				amax = fmax(amax, fabs(th_view_value(&vf, i, j)));
			const uint8_t *row = (const uint8_t *)vq.values + i * vq.row_bytes;
			double scale = th_bf16_to_f32((uint16_t)(row[0] | row[1] << 8));
			cr_assert(scale >= amax / qmax * (1 - 1e-7) &&
				  scale <= amax / qmax * (1 + 1.0 / 128) + 1e-30,
				  "seed=%llu bits=%u: vector %zu scale %.9g for amax %.9g",
				  (unsigned long long)seed, k.value_bits, i, scale, amax);
			for (uint32_t j = 0; j < k.r; j++) {
				double x = th_view_value(&vf, i, j), y = th_view_value(&vq, i, j);
				cr_assert(fabs(x - y) <= scale * 0.5 * (1 + 1e-6),
					  "seed=%llu bits=%u: vector %zu value %u: %.9g quantized to %.9g (step %.9g)",
					  (unsigned long long)seed, k.value_bits, i, j, x, y, scale);
			}
			/* padding past the last field is zero */
			for (size_t bit = 16 + (size_t)k.r * k.value_bits; bit < (size_t)vq.row_bytes * 8; bit++)
				cr_assert(!((row[bit / 8] >> (bit % 8)) & 1),
					  "seed=%llu: padding bit %zu of vector %zu set",
					  (unsigned long long)seed, bit, i);
		}
		mkv_segment_destroy(q);
		mkv_segment_destroy(f);
	}
}

static size_t arr_bytes(enum mkv_dtype dt, size_t count)
{
	return count * th_dtype_size(dt);
}

static void assert_views_equal(uint64_t seed, const struct mkv_packed_view *a,
			       const struct mkv_packed_view *b)
{
	cr_assert(a->n == b->n && a->d == b->d && a->d_keep == b->d_keep &&
		  a->r == b->r && a->g == b->g && a->b == b->b &&
		  a->value_bits == b->value_bits && a->row_bytes == b->row_bytes &&
		  a->n_blocks == b->n_blocks && a->bitmap_bytes == b->bitmap_bytes &&
		  a->summary_channels == b->summary_channels && a->kind == b->kind &&
		  a->store_dtype == b->store_dtype && a->rotated == b->rotated,
		  "seed=%llu: view scalars differ after deserialize", (unsigned long long)seed);
	cr_assert(memcmp(a->values, b->values, (size_t)a->n * a->row_bytes) == 0,
		  "seed=%llu: values differ", (unsigned long long)seed);
	cr_assert(memcmp(a->bitmaps, b->bitmaps, (size_t)a->n * a->bitmap_bytes) == 0,
		  "seed=%llu: bitmaps differ", (unsigned long long)seed);
	cr_assert(memcmp(a->rotation, b->rotation,
			 arr_bytes(a->store_dtype, (size_t)a->d_keep * a->d)) == 0,
		  "seed=%llu: rotations differ", (unsigned long long)seed);
	if (a->kind == MKV_KIND_KEY) {
		size_t sb = arr_bytes(a->store_dtype, (size_t)a->n_blocks * a->summary_channels);
		cr_assert(memcmp(a->sum_min, b->sum_min, sb) == 0,
			  "seed=%llu: sum_min differs", (unsigned long long)seed);
		cr_assert(memcmp(a->sum_max, b->sum_max, sb) == 0,
			  "seed=%llu: sum_max differs", (unsigned long long)seed);
		cr_assert(memcmp(a->sum_rest, b->sum_rest,
				 arr_bytes(a->store_dtype, a->n_blocks)) == 0,
			  "seed=%llu: sum_rest differs", (unsigned long long)seed);
	} else {
		cr_assert_null(b->sum_min);
		cr_assert_null(b->sum_max);
		cr_assert_null(b->sum_rest);
	}
}

Test(roundtrip, serialize_deserialize_identical)
{
	for (int it = 0; it < 16; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		struct seg_case k;
		random_case(&rng, &k, seed);
		struct mkv_segment *s = encode_case(&k, NULL);
		int64_t need = mkv_segment_serialize(s, NULL, 0);
		cr_assert(need > 0, "seed=%llu: serialize size %lld", (unsigned long long)seed,
			  (long long)need);
		unsigned char *buf = th_alloc((size_t)need + 64);
		memset(buf, 0xcd, (size_t)need + 64);
		int64_t wrote = mkv_segment_serialize(s, buf, (size_t)need + 64);
		cr_assert_eq(wrote, need, "seed=%llu: wrote %lld, size query %lld",
			     (unsigned long long)seed, (long long)wrote, (long long)need);
		for (size_t i = (size_t)need; i < (size_t)need + 64; i++)
			cr_assert_eq(buf[i], 0xcd, "seed=%llu: byte %zu past the size written",
				     (unsigned long long)seed, i);
		struct mkv_segment *s2 = NULL;
		int rc = mkv_segment_deserialize(buf, (size_t)need, &s2);
		cr_assert_eq(rc, 0, "seed=%llu: deserialize rc=%d (%s)", (unsigned long long)seed,
			     rc, mkv_strerror(rc));
		struct mkv_packed_view a, b;
		cr_assert_eq(mkv_segment_view(s, &a), 0);
		cr_assert_eq(mkv_segment_view(s2, &b), 0);
		assert_views_equal(seed, &a, &b);
		/* decoding and re-serializing give the same results */
		float *d1 = th_alloc(k.n * k.d * sizeof *d1), *d2 = th_alloc(k.n * k.d * sizeof *d2);
		cr_assert_eq(mkv_segment_decode(s, 0, k.n, MKV_SPACE_ORIGINAL, d1), 0);
		cr_assert_eq(mkv_segment_decode(s2, 0, k.n, MKV_SPACE_ORIGINAL, d2), 0);
		cr_assert(memcmp(d1, d2, k.n * k.d * sizeof *d1) == 0,
			  "seed=%llu: decode differs after deserialize", (unsigned long long)seed);
		unsigned char *buf2 = th_alloc((size_t)need);
		cr_assert_eq(mkv_segment_serialize(s2, buf2, (size_t)need), need);
		cr_assert(memcmp(buf, buf2, (size_t)need) == 0,
			  "seed=%llu: re-serialization differs", (unsigned long long)seed);
		/* position independence: from a copy at an odd address */
		unsigned char *odd = th_alloc((size_t)need + 1);
		memcpy(odd + 1, buf, (size_t)need);
		struct mkv_segment *s3 = NULL;
		cr_assert_eq(mkv_segment_deserialize(odd + 1, (size_t)need, &s3), 0,
			     "seed=%llu: deserialize from an unaligned copy failed",
			     (unsigned long long)seed);
		struct mkv_packed_view c;
		cr_assert_eq(mkv_segment_view(s3, &c), 0);
		assert_views_equal(seed, &a, &c);
		mkv_segment_destroy(s3);
		free(odd);
		free(buf2);
		free(d1);
		free(d2);
		mkv_segment_destroy(s2);
		mkv_segment_destroy(s);
		free(buf);
	}
}

/*
 * Version 1 of the serialized format (before quantized rows and remainder
 * bounds), rebuilt here from the layout it had: an 80-byte header without
 * value_bits, five arrays at 16-byte boundaries, the same checksum rule.
 * A store's NVMe tier may hold such files; they must still load, with a
 * zero remainder bound, and a flipped byte must still be caught.
 */
struct v1_hdr {
	char magic[8];
	uint32_t version, hdr_size;
	uint32_t n, d, d_keep, r, g, b, S;
	uint32_t kind, store_dtype, rotated;
	uint64_t total_len, checksum;
};

static size_t al16(size_t x) { return (x + 15) & ~(size_t)15; }

Test(roundtrip, version1_segments_still_load)
{
	for (int it = 0; it < 8; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		struct seg_case k;
		random_case(&rng, &k, seed);
		k.value_bits = 0; /* version 1 had element rows only */
		k.kind = it & 1 ? MKV_KIND_KEY : MKV_KIND_VALUE;
		k.S = 0;
		struct mkv_segment *s = encode_case(&k, NULL);
		struct mkv_packed_view v;
		cr_assert_eq(mkv_segment_view(s, &v), 0);
		size_t es = th_dtype_size(v.store_dtype);
		size_t len[5] = {(size_t)v.n * v.r * es, (size_t)v.n * v.bitmap_bytes,
				 (size_t)v.d_keep * v.d * es,
				 (size_t)v.n_blocks * v.summary_channels * es,
				 (size_t)v.n_blocks * v.summary_channels * es};
		const void *src[5] = {v.values, v.bitmaps, v.rotation, v.sum_min, v.sum_max};
		size_t pos = al16(sizeof(struct v1_hdr)), off[5];
		for (int i = 0; i < 5; i++) {
			off[i] = pos;
			pos = al16(pos + len[i]);
		}
		char *buf = th_alloc(pos);
		memset(buf, 0, pos);
		struct v1_hdr h = {.version = 1, .hdr_size = sizeof h, .n = v.n, .d = v.d,
				   .d_keep = v.d_keep, .r = v.r, .g = v.g, .b = v.b,
				   .S = v.summary_channels, .kind = v.kind,
				   .store_dtype = v.store_dtype, .rotated = v.rotated,
				   .total_len = pos};
		memcpy(h.magic, "MKVSEG\r\n", 8);
		memcpy(buf, &h, sizeof h);
		for (int i = 0; i < 5; i++)
			if (src[i])
				memcpy(buf + off[i], src[i], len[i]);
		size_t ck = offsetof(struct v1_hdr, checksum);
		uint64_t sd = XXH3_64bits(buf, ck);
		h.checksum = XXH3_64bits_withSeed(buf + ck + 8, pos - ck - 8, sd);
		memcpy(buf, &h, sizeof h);
		struct mkv_segment *o = NULL;
		int rc = mkv_segment_deserialize(buf, pos, &o);
		cr_assert_eq(rc, 0, "seed=%llu: version-1 bytes rc=%d (%s)",
			     (unsigned long long)seed, rc, mkv_strerror(rc));
		struct mkv_packed_view w;
		cr_assert_eq(mkv_segment_view(o, &w), 0);
		cr_assert_eq(w.value_bits, 0);
		cr_assert(memcmp(w.values, v.values, len[0]) == 0 &&
			  memcmp(w.bitmaps, v.bitmaps, len[1]) == 0,
			  "seed=%llu: version-1 rows differ", (unsigned long long)seed);
		for (uint32_t j = 0; k.kind == MKV_KIND_KEY && j < w.n_blocks; j++)
			cr_assert_eq(th_elem(w.sum_rest, w.store_dtype, j), 0.0);
		mkv_segment_destroy(o);
		buf[pos / 2] ^= 0x10;
		o = NULL;
		cr_assert_eq(mkv_segment_deserialize(buf, pos, &o), -MKV_ECORRUPT);
		cr_assert_null(o);
		free(buf);
		mkv_segment_destroy(s);
	}
}

Test(roundtrip, serialize_short_buffer_enospc)
{
	uint64_t seed = th_seed();
	struct th_rng rng;
	th_rng_init(&rng, seed);
	struct seg_case k;
	random_case(&rng, &k, seed);
	struct mkv_segment *s = encode_case(&k, NULL);
	int64_t need = mkv_segment_serialize(s, NULL, 0);
	cr_assert(need > 0);
	unsigned char *buf = th_alloc((size_t)need);
	size_t caps[4] = {0, 1, (size_t)need / 2, (size_t)need - 1};
	for (int i = 0; i < 4; i++) {
		memset(buf, 0x5a, (size_t)need);
		int64_t rc = mkv_segment_serialize(s, buf, caps[i]);
		cr_assert_eq(rc, -ENOSPC, "seed=%llu: cap %zu of %lld: rc=%lld",
			     (unsigned long long)seed, caps[i], (long long)need, (long long)rc);
		for (size_t j = caps[i]; j < (size_t)need; j++)
			cr_assert_eq(buf[j], 0x5a, "seed=%llu: cap %zu: byte %zu written",
				     (unsigned long long)seed, caps[i], j);
	}
	free(buf);
	mkv_segment_destroy(s);
}

static void check_corrupt(uint64_t seed, const unsigned char *good, size_t len,
			  size_t pos, unsigned char mask)
{
	unsigned char *bad = th_alloc(len);
	memcpy(bad, good, len);
	bad[pos] ^= mask;
	struct mkv_segment *sentinel = (struct mkv_segment *)(uintptr_t)0x1;
	struct mkv_segment *out = sentinel;
	int rc = mkv_segment_deserialize(bad, len, &out);
	if (rc == 0)
		mkv_segment_destroy(out);
	cr_assert_eq(rc, -MKV_ECORRUPT,
		     "seed=%llu: byte %zu of %zu xor 0x%02x: deserialize rc=%d (%s)",
		     (unsigned long long)seed, pos, len, mask, rc, mkv_strerror(rc));
	cr_assert_eq(out, sentinel, "seed=%llu: *out written on failure", (unsigned long long)seed);
	free(bad);
}

/* Every byte of a small segment, flipped, is caught. */
Test(roundtrip, flipped_byte_anywhere_is_corrupt)
{
	uint64_t seed = th_seed();
	struct th_rng rng;
	th_rng_init(&rng, seed);
	for (int it = 0; it < 2; it++) {
		struct seg_case k;
		random_case(&rng, &k, seed + (uint64_t)it);
		k.d = 64;
		k.n = 5 + th_below(&rng, 20);
		k.kind = it ? MKV_KIND_VALUE : MKV_KIND_KEY;
		uint32_t dk = k.drop ? 48 : 64;
		k.r = k.g * (1 + th_below(&rng, dk / k.g));
		k.S = 0;
		struct mkv_segment *s = encode_case(&k, NULL);
		int64_t len = mkv_segment_serialize(s, NULL, 0);
		cr_assert(len > 0);
		unsigned char *good = th_alloc((size_t)len);
		cr_assert_eq(mkv_segment_serialize(s, good, (size_t)len), len);
		for (size_t pos = 0; pos < (size_t)len; pos++)
			check_corrupt(seed, good, (size_t)len, pos,
				      (unsigned char)(1u << th_below(&rng, 8)));
		/* whole-byte flips at random places */
		for (int j = 0; j < 200; j++)
			check_corrupt(seed, good, (size_t)len, th_below(&rng, (uint32_t)len), 0xff);
		/* truncations */
		size_t cuts[5] = {0, 1, 8, (size_t)len / 2, (size_t)len - 1};
		for (int j = 0; j < 5; j++) {
			struct mkv_segment *out = NULL;
			int rc = mkv_segment_deserialize(good, cuts[j], &out);
			if (rc == 0)
				mkv_segment_destroy(out);
			cr_assert_eq(rc, -MKV_ECORRUPT,
				     "seed=%llu: truncated to %zu of %lld bytes: rc=%d (%s)",
				     (unsigned long long)seed, cuts[j], (long long)len, rc,
				     mkv_strerror(rc));
			cr_assert_null(out);
		}
		free(good);
		mkv_segment_destroy(s);
	}
}

/* Larger segments: random single-bit flips. */
Test(roundtrip, flipped_bits_large_segment)
{
	uint64_t seed = th_seed();
	struct th_rng rng;
	th_rng_init(&rng, seed);
	struct seg_case k;
	random_case(&rng, &k, seed);
	k.d = 256;
	k.n = 500;
	k.kind = MKV_KIND_KEY;
	struct mkv_segment *s = encode_case(&k, NULL);
	int64_t len = mkv_segment_serialize(s, NULL, 0);
	unsigned char *good = th_alloc((size_t)len);
	cr_assert_eq(mkv_segment_serialize(s, good, (size_t)len), len);
	for (int j = 0; j < 300; j++)
		check_corrupt(seed, good, (size_t)len, th_below(&rng, (uint32_t)len),
			      (unsigned char)(1u << th_below(&rng, 8)));
	/* the first and last 64 bytes (headers and trailers) exhaustively */
	for (size_t pos = 0; pos < 64 && pos < (size_t)len; pos++) {
		check_corrupt(seed, good, (size_t)len, pos, 0x80);
		check_corrupt(seed, good, (size_t)len, (size_t)len - 1 - pos, 0x01);
	}
	free(good);
	mkv_segment_destroy(s);
}

Test(roundtrip, segment_bytes_accounting)
{
	for (int it = 0; it < 12; it++) {
		uint64_t seed = th_seed();
		struct th_rng rng;
		th_rng_init(&rng, seed);
		struct seg_case k;
		random_case(&rng, &k, seed);
		struct mkv_segment *s = encode_case(&k, NULL);
		struct mkv_packed_view v;
		cr_assert_eq(mkv_segment_view(s, &v), 0);
		struct mkv_segment_bytes b;
		cr_assert_eq(mkv_segment_bytes(s, &b), 0);
		size_t es = th_dtype_size(k.store);
		uint32_t dk = k.drop ? k.d - k.d / 4 : k.d;
		size_t nb = (k.n + k.b - 1) / k.b;
		size_t want_vals = k.n * row_bytes_ref(k.r, k.value_bits, k.store);
		size_t want_bm = k.n * ((dk / k.g + 7) / 8);
		size_t want_rot = (size_t)dk * k.d * es;
		size_t want_sum = k.kind == MKV_KIND_KEY ? (2 * v.summary_channels + 1) * nb * es : 0;
		cr_assert_eq(b.values, want_vals, "seed=%llu: values %zu, want %zu",
			     (unsigned long long)seed, b.values, want_vals);
		cr_assert_eq(b.bitmaps, want_bm, "seed=%llu: bitmaps %zu, want %zu",
			     (unsigned long long)seed, b.bitmaps, want_bm);
		cr_assert_eq(b.rotation, want_rot, "seed=%llu: rotation %zu, want %zu",
			     (unsigned long long)seed, b.rotation, want_rot);
		cr_assert_eq(b.summaries, want_sum, "seed=%llu: summaries %zu, want %zu",
			     (unsigned long long)seed, b.summaries, want_sum);
		cr_assert_eq(b.total, want_vals + want_bm + want_rot + want_sum);
		cr_assert_eq(b.dense, k.n * k.d * 2);
		mkv_segment_destroy(s);
	}
}
