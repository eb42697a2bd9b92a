/* SPDX-License-Identifier: MIT */
/*
 * Helpers of the GPU suite: a seeded RNG, bf16 conversion, synthetic K/V
 * with a real eigen-spread, and a packed context (segments encoded by the
 * compression core, uploaded into the device layout of gpu/gpu.cuh).
 * Every test calls GU_NEED_GPU() first, in its body: Criterion forks per
 * test, and CUDA must not be touched in the parent or a constructor.
 */
#ifndef MKV_TESTS_GPU_UTIL_H
#define MKV_TESTS_GPU_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <mosaickv.h>
#include "gpu.cuh"

#define GU_NEED_GPU()                                                      \
	do {                                                               \
		int ok_ = gpu_device_ok();                                 \
		if (ok_ <= 0)                                              \
			cr_skip_test("no usable CUDA device (%d)", ok_);   \
	} while (0)

#define GU_CK(call)                                                         \
	do {                                                                \
		cudaError_t e_ = (call);                                    \
		cr_assert_eq(e_, cudaSuccess, "%s: %s", #call,              \
			     cudaGetErrorString(e_));                       \
	} while (0)

struct gu_rng {
	uint64_t s[4];
};
uint64_t gu_seed(void);
void gu_rng_init(struct gu_rng *g, uint64_t seed);
double gu_uniform(struct gu_rng *g);
double gu_normal(struct gu_rng *g);
uint32_t gu_below(struct gu_rng *g, uint32_t n);

uint16_t gu_bf16(float f);
float gu_f32(uint16_t h);

/* n × d keys or values: per-channel scales decaying over channels, an
 * offset, Gaussian noise, rounded to bf16 (into @out). */
void gu_fill_kv(struct gu_rng *g, uint16_t *out, size_t n, uint32_t d);

/* A device allocation (cudaMalloc) of @bytes, asserted. */
void *gu_dev(size_t bytes);
/* A device copy of @bytes at @h, landed on return (any stream may read
 * it). */
void *gu_upload(const void *h, size_t bytes);

/* One packed context (a KV head): nseg segment pairs plus a window. */
struct gu_ctx {
	uint32_t d, nseg, win_n;
	size_t ntot, n_hist;
	uint16_t *k, *v;  /* ntot × d bf16, history first, window last */
	struct mkv_segment *ks[16], *vs[16];
	size_t lens[16];
	void *dev[16];      /* device storage of each segment */
	void *pos[16];      /* value positions of each segment (gu_ctx_positions) */
	void *s8[16];       /* 8-bit summaries of each segment (gu_ctx_sum8) */
	struct gpu_seg segs[16];
	struct gpu_seg *dsegs; /* device array */
	uint16_t *dwin_k, *dwin_v;
	uint32_t n_blocks;
};

/* Encode (mkv_segment_encode with @o, kind set here) and upload. */
/* Encode @n bf16 rows of keys @k and values @v (host) with @o (d set) into
 * a K segment (@o's summaries) and a V segment (none); asserts success. */
void gu_encode_pair(const struct mkv_encode_opts *o, const uint16_t *k, const uint16_t *v,
		    size_t n, struct mkv_segment **ks, struct mkv_segment **vs);
void gu_ctx_build(struct gu_ctx *c, struct gu_rng *g, uint32_t d, uint32_t nseg,
		  const size_t *lens, uint32_t win_n, const struct mkv_encode_opts *o);
/* gu_ctx_build with the keys of tokens [@q0, @q1) scaled by @f before
 * encoding (f small: blocks no selection takes). */
void gu_ctx_build_quiet(struct gu_ctx *c, struct gu_rng *g, uint32_t d, uint32_t nseg,
			const size_t *lens, uint32_t win_n, const struct mkv_encode_opts *o,
			size_t q0, size_t q1, float f);
void gu_ctx_free(struct gu_ctx *c);
/* Upload @c's segment array again (after its host copy changed). */
void gu_ctx_segs_upload(struct gu_ctx *c);
/* Give segment s of @c value positions (gpu_seg_positions) where bit s of
 * @mask is set; re-uploads the segment array. */
void gu_ctx_positions(struct gu_ctx *c, uint32_t mask);
/* Put segment s of @c in store order (gpu_seg_schedule, in place) where
 * bit s of @mask is set; the segment must have positions; re-uploads the
 * segment array. */
void gu_ctx_schedule(struct gu_ctx *c, uint32_t mask);
/* Give segment s of @c 8-bit summaries (gpu_seg_sum8) where bit s of
 * @mask is set; re-uploads the segment array. */
void gu_ctx_sum8(struct gu_ctx *c, uint32_t mask);
/* gpu_head for the context (device pointers inside). */
struct gpu_head gu_ctx_head(const struct gu_ctx *c);

/* ‖a − b‖ / ‖b‖ */
double gu_rel_err(const float *a, const float *b, size_t n);

#endif
