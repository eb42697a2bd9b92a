/* SPDX-License-Identifier: MIT */
/*
 * tests/tiers/test_store_gpu.c — the store with HBM on a real device: all
 * three tiers round trip, fetches return device addresses holding the
 * right bytes (in place, staged from pinned host and from NVMe, and from
 * the hot-block cache), faults at the HBM boundaries keep the data.
 * Skips without CUDA or without a usable device.
 */
#include <errno.h>

#include <criterion/criterion.h>

#include <mosaickv/common.h>
#include "storeutil.h"
#include "tiers/tcuda.h"

static void need_gpu(void)
{
	if (!tcuda_usable(0))
		cr_skip_test("no usable CUDA device (or built without CUDA)");
}

static struct mkv_store *gpu_store(const char *dir)
{
	struct mkv_store_opts o = su_opts();
	struct mkv_store *s = NULL;

	o.gpu = 0;
	o.nvme_dir = dir;
	o.auto_balance = 0;
	cr_assert_eq(mkv_store_create(&o, &s), 0);
	struct mkv_store_stats st = { .size = sizeof st };
	cr_assert_eq(mkv_store_get_stats(s, &st), 0);
	cr_assert_eq(st.tier[MKV_TIER_HBM].on_device, 1);
	return s;
}

/* Copy @len device bytes at @dev back and compare with @ref. */
static void check_dev(const void *dev, const void *ref, size_t len)
{
	char *h = malloc(len);

	cr_assert_eq(tcuda_d2h(0, h, dev, len), 0);
	cr_assert_eq(memcmp(h, ref, len), 0, "device bytes differ");
	free(h);
}

Test(store_gpu, roundtrip_all_three_tiers)
{
	char dir[256];
	struct mkv_store_layout l = su_layout(16);
	struct mkv_seg_key k = su_key(1, 0);
	char *p = su_payload(16, 31);

	need_gpu();
	tu_mkdtemp(dir, sizeof dir);
	struct mkv_store *s = gpu_store(dir);
	cr_assert_eq(mkv_store_put(s, &k, p, su_len(16), &l), 0);
	cr_assert_eq(su_tier(s, k), MKV_TIER_HBM);
	su_check(s, k, 16, 31);
	int path[] = { MKV_TIER_HOST, MKV_TIER_NVME, MKV_TIER_HBM, MKV_TIER_NVME,
		       MKV_TIER_HOST, MKV_TIER_HBM };
	for (unsigned i = 0; i < 6; i++) {
		cr_assert_eq(su_move(s, k, path[i]), 0);
		cr_assert_eq(su_tier(s, k), path[i]);
		su_check(s, k, 16, 31);
	}
	mkv_store_destroy(s);
	tu_rmtree(dir);
	free(p);
}

Test(store_gpu, fetch_returns_device_addresses)
{
	char dir[256];
	struct mkv_store_layout l = su_layout(32);
	struct mkv_seg_key k[3];
	char *p[3];
	struct su_wait w;

	need_gpu();
	tu_mkdtemp(dir, sizeof dir);
	struct mkv_store *s = gpu_store(dir);
	for (int i = 0; i < 3; i++) {
		k[i] = su_key(2, (uint32_t)i);
		p[i] = su_payload(32, 40 + (uint64_t)i);
		cr_assert_eq(mkv_store_put(s, &k[i], p[i], su_len(32), &l), 0);
		if (i)
			cr_assert_eq(su_move(s, k[i], i), 0);
	}
	struct mkv_fetch *f;
	cr_assert_eq(mkv_fetch_create(s, 1 << 20, &f), 0);
	uint32_t b[] = { 1, 4, 30 };
	struct mkv_fetch_req rq[3] = { { k[0], b, 3 }, { k[1], b, 3 },
				       { k[2], b, 3 } };
	struct mkv_block_addr ad[9];
	/* host and NVMe blocks are staged (then one H2D copy) */
	cr_assert_eq(mkv_store_fetch(f, rq, 3, 1, ad), 6);
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 3; j++) {
			struct mkv_block_addr *a = &ad[i * 3 + j];
			cr_assert_eq(a->device, 1);
			cr_assert_eq(a->tier, i);
			check_dev(a->values, p[i] + l.values_off + b[j] * SU_VB, SU_VB);
			check_dev(a->bitmaps, p[i] + l.bitmaps_off + b[j] * SU_BB,
				  SU_BB);
		}
	/* Selected twice, then prefetched: hot in HBM, in place. */
	cr_assert_eq(mkv_store_fetch(f, rq, 3, 2, ad), 6);
	mkv_fetch_release(f);
	su_wait_init(&w);
	cr_assert_eq(mkv_store_prefetch(s, rq, 3, 3, su_cb, &w), 0);
	cr_assert_eq(su_wait(&w), 0);
	cr_assert_eq(mkv_store_fetch(f, rq, 3, 3, ad), 0);
	for (int i = 0; i < 3; i++)
		for (int j = 0; j < 3; j++) {
			struct mkv_block_addr *a = &ad[i * 3 + j];
			cr_assert_eq(a->device, 1);
			cr_assert_eq(a->tier, MKV_TIER_HBM);
			check_dev(a->values, p[i] + l.values_off + b[j] * SU_VB, SU_VB);
			check_dev(a->bitmaps, p[i] + l.bitmaps_off + b[j] * SU_BB,
				  SU_BB);
		}
	mkv_fetch_destroy(f);
	mkv_store_destroy(s);
	tu_rmtree(dir);
	for (int i = 0; i < 3; i++)
		free(p[i]);
}

/* fetch_mapped: host-tier blocks come back in place, as mapped pinned
 * memory the device can read; NVMe blocks are still staged. */
Test(store_gpu, fetch_mapped_host_in_place)
{
	char dir[256];
	struct mkv_store_opts o = su_opts();
	struct mkv_store_layout l = su_layout(32);
	struct mkv_store *s;
	struct mkv_seg_key k[2] = { su_key(4, 0), su_key(4, 1) };
	char *p[2];

	need_gpu();
	if (!tcuda_host_ptr_usable(0))
		cr_skip_test("device cannot use host pointers directly");
	tu_mkdtemp(dir, sizeof dir);
	o.gpu = 0;
	o.nvme_dir = dir;
	o.auto_balance = 0;
	o.fetch_mapped = 1;
	cr_assert_eq(mkv_store_create(&o, &s), 0);
	for (int i = 0; i < 2; i++) {
		p[i] = su_payload(32, 60 + (uint64_t)i);
		cr_assert_eq(mkv_store_put(s, &k[i], p[i], su_len(32), &l), 0);
		cr_assert_eq(su_move(s, k[i], i ? MKV_TIER_NVME : MKV_TIER_HOST), 0);
	}
	struct mkv_fetch *f;
	cr_assert_eq(mkv_fetch_create(s, 1 << 20, &f), 0);
	uint32_t b[] = { 3, 17 };
	struct mkv_fetch_req rq[2] = { { k[0], b, 2 }, { k[1], b, 2 } };
	struct mkv_block_addr ad[4];
	cr_assert_eq(mkv_store_fetch(f, rq, 2, 1, ad), 2); /* only NVMe staged */
	for (int i = 0; i < 4; i++) {
		int sg = i / 2;
		cr_assert_eq(ad[i].device, 1);
		cr_assert_eq(ad[i].tier, sg ? MKV_TIER_NVME : MKV_TIER_HOST);
		if (!sg)
			cr_assert(tcuda_is_mapped_host(ad[i].values),
				  "not mapped pinned memory");
		check_dev(ad[i].values, p[sg] + l.values_off + b[i % 2] * SU_VB,
			  SU_VB);
	}
	mkv_fetch_destroy(f);
	mkv_store_destroy(s);
	tu_rmtree(dir);
	free(p[0]);
	free(p[1]);
}

/* Device memory exhausted or a bad device copy: the segment stays below. */
Test(store_gpu, hbm_faults_keep_data)
{
	char dir[256];
	struct mkv_store_opts o = su_opts();
	struct tier *in[3], *w[3];
	struct mkv_store *s;
	struct mkv_store_layout l = su_layout(8);
	struct mkv_seg_key k = su_key(3, 0);
	char *p = su_payload(8, 3);

	need_gpu();
	tu_mkdtemp(dir, sizeof dir);
	o.gpu = 0;
	o.auto_balance = 0;
	cr_assert_eq(hbm_tier_create(8 << 20, 0, &in[0]), 0);
	cr_assert_eq(hbm_tier_on_device(in[0]), 1);
	cr_assert_eq(host_tier_create(16 << 20, -1, 0, &in[1]), 0);
	cr_assert_eq(nvme_tier_create(dir, 1 << 30, 1, &in[2]), 0);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(fault_tier_create(in[i], &w[i]), 0);
	cr_assert_eq(store_create_with_tiers(&o, w, &s), 0);
	struct tier *hbm = store_tier(s, 0);
	cr_assert_eq(mkv_store_put(s, &k, p, su_len(8), &l), 0);
	cr_assert_eq(su_move(s, k, MKV_TIER_NVME), 0);
	fault_tier_arm(hbm, FAULT_OP_PUT, 1, FAULT_NOMEM, 0, 1);
	cr_assert_eq(su_move(s, k, MKV_TIER_HBM), -ENOMEM);
	fault_tier_arm(hbm, FAULT_OP_GET, 1, FAULT_BITFLIP, 0, 1);
	cr_assert_eq(su_move(s, k, MKV_TIER_HBM), -MKV_ECORRUPT);
	cr_assert_eq(su_tier(s, k), MKV_TIER_NVME);
	su_check(s, k, 8, 3);
	cr_assert_eq(su_move(s, k, MKV_TIER_HBM), 0);
	fault_tier_arm(store_tier(s, 1), FAULT_OP_PUT, 1, FAULT_SHORT, 0, 1);
	cr_assert_eq(su_move(s, k, MKV_TIER_HOST), -EIO);
	cr_assert_eq(su_tier(s, k), MKV_TIER_HBM);
	su_check(s, k, 8, 3);
	mkv_store_destroy(s);
	tu_rmtree(dir);
	free(p);
}

/*
 * A fetch big enough that the fetch threads cut many chunks (~3.5 MiB from
 * 40 segments, a few of them on NVMe), through every way host blocks reach
 * the device: 8 fetch threads beside the gather kernel (the default
 * split), 8 threads alone, 1 thread beside the kernel, and the kernel
 * alone (fetch_threads = 0).  Each block's device bytes must equal the payload's,
 * on several steps with different selections.
 */
static void fetch_many(uint32_t threads, double share)
{
	enum { NS = 40, NB = 256, PER = 80 };
	char dir[256];
	struct mkv_store_layout l = su_layout(NB);
	struct mkv_store_opts o = su_opts();
	struct mkv_store *s = NULL;
	struct mkv_seg_key k[NS];
	char *p[NS];
	uint32_t *sel = malloc(NS * PER * sizeof *sel);
	struct mkv_fetch_req rq[NS];
	struct mkv_block_addr *ad = malloc(NS * PER * sizeof *ad);
	struct mkv_fetch *f;
	uint64_t x = 12345 + threads;

	need_gpu();
	tu_mkdtemp(dir, sizeof dir);
	o.gpu = 0;
	o.nvme_dir = dir;
	o.auto_balance = 0;
	o.host_bytes = (size_t)64 << 20;
	o.fetch_threads = threads;
	o.fetch_spin_us = threads == 1 ? 0 : 200;
	o.fetch_kernel_share = share;
	cr_assert_eq(mkv_store_create(&o, &s), 0);
	for (int i = 0; i < NS; i++) {
		k[i] = su_key(7, (uint32_t)i);
		p[i] = su_payload(NB, 500 + (uint64_t)i);
		cr_assert_eq(mkv_store_put(s, &k[i], p[i], su_len(NB), &l), 0);
		cr_assert_eq(su_move(s, k[i], i % 8 == 3 ? MKV_TIER_NVME
							 : MKV_TIER_HOST), 0);
	}
	cr_assert_eq(mkv_fetch_create(s, (size_t)8 << 20, &f), 0);
	for (int step = 1; step <= 4; step++) {
		int64_t want = 0;

		for (int i = 0; i < NS; i++) {
			uint32_t *b = sel + i * PER, c = 0;

			/* An ascending random subset of PER blocks. */
			for (uint32_t j = 0; j < NB && c < PER; j++) {
				x = x * 6364136223846793005u + 1442695040888963407u;
				if ((x >> 33) % (NB - j) < PER - c)
					b[c++] = j;
			}
			cr_assert_eq(c, PER);
			rq[i] = (struct mkv_fetch_req){ k[i], b, PER };
			want += PER;
		}
		cr_assert_eq(mkv_store_fetch(f, rq, NS, (uint64_t)step, ad), want);
		for (int i = 0; i < NS; i++)
			for (int j = 0; j < PER; j++) {
				struct mkv_block_addr *a = &ad[i * PER + j];
				uint32_t blk = sel[i * PER + j];

				cr_assert_eq(a->device, 1);
				check_dev(a->values, p[i] + l.values_off + blk * SU_VB,
					  SU_VB);
				check_dev(a->bitmaps,
					  p[i] + l.bitmaps_off + blk * SU_BB, SU_BB);
			}
	}
	mkv_fetch_destroy(f);
	mkv_store_destroy(s);
	tu_rmtree(dir);
	for (int i = 0; i < NS; i++)
		free(p[i]);
	free(sel);
	free(ad);
}

Test(store_gpu, fetch_threads_and_kernel) { fetch_many(8, 0.5); }
Test(store_gpu, fetch_threads_only) { fetch_many(8, 0); }
Test(store_gpu, fetch_one_thread_and_kernel) { fetch_many(1, 0.7); }
Test(store_gpu, fetch_gather_kernel_only) { fetch_many(0, 0.5); }

/*
 * A device map over segments in all three tiers (the NVMe ones come up to
 * host memory at create): a selection written in device memory, with
 * repeats, unsorted and with ids past the map, is fetched by one kernel;
 * every address holds the bytes that were put, the refused ids are
 * counted, the selections reach the statistics at sync, and the mapped
 * segments stay pinned until the map goes.
 */
Test(store_gpu, devmap_fetches_a_device_selection)
{
	enum { NS = 6, NB = 32, NSEL = 100, NBAD = 3 };
	char dir[256];
	struct mkv_store_layout l = su_layout(NB);
	struct mkv_seg_key k[NS];
	char *p[NS];

	need_gpu();
	tu_mkdtemp(dir, sizeof dir);
	struct mkv_store *s = gpu_store(dir);
	for (int i = 0; i < NS; i++) {
		k[i] = su_key(4, (uint32_t)i);
		p[i] = su_payload(NB, 70 + (uint64_t)i);
		cr_assert_eq(mkv_store_put(s, &k[i], p[i], su_len(NB), &l), 0);
		if (i >= 2)
			cr_assert_eq(su_move(s, k[i], i < 4 ? MKV_TIER_HOST : MKV_TIER_NVME), 0);
	}
	struct mkv_devmap *m = NULL;
	cr_assert_eq(mkv_devmap_create(s, k, NS, &m), 0);
	cr_assert_eq(mkv_devmap_blocks(m), NS * NB);
	const uint64_t slot = mkv_devmap_slot_bytes(m);
	cr_assert_geq(slot, SU_VB + SU_BB);
	cr_assert_eq(slot % 16, 0);
	for (int i = 0; i < NS; i++) {
		struct mkv_seg_info info;
		cr_assert_eq(mkv_store_info(s, &k[i], &info), 0);
		cr_assert_eq(info.pins, 1);
		cr_assert_eq(info.tier, i < 2 ? MKV_TIER_HBM : MKV_TIER_HOST, "seg %d", i);
	}
	/* pinned: the balancer and explicit moves leave them alone */
	cr_assert_eq(mkv_store_move(s, &k[2], MKV_TIER_NVME, su_cb, NULL), -EBUSY);

	uint32_t sel[NSEL + NBAD], want_hits[NS] = { 0 };
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (int q = 0; q < NSEL + NBAD; q++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		sel[q] = (uint32_t)((x >> 33) % (NS * NB));
	}
	for (int q = 0; q < NBAD; q++) /* past the map, spread over the list */
		sel[q * 37 + 5] = NS * NB + (uint32_t)q * 1000;
	for (int q = 0; q < NSEL + NBAD; q++)
		if (sel[q] < NS * NB)
			want_hits[sel[q] / NB]++;
	const uint32_t count = NSEL + NBAD;
	void *dsel, *dcount, *dst, *dout;
	cr_assert_eq(tcuda_malloc(0, sizeof sel, &dsel), 0);
	cr_assert_eq(tcuda_malloc(0, sizeof count, &dcount), 0);
	cr_assert_eq(tcuda_malloc(0, count * slot, &dst), 0);
	cr_assert_eq(tcuda_malloc(0, count * sizeof(struct mkv_block_addr), &dout), 0);
	cr_assert_eq(tcuda_h2d(0, dsel, sel, sizeof sel), 0);
	cr_assert_eq(tcuda_h2d(0, dcount, &count, sizeof count), 0);

	/* bad input: refused, nothing queued */
	cr_assert_eq(mkv_devmap_fetch(m, sel, dcount, count, dst, count * slot, dout, NULL),
		     -EINVAL); /* a pageable host selection */
	cr_assert_eq(mkv_devmap_fetch(m, dsel, dcount, count, dst, count * slot - 1, dout,
				      NULL), -ENOSPC);
	cr_assert_eq(mkv_devmap_fetch(m, NULL, dcount, count, dst, count * slot, dout, NULL),
		     -EINVAL);
	cr_assert_eq(mkv_devmap_fetch(m, dsel, dcount, 0, dst, 0, dout, NULL), 0);

	cr_assert_eq(mkv_devmap_fetch(m, dsel, dcount, count, dst, count * slot, dout, NULL), 0);
	cr_assert_eq(mkv_devmap_sync(m, 5), NBAD);
	struct mkv_block_addr ad[NSEL + NBAD];
	cr_assert_eq(tcuda_d2h(0, ad, dout, sizeof ad), 0);
	for (int q = 0; q < NSEL + NBAD; q++) {
		const struct mkv_block_addr *a = &ad[q];
		if (sel[q] >= NS * NB) {
			cr_assert(!a->values && !a->bitmaps && !a->values_bytes &&
				  !a->bitmaps_bytes && !a->device, "refused entry %d", q);
			continue;
		}
		const int i = (int)(sel[q] / NB);
		const uint32_t j = sel[q] % NB;
		cr_assert_eq(a->device, 1);
		cr_assert_eq(a->tier, i < 2 ? MKV_TIER_HBM : MKV_TIER_HOST);
		cr_assert_eq(a->values_bytes, SU_VB);
		cr_assert_eq(a->bitmaps_bytes, SU_BB);
		if (i >= 2)
			cr_assert_eq((const char *)a->values, (char *)dst + q * slot,
				     "host blocks are staged at their entry's slot");
		check_dev(a->values, p[i] + l.values_off + j * SU_VB, SU_VB);
		check_dev(a->bitmaps, p[i] + l.bitmaps_off + j * SU_BB, SU_BB);
	}
	for (int i = 0; i < NS; i++) {
		struct mkv_seg_info info;
		cr_assert_eq(mkv_store_info(s, &k[i], &info), 0);
		cr_assert_eq(info.hits, want_hits[i], "seg %d: %llu hits, want %u", i,
			     (unsigned long long)info.hits, want_hits[i]);
		cr_assert_eq(info.last_step, want_hits[i] ? 5 : 0);
	}
	/* synced: nothing more to record */
	cr_assert_eq(mkv_devmap_sync(m, 6), 0);
	struct mkv_seg_info info;
	cr_assert_eq(mkv_store_info(s, &k[0], &info), 0);
	cr_assert_eq(info.hits, want_hits[0]);

	mkv_devmap_destroy(m);
	for (int i = 0; i < NS; i++) {
		cr_assert_eq(mkv_store_info(s, &k[i], &info), 0);
		cr_assert_eq(info.pins, 0);
		su_check(s, k[i], NB, 70 + (uint64_t)i);
	}
	cr_assert_eq(su_move(s, k[2], MKV_TIER_NVME), 0);
	/* a key that is not there: nothing stays pinned */
	struct mkv_seg_key two[2] = { k[0], su_key(4, 99) };
	cr_assert_eq(mkv_devmap_create(s, two, 2, &m), -ENOENT);
	cr_assert_eq(mkv_store_info(s, &k[0], &info), 0);
	cr_assert_eq(info.pins, 0);
	tcuda_free(0, dsel);
	tcuda_free(0, dcount);
	tcuda_free(0, dst);
	tcuda_free(0, dout);
	mkv_store_destroy(s);
	tu_rmtree(dir);
	for (int i = 0; i < NS; i++)
		free(p[i]);
}
