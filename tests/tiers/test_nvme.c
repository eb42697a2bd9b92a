/* SPDX-License-Identifier: MIT */
/*
 * tests/tiers/test_nvme.c — tiers/nvme.c on real files, O_DIRECT, io_uring:
 * frames packed into slab files, group commit, tombstones, reopen.
 *
 * Where a test looks at the disk it does so on its own: plain reads of the
 * slab files and io/segfile's header parser, not the tier's scan, so the
 * scan is checked against an independent reading of the same bytes.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <criterion/criterion.h>

#include <mosaickv/common.h>
#include "io/uring.h"
#include "tierutil.h"

/* Apart so that the skip returns from a void function under the TSan
 * stand-in for Criterion (the real one leaves the test from anywhere). */
static void skip_without_uring(int rc)
{
	if (rc == -ENOSYS || rc == -EPERM)
		cr_skip_test("io_uring unavailable (%d)", rc);
}

static struct tier *nvme2(const char *dir, size_t cap, int lz4, size_t slab)
{
	struct tier *t = NULL;
	int rc = nvme_tier_create2(dir, cap, lz4, slab, &t);

	skip_without_uring(rc);
	cr_assert_eq(rc, 0, "nvme_tier_create: %d", rc);
	return t;
}

static struct tier *nvme(const char *dir, size_t cap, int lz4)
{
	return nvme2(dir, cap, lz4, 0);
}

static struct nvme_tier_info info(const struct tier *t)
{
	struct nvme_tier_info i;

	cr_assert_eq(nvme_tier_get_info(t, &i), 0);
	return i;
}

static int count_files(const char *dir, const char *ext)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int n = 0;

	cr_assert(d);
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name), e = strlen(ext);
		if (l > e && strcmp(de->d_name + l - e, ext) == 0)
			n++;
	}
	closedir(d);
	return n;
}

static void slab_path(char *p, size_t cap, const char *dir, unsigned id)
{
	snprintf(p, cap, "%s/slab-%06u.mkv", dir, id);
}

/* A frame header found on disk by the tests' own walk. */
struct disk_frame {
	uint64_t off;
	struct segfile_meta m;
};

/*
 * Every 4 KiB block of slab @id that starts with a frame header naming
 * its own place, in order (at most @max kept, all counted).  O_DIRECT
 * reads of 1 MiB, so the walk leaves no page cache behind.
 */
static int disk_frames(const char *dir, unsigned id, struct disk_frame *f,
		       int max)
{
	enum { CH = 1 << 20 };
	char p[512];
	unsigned char *buf = aligned_alloc(4096, CH);
	int fd, n = 0;
	struct stat st;

	cr_assert(buf);
	slab_path(p, sizeof p, dir, id);
	fd = open(p, O_RDONLY | O_DIRECT);
	cr_assert_geq(fd, 0, "%s", p);
	cr_assert_eq(fstat(fd, &st), 0);
	for (off_t at = 0; at < st.st_size; at += CH) {
		size_t len = st.st_size - at < CH ? (size_t)(st.st_size - at) : CH;

		cr_assert_eq(pread(fd, buf, len, at), (ssize_t)len);
		for (size_t q = 0; q + 4096 <= len; q += 4096) {
			struct segfile_meta m;
			uint64_t off = (uint64_t)at + q;

			if (segfile_parse_header(buf + q, 4096, &m) ||
			    m.place != off || m.container != id)
				continue;
			if (n < max)
				f[n] = (struct disk_frame){ off, m };
			n++;
		}
	}
	close(fd);
	free(buf);
	return n;
}

/* Flip bit 5 of byte @at of slab @id, or zero @len bytes there. */
static void poke(const char *dir, unsigned id, off_t at, size_t zero_len)
{
	char p[512];
	int fd;

	slab_path(p, sizeof p, dir, id);
	fd = open(p, O_RDWR);
	cr_assert_geq(fd, 0);
	if (zero_len) {
		char *z = calloc(1, zero_len);
		cr_assert_eq(pwrite(fd, z, zero_len, at), (ssize_t)zero_len);
		free(z);
	} else {
		unsigned char c;
		cr_assert_eq(pread(fd, &c, 1, at), 1);
		c ^= 0x20;
		cr_assert_eq(pwrite(fd, &c, 1, at), 1);
	}
	cr_assert_eq(fsync(fd), 0);
	close(fd);
}

Test(nvme, roundtrip_raw_and_lz4)
{
	char dir[256];

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 30, 1);
	cr_assert_eq(t->persistent, 1);
	cr_assert_null(tier_addr(t, (struct tier_obj *)dir));
	size_t sizes[] = { 1000, 4096, 81937, 1 << 20 };
	for (unsigned i = 0; i < 4; i++) {
		tu_roundtrip(t, NULL, sizes[i], 0);
		tu_roundtrip(t, NULL, sizes[i], 1);
	}
	/* All dropped: one slab, all of it free again, nothing withheld. */
	struct nvme_tier_info i = info(t);
	cr_assert_eq(count_files(dir, ".mkv"), 1);
	cr_assert_eq(i.slabs, 1);
	cr_assert_eq(i.free_bytes, i.slab_bytes);
	cr_assert_eq(i.free_extents, 1);
	cr_assert_eq(i.quarantined, 0);
	cr_assert_eq(disk_frames(dir, 0, NULL, 0), 0); /* all tombstoned */
	tier_destroy(t);
	tu_rmtree(dir);
}

/* With a caller ring (a worker's), I/O goes through it. */
Test(nvme, uses_callers_ring)
{
	char dir[256];
	struct uring_engine *e;
	struct uring_engine_stats st;

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 30, 0);
	cr_assert_eq(uring_engine_create(32, 0, &e), 0);
	struct tier_io io = { .ring = e };
	tu_roundtrip(t, &io, 300000, 0);
	uring_engine_get_stats(e, &st);
	/* write, whole read, gather (3 merged-or-not extents), the drop's
	 * zero block; the group commit's fdatasync is a plain syscall */
	cr_assert_geq(st.ops, 4);
	cr_assert_geq(st.bytes_written, 300000);
	cr_assert_eq(st.fixed_ops, 0); /* no registered area */
	uring_engine_destroy(e);
	/* With a registered area, the frames go through it: fixed ops. */
	cr_assert_eq(uring_engine_create(32, 1 << 20, &e), 0);
	io.ring = e;
	tu_roundtrip(t, &io, 300000, 0);
	uring_engine_get_stats(e, &st);
	cr_assert_geq(st.fixed_ops, 3, "fixed ops %llu",
		      (unsigned long long)st.fixed_ops);
	cr_assert_eq(st.fixed_ops, st.ops);
	uring_engine_destroy(e);
	tier_destroy(t);
	tu_rmtree(dir);
}

/* gatherv reads ranges of several frames in one ring submission, raw and
 * lz4 frames mixed, output in request order. */
Test(nvme, gatherv_one_batch)
{
	char dir[256];
	enum { SZ = 200000, N = 4 };
	char *p[N];
	struct tier_obj *o[N];
	struct uring_engine *e;
	struct uring_engine_stats st0, st1;

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 30, 1);
	cr_assert_eq(uring_engine_create(64, 4 << 20, &e), 0);
	struct tier_io io = { .ring = e };
	for (int i = 0; i < N; i++) {
		p[i] = malloc(SZ);
		if (i == 2)
			tu_fill_compressible(p[i], SZ, 3); /* lz4 */
		else
			tu_fill(p[i], SZ, (uint64_t)i);
		struct tier_meta m = tu_meta(1, (uint32_t)i, p[i], SZ);
		cr_assert_eq(tier_put(t, &io, &m, p[i], &o[i]), 0);
	}
	struct tier_range r[N][3];
	struct tier_gather_req gr[N];
	uint64_t tot = 0;
	for (int i = 0; i < N; i++) {
		r[i][0] = (struct tier_range){ 5000 + (uint64_t)i * 100, 1088 };
		r[i][1] = (struct tier_range){ 100, 300 };
		r[i][2] = (struct tier_range){ SZ - 64, 64 };
		gr[i] = (struct tier_gather_req){ o[i], r[i], 3 };
		tot += 1088 + 300 + 64;
	}
	char *out = malloc(tot);
	uring_engine_get_stats(e, &st0);
	cr_assert_eq(tier_gatherv(t, &io, gr, N, out), (int64_t)tot);
	uring_engine_get_stats(e, &st1);
	char *d = out;
	for (int i = 0; i < N; i++)
		for (int k = 0; k < 3; k++) {
			cr_assert_eq(memcmp(d, p[i] + r[i][k].off, r[i][k].len), 0,
				     "obj %d range %d", i, k);
			d += r[i][k].len;
		}
	/* The three raw frames' extents went in one submission (plus one
	 * whole-frame read of the lz4 one). */
	cr_assert_leq(st1.submits - st0.submits, 2);
	for (int i = 0; i < N; i++) {
		tier_drop(t, &io, o[i]);
		free(p[i]);
	}
	free(out);
	uring_engine_destroy(e);
	tier_destroy(t);
	tu_rmtree(dir);
}

/* putv/getv: 40 segments written in one ring submission (they fit one
 * submission's worth) and one group commit, and read back in one; items
 * past the capacity fail alone. */
Test(nvme, putv_getv_batched)
{
	char dir[256];
	enum { N = 40, SZ = 30000 };
	char *p[N], *back[N];
	const void *src[N];
	size_t cap[N];
	struct tier_meta m[N];
	struct tier_obj *o[N];
	int rcs[N];
	int64_t res[N];
	struct uring_engine *e;
	struct uring_engine_stats st0, st1;

	tu_mkdtemp(dir, sizeof dir);
	/* room for 36 frames of 32 KiB */
	struct tier *t = nvme(dir, 36 * 32768, 0);
	cr_assert_eq(uring_engine_create(128, 4 << 20, &e), 0);
	struct tier_io io = { .ring = e };
	for (int i = 0; i < N; i++) {
		p[i] = malloc(SZ);
		back[i] = malloc(SZ);
		tu_fill(p[i], SZ, 1000 + (uint64_t)i);
		m[i] = tu_meta(5, (uint32_t)i, p[i], SZ);
		src[i] = p[i];
		cap[i] = SZ;
	}
	uring_engine_get_stats(e, &st0);
	cr_assert_eq(tier_putv(t, &io, m, src, N, o, rcs), -ENOSPC);
	uring_engine_get_stats(e, &st1);
	cr_assert_eq(st1.submits - st0.submits, 1, "one submission");
	cr_assert_eq(st1.fixed_ops - st0.fixed_ops, 36);
	int ok = 0;
	struct tier_obj *good[N];
	void *gdst[N];
	for (int i = 0; i < N; i++) {
		if (i < 36)
			cr_assert_eq(rcs[i], 0, "item %d: %d", i, rcs[i]);
		else
			cr_assert_eq(rcs[i], -ENOSPC);
		if (!rcs[i]) {
			good[ok] = o[i];
			gdst[ok] = back[i];
			ok++;
		}
	}
	struct nvme_tier_info ni = info(t);
	cr_assert_eq(ni.slabs, 1);
	cr_assert_eq(ni.slab_bytes, 36 * 32768);
	cr_assert_eq(ni.free_bytes, 0);
	cr_assert_eq(disk_frames(dir, 0, NULL, 0), 36);
	uring_engine_get_stats(e, &st0);
	cr_assert_eq(tier_getv(t, &io, good, gdst, cap, (unsigned)ok, res), 0);
	uring_engine_get_stats(e, &st1);
	cr_assert_eq(st1.submits - st0.submits, 1);
	for (int i = 0; i < ok; i++) {
		cr_assert_eq(res[i], SZ);
		cr_assert_eq(memcmp(back[i], p[i], SZ), 0);
		tier_drop(t, &io, good[i]);
	}
	cr_assert_eq(tier_used(t), 0);
	for (int i = 0; i < N; i++) {
		free(p[i]);
		free(back[i]);
	}
	uring_engine_destroy(e);
	tier_destroy(t);
	tu_rmtree(dir);
}

/* A batched get through ring @e: asserts its return is @want_rc and
 * returns the read ops it issued. */
static uint64_t getv_ops(struct tier *t, struct uring_engine *e, struct tier_obj **o,
			 void **dst, const size_t *cap, unsigned n, int64_t *res, int want_rc)
{
	struct tier_io io = { .ring = e };
	struct uring_engine_stats st0, st1;

	uring_engine_get_stats(e, &st0);
	cr_assert_eq(tier_getv(t, &io, o, dst, cap, n, res), want_rc);
	uring_engine_get_stats(e, &st1);
	cr_assert_eq(st1.retries - st0.retries, 0);
	return st1.ops - st0.ops;
}

/*
 * A batched get reads frames that lie next to each other on disk with one
 * op (up to 4 MiB), in any order asked: the op count is what the frames'
 * places say, each frame lands in its own buffer, a corrupt frame inside a
 * merged run fails alone, and an item refused for its capacity splits the
 * run without touching its buffer.
 */
Test(nvme, getv_merges_adjacent_frames)
{
	char dir[256];
	enum { N = 24 };
	char *p[N], *back[N];
	const void *src[N];
	size_t len[N], cap[N];
	struct tier_meta m[N];
	struct tier_obj *o[N], *ask[N];
	void *dst[N];
	int rcs[N], perm[N];
	int64_t res[N];
	struct disk_frame f[N + 1];
	struct uring_engine *e;

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, (size_t)64 << 20, 0);
	cr_assert_eq(uring_engine_create(64, 8 << 20, &e), 0);
	struct tier_io io = { .ring = e };
	for (int i = 0; i < N; i++) {
		len[i] = 5000 + (size_t)i * 7919 % 60000;
		p[i] = malloc(len[i]);
		back[i] = malloc(len[i]);
		tu_fill(p[i], len[i], 77 + (uint64_t)i);
		memset(back[i], 0xA5, len[i]);
		m[i] = tu_meta(3, (uint32_t)i, p[i], len[i]);
		src[i] = p[i];
	}
	cr_assert_eq(tier_putv(t, &io, m, src, N, o, rcs), 0);
	int nf = disk_frames(dir, 0, f, N + 1);
	cr_assert_eq(nf, N);

	/* Ask in a scrambled order; frame 9 (by key) is corrupted on disk
	 * and frame 15 gets too small a buffer. */
	for (int i = 0; i < N; i++)
		perm[i] = (i * 5 + 3) % N; /* 5 is prime to 24 */
	for (int k = 0; k < N; k++) {
		int i = perm[k];
		ask[k] = o[i];
		dst[k] = back[i];
		cap[k] = i == 15 ? len[i] - 1 : len[i];
	}
	int corrupt_at = -1;
	for (int q = 0; q < nf; q++)
		if (f[q].m.key.seg == 9)
			corrupt_at = q;
	cr_assert_geq(corrupt_at, 0);
	poke(dir, 0, (off_t)(f[corrupt_at].off + 4096 + 100), 0);

	/* The reference op count, from the places the test read itself:
	 * frames in disk order, skipping 15, a new op wherever the next
	 * frame does not start where the run ends or the run would pass
	 * 4 MiB. */
	unsigned want_ops = 0;
	uint64_t run_end = 0, run_len = 0;
	int have_run = 0;
	for (int q = 0; q < nf; q++) {
		uint32_t k = f[q].m.key.seg;
		uint64_t fl = segfile_frame_len(&f[q].m);

		if (k == 15) {
			have_run = 0;
			continue;
		}
		cr_assert_leq(fl, (uint64_t)1 << 20);
		if (have_run && run_end == f[q].off && run_len + fl <= (4u << 20)) {
			run_end += fl;
			run_len += fl;
			continue;
		}
		want_ops++;
		have_run = 1;
		run_end = f[q].off + fl;
		run_len = fl;
	}
	cr_assert_lt(want_ops, N - 1, "the frames were laid out apart");

	/* the first failure in the caller's order: frame 9 asked at k = 6 */
	cr_assert_eq(getv_ops(t, e, ask, dst, cap, N, res, -MKV_ECORRUPT), want_ops);
	for (int k = 0; k < N; k++) {
		int i = perm[k];

		if (i == 15) {
			cr_assert_eq(res[k], -ENOSPC);
			for (size_t b = 0; b < len[i]; b++)
				cr_assert_eq((unsigned char)back[i][b], 0xA5);
		} else if (i == 9) {
			cr_assert_eq(res[k], -MKV_ECORRUPT, "%lld", (long long)res[k]);
		} else {
			cr_assert_eq(res[k], (int64_t)len[i], "item %d", i);
			cr_assert_eq(memcmp(back[i], p[i], len[i]), 0, "item %d", i);
		}
	}
	for (int i = 0; i < N; i++) {
		tier_drop(t, &io, o[i]);
		free(p[i]);
		free(back[i]);
	}
	cr_assert_eq(tier_used(t), 0);
	uring_engine_destroy(e);
	tier_destroy(t);
	tu_rmtree(dir);
}

/*
 * A batch's frames are written next to each other even where the free
 * list is full of holes each frame would fit: one reserved extent per
 * submission, so the batch reads back with one op.
 */
Test(nvme, putv_places_a_batch_together)
{
	char dir[256];
	enum { H = 20, B = 6, SZ = 6000 };
	char *p[H], *q[B], *back[B];
	const void *src[H];
	size_t cap[B];
	struct tier_meta m[H];
	struct tier_obj *o[H], *ob[B];
	void *dst[B];
	int rcs[H];
	int64_t res[B];
	struct uring_engine *e;

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, (size_t)64 << 20, 0);
	cr_assert_eq(uring_engine_create(64, 4 << 20, &e), 0);
	struct tier_io io = { .ring = e };
	for (int i = 0; i < H; i++) {
		p[i] = malloc(SZ);
		tu_fill(p[i], SZ, 500 + (uint64_t)i);
		m[i] = tu_meta(1, (uint32_t)i, p[i], SZ);
		src[i] = p[i];
	}
	cr_assert_eq(tier_putv(t, &io, m, src, H, o, rcs), 0);
	/* every other frame dropped: H / 2 holes of one frame each */
	for (int i = 0; i < H; i += 2)
		tier_drop(t, &io, o[i]);
	for (int i = 0; i < B; i++) {
		q[i] = malloc(SZ);
		back[i] = malloc(SZ);
		tu_fill(q[i], SZ, 900 + (uint64_t)i);
		m[i] = tu_meta(2, (uint32_t)i, q[i], SZ);
		src[i] = q[i];
		dst[i] = back[i];
		cap[i] = SZ;
	}
	cr_assert_eq(tier_putv(t, &io, m, src, B, ob, rcs), 0);

	/* the places, from the tier's own frames on disk */
	struct disk_frame f[H + B];
	int nf = disk_frames(dir, 0, f, H + B), nb = 0;
	uint64_t end = 0;
	cr_assert_eq(nf, H / 2 + B);
	for (int k = 0; k < nf; k++) {
		if (f[k].m.key.seq != 2)
			continue;
		cr_assert_eq(f[k].m.key.seg, (uint32_t)nb, "in batch order");
		if (nb)
			cr_assert_eq(f[k].off, end, "frame %d adjacent", nb);
		end = f[k].off + segfile_frame_len(&f[k].m);
		nb++;
	}
	cr_assert_eq(nb, B);
	cr_assert_eq(getv_ops(t, e, ob, dst, cap, B, res, 0), 1);
	for (int i = 0; i < B; i++) {
		cr_assert_eq(res[i], SZ);
		cr_assert_eq(memcmp(back[i], q[i], SZ), 0);
		tier_drop(t, &io, ob[i]);
		free(q[i]);
		free(back[i]);
	}
	for (int i = 1; i < H; i += 2)
		tier_drop(t, &io, o[i]);
	for (int i = 0; i < H; i++)
		free(p[i]);
	cr_assert_eq(tier_used(t), 0);
	uring_engine_destroy(e);
	tier_destroy(t);
	tu_rmtree(dir);
}

/*
 * With lz4 the frames come out shorter than the bounds their reservation
 * was sized by, so a submission's bytes can outrun its reservation: the
 * frame that no longer fits starts the next submission, and a batch of
 * half-compressible frames (~3 MiB in all: past one reservation, within
 * one 4 MiB read) still lands back to back and reads back with one op
 * (placed alone, that frame left a gap: two ops).
 */
Test(nvme, putv_lz4_batch_stays_together)
{
	char dir[256];
	enum { N = 56, SZ = 100000 };
	char *p[N], *back[N];
	const void *src[N];
	size_t cap[N];
	struct tier_meta m[N];
	struct tier_obj *o[N];
	void *dst[N];
	int rcs[N];
	int64_t res[N];
	struct uring_engine *e;

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, (size_t)64 << 20, 1);
	cr_assert_eq(uring_engine_create(64, 8 << 20, &e), 0);
	struct tier_io io = { .ring = e };
	for (int i = 0; i < N; i++) {
		p[i] = malloc(SZ);
		back[i] = malloc(SZ);
		/* about half compressible: lz4 keeps each frame at ~60% of
		 * its bound, so a submission's bytes run past its
		 * reservation's first frames but not to the batch size */
		tu_fill(p[i], SZ / 2, 7 + (uint64_t)i);
		tu_fill_compressible(p[i] + SZ / 2, SZ - SZ / 2, 7 + (uint64_t)i);
		m[i] = tu_meta(4, (uint32_t)i, p[i], SZ);
		src[i] = p[i];
		dst[i] = back[i];
		cap[i] = SZ;
	}
	cr_assert_eq(tier_putv(t, &io, m, src, N, o, rcs), 0);
	/* compressed: the frames' bytes are well below their bounds, and
	 * more than one submission's reservation (2 MiB of bounds), less
	 * than one read op (4 MiB) */
	cr_assert_lt(tier_used(t), (size_t)N * segfile_bound(SZ) * 3 / 4);
	cr_assert_gt(tier_used(t), (size_t)2 << 20);
	cr_assert_lt(tier_used(t), (size_t)4 << 20);
	uint64_t ops = getv_ops(t, e, o, dst, cap, N, res, 0);
	cr_assert_eq(ops, 1, "%llu read ops", (unsigned long long)ops);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(res[i], SZ);
		cr_assert_eq(memcmp(back[i], p[i], SZ), 0);
		tier_drop(t, &io, o[i]);
		free(p[i]);
		free(back[i]);
	}
	cr_assert_eq(tier_used(t), 0);
	uring_engine_destroy(e);
	tier_destroy(t);
	tu_rmtree(dir);
}

/* lz4 applies only where it saves 10%: footprints show it. */
Test(nvme, lz4_footprint)
{
	char dir[256];
	enum { SZ = 1 << 20 };
	char *a = malloc(SZ), *b = malloc(SZ);
	struct tier_obj *oa, *ob;

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 30, 1);
	tu_fill_compressible(a, SZ, 1);
	tu_fill(b, SZ, 1);
	struct tier_meta ma = tu_meta(1, 1, a, SZ), mb = tu_meta(1, 2, b, SZ);
	cr_assert_eq(tier_put(t, NULL, &ma, a, &oa), 0);
	cr_assert_eq(tier_put(t, NULL, &mb, b, &ob), 0);
	cr_assert_lt(oa->footprint, SZ / 4);
	cr_assert_geq(ob->footprint, SZ);
	tu_check_get(t, NULL, oa, a, SZ);
	tu_check_get(t, NULL, ob, b, SZ);
	tier_drop(t, NULL, oa);
	tier_drop(t, NULL, ob);
	tier_destroy(t);
	tu_rmtree(dir);
	free(a);
	free(b);
}

Test(nvme, capacity_gives_enospc)
{
	char dir[256];
	enum { SZ = 100000 };
	char *a = malloc(SZ);
	struct tier_obj *o[8];

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 3 * 102400, 0);
	tu_fill(a, SZ, 4);
	struct tier_meta m = tu_meta(1, 1, a, SZ);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(tier_put(t, NULL, &m, a, &o[i]), 0);
	cr_assert_eq(tier_put(t, NULL, &m, a, &o[3]), -ENOSPC);
	cr_assert_eq(tier_used(t), 3 * 102400);
	cr_assert_eq(disk_frames(dir, 0, NULL, 0), 3);
	cr_assert_eq(count_files(dir, ".mkv"), 1);
	cr_assert_eq(count_files(dir, ".tmp"), 0);
	for (int i = 0; i < 3; i++)
		tier_drop(t, NULL, o[i]);
	tier_destroy(t);
	tu_rmtree(dir);
	free(a);
}

struct scan_log {
	int ok, corrupt, incomplete;
	struct tier_obj *objs[64];
	struct tier_meta metas[64];
	char bad[8][64];
};

static int scan_cb(void *arg, int status, const char *name,
		   const struct tier_meta *m, struct tier_obj *o)
{
	struct scan_log *l = arg;

	if (status == 0) {
		cr_assert_lt(l->ok, 64);
		cr_assert_null(m == NULL ? (void *)1 : NULL);
		l->metas[l->ok] = *m;
		l->objs[l->ok++] = o;
		return 0;
	}
	cr_assert_null(o);
	if (l->corrupt + l->incomplete < 8)
		snprintf(l->bad[l->corrupt + l->incomplete], 64, "%s", name);
	if (status == -MKV_ECORRUPT)
		l->corrupt++;
	else if (status == -EINPROGRESS)
		l->incomplete++;
	return 0;
}

/* Payloads for the slab tests: frames of exactly @blocks * 4 KiB. */
static size_t frame_payload(unsigned blocks)
{
	return (size_t)blocks * 4096 - SEGFILE_HDR_SIZE;
}

static char *payload(size_t len, uint64_t seed)
{
	char *p = malloc(len);

	cr_assert(p);
	tu_fill(p, len, seed);
	return p;
}

static const struct disk_frame *find_seg(const struct disk_frame *f, int n,
					 uint64_t seq, uint32_t seg)
{
	for (int i = 0; i < n; i++)
		if (f[i].m.key.seq == seq && f[i].m.key.seg == seg)
			return &f[i];
	return NULL;
}

/* Reopen: complete frames are listed and read back bit-exactly; a frame
 * with a flipped payload bit and a torn one (its last block never landed)
 * are reported corrupt, an interrupted slab creation incomplete, and none
 * of them is adopted. */
Test(nvme, scan_reopen_reports_corrupt_and_incomplete)
{
	char dir[256], want[3][64];
	enum { SZ = 50000 };
	char *p[5];
	struct tier_obj *o;
	struct disk_frame f[8];

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 30, 1);
	for (int i = 0; i < 5; i++) {
		p[i] = payload(SZ, (uint64_t)i + 10);
		struct tier_meta m = tu_meta(100 + (uint64_t)i, (uint32_t)i,
					     p[i], SZ);
		cr_assert_eq(tier_put(t, NULL, &m, p[i], &o), 0);
		/* abandoned on purpose: the frame stays on disk, the handle
		 * is freed */
		tier_forget(t, o);
	}
	tier_destroy(t);
	cr_assert_eq(disk_frames(dir, 0, f, 8), 5);
	const struct disk_frame *f2 = find_seg(f, 5, 102, 2),
				*f4 = find_seg(f, 5, 104, 4);
	cr_assert(f2 && f4);
	uint64_t fl4 = segfile_frame_len(&f4->m), gmax = 0;
	for (int i = 0; i < 5; i++)
		gmax = f[i].m.gen > gmax ? f[i].m.gen : gmax;
	poke(dir, 0, (off_t)(f2->off + 4096 + 17), 0);
	poke(dir, 0, (off_t)(f4->off + fl4 - 4096), 4096);
	snprintf(want[0], 64, "slab-000000.mkv@0x%llx",
		 (unsigned long long)f2->off);
	snprintf(want[1], 64, "slab-000000.mkv@0x%llx",
		 (unsigned long long)f4->off);
	snprintf(want[2], 64, "slab-000009.mkv.tmp");
	char tmp[512];
	snprintf(tmp, sizeof tmp, "%s/%s", dir, want[2]);
	int fd = open(tmp, O_CREAT | O_WRONLY, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "partial", 7), 7);
	close(fd);

	t = nvme(dir, 1 << 30, 1);
	struct scan_log log = { 0 };
	cr_assert_eq(t->ops->scan(t, NULL, scan_cb, &log), 3);
	cr_assert_eq(log.ok, 3);
	cr_assert_eq(log.corrupt, 2);
	cr_assert_eq(log.incomplete, 1);
	for (int w = 0; w < 3; w++) {
		int seen = 0;
		for (int i = 0; i < 3; i++)
			seen += strcmp(log.bad[i], want[w]) == 0;
		cr_assert_eq(seen, 1, "report for %s", want[w]);
	}
	cr_assert_eq(count_files(dir, ".tmp"), 0);
	cr_assert_eq(tier_used(t), 3 * segfile_bound(SZ));
	for (int i = 0; i < log.ok; i++) {
		int k = (int)(log.metas[i].key.seq - 100);
		cr_assert(k == 0 || k == 1 || k == 3, "adopted %d", k);
		cr_assert_eq(log.metas[i].key.seg, (uint32_t)k);
		cr_assert_eq(log.metas[i].len, SZ);
		cr_assert_eq(log.metas[i].hash, XXH3_64bits(p[k], SZ));
		tu_check_get(t, NULL, log.objs[i], p[k], SZ);
		tier_drop(t, NULL, log.objs[i]);
	}
	/* The failed frames' extents are free space again. */
	struct nvme_tier_info ni = info(t);
	cr_assert_eq(ni.free_bytes, ni.slab_bytes);
	cr_assert_eq(tier_used(t), 0);
	/* A new put after reopen is newer than anything found. */
	struct tier_meta m = tu_meta(100, 0, p[0], SZ);
	cr_assert_eq(tier_put(t, NULL, &m, p[0], &o), 0);
	tu_check_get(t, NULL, o, p[0], SZ);
	int nf = disk_frames(dir, 0, f, 8);
	const struct disk_frame *fn = find_seg(f, nf, 100, 0);
	cr_assert(fn);
	cr_assert_gt(fn->m.gen, gmax);
	tier_drop(t, NULL, o);
	tier_destroy(t);
	tu_rmtree(dir);
	for (int i = 0; i < 5; i++)
		free(p[i]);
}

/* A frame corrupted after the put fails get() with -MKV_ECORRUPT. */
Test(nvme, get_detects_corruption)
{
	char dir[256];
	enum { SZ = 20000 };
	char *a = payload(SZ, 4), *b = malloc(SZ);
	struct tier_obj *o;
	struct disk_frame f[2];

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 30, 0);
	struct tier_meta m = tu_meta(1, 1, a, SZ);
	cr_assert_eq(tier_put(t, NULL, &m, a, &o), 0);
	cr_assert_eq(disk_frames(dir, 0, f, 2), 1);
	poke(dir, 0, (off_t)(f[0].off + 200), 0);
	cr_assert_eq(tier_get(t, NULL, o, b, SZ), -MKV_ECORRUPT);
	struct tier_stats st;
	tier_get_stats(t, &st);
	cr_assert_eq(st.get_errors, 1);
	tier_drop(t, NULL, o);
	tier_destroy(t);
	tu_rmtree(dir);
	free(a);
	free(b);
}

/* A dropped frame's extent takes the next frame that fits: same place,
 * same file, no growth; its header is zeroed as soon as drop returns. */
Test(nvme, extent_reuse_after_delete)
{
	char dir[256];
	size_t sz = frame_payload(2), small = frame_payload(1);
	char *p[6];
	struct tier_obj *o[6];
	struct disk_frame f[8];
	struct stat st;
	char path[512];

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 4 * 8192, 0); /* one slab, 4 frames */
	for (int i = 0; i < 6; i++)
		p[i] = payload(sz, 50 + (uint64_t)i);
	for (int i = 0; i < 4; i++) {
		struct tier_meta m = tu_meta(1, (uint32_t)i, p[i], sz);
		cr_assert_eq(tier_put(t, NULL, &m, p[i], &o[i]), 0);
	}
	struct tier_meta m4 = tu_meta(1, 4, p[4], sz);
	cr_assert_eq(tier_put(t, NULL, &m4, p[4], &o[4]), -ENOSPC);
	cr_assert_eq(disk_frames(dir, 0, f, 8), 4);
	uint64_t off_b = find_seg(f, 4, 1, 1)->off;

	tier_drop(t, NULL, o[1]);
	char blk[4096], zero[4096] = { 0 };
	slab_path(path, sizeof path, dir, 0);
	int fd = open(path, O_RDONLY);
	cr_assert_eq(pread(fd, blk, sizeof blk, (off_t)off_b), 4096);
	cr_assert_eq(memcmp(blk, zero, sizeof blk), 0, "header not zeroed");
	cr_assert_eq(disk_frames(dir, 0, f, 8), 3);

	cr_assert_eq(tier_put(t, NULL, &m4, p[4], &o[4]), 0);
	cr_assert_eq(disk_frames(dir, 0, f, 8), 4);
	cr_assert_eq(find_seg(f, 4, 1, 4)->off, off_b);
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq(st.st_size, 4 * 8192);
	cr_assert_eq(count_files(dir, ".mkv"), 1);
	struct nvme_tier_info ni = info(t);
	cr_assert_eq(ni.free_bytes, 0);
	for (int i = 0; i < 5; i++)
		if (i != 1)
			tu_check_get(t, NULL, o[i], p[i], sz);

	/* Two one-block frames fill the two-block hole, in order. */
	tier_drop(t, NULL, o[4]);
	tu_fill(p[5], small, 77);
	struct tier_meta ms = tu_meta(2, 0, p[5], small);
	struct tier_obj *s0, *s1;
	cr_assert_eq(tier_put(t, NULL, &ms, p[5], &s0), 0);
	ms.key.seg = 1;
	cr_assert_eq(tier_put(t, NULL, &ms, p[5], &s1), 0);
	int nf = disk_frames(dir, 0, f, 8);
	cr_assert_eq(nf, 5);
	cr_assert_eq(find_seg(f, nf, 2, 0)->off, off_b);
	cr_assert_eq(find_seg(f, nf, 2, 1)->off, off_b + 4096);
	tu_check_get(t, NULL, s0, p[5], small);
	tu_check_get(t, NULL, s1, p[5], small);
	tier_drop(t, NULL, s0);
	tier_drop(t, NULL, s1);
	for (int i = 0; i < 4; i++)
		if (i != 1)
			tier_drop(t, NULL, o[i]);
	ni = info(t);
	cr_assert_eq(ni.free_bytes, 4 * 8192);
	cr_assert_eq(ni.free_extents, 1, "coalesced");
	cr_assert_eq(ni.quarantined, 0);
	cr_assert_eq(disk_frames(dir, 0, f, 8), 0);
	close(fd);
	tier_destroy(t);
	tu_rmtree(dir);
	for (int i = 0; i < 6; i++)
		free(p[i]);
}

/* Deleted frames never come back: not after a reopen, not when their
 * extent was partly reused, not after everything was deleted. */
Test(nvme, reopen_after_deletes_never_resurrects)
{
	char dir[256];
	enum { N = 10, SZ = 20000, XS = 10000 };
	char *p[N], *x = payload(XS, 99);
	struct tier_obj *o[N], *ox;
	struct disk_frame f[16];

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 20, 0);
	for (int i = 0; i < N; i++) {
		p[i] = payload(SZ, 200 + (uint64_t)i);
		struct tier_meta m = tu_meta(7, (uint32_t)i, p[i], SZ);
		cr_assert_eq(tier_put(t, NULL, &m, p[i], &o[i]), 0);
	}
	for (int i = 1; i < N; i += 2)
		tier_drop(t, NULL, o[i]);
	/* A smaller frame into the first hole: the rest of that hole still
	 * holds the dropped frame's payload bytes. */
	struct tier_meta mx = tu_meta(8, 0, x, XS);
	cr_assert_eq(tier_put(t, NULL, &mx, x, &ox), 0);
	int nf = disk_frames(dir, 0, f, 16);
	cr_assert_eq(nf, 6);
	cr_assert_eq(find_seg(f, nf, 8, 0)->off,
		     segfile_bound(SZ)); /* seg 1's old place */
	for (int i = 0; i < N; i += 2)
		tier_forget(t, o[i]);
	tier_forget(t, ox);
	tier_destroy(t);

	t = nvme(dir, 1 << 20, 0);
	struct scan_log log = { 0 };
	cr_assert_eq(t->ops->scan(t, NULL, scan_cb, &log), 6);
	cr_assert_eq(log.corrupt + log.incomplete, 0);
	for (int i = 0; i < log.ok; i++) {
		struct segfile_key k = log.metas[i].key;
		if (k.seq == 8) {
			cr_assert_eq(k.seg, 0);
			tu_check_get(t, NULL, log.objs[i], x, XS);
		} else {
			cr_assert_eq(k.seq, 7);
			cr_assert_eq(k.seg % 2, 0, "seg %u came back", k.seg);
			tu_check_get(t, NULL, log.objs[i], p[k.seg], SZ);
		}
		tier_drop(t, NULL, log.objs[i]);
	}
	cr_assert_eq(tier_used(t), 0);
	tier_destroy(t);

	/* Everything deleted: a third open finds nothing at all. */
	t = nvme(dir, 1 << 20, 0);
	struct scan_log none = { 0 };
	cr_assert_eq(t->ops->scan(t, NULL, scan_cb, &none), 0);
	cr_assert_eq(none.ok + none.corrupt + none.incomplete, 0);
	cr_assert_eq(disk_frames(dir, 0, NULL, 0), 0);
	tier_destroy(t);
	tu_rmtree(dir);
	for (int i = 0; i < N; i++)
		free(p[i]);
	free(x);
}

/* Slab space exhausted by fragmentation (the capacity charge passes, no
 * extent is large enough, no slab may be added): -ENOSPC, and nothing
 * changes; once the neighbours are free the frame fits. */
Test(nvme, slab_full_gives_enospc_cleanly)
{
	char dir[256];
	size_t sz = frame_payload(2), big = frame_payload(4);
	char *p[4], *w = payload(big, 3);
	struct tier_obj *o[4], *ow = NULL;
	struct disk_frame f[8];

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 4 * 8192, 0);
	for (int i = 0; i < 4; i++) {
		p[i] = payload(sz, 300 + (uint64_t)i);
		struct tier_meta m = tu_meta(3, (uint32_t)i, p[i], sz);
		cr_assert_eq(tier_put(t, NULL, &m, p[i], &o[i]), 0);
	}
	tier_drop(t, NULL, o[0]);
	tier_drop(t, NULL, o[2]);
	struct nvme_tier_info a = info(t), b;
	cr_assert_eq(a.free_bytes, 16384);
	cr_assert_eq(a.free_extents, 2);
	cr_assert_eq(a.largest_free, 8192);
	struct tier_meta mw = tu_meta(4, 0, w, big);
	cr_assert_eq(tier_put(t, NULL, &mw, w, &ow), -ENOSPC);
	cr_assert_null(ow);
	b = info(t);
	cr_assert_eq(b.free_bytes, a.free_bytes);
	cr_assert_eq(b.free_extents, a.free_extents);
	cr_assert_eq(b.slabs, 1);
	cr_assert_eq(b.quarantined, 0);
	cr_assert_eq(tier_used(t), 2 * 8192);
	cr_assert_eq(count_files(dir, ".mkv"), 1);
	cr_assert_eq(count_files(dir, ".tmp"), 0);
	cr_assert_eq(disk_frames(dir, 0, f, 8), 2);
	/* putv: the big one fails alone, a small one beside it succeeds */
	const void *src[2] = { w, p[0] };
	struct tier_meta mv[2] = { mw, tu_meta(3, 0, p[0], sz) };
	struct tier_obj *ov[2];
	int rcs[2];
	cr_assert_eq(tier_putv(t, NULL, mv, src, 2, ov, rcs), -ENOSPC);
	cr_assert_eq(rcs[0], -ENOSPC);
	cr_assert_eq(rcs[1], 0);
	cr_assert_null(ov[0]);
	tu_check_get(t, NULL, ov[1], p[0], sz);
	tier_drop(t, NULL, ov[1]);

	tier_drop(t, NULL, o[1]);
	cr_assert_eq(info(t).largest_free, 24576);
	cr_assert_eq(tier_put(t, NULL, &mw, w, &ow), 0);
	int nf = disk_frames(dir, 0, f, 8);
	cr_assert_eq(nf, 2);
	cr_assert_eq(find_seg(f, nf, 4, 0)->off, 0);
	tu_check_get(t, NULL, ow, w, big);
	tu_check_get(t, NULL, o[3], p[3], sz);
	tier_drop(t, NULL, ow);
	tier_drop(t, NULL, o[3]);
	cr_assert_eq(tier_used(t), 0);
	tier_destroy(t);
	tu_rmtree(dir);
	for (int i = 0; i < 4; i++)
		free(p[i]);
	free(w);
}

/* A write torn by a crash (only its first half landed) lands in free
 * space: the older frames stay intact and are adopted, the torn one is
 * reported corrupt, and its space is reused. */
Test(nvme, torn_write_keeps_older_frames)
{
	char dir[256], path[512];
	enum { SZ = 20000, CZ = 40000 };
	char *a = payload(SZ, 1), *b = payload(SZ, 2), *cpay = payload(CZ, 3);
	struct tier_obj *o;
	struct disk_frame f[4];

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 20, 0);
	struct tier_meta ma = tu_meta(1, 0, a, SZ), mb = tu_meta(1, 1, b, SZ);
	cr_assert_eq(tier_put(t, NULL, &ma, a, &o), 0);
	tier_forget(t, o);
	cr_assert_eq(tier_put(t, NULL, &mb, b, &o), 0);
	tier_forget(t, o);
	tier_destroy(t);
	cr_assert_eq(disk_frames(dir, 0, f, 4), 2);
	uint64_t tail = 0;
	for (int i = 0; i < 2; i++)
		if (f[i].off + segfile_frame_len(&f[i].m) > tail)
			tail = f[i].off + segfile_frame_len(&f[i].m);

	/* The frame a crashed put was writing at the next free place. */
	struct segfile_meta sm;
	memset(&sm, 0, sizeof sm);
	sm.key = (struct segfile_key){ .seq = 9, .seg = 9 };
	sm.gen = 1000;
	sm.place = tail;
	sm.container = 0;
	char *img = aligned_alloc(4096, segfile_bound(CZ));
	int64_t fl = segfile_encode(&sm, cpay, CZ, img, segfile_bound(CZ), 0);
	cr_assert_gt(fl, 8192);
	slab_path(path, sizeof path, dir, 0);
	int fd = open(path, O_RDWR);
	cr_assert_eq(pwrite(fd, img, (size_t)fl / 2, (off_t)tail), fl / 2);
	cr_assert_eq(fsync(fd), 0);
	close(fd);

	t = nvme(dir, 1 << 20, 0);
	struct scan_log log = { 0 };
	cr_assert_eq(t->ops->scan(t, NULL, scan_cb, &log), 2);
	cr_assert_eq(log.corrupt, 1);
	char want[64];
	snprintf(want, sizeof want, "slab-000000.mkv@0x%llx",
		 (unsigned long long)tail);
	cr_assert_str_eq(log.bad[0], want);
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(log.metas[i].key.seq, 1);
		tu_check_get(t, NULL, log.objs[i],
			     log.metas[i].key.seg ? b : a, SZ);
	}
	/* The torn frame's extent is the first free one: a put reuses it. */
	struct tier_meta mc = tu_meta(9, 9, cpay, CZ);
	cr_assert_eq(tier_put(t, NULL, &mc, cpay, &o), 0);
	tu_check_get(t, NULL, o, cpay, CZ);
	int nf = disk_frames(dir, 0, f, 4);
	cr_assert_eq(nf, 3);
	cr_assert_eq(find_seg(f, nf, 9, 9)->off, tail);
	tier_drop(t, NULL, o);
	for (int i = 0; i < 2; i++)
		tier_drop(t, NULL, log.objs[i]);
	tier_destroy(t);
	tu_rmtree(dir);
	free(img);
	free(a);
	free(b);
	free(cpay);
}

/* Slabs found at create take no frame before they are scanned: puts made
 * before the scan go to a new slab (the capacity must leave room for one)
 * and cannot overwrite what the scan will adopt.  A second scan finds
 * nothing new. */
Test(nvme, puts_before_scan_use_new_slabs)
{
	char dir[256];
	enum { N = 4, SZ = 30000 };
	char *p[2 * N];
	struct tier_obj *o[N];

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 20, 0);
	for (int i = 0; i < 2 * N; i++)
		p[i] = payload(SZ, 400 + (uint64_t)i);
	for (int i = 0; i < N; i++) {
		struct tier_meta m = tu_meta(1, (uint32_t)i, p[i], SZ);
		cr_assert_eq(tier_put(t, NULL, &m, p[i], &o[i]), 0);
		tier_forget(t, o[i]);
	}
	tier_destroy(t);

	t = nvme(dir, 2 << 20, 0);
	for (int i = 0; i < N; i++) {
		struct tier_meta m = tu_meta(2, (uint32_t)i, p[N + i], SZ);
		cr_assert_eq(tier_put(t, NULL, &m, p[N + i], &o[i]), 0);
	}
	cr_assert_eq(info(t).slabs, 2);
	cr_assert_eq(count_files(dir, ".mkv"), 2);
	struct disk_frame f[8];
	cr_assert_eq(disk_frames(dir, 0, f, 8), N);
	for (int i = 0; i < N; i++)
		cr_assert_eq(f[i].m.key.seq, 1);
	cr_assert_eq(disk_frames(dir, 1, f, 8), N);
	struct scan_log log = { 0 };
	cr_assert_eq(t->ops->scan(t, NULL, scan_cb, &log), N);
	struct scan_log again = { 0 };
	cr_assert_eq(t->ops->scan(t, NULL, scan_cb, &again), 0);
	cr_assert_eq(again.ok + again.corrupt + again.incomplete, 0);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(log.metas[i].key.seq, 1);
		tu_check_get(t, NULL, log.objs[i], p[log.metas[i].key.seg], SZ);
		tu_check_get(t, NULL, o[i], p[N + i], SZ);
		tier_drop(t, NULL, log.objs[i]);
		tier_drop(t, NULL, o[i]);
	}
	cr_assert_eq(tier_used(t), 0);
	tier_destroy(t);
	tu_rmtree(dir);
	for (int i = 0; i < 2 * N; i++)
		free(p[i]);
}

/* Small slabs: frames spread over several, a frame larger than a slab
 * gets a slab of its own, all of them come back after a reopen. */
Test(nvme, several_slabs_and_oversized_frame)
{
	char dir[256];
	enum { N = 10, SZ = 20000, BIG = 100000 };
	char *p[N + 1];
	struct tier_obj *o;

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme2(dir, 4 << 20, 1, 64 << 10);
	for (int i = 0; i <= N; i++) {
		size_t len = i == N ? BIG : SZ;
		p[i] = payload(len, 500 + (uint64_t)i);
		struct tier_meta m = tu_meta(6, (uint32_t)i, p[i], len);
		cr_assert_eq(tier_put(t, NULL, &m, p[i], &o), 0);
		tu_check_get(t, NULL, o, p[i], len);
		tier_forget(t, o);
	}
	struct nvme_tier_info ni = info(t);
	cr_assert_eq(ni.slabs, 5); /* 3 frames of 20 KiB per 64 KiB slab */
	cr_assert_eq(ni.slab_bytes, 4 * (64 << 10) + segfile_bound(BIG));
	cr_assert_eq(count_files(dir, ".mkv"), 5);
	tier_destroy(t);

	t = nvme2(dir, 4 << 20, 1, 64 << 10);
	struct scan_log log = { 0 };
	cr_assert_eq(t->ops->scan(t, NULL, scan_cb, &log), N + 1);
	for (int i = 0; i < log.ok; i++) {
		uint32_t k = log.metas[i].key.seg;
		cr_assert_leq(k, N);
		tu_check_get(t, NULL, log.objs[i], p[k], k == N ? BIG : SZ);
		tier_drop(t, NULL, log.objs[i]);
	}
	ni = info(t);
	cr_assert_eq(ni.free_bytes, ni.slab_bytes);
	cr_assert_eq(ni.free_extents, 5);
	tier_destroy(t);
	tu_rmtree(dir);
	for (int i = 0; i <= N; i++)
		free(p[i]);
}

/* Two frames of one key (a crash between a new copy and the old one's
 * drop): the scan reports the newest first. */
Test(nvme, same_key_newest_first)
{
	char dir[256];
	enum { SZ = 12345 };
	char *p1 = payload(SZ, 1), *p2 = payload(SZ, 2);
	struct tier_obj *o;

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 30, 0);
	struct tier_meta m1 = tu_meta(5, 5, p1, SZ), m2 = tu_meta(5, 5, p2, SZ);
	cr_assert_eq(tier_put(t, NULL, &m1, p1, &o), 0);
	tier_forget(t, o);
	cr_assert_eq(tier_put(t, NULL, &m2, p2, &o), 0);
	tier_forget(t, o);
	tier_destroy(t);
	t = nvme(dir, 1 << 30, 0);
	struct scan_log log = { 0 };
	cr_assert_eq(t->ops->scan(t, NULL, scan_cb, &log), 2);
	cr_assert_eq(log.metas[0].hash, XXH3_64bits(p2, SZ));
	cr_assert_eq(log.metas[1].hash, XXH3_64bits(p1, SZ));
	tu_check_get(t, NULL, log.objs[0], p2, SZ);
	tu_check_get(t, NULL, log.objs[1], p1, SZ);
	tier_drop(t, NULL, log.objs[0]);
	tier_drop(t, NULL, log.objs[1]);
	tier_destroy(t);
	tu_rmtree(dir);
	free(p1);
	free(p2);
}

/* Threads putting, reading and dropping at once, each with its own ring:
 * the group commit is shared (fewer fdatasync rounds than callers), every
 * payload reads back bit-exactly, extents are reused and coalesce back. */
struct gc_arg {
	struct tier *t;
	unsigned id;
	int err;
};

static void *gc_thread(void *arg)
{
	struct gc_arg *g = arg;
	enum { ITER = 40, LIVE = 3 };
	struct uring_engine *e = NULL;
	struct tier_obj *live[LIVE] = { NULL };
	char *pay[LIVE] = { NULL };
	size_t len[LIVE] = { 0 };
	char *back = malloc(70000);

	if (uring_engine_create(32, 1 << 20, &e) &&
	    uring_engine_create(32, 0, &e))
		return (void *)1;
	struct tier_io io = { .ring = e };
	for (unsigned it = 0; it < ITER && !g->err; it++) {
		unsigned s = it % LIVE;

		if (live[s]) {
			if (tier_get(g->t, &io, live[s], back, 70000) !=
				    (int64_t)len[s] ||
			    memcmp(back, pay[s], len[s]))
				g->err = 1;
			tier_drop(g->t, &io, live[s]);
			free(pay[s]);
		}
		len[s] = 1000 + (size_t)((g->id * 7919u + it * 104729u) % 60000u);
		pay[s] = malloc(len[s]);
		tu_fill(pay[s], len[s], g->id * 1000 + it);
		struct tier_meta m = tu_meta(g->id, it, pay[s], len[s]);
		if (tier_put(g->t, &io, &m, pay[s], &live[s]))
			g->err = 2;
	}
	for (unsigned s = 0; s < LIVE; s++) {
		if (!live[s])
			continue;
		if (tier_get(g->t, &io, live[s], back, 70000) !=
			    (int64_t)len[s] ||
		    memcmp(back, pay[s], len[s]))
			g->err = 3;
		tier_drop(g->t, &io, live[s]);
		free(pay[s]);
	}
	free(back);
	uring_engine_destroy(e);
	return NULL;
}

Test(nvme, group_commit_shared_by_threads)
{
	char dir[256];
	enum { T = 8 };
	pthread_t th[T];
	struct gc_arg g[T];

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme2(dir, 64 << 20, 0, 1 << 20);
	for (unsigned i = 0; i < T; i++) {
		g[i] = (struct gc_arg){ t, i + 1, 0 };
		cr_assert_eq(pthread_create(&th[i], NULL, gc_thread, &g[i]), 0);
	}
	for (unsigned i = 0; i < T; i++) {
		void *r;
		cr_assert_eq(pthread_join(th[i], &r), 0);
		cr_assert_null(r);
		cr_assert_eq(g[i].err, 0, "thread %u: %d", i, g[i].err);
	}
	struct nvme_tier_info ni = info(t);
	/* every put and every drop waited for a commit */
	cr_assert_eq(ni.commits, 2 * T * 40);
	cr_assert_lt(ni.syncs, ni.commits, "syncs %llu commits %llu",
		     (unsigned long long)ni.syncs,
		     (unsigned long long)ni.commits);
	cr_assert_eq(tier_used(t), 0);
	cr_assert_eq(ni.free_bytes, ni.slab_bytes);
	cr_assert_eq(ni.free_extents, ni.slabs);
	cr_assert_eq(ni.quarantined, 0);
	for (unsigned i = 0; i < ni.slabs; i++)
		cr_assert_eq(disk_frames(dir, i, NULL, 0), 0);
	tier_destroy(t);
	tu_rmtree(dir);
}

/* A slab that cannot be created (here RLIMIT_FSIZE: fallocate fails with
 * EFBIG) fails neither the create (the first slab is made there, best
 * effort) nor anything but the put that needs it: no file, no charge, no
 * slab left behind; the next put, once it can, succeeds.  Criterion runs
 * each test in its own process, so the limit dies with it. */
Test(nvme, slab_creation_failure_is_clean)
{
	char dir[256];
	enum { SZ = 30000 };
	char *a = payload(SZ, 8);
	struct tier_obj *o = NULL;
	struct rlimit rl, small;

	tu_mkdtemp(dir, sizeof dir);
	signal(SIGXFSZ, SIG_IGN);
	cr_assert_eq(getrlimit(RLIMIT_FSIZE, &rl), 0);
	small = rl;
	small.rlim_cur = 64 << 10;
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
	struct tier *t = nvme2(dir, 64 << 20, 0, 1 << 20);
	cr_assert_eq(info(t).slabs, 0);
	struct tier_meta m = tu_meta(1, 1, a, SZ);
	cr_assert_eq(tier_put(t, NULL, &m, a, &o), -EFBIG);
	cr_assert_null(o);
	cr_assert_eq(tier_used(t), 0);
	cr_assert_eq(info(t).slabs, 0);
	cr_assert_eq(count_files(dir, ".mkv"), 0);
	cr_assert_eq(count_files(dir, ".tmp"), 0);
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	cr_assert_eq(tier_put(t, NULL, &m, a, &o), 0);
	tu_check_get(t, NULL, o, a, SZ);
	cr_assert_eq(info(t).slabs, 1);
	cr_assert_eq(info(t).slab_bytes, 1 << 20);
	tier_drop(t, NULL, o);
	tier_destroy(t);
	tu_rmtree(dir);
	free(a);
}

Test(nvme, invalid)
{
	struct tier *t;

	cr_assert_eq(nvme_tier_create(NULL, 1, 0, &t), -EINVAL);
	cr_assert_eq(nvme_tier_create("", 1, 0, &t), -EINVAL);
	cr_assert_eq(nvme_tier_create("/var/tmp", 0, 0, &t), -EINVAL);
	cr_assert_eq(nvme_tier_create("/proc/nonexistent/x", 1, 0, &t), -ENOENT);
	cr_assert_eq(nvme_tier_create2("/var/tmp", 1, 0, (size_t)1 << 63, &t),
		     -EINVAL);
	struct nvme_tier_info i;
	cr_assert_eq(nvme_tier_get_info(NULL, &i), -EINVAL);
	cr_assert_eq(hbm_tier_create(1 << 20, -1, &t), 0);
	cr_assert_eq(nvme_tier_get_info(t, &i), -EINVAL); /* not nvme */
	tier_destroy(t);
}
