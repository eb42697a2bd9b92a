/* SPDX-License-Identifier: MIT */
#include "mosaickv/packpool.h"

#include <errno.h>
#include <numa.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

/*
 * One 64-bit word holds a job's generation, its published chunk count and
 * its next unclaimed chunk, so that a claim is one compare-and-swap that
 * cannot succeed against a later job's counters (a thread that read the
 * word before a job ended and swaps after the next one began would
 * otherwise claim a chunk that does not exist yet).
 */
#define PP_IDX_BITS 20
#define PP_IDX_MASK ((UINT64_C(1) << PP_IDX_BITS) - 1)
#define PP_MAX_CHUNKS 1024 /* well below 2^20; the last one takes the rest */
/*
 * Two granularities.  A chunk is what one thread packs: small, so that 8
 * threads share a 2 MiB fetch (one thread packs only 6-9 GB/s).  A copy
 * covers a run of consecutive packed chunks: 64 KiB for the first, so the
 * copy engine starts early, doubling to 512 KiB, so that a fetch costs a
 * handful of copies (each is microseconds of driver time and a gap on
 * the engine).
 */
#define PP_CHUNK ((uint64_t)32 << 10)
#define PP_FIRST_COPY ((uint64_t)64 << 10)
#define PP_MAX_COPY ((uint64_t)512 << 10)

static inline uint64_t st_next(uint64_t s) { return s & PP_IDX_MASK; }
static inline uint64_t st_pub(uint64_t s)
{
	return (s >> PP_IDX_BITS) & PP_IDX_MASK;
}
static inline uint64_t st_gen(uint64_t s) { return s >> (2 * PP_IDX_BITS); }
static inline uint64_t st_make(uint64_t gen, uint64_t pub, uint64_t next)
{
	return gen << (2 * PP_IDX_BITS) | pub << PP_IDX_BITS | next;
}

struct pp_chunk {
	uint32_t first, n;
};

struct packpool {
	/* Idle threads spin reading @state: it has a cache line to itself,
	 * so that the writes below do not invalidate it under them. */
	_Alignas(64) _Atomic uint64_t state;
	_Alignas(64) _Atomic uint32_t done;  /* chunks of this job packed */
	_Atomic int err;        /* first copy error of this job */
	/* Copies: whoever holds @copying issues them, in chunk order, over
	 * runs of packed chunks (the destination must be contiguous). */
	_Atomic int copying;
	_Alignas(64) _Atomic uint8_t packed[PP_MAX_CHUNKS];
	uint32_t copy_next;     /* first chunk not yet copied (@copying) */
	uint64_t copy_target;   /* bytes of the next copy (@copying) */
	_Atomic int stop;
	_Atomic uint32_t sleepers;

	/* The job: written by the producer before it publishes. */
	_Alignas(64) const struct pp_piece *pieces;
	char *dst;
	struct pp_chunk chunks[PP_MAX_CHUNKS];
	/* Producer-only. */
	uint32_t cut;       /* first piece of the open chunk */
	uint32_t nchunks;
	_Atomic int closed; /* every chunk of the job is published */

	pp_copy_fn fn;
	void *arg;
	unsigned spin_us;
	int node;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned nthreads;
	pthread_t th[];
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static uint64_t now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t chunk_begin(const struct packpool *p, uint32_t c)
{
	return p->pieces[p->chunks[c].first].dst;
}

static uint64_t chunk_end(const struct packpool *p, uint32_t c)
{
	const struct pp_piece *l =
		&p->pieces[p->chunks[c].first + p->chunks[c].n - 1];

	return l->dst + l->len;
}

/*
 * Under @copying: issue copies over the packed prefix, each once it
 * reaches the target size, or whatever is packed once the job is closed
 * and every chunk is.
 */
static void issue_copies(struct packpool *p)
{
	uint32_t pub = (uint32_t)st_pub(atomic_load(&p->state));
	bool closed = atomic_load(&p->closed);

	while (p->copy_next < pub) {
		uint32_t c = p->copy_next, e = c;
		uint64_t off = chunk_begin(p, c), end = off;

		while (e < pub && atomic_load(&p->packed[e]) &&
		       end - off < p->copy_target)
			end = chunk_end(p, e++);
		if (e == c)
			return; /* chunk c not packed yet */
		if (end - off < p->copy_target && !(closed && e == pub))
			return; /* wait for more */
		if (p->fn && end > off) {
			int rc = p->fn(p->arg, off, end - off);

			if (rc) {
				int zero = 0;

				atomic_compare_exchange_strong(&p->err, &zero, rc);
			}
		}
		p->copy_next = e;
		if (p->copy_target < PP_MAX_COPY)
			p->copy_target *= 2;
	}
}

/*
 * Take the copy role if free, issue, and look again after letting go: a
 * chunk packed while the holder was about to let go would otherwise wait
 * for the next one.  Its packer failed to take the role because the
 * holder had it, so (all sequentially consistent) the holder's look after
 * letting go sees that chunk's flag.
 */
static void try_copies(struct packpool *p)
{
	for (;;) {
		uint32_t c;

		if (atomic_exchange(&p->copying, 1))
			return;
		issue_copies(p);
		c = p->copy_next;
		atomic_store(&p->copying, 0);
		if (c >= st_pub(atomic_load(&p->state)) ||
		    !atomic_load(&p->packed[c]))
			return;
	}
}

/* Ask for a piece's source lines ahead of its copy: pieces are ~1 KiB at
 * random places, so a plain copy waits on DRAM for each one. */
static inline void prefetch_piece(const struct pp_piece *pc)
{
	const char *s = pc->src;

	for (uint64_t o = 0; o < pc->len; o += 64)
		__builtin_prefetch(s + o, 0, 0);
}

/*
 * Copy one piece.  The destination is staging that the copy engine reads
 * next, not the CPU: streaming stores skip the read-for-ownership of each
 * line and leave no dirty line for the DMA read to snoop.
 */
static inline void copy_piece(char *dst, const char *src, uint64_t len)
{
#if defined(__x86_64__)
	if (((uintptr_t)dst & 15) == 0) {
		uint64_t o = 0;

		for (; o + 64 <= len; o += 64) {
			__m128i a = _mm_loadu_si128((const __m128i *)(src + o));
			__m128i b = _mm_loadu_si128((const __m128i *)(src + o + 16));
			__m128i c = _mm_loadu_si128((const __m128i *)(src + o + 32));
			__m128i d = _mm_loadu_si128((const __m128i *)(src + o + 48));

			_mm_stream_si128((__m128i *)(dst + o), a);
			_mm_stream_si128((__m128i *)(dst + o + 16), b);
			_mm_stream_si128((__m128i *)(dst + o + 32), c);
			_mm_stream_si128((__m128i *)(dst + o + 48), d);
		}
		if (o < len)
			memcpy(dst + o, src + o, len - o);
		return;
	}
#endif
	memcpy(dst, src, len);
}

static void run_chunk(struct packpool *p, uint32_t c)
{
	const struct pp_chunk ch = p->chunks[c];
	const struct pp_piece *pc = p->pieces + ch.first;

	for (uint32_t i = 0; i < ch.n && i < 4; i++)
		prefetch_piece(&pc[i]);
	for (uint32_t i = 0; i < ch.n; i++) {
		if (i + 4 < ch.n)
			prefetch_piece(&pc[i + 4]);
		copy_piece(p->dst + pc[i].dst, pc[i].src, pc[i].len);
	}
#if defined(__x86_64__)
	/* Streaming stores are weakly ordered: drain them before the flag
	 * that lets a copy of these bytes be issued. */
	_mm_sfence();
#endif
	atomic_store(&p->packed[c], 1);
	try_copies(p);
	/* Last: once finish sees every chunk done, no pool thread touches
	 * the job (the copy role included) until the next one is begun. */
	atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
}

/* Claim and run one published chunk; false when none is left now. */
static bool claim_one(struct packpool *p)
{
	uint64_t s = atomic_load(&p->state);

	while (st_next(s) < st_pub(s)) {
		if (atomic_compare_exchange_weak(&p->state, &s, s + 1)) {
			run_chunk(p, (uint32_t)st_next(s));
			return true;
		}
	}
	return false;
}

static bool has_work(struct packpool *p)
{
	uint64_t s = atomic_load(&p->state);

	return st_next(s) < st_pub(s);
}

static void *pool_main(void *arg)
{
	struct packpool *p = arg;

	if (p->node >= 0 && numa_available() >= 0)
		numa_run_on_node(p->node);
	while (!atomic_load(&p->stop)) {
		uint64_t t0;

		if (claim_one(p))
			continue;
		/* Spin a while: the next fetch is usually close. */
		t0 = now_us();
		for (unsigned i = 1; !has_work(p) && !atomic_load(&p->stop); i++) {
			cpu_relax();
			if ((i & 255) == 0 && now_us() - t0 >= p->spin_us)
				break;
		}
		if (has_work(p) || atomic_load(&p->stop))
			continue;
		/*
		 * Sleep.  sleepers is raised before the last look at the
		 * state, and the producer reads it after publishing: one of
		 * the two sees the other (both sequentially consistent), and
		 * the producer broadcasts under the mutex this thread holds
		 * until it waits.
		 */
		pthread_mutex_lock(&p->mu);
		atomic_fetch_add(&p->sleepers, 1);
		while (!has_work(p) && !atomic_load(&p->stop))
			pthread_cond_wait(&p->cv, &p->mu);
		atomic_fetch_sub(&p->sleepers, 1);
		pthread_mutex_unlock(&p->mu);
	}
	return NULL;
}

int packpool_create(unsigned threads, int numa_node, unsigned spin_us,
		    pp_copy_fn fn, void *arg, struct packpool **out)
{
	struct packpool *p;
	int rc;

	if (!out || threads < 1 || threads > 64)
		return -EINVAL;
	{
		/* The struct's cache-line members need 64-byte alignment. */
		size_t len = (sizeof *p + threads * sizeof p->th[0] + 63) &
			     ~(size_t)63;

		p = aligned_alloc(64, len);
		if (!p)
			return -ENOMEM;
		memset(p, 0, len);
	}
	p->fn = fn;
	p->arg = arg;
	p->spin_us = spin_us;
	p->node = numa_node;
	if (pthread_mutex_init(&p->mu, NULL)) {
		free(p);
		return -ENOMEM;
	}
	if (pthread_cond_init(&p->cv, NULL)) {
		pthread_mutex_destroy(&p->mu);
		free(p);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < threads; i++) {
		rc = pthread_create(&p->th[i], NULL, pool_main, p);
		if (rc) {
			packpool_destroy(p);
			return -rc;
		}
		p->nthreads++;
	}
	*out = p;
	return 0;
}

void packpool_destroy(struct packpool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->stop, 1);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < p->nthreads; i++)
		pthread_join(p->th[i], NULL);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

void packpool_begin(struct packpool *p, const struct pp_piece *pieces,
		    char *dst)
{
	uint64_t gen = st_gen(atomic_load(&p->state)) + 1;

	/* No chunk of the last job is running: finish waited for them. */
	p->pieces = pieces;
	p->dst = dst;
	p->cut = 0;
	p->nchunks = 0;
	p->copy_next = 0;
	p->copy_target = PP_FIRST_COPY;
	atomic_store(&p->closed, 0);
	atomic_store(&p->done, 0);
	atomic_store(&p->err, 0);
	atomic_store(&p->state, st_make(gen & ((UINT64_C(1) << 24) - 1), 0, 0));
}

static void cut_chunk(struct packpool *p, uint32_t n)
{
	uint64_t s;

	atomic_store_explicit(&p->packed[p->nchunks], 0, memory_order_relaxed);
	p->chunks[p->nchunks++] = (struct pp_chunk){ p->cut, n - p->cut };
	p->cut = n;
	s = atomic_load(&p->state);
	while (!atomic_compare_exchange_weak(&p->state, &s,
					     s + (UINT64_C(1) << PP_IDX_BITS)))
		;
	if (atomic_load(&p->sleepers)) {
		pthread_mutex_lock(&p->mu);
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
	}
}

void packpool_publish(struct packpool *p, uint32_t n)
{
	const struct pp_piece *last;

	/* Keep the last slot for finish's remainder. */
	if (n <= p->cut || p->nchunks >= PP_MAX_CHUNKS - 1)
		return;
	last = &p->pieces[n - 1];
	if (last->dst + last->len - p->pieces[p->cut].dst < PP_CHUNK)
		return;
	cut_chunk(p, n);
}

int packpool_finish(struct packpool *p, uint32_t n)
{
	if (n > p->cut)
		cut_chunk(p, n);
	atomic_store(&p->closed, 1);
	while (claim_one(p))
		;
	/* Chunks other threads claimed are short: wait for them here. */
	for (unsigned i = 0;
	     atomic_load_explicit(&p->done, memory_order_acquire) < p->nchunks;
	     i++) {
		if (i < 4096)
			cpu_relax();
		else
			sched_yield(); /* a preempted pool thread holds one */
	}
	/* The tail: take the copy role (its holder is only issuing) and copy
	 * what no threshold released. */
	for (;;) {
		int busy = 1;

		for (unsigned i = 0; busy && i < 4096; i++) {
			busy = atomic_exchange(&p->copying, 1);
			if (busy)
				cpu_relax();
		}
		if (!busy)
			break;
		sched_yield();
	}
	issue_copies(p);
	atomic_store(&p->copying, 0);
	return atomic_load(&p->err);
}
