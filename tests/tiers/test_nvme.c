/* SPDX-License-Identifier: MIT */
/* tests/tiers/test_nvme.c — tiers/nvme.c on real files, O_DIRECT, io_uring. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <criterion/criterion.h>

#include <mosaickv/common.h>
#include "io/uring.h"
#include "tierutil.h"

static struct tier *nvme(const char *dir, size_t cap, int lz4)
{
	struct tier *t = NULL;
	int rc = nvme_tier_create(dir, cap, lz4, &t);

	if (rc == -ENOSYS || rc == -EPERM)
		cr_skip_test("io_uring unavailable (%d)", rc);
	cr_assert_eq(rc, 0, "nvme_tier_create: %d", rc);
	return t;
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
	cr_assert_eq(count_files(dir, ".seg"), 0); /* all dropped */
	cr_assert_eq(count_files(dir, ".tmp"), 0);
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
	/* write, fdatasync, whole read, gather (3 merged-or-not extents) */
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
	cr_assert_eq(st.fixed_ops + 1 /* the fdatasync */, st.ops);
	uring_engine_destroy(e);
	tier_destroy(t);
	tu_rmtree(dir);
}

/* gatherv reads ranges of several files in one ring submission, raw and
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
	/* The three raw files' extents went in one submission (plus one
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

/* putv/getv: 40 segments written (write->fdatasync chains) in one ring
 * submission at queue depth 80 and read back in one; items past the
 * capacity fail alone. */
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
	cr_assert_eq(count_files(dir, ".seg"), 36);
	cr_assert_eq(count_files(dir, ".tmp"), 0);
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
	cr_assert_eq(count_files(dir, ".seg"), 3);
	cr_assert_eq(count_files(dir, ".tmp"), 0);
	for (int i = 0; i < 3; i++)
		tier_drop(t, NULL, o[i]);
	tier_destroy(t);
	tu_rmtree(dir);
	free(a);
}

struct scan_log {
	int ok, corrupt, incomplete;
	struct tier_obj *objs[16];
	struct tier_meta metas[16];
};

static int scan_cb(void *arg, int status, const char *name,
		   const struct tier_meta *m, struct tier_obj *o)
{
	struct scan_log *l = arg;

	(void)name;
	if (status == 0) {
		l->metas[l->ok] = *m;
		l->objs[l->ok++] = o;
		return 0;
	}
	if (status == -MKV_ECORRUPT)
		l->corrupt++;
	else if (status == -EINPROGRESS)
		l->incomplete++;
	return 0;
}

static void corrupt_file(const char *dir, const char *ext, int nth, off_t at)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int i = 0;

	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		if (l < 4 || strcmp(de->d_name + l - 4, ext))
			continue;
		if (i++ != nth)
			continue;
		char p[512];
		snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
		int fd = open(p, O_RDWR);
		unsigned char c;
		cr_assert_eq(pread(fd, &c, 1, at), 1);
		c ^= 0x20;
		cr_assert_eq(pwrite(fd, &c, 1, at), 1);
		close(fd);
		break;
	}
	closedir(d);
}

/* Reopen: complete segments are listed and read back bit-exactly; a
 * corrupt one and an interrupted (.tmp) one are reported, never adopted. */
Test(nvme, scan_reopen_reports_corrupt_and_incomplete)
{
	char dir[256];
	enum { SZ = 50000 };
	char *p[5];
	struct tier_obj *o;

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 30, 1);
	for (int i = 0; i < 5; i++) {
		p[i] = malloc(SZ);
		tu_fill(p[i], SZ, (uint64_t)i + 10);
		struct tier_meta m = tu_meta(100 + (uint64_t)i, (uint32_t)i,
					     p[i], SZ);
		cr_assert_eq(tier_put(t, NULL, &m, p[i], &o), 0);
		/* abandoned on purpose: the file stays on disk, the handle
		 * is freed */
		tier_forget(t, o);
	}
	tier_destroy(t);
	/* An interrupted spill and a corrupted payload byte. */
	char tmp[512];
	snprintf(tmp, sizeof tmp, "%s/0000000000000063-1-2-9-0-99.tmp", dir);
	int fd = open(tmp, O_CREAT | O_WRONLY, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "partial", 7), 7);
	close(fd);
	corrupt_file(dir, ".seg", 2, 4096 + 17);

	t = nvme(dir, 1 << 30, 1);
	struct scan_log log = { 0 };
	cr_assert_eq(t->ops->scan(t, NULL, scan_cb, &log), 4);
	cr_assert_eq(log.ok, 4);
	cr_assert_eq(log.corrupt, 1);
	cr_assert_eq(log.incomplete, 1);
	cr_assert_eq(count_files(dir, ".tmp"), 0);
	cr_assert_gt(tier_used(t), 4 * SZ);
	for (int i = 0; i < log.ok; i++) {
		int k = (int)(log.metas[i].key.seq - 100);
		cr_assert(k >= 0 && k < 5);
		cr_assert_eq(log.metas[i].key.seg, (uint32_t)k);
		cr_assert_eq(log.metas[i].len, SZ);
		tu_check_get(t, NULL, log.objs[i], p[k], SZ);
		tier_drop(t, NULL, log.objs[i]);
	}
	/* A new put after reopen does not reuse an existing name. */
	struct tier_meta m = tu_meta(100, 0, p[0], SZ);
	cr_assert_eq(tier_put(t, NULL, &m, p[0], &o), 0);
	tu_check_get(t, NULL, o, p[0], SZ);
	tier_drop(t, NULL, o);
	tier_destroy(t);
	tu_rmtree(dir);
	for (int i = 0; i < 5; i++)
		free(p[i]);
}

/* A file corrupted after the put fails get() with -MKV_ECORRUPT. */
Test(nvme, get_detects_corruption)
{
	char dir[256];
	enum { SZ = 20000 };
	char *a = malloc(SZ), *b = malloc(SZ);
	struct tier_obj *o;

	tu_mkdtemp(dir, sizeof dir);
	struct tier *t = nvme(dir, 1 << 30, 0);
	tu_fill(a, SZ, 4);
	struct tier_meta m = tu_meta(1, 1, a, SZ);
	cr_assert_eq(tier_put(t, NULL, &m, a, &o), 0);
	corrupt_file(dir, ".seg", 0, 200);
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

Test(nvme, invalid)
{
	struct tier *t;

	cr_assert_eq(nvme_tier_create(NULL, 1, 0, &t), -EINVAL);
	cr_assert_eq(nvme_tier_create("", 1, 0, &t), -EINVAL);
	cr_assert_eq(nvme_tier_create("/var/tmp", 0, 0, &t), -EINVAL);
	cr_assert_eq(nvme_tier_create("/proc/nonexistent/x", 1, 0, &t), -ENOENT);
}
