/* SPDX-License-Identifier: MIT */
/*
 * GPU compression against mkv_segment_encode: the update-buffer append
 * (rotate with the current segment's rotation, per-vector top-r, pack,
 * extend summaries; two appends so that a block is completed across
 * calls), attention over a buffer with no gap, and prefill encoding
 * (cuBLAS covariance, cuSOLVER eigenvectors, packing).  Fresh random
 * inputs every run; skips without a usable GPU.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "gpu_util.h"
#include "../core/projection.h"

static void enc_opts(struct mkv_encode_opts *o, uint32_t d, uint32_t r, uint32_t g,
		     uint32_t b, uint32_t drop)
{
	cr_assert_eq(mkv_encode_opts_init(o, sizeof *o), 0);
	o->d = d;
	o->r = r;
	o->g = g;
	o->b = b;
	o->drop = drop;
	o->store_dtype = MKV_DTYPE_BF16;
}

static void *fetch(const void *dev, size_t bytes)
{
	void *h = malloc(bytes ? bytes : 1);
	cr_assert(h);
	GU_CK(cudaMemcpy(h, dev, bytes, cudaMemcpyDeviceToHost));
	return h;
}

static bool close_ulp(float a, float b)
{
	return fabsf(a - b) <= 0x1p-7f * fabsf(b) + 1e-6f;
}

/* One bf16 ulp, or 3e-5 of @scale (the vector's or block's size): the
 * device projects by x Rᵀ + x Cᵀ with C and x Cᵀ in bf16, x Pᵀ to ~1e-5
 * |x| (pack.cu), which a small coefficient kept beside a large one in its
 * group (g > 1), or a small summary bound, feels in full. */
static bool close_rel(float a, float b, float scale)
{
	return fabsf(a - b) <= 0x1p-7f * fabsf(b) + 1e-6f + 3e-5f * scale;
}

/* Field k of a quantized row, as the integer it stores. */
static int qfield(const uint8_t *row, uint32_t k, uint32_t w)
{
	uint32_t bit = 16 + k * w, u = row[bit >> 3] | (uint32_t)row[(bit >> 3) + 1] << 8;
	return (int)((u >> (bit & 7)) & ((1u << w) - 1)) - (1 << (w - 1));
}

/*
 * Compare one packed half on the device (rows of rs 16-bit units, bitmaps
 * n × bw words, summaries nb × S and remainder bounds nb, or none) with
 * the CPU's view.  Vectors whose top-r set differs (near-ties under a
 * different summation order) are counted, and must be rare; the rest must
 * agree within one bf16 ulp or 3e-5 of the row's norm (bf16 rows;
 * close_rel), or (quantized rows) scales within
 * one ulp and every value within one quantization step, equal fields for
 * all but a rare few (rounding ties), padding zero.  Summaries: within one
 * ulp or 3e-5 of the norm of the block's bounds.  Remainder bounds:
 * within one ulp, or a small part of the block's largest bound (the
 * difference of two sums cancels).
 */
static void compare_half(const char *what, uint64_t seed, const struct mkv_packed_view *cv,
			 const uint16_t *dval, const uint32_t *dbm, uint32_t rs, uint32_t bw,
			 const uint16_t *dmin, const uint16_t *dmax, const uint16_t *drest)
{
	size_t n = cv->n;
	uint16_t *val = fetch(dval, n * rs * 2);
	uint32_t *bm = fetch(dbm, n * bw * 4);
	const uint8_t *cval = cv->values;
	uint32_t w = cv->value_bits, rb = cv->row_bytes;
	size_t diff = 0, fdiff = 0, fields = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t g8[16] = {0};
		memcpy(g8, bm + i * bw, bw * 4);
		if (memcmp(g8, cv->bitmaps + i * cv->bitmap_bytes, cv->bitmap_bytes)) {
			diff++;
			continue;
		}
		const uint8_t *grow = (const uint8_t *)(val + i * rs), *crow = cval + i * rb;
		if (w) {
			uint16_t gs, cs;
			memcpy(&gs, grow, 2);
			memcpy(&cs, crow, 2);
			float gsf = gu_f32(gs), csf = gu_f32(cs), step = fmaxf(gsf, csf);
			cr_assert(close_ulp(gsf, csf), "seed %llu %s vector %zu: scale gpu %g cpu %g",
				  (unsigned long long)seed, what, i, gsf, csf);
			for (uint32_t k = 0; k < cv->r; k++) {
				int gq = qfield(grow, k, w), cq = qfield(crow, k, w);
				float gv = (float)gq * gsf, cvv = (float)cq * csf;
				cr_assert(fabsf(gv - cvv) <= step * 1.001f,
					  "seed %llu %s vector %zu field %u: gpu %d×%g cpu %d×%g",
					  (unsigned long long)seed, what, i, k, gq, gsf, cq, csf);
				fdiff += gq != cq;
				fields++;
			}
			/* past the last field: zero, up to the device row's end */
			uint32_t used = 2 + (cv->r * w + 7) / 8;
			for (uint32_t bit = 16 + cv->r * w; bit < used * 8; bit++)
				cr_assert(!(grow[bit >> 3] >> (bit & 7) & 1), "%s: padding bit", what);
			for (uint32_t by = used; by < rs * 2; by++)
				cr_assert_eq(grow[by], 0, "%s vector %zu: padding byte %u", what, i, by);
			continue;
		}
		const uint16_t *gv = val + i * rs, *cv16 = (const uint16_t *)crow;
		float nrm = 0.0f;
		for (uint32_t k = 0; k < cv->r; k++)
			nrm += gu_f32(cv16[k]) * gu_f32(cv16[k]);
		nrm = sqrtf(nrm);
		for (uint32_t k = 0; k < cv->r; k++)
			cr_assert(close_rel(gu_f32(gv[k]), gu_f32(cv16[k]), nrm),
				  "seed %llu %s vector %zu slot %u: gpu %g cpu %g",
				  (unsigned long long)seed, what, i, k, gu_f32(gv[k]),
				  gu_f32(cv16[k]));
		for (uint32_t k = cv->r; k < rs; k++)
			cr_assert_eq(gv[k], 0);
	}
	cr_assert(diff <= n / 100 + 1, "seed %llu %s: %zu of %zu bitmaps differ",
		  (unsigned long long)seed, what, diff, n);
	cr_assert(fdiff <= fields / 100 + 1, "seed %llu %s: %zu of %zu fields differ",
		  (unsigned long long)seed, what, fdiff, fields);
	if (dmin) {
		size_t m = (size_t)cv->n_blocks * cv->summary_channels;
		uint16_t *mn = fetch(dmin, m * 2), *mx = fetch(dmax, m * 2);
		const uint16_t *cmn = cv->sum_min, *cmx = cv->sum_max;
		uint32_t S = cv->summary_channels;
		float nrm = 0.0f;
		for (size_t i = 0; i < m; i++) {
			if (i % S == 0) { /* the block's size: its bounds' norm */
				nrm = 0.0f;
				for (uint32_t c = 0; c < S; c++) {
					float a = fmaxf(fabsf(gu_f32(cmn[i + c])), fabsf(gu_f32(cmx[i + c])));
					nrm += a * a;
				}
				nrm = sqrtf(nrm);
			}
			cr_assert(close_rel(gu_f32(mn[i]), gu_f32(cmn[i]), nrm) &&
					  close_rel(gu_f32(mx[i]), gu_f32(cmx[i]), nrm),
				  "seed %llu %s summary %zu: gpu [%g, %g] cpu [%g, %g]",
				  (unsigned long long)seed, what, i, gu_f32(mn[i]), gu_f32(mx[i]),
				  gu_f32(cmn[i]), gu_f32(cmx[i]));
			cr_assert(gu_f32(mn[i]) <= gu_f32(mx[i]));
		}
		free(mn);
		free(mx);
	}
	if (drest) {
		size_t m = cv->n_blocks;
		uint16_t *re = fetch(drest, m * 2);
		const uint16_t *cre = cv->sum_rest;
		float top = 0.0f;
		for (size_t i = 0; i < m; i++)
			top = fmaxf(top, gu_f32(cre[i]));
		cr_assert(top > 0.0f, "%s: no remainder at all", what);
		for (size_t i = 0; i < m; i++)
			cr_assert(close_ulp(gu_f32(re[i]), gu_f32(cre[i])) ||
					  fabsf(gu_f32(re[i]) - gu_f32(cre[i])) <= 2e-3f * top,
				  "seed %llu %s remainder bound %zu: gpu %g cpu %g (largest %g)",
				  (unsigned long long)seed, what, i, gu_f32(re[i]), gu_f32(cre[i]),
				  top);
		free(re);
	}
	free(val);
	free(bm);
}

/* The encoder's projection of @s's rotation (th_projection, in double),
 * as floats: what a growable segment holds in proj_f32. */
static float *proj_of(const struct mkv_segment *s)
{
	struct mkv_packed_view v;
	cr_assert_eq(mkv_segment_view(s, &v), 0);
	size_t m = (size_t)v.d_keep * v.d;
	float *Rf = malloc(m * sizeof *Rf), *P = malloc(m * sizeof *P);
	double *R = malloc(m * sizeof *R), *Pd = malloc(m * sizeof *Pd);
	cr_assert(Rf && P && R && Pd);
	cr_assert_eq(mkv_segment_rotation(s, Rf), 0);
	for (size_t i = 0; i < m; i++)
		R[i] = Rf[i];
	th_projection(R, v.d_keep, v.d, Pd);
	for (size_t i = 0; i < m; i++)
		P[i] = (float)Pd[i];
	free(Rf);
	free(R);
	free(Pd);
	return P;
}

/* A device update buffer of capacity @cap with the rotations (and value
 * bits) of @ks/@vs and the corrections of their projections:
 * gpu_seg_image_proj of an empty pair, as seqgpu.c makes it. */
struct dbuf {
	struct gpu_seg seg; /* host copy of the descriptor */
	struct gpu_seg *dseg;
	uint32_t *dcap;
	void *mem;
	uint8_t *pos; /* value positions (dbuf_init_pos), or NULL */
};

static void dbuf_init_pos(struct dbuf *b, const struct mkv_segment *ks,
			  const struct mkv_segment *vs, uint32_t cap, bool pos)
{
	struct mkv_packed_view kv, vv;
	cr_assert_eq(mkv_segment_view(ks, &kv), 0);
	cr_assert_eq(mkv_segment_view(vs, &vv), 0);
	memset(b, 0, sizeof *b);
	kv.n = vv.n = 0;
	kv.n_blocks = vv.n_blocks = 0;
	size_t bytes = gpu_seg_cap_bytes(&kv, &vv, cap);
	cr_assert(bytes > 0);
	b->mem = gu_dev(bytes);
	void *img = malloc(bytes);
	float *kP = proj_of(ks), *vP = proj_of(vs);
	cr_assert_eq(gpu_seg_image_proj(&kv, &vv, kP, vP, cap, img, b->mem, &b->seg), 0);
	cr_assert_eq(b->seg.rot_dl, kv.d * kv.d);
	free(kP);
	free(vP);
	/* poison the image's empty rows: the append must write whole rows */
	memset((char *)img + ((const char *)b->seg.k_val - (const char *)b->mem), 0x5a,
	       (size_t)cap * b->seg.k_rs * 2);
	GU_CK(cudaMemcpy(b->mem, img, bytes, cudaMemcpyHostToDevice));
	free(img);
	cr_assert_eq(b->seg.n, 0);
	cr_assert_eq(b->seg.k_vb, kv.value_bits);
	if (pos) {
		/* poisoned too: every appended row's positions must be written */
		size_t kb = (size_t)cap * GPU_POS_STRIDE(b->seg.k_r);
		size_t vb = (size_t)cap * GPU_POS_STRIDE(b->seg.v_r);
		b->pos = gu_dev(kb + vb);
		GU_CK(cudaMemset(b->pos, 0xa5, kb + vb));
		b->seg.k_pos = b->pos;
		b->seg.v_pos = b->pos + kb;
	}
	b->dseg = gu_upload(&b->seg, sizeof b->seg);
	b->dcap = gu_upload(&cap, 4);
}

static void dbuf_init(struct dbuf *b, const struct mkv_segment *ks,
		      const struct mkv_segment *vs, uint32_t cap)
{
	dbuf_init_pos(b, ks, vs, cap, false);
}

static void dbuf_free(struct dbuf *b)
{
	cudaFree(b->pos);
	cudaFree(b->mem);
	cudaFree(b->dseg);
	cudaFree(b->dcap);
}

/* Append @n tokens (K and V, bf16 host) to one buffer. */
static void append(struct dbuf *b, const uint16_t *k, const uint16_t *v, uint32_t n, uint32_t d,
		   uint32_t *overflow_dev)
{
	struct gpu_append_args a;
	memset(&a, 0, sizeof a);
	a.n_buf = 1;
	a.n_new = n;
	a.d = d;
	a.bufs = b->dseg;
	a.cap = b->dcap;
	a.k_new = gu_upload(k, (size_t)n * d * 2);
	a.v_new = gu_upload(v, (size_t)n * d * 2);
	a.overflow = overflow_dev;
	a.ws_bytes = gpu_append_ws_bytes(1, n);
	a.ws = gu_dev(a.ws_bytes);
	cr_assert_eq(gpu_append(&a, 0), 0);
	GU_CK(cudaDeviceSynchronize());
	cudaFree((void *)a.k_new);
	cudaFree((void *)a.v_new);
	cudaFree(a.ws);
}

/* CPU reference of a buffer: the same tokens encoded with the rotation of
 * @ks / @vs. */
static void ref_encode(const struct mkv_segment *rs, enum mkv_kind kind, const uint16_t *x,
		       uint32_t n, struct mkv_segment **out)
{
	struct mkv_packed_view v;
	cr_assert_eq(mkv_segment_view(rs, &v), 0);
	float *R = malloc(sizeof(float) * v.d_keep * v.d);
	cr_assert_eq(mkv_segment_rotation(rs, R), 0);
	struct mkv_encode_opts o;
	enc_opts(&o, v.d, v.r, v.g, v.b, v.d_keep != v.d);
	o.value_bits = v.value_bits;
	o.kind = kind;
	o.summary_channels = kind == MKV_KIND_KEY ? v.summary_channels : 0;
	o.rotation = R;
	int rc = mkv_segment_encode(&o, x, MKV_DTYPE_BF16, n, out);
	cr_assert_eq(rc, 0, "%s", mkv_strerror(rc));
	free(R);
}

static void check_append(uint32_t d, uint32_t r, uint32_t g, uint32_t b, uint32_t drop,
			 uint32_t vb)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng rng;
	gu_rng_init(&rng, seed);
	struct mkv_encode_opts eo;
	enc_opts(&eo, d, r, g, b, drop);
	eo.value_bits = vb;
	struct gu_ctx c;
	size_t len = 2000;
	gu_ctx_build(&c, &rng, d, 1, &len, 0, &eo);
	uint32_t n1 = 37, n2 = 64, n = n1 + n2, cap = 128;
	uint16_t *k = malloc((size_t)(n + 10) * d * 2), *v = malloc((size_t)(n + 10) * d * 2);
	gu_fill_kv(&rng, k, n + 10, d);
	gu_fill_kv(&rng, v, n + 10, d);
	struct dbuf buf;
	dbuf_init(&buf, c.ks[0], c.vs[0], cap);
	uint32_t *ovf = gu_dev(4);
	GU_CK(cudaMemset(ovf, 0, 4));
	append(&buf, k, v, n1, d, ovf);
	append(&buf, k + (size_t)n1 * d, v + (size_t)n1 * d, n2, d, ovf);
	struct gpu_seg now;
	GU_CK(cudaMemcpy(&now, buf.dseg, sizeof now, cudaMemcpyDeviceToHost));
	cr_assert_eq(now.n, n);
	cr_assert_eq(now.n_blocks, (n + b - 1) / b);
	uint32_t o = 1;
	GU_CK(cudaMemcpy(&o, ovf, 4, cudaMemcpyDeviceToHost));
	cr_assert_eq(o, 0);
	struct mkv_segment *rk, *rv;
	ref_encode(c.ks[0], MKV_KIND_KEY, k, n, &rk);
	ref_encode(c.vs[0], MKV_KIND_VALUE, v, n, &rv);
	struct mkv_packed_view kv, vv;
	mkv_segment_view(rk, &kv);
	mkv_segment_view(rv, &vv);
	compare_half("append K", seed, &kv, buf.seg.k_val, buf.seg.k_bm, buf.seg.k_rs,
		     buf.seg.k_bw, buf.seg.s_min, buf.seg.s_max, buf.seg.s_rest);
	compare_half("append V", seed, &vv, buf.seg.v_val, buf.seg.v_bm, buf.seg.v_rs,
		     buf.seg.v_bw, NULL, NULL, NULL);
	/* overflow: 30 more than the 27 free slots */
	append(&buf, k, v, 30, d, ovf);
	GU_CK(cudaMemcpy(&o, ovf, 4, cudaMemcpyDeviceToHost));
	GU_CK(cudaMemcpy(&now, buf.dseg, sizeof now, cudaMemcpyDeviceToHost));
	cr_assert_eq(o, 1);
	cr_assert_eq(now.n, cap);
	mkv_segment_destroy(rk);
	mkv_segment_destroy(rv);
	cudaFree(ovf);
	dbuf_free(&buf);
	gu_ctx_free(&c);
	free(k);
	free(v);
}

Test(gpu, append_llama_shape) { check_append(128, 32, 1, 16, 1, 0); }

/* A buffer with value positions: gpu_append writes each appended row's,
 * the very bytes gpu_seg_positions finds in the bitmaps it wrote (that
 * entry is itself checked against a host walk in test_gpu_attn), over
 * three appends; rows past n stay as they were. */
Test(gpu, append_writes_positions)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng rng;
	gu_rng_init(&rng, seed);
	const uint32_t d = 128, cap = 256;
	struct mkv_encode_opts eo;
	enc_opts(&eo, d, 32, 1, 16, 1);
	struct gu_ctx c;
	size_t len = 1500;
	gu_ctx_build(&c, &rng, d, 1, &len, 0, &eo);
	const uint32_t n1 = 37, n2 = 64, n3 = 19, n = n1 + n2 + n3;
	uint16_t *k = malloc((size_t)n * d * 2), *v = malloc((size_t)n * d * 2);
	gu_fill_kv(&rng, k, n, d);
	gu_fill_kv(&rng, v, n, d);
	struct dbuf buf;
	dbuf_init_pos(&buf, c.ks[0], c.vs[0], cap, true);
	append(&buf, k, v, n1, d, NULL);
	append(&buf, k + (size_t)n1 * d, v + (size_t)n1 * d, n2, d, NULL);
	append(&buf, k + (size_t)(n1 + n2) * d, v + (size_t)(n1 + n2) * d, n3, d, NULL);
	const uint32_t ps = GPU_POS_STRIDE(buf.seg.k_r);
	cr_assert_eq(GPU_POS_STRIDE(buf.seg.v_r), ps);
	uint8_t *ref = gu_dev((size_t)n * ps);
	uint8_t *want = malloc((size_t)cap * ps), *got = malloc((size_t)cap * ps);
	for (int half = 0; half < 2; half++) {
		const struct gpu_seg *g = &buf.seg;
		cr_assert_eq(gpu_seg_positions(half ? g->v_bm : g->k_bm, half ? g->v_bw : g->k_bw,
					       half ? g->v_dk : g->k_dk, half ? g->v_r : g->k_r, n,
					       ref, 0), 0);
		GU_CK(cudaDeviceSynchronize());
		GU_CK(cudaMemcpy(want, ref, (size_t)n * ps, cudaMemcpyDeviceToHost));
		GU_CK(cudaMemcpy(got, half ? g->v_pos : g->k_pos, (size_t)cap * ps,
				 cudaMemcpyDeviceToHost));
		for (uint32_t t = 0; t < n; t++)
			cr_assert(memcmp(got + (size_t)t * ps, want + (size_t)t * ps, ps) == 0,
				  "seed %llu %s row %u: positions differ from the bitmap's",
				  (unsigned long long)seed, half ? "V" : "K", t);
		for (size_t i = (size_t)n * ps; i < (size_t)cap * ps; i++)
			cr_assert_eq(got[i], 0xa5, "byte %zu past the rows written", i);
	}
	cudaFree(ref);
	free(want);
	free(got);
	dbuf_free(&buf);
	gu_ctx_free(&c);
	free(k);
	free(v);
}
Test(gpu, append_g2_nodrop_b8) { check_append(128, 32, 2, 8, 0, 0); }
Test(gpu, append_d64_g4_r24_b32) { check_append(64, 24, 4, 32, 1, 0); }
/* quantized rows: the serving defaults, then the other widths */
Test(gpu, append_q6_d64_r40) { check_append(64, 40, 1, 16, 0, 6); }
Test(gpu, append_q6_d128_r82) { check_append(128, 82, 1, 16, 0, 6); }
Test(gpu, append_q4_g2_b8) { check_append(128, 48, 2, 8, 1, 4); }
Test(gpu, append_q8_d64_g4) { check_append(64, 24, 4, 32, 1, 8); }
Test(gpu, append_q5_q7) { check_append(64, 37, 1, 16, 0, 5); check_append(128, 81, 1, 16, 0, 7); }

/* History segments + an update buffer + a dense window: the buffer is
 * attended in full, no token is lost between them. */
static void check_covers_buffer_pos(uint32_t r, uint32_t vb, uint32_t nbuf, uint32_t cap,
				    uint32_t flags, bool pos)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng rng;
	gu_rng_init(&rng, seed);
	uint32_t d = 128, nq = 4, nseg = 3, win = 11;
	struct mkv_encode_opts eo;
	enc_opts(&eo, d, r, 1, 16, vb ? 0 : 1);
	eo.value_bits = vb;
	struct gu_ctx c;
	size_t lens[3] = {900, 17, 1333};
	gu_ctx_build(&c, &rng, d, nseg, lens, win, &eo);
	if (pos)
		gu_ctx_positions(&c, ~0u);
	uint16_t *bk = malloc((size_t)nbuf * d * 2), *bv = malloc((size_t)nbuf * d * 2);
	gu_fill_kv(&rng, bk, nbuf, d);
	gu_fill_kv(&rng, bv, nbuf, d);
	struct dbuf buf;
	dbuf_init_pos(&buf, c.ks[nseg - 1], c.vs[nseg - 1], cap, pos);
	append(&buf, bk, bv, nbuf, d, NULL);

	struct gpu_head hh = gu_ctx_head(&c);
	hh.buf = buf.dseg;
	hh.buf_cap_blocks = (cap + 15) / 16;
	float q[4 * 128], out[4 * 128];
	for (uint32_t i = 0; i < nq * d; i++)
		q[i] = (float)(1.5 * gu_normal(&rng));
	struct gpu_attn_args a;
	memset(&a, 0, sizeof a);
	a.n_heads = 1;
	a.nq = nq;
	a.d = d;
	a.token_frac = 0.1;
	a.max_segs = nseg;
	a.max_blocks = c.n_blocks;
	a.max_buf_blocks = hh.buf_cap_blocks;
	a.max_win = win;
	a.quest_b = 16;
	a.flags = flags;
	a.q = gu_upload(q, sizeof q);
	a.out = gu_dev(sizeof out);
	a.ws_bytes = gpu_attn_ws_bytes(&a);
	a.ws = gu_dev(a.ws_bytes);
	cr_assert_eq(gpu_attn_ws_init(&a, 0), 0);
	void *dh = gu_upload(&hh, sizeof hh);
	cr_assert_eq(gpu_attend_packed(&a, dh, 0), 0);
	GU_CK(cudaDeviceSynchronize());
	GU_CK(cudaMemcpy(out, a.out, sizeof out, cudaMemcpyDeviceToHost));

	/* reference: the buffer's tokens as the CPU encodes them with the same
	 * rotation, decoded to the original space, joined to the window */
	struct mkv_segment *rk, *rv;
	ref_encode(c.ks[nseg - 1], MKV_KIND_KEY, bk, nbuf, &rk);
	ref_encode(c.vs[nseg - 1], MKV_KIND_VALUE, bv, nbuf, &rv);
	size_t nw = nbuf + win;
	float *wk = malloc(nw * d * 4), *wv = malloc(nw * d * 4);
	cr_assert_eq(mkv_segment_decode(rk, 0, nbuf, MKV_SPACE_ORIGINAL, wk), 0);
	cr_assert_eq(mkv_segment_decode(rv, 0, nbuf, MKV_SPACE_ORIGINAL, wv), 0);
	for (size_t i = 0; i < (size_t)win * d; i++) {
		wk[nbuf * d + i] = gu_f32(c.k[c.n_hist * d + i]);
		wv[nbuf * d + i] = gu_f32(c.v[c.n_hist * d + i]);
	}
	struct mkv_dense_kv w = {wk, wv, MKV_DTYPE_F32, nw};
	struct mkv_attn_opts ao;
	cr_assert_eq(mkv_attn_opts_init(&ao, sizeof ao), 0);
	ao.d = d;
	ao.n_q = nq;
	ao.token_frac = 0.1;
	float ref[4 * 128];
	cr_assert_eq(mkv_attend_packed(&ao, q, (const struct mkv_segment *const *)c.ks,
				       (const struct mkv_segment *const *)c.vs, nseg, &w, ref, NULL),
		     0);
	double e = gu_rel_err(out, ref, (size_t)nq * d);
	cr_assert(e < 2e-3, "seed %llu: rel err %g", (unsigned long long)seed, e);
	mkv_segment_destroy(rk);
	mkv_segment_destroy(rv);
	free(wk);
	free(wv);
	free(bk);
	free(bv);
	cudaFree((void *)a.q);
	cudaFree(a.out);
	cudaFree(a.ws);
	cudaFree(dh);
	dbuf_free(&buf);
	gu_ctx_free(&c);
}

static void check_covers_buffer(uint32_t r, uint32_t vb, uint32_t nbuf, uint32_t cap,
				uint32_t flags)
{
	check_covers_buffer_pos(r, vb, nbuf, cap, flags, false);
}

Test(gpu, attention_covers_buffer) { check_covers_buffer(32, 0, 77, 256, 0); }
/* the same with value positions on the segments and the buffer (the
 * positions the appends wrote) */
Test(gpu, attention_covers_long_buffer_positions)
{
	check_covers_buffer_pos(32, 0, 9000, 9216, GPU_ATTN_SMALL_ROWS, true);
}
Test(gpu, attention_covers_buffer_positions_chunk64)
{
	check_covers_buffer_pos(24, 0, 700, 1024, GPU_ATTN_SMALL_ROWS | GPU_ATTN_CHUNK_64, true);
}
Test(gpu, attention_covers_buffer_q6) { check_covers_buffer(80, 6, 77, 256, 0); }
/* A buffer of more than one chunk (256 blocks): its chunks' states are
 * combined and rotated back once (seg_join), in both layouts. */
Test(gpu, attention_covers_long_buffer) { check_covers_buffer(32, 0, 5000, 5120, 0); }
Test(gpu, attention_covers_long_buffer_small)
{
	check_covers_buffer(32, 0, 9000, 9216, GPU_ATTN_SMALL_ROWS);
}
Test(gpu, attention_covers_long_buffer_chunk512)
{
	check_covers_buffer(32, 0, 9000, 9216, GPU_ATTN_SMALL_ROWS | GPU_ATTN_CHUNK_512);
}
Test(gpu, attention_covers_long_buffer_chunk64)
{
	check_covers_buffer(32, 0, 9000, 9216, GPU_ATTN_SMALL_ROWS | GPU_ATTN_CHUNK_64);
}

/* A prefill's inputs: @nmat random n × d bf16 matrices (host @x, device
 * @dx), an encoder, and their covariances computed into @dcov (@dR: room
 * for the rotations). */
struct pf {
	uint16_t *x;
	void *dx;
	struct gpu_encoder *enc;
	float *dcov, *dR;
};

static void pf_init(struct pf *p, struct gu_rng *rng, uint32_t d, uint32_t nmat, uint32_t n)
{
	p->x = malloc((size_t)nmat * n * d * 2);
	cr_assert(p->x);
	gu_fill_kv(rng, p->x, (size_t)nmat * n, d);
	p->dx = gu_upload(p->x, (size_t)nmat * n * d * 2);
	cr_assert_eq(gpu_encoder_create(d, nmat, &p->enc), 0);
	p->dcov = gu_dev((size_t)nmat * d * d * 4);
	p->dR = gu_dev((size_t)nmat * d * d * 4);
	cr_assert_eq(gpu_encode_cov(p->enc, p->dx, nmat, n, p->dcov, 0), 0);
}

static void pf_free(struct pf *p)
{
	gpu_encoder_destroy(p->enc);
	cudaFree(p->dx);
	cudaFree(p->dcov);
	cudaFree(p->dR);
	free(p->x);
}

/* Prefill encoding: covariance + cuSOLVER eigenvectors + packing, rows in
 * bf16 (vb 0) or quantized, groups of g, blocks of b (n = 3000 leaves a
 * partial last block at every b). */
static void check_encode(uint32_t vb, uint32_t g, uint32_t b)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng rng;
	gu_rng_init(&rng, seed);
	const uint32_t d = 128, nmat = 4, n = 3000, dk = 96;
	const uint32_t r = vb ? 60 : 32, S = vb ? 24 : 32;
	struct pf pf;
	pf_init(&pf, &rng, d, nmat, n);
	const uint16_t *x = pf.x;
	struct gpu_encoder *enc = pf.enc;
	float *dcov = pf.dcov, *dR = pf.dR;
	float *cov = fetch(dcov, (size_t)nmat * d * d * 4);
	cr_assert_eq(gpu_encode_eig(enc, dcov, nmat, dR, 0), 0);
	GU_CK(cudaDeviceSynchronize());
	float *R = fetch(dR, (size_t)nmat * d * d * 4);
	for (uint32_t m = 0; m < nmat; m++) {
		/* covariance against double */
		const uint16_t *xm = x + (size_t)m * n * d;
		double maxe = 0, maxc = 0;
		for (uint32_t i = 0; i < d; i += 7)
			for (uint32_t j = 0; j < d; j += 5) {
				double s = 0;
				for (uint32_t t = 0; t < n; t++)
					s += (double)gu_f32(xm[(size_t)t * d + i]) * gu_f32(xm[(size_t)t * d + j]);
				double e = fabs(s - cov[(size_t)m * d * d + (size_t)i * d + j]);
				maxe = e > maxe ? e : maxe;
				maxc = fabs(s) > maxc ? fabs(s) : maxc;
			}
		cr_assert(maxe <= 1e-4 * maxc, "seed %llu: covariance error %g of %g",
			  (unsigned long long)seed, maxe, maxc);
		/* rows orthonormal, Rayleigh quotients descending */
		const float *Rm = R + (size_t)m * d * d;
		double prev = INFINITY;
		for (uint32_t i = 0; i < d; i++) {
			for (uint32_t j = i; j < d; j += 13) {
				double s = 0;
				for (uint32_t c2 = 0; c2 < d; c2++)
					s += (double)Rm[i * d + c2] * Rm[j * d + c2];
				cr_assert(fabs(s - (i == j)) < 1e-4, "R row %u·%u = %g", i, j, s);
			}
			/* Rayleigh quotient under the covariance: descending */
			const float *Cm = cov + (size_t)m * d * d;
			double lam = 0;
			for (uint32_t j = 0; j < d; j++) {
				double p = 0;
				for (uint32_t c2 = 0; c2 < d; c2++)
					p += (double)Cm[j * d + c2] * Rm[i * d + c2];
				lam += p * Rm[i * d + j];
			}
			cr_assert(lam <= prev * (1 + 1e-4) + 1e-3 * maxc / d,
				  "seed %llu: eigenvalue %u = %g after %g", (unsigned long long)seed, i,
				  lam, prev);
			prev = lam;
		}
	}
	/* pack and compare with the CPU encoding under the same rotations */
	struct gpu_encode_args ea;
	memset(&ea, 0, sizeof ea);
	ea.nmat = nmat;
	ea.n = n;
	ea.d = d;
	ea.r = r;
	ea.g = g;
	ea.b = b;
	ea.S = S;
	ea.drop = 1;
	ea.value_bits = vb;
	ea.x = pf.dx;
	ea.R = dR;
	ea.dev_bytes = gpu_encode_pack_bytes(&ea);
	cr_assert(ea.dev_bytes > 0);
	ea.dev = gu_dev(ea.dev_bytes);
	struct gpu_seg segs[2];
	ea.segs = segs;
	cr_assert_eq(gpu_encode_pack(enc, &ea, 0), 0);
	GU_CK(cudaDeviceSynchronize());
	for (uint32_t m = 0; m < nmat; m++) {
		struct mkv_encode_opts o;
		enc_opts(&o, d, r, g, b, 1);
		o.value_bits = vb;
		o.kind = m % 2 ? MKV_KIND_VALUE : MKV_KIND_KEY;
		o.summary_channels = m % 2 ? 0 : S;
		o.rotation = R + (size_t)m * d * d; /* first dk rows */
		struct mkv_segment *cs;
		int rc = mkv_segment_encode(&o, x + (size_t)m * n * d, MKV_DTYPE_BF16, n, &cs);
		cr_assert_eq(rc, 0, "%s", mkv_strerror(rc));
		struct mkv_packed_view cv;
		mkv_segment_view(cs, &cv);
		const struct gpu_seg *sg = &segs[m / 2];
		cr_assert_eq(sg->k_dk, dk);
		cr_assert_eq(sg->k_vb, vb);
		if (m % 2 == 0)
			compare_half("encode K", seed, &cv, sg->k_val, sg->k_bm, sg->k_rs, sg->k_bw,
				     sg->s_min, sg->s_max, sg->s_rest);
		else
			compare_half("encode V", seed, &cv, sg->v_val, sg->v_bm, sg->v_rs, sg->v_bw,
				     NULL, NULL, NULL);
		mkv_segment_destroy(cs);
	}
	cudaFree(ea.dev);
	pf_free(&pf);
	free(cov);
	free(R);
}

Test(gpu, encode_prefill) { check_encode(0, 1, 16); }
Test(gpu, encode_prefill_q6) { check_encode(6, 1, 16); }
Test(gpu, encode_prefill_g2_b32) { check_encode(0, 2, 32); }
Test(gpu, encode_prefill_q5_g4_b8) { check_encode(5, 4, 8); }

/*
 * Host only (runs without a GPU): an update buffer's image carries, rot_dl
 * units behind each rotation, P − R in fp32 with P the projection computed
 * here (Gauss-Jordan, tests/core/projection.c), to float rounding; closed
 * images (cap = n) and images without
 * projections carry none (rot_dl = 0), and a projection for one half only
 * is refused.
 */
Test(gpu, buffer_image_carries_correction)
{
	uint64_t seed = gu_seed();
	struct gu_rng rng;
	gu_rng_init(&rng, seed);
	const uint32_t dims[2] = {64, 128};
	for (int di = 0; di < 2; di++)
		for (uint32_t drop = 0; drop < 2; drop++) {
			uint32_t d = dims[di];
			struct mkv_encode_opts eo;
			enc_opts(&eo, d, d / 4, 1, 16, drop);
			size_t len = 300;
			uint16_t *x = malloc(len * d * 2), *y = malloc(len * d * 2);
			cr_assert(x && y);
			gu_fill_kv(&rng, x, len, d);
			gu_fill_kv(&rng, y, len, d);
			struct mkv_segment *ks, *vs;
			gu_encode_pair(&eo, x, y, len, &ks, &vs);
			struct mkv_packed_view kv, vv;
			cr_assert_eq(mkv_segment_view(ks, &kv), 0);
			cr_assert_eq(mkv_segment_view(vs, &vv), 0);
			uint32_t cap = (uint32_t)len + 64;
			size_t bytes = gpu_seg_cap_bytes(&kv, &vv, cap);
			cr_assert(bytes > 0);
			char *img = malloc(bytes);
			const char *dev = (const char *)(uintptr_t)4096;
			float *kP = proj_of(ks), *vP = proj_of(vs);
			struct gpu_seg sg;
			cr_assert_eq(gpu_seg_image_proj(&kv, &vv, kP, NULL, cap, img, dev, &sg),
				     -EINVAL);
			cr_assert_eq(gpu_seg_image_proj(&kv, &vv, kP, vP, cap, img, dev, &sg), 0);
			cr_assert_eq(sg.rot_dl, d * d);
			for (int half = 0; half < 2; half++) {
				const struct mkv_packed_view *hv = half ? &vv : &kv;
				const float *P = half ? vP : kP;
				const uint16_t *rot = half ? sg.v_rot : sg.k_rot;
				const uint16_t *hr = (const uint16_t *)(img + ((const char *)rot - dev));
				const float *hc = (const float *)(hr + sg.rot_dl);
				size_t m = (size_t)hv->d_keep * d, big = 0;
				cr_assert(memcmp(hr, hv->rotation, m * 2) == 0);
				for (size_t i = 0; i < m; i++) {
					double want = (double)P[i] - gu_f32(hr[i]);
					double got = hc[i];
					cr_assert(fabs(got - want) <= 0x1p-23 * fabs(want),
						  "seed %llu d=%u drop=%u half %d: C[%zu] = %g, want %g",
						  (unsigned long long)seed, d, drop, half, i, got, want);
					big += fabs(want) > 1e-5;
				}
				/* the rounded rotation does need it */
				cr_assert(big > m / 4, "seed %llu: only %zu of %zu corrections",
					  (unsigned long long)seed, big, m);
			}
			cr_assert_eq(gpu_seg_image(&kv, &vv, cap, img, dev, &sg), 0);
			cr_assert_eq(sg.rot_dl, 0);
			cr_assert_eq(gpu_seg_image_proj(&kv, &vv, kP, vP, (uint32_t)len, NULL, dev, &sg), 0);
			cr_assert_eq(sg.rot_dl, 0);
			free(kP);
			free(vP);
			free(img);
			mkv_segment_destroy(ks);
			mkv_segment_destroy(vs);
			free(x);
			free(y);
		}
}

/*
 * Packed rows that keep every channel (r = d_keep = d, g = 1, bf16: row t
 * is x_t's coefficients in channel order) hold x_t Pᵀ, P = (R Rᵀ)⁻¹ R of
 * the stored rotation @drot (th_projection, double), to the bf16 rounding
 * of each coefficient plus @tol |x|.  x_t Rᵀ misses by ~1e-4 |x| (and by
 * ~1e-3 |x| at worst).
 */
static void check_coeffs(const char *what, uint64_t seed, const uint16_t *dval, uint32_t rs,
			 const uint16_t *drot, uint32_t d, const uint16_t *x, uint32_t n,
			 double tol)
{
	uint16_t *val = fetch(dval, (size_t)n * rs * 2);
	uint16_t *rot = fetch(drot, (size_t)d * d * 2);
	double *R = malloc(sizeof(double) * d * d), *P = malloc(sizeof(double) * d * d);
	cr_assert(R && P);
	for (size_t i = 0; i < (size_t)d * d; i++)
		R[i] = gu_f32(rot[i]);
	th_projection(R, d, d, P);
	double worst = 0; /* beyond the coefficient's own rounding, over |x| */
	for (uint32_t t = 0; t < n; t++) {
		double nx = 0;
		for (uint32_t c = 0; c < d; c++)
			nx += (double)gu_f32(x[(size_t)t * d + c]) * gu_f32(x[(size_t)t * d + c]);
		nx = sqrt(nx);
		for (uint32_t a = 0; a < d; a++) {
			double want = 0;
			for (uint32_t c = 0; c < d; c++)
				want += P[(size_t)a * d + c] * gu_f32(x[(size_t)t * d + c]);
			double got = gu_f32(val[(size_t)t * rs + a]);
			worst = fmax(worst, (fabs(got - want) - 0x1p-8 * fabs(want)) / nx);
			cr_assert(fabs(got - want) <= 0x1p-8 * fabs(want) + tol * nx,
				  "seed %llu %s: token %u coefficient %u = %.9g, want %.9g (|x| %g)",
				  (unsigned long long)seed, what, t, a, got, want, nx);
		}
	}
	cr_log_info("%s: worst %.3g |x| past a bf16 half-ulp (bound %.3g)\n", what, worst, tol);
	free(R);
	free(P);
	free(val);
	free(rot);
}

/* Prefill at r = d: the coefficients invert the rounded rotation, to
 * ~1e-5 |x| (seen: up to 8e-6): the correction is first order, C and
 * x Cᵀ are bf16 (pack.cu). */
Test(gpu, encode_prefill_inverts_rotation)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng rng;
	gu_rng_init(&rng, seed);
	const uint32_t d = 128, nmat = 2, n = 700;
	struct pf pf;
	pf_init(&pf, &rng, d, nmat, n);
	cr_assert_eq(gpu_encode_eig(pf.enc, pf.dcov, nmat, pf.dR, 0), 0);
	struct gpu_encode_args ea;
	memset(&ea, 0, sizeof ea);
	ea.nmat = nmat;
	ea.n = n;
	ea.d = d;
	ea.r = d;
	ea.g = 1;
	ea.b = 16;
	ea.S = 32;
	ea.x = pf.dx;
	ea.R = pf.dR;
	ea.dev_bytes = gpu_encode_pack_bytes(&ea);
	cr_assert(ea.dev_bytes > 0);
	ea.dev = gu_dev(ea.dev_bytes);
	struct gpu_seg seg;
	ea.segs = &seg;
	cr_assert_eq(gpu_encode_pack(pf.enc, &ea, 0), 0);
	GU_CK(cudaDeviceSynchronize());
	cr_assert_eq(seg.k_r, d);
	check_coeffs("prefill K", seed, seg.k_val, seg.k_rs, seg.k_rot, d, pf.x, n, 2.5e-5);
	check_coeffs("prefill V", seed, seg.v_val, seg.v_rs, seg.v_rot, d, pf.x + (size_t)n * d,
		     n, 2.5e-5);
	cudaFree(ea.dev);
	pf_free(&pf);
}

/* Appends at r = d: the buffer's correction (fp32) makes them invert the
 * rotation as the CPU's appends do, to fp32 sums. */
Test(gpu, append_inverts_rotation)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng rng;
	gu_rng_init(&rng, seed);
	const uint32_t d = 128, n = 90, cap = 128;
	struct mkv_encode_opts eo;
	enc_opts(&eo, d, d, 1, 16, 0);
	struct gu_ctx c;
	size_t len = 1000;
	gu_ctx_build(&c, &rng, d, 1, &len, 0, &eo);
	uint16_t *k = malloc((size_t)n * d * 2), *v = malloc((size_t)n * d * 2);
	gu_fill_kv(&rng, k, n, d);
	gu_fill_kv(&rng, v, n, d);
	struct dbuf buf;
	dbuf_init(&buf, c.ks[0], c.vs[0], cap);
	append(&buf, k, v, n, d, NULL);
	check_coeffs("append K", seed, buf.seg.k_val, buf.seg.k_rs, buf.seg.k_rot, d, k, n, 5e-6);
	check_coeffs("append V", seed, buf.seg.v_val, buf.seg.v_rs, buf.seg.v_rot, d, v, n, 5e-6);
	dbuf_free(&buf);
	gu_ctx_free(&c);
	free(k);
	free(v);
}
