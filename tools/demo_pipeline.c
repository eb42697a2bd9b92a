/* SPDX-License-Identifier: MIT */
/*
 * The demo's second part: the whole decode path through the sequence API.
 * A synthetic context is prefilled layer by layer into a store whose top
 * tier holds only part of the compressed cache, so segments spill; then a
 * few hundred tokens are decoded (append + attend per layer), with the
 * store's workers finalizing decode segments in the background.  Reports
 * memory by tier, attention error against dense, swaps, lag and speed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mosaickv.h>
#include "demo.h"
#include "synth.h"

static double now_s(clockid_t c)
{
	struct timespec t;
	clock_gettime(c, &t);
	return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int fail(const char *what, int err)
{
	fprintf(stderr, "mosaickv-demo: %s: %s\n", what, mkv_strerror(err));
	return 1;
}

static double mib(uint64_t b)
{
	return (double)b / (1024.0 * 1024.0);
}

int run_pipeline(const struct demo_cfg *c)
{
	const uint32_t d = DEMO_D, H = c->heads, L = c->layers, G = DEMO_NQ;
	const uint32_t n0 = c->tokens, T = c->decode, n = n0 + T;
	const size_t dense = (size_t)n0 * H * L * 2 * d * 2; /* bf16 K+V */
	struct synth_kv *kv = calloc(L, sizeof(*kv));
	int ret = 1, rc;
	if (!kv)
		return fail("allocation", -ENOMEM);
	double tg = now_s(CLOCK_MONOTONIC);
	for (uint32_t l = 0; l < L; l++) {
		struct synth_opts so;
		synth_opts_default(&so);
		so.n = n;
		so.d = d;
		so.n_kv = H;
		so.n_q = G;
		so.n_steps = DEMO_NSTEPS;
		so.seed = c->seed + 1000 * (l + 1);
		so.dtype = MKV_DTYPE_BF16;
		if ((rc = synth_generate(&so, &kv[l])))
			return fail("synthetic data", rc);
	}
	tg = now_s(CLOCK_MONOTONIC) - tg;

	/* The top tier holds c->hbm_frac of a ~0.37-of-dense packed cache. */
	struct mkv_store_opts sto;
	mkv_store_opts_init(&sto, sizeof sto);
	sto.gpu = -1;
	sto.hbm_bytes = (size_t)(c->hbm_frac * 0.37 * (double)dense) + ((size_t)1 << 20);
	sto.host_bytes = c->nvme_dir ? sto.hbm_bytes : 2 * dense + ((size_t)64 << 20);
	sto.nvme_dir = c->nvme_dir;
	sto.workers = 2;
	struct mkv_store *st = NULL;
	if ((rc = mkv_store_create(&sto, &st)))
		return fail(c->nvme_dir ? "store (NVMe tier needs io_uring)" : "store", rc);

	struct mkv_seq_opts o;
	mkv_seq_opts_init(&o, sizeof o);
	o.layers = L;
	o.kv_heads = H;
	o.q_per_kv = G;
	o.d = d;
	o.prefill_segment = c->segment < 64 ? 64 : c->segment;
	o.window = DEMO_WIN;
	o.token_frac = c->tokens_frac;
	o.value_bits = c->value_bits;
	o.r = demo_r(c->channels, d, d, c->value_bits);
	o.min_segment = 64;
	o.max_segment = 4096;
	struct mkv_seq *s = NULL;
	if ((rc = mkv_seq_open(st, &o, 1, &s))) {
		fail("sequence", rc);
		goto out;
	}

	/* Prefill: [H][n0][d] per layer (the synthetic rows have stride n). */
	uint16_t *pk = malloc(sizeof(uint16_t) * H * n0 * d);
	uint16_t *pv = malloc(sizeof(uint16_t) * H * n0 * d);
	if (!pk || !pv) {
		free(pk);
		free(pv);
		fail("allocation", -ENOMEM);
		goto out;
	}
	double tp = now_s(CLOCK_MONOTONIC), cp = now_s(CLOCK_PROCESS_CPUTIME_ID);
	for (uint32_t l = 0; l < L && !rc; l++) {
		for (uint32_t h = 0; h < H; h++) {
			memcpy(pk + (size_t)h * n0 * d, synth_k(&kv[l], h), sizeof(uint16_t) * n0 * d);
			memcpy(pv + (size_t)h * n0 * d, synth_v(&kv[l], h), sizeof(uint16_t) * n0 * d);
		}
		rc = mkv_seq_prefill(s, l, pk, pv, MKV_DTYPE_BF16, n0);
	}
	tp = now_s(CLOCK_MONOTONIC) - tp;
	cp = now_s(CLOCK_PROCESS_CPUTIME_ID) - cp;
	free(pk);
	free(pv);
	if (rc) {
		fail("prefill", rc);
		goto out;
	}

	/* Decode: append one token per layer, then attend it. */
	uint16_t *tk = malloc(sizeof(uint16_t) * H * d), *tv = malloc(sizeof(uint16_t) * H * d);
	float *q = malloc(sizeof(float) * H * G * d), *outp = malloc(sizeof(float) * H * G * d);
	float *ref = malloc(sizeof(float) * G * d);
	if (!tk || !tv || !q || !outp || !ref) {
		fail("allocation", -ENOMEM);
		goto dec_out;
	}
	double t_app = 0, t_att = 0, td = now_s(CLOCK_MONOTONIC);
	double cd = now_s(CLOCK_PROCESS_CPUTIME_ID);
	for (uint32_t t = 0; t < T && !rc; t++) {
		for (uint32_t l = 0; l < L && !rc; l++) {
			for (uint32_t h = 0; h < H; h++) {
				memcpy(tk + h * d, (const uint16_t *)synth_k(&kv[l], h) + (size_t)(n0 + t) * d,
				       sizeof(uint16_t) * d);
				memcpy(tv + h * d, (const uint16_t *)synth_v(&kv[l], h) + (size_t)(n0 + t) * d,
				       sizeof(uint16_t) * d);
				memcpy(q + (size_t)h * G * d, synth_q(&kv[l], h, t % DEMO_NSTEPS),
				       sizeof(float) * G * d);
			}
			double a = now_s(CLOCK_MONOTONIC);
			rc = mkv_seq_append(&s, 1, l, tk, tv, MKV_DTYPE_BF16);
			double b = now_s(CLOCK_MONOTONIC);
			if (!rc)
				rc = mkv_seq_attend(s, l, q, outp, NULL);
			t_app += b - a;
			t_att += now_s(CLOCK_MONOTONIC) - b;
		}
	}
	td = now_s(CLOCK_MONOTONIC) - td;
	cd = now_s(CLOCK_PROCESS_CPUTIME_ID) - cd;
	if (rc) {
		fail("decode", rc);
		goto dec_out;
	}
	struct mkv_seq_stats ss = {.size = sizeof ss};
	mkv_seq_get_stats(s, &ss);

	/* Error against dense attention over every token, with the
	 * generator's queries (they sit right after the context). */
	double err = 0;
	uint32_t cnt = 0;
	struct mkv_attn_opts ao;
	mkv_attn_opts_init(&ao, sizeof ao);
	ao.n_q = G;
	ao.d = d;
	for (uint32_t l = 0; l < L && !rc; l++)
		for (uint32_t stp = 0; stp < DEMO_NSTEPS && !rc; stp++) {
			for (uint32_t h = 0; h < H; h++)
				memcpy(q + (size_t)h * G * d, synth_q(&kv[l], h, stp), sizeof(float) * G * d);
			if ((rc = mkv_seq_attend(s, l, q, outp, NULL)))
				break;
			for (uint32_t h = 0; h < H && !rc; h++) {
				struct mkv_dense_kv all = {synth_k(&kv[l], h), synth_v(&kv[l], h),
							   MKV_DTYPE_BF16, n};
				if ((rc = mkv_attend_dense(&ao, synth_q(&kv[l], h, stp), &all, ref)))
					break;
				for (uint32_t qh = 0; qh < G; qh++) {
					double e = 0, r = 0;
					for (uint32_t x = 0; x < d; x++) {
						double dv = outp[((size_t)h * G + qh) * d + x] - ref[qh * d + x];
						e += dv * dv;
						r += (double)ref[qh * d + x] * ref[qh * d + x];
					}
					err += sqrt(e / r);
					cnt++;
				}
			}
		}
	if (rc) {
		fail("attention check", rc);
		goto dec_out;
	}
	mkv_seq_sync(s);
	struct mkv_store_stats sst = {.size = sizeof sst};
	mkv_store_get_stats(st, &sst);
	uint64_t used = 0;
	for (int t = 0; t < MKV_TIER_COUNT; t++)
		used += sst.tier[t].used;

	printf("\npipeline  %u layers x %u KV heads through mkv_seq_*: prefill %u tokens, decode %u; "
	       "r=%u of %u (%u-bit values), %.0f%% of tokens, store workers finalize decode segments\n",
	       L, H, n0, T, o.r, d, o.value_bits ? o.value_bits : 16, 100 * c->tokens_frac);
	printf("memory    dense bf16 %.1f MiB -> store %.1f MiB (%.3f of dense)\n",
	       mib(dense), mib(used), (double)used / (double)dense);
	static const char *tn[MKV_TIER_COUNT] = {"top (HBM role)", "pinned host", "NVMe"};
	for (int t = 0; t < MKV_TIER_COUNT; t++)
		if (sst.tier[t].present)
			printf("          %-15s %8.1f MiB of %8.1f MiB budget, %llu segments\n", tn[t],
			       mib(sst.tier[t].used), mib(sst.tier[t].capacity),
			       (unsigned long long)sst.tier[t].segments);
	printf("accuracy  attention error vs dense over all %u tokens: %.4f (mean of %u query heads)\n",
	       n, err / cnt, cnt);
	printf("pipeline  swaps %llu, finalization failures %llu, lag now %llu tokens "
	       "(max %.1f MiB raw), %llu finalized by back-pressure\n",
	       (unsigned long long)ss.swaps, (unsigned long long)ss.finalize_failed,
	       (unsigned long long)ss.lag_tokens, mib(ss.max_lag_bytes),
	       (unsigned long long)ss.sync_finalized);
	printf("          selected blocks read from below the top tier: %.1f MiB over the decode (%.1f KiB per step and layer)\n",
	       mib(ss.fetch_bytes_total), (double)ss.fetch_bytes_total / 1024.0 / (T * L));
	printf("speed     prefill %.0f tokens/s per layer (%.1f s wall, %.1f s CPU incl. strategy choice)\n",
	       (double)n0 * L / tp, tp, cp);
	printf("          decode %.2f ms per token (%u layers): append %.0f us and attend %.0f us per layer "
	       "(CPU reference), %.1f s CPU\n",
	       1e3 * td / T, L, 1e6 * t_app / (T * L), 1e6 * t_att / (T * L), cd);
	printf("          (synthetic data generated in %.1f s)\n", tg);
	ret = 0;
dec_out:
	free(tk);
	free(tv);
	free(q);
	free(outp);
	free(ref);
out:
	if (s && (rc = mkv_seq_close(s)))
		ret = fail("close", rc);
	mkv_store_destroy(st);
	for (uint32_t l = 0; l < L; l++)
		synth_free(&kv[l]);
	free(kv);
	return ret;
}
