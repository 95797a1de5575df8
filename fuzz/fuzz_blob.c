/* fuzz/fuzz_blob.c: libFuzzer target for the blob loader (kiln_rt_open).
 *
 * Each input is a candidate plan blob. It is opened twice: as given, and
 * "repaired" (file_bytes set to the input's size and the CRC32C recomputed),
 * because a mutated blob almost never keeps a valid checksum and the
 * structural checks behind it would otherwise go untested. Whatever opens is
 * then walked through the whole read API (info, stages, layers, units,
 * tables and points, the plan and template pools) with in-range and
 * out-of-range arguments, and a few selections and accounting events whose
 * values come from a hash of the input (so a crash reproduces from the file
 * alone). The promises runtime.h makes are checked: a failed open leaves
 * *out NULL, a plan has one valid action per unit of its layer, a plan
 * without KILN_PLAN_OVER_BUDGET fits. Finally the open is repeated with an
 * allocator that fails at one of its allocations (which one, the input's
 * hash decides): it must report KILN_RT_ENOMEM and leak nothing. docs/fuzzing.md says how to run
 * it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/blob.h"
#include "kiln/runtime.h"
#include "runtime/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Cheap, deterministic values derived from the input (splitmix64). */
static uint64_t rng_state;

static uint64_t rng(void)
{
	uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* A row count or byte count: the edges (0, 1, huge) as often as the middle. */
static uint64_t pick_u64(uint64_t typical)
{
	switch (rng() % 6) {
	case 0:
		return 0;
	case 1:
		return typical;
	case 2:
		return typical + typical / 2 + 1;
	case 3:
		return UINT64_MAX - rng() % 3;
	case 4:
		return typical * (rng() % 8);
	default:
		return rng() >> (rng() % 64);
	}
}

#define CHECK(cond)                                                                                \
	do {                                                                                       \
		if (!(cond))                                                                       \
			__builtin_trap();                                                          \
	} while (0)

/* Bounds on the walk, so one input stays fast even when its counts are large. */
enum { MAX_LAYERS = 512, MAX_SELECT_LAYERS = 64, MAX_TASKS = 1024 };

static volatile size_t sink; /* keeps string reads from being optimised away */

static void walk_template(const kiln_rt *rt, int32_t id)
{
	kiln_rt_template_info ti;
	if (kiln_rt_template_get(rt, id, &ti) != KILN_RT_OK)
		return;
	int32_t n_tasks = ti.n_tasks < MAX_TASKS ? ti.n_tasks : MAX_TASKS;
	for (int32_t i = -1; i <= n_tasks; i++) {
		kiln_rt_task t;
		if (kiln_rt_template_task(rt, id, i, &t) == KILN_RT_OK) {
			CHECK(i >= 0 && i < ti.n_tasks);
			sink += strlen(t.name);
		}
	}
	int32_t n_deps = ti.n_deps < MAX_TASKS ? ti.n_deps : MAX_TASKS;
	for (int32_t j = -1; j <= n_deps; j++) {
		int32_t task = -1, dep = -1;
		if (kiln_rt_template_dep(rt, id, j, &task, &dep) == KILN_RT_OK) {
			CHECK(j >= 0 && j < ti.n_deps);
			CHECK(task >= 0 && task < ti.n_tasks && dep >= 0 && dep < ti.n_tasks);
		}
	}
}

/* An index to probe among n: the edges (-1, 0, n - 1, n) and random ones
 * in between, so one input stays fast however large its counts. */
static int32_t probe(int i, int32_t n)
{
	switch (i) {
	case 0:
		return -1;
	case 1:
		return 0;
	case 2:
		return n - 1;
	case 3:
		return n;
	default:
		return n > 0 ? (int32_t)(rng() % (uint64_t)n) : 0;
	}
}

enum { N_PROBES = 8 };

/* Some (bucket, point) tables of a layer, and the plans their points name. */
static void walk_tables(const kiln_rt *rt, int32_t model_layer, const kiln_rt_info *info)
{
	for (int i = 0; i < N_PROBES; i++) {
		int32_t b = probe(i, info->n_buckets);
		kiln_rt_table_info ti;
		if (kiln_rt_table_get(rt, model_layer, b, &ti) != KILN_RT_OK)
			continue;
		CHECK(b >= 0 && b < info->n_buckets && ti.n_points >= 1);
		for (int j = 0; j < N_PROBES; j++) {
			int32_t k = probe(j, ti.n_points);
			kiln_rt_point pt;
			if (kiln_rt_point_get(rt, model_layer, b, k, &pt) != KILN_RT_OK)
				continue;
			CHECK(k >= 0 && k < ti.n_points);
			CHECK(pt.plan >= 0 && pt.plan < kiln_rt_plan_count(rt));
		}
	}
}

/* Some plans of the pool, and some templates by index. */
static void walk_pools(const kiln_rt *rt)
{
	int32_t n_plans = kiln_rt_plan_count(rt), n_templates = kiln_rt_template_count(rt);
	CHECK(n_plans >= 0 && n_templates >= 0);
	for (int i = 0; i < 4 * N_PROBES; i++) {
		int32_t p = probe(i, n_plans);
		const uint8_t *actions = NULL;
		int32_t n_units = -1, template_id = -2;
		if (kiln_rt_plan_get(rt, p, &actions, &n_units, &template_id) != KILN_RT_OK)
			continue;
		CHECK(p >= 0 && p < n_plans && n_units >= 0);
		CHECK(template_id >= -1 && template_id < n_templates);
		for (int32_t u = 0; u < n_units; u++)
			CHECK(actions[u] <= KILN_RT_OFFLOAD);
	}
	for (int i = 0; i < N_PROBES; i++)
		walk_template(rt, probe(i, n_templates));
}

static void check_plan(const kiln_rt *rt, const kiln_rt_layer_info *li, const kiln_plan *p)
{
	CHECK(p->n_units == li->n_units);
	CHECK(p->actions != NULL || p->n_units == 0);
	for (int32_t u = 0; u < p->n_units; u++)
		CHECK(p->actions[u] <= KILN_RT_OFFLOAD);
	if (!(p->flags & KILN_PLAN_OVER_BUDGET))
		CHECK(p->resident_bytes <= p->avail_bytes);
	kiln_rt_template_info ti;
	if (p->template_id >= 0)
		CHECK(kiln_rt_template_get(rt, p->template_id, &ti) == KILN_RT_OK);
}

static void select_some(const kiln_rt *rt, int32_t model_layer, const kiln_rt_layer_info *li,
                        int from_accounting)
{
	uint32_t tokens[64];
	for (int k = 0; k < 3; k++) {
		kiln_query q;
		memset(&q, 0, sizeof q);
		/* Mostly the layer's own stage; sometimes a wrong one. */
		q.stage = rng() % 8 ? li->stage : (int32_t)(rng() % 4) - 1;
		q.layer = model_layer;
		if (rng() % 3 == 0) {
			q.n_tokens = (int32_t)(rng() % 65);
			for (int32_t e = 0; e < q.n_tokens; e++)
				tokens[e] = (uint32_t)pick_u64(li->balanced_rows / 8 + 1);
			q.tokens = tokens;
		} else {
			q.total_rows = pick_u64(li->balanced_rows);
		}
		q.free_bytes = from_accounting ? KILN_RT_FREE_FROM_ACCOUNTING : pick_u64(1u << 30);
		q.pending = (uint32_t)(rng() % 5);
		/* Sometimes the EP group's rows (blob 1.1's group fallback). */
		uint32_t group[8];
		if (rng() % 2) {
			q.group_size = (int32_t)(rng() % 9);
			for (int32_t r = 0; r < q.group_size; r++)
				group[r] = (uint32_t)pick_u64(li->balanced_rows);
			q.group_rows = group;
		}
		kiln_plan p;
		if (kiln_rt_select(rt, &q, &p) != KILN_RT_OK)
			continue;
		check_plan(rt, li, &p);
		if (q.group_size > 1) {
			/* The group's answer does not depend on the order of its
			 * counts, nor on this rank's own rows or free memory. */
			uint32_t first = group[0];
			memmove(group, group + 1, sizeof(uint32_t) * (size_t)(q.group_size - 1));
			group[q.group_size - 1] = first;
			q.total_rows = pick_u64(li->balanced_rows);
			q.tokens = NULL;
			q.free_bytes = pick_u64(1u << 30);
			kiln_plan o;
			if (kiln_rt_select(rt, &q, &o) == KILN_RT_OK) {
				CHECK((o.flags & KILN_PLAN_GROUP_FALLBACK) ==
				      (p.flags & KILN_PLAN_GROUP_FALLBACK));
				if (p.flags & KILN_PLAN_GROUP_FALLBACK)
					CHECK(o.plan == p.plan && o.actions == p.actions);
				check_plan(rt, li, &o);
			}
		}
	}
}

static void exercise(kiln_rt *rt)
{
	kiln_rt_info info;
	kiln_rt_info_get(rt, &info);
	sink += strlen(info.model) + strlen(info.compiler);
	CHECK(info.n_stages >= 0 && info.n_model_layers >= 0);

	for (int32_t s = -1; s <= info.n_stages; s++) {
		kiln_rt_stage_info si;
		if (kiln_rt_stage_get(rt, s, &si) == KILN_RT_OK)
			CHECK(s >= 0 && s < info.n_stages);
	}

	int32_t n_layers = info.n_model_layers < MAX_LAYERS ? info.n_model_layers : MAX_LAYERS;
	int32_t selected = 0;
	for (int32_t l = -1; l <= n_layers; l++) {
		kiln_rt_layer_info li;
		if (kiln_rt_layer_get(rt, l, &li) != KILN_RT_OK)
			continue;
		CHECK(li.stage >= 0 && li.stage < info.n_stages && li.n_units >= 0);
		for (int32_t u = -1; u <= li.n_units; u++) {
			kiln_rt_unit_info ui;
			if (kiln_rt_unit_get(rt, l, u, &ui) == KILN_RT_OK) {
				CHECK(u >= 0 && u < li.n_units);
				sink += strlen(ui.name);
			}
			sink += (size_t)kiln_rt_unit_bytes(rt, l, u, pick_u64(li.balanced_rows));
		}
		kiln_rt_group_info gi;
		CHECK(kiln_rt_group_get(rt, l, &gi) == KILN_RT_OK);
		CHECK(gi.plan >= -1 && gi.plan < kiln_rt_plan_count(rt));
		CHECK(gi.plan >= 0 || gi.fit_rows == 0);
		if (selected++ < MAX_SELECT_LAYERS) {
			walk_tables(rt, l, &info);
			select_some(rt, l, &li, 0);
		}
	}

	/* Accounting on one stage, then selections that read it. */
	int32_t stage = info.n_stages > 0 ? (int32_t)(rng() % (uint64_t)info.n_stages) : 0;
	if (kiln_rt_acct_reset(rt, stage, rng() % 2 ? 0 : pick_u64(1u << 24)) == KILN_RT_OK) {
		for (int i = 0; i < 8; i++)
			kiln_rt_acct_record(rt, (uint32_t)(rng() % 4), (kiln_acct_event)(rng() % 6),
			                    pick_u64(1u << 20));
		kiln_acct acct;
		kiln_rt_acct_get(rt, &acct);
		CHECK(acct.device_bytes <= acct.peak_device_bytes);
		selected = 0;
		for (int32_t l = 0; l < n_layers && selected < MAX_SELECT_LAYERS; l++) {
			kiln_rt_layer_info li;
			if (kiln_rt_layer_get(rt, l, &li) == KILN_RT_OK && li.stage == stage) {
				select_some(rt, l, &li, 1);
				selected++;
			}
		}
	}

	walk_pools(rt);
	walk_template(rt, INT32_MAX);
}

/* Allocation-failure injection: counts allocations, and makes the one
 * numbered alloc_fail_at (0-based) fail; -1 fails none. */
static int alloc_fail_at = -1, alloc_count;

static void *counting_alloc(size_t bytes)
{
	if (alloc_count++ == alloc_fail_at)
		return NULL;
	return malloc(bytes);
}

static int open_checked(const void *blob, size_t size, kiln_rt **out)
{
	*out = (kiln_rt *)(uintptr_t)1; /* must be overwritten */
	alloc_count = 0;
	kiln_rt_set_allocator(counting_alloc, free);
	int rc = kiln_rt_open(blob, size, out);
	kiln_rt_set_allocator(NULL, NULL);
	CHECK(kiln_rt_strerror(rc) != NULL);
	CHECK(rc <= 0);
	CHECK((rc == KILN_RT_OK) == (*out != NULL));
	return rc;
}

static void open_and_walk(const uint8_t *blob, size_t size)
{
	kiln_rt *rt;
	alloc_fail_at = -1;
	if (open_checked(blob, size, &rt) != KILN_RT_OK)
		return;
	int n_allocs = alloc_count;
	exercise(rt);
	kiln_rt_close(rt);

	/* Any allocation kiln_rt_open makes may fail; it must say so and
	 * free what it had. One of them per input (chosen by the input's
	 * hash): over a run, every one. */
	if (n_allocs > 0) {
		alloc_fail_at = (int)(rng() % (uint64_t)n_allocs);
		CHECK(open_checked(blob, size, &rt) == KILN_RT_ENOMEM);
		alloc_fail_at = -1;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* A blob is read in place, so give it the alignment a file mapping
	 * would have, in a buffer of exactly size bytes so that AddressSanitizer
	 * sees any read past its end. */
	void *mem = NULL;
	if (posix_memalign(&mem, KILN_BLOB_ALIGN, size ? size : 1) != 0)
		return 0;
	uint8_t *blob = mem;
	memcpy(blob, data, size);

	rng_state = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < size; i++)
		rng_state = (rng_state ^ data[i]) * 0x100000001b3ull;

	open_and_walk(blob, size);

	kiln_blob_header h;
	if (size >= sizeof h) {
		memcpy(&h, blob, sizeof h);
		h.file_bytes = size;
		memcpy(blob, &h, sizeof h);
		size_t crc_at = offsetof(kiln_blob_header, crc32c);
		uint32_t crc = kiln_rti_crc32c(0, blob, crc_at);
		crc = kiln_rti_crc32c(crc, blob + crc_at + 4, size - crc_at - 4);
		memcpy(blob + crc_at, &crc, 4);
		if (memcmp(blob, data, size) != 0)
			open_and_walk(blob, size);
	}
	free(mem);
	return 0;
}
