/* SPDX-License-Identifier: MIT */
/*
 * mosaickv-demo — compress a synthetic long-context KV cache with MosaicKV
 * and print what it buys: memory, attention error against dense (and
 * against Quest at the same token budget), and speed on this CPU.
 *
 * Uses only the installed API (<mosaickv.h>) and tools/synth.h.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mosaickv.h>
#include "demo.h"
#include "synth.h"

#define D DEMO_D
#define WIN DEMO_WIN
#define NQ DEMO_NQ
#define NSTEPS DEMO_NSTEPS

static void usage(FILE *f)
{
	fprintf(f,
		"usage: mosaickv-demo [options]\n"
		"Compress a synthetic long-context KV cache (d=%d, %d query heads per KV\n"
		"head, LLM-like statistics: tools/synth.h) and report memory, attention\n"
		"error against dense and Quest, and speed (one CPU thread).\n\n"
		"  --tokens N        context tokens per KV head, the last %d kept dense\n"
		"                    (default 65536)\n"
		"  --segment N       tokens per compressed segment, 16..65536 (default 4096)\n"
		"  --heads N         KV heads (default 4)\n"
		"  --channels F      per vector the bytes of this share of the channels in\n"
		"                    bf16, (0, 1] (default 0.25); up to 0.75 the 25%%\n"
		"                    lowest-variance channels are dropped\n"
		"  --value-bits W    kept values as W-bit integers with a scale per vector,\n"
		"                    4..8, or 0 for bf16 (default 6, the library's)\n"
		"  --tokens-frac F   share of history tokens attended, (0, 1] (default 0.1)\n"
		"  --seed S          synthetic data seed (default 1)\n"
		"Then the whole decode path through the sequence API and a store:\n"
		"  --layers N        layers (default 2)\n"
		"  --decode N        tokens decoded after the prefill (default 256; 0 skips)\n"
		"  --hbm-frac F      share of the compressed cache the top tier holds, so the\n"
		"                    rest spills (default 0.25)\n"
		"  --nvme DIR        add an NVMe tier in DIR (io_uring); the host tier is then\n"
		"                    as small as the top one, so segments reach the disk\n"
		"  -h, --help        this text\n",
		D, NQ, WIN);
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int parse_frac(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !(v > 0.0 && v <= 1.0))
		return -1;
	*out = v;
	return 0;
}

static double now(clockid_t c)
{
	struct timespec t;
	clock_gettime(c, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int fail(const char *what, int err)
{
	fprintf(stderr, "mosaickv-demo: %s: %s\n", what, mkv_strerror(err));
	return 1;
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

static void bytes_add(struct mkv_segment_bytes *a,
		      const struct mkv_segment_bytes *b)
{
	a->values += b->values;
	a->bitmaps += b->bitmaps;
	a->rotation += b->rotation;
	a->summaries += b->summaries;
	a->total += b->total;
	a->dense += b->dense;
}

static int run(const struct demo_cfg *c)
{
	const uint32_t hist = c->tokens - WIN;
	const uint32_t nseg = (hist + c->segment - 1) / c->segment;
	const uint32_t drop = c->channels <= 0.75 ? 1 : 0;
	const uint32_t r = demo_r(c->channels, D, drop ? D - D / 4 : D, c->value_bits);
	struct synth_opts so;
	synth_opts_default(&so);
	so.n = c->tokens;
	so.d = D;
	so.n_kv = c->heads;
	so.n_q = NQ;
	so.n_steps = NSTEPS;
	so.seed = c->seed;
	so.dtype = MKV_DTYPE_BF16;

	/* Refuse what cannot fit rather than let overcommit end in the OOM
	 * killer: dense K+V (bf16), packed copies and the generator's rows. */
	double need = (double)c->heads * c->tokens * D * 2 * 2 * 1.5 +
		      (double)c->tokens * D * 4 * 2;
	double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
	if (have > 0 && need > 0.8 * have) {
		fprintf(stderr, "mosaickv-demo: %u tokens x %u heads needs ~%.1f GiB, more "
			"than this machine's memory allows\n",
			c->tokens, c->heads, need / (1 << 30));
		return 1;
	}
	printf("mosaickv %s demo: %u tokens x %u KV heads (%u query heads each), d=%d, "
	       "synthetic LLM-like KV (seed %llu)\n",
	       mkv_version(), c->tokens, c->heads, NQ, D, (unsigned long long)c->seed);
	printf("  %u segments of up to %u tokens + %d dense recent tokens; keep %u of %d "
	       "channels per vector as %s%s; attend %.0f%% of tokens\n",
	       nseg, c->segment, WIN, r, D,
	       c->value_bits ? (c->value_bits == 6 ? "6-bit integers" : "quantized integers")
			     : "bf16",
	       drop ? " (lowest-variance 25% dropped)" : "", 100 * c->tokens_frac);

	struct synth_kv kv;
	double t0 = now(CLOCK_MONOTONIC);
	int err = synth_generate(&so, &kv);
	if (err)
		return fail("generating data", err);
	double tgen = now(CLOCK_MONOTONIC) - t0;

	int ret = 1;
	const size_t nsegs = (size_t)c->heads * nseg;
	struct mkv_segment **ks = calloc(nsegs, sizeof *ks);
	struct mkv_segment **vs = calloc(nsegs, sizeof *vs);
	float *ref = malloc(sizeof(float) * NQ * D);
	float *out = malloc(sizeof(float) * NQ * D);
	if (!ks || !vs || !ref || !out) {
		fail("allocating", -ENOMEM);
		goto done;
	}

	/* Encode K and V of every head, segment by segment. */
	struct mkv_encode_opts ok, ov;
	if ((err = mkv_encode_opts_init(&ok, sizeof ok)) ||
	    (err = mkv_encode_opts_init(&ov, sizeof ov))) {
		fail("mkv_encode_opts_init", err);
		goto done;
	}
	ok.d = ov.d = D;
	ok.r = ov.r = r;
	ok.g = ov.g = 1;
	ok.b = ov.b = 16;
	ok.drop = ov.drop = drop;
	ok.value_bits = ov.value_bits = c->value_bits;
	ok.summary_channels = r < D / 4 ? r : D / 4; /* the sequence's default S */
	ok.kind = MKV_KIND_KEY;
	ov.kind = MKV_KIND_VALUE;
	struct mkv_segment_bytes kb = { 0 }, vb = { 0 };
	double cpu_enc = 0;
	for (uint32_t h = 0; h < c->heads; h++) {
		const char *kp = synth_k(&kv, h), *vp = synth_v(&kv, h);
		for (uint32_t s = 0; s < nseg; s++) {
			size_t first = (size_t)s * c->segment;
			size_t n = hist - first < c->segment ? hist - first : c->segment;
			size_t i = (size_t)h * nseg + s;
			struct mkv_segment_bytes b;
			double c0 = now(CLOCK_PROCESS_CPUTIME_ID);
			err = mkv_segment_encode(&ok, kp + first * D * 2, MKV_DTYPE_BF16,
						 n, &ks[i]);
			if (!err)
				err = mkv_segment_encode(&ov, vp + first * D * 2,
							 MKV_DTYPE_BF16, n, &vs[i]);
			cpu_enc += now(CLOCK_PROCESS_CPUTIME_ID) - c0;
			if (err) {
				fail("mkv_segment_encode", err);
				goto done;
			}
			if ((err = mkv_segment_bytes(ks[i], &b))) {
				fail("mkv_segment_bytes", err);
				goto done;
			}
			bytes_add(&kb, &b);
			if ((err = mkv_segment_bytes(vs[i], &b))) {
				fail("mkv_segment_bytes", err);
				goto done;
			}
			bytes_add(&vb, &b);
		}
	}

	/* Attention: dense, Quest and packed for every decode query. */
	struct mkv_attn_opts ao;
	if ((err = mkv_attn_opts_init(&ao, sizeof ao))) {
		fail("mkv_attn_opts_init", err);
		goto done;
	}
	ao.n_q = NQ;
	ao.d = D;
	ao.token_frac = c->tokens_frac;
	ao.quest_b = 16;
	double e_pk = 0, e_qu = 0, t_de = 0, t_qu = 0, t_pk = 0;
	size_t att = 0;
	for (uint32_t h = 0; h < c->heads; h++) {
		const char *kp = synth_k(&kv, h), *vp = synth_v(&kv, h);
		struct mkv_dense_kv all = { .k = kp, .v = vp, .dtype = MKV_DTYPE_BF16,
					    .n = c->tokens };
		struct mkv_dense_kv hk = { .k = kp, .v = vp, .dtype = MKV_DTYPE_BF16,
					   .n = hist };
		struct mkv_dense_kv win = { .k = kp + (size_t)hist * D * 2,
					    .v = vp + (size_t)hist * D * 2,
					    .dtype = MKV_DTYPE_BF16, .n = WIN };
		const struct mkv_segment *const *kh =
			(const struct mkv_segment *const *)ks + (size_t)h * nseg;
		const struct mkv_segment *const *vh =
			(const struct mkv_segment *const *)vs + (size_t)h * nseg;
		for (uint32_t s = 0; s < NSTEPS; s++) {
			const float *q = synth_q(&kv, h, s);
			struct mkv_attn_stats st;
			double a = now(CLOCK_PROCESS_CPUTIME_ID);
			if ((err = mkv_attend_dense(&ao, q, &all, ref))) {
				fail("mkv_attend_dense", err);
				goto done;
			}
			double b = now(CLOCK_PROCESS_CPUTIME_ID);
			if ((err = mkv_attend_quest(&ao, q, &hk, &win, out, NULL))) {
				fail("mkv_attend_quest", err);
				goto done;
			}
			double cq = now(CLOCK_PROCESS_CPUTIME_ID);
			for (uint32_t g = 0; g < NQ; g++)
				e_qu += rel_err(out + g * D, ref + g * D);
			if ((err = mkv_attend_packed(&ao, q, kh, vh, nseg, &win, out, &st))) {
				fail("mkv_attend_packed", err);
				goto done;
			}
			double e = now(CLOCK_PROCESS_CPUTIME_ID);
			for (uint32_t g = 0; g < NQ; g++)
				e_pk += rel_err(out + g * D, ref + g * D);
			att += st.tokens_attended;
			t_de += b - a;
			t_qu += cq - b;
			t_pk += e - cq;
		}
	}
	const double nsteps = (double)c->heads * NSTEPS, nqh = nsteps * NQ;
	const double tok = (double)c->heads * hist, mib = 1024.0 * 1024.0;
	const double dense = (double)(kb.dense + vb.dense);
	const double packed = (double)(kb.total + vb.total);

	printf("\nmemory    history K+V  dense bf16 %.1f MiB -> packed %.1f MiB: %.3f of dense "
	       "(%.2fx %s)\n",
	       dense / mib, packed / mib, packed / dense,
	       dense >= packed ? dense / packed : packed / dense,
	       dense >= packed ? "smaller" : "LARGER");
	printf("          per token and KV head: values %.1f B + bitmaps %.1f B + rotations "
	       "%.1f B + block summaries %.1f B = %.1f B (dense %.0f B)\n",
	       (kb.values + vb.values) / tok, (kb.bitmaps + vb.bitmaps) / tok,
	       (kb.rotation + vb.rotation) / tok, (kb.summaries + vb.summaries) / tok,
	       packed / tok, dense / tok);
	printf("accuracy  attention output relative error vs dense, mean of %.0f query heads:\n"
	       "          mosaickv %.4f   quest %.4f (dense K/V, same budget; %.1f%% of "
	       "tokens attended)\n",
	       nqh, e_pk / nqh, e_qu / nqh, 100.0 * att / nsteps / c->tokens);
	printf("speed     encode %.2fM vectors/s per core (K and V, bf16 in, incl. "
	       "eigen-decomposition)\n",
	       2.0 * tok / cpu_enc / 1e6);
	printf("          attention per decode step and KV head (%d query heads, %u tokens, "
	       "CPU reference, CPU time):\n"
	       "          dense %.0f us   quest %.0f us (rebuilds its block bounds per call)"
	       "   mosaickv %.0f us\n",
	       NQ, c->tokens, t_de * 1e6 / nsteps, t_qu * 1e6 / nsteps,
	       t_pk * 1e6 / nsteps);
	printf("          (synthetic data generated in %.1f s)\n", tgen);
	ret = 0;
done:
	if (ks)
		for (size_t i = 0; i < nsegs; i++)
			mkv_segment_destroy(ks[i]);
	if (vs)
		for (size_t i = 0; i < nsegs; i++)
			mkv_segment_destroy(vs[i]);
	free(ks);
	free(vs);
	free(ref);
	free(out);
	synth_free(&kv);
	return ret;
}

int main(int argc, char **argv)
{
	struct demo_cfg c = {
		.tokens = 65536, .segment = 4096, .heads = 4,
		.channels = 0.25, .tokens_frac = 0.1, .seed = 1, .value_bits = 6,
		.layers = 2, .decode = 256, .hbm_frac = 0.25, .nvme_dir = NULL,
	};
	static const struct option lo[] = {
		{ "tokens", required_argument, NULL, 't' },
		{ "segment", required_argument, NULL, 's' },
		{ "heads", required_argument, NULL, 'H' },
		{ "channels", required_argument, NULL, 'c' },
		{ "tokens-frac", required_argument, NULL, 'f' },
		{ "value-bits", required_argument, NULL, 'B' },
		{ "seed", required_argument, NULL, 'S' },
		{ "layers", required_argument, NULL, 'L' },
		{ "decode", required_argument, NULL, 'T' },
		{ "hbm-frac", required_argument, NULL, 'F' },
		{ "nvme", required_argument, NULL, 'N' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	/* One BLAS thread: speeds are per core.  OpenBLAS reads its
	 * environment at load time, hence the re-exec (before getopt
	 * permutes argv). */
	if (!getenv("OPENBLAS_NUM_THREADS")) {
		setenv("OPENBLAS_NUM_THREADS", "1", 1);
		execv("/proc/self/exe", argv);
	}
	int ch;
	while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		int bad = 0;
		char *end;
		switch (ch) {
		case 't':
			bad = parse_u32(optarg, 2 * WIN, 1u << 24, &c.tokens);
			break;
		case 's':
			bad = parse_u32(optarg, 16, MKV_MAX_N, &c.segment);
			break;
		case 'H':
			bad = parse_u32(optarg, 1, 1024, &c.heads);
			break;
		case 'c':
			bad = parse_frac(optarg, &c.channels);
			break;
		case 'f':
			bad = parse_frac(optarg, &c.tokens_frac);
			break;
		case 'B':
			bad = parse_u32(optarg, 0, 8, &c.value_bits) ||
			      (c.value_bits && c.value_bits < 4);
			break;
		case 'S':
			errno = 0;
			c.seed = strtoull(optarg, &end, 0);
			bad = errno || end == optarg || *end;
			break;
		case 'L':
			bad = parse_u32(optarg, 1, 64, &c.layers);
			break;
		case 'T':
			bad = parse_u32(optarg, 0, 1u << 20, &c.decode);
			break;
		case 'F':
			bad = parse_frac(optarg, &c.hbm_frac);
			break;
		case 'N':
			c.nvme_dir = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
		if (bad) {
			fprintf(stderr, "mosaickv-demo: bad value '%s' for --%s\n", optarg,
				lo[ch == 't' ? 0 : ch == 's' ? 1 : ch == 'H' ? 2 :
				   ch == 'c' ? 3 : ch == 'f' ? 4 : ch == 'S' ? 5 :
				   ch == 'L' ? 6 : ch == 'T' ? 7 : 8].name);
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "mosaickv-demo: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	int ret = run(&c);
	if (ret == 0 && c.decode)
		ret = run_pipeline(&c);
	return ret;
}
