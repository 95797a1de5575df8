/* sim/price.c: what a plan of kiln's tables costs and holds, as every
 * simulated policy and the oracle price and size it (docs/simulator.md,
 * "What a static plan costs"): its load bucket, its scheduled exposed time
 * there and its bytes as lines in the rows. Below sim/policy.c and
 * sim/oracle.c, which both read it (docs/passes.md, "Layering").
 */
#include <string.h>

#include "passes/passes.h"
#include "sim/sim.h"

int32_t kiln_sim_policy_bucket(const struct kiln_compilation *c, int32_t set, double n, double *r)
{
	const kiln_unit_set *S = &c->sets[set];
	double bal = S->kind == KILN_LAYER_MOE ? c->graph->layers[S->layer].n_balanced : 0;
	*r = bal > 0 ? n / bal : 0;
	int32_t b = kiln_plan_bucket_of(c->buckets, c->n_buckets, *r);
	return b >= c->n_buckets ? c->n_buckets - 1 : b;
}

void kiln_sim_plan_form_of(const struct kiln_compilation *c, int32_t set, const uint8_t *actions,
                           kiln_sim_plan_form *out)
{
	const kiln_unit_set *S = &c->sets[set];
	uint64_t res_base = 0, res_per_n = 0, tr_base = 0, tr_per_n = 0, ws_base = 0, ws_per_n = 0;
	for (int32_t u = 0; u < S->n_units; u++) {
		const kiln_unit *un = &S->units[u];
		if (actions[u] == KILN_ACT_KEEP) {
			res_base += un->bytes.base;
			res_per_n += un->bytes.per_n;
		} else if (actions[u] == KILN_ACT_RECOMPUTE || actions[u] == KILN_ACT_OFFLOAD) {
			int ws = actions[u] == KILN_ACT_RECOMPUTE;
			tr_base += un->bytes.base + (ws ? un->workspace_bytes.base : 0);
			tr_per_n += un->bytes.per_n + (ws ? un->workspace_bytes.per_n : 0);
			ws_base += ws ? un->workspace_bytes.base : 0;
			ws_per_n += ws ? un->workspace_bytes.per_n : 0;
		}
	}
	*out = (kiln_sim_plan_form){.set = set,
	                            .res_base = (double)res_base,
	                            .res_per_n = (double)res_per_n,
	                            .tr_base = (double)tr_base,
	                            .tr_per_n = (double)tr_per_n,
	                            .ws_base = (double)ws_base,
	                            .ws_per_n = (double)ws_per_n};
}

/* Forward time of the ops recomputing a plan re-runs (each op once, even
 * when several units share it), at load n. */
static double recompute_us(const kiln_compilation *c, const kiln_unit_set *set,
                           const uint8_t *actions, double n)
{
	const kiln_ir_graph *g = c->graph;
	const kiln_ir_layer *L = &g->layers[set->layer];
	int32_t n_ops = L->op_end - L->op_begin;
	uint8_t seen[4096];
	if (n_ops > (int32_t)sizeof seen)
		return 0;
	memset(seen, 0, (size_t)n_ops);
	double us = 0, nl = set->kind == KILN_LAYER_MOE ? n : 0;
	for (int32_t u = 0; u < set->n_units; u++) {
		if (actions[u] != KILN_ACT_RECOMPUTE)
			continue;
		for (int32_t k = 0; k < set->units[u].n_closure; k++) {
			int32_t op = set->units[u].closure[k];
			if (op < L->op_begin || op >= L->op_end || seen[op - L->op_begin])
				continue;
			seen[op - L->op_begin] = 1;
			us += kiln_cost_op_time_us(g, &g->ops[op], nl);
		}
	}
	return us;
}

int kiln_sim_plan_cost(const struct kiln_compilation *c, int32_t set, int32_t bucket,
                       const uint8_t *actions, double *out_exposed_us, double *out_serial_us,
                       double *out_recompute_us)
{
	kiln_arena *scratch = kiln_arena_new();
	if (!scratch)
		return -1;
	const kiln_plan_table *t = kiln_plan_table_of(c, set, bucket);
	double exposed_us, serial_us;
	int rc = kiln_interleave_exposed(c, t, actions, scratch, &exposed_us, &serial_us);
	double rec_us = recompute_us(c, &c->sets[set], actions, t->n);
	kiln_arena_free(scratch);
	if (rc != 0)
		return -1;
	*out_exposed_us = exposed_us;
	*out_serial_us = serial_us;
	*out_recompute_us = rec_us;
	return 0;
}
