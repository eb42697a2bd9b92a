/* SPDX-License-Identifier: MIT */
/*
 * bench/compress — the compression core on the CPU, d = 128, 4096-token
 * segments, synthetic LLM-like KV (tools/synth.h):
 *   1. encoding vectors/s per core, K and V (single thread, bf16 input,
 *      r = 32, drop = 1, g = 1, b = 16), and the cost of strategy choice;
 *   2. bytes per token packed against dense bf16 (K + V), with the
 *      breakdown, at g = 1 and g = 2;
 *   3. attention-output relative error against dense at 25% channels and
 *      10% tokens: uniform top-r without rotation, global mask with
 *      rotation (ThinK), per-vector with rotation (MosaicKV), and Quest.
 * The last line is the machine-readable RESULT.
 *
 * Usage: compress [seed]
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mosaickv.h>
#include "synth.h"

#define D 128
#define SEG 4096
#define NSEG 8
#define WIN 64
#define NKV 4
#define NQ 4
#define NSTEPS 16
#define HIST (SEG * NSEG)
#define NTOK (HIST + WIN)

static double now(clockid_t c)
{
	struct timespec t;
	clock_gettime(c, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void die(const char *what, int err)
{
	fprintf(stderr, "compress: %s: %s\n", what, mkv_strerror(err));
	exit(1);
}

static struct synth_kv kv;

/* Head h, segment s of K (kind KEY) or V. */
static const void *seg_ptr(uint32_t h, uint32_t s, enum mkv_kind kind)
{
	const char *base = kind == MKV_KIND_KEY ? synth_k(&kv, h) : synth_v(&kv, h);
	return base + (size_t)s * SEG * D * 2;
}

static void enc_opts(struct mkv_encode_opts *o, enum mkv_kind kind,
		     uint32_t rotate, uint32_t drop, enum mkv_select sel,
		     uint32_t g)
{
	int err = mkv_encode_opts_init(o, sizeof *o);
	if (err)
		die("mkv_encode_opts_init", err);
	o->d = D;
	o->r = D / 4;
	o->g = g;
	o->b = 16;
	o->drop = drop;
	o->rotate = rotate;
	o->select = sel;
	o->kind = kind;
}

/*
 * Encode segments of head 0 round-robin, one call per sample, until at least
 * @min_s seconds of samples; median per-call CPU time -> vectors/s.
 */
static double enc_rate(enum mkv_kind kind, double min_s, double *wall_vps)
{
	struct mkv_encode_opts o;
	enc_opts(&o, kind, 1, 1, MKV_SELECT_PER_VECTOR, 1);
	double cpu[4096], wall[4096], tot = 0;
	size_t k = 0;
	while ((tot < min_s || k < 5) && k < 4096) {
		struct mkv_segment *s;
		double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
		int err = mkv_segment_encode(&o, seg_ptr(0, (uint32_t)(k % NSEG), kind),
					     MKV_DTYPE_BF16, SEG, &s);
		double c1 = now(CLOCK_PROCESS_CPUTIME_ID), w1 = now(CLOCK_MONOTONIC);
		if (err)
			die("mkv_segment_encode", err);
		mkv_segment_destroy(s);
		cpu[k] = c1 - c0;
		wall[k] = w1 - w0;
		tot += w1 - w0;
		k++;
	}
	qsort(cpu, k, sizeof *cpu, cmp_double);
	qsort(wall, k, sizeof *wall, cmp_double);
	*wall_vps = SEG / wall[k / 2];
	return SEG / cpu[k / 2];
}

/* Median CPU seconds of mkv_strategy_choose on one segment. */
static double strategy_cost(enum mkv_kind kind, double min_s,
			    struct mkv_strategy *out)
{
	struct mkv_strategy_opts so;
	int err = mkv_strategy_opts_init(&so, sizeof so);
	if (err)
		die("mkv_strategy_opts_init", err);
	so.d = D;
	static float R[D * D];
	double cpu[4096], tot = 0;
	size_t k = 0;
	while ((tot < min_s || k < 5) && k < 4096) {
		double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
		err = mkv_strategy_choose(&so, seg_ptr(0, (uint32_t)(k % NSEG), kind),
					  MKV_DTYPE_BF16, SEG, R, out);
		double c1 = now(CLOCK_PROCESS_CPUTIME_ID), w1 = now(CLOCK_MONOTONIC);
		if (err)
			die("mkv_strategy_choose", err);
		cpu[k++] = c1 - c0;
		tot += w1 - w0;
	}
	/* Report the choice for segment 0. */
	err = mkv_strategy_choose(&so, seg_ptr(0, 0, kind), MKV_DTYPE_BF16, SEG, R,
				  out);
	if (err)
		die("mkv_strategy_choose", err);
	qsort(cpu, k, sizeof *cpu, cmp_double);
	return cpu[k / 2];
}

/* Encoded history of every head for one method. */
struct method {
	const char *name;
	uint32_t rotate, drop, g;
	enum mkv_select sel;
	double token_frac;
	struct mkv_segment *k[NKV][NSEG], *v[NKV][NSEG];
	struct mkv_segment_bytes kb, vb; /* summed over heads and segments */
	double err, us;
};

static void bytes_add(struct mkv_segment_bytes *a, const struct mkv_segment *s)
{
	struct mkv_segment_bytes b;
	int err = mkv_segment_bytes(s, &b);
	if (err)
		die("mkv_segment_bytes", err);
	a->values += b.values;
	a->bitmaps += b.bitmaps;
	a->rotation += b.rotation;
	a->summaries += b.summaries;
	a->total += b.total;
	a->dense += b.dense;
}

static void method_encode(struct method *m)
{
	for (uint32_t h = 0; h < NKV; h++)
		for (uint32_t s = 0; s < NSEG; s++) {
			struct mkv_encode_opts ok, ov;
			enc_opts(&ok, MKV_KIND_KEY, m->rotate, m->drop, m->sel, m->g);
			enc_opts(&ov, MKV_KIND_VALUE, m->rotate, m->drop, m->sel, m->g);
			int err = mkv_segment_encode(&ok, seg_ptr(h, s, MKV_KIND_KEY),
						     MKV_DTYPE_BF16, SEG, &m->k[h][s]);
			if (!err)
				err = mkv_segment_encode(&ov, seg_ptr(h, s, MKV_KIND_VALUE),
							 MKV_DTYPE_BF16, SEG, &m->v[h][s]);
			if (err)
				die("mkv_segment_encode", err);
			bytes_add(&m->kb, m->k[h][s]);
			bytes_add(&m->vb, m->v[h][s]);
		}
}

static void method_free(struct method *m)
{
	for (uint32_t h = 0; h < NKV; h++)
		for (uint32_t s = 0; s < NSEG; s++) {
			mkv_segment_destroy(m->k[h][s]);
			mkv_segment_destroy(m->v[h][s]);
		}
}

static double rel_err(const float *o, const float *ref)
{
	double e = 0, r = 0;
	for (uint32_t i = 0; i < D; i++) {
		double x = (double)o[i] - ref[i];
		e += x * x;
		r += (double)ref[i] * ref[i];
	}
	return sqrt(e / r);
}

static void attn_opts(struct mkv_attn_opts *a, double token_frac)
{
	int err = mkv_attn_opts_init(a, sizeof *a);
	if (err)
		die("mkv_attn_opts_init", err);
	a->n_q = NQ;
	a->d = D;
	a->token_frac = token_frac;
	a->quest_b = 16;
}

static struct mkv_dense_kv window(uint32_t h)
{
	return (struct mkv_dense_kv){
		.k = (const char *)synth_k(&kv, h) + (size_t)HIST * D * 2,
		.v = (const char *)synth_v(&kv, h) + (size_t)HIST * D * 2,
		.dtype = MKV_DTYPE_BF16,
		.n = WIN,
	};
}

/* Dense reference outputs: NKV × NSTEPS × NQ × D. */
static float *ref_out;
static double dense_us;

static void dense_all(void)
{
	struct mkv_attn_opts a;
	attn_opts(&a, 1.0);
	ref_out = malloc(sizeof(float) * NKV * NSTEPS * NQ * D);
	if (!ref_out)
		die("malloc", -ENOMEM);
	double t0 = now(CLOCK_PROCESS_CPUTIME_ID);
	for (uint32_t h = 0; h < NKV; h++) {
		struct mkv_dense_kv all = {
			.k = synth_k(&kv, h), .v = synth_v(&kv, h),
			.dtype = MKV_DTYPE_BF16, .n = NTOK,
		};
		for (uint32_t s = 0; s < NSTEPS; s++) {
			int err = mkv_attend_dense(&a, synth_q(&kv, h, s), &all,
						   ref_out + ((size_t)h * NSTEPS + s) * NQ * D);
			if (err)
				die("mkv_attend_dense", err);
		}
	}
	dense_us = (now(CLOCK_PROCESS_CPUTIME_ID) - t0) * 1e6 / (NKV * NSTEPS);
}

static double sel_frac; /* attended share of history tokens (packed) */

static void method_attend(struct method *m)
{
	struct mkv_attn_opts a;
	attn_opts(&a, m->token_frac);
	float out[NQ * D];
	double e = 0, t = 0;
	size_t att = 0, tot = 0;
	for (uint32_t h = 0; h < NKV; h++) {
		struct mkv_dense_kv win = window(h);
		for (uint32_t s = 0; s < NSTEPS; s++) {
			struct mkv_attn_stats st;
			double t0 = now(CLOCK_PROCESS_CPUTIME_ID);
			int err = mkv_attend_packed(&a, synth_q(&kv, h, s),
						    (const struct mkv_segment *const *)m->k[h],
						    (const struct mkv_segment *const *)m->v[h],
						    NSEG, &win, out, &st);
			t += now(CLOCK_PROCESS_CPUTIME_ID) - t0;
			if (err)
				die("mkv_attend_packed", err);
			att += st.tokens_attended - WIN;
			tot += HIST;
			const float *ref = ref_out + ((size_t)h * NSTEPS + s) * NQ * D;
			for (uint32_t q = 0; q < NQ; q++)
				e += rel_err(out + q * D, ref + q * D);
		}
	}
	m->err = e / (NKV * NSTEPS * NQ);
	m->us = t * 1e6 / (NKV * NSTEPS);
	if (m->token_frac < 1.0)
		sel_frac = (double)att / tot;
}

static void quest_attend(double *err, double *us)
{
	struct mkv_attn_opts a;
	attn_opts(&a, 0.1);
	float out[NQ * D];
	double e = 0, t = 0;
	for (uint32_t h = 0; h < NKV; h++) {
		struct mkv_dense_kv hist = {
			.k = synth_k(&kv, h), .v = synth_v(&kv, h),
			.dtype = MKV_DTYPE_BF16, .n = HIST,
		};
		struct mkv_dense_kv win = window(h);
		for (uint32_t s = 0; s < NSTEPS; s++) {
			double t0 = now(CLOCK_PROCESS_CPUTIME_ID);
			int err2 = mkv_attend_quest(&a, synth_q(&kv, h, s), &hist, &win,
						    out, NULL);
			t += now(CLOCK_PROCESS_CPUTIME_ID) - t0;
			if (err2)
				die("mkv_attend_quest", err2);
			const float *ref = ref_out + ((size_t)h * NSTEPS + s) * NQ * D;
			for (uint32_t q = 0; q < NQ; q++)
				e += rel_err(out + q * D, ref + q * D);
		}
	}
	*err = e / (NKV * NSTEPS * NQ);
	*us = t * 1e6 / (NKV * NSTEPS);
}

/*
 * The paper's statistic on this data: the share of a vector's top-25%
 * rotated elements that fall in the segment's top-25% rotated channels
 * (by energy).  Uses an exact encoding (r = d) decoded in rotated space.
 */
static double overlap_stat(enum mkv_kind kind)
{
	struct mkv_encode_opts o;
	enc_opts(&o, kind, 1, 0, MKV_SELECT_PER_VECTOR, 1);
	o.r = D;
	struct mkv_segment *s;
	int err = mkv_segment_encode(&o, seg_ptr(0, 0, kind), MKV_DTYPE_BF16, SEG, &s);
	if (err)
		die("mkv_segment_encode", err);
	float *x = malloc(sizeof(float) * SEG * D);
	if (!x)
		die("malloc", -ENOMEM);
	if ((err = mkv_segment_decode(s, 0, SEG, MKV_SPACE_ROTATED, x)))
		die("mkv_segment_decode", err);
	mkv_segment_destroy(s);
	double en[D] = { 0 };
	for (size_t i = 0; i < (size_t)SEG * D; i++)
		en[i % D] += (double)x[i] * x[i];
	uint8_t glob[D] = { 0 };
	for (int k = 0; k < D / 4; k++) {
		int b = -1;
		for (int c = 0; c < D; c++)
			if (!glob[c] && (b < 0 || en[c] > en[b]))
				b = c;
		glob[b] = 1;
	}
	size_t in = 0;
	for (size_t t = 0; t < SEG; t++) {
		const float *row = x + t * D;
		uint8_t taken[D] = { 0 };
		for (int k = 0; k < D / 4; k++) {
			int b = -1;
			for (int c = 0; c < D; c++)
				if (!taken[c] && (b < 0 || fabsf(row[c]) > fabsf(row[b])))
					b = c;
			taken[b] = 1;
			in += glob[b];
		}
	}
	free(x);
	return (double)in / ((double)SEG * D / 4);
}

static float bf16f(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static int cmp_float_desc(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x < y) - (x > y);
}

/*
 * How peaky the data's attention is: the share of the dense attention that
 * the best 10% of tokens hold (an oracle token selection), and the sink's
 * share, averaged over all query heads.
 */
static void attn_profile(double *top10, double *sink)
{
	float *k = malloc(sizeof(float) * NTOK * D);
	float *p = malloc(sizeof(float) * NTOK);
	if (!k || !p)
		die("malloc", -ENOMEM);
	double st = 0, ss = 0;
	for (uint32_t h = 0; h < NKV; h++) {
		const uint16_t *kb = synth_k(&kv, h);
		for (size_t i = 0; i < (size_t)NTOK * D; i++)
			k[i] = bf16f(kb[i]);
		for (uint32_t s = 0; s < NSTEPS; s++)
			for (uint32_t g = 0; g < NQ; g++) {
				const float *q = synth_q(&kv, h, s) + g * D;
				float mx = -INFINITY;
				for (size_t t = 0; t < NTOK; t++) {
					float a = 0;
					for (uint32_t i = 0; i < D; i++)
						a += q[i] * k[t * D + i];
					p[t] = a / sqrtf((float)D);
					mx = p[t] > mx ? p[t] : mx;
				}
				double z = 0;
				for (size_t t = 0; t < NTOK; t++)
					z += p[t] = expf(p[t] - mx);
				ss += p[0] / z;
				qsort(p, NTOK, sizeof *p, cmp_float_desc);
				double top = 0;
				for (size_t t = 0; t < NTOK / 10; t++)
					top += p[t];
				st += top / z;
			}
	}
	*top10 = st / (NKV * NSTEPS * NQ);
	*sink = ss / (NKV * NSTEPS * NQ);
	free(k);
	free(p);
}

int main(int argc, char **argv)
{
	/* One BLAS thread: the figures are per core.  OpenBLAS reads its
	 * environment when it is loaded, so set it and re-exec once. */
	if (!getenv("OPENBLAS_NUM_THREADS")) {
		setenv("OPENBLAS_NUM_THREADS", "1", 1);
		execv("/proc/self/exe", argv);
		/* exec failed: go on, CPU-time rates stay per core */
	}
	struct synth_opts so;
	synth_opts_default(&so);
	so.n = NTOK;
	so.d = D;
	so.n_kv = NKV;
	so.n_q = NQ;
	so.n_steps = NSTEPS;
	so.dtype = MKV_DTYPE_BF16;
	if (argc > 1)
		so.seed = strtoull(argv[1], NULL, 0);
	double t0 = now(CLOCK_MONOTONIC);
	int err = synth_generate(&so, &kv);
	if (err)
		die("synth_generate", err);
	printf("bench/compress  mosaickv %s  d=%d  segment=%d  history=%d (+%d dense window)  "
	       "KV heads=%d x %d q heads  queries=%d/head  seed=%llu\n",
	       mkv_version(), D, SEG, HIST, WIN, NKV, NQ, NSTEPS,
	       (unsigned long long)so.seed);
	double tgen = now(CLOCK_MONOTONIC) - t0, top10, sinkm;
	attn_profile(&top10, &sinkm);
	printf("data: synthetic (tools/synth.h), generated in %.1f s; dense attention: sink "
	       "%.2f, best 10%% of tokens %.2f (oracle)\n",
	       tgen, sinkm, top10);
	printf("data: a vector's top-25%% rotated elements in the segment's top-25%% "
	       "channels: K %.1f%%, V %.1f%% (paper, real model: 62%%)\n\n",
	       100 * overlap_stat(MKV_KIND_KEY), 100 * overlap_stat(MKV_KIND_VALUE));

	/* 1. Encoding speed. */
	double kw, vw;
	double kvps = enc_rate(MKV_KIND_KEY, 1.0, &kw);
	double vvps = enc_rate(MKV_KIND_VALUE, 1.0, &vw);
	struct mkv_strategy sk, sv;
	double sck = strategy_cost(MKV_KIND_KEY, 0.5, &sk);
	double scv = strategy_cost(MKV_KIND_VALUE, 0.5, &sv);
	printf("encode (bf16 in, r=32 drop=1 g=1 b=16, 1 thread, median)   "
	       "vectors/s/core   (wall)\n");
	printf("  K segment of %d                                           %8.3fM   %8.3fM\n",
	       SEG, kvps / 1e6, kw / 1e6);
	printf("  V segment of %d                                           %8.3fM   %8.3fM\n",
	       SEG, vvps / 1e6, vw / 1e6);
	printf("  strategy choice (mkv_strategy_choose, defaults)  K %.2f ms/segment (%.2fM vec/s) -> r=%u g=%u b=%u loss=%.3f%s\n",
	       sck * 1e3, SEG / sck / 1e6, sk.r, sk.g, sk.b, sk.loss,
	       sk.met ? "" : " (threshold not met)");
	printf("                                                   V %.2f ms/segment (%.2fM vec/s) -> r=%u g=%u b=%u loss=%.3f%s\n\n",
	       scv * 1e3, SEG / scv / 1e6, sv.r, sv.g, sv.b, sv.loss,
	       sv.met ? "" : " (threshold not met)");

	/* 2 and 3: the methods. */
	dense_all();
	struct method ms[] = {
		{ .name = "uniform top-r, no rotation", .rotate = 0, .drop = 0, .g = 1,
		  .sel = MKV_SELECT_PER_VECTOR, .token_frac = 0.1 },
		{ .name = "global mask + rotation (ThinK)", .rotate = 1, .drop = 1, .g = 1,
		  .sel = MKV_SELECT_GLOBAL, .token_frac = 0.1 },
		{ .name = "per-vector + rotation (MosaicKV)", .rotate = 1, .drop = 1, .g = 1,
		  .sel = MKV_SELECT_PER_VECTOR, .token_frac = 0.1 },
		{ .name = "MosaicKV g=2", .rotate = 1, .drop = 1, .g = 2,
		  .sel = MKV_SELECT_PER_VECTOR, .token_frac = 0.1 },
		{ .name = "MosaicKV, all tokens (channels only)", .rotate = 1, .drop = 1, .g = 1,
		  .sel = MKV_SELECT_PER_VECTOR, .token_frac = 1.0 },
	};
	const size_t nm = sizeof ms / sizeof ms[0];
	double sel_mosaic = 0;
	for (size_t i = 0; i < nm; i++) {
		method_encode(&ms[i]);
		method_attend(&ms[i]);
		if (i == 2)
			sel_mosaic = sel_frac;
		method_free(&ms[i]);
	}
	double qerr, qus;
	quest_attend(&qerr, &qus);

	const double ntok = (double)NKV * HIST;
	printf("bytes per token (K+V, per KV head)      values  bitmaps  rotation  summaries   total   dense   ratio\n");
	for (size_t i = 2; i <= 3; i++) {
		const struct method *m = &ms[i];
		for (int kvi = 0; kvi < 2; kvi++) {
			const struct mkv_segment_bytes *b = kvi ? &m->vb : &m->kb;
			printf("  g=%u %s                                %7.2f  %7.2f  %8.2f  %9.2f  %6.2f  %6.1f\n",
			       m->g, kvi ? "V" : "K", b->values / ntok, b->bitmaps / ntok,
			       b->rotation / ntok, b->summaries / ntok, b->total / ntok,
			       b->dense / ntok);
		}
		double tot = (double)(m->kb.total + m->vb.total);
		double den = (double)(m->kb.dense + m->vb.dense);
		printf("  g=%u K+V                                                                    %6.2f  %6.1f  %6.3f\n",
		       m->g, tot / ntok, den / ntok, tot / den);
	}
	printf("\nattention vs dense, 25%% channels (r=32), token_frac=0.1 (%.1f%% of history "
	       "attended incl. sink), window %d, GQA %d\n",
	       100 * sel_mosaic, WIN, NQ);
	printf("  method                                   rel. error    CPU us/step (%d q heads)\n", NQ);
	printf("  dense (reference)                          0           %8.0f\n", dense_us);
	printf("  Quest (dense K/V, b=16, same budget)       %.4f      %8.0f  (bounds rebuilt per call)\n",
	       qerr, qus);
	for (size_t i = 0; i < nm; i++)
		printf("  %-40s %.4f      %8.0f\n", ms[i].name, ms[i].err, ms[i].us);

	const struct method *g1 = &ms[2];
	double ratio = (double)(g1->kb.total + g1->vb.total) /
		       (double)(g1->kb.dense + g1->vb.dense);
	printf("\nRESULT name=compress bytes_ratio=%.4f err_uniform=%.4f err_global=%.4f "
	       "err_pervector=%.4f enc_vps_core=%.0f\n",
	       ratio, ms[0].err, ms[1].err, ms[2].err, kvps < vvps ? kvps : vvps);
	free(ref_out);
	synth_free(&kv);
	return 0;
}
