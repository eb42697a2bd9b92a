/* SPDX-License-Identifier: MIT */
/*
 * tests/tiers/test_store_crash.c — a child spills segments to NVMe and is
 * killed with SIGKILL in the middle of it; the reopened store finds every
 * spill the child saw complete, and no corrupt segment.
 */
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>

#include <criterion/criterion.h>

#include <mosaickv/common.h>
#include "storeutil.h"

enum { NB = 128, N_MAX = 100000 };

struct child_move {
	int fd;
	uint32_t id;
};

static void child_cb(void *arg, int status)
{
	struct child_move *m = arg;

	/* Reported only once the move completed: durable by contract. */
	if (status == 0 && write(m->fd, &m->id, sizeof m->id) != sizeof m->id)
		_exit(3);
	free(m);
}

/* The child: put, then spill to NVMe asynchronously, forever.  No
 * Criterion asserts here: it is a plain forked process. */
static void child(const char *dir, int fd)
{
	struct mkv_store_opts o;
	struct mkv_store *s;
	struct mkv_store_layout l = su_layout(NB);

	mkv_store_opts_init(&o, sizeof o);
	o.gpu = -1;
	o.nvme_dir = dir;
	o.hbm_bytes = 64 << 20;
	o.host_bytes = 64 << 20;
	o.auto_balance = 0;
	o.workers = 4;
	if (mkv_store_create(&o, &s))
		_exit(2);
	for (uint32_t i = 0; i < N_MAX; i++) {
		struct mkv_seg_key k = su_key(9, i);
		char *p = malloc(su_len(NB));

		tu_fill(p, su_len(NB), i);
		if (mkv_store_put(s, &k, p, su_len(NB), &l))
			_exit(4);
		free(p);
		struct child_move *m = malloc(sizeof *m);
		m->fd = fd;
		m->id = i;
		while (mkv_store_move(s, &k, MKV_TIER_NVME, child_cb, m))
			; /* -EBUSY cannot happen: nothing pins */
		if (i % 8 == 7) /* keep memory bounded */
			mkv_store_drain(s);
	}
	_exit(0);
}

Test(store_crash, kill_9_mid_spill_then_reopen)
{
	char dir[256];
	int pfd[2];
	pid_t pid;
	uint8_t *done = calloc(N_MAX, 1);
	uint32_t id;
	int n_done = 0;

	tu_mkdtemp(dir, sizeof dir);
	cr_assert_eq(pipe(pfd), 0);
	pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pfd[0]);
		child(dir, pfd[1]);
	}
	close(pfd[1]);
	/* Let it complete some spills, then kill it mid-way. */
	while (n_done < 40 && read(pfd[0], &id, sizeof id) == sizeof id) {
		cr_assert_lt(id, N_MAX);
		done[id] = 1;
		n_done++;
	}
	cr_assert_eq(n_done, 40, "child died early");
	kill(pid, SIGKILL);
	/* Completions already in the pipe count too. */
	while (read(pfd[0], &id, sizeof id) == sizeof id)
		if (id < N_MAX && !done[id]) {
			done[id] = 1;
			n_done++;
		}
	int wst;
	cr_assert_eq(waitpid(pid, &wst, 0), pid);
	cr_assert(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL,
		  "child exited %d", WEXITSTATUS(wst));
	close(pfd[0]);

	struct mkv_store_opts o = su_opts();
	struct mkv_store *s;
	o.nvme_dir = dir;
	cr_assert_eq(mkv_store_create(&o, &s), 0);
	struct mkv_store_stats st = { .size = sizeof st };
	cr_assert_eq(mkv_store_get_stats(s, &st), 0);
	cr_assert_eq(st.reopen_corrupt, 0);
	cr_assert_geq(st.reopen_adopted, (uint64_t)n_done);
	/* Every completed spill is there and bit-exact. */
	for (uint32_t i = 0; i < N_MAX; i++) {
		if (!done[i])
			continue;
		struct mkv_seg_info info;
		struct mkv_seg_key k = su_key(9, i);
		cr_assert_eq(mkv_store_info(s, &k, &info), 0, "lost %u", i);
		cr_assert_eq(info.tier, MKV_TIER_NVME);
		su_check(s, k, NB, i);
	}
	/* Whatever else was adopted is complete and verified too. */
	cr_assert_eq(mkv_store_get_stats(s, &st), 0);
	cr_assert_eq(st.tier[MKV_TIER_NVME].segments, st.reopen_adopted);
	mkv_store_destroy(s);
	tu_rmtree(dir);
	free(done);
}
