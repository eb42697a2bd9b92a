/* SPDX-License-Identifier: MIT */
/*
 * tiers/nvme.c — the bottom tier: one file per payload in a directory,
 * framed by io/segfile, written and read with O_DIRECT through io_uring.
 *
 * Durability of a put (the store drops the copy above only after this):
 *   1. the frame is written to "<name>.tmp" (O_CREAT|O_EXCL|O_DIRECT) and
 *      an fdatasync is chained behind the write in the same ring batch
 *      (IOSQE_IO_DRAIN): O_DIRECT bypasses the page cache but not the
 *      device's volatile write cache, the fdatasync flushes it;
 *   2. the file is renamed to "<name>.seg" and the directory is fsynced, so
 *      the name is durable too;
 *   3. the store then reads the payload back (O_DIRECT, from the device,
 *      checksummed by the frame) and compares its XXH3 with the one it
 *      computed before the copy, and only then drops the copy above.
 * A crash before 2 leaves a ".tmp" (scan removes it and reports
 * -EINPROGRESS); after 2 the ".seg" is complete and checksummed.
 *
 * Names: "<seq>-<layer>-<head>-<seg>-<kind>-<gen>.seg" in hex; gen is a
 * per-tier counter (restarted past the largest found by scan), so a key put
 * again never overwrites the file of an older copy still referenced.
 *
 * Partial reads (gather) of an uncompressed frame read only the 4 KiB-
 * aligned extents covering the ranges; they are not checksummed (the
 * checksum covers the whole frame; the whole-frame read-back at write time
 * and the device's own ECC cover them).  Frames stored with lz4 are read
 * whole and verified.
 */
#include "tiers/tier.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mosaickv/common.h>

#include "io/uring.h"

#define NVME_NAME_MAX 96
#define NVME_DEPTH 64
#define NVME_FALLBACK_BUF ((size_t)4 << 20)

struct nvme_obj {
	struct tier_obj base;
	uint32_t flags;      /* SEGFILE_F_* */
	uint64_t stored_len; /* payload bytes on disk */
	size_t frame_len;
	char name[NVME_NAME_MAX];
};

struct nvme_tier {
	struct tier base;
	int dirfd;
	int lz4;
	_Atomic uint64_t gen;
	pthread_mutex_t ring_lock; /* the fallback ring below */
	struct uring_engine *ring; /* for callers without their own */
};

static struct nvme_tier *nvme_of(struct tier *t)
{
	return container_of(t, struct nvme_tier, base);
}

/*
 * One operation's I/O context: the caller's ring (a worker's), or the
 * tier's fallback ring held under ring_lock for the whole operation; and a
 * bounce buffer, which is the ring's registered area when the frame fits
 * (READ_FIXED / WRITE_FIXED: no per-I/O page pinning), else an aligned
 * allocation.
 */
struct nvme_ctx {
	struct nvme_tier *n;
	struct uring_engine *ring;
	int locked;
	char *bounce;
	int bounce_owned;
};

static int nvme_begin(struct nvme_ctx *c, struct nvme_tier *n,
		      struct tier_io *io, size_t need)
{
	size_t alen = 0;
	char *area;

	c->n = n;
	c->locked = 0;
	if (io && io->ring) {
		c->ring = io->ring;
	} else {
		pthread_mutex_lock(&n->ring_lock);
		c->locked = 1;
		c->ring = n->ring;
	}
	area = uring_engine_buf(c->ring, &alen);
	c->bounce_owned = !(area && alen >= need);
	if (c->bounce_owned) {
		c->bounce = NULL;
		if (posix_memalign((void **)&c->bounce, SEGFILE_ALIGN,
				   need ? need : SEGFILE_ALIGN)) {
			if (c->locked)
				pthread_mutex_unlock(&n->ring_lock);
			return -ENOMEM;
		}
	} else {
		c->bounce = area;
	}
	return 0;
}

static void nvme_end(struct nvme_ctx *c)
{
	if (c->bounce_owned)
		free(c->bounce);
	if (c->locked)
		pthread_mutex_unlock(&c->n->ring_lock);
}

static void nvme_name(char *dst, const struct segfile_key *k, uint64_t gen,
		      const char *ext)
{
	snprintf(dst, NVME_NAME_MAX, "%016" PRIx64 "-%x-%x-%x-%x-%" PRIx64 "%s",
		 k->seq, k->layer, k->head, k->seg, k->kind, gen, ext);
}

static int nvme_put(struct tier *t, struct tier_io *io,
		    const struct tier_meta *m, const void *src,
		    struct tier_obj **out)
{
	struct nvme_tier *n = nvme_of(t);
	struct segfile_meta sm;
	struct nvme_obj *o;
	struct nvme_ctx c;
	char tmp[NVME_NAME_MAX];
	size_t bound;
	int64_t fl;
	int fd, rc;

	if (m->len > SEGFILE_MAX_PAYLOAD)
		return -EINVAL;
	bound = segfile_bound(m->len);
	o = calloc(1, sizeof *o);
	if (!o)
		return -ENOMEM;
	rc = nvme_begin(&c, n, io, bound);
	if (rc) {
		free(o);
		return rc;
	}
	memset(&sm, 0, sizeof sm);
	sm.key = m->key;
	memcpy(sm.shape, m->shape, sizeof sm.shape);
	fl = segfile_encode(&sm, src, m->len, c.bounce, bound, n->lz4);
	if (fl < 0) {
		rc = (int)fl;
		goto out_free;
	}
	if (!tier_charge(t, (size_t)fl)) {
		rc = -ENOSPC;
		goto out_free;
	}
	uint64_t gen = atomic_fetch_add(&n->gen, 1);

	nvme_name(tmp, &m->key, gen, ".tmp");
	nvme_name(o->name, &m->key, gen, ".seg");
	fd = openat(n->dirfd, tmp, O_CREAT | O_EXCL | O_WRONLY | O_DIRECT |
				   O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = -errno;
		goto out_uncharge;
	}
	struct uring_op ops[2] = {
		{ .fd = fd, .opcode = URING_OP_WRITE, .buf = c.bounce,
		  .len = (size_t)fl, .off = 0 },
		{ .fd = fd, .opcode = URING_OP_FDATASYNC },
	};
	rc = uring_engine_run(c.ring, ops, 2);
	close(fd);
	if (rc)
		goto out_unlink;
	if (renameat(n->dirfd, tmp, n->dirfd, o->name)) {
		rc = -errno;
		goto out_unlink;
	}
	if (fsync(n->dirfd)) {
		rc = -errno;
		unlinkat(n->dirfd, o->name, 0);
		goto out_uncharge;
	}
	nvme_end(&c);
	o->base.meta = *m;
	o->base.footprint = (size_t)fl;
	o->flags = sm.flags;
	o->stored_len = sm.stored_len;
	o->frame_len = (size_t)fl;
	*out = &o->base;
	return 0;

out_unlink:
	unlinkat(n->dirfd, tmp, 0);
out_uncharge:
	tier_uncharge(t, (size_t)fl);
out_free:
	nvme_end(&c);
	free(o);
	return rc;
}

/*
 * Batched put: frames encoded into slices of one bounce (the ring's
 * registered area when they fit), then "write_i -> fdatasync_i" chains for
 * every file in one ring run (queue depth = 2n), then the renames and one
 * directory fsync for all.  Same durability as nvme_put, per item.
 */
static int nvme_putv(struct tier *t, struct tier_io *io,
		     const struct tier_meta *m, const void *const *src,
		     unsigned n, struct tier_obj **out, int *rcs)
{
	struct nvme_tier *nv = nvme_of(t);
	struct nvme_obj **o = calloc(n ? n : 1, sizeof *o);
	struct uring_op *ops = calloc(2 * (size_t)(n ? n : 1), sizeof *ops);
	size_t *off = calloc(n ? n : 1, sizeof *off), total = 0;
	int64_t *fl = calloc(n ? n : 1, sizeof *fl);
	int *fds = calloc(n ? n : 1, sizeof *fds);
	struct nvme_ctx c;
	unsigned nops = 0;
	int first = 0, rc;

	if (!o || !ops || !off || !fl || !fds) {
		rc = -ENOMEM;
		for (unsigned i = 0; i < n; i++)
			rcs[i] = rc;
		first = n ? rc : 0;
		goto out;
	}
	for (unsigned i = 0; i < n; i++) {
		off[i] = total;
		total += m[i].len > SEGFILE_MAX_PAYLOAD ? 0 : segfile_bound(m[i].len);
		fds[i] = -1;
	}
	rc = nvme_begin(&c, nv, io, total);
	if (rc) {
		for (unsigned i = 0; i < n; i++)
			rcs[i] = rc;
		first = n ? rc : 0;
		goto out;
	}
	for (unsigned i = 0; i < n; i++) {
		struct segfile_meta sm;
		char tmp[NVME_NAME_MAX];

		rcs[i] = 0;
		if (m[i].len > SEGFILE_MAX_PAYLOAD) {
			rcs[i] = -EINVAL;
			continue;
		}
		o[i] = calloc(1, sizeof *o[i]);
		if (!o[i]) {
			rcs[i] = -ENOMEM;
			continue;
		}
		memset(&sm, 0, sizeof sm);
		sm.key = m[i].key;
		memcpy(sm.shape, m[i].shape, sizeof sm.shape);
		fl[i] = segfile_encode(&sm, src[i], m[i].len, c.bounce + off[i],
				       segfile_bound(m[i].len), nv->lz4);
		if (fl[i] < 0) {
			rcs[i] = (int)fl[i];
			continue;
		}
		if (!tier_charge(t, (size_t)fl[i])) {
			rcs[i] = -ENOSPC;
			fl[i] = -1;
			continue;
		}
		uint64_t gen = atomic_fetch_add(&nv->gen, 1);

		nvme_name(tmp, &m[i].key, gen, ".tmp");
		nvme_name(o[i]->name, &m[i].key, gen, ".seg");
		fds[i] = openat(nv->dirfd, tmp, O_CREAT | O_EXCL | O_WRONLY |
						O_DIRECT | O_CLOEXEC, 0600);
		if (fds[i] < 0) {
			rcs[i] = -errno;
			tier_uncharge(t, (size_t)fl[i]);
			fl[i] = -1;
			continue;
		}
		o[i]->base.meta = m[i];
		o[i]->base.footprint = (size_t)fl[i];
		o[i]->flags = sm.flags;
		o[i]->stored_len = sm.stored_len;
		o[i]->frame_len = (size_t)fl[i];
		ops[nops++] = (struct uring_op){ .fd = fds[i],
			.opcode = URING_OP_WRITE, .flags = URING_OP_F_LINK,
			.buf = c.bounce + off[i], .len = (size_t)fl[i] };
		ops[nops++] = (struct uring_op){ .fd = fds[i],
			.opcode = URING_OP_FDATASYNC };
	}
	if (nops)
		uring_engine_run(c.ring, ops, nops); /* per-op results below */
	nvme_end(&c);
	{
		unsigned k = 0, renamed = 0;

		for (unsigned i = 0; i < n; i++) {
			char tmp[NVME_NAME_MAX];

			if (fds[i] < 0)
				continue;
			close(fds[i]);
			/* ops[k], ops[k+1]: this file's write and sync */
			if (ops[k].res != (int64_t)ops[k].len)
				rcs[i] = ops[k].res < 0 ? (int)ops[k].res : -EIO;
			else if (ops[k + 1].res < 0)
				rcs[i] = (int)ops[k + 1].res;
			k += 2;
			snprintf(tmp, sizeof tmp, "%.*s.tmp",
				 (int)(strlen(o[i]->name) - 4), o[i]->name);
			if (!rcs[i] && renameat(nv->dirfd, tmp, nv->dirfd,
						o[i]->name))
				rcs[i] = -errno;
			if (rcs[i]) {
				unlinkat(nv->dirfd, tmp, 0);
				tier_uncharge(t, (size_t)fl[i]);
				fl[i] = -1;
			} else {
				renamed++;
			}
		}
		if (renamed && fsync(nv->dirfd)) {
			int e = -errno;

			for (unsigned i = 0; i < n; i++) {
				if (rcs[i] || fl[i] < 0)
					continue;
				unlinkat(nv->dirfd, o[i]->name, 0);
				tier_uncharge(t, (size_t)fl[i]);
				rcs[i] = e;
			}
		}
	}
	for (unsigned i = 0; i < n; i++) {
		if (rcs[i]) {
			free(o[i]);
			out[i] = NULL;
			if (!first)
				first = rcs[i];
		} else {
			out[i] = &o[i]->base;
		}
	}
out:
	free(o);
	free(ops);
	free(off);
	free(fl);
	free(fds);
	return first;
}

/* Batched get: every frame read in one ring run, then each decoded and
 * verified. */
static int nvme_getv(struct tier *t, struct tier_io *io, struct tier_obj **o,
		     void **dst, const size_t *cap, unsigned n, int64_t *res)
{
	struct nvme_tier *nv = nvme_of(t);
	struct uring_op *ops = calloc(n ? n : 1, sizeof *ops);
	size_t *off = calloc(n ? n : 1, sizeof *off), total = 0;
	int *fds = calloc(n ? n : 1, sizeof *fds);
	struct nvme_ctx c;
	unsigned nops = 0;
	int first = 0, rc;

	if (!ops || !off || !fds) {
		rc = -ENOMEM;
		goto fail_all;
	}
	for (unsigned i = 0; i < n; i++) {
		struct nvme_obj *no = container_of(o[i], struct nvme_obj, base);

		off[i] = total;
		total += no->frame_len;
		fds[i] = -1;
	}
	rc = nvme_begin(&c, nv, io, total);
	if (rc)
		goto fail_all;
	for (unsigned i = 0; i < n; i++) {
		struct nvme_obj *no = container_of(o[i], struct nvme_obj, base);

		res[i] = 0;
		if (cap[i] < o[i]->meta.len) {
			res[i] = -ENOSPC;
			continue;
		}
		fds[i] = openat(nv->dirfd, no->name, O_RDONLY | O_DIRECT |
							   O_CLOEXEC);
		if (fds[i] < 0) {
			res[i] = -errno;
			continue;
		}
		ops[nops++] = (struct uring_op){ .fd = fds[i],
			.opcode = URING_OP_READ, .buf = c.bounce + off[i],
			.len = no->frame_len };
	}
	if (nops)
		uring_engine_run(c.ring, ops, nops);
	for (unsigned i = 0, k = 0; i < n; i++) {
		struct nvme_obj *no = container_of(o[i], struct nvme_obj, base);
		struct segfile_meta sm;

		if (fds[i] < 0)
			continue;
		close(fds[i]);
		if (ops[k].res != (int64_t)ops[k].len) {
			res[i] = ops[k].res < 0 ? ops[k].res : -EIO;
		} else {
			res[i] = segfile_decode(c.bounce + off[i], no->frame_len,
						&sm, dst[i], cap[i]);
			if (res[i] >= 0 &&
			    memcmp(&sm.key, &o[i]->meta.key, sizeof sm.key))
				res[i] = -MKV_ECORRUPT;
		}
		k++;
	}
	nvme_end(&c);
	for (unsigned i = 0; i < n; i++)
		if (res[i] < 0 && !first)
			first = (int)res[i];
	free(ops);
	free(off);
	free(fds);
	return first;
fail_all:
	for (unsigned i = 0; i < n; i++)
		res[i] = rc;
	free(ops);
	free(off);
	free(fds);
	return n ? rc : 0;
}

/*
 * Read and verify the whole frame @name (@frame_len bytes) and unpack its
 * payload into @dst (@cap bytes).  Returns the payload length or -errno;
 * *@sm receives the header.
 */
static int64_t nvme_read_payload(struct nvme_tier *n, struct tier_io *io,
				 const char *name, size_t frame_len,
				 struct segfile_meta *sm, void *dst, size_t cap,
				 void **alloc_out)
{
	struct nvme_ctx c;
	int fd;
	int64_t rc;

	fd = openat(n->dirfd, name, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	rc = nvme_begin(&c, n, io, frame_len);
	if (rc) {
		close(fd);
		return rc;
	}
	struct uring_op op = { .fd = fd, .opcode = URING_OP_READ,
			       .buf = c.bounce, .len = frame_len, .off = 0 };
	rc = uring_engine_run(c.ring, &op, 1);
	close(fd);
	if (rc == 0) {
		rc = segfile_parse_header(c.bounce, frame_len, sm);
		if (rc == 0 && segfile_frame_len(sm) != frame_len)
			rc = -MKV_ECORRUPT;
		if (rc == 0 && !dst && alloc_out) {
			/* scan: size the output from the header */
			dst = malloc(sm->raw_len);
			cap = sm->raw_len;
			*alloc_out = dst;
			if (!dst)
				rc = -ENOMEM;
		}
		if (rc == 0 && !dst)
			rc = -EINVAL;
		if (rc == 0)
			rc = segfile_decode(c.bounce, frame_len, sm, dst, cap);
	}
	nvme_end(&c);
	return rc;
}

static int64_t nvme_get(struct tier *t, struct tier_io *io, struct tier_obj *o,
			void *dst, size_t cap)
{
	struct nvme_obj *no = container_of(o, struct nvme_obj, base);
	struct segfile_meta sm;
	int64_t rc;

	if (cap < o->meta.len)
		return -ENOSPC;
	rc = nvme_read_payload(nvme_of(t), io, no->name, no->frame_len, &sm,
			       dst, cap, NULL);
	if (rc >= 0 && memcmp(&sm.key, &o->meta.key, sizeof sm.key) != 0)
		rc = -MKV_ECORRUPT; /* a frame of another segment */
	return rc;
}

/* One aligned extent of a file to read, and where it lands. */
struct nvme_ext {
	int fd;
	uint64_t off, len, pos;
};

/*
 * Gather ranges of several objects in ONE ring batch: aligned extents
 * covering each object's ranges (neighbours merged), read into a bounce
 * buffer, then copied out back to back in request order.  lz4 frames are
 * read whole and verified instead (their ranges do not map to file
 * offsets).
 */
static int64_t nvme_gatherv(struct tier *t, struct tier_io *io,
			    const struct tier_gather_req *rq, unsigned nrq,
			    void *dst)
{
	struct nvme_tier *n = nvme_of(t);
	struct nvme_ext *ext = NULL;
	struct uring_op *ops = NULL;
	unsigned *first = NULL, *rext = NULL, ne = 0, nr = 0, ri = 0;
	int *fds = NULL;
	uint64_t total = 0;
	char *d = dst;
	int64_t rc = 0;
	struct nvme_ctx c;

	for (unsigned i = 0; i < nrq; i++)
		nr += rq[i].n;
	ext = calloc(nr ? nr : 1, sizeof *ext);
	first = calloc(nrq ? nrq : 1, sizeof *first); /* first extent of req */
	fds = calloc(nrq ? nrq : 1, sizeof *fds);
	rext = calloc(nr ? nr : 1, sizeof *rext); /* range -> its extent */
	if (!ext || !first || !fds || !rext) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned i = 0; i < nrq; i++)
		fds[i] = -1;
	for (unsigned i = 0; i < nrq; i++) {
		struct nvme_obj *no = container_of(rq[i].obj, struct nvme_obj,
						   base);

		first[i] = ne;
		if (no->flags & SEGFILE_F_LZ4) {
			ri += rq[i].n;
			continue;
		}
		fds[i] = openat(n->dirfd, no->name,
				O_RDONLY | O_DIRECT | O_CLOEXEC);
		if (fds[i] < 0) {
			rc = -errno;
			goto out;
		}
		for (unsigned k = 0; k < rq[i].n; k++) {
			const struct tier_range *r = &rq[i].r[k];
			uint64_t a = (SEGFILE_HDR_SIZE + r->off) &
				     ~(uint64_t)(SEGFILE_ALIGN - 1);
			uint64_t b = segfile_align_up(SEGFILE_HDR_SIZE + r->off +
						      r->len);
			struct nvme_ext *e = ne > first[i] ? &ext[ne - 1] : NULL;

			if (e && a >= e->off && a <= e->off + e->len) {
				if (b > e->off + e->len) {
					total += b - (e->off + e->len);
					e->len = b - e->off;
				}
			} else {
				ext[ne++] = (struct nvme_ext){ fds[i], a, b - a,
							       0 };
				total += b - a;
			}
			rext[ri++] = ne - 1;
		}
	}
	rc = nvme_begin(&c, n, io, total);
	if (rc)
		goto out;
	ops = calloc(ne ? ne : 1, sizeof *ops);
	if (!ops) {
		nvme_end(&c);
		rc = -ENOMEM;
		goto out;
	}
	{
		uint64_t pos = 0;

		for (unsigned e = 0; e < ne; e++) {
			ext[e].pos = pos;
			ops[e] = (struct uring_op){ .fd = ext[e].fd,
				.opcode = URING_OP_READ, .buf = c.bounce + pos,
				.len = ext[e].len, .off = ext[e].off };
			pos += ext[e].len;
		}
	}
	rc = uring_engine_run(c.ring, ops, ne);
	/* Copy out the uncompressed requests at their output positions. */
	ri = 0;
	for (unsigned i = 0; rc == 0 && i < nrq; i++) {
		struct nvme_obj *no = container_of(rq[i].obj, struct nvme_obj,
						   base);

		for (unsigned k = 0; k < rq[i].n; k++, ri++) {
			const struct tier_range *r = &rq[i].r[k];
			uint64_t fo = SEGFILE_HDR_SIZE + r->off;
			const struct nvme_ext *e = &ext[rext[ri]];

			if (!(no->flags & SEGFILE_F_LZ4))
				memcpy(d, c.bounce + e->pos + (fo - e->off),
				       r->len);
			d += r->len;
		}
	}
	nvme_end(&c); /* the bounce may be the ring's area: free it now */
	/* lz4 frames: read whole and verified, then their ranges. */
	d = dst;
	for (unsigned i = 0; rc == 0 && i < nrq; i++) {
		struct nvme_obj *no = container_of(rq[i].obj, struct nvme_obj,
						   base);
		struct segfile_meta sm;
		char *tmp;
		int64_t r;

		if (!(no->flags & SEGFILE_F_LZ4)) {
			for (unsigned k = 0; k < rq[i].n; k++)
				d += rq[i].r[k].len;
			continue;
		}
		tmp = malloc(no->base.meta.len);
		if (!tmp) {
			rc = -ENOMEM;
			break;
		}
		r = nvme_read_payload(n, io, no->name, no->frame_len, &sm, tmp,
				      no->base.meta.len, NULL);
		if (r >= 0 && (uint64_t)r != no->base.meta.len)
			r = -EIO;
		for (unsigned k = 0; r >= 0 && k < rq[i].n; k++) {
			memcpy(d, tmp + rq[i].r[k].off, rq[i].r[k].len);
			d += rq[i].r[k].len;
		}
		free(tmp);
		if (r < 0)
			rc = r;
	}
	if (rc == 0)
		rc = d - (char *)dst;
out:
	for (unsigned i = 0; fds && i < nrq; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(ops);
	free(ext);
	free(first);
	free(fds);
	free(rext);
	return rc;
}

static int64_t nvme_gather(struct tier *t, struct tier_io *io,
			   struct tier_obj *o, const struct tier_range *r,
			   unsigned cnt, void *dst)
{
	struct tier_gather_req rq = { .obj = o, .r = r, .n = cnt };

	return nvme_gatherv(t, io, &rq, 1, dst);
}

static void nvme_drop(struct tier *t, struct tier_io *io, struct tier_obj *o)
{
	struct nvme_obj *no = container_of(o, struct nvme_obj, base);

	(void)io;
	unlinkat(nvme_of(t)->dirfd, no->name, 0);
	tier_uncharge(t, o->footprint);
	free(no);
}

static void nvme_forget(struct tier *t, struct tier_obj *o)
{
	tier_uncharge(t, o->footprint);
	free(container_of(o, struct nvme_obj, base));
}

static int nvme_parse_name(const char *name, struct segfile_key *k,
			   uint64_t *gen, const char **ext)
{
	unsigned layer, head, seg, kind;
	uint64_t seq;
	int used = 0;

	if (sscanf(name, "%16" SCNx64 "-%x-%x-%x-%x-%" SCNx64 "%n", &seq,
		   &layer, &head, &seg, &kind, gen, &used) != 6)
		return -1;
	k->seq = seq;
	k->layer = layer;
	k->head = head;
	k->seg = seg;
	k->kind = kind;
	*ext = name + used;
	return 0;
}

static int nvme_scan(struct tier *t, struct tier_io *io, tier_scan_cb cb,
		     void *arg)
{
	struct nvme_tier *n = nvme_of(t);
	int dfd = dup(n->dirfd);
	DIR *d;
	struct dirent *de;
	int adopted = 0;

	if (dfd < 0)
		return -errno;
	d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return -errno;
	}
	rewinddir(d);
	while ((de = readdir(d))) {
		struct segfile_key k;
		struct segfile_meta sm;
		struct tier_meta tm;
		const char *ext;
		uint64_t gen;
		struct stat stt;
		void *raw = NULL;
		int64_t rc;

		if (de->d_name[0] == '.' ||
		    nvme_parse_name(de->d_name, &k, &gen, &ext))
			continue;
		if (gen + 1 > atomic_load(&n->gen))
			atomic_store(&n->gen, gen + 1);
		if (strcmp(ext, ".tmp") == 0) {
			/* An interrupted spill: never complete, remove it. */
			unlinkat(n->dirfd, de->d_name, 0);
			cb(arg, -EINPROGRESS, de->d_name, NULL, NULL);
			continue;
		}
		if (strcmp(ext, ".seg") != 0 || strlen(de->d_name) >= NVME_NAME_MAX)
			continue;
		memset(&tm, 0, sizeof tm);
		if (fstatat(n->dirfd, de->d_name, &stt, 0) || stt.st_size <= 0 ||
		    (size_t)stt.st_size % SEGFILE_ALIGN) {
			cb(arg, -MKV_ECORRUPT, de->d_name, NULL, NULL);
			continue;
		}
		rc = nvme_read_payload(n, io, de->d_name, (size_t)stt.st_size,
				       &sm, NULL, 0, &raw);
		if (rc >= 0 && memcmp(&sm.key, &k, sizeof k) != 0)
			rc = -MKV_ECORRUPT;
		free(raw);
		if (rc < 0) {
			cb(arg, rc == -ENOMEM ? -ENOMEM : -MKV_ECORRUPT,
			   de->d_name, NULL, NULL);
			continue;
		}
		struct nvme_obj *o = calloc(1, sizeof *o);

		if (!o) {
			cb(arg, -ENOMEM, de->d_name, NULL, NULL);
			continue;
		}
		tm.key = sm.key;
		memcpy(tm.shape, sm.shape, sizeof tm.shape);
		tm.len = sm.raw_len;
		tm.hash = sm.payload_hash;
		o->base.meta = tm;
		o->base.footprint = (size_t)stt.st_size;
		o->flags = sm.flags;
		o->stored_len = sm.stored_len;
		o->frame_len = (size_t)stt.st_size;
		snprintf(o->name, sizeof o->name, "%s", de->d_name);
		/* Found data is charged even past capacity: it exists. */
		atomic_fetch_add(&t->used, o->base.footprint);
		if (cb(arg, 0, de->d_name, &tm, &o->base) == 0) {
			adopted++;
		} else {
			tier_uncharge(t, o->base.footprint);
			free(o);
		}
	}
	closedir(d);
	return adopted;
}

static void nvme_destroy(struct tier *t)
{
	struct nvme_tier *n = nvme_of(t);

	uring_engine_destroy(n->ring);
	if (n->dirfd >= 0)
		close(n->dirfd);
	pthread_mutex_destroy(&n->ring_lock);
	free(n);
}

static const struct tier_ops nvme_ops = {
	.name = "nvme",
	.put = nvme_put,
	.putv = nvme_putv,
	.get = nvme_get,
	.getv = nvme_getv,
	.gather = nvme_gather,
	.gatherv = nvme_gatherv,
	.addr = NULL, /* not addressable */
	.drop = nvme_drop,
	.forget = nvme_forget,
	.scan = nvme_scan,
	.destroy = nvme_destroy,
};

int nvme_tier_create(const char *dir, size_t capacity, int lz4,
		     struct tier **out)
{
	struct nvme_tier *n;
	int rc;

	if (!dir || !*dir || !out || capacity == 0)
		return -EINVAL;
	if (mkdir(dir, 0700) && errno != EEXIST)
		return -errno;
	n = calloc(1, sizeof *n);
	if (!n)
		return -ENOMEM;
	tier_init(&n->base, &nvme_ops, capacity);
	n->base.persistent = 1;
	n->lz4 = !!lz4;
	atomic_init(&n->gen, 1);
	pthread_mutex_init(&n->ring_lock, NULL);
	n->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (n->dirfd < 0) {
		rc = -errno;
		nvme_destroy(&n->base);
		return rc;
	}
	/* The fallback ring gets a registered bounce area when the memlock
	 * limit allows; without one it still works, unregistered. */
	rc = uring_engine_create(NVME_DEPTH, NVME_FALLBACK_BUF, &n->ring);
	if (rc == -ENOMEM || rc == -EPERM || rc == -EFAULT)
		rc = uring_engine_create(NVME_DEPTH, 0, &n->ring);
	if (rc) {
		nvme_destroy(&n->base);
		return rc;
	}
	*out = &n->base;
	return 0;
}
