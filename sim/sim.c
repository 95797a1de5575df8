/* sim/sim.c: the iteration loop (docs/simulator.md, "The iteration").
 *
 * Per iteration and EP group: the load factors of every rank for every
 * (micro-batch, MoE layer) from the profile, shared by all policies. Per
 * policy, stage by stage in 1F1B forward order, each layer's decision with
 * the memory the device really has free (static bytes, the micro-batches
 * still in flight, this micro-batch's earlier layers), its time at the
 * layer's load plus the policy's exposed time; a layer lasts as long as its
 * slowest EP rank. The pipeline (sim/pipeline.c) turns the per-(stage,
 * micro-batch) times into the group's iteration; the iteration ends with
 * its slowest group. A device over capacity is an out-of-memory failure:
 * a restart plus the progress since the last checkpoint.
 *
 * Exact mode follows every EP rank. The default (statistical) method is
 * never more optimistic than exact mode on the same loads (no fewer
 * failures or over-budget decisions, no lower peak, no higher throughput;
 * docs/simulator.md, "Scale"): ranks with the same loads decide alike, so
 * one of each is followed, weighted; an adaptive policy follows every such
 * rank; a static policy, whose decisions ignore free memory, is timed by
 * an envelope that reproduces the slowest rank of each load bucket at each
 * layer, and follows for memory only the ranks whose bound on device bytes
 * (from their rows alone) could raise a peak or exceed the capacity.
 *
 * The policies run on threads (one per online CPU, at most 8): the threads
 * sample each group's loads together, then take the policies one at a
 * time. A policy's state and results belong to the thread running it, so
 * the results are the same on any number of threads.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "costmodel/costmodel.h"
#include "passes/passes.h"
#include "sim/sim.h"

#define GRID 33 /* time samples per layer over [0, n_max] */
/* Threads a run takes at most (one per online CPU by default). */
#define KILN_SIM_MAX_THREADS 8

typedef struct layer_info {
	int32_t graph_layer; /* index into graph->layers */
	int32_t model_layer; /* -1 for embedding and head */
	int32_t set;         /* unit set, or -1 (not planned) */
	int32_t chunk;
	int32_t moe_index;   /* 0.. among the model's MoE layers, or -1 */
	int transformer;     /* a transformer layer (dense or MoE): the host floor applies */
	double n_bal, n_max;
	double fwd[GRID], bwd[GRID]; /* times at n = k * n_max / (GRID - 1) */
	double fa2a[GRID], ba2a[GRID]; /* their EP all-to-all parts */
} layer_info;

typedef struct stage_info {
	layer_info *layers;
	int32_t n_layers;
	double capacity, static_bytes, fixed_bytes;
	int32_t window; /* micro-batches held at once (ceil of inflight) */
	kiln_cost_step_dp dp; /* its data-parallel traffic and optimizer step */
} stage_info;

typedef struct world {
	const kiln_compilation *c;
	stage_info *stages;
	int32_t p, m, v;
	int32_t n_moe;   /* MoE layers of the model */
	int32_t ep, groups;
	/* Whether every layer's forward and backward times are nondecreasing
	 * in its rows (on the grid, hence everywhere: interpolation and the
	 * extended last segment keep the order): the statistical method times
	 * a static policy by each layer's largest load only when they are. */
	int monotone;
	int32_t *moe_set; /* per MoE layer (model order): its unit set, or -1 */
	double *moe_nbal; /* and its balanced rows */
	double r_max;  /* the largest load factor routing can produce (sample_share clamps to it) */
	size_t
	    stride; /* scratch entries per (stage, micro-batch): 3 per layer of the largest stage */
	kiln_load_shape shape;
	double tokens_per_iter, model_flops, peak_flops;
	double p2p_us; /* one activation's (or gradient's) transfer between two stages */
	kiln_cost_step_params sp; /* the step model's figures: the host floor */
	int overlap;              /* overlap_ep_comm: combined 1F1B steps */
} world;

static double interp(const double *grid, double n_max, double n)
{
	if (!(n_max > 0))
		return grid[0];
	double x = n / n_max * (GRID - 1);
	if (!(x > 0)) /* NaN too */
		return grid[0];
	/* Beyond the grid: extend its last segment. x is compared before it
	 * is converted, so no load, however large, makes an out-of-range int. */
	int k = x < GRID - 1 ? (int)x : GRID - 2;
	double f = x - k;
	return grid[k] + (grid[k + 1] - grid[k]) * f;
}

/* Bytes or rows as the runtime's 64-bit fields take them: NaN and
 * negatives 0, anything at or past 2^64 saturated (a plain conversion of
 * such a double is undefined). */
static uint64_t u64_sat(double x)
{
	if (!(x > 0))
		return 0;
	return x < 0x1p64 ? (uint64_t)x : UINT64_MAX;
}

void kiln_sim_load_shape(const kiln_compilation *c, kiln_load_shape *out)
{
	const kiln_ir_graph *g = c->graph;
	const kiln_model *m = c->model;
	int32_t ep = m->moe ? (int32_t)m->ep : 1, n_moe = 0;
	for (int32_t l = 0; l < g->n_layers; l++)
		n_moe += g->layers[l].kind == KILN_LAYER_MOE;
	double top_k = m->moe ? (double)m->top_k : 1;
	double n_bal = 0;
	for (int32_t l = 0; l < g->n_layers && n_bal == 0; l++)
		n_bal = g->layers[l].n_balanced;
	*out = (kiln_load_shape){
	    .ep = ep,
	    .experts_per_rank = m->moe ? (int32_t)(m->experts / m->ep) : 1,
	    .top_k = (int32_t)top_k,
	    .tokens = (int64_t)(n_bal / top_k * ep),
	    /* Saturated, never truncated; kiln_sim_run refuses
	     * counts it cannot represent. */
	    .microbatches = m->micro_batches > INT32_MAX ? INT32_MAX : (int32_t)m->micro_batches,
	    .layers = n_moe};
}

static int build_world(const kiln_compilation *c, kiln_arena *a, world *w)
{
	const kiln_ir_graph *g = c->graph;
	const kiln_model *m = c->model;
	memset(w, 0, sizeof *w);
	w->c = c;
	w->p = g->n_stages;
	w->m = (int32_t)m->micro_batches; /* checked by kiln_sim_run */
	w->v = m->schedule == KILN_SCHED_INTERLEAVED && m->vpp > 1 ? (int32_t)m->vpp : 1;
	w->ep = m->moe ? (int32_t)m->ep : 1;
	/* Saturated: a job of more than 2^31 - 1 groups is over the decision
	 * bound unless --groups caps it (kiln_sim_groups). */
	int64_t groups = kiln_sim_groups(m, 0);
	w->groups = groups > INT32_MAX ? INT32_MAX : (int32_t)groups;
	w->stages = kiln_arena_alloc(a, sizeof(stage_info) * (size_t)w->p);
	if (!w->stages)
		return -1;
	double cap = m->max_factor * 1.5;
	for (int32_t s = 0; s < w->p; s++) {
		const kiln_ir_stage *st = &g->stages[s];
		stage_info *si = &w->stages[s];
		si->n_layers = st->layer_end - st->layer_begin;
		si->layers = kiln_arena_alloc(a, sizeof(layer_info) * (size_t)(si->n_layers + 1));
		if (!si->layers)
			return -1;
		si->capacity = c->budgets[s].capacity_bytes;
		si->static_bytes = c->budgets[s].static_bytes;
		si->fixed_bytes = c->budgets[s].fixed_bytes;
		double win = ceil(c->budgets[s].inflight);
		si->window = win >= 1 ? (int32_t)win : 1;
		for (int32_t i = 0; i < si->n_layers; i++) {
			int32_t l = st->layer_begin + i;
			const kiln_ir_layer *L = &g->layers[l];
			layer_info *li = &si->layers[i];
			li->graph_layer = l;
			li->model_layer = L->index;
			li->chunk = L->chunk;
			li->set = -1;
			li->moe_index = -1;
			if (L->index >= 0)
				li->set = kiln_set_of_layer(c->sets, c->n_sets, L);
			li->transformer = L->kind == KILN_LAYER_DENSE || L->kind == KILN_LAYER_MOE;
			li->n_bal = L->kind == KILN_LAYER_MOE ? L->n_balanced : 0;
			li->n_max = li->n_bal * cap;
			for (int k = 0; k < GRID; k++) {
				double n = li->n_max * k / (GRID - 1), f = 0, b = 0, fa = 0, ba = 0;
				for (int32_t o = L->op_begin; o < L->op_end; o++) {
					const kiln_ir_op *op = &g->ops[o];
					double us = kiln_cost_op_time_us(g, op, n);
					int a2a =
					    kiln_ir_op_kind_class(op->kind) == KILN_OPCLASS_COMM_EP;
					if (op->backward) {
						b += us;
						ba += a2a ? us : 0;
					} else {
						f += us;
						fa += a2a ? us : 0;
					}
				}
				li->fwd[k] = f;
				li->bwd[k] = b;
				li->fa2a[k] = fa;
				li->ba2a[k] = ba;
			}
		}
	}
	w->monotone = 1;
	for (int32_t s = 0; s < w->p; s++)
		for (int32_t i = 0; i < w->stages[s].n_layers; i++)
			for (int k = 1; k < GRID; k++) {
				const layer_info *li = &w->stages[s].layers[i];
				w->monotone &=
				    li->fwd[k] >= li->fwd[k - 1] && li->bwd[k] >= li->bwd[k - 1];
			}
	size_t most = 1;
	for (int32_t s = 0; s < w->p; s++)
		most = (size_t)w->stages[s].n_layers > most ? (size_t)w->stages[s].n_layers : most;
	w->stride = 3 * most;
	/* MoE layers numbered in model order, for the load profile. */
	for (int32_t l = 0; l < g->n_layers; l++)
		if (g->layers[l].kind == KILN_LAYER_MOE)
			w->n_moe++;
	for (int32_t s = 0; s < w->p; s++)
		for (int32_t i = 0; i < w->stages[s].n_layers; i++) {
			layer_info *li = &w->stages[s].layers[i];
			if (g->layers[li->graph_layer].kind != KILN_LAYER_MOE)
				continue;
			int32_t k = 0;
			for (int32_t l = 0; l < li->graph_layer; l++)
				k += g->layers[l].kind == KILN_LAYER_MOE;
			li->moe_index = k;
		}
	w->moe_set = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(w->n_moe + 1));
	w->moe_nbal = kiln_arena_alloc(a, sizeof(double) * (size_t)(w->n_moe + 1));
	if (!w->moe_set || !w->moe_nbal)
		return -1;
	for (int32_t s = 0; s < w->p; s++)
		for (int32_t i = 0; i < w->stages[s].n_layers; i++) {
			const layer_info *li = &w->stages[s].layers[i];
			if (li->moe_index >= 0) {
				w->moe_set[li->moe_index] = li->set;
				w->moe_nbal[li->moe_index] = li->n_bal;
			}
		}
	kiln_sim_load_shape(c, &w->shape);
	w->r_max = kiln_sim_load_factor_max(&w->shape);
	/* From the step-time model (costmodel/step.c), the one time model: the
	 * model FLOPs as Megatron counts them, and the pipeline's transfer time.
	 * Its p2p_us is the busiest stage's sends of one micro-batch, one per
	 * model chunk it holds (v under interleaving, each the same
	 * activation), so one transfer takes p2p_us / v; the layer times above
	 * hold none (kiln_cost_op_time_us prices a send 0), the pipeline timing
	 * adds it between stages (sim/pipeline.c). */
	kiln_cost_step st;
	kiln_cost_step_estimate(g, 1.0, NULL, &st);
	w->model_flops = st.model_flops;
	w->p2p_us = st.p2p_us / (double)w->v;
	w->tokens_per_iter = (double)m->global_batch * (double)m->seq_len;
	w->peak_flops = m->hw.peak_tflops * 1e12;
	/* The step's terms beyond the op times, with its own formulas
	 * (costmodel/step.c): the host floor per layer, the combined steps
	 * of EP overlap, each stage's data-parallel traffic and optimizer. */
	kiln_cost_step_params_of(&m->hw, &w->sp);
	w->overlap = m->overlap_ep_comm && w->ep > 1;
	for (int32_t s = 0; s < w->p; s++)
		kiln_cost_step_stage_dp(g, s, &w->sp, &w->stages[s].dp);
	return 0;
}

/* Per-iteration scratch of one policy and group. */
typedef struct scratch {
	double *fwd, *bwd;    /* per (stage, chunk, micro-batch), pipeline layout */
	/* Per (stage, micro-batch, layer), the slowest rank's, 3 entries
	 * each: layer_f its forward, copy exposure and forward all-to-all;
	 * layer_b its backward (exposed work included), recompute exposure and
	 * backward all-to-all; the device's times, before the host floor.
	 * With envelope.no_slack the entries are the group's largest of each
	 * (layer_b's first: the largest compute plus layer_e, the largest
	 * exposed time, whose rank's copy and recompute parts they keep). */
	double *layer_f, *layer_b;
	double *layer_e;
	double *held;         /* per micro-batch of the current stage: device bytes */
	double *peak;         /* per stage */
	size_t n_lay;         /* entries of layer_f and layer_b */
	double *bound;        /* per (distinct rank, stage): a bound on its device bytes */
	struct ranked *order; /* the distinct ranks by bound */
	int oom;
	int64_t over_budget;
	/* megatron-paged-stash: per micro-batch of the current stage the CUDA
	 * and host pages it holds; whether a device of this attempt overflowed
	 * its stash or received more rows than its budget; and the most bytes
	 * one device spilled to host. */
	int64_t *st_cuda, *st_host;
	int stash_overflow, stash_over_budget;
	double spilled;
	kiln_rt *acct;        /* mirror of the kiln policy's memory, or NULL */
	kiln_progress *meter; /* the run's status line (decisions done), or NULL */
	int64_t acct_checks, acct_mismatches;
	double *experts; /* one sample's per-expert rows (ep * experts per rank) */
} scratch;

/* One group's iteration as every policy sees it: the loads, and per
 * (micro-batch, MoE layer) the largest factor of any rank. */
typedef struct envelope {
	const double *loads;          /* [(i * n_moe + k) * ep + r] */
	const double *top;            /* per (i, k): the largest factor over the ranks */
	const struct row_buckets *rb; /* per (i, k): the load buckets the ranks take */
	/* megatron-paged-stash: per (i, k, rank) each local expert's share of
	 * the rank's rows, [((i * n_moe + k) * ep + r) * e + j]; NULL when no
	 * policy needs them. */
	const double *shares;
	int32_t e;
	const uint8_t *trig; /* per (i, k): a trigger policy's state (1: fired) */
	/* Per (i, k, rank) the rows each rank of the group receives, as the
	 * kiln policies' queries take them (kiln_query.group_rows: what the
	 * count exchange before the dispatch tells every rank), [(i * n_moe +
	 * k) * ep + r]; NULL: the queries carry no group counts
	 * (kiln_sim_config.no_group_counts). */
	const uint32_t *group_rows;
	/* kiln_sim_config.no_slack: a layer's exposed time is the group's
	 * largest, added to its largest compute, instead of each rank's added
	 * to its own compute. */
	int no_slack;
} envelope;

/* The load buckets the ranks of one (micro-batch, MoE layer) take, as a
 * static policy's decision finds them (kiln_sim_policy_bucket), and
 * whether a trigger policy's trigger is off there (cold) or fired (hot):
 * the trigger is the EP group's, the same for every rank. */
#define ROW_SLOTS 32
typedef struct row_buckets {
	uint64_t bits[KILN_PLAN_MAX_BUCKETS / KILN_SIM_BUCKET_WORD_BITS];
	int cold, hot;
	/* Per (bucket, trigger) the ranks take, the largest factor among
	 * them; n_slots -1 when more than ROW_SLOTS (the bits then stand). */
	int32_t n_slots;
	int32_t key[ROW_SLOTS];
	double top[ROW_SLOTS];
} row_buckets;

/* The largest factor and the buckets of every (micro-batch, MoE layer)
 * of micro-batches i0, i0 + step, ... */
static void envelope_rows(const world *w, const double *loads, const uint8_t *trig, int32_t i0,
                          int32_t step, double *top, row_buckets *rb)
{
	for (int32_t i = i0; i < w->m; i += step)
		for (int32_t k = 0; k < w->n_moe; k++) {
			size_t at = (size_t)i * w->n_moe + k;
			const double *v = &loads[at * w->ep];
			double t = v[0];
			for (int32_t r = 1; r < w->ep; r++)
				t = v[r] > t ? v[r] : t;
			top[at] = t;
			row_buckets *b = &rb[at];
			memset(b, 0, sizeof *b);
			int32_t set = w->moe_set[k];
			int hot = trig ? trig[at] : 0;
			for (int32_t r = 0; r < w->ep && set >= 0; r++) {
				/* n as run_rank computes it, then as the policy does. */
				double f, n = v[r] * w->moe_nbal[k];
				int32_t x = kiln_sim_policy_bucket(w->c, set, n, &f);
				x = x < KILN_PLAN_MAX_BUCKETS ? x : KILN_PLAN_MAX_BUCKETS - 1;
				b->bits[x / KILN_SIM_BUCKET_WORD_BITS] |=
				    (uint64_t)1 << (x % KILN_SIM_BUCKET_WORD_BITS);
				(void)f;
				b->cold |= !hot;
				b->hot |= hot;
				int32_t key = 2 * x + hot, j = 0;
				while (j < b->n_slots && b->key[j] != key)
					j++;
				if (j < b->n_slots) {
					b->top[j] = v[r] > b->top[j] ? v[r] : b->top[j];
				} else if (b->n_slots >= 0 && b->n_slots < ROW_SLOTS) {
					b->key[b->n_slots] = key;
					b->top[b->n_slots++] = v[r];
				} else {
					b->n_slots = -1;
				}
			}
		}
}

/* One rank through one iteration under policy pol: decisions, memory,
 * per-layer times (kept as the maximum over the ranks seen), at env's
 * loads. rank -1 is the envelope of a static policy: at each layer the
 * largest load of any rank, timed with the policy's exposed-time bound
 * (kiln_sim_policy_exposed_bound), its memory never counted. memory:
 * whether this rank's memory counts (peak, out-of-memory); timed: whether
 * its layer times do; weight: how many ranks of the group have exactly
 * this rank's loads (and so its decisions), for the over-budget count;
 * stages s0 .. s1 - 1 only (each stage's part of a pass is independent of
 * the others'). */
static void run_rank(const world *w, const kiln_sim_policy *pol, int unbounded, const envelope *env,
                     int32_t rank, int64_t weight, int memory, int timed, int32_t s0, int32_t s1,
                     scratch *sc)
{
	const kiln_hardware *hw = &w->c->model->hw;
	double multiple;
	int triggered = kiln_sim_policy_trigger(pol, &multiple) && env->trig;
	for (int32_t s = s0; s < s1; s++) {
		const stage_info *si = &w->stages[s];
		/* megatron-paged-stash's first attempt: the stage's CUDA pages
		 * are held all the time, beside the static bytes; the device's
		 * overflow flag stops every later stash of the step (Megatron's
		 * copy kernel, moe/ops/paged_stash.py:50-98). */
		kiln_sim_stash st;
		int stash = kiln_sim_policy_stash(pol, s, &st) == 0, overflowed = 0;
		double stat = si->static_bytes + (stash ? st.cuda_bytes : 0), spilled = 0;
		if (sc->acct)
			kiln_rt_acct_reset(sc->acct, s, 0);
		/* The oracle plans the rank's whole stage at once, knowing every
		 * load (sim/oracle.c); the loop below then replays its choices. */
		kiln_sim_choice *planned = NULL;
		kiln_sim_oracle *orc = rank >= 0 ? kiln_sim_policy_oracle(pol) : NULL;
		if (orc) {
			size_t n_at = (size_t)w->m * (size_t)si->n_layers;
			int32_t *sets = malloc(sizeof(int32_t) * ((size_t)si->n_layers + 1));
			double *rows = malloc(sizeof(double) * (n_at + 1));
			planned = malloc(sizeof(kiln_sim_choice) * (n_at + 1));
			int64_t over = 0;
			for (int32_t l = 0; sets && rows && l < si->n_layers; l++) {
				const layer_info *li = &si->layers[l];
				sets[l] = li->set;
				for (int32_t i = 0; i < w->m; i++) {
					double r = 1;
					if (li->moe_index >= 0)
						r = env->loads[((size_t)i * w->n_moe +
						                li->moe_index) *
						                   w->ep +
						               rank];
					rows[(size_t)i * si->n_layers + l] = r * li->n_bal;
				}
			}
			kiln_sim_oracle_stage ost = {.m = w->m,
			                             .n_layers = si->n_layers,
			                             .window = si->window,
			                             .sets = sets,
			                             .rows = rows,
			                             .capacity = si->capacity,
			                             .static_bytes = stat,
			                             .fixed_bytes = si->fixed_bytes};
			if (!sets || !rows || !planned ||
			    kiln_sim_oracle_plan(orc, &ost, planned, &over) != 0) {
				/* Exhaustion: counted as a failure, never as a fit. */
				free(planned);
				planned = calloc(n_at + 1, sizeof(kiln_sim_choice));
				sc->oom = 1;
				if (!planned) {
					free(sets);
					free(rows);
					continue;
				}
			}
			free(sets);
			free(rows);
		}
		for (int32_t i = 0; i < w->m; i++) {
			/* The micro-batch leaving the window has run its backward. */
			if (sc->acct && i - si->window >= 0 &&
			    kiln_rt_acct_record(sc->acct, (uint32_t)(i - si->window),
			                        KILN_ACCT_FREED,
			                        u64_sat(sc->held[i - si->window])) != 0)
				sc->acct_mismatches++;
			/* In flight beside micro-batch i: the window before it. */
			double others = 0;
			for (int32_t j = i - si->window + 1; j < i; j++)
				if (j >= 0)
					others += sc->held[j];
			uint32_t pending = i < si->window - 1 ? (uint32_t)(si->window - 1 - i) : 0;
			double cur = ceil(si->fixed_bytes - 1e-6), transient = 0;
			double chunk_saved = 0, chunk_ws = 0; /* the uniform chunk so far */
			/* Pages the window before micro-batch i holds (freed, as its
			 * bytes are, by the backward of the micro-batch leaving it). */
			int64_t used_c = 0, used_h = 0;
			if (stash) {
				sc->st_cuda[i] = sc->st_host[i] = 0;
				for (int32_t j = i - si->window + 1; j < i; j++)
					if (j >= 0)
						used_c += sc->st_cuda[j], used_h += sc->st_host[j];
			}
			if (sc->acct && kiln_rt_acct_record(sc->acct, (uint32_t)i,
			                                    KILN_ACCT_PRODUCED, u64_sat(cur)) != 0)
				sc->acct_mismatches++;
			for (int32_t l = 0; l < si->n_layers; l++) {
				const layer_info *li = &si->layers[l];
				double r = 1;
				const row_buckets *rb = NULL;
				int fired = -1; /* a trigger policy's state at an MoE layer */
				if (li->moe_index >= 0) {
					size_t at = (size_t)i * w->n_moe + li->moe_index;
					r = rank >= 0 ? env->loads[at * w->ep + rank]
					              : env->top[at];
					rb = &env->rb[at];
					fired = triggered ? env->trig[at] : -1;
				}
				/* The rows the experts process (megatron-capacity:
				 * padded to capacity). */
				double n = kiln_sim_policy_rows(pol, li->set, r * li->n_bal), f = 0,
				       b = 0, fa = 0, ba = 0;
				if (timed) {
					f = interp(li->fwd, li->n_max, n);
					b = interp(li->bwd, li->n_max, n);
					fa = interp(li->fa2a, li->n_max, n);
					ba = interp(li->ba2a, li->n_max, n);
				}
				kiln_sim_choice ch = {0};
				if (li->set >= 0) {
					double free_b = si->capacity - stat - others - cur;
					if (planned)
						ch = planned[(size_t)i * si->n_layers + l];
					else if (fired >= 0)
						kiln_sim_policy_decide_triggered(
						    pol, li->set, li->model_layer, n, fired, &ch);
					else if (env->group_rows && rank >= 0 && li->moe_index >= 0)
						kiln_sim_policy_decide_group(
						    pol, li->set, li->model_layer, n, free_b,
						    pending, (uint32_t)i, cur,
						    &env->group_rows[((size_t)i * w->n_moe +
						                      (size_t)li->moe_index) *
						                     (size_t)w->ep],
						    w->ep, &ch);
					else
						kiln_sim_policy_decide(
						    pol, li->set, li->model_layer, n, free_b,
						    pending, (uint32_t)i, cur, &ch);
					double bound;
					if (rank < 0 && rb && rb->n_slots > 0) {
						/* A static policy's layer time depends on the
						 * load alone, through the compute (growing with
						 * the rows: world.monotone) and the bucket's
						 * exposed time: in each bucket the most loaded
						 * rank is the slowest. Times the slowest of
						 * those (ties: the larger forward and backward
						 * of both). */
						double bf = -1, bb = -1, bfa = 0, bba = 0;
						/* no_slack: the largest of each over the slots */
						double mf = 0, mb = 0, mfa = 0, mba = 0;
						kiln_sim_choice ce = {0};
						for (int32_t j = 0; j < rb->n_slots; j++) {
							double nj = kiln_sim_policy_rows(
							    pol, li->set, rb->top[j] * li->n_bal);
							double fj = interp(li->fwd, li->n_max, nj);
							double bj = interp(li->bwd, li->n_max, nj);
							kiln_sim_choice cj;
							if (fired >= 0)
								kiln_sim_policy_decide_triggered(
								    pol, li->set, li->model_layer,
								    nj, fired, &cj);
							else
								kiln_sim_policy_decide(
								    pol, li->set, li->model_layer,
								    nj, free_b, pending,
								    (uint32_t)i, cur, &cj);
							/* The all-to-alls grow with the rows as
							 * the rest does: the slowest rank's. */
							double faj =
							    interp(li->fa2a, li->n_max, nj);
							double baj =
							    interp(li->ba2a, li->n_max, nj);
							mf = fj > mf ? fj : mf;
							mb = bj > mb ? bj : mb;
							mfa = faj > mfa ? faj : mfa;
							mba = baj > mba ? baj : mba;
							if (cj.exposed_us > ce.exposed_us)
								ce = cj;
							bj += cj.exposed_us;
							if (fj + bj > bf + bb) {
								bf = fj, bb = bj, ch = cj;
								bfa = faj, bba = baj;
							} else if (fj + bj == bf + bb) {
								bf = fj > bf ? fj : bf;
								bb = bj > bb ? bj : bb;
								bfa = faj > bfa ? faj : bfa;
								bba = baj > bba ? baj : bba;
							}
						}
						f = bf;
						b = bb - ch.exposed_us;
						fa = bfa;
						ba = bba;
						if (env->no_slack) {
							f = mf, b = mb, fa = mfa, ba = mba;
							ch.exposed_us = ce.exposed_us;
							ch.recompute_us = ce.recompute_us;
							ch.copy_us = ce.copy_us;
						}
					} else if (rank < 0 && rb &&
					           kiln_sim_policy_exposed_bound(
					               pol, li->set, rb->bits, rb->cold, rb->hot,
					               &bound) == 0) {
						/* More buckets than slots: every rank's load here
						 * is at most n, in one of these buckets, so none
						 * takes longer than n's compute plus the bound.
						 * (A dense layer has no load: every rank decides
						 * alike.) */
						ch.recompute_us = ch.recompute_us < bound
						                      ? ch.recompute_us
						                      : bound;
						ch.copy_us = bound - ch.recompute_us;
						ch.exposed_us = bound;
					}
					if (stash && li->moe_index >= 0) {
						const double *sh =
						    env->shares && rank >= 0
						        ? &env->shares[(((size_t)i * w->n_moe +
						                         (size_t)li->moe_index) *
						                            (size_t)w->ep +
						                        (size_t)rank) *
						                       (size_t)env->e]
						        : NULL;
						double extra = kiln_sim_stash_place(
						    &st, hw, n, sh, &sc->st_cuda[i],
						    &sc->st_host[i], used_c, used_h, &overflowed,
						    &spilled, &sc->stash_over_budget);
						ch.exposed_us += extra;
						ch.copy_us += extra;
					}
					cur += ch.resident_bytes;
					if (sc->acct) {
						kiln_acct ac;
						kiln_rt_acct_record(sc->acct, (uint32_t)i,
						                    KILN_ACCT_PRODUCED,
						                    u64_sat(ch.resident_bytes));
						kiln_rt_acct_get(sc->acct, &ac);
						sc->acct_checks++;
						sc->acct_mismatches += (double)ac.device_bytes != others + cur;
					}
					double tr = ch.transient_bytes;
					if (ch.chunk) {
						/* A uniform chunk: what its layers rebuild
						 * adds up, beside the largest workspace. */
						double kept =
						    ch.transient_bytes - ch.workspace_bytes;
						chunk_saved =
						    ch.chunk == 1 ? kept : chunk_saved + kept;
						chunk_ws =
						    ch.chunk == 1 || ch.workspace_bytes > chunk_ws
						        ? ch.workspace_bytes
						        : chunk_ws;
						tr = chunk_saved + chunk_ws;
					}
					transient = tr > transient ? tr : transient;
					b += ch.exposed_us;
					sc->over_budget += ch.over_budget * weight;
					/* The slowest rank's overhead is what the critical
					 * path sees: kept with its layer time below. */
					size_t at =
					    ((size_t)s * w->m + i) * w->stride + 3 * (size_t)l;
					if (!env->no_slack && timed &&
					    f + b > sc->layer_f[at] + sc->layer_b[at]) {
						sc->layer_b[at + 1] = ch.recompute_us; /* reused as rec */
						sc->layer_f[at + 1] = ch.copy_us;      /* reused as copy */
					}
				}
				size_t at = ((size_t)s * w->m + i) * w->stride + 3 * (size_t)l;
				if (timed && env->no_slack) {
					/* No slack: the group's largest forward, largest
					 * backward compute and largest exposed time, as if
					 * every rank's exposed work ran where no other
					 * rank waits. */
					double bc = b - ch.exposed_us, e = sc->layer_e[at];
					double bmax = sc->layer_b[at] - e;
					if (ch.exposed_us > e) {
						e = sc->layer_e[at] = ch.exposed_us;
						sc->layer_b[at + 1] = ch.recompute_us;
						sc->layer_f[at + 1] = ch.copy_us;
					}
					sc->layer_b[at] = (bc > bmax ? bc : bmax) + e;
					sc->layer_f[at] = f > sc->layer_f[at] ? f : sc->layer_f[at];
					sc->layer_f[at + 2] =
					    fa > sc->layer_f[at + 2] ? fa : sc->layer_f[at + 2];
					sc->layer_b[at + 2] =
					    ba > sc->layer_b[at + 2] ? ba : sc->layer_b[at + 2];
				} else if (timed && f + b > sc->layer_f[at] + sc->layer_b[at]) {
					sc->layer_f[at] = f;
					sc->layer_b[at] = b;
					sc->layer_f[at + 2] = fa;
					sc->layer_b[at + 2] = ba;
				}
			}
			sc->held[i] = cur;
			if (!memory)
				continue;
			double device = stat + others + cur + transient;
			sc->peak[s] = device > sc->peak[s] ? device : sc->peak[s];
			if (!unbounded && device > si->capacity)
				sc->oom = 1;
		}
		free(planned);
		sc->stash_overflow |= overflowed;
		sc->spilled = spilled > sc->spilled ? spilled : sc->spilled;
		kiln_progress_add(sc->meter, (int64_t)si->n_layers * w->m);
	}
}

/* One layer's record for micro-batch i on stage s (the slowest rank's,
 * scratch.layer_f and layer_b): its forward and backward after the host
 * floor (kiln_cost_step_host_floor), and the copy and recompute exposure
 * that lengthened them: beneath the floor exposed work costs nothing, so
 * each share is scaled by max(device, H) - max(device without it, H) over
 * the exposure. */
typedef struct layer_time {
	double f, b, copy, rec;
} layer_time;

static layer_time layer_at(const world *w, const scratch *sc, int32_t s, int32_t i, int32_t l)
{
	const layer_info *li = &w->stages[s].layers[l];
	size_t at = ((size_t)s * w->m + i) * w->stride + 3 * (size_t)l;
	layer_time t = {sc->layer_f[at], sc->layer_b[at], sc->layer_f[at + 1], sc->layer_b[at + 1]};
	double full = t.f + t.b, exposed = t.copy + t.rec;
	kiln_cost_step_host_floor(&w->sp, li->transformer, &t.f, &t.b);
	double host = li->transformer ? w->sp.host_layer_us : 0;
	if (exposed > 0 && host > full - exposed) {
		double without = full - exposed;
		double share =
		    ((full > host ? full : host) - (without > host ? without : host)) / exposed;
		t.copy *= share;
		t.rec *= share;
	}
	return t;
}

/* Sum over the layers of one chunk (-1: every chunk) of stage s for
 * micro-batch i: part 0 the forward (bwd 0) or backward (bwd 1) times;
 * part 1 the copy (bwd 0) or recompute (bwd 1) exposure; after the host
 * floor (layer_at). */
static double sum_layers(const world *w, const scratch *sc, int32_t s, int32_t i, int32_t chunk,
                         int bwd, int part)
{
	const stage_info *si = &w->stages[s];
	double t = 0;
	for (int32_t l = 0; l < si->n_layers; l++) {
		if (chunk >= 0 && si->layers[l].chunk != chunk)
			continue;
		layer_time lt = layer_at(w, sc, s, i, l);
		t += part ? (bwd ? lt.rec : lt.copy) : (bwd ? lt.b : lt.f);
	}
	return t;
}

/* kiln_pipe_work.pair_us for the simulator: the combined step of the
 * forward of (chunk, micro-batch) fwd and the backward of bwd on one stage,
 * as Megatron-Core runs it (TransformerModelChunkSchedulePlan.run,
 * megatron/core/models/common/model_chunk_schedule_plan.py lines 554-614 at
 * d98e8a64): the forward's embedding and the backward's output layer alone,
 * then the forward's transformer layer q beside the backward's layer
 * n_b - 1 - q (the backward pops them from the end), each such pair
 * kiln_cost_step_pair_us, the layers left over in either alone (host floor
 * applied), then the forward's output layer and the backward's embedding
 * alone. */
typedef struct pair_ctx {
	const world *w;
	const scratch *sc;
} pair_ctx;

static double pair_step_us(const void *ctx, const kiln_pipe_op *fo, const kiln_pipe_op *bo)
{
	const pair_ctx *pc = ctx;
	const world *w = pc->w;
	const scratch *sc = pc->sc;
	int32_t s = fo->stage, n = w->stages[s].n_layers;
	const layer_info *ls = w->stages[s].layers;
	double t = 0;
	int32_t q = 0, r = n - 1; /* the forward's next layer, the backward's */
	for (;;) {
		while (q < n && ls[q].chunk != fo->chunk)
			q++;
		while (r >= 0 && ls[r].chunk != bo->chunk)
			r--;
		if (q < n && !ls[q].transformer) {
			t += layer_at(w, sc, s, fo->microbatch, q++).f;
			continue;
		}
		if (r >= 0 && !ls[r].transformer) {
			t += layer_at(w, sc, s, bo->microbatch, r--).b;
			continue;
		}
		if (q >= n || r < 0)
			break;
		size_t af = ((size_t)s * w->m + fo->microbatch) * w->stride + 3 * (size_t)q;
		size_t ab = ((size_t)s * w->m + bo->microbatch) * w->stride + 3 * (size_t)r;
		t += kiln_cost_step_pair_us(&w->sp, 1, sc->layer_f[af], sc->layer_f[af + 2],
		                            sc->layer_b[ab], sc->layer_b[ab + 2]);
		q++, r--;
	}
	for (; q < n; q++)
		if (ls[q].chunk == fo->chunk)
			t += layer_at(w, sc, s, fo->microbatch, q).f;
	for (; r >= 0; r--)
		if (ls[r].chunk == bo->chunk)
			t += layer_at(w, sc, s, bo->microbatch, r).b;
	return t;
}

/* One run of kiln_sim_run, shared by its threads. Per iteration and group
 * the threads sample the loads together (a share of the micro-batches
 * each), then take the policies one at a time until none is left; a
 * policy's state and results are touched by the thread running it only,
 * and barriers order the phases, so the results do not depend on the
 * number of threads or on which thread ran what. */
typedef struct run {
	const kiln_sim_config *cfg;
	const world *w, *w2; /* w2: kiln:no-offload's */
	const world *w3;     /* adapipe's own partition (cfg->c_adapipe), or NULL */
	const kiln_sim_policy_kind *policies;
	kiln_sim_policy **pols;
	kiln_sim_result *out;
	kiln_pipe_op **ops; /* per policy: room for the last iteration's schedule */
	FILE *err;
	int32_t n, groups, threads;
	double *loads, *top;
	row_buckets *rb;
	uint32_t *group_rows; /* per (i, k, rank): envelope.group_rows */
	/* Per (micro-batch, MoE layer, rank) its local experts' shares of its
	 * rows (envelope.shares), when a policy needs them (the paged stash),
	 * else NULL; e local experts per rank. */
	double *shares;
	int32_t e;
	/* Per (stage, micro-batch, rank): the sum and the largest of the
	 * rank's rows over the stage's MoE layers (the statistical method's
	 * memory bound for static policies). */
	double *sum_n, *max_n;
	double *sum_n3, *max_n3; /* the same over w3's stages */
	int any_static; /* the statistical method runs a static policy: needs rb, sum_n, max_n */
	/* A trigger policy (mindspeed; at most one: each policy runs once):
	 * its index (-1 without), the multiple of the balanced per-expert rows
	 * it fires above, and per (micro-batch, MoE layer) of this group's
	 * iteration whether it fired. */
	int32_t trig_policy;
	double trig_multiple;
	uint8_t *trig;
	/* The statistical method's ranks: one of each distinct load column
	 * (its lowest rank), and how many ranks share it; hashed in slots. */
	int32_t *uniq, n_uniq, *slots;
	int64_t *weight;
	size_t n_slots;
	/* And per stage (ep entries each), over its MoE layers' samples:
	 * stage_rows[stage_begin[s] .. stage_begin[s + 1]) are their offsets,
	 * all_rows every offset in order. */
	int32_t *uniq_s, *n_uniq_s;
	int64_t *weight_s;
	size_t *stage_rows, *stage_begin, *all_rows;
	/* Per policy, this iteration: the slowest group's time, whether a
	 * device ran out of memory, the exposed recompute and copies. */
	double worst[KILN_SIM_MAX_POLICIES], rec[KILN_SIM_MAX_POLICIES],
	    copy[KILN_SIM_MAX_POLICIES];
	double routed[KILN_SIM_MAX_POLICIES];  /* megatron-capacity: expert rows routed */
	double dropped[KILN_SIM_MAX_POLICIES]; /* ... and dropped */
	int oom[KILN_SIM_MAX_POLICIES];
	/* megatron-paged-stash, this iteration: the rerun's slowest group,
	 * failure, exposed times and peaks (per policy, p stages each), and
	 * the first attempt's triggers and the most any device spilled. */
	double worst2[KILN_SIM_MAX_POLICIES], rec2[KILN_SIM_MAX_POLICIES];
	double copy2[KILN_SIM_MAX_POLICIES], spilled[KILN_SIM_MAX_POLICIES];
	int oom2[KILN_SIM_MAX_POLICIES], overflow[KILN_SIM_MAX_POLICIES];
	int over_budget2[KILN_SIM_MAX_POLICIES];
	double *peak2;
	double *iter_sum, *since_ckpt;
	int32_t order[KILN_SIM_MAX_POLICIES]; /* the policies in the order the threads take them */
	atomic_int next;   /* the next of order to take in this group */
	atomic_int failed; /* a pipeline failed to simulate */
	pthread_barrier_t phase;
	/* The threads wait here until the barrier counts those that started
	 * (go 1), or give up (go -1). */
	pthread_mutex_t gate;
	pthread_cond_t opened;
	int go;
	kiln_progress *meter; /* decisions done, iterations done; NULL without cfg->progress */
} run;

typedef struct worker {
	run *r;
	int32_t t; /* 0 is kiln_sim_run's own thread */
	scratch sc;
	pthread_t id;
} worker;

/* The local experts' shares of each rank's rows in group g's sample (it,
 * i, k) (kiln_load_sample_experts, normalised per rank; a rank without
 * rows splits evenly), so that they apply to the rows the simulator uses
 * after clamping the factors. */
static void expert_shares(run *r, int64_t it, int32_t i, int32_t k, int32_t g)
{
	const world *w = r->w;
	size_t e = (size_t)r->e;
	double *x = &r->shares[((size_t)i * w->n_moe + k) * (size_t)w->ep * e];
	kiln_load_sample_experts(r->cfg->loads, &w->shape, r->cfg->seed, it, i, k, g, x);
	for (int32_t q = 0; q < w->ep; q++) {
		double *v = &x[(size_t)q * e], sum = 0;
		for (size_t j = 0; j < e; j++)
			sum += v[j] > 0 ? v[j] : 0;
		for (size_t j = 0; j < e; j++)
			v[j] = sum > 0 ? (v[j] > 0 ? v[j] / sum : 0) : 1.0 / (double)e;
	}
}

/* Per (stage of sw, micro-batch i0, i0 + step, ..., rank): the sum and the
 * largest of the rank's rows over the stage's MoE layers. The loads are
 * indexed by MoE layer in model order, which every partition shares. */
static void stage_sums(const world *sw, const double *loads, int32_t i0, int32_t step,
                       double *sum_n, double *max_n)
{
	for (int32_t i = i0; i < sw->m; i += step)
		for (int32_t s = 0; s < sw->p; s++) {
			double *sum = &sum_n[((size_t)s * sw->m + i) * sw->ep];
			double *most = &max_n[((size_t)s * sw->m + i) * sw->ep];
			for (int32_t x = 0; x < sw->ep; x++)
				sum[x] = most[x] = 0;
			const stage_info *si = &sw->stages[s];
			for (int32_t l = 0; l < si->n_layers; l++) {
				const layer_info *li = &si->layers[l];
				if (li->moe_index < 0)
					continue;
				const double *v =
				    &loads[((size_t)i * sw->n_moe + li->moe_index) * sw->ep];
				for (int32_t x = 0; x < sw->ep; x++) {
					/* n as run_rank computes it. */
					double n = v[x] * li->n_bal;
					sum[x] += n;
					most[x] = n > most[x] ? n : most[x];
				}
			}
		}
}

/* The largest expert's rows in sample (it, i, k) of group g, each rank's
 * experts scaled as sample_share clamps the rank's factor. experts holds
 * ep * experts_per_rank rows. */
static double largest_expert(const run *r, double *experts, int64_t it, int32_t i, int32_t k,
                             int32_t g)
{
	const world *w = r->w;
	int32_t e = w->shape.experts_per_rank > 0 ? w->shape.experts_per_rank : 1;
	double bal = (double)w->shape.tokens * w->shape.top_k / w->ep, most = 0;
	kiln_load_sample_experts(r->cfg->loads, &w->shape, r->cfg->seed, it, i, k, g, experts);
	for (int32_t x = 0; x < w->ep; x++) {
		const double *v = &experts[(size_t)x * (size_t)e];
		double sum = 0, top = 0;
		for (int32_t j = 0; j < e; j++) {
			sum += v[j];
			top = v[j] > top ? v[j] : top;
		}
		double f = bal > 0 ? sum / bal : 1;
		if (f > w->r_max)
			top *= w->r_max / f;
		most = top > most ? top : most;
	}
	return most;
}

/* A trigger policy's state at micro-batch i and MoE layer k of group g in
 * iteration it: MindSpeed decides before the layer's forward from the
 * per-expert counts its token dispatcher kept from the layer's previous
 * forward (mindspeed/core/transformer/moe/moe_layer.py:141-145,
 * token_dispatcher.py:56-62 at 2.1.0_core_r0.8.0), that of micro-batch
 * i - 1, or for the first micro-batch the previous iteration's last
 * (after a failure too: the restart replays the iterations since the
 * checkpoint, failed one included, before the next); none before the
 * run's first forward, which fires (the counts are None). The counts are
 * the EP group's, gathered, so every rank of the group decides alike. */
static uint8_t trigger_at(const run *r, double *experts, int64_t it, int32_t i, int32_t k,
                          int32_t g)
{
	const world *w = r->w;
	int32_t e = w->shape.experts_per_rank > 0 ? w->shape.experts_per_rank : 1;
	double per_expert = (double)w->shape.tokens * w->shape.top_k / w->ep / e;
	double prev;
	if (i > 0)
		prev = largest_expert(r, experts, it, i - 1, k, g);
	else if (it > 0)
		prev = largest_expert(r, experts, it - 1, w->m - 1, k, g);
	else
		return 1;
	return prev > r->trig_multiple * per_expert;
}

/* This thread's share of group g's loads in iteration it, and their
 * envelope. */
static void sample_share(run *r, int32_t t, int64_t it, int32_t g, double *experts)
{
	const world *w = r->w;
	const kiln_sim_config *cfg = r->cfg;
	for (int32_t i = t; i < w->m; i += r->threads)
		for (int32_t k = 0; k < w->n_moe; k++) {
			double *v = &r->loads[((size_t)i * w->n_moe + k) * w->ep];
			if (!cfg->c->model->moe) {
				v[0] = 1;
				continue;
			}
			kiln_load_sample(cfg->loads, &w->shape, cfg->seed, it, i, k, g, v);
			if (r->shares)
				expert_shares(r, it, i, k, g);
			/* A trace can ask for any factor; no rank receives more rows
			 * than routing can send it (docs/simulator.md, "Traces"). */
			for (int32_t x = 0; x < w->ep; x++)
				v[x] = v[x] >= 0 ? (v[x] < w->r_max ? v[x] : w->r_max) : 0;
			/* Each rank's rows as its own query counts them. */
			uint32_t *gr = &r->group_rows[((size_t)i * w->n_moe + k) * w->ep];
			for (int32_t x = 0; x < w->ep; x++) {
				double n = kiln_sim_whole_rows(v[x] * w->moe_nbal[k]);
				gr[x] = n > 0 ? (n < 4294967295.0 ? (uint32_t)n : UINT32_MAX) : 0;
			}
		}
	for (int32_t i = t; r->trig_policy >= 0 && i < w->m; i += r->threads)
		for (int32_t k = 0; k < w->n_moe; k++)
			r->trig[(size_t)i * w->n_moe + k] =
			    cfg->c->model->moe ? trigger_at(r, experts, it, i, k, g) : 0;
	if (!r->any_static)
		return;
	envelope_rows(w, r->loads, r->trig_policy >= 0 ? r->trig : NULL, t, r->threads, r->top,
	              r->rb);
	stage_sums(w, r->loads, t, r->threads, r->sum_n, r->max_n);
	if (r->w3)
		stage_sums(r->w3, r->loads, t, r->threads, r->sum_n3, r->max_n3);
}

/* A distinct rank and its bound, for sorting. */
typedef struct ranked {
	double key;
	int32_t u;
} ranked;

static int by_key(const void *a, const void *b)
{
	const ranked *x = a, *y = b;
	if (x->key != y->key)
		return x->key > y->key ? -1 : 1;
	return (x->u > y->u) - (x->u < y->u);
}

/* The memory of static policy k over the group's distinct ranks, without
 * following each: a rank's device bytes are at most a bound computed from
 * its rows alone (each layer keeps at most base + per_n * n plus a byte of
 * rounding, kiln_sim_policy_bytes_bound); a rank whose bound is at most the
 * peak already seen on every stage (this iteration's or an earlier one's)
 * and, unless a device already ran out, at most the capacity, can neither
 * raise a peak nor fail. Every other rank is followed, most bounded first,
 * as exact mode follows it. */
static void static_memory(run *r, int32_t k, const world *pw, const envelope *env, int unb,
                          scratch *sc)
{
	const kiln_sim_policy *pol = r->pols[k];
	const kiln_sim_result *out = &r->out[k];
	int32_t p = pw->p, m = pw->m, ep = pw->ep;
	const double *sum_n = pw == r->w3 ? r->sum_n3 : r->sum_n;
	const double *max_n = pw == r->w3 ? r->max_n3 : r->max_n;
	for (int32_t s = 0; s < p; s++) {
		const stage_info *si = &pw->stages[s];
		double a = ceil(si->fixed_bytes - 1e-6), c = 0, ta = 0, tc = 0;
		for (int32_t l = 0; l < si->n_layers; l++) {
			const layer_info *li = &si->layers[l];
			double rb, rn, tb, tn;
			if (li->set < 0 ||
			    kiln_sim_policy_bytes_bound(pol, li->set, &rb, &rn, &tb, &tn))
				continue;
			a += rb + 1;
			ta = tb + 1 > ta ? tb + 1 : ta;
			if (li->moe_index >= 0) {
				c = rn > c ? rn : c;
				tc = tn > tc ? tn : tc;
			}
		}
		for (int32_t u = 0; u < r->n_uniq; u++) {
			int32_t x = r->uniq[u];
			double most = 0, win = 0;
			const double *sum = &sum_n[(size_t)s * m * ep + (size_t)x];
			const double *top = &max_n[(size_t)s * m * ep + (size_t)x];
			for (int32_t i = 0; i < m; i++) {
				/* This micro-batch and the window before it. */
				win += a + c * sum[(size_t)i * ep];
				if (i - si->window >= 0)
					win -= a + c * sum[(size_t)(i - si->window) * ep];
				double device =
				    si->static_bytes + win + ta + tc * top[(size_t)i * ep];
				most = device > most ? device : most;
			}
			/* Room for the rounding of the sums, kept in another order
			 * than run_rank adds them. */
			sc->bound[(size_t)u * p + s] = most * (1 + 1e-9) + 1024;
		}
	}
	for (int32_t u = 0; u < r->n_uniq; u++) {
		double key = 0;
		for (int32_t s = 0; s < p; s++) {
			double q = sc->bound[(size_t)u * p + s] / pw->stages[s].capacity;
			key = q > key ? q : key;
		}
		sc->order[u] = (ranked){key, u};
	}
	qsort(sc->order, (size_t)r->n_uniq, sizeof(ranked), by_key);
	for (int32_t j = 0; j < r->n_uniq; j++) {
		int32_t u = sc->order[j].u, need = 0;
		for (int32_t s = 0; s < p && !need; s++) {
			double b = sc->bound[(size_t)u * p + s];
			double seen =
			    sc->peak[s] > out->peak_bytes[s] ? sc->peak[s] : out->peak_bytes[s];
			need = b > seen || (!unb && !sc->oom && b > pw->stages[s].capacity);
		}
		if (need)
			run_rank(pw, pol, unb, env, r->uniq[u], r->weight[u], 1, 0, 0, pw->p, sc);
	}
}

/* Whether ranks a and b have the same load in each of the n samples at
 * offsets list[0 .. n) (compared as numbers: 0 and -0 alike), and, when
 * the run keeps them, the same experts' shares. */
static int same_loads(const run *r, const size_t *list, size_t n, int32_t a, int32_t b)
{
	const world *w = r->w;
	size_t e = (size_t)r->e;
	for (size_t j = 0; j < n; j++) {
		size_t x = list[j] * (size_t)w->ep;
		if (r->loads[x + (size_t)a] != r->loads[x + (size_t)b])
			return 0;
		for (size_t q = 0; r->shares && q < e; q++)
			if (r->shares[(x + (size_t)a) * e + q] !=
			    r->shares[(x + (size_t)b) * e + q])
				return 0;
	}
	return 1;
}

/* The distinct columns of the group's loads over the samples at offsets
 * list[0 .. n) (each a (micro-batch, MoE layer)): one rank of each, the
 * lowest, into uniq, and how many ranks share it into weight. Returns
 * their number. */
static int32_t distinct_of(run *r, const size_t *list, size_t n, int32_t *uniq, int64_t *weight)
{
	const world *w = r->w;
	int32_t n_uniq = 0;
	for (size_t x = 0; x < r->n_slots; x++)
		r->slots[x] = -1;
	for (int32_t k = 0; k < w->ep; k++) {
		uint64_t h = 0x9e3779b97f4a7c15u;
		for (size_t j = 0; j < n; j++) {
			double v = r->loads[list[j] * (size_t)w->ep + (size_t)k];
			uint64_t bits;
			v = v == 0 ? 0 : v;
			memcpy(&bits, &v, sizeof bits);
			h = (h ^ bits) * 0x100000001b3u;
			h ^= h >> 29;
		}
		size_t at = (size_t)h & (r->n_slots - 1);
		int32_t found = -1;
		for (; r->slots[at] >= 0; at = (at + 1) & (r->n_slots - 1)) {
			int32_t u = r->slots[at];
			if (same_loads(r, list, n, uniq[u], k)) {
				found = u;
				break;
			}
		}
		if (found >= 0) {
			weight[found]++;
			continue;
		}
		r->slots[at] = n_uniq;
		uniq[n_uniq] = k;
		weight[n_uniq++] = 1;
	}
	return n_uniq;
}

/* Ranks with the same loads make the same decisions under any policy (a
 * rank's pass is a function of its loads alone, and its part on one stage
 * of its loads on that stage's layers), so the statistical method follows
 * one of them, weighted: the distinct columns of the whole iteration (for
 * the static policies' memory), and of each stage (for the adaptive
 * policies). */
static void distinct_ranks(run *r)
{
	const world *w = r->w;
	r->n_uniq = distinct_of(r, r->all_rows, r->stage_begin[w->p], r->uniq, r->weight);
	for (int32_t s = 0; s < w->p; s++) {
		size_t b = r->stage_begin[s];
		r->n_uniq_s[s] =
		    distinct_of(r, r->stage_rows + b, r->stage_begin[s + 1] - b,
		                r->uniq_s + (size_t)s * w->ep, r->weight_s + (size_t)s * w->ep);
	}
}

/* Policy k (its policy object pol: megatron-paged-stash's rerun for the
 * second attempt, second 1) through group g's iteration it. Returns -1
 * when the pipeline failed to simulate. */
static int attempt(run *r, int32_t k, const kiln_sim_policy *pol, int second, int64_t it, int32_t g,
                   scratch *sc)
{
	const kiln_sim_config *cfg = r->cfg;
	const world *w = r->w;
	const world *pw = r->policies[k] == KILN_SIM_KILN_NO_OFFLOAD ? r->w2 : r->w;
	if (r->policies[k] == KILN_SIM_ADAPIPE && r->w3)
		pw = r->w3; /* on its own partition: its own stages and their times */
	kiln_sim_result *out = &r->out[k];
	envelope env = {.loads = r->loads,
	                .top = r->top,
	                .rb = r->rb,
	                .shares = r->shares,
	                .e = r->e,
	                .trig = k == r->trig_policy ? r->trig : NULL,
	                .group_rows = cfg->no_group_counts ? NULL : r->group_rows,
	                .no_slack = cfg->no_slack};
	memset(sc->layer_f, 0, sizeof(double) * sc->n_lay);
	memset(sc->layer_b, 0, sizeof(double) * sc->n_lay);
	memset(sc->layer_e, 0, sizeof(double) * sc->n_lay);
	memset(sc->peak, 0, sizeof(double) * (size_t)w->p);
	sc->oom = 0;
	sc->stash_overflow = sc->stash_over_budget = 0;
	sc->spilled = 0;
	sc->acct = r->policies[k] == KILN_SIM_KILN && !second ? cfg->acct_rt : NULL;
	sc->acct_checks = sc->acct_mismatches = 0;
	int unb = r->policies[k] == KILN_SIM_UNBOUNDED;
	double probe;
	if (cfg->exact) {
		for (int32_t x = 0; x < w->ep; x++)
			run_rank(pw, pol, unb, &env, x, 1, 1, 1, 0, pw->p, sc);
	} else if (pw->monotone && w->ep > 1 && pw->c->n_sets > 0 &&
	           pw->c->n_buckets <= KILN_PLAN_MAX_BUCKETS &&
	           kiln_sim_policy_exposed_bound(pol, 0, r->rb[0].bits, 1, 0, &probe) == 0) {
		/* A static policy: its decisions ignore free memory, so a
		 * layer's time depends on its load alone and the envelope
		 * takes as long as the slowest rank. Memory: every rank that
		 * could raise a peak or fail, untimed. */
		run_rank(pw, pol, unb, &env, -1, 1, 0, 1, 0, pw->p, sc);
		static_memory(r, k, pw, &env, unb, sc);
	} else if (pw == r->w3) {
		/* adapipe's own partition, timed rank by rank: the per-stage
		 * distinct ranks are those of w's stages, so every rank with
		 * distinct loads over the whole iteration, in full. */
		for (int32_t j = 0; j < r->n_uniq; j++)
			run_rank(pw, pol, unb, &env, r->uniq[j], r->weight[j], 1, 1, 0, pw->p, sc);
	} else {
		/* An adaptive policy (and the paged stash, whose pages depend
		 * on the layers before): on each stage, every rank with
		 * distinct loads there, in full. */
		for (int32_t s = 0; s < pw->p; s++)
			for (int32_t j = 0; j < r->n_uniq_s[s]; j++) {
				size_t at = (size_t)s * w->ep + (size_t)j;
				run_rank(pw, pol, unb, &env, r->uniq_s[at], r->weight_s[at], 1, 1,
				         s, s + 1, sc);
			}
	}
	double rec = 0, copy = 0;
	double *peaks = second ? &r->peak2[(size_t)k * (size_t)w->p] : out->peak_bytes;
	for (int32_t s = 0; s < w->p; s++) {
		for (int32_t ch = 0; ch < w->v; ch++)
			for (int32_t i = 0; i < w->m; i++) {
				size_t at = ((size_t)s * w->v + ch) * w->m + i;
				sc->fwd[at] = sum_layers(pw, sc, s, i, ch, 0, 0);
				sc->bwd[at] = sum_layers(pw, sc, s, i, ch, 1, 0);
			}
		for (int32_t i = 0; i < w->m; i++) {
			rec += sum_layers(pw, sc, s, i, -1, 1, 1) / w->p;
			copy += sum_layers(pw, sc, s, i, -1, 0, 1) / w->p;
		}
		if (sc->peak[s] > peaks[s])
			peaks[s] = sc->peak[s];
	}
	if (second) {
		r->rec2[k] += rec;
		r->copy2[k] += copy;
	} else {
		r->rec[k] += rec;
		r->copy[k] += copy;
	}
	kiln_arena *pa = kiln_arena_new();
	pair_ctx pc = {.w = pw, .sc = sc};
	kiln_pipe_work pwk = {.kind = w->v > 1 ? KILN_PIPE_INTERLEAVED : KILN_PIPE_1F1B,
	                      .p = w->p,
	                      .m = w->m,
	                      .v = w->v,
	                      .fwd_us = sc->fwd,
	                      .bwd_us = sc->bwd,
	                      .p2p_us = pw->p2p_us,
	                      .pair_us = pw->overlap ? pair_step_us : NULL,
	                      .pair_ctx = &pc};
	kiln_pipe_result pr;
	if (!pa || kiln_pipe_simulate(&pwk, pa, NULL, &pr) != 0) {
		/* Once more for the message, prefixed as every simulate error. */
		char *msg = NULL;
		size_t len = 0;
		FILE *m = pa ? open_memstream(&msg, &len) : NULL;
		if (m) {
			kiln_pipe_simulate(&pwk, pa, m, &pr);
			fclose(m);
		}
		fprintf(r->err, "kilnc: error: simulate: iteration %lld: %s%s", (long long)it,
		        msg && len ? msg : "out of memory\n",
		        msg && len && msg[len - 1] == '\n' ? "" : "\n");
		free(msg);
		kiln_arena_free(pa);
		return -1;
	}
	/* The group's iteration: each stage ends with its exposed data-
	 * parallel traffic (beyond what its first micro-batch's forward and
	 * its last one's backward hide) and its optimizer step, once per
	 * iteration (kiln_cost_step_dp_exposed_us); the slowest stage ends it. */
	double group_us = 0;
	for (int32_t s = 0; s < w->p; s++) {
		const kiln_pipe_op *last =
		    &pr.ops[((size_t)s + 1) * 2 * (size_t)w->v * (size_t)w->m - 1];
		double first_f = 0, last_b = 0;
		for (int32_t ch = 0; ch < w->v; ch++) {
			first_f += sc->fwd[((size_t)s * w->v + ch) * w->m];
			last_b += sc->bwd[((size_t)s * w->v + ch) * w->m + (size_t)(w->m - 1)];
		}
		const kiln_cost_step_dp *dp = &pw->stages[s].dp;
		double end = last->end_us + kiln_cost_step_dp_exposed_us(dp, first_f, last_b) +
		             dp->optimizer_us;
		group_us = end > group_us ? end : group_us;
	}
	if (second) {
		if (group_us > r->worst2[k])
			r->worst2[k] = group_us;
		r->oom2[k] |= sc->oom;
		kiln_arena_free(pa);
		return 0;
	}
	if (group_us > r->worst[k])
		r->worst[k] = group_us;
	/* The last iteration's schedule of the slowest group, for kilnc
	 * simulate --emit-trace. */
	if (it == cfg->iterations - 1 && group_us >= r->worst[k] && r->ops[k]) {
		size_t n_ops = 2 * (size_t)w->p * (size_t)w->v * (size_t)w->m;
		memcpy(r->ops[k], pr.ops, sizeof(kiln_pipe_op) * n_ops);
		out->last_ops = r->ops[k];
		out->n_last_ops = (int32_t)n_ops;
	}
	kiln_arena_free(pa);
	/* megatron-capacity: every expert's routed rows against its
	 * capacity, cf times its balanced rows tokens * top_k / experts
	 * (moe_utils.py:248-266), each rank's experts scaled as sample_share
	 * clamps the rank's factor. */
	double cf = kiln_sim_policy_cf(r->pols[k]);
	if (cf > 0 && cfg->c->model->moe) {
		int32_t e = w->shape.experts_per_rank > 0 ? w->shape.experts_per_rank : 1;
		double bal = (double)w->shape.tokens * w->shape.top_k / w->ep;
		for (int32_t i = 0; i < w->m; i++)
			for (int32_t x = 0; x < w->n_moe; x++) {
				kiln_load_sample_experts(cfg->loads, &w->shape, cfg->seed, it, i, x,
				                         g, sc->experts);
				for (int32_t q = 0; q < w->ep; q++) {
					double *v = &sc->experts[(size_t)q * (size_t)e], sum = 0;
					for (int32_t j = 0; j < e; j++)
						sum += v[j];
					double f = bal > 0 ? sum / bal : 1;
					for (int32_t j = 0; f > w->r_max && j < e; j++)
						v[j] *= w->r_max / f;
				}
				double kept, drop;
				kiln_sim_capacity_drop(sc->experts, w->ep * e, cf * bal / e, &kept,
				                       &drop);
				r->routed[k] += kept + drop;
				r->dropped[k] += drop;
			}
	}
	r->oom[k] |= sc->oom;
	r->overflow[k] |= sc->stash_overflow;
	r->over_budget2[k] |= sc->stash_over_budget;
	r->spilled[k] = sc->spilled > r->spilled[k] ? sc->spilled : r->spilled[k];
	for (size_t x = 0; k == r->trig_policy && x < (size_t)w->m * (size_t)w->n_moe; x++)
		out->triggered += r->trig[x];
	out->over_budget += sc->over_budget;
	out->acct_checks += sc->acct_checks;
	out->acct_mismatches += sc->acct_mismatches;
	sc->over_budget = 0;
	return 0;
}

/* Policy k through one group's iteration it: megatron-paged-stash twice,
 * its first attempt and its dropless rerun (whether the rerun happens is
 * known once every group has run: end_iteration). Returns -1 when the
 * pipeline failed to simulate. */
static int run_policy(run *r, int32_t k, int64_t it, int32_t g, scratch *sc)
{
	if (attempt(r, k, r->pols[k], 0, it, g, sc) != 0)
		return -1;
	const kiln_sim_policy *again = kiln_sim_policy_rerun(r->pols[k]);
	return again ? attempt(r, k, again, 1, it, g, sc) : 0;
}

/* The end of iteration it: its time, restarts, checkpoints, progress. */
static void end_iteration(run *r, int64_t it)
{
	const kiln_sim_config *cfg = r->cfg;
	int64_t every = cfg->checkpoint_every > 0 ? cfg->checkpoint_every : 100;
	for (int32_t k = 0; k < r->n; k++) {
		kiln_sim_result *out = &r->out[k];
		double it_s = r->worst[k] * 1e-6;
		/* megatron-paged-stash: an overflow or dropped tokens on any
		 * device (PagedStashRunner all-reduces the flags over every rank)
		 * rerun the whole step once, dropless and without the stash; a
		 * device out of memory in the first attempt fails before that
		 * (docs/simulator.md, "The paged stash"). */
		int again = !r->oom[k] && (r->overflow[k] || r->over_budget2[k]);
		out->stash_overflows += r->overflow[k] != 0;
		out->stash_over_budget += r->over_budget2[k] != 0;
		out->spilled_bytes += r->spilled[k];
		if (again) {
			out->reruns++;
			out->rerun_s += r->worst2[k] * 1e-6;
			it_s += r->worst2[k] * 1e-6;
			r->oom[k] |= r->oom2[k];
			for (int32_t s = 0; s < out->n_stages; s++) {
				double pk = r->peak2[(size_t)k * (size_t)out->n_stages + (size_t)s];
				out->peak_bytes[s] =
				    pk > out->peak_bytes[s] ? pk : out->peak_bytes[s];
			}
			out->recompute_s += r->rec2[k] * 1e-6 / r->groups;
			out->copy_s += r->copy2[k] * 1e-6 / r->groups;
		}
		r->iter_sum[k] += it_s;
		r->since_ckpt[k] += it_s;
		out->recompute_s += r->rec[k] * 1e-6 / r->groups;
		out->copy_s += r->copy[k] * 1e-6 / r->groups;
		if (r->oom[k]) {
			out->ooms++;
			out->oom_lost_s += cfg->restart_s + r->since_ckpt[k];
			r->since_ckpt[k] = 0;
		}
		if ((it + 1) % every == 0)
			r->since_ckpt[k] = 0;
	}
	(void)it;
	kiln_progress_add_aux(r->meter, 1);
}

/* Every thread's loop over the iterations and groups. */
static void *work(void *arg)
{
	worker *wk = arg;
	run *r = wk->r;
	pthread_mutex_lock(&r->gate);
	while (r->go == 0)
		pthread_cond_wait(&r->opened, &r->gate);
	int go = r->go;
	pthread_mutex_unlock(&r->gate);
	if (go < 0)
		return NULL;
	for (int64_t it = 0; it < r->cfg->iterations; it++) {
		for (int32_t g = 0; g < r->groups; g++) {
			sample_share(r, wk->t, it, g, wk->sc.experts);
			pthread_barrier_wait(&r->phase);
			if (wk->t == 0) {
				if (g == 0)
					for (int32_t k = 0; k < r->n; k++) {
						r->worst[k] = 0, r->oom[k] = 0, r->rec[k] = r->copy[k] = 0;
						r->worst2[k] = 0, r->oom2[k] = 0;
						r->rec2[k] = r->copy2[k] = 0;
						r->overflow[k] = r->over_budget2[k] = 0;
						r->spilled[k] = 0;
						for (int32_t s = 0; s < r->w->p; s++)
							r->peak2[(size_t)k * (size_t)r->w->p +
							         (size_t)s] = 0;
					}
				if (!r->cfg->exact)
					distinct_ranks(r);
				atomic_store(&r->next, 0);
			}
			pthread_barrier_wait(&r->phase);
			for (int32_t x; (x = atomic_fetch_add(&r->next, 1)) < r->n;)
				if (run_policy(r, r->order[x], it, g, &wk->sc) != 0)
					atomic_store(&r->failed, 1);
			pthread_barrier_wait(&r->phase);
			if (atomic_load(&r->failed))
				return NULL;
		}
		if (wk->t == 0)
			end_iteration(r, it);
	}
	return NULL;
}

static int scratch_new(const world *w, size_t n_lay, scratch *sc)
{
	*sc = (scratch){
	    .fwd = calloc((size_t)w->p * w->v * w->m, sizeof(double)),
	    .bwd = calloc((size_t)w->p * w->v * w->m, sizeof(double)),
	    .layer_f = calloc(n_lay, sizeof(double)),
	    .layer_b = calloc(n_lay, sizeof(double)),
	    .layer_e = calloc(n_lay, sizeof(double)),
	    .held = calloc((size_t)w->m, sizeof(double)),
	    .peak = calloc((size_t)w->p, sizeof(double)),
	    .n_lay = n_lay,
	    .bound = calloc((size_t)w->p * (size_t)w->ep, sizeof(double)),
	    .order = calloc((size_t)w->ep, sizeof(ranked)),
	    .st_cuda = calloc((size_t)w->m, sizeof(int64_t)),
	    .st_host = calloc((size_t)w->m, sizeof(int64_t)),
	    .experts =
	        calloc((size_t)w->ep *
	                   (size_t)(w->shape.experts_per_rank > 0 ? w->shape.experts_per_rank : 1),
	               sizeof(double)),
	};
	return sc->fwd && sc->bwd && sc->layer_f && sc->layer_b && sc->layer_e && sc->held &&
	               sc->peak && sc->bound && sc->order && sc->st_cuda && sc->st_host &&
	               sc->experts
	           ? 0
	           : -1;
}

static void scratch_free(scratch *sc)
{
	free(sc->fwd);
	free(sc->bwd);
	free(sc->layer_f);
	free(sc->layer_e);
	free(sc->layer_b);
	free(sc->held);
	free(sc->peak);
	free(sc->bound);
	free(sc->order);
	free(sc->st_cuda);
	free(sc->st_host);
	free(sc->experts);
}

/* The threads a run of n policies takes (kiln_sim_config.threads). */
static int32_t threads_for(const kiln_sim_config *cfg, int32_t n)
{
	int32_t threads = cfg->threads;
	if (threads <= 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		threads =
		    cpus > 0 && cpus < KILN_SIM_MAX_THREADS ? (int32_t)cpus : KILN_SIM_MAX_THREADS;
	}
	threads = threads < n ? threads : n;
	return threads < KILN_SIM_MAX_THREADS ? threads : KILN_SIM_MAX_THREADS;
}

int64_t kiln_sim_groups(const kiln_model *m, int32_t max_groups)
{
	int64_t groups = m->moe ? m->dp * m->tp / m->ep : 1;
	if (groups < 1)
		groups = 1;
	return max_groups > 0 && max_groups < groups ? max_groups : groups;
}

int kiln_sim_cost_estimate(const kiln_sim_config *cfg, int32_t n, kiln_sim_cost *out)
{
	const kiln_compilation *c = cfg->c;
	const kiln_model *m = c->model;
	const kiln_ir_graph *g = c->graph;
	double p = g->n_stages, mb = (double)m->micro_batches;
	double v = m->schedule == KILN_SCHED_INTERLEAVED && m->vpp > 1 ? (double)m->vpp : 1;
	double ep = m->moe ? (double)m->ep : 1;
	double groups = (double)kiln_sim_groups(m, cfg->max_groups);
	double most = 1, n_moe = 0;
	for (int32_t s = 0; s < g->n_stages; s++) {
		double nl = g->stages[s].layer_end - g->stages[s].layer_begin;
		most = nl > most ? nl : most;
	}
	for (int32_t l = 0; l < g->n_layers; l++)
		n_moe += g->layers[l].kind == KILN_LAYER_MOE;
	/* The statistical method follows at most every rank, and for a
	 * static policy the envelope besides. */
	double passes = cfg->exact ? ep : 1 + ep;
	*out = (kiln_sim_cost){.groups = groups,
	                       .layers = g->n_layers,
	                       .microbatches = mb,
	                       .passes = passes,
	                       .threads = threads_for(cfg, n)};
	out->per_iteration = groups * n * (double)g->n_layers * mb * passes;
	out->decisions = out->per_iteration * (double)cfg->iterations;
	out->cpu_s = out->decisions * KILN_SIM_CPU_US_PER_DECISION * 1e-6;
	/* What kiln_sim_run and kiln_pipe_run hold at once: per thread its
	 * scratch (the pipeline's durations, three numbers per layer of the
	 * largest stage per (stage, micro-batch) in each of two arrays, bytes
	 * held per micro-batch)
	 * and one schedule being timed (ops and their positions); the loads
	 * and their envelope; per policy the last iteration's schedule. */
	double ops = 2 * p * v * mb;
	double e = m->moe && m->ep > 0 ? (double)(m->experts / m->ep) : 1;
	double per_thread = 2 * 8 * p * v * mb + 2 * 8 * p * mb * 3 * most + 8 * mb +
	                    ops * (double)(sizeof(kiln_pipe_op) + sizeof(int32_t)) +
	                    8 * ep * (e > 1 ? e : 1); /* one sample's per-expert rows */
	double rows = mb * (n_moe > 0 ? n_moe : 1);
	out->bytes = out->threads * per_thread + rows * (8 * ep + 13) +
	             n * ops * (double)sizeof(kiln_pipe_op);
	return 0;
}

/* 0 when c's counts fit the simulator's (32-bit micro-batch indices, as the
 * runtime's queries take them; 2 * p * v * m pipeline ops in an int32), else
 * -1 with a message: never a silent truncation. The frontend's limit
 * (KILN_FRONTEND_MAX_MICRO_BATCHES) keeps descriptions well inside. */
static int check_counts(const kiln_compilation *c, FILE *err)
{
	const kiln_model *m = c->model;
	int64_t v = m->schedule == KILN_SCHED_INTERLEAVED && m->vpp > 1 ? m->vpp : 1;
	int64_t p = c->graph->n_stages, mb = m->micro_batches;
	if (mb < 1 || mb > INT32_MAX) {
		fprintf(err,
		        "kilnc: error: simulate: %lld micro-batches per iteration; the simulator "
		        "takes 1 to %d\n",
		        (long long)mb, INT32_MAX);
		return -1;
	}
	if (v > INT32_MAX / 2 / p || mb > INT32_MAX / (2 * p * v)) {
		fprintf(err,
		        "kilnc: error: simulate: the pipeline schedule has 2 * p * v * m = 2 * "
		        "%lld * %lld * %lld ops, over the limit of %d\n",
		        (long long)p, (long long)v, (long long)mb, INT32_MAX);
		return -1;
	}
	return 0;
}

int kiln_sim_run(const kiln_sim_config *cfg, const kiln_sim_policy_kind *policies, int32_t n,
                 kiln_arena *a, FILE *err, kiln_sim_result *out)
{
	world w, w2, w3;
	const kiln_compilation *c = cfg->c;
	if (check_counts(c, err) != 0 ||
	    (cfg->c_no_offload && check_counts(cfg->c_no_offload, err)) ||
	    (cfg->c_adapipe && check_counts(cfg->c_adapipe, err)))
		return -1;
	if (build_world(c, a, &w) != 0) {
		fprintf(err, "kilnc: error: simulate: out of memory\n");
		return -1;
	}
	if (cfg->c_no_offload && build_world(cfg->c_no_offload, a, &w2) != 0)
		return -1;
	if (cfg->c_adapipe && (cfg->c_adapipe->graph->n_stages != w.p ||
	                       cfg->c_adapipe->model->micro_batches != c->model->micro_batches ||
	                       build_world(cfg->c_adapipe, a, &w3) != 0)) {
		fprintf(err, "kilnc: error: simulate: adapipe's compilation does not match the "
		             "model's pipeline\n");
		return -1;
	}
	if (n < 1 || n > KILN_SIM_MAX_POLICIES) {
		fprintf(err, "kilnc: error: simulate: 1 to %d policies at a time, got %d\n",
		        KILN_SIM_MAX_POLICIES, (int)n);
		return -1;
	}
	int32_t threads = threads_for(cfg, n);
	run r = {.cfg = cfg,
	         .w = &w,
	         .w2 = &w2,
	         .w3 = cfg->c_adapipe ? &w3 : NULL,
	         .policies = policies,
	         .out = out,
	         .err = err,
	         .n = n,
	         .threads = threads,
	         .gate = PTHREAD_MUTEX_INITIALIZER,
	         .opened = PTHREAD_COND_INITIALIZER};
	r.groups = cfg->max_groups > 0 && cfg->max_groups < w.groups ? cfg->max_groups : w.groups;
	r.trig_policy = -1;
	for (int32_t k = 0; k < n; k++)
		r.any_static |= !cfg->exact && policies[k] != KILN_SIM_KILN &&
		                policies[k] != KILN_SIM_KILN_NO_OFFLOAD &&
		                policies[k] != KILN_SIM_KILN_NO_OVERLAP &&
		                policies[k] != KILN_SIM_ORACLE;
	/* The adaptive policies take several times a static one's time: taken
	 * first, they leave the short ones to balance the threads. */
	int32_t n_order = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int32_t k = 0; k < n; k++) {
			kiln_sim_policy_kind p = policies[k];
			int adaptive = p == KILN_SIM_KILN || p == KILN_SIM_KILN_NO_OFFLOAD ||
			               p == KILN_SIM_KILN_NO_OVERLAP || p == KILN_SIM_ORACLE;
			if (adaptive == (pass == 0))
				r.order[n_order++] = k;
		}
	size_t n_loads = (size_t)w.m * (size_t)(w.n_moe ? w.n_moe : 1) * (size_t)w.ep;
	size_t n_rows = (size_t)w.m * (size_t)(w.n_moe ? w.n_moe : 1);
	size_t n_lay = (size_t)w.p * (size_t)w.m * w.stride;
	if (cfg->c_no_offload && w2.stride > w.stride)
		n_lay = (size_t)w.p * (size_t)w.m * w2.stride;
	if (r.w3 && (size_t)w.p * (size_t)w.m * w3.stride > n_lay)
		n_lay = (size_t)w.p * (size_t)w.m * w3.stride;
	worker wks[KILN_SIM_MAX_THREADS];
	memset(wks, 0, sizeof wks);
	r.loads = calloc(n_loads, sizeof(double));
	r.top = calloc(n_rows, sizeof(double));
	r.rb = calloc(n_rows, sizeof(row_buckets));
	r.group_rows = calloc(n_loads, sizeof(uint32_t));
	/* The paged stash pads every local expert's rows: it needs them. */
	int any_stash = 0;
	for (int32_t k = 0; k < n; k++)
		any_stash |= policies[k] == KILN_SIM_MEGATRON_PAGED_STASH;
	r.e = w.shape.experts_per_rank > 0 ? w.shape.experts_per_rank : 1;
	r.shares = any_stash ? calloc(n_loads * (size_t)r.e, sizeof(double)) : NULL;
	r.trig = calloc(n_rows, 1);
	size_t n_sums = (size_t)w.p * (size_t)w.m * (size_t)w.ep;
	r.sum_n = malloc(sizeof(double) * n_sums);
	r.max_n = malloc(sizeof(double) * n_sums);
	r.sum_n3 = r.w3 ? malloc(sizeof(double) * n_sums) : NULL;
	r.max_n3 = r.w3 ? malloc(sizeof(double) * n_sums) : NULL;
	r.n_slots = 2;
	while (r.n_slots < 2 * (size_t)w.ep)
		r.n_slots *= 2;
	r.slots = malloc(sizeof(int32_t) * r.n_slots);
	r.uniq = malloc(sizeof(int32_t) * (size_t)w.ep);
	r.weight = malloc(sizeof(int64_t) * (size_t)w.ep);
	r.uniq_s = malloc(sizeof(int32_t) * (size_t)w.ep * (size_t)w.p);
	r.weight_s = malloc(sizeof(int64_t) * (size_t)w.ep * (size_t)w.p);
	r.n_uniq_s = calloc((size_t)w.p, sizeof(int32_t));
	r.stage_rows = malloc(sizeof(size_t) * (n_rows + 1));
	r.all_rows = malloc(sizeof(size_t) * (n_rows + 1));
	r.stage_begin = calloc((size_t)w.p + 1, sizeof(size_t));
	if (r.stage_rows && r.all_rows && r.stage_begin) {
		/* Each MoE layer is on one stage: the stages' samples, in order,
		 * are every sample once. */
		size_t at = 0;
		for (int32_t s = 0; s < w.p; s++) {
			r.stage_begin[s] = at;
			for (int32_t l = 0; l < w.stages[s].n_layers; l++) {
				int32_t k = w.stages[s].layers[l].moe_index;
				for (int32_t i = 0; k >= 0 && i < w.m; i++)
					r.stage_rows[at++] =
					    (size_t)i * (size_t)w.n_moe + (size_t)k;
			}
		}
		r.stage_begin[w.p] = at;
		for (size_t x = 0; x < at; x++)
			r.all_rows[x] = x;
	}
	r.pols = calloc((size_t)n, sizeof *r.pols);
	r.ops = calloc((size_t)n, sizeof *r.ops);
	r.iter_sum = calloc((size_t)n, sizeof(double));
	r.peak2 = calloc((size_t)n * (size_t)w.p, sizeof(double));
	r.since_ckpt = calloc((size_t)n, sizeof(double));
	int rc = -1, started = 0, barrier = 0;
	int ok = r.loads && r.top && r.rb && r.group_rows && r.trig && (r.shares || !any_stash) &&
	         r.sum_n && r.max_n && (!r.w3 || (r.sum_n3 && r.max_n3)) && r.slots && r.uniq &&
	         r.weight && r.uniq_s && r.weight_s && r.n_uniq_s && r.stage_rows && r.all_rows &&
	         r.stage_begin && r.pols && r.ops && r.iter_sum && r.since_ckpt && r.peak2;
	for (int32_t t = 0; t < threads && ok; t++)
		ok = scratch_new(&w, n_lay, &wks[t].sc) == 0;
	if (!ok) {
		fprintf(err, "kilnc: error: simulate: out of memory\n");
		goto out;
	}
	size_t n_ops = 2 * (size_t)w.p * (size_t)w.v * (size_t)w.m;
	for (int32_t k = 0; k < n; k++) {
		int no_off = policies[k] == KILN_SIM_KILN_NO_OFFLOAD;
		const kiln_compilation *pc = no_off ? cfg->c_no_offload : c;
		if (policies[k] == KILN_SIM_ADAPIPE && cfg->c_adapipe)
			pc = cfg->c_adapipe;
		if (!pc) {
			fprintf(err, "kilnc: error: simulate: kiln:no-offload needs its compilation\n");
			goto out;
		}
		if (kiln_sim_policy_new_stash(
		        policies[k], pc, no_off ? cfg->rt_no_offload : cfg->rt,
		        cfg->capacity_factor, cfg->stash, a, err, &r.pols[k]) != 0)
			goto out;
		out[k] = (kiln_sim_result){.policy = policies[k],
		                           .n_stages = w.p,
		                           .flags = kiln_sim_policy_flags(r.pols[k])};
		out[k].recipe = kiln_sim_policy_recipe(r.pols[k], &out[k].recipe_fits);
		out[k].peak_bytes = kiln_arena_alloc(a, sizeof(double) * (size_t)w.p);
		if (!out[k].peak_bytes)
			goto out;
		/* The arena is not for threads: the schedule's room now. */
		r.ops[k] = kiln_arena_alloc(a, sizeof(kiln_pipe_op) * n_ops);
		if (kiln_sim_policy_trigger(r.pols[k], &r.trig_multiple))
			r.trig_policy = k;
	}
	kiln_sim_cost cost;
	int32_t n_cost = n; /* megatron-paged-stash costs two: its rerun */
	for (int32_t k = 0; k < n; k++)
		n_cost += policies[k] == KILN_SIM_MEGATRON_PAGED_STASH;
	kiln_sim_cost_estimate(cfg, n_cost, &cost);
	r.meter = kiln_progress_start(cfg->progress, "kilnc: simulate");
	kiln_progress_line(
	    r.meter, "kilnc: estimate     %.3g layer decisions: about %.0f s of CPU, %.0f MB\n",
	    cost.decisions, cost.cpu_s, cost.bytes / 1e6);
	kiln_progress_phase(r.meter, "", "layer decisions", (int64_t)cost.decisions);
	kiln_progress_aux(r.meter, "iterations done");
	for (int32_t t = 0; t < threads; t++) {
		wks[t].r = &r;
		wks[t].t = t;
		wks[t].sc.meter = r.meter;
	}
	for (started = 1; started < threads; started++)
		if (pthread_create(&wks[started].id, NULL, work, &wks[started]) != 0)
			break;
	/* Fewer threads than asked is fine: the work does not depend on it. */
	r.threads = started;
	barrier = pthread_barrier_init(&r.phase, NULL, (unsigned)started) == 0;
	pthread_mutex_lock(&r.gate);
	r.go = barrier ? 1 : -1;
	pthread_cond_broadcast(&r.opened);
	pthread_mutex_unlock(&r.gate);
	if (!barrier)
		goto out;
	work(&wks[0]);
	if (atomic_load(&r.failed))
		goto out;
	for (int32_t k = 0; k < n; k++) {
		kiln_sim_result *res = &out[k];
		res->iteration_s = cfg->iterations ? r.iter_sum[k] / cfg->iterations : 0;
		res->total_s = r.iter_sum[k] + res->oom_lost_s;
		res->tokens_per_s =
		    res->total_s > 0 ? w.tokens_per_iter * cfg->iterations / res->total_s : 0;
		double devices = (double)c->model->devices;
		res->mfu = res->total_s > 0
		               ? w.model_flops * cfg->iterations / (res->total_s * devices * w.peak_flops)
		               : 0;
		/* Hardware FLOPs add the recomputed forwards, which run at the
		 * rate the rest does (docs/simulator.md). */
		double busy = r.iter_sum[k] > 0 ? res->recompute_s / r.iter_sum[k] : 0;
		res->hfu = res->mfu * (1 + busy);
		res->dropped_fraction = r.routed[k] > 0 ? r.dropped[k] / r.routed[k] : 0;
	}
	rc = 0;
out:
	for (int32_t t = 1; t < started; t++)
		pthread_join(wks[t].id, NULL);
	kiln_progress_stop(r.meter);
	if (barrier)
		pthread_barrier_destroy(&r.phase);
	for (int32_t k = 0; r.pols && k < n; k++)
		kiln_sim_policy_free(r.pols[k]);
	for (int32_t t = 0; t < threads; t++)
		scratch_free(&wks[t].sc);
	free(r.pols);
	free(r.ops);
	free(r.loads);
	free(r.shares);
	free(r.top);
	free(r.rb);
	free(r.group_rows);
	free(r.trig);
	free(r.sum_n);
	free(r.max_n);
	free(r.sum_n3);
	free(r.max_n3);
	free(r.slots);
	free(r.uniq);
	free(r.weight);
	free(r.uniq_s);
	free(r.weight_s);
	free(r.n_uniq_s);
	free(r.stage_rows);
	free(r.all_rows);
	free(r.stage_begin);
	free(r.iter_sum);
	free(r.since_ckpt);
	free(r.peak2);
	return rc;
}
