/* SPDX-License-Identifier: MIT */
/*
 * synth — a deterministic generator of synthetic long-context KV caches and
 * decode queries that look like an LLM's, for the demo and the benchmarks.
 *
 * Plain C11; it uses only <mosaickv/common.h> (for enum mkv_dtype) and
 * nothing of the library's internals.  The same options and seed give the
 * same data (one sequential random stream per purpose and head; libm's
 * sin/cos/exp/log enter, so another libm may differ in the last bits).
 *
 * The data model (the knobs are fields of struct synth_opts):
 *
 *  Sequence.  The n tokens are cut into "spans" of 8..64 tokens (sentences,
 *  say), shared by all heads.  Tokens of one span share a topic latent, so
 *  neighbouring keys are correlated and a block of b tokens is not a random
 *  sample (what makes block summaries meaningful).
 *
 *  Keys of one KV head, before RoPE:
 *      k̃_t = μ(t) + G M (σ(t) ⊙ z_t) + f ε_t
 *  - M is a fixed random d × L matrix with orthonormal columns, one per KV
 *    head and per K/V (the "mixing matrix"), L = d/2 for keys: a low-rank
 *    latent spread over all the original channels.  G is a per-channel gain
 *    exp(key_lowfreq · p/(d/2)) on RoPE pair p (normalised): real K
 *    projections put most energy in the low-frequency pairs.
 *  - σ_j ∝ (j+1)^(-key_alpha) is a decaying latent spectrum, normalised so a
 *    channel carries unit variance on average; f ε_t is a small isotropic
 *    floor (share key_floor of the variance).  Together: a decaying
 *    eigen-spectrum with a floor.
 *  - z_t = sqrt(ρ) τ_span(t) + sqrt(1-ρ) η_t with τ, η standard normal
 *    (ρ = span_coherence), plus per-token heavy elements: a Poisson number
 *    (mean heavy_per_token) of latent coordinates chosen uniformly among all
 *    L, each receiving ±heavy_mag (in channel-rms units, ±25%).  Each token
 *    thus has a few large elements of its own, often outside the
 *    high-variance directions: why one global channel mask (ThinK) loses
 *    energy that per-vector top-r keeps.  The MosaicKV paper finds only 62%
 *    of a vector's top-25% elements in the globally top-25% channels;
 *    bench/compress prints the same statistic for this data (key_lowfreq and
 *    heavy_* were set so that it lands near that figure, ~58% for keys).
 *  - μ(t) = μ + sin(2πt/P_μ + φ) w: a mean with key_outliers large outlier
 *    channels (|μ_c| = outlier_mag ± 33%, placed in the lowest-frequency
 *    RoPE pairs as in Llama's K caches) and a slow drift direction w; and
 *    σ_j(t) = σ_j exp(drift · sin(2πt/P_j + φ_j)) with periods P of 8K..64K
 *    tokens: the statistics move slowly along the sequence, so segments
 *    differ.
 *  - RoPE (rope_base > 0; Llama layout, channel i pairs with i + d/2, angle
 *    t · base^(-2i/d)) is applied to the keys, as a KV cache stores them.
 *    High-frequency pairs turn quickly and spread their energy; the
 *    low-frequency ones carry the outliers nearly unchanged.
 *  - Token 0 is an attention sink: its key is μ(0) plus a large component
 *    (sink_key_norm × sqrt(d)) along a direction of the key subspace.
 *
 *  Values: the same model with L = d, spectrum exponent val_alpha, a flat
 *  gain, floor val_floor, one weak outlier channel, half the heavy elements,
 *  half the span coherence, no RoPE; the sink's value is small (0.1 ×), as
 *  in real models.  Values are markedly less compressible than keys.
 *
 *  Queries (post-RoPE, at position n, right after the context).  Per decode
 *  step and KV head a pool of rel_spans "relevant" earlier spans is drawn;
 *  each of the n_q heads of the GQA group takes each pool span with
 *  probability 3/4 (at least one), with a weight in [0.5, 1.5]:
 *      q = q_gen + a_r Σ w_s unit(mean key of span s − mean of ±256 around)
 *                + a_s unit(k_0 − mean key)
 *  q_gen is drawn in the keys' principal subspace (G M (σ ⊙ ξ), RoPE'd to
 *  position n) -- queries and keys share it in real models, which is why
 *  low-rank key approximations keep attention scores -- and scaled so that
 *  the background logits q_gen·k/sqrt(d) have standard deviation q_temp.
 *  a_r and a_s are solved for on the exact softmax so that the relevant
 *  spans receive a share drawn from [rel_mass_lo, rel_mass_hi] of the
 *  non-sink attention and the sink a share drawn from [sink_mass_lo,
 *  sink_mass_hi] of all of it (per query head; a_r is capped where the
 *  target is not reachable).  Attention is thus peaky (retrieval heads):
 *  a few blocks that selection must find, over a diffuse tail that any
 *  top-k method loses part of.
 */
#ifndef MOSAICKV_TOOLS_SYNTH_H
#define MOSAICKV_TOOLS_SYNTH_H

#include <stddef.h>
#include <stdint.h>
#include <mosaickv/common.h>

#ifdef __cplusplus
extern "C" {
#endif

struct synth_opts {
	uint32_t n;       /* context tokens, >= 128.  Default 65536 */
	uint32_t d;       /* head dim, even, 16..256.  Default 128 */
	uint32_t n_kv;    /* KV heads.  Default 4 */
	uint32_t n_q;     /* query heads per KV head (GQA group).  Default 4 */
	uint32_t n_steps; /* decode queries per KV head (each n_q heads).
	                   * Default 8; 0 generates no queries */
	uint64_t seed;    /* default 1 */
	enum mkv_dtype dtype; /* K and V elements: MKV_DTYPE_F32 or
	                       * MKV_DTYPE_BF16.  Default BF16 */

	/* Model knobs (see the comment at the top).  Defaults in brackets. */
	double rope_base;       /* 0 = no RoPE [500000, Llama 3] */
	double key_lowfreq;     /* key latent gain exp(κ·p/(d/2)) on RoPE
	                         * pair p; 0 = flat [2.5] */
	double key_alpha;       /* key latent spectrum exponent [1.2] */
	double val_alpha;       /* value latent spectrum exponent [0.6] */
	double key_floor;       /* isotropic share of key variance [0.05] */
	double val_floor;       /* isotropic share of value variance [0.10] */
	uint32_t key_outliers;  /* large outlier channels in keys [4] */
	double outlier_mag;     /* their magnitude, channel-rms units [6] */
	double heavy_per_token; /* mean heavy elements per key [3] */
	double heavy_mag;       /* their magnitude, channel-rms units [3.5] */
	double span_coherence;  /* ρ for keys; values use ρ/2 [0.5] */
	double drift;           /* log-amplitude of spectrum drift [0.3] */
	double sink_key_norm;   /* sink key extra norm / sqrt(d) [2] */
	double sink_mass_lo, sink_mass_hi; /* sink's attention share [0.2, 0.5] */
	double rel_mass_lo, rel_mass_hi;   /* relevant spans' share of the
	                                    * non-sink attention [0.3, 0.8] */
	uint32_t rel_spans;     /* relevant spans per step and group [4] */
	double q_temp;          /* std of the background logits [1.5] */
};

/* Fill @o with the defaults. */
void synth_opts_default(struct synth_opts *o);

struct synth_kv {
	uint32_t n, d, n_kv, n_q, n_steps;
	enum mkv_dtype dtype;
	void *k;  /* n_kv × n × d elements of dtype, head-major, row-major */
	void *v;  /* same layout */
	float *q; /* n_kv × n_steps × n_q × d floats (NULL if n_steps == 0) */
	/* Diagnostics: mean over query heads of the dense attention share
	 * that the generator aimed at (sink, relevant spans). */
	double sink_mass, rel_mass;
};

/*
 * Generate the KV cache and queries described by @o into *@out (which the
 * caller frees with synth_free()).  Returns 0, -EINVAL on bad options
 * (d odd or out of range, n < 128, n_kv or n_q == 0, dtype not F32/BF16,
 * mass ranges outside (0, 1)), -ENOMEM.  Deterministic in @o.
 */
int synth_generate(const struct synth_opts *o, struct synth_kv *out);

/* Free what synth_generate() allocated; zeroes *@kv.  NULL is accepted. */
void synth_free(struct synth_kv *kv);

/* Head @h's n × d keys / values, and step @s's n_q × d queries. */
const void *synth_k(const struct synth_kv *kv, uint32_t h);
const void *synth_v(const struct synth_kv *kv, uint32_t h);
const float *synth_q(const struct synth_kv *kv, uint32_t h, uint32_t s);

#ifdef __cplusplus
}
#endif
#endif
