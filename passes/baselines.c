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
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

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
    /* models: replaced by the chosen flags in kiln_pass_baselines */
    [KILN_BASELINE_MEGATRON] = {"megatron", "Megatron-Core", KILN_BASELINE_DESIGN_LOAD},
    [KILN_BASELINE_STATIC_AGGRESSIVE] = {"static-aggressive",
                                         "keep nearly everything: Megatron-Core "
                                         "--recompute-granularity selective "
                                         "--recompute-modules layernorm",
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

/* A one-point "table" holding a fixed plan's exact bytes at load factor
 * load for `layers` layers of the set, so the budget's fit test can judge
 * it. */
typedef struct fixed_plan {
	kiln_unit_set set;
	kiln_plan_table t;
	kiln_frontier f;
	kiln_plan_point p;
	kiln_plan_bytes b;
	int32_t point;
} fixed_plan;

/* The bytes of actions on set i at n rows, with what runs beside the
 * recipe (the paged stash): units held outside it leave their per-row
 * bytes, and each layer's transient grows. */
static void beside_bytes(const kiln_unit_set *set, int32_t i, const uint8_t *actions, double n,
                         const kiln_megatron_beside *bs, kiln_plan_bytes *out)
{
	kiln_plan_bytes_at(set, actions, n, out);
	const uint8_t *outside = bs && bs->outside ? bs->outside[i] : NULL;
	for (int32_t u = 0; outside && u < set->n_units; u++)
		if (outside[u] && actions[u] == KILN_ACT_KEEP)
			out->resident -= (double)set->units[u].bytes.per_n * n;
	if (bs && bs->transient_bytes)
		out->transient += bs->transient_bytes[i];
}

static void fixed_table(const kiln_compilation *c, int32_t i, const uint8_t *actions, double load,
                        int32_t layers, const kiln_megatron_beside *bs, fixed_plan *out)
{
	const kiln_unit_set *set = &c->sets[i];
	memset(out, 0, sizeof *out);
	out->set = *set;
	out->set.n_layers = layers;
	double n = set->kind == KILN_LAYER_MOE ? load * c->graph->layers[set->layer].n_balanced : 0;
	beside_bytes(set, i, actions, n, bs, &out->b);
	out->f.points = &out->p;
	out->f.n_points = 1;
	out->t.set = &out->set;
	out->t.frontier = &out->f;
	out->t.n_points = 1;
	out->t.point = &out->point;
	out->t.bytes = &out->b;
}

/* Whether stage s fits with every in-flight micro-batch when its unit sets
 * take tail[i] on n_tail[i] layers and head[i] (when set) on n_head[i]. */
static bool stage_fits(const kiln_compilation *c, int32_t s, double load, uint8_t *const *tail,
                       uint8_t *const *head, const int32_t *n_tail, const int32_t *n_head,
                       const kiln_megatron_beside *bs)
{
	const kiln_stage_budget *bu = &c->budgets[s];
	fixed_plan fp[8];
	const kiln_plan_table *tabs[8];
	int32_t n = 0, pts[8] = {0};
	for (int32_t i = 0; i < c->n_sets && n < 7; i++) {
		if (c->sets[i].stage != s)
			continue;
		if (n_tail[i] > 0 || !head || !head[i]) {
			fixed_table(c, i, tail[i], load, n_tail[i], bs, &fp[n]);
			tabs[n] = &fp[n].t;
			n++;
		}
		if (head && head[i] && n_head[i] > 0) {
			fixed_table(c, i, head[i], load, n_head[i], bs, &fp[n]);
			tabs[n] = &fp[n].t;
			n++;
		}
	}
	double reserved = bs && bs->reserved_bytes ? bs->reserved_bytes[s] : 0;
	return kiln_budget_cheapest_fit(tabs, n, bu->fixed_bytes, bu->inflight,
	                                bu->capacity_bytes - bu->static_bytes - reserved, 0,
	                                pts) == 0;
}

/* Does a baseline's plan fit every stage with every in-flight micro-batch
 * at its design load? */
static bool baseline_fits(const kiln_compilation *c, const kiln_baseline *bl, kiln_arena *a)
{
	int32_t ns = c->n_sets > 0 ? c->n_sets : 1;
	uint8_t **tail = kiln_arena_alloc(a, sizeof(uint8_t *) * (size_t)ns);
	uint8_t **head = kiln_arena_alloc(a, sizeof(uint8_t *) * (size_t)ns);
	int32_t *nt = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)ns);
	int32_t *nh = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)ns);
	if (!tail || !head || !nt || !nh)
		return false;
	for (int32_t i = 0; i < c->n_sets; i++) {
		tail[i] = c->pool->actions[bl->plan[i]];
		head[i] = bl->head_plan ? c->pool->actions[bl->head_plan[i]] : NULL;
		nt[i] = c->sets[i].n_layers;
		nh[i] = 0;
	}
	if (bl->head_plan)
		for (int32_t l = 0; l < c->graph->n_layers; l++)
			for (int32_t i = 0; i < c->n_sets; i++)
				if (c->sets[i].stage == c->graph->layers[l].stage &&
				    c->sets[i].kind == c->graph->layers[l].kind &&
				    kiln_megatron_in_block(c->graph, l, bl->block_layers)) {
					nt[i]--;
					nh[i]++;
				}
	for (int32_t s = 0; s < c->graph->n_stages; s++)
		if (!stage_fits(c, s, bl->design_load, tail, head, nt, nh, NULL))
			return false;
	return true;
}

/* ---------------------------------------------------------------- Megatron recipes */

int32_t kiln_megatron_chunk_pos(const kiln_ir_graph *g, int32_t l)
{
	const kiln_ir_layer *ly = &g->layers[l];
	if (ly->index < 0)
		return -1;
	int32_t ord = 0;
	for (int32_t j = g->stages[ly->stage].layer_begin; j < l; j++)
		ord += g->layers[j].index >= 0 && g->layers[j].chunk == ly->chunk;
	return ord;
}

bool kiln_megatron_in_block(const kiln_ir_graph *g, int32_t l, int32_t block_layers)
{
	int32_t ord = kiln_megatron_chunk_pos(g, l);
	return ord >= 0 && block_layers > 0 && ord < block_layers;
}

/* The unit set of graph layer l (its stage's set of its kind), or -1. */
static int32_t set_of_layer(const kiln_compilation *c, int32_t l)
{
	const kiln_ir_layer *ly = &c->graph->layers[l];
	for (int32_t i = 0; i < c->n_sets; i++)
		if (c->sets[i].stage == ly->stage && c->sets[i].kind == ly->kind)
			return i;
	return -1;
}

/* Megatron skips offloading tensors below min_offloaded_tensor_size
 * elements (transformer_config.py:1343, default 1M;
 * fine_grained_activation_offload.py:1084). */
#define MIN_OFFLOADED_ELEMENTS 1048576.0

/* What every recipe evaluation shares: per set the module uses of its
 * units, the set's rows at the load, how many of its layers fall in a
 * block of k layers, and per stage the compute time of one micro-batch. */
typedef struct recipes {
	const kiln_compilation *c;
	double load;
	int32_t bucket;
	kiln_megatron_uses **uses; /* per set, per unit */
	double *n;                 /* per set: local expert rows (0 for dense) */
	double *base_us;           /* per stage */
	int32_t max_block;         /* most transformer layers of one chunk on a stage */
	int32_t **in_block;        /* per set, per k in 0..max_block: its layers in the block */
	double min_offload_bytes;
	const kiln_megatron_beside *beside; /* NULL: nothing beside the recipe */
	/* the search's memo of scheduled exposed times, per set */
	struct memo **memo;
	int32_t n_memo;
	int64_t scheduled;
	kiln_arena *a;
} recipes;

typedef struct memo {
	uint64_t hash;
	uint8_t *act;
	double exposed_us;
	struct memo *next;
} memo;
#define MEMO_SLOTS 1024

static const kiln_plan_table *table_at(const kiln_compilation *c, int32_t set, int32_t bucket)
{
	return &c->tables[(size_t)set * (size_t)c->n_buckets + (size_t)bucket];
}

static int recipes_init(recipes *w, const kiln_compilation *c, double load, bool memoize,
                        kiln_arena *a)
{
	memset(w, 0, sizeof *w);
	const kiln_ir_graph *g = c->graph;
	int32_t ns = c->n_sets > 0 ? c->n_sets : 1;
	w->c = c;
	w->a = a;
	w->load = load;
	w->bucket = kiln_plan_bucket_of(c->buckets, c->n_buckets, load);
	if (w->bucket >= c->n_buckets)
		w->bucket = c->n_buckets - 1;
	w->min_offload_bytes = MIN_OFFLOADED_ELEMENTS * (double)kiln_model_act_bytes(c->model);
	w->uses = kiln_arena_alloc(a, sizeof(kiln_megatron_uses *) * (size_t)ns);
	w->n = kiln_arena_alloc(a, sizeof(double) * (size_t)ns);
	w->base_us = kiln_arena_alloc(a, sizeof(double) * (size_t)(g->n_stages + 1));
	w->in_block = kiln_arena_alloc(a, sizeof(int32_t *) * (size_t)ns);
	if (!w->uses || !w->n || !w->base_us || !w->in_block)
		return -1;
	if (memoize) {
		/* Keyed by the table's frontier: tables that share one share
		 * their instance, so a plan's schedule (sim/policy.c prices
		 * them alike). */
		w->n_memo = c->pool && c->pool->n_frontiers > 0 ? c->pool->n_frontiers : 1;
		w->memo = kiln_arena_alloc(a, sizeof(memo *) * (size_t)w->n_memo * MEMO_SLOTS);
		if (!w->memo)
			return -1;
		memset(w->memo, 0, sizeof(memo *) * (size_t)w->n_memo * MEMO_SLOTS);
	}
	for (int32_t s = 0; s < g->n_stages; s++) {
		int32_t per_chunk[64] = {0};
		w->base_us[s] = 0;
		for (int32_t l = g->stages[s].layer_begin; l < g->stages[s].layer_end; l++) {
			const kiln_ir_layer *ly = &g->layers[l];
			double nl = ly->kind == KILN_LAYER_MOE ? load * ly->n_balanced : 0;
			for (int32_t o = ly->op_begin; o < ly->op_end; o++)
				w->base_us[s] += kiln_cost_op_time_us(g, &g->ops[o], nl);
			if (ly->index >= 0 && ly->chunk >= 0 && ly->chunk < 64 &&
			    ++per_chunk[ly->chunk] > w->max_block)
				w->max_block = per_chunk[ly->chunk];
		}
	}
	for (int32_t i = 0; i < c->n_sets; i++) {
		const kiln_unit_set *S = &c->sets[i];
		w->n[i] = S->kind == KILN_LAYER_MOE ? load * g->layers[S->layer].n_balanced : 0;
		w->uses[i] =
		    kiln_arena_alloc(a, sizeof(kiln_megatron_uses) * (size_t)(S->n_units + 1));
		w->in_block[i] = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(w->max_block + 1));
		if (!w->uses[i] || !w->in_block[i])
			return -1;
		/* The representative layer's tensor of each unit. */
		for (int32_t u = 0; u < S->n_units; u++)
			kiln_megatron_tensor_uses(g, S->units[u].tensor, &w->uses[i][u]);
		for (int32_t k = 0; k <= w->max_block; k++) {
			w->in_block[i][k] = 0;
			for (int32_t l = 0; l < g->n_layers; l++)
				w->in_block[i][k] += g->layers[l].stage == S->stage &&
				                     g->layers[l].kind == S->kind &&
				                     kiln_megatron_in_block(g, l, k);
		}
	}
	return 0;
}

/* One set's actions under selective modules rmods (KILN_MRC bits) and
 * offload modules omods (KILN_MOF bits), or full recompute: a module's
 * dropped tensors are recomputed, and of the rest those an offload
 * context saves, at least Megatron's minimum size at the load, are
 * offloaded. */
static void set_actions(const recipes *w, int32_t i, uint32_t rmods, uint32_t omods, bool full,
                        uint8_t *out)
{
	const kiln_unit_set *S = &w->c->sets[i];
	for (int32_t u = 0; u < S->n_units; u++) {
		const kiln_unit *un = &S->units[u];
		const kiln_megatron_uses *us = &w->uses[i][u];
		bool input = (un->flags & KILN_UNIT_LAYER_INPUT) != 0;
		out[u] = KILN_ACT_KEEP;
		if (w->beside && w->beside->outside && w->beside->outside[i] &&
		    w->beside->outside[i][u])
			continue; /* held outside the recipe: kept */
		if (!input && (full || kiln_megatron_drops(us, rmods)))
			out[u] = KILN_ACT_RECOMPUTE;
		else if (!full && (us->offloaded_by & omods) &&
		         kiln_lin_at(un->bytes, w->n[i]) >= w->min_offload_bytes)
			out[u] = KILN_ACT_OFFLOAD;
	}
}

static uint64_t hash_actions(const uint8_t *act, int32_t n)
{
	uint64_t h = 0xcbf29ce484222325u;
	for (int32_t u = 0; u < n; u++)
		h = (h ^ act[u]) * 0x100000001b3u;
	return h;
}

/* Scheduled exposed time of one layer of set i under act at the load's
 * bucket; memoised when w has a memo. -1 on failure. */
static double exposed_of(recipes *w, int32_t i, const uint8_t *act)
{
	const kiln_unit_set *S = &w->c->sets[i];
	bool any = false;
	for (int32_t u = 0; u < S->n_units; u++)
		any |= act[u] != KILN_ACT_KEEP;
	if (!any)
		return 0;
	memo **slot = NULL;
	uint64_t h = 0;
	const kiln_plan_table *t = table_at(w->c, i, w->bucket);
	if (w->memo && t->frontier_id >= 0 && t->frontier_id < w->n_memo) {
		h = hash_actions(act, S->n_units);
		slot = &w->memo[(size_t)t->frontier_id * MEMO_SLOTS + (h & (MEMO_SLOTS - 1))];
		for (memo *e = *slot; e; e = e->next)
			if (e->hash == h && memcmp(e->act, act, (size_t)S->n_units) == 0)
				return e->exposed_us;
	}
	kiln_arena *scratch = kiln_arena_new();
	double ex = -1, serial;
	if (scratch && kiln_interleave_exposed(w->c, t, act, scratch, &ex, &serial) != 0)
		ex = -1;
	kiln_arena_free(scratch);
	w->scheduled++;
	if (slot && ex >= 0) {
		memo *e = kiln_arena_alloc(w->a, sizeof *e);
		uint8_t *copy = kiln_arena_alloc(w->a, (size_t)S->n_units + 1);
		if (e && copy) {
			memcpy(copy, act, (size_t)S->n_units);
			*e = (memo){.hash = h, .act = copy, .exposed_us = ex, .next = *slot};
			*slot = e;
		}
	}
	return ex;
}

/* The recipe's shape, decoded: selective modules, offload modules (on the
 * layers outside a block), full recompute and its block (0: every layer). */
typedef struct shape {
	uint32_t rmods, omods;
	bool full;
	int32_t block;
	int32_t chunk; /* full uniform: layers per checkpointed chunk (0, 1: one) */
} shape;

static shape shape_of(const kiln_megatron *r)
{
	shape sh = {.omods = r->offload_modules};
	if (r->recompute == KILN_RECOMPUTE_SELECTIVE)
		sh.rmods = r->recompute_modules;
	if (r->recompute == KILN_RECOMPUTE_FULL) {
		sh.full = true;
		if (r->recompute_method == KILN_RECOMPUTE_BLOCK && r->recompute_num_layers > 0)
			sh.block =
			    (int32_t)(r->recompute_num_layers < INT32_MAX ? r->recompute_num_layers
			                                                  : INT32_MAX);
		if (r->recompute_method == KILN_RECOMPUTE_UNIFORM && r->recompute_num_layers > 1)
			sh.chunk =
			    (int32_t)(r->recompute_num_layers < INT32_MAX ? r->recompute_num_layers
			                                                  : INT32_MAX);
	}
	return sh;
}

/* Fills tail/head (per set, n_units bytes each, preallocated; head NULL
 * entries when there is no block) and the layer counts for shape sh. */
static void shape_actions(const recipes *w, const shape *sh, uint8_t **tail, uint8_t **head,
                          int32_t *n_tail, int32_t *n_head, bool *out_block)
{
	const kiln_compilation *c = w->c;
	int32_t k = sh->block < w->max_block ? sh->block : w->max_block;
	bool block = sh->full && sh->block > 0 && k < w->max_block;
	*out_block = block;
	for (int32_t i = 0; i < c->n_sets; i++) {
		if (block) {
			set_actions(w, i, 0, sh->omods, false, tail[i]);
			set_actions(w, i, 0, 0, true, head[i]);
			n_head[i] = w->in_block[i][k];
			n_tail[i] = c->sets[i].n_layers - n_head[i];
		} else {
			set_actions(w, i, sh->rmods, sh->omods, sh->full, tail[i]);
			n_tail[i] = c->sets[i].n_layers;
			n_head[i] = 0;
		}
	}
}

/* Whether stage s fits at w's load under full recompute with the uniform
 * method in chunks of `chunk` transformer layers, tail[i] being set i's
 * full-recompute plan. Megatron-LM (megatron/core/recompute.py:157-166 at
 * d98e8a64) checkpoints each run of `chunk` consecutive layers of a model
 * chunk as one tensor_parallel.checkpoint: its forward saves the chunk's
 * input alone (tensor_parallel/random.py:616-628) and its backward re-runs
 * the whole chunk's forward with grad, then runs the chunk's backward
 * (random.py:656-668). So per micro-batch only the chunks' first layers
 * keep their input, and the chunk in backward holds every tensor its
 * layers save at once (the later layers' inputs among them) beside the
 * largest workspace of one of its ops. Counted as stage_fits counts a plan
 * (passes/budget.c, choice_bytes): in-flight micro-batches times the
 * resident bytes, plus the largest transient. chunk 1 gives stage_fits'
 * answer for the same plan. */
static bool uniform_fits(const recipes *w, int32_t s, uint8_t *const *tail, int32_t chunk)
{
	const kiln_compilation *c = w->c;
	const kiln_ir_graph *g = c->graph;
	const kiln_stage_budget *bu = &c->budgets[s];
	double resident = bu->fixed_bytes, worst = 0, saved = 0, ws = 0;
	for (int32_t l = g->stages[s].layer_begin; l < g->stages[s].layer_end; l++) {
		int32_t pos = kiln_megatron_chunk_pos(g, l), i = set_of_layer(c, l);
		if (pos < 0 || i < 0)
			continue;
		kiln_plan_bytes b;
		beside_bytes(&c->sets[i], i, tail[i], w->n[i], w->beside, &b);
		/* A full-recompute plan offloads nothing: its transient is
		 * what it rebuilds plus the rebuilding ops' workspace (and
		 * what runs beside the recipe). */
		double lws = b.transient - b.saved;
		if (pos % chunk == 0) {
			resident += b.resident;
			saved = b.saved;
			ws = lws;
		} else {
			saved += b.resident + b.saved;
			ws = lws > ws ? lws : ws;
		}
		worst = saved + ws > worst ? saved + ws : worst;
	}
	const kiln_megatron_beside *bs = w->beside;
	double reserved = bs && bs->reserved_bytes ? bs->reserved_bytes[s] : 0;
	return bu->inflight * resident + worst <= bu->capacity_bytes - bu->static_bytes - reserved;
}

/* Fit and objective of the actions shape_actions made. Returns 0, or -1
 * when a schedule failed. */
static int judge(recipes *w, uint8_t **tail, uint8_t **head, const int32_t *n_tail,
                 const int32_t *n_head, bool block, int32_t chunk, bool *out_fits,
                 double *out_worst, double *out_sum, bool price)
{
	const kiln_compilation *c = w->c;
	bool fits = true;
	for (int32_t s = 0; s < c->graph->n_stages && fits; s++)
		fits = chunk > 1 ? uniform_fits(w, s, tail, chunk)
		                 : stage_fits(c, s, w->load, tail, block ? head : NULL, n_tail,
		                              n_head, w->beside);
	*out_fits = fits;
	*out_worst = *out_sum = 0;
	if (!price)
		return 0;
	for (int32_t s = 0; s < c->graph->n_stages; s++) {
		double ex = 0;
		for (int32_t i = 0; i < c->n_sets; i++) {
			if (c->sets[i].stage != s)
				continue;
			double et = n_tail[i] > 0 ? exposed_of(w, i, tail[i]) : 0;
			double eh = block && n_head[i] > 0 ? exposed_of(w, i, head[i]) : 0;
			if (et < 0 || eh < 0)
				return -1;
			ex += n_tail[i] * et + n_head[i] * eh;
		}
		double t = w->base_us[s] + ex +
		           (w->beside && w->beside->stage_us ? w->beside->stage_us[s] : 0);
		*out_worst = t > *out_worst ? t : *out_worst;
		*out_sum += ex;
	}
	return 0;
}

static int actions_alloc(const kiln_compilation *c, kiln_arena *a, kiln_megatron_actions *out)
{
	int32_t ns = c->n_sets > 0 ? c->n_sets : 1;
	memset(out, 0, sizeof *out);
	out->tail = kiln_arena_alloc(a, sizeof(uint8_t *) * (size_t)ns);
	out->head = kiln_arena_alloc(a, sizeof(uint8_t *) * (size_t)ns);
	out->n_tail = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)ns);
	out->n_head = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)ns);
	if (!out->tail || !out->head || !out->n_tail || !out->n_head)
		return -1;
	for (int32_t i = 0; i < c->n_sets; i++) {
		out->tail[i] = kiln_arena_alloc(a, (size_t)c->sets[i].n_units + 1);
		out->head[i] = kiln_arena_alloc(a, (size_t)c->sets[i].n_units + 1);
		if (!out->tail[i] || !out->head[i])
			return -1;
	}
	return 0;
}

/* Evaluates r with w (memoised or not) into out (allocated here). */
static int eval_with(recipes *w, const kiln_megatron *r, kiln_arena *a, kiln_megatron_actions *out)
{
	if (actions_alloc(w->c, a, out) != 0)
		return -1;
	shape sh = shape_of(r);
	bool block;
	shape_actions(w, &sh, out->tail, out->head, out->n_tail, out->n_head, &block);
	/* Uniform chunks re-run each layer's forward once, as one layer
	 * chunks do: the same time, other bytes (uniform_fits). */
	if (judge(w, out->tail, out->head, out->n_tail, out->n_head, block, sh.chunk, &out->fits,
	          &out->worst_us, &out->exposed_us, true) != 0)
		return -1;
	if (!block)
		for (int32_t i = 0; i < w->c->n_sets; i++)
			out->head[i] = NULL;
	return 0;
}

int kiln_megatron_recipe_eval(const kiln_compilation *c, const kiln_megatron *r, double load,
                              kiln_arena *a, kiln_megatron_actions *out)
{
	recipes w;
	if (recipes_init(&w, c, load, false, a) != 0)
		return -1;
	return eval_with(&w, r, a, out);
}

static int popcount32(uint32_t x)
{
	int n = 0;
	for (; x; x &= x - 1)
		n++;
	return n;
}

/* Flags on a command line: the tie-break among equally good recipes. */
static int flag_count(const kiln_megatron *r)
{
	return popcount32(r->recompute_modules) + popcount32(r->offload_modules) +
	       (r->recompute == KILN_RECOMPUTE_FULL ? 2 : 0) +
	       (r->recompute_method == KILN_RECOMPUTE_BLOCK ? 1 : 0);
}

int kiln_megatron_search(const kiln_compilation *c, double load, kiln_arena *a,
                         kiln_megatron *out_recipe, kiln_megatron_actions *out_actions,
                         kiln_megatron_search_stats *stats)
{
	return kiln_megatron_search_beside(c, load, NULL, a, out_recipe, out_actions, stats);
}

int kiln_megatron_search_beside(const kiln_compilation *c, double load,
                                const kiln_megatron_beside *beside, kiln_arena *a,
                                kiln_megatron *out_recipe, kiln_megatron_actions *out_actions,
                                kiln_megatron_search_stats *stats)
{
	clock_t t0 = clock();
	recipes w;
	kiln_megatron_actions cand;
	if (recipes_init(&w, c, load, true, a) != 0 || actions_alloc(c, a, &cand) != 0)
		return -1;
	w.beside = beside;
	/* The modules that change anything here: a recompute module that
	 * drops a tensor of some unit set, an offload module that moves one
	 * (at Megatron's minimum size). Others give the same plan with one
	 * more flag. fused_group_mlp needs Transformer Engine's op fuser and
	 * excludes expert_fc1 and moe_act (fine_grained_activation_offloading.md,
	 * "Offloadable Modules"): not searched. */
	uint32_t any_r = 0, any_o = 0;
	for (int32_t i = 0; i < c->n_sets; i++)
		for (int32_t u = 0; u < c->sets[i].n_units; u++) {
			const kiln_unit *un = &c->sets[i].units[u];
			if (beside && beside->outside && beside->outside[i] &&
			    beside->outside[i][u])
				continue; /* held outside: no module changes it */
			if (un->flags & KILN_UNIT_LAYER_INPUT) {
				/* never recomputed; may be offloaded (attn_norm) */
			} else {
				for (int b = 0; b < KILN_MRC_COUNT; b++)
					if (kiln_megatron_drops(&w.uses[i][u], 1u << b))
						any_r |= 1u << b;
			}
			if (kiln_lin_at(un->bytes, w.n[i]) >= w.min_offload_bytes)
				any_o |= w.uses[i][u].offloaded_by;
		}
	any_o &= ~KILN_MOF(FUSED_GROUP_MLP);
	if (beside) {
		any_r &= ~beside->no_recompute;
		any_o &= ~beside->no_offload;
	}
	const kiln_model *m = c->model;
	/* Full recompute is refused beside EP overlap
	 * (transformer_config.py:3021-3023). */
	bool full_ok = !m->overlap_ep_comm && !(beside && beside->no_full);

	kiln_megatron best = {.recompute = KILN_RECOMPUTE_FULL,
	                      .recompute_method = KILN_RECOMPUTE_UNIFORM,
	                      .recompute_num_layers = 1};
	if (beside && beside->no_full) {
		/* Without full recompute the fallback saves most: every
		 * module searched (attn_proj only with core_attn). */
		uint32_t o = any_o;
		if (!(o & KILN_MOF(CORE_ATTN)))
			o &= ~KILN_MOF(ATTN_PROJ);
		best = (kiln_megatron){.recompute =
		                           any_r ? KILN_RECOMPUTE_SELECTIVE : KILN_RECOMPUTE_NONE,
		                       .recompute_modules = any_r,
		                       .offload_modules = o};
		if ((any_r & KILN_MRC(MOE)) &&
		    (any_r & (KILN_MRC(MOE_ACT) | KILN_MRC(SHARED_EXPERTS))))
			best.recompute_modules &= ~(KILN_MRC(MOE_ACT) | KILN_MRC(SHARED_EXPERTS));
	}
	bool found = false;
	double best_worst = INFINITY, best_sum = INFINITY;
	int64_t n_cand = 0, n_fit = 0;
	/* Enumerate: (granularity, method, layers) x recompute subset x
	 * offload subset. Full recompute takes uniform chunks of 1 .. max
	 * layers (a longer chunk is the whole model chunk again) and blocks of
	 * 1 .. max - 1 (a block of every layer is uniform 1). */
	int32_t n_full = full_ok ? w.max_block : 0;
	for (int32_t mode = -1; mode < 2 * n_full; mode++) {
		/* mode -1: selective or none; 0 .. n_full - 1: full uniform,
		 * mode + 1 layers per chunk; n_full ..: full block, mode -
		 * n_full + 1 layers */
		bool uniform = mode >= 0 && mode < n_full;
		int32_t layers = uniform ? mode + 1 : mode - n_full + 1;
		if (mode >= n_full && layers >= w.max_block)
			continue;
		uint32_t rset = mode == -1 ? any_r : 0;
		uint32_t oset = uniform ? 0 : any_o;
		for (uint32_t R = 0;; R = (R - rset) & rset) {
			/* moe's region holds moe_act's and shared_experts': with it
			 * they add a flag and nothing else (dominance). */
			bool skip_r = (R & KILN_MRC(MOE)) &&
			              (R & (KILN_MRC(MOE_ACT) | KILN_MRC(SHARED_EXPERTS)));
			for (uint32_t O = 0; !skip_r; O = (O - oset) & oset) {
				/* attn_proj must be used together with core_attn
				 * (fine_grained_activation_offloading.md). */
				bool skip_o =
				    (O & KILN_MOF(ATTN_PROJ)) && !(O & KILN_MOF(CORE_ATTN));
				if (!skip_o) {
					kiln_megatron r = {.offload_modules = O};
					if (mode == -1) {
						r.recompute = R ? KILN_RECOMPUTE_SELECTIVE
						                : KILN_RECOMPUTE_NONE;
						r.recompute_modules = R;
					} else {
						r.recompute = KILN_RECOMPUTE_FULL;
						r.recompute_method = uniform
						                         ? KILN_RECOMPUTE_UNIFORM
						                         : KILN_RECOMPUTE_BLOCK;
						r.recompute_num_layers = layers;
					}
					n_cand++;
					shape sh = shape_of(&r);
					bool block, fits;
					double worst, sum;
					shape_actions(&w, &sh, cand.tail, cand.head, cand.n_tail,
					              cand.n_head, &block);
					/* Bytes first: only a recipe that fits is scheduled. */
					judge(&w, cand.tail, cand.head, cand.n_tail, cand.n_head,
					      block, sh.chunk, &fits, &worst, &sum, false);
					if (fits) {
						n_fit++;
						if (judge(&w, cand.tail, cand.head, cand.n_tail,
						          cand.n_head, block, sh.chunk, &fits,
						          &worst, &sum, true) != 0)
							return -1;
						double tol =
						    1e-9 * (best_worst > 1 ? best_worst : 1);
						bool better =
						    !found || worst < best_worst - tol ||
						    (worst <= best_worst + tol &&
						     (sum < best_sum - tol ||
						      (sum <= best_sum + tol &&
						       flag_count(&r) < flag_count(&best))));
						if (better) {
							found = true;
							best = r;
							best_worst = worst;
							best_sum = sum;
						}
					}
				}
				if (O == oset)
					break;
			}
			if (R == rset)
				break;
		}
	}
	*out_recipe = best;
	if (eval_with(&w, &best, a, out_actions) != 0)
		return -1;
	if (stats)
		*stats =
		    (kiln_megatron_search_stats){.candidates = n_cand,
		                                 .fitting = n_fit,
		                                 .scheduled = w.scheduled,
		                                 .cpu_s = (double)(clock() - t0) / CLOCKS_PER_SEC};
	return 0;
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
		memset(bl, 0, sizeof *bl);
		bl->kind = (kiln_baseline_kind)k;
		bl->name = info[k].name;
		bl->models = info[k].models;
		bl->design_load = info[k].design_load;
		bl->plan = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(c->n_sets ? c->n_sets : 1));
		if (!bl->plan)
			return -1;
	}

	/* Megatron: the description's recipe when it states one, else the
	 * strongest static recipe at the design load; one flag set for the
	 * whole job. */
	kiln_baseline *mg = &c->baselines[KILN_BASELINE_MEGATRON];
	const kiln_megatron *given = &c->model->megatron;
	kiln_megatron_actions ma;
	if (given->recompute != KILN_RECOMPUTE_NONE || given->offload_modules) {
		mg->recipe = *given;
		if (kiln_megatron_recipe_eval(c, given, mg->design_load, a, &ma) != 0)
			return -1;
	} else {
		kiln_megatron_search_stats st;
		if (kiln_megatron_search(c, mg->design_load, a, &mg->recipe, &ma, &st) != 0)
			return -1;
		mg->searched = st.candidates;
		mg->search_cpu_s = st.cpu_s;
	}
	char flags[512];
	if (kiln_megatron_flags_format(&mg->recipe, flags, sizeof flags) >= 0) {
		char *txt = kiln_arena_alloc(a, strlen(flags) + 32);
		if (!txt)
			return -1;
		snprintf(txt, strlen(flags) + 32, "Megatron-Core %s", flags);
		mg->models = txt;
	}
	bool block = c->n_sets > 0 && ma.head[0] != NULL;
	if (block) {
		mg->head_plan = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)c->n_sets);
		if (!mg->head_plan)
			return -1;
		mg->block_layers = (int32_t)mg->recipe.recompute_num_layers;
	}
	recipes w;
	if (recipes_init(&w, c, 1.0, false, a) != 0)
		return -1;
	for (int32_t i = 0; i < c->n_sets; i++) {
		const kiln_unit_set *set = &c->sets[i];
		/* full recompute: everything but the layer input */
		set_actions(&w, i, 0, 0, true, act);
		c->baselines[KILN_BASELINE_FULL_RECOMPUTE].plan[i] = kiln_plan_pool_add(c->pool, a, set, act);
		set_actions(&w, i, KILN_MRC(LAYERNORM), 0, false, act);
		c->baselines[KILN_BASELINE_STATIC_AGGRESSIVE].plan[i] =
		    kiln_plan_pool_add(c->pool, a, set, act);
		mg->plan[i] = kiln_plan_pool_add(c->pool, a, set, ma.tail[i]);
		if (block &&
		    (mg->head_plan[i] = kiln_plan_pool_add(c->pool, a, set, ma.head[i])) < 0)
			return -1;
	}

	kiln_option_flags static_flags = {.offload = false, .collective_recompute = true};
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
			const kiln_unit_set *set = &c->sets[i];
			double rows = set->kind == KILN_LAYER_MOE
			                  ? KILN_BASELINE_DESIGN_LOAD *
			                        c->graph->layers[set->layer].n_balanced
			                  : 0;
			if (kiln_plan_table_static(c->graph, set, KILN_BASELINE_DESIGN_LOAD, rows,
			                           &static_flags, a, t) != 0)
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
		/* megatron: its recipe's own fit (uniform chunks are judged
		 * by uniform_fits, not per layer). */
		c->baselines[k].fits =
		    k == KILN_BASELINE_MEGATRON ? ma.fits : baseline_fits(c, &c->baselines[k], a);
	}
	return 0;
}
