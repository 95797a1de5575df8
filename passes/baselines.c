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
#include <stdlib.h>
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
	return kiln_set_of_layer(c->sets, c->n_sets, &c->graph->layers[l]);
}

/* Megatron skips offloading tensors below min_offloaded_tensor_size
 * elements (transformer_config.py:1343, default 1M;
 * fine_grained_activation_offload.py:1084): kiln_megatron_min_offloaded. */

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
	int64_t m; /* micro-batches per iteration: Megatron's offload handlers */
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
	w->min_offload_bytes = kiln_megatron_min_offloaded(&c->model->megatron) *
	                       (double)kiln_model_act_bytes(c->model);
	w->m = c->model->micro_batches > 0 ? c->model->micro_batches : 1;
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
		/* Layers per virtual pipeline chunk of the stage (ly->chunk < vpp);
		 * chunks past MAX_CHUNKS, which no description reaches, are not
		 * counted. */
		enum { MAX_CHUNKS = 64 };
		int32_t per_chunk[MAX_CHUNKS] = {0};
		w->base_us[s] = 0;
		for (int32_t l = g->stages[s].layer_begin; l < g->stages[s].layer_end; l++) {
			const kiln_ir_layer *ly = &g->layers[l];
			double nl = ly->kind == KILN_LAYER_MOE ? load * ly->n_balanced : 0;
			for (int32_t o = ly->op_begin; o < ly->op_end; o++)
				w->base_us[s] += kiln_cost_op_time_us(g, &g->ops[o], nl);
			if (ly->index >= 0 && ly->chunk >= 0 && ly->chunk < MAX_CHUNKS &&
			    ++per_chunk[ly->chunk] > w->max_block)
				w->max_block = per_chunk[ly->chunk];
		}
	}
	/* Per graph layer its kiln_megatron_chunk_pos, in one walk per stage
	 * with a counter per chunk (-1 for embed and head). */
	int32_t *pos_in_chunk = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(g->n_layers + 1));
	if (!pos_in_chunk)
		return -1;
	for (int32_t s = 0; s < g->n_stages; s++) {
		int32_t most = 0;
		for (int32_t l = g->stages[s].layer_begin; l < g->stages[s].layer_end; l++)
			most = g->layers[l].chunk > most ? g->layers[l].chunk : most;
		int32_t *count = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(most + 1));
		if (!count)
			return -1;
		memset(count, 0, sizeof(int32_t) * (size_t)(most + 1));
		for (int32_t l = g->stages[s].layer_begin; l < g->stages[s].layer_end; l++) {
			const kiln_ir_layer *ly = &g->layers[l];
			pos_in_chunk[l] = ly->index < 0    ? -1
			                  : ly->chunk >= 0 ? count[ly->chunk]++
			                                   : kiln_megatron_chunk_pos(g, l);
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
		/* in_block[i][k]: the set's layers whose position in their
		 * chunk is below k (kiln_megatron_in_block), counted by
		 * position once and summed, in one walk of the stage. */
		memset(w->in_block[i], 0, sizeof(int32_t) * (size_t)(w->max_block + 1));
		const kiln_ir_stage *st = &g->stages[S->stage];
		for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
			const kiln_ir_layer *ly = &g->layers[l];
			int32_t pos = pos_in_chunk[l];
			if (ly->kind == S->kind && pos >= 0 && pos < w->max_block)
				w->in_block[i][pos + 1]++;
		}
		for (int32_t k = 1; k <= w->max_block; k++)
			w->in_block[i][k] += w->in_block[i][k - 1];
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
	const kiln_plan_table *t = kiln_plan_table_of(w->c, i, w->bucket);
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
	int32_t chunk;   /* full uniform: layers per checkpointed chunk (0, 1: one) */
	double fraction; /* --activation-offload-fraction */
	double delta;    /* --delta-offload-bytes-across-pp-ranks */
} shape;

static shape shape_of(const kiln_megatron *r)
{
	shape sh = {.omods = r->offload_modules,
	            .fraction = kiln_megatron_fraction(r),
	            .delta = (double)r->delta_offload_bytes};
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

/* ---------------------------------------------------------------- Offload groups
 *
 * Megatron's fine-grained offloading moves a layer's saved tensors in
 * groups, one per (layer, offload module) in forward order, held by one
 * ChunkOffloadHandler per micro-batch and model chunk of the first
 * (warmup) iteration and reused in that order afterwards
 * (fine_grained_activation_offload.py: 742-802, 804-818;
 * on_group_start_forward, :1310-1330, at d98e8a64). The handlers are
 * created in forward order and queued for the backward by flush
 * (:580-593): per group of pp micro-batches, chunk vpp - 1 of each, then
 * chunk vpp - 2, ..., chunk 0 (with vpp 1: micro-batch order), which is
 * the backward order of Megatron's interleaved 1F1B (sim/pipeline.c,
 * nth_op). After the warmup iteration post_warmup_callback (:609-668)
 * turns groups off, in this order, on the handlers in that backward
 * order:
 * - the margin (:612-639): for as many module names as one handler has
 *   at most, taken in the order a walk of the backward handlers from the
 *   last one first meets them (chunk 0's names first), the last group of
 *   that name in the first backward handler holding it stays on the
 *   device, so its reload never stalls;
 * - the delta (:640-648): pp rank r keeps r * delta bytes on the device,
 *   turning off whole groups from the first backward handler's first
 *   group on while any of those bytes remain (a group's bytes are what it
 *   moved in the warmup iteration);
 * - the fraction (:649-668): per handler, of the groups still on that
 *   moved bytes, the last int(count * (1 - fraction)) in forward order.
 * At run time should_bulk_offload (:1206-1227) also keeps the last group
 * of each name of a handler that is the next backward handler holding
 * that name when its forward runs (front_backward_chunk, :732-739): under
 * 1F1B the stage's forward j runs after max(0, j - warm-up) backwards
 * (sim/pipeline.c, kiln_pipe_order), so this is every handler of 1F1B's
 * last stage and, interleaved, chunk vpp - 1's on the last stage. A group
 * moves the units its module's context saves that the recipe offloads
 * (set_actions) at the load. The micro-batches then fall into runs of
 * equal plans (a layer of chunk c in micro-batch i takes handler (i, c)'s
 * flags); more than MAX_RUNS runs, or more than MAX_FLAGS distinct
 * handlers on a stage, and the stage is judged with every group on (not
 * reached by the shipped models). */
#define MAX_RUNS 16
#define MAX_FLAGS 16
#define MAX_CHUNKS 64
#define MAX_STAGE_LAYERS 256
#define MAX_GROUPS (MAX_STAGE_LAYERS * KILN_MOF_COUNT)

typedef struct stage_runs {
	int32_t n_runs;        /* 0: no group on the stage moves a byte */
	double total; /* the bytes one micro-batch's groups move before any is turned off */
	int32_t v;    /* model chunks on the stage */
	int64_t p;    /* micro-batches per group of the schedule: the stages */
	int64_t warm; /* the stage's warm-up forwards */
	int64_t end[MAX_RUNS]; /* run r: micro-batches end[r - 1] .. end[r] - 1 */
	int32_t n_layers;
	int32_t layer[MAX_STAGE_LAYERS];         /* the stage's layers with a unit set */
	int32_t chunk[MAX_STAGE_LAYERS];         /* their model chunk */
	bool block[MAX_STAGE_LAYERS];            /* in the full-recompute block: no group moves */
	uint32_t on[MAX_RUNS][MAX_STAGE_LAYERS]; /* the offload modules still offloading */
} stage_runs;

typedef struct group {
	int32_t j;    /* index into stage_runs.layer */
	uint32_t bit; /* KILN_MOF */
	double bytes;
} group;

static int popcount32(uint32_t x)
{
	int n = 0;
	for (; x; x &= x - 1)
		n++;
	return n;
}

/* One stage's handlers: p micro-batches per group, v chunks, m
 * micro-batches; chunk c's groups are gs[gb[c]] .. gs[gb[c + 1] - 1]. */
typedef struct handlers {
	const group *gs;
	int32_t v;
	int64_t p;
	int64_t m, warm; /* warm: the stage's warm-up forwards */
	int32_t gb[MAX_CHUNKS + 1];
	uint32_t names[MAX_CHUNKS]; /* KILN_MOF bits chunk c's groups carry */
	bool same_names;            /* every chunk's are the same */
	/* the margin: per chunk, the bits whose last group stays in the
	 * first backward handler of that chunk (micro-batch 0) */
	uint32_t margin[MAX_CHUNKS];
	/* distinct flag vectors: flags[k] for chunk fchunk[k] */
	int32_t n_flags;
	int32_t fchunk[MAX_FLAGS];
	uint8_t flags[MAX_FLAGS][MAX_GROUPS];
} handlers;

/* Forward or backward x of a stage's order: micro-batch *i, chunk *ch
 * (sim/pipeline.c, nth_op). */
static void nth_unit(int64_t p, int32_t v, int64_t x, bool bwd, int64_t *i, int32_t *ch)
{
	int32_t c = (int32_t)(x % (p * v) / p);
	*ch = bwd ? v - 1 - c : c;
	*i = x / (p * v) * p + x % p;
}

/* Where handler (micro-batch i, chunk c) comes in the stage's order of
 * backwards (bwd) or forwards: nth_unit's inverse. Then the chunk of
 * backward handler b. */
static int64_t unit_pos(const handlers *h, int64_t i, int32_t c, bool bwd)
{
	int64_t k = bwd ? h->v - 1 - c : c;
	return i / h->p * h->p * h->v + k * h->p + i % h->p;
}

static int32_t bwd_chunk(const handlers *h, int64_t b)
{
	int64_t i;
	int32_t c;
	nth_unit(h->p, h->v, b, true, &i, &c);
	return c;
}

/* Turns off, in chunk c's flags off, the last group of each module in
 * bits. */
static void keep_last(const handlers *h, int32_t c, uint32_t bits, uint8_t *off)
{
	for (int32_t g = h->gb[c + 1] - 1; bits && g >= h->gb[c]; g--)
		if (bits & h->gs[g].bit) {
			off[g - h->gb[c]] = 0;
			bits &= ~h->gs[g].bit;
		}
}

/* The module bits for which should_bulk_offload keeps handler (i, c)'s
 * last group: its backward is the next one holding the name when its
 * forward runs. */
static uint32_t run_time_rule(const handlers *h, int64_t i, int32_t c)
{
	int64_t j = unit_pos(h, i, c, false), b = unit_pos(h, i, c, true);
	int64_t next = j > h->warm ? j - h->warm : 0;
	if (h->same_names)
		return next == b ? h->names[c] : 0;
	uint32_t bits = 0;
	for (uint32_t rest = h->names[c]; rest; rest &= rest - 1) {
		uint32_t x = rest & -rest;
		int64_t q = next;
		while (q < b && !(h->names[bwd_chunk(h, q)] & x))
			q++;
		bits |= q == b ? x : 0;
	}
	return bits;
}

/* Handler (i, c)'s flags into off (off[g] 0: turned off): the margin
 * (micro-batch 0), the delta (*keep: its bytes still to keep, consumed),
 * the fraction, the run-time rule. */
static void handler_flags(const handlers *h, int64_t i, int32_t c, double *keep, double fraction,
                          uint8_t *off)
{
	const group *gs = h->gs + h->gb[c];
	int32_t ng = h->gb[c + 1] - h->gb[c];
	for (int32_t g = 0; g < ng; g++)
		off[g] = 1;
	if (i == 0)
		keep_last(h, c, h->margin[c], off);
	for (int32_t g = 0; *keep > 0 && g < ng; g++)
		if (off[g]) {
			*keep -= gs[g].bytes;
			off[g] = 0;
		}
	int64_t eligible = 0;
	for (int32_t g = 0; g < ng; g++)
		eligible += off[g] && gs[g].bytes > 0;
	/* Python's int(count * (1 - fraction)): the same IEEE operations. */
	int64_t disabled = (int64_t)((double)eligible * (1.0 - fraction));
	for (int32_t g = ng - 1; g >= 0 && disabled > 0; g--)
		if (off[g] && gs[g].bytes > 0) {
			off[g] = 0;
			disabled--;
		}
	keep_last(h, c, run_time_rule(h, i, c), off);
}

/* The index of chunk c's flags off among h's distinct ones (added when
 * new), or -1 when MAX_FLAGS are taken. */
static int32_t flags_id(handlers *h, int32_t c, const uint8_t *off)
{
	size_t ng = (size_t)(h->gb[c + 1] - h->gb[c]);
	for (int32_t k = 0; k < h->n_flags; k++)
		if (h->fchunk[k] == c && memcmp(h->flags[k], off, ng) == 0)
			return k;
	if (h->n_flags == MAX_FLAGS)
		return -1;
	h->fchunk[h->n_flags] = c;
	memcpy(h->flags[h->n_flags], off, ng);
	return h->n_flags++;
}

/* Flags ids by (chunk, run-time rule bits), for plain_id. */
typedef struct plain_memo {
	int32_t n;
	int32_t chunk[MAX_FLAGS], id[MAX_FLAGS];
	uint32_t bits[MAX_FLAGS];
} plain_memo;

/* Handler (i, c)'s flags id, or -1 when MAX_FLAGS are taken. Past the
 * delta's handlers and micro-batch 0 (the margin) a handler's flags are
 * its chunk's, with the run-time rule's bits: memoised by both. */
static int32_t plain_id(handlers *h, int64_t i, int32_t c, double fraction, plain_memo *pm,
                        uint8_t *off)
{
	double none = 0;
	if (i == 0) {
		handler_flags(h, i, c, &none, fraction, off);
		return flags_id(h, c, off);
	}
	uint32_t bits = run_time_rule(h, i, c);
	for (int32_t k = 0; k < pm->n; k++)
		if (pm->chunk[k] == c && pm->bits[k] == bits)
			return pm->id[k];
	handler_flags(h, i, c, &none, fraction, off);
	int32_t id = flags_id(h, c, off);
	if (id >= 0 && pm->n < MAX_FLAGS) {
		pm->chunk[pm->n] = c;
		pm->bits[pm->n] = bits;
		pm->id[pm->n++] = id;
	}
	return id;
}

/* Stage s's handlers under sh, the layers outside a block taking tail
 * (their offloads: the groups' units), into out. */
static void stage_groups(const recipes *w, const shape *sh, int32_t s, uint8_t *const *tail,
                         stage_runs *out)
{
	const kiln_compilation *c = w->c;
	const kiln_ir_graph *g = c->graph;
	const kiln_model *mo = c->model;
	out->n_runs = 0;
	out->n_layers = 0;
	out->total = 0;
	out->v = mo->schedule == KILN_SCHED_INTERLEAVED && mo->vpp > 1 ? (int32_t)mo->vpp : 1;
	out->p = g->n_stages > 0 ? g->n_stages : 1;
	/* Forwards before the stage's first backward: one less than the
	 * chunks it holds at once (kiln_cost_stage_inflight). */
	int64_t warm = llround(c->budgets[s].inflight * out->v) - 1, n_ops = w->m * out->v;
	out->warm = warm < 0 ? 0 : warm < n_ops ? warm : n_ops;
	int32_t k = sh->block < w->max_block ? sh->block : w->max_block;
	bool blocked = sh->full && sh->block > 0 && k < w->max_block;
	if (!sh->omods || (sh->full && !blocked) || out->v > MAX_CHUNKS)
		return;
	for (int32_t l = g->stages[s].layer_begin; l < g->stages[s].layer_end; l++) {
		if (set_of_layer(c, l) < 0)
			continue;
		if (out->n_layers == MAX_STAGE_LAYERS)
			return; /* beyond the model: whole groups (n_runs 0) */
		out->block[out->n_layers] = blocked && kiln_megatron_in_block(g, l, k);
		out->chunk[out->n_layers] = g->layers[l].chunk;
		out->layer[out->n_layers++] = l;
	}
	handlers h;
	group gs[MAX_GROUPS];
	h.gs = gs;
	h.v = out->v;
	h.p = out->p;
	h.m = w->m;
	h.warm = out->warm;
	int32_t ng = 0;
	double total = 0;
	for (int32_t ch = 0; ch < h.v; ch++) {
		h.gb[ch] = ng;
		h.names[ch] = 0;
		for (int32_t j = 0; j < out->n_layers; j++) {
			if (out->chunk[j] != ch)
				continue;
			int32_t i = set_of_layer(c, out->layer[j]);
			const kiln_unit_set *S = &c->sets[i];
			for (int b = 0; b < KILN_MOF_COUNT; b++) {
				uint32_t bit = kiln_megatron_group_order[b];
				if (!(sh->omods & bit))
					continue;
				bool exists = false;
				double bytes = 0;
				for (int32_t u = 0; u < S->n_units; u++) {
					if (!(w->uses[i][u].offloaded_by & bit))
						continue;
					exists = true;
					if (!out->block[j] && tail[i][u] == KILN_ACT_OFFLOAD)
						bytes += kiln_lin_at(S->units[u].bytes, w->n[i]);
				}
				if (exists) {
					gs[ng++] = (group){.j = j, .bit = bit, .bytes = bytes};
					h.names[ch] |= bit;
				}
				total += bytes;
			}
		}
	}
	h.gb[h.v] = ng;
	h.same_names = true;
	for (int32_t ch = 1; ch < h.v; ch++)
		h.same_names = h.same_names && h.names[ch] == h.names[0];
	out->total = total;
	if (!(total > 0))
		return;
	/* The margin: the names in the order the walk from the last backward
	 * handler meets them (chunk 0's first), each kept in the highest
	 * chunk holding it, whose micro-batch 0 comes first in backward
	 * order. */
	int32_t margin = 0;
	for (int32_t ch = 0; ch < h.v; ch++) {
		int32_t n = popcount32(h.names[ch]);
		margin = n > margin ? n : margin;
		h.margin[ch] = 0;
	}
	uint32_t seen = 0;
	for (int32_t ch = 0; ch < h.v && margin > 0; ch++)
		for (int32_t q = h.gb[ch]; q < h.gb[ch + 1] && margin > 0; q++) {
			uint32_t x = gs[q].bit;
			if (seen & x)
				continue;
			seen |= x;
			margin--;
			int32_t top = ch;
			for (int32_t d = ch + 1; d < h.v; d++)
				top = h.names[d] & x ? d : top;
			h.margin[top] |= x;
		}
	/* The delta's handlers, in backward order while its bytes last. */
	h.n_flags = 0;
	uint8_t off[MAX_GROUPS];
	double keep = (double)s * sh->delta;
	int64_t n = h.m * h.v, n_delta = 0;
	int32_t local[MAX_RUNS * MAX_STAGE_LAYERS], *delta_id = local;
	for (; n_delta < n && keep > 0; n_delta++) {
		if (n_delta == (int64_t)(sizeof local / sizeof local[0])) {
			/* Past this many whole handlers: room for every one. */
			delta_id = malloc(sizeof(int32_t) * (size_t)n);
			if (!delta_id)
				return;
			memcpy(delta_id, local, sizeof local);
		}
		int64_t i;
		int32_t ch;
		nth_unit(h.p, h.v, n_delta, true, &i, &ch);
		handler_flags(&h, i, ch, &keep, sh->fraction, off);
		if ((delta_id[n_delta] = flags_id(&h, ch, off)) < 0)
			goto out;
	}
	/* Each micro-batch's handlers; runs of equal ones. */
	plain_memo pm = {.n = 0};
	int32_t id[MAX_CHUNKS], prev[MAX_CHUNKS];
	int64_t pv = h.p * h.v;
	for (int64_t i = 0; i < h.m; i++) {
		/* Past micro-batch 0's group, the warm-up and the delta's
		 * handlers, group g's handlers are group g - 1's shifted by one
		 * group: once such a group lies in one run, so does the rest. */
		int64_t grp = i / h.p;
		if (i % h.p == 0 && grp >= 2 && (grp - 1) * pv >= h.warm &&
		    (grp - 1) * pv >= n_delta &&
		    (out->n_runs < 2 ? 0 : out->end[out->n_runs - 2]) <= (grp - 1) * h.p) {
			out->end[out->n_runs - 1] = h.m;
			break;
		}
		for (int32_t ch = 0; ch < h.v; ch++) {
			int64_t b = unit_pos(&h, i, ch, true);
			id[ch] =
			    b < n_delta ? delta_id[b] : plain_id(&h, i, ch, sh->fraction, &pm, off);
			if (id[ch] < 0) {
				out->n_runs = 0;
				goto out;
			}
		}
		if (i > 0 && memcmp(id, prev, sizeof(int32_t) * (size_t)h.v) == 0) {
			out->end[out->n_runs - 1] = i + 1;
			continue;
		}
		if (out->n_runs == MAX_RUNS) {
			out->n_runs = 0;
			goto out;
		}
		int32_t r = out->n_runs++;
		out->end[r] = i + 1;
		for (int32_t j = 0; j < out->n_layers; j++)
			out->on[r][j] = 0;
		for (int32_t ch = 0; ch < h.v; ch++)
			for (int32_t q = h.gb[ch]; q < h.gb[ch + 1]; q++)
				if (h.flags[id[ch]][q - h.gb[ch]])
					out->on[r][gs[q].j] |= gs[q].bit;
		memcpy(prev, id, sizeof(int32_t) * (size_t)h.v);
	}
out:
	if (delta_id != local)
		free(delta_id);
}

/* A small cache of (set, modules on) -> the layer's actions, bytes and
 * (once priced) exposed time, for one recipe's evaluation. */
#define LAYER_CACHE 64
typedef struct layer_cache {
	int32_t n;
	struct {
		int32_t set;
		uint32_t on;
		kiln_plan_bytes b;
		double exposed_us; /* NAN until priced */
		uint8_t act[KILN_PLAN_MAX_UNITS];
	} e[LAYER_CACHE];
} layer_cache;

/* Entry for set i's layers with offload modules `on` under sh (NULL when
 * the cache is full). */
static int32_t cache_get(const recipes *w, const shape *sh, int32_t i, uint32_t on, layer_cache *lc)
{
	for (int32_t k = 0; k < lc->n; k++)
		if (lc->e[k].set == i && lc->e[k].on == on)
			return k;
	if (lc->n == LAYER_CACHE || w->c->sets[i].n_units > KILN_PLAN_MAX_UNITS)
		return -1;
	int32_t k = lc->n++;
	lc->e[k].set = i;
	lc->e[k].on = on;
	lc->e[k].exposed_us = NAN;
	set_actions(w, i, sh->rmods, on, false, lc->e[k].act);
	beside_bytes(&w->c->sets[i], i, lc->e[k].act, w->n[i], w->beside, &lc->e[k].b);
	return k;
}

/* The run micro-batch i of an iteration takes. */
static int32_t run_of(const stage_runs *rs, int64_t i)
{
	int32_t r = 0;
	while (r < rs->n_runs - 1 && i >= rs->end[r])
		r++;
	return r;
}

/* A place in a stage's order of forwards (or backwards): micro-batch
 * i0 + r, the c-th chunk of its group's pass (nth_unit, without its
 * divisions). */
typedef struct cursor {
	int64_t i0, r;
	int32_t c;
} cursor;

/* One op of the walk in runs_fit at u, then u moves on: a forward
 * (holding its chunk from here) or a backward (releasing it after), at
 * its chunk's peak. */
static void walk_step(const stage_runs *rs, int64_t p, cursor *u, bool bwd,
                      double (*res)[MAX_CHUNKS], double (*top)[MAX_CHUNKS], double *held,
                      double *need)
{
	int32_t ch = bwd ? rs->v - 1 - u->c : u->c;
	int32_t r = run_of(rs, u->i0 + u->r);
	if (!bwd)
		*held += res[r][ch];
	*need = *held + top[r][ch] > *need ? *held + top[r][ch] : *need;
	if (bwd)
		*held -= res[r][ch];
	if (++u->r == p) {
		u->r = 0;
		if (++u->c == rs->v) {
			u->c = 0;
			u->i0 += p;
		}
	}
}

/* Stage s's fit under its runs (tail outside a block, head inside),
 * counted as stage_fits counts a plan, per (micro-batch, chunk) held
 * from its forward to its backward: walking the stage's order of
 * Megatron's (interleaved) 1F1B (sim/pipeline.c, kiln_pipe_order: the
 * warm-up forwards, then one forward one backward, then the cool-down),
 * the most that the chunks held at once take (their share of the
 * micro-batch's fixed bytes and their layers' resident bytes) plus the
 * running chunk's largest transient and reload of a layer. -1 when the
 * cache overflowed. */
static int runs_fit(const recipes *w, const shape *sh, int32_t s, const stage_runs *rs,
                    uint8_t *const *head, layer_cache *lc, bool *out_fits)
{
	const kiln_compilation *c = w->c;
	const kiln_stage_budget *bu = &c->budgets[s];
	int32_t v = rs->v;
	double res[MAX_RUNS][MAX_CHUNKS], tr[MAX_RUNS][MAX_CHUNKS], pre[MAX_RUNS][MAX_CHUNKS];
	double top[MAX_RUNS][MAX_CHUNKS];
	for (int32_t r = 0; r < rs->n_runs; r++) {
		for (int32_t ch = 0; ch < v; ch++)
			res[r][ch] = bu->fixed_bytes / v, tr[r][ch] = pre[r][ch] = 0;
		for (int32_t j = 0; j < rs->n_layers; j++) {
			int32_t i = set_of_layer(c, rs->layer[j]), ch = rs->chunk[j];
			kiln_plan_bytes hb;
			const kiln_plan_bytes *b = &hb;
			if (rs->block[j]) {
				beside_bytes(&c->sets[i], i, head[i], w->n[i], w->beside, &hb);
			} else {
				int32_t k = cache_get(w, sh, i, rs->on[r][j], lc);
				if (k < 0)
					return -1;
				b = &lc->e[k].b;
			}
			res[r][ch] += b->resident;
			tr[r][ch] = b->transient > tr[r][ch] ? b->transient : tr[r][ch];
			pre[r][ch] = b->offloaded > pre[r][ch] ? b->offloaded : pre[r][ch];
		}
		for (int32_t ch = 0; ch < v; ch++)
			top[r][ch] = tr[r][ch] + pre[r][ch];
	}
	int64_t p = rs->p, n = w->m * v, warm = rs->warm;
	double held = 0, need = 0;
	cursor fw = {0, 0, 0}, bw = {0, 0, 0};
	for (int64_t k = 0; k < warm; k++)
		walk_step(rs, p, &fw, false, res, top, &held, &need);
	/* The steady state: once every chunk held is in the last run, the
	 * held chunks repeat with a period of p * v pairs (shifted by one
	 * group of micro-batches): one period walked, the rest are the same. */
	int64_t pv = p * v, last = rs->n_runs < 2 ? 0 : rs->end[rs->n_runs - 2];
	int64_t uniform = (last + p - 1) / p * pv;
	for (int64_t k = 0; k < n - warm; k++) {
		if (k == uniform + pv) {
			int64_t periods = (n - warm - k) / pv;
			k += periods * pv;
			fw.i0 += periods * p;
			bw.i0 += periods * p;
			if (k >= n - warm)
				break;
		}
		walk_step(rs, p, &fw, false, res, top, &held, &need);
		walk_step(rs, p, &bw, true, res, top, &held, &need);
	}
	for (int64_t k = n - warm; k < n; k++)
		walk_step(rs, p, &bw, true, res, top, &held, &need);
	double reserved = w->beside && w->beside->reserved_bytes ? w->beside->reserved_bytes[s] : 0;
	*out_fits = need <= bu->capacity_bytes - bu->static_bytes - reserved;
	return 0;
}

/* Fit and objective of the actions shape_actions made for sh: per stage,
 * under Megatron's offload groups when a group there moves bytes
 * (stage_groups; the objective then the mean over an iteration's
 * micro-batches), else every layer of a set alike. Returns 0, or -1 when
 * a schedule failed. */
static int judge(recipes *w, const shape *sh, uint8_t **tail, uint8_t **head, const int32_t *n_tail,
                 const int32_t *n_head, bool block, bool *out_fits, double *out_worst,
                 double *out_sum, bool price)
{
	const kiln_compilation *c = w->c;
	bool fits = true;
	*out_worst = *out_sum = 0;
	stage_runs rs;
	layer_cache lc;
	for (int32_t s = 0; s < c->graph->n_stages; s++) {
		stage_groups(w, sh, s, tail, &rs);
		lc.n = 0;
		bool f = false;
		if (sh->chunk > 1)
			f = uniform_fits(w, s, tail, sh->chunk);
		else if (rs.n_runs == 0 || runs_fit(w, sh, s, &rs, head, &lc, &f) != 0) {
			rs.n_runs = 0; /* the cache overflowed: whole groups */
			f = stage_fits(c, s, w->load, tail, block ? head : NULL, n_tail, n_head,
			               w->beside);
		}
		fits = fits && f;
		if (!price) {
			if (!fits)
				break;
			continue;
		}
		double ex = 0;
		if (rs.n_runs > 0) {
			int64_t from = 0;
			for (int32_t r = 0; r < rs.n_runs; r++) {
				double lr = 0;
				for (int32_t j = 0; j < rs.n_layers; j++) {
					int32_t i = set_of_layer(c, rs.layer[j]);
					double e;
					if (rs.block[j]) {
						e = exposed_of(w, i, head[i]);
					} else {
						int32_t k = cache_get(w, sh, i, rs.on[r][j], &lc);
						if (k < 0)
							return -1;
						if (isnan(lc.e[k].exposed_us))
							lc.e[k].exposed_us =
							    exposed_of(w, i, lc.e[k].act);
						e = lc.e[k].exposed_us;
					}
					if (e < 0)
						return -1;
					lr += e;
				}
				ex += (double)(rs.end[r] - from) * lr;
				from = rs.end[r];
			}
			ex /= (double)w->m;
		} else {
			for (int32_t i = 0; i < c->n_sets; i++) {
				if (c->sets[i].stage != s)
					continue;
				double et = n_tail[i] > 0 ? exposed_of(w, i, tail[i]) : 0;
				double eh = block && n_head[i] > 0 ? exposed_of(w, i, head[i]) : 0;
				if (et < 0 || eh < 0)
					return -1;
				ex += n_tail[i] * et + n_head[i] * eh;
			}
		}
		double t = w->base_us[s] + ex +
		           (w->beside && w->beside->stage_us ? w->beside->stage_us[s] : 0);
		*out_worst = t > *out_worst ? t : *out_worst;
		*out_sum += ex;
	}
	*out_fits = fits;
	return 0;
}

/* The offload-group runs of the recipe sh made tail and head from, into
 * out (arena-allocated; out->n_runs[s] 0 where a stage has none). */
static int runs_export(recipes *w, const shape *sh, uint8_t **tail, kiln_arena *a,
                       kiln_megatron_actions *out)
{
	const kiln_compilation *c = w->c;
	const kiln_ir_graph *g = c->graph;
	int32_t np = g->n_stages > 0 ? g->n_stages : 1, nl = g->n_layers > 0 ? g->n_layers : 1;
	out->n_runs = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)np);
	out->run_end = kiln_arena_alloc(a, sizeof(int64_t *) * (size_t)np);
	out->layer_actions = kiln_arena_alloc(a, sizeof(uint8_t **) * (size_t)nl);
	if (!out->n_runs || !out->run_end || !out->layer_actions)
		return -1;
	memset(out->layer_actions, 0, sizeof(uint8_t **) * (size_t)nl);
	stage_runs rs;
	for (int32_t s = 0; s < g->n_stages; s++) {
		out->n_runs[s] = 0;
		out->run_end[s] = NULL;
		if (sh->chunk > 1)
			continue;
		stage_groups(w, sh, s, tail, &rs);
		if (rs.n_runs == 0)
			continue;
		out->n_runs[s] = rs.n_runs;
		out->run_end[s] = kiln_arena_alloc(a, sizeof(int64_t) * MAX_RUNS);
		if (!out->run_end[s])
			return -1;
		memcpy(out->run_end[s], rs.end, sizeof(int64_t) * (size_t)rs.n_runs);
		for (int32_t j = 0; j < rs.n_layers; j++) {
			if (rs.block[j])
				continue;
			int32_t l = rs.layer[j], i = set_of_layer(c, l);
			const kiln_unit_set *S = &c->sets[i];
			out->layer_actions[l] = kiln_arena_alloc(a, sizeof(uint8_t *) * MAX_RUNS);
			if (!out->layer_actions[l])
				return -1;
			for (int32_t r = 0; r < rs.n_runs; r++) {
				uint8_t *act = kiln_arena_alloc(a, (size_t)S->n_units + 1);
				if (!act)
					return -1;
				set_actions(w, i, sh->rmods, rs.on[r][j], false, act);
				out->layer_actions[l][r] = act;
			}
		}
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
	if (judge(w, &sh, out->tail, out->head, out->n_tail, out->n_head, block, &out->fits,
	          &out->worst_us, &out->exposed_us, true) != 0 ||
	    runs_export(w, &sh, out->tail, a, out) != 0)
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
	w.min_offload_bytes =
	    kiln_megatron_min_offloaded(r) * (double)kiln_model_act_bytes(c->model);
	return eval_with(&w, r, a, out);
}

const double kiln_megatron_fractions[KILN_MEGATRON_N_FRACTIONS] = {1.0, 0.75, 0.5, 0.25};
const double kiln_megatron_deltas[KILN_MEGATRON_N_DELTAS] = {0, 0.5, 1};

int kiln_megatron_delta_unit(const kiln_compilation *c, const kiln_megatron *r, double load,
                             kiln_arena *a, double *out_bytes)
{
	recipes w;
	kiln_megatron_actions m;
	if (recipes_init(&w, c, load, false, a) != 0 || actions_alloc(c, a, &m) != 0)
		return -1;
	w.min_offload_bytes =
	    kiln_megatron_min_offloaded(r) * (double)kiln_model_act_bytes(c->model);
	kiln_megatron base = *r;
	base.offload_fraction_set = false;
	base.delta_offload_bytes = 0;
	shape sh = shape_of(&base);
	bool block;
	shape_actions(&w, &sh, m.tail, m.head, m.n_tail, m.n_head, &block);
	stage_runs rs;
	stage_groups(&w, &sh, 0, m.tail, &rs);
	*out_bytes = rs.total;
	return 0;
}

/* Flags on a command line: the tie-break among equally good recipes. */
static int flag_count(const kiln_megatron *r)
{
	return popcount32(r->recompute_modules) + popcount32(r->offload_modules) +
	       (r->recompute == KILN_RECOMPUTE_FULL ? 2 : 0) +
	       (r->recompute_method == KILN_RECOMPUTE_BLOCK ? 1 : 0) + r->offload_fraction_set +
	       (r->delta_offload_bytes > 0);
}

/* The search's best so far (found false: none fits yet; best the
 * fallback). */
typedef struct search_best {
	kiln_megatron best;
	bool found;
	double worst, sum;
	int64_t n_cand, n_fit;
} search_best;

/* Judges recipe r (bytes first: only a recipe that fits is scheduled)
 * and keeps it in b when it is better: the least objective, then the
 * least summed exposed time, then fewer flags. Returns 0, or -1 when a
 * schedule failed. */
static int consider(recipes *w, const kiln_megatron *r, kiln_megatron_actions *cand, search_best *b)
{
	shape sh = shape_of(r);
	bool block, fits;
	double worst, sum;
	b->n_cand++;
	shape_actions(w, &sh, cand->tail, cand->head, cand->n_tail, cand->n_head, &block);
	judge(w, &sh, cand->tail, cand->head, cand->n_tail, cand->n_head, block, &fits, &worst,
	      &sum, false);
	if (!fits)
		return 0;
	b->n_fit++;
	if (judge(w, &sh, cand->tail, cand->head, cand->n_tail, cand->n_head, block, &fits, &worst,
	          &sum, true) != 0)
		return -1;
	double tol = 1e-9 * (b->worst > 1 ? b->worst : 1);
	bool better =
	    !b->found || worst < b->worst - tol ||
	    (worst <= b->worst + tol &&
	     (sum < b->sum - tol || (sum <= b->sum + tol && flag_count(r) < flag_count(&b->best))));
	if (better) {
		b->found = true;
		b->best = *r;
		b->worst = worst;
		b->sum = sum;
	}
	return 0;
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
	search_best sb = {.best = best, .worst = INFINITY, .sum = INFINITY};
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
					if (consider(&w, &r, &cand, &sb) != 0)
						return -1;
					/* The offload tuning's grid on a recipe whose
					 * groups move bytes on stage 0. */
					double unit = 0;
					if (O && !(beside && beside->no_offload_tuning)) {
						shape sh = shape_of(&r);
						bool block;
						stage_runs rs;
						shape_actions(&w, &sh, cand.tail, cand.head,
						              cand.n_tail, cand.n_head, &block);
						stage_groups(&w, &sh, 0, cand.tail, &rs);
						unit = rs.total;
					}
					for (int fi = 0; unit > 0 && fi < KILN_MEGATRON_N_FRACTIONS;
					     fi++)
						for (int di = 0; di < KILN_MEGATRON_N_DELTAS;
						     di++) {
							double f = kiln_megatron_fractions[fi];
							double d =
							    floor(unit * kiln_megatron_deltas[di]);
							if ((f == 1 && d == 0) ||
							    (d > 0 && c->graph->n_stages < 2))
								continue;
							kiln_megatron t = r;
							t.offload_fraction_set = f < 1;
							t.offload_fraction = f < 1 ? f : 0;
							t.delta_offload_bytes = (int64_t)d;
							if (consider(&w, &t, &cand, &sb) != 0)
								return -1;
						}
				}
				if (O == oset)
					break;
			}
			if (R == rset)
				break;
		}
	}
	best = sb.best;
	if (best.offload_modules && c->model->megatron.min_offloaded_set) {
		best.min_offloaded_set = true;
		best.min_offloaded_elements = c->model->megatron.min_offloaded_elements;
	}
	*out_recipe = best;
	if (eval_with(&w, &best, a, out_actions) != 0)
		return -1;
	if (stats)
		*stats =
		    (kiln_megatron_search_stats){.candidates = sb.n_cand,
		                                 .fitting = sb.n_fit,
		                                 .scheduled = w.scheduled,
		                                 .cpu_s = (double)(clock() - t0) / CLOCKS_PER_SEC};
	return 0;
}

/* A plan's bytes as lines in the rows, as the runtime counts the group
 * plan's (runtime/select.c, group_substitute): kept units resident, the
 * others saved, and in the backward the rebuilt units with their workspace
 * and the reloaded ones transient. */
static void plan_lines(const kiln_unit_set *set, const uint8_t *act, kiln_group_fallback *gf)
{
	gf->resident = gf->saved = gf->transient = (kiln_lin){0};
	for (int32_t u = 0; u < set->n_units; u++) {
		const kiln_unit *un = &set->units[u];
		kiln_lin *to = act[u] == KILN_ACT_KEEP ? &gf->resident : &gf->saved;
		to->base += un->bytes.base;
		to->per_n += un->bytes.per_n;
		if (act[u] == KILN_ACT_RECOMPUTE || act[u] == KILN_ACT_OFFLOAD) {
			int ws = act[u] == KILN_ACT_RECOMPUTE;
			gf->transient.base += un->bytes.base + (ws ? un->workspace_bytes.base : 0);
			gf->transient.per_n +=
			    un->bytes.per_n + (ws ? un->workspace_bytes.per_n : 0);
		}
	}
}

/* The plan's scheduled exposed time at t's rows, scheduled as the simulator
 * schedules a static plan (sim/policy.c, static_cost). Returns 0 or -1. */
static int exposed_at(const kiln_compilation *c, const kiln_plan_table *t, const uint8_t *act,
                      double *out_us)
{
	double serial;
	kiln_arena *scratch = kiln_arena_new();
	if (!scratch)
		return -1;
	int rc = kiln_interleave_exposed(c, t, act, scratch, out_us, &serial);
	kiln_arena_free(scratch);
	return rc;
}

/* The plan's exposed time as the line through the first and the last
 * bucket, clamped at 0. Returns 0 or -1. */
static int plan_exposed_line(const kiln_compilation *c, int32_t set, const uint8_t *act,
                             kiln_group_fallback *gf)
{
	const kiln_plan_table *t0 = kiln_plan_table_of(c, set, 0);
	const kiln_plan_table *t1 = t0 + c->n_buckets - 1;
	double e0, e1;
	if (exposed_at(c, t0, act, &e0) != 0 || exposed_at(c, t1, act, &e1) != 0)
		return -1;
	double per = t1->n > t0->n ? (e1 - e0) / (t1->n - t0->n) : 0;
	per = per > 0 ? per : 0;
	double base = e1 - per * t1->n;
	gf->exposed_per_row_us = per;
	gf->exposed_base_us = base > 0 ? base : 0;
	return 0;
}

/* The most rows one rank of the EP group can receive at an MoE layer:
 * every token of the group routed to its experts, each at most
 * min(top_k, local experts) times (as kiln_sim_load_factor_max bounds the
 * load factor). */
static double group_max_rows(const kiln_compilation *c, const kiln_unit_set *set)
{
	const kiln_model *m = c->model;
	double balanced = c->graph->layers[set->layer].n_balanced;
	if (!m->moe || m->ep <= 1 || m->top_k < 1)
		return balanced;
	int64_t local = m->experts / m->ep, k = m->top_k < local ? m->top_k : local;
	return balanced * (double)m->ep * (double)(k > 0 ? k : 1) / (double)m->top_k;
}

/* Whether line x is at most line y at every rows in [0, n] (both are
 * lines, so at both ends). */
static bool line_le(kiln_lin x, kiln_lin y, double n)
{
	return x.base <= y.base && kiln_lin_at(x, n) <= kiln_lin_at(y, n);
}

/* The EP group's plan of every set past fit_rows (struct
 * kiln_group_fallback; docs/runtime.md, "Beyond the declared load"):
 * full recompute's plan, or a plan of the set's tables that is cheaper and
 * never holds more: its resident and its transient bytes at most full
 * recompute's at every rows a rank can receive (group_max_rows); the
 * cheapest by scheduled exposed time at the last bucket's rows (full
 * recompute on a tie, then the first in bucket and point order). Its
 * bytes as lines in the rows, its exposed time as the line through the
 * first and the last bucket, and the rows up to which every rank is known
 * to fit without it (kiln_budget_fit_rows, passes/budget.c: the tables'
 * safety bound, and past the last bucket where every plan the runtime may
 * choose fits the budget). */
static int group_fallbacks(kiln_compilation *c)
{
	kiln_arena *a = c->arena;
	c->groups =
	    kiln_arena_alloc(a, sizeof(kiln_group_fallback) * (size_t)(c->n_sets ? c->n_sets : 1));
	/* Each plan once per set (the tables of a set share many). */
	uint8_t *seen = kiln_arena_alloc(a, (size_t)c->pool->n + 1);
	if (!c->groups || !seen)
		return -1;
	for (int32_t i = 0; i < c->n_sets; i++) {
		const kiln_unit_set *set = &c->sets[i];
		kiln_group_fallback *gf = &c->groups[i];
		memset(gf, 0, sizeof *gf);
		gf->plan = -1;
		if (set->kind != KILN_LAYER_MOE)
			continue;
		int32_t full = c->baselines[KILN_BASELINE_FULL_RECOMPUTE].plan[i];
		const kiln_plan_table *last = kiln_plan_table_of(c, i, c->n_buckets - 1);
		double best_us, us;
		gf->plan = full;
		plan_lines(set, c->pool->actions[full], gf);
		if (exposed_at(c, last, c->pool->actions[full], &best_us) != 0)
			return -1;
		const kiln_group_fallback bound = *gf;
		double most = group_max_rows(c, set);
		memset(seen, 0, (size_t)c->pool->n + 1);
		seen[full] = 1;
		for (int32_t b = 0; b < c->n_buckets; b++) {
			const kiln_plan_table *t = kiln_plan_table_of(c, i, b);
			for (int32_t p = 0; p < t->n_points; p++) {
				int32_t plan = t->plan[p];
				if (plan < 0 || plan >= c->pool->n || seen[plan])
					continue;
				seen[plan] = 1;
				kiln_group_fallback cand = {.plan = plan};
				plan_lines(set, c->pool->actions[plan], &cand);
				if (!line_le(cand.resident, bound.resident, most) ||
				    !line_le(cand.transient, bound.transient, most))
					continue;
				if (exposed_at(c, last, c->pool->actions[plan], &us) != 0)
					return -1;
				if (us < best_us) {
					best_us = us;
					*gf = cand;
				}
			}
		}
		if (plan_exposed_line(c, i, c->pool->actions[gf->plan], gf) != 0 ||
		    kiln_budget_fit_rows(c, i, &gf->fit_rows) != 0)
			return -1;
	}
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
	/* Megatron's offload groups: each layer's plan per run. */
	const kiln_ir_graph *g = c->graph;
	mg->n_runs = ma.n_runs;
	mg->run_end = ma.run_end;
	mg->layer_plan = kiln_arena_alloc(a, sizeof(int32_t *) * (size_t)(g->n_layers + 1));
	if (!mg->layer_plan)
		return -1;
	for (int32_t l = 0; l < g->n_layers; l++) {
		mg->layer_plan[l] = NULL;
		int32_t i = set_of_layer(c, l), s = g->layers[l].stage;
		if (!ma.layer_actions[l] || i < 0)
			continue;
		mg->layer_plan[l] = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)ma.n_runs[s]);
		if (!mg->layer_plan[l])
			return -1;
		for (int32_t r = 0; r < ma.n_runs[s]; r++)
			if ((mg->layer_plan[l][r] = kiln_plan_pool_add(c->pool, a, &c->sets[i],
			                                               ma.layer_actions[l][r])) < 0)
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
	return group_fallbacks(c);
}
