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

int mkv_cov_accumulate_f64(double *cov, const float *x, size_t n, uint32_t d,
			   double *scratch)
{
	if (n == 1) {
		/* One row (every decoded token): the rank-1 update itself.
		 * SYRK over one row adds the same exact products to the same
		 * sums, each rounded once, so the bits are SYRK's; it spares
		 * the call's setup and the chunk's scratch, which cost the
		 * decode thread ~30 us a vector. */
		double xd[MKV_MAX_D];
		for (uint32_t a = 0; a < d; a++)
			xd[a] = x[a];
		for (uint32_t a = 0; a < d; a++) {
			const double xa = xd[a];
			double *c = cov + (size_t)a * d;
			for (uint32_t b = a; b < d; b++)
				c[b] += xa * xd[b];
		}
		return 0;
	}
	size_t rows = n < COV_CHUNK ? n : COV_CHUNK;
	double *xd = scratch ? scratch : malloc(sizeof(double) * rows * d);
	if (!xd)
		return -ENOMEM;
	for (size_t i0 = 0; i0 < n; i0 += COV_CHUNK) {
		size_t m = n - i0 < COV_CHUNK ? n - i0 : COV_CHUNK;
		for (size_t i = 0; i < m * d; i++)
			xd[i] = x[i0 * d + i];
		/* Products of floats are exact in double; only the sums round. */
		cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)d, (int)m,
			    1.0, xd, (int)d, 1.0, cov, (int)d);
	}
	if (xd != scratch)
		free(xd);
	return 0;
}

void mkv_transpose(const float *R, uint32_t m, uint32_t d, float *RT)
{
	for (uint32_t j = 0; j < m; j++)
		for (uint32_t i = 0; i < d; i++)
			RT[(size_t)i * m + j] = R[(size_t)j * d + i];
}

/* The rotation's body for blocks of @B outputs, whose accumulators stay
 * in registers while the channels stream by: 32 in SSE2's sixteen
 * registers, 64 in AVX2's.  Each output's order is the same for any @B. */
static inline __attribute__((always_inline)) void
rotate_t_body(const float *restrict RT, uint32_t m, uint32_t d, const float *restrict x,
	      float *restrict y, const uint32_t B)
{
	uint32_t j0 = 0;
	for (; j0 + B <= m; j0 += B) {
		float acc[64];
		for (uint32_t j = 0; j < B; j++)
			acc[j] = x[0] * RT[j0 + j];
		for (uint32_t i = 1; i < d; i++) {
			const float xi = x[i], *r = RT + (size_t)i * m + j0;
			for (uint32_t j = 0; j < B; j++)
				acc[j] += xi * r[j];
		}
		memcpy(y + j0, acc, sizeof(float) * B);
	}
	for (; j0 < m; j0++) {
		float a = x[0] * RT[j0];
		for (uint32_t i = 1; i < d; i++)
			a += x[i] * RT[(size_t)i * m + j0];
		y[j0] = a;
	}
}

/* 8-wide where the CPU has AVX2: the same multiplications and additions
 * in the same order (no FMA), so the same bits as the SSE2 build. */
__attribute__((target("avx2"))) static void rotate_t_avx2(const float *restrict RT, uint32_t m,
							   uint32_t d, const float *restrict x,
							   float *restrict y)
{
	rotate_t_body(RT, m, d, x, y, 64);
}

void mkv_rotate_t_sse2(const float *restrict RT, uint32_t m, uint32_t d,
		       const float *restrict x, float *restrict y)
{
	rotate_t_body(RT, m, d, x, y, 32);
}

void mkv_rotate_t(const float *restrict RT, uint32_t m, uint32_t d,
		  const float *restrict x, float *restrict y)
{
	if (__builtin_cpu_supports("avx2"))
		rotate_t_avx2(RT, m, d, x, y);
	else
		mkv_rotate_t_sse2(RT, m, d, x, y);
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

/*
 * Non-negative floats order like their bit patterns, so the k-th largest
 * energy can be found by building its bits from the top: keep a bit when at
 * least k elements are >= the prefix with it set.  31 fixed passes of a
 * branch-free, vectorisable count beat a quickselect on these short
 * (<= 256) vectors, whose data-dependent branches mispredict constantly.
 */
void mkv_topk_mask(const float *e, uint32_t m, uint32_t k, uint8_t *sel,
		   float *tmp)
{
	(void)tmp;
	if (k >= m) {
		memset(sel, 1, m);
		return;
	}
	memset(sel, 0, m);
	if (k == 0)
		return;
	uint32_t u[MKV_MAX_D];
	memcpy(u, e, sizeof(uint32_t) * m);
	/* c counts the elements >= t; once it is exactly k the prefix already
	 * separates the top k from the rest (usually after ~10 bits). */
	uint32_t t = 0, c = m;
	for (int bit = 30; bit >= 0 && c != k; bit--) {
		uint32_t cand = t | (1u << bit), cnt = 0;
		for (uint32_t j = 0; j < m; j++)
			cnt += u[j] >= cand;
		if (cnt >= k) {
			t = cand;
			c = cnt;
		}
	}
	uint32_t taken = 0;
	if (c == k) {
		for (uint32_t j = 0; j < m; j++)
			sel[j] = u[j] >= t;
		return;
	}
	/* t is the k-th largest value itself: take everything above it, then
	 * ties in index order. */
	for (uint32_t j = 0; j < m; j++) {
		sel[j] = u[j] > t;
		taken += sel[j];
	}
	for (uint32_t j = 0; j < m && taken < k; j++)
		if (u[j] == t) {
			sel[j] = 1;
			taken++;
		}
}

/* Sort non-negative floats descending, in place.  They order like their
 * bit patterns, so this is an integer sort: up to 256 elements (a
 * vector's group energies, sorted for every tracked vector), two radix
 * passes on the top 16 bits (exponent and 7 mantissa bits) and an
 * insertion pass for what those leave tied, which is little and local:
 * no data-dependent branch per comparison, ~3.5x faster than the
 * quicksort on 128 energies.  Otherwise (under 24 elements or over 256,
 * which no caller sorts) mkv_sort_desc_quick. */
static void sort_quick(uint32_t *a, uint32_t n)
{
	while (n > 24) {
		uint32_t p = a[n / 2], i = 0, j = n - 1;
		for (;;) {
			while (a[i] > p)
				i++;
			while (a[j] < p)
				j--;
			if (i >= j)
				break;
			uint32_t t = a[i];
			a[i++] = a[j];
			a[j--] = t;
		}
		/* recurse into the smaller side, loop on the larger */
		uint32_t left = j + 1;
		if (left < n - left) {
			sort_quick(a, left);
			a += left;
			n -= left;
		} else {
			sort_quick(a + left, n - left);
			n = left;
		}
	}
}

static void sort_insertion(uint32_t *a, uint32_t n)
{
	for (uint32_t i = 1; i < n; i++) {
		uint32_t x = a[i], j = i;
		for (; j > 0 && a[j - 1] < x; j--)
			a[j] = a[j - 1];
		a[j] = x;
	}
}

void mkv_sort_desc(float *v, uint32_t n)
{
	uint32_t *a = (uint32_t *)(void *)v;
	if (n > 24 && n <= 256) {
		uint32_t lo[256], hi[256], tmp[256];
		memset(lo, 0, sizeof(lo));
		memset(hi, 0, sizeof(hi));
		for (uint32_t i = 0; i < n; i++) {
			lo[(a[i] >> 16) & 255]++;
			hi[a[i] >> 24]++;
		}
		/* descending: bucket 255 first */
		uint32_t pl = 0, ph = 0;
		for (int k = 255; k >= 0; k--) {
			uint32_t t = lo[k];
			lo[k] = pl;
			pl += t;
			t = hi[k];
			hi[k] = ph;
			ph += t;
		}
		for (uint32_t i = 0; i < n; i++)
			tmp[lo[(a[i] >> 16) & 255]++] = a[i];
		for (uint32_t i = 0; i < n; i++)
			a[hi[tmp[i] >> 24]++] = tmp[i];
		sort_insertion(a, n);
	} else {
		mkv_sort_desc_quick(v, n);
	}
}

void mkv_sort_desc_quick(float *v, uint32_t n)
{
	uint32_t *a = (uint32_t *)(void *)v;
	sort_quick(a, n);
	sort_insertion(a, n);
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

/*
 * The encoder's projection for a stored rotation R (dk × d, rows meant to
 * be orthonormal): P = (R Rᵀ)⁻¹ R, so that the coefficients X' = X Pᵀ
 * decode by X' R to X's projection onto R's rows, exactly.  A bf16 R is
 * orthonormal only to ~2^-9; projecting with R itself would leave an
 * error of that size even with every channel kept (r = d).  Cholesky in
 * double (products of floats are exact there).  Only where R Rᵀ is
 * within 2^-4 of I: a rotation that far from orthonormal was not rounded
 * from one, and the documented X Rᵀ is used as given (P = R).
 */
int mkv_rot_projection(const float *R, uint32_t dk, uint32_t d, float *P)
{
	if (dk == 0 || d == 0 || dk > d)
		return -EINVAL;
	double *G = malloc(sizeof(double) * dk * dk);
	double *B = malloc(sizeof(double) * dk * d);
	if (!G || !B) {
		free(G);
		free(B);
		return -ENOMEM;
	}
	for (size_t i = 0; i < (size_t)dk * d; i++)
		B[i] = R[i];
	cblas_dsyrk(CblasRowMajor, CblasUpper, CblasNoTrans, (int)dk, (int)d, 1.0,
		    B, (int)d, 0.0, G, (int)dk);
	double dev = 0.0;
	for (uint32_t a = 0; a < dk; a++)
		for (uint32_t b = a; b < dk; b++)
			dev = fmax(dev, fabs(G[a * dk + b] - (a == b ? 1.0 : 0.0)));
	/* G's row-major upper triangle is a column-major lower one, so
	 * dpotrf runs on it in place (LAPACKE's row-major entries transpose
	 * copies of G and B: twice the time, ~0.3 ms of a 4096-row encode);
	 * its factor read row-major is U with G = Uᵀ U, and two triangular
	 * solves give G⁻¹ R. */
	bool solve = dev > 0.0 && dev <= 0.0625 &&
		     LAPACKE_dpotrf_work(LAPACK_COL_MAJOR, 'L', (lapack_int)dk, G,
					 (lapack_int)dk) == 0;
	if (solve) {
		cblas_dtrsm(CblasRowMajor, CblasLeft, CblasUpper, CblasTrans,
			    CblasNonUnit, (int)dk, (int)d, 1.0, G, (int)dk, B, (int)d);
		cblas_dtrsm(CblasRowMajor, CblasLeft, CblasUpper, CblasNoTrans,
			    CblasNonUnit, (int)dk, (int)d, 1.0, G, (int)dk, B, (int)d);
	}
	for (size_t i = 0; i < (size_t)dk * d; i++)
		P[i] = solve ? (float)B[i] : R[i];
	free(G);
	free(B);
	return 0;
}
