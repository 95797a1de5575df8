/* passes/adapipe.c: AdaPipe's joint choice of the pipeline partition and
 * each stage's recomputation (docs/cost-model.md, "AdaPipe's partition").
 *
 * AdaPipe: Z. Sun, H. Cao, Y. Wang, G. Feng, S. Chen, H. Wang, W. Chen,
 * "AdaPipe: Optimizing Pipeline Parallelism with Adaptive Recomputation
 * and Partitioning", ASPLOS '24 vol. 3, pp. 86-100,
 * doi:10.1145/3620666.3651359. No code of it is public in the search index
 * (code, docs, issues and pages searched for "AdaPipe" and its title on
 * 2026-12-02), nor is the paper's body: what was checked is its abstract
 * (ACM DL, OpenReview T4q1IUGWgq), which says it searches the recomputation
 * and the stage partitioning together, that its adaptive recomputation
 * uses the memory of each stage to cut that stage's compute, that its
 * partitioning balances compute across stages, and that it was evaluated
 * on GPT-3 175B and Llama 2 70B (dense models). Section numbers, its
 * equations, its exact objective and its recompute granularity could not
 * be read, so what follows is kiln's model of that description
 * (docs/cost-model.md lists which parts are kiln's choices):
 *
 * (1) per pipeline stage, the cheapest recomputation with which the stage
 * fits its memory with the micro-batches 1F1B keeps in flight there, and
 * (2) the contiguous layer ranges of the stages by dynamic programming
 * over stage boundaries, each range costed by its best recomputation, so
 * that the slowest stage, which sets the 1F1B steady state, is as fast as
 * possible.
 *
 * Here a stage holding d dense and e MoE transformer layers (dense layers
 * are the model's first ones, so a range's kinds follow from its ends) is
 * costed exactly as the adapipe baseline costs a compiled stage
 * (passes/baselines.c): the cheapest recompute-only plan table point per
 * layer kind at KILN_BASELINE_DESIGN_LOAD with which every in-flight
 * micro-batch fits (kiln_budget_cheapest_fit), on top of the stage's
 * static bytes (its layers' weights, gradients and optimizer state, the
 * embedding on the first stage and the head on the last) and its fixed
 * activations. Its time is its layers' forward and backward at the design
 * load plus the plan's exposed recompute. Pipeline sends are left out:
 * every partition has one per stage boundary. The table points lie on the
 * frontier of resident bytes saved against time, which does not see the
 * transient bytes of the fit rule, so a plan off that frontier (less
 * saved, far less transient) can fit where the frontier's equally fast
 * points do not: the stage cost is then above the exact cheapest fit
 * (tests/test_adapipe.c, joint_search_equals_brute_force; docs/cost-model.md
 * gives the gap).
 *
 * The partition: the least possible slowest stage (a bottleneck dynamic
 * program over stage boundaries), then among the partitions reaching it
 * the least sum of stage times (the warm-up and cool-down of 1F1B), the
 * earliest boundary on ties. Both steps are exact: O(p * L * (L - p + 1))
 * lookups into a table of stage costs keyed by (stage, dense, MoE layers).
 */
#include <math.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "passes/passes.h"

/* Work bounds: DP steps, and distinct stage costs (each a search over
 * the product of two table sizes, about 4,400 combinations). The shipped
 * models take 45,000 steps and 3,800 costs. */
#define MAX_STEPS 2e8
#define MAX_COSTS (1 << 17)

struct kiln_adapipe {
	const kiln_compilation *c;
	int32_t p;
	int64_t L, D, E;        /* transformer layers, of them dense (first D), MoE */
	bool have[2];           /* a unit set of the kind exists (0 dense, 1 MoE) */
	kiln_unit_set set[2];   /* representative sets (copies) */
	kiln_plan_table tab[2]; /* their recompute-only tables at the design load */
	double layer_us[2];     /* one layer's forward + backward at the design load */
	uint64_t dense_params[2], expert_params[2]; /* one layer's, on one device */
	double embed_us, head_us;
	uint64_t embed_params[2], head_params[2]; /* [0] dense, [1] expert */
	double embed_bytes, head_bytes;           /* fixed activations */
	double capacity;
	double *memo; /* per (stage, d, e): the stage time, NAN until costed; NULL past MAX_COSTS */
};

/* Forward + backward time of graph layer l at n rows, pipeline sends left
 * out, and its weight elements on one device. */
static void layer_costs(const kiln_ir_graph *g, int32_t l, double n, double *out_us,
                        uint64_t *out_params)
{
	const kiln_ir_layer *L = &g->layers[l];
	double us = 0;
	out_params[0] = out_params[1] = 0;
	for (int32_t o = L->op_begin; o < L->op_end; o++) {
		const kiln_ir_op *op = &g->ops[o];
		if (op->kind != KILN_OP_PP_SEND)
			us += kiln_cost_op_time_us(g, op, n);
		if (!op->backward)
			out_params[op->expert_params ? 1 : 0] += op->params_local;
	}
	*out_us = us;
}

int kiln_adapipe_new(const kiln_compilation *c, kiln_arena *a, kiln_adapipe **out)
{
	*out = NULL;
	const kiln_ir_graph *g = c->graph;
	const kiln_model *m = c->model;
	kiln_adapipe *x = kiln_arena_alloc(a, sizeof *x);
	if (!x)
		return -1;
	memset(x, 0, sizeof *x);
	x->c = c;
	x->p = g->n_stages;
	x->L = m->layers;
	x->D = m->moe ? (m->dense_layers < m->layers ? m->dense_layers : m->layers) : m->layers;
	x->E = x->L - x->D;
	x->capacity = (m->hw.memory_gib - m->hw.reserved_gib) * 1073741824.0;
	kiln_option_flags flags = {.offload = false, .collective_recompute = true};
	for (int k = 0; k < 2; k++) {
		kiln_layer_kind kind = k ? KILN_LAYER_MOE : KILN_LAYER_DENSE;
		for (int32_t i = 0; i < c->n_sets && !x->have[k]; i++) {
			if (c->sets[i].kind != kind)
				continue;
			x->have[k] = true;
			x->set[k] = c->sets[i];
			const kiln_ir_layer *L = &g->layers[x->set[k].layer];
			double n = k ? KILN_BASELINE_DESIGN_LOAD * L->n_balanced : 0;
			uint64_t pr[2];
			layer_costs(g, x->set[k].layer, n, &x->layer_us[k], pr);
			x->dense_params[k] = pr[0];
			x->expert_params[k] = pr[1];
			/* As baselines.c builds the adapipe tables. */
			if (kiln_plan_table_static(g, &x->set[k], KILN_BASELINE_DESIGN_LOAD, n,
			                           &flags, a, &x->tab[k]) != 0)
				return -1;
		}
	}
	if ((x->D > 0 && !x->have[0]) || (x->E > 0 && !x->have[1]))
		return -1; /* every transformer layer is in a unit set */
	for (int32_t l = 0; l < g->n_layers; l++) {
		kiln_layer_kind kind = g->layers[l].kind;
		if (kind != KILN_LAYER_EMBED && kind != KILN_LAYER_HEAD)
			continue;
		double us, bytes = kiln_lin_at(kiln_cost_layer_activation(g, l), 0);
		uint64_t pr[2];
		layer_costs(g, l, 0, &us, pr);
		if (kind == KILN_LAYER_EMBED) {
			x->embed_us = us, x->embed_bytes = bytes;
			memcpy(x->embed_params, pr, sizeof pr);
		} else {
			x->head_us = us, x->head_bytes = bytes;
			memcpy(x->head_params, pr, sizeof pr);
		}
	}
	double n_costs = (double)x->p * (double)(x->D + 1) * (double)(x->E + 1);
	if (n_costs <= MAX_COSTS) {
		x->memo = kiln_arena_alloc(a, sizeof(double) * (size_t)n_costs);
		if (!x->memo)
			return -1;
		for (size_t i = 0; i < (size_t)n_costs; i++)
			x->memo[i] = NAN;
	}
	*out = x;
	return 0;
}

/* The cost of stage s holding d dense and e MoE layers. */
static double stage_cost(const kiln_adapipe *x, int32_t s, int64_t d, int64_t e)
{
	const kiln_compilation *c = x->c;
	bool first = s == 0, last = s == x->p - 1;
	int64_t count[2] = {d, e};
	uint64_t dense = (first ? x->embed_params[0] : 0) + (last ? x->head_params[0] : 0);
	uint64_t expert = (first ? x->embed_params[1] : 0) + (last ? x->head_params[1] : 0);
	double us = (first ? x->embed_us : 0) + (last ? x->head_us : 0);
	kiln_unit_set sets[2];
	kiln_plan_table tabs[2];
	const kiln_plan_table *tp[2];
	int32_t n = 0, pts[2];
	for (int k = 0; k < 2; k++) {
		if (count[k] <= 0)
			continue;
		dense += (uint64_t)count[k] * x->dense_params[k];
		expert += (uint64_t)count[k] * x->expert_params[k];
		us += (double)count[k] * x->layer_us[k];
		sets[n] = x->set[k];
		sets[n].stage = s;
		sets[n].n_layers = (int32_t)count[k];
		tabs[n] = x->tab[k];
		tabs[n].set = &sets[n];
		tp[n] = &tabs[n];
		n++;
	}
	kiln_cost_static st;
	kiln_cost_static_of(c->model, dense, expert, &st);
	double fixed = (first ? x->embed_bytes : 0) + (last ? x->head_bytes : 0);
	double inflight = kiln_cost_stage_inflight(c->graph, s);
	if (kiln_budget_cheapest_fit(tp, n, fixed, inflight, x->capacity - (double)st.total, 0,
	                             pts) != 0)
		return INFINITY;
	for (int32_t k = 0; k < n; k++)
		us += (double)tp[k]->set->n_layers * kiln_plan_table_exposed_us(tp[k], pts[k]);
	return us;
}

double kiln_adapipe_stage_us(kiln_adapipe *x, int32_t s, int64_t first, int64_t n)
{
	if (s < 0 || s >= x->p || first < 0 || n < 1 || first > x->L - n)
		return INFINITY;
	int64_t b = first + n;
	int64_t d = (b < x->D ? b : x->D) - (first < x->D ? first : x->D), e = n - d;
	if (!x->memo)
		return stage_cost(x, s, d, e);
	double *slot =
	    &x->memo[((size_t)s * (size_t)(x->D + 1) + (size_t)d) * (size_t)(x->E + 1) + (size_t)e];
	if (isnan(*slot))
		*slot = stage_cost(x, s, d, e);
	return *slot;
}

/* out for the split `layers` (per stage), with kept as its reason. */
static void describe(kiln_adapipe *x, const int64_t *layers, const char *kept,
                     kiln_adapipe_split *out)
{
	out->max_us = out->sum_us = 0;
	out->fits = true;
	out->kept = kept;
	for (int64_t s = 0, first = 0; s < x->p; first += layers[s], s++) {
		out->layers[s] = layers[s];
		out->stage_us[s] = kiln_adapipe_stage_us(x, (int32_t)s, first, layers[s]);
		out->fits &= isfinite(out->stage_us[s]);
		out->max_us = out->stage_us[s] > out->max_us ? out->stage_us[s] : out->max_us;
		out->sum_us += out->stage_us[s];
	}
}

int kiln_adapipe_partition(kiln_adapipe *x, kiln_arena *a, kiln_adapipe_split *out)
{
	const kiln_model *m = x->c->model;
	int32_t p = x->p;
	int64_t L = x->L;
	memset(out, 0, sizeof *out);
	out->n_stages = p;
	out->layers = kiln_arena_alloc(a, sizeof(int64_t) * (size_t)p);
	out->stage_us = kiln_arena_alloc(a, sizeof(double) * (size_t)p);
	if (!out->layers || !out->stage_us)
		return -1;
	/* The model's own split: per stage, the sum over its chunks. */
	int64_t *own = kiln_arena_alloc(a, sizeof(int64_t) * (size_t)p);
	if (!own)
		return -1;
	memset(own, 0, sizeof(int64_t) * (size_t)p);
	for (size_t ch = 0; ch < m->n_stage_layers; ch++)
		own[ch % (size_t)p] += m->stage_layers[ch];
	if (m->schedule == KILN_SCHED_INTERLEAVED && m->vpp > 1) {
		describe(x, own,
		         "interleaved schedule: the search places one layer range per stage", out);
		return 0;
	}
	if ((double)p * (double)L * (double)(L - p + 1) > MAX_STEPS || !x->memo) {
		describe(x, own, "past the partition search's work bound", out);
		return 0;
	}
	/* best[s * (L + 1) + b]: stages 0..s over layers [0, b). */
	size_t cells = (size_t)p * (size_t)(L + 1);
	double *top = kiln_arena_alloc(a, sizeof(double) * cells);
	double *sum = kiln_arena_alloc(a, sizeof(double) * cells);
	int64_t *from = kiln_arena_alloc(a, sizeof(int64_t) * cells);
	if (!top || !sum || !from)
		return -1;
	for (size_t i = 0; i < cells; i++)
		top[i] = sum[i] = INFINITY, from[i] = -1;
#define AT(s, b) ((size_t)(s) * (size_t)(L + 1) + (size_t)(b))
	/* Stage s ends at b in [s + 1, L - (p - 1 - s)]: every stage holds a layer. */
	for (int64_t b = 1; b <= L - (p - 1); b++)
		top[AT(0, b)] = kiln_adapipe_stage_us(x, 0, 0, b);
	for (int32_t s = 1; s < p; s++)
		for (int64_t b = s + 1; b <= L - (p - 1 - s); b++) {
			double best = INFINITY;
			for (int64_t f = s; f < b; f++) {
				double before = top[AT(s - 1, f)];
				if (!(before < best))
					continue;
				double here = kiln_adapipe_stage_us(x, s, f, b - f);
				double v = here > before ? here : before;
				best = v < best ? v : best;
			}
			top[AT(s, b)] = best;
		}
	double bound = top[AT(p - 1, L)];
	if (!isfinite(bound)) {
		describe(x, own, "no partition fits every stage at the design load", out);
		return 0;
	}
	for (int64_t b = 1; b <= L - (p - 1); b++) {
		double here = kiln_adapipe_stage_us(x, 0, 0, b);
		if (here <= bound)
			sum[AT(0, b)] = here;
	}
	for (int32_t s = 1; s < p; s++)
		for (int64_t b = s + 1; b <= L - (p - 1 - s); b++)
			for (int64_t f = s; f < b; f++) {
				double before = sum[AT(s - 1, f)];
				if (!isfinite(before))
					continue;
				double here = kiln_adapipe_stage_us(x, s, f, b - f);
				if (!(here <= bound) || !(before + here < sum[AT(s, b)]))
					continue;
				sum[AT(s, b)] = before + here;
				from[AT(s, b)] = f;
			}
	int64_t *layers = kiln_arena_alloc(a, sizeof(int64_t) * (size_t)p);
	if (!layers)
		return -1;
	for (int64_t s = p - 1, b = L; s >= 0; s--) {
		int64_t f = s > 0 ? from[AT(s, b)] : 0;
		if (f < 0 || f >= b)
			return -1; /* the bound's own split always reaches the end */
		layers[s] = b - f;
		b = f;
	}
#undef AT
	describe(x, layers, NULL, out);
	return 0;
}

int kiln_adapipe_compile(const kiln_compilation *c, kiln_arena *a3, kiln_model *m3,
                         kiln_adapipe_split *split, kiln_compilation *c3, bool *c3_used, FILE *err)
{
	const kiln_model *m = c->model;
	kiln_adapipe *x;
	*c3_used = false;
	if (kiln_adapipe_new(c, a3, &x) != 0 || kiln_adapipe_partition(x, a3, split) != 0)
		return -1;
	if (split->kept)
		return 0;
	bool same = m->n_stage_layers == (size_t)split->n_stages;
	for (int32_t s = 0; same && s < split->n_stages; s++)
		same = m->stage_layers[s] == split->layers[s];
	if (same)
		return 0;
	/* vpp is 1 here (an interleaved schedule keeps the split), so one
	 * entry per stage. */
	*m3 = *m;
	m3->stage_layers = split->layers;
	m3->n_stage_layers = (size_t)split->n_stages;
	*c3 = (kiln_compilation){.model = m3, .arena = a3, .progress = c->progress};
	int prc = kiln_pipeline_compile(c3, NULL, NULL, NULL, err);
	if (prc != 0)
		return prc == -1 ? -2 : prc;
	*c3_used = true;
	return 0;
}
