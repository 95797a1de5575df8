/* tests/test_passes.c: passes/pipeline.c's pass table and passes/verify.c,
 * the plan-table verifier run between passes.
 *
 * The verifier passes on every shipped model (the compilations below run
 * it after every pass, and once more directly); each of its checks fails on
 * a table corrupted by hand in one place, with the message naming what is
 * wrong. The corruptions are made on llama3-8b-dense, the quickest shipped
 * model to compile whole (its units: 0 ln1.in is the layer's input, 3
 * attn.qkv re-runs a TP collective when recomputed; --dump-after
 * activations lists them).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_test.h"
#include "passes/passes.h"

/* kiln_plan_verify's verdict on c and its messages (caller frees). */
static int verify(const kiln_compilation *c, char **out)
{
	size_t len = 0;
	FILE *f = open_memstream(out, &len);
	cr_assert_not_null(f);
	int rc = kiln_plan_verify(c, f);
	fclose(f);
	return rc;
}

static void expect_failure(const kiln_compilation *c, const char *needle)
{
	char *msg = NULL;
	cr_assert_eq(verify(c, &msg), -1, "the corruption went unseen (want '%s')", needle);
	cr_assert(strstr(msg, needle) != NULL, "want '%s' in:\n%s", needle, msg);
	free(msg);
}

static kiln_compilation llama(kiln_arena **a)
{
	kiln_compilation c = kt_compile("examples/models/llama3-8b-dense.yaml", KILN_SOLVER_DP, a);
	char *msg = NULL;
	cr_assert_eq(verify(&c, &msg), 0, "%s", msg);
	free(msg);
	return c;
}

/* The first table (set-major) with at least n points. */
static kiln_plan_table *table_with(kiln_compilation *c, int32_t n)
{
	for (int32_t i = 0; i < c->n_sets * c->n_buckets; i++)
		if (c->tables[i].n_points >= n)
			return &c->tables[i];
	cr_assert_fail("no table with %d points", n);
	return NULL;
}

/* ---------------------------------------------------------------- the table */

/* The order docs/passes.md gives, and every part read is made earlier. */
Test(pass_table, the_pipeline_is_the_documented_order)
{
	static const char *const names[] = {"lower",      "activations", "plan",
	                                    "interleave", "budget",      "baselines"};
	const kiln_pass_info *rows[8];
	size_t n = kiln_pipeline_pass_count();
	cr_assert_eq(n, 6);
	for (size_t i = 0; i < n; i++) {
		rows[i] = kiln_pipeline_pass(i);
		cr_assert_str_eq(rows[i]->name, names[i]);
		cr_assert_str_eq(kiln_pipeline_pass_name(i), names[i]);
		cr_assert(rows[i]->does && rows[i]->does[0]);
		cr_assert_eq(rows[i]->creates & rows[i]->updates, 0u, "%s", names[i]);
	}
	cr_assert_null(kiln_pipeline_pass(n));
	cr_assert_eq(kiln_pipeline_order_check(rows, n, NULL), 0);
	/* The plan tables come from plan; interleave and budget then rewrite
	 * what others made, in place, as the table says. */
	cr_assert_eq(rows[2]->creates, KILN_PART_BUCKETS | KILN_PART_TABLES | KILN_PART_POOL);
	cr_assert(rows[3]->updates & KILN_PART_TABLES);
	cr_assert(rows[4]->updates & KILN_PART_SCHEDULE);
	cr_assert(rows[5]->updates & KILN_PART_POOL);
}

Test(pass_table, an_order_that_reads_before_it_creates_is_refused)
{
	const kiln_pass_info *rows[6];
	for (size_t i = 0; i < 6; i++)
		rows[i] = kiln_pipeline_pass(i);
	/* interleave before plan: the tables it updates do not exist yet. */
	const kiln_pass_info *swapped[6] = {rows[0], rows[1], rows[3], rows[2], rows[4], rows[5]};
	char *msg = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&msg, &len);
	cr_assert_eq(kiln_pipeline_order_check(swapped, 6, f), -1);
	fclose(f);
	cr_assert(strstr(msg, "pass interleave reads buckets, which no earlier pass creates"), "%s",
	          msg);
	cr_assert(strstr(msg, "pass interleave reads tables"), "%s", msg);
	free(msg);
	/* lower twice: the graph would be made twice. */
	const kiln_pass_info *twice[3] = {rows[0], rows[0], rows[1]};
	f = open_memstream(&msg, &len);
	cr_assert_eq(kiln_pipeline_order_check(twice, 3, f), -1);
	fclose(f);
	cr_assert(strstr(msg, "pass lower creates graph, which exists"), "%s", msg);
	free(msg);
}

/* ---------------------------------------------------------------- shipped models */

static void shipped_pass(const char *rel)
{
	kiln_arena *a;
	kiln_compilation c = kt_compile(rel, KILN_SOLVER_DP, &a);
	char *msg = NULL;
	cr_assert_eq(verify(&c, &msg), 0, "%s: %s", rel, msg);
	free(msg);
	kiln_arena_free(a);
}

Test(plan_verify, llama_and_tiny_pass)
{
	shipped_pass("examples/models/llama3-8b-dense.yaml");
	shipped_pass("examples/models/tiny.yaml");
}

Test(plan_verify, every_shipped_model_passes, .init = kt_slow, .timeout = 600)
{
	for (int i = 0; i < KT_N_SHIPPED; i++)
		shipped_pass(kt_shipped[i]);
}

/* ---------------------------------------------------------------- corruptions */

Test(plan_verify, frontier_savings_that_do_not_ascend)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_plan_table *t = table_with(&c, 3);
	kiln_plan_point *p = (kiln_plan_point *)t->frontier->points;
	p[2].saved_q = p[1].saved_q;
	expect_failure(&c, "savings must ascend");
	kiln_arena_free(a);
}

Test(plan_verify, scheduled_cost_that_descends)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_plan_table *t = table_with(&c, 3);
	cr_assert_not_null(t->exposed_us);
	t->exposed_us[2] = t->exposed_us[1] - 1.0;
	expect_failure(&c, "point 2: scheduled at");
	kiln_arena_free(a);
}

Test(plan_verify, table_savings_that_do_not_ascend)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_plan_table *t = table_with(&c, 3);
	t->bytes[2].saved = t->bytes[1].saved;
	expect_failure(&c, "no more than point 1's");
	kiln_arena_free(a);
}

Test(plan_verify, table_points_out_of_order)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_plan_table *t = table_with(&c, 3);
	t->point[2] = t->point[1];
	expect_failure(&c, "out of order");
	kiln_arena_free(a);
}

Test(plan_verify, an_action_that_is_none)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_plan_table *t = table_with(&c, 2);
	c.pool->actions[t->plan[1]][1] = 3;
	expect_failure(&c, "has action 3, not a kiln_action");
	kiln_arena_free(a);
}

Test(plan_verify, the_layer_input_recomputed)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_plan_table *t = table_with(&c, 2);
	const kiln_unit_set *set = t->set;
	cr_assert(set->units[0].flags & KILN_UNIT_LAYER_INPUT);
	c.pool->actions[t->plan[1]][0] = KILN_ACT_RECOMPUTE;
	expect_failure(&c, "recomputes ln1.in, the layer's input");
	kiln_arena_free(a);
}

/* Adaptive plans may not re-run a collective (every rank would have to
 * decide alike); static baselines may. The keep-all point's plan with
 * attn.qkv recomputed (its source attn.qkv_in kept: source tracking is
 * satisfied) is refused in a table only. */
Test(plan_verify, a_collective_recomputed_in_an_adaptive_table)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_plan_table *t = table_with(&c, 1);
	cr_assert_str_eq(t->set->units[3].name, "attn.qkv");
	cr_assert(t->set->units[3].flags & KILN_UNIT_COLLECTIVE);
	c.pool->actions[t->plan[0]][3] = KILN_ACT_RECOMPUTE;
	expect_failure(&c, "recomputes attn.qkv, which re-runs a collective, in an adaptive table");
	kiln_arena_free(a);
}

Test(plan_verify, a_table_point_with_another_points_plan)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_plan_table *t = table_with(&c, 3);
	t->plan[1] = t->plan[2];
	expect_failure(&c, "point 1: plan");
	expect_failure(&c, "is not the actions of its frontier point");
	kiln_arena_free(a);
}

Test(plan_verify, a_plan_outside_the_pool)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_plan_table *t = table_with(&c, 2);
	t->plan[1] = c.pool->n;
	expect_failure(&c, "is not in the pool");
	kiln_arena_free(a);
}

Test(plan_verify, a_baseline_plan_outside_the_pool)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	c.baselines[KILN_BASELINE_FULL_RECOMPUTE].plan[0] = -5;
	expect_failure(&c, "baseline full-recompute");
	kiln_arena_free(a);
}

/* A template with an offload given the keep-everything plan: its copies
 * belong to no action of that plan. */
Test(plan_verify, a_template_that_does_not_match_its_plan)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_plan_schedule *sc = c.schedule;
	int32_t id = -1;
	for (int32_t i = 0; i < sc->n_templates && id < 0; i++)
		for (int32_t k = 0; k < sc->templates[i].n_tasks; k++)
			if (sc->templates[i].tasks[k].kind == KILN_TASK_COPY)
				id = i;
	cr_assert_geq(id, 0, "no template offloads");
	kiln_template *tpl = &sc->templates[id];
	const kiln_unit_set *set = c.pool->set[tpl->plan];
	int32_t keep = -1;
	for (int32_t p = 0; p < c.pool->n && keep < 0; p++) {
		bool all = c.pool->set[p]->kind == set->kind;
		for (int32_t u = 0; all && u < c.pool->set[p]->n_units; u++)
			all = c.pool->actions[p][u] == KILN_ACT_KEEP;
		if (all)
			keep = p;
	}
	cr_assert_geq(keep, 0);
	tpl->plan = keep;
	expect_failure(&c, "is to keep, but the template has 1 offloads, 1 reloads");
	kiln_arena_free(a);
}

/* Two tasks of one stream at once. */
Test(plan_verify, a_template_that_is_no_schedule)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_template *tpl = &c.schedule->templates[0];
	int32_t i = -1, j = -1;
	for (int32_t x = 0; x < tpl->n_tasks && j < 0; x++)
		for (int32_t y = x + 1; y < tpl->n_tasks && j < 0; y++)
			if (tpl->tasks[x].stream == tpl->tasks[y].stream &&
			    tpl->tasks[y].duration_us > 0) {
				i = x;
				j = y;
			}
	cr_assert_geq(j, 0);
	tpl->tasks[i].end_us = tpl->tasks[j].start_us + tpl->tasks[j].duration_us;
	expect_failure(&c, "not a valid schedule");
	kiln_arena_free(a);
}

Test(plan_verify, a_timeline_naming_another_stages_template)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	kiln_stage_timeline *tl = &c.schedule->stages[0];
	cr_assert_gt(tl->n_layers, 0);
	tl->template_id[0] = c.schedule->n_templates;
	expect_failure(&c, "is not one of the stage's");
	kiln_arena_free(a);
}

Test(plan_verify, timelines_out_of_stage_order_or_missing)
{
	kiln_arena *a;
	kiln_compilation c = llama(&a);
	cr_assert_gt(c.schedule->n_stages, 1);
	c.schedule->stages[1].stage = 0; /* stage 0 twice */
	expect_failure(&c, "timeline 1 is stage 0's (one per stage, in stage order)");
	c.schedule->stages[1].stage = 1;
	c.schedule->n_stages--;
	expect_failure(&c, "timelines for");
	kiln_arena_free(a);
}
