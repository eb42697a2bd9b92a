/* SPDX-License-Identifier: MIT */
/*
 * Rotations: segment rotations and mkv_segstats_eigen() are orthonormal,
 * are eigenvectors of the covariance XᵀX (computed here in double), come in
 * descending order of eigenvalue, and their Rayleigh quotients match the
 * eigenvalues of an independent Jacobi solver.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "projection.h"

static const uint32_t dims[3] = {64, 128, 256};
static const enum mkv_dtype dts[3] = {MKV_DTYPE_F32, MKV_DTYPE_F16, MKV_DTYPE_BF16};

/*
 * n × d anisotropic data with a well spread spectrum: z ∘ s mixed by a
 * random orthonormal matrix, s decaying from 3 to ~0.05.  Converted to @dt
 * in @buf; the exact values seen by the library in @ref.
 */
static void make_data(struct th_rng *g, uint32_t d, size_t n, enum mkv_dtype dt,
		      void *buf, double *ref)
{
	double *Q = th_alloc((size_t)d * d * sizeof *Q);
	double *z = th_alloc(d * sizeof *z);
	float *x = th_alloc((size_t)n * d * sizeof *x);
	th_random_orthonormal(g, d, d, Q);
	for (size_t i = 0; i < n; i++) {
		for (uint32_t a = 0; a < d; a++)
			z[a] = th_normal(g) * 3.0 * exp(-4.0 * a / d);
		for (uint32_t c = 0; c < d; c++) {
			double acc = 0;
			for (uint32_t a = 0; a < d; a++)
				acc += z[a] * Q[(size_t)a * d + c];
			x[i * d + c] = (float)acc;
		}
	}
	th_encode_dt(x, (size_t)n * d, dt, buf, ref);
	free(x);
	free(z);
	free(Q);
}

/* ‖R Rᵀ − I‖_F for m × d float rows. */
static double orth_err(const float *R, uint32_t m, uint32_t d)
{
	double acc = 0;
	for (uint32_t i = 0; i < m; i++) {
		for (uint32_t j = 0; j < m; j++) {
			double dot = 0;
			for (uint32_t c = 0; c < d; c++)
				dot += (double)R[(size_t)i * d + c] * R[(size_t)j * d + c];
			double e = dot - (i == j ? 1.0 : 0.0);
			acc += e * e;
		}
	}
	return sqrt(acc);
}

/* M = R C Rᵀ (m × m) for float rows R (m × d) and double C (d × d). */
static void rcrt(const float *R, uint32_t m, uint32_t d, const double *C,
		 double *M)
{
	double *CR = th_alloc((size_t)m * d * sizeof *CR); /* rows: C r_i */
	for (uint32_t i = 0; i < m; i++)
		for (uint32_t a = 0; a < d; a++) {
			double acc = 0;
			for (uint32_t b = 0; b < d; b++)
				acc += C[(size_t)a * d + b] * R[(size_t)i * d + b];
			CR[(size_t)i * d + a] = acc;
		}
	for (uint32_t i = 0; i < m; i++)
		for (uint32_t j = 0; j < m; j++) {
			double acc = 0;
			for (uint32_t a = 0; a < d; a++)
				acc += (double)R[(size_t)i * d + a] * CR[(size_t)j * d + a];
			M[(size_t)i * m + j] = acc;
		}
	free(CR);
}

/*
 * The rows of R (m × d) are the eigenvectors of C for its m largest
 * eigenvalues, largest first: R C Rᵀ is diagonal to 1e-5 λmax, its diagonal
 * is descending and equals the m largest Jacobi eigenvalues.
 */
static void check_eigenrows(uint64_t seed, const char *what, const float *R,
			    uint32_t m, uint32_t d, const double *C,
			    const double *eig_lib, double eig_tol)
{
	double *eig = th_alloc(d * sizeof *eig);
	double *M = th_alloc((size_t)m * m * sizeof *M);
	th_sym_eigvals(C, d, eig);
	rcrt(R, m, d, C, M);
	double lmax = eig[0];
	cr_assert(lmax > 0, "seed=%llu: degenerate data", (unsigned long long)seed);
	for (uint32_t i = 0; i < m; i++) {
		double rq = M[(size_t)i * m + i];
		cr_assert(fabs(rq - eig[i]) <= 1e-5 * lmax,
			  "seed=%llu %s d=%u: row %u Rayleigh quotient %.9g, eigenvalue %.9g (λmax %.6g)",
			  (unsigned long long)seed, what, d, i, rq, eig[i], lmax);
		if (i + 1 < m)
			cr_assert(rq >= M[(size_t)(i + 1) * m + i + 1] - 1e-6 * lmax,
				  "seed=%llu %s d=%u: Rayleigh quotients not descending at %u",
				  (unsigned long long)seed, what, d, i);
		for (uint32_t j = 0; j < m; j++)
			if (j != i)
				cr_assert(fabs(M[(size_t)i * m + j]) <= 1e-5 * lmax,
					  "seed=%llu %s d=%u: r_%uᵀ C r_%u = %.3g (λmax %.3g): not eigenvectors",
					  (unsigned long long)seed, what, d, i, j,
					  M[(size_t)i * m + j], lmax);
		if (eig_lib) {
			cr_assert(fabs(eig_lib[i] - rq) <= 1e-5 * lmax,
				  "seed=%llu %s d=%u: eigenvalue %u is %.9g, rᵀCr = %.9g",
				  (unsigned long long)seed, what, d, i, eig_lib[i], rq);
			cr_assert(fabs(eig_lib[i] - eig[i]) <= eig_tol * lmax,
				  "seed=%llu %s d=%u: eigenvalue %u is %.12g, Jacobi %.12g",
				  (unsigned long long)seed, what, d, i, eig_lib[i], eig[i]);
		}
	}
	free(M);
	free(eig);
}

Test(rotation, segment_rotation_orthonormal_eigenvectors)
{
	for (int di = 0; di < 3; di++) {
		for (uint32_t drop = 0; drop < 2; drop++) {
			uint64_t seed = th_seed();
			struct th_rng g;
			th_rng_init(&g, seed);
			uint32_t d = dims[di];
			enum mkv_dtype dt = dts[th_below(&g, 3)];
			size_t n = 300 + th_below(&g, 700);
			void *buf = th_alloc((size_t)n * d * 4);
			double *ref = th_alloc((size_t)n * d * sizeof *ref);
			make_data(&g, d, n, dt, buf, ref);

			struct mkv_encode_opts o;
			cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
			o.d = d;
			o.drop = drop;
			o.store_dtype = MKV_DTYPE_F32;
			o.kind = th_below(&g, 2) ? MKV_KIND_KEY : MKV_KIND_VALUE;
			struct mkv_segment *s = NULL;
			int rc = mkv_segment_encode(&o, buf, dt, n, &s);
			cr_assert_eq(rc, 0, "seed=%llu d=%u: encode rc=%d (%s)",
				     (unsigned long long)seed, d, rc, mkv_strerror(rc));
			struct mkv_packed_view v;
			cr_assert_eq(mkv_segment_view(s, &v), 0);
			uint32_t dk = drop ? d - d / 4 : d;
			cr_assert_eq(v.d_keep, dk, "seed=%llu: d_keep %u, want %u",
				     (unsigned long long)seed, v.d_keep, dk);
			cr_assert_eq(v.rotated, 1);
			float *R = th_alloc((size_t)dk * d * sizeof *R);
			cr_assert_eq(mkv_segment_rotation(s, R), 0);
			/* the view's f32 rotation is the same array */
			cr_assert(memcmp(R, v.rotation, (size_t)dk * d * 4) == 0,
				  "seed=%llu: view rotation differs from mkv_segment_rotation",
				  (unsigned long long)seed);
			double e = orth_err(R, dk, d);
			cr_assert(e < 1e-4, "seed=%llu d=%u drop=%u: ‖RRᵀ−I‖_F = %.3g",
				  (unsigned long long)seed, d, drop, e);
			double *C = th_alloc((size_t)d * d * sizeof *C);
			th_covariance(ref, n, d, C);
			check_eigenrows(seed, "segment", R, dk, d, C, NULL, 0);
			free(C);
			free(R);
			mkv_segment_destroy(s);
			free(buf);
			free(ref);
		}
	}
}

/* bf16 storage: the rotation returned is the view's bf16 rotation exactly,
 * and still nearly orthonormal (bf16 rounding only). */
Test(rotation, bf16_rotation_is_the_stored_one)
{
	uint64_t seed = th_seed();
	struct th_rng g;
	th_rng_init(&g, seed);
	for (int di = 0; di < 3; di++) {
		uint32_t d = dims[di];
		size_t n = 200;
		void *buf = th_alloc(n * d * 4);
		make_data(&g, d, n, MKV_DTYPE_F32, buf, NULL);
		struct mkv_encode_opts o;
		cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
		o.d = d;
		o.drop = 1;
		struct mkv_segment *s = NULL;
		cr_assert_eq(mkv_segment_encode(&o, buf, MKV_DTYPE_F32, n, &s), 0);
		struct mkv_packed_view v;
		cr_assert_eq(mkv_segment_view(s, &v), 0);
		cr_assert_eq(v.store_dtype, MKV_DTYPE_BF16);
		float *R = th_alloc((size_t)v.d_keep * d * sizeof *R);
		cr_assert_eq(mkv_segment_rotation(s, R), 0);
		for (size_t i = 0; i < (size_t)v.d_keep * d; i++) {
			float want = th_bf16_to_f32(((const uint16_t *)v.rotation)[i]);
			cr_assert(memcmp(&want, &R[i], 4) == 0,
				  "seed=%llu d=%u: rotation[%zu] %a, view bf16 %a",
				  (unsigned long long)seed, d, i, R[i], want);
		}
		double e = orth_err(R, v.d_keep, d);
		cr_assert(e < 0.05 * sqrt((double)d / 64), "seed=%llu d=%u: bf16 ‖RRᵀ−I‖_F = %.3g",
			  (unsigned long long)seed, d, e);
		free(R);
		mkv_segment_destroy(s);
		free(buf);
	}
}

/* A caller's rotation is copied (bit-exactly for f32, rounded for bf16). */
Test(rotation, given_rotation_is_copied)
{
	uint64_t seed = th_seed();
	struct th_rng g;
	th_rng_init(&g, seed);
	for (int di = 0; di < 3; di++) {
		uint32_t d = dims[di];
		uint32_t dk = d - d / 4;
		size_t n = 100;
		void *buf = th_alloc(n * d * 4);
		make_data(&g, d, n, MKV_DTYPE_F32, buf, NULL);
		double *Qd = th_alloc((size_t)dk * d * sizeof *Qd);
		th_random_orthonormal(&g, dk, d, Qd);
		float *Q = th_alloc((size_t)dk * d * sizeof *Q);
		for (size_t i = 0; i < (size_t)dk * d; i++)
			Q[i] = (float)Qd[i];
		for (int sd = 0; sd < 2; sd++) {
			struct mkv_encode_opts o;
			cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
			o.d = d;
			o.drop = 1;
			o.rotation = Q;
			o.store_dtype = sd ? MKV_DTYPE_BF16 : MKV_DTYPE_F32;
			struct mkv_segment *s = NULL;
			int rc = mkv_segment_encode(&o, buf, MKV_DTYPE_F32, n, &s);
			cr_assert_eq(rc, 0, "seed=%llu: rc=%d", (unsigned long long)seed, rc);
			float *R = th_alloc((size_t)dk * d * sizeof *R);
			float saved = Q[0];
			Q[0] = 1234.0f; /* the segment must hold its own copy */
			cr_assert_eq(mkv_segment_rotation(s, R), 0);
			Q[0] = saved;
			for (size_t i = 0; i < (size_t)dk * d; i++) {
				float want = sd ? th_bf16_to_f32(th_f32_to_bf16(Q[i])) : Q[i];
				cr_assert(memcmp(&want, &R[i], 4) == 0,
					  "seed=%llu d=%u store=%s: rotation[%zu] = %a, given %a",
					  (unsigned long long)seed, d, sd ? "bf16" : "f32", i,
					  R[i], want);
			}
			free(R);
			mkv_segment_destroy(s);
		}
		free(Q);
		free(Qd);
		free(buf);
	}
}

/* rotate == 0: identity rows, view.rotated == 0. */
Test(rotation, no_rotation_is_identity)
{
	uint64_t seed = th_seed();
	struct th_rng g;
	th_rng_init(&g, seed);
	for (int di = 0; di < 3; di++) {
		uint32_t d = dims[di];
		size_t n = 50;
		void *buf = th_alloc(n * d * 4);
		make_data(&g, d, n, MKV_DTYPE_F32, buf, NULL);
		struct mkv_encode_opts o;
		cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
		o.d = d;
		o.rotate = 0;
		o.drop = 0;
		struct mkv_segment *s = NULL;
		cr_assert_eq(mkv_segment_encode(&o, buf, MKV_DTYPE_F32, n, &s), 0);
		struct mkv_packed_view v;
		cr_assert_eq(mkv_segment_view(s, &v), 0);
		cr_assert_eq(v.rotated, 0);
		float *R = th_alloc((size_t)d * d * sizeof *R);
		cr_assert_eq(mkv_segment_rotation(s, R), 0);
		for (uint32_t i = 0; i < d; i++)
			for (uint32_t c = 0; c < d; c++)
				cr_assert_eq(R[(size_t)i * d + c], i == c ? 1.0f : 0.0f,
					     "seed=%llu d=%u: R[%u][%u] = %g",
					     (unsigned long long)seed, d, i, c,
					     R[(size_t)i * d + c]);
		free(R);
		mkv_segment_destroy(s);
		free(buf);
	}
}

/*
 * @eig_tol: eigenvalues against the Jacobi ones, relative to λmax.  1e-6
 * holds at float precision; the header promises a double-precision
 * covariance, checked at 1e-9 by the second test.
 */
static void segstats_eigen_case(double eig_tol)
{
	for (int di = 0; di < 3; di++) {
		uint64_t seed = th_seed();
		struct th_rng g;
		th_rng_init(&g, seed);
		uint32_t d = dims[di];
		enum mkv_dtype dt = dts[th_below(&g, 3)];
		size_t n = 400 + th_below(&g, 600);
		size_t es = th_dtype_size(dt);
		char *buf = th_alloc(n * d * 4);
		double *ref = th_alloc(n * d * sizeof *ref);
		make_data(&g, d, n, dt, buf, ref);

		struct mkv_strategy_opts so;
		cr_assert_eq(mkv_strategy_opts_init(&so, sizeof so), 0);
		so.d = d;
		struct mkv_segstats *st = NULL;
		cr_assert_eq(mkv_segstats_create(&so, &st), 0);
		/* appended in uneven chunks */
		size_t done = 0;
		while (done < n) {
			size_t c = 1 + th_below(&g, 97);
			if (c > n - done)
				c = n - done;
			cr_assert_eq(mkv_segstats_append(st, buf + done * d * es, dt, c), 0);
			done += c;
		}
		cr_assert_eq(mkv_segstats_count(st), n);
		float *R = th_alloc((size_t)d * d * sizeof *R);
		double *eig = th_alloc(d * sizeof *eig);
		int rc = mkv_segstats_eigen(st, R, eig);
		cr_assert_eq(rc, 0, "seed=%llu: eigen rc=%d", (unsigned long long)seed, rc);
		double e = orth_err(R, d, d);
		cr_assert(e < 1e-4, "seed=%llu d=%u: ‖RRᵀ−I‖_F = %.3g",
			  (unsigned long long)seed, d, e);
		for (uint32_t i = 0; i + 1 < d; i++)
			cr_assert(eig[i] >= eig[i + 1], "seed=%llu d=%u: eig[%u]=%.9g < eig[%u]=%.9g",
				  (unsigned long long)seed, d, i, eig[i], i + 1, eig[i + 1]);
		double *C = th_alloc((size_t)d * d * sizeof *C);
		th_covariance(ref, n, d, C);
		check_eigenrows(seed, "segstats", R, d, d, C, eig, eig_tol);

		/* @eig may be NULL, and gives the same rotation */
		float *R2 = th_alloc((size_t)d * d * sizeof *R2);
		cr_assert_eq(mkv_segstats_eigen(st, R2, NULL), 0);
		cr_assert(memcmp(R, R2, (size_t)d * d * 4) == 0,
			  "seed=%llu: eigen differs between calls", (unsigned long long)seed);
		free(R2);
		free(C);
		free(eig);
		free(R);
		mkv_segstats_destroy(st);
		free(buf);
		free(ref);
	}
}

Test(rotation, segstats_eigen) { segstats_eigen_case(1e-6); }

/* "the covariance XᵀX (double precision)": eigenvalues to 1e-9 λmax. */
Test(rotation, segstats_covariance_double_precision) { segstats_eigen_case(1e-9); }

/* mkv_strategy_choose's rotation is the same eigenbasis. */
Test(rotation, strategy_choose_rotation)
{
	uint64_t seed = th_seed();
	struct th_rng g;
	th_rng_init(&g, seed);
	uint32_t d = 128;
	size_t n = 700;
	void *buf = th_alloc(n * d * 4);
	double *ref = th_alloc(n * d * sizeof *ref);
	make_data(&g, d, n, MKV_DTYPE_BF16, buf, ref);
	struct mkv_strategy_opts so;
	cr_assert_eq(mkv_strategy_opts_init(&so, sizeof so), 0);
	so.d = d;
	float *R = th_alloc((size_t)d * d * sizeof *R);
	struct mkv_strategy s;
	int rc = mkv_strategy_choose(&so, buf, MKV_DTYPE_BF16, n, R, &s);
	cr_assert_eq(rc, 0, "seed=%llu: rc=%d", (unsigned long long)seed, rc);
	double e = orth_err(R, d, d);
	cr_assert(e < 1e-4, "seed=%llu: ‖RRᵀ−I‖_F = %.3g", (unsigned long long)seed, e);
	double *C = th_alloc((size_t)d * d * sizeof *C);
	th_covariance(ref, n, d, C);
	check_eigenrows(seed, "strategy_choose", R, d, d, C, NULL, 0);
	free(C);
	free(R);
	free(buf);
	free(ref);
}

/*
 * The stored bf16 rotation R is orthonormal only to ~2^-9, so the encoder
 * projects with P = (R Rᵀ)⁻¹ R: then the coefficients decode by X' R to
 * X itself at r = d.  Every stored coefficient is X Pᵀ (computed here in
 * double by Gauss-Jordan) rounded to bf16: within half an ulp plus the
 * float product's rounding.  X Rᵀ misses by ~2^-9 ‖x‖ on every channel,
 * far outside that on the small ones.
 */
Test(rotation, projection_inverts_the_stored_rotation)
{
	uint64_t seed = th_seed();
	struct th_rng g;
	th_rng_init(&g, seed);
	for (int di = 0; di < 3; di++)
		for (uint32_t drop = 0; drop < 2; drop++) {
			uint32_t d = dims[di], dk = drop ? d - d / 4 : d;
			size_t n = 300;
			void *buf = th_alloc(n * d * 4);
			double *x = th_alloc(n * d * sizeof *x);
			make_data(&g, d, n, MKV_DTYPE_F32, buf, x);
			struct mkv_encode_opts o;
			cr_assert_eq(mkv_encode_opts_init(&o, sizeof o), 0);
			o.d = d;
			o.drop = drop;
			o.r = dk;
			o.g = 1;
			struct mkv_segment *s = NULL;
			cr_assert_eq(mkv_segment_encode(&o, buf, MKV_DTYPE_F32, n, &s), 0);
			float *Rf = th_alloc((size_t)dk * d * sizeof *Rf);
			cr_assert_eq(mkv_segment_rotation(s, Rf), 0);
			double *R = th_alloc((size_t)dk * d * sizeof *R);
			double *P = th_alloc((size_t)dk * d * sizeof *P);
			for (size_t i = 0; i < (size_t)dk * d; i++)
				R[i] = Rf[i];
			th_projection(R, dk, d, P);
			float *c = th_alloc(n * dk * sizeof *c);
			cr_assert_eq(mkv_segment_decode(s, 0, n, MKV_SPACE_ROTATED, c), 0);
			for (size_t i = 0; i < n; i++) {
				const double *xi = x + i * d;
				double nx = 0;
				for (uint32_t t = 0; t < d; t++)
					nx += xi[t] * xi[t];
				nx = sqrt(nx);
				for (uint32_t a = 0; a < dk; a++) {
					double want = 0;
					for (uint32_t t = 0; t < d; t++)
						want += P[(size_t)a * d + t] * xi[t];
					double got = c[i * dk + a];
					cr_assert(fabs(got - want) <= 0x1p-8 * fabs(want) + 1e-6 * nx,
						  "seed=%llu d=%u drop=%u: row %zu coefficient %u = %.9g, "
						  "want %.9g (|x| %.4g)",
						  (unsigned long long)seed, d, drop, i, a, got, want, nx);
				}
			}
			free(c);
			free(P);
			free(R);
			free(Rf);
			mkv_segment_destroy(s);
			free(x);
			free(buf);
		}
}
