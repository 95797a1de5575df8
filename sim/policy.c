/* sim/policy.c: the memory policies the simulator runs side by side
 * (docs/simulator.md, "Policies").
 *
 * Static policies are one action vector per unit set, the same at every
 * load: the compiler's baselines (passes/baselines.c), kiln's steady plan,
 * or keep-everything. Their exposed time per load bucket comes from the
 * scheduler, exactly as the planner's feedback computes it
 * (kiln_interleave_exposed). kiln decides through the runtime's public API
 * on the compiled blob.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "sim/sim.h"

static const char *const NAMES[] = {
#define X(id, name, models) name,
    KILN_SIM_POLICIES(X)
#undef X
};

static const char *const MODELS[] = {
#define X(id, name, models) models,
    KILN_SIM_POLICIES(X)
#undef X
};

const char *kiln_sim_policy_name(kiln_sim_policy_kind k)
{
	return k >= 0 && k < KILN_SIM_POLICY_COUNT ? NAMES[k] : "?";
}

const char *kiln_sim_policy_models(kiln_sim_policy_kind k)
{
	return k >= 0 && k < KILN_SIM_POLICY_COUNT ? MODELS[k] : "?";
}

int kiln_sim_policy_parse_cf(const char *s, double *out_cf)
{
	if (out_cf)
		*out_cf = 0;
	for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++)
		if (strcmp(s, NAMES[k]) == 0)
			return k;
	if (strcmp(s, "kiln:no-overlap+no-adaptive") == 0)
		return KILN_SIM_KILN_STATIC_SERIAL;
	/* megatron's search covers every module prefix megatron-selective
	 * tried: the old name stays as an alias. */
	if (strcmp(s, "megatron-selective") == 0)
		return KILN_SIM_MEGATRON;
	static const char cap[] = "megatron-capacity:";
	if (strncmp(s, cap, sizeof cap - 1) == 0) {
		const char *v = s + sizeof cap - 1;
		char *end = NULL;
		double cf = strtod(v, &end);
		if (end == v || *end != '\0' || !(cf > 0 && cf <= KILN_SIM_MAX_CAPACITY_FACTOR))
			return -1;
		if (out_cf)
			*out_cf = cf;
		return KILN_SIM_MEGATRON_CAPACITY;
	}
	/* The former name of mindspeed (a per-rank factor trigger on expert
	 * units), kept so that scripts naming it still run. */
	if (strcmp(s, "mindspeed-threshold") == 0)
		return KILN_SIM_MINDSPEED;
	return -1;
}

int kiln_sim_policy_parse(const char *s)
{
	return kiln_sim_policy_parse_cf(s, NULL);
}

double kiln_sim_capacity_factor(const kiln_model *m, double cf)
{
	if (cf > 0)
		return cf;
	return m->megatron.capacity_factor > 0 ? m->megatron.capacity_factor : 1.0;
}

void kiln_sim_capacity_drop(const double *rows, int32_t n_experts, double capacity_rows,
                            double *out_kept, double *out_dropped)
{
	double kept = 0, dropped = 0;
	for (int32_t x = 0; x < n_experts; x++) {
		double v = rows[x] > 0 ? rows[x] : 0;
		kept += v < capacity_rows ? v : capacity_rows;
		dropped += v > capacity_rows ? v - capacity_rows : 0;
	}
	*out_kept = kept;
	*out_dropped = dropped;
}

/* A plan's bytes at n rows as two lines (sim/price.c). */
typedef kiln_sim_plan_form plan_form;

/* Costs of one plan at one bucket's upper edge. */
typedef struct cost {
	double exposed_us, serial_us, recompute_us;
} cost;

/* One layer plan of Megatron's offload groups (struct kiln_sim_policy,
 * grp_var): a set's actions, their form and per bucket their cost. */
typedef struct variant {
	int32_t set;
	const uint8_t *actions;
	plan_form form;
	cost *costs; /* per bucket, NAN until scheduled */
} variant;

struct kiln_sim_policy {
	kiln_sim_policy_kind kind;
	const kiln_compilation *c;
	const kiln_rt *rt;        /* adaptive kiln policies */
	int serial;               /* exposed time without overlap */
	/* Static policies: per set its actions, and per (set, bucket) the cost. */
	const uint8_t **actions;
	cost *costs;
	/* mindspeed: the plan when its trigger fires (the whole MoE layer
	 * checkpointed); actions is the plan otherwise. */
	const uint8_t **hot_actions;
	cost *hot_costs;
	/* Layers recomputed in full beside the policy's plan, one mechanism
	 * for both block methods: megatron's --recompute-method block (the
	 * first recompute_num_layers transformer layers of each model chunk
	 * on a stage) and mindspeed's --recompute-num-layers (the first
	 * full_layers model layers of each stage). full_layer[model layer] 1
	 * for such a layer (NULL: the policy has none); per set the full
	 * recompute plan, its costs and its form; full_layers the block's
	 * size (0: no layer in it). */
	int32_t n_model_layers;
	int32_t full_layers;
	uint8_t *full_layer;
	const uint8_t **full_actions;
	cost *full_costs;
	plan_form **full_forms;
	/* megatron with --recompute-method uniform --recompute-num-layers N >
	 * 1: every layer is recomputed in full, in checkpointed chunks of
	 * chunk_layers; full_layer marks each chunk's first layer
	 * FULL_CHUNK_HEAD and the others FULL_CHUNK_REST, whose form
	 * (chunk_forms, per set) keeps nothing: their input is rebuilt with
	 * the chunk, in the chunk's backward transient. */
	int32_t chunk_layers;
	plan_form **chunk_forms;
	/* megatron-capacity: the capacity factor; every expert processes
	 * exactly its capacity (padded). */
	double cf;
	/* megatron, megatron-capacity: the recipe's Megatron flags. */
	const char *flags;
	/* Adaptive policies: per (frontier, frontier point) the cost (shared
	 * by the tables of one frontier), NAN until computed. */
	cost **frontier_costs;
	/* Static policies: per set the form of actions (and hot_actions). */
	plan_form **forms, **hot_forms;
	/* Adaptive policies: per (set, plan pool index) the plan's form, built
	 * on first use (sets with the same units share pool plans). */
	plan_form **plan_forms;
	/* Adaptive policies: per (set, bucket) the last plan chosen there and
	 * its point in the table (plan -1 until then), as a decision repeats
	 * the last one's plan most of the time. */
	int32_t (*last_point)[2];
	/* Adaptive policies: per (set, bucket) the cost of the set's group
	 * plan (full recompute's or a cheaper one, passes/baselines.c), NAN
	 * until computed. */
	cost *group_costs;
	/* megatron-paged-stash: per stage its stash (has_stash[s] 0 for a
	 * stage without MoE layers), and the rerun's policy (NULL in the
	 * rerun itself). */
	kiln_sim_stash *stash;
	uint8_t *has_stash;
	kiln_sim_policy *rerun;
	const char *recipe; /* its flags, the stash's and the recipe's beside it */
	int recipe_fits;    /* whether they fit at the design load */
	kiln_sim_oracle *oracle; /* oracle: its planner (sim/oracle.c) */
	/* megatron, megatron-capacity, megatron-paged-stash: Megatron's
	 * offload groups (passes/baselines.c, stage_groups): per model layer
	 * the runs of micro-batches of its stage (grp_n 0: the layer takes
	 * its set's plan), run r ending before micro-batch grp_end[l][r], its
	 * plan vars[grp_var[l][r]]. */
	int32_t n_grp_layers;
	int32_t *grp_n;
	const int64_t **grp_end;
	int32_t **grp_var;
	variant *vars;
	int32_t n_vars;
};

/* The form of actions for set in f; returns f (NULL when f is). */
static plan_form *form_build(const kiln_sim_policy *p, int32_t set, const uint8_t *actions,
                             plan_form *f)
{
	if (f)
		kiln_sim_plan_form_of(p->c, set, actions, f);
	return f;
}

/* As the runtime's 64-bit fields take a double: NaN and negatives 0, at or
 * past 2^64 saturated (a plain conversion would be undefined). Rows beyond
 * the largest bucket are the runtime's KILN_PLAN_LOAD_BEYOND. */
static uint64_t u64_sat(double x)
{
	if (!(x > 0))
		return 0;
	return x < 0x1p64 ? (uint64_t)x : UINT64_MAX;
}

double kiln_sim_whole_rows(double n)
{
	return ceil(n - 1e-9);
}

static int cost_of(const kiln_compilation *c, int32_t set, int32_t bucket, const uint8_t *actions,
                   cost *out)
{
	return kiln_sim_plan_cost(c, set, bucket, actions, &out->exposed_us, &out->serial_us,
	                          &out->recompute_us);
}

/* kiln's static plan for one unit set (the ablation policies
 * kiln:no-adaptive and kiln:no-adaptive+no-overlap): kiln's own tables at
 * the design load the tuned baselines use (KILN_BASELINE_DESIGN_LOAD), the
 * cheapest combination of the stage's sets with which every in-flight
 * micro-batch fits there, as a team would tune one static plan; failing
 * that, the budget's steady point at load 1 (passes/budget.c). The load-1
 * point alone fits only at perfect balance: where keeping everything
 * fits with a few hundred MB to spare, the calm imbalance of every
 * iteration overflows it. */
static const uint8_t *steady_actions(const kiln_compilation *c, int32_t set)
{
	int32_t s = c->sets[set].stage, k = 0;
	for (int32_t j = 0; j < set; j++)
		k += c->sets[j].stage == s;
	const kiln_stage_budget *bu = &c->budgets[s];
	int32_t bd = kiln_plan_bucket_of(c->buckets, c->n_buckets, KILN_BASELINE_DESIGN_LOAD);
	if (bd >= c->n_buckets)
		bd = c->n_buckets - 1;
	const kiln_plan_table *tabs[8];
	int32_t pts[8], n = 0, mine = -1;
	for (int32_t j = 0; j < c->n_sets && n < 8; j++)
		if (c->sets[j].stage == s) {
			if (j == set)
				mine = n;
			tabs[n++] = kiln_plan_table_of(c, j, bd);
		}
	if (mine >= 0 &&
	    kiln_budget_cheapest_fit(tabs, n, bu->fixed_bytes, bu->inflight,
	                             bu->capacity_bytes - bu->static_bytes, 0, pts) == 0)
		return c->pool->actions[tabs[mine]->plan[pts[mine]]];
	int32_t b1 = kiln_plan_bucket_of(c->buckets, c->n_buckets, 1.0);
	if (b1 >= c->n_buckets)
		b1 = c->n_buckets - 1;
	const kiln_plan_table *t = kiln_plan_table_of(c, set, b1);
	return c->pool->actions[t->plan[bu->steady_point[k]]];
}

/* What full_layer says of a model layer. */
enum { FULL_NONE, FULL_BLOCK, FULL_CHUNK_HEAD, FULL_CHUNK_REST };

/* The one fill path of the layers recomputed in full (struct
 * kiln_sim_policy, full_layer): per set the plan actions[set] (borrowed:
 * pool- or arena-owned, outliving p), its form, its costs (scheduled on
 * first use), and no layer marked yet. Returns 0, or -1 on exhaustion. */
static int full_prepare(kiln_sim_policy *p, const uint8_t *const *actions, kiln_arena *a)
{
	const kiln_compilation *c = p->c;
	const kiln_ir_graph *g = c->graph;
	int32_t ns = c->n_sets, nb = c->n_buckets;
	for (int32_t l = 0; l < g->n_layers; l++)
		p->n_model_layers = g->layers[l].index + 1 > p->n_model_layers
		                        ? g->layers[l].index + 1
		                        : p->n_model_layers;
	p->full_layers = 0;
	p->full_layer = kiln_arena_alloc(a, (size_t)p->n_model_layers + 1);
	p->full_actions = kiln_arena_alloc(a, sizeof(uint8_t *) * (size_t)(ns + 1));
	p->full_costs = kiln_arena_alloc(a, sizeof(cost) * ((size_t)ns * (size_t)nb + 1));
	p->full_forms = kiln_arena_alloc(a, sizeof(plan_form *) * (size_t)(ns + 1));
	if (!p->full_layer || !p->full_actions || !p->full_costs || !p->full_forms)
		return -1;
	memset(p->full_layer, 0, (size_t)p->n_model_layers + 1);
	for (int32_t k = 0; k < ns; k++) {
		p->full_actions[k] = actions[k];
		p->full_forms[k] =
		    form_build(p, k, p->full_actions[k], kiln_arena_alloc(a, sizeof(plan_form)));
		if (!p->full_forms[k])
			return -1;
		for (int32_t b = 0; b < nb; b++)
			p->full_costs[(size_t)k * nb + b] = (cost){NAN, NAN, NAN};
	}
	return 0;
}

/* Megatron's offload groups into p (struct kiln_sim_policy, grp_n):
 * n_runs and run_end per stage, layer_actions per graph layer per run
 * (NULL rows: none), as kiln_megatron_actions holds them; borrowed, they
 * outlive p. Returns 0, or -1 on exhaustion. */
static int groups_prepare(kiln_sim_policy *p, const int32_t *n_runs, int64_t *const *run_end,
                          const uint8_t *const *const *layer_actions, kiln_arena *a)
{
	const kiln_compilation *c = p->c;
	const kiln_ir_graph *g = c->graph;
	int32_t nb = c->n_buckets, nl = 0, nv = 0;
	if (!n_runs || !layer_actions)
		return 0;
	for (int32_t l = 0; l < g->n_layers; l++) {
		nl = g->layers[l].index + 1 > nl ? g->layers[l].index + 1 : nl;
		if (layer_actions[l])
			nv += n_runs[g->layers[l].stage];
	}
	if (nv == 0)
		return 0;
	p->n_grp_layers = nl;
	p->grp_n = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(nl + 1));
	p->grp_end = kiln_arena_alloc(a, sizeof(int64_t *) * (size_t)(nl + 1));
	p->grp_var = kiln_arena_alloc(a, sizeof(int32_t *) * (size_t)(nl + 1));
	p->vars = kiln_arena_alloc(a, sizeof(variant) * (size_t)nv);
	if (!p->grp_n || !p->grp_end || !p->grp_var || !p->vars)
		return -1;
	memset(p->grp_n, 0, sizeof(int32_t) * (size_t)(nl + 1));
	p->n_vars = 0;
	for (int32_t l = 0; l < g->n_layers; l++) {
		const kiln_ir_layer *ly = &g->layers[l];
		if (!layer_actions[l] || ly->index < 0)
			continue;
		int32_t set = kiln_set_of_layer(c->sets, c->n_sets, ly);
		int32_t nr = n_runs[ly->stage];
		if (set < 0 || nr <= 0)
			continue;
		int32_t *vi = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)nr);
		if (!vi)
			return -1;
		size_t nu = (size_t)c->sets[set].n_units;
		for (int32_t r = 0; r < nr; r++) {
			const uint8_t *act = layer_actions[l][r];
			int32_t k = 0;
			while (k < p->n_vars &&
			       !(p->vars[k].set == set && memcmp(p->vars[k].actions, act, nu) == 0))
				k++;
			if (k == p->n_vars) {
				variant *v = &p->vars[p->n_vars++];
				v->set = set;
				v->actions = act;
				form_build(p, set, act, &v->form);
				v->costs = kiln_arena_alloc(a, sizeof(cost) * (size_t)(nb + 1));
				if (!v->costs)
					return -1;
				for (int32_t b = 0; b < nb; b++)
					v->costs[b] = (cost){NAN, NAN, NAN};
			}
			vi[r] = k;
		}
		p->grp_n[ly->index] = nr;
		p->grp_end[ly->index] = run_end[ly->stage];
		p->grp_var[ly->index] = vi;
	}
	return 0;
}

/* The variant model layer `layer` takes in micro-batch mb, or NULL. */
static const variant *group_variant(const kiln_sim_policy *p, int32_t layer, uint32_t mb)
{
	if (!p->grp_n || layer < 0 || layer >= p->n_grp_layers || p->grp_n[layer] == 0)
		return NULL;
	int32_t r = 0, nr = p->grp_n[layer];
	while (r < nr - 1 && (int64_t)mb >= p->grp_end[layer][r])
		r++;
	return &p->vars[p->grp_var[layer][r]];
}

static const cost *variant_cost(const kiln_sim_policy *p, const variant *v, int32_t b)
{
	cost *co = &v->costs[b];
	if (isnan(co->exposed_us) && cost_of(p->c, v->set, b, v->actions, co) != 0)
		*co = (cost){0, 0, 0};
	return co;
}

/* megatron's block layers, and megatron-capacity's plan: the
 * description's recipe, else the search's at the capacity factor (the
 * load every rank then carries). */
static int prepare_megatron(kiln_sim_policy *p, kiln_arena *a)
{
	const kiln_compilation *c = p->c;
	int32_t ns = c->n_sets;
	const kiln_baseline *bl = &c->baselines[KILN_BASELINE_MEGATRON];
	const uint8_t *const *head = NULL;
	int32_t block = 0;
	kiln_megatron_actions ma;
	kiln_megatron r = bl->recipe;
	if (p->kind == KILN_SIM_MEGATRON_CAPACITY) {
		const kiln_megatron *given = &c->model->megatron;
		bool stated = given->recompute != KILN_RECOMPUTE_NONE || given->offload_modules;
		if (stated)
			r = *given;
		int rc = stated ? kiln_megatron_recipe_eval(c, given, p->cf, a, &ma)
		                : kiln_megatron_search(c, p->cf, a, &r, &ma, NULL);
		if (rc != 0)
			return -1;
		/* A dense model has no expert to cap. */
		r.capacity_factor = c->model->moe ? p->cf : 0;
		r.pad_to_capacity = c->model->moe;
		for (int32_t k = 0; k < ns; k++)
			p->actions[k] = ma.tail[k];
		if (groups_prepare(p, ma.n_runs, ma.run_end,
		                   (const uint8_t *const *const *)ma.layer_actions, a) != 0)
			return -1;
		if (ns > 0 && ma.head[0]) {
			head = (const uint8_t *const *)ma.head;
			block = (int32_t)r.recompute_num_layers;
		}
	} else if (bl->layer_plan) {
		const kiln_ir_graph *g = c->graph;
		const uint8_t ***la =
		    kiln_arena_alloc(a, sizeof(uint8_t **) * (size_t)(g->n_layers + 1));
		if (!la)
			return -1;
		for (int32_t l = 0; l < g->n_layers; l++) {
			la[l] = NULL;
			if (!bl->layer_plan[l])
				continue;
			int32_t nr = bl->n_runs[g->layers[l].stage];
			la[l] = kiln_arena_alloc(a, sizeof(uint8_t *) * (size_t)(nr + 1));
			if (!la[l])
				return -1;
			for (int32_t q = 0; q < nr; q++)
				la[l][q] = c->pool->actions[bl->layer_plan[l][q]];
		}
		if (groups_prepare(p, bl->n_runs, bl->run_end, (const uint8_t *const *const *)la,
		                   a) != 0)
			return -1;
	}
	if (p->kind != KILN_SIM_MEGATRON_CAPACITY && bl->head_plan) {
		const uint8_t **h = kiln_arena_alloc(a, sizeof(uint8_t *) * (size_t)(ns + 1));
		if (!h)
			return -1;
		for (int32_t k = 0; k < ns; k++)
			h[k] = c->pool->actions[bl->head_plan[k]];
		head = h;
		block = bl->block_layers;
	}
	char buf[512];
	if (kiln_megatron_flags_format(&r, buf, sizeof buf) >= 0) {
		char *f = kiln_arena_alloc(a, strlen(buf) + 1);
		if (!f)
			return -1;
		memcpy(f, buf, strlen(buf) + 1);
		p->flags = f;
	}
	const kiln_ir_graph *g = c->graph;
	if (r.recompute == KILN_RECOMPUTE_FULL && r.recompute_method == KILN_RECOMPUTE_UNIFORM &&
	    r.recompute_num_layers > 1) {
		/* Uniform chunks (passes/baselines.c, uniform_fits): every
		 * layer takes the full plan; a chunk's later layers keep
		 * nothing. */
		int32_t k = (int32_t)(r.recompute_num_layers < INT32_MAX ? r.recompute_num_layers
		                                                         : INT32_MAX);
		if (full_prepare(p, p->actions, a) != 0)
			return -1;
		p->full_layers = k;
		p->chunk_layers = k;
		p->chunk_forms = kiln_arena_alloc(a, sizeof(plan_form *) * (size_t)(ns + 1));
		if (!p->chunk_forms)
			return -1;
		for (int32_t i = 0; i < ns; i++) {
			plan_form *f = kiln_arena_alloc(a, sizeof(plan_form));
			if (!f)
				return -1;
			*f = *p->full_forms[i];
			f->tr_base += f->res_base;
			f->tr_per_n += f->res_per_n;
			f->res_base = f->res_per_n = 0;
			p->chunk_forms[i] = f;
		}
		for (int32_t l = 0; l < g->n_layers; l++) {
			int32_t pos = kiln_megatron_chunk_pos(g, l);
			if (pos >= 0 && g->layers[l].index < p->n_model_layers)
				p->full_layer[g->layers[l].index] =
				    pos % k == 0 ? FULL_CHUNK_HEAD : FULL_CHUNK_REST;
		}
		return 0;
	}
	if (!head)
		return 0;
	if (full_prepare(p, head, a) != 0)
		return -1;
	p->full_layers = block;
	for (int32_t l = 0; l < g->n_layers; l++)
		if (g->layers[l].index >= 0)
			p->full_layer[g->layers[l].index] = kiln_megatron_in_block(g, l, block);
	return 0;
}

/* MindSpeed, as modelled (docs/simulator.md, "Policies"; MindSpeed
 * branch 2.1.0_core_r0.8.0, commit 1e898a29c750, 2025-11-03). Beside the
 * adaptive MoE recompute its users run MindSpeed's selective recompute of
 * the activation functions and norms (its feature test
 * tests_extend/system_tests/feature_tests/megatron_moe.sh:44-51 sets
 * --recompute-activation-function and --recompute-norm with it): the
 * outputs of every MLP's and expert's activation (mindspeed/model/
 * transformer.py:944-1010, mindspeed/core/transformer/moe/experts.py:
 * 105-108) and of the norms (mindspeed/core/models/gpt/gpt_layer_specs.py:
 * 56-65), in every layer. */
static int mindspeed_selective(kiln_op_kind k)
{
	return k == KILN_OP_NORM || k == KILN_OP_FFN_ACT || k == KILN_OP_EXPERT_ACT ||
	       k == KILN_OP_SHARED_ACT;
}

/* The ops of Megatron's MoELayer, which MindSpeed's trigger checkpoints
 * whole (tensor_parallel.checkpoint(custom_forward, ...), mindspeed/core/
 * transformer/moe/moe_layer.py:120-147): router, dispatch, experts,
 * combine and the shared experts; only its input is kept. */
static int mindspeed_moe_layer(kiln_op_kind k)
{
	switch (k) {
	case KILN_OP_ROUTER:
	case KILN_OP_ROUTER_SOFTMAX:
	case KILN_OP_PERMUTE:
	case KILN_OP_DISPATCH:
	case KILN_OP_EXPERT_UP:
	case KILN_OP_EXPERT_ACT:
	case KILN_OP_EXPERT_DOWN:
	case KILN_OP_COMBINE:
	case KILN_OP_UNPERMUTE:
	case KILN_OP_SHARED_UP:
	case KILN_OP_SHARED_ACT:
	case KILN_OP_SHARED_DOWN:
		return 1;
	default:
		return 0;
	}
}

/* mindspeed's two plans for one unit set into cold (untriggered) and hot
 * (triggered, MoE layers only): the selective recompute, and that plus
 * every unit of the MoE layer recomputed. A plan that source tracking
 * rejects falls back, the cold one to keeping everything, the hot one to
 * full recompute (never reached on the shipped models). */
static void mindspeed_plans(const kiln_compilation *c, int32_t k, uint8_t *cold, uint8_t *hot)
{
	const kiln_unit_set *set = &c->sets[k];
	for (int32_t u = 0; u < set->n_units; u++) {
		const kiln_unit *un = &set->units[u];
		kiln_op_kind op = c->graph->ops[un->producer].kind;
		int input = (un->flags & KILN_UNIT_LAYER_INPUT) != 0;
		cold[u] = !input && mindspeed_selective(op) ? KILN_ACT_RECOMPUTE : KILN_ACT_KEEP;
		hot[u] = !input && set->kind == KILN_LAYER_MOE && mindspeed_moe_layer(op)
		             ? KILN_ACT_RECOMPUTE
		             : cold[u];
	}
	if (kiln_plan_valid(set, cold) != 0)
		memset(cold, KILN_ACT_KEEP, (size_t)set->n_units);
	if (kiln_plan_valid(set, hot) != 0)
		memcpy(hot, c->pool->actions[c->baselines[KILN_BASELINE_FULL_RECOMPUTE].plan[k]],
		       (size_t)set->n_units);
}

static int prepare_static(kiln_sim_policy *p, kiln_arena *a)
{
	const kiln_compilation *c = p->c;
	int32_t ns = c->n_sets, nb = c->n_buckets;
	p->actions = kiln_arena_alloc(a, sizeof(uint8_t *) * (size_t)ns);
	p->costs = kiln_arena_alloc(a, sizeof(cost) * (size_t)ns * (size_t)nb);
	if (!p->actions || !p->costs)
		return -1;
	static const uint8_t keep[KILN_PLAN_MAX_UNITS];
	for (int32_t k = 0; k < ns; k++) {
		switch (p->kind) {
		case KILN_SIM_UNBOUNDED:
		case KILN_SIM_MINDSPEED: /* its plans below */
			p->actions[k] = keep;
			break;
		case KILN_SIM_FULL_RECOMPUTE:
			p->actions[k] = c->pool->actions[c->baselines[KILN_BASELINE_FULL_RECOMPUTE].plan[k]];
			break;
		case KILN_SIM_MEGATRON:
			p->actions[k] =
			    c->pool->actions[c->baselines[KILN_BASELINE_MEGATRON].plan[k]];
			break;
		case KILN_SIM_MEGATRON_CAPACITY:
			break; /* below */
		case KILN_SIM_STATIC_AGGRESSIVE:
			p->actions[k] =
			    c->pool->actions[c->baselines[KILN_BASELINE_STATIC_AGGRESSIVE].plan[k]];
			break;
		case KILN_SIM_ADAPIPE:
			p->actions[k] = c->pool->actions[c->baselines[KILN_BASELINE_ADAPIPE].plan[k]];
			break;
		case KILN_SIM_MEGATRON_PAGED_STASH:
			p->actions[k] = NULL; /* stash_recipe fills them */
			break;
		default:
			p->actions[k] = steady_actions(c, k);
			break;
		}
		/* Costs are scheduled on first use (NAN until then): a run
		 * touches few of the buckets. */
		for (int32_t b = 0; b < nb; b++)
			p->costs[(size_t)k * nb + b] = p->kind == KILN_SIM_UNBOUNDED
			                                   ? (cost){0, 0, 0}
			                                   : (cost){NAN, NAN, NAN};
	}
	if (p->kind == KILN_SIM_MEGATRON || p->kind == KILN_SIM_MEGATRON_CAPACITY)
		return prepare_megatron(p, a);
	if (p->kind != KILN_SIM_MINDSPEED)
		return 0;
	p->hot_actions = kiln_arena_alloc(a, sizeof(uint8_t *) * (size_t)ns);
	p->hot_costs = kiln_arena_alloc(a, sizeof(cost) * (size_t)ns * (size_t)nb);
	if (!p->hot_actions || !p->hot_costs)
		return -1;
	for (int32_t k = 0; k < ns; k++) {
		size_t nu = (size_t)c->sets[k].n_units;
		uint8_t *cold = kiln_arena_alloc(a, nu + 1), *hot = kiln_arena_alloc(a, nu + 1);
		if (!cold || !hot)
			return -1;
		mindspeed_plans(c, k, cold, hot);
		p->actions[k] = cold;
		p->hot_actions[k] = hot;
		for (int32_t b = 0; b < nb; b++)
			p->hot_costs[(size_t)k * nb + b] = (cost){NAN, NAN, NAN};
	}
	return 0;
}

static void fill(const kiln_sim_policy *p, const plan_form *f, double n, const cost *co,
                 kiln_sim_choice *out);

/* Whether every stage fits at KILN_BASELINE_DESIGN_LOAD on every rank
 * with the first n_full model layers of each stage recomputed in full and
 * the others on mindspeed's untriggered plan (the trigger stays off at
 * that load), counted as the simulator counts a device (docs/simulator.md,
 * "One rank through one iteration"): static bytes, the in-flight window's
 * micro-batches each holding its fixed bytes and its layers' resident
 * bytes, and the largest backward transient. With n_full set, marks the
 * full layers in p->full_layer. */
static int mindspeed_fits(kiln_sim_policy *p, int32_t n_full, int mark)
{
	const kiln_compilation *c = p->c;
	const kiln_ir_graph *g = c->graph;
	static const cost none = {0, 0, 0};
	for (int32_t s = 0; s < g->n_stages; s++) {
		const kiln_stage_budget *bu = &c->budgets[s];
		double held = ceil(bu->fixed_bytes - 1e-6), tr = 0, win = ceil(bu->inflight);
		int32_t j = 0;
		for (int32_t l = g->stages[s].layer_begin; l < g->stages[s].layer_end; l++) {
			const kiln_ir_layer *L = &g->layers[l];
			int32_t set = -1;
			for (int32_t k = 0; k < c->n_sets && L->index >= 0; k++)
				if (c->sets[k].stage == s && c->sets[k].kind == L->kind)
					set = k;
			if (set < 0)
				continue;
			int full = j++ < n_full;
			if (mark && L->index < p->n_model_layers)
				p->full_layer[L->index] = (uint8_t)full;
			kiln_sim_choice ch;
			double n = L->kind == KILN_LAYER_MOE
			               ? KILN_BASELINE_DESIGN_LOAD * L->n_balanced
			               : 0;
			fill(p, full ? p->full_forms[set] : p->forms[set], n, &none, &ch);
			held += ch.resident_bytes;
			tr = ch.transient_bytes > tr ? ch.transient_bytes : tr;
		}
		if (bu->static_bytes + (win > 1 ? win : 1) * held + tr > bu->capacity_bytes)
			return 0;
	}
	return 1;
}

/* mindspeed's full recompute beside the trigger: the plan per set, and the
 * fewest block-recomputed layers per stage with which every stage fits at
 * the design load, as a team tunes --recompute-num-layers (MindSpeed
 * recomputes the first ones in full and applies the activation and norm
 * recompute to the rest: should_recompute, mindspeed/model/
 * transformer.py:881-914 at 2.1.0_core_r0.8.0). */
static int mindspeed_block(kiln_sim_policy *p, kiln_arena *a)
{
	const kiln_compilation *c = p->c;
	const kiln_ir_graph *g = c->graph;
	int32_t ns = c->n_sets, most = 0;
	for (int32_t s = 0; s < g->n_stages; s++)
		most = g->stages[s].layer_end - g->stages[s].layer_begin > most
		           ? g->stages[s].layer_end - g->stages[s].layer_begin
		           : most;
	const uint8_t **full = kiln_arena_alloc(a, sizeof(uint8_t *) * (size_t)(ns + 1));
	if (!full)
		return -1;
	for (int32_t k = 0; k < ns; k++)
		full[k] = c->pool->actions[c->baselines[KILN_BASELINE_FULL_RECOMPUTE].plan[k]];
	if (full_prepare(p, full, a) != 0)
		return -1;
	int32_t n = 0;
	while (n < most && !mindspeed_fits(p, n, 0))
		n++;
	p->full_layers = n;
	mindspeed_fits(p, n, 1);
	return 0;
}

int32_t kiln_sim_policy_full_layers(const kiln_sim_policy *p)
{
	return p->full_layer ? p->full_layers : -1;
}

/* megatron-paged-stash (docs/simulator.md, "The paged stash").
 *
 * What Megatron pages: inside the fused grouped MLP, every saved tensor
 * Transformer Engine marks with grouped_tensor_scale_inv
 * (TransformerEngine transformer_engine/pytorch/utils.py:308
 * mark_grouped_tensor, called at ops/fused/grouped_mlp.py:1749 on fc1's
 * input, the activation's input, the probability scales and fc2's input;
 * commit d0067d0) goes through PagedStashManager.on_save_for_backward
 * (Megatron-LM megatron/core/transformer/moe/paged_stash.py:684-778,
 * commit d98e8a6). In kiln's units: the expert units produced by the
 * dispatch (expert input and its probabilities), by expert_up and by
 * expert_act. */
static int stash_paged_unit(const kiln_compilation *c, const kiln_unit *u)
{
	if (!(u->flags & KILN_UNIT_EXPERT))
		return 0;
	kiln_op_kind k = c->graph->ops[u->producer].kind;
	return k == KILN_OP_DISPATCH || k == KILN_OP_EXPERT_UP || k == KILN_OP_EXPERT_ACT;
}

/* The stash of stage s for set (its MoE unit set), as Megatron sizes it.
 * Budget: HybridEP's receive budget, tokens * top_k * CF rounded up to
 * the alignment (megatron/core/transformer/moe/token_dispatcher.py:
 * 1098-1109), tokens * top_k being the balanced rows. Average rows:
 * max_num_tokens // CF (moe/experts.py:766-775). Buffer: during its
 * first (capture) step Megatron sums the average rows of the tensors held
 * at once and keeps the peak (paged_stash.py:723-748); in 1F1B that is
 * every MoE layer of the stage for each of its W in-flight micro-batches;
 * the CUDA buffer holds int(peak * cuda_factor) rows in whole pages, the
 * host buffer int(peak * cpu_factor) (paged_stash.py:551-632 and
 * PagedStashBuffer, :69-81). Each (dtype, hidden) key has its own buffer
 * of that many pages; every key of a layer asks for the same pages, so
 * one page count stands for all of them and row_bytes sums their
 * widths. */
static void stash_size(const kiln_compilation *c, const kiln_unit_set *set,
                       const kiln_sim_stash_flags *fl, int32_t window, kiln_sim_stash *out)
{
	const kiln_model *m = c->model;
	double bal = c->graph->layers[set->layer].n_balanced, row = 0;
	for (int32_t u = 0; u < set->n_units; u++)
		if (stash_paged_unit(c, &set->units[u]))
			row += (double)set->units[u].bytes.per_n;
	double align = fl->align_rows > 0 ? fl->align_rows : 1;
	double budget = floor(bal * fl->rank_capacity_factor);
	budget = ceil(budget / align) * align;
	double avg = floor(budget / fl->rank_capacity_factor);
	double peak = (double)window * (double)set->n_layers * avg;
	double pr = fl->page_rows;
	/* Whole pages, saturated (never an out-of-range conversion). */
	double cp = ceil(floor(peak * fl->cuda_factor) / pr);
	double hp = fl->cpu_factor > 0 ? ceil(floor(peak * fl->cpu_factor) / pr) : 0;
	int64_t cuda = cp < 9e18 ? (int64_t)cp : INT64_MAX;
	int64_t host = hp < 9e18 ? (int64_t)hp : INT64_MAX;
	*out = (kiln_sim_stash){.flags = *fl,
	                        .row_bytes = row,
	                        .budget_rows = budget,
	                        .avg_rows = avg,
	                        .cuda_pages = cuda,
	                        .host_pages = host,
	                        .cuda_bytes = (double)cuda * pr * row,
	                        .host_bytes = (double)host * pr * row,
	                        .experts = m->moe && m->ep > 0 ? (int32_t)(m->experts / m->ep) : 1};
}

double kiln_sim_stash_padded_rows(const kiln_sim_stash *st, double rows)
{
	if (!(rows > 0))
		return 0;
	double e = st->experts > 0 ? st->experts : 1, al = st->flags.align_rows;
	double n = kiln_sim_whole_rows(rows);
	double q = floor(n / e), r = n - q * e;
	if (!(al > 1))
		return n;
	return r * ceil((q + 1) / al) * al + (e - r) * ceil(q / al) * al;
}

double kiln_sim_stash_padded_rows_of(const kiln_sim_stash *st, double rows, const double *shares)
{
	if (!shares)
		return kiln_sim_stash_padded_rows(st, rows);
	if (!(rows > 0))
		return 0;
	/* Whole rows, apportioned by largest remainder: each expert the
	 * floor of its share of the rank's rows, then one more to the largest
	 * remainders (ties to the lower expert) until they add up. */
	double al = st->flags.align_rows > 1 ? st->flags.align_rows : 1, sum = 0;
	int32_t e = st->experts > 0 ? st->experts : 1;
	double n = kiln_sim_whole_rows(rows), given = 0;
	double nj[KILN_SIM_STASH_MAX_EXPERTS], rem[KILN_SIM_STASH_MAX_EXPERTS];
	if (e > KILN_SIM_STASH_MAX_EXPERTS)
		return kiln_sim_stash_padded_rows(st, rows);
	for (int32_t j = 0; j < e; j++) {
		double x = n * (shares[j] > 0 ? shares[j] : 0);
		nj[j] = floor(x);
		rem[j] = x - nj[j];
		given += nj[j];
	}
	for (double left = n - given; left >= 1; left--) {
		int32_t best = 0;
		for (int32_t j = 1; j < e; j++)
			best = rem[j] > rem[best] ? j : best;
		nj[best] += 1;
		rem[best] = -1;
	}
	for (int32_t j = 0; j < e; j++)
		sum += nj[j] > 0 ? ceil(nj[j] / al) * al : 0;
	return sum;
}

int64_t kiln_sim_stash_pages(const kiln_sim_stash *st, double padded_rows)
{
	if (!(padded_rows > 0))
		return 0;
	double pg = ceil(padded_rows / st->flags.page_rows);
	return pg < 9e18 ? (int64_t)pg : INT64_MAX;
}

/* The exposed time of one tensor's stash and reload (docs/simulator.md,
 * "The paged stash", "Time"). Both are Triton kernels that Megatron
 * launches with min(max_num_tokens, 2048) programs (paged_stash.py:
 * 222-227, 275-282), each looping over the tensor's rows strided by the
 * grid until every row is copied (moe/ops/paged_stash.py:113-137,
 * 224-249): the kernel holds its programs' SM slots for the whole copy,
 * so the copy runs as a kernel of its own, never hidden under compute.
 * Into device pages, the stash reads the rows and writes them (2 * bytes
 * through HBM) and the reload does the same. Into host pages the SMs store
 * the rows over the link: the stash reads HBM once and its stores drain at
 * d2h_gbps, the reload loads at h2d_gbps and writes HBM once, each kernel
 * as long as the slower of the two. */
static double stash_copy_us(const kiln_hardware *hw, double bytes, int host)
{
	if (!host)
		return 2 * kiln_cost_hbm_us(hw, 2 * bytes);
	double hbm = kiln_cost_hbm_us(hw, bytes);
	double d2h = hw->d2h_gbps > 0 ? bytes / (hw->d2h_gbps * 1e3) : 0;
	double h2d = hw->h2d_gbps > 0 ? bytes / (hw->h2d_gbps * 1e3) : 0;
	return (d2h > hbm ? d2h : hbm) + (h2d > hbm ? h2d : hbm);
}

double kiln_sim_stash_place(const kiln_sim_stash *st, const kiln_hardware *hw, double n,
                            const double *shares, int64_t *cuda, int64_t *host, int64_t used_c,
                            int64_t used_h, int *overflowed, double *spilled, int *dropped)
{
	double rows = kiln_sim_stash_padded_rows_of(st, n, shares);
	if (rows > st->budget_rows) {
		*dropped = 1;
		rows = st->budget_rows;
	}
	int64_t pg = kiln_sim_stash_pages(st, rows);
	if (*overflowed || pg == 0)
		return 0;
	double bytes = rows * st->row_bytes; /* the kernel copies the padded rows */
	if (st->cuda_pages - used_c - *cuda >= pg) {
		*cuda += pg;
		return stash_copy_us(hw, bytes, 0);
	}
	if (st->host_pages - used_h - *host >= pg) {
		*host += pg;
		*spilled += bytes;
		return stash_copy_us(hw, bytes, 1);
	}
	*overflowed = 1;
	return 0;
}

int kiln_sim_policy_stash(const kiln_sim_policy *p, int32_t s, kiln_sim_stash *out)
{
	if (!p->stash || s < 0 || s >= p->c->graph->n_stages || !p->has_stash[s])
		return -1;
	*out = p->stash[s];
	return 0;
}

const kiln_sim_policy *kiln_sim_policy_rerun(const kiln_sim_policy *p)
{
	return p ? p->rerun : NULL;
}

/* The recipe beside the stash: Megatron's recompute and offload modules
 * searched as for the megatron peer (passes/baselines.c,
 * kiln_megatron_search_beside, through costmodel/megatron.c's mapping),
 * with what the stash changes (docs/simulator.md, "The paged stash"):
 * - recompute modules left out: moe_act, whose checkpoint exists only on
 *   the unfused expert path (Megatron-LM moe/experts.py:269-271,
 *   1019-1030) while the stash needs Transformer Engine's fused grouped
 *   MLP (experts.py:287-291, 864-870, the stash at 766-828); moe, which
 *   checkpoints the whole MoE layer, experts included, so that their
 *   forward would save nothing for the stash to page; and full recompute
 *   for the same reason (Megatron does not refuse it, but neither its user
 *   guide nor a Megatron-Bridge recipe combines it with the stash);
 * - offload modules left out: expert_fc1, moe_act and fused_group_mlp,
 *   which Megatron refuses beside the stash (transformer_config.py:
 *   2218-2227);
 * - the paged units held outside the recipe, each stage's CUDA pages
 *   reserved, an MoE layer's budget-sized buffers added to its transient,
 *   and the stash's copies at the design load added to each stage's time. */
#define STASH_NO_RECOMPUTE (KILN_MRC(MOE_ACT) | KILN_MRC(MOE))
#define STASH_NO_OFFLOAD (KILN_MOF(EXPERT_FC1) | KILN_MOF(MOE_ACT) | KILN_MOF(FUSED_GROUP_MLP))

/* The factors a tuning engineer tries (docs/simulator.md, "The paged
 * stash", "Choosing the factors"). The capacity factor: Megatron-Bridge's
 * 1.5 (perf_recipes/deepseek/common.py:63, qwen/common.py:45,
 * gpt_oss/common.py:30 at 067f987), raised to the least of its larger
 * values (gpt_oss/b300/gpt_oss.py:96 sets 5, gpt_oss/gb200/gpt_oss.py:148
 * 7) where 1.5 does not hold the design load's padded rows, lowered to
 * 1.4, 1.3 or 1.2 (Bridge's Qwen3-235B value, qwen/gb200/qwen3_moe.py:958)
 * only where that is faster or what fits. The CUDA factor: 0 to 1.2
 * (Bridge's) in steps of 0.1, Megatron's default 1.10 and Bridge's 1.0
 * among them; the CPU factor by stash_cpu_factor. */
static const double STASH_CF_UP[] = {1.5, 2, 3, 5, 7};
static const double STASH_CF_DOWN[] = {1.4, 1.3, 1.2};
#define STASH_CUDA_STEPS 21     /* 0, 0.1, ..., 2.0 */
#define STASH_CPU_MAX_STEPS 200 /* the CPU factor in steps of 0.1, at most 20 */

/* One stage's stash at the design load: whether its budget holds the
 * design load's padded rows (no tokens dropped), whether its pages hold
 * the window's tensors there (no overflow) and its host pages fit the
 * device's share of host memory, and the copies' time per micro-batch:
 * the window's W * L tensors placed as kiln_sim_stash_place places them,
 * the first on the device while its pages last, the rest on the host,
 * averaged over the W micro-batches. */
typedef struct stash_at_design {
	int covers, holds, host_ok;
	double us;
} stash_at_design;

static stash_at_design stash_design(const kiln_compilation *c, const kiln_unit_set *set,
                                    const kiln_sim_stash *st, int32_t window)
{
	const kiln_hardware *hw = &c->model->hw;
	stash_at_design d = {0};
	double bal = c->graph->layers[set->layer].n_balanced;
	double rows = kiln_sim_stash_padded_rows(st, KILN_BASELINE_DESIGN_LOAD * bal);
	int64_t pg = kiln_sim_stash_pages(st, rows);
	double tensors = (double)window * (double)set->n_layers;
	double on_dev = pg > 0 ? floor((double)st->cuda_pages / (double)pg) : tensors;
	on_dev = on_dev < tensors ? on_dev : tensors;
	double on_host = pg > 0 ? floor((double)st->host_pages / (double)pg) : 0;
	on_host = on_host < tensors - on_dev ? on_host : tensors - on_dev;
	d.covers = rows <= st->budget_rows;
	d.holds = on_dev + on_host >= tensors;
	double per_dev = hw->devices_per_node > 0 ? (double)hw->devices_per_node : 1;
	d.host_ok = st->host_bytes <= hw->host_memory_gib * 1073741824.0 / per_dev;
	double bytes = rows * st->row_bytes;
	d.us = (on_dev * stash_copy_us(hw, bytes, 0) + on_host * stash_copy_us(hw, bytes, 1)) /
	       (window > 0 ? window : 1);
	return d;
}

/* The least CPU factor (a multiple of 0.1) with which every stage's pages
 * hold every in-flight MoE layer at its full budget, so that the stash
 * never overflows before a rank's rows exceed its budget: the host spill
 * the user guide suggests to avoid overflow reruns
 * (docs/user-guide/features/paged_stash.md:59). */
static double stash_cpu_factor(const kiln_compilation *c, const kiln_sim_stash_flags *fl)
{
	for (int k = 0; k <= STASH_CPU_MAX_STEPS; k++) {
		kiln_sim_stash_flags f = *fl;
		f.cpu_factor = k / 10.0;
		int ok = 1;
		for (int32_t s = 0; s < c->graph->n_stages && ok; s++) {
			double win = ceil(c->budgets[s].inflight);
			int32_t w = win >= 1 ? (int32_t)win : 1;
			for (int32_t i = 0; i < c->n_sets && ok; i++) {
				const kiln_unit_set *set = &c->sets[i];
				if (set->stage != s || set->kind != KILN_LAYER_MOE)
					continue;
				kiln_sim_stash st;
				stash_size(c, set, &f, w, &st);
				int64_t pg = kiln_sim_stash_pages(&st, st.budget_rows);
				double per = pg > 0 ? (double)pg : 1;
				ok = floor((double)st.cuda_pages / per) +
				         floor((double)st.host_pages / per) >=
				     (double)w * (double)set->n_layers;
			}
		}
		if (ok)
			return f.cpu_factor;
	}
	return STASH_CPU_MAX_STEPS / 10.0;
}

/* Sizes every stage's stash for fl (into p->stash and p->has_stash) and
 * what the recipe search charges beside it: per stage the CUDA pages'
 * bytes and the copies' time at the design load, per unit set an MoE
 * layer's budget-sized buffers. Returns whether every stage's stash takes
 * the design load (stash_design: covers, holds, host_ok). */
static int stash_size_all(kiln_sim_policy *p, const kiln_sim_stash_flags *fl, double *reserved,
                          double *us, double *tr)
{
	const kiln_compilation *c = p->c;
	int ok = 1;
	for (int32_t s = 0; s < c->graph->n_stages; s++) {
		p->stash[s] = (kiln_sim_stash){.flags = *fl};
		p->has_stash[s] = 0;
		reserved[s] = us[s] = 0;
		double win = ceil(c->budgets[s].inflight);
		int32_t w = win >= 1 ? (int32_t)win : 1;
		for (int32_t k = 0; k < c->n_sets; k++) {
			const kiln_unit_set *set = &c->sets[k];
			if (set->stage != s || set->kind != KILN_LAYER_MOE)
				continue;
			stash_size(c, set, fl, w, &p->stash[s]);
			p->has_stash[s] = 1;
			stash_at_design d = stash_design(c, set, &p->stash[s], w);
			ok &= d.covers && d.holds && d.host_ok;
			reserved[s] = p->stash[s].cuda_bytes;
			us[s] = d.us;
		}
	}
	for (int32_t k = 0; k < c->n_sets; k++) {
		const kiln_unit_set *set = &c->sets[k];
		const kiln_sim_stash *st = &p->stash[set->stage];
		tr[k] = set->kind == KILN_LAYER_MOE && p->has_stash[set->stage]
		            ? st->row_bytes * st->budget_rows
		            : 0;
	}
	return ok;
}

/* One candidate: flags fl with the side recipe searched beside them.
 * fit: 2 when every stage fits its bytes and its stash takes the design
 * load without drops or overflow, 1 when only the bytes fit, 0 when they
 * do not; worst_us the search's objective (the slowest stage's compute,
 * exposed recompute and copies, and stash copies, per micro-batch), sum_us
 * the tie-break (the exposed time and stash copies summed over stages). */
typedef struct stash_try {
	kiln_sim_stash_flags fl;
	int fit;
	double worst_us, sum_us;
	kiln_megatron recipe;
	kiln_megatron_actions ma;
} stash_try;

static int stash_try_flags(kiln_sim_policy *p, const kiln_sim_stash_flags *fl,
                           const kiln_megatron_beside *bs, double *reserved, double *us, double *tr,
                           kiln_arena *a, stash_try *out)
{
	int ok = stash_size_all(p, fl, reserved, us, tr);
	out->fl = *fl;
	if (kiln_megatron_search_beside(p->c, KILN_BASELINE_DESIGN_LOAD, bs, a, &out->recipe,
	                                &out->ma, NULL) != 0)
		return -1;
	out->fit = out->ma.fits ? 1 + ok : 0;
	out->worst_us = out->ma.worst_us;
	out->sum_us = out->ma.exposed_us;
	for (int32_t s = 0; s < p->c->graph->n_stages; s++)
		out->sum_us += us[s];
	return 0;
}

static int stash_flags_ok(const kiln_sim_stash_flags *fl)
{
	return fl->rank_capacity_factor > 0 && fl->rank_capacity_factor < 1e6 &&
	       fl->cuda_factor >= 0 && fl->cuda_factor < 1e6 && fl->cpu_factor >= 0 &&
	       fl->cpu_factor < 1e6 && fl->page_rows >= 1 && fl->align_rows >= 0;
}

/* The least capacity factor of STASH_CF_UP whose budget holds the design
 * load's padded rows on every stage (the largest when none does). */
static double stash_cf_up(kiln_sim_policy *p, const kiln_sim_stash_flags *base)
{
	const kiln_compilation *c = p->c;
	size_t n = sizeof STASH_CF_UP / sizeof STASH_CF_UP[0];
	for (size_t j = 0; j < n; j++) {
		kiln_sim_stash_flags fl = *base;
		fl.rank_capacity_factor = STASH_CF_UP[j];
		int ok = 1;
		for (int32_t k = 0; k < c->n_sets && ok; k++) {
			const kiln_unit_set *set = &c->sets[k];
			if (set->kind != KILN_LAYER_MOE)
				continue;
			kiln_sim_stash st;
			stash_size(c, set, &fl, 1, &st);
			ok = stash_design(c, set, &st, 1).covers;
		}
		if (ok)
			return fl.rank_capacity_factor;
	}
	return STASH_CF_UP[n - 1];
}

const char *kiln_sim_policy_recipe(const kiln_sim_policy *p, int *fits)
{
	if (fits)
		*fits = p ? p->recipe_fits : 0;
	return p ? p->recipe : NULL;
}

/* megatron-paged-stash's flags and recipe: flags as given (checked), else
 * the description's stash keys kept and the others chosen over the grid
 * above at the design load. Per capacity factor, in the order listed: the
 * CUDA factor that fits best (fit), then with the least objective, then
 * the least summed over stages, ties to the smaller (the same time with
 * less device memory held). A later capacity factor replaces the earlier
 * choice only when it fits better (simulator.md, "Choosing the factors"). */
static int stash_prepare(kiln_sim_policy *p, const kiln_sim_stash_flags *flags, kiln_arena *a,
                         FILE *err)
{
	const kiln_compilation *c = p->c;
	if (flags && !stash_flags_ok(flags)) {
		fprintf(err,
		        "kilnc: error: simulate: megatron-paged-stash: the capacity factor must be "
		        "above 0, the CUDA and CPU buffer factors at least 0 (Megatron's negative, "
		        "measured sizing is not modelled), the page size at least 1 row and the "
		        "alignment at least 0\n");
		return -1;
	}
	int32_t p_st = c->graph->n_stages, ns = c->n_sets;
	p->stash = kiln_arena_alloc(a, sizeof(kiln_sim_stash) * (size_t)(p_st + 1));
	p->has_stash = kiln_arena_alloc(a, (size_t)p_st + 1);
	double *reserved = kiln_arena_alloc(a, sizeof(double) * (size_t)(p_st + 1));
	double *us = kiln_arena_alloc(a, sizeof(double) * (size_t)(p_st + 1));
	double *tr = kiln_arena_alloc(a, sizeof(double) * (size_t)(ns + 1));
	uint8_t **outside = kiln_arena_alloc(a, sizeof(uint8_t *) * (size_t)(ns + 1));
	if (!p->stash || !p->has_stash || !reserved || !us || !tr || !outside)
		return -1;
	for (int32_t k = 0; k < ns; k++) {
		const kiln_unit_set *set = &c->sets[k];
		outside[k] = NULL;
		if (set->kind != KILN_LAYER_MOE)
			continue;
		outside[k] = kiln_arena_alloc(a, (size_t)set->n_units + 1);
		if (!outside[k])
			return -1;
		for (int32_t u = 0; u < set->n_units; u++)
			outside[k][u] = (uint8_t)stash_paged_unit(c, &set->units[u]);
	}
	/* The factors are chosen with the recipe's offload tuning left out
	 * (each try searches the recipe again); the recipe beside the chosen
	 * factors is then searched with it. */
	kiln_megatron_beside bs = {.no_recompute = STASH_NO_RECOMPUTE,
	                           .no_offload = STASH_NO_OFFLOAD,
	                           .no_full = true,
	                           .no_offload_tuning = true,
	                           .outside = (const uint8_t *const *)outside,
	                           .reserved_bytes = reserved,
	                           .transient_bytes = tr,
	                           .stage_us = us};
	stash_try best, cur;
	if (flags) {
		if (stash_try_flags(p, flags, &bs, reserved, us, tr, a, &best) != 0)
			return -1;
	} else {
		const kiln_megatron *mg = &c->model->megatron;
		kiln_sim_stash_flags base = KILN_SIM_STASH_DEFAULTS;
		if (mg->paged_stash_page_size > 0)
			base.page_rows = (int32_t)mg->paged_stash_page_size;
		double cfs[8];
		size_t n_cf = 0;
		if (mg->rank_capacity_factor > 0) {
			cfs[n_cf++] = mg->rank_capacity_factor;
		} else {
			cfs[n_cf++] = stash_cf_up(p, &base);
			for (size_t j = 0; j < sizeof STASH_CF_DOWN / sizeof STASH_CF_DOWN[0]; j++)
				cfs[n_cf++] = STASH_CF_DOWN[j];
		}
		int n_cuda = mg->paged_stash_cuda_set ? 1 : STASH_CUDA_STEPS;
		int have = 0;
		for (size_t i = 0; i < n_cf && !(have && best.fit == 2); i++) {
			/* The best CUDA factor at this capacity factor; a later
			 * capacity factor replaces the earlier only by fitting
			 * better. */
			stash_try at;
			int have_at = 0;
			for (int j = 0; j < n_cuda; j++) {
				kiln_sim_stash_flags fl = base;
				fl.rank_capacity_factor = cfs[i];
				fl.cuda_factor = mg->paged_stash_cuda_set
				                     ? mg->paged_stash_cuda_factor
				                     : j / 10.0;
				fl.cpu_factor = mg->paged_stash_cpu_set ? mg->paged_stash_cpu_factor
				                                        : stash_cpu_factor(c, &fl);
				if (stash_try_flags(p, &fl, &bs, reserved, us, tr, a, &cur) != 0)
					return -1;
				double tol =
				    have_at ? 1e-9 * (at.worst_us > 1 ? at.worst_us : 1) : 0;
				int same = have_at && cur.fit == at.fit &&
				           fabs(cur.worst_us - at.worst_us) <= tol;
				if (!have_at || cur.fit > at.fit ||
				    (cur.fit == at.fit && cur.worst_us < at.worst_us - tol) ||
				    (same && cur.sum_us < at.sum_us - tol)) {
					at = cur;
					have_at = 1;
				}
			}
			if (!have || at.fit > best.fit) {
				best = at;
				have = 1;
			}
		}
	}
	bs.no_offload_tuning = false;
	if (stash_try_flags(p, &best.fl, &bs, reserved, us, tr, a, &cur) != 0)
		return -1;
	if (cur.fit >= best.fit)
		best = cur;
	stash_size_all(p, &best.fl, reserved, us, tr);
	for (int32_t k = 0; k < ns; k++)
		p->actions[k] = best.ma.tail[k];
	if (groups_prepare(p, best.ma.n_runs, best.ma.run_end,
	                   (const uint8_t *const *const *)best.ma.layer_actions, a) != 0)
		return -1;
	p->recipe_fits = best.fit == 2;
	char rec[512], buf[1024];
	int rl = kiln_megatron_flags_format(&best.recipe, rec, sizeof rec);
	int has_rec =
	    rl > 0 && (best.recipe.recompute != KILN_RECOMPUTE_NONE || best.recipe.offload_modules);
	int len = snprintf(buf, sizeof buf,
	                   "--moe-paged-stash --moe-expert-rank-capacity-factor %g "
	                   "--moe-paged-stash-buffer-size-factor-cuda %g "
	                   "--moe-paged-stash-buffer-size-factor-cpu %g "
	                   "--moe-paged-stash-page-size %d%s%s",
	                   best.fl.rank_capacity_factor, best.fl.cuda_factor, best.fl.cpu_factor,
	                   best.fl.page_rows, has_rec ? " " : "", has_rec ? rec : "");
	if (len < 0 || (size_t)len >= sizeof buf)
		return -1;
	char *r = kiln_arena_alloc(a, (size_t)len + 1);
	if (!r)
		return -1;
	memcpy(r, buf, (size_t)len + 1);
	p->recipe = r;
	return 0;
}

/* The first attempt's bytes: the paged units leave the plan's resident
 * bytes (they are in the stash, counted with the stage's static bytes),
 * and during an MoE layer its compute buffers (forward) and reloaded
 * tensors (backward) take the budget's rows of every paged tensor
 * (PagedStashManager.reload_paged_tensors allocates original_shape,
 * paged_stash.py:516-549). Then the rerun: the same plan with nothing
 * paged, every unit at its rows. */
static int stash_forms(kiln_sim_policy *p, kiln_arena *a)
{
	const kiln_compilation *c = p->c;
	kiln_sim_policy *r = kiln_arena_alloc(a, sizeof *r);
	if (!r)
		return -1;
	*r = *p;
	r->stash = NULL;
	r->has_stash = NULL;
	r->rerun = NULL;
	/* The same actions: the cost cache is shared (one thread runs both). */
	r->forms = kiln_arena_alloc(a, sizeof(plan_form *) * (size_t)(c->n_sets + 1));
	if (!r->forms)
		return -1;
	r->hot_forms = r->forms;
	if (p->n_vars > 0) {
		/* The same costs, their own forms. */
		r->vars = kiln_arena_alloc(a, sizeof(variant) * (size_t)p->n_vars);
		if (!r->vars)
			return -1;
		memcpy(r->vars, p->vars, sizeof(variant) * (size_t)p->n_vars);
	}
	for (int32_t k = 0; k < c->n_sets; k++) {
		const kiln_unit_set *set = &c->sets[k];
		r->forms[k] = kiln_arena_alloc(a, sizeof(plan_form));
		if (!r->forms[k])
			return -1;
		*r->forms[k] = *p->forms[k];
		if (set->kind != KILN_LAYER_MOE || !p->has_stash[set->stage])
			continue;
		const kiln_sim_stash *st = &p->stash[set->stage];
		uint64_t paged = 0;
		for (int32_t u = 0; u < set->n_units; u++)
			if (stash_paged_unit(c, &set->units[u]))
				paged += set->units[u].bytes.per_n;
		p->forms[k]->res_per_n -= (double)paged;
		p->forms[k]->tr_base += st->row_bytes * st->budget_rows;
		/* The offload groups' plans of the set, alike (the rerun keeps
		 * its own copies, unchanged). */
		for (int32_t v = 0; v < p->n_vars; v++)
			if (p->vars[v].set == k) {
				p->vars[v].form.res_per_n -= (double)paged;
				p->vars[v].form.tr_base += st->row_bytes * st->budget_rows;
			}
	}
	p->rerun = r;
	return 0;
}

int kiln_sim_policy_new(kiln_sim_policy_kind k, const kiln_compilation *c, const kiln_rt *rt,
                        double capacity_factor, kiln_arena *a, FILE *err, kiln_sim_policy **out)
{
	return kiln_sim_policy_new_stash(k, c, rt, capacity_factor, NULL, a, err, out);
}

int kiln_sim_policy_new_stash(kiln_sim_policy_kind k, const kiln_compilation *c, const kiln_rt *rt,
                              double capacity_factor, const kiln_sim_stash_flags *flags,
                              kiln_arena *a, FILE *err, kiln_sim_policy **out)
{
	*out = NULL;
	kiln_sim_policy *p = kiln_arena_alloc(a, sizeof *p);
	if (!p)
		return -1;
	memset(p, 0, sizeof *p);
	p->kind = k;
	p->cf = kiln_sim_capacity_factor(c->model, capacity_factor);
	p->c = c;
	p->serial = k == KILN_SIM_KILN_NO_OVERLAP || k == KILN_SIM_KILN_STATIC_SERIAL;
	if (k == KILN_SIM_KILN || k == KILN_SIM_KILN_NO_OVERLAP || k == KILN_SIM_KILN_NO_OFFLOAD) {
		p->rt = rt;
		if (!p->rt) {
			fprintf(err, "kilnc: error: simulate: policy %s needs its plan blob\n",
			        kiln_sim_policy_name(k));
			return -1;
		}
		p->frontier_costs =
		    kiln_arena_alloc(a, sizeof(cost *) * (size_t)(c->pool->n_frontiers + 1));
		if (!p->frontier_costs)
			return -1;
		p->plan_forms = kiln_arena_alloc(a, sizeof(plan_form *) * (size_t)c->n_sets *
		                                        (size_t)(c->pool->n + 1));
		size_t n_tables = (size_t)c->n_sets * (size_t)c->n_buckets;
		p->last_point = kiln_arena_alloc(a, sizeof *p->last_point * (n_tables + 1));
		if (!p->plan_forms || !p->last_point)
			return -1;
		for (size_t i = 0; i < n_tables; i++)
			p->last_point[i][0] = p->last_point[i][1] = -1;
		p->group_costs = kiln_arena_alloc(a, sizeof(cost) * (n_tables + 1));
		if (!p->group_costs)
			return -1;
		for (size_t i = 0; i < n_tables; i++)
			p->group_costs[i] = (cost){NAN, NAN, NAN};
	} else if (k == KILN_SIM_ORACLE) {
		/* Decides a stage at a time through sim/oracle.c (sim.c). */
		if (kiln_sim_oracle_new(c, a, err, &p->oracle) != 0)
			return -1;
	} else if (prepare_static(p, a) != 0) {
		return -1;
	} else if (k == KILN_SIM_MEGATRON_PAGED_STASH && stash_prepare(p, flags, a, err) != 0) {
		return -1;
	} else {
		p->forms = kiln_arena_alloc(a, sizeof(plan_form *) * (size_t)(c->n_sets + 1));
		p->hot_forms = kiln_arena_alloc(a, sizeof(plan_form *) * (size_t)(c->n_sets + 1));
		if (!p->forms || !p->hot_forms)
			return -1;
		for (int32_t s = 0; s < c->n_sets; s++) {
			p->forms[s] =
			    form_build(p, s, p->actions[s], kiln_arena_alloc(a, sizeof(plan_form)));
			p->hot_forms[s] = p->hot_actions
			                      ? form_build(p, s, p->hot_actions[s],
			                                   kiln_arena_alloc(a, sizeof(plan_form)))
			                      : p->forms[s];
			if (!p->forms[s] || !p->hot_forms[s])
				return -1;
		}
		if ((k == KILN_SIM_MINDSPEED && mindspeed_block(p, a) != 0) ||
		    (k == KILN_SIM_MEGATRON_PAGED_STASH && stash_forms(p, a) != 0))
			return -1;
	}
	*out = p;
	return 0;
}

/* A static plan's cost at a bucket, scheduled on first use (the cost
 * arrays belong to the policy, which one thread uses at a time). A failed
 * schedule leaves the cost 0 (never reached for a valid compilation). */
static const cost *static_cost(const kiln_sim_policy *p, cost *costs, const uint8_t *actions,
                               int32_t set, int32_t b)
{
	cost *co = &costs[(size_t)set * p->c->n_buckets + b];
	if (isnan(co->exposed_us) && cost_of(p->c, set, b, actions, co) != 0)
		*co = (cost){0, 0, 0};
	return co;
}

static void fill(const kiln_sim_policy *p, const plan_form *f, double n, const cost *co,
                 kiln_sim_choice *out)
{
	if (p->c->sets[f->set].kind != KILN_LAYER_MOE)
		n = 0;
	double resident = f->res_base + f->res_per_n * n;
	double transient = f->tr_base + f->tr_per_n * n;
	double ex = p->serial ? co->serial_us : co->exposed_us;
	double rec = co->recompute_us < ex ? co->recompute_us : ex;
	/* Whole bytes, as a device holds them (and as accounting counts). */
	double ws = f->ws_base + f->ws_per_n * n;
	*out = (kiln_sim_choice){.resident_bytes = ceil(resident - 1e-6),
	                         .transient_bytes = ceil(transient - 1e-6),
	                         .workspace_bytes = ceil(ws - 1e-6),
	                         .exposed_us = ex,
	                         .recompute_us = rec,
	                         .copy_us = ex - rec};
}

/* The form of an adaptive policy's plan, built on first use (one thread
 * at a time runs a policy); when it cannot be kept, built in tmp. */
static const plan_form *plan_form_of(const kiln_sim_policy *p, int32_t set, const kiln_plan *plan,
                                     plan_form *tmp)
{
	int32_t n = p->c->pool->n;
	plan_form **slot = plan->plan >= 0 && plan->plan < n
	                       ? &p->plan_forms[(size_t)set * (size_t)n + (size_t)plan->plan]
	                       : NULL;
	if (slot && !*slot)
		*slot = form_build(p, set, plan->actions, malloc(sizeof(plan_form)));
	return slot && *slot ? *slot : form_build(p, set, plan->actions, tmp);
}

void kiln_sim_policy_decide(const kiln_sim_policy *p, int32_t set, int32_t layer, double n,
                            double free_bytes, uint32_t pending, uint32_t microbatch,
                            double held_bytes, kiln_sim_choice *out)
{
	kiln_sim_policy_decide_group(p, set, layer, n, free_bytes, pending, microbatch, held_bytes,
	                             NULL, 0, out);
}

void kiln_sim_policy_decide_group(const kiln_sim_policy *p, int32_t set, int32_t layer, double n,
                                  double free_bytes, uint32_t pending, uint32_t microbatch,
                                  double held_bytes, const uint32_t *group_rows, int32_t group_size,
                                  kiln_sim_choice *out)
{
	const kiln_compilation *c = p->c;
	const kiln_unit_set *S = &c->sets[set];
	if (p->oracle) {
		/* The oracle decides whole stages (kiln_sim_oracle_plan). */
		*out = (kiln_sim_choice){.over_budget = 1};
		return;
	}
	const variant *v = p->rt ? NULL : group_variant(p, layer, microbatch);
	if (v && v->set == set) {
		/* Megatron's offload groups: this micro-batch's plan of the
		 * layer (passes/baselines.c, stage_groups). */
		double r;
		n = kiln_sim_policy_rows(p, set, n);
		fill(p, &v->form, n, variant_cost(p, v, kiln_sim_policy_bucket(c, set, n, &r)),
		     out);
		return;
	}
	if (!p->rt) {
		/* A static policy, its full-recompute layers included;
		 * mindspeed without its trigger state: the untriggered plan. */
		kiln_sim_policy_decide_triggered(p, set, layer, n, 0, out);
		return;
	}
	kiln_query q = {.stage = S->stage,
	                .layer = layer,
	                .total_rows = u64_sat(kiln_sim_whole_rows(n)),
	                .free_bytes = u64_sat(free_bytes),
	                .pending = pending,
	                .microbatch = microbatch,
	                .held_bytes = u64_sat(held_bytes),
	                .group_rows = group_rows,
	                .group_size = group_rows ? group_size : 0};
	kiln_plan plan;
	if (kiln_rt_select(p->rt, &q, &plan) != 0) {
		*out = (kiln_sim_choice){.over_budget = 1};
		return;
	}
	if (plan.flags & KILN_PLAN_GROUP_FALLBACK) {
		/* The group's plan (full recompute's or a cheaper one that
		 * never holds more), priced as the static policies price a plan
		 * (static_cost at the bucket of n). */
		double r;
		int32_t b = kiln_sim_policy_bucket(c, set, n, &r);
		const cost *co = static_cost(p, p->group_costs, plan.actions, set, b);
		plan_form tmp;
		fill(p, plan_form_of(p, set, &plan, &tmp), n, co, out);
		out->over_budget = (plan.flags & KILN_PLAN_OVER_BUDGET) != 0;
		return;
	}
	/* The plan's cost at the bucket, by its frontier point (the blob and
	 * the compilation number plans alike). */
	const kiln_plan_table *t = kiln_plan_table_of(c, set, plan.bucket);
	cost co = {plan.exposed_us, plan.exposed_us, 0};
	int32_t k = 0, *last = NULL;
	if (plan.bucket >= 0 && plan.bucket < c->n_buckets)
		last = p->last_point[(size_t)set * (size_t)c->n_buckets + (size_t)plan.bucket];
	if (last && last[0] == plan.plan && last[0] >= 0) {
		k = last[1];
	} else {
		while (k < t->n_points && t->plan[k] != plan.plan)
			k++;
		if (last && k < t->n_points)
			last[0] = plan.plan, last[1] = k;
	}
	if (k < t->n_points && p->frontier_costs) {
		cost **fcs = p->frontier_costs;
		int32_t fid = t->frontier_id;
		if (!fcs[fid]) {
			/* Computed on first use; one thread at a time runs a
			 * policy (kiln_sim_run). */
			fcs[fid] = calloc((size_t)t->frontier->n_points, sizeof(cost));
			if (fcs[fid])
				for (int32_t i = 0; i < t->frontier->n_points; i++)
					fcs[fid][i].exposed_us = NAN;
		}
		cost *slot = fcs[fid] ? &fcs[fid][t->point[k]] : NULL;
		if (slot && isnan(slot->exposed_us)) {
			cost fresh;
			/* The plan's cost scheduled at this bucket, as the static
			 * policies' are (the table's figure, which the runtime
			 * ranks by, was scheduled at the first load using it). */
			if (cost_of(c, set, plan.bucket, c->pool->actions[plan.plan], &fresh) == 0)
				*slot = fresh;
		}
		if (slot && !isnan(slot->exposed_us))
			co = *slot;
	}
	plan_form tmp;
	fill(p, plan_form_of(p, set, &plan, &tmp), n, &co, out);
	out->over_budget = (plan.flags & KILN_PLAN_OVER_BUDGET) != 0;
}

void kiln_sim_policy_decide_triggered(const kiln_sim_policy *p, int32_t set, int32_t layer,
                                      double n, int triggered, kiln_sim_choice *out)
{
	double r;
	n = kiln_sim_policy_rows(p, set, n);
	int32_t b = kiln_sim_policy_bucket(p->c, set, n, &r);
	int role = p->full_layer && layer >= 0 && layer < p->n_model_layers ? p->full_layer[layer]
	                                                                    : FULL_NONE;
	if (role != FULL_NONE) {
		/* A chunk's later layers cost what a full layer costs (each
		 * layer's forward re-runs once) and keep nothing. */
		fill(p, role == FULL_CHUNK_REST ? p->chunk_forms[set] : p->full_forms[set], n,
		     static_cost(p, p->full_costs, p->full_actions[set], set, b), out);
		out->chunk = role == FULL_CHUNK_HEAD ? 1 : role == FULL_CHUNK_REST ? 2 : 0;
	} else if (triggered && p->hot_actions && p->c->sets[set].kind == KILN_LAYER_MOE)
		fill(p, p->hot_forms[set], n,
		     static_cost(p, p->hot_costs, p->hot_actions[set], set, b), out);
	else
		fill(p, p->forms[set], n, static_cost(p, p->costs, p->actions[set], set, b), out);
}

int kiln_sim_policy_trigger(const kiln_sim_policy *p, double *out_multiple)
{
	if (p->kind != KILN_SIM_MINDSPEED)
		return 0;
	*out_multiple = KILN_SIM_MINDSPEED_TRIGGER;
	return 1;
}

int kiln_sim_policy_exposed_bound(const kiln_sim_policy *p, int32_t set, const uint64_t *buckets,
                                  int cold, int hot, double *out)
{
	/* The paged stash's time and bytes depend on the pages its earlier
	 * layers hold: followed as an adaptive policy is. */
	if (p->rt || !p->costs || p->kind == KILN_SIM_MEGATRON_PAGED_STASH)
		return -1;
	/* Without a second plan, the one plan is the cold one. */
	cold |= !p->hot_actions;
	hot &= p->hot_actions != NULL;
	int32_t nb =
	    p->c->n_buckets < KILN_PLAN_MAX_BUCKETS ? p->c->n_buckets : KILN_PLAN_MAX_BUCKETS;
	double most = 0;
	for (int32_t k = 0; k < nb; k++) {
		if (!(buckets[k / KILN_SIM_BUCKET_WORD_BITS] >> (k % KILN_SIM_BUCKET_WORD_BITS) &
		      1))
			continue;
		const cost *co;
		double ex;
		if (cold) {
			co = static_cost(p, p->costs, p->actions[set], set, k);
			ex = p->serial ? co->serial_us : co->exposed_us;
			most = ex > most ? ex : most;
		}
		if (hot) {
			co = static_cost(p, p->hot_costs, p->hot_actions[set], set, k);
			ex = p->serial ? co->serial_us : co->exposed_us;
			most = ex > most ? ex : most;
		}
		if (p->full_layer && p->full_layers > 0) {
			co = static_cost(p, p->full_costs, p->full_actions[set], set, k);
			ex = p->serial ? co->serial_us : co->exposed_us;
			most = ex > most ? ex : most;
		}
		for (int32_t v = 0; v < p->n_vars; v++) {
			if (p->vars[v].set != set)
				continue;
			co = variant_cost(p, &p->vars[v], k);
			ex = p->serial ? co->serial_us : co->exposed_us;
			most = ex > most ? ex : most;
		}
	}
	*out = most;
	return 0;
}

int kiln_sim_policy_bytes_bound(const kiln_sim_policy *p, int32_t set, double *res_base,
                                double *res_per_n, double *tr_base, double *tr_per_n)
{
	if (p->rt || !p->forms || p->kind == KILN_SIM_MEGATRON_PAGED_STASH)
		return -1;
	const plan_form *fs[4] = {p->forms[set], p->hot_forms[set],
	                          p->full_forms && p->full_layers > 0 ? p->full_forms[set]
	                                                              : p->forms[set],
	                          p->chunk_forms ? p->chunk_forms[set] : p->forms[set]};
	*res_base = *res_per_n = *tr_base = *tr_per_n = 0;
	/* Padded to capacity, a set's rows are the same at every load. */
	const kiln_unit_set *S = &p->c->sets[set];
	double pad = p->kind == KILN_SIM_MEGATRON_CAPACITY && S->kind == KILN_LAYER_MOE
	                 ? p->cf * p->c->graph->layers[S->layer].n_balanced
	                 : -1;
	for (int32_t j = 0; j < 4 + p->n_vars; j++) {
		if (j >= 4 && p->vars[j - 4].set != set)
			continue;
		const plan_form *f = j < 4 ? fs[j] : &p->vars[j - 4].form;
		double rb = f->res_base, rn = f->res_per_n, tb = f->tr_base, tn = f->tr_per_n;
		if (pad >= 0) {
			/* Rounded up as fill() rounds a decision. */
			rb = ceil(rb + rn * pad - 1e-6), rn = 0;
			tb = ceil(tb + tn * pad - 1e-6), tn = 0;
		}
		*res_base = rb > *res_base ? rb : *res_base;
		*res_per_n = rn > *res_per_n ? rn : *res_per_n;
		*tr_base = tb > *tr_base ? tb : *tr_base;
		*tr_per_n = tn > *tr_per_n ? tn : *tr_per_n;
	}
	if (p->chunk_layers > 1) {
		/* A uniform chunk's backward holds up to chunk_layers layers'
		 * transients at once (sim.c sums them), each within the line
		 * above and a byte of rounding: the caller adds one byte. */
		double k = (double)p->chunk_layers;
		*tr_base = *tr_base * k + (k - 1);
		*tr_per_n *= k;
	}
	return 0;
}

double kiln_sim_policy_rows(const kiln_sim_policy *p, int32_t set, double n)
{
	if (p->kind != KILN_SIM_MEGATRON_CAPACITY || set < 0)
		return n;
	const kiln_unit_set *S = &p->c->sets[set];
	if (S->kind != KILN_LAYER_MOE)
		return n;
	return p->cf * p->c->graph->layers[S->layer].n_balanced;
}

const char *kiln_sim_policy_flags(const kiln_sim_policy *p)
{
	return p->flags;
}

double kiln_sim_policy_cf(const kiln_sim_policy *p)
{
	return p->kind == KILN_SIM_MEGATRON_CAPACITY ? p->cf : 0;
}

kiln_sim_oracle *kiln_sim_policy_oracle(const kiln_sim_policy *p)
{
	return p ? p->oracle : NULL;
}

void kiln_sim_policy_free(kiln_sim_policy *p)
{
	if (p)
		kiln_sim_oracle_free(p->oracle);
	if (!p || !p->frontier_costs)
		return;
	for (int32_t i = 0; i <= p->c->pool->n_frontiers; i++)
		free(p->frontier_costs[i]);
	size_t n_forms = (size_t)p->c->n_sets * (size_t)p->c->pool->n;
	for (size_t i = 0; p->plan_forms && i < n_forms; i++)
		free(p->plan_forms[i]);
}
