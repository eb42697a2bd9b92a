/* SPDX-License-Identifier: MIT */
/*
 * gpu/gather — copy many small pieces (the selected blocks of segments held
 * in mapped pinned host memory) into one device buffer with ONE kernel
 * launch, instead of one cudaMemcpy per piece (~10 µs each on the H200:
 * 512 separate 16 KiB copies move 1.6 GB/s).
 *
 * Plain C and free of CUDA headers, so that C callers built without the
 * CUDA include path (mosaickv/store.c) can include it: a stream is
 * struct CUstream_st * (what cudaStream_t is).  Entries are internal
 * (gpu_*, hidden) and return 0 or a negative errno (-EINVAL bad
 * arguments, -ENOMEM allocation, -MKV_ENODEV no usable device, -EIO any
 * other CUDA error); they never abort and never print.
 *
 * Source pointers must be readable by the device as they are: device
 * memory, or page-locked host memory registered or allocated as mapped on
 * a device with canUseHostPointerForRegisteredMem (unified addressing:
 * the host address is the device address).  The kernel then reads the
 * host bytes over PCIe itself (zero-copy), 16 bytes per thread where
 * source and destination agree modulo 16, 4 or 1 otherwise.
 */
#ifndef MKV_GPU_GATHER_CUH
#define MKV_GPU_GATHER_CUH

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef GPU_HIDDEN
#if defined(__GNUC__)
#define GPU_HIDDEN __attribute__((visibility("hidden")))
#else
#define GPU_HIDDEN
#endif
#endif

struct CUstream_st;

/* One piece: @len bytes from @src to byte @dst of the destination. */
struct gpu_piece {
	const void *src;
	uint64_t dst;
	uint64_t len;
};

/*
 * Copy the @n pieces of @pieces (itself device-readable: device memory or
 * mapped pinned host memory) into @dst (device memory) with one launch on
 * @s.  @max_len, the longest piece's length, only sizes the launch (a
 * longer piece is still copied whole, by fewer warps).  Asynchronous: the
 * copy is done when @s reaches this point.  Overlapping destinations give
 * unspecified bytes there.
 */
GPU_HIDDEN int gpu_gather(const struct gpu_piece *pieces, uint32_t n,
			  uint64_t max_len, void *dst, struct CUstream_st *s);

/* The CPU reference: memcpy of each piece, host memory only. */
GPU_HIDDEN void gpu_gather_ref(const struct gpu_piece *pieces, uint32_t n,
			       void *dst);

/*
 * A gather context: a pinned host table of pieces the caller fills, its
 * device copy and a stream, on one device.  One thread at a time.  By
 * default (unified addressing) the kernel reads the pinned table in
 * place; otherwise, or after gpu_gather_ctx_set_upload(c, 1), one
 * host-to-device copy of the table precedes the launch.
 */
struct gpu_gather_ctx;

/* Create a context on device @dev for up to @cap pieces (grown by
 * gpu_gather_ctx_table).  Returns 0, -EINVAL, -ENOMEM, -MKV_ENODEV, -EIO. */
GPU_HIDDEN int gpu_gather_ctx_create(int dev, uint32_t cap,
				     struct gpu_gather_ctx **out);
/* NULL is accepted. */
GPU_HIDDEN void gpu_gather_ctx_destroy(struct gpu_gather_ctx *c);
/* The host table, with room for at least @n pieces (grown if needed, old
 * contents lost), or NULL (out of memory).  Valid until the next call. */
GPU_HIDDEN struct gpu_piece *gpu_gather_ctx_table(struct gpu_gather_ctx *c,
						  uint32_t n);
/* 1: upload the table before each launch; 0: read it in place (-EINVAL
 * without unified addressing).  Returns 0 or -errno. */
GPU_HIDDEN int gpu_gather_ctx_set_upload(struct gpu_gather_ctx *c, int upload);
/*
 * Gather the first @n pieces of the table into @dst with one launch (after
 * one host-to-device copy of the table in upload mode) and wait.  On
 * return 0 the bytes are in @dst.
 */
GPU_HIDDEN int gpu_gather_ctx_run(struct gpu_gather_ctx *c, uint32_t n,
				  void *dst);
/*
 * gpu_gather_ctx_run in parts, so that the caller's CPU work overlaps the
 * copy: launch queues pieces @first..@first+@n-1 of the table (several
 * launches may cover disjoint parts of it, and those pieces must not
 * change until wait returns); wait returns 0 once every queued piece is in
 * @dst, or the first -errno.  A launch that failed needs no wait.
 */
GPU_HIDDEN int gpu_gather_ctx_launch(struct gpu_gather_ctx *c, uint32_t first,
				     uint32_t n, void *dst);
GPU_HIDDEN int gpu_gather_ctx_wait(struct gpu_gather_ctx *c);

/*
 * Selected blocks of segments, by value.  A piece table lives in host
 * memory, so every warp's first read of its piece is a round trip over
 * the link before the data's (and a table the CPU has just written is
 * slower still to read: its lines are dirty in the CPU's caches).  Here
 * the whole work list travels in the kernel's parameters instead: per
 * segment its bytes' address and block layout, per block its index.
 * Measured on the H200 (bench/gather_probe.cu, 2.1 MB of 1 KiB + 256 B
 * pieces, wall clock launch to completion): 37.5 GB/s against 32.3 for
 * the same kernel over a freshly written piece table, and 45 GB/s for one
 * cudaMemcpy of the same byte count.
 *
 * Segment i's selected blocks blk[first[i]..first[i+1]-1] (ascending, so
 * that only the last can be short) land at dst + seg[i].dst + p * (vb +
 * bb) for the p-th of them, its values (min(vb, values_len - j * vb)
 * bytes from values_off + j * vb) then its bitmaps (likewise) right
 * after: the store's staged layout.
 */
#define GPU_BG_MAXSEG 64
#define GPU_BG_MAXBLK 2048
struct gpu_bg_seg {
	const char *src; /* the segment's bytes, device-readable in place */
	uint64_t dst;    /* byte of the destination for its first block */
	uint32_t values_off, values_block, values_len;
	uint32_t bitmaps_off, bitmaps_block, bitmaps_len;
};
struct gpu_bg_args {
	uint32_t nseg;
	uint32_t first[GPU_BG_MAXSEG + 1];
	struct gpu_bg_seg seg[GPU_BG_MAXSEG];
	uint32_t blk[GPU_BG_MAXBLK];
};
/* Queue the copy of @a's blocks into @dst (device memory) on the
 * context's stream (one launch; finish with gpu_gather_ctx_wait).  The
 * arguments are copied at the launch: @a may change at once, the source
 * bytes not until the wait.  Returns 0, -EINVAL (bad arguments: nseg or a
 * block count over the limits, first[] not ascending, a block past its
 * segment), -EIO. */
GPU_HIDDEN int gpu_gather_ctx_launch_blocks(struct gpu_gather_ctx *c,
					    const struct gpu_bg_args *a, void *dst);
/* The CPU reference: the same copies by memcpy, host memory only.
 * Returns 0 or -EINVAL (as above). */
GPU_HIDDEN int gpu_gather_blocks_ref(const struct gpu_bg_args *a, void *dst);

/*
 * Device-driven gather (the store's struct mkv_devmap).  Decode selects
 * blocks on the GPU; a host-driven fetch would have to bring that
 * selection to the host, resolve it under the store's lock and launch a
 * copy, and on the H200's VM that host work alone costs more than a
 * fifth of the copy (docs/PERF.md, bench/tiers).  Here the segments'
 * table lives in device memory, built once while the segments are pinned,
 * and the kernel reads the selection where the GPU wrote it: nothing of
 * the host's lies between the selection and the copy.
 *
 * Blocks are numbered over the table: segment i's block j is
 * seg[i].first + j (first ascending, seg[i + 1].first = seg[i].first +
 * seg[i].n_blocks).  Selected entry k lands, when its segment is copied,
 * at staging + k * slot (its values, then its bitmaps right after);
 * otherwise its address in place is reported.
 */
struct gpu_dm_seg {
	const char *src;  /* the segment's bytes, device-readable in place */
	uint64_t first;   /* number of its block 0 */
	uint64_t values_off, values_len, bitmaps_off, bitmaps_len;
	uint32_t values_block, bitmaps_block, n_blocks;
	uint8_t copy;     /* 1: copy selected blocks to the staging; 0: hand
	                   * out their addresses in place (device memory) */
	uint8_t tier;     /* reported in the addresses */
};
/* Where one selected block is: the layout of the public struct
 * mkv_block_addr (store.c asserts it). */
struct gpu_dm_addr {
	const void *values;
	const void *bitmaps;
	uint32_t values_bytes, bitmaps_bytes;
	uint8_t tier, device;
};
struct gpu_devmap;
/* Upload @n segments' table (checked: first[] consecutive from 0, each
 * n_blocks >= 1 and within values_len / bitmaps_len, src set) to device
 * @dev, with a zeroed per-block hit counter.  Returns 0, -EINVAL, -ENOMEM,
 * -MKV_ENODEV, -EIO. */
GPU_HIDDEN int gpu_devmap_create(int dev, const struct gpu_dm_seg *segs,
				 uint32_t n, struct gpu_devmap **out);
/* Waits for the map's queued gathers, then frees it.  NULL is accepted. */
GPU_HIDDEN void gpu_devmap_destroy(struct gpu_devmap *m);
/* Total blocks of the table. */
GPU_HIDDEN uint64_t gpu_devmap_blocks(const struct gpu_devmap *m);
/*
 * Queue on @s: for k < min(*@count, @max_sel) (@count NULL: @max_sel),
 * resolve block @sel[k], copy it to @staging + k * @slot if its segment
 * is copied, write @out[k], and count a hit for the block.  An id past
 * the table gets a zero @out[k] and counts as refused, as do the entries
 * past @max_sel when *@count exceeds it.  @sel, @count, @staging, @out:
 * device memory (the caller checks).  Returns 0, -EINVAL, -EIO.
 */
GPU_HIDDEN int gpu_devmap_gather(struct gpu_devmap *m, const uint32_t *sel,
				 const uint32_t *count, uint32_t max_sel,
				 void *staging, uint64_t slot,
				 struct gpu_dm_addr *out, struct CUstream_st *s);
/* Wait for every gather queued so far, add the per-block hits to
 * @hits[] (host, gpu_devmap_blocks entries) and the refused entries to
 * *@refused, and zero both counters on the device.  Returns 0 or -errno. */
GPU_HIDDEN int gpu_devmap_collect(struct gpu_devmap *m, uint32_t *hits,
				  uint64_t *refused);
/* The CPU reference of gpu_devmap_gather over host memory: the same
 * table (unchecked), selection, staging and outputs; adds to @hits[] and
 * *@refused as collect would. */
GPU_HIDDEN void gpu_devmap_gather_ref(const struct gpu_dm_seg *segs, uint32_t n,
				      const uint32_t *sel, uint32_t count,
				      uint32_t max_sel, char *staging, uint64_t slot,
				      struct gpu_dm_addr *out, uint32_t *hits,
				      uint64_t *refused);

#ifdef __cplusplus
}
#endif
#endif
