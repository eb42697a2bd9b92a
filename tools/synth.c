/* SPDX-License-Identifier: MIT */
/* Synthetic LLM-like KV caches and queries; the model is described in
 * synth.h.  Generation is sequential per (head, K/V) with its own random
 * stream, so results do not depend on call order or threading. */
#include "synth.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SYNTH_PI 3.14159265358979323846

/* ---- random numbers: xoshiro256** seeded by splitmix64 ---------------- */

struct rng {
	uint64_t s[4];
	double spare;
	int has_spare;
};

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* One independent stream per (seed, purpose, head). */
static void rng_init(struct rng *r, uint64_t seed, uint64_t stream,
		     uint64_t head)
{
	uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ull) ^
		     (head * 0x8cb92ba72f3d8dd7ull);
	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix64(&x);
	r->has_spare = 0;
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

static uint64_t rng_u64(struct rng *r)
{
	uint64_t *s = r->s;
	uint64_t res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return res;
}

/* Uniform in [0, 1). */
static double rng_unif(struct rng *r)
{
	return (double)(rng_u64(r) >> 11) * 0x1.0p-53;
}

static double rng_range(struct rng *r, double lo, double hi)
{
	return lo + (hi - lo) * rng_unif(r);
}

static uint32_t rng_below(struct rng *r, uint32_t n)
{
	return (uint32_t)(rng_unif(r) * n);
}

/* Standard normal (Marsaglia's polar method, both outputs used). */
static double rng_normal(struct rng *r)
{
	if (r->has_spare) {
		r->has_spare = 0;
		return r->spare;
	}
	double u, v, s;
	do {
		u = 2.0 * rng_unif(r) - 1.0;
		v = 2.0 * rng_unif(r) - 1.0;
		s = u * u + v * v;
	} while (s >= 1.0 || s == 0.0);
	double m = sqrt(-2.0 * log(s) / s);
	r->spare = v * m;
	r->has_spare = 1;
	return u * m;
}

/* Poisson by inversion; fine for small means. */
static uint32_t rng_poisson(struct rng *r, double mean)
{
	double l = exp(-mean), p = 1.0;
	uint32_t k = 0;
	do {
		k++;
		p *= rng_unif(r);
	} while (p > l && k < 64);
	return k - 1;
}

/* ---- bf16 ------------------------------------------------------------ */

static uint16_t f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	u += 0x7fffu + ((u >> 16) & 1u); /* nearest, ties to even; finite only */
	return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* ---- options ----------------------------------------------------------- */

void synth_opts_default(struct synth_opts *o)
{
	memset(o, 0, sizeof *o);
	o->n = 65536;
	o->d = 128;
	o->n_kv = 4;
	o->n_q = 4;
	o->n_steps = 8;
	o->seed = 1;
	o->dtype = MKV_DTYPE_BF16;
	o->rope_base = 500000.0;
	o->key_lowfreq = 2.5;
	o->key_alpha = 1.2;
	o->val_alpha = 0.6;
	o->key_floor = 0.05;
	o->val_floor = 0.10;
	o->key_outliers = 4;
	o->outlier_mag = 6.0;
	o->heavy_per_token = 3.0;
	o->heavy_mag = 3.5;
	o->span_coherence = 0.5;
	o->drift = 0.3;
	o->sink_key_norm = 2.0;
	o->sink_mass_lo = 0.2;
	o->sink_mass_hi = 0.5;
	o->rel_mass_lo = 0.3;
	o->rel_mass_hi = 0.8;
	o->rel_spans = 4;
	o->q_temp = 1.5;
}

static int opts_valid(const struct synth_opts *o)
{
	if (!o || o->d < 16 || o->d > 256 || o->d % 2 || o->n < 128 ||
	    !o->n_kv || !o->n_q)
		return 0;
	if (o->dtype != MKV_DTYPE_F32 && o->dtype != MKV_DTYPE_BF16)
		return 0;
	if (!(o->sink_mass_lo > 0 && o->sink_mass_lo <= o->sink_mass_hi &&
	      o->sink_mass_hi < 1))
		return 0;
	if (!(o->rel_mass_lo > 0 && o->rel_mass_lo <= o->rel_mass_hi &&
	      o->rel_mass_hi < 1))
		return 0;
	if (!(o->key_floor >= 0 && o->key_floor < 1 && o->val_floor >= 0 &&
	      o->val_floor < 1 && o->span_coherence >= 0 &&
	      o->span_coherence <= 1 && o->heavy_per_token >= 0 &&
	      o->heavy_per_token < 32 && o->rope_base >= 0))
		return 0;
	if (o->n_steps && (!o->rel_spans || !(o->q_temp > 0)))
		return 0;
	return 1;
}

/* ---- spans ------------------------------------------------------------- */

struct spans {
	uint32_t count;
	uint32_t *start; /* count + 1 entries; start[count] = n */
};

static int spans_make(struct spans *sp, uint32_t n, uint64_t seed)
{
	struct rng r;
	rng_init(&r, seed, 1, 0);
	sp->start = malloc(((size_t)n + 1) * sizeof *sp->start);
	if (!sp->start)
		return -ENOMEM;
	/* Token 0 (the sink) is a span of its own. */
	uint32_t c = 0, t = 1;
	sp->start[c++] = 0;
	while (t < n) {
		sp->start[c++] = t;
		t += 8 + rng_below(&r, 57);
	}
	sp->start[c] = n;
	sp->count = c;
	return 0;
}

/* ---- one head's K or V -------------------------------------------------- */

enum { KIND_K = 0, KIND_V = 1 };

/* Random d × L matrix with orthonormal columns (Gram-Schmidt, twice). */
static void random_orthonormal(struct rng *r, float *M, uint32_t d,
			       uint32_t L, double *tmp)
{
	/* tmp: L columns of d doubles */
	for (uint32_t j = 0; j < L; j++) {
		double *c = tmp + (size_t)j * d;
		for (uint32_t i = 0; i < d; i++)
			c[i] = rng_normal(r);
		for (int pass = 0; pass < 2; pass++)
			for (uint32_t p = 0; p < j; p++) {
				const double *b = tmp + (size_t)p * d;
				double dot = 0;
				for (uint32_t i = 0; i < d; i++)
					dot += c[i] * b[i];
				for (uint32_t i = 0; i < d; i++)
					c[i] -= dot * b[i];
			}
		double nn = 0;
		for (uint32_t i = 0; i < d; i++)
			nn += c[i] * c[i];
		nn = 1.0 / sqrt(nn);
		for (uint32_t i = 0; i < d; i++)
			c[i] *= nn;
	}
	/* M stored by columns (L × d) so that M z is a sum of axpys, which
	 * vectorizes without reassociating a reduction. */
	for (uint32_t j = 0; j < L; j++)
		for (uint32_t i = 0; i < d; i++)
			M[(size_t)j * d + i] = (float)tmp[(size_t)j * d + i];
}

/*
 * Generate head @h's keys (kind K) or values into @x (n × d floats, already
 * rounded to o->dtype so that what callers store and what the query
 * calibration sees agree).
 */
static int gen_head(const struct synth_opts *o, const struct spans *sp,
		    int kind, uint32_t h, float *x, float *qb, uint32_t nqb)
{
	const uint32_t n = o->n, d = o->d;
	const uint32_t L = kind == KIND_K ? d / 2 : d;
	const double alpha = kind == KIND_K ? o->key_alpha : o->val_alpha;
	const double floor_share = kind == KIND_K ? o->key_floor : o->val_floor;
	const double rho = kind == KIND_K ? o->span_coherence
					  : o->span_coherence / 2;
	const double heavy = kind == KIND_K ? o->heavy_per_token
					    : o->heavy_per_token / 2;
	struct rng r;
	rng_init(&r, o->seed, 2 + (uint64_t)kind, h);

	float *M = malloc((size_t)d * L * sizeof *M);
	double *tmp = malloc((size_t)d * (L > d ? L : d) * sizeof *tmp);
	double *sig = malloc(L * sizeof *sig);
	double *per = malloc(L * sizeof *per);
	double *pha = malloc(L * sizeof *pha);
	double *mu = malloc(d * sizeof *mu);
	double *w = malloc(d * sizeof *w);
	double *us = malloc(d * sizeof *us);
	float *z = malloc(L * sizeof *z);
	float *tau = malloc(L * sizeof *tau);
	float *sigt = malloc(L * sizeof *sigt);
	float *lat = malloc(d * sizeof *lat);
	float *gain = malloc(d * sizeof *gain);
	double *cs = malloc(d * sizeof *cs); /* RoPE frequencies */
	int ret = -ENOMEM;
	if (!M || !tmp || !sig || !per || !pha || !mu || !w || !us || !z ||
	    !tau || !sigt || !lat || !gain || !cs)
		goto out;

	random_orthonormal(&r, M, d, L, tmp);

	/* Spectrum: Σσ² = (1 - floor) d, i.e. unit average channel variance. */
	double tot = 0;
	for (uint32_t j = 0; j < L; j++)
		tot += pow(j + 1.0, -alpha);
	for (uint32_t j = 0; j < L; j++) {
		sig[j] = sqrt(pow(j + 1.0, -alpha) * (1.0 - floor_share) * d / tot);
		per[j] = rng_range(&r, 8192.0, 65536.0);
		pha[j] = rng_range(&r, 0.0, 2.0 * SYNTH_PI);
	}
	const double fl = sqrt(floor_share);
	const double srho = sqrt(rho), srho1 = sqrt(1 - rho);

	/* Mean with outlier channels, and the drift direction. */
	for (uint32_t i = 0; i < d; i++) {
		mu[i] = 0.3 * rng_normal(&r);
		w[i] = 0.5 * rng_normal(&r);
	}
	uint32_t n_out = kind == KIND_K ? o->key_outliers : 1;
	double omag = kind == KIND_K ? o->outlier_mag : o->outlier_mag / 2.5;
	for (uint32_t k = 0; k < n_out; k++) {
		/* lowest-frequency quarter of the RoPE pairs: i in [3d/8, d/2),
		 * either half of the pair */
		uint32_t i = 3 * d / 8 + rng_below(&r, d / 8);
		if (rng_unif(&r) < 0.5)
			i += d / 2;
		double s = rng_unif(&r) < 0.5 ? -1.0 : 1.0;
		mu[i] = s * omag * rng_range(&r, 0.67, 1.33);
	}
	const double pmu = rng_range(&r, 16384.0, 65536.0);
	const double phmu = rng_range(&r, 0.0, 2.0 * SYNTH_PI);

	for (uint32_t i = 0; i < d / 2; i++)
		cs[i] = o->rope_base > 0 ? pow(o->rope_base, -2.0 * i / d) : 0;
	/* Keys: the latent loads more on low-frequency RoPE pairs (pair
	 * index p = i mod d/2 large), gain ∝ exp(key_lowfreq · p/(d/2)),
	 * normalised to unit mean square.  Values: flat. */
	double gs = 0;
	for (uint32_t i = 0; i < d; i++) {
		double p = (double)(i % (d / 2)) / (d / 2);
		gain[i] = (float)(kind == KIND_K ? exp(o->key_lowfreq * p) : 1.0);
		gs += (double)gain[i] * gain[i];
	}
	gs = sqrt(d / gs);
	for (uint32_t i = 0; i < d; i++)
		gain[i] = (float)(gain[i] * gs);

	/* The sink's own direction and the queries' background directions
	 * live in the keys' principal subspace (queries and keys share it in
	 * real models, which is why low-rank key approximations preserve
	 * attention scores): gain ⊙ M (σ ⊙ ξ).  Own stream, so the keys do not
	 * depend on how many queries are drawn. */
	struct rng rq;
	rng_init(&rq, o->seed, 5, h);
	for (uint32_t k = 0; k <= nqb; k++) {
		double *v = k ? tmp : us;
		for (uint32_t i = 0; i < d; i++)
			v[i] = 0;
		for (uint32_t j = 0; j < L; j++) {
			double xi = sig[j] * rng_normal(&rq);
			for (uint32_t i = 0; i < d; i++)
				v[i] += xi * M[(size_t)j * d + i];
		}
		for (uint32_t i = 0; i < d; i++)
			v[i] *= gain[i];
		if (k == 0) { /* the sink direction: unit, not rotated (t = 0) */
			double nn = 0;
			for (uint32_t i = 0; i < d; i++)
				nn += v[i] * v[i];
			for (uint32_t i = 0; i < d; i++)
				v[i] /= sqrt(nn);
			continue;
		}
		/* a query at position n: RoPE by n */
		float *qo = qb + (size_t)(k - 1) * d;
		for (uint32_t i = 0; i < d / 2; i++) {
			double a = (double)n * cs[i], c = cos(a), sn = sin(a);
			qo[i] = (float)(v[i] * c - v[i + d / 2] * sn);
			qo[i + d / 2] = (float)(v[i] * sn + v[i + d / 2] * c);
		}
	}

	uint32_t span = 0;
	for (uint32_t t = 0; t < n; t++) {
		float *row = x + (size_t)t * d;
		if (t == sp->start[span]) { /* new span: new topic */
			for (uint32_t j = 0; j < L; j++)
				tau[j] = (float)rng_normal(&r);
			span++;
		}
		/* The drift is slow (periods >= 8K tokens): refresh the
		 * spectrum every 64 tokens. */
		if (t % 64 == 0)
			for (uint32_t j = 0; j < L; j++)
				sigt[j] = (float)(sig[j] *
					exp(o->drift * sin(2 * SYNTH_PI * t / per[j] +
							   pha[j])));
		for (uint32_t j = 0; j < L; j++)
			z[j] = sigt[j] * (float)(srho * tau[j] +
						 srho1 * rng_normal(&r));
		uint32_t nh = rng_poisson(&r, heavy);
		for (uint32_t k = 0; k < nh; k++) {
			uint32_t j = rng_below(&r, L);
			double s = rng_unif(&r) < 0.5 ? -1.0 : 1.0;
			z[j] += (float)(s * o->heavy_mag * rng_range(&r, 0.75, 1.25));
		}
		double dm = sin(2 * SYNTH_PI * t / pmu + phmu);
		for (uint32_t i = 0; i < d; i++)
			row[i] = (float)(mu[i] + dm * w[i] + fl * rng_normal(&r));
		for (uint32_t i = 0; i < d; i++)
			lat[i] = 0;
		for (uint32_t j = 0; j < L; j++) {
			const float *m = M + (size_t)j * d;
			const float zj = z[j];
			for (uint32_t i = 0; i < d; i++)
				lat[i] += zj * m[i];
		}
		for (uint32_t i = 0; i < d; i++)
			row[i] += gain[i] * lat[i];
		if (t == 0) {
			if (kind == KIND_K) {
				double c = o->sink_key_norm * sqrt((double)d);
				for (uint32_t i = 0; i < d; i++)
					row[i] = (float)(mu[i] + c * us[i]);
			} else {
				for (uint32_t i = 0; i < d; i++)
					row[i] *= 0.1f;
			}
		}
		if (kind == KIND_K && o->rope_base > 0) {
			for (uint32_t i = 0; i < d / 2; i++) {
				double a = t * cs[i];
				double c = cos(a), s = sin(a);
				double x0 = row[i], x1 = row[i + d / 2];
				row[i] = (float)(x0 * c - x1 * s);
				row[i + d / 2] = (float)(x0 * s + x1 * c);
			}
		}
		if (o->dtype == MKV_DTYPE_BF16)
			for (uint32_t i = 0; i < d; i++)
				row[i] = bf16_to_f32(f32_to_bf16(row[i]));
	}
	ret = 0;
out:
	free(M);
	free(tmp);
	free(sig);
	free(per);
	free(pha);
	free(mu);
	free(w);
	free(us);
	free(z);
	free(tau);
	free(sigt);
	free(lat);
	free(gain);
	free(cs);
	return ret;
}

/* ---- queries ------------------------------------------------------------ */

/* Softmax share of the tokens flagged in @mask among tokens [from, n) for
 * logits l_t = base_t + a * dir_t. */
static double share(const float *base, const float *dir, const uint8_t *mask,
		    uint32_t from, uint32_t n, double a)
{
	double mx = -INFINITY;
	for (uint32_t t = from; t < n; t++) {
		double l = base[t] + a * dir[t];
		if (l > mx)
			mx = l;
	}
	double all = 0, sel = 0;
	for (uint32_t t = from; t < n; t++) {
		double l = base[t] + a * dir[t] - mx;
		if (l < -60) /* negligible; also spares exp() its underflow path */
			continue;
		double e = exp(l);
		all += e;
		if (mask[t])
			sel += e;
	}
	return sel / all;
}

/*
 * Find a >= 0 with share(a) ≈ target.  The share need not grow without
 * bound (a token outside the set may score highest along dir), so scan a
 * geometric grid up to logit gains of ~40 for the first point reaching the
 * target, then bisect below it; if none does, take the best grid point.
 */
static double solve(const float *base, const float *dir, const uint8_t *mask,
		    uint32_t from, uint32_t n, double target)
{
	float dmax = 0;
	for (uint32_t t = from; t < n; t++)
		if (fabsf(dir[t]) > dmax)
			dmax = fabsf(dir[t]);
	if (dmax == 0)
		return 0;
	double s0 = share(base, dir, mask, from, n, 0);
	if (s0 >= target)
		return 0;
	double lo = 0, hi = -1, best = 0, sbest = s0;
	for (double a = 0.05 / dmax; a <= 40.0 / dmax; a *= 1.5) {
		double s = share(base, dir, mask, from, n, a);
		if (s >= target) {
			hi = a;
			break;
		}
		lo = a;
		if (s > sbest) {
			sbest = s;
			best = a;
		}
	}
	if (hi < 0)
		return best;
	for (int it = 0; it < 40; it++) {
		double m = 0.5 * (lo + hi), s = share(base, dir, mask, from, n, m);
		if (fabs(s - target) < 2e-3)
			return m;
		if (s < target)
			lo = m;
		else
			hi = m;
	}
	return 0.5 * (lo + hi);
}

static void unitize(double *v, uint32_t d)
{
	double nn = 0;
	for (uint32_t i = 0; i < d; i++)
		nn += v[i] * v[i];
	if (nn <= 0)
		return;
	nn = 1.0 / sqrt(nn);
	for (uint32_t i = 0; i < d; i++)
		v[i] *= nn;
}

static int gen_queries(const struct synth_opts *o, const struct spans *sp,
		       uint32_t h, const float *k, const float *qb, float *q,
		       double *sink_acc, double *rel_acc)
{
	const uint32_t n = o->n, d = o->d;
	const double scale = 1.0 / sqrt((double)d);
	struct rng r;
	rng_init(&r, o->seed, 4, h);
	int ret = -ENOMEM;
	float *base = malloc((size_t)n * sizeof *base);
	float *rdot = malloc((size_t)n * sizeof *rdot);
	float *sdot = malloc((size_t)n * sizeof *sdot);
	uint8_t *mask = calloc(n, 1);
	uint8_t *smask = calloc(n, 1);
	double *kmean = calloc(d, sizeof *kmean);
	double *us = malloc(d * sizeof *us);
	double *qg = malloc(d * sizeof *qg);
	double *dir = malloc(d * sizeof *dir);
	double *sd = malloc((size_t)o->rel_spans * d * sizeof *sd);
	uint32_t *pool = malloc(o->rel_spans * sizeof *pool);
	if (!base || !rdot || !sdot || !mask || !smask || !kmean || !us ||
	    !qg || !dir || !sd || !pool)
		goto out;

	for (uint32_t t = 0; t < n; t++)
		for (uint32_t i = 0; i < d; i++)
			kmean[i] += k[(size_t)t * d + i];
	for (uint32_t i = 0; i < d; i++) {
		kmean[i] /= n;
		us[i] = k[i] - kmean[i];
	}
	unitize(us, d);
	smask[0] = 1;
	for (uint32_t t = 0; t < n; t++) {
		double s = 0;
		for (uint32_t i = 0; i < d; i++)
			s += us[i] * k[(size_t)t * d + i];
		sdot[t] = (float)(s * scale);
	}

	for (uint32_t st = 0; st < o->n_steps; st++) {
		/* The group's pool of relevant spans and their directions:
		 * span mean minus the mean of the ±256 tokens around it. */
		for (uint32_t p = 0; p < o->rel_spans; p++) {
			uint32_t s = 1 + rng_below(&r, sp->count - 1);
			pool[p] = s;
			uint32_t a = sp->start[s], b = sp->start[s + 1];
			uint32_t la = a > 256 ? a - 256 : 0;
			uint32_t lb = b + 256 < n ? b + 256 : n;
			double *v = sd + (size_t)p * d;
			for (uint32_t i = 0; i < d; i++) {
				double ms = 0, ml = 0;
				for (uint32_t t = a; t < b; t++)
					ms += k[(size_t)t * d + i];
				for (uint32_t t = la; t < lb; t++)
					ml += k[(size_t)t * d + i];
				v[i] = ms / (b - a) - ml / (lb - la);
			}
			unitize(v, d);
		}
		for (uint32_t g = 0; g < o->n_q; g++) {
			float *qo = q + (((size_t)h * o->n_steps + st) * o->n_q + g) * d;
			memset(dir, 0, d * sizeof *dir);
			memset(mask, 0, n);
			uint32_t taken = 0;
			for (uint32_t p = 0; p < o->rel_spans; p++) {
				int take = rng_unif(&r) < 0.75;
				if (!take && p + 1 == o->rel_spans && !taken)
					take = 1;
				double wt = rng_range(&r, 0.5, 1.5);
				if (!take)
					continue;
				taken++;
				for (uint32_t i = 0; i < d; i++)
					dir[i] += wt * sd[(size_t)p * d + i];
				for (uint32_t t = sp->start[pool[p]];
				     t < sp->start[pool[p] + 1]; t++)
					mask[t] = 1;
			}
			unitize(dir, d);
			const float *qbg = qb + ((size_t)st * o->n_q + g) * d;
			for (uint32_t i = 0; i < d; i++)
				qg[i] = qbg[i];
			double m1 = 0, m2 = 0;
			for (uint32_t t = 0; t < n; t++) {
				const float *kt = k + (size_t)t * d;
				double b = 0, rr = 0;
				for (uint32_t i = 0; i < d; i++) {
					b += qg[i] * kt[i];
					rr += dir[i] * kt[i];
				}
				base[t] = (float)(b * scale);
				rdot[t] = (float)(rr * scale);
				if (t) {
					m1 += base[t];
					m2 += (double)base[t] * base[t];
				}
			}
			/* Background logits get standard deviation q_temp. */
			m1 /= n - 1;
			double sdv = sqrt(fmax(m2 / (n - 1) - m1 * m1, 1e-30));
			double f = o->q_temp / sdv;
			for (uint32_t i = 0; i < d; i++)
				qg[i] *= f;
			for (uint32_t t = 0; t < n; t++)
				base[t] = (float)(base[t] * f);
			double trel = rng_range(&r, o->rel_mass_lo, o->rel_mass_hi);
			double tsink = rng_range(&r, o->sink_mass_lo, o->sink_mass_hi);
			/* Relevant share among non-sink tokens, then the sink. */
			double ar = solve(base, rdot, mask, 1, n, trel);
			for (uint32_t t = 0; t < n; t++)
				base[t] += (float)(ar * rdot[t]);
			double as = solve(base, sdot, smask, 0, n, tsink);
			for (uint32_t i = 0; i < d; i++)
				qo[i] = (float)(qg[i] + ar * dir[i] + as * us[i]);
			*rel_acc += trel;
			*sink_acc += tsink;
		}
	}
	ret = 0;
out:
	free(base);
	free(rdot);
	free(sdot);
	free(mask);
	free(smask);
	free(kmean);
	free(us);
	free(qg);
	free(dir);
	free(sd);
	free(pool);
	return ret;
}

/* ---- entry points ------------------------------------------------------- */

static void store(void *dst, const float *src, enum mkv_dtype dt, size_t n)
{
	if (dt == MKV_DTYPE_F32) {
		memcpy(dst, src, n * sizeof *src);
		return;
	}
	uint16_t *p = dst;
	for (size_t i = 0; i < n; i++)
		p[i] = f32_to_bf16(src[i]); /* exact: src is already rounded */
}

int synth_generate(const struct synth_opts *o, struct synth_kv *out)
{
	if (!out || !opts_valid(o))
		return -EINVAL;
	const size_t nd = (size_t)o->n * o->d;
	const size_t es = o->dtype == MKV_DTYPE_F32 ? 4 : 2;
	struct synth_kv kv = {
		.n = o->n, .d = o->d, .n_kv = o->n_kv, .n_q = o->n_q,
		.n_steps = o->n_steps, .dtype = o->dtype,
	};
	struct spans sp = { 0 };
	float *buf = malloc(nd * sizeof *buf);
	const size_t nqb = (size_t)o->n_steps * o->n_q;
	float *qb = malloc((nqb ? nqb : 1) * o->d * sizeof *qb);
	kv.k = malloc(nd * es * o->n_kv);
	kv.v = malloc(nd * es * o->n_kv);
	if (o->n_steps)
		kv.q = malloc((size_t)o->n_kv * o->n_steps * o->n_q * o->d *
			      sizeof *kv.q);
	int ret = -ENOMEM;
	if (!buf || !qb || !kv.k || !kv.v || (o->n_steps && !kv.q))
		goto fail;
	if ((ret = spans_make(&sp, o->n, o->seed)))
		goto fail;
	double sink = 0, rel = 0;
	for (uint32_t h = 0; h < o->n_kv; h++) {
		if ((ret = gen_head(o, &sp, KIND_K, h, buf, qb, (uint32_t)nqb)))
			goto fail;
		store((char *)kv.k + nd * es * h, buf, o->dtype, nd);
		if (o->n_steps &&
		    (ret = gen_queries(o, &sp, h, buf, qb, kv.q, &sink, &rel)))
			goto fail;
		if ((ret = gen_head(o, &sp, KIND_V, h, buf, NULL, 0)))
			goto fail;
		store((char *)kv.v + nd * es * h, buf, o->dtype, nd);
	}
	if (o->n_steps) {
		double cnt = (double)o->n_kv * o->n_steps * o->n_q;
		kv.sink_mass = sink / cnt;
		kv.rel_mass = rel / cnt;
	}
	free(sp.start);
	free(buf);
	free(qb);
	*out = kv;
	return 0;
fail:
	free(sp.start);
	free(buf);
	free(qb);
	synth_free(&kv);
	return ret;
}

void synth_free(struct synth_kv *kv)
{
	if (!kv)
		return;
	free(kv->k);
	free(kv->v);
	free(kv->q);
	memset(kv, 0, sizeof *kv);
}

const void *synth_k(const struct synth_kv *kv, uint32_t h)
{
	size_t es = kv->dtype == MKV_DTYPE_F32 ? 4 : 2;
	return (const char *)kv->k + (size_t)kv->n * kv->d * es * h;
}

const void *synth_v(const struct synth_kv *kv, uint32_t h)
{
	size_t es = kv->dtype == MKV_DTYPE_F32 ? 4 : 2;
	return (const char *)kv->v + (size_t)kv->n * kv->d * es * h;
}

const float *synth_q(const struct synth_kv *kv, uint32_t h, uint32_t s)
{
	return kv->q + ((size_t)h * kv->n_steps + s) * kv->n_q * kv->d;
}
