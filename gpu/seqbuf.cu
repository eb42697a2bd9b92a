/* SPDX-License-Identifier: MIT */
/*
 * Device images of segments: the layout of struct gpu_seg with room for
 * @cap tokens, so that one allocation serves a closed segment (cap = n,
 * which is also what gpu_seg_upload in layout.cu copies) and an update
 * buffer that gpu_append() grows in place (mosaickv/seqgpu.c).  The image is built in host memory and the
 * caller copies it with whatever stream it owns: nothing here touches
 * CUDA, so a worker thread can build images while the decode thread's
 * stream runs.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "common.cuh"

struct cap_plan {
	size_t k_val, k_bm, k_rot, s_min, s_max, s_rest, v_val, v_bm, v_rot, total;
	uint32_t k_rs, k_bw, v_rs, v_bw, cap_blocks;
	uint32_t k_rb, v_rb; /* host row bytes */
	uint32_t rot_dl;     /* buffers (cap > n): corrections' distance */
};

static size_t al256(size_t x) { return (x + 255) & ~(size_t)255; }

/* Host row bytes of a bf16 view (0: not a layout the kernels read).  The
 * view's row_bytes may be 0 in a view filled by an older caller: then the
 * rows are r bf16 values. */
static uint32_t host_row_bytes(const struct mkv_packed_view *x)
{
	uint32_t w = x->value_bits, rb;
	if (w == 0)
		rb = x->r * 2;
	else if (w >= 4 && w <= 8)
		rb = 2 + (x->r * w + 7) / 8, rb += rb & 1;
	else
		return 0;
	return x->row_bytes == 0 && w == 0 ? rb : x->row_bytes == rb ? rb : 0;
}

/* Device row stride in 16-bit units: the row rounded up to 16 bytes. */
static uint32_t dev_row_stride(const struct mkv_packed_view *x, uint32_t rb)
{
	return x->value_bits ? ((rb + 15) & ~15u) / 2 : (x->r + 7) & ~7u;
}

static int cap_plan(const struct mkv_packed_view *k, const struct mkv_packed_view *v,
		    uint32_t cap, struct cap_plan *p)
{
	if (!k || !v || k->kind != MKV_KIND_KEY || v->kind != MKV_KIND_VALUE ||
	    k->store_dtype != MKV_DTYPE_BF16 || v->store_dtype != MKV_DTYPE_BF16 ||
	    k->n != v->n || k->d != v->d || k->b != v->b || k->d > GPU_MAX_D ||
	    k->bitmap_bytes > 16 || v->bitmap_bytes > 16 || k->summary_channels == 0 ||
	    k->g > 8 || v->g > 8 || k->r == 0 || v->r == 0 || k->b == 0 || cap == 0 ||
	    k->n > cap || !k->rotation || !v->rotation)
		return -EINVAL;
	memset(p, 0, sizeof *p);
	p->k_rb = host_row_bytes(k);
	p->v_rb = host_row_bytes(v);
	if (!p->k_rb || !p->v_rb)
		return -EINVAL;
	p->k_rs = dev_row_stride(k, p->k_rb);
	p->v_rs = dev_row_stride(v, p->v_rb);
	p->k_bw = (k->bitmap_bytes + 3) / 4;
	p->v_bw = (v->bitmap_bytes + 3) / 4;
	p->cap_blocks = (cap + k->b - 1) / k->b;
	/* A buffer's rotation regions hold R (bf16) then, d × d units on,
	 * C = P − R in fp32 (2d² bytes on: a multiple of 256 at d = 64, 128).
	 * fp32, not bf16: rows appended here must match the CPU's to float
	 * rounding, and bf16 C would leave ~2^-18 |x| (tests/gpu). */
	p->rot_dl = cap > k->n ? k->d * k->d : 0;
	size_t rot_k = p->rot_dl ? (size_t)6 * k->d * k->d : (size_t)k->d_keep * k->d * 2;
	size_t rot_v = p->rot_dl ? (size_t)6 * v->d * v->d : (size_t)v->d_keep * v->d * 2;
	size_t n = cap, off = 0, S = k->summary_channels;
	p->k_val = off;
	off += al256(n * p->k_rs * 2 + 16); /* + slack: see gpu.cuh */
	p->k_bm = off;
	off += al256(n * p->k_bw * 4);
	p->k_rot = off;
	off += al256(rot_k);
	p->s_min = off;
	off += al256((size_t)p->cap_blocks * S * 2);
	p->s_max = off;
	off += al256((size_t)p->cap_blocks * S * 2);
	p->s_rest = off;
	off += al256((size_t)p->cap_blocks * 2);
	p->v_val = off;
	off += al256(n * p->v_rs * 2 + 16);
	p->v_bm = off;
	off += al256(n * p->v_bw * 4);
	p->v_rot = off;
	off += al256(rot_v);
	p->total = off;
	return 0;
}

size_t gpu_seg_cap_bytes(const struct mkv_packed_view *k, const struct mkv_packed_view *v,
			 uint32_t cap)
{
	struct cap_plan p;
	return cap_plan(k, v, cap, &p) ? 0 : p.total;
}

/* Rows of n vectors, rb host bytes each, into a stride of rs 16-bit units
 * (zero padding: the image is zeroed first). */
static void img_vals(char *dst, const struct mkv_packed_view *x, uint32_t rb, uint32_t rs)
{
	const char *src = (const char *)x->values;
	if (rs * 2 == rb) {
		memcpy(dst, src, (size_t)x->n * rb);
		return;
	}
	for (size_t i = 0; i < x->n; i++)
		memcpy(dst + i * rs * 2, src + i * rb, rb);
}

static void img_bms(char *dst, const struct mkv_packed_view *x, uint32_t bw)
{
	if (bw * 4 == x->bitmap_bytes) {
		memcpy(dst, x->bitmaps, (size_t)x->n * x->bitmap_bytes);
		return;
	}
	for (size_t i = 0; i < x->n; i++)
		memcpy(dst + i * bw * 4, x->bitmaps + i * x->bitmap_bytes, x->bitmap_bytes);
}

static float host_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* P − R for the bf16 rotation @rot (dk × d) into @dst (exact where P and
 * R are within a factor 2: Sterbenz). */
static void img_corr(float *dst, const uint16_t *rot, const float *P, size_t m)
{
	for (size_t i = 0; i < m; i++)
		dst[i] = P[i] - host_f32(rot[i]);
}

static bool all_finite(const float *x, size_t m)
{
	for (size_t i = 0; i < m; i++)
		if (!isfinite(x[i]))
			return false;
	return true;
}

int gpu_seg_image(const struct mkv_packed_view *k, const struct mkv_packed_view *v,
		  uint32_t cap, void *img, const void *dev, struct gpu_seg *out)
{
	return gpu_seg_image_proj(k, v, NULL, NULL, cap, img, dev, out);
}

int gpu_seg_image_proj(const struct mkv_packed_view *k, const struct mkv_packed_view *v,
		       const float *kP, const float *vP, uint32_t cap, void *img,
		       const void *dev, struct gpu_seg *out)
{
	struct cap_plan p;
	if (!dev || !out || cap_plan(k, v, cap, &p) || !kP != !vP)
		return -EINVAL;
	if (kP && (!all_finite(kP, (size_t)k->d_keep * k->d) ||
		   !all_finite(vP, (size_t)v->d_keep * v->d)))
		return -EINVAL;
	uint32_t rot_dl = kP ? p.rot_dl : 0;
	if (k->n && (!k->values || !k->bitmaps || !v->values || !v->bitmaps ||
		     !k->sum_min || !k->sum_max))
		return -EINVAL;
	if (img) {
		char *h = (char *)img;
		memset(h, 0, p.total);
		size_t S = k->summary_channels;
		if (k->n) {
			img_vals(h + p.k_val, k, p.k_rb, p.k_rs);
			img_bms(h + p.k_bm, k, p.k_bw);
			memcpy(h + p.s_min, k->sum_min, (size_t)k->n_blocks * S * 2);
			memcpy(h + p.s_max, k->sum_max, (size_t)k->n_blocks * S * 2);
			if (k->sum_rest) /* else zero: no remainder term */
				memcpy(h + p.s_rest, k->sum_rest, (size_t)k->n_blocks * 2);
			img_vals(h + p.v_val, v, p.v_rb, p.v_rs);
			img_bms(h + p.v_bm, v, p.v_bw);
		}
		memcpy(h + p.k_rot, k->rotation, (size_t)k->d_keep * k->d * 2);
		memcpy(h + p.v_rot, v->rotation, (size_t)v->d_keep * v->d * 2);
		if (rot_dl) {
			img_corr((float *)((uint16_t *)(h + p.k_rot) + rot_dl),
				 (const uint16_t *)k->rotation, kP, (size_t)k->d_keep * k->d);
			img_corr((float *)((uint16_t *)(h + p.v_rot) + rot_dl),
				 (const uint16_t *)v->rotation, vP, (size_t)v->d_keep * v->d);
		}
	}
	const char *d = (const char *)dev;
	memset(out, 0, sizeof *out);
	out->k_val = (const uint16_t *)(d + p.k_val);
	out->k_bm = (const uint32_t *)(d + p.k_bm);
	out->k_rot = (const uint16_t *)(d + p.k_rot);
	out->s_min = (const uint16_t *)(d + p.s_min);
	out->s_max = (const uint16_t *)(d + p.s_max);
	out->s_rest = (const uint16_t *)(d + p.s_rest);
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
	out->k_vb = k->value_bits;
	out->v_vb = v->value_bits;
	out->rot_dl = rot_dl;
	return 0;
}
