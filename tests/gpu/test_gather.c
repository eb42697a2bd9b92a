/* SPDX-License-Identifier: MIT */
/*
 * gpu/gather.cu against its CPU reference (memcpy of each piece) on fresh
 * random pieces: lengths from 0 bytes to a few hundred KiB, sources and
 * destinations aligned to 16 or not (and disagreeing modulo 16 or 4),
 * from mapped pinned host memory and from device memory, through the raw
 * entry and through a gather context (its table read in place and
 * uploaded).  Then the store's fetch, whose
 * host-tier blocks the kernel gathers into the device staging: every
 * fetched block must hold the bytes that were put.  Skips without a GPU.
 */
#include <errno.h>

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "gpu_util.h"
#include "gpu/gather.cuh"

#define FILL 0xA5

/* Random pieces over a source of @src_len bytes into a destination that
 * they leave gaps in; returns the count, *@dst_len the bytes needed. */
static uint32_t random_pieces(struct gu_rng *g, const char *src, size_t src_len,
			      struct gpu_piece *p, uint32_t max_n, size_t *dst_len)
{
	uint64_t pos = gu_below(g, 16);
	uint32_t n = max_n / 2 + gu_below(g, max_n / 2);

	for (uint32_t i = 0; i < n; i++) {
		uint32_t kind = gu_below(g, 100);
		uint64_t len, off;

		if (kind < 3)
			len = 0;
		else if (kind < 8)
			len = 65536 + gu_below(g, 300000); /* several spans */
		else if (kind < 60)
			len = 16 * (1 + gu_below(g, 128)); /* block-like */
		else
			len = 1 + gu_below(g, 3000);
		if (len > src_len)
			len = src_len;
		off = gu_below(g, (uint32_t)(src_len - len + 1));
		if (kind % 2 == 0)
			off &= ~(uint64_t)15;
		if (kind % 3 == 0) /* gap, sometimes misaligning */
			pos += gu_below(g, 64);
		else
			pos = (pos + 15) & ~(uint64_t)15;
		p[i] = (struct gpu_piece){ src + off, pos, len };
		pos += len;
	}
	*dst_len = pos + 64;
	return n;
}

static void check(const char *what, uint64_t seed, const char *dev_dst,
		  const struct gpu_piece *href, uint32_t n, size_t dst_len)
{
	char *want = malloc(dst_len), *got = malloc(dst_len);

	cr_assert(want && got);
	memset(want, FILL, dst_len);
	gpu_gather_ref(href, n, want);
	GU_CK(cudaMemcpy(got, dev_dst, dst_len, cudaMemcpyDeviceToHost));
	for (size_t i = 0; i < dst_len; i++)
		if (got[i] != want[i])
			cr_assert_fail("%s (seed %llx): byte %zu is %02x, want %02x",
				       what, (unsigned long long)seed, i,
				       got[i] & 0xff, want[i] & 0xff);
	free(want);
	free(got);
}

static void fill_random(struct gu_rng *g, char *p, size_t len)
{
	for (size_t i = 0; i < len; i += 8) {
		uint64_t v = (uint64_t)(gu_uniform(g) * 0x1p53) ^
			     ((uint64_t)gu_below(g, 1u << 31) << 33);
		memcpy(p + i, &v, len - i < 8 ? len - i : 8);
	}
}

/* @len bytes of mapped pinned host memory, random (cudaFreeHost). */
static char *mapped_random(struct gu_rng *g, size_t len)
{
	char *p = NULL;

	GU_CK(cudaHostAlloc((void **)&p, len, cudaHostAllocMapped));
	fill_random(g, p, len);
	return p;
}

Test(gather, raw_kernel_from_mapped_host)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng g;
	gu_rng_init(&g, seed);
	const size_t src_len = (size_t)8 << 20;
	char *src = mapped_random(&g, src_len);
	struct gpu_piece *p = malloc(4096 * sizeof *p);
	cr_assert(p);
	size_t dst_len;
	uint32_t n = random_pieces(&g, src, src_len, p, 4096, &dst_len);
	uint64_t max_len = 0;
	for (uint32_t i = 0; i < n; i++)
		max_len = p[i].len > max_len ? p[i].len : max_len;

	struct gpu_piece *dp = gu_upload(p, n * sizeof *p);
	char *dst = gu_dev(dst_len);
	GU_CK(cudaMemset(dst, FILL, dst_len));
	cr_assert_eq(gpu_gather(dp, n, max_len, dst, NULL), 0);
	GU_CK(cudaDeviceSynchronize());
	check("raw, mapped host", seed, dst, p, n, dst_len);

	/* A max_len hint below the longest piece only costs parallelism. */
	GU_CK(cudaMemset(dst, FILL, dst_len));
	cr_assert_eq(gpu_gather(dp, n, 16, dst, NULL), 0);
	GU_CK(cudaDeviceSynchronize());
	check("raw, short hint", seed, dst, p, n, dst_len);

	cr_assert_eq(gpu_gather(NULL, 3, 16, dst, NULL), -EINVAL);
	cr_assert_eq(gpu_gather(dp, 0, 0, dst, NULL), 0);
	cudaFree(dp);
	cudaFree(dst);
	cudaFreeHost(src);
	free(p);
}

Test(gather, context_from_device_and_host)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng g;
	gu_rng_init(&g, seed);
	const size_t src_len = (size_t)4 << 20;
	char *hsrc = malloc(src_len);
	cr_assert(hsrc);
	fill_random(&g, hsrc, src_len);
	char *dsrc = gu_upload(hsrc, src_len);
	char *msrc;
	GU_CK(cudaHostAlloc((void **)&msrc, src_len, cudaHostAllocMapped));
	memcpy(msrc, hsrc, src_len);

	struct gpu_gather_ctx *c = NULL;
	cr_assert_eq(gpu_gather_ctx_create(0, 4, &c), 0); /* grows below */
	for (int round = 0; round < 4; round++) {
		/* table read in place, then uploaded first, alternately */
		cr_assert_eq(gpu_gather_ctx_set_upload(c, round % 2), 0);
		struct gpu_piece *ref = malloc(8192 * sizeof *ref);
		size_t dst_len;
		uint32_t n = random_pieces(&g, hsrc, src_len, ref, 8192, &dst_len);
		struct gpu_piece *t = gpu_gather_ctx_table(c, n);
		cr_assert(t);
		for (uint32_t i = 0; i < n; i++) {
			size_t off = (const char *)ref[i].src - hsrc;
			/* alternate device and mapped-host sources */
			t[i] = ref[i];
			t[i].src = (i % 2 ? dsrc : msrc) + off;
		}
		char *dst = gu_dev(dst_len);
		GU_CK(cudaMemset(dst, FILL, dst_len));
		/* The context's stream does not wait for the legacy stream's
		 * memset: without this the fill could land after the copy. */
		GU_CK(cudaDeviceSynchronize());
		cr_assert_eq(gpu_gather_ctx_run(c, n, dst), 0);
		check("context", seed, dst, ref, n, dst_len);
		cudaFree(dst);
		free(ref);
	}
	cr_assert_eq(gpu_gather_ctx_run(c, 1u << 30, NULL), -EINVAL);
	gpu_gather_ctx_destroy(c);
	gpu_gather_ctx_destroy(NULL);
	cudaFreeHost(msrc);
	cudaFree(dsrc);
	free(hsrc);
}

/* The store's fetch: host-tier blocks land in the device staging.  @nseg
 * segments of @NB blocks, selected at pct0 + round * dpct percent. */
static void store_fetch_case(int NSEG, uint32_t NB, uint32_t pct0, uint32_t dpct)
{
	uint64_t seed = gu_seed();
	struct gu_rng g;
	gu_rng_init(&g, seed);
	struct mkv_store_opts o;
	struct mkv_store *s = NULL;
	cr_assert_eq(mkv_store_opts_init(&o, sizeof o), 0);
	o.gpu = 0;
	o.hbm_bytes = 64 << 10; /* the segments do not fit: host tier */
	o.host_bytes = 64 << 20;
	o.auto_balance = 0;
	cr_assert_eq(mkv_store_create(&o, &s), 0);

	char **pay = calloc(NSEG, sizeof *pay);
	struct mkv_store_layout *lay = calloc(NSEG, sizeof *lay);
	size_t *len = calloc(NSEG, sizeof *len);
	struct mkv_fetch_req *req = calloc(NSEG, sizeof *req);
	uint32_t *blocks = calloc((size_t)NSEG * NB, sizeof *blocks);
	struct mkv_block_addr *out = calloc((size_t)NSEG * NB, sizeof *out);
	cr_assert(pay && lay && len && req && blocks && out);
	for (int i = 0; i < NSEG; i++) {
		/* odd block sizes: pieces not multiples of 16, last one short */
		struct mkv_store_layout *l = &lay[i];
		l->n_blocks = NB;
		l->values_block = 1024 + (i % 3) * 24 + (i % 2) * 3;
		l->values_off = (uint64_t)(i % 4) * 8;
		l->values_len = l->values_block * NB - (i % 5) * 17;
		l->bitmaps_block = 256 + (i % 2) * 4;
		l->bitmaps_off = l->values_off + l->values_len + (i % 3);
		l->bitmaps_len = l->bitmaps_block * NB - (i % 7);
		len[i] = l->bitmaps_off + l->bitmaps_len + 5;
		pay[i] = malloc(len[i]);
		cr_assert(pay[i]);
		fill_random(&g, pay[i], len[i]);
		struct mkv_seg_key k = { .seq = 7, .layer = 0, .head = 0, .seg = i };
		cr_assert_eq(mkv_store_put(s, &k, pay[i], len[i], l), 0);
		struct mkv_seg_info info;
		cr_assert_eq(mkv_store_info(s, &k, &info), 0);
		cr_assert_eq(info.tier, MKV_TIER_HOST);
	}

	struct mkv_fetch *f = NULL;
	cr_assert_eq(mkv_fetch_create(s, (size_t)NSEG * NB * 1400, &f), 0);
	for (int round = 0; round < 4; round++) {
		size_t total = 0;
		for (int i = 0; i < NSEG; i++) {
			uint32_t nb = 0;
			for (uint32_t j = 0; j < NB; j++)
				if (gu_below(&g, 100) < pct0 + dpct * (uint32_t)round)
					blocks[(size_t)i * NB + nb++] = j;
			req[i] = (struct mkv_fetch_req){
				.key = { .seq = 7, .seg = (uint32_t)i },
				.blocks = blocks + (size_t)i * NB, .n_blocks = nb };
			total += nb;
		}
		int64_t got = mkv_store_fetch(f, req, NSEG, round + 1, out);
		cr_assert_eq(got, (int64_t)total, "seed %llx", (unsigned long long)seed);
		size_t o_ = 0;
		for (int i = 0; i < NSEG; i++) {
			for (uint32_t b = 0; b < req[i].n_blocks; b++, o_++) {
				uint32_t j = blocks[(size_t)i * NB + b];
				const struct mkv_store_layout *l = &lay[i];
				uint64_t vo = l->values_off + j * l->values_block;
				uint64_t bo = l->bitmaps_off + j * l->bitmaps_block;
				uint64_t vl = l->values_off + l->values_len - vo;
				uint64_t bl = l->bitmaps_off + l->bitmaps_len - bo;
				vl = vl < l->values_block ? vl : l->values_block;
				bl = bl < l->bitmaps_block ? bl : l->bitmaps_block;
				cr_assert_eq(out[o_].device, 1);
				cr_assert_eq(out[o_].tier, MKV_TIER_HOST);
				cr_assert_eq(out[o_].values_bytes, vl);
				cr_assert_eq(out[o_].bitmaps_bytes, bl);
				char hv[2048], hb[512];
				GU_CK(cudaMemcpy(hv, out[o_].values, vl, cudaMemcpyDeviceToHost));
				GU_CK(cudaMemcpy(hb, out[o_].bitmaps, bl, cudaMemcpyDeviceToHost));
				cr_assert_eq(memcmp(hv, pay[i] + vo, vl), 0,
					     "values of seg %d block %u (seed %llx)", i, j,
					     (unsigned long long)seed);
				cr_assert_eq(memcmp(hb, pay[i] + bo, bl), 0,
					     "bitmaps of seg %d block %u", i, j);
			}
		}
	}
	struct mkv_store_stats st = { .size = sizeof st };
	cr_assert_eq(mkv_store_get_stats(s, &st), 0);
	cr_assert_eq(st.tier[MKV_TIER_HBM].on_device, 1);
	cr_assert_gt(st.fetch_blocks_staged, 0);
	mkv_fetch_destroy(f);
	mkv_store_destroy(s);
	for (int i = 0; i < NSEG; i++)
		free(pay[i]);
	free(pay);
	free(lay);
	free(len);
	free(req);
	free(blocks);
	free(out);
}

Test(gather, store_fetch_gathers_host_blocks)
{
	GU_NEED_GPU();
	store_fetch_case(12, 48, 10, 20);
}

/* More segments and blocks than one kernel launch takes (GPU_BG_MAXSEG,
 * GPU_BG_MAXBLK): the work list is cut, a segment's blocks continue in
 * the next launch. */
Test(gather, store_fetch_over_launch_limits)
{
	GU_NEED_GPU();
	store_fetch_case(GPU_BG_MAXSEG + 19, 64, 40, 15);
}

/* A random block layout of one segment: aligned (16-byte sizes and
 * offsets: the kernels' fast path) or not (odd sizes, short last blocks). */
struct rlay {
	uint32_t vb, bb, nb, vlen, blen, voff, boff;
};

static struct rlay random_layout(struct gu_rng *g, bool al)
{
	struct rlay y;

	y.vb = al ? 16 * (1 + gu_below(g, 80)) : 1 + gu_below(g, 1500);
	y.bb = al ? 16 * (1 + gu_below(g, 20)) : 1 + gu_below(g, 300);
	y.nb = 1 + gu_below(g, 40);
	y.vlen = y.vb * y.nb - (al ? 0 : gu_below(g, y.vb));
	y.blen = y.bb * y.nb - (al ? 0 : gu_below(g, y.bb));
	y.voff = al ? 16 * gu_below(g, 4) : gu_below(g, 50);
	y.boff = y.voff + y.vlen + (al ? 16 * gu_below(g, 2) : gu_below(g, 9));
	return y;
}

/* Random block layouts (odd sizes, short last blocks, unaligned) for the
 * by-value kernel against gpu_gather_blocks_ref. */
Test(gather, blocks_by_value_match_reference)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng g;
	gu_rng_init(&g, seed);
	const size_t src_len = (size_t)8 << 20;
	char *msrc = mapped_random(&g, src_len);
	struct gpu_gather_ctx *c = NULL;
	cr_assert_eq(gpu_gather_ctx_create(0, 1, &c), 0);
	struct gpu_bg_args *a = calloc(1, sizeof *a);
	cr_assert(a);
	for (int round = 0; round < 6; round++) {
		uint32_t nseg = 1 + gu_below(&g, GPU_BG_MAXSEG);
		uint64_t dst = gu_below(&g, 64), src = 0;
		a->nseg = nseg;
		a->first[0] = 0;
		for (uint32_t i = 0; i < nseg; i++) {
			bool al = round % 2 == 0; /* aligned rounds: the fast path */
			struct rlay y = random_layout(&g, al);
			uint32_t vb = y.vb, bb = y.bb, nb = y.nb, vlen = y.vlen, blen = y.blen;
			uint32_t voff = y.voff, boff = y.boff;
			if (src + boff + blen > src_len)
				src = 0;
			struct gpu_bg_seg *sg = &a->seg[i];
			*sg = (struct gpu_bg_seg){ .src = msrc + src, .dst = dst,
						   .values_off = voff, .values_block = vb,
						   .values_len = vlen, .bitmaps_off = boff,
						   .bitmaps_block = bb, .bitmaps_len = blen };
			src = (src + boff + blen + 64) & ~(uint64_t)(al ? 15 : 0);
			uint32_t k = a->first[i], room = GPU_BG_MAXBLK - k;
			for (uint32_t j = 0; j < nb && room; j++)
				if (gu_below(&g, 100) < 30) {
					a->blk[k++] = j;
					room--;
				}
			a->first[i + 1] = k;
			dst += (uint64_t)(k - a->first[i]) * (vb + bb) + (al ? 0 : gu_below(&g, 7));
			if (al)
				dst = (dst + 15) & ~(uint64_t)15;
		}
		size_t dst_len = dst + 64;
		char *want = malloc(dst_len), *got = malloc(dst_len);
		cr_assert(want && got);
		memset(want, FILL, dst_len);
		cr_assert_eq(gpu_gather_blocks_ref(a, want), 0);
		char *dd = gu_dev(dst_len);
		GU_CK(cudaMemset(dd, FILL, dst_len));
		GU_CK(cudaDeviceSynchronize());
		cr_assert_eq(gpu_gather_ctx_launch_blocks(c, a, dd), 0);
		cr_assert_eq(gpu_gather_ctx_wait(c), 0);
		GU_CK(cudaMemcpy(got, dd, dst_len, cudaMemcpyDeviceToHost));
		for (size_t i = 0; i < dst_len; i++)
			if (got[i] != want[i])
				cr_assert_fail("round %d (seed %llx): byte %zu is %02x, want %02x",
					       round, (unsigned long long)seed, i, got[i] & 0xff,
					       want[i] & 0xff);
		cudaFree(dd);
		free(want);
		free(got);
	}
	/* bad arguments change nothing and queue nothing */
	char *dd = gu_dev(64);
	a->nseg = 0;
	cr_assert_eq(gpu_gather_ctx_launch_blocks(c, a, dd), -EINVAL);
	a->nseg = GPU_BG_MAXSEG + 1;
	cr_assert_eq(gpu_gather_ctx_launch_blocks(c, a, dd), -EINVAL);
	a->nseg = 1;
	a->first[0] = 0;
	a->first[1] = 2;
	a->seg[0] = (struct gpu_bg_seg){ .src = msrc, .values_block = 16, .values_len = 64,
					 .bitmaps_off = 64, .bitmaps_block = 16,
					 .bitmaps_len = 64 };
	a->blk[0] = 2;
	a->blk[1] = 1; /* not ascending */
	cr_assert_eq(gpu_gather_ctx_launch_blocks(c, a, dd), -EINVAL);
	a->blk[1] = 4; /* past the segment */
	cr_assert_eq(gpu_gather_ctx_launch_blocks(c, a, dd), -EINVAL);
	cr_assert_eq(gpu_gather_blocks_ref(a, dd), -EINVAL);
	a->blk[1] = 3;
	cr_assert_eq(gpu_gather_ctx_launch_blocks(NULL, a, dd), -EINVAL);
	cr_assert_eq(gpu_gather_ctx_launch_blocks(c, NULL, dd), -EINVAL);
	cr_assert_eq(gpu_gather_ctx_launch_blocks(c, a, NULL), -EINVAL);
	cr_assert_eq(gpu_gather_ctx_launch_blocks(c, a, dd), 0);
	cr_assert_eq(gpu_gather_ctx_wait(c), 0);
	cudaFree(dd);
	free(a);
	gpu_gather_ctx_destroy(c);
	cudaFreeHost(msrc);
}

/* ------------------------------------------------------------------ */
/* Device-driven gather (gpu_devmap_*, the store's mkv_devmap)         */

/* The kernel against gpu_devmap_gather_ref on one table over mapped
 * pinned host memory (readable by both sides, so in-place addresses are
 * the same pointers): copied and in-place segments, odd and aligned
 * layouts, a selection with repeats, unsorted, with ids past the table,
 * and counts below and above max_sel, read from device memory. */
Test(gather, devmap_kernel_matches_reference)
{
	GU_NEED_GPU();
	uint64_t seed = gu_seed();
	struct gu_rng g;
	gu_rng_init(&g, seed);
	const size_t src_len = (size_t)8 << 20;
	char *msrc = mapped_random(&g, src_len);
	for (int round = 0; round < 6; round++) {
		const bool al = round % 2 == 0;
		uint32_t nseg = 1 + gu_below(&g, 200);
		struct gpu_dm_seg *t = calloc(nseg, sizeof *t);
		cr_assert(t);
		uint64_t first = 0, src = 0, slot = 16;
		for (uint32_t i = 0; i < nseg; i++) {
			struct rlay y = random_layout(&g, al);
			uint32_t vb = y.vb, bb = y.bb, nb = y.nb, vlen = y.vlen, blen = y.blen;
			uint32_t voff = y.voff, boff = y.boff;
			if (src + boff + blen > src_len)
				src = 0;
			t[i] = (struct gpu_dm_seg){
				.src = msrc + src, .first = first,
				.values_off = voff, .values_len = vlen,
				.bitmaps_off = boff, .bitmaps_len = blen,
				.values_block = vb, .bitmaps_block = bb, .n_blocks = nb,
				.copy = (uint8_t)(gu_below(&g, 4) != 0),
				.tier = (uint8_t)gu_below(&g, 2),
			};
			src = (src + boff + blen + 64) & ~(uint64_t)(al ? 15 : 0);
			first += nb;
			if (vb + bb > slot)
				slot = vb + bb;
		}
		slot = (slot + 15) & ~(uint64_t)15;
		const uint32_t max_sel = 1 + gu_below(&g, 3000);
		/* count: usually within max_sel, sometimes past it */
		const uint32_t count = gu_below(&g, 5) ? gu_below(&g, max_sel + 1)
						       : max_sel + 1 + gu_below(&g, 50);
		const uint32_t nsel = count > max_sel ? count : max_sel;
		uint32_t *sel = calloc(nsel, sizeof *sel);
		cr_assert(sel);
		for (uint32_t k = 0; k < nsel; k++)
			sel[k] = gu_below(&g, 50) ? (uint32_t)gu_below(&g, (uint32_t)first)
						  : (uint32_t)first + gu_below(&g, 9);
		struct gpu_devmap *m = NULL;
		cr_assert_eq(gpu_devmap_create(0, t, nseg, &m), 0);
		cr_assert_eq(gpu_devmap_blocks(m), first);
		uint32_t *dsel = gu_upload(sel, (size_t)nsel * sizeof *sel);
		uint32_t *dcount = gu_upload(&count, sizeof count);
		const size_t sbytes = (size_t)max_sel * slot;
		char *dst = gu_dev(sbytes);
		struct gpu_dm_addr *dout = gu_dev((size_t)max_sel * sizeof *dout);
		GU_CK(cudaMemset(dst, FILL, sbytes));
		GU_CK(cudaMemset(dout, 0x5a, (size_t)max_sel * sizeof *dout));
		cr_assert_eq(gpu_devmap_gather(m, dsel, dcount, max_sel, dst, slot, dout, NULL), 0);
		/* a second gather of the same selection: hits add up */
		cr_assert_eq(gpu_devmap_gather(m, dsel, dcount, max_sel, dst, slot, dout, NULL), 0);
		uint32_t *hits = calloc(first, sizeof *hits), *rhits = calloc(first, sizeof *rhits);
		uint64_t refused = 0, rrefused = 0;
		cr_assert(hits && rhits);
		cr_assert_eq(gpu_devmap_collect(m, hits, &refused), 0);

		char *want = malloc(sbytes), *got = malloc(sbytes);
		struct gpu_dm_addr *wout = calloc(max_sel, sizeof *wout);
		struct gpu_dm_addr *gout = calloc(max_sel, sizeof *gout);
		cr_assert(want && got && wout && gout);
		memset(want, FILL, sbytes);
		for (int rep = 0; rep < 2; rep++)
			gpu_devmap_gather_ref(t, nseg, sel, count, max_sel, want, slot, wout,
					      rhits, &rrefused);
		GU_CK(cudaMemcpy(got, dst, sbytes, cudaMemcpyDeviceToHost));
		GU_CK(cudaMemcpy(gout, dout, (size_t)max_sel * sizeof *gout,
				 cudaMemcpyDeviceToHost));
		cr_assert_eq(memcmp(got, want, sbytes), 0, "staging differs (seed %llx, round %d)",
			     (unsigned long long)seed, round);
		cr_assert_eq(refused, rrefused, "refused %llu, want %llu (seed %llx)",
			     (unsigned long long)refused, (unsigned long long)rrefused,
			     (unsigned long long)seed);
		cr_assert_eq(memcmp(hits, rhits, first * sizeof *hits), 0, "hits differ");
		const uint32_t done = count < max_sel ? count : max_sel;
		for (uint32_t k = 0; k < done; k++) {
			const struct gpu_dm_addr *a = &gout[k], *w = &wout[k];
			cr_assert_eq(a->values_bytes, w->values_bytes);
			cr_assert_eq(a->bitmaps_bytes, w->bitmaps_bytes);
			cr_assert_eq(a->tier, w->tier);
			cr_assert_eq(a->device, w->device);
			/* staged: same offset in either staging; in place: same pointer */
			const bool staged = w->values >= (const void *)want &&
					    w->values < (const void *)(want + sbytes);
			if (staged) {
				cr_assert_eq((const char *)a->values - dst,
					     (const char *)w->values - want, "entry %u", k);
				cr_assert_eq((const char *)a->bitmaps - dst,
					     (const char *)w->bitmaps - want);
			} else {
				cr_assert_eq(a->values, w->values, "entry %u (seed %llx)", k,
					     (unsigned long long)seed);
				cr_assert_eq(a->bitmaps, w->bitmaps);
			}
		}
		/* collected: the device counters start again from zero */
		memset(hits, 0, first * sizeof *hits);
		refused = 0;
		cr_assert_eq(gpu_devmap_collect(m, hits, &refused), 0);
		cr_assert_eq(refused, 0);
		for (uint64_t b = 0; b < first; b++)
			cr_assert_eq(hits[b], 0);
		gpu_devmap_destroy(m);
		GU_CK(cudaFree(dsel));
		GU_CK(cudaFree(dcount));
		GU_CK(cudaFree(dst));
		GU_CK(cudaFree(dout));
		free(t);
		free(sel);
		free(hits);
		free(rhits);
		free(want);
		free(got);
		free(wout);
		free(gout);
	}
	/* bad tables are refused */
	struct gpu_dm_seg bad = { .src = msrc, .first = 1, .values_len = 16, .bitmaps_len = 16,
				  .values_block = 16, .bitmaps_block = 16, .n_blocks = 1 };
	struct gpu_devmap *m = NULL;
	cr_assert_eq(gpu_devmap_create(0, &bad, 1, &m), -EINVAL);
	bad.first = 0;
	bad.n_blocks = 2; /* block 1 past values_len */
	cr_assert_eq(gpu_devmap_create(0, &bad, 1, &m), -EINVAL);
	cr_assert_null(m);
	GU_CK(cudaFreeHost(msrc));
}
