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
 * Exact mode follows every EP rank. The default (statistical) method
 * follows, per group, the KILN_SIM_CANDIDATES ranks with the most rows
 * exactly, for memory and for the layers where one of them is the most
 * loaded, and an envelope rank hot at each other layer alone (the layer's
 * largest load, the memory of a rank at the mean load) for time. Neither
 * is a bound; tests hold it within 6% of exact mode on small models
 * (docs/simulator.md, "Scale").
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "passes/passes.h"
#include "sim/sim.h"

#define GRID 33 /* time samples per layer over [0, n_max] */
/* Ranks per EP group whose memory the statistical method follows exactly. */
#define KILN_SIM_CANDIDATES 4

typedef struct layer_info {
	int32_t graph_layer; /* index into graph->layers */
	int32_t model_layer; /* -1 for embedding and head */
	int32_t set;         /* unit set, or -1 (not planned) */
	int32_t chunk;
	int32_t moe_index;   /* 0.. among the model's MoE layers, or -1 */
	double n_bal, n_max;
	double fwd[GRID], bwd[GRID]; /* times at n = k * n_max / (GRID - 1) */
} layer_info;

typedef struct stage_info {
	layer_info *layers;
	int32_t n_layers;
	double capacity, static_bytes, fixed_bytes;
	int32_t window; /* micro-batches held at once (ceil of inflight) */
} stage_info;

typedef struct world {
	const kiln_compilation *c;
	stage_info *stages;
	int32_t p, m, v;
	int32_t n_moe;   /* MoE layers of the model */
	int32_t ep, groups;
	size_t stride; /* scratch entries per (stage, micro-batch): 2 per layer of the largest stage */
	kiln_load_shape shape;
	double tokens_per_iter, model_flops, peak_flops;
} world;

static double interp(const double *grid, double n_max, double n)
{
	if (!(n_max > 0))
		return grid[0];
	double x = n / n_max * (GRID - 1);
	if (x <= 0)
		return grid[0];
	int k = (int)x;
	if (k >= GRID - 1) /* beyond the grid: extend its last segment */
		k = GRID - 2;
	double f = x - k;
	return grid[k] + (grid[k + 1] - grid[k]) * f;
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
	*out = (kiln_load_shape){.ep = ep,
	                         .experts_per_rank = m->moe ? (int32_t)(m->experts / m->ep) : 1,
	                         .top_k = (int32_t)top_k,
	                         .tokens = (int64_t)(n_bal / top_k * ep),
	                         .microbatches = (int32_t)m->micro_batches,
	                         .layers = n_moe};
}

static int build_world(const kiln_compilation *c, kiln_arena *a, world *w)
{
	const kiln_ir_graph *g = c->graph;
	const kiln_model *m = c->model;
	memset(w, 0, sizeof *w);
	w->c = c;
	w->p = g->n_stages;
	w->m = (int32_t)m->micro_batches;
	w->v = m->schedule == KILN_SCHED_INTERLEAVED && m->vpp > 1 ? (int32_t)m->vpp : 1;
	w->ep = m->moe ? (int32_t)m->ep : 1;
	w->groups = m->moe ? (int32_t)(m->dp * m->tp / m->ep) : 1;
	if (w->groups < 1)
		w->groups = 1;
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
			for (int32_t k = 0; k < c->n_sets && L->index >= 0; k++)
				if (c->sets[k].stage == s && c->sets[k].kind == L->kind)
					li->set = k;
			li->n_bal = L->kind == KILN_LAYER_MOE ? L->n_balanced : 0;
			li->n_max = li->n_bal * cap;
			for (int k = 0; k < GRID; k++) {
				double n = li->n_max * k / (GRID - 1), f = 0, b = 0;
				for (int32_t o = L->op_begin; o < L->op_end; o++) {
					double us = kiln_cost_op_time_us(g, &g->ops[o], n);
					if (g->ops[o].backward)
						b += us;
					else
						f += us;
				}
				li->fwd[k] = f;
				li->bwd[k] = b;
			}
		}
	}
	size_t most = 1;
	for (int32_t s = 0; s < w->p; s++)
		most = (size_t)w->stages[s].n_layers > most ? (size_t)w->stages[s].n_layers : most;
	w->stride = 2 * most;
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
	kiln_sim_load_shape(c, &w->shape);
	kiln_cost_iteration it;
	kiln_cost_iteration_estimate(g, 1.0, &it);
	w->model_flops = it.model_flops;
	w->tokens_per_iter = (double)m->global_batch * (double)m->seq_len;
	w->peak_flops = m->hw.peak_tflops * 1e12;
	return 0;
}

/* Per-iteration scratch of one policy and group. */
typedef struct scratch {
	double *fwd, *bwd;    /* per (stage, chunk, micro-batch), pipeline layout */
	double *layer_f, *layer_b; /* per (stage, micro-batch, layer): the slowest rank's */
	double *held;         /* per micro-batch of the current stage: device bytes */
	double *peak;         /* per stage */
	int oom;
	int64_t over_budget;
	kiln_rt *acct;        /* mirror of the kiln policy's memory, or NULL */
	const int32_t *cand;  /* ranks followed exactly (the envelope leaves their layers to them) */
	int32_t n_cand;
	int64_t acct_checks, acct_mismatches;
} scratch;

/* One rank through one iteration under policy pol: decisions, memory,
 * per-layer times (kept as the maximum over the ranks seen). loads[(i *
 * n_moe + k) * ep + r] is rank r's factor for micro-batch i and MoE layer
 * k; rank -1 takes the largest. memory: whether this rank's memory counts
 * (peak, out-of-memory); the envelope's does not. */
static void run_rank(const world *w, const kiln_sim_policy *pol, int unbounded,
                     const double *loads, int32_t rank, int memory, scratch *sc)
{
	for (int32_t s = 0; s < w->p; s++) {
		const stage_info *si = &w->stages[s];
		if (sc->acct)
			kiln_rt_acct_reset(sc->acct, s, 0);
		for (int32_t i = 0; i < w->m; i++) {
			/* The micro-batch leaving the window has run its backward. */
			if (sc->acct && i - si->window >= 0 &&
			    kiln_rt_acct_record(sc->acct, (uint32_t)(i - si->window), KILN_ACCT_FREED,
			                        (uint64_t)sc->held[i - si->window]) != 0)
				sc->acct_mismatches++;
			/* In flight beside micro-batch i: the window before it. */
			double others = 0;
			for (int32_t j = i - si->window + 1; j < i; j++)
				if (j >= 0)
					others += sc->held[j];
			uint32_t pending = i < si->window - 1 ? (uint32_t)(si->window - 1 - i) : 0;
			double cur = ceil(si->fixed_bytes - 1e-6), transient = 0;
			if (sc->acct &&
			    kiln_rt_acct_record(sc->acct, (uint32_t)i, KILN_ACCT_PRODUCED, (uint64_t)cur) != 0)
				sc->acct_mismatches++;
			for (int32_t l = 0; l < si->n_layers; l++) {
				const layer_info *li = &si->layers[l];
				double r = 1, mean = 1;
				int timed = 1; /* whether this rank's time of the layer counts */
				if (li->moe_index >= 0) {
					const double *v = &loads[((size_t)i * w->n_moe + li->moe_index) * w->ep];
					if (rank >= 0) {
						r = v[rank];
					} else {
						int32_t top = 0;
						mean = v[0];
						for (int32_t k = 1; k < w->ep; k++) {
							top = v[k] > v[top] ? k : top;
							mean += v[k];
						}
						r = v[top];
						mean /= w->ep;
						/* A followed rank times its own layer. */
						for (int32_t j = 0; j < sc->n_cand; j++)
							timed &= sc->cand[j] != top;
					}
				}
				double n = r * li->n_bal;
				double f = interp(li->fwd, li->n_max, n), b = interp(li->bwd, li->n_max, n);
				if (li->set >= 0) {
					kiln_sim_choice ch;
					double free_b = si->capacity - si->static_bytes - others - cur;
					kiln_sim_policy_decide(pol, li->set, li->model_layer, n, free_b, pending,
					                       (uint32_t)i, cur, &ch);
					if (rank < 0 && li->moe_index >= 0) {
						/* The envelope is a rank hot at this layer only: it
						 * carries on with what a rank at the mean load keeps. */
						kiln_sim_choice calm;
						kiln_sim_policy_decide(pol, li->set, li->model_layer,
						                       mean * li->n_bal, free_b, pending, (uint32_t)i,
						                       cur, &calm);
						ch.resident_bytes = calm.resident_bytes;
					}
					cur += ch.resident_bytes;
					if (sc->acct) {
						kiln_acct ac;
						kiln_rt_acct_record(sc->acct, (uint32_t)i, KILN_ACCT_PRODUCED,
						                    (uint64_t)ch.resident_bytes);
						kiln_rt_acct_get(sc->acct, &ac);
						sc->acct_checks++;
						sc->acct_mismatches += (double)ac.device_bytes != others + cur;
					}
					transient = ch.transient_bytes > transient ? ch.transient_bytes : transient;
					b += ch.exposed_us;
					sc->over_budget += ch.over_budget;
					/* The slowest rank's overhead is what the critical
					 * path sees: kept with its layer time below. */
					size_t at = ((size_t)s * w->m + i) * w->stride + 2 * (size_t)l;
					if (timed && f + b > sc->layer_f[at] + sc->layer_b[at]) {
						sc->layer_b[at + 1] = ch.recompute_us; /* reused as rec */
						sc->layer_f[at + 1] = ch.copy_us;      /* reused as copy */
					}
				}
				size_t at = ((size_t)s * w->m + i) * w->stride + 2 * (size_t)l;
				if (timed && f + b > sc->layer_f[at] + sc->layer_b[at]) {
					sc->layer_f[at] = f;
					sc->layer_b[at] = b;
				}
			}
			sc->held[i] = cur;
			if (!memory)
				continue;
			double device = si->static_bytes + others + cur + transient;
			sc->peak[s] = device > sc->peak[s] ? device : sc->peak[s];
			if (!unbounded && device > si->capacity)
				sc->oom = 1;
		}
	}
}

/* Sum over the layers of one chunk (-1: every chunk) of stage s for
 * micro-batch i: part 0 the forward (bwd 0) or backward (bwd 1) times;
 * part 1 the copy (bwd 0) or recompute (bwd 1) exposure. */
static double sum_layers(const world *w, const scratch *sc, int32_t s, int32_t i, int32_t chunk,
                         int bwd, int part)
{
	const stage_info *si = &w->stages[s];
	double t = 0;
	for (int32_t l = 0; l < si->n_layers; l++) {
		if (chunk >= 0 && si->layers[l].chunk != chunk)
			continue;
		size_t at = ((size_t)s * w->m + i) * w->stride + 2 * (size_t)l + (size_t)part;
		t += bwd ? sc->layer_b[at] : sc->layer_f[at];
	}
	return t;
}

int kiln_sim_run(const kiln_sim_config *cfg, const kiln_sim_policy_kind *policies, int32_t n,
                 kiln_arena *a, FILE *err, kiln_sim_result *out)
{
	world w, w2;
	const kiln_compilation *c = cfg->c;
	if (build_world(c, a, &w) != 0) {
		fprintf(err, "kilnc: error: simulate: out of memory\n");
		return -1;
	}
	if (cfg->c_no_offload && build_world(cfg->c_no_offload, a, &w2) != 0)
		return -1;
	int32_t groups = cfg->max_groups > 0 && cfg->max_groups < w.groups ? cfg->max_groups : w.groups;
	size_t n_loads = (size_t)w.m * (size_t)(w.n_moe ? w.n_moe : 1) * (size_t)w.ep;
	if (n < 1 || n > 64) {
		fprintf(err, "kilnc: error: simulate: 1 to 64 policies at a time, got %d\n", (int)n);
		return -1;
	}
	double *loads = calloc(n_loads, sizeof(double));
	double *rows_of = malloc(sizeof(double) * (size_t)w.ep);
	kiln_sim_policy **pols = calloc((size_t)n, sizeof *pols);
	size_t n_lay = (size_t)w.p * (size_t)w.m * w.stride;
	if (cfg->c_no_offload && w2.stride > w.stride)
		n_lay = (size_t)w.p * (size_t)w.m * w2.stride;
	scratch sc = {
	    .fwd = calloc((size_t)w.p * w.v * w.m, sizeof(double)),
	    .bwd = calloc((size_t)w.p * w.v * w.m, sizeof(double)),
	    .layer_f = calloc(n_lay, sizeof(double)),
	    .layer_b = calloc(n_lay, sizeof(double)),
	    .held = calloc((size_t)w.m, sizeof(double)),
	    .peak = calloc((size_t)w.p, sizeof(double)),
	};
	int rc = -1;
	if (!loads || !rows_of || !pols || !sc.fwd || !sc.bwd || !sc.layer_f || !sc.layer_b || !sc.held ||
	    !sc.peak) {
		fprintf(err, "kilnc: error: simulate: out of memory\n");
		goto out;
	}
	for (int32_t k = 0; k < n; k++) {
		int no_off = policies[k] == KILN_SIM_KILN_NO_OFFLOAD;
		const kiln_compilation *pc = no_off ? cfg->c_no_offload : c;
		if (!pc) {
			fprintf(err, "kilnc: error: simulate: kiln:no-offload needs its compilation\n");
			goto out;
		}
		if (kiln_sim_policy_new(policies[k], pc, no_off ? cfg->rt_no_offload : cfg->rt, a, err,
		                        &pols[k]) != 0)
			goto out;
		out[k] = (kiln_sim_result){.policy = policies[k], .n_stages = w.p};
		out[k].peak_bytes = kiln_arena_alloc(a, sizeof(double) * (size_t)w.p);
		if (!out[k].peak_bytes)
			goto out;
	}
	double *iter_sum = calloc((size_t)n, sizeof(double));
	double *since_ckpt = calloc((size_t)n, sizeof(double));
	if (!iter_sum || !since_ckpt) {
		free(iter_sum);
		free(since_ckpt);
		goto out;
	}
	int64_t every = cfg->checkpoint_every > 0 ? cfg->checkpoint_every : 100;
	int last_pct = -1;
	for (int64_t it = 0; it < cfg->iterations; it++) {
		double worst[64];
		int oom[64];
		double rec[64], copy[64];
		for (int32_t k = 0; k < n && k < 64; k++)
			worst[k] = 0, oom[k] = 0, rec[k] = copy[k] = 0;
		for (int32_t g = 0; g < groups; g++) {
			for (int32_t i = 0; i < w.m; i++)
				for (int32_t k = 0; k < w.n_moe; k++) {
					double *v = &loads[((size_t)i * w.n_moe + k) * w.ep];
					if (c->model->moe)
						kiln_load_sample(cfg->loads, &w.shape, cfg->seed, it, i, k, g, v);
					else
						v[0] = 1;
				}
			/* The candidates: the KILN_SIM_CANDIDATES ranks with the most
			 * rows over the iteration's samples (ties to the lower rank). */
			int32_t cand[KILN_SIM_CANDIDATES], n_cand = 0;
			for (int32_t r = 0; r < w.ep; r++)
				rows_of[r] = 0;
			for (size_t x = 0; x < n_loads; x++)
				rows_of[x % (size_t)w.ep] += loads[x];
			while (n_cand < KILN_SIM_CANDIDATES && n_cand < w.ep) {
				int32_t best = -1;
				for (int32_t r = 0; r < w.ep; r++) {
					int taken = 0;
					for (int32_t j = 0; j < n_cand; j++)
						taken |= cand[j] == r;
					if (!taken && (best < 0 || rows_of[r] > rows_of[best]))
						best = r;
				}
				cand[n_cand++] = best;
			}
			for (int32_t k = 0; k < n && k < 64; k++) {
				const world *pw = policies[k] == KILN_SIM_KILN_NO_OFFLOAD ? &w2 : &w;
				memset(sc.layer_f, 0, sizeof(double) * n_lay);
				memset(sc.layer_b, 0, sizeof(double) * n_lay);
				memset(sc.peak, 0, sizeof(double) * (size_t)w.p);
				sc.oom = 0;
				sc.acct = policies[k] == KILN_SIM_KILN ? cfg->acct_rt : NULL;
				sc.acct_checks = sc.acct_mismatches = 0;
				int unb = policies[k] == KILN_SIM_UNBOUNDED;
				if (cfg->exact) {
					for (int32_t r = 0; r < w.ep; r++)
						run_rank(pw, pols[k], unb, loads, r, 1, &sc);
				} else {
					/* Time from the envelope; memory from the ranks that
					 * carry the most rows this iteration. */
					sc.cand = cand;
					sc.n_cand = n_cand;
					run_rank(pw, pols[k], unb, loads, -1, 0, &sc);
					for (int32_t j = 0; j < n_cand; j++)
						run_rank(pw, pols[k], unb, loads, cand[j], 1, &sc);
				}
				for (int32_t s = 0; s < w.p; s++) {
					for (int32_t ch = 0; ch < w.v; ch++)
						for (int32_t i = 0; i < w.m; i++) {
							size_t at = ((size_t)s * w.v + ch) * w.m + i;
							sc.fwd[at] = sum_layers(pw, &sc, s, i, ch, 0, 0);
							sc.bwd[at] = sum_layers(pw, &sc, s, i, ch, 1, 0);
						}
					for (int32_t i = 0; i < w.m; i++) {
						rec[k] += sum_layers(pw, &sc, s, i, -1, 1, 1) / w.p;
						copy[k] += sum_layers(pw, &sc, s, i, -1, 0, 1) / w.p;
					}
					if (sc.peak[s] > out[k].peak_bytes[s])
						out[k].peak_bytes[s] = sc.peak[s];
				}
				kiln_arena *pa = kiln_arena_new();
				kiln_pipe_work pwk = {.kind = w.v > 1 ? KILN_PIPE_INTERLEAVED : KILN_PIPE_1F1B,
				                      .p = w.p, .m = w.m, .v = w.v,
				                      .fwd_us = sc.fwd, .bwd_us = sc.bwd};
				kiln_pipe_result pr;
				if (!pa || kiln_pipe_simulate(&pwk, pa, err, &pr) != 0) {
					kiln_arena_free(pa);
					free(iter_sum);
					free(since_ckpt);
					goto out;
				}
				if (pr.makespan_us > worst[k])
					worst[k] = pr.makespan_us;
				/* The last iteration's schedule of the slowest group, for
				 * kilnc simulate --emit-trace. */
				if (it == cfg->iterations - 1 && pr.makespan_us >= worst[k]) {
					size_t n_ops = 2 * (size_t)w.p * (size_t)w.v * (size_t)w.m;
					kiln_pipe_op *ops = out[k].last_ops;
					if (!ops)
						ops = kiln_arena_alloc(a, sizeof(kiln_pipe_op) * n_ops);
					if (ops) {
						memcpy(ops, pr.ops, sizeof(kiln_pipe_op) * n_ops);
						out[k].last_ops = ops;
						out[k].n_last_ops = (int32_t)n_ops;
					}
				}
				kiln_arena_free(pa);
				oom[k] |= sc.oom;
				out[k].over_budget += sc.over_budget;
				out[k].acct_checks += sc.acct_checks;
				out[k].acct_mismatches += sc.acct_mismatches;
				sc.over_budget = 0;
			}
		}
		for (int32_t k = 0; k < n && k < 64; k++) {
			double it_s = worst[k] * 1e-6;
			iter_sum[k] += it_s;
			since_ckpt[k] += it_s;
			out[k].recompute_s += rec[k] * 1e-6 / groups;
			out[k].copy_s += copy[k] * 1e-6 / groups;
			if (oom[k]) {
				out[k].ooms++;
				out[k].oom_lost_s += cfg->restart_s + since_ckpt[k];
				since_ckpt[k] = 0;
			}
			if ((it + 1) % every == 0)
				since_ckpt[k] = 0;
		}
		int pct = (int)((it + 1) * 10 / cfg->iterations);
		if (cfg->progress && pct != last_pct) {
			fprintf(cfg->progress, "simulate: %lld of %lld iterations\n", (long long)(it + 1),
			        (long long)cfg->iterations);
			last_pct = pct;
		}
	}
	for (int32_t k = 0; k < n; k++) {
		kiln_sim_result *r = &out[k];
		r->iteration_s = cfg->iterations ? iter_sum[k] / cfg->iterations : 0;
		r->total_s = iter_sum[k] + r->oom_lost_s;
		r->tokens_per_s = r->total_s > 0 ? w.tokens_per_iter * cfg->iterations / r->total_s : 0;
		double devices = (double)c->model->devices;
		r->mfu = r->total_s > 0 ? w.model_flops * cfg->iterations / (r->total_s * devices * w.peak_flops)
		                        : 0;
		/* Hardware FLOPs add the recomputed forwards, which run at the
		 * rate the rest does (docs/simulator.md). */
		double busy = iter_sum[k] > 0 ? r->recompute_s / iter_sum[k] : 0;
		r->hfu = r->mfu * (1 + busy);
	}
	free(iter_sum);
	free(since_ckpt);
	rc = 0;
out:
	for (int32_t k = 0; k < n; k++)
		kiln_sim_policy_free(pols[k]);
	free(pols);
	free(loads);
	free(rows_of);
	free(sc.fwd);
	free(sc.bwd);
	free(sc.layer_f);
	free(sc.layer_b);
	free(sc.held);
	free(sc.peak);
	return rc;
}
