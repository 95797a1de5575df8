/* tests/test_copy.c: the copy engine (runtime/copy*.c, docs/copy-engine.md).
 *
 * The host backend is tested directly: bytes checked one by one against a
 * pattern computed from a seed, pool and slot exhaustion, the buffer state
 * machine, tickets, close with copies queued, and allocation failure
 * injected at every allocation of kiln_copy_open. The HIP backend is tested
 * against Debian's libamdhip64 (scripts/deps.sh installs it; this machine
 * and CI have no AMD GPU), the CUDA backend for a clean "unavailable", and
 * the GPU engine logic against tests/fake/fake_cudart.c, a stand-in
 * libcudart whose copies can be held and whose calls can be made to fail.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/runtime.h"

/* gpu_symbols.def lists 15 required functions and 1 optional one. */
#define N_REQUIRED 15
#define N_OPTIONAL 1

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)

TestSuite(copy, .timeout = 120);

/* ------------------------------------------------------------ helpers */

static uint8_t pattern(uint64_t seed, size_t i)
{
	uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
	x ^= x >> 31;
	x *= 0x94D049BB133111EBull;
	return (uint8_t)(x >> 56);
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pattern(seed, i);
}

/* Index of the first byte of p that breaks the pattern, or n. */
static size_t first_bad(const uint8_t *p, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != pattern(seed, i))
			return i;
	return n;
}

static uint64_t next_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static kiln_copy *open_host(size_t pool_bytes, uint32_t max_buffers)
{
	kiln_copy_config cfg = {
	    .backend = KILN_COPY_HOST, .pool_bytes = pool_bytes, .max_buffers = max_buffers};
	kiln_copy *ce = NULL;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), 0);
	cr_assert_not_null(ce);
	return ce;
}

/* Offloads n bytes of pattern seed from a temporary source and waits. */
static uint32_t offload_wait(kiln_copy *ce, size_t n, uint64_t seed)
{
	uint8_t *src = malloc(n ? n : 1);
	fill(src, n, seed);
	uint32_t buf = 0;
	kiln_copy_event ev = 0;
	cr_assert_eq(kiln_copy_offload(ce, src, n, &buf, &ev), 0, "offload %zu bytes", n);
	cr_assert_eq(kiln_copy_wait(ce, ev), 0);
	free(src);
	return buf;
}

/* Reloads buf, waits, and checks its n bytes against pattern seed. */
static void reload_check(kiln_copy *ce, uint32_t buf, size_t n, uint64_t seed)
{
	uint8_t *dst = calloc(1, n ? n : 1);
	kiln_copy_event ev = 0;
	cr_assert_eq(kiln_copy_reload(ce, buf, dst, &ev), 0);
	cr_assert_eq(kiln_copy_wait(ce, ev), 0);
	cr_assert_eq(first_bad(dst, n, seed), n, "reloaded bytes differ");
	free(dst);
}

/* ------------------------------------------------------------ host: bytes */

Test(copy, host_round_trip_keeps_every_byte)
{
	kiln_copy *ce = open_host(1 * MIB, 0);
	size_t n = 100003;
	uint8_t *src = malloc(n), *dst = calloc(1, n);
	fill(src, n, 7);
	uint32_t buf = 0;
	kiln_copy_event off = 0, rel = 0;
	cr_assert_eq(kiln_copy_offload(ce, src, n, &buf, &off), 0);
	cr_assert_neq(off, 0);
	cr_assert_neq(buf, 0, "0 is never a buffer id");
	cr_assert_eq(kiln_copy_wait(ce, off), 0);
	cr_assert_eq(kiln_copy_query(ce, off), 1);
	memset(src, 0xEE, n); /* the pool holds its own copy now */
	cr_assert_eq(kiln_copy_reload(ce, buf, dst, &rel), 0);
	cr_assert_gt(rel, off);
	cr_assert_eq(kiln_copy_wait(ce, rel), 0);
	cr_assert_eq(first_bad(dst, n, 7), n);
	/* A completed reload released the buffer. */
	cr_assert_eq(kiln_copy_drop(ce, buf), KILN_RT_ESTATE);
	kiln_copy_close(ce);
	free(src);
	free(dst);
}

Test(copy, zero_byte_buffers_round_trip)
{
	kiln_copy *ce = open_host(256, 2);
	uint32_t a = offload_wait(ce, 0, 1);
	uint32_t b = offload_wait(ce, 256, 2); /* a takes no pool space */
	reload_check(ce, a, 0, 1);
	reload_check(ce, b, 256, 2);
	kiln_copy_close(ce);
}

/* One thread of the concurrency tests: keeps up to 4 buffers of random
 * sizes in flight, reloads (sometimes before the offload completed) or
 * drops them at random, and checks every reloaded byte. */
typedef struct stress_arg {
	kiln_copy *ce;
	int id;
	int iters;
	int errors;  /* unexpected return codes */
	int corrupt; /* reloads whose bytes differ */
	int reloaded, dropped, full;
} stress_arg;

typedef struct in_flight {
	uint32_t buf;
	kiln_copy_event ev;
	uint64_t seed;
	size_t n;
	uint8_t *src;
} in_flight;

static void stress_reload(stress_arg *a, in_flight *h)
{
	uint8_t *dst = malloc(h->n ? h->n : 1);
	kiln_copy_event ev = 0;
	if (kiln_copy_reload(a->ce, h->buf, dst, &ev) != 0 || kiln_copy_wait(a->ce, ev) != 0)
		a->errors++;
	else if (first_bad(dst, h->n, h->seed) != h->n)
		a->corrupt++;
	/* The reload followed the offload, so the source is free too. */
	if (kiln_copy_query(a->ce, h->ev) != 1)
		a->errors++;
	a->reloaded++;
	free(dst);
	free(h->src);
}

static void *stress_main(void *p)
{
	stress_arg *a = p;
	uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)(a->id + 1) * 0x2545F4914F6CDD1Dull;
	in_flight h[4];
	int n_held = 0;
	for (int it = 0; it < a->iters; it++) {
		uint64_t r = next_rand(&rng);
		if (n_held < 4 && (r % 10 < 5 || n_held == 0)) {
			in_flight *x = &h[n_held];
			x->n = r % 37 == 0 ? 0 : (size_t)(next_rand(&rng) % (48 * KIB));
			x->seed = (uint64_t)a->id << 32 | (uint64_t)it;
			x->src = malloc(x->n ? x->n : 1);
			fill(x->src, x->n, x->seed);
			int rc = kiln_copy_offload(a->ce, x->src, x->n, &x->buf, &x->ev);
			if (rc == KILN_RT_ENOSPC) {
				/* Full: give back what this thread holds, or let the
				 * others do so. */
				a->full++;
				free(x->src);
				if (n_held > 0)
					stress_reload(a, &h[--n_held]);
				else
					sched_yield();
				continue;
			}
			if (rc != 0) {
				a->errors++;
				free(x->src);
				continue;
			}
			int q = kiln_copy_query(a->ce, x->ev);
			if (q != 0 && q != 1)
				a->errors++;
			n_held++;
		} else if (r % 10 < 8) {
			int k = (int)(next_rand(&rng) % (uint64_t)n_held);
			stress_reload(a, &h[k]);
			h[k] = h[--n_held];
		} else {
			int k = (int)(next_rand(&rng) % (uint64_t)n_held);
			if (kiln_copy_wait(a->ce, h[k].ev) != 0 ||
			    kiln_copy_drop(a->ce, h[k].buf) != 0)
				a->errors++;
			/* Dropped: reloading it now is a state error. */
			kiln_copy_event ev = 0;
			if (kiln_copy_reload(a->ce, h[k].buf, h[k].src, &ev) != KILN_RT_ESTATE)
				a->errors++;
			a->dropped++;
			free(h[k].src);
			h[k] = h[--n_held];
		}
	}
	while (n_held > 0)
		stress_reload(a, &h[--n_held]);
	return NULL;
}

#define N_THREADS 8

/* Runs N_THREADS stress threads on ce, checks them, then checks that the
 * pool is whole again: one buffer of pool_bytes fits. */
static void stress(kiln_copy *ce, size_t pool_bytes, int iters)
{
	pthread_t t[N_THREADS];
	stress_arg a[N_THREADS];
	for (int i = 0; i < N_THREADS; i++) {
		a[i] = (stress_arg){.ce = ce, .id = i, .iters = iters};
		cr_assert_eq(pthread_create(&t[i], NULL, stress_main, &a[i]), 0);
	}
	int reloaded = 0, dropped = 0;
	for (int i = 0; i < N_THREADS; i++) {
		pthread_join(t[i], NULL);
		cr_expect_eq(a[i].errors, 0, "thread %d: %d unexpected codes", i, a[i].errors);
		cr_expect_eq(a[i].corrupt, 0, "thread %d: %d corrupt reloads", i, a[i].corrupt);
		reloaded += a[i].reloaded;
		dropped += a[i].dropped;
	}
	cr_assert_gt(reloaded, N_THREADS * iters / 8);
	cr_assert_gt(dropped, 0);
	uint32_t whole = offload_wait(ce, pool_bytes, 99);
	reload_check(ce, whole, pool_bytes, 99);
}

Test(copy, host_concurrent_offloads_and_reloads_keep_every_byte)
{
	/* 8 threads holding up to 4 buffers of up to 48 KiB: both the pool
	 * (512 KiB) and the buffer table (16) run out now and then. */
	size_t pool = 512 * KIB;
	kiln_copy *ce = open_host(pool, 16);
	stress(ce, pool, 400);
	kiln_copy_close(ce);
}

/* ------------------------------------------------------------ host: exhaustion */

Test(copy, pool_exhaustion_gives_enospc_and_recovers)
{
	kiln_copy *ce = open_host(4096, 4);
	uint32_t a = offload_wait(ce, 4096, 1);
	uint8_t one = 1;
	uint32_t buf = 12345;
	kiln_copy_event ev = 777;
	cr_assert_eq(kiln_copy_offload(ce, &one, 1, &buf, &ev), KILN_RT_ENOSPC);
	cr_assert_eq(buf, 12345, "nothing changed");
	cr_assert_eq(ev, 777);
	reload_check(ce, a, 4096, 1); /* a is intact and its space comes back */
	uint32_t b = offload_wait(ce, 4096, 2);
	cr_assert_eq(kiln_copy_drop(ce, b), 0);
	uint8_t *big = calloc(1, 4097);
	cr_assert_eq(kiln_copy_offload(ce, big, 4097, &buf, &ev), KILN_RT_ENOSPC);
	free(big);
	kiln_copy_close(ce);
}

Test(copy, buffer_table_exhaustion_gives_enospc_and_recovers)
{
	kiln_copy *ce = open_host(1 * MIB, 3);
	uint32_t b[3];
	for (int i = 0; i < 3; i++)
		b[i] = offload_wait(ce, 10, (uint64_t)i);
	uint8_t x = 0;
	uint32_t buf;
	kiln_copy_event ev;
	cr_assert_eq(kiln_copy_offload(ce, &x, 1, &buf, &ev), KILN_RT_ENOSPC);
	cr_assert_eq(kiln_copy_drop(ce, b[1]), 0);
	uint32_t c = offload_wait(ce, 10, 3);
	reload_check(ce, b[0], 10, 0);
	reload_check(ce, b[2], 10, 2);
	reload_check(ce, c, 10, 3);
	kiln_copy_close(ce);
}

Test(copy, pool_is_first_fit_and_released_space_coalesces)
{
	/* 1024 bytes: four 256-byte granules (ranges round up to 256). */
	kiln_copy *ce = open_host(1024, 8);
	uint32_t a = offload_wait(ce, 200, 1); /* [0, 256) */
	uint32_t b = offload_wait(ce, 256, 2); /* [256, 512) */
	uint32_t c = offload_wait(ce, 1, 3);   /* [512, 768) */
	uint32_t d = offload_wait(ce, 256, 4); /* [768, 1024) */
	cr_assert_eq(kiln_copy_drop(ce, a), 0);
	cr_assert_eq(kiln_copy_drop(ce, c), 0);
	/* 512 bytes free, but as two holes of 256. */
	uint8_t src[512] = {0};
	uint32_t buf;
	kiln_copy_event ev;
	cr_assert_eq(kiln_copy_offload(ce, src, 512, &buf, &ev), KILN_RT_ENOSPC);
	uint32_t e = offload_wait(ce, 256, 5); /* first fit: a's hole */
	uint32_t f = offload_wait(ce, 256, 6); /* c's hole */
	cr_assert_eq(kiln_copy_offload(ce, src, 1, &buf, &ev), KILN_RT_ENOSPC);
	/* Freeing e (at 0) and b (at 256) leaves one hole of 512. */
	cr_assert_eq(kiln_copy_drop(ce, e), 0);
	reload_check(ce, b, 256, 2);
	uint32_t g = offload_wait(ce, 512, 7);
	reload_check(ce, d, 256, 4);
	reload_check(ce, f, 256, 6);
	reload_check(ce, g, 512, 7);
	/* Everything released: the whole pool is one range again. */
	uint32_t h = offload_wait(ce, 1024, 8);
	reload_check(ce, h, 1024, 8);
	kiln_copy_close(ce);
}

/* ------------------------------------------------------------ host: states */

Test(copy, state_errors)
{
	kiln_copy *ce = open_host(64 * KIB, 5);
	uint32_t a = offload_wait(ce, 1000, 1);
	uint8_t dst[1000];
	kiln_copy_event r1 = 0, r2 = 0;
	cr_assert_eq(kiln_copy_reload(ce, a, dst, &r1), 0);
	/* Reloading or dropping it again is refused whether or not the
	 * first reload has finished. */
	cr_assert_eq(kiln_copy_reload(ce, a, dst, &r2), KILN_RT_ESTATE);
	cr_assert_eq(kiln_copy_drop(ce, a), KILN_RT_ESTATE);
	cr_assert_eq(kiln_copy_wait(ce, r1), 0);
	cr_assert_eq(first_bad(dst, sizeof dst, 1), sizeof dst);
	/* Released: the id is stale. */
	cr_assert_eq(kiln_copy_reload(ce, a, dst, &r2), KILN_RT_ESTATE);
	cr_assert_eq(kiln_copy_drop(ce, a), KILN_RT_ESTATE);

	/* Ids the engine never issues. */
	cr_assert_eq(kiln_copy_drop(ce, 0), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_drop(ce, UINT32_MAX), KILN_RT_EINVAL); /* index 7 of 5 */
	cr_assert_eq(kiln_copy_reload(ce, 0, dst, &r2), KILN_RT_EINVAL);

	/* Arguments. */
	uint32_t b = offload_wait(ce, 16, 2);
	uint32_t buf;
	kiln_copy_event ev;
	cr_assert_eq(kiln_copy_reload(ce, b, NULL, &ev), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_reload(ce, b, dst, NULL), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_offload(ce, NULL, 16, &buf, &ev), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_offload(ce, dst, 16, NULL, &ev), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_offload(ce, dst, 16, &buf, NULL), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_offload(NULL, dst, 16, &buf, &ev), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_reload(NULL, b, dst, &ev), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_drop(NULL, b), KILN_RT_EINVAL);
	reload_check(ce, b, 16, 2); /* b survived every refusal */
	kiln_copy_close(ce);
}

/* Queues a large copy, then a small one behind it (FIFO), and returns the
 * small one's query and drop results while the large one is in progress.
 * Returns 0 when the small copy had already finished (the race was lost). */
static int behind_a_large_copy(kiln_copy *ce, uint8_t *large, size_t n_large)
{
	uint8_t small[64];
	fill(small, sizeof small, 3);
	uint32_t lb, sb;
	kiln_copy_event le, se;
	cr_assert_eq(kiln_copy_offload(ce, large, n_large, &lb, &le), 0);
	cr_assert_eq(kiln_copy_offload(ce, small, sizeof small, &sb, &se), 0);
	int q = kiln_copy_query(ce, se);
	int drop = kiln_copy_drop(ce, sb);
	cr_assert(q == 0 || q == 1);
	if (q == 1)
		cr_assert_eq(drop, 0);
	if (q == 0) {
		/* Not finished: not droppable either (the drop may also come
		 * after the copy ended, between the two calls). */
		cr_assert(drop == KILN_RT_ESTATE || drop == 0);
		if (drop == KILN_RT_ESTATE)
			cr_assert_eq(kiln_copy_wait(ce, se), 0);
	}
	/* FIFO: when the small copy is done, so is the large one. */
	cr_assert_eq(kiln_copy_query(ce, le), 1);
	cr_assert_eq(kiln_copy_drop(ce, lb), 0);
	if (drop != 0)
		cr_assert_eq(kiln_copy_drop(ce, sb), 0);
	return q == 0 && drop == KILN_RT_ESTATE;
}

Test(copy, pending_copy_is_not_done_and_not_droppable)
{
	size_t n = 64 * MIB;
	kiln_copy *ce = open_host(n + 4096, 4);
	uint8_t *large = malloc(n);
	memset(large, 1, n);
	int seen = 0;
	for (int i = 0; i < 20 && !seen; i++)
		seen = behind_a_large_copy(ce, large, n);
	cr_assert(seen, "never saw a copy still queued behind a 64 MiB one");
	free(large);
	kiln_copy_close(ce);
}

Test(copy, tickets_increase_and_stay_answerable)
{
	kiln_copy *ce = open_host(64 * KIB, 4);
	cr_assert_eq(kiln_copy_query(ce, 0), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_wait(ce, 0), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_query(NULL, 1), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_wait(NULL, 1), KILN_RT_EINVAL);

	uint8_t src[100], dst[100];
	fill(src, sizeof src, 5);
	kiln_copy_event first = 0, last = 0;
	for (int i = 0; i < 100; i++) {
		uint32_t buf;
		kiln_copy_event off, rel;
		cr_assert_eq(kiln_copy_offload(ce, src, sizeof src, &buf, &off), 0);
		cr_assert_gt(off, last);
		cr_assert_eq(kiln_copy_reload(ce, buf, dst, &rel), 0);
		cr_assert_gt(rel, off);
		cr_assert_eq(kiln_copy_wait(ce, rel), 0); /* 4 buffers: keep them coming back */
		last = rel;
		if (i == 0)
			first = off;
	}
	/* Every earlier ticket is done, its slot long reused. */
	cr_assert_eq(kiln_copy_query(ce, first), 1);
	cr_assert_eq(kiln_copy_wait(ce, first), 0);
	cr_assert_eq(kiln_copy_query(ce, last), 1);
	cr_assert_eq(kiln_copy_wait(ce, last), 0);
	cr_assert_eq(first_bad(dst, sizeof dst, 5), sizeof dst);
	/* Tickets not issued yet. */
	cr_assert_eq(kiln_copy_query(ce, last + (UINT64_C(1) << 40)), KILN_RT_EINVAL);
	cr_assert_eq(kiln_copy_wait(ce, UINT64_MAX), KILN_RT_EINVAL);
	kiln_copy_close(ce);
}

Test(copy, close_finishes_queued_copies)
{
	enum { N = 32, HOLD = 8 };
	size_t n = 1 * MIB;
	kiln_copy *ce = open_host((N + HOLD) * n, N + HOLD);
	uint8_t *src[N + HOLD], *dst[N];
	for (int i = 0; i < N + HOLD; i++) {
		src[i] = malloc(n);
		fill(src[i], n, (uint64_t)i);
		uint32_t buf;
		kiln_copy_event ev;
		cr_assert_eq(kiln_copy_offload(ce, src[i], n, &buf, &ev), 0);
		if (i < N) {
			dst[i] = calloc(1, n);
			cr_assert_eq(kiln_copy_reload(ce, buf, dst[i], &ev), 0);
		}
	}
	/* Nothing waited for: close waits for every queued copy. HOLD
	 * buffers are still offloaded and go with the pool. */
	kiln_copy_close(ce);
	for (int i = 0; i < N; i++) {
		cr_assert_eq(first_bad(dst[i], n, (uint64_t)i), n, "buffer %d", i);
		free(dst[i]);
	}
	for (int i = 0; i < N + HOLD; i++)
		free(src[i]);
}

/* ------------------------------------------------------------ open */

Test(copy, open_rejects_bad_configs)
{
	kiln_copy *ce = (kiln_copy *)&ce;
	kiln_copy_config cfg = {.backend = KILN_COPY_HOST, .pool_bytes = 4096};
	cr_assert_eq(kiln_copy_open(NULL, &ce), KILN_RT_EINVAL);
	cr_assert_null(ce);
	cr_assert_eq(kiln_copy_open(&cfg, NULL), KILN_RT_EINVAL);
	cfg.pool_bytes = 0;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_EINVAL);
	cfg.pool_bytes = SIZE_MAX;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_EINVAL);
	cfg.pool_bytes = 4096;
	cfg.max_buffers = (1u << 20) + 1;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_EINVAL);
	cfg.max_buffers = 0;
	cfg.backend = (kiln_copy_backend)7;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_EINVAL);
	cr_assert_null(ce);
	kiln_copy_close(NULL);
}

static size_t n_allocs, n_live, fail_at;

static void *counting_alloc(size_t bytes)
{
	if (++n_allocs == fail_at)
		return NULL;
	void *p = malloc(bytes);
	if (p)
		n_live++;
	return p;
}

static void counting_free(void *p)
{
	n_live--;
	free(p);
}

/* Opens cfg with the k-th allocation failing, for k = 1, 2, ... until an
 * open gets past every allocation; each failed open must return ENOMEM
 * and leave nothing allocated. Returns the allocation count of the open
 * that got through and its result in *out_rc (the engine is closed). */
static size_t fail_each_allocation(const kiln_copy_config *cfg, int *out_rc)
{
	kiln_rt_set_allocator(counting_alloc, counting_free);
	for (size_t k = 1;; k++) {
		n_allocs = 0;
		n_live = 0;
		fail_at = k;
		kiln_copy *ce = (kiln_copy *)&ce;
		int rc = kiln_copy_open(cfg, &ce);
		if (n_allocs < k) { /* no allocation failed */
			if (rc == 0) {
				cr_assert_not_null(ce);
				kiln_copy_close(ce);
			} else {
				cr_assert_null(ce);
			}
			cr_assert_eq(n_live, 0, "%zu allocations left after close", n_live);
			kiln_rt_set_allocator(NULL, NULL);
			*out_rc = rc;
			return n_allocs;
		}
		cr_assert_eq(rc, KILN_RT_ENOMEM, "allocation %zu failed: %d", k, rc);
		cr_assert_null(ce);
		cr_assert_eq(n_live, 0, "allocation %zu failed: %zu left", k, n_live);
	}
}

Test(copy, host_open_survives_allocation_failure_at_every_step)
{
	kiln_copy_config cfg = {.backend = KILN_COPY_HOST, .pool_bytes = 64 * KIB};
	int rc = -100;
	/* The engine, the buffer table, the request table, the ring, the pool. */
	cr_assert_eq(fail_each_allocation(&cfg, &rc), 5);
	cr_assert_eq(rc, 0);
}

/* ------------------------------------------------------------ HIP and CUDA */

static int library_loads(const char *name)
{
	/* RTLD_NODELETE as the engine does: GPU runtimes do not unload cleanly. */
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	if (h)
		dlclose(h);
	return h != NULL;
}

Test(copy, host_probe)
{
	kiln_copy_probe_report r;
	cr_assert_eq(kiln_copy_probe(KILN_COPY_HOST, NULL, &r), 0);
	cr_assert_eq(r.devices, 1);
	cr_assert_eq(r.status, 0);
	cr_assert_null(r.library);
	cr_assert_eq(kiln_copy_probe(KILN_COPY_HOST, NULL, NULL), KILN_RT_EINVAL);
}

/* With a GPU present: the engine copies real device memory. The test's
 * own device buffers come from the vendor's Malloc, Memcpy and
 * DeviceSynchronize, which the engine does not need. */
static void real_gpu_round_trip(kiln_copy_backend b, const char *library, const char *prefix)
{
	void *h = dlopen(library, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	cr_assert_not_null(h);
	int (*dmalloc)(void **, size_t), (*dfree)(void *), (*dsync)(void);
	int (*dcopy)(void *, const void *, size_t, int);
	char name[64];
	void *sym;
	snprintf(name, sizeof name, "%sMalloc", prefix);
	cr_assert_not_null(sym = dlsym(h, name));
	memcpy(&dmalloc, &sym, sizeof sym);
	snprintf(name, sizeof name, "%sFree", prefix);
	cr_assert_not_null(sym = dlsym(h, name));
	memcpy(&dfree, &sym, sizeof sym);
	snprintf(name, sizeof name, "%sDeviceSynchronize", prefix);
	cr_assert_not_null(sym = dlsym(h, name));
	memcpy(&dsync, &sym, sizeof sym);
	snprintf(name, sizeof name, "%sMemcpy", prefix);
	cr_assert_not_null(sym = dlsym(h, name));
	memcpy(&dcopy, &sym, sizeof sym);

	enum { N = 16 };
	size_t n = 1 * MIB + 123, total = N * n;
	uint8_t *host = malloc(total);
	void *d_src = NULL, *d_dst = NULL;
	cr_assert_eq(dmalloc(&d_src, total), 0);
	cr_assert_eq(dmalloc(&d_dst, total), 0);
	for (int i = 0; i < N; i++)
		fill(host + (size_t)i * n, n, (uint64_t)i);
	cr_assert_eq(dcopy(d_src, host, total, 1 /* host to device */), 0);
	cr_assert_eq(dsync(), 0);

	kiln_copy_config cfg = {.backend = b, .pool_bytes = 64 * MIB, .library = library};
	kiln_copy *ce = NULL;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), 0);
	uint32_t buf[N];
	kiln_copy_event off[N], rel[N];
	for (int i = 0; i < N; i++)
		cr_assert_eq(
		    kiln_copy_offload(ce, (uint8_t *)d_src + (size_t)i * n, n, &buf[i], &off[i]),
		    0);
	/* Half reloaded at once (the h2d stream waits), half after a wait. */
	for (int i = 0; i < N; i++) {
		if (i % 2)
			cr_assert_eq(kiln_copy_wait(ce, off[i]), 0);
		cr_assert_eq(
		    kiln_copy_reload(ce, buf[i], (uint8_t *)d_dst + (size_t)i * n, &rel[i]), 0);
	}
	for (int i = 0; i < N; i++)
		cr_assert_eq(kiln_copy_wait(ce, rel[i]), 0);
	kiln_copy_close(ce);
	memset(host, 0, total);
	cr_assert_eq(dcopy(host, d_dst, total, 2 /* device to host */), 0);
	for (int i = 0; i < N; i++)
		cr_assert_eq(first_bad(host + (size_t)i * n, n, (uint64_t)i), n, "buffer %d", i);
	dfree(d_src);
	dfree(d_dst);
	free(host);
	dlclose(h);
}

/* Checks a GPU backend against its installed library: every listed
 * symbol resolves, and open either finds no device or copies for real. */
static void check_installed(kiln_copy_backend b, const char *prefix)
{
	kiln_copy_probe_report r;
	int rc = kiln_copy_probe(b, NULL, &r);
	cr_assert_not_null(r.library);
	cr_assert_eq(r.n_resolved, N_REQUIRED + N_OPTIONAL);
	cr_assert_null(r.missing, "missing %s", r.missing);
	cr_assert_eq(rc, r.status);
	kiln_copy_config cfg = {.backend = b, .pool_bytes = 1 * MIB};
	kiln_copy *ce = (kiln_copy *)&ce;
	if (rc == 0) {
		cr_assert_gt(r.devices, 0);
		real_gpu_round_trip(b, r.library, prefix);
		return;
	}
	/* No GPU (HIP 5.2: hipErrorNoDevice; CUDA without a driver:
	 * cudaErrorInsufficientDriver). */
	cr_assert_eq(rc, KILN_RT_ENODEVICE, "%s", kiln_rt_strerror(rc));
	cr_assert_eq(r.devices, -1);
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_ENODEVICE);
	cr_assert_null(ce);
	/* The same through an explicit library name. */
	cfg.library = r.library;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_ENODEVICE);
}

/* Without the library: unavailable, cleanly. */
static void check_absent(kiln_copy_backend b)
{
	kiln_copy_probe_report r;
	cr_assert_eq(kiln_copy_probe(b, NULL, &r), KILN_RT_EUNAVAILABLE);
	cr_assert_null(r.library);
	cr_assert_eq(r.n_required, N_REQUIRED);
	cr_assert_eq(r.n_optional, N_OPTIONAL);
	cr_assert_eq(r.n_resolved, 0);
	cr_assert_null(r.missing);
	cr_assert_eq(r.devices, -1);
	kiln_copy_config cfg = {.backend = b, .pool_bytes = 1 * MIB};
	kiln_copy *ce = (kiln_copy *)&ce;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_EUNAVAILABLE);
	cr_assert_null(ce);
}

Test(copy, hip_library_resolves_every_symbol_and_finds_no_device)
{
	/* scripts/deps.sh installs Debian's libamdhip64-5 (the .so.5 only). */
	if (library_loads("libamdhip64.so.5") || library_loads("libamdhip64.so"))
		check_installed(KILN_COPY_HIP, "hip");
	else
		check_absent(KILN_COPY_HIP);
}

Test(copy, hip_open_survives_allocation_failure_at_every_step)
{
	kiln_copy_config cfg = {.backend = KILN_COPY_HIP, .pool_bytes = 64 * KIB};
	int rc = 0;
	size_t n = fail_each_allocation(&cfg, &rc);
	if (rc == 0) { /* an AMD GPU: the event table too */
		cr_assert_eq(n, 5);
		return;
	}
	/* The engine, the buffer table, the request table, the GPU state; the
	 * event table would come after the device check. */
	cr_assert_eq(n, 4);
	cr_assert(rc == KILN_RT_ENODEVICE || rc == KILN_RT_EUNAVAILABLE, "%d", rc);
}

Test(copy, cuda_is_unavailable_without_libcudart)
{
	/* Debian main has no libcudart; where NVIDIA's is installed, it must
	 * resolve completely. */
	const char *names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
	                       "libcudart.so.11.0"};
	int installed = 0;
	for (int i = 0; i < 4 && !installed; i++)
		installed = library_loads(names[i]);
	if (installed)
		check_installed(KILN_COPY_CUDA, "cuda");
	else
		check_absent(KILN_COPY_CUDA);
}

Test(copy, bogus_or_foreign_library_is_unavailable)
{
	kiln_copy_probe_report r;
	kiln_copy_config cfg = {.backend = KILN_COPY_HIP,
	                        .pool_bytes = 1 * MIB,
	                        .library = "/nonexistent/libamdhip64.so"};
	kiln_copy *ce = (kiln_copy *)&ce;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_EUNAVAILABLE);
	cr_assert_null(ce);
	cfg.backend = KILN_COPY_CUDA;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_EUNAVAILABLE);
	cr_assert_eq(kiln_copy_probe(KILN_COPY_CUDA, cfg.library, &r), KILN_RT_EUNAVAILABLE);
	cr_assert_null(r.library);

	/* A library that loads but exports none of the functions: the first
	 * required one in gpu_symbols.def is reported missing. */
	cr_assert_eq(kiln_copy_probe(KILN_COPY_HIP, "libm.so.6", &r), KILN_RT_EUNAVAILABLE);
	cr_assert_str_eq(r.library, "libm.so.6");
	cr_assert_eq(r.n_resolved, 0);
	cr_assert_str_eq(r.missing, "hipGetDeviceCount");
	cr_assert_eq(r.devices, -1);
	cfg.library = "libm.so.6";
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_EUNAVAILABLE);
	cr_assert_null(ce);
	cr_assert_eq(kiln_copy_probe((kiln_copy_backend)9, NULL, &r), KILN_RT_EINVAL);
}

Test(copy, hip_library_does_not_satisfy_cuda)
{
	if (!library_loads("libamdhip64.so.5"))
		cr_skip_test("libamdhip64.so.5 is not installed");
	kiln_copy_probe_report r;
	cr_assert_eq(kiln_copy_probe(KILN_COPY_CUDA, "libamdhip64.so.5", &r), KILN_RT_EUNAVAILABLE);
	cr_assert_str_eq(r.library, "libamdhip64.so.5");
	cr_assert_eq(r.n_resolved, 0);
	cr_assert_str_eq(r.missing, "cudaGetDeviceCount");
}

/* ------------------------------------------------------------ fake libcudart */

#ifdef KILN_FAKE_CUDART

static struct {
	void (*reset)(int devices, int held);
	void (*fail)(const char *fn, int nth, int code);
	void (*release)(void);
	void (*counts)(int *streams, int *events, int *host, int *waits);
	int (*set_device)(int device);
	int (*get_device)(int *device);
} fake;

#define FAKE_SYM(field, name)                                                                      \
	do {                                                                                       \
		void *s_ = dlsym(h, name);                                                         \
		cr_assert_not_null(s_, "%s", name);                                                \
		memcpy(&fake.field, &s_, sizeof s_);                                               \
	} while (0)

/* Loads the fake (the engine's dlopen finds the same instance) and resets
 * it to devices devices, copies held or not. */
static void fake_load(int devices, int held)
{
	void *h = dlopen(KILN_FAKE_CUDART, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
	cr_assert_not_null(h, "%s", dlerror());
	FAKE_SYM(reset, "fake_cudart_reset");
	FAKE_SYM(fail, "fake_cudart_fail");
	FAKE_SYM(release, "fake_cudart_release");
	FAKE_SYM(counts, "fake_cudart_counts");
	FAKE_SYM(set_device, "cudaSetDevice");
	FAKE_SYM(get_device, "cudaGetDevice");
	fake.reset(devices, held);
}

static kiln_copy_config fake_config(size_t pool_bytes, uint32_t max_buffers)
{
	return (kiln_copy_config){.backend = KILN_COPY_CUDA,
	                          .pool_bytes = pool_bytes,
	                          .max_buffers = max_buffers,
	                          .library = KILN_FAKE_CUDART};
}

static kiln_copy *open_fake(size_t pool_bytes, uint32_t max_buffers)
{
	kiln_copy_config cfg = fake_config(pool_bytes, max_buffers);
	kiln_copy *ce = NULL;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), 0);
	return ce;
}

/* Nothing of the fake's is live: no stream, event or pinned block. */
static void assert_fake_clean(void)
{
	int streams, events, host, waits;
	fake.counts(&streams, &events, &host, &waits);
	cr_assert_eq(streams, 0);
	cr_assert_eq(events, 0);
	cr_assert_eq(host, 0);
}

static int fake_waits(void)
{
	int streams, events, host, waits;
	fake.counts(&streams, &events, &host, &waits);
	return waits;
}

Test(copy, fake_cuda_probe_counts_the_missing_optional_symbol)
{
	fake_load(2, 0);
	kiln_copy_probe_report r;
	cr_assert_eq(kiln_copy_probe(KILN_COPY_CUDA, KILN_FAKE_CUDART, &r), 0);
	cr_assert_str_eq(r.library, KILN_FAKE_CUDART);
	cr_assert_eq(r.n_resolved, N_REQUIRED, "the fake lacks cudaGetErrorString");
	cr_assert_null(r.missing);
	cr_assert_eq(r.devices, 2);
	fake.reset(0, 0);
	cr_assert_eq(kiln_copy_probe(KILN_COPY_CUDA, KILN_FAKE_CUDART, &r), KILN_RT_ENODEVICE);
	cr_assert_eq(r.devices, 0);
	fake.reset(-1, 0);
	cr_assert_eq(kiln_copy_probe(KILN_COPY_CUDA, KILN_FAKE_CUDART, &r), KILN_RT_ENODEVICE);
	cr_assert_eq(r.devices, -1);
}

Test(copy, fake_cuda_round_trip_keeps_the_callers_device)
{
	fake_load(2, 0);
	cr_assert_eq(fake.set_device(1), 0);
	kiln_copy_config cfg = fake_config(1 * MIB, 0);
	cfg.device = 0;
	kiln_copy *ce = NULL;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), 0);
	int dev = -1;
	cr_assert_eq(fake.get_device(&dev), 0);
	cr_assert_eq(dev, 1, "open switched the caller's device");
	uint32_t a = offload_wait(ce, 100003, 11);
	reload_check(ce, a, 100003, 11);
	uint32_t b = offload_wait(ce, 5000, 12);
	cr_assert_eq(kiln_copy_drop(ce, b), 0);
	kiln_copy_close(ce);
	cr_assert_eq(fake.get_device(&dev), 0);
	cr_assert_eq(dev, 1, "close switched the caller's device");
	assert_fake_clean();
}

Test(copy, fake_cuda_held_copies_follow_the_state_machine)
{
	fake_load(1, 1);
	kiln_copy *ce = open_fake(64 * KIB, 8);
	uint8_t src[4000], dst[4000] = {0};
	fill(src, sizeof src, 21);
	uint32_t a;
	kiln_copy_event off, rel;
	cr_assert_eq(kiln_copy_offload(ce, src, sizeof src, &a, &off), 0);
	cr_assert_eq(kiln_copy_query(ce, off), 0, "held: not done");
	cr_assert_eq(kiln_copy_drop(ce, a), KILN_RT_ESTATE, "offload not done");
	/* Reload before the offload ended: the h2d stream waits for it. */
	cr_assert_eq(kiln_copy_reload(ce, a, dst, &rel), 0);
	cr_assert_eq(fake_waits(), 1);
	cr_assert_eq(kiln_copy_query(ce, rel), 0);
	cr_assert_eq(kiln_copy_reload(ce, a, dst, &rel), KILN_RT_ESTATE);
	cr_assert_eq(kiln_copy_wait(ce, rel), 0);
	cr_assert_eq(first_bad(dst, sizeof dst, 21), sizeof dst);
	cr_assert_eq(kiln_copy_query(ce, off), 1, "a reload's end is its offload's");
	cr_assert_eq(kiln_copy_drop(ce, a), KILN_RT_ESTATE, "released");

	/* An offload that ended unobserved can be dropped. */
	uint32_t b;
	cr_assert_eq(kiln_copy_offload(ce, src, sizeof src, &b, &off), 0);
	fake.release();
	cr_assert_eq(kiln_copy_drop(ce, b), 0);
	cr_assert_eq(kiln_copy_query(ce, off), 1);

	/* Reloading a completed offload needs no stream wait. */
	uint32_t c;
	cr_assert_eq(kiln_copy_offload(ce, src, sizeof src, &c, &off), 0);
	cr_assert_eq(kiln_copy_wait(ce, off), 0);
	memset(dst, 0, sizeof dst);
	cr_assert_eq(kiln_copy_reload(ce, c, dst, &rel), 0);
	cr_assert_eq(fake_waits(), 1);
	cr_assert_eq(kiln_copy_wait(ce, rel), 0);
	cr_assert_eq(first_bad(dst, sizeof dst, 21), sizeof dst);
	kiln_copy_close(ce);
	assert_fake_clean();
}

Test(copy, fake_cuda_offload_reaps_finished_reloads)
{
	fake_load(1, 1);
	kiln_copy *ce = open_fake(1024, 1);
	uint8_t src[1024], dst[1024];
	fill(src, sizeof src, 31);
	uint32_t a, b;
	kiln_copy_event off, rel;
	cr_assert_eq(kiln_copy_offload(ce, src, sizeof src, &a, &off), 0);
	cr_assert_eq(kiln_copy_reload(ce, a, dst, &rel), 0);
	/* Pool and table full while the reload is held. */
	cr_assert_eq(kiln_copy_offload(ce, src, sizeof src, &b, &off), KILN_RT_ENOSPC);
	/* The reload ends; nobody asks, but the next offload finds out. */
	fake.release();
	cr_assert_eq(kiln_copy_offload(ce, src, sizeof src, &b, &off), 0);
	cr_assert_eq(kiln_copy_query(ce, rel), 1);
	cr_assert_eq(first_bad(dst, sizeof dst, 31), sizeof dst);
	kiln_copy_close(ce);
	assert_fake_clean();
}

Test(copy, fake_cuda_close_finishes_held_copies)
{
	fake_load(1, 1);
	enum { N = 16 };
	size_t n = 64 * KIB;
	kiln_copy *ce = open_fake(N * n, N);
	uint8_t *src[N], *dst[N];
	for (int i = 0; i < N; i++) {
		src[i] = malloc(n);
		dst[i] = calloc(1, n);
		fill(src[i], n, (uint64_t)i);
		uint32_t buf;
		kiln_copy_event ev;
		cr_assert_eq(kiln_copy_offload(ce, src[i], n, &buf, &ev), 0);
		cr_assert_eq(kiln_copy_reload(ce, buf, dst[i], &ev), 0);
	}
	kiln_copy_close(ce);
	assert_fake_clean();
	for (int i = 0; i < N; i++) {
		cr_assert_eq(first_bad(dst[i], n, (uint64_t)i), n, "buffer %d", i);
		free(src[i]);
		free(dst[i]);
	}
}

Test(copy, fake_cuda_open_fails_cleanly_at_every_vendor_call)
{
	fake_load(2, 0);
	kiln_copy_config cfg = fake_config(64 * KIB, 4); /* 8 request slots, 8 events */
	kiln_copy *ce = (kiln_copy *)&ce;
	static const struct {
		const char *fn;
		int nth, code, want;
	} cases[] = {
	    {"cudaGetDeviceCount", 1, 100, KILN_RT_ENODEVICE},
	    {"cudaGetDeviceCount", 1, 35, KILN_RT_ENODEVICE},
	    {"cudaGetDeviceCount", 1, 999, KILN_RT_EBACKEND},
	    {"cudaGetDevice", 1, 3, KILN_RT_EBACKEND},
	    {"cudaSetDevice", 1, 101, KILN_RT_EBACKEND},
	    {"cudaHostAlloc", 1, 2, KILN_RT_EBACKEND},
	    {"cudaStreamCreateWithFlags", 1, 2, KILN_RT_EBACKEND},
	    {"cudaStreamCreateWithFlags", 2, 2, KILN_RT_EBACKEND},
	    {"cudaEventCreateWithFlags", 1, 2, KILN_RT_EBACKEND},
	    {"cudaEventCreateWithFlags", 5, 2, KILN_RT_EBACKEND},
	    {"cudaEventCreateWithFlags", 8, 2, KILN_RT_EBACKEND},
	};
	kiln_rt_set_allocator(counting_alloc, counting_free);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		n_live = 0;
		fail_at = 0;
		fake.fail(cases[i].fn, cases[i].nth, cases[i].code);
		int rc = kiln_copy_open(&cfg, &ce);
		cr_assert_eq(rc, cases[i].want, "%s #%d -> %d: got %d", cases[i].fn, cases[i].nth,
		             cases[i].code, rc);
		cr_assert_null(ce);
		assert_fake_clean();
		cr_assert_eq(n_live, 0, "%s #%d: %zu allocations left", cases[i].fn, cases[i].nth,
		             n_live);
	}
	fake.fail("", 0, 0);
	cfg.device = 2; /* of 2 */
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_ENODEVICE);
	cfg.device = -1;
	cr_assert_eq(kiln_copy_open(&cfg, &ce), KILN_RT_ENODEVICE);
	cr_assert_eq(n_live, 0);
	kiln_rt_set_allocator(NULL, NULL);
}

Test(copy, fake_cuda_open_survives_allocation_failure_at_every_step)
{
	fake_load(1, 0);
	kiln_copy_config cfg = fake_config(64 * KIB, 0);
	int rc = -100;
	/* The engine, the buffer table, the request table, the GPU state, the
	 * event table (the pool comes from cudaHostAlloc). */
	cr_assert_eq(fail_each_allocation(&cfg, &rc), 5);
	cr_assert_eq(rc, 0);
	assert_fake_clean();
}

Test(copy, fake_cuda_copy_failures_change_nothing_or_stop_the_engine)
{
	fake_load(1, 1);
	kiln_copy *ce = open_fake(4096, 4);
	uint8_t src[4096], dst[4096];
	fill(src, sizeof src, 41);
	uint32_t a;
	kiln_copy_event ev;
	fake.fail("cudaMemcpyAsync", 1, 1);
	cr_assert_eq(kiln_copy_offload(ce, src, sizeof src, &a, &ev), KILN_RT_EBACKEND);
	fake.fail("cudaEventRecord", 1, 1);
	cr_assert_eq(kiln_copy_offload(ce, src, sizeof src, &a, &ev), KILN_RT_EBACKEND);
	/* Neither kept pool space: the whole pool is still free. */
	cr_assert_eq(kiln_copy_offload(ce, src, sizeof src, &a, &ev), 0);
	fake.fail("cudaStreamWaitEvent", 1, 1);
	cr_assert_eq(kiln_copy_reload(ce, a, dst, &ev), KILN_RT_EBACKEND);
	fake.fail("cudaMemcpyAsync", 1, 1);
	cr_assert_eq(kiln_copy_reload(ce, a, dst, &ev), KILN_RT_EBACKEND);
	/* a is still offloaded and reloads fine. */
	cr_assert_eq(kiln_copy_reload(ce, a, dst, &ev), 0);
	cr_assert_eq(kiln_copy_wait(ce, ev), 0);
	cr_assert_eq(first_bad(dst, sizeof dst, 41), sizeof dst);

	/* A copy that fails on the device (an illegal address, 700) is
	 * reported by its ticket and stops the engine. */
	cr_assert_eq(kiln_copy_offload(ce, src, 100, &a, &ev), 0);
	fake.fail("cudaEventQuery", 1, 700);
	cr_assert_eq(kiln_copy_query(ce, ev), KILN_RT_EBACKEND);
	cr_assert_eq(kiln_copy_wait(ce, ev), KILN_RT_EBACKEND);
	uint32_t b;
	cr_assert_eq(kiln_copy_offload(ce, src, 100, &b, &ev), KILN_RT_EBACKEND);
	cr_assert_eq(kiln_copy_reload(ce, a, dst, &ev), KILN_RT_EBACKEND);
	cr_assert_eq(kiln_copy_drop(ce, a), 0, "a failed engine still releases buffers");
	kiln_copy_close(ce);
	assert_fake_clean();
}

/* Copies held by the fake, released now and then by another thread, so
 * that queries see pending copies and waits block for real. */
static atomic_int releasing;

static void *releaser_main(void *p)
{
	(void)p;
	while (releasing) {
		fake.release();
		sched_yield();
	}
	return NULL;
}

Test(copy, fake_cuda_concurrent_offloads_and_reloads_keep_every_byte)
{
	fake_load(1, 1);
	size_t pool = 512 * KIB;
	kiln_copy *ce = open_fake(pool, 16);
	pthread_t rel;
	releasing = 1;
	cr_assert_eq(pthread_create(&rel, NULL, releaser_main, NULL), 0);
	stress(ce, pool, 400);
	releasing = 0;
	pthread_join(rel, NULL);
	kiln_copy_close(ce);
	assert_fake_clean();
}

#endif
