/* SPDX-License-Identifier: MIT */
/*
 * Upload of a K/V pair of packed views into the device layout of
 * struct gpu_seg (see gpu.cuh): values padded to a multiple of 8 per
 * vector, bitmaps to whole 32-bit words, every array 256-byte aligned.
 * Host repacking happens once per segment, never per decode step.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "common.cuh"

/* The layout is seqbuf.cu's image with room for exactly n tokens. */
size_t gpu_seg_bytes(const struct mkv_packed_view *k, const struct mkv_packed_view *v)
{
	if (!k || !v || k->n > UINT32_MAX)
		return 0;
	return gpu_seg_cap_bytes(k, v, (uint32_t)k->n);
}

int gpu_seg_upload(const struct mkv_packed_view *k, const struct mkv_packed_view *v, void *dev,
		   struct gpu_seg *out)
{
	struct gpu_seg g;
	size_t total = gpu_seg_bytes(k, v);
	if (!dev || !out || !total)
		return -EINVAL;
	char *h = (char *)malloc(total);
	if (!h)
		return -ENOMEM;
	int rc = gpu_seg_image(k, v, (uint32_t)k->n, h, dev, &g);
	if (rc == 0) {
		cudaError_t e = cudaMemcpy(dev, h, total, cudaMemcpyHostToDevice);
		if (e != cudaSuccess)
			rc = gpu_errno(e);
	}
	free(h);
	if (rc == 0)
		*out = g;
	return rc;
}
