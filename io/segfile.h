/* SPDX-License-Identifier: MIT */
/*
 * io/segfile — the on-disk framing of one stored segment.
 *
 * A frame is a fixed 128-byte little-endian header followed by the stored
 * payload, zero-padded to SEGFILE_ALIGN so it can be written with O_DIRECT:
 *
 *   off  size  field
 *     0     8  magic "MKVSEGF\0"
 *     8     2  format version (SEGFILE_VERSION)
 *    10     2  header size (128)
 *    12     4  flags (SEGFILE_F_LZ4: payload is one lz4 block)
 *    16     8  key: sequence
 *    24    16  key: layer, head, segment, kind (u32 each)
 *    40    32  shape: 8 × u32, opaque to io/ (the store keeps n, b,
 *              n_blocks, strategy ... there)
 *    72     8  raw payload length (after decompression)
 *    80     8  stored payload length (on disk, after the header)
 *    88     8  XXH3-64 of the raw payload (what the writer was handed)
 *    96     8  generation: the writer's sequence number (0: none)
 *   104     8  place: byte offset of the frame in its container file
 *   112     4  container: which file (the NVMe tier's slab number)
 *   116     4  reserved, zero
 *   120     8  XXH3-64 over the header (this field zeroed) and the stored
 *              payload
 *
 * Generation, place and container were reserved (zero) bytes before the
 * NVMe tier packed frames into slab files; a frame that does not use them
 * keeps them zero, so the version did not change.  They let a reader that
 * scans a container tell a frame written at this very place from the image
 * of one found elsewhere (inside another frame's payload, say), and order
 * two frames of one key.
 *
 * io/ knows bytes only: the payload is opaque (the store puts a serialized
 * segment there).  lz4 is used only where it saves at least 10% — the
 * compressor is given a destination of 90% of the input, so anything that
 * does not fit is stored raw.
 */
#ifndef MKV_IO_SEGFILE_H
#define MKV_IO_SEGFILE_H

#include <stddef.h>
#include <stdint.h>

#define SEGFILE_MAGIC "MKVSEGF"   /* 7 chars + NUL = 8 bytes */
#define SEGFILE_VERSION 1
#define SEGFILE_HDR_SIZE 128
#define SEGFILE_ALIGN 4096
#define SEGFILE_F_LZ4 0x1u
#define SEGFILE_SHAPE_WORDS 8
/* Largest raw payload accepted (lz4 block limit and a sanity bound). */
#define SEGFILE_MAX_PAYLOAD ((size_t)0x7E000000)

struct segfile_key {
	uint64_t seq;
	uint32_t layer, head, seg, kind;
};

struct segfile_meta {
	struct segfile_key key;
	uint32_t shape[SEGFILE_SHAPE_WORDS];
	uint64_t gen;          /* into encode, out of decode: generation */
	uint64_t place;        /* into encode, out of decode: offset in file */
	uint32_t container;    /* into encode, out of decode: file number */
	uint32_t flags;        /* out of encode / decode: SEGFILE_F_* */
	uint64_t raw_len;      /* out of encode / decode */
	uint64_t stored_len;   /* out of encode / decode */
	/* out of encode / decode: XXH3-64 of raw.  Into encode: that hash
	 * if the caller already knows it, else 0 (encode then needs one more
	 * pass over the payload; a wrong value is detected and replaced). */
	uint64_t payload_hash;
};

static inline size_t segfile_align_up(size_t x)
{
	return (x + SEGFILE_ALIGN - 1) & ~(size_t)(SEGFILE_ALIGN - 1);
}

/* Largest frame (aligned) that segfile_encode() can produce for @raw_len. */
static inline size_t segfile_bound(size_t raw_len)
{
	return segfile_align_up(SEGFILE_HDR_SIZE + raw_len);
}

/*
 * Frame @len bytes of @payload with @m's key, shape, generation, place and
 * container into @dst (@cap bytes, at least segfile_bound(len)).  @try_lz4: attempt compression.
 * Fills m->flags, raw_len, stored_len, payload_hash.  Returns the framed
 * length (a multiple of SEGFILE_ALIGN, padding zeroed), or -EINVAL (NULL,
 * len 0 or too large), -ENOSPC (cap too small).
 */
int64_t segfile_encode(struct segfile_meta *m, const void *payload, size_t len,
		       void *dst, size_t cap, int try_lz4);

/*
 * Parse and sanity-check a header (magic, version, sizes) from @len >= 128
 * bytes at @buf into *@m; the checksum is not verified.  Returns 0,
 * -EINVAL (NULL), -MKV_ECORRUPT.
 */
int segfile_parse_header(const void *buf, size_t len, struct segfile_meta *m);

/* Framed length on disk of a frame whose header says @m. */
static inline size_t segfile_frame_len(const struct segfile_meta *m)
{
	return segfile_align_up(SEGFILE_HDR_SIZE + (size_t)m->stored_len);
}

/*
 * Verify and unpack a whole frame of @len bytes at @buf: header checks,
 * the header+payload checksum, lz4 decompression and the raw payload hash.
 * Writes the raw payload to @out (@cap bytes, at least m->raw_len).
 * Returns the raw length, or -EINVAL (NULL), -MKV_ECORRUPT (any check
 * failed, including a frame shorter than its header says), -ENOSPC (@cap).
 * @m (may be NULL) receives the header.
 */
int64_t segfile_decode(const void *buf, size_t len, struct segfile_meta *m,
		       void *out, size_t cap);

#endif
