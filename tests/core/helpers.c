/* SPDX-License-Identifier: MIT */
/* Test helpers: see helpers.h.  Deliberately written without looking at the
 * library's own conversions, so that a shared mistake is unlikely. */
#include "helpers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- RNG ----------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t th_seed(void)
{
	static uint64_t counter;
	static bool have_env;
	static uint64_t env_seed;
	static bool checked;

	if (!checked) {
		const char *e = getenv("MKV_TEST_SEED");
		checked = true;
		if (e && *e) {
			env_seed = strtoull(e, NULL, 0);
			have_env = true;
		}
	}
	if (have_env)
		return env_seed + counter++;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^
		     ((uint64_t)getpid() << 32) ^ (++counter * 0x9e3779b97f4a7c15ull);
	return splitmix64(&x) & 0xffffffffffffull; /* short enough to type */
}

void th_rng_init(struct th_rng *g, uint64_t seed)
{
	uint64_t x = seed;
	for (int i = 0; i < 4; i++)
		g->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

uint64_t th_u64(struct th_rng *g)
{
	uint64_t *s = g->s;
	uint64_t result = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return result;
}

double th_uniform(struct th_rng *g)
{
	return (double)(th_u64(g) >> 11) * 0x1p-53;
}

double th_normal(struct th_rng *g)
{
	double u1 = th_uniform(g), u2 = th_uniform(g);
	if (u1 < 1e-300)
		u1 = 1e-300;
	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint32_t th_below(struct th_rng *g, uint32_t n)
{
	return (uint32_t)(th_uniform(g) * n);
}

/* ---- element types ------------------------------------------------------- */

static float bits2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint32_t f2bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

/* Round @x to a multiple of 2^e, nearest-even (nearbyint in the default
 * rounding mode). */
static double round_to_pow2(double x, int e)
{
	return nearbyint(ldexp(x, -e)) * ldexp(1.0, e);
}

uint16_t th_f32_to_bf16(float f)
{
	if (f == 0.0f)
		return (uint16_t)(f2bits(f) >> 16);
	int ex;
	frexp((double)f, &ex); /* |f| = m 2^ex, m in [0.5, 1) */
	int e = ex - 1;        /* |f| in [2^e, 2^(e+1)) */
	if (e < -126)
		e = -126;
	double r = round_to_pow2((double)f, e - 7); /* 8 significant bits */
	float rf = (float)r;                        /* exact */
	return (uint16_t)(f2bits(rf) >> 16);
}

float th_bf16_to_f32(uint16_t h)
{
	return bits2f((uint32_t)h << 16);
}

uint16_t th_f32_to_f16(float f)
{
	double a = fabs((double)f);
	uint16_t sign = signbit(f) ? 0x8000u : 0;
	if (a == 0.0)
		return sign;
	int ex;
	frexp(a, &ex);
	int e = ex - 1;
	if (e < -14) {
		/* subnormal: multiples of 2^-24 */
		double m = nearbyint(ldexp(a, 24));
		return sign | (uint16_t)m; /* m == 1024 is the smallest normal */
	}
	double m = nearbyint(ldexp(a, 10 - e)); /* in [1024, 2048] */
	if (m >= 2048.0) {
		m = 1024.0;
		e++;
	}
	return sign | (uint16_t)(((unsigned)(e + 15) << 10) | ((unsigned)m - 1024u));
}

float th_f16_to_f32(uint16_t h)
{
	int e = (h >> 10) & 0x1f;
	int m = h & 0x3ff;
	double v;
	if (e == 0)
		v = ldexp((double)m, -24);
	else if (e == 31)
		v = m ? NAN : INFINITY;
	else
		v = ldexp((double)(m + 1024), e - 25);
	return (float)((h & 0x8000u) ? -v : v);
}

size_t th_dtype_size(enum mkv_dtype dt)
{
	return dt == MKV_DTYPE_F32 ? 4 : 2;
}

const char *th_dtype_name(enum mkv_dtype dt)
{
	switch (dt) {
	case MKV_DTYPE_F32:
		return "f32";
	case MKV_DTYPE_F16:
		return "f16";
	case MKV_DTYPE_BF16:
		return "bf16";
	}
	return "?";
}

void th_encode_dt(const float *src, size_t n, enum mkv_dtype dt, void *dst,
		  double *ref)
{
	for (size_t i = 0; i < n; i++) {
		switch (dt) {
		case MKV_DTYPE_F32:
			((float *)dst)[i] = src[i];
			break;
		case MKV_DTYPE_F16:
			((uint16_t *)dst)[i] = th_f32_to_f16(src[i]);
			break;
		case MKV_DTYPE_BF16:
			((uint16_t *)dst)[i] = th_f32_to_bf16(src[i]);
			break;
		}
		if (ref)
			ref[i] = th_elem(dst, dt, i);
	}
}

double th_elem(const void *p, enum mkv_dtype dt, size_t i)
{
	switch (dt) {
	case MKV_DTYPE_F32:
		return ((const float *)p)[i];
	case MKV_DTYPE_F16:
		return th_f16_to_f32(((const uint16_t *)p)[i]);
	case MKV_DTYPE_BF16:
		return th_bf16_to_f32(((const uint16_t *)p)[i]);
	}
	return NAN;
}

void *th_alloc(size_t bytes)
{
	void *p = calloc(1, bytes ? bytes : 1);
	if (!p) {
		fprintf(stderr, "test: out of memory (%zu bytes)\n", bytes);
		abort();
	}
	return p;
}

/* ---- references ---------------------------------------------------------- */

void th_attention(uint32_t nq, uint32_t d, double scale, const double *q,
		  const double *k, const double *v, size_t n, double *out)
{
	double *s = th_alloc(n * sizeof *s);
	for (uint32_t h = 0; h < nq; h++) {
		const double *qh = q + (size_t)h * d;
		double m = -INFINITY;
		for (size_t i = 0; i < n; i++) {
			double acc = 0;
			for (uint32_t c = 0; c < d; c++)
				acc += qh[c] * k[i * d + c];
			s[i] = acc * scale;
			if (s[i] > m)
				m = s[i];
		}
		double z = 0;
		double *o = out + (size_t)h * d;
		memset(o, 0, d * sizeof *o);
		for (size_t i = 0; i < n; i++) {
			double w = exp(s[i] - m);
			z += w;
			for (uint32_t c = 0; c < d; c++)
				o[c] += w * v[i * d + c];
		}
		for (uint32_t c = 0; c < d; c++)
			o[c] /= z;
	}
	free(s);
}

double th_rel_err_fd(const float *a, const double *b, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		double e = (double)a[i] - b[i];
		num += e * e;
		den += b[i] * b[i];
	}
	return sqrt(num) / sqrt(den);
}

double th_rel_err_dd(const double *a, const double *b, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		double e = a[i] - b[i];
		num += e * e;
		den += b[i] * b[i];
	}
	return sqrt(num) / sqrt(den);
}

static int cmp_desc(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x < y) - (x > y);
}

void th_sym_eigvals(const double *a_in, uint32_t d, double *eig)
{
	double *a = th_alloc((size_t)d * d * sizeof *a);
	memcpy(a, a_in, (size_t)d * d * sizeof *a);
	for (int sweep = 0; sweep < 100; sweep++) {
		double off = 0, diag = 0;
		for (uint32_t p = 0; p < d; p++) {
			diag += a[p * d + p] * a[p * d + p];
			for (uint32_t q = p + 1; q < d; q++)
				off += a[p * d + q] * a[p * d + q];
		}
		if (off <= 1e-30 * diag)
			break;
		for (uint32_t p = 0; p < d; p++) {
			for (uint32_t q = p + 1; q < d; q++) {
				double apq = a[p * d + q];
				if (fabs(apq) < 1e-300)
					continue;
				double app = a[p * d + p], aqq = a[q * d + q];
				double theta = (aqq - app) / (2 * apq);
				double t = (theta >= 0 ? 1.0 : -1.0) /
					   (fabs(theta) + sqrt(theta * theta + 1));
				double c = 1 / sqrt(t * t + 1), s = t * c;
				for (uint32_t k = 0; k < d; k++) {
					double akp = a[k * d + p], akq = a[k * d + q];
					a[k * d + p] = c * akp - s * akq;
					a[k * d + q] = s * akp + c * akq;
				}
				for (uint32_t k = 0; k < d; k++) {
					double apk = a[p * d + k], aqk = a[q * d + k];
					a[p * d + k] = c * apk - s * aqk;
					a[q * d + k] = s * apk + c * aqk;
				}
			}
		}
	}
	for (uint32_t i = 0; i < d; i++)
		eig[i] = a[i * d + i];
	qsort(eig, d, sizeof *eig, cmp_desc);
	free(a);
}

void th_covariance(const double *x, size_t n, uint32_t d, double *cov)
{
	memset(cov, 0, (size_t)d * d * sizeof *cov);
	for (size_t i = 0; i < n; i++) {
		const double *xi = x + i * d;
		for (uint32_t a = 0; a < d; a++) {
			double xa = xi[a];
			for (uint32_t b = a; b < d; b++)
				cov[a * d + b] += xa * xi[b];
		}
	}
	for (uint32_t a = 0; a < d; a++)
		for (uint32_t b = 0; b < a; b++)
			cov[a * d + b] = cov[b * d + a];
}

void th_random_orthonormal(struct th_rng *g, uint32_t m, uint32_t d,
			   double *out)
{
	for (uint32_t i = 0; i < m; i++) {
		double *row = out + (size_t)i * d;
		for (;;) {
			for (uint32_t c = 0; c < d; c++)
				row[c] = th_normal(g);
			/* two passes of Gram-Schmidt for accuracy */
			for (int pass = 0; pass < 2; pass++) {
				for (uint32_t j = 0; j < i; j++) {
					const double *o = out + (size_t)j * d;
					double dot = 0;
					for (uint32_t c = 0; c < d; c++)
						dot += row[c] * o[c];
					for (uint32_t c = 0; c < d; c++)
						row[c] -= dot * o[c];
				}
			}
			double nn = 0;
			for (uint32_t c = 0; c < d; c++)
				nn += row[c] * row[c];
			if (nn > 1e-6) {
				nn = sqrt(nn);
				for (uint32_t c = 0; c < d; c++)
					row[c] /= nn;
				break;
			}
		}
	}
}

uint32_t th_popcount_bits(const uint8_t *p, uint32_t nbits)
{
	uint32_t c = 0;
	for (uint32_t j = 0; j < nbits; j++)
		c += th_bit(p, j);
	return c;
}

double th_view_value(const struct mkv_packed_view *v, size_t i, size_t k)
{
	const uint8_t *row = (const uint8_t *)v->values + i * v->row_bytes;
	if (!v->value_bits)
		return th_elem(row, v->store_dtype, k);
	uint32_t w = v->value_bits, u = 0;
	for (uint32_t t = 0; t < w; t++)
		u |= (uint32_t)th_bit(row + 2, (uint32_t)(k * w + t)) << t;
	double scale = th_bf16_to_f32((uint16_t)(row[0] | row[1] << 8));
	return (double)((int)u - (1 << (w - 1))) * scale;
}

void th_view_unpack(const struct mkv_packed_view *v, size_t i, double *out)
{
	const uint8_t *bm = v->bitmaps + i * v->bitmap_bytes;
	size_t k = 0;
	for (uint32_t j = 0; j < v->d_keep / v->g; j++) {
		for (uint32_t t = 0; t < v->g; t++) {
			double x = 0;
			if (th_bit(bm, j) && k < v->r)
				x = th_view_value(v, i, k++);
			out[j * v->g + t] = x;
		}
	}
}

void th_view_rotation(const struct mkv_packed_view *v, double *R)
{
	for (size_t i = 0; i < (size_t)v->d_keep * v->d; i++)
		R[i] = th_elem(v->rotation, v->store_dtype, i);
}

void th_view_reconstruct(const struct mkv_packed_view *v, double *out)
{
	double *R = th_alloc((size_t)v->d_keep * v->d * sizeof *R);
	double *xr = th_alloc(v->d_keep * sizeof *xr);
	th_view_rotation(v, R);
	for (size_t i = 0; i < v->n; i++) {
		th_view_unpack(v, i, xr);
		double *o = out + i * v->d;
		memset(o, 0, v->d * sizeof *o);
		for (uint32_t a = 0; a < v->d_keep; a++) {
			if (xr[a] == 0)
				continue;
			const double *ra = R + (size_t)a * v->d;
			for (uint32_t c = 0; c < v->d; c++)
				o[c] += xr[a] * ra[c];
		}
	}
	free(xr);
	free(R);
}

void th_gaussian(struct th_rng *g, float *x, size_t n, double sigma)
{
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(sigma * th_normal(g));
}

double th_frob_rel(const double *x, const float *y, size_t nd)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < nd; i++) {
		double e = x[i] - (double)y[i];
		num += e * e;
		den += x[i] * x[i];
	}
	return sqrt(num / den);
}
