/* SPDX-License-Identifier: MIT */
/*
 * tools/tierctl against a real store directory: the built binary (path in
 * $TIERCTL) run on what a store left behind, its output and exit status
 * checked against what the test wrote: real segments and raw payloads,
 * a directory owned by an open store, a corrupted frame, removal.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include <mosaickv.h>
#include "storeutil.h"

/* Run tierctl with @args; its stdout into @out (truncated); exit status. */
static int tierctl(char *out, size_t cap, const char *args)
{
	const char *bin = getenv("TIERCTL");
	char cmd[1024];
	FILE *p;
	size_t n;
	int st;

	cr_assert(bin, "TIERCTL is not set (meson sets it)");
	snprintf(cmd, sizeof cmd, "%s %s 2>&1", bin, args);
	p = popen(cmd, "r");
	cr_assert(p);
	n = fread(out, 1, cap - 1, p);
	out[n] = 0;
	st = pclose(p);
	cr_assert(WIFEXITED(st), "tierctl did not exit: %s", cmd);
	return WEXITSTATUS(st);
}

/*
 * Run tierctl with the arguments @fmt formatted with @dir; assert its exit
 * status and that its output holds @want1 and @want2 (NULL: nothing
 * wanted).  Returns the output (valid until the next call).
 */
static const char *expect(int status, const char *want1, const char *want2,
			  const char *fmt, const char *dir)
{
	static char out[65536];
	char args[1024];

	snprintf(args, sizeof args, fmt, dir);
	cr_assert_eq(tierctl(out, sizeof out, args), status, "tierctl %s:\n%s",
		     args, out);
	cr_assert(!want1 || strstr(out, want1), "tierctl %s: no '%s' in\n%s",
		  args, want1, out);
	cr_assert(!want2 || strstr(out, want2), "tierctl %s: no '%s' in\n%s",
		  args, want2, out);
	return out;
}

static struct mkv_segment *real_segment(uint64_t seed)
{
	enum { N = 256, D = 64 };
	struct mkv_encode_opts o;
	struct mkv_segment *g = NULL;
	float *x = malloc(sizeof(float) * N * D);

	cr_assert(x);
	srand((unsigned)seed);
	for (int i = 0; i < N * D; i++)
		x[i] = (float)rand() / RAND_MAX - 0.5f;
	cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
	o.d = D;
	o.r = 16;
	if (seed > 2) { /* layer 1: the serving default's quantized rows */
		o.r = 40;
		o.value_bits = 6;
	}
	cr_assert_eq(mkv_segment_encode(&o, x, MKV_DTYPE_F32, N, &g), 0);
	free(x);
	return g;
}

Test(tierctl, inspect_verify_remove)
{
	char dir[256];
	struct mkv_store_opts o = su_opts();
	struct mkv_store_layout l = su_layout(8);
	struct mkv_store *s = NULL;
	int rc;

	tu_mkdtemp(dir, sizeof dir);
	o.nvme_dir = dir;
	rc = mkv_store_create(&o, &s);
	if (rc == -ENOSYS || rc == -EPERM)
		cr_skip_test("io_uring unavailable");
	cr_assert_eq(rc, 0);
	/* seq 7: four real segments (layers 0, 1; K and V); seq 8: two raw
	 * payloads.  All spilled to NVMe. */
	for (uint32_t i = 0; i < 4; i++) {
		struct mkv_seg_key k = { .seq = 7, .layer = i / 2, .head = 1,
					 .seg = 0, .kind = i % 2 };
		struct mkv_segment *g = real_segment(i + 1);

		cr_assert_eq(mkv_store_put_segment(s, &k, g), 0);
		cr_assert_eq(su_move(s, k, MKV_TIER_NVME), 0);
		mkv_segment_destroy(g);
	}
	for (uint32_t i = 0; i < 2; i++) {
		struct mkv_seg_key k = su_key(8, i);
		char *p = su_payload(8, 300 + i);

		cr_assert_eq(mkv_store_put(s, &k, p, su_len(8), &l), 0);
		cr_assert_eq(su_move(s, k, MKV_TIER_NVME), 0);
		free(p);
	}

	/* A running store owns the directory: tierctl touches nothing. */
	expect(3, "owned by a running store", NULL, "ls %s", dir);
	mkv_store_destroy(s);

	expect(0, "segments  6 adopted", "corrupt   0 frames", "stat %s", dir);
	expect(0, "\n6 segments", "n=256 d=64 r=16 b=16", "ls %s", dir);
	expect(0, "\n2 segments", "n=256 d=64 r=40 b=16 q6", "ls %s --seq 7 --layer 1", dir);
	expect(0, "6 segments read back, 0 bad", NULL, "verify %s", dir);

	/* A flipped bit in one frame: stat and verify say so and fail. */
	su_flip_first_frame(dir);
	expect(1, "segments  5 adopted", "corrupt   1 frames", "stat %s", dir);
	expect(1, "5 segments read back, 1 bad", NULL, "verify %s", dir);

	/* rm: the raw payloads of seq 8 go, durably; the rest stays.  (The
	 * flipped frame may have been one of them.) */
	int left8 = strstr(expect(0, NULL, NULL, "ls %s --seq 8", dir),
			   "\n2 segments") ? 2 : 1;
	char want[64];

	expect(0, "removed, 0 failed", NULL, "rm %s --seq 8", dir);
	expect(0, "\n0 segments", NULL, "ls %s --seq 8", dir);
	snprintf(want, sizeof want, "\n%d segments", 5 - left8);
	expect(0, want, NULL, "ls %s", dir);

	/* The survivors read back through the library, bit-exact. */
	o.nvme_dir = dir;
	cr_assert_eq(mkv_store_create(&o, &s), 0);
	for (uint32_t i = 0; i < 4; i++) {
		struct mkv_seg_key k = { .seq = 7, .layer = i / 2, .head = 1,
					 .seg = 0, .kind = i % 2 };
		struct mkv_segment *g = NULL, *ref = real_segment(i + 1);
		static float a[256 * 64], b[256 * 64];

		if (mkv_store_get_segment(s, &k, &g) == -ENOENT) {
			mkv_segment_destroy(ref);
			continue; /* the flipped frame */
		}
		cr_assert_eq(mkv_segment_decode(g, 0, 256, MKV_SPACE_ORIGINAL, a), 0);
		cr_assert_eq(mkv_segment_decode(ref, 0, 256, MKV_SPACE_ORIGINAL, b), 0);
		cr_assert(memcmp(a, b, sizeof a) == 0, "segment %u changed", i);
		mkv_segment_destroy(g);
		mkv_segment_destroy(ref);
	}
	mkv_store_destroy(s);
	tu_rmtree(dir);
}

Test(tierctl, empty_missing_and_usage)
{
	char dir[256], out[4096], path[600];
	struct stat st;

	tu_mkdtemp(dir, sizeof dir);
	expect(0, "no slab files", NULL, "stat %s", dir);
	snprintf(path, sizeof path, "%s/slab-000000.mkv", dir);
	cr_assert_neq(stat(path, &st), 0, "tierctl created a slab");

	expect(3, "not a directory", NULL, "ls %s/missing", dir);
	cr_assert_eq(tierctl(out, sizeof out, "frob /tmp"), 2);
	cr_assert_eq(tierctl(out, sizeof out, "ls"), 2);
	expect(2, "--seq is required", NULL, "rm %s", dir);
	expect(2, "usage", NULL, "ls %s --seq -3", dir);
	expect(2, "usage", NULL, "stat %s --seq 1", dir);
	tu_rmtree(dir);
}
