/* SPDX-License-Identifier: MIT */
/* Shared by the two parts of mosaickv-demo. */
#ifndef MOSAICKV_TOOLS_DEMO_H
#define MOSAICKV_TOOLS_DEMO_H

#include <math.h>
#include <errno.h>
#include <stdint.h>

#define DEMO_D 128
#define DEMO_WIN 64   /* recent tokens kept dense */
#define DEMO_NQ 4     /* query heads per KV head */
#define DEMO_NSTEPS 8 /* decode queries per KV head */

struct demo_cfg {
	uint32_t tokens, segment, heads;
	double channels, tokens_frac;
	uint64_t seed;
	/* pipeline part */
	uint32_t layers, decode;
	double hbm_frac;
	const char *nvme_dir;
};

/* The decode pipeline through the sequence API; 0 or 1 (message printed). */
int run_pipeline(const struct demo_cfg *c);

#endif
