/* passes/budget.c: per stage, the memory a deciding micro-batch may use,
 * the steady-state plan, and the safety bound (docs/cost-model.md,
 * "Budget and safety").
 *
 *   budget = capacity - static - (inflight - 1) * steady
 *
 * where steady is what one in-flight micro-batch holds at load 1 under the
 * cheapest plan with which every in-flight micro-batch fits at load 1 and
 * any one of them can still spike to load.max_factor (with its maximal
 * saving); when no plan allows that, the maximal-saving plan. The safety
 * bound is the largest bucket edge at which the maximal-saving plan (plus
 * the worst layer's transient) still fits in the budget; the EP group's
 * fit rows (kiln_budget_fit_rows) carry it past the last bucket.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "passes/passes.h"

/* The unit sets of stage s are contiguous in c->sets. */
static int32_t stage_sets(const kiln_compilation *c, int32_t s, int32_t *out_first)
{
	int32_t first = -1, n = 0;
	for (int32_t i = 0; i < c->n_sets; i++)
		if (c->sets[i].stage == s) {
			if (first < 0)
				first = i;
			n++;
		}
	*out_first = first < 0 ? 0 : first;
	return n;
}

/* Activations no plan touches: the embedding and output layers'. */
static double fixed_bytes(const kiln_compilation *c, int32_t s)
{
	const kiln_ir_stage *st = &c->graph->stages[s];
	double sum = 0;
	for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
		kiln_layer_kind k = c->graph->layers[l].kind;
		if (k == KILN_LAYER_EMBED || k == KILN_LAYER_HEAD)
			sum += kiln_lin_at(kiln_cost_layer_activation(c->graph, l), 0);
	}
	return sum;
}

/* The point that keeps the fewest bytes resident. */
static int32_t least_resident_point(const kiln_plan_table *t)
{
	int32_t best = 0;
	for (int32_t p = 1; p < t->n_points; p++)
		if (t->bytes[p].resident < t->bytes[best].resident)
			best = p;
	return best;
}

/* Resident bytes of one micro-batch under the points pts, and the transient
 * peak beside them: the layer in backward holds its rebuilt and reloaded
 * units, and the reloads of the next layer to run backward may already be
 * in flight (the copy window of options.c reaches into the previous
 * layer's backward), so the worst transient plus the worst offloaded bytes. */
static double choice_bytes(const kiln_plan_table *const *tables, int32_t n, double fixed,
                           const int32_t *pts, double *out_transient)
{
	double resident = fixed, transient = 0, prefetch = 0;
	for (int32_t k = 0; k < n; k++) {
		const kiln_plan_bytes *b = &tables[k]->bytes[pts[k]];
		resident += (double)tables[k]->set->n_layers * b->resident;
		if (b->transient > transient)
			transient = b->transient;
		if (b->offloaded > prefetch)
			prefetch = b->offloaded;
	}
	*out_transient = transient + prefetch;
	return resident;
}

static double choice_cost(const kiln_plan_table *const *tables, int32_t n, const int32_t *pts)
{
	double cost = 0;
	for (int32_t k = 0; k < n; k++)
		cost += (double)tables[k]->set->n_layers * kiln_plan_table_exposed_us(tables[k], pts[k]);
	return cost;
}

/* Odometer over every combination of points; the tables of one stage are
 * one per layer kind, so n <= 2 and the product stays small. */
int kiln_budget_cheapest_fit(const kiln_plan_table *const *tables, int32_t n, double fixed_bytes,
                             double inflight, double avail_bytes, double reserve_bytes,
                             int32_t *out_points)
{
	double others = inflight > 1 ? inflight - 1 : 0;
	int32_t cur[8] = {0};
	double best = INFINITY;
	if (n > 8)
		return -1;
	for (;;) {
		double transient;
		double resident = choice_bytes(tables, n, fixed_bytes, cur, &transient);
		if (inflight * resident + transient <= avail_bytes &&
		    others * resident + reserve_bytes <= avail_bytes) {
			double cost = choice_cost(tables, n, cur);
			if (cost < best) {
				best = cost;
				memcpy(out_points, cur, sizeof(int32_t) * (size_t)n);
			}
		}
		int32_t k = 0;
		while (k < n && ++cur[k] == tables[k]->n_points)
			cur[k++] = 0;
		if (k == n)
			break;
	}
	if (best < INFINITY)
		return 0;
	for (int32_t k = 0; k < n; k++)
		out_points[k] = least_resident_point(tables[k]);
	return 1;
}

/* The smallest resident + transient of one micro-batch over every
 * combination of table points (the maximal-saving plan of the stage), with
 * the combination in out_points. Transient and prefetch are maxima across
 * layer kinds, so the best combination is not always each kind's own best. */
static double min_stage_bytes(const kiln_plan_table *const *tables, int32_t n, double fixed,
                              int32_t *out_points)
{
	int32_t cur[8] = {0};
	double best = INFINITY;
	for (;;) {
		double transient, resident = choice_bytes(tables, n, fixed, cur, &transient);
		if (resident + transient < best) {
			best = resident + transient;
			memcpy(out_points, cur, sizeof(int32_t) * (size_t)n);
		}
		int32_t k = 0;
		while (k < n && ++cur[k] == tables[k]->n_points)
			cur[k++] = 0;
		if (k == n)
			break;
	}
	return best;
}

double kiln_budget_stage_bytes(const kiln_compilation *c, int32_t stage, int32_t bucket,
                               const int32_t *pts, double *out_transient)
{
	int32_t first, n = stage_sets(c, stage, &first);
	const kiln_plan_table *tabs[8];
	for (int32_t k = 0; k < n && k < 8; k++)
		tabs[k] = kiln_plan_table_of(c, first + k, bucket);
	return choice_bytes(tabs, n < 8 ? n : 8, fixed_bytes(c, stage), pts, out_transient);
}

/* The most bytes (resident + transient, as choice_bytes counts them) one
 * micro-batch of S's stage can hold when each of its layers follows any
 * point of its set's table at bucket b, each point's bytes exact at rows_S
 * rows for S and the same load factor for any other MoE set of the stage
 * (kiln_plan_bytes_at; a dense set has no rows):
 * whatever the runtime picks from those tables, layer by layer, holds no
 * more. Exact, in O(points): with MR_k the largest resident bytes of a
 * point of set k (its keep-everything point, whose transient and offloaded
 * bytes are 0), any choice holds
 *
 *   fixed + sum_k layers_k * MR_k + max(max_k C_k, A_j + B_k)
 *
 * over sets j, k (j = k only where set k has two layers or more), where
 * C_k = max_p(res + transient + offloaded) - MR_k (one layer holds both the
 * worst transient and the worst offload), A_k = max_p(res + transient) -
 * MR_k and B_k = max_p(res + offloaded) - MR_k (two layers hold them): no
 * choice exceeds it (bound each layer by MR_k but the one or two that
 * hold the maxima), and keeping everything in every other layer attains it.
 * Every unit's bytes are a line with a non-negative slope, so the result
 * never falls as rows_S grows. bytes: per set, room for its table's
 * points. */
static double worst_stage_bytes_at(const kiln_compilation *c, const kiln_unit_set *S, int32_t b,
                                   double rows_S, kiln_plan_bytes *const *bytes)
{
	int32_t s = S->stage, first, n = stage_sets(c, s, &first);
	double factor = rows_S / c->graph->layers[S->layer].n_balanced;
	double sum = c->budgets[s].fixed_bytes, best = 0;
	double with_tr[8], with_off[8]; /* A_k, B_k */
	for (int32_t k = 0; k < n; k++) {
		const kiln_unit_set *set = &c->sets[first + k];
		const kiln_plan_table *t = kiln_plan_table_of(c, first + k, b);
		double rows = set == S ? rows_S
		              : set->kind == KILN_LAYER_MOE
		                  ? factor * c->graph->layers[set->layer].n_balanced
		                  : 0;
		double mr = 0, rt = 0, ro = 0, rto = 0;
		for (int32_t p = 0; p < t->n_points; p++) {
			kiln_plan_bytes *x = &bytes[k][p];
			kiln_plan_bytes_at(set, c->pool->actions[t->plan[p]], rows, x);
			mr = x->resident > mr ? x->resident : mr;
			rt = x->resident + x->transient > rt ? x->resident + x->transient : rt;
			ro = x->resident + x->offloaded > ro ? x->resident + x->offloaded : ro;
			double all = x->resident + x->transient + x->offloaded;
			rto = all > rto ? all : rto;
		}
		sum += (double)set->n_layers * mr;
		with_tr[k] = rt - mr;
		with_off[k] = ro - mr;
		best = rto - mr > best ? rto - mr : best;
	}
	for (int32_t j = 0; j < n; j++)
		for (int32_t k = 0; k < n; k++)
			if ((j != k || c->sets[first + k].n_layers >= 2) &&
			    with_tr[j] + with_off[k] > best)
				best = with_tr[j] + with_off[k];
	return sum + best;
}

int kiln_budget_fit_rows(const kiln_compilation *c, int32_t set, uint64_t *out_rows)
{
	const kiln_unit_set *S = &c->sets[set];
	const kiln_stage_budget *bu = &c->budgets[S->stage];
	double balanced = c->graph->layers[S->layer].n_balanced;
	int32_t last = c->n_buckets - 1;
	*out_rows = 0;
	if (S->kind != KILN_LAYER_MOE || !(balanced > 0) || last < 0)
		return 0;
	/* Within the tables: the rows of the last bucket within the safety
	 * factor (the blob's max_rows, codegen/blob.c). */
	for (int32_t b = 0; b <= last; b++)
		if (c->buckets[b] <= bu->safety_factor * (1 + 1e-12))
			*out_rows = (uint64_t)floor(c->buckets[b] * balanced + 1e-9);
	if (bu->safety_factor < c->buckets[last] * (1 - 1e-12))
		return 0;
	/* Past the last bucket the runtime picks from the last bucket's
	 * tables by their figures, which understate the bytes
	 * (KILN_PLAN_LOAD_BEYOND): the largest rows at which every choice from
	 * those tables, at its exact bytes, still fits the budget. */
	int32_t first, n = stage_sets(c, S->stage, &first);
	if (n > 8)
		return -1;
	kiln_arena *scratch = kiln_arena_new();
	if (!scratch)
		return -1;
	kiln_plan_bytes *bytes[8];
	for (int32_t k = 0; k < n; k++) {
		int32_t np = kiln_plan_table_of(c, first + k, last)->n_points;
		bytes[k] =
		    kiln_arena_alloc(scratch, sizeof(kiln_plan_bytes) * (size_t)(np ? np : 1));
		if (!bytes[k]) {
			kiln_arena_free(scratch);
			return -1;
		}
	}
	/* Whether rows fit is monotone in the rows (worst_stage_bytes_at never
	 * falls as they grow): double them while they fit, then bisect. lo
	 * fits (or is what the tables promise), hi does not. */
	const uint64_t cap = UINT32_MAX; /* no count of a query exceeds it */
	uint64_t lo = *out_rows, hi = cap + 1;
	while (lo < cap) {
		uint64_t r = lo == 0 ? 1 : lo > cap / 2 ? cap : 2 * lo;
		if (worst_stage_bytes_at(c, S, last, (double)r, bytes) > bu->budget_bytes) {
			hi = r;
			break;
		}
		lo = r;
	}
	while (hi > lo + 1) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (worst_stage_bytes_at(c, S, last, (double)mid, bytes) <= bu->budget_bytes)
			lo = mid;
		else
			hi = mid;
	}
	kiln_arena_free(scratch);
	*out_rows = lo;
	return 0;
}

/* The views show the steady state: interleave ended the templates with one
 * keep-everything template per unit set at load 1 (templates[n - n_sets +
 * k] for set k), which the stage timelines use; now that the steady plans
 * are known, each becomes the template of its set's steady plan. */
static int steady_timelines(kiln_compilation *c, int32_t b1)
{
	kiln_plan_schedule *sc = c->schedule;
	if (!sc || sc->n_templates < c->n_sets)
		return 0;
	int32_t base = sc->n_templates - c->n_sets;
	for (int32_t s = 0; s < c->graph->n_stages; s++) {
		int32_t first, n = stage_sets(c, s, &first);
		for (int32_t k = 0; k < n; k++) {
			const kiln_plan_table *t = kiln_plan_table_of(c, first + k, b1);
			int32_t plan = t->plan[c->budgets[s].steady_point[k]];
			kiln_template *tpl = &sc->templates[base + first + k];
			double base_us = tpl->base_us;
			if (plan < 0 ||
			    kiln_interleave_template(c, t, plan, c->pool->actions[plan], c->arena, tpl) != 0)
				return -1;
			tpl->base_us = base_us;
		}
	}
	return 0;
}

int kiln_pass_budget(kiln_compilation *c)
{
	const kiln_ir_graph *g = c->graph;
	const kiln_model *m = c->model;
	c->budgets = kiln_arena_alloc(c->arena, sizeof(kiln_stage_budget) * (size_t)g->n_stages);
	if (!c->budgets)
		return -1;
	int32_t b1 = kiln_plan_bucket_of(c->buckets, c->n_buckets, 1.0);
	for (int32_t s = 0; s < g->n_stages; s++) {
		kiln_stage_budget *bu = &c->budgets[s];
		int32_t first, n = stage_sets(c, s, &first);
		if (n > 8)
			return -1;
		kiln_cost_static st;
		kiln_cost_stage_static(g, s, &st);
		bu->stage = s;
		bu->capacity_bytes = (m->hw.memory_gib - m->hw.reserved_gib) * 1073741824.0;
		bu->static_bytes = (double)st.total;
		bu->inflight = kiln_cost_stage_inflight(g, s);
		bu->fixed_bytes = fixed_bytes(c, s);
		bu->steady_point = kiln_arena_alloc(c->arena, sizeof(int32_t) * (size_t)(n ? n : 1));
		if (!bu->steady_point)
			return -1;

		const kiln_plan_table *tabs[8];
		int32_t pts[8];
		double avail = bu->capacity_bytes - bu->static_bytes, transient;
		/* What a spike to max_factor needs at the least: the maximal-saving
		 * plan and the worst layer's transient. */
		for (int32_t k = 0; k < n; k++)
			tabs[k] = kiln_plan_table_of(c, first + k, c->n_buckets - 1);
		double spike = min_stage_bytes(tabs, n, bu->fixed_bytes, pts);
		for (int32_t k = 0; k < n; k++)
			tabs[k] = kiln_plan_table_of(c, first + k, b1);
		/* The cheapest steady plan with which every in-flight micro-batch
		 * fits at load 1 and any one of them can still spike to max_factor;
		 * failing that, the maximal-saving plan, which gives the largest
		 * load factor this stage can take at all. */
		if (kiln_budget_cheapest_fit(tabs, n, bu->fixed_bytes, bu->inflight, avail, spike,
		                             bu->steady_point) == 0) {
			bu->steady_fits = true;
		} else {
			/* The others hold their resident bytes only: the least
			 * resident plan leaves the deciding micro-batch the most. */
			for (int32_t k = 0; k < n; k++)
				bu->steady_point[k] = least_resident_point(tabs[k]);
			double r1 = choice_bytes(tabs, n, bu->fixed_bytes, bu->steady_point, &transient);
			bu->steady_fits = bu->inflight * r1 + transient <= avail;
		}
		bu->steady_bytes = choice_bytes(tabs, n, bu->fixed_bytes, bu->steady_point, &transient);
		bu->steady_exposed_us = choice_cost(tabs, n, bu->steady_point);
		double others = bu->inflight > 1 ? bu->inflight - 1 : 0;
		bu->budget_bytes = avail - others * bu->steady_bytes;

		/* The safety bound: walk the buckets up while the maximal-saving
		 * plan fits; the first that does not ends it. */
		bu->safety_factor = 0;
		if (!bu->steady_fits)
			continue;
		for (int32_t b = 0; b < c->n_buckets; b++) {
			for (int32_t k = 0; k < n; k++)
				tabs[k] = kiln_plan_table_of(c, first + k, b);
			if (min_stage_bytes(tabs, n, bu->fixed_bytes, pts) > bu->budget_bytes)
				break;
			bu->safety_factor = c->buckets[b];
		}
	}
	return steady_timelines(c, b1);
}
