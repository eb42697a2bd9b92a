/* SPDX-License-Identifier: MIT */
/*
 * bench/append — the decode thread's per-token cost: mkv_seq_append of one
 * token of a layer (every KV head's K and V compressed into its update
 * buffer, and the open segment's loss statistics), in one run with:
 *
 * Part 1, the per-vector pieces of the incremental statistics
 * (mkv_segstats: a caller's own, and the workers' strategy choice when r,
 * g and b are adaptive) and of the update buffer's rotation, each against
 * the way the library did it before (written out here), on synthetic
 * LLM-like keys (tools/synth.h), d = 128:
 *   rot_blas / rot_fixed   a 128 x 128 rotation of one vector: cblas_sgemv
 *                          against mkv_rotate_t (the fixed-order kernel);
 *   cov_syrk / cov_rank1   the covariance's one-row update: a 512-row
 *                          scratch allocated, the row widened, cblas_dsyrk,
 *                          the lower triangle mirrored; against
 *                          mkv_cov_accumulate_f64's rank-1 update (checked
 *                          bit-equal on the upper triangle);
 *   sort_quick / sort_radix  sorting the vector's 128 channel energies: the
 *                          quicksort with an insertion finish it used
 *                          (mkv_sort_desc_quick) against mkv_sort_desc
 *                          (checked equal).
 * A sequence's append itself no longer runs the statistics: its open
 * segment's loss comes from the buffer's own encoding (seg_grow_append).
 * Each repetition times every contender over the same 4,096 vectors in
 * turn; medians over the repetitions, in ns a vector, and ratios.
 *
 * Part 2, a layer's append (32 query heads, 8 KV heads, d = 128, the
 * sequence defaults: 6-bit values, r = 82, no channel drop), CPU path
 * (device_attend 0), after a 4,096-token prefill:
 *   append   mkv_seq_append of one token (f32 K and V of 8 heads);
 *   dense    the same token's K and V rounded to bf16 and copied into a
 *            dense cache: what an engine without compression pays;
 *   threads  the same append to a second sequence whose heads' appends
 *            are shared by --threads threads (mkv_seq_opts.attend_threads,
 *            default 8: one a KV head).
 * Medians over the tokens, in µs per layer.
 *
 * Usage: append [--tokens 2048] [--reps 15] [--seed 1] [--threads 8]
 * Built with -DAPPEND_PUBLIC_ONLY it runs part 2 alone through the public
 * API, so that it links against any build of the library (to compare
 * builds):  cc -O2 -DAPPEND_PUBLIC_ONLY bench/append.c tools/synth.c
 * -Iinclude -Itools -L<build> -lmosaickv -lm -Wl,-rpath,<build>
 * Run with OPENBLAS_NUM_THREADS=1 (BLAS threads only add hand-offs at
 * these sizes).  The last line: RESULT name=append rot_blas_ns=...
 * rot_fixed_ns=... rot_speedup=... cov_syrk_ns=... cov_rank1_ns=...
 * cov_speedup=... sort_quick_ns=... sort_radix_ns=... sort_speedup=...
 * append_us_per_layer=... dense_us_per_layer=... append_vs_dense=...
 * threads=... append_threads_us_per_layer=... threads_speedup=...
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mosaickv.h>
#include "synth.h"
#ifndef APPEND_PUBLIC_ONLY
#include <cblas.h>
#include "mosaickv/internal.h"
#endif

#define D 128
#define NV 4096
#define HKV 8

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(double *x, int n)
{
	qsort(x, (size_t)n, sizeof *x, cmp_double);
	return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* f32 to bf16, nearest even (finite input), as an engine's cast does */
static inline uint16_t bf16(float f)
{
	uint32_t b;
	memcpy(&b, &f, 4);
	return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

static void die(const char *what, int err)
{
	fprintf(stderr, "append: %s: %s\n", what, mkv_strerror(err));
	exit(1);
}

#ifndef APPEND_PUBLIC_ONLY
/* The covariance's one-row update as the library made it before: a
 * 512-row chunk's scratch, the row widened, SYRK, the mirror. */
static int cov_syrk(double *cov, const float *x, uint32_t d)
{
	double *xd = malloc(sizeof(double) * 512 * d);
	if (!xd)
		return -ENOMEM;
	for (uint32_t i = 0; i < d; i++)
		xd[i] = x[i];
	cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)d, 1, 1.0, xd, (int)d, 1.0, cov,
		    (int)d);
	for (uint32_t a = 0; a < d; a++)
		for (uint32_t b = a + 1; b < d; b++)
			cov[b * d + a] = cov[a * d + b];
	free(xd);
	return 0;
}

#endif

int main(int argc, char **argv)
{
	uint32_t tokens = 2048, reps = 15, threads = HKV;
	uint64_t seed = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
			tokens = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
			reps = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
			seed = strtoull(argv[++i], NULL, 10);
		else {
			fprintf(stderr, "usage: append [--tokens N] [--reps N] [--seed N]\n");
			return 2;
		}
	}
	if (tokens < 16 || reps < 1)
		die("--tokens must be >= 16 and --reps >= 1", -EINVAL);

	/* synthetic keys of 8 heads: the prefill, the appended tokens and
	 * part 1's vectors */
	struct synth_opts so;
	synth_opts_default(&so);
	so.n = 4096 + tokens;
	so.d = D;
	so.n_kv = HKV;
	so.n_steps = 0;
	so.seed = seed;
	so.dtype = MKV_DTYPE_F32;
	struct synth_kv kv;
	int rc = synth_generate(&so, &kv);
	if (rc)
		die("synth", rc);

	double rb = NAN, rf = NAN, cs = NAN, cr = NAN, sq = NAN, sr = NAN, sink = 0.0;
#ifndef APPEND_PUBLIC_ONLY
	/* ---- part 1: the pieces, per vector ---- */
	const float *X = synth_k(&kv, 0); /* head 0's first NV keys */
	float *R = malloc(sizeof(float) * D * D), *RT = malloc(sizeof(float) * D * D);
	double *cov = calloc((size_t)D * D, sizeof(double));
	if (!R || !RT || !cov)
		die("alloc", -ENOMEM);
	if ((rc = mkv_cov_accumulate_f64(cov, X, NV, D, NULL)) ||
	    (rc = mkv_eigen_rows(cov, D, R, NULL)))
		die("rotation", rc);
	mkv_transpose(R, D, D, RT);
	float *Y = malloc(sizeof(float) * NV * D), *E = malloc(sizeof(float) * NV * D);
	float *E2 = malloc(sizeof(float) * NV * D), y[D];
	double *ca = calloc((size_t)D * D, sizeof(double)), *cb = calloc((size_t)D * D, sizeof(double));
	if (!Y || !E || !E2 || !ca || !cb)
		die("alloc", -ENOMEM);
	for (uint32_t i = 0; i < NV; i++) {
		mkv_rotate_t(RT, D, D, X + (size_t)i * D, Y + (size_t)i * D);
		for (uint32_t c = 0; c < D; c++)
			E[(size_t)i * D + c] = Y[(size_t)i * D + c] * Y[(size_t)i * D + c];
	}
	double *t_rb = malloc(sizeof(double) * reps * 6), *t_rf = t_rb + reps, *t_cs = t_rf + reps,
	       *t_cr = t_cs + reps, *t_sq = t_cr + reps, *t_sr = t_sq + reps;
	if (!t_rb)
		die("alloc", -ENOMEM);
	for (uint32_t r = 0; r < reps; r++) {
		double t0 = now();
		for (uint32_t i = 0; i < NV; i++) {
			cblas_sgemv(CblasRowMajor, CblasNoTrans, D, D, 1.0f, R, D, X + (size_t)i * D,
				    1, 0.0f, y, 1);
			sink += y[i % D];
		}
		double t1 = now();
		for (uint32_t i = 0; i < NV; i++) {
			mkv_rotate_t(RT, D, D, X + (size_t)i * D, y);
			sink += y[i % D];
		}
		double t2 = now();
		for (uint32_t i = 0; i < NV; i++)
			if ((rc = cov_syrk(ca, X + (size_t)i * D, D)))
				die("cov_syrk", rc);
		double t3 = now();
		for (uint32_t i = 0; i < NV; i++)
			(void)mkv_cov_accumulate_f64(cb, X + (size_t)i * D, 1, D, NULL);
		double t4 = now();
		memcpy(E2, E, sizeof(float) * NV * D);
		double t5 = now();
		for (uint32_t i = 0; i < NV; i++)
			mkv_sort_desc_quick(E2 + (size_t)i * D, D);
		double t6 = now();
		memcpy(Y, E, sizeof(float) * NV * D);
		double t7 = now();
		for (uint32_t i = 0; i < NV; i++)
			mkv_sort_desc(Y + (size_t)i * D, D);
		double t8 = now();
		t_rb[r] = (t1 - t0) / NV * 1e9;
		t_rf[r] = (t2 - t1) / NV * 1e9;
		t_cs[r] = (t3 - t2) / NV * 1e9;
		t_cr[r] = (t4 - t3) / NV * 1e9;
		t_sq[r] = (t6 - t5) / NV * 1e9;
		t_sr[r] = (t8 - t7) / NV * 1e9;
		if (memcmp(E2, Y, sizeof(float) * NV * D)) {
			fprintf(stderr, "append: the sorts differ\n");
			return 1;
		}
	}
	for (uint32_t a = 0; a < D; a++)
		if (memcmp(ca + (size_t)a * D + a, cb + (size_t)a * D + a, sizeof(double) * (D - a))) {
			fprintf(stderr, "append: the covariances differ in row %u\n", a);
			return 1;
		}
	rb = median(t_rb, (int)reps);
	rf = median(t_rf, (int)reps);
	cs = median(t_cs, (int)reps);
	cr = median(t_cr, (int)reps);
	sq = median(t_sq, (int)reps);
	sr = median(t_sr, (int)reps);
	printf("part 1: per vector, d = %d, median of %u repetitions over %d vectors (ns)\n", D,
	       reps, NV);
	printf("  rotation    blas %8.1f  fixed %8.1f  x%.2f\n", rb, rf, rb / rf);
	printf("  covariance  syrk %8.1f  rank1 %8.1f  x%.2f (bit-equal)\n", cs, cr, cs / cr);
	printf("  sort        quick %7.1f  radix %8.1f  x%.2f (equal)\n", sq, sr, sq / sr);

	free(R);
	free(RT);
	free(cov);
	free(Y);
	free(E);
	free(E2);
	free(ca);
	free(cb);
	free(t_rb);
#endif

	/* ---- part 2: a layer's append ---- */
	struct mkv_store_opts sto;
	mkv_store_opts_init(&sto, sizeof sto);
	sto.gpu = -1;
	sto.workers = 1;
	struct mkv_store *st;
	if ((rc = mkv_store_create(&sto, &st)))
		die("store", rc);
	struct mkv_seq_opts qo;
	mkv_seq_opts_init(&qo, sizeof qo);
	qo.layers = 1;
	qo.kv_heads = HKV;
	qo.d = D;
	qo.device_attend = 0;
	/* one open segment for the whole run: no close, no worker */
	qo.min_segment = 65536;
	struct mkv_seq *s, *s2;
	if ((rc = mkv_seq_open(st, &qo, 1, &s)))
		die("seq_open", rc);
	/* the same sequence with its heads' appends shared by @threads threads */
	qo.attend_threads = threads;
	if ((rc = mkv_seq_open(st, &qo, 2, &s2)))
		die("seq_open (threads)", rc);
	float *pk = malloc(sizeof(float) * HKV * 4096 * D), *pv = malloc(sizeof(float) * HKV * 4096 * D);
	float *tk = malloc(sizeof(float) * HKV * D), *tv = malloc(sizeof(float) * HKV * D);
	uint16_t *dense = malloc(sizeof(uint16_t) * 2 * (size_t)tokens * HKV * D);
	double *ta = malloc(sizeof(double) * tokens), *td = malloc(sizeof(double) * tokens);
	double *tt = malloc(sizeof(double) * tokens);
	if (!pk || !pv || !tk || !tv || !dense || !ta || !td || !tt)
		die("alloc", -ENOMEM);
	/* an engine's cache is allocated ahead: no first touch in the timing */
	memset(dense, 0, sizeof(uint16_t) * 2 * (size_t)tokens * HKV * D);
	for (uint32_t h = 0; h < HKV; h++) {
		memcpy(pk + (size_t)h * 4096 * D, synth_k(&kv, h), sizeof(float) * 4096 * D);
		memcpy(pv + (size_t)h * 4096 * D, synth_v(&kv, h), sizeof(float) * 4096 * D);
	}
	if ((rc = mkv_seq_prefill(s, 0, pk, pv, MKV_DTYPE_F32, 4096)) ||
	    (rc = mkv_seq_prefill(s2, 0, pk, pv, MKV_DTYPE_F32, 4096)))
		die("prefill", rc);
	for (uint32_t t = 0; t < tokens; t++) {
		for (uint32_t h = 0; h < HKV; h++) {
			const float *k = (const float *)synth_k(&kv, h) + (4096 + (size_t)t) * D;
			const float *v = (const float *)synth_v(&kv, h) + (4096 + (size_t)t) * D;
			memcpy(tk + (size_t)h * D, k, sizeof(float) * D);
			memcpy(tv + (size_t)h * D, v, sizeof(float) * D);
		}
		double t0 = now();
		if ((rc = mkv_seq_append(&s, 1, 0, tk, tv, MKV_DTYPE_F32)))
			die("append", rc);
		double t1 = now();
		uint16_t *dk = dense + (size_t)t * 2 * HKV * D, *dv = dk + HKV * D;
		for (uint32_t i = 0; i < HKV * D; i++) {
			dk[i] = bf16(tk[i]);
			dv[i] = bf16(tv[i]);
		}
		double t2 = now();
		if ((rc = mkv_seq_append(&s2, 1, 0, tk, tv, MKV_DTYPE_F32)))
			die("append (threads)", rc);
		double t3 = now();
		ta[t] = (t1 - t0) * 1e6;
		td[t] = (t2 - t1) * 1e6;
		tt[t] = (t3 - t2) * 1e6;
	}
	double am = median(ta, (int)tokens), dm = median(td, (int)tokens);
	double tm = median(tt, (int)tokens);
	printf("part 2: a layer's append (%d KV heads, d = %d, sequence defaults, CPU path), "
	       "median of %u tokens after a 4,096-token prefill (us)\n",
	       HKV, D, tokens);
	printf("  append %8.2f  dense %8.3f  append / dense %.0f\n", am, dm, am / dm);
	printf("  append on %u threads (attend_threads) %8.2f  x%.2f\n", threads, tm, am / tm);
	printf("(sink %g)\n", sink);
	printf("RESULT name=append rot_blas_ns=%.1f rot_fixed_ns=%.1f rot_speedup=%.2f "
	       "cov_syrk_ns=%.1f cov_rank1_ns=%.1f cov_speedup=%.2f sort_quick_ns=%.1f "
	       "sort_radix_ns=%.1f sort_speedup=%.2f append_us_per_layer=%.2f "
	       "dense_us_per_layer=%.3f append_vs_dense=%.1f threads=%u "
	       "append_threads_us_per_layer=%.2f threads_speedup=%.2f\n",
	       rb, rf, rb / rf, cs, cr, cs / cr, sq, sr, sq / sr, am, dm, am / dm, threads, tm,
	       am / tm);
	mkv_seq_close(s);
	mkv_seq_close(s2);
	mkv_store_destroy(st);
	synth_free(&kv);
	free(pk);
	free(pv);
	free(tk);
	free(tv);
	free(dense);
	free(ta);
	free(td);
	free(tt);
	return 0;
}
