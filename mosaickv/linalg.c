/* SPDX-License-Identifier: MIT */
/* Covariance, eigen-decomposition and top-k masks for the compression core. */
#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

/* Rows per SYRK call.  The float partial product over this many rows keeps
 * ~6 significant digits; the running sum is double so long segments do not
 * lose precision as they grow. */
#define COV_CHUNK 512

int mkv_cov_accumulate(double *cov, const float *x, size_t n, uint32_t d)
{
	float *tmp = malloc(sizeof(float) * d * d);
	if (!tmp)
		return -ENOMEM;
	for (size_t i0 = 0; i0 < n; i0 += COV_CHUNK) {
		size_t m = n - i0 < COV_CHUNK ? n - i0 : COV_CHUNK;
		cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)d, (int)m,
			    1.0f, x + i0 * d, (int)d, 0.0f, tmp, (int)d);
		for (uint32_t a = 0; a < d; a++)
			for (uint32_t b = a; b < d; b++) {
				double v = tmp[a * d + b];
				cov[a * d + b] += v;
				if (b != a)
					cov[b * d + a] += v;
			}
	}
	free(tmp);
	return 0;
}

int mkv_eigen_rows(const double *cov, uint32_t d, float *R, double *eig)
{
	double *a = malloc(sizeof(double) * d * d);
	double *w = malloc(sizeof(double) * d);
	if (!a || !w) {
		free(a);
		free(w);
		return -ENOMEM;
	}
	memcpy(a, cov, sizeof(double) * d * d);
	/* Divide and conquer: the fastest LAPACK symmetric solver at d <= 256
	 * when all eigenvectors are wanted. */
	lapack_int info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', (lapack_int)d,
					 a, (lapack_int)d, w);
	if (info != 0) {
		free(a);
		free(w);
		return info < 0 ? -EINVAL : -MKV_ELAPACK;
	}
	/* Eigenvalues come ascending, vectors as columns.  Emit rows, largest
	 * first, each signed so its largest-magnitude component is positive:
	 * the rotation is then a deterministic function of the data. */
	for (uint32_t i = 0; i < d; i++) {
		uint32_t col = d - 1 - i;
		uint32_t arg = 0;
		double big = -1.0;
		for (uint32_t c = 0; c < d; c++) {
			double v = fabs(a[c * d + col]);
			if (v > big) {
				big = v;
				arg = c;
			}
		}
		double sgn = a[arg * d + col] < 0 ? -1.0 : 1.0;
		for (uint32_t c = 0; c < d; c++)
			R[i * d + c] = (float)(sgn * a[c * d + col]);
		if (eig)
			eig[i] = w[col];
	}
	free(a);
	free(w);
	return 0;
}

/* k-th largest (1-based) of v[0..m) by quickselect with a three-way
 * partition, so runs of equal energies (zeros, most often) cannot stall it.
 * v is reordered. */
static float kth_largest(float *v, uint32_t m, uint32_t k)
{
	uint32_t lo = 0, hi = m, want = k - 1;
	while (hi - lo > 1) {
		float p = v[lo + (hi - lo) / 2];
		uint32_t lt = lo, i = lo, gt = hi;
		/* [lo,lt) > p, [lt,i) == p, [gt,hi) < p */
		while (i < gt) {
			float t = v[i];
			if (t > p) {
				v[i++] = v[lt];
				v[lt++] = t;
			} else if (t < p) {
				v[i] = v[--gt];
				v[gt] = t;
			} else {
				i++;
			}
		}
		if (want < lt)
			hi = lt;
		else if (want >= gt)
			lo = gt;
		else
			return p;
	}
	return v[lo];
}

void mkv_topk_mask(const float *e, uint32_t m, uint32_t k, uint8_t *sel,
		   float *tmp)
{
	if (k >= m) {
		memset(sel, 1, m);
		return;
	}
	memset(sel, 0, m);
	if (k == 0)
		return;
	memcpy(tmp, e, sizeof(float) * m);
	float t = kth_largest(tmp, m, k);
	uint32_t taken = 0;
	for (uint32_t j = 0; j < m; j++)
		if (e[j] > t) {
			sel[j] = 1;
			taken++;
		}
	for (uint32_t j = 0; j < m && taken < k; j++)
		if (e[j] == t) {
			sel[j] = 1;
			taken++;
		}
}

bool mkv_d_valid(uint32_t d)
{
	return d == 64 || d == 128 || d == 256;
}

bool mkv_g_valid(uint32_t g)
{
	return g == 1 || g == 2 || g == 4 || g == 8;
}

bool mkv_b_valid(uint32_t b)
{
	return b == 8 || b == 16 || b == 32 || b == 64;
}
