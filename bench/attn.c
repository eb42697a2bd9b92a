/* SPDX-License-Identifier: MIT */
/*
 * bench/attn — decode attention of one layer on the GPU: MosaicKV
 * PackedAttention against our dense flash-decoding kernel, our Quest
 * kernel and torch SDPA (measured by bench/attn_sdpa.py in the same run and
 * handed in with --sdpa FILE), plus the update-buffer flush and prefill
 * encoding.  Llama-3.1-8B layer shape: 32 query heads, 8 KV heads, d = 128,
 * bf16; 10% of tokens, r = 32 values per vector (25% of the 128 channels)
 * of 96 kept rotated channels, b = 16, S = 32 summary channels.
 *
 * One more column, ours_q6: the same step over the serving format's rows,
 * r = 80 values of 6 bits + a bf16 scale per vector (64 bytes a row on
 * the device, the bytes of the bf16 r = 32 rows: 2.5x the values to
 * decode), with the blocks' remainder bounds in the scores.  ours_w and
 * q6_w: ours and ours_q6 with GPU_ATTN_WALK, the kernel before the staged
 * path (sub-blocks loaded from global memory by the lanes that decode them;
 * the per-value scatter for ours, r = 32 of 96, and the channel-major walk
 * for ours_q6).  ours_3, q6_3: ours and ours_q6 without
 * GPU_ATTN_SMALL_ROWS (the staged path in its general layout, three CTAs
 * per SM instead of five).  ours_64, ours_128, ours_256, ours_512: ours
 * with work chunks of 64 .. 512 blocks forced (GPU_ATTN_CHUNK_64 .. _512;
 * ours: the library's choice by shape).  ours_sl, quest_sl: ours and
 * Quest with the select writing the selected blocks' list and the chunk
 * list for the attention kernel (GPU_ATTN_SELECT_LIST; by default the
 * select leaves the cut and each attention CTA takes its window's blocks
 * from the scores).  oscore
 * and qscore time gpu_score_select / gpu_quest_score_select, which write
 * the lists: the stage inside a step is shorter by that write.
 * oscut, qscut, os8cut: the same stages as the steps run them
 * (GPU_ATTN_STAGE_CUT): where a step leaves only the cut, no lists.
 * os_1cta, os_many: ours' score+select stages (oscore) with the one-CTA
 * and the many-CTA select forced (GPU_ATTN_SELECT_ONE_CTA / _MANY_CTAS);
 * oscore uses the library's choice by shape.
 *
 * Data are synthetic (gpu_synth_*): timings depend on shapes and counts,
 * not on values; the kernels' correctness is the gpu test suite's job.
 * Every repetition runs from a cold L2 (a 256 MiB memset before it), is a
 * replay of a CUDA graph of the whole step, timed with events; the median
 * of 20 is reported.
 *
 * Usage: attn [--sdpa FILE] [--ctx 32768,...] [--batch 1,8] [--seg N] [--once 1..5]
 *             [--split 1] (--split: a line per shape with ours' score stage
 *             timed in parts, clear + qrot, + the score kernel, + the select;
 *             --once: one call of each contender, untimed, for profilers: 1
 *             the main columns, 2 the same after ours_g2, 3 ours_mny,
 *             ours_mso, 4 oscore, os_2st, os_3st, 5 pos_sch, ours_pos)
 *             [--score-only 1] (the score kernel alone: the stage cut after
 *             it, less the stage cut before it, by default, with two and
 *             three stages forced, and over 8-bit summaries)
 *             [--pair F1,F2,... [--pair-rounds N]] (paired A/B, nothing
 *             else: per shape and flag set F, ours (A) against ours with
 *             the gpu_attn_args flags F added (B: a number, 0x for hex,
 *             or GPU_ATTN_ names without the prefix joined by '+'), in N
 *             rounds (default 51) of one run each, the order alternating
 *             a round, each from a cold L2; prints both medians and the
 *             median of the rounds' differences B - A with its quartiles
 *             and how many rounds B was slower.  The columns of the table
 *             below are timed one after another, so a clock that drifts
 *             between them moves their medians apart: up to 2.7 µs at 1M
 *             between three columns of the same code in one run (H100,
 *             docs/PERF.md, forty-fourth session); a round's difference
 *             sees the same clock for both)
 *             [--pair-modes A,B] (with --pair: A runs over the segments of
 *             mode A, B over those of mode B, make_heads' modes: 0 ours,
 *             1 ours_q6, 2 ours_pos, 3 pos_s8, 4 ours_s8, 5 ours_g2, 6
 *             g2_s8, 7 pos_sch; default 0,0)
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#include <lapacke.h>

#include "gpu.cuh"

#define HKV 8
#define NQ 4
#define D 128
#define RR 32
#define DK 96
#define BB 16
#define SS 32
#define BW 3
#define BW2 2 /* ours_g2: words of a g = 2 bitmap (DK / 2 bits) */
#define RQ 80  /* ours_q6: values per vector */
#define QW 6   /* and their bits */
#define RSQ 32 /* device row stride, 16-bit units: 2 + 60 bytes -> 64 */
#define FRAC 0.1
#define WIN 128
#define MAXB 8
#define MAXCTX (1u << 20)
#define REPS 20
#define FLUSH_BYTES (256u << 20)

#define CK(call)                                                                    \
	do {                                                                        \
		cudaError_t e_ = (call);                                            \
		if (e_ != cudaSuccess) {                                            \
			fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, \
				cudaGetErrorString(e_));                            \
			exit(1);                                                    \
		}                                                                   \
	} while (0)
#define RC(call)                                                                  \
	do {                                                                      \
		int r_ = (call);                                                  \
		if (r_) {                                                         \
			fprintf(stderr, "%s:%d %s = %d\n", __FILE__, __LINE__, #call, r_); \
			exit(1);                                                  \
		}                                                                 \
	} while (0)

static cudaStream_t st;
static void *flushbuf;
static cudaEvent_t ev0, ev1;

static int cmpf(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

static int cmpd(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* One replay of @g, µs, from a cold L2 if @flush (@i: the memset's byte). */
static double run_once(cudaGraphExec_t g, int flush, int i)
{
	if (flush)
		CK(cudaMemsetAsync(flushbuf, i, FLUSH_BYTES, st));
	CK(cudaEventRecord(ev0, st));
	CK(cudaGraphLaunch(g, st));
	CK(cudaEventRecord(ev1, st));
	CK(cudaEventSynchronize(ev1));
	float ms;
	CK(cudaEventElapsedTime(&ms, ev0, ev1));
	return 1000.0 * ms;
}

/* Median µs of REPS replays of @g (cold-L2 ones if @flush). */
static double time_graph(cudaGraphExec_t g, int flush)
{
	double t[REPS];
	for (int i = 0; i < REPS + 2; i++) {
		double x = run_once(g, flush, i);
		if (i >= 2)
			t[i - 2] = x;
	}
	qsort(t, REPS, sizeof(double), cmpd);
	return t[REPS / 2];
}

typedef int (*step_fn)(const struct gpu_attn_args *, const void *, cudaStream_t);

static cudaGraphExec_t capture(step_fn f, const struct gpu_attn_args *a, const void *heads)
{
	RC(f(a, heads, st)); /* first call outside capture: attributes, modules */
	CK(cudaStreamSynchronize(st));
	cudaGraph_t g;
	cudaGraphExec_t ge;
	CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
	RC(f(a, heads, st));
	CK(cudaStreamEndCapture(st, &g));
	CK(cudaGraphInstantiate(&ge, g, 0));
	CK(cudaGraphDestroy(g));
	return ge;
}

/* Median µs of @f's step as a graph (capture, time, destroy). */
static double time_step(step_fn f, const struct gpu_attn_args *a, const void *heads)
{
	cudaGraphExec_t g = capture(f, a, heads);
	double t = time_graph(g, 1);
	CK(cudaGraphExecDestroy(g));
	return t;
}

/* The contenders' calls with flags @fl added to the step's. */
static int packed_with(const struct gpu_attn_args *a, const void *h, cudaStream_t s, uint32_t fl)
{
	struct gpu_attn_args b = *a;
	b.flags |= fl;
	return gpu_attend_packed(&b, h, s);
}
static int quest_with(const struct gpu_attn_args *a, const void *h, cudaStream_t s, uint32_t fl)
{
	struct gpu_attn_args b = *a;
	b.flags |= fl;
	return gpu_attend_quest(&b, h, s);
}
static int ss_with(const struct gpu_attn_args *a, const void *h, cudaStream_t s, uint32_t fl)
{
	struct gpu_attn_args b = *a;
	b.flags |= fl;
	return gpu_score_select(&b, h, s);
}
static int qss_with(const struct gpu_attn_args *a, const void *h, cudaStream_t s, uint32_t fl)
{
	struct gpu_attn_args b = *a;
	b.flags |= fl;
	return gpu_quest_score_select(&b, h, s);
}

/* both of the bench's row formats keep the small-rows promise */
static int f_packed(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS);
}
static int f_packed_3(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return gpu_attend_packed(a, h, s);
}
static int f_packed_256(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_CHUNK_256);
}
static int f_packed_512(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_CHUNK_512);
}
static int f_packed_64(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_CHUNK_64);
}
static int f_packed_128(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_CHUNK_128);
}
static int f_packed_p1(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_PARTS_1);
}
static int f_packed_p2(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_PARTS_2);
}
static int f_packed_p4(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_PARTS_4);
}
/* windows split only past 64 selected blocks a part (GPU_ATTN_PART_64) */
static int f_packed_b64(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_PART_64);
}
/* the CTAs ordered by work without the select's idle marks
 * (GPU_ATTN_NO_IDLE: every CTA finds its own work, as before the marks) */
static int f_packed_ni(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_NO_IDLE);
}
/* the attention CTAs in slot order (GPU_ATTN_SLOT_ORDER: the version
 * before the select ordered them by work) */
static int f_packed_so(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_SLOT_ORDER);
}
/* the score kernel with two stages of tiles unspread forced
 * (GPU_ATTN_SCORE_2STAGE: three CTAs an SM) and three forced
 * (GPU_ATTN_SCORE_3STAGE): the step and our score stage */
static int f_packed_2st(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_SCORE_2STAGE);
}
static int f_packed_ss_2st(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return ss_with(a, h, s, GPU_ATTN_SCORE_2STAGE);
}
static int f_packed_3st(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_SCORE_3STAGE);
}
static int f_packed_ss_3st(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return ss_with(a, h, s, GPU_ATTN_SCORE_3STAGE);
}
/* the many-CTA select forced (GPU_ATTN_SELECT_MANY_CTAS: below 32,768
 * blocks a context the step takes the one-CTA select, which orders the
 * attention CTAs only where windows are 512 blocks wide), the step */
static int f_packed_many(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_SELECT_MANY_CTAS);
}
/* the same in slot order (no attention order) and without idle marks */
static int f_packed_many_so(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s,
			   GPU_ATTN_SMALL_ROWS | GPU_ATTN_SELECT_MANY_CTAS | GPU_ATTN_SLOT_ORDER);
}
static int f_packed_many_ni(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s,
			   GPU_ATTN_SMALL_ROWS | GPU_ATTN_SELECT_MANY_CTAS | GPU_ATTN_NO_IDLE);
}
/* Quest with its CTAs ordered by work (GPU_ATTN_WORK_ORDER; by default
 * it keeps slot order, where it measured faster) */
static int f_quest_wo(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return quest_with(a, h, s, GPU_ATTN_WORK_ORDER);
}
static int f_quest_p2(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return quest_with(a, h, s, GPU_ATTN_PARTS_2);
}
static int f_packed_ma(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_MERGE_ALL);
}
static int f_packed_cc(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_CUDA_CORES);
}
static int f_packed_w(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_WALK);
}
static int f_packed_ss(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return gpu_score_select(a, h, s);
}
static int f_packed_upto1(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return gpu_score_select_upto(a, h, 1, s);
}
static int f_packed_upto2(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return gpu_score_select_upto(a, h, 2, s);
}
/* the same cut after the score kernel with flags added (--score-only) */
static int upto2_with(const struct gpu_attn_args *a, const void *h, cudaStream_t s, uint32_t fl)
{
	struct gpu_attn_args b = *a;
	b.flags |= fl;
	return gpu_score_select_upto(&b, h, 2, s);
}
static int f_upto2_2st(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return upto2_with(a, h, s, GPU_ATTN_SCORE_2STAGE);
}
static int f_upto2_3st(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return upto2_with(a, h, s, GPU_ATTN_SCORE_3STAGE);
}
static int f_packed_ss1(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return ss_with(a, h, s, GPU_ATTN_SELECT_ONE_CTA);
}
static int f_packed_ssm(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return ss_with(a, h, s, GPU_ATTN_SELECT_MANY_CTAS);
}
static int f_quest(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return gpu_attend_quest(a, h, s);
}
static int f_quest_sl(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return quest_with(a, h, s, GPU_ATTN_SELECT_LIST);
}
static int f_packed_sl(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return packed_with(a, h, s, GPU_ATTN_SMALL_ROWS | GPU_ATTN_SELECT_LIST);
}
static int f_quest_ss(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return gpu_quest_score_select(a, h, s);
}
/* the stages as the steps run them (GPU_ATTN_STAGE_CUT: no lists where
 * the step writes none) */
static int f_packed_sc(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return ss_with(a, h, s, GPU_ATTN_STAGE_CUT);
}
static int f_quest_sc(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return qss_with(a, h, s, GPU_ATTN_STAGE_CUT);
}
static int f_dense(const struct gpu_attn_args *a, const void *h, cudaStream_t s)
{
	return gpu_attend_dense(a, h, s);
}

static void *dalloc(size_t bytes)
{
	void *p;
	CK(cudaMalloc(&p, bytes));
	return p;
}

/* ---- SDPA figures from attn_sdpa.py ---- */
struct sdpa_row {
	unsigned B, L;
	double us;
};
static struct sdpa_row sdpa[64];
static int nsdpa;
static double sdpa_prefill = NAN;

static void read_sdpa(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "attn: no SDPA figures (%s): printing nan\n", path);
		return;
	}
	char line[256];
	while (fgets(line, sizeof line, f)) {
		unsigned B, L;
		double a, b;
		if (sscanf(line, "sdpa %u %u %lf %lf", &B, &L, &a, &b) == 4 && nsdpa < 64) {
			double m = isnan(a) ? b : isnan(b) ? a : (a < b ? a : b);
			sdpa[nsdpa++] = (struct sdpa_row){B, L, m};
		} else if (sscanf(line, "prefill %u %lf", &L, &a) == 2) {
			sdpa_prefill = a;
		}
	}
	fclose(f);
}

static double sdpa_of(unsigned B, unsigned L)
{
	for (int i = 0; i < nsdpa; i++)
		if (sdpa[i].B == B && sdpa[i].L == L)
			return sdpa[i].us;
	return NAN;
}

/* ---- the contexts: up to MAXB × HKV of MAXCTX tokens each ---- */
struct slabs {
	uint16_t *kval, *vval, *smin, *smax, *rot, *dk, *dv, *qmn, *qmx, *wk, *wv;
	uint32_t *kbm, *vbm;
	uint32_t *kbmq, *vbmq; /* RQ of DK bits set (ours_q6) */
	uint32_t *kbm2, *vbm2; /* RR / 2 of DK / 2 pair bits set (ours_g2) */
	uint16_t *srest;       /* remainder bounds (ours_q6) */
	uint8_t *kpos, *vpos;  /* value positions of kbm, vbm (ours_pos) */
	/* kval, vval, kpos, vpos with each block's pairs in store order
	 * (gpu_seg_schedule: pos_sch); made at the first use */
	uint16_t *kvs, *vvs;
	uint8_t *kps, *vps;
	size_t ntok;
	int8_t *s8;            /* 8-bit summaries of smin, smax (ours_s8) */
	float *s8sc;
	uint32_t seglen, maxseg;
};

static void make_slabs(struct slabs *s, uint32_t nctx, uint32_t seglen)
{
	size_t N = (size_t)nctx * MAXCTX, NB = N / BB;
	s->ntok = N;
	s->kvs = s->vvs = NULL;
	s->kps = s->vps = NULL;
	s->seglen = seglen;
	s->maxseg = MAXCTX / seglen;
	s->kval = dalloc(N * RR * 2);
	s->vval = dalloc(N * RR * 2);
	s->kbm = dalloc(N * BW * 4);
	s->vbm = dalloc(N * BW * 4);
	s->smin = dalloc(NB * SS * 2);
	s->smax = dalloc(NB * SS * 2);
	s->rot = dalloc((size_t)nctx * s->maxseg * 2 * DK * D * 2);
	s->dk = dalloc(N * D * 2);
	s->dv = dalloc(N * D * 2);
	s->qmn = dalloc(NB * D * 2);
	s->qmx = dalloc(NB * D * 2);
	s->wk = dalloc((size_t)nctx * WIN * D * 2);
	s->wv = dalloc((size_t)nctx * WIN * D * 2);
	RC(gpu_synth_bf16(s->kval, N * RR, 0.5f, 0.0f, 1, st));
	RC(gpu_synth_bf16(s->vval, N * RR, 0.5f, 0.0f, 2, st));
	RC(gpu_synth_bitmaps(s->kbm, N, BW, DK, RR, 3, st));
	RC(gpu_synth_bitmaps(s->vbm, N, BW, DK, RR, 4, st));
	s->kbm2 = dalloc(N * BW2 * 4);
	s->vbm2 = dalloc(N * BW2 * 4);
	RC(gpu_synth_bitmaps(s->kbm2, N, BW2, DK / 2, RR / 2, 16, st));
	RC(gpu_synth_bitmaps(s->vbm2, N, BW2, DK / 2, RR / 2, 17, st));
	s->kpos = dalloc(N * GPU_POS_STRIDE(RR));
	s->vpos = dalloc(N * GPU_POS_STRIDE(RR));
	RC(gpu_seg_positions(s->kbm, BW, DK, RR, N, s->kpos, st));
	RC(gpu_seg_positions(s->vbm, BW, DK, RR, N, s->vpos, st));
	/* ours_q6 reads the value slabs as rows of RSQ units (the same
	 * bytes): random fields, and random finite bf16 scales */
	_Static_assert(RSQ == RR, "q6 rows reuse the bf16 value slabs");
	s->kbmq = dalloc(N * BW * 4);
	s->vbmq = dalloc(N * BW * 4);
	s->srest = dalloc(NB * 2);
	RC(gpu_synth_bitmaps(s->kbmq, N, BW, DK, RQ, 13, st));
	RC(gpu_synth_bitmaps(s->vbmq, N, BW, DK, RQ, 14, st));
	RC(gpu_synth_bf16(s->srest, NB, 0.2f, 1.0f, 15, st));
	RC(gpu_synth_minmax(s->smin, s->smax, NB * SS, 5, st));
	s->s8 = dalloc(NB * 2 * SS);
	s->s8sc = dalloc(NB * 4);
	RC(gpu_seg_sum8(s->smin, s->smax, SS, (uint32_t)NB, s->s8, s->s8sc, st));
	RC(gpu_synth_bf16(s->rot, (size_t)nctx * s->maxseg * 2 * DK * D, 0.09f, 0.0f, 6, st));
	RC(gpu_synth_bf16(s->dk, N * D, 1.0f, 0.0f, 7, st));
	RC(gpu_synth_bf16(s->dv, N * D, 1.0f, 0.0f, 8, st));
	RC(gpu_synth_bf16(s->wk, (size_t)nctx * WIN * D, 1.0f, 0.0f, 9, st));
	RC(gpu_synth_bf16(s->wv, (size_t)nctx * WIN * D, 1.0f, 0.0f, 10, st));
	for (uint32_t c = 0; c < nctx; c++)
		RC(gpu_quest_bounds(s->dk + (size_t)c * MAXCTX * D, MAXCTX, D, BB,
				    s->qmn + (size_t)c * (MAXCTX / BB) * D,
				    s->qmx + (size_t)c * (MAXCTX / BB) * D, st));
	CK(cudaStreamSynchronize(st));
}

/* The slabs of pos_sch: the positions' slabs with every 16-token block's
 * (value, position) pairs in store order, scheduled once over the whole
 * slab (blocks never straddle a segment: segments are whole blocks). */
static void sched_slabs(struct slabs *s)
{
	if (s->kvs)
		return;
	const size_t N = s->ntok;
	struct gpu_seg g, o;
	memset(&g, 0, sizeof g);
	if (N > UINT32_MAX) {
		fprintf(stderr, "attn: %zu tokens are too many to schedule at once\n", N);
		exit(1);
	}
	s->kvs = dalloc(N * RR * 2);
	s->vvs = dalloc(N * RR * 2);
	s->kps = dalloc(N * GPU_POS_STRIDE(RR));
	s->vps = dalloc(N * GPU_POS_STRIDE(RR));
	g.k_val = s->kval;
	g.v_val = s->vval;
	g.k_pos = s->kpos;
	g.v_pos = s->vpos;
	g.n = (uint32_t)N;
	g.b = BB;
	g.n_blocks = (uint32_t)(N / BB);
	g.k_dk = g.v_dk = DK;
	g.k_r = g.v_r = RR;
	g.k_g = g.v_g = 1;
	g.k_rs = g.v_rs = RR;
	g.k_bw = g.v_bw = BW;
	cudaEvent_t e0, e1;
	CK(cudaEventCreate(&e0));
	CK(cudaEventCreate(&e1));
	CK(cudaEventRecord(e0, st));
	RC(gpu_seg_schedule(&g, D, s->kvs, s->vvs, s->kps, s->vps, &o, st));
	CK(cudaEventRecord(e1, st));
	CK(cudaStreamSynchronize(st));
	float ms = 0;
	CK(cudaEventElapsedTime(&ms, e0, e1));
	/* one segment alone, as a sequence's upload schedules it: the same
	 * input, so the same bytes again (its latency, not the throughput) */
	float ms1 = 0, msw = 0;
	g.n = s->seglen;
	g.n_blocks = s->seglen / BB;
	/* a warp a block first (gpu_seg_schedule_warp), then a thread a
	 * block, whose bytes the runs read */
	CK(cudaEventRecord(e0, st));
	RC(gpu_seg_schedule_warp(&g, D, s->kvs, s->vvs, s->kps, s->vps, &o, st));
	CK(cudaEventRecord(e1, st));
	CK(cudaStreamSynchronize(st));
	CK(cudaEventElapsedTime(&msw, e0, e1));
	CK(cudaEventRecord(e0, st));
	RC(gpu_seg_schedule(&g, D, s->kvs, s->vvs, s->kps, s->vps, &o, st));
	CK(cudaEventRecord(e1, st));
	CK(cudaStreamSynchronize(st));
	CK(cudaEventElapsedTime(&ms1, e0, e1));
	printf("pos_sch: %zu tokens scheduled in %.1f ms (gpu_seg_schedule, once); one segment of "
	       "%u tokens alone in %.2f ms, %.3f ms a warp a block\n",
	       N, (double)ms, s->seglen, (double)ms1, (double)msw);
	CK(cudaEventDestroy(e0));
	CK(cudaEventDestroy(e1));
}

/* Segment tables and heads for H contexts of L tokens: bf16 rows (mode
 * 0), 6-bit rows (1: ours_q6), bf16 rows with value positions (2:
 * ours_pos), with value positions and 8-bit summaries (3: pos_s8), with
 * 8-bit summaries (4: ours_s8), with g = 2 bitmaps (5: ours_g2; the same
 * values, a bit a pair of channels), with g = 2 bitmaps and 8-bit
 * summaries (6: g2_s8), bf16 rows and positions in store order (7: pos_sch;
 * sched_slabs first). */
static void make_heads(const struct slabs *s, uint32_t H, uint32_t L, struct gpu_seg *dsegs,
		       struct gpu_head *dheads, struct gpu_dense_head *ddense, int mode)
{
	const int q6 = mode == 1;
	uint32_t nseg = L / s->seglen;
	/* the descriptors are rewritten below by copies on the legacy stream,
	 * which do not wait for the bench's non-blocking stream: a step still
	 * in flight there (--once enqueues steps back to back) would read them
	 * half rewritten */
	CK(cudaDeviceSynchronize());
	struct gpu_seg *segs = calloc((size_t)H * nseg, sizeof *segs);
	struct gpu_head *hh = calloc(H, sizeof *hh);
	struct gpu_dense_head *dh = calloc(H, sizeof *dh);
	for (uint32_t c = 0; c < H; c++) {
		size_t t0 = (size_t)c * MAXCTX;
		for (uint32_t i = 0; i < nseg; i++) {
			struct gpu_seg *g = &segs[(size_t)c * nseg + i];
			size_t tok = t0 + (size_t)i * s->seglen, blk = tok / BB;
			const uint16_t *rot = s->rot + ((size_t)c * s->maxseg + i) * 2 * DK * D;
			g->k_val = s->kval + tok * RR;
			g->v_val = s->vval + tok * RR;
			g->k_bm = s->kbm + tok * BW;
			g->v_bm = s->vbm + tok * BW;
			g->k_rot = rot;
			g->v_rot = rot + DK * D;
			g->s_min = s->smin + blk * SS;
			g->s_max = s->smax + blk * SS;
			g->n = s->seglen;
			g->b = BB;
			g->n_blocks = s->seglen / BB;
			g->S = SS;
			g->k_dk = g->v_dk = DK;
			g->k_r = g->v_r = RR;
			g->k_g = g->v_g = 1;
			g->k_rs = g->v_rs = RR;
			g->k_bw = g->v_bw = BW;
			g->block0 = i * (s->seglen / BB);
			if (mode == 2 || mode == 3) {
				g->k_pos = s->kpos + tok * GPU_POS_STRIDE(RR);
				g->v_pos = s->vpos + tok * GPU_POS_STRIDE(RR);
			}
			if (mode == 7) {
				g->k_val = s->kvs + tok * RR;
				g->v_val = s->vvs + tok * RR;
				g->k_pos = s->kps + tok * GPU_POS_STRIDE(RR);
				g->v_pos = s->vps + tok * GPU_POS_STRIDE(RR);
				g->sched = 16 * (3 * D / 64) + 8;
			}
			if (mode == 5 || mode == 6) {
				g->k_bm = s->kbm2 + tok * BW2;
				g->v_bm = s->vbm2 + tok * BW2;
				g->k_g = g->v_g = 2;
				g->k_bw = g->v_bw = BW2;
			}
			if (mode == 3 || mode == 4 || mode == 6) {
				g->s8 = s->s8 + blk * 2 * SS;
				g->s8_scale = s->s8sc + blk;
			}
			if (q6) {
				g->k_bm = s->kbmq + tok * BW;
				g->v_bm = s->vbmq + tok * BW;
				g->k_r = g->v_r = RQ;
				g->k_vb = g->v_vb = QW;
				g->k_rs = g->v_rs = RSQ;
				g->s_rest = s->srest + blk;
			}
		}
		hh[c].segs = dsegs + (size_t)c * nseg;
		hh[c].win_k = s->wk + (size_t)c * WIN * D;
		hh[c].win_v = s->wv + (size_t)c * WIN * D;
		hh[c].n_hist = L;
		hh[c].nseg = nseg;
		hh[c].n_blocks = L / BB;
		hh[c].win_n = WIN;
		dh[c].k = s->dk + t0 * D;
		dh[c].v = s->dv + t0 * D;
		dh[c].q_min = s->qmn + (size_t)c * (MAXCTX / BB) * D;
		dh[c].q_max = s->qmx + (size_t)c * (MAXCTX / BB) * D;
		dh[c].win_k = hh[c].win_k;
		dh[c].win_v = hh[c].win_v;
		dh[c].n = L;
		dh[c].win_n = WIN;
	}
	CK(cudaMemcpy(dsegs, segs, sizeof(*segs) * H * nseg, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dheads, hh, sizeof(*hh) * H, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(ddense, dh, sizeof(*dh) * H, cudaMemcpyHostToDevice));
	free(segs);
	free(hh);
	free(dh);
}

/* ---- update-buffer flush: 64 tokens × 32 layers × 8 KV heads ---- */
/* Each half's rotation region as gpu_seg_image_proj lays a buffer's out:
 * R (bf16; D × D units reserved), then the fp32 correction C = P − R
 * (DK × D floats) rot_dl = D × D units on, which every append reads. */
#define FLUSH_ROT ((size_t)3 * D * D)
static double bench_flush(void)
{
	const uint32_t layers = 32, nbuf = layers * HKV, nnew = 64, cap = 2048;
	size_t rs = RR, bw = BW, nb = cap / BB;
	uint16_t *val = dalloc((size_t)nbuf * 2 * cap * rs * 2);
	uint32_t *bm = dalloc((size_t)nbuf * 2 * cap * bw * 4);
	uint16_t *sm = dalloc((size_t)nbuf * 2 * nb * SS * 2);
	uint16_t *rot = dalloc((size_t)nbuf * 2 * FLUSH_ROT * 2);
	uint16_t *x = dalloc((size_t)nbuf * 2 * nnew * D * 2);
	RC(gpu_synth_bf16(rot, (size_t)nbuf * 2 * FLUSH_ROT, 0.09f, 0.0f, 11, st));
	/* the corrections: zeros (values do not change the time) */
	CK(cudaMemset2DAsync(rot + (size_t)D * D, FLUSH_ROT * 2, 0, (size_t)DK * D * 4,
			     (size_t)nbuf * 2, st));
	RC(gpu_synth_bf16(x, (size_t)nbuf * 2 * nnew * D, 1.0f, 0.0f, 12, st));
	struct gpu_seg *segs = calloc(nbuf, sizeof *segs);
	uint32_t *caps = calloc(nbuf, 4);
	for (uint32_t i = 0; i < nbuf; i++) {
		struct gpu_seg *g = &segs[i];
		g->k_val = val + (size_t)(2 * i) * cap * rs;
		g->v_val = val + (size_t)(2 * i + 1) * cap * rs;
		g->k_bm = bm + (size_t)(2 * i) * cap * bw;
		g->v_bm = bm + (size_t)(2 * i + 1) * cap * bw;
		g->s_min = sm + (size_t)(2 * i) * nb * SS;
		g->s_max = sm + (size_t)(2 * i + 1) * nb * SS;
		g->k_rot = rot + (size_t)(2 * i) * FLUSH_ROT;
		g->v_rot = rot + (size_t)(2 * i + 1) * FLUSH_ROT;
		g->rot_dl = D * D;
		g->b = BB;
		g->S = SS;
		g->k_dk = g->v_dk = DK;
		g->k_r = g->v_r = RR;
		g->k_g = g->v_g = 1;
		g->k_rs = g->v_rs = RR;
		g->k_bw = g->v_bw = BW;
		caps[i] = cap;
	}
	struct gpu_seg *dsegs = dalloc(sizeof(*segs) * nbuf);
	uint32_t *dcap = dalloc(4 * nbuf), *ovf = dalloc(4);
	CK(cudaMemcpy(dsegs, segs, sizeof(*segs) * nbuf, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dcap, caps, 4 * nbuf, cudaMemcpyHostToDevice));
	CK(cudaMemset(ovf, 0, 4));
	struct gpu_append_args a = {
		.n_buf = nbuf, .n_new = nnew, .d = D, .bufs = dsegs, .cap = dcap,
		.k_new = x, .v_new = x + (size_t)nbuf * nnew * D, .overflow = ovf,
	};
	a.ws_bytes = gpu_append_ws_bytes(nbuf, nnew);
	a.ws = dalloc(a.ws_bytes);
	RC(gpu_append(&a, st)); /* warm-up */
	CK(cudaStreamSynchronize(st));
	cudaGraph_t g;
	cudaGraphExec_t ge;
	CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
	RC(gpu_append(&a, st));
	CK(cudaStreamEndCapture(st, &g));
	CK(cudaGraphInstantiate(&ge, g, 0));
	double us = time_graph(ge, 0); /* 22 more appends: 23 × 64 < 2048 */
	uint32_t o;
	CK(cudaMemcpy(&o, ovf, 4, cudaMemcpyDeviceToHost));
	if (o)
		fprintf(stderr, "attn: flush buffers overflowed\n");
	cudaGraphExecDestroy(ge);
	cudaGraphDestroy(g);
	cudaFree(val);
	cudaFree(bm);
	cudaFree(sm);
	cudaFree(rot);
	cudaFree(x);
	cudaFree(dsegs);
	cudaFree(dcap);
	cudaFree(ovf);
	cudaFree(a.ws);
	free(segs);
	free(caps);
	return us / layers;
}

/* ---- prefill encoding of one layer at 64K ---- */
struct eig_job {
	float *A;
	float *w;
	int rc;
};

static void *eig_thread(void *p)
{
	struct eig_job *j = p;
	j->rc = LAPACKE_ssyevd(LAPACK_ROW_MAJOR, 'V', 'L', D, j->A, D, j->w);
	return NULL;
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

struct enc_res {
	double cov, eig_gpu, pack, total_gpu, eig_cpu, total_overlap;
};

static void bench_encode(const struct slabs *s, struct enc_res *r)
{
	const uint32_t nmat = 2 * HKV, n = 65536;
	struct gpu_encoder *e;
	RC(gpu_encoder_create(D, nmat, &e));
	float *cov = dalloc((size_t)nmat * D * D * 4), *R = dalloc((size_t)nmat * D * D * 4);
	struct gpu_encode_args ea = {
		.nmat = nmat, .n = n, .d = D, .r = RR, .g = 1, .b = BB, .S = SS, .drop = 1,
		.x = s->dk, .R = R,
	};
	ea.dev_bytes = gpu_encode_pack_bytes(&ea);
	ea.dev = dalloc(ea.dev_bytes);
	struct gpu_seg segs[HKV];
	ea.segs = segs;
	float *hc = malloc(sizeof(float) * nmat * D * D), *hR = malloc(sizeof(float) * nmat * D * D);
	float *w = malloc(sizeof(float) * nmat * D);
	double best[6] = {1e30, 1e30, 1e30, 1e30, 1e30, 1e30};
	for (int it = 0; it < 4; it++) {
		float ms;
		CK(cudaDeviceSynchronize());
		double t0 = now_us();
		CK(cudaEventRecord(ev0, st));
		RC(gpu_encode_cov(e, ea.x, nmat, n, cov, st));
		CK(cudaEventRecord(ev1, st));
		CK(cudaEventSynchronize(ev1));
		CK(cudaEventElapsedTime(&ms, ev0, ev1));
		double tc = ms * 1000.0;
		CK(cudaMemcpy(hc, cov, sizeof(float) * nmat * D * D, cudaMemcpyDeviceToHost));
		CK(cudaEventRecord(ev0, st));
		RC(gpu_encode_eig(e, cov, nmat, R, st));
		CK(cudaEventRecord(ev1, st));
		CK(cudaEventSynchronize(ev1));
		CK(cudaEventElapsedTime(&ms, ev0, ev1));
		double te = ms * 1000.0;
		double tp0 = now_us();
		RC(gpu_encode_pack(e, &ea, st));
		CK(cudaStreamSynchronize(st));
		double tp = now_us() - tp0, tt = now_us() - t0;
		/* eigen on CPU workers: 16 matrices on 16 threads */
		double tq0 = now_us();
		pthread_t th[2 * HKV];
		struct eig_job jobs[2 * HKV];
		for (uint32_t m = 0; m < nmat; m++) {
			jobs[m] = (struct eig_job){hc + (size_t)m * D * D, w + (size_t)m * D, 0};
			pthread_create(&th[m], NULL, eig_thread, &jobs[m]);
		}
		for (uint32_t m = 0; m < nmat; m++) {
			pthread_join(th[m], NULL);
			if (jobs[m].rc)
				fprintf(stderr, "attn: LAPACKE_ssyevd = %d\n", jobs[m].rc);
		}
		/* row-major eigenvectors in columns, ascending: rows, descending */
		for (uint32_t m = 0; m < nmat; m++)
			for (uint32_t i = 0; i < D; i++)
				for (uint32_t j = 0; j < D; j++)
					hR[((size_t)m * D + i) * D + j] = hc[((size_t)m * D + j) * D + (D - 1 - i)];
		CK(cudaMemcpy(R, hR, sizeof(float) * nmat * D * D, cudaMemcpyHostToDevice));
		double tq = now_us() - tq0;
		double v[6] = {tc, te, tp, tt, tq, tc + tp};
		for (int i = 0; i < 6; i++)
			if (it > 0 && v[i] < best[i])
				best[i] = v[i];
	}
	r->cov = best[0];
	r->eig_gpu = best[1];
	r->pack = best[2];
	r->total_gpu = best[3];
	r->eig_cpu = best[4];
	r->total_overlap = best[5];
	gpu_encoder_destroy(e);
	cudaFree(cov);
	cudaFree(R);
	cudaFree(ea.dev);
	free(hc);
	free(hR);
	free(w);
}

/*
 * ours (A) against ours with @fl added (B) on the heads of @a, @n rounds
 * after two discarded: a round runs both, A first in even rounds and B
 * first in odd ones.  Prints a line; returns the median of B - A (µs).
 */
static double pair_run(const struct gpu_attn_args *a, const void *heads, const void *heads_b,
		       uint32_t fl, int n, uint32_t batch, uint32_t ctx)
{
	struct gpu_attn_args b = *a; /* f_packed adds its flags to the args' */
	b.flags |= fl;
	cudaGraphExec_t ga = capture(f_packed, a, heads), gb = capture(f_packed, &b, heads_b);
	double *ta = malloc(sizeof(double) * n), *tb = malloc(sizeof(double) * n),
	       *dd = malloc(sizeof(double) * n);
	if (!ta || !tb || !dd) {
		fprintf(stderr, "attn: out of memory\n");
		exit(1);
	}
	int slower = 0;
	for (int i = -2; i < n; i++) {
		double x, y;
		if (i & 1) {
			y = run_once(gb, 1, 2 * i);
			x = run_once(ga, 1, 2 * i + 1);
		} else {
			x = run_once(ga, 1, 2 * i);
			y = run_once(gb, 1, 2 * i + 1);
		}
		if (i < 0)
			continue;
		ta[i] = x;
		tb[i] = y;
		dd[i] = y - x;
		slower += y > x;
	}
	qsort(ta, n, sizeof(double), cmpd);
	qsort(tb, n, sizeof(double), cmpd);
	qsort(dd, n, sizeof(double), cmpd);
	double med = dd[n / 2];
	printf("pair batch %u context %u flags %#x: A %.1f us, B %.1f us (medians); B - A median "
	       "%+.2f us, quartiles %+.2f .. %+.2f; B slower in %d of %d rounds\n",
	       batch, ctx, fl, ta[n / 2], tb[n / 2], med, dd[n / 4], dd[(3 * n) / 4], slower, n);
	CK(cudaGraphExecDestroy(ga));
	CK(cudaGraphExecDestroy(gb));
	free(ta);
	free(tb);
	free(dd);
	return med;
}

/* --pair's flag sets: a number (0x.. for hex) or a GPU_ATTN_* name
 * without its prefix, several joined by '+' (e.g. SLOT_ORDER+NO_IDLE). */
static const struct {
	const char *name;
	uint32_t v;
} flag_names[] = {
	{"CUDA_CORES", GPU_ATTN_CUDA_CORES},
	{"SCATTER", GPU_ATTN_SCATTER},
	{"WALK", GPU_ATTN_WALK},
	{"SMALL_ROWS", GPU_ATTN_SMALL_ROWS},
	{"NO_PDL", GPU_ATTN_NO_PDL},
	{"CHUNK_256", GPU_ATTN_CHUNK_256},
	{"CHUNK_512", GPU_ATTN_CHUNK_512},
	{"CHUNK_64", GPU_ATTN_CHUNK_64},
	{"CHUNK_128", GPU_ATTN_CHUNK_128},
	{"SELECT_LIST", GPU_ATTN_SELECT_LIST},
	{"MERGE_ALL", GPU_ATTN_MERGE_ALL},
	{"STAGE_CUT", GPU_ATTN_STAGE_CUT},
	{"PARTS_1", GPU_ATTN_PARTS_1},
	{"PARTS_2", GPU_ATTN_PARTS_2},
	{"PARTS_4", GPU_ATTN_PARTS_4},
	{"PART_64", GPU_ATTN_PART_64},
	{"NO_IDLE", GPU_ATTN_NO_IDLE},
	{"SEL_TAIL_SERIAL", GPU_ATTN_SEL_TAIL_SERIAL},
	{"SELECT_ONE_CTA", GPU_ATTN_SELECT_ONE_CTA},
	{"SELECT_MANY_CTAS", GPU_ATTN_SELECT_MANY_CTAS},
	{"SLOT_ORDER", GPU_ATTN_SLOT_ORDER},
	{"WORK_ORDER", GPU_ATTN_WORK_ORDER},
	{"SCORE_2STAGE", GPU_ATTN_SCORE_2STAGE},
	{"SCORE_3STAGE", GPU_ATTN_SCORE_3STAGE},
	{"SCORE_SPREAD", GPU_ATTN_SCORE_SPREAD},
	{"SELECT_ORDER", GPU_ATTN_SELECT_ORDER},
};

/* The flag set in @p up to ',' or the end into *@out; returns the end, or
 * NULL for a token that is neither a number nor a name. */
static const char *parse_flags(const char *p, uint32_t *out)
{
	uint32_t f = 0;
	for (;;) {
		size_t n = strcspn(p, "+,");
		char *e;
		unsigned long v = strtoul(p, &e, 0);
		if (n == 0)
			return NULL;
		if (e == p + n && v <= UINT32_MAX) {
			f |= (uint32_t)v;
		} else {
			size_t k = 0, nn = sizeof flag_names / sizeof flag_names[0];
			while (k < nn && (strlen(flag_names[k].name) != n ||
					  strncmp(flag_names[k].name, p, n)))
				k++;
			if (k == nn)
				return NULL;
			f |= flag_names[k].v;
		}
		p += n;
		if (*p != '+')
			break;
		p++;
	}
	*out = f;
	return p;
}

static int parse_list(const char *s, unsigned *out, int cap)
{
	int n = 0;
	while (*s && n < cap) {
		out[n++] = (unsigned)strtoul(s, (char **)&s, 10);
		if (*s == ',')
			s++;
	}
	return n;
}

int main(int argc, char **argv)
{
	unsigned ctx[8] = {32768, 131072, 262144, 524288, 1048576}, bat[4] = {1, 8};
	int nctx = 5, nbat = 2;
	uint32_t seglen = 16384;
	const char *sdpa_path = NULL;
	int once = 0; /* --once 1: one call of each contender, no timing (profilers) */
	int split = 0; /* --split 1: also time ours' score stage cut short */
	int score_only = 0; /* --score-only 1: only the score stage cut after the score */
	uint32_t pairs[8];
	int npair = 0, pair_rounds = 51, pmode[2] = {0, 0};
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--sdpa"))
			sdpa_path = argv[i + 1];
		else if (!strcmp(argv[i], "--ctx"))
			nctx = parse_list(argv[i + 1], ctx, 8);
		else if (!strcmp(argv[i], "--batch"))
			nbat = parse_list(argv[i + 1], bat, 4);
		else if (!strcmp(argv[i], "--seg"))
			seglen = (uint32_t)strtoul(argv[i + 1], NULL, 10);
		else if (!strcmp(argv[i], "--once"))
			once = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--split"))
			split = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--score-only"))
			score_only = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--pair")) {
			const char *p = argv[i + 1];
			while (*p && npair < 8) {
				p = parse_flags(p, &pairs[npair]);
				if (!p) {
					fprintf(stderr, "attn: --pair takes flag sets, numbers or "
							"GPU_ATTN_ names without the prefix joined "
							"by '+', e.g. 0,SELECT_ORDER,SLOT_ORDER+NO_IDLE\n");
					return 2;
				}
				npair++;
				if (*p == ',')
					p++;
			}
			if (*p) {
				fprintf(stderr, "attn: --pair takes at most 8 flag sets\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--pair-modes")) {
			if (sscanf(argv[i + 1], "%d,%d", &pmode[0], &pmode[1]) != 2 || pmode[0] < 0 ||
			    pmode[0] > 7 || pmode[1] < 0 || pmode[1] > 7) {
				fprintf(stderr, "attn: --pair-modes takes two of make_heads' modes "
						"0..7, e.g. 2,7\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--pair-rounds")) {
			pair_rounds = atoi(argv[i + 1]);
			if (pair_rounds < 4 || pair_rounds > 100000) {
				fprintf(stderr, "attn: --pair-rounds between 4 and 100000\n");
				return 2;
			}
		}
	}
	if (sdpa_path)
		read_sdpa(sdpa_path);
	if (gpu_device_ok() <= 0) {
		printf("attn: no usable CUDA device\n");
		if (npair) {
			printf("RESULT name=attn_pair pairs=0\n");
			return 0;
		}
		printf("RESULT name=attn speedup_dense_1m=nan speedup_quest_1m=nan "
		       "score_speedup_quest_1m=nan dense_vs_sdpa_1m=nan bw_frac_256k=nan "
		       "flush_us_per_layer=nan prefill_encode_frac_64k=nan speedup_dense_1m_pos=nan "
		       "speedup_quest_1m_pos=nan bw_frac_256k_pos=nan speedup_dense_1m_s8=nan "
		       "speedup_quest_1m_s8=nan score_speedup_quest_1m_s8=nan bw_frac_256k_s8=nan "
		       "score_speedup_quest_1m_cut=nan score_speedup_quest_1m_s8_cut=nan "
		       "speedup_dense_1m_g2=nan speedup_quest_1m_g2=nan bw_frac_256k_g2=nan "
		       "speedup_dense_1m_g2s8=nan bw_frac_256k_g2s8=nan speedup_dense_1m_sch=nan "
		       "speedup_quest_1m_sch=nan bw_frac_256k_sch=nan\n");
		return 0;
	}
	CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	CK(cudaEventCreate(&ev0));
	CK(cudaEventCreate(&ev1));
	flushbuf = dalloc(FLUSH_BYTES);
	struct cudaDeviceProp prop;
	CK(cudaGetDeviceProperties(&prop, 0));
	unsigned maxb = 1;
	for (int i = 0; i < nbat; i++)
		maxb = bat[i] > maxb ? bat[i] : maxb;
	uint32_t nctxs = maxb * HKV;

	/* device copy bandwidth, bytes read + written */
	double copy_bw;
	{
		size_t bytes = (size_t)2 << 30;
		char *a = dalloc(2 * bytes);
		CK(cudaMemset(a, 1, 2 * bytes));
		float t[7];
		for (int i = 0; i < 7; i++) {
			CK(cudaEventRecord(ev0, st));
			CK(cudaMemcpyAsync(a + bytes, a, bytes, cudaMemcpyDeviceToDevice, st));
			CK(cudaEventRecord(ev1, st));
			CK(cudaEventSynchronize(ev1));
			CK(cudaEventElapsedTime(&t[i], ev0, ev1));
		}
		qsort(t, 7, sizeof(float), cmpf);
		copy_bw = 2.0 * bytes / (t[3] * 1e-3);
		cudaFree(a);
	}
	printf("bench/attn on %s (%d SMs), device copy %.2f TB/s (read+write)\n", prop.name,
	       prop.multiProcessorCount, copy_bw / 1e12);
	printf("layer: %d q heads, %d KV heads, d=%d, bf16; 10%% tokens; r=%d of %d kept rotated "
	       "channels (25%% of d), g=1, b=%d, S=%d, segments of %u tokens, window %d\n",
	       HKV * NQ, HKV, D, RR, DK, BB, SS, seglen, WIN);

	struct slabs s;
	make_slabs(&s, nctxs, seglen);
	struct gpu_seg *dsegs = dalloc(sizeof(struct gpu_seg) * nctxs * s.maxseg);
	struct gpu_head *dheads = dalloc(sizeof(struct gpu_head) * nctxs);
	/* --pair-modes' B: its own segments and heads */
	struct gpu_seg *dsegs_b = dalloc(sizeof(struct gpu_seg) * nctxs * s.maxseg);
	struct gpu_head *dheads_b = dalloc(sizeof(struct gpu_head) * nctxs);
	if (npair && (pmode[0] == 7 || pmode[1] == 7))
		sched_slabs(&s);
	struct gpu_dense_head *ddense = dalloc(sizeof(struct gpu_dense_head) * nctxs);
	float *dq = dalloc(sizeof(float) * nctxs * NQ * D), *dout = dalloc(sizeof(float) * nctxs * NQ * D);
	RC(gpu_synth_bf16((uint16_t *)flushbuf, 1, 1.0f, 0.0f, 1, st)); /* touch */
	{
		float *hq = malloc(sizeof(float) * nctxs * NQ * D);
		for (size_t i = 0; i < (size_t)nctxs * NQ * D; i++)
			hq[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
		CK(cudaMemcpy(dq, hq, sizeof(float) * nctxs * NQ * D, cudaMemcpyHostToDevice));
		free(hq);
	}
	struct gpu_attn_args amax = {
		.n_heads = nctxs, .nq = NQ, .d = D, .token_frac = FRAC, .max_segs = s.maxseg,
		.max_blocks = MAXCTX / BB, .max_win = WIN, .quest_b = BB, .q = dq, .out = dout,
	};
	size_t wsb = gpu_attn_ws_bytes(&amax);
	void *ws = dalloc(wsb);
	amax.ws = ws;
	amax.ws_bytes = wsb;
	RC(gpu_attn_ws_init(&amax, st));

	char pres[2048] = "";
	int npres = 0;
	if (!npair) /* the table's header (the paired mode prints none) */
		printf("\n%5s %8s | %9s %9s %6s | %9s %9s | %9s %9s %9s | %7s %7s %7s %7s | %8s %6s | "
		       "%9s | %9s %9s | %9s %9s | %9s %9s %9s %9s %9s %9s | %9s %9s | %9s %9s %9s | %9s "
		       "%9s %9s %7s %9s | %9s %9s %9s %7s %7s | %9s %9s %9s %9s %9s | %9s %9s %9s %9s "
		       "%9s %9s | %9s %9s %7s %6s %9s %9s | %9s %9s %9s %9s | %9s %9s "
		       "%9s %9s | %9s %7s %7s\n",
		       "batch", "context", "dense_us", "sdpa_us", "d/sdpa", "quest_us",
		       "qscore", "ours_us", "oscore", "ours_cc", "x_dense", "x_sdpa",
		       "x_quest", "x_score", "ours_TBs", "bwfrac", "ours_q6", "ours_w",
		       "q6_w", "os_1cta", "os_many", "ours_3", "q6_3", "ours_64",
		       "ours_128", "ours_256", "ours_512", "ours_sl", "quest_sl",
		       "ours_pos", "pos_128", "pos_512", "ours_s8", "os_s8", "pos_s8",
		       "x_sc_s8", "ps8_ma", "oscut", "qscut", "os8cut", "x_sccut",
		       "x_s8cut", "ours_p1", "ours_p2", "ours_p4", "ps8_p1", "quest_p2",
		       "ours_so", "quest_wo", "pos8_so", "ours_b64", "ps8_b64", "ours_ni",
		       "ours_g2", "g2_s8", "x_d_g2",
		       "bwf_g2", "g2_512", "g28_512", "ours_mny", "g28_mny", "ours_mso",
		       "ours_mni", "ours_2st", "os_2st", "ours_3st", "os_3st", "pos_sch",
		       "x_d_sch", "x_q_sch");
	double r_dense1m = NAN, r_quest1m = NAN, r_score1m = NAN, r_sdpa1m = NAN, r_bw256 = NAN;
	double r_dpos1m = NAN, r_qpos1m = NAN, r_bwpos256 = NAN;
	double r_dsch1m = NAN, r_qsch1m = NAN, r_bwsch256 = NAN;
	double r_ds81m = NAN, r_qs81m = NAN, r_sc81m = NAN, r_bws8256 = NAN;
	double r_sccut1m = NAN, r_s8cut1m = NAN;
	double r_dg21m = NAN, r_qg21m = NAN, r_bwg2256 = NAN, r_dg281m = NAN, r_bwg28256 = NAN;
	for (int bi = 0; bi < nbat; bi++) {
		for (int ci = 0; ci < nctx; ci++) {
			uint32_t B = bat[bi], L = ctx[ci], H = B * HKV;
			if (L % seglen || L > MAXCTX || B > maxb)
				continue;
			make_heads(&s, H, L, dsegs, dheads, ddense, 0);
			struct gpu_attn_args a = amax;
			a.n_heads = H;
			a.max_segs = L / seglen;
			a.max_blocks = L / BB;
			a.ws = ws;
			a.ws_bytes = wsb;
			if (npair) {
				make_heads(&s, H, L, dsegs, dheads, ddense, pmode[0]);
				make_heads(&s, H, L, dsegs_b, dheads_b, ddense, pmode[1]);
				if (pmode[0] || pmode[1])
					printf("pair modes: A %d, B %d\n", pmode[0], pmode[1]);
				for (int k = 0; k < npair; k++) {
					double m = pair_run(&a, dheads, dheads_b, pairs[k], pair_rounds,
							    B, L);
					size_t u = strlen(pres);
					char mk[16] = "";
					if (pmode[0] || pmode[1]) /* e.g. _m27: ours_pos, pos_sch */
						snprintf(mk, sizeof mk, "_m%d%d", pmode[0], pmode[1]);
					if (u + 64 < sizeof pres)
						snprintf(pres + u, sizeof pres - u,
							 " diff_us_b%u_%u_%#x%s=%.2f", B, L, pairs[k], mk,
							 m);
					npres++;
				}
				continue;
			}
			if (once == 3) { /* ours_mny, ours_mso (ncu, cta_probe) */
				RC(f_packed_many(&a, dheads, st));
				RC(f_packed_many_so(&a, dheads, st));
				CK(cudaStreamSynchronize(st));
				continue;
			}
			if (score_only) {
				/* clear + qrot, then + the score kernel: by default, two
				 * stages forced, three forced; and over 8-bit summaries
				 * (the kernel's time is the difference; the 8-bit one
				 * less 8-bit clear + qrot) */
				step_fn fs[4] = {f_packed_upto2, f_upto2_2st, f_upto2_3st,
						 f_packed_upto2};
				double t[5], t8 = 0;
				t[0] = time_step(f_packed_upto1, &a, dheads);
				for (int k = 0; k < 4; k++) {
					if (k == 3) {
						make_heads(&s, H, L, dsegs, dheads, ddense, 4);
						t8 = time_step(f_packed_upto1, &a, dheads);
					}
					t[k + 1] = time_step(fs[k], &a, dheads) - (k >= 3 ? t8 : t[0]);
				}
				printf("score-only %u %u: clear+qrot %.1f us; score kernel %.1f (2 stages "
				       "%.1f, 3 stages %.1f; 8-bit %.1f) us\n",
				       B, L, t[0], t[1], t[2], t[3], t[4]);
				make_heads(&s, H, L, dsegs, dheads, ddense, 0);
				continue;
			}
			if (once == 5) { /* pos_sch, then ours_pos (ncu on the scatter) */
				sched_slabs(&s);
				make_heads(&s, H, L, dsegs, dheads, ddense, 7);
				RC(f_packed(&a, dheads, st));
				make_heads(&s, H, L, dsegs, dheads, ddense, 2);
				RC(f_packed(&a, dheads, st));
				make_heads(&s, H, L, dsegs, dheads, ddense, 0);
				CK(cudaStreamSynchronize(st));
				continue;
			}
			if (once == 4) { /* oscore, os_2st, os_3st (ncu on k_score) */
				RC(f_packed_ss(&a, dheads, st));
				RC(f_packed_ss_2st(&a, dheads, st));
				RC(f_packed_ss_3st(&a, dheads, st));
				CK(cudaStreamSynchronize(st));
				continue;
			}
			if (once) {
				if (once == 2) { /* ours_g2 first (ncu's first launches) */
					make_heads(&s, H, L, dsegs, dheads, ddense, 5);
					RC(f_packed(&a, dheads, st));
					make_heads(&s, H, L, dsegs, dheads, ddense, 0);
				}
				RC(f_packed(&a, dheads, st));
				RC(f_quest(&a, ddense, st));
				RC(f_dense(&a, ddense, st));
				make_heads(&s, H, L, dsegs, dheads, ddense, 1);
				RC(f_packed(&a, dheads, st)); /* ours_q6 */
				make_heads(&s, H, L, dsegs, dheads, ddense, 2);
				RC(f_packed(&a, dheads, st)); /* ours_pos */
				make_heads(&s, H, L, dsegs, dheads, ddense, 4);
				RC(f_packed(&a, dheads, st)); /* ours_s8 */
				make_heads(&s, H, L, dsegs, dheads, ddense, 3);
				RC(f_packed(&a, dheads, st)); /* pos_s8 */
				RC(f_packed_ma(&a, dheads, st)); /* ps8_ma */
				make_heads(&s, H, L, dsegs, dheads, ddense, 0);
				RC(f_packed_so(&a, dheads, st)); /* ours_so */
				make_heads(&s, H, L, dsegs, dheads, ddense, 5);
				RC(f_packed(&a, dheads, st)); /* ours_g2 */
				make_heads(&s, H, L, dsegs, dheads, ddense, 0);
				CK(cudaStreamSynchronize(st));
				continue;
			}
			cudaGraphExec_t g_p = capture(f_packed, &a, dheads);
			cudaGraphExec_t g_ps = capture(f_packed_ss, &a, dheads);
			cudaGraphExec_t g_ps1 = capture(f_packed_ss1, &a, dheads);
			cudaGraphExec_t g_psm = capture(f_packed_ssm, &a, dheads);
			cudaGraphExec_t g_pc = capture(f_packed_cc, &a, dheads);
			cudaGraphExec_t g_psc = capture(f_packed_w, &a, dheads);
			cudaGraphExec_t g_p3 = capture(f_packed_3, &a, dheads);
			cudaGraphExec_t g_p64 = capture(f_packed_64, &a, dheads);
			cudaGraphExec_t g_p128 = capture(f_packed_128, &a, dheads);
			cudaGraphExec_t g_p256 = capture(f_packed_256, &a, dheads);
			cudaGraphExec_t g_p512 = capture(f_packed_512, &a, dheads);
			cudaGraphExec_t g_psl = capture(f_packed_sl, &a, dheads);
			cudaGraphExec_t g_qsl = capture(f_quest_sl, &a, ddense);
			cudaGraphExec_t g_q = capture(f_quest, &a, ddense);
			cudaGraphExec_t g_qs = capture(f_quest_ss, &a, ddense);
			cudaGraphExec_t g_psc_cut = capture(f_packed_sc, &a, dheads);
			cudaGraphExec_t g_qsc_cut = capture(f_quest_sc, &a, ddense);
			cudaGraphExec_t g_d = capture(f_dense, &a, ddense);
			double t_p = time_graph(g_p, 1), t_ps = time_graph(g_ps, 1);
			double t_q = time_graph(g_q, 1), t_qs = time_graph(g_qs, 1);
			double t_d = time_graph(g_d, 1), t_pc = time_graph(g_pc, 1);
			double t_psc = time_graph(g_psc, 1), t_ps1 = time_graph(g_ps1, 1);
			double t_psm = time_graph(g_psm, 1), t_p3 = time_graph(g_p3, 1);
			double t_p64 = time_graph(g_p64, 1), t_p128 = time_graph(g_p128, 1);
			double t_p256 = time_graph(g_p256, 1), t_p512 = time_graph(g_p512, 1);
			double t_psl = time_graph(g_psl, 1), t_qsl = time_graph(g_qsl, 1);
			double t_pcut = time_graph(g_psc_cut, 1), t_qcut = time_graph(g_qsc_cut, 1);
			cudaGraphExec_t g_pp1 = capture(f_packed_p1, &a, dheads);
			cudaGraphExec_t g_pp2 = capture(f_packed_p2, &a, dheads);
			cudaGraphExec_t g_pp4 = capture(f_packed_p4, &a, dheads);
			double t_p1 = time_graph(g_pp1, 1), t_p2 = time_graph(g_pp2, 1);
			double t_p4 = time_graph(g_pp4, 1);
			cudaGraphExec_t g_qp2 = capture(f_quest_p2, &a, ddense);
			double t_qp2 = time_graph(g_qp2, 1);
			cudaGraphExecDestroy(g_qp2);
			cudaGraphExec_t g_pso = capture(f_packed_so, &a, dheads);
			cudaGraphExec_t g_qso = capture(f_quest_wo, &a, ddense);
			double t_pso = time_graph(g_pso, 1), t_qso = time_graph(g_qso, 1);
			double t_pb64 = time_step(f_packed_b64, &a, dheads);
			double t_pni = time_step(f_packed_ni, &a, dheads);
			double t_pmny = time_step(f_packed_many, &a, dheads);
			cudaGraphExec_t g_pmso = capture(f_packed_many_so, &a, dheads);
			cudaGraphExec_t g_pmni = capture(f_packed_many_ni, &a, dheads);
			double t_pmso = time_graph(g_pmso, 1), t_pmni = time_graph(g_pmni, 1);
			cudaGraphExecDestroy(g_pmso);
			cudaGraphExecDestroy(g_pmni);
			cudaGraphExec_t g_p2st = capture(f_packed_2st, &a, dheads);
			cudaGraphExec_t g_ps2st = capture(f_packed_ss_2st, &a, dheads);
			cudaGraphExec_t g_p3st = capture(f_packed_3st, &a, dheads);
			cudaGraphExec_t g_ps3st = capture(f_packed_ss_3st, &a, dheads);
			double t_p2st = time_graph(g_p2st, 1), t_ps2st = time_graph(g_ps2st, 1);
			double t_p3st = time_graph(g_p3st, 1), t_ps3st = time_graph(g_ps3st, 1);
			cudaGraphExecDestroy(g_p2st);
			cudaGraphExecDestroy(g_ps2st);
			cudaGraphExecDestroy(g_p3st);
			cudaGraphExecDestroy(g_ps3st);
			cudaGraphExecDestroy(g_pso);
			cudaGraphExecDestroy(g_qso);
			cudaGraphExecDestroy(g_pp1);
			cudaGraphExecDestroy(g_pp2);
			cudaGraphExecDestroy(g_pp4);
			cudaGraphExecDestroy(g_psc_cut);
			cudaGraphExecDestroy(g_qsc_cut);
			/* the serving format's rows (same bytes, 2.5x the values) */
			make_heads(&s, H, L, dsegs, dheads, ddense, 1);
			cudaGraphExec_t g_pq = capture(f_packed, &a, dheads);
			cudaGraphExec_t g_pqs = capture(f_packed_w, &a, dheads);
			cudaGraphExec_t g_pq3 = capture(f_packed_3, &a, dheads);
			double t_pq = time_graph(g_pq, 1), t_pqs = time_graph(g_pqs, 1);
			double t_pq3 = time_graph(g_pq3, 1);
			cudaGraphExecDestroy(g_pq);
			cudaGraphExecDestroy(g_pqs);
			cudaGraphExecDestroy(g_pq3);
			/* bf16 rows with value positions */
			make_heads(&s, H, L, dsegs, dheads, ddense, 2);
			cudaGraphExec_t g_pp = capture(f_packed, &a, dheads);
			cudaGraphExec_t g_pp128 = capture(f_packed_128, &a, dheads);
			cudaGraphExec_t g_pp512 = capture(f_packed_512, &a, dheads);
			double t_pp = time_graph(g_pp, 1), t_pp128 = time_graph(g_pp128, 1);
			double t_pp512 = time_graph(g_pp512, 1);
			cudaGraphExecDestroy(g_pp);
			cudaGraphExecDestroy(g_pp128);
			cudaGraphExecDestroy(g_pp512);
			/* 8-bit summaries: the step and its score stage, then
			 * with value positions too */
			make_heads(&s, H, L, dsegs, dheads, ddense, 4);
			cudaGraphExec_t g_p8 = capture(f_packed, &a, dheads);
			cudaGraphExec_t g_ps8 = capture(f_packed_ss, &a, dheads);
			double t_p8 = time_graph(g_p8, 1), t_ps8 = time_graph(g_ps8, 1);
			double t_ps8c = time_step(f_packed_sc, &a, dheads);
			double t8_1 = NAN, t8_2 = NAN;
			if (split) {
				cudaGraphExec_t g1 = capture(f_packed_upto1, &a, dheads);
				cudaGraphExec_t g2 = capture(f_packed_upto2, &a, dheads);
				t8_1 = time_graph(g1, 1);
				t8_2 = time_graph(g2, 1);
				cudaGraphExecDestroy(g1);
				cudaGraphExecDestroy(g2);
			}
			cudaGraphExecDestroy(g_p8);
			cudaGraphExecDestroy(g_ps8);
			make_heads(&s, H, L, dsegs, dheads, ddense, 3);
			cudaGraphExec_t g_pp8 = capture(f_packed, &a, dheads);
			cudaGraphExec_t g_pp8m = capture(f_packed_ma, &a, dheads);
			cudaGraphExec_t g_pp81 = capture(f_packed_p1, &a, dheads);
			double t_pp8 = time_graph(g_pp8, 1), t_pp8m = time_graph(g_pp8m, 1);
			double t_pp81 = time_graph(g_pp81, 1);
			cudaGraphExec_t g_pp8so = capture(f_packed_so, &a, dheads);
			cudaGraphExec_t g_pp8b = capture(f_packed_b64, &a, dheads);
			double t_pp8so = time_graph(g_pp8so, 1), t_pp8b = time_graph(g_pp8b, 1);
			cudaGraphExecDestroy(g_pp8so);
			cudaGraphExecDestroy(g_pp8b);
			cudaGraphExecDestroy(g_pp81);
			cudaGraphExecDestroy(g_pp8);
			cudaGraphExecDestroy(g_pp8m);
			/* g = 2 bitmaps, then with 8-bit summaries too */
			make_heads(&s, H, L, dsegs, dheads, ddense, 5);
			cudaGraphExec_t g_pg2 = capture(f_packed, &a, dheads);
			cudaGraphExec_t g_pg25 = capture(f_packed_512, &a, dheads);
			double t_pg2 = time_graph(g_pg2, 1), t_pg25 = time_graph(g_pg25, 1);
			cudaGraphExecDestroy(g_pg2);
			cudaGraphExecDestroy(g_pg25);
			make_heads(&s, H, L, dsegs, dheads, ddense, 6);
			cudaGraphExec_t g_pg28 = capture(f_packed, &a, dheads);
			cudaGraphExec_t g_pg285 = capture(f_packed_512, &a, dheads);
			double t_pg28 = time_graph(g_pg28, 1), t_pg285 = time_graph(g_pg285, 1);
			double t_pg28mny = time_step(f_packed_many, &a, dheads);
			cudaGraphExecDestroy(g_pg28);
			cudaGraphExecDestroy(g_pg285);
			/* bf16 rows and positions in store order (pos_sch; the
			 * slabs scheduled at the first shape) */
			sched_slabs(&s);
			make_heads(&s, H, L, dsegs, dheads, ddense, 7);
			cudaGraphExec_t g_psch = capture(f_packed, &a, dheads);
			double t_psch = time_graph(g_psch, 1);
			cudaGraphExecDestroy(g_psch);
			make_heads(&s, H, L, dsegs, dheads, ddense, 0);
			/* bytes the packed step must read: summaries, both rotations of
			 * every segment, the selected blocks' packed K and V, the window */
			CK(cudaGraphLaunch(g_ps, st)); /* the step leaves no list: the
							* score+select stage writes it */
			CK(cudaStreamSynchronize(st));
			double bytes = 0, bytes_pos = 0;
			uint64_t nsel_tot = 0;
			for (uint32_t h = 0; h < H; h++) {
				uint32_t cnt[2];
				CK(cudaMemcpy(cnt, gpu_ws_counts(&a, h), 8, cudaMemcpyDeviceToHost));
				nsel_tot += cnt[0];
				bytes += (double)(L / BB) * SS * 2 * 2 + (double)(L / seglen) * 2 * DK * D * 2 +
					 (double)cnt[0] * BB * (RR * 2 + BW * 4) * 2 + (double)WIN * D * 2 * 2;
				bytes_pos += (double)cnt[0] * BB * (GPU_POS_STRIDE(RR) - BW * 4.0) * 2;
			}
			bytes_pos += bytes;
			/* 8-bit summaries: 2S + 4 bytes a block where 4S were */
			const double s8_less = (double)H * (L / BB) * (SS * 4.0 - (2.0 * SS + 4));
			double bytes_pos8 = bytes_pos - s8_less;
			/* g = 2: BW2 bitmap words a vector where BW were */
			double bytes_g2 = bytes - (double)nsel_tot * BB * (BW - BW2) * 4.0 * 2;
			double bytes_g28 = bytes_g2 - s8_less;
			double sd = sdpa_of(B, L);
			double bwf = bytes / (t_p * 1e-6) / copy_bw;
			printf("%5u %8u | %9.1f %9.1f %6.3f | %9.1f %9.1f | %9.1f %9.1f %9.1f | %7.2f %7.2f "
			       "%7.2f %7.2f | %8.2f %6.3f | %9.1f | %9.1f %9.1f | %9.1f %9.1f | %9.1f %9.1f "
			       "%9.1f %9.1f %9.1f %9.1f | %9.1f %9.1f | %9.1f %9.1f %9.1f | %9.1f %9.1f %9.1f "
			       "%7.2f %9.1f | %9.1f %9.1f %9.1f %7.2f %7.2f | %9.1f %9.1f %9.1f %9.1f %9.1f | "
			       "%9.1f %9.1f %9.1f %9.1f %9.1f %9.1f | %9.1f %9.1f %7.2f "
			       "%6.3f %9.1f %9.1f | %9.1f %9.1f %9.1f %9.1f | %9.1f %9.1f %9.1f %9.1f | "
			       "%9.1f %7.2f %7.2f\n",
			       B, L, t_d, sd, t_d / sd, t_q, t_qs, t_p, t_ps, t_pc,
			       t_d / t_p, sd / t_p, t_q / t_p, t_qs / t_ps,
			       bytes / (t_p * 1e-6) / 1e12, bwf, t_pq, t_psc, t_pqs, t_ps1,
			       t_psm, t_p3, t_pq3, t_p64, t_p128, t_p256, t_p512, t_psl,
			       t_qsl, t_pp, t_pp128, t_pp512, t_p8, t_ps8, t_pp8,
			       t_qs / t_ps8, t_pp8m, t_pcut, t_qcut, t_ps8c,
			       t_qcut / t_pcut, t_qcut / t_ps8c, t_p1, t_p2, t_p4, t_pp81,
			       t_qp2, t_pso, t_qso, t_pp8so, t_pb64, t_pp8b, t_pni, t_pg2,
			       t_pg28, t_d / t_pg2,
			       bytes_g2 / (t_pg2 * 1e-6) / copy_bw, t_pg25, t_pg285,
			       t_pmny, t_pg28mny, t_pmso, t_pmni, t_p2st, t_ps2st, t_p3st,
			       t_ps3st, t_psch, t_d / t_psch, t_q / t_psch);
			if (split) {
				/* the stage in a graph, as in the step (with its PDL
				 * hand-overs), cut after qrot and after the score */
				cudaGraphExec_t g1 = capture(f_packed_upto1, &a, dheads);
				cudaGraphExec_t g2 = capture(f_packed_upto2, &a, dheads);
				double t1 = time_graph(g1, 1), t2 = time_graph(g2, 1);
				printf("      split: clear+qrot %.1f us, +score %.1f us, +select %.1f us "
				       "(oscore); 8-bit: %.1f, %.1f, %.1f us (os_s8)\n", t1, t2, t_ps, t8_1,
				       t8_2, t_ps8);
				cudaGraphExecDestroy(g1);
				cudaGraphExecDestroy(g2);
			}
			fflush(stdout);
			if (B == 1 && L == 1048576) {
				r_dense1m = t_d / t_p;
				r_quest1m = t_q / t_p;
				r_score1m = t_qs / t_ps;
				r_sdpa1m = t_d / sd;
				r_dpos1m = t_d / t_pp;
				r_qpos1m = t_q / t_pp;
				r_ds81m = t_d / t_pp8;
				r_qs81m = t_q / t_pp8;
				r_sc81m = t_qs / t_ps8;
				r_sccut1m = t_qcut / t_pcut;
				r_s8cut1m = t_qcut / t_ps8c;
				r_dg21m = t_d / t_pg2;
				r_qg21m = t_q / t_pg2;
				r_dg281m = t_d / t_pg28;
				r_dsch1m = t_d / t_psch;
				r_qsch1m = t_q / t_psch;
			}
			if (B == 1 && L == 262144) {
				r_bw256 = bwf;
				r_bwpos256 = bytes_pos / (t_pp * 1e-6) / copy_bw;
				r_bws8256 = bytes_pos8 / (t_pp8 * 1e-6) / copy_bw;
				r_bwg2256 = bytes_g2 / (t_pg2 * 1e-6) / copy_bw;
				r_bwg28256 = bytes_g28 / (t_pg28 * 1e-6) / copy_bw;
				r_bwsch256 = bytes_pos / (t_psch * 1e-6) / copy_bw;
			}
			(void)nsel_tot;
			cudaGraphExecDestroy(g_p);
			cudaGraphExecDestroy(g_ps);
			cudaGraphExecDestroy(g_ps1);
			cudaGraphExecDestroy(g_psm);
			cudaGraphExecDestroy(g_pc);
			cudaGraphExecDestroy(g_psc);
			cudaGraphExecDestroy(g_p3);
			cudaGraphExecDestroy(g_p64);
			cudaGraphExecDestroy(g_p128);
			cudaGraphExecDestroy(g_p256);
			cudaGraphExecDestroy(g_p512);
			cudaGraphExecDestroy(g_psl);
			cudaGraphExecDestroy(g_qsl);
			cudaGraphExecDestroy(g_q);
			cudaGraphExecDestroy(g_qs);
			cudaGraphExecDestroy(g_d);
		}
	}
	if (npair) {
		/* the paired mode times nothing else */
		printf("RESULT name=attn_pair pairs=%d rounds=%d%s\n", npres, pair_rounds, pres);
		return 0;
	}
	printf("(ours = PackedAttention, products on the tensor cores; ours_cc = the same on CUDA "
	       "cores only; oscore / qscore = score+select stages alone; x_dense = dense/ours, "
	       "x_sdpa = torch SDPA/ours, x_quest = quest/ours, x_score = qscore/oscore; d/sdpa = our "
	       "dense / torch SDPA; bwfrac = bytes the packed step must read / time / device copy "
	       "bandwidth; ours_q6 = ours over 6-bit rows of r = %d, same bytes; ours_w, q6_w = ours, "
	       "ours_q6 without the staged path (GPU_ATTN_WALK: the version before it); os_1cta = oscore with the "
	       "one-CTA select forced, GPU_ATTN_SELECT_ONE_CTA; os_many = the same with the many-CTA "
	       "select forced; ours_3, q6_3 = ours, ours_q6 without GPU_ATTN_SMALL_ROWS: three CTAs per SM, not five; ours_64 .. ours_512 = ours with work chunks of 64 / 128 / 256 / 512 blocks forced; ours_sl, quest_sl = ours, quest with the select writing lists for the attention kernel, GPU_ATTN_SELECT_LIST; ours_pos = ours with value positions beside the bitmaps, gpu_seg_positions; pos_128, pos_512 = ours_pos with work chunks of 128 / 512 blocks forced; ours_s8, os_s8 = ours, oscore with 8-bit summaries scored in integers, gpu_seg_sum8; pos_s8 = ours with both; x_sc_s8 = qscore / os_s8; oscut, qscut, os8cut = oscore, qscore, os_s8 run as the steps run them (GPU_ATTN_STAGE_CUT: where the step leaves only the cut, the stage writes no lists); x_sccut = qscut / oscut, x_s8cut = qscut / os8cut; ps8_ma = pos_s8 with the merge folding every slot, GPU_ATTN_MERGE_ALL: the merge before it compacted the live slots; ours_p1, ours_p2, ours_p4 = ours with 1, 2 or 4 slots a window forced, GPU_ATTN_PARTS_*: a window of many selected blocks split over them; ps8_p1 = pos_s8 with one slot a window; quest_p2 = quest with two slots a window forced; ours_so, pos8_so = ours, pos_s8 with the attention CTAs in slot order, GPU_ATTN_SLOT_ORDER: the version before the select ordered them by work; quest_wo = quest with its CTAs ordered by work, GPU_ATTN_WORK_ORDER; ours_b64, ps8_b64 = ours, pos_s8 with windows split only past 64 selected blocks a part, GPU_ATTN_PART_64; ours_ni = ours without the select's idle marks, GPU_ATTN_NO_IDLE: every attention CTA finds its own work; ours_g2 = ours with g = 2 bitmaps, a bit a pair of channels (the same values, 16 pairs of 48; the expansion's loads halve), g2_s8 = ours_g2 with 8-bit summaries, x_d_g2 = dense / ours_g2, bwf_g2 = ours_g2's bwfrac; g2_512, g28_512 = ours_g2, g2_s8 with work chunks of 512 blocks forced; ours_mny, g28_mny = ours, g2_s8 with the many-CTA select forced, GPU_ATTN_SELECT_MANY_CTAS: the step's select where a context has 32,768 blocks or more, which orders the attention CTAs (the one-CTA select orders them only where windows are 512 blocks wide); ours_mso, ours_mni = ours_mny in slot order (GPU_ATTN_SLOT_ORDER) and without idle marks (GPU_ATTN_NO_IDLE); ours_2st, os_2st = ours, oscore with the score kernel's two stages of tiles forced, three CTAs an SM, GPU_ATTN_SCORE_2STAGE: the version before two spread over the SMs (two CTAs an SM, GPU_ATTN_SCORE_SPREAD) became the default wherever that grid has more CTAs than SMs; ours_3st, os_3st = the same with three forced, GPU_ATTN_SCORE_3STAGE: the default before the spread where CTAs took eight tiles or more; pos_sch = ours_pos with each 16-token block's (value, position) pairs in store order, gpu_seg_schedule; x_d_sch = dense / pos_sch, x_q_sch = quest / pos_sch)\n", RQ);

	if (once)
		return 0;
	double flush = bench_flush();
	printf("\nupdate buffer: 64 tokens x 32 layers x 8 KV heads (K and V) in one append: "
	       "%.2f us per layer\n", flush);

	struct enc_res er;
	bench_encode(&s, &er);
	printf("\nprefill encoding, one layer at 64K tokens (8 KV heads, K and V: 16 matrices):\n"
	       "  covariance (cuBLAS)      %9.1f us\n"
	       "  eigen (cuSOLVER, batched)  %9.1f us\n"
	       "  rotate+top-r+pack+summ.  %9.1f us\n"
	       "  total, all on the GPU    %9.1f us\n"
	       "  eigen on 16 CPU threads (LAPACKE ssyevd, with transfers) %9.1f us\n"
	       "  GPU time with the eigen overlapped on CPU workers %9.1f us\n"
	       "  torch SDPA causal prefill of the layer %9.1f us\n",
	       er.cov, er.eig_gpu, er.pack, er.total_gpu, er.eig_cpu, er.total_overlap, sdpa_prefill);
	double frac = er.total_gpu / sdpa_prefill;
	printf("  encode / prefill attention: %.4f (all on GPU), %.4f (eigen on CPU workers)\n", frac,
	       er.total_overlap / sdpa_prefill);

	/* the first seven keys are the issue's, for the library's default
	 * device format; the _pos keys are the same with value positions
	 * (mkv_seq_opts.device_positions); the _s8 keys with value positions
	 * and 8-bit scores (pos_s8; its score stage os_s8); the _g2 keys with
	 * g = 2 bitmaps (ours_g2), _g2s8 with 8-bit summaries too (g2_s8); _sch
	 * with value positions in store order (pos_sch, gpu_seg_schedule) */
	printf("RESULT name=attn speedup_dense_1m=%.3f speedup_quest_1m=%.3f "
	       "score_speedup_quest_1m=%.3f dense_vs_sdpa_1m=%.3f bw_frac_256k=%.3f "
	       "flush_us_per_layer=%.2f prefill_encode_frac_64k=%.4f speedup_dense_1m_pos=%.3f "
	       "speedup_quest_1m_pos=%.3f bw_frac_256k_pos=%.3f speedup_dense_1m_s8=%.3f "
	       "speedup_quest_1m_s8=%.3f score_speedup_quest_1m_s8=%.3f bw_frac_256k_s8=%.3f "
	       "score_speedup_quest_1m_cut=%.3f score_speedup_quest_1m_s8_cut=%.3f "
	       "speedup_dense_1m_g2=%.3f speedup_quest_1m_g2=%.3f bw_frac_256k_g2=%.3f "
	       "speedup_dense_1m_g2s8=%.3f bw_frac_256k_g2s8=%.3f speedup_dense_1m_sch=%.3f "
	       "speedup_quest_1m_sch=%.3f bw_frac_256k_sch=%.3f\n",
	       r_dense1m, r_quest1m, r_score1m, r_sdpa1m, r_bw256, flush, frac, r_dpos1m, r_qpos1m,
	       r_bwpos256, r_ds81m, r_qs81m, r_sc81m, r_bws8256, r_sccut1m, r_s8cut1m, r_dg21m,
	       r_qg21m, r_bwg2256, r_dg281m, r_bwg28256, r_dsch1m, r_qsch1m, r_bwsch256);
	return 0;
}
