/* SPDX-License-Identifier: MIT */
/* Element-type conversions.  Done by bit manipulation so that results do not
 * depend on the compiler's _Float16 support or the FPU rounding mode. */
#include <math.h>
#include <string.h>
#include "internal.h"

bool mkv_dtype_valid(enum mkv_dtype dt)
{
	return dt == MKV_DTYPE_F32 || dt == MKV_DTYPE_F16 || dt == MKV_DTYPE_BF16;
}

size_t mkv_dtype_size(enum mkv_dtype dt)
{
	switch (dt) {
	case MKV_DTYPE_F32:
		return 4;
	case MKV_DTYPE_F16:
	case MKV_DTYPE_BF16:
		return 2;
	}
	return 0;
}

static inline uint32_t f2u(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static inline float u2f(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

uint16_t mkv_f32_to_bf16(float f)
{
	uint32_t u = f2u(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a quiet NaN */
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

/* Truncation rounds toward zero; step one ulp away from zero when that is
 * the wrong direction and bits were lost. */
uint16_t mkv_f32_to_bf16_down(float f)
{
	uint32_t u = f2u(f);
	uint16_t h = (uint16_t)(u >> 16);
	if ((u & 0xffffu) && (u & 0x80000000u))
		h++; /* negative: truncation rounded up; go one further down */
	return h;
}

uint16_t mkv_f32_to_bf16_up(float f)
{
	uint32_t u = f2u(f);
	uint16_t h = (uint16_t)(u >> 16);
	if ((u & 0xffffu) && !(u & 0x80000000u))
		h++;
	return h;
}

float mkv_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu;
	uint32_t man = h & 0x3ffu;
	if (exp == 0) {
		/* zero or subnormal: value = man * 2^-24 */
		float v = (float)man * 0x1p-24f;
		return sign ? -v : v;
	}
	if (exp == 31)
		return u2f(sign | 0x7f800000u | (man << 13));
	return u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t mkv_f32_to_f16(float f)
{
	uint32_t u = f2u(f);
	uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
	float a = fabsf(f);
	if (isnan(f))
		return sign | 0x7e00u;
	if (a >= 65520.0f)
		return sign | 0x7c00u;
	if (a < 0x1p-14f) {
		/* subnormal: round a * 2^24 to nearest even integer */
		float m = nearbyintf(a * 0x1p24f);
		return sign | (uint16_t)m;
	}
	uint32_t au = f2u(a);
	uint32_t exp = (au >> 23) - 112u;
	uint32_t man = au & 0x7fffffu;
	uint32_t h = (exp << 10) | (man >> 13);
	uint32_t rem = man & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
		h++;
	return sign | (uint16_t)h;
}

bool mkv_all_finite(const float *x, size_t n)
{
	/* An exponent of all ones marks both NaN and Inf. */
	uint32_t bad = 0;
	for (size_t i = 0; i < n; i++)
		bad |= ((f2u(x[i]) & 0x7f800000u) == 0x7f800000u);
	return !bad;
}

bool mkv_load_f32(float *dst, const void *src, enum mkv_dtype dt, size_t n)
{
	switch (dt) {
	case MKV_DTYPE_F32:
		memcpy(dst, src, n * sizeof(float));
		break;
	case MKV_DTYPE_BF16: {
		const uint16_t *s = src;
		for (size_t i = 0; i < n; i++)
			dst[i] = mkv_bf16_to_f32(s[i]);
		break;
	}
	case MKV_DTYPE_F16: {
		const uint16_t *s = src;
		for (size_t i = 0; i < n; i++)
			dst[i] = mkv_f16_to_f32(s[i]);
		break;
	}
	default:
		return false;
	}
	return mkv_all_finite(dst, n);
}

void mkv_store(void *dst, const float *src, enum mkv_dtype dt, size_t n)
{
	if (dt == MKV_DTYPE_F32) {
		memcpy(dst, src, n * sizeof(float));
		return;
	}
	uint16_t *d = dst;
	if (dt == MKV_DTYPE_BF16)
		for (size_t i = 0; i < n; i++)
			d[i] = mkv_f32_to_bf16(src[i]);
	else
		for (size_t i = 0; i < n; i++)
			d[i] = mkv_f32_to_f16(src[i]);
}
