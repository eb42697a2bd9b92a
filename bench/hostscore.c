/* SPDX-License-Identifier: MIT */
/*
 * bench/hostscore — block scores on the CPU path (mkv_score_blocks, the
 * scoring every host-path attend runs over every history block), four
 * contenders over the same encoded keys in one run:
 *   scalar    the bound as the library computed it before bound_score_t: a
 *             head at a time, each summary widened per head (the rotation
 *             and |q_perp| as the library makes them; written out here);
 *   bound     summary_bits = 16: the bf16 summaries' bound;
 *   s8_step   summary_bits = 8, each block's 8-bit row made during the
 *             score (mkv_summary8's rule: 2S divisions a block), as for
 *             a segment that keeps none;
 *   s8_kept   summary_bits = 8 over rows made once (seg_make_sum8, what
 *             a sequence's final key skeletons keep with summary_bits 8).
 * scalar and bound, and s8_step and s8_kept, must give the same scores, bit
 * for bit (checked; exit 1 otherwise).
 * Then the keys' dot products of PackedAttention on the CPU, every row of
 * every segment against the 4 rotated queries, two contenders:
 *   kdot_unpack  the row widened to d_keep floats (packed_unpack_row), then
 *                a dot product per head (attention.c's dot, written out);
 *   kdot_packed  packed_dot_row: straight from the packed row;
 * checked bit-equal.  Synthetic LLM-like keys (tools/synth.h), bf16, d =
 * 128, r = 32, S = 32, b = 16, 16,384-token segments, 4 query heads.
 * Each repetition times the three on every segment in turn (interleaved,
 * so drift hits all alike); the median over repetitions is reported, per
 * block and as ratios.
 *
 * Usage: hostscore [--tokens 262144] [--reps 15] [--seed 1]
 * The last line: RESULT name=hostscore scalar_ns_per_block=... bound_ns_per_block=...
 * s8_step_ns_per_block=... s8_kept_ns_per_block=... bound_vs_scalar=...
 * kept_vs_step=... kept_vs_bound=... kdot_unpack_ns_per_row=...
 * kdot_packed_ns_per_row=... kdot_packed_vs_unpack=...
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <mosaickv.h>
#include "mosaickv/internal.h"
#include "synth.h"

#define D 128
#define NQ 4
#define SEG 16384

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

static void die(const char *what, int err)
{
	fprintf(stderr, "hostscore: %s: %s\n", what, mkv_strerror(err));
	exit(1);
}

/* The bound before bound_score_t (attention.c's bound_score, its rotation
 * and |q_perp| as score_all makes them): a head at a time. */
static void scalar_scores(const struct mkv_segment *k, const float *q, float *qr,
			  float *scores)
{
	const struct mkv_packed_view *kv = &k->v;
	uint32_t S = kv->summary_channels;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, NQ, (int)S, D, 1.0f, q, D,
		    k->rot_f32, D, 0.0f, qr, (int)S);
	float qperp[NQ];
	for (uint32_t h = 0; h < NQ; h++)
		qperp[h] = mkv_rest_norm(q + (size_t)h * D, D, qr + (size_t)h * S, S);
	for (uint32_t j = 0; j < kv->n_blocks; j++) {
		float rest = mkv_elem(kv->sum_rest, kv->store_dtype, j), best = -INFINITY;
		for (uint32_t h = 0; h < NQ; h++) {
			const float *qh = qr + (size_t)h * S;
			float s = 0.0f;
			for (uint32_t c = 0; c < S; c++) {
				float a = qh[c] * mkv_elem(kv->sum_min, kv->store_dtype, (size_t)j * S + c);
				float b = qh[c] * mkv_elem(kv->sum_max, kv->store_dtype, (size_t)j * S + c);
				s += a > b ? a : b;
			}
			s += qperp[h] * rest;
			best = s > best ? s : best;
		}
		scores[j] = best;
	}
}

/* attention.c's dot: eight partial sums by channel % 8, one tree */
static float dot8(const float *a, const float *b, uint32_t n)
{
	float p[8] = {0};
	uint32_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (uint32_t u = 0; u < 8; u++)
			p[u] += a[i + u] * b[i + u];
	for (; i < n; i++)
		p[i & 7] += a[i] * b[i];
	return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

/* Every row's NQ key dots: widened then dotted (@packed 0), or
 * packed_dot_row (@packed 1); a checksum of the bits into *@sum. */
static void kdots(const struct mkv_segment *k, const float *qr, const float *qt, float *kb,
		  int packed, uint64_t *sum)
{
	const struct mkv_packed_view *kv = &k->v;
	uint64_t h = *sum;
	for (size_t t = 0; t < kv->n; t++) {
		float o[NQ];
		if (packed) {
			if (!packed_dot_row(kv, k->values, k->bitmaps, t, qt, NQ, o))
				die("packed_dot_row", -EINVAL);
		} else {
			packed_unpack_row(kv, k->values, k->bitmaps, t, kb);
			for (uint32_t q = 0; q < NQ; q++)
				o[q] = dot8(qr + (size_t)q * kv->d_keep, kb, kv->d_keep);
		}
		uint32_t b[NQ];
		memcpy(b, o, sizeof b);
		for (uint32_t q = 0; q < NQ; q++)
			h = (h ^ b[q]) * 1099511628211ull;
	}
	*sum = h;
}

static double median(double *x, int n)
{
	qsort(x, (size_t)n, sizeof *x, cmp_double);
	return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

int main(int argc, char **argv)
{
	uint32_t tokens = 262144;
	int reps = 15;
	uint64_t seed = 1;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--tokens"))
			tokens = (uint32_t)strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--reps"))
			reps = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--seed"))
			seed = strtoull(argv[i + 1], NULL, 0);
		else {
			fprintf(stderr, "hostscore: unknown option %s\n", argv[i]);
			return 2;
		}
	}
	if (tokens < SEG || tokens % SEG || reps < 1 || reps > 1000) {
		fprintf(stderr, "hostscore: --tokens a multiple of %d, --reps 1..1000\n", SEG);
		return 2;
	}
	struct synth_opts so;
	synth_opts_default(&so);
	so.n = tokens;
	so.d = D;
	so.n_kv = 1;
	so.n_q = NQ;
	so.n_steps = 1;
	so.dtype = MKV_DTYPE_BF16;
	so.seed = seed;
	struct synth_kv kv;
	int err = synth_generate(&so, &kv);
	if (err)
		die("synth_generate", err);
	uint32_t nseg = tokens / SEG;
	struct mkv_segment **ks = calloc(nseg, sizeof *ks);
	int8_t **rows = calloc(nseg, sizeof *rows);
	float **scales = calloc(nseg, sizeof *scales);
	if (!ks || !rows || !scales)
		die("calloc", -ENOMEM);
	struct mkv_encode_opts eo;
	mkv_encode_opts_init(&eo, sizeof eo);
	eo.d = D;
	eo.r = 32;
	eo.b = 16;
	eo.kind = MKV_KIND_KEY;
	eo.summary_channels = 32;
	const uint16_t *k = synth_k(&kv, 0);
	for (uint32_t s = 0; s < nseg; s++) {
		if ((err = mkv_segment_encode(&eo, k + (size_t)s * SEG * D, MKV_DTYPE_BF16, SEG,
					      &ks[s])))
			die("mkv_segment_encode", err);
		if ((err = seg_make_sum8(ks[s])))
			die("seg_make_sum8", err);
		/* held aside: s8_step runs without them, s8_kept with */
		rows[s] = ks[s]->sum8;
		scales[s] = ks[s]->sum8_scale;
		ks[s]->sum8 = NULL;
		ks[s]->sum8_scale = NULL;
	}
	uint32_t nb = ks[0]->v.n_blocks, S = ks[0]->v.summary_channels;
	const float *q = synth_q(&kv, 0, 0);
	struct mkv_attn_opts a16, a8;
	mkv_attn_opts_init(&a16, sizeof a16);
	a16.n_q = NQ;
	a16.d = D;
	a8 = a16;
	a8.summary_bits = 8;
	float *sc_step = malloc(sizeof(float) * nb), *sc_kept = malloc(sizeof(float) * nb);
	float *sc_scalar = malloc(sizeof(float) * nb), *sc_bound = malloc(sizeof(float) * nb);
	float *qr = malloc(sizeof(float) * NQ * S);
	double *t[4];
	for (int c = 0; c < 4; c++)
		t[c] = calloc((size_t)reps, sizeof(double));
	if (!sc_step || !sc_kept || !sc_scalar || !sc_bound || !qr || !t[0] || !t[1] || !t[2] ||
	    !t[3])
		die("malloc", -ENOMEM);
	uint64_t differ = 0, differ16 = 0;
	for (int r = -1; r < reps; r++) { /* r = -1: warm-up, untimed */
		double acc[4] = {0, 0, 0, 0};
		for (uint32_t s = 0; s < nseg; s++) {
			double tm = now();
			scalar_scores(ks[s], q, qr, sc_scalar);
			double t0 = now();
			if ((err = mkv_score_blocks(&a16, q, ks[s], sc_bound)))
				die("mkv_score_blocks (16)", err);
			double t1 = now();
			differ16 += memcmp(sc_scalar, sc_bound, sizeof(float) * nb) != 0;
			if ((err = mkv_score_blocks(&a8, q, ks[s], sc_step)))
				die("mkv_score_blocks (8, per step)", err);
			double t2 = now();
			ks[s]->sum8 = rows[s];
			ks[s]->sum8_scale = scales[s];
			double t3 = now();
			err = mkv_score_blocks(&a8, q, ks[s], sc_kept);
			double t4 = now();
			ks[s]->sum8 = NULL;
			ks[s]->sum8_scale = NULL;
			if (err)
				die("mkv_score_blocks (8, kept)", err);
			acc[0] += t1 - t0;
			acc[1] += t2 - t1;
			acc[2] += t4 - t3;
			acc[3] += t0 - tm;
			differ += memcmp(sc_step, sc_kept, sizeof(float) * nb) != 0;
		}
		if (r >= 0)
			for (int c = 0; c < 4; c++)
				t[c][r] = acc[c];
	}
	/* the keys' dots: every row, against the rotated queries */
	uint32_t dk = ks[0]->v.d_keep;
	float *qrk = malloc(sizeof(float) * NQ * dk), *qtk = malloc(sizeof(float) * NQ * dk);
	float *kb = malloc(sizeof(float) * dk);
	double *tk[2] = {calloc((size_t)reps, sizeof(double)), calloc((size_t)reps, sizeof(double))};
	if (!qrk || !qtk || !kb || !tk[0] || !tk[1])
		die("malloc", -ENOMEM);
	uint64_t kdiffer = 0;
	for (int r = -1; r < reps; r++) {
		double acc[2] = {0, 0};
		for (uint32_t s = 0; s < nseg; s++) {
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, NQ, (int)dk, D, 1.0f, q, D,
				    ks[s]->rot_f32, D, 0.0f, qrk, (int)dk);
			for (uint32_t c = 0; c < dk; c++)
				for (uint32_t h = 0; h < NQ; h++)
					qtk[c * NQ + h] = qrk[(size_t)h * dk + c];
			uint64_t h0 = 1469598103934665603ull, h1 = h0;
			double t0 = now();
			kdots(ks[s], qrk, qtk, kb, 0, &h0);
			double t1 = now();
			kdots(ks[s], qrk, qtk, kb, 1, &h1);
			double t2 = now();
			acc[0] += t1 - t0;
			acc[1] += t2 - t1;
			kdiffer += h0 != h1;
		}
		if (r >= 0) {
			tk[0][r] = acc[0];
			tk[1][r] = acc[1];
		}
	}
	double nrows = (double)nseg * SEG;
	double mk[2] = {median(tk[0], reps) / nrows * 1e9, median(tk[1], reps) / nrows * 1e9};
	double blocks = (double)nseg * nb;
	double m[4];
	for (int c = 0; c < 4; c++)
		m[c] = median(t[c], reps) / blocks * 1e9;
	printf("hostscore: %u tokens in %u segments of %d, %u blocks a segment, S = %u, "
	       "%d query heads, %d repetitions (median)\n",
	       tokens, nseg, SEG, nb, S, NQ, reps);
	printf("%-10s %14s\n", "contender", "ns per block");
	printf("%-10s %14.2f\n", "scalar", m[3]);
	printf("%-10s %14.2f\n", "bound", m[0]);
	printf("%-10s %14.2f\n", "s8_step", m[1]);
	printf("%-10s %14.2f\n", "s8_kept", m[2]);
	printf("bound / scalar %.3f; s8_kept / s8_step %.3f, s8_kept / bound %.3f, s8_step / "
	       "bound %.3f; scalar and bound scores %s, s8_step and s8_kept scores %s\n",
	       m[0] / m[3], m[2] / m[1], m[2] / m[0], m[1] / m[0], differ16 ? "DIFFER" : "equal",
	       differ ? "DIFFER" : "equal");
	printf("%-12s %14s\n", "keys' dots", "ns per row");
	printf("%-12s %14.2f\n", "kdot_unpack", mk[0]);
	printf("%-12s %14.2f\n", "kdot_packed", mk[1]);
	printf("kdot_packed / kdot_unpack %.3f; their dots %s\n", mk[1] / mk[0],
	       kdiffer ? "DIFFER" : "equal");
	printf("RESULT name=hostscore scalar_ns_per_block=%.2f bound_ns_per_block=%.2f "
	       "s8_step_ns_per_block=%.2f s8_kept_ns_per_block=%.2f bound_vs_scalar=%.3f "
	       "kept_vs_step=%.3f kept_vs_bound=%.3f kdot_unpack_ns_per_row=%.2f "
	       "kdot_packed_ns_per_row=%.2f kdot_packed_vs_unpack=%.3f scores_equal=%d\n",
	       m[3], m[0], m[1], m[2], m[0] / m[3], m[2] / m[1], m[2] / m[0], mk[0], mk[1],
	       mk[1] / mk[0], differ == 0 && differ16 == 0 && kdiffer == 0);
	for (uint32_t s = 0; s < nseg; s++) {
		ks[s]->sum8 = rows[s];
		ks[s]->sum8_scale = scales[s];
		mkv_segment_destroy(ks[s]);
	}
	free(ks);
	free(rows);
	free(scales);
	free(sc_step);
	free(sc_kept);
	free(sc_scalar);
	free(sc_bound);
	free(qr);
	free(qrk);
	free(qtk);
	free(kb);
	free(tk[0]);
	free(tk[1]);
	for (int c = 0; c < 4; c++)
		free(t[c]);
	synth_free(&kv);
	return differ || differ16 || kdiffer ? 1 : 0;
}
