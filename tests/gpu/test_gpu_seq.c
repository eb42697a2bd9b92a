/* SPDX-License-Identifier: MIT */
/*
 * A sequence's GPU attend (mosaickv/seqgpu.c) against its CPU attend and
 * against exact attention, on the same appended tokens: prefill, decode
 * with closes, swaps in flight and forced flushes, bursts of appends
 * between attends (device catch-up and re-upload), an update buffer that
 * outgrows its first capacity, the dense window's ring, and device
 * pointers (mkv_seq_attend_dev, prefill from device memory).  Fresh random
 * data every run (the seed is printed on failure).  Skips without a GPU.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "gpu_util.h"

/* Exact softmax attention of one query over n tokens, double precision. */
static void ref_attention(const float *q, const float *k, const float *v, size_t n,
			  uint32_t d, double *out)
{
	double m = -INFINITY, l = 0, scale = 1.0 / sqrt((double)d);
	double *s = malloc(sizeof(double) * n);
	cr_assert(s);
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

/* All tokens of a run, bf16 (what the sequence is given) and float (the
 * same values, for the reference): [layer][head][token][d]. */
struct data {
	uint32_t L, H, G, d, N;
	uint16_t *kb, *vb;
	float *kf, *vf;
};

static size_t at(const struct data *t, uint32_t l, uint32_t h, uint32_t i)
{
	return (((size_t)l * t->H + h) * t->N + i) * t->d;
}

static void data_make(struct data *t, struct gu_rng *g, uint32_t L, uint32_t H,
		      uint32_t G, uint32_t d, uint32_t N)
{
	*t = (struct data){L, H, G, d, N, NULL, NULL, NULL, NULL};
	size_t n = (size_t)L * H * N * d;
	t->kb = malloc(2 * n);
	t->vb = malloc(2 * n);
	t->kf = malloc(4 * n);
	t->vf = malloc(4 * n);
	cr_assert(t->kb && t->vb && t->kf && t->vf);
	/* Statistics that change every 700 tokens: temporary compression
	 * differs from the final one, so swaps change something. */
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t h = 0; h < H; h++)
			for (uint32_t i0 = 0; i0 < N; i0 += 700) {
				uint32_t m = N - i0 < 700 ? N - i0 : 700;
				gu_fill_kv(g, t->kb + at(t, l, h, i0), m, d);
				gu_fill_kv(g, t->vb + at(t, l, h, i0), m, d);
			}
	for (size_t i = 0; i < n; i++) {
		t->kf[i] = gu_f32(t->kb[i]);
		t->vf[i] = gu_f32(t->vb[i]);
	}
}

static void data_free(struct data *t)
{
	free(t->kb);
	free(t->vb);
	free(t->kf);
	free(t->vf);
}

static struct mkv_store *gpu_store(void)
{
	struct mkv_store_opts so;
	cr_assert_eq(mkv_store_opts_init(&so, sizeof so), 0);
	so.gpu = 0;
	so.hbm_bytes = (size_t)256 << 20;
	so.host_bytes = (size_t)256 << 20;
	so.workers = 2;
	struct mkv_store *st = NULL;
	int rc = mkv_store_create(&so, &st);
	cr_assert_eq(rc, 0, "store: %s", mkv_strerror(rc));
	return st;
}

/* Prefill tokens [0, n0) of every layer; from device memory if @dev. */
static void prefill(struct mkv_seq *s, const struct data *t, uint32_t n0, int dev)
{
	size_t per = (size_t)n0 * t->d, bytes = 2 * t->H * per;
	uint16_t *k = malloc(bytes), *v = malloc(bytes);
	cr_assert(k && v);
	for (uint32_t l = 0; l < t->L; l++) {
		for (uint32_t h = 0; h < t->H; h++) {
			memcpy(k + h * per, t->kb + at(t, l, h, 0), 2 * per);
			memcpy(v + h * per, t->vb + at(t, l, h, 0), 2 * per);
		}
		int rc;
		if (dev) {
			void *dk = gu_upload(k, bytes), *dv = gu_upload(v, bytes);
			rc = mkv_seq_prefill(s, l, dk, dv, MKV_DTYPE_BF16, n0);
			GU_CK(cudaFree(dk));
			GU_CK(cudaFree(dv));
		} else {
			rc = mkv_seq_prefill(s, l, k, v, MKV_DTYPE_BF16, n0);
		}
		cr_assert_eq(rc, 0, "prefill: %s", mkv_strerror(rc));
	}
	free(k);
	free(v);
}

/* Append token @i to every layer. */
static void append(struct mkv_seq *s, const struct data *t, uint32_t i)
{
	uint16_t k[8 * 128], v[8 * 128];
	cr_assert(t->H * t->d <= 8 * 128);
	for (uint32_t l = 0; l < t->L; l++) {
		for (uint32_t h = 0; h < t->H; h++) {
			memcpy(k + h * t->d, t->kb + at(t, l, h, i), 2 * t->d);
			memcpy(v + h * t->d, t->vb + at(t, l, h, i), 2 * t->d);
		}
		int rc = mkv_seq_append(&s, 1, l, k, v, MKV_DTYPE_BF16);
		cr_assert_eq(rc, 0, "append: %s", mkv_strerror(rc));
	}
}

struct cfg {
	const char *name;
	uint32_t L, H, G, d;
	uint32_t n0, steps;       /* prefill tokens, decode tokens */
	uint32_t prefill_segment, min_segment, max_segment, window;
	uint32_t r;               /* 0: the default budget, or chosen by
	                           * loss when adaptive */
	uint32_t vb;              /* value bits (0: bf16 rows) */
	uint32_t adaptive;        /* strategies chosen per segment */
	uint32_t drop;            /* 1: d_keep = 3d/4 */
	double frac;
	uint32_t burst_at, burst; /* appends without attend from token burst_at */
	uint32_t every;           /* attend every this many tokens (1: each) */
	double tol_cpu;           /* max relative difference GPU vs CPU */
	double tol_cpu_mean;      /* mean of it */
	double tol_dense;         /* mean GPU vs exact (0: not checked) */
	double tol_dense_max;     /* and its largest */
	uint32_t flush_every;     /* mkv_seq_flush every this many tokens */
	double qscale;            /* query elements ~ N(0, qscale²) */
	uint32_t sb;              /* mkv_seq_opts.summary_bits (0: 16) */
	uint32_t g;               /* mkv_seq_opts.g (0: 1) */
};

static double rel(const float *a, const float *b, size_t n)
{
	return gu_rel_err(a, b, n);
}

static void run(const struct cfg *c)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng g;
	gu_rng_init(&g, seed);
	struct data t;
	uint32_t N = c->n0 + c->steps;
	data_make(&t, &g, c->L, c->H, c->G, c->d, N);
	struct mkv_store *st = gpu_store();
	struct mkv_seq_opts o;
	cr_assert_eq(mkv_seq_opts_init(&o, sizeof o), 0);
	o.layers = c->L;
	o.kv_heads = c->H;
	o.q_per_kv = c->G;
	o.d = c->d;
	o.prefill_segment = c->prefill_segment;
	o.min_segment = c->min_segment;
	o.max_segment = c->max_segment;
	o.window = c->window;
	o.token_frac = c->frac;
	o.r = c->r;
	o.value_bits = c->vb;
	o.adaptive = c->adaptive;
	o.g = c->g ? c->g : 1;
	o.b = 16;
	o.drop = c->drop;
	o.store_dtype = MKV_DTYPE_BF16;
	o.summary_bits = c->sb ? c->sb : 16;
	o.staging_bytes = (size_t)16 << 20;
	struct mkv_seq *s = NULL;
	int rc = mkv_seq_open(st, &o, 77, &s);
	cr_assert_eq(rc, 0, "open: %s", mkv_strerror(rc));
	struct mkv_seq_stats ss = {.size = sizeof ss};
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	cr_assert_eq(ss.on_device, 1, "a device is usable but the sequence is not on it");
	prefill(s, &t, c->n0, 0);

	cudaStream_t X;
	GU_CK(cudaStreamCreateWithFlags(&X, cudaStreamNonBlocking));
	uint32_t HG = c->H * c->G, d = c->d;
	size_t qn = (size_t)HG * d;
	float *q = malloc(4 * qn), *oc = malloc(4 * qn), *og = malloc(4 * qn),
	      *od = malloc(4 * qn);
	double *ref = malloc(sizeof(double) * d);
	float *reff = malloc(4 * qn);
	float *dq = gu_dev(4 * qn), *dout = gu_dev(4 * qn);
	cr_assert(q && oc && og && od && ref && reff);
	double worst = 0, sum = 0, worst_dense = 0, sum_dense_g = 0, sum_dense_c = 0;
	uint32_t compares = 0, retried = 0;
	for (uint32_t i = c->n0; i <= N; i++) {
		if (i > c->n0) {
			append(s, &t, i - 1);
			if (c->flush_every && (i - c->n0) % c->flush_every == 0)
				cr_assert_eq(mkv_seq_flush(s, UINT32_MAX), 0);
		}
		uint32_t k = i - c->n0;
		bool in_burst = c->burst && k > c->burst_at && k < c->burst_at + c->burst;
		if (in_burst || (k % c->every && i != N))
			continue;
		for (uint32_t l = 0; l < c->L; l++) {
			for (size_t j = 0; j < qn; j++)
				q[j] = (float)(c->qscale * gu_normal(&g));
			/* A swap between the two calls would change what they
			 * attend: redo the pair then. */
			uint64_t sw0, sw1;
			int tries = 0;
			do {
				cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
				sw0 = ss.swaps;
				rc = mkv_seq_attend(s, l, q, oc, NULL);
				cr_assert_eq(rc, 0, "cpu attend: %s", mkv_strerror(rc));
				rc = mkv_seq_attend(s, l, q, og, X);
				cr_assert_eq(rc, 0, "gpu attend: %s", mkv_strerror(rc));
				cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
				sw1 = ss.swaps;
				retried += sw1 != sw0;
			} while (sw1 != sw0 && ++tries < 20);
			cr_assert_eq(sw1, sw0, "swaps never stopped");
			/* The same through device pointers. */
			/* On X: a cudaMemcpy from pageable memory may return
			 * before its DMA lands, and neither it nor cudaMemset
			 * orders a non-blocking stream (the attend then read
			 * the last step's query: one run in many, "attend_dev vs
			 * attend 0.68", fiftieth session) */
			GU_CK(cudaMemcpyAsync(dq, q, 4 * qn, cudaMemcpyHostToDevice, X));
			GU_CK(cudaMemsetAsync(dout, 0xff, 4 * qn, X));
			rc = mkv_seq_attend_dev(s, l, dq, dout, X);
			cr_assert_eq(rc, 0, "attend_dev: %s", mkv_strerror(rc));
			GU_CK(cudaStreamSynchronize(X));
			GU_CK(cudaMemcpy(od, dout, 4 * qn, cudaMemcpyDeviceToHost));
			cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
			double edev = rel(od, og, qn);
			/* A swap may have landed before attend_dev: only then
			 * may the two device results differ. */
			if (ss.swaps == sw1)
				cr_assert(edev < 1e-5, "seed %llu %s: attend_dev vs attend %g",
					  (unsigned long long)seed, c->name, edev);
			double e = rel(og, oc, qn);
			cr_assert(e < c->tol_cpu,
				  "seed %llu %s token %u layer %u: GPU vs CPU rel err %g",
				  (unsigned long long)seed, c->name, i, l, e);
			worst = e > worst ? e : worst;
			sum += e;
			compares++;
			for (uint32_t qh = 0; qh < HG; qh++) {
				uint32_t h = qh / c->G;
				ref_attention(q + (size_t)qh * d, t.kf + at(&t, l, h, 0),
					      t.vf + at(&t, l, h, 0), i, d, ref);
				for (uint32_t j = 0; j < d; j++)
					reff[(size_t)qh * d + j] = (float)ref[j];
			}
			double eg = rel(og, reff, qn), ec = rel(oc, reff, qn);
			sum_dense_g += eg;
			sum_dense_c += ec;
			if (c->tol_dense > 0)
				cr_assert(eg < c->tol_dense_max,
					  "seed %llu %s token %u layer %u: GPU vs exact %g (CPU %g)",
					  (unsigned long long)seed, c->name, i, l, eg, ec);
			worst_dense = eg > worst_dense ? eg : worst_dense;
		}
	}
	cr_assert(compares > 0);
	if (c->tol_dense > 0)
		cr_assert(sum_dense_g / compares < c->tol_dense,
			  "seed %llu %s: mean GPU vs exact %g (CPU %g)", (unsigned long long)seed,
			  c->name, sum_dense_g / compares, sum_dense_c / compares);
	cr_assert(sum / compares < c->tol_cpu_mean,
		  "seed %llu %s: mean GPU vs CPU rel err %g (worst %g, %u compares)",
		  (unsigned long long)seed, c->name, sum / compares, worst, compares);
	/* The device path is not worse than the CPU path against exact. */
	cr_assert(sum_dense_g <= sum_dense_c * 1.05 + 1e-3 * compares,
		  "seed %llu %s: mean error vs exact GPU %g, CPU %g",
		  (unsigned long long)seed, c->name, sum_dense_g / compares,
		  sum_dense_c / compares);
	cr_assert_eq(mkv_seq_sync(s), 0);
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	cr_assert_eq(ss.tokens, N);
	cr_assert(ss.device_attends >= compares, "device attends %llu",
		  (unsigned long long)ss.device_attends);
	cr_assert(ss.device_bytes > 0);
	cr_assert_eq(ss.finalize_failed, 0);
	cr_assert_eq(ss.device_upload_failed, 0);
	cr_log_info("%s: %u compares, GPU vs CPU mean %.2e worst %.2e; vs exact GPU %.2e CPU %.2e "
		    "(worst GPU %.2e); swaps %llu, retried pairs %u, device %.1f MiB",
		    c->name, compares, sum / compares, worst, sum_dense_g / compares,
		    sum_dense_c / compares, worst_dense, (unsigned long long)ss.swaps, retried,
		    ss.device_bytes / 1048576.0);
	cr_assert(ss.swaps > 0, "no swap happened");
	free(q);
	free(oc);
	free(og);
	free(od);
	free(ref);
	free(reff);
	GU_CK(cudaFree(dq));
	GU_CK(cudaFree(dout));
	cr_assert_eq(mkv_seq_close(s), 0);
	GU_CK(cudaStreamDestroy(X));
	mkv_store_destroy(st);
	data_free(&t);
}

/* r = d and every block: the device path equals exact attention, within
 * what bf16 storage of the rotated vectors and of the rotations costs
 * (the CPU path: 1.3e-3 on average, 1.7e-3 at worst on this data; the
 * kernels' fp16 tensor-core products add their own rounding). */
Test(gpu_seq, exact_full_selection, .timeout = 600)
{
	struct cfg c = {.name = "exact", .L = 2, .H = 2, .G = 4, .d = 128, .n0 = 600,
			.steps = 260, .prefill_segment = 256, .min_segment = 32,
			.max_segment = 96, .window = 16, .r = 128, .frac = 1.0,
			.burst_at = 100, .burst = 40, .every = 1, .tol_cpu = 3e-3,
			.tol_cpu_mean = 1.5e-3, .tol_dense = 2e-3, .tol_dense_max = 3e-3, .flush_every = 50,
			.qscale = 0.3};
	run(&c);
}

/* The same with d = 64, two queries per KV head and no window. */
Test(gpu_seq, exact_d64_no_window, .timeout = 600)
{
	struct cfg c = {.name = "exact_d64", .L = 1, .H = 3, .G = 2, .d = 64, .n0 = 300,
			.steps = 200, .prefill_segment = 128, .min_segment = 16,
			.max_segment = 64, .window = 0, .r = 64, .frac = 1.0,
			.burst_at = 60, .burst = 30, .every = 1, .tol_cpu = 3e-3,
			.tol_cpu_mean = 1.5e-3, .tol_dense = 2e-3, .tol_dense_max = 3e-3, .flush_every = 0,
			.qscale = 0.3};
	run(&c);
}

/* Compressed (r = 32), every block: GPU and CPU differ only by how the
 * update buffer rounds.  The open segment outgrows the buffer's first
 * capacity (1024 tokens), and a burst of 300 appends without attend makes
 * the device re-upload instead of catching up. */
Test(gpu_seq, compressed_long_open_segment, .timeout = 900)
{
	struct cfg c = {.name = "compressed", .L = 1, .H = 2, .G = 4, .d = 128, .n0 = 512,
			.steps = 1500, .prefill_segment = 256, .min_segment = 1400,
			.max_segment = 1400, .window = 64, .r = 32, .frac = 1.0,
			.burst_at = 200, .burst = 300, .every = 9, .tol_cpu = 2e-2,
			.tol_cpu_mean = 5e-3, .tol_dense = 0, .flush_every = 0,
			.qscale = 0.5};
	run(&c);
}

/* Loss-chosen strategies and 20% of the tokens: block selection on both
 * sides.  Blocks within rounding of the cut-off may go either way. */
Test(gpu_seq, compressed_selection, .timeout = 900)
{
	struct cfg c = {.name = "selection", .L = 2, .H = 2, .G = 4, .d = 128, .n0 = 1500,
			.steps = 300, .prefill_segment = 512, .min_segment = 64,
			.max_segment = 4096, .window = 32, .r = 0, .adaptive = 1, .frac = 0.2,
			.burst_at = 150, .burst = 20, .every = 3, .tol_cpu = 0.15,
			.tol_cpu_mean = 1e-2, .tol_dense = 0, .flush_every = 97,
			.qscale = 0.5};
	run(&c);
}

/* 8-bit scores (mkv_seq_opts.summary_bits = 8) on the bench's format
 * (bf16 r = 32, S = 32): the device scores its final segments in integers
 * as the host path does; blocks within rounding of the cut-off (and where
 * the two sides' rotated queries round a channel to different integers)
 * may go either way, as in compressed_selection. */
Test(gpu_seq, sum8_selection, .timeout = 900)
{
	struct cfg c = {.name = "sum8", .L = 2, .H = 2, .G = 4, .d = 128, .n0 = 1500,
			.steps = 300, .prefill_segment = 512, .min_segment = 64,
			.max_segment = 512, .window = 32, .r = 32, .drop = 1, .frac = 0.1,
			.burst_at = 150, .burst = 20, .every = 3, .tol_cpu = 0.15,
			.tol_cpu_mean = 1e-2, .tol_dense = 0, .flush_every = 97,
			.qscale = 0.5, .sb = 8};
	run(&c);
}

/*
 * The serving defaults: 6-bit value rows, r = the default budget (40 of
 * 64; 82 of 128), g = 1, b = 16, S = r, the remainder bound in the scores,
 * 10-20% of the tokens.  Rows stay quantized on the device, and the update
 * buffer quantizes new tokens there; GPU and CPU differ by that rounding
 * and by blocks within rounding of the cut-off.
 */
Test(gpu_seq, defaults_q6_d64, .timeout = 900)
{
	struct cfg c = {.name = "defaults_d64", .L = 2, .H = 2, .G = 3, .d = 64, .n0 = 1200,
			.steps = 400, .prefill_segment = 512, .min_segment = 64,
			.max_segment = 1024, .window = 64, .r = 0, .vb = 6, .frac = 0.1,
			.burst_at = 150, .burst = 30, .every = 5, .tol_cpu = 0.15,
			.tol_cpu_mean = 1e-2, .tol_dense = 0, .flush_every = 97,
			.qscale = 0.5};
	run(&c);
}

Test(gpu_seq, defaults_q6_d128, .timeout = 900)
{
	struct cfg c = {.name = "defaults_d128", .L = 1, .H = 2, .G = 4, .d = 128, .n0 = 1500,
			.steps = 300, .prefill_segment = 512, .min_segment = 64,
			.max_segment = 512, .window = 32, .r = 0, .vb = 6, .frac = 0.2,
			.burst_at = 100, .burst = 20, .every = 4, .tol_cpu = 0.15,
			.tol_cpu_mean = 1e-2, .tol_dense = 0, .flush_every = 61,
			.qscale = 0.5};
	run(&c);
}

/* The bench's format (bf16 r = 32 of d_keep = 96): every view keeps
 * GPU_ATTN_SMALL_ROWS' promise, so the step runs the four-CTA layout. */
Test(gpu_seq, small_rows_drop, .timeout = 900)
{
	struct cfg c = {.name = "small_rows", .L = 1, .H = 2, .G = 4, .d = 128, .n0 = 1500,
			.steps = 300, .prefill_segment = 512, .min_segment = 64,
			.max_segment = 512, .window = 32, .r = 32, .drop = 1, .frac = 0.2,
			.burst_at = 100, .burst = 20, .every = 4, .tol_cpu = 0.15,
			.tol_cpu_mean = 1e-2, .tol_dense = 0, .flush_every = 61,
			.qscale = 0.5};
	run(&c);
}

/* The same with g = 2 (a bitmap bit a pair of channels): the staged path's
 * g = 2 expansion in the small layout, the update buffer compressing pairs
 * on arrival, against the CPU path over the same segments. */
Test(gpu_seq, small_rows_g2, .timeout = 900)
{
	struct cfg c = {.name = "small_rows_g2", .L = 1, .H = 2, .G = 4, .d = 128, .n0 = 1500,
			.steps = 300, .prefill_segment = 512, .min_segment = 64,
			.max_segment = 512, .window = 32, .r = 32, .drop = 1, .frac = 0.2,
			.burst_at = 100, .burst = 20, .every = 4, .tol_cpu = 0.15,
			.tol_cpu_mean = 1e-2, .tol_dense = 0, .flush_every = 61,
			.qscale = 0.5, .g = 2};
	run(&c);
}

/* The serving defaults at @layers x 2 KV heads x 4 query heads, d = 128,
 * 256-token prefill segments, a 16-token window. */
static void small_opts(struct mkv_seq_opts *o, uint32_t layers)
{
	cr_assert_eq(mkv_seq_opts_init(o, sizeof *o), 0);
	o->layers = layers;
	o->kv_heads = 2;
	o->q_per_kv = 4;
	o->prefill_segment = 256;
	o->window = 16;
}

/* Every layer of @a (no positions) and @b (device_positions) attended on
 * the GPU with one fresh query a layer (H x G x d): @b's outputs finite
 * and within 1e-6 of @a's. */
static void attend_same(struct mkv_seq *a, struct mkv_seq *b, uint32_t L, size_t qn,
			struct gu_rng *g, uint64_t seed, int round)
{
	cudaStream_t X;
	GU_CK(cudaStreamCreateWithFlags(&X, cudaStreamNonBlocking));
	float *q = malloc(4 * qn), *oa = malloc(4 * qn), *ob = malloc(4 * qn);
	cr_assert(q && oa && ob);
	for (uint32_t l = 0; l < L; l++) {
		for (size_t j = 0; j < qn; j++)
			q[j] = (float)(0.5 * gu_normal(g));
		cr_assert_eq(mkv_seq_attend(a, l, q, oa, X), 0);
		cr_assert_eq(mkv_seq_attend(b, l, q, ob, X), 0);
		for (size_t j = 0; j < qn; j++)
			cr_assert(isfinite(ob[j]), "seed %llu round %d layer %u: output %zu is %g",
				  (unsigned long long)seed, round, l, j, ob[j]);
		double e = gu_rel_err(ob, oa, qn);
		cr_assert(e <= 1e-6, "seed %llu round %d layer %u: with positions vs without: %g",
			  (unsigned long long)seed, round, l, e);
	}
	GU_CK(cudaStreamDestroy(X));
	free(q);
	free(oa);
	free(ob);
}

/* Value positions (mkv_seq_opts.device_positions) on the bench's format
 * (bf16 r = 32 of d_keep 96): the GPU attends give what they give without
 * them (the scatter fills the very tiles the ranking fills), and the
 * device holds the positions of every final segment (64 bytes a token: K
 * and V, 32 each). */
Test(gpu_seq, positions_same_output, .timeout = 300)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng g;
	gu_rng_init(&g, seed);
	struct data t;
	const uint32_t L = 2, H = 2, G = 4, d = 128, n0 = 1200, steps = 40;
	data_make(&t, &g, L, H, G, d, n0 + steps);
	struct mkv_store *st = gpu_store();
	struct mkv_seq_opts o;
	small_opts(&o, L);
	o.value_bits = 0;
	o.r = 32;
	o.drop = 1;
	o.token_frac = 0.2;
	struct mkv_seq *a, *b;
	cr_assert_eq(mkv_seq_open(st, &o, 1, &a), 0);
	o.device_positions = 2;
	cr_assert_eq(mkv_seq_open(st, &o, 2, &b), -EINVAL, "device_positions 2 accepted");
	o.device_positions = 1;
	cr_assert_eq(mkv_seq_open(st, &o, 2, &b), 0);
	prefill(a, &t, n0, 0);
	prefill(b, &t, n0, 0);
	for (uint32_t i = n0; i < n0 + steps; i++) {
		append(a, &t, i);
		append(b, &t, i);
	}
	struct mkv_seq_stats sa = {.size = sizeof sa}, sb = {.size = sizeof sb};
	cr_assert_eq(mkv_seq_get_stats(a, &sa), 0);
	cr_assert_eq(mkv_seq_get_stats(b, &sb), 0);
	cr_assert(sa.on_device && sb.on_device);
	/* the prefill's four full segments of 256 tokens are final */
	uint64_t want = (uint64_t)4 * 256 * L * H * 64;
	cr_assert(sb.device_bytes >= sa.device_bytes + want,
		  "device bytes %llu with positions, %llu without: want %llu more",
		  (unsigned long long)sb.device_bytes, (unsigned long long)sa.device_bytes,
		  (unsigned long long)want);
	/* and those, in this format, hold their values in store order */
	cr_assert(sb.device_ordered >= (uint64_t)4 * L * H && sa.device_ordered == 0,
		  "segments in store order: %llu with positions, %llu without",
		  (unsigned long long)sb.device_ordered, (unsigned long long)sa.device_ordered);
	attend_same(a, b, L, (size_t)H * G * d, &g, seed, 0);
	cr_assert_eq(mkv_seq_get_stats(b, &sb), 0);
	cr_assert_eq(sb.device_unordered, 0, "every step ran the small layout");
	cr_assert_eq(mkv_seq_close(a), 0);
	cr_assert_eq(mkv_seq_close(b), 0);
	mkv_store_destroy(st);
	data_free(&t);
}

/* @n rows of bf16 vectors (d channels) of rank @k plus noise 0.05, the
 * factors an AR(1) of coefficient @ar in time: at d 128 the strategy
 * generator (drop, loss 0.3, variance 0.5) takes r 19-20, g 1, b 16 for
 * k 64, ar 0.9, and r 38-39, b 8 for k 128, ar 0 (checked on 12 seeds
 * with mkv_strategy_choose on 512 rows). */
static void fill_rank(struct gu_rng *g, uint16_t *out, size_t n, uint32_t d, uint32_t k,
		      double ar)
{
	float *B = malloc(sizeof(float) * k * d);
	double *c = malloc(sizeof(double) * k);
	cr_assert(B && c);
	for (size_t i = 0; i < (size_t)k * d; i++)
		B[i] = (float)gu_normal(g);
	for (uint32_t i = 0; i < k; i++)
		c[i] = gu_normal(g);
	for (size_t t = 0; t < n; t++) {
		for (uint32_t i = 0; i < k; i++)
			c[i] = ar * c[i] + sqrt(1 - ar * ar) * gu_normal(g);
		for (uint32_t j = 0; j < d; j++) {
			double v = 0.05 * gu_normal(g);
			for (uint32_t i = 0; i < k; i++)
				v += c[i] * B[(size_t)i * d + j];
			out[t * d + j] = gu_bf16((float)(v / sqrt(k)));
		}
	}
	free(B);
	free(c);
}

/* Copies in store order meet a step the small layout cannot run:
 * adaptive strategies, the first 512-token segment of every head in the
 * positions' format (r <= 32, b 16: put in store order at upload), the
 * second not (r > 32: no positions, rows too wide for the small layout).
 * The first attend of each layer puts its copies back in channel order
 * (device_unordered) and every attend, before and after appends, gives
 * what the same sequence without positions gives, never NaN. */
Test(gpu_seq, store_order_undone, .timeout = 300)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng g;
	gu_rng_init(&g, seed);
	struct data t;
	const uint32_t L = 2, H = 2, G = 4, d = 128, n0 = 1100, steps = 8;
	data_make(&t, &g, L, H, G, d, n0 + steps);
	for (uint32_t l = 0; l < L; l++)
		for (uint32_t h = 0; h < H; h++) {
			fill_rank(&g, t.kb + at(&t, l, h, 0), 512, d, 64, 0.9);
			fill_rank(&g, t.vb + at(&t, l, h, 0), 512, d, 64, 0.9);
			fill_rank(&g, t.kb + at(&t, l, h, 512), t.N - 512, d, 128, 0.0);
			fill_rank(&g, t.vb + at(&t, l, h, 512), t.N - 512, d, 128, 0.0);
		}
	for (size_t i = 0; i < (size_t)L * H * t.N * d; i++) {
		t.kf[i] = gu_f32(t.kb[i]);
		t.vf[i] = gu_f32(t.vb[i]);
	}
	struct mkv_store *st = gpu_store();
	struct mkv_seq_opts o;
	small_opts(&o, L);
	o.prefill_segment = 512;
	o.value_bits = 0;
	o.adaptive = 1;
	o.drop = 1;
	o.token_frac = 0.2;
	struct mkv_seq *a, *b;
	cr_assert_eq(mkv_seq_open(st, &o, 1, &a), 0);
	o.device_positions = 1;
	cr_assert_eq(mkv_seq_open(st, &o, 2, &b), 0);
	prefill(a, &t, n0, 0);
	prefill(b, &t, n0, 0);
	struct mkv_seq_stats sb = {.size = sizeof sb};
	cr_assert_eq(mkv_seq_get_stats(b, &sb), 0);
	cr_assert(sb.on_device);
	cr_assert(sb.device_ordered >= 1 && sb.device_unordered == 0,
		  "seed %llu: %llu copies in store order, %llu put back before any attend",
		  (unsigned long long)seed, (unsigned long long)sb.device_ordered,
		  (unsigned long long)sb.device_unordered);
	for (int round = 0; round < 2; round++) {
		if (round)
			for (uint32_t i = n0; i < n0 + steps; i++) {
				append(a, &t, i);
				append(b, &t, i);
			}
		attend_same(a, b, L, (size_t)H * G * d, &g, seed, round);
	}
	uint64_t made = sb.device_ordered;
	cr_assert_eq(mkv_seq_get_stats(b, &sb), 0);
	cr_assert(sb.device_unordered >= made && sb.device_unordered == sb.device_ordered,
		  "seed %llu: %llu in store order, %llu put back (%llu before the attends)",
		  (unsigned long long)seed, (unsigned long long)sb.device_ordered,
		  (unsigned long long)sb.device_unordered, (unsigned long long)made);
	cr_assert_eq(mkv_seq_close(a), 0);
	cr_assert_eq(mkv_seq_close(b), 0);
	mkv_store_destroy(st);
	data_free(&t);
}

/* Prefill from device memory gives the same sequence as from the host. */
Test(gpu_seq, prefill_from_device_memory, .timeout = 300)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng g;
	gu_rng_init(&g, seed);
	struct data t;
	const uint32_t n0 = 700;
	data_make(&t, &g, 2, 2, 4, 128, n0);
	struct mkv_store *st = gpu_store();
	struct mkv_seq_opts o;
	small_opts(&o, 2);
	o.token_frac = 0.3;
	struct mkv_seq *a, *b;
	cr_assert_eq(mkv_seq_open(st, &o, 1, &a), 0);
	cr_assert_eq(mkv_seq_open(st, &o, 2, &b), 0);
	prefill(a, &t, n0, 1);
	prefill(b, &t, n0, 0);
	size_t qn = (size_t)2 * 4 * 128;
	float *q = malloc(4 * qn), *oa = malloc(4 * qn), *ob = malloc(4 * qn);
	for (uint32_t l = 0; l < 2; l++) {
		for (size_t j = 0; j < qn; j++)
			q[j] = (float)(0.5 * gu_normal(&g));
		cr_assert_eq(mkv_seq_attend(a, l, q, oa, NULL), 0);
		cr_assert_eq(mkv_seq_attend(b, l, q, ob, NULL), 0);
		double e = gu_rel_err(oa, ob, qn);
		cr_assert(e == 0, "seed %llu layer %u: device vs host prefill differ by %g",
			  (unsigned long long)seed, l, e);
	}
	free(q);
	free(oa);
	free(ob);
	cr_assert_eq(mkv_seq_close(a), 0);
	cr_assert_eq(mkv_seq_close(b), 0);
	mkv_store_destroy(st);
	data_free(&t);
}

/* Two-stage selection (refine) is a host path: mkv_seq_attend_dev refuses
 * it and changes nothing, mkv_seq_attend with a stream gives what it gives
 * without one (the CPU path, over the store's device tier). */
Test(gpu_seq, refine_runs_on_the_host_path, .timeout = 300)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng g;
	gu_rng_init(&g, seed);
	struct data t;
	const uint32_t n0 = 900;
	data_make(&t, &g, 1, 2, 4, 128, n0);
	struct mkv_store *st = gpu_store();
	struct mkv_seq_opts o;
	small_opts(&o, 1);
	o.refine = 2.0;
	struct mkv_seq *s;
	cr_assert_eq(mkv_seq_open(st, &o, 3, &s), 0);
	prefill(s, &t, n0, 0);
	cr_assert_eq(mkv_seq_sync(s), 0);
	size_t qn = (size_t)2 * 4 * 128;
	float *q = malloc(4 * qn), *oa = malloc(4 * qn), *ob = malloc(4 * qn);
	for (size_t j = 0; j < qn; j++)
		q[j] = (float)(0.5 * gu_normal(&g));
	float *dq = gu_upload(q, 4 * qn), *dout = (float *)gu_dev(4 * qn);
	GU_CK(cudaMemset(dout, 0x5a, 4 * qn));
	cudaStream_t cs;
	GU_CK(cudaStreamCreate(&cs));
	cr_assert_eq(mkv_seq_attend_dev(s, 0, dq, dout, cs), -EINVAL);
	GU_CK(cudaStreamSynchronize(cs));
	GU_CK(cudaMemcpy(oa, dout, 4 * qn, cudaMemcpyDeviceToHost));
	for (size_t j = 0; j < qn; j++) {
		uint32_t w;
		memcpy(&w, &oa[j], 4);
		cr_assert_eq(w, 0x5a5a5a5au, "refused attend wrote output %zu", j);
	}
	cr_assert_eq(mkv_seq_attend(s, 0, q, oa, cs), 0);
	cr_assert_eq(mkv_seq_attend(s, 0, q, ob, NULL), 0);
	cr_assert(memcmp(oa, ob, 4 * qn) == 0, "seed %llu: refine with a stream differs",
		  (unsigned long long)seed);
	struct mkv_seq_stats ss = {.size = sizeof ss};
	cr_assert_eq(mkv_seq_get_stats(s, &ss), 0);
	cr_assert_eq(ss.device_attends, 0, "refine must not reach the device path");
	GU_CK(cudaStreamDestroy(cs));
	GU_CK(cudaFree(dq));
	GU_CK(cudaFree(dout));
	free(q);
	free(oa);
	free(ob);
	cr_assert_eq(mkv_seq_close(s), 0);
	mkv_store_destroy(st);
	data_free(&t);
}
