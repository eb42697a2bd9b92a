/* SPDX-License-Identifier: MIT */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include "gpu_util.h"

static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t gu_seed(void)
{
	/* a failure's seed, to run it again (tests only: the library reads no
	 * environment) */
	const char *fix = getenv("MKV_TEST_SEED");
	if (fix && *fix)
		return strtoull(fix, NULL, 10);
	static uint64_t ctr;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
		     ((uint64_t)getpid() << 40) ^ ++ctr;
	return splitmix(&s);
}

void gu_rng_init(struct gu_rng *g, uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		g->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t next(struct gu_rng *g)
{
	uint64_t *s = g->s;
	uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return r;
}

double gu_uniform(struct gu_rng *g)
{
	return (double)(next(g) >> 11) * 0x1p-53;
}

double gu_normal(struct gu_rng *g)
{
	double u = gu_uniform(g), v = gu_uniform(g);
	if (u < 1e-300)
		u = 1e-300;
	return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

uint32_t gu_below(struct gu_rng *g, uint32_t n)
{
	return (uint32_t)(gu_uniform(g) * n);
}

uint16_t gu_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float gu_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

void gu_fill_kv(struct gu_rng *g, uint16_t *out, size_t n, uint32_t d)
{
	double sc[256], off[256];
	for (uint32_t c = 0; c < d; c++) {
		sc[c] = exp(-2.0 * c / d) * (0.5 + gu_uniform(g));
		off[c] = 0.3 * gu_normal(g);
	}
	for (size_t i = 0; i < n; i++)
		for (uint32_t c = 0; c < d; c++)
			out[i * d + c] = gu_bf16((float)(off[c] + sc[c] * gu_normal(g)));
}

void *gu_dev(size_t bytes)
{
	void *p = NULL;
	GU_CK(cudaMalloc(&p, bytes ? bytes : 1));
	return p;
}

void *gu_upload(const void *h, size_t bytes)
{
	void *p = gu_dev(bytes);
	GU_CK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
	/* From pageable memory cudaMemcpy may return before the DMA lands,
	 * and work on a non-blocking stream is not ordered after it */
	GU_CK(cudaDeviceSynchronize());
	return p;
}

void gu_encode_pair(const struct mkv_encode_opts *o, const uint16_t *k, const uint16_t *v,
		    size_t n, struct mkv_segment **ks, struct mkv_segment **vs)
{
	struct mkv_encode_opts e = *o;
	e.kind = MKV_KIND_KEY;
	int rc = mkv_segment_encode(&e, k, MKV_DTYPE_BF16, n, ks);
	cr_assert_eq(rc, 0, "encode K: %s", mkv_strerror(rc));
	e.kind = MKV_KIND_VALUE;
	e.summary_channels = 0;
	rc = mkv_segment_encode(&e, v, MKV_DTYPE_BF16, n, vs);
	cr_assert_eq(rc, 0, "encode V: %s", mkv_strerror(rc));
}

void gu_ctx_build(struct gu_ctx *c, struct gu_rng *g, uint32_t d, uint32_t nseg,
		  const size_t *lens, uint32_t win_n, const struct mkv_encode_opts *o)
{
	gu_ctx_build_quiet(c, g, d, nseg, lens, win_n, o, 0, 0, 1.0f);
}

void gu_ctx_build_quiet(struct gu_ctx *c, struct gu_rng *g, uint32_t d, uint32_t nseg,
			const size_t *lens, uint32_t win_n, const struct mkv_encode_opts *o,
			size_t q0, size_t q1, float f)
{
	memset(c, 0, sizeof *c);
	cr_assert(nseg <= 16);
	c->d = d;
	c->nseg = nseg;
	c->win_n = win_n;
	for (uint32_t s = 0; s < nseg; s++) {
		c->lens[s] = lens[s];
		c->n_hist += lens[s];
	}
	c->ntot = c->n_hist + win_n;
	c->k = malloc(c->ntot * d * 2);
	c->v = malloc(c->ntot * d * 2);
	cr_assert(c->k && c->v);
	gu_fill_kv(g, c->k, c->ntot, d);
	gu_fill_kv(g, c->v, c->ntot, d);
	for (size_t i = q0 * d; i < q1 * d && i < c->ntot * d; i++)
		c->k[i] = gu_bf16(f * gu_f32(c->k[i]));
	size_t off = 0;
	for (uint32_t s = 0; s < nseg; s++) {
		struct mkv_encode_opts e = *o;
		e.d = d;
		gu_encode_pair(&e, c->k + off * d, c->v + off * d, lens[s], &c->ks[s], &c->vs[s]);
		struct mkv_packed_view kv, vv;
		cr_assert_eq(mkv_segment_view(c->ks[s], &kv), 0);
		cr_assert_eq(mkv_segment_view(c->vs[s], &vv), 0);
		size_t bytes = gpu_seg_bytes(&kv, &vv);
		cr_assert(bytes > 0);
		c->dev[s] = gu_dev(bytes);
		cr_assert_eq(gpu_seg_upload(&kv, &vv, c->dev[s], &c->segs[s]), 0);
		c->segs[s].block0 = c->n_blocks;
		c->n_blocks += kv.n_blocks;
		off += lens[s];
	}
	c->dsegs = gu_upload(c->segs, sizeof(struct gpu_seg) * (nseg ? nseg : 1));
	if (win_n) {
		c->dwin_k = gu_upload(c->k + c->n_hist * d, (size_t)win_n * d * 2);
		c->dwin_v = gu_upload(c->v + c->n_hist * d, (size_t)win_n * d * 2);
	}
}

void gu_ctx_segs_upload(struct gu_ctx *c)
{
	cudaFree(c->dsegs);
	c->dsegs = gu_upload(c->segs, sizeof(struct gpu_seg) * (c->nseg ? c->nseg : 1));
}

void gu_ctx_positions(struct gu_ctx *c, uint32_t mask)
{
	for (uint32_t s = 0; s < c->nseg; s++) {
		struct gpu_seg *g = &c->segs[s];
		if (!(mask >> s & 1u) || c->pos[s])
			continue;
		size_t kb = (size_t)g->n * GPU_POS_STRIDE(g->k_r);
		size_t vb = (size_t)g->n * GPU_POS_STRIDE(g->v_r);
		uint8_t *p = gu_dev(kb + vb);
		cr_assert_eq(gpu_seg_positions(g->k_bm, g->k_bw, g->k_dk, g->k_r, g->n, p, 0), 0);
		cr_assert_eq(gpu_seg_positions(g->v_bm, g->v_bw, g->v_dk, g->v_r, g->n, p + kb, 0),
			     0);
		c->pos[s] = p;
		g->k_pos = p;
		g->v_pos = p + kb;
	}
	gu_ctx_segs_upload(c);
}

void gu_ctx_schedule(struct gu_ctx *c, uint32_t mask)
{
	for (uint32_t s = 0; s < c->nseg; s++) {
		struct gpu_seg *g = &c->segs[s];
		if (!(mask >> s & 1u) || g->sched)
			continue;
		cr_assert(g->k_pos && g->v_pos, "segment %u has no positions to schedule", s);
		int rc = gpu_seg_schedule(g, c->d, (uint16_t *)g->k_val, (uint16_t *)g->v_val,
					  (uint8_t *)g->k_pos, (uint8_t *)g->v_pos, g, 0);
		cr_assert_eq(rc, 0, "gpu_seg_schedule: %d", rc);
		cr_assert(g->sched > 0);
	}
	GU_CK(cudaDeviceSynchronize());
	gu_ctx_segs_upload(c);
}

void gu_ctx_sum8(struct gu_ctx *c, uint32_t mask)
{
	for (uint32_t s = 0; s < c->nseg; s++) {
		struct gpu_seg *g = &c->segs[s];
		if (!(mask >> s & 1u) || c->s8[s])
			continue;
		size_t rb = ((size_t)g->n_blocks * 2 * g->S + 15) & ~(size_t)15;
		char *p = gu_dev(rb + (size_t)g->n_blocks * sizeof(float));
		cr_assert_eq(gpu_seg_sum8(g->s_min, g->s_max, g->S, g->n_blocks, (int8_t *)p,
					  (float *)(p + rb), 0),
			     0);
		c->s8[s] = p;
		g->s8 = (const int8_t *)p;
		g->s8_scale = (const float *)(p + rb);
	}
	gu_ctx_segs_upload(c);
}

void gu_ctx_free(struct gu_ctx *c)
{
	for (uint32_t s = 0; s < c->nseg; s++) {
		mkv_segment_destroy(c->ks[s]);
		mkv_segment_destroy(c->vs[s]);
		cudaFree(c->dev[s]);
		cudaFree(c->pos[s]);
		cudaFree(c->s8[s]);
	}
	cudaFree(c->dsegs);
	cudaFree(c->dwin_k);
	cudaFree(c->dwin_v);
	free(c->k);
	free(c->v);
}

struct gpu_head gu_ctx_head(const struct gu_ctx *c)
{
	struct gpu_head h;
	memset(&h, 0, sizeof h);
	h.segs = c->dsegs;
	h.buf = NULL;
	h.win_k = c->dwin_k;
	h.win_v = c->dwin_v;
	h.n_hist = c->n_hist;
	h.nseg = c->nseg;
	h.n_blocks = c->n_blocks;
	h.win_n = c->win_n;
	return h;
}

double gu_rel_err(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		double e = (double)a[i] - b[i];
		if (!isfinite(a[i]))
			return INFINITY;
		num += e * e;
		den += (double)b[i] * b[i];
	}
	return den > 0 ? sqrt(num / den) : sqrt(num);
}
