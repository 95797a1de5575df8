/* passes/interleave.c: dual-batch interleaving (DESIGN.md section 8,
 * docs/schedule.md).
 *
 * A layer's forward (chain 0, micro-batch A) and backward (chain 1,
 * micro-batch B) are split into chunks on four streams; a plan adds offloads
 * to chain 0 and reloads and recomputes to chain 1. The dynamic program
 * walks the grid of (tasks issued from chain 0, tasks issued from chain 1);
 * at each point it keeps the Pareto set of time vectors (each stream's
 * busy-until and the end of every issued task a later task still waits
 * for). A task starts when its stream is free and its dependencies have
 * ended; non-copy tasks of a chain also wait for the previous non-copy task
 * of their chain (the chain's data flow). Copy tasks wait only for what
 * their deps name.
 *
 * The pass builds a template per plan class, then feeds the scheduled
 * exposed time (makespan above the keep-everything template, plus the HBM
 * share of offload copies) back into every plan table and drops the table
 * points that a scheduled neighbour with more saving dominates.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

const char *kiln_stream_name(kiln_stream s)
{
	switch (s) {
	case KILN_STREAM_COMPUTE:
		return "compute";
	case KILN_STREAM_COMM:
		return "comm";
	case KILN_STREAM_D2H:
		return "d2h";
	case KILN_STREAM_H2D:
		return "h2d";
	default:
		return "?";
	}
}

const char *kiln_task_kind_name(kiln_task_kind k)
{
	switch (k) {
	case KILN_TASK_FORWARD:
		return "forward";
	case KILN_TASK_BACKWARD:
		return "backward";
	case KILN_TASK_RECOMPUTE:
		return "recompute";
	case KILN_TASK_COPY:
		return "copy";
	case KILN_TASK_COMM:
		return "comm";
	default:
		return "?";
	}
}

/* ---------------------------------------------------------------- chunks */

/* The compute chunk an op kind belongs to, or NULL for glue ops (input,
 * norms, residual adds, unpermute) that join whichever chunk they sit in. */
static const char *op_category(kiln_op_kind k, bool backward)
{
	switch (k) {
	case KILN_OP_QKV_PROJ:
	case KILN_OP_Q_DOWN:
	case KILN_OP_Q_NORM:
	case KILN_OP_Q_UP:
	case KILN_OP_KV_DOWN:
	case KILN_OP_KV_NORM:
	case KILN_OP_KV_UP:
	case KILN_OP_ATTN_CORE:
	case KILN_OP_ATTN_DROPOUT:
	case KILN_OP_OUT_PROJ:
		return backward ? "attn.bwd" : "attn";
	case KILN_OP_FFN_UP:
	case KILN_OP_FFN_ACT:
	case KILN_OP_FFN_DOWN:
		return backward ? "ffn.bwd" : "ffn";
	case KILN_OP_ROUTER:
	case KILN_OP_ROUTER_SOFTMAX:
	case KILN_OP_PERMUTE:
		return backward ? "router.bwd" : "router";
	case KILN_OP_EXPERT_UP:
	case KILN_OP_EXPERT_ACT:
	case KILN_OP_EXPERT_DOWN:
		return backward ? "experts.bwd" : "experts";
	case KILN_OP_SHARED_UP:
	case KILN_OP_SHARED_ACT:
	case KILN_OP_SHARED_DOWN:
		return backward ? "shared.bwd" : "shared";
	case KILN_OP_EMBED:
		return backward ? "embed.bwd" : "embed";
	case KILN_OP_FINAL_NORM:
	case KILN_OP_LM_HEAD:
	case KILN_OP_LOSS:
		return backward ? "head.bwd" : "head";
	default:
		return NULL;
	}
}

static const char *comm_name(kiln_op_kind k, bool backward)
{
	switch (kiln_ir_op_kind_class(k)) {
	case KILN_OPCLASS_COMM_TP:
		return backward ? "tp_comm.bwd" : "tp_comm";
	case KILN_OPCLASS_COMM_PP:
		return backward ? "pp.bwd" : "pp";
	default:
		if (k == KILN_OP_DISPATCH)
			return backward ? "dispatch.bwd" : "dispatch";
		return backward ? "combine.bwd" : "combine";
	}
}

static bool is_comm(kiln_op_kind k)
{
	kiln_op_class c = kiln_ir_op_kind_class(k);
	return c == KILN_OPCLASS_COMM_TP || c == KILN_OPCLASS_COMM_EP || c == KILN_OPCLASS_COMM_PP;
}

typedef struct chunk {
	const char *name;
	bool comm;
	double us;
} chunk;

static char *concat(kiln_arena *a, const char *x, const char *y)
{
	size_t nx = strlen(x), ny = strlen(y);
	char *s = kiln_arena_alloc(a, nx + ny + 1);
	if (s) {
		memcpy(s, x, nx);
		memcpy(s + nx, y, ny + 1);
	}
	return s;
}

/* Splits the ops of one direction of the layer into chunks: every COMM op
 * alone; a compute chunk ends where a COMM op or an op of another category
 * begins. chunk_of[local op] receives the chunk index. Returns the number of
 * chunks or -1. */
static int32_t split_chunks(const kiln_ir_graph *g, const kiln_ir_layer *ly, bool backward,
                            double nl, chunk *out, int32_t *chunk_of, kiln_arena *a)
{
	int32_t nc = 0;
	const char *cur = NULL; /* category of the open compute chunk, NULL: only glue yet */
	bool open = false;
	int32_t first_glue = -1;
	for (int32_t o = ly->op_begin; o < ly->op_end; o++) {
		const kiln_ir_op *op = &g->ops[o];
		if (op->backward != backward)
			continue;
		/* Pipeline transfers happen once per stage boundary and micro-batch,
		 * not per layer: the representative layer of a stage may hold them,
		 * but a template (drawn for every layer) must not. They join the
		 * chunks as zero-cost glue, like the input marker. */
		bool pp = op->kind == KILN_OP_PP_SEND;
		double us = pp ? 0 : kiln_cost_op_time_us(g, op, nl);
		if (!pp && is_comm(op->kind)) {
			if (open && !cur && (out[nc - 1].name = concat(a, kiln_ir_op_kind_name(
			                                                      g->ops[first_glue].kind),
			                                                  backward ? ".bwd" : "")) == NULL)
				return -1;
			out[nc++] = (chunk){comm_name(op->kind, backward), true, us};
			chunk_of[o - ly->op_begin] = nc - 1;
			open = false;
			cur = NULL;
			continue;
		}
		const char *cat = op_category(op->kind, backward);
		/* A glue-only open chunk takes the next categorised op. */
		if (!open || (cat && cur && strcmp(cat, cur) != 0)) {
			out[nc++] = (chunk){cat, false, 0};
			open = true;
			cur = cat;
			first_glue = o;
		}
		if (cat && !cur) {
			cur = cat;
			out[nc - 1].name = cat;
		}
		/* A glue-only chunk is named after its first op other than the
		 * zero-cost input marker. */
		if (!cur &&
		    (g->ops[first_glue].kind == KILN_OP_INPUT ||
		     g->ops[first_glue].kind == KILN_OP_PP_SEND) &&
		    op->kind != KILN_OP_INPUT && op->kind != KILN_OP_PP_SEND)
			first_glue = o;
		out[nc - 1].us += us;
		chunk_of[o - ly->op_begin] = nc - 1;
	}
	if (open && !cur &&
	    (out[nc - 1].name = concat(a, kiln_ir_op_kind_name(g->ops[first_glue].kind),
	                               backward ? ".bwd" : "")) == NULL)
		return -1;
	return nc;
}

/* The alias root of tensor t inside layer ly. */
static int32_t alias_root(const kiln_ir_graph *g, const kiln_ir_layer *ly, int32_t t)
{
	for (int32_t steps = 0; steps < ly->tensor_end - ly->tensor_begin; steps++) {
		int32_t r = g->tensors[t].alias;
		if (r < ly->tensor_begin || r >= t)
			break;
		t = r;
	}
	return t;
}

static int add_task(kiln_task *tasks, int32_t *n, const char *name, kiln_task_kind kind,
                    kiln_stream stream, int32_t chain, double us)
{
	kiln_task *t = &tasks[*n];
	memset(t, 0, sizeof *t);
	t->name = name;
	t->kind = kind;
	t->stream = stream;
	t->chain = chain;
	t->duration_us = us;
	(*n)++;
	return 0;
}

int kiln_schedule_build(const kiln_ir_graph *g, const kiln_unit_set *set, const uint8_t *actions,
                        double n, kiln_arena *a, kiln_task **out_tasks, int32_t *out_n)
{
	const kiln_ir_layer *ly = &g->layers[set->layer];
	const kiln_hardware *hw = &g->model->hw;
	double nl = set->kind == KILN_LAYER_MOE ? n : 0;
	int32_t n_ops = ly->op_end - ly->op_begin, nt = ly->tensor_end - ly->tensor_begin;
	int32_t nu = set->n_units;
	if (nu < 0 || nu > KILN_PLAN_MAX_UNITS)
		return -1;
	size_t sz_ops = (size_t)(n_ops > 0 ? n_ops : 1), sz_u = (size_t)(nu > 0 ? nu : 1);
	chunk *fwd = kiln_arena_alloc(a, sizeof(chunk) * sz_ops);
	chunk *bwd = kiln_arena_alloc(a, sizeof(chunk) * sz_ops);
	int32_t *chunk_of = kiln_arena_alloc(a, sizeof(int32_t) * sz_ops);
	int32_t *unit_of = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(nt > 0 ? nt : 1));
	int32_t *prod = kiln_arena_alloc(a, sizeof(int32_t) * sz_u);
	int32_t *need = kiln_arena_alloc(a, sizeof(int32_t) * sz_u);
	int32_t *first_bwd = kiln_arena_alloc(a, sizeof(int32_t) * sz_u);
	int32_t *task_of = kiln_arena_alloc(a, sizeof(int32_t) * sz_u);   /* reload or recompute task */
	int32_t *chunk_task = kiln_arena_alloc(a, sizeof(int32_t) * sz_ops); /* bwd chunk -> task */
	uint8_t *op_done = kiln_arena_alloc(a, sz_ops);
	uint8_t *emitted = kiln_arena_alloc(a, sz_u);
	int32_t *ndeps = kiln_arena_alloc(a, sizeof(int32_t) * (2 * sz_ops + 3 * sz_u));
	if (!fwd || !bwd || !chunk_of || !unit_of || !prod || !need || !first_bwd || !task_of ||
	    !chunk_task || !op_done || !emitted || !ndeps)
		return -1;
	int32_t nf = split_chunks(g, ly, false, nl, fwd, chunk_of, a);
	if (nf < 0)
		return -1;
	int32_t *fchunk_of = kiln_arena_alloc(a, sizeof(int32_t) * sz_ops);
	if (!fchunk_of)
		return -1;
	memcpy(fchunk_of, chunk_of, sizeof(int32_t) * sz_ops);
	int32_t nb = split_chunks(g, ly, true, nl, bwd, chunk_of, a);
	if (nb < 0)
		return -1;

	/* Units: which tensors belong to them, where they are produced and
	 * first read in backward, and when a reload or recompute must be done:
	 * before its first backward reader and before any recompute reading it. */
	for (int32_t i = 0; i < nt; i++)
		unit_of[i] = -1;
	for (int32_t u = 0; u < nu; u++) {
		int32_t r = alias_root(g, ly, set->units[u].tensor);
		if (r >= ly->tensor_begin && r < ly->tensor_end)
			unit_of[r - ly->tensor_begin] = u;
	}
	for (int32_t i = 0; i < nt; i++) {
		int32_t r = alias_root(g, ly, ly->tensor_begin + i) - ly->tensor_begin;
		if (r != i && r >= 0 && r < nt)
			unit_of[i] = unit_of[r];
	}
	for (int32_t u = 0; u < nu; u++) {
		int32_t p = set->units[u].producer - ly->op_begin;
		prod[u] = p >= 0 && p < n_ops && !g->ops[ly->op_begin + p].backward ? fchunk_of[p]
		                                                                    : nf - 1;
		first_bwd[u] = nb - 1;
	}
	for (int32_t o = ly->op_begin; o < ly->op_end; o++) {
		const kiln_ir_op *op = &g->ops[o];
		if (!op->backward)
			continue;
		for (int32_t k = 0; k < op->n_inputs; k++) {
			int32_t t = op->inputs[k] - ly->tensor_begin;
			if (t < 0 || t >= nt || unit_of[t] < 0)
				continue;
			int32_t u = unit_of[t], ch = chunk_of[o - ly->op_begin];
			if (ch < first_bwd[u])
				first_bwd[u] = ch;
		}
	}
	for (int32_t u = 0; u < nu; u++)
		need[u] = first_bwd[u];
	for (bool changed = true; changed;) {
		changed = false;
		for (int32_t v = 0; v < nu; v++) {
			if (actions[v] != KILN_ACT_RECOMPUTE)
				continue;
			const kiln_unit *un = &set->units[v];
			for (int32_t i = 0; i < un->n_sources; i++) {
				int32_t s = un->sources[i];
				if (s >= 0 && s < nu && need[v] < need[s]) {
					need[s] = need[v];
					changed = true;
				}
			}
		}
	}

	size_t cap = (size_t)(nf + nb) + 2 * sz_u;
	kiln_task *tasks = kiln_arena_alloc(a, sizeof(kiln_task) * cap);
	if (!tasks)
		return -1;
	int32_t n_tasks = 0;
	double d2h = hw->d2h_gbps * 1e9, h2d = hw->h2d_gbps * 1e9;

	/* Chain 0: forward chunks, each followed by the offloads of the units
	 * it produces. */
	int32_t index = 0;
	for (int32_t k = 0; k < nf; k++) {
		int32_t ct = n_tasks;
		add_task(tasks, &n_tasks, fwd[k].name, fwd[k].comm ? KILN_TASK_COMM : KILN_TASK_FORWARD,
		         fwd[k].comm ? KILN_STREAM_COMM : KILN_STREAM_COMPUTE, 0, fwd[k].us);
		tasks[ct].index = index++;
		for (int32_t u = 0; u < nu; u++) {
			if (actions[u] != KILN_ACT_OFFLOAD || prod[u] != k)
				continue;
			double b = kiln_lin_at(set->units[u].bytes, nl);
			kiln_task *t = &tasks[n_tasks];
			add_task(tasks, &n_tasks, concat(a, "offload ", set->units[u].name),
			         KILN_TASK_COPY, KILN_STREAM_D2H, 0, d2h > 0 ? b / d2h * 1e6 : 0);
			t->index = index++;
			t->deps = kiln_arena_alloc(a, sizeof(int32_t));
			if (!t->name || !t->deps)
				return -1;
			t->deps[0] = ct;
			t->n_deps = 1;
		}
	}

	/* Chain 1: before each backward chunk, the reloads and then the
	 * recomputes it (or a recompute before it) needs, sources first. */
	index = 0;
	memset(op_done, 0, sz_ops);
	memset(emitted, 0, sz_u);
	for (int32_t u = 0; u < nu; u++)
		task_of[u] = -1;
	for (int32_t k = 0; k < nb; k++) {
		for (int32_t u = 0; u < nu; u++) {
			if (actions[u] != KILN_ACT_OFFLOAD || need[u] != k)
				continue;
			double b = kiln_lin_at(set->units[u].bytes, nl);
			task_of[u] = n_tasks;
			kiln_task *t = &tasks[n_tasks];
			add_task(tasks, &n_tasks, concat(a, "reload ", set->units[u].name), KILN_TASK_COPY,
			         KILN_STREAM_H2D, 1, h2d > 0 ? b / h2d * 1e6 : 0);
			if (!t->name)
				return -1;
			t->index = index++;
			t->mem_bytes = b;
		}
		/* Recomputes due here, each once its recomputed sources are out. */
		for (bool progress = true; progress;) {
			progress = false;
			for (int32_t u = 0; u < nu; u++) {
				if (actions[u] != KILN_ACT_RECOMPUTE || need[u] != k || emitted[u])
					continue;
				const kiln_unit *un = &set->units[u];
				bool ready = true;
				for (int32_t i = 0; i < un->n_sources && ready; i++) {
					int32_t s = un->sources[i];
					ready = !(s >= 0 && s < nu && actions[s] == KILN_ACT_RECOMPUTE &&
					          !emitted[s] && s != u);
				}
				if (!ready)
					continue;
				/* Ops another recompute of this layer already re-ran
				 * are not paid twice (options.c groups shared ops). */
				double us = 0;
				for (int32_t i = 0; i < un->n_closure; i++) {
					int32_t lo = un->closure[i] - ly->op_begin;
					if (lo < 0 || lo >= n_ops || op_done[lo])
						continue;
					op_done[lo] = 1;
					us += kiln_cost_op_time_us(g, &g->ops[un->closure[i]], nl);
				}
				task_of[u] = n_tasks;
				kiln_task *t = &tasks[n_tasks];
				add_task(tasks, &n_tasks, concat(a, "recompute ", un->name),
				         KILN_TASK_RECOMPUTE, KILN_STREAM_COMPUTE, 1, us);
				if (!t->name)
					return -1;
				t->index = index++;
				emitted[u] = 1;
				progress = true;
			}
		}
		chunk_task[k] = n_tasks;
		kiln_task *t = &tasks[n_tasks];
		add_task(tasks, &n_tasks, bwd[k].name, bwd[k].comm ? KILN_TASK_COMM : KILN_TASK_BACKWARD,
		         bwd[k].comm ? KILN_STREAM_COMM : KILN_STREAM_COMPUTE, 1, bwd[k].us);
		t->index = index++;
	}
	/* A recompute whose sources form a cycle cannot be valid (source
	 * tracking); refuse rather than drop work. */
	for (int32_t u = 0; u < nu; u++)
		if (actions[u] == KILN_ACT_RECOMPUTE && !emitted[u])
			return -1;

	/* Deps on reloads: the recomputes that read the unit and its first
	 * backward reader. Two passes: count, then fill. */
	memset(ndeps, 0, sizeof(int32_t) * (size_t)n_tasks);
	for (int pass = 0; pass < 2; pass++) {
		for (int32_t u = 0; u < nu; u++) {
			if (actions[u] != KILN_ACT_OFFLOAD || task_of[u] < 0)
				continue;
			int32_t users[KILN_PLAN_MAX_UNITS + 1], n_users = 0;
			for (int32_t v = 0; v < nu; v++) {
				if (actions[v] != KILN_ACT_RECOMPUTE || task_of[v] < 0)
					continue;
				const kiln_unit *un = &set->units[v];
				for (int32_t i = 0; i < un->n_sources; i++)
					if (un->sources[i] == u) {
						users[n_users++] = task_of[v];
						break;
					}
			}
			users[n_users++] = chunk_task[first_bwd[u]];
			for (int32_t i = 0; i < n_users; i++) {
				kiln_task *t = &tasks[users[i]];
				if (pass == 0)
					ndeps[users[i]]++;
				else
					t->deps[t->n_deps++] = task_of[u];
			}
		}
		if (pass == 0)
			for (int32_t i = 0; i < n_tasks; i++) {
				if (tasks[i].chain != 1 || tasks[i].kind == KILN_TASK_COPY || !ndeps[i])
					continue;
				tasks[i].deps = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)ndeps[i]);
				if (!tasks[i].deps)
					return -1;
			}
	}
	*out_tasks = tasks;
	*out_n = n_tasks;
	return 0;
}

/* ---------------------------------------------------------------- the dynamic program */

/* The problem in chain positions: per chain, its tasks in index order and
 * for each task its deps as positions in the same chain (the caller's deps,
 * the previous non-copy task, and the memory waits). */
typedef struct sched {
	const kiln_task *tasks;
	int32_t n, nc[2];
	int32_t *seq[2];   /* position -> task */
	int32_t *pos;      /* task -> position in its chain */
	int32_t **dep;     /* per task: positions in its chain */
	int32_t *n_dep;
	int32_t *dep_store;
	int32_t *last_use; /* per task: the last position of its chain that waits for it, -1 none */
} sched;

static void sched_free(sched *s)
{
	free(s->seq[0]);
	free(s->pos);
	free(s->dep);
	free(s->n_dep);
	free(s->dep_store);
	free(s->last_use);
	memset(s, 0, sizeof *s);
}

static bool is_copy(const kiln_task *t)
{
	return t->kind == KILN_TASK_COPY;
}

/* The last (chain-order) task listing task i in its deps, or -1. */
static int32_t last_dependent(const kiln_task *tasks, int32_t n, const int32_t *pos, int32_t i)
{
	int32_t best = -1;
	for (int32_t j = 0; j < n; j++)
		for (int32_t k = 0; k < tasks[j].n_deps; k++)
			if (tasks[j].deps[k] == i && (best < 0 || pos[j] > pos[best]))
				best = j;
	return best;
}

/* Builds s from tasks: -1 when the tasks are malformed (bad chain, stream,
 * index or duration; a dep outside its chain or not earlier in it), -2 on
 * exhaustion, -3 when the memory limit cannot be met (see docs/schedule.md,
 * "Memory"). */
static int sched_init(sched *s, const kiln_task *tasks, int32_t n, double mem_limit)
{
	memset(s, 0, sizeof *s);
	s->tasks = tasks;
	s->n = n;
	size_t sz = (size_t)(n > 0 ? n : 1);
	int32_t total_deps = 0;
	for (int32_t i = 0; i < n; i++) {
		const kiln_task *t = &tasks[i];
		if (t->chain < 0 || t->chain > 1 || t->stream < 0 || t->stream >= KILN_STREAM_COUNT ||
		    t->kind < 0 || t->kind >= KILN_TASK_KIND_COUNT || !(t->duration_us >= 0) ||
		    !isfinite(t->duration_us) || t->n_deps < 0 || (t->n_deps && !t->deps) ||
		    !(t->mem_bytes >= 0) || !isfinite(t->mem_bytes) || t->index < 0 || t->index >= n)
			return -1;
		s->nc[t->chain]++;
		total_deps += t->n_deps + 2;
	}
	s->seq[0] = malloc(sizeof(int32_t) * 2 * sz);
	s->pos = malloc(sizeof(int32_t) * sz);
	s->dep = malloc(sizeof(int32_t *) * sz);
	s->n_dep = calloc(sz, sizeof(int32_t));
	s->dep_store = malloc(sizeof(int32_t) * (size_t)(total_deps > 0 ? total_deps : 1));
	s->last_use = malloc(sizeof(int32_t) * sz);
	if (!s->seq[0] || !s->pos || !s->dep || !s->n_dep || !s->dep_store || !s->last_use)
		return -2;
	s->seq[1] = s->seq[0] + s->nc[0];
	for (int32_t c = 0; c < 2; c++)
		for (int32_t k = 0; k < s->nc[c]; k++)
			s->seq[c][k] = -1;
	for (int32_t i = 0; i < n; i++) {
		const kiln_task *t = &tasks[i];
		if (t->index >= s->nc[t->chain] || s->seq[t->chain][t->index] >= 0)
			return -1;
		s->seq[t->chain][t->index] = i;
		s->pos[i] = t->index;
	}
	int32_t used = 0;
	for (int32_t c = 0; c < 2; c++) {
		int32_t prev = -1; /* previous non-copy position */
		for (int32_t k = 0; k < s->nc[c]; k++) {
			int32_t i = s->seq[c][k];
			const kiln_task *t = &tasks[i];
			s->dep[i] = s->dep_store + used;
			for (int32_t d = 0; d < t->n_deps; d++) {
				int32_t j = t->deps[d];
				if (j < 0 || j >= n || tasks[j].chain != c || s->pos[j] >= k)
					return -1;
				s->dep[i][s->n_dep[i]++] = s->pos[j];
			}
			if (!is_copy(t)) {
				if (prev >= 0)
					s->dep[i][s->n_dep[i]++] = prev;
				prev = k;
			}
			used += s->n_dep[i] + 1; /* room for one memory wait */
		}
	}

	/* Memory: a holding task waits for the release of earlier ones until it
	 * fits. Releases are ends of non-copy tasks of the chain, which come in
	 * chain order, so the buffers still held at any instant are those whose
	 * releasing task lies beyond the last one finished: one wait, on the
	 * right task, is exact (docs/schedule.md, "Memory"). */
	if (isfinite(mem_limit)) {
		int32_t holder_chain = -1, holder_stream = -1;
		for (int32_t c = 0; c < 2; c++)
			for (int32_t k = 0; k < s->nc[c]; k++) {
				int32_t i = s->seq[c][k];
				if (tasks[i].mem_bytes <= 0)
					continue;
				if (tasks[i].mem_bytes > mem_limit)
					return -3;
				if ((holder_chain >= 0 && holder_chain != c) ||
				    (holder_stream >= 0 && holder_stream != (int32_t)tasks[i].stream) ||
				    !is_copy(&tasks[i]))
					return -1;
				holder_chain = c;
				holder_stream = (int32_t)tasks[i].stream;
				int32_t r = last_dependent(tasks, n, s->pos, i);
				if (r >= 0 && is_copy(&tasks[r]))
					return -1;
				s->last_use[i] = r >= 0 ? s->pos[r] : -1; /* release position, for now */
				/* Earlier holders still held at our start, by release. */
				double need = tasks[i].mem_bytes;
				int32_t wait = -1;
				for (;;) {
					double held = 0;
					int32_t latest = -1; /* the smallest release position still held */
					for (int32_t m = 0; m < k; m++) {
						int32_t l = s->seq[c][m];
						if (tasks[l].mem_bytes <= 0)
							continue;
						int32_t rp = s->last_use[l];
						if (rp < 0)
							continue; /* freed at its own end, before we start (FIFO) */
						if (rp <= wait)
							continue;
						held += tasks[l].mem_bytes;
						if (latest < 0 || rp < latest)
							latest = rp;
					}
					if (held + need <= mem_limit)
						break;
					wait = latest;
				}
				if (wait >= k)
					return -3;
				if (wait >= 0)
					s->dep[i][s->n_dep[i]++] = wait;
			}
	}

	for (int32_t i = 0; i < n; i++)
		s->last_use[i] = -1;
	for (int32_t i = 0; i < n; i++) {
		int32_t c = tasks[i].chain;
		for (int32_t d = 0; d < s->n_dep[i]; d++) {
			int32_t j = s->seq[c][s->dep[i][d]];
			if (s->pos[i] > s->last_use[j])
				s->last_use[j] = s->pos[i];
		}
	}
	return 0;
}

/* Per chain and prefix length i: the positions < i that a position >= i
 * waits for (live), in ascending order. */
typedef struct live {
	int32_t *off;  /* nc + 2 entries: live[i] = ids[off[i] .. off[i+1]) */
	int32_t *ids;
} live;

static int live_init(const sched *s, int32_t c, live *out)
{
	int32_t m = s->nc[c];
	size_t sz = (size_t)m + 2;
	out->off = malloc(sizeof(int32_t) * sz);
	out->ids = malloc(sizeof(int32_t) * ((size_t)m * (size_t)m + 1));
	if (!out->off || !out->ids)
		return -1;
	int32_t used = 0;
	for (int32_t i = 0; i <= m; i++) {
		out->off[i] = used;
		for (int32_t p = 0; p < i; p++)
			if (s->last_use[s->seq[c][p]] >= i)
				out->ids[used++] = p;
	}
	out->off[m + 1] = used;
	return 0;
}

static void live_free(live *l)
{
	free(l->off);
	free(l->ids);
}

static int32_t live_n(const live *l, int32_t i)
{
	return l->off[i + 1] - l->off[i];
}

/* Index of position p in live[i], or -1. */
static int32_t live_find(const live *l, int32_t i, int32_t p)
{
	for (int32_t q = l->off[i]; q < l->off[i + 1]; q++)
		if (l->ids[q] == p)
			return q - l->off[i];
	return -1;
}

/* A label: a time vector [busy[4], live0 ends, live1 ends] in the pool, its
 * parent label and the chain of the task that led to it. */
typedef struct label {
	int32_t off;
	int32_t parent;
	int8_t chain;
} label;

typedef struct cell {
	int32_t *ids;
	int32_t n, cap;
} cell;

typedef struct dp {
	const sched *s;
	live lv[2];
	label *labels;
	int32_t n_labels, cap_labels;
	double *pool;
	size_t n_pool, cap_pool;
	cell *cells;
	int32_t cap; /* Pareto cap, 0: none */
	/* per (chain, position): dep slots in live[pos] */
	int32_t **dslot;
	int32_t *dslot_store;
} dp;

static int32_t dim_of(const dp *d, int32_t i, int32_t j)
{
	return KILN_STREAM_COUNT + live_n(&d->lv[0], i) + live_n(&d->lv[1], j);
}

/* a <= b componentwise. */
static bool leq(const double *a, const double *b, int32_t dim)
{
	for (int32_t k = 0; k < dim; k++)
		if (a[k] > b[k])
			return false;
	return true;
}

static double bound(const double *v)
{
	double m = 0;
	for (int32_t k = 0; k < KILN_STREAM_COUNT; k++)
		if (v[k] > m)
			m = v[k];
	return m;
}

/* Reserves a vector of dim in the pool; returns its offset or -1. */
static int64_t pool_take(dp *d, int32_t dim)
{
	if (d->n_pool + (size_t)dim > d->cap_pool) {
		size_t nc = d->cap_pool ? 2 * d->cap_pool : 4096;
		while (nc < d->n_pool + (size_t)dim)
			nc *= 2;
		double *np = realloc(d->pool, sizeof(double) * nc);
		if (!np)
			return -1;
		d->pool = np;
		d->cap_pool = nc;
	}
	int64_t off = (int64_t)d->n_pool;
	d->n_pool += (size_t)dim;
	return off;
}

/* Offers the vector at pool offset off (dim entries) to cell c as a new
 * label; dominated labels leave, a dominated offer is dropped. Returns 0 or
 * -1 on exhaustion. */
static int offer(dp *d, cell *c, int32_t off, int32_t dim, int32_t parent, int8_t chain)
{
	const double *v = d->pool + off;
	int32_t w = 0;
	for (int32_t q = 0; q < c->n; q++) {
		const double *u = d->pool + d->labels[c->ids[q]].off;
		if (leq(u, v, dim)) {
			d->n_pool -= (size_t)dim; /* the offer was the last taken */
			return 0;
		}
		if (!leq(v, u, dim))
			c->ids[w++] = c->ids[q];
	}
	c->n = w;
	if (d->cap > 0 && c->n >= d->cap) {
		/* Full: the offer replaces the label with the worst makespan bound
		 * if it is better (lossy only beyond the cap; docs/schedule.md). */
		int32_t worst = 0;
		for (int32_t q = 1; q < c->n; q++)
			if (bound(d->pool + d->labels[c->ids[q]].off) >
			    bound(d->pool + d->labels[c->ids[worst]].off))
				worst = q;
		if (bound(v) >= bound(d->pool + d->labels[c->ids[worst]].off)) {
			d->n_pool -= (size_t)dim;
			return 0;
		}
		c->ids[worst] = c->ids[--c->n];
	}
	if (d->n_labels == d->cap_labels) {
		int32_t nc = d->cap_labels ? 2 * d->cap_labels : 1024;
		label *nl = realloc(d->labels, sizeof(label) * (size_t)nc);
		if (!nl)
			return -1;
		d->labels = nl;
		d->cap_labels = nc;
	}
	if (c->n == c->cap) {
		int32_t nc = c->cap ? 2 * c->cap : 4;
		int32_t *ni = realloc(c->ids, sizeof(int32_t) * (size_t)nc);
		if (!ni)
			return -1;
		c->ids = ni;
		c->cap = nc;
	}
	d->labels[d->n_labels] = (label){off, parent, chain};
	c->ids[c->n++] = d->n_labels++;
	return 0;
}

/* Extends label id at (i, j) by the next task of chain ch into the next
 * cell. */
static int extend(dp *d, int32_t i, int32_t j, int32_t id, int8_t ch)
{
	const sched *s = d->s;
	int32_t p = ch == 0 ? i : j;
	int32_t ni = i + (ch == 0), nj = j + (ch == 1);
	int32_t dim = dim_of(d, ni, nj);
	int64_t off = pool_take(d, dim);
	if (off < 0)
		return -1;
	const double *x = d->pool + d->labels[id].off; /* after pool_take: it may move */
	double *y = d->pool + off;
	const kiln_task *t = &s->tasks[s->seq[ch][p]];
	int32_t n0 = live_n(&d->lv[0], i), nn0 = live_n(&d->lv[0], ni);
	const double *xl = x + KILN_STREAM_COUNT + (ch == 0 ? 0 : n0);
	double start = x[t->stream];
	int32_t ti = s->seq[ch][p];
	for (int32_t k = 0; k < s->n_dep[ti]; k++) {
		double e = xl[d->dslot[ti][k]];
		if (e > start)
			start = e;
	}
	double end = start + t->duration_us;
	memcpy(y, x, sizeof(double) * KILN_STREAM_COUNT);
	y[t->stream] = end;
	/* Live ends: the moving chain's list shifts, the other is copied. */
	const live *lv = &d->lv[ch];
	double *yl = y + KILN_STREAM_COUNT + (ch == 0 ? 0 : nn0);
	int32_t base = lv->off[p + 1];
	for (int32_t q = 0; q < live_n(lv, p + 1); q++) {
		int32_t id2 = lv->ids[base + q];
		yl[q] = id2 == p ? end : xl[live_find(lv, p, id2)];
	}
	if (ch == 0)
		memcpy(y + KILN_STREAM_COUNT + nn0, x + KILN_STREAM_COUNT + n0,
		       sizeof(double) * (size_t)live_n(&d->lv[1], j));
	else
		memcpy(y + KILN_STREAM_COUNT, x + KILN_STREAM_COUNT, sizeof(double) * (size_t)n0);
	cell *c = &d->cells[(size_t)ni * (size_t)(s->nc[1] + 1) + (size_t)nj];
	return offer(d, c, (int32_t)off, dim, id, ch);
}

static void dp_free(dp *d)
{
	live_free(&d->lv[0]);
	live_free(&d->lv[1]);
	free(d->labels);
	free(d->pool);
	if (d->cells) {
		size_t nc = (size_t)(d->s->nc[0] + 1) * (size_t)(d->s->nc[1] + 1);
		for (size_t k = 0; k < nc; k++)
			free(d->cells[k].ids);
	}
	free(d->cells);
	free(d->dslot);
	free(d->dslot_store);
}

/* Replays a merge order (chain per step) with list scheduling; fills
 * start/end (per task, in out arrays). Returns the makespan. */
static double replay(const sched *s, const int8_t *order, double *start, double *end)
{
	double busy[KILN_STREAM_COUNT] = {0};
	int32_t next[2] = {0, 0};
	double mk = 0;
	for (int32_t k = 0; k < s->n; k++) {
		int c = order[k];
		int32_t i = s->seq[c][next[c]++];
		const kiln_task *t = &s->tasks[i];
		double st = busy[t->stream];
		for (int32_t d = 0; d < s->n_dep[i]; d++) {
			double e = end[s->seq[c][s->dep[i][d]]];
			if (e > st)
				st = e;
		}
		start[i] = st;
		end[i] = st + t->duration_us;
		busy[t->stream] = end[i];
		if (end[i] > mk)
			mk = end[i];
	}
	return mk;
}

/* Runs the DP; fills order (n entries) with the best merge order. Returns
 * 0 or -1 on exhaustion. */
static int dp_run(const sched *s, int32_t cap, int8_t *order)
{
	dp d;
	memset(&d, 0, sizeof d);
	d.s = s;
	d.cap = cap;
	int rc = -1;
	size_t n_cells = (size_t)(s->nc[0] + 1) * (size_t)(s->nc[1] + 1);
	if (live_init(s, 0, &d.lv[0]) != 0 || live_init(s, 1, &d.lv[1]) != 0)
		goto out;
	d.cells = calloc(n_cells, sizeof(cell));
	d.dslot = malloc(sizeof(int32_t *) * (size_t)(s->n > 0 ? s->n : 1));
	int32_t total = 0;
	for (int32_t i = 0; i < s->n; i++)
		total += s->n_dep[i];
	d.dslot_store = malloc(sizeof(int32_t) * (size_t)(total > 0 ? total : 1));
	if (!d.cells || !d.dslot || !d.dslot_store)
		goto out;
	total = 0;
	for (int32_t i = 0; i < s->n; i++) {
		int32_t c = s->tasks[i].chain, p = s->pos[i];
		d.dslot[i] = d.dslot_store + total;
		for (int32_t k = 0; k < s->n_dep[i]; k++)
			d.dslot[i][k] = live_find(&d.lv[c], p, s->dep[i][k]);
		total += s->n_dep[i];
	}
	int64_t off = pool_take(&d, KILN_STREAM_COUNT);
	if (off < 0)
		goto out;
	for (int32_t k = 0; k < KILN_STREAM_COUNT; k++)
		d.pool[off + k] = 0;
	if (offer(&d, &d.cells[0], (int32_t)off, KILN_STREAM_COUNT, -1, -1) != 0)
		goto out;
	for (int32_t i = 0; i <= s->nc[0]; i++)
		for (int32_t j = 0; j <= s->nc[1]; j++) {
			cell *c = &d.cells[(size_t)i * (size_t)(s->nc[1] + 1) + (size_t)j];
			for (int32_t q = 0; q < c->n; q++) {
				if (i < s->nc[0] && extend(&d, i, j, c->ids[q], 0) != 0)
					goto out;
				if (j < s->nc[1] && extend(&d, i, j, c->ids[q], 1) != 0)
					goto out;
			}
		}
	cell *last = &d.cells[n_cells - 1];
	int32_t best = -1;
	for (int32_t q = 0; q < last->n; q++)
		if (best < 0 || bound(d.pool + d.labels[last->ids[q]].off) <
		                    bound(d.pool + d.labels[best].off))
			best = last->ids[q];
	if (best < 0)
		goto out;
	for (int32_t k = s->n - 1; k >= 0; k--) {
		order[k] = d.labels[best].chain;
		best = d.labels[best].parent;
	}
	rc = 0;
out:
	dp_free(&d);
	return rc;
}

static int cmp_start(const void *pa, const void *pb, const kiln_task *t)
{
	int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
	if (t[a].start_us != t[b].start_us)
		return t[a].start_us < t[b].start_us ? -1 : 1;
	if (t[a].chain != t[b].chain)
		return t[a].chain - t[b].chain;
	return t[a].index - t[b].index;
}

/* Sorts tasks into start order and renumbers deps (in place). Returns 0 or
 * -1 on exhaustion. */
static int sort_by_start(kiln_task *tasks, int32_t n)
{
	if (n <= 0)
		return 0;
	int32_t *perm = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
	int32_t *inv = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
	kiln_task *copy = malloc(sizeof(kiln_task) * (size_t)(n > 0 ? n : 1));
	if (!perm || !inv || !copy) {
		free(perm);
		free(inv);
		free(copy);
		return -1;
	}
	for (int32_t i = 0; i < n; i++)
		perm[i] = i;
	/* Insertion sort: n is a few dozen, and qsort has no context argument. */
	for (int32_t i = 1; i < n; i++) {
		int32_t x = perm[i], k = i;
		while (k > 0 && cmp_start(&perm[k - 1], &x, tasks) > 0) {
			perm[k] = perm[k - 1];
			k--;
		}
		perm[k] = x;
	}
	memcpy(copy, tasks, sizeof(kiln_task) * (size_t)n);
	for (int32_t i = 0; i < n; i++)
		inv[perm[i]] = i;
	for (int32_t i = 0; i < n; i++) {
		tasks[i] = copy[perm[i]];
		for (int32_t d = 0; d < tasks[i].n_deps; d++)
			tasks[i].deps[d] = inv[tasks[i].deps[d]];
	}
	free(perm);
	free(inv);
	free(copy);
	return 0;
}

static double finish(kiln_task *tasks, int32_t n, const double *start, const double *end)
{
	double mk = 0;
	for (int32_t i = 0; i < n; i++) {
		tasks[i].start_us = start[i];
		tasks[i].end_us = end[i];
		if (end[i] > mk)
			mk = end[i];
	}
	if (sort_by_start(tasks, n) != 0)
		return -2;
	return mk;
}

double kiln_schedule_dp_cap(kiln_task *tasks, int32_t n, double mem_limit_bytes,
                            int32_t pareto_cap, kiln_arena *a)
{
	/* Scratch is heap memory freed before return: the pass calls this
	 * thousands of times, and the compilation's arena keeps only results. */
	(void)a;
	if (n < 0 || (n > 0 && !tasks) || pareto_cap < 0 || isnan(mem_limit_bytes))
		return -1;
	sched s;
	int rc = sched_init(&s, tasks, n, mem_limit_bytes);
	if (rc != 0) {
		sched_free(&s);
		return rc;
	}
	size_t sz = (size_t)(n > 0 ? n : 1);
	int8_t *order = malloc(sz), *serial = malloc(sz);
	double *st = malloc(sizeof(double) * sz), *en = malloc(sizeof(double) * sz);
	double *st2 = malloc(sizeof(double) * sz), *en2 = malloc(sizeof(double) * sz);
	double mk = -2;
	if (order && serial && st && en && st2 && en2 && dp_run(&s, pareto_cap, order) == 0) {
		mk = replay(&s, order, st, en);
		/* Chain 0 then chain 1 is one merge order: with a cap the DP could
		 * in principle lose it, and overlapped must never lose to serial. */
		for (int32_t k = 0; k < n; k++)
			serial[k] = k < s.nc[0] ? 0 : 1;
		double mk2 = replay(&s, serial, st2, en2);
		if (mk2 < mk)
			mk = finish(tasks, n, st2, en2);
		else
			mk = finish(tasks, n, st, en);
	}
	free(order);
	free(serial);
	free(st);
	free(en);
	free(st2);
	free(en2);
	sched_free(&s);
	return mk;
}

double kiln_schedule_dp(kiln_task *tasks, int32_t n, double mem_limit_bytes, kiln_arena *a)
{
	return kiln_schedule_dp_cap(tasks, n, mem_limit_bytes, KILN_SCHEDULE_PARETO_CAP, a);
}

double kiln_schedule_serial(kiln_task *tasks, int32_t n, kiln_arena *a)
{
	(void)a;
	if (n < 0 || (n > 0 && !tasks))
		return -1;
	sched s;
	int rc = sched_init(&s, tasks, n, INFINITY);
	if (rc != 0) {
		sched_free(&s);
		return rc;
	}
	size_t sz = (size_t)(n > 0 ? n : 1);
	double *st = malloc(sizeof(double) * sz), *en = malloc(sizeof(double) * sz);
	double mk = -2;
	if (st && en) {
		/* Chain 0 in order, then chain 1 once all of chain 0 (its copies
		 * included) has ended; inside a chain copies overlap the chain's
		 * other work on their own streams. */
		double busy[KILN_STREAM_COUNT] = {0}, barrier = 0;
		mk = 0;
		for (int32_t c = 0; c < 2; c++) {
			for (int32_t k = 0; k < s.nc[c]; k++) {
				int32_t i = s.seq[c][k];
				const kiln_task *t = &tasks[i];
				double start = busy[t->stream] > barrier ? busy[t->stream] : barrier;
				for (int32_t d = 0; d < s.n_dep[i]; d++) {
					double e = en[s.seq[c][s.dep[i][d]]];
					if (e > start)
						start = e;
				}
				st[i] = start;
				en[i] = start + t->duration_us;
				busy[t->stream] = en[i];
				if (en[i] > mk)
					mk = en[i];
			}
			barrier = mk;
		}
		mk = finish(tasks, n, st, en);
	}
	free(st);
	free(en);
	sched_free(&s);
	return mk;
}

/* ---------------------------------------------------------------- verify */

typedef struct mem_event {
	double t;
	double bytes; /* + acquire, - release */
} mem_event;

static int cmp_event(const void *pa, const void *pb)
{
	const mem_event *a = pa, *b = pb;
	if (a->t != b->t)
		return a->t < b->t ? -1 : 1;
	/* Releases first: a buffer freed at t makes room for one taken at t. */
	return (a->bytes > b->bytes) - (a->bytes < b->bytes);
}

int kiln_schedule_verify(const kiln_task *tasks, int32_t n, double mem_limit_bytes, FILE *err)
{
	int bad = 0;
	if (n < 0 || (n > 0 && !tasks)) {
		if (err)
			fprintf(err, "schedule: no tasks\n");
		return -1;
	}
	double mk = 0;
	for (int32_t i = 0; i < n; i++)
		if (tasks[i].end_us > mk)
			mk = tasks[i].end_us;
	double eps = 1e-9 * (mk > 1 ? mk : 1);
#define VIOLATION(...)                                                                             \
	do {                                                                                       \
		bad = 1;                                                                           \
		if (err)                                                                           \
			fprintf(err, __VA_ARGS__);                                                 \
	} while (0)
	for (int32_t i = 0; i < n; i++) {
		const kiln_task *t = &tasks[i];
		if (t->stream < 0 || t->stream >= KILN_STREAM_COUNT || t->chain < 0 || t->chain > 1) {
			VIOLATION("schedule: task %d (%s): bad stream or chain\n", i,
			          t->name ? t->name : "?");
			continue;
		}
		/* Written so that NaN fails every test. */
		if (!isfinite(t->start_us) || !isfinite(t->end_us) || !isfinite(t->duration_us) ||
		    !(t->duration_us >= 0) || !(t->mem_bytes >= 0) || !(t->start_us >= -eps) ||
		    !(fabs(t->end_us - t->start_us - t->duration_us) <= eps))
			VIOLATION("schedule: task %d (%s): start %g end %g but duration %g\n", i,
			          t->name ? t->name : "?", t->start_us, t->end_us, t->duration_us);
		for (int32_t d = 0; d < t->n_deps; d++) {
			int32_t j = t->deps[d];
			if (j < 0 || j >= n) {
				VIOLATION("schedule: task %d (%s): dep %d out of range\n", i,
				          t->name ? t->name : "?", j);
				continue;
			}
			if (j == i || !(tasks[j].end_us <= t->start_us + eps))
				VIOLATION("schedule: task %d (%s) starts at %g before its dep %d (%s) ends "
				          "at %g\n",
				          i, t->name ? t->name : "?", t->start_us, j,
				          tasks[j].name ? tasks[j].name : "?", tasks[j].end_us);
		}
		for (int32_t j = 0; j < n; j++) {
			const kiln_task *u = &tasks[j];
			if (j == i)
				continue;
			/* One stream runs one task at a time (zero-length tasks
			 * occupy nothing). */
			if (u->stream == t->stream && t->duration_us > 0 && u->duration_us > 0 &&
			    u->start_us < t->end_us - eps && t->start_us < u->end_us - eps && j > i)
				VIOLATION("schedule: tasks %d (%s) and %d (%s) overlap on stream %s\n", i,
				          t->name ? t->name : "?", j, u->name ? u->name : "?",
				          kiln_stream_name(t->stream));
			/* Every position of a chain is taken once. */
			if (u->chain == t->chain && u->index == t->index && j > i)
				VIOLATION("schedule: tasks %d and %d share chain %d position %d\n", i, j,
				          t->chain, t->index);
			/* Chain order of non-copy tasks. */
			if (u->chain == t->chain && !is_copy(t) && !is_copy(u) && u->index < t->index &&
			    u->end_us > t->start_us + eps)
				VIOLATION("schedule: chain %d: task %d (%s, position %d) starts before "
				          "task %d (%s, position %d) ends\n",
				          t->chain, i, t->name ? t->name : "?", t->index, j,
				          u->name ? u->name : "?", u->index);
		}
	}
	/* Memory: each holding task from its start to the end of its last
	 * dependent (its own end when none). */
	int32_t n_ev = 0;
	for (int32_t i = 0; i < n; i++)
		n_ev += tasks[i].mem_bytes > 0 ? 2 : 0;
	if (n_ev > 0) {
		mem_event *ev = malloc(sizeof(mem_event) * (size_t)n_ev);
		if (!ev) {
			if (err)
				fprintf(err, "schedule: out of memory\n");
			return -1;
		}
		int32_t k = 0;
		for (int32_t i = 0; i < n; i++) {
			if (!(tasks[i].mem_bytes > 0))
				continue;
			double release = tasks[i].end_us;
			for (int32_t j = 0; j < n; j++)
				for (int32_t d = 0; d < tasks[j].n_deps; d++)
					if (tasks[j].deps[d] == i && tasks[j].end_us > release)
						release = tasks[j].end_us;
			ev[k++] = (mem_event){tasks[i].start_us, tasks[i].mem_bytes};
			ev[k++] = (mem_event){release, -tasks[i].mem_bytes};
		}
		qsort(ev, (size_t)n_ev, sizeof *ev, cmp_event);
		double held = 0, peak = 0, at = 0;
		for (int32_t e = 0; e < n_ev; e++) {
			held += ev[e].bytes;
			if (held > peak) {
				peak = held;
				at = ev[e].t;
			}
		}
		free(ev);
		if (peak > mem_limit_bytes * (1 + 1e-12))
			VIOLATION("schedule: %.0f bytes of reload buffers held at %g us, limit %.0f\n",
			          peak, at, mem_limit_bytes);
	}
#undef VIOLATION
	return bad ? -1 : 0;
}

/* ---------------------------------------------------------------- the pass */

/* HBM time the copy engine takes from compute for a plan's offloads (the
 * cost model's term, docs/cost-model.md "Copy link"): the stream model
 * cannot see it, so feedback adds it back. */
static double hbm_copy_us(const kiln_compilation *c, const kiln_unit_set *set,
                          const uint8_t *actions, double n)
{
	double us = 0, nl = set->kind == KILN_LAYER_MOE ? n : 0;
	for (int32_t u = 0; u < set->n_units; u++)
		if (actions[u] == KILN_ACT_OFFLOAD)
			us += kiln_cost_hbm_us(&c->model->hw,
			                       2.0 * kiln_lin_at(set->units[u].bytes, nl));
	return us;
}

double kiln_interleave_hbm_us(const kiln_compilation *c, const kiln_plan_table *t,
                              const uint8_t *actions)
{
	return hbm_copy_us(c, t->set, actions, t->n);
}

/* Builds and schedules one template (tasks from a). */
int kiln_interleave_template(const kiln_compilation *c, const kiln_plan_table *t, int32_t plan,
                             const uint8_t *actions, kiln_arena *a, kiln_template *out)
{
	kiln_task *tasks, *serial;
	int32_t n, n2;
	memset(out, 0, sizeof *out);
	if (kiln_schedule_build(c->graph, t->set, actions, t->n, a, &tasks, &n) != 0 ||
	    kiln_schedule_build(c->graph, t->set, actions, t->n, a, &serial, &n2) != 0)
		return -1;
	out->stage = t->set->stage;
	out->kind = t->set->kind;
	out->plan = plan;
	out->load_factor = t->load_factor;
	out->tasks = tasks;
	out->n_tasks = n;
	out->makespan_us = kiln_schedule_dp(tasks, n, INFINITY, a);
	out->serial_us = kiln_schedule_serial(serial, n2, a);
	return out->makespan_us < 0 || out->serial_us < 0 ? -1 : 0;
}

double kiln_interleave_makespan(const kiln_compilation *c, const kiln_plan_table *t,
                                const uint8_t *actions, kiln_arena *a)
{
	kiln_task *tasks;
	int32_t n;
	if (kiln_schedule_build(c->graph, t->set, actions, t->n, a, &tasks, &n) != 0)
		return -1;
	return kiln_schedule_dp(tasks, n, INFINITY, a);
}

int kiln_interleave_exposed(const kiln_compilation *c, const kiln_plan_table *t,
                            const uint8_t *actions, kiln_arena *a, double *out_exposed_us,
                            double *out_serial_us)
{
	static const uint8_t keep[KILN_PLAN_MAX_UNITS]; /* zero: KILN_ACT_KEEP */
	kiln_task *tasks;
	int32_t n;
	double mk[2], se[2];
	for (int k = 0; k < 2; k++) {
		const uint8_t *act = k ? actions : keep;
		if (kiln_schedule_build(c->graph, t->set, act, t->n, a, &tasks, &n) != 0 ||
		    (se[k] = kiln_schedule_serial(tasks, n, a)) < 0 ||
		    kiln_schedule_build(c->graph, t->set, act, t->n, a, &tasks, &n) != 0 ||
		    (mk[k] = kiln_schedule_dp(tasks, n, INFINITY, a)) < 0)
			return -1;
	}
	double hbm = hbm_copy_us(c, t->set, actions, t->n);
	*out_exposed_us = (mk[1] > mk[0] ? mk[1] - mk[0] : 0) + hbm;
	*out_serial_us = (se[1] > se[0] ? se[1] - se[0] : 0) + hbm;
	return 0;
}

/* Scratch arenas for throw-away task lists, renewed every so often so that
 * they stay small. */
typedef struct scratch {
	kiln_arena *a;
	int32_t uses;
} scratch;

static kiln_arena *scratch_get(scratch *s)
{
	if (s->a && ++s->uses > 256) {
		kiln_arena_free(s->a);
		s->a = NULL;
	}
	if (!s->a) {
		s->a = kiln_arena_new();
		s->uses = 0;
	}
	return s->a;
}

static int32_t set_index(const kiln_compilation *c, const kiln_unit_set *set)
{
	return (int32_t)(set - c->sets);
}

int kiln_pass_interleave(kiln_compilation *c)
{
	kiln_arena *a = c->arena;
	const kiln_plan_pool *pool = c->pool;
	int32_t n_tab = c->n_sets * c->n_buckets, np = pool->n;
	int32_t b1 = kiln_plan_bucket_of(c->buckets, c->n_buckets, 1.0);
	if (b1 >= c->n_buckets)
		b1 = c->n_buckets - 1;
	kiln_plan_schedule *sc = kiln_arena_alloc(a, sizeof *sc);
	int32_t n_tpl = np + c->n_sets;
	kiln_template *tpl = kiln_arena_alloc(a, sizeof(kiln_template) * (size_t)(n_tpl ? n_tpl : 1));
	int32_t *first = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(np ? np : 1));
	double *base = kiln_arena_alloc(a, sizeof(double) * (size_t)(n_tab ? n_tab : 1));
	uint8_t *keep = kiln_arena_alloc(a, KILN_PLAN_MAX_UNITS); /* zero: KILN_ACT_KEEP */
	double **cache = kiln_arena_alloc(a, sizeof(double *) * (size_t)(pool->n_frontiers + 1));
	if (!sc || !tpl || !first || !base || !keep || !cache)
		return -1;
	scratch scr = {0};
	int rc = -1;
	kiln_progress_phase(c->meter, "interleave", "schedules", (int64_t)n_tab + np + c->n_sets);

	/* The first table (set-major, bucket ascending) using each plan class,
	 * and its table point. */
	for (int32_t p = 0; p < np; p++)
		first[p] = -1;
	for (int32_t ti = 0; ti < n_tab; ti++) {
		const kiln_plan_table *t = &c->tables[ti];
		base[ti] = NAN;
		for (int32_t k = 0; k < t->n_points; k++)
			if (t->plan[k] >= 0 && t->plan[k] < np && first[t->plan[k]] < 0)
				first[t->plan[k]] = ti;
	}
	/* Base makespans (keep everything) of every table, by frontier. */
	for (int32_t ti = 0; ti < n_tab; ti++) {
		const kiln_plan_table *t = &c->tables[ti];
		kiln_arena *sa = scratch_get(&scr);
		if (!sa || (base[ti] = kiln_interleave_makespan(c, t, keep, sa)) < 0)
			goto out;
		kiln_progress_add(c->meter, 1);
	}
	for (int32_t p = 0; p < np; p++) {
		int32_t ti = first[p];
		if (ti < 0) { /* a plan no table uses: schedule it at its set's load 1 */
			ti = set_index(c, pool->set[p]) * c->n_buckets + b1;
			if (ti < 0 || ti >= n_tab)
				goto out;
		}
		if (kiln_interleave_template(c, &c->tables[ti], p, pool->actions[p], a, &tpl[p]) != 0)
			goto out;
		tpl[p].base_us = base[ti];
		kiln_progress_add(c->meter, 1);
	}
	/* One keep-everything template per unit set at load 1: what the stage
	 * timelines show until budget picks steady plans. */
	for (int32_t s = 0; s < c->n_sets; s++) {
		int32_t ti = s * c->n_buckets + b1;
		int32_t p = c->tables[ti].plan[0];
		if (kiln_interleave_template(c, &c->tables[ti], p, keep, a, &tpl[np + s]) != 0)
			goto out;
		tpl[np + s].base_us = base[ti];
		kiln_progress_add(c->meter, 1);
	}
	sc->model = c->model->name;
	sc->templates = tpl;
	sc->n_templates = n_tpl;
	sc->n_stages = c->graph->n_stages;
	sc->stages = kiln_arena_alloc(a, sizeof(kiln_stage_timeline) * (size_t)(sc->n_stages + 1));
	if (!sc->stages)
		goto out;
	for (int32_t s = 0; s < sc->n_stages; s++) {
		const kiln_ir_stage *st = &c->graph->stages[s];
		kiln_stage_timeline *tl = &sc->stages[s];
		int32_t cnt = 0;
		tl->stage = s;
		for (int32_t l = st->layer_begin; l < st->layer_end; l++)
			cnt += c->graph->layers[l].kind == KILN_LAYER_DENSE ||
			       c->graph->layers[l].kind == KILN_LAYER_MOE;
		tl->layer = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(cnt ? cnt : 1));
		tl->template_id = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(cnt ? cnt : 1));
		if (!tl->layer || !tl->template_id)
			goto out;
		for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
			const kiln_ir_layer *ly = &c->graph->layers[l];
			if (ly->kind != KILN_LAYER_DENSE && ly->kind != KILN_LAYER_MOE)
				continue;
			int32_t set = -1;
			for (int32_t k = 0; k < c->n_sets && set < 0; k++)
				if (c->sets[k].stage == s && c->sets[k].kind == ly->kind)
					set = k;
			if (set < 0)
				goto out;
			tl->layer[tl->n_layers] = ly->index;
			tl->template_id[tl->n_layers++] = np + set;
		}
	}

	/* Feedback: per table point the scheduled exposed time, shared by the
	 * tables of one frontier (identical instances), then the points a
	 * scheduled neighbour with more saving dominates leave the table. */
	for (int32_t ti = 0; ti < n_tab; ti++) {
		kiln_plan_table *t = &c->tables[ti];
		const kiln_frontier *f = t->frontier;
		int32_t fid = t->frontier_id;
		if (fid < 0 || fid >= pool->n_frontiers)
			goto out;
		if (!cache[fid]) {
			cache[fid] = kiln_arena_alloc(a, sizeof(double) * (size_t)f->n_points);
			if (!cache[fid])
				goto out;
			for (int32_t k = 0; k < f->n_points; k++)
				cache[fid][k] = NAN;
		}
		t->exposed_us = kiln_arena_alloc(a, sizeof(double) * (size_t)(t->n_points ? t->n_points : 1));
		if (!t->exposed_us)
			goto out;
		for (int32_t k = 0; k < t->n_points; k++) {
			double *slot = &cache[fid][t->point[k]];
			if (isnan(*slot)) {
				int32_t p = t->plan[k];
				if (p < 0 || p >= np)
					goto out;
				const uint8_t *act = pool->actions[p];
				double mk;
				if (first[p] == ti)
					mk = tpl[p].makespan_us;
				else if ((mk = kiln_interleave_makespan(c, t, act, scratch_get(&scr))) < 0)
					goto out;
				double ex = mk - base[ti];
				*slot = (k == 0 ? 0 : (ex > 0 ? ex : 0)) + hbm_copy_us(c, t->set, act, t->n);
			}
			t->exposed_us[k] = *slot;
		}
		/* Keep-all first, the maximal saving last; between them a point
		 * survives when every later survivor costs strictly more. */
		int32_t w = t->n_points;
		if (t->n_points > 2) {
			int32_t last = t->n_points - 1;
			double floor_us = t->exposed_us[last];
			bool *alive = kiln_arena_alloc(a, (size_t)t->n_points);
			if (!alive)
				goto out;
			alive[0] = alive[last] = true;
			for (int32_t k = last - 1; k >= 1; k--) {
				alive[k] = t->exposed_us[k] < floor_us;
				if (alive[k])
					floor_us = t->exposed_us[k];
			}
			/* The frontier is ordered by quantised savings (a sum of
			 * per-unit floors); the exact bytes at the bucket's edge
			 * can run the other way between neighbours (many small
			 * losses to rounding against few). A survivor that saves
			 * no more exact bytes than a cheaper one is dominated;
			 * the maximal-saving point stays, and cheaper points that
			 * save as much as it does leave instead. */
			int32_t prev = 0;
			for (int32_t k = 1; k < last; k++) {
				if (!alive[k])
					continue;
				if (t->bytes[k].saved <= t->bytes[prev].saved)
					alive[k] = false;
				else
					prev = k;
			}
			while (prev > 0 && t->bytes[prev].saved >= t->bytes[last].saved) {
				alive[prev] = false;
				while (--prev > 0 && !alive[prev])
					;
			}
			w = 0;
			for (int32_t k = 0; k < t->n_points; k++) {
				if (!alive[k])
					continue;
				t->point[w] = t->point[k];
				t->bytes[w] = t->bytes[k];
				t->plan[w] = t->plan[k];
				t->exposed_us[w] = t->exposed_us[k];
				w++;
			}
		}
		t->n_points = w;
	}
	c->schedule = sc;
	rc = 0;
out:
	kiln_arena_free(scr.a);
	return rc;
}
