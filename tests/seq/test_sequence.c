/* SPDX-License-Identifier: MIT */
/*
 * Sequences (mosaickv/sequence.c): no token lost or doubled across swaps,
 * swaps never make things worse, failed finalizations lose nothing,
 * back-pressure bounds the lag, bad input changes nothing.  References are
 * computed here in double precision from the raw tokens.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mosaickv.h>
#include "mosaickv/seq_internal.h"
#include "mosaickv/store_internal.h"
#include "tiers/tier.h"

/* xorshift64*, one per thread */
static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

static float rng_normal(uint64_t *s)
{
	double u = ((rng_next(s) >> 11) + 1.0) / 9007199254740993.0;
	double v = ((rng_next(s) >> 11) + 1.0) / 9007199254740993.0;
	return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* A fresh seed a test, logged (a failure's output shows it) and fixed by
 * MKV_TEST_SEED to run that failure again (tests only: the library reads
 * no environment). */
static uint64_t fresh_seed(void)
{
	const char *fix = getenv("MKV_TEST_SEED");
	uint64_t s;
	if (fix && *fix) {
		s = strtoull(fix, NULL, 10);
	} else {
		struct timespec t;
		clock_gettime(CLOCK_REALTIME, &t);
		s = (uint64_t)t.tv_nsec * 2654435761u + (uint64_t)t.tv_sec + 1;
	}
	cr_log_info("seed %llu (MKV_TEST_SEED)", (unsigned long long)s);
	return s;
}

/* Exact softmax attention of one query over n tokens, double precision. */
static void ref_attention(const float *q, const float *k, const float *v,
			  size_t n, uint32_t d, double *out)
{
	double m = -INFINITY, l = 0, scale = 1.0 / sqrt((double)d);
	double *s = malloc(sizeof(double) * n);
	for (size_t i = 0; i < n; i++) {
		double x = 0;
		for (uint32_t c = 0; c < d; c++)
			x += (double)q[c] * k[i * d + c];
		s[i] = x * scale;
		m = s[i] > m ? s[i] : m;
	}
	memset(out, 0, sizeof(double) * d);
	for (size_t i = 0; i < n; i++) {
		double p = exp(s[i] - m);
		l += p;
		for (uint32_t c = 0; c < d; c++)
			out[c] += p * v[i * d + c];
	}
	for (uint32_t c = 0; c < d; c++)
		out[c] /= l;
	free(s);
}

/* A sequence's raw tokens, kept by the test: [layer][head][t][d]. */
struct truth {
	uint32_t L, H, G, d, cap, n;
	float *k, *v;
};

static void truth_init(struct truth *t, uint32_t L, uint32_t H, uint32_t G,
		       uint32_t d, uint32_t cap)
{
	*t = (struct truth){L, H, G, d, cap, 0, NULL, NULL};
	t->k = calloc((size_t)L * H * cap * d, sizeof(float));
	t->v = calloc((size_t)L * H * cap * d, sizeof(float));
	cr_assert(t->k && t->v);
}

static float *tk(struct truth *t, uint32_t l, uint32_t h, uint32_t i)
{
	return t->k + (((size_t)l * t->H + h) * t->cap + i) * t->d;
}

static float *tv(struct truth *t, uint32_t l, uint32_t h, uint32_t i)
{
	return t->v + (((size_t)l * t->H + h) * t->cap + i) * t->d;
}

/* Relative error of the sequence's attention of layer @l against the
 * reference over every token the test appended. */
static double attend_error(struct mkv_seq *s, struct truth *t, uint32_t l,
			   uint64_t *rng)
{
	uint32_t HG = t->H * t->G, d = t->d;
	float *q = malloc(sizeof(float) * HG * d), *out = malloc(sizeof(float) * HG * d);
	double *ref = malloc(sizeof(double) * d), e = 0, r = 0;
	for (uint32_t i = 0; i < HG * d; i++)
		q[i] = 0.3f * rng_normal(rng);
	int rc = mkv_seq_attend(s, l, q, out, NULL);
	cr_assert_eq(rc, 0, "attend: %s", mkv_strerror(rc));
	for (uint32_t qh = 0; qh < HG; qh++) {
		uint32_t h = qh / t->G;
		ref_attention(q + qh * d, tk(t, l, h, 0), tv(t, l, h, 0), t->n, d, ref);
		for (uint32_t c = 0; c < d; c++) {
			e += (out[qh * d + c] - ref[c]) * (out[qh * d + c] - ref[c]);
			r += ref[c] * ref[c];
		}
	}
	free(q);
	free(out);
	free(ref);
	return sqrt(e / r);
}

/* A CPU store: a top tier of @hbm bytes, 256 MiB of host tier, two
 * workers; @hot: the hot-block cache's share of the top tier (< 0: the
 * default). */
static struct mkv_store *host_store_hot(size_t hbm, double hot)
{
	struct mkv_store_opts so;
	mkv_store_opts_init(&so, sizeof so);
	so.gpu = -1;
	so.hbm_bytes = hbm;
	so.host_bytes = (size_t)256 << 20;
	so.workers = 2;
	if (hot >= 0)
		so.hot_fraction = hot;
	struct mkv_store *st = NULL;
	int rc = mkv_store_create(&so, &st);
	cr_assert_eq(rc, 0, "store: %s", mkv_strerror(rc));
	return st;
}

static struct mkv_store *host_store(size_t hbm)
{
	return host_store_hot(hbm, -1.0);
}

/* Exact configuration: r = d, no drop, f32, every block selected. */
static void exact_opts(struct mkv_seq_opts *o, uint32_t L, uint32_t H,
		       uint32_t G, uint32_t d)
{
	mkv_seq_opts_init(o, sizeof *o);
	o->layers = L;
	o->kv_heads = H;
	o->q_per_kv = G;
	o->d = d;
	o->prefill_segment = 128;
	o->r = d;
	o->g = 1;
	o->b = 16;
	o->drop = 0;
	o->store_dtype = MKV_DTYPE_F32;
	o->value_bits = 0;
	o->token_frac = 1.0;
	o->min_segment = 32;
	o->max_segment = 96;
	o->window = 16;
	o->staging_bytes = (size_t)8 << 20;
}

static void fill_random(struct truth *t, uint32_t from, uint32_t to, uint64_t *rng)
{
	for (uint32_t l = 0; l < t->L; l++)
		for (uint32_t h = 0; h < t->H; h++)
			for (uint32_t i = from; i < to; i++)
				for (uint32_t c = 0; c < t->d; c++) {
					tk(t, l, h, i)[c] = rng_normal(rng);
					tv(t, l, h, i)[c] = rng_normal(rng);
				}
}

static void prefill_all(struct mkv_seq *s, struct truth *t, uint32_t n0)
{
	size_t per = (size_t)n0 * t->d;
	float *k = malloc(sizeof(float) * t->H * per), *v = malloc(sizeof(float) * t->H * per);
	for (uint32_t l = 0; l < t->L; l++) {
		for (uint32_t h = 0; h < t->H; h++) {
			memcpy(k + h * per, tk(t, l, h, 0), sizeof(float) * per);
			memcpy(v + h * per, tv(t, l, h, 0), sizeof(float) * per);
		}
		int rc = mkv_seq_prefill(s, l, k, v, MKV_DTYPE_F32, n0);
		cr_assert_eq(rc, 0, "prefill: %s", mkv_strerror(rc));
	}
	t->n = n0;
	free(k);
	free(v);
}

/* ---------------------------------------------------------------------- */
/* No token lost or doubled: S sequences on T threads, random forced swaps. */

struct driver {
	struct mkv_seq **seqs;
	struct truth *truth;
	uint32_t nseq, steps;
	uint64_t seed;
	double maxerr;
	uint64_t swaps;
};

static void *drive(void *arg)
{
	struct driver *dr = arg;
	uint64_t rng = dr->seed;
	struct truth *t0 = &dr->truth[0];
	uint32_t H = t0->H, d = t0->d;
	float *k = malloc(sizeof(float) * dr->nseq * H * d);
	float *v = malloc(sizeof(float) * dr->nseq * H * d);
	for (uint32_t step = 0; step < dr->steps; step++) {
		for (uint32_t l = 0; l < t0->L; l++) {
			for (uint32_t i = 0; i < dr->nseq; i++) {
				struct truth *t = &dr->truth[i];
				for (uint32_t h = 0; h < H; h++)
					for (uint32_t c = 0; c < d; c++) {
						float a = rng_normal(&rng), b = rng_normal(&rng);
						tk(t, l, h, t->n)[c] = a;
						tv(t, l, h, t->n)[c] = b;
						k[((size_t)i * H + h) * d + c] = a;
						v[((size_t)i * H + h) * d + c] = b;
					}
			}
			/* One batched append over this thread's sequences. */
			int rc = mkv_seq_append(dr->seqs, dr->nseq, l, k, v, MKV_DTYPE_F32);
			cr_assert_eq(rc, 0, "append: %s", mkv_strerror(rc));
		}
		for (uint32_t i = 0; i < dr->nseq; i++)
			dr->truth[i].n++;
		for (uint32_t i = 0; i < dr->nseq; i++) {
			/* The test hook: swaps forced at random steps. */
			uint64_t x = rng_next(&rng) % 8;
			if (x == 0)
				mkv_seq_flush(dr->seqs[i], (uint32_t)(rng_next(&rng) % t0->L));
			else if (x == 1)
				mkv_seq_flush(dr->seqs[i], UINT32_MAX);
			if (x <= 1 && rng_next(&rng) % 2)
				mkv_seq_sync(dr->seqs[i]);
			for (uint32_t l = 0; l < t0->L; l++) {
				double e = attend_error(dr->seqs[i], &dr->truth[i], l, &rng);
				dr->maxerr = e > dr->maxerr ? e : dr->maxerr;
			}
		}
	}
	for (uint32_t i = 0; i < dr->nseq; i++) {
		mkv_seq_sync(dr->seqs[i]);
		struct mkv_seq_stats st = {.size = sizeof st};
		cr_assert_eq(mkv_seq_get_stats(dr->seqs[i], &st), 0);
		cr_assert_eq(st.tokens, dr->truth[i].n, "tokens %llu, appended %u",
			     (unsigned long long)st.tokens, dr->truth[i].n);
		cr_assert_eq(st.finalize_failed, 0);
		dr->swaps += st.swaps;
		for (uint32_t l = 0; l < t0->L; l++) {
			double e = attend_error(dr->seqs[i], &dr->truth[i], l, &rng);
			dr->maxerr = e > dr->maxerr ? e : dr->maxerr;
		}
	}
	free(k);
	free(v);
	return NULL;
}

static void no_token_lost(uint32_t nseq, uint32_t threads, uint32_t steps)
{
	const uint32_t L = 2, H = 2, G = 2, d = 64, n0 = 200;
	uint64_t seed = fresh_seed(), rng = seed;
	struct mkv_store *st = host_store((size_t)2 << 20); /* segments spill */
	struct mkv_seq_opts o;
	exact_opts(&o, L, H, G, d);
	struct mkv_seq **seqs = calloc(nseq, sizeof(*seqs));
	struct truth *truth = calloc(nseq, sizeof(*truth));
	for (uint32_t i = 0; i < nseq; i++) {
		truth_init(&truth[i], L, H, G, d, n0 + steps);
		fill_random(&truth[i], 0, n0, &rng);
		int rc = mkv_seq_open(st, &o, 1000 + i, &seqs[i]);
		cr_assert_eq(rc, 0, "open: %s", mkv_strerror(rc));
		prefill_all(seqs[i], &truth[i], n0);
	}
	if (threads > nseq)
		threads = nseq;
	pthread_t th[8];
	struct driver dr[8];
	for (uint32_t t = 0; t < threads; t++) {
		uint32_t a = nseq * t / threads, b = nseq * (t + 1) / threads;
		dr[t] = (struct driver){.seqs = seqs + a, .truth = truth + a,
					.nseq = b - a, .steps = steps,
					.seed = seed * (t + 7) + 1};
		pthread_create(&th[t], NULL, drive, &dr[t]);
	}
	double maxerr = 0;
	uint64_t swaps = 0;
	for (uint32_t t = 0; t < threads; t++) {
		pthread_join(th[t], NULL);
		maxerr = dr[t].maxerr > maxerr ? dr[t].maxerr : maxerr;
		swaps += dr[t].swaps;
	}
	cr_assert(maxerr < 1e-5, "seed %llu: %u sequences: max relative error %.3g",
		  (unsigned long long)seed, nseq, maxerr);
	/* Every sequence crossed at least one swap (prefill leaves an open
	 * segment; max_segment closes it). */
	cr_assert(swaps >= nseq, "seed %llu: only %llu swaps", (unsigned long long)seed,
		  (unsigned long long)swaps);
	struct mkv_store_stats ss = {.size = sizeof ss};
	cr_assert_eq(mkv_store_get_stats(st, &ss), 0);
	cr_assert(ss.tier[MKV_TIER_HOST].segments > 0, "nothing spilled below HBM");
	for (uint32_t i = 0; i < nseq; i++) {
		cr_assert_eq(mkv_seq_close(seqs[i]), 0);
		free(truth[i].k);
		free(truth[i].v);
	}
	cr_assert_eq(mkv_store_get_stats(st, &ss), 0);
	for (int t = 0; t < MKV_TIER_COUNT; t++)
		cr_assert_eq(ss.tier[t].segments, 0, "close left segments in tier %d", t);
	free(seqs);
	free(truth);
	mkv_store_destroy(st);
}

Test(sequence, no_token_lost_1_seq, .timeout = 120) { no_token_lost(1, 1, 160); }
Test(sequence, no_token_lost_8_seqs_4_threads, .timeout = 240) { no_token_lost(8, 4, 80); }
Test(sequence, no_token_lost_64_seqs_4_threads, .timeout = 600) { no_token_lost(64, 4, 24); }

/* ---------------------------------------------------------------------- */
/* The swap never makes things worse. */

/* @value_bits 0: r = 16 bf16 values (25% of the channels); else the
 * default budget (r = 0) in rows of that many bits. */
static void swap_not_worse(uint32_t value_bits)
{
	const uint32_t L = 1, H = 1, G = 4, d = 64, n0 = 512, steps = 256;
	uint64_t seed = fresh_seed(), rng = seed;
	struct mkv_store *st = host_store((size_t)64 << 20);
	struct mkv_seq_opts o;
	exact_opts(&o, L, H, G, d);
	o.r = value_bits ? 0 : 16; /* compression on */
	o.value_bits = value_bits;
	o.store_dtype = MKV_DTYPE_BF16;
	o.prefill_segment = 512;
	o.max_segment = 4096; /* no automatic close during the test */
	o.min_segment = 4096;
	o.window = 0;
	struct truth t;
	truth_init(&t, L, H, G, d, n0 + steps);
	/* Low-rank data whose principal directions change between the
	 * prefill and the decode tokens: the temporary compression (with the
	 * prefill's rotation) fits the new tokens badly. */
	float A[2][8][64];
	for (int p = 0; p < 2; p++)
		for (int j = 0; j < 8; j++)
			for (uint32_t c = 0; c < d; c++)
				A[p][j][c] = rng_normal(&rng);
	for (uint32_t i = 0; i < n0 + steps; i++) {
		int p = i >= n0;
		float z[8], zv[8];
		for (int j = 0; j < 8; j++) {
			z[j] = rng_normal(&rng) * (float)(8 - j);
			zv[j] = rng_normal(&rng) * (float)(8 - j);
		}
		for (uint32_t c = 0; c < d; c++) {
			float x = 0.05f * rng_normal(&rng), y = 0.05f * rng_normal(&rng);
			for (int j = 0; j < 8; j++) {
				x += z[j] * A[p][j][c];
				y += zv[j] * A[1 - p][j][c];
			}
			tk(&t, 0, 0, i)[c] = x;
			tv(&t, 0, 0, i)[c] = y;
		}
	}
	struct mkv_seq *s;
	cr_assert_eq(mkv_seq_open(st, &o, 1, &s), 0);
	prefill_all(s, &t, n0);
	for (uint32_t i = n0; i < n0 + steps; i++) {
		cr_assert_eq(mkv_seq_append(&s, 1, 0, tk(&t, 0, 0, i), tv(&t, 0, 0, i),
					    MKV_DTYPE_F32), 0);
		t.n++;
	}
	double before = 0, after = 0;
	uint64_t r1 = seed ^ 0x5555, r2 = r1;
	for (int qn = 0; qn < 32; qn++)
		before += attend_error(s, &t, 0, &r1);
	cr_assert_eq(mkv_seq_flush(s, 0), 0);
	cr_assert_eq(mkv_seq_sync(s), 0);
	struct mkv_seq_stats ss = {.size = sizeof ss};
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	cr_assert_eq(ss.swaps, 1, "swaps %llu", (unsigned long long)ss.swaps);
	for (int qn = 0; qn < 32; qn++)
		after += attend_error(s, &t, 0, &r2); /* the same queries */
	cr_assert(after <= before, "seed %llu bits %u: error after the swap %.4f > before %.4f",
		  (unsigned long long)seed, value_bits, after / 32, before / 32);
	mkv_seq_close(s);
	mkv_store_destroy(st);
	free(t.k);
	free(t.v);
}

Test(sequence, swap_not_worse_on_drifting_data, .timeout = 120) { swap_not_worse(0); }
Test(sequence, swap_not_worse_quantized_default, .timeout = 120) { swap_not_worse(6); }

/* Offload moves a layer's final segments to pinned host memory and
 * attention reads the same bytes from there; prefetch of the last
 * selection brings those blocks back into the top tier's hot cache. */
static void attend_out(struct mkv_seq *s, uint32_t layer, const float *q, float *out)
{
	int rc = mkv_seq_attend(s, layer, q, out, NULL);
	cr_assert_eq(rc, 0, "attend: %s", mkv_strerror(rc));
}

/* attend_threads: the KV heads attended on several threads, each with its
 * own fetch context, and their appends encoded there too, give the
 * outputs and fetch counts of the caller alone, bit for bit: through
 * decode appends (closes, swaps), an offloaded layer (blocks fetched from
 * below) and two-stage selection.  Under TSan (scripts/test.sh) also a
 * check that heads share nothing. */
Test(sequence, attend_threads_change_nothing_but_time, .timeout = 120)
{
	const uint32_t L = 2, H = 4, G = 2, d = 64, n0 = 1024, steps = 96;
	uint64_t rng = fresh_seed();
	struct mkv_store *st = host_store((size_t)64 << 20);
	struct mkv_seq *s[2];
	for (int i = 0; i < 2; i++) {
		struct mkv_seq_opts o;
		mkv_seq_opts_init(&o, sizeof o); /* the serving defaults */
		cr_assert_eq(o.attend_threads, 1);
		o.layers = L, o.kv_heads = H, o.q_per_kv = G, o.d = d;
		o.prefill_segment = 256;
		o.max_segment = 64; /* decode segments close and swap */
		o.min_segment = 16;
		/* open segments reach past the window: attended packed */
		o.window = 16;
		o.refine = 2.0;
		o.attend_threads = i ? 3 : 1;
		cr_assert_eq(mkv_seq_open(st, &o, 41 + (uint64_t)i, &s[i]), 0);
	}
	struct truth t;
	truth_init(&t, L, H, G, d, n0 + steps);
	fill_random(&t, 0, n0 + steps, &rng);
	for (int i = 0; i < 2; i++) {
		prefill_all(s[i], &t, n0);
		cr_assert_eq(mkv_seq_sync(s[i]), 0);
	}
	float q[4 * 2 * 64], o0[4 * 2 * 64], o1[4 * 2 * 64], kt[4 * 64], vt[4 * 64];
	for (uint32_t step = 0; step < steps; step++) {
		if (step == steps / 2)
			for (int i = 0; i < 2; i++) {
				cr_assert(mkv_seq_offload(s[i], 0) > 0);
				cr_assert_eq(mkv_seq_sync(s[i]), 0);
			}
		for (uint32_t l = 0; l < L; l++) {
			for (uint32_t h = 0; h < H; h++) {
				memcpy(kt + h * d, tk(&t, l, h, n0 + step), sizeof(float) * d);
				memcpy(vt + h * d, tv(&t, l, h, n0 + step), sizeof(float) * d);
			}
			/* each sequence's swaps land when they land: sync both,
			 * so that both attend the same encodings */
			for (int i = 0; i < 2; i++) {
				cr_assert_eq(mkv_seq_append(&s[i], 1, l, kt, vt, MKV_DTYPE_F32), 0);
				cr_assert_eq(mkv_seq_sync(s[i]), 0);
			}
			for (size_t c = 0; c < sizeof q / sizeof *q; c++)
				q[c] = 0.3f * rng_normal(&rng);
			attend_out(s[0], l, q, o0);
			attend_out(s[1], l, q, o1);
			cr_assert(memcmp(o0, o1, sizeof o0) == 0,
				  "step %u layer %u: threads change the output", step, l);
			struct mkv_seq_stats a = {.size = sizeof a}, b = {.size = sizeof b};
			cr_assert_eq(mkv_seq_get_stats(s[0], &a), 0);
			cr_assert_eq(mkv_seq_get_stats(s[1], &b), 0);
			cr_assert_eq(a.fetch_bytes_last, b.fetch_bytes_last);
			cr_assert_eq(a.attend_bytes_last, b.attend_bytes_last);
			if (step > steps / 2 && l == 0)
				cr_assert_gt(b.fetch_bytes_last, 0, "offloaded: fetched from below");
		}
	}
	for (int i = 0; i < 2; i++) {
		struct mkv_seq_stats a = {.size = sizeof a};
		cr_assert_eq(mkv_seq_get_stats(s[i], &a), 0);
		cr_assert_gt(a.swaps, 0, "decode segments were swapped");
		cr_assert_eq(mkv_seq_close(s[i]), 0);
	}
	/* bounds */
	struct mkv_seq_opts o;
	mkv_seq_opts_init(&o, sizeof o);
	o.attend_threads = 65;
	struct mkv_seq *bad = NULL;
	cr_assert_eq(mkv_seq_open(st, &o, 49, &bad), -EINVAL);
	cr_assert_null(bad);
	/* version 5: device_positions is 0 by default, 0 or 1 */
	mkv_seq_opts_init(&o, sizeof o);
	cr_assert_eq(o.device_positions, 0);
	o.device_positions = 2;
	cr_assert_eq(mkv_seq_open(st, &o, 49, &bad), -EINVAL);
	cr_assert_null(bad);
	/* version 6: summary_bits is 16 by default, 8 or 16 */
	uint32_t bad_bits[] = {0, 4, 12, 32};
	for (int i = 0; i < 4; i++) {
		mkv_seq_opts_init(&o, sizeof o);
		cr_assert_eq(o.summary_bits, 16u);
		o.summary_bits = bad_bits[i];
		cr_assert_eq(mkv_seq_open(st, &o, 49, &bad), -EINVAL);
		cr_assert_null(bad);
	}
	mkv_store_destroy(st);
	free(t.k);
	free(t.v);
}

/* summary_bits = 8 on the host path: with every block selected the
 * outputs are those of 16 bits, bit for bit (the scores only order
 * blocks); at 10 % of the tokens the 8-bit scores move the selection of
 * some of 64 steps (the option is applied: about a quarter of them on
 * this data), and the outputs stay as near exact
 * attention over all tokens as the bound's are (docs/ACCURACY.md). */
/*
 * seg_make_sum8 on its own: a key segment's rows and scales as mkv_summary8
 * makes them, made once (a second call keeps them); a block with a
 * non-finite summary gets a NaN scale and is scored as without kept rows;
 * value segments, growable segments and NULL are refused, nothing set.
 */
Test(sequence, seg_make_sum8_rows_and_refusals)
{
	uint64_t rng = fresh_seed();
	const uint32_t d = 64, n = 500;
	float *x = malloc(sizeof(float) * n * d), q[4 * 64];
	for (size_t i = 0; i < (size_t)n * d; i++)
		x[i] = rng_normal(&rng) * (i % d < 3 ? 5.0f : 1.0f);
	for (size_t i = 0; i < sizeof q / sizeof *q; i++)
		q[i] = rng_normal(&rng);
	struct mkv_encode_opts eo;
	cr_assert_eq(mkv_encode_opts_init(&eo, sizeof eo), 0);
	eo.d = d;
	eo.r = 16;
	eo.b = 16;
	eo.kind = MKV_KIND_KEY;
	eo.summary_channels = 24;
	struct mkv_segment *k, *v, *grow;
	cr_assert_eq(mkv_segment_encode(&eo, x, MKV_DTYPE_F32, n, &k), 0);
	eo.kind = MKV_KIND_VALUE;
	eo.summary_channels = 0;
	cr_assert_eq(mkv_segment_encode(&eo, x, MKV_DTYPE_F32, n, &v), 0);
	cr_assert_eq(seg_make_sum8(NULL), -EINVAL);
	cr_assert_eq(seg_make_sum8(v), -EINVAL);
	cr_assert_null(v->sum8);
	float *R = malloc(sizeof(float) * d * d);
	for (uint32_t i = 0; i < d * d; i++)
		R[i] = i / d == i % d; /* the identity */
	eo.kind = MKV_KIND_KEY;
	eo.summary_channels = 24;
	eo.rotation = R;
	cr_assert_eq(seg_grow_create(&eo, &grow), 0);
	cr_assert_eq(seg_make_sum8(grow), -EINVAL);
	cr_assert_null(grow->sum8);
	/* mkv_summary8's rows of the segment as encoded (it refuses one with
	 * a non-finite summary), then a block's summary made non-finite:
	 * block 3, channel 5 */
	const uint32_t S = k->v.summary_channels, nb = k->v.n_blocks;
	int8_t *rows = malloc((size_t)nb * 2 * S);
	float *scale = malloc(sizeof(float) * nb);
	cr_assert_eq(mkv_summary8(k, rows, scale), 0);
	cr_assert(k->v.store_dtype == MKV_DTYPE_BF16);
	((uint16_t *)k->sum_min)[3 * S + 5] = 0x7fc0; /* NaN */
	cr_assert_eq(seg_make_sum8(k), 0);
	const int8_t *made = k->sum8;
	cr_assert_not_null(made);
	cr_assert_eq(seg_make_sum8(k), 0);
	cr_assert_eq(k->sum8, made, "a second call made the rows again");
	for (uint32_t j = 0; j < nb; j++) {
		if (j == 3) {
			cr_assert(isnan(k->sum8_scale[j]), "block 3: scale %g", k->sum8_scale[j]);
			continue;
		}
		cr_assert(memcmp(k->sum8 + (size_t)j * 2 * S, rows + (size_t)j * 2 * S, 2 * S) == 0,
			  "block %u: rows differ from mkv_summary8's", j);
		cr_assert(memcmp(&k->sum8_scale[j], &scale[j], sizeof(float)) == 0,
			  "block %u: scale %g, mkv_summary8's %g", j, k->sum8_scale[j], scale[j]);
	}
	/* scores with the kept rows equal those made per step, bit for bit
	 * (block 3 by the bound on both) */
	struct mkv_attn_opts ao;
	mkv_attn_opts_init(&ao, sizeof ao);
	ao.n_q = 4;
	ao.d = d;
	ao.summary_bits = 8;
	float *kept = malloc(sizeof(float) * nb), *step = malloc(sizeof(float) * nb);
	cr_assert_eq(mkv_score_blocks(&ao, q, k, kept), 0);
	int8_t *r8 = k->sum8;
	float *s8 = k->sum8_scale;
	k->sum8 = NULL;
	k->sum8_scale = NULL;
	cr_assert_eq(mkv_score_blocks(&ao, q, k, step), 0);
	k->sum8 = r8;
	k->sum8_scale = s8;
	cr_assert(memcmp(kept, step, sizeof(float) * nb) == 0, "kept and per-step scores differ");
	free(kept);
	free(step);
	free(rows);
	free(scale);
	free(R);
	free(x);
	mkv_segment_destroy(k);
	mkv_segment_destroy(v);
	mkv_segment_destroy(grow);
}

/*
 * With 8-bit scores, every final key skeleton keeps its blocks' 8-bit rows
 * (seg_make_sum8: made once on the worker, prefill's and decode's), equal
 * to mkv_summary8's; with 16 bits none does.  Outputs with the kept rows
 * are bit-equal to those with every row made per step.
 */
Test(sequence, summary_bits_8_final_keys_keep_their_rows, .timeout = 120)
{
	const uint32_t L = 1, H = 2, G = 4, d = 64, n0 = 1024, more = 200;
	uint64_t rng = fresh_seed();
	struct mkv_store *st = host_store((size_t)64 << 20);
	struct truth t;
	truth_init(&t, L, H, G, d, n0 + more);
	fill_random(&t, 0, n0 + more, &rng);
	for (int bits = 8; bits <= 16; bits += 8) {
		struct mkv_seq_opts o;
		mkv_seq_opts_init(&o, sizeof o);
		o.layers = L, o.kv_heads = H, o.q_per_kv = G, o.d = d;
		o.prefill_segment = 256;
		o.min_segment = 64;
		o.max_segment = 128; /* decode segments close (job_run) */
		o.value_bits = 0;
		o.r = 16; /* S = 16 */
		o.token_frac = 0.1;
		o.summary_bits = bits;
		struct mkv_seq *s;
		cr_assert_eq(mkv_seq_open(st, &o, 90 + (uint64_t)bits, &s), 0);
		prefill_all(s, &t, n0);
		float kt[2 * 64], vt[2 * 64];
		for (uint32_t i = 0; i < more; i++) {
			for (uint32_t h = 0; h < H; h++) {
				memcpy(kt + h * d, tk(&t, 0, h, n0 + i), sizeof(float) * d);
				memcpy(vt + h * d, tv(&t, 0, h, n0 + i), sizeof(float) * d);
			}
			cr_assert_eq(mkv_seq_append(&s, 1, 0, kt, vt, MKV_DTYPE_F32), 0);
		}
		cr_assert_eq(mkv_seq_sync(s), 0);
		uint32_t nfinal = 0, ndecode = 0;
		for (uint32_t h = 0; h < H; h++) {
			const struct lh *l = &s->lh[h];
			for (size_t i = 0; i < l->nsegs; i++) {
				const struct hseg *x = &l->segs[i];
				if (!x->final)
					continue;
				nfinal++;
				ndecode += x->start >= n0;
				const struct mkv_segment *k = x->k;
				if (bits == 16) {
					cr_assert_null(k->sum8, "head %u segment %zu: rows kept at 16 bits",
						       h, i);
					continue;
				}
				cr_assert_not_null(k->sum8, "head %u segment %zu: no rows kept", h, i);
				uint32_t S = k->v.summary_channels, nb = k->v.n_blocks;
				int8_t *rows = malloc((size_t)nb * 2 * S);
				float *sc = malloc(sizeof(float) * nb);
				cr_assert_eq(mkv_summary8(k, rows, sc), 0);
				cr_assert(memcmp(rows, k->sum8, (size_t)nb * 2 * S) == 0,
					  "head %u segment %zu: rows differ from mkv_summary8's", h, i);
				cr_assert(memcmp(sc, k->sum8_scale, sizeof(float) * nb) == 0,
					  "head %u segment %zu: scales differ", h, i);
				free(rows);
				free(sc);
			}
		}
		cr_assert(nfinal >= 2 * H && ndecode >= 1, "%u final segments, %u from decode",
			  nfinal, ndecode);
		if (bits == 8) {
			/* the same step with every row made per step */
			float q[2 * 4 * 64], o0[2 * 4 * 64], o1[2 * 4 * 64];
			for (size_t c = 0; c < sizeof q / sizeof *q; c++)
				q[c] = 0.5f * rng_normal(&rng);
			attend_out(s, 0, q, o0);
			for (uint32_t h = 0; h < H; h++)
				for (size_t i = 0; i < s->lh[h].nsegs; i++) {
					struct mkv_segment *k = s->lh[h].segs[i].k;
					free(k->sum8);
					free(k->sum8_scale);
					k->sum8 = NULL;
					k->sum8_scale = NULL;
				}
			attend_out(s, 0, q, o1);
			cr_assert(memcmp(o0, o1, sizeof o0) == 0,
				  "kept rows and rows made per step select differently");
		}
		cr_assert_eq(mkv_seq_close(s), 0);
	}
	free(t.k);
	free(t.v);
	mkv_store_destroy(st);
}

Test(sequence, summary_bits_8_selects_near_the_bound, .timeout = 120)
{
	const uint32_t L = 1, H = 2, G = 4, d = 64, n0 = 2048, steps = 64;
	uint64_t rng = fresh_seed();
	struct mkv_store *st = host_store((size_t)64 << 20);
	struct truth t;
	truth_init(&t, L, H, G, d, n0 + steps);
	fill_random(&t, 0, n0 + steps, &rng);
	for (int full = 1; full >= 0; full--) {
		struct mkv_seq *s[2];
		for (int i = 0; i < 2; i++) {
			struct mkv_seq_opts o;
			mkv_seq_opts_init(&o, sizeof o);
			o.layers = L, o.kv_heads = H, o.q_per_kv = G, o.d = d;
			o.prefill_segment = 256;
			o.value_bits = 0;
			o.r = 16; /* S = 16: scored in 8 bits */
			o.token_frac = full ? 1.0 : 0.1;
			o.summary_bits = i ? 8 : 16;
			cr_assert_eq(mkv_seq_open(st, &o, 60 + 2 * (uint64_t)full + (uint64_t)i, &s[i]),
				     0);
			prefill_all(s[i], &t, n0);
			cr_assert_eq(mkv_seq_sync(s[i]), 0);
		}
		float q[2 * 4 * 64], o0[2 * 4 * 64], o1[2 * 4 * 64], kt[2 * 64], vt[2 * 64];
		uint32_t moved = 0;
		double e16 = 0, e8 = 0;
		for (uint32_t step = 0; step < steps; step++) {
			for (uint32_t h = 0; h < H; h++) {
				memcpy(kt + h * d, tk(&t, 0, h, n0 + step), sizeof(float) * d);
				memcpy(vt + h * d, tv(&t, 0, h, n0 + step), sizeof(float) * d);
			}
			for (int i = 0; i < 2; i++)
				cr_assert_eq(mkv_seq_append(&s[i], 1, 0, kt, vt, MKV_DTYPE_F32), 0);
			for (size_t c = 0; c < sizeof q / sizeof *q; c++)
				q[c] = 0.5f * rng_normal(&rng);
			attend_out(s[0], 0, q, o0);
			attend_out(s[1], 0, q, o1);
			if (full) {
				cr_assert(memcmp(o0, o1, sizeof o0) == 0,
					  "step %u: every block selected, yet 8 bits changed the output",
					  step);
				continue;
			}
			moved += memcmp(o0, o1, sizeof o0) != 0;
			/* exact attention over all n0 + step + 1 tokens, per query head */
			for (uint32_t h = 0; h < H; h++)
				for (uint32_t gq = 0; gq < G; gq++) {
					double ref[64], a = 0, b = 0, r = 0;
					size_t qo = ((size_t)h * G + gq) * d;
					ref_attention(q + qo, tk(&t, 0, h, 0), tv(&t, 0, h, 0),
						      n0 + step + 1, d, ref);
					for (uint32_t c = 0; c < d; c++) {
						a += (o0[qo + c] - ref[c]) * (o0[qo + c] - ref[c]);
						b += (o1[qo + c] - ref[c]) * (o1[qo + c] - ref[c]);
						r += ref[c] * ref[c];
					}
					e16 += sqrt(a / r);
					e8 += sqrt(b / r);
				}
		}
		if (!full) {
			cr_log_info("summary_bits 8: %u of %u steps changed, error sums 8 bits %g, 16 bits %g", moved, steps, e8, e16);
			cr_assert(moved > 0, "8-bit scores never changed a selection");
			cr_assert(e8 <= 1.25 * e16 + 1e-3 * steps * H * G,
				  "error vs exact: 8 bits %g, 16 bits %g (sums)", e8, e16);
		}
		for (int i = 0; i < 2; i++)
			cr_assert_eq(mkv_seq_close(s[i]), 0);
	}
	free(t.k);
	free(t.v);
	mkv_store_destroy(st);
}

Test(sequence, offload_and_prefetch_map_onto_the_tiers, .timeout = 120)
{
	const uint32_t L = 2, H = 2, G = 2, d = 64, n0 = 1024;
	uint64_t rng = fresh_seed();
	struct mkv_store *st = host_store_hot((size_t)64 << 20, 0.5);
	struct mkv_seq_opts o;
	mkv_seq_opts_init(&o, sizeof o); /* the serving defaults */
	o.layers = L, o.kv_heads = H, o.q_per_kv = G, o.d = d;
	o.prefill_segment = 256;
	struct mkv_seq *s;
	cr_assert_eq(mkv_seq_open(st, &o, 21, &s), 0);
	struct truth t;
	truth_init(&t, L, H, G, d, n0);
	fill_random(&t, 0, n0, &rng);
	prefill_all(s, &t, n0);
	cr_assert_eq(mkv_seq_sync(s), 0);
	float q[2 * 2 * 64], o1[2 * 2 * 64], o2[2 * 2 * 64], o3[2 * 2 * 64];
	for (size_t i = 0; i < sizeof q / sizeof *q; i++)
		q[i] = 0.3f * rng_normal(&rng);

	struct mkv_seq_stats ss = {.size = sizeof ss};
	attend_out(s, 0, q, o1);
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	cr_assert_eq(ss.fetch_bytes_last, 0, "all in the top tier: nothing fetched from below");
	uint64_t nfinal = ss.segments_final; /* both layers */
	cr_assert(nfinal >= 2 * H * 3, "final segments %llu", (unsigned long long)nfinal);

	/* Offload layer 0: every final K and V segment of it moves. */
	int moved = mkv_seq_offload(s, 0);
	cr_assert_eq(moved, (int)nfinal, "moves %d, want %llu (K and V of layer 0's %llu)",
		     moved, (unsigned long long)nfinal, (unsigned long long)nfinal / 2);
	cr_assert_eq(mkv_seq_sync(s), 0);
	for (uint32_t layer = 0; layer < L; layer++)
		for (uint32_t h = 0; h < H; h++)
			for (uint32_t id = 0; id < n0 / 256; id++)
				for (uint32_t kind = 0; kind < 2; kind++) {
					struct mkv_seg_key k = {.seq = 21, .layer = layer, .head = h,
								.seg = id, .kind = kind};
					struct mkv_seg_info info;
					if (mkv_store_info(st, &k, &info))
						continue; /* the last one may be the open segment */
					cr_assert_eq(info.tier, layer == 0 ? MKV_TIER_HOST : MKV_TIER_HBM,
						     "layer %u head %u seg %u: tier %d", layer, h, id,
						     info.tier);
				}
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	cr_assert_eq(ss.offload_moves, (uint64_t)moved);
	cr_assert_eq(ss.offload_failed, 0);
	cr_assert_eq(mkv_seq_offload(s, 0), 0, "nothing left to move");

	/* The same attention, now read from pinned host memory. */
	attend_out(s, 0, q, o2);
	cr_assert(memcmp(o1, o2, sizeof o1) == 0, "offloaded layer attends differently");
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	uint64_t from_below = ss.fetch_bytes_last;
	cr_assert(from_below > 0, "selected blocks should come from the host tier");

	/* Prefetch the selection just made: the store caches the blocks in
	 * the top tier, and the same query then reads less from below. */
	int asked = mkv_seq_prefetch(s, 0);
	cr_assert(asked > 0, "prefetch asked for %d blocks", asked);
	cr_assert_eq(mkv_seq_sync(s), 0);
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	cr_assert_eq(ss.prefetch_blocks, (uint64_t)asked);
	cr_assert_eq(ss.prefetch_failed, 0);
	attend_out(s, 0, q, o3);
	cr_assert(memcmp(o1, o3, sizeof o1) == 0, "prefetched blocks attend differently");
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	cr_assert(ss.fetch_bytes_last < from_below,
		  "after the prefetch %llu bytes came from below, before %llu",
		  (unsigned long long)ss.fetch_bytes_last, (unsigned long long)from_below);
	/* A layer that never attended has no prediction. */
	cr_assert_eq(mkv_seq_prefetch(s, 1), 0);

	cr_assert_eq(mkv_seq_offload(s, L), -EINVAL);
	cr_assert_eq(mkv_seq_prefetch(s, L), -EINVAL);
	cr_assert_eq(mkv_seq_offload(NULL, 0), -EINVAL);
	cr_assert_eq(mkv_seq_prefetch(NULL, 0), -EINVAL);
	/* A caller of version 1 of the stats gets what it knows. */
	struct mkv_seq_stats v1;
	memset(&v1, 0x5a, sizeof v1);
	v1.size = offsetof(struct mkv_seq_stats, device_attends) + sizeof(uint64_t);
	cr_assert_eq(mkv_seq_get_stats(s, &v1), 0);
	cr_assert_eq(v1.offload_moves, 0x5a5a5a5a5a5a5a5aull, "wrote past a version-1 struct");
	v1.size = 8;
	cr_assert_eq(mkv_seq_get_stats(s, &v1), -EINVAL);

	/* Moves in flight when the sequence closes are waited for. */
	cr_assert(mkv_seq_offload(s, 1) > 0);
	cr_assert_eq(mkv_seq_close(s), 0);
	mkv_store_destroy(st);
	free(t.k);
	free(t.v);
}

/* Every prefill token lands in a final segment with its own strategy:
 * ps-token segments, the remainder alone from min_segment tokens up, else
 * joined to the last one; the open segment starts empty. */
static void prefill_cut_case(uint32_t n0, uint32_t ps, uint32_t minseg,
			     const uint32_t *want, size_t nwant)
{
	const uint32_t L = 1, H = 2, G = 1, d = 64;
	uint64_t rng = fresh_seed();
	struct mkv_store *st = host_store((size_t)64 << 20);
	struct mkv_seq_opts o;
	exact_opts(&o, L, H, G, d);
	o.prefill_segment = ps;
	o.min_segment = minseg;
	o.max_segment = 4096;
	struct mkv_seq *s;
	cr_assert_eq(mkv_seq_open(st, &o, 8, &s), 0);
	struct truth t;
	truth_init(&t, L, H, G, d, n0);
	fill_random(&t, 0, n0, &rng);
	prefill_all(s, &t, n0);
	for (uint32_t h = 0; h < H; h++) {
		const struct lh *l = &s->lh[h];
		cr_assert_eq(l->nsegs, nwant, "n0 %u ps %u min %u: %zu segments, want %zu",
			     n0, ps, minseg, l->nsegs, nwant);
		uint32_t start = 0;
		for (size_t i = 0; i < nwant; i++) {
			cr_assert(l->segs[i].start == start && l->segs[i].n == want[i] &&
				  l->segs[i].final,
				  "segment %zu: [%u, +%u) final %u, want [%u, +%u) final",
				  i, l->segs[i].start, l->segs[i].n, l->segs[i].final, start, want[i]);
			start += want[i];
		}
		cr_assert_eq(l->ok->v.n, 0, "the open segment holds %u prefill tokens",
			     l->ok->v.n);
	}
	/* and attention over them is still exact */
	double e = attend_error(s, &t, 0, &rng);
	cr_assert(e < 1e-5, "attention error %g", e);
	mkv_seq_close(s);
	mkv_store_destroy(st);
	free(t.k);
	free(t.v);
}

/*
 * Two-stage selection (refine) through the store: two sequences over the
 * same tokens, one stage and refine = 1 / token_frac (every block a
 * candidate).  Queries read six planted tokens; exact attention in double
 * from the raw tokens is the reference.  The refined sequence attends
 * differently, finds the planted tokens by the packed keys (error well
 * below one stage's, which the loose bound of isotropic keys misleads),
 * and attends the same bytes bit for bit once its segments moved to the
 * host tier.  Bad refine values are refused at open.
 */
Test(sequence, refine_two_stages_through_the_store, .timeout = 120)
{
	const uint32_t L = 1, H = 2, G = 2, d = 64, n0 = 2048;
	const uint64_t seed = fresh_seed();
	uint64_t rng = seed;
	struct mkv_store *st = host_store_hot((size_t)64 << 20, 0);
	struct mkv_seq_opts o;
	mkv_seq_opts_init(&o, sizeof o);
	cr_assert_eq(o.refine, 0.0, "one stage by default");
	o.layers = L, o.kv_heads = H, o.q_per_kv = G, o.d = d;
	o.prefill_segment = 512;
	struct mkv_seq *s1, *s2, *bad;
	const double nope[] = {-1.0, 0.5, 17.0, NAN};
	for (size_t i = 0; i < sizeof nope / sizeof *nope; i++) {
		struct mkv_seq_opts ob = o;
		ob.refine = nope[i];
		cr_assert_eq(mkv_seq_open(st, &ob, 40 + i, &bad), -EINVAL, "refine %g", nope[i]);
	}
	cr_assert_eq(mkv_seq_open(st, &o, 31, &s1), 0);
	/* refine = 1 / token_frac: every block is a candidate, so the second
	 * stage alone picks (by the packed keys' mass); the bound on these
	 * isotropic keys is no guide, one stage then finds few planted ones */
	o.refine = 1.0 / o.token_frac;
	cr_assert_eq(mkv_seq_open(st, &o, 32, &s2), 0);
	struct truth t;
	truth_init(&t, L, H, G, d, n0);
	fill_random(&t, 0, n0, &rng);
	prefill_all(s1, &t, n0);
	prefill_all(s2, &t, n0);
	t.n = n0;
	cr_assert_eq(mkv_seq_sync(s1), 0);
	cr_assert_eq(mkv_seq_sync(s2), 0);
	float q[2 * 2 * 64], a[2 * 2 * 64], b[2 * 2 * 64], b2[2 * 2 * 64];
	int differs = 0;
	double e1 = 0, e2 = 0;
	double *ref = malloc(sizeof(double) * d);
	uint64_t f1 = 0, f2 = 0;
	for (int trial = 0; trial < 8; trial++) {
		/* Queries that read a few planted tokens (in different blocks):
		 * exact attention then sits mostly on them. */
		for (uint32_t qh = 0; qh < H * G; qh++) {
			float *qq = q + qh * d;
			for (uint32_t c = 0; c < d; c++)
				qq[c] = 0.3f * rng_normal(&rng);
			for (int nd = 0; nd < 6; nd++) {
				uint32_t pos = (uint32_t)(rng_next(&rng) % n0);
				const float *kk = tk(&t, 0, qh / G, pos);
				double nn = 0;
				for (uint32_t c = 0; c < d; c++)
					nn += (double)kk[c] * kk[c];
				for (uint32_t c = 0; c < d; c++)
					qq[c] += (float)(8.0 * sqrt((double)d) * kk[c] / nn);
			}
		}
		attend_out(s1, 0, q, a);
		struct mkv_seq_stats ss = {.size = sizeof ss};
		cr_assert_eq(mkv_seq_get_stats(s1, &ss), 0);
		f1 += ss.attend_bytes_last;
		attend_out(s2, 0, q, b);
		cr_assert_eq(mkv_seq_get_stats(s2, &ss), 0);
		f2 += ss.attend_bytes_last;
		differs += memcmp(a, b, sizeof a) != 0;
		for (uint32_t qh = 0; qh < H * G; qh++) {
			double x1 = 0, x2 = 0, r = 0;
			ref_attention(q + qh * d, tk(&t, 0, qh / G, 0), tv(&t, 0, qh / G, 0), n0, d,
				      ref);
			for (uint32_t c = 0; c < d; c++) {
				x1 += (a[qh * d + c] - ref[c]) * (a[qh * d + c] - ref[c]);
				x2 += (b[qh * d + c] - ref[c]) * (b[qh * d + c] - ref[c]);
				r += ref[c] * ref[c];
			}
			e1 += sqrt(x1 / r);
			e2 += sqrt(x2 / r);
		}
	}
	cr_assert_gt(differs, 0, "refine never changed the output");
	cr_log_info("refine 10: mean rel err %.4f vs one stage %.4f; attend bytes %.2fx\n",
		    e2 / (8 * H * G), e1 / (8 * H * G), (double)f2 / (double)f1);
	/* Isotropic keys and values lose ~15% of their energy to r = 40 of 64
	 * (values error ~0.4 alone): "found" is an error well under one's.
	 * Over 443 fresh seeds (forty-eighth session) the refined mean was
	 * 0.42-0.85 (median 0.59, 99th percentile 0.77) and its ratio to one
	 * stage's at most 0.56; the bounds 0.8 and 0.6 failed about one seed
	 * in 150.  A refine that found nothing would sit near one stage's
	 * error (1.15-1.67 on these queries), over both bounds below. */
	cr_assert_lt(e2, 0.65 * e1, "seed %llu: refined error %.4g not well below one stage's %.4g",
		     (unsigned long long)seed, e2, e1);
	cr_assert_lt(e2 / (8 * H * G), 0.9,
		     "seed %llu: refined: the planted tokens should dominate (mean rel err %.4g)",
		     (unsigned long long)seed, e2 / (8 * H * G));
	/* The same refined attention from the host tier. */
	attend_out(s2, 0, q, b);
	cr_assert_gt(mkv_seq_offload(s2, 0), 0);
	cr_assert_eq(mkv_seq_sync(s2), 0);
	attend_out(s2, 0, q, b2);
	cr_assert(memcmp(b, b2, sizeof b) == 0, "offloaded refined attention differs");
	struct mkv_seq_stats ss = {.size = sizeof ss};
	cr_assert_eq(mkv_seq_get_stats(s2, &ss), 0);
	cr_assert_gt(ss.fetch_bytes_last, 0, "the candidates come from the host tier");
	free(ref);
	cr_assert_eq(mkv_seq_close(s1), 0);
	cr_assert_eq(mkv_seq_close(s2), 0);
	mkv_store_destroy(st);
	free(t.k);
	free(t.v);
}

Test(sequence, prefill_remainder_gets_its_own_strategy, .timeout = 60)
{
	const uint32_t a[] = {256, 256, 256, 232};
	prefill_cut_case(1000, 256, 64, a, 4);
	const uint32_t b[] = {256, 256, 488};
	prefill_cut_case(1000, 256, 300, b, 3);
	const uint32_t c[] = {1000};
	prefill_cut_case(1000, 1024, 64, c, 1);
	const uint32_t e[] = {256, 256};
	prefill_cut_case(512, 256, 64, e, 2);
}

/* The formats a sequence encodes with: the serving defaults (r = 0 ->
 * 40 of 64 in 6-bit rows, S = min(r, d/4)), an explicit S, and a caller
 * of version 1 of the options (bf16 element rows, S = r). */
static void seq_format_case(size_t size, uint32_t S, uint32_t want_r,
			    uint32_t want_bits, uint32_t want_S)
{
	const uint32_t L = 1, H = 1, G = 2, d = 64, n0 = 300;
	uint64_t rng = fresh_seed();
	struct mkv_store *st = host_store((size_t)64 << 20);
	struct mkv_seq_opts o;
	cr_assert_eq(mkv_seq_opts_init(&o, size), 0);
	o.layers = L, o.kv_heads = H, o.q_per_kv = G, o.d = d;
	o.prefill_segment = 256;
	if (size == sizeof o)
		o.summary_channels = S;
	else
		o.r = want_r; /* version 1: r = 0 would mean the strategy */
	struct mkv_seq *s;
	cr_assert_eq(mkv_seq_open(st, &o, 5, &s), 0);
	struct truth t;
	truth_init(&t, L, H, G, d, n0 + 4);
	fill_random(&t, 0, n0 + 4, &rng);
	prefill_all(s, &t, n0);
	for (uint32_t i = n0; i < n0 + 4; i++)
		cr_assert_eq(mkv_seq_append(&s, 1, 0, tk(&t, 0, 0, i), tv(&t, 0, 0, i),
					    MKV_DTYPE_F32), 0);
	const struct lh *l = &s->lh[0];
	const struct mkv_segment *ks[2] = {l->segs[0].k, l->ok};
	for (int i = 0; i < 2; i++) {
		struct mkv_packed_view v;
		cr_assert_eq(mkv_segment_view(ks[i], &v), 0);
		cr_assert(v.r == want_r && v.value_bits == want_bits &&
			  v.summary_channels == want_S &&
			  v.row_bytes == mkv_row_bytes(want_r, want_bits, MKV_DTYPE_BF16),
			  "%s key segment: r %u bits %u S %u row %u, want r %u bits %u S %u",
			  i ? "open" : "prefill", v.r, v.value_bits, v.summary_channels,
			  v.row_bytes, want_r, want_bits, want_S);
	}
	mkv_seq_close(s);
	mkv_store_destroy(st);
	free(t.k);
	free(t.v);
}

Test(sequence, encodes_the_configured_format, .timeout = 60)
{
	seq_format_case(sizeof(struct mkv_seq_opts), 0, 40, 6, 16);
	seq_format_case(sizeof(struct mkv_seq_opts), 24, 40, 6, 24);
	size_t v1 = offsetof(struct mkv_seq_opts, device_attend) + sizeof(uint32_t);
	seq_format_case(v1, 0, 16, 0, 16);
	seq_format_case(v1, 0, 24, 0, 24);
}

/* r = 0 resolves to the largest multiple of g whose row fits d/2 bytes,
 * computed here from the row format's definition. */
Test(sequence, default_budget_r)
{
	for (uint32_t d = 64; d <= 256; d *= 2)
		for (uint32_t w = 0; w <= 8; w++) {
			if (w && w < 4)
				continue;
			for (uint32_t g = 1; g <= 8; g *= 2) {
				uint32_t want = 0;
				for (uint32_t r = g; r <= d; r += g) {
					size_t row = w ? 2 + ((size_t)r * w + 7) / 8 : (size_t)r * 2;
					row += w ? row & 1 : 0;
					if (w ? row <= d / 2 : r <= d / 4)
						want = r;
				}
				cr_assert_eq(mkv_seq_default_r(d, w, g), want,
					     "d %u bits %u g %u: r %u, want %u", d, w, g,
					     mkv_seq_default_r(d, w, g), want);
			}
		}
	cr_assert_eq(mkv_seq_default_r(64, 6, 1), 40u);
	cr_assert_eq(mkv_seq_default_r(64, 3, 1), 0u);
	cr_assert_eq(mkv_seq_default_r(96, 6, 1), 0u);
}

/* ---------------------------------------------------------------------- */
/* A failed finalization loses nothing. */

Test(sequence, failed_job_keeps_temporary_segment, .timeout = 120)
{
	const uint32_t L = 1, H = 2, G = 2, d = 64, n0 = 256;
	uint64_t seed = fresh_seed(), rng = seed;
	struct tier *inner = NULL, *tiers[MKV_TIER_COUNT] = {0};
	cr_assert_eq(hbm_tier_create((size_t)64 << 20, -1, &inner), 0);
	cr_assert_eq(fault_tier_create(inner, &tiers[MKV_TIER_HBM]), 0);
	struct mkv_store_opts so;
	mkv_store_opts_init(&so, sizeof so);
	so.gpu = -1;
	so.workers = 2;
	struct mkv_store *st;
	cr_assert_eq(store_create_with_tiers(&so, tiers, &st), 0);
	struct mkv_seq_opts o;
	exact_opts(&o, L, H, G, d);
	o.max_segment = 4096;
	o.min_segment = 4096;
	struct truth t;
	truth_init(&t, L, H, G, d, n0 + 64);
	fill_random(&t, 0, n0 + 64, &rng);
	struct mkv_seq *s;
	cr_assert_eq(mkv_seq_open(st, &o, 9, &s), 0);
	prefill_all(s, &t, n0);
	for (uint32_t i = n0; i < n0 + 64; i++) {
		float k[2 * 64], v[2 * 64];
		for (uint32_t h = 0; h < H; h++) {
			memcpy(k + h * d, tk(&t, 0, h, i), sizeof(float) * d);
			memcpy(v + h * d, tv(&t, 0, h, i), sizeof(float) * d);
		}
		cr_assert_eq(mkv_seq_append(&s, 1, 0, k, v, MKV_DTYPE_F32), 0);
		t.n++;
	}
	/* Every put fails from now on: the workers' jobs cannot store. */
	fault_tier_arm(store_tier(st, MKV_TIER_HBM), FAULT_OP_PUT, 1,
		       FAULT_ERRNO, EIO, 1000);
	cr_assert_eq(mkv_seq_flush(s, 0), 0);
	cr_assert_eq(mkv_seq_sync(s), 0);
	struct mkv_seq_stats ss = {.size = sizeof ss};
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	cr_assert(ss.finalize_failed >= H, "failures %llu", (unsigned long long)ss.finalize_failed);
	cr_assert_eq(ss.last_error, -EIO, "last error %lld", (long long)ss.last_error);
	cr_assert_eq(ss.swaps, 0);
	cr_assert(ss.segments_pending >= H);
	/* Still every token, exactly. */
	double e = attend_error(s, &t, 0, &rng);
	cr_assert(e < 1e-5, "seed %llu: error %.3g with failed jobs", (unsigned long long)seed, e);
	/* Repaired: the retry at the next flush succeeds. */
	fault_tier_disarm(store_tier(st, MKV_TIER_HBM));
	cr_assert_eq(mkv_seq_flush(s, 0), 0);
	cr_assert_eq(mkv_seq_sync(s), 0);
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	cr_assert_eq(ss.segments_pending, 0);
	cr_assert(ss.swaps >= H);
	e = attend_error(s, &t, 0, &rng);
	cr_assert(e < 1e-5, "seed %llu: error %.3g after the retry", (unsigned long long)seed, e);
	mkv_seq_close(s);
	mkv_store_destroy(st);
	free(t.k);
	free(t.v);
}

/* ---------------------------------------------------------------------- */
/* The open segment's loss, which closes it, is its own encoding's: the
 * energy of the rotated groups its rows do not keep (read from their
 * bitmaps) and of the dropped channels, over its tokens' energy, computed
 * here in double. */

static double open_loss_ref(struct lh *l, const struct mkv_segment *sg, const float *Rfull,
			    struct truth *t, uint32_t layer, uint32_t h, int key, uint32_t d,
			    uint32_t dkeep)
{
	const struct mkv_packed_view *v = &sg->v;
	double lost = 0.0, energy = 0.0;
	for (uint32_t i = l->ostart; i < l->n; i++) {
		const float *x = key ? tk(t, layer, h, i) : tv(t, layer, h, i);
		const uint8_t *bm = v->bitmaps + (size_t)(i - l->ostart) * v->bitmap_bytes;
		for (uint32_t c = 0; c < d; c++)
			energy += (double)x[c] * x[c];
		for (uint32_t c = 0; c < d; c++) {
			double y = 0.0;
			const float *row = c < dkeep ? sg->proj_f32 + (size_t)c * d : Rfull + (size_t)c * d;
			for (uint32_t a = 0; a < d; a++)
				y += (double)row[a] * x[a];
			uint32_t j = c / v->g;
			if (c >= dkeep || !(bm[j >> 3] >> (j & 7) & 1))
				lost += y * y;
		}
	}
	return energy > 0 ? sqrt(lost / energy) : 0.0;
}

Test(sequence, open_loss_is_its_encodings_loss, .timeout = 120)
{
	for (int drop = 0; drop < 2; drop++) {
		const uint32_t L = 1, H = 2, G = 1, d = 64, n0 = 300, steps = 150;
		uint64_t seed = fresh_seed(), rng = seed;
		struct mkv_store *st = host_store((size_t)32 << 20);
		struct mkv_seq_opts o;
		exact_opts(&o, L, H, G, d);
		o.drop = (uint32_t)drop;
		o.r = 16;
		o.g = drop ? 2 : 1;
		o.store_dtype = MKV_DTYPE_BF16;
		o.value_bits = 6;
		o.min_segment = 65536; /* nothing closes: one open segment */
		o.max_segment = 65536;
		struct truth t;
		truth_init(&t, L, H, G, d, n0 + steps);
		fill_random(&t, 0, n0 + steps, &rng);
		struct mkv_seq *s;
		cr_assert_eq(mkv_seq_open(st, &o, 5, &s), 0);
		prefill_all(s, &t, n0);
		float *k = malloc(sizeof(float) * H * d), *v = malloc(sizeof(float) * H * d);
		for (uint32_t i = n0; i < n0 + steps; i++) {
			for (uint32_t h = 0; h < H; h++) {
				memcpy(k + h * d, tk(&t, 0, h, i), sizeof(float) * d);
				memcpy(v + h * d, tv(&t, 0, h, i), sizeof(float) * d);
			}
			cr_assert_eq(mkv_seq_append(&s, 1, 0, k, v, MKV_DTYPE_F32), 0);
			t.n++;
		}
		uint32_t dkeep = drop ? d - d / 4 : d;
		for (uint32_t h = 0; h < H; h++) {
			struct lh *l = seq_lh(s, 0, h);
			cr_assert(l->n - l->ostart >= steps, "the open segment holds %u tokens",
				  l->n - l->ostart);
			cr_assert_eq(l->ok->v.n, l->n - l->ostart);
			double lk = sqrt(l->lk / l->ek), lv = sqrt(l->lv / l->ev);
			double rk = open_loss_ref(l, l->ok, l->open.Rk, &t, 0, h, 1, d, dkeep);
			double rv = open_loss_ref(l, l->ov, l->open.Rv, &t, 0, h, 0, d, dkeep);
			cr_assert(rk > 0.05 && rv > 0.05, "r = 16 of 64 loses little: %g %g", rk, rv);
			cr_assert(fabs(lk - rk) <= 1e-5 * rk && fabs(lv - rv) <= 1e-5 * rv,
				  "seed %llu drop %d head %u: loss K %.9g (reference %.9g), V %.9g "
				  "(reference %.9g)",
				  (unsigned long long)seed, drop, h, lk, rk, lv, rv);
		}
		free(k);
		free(v);
		mkv_seq_close(s);
		mkv_store_destroy(st);
		free(t.k);
		free(t.v);
	}
}

/* ---------------------------------------------------------------------- */
/* Back-pressure bounds the lag. */

/* Token @i of every layer of @t appended to @s (@k, @v: scratch of
 * kv_heads x d floats); t->n counts it.  @after, if set, runs after each
 * layer's append. */
static void append_token(struct mkv_seq *s, struct truth *t, uint32_t i, float *k,
			 float *v, void (*after)(struct mkv_seq *))
{
	for (uint32_t l = 0; l < t->L; l++) {
		for (uint32_t h = 0; h < t->H; h++) {
			memcpy(k + h * t->d, tk(t, l, h, i), sizeof(float) * t->d);
			memcpy(v + h * t->d, tv(t, l, h, i), sizeof(float) * t->d);
		}
		cr_assert_eq(mkv_seq_append(&s, 1, l, k, v, MKV_DTYPE_F32), 0);
		if (after)
			after(s);
	}
	t->n++;
}

/* The two lag tests' sequence: L = 2 layers of H = 4 KV heads (d 128,
 * exact), n0 = 128 tokens prefilled, room for @n more, decode segments
 * uncapped from @min_segment tokens, a lag cap of 1 MiB. */
struct lag_fix {
	uint64_t seed, rng;
	struct mkv_store *st;
	struct mkv_seq_opts o;
	struct truth t;
	struct mkv_seq *s;
	float *k, *v; /* one token of every head */
};

enum { LAG_L = 2, LAG_H = 4, LAG_D = 128, LAG_N0 = 128 };

static void lag_fix_open(struct lag_fix *f, uint32_t min_segment, uint32_t n)
{
	f->seed = fresh_seed();
	f->rng = f->seed;
	f->st = host_store((size_t)64 << 20);
	exact_opts(&f->o, LAG_L, LAG_H, 1, LAG_D);
	f->o.max_segment = 65536;
	f->o.min_segment = min_segment;
	f->o.lag_cap = (size_t)1 << 20;
	truth_init(&f->t, LAG_L, LAG_H, 1, LAG_D, LAG_N0 + n);
	fill_random(&f->t, 0, LAG_N0 + n, &f->rng);
	cr_assert_eq(mkv_seq_open(f->st, &f->o, 3, &f->s), 0);
	prefill_all(f->s, &f->t, LAG_N0);
	f->k = malloc(sizeof(float) * LAG_H * LAG_D);
	f->v = malloc(sizeof(float) * LAG_H * LAG_D);
}

/* Every layer's output still exact, then everything freed. */
static void lag_fix_close(struct lag_fix *f)
{
	for (uint32_t l = 0; l < LAG_L; l++) {
		double e = attend_error(f->s, &f->t, l, &f->rng);
		cr_assert(e < 1e-5, "seed %llu: error %.3g", (unsigned long long)f->seed, e);
	}
	free(f->k);
	free(f->v);
	mkv_seq_close(f->s);
	mkv_store_destroy(f->st);
	free(f->t.k);
	free(f->t.v);
}

Test(sequence, backpressure_bounds_lag, .timeout = 120)
{
	const uint32_t steps = 700;
	struct lag_fix f;
	lag_fix_open(&f, 65536, steps); /* nothing closes by itself */
	struct mkv_seq_stats ss = {.size = sizeof ss};
	for (uint32_t i = LAG_N0; i < LAG_N0 + steps; i++) {
		append_token(f.s, &f.t, i, f.k, f.v, NULL);
		cr_assert_eq(mkv_seq_get_stats(f.s, &ss), 0);
		cr_assert(ss.lag_bytes <= f.o.lag_cap, "lag %llu bytes > cap",
			  (unsigned long long)ss.lag_bytes);
	}
	cr_assert(ss.sync_finalized > 0, "the cap never forced a synchronous finalization");
	lag_fix_close(&f);
}

/* Open segments that never pass the loss threshold (r = d loses nothing)
 * are closed early and queued to the workers once they hold half of
 * lag_cap.  With the workers keeping up (a sync after every token), the
 * open segments hold at most half the cap plus the one layer's rows just
 * appended, nothing is finalized on the caller's thread, and segments are
 * swapped in. */
static void open_within_half_cap(struct mkv_seq *s)
{
	uint64_t open = 0;
	for (uint32_t l = 0; l < s->o.layers; l++)
		for (uint32_t h = 0; h < s->o.kv_heads; h++)
			open += seq_lh(s, l, h)->ok->v.n;
	uint64_t row = 2 * sizeof(float) * s->o.d;
	cr_assert(open * row <= s->o.lag_cap / 2 + s->o.kv_heads * row,
		  "open segments hold %llu tokens (%llu bytes), half the cap is %zu",
		  (unsigned long long)open, (unsigned long long)(open * row),
		  s->o.lag_cap / 2);
}

Test(sequence, early_close_keeps_finalization_off_the_caller, .timeout = 120)
{
	const uint32_t run = 700;
	struct lag_fix f;
	lag_fix_open(&f, 32, run);
	struct mkv_seq_stats ss = {.size = sizeof ss};
	for (uint32_t i = LAG_N0; i < LAG_N0 + run; i++) {
		append_token(f.s, &f.t, i, f.k, f.v, open_within_half_cap);
		mkv_seq_sync(f.s);
	}
	cr_assert_eq(mkv_seq_get_stats(f.s, &ss), 0);
	cr_assert_eq(ss.sync_finalized, 0, "%llu finalized on the caller's thread",
		     (unsigned long long)ss.sync_finalized);
	/* 700 tokens x 8 heads in segments of ~128 tokens at most (half the
	 * cap is 512 tokens open, 64 a head on average) */
	cr_assert(ss.swaps >= (uint64_t)run * LAG_L * LAG_H / 256, "only %llu swaps",
		  (unsigned long long)ss.swaps);
	lag_fix_close(&f);
}

/* ---------------------------------------------------------------------- */
/* Bad input changes nothing. */

Test(sequence, bad_input_changes_nothing, .timeout = 60)
{
	const uint32_t L = 1, H = 1, G = 1, d = 64, n0 = 100;
	uint64_t rng = fresh_seed();
	struct mkv_store *st = host_store((size_t)16 << 20);
	struct mkv_seq_opts o;
	exact_opts(&o, L, H, G, d);
	struct mkv_seq *s = (struct mkv_seq *)0x1;
	struct mkv_seq_opts bad = o;
	bad.size = 3;
	cr_assert_eq(mkv_seq_open(st, &bad, 1, &s), -EINVAL);
	cr_assert_eq(s, (struct mkv_seq *)0x1, "out written on failure");
	bad = o;
	bad.r = d + 1;
	cr_assert_eq(mkv_seq_open(st, &bad, 1, &s), -EINVAL);
	uint32_t badbits[] = {1, 3, 9, 16};
	for (int i = 0; i < 4; i++) {
		bad = o;
		bad.value_bits = badbits[i];
		cr_assert_eq(mkv_seq_open(st, &bad, 1, &s), -EINVAL, "value_bits %u", badbits[i]);
	}
	bad = o;
	bad.summary_channels = d + 1;
	cr_assert_eq(mkv_seq_open(st, &bad, 1, &s), -EINVAL);
	bad = o;
	bad.adaptive = 2;
	cr_assert_eq(mkv_seq_open(st, &bad, 1, &s), -EINVAL);
	cr_assert_eq(s, (struct mkv_seq *)0x1, "out written on failure");
	cr_assert_eq(mkv_seq_open(NULL, &o, 1, &s), -EINVAL);
	cr_assert_eq(mkv_seq_opts_init(&o, 5), -EINVAL);
	cr_assert_eq(mkv_seq_open(st, &o, 1, &s), 0);
	struct truth t;
	truth_init(&t, L, H, G, d, n0 + 1);
	fill_random(&t, 0, n0 + 1, &rng);
	prefill_all(s, &t, n0);
	/* A second prefill of the same layer is refused. */
	cr_assert_eq(mkv_seq_prefill(s, 0, t.k, t.v, MKV_DTYPE_F32, n0), -EINVAL);
	cr_assert_eq(mkv_seq_prefill(s, 1, t.k, t.v, MKV_DTYPE_F32, n0), -EINVAL);
	float k[64], v[64], q[64], out[64];
	memcpy(k, tk(&t, 0, 0, n0), sizeof k);
	memcpy(v, tv(&t, 0, 0, n0), sizeof v);
	k[5] = NAN;
	cr_assert_eq(mkv_seq_append(&s, 1, 0, k, v, MKV_DTYPE_F32), -MKV_ENONFINITE);
	k[5] = INFINITY;
	cr_assert_eq(mkv_seq_append(&s, 1, 0, k, v, MKV_DTYPE_F32), -MKV_ENONFINITE);
	cr_assert_eq(mkv_seq_append(&s, 1, 1, k, v, MKV_DTYPE_F32), -EINVAL);
	cr_assert_eq(mkv_seq_append(NULL, 1, 0, k, v, MKV_DTYPE_F32), -EINVAL);
	cr_assert_eq(mkv_seq_append(&s, 1, 0, k, v, (enum mkv_dtype)7), -EINVAL);
	for (int i = 0; i < 64; i++)
		q[i] = 0.1f * (float)i;
	cr_assert_eq(mkv_seq_attend(s, 1, q, out, NULL), -EINVAL);
	q[3] = NAN;
	cr_assert_eq(mkv_seq_attend(s, 0, q, out, NULL), -MKV_ENONFINITE);
	cr_assert_eq(mkv_seq_flush(s, 7), -EINVAL);
	struct mkv_seq_stats ss = {.size = 1};
	cr_assert_eq(mkv_seq_get_stats(s, &ss), -EINVAL);
	ss.size = sizeof ss;
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	cr_assert_eq(ss.tokens, n0, "a refused call changed the token count");
	/* Nothing changed: still exact over the prefill. */
	double e = attend_error(s, &t, 0, &rng);
	cr_assert(e < 1e-5, "error %.3g after refused calls", e);
	mkv_seq_close(s);
	mkv_store_destroy(st);
	free(t.k);
	free(t.v);
}
