/* SPDX-License-Identifier: MIT */
#include "io/segfile.h"

#include <endian.h>
#include <errno.h>
#include <string.h>

#include <lz4.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include <mosaickv/common.h>

/* Explicit little-endian field access: the format is the same on any host. */
static void put16(uint8_t *p, uint16_t v) { v = htole16(v); memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { v = htole32(v); memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { v = htole64(v); memcpy(p, &v, 8); }
static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return le16toh(v); }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return le32toh(v); }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return le64toh(v); }

#define OFF_CSUM 120

/* Start the frame checksum: the header with its checksum field zeroed. */
static void frame_checksum_begin(XXH3_state_t *st, const uint8_t *hdr)
{
	uint8_t h[SEGFILE_HDR_SIZE];

	memcpy(h, hdr, sizeof h);
	memset(h + OFF_CSUM, 0, 8);
	XXH3_INITSTATE(st);
	XXH3_64bits_reset(st);
	XXH3_64bits_update(st, h, sizeof h);
}

static uint64_t frame_checksum(const uint8_t *hdr, const uint8_t *stored,
			       size_t stored_len)
{
	XXH3_state_t st;

	frame_checksum_begin(&st, hdr);
	XXH3_64bits_update(&st, stored, stored_len);
	return XXH3_64bits_digest(&st);
}

/*
 * Copy and hash in pieces that stay in cache, so a payload crosses memory
 * once instead of once per pass (streaming XXH3 gives the one-shot value).
 * @a (may be NULL) hashes the source, @b (may be NULL) the copy.
 */
#define CHUNK ((size_t)64 << 10)
static void copy_hashing(uint8_t *dst, const uint8_t *src, size_t len,
			 XXH3_state_t *a, XXH3_state_t *b)
{
	for (size_t o = 0; o < len; o += CHUNK) {
		size_t n = len - o < CHUNK ? len - o : CHUNK;

		if (a)
			XXH3_64bits_update(a, src + o, n);
		memcpy(dst + o, src + o, n);
		if (b)
			XXH3_64bits_update(b, dst + o, n);
	}
}

int64_t segfile_encode(struct segfile_meta *m, const void *payload, size_t len,
		       void *dst, size_t cap, int try_lz4)
{
	uint8_t *d = dst, *stored;
	size_t stored_len = len, framed;
	uint32_t flags = 0;
	uint64_t hint, csum;

	if (!m || !payload || !dst || len == 0 || len > SEGFILE_MAX_PAYLOAD)
		return -EINVAL;
	if (cap < segfile_bound(len))
		return -ENOSPC;
	hint = m->payload_hash;
	stored = d + SEGFILE_HDR_SIZE;
	if (try_lz4 && len >= 64) {
		/* Capacity 90% of the input: lz4 fails (returns 0) unless it
		 * saves at least 10%, which is exactly the acceptance rule. */
		int lim = (int)(len - len / 10);
		int c = LZ4_compress_default(payload, (char *)stored, (int)len,
					     lim);
		if (c > 0) {
			stored_len = (size_t)c;
			flags |= SEGFILE_F_LZ4;
		}
	}
	framed = segfile_align_up(SEGFILE_HDR_SIZE + stored_len);
	memset(stored + stored_len, 0, framed - SEGFILE_HDR_SIZE - stored_len);

	memset(d, 0, SEGFILE_HDR_SIZE);
	memcpy(d, SEGFILE_MAGIC, 8);
	put16(d + 8, SEGFILE_VERSION);
	put16(d + 10, SEGFILE_HDR_SIZE);
	put32(d + 12, flags);
	put64(d + 16, m->key.seq);
	put32(d + 24, m->key.layer);
	put32(d + 28, m->key.head);
	put32(d + 32, m->key.seg);
	put32(d + 36, m->key.kind);
	for (int i = 0; i < SEGFILE_SHAPE_WORDS; i++)
		put32(d + 40 + 4 * i, m->shape[i]);
	put64(d + 72, len);
	put64(d + 80, stored_len);
	put64(d + 96, m->gen);
	put64(d + 104, m->place);
	put32(d + 112, m->container);
	if (flags & SEGFILE_F_LZ4) {
		m->payload_hash = XXH3_64bits(payload, len);
		put64(d + 88, m->payload_hash);
		csum = frame_checksum(d, stored, stored_len);
	} else {
		/* The payload hash sits in the header the frame checksum
		 * starts with: when the caller knows it, copy, payload hash
		 * and frame checksum are one pass over cached pieces; the
		 * hash is still computed, and a wrong hint costs a second
		 * pass, never a wrong frame. */
		XXH3_state_t ph, fs;

		put64(d + 88, hint);
		frame_checksum_begin(&fs, d);
		XXH3_INITSTATE(&ph);
		XXH3_64bits_reset(&ph);
		copy_hashing(stored, payload, len, &ph, hint ? &fs : NULL);
		m->payload_hash = XXH3_64bits_digest(&ph);
		if (hint && m->payload_hash == hint) {
			csum = XXH3_64bits_digest(&fs);
		} else {
			put64(d + 88, m->payload_hash);
			csum = frame_checksum(d, stored, stored_len);
		}
	}
	put64(d + OFF_CSUM, csum);

	m->flags = flags;
	m->raw_len = len;
	m->stored_len = stored_len;
	return (int64_t)framed;
}

int segfile_parse_header(const void *buf, size_t len, struct segfile_meta *m)
{
	const uint8_t *d = buf;
	struct segfile_meta t;

	if (!buf || !m)
		return -EINVAL;
	if (len < SEGFILE_HDR_SIZE || memcmp(d, SEGFILE_MAGIC, 8) != 0 ||
	    get16(d + 8) != SEGFILE_VERSION ||
	    get16(d + 10) != SEGFILE_HDR_SIZE)
		return -MKV_ECORRUPT;
	memset(&t, 0, sizeof t);
	t.flags = get32(d + 12);
	t.key.seq = get64(d + 16);
	t.key.layer = get32(d + 24);
	t.key.head = get32(d + 28);
	t.key.seg = get32(d + 32);
	t.key.kind = get32(d + 36);
	for (int i = 0; i < SEGFILE_SHAPE_WORDS; i++)
		t.shape[i] = get32(d + 40 + 4 * i);
	t.raw_len = get64(d + 72);
	t.stored_len = get64(d + 80);
	t.payload_hash = get64(d + 88);
	t.gen = get64(d + 96);
	t.place = get64(d + 104);
	t.container = get32(d + 112);
	if ((t.flags & ~SEGFILE_F_LZ4) != 0 || t.raw_len == 0 ||
	    t.raw_len > SEGFILE_MAX_PAYLOAD || t.stored_len == 0 ||
	    t.stored_len > t.raw_len ||
	    (!(t.flags & SEGFILE_F_LZ4) && t.stored_len != t.raw_len))
		return -MKV_ECORRUPT;
	*m = t;
	return 0;
}

int64_t segfile_decode(const void *buf, size_t len, struct segfile_meta *m,
		       void *out, size_t cap)
{
	const uint8_t *d = buf;
	struct segfile_meta t;
	int rc;

	if (!buf || !out)
		return -EINVAL;
	rc = segfile_parse_header(buf, len, &t);
	if (rc)
		return rc;
	if (len < SEGFILE_HDR_SIZE + t.stored_len)
		return -MKV_ECORRUPT;
	if (!(t.flags & SEGFILE_F_LZ4) && cap >= t.raw_len) {
		/* One pass: checksum, copy and payload hash per chunk.  @out
		 * is written before the verdict, as it is on any failure. */
		XXH3_state_t fs, ph;

		frame_checksum_begin(&fs, d);
		XXH3_INITSTATE(&ph);
		XXH3_64bits_reset(&ph);
		copy_hashing(out, d + SEGFILE_HDR_SIZE, t.raw_len, &fs, &ph);
		if (XXH3_64bits_digest(&fs) != get64(d + OFF_CSUM) ||
		    XXH3_64bits_digest(&ph) != t.payload_hash)
			return -MKV_ECORRUPT;
		if (m)
			*m = t;
		return (int64_t)t.raw_len;
	}
	if (frame_checksum(d, d + SEGFILE_HDR_SIZE, t.stored_len) !=
	    get64(d + OFF_CSUM))
		return -MKV_ECORRUPT;
	if (cap < t.raw_len)
		return -ENOSPC;
	if (t.flags & SEGFILE_F_LZ4) {
		int r = LZ4_decompress_safe((const char *)d + SEGFILE_HDR_SIZE,
					    out, (int)t.stored_len,
					    (int)t.raw_len);
		if (r < 0 || (uint64_t)r != t.raw_len)
			return -MKV_ECORRUPT;
	} else {
		memcpy(out, d + SEGFILE_HDR_SIZE, t.raw_len);
	}
	if (XXH3_64bits(out, t.raw_len) != t.payload_hash)
		return -MKV_ECORRUPT;
	if (m)
		*m = t;
	return (int64_t)t.raw_len;
}
