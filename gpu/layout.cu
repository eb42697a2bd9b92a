/* SPDX-License-Identifier: MIT */
/*
 * Upload of a K/V pair of packed views into the device layout of
 * struct gpu_seg (see gpu.cuh): values padded to a multiple of 8 per
 * vector, bitmaps to whole 32-bit words, every array 256-byte aligned.
 * Host repacking happens once per segment, never per decode step.
 */
#include <stdlib.h>
#include <string.h>
#include "common.cuh"

struct seg_plan {
	size_t k_val, k_bm, k_rot, s_min, s_max, v_val, v_bm, v_rot, total;
	uint32_t k_rs, k_bw, v_rs, v_bw;
};

static size_t al(size_t x) { return (x + 255) & ~(size_t)255; }

static int plan(const struct mkv_packed_view *k, const struct mkv_packed_view *v,
		struct seg_plan *p)
{
	if (!k || !v || k->kind != MKV_KIND_KEY || v->kind != MKV_KIND_VALUE ||
	    k->store_dtype != MKV_DTYPE_BF16 || v->store_dtype != MKV_DTYPE_BF16 ||
	    k->n != v->n || k->d != v->d || k->d > GPU_MAX_D || k->n == 0 ||
	    k->bitmap_bytes > 16 || v->bitmap_bytes > 16 || k->summary_channels == 0 ||
	    k->g > 8 || v->g > 8)
		return -EINVAL;
	memset(p, 0, sizeof *p);
	p->k_rs = (k->r + 7) & ~7u;
	p->v_rs = (v->r + 7) & ~7u;
	p->k_bw = (k->bitmap_bytes + 3) / 4;
	p->v_bw = (v->bitmap_bytes + 3) / 4;
	size_t n = k->n, off = 0;
	p->k_val = off;
	off += al(n * p->k_rs * 2);
	p->k_bm = off;
	off += al(n * p->k_bw * 4);
	p->k_rot = off;
	off += al((size_t)k->d_keep * k->d * 2);
	p->s_min = off;
	off += al((size_t)k->n_blocks * k->summary_channels * 2);
	p->s_max = off;
	off += al((size_t)k->n_blocks * k->summary_channels * 2);
	p->v_val = off;
	off += al(n * p->v_rs * 2);
	p->v_bm = off;
	off += al(n * p->v_bw * 4);
	p->v_rot = off;
	off += al((size_t)v->d_keep * v->d * 2);
	p->total = off;
	return 0;
}

size_t gpu_seg_bytes(const struct mkv_packed_view *k, const struct mkv_packed_view *v)
{
	struct seg_plan p;
	return plan(k, v, &p) ? 0 : p.total;
}

static void put_vals(char *dst, const struct mkv_packed_view *x, uint32_t rs)
{
	const uint16_t *src = (const uint16_t *)x->values;
	for (size_t i = 0; i < x->n; i++)
		memcpy(dst + i * rs * 2, src + i * x->r, (size_t)x->r * 2);
}

static void put_bms(char *dst, const struct mkv_packed_view *x, uint32_t bw)
{
	for (size_t i = 0; i < x->n; i++)
		memcpy(dst + i * bw * 4, x->bitmaps + i * x->bitmap_bytes, x->bitmap_bytes);
}

int gpu_seg_upload(const struct mkv_packed_view *k, const struct mkv_packed_view *v, void *dev,
		   struct gpu_seg *out)
{
	struct seg_plan p;
	if (!dev || !out || plan(k, v, &p))
		return -EINVAL;
	char *h = (char *)calloc(1, p.total);
	if (!h)
		return -ENOMEM;
	put_vals(h + p.k_val, k, p.k_rs);
	put_bms(h + p.k_bm, k, p.k_bw);
	memcpy(h + p.k_rot, k->rotation, (size_t)k->d_keep * k->d * 2);
	memcpy(h + p.s_min, k->sum_min, (size_t)k->n_blocks * k->summary_channels * 2);
	memcpy(h + p.s_max, k->sum_max, (size_t)k->n_blocks * k->summary_channels * 2);
	put_vals(h + p.v_val, v, p.v_rs);
	put_bms(h + p.v_bm, v, p.v_bw);
	memcpy(h + p.v_rot, v->rotation, (size_t)v->d_keep * v->d * 2);
	cudaError_t e = cudaMemcpy(dev, h, p.total, cudaMemcpyHostToDevice);
	free(h);
	if (e != cudaSuccess)
		return gpu_errno(e);
	char *d = (char *)dev;
	memset(out, 0, sizeof *out);
	out->k_val = (const uint16_t *)(d + p.k_val);
	out->k_bm = (const uint32_t *)(d + p.k_bm);
	out->k_rot = (const uint16_t *)(d + p.k_rot);
	out->s_min = (const uint16_t *)(d + p.s_min);
	out->s_max = (const uint16_t *)(d + p.s_max);
	out->v_val = (const uint16_t *)(d + p.v_val);
	out->v_bm = (const uint32_t *)(d + p.v_bm);
	out->v_rot = (const uint16_t *)(d + p.v_rot);
	out->n = k->n;
	out->b = k->b;
	out->n_blocks = k->n_blocks;
	out->S = k->summary_channels;
	out->k_dk = k->d_keep;
	out->k_r = k->r;
	out->k_g = k->g;
	out->k_rs = p.k_rs;
	out->k_bw = p.k_bw;
	out->v_dk = v->d_keep;
	out->v_r = v->r;
	out->v_g = v->g;
	out->v_rs = p.v_rs;
	out->v_bw = p.v_bw;
	out->block0 = 0;
	return 0;
}
