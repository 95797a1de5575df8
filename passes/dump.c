/* passes/dump.c: --dump-after: the compilation's state in readable text. */
#include "kiln/runtime.h"
#include "passes/passes.h"

/* Compiler actions (costmodel.h) are printed by the runtime's name table. */
_Static_assert(KILN_ACT_KEEP == (int)KILN_RT_KEEP && KILN_ACT_RECOMPUTE == (int)KILN_RT_RECOMPUTE &&
                   KILN_ACT_OFFLOAD == (int)KILN_RT_OFFLOAD && KILN_ACT_COUNT == 3,
               "kiln_action and kiln_rt_action must agree");

static void dump_units(const kiln_compilation *c, FILE *out)
{
	for (int32_t i = 0; i < c->n_sets; i++) {
		const kiln_unit_set *set = &c->sets[i];
		fprintf(out, "units stage %d %s (%d layers, like layer %d)\n", set->stage,
		        kiln_ir_layer_kind_name(set->kind), set->n_layers, set->layer);
		for (int32_t u = 0; u < set->n_units; u++) {
			const kiln_unit *un = &set->units[u];
			fprintf(out, "  unit %d %s bytes %llu + %llu*N producer %s", u, un->name,
			        (unsigned long long)un->bytes.base, (unsigned long long)un->bytes.per_n,
			        c->graph->ops[un->producer].name);
			fprintf(out, " sources (");
			for (int32_t k = 0; k < un->n_sources; k++)
				fprintf(out, "%s%s", k ? " " : "", set->units[un->sources[k]].name);
			fprintf(out, ")%s%s%s\n", (un->flags & KILN_UNIT_LAYER_INPUT) ? " layer-input" : "",
			        (un->flags & KILN_UNIT_COLLECTIVE) ? " collective" : "",
			        (un->flags & KILN_UNIT_RNG) ? " rng" : "");
		}
	}
}

static void dump_tables(const kiln_compilation *c, FILE *out)
{
	for (int32_t i = 0; i < c->n_sets; i++) {
		const kiln_unit_set *set = &c->sets[i];
		for (int32_t b = 0; b < c->n_buckets; b++) {
			const kiln_plan_table *t = kiln_plan_table_of(c, i, b);
			const kiln_frontier *f = t->frontier;
			fprintf(out,
			        "plan stage %d %s load %.3g (N %.0f): frontier %d, %d points, %d in the "
			        "table\n",
			        set->stage, kiln_ir_layer_kind_name(set->kind), t->load_factor, t->n,
			        t->frontier_id, f->n_points, t->n_points);
			for (int32_t p = 0; p < t->n_points; p++) {
				fprintf(out, "  saved %.0f exposed %.3f us plan %d:", t->bytes[p].saved,
				        kiln_plan_table_exposed_us(t, p), t->plan[p]);
				const uint8_t *act = c->pool->actions[t->plan[p]];
				for (int32_t u = 0; u < set->n_units; u++)
					if (act[u] != KILN_ACT_KEEP)
						fprintf(out, " %s=%s", set->units[u].name,
						        kiln_rt_action_name(act[u]));
				fputc('\n', out);
			}
		}
	}
}

void kiln_pipeline_dump(const kiln_compilation *c, FILE *out)
{
	if (c->graph)
		kiln_ir_graph_print(c->graph, out);
	if (c->sets)
		dump_units(c, out);
	if (c->tables)
		dump_tables(c, out);
	if (c->budgets)
		for (int32_t s = 0; s < c->graph->n_stages; s++) {
			const kiln_stage_budget *b = &c->budgets[s];
			fprintf(out,
			        "budget stage %d capacity %.0f static %.0f inflight %.3g steady %.0f "
			        "budget %.0f safety %.3g%s\n",
			        s, b->capacity_bytes, b->static_bytes, b->inflight, b->steady_bytes,
			        b->budget_bytes, b->safety_factor, b->steady_fits ? "" : " (steady state does not fit)");
		}
	if (c->baselines)
		for (int k = 0; k < KILN_BASELINE_COUNT; k++) {
			fprintf(out, "baseline %s:", c->baselines[k].name);
			for (int32_t i = 0; i < c->n_sets; i++)
				fprintf(out, " %d", c->baselines[k].plan[i]);
			fputc('\n', out);
		}
}
