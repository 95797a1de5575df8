/* costmodel/plan_eval.c: totals and shape checks of planning instances.
 *
 * Shared by the passes that build instances (passes/options.c) and the
 * solvers over them (knapsack.c, milp.c). Equations: docs/cost-model.md,
 * "Planning" and "Units and options".
 */
#include <math.h>

#include "costmodel/costmodel.h"

double kiln_cost_copy_exposed_us(const kiln_plan_instance *in, uint32_t offload_q)
{
	if (offload_q <= in->free_offload_q)
		return 0.0;
	return (double)(offload_q - in->free_offload_q) * in->offload_us_per_q;
}

/* out->choice is not touched: the caller owns it (a solver points it at its
 * own arena copy). The sums cannot overflow for an instance that passes
 * kiln_cost_instance_check (at most KILN_PLAN_MAX_QUANTA quanta in all). */
void kiln_cost_plan_eval(const kiln_plan_instance *in, const int32_t *choice, kiln_plan_point *out)
{
	uint32_t saved_q = 0, offload_q = 0;
	double recompute_us = 0.0;
	for (int32_t i = 0; i < in->n_groups; i++) {
		const kiln_plan_choice *c = &in->groups[i].choices[choice[i]];
		saved_q += c->saved_q;
		offload_q += c->offload_q;
		recompute_us += c->recompute_us;
	}
	out->saved_q = saved_q;
	out->offload_q = offload_q;
	out->recompute_us = recompute_us;
	out->exposed_us = recompute_us + kiln_cost_copy_exposed_us(in, offload_q);
}

static int check_group(const kiln_plan_group *gr, int32_t n_units, uint8_t *seen,
                       uint64_t *max_saved, uint64_t *max_offload)
{
	if (gr->n_units < 1 || gr->n_units > KILN_PLAN_MAX_GROUP)
		return -1;
	for (int32_t k = 0; k < gr->n_units; k++) {
		int32_t u = gr->units[k];
		if (u < 0 || u >= n_units || seen[u])
			return -1;
		seen[u] = 1;
	}
	if (gr->n_choices < 1 || !gr->choices)
		return -1;
	uint32_t ms = 0, mo = 0;
	for (int32_t c = 0; c < gr->n_choices; c++) {
		const kiln_plan_choice *ch = &gr->choices[c];
		for (int32_t k = 0; k < KILN_PLAN_MAX_GROUP; k++) {
			if (ch->actions[k] >= KILN_ACT_COUNT)
				return -1;
			if (k >= gr->n_units && ch->actions[k] != KILN_ACT_KEEP)
				return -1;
		}
		if (!isfinite(ch->recompute_us) || ch->recompute_us < 0.0)
			return -1;
		if (ch->saved_q > KILN_PLAN_MAX_QUANTA || ch->offload_q > KILN_PLAN_MAX_QUANTA)
			return -1;
		if (ch->saved_q > ms)
			ms = ch->saved_q;
		if (ch->offload_q > mo)
			mo = ch->offload_q;
	}
	const kiln_plan_choice *c0 = &gr->choices[0];
	for (int32_t k = 0; k < gr->n_units; k++)
		if (c0->actions[k] != KILN_ACT_KEEP)
			return -1;
	if (c0->saved_q != 0 || c0->offload_q != 0 || c0->recompute_us != 0.0)
		return -1;
	*max_saved += ms;
	*max_offload += mo;
	return 0;
}

int kiln_cost_instance_check(const kiln_plan_instance *in)
{
	if (!in || in->n_units < 0 || in->n_units > KILN_PLAN_MAX_UNITS || in->n_groups < 0 ||
	    in->n_groups > in->n_units)
		return -1;
	if (in->n_groups > 0 && !in->groups)
		return -1;
	if (in->quantum_bytes < 1 || in->free_offload_q > KILN_PLAN_MAX_QUANTA)
		return -1;
	if (!isfinite(in->offload_us_per_q) || in->offload_us_per_q < 0.0)
		return -1;
	uint8_t seen[KILN_PLAN_MAX_UNITS] = {0};
	uint64_t max_saved = 0, max_offload = 0;
	for (int32_t i = 0; i < in->n_groups; i++)
		if (check_group(&in->groups[i], in->n_units, seen, &max_saved, &max_offload) != 0)
			return -1;
	for (int32_t u = 0; u < in->n_units; u++)
		if (!seen[u])
			return -1;
	if (max_saved > KILN_PLAN_MAX_QUANTA || max_offload > KILN_PLAN_MAX_QUANTA)
		return -1;
	return 0;
}
