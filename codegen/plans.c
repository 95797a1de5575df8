/* codegen/plans.c: `kilnc compile` output: the plan tables, the budgets and
 * safety bounds, and the baselines, as text and as JSON (keys in
 * docs/cli.md). The runtime's input is the blob (codegen/blob.c).
 */
#include <math.h>
#include <string.h>

#include "codegen/codegen.h"
#include "kiln/runtime.h"
#include "passes/passes.h"

/* Compiler actions (costmodel.h) are printed by the runtime's name table. */
_Static_assert(KILN_ACT_KEEP == (int)KILN_RT_KEEP && KILN_ACT_RECOMPUTE == (int)KILN_RT_RECOMPUTE &&
                   KILN_ACT_OFFLOAD == (int)KILN_RT_OFFLOAD && KILN_ACT_COUNT == 3,
               "kiln_action and kiln_rt_action must agree");

int32_t kiln_plans_infeasible_stages(const kiln_compilation *c)
{
	int32_t n = 0;
	for (int32_t s = 0; s < c->graph->n_stages; s++)
		n += c->budgets[s].safety_factor < c->model->max_factor - 1e-9;
	return n;
}

void kiln_plans_report_infeasible(const kiln_compilation *c, FILE *err)
{
	const kiln_model *m = c->model;
	char pb[4096];
	const char *path = m->path ? m->path : "-";
	kiln_text_escape(path, strlen(path), sizeof pb, pb);
	fprintf(err,
	        "%s: error: load.max_factor %.3g does not fit on %d of %d stages, even with "
	        "every activation recomputed or offloaded:\n",
	        pb, m->max_factor, kiln_plans_infeasible_stages(c), c->graph->n_stages);
	for (int32_t s = 0; s < c->graph->n_stages; s++) {
		const kiln_stage_budget *b = &c->budgets[s];
		if (b->safety_factor >= m->max_factor - 1e-9)
			continue;
		if (!b->steady_fits)
			fprintf(err, "  stage %d: does not fit even at balanced load (load factor 1)\n", s);
		else if (b->safety_factor <= 0)
			fprintf(err, "  stage %d: no load factor fits\n", s);
		else
			fprintf(err, "  stage %d: largest load factor that fits is %.3g\n", s,
			        b->safety_factor);
	}
	fprintf(err,
	        "%s: note: lower load.max_factor, or add memory per device (more tp or pp, "
	        "a distributed optimizer, a larger device)\n",
	        pb);
}

void kiln_plans_text(const kiln_compilation *c, FILE *out)
{
	const kiln_model *m = c->model;
	char nb[1024]; /* the description's name, escaped for the terminal */
	fprintf(out,
	        "%s: %d unit sets x %d load buckets (0 to %.3g), %d distinct frontiers, %d "
	        "distinct plans, solver %s\n\n",
	        kiln_text_escape(m->name, strlen(m->name), sizeof nb, nb), c->n_sets, c->n_buckets,
	        m->max_factor, c->pool->n_frontiers, c->pool->n, kiln_solver_name(c->solver));
	/* Small devices read better in MiB, as in the report. */
	double unit = (m->hw.memory_gib - m->hw.reserved_gib) >= 1.0 ? 1073741824.0 : 1048576.0;
	char u = unit > 1048576.0 ? 'G' : 'M';
	fprintf(out, "%5s %9s %8s %10s %10s %10s %12s %7s\n", "stage", "capacity", "static",
	        "inflight", "steady", "budget", "steady cost", "safety");
	for (int32_t s = 0; s < c->graph->n_stages; s++) {
		const kiln_stage_budget *b = &c->budgets[s];
		fprintf(out, "%5d %8.2f%c %7.2f%c %10.3g %9.2f%c %9.2f%c %9.2f ms %6.3gx%s\n", s,
		        b->capacity_bytes / unit, u, b->static_bytes / unit, u, b->inflight,
		        b->steady_bytes / unit, u, b->budget_bytes / unit, u,
		        b->steady_exposed_us / 1e3, b->safety_factor,
		        b->steady_fits ? "" : "  (steady state does not fit)");
	}
	fprintf(out, "\nsteady: what one in-flight micro-batch holds at load 1 under the cheapest plan "
	             "that fits\nand leaves room for a spike; budget: what a deciding micro-batch may "
	             "hold; safety: the\nlargest load factor (up to load.max_factor) whose "
	             "maximal-saving plan fits the budget.\n\n");
	for (int32_t i = 0; i < c->n_sets; i++) {
		const kiln_unit_set *set = &c->sets[i];
		int32_t b1 = kiln_plan_bucket_of(c->buckets, c->n_buckets, 1.0);
		const kiln_plan_table *t1 = kiln_plan_table_of(c, i, b1);
		const kiln_plan_table *tm = kiln_plan_table_of(c, i, c->n_buckets - 1);
		fprintf(out,
		        "stage %d %s x%d: %d units; frontier at load 1: %d points, at %.3g: %d points; "
		        "max saving at %.3g: %.1f%% of %.2f MiB for %.2f ms\n",
		        set->stage, kiln_ir_layer_kind_name(set->kind), set->n_layers, set->n_units,
		        t1->frontier->n_points, tm->load_factor, tm->frontier->n_points, tm->load_factor,
		        100.0 * tm->bytes[tm->n_points - 1].saved / fmax(1.0, tm->bytes[0].resident),
		        tm->bytes[0].resident / 1048576.0,
		        kiln_plan_table_exposed_us(tm, tm->n_points - 1) / 1e3);
	}
	fprintf(out, "\nbaselines:\n");
	for (int k = 0; k < KILN_BASELINE_COUNT; k++) {
		char state[32];
		snprintf(state, sizeof state, "%s %g", c->baselines[k].fits ? "fits at" : "OOM at load",
		         c->baselines[k].design_load);
		fprintf(out, "  %-20s %-15s %s\n", c->baselines[k].name, state, c->baselines[k].models);
		if (c->baselines[k].searched > 0)
			fprintf(out, "  %-20s %-15s (searched %lld recipes in %.2f s of CPU)\n", "",
			        "", (long long)c->baselines[k].searched,
			        c->baselines[k].search_cpu_s);
	}
}

static void add_actions(kiln_json *obj, const kiln_unit_set *set, const uint8_t *act)
{
	for (int32_t u = 0; u < set->n_units; u++)
		kiln_json_add_string(obj, set->units[u].name, kiln_rt_action_name(act[u]));
}

kiln_json *kiln_plans_json(const kiln_compilation *c)
{
	const kiln_model *m = c->model;
	kiln_json *root = kiln_json_object();
	kiln_json_add_i64(root, "kiln_plan", 1);
	kiln_json_add_string(root, "model", m->name);
	kiln_json_add_string(root, "path", m->path);
	kiln_json_add_string(root, "solver", kiln_solver_name(c->solver));
	kiln_json_add_number(root, "max_factor", m->max_factor);
	kiln_json *buckets = kiln_json_add_array(root, "buckets");
	for (int32_t b = 0; b < c->n_buckets; b++)
		kiln_json_add_number(buckets, NULL, c->buckets[b]);

	kiln_json *stages = kiln_json_add_array(root, "stages");
	for (int32_t s = 0; s < c->graph->n_stages; s++) {
		const kiln_stage_budget *bu = &c->budgets[s];
		kiln_json *st = kiln_json_add_object(stages, NULL);
		kiln_json_add_i64(st, "stage", s);
		kiln_json_add_number(st, "capacity_bytes", bu->capacity_bytes);
		kiln_json_add_number(st, "static_bytes", bu->static_bytes);
		kiln_json_add_number(st, "inflight", bu->inflight);
		kiln_json_add_number(st, "fixed_bytes", bu->fixed_bytes);
		kiln_json_add_number(st, "steady_bytes", bu->steady_bytes);
		kiln_json_add_number(st, "steady_exposed_us", bu->steady_exposed_us);
		kiln_json_add_number(st, "budget_bytes", bu->budget_bytes);
		kiln_json_add_bool(st, "steady_fits", bu->steady_fits);
		kiln_json_add_number(st, "safety_factor", bu->safety_factor);
		kiln_json_add_bool(st, "fits_max_factor", bu->safety_factor >= m->max_factor - 1e-9);
		kiln_json *sets = kiln_json_add_array(st, "layer_kinds");
		int32_t k = 0;
		for (int32_t i = 0; i < c->n_sets; i++) {
			const kiln_unit_set *set = &c->sets[i];
			if (set->stage != s)
				continue;
			kiln_json *sj = kiln_json_add_object(sets, NULL);
			kiln_json_add_string(sj, "kind", kiln_ir_layer_kind_name(set->kind));
			kiln_json_add_i64(sj, "layers", set->n_layers);
			kiln_json_add_i64(sj, "steady_point", bu->steady_point[k++]);
			kiln_json *units = kiln_json_add_array(sj, "units");
			for (int32_t u = 0; u < set->n_units; u++) {
				const kiln_unit *un = &set->units[u];
				kiln_json *uj = kiln_json_add_object(units, NULL);
				kiln_json_add_string(uj, "name", un->name);
				kiln_json_add_u64(uj, "bytes_base", un->bytes.base);
				kiln_json_add_u64(uj, "bytes_per_n", un->bytes.per_n);
				kiln_json_add_bool(uj, "recomputable",
				                   !(un->flags & (KILN_UNIT_LAYER_INPUT | KILN_UNIT_COLLECTIVE)));
			}
			kiln_json *tabs = kiln_json_add_array(sj, "buckets");
			for (int32_t b = 0; b < c->n_buckets; b++) {
				const kiln_plan_table *t = kiln_plan_table_of(c, i, b);
				kiln_json *tj = kiln_json_add_object(tabs, NULL);
				kiln_json_add_number(tj, "load_factor", t->load_factor);
				kiln_json_add_number(tj, "rows", t->n);
				kiln_json_add_i64(tj, "frontier", t->frontier_id);
				kiln_json *pts = kiln_json_add_array(tj, "points");
				kiln_json_add_i64(tj, "frontier_points", t->frontier->n_points);
				for (int32_t p = 0; p < t->n_points; p++) {
					const kiln_plan_point *pt = &t->frontier->points[t->point[p]];
					kiln_json *pj = kiln_json_add_object(pts, NULL);
					kiln_json_add_number(pj, "saved_bytes", t->bytes[p].saved);
					kiln_json_add_number(pj, "resident_bytes", t->bytes[p].resident);
					kiln_json_add_number(pj, "offloaded_bytes", t->bytes[p].offloaded);
					kiln_json_add_number(pj, "transient_bytes", t->bytes[p].transient);
					/* What budget, blob and MLIR use: the scheduled
					 * time; the solver's own estimate under its key. */
					kiln_json_add_number(pj, "exposed_us",
					                     kiln_plan_table_exposed_us(t, p));
					kiln_json_add_number(pj, "estimate_us", pt->exposed_us);
					kiln_json_add_number(pj, "recompute_us", pt->recompute_us);
					kiln_json_add_i64(pj, "plan", t->plan[p]);
				}
			}
		}
	}

	kiln_json *plans = kiln_json_add_array(root, "plans");
	for (int32_t i = 0; i < c->pool->n; i++) {
		kiln_json *pj = kiln_json_add_object(plans, NULL);
		kiln_json_add_string(pj, "kind", kiln_ir_layer_kind_name(c->pool->set[i]->kind));
		add_actions(kiln_json_add_object(pj, "actions"), c->pool->set[i], c->pool->actions[i]);
	}

	kiln_json *bls = kiln_json_add_array(root, "baselines");
	for (int k = 0; k < KILN_BASELINE_COUNT; k++) {
		const kiln_baseline *bl = &c->baselines[k];
		kiln_json *bj = kiln_json_add_object(bls, NULL);
		kiln_json_add_string(bj, "name", bl->name);
		kiln_json_add_string(bj, "models", bl->models);
		kiln_json_add_number(bj, "design_load", bl->design_load);
		kiln_json_add_bool(bj, "fits", bl->fits);
		kiln_json *per = kiln_json_add_array(bj, "plans");
		for (int32_t i = 0; i < c->n_sets; i++) {
			kiln_json *e = kiln_json_add_object(per, NULL);
			kiln_json_add_i64(e, "stage", c->sets[i].stage);
			kiln_json_add_string(e, "kind", kiln_ir_layer_kind_name(c->sets[i].kind));
			kiln_json_add_i64(e, "plan", bl->plan[i]);
		}
	}
	return root;
}
