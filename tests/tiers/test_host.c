/* SPDX-License-Identifier: MIT */
/* tests/tiers/test_host.c — tiers/host.c: jemalloc arena of mlock'ed memory. */
#include <errno.h>
#include <linux/capability.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include <criterion/criterion.h>

#include "tierutil.h"

/* VmLck of this process, in bytes. */
static size_t vm_locked(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	size_t kb = 0;

	cr_assert(f);
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "VmLck: %zu kB", &kb) == 1)
			break;
	fclose(f);
	return kb * 1024;
}

/* AddressSanitizer replaces mlock() with a no-op (locking its shadow
 * memory would be ruinous), so what mlock did cannot be observed in an ASan
 * build: those checks run in the plain build and skip under ASan. */
#if defined(__SANITIZE_ADDRESS__)
#define MLOCK_OBSERVABLE 0
#else
#define MLOCK_OBSERVABLE 1
#endif

static void roundtrip_and_pinned(int use_je)
{
	struct tier *t = NULL;
	size_t lck0 = vm_locked();

	cr_assert_eq(host_tier_create2(32 << 20, -1, -1, use_je, &t), 0);
	cr_assert_eq(host_tier_uses_jemalloc(t), use_je);
	cr_assert_eq(t->device, 0);
	size_t sizes[] = { 100, 4096, 81937, 1 << 20, 3 << 20 };
	for (unsigned i = 0; i < 5; i++)
		tu_roundtrip(t, NULL, sizes[i], 0);
	/* The arena's chunks really are locked in RAM. */
	cr_assert_geq(host_tier_pinned_bytes(t), 3 << 20);
	if (MLOCK_OBSERVABLE)
		cr_assert_geq(vm_locked(), lck0 + host_tier_pinned_bytes(t));
	tier_destroy(t);
	if (MLOCK_OBSERVABLE)
		cr_assert_eq(vm_locked(), lck0);
}

Test(host, roundtrip_and_pinned_jemalloc) { roundtrip_and_pinned(1); }
Test(host, roundtrip_and_pinned_builtin) { roundtrip_and_pinned(0); }

/* Every stored payload is inside pinned memory: locked bytes cover all of
 * them, and the budget is enforced with -ENOMEM. */
static void budget_enforced(int use_je)
{
	struct tier *t = NULL;
	enum { SZ = 200000 };
	char *src = malloc(SZ);
	struct tier_obj *o[64];
	int n = 0;

	cr_assert_eq(host_tier_create2(4 << 20, -1, -1, use_je, &t), 0);
	tu_fill(src, SZ, 9);
	struct tier_meta m = tu_meta(3, 1, src, SZ);
	while (n < 64 && tier_put(t, NULL, &m, src, &o[n]) == 0)
		n++;
	cr_assert_geq(n, 16);
	cr_assert_leq((size_t)n * SZ, 4 << 20);
	cr_assert_leq(tier_used(t), 4 << 20);
	struct tier_obj *x;
	cr_assert_eq(tier_put(t, NULL, &m, src, &x), -ENOMEM);
	for (int i = 0; i < n; i++) {
		unsigned char vec[64];
		char *p = tier_addr(t, o[i]);
		/* resident (mincore) = faulted in by mlock */
		cr_assert_eq(mincore((void *)((uintptr_t)p & ~4095ul), 4096,
				     vec), 0);
		cr_assert(vec[0] & 1);
		tu_check_get(t, NULL, o[i], src, SZ);
		tier_drop(t, NULL, o[i]);
	}
	cr_assert_eq(tier_used(t), 0);
	/* Freed space is reused without pinning more. */
	size_t pinned = host_tier_pinned_bytes(t);
	for (int i = 0; i < n; i++)
		cr_assert_eq(tier_put(t, NULL, &m, src, &o[i]), 0);
	cr_assert_eq(host_tier_pinned_bytes(t), pinned);
	for (int i = 0; i < n; i++)
		tier_drop(t, NULL, o[i]);
	tier_destroy(t);
	free(src);
}

Test(host, budget_enforced_jemalloc) { budget_enforced(1); }
Test(host, budget_enforced_builtin) { budget_enforced(0); }

/* Chunks are bound to the requested NUMA node. */
Test(host, numa_binding)
{
	struct tier *t = NULL;
	char src[65536];
	struct tier_obj *o;
	int node = -1;

	if (numa_available() < 0)
		cr_skip_test("libnuma: NUMA not available");
	cr_assert_eq(host_tier_create(8 << 20, 0, -1, &t), 0);
	tu_fill(src, sizeof src, 1);
	struct tier_meta m = tu_meta(1, 1, src, sizeof src);
	cr_assert_eq(tier_put(t, NULL, &m, src, &o), 0);
	cr_assert_eq(get_mempolicy(&node, NULL, 0, tier_addr(t, o),
				   MPOL_F_NODE | MPOL_F_ADDR), 0);
	cr_assert_eq(node, 0);
	tier_drop(t, NULL, o);
	tier_destroy(t);
	cr_assert_eq(host_tier_create(8 << 20, numa_max_node() + 1, -1, &t),
		     -EINVAL);
}

/* Without CAP_IPC_LOCK and under a small RLIMIT_MEMLOCK, pinning fails and
 * put reports -ENOMEM: memory is never handed out unpinned.  (Criterion
 * runs each test in its own process, so dropping the capability here does
 * not leak into other tests.) */
/* More chunks than the table's first size (it grows), every payload intact;
 * and a large tier pins in larger steps (capacity / 1024): a fixed table
 * of 4,096 chunks of 4 MiB once stopped every tier at 16 GiB. */
static void many_chunks(int use_je)
{
	struct tier *t = NULL;
	enum { SZ = 900 << 10, N = 120 };
	char *src = malloc(SZ);
	struct tier_obj *o[N];

	cr_assert_eq(host_tier_create2((size_t)160 << 20, -1, -1, use_je, &t), 0);
	for (int i = 0; i < N; i++) {
		tu_fill(src, SZ, 100 + i);
		struct tier_meta m = tu_meta(7, (uint32_t)i, src, SZ);
		int rc = tier_put(t, NULL, &m, src, &o[i]);
		cr_assert_eq(rc, 0, "put %d: %d", i, rc);
	}
	/* 105 MiB of payloads: at least 26 chunks of 4 MiB */
	cr_assert_geq(host_tier_pinned_bytes(t), (size_t)N * SZ);
	for (int i = 0; i < N; i++) {
		tu_fill(src, SZ, 100 + i);
		tu_check_get(t, NULL, o[i], src, SZ);
		tier_drop(t, NULL, o[i]);
	}
	tier_destroy(t);
	if (!use_je) {
		/* 8 GiB: one small put pins one step of 8 MiB (nothing else
		 * is pinned before the first put) */
		cr_assert_eq(host_tier_create2((size_t)8 << 30, -1, -1, 0, &t), 0);
		struct tier_meta m = tu_meta(7, 1, src, 4096);
		cr_assert_eq(tier_put(t, NULL, &m, src, &o[0]), 0);
		cr_assert_eq(host_tier_pinned_bytes(t), (size_t)8 << 20);
		tier_drop(t, NULL, o[0]);
		tier_destroy(t);
	}
	free(src);
}

Test(host, many_chunks_jemalloc) { many_chunks(1); }
Test(host, many_chunks_builtin) { many_chunks(0); }

Test(host, mlock_limit_gives_enomem)
{
	if (!MLOCK_OBSERVABLE)
		cr_skip_test("ASan makes mlock a no-op: pinning is checked in the plain build");
	struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct data[2];
	struct rlimit rl = { 4 << 20, 4 << 20 };
	struct tier *t = NULL;
	enum { SZ = 8 << 20 };
	char *src = malloc(SZ);
	struct tier_obj *o;
	int rc;

	cr_assert_eq(syscall(SYS_capget, &hdr, data), 0);
	data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
	data[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
	cr_assert_eq(syscall(SYS_capset, &hdr, data), 0);
	cr_assert_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
	tu_fill(src, SZ, 2);
	struct tier_meta m = tu_meta(1, 1, src, SZ);
	for (int je = 0; je < 2; je++) {
		rc = host_tier_create2(64 << 20, -1, -1, je, &t);
		cr_assert_eq(rc, 0, "create: %d", rc);
		cr_assert_eq(tier_put(t, NULL, &m, src, &o), -ENOMEM);
		cr_assert_eq(tier_used(t), 0);
		tier_destroy(t);
	}
	free(src);
}

Test(host, staging_is_pinned)
{
	if (!MLOCK_OBSERVABLE)
		cr_skip_test("ASan makes mlock a no-op: pinning is checked in the plain build");
	struct tier *t = NULL;
	size_t lck0 = vm_locked();

	cr_assert_eq(host_tier_create(1 << 20, -1, -1, &t), 0);
	char *p = host_tier_alloc_pinned(t, 8 << 20);
	cr_assert(p);
	cr_assert_eq((uintptr_t)p % 4096, 0);
	memset(p, 1, 8 << 20);
	cr_assert_geq(vm_locked(), lck0 + (8 << 20));
	cr_assert_eq(tier_used(t), 0); /* not charged to the payload budget */
	host_tier_free_pinned(t, p);
	tier_destroy(t);
}

Test(host, invalid)
{
	struct tier *t;

	cr_assert_eq(host_tier_create(0, -1, -1, &t), -EINVAL);
	cr_assert_eq(host_tier_create(1 << 20, -2, -1, &t), -EINVAL);
	cr_assert_eq(host_tier_create(1 << 20, -1, -1, NULL), -EINVAL);
}
