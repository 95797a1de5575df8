/* tests/test_group.c: the EP group's fallback beyond the declared load
 * (docs/runtime.md, "Beyond the declared load"): the compiler's GROUPS
 * section (passes/baselines.c, codegen/blob.c) and its threshold
 * (passes/budget.c, kiln_budget_fit_rows), its validation
 * (runtime/open.c), the group rule in select (runtime/select.c) and the
 * simulator's use of it (sim/sim.c, sim/policy.c).
 *
 * Expected values come from elsewhere than the code under test: the
 * threshold by hand on a roomy tiny and by brute force over every choice
 * of plans on its stages (never below what the public stage and table
 * getters say the tables promise), the group's plan by brute force over
 * every plan of its set's tables against the full-recompute baseline's
 * bytes summed by hand, its bytes summed by hand from the public per-unit
 * figures, the rule's answer by brute force over every
 * combination of a few row counts on groups of one to four ranks, and the
 * out-of-memory counts measured by the simulator on a heavy-tailed trace.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "kiln/blob.h"
#include "kiln/runtime.h"
#include "kiln_test.h"
#include "passes/passes.h"
#include "passes/schedule.h"
#include "runtime/internal.h"
#include "sim/sim.h"

/* ------------------------------------------------------------ fixtures */

/* tiny with 16 EP ranks of 2 experts (so one rank can receive up to 16x its
 * balanced rows: sim/sim.c, r_max), 4 micro-batches and 12 MiB of device
 * memory: at 11x on one rank full recompute fits and kiln without the
 * group's counts does not (measured below, not assumed). */
static char *tiny16_path_edit(const char *experts, const char *memory_gib)
{
	FILE *f = fopen(kt_src("examples/models/tiny.yaml"), "r");
	cr_assert_not_null(f);
	char text[8192];
	size_t len = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	text[len] = '\0';
	const char *const edits[][2] = {{"experts: 8", experts},
	                                {"devices: 8", "devices: 32"},
	                                {"ep: 4", "ep: 16"},
	                                {"global_batch: 32", "global_batch: 128"},
	                                {"memory_gib: 0.009765625", memory_gib}};
	char out[8192];
	for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
		char *at = strstr(text, edits[e][0]);
		cr_assert_not_null(at, "tiny.yaml has no \"%s\"", edits[e][0]);
		snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, edits[e][1],
		         at + strlen(edits[e][0]));
		memcpy(text, out, strlen(out) + 1);
	}
	return kt_temp_file(".yaml", text, strlen(text));
}

static char *tiny16_path_mem(const char *memory_gib)
{
	return tiny16_path_edit("experts: 32", memory_gib);
}

static char *tiny16_path(void)
{
	return tiny16_path_mem("memory_gib: 0.01171875");
}

typedef struct fixture {
	kiln_arena *a;
	kiln_compilation c;
	unsigned char *blob;
	size_t len;
	kiln_rt *rt;
} fixture;

static void setup_path(fixture *f, const char *path)
{
	memset(f, 0, sizeof *f);
	f->a = kiln_arena_new();
	cr_assert_not_null(f->a);
	kiln_model *m = NULL;
	cr_assert_eq(kiln_frontend_load_file(path, f->a, stderr, &m), 0, "%s", path);
	f->c = (kiln_compilation){.model = m, .arena = f->a, .solver = KILN_SOLVER_DP};
	cr_assert_eq(kiln_pipeline_compile(&f->c, NULL, NULL, NULL, stderr), 0, "%s", path);
	cr_assert_eq(kiln_blob_build(&f->c, stderr, &f->blob, &f->len), 0);
	cr_assert_eq(kiln_rt_open(f->blob, f->len, &f->rt), 0);
}

static void setup_tiny16(fixture *f)
{
	char *p = tiny16_path();
	setup_path(f, p);
	unlink(p);
	free(p);
}

/* tiny16 with 16 MiB (15 MiB for activations, weights and state after the
 * 1 MiB reserved): room enough that the threshold lies past the last
 * bucket (kiln_budget_fit_rows). */
static void setup_tiny16_roomy(fixture *f)
{
	char *p = tiny16_path_mem("memory_gib: 0.015625");
	setup_path(f, p);
	unlink(p);
	free(p);
}

static void teardown(fixture *f)
{
	kiln_rt_close(f->rt);
	free(f->blob);
	kiln_arena_free(f->a);
}

/* Rewrites the header's CRC after a deliberate change. */
static void fix_crc(unsigned char *b, size_t len)
{
	const size_t at = offsetof(kiln_blob_header, crc32c);
	uint32_t crc = kiln_rti_crc32c(0, b, at);
	crc = kiln_rti_crc32c(crc, b + at + 4, len - at - 4);
	memcpy(b + at, &crc, 4);
}

static kiln_blob_section section(const unsigned char *b, int id)
{
	kiln_blob_section s;
	memcpy(&s, b + sizeof(kiln_blob_header) + (size_t)id * sizeof s, sizeof s);
	return s;
}

/* The fixture's blob as a 1.0 blob: the same bytes up to GROUPS, the
 * header re-labelled and its GROUPS entry cleared. */
static unsigned char *as_1_0(const fixture *f, size_t *out_len)
{
	kiln_blob_section gs = section(f->blob, KILN_SEC_GROUPS);
	size_t len = (size_t)gs.offset;
	unsigned char *b = malloc(len);
	cr_assert_not_null(b);
	memcpy(b, f->blob, len);
	kiln_blob_header h;
	memcpy(&h, b, sizeof h);
	h.minor = 0;
	h.n_sections = KILN_SEC_GROUPS;
	h.file_bytes = len;
	memcpy(b, &h, sizeof h);
	memset(b + sizeof h + KILN_SEC_GROUPS * sizeof(kiln_blob_section), 0,
	       sizeof(kiln_blob_section));
	fix_crc(b, len);
	*out_len = len;
	return b;
}

/* What the tables promise, from the public getters: the largest rows of
 * the last bucket whose load factor is within the stage's safety factor (0:
 * none is). The threshold is at least this (docs/runtime.md, "Why this
 * threshold"); past the last bucket it may be more (checked by
 * fit_rows_by_hand_past_the_last_bucket and
 * fit_rows_is_where_some_choice_stops_fitting_brute_force). */
static uint64_t tables_fit(const kiln_rt *rt, int32_t layer)
{
	kiln_rt_layer_info li;
	kiln_rt_stage_info si;
	kiln_rt_info info;
	cr_assert_eq(kiln_rt_layer_get(rt, layer, &li), 0);
	cr_assert_eq(kiln_rt_stage_get(rt, li.stage, &si), 0);
	kiln_rt_info_get(rt, &info);
	uint64_t fit = 0;
	for (int32_t b = 0; b < info.n_buckets; b++) {
		kiln_rt_table_info t;
		cr_assert_eq(kiln_rt_table_get(rt, layer, b, &t), 0);
		if (t.load_factor <= si.safety_factor * (1 + 1e-12))
			fit = t.max_rows;
	}
	return fit;
}

/* The rule's threshold: the blob's record (the rule's tests take it as
 * given), never below what the tables promise. */
static uint64_t expected_fit(const kiln_rt *rt, int32_t layer)
{
	kiln_rt_group_info gi;
	cr_assert_eq(kiln_rt_group_get(rt, layer, &gi), 0);
	if (gi.plan < 0)
		return 0;
	cr_assert_geq(gi.fit_rows, tables_fit(rt, layer), "layer %d", layer);
	return gi.fit_rows;
}

/* The set of model layer `layer` in the compilation. */
static int32_t set_of(const kiln_compilation *c, int32_t layer)
{
	for (int32_t l = 0; l < c->graph->n_layers; l++) {
		const kiln_ir_layer *L = &c->graph->layers[l];
		if (L->index != layer)
			continue;
		for (int32_t k = 0; k < c->n_sets; k++)
			if (c->sets[k].stage == L->stage && c->sets[k].kind == L->kind)
				return k;
	}
	return -1;
}

static uint64_t rnd_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd64(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

/* ------------------------------------------------------------ the rule */

/* Step 8 (docs/runtime.md, "The group's slowest rank"), from its
 * definition and the public getters: where the group's most rows (most)
 * exceed this rank's on an MoE layer and this rank's decision alone is not
 * over budget, the decision moves along alone's table to the last point
 * whose exposed time is within that of the decision the same query gets
 * at most's rows alone, with this micro-batch's held bytes at their fair
 * share through the earlier layers (the rest free); GROUP_SLACK when it
 * moved. *want starts as alone (the counts zeroed). */
static void slack_expected(const kiln_rt *rt, const kiln_query *q, const kiln_plan *alone,
                           uint64_t most, kiln_plan *want)
{
	*want = *alone;
	kiln_rt_layer_info li;
	cr_assert_eq(kiln_rt_layer_get(rt, q->layer, &li), 0);
	if (!li.moe || most <= q->total_rows || (alone->flags & KILN_PLAN_OVER_BUDGET))
		return;
	/* The most loaded rank's micro-batch is taken to hold its fair share
	 * through the earlier layers (kt_fair_scale), the rest of this rank's
	 * held bytes free. */
	kiln_rt_stage_info si;
	cr_assert_eq(kiln_rt_stage_get(rt, q->stage, &si), 0);
	double fh = kt_fair_scale(&si) * (double)(li.head_steady_bytes - li.steady_bytes);
	double f2 = (double)q->free_bytes + (double)q->held_bytes - fh;
	kiln_query q2 = *q;
	q2.total_rows = most;
	q2.free_bytes = f2 > 0 ? (uint64_t)f2 : 0;
	q2.held_bytes = fh > 0 ? (uint64_t)fh : 0;
	q2.group_rows = NULL;
	q2.group_size = 0;
	kiln_plan top;
	cr_assert_eq(kiln_rt_select(rt, &q2, &top), 0);
	kiln_rt_table_info ti;
	cr_assert_eq(kiln_rt_table_get(rt, q->layer, alone->bucket, &ti), 0);
	int32_t at = -1;
	kiln_rt_point pt;
	for (int32_t i = 0; i < ti.n_points; i++) {
		cr_assert_eq(kiln_rt_point_get(rt, q->layer, alone->bucket, i, &pt), 0);
		if (pt.plan == alone->plan)
			at = i;
	}
	cr_assert_geq(at, 0, "alone's plan is a point of its table");
	int32_t to = at;
	while (to + 1 < ti.n_points) {
		cr_assert_eq(kiln_rt_point_get(rt, q->layer, alone->bucket, to + 1, &pt), 0);
		if (!(pt.exposed_us <= top.exposed_us))
			break;
		to++;
	}
	if (to == at)
		return;
	cr_assert_eq(kiln_rt_point_get(rt, q->layer, alone->bucket, to, &pt), 0);
	const uint8_t *acts;
	int32_t n_units, tpl;
	cr_assert_eq(kiln_rt_plan_get(rt, pt.plan, &acts, &n_units, &tpl), 0);
	want->actions = acts;
	want->plan = pt.plan;
	want->template_id = tpl;
	want->saved_bytes = pt.saved_bytes;
	want->resident_bytes = ti.keep_bytes - pt.saved_bytes;
	want->exposed_us = pt.exposed_us;
	want->flags |= KILN_PLAN_GROUP_SLACK;
}

/* Every rank of a group of 1 to 4 ranks, each with its own rows, free
 * memory and pending count and the group's rows in its own order (rotated
 * by its rank), over every combination of 7 row counts around the
 * threshold: all ranks fall back together exactly when some rank's rows
 * exceed the threshold, all then return the full-recompute plan with its
 * hand-summed bytes at their own rows, and otherwise each returns exactly
 * what it returns without counts. */
Test(group, every_rank_of_a_group_decides_alike_brute_force, .timeout = 300)
{
	fixture f;
	setup_tiny16(&f);
	kiln_rt_info info;
	kiln_rt_info_get(f.rt, &info);
	int32_t moe_layers = 0, slack_moves = 0;
	for (int32_t layer = 0; layer < info.n_model_layers; layer++) {
		kiln_rt_layer_info li;
		cr_assert_eq(kiln_rt_layer_get(f.rt, layer, &li), 0);
		uint64_t fit = expected_fit(f.rt, layer);
		int32_t set = set_of(&f.c, layer);
		cr_assert_geq(set, 0);
		/* The group's plan: the record's (which plan it is, is checked by
		 * group_plan_is_the_cheapest_that_never_holds_more_than_full_recompute). */
		kiln_rt_group_info gi;
		cr_assert_eq(kiln_rt_group_get(f.rt, layer, &gi), 0);
		int32_t want_plan = li.moe ? gi.plan : -1;
		moe_layers += li.moe;
		if (li.moe)
			cr_assert_gt(
			    fit, 0, "layer %d: the stage fits its maximal saving somewhere", layer);
		const uint8_t *acts = NULL;
		int32_t n_units = 0, tpl;
		if (li.moe)
			cr_assert_eq(kiln_rt_plan_get(f.rt, want_plan, &acts, &n_units, &tpl), 0);
		uint64_t fv = fit > UINT32_MAX - 1 ? UINT32_MAX - 1 : fit;
		const uint32_t vals[7] = {0,
		                          1,
		                          (uint32_t)(fv / 2),
		                          (uint32_t)fv,
		                          (uint32_t)fv + 1,
		                          (uint32_t)(3 * fv < UINT32_MAX ? 3 * fv : UINT32_MAX),
		                          UINT32_MAX};
		for (int32_t g = 1; g <= 4; g++) {
			int32_t combos = 1;
			for (int32_t r = 0; r < g; r++)
				combos *= 7;
			for (int32_t cmb = 0; cmb < combos; cmb++) {
				uint32_t rows[4];
				uint64_t most = 0;
				for (int32_t r = 0, x = cmb; r < g; r++, x /= 7) {
					rows[r] = vals[x % 7];
					most = rows[r] > most ? rows[r] : most;
				}
				int want_fb = li.moe && most > fit;
				for (int32_t r = 0; r < g; r++) {
					uint32_t seen[4];
					for (int32_t j = 0; j < g; j++)
						seen[j] = rows[(j + r) % g];
					kiln_query q = {.stage = li.stage,
					                .layer = layer,
					                .total_rows = rows[r],
					                .free_bytes = rnd64() % (64ull << 20),
					                .pending = (uint32_t)(rnd64() % 3),
					                .microbatch = (uint32_t)r};
					kiln_plan alone, with;
					cr_assert_eq(kiln_rt_select(f.rt, &q, &alone), 0);
					q.group_rows = seen;
					q.group_size = g;
					cr_assert_eq(kiln_rt_select(f.rt, &q, &with), 0);
					cr_assert_eq(with.group_max_rows, most);
					cr_assert_eq((with.flags & KILN_PLAN_GROUP_FALLBACK) != 0,
					             want_fb,
					             "layer %d, group %d, combination %d, rank %d",
					             layer, g, cmb, r);
					if (!want_fb) {
						kiln_plan want = alone;
						slack_expected(f.rt, &q, &alone, most, &want);
						slack_moves +=
						    (want.flags & KILN_PLAN_GROUP_SLACK) != 0;
						with.group_max_rows = 0;
						cr_assert(
						    memcmp(&want, &with, sizeof want) == 0,
						    "layer %d, group %d, combination %d, rank "
						    "%d: below the threshold the counts change "
						    "nothing but step 8 (plan %d, want %d)",
						    layer, g, cmb, r, with.plan, want.plan);
						continue;
					}
					cr_assert_eq(with.plan, want_plan);
					cr_assert_eq(with.n_units, n_units);
					cr_assert_eq(with.actions, acts);
					uint64_t kept = 0, other = 0;
					for (int32_t u = 0; u < n_units; u++) {
						uint64_t b =
						    kiln_rt_unit_bytes(f.rt, layer, u, rows[r]);
						if (acts[u] == KILN_RT_KEEP)
							kept = kept > UINT64_MAX - b ? UINT64_MAX
							                             : kept + b;
						else
							other = other > UINT64_MAX - b ? UINT64_MAX
							                               : other + b;
					}
					cr_assert_eq(with.resident_bytes, kept);
					cr_assert_eq(with.saved_bytes, other);
					cr_assert_geq(with.transient_bytes, other);
					cr_assert_eq((with.flags & KILN_PLAN_LOAD_BEYOND) != 0,
					             (alone.flags & KILN_PLAN_LOAD_BEYOND) != 0);
				}
			}
		}
	}
	cr_assert_gt(moe_layers, 0);
	cr_assert_gt(slack_moves, 0, "step 8 moved some decision");
	teardown(&f);
}

/* Bytes a plan of set S holds at `rows`, summed by hand from the units:
 * kept units resident; in the backward every other unit rebuilt or
 * reloaded, with its recompute workspace (docs/runtime.md, "Beyond the
 * declared load"). */
static void hand_bytes(const kiln_unit_set *S, const uint8_t *act, double rows, double *resident,
                       double *transient)
{
	*resident = *transient = 0;
	for (int32_t u = 0; u < S->n_units; u++) {
		const kiln_unit *un = &S->units[u];
		double b = un->bytes.base + un->bytes.per_n * rows;
		if (act[u] == KILN_ACT_KEEP)
			*resident += b;
		else
			*transient +=
			    b + (act[u] == KILN_ACT_RECOMPUTE
			             ? un->workspace_bytes.base + un->workspace_bytes.per_n * rows
			             : 0);
	}
}

/* Whether act holds no more than full, resident or transient, at 65 row
 * counts from 0 to most. */
static bool holds_no_more(const kiln_unit_set *S, const uint8_t *act, const uint8_t *full,
                          double most)
{
	for (int32_t i = 0; i <= 64; i++) {
		double r = most * i / 64, fr, ft, xr, xt;
		hand_bytes(S, full, r, &fr, &ft);
		hand_bytes(S, act, r, &xr, &xt);
		if (xr > fr || xt > ft)
			return false;
	}
	return true;
}

static double exposed_at_last_bucket(const kiln_compilation *c, int32_t set, const uint8_t *act)
{
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	double e, serial;
	cr_assert_eq(kiln_interleave_exposed(c, kiln_plan_table_of(c, set, c->n_buckets - 1), act,
	                                     a, &e, &serial),
	             0);
	kiln_arena_free(a);
	return e;
}

/* The group's plan, by brute force over every plan of every table of its
 * set: it holds no more than full recompute's plan, resident or
 * transient, at any rows one rank can receive (sampled at 65 row counts
 * from 0 to the most: 16 ranks' tokens, each routed to at most min(top_k,
 * local experts) of a rank's experts), its record's bytes are its own, and
 * no plan that holds no more is cheaper at the last bucket (scheduled as
 * the simulator schedules a static plan). On tiny16 it is cheaper than full recompute
 * (0.003 ms against 0.027 ms at the last bucket, kilnc inspect), which is
 * what the heavy-tail table of docs/results.md measures. */
Test(group, group_plan_is_the_cheapest_that_never_holds_more_than_full_recompute, .timeout = 300)
{
	/* tiny16, the roomy tiny16, and tiny16 with 16 experts (1 a rank, fewer
	 * than top_k 2): the most rows one rank receives are 16 x 512 on the
	 * first two and 16 x 512 x min(2, 1) / 2 on the third. */
	const char *const experts[3] = {"experts: 32", "experts: 32", "experts: 16"};
	const char *const memory[3] = {"memory_gib: 0.01171875", "memory_gib: 0.015625",
	                               "memory_gib: 0.01171875"};
	const double most_rows[3] = {16 * 512, 16 * 512, 8 * 512};
	for (int v = 0; v < 3; v++) {
		fixture f;
		char *path = tiny16_path_edit(experts[v], memory[v]);
		setup_path(&f, path);
		unlink(path);
		free(path);
		int32_t cheaper = 0, moe = 0;
		for (int32_t k = 0; k < f.c.n_sets; k++) {
			const kiln_unit_set *set = &f.c.sets[k];
			kiln_blob_group g;
			memcpy(&g,
			       f.blob + section(f.blob, KILN_SEC_GROUPS).offset +
			           (size_t)k * sizeof g,
			       sizeof g);
			if (set->kind != KILN_LAYER_MOE) {
				cr_assert_eq(g.plan, UINT32_MAX);
				continue;
			}
			moe++;
			/* Balanced: 2 sequences of 128 tokens, top_k 2, so 512 rows a rank. */
			cr_assert_eq(f.c.graph->layers[set->layer].n_balanced, 512);
			double most = most_rows[v];
			const uint8_t *full =
			    f.c.pool->actions[f.c.baselines[KILN_BASELINE_FULL_RECOMPUTE].plan[k]];
			const uint8_t *mine = f.c.pool->actions[g.plan];
			/* The record's bytes are the plan's, summed by hand. */
			double r0, t0, r1, t1;
			hand_bytes(set, mine, 0, &r0, &t0);
			hand_bytes(set, mine, 1, &r1, &t1);
			cr_assert_eq((double)g.resident_base_bytes, r0);
			cr_assert_eq((double)g.resident_per_row_bytes, r1 - r0);
			cr_assert_eq((double)g.transient_base_bytes, t0);
			cr_assert_eq((double)g.transient_per_row_bytes, t1 - t0);
			cr_assert(holds_no_more(set, mine, full, most),
			          "set %d: the group's plan holds more than full recompute", k);
			double e_mine = exposed_at_last_bucket(&f.c, k, mine);
			double e_full = exposed_at_last_bucket(&f.c, k, full);
			cr_assert_leq(e_mine, e_full);
			cheaper += e_mine < e_full;
			for (int32_t b = 0; b < f.c.n_buckets; b++) {
				const kiln_plan_table *t = kiln_plan_table_of(&f.c, k, b);
				for (int32_t p = 0; p < t->n_points; p++) {
					const uint8_t *act = f.c.pool->actions[t->plan[p]];
					if (holds_no_more(set, act, full, most))
						cr_assert_geq(
						    exposed_at_last_bucket(&f.c, k, act), e_mine,
						    "set %d: bucket %d point %d is cheaper", k, b,
						    p);
				}
			}
		}
		cr_assert_gt(moe, 0);
		if (v == 0)
			cr_assert_eq(cheaper, moe, "on tiny16 every MoE set has a cheaper plan");
		teardown(&f);
	}
}

Test(group, bad_group_counts)
{
	fixture f;
	setup_tiny16(&f);
	uint32_t rows[2] = {UINT32_MAX, UINT32_MAX};
	kiln_query q = {.stage = 0, .layer = 1, .total_rows = 10, .free_bytes = 1 << 20};
	kiln_plan alone, p;
	cr_assert_eq(kiln_rt_select(f.rt, &q, &alone), 0);
	q.group_rows = rows;
	q.group_size = -1;
	cr_assert_eq(kiln_rt_select(f.rt, &q, &p), KILN_RT_EINVAL);
	q.group_size = (1 << 20) + 1;
	cr_assert_eq(kiln_rt_select(f.rt, &q, &p), KILN_RT_EINVAL);
	/* No array: no counts, whatever the size says. */
	q.group_rows = NULL;
	q.group_size = 2;
	cr_assert_eq(kiln_rt_select(f.rt, &q, &p), 0);
	cr_assert(memcmp(&alone, &p, sizeof p) == 0);
	/* A dense layer never falls back. */
	q = (kiln_query){
	    .stage = 0, .layer = 0, .free_bytes = 1 << 20, .group_rows = rows, .group_size = 2};
	cr_assert_eq(kiln_rt_select(f.rt, &q, &p), 0);
	cr_assert_eq(p.flags & KILN_PLAN_GROUP_FALLBACK, 0);
	teardown(&f);
}

/* ------------------------------------------------------------ the threshold */

/* One table point's bytes at `rows`, summed by hand from the public
 * per-unit figures (kiln_rt_unit_bytes) and each unit's recompute
 * workspace, which the blob does not carry (the compiler's unit set): a
 * kept unit is resident; a recomputed one is rebuilt in the backward beside
 * its workspace (transient); an offloaded one is reloaded (transient) and
 * may be in flight while the layer before runs its backward (offloaded).
 * As passes/budget.c counts a micro-batch: resident + the worst transient
 * + the worst offloaded. */
typedef struct pbytes {
	double res, tr, off;
} pbytes;

static pbytes point_bytes(const fixture *f, int32_t layer, int32_t bucket, int32_t i, uint64_t rows)
{
	kiln_rt_point pt;
	cr_assert_eq(kiln_rt_point_get(f->rt, layer, bucket, i, &pt), 0);
	const uint8_t *acts;
	int32_t n, tpl;
	cr_assert_eq(kiln_rt_plan_get(f->rt, pt.plan, &acts, &n, &tpl), 0);
	const kiln_unit_set *set = &f->c.sets[set_of(&f->c, layer)];
	cr_assert_eq(n, set->n_units);
	pbytes p = {0, 0, 0};
	for (int32_t u = 0; u < n; u++) {
		double b = (double)kiln_rt_unit_bytes(f->rt, layer, u, rows);
		if (acts[u] == KILN_RT_KEEP) {
			p.res += b;
		} else if (acts[u] == KILN_RT_RECOMPUTE) {
			p.tr += b + kiln_lin_at(set->units[u].workspace_bytes, (double)rows);
		} else {
			p.tr += b;
			p.off += b;
		}
	}
	return p;
}

/* The most bytes one micro-batch of `stage` can hold when each of its
 * layers takes any point of its table at the last bucket (what the
 * runtime chooses from past it), its MoE layers at `rows`: brute force
 * over every assignment of points to layers, fixed + sum of resident +
 * the worst transient + the worst offloaded. */
static double worst_by_brute_force(const fixture *f, int32_t stage, uint64_t rows)
{
	kiln_rt_info info;
	kiln_rt_info_get(f->rt, &info);
	kiln_rt_stage_info si;
	cr_assert_eq(kiln_rt_stage_get(f->rt, stage, &si), 0);
	int32_t last = info.n_buckets - 1, nl = 0, np[8];
	pbytes *pts[8];
	for (int32_t l = 0; l < info.n_model_layers; l++) {
		kiln_rt_layer_info li;
		cr_assert_eq(kiln_rt_layer_get(f->rt, l, &li), 0);
		if (li.stage != stage)
			continue;
		cr_assert_lt(nl, 8);
		kiln_rt_table_info ti;
		cr_assert_eq(kiln_rt_table_get(f->rt, l, last, &ti), 0);
		np[nl] = ti.n_points;
		pts[nl] = malloc(sizeof(pbytes) * (size_t)ti.n_points);
		cr_assert_not_null(pts[nl]);
		for (int32_t i = 0; i < ti.n_points; i++)
			pts[nl][i] = point_bytes(f, l, last, i, li.moe ? rows : 0);
		nl++;
	}
	int32_t cur[8] = {0};
	double worst = 0;
	for (;;) {
		double res = (double)si.fixed_bytes, tr = 0, off = 0;
		for (int32_t k = 0; k < nl; k++) {
			const pbytes *p = &pts[k][cur[k]];
			res += p->res;
			tr = p->tr > tr ? p->tr : tr;
			off = p->off > off ? p->off : off;
		}
		worst = res + tr + off > worst ? res + tr + off : worst;
		int32_t k = 0;
		while (k < nl && ++cur[k] == np[k])
			cur[k++] = 0;
		if (k == nl)
			break;
	}
	for (int32_t k = 0; k < nl; k++)
		free(pts[k]);
	return worst;
}

/* The threshold on the roomy tiny's stage 1 (4 MoE layers, 1 micro-batch
 * in flight, the last bucket at 3x = 1536 rows), by hand:
 *
 *   budget = capacity - static - (inflight - 1) * steady
 *          = (16 - 1) MiB - 4,040,496 = 15,728,640 - 4,040,496 = 11,688,144
 *   keep everything, one MoE layer: 6 units of 32,768 (ln1.in, attn.qkv_in,
 *     attn.out, ln2.in, moe.in, moe.probs) + attn.qkv 65,536 + attn.lse
 *     4,096 + 2 rstd of 1,024 = 268,288 bytes, and 8 + 128 + 4 + 512 + 256
 *     = 908 bytes per row (perm_idx, expert_in, expert_probs, expert_up,
 *     expert_act)
 *   fixed (the head's activations on the last stage) = 328,704
 *
 * Any choice of points holds at most fixed + 4 * keep(r) + X(r), with X the
 * largest recompute workspace plus offloaded bytes of one point (a layer
 * that saves rebuilds or reloads what it saved: its resident + transient is
 * keep + workspace, and its offloads can be in flight beside it; the other
 * layers keep everything), and keeping everything in the other three
 * layers attains it. Today the largest X is the point that offloads
 * attn.qkv, moe.expert_in, moe.expert_up and moe.expert_act (65,536 +
 * 896 r) and recomputes attn.qkv_in, moe.in and moe.probs (workspace
 * 32,768): X = 98,304 + 896 r. So
 *
 *   328,704 + 4 (268,288 + 908 r) + 98,304 + 896 r = 1,500,160 + 4,528 r
 *     <= 11,688,144  <=>  r <= 10,187,984 / 4,528 = 2,249.99
 *
 * and fit_rows = 2,249 (4.39x of the 512 balanced rows), past the last
 * bucket's 1,536. The test takes X's point from the table (the one with
 * the largest X at the threshold) and checks the closed form with its line;
 * the literal checks today's point. */
Test(group, fit_rows_by_hand_past_the_last_bucket, .timeout = 120)
{
	fixture f;
	setup_tiny16_roomy(&f);
	const int32_t layer = 4; /* stage 1's first MoE layer */
	kiln_rt_layer_info li;
	cr_assert_eq(kiln_rt_layer_get(f.rt, layer, &li), 0);
	cr_assert(li.moe && li.stage == 1);
	cr_assert_eq(li.balanced_rows, 512);
	kiln_rt_stage_info si;
	cr_assert_eq(kiln_rt_stage_get(f.rt, 1, &si), 0);
	cr_assert_eq(si.inflight, 1);
	cr_assert_eq(si.n_layers, 4);
	cr_assert_eq(si.capacity_bytes, 15728640);
	cr_assert_eq(si.budget_bytes, si.capacity_bytes - si.static_bytes);
	uint64_t kb = 0, kp = 0;
	for (int32_t u = 0; u < li.n_units; u++) {
		kiln_rt_unit_info ui;
		cr_assert_eq(kiln_rt_unit_get(f.rt, layer, u, &ui), 0);
		kb += ui.base_bytes;
		kp += ui.per_row_bytes;
	}
	cr_assert_eq(kb, 268288);
	cr_assert_eq(kp, 908);

	kiln_rt_info info;
	kiln_rt_info_get(f.rt, &info);
	int32_t last = info.n_buckets - 1;
	kiln_rt_table_info ti;
	cr_assert_eq(kiln_rt_table_get(f.rt, layer, last, &ti), 0);
	cr_assert_eq(ti.max_rows, 1536);
	/* X of point i at rows: what it holds beyond keeping everything. */
#define X_AT(i, r)                                                                                 \
	(point_bytes(&f, layer, last, (i), (r)).res + point_bytes(&f, layer, last, (i), (r)).tr +  \
	 point_bytes(&f, layer, last, (i), (r)).off - (double)(kb + kp * (r)))
	int32_t arg = 0;
	for (int32_t i = 1; i < ti.n_points; i++)
		if (X_AT(i, 2250) > X_AT(arg, 2250))
			arg = i;
	double x0 = X_AT(arg, 0), x1 = X_AT(arg, 1) - x0;
	for (int32_t i = 0; i < ti.n_points; i++)
		cr_assert_leq(X_AT(i, 2249), X_AT(arg, 2249),
		              "one point has the largest X at both");
#undef X_AT
	double hand =
	    floor(((double)si.budget_bytes - (double)si.fixed_bytes - 4.0 * (double)kb - x0) /
	          (4.0 * (double)kp + x1));
	kiln_rt_group_info gi;
	cr_assert_eq(kiln_rt_group_get(f.rt, layer, &gi), 0);
	cr_assert_eq((double)gi.fit_rows, hand, "fit_rows %" PRIu64 ", by hand %.0f", gi.fit_rows,
	             hand);
	cr_assert_eq(si.fixed_bytes, 328704);
	cr_assert_eq(si.budget_bytes, 11688144);
	cr_assert_eq(x0, 98304, "today's worst point (the comment's hand calculation)");
	cr_assert_eq(x1, 896);
	cr_assert_eq(gi.fit_rows, 2249);
	teardown(&f);
}

/* On every stage of tiny16 and of the roomy tiny: at fit_rows every
 * choice of the last bucket's points fits the stage's budget, and one row
 * more some choice does not (where the threshold lies past the last
 * bucket), or the threshold is the tables' own (where it does not), by
 * brute force over every assignment of points to the stage's layers. */
Test(group, fit_rows_is_where_some_choice_stops_fitting_brute_force, .timeout = 300)
{
	int past = 0;
	for (int roomy = 0; roomy < 2; roomy++) {
		fixture f;
		if (roomy)
			setup_tiny16_roomy(&f);
		else
			setup_tiny16(&f);
		kiln_rt_info info;
		kiln_rt_info_get(f.rt, &info);
		for (int32_t s = 0; s < info.n_stages; s++) {
			int32_t layer = -1;
			for (int32_t l = 0; l < info.n_model_layers && layer < 0; l++) {
				kiln_rt_layer_info li;
				cr_assert_eq(kiln_rt_layer_get(f.rt, l, &li), 0);
				if (li.stage == s && li.moe)
					layer = l;
			}
			cr_assert_geq(layer, 0);
			kiln_rt_stage_info si;
			cr_assert_eq(kiln_rt_stage_get(f.rt, s, &si), 0);
			/* The budget is what the others at their steady plan leave
			 * (the blob rounds each figure to a byte). */
			double want = (double)si.capacity_bytes - (double)si.static_bytes -
			              (si.inflight - 1) * (double)si.steady_bytes;
			cr_assert_leq(fabs((double)si.budget_bytes - want), si.inflight + 1);
			kiln_rt_group_info gi;
			cr_assert_eq(kiln_rt_group_get(f.rt, layer, &gi), 0);
			uint64_t tables = tables_fit(f.rt, layer);
			cr_assert_geq(gi.fit_rows, tables);
			double beyond = worst_by_brute_force(&f, s, gi.fit_rows + 1);
			cr_assert_gt(beyond, (double)si.budget_bytes,
			             "stage %d: one row past %" PRIu64 " some choice does not fit",
			             s, gi.fit_rows);
			if (gi.fit_rows > tables) {
				past++;
				cr_assert_leq(worst_by_brute_force(&f, s, gi.fit_rows),
				              (double)si.budget_bytes,
				              "stage %d: at %" PRIu64 " rows every choice fits", s,
				              gi.fit_rows);
			}
		}
		teardown(&f);
	}
	cr_assert_eq(past, 2, "the roomy tiny's two stages are past the last bucket");
}

/* ------------------------------------------------------------ the section */

/* Each field of a GROUPS record set out of range, the CRC rewritten: the
 * loader refuses every one (and the blob fuzzer's corpus starts from such
 * blobs). */
Test(group, out_of_range_records_are_refused)
{
	fixture f;
	setup_tiny16(&f);
	kiln_blob_section gs = section(f.blob, KILN_SEC_GROUPS);
	cr_assert_eq(gs.count, (uint64_t)f.c.n_sets);
	int32_t moe = -1, dense = -1;
	for (int32_t k = 0; k < f.c.n_sets; k++) {
		if (f.c.sets[k].kind == KILN_LAYER_MOE && moe < 0)
			moe = k;
		if (f.c.sets[k].kind != KILN_LAYER_MOE && dense < 0)
			dense = k;
	}
	cr_assert(moe >= 0 && dense >= 0);
	for (int mut = 0; mut < 14; mut++) {
		unsigned char *b = malloc(f.len);
		memcpy(b, f.blob, f.len);
		kiln_blob_group *m = (kiln_blob_group *)(b + gs.offset) + moe;
		kiln_blob_group *d = (kiln_blob_group *)(b + gs.offset) + dense;
		const char *what = "";
		switch (mut) {
		case 0:
			m->set += 1, what = "set";
			break;
		case 1:
			m->plan = (uint32_t)f.c.pool->n, what = "plan past the pool";
			break;
		case 2:
			d->plan = m->plan, what = "a plan on a dense set";
			break;
		case 3:
			d->fit_rows = 1, what = "a dense record's field";
			break;
		case 4:
			m->fit_rows = (uint64_t)UINT32_MAX + 1, what = "fit_rows past any count";
			break;
		case 5:
			m->resident_base_bytes += 1, what = "resident base";
			break;
		case 6:
			m->resident_per_row_bytes += 1, what = "resident per row";
			break;
		case 7:
			m->saved_base_bytes += 1, what = "saved base";
			break;
		case 8:
			m->saved_per_row_bytes += 1, what = "saved per row";
			break;
		case 9:
			m->transient_base_bytes = m->saved_base_bytes - 1,
			what = "transient below saved";
			break;
		case 10:
			m->exposed_base_us = NAN, what = "exposed NaN";
			break;
		case 11:
			m->exposed_per_row_us = -1, what = "exposed negative";
			break;
		case 12: {
			/* The plan of another set kind (the dense set's first table point). */
			kiln_blob_table t;
			memcpy(&t,
			       b + section(b, KILN_SEC_TABLES).offset +
			           (size_t)dense * f.c.n_buckets * sizeof t,
			       sizeof t);
			kiln_blob_point p;
			memcpy(&p,
			       b + section(b, KILN_SEC_POINTS).offset +
			           (size_t)t.first_point * sizeof p,
			       sizeof p);
			m->plan = p.plan, what = "a plan over other units";
			break;
		}
		case 13: {
			/* One record short: the count no longer matches the sets. */
			kiln_blob_section s = gs;
			s.count -= 1;
			memcpy(b + sizeof(kiln_blob_header) + KILN_SEC_GROUPS * sizeof s, &s,
			       sizeof s);
			memset(b + s.offset + s.count * sizeof(kiln_blob_group), 0,
			       sizeof(kiln_blob_group));
			what = "a record short";
			break;
		}
		}
		fix_crc(b, f.len);
		kiln_rt *rt = (kiln_rt *)1;
		int rc = kiln_rt_open(b, f.len, &rt);
		cr_assert_eq(rc, KILN_RT_ECORRUPT, "%s: %s", what, kiln_rt_strerror(rc));
		cr_assert_null(rt);
		free(b);
	}
	teardown(&f);
}

/* A 1.0 blob (the same bytes without GROUPS) still opens, and with group
 * counts it decides exactly as without them. */
Test(group, a_1_0_blob_opens_and_ignores_the_counts)
{
	fixture f;
	setup_tiny16(&f);
	size_t len;
	unsigned char *b = as_1_0(&f, &len);
	kiln_rt *rt = NULL;
	cr_assert_eq(kiln_rt_open(b, len, &rt), 0);
	kiln_rt_info info;
	kiln_rt_info_get(rt, &info);
	cr_assert_eq(info.minor, 0);
	uint32_t rows[3] = {UINT32_MAX, 0, 5};
	kiln_query q = {.stage = 0, .layer = 1, .total_rows = 10, .free_bytes = 1 << 20};
	kiln_plan alone, with;
	cr_assert_eq(kiln_rt_select(rt, &q, &alone), 0);
	q.group_rows = rows;
	q.group_size = 3;
	cr_assert_eq(kiln_rt_select(rt, &q, &with), 0);
	cr_assert_eq(with.flags & KILN_PLAN_GROUP_FALLBACK, 0);
	with.group_max_rows = 0;
	cr_assert(memcmp(&alone, &with, sizeof alone) == 0);
	kiln_rt_close(rt);
	free(b);
	teardown(&f);
}

/* The max_rows of set k's last bucket in blob b (f's layout). */
static uint64_t last_max_rows(const fixture *f, const unsigned char *b, int32_t k)
{
	kiln_blob_bucket t;
	memcpy(&t,
	       b + section(b, KILN_SEC_BUCKETS).offset +
	           ((size_t)k * f->c.n_buckets + f->c.n_buckets - 1) * sizeof t,
	       sizeof t);
	return t.max_rows;
}

/* The roomy fixture's blob labelled 1.1 (the same sections and layout):
 * 1.1 checked fit_rows against the set's last bucket's max_rows, so with
 * fit_rows past it (2,249 rows on stage 1's sets against 1,536,
 * fit_rows_by_hand_past_the_last_bucket) the 1.1 blob is corrupt, and with
 * those records' fit_rows set to the last bucket's max_rows it opens and
 * reports minor 1. The blob as written (1.2) opens. */
Test(group, a_1_1_blob_keeps_its_fit_rows_check, .timeout = 120)
{
	fixture f;
	setup_tiny16_roomy(&f);
	kiln_rt_info info;
	kiln_rt_info_get(f.rt, &info);
	cr_assert_eq(info.minor, 2);
	kiln_blob_section gs = section(f.blob, KILN_SEC_GROUPS);
	unsigned char *b = malloc(f.len);
	cr_assert_not_null(b);
	memcpy(b, f.blob, f.len);
	kiln_blob_header h;
	memcpy(&h, b, sizeof h);
	h.minor = 1;
	memcpy(b, &h, sizeof h);
	int past = 0;
	for (int32_t k = 0; k < f.c.n_sets; k++) {
		kiln_blob_group *g = (kiln_blob_group *)(b + gs.offset) + k;
		past += g->plan != KILN_BLOB_NONE && g->fit_rows > last_max_rows(&f, b, k);
	}
	cr_assert_gt(past, 0, "no record past its last bucket: the test shows nothing");
	fix_crc(b, f.len);
	kiln_rt *rt = (kiln_rt *)1;
	cr_assert_eq(kiln_rt_open(b, f.len, &rt), KILN_RT_ECORRUPT);
	cr_assert_null(rt);
	for (int32_t k = 0; k < f.c.n_sets; k++) {
		kiln_blob_group *g = (kiln_blob_group *)(b + gs.offset) + k;
		if (g->plan != KILN_BLOB_NONE && g->fit_rows > last_max_rows(&f, b, k))
			g->fit_rows = last_max_rows(&f, b, k);
	}
	fix_crc(b, f.len);
	cr_assert_eq(kiln_rt_open(b, f.len, &rt), 0);
	kiln_rt_info_get(rt, &info);
	cr_assert_eq(info.minor, 1);
	kiln_rt_close(rt);
	free(b);
	teardown(&f);
}

/* kiln_rt_group_get and `kilnc inspect` show each layer's GROUPS record as
 * the blob holds it: the expected values are the raw records, read from the
 * section table by hand; a 1.0 blob's layers and a dense layer have none. */
Test(group, the_getter_and_inspect_show_the_records)
{
	fixture f;
	setup_tiny16(&f);
	kiln_blob_section gs = section(f.blob, KILN_SEC_GROUPS);
	int32_t moe_layer = -1;
	for (int32_t l = 0; l < (int32_t)f.c.model->layers; l++) {
		int32_t k = set_of(&f.c, l);
		cr_assert_geq(k, 0);
		kiln_blob_group g;
		memcpy(&g, f.blob + gs.offset + (size_t)k * sizeof g, sizeof g);
		kiln_rt_group_info gi;
		cr_assert_eq(kiln_rt_group_get(f.rt, l, &gi), 0);
		if (g.plan == UINT32_MAX) {
			cr_assert_eq(f.c.sets[k].kind, KILN_LAYER_DENSE, "layer %d", l);
			cr_assert_eq(gi.plan, -1);
			cr_assert_eq(gi.fit_rows, 0);
			cr_assert_eq(gi.resident_base_bytes, 0);
			continue;
		}
		moe_layer = moe_layer < 0 ? l : moe_layer;
		cr_assert_eq(gi.plan, (int32_t)g.plan, "layer %d", l);
		cr_assert_eq(gi.fit_rows, g.fit_rows);
		cr_assert_eq(gi.resident_base_bytes, g.resident_base_bytes);
		cr_assert_eq(gi.resident_per_row_bytes, g.resident_per_row_bytes);
		cr_assert_eq(gi.saved_base_bytes, g.saved_base_bytes);
		cr_assert_eq(gi.saved_per_row_bytes, g.saved_per_row_bytes);
		cr_assert_eq(gi.transient_base_bytes, g.transient_base_bytes);
		cr_assert_eq(gi.transient_per_row_bytes, g.transient_per_row_bytes);
		cr_assert_eq(gi.exposed_base_us, g.exposed_base_us);
		cr_assert_eq(gi.exposed_per_row_us, g.exposed_per_row_us);
	}
	cr_assert_geq(moe_layer, 0, "tiny has MoE layers");
	kiln_rt_group_info gi;
	cr_assert_eq(kiln_rt_group_get(f.rt, (int32_t)f.c.model->layers, &gi), KILN_RT_ERANGE);
	cr_assert_eq(kiln_rt_group_get(f.rt, 0, NULL), KILN_RT_EINVAL);
	cr_assert_eq(kiln_rt_group_get(NULL, 0, &gi), KILN_RT_EINVAL);

	/* inspect --json: the first MoE kind's record, by its first layer. */
	char *path = kt_temp_file(".kiln", f.blob, f.len);
	kt_run r = kt_kilnc((const char *const[]){"inspect", path, "--json", NULL}, NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kiln_json *doc = kiln_json_parse(r.out, r.out_len);
	cr_assert_not_null(doc);
	const kiln_json *kinds = kiln_json_get(doc, "layer_kinds");
	int found = 0;
	for (int i = 0; i < kiln_json_size(kinds); i++) {
		const kiln_json *o = kiln_json_at(kinds, i);
		const kiln_json *gf = kiln_json_get(o, "group_fallback");
		int32_t first = (int32_t)kiln_json_number(kiln_json_get(o, "first_layer"));
		kiln_blob_group g;
		memcpy(&g, f.blob + gs.offset + (size_t)set_of(&f.c, first) * sizeof g, sizeof g);
		if (g.plan == UINT32_MAX) {
			cr_assert(kiln_json_is_null(gf), "layer %d: a dense kind has null", first);
			continue;
		}
		found++;
		cr_assert_eq(kiln_json_number(kiln_json_get(gf, "plan")), (double)g.plan);
		cr_assert_eq(kiln_json_number(kiln_json_get(gf, "fit_rows")), (double)g.fit_rows);
		cr_assert_eq(kiln_json_number(kiln_json_get(gf, "transient_per_row_bytes")),
		             (double)g.transient_per_row_bytes);
		cr_assert_eq(kiln_json_number(kiln_json_get(gf, "exposed_base_us")),
		             g.exposed_base_us);
	}
	cr_assert_gt(found, 0);
	kiln_json_free(doc);
	kt_run_free(&r);
	r = kt_kilnc((const char *const[]){"inspect", path, NULL}, NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_eq(kiln_rt_group_get(f.rt, moe_layer, &gi), 0);
	char want[128];
	snprintf(want, sizeof want, "when a rank of the EP group has more than %" PRIu64 " rows",
	         gi.fit_rows);
	cr_assert_not_null(strstr(r.out, want), "%s", r.out);
	cr_assert_not_null(strstr(r.out, "group fallback: none (a dense layer has no rows)"));
	kt_run_free(&r);
	unlink(path);
	free(path);

	size_t len;
	unsigned char *b = as_1_0(&f, &len);
	kiln_rt *rt = NULL;
	cr_assert_eq(kiln_rt_open(b, len, &rt), 0);
	cr_assert_eq(kiln_rt_group_get(rt, moe_layer, &gi), 0);
	cr_assert_eq(gi.plan, -1, "a 1.0 blob has no fallback");
	cr_assert_eq(gi.fit_rows, 0);
	kiln_rt_close(rt);
	path = kt_temp_file(".kiln", b, len);
	r = kt_kilnc((const char *const[]){"inspect", path, NULL}, NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "group fallback: none (a 1.0 blob has no GROUPS)"), "%s",
	                   r.out);
	kt_run_free(&r);
	unlink(path);
	free(path);
	free(b);
	teardown(&f);
}

/* ------------------------------------------------------------ the simulator */

static void simulate(fixture *f, const char *loads, int no_counts, kiln_sim_result *out)
{
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse(loads, f->c.model->max_factor, f->a, stderr, &prof), 0);
	kiln_sim_config cfg = {.c = &f->c,
	                       .rt = f->rt,
	                       .loads = prof,
	                       .iterations = 8,
	                       .seed = 1,
	                       .restart_s = 284,
	                       .checkpoint_every = 100,
	                       .exact = 1,
	                       .threads = 1,
	                       .no_group_counts = no_counts};
	kiln_sim_policy_kind two[] = {KILN_SIM_KILN, KILN_SIM_FULL_RECOMPUTE};
	cr_assert_eq(kiln_sim_run(&cfg, two, 2, f->a, stderr, out), 0);
}

/* examples/traces/heavy-tail.csv: one rank of 16 at 4x to 11x in every
 * micro-batch (load.max_factor 3). Full recompute has no failure; kiln
 * without the group's counts fails (its adaptive plans cannot re-run the
 * layer's collectives), with them it has none either. */
Test(group, heavy_tail_survives_with_the_group_counts, .timeout = 300)
{
	fixture f;
	setup_tiny16(&f);
	const char *trace = kt_src("examples/traces/heavy-tail.csv");
	char path[4096];
	snprintf(path, sizeof path, "%s", trace);
	kiln_sim_result with[2], without[2];
	simulate(&f, path, 0, with);
	simulate(&f, path, 1, without);
	cr_assert_eq(with[1].ooms, 0, "full recompute survives the trace");
	cr_assert_eq(without[1].ooms, 0);
	cr_assert_gt(without[0].ooms, 0, "kiln without the counts fails (measured)");
	cr_assert_eq(with[0].ooms, 0, "kiln with the group fallback has no failure");
	teardown(&f);
}

/* A factor trace for the roomy tiny (16 EP ranks, 512 balanced rows): in
 * each of 2 iterations x 4 micro-batches one rank, a different one in
 * each micro-batch, receives at every MoE layer the layer's fit_rows plus
 * `extra` rows (a multiple of 1/512 is exact in binary, so the simulator's
 * rows are exactly those), the others share the rest. Returns its path
 * (caller unlinks and frees). */
static char *threshold_trace(const fixture *f, uint64_t extra)
{
	size_t cap = 1 << 16, len = 0;
	char *text = malloc(cap);
	cr_assert_not_null(text);
	len += (size_t)snprintf(text + len, cap - len, "iteration,microbatch,layer,rank,factor\n");
	for (int32_t it = 0; it < 2; it++)
		for (int32_t mb = 0; mb < 4; mb++) {
			int32_t hot = (4 * it + mb) % 16, k = 0;
			for (int32_t l = 0; l < (int32_t)f->c.model->layers; l++) {
				kiln_rt_layer_info li;
				kiln_rt_group_info gi;
				cr_assert_eq(kiln_rt_layer_get(f->rt, l, &li), 0);
				if (!li.moe)
					continue;
				cr_assert_eq(kiln_rt_group_get(f->rt, l, &gi), 0);
				double hf = (double)(gi.fit_rows + extra) / 512.0,
				       rest = (16 - hf) / 15;
				for (int32_t r = 0; r < 16; r++) {
					cr_assert_lt(len + 128, cap);
					len += (size_t)snprintf(text + len, cap - len,
					                        "%d,%d,%d,%d,%.17g\n", it, mb, k, r,
					                        r == hot ? hf : rest);
				}
				k++;
			}
		}
	char *path = kt_temp_file(".csv", text, len);
	free(text);
	return path;
}

/* In the simulator, on the roomy tiny (its thresholds past the last
 * bucket): a rank at exactly fit_rows keeps the adaptive plans (with the
 * group's counts kiln runs to the bit as without them, with no failure),
 * a rank one row past it makes the group take the group's plan (kiln with
 * the counts then pays exposed time that kiln without them, adaptive
 * there, does not). */
Test(group, one_row_past_the_threshold_falls_back_at_it_does_not, .timeout = 300)
{
	fixture f;
	setup_tiny16_roomy(&f);
	kiln_sim_result with[2], without[2];
	char *at = threshold_trace(&f, 0);
	simulate(&f, at, 0, with);
	simulate(&f, at, 1, without);
	cr_assert_eq(with[0].ooms, 0, "at the threshold the adaptive plans fit");
	cr_assert_eq(with[0].tokens_per_s, without[0].tokens_per_s);
	cr_assert_eq(with[0].recompute_s, without[0].recompute_s);
	cr_assert_eq(with[0].over_budget, without[0].over_budget);
	for (int32_t st = 0; st < f.c.graph->n_stages; st++)
		cr_assert_eq(with[0].peak_bytes[st], without[0].peak_bytes[st]);
	unlink(at);
	free(at);

	char *past = threshold_trace(&f, 1);
	simulate(&f, past, 0, with);
	simulate(&f, past, 1, without);
	cr_assert_eq(with[0].ooms, 0);
	cr_assert_gt(with[0].recompute_s + with[0].copy_s,
	             without[0].recompute_s + without[0].copy_s,
	             "one row past the threshold the group takes the group's plan");
	cr_assert_lt(with[0].tokens_per_s, without[0].tokens_per_s);
	unlink(past);
	free(past);
	teardown(&f);
}

/* Where no rank goes past the threshold (tiny under paper: spikes to 2.6x,
 * max_factor 3) the counts never trigger the group's plan, and step 8
 * (docs/runtime.md, "The group's slowest rank") only lets a rank that is
 * not the group's slowest save more within the exposed time the group
 * already pays: no failure, no decision over budget that the rule without
 * counts does not make, and no throughput lost. */
Test(group, counts_cost_nothing_within_the_declared_load, .timeout = 300)
{
	fixture f;
	setup_path(&f, kt_src("examples/models/tiny.yaml"));
	kiln_sim_result with[2], without[2];
	simulate(&f, "paper", 0, with);
	simulate(&f, "paper", 1, without);
	cr_assert_geq(with[0].tokens_per_s, without[0].tokens_per_s);
	cr_assert_eq(with[0].ooms, 0);
	cr_assert_eq(without[0].ooms, 0);
	cr_assert_leq(with[0].over_budget, without[0].over_budget);
	teardown(&f);
}
