/* SPDX-License-Identifier: MIT */
/* tests/io/test_segfile.c — io/segfile.c: framing, checksum, lz4 rule. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include <mosaickv/common.h>
#include <xxhash.h>

#include "io/segfile.h"
#include "testutil.h"

static struct segfile_meta meta(void)
{
	struct segfile_meta m;

	memset(&m, 0, sizeof m);
	m.key.seq = 0x1122334455667788ull;
	m.key.layer = 3;
	m.key.head = 5;
	m.key.seg = 7;
	m.key.kind = 1;
	for (int i = 0; i < SEGFILE_SHAPE_WORDS; i++)
		m.shape[i] = 100u + (uint32_t)i;
	return m;
}

static void roundtrip(size_t len, int compressible, int try_lz4,
		      int expect_lz4)
{
	struct segfile_meta m = meta(), got;
	size_t cap = segfile_bound(len);
	uint8_t *src = malloc(len), *frame = aligned_alloc(4096, cap),
		*out = malloc(len);
	int64_t fl, rl;

	cr_assert(src && frame && out);
	if (compressible)
		tu_fill_compressible(src, len, 3);
	else
		tu_fill(src, len, 3);
	fl = segfile_encode(&m, src, len, frame, cap, try_lz4);
	cr_assert_gt(fl, 0);
	cr_assert_eq(fl % SEGFILE_ALIGN, 0);
	cr_assert_eq(!!(m.flags & SEGFILE_F_LZ4), expect_lz4);
	if (expect_lz4)
		cr_assert_leq(m.stored_len, len - len / 10);
	else
		cr_assert_eq(m.stored_len, len);
	cr_assert_eq((size_t)fl, segfile_frame_len(&m));
	rl = segfile_decode(frame, (size_t)fl, &got, out, len);
	cr_assert_eq(rl, (int64_t)len);
	cr_assert_eq(memcmp(src, out, len), 0);
	cr_assert_eq(got.key.seq, m.key.seq);
	cr_assert_eq(got.key.layer, 3);
	cr_assert_eq(got.key.head, 5);
	cr_assert_eq(got.key.seg, 7);
	cr_assert_eq(got.key.kind, 1);
	cr_assert_eq(got.shape[7], 107);
	cr_assert_eq(got.payload_hash, m.payload_hash);
	free(src);
	free(frame);
	free(out);
}

Test(segfile, roundtrip_raw_random) { roundtrip(100000, 0, 1, 0); }
Test(segfile, roundtrip_lz4_compressible) { roundtrip(100000, 1, 1, 1); }
Test(segfile, roundtrip_lz4_disabled) { roundtrip(100000, 1, 0, 0); }
Test(segfile, roundtrip_tiny) { roundtrip(1, 0, 1, 0); }

/* Data that lz4 shrinks by less than 10% is stored raw. */
Test(segfile, lz4_only_when_it_saves_10_percent)
{
	size_t len = 65536, cap = segfile_bound(len);
	uint8_t *src = malloc(len), *frame = aligned_alloc(4096, cap);
	struct segfile_meta m = meta();

	/* 95% random, 5% zeros: lz4 saves about 5%. */
	tu_fill(src, len, 9);
	memset(src, 0, len / 20);
	cr_assert_gt(segfile_encode(&m, src, len, frame, cap, 1), 0);
	cr_assert_eq(m.flags & SEGFILE_F_LZ4, 0);
	cr_assert_eq(m.stored_len, len);
	free(src);
	free(frame);
}

/* Every single-bit flip anywhere in header or payload is detected. */
Test(segfile, every_bit_flip_detected)
{
	size_t len = 300;
	uint8_t src[300], out[300];
	uint8_t *frame = aligned_alloc(4096, segfile_bound(len));
	struct segfile_meta m = meta();
	int64_t fl;

	tu_fill(src, len, 1);
	fl = segfile_encode(&m, src, len, frame, segfile_bound(len), 0);
	cr_assert_gt(fl, 0);
	for (size_t byte = 0; byte < SEGFILE_HDR_SIZE + len; byte++) {
		for (int bit = 0; bit < 8; bit += 3) {
			frame[byte] ^= (uint8_t)(1u << bit);
			int64_t r = segfile_decode(frame, (size_t)fl, NULL,
						   out, sizeof out);
			cr_assert(r == -MKV_ECORRUPT || r == -ENOSPC,
				  "flip at %zu.%d gave %lld", byte, bit,
				  (long long)r);
			frame[byte] ^= (uint8_t)(1u << bit);
		}
	}
	cr_assert_eq(segfile_decode(frame, (size_t)fl, NULL, out, sizeof out),
		     (int64_t)len);
	free(frame);
}

Test(segfile, lz4_payload_corruption_detected)
{
	size_t len = 50000, cap = segfile_bound(len);
	uint8_t *src = malloc(len), *frame = aligned_alloc(4096, cap),
		*out = malloc(len);
	struct segfile_meta m = meta();
	int64_t fl;

	tu_fill_compressible(src, len, 2);
	fl = segfile_encode(&m, src, len, frame, cap, 1);
	cr_assert(m.flags & SEGFILE_F_LZ4);
	frame[SEGFILE_HDR_SIZE + m.stored_len / 2] ^= 0x10;
	cr_assert_eq(segfile_decode(frame, (size_t)fl, NULL, out, len),
		     -MKV_ECORRUPT);
	free(src);
	free(frame);
	free(out);
}

Test(segfile, truncated_frame_is_corrupt)
{
	size_t len = 10000, cap = segfile_bound(len);
	uint8_t *src = malloc(len), *frame = aligned_alloc(4096, cap),
		*out = malloc(len);
	struct segfile_meta m = meta();
	int64_t fl;

	tu_fill(src, len, 4);
	fl = segfile_encode(&m, src, len, frame, cap, 0);
	cr_assert_gt(fl, 8192);
	cr_assert_eq(segfile_decode(frame, 8192, NULL, out, len),
		     -MKV_ECORRUPT);
	cr_assert_eq(segfile_decode(frame, 64, NULL, out, len), -MKV_ECORRUPT);
	cr_assert_eq(segfile_decode(frame, (size_t)fl, NULL, out, len - 1),
		     -ENOSPC);
	free(src);
	free(frame);
	free(out);
}

/* A payload hash handed to encode only saves a pass: right, wrong or
 * absent, the frame is byte for byte the same, and the hash out is the
 * payload's. */
Test(segfile, payload_hash_hint_changes_nothing)
{
	size_t len = 200000, cap = segfile_bound(len);
	uint8_t *src = malloc(len), *f[3];
	struct segfile_meta m[3];
	uint64_t want;
	int64_t fl[3];

	tu_fill(src, len, 11);
	want = XXH3_64bits(src, len);
	for (int i = 0; i < 3; i++) {
		f[i] = aligned_alloc(4096, cap);
		memset(f[i], 0xAB, cap);
		m[i] = meta();
		m[i].gen = 77;
		m[i].place = 8192;
		m[i].container = 3;
	}
	m[1].payload_hash = want;
	m[2].payload_hash = want ^ 1;
	for (int i = 0; i < 3; i++) {
		fl[i] = segfile_encode(&m[i], src, len, f[i], cap, 0);
		cr_assert_gt(fl[i], 0);
		cr_assert_eq(m[i].payload_hash, want, "case %d", i);
	}
	cr_assert_eq(fl[1], fl[0]);
	cr_assert_eq(fl[2], fl[0]);
	cr_assert_eq(memcmp(f[1], f[0], (size_t)fl[0]), 0);
	cr_assert_eq(memcmp(f[2], f[0], (size_t)fl[0]), 0);
	uint8_t *out = malloc(len);
	struct segfile_meta got;
	cr_assert_eq(segfile_decode(f[0], (size_t)fl[0], &got, out, len),
		     (int64_t)len);
	cr_assert_eq(memcmp(out, src, len), 0);
	cr_assert_eq(got.gen, 77);
	cr_assert_eq(got.place, 8192);
	cr_assert_eq(got.container, 3);
	for (int i = 0; i < 3; i++)
		free(f[i]);
	free(out);
	free(src);
}

Test(segfile, invalid_arguments)
{
	struct segfile_meta m = meta();
	uint8_t buf[8192], p[16] = {0};

	cr_assert_eq(segfile_encode(NULL, p, 16, buf, sizeof buf, 0), -EINVAL);
	cr_assert_eq(segfile_encode(&m, NULL, 16, buf, sizeof buf, 0), -EINVAL);
	cr_assert_eq(segfile_encode(&m, p, 0, buf, sizeof buf, 0), -EINVAL);
	cr_assert_eq(segfile_encode(&m, p, 16, buf, 100, 0), -ENOSPC);
	cr_assert_eq(segfile_decode(NULL, 10, NULL, buf, 10), -EINVAL);
	memset(buf, 0, sizeof buf);
	cr_assert_eq(segfile_parse_header(buf, sizeof buf, &m), -MKV_ECORRUPT);
}
