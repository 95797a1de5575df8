/* runtime/acct.c: activation accounting for trainers whose allocator
 * cannot say how much memory is free.
 *
 * Counters are atomics updated with compare-and-swap, so events from many
 * threads need no lock and an event that would take a count below zero is
 * refused without changing anything. Events of one micro-batch must come in
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

static void give(_Atomic uint64_t *c, uint64_t bytes)
{
	atomic_fetch_add(c, bytes);
}

static void raise_peak(kiln_rti_acct *a, uint64_t held)
{
	uint64_t peak = atomic_load(&a->peak_bytes);
	while (held > peak && !atomic_compare_exchange_weak(&a->peak_bytes, &peak, held))
		;
}

int kiln_rt_acct_record(kiln_rt *rt, uint32_t mb, kiln_acct_event ev, uint64_t bytes)
{
	if (!rt)
		return KILN_RT_EINVAL;
	kiln_rti_acct *a = rt->acct;
	if (atomic_load(&a->stage) < 0)
		return KILN_RT_EINVAL;
	uint32_t s = mb % KILN_RTI_MB_SLOTS;
	int was_open = atomic_load(&a->mb_device[s]) || atomic_load(&a->mb_host[s]);
	switch (ev) {
	case KILN_ACCT_PRODUCED:
		give(&a->mb_device[s], bytes);
		give(&a->device_bytes, bytes);
		break;
	case KILN_ACCT_FREED:
		if (take(&a->mb_device[s], bytes) != 0)
			return KILN_RT_EACCT;
		take(&a->device_bytes, bytes);
		break;
	case KILN_ACCT_OFFLOADED:
		if (take(&a->mb_device[s], bytes) != 0)
			return KILN_RT_EACCT;
		take(&a->device_bytes, bytes);
		give(&a->mb_host[s], bytes);
		give(&a->host_bytes, bytes);
		break;
	case KILN_ACCT_RELOADED:
		if (take(&a->mb_host[s], bytes) != 0)
			return KILN_RT_EACCT;
		take(&a->host_bytes, bytes);
		give(&a->mb_device[s], bytes);
		give(&a->device_bytes, bytes);
		break;
	case KILN_ACCT_DROPPED:
		if (take(&a->mb_host[s], bytes) != 0)
			return KILN_RT_EACCT;
		take(&a->host_bytes, bytes);
		break;
	default:
		return KILN_RT_EINVAL;
	}
	raise_peak(a, atomic_load(&a->device_bytes));
	int is_open = atomic_load(&a->mb_device[s]) || atomic_load(&a->mb_host[s]);
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
