/* SPDX-License-Identifier: MIT */
/* Shared by the two parts of mosaickv-demo. */
#ifndef MOSAICKV_TOOLS_DEMO_H
#define MOSAICKV_TOOLS_DEMO_H

#include <math.h>
#include <errno.h>
#include <stdint.h>
#include <mosaickv.h>

#define DEMO_D 128
#define DEMO_WIN 64   /* recent tokens kept dense */
#define DEMO_NQ 4     /* query heads per KV head */
#define DEMO_NSTEPS 8 /* decode queries per KV head */

struct demo_cfg {
	uint32_t tokens, segment, heads;
	double channels, tokens_frac;
	uint32_t value_bits; /* 0: bf16 values; 4..8: quantized rows */
	uint64_t seed;
	/* pipeline part */
	uint32_t layers, decode;
	double hbm_frac;
	const char *nvme_dir;
};

/*
 * Values kept per vector for a channel share @channels read as a byte
 * budget: the largest r <= @d_keep whose packed row (mkv_row_bytes) fits
 * the bytes of channels * d bf16 values; r = channels * d with bf16 rows.
 */
static inline uint32_t demo_r(double channels, uint32_t d, uint32_t d_keep,
			      uint32_t value_bits)
{
	uint32_t r = 1;
	double budget = channels * d * 2;
	for (uint32_t t = 1; t <= d_keep; t++)
		if (mkv_row_bytes(t, value_bits, MKV_DTYPE_BF16) <= budget + 1e-9)
			r = t;
	return r;
}

/* The decode pipeline through the sequence API; 0 or 1 (message printed). */
int run_pipeline(const struct demo_cfg *c);

#endif
