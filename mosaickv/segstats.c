/* SPDX-License-Identifier: MIT */
/*
 * Incremental strategy statistics.
 *
 * A decode segment grows one token at a time and its strategy is chosen when
 * it closes, so everything here is a running sum:
 *   - the covariance XᵀX, from which the next rotation comes;
 *   - under a fixed rotation R, for every group size g the sum over vectors
 *     of the j-th largest group energy (rank tables).  Because R is
 *     orthonormal, the error of keeping the top k groups of a vector is its
 *     energy minus the energy of those k groups, so the loss of every (r, g)
 *     is a prefix sum of a table: one O(d log d) update per vector serves
 *     every candidate strategy;
 *   - for every candidate b, the within-block sum of squares of the first S
 *     rotated channels over completed blocks, against the total variance.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"

#define N_G 4 /* g = 1, 2, 4, 8 */
#define N_B 4 /* b = 8, 16, 32, 64 */
#define BMAX 64
#define TRACK_CHUNK 256

struct mkv_segstats {
	struct mkv_strategy_opts o;
	uint32_t d, d_keep, S;
	size_t count;     /* vectors in the covariance */
	double *cov;      /* d × d */
	float *RT;        /* the current rotation (d × d) transposed, for
			   * mkv_rotate_t; NULL = identity */
	size_t tracked;   /* vectors in the tables below */
	double energy;    /* Σ ‖x‖² of tracked vectors */
	double dropped;   /* Σ of their energy in the dropped rotated channels */
	double *rank[N_G];/* rank[gi][j]: Σ of each vector's (j+1)-th largest
			   * group energy, j < d_keep / g */
	float *blk;       /* BMAX × S rotated summary channels of the current
			   * 64-aligned run of tracked vectors */
	double within[N_B];
	size_t within_n[N_B];
	double *csum;     /* S: Σ x'_c */
	double csq;       /* Σ Σ_c x'_c² over the S channels */
	float *xbuf, *xr; /* TRACK_CHUNK × d scratch */
};

static const uint32_t g_of[N_G] = {1, 2, 4, 8};
static const uint32_t b_of[N_B] = {8, 16, 32, 64};

int mkv_strategy_opts_init(struct mkv_strategy_opts *o, size_t size)
{
	if (!o || !mkv_opts_size_ok(size, sizeof(*o), sizeof(*o)))
		return -EINVAL;
	memset(o, 0, size);
	o->size = size;
	o->d = 128;
	o->drop = 1;
	o->loss_threshold = 0.3;
	o->var_threshold = 0.5;
	o->g_mask = (1u << 1) | (1u << 2) | (1u << 4) | (1u << 8);
	o->b_mask = 8 | 16 | 32 | 64;
	o->summary_channels = 0;
	return 0;
}

static bool strategy_opts_valid(const struct mkv_strategy_opts *o)
{
	const uint32_t gall = (1u << 1) | (1u << 2) | (1u << 4) | (1u << 8);
	if (o->size != sizeof(*o) || !mkv_d_valid(o->d) || o->drop > 1)
		return false;
	if (!(o->loss_threshold > 0.0 && o->loss_threshold <= 1.0) ||
	    !(o->var_threshold > 0.0 && o->var_threshold <= 1.0))
		return false;
	if (!o->g_mask || (o->g_mask & ~gall) || !o->b_mask ||
	    (o->b_mask & ~120u))
		return false;
	return o->summary_channels <= mkv_d_keep(o->d, o->drop);
}

void mkv_segstats_destroy(struct mkv_segstats *st)
{
	if (!st)
		return;
	free(st->cov);
	free(st->RT);
	for (int i = 0; i < N_G; i++)
		free(st->rank[i]);
	free(st->blk);
	free(st->csum);
	free(st->xbuf);
	free(st->xr);
	free(st);
}

static void tables_clear(struct mkv_segstats *st)
{
	st->tracked = 0;
	st->energy = 0.0;
	st->dropped = 0.0;
	for (int i = 0; i < N_G; i++)
		memset(st->rank[i], 0, sizeof(double) * (st->d_keep / g_of[i]));
	memset(st->within, 0, sizeof(st->within));
	memset(st->within_n, 0, sizeof(st->within_n));
	memset(st->csum, 0, sizeof(double) * st->S);
	st->csq = 0.0;
}

int mkv_segstats_create(const struct mkv_strategy_opts *o,
			struct mkv_segstats **out)
{
	if (!o || !out || !strategy_opts_valid(o))
		return -EINVAL;
	struct mkv_segstats *st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->o = *o;
	st->d = o->d;
	st->d_keep = mkv_d_keep(o->d, o->drop);
	st->S = o->summary_channels ? o->summary_channels : o->d / 4;
	st->cov = calloc((size_t)st->d * st->d, sizeof(double));
	for (int i = 0; i < N_G; i++)
		st->rank[i] = calloc(st->d_keep / g_of[i], sizeof(double));
	st->blk = malloc(sizeof(float) * BMAX * st->S);
	st->csum = calloc(st->S, sizeof(double));
	st->xbuf = malloc(sizeof(float) * TRACK_CHUNK * st->d);
	st->xr = malloc(sizeof(float) * TRACK_CHUNK * st->d);
	bool ok = st->cov && st->blk && st->csum && st->xbuf && st->xr;
	for (int i = 0; i < N_G; i++)
		ok = ok && st->rank[i];
	if (!ok) {
		mkv_segstats_destroy(st);
		return -ENOMEM;
	}
	*out = st;
	return 0;
}

/* Sum of squares of the last @b rows in the block buffer about their mean. */
static double block_ss(const float *blk, uint32_t first, uint32_t b, uint32_t S)
{
	double ss = 0.0;
	for (uint32_t c = 0; c < S; c++) {
		double mean = 0.0;
		for (uint32_t i = 0; i < b; i++)
			mean += blk[(first + i) * S + c];
		mean /= b;
		for (uint32_t i = 0; i < b; i++) {
			double dv = blk[(first + i) * S + c] - mean;
			ss += dv * dv;
		}
	}
	return ss;
}

/* Update the rank and variance tables with @n float rows (n <= TRACK_CHUNK). */
static void track(struct mkv_segstats *st, const float *x, size_t n)
{
	uint32_t d = st->d, dk = st->d_keep, S = st->S;
	const float *xr = x;
	uint32_t ld = d;
	if (st->RT) {
		/* Row by row in a fixed order (mkv_rotate_t), so a vector's
		 * rotated form (and every loss) is the same whether it arrived
		 * alone or in a chunk.  All d rows: the dropped channels'
		 * energy is summed directly rather than as a difference, which
		 * would cancel to noise at small loss. */
		for (size_t i = 0; i < n; i++)
			mkv_rotate_t(st->RT, d, d, x + i * d, st->xr + i * d);
		xr = st->xr;
	}
	float e[MKV_MAX_D];
	for (size_t i = 0; i < n; i++) {
		const float *row = xr + i * ld;
		double en = 0.0, dr = 0.0;
		for (uint32_t c = 0; c < d; c++)
			en += (double)x[i * d + c] * x[i * d + c];
		for (uint32_t c = dk; c < d; c++)
			dr += (double)row[c] * row[c];
		st->energy += en;
		st->dropped += dr;
		for (int gi = 0; gi < N_G; gi++) {
			uint32_t g = g_of[gi];
			if (!(st->o.g_mask & (1u << g)))
				continue;
			uint32_t ng = dk / g;
			for (uint32_t j = 0; j < ng; j++) {
				float acc = 0.0f;
				for (uint32_t t = 0; t < g; t++)
					acc += row[j * g + t] * row[j * g + t];
				e[j] = acc;
			}
			mkv_sort_desc(e, ng);
			for (uint32_t j = 0; j < ng; j++)
				st->rank[gi][j] += e[j];
		}
		uint32_t pos = (uint32_t)(st->tracked % BMAX);
		for (uint32_t c = 0; c < S; c++) {
			float v = row[c];
			st->blk[pos * S + c] = v;
			st->csum[c] += v;
			st->csq += (double)v * v;
		}
		st->tracked++;
		for (int bi = 0; bi < N_B; bi++) {
			uint32_t b = b_of[bi];
			if (st->tracked % b == 0) {
				st->within[bi] += block_ss(st->blk, pos + 1 - b, b, S);
				st->within_n[bi] += b;
			}
		}
	}
}

int mkv_segstats_append(struct mkv_segstats *st, const void *x,
			enum mkv_dtype dt, size_t n)
{
	if (!st || !x || n == 0 || !mkv_dtype_valid(dt))
		return -EINVAL;
	size_t es = mkv_dtype_size(dt), d = st->d;
	/* All or nothing: check every element before touching any sum. */
	for (size_t i0 = 0; i0 < n; i0 += TRACK_CHUNK) {
		size_t m = n - i0 < TRACK_CHUNK ? n - i0 : TRACK_CHUNK;
		if (!mkv_load_f32(st->xbuf, (const char *)x + i0 * d * es, dt, m * d))
			return -MKV_ENONFINITE;
	}
	/* The covariance's scratch before anything is summed, so that no
	 * chunk can fail half way (one row needs none). */
	double *scratch = NULL;
	if (n > 1) {
		scratch = malloc(sizeof(double) * (n < TRACK_CHUNK ? n : TRACK_CHUNK) * d);
		if (!scratch)
			return -ENOMEM;
	}
	for (size_t i0 = 0; i0 < n; i0 += TRACK_CHUNK) {
		size_t m = n - i0 < TRACK_CHUNK ? n - i0 : TRACK_CHUNK;
		mkv_load_f32(st->xbuf, (const char *)x + i0 * d * es, dt, m * d);
		(void)mkv_cov_accumulate_f64(st->cov, st->xbuf, m, st->d, scratch);
		track(st, st->xbuf, m);
		st->count += m;
	}
	free(scratch);
	return 0;
}

size_t mkv_segstats_count(const struct mkv_segstats *st)
{
	return st ? st->count : 0;
}

int mkv_segstats_set_rotation(struct mkv_segstats *st, const float *R)
{
	if (!st)
		return -EINVAL;
	size_t m = (size_t)st->d * st->d;
	if (R && !mkv_all_finite(R, m))
		return -MKV_ENONFINITE;
	if (R) {
		if (!st->RT) {
			st->RT = malloc(sizeof(float) * m);
			if (!st->RT)
				return -ENOMEM;
		}
		mkv_transpose(R, st->d, st->d, st->RT);
	} else {
		free(st->RT);
		st->RT = NULL;
	}
	tables_clear(st);
	return 0;
}

int mkv_segstats_eigen(const struct mkv_segstats *st, float *R, double *eig)
{
	if (!st || !R || st->count == 0)
		return -EINVAL;
	return mkv_eigen_rows(st->cov, st->d, R, eig);
}

static int gi_of(uint32_t g)
{
	for (int i = 0; i < N_G; i++)
		if (g_of[i] == g)
			return i;
	return -1;
}

/* Relative loss of keeping the k largest groups: the energy of the other
 * groups (a tail of the rank table) and of the dropped channels, summed
 * directly, over the total. */
static double loss_at(const struct mkv_segstats *st, int gi, uint32_t k)
{
	if (st->energy <= 0.0)
		return 0.0;
	double lost = st->dropped;
	for (uint32_t j = k; j < st->d_keep / g_of[gi]; j++)
		lost += st->rank[gi][j];
	return sqrt(lost / st->energy);
}

int mkv_segstats_loss(const struct mkv_segstats *st, uint32_t r, uint32_t g,
		      double *loss)
{
	if (!st || !loss || st->tracked == 0 || !mkv_g_valid(g) ||
	    !(st->o.g_mask & (1u << g)) || r == 0 || r > st->d_keep || r % g)
		return -EINVAL;
	*loss = loss_at(st, gi_of(g), r / g);
	return 0;
}

int mkv_segstats_choose(const struct mkv_segstats *st, struct mkv_strategy *s)
{
	if (!st || !s || st->tracked == 0)
		return -EINVAL;
	struct mkv_strategy best = {.d = st->d, .d_keep = st->d_keep};
	size_t best_bytes = SIZE_MAX;
	for (int gi = N_G - 1; gi >= 0; gi--) {
		uint32_t g = g_of[gi];
		if (!(st->o.g_mask & (1u << g)))
			continue;
		uint32_t ng = st->d_keep / g;
		for (uint32_t k = 1; k <= ng; k++) {
			double l = loss_at(st, gi, k);
			if (l > st->o.loss_threshold)
				continue;
			/* bf16 values plus the bitmap; a larger g wins ties
			 * since it is scanned first and only a strictly
			 * smaller size replaces it. */
			size_t bytes = (size_t)k * g * 2 + (ng + 7) / 8;
			if (bytes < best_bytes) {
				best_bytes = bytes;
				best.r = k * g;
				best.g = g;
				best.loss = l;
			}
			break; /* larger k only costs more at this g */
		}
	}
	best.met = best_bytes != SIZE_MAX;
	if (!best.met) {
		/* Unreachable only when the drop alone loses too much: keep
		 * every remaining channel. */
		uint32_t g = st->o.g_mask & 2u ? 1u : 0u;
		for (int gi = 0; !g && gi < N_G; gi++)
			if (st->o.g_mask & (1u << g_of[gi]))
				g = g_of[gi];
		best.g = g;
		best.r = st->d_keep;
		best.loss = loss_at(st, gi_of(g), st->d_keep / g);
	}
	/* Block size: the largest allowed whose within-block variance share
	 * meets the threshold. */
	double n = (double)st->tracked, tot = st->csq;
	for (uint32_t c = 0; c < st->S; c++)
		tot -= st->csum[c] * st->csum[c] / n;
	double per_token = tot > 0 ? tot / n : 0.0;
	best.b = 0;
	for (int bi = N_B - 1; bi >= 0; bi--) {
		uint32_t b = b_of[bi];
		if (!(st->o.b_mask & b))
			continue;
		/* No complete block of this size yet: no evidence it fits, so
		 * it is taken only when no size with evidence qualifies. */
		double share = st->within_n[bi] ? 0.0 : INFINITY;
		if (st->within_n[bi] && per_token > 0)
			share = st->within[bi] / st->within_n[bi] / per_token;
		if (share <= st->o.var_threshold) {
			best.b = b;
			best.block_var = share;
			break;
		}
		best.b = b; /* remember the smallest allowed so far */
		best.block_var = share;
	}
	*s = best;
	return 0;
}

void mkv_segstats_reset(struct mkv_segstats *st)
{
	if (!st)
		return;
	memset(st->cov, 0, sizeof(double) * st->d * st->d);
	st->count = 0;
	tables_clear(st);
}

int mkv_rotation_of(const float *x, size_t n, uint32_t d, float *R)
{
	double *cov = calloc((size_t)d * d, sizeof(double));
	if (!cov)
		return -ENOMEM;
	int rc = mkv_cov_accumulate_f64(cov, x, n, d, NULL);
	if (rc == 0)
		rc = mkv_eigen_rows(cov, d, R, NULL);
	free(cov);
	return rc;
}

int mkv_strategy_choose(const struct mkv_strategy_opts *o, const void *x,
			enum mkv_dtype dt, size_t n, float *R,
			struct mkv_strategy *s)
{
	if (!o || !x || !s || n == 0 || n > MKV_MAX_N || !mkv_dtype_valid(dt) ||
	    !strategy_opts_valid(o))
		return -EINVAL;
	struct mkv_segstats *st;
	int rc = mkv_segstats_create(o, &st);
	if (rc)
		return rc;
	size_t d = o->d;
	float *X = malloc(sizeof(float) * n * d);
	float *Rf = malloc(sizeof(float) * d * d);
	rc = -ENOMEM;
	if (!X || !Rf)
		goto out;
	rc = -MKV_ENONFINITE;
	if (!mkv_load_f32(X, x, dt, n * d))
		goto out;
	/* the rotation as mkv_rotation_of makes it (the same bits) */
	rc = mkv_cov_accumulate_f64(st->cov, X, n, o->d, NULL);
	if (rc)
		goto out;
	st->count = n;
	rc = mkv_eigen_rows(st->cov, o->d, Rf, NULL);
	if (rc)
		goto out;
	rc = mkv_segstats_set_rotation(st, Rf);
	if (rc)
		goto out;
	for (size_t i0 = 0; i0 < n; i0 += TRACK_CHUNK)
		track(st, X + i0 * d, n - i0 < TRACK_CHUNK ? n - i0 : TRACK_CHUNK);
	rc = mkv_segstats_choose(st, s);
	if (rc == 0 && R)
		memcpy(R, Rf, sizeof(float) * d * d);
out:
	free(X);
	free(Rf);
	mkv_segstats_destroy(st);
	return rc;
}
