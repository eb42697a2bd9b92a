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

static uint64_t frame_checksum(const uint8_t *hdr, const uint8_t *stored,
			       size_t stored_len)
{
	uint8_t h[SEGFILE_HDR_SIZE];
	XXH3_state_t st;

	memcpy(h, hdr, sizeof h);
	memset(h + OFF_CSUM, 0, 8);
	XXH3_INITSTATE(&st);
	XXH3_64bits_reset(&st);
	XXH3_64bits_update(&st, h, sizeof h);
	XXH3_64bits_update(&st, stored, stored_len);
	return XXH3_64bits_digest(&st);
}

int64_t segfile_encode(struct segfile_meta *m, const void *payload, size_t len,
		       void *dst, size_t cap, int try_lz4)
{
	uint8_t *d = dst, *stored;
	size_t stored_len = len, framed;
	uint32_t flags = 0;

	if (!m || !payload || !dst || len == 0 || len > SEGFILE_MAX_PAYLOAD)
		return -EINVAL;
	if (cap < segfile_bound(len))
		return -ENOSPC;
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
	if (!(flags & SEGFILE_F_LZ4))
		memcpy(stored, payload, len);
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
	m->payload_hash = XXH3_64bits(payload, len);
	put64(d + 88, m->payload_hash);
	put64(d + OFF_CSUM, frame_checksum(d, stored, stored_len));

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
