/* passes/baselines.c: what peers do, as static plans the simulator can run
 * side by side with kiln (docs/cost-model.md, "Baselines").
 *
 * A baseline is one action per unit, the same at every load, chosen before
 * the run. Static plans may recompute through collectives: every rank
 * recomputes alike, so the collective is re-run by the whole group.
 *
 * The tuned baselines are tuned for KILN_BASELINE_DESIGN_LOAD, the calm
 * imbalance a team sees on its most loaded device (the paper profile keeps
 * 97.1% of iterations below 1.2x), not for a perfectly balanced 1.0 that
 * no real run has: a plan that fits only at 1.0 would fail at every
 * iteration, which no team would keep.
 */
#include <string.h>

#include "passes/passes.h"

static const struct {
	const char *name;
	const char *models;
	double design_load;
} info[KILN_BASELINE_COUNT] = {
    [KILN_BASELINE_FULL_RECOMPUTE] = {"full-recompute",
                                      "Megatron-LM --recompute-granularity full "
                                      "--recompute-method uniform --recompute-num-layers 1",
                                      KILN_BASELINE_DESIGN_LOAD},
    [KILN_BASELINE_MEGATRON_SELECTIVE] = {"megatron-selective",
                                          "Megatron-Core --recompute-granularity selective "
                                          "--recompute-modules (layernorm, moe_act, core_attn, "
                                          "mla_up_proj, shared_experts: the shortest prefix "
                                          "that fits at load 1.2), then "
                                          "--fine-grained-activation-offloading "
                                          "--offload-modules expert_fc1; "
                                          "--recompute-granularity full when none fits",
                                          KILN_BASELINE_DESIGN_LOAD},
    [KILN_BASELINE_STATIC_AGGRESSIVE] = {"static-aggressive",
                                         "keep nearly everything: Megatron-Core "
                                         "--recompute-modules layernorm only",
                                         1.0},
    [KILN_BASELINE_ADAPIPE] = {"adapipe",
                               "AdaPipe (Sun et al., ASPLOS 2024): per-stage recompute "
                               "chosen offline by dynamic programming for load 1.2, no offload",
                               KILN_BASELINE_DESIGN_LOAD},
};

const char *kiln_baseline_name(kiln_baseline_kind k)
{
	return k < KILN_BASELINE_COUNT ? info[k].name : "?";
}

/* Megatron-Core's recompute modules, from the lightest, mapped to the ops
 * whose outputs they drop. */
enum { MOD_LAYERNORM, MOD_MOE_ACT, MOD_CORE_ATTN, MOD_MLA_UP, MOD_SHARED, MOD_OFFLOAD_FC1, N_MODS };

static int module_of(kiln_op_kind k)
{
	switch (k) {
	case KILN_OP_NORM:
	case KILN_OP_Q_NORM:
	case KILN_OP_KV_NORM:
		return MOD_LAYERNORM;
	case KILN_OP_EXPERT_ACT:
		return MOD_MOE_ACT;
	case KILN_OP_ATTN_CORE:
	case KILN_OP_ATTN_DROPOUT:
		return MOD_CORE_ATTN;
	case KILN_OP_Q_UP:
	case KILN_OP_KV_UP:
		return MOD_MLA_UP;
	case KILN_OP_SHARED_UP:
	case KILN_OP_SHARED_ACT:
		return MOD_SHARED;
	case KILN_OP_EXPERT_UP:
		return MOD_OFFLOAD_FC1;
	default:
		return -1;
	}
}

/* Megatron's selective actions for modules [0, level]. */
static void selective_actions(const kiln_compilation *c, const kiln_unit_set *set, int level,
                              uint8_t *out)
{
	for (int32_t u = 0; u < set->n_units; u++) {
		const kiln_unit *un = &set->units[u];
		int mod = module_of(c->graph->ops[un->producer].kind);
		out[u] = KILN_ACT_KEEP;
		if (mod < 0 || mod > level || (un->flags & KILN_UNIT_LAYER_INPUT))
			continue;
		out[u] = mod == MOD_OFFLOAD_FC1 ? KILN_ACT_OFFLOAD : KILN_ACT_RECOMPUTE;
	}
}

/* A one-point "table" holding a fixed plan's exact bytes at load factor
 * load, so the budget's fit test can judge it. */
typedef struct fixed_plan {
	kiln_plan_table t;
	kiln_frontier f;
	kiln_plan_point p;
	kiln_plan_bytes b;
	int32_t point;
} fixed_plan;

static void fixed_table(const kiln_compilation *c, const kiln_unit_set *set, const uint8_t *actions,
                        double load, fixed_plan *out)
{
	memset(out, 0, sizeof *out);
	double n = set->kind == KILN_LAYER_MOE ? load * c->graph->layers[set->layer].n_balanced : 0;
	kiln_plan_bytes_at(set, actions, n, &out->b);
	out->f.points = &out->p;
	out->f.n_points = 1;
	out->t.set = set;
	out->t.frontier = &out->f;
	out->t.n_points = 1;
	out->t.point = &out->point;
	out->t.bytes = &out->b;
}

/* Does the selective level fit every stage at the design load? */
static bool selective_fits(const kiln_compilation *c, int level, uint8_t *scratch)
{
	for (int32_t s = 0; s < c->graph->n_stages; s++) {
		const kiln_stage_budget *bu = &c->budgets[s];
		fixed_plan fp[8];
		const kiln_plan_table *tabs[8];
		int32_t n = 0, pts[8] = {0};
		for (int32_t i = 0; i < c->n_sets && n < 8; i++) {
			if (c->sets[i].stage != s)
				continue;
			selective_actions(c, &c->sets[i], level, scratch);
			fixed_table(c, &c->sets[i], scratch, KILN_BASELINE_DESIGN_LOAD, &fp[n]);
			tabs[n] = &fp[n].t;
			n++;
		}
		if (kiln_budget_cheapest_fit(tabs, n, bu->fixed_bytes, bu->inflight,
		                             bu->capacity_bytes - bu->static_bytes, 0, pts) != 0)
			return false;
	}
	return true;
}

/* Does a baseline's plan fit every stage with every in-flight micro-batch
 * at its design load? */
static bool baseline_fits(const kiln_compilation *c, const kiln_baseline *bl)
{
	for (int32_t s = 0; s < c->graph->n_stages; s++) {
		const kiln_stage_budget *bu = &c->budgets[s];
		fixed_plan fp[8];
		const kiln_plan_table *tabs[8];
		int32_t n = 0, pts[8] = {0};
		for (int32_t i = 0; i < c->n_sets && n < 8; i++) {
			if (c->sets[i].stage != s)
				continue;
			fixed_table(c, &c->sets[i], c->pool->actions[bl->plan[i]], bl->design_load, &fp[n]);
			tabs[n] = &fp[n].t;
			n++;
		}
		if (kiln_budget_cheapest_fit(tabs, n, bu->fixed_bytes, bu->inflight,
		                             bu->capacity_bytes - bu->static_bytes, 0, pts) != 0)
			return false;
	}
	return true;
}

int kiln_pass_baselines(kiln_compilation *c)
{
	kiln_arena *a = c->arena;
	c->baselines = kiln_arena_alloc(a, sizeof(kiln_baseline) * KILN_BASELINE_COUNT);
	uint8_t *act = kiln_arena_alloc(a, KILN_PLAN_MAX_UNITS);
	if (!c->baselines || !act)
		return -1;
	for (int k = 0; k < KILN_BASELINE_COUNT; k++) {
		kiln_baseline *bl = &c->baselines[k];
		bl->kind = (kiln_baseline_kind)k;
		bl->name = info[k].name;
		bl->models = info[k].models;
		bl->design_load = info[k].design_load;
		bl->plan = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(c->n_sets ? c->n_sets : 1));
		if (!bl->plan)
			return -1;
	}

	/* Megatron: the shortest module prefix that fits every stage at load 1,
	 * one flag set for the whole job. */
	int level = 0;
	while (level < N_MODS && !selective_fits(c, level, act))
		level++;
	bool full = level == N_MODS; /* no selective level fits: full recompute */

	kiln_option_flags static_flags = {.offload = false, .collective_recompute = true};
	for (int32_t i = 0; i < c->n_sets; i++) {
		const kiln_unit_set *set = &c->sets[i];
		/* full recompute: everything but the layer input */
		for (int32_t u = 0; u < set->n_units; u++)
			act[u] = (set->units[u].flags & KILN_UNIT_LAYER_INPUT) ? KILN_ACT_KEEP
			                                                       : KILN_ACT_RECOMPUTE;
		c->baselines[KILN_BASELINE_FULL_RECOMPUTE].plan[i] = kiln_plan_pool_add(c->pool, a, set, act);
		selective_actions(c, set, MOD_LAYERNORM, act);
		c->baselines[KILN_BASELINE_STATIC_AGGRESSIVE].plan[i] =
		    kiln_plan_pool_add(c->pool, a, set, act);
		if (full)
			c->baselines[KILN_BASELINE_MEGATRON_SELECTIVE].plan[i] =
			    c->baselines[KILN_BASELINE_FULL_RECOMPUTE].plan[i];
		else {
			selective_actions(c, set, level, act);
			c->baselines[KILN_BASELINE_MEGATRON_SELECTIVE].plan[i] =
			    kiln_plan_pool_add(c->pool, a, set, act);
		}
	}

	/* AdaPipe: per stage, the cheapest recompute-only plan (collectives
	 * allowed: static) with which the stage fits at the design load. */
	for (int32_t s = 0; s < c->graph->n_stages; s++) {
		const kiln_stage_budget *bu = &c->budgets[s];
		kiln_plan_table tabs_store[8];
		const kiln_plan_table *tabs[8];
		int32_t first = -1, n = 0, pts[8];
		for (int32_t i = 0; i < c->n_sets && n < 8; i++) {
			if (c->sets[i].stage != s)
				continue;
			if (first < 0)
				first = i;
			kiln_plan_table *t = &tabs_store[n];
			memset(t, 0, sizeof *t);
			const kiln_unit_set *set = &c->sets[i];
			t->set = set;
			t->load_factor = KILN_BASELINE_DESIGN_LOAD;
			t->n = set->kind == KILN_LAYER_MOE
			           ? KILN_BASELINE_DESIGN_LOAD * c->graph->layers[set->layer].n_balanced
			           : 0;
			kiln_frontier *f = kiln_arena_alloc(a, sizeof *f);
			if (!f || kiln_pass_options(c->graph, set, t->n, &static_flags, a, &t->instance) != 0 ||
			    kiln_cost_frontier_dp(&t->instance, a, f) != 0)
				return -1;
			t->frontier = f;
			if (kiln_plan_table_fill(t, KILN_PLAN_TABLE_STEPS, NULL, a) != 0)
				return -1;
			tabs[n++] = t;
		}
		kiln_budget_cheapest_fit(tabs, n, bu->fixed_bytes, bu->inflight,
		                         bu->capacity_bytes - bu->static_bytes, 0, pts);
		for (int32_t k = 0; k < n; k++) {
			kiln_plan_actions(&tabs[k]->instance,
			                  &tabs[k]->frontier->points[tabs[k]->point[pts[k]]], act);
			int32_t id = kiln_plan_pool_add(c->pool, a, tabs[k]->set, act);
			if (id < 0)
				return -1;
			c->baselines[KILN_BASELINE_ADAPIPE].plan[first + k] = id;
		}
	}
	for (int k = 0; k < KILN_BASELINE_COUNT; k++) {
		for (int32_t i = 0; i < c->n_sets; i++)
			if (c->baselines[k].plan[i] < 0)
				return -1;
		c->baselines[k].fits = baseline_fits(c, &c->baselines[k]);
	}
	return 0;
}
