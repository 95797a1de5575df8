/* runtime/acct.c: activation accounting for trainers whose allocator
 * cannot say how much memory is free.
 *
 * Counters are atomics updated with compare-and-swap, so events from many
 * threads need no lock, and an event that would take a count below zero or
 * past UINT64_MAX is refused without changing anything. Events of one micro-batch must come in
 * order (one thread at a time per micro-batch); micro-batches are told apart
 * modulo KILN_RTI_MB_SLOTS.
 */
#include "internal.h"

int kiln_rt_acct_reset(kiln_rt *rt, int32_t stage, uint64_t limit_bytes)
{
	if (!rt)
		return KILN_RT_EINVAL;
	if (stage < 0 || (uint32_t)stage >= rt->meta->n_stages)
		return KILN_RT_ERANGE;
	const kiln_blob_stage *st = &rt->stages[stage];
	if (limit_bytes == 0)
		limit_bytes = st->capacity_bytes > st->static_bytes
		                  ? st->capacity_bytes - st->static_bytes
		                  : 0;
	kiln_rti_acct *a = rt->acct;
	atomic_store(&a->limit_bytes, limit_bytes);
	atomic_store(&a->device_bytes, 0);
	atomic_store(&a->host_bytes, 0);
	atomic_store(&a->peak_bytes, 0);
	atomic_store(&a->open, 0);
	for (int i = 0; i < KILN_RTI_MB_SLOTS; i++) {
		atomic_store(&a->mb_device[i], 0);
		atomic_store(&a->mb_host[i], 0);
	}
	atomic_store(&a->stage, stage);
	return 0;
}

/* *c -= bytes unless that goes below zero. Returns 0 or -1. */
static int take(_Atomic uint64_t *c, uint64_t bytes)
{
	uint64_t v = atomic_load(c);
	do {
		if (v < bytes)
			return -1;
	} while (!atomic_compare_exchange_weak(c, &v, v - bytes));
	return 0;
}

/* *c += bytes unless that passes UINT64_MAX. Returns 0 or -1. */
static int put(_Atomic uint64_t *c, uint64_t bytes)
{
	uint64_t v = atomic_load(c);
	do {
		if (bytes > UINT64_MAX - v)
			return -1;
	} while (!atomic_compare_exchange_weak(c, &v, v + bytes));
	return 0;
}

static void raise_peak(kiln_rti_acct *a, uint64_t held)
{
	uint64_t peak = atomic_load(&a->peak_bytes);
	while (held > peak && !atomic_compare_exchange_weak(&a->peak_bytes, &peak, held))
		;
}

/* Moves bytes from one pair of counters (the micro-batch's and the total)
 * to another: from the micro-batch's count first, to the total first, so
 * that a micro-batch's count never exceeds its total's, even between the
 * steps, and a total that cannot take the bytes is found before anything
 * else changes. A NULL side is the outside world. Returns 0, or -1 with the
 * counters as they were. */
static int move(_Atomic uint64_t *from_mb, _Atomic uint64_t *from_total, _Atomic uint64_t *to_mb,
                _Atomic uint64_t *to_total, uint64_t bytes)
{
	if (from_mb && take(from_mb, bytes) != 0)
		return -1;
	if (to_total && put(to_total, bytes) != 0) {
		if (from_mb)
			atomic_fetch_add(from_mb, bytes);
		return -1;
	}
	/* Cannot fail: a micro-batch's count is at most its total's. */
	if (from_total)
		take(from_total, bytes);
	if (to_mb)
		put(to_mb, bytes);
	return 0;
}

int kiln_rt_acct_record(kiln_rt *rt, uint32_t mb, kiln_acct_event ev, uint64_t bytes)
{
	if (!rt)
		return KILN_RT_EINVAL;
	kiln_rti_acct *a = rt->acct;
	if (atomic_load(&a->stage) < 0)
		return KILN_RT_EINVAL;
	uint32_t s = mb % KILN_RTI_MB_SLOTS;
	_Atomic uint64_t *mdev = &a->mb_device[s], *mhost = &a->mb_host[s];
	int was_open = atomic_load(mdev) || atomic_load(mhost);
	int rc;
	switch (ev) {
	case KILN_ACCT_PRODUCED:
		rc = move(NULL, NULL, mdev, &a->device_bytes, bytes);
		break;
	case KILN_ACCT_FREED:
		rc = move(mdev, &a->device_bytes, NULL, NULL, bytes);
		break;
	case KILN_ACCT_OFFLOADED:
		rc = move(mdev, &a->device_bytes, mhost, &a->host_bytes, bytes);
		break;
	case KILN_ACCT_RELOADED:
		rc = move(mhost, &a->host_bytes, mdev, &a->device_bytes, bytes);
		break;
	case KILN_ACCT_DROPPED:
		rc = move(mhost, &a->host_bytes, NULL, NULL, bytes);
		break;
	default:
		return KILN_RT_EINVAL;
	}
	if (rc != 0)
		return KILN_RT_EACCT;
	raise_peak(a, atomic_load(&a->device_bytes));
	int is_open = atomic_load(mdev) || atomic_load(mhost);
	if (is_open && !was_open)
		atomic_fetch_add(&a->open, 1);
	else if (!is_open && was_open)
		atomic_fetch_sub(&a->open, 1);
	return 0;
}

void kiln_rt_acct_get(const kiln_rt *rt, kiln_acct *out)
{
	if (!out)
		return;
	if (!rt) {
		*out = (kiln_acct){0};
		return;
	}
	kiln_rti_acct *m = rt->acct;
	uint64_t limit = atomic_load(&m->limit_bytes), held = atomic_load(&m->device_bytes);
	*out = (kiln_acct){.limit_bytes = limit,
	                   .device_bytes = held,
	                   .host_bytes = atomic_load(&m->host_bytes),
	                   .peak_device_bytes = atomic_load(&m->peak_bytes),
	                   .open_microbatches = atomic_load(&m->open),
	                   .free_bytes = limit > held ? limit - held : 0};
}
