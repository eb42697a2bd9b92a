/* SPDX-License-Identifier: MIT */
/* Segment encoding into the packed format, decoding, and serialization. */
#include <cblas.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include "internal.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the serialized segment format is written in host order: little-endian only"
#endif

/* Version 1 of the options ended at the rotation pointer. */
#define ENC_OPTS_V1 (offsetof(struct mkv_encode_opts, rotation) + sizeof(const float *))

static void encode_opts_defaults(struct mkv_encode_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->d = 128;
	o->r = 32;
	o->g = 1;
	o->b = 16;
	o->drop = 0;
	o->rotate = 1;
	o->select = MKV_SELECT_PER_VECTOR;
	o->kind = MKV_KIND_KEY;
	o->store_dtype = MKV_DTYPE_BF16;
	o->summary_channels = 0;
	o->rotation = NULL;
	o->value_bits = 0;
}

int mkv_encode_opts_init(struct mkv_encode_opts *o, size_t size)
{
	if (!o || !mkv_opts_size_ok(size, ENC_OPTS_V1, sizeof(*o)))
		return -EINVAL;
	struct mkv_encode_opts full;
	encode_opts_defaults(&full);
	full.size = size;
	memcpy(o, &full, size);
	return 0;
}

/* The caller's options as this version's struct: fields its version did
 * not have take their defaults.  False on a size no version had. */
static bool encode_opts_full(const struct mkv_encode_opts *o,
			     struct mkv_encode_opts *full)
{
	if (!mkv_opts_size_ok(o->size, ENC_OPTS_V1, sizeof(*o)))
		return false;
	encode_opts_defaults(full);
	memcpy(full, o, o->size);
	full->size = sizeof(*full);
	return true;
}

uint32_t mkv_row_bytes(uint32_t r, uint32_t value_bits,
		       enum mkv_dtype store_dtype)
{
	if (r == 0 || r > MKV_MAX_D)
		return 0;
	if (value_bits == 0) {
		if (store_dtype != MKV_DTYPE_F32 && store_dtype != MKV_DTYPE_BF16)
			return 0;
		return r * (uint32_t)mkv_dtype_size(store_dtype);
	}
	if (value_bits < 4 || value_bits > 8)
		return 0;
	uint32_t bytes = 2 + (r * value_bits + 7) / 8;
	return bytes + (bytes & 1);
}

static bool store_dtype_valid(enum mkv_dtype dt)
{
	return dt == MKV_DTYPE_F32 || dt == MKV_DTYPE_BF16;
}

/* The shape fields of a view must describe a segment this library can
 * build; used for options and again for bytes read back from a tier. */
static bool shape_valid(uint32_t n, uint32_t d, uint32_t d_keep, uint32_t r,
			uint32_t g, uint32_t b, uint32_t S, enum mkv_kind kind,
			enum mkv_dtype sd, uint32_t value_bits)
{
	if (n == 0 || n > MKV_MAX_N || !mkv_d_valid(d) || !mkv_g_valid(g) ||
	    !mkv_b_valid(b) || !store_dtype_valid(sd))
		return false;
	if (value_bits && (value_bits < 4 || value_bits > 8))
		return false;
	if (d_keep != d && d_keep != mkv_d_keep(d, 1))
		return false;
	if (r == 0 || r > d_keep || r % g || d_keep % g)
		return false;
	if (kind == MKV_KIND_KEY)
		return S >= 1 && S <= d_keep;
	return kind == MKV_KIND_VALUE && S == 0;
}

static void view_init(struct mkv_packed_view *v, uint32_t n, uint32_t d,
		      uint32_t d_keep, uint32_t r, uint32_t g, uint32_t b,
		      uint32_t S, enum mkv_kind kind, enum mkv_dtype sd,
		      uint32_t rotated, uint32_t value_bits)
{
	memset(v, 0, sizeof(*v));
	v->n = n;
	v->d = d;
	v->d_keep = d_keep;
	v->r = r;
	v->g = g;
	v->b = b;
	v->n_blocks = (n + b - 1) / b;
	v->bitmap_bytes = (d_keep / g + 7) / 8;
	v->summary_channels = kind == MKV_KIND_KEY ? S : 0;
	v->kind = kind;
	v->store_dtype = sd;
	v->rotated = rotated;
	v->value_bits = value_bits;
	v->row_bytes = mkv_row_bytes(r, value_bits, sd);
}

struct seg_sizes {
	size_t values, bitmaps, rotation;
	size_t summary; /* one of min/max */
	size_t rest;    /* the remainder bounds */
};

static struct seg_sizes seg_sizes(const struct mkv_packed_view *v)
{
	size_t es = mkv_dtype_size(v->store_dtype);
	struct seg_sizes z = {
		.values = (size_t)v->n * v->row_bytes,
		.bitmaps = (size_t)v->n * v->bitmap_bytes,
		.rotation = (size_t)v->d_keep * v->d * es,
		.summary = (size_t)v->n_blocks * v->summary_channels * es,
		.rest = v->kind == MKV_KIND_KEY ? (size_t)v->n_blocks * es : 0,
	};
	return z;
}

void mkv_segment_destroy(struct mkv_segment *s)
{
	if (!s)
		return;
	free(s->values);
	free(s->bitmaps);
	free(s->rotation);
	free(s->sum_min);
	free(s->sum_max);
	free(s->sum_rest);
	free(s->rot_f32);
	free(s->proj_f32);
	free(s->proj_t);
	free(s->sum8);
	free(s->sum8_scale);
	free(s);
}

/* Allocate a segment's arrays for the shape in @v (already initialised). */
static struct mkv_segment *seg_alloc(const struct mkv_packed_view *v)
{
	struct mkv_segment *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->v = *v;
	struct seg_sizes z = seg_sizes(v);
	s->values = malloc(z.values);
	s->bitmaps = calloc(1, z.bitmaps);
	s->rotation = malloc(z.rotation);
	s->rot_f32 = malloc(sizeof(float) * v->d_keep * v->d);
	if (v->kind == MKV_KIND_KEY) {
		s->sum_min = malloc(z.summary);
		s->sum_max = malloc(z.summary);
		s->sum_rest = calloc(1, z.rest);
	}
	if (!s->values || !s->bitmaps || !s->rotation || !s->rot_f32 ||
	    (v->kind == MKV_KIND_KEY &&
	     (!s->sum_min || !s->sum_max || !s->sum_rest))) {
		mkv_segment_destroy(s);
		return NULL;
	}
	s->v.values = s->values;
	s->v.bitmaps = s->bitmaps;
	s->v.rotation = s->rotation;
	s->v.sum_min = s->sum_min;
	s->v.sum_max = s->sum_max;
	s->v.sum_rest = s->sum_rest;
	return s;
}

/* Expand the stored rotation to float: the one used for every projection,
 * so encoding, decoding and attention agree on one matrix. */
static void seg_expand_rotation(struct mkv_segment *s)
{
	size_t m = (size_t)s->v.d_keep * s->v.d;
	for (size_t i = 0; i < m; i++)
		s->rot_f32[i] = mkv_elem(s->rotation, s->v.store_dtype, i);
}

/* Rows per streaming pass: 256 rows of d <= 256 floats stay in L2, so
 * nothing the size of the segment is ever materialised in float.  A
 * multiple of the largest block size, so no block straddles two chunks. */
#define ENC_CHUNK 256

/* Convert rows [i0, i0+m) of the input to float; false on NaN/Inf. */
static bool load_rows(float *dst, const void *x, enum mkv_dtype dt, size_t i0,
		      size_t m, uint32_t d)
{
	return mkv_load_f32(dst, (const char *)x + i0 * d * mkv_dtype_size(dt),
			    dt, m * d);
}

/* Rotation for the segment: given, computed from the data, or a channel
 * subset of the identity.  Also the pass that rejects non-finite input. */
static int encode_rotation(const struct mkv_encode_opts *o, const void *x,
			   enum mkv_dtype dt, size_t n, uint32_t d_keep,
			   float *R, float *buf)
{
	uint32_t d = o->d;
	double *cov = NULL;
	double en[MKV_MAX_D] = {0};
	bool need_cov = !o->rotation && o->rotate;
	int rc = -ENOMEM;
	if (need_cov && !(cov = calloc((size_t)d * d, sizeof(double))))
		return -ENOMEM;
	for (size_t i0 = 0; i0 < n; i0 += ENC_CHUNK) {
		size_t m = n - i0 < ENC_CHUNK ? n - i0 : ENC_CHUNK;
		if (!load_rows(buf, x, dt, i0, m, d)) {
			rc = -MKV_ENONFINITE;
			goto out;
		}
		if (need_cov) {
			if ((rc = mkv_cov_accumulate(cov, buf, m, d)))
				goto out;
		} else if (!o->rotation && d_keep != d) {
			for (size_t i = 0; i < m * d; i++)
				en[i % d] += (double)buf[i] * buf[i];
		}
	}
	if (o->rotation) {
		memcpy(R, o->rotation, sizeof(float) * d_keep * d);
		rc = mkv_all_finite(R, (size_t)d_keep * d) ? 0 : -MKV_ENONFINITE;
		goto out;
	}
	if (need_cov) {
		float *full = malloc(sizeof(float) * d * d);
		rc = -ENOMEM;
		if (full) {
			rc = mkv_eigen_rows(cov, d, full, NULL);
			if (rc == 0)
				memcpy(R, full, sizeof(float) * d_keep * d);
			free(full);
		}
		goto out;
	}
	/* No rotation: unit rows.  With a drop, keep the d_keep channels of
	 * largest energy, in descending energy like the eigen-rows. */
	memset(R, 0, sizeof(float) * d_keep * d);
	uint8_t used[MKV_MAX_D] = {0};
	for (uint32_t row = 0; row < d_keep; row++) {
		uint32_t best = row;
		if (d_keep != d) {
			double bv = -1.0;
			for (uint32_t c = 0; c < d; c++)
				if (!used[c] && en[c] > bv) {
					bv = en[c];
					best = c;
				}
		}
		used[best] = 1;
		R[row * d + best] = 1.0f;
	}
	rc = 0;
out:
	free(cov);
	return rc;
}

/*
 * One quantized row (the format under struct mkv_packed_view): a bf16
 * scale rounded up, so no value rounds past the largest field, then r
 * offset fields of w bits, LSB-first.  Padding bytes are written zero.
 */
static void quantize_row(char *row, const float *vals, uint32_t r, uint32_t w)
{
	int qmax = (1 << (w - 1)) - 1;
	float amax = 0.0f;
	for (uint32_t k = 0; k < r; k++)
		amax = fmaxf(amax, fabsf(vals[k]));
	uint16_t sb = amax > 0.0f ? mkv_f32_to_bf16_up(amax / (float)qmax) : 0;
	float sf = mkv_bf16_to_f32(sb);
	uint32_t nb = mkv_row_bytes(r, w, MKV_DTYPE_BF16);
	memset(row, 0, nb);
	memcpy(row, &sb, 2);
	uint8_t *f = (uint8_t *)row + 2;
	for (uint32_t k = 0; k < r; k++) {
		int q = 0;
		if (sf > 0.0f) {
			float t = rintf(vals[k] / sf);
			q = t > (float)qmax ? qmax : t < (float)-qmax ? -qmax : (int)t;
		}
		uint32_t u = (uint32_t)(q + (1 << (w - 1))), bit = k * w;
		/* a field of <= 8 bits spans at most two bytes */
		f[bit >> 3] |= (uint8_t)(u << (bit & 7));
		if ((bit & 7) + w > 8)
			f[(bit >> 3) + 1] |= (uint8_t)(u >> (8 - (bit & 7)));
	}
}

/* Field k of a quantized row, decoded (exact in float). */
static inline float dequant_field(const uint8_t *row, float sf, uint32_t k,
				  uint32_t w)
{
	const uint8_t *f = row + 2;
	uint32_t bit = k * w, lo = bit >> 3, sh = bit & 7;
	uint32_t u = (uint32_t)f[lo] >> sh;
	if (sh + w > 8)
		u |= (uint32_t)f[lo + 1] << (8 - sh);
	u &= (1u << w) - 1;
	return (float)((int)u - (1 << (w - 1))) * sf;
}

/* Pack vector i of the rotated rows @xr according to the group mask @sel. */
static void pack_vector(struct mkv_segment *s, size_t i, const float *xr,
			const uint8_t *sel, float *vals)
{
	const struct mkv_packed_view *v = &s->v;
	uint32_t ng = v->d_keep / v->g, k = 0;
	uint8_t *bm = s->bitmaps + i * v->bitmap_bytes;
	for (uint32_t j = 0; j < ng; j++) {
		if (!sel[j])
			continue;
		bm[j >> 3] |= (uint8_t)(1u << (j & 7));
		for (uint32_t t = 0; t < v->g; t++)
			vals[k++] = xr[j * v->g + t];
	}
	char *row = (char *)s->values + i * v->row_bytes;
	if (v->value_bits)
		quantize_row(row, vals, v->r, v->value_bits);
	else
		mkv_store(row, vals, v->store_dtype, v->r);
}

static void group_energy(const float *xr, uint32_t d_keep, uint32_t g,
			 float *e)
{
	for (uint32_t j = 0; j < d_keep / g; j++) {
		float acc = 0.0f;
		for (uint32_t t = 0; t < g; t++)
			acc += xr[j * g + t] * xr[j * g + t];
		e[j] = acc;
	}
}

/* The global mask: the r/g groups of largest total energy over the
 * segment, found in a pass of its own before anything is packed; @P is
 * the encoder's projection. */
static void global_mask(struct mkv_segment *s, const float *P, const void *x,
			enum mkv_dtype dt, float *buf, float *xr, uint8_t *sel)
{
	const struct mkv_packed_view *v = &s->v;
	uint32_t ng = v->d_keep / v->g, d = v->d;
	double tot[MKV_MAX_D] = {0};
	float e[MKV_MAX_D], tmp[MKV_MAX_D];
	for (size_t i0 = 0; i0 < v->n; i0 += ENC_CHUNK) {
		size_t m = v->n - i0 < ENC_CHUNK ? v->n - i0 : ENC_CHUNK;
		load_rows(buf, x, dt, i0, m, d);
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m,
			    (int)v->d_keep, (int)d, 1.0f, buf, (int)d, P,
			    (int)d, 0.0f, xr, (int)v->d_keep);
		for (size_t i = 0; i < m; i++) {
			group_energy(xr + i * v->d_keep, v->d_keep, v->g, e);
			for (uint32_t j = 0; j < ng; j++)
				tot[j] += e[j];
		}
	}
	for (uint32_t j = 0; j < ng; j++)
		e[j] = (float)tot[j];
	mkv_topk_mask(e, ng, v->r / v->g, sel, tmp);
}

/* Select and pack rows [i0, i0+m) whose rotated form is in @xr; @gsel is
 * the global mask, or NULL for per-vector selection. */
static void encode_rows(struct mkv_segment *s, const float *xr, size_t i0,
			size_t m, const uint8_t *gsel)
{
	const struct mkv_packed_view *v = &s->v;
	uint32_t ng = v->d_keep / v->g, kg = v->r / v->g;
	float e[MKV_MAX_D], tmp[MKV_MAX_D], vals[MKV_MAX_D];
	uint8_t sel[MKV_MAX_D];
	for (size_t i = 0; i < m; i++) {
		const float *row = xr + i * v->d_keep;
		if (!gsel) {
			group_energy(row, v->d_keep, v->g, e);
			mkv_topk_mask(e, ng, kg, sel, tmp);
		}
		pack_vector(s, i0 + i, row, gsel ? gsel : sel, vals);
	}
}

static void store_rest(struct mkv_segment *s, size_t block, float rest)
{
	if (s->v.store_dtype == MKV_DTYPE_F32)
		((float *)s->sum_rest)[block] = rest;
	else
		((uint16_t *)s->sum_rest)[block] = mkv_f32_to_bf16_up(rest);
}

/* Block min/max over the first S exact rotated channels, rounded outward
 * when stored in bf16 so the bounds stay bounds, and the largest remainder
 * norm.  Rows [i0, i0+m) are in @x (original) and @xr (rotated); i0 is a
 * multiple of b. */
static void encode_summaries(struct mkv_segment *s, const float *x,
			     const float *xr, size_t i0, size_t m)
{
	const struct mkv_packed_view *v = &s->v;
	uint32_t S = v->summary_channels;
	float mn[MKV_MAX_D], mx[MKV_MAX_D];
	for (size_t r0 = 0; r0 < m; r0 += v->b) {
		size_t r1 = r0 + v->b < m ? r0 + v->b : m;
		float rest = 0.0f;
		for (size_t i = r0; i < r1; i++)
			rest = fmaxf(rest, mkv_key_rest_norm(x + i * v->d, v->d,
						     xr + i * v->d_keep, S));
		store_rest(s, (i0 + r0) / v->b, rest);
		for (uint32_t c = 0; c < S; c++)
			mn[c] = mx[c] = xr[r0 * v->d_keep + c];
		for (size_t i = r0 + 1; i < r1; i++)
			for (uint32_t c = 0; c < S; c++) {
				float e = xr[i * v->d_keep + c];
				mn[c] = e < mn[c] ? e : mn[c];
				mx[c] = e > mx[c] ? e : mx[c];
			}
		size_t off = (i0 + r0) / v->b * S;
		if (v->store_dtype == MKV_DTYPE_F32) {
			memcpy((float *)s->sum_min + off, mn, sizeof(float) * S);
			memcpy((float *)s->sum_max + off, mx, sizeof(float) * S);
		} else {
			for (uint32_t c = 0; c < S; c++) {
				((uint16_t *)s->sum_min)[off + c] = mkv_f32_to_bf16_down(mn[c]);
				((uint16_t *)s->sum_max)[off + c] = mkv_f32_to_bf16_up(mx[c]);
			}
		}
	}
}

/* @o: options already made full by encode_opts_full. */
static int encode_opts_check(const struct mkv_encode_opts *o, enum mkv_dtype dt,
			     size_t n, uint32_t *d_keep, uint32_t *S)
{
	if (o->size != sizeof(*o) || !mkv_dtype_valid(dt))
		return -EINVAL;
	if (!mkv_d_valid(o->d) || o->drop > 1 || o->rotate > 1)
		return -EINVAL;
	if (o->select != MKV_SELECT_PER_VECTOR && o->select != MKV_SELECT_GLOBAL)
		return -EINVAL;
	if (!o->rotate && o->rotation)
		return -EINVAL;
	*d_keep = mkv_d_keep(o->d, o->drop);
	*S = 0;
	if (o->kind == MKV_KIND_KEY) {
		*S = o->summary_channels ? o->summary_channels
					 : (o->r < *d_keep ? o->r : *d_keep);
		if (*S > *d_keep)
			return -EINVAL;
	} else if (o->summary_channels) {
		return -EINVAL;
	}
	if (n == 0 || n > MKV_MAX_N ||
	    !shape_valid((uint32_t)n, o->d, *d_keep, o->r, o->g, o->b, *S,
			 o->kind, o->store_dtype, o->value_bits))
		return -EINVAL;
	return 0;
}

int mkv_segment_encode(const struct mkv_encode_opts *oin, const void *x,
		       enum mkv_dtype dt, size_t n, struct mkv_segment **out)
{
	uint32_t d_keep, S;
	struct mkv_encode_opts full;
	if (!oin || !x || !out || !encode_opts_full(oin, &full))
		return -EINVAL;
	const struct mkv_encode_opts *o = &full;
	int rc = encode_opts_check(o, dt, n, &d_keep, &S);
	if (rc)
		return rc;
	uint32_t d = o->d;
	struct mkv_packed_view v;
	view_init(&v, (uint32_t)n, d, d_keep, o->r, o->g, o->b, S, o->kind,
		  o->store_dtype, o->rotate, o->value_bits);

	float *buf = malloc(sizeof(float) * ENC_CHUNK * d);
	float *xr = malloc(sizeof(float) * ENC_CHUNK * d_keep);
	float *R = malloc(sizeof(float) * d_keep * d);
	struct mkv_segment *s = seg_alloc(&v);
	uint8_t gsel[MKV_MAX_D];
	rc = -ENOMEM;
	if (!buf || !xr || !R || !s)
		goto fail;
	rc = encode_rotation(o, x, dt, n, d_keep, R, buf);
	if (rc)
		goto fail;
	mkv_store(s->rotation, R, v.store_dtype, (size_t)d_keep * d);
	seg_expand_rotation(s);
	/* R's buffer now holds the projection: the stored rotation is the
	 * rounded one, and decoding multiplies by it (mkv_rot_projection). */
	if ((rc = mkv_rot_projection(s->rot_f32, d_keep, d, R)))
		goto fail;
	if (o->select == MKV_SELECT_GLOBAL)
		global_mask(s, R, x, dt, buf, xr, gsel);
	for (size_t i0 = 0; i0 < n; i0 += ENC_CHUNK) {
		size_t m = n - i0 < ENC_CHUNK ? n - i0 : ENC_CHUNK;
		load_rows(buf, x, dt, i0, m, d); /* checked finite above */
		/* X' = X Pᵀ: X' R is X's projection onto the stored rows. */
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m,
			    (int)d_keep, (int)d, 1.0f, buf, (int)d, R,
			    (int)d, 0.0f, xr, (int)d_keep);
		encode_rows(s, xr, i0, m, o->select == MKV_SELECT_GLOBAL ? gsel : NULL);
		if (o->kind == MKV_KIND_KEY)
			encode_summaries(s, buf, xr, i0, m);
	}
	free(buf);
	free(xr);
	free(R);
	*out = s;
	return 0;
fail:
	free(buf);
	free(xr);
	free(R);
	mkv_segment_destroy(s);
	return rc;
}

int mkv_segment_view(const struct mkv_segment *s, struct mkv_packed_view *v)
{
	if (!s || !v)
		return -EINVAL;
	*v = s->v;
	return 0;
}

int mkv_segment_bytes(const struct mkv_segment *s, struct mkv_segment_bytes *b)
{
	if (!s || !b)
		return -EINVAL;
	struct seg_sizes z = seg_sizes(&s->v);
	b->values = z.values;
	b->bitmaps = z.bitmaps;
	b->rotation = z.rotation;
	b->summaries = 2 * z.summary + z.rest;
	b->total = b->values + b->bitmaps + b->rotation + b->summaries;
	b->dense = (size_t)s->v.n * s->v.d * 2;
	return 0;
}

/*
 * The values of packed row @row / @bm with g = 1, in channel order: @put
 * (inlined: a constant at every call) gets each channel and value.  The
 * fields are read in order, so a bit reader takes them one after the
 * other instead of locating each from its index, and bf16 values convert
 * in place.  Returns false (nothing visited) for the formats it does not
 * walk: g > 1, or unquantized values that are not bf16.
 */
static inline bool g1_walk(const struct mkv_packed_view *v, const uint8_t *row,
			   const uint8_t *bm, void (*put)(void *, uint32_t, float), void *ctx)
{
	const uint32_t w = v->value_bits;
	if (v->g != 1 || (!w && v->store_dtype != MKV_DTYPE_BF16))
		return false;
	if (w) {
		uint16_t sb;
		memcpy(&sb, row, 2);
		const float sf = mkv_bf16_to_f32(sb);
		const uint8_t *p = row + 2;
		const uint32_t mask = (1u << w) - 1;
		const int bias = 1 << (w - 1);
		uint32_t acc = 0, nb = 0;
		for (uint32_t byte = 0; byte < v->bitmap_bytes; byte++) {
			unsigned bits = bm[byte];
			while (bits) {
				uint32_t j = byte * 8 + (uint32_t)__builtin_ctz(bits);
				bits &= bits - 1;
				/* w <= 8: one byte more always covers a field
				 * (and never reads past the row's last one) */
				if (nb < w) {
					acc |= (uint32_t)*p++ << nb;
					nb += 8;
				}
				put(ctx, j, (float)((int)(acc & mask) - bias) * sf);
				acc >>= w;
				nb -= w;
			}
		}
		return true;
	}
	const uint8_t *p = row;
	for (uint32_t byte = 0; byte < v->bitmap_bytes; byte++) {
		unsigned bits = bm[byte];
		while (bits) {
			uint32_t j = byte * 8 + (uint32_t)__builtin_ctz(bits);
			uint16_t h;
			bits &= bits - 1;
			memcpy(&h, p, 2);
			p += 2;
			put(ctx, j, mkv_bf16_to_f32(h));
		}
	}
	return true;
}

static inline void put_store(void *ctx, uint32_t j, float x)
{
	((float *)ctx)[j] = x;
}

void packed_unpack_row(const struct mkv_packed_view *v, const void *vals,
		       const uint8_t *bms, size_t t, float *dst)
{
	const uint8_t *bm = bms + t * v->bitmap_bytes;
	const uint8_t *row = (const uint8_t *)vals + t * v->row_bytes;
	uint32_t k = 0, w = v->value_bits;
	memset(dst, 0, sizeof(float) * v->d_keep);
	/* g = 1 (the serving formats): most of the CPU attention's time */
	if (g1_walk(v, row, bm, put_store, dst))
		return;
	float sf = 0.0f;
	if (w) {
		uint16_t sb;
		memcpy(&sb, row, 2);
		sf = mkv_bf16_to_f32(sb);
	}
	for (uint32_t byte = 0; byte < v->bitmap_bytes; byte++) {
		unsigned bits = bm[byte];
		while (bits) {
			uint32_t j = byte * 8 + (uint32_t)__builtin_ctz(bits);
			bits &= bits - 1;
			for (uint32_t u = 0; u < v->g; u++, k++)
				dst[j * v->g + u] = w ? dequant_field(row, sf, k, w)
						      : mkv_elem(row, v->store_dtype, k);
		}
	}
}

/* packed_dot_row's accumulators: partial c % 8 of every head */
struct dot_acc {
	const float *qt;
	uint32_t nq;
	float (*p)[MKV_MAX_QHEADS];
};

static inline void put_dot(void *ctx, uint32_t j, float x)
{
	struct dot_acc *a = ctx;
	const float *q = a->qt + (size_t)j * a->nq;
	float *pp = a->p[j & 7];
	for (uint32_t h = 0; h < a->nq; h++)
		pp[h] += q[h] * x;
}

bool packed_dot_row(const struct mkv_packed_view *v, const void *vals, const uint8_t *bms,
		    size_t t, const float *qt, uint32_t nq, float *out)
{
	if (nq == 0 || nq > MKV_MAX_QHEADS)
		return false;
	float p[8][MKV_MAX_QHEADS];
	for (int u = 0; u < 8; u++)
		for (uint32_t h = 0; h < nq; h++)
			p[u][h] = 0.0f;
	struct dot_acc a = {qt, nq, p};
	if (!g1_walk(v, (const uint8_t *)vals + t * v->row_bytes, bms + t * v->bitmap_bytes,
		     put_dot, &a))
		return false;
	for (uint32_t h = 0; h < nq; h++)
		out[h] = ((p[0][h] + p[4][h]) + (p[1][h] + p[5][h])) +
			 ((p[2][h] + p[6][h]) + (p[3][h] + p[7][h]));
	return true;
}

struct blk_addr seg_block_addr(const struct mkv_segment *s, uint32_t block)
{
	size_t r0 = (size_t)block * s->v.b;
	return (struct blk_addr){
		(const char *)s->values + r0 * s->v.row_bytes,
		s->bitmaps + r0 * s->v.bitmap_bytes};
}

static void unpack_vector(const struct mkv_segment *s, size_t i, float *dst)
{
	packed_unpack_row(&s->v, s->values, s->bitmaps, i, dst);
}

int mkv_segment_decode(const struct mkv_segment *s, size_t first, size_t count,
		       enum mkv_space space, float *out)
{
	if (!s || !out || count == 0 || first >= s->v.n ||
	    count > s->v.n - first ||
	    (space != MKV_SPACE_ROTATED && space != MKV_SPACE_ORIGINAL))
		return -EINVAL;
	uint32_t dk = s->v.d_keep, d = s->v.d;
	if (space == MKV_SPACE_ROTATED) {
		for (size_t i = 0; i < count; i++)
			unpack_vector(s, first + i, out + i * dk);
		return 0;
	}
	float *tmp = malloc(sizeof(float) * count * dk);
	if (!tmp)
		return -ENOMEM;
	for (size_t i = 0; i < count; i++)
		unpack_vector(s, first + i, tmp + i * dk);
	/* x̂ = x̂' R */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)count, (int)d,
		    (int)dk, 1.0f, tmp, (int)dk, s->rot_f32, (int)d, 0.0f, out,
		    (int)d);
	free(tmp);
	return 0;
}

int mkv_segment_rotation(const struct mkv_segment *s, float *R)
{
	if (!s || !R)
		return -EINVAL;
	memcpy(R, s->rot_f32, sizeof(float) * s->v.d_keep * s->v.d);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Serialization.  Layout: header, then values, bitmaps, rotation, sum_min,
 * sum_max, sum_rest, each starting on a 16-byte boundary.  The checksum is
 * XXH3-64 over everything after the checksum field, seeded with XXH3-64 of
 * the header before it.  Version 1 (read, never written) had no value_bits
 * in its header and no sum_rest array. */

#define SEG_MAGIC "MKVSEG\r\n"
#define SEG_VERSION 2u

struct seg_hdr_v1 {
	char magic[8];
	uint32_t version;
	uint32_t hdr_size;
	uint32_t n, d, d_keep, r, g, b, summary_channels;
	uint32_t kind, store_dtype, rotated;
	uint64_t total_len;
	uint64_t checksum; /* last: everything before it is hashed */
};

struct seg_hdr {
	char magic[8];
	uint32_t version;
	uint32_t hdr_size;
	uint32_t n, d, d_keep, r, g, b, summary_channels;
	uint32_t kind, store_dtype, rotated;
	uint32_t value_bits, reserved; /* reserved: written 0 */
	uint64_t total_len;
	uint64_t checksum; /* last: everything before it is hashed */
};

#define SEG_ARRAYS 6

static size_t align16(size_t x)
{
	return (x + 15) & ~(size_t)15;
}

/* Offsets of the arrays after a header of @hdr bytes; @narr is 5 for
 * version 1 (no sum_rest). */
static size_t serialized_len(const struct mkv_packed_view *v, size_t hdr,
			     int narr, size_t off[SEG_ARRAYS])
{
	struct seg_sizes z = seg_sizes(v);
	size_t len[SEG_ARRAYS] = {z.values, z.bitmaps, z.rotation, z.summary,
				  z.summary, z.rest};
	size_t pos = align16(hdr);
	for (int i = 0; i < SEG_ARRAYS; i++) {
		off[i] = pos;
		if (i < narr)
			pos = align16(pos + len[i]);
	}
	return pos;
}

/* Every byte but the checksum field itself, padding included: a flipped
 * bit anywhere must be caught.  @ck is the checksum field's offset. */
static uint64_t seg_checksum(const void *buf, size_t len, size_t ck)
{
	uint64_t seed = XXH3_64bits(buf, ck);
	size_t h = ck + sizeof(uint64_t);
	return XXH3_64bits_withSeed((const char *)buf + h, len - h, seed);
}

int64_t mkv_segment_serialize(const struct mkv_segment *s, void *buf, size_t cap)
{
	if (!s)
		return -EINVAL;
	size_t off[SEG_ARRAYS];
	size_t len = serialized_len(&s->v, sizeof(struct seg_hdr), SEG_ARRAYS, off);
	if (!buf)
		return (int64_t)len;
	if (cap < len)
		return -ENOSPC;
	struct seg_sizes z = seg_sizes(&s->v);
	char *p = buf;
	memset(p, 0, len);
	struct seg_hdr h = {
		.version = SEG_VERSION,
		.hdr_size = sizeof(struct seg_hdr),
		.n = s->v.n, .d = s->v.d, .d_keep = s->v.d_keep, .r = s->v.r,
		.g = s->v.g, .b = s->v.b,
		.summary_channels = s->v.summary_channels,
		.kind = (uint32_t)s->v.kind,
		.store_dtype = (uint32_t)s->v.store_dtype,
		.rotated = s->v.rotated,
		.value_bits = s->v.value_bits,
		.total_len = len,
	};
	memcpy(h.magic, SEG_MAGIC, 8);
	memcpy(p, &h, sizeof(h));
	memcpy(p + off[0], s->values, z.values);
	memcpy(p + off[1], s->bitmaps, z.bitmaps);
	memcpy(p + off[2], s->rotation, z.rotation);
	if (s->v.kind == MKV_KIND_KEY) {
		memcpy(p + off[3], s->sum_min, z.summary);
		memcpy(p + off[4], s->sum_max, z.summary);
		memcpy(p + off[5], s->sum_rest, z.rest);
	}
	h.checksum = seg_checksum(p, len, offsetof(struct seg_hdr, checksum));
	memcpy(p, &h, sizeof(h));
	return (int64_t)len;
}

/* A stored vector must select exactly r/g groups and nothing past d_keep/g:
 * a bitmap that lies would make readers index past the values. */
static bool bitmaps_valid(const struct mkv_segment *s)
{
	const struct mkv_packed_view *v = &s->v;
	uint32_t ng = v->d_keep / v->g, want = v->r / v->g;
	for (size_t i = 0; i < v->n; i++) {
		const uint8_t *bm = s->bitmaps + i * v->bitmap_bytes;
		uint32_t cnt = 0;
		for (uint32_t byte = 0; byte < v->bitmap_bytes; byte++)
			cnt += (uint32_t)__builtin_popcount(bm[byte]);
		if (cnt != want)
			return false;
		if (ng % 8 && (bm[v->bitmap_bytes - 1] >> (ng % 8)))
			return false;
	}
	return true;
}

/* Quantized rows need a finite, non-negative scale; element rows finite
 * values.  The remainder bounds are finite and non-negative. */
static bool values_valid(const struct mkv_segment *s)
{
	const struct mkv_packed_view *v = &s->v;
	for (size_t i = 0; i < v->n; i++) {
		const char *row = (const char *)s->values + i * v->row_bytes;
		if (v->value_bits) {
			uint16_t sb;
			memcpy(&sb, row, 2);
			float sf = mkv_bf16_to_f32(sb);
			if (!isfinite(sf) || sf < 0.0f)
				return false;
			continue;
		}
		for (uint32_t k = 0; k < v->r; k++)
			if (!isfinite(mkv_elem(row, v->store_dtype, k)))
				return false;
	}
	for (size_t j = 0; v->kind == MKV_KIND_KEY && j < v->n_blocks; j++) {
		float r = mkv_elem(s->sum_rest, v->store_dtype, j);
		if (!isfinite(r) || r < 0.0f)
			return false;
	}
	return true;
}

int mkv_segment_deserialize(const void *buf, size_t len, struct mkv_segment **out)
{
	if (!buf || !out)
		return -EINVAL;
	struct seg_hdr h;
	struct seg_hdr_v1 h1;
	size_t ck;
	int narr;
	if (len < sizeof(h1))
		return -MKV_ECORRUPT;
	memcpy(&h1, buf, sizeof(h1));
	if (memcmp(h1.magic, SEG_MAGIC, 8))
		return -MKV_ECORRUPT;
	if (h1.version == 1) {
		if (h1.hdr_size != sizeof(h1))
			return -MKV_ECORRUPT;
		memset(&h, 0, sizeof(h));
		memcpy(h.magic, h1.magic, 8);
		h.version = 1;
		h.n = h1.n, h.d = h1.d, h.d_keep = h1.d_keep, h.r = h1.r;
		h.g = h1.g, h.b = h1.b, h.summary_channels = h1.summary_channels;
		h.kind = h1.kind, h.store_dtype = h1.store_dtype;
		h.rotated = h1.rotated;
		h.total_len = h1.total_len, h.checksum = h1.checksum;
		ck = offsetof(struct seg_hdr_v1, checksum);
		narr = 5;
	} else {
		if (len < sizeof(h))
			return -MKV_ECORRUPT;
		memcpy(&h, buf, sizeof(h));
		if (h.version != SEG_VERSION || h.hdr_size != sizeof(h) ||
		    h.reserved)
			return -MKV_ECORRUPT;
		ck = offsetof(struct seg_hdr, checksum);
		narr = SEG_ARRAYS;
	}
	if (h.total_len != len)
		return -MKV_ECORRUPT;
	if (h.kind > MKV_KIND_VALUE || h.store_dtype > MKV_DTYPE_BF16 ||
	    h.rotated > 1 ||
	    !shape_valid(h.n, h.d, h.d_keep, h.r, h.g, h.b, h.summary_channels,
			 (enum mkv_kind)h.kind, (enum mkv_dtype)h.store_dtype,
			 h.value_bits))
		return -MKV_ECORRUPT;
	struct mkv_packed_view v;
	view_init(&v, h.n, h.d, h.d_keep, h.r, h.g, h.b, h.summary_channels,
		  (enum mkv_kind)h.kind, (enum mkv_dtype)h.store_dtype, h.rotated,
		  h.value_bits);
	size_t off[SEG_ARRAYS];
	size_t hdr = h.version == 1 ? sizeof(h1) : sizeof(h);
	if (serialized_len(&v, hdr, narr, off) != len ||
	    seg_checksum(buf, len, ck) != h.checksum)
		return -MKV_ECORRUPT;
	struct mkv_segment *s = seg_alloc(&v);
	if (!s)
		return -ENOMEM;
	struct seg_sizes z = seg_sizes(&v);
	const char *p = buf;
	memcpy(s->values, p + off[0], z.values);
	memcpy(s->bitmaps, p + off[1], z.bitmaps);
	memcpy(s->rotation, p + off[2], z.rotation);
	if (v.kind == MKV_KIND_KEY) {
		memcpy(s->sum_min, p + off[3], z.summary);
		memcpy(s->sum_max, p + off[4], z.summary);
		if (narr == SEG_ARRAYS) /* version 1: zero, as allocated */
			memcpy(s->sum_rest, p + off[5], z.rest);
	}
	seg_expand_rotation(s);
	/* A checksum only proves the bytes are the ones written; refuse
	 * contents no encoder could have produced. */
	size_t nr = (size_t)v.d_keep * v.d;
	if (!bitmaps_valid(s) || !mkv_all_finite(s->rot_f32, nr) ||
	    !values_valid(s)) {
		mkv_segment_destroy(s);
		return -MKV_ECORRUPT;
	}
	*out = s;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Growable segments: the update buffer of a decode segment.  Rows arrive
 * one step at a time and are compressed at once with a fixed strategy
 * (rotation, r, g, b); the segment is readable by every reader of struct
 * mkv_segment between appends. */

int seg_grow_create(const struct mkv_encode_opts *oin, struct mkv_segment **out)
{
	uint32_t d_keep, S;
	struct mkv_encode_opts full;
	if (!oin || !out || !oin->rotation || !encode_opts_full(oin, &full))
		return -EINVAL;
	const struct mkv_encode_opts *o = &full;
	/* n = 1 validates everything but the length. */
	int rc = encode_opts_check(o, MKV_DTYPE_F32, 1, &d_keep, &S);
	if (rc)
		return rc;
	if (!mkv_all_finite(o->rotation, (size_t)d_keep * o->d))
		return -MKV_ENONFINITE;
	struct mkv_packed_view v;
	view_init(&v, o->b, o->d, d_keep, o->r, o->g, o->b, S, o->kind,
		  o->store_dtype, 1, o->value_bits);
	struct mkv_segment *s = seg_alloc(&v); /* capacity: one block */
	if (!s)
		return -ENOMEM;
	float *R = malloc(sizeof(float) * d_keep * o->d);
	if (!R) {
		mkv_segment_destroy(s);
		return -ENOMEM;
	}
	memcpy(R, o->rotation, sizeof(float) * d_keep * o->d);
	mkv_store(s->rotation, R, v.store_dtype, (size_t)d_keep * o->d);
	seg_expand_rotation(s);
	s->proj_f32 = R; /* owned by the segment from here */
	if ((rc = mkv_rot_projection(s->rot_f32, d_keep, o->d, R))) {
		mkv_segment_destroy(s);
		return rc;
	}
	s->proj_t = malloc(sizeof(float) * d_keep * o->d);
	if (!s->proj_t) {
		mkv_segment_destroy(s);
		return -ENOMEM;
	}
	mkv_transpose(R, d_keep, o->d, s->proj_t);
	s->v.n = 0;
	s->v.n_blocks = 0;
	*out = s;
	return 0;
}

/* Capacity in rows: the allocation made for v.n_blocks * b rows; tracked
 * through the block count the arrays were sized for. */
int seg_grow_reserve(struct mkv_segment *s, size_t rows, size_t *cap)
{
	if (rows <= *cap)
		return 0;
	size_t ncap = *cap ? *cap : s->v.b;
	while (ncap < rows)
		ncap *= 2;
	if (ncap > MKV_MAX_N)
		ncap = MKV_MAX_N;
	if (rows > ncap)
		return -ENOSPC;
	size_t es = mkv_dtype_size(s->v.store_dtype);
	size_t nb = (ncap + s->v.b - 1) / s->v.b;
	void *val = realloc(s->values, ncap * s->v.row_bytes);
	if (!val)
		return -ENOMEM;
	s->values = val;
	uint8_t *bm = realloc(s->bitmaps, ncap * s->v.bitmap_bytes);
	if (!bm)
		return -ENOMEM;
	s->bitmaps = bm;
	if (s->v.kind == MKV_KIND_KEY) {
		size_t sb = nb * s->v.summary_channels * es;
		void *mn = realloc(s->sum_min, sb);
		if (!mn)
			return -ENOMEM;
		s->sum_min = mn;
		void *mx = realloc(s->sum_max, sb);
		if (!mx)
			return -ENOMEM;
		s->sum_max = mx;
		void *re = realloc(s->sum_rest, nb * es);
		if (!re)
			return -ENOMEM;
		s->sum_rest = re;
	}
	s->v.values = s->values;
	s->v.bitmaps = s->bitmaps;
	s->v.sum_min = s->sum_min;
	s->v.sum_max = s->sum_max;
	s->v.sum_rest = s->sum_rest;
	*cap = ncap;
	return 0;
}

int seg_grow_append(struct mkv_segment *s, size_t *cap, const float *x,
		    size_t n, double *lost)
{
	if (!s || !cap || !x || n == 0)
		return -EINVAL;
	const struct mkv_packed_view *v = &s->v;
	if (!mkv_all_finite(x, n * v->d))
		return -MKV_ENONFINITE;
	if (v->n + n > MKV_MAX_N)
		return -ENOSPC;
	int rc = seg_grow_reserve(s, v->n + n, cap);
	if (rc)
		return rc;
	float xr[MKV_MAX_D], e[MKV_MAX_D], tmp[MKV_MAX_D], vals[MKV_MAX_D];
	uint8_t sel[MKV_MAX_D];
	uint32_t ng = v->d_keep / v->g, kg = v->r / v->g, S = v->summary_channels;
	for (size_t t = 0; t < n; t++) {
		size_t i = v->n;
		mkv_rotate_t(s->proj_t, v->d_keep, v->d, x + t * v->d, xr);
		group_energy(xr, v->d_keep, v->g, e);
		mkv_topk_mask(e, ng, kg, sel, tmp);
		if (lost) {
			double l = 0.0;
			for (uint32_t j = 0; j < ng; j++)
				l += sel[j] ? 0.0 : (double)e[j];
			*lost += l;
		}
		memset(s->bitmaps + i * v->bitmap_bytes, 0, v->bitmap_bytes);
		pack_vector(s, i, xr, sel, vals);
		if (v->kind == MKV_KIND_KEY) {
			/* Widen the current block's bounds; a new block
			 * starts at this row's values. */
			size_t off = i / v->b * S;
			bool first = i % v->b == 0;
			for (uint32_t c = 0; c < S; c++) {
				float lo = first ? xr[c] : fminf(xr[c], mkv_elem(s->sum_min, v->store_dtype, off + c));
				float hi = first ? xr[c] : fmaxf(xr[c], mkv_elem(s->sum_max, v->store_dtype, off + c));
				if (v->store_dtype == MKV_DTYPE_F32) {
					((float *)s->sum_min)[off + c] = lo;
					((float *)s->sum_max)[off + c] = hi;
				} else {
					((uint16_t *)s->sum_min)[off + c] = mkv_f32_to_bf16_down(lo);
					((uint16_t *)s->sum_max)[off + c] = mkv_f32_to_bf16_up(hi);
				}
			}
			float rest = mkv_key_rest_norm(x + t * v->d, v->d, xr, S);
			if (!first)
				rest = fmaxf(rest, mkv_elem(s->sum_rest, v->store_dtype, i / v->b));
			store_rest(s, i / v->b, rest);
		}
		s->v.n++;
		s->v.n_blocks = (s->v.n + v->b - 1) / v->b;
	}
	return 0;
}

void seg_strip(struct mkv_segment *s)
{
	if (!s)
		return;
	free(s->values);
	free(s->bitmaps);
	s->values = NULL;
	s->bitmaps = NULL;
	s->v.values = NULL;
	s->v.bitmaps = NULL;
}
