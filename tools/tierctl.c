/* SPDX-License-Identifier: MIT */
/*
 * tierctl — look into a store's NVMe directory from outside the server.
 *
 *   tierctl stat   DIR              what a reopen finds: slab files, segments
 *                                   adopted, frames corrupt or incomplete
 *   tierctl ls     DIR [FILTER]     the segments, one line each
 *   tierctl verify DIR [FILTER]     read every segment back through the tier
 *                                   (checksums and payload hash)
 *   tierctl rm     DIR FILTER       remove segments, durably (tombstones)
 *
 * FILTER: --seq N, --layer N, --head N (any combination; rm needs --seq).
 *
 * It opens the directory the way a server's store does (mkv_store_create
 * with nvme_dir), so it sees exactly what a restarted server would adopt,
 * and it takes the same lock: while a server owns the directory tierctl
 * says so and touches nothing.  It never creates a slab: a directory
 * without slab files is reported and left alone.
 *
 * Exit status: 0 ok; 1 something corrupt or unreadable was found (stat,
 * verify) or a removal failed; 2 usage; 3 the directory cannot be opened
 * (missing, owned by a running store, no io_uring).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <mosaickv.h>

struct filter {
	int64_t seq, layer, head; /* -1: any */
};

struct keys {
	struct mkv_seg_key *k;
	struct mkv_seg_info *info;
	size_t n, cap;
	int oom;
	const struct filter *f;
};

static int usage(void)
{
	fprintf(stderr,
		"usage: tierctl stat DIR\n"
		"       tierctl ls DIR [--seq N] [--layer N] [--head N]\n"
		"       tierctl verify DIR [--seq N] [--layer N] [--head N]\n"
		"       tierctl rm DIR --seq N [--layer N] [--head N]\n");
	return 2;
}

static int match(const struct filter *f, const struct mkv_seg_key *k)
{
	return (f->seq < 0 || (uint64_t)f->seq == k->seq) &&
	       (f->layer < 0 || f->layer == k->layer) &&
	       (f->head < 0 || f->head == k->head);
}

/* mkv_store_list callback: collect (the directory is locked; no calls). */
static void collect(void *arg, const struct mkv_seg_key *k,
		    const struct mkv_seg_info *info)
{
	struct keys *ks = arg;

	if (ks->oom || !match(ks->f, k))
		return;
	if (ks->n == ks->cap) {
		size_t cap = ks->cap ? 2 * ks->cap : 256;
		struct mkv_seg_key *nk = realloc(ks->k, cap * sizeof *nk);
		struct mkv_seg_info *ni;

		if (!nk) {
			ks->oom = 1;
			return;
		}
		ks->k = nk;
		ni = realloc(ks->info, cap * sizeof *ni);
		if (!ni) {
			ks->oom = 1;
			return;
		}
		ks->info = ni;
		ks->cap = cap;
	}
	ks->k[ks->n] = *k;
	ks->info[ks->n++] = *info;
}

static int key_cmp(const void *a, const void *b)
{
	const struct mkv_seg_key *x = a, *y = b;

	if (x->seq != y->seq)
		return x->seq < y->seq ? -1 : 1;
	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	if (x->head != y->head)
		return x->head < y->head ? -1 : 1;
	if (x->seg != y->seg)
		return x->seg < y->seg ? -1 : 1;
	return x->kind < y->kind ? -1 : x->kind > y->kind;
}

/* Slab files in @dir: count and bytes; -errno if it cannot be read. */
static int slabs(const char *dir, int print, unsigned *n, uint64_t *bytes)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d)
		return -errno;
	*n = 0;
	*bytes = 0;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		char path[4096];
		struct stat st;

		if (strncmp(e->d_name, "slab-", 5) || l < 9 ||
		    strcmp(e->d_name + l - 4, ".mkv"))
			continue;
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		if (stat(path, &st))
			continue;
		(*n)++;
		*bytes += (uint64_t)st.st_size;
		if (print)
			printf("  %s  %.1f MiB\n", e->d_name,
			       (double)st.st_size / 1048576.0);
	}
	closedir(d);
	return 0;
}

static int open_dir(const char *dir, struct mkv_store **out)
{
	struct mkv_store_opts o;
	struct stat st;
	unsigned n;
	uint64_t bytes;
	int rc;

	if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "tierctl: %s: not a directory\n", dir);
		return 3;
	}
	rc = slabs(dir, 0, &n, &bytes);
	if (rc) {
		fprintf(stderr, "tierctl: %s: %s\n", dir, mkv_strerror(rc));
		return 3;
	}
	if (n == 0) {
		/* Opening would create the first slab: say so instead. */
		printf("%s: no slab files: not a store directory, or never used\n",
		       dir);
		return -1;
	}
	rc = mkv_store_opts_init(&o, sizeof o);
	if (rc)
		return 3;
	o.nvme_dir = dir;
	o.gpu = -1;              /* nothing is fetched to a device */
	o.hbm_bytes = 1 << 20;   /* the upper tiers hold nothing */
	o.host_bytes = 1 << 20;
	o.nvme_bytes = bytes;    /* no slab beyond those there */
	o.workers = 1;
	o.auto_balance = 0;      /* nothing moves */
	rc = mkv_store_create(&o, out);
	if (rc == -EBUSY) {
		fprintf(stderr, "tierctl: %s is owned by a running store "
			"(stop it first): nothing done\n", dir);
		return 3;
	}
	if (rc) {
		fprintf(stderr, "tierctl: cannot open %s: %s\n", dir,
			mkv_strerror(rc));
		return 3;
	}
	return 0;
}

static const char *kind_name(uint32_t kind)
{
	return kind == MKV_KIND_KEY ? "K" : kind == MKV_KIND_VALUE ? "V" : "?";
}

static int list(struct mkv_store *s, const struct filter *f, struct keys *ks)
{
	int64_t rc;

	memset(ks, 0, sizeof *ks);
	ks->f = f;
	rc = mkv_store_list(s, collect, ks);
	if (rc < 0 || ks->oom) {
		fprintf(stderr, "tierctl: listing failed: %s\n",
			mkv_strerror(rc < 0 ? (int)rc : -ENOMEM));
		return 1;
	}
	/* Sort keys and infos together: through an index. */
	struct { struct mkv_seg_key k; struct mkv_seg_info i; } *t =
		malloc((ks->n ? ks->n : 1) * sizeof *t);

	if (!t)
		return 1;
	for (size_t i = 0; i < ks->n; i++) {
		t[i].k = ks->k[i];
		t[i].i = ks->info[i];
	}
	qsort(t, ks->n, sizeof *t, key_cmp); /* the key is the first member */
	for (size_t i = 0; i < ks->n; i++) {
		ks->k[i] = t[i].k;
		ks->info[i] = t[i].i;
	}
	free(t);
	return 0;
}

static int cmd_stat(struct mkv_store *s, const char *dir)
{
	struct mkv_store_stats st = { .size = sizeof st };
	unsigned n;
	uint64_t bytes;

	if (mkv_store_get_stats(s, &st))
		return 1;
	printf("%s\n", dir);
	(void)slabs(dir, 1, &n, &bytes);
	printf("slabs     %u, %.1f MiB\n", n, (double)bytes / 1048576.0);
	printf("segments  %" PRIu64 " adopted, %.1f MiB stored\n",
	       st.reopen_adopted,
	       (double)st.tier[MKV_TIER_NVME].used / 1048576.0);
	printf("corrupt   %" PRIu64 " frames (failed a check: ignored, space "
	       "reused)\n", st.reopen_corrupt);
	printf("partial   %" PRIu64 " interrupted slab creations (removed)\n",
	       st.reopen_incomplete);
	return st.reopen_corrupt ? 1 : 0;
}

static int cmd_ls(struct mkv_store *s, const struct filter *f)
{
	struct keys ks;
	int rc = list(s, f, &ks);

	if (rc)
		return rc;
	printf("%-10s %6s %5s %6s %4s %10s %7s  %s\n", "seq", "layer", "head",
	       "seg", "kind", "bytes", "blocks", "segment");
	for (size_t i = 0; i < ks.n; i++) {
		struct mkv_segment *g = NULL;
		struct mkv_packed_view v;
		char shape[96] = "-";

		/* Payloads written by mkv_store_put_segment describe their
		 * shape; other payloads are opaque bytes. */
		if (mkv_store_get_segment(s, &ks.k[i], &g) == 0 &&
		    mkv_segment_view(g, &v) == 0)
			snprintf(shape, sizeof shape, "n=%u d=%u r=%u b=%u%s%s", v.n,
				 v.d, v.r, v.b, v.value_bits == 0 ? "" :
				 v.value_bits == 4 ? " q4" : v.value_bits == 5 ? " q5" :
				 v.value_bits == 6 ? " q6" : v.value_bits == 7 ? " q7" : " q8",
				 v.d_keep < v.d ? " drop" : "");
		mkv_segment_destroy(g);
		printf("%-10" PRIu64 " %6u %5u %6u %4s %10" PRIu64 " %7u  %s\n",
		       ks.k[i].seq, ks.k[i].layer, ks.k[i].head, ks.k[i].seg,
		       kind_name(ks.k[i].kind), ks.info[i].len,
		       ks.info[i].n_blocks, shape);
	}
	printf("%zu segments\n", ks.n);
	free(ks.k);
	free(ks.info);
	return 0;
}

static int cmd_verify(struct mkv_store *s, const struct filter *f)
{
	struct keys ks;
	size_t bad = 0, cap = 0;
	char *buf = NULL;
	int rc = list(s, f, &ks);

	if (rc)
		return rc;
	for (size_t i = 0; i < ks.n; i++) {
		int64_t got;

		if (ks.info[i].len > cap) {
			char *nb = realloc(buf, ks.info[i].len);

			if (!nb) {
				fprintf(stderr, "tierctl: out of memory\n");
				bad++;
				break;
			}
			buf = nb;
			cap = ks.info[i].len;
		}
		got = mkv_store_read(s, &ks.k[i], buf, cap);
		if (got != (int64_t)ks.info[i].len) {
			bad++;
			printf("BAD  seq %" PRIu64 " layer %u head %u seg %u %s: %s\n",
			       ks.k[i].seq, ks.k[i].layer, ks.k[i].head,
			       ks.k[i].seg, kind_name(ks.k[i].kind),
			       got < 0 ? mkv_strerror((int)got) : "short read");
		}
	}
	{
		/* Frames that failed their check at open were never adopted:
		 * they are lost data too. */
		struct mkv_store_stats st = { .size = sizeof st };

		if (mkv_store_get_stats(s, &st) == 0 && st.reopen_corrupt) {
			printf("%" PRIu64 " corrupt frames found at open (not "
			       "readable, ignored)\n", st.reopen_corrupt);
			bad += st.reopen_corrupt;
		}
	}
	printf("%zu segments read back, %zu bad\n", ks.n, bad);
	free(buf);
	free(ks.k);
	free(ks.info);
	return bad ? 1 : 0;
}

static int cmd_rm(struct mkv_store *s, const struct filter *f)
{
	struct keys ks;
	size_t failed = 0;
	int rc = list(s, f, &ks);

	if (rc)
		return rc;
	for (size_t i = 0; i < ks.n; i++) {
		rc = mkv_store_remove(s, &ks.k[i]);
		if (rc) {
			failed++;
			printf("FAILED seq %" PRIu64 " layer %u head %u seg %u: %s\n",
			       ks.k[i].seq, ks.k[i].layer, ks.k[i].head,
			       ks.k[i].seg, mkv_strerror(rc));
		}
	}
	printf("%zu segments removed, %zu failed\n", ks.n - failed, failed);
	free(ks.k);
	free(ks.info);
	return failed ? 1 : 0;
}

static int parse_num(const char *s, int64_t *out)
{
	char *end;
	unsigned long long v;

	if (!s || !*s || *s == '-')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v > INT64_MAX)
		return -1;
	*out = (int64_t)v;
	return 0;
}

int main(int argc, char **argv)
{
	struct filter f = { -1, -1, -1 };
	struct mkv_store *s = NULL;
	const char *cmd, *dir;
	int rc;

	if (argc < 3)
		return usage();
	cmd = argv[1];
	dir = argv[2];
	for (int i = 3; i < argc; i++) {
		int64_t *dst = !strcmp(argv[i], "--seq")     ? &f.seq
			       : !strcmp(argv[i], "--layer") ? &f.layer
			       : !strcmp(argv[i], "--head")  ? &f.head
							     : NULL;

		if (!dst || i + 1 >= argc || parse_num(argv[++i], dst))
			return usage();
	}
	if (strcmp(cmd, "stat") && strcmp(cmd, "ls") && strcmp(cmd, "verify") &&
	    strcmp(cmd, "rm"))
		return usage();
	if (!strcmp(cmd, "stat") && (f.seq >= 0 || f.layer >= 0 || f.head >= 0))
		return usage();
	if (!strcmp(cmd, "rm") && f.seq < 0) {
		fprintf(stderr, "tierctl rm: --seq is required\n");
		return 2;
	}
	rc = open_dir(dir, &s);
	if (rc)
		return rc < 0 ? 0 : rc; /* -1: nothing there, said so */
	if (!strcmp(cmd, "stat"))
		rc = cmd_stat(s, dir);
	else if (!strcmp(cmd, "ls"))
		rc = cmd_ls(s, &f);
	else if (!strcmp(cmd, "verify"))
		rc = cmd_verify(s, &f);
	else
		rc = cmd_rm(s, &f);
	mkv_store_destroy(s);
	return rc;
}
