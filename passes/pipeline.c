/* passes/pipeline.c: the compiler, top to bottom.
 *
 * A flat, ordered table of passes over one kiln_compilation, each with the
 * parts of it that it reads, creates and updates in place
 * (docs/passes.md). The driver runs them in that order and holds them to
 * the table: before a pass, what it reads or updates exists; after it, what
 * it creates exists and nothing else was replaced. The graph verifier and
 * the plan-table verifier (verify.c) run after every pass; --dump-after=NAME
 * prints the state after pass NAME: the IR, then whatever planning state
 * exists by then.
 */
#include <string.h>
#include <time.h>

#include "passes/passes.h"

static int run_lower(kiln_compilation *c)
{
	return kiln_pass_lower(c->model, c->arena, &c->graph);
}

static int run_activations(kiln_compilation *c)
{
	return kiln_pass_activations(c->graph, c->arena, &c->sets, &c->n_sets);
}

enum {
	MODEL = KILN_PART_MODEL,
	GRAPH = KILN_PART_GRAPH,
	SETS = KILN_PART_SETS,
	BUCKETS = KILN_PART_BUCKETS,
	TABLES = KILN_PART_TABLES,
	POOL = KILN_PART_POOL,
	SCHEDULE = KILN_PART_SCHEDULE,
	BUDGETS = KILN_PART_BUDGETS,
	BASELINES = KILN_PART_BASELINES
};

static const struct {
	kiln_pass_info info;
	int (*run)(kiln_compilation *c);
} passes[] = {
    {{"lower", MODEL, GRAPH, 0,
      "the model to the graph IR: per stage its layers' forward and backward ops and tensors"},
     run_lower},
    {{"activations", GRAPH, SETS, 0,
      "the units (saved activations) of each layer kind on each stage, with sources and flags"},
     run_activations},
    {{"plan", MODEL | GRAPH | SETS, BUCKETS | TABLES | POOL, 0,
      "per unit set and load bucket a frontier and its table points (schedules through "
      "passes/schedule.h to measure copy windows and pick points)"},
     kiln_pass_plan},
    {{"interleave", MODEL | GRAPH | SETS | BUCKETS | POOL, SCHEDULE, TABLES,
      "a template per plan, the stage timelines; every table point's scheduled exposed time, "
      "points a scheduled neighbour dominates dropped"},
     kiln_pass_interleave},
    {{"budget", MODEL | GRAPH | SETS | BUCKETS | TABLES | POOL, BUDGETS, SCHEDULE,
      "per stage the budget, the steady plan and the safety factor; the timelines' templates "
      "become the steady plans'"},
     kiln_pass_budget},
    {{"baselines", MODEL | GRAPH | SETS | BUCKETS | TABLES | BUDGETS, BASELINES, POOL,
      "the peers' static plans (full recompute, Megatron's strongest recipe, static "
      "aggressive, AdaPipe's), added to the pool"},
     kiln_pass_baselines},
};

#define N_PASSES (sizeof(passes) / sizeof(passes[0]))

static const char *const SOLVER_NAMES[KILN_SOLVER_COUNT] = {
    [KILN_SOLVER_DP] = "dp", [KILN_SOLVER_MILP] = "milp"};

const char *kiln_solver_name(int s)
{
	return s >= 0 && s < KILN_SOLVER_COUNT ? SOLVER_NAMES[s] : "?";
}

int kiln_solver_parse(const char *name, kiln_solver *out)
{
	for (int s = 0; s < KILN_SOLVER_COUNT; s++)
		if (strcmp(name, SOLVER_NAMES[s]) == 0) {
			*out = (kiln_solver)s;
			return 0;
		}
	return -1;
}

const char *kiln_pipeline_part_name(uint32_t part)
{
	switch (part) {
	case KILN_PART_MODEL:
		return "model";
	case KILN_PART_GRAPH:
		return "graph";
	case KILN_PART_SETS:
		return "sets";
	case KILN_PART_BUCKETS:
		return "buckets";
	case KILN_PART_TABLES:
		return "tables";
	case KILN_PART_POOL:
		return "pool";
	case KILN_PART_SCHEDULE:
		return "schedule";
	case KILN_PART_BUDGETS:
		return "budgets";
	case KILN_PART_BASELINES:
		return "baselines";
	}
	return "?";
}

/* Where part lives in c (its pointer; NULL until created). */
static const void *part_of(const kiln_compilation *c, uint32_t part)
{
	switch (part) {
	case KILN_PART_MODEL:
		return c->model;
	case KILN_PART_GRAPH:
		return c->graph;
	case KILN_PART_SETS:
		return c->sets;
	case KILN_PART_BUCKETS:
		return c->buckets;
	case KILN_PART_TABLES:
		return c->tables;
	case KILN_PART_POOL:
		return c->pool;
	case KILN_PART_SCHEDULE:
		return c->schedule;
	case KILN_PART_BUDGETS:
		return c->budgets;
	case KILN_PART_BASELINES:
		return c->baselines;
	}
	return NULL;
}

const kiln_pass_info *kiln_pipeline_pass(size_t i)
{
	return i < N_PASSES ? &passes[i].info : NULL;
}

int kiln_pipeline_order_check(const kiln_pass_info *const *p, size_t n, FILE *err)
{
	uint32_t have = KILN_PART_MODEL;
	int bad = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t need = p[i]->reads | p[i]->updates;
		for (uint32_t b = 1; b < KILN_PART_ALL + 1u; b <<= 1) {
			if ((need & b) && !(have & b)) {
				if (err)
					fprintf(err,
					        "kilnc: pipeline: pass %s reads %s, which no "
					        "earlier pass "
					        "creates\n",
					        p[i]->name, kiln_pipeline_part_name(b));
				bad = 1;
			}
			if ((p[i]->creates & b) && (have & b)) {
				if (err)
					fprintf(
					    err,
					    "kilnc: pipeline: pass %s creates %s, which exists\n",
					    p[i]->name, kiln_pipeline_part_name(b));
				bad = 1;
			}
		}
		have |= p[i]->creates;
	}
	return bad ? -1 : 0;
}

/* Holds pass i to its row: 0, or -1 (reported on err) when a part it
 * creates is missing after it or a part outside what it creates was
 * replaced (before: the parts' pointers before it ran). */
static int check_effects(const kiln_compilation *c, size_t i, const void *const *before, FILE *err)
{
	const kiln_pass_info *p = &passes[i].info;
	int bad = 0, k = 0;
	for (uint32_t b = 1; b < KILN_PART_ALL + 1u; b <<= 1, k++) {
		const void *now = part_of(c, b);
		const char *why = (p->creates & b) && !now                ? "did not create"
		                  : !(p->creates & b) && now != before[k] ? "replaced"
		                                                          : NULL;
		if (why) {
			if (err)
				fprintf(err,
				        "kilnc: internal error: pass %s %s %s (docs/passes.md)\n",
				        p->name, why, kiln_pipeline_part_name(b));
			bad = 1;
		}
	}
	return bad ? -1 : 0;
}

size_t kiln_pipeline_pass_count(void)
{
	return N_PASSES;
}

const char *kiln_pipeline_pass_name(size_t i)
{
	return i < N_PASSES ? passes[i].info.name : NULL;
}

static long pass_index(const char *name)
{
	for (size_t i = 0; i < N_PASSES; i++)
		if (strcmp(passes[i].info.name, name) == 0)
			return (long)i;
	return -1;
}

int kiln_pipeline_cost(const kiln_compilation *c, kiln_compile_cost *out)
{
	double *edges;
	int32_t nb;
	if (kiln_plan_buckets(c->model->max_factor, c->arena, &edges, &nb) != 0)
		return -1;
	int64_t units = 0;
	int kinds[2] = {0, 0};
	for (int32_t s = 0; s < c->n_sets; s++) {
		units += c->sets[s].n_units;
		kinds[c->sets[s].kind == KILN_LAYER_MOE] = 1;
	}
	*out = (kiln_compile_cost){.n_sets = c->n_sets,
	                           .n_buckets = nb,
	                           .tables = (int64_t)c->n_sets * nb,
	                           .unit_choices = units * nb,
	                           .frontiers = (int64_t)(kinds[0] + kinds[1]) * nb};
	out->bytes = (double)out->unit_choices * KILN_COMPILE_BYTES_PER_UNIT_CHOICE +
	             (double)out->frontiers * KILN_COMPILE_BYTES_PER_FRONTIER;
	out->cpu_s = ((double)out->unit_choices * KILN_COMPILE_CPU_US_PER_UNIT_CHOICE +
	              (double)out->frontiers * KILN_COMPILE_CPU_US_PER_FRONTIER) *
	             1e-6;
	return 0;
}

/* The cost check before the planning passes: 0 to go on, -3 (reported)
 * past the bound, -1 on exhaustion. */
static int check_cost(kiln_compilation *c, FILE *err)
{
	kiln_compile_cost k;
	if (kiln_pipeline_cost(c, &k) != 0)
		return -1;
	kiln_progress_line(
	    c->meter,
	    "kilnc: estimate     %lld plan tables, %lld unit choices: about %.0f MB, "
	    "%.1f s of CPU\n",
	    (long long)k.tables, (long long)k.unit_choices, k.bytes / 1e6, k.cpu_s);
	if (k.unit_choices <= KILN_COMPILE_MAX_UNIT_CHOICES)
		return 0;
	if (err) {
		const char *path = c->model->path ? c->model->path : c->model->name;
		fprintf(err,
		        "%s: error: compiling would plan %lld unit choices (%d unit sets x %d load "
		        "buckets = %lld plan tables), an estimated %.1f GB of memory and %.0f s of "
		        "CPU, over the limit of %d unit choices\n",
		        path, (long long)k.unit_choices, k.n_sets, k.n_buckets, (long long)k.tables,
		        k.bytes / 1e9, k.cpu_s, KILN_COMPILE_MAX_UNIT_CHOICES);
		fprintf(err,
		        "%s: note: a unit set is one layer kind on one pipeline stage; use fewer "
		        "stages (parallel.pp, parallel.vpp) or a lower load.max_factor (fewer load "
		        "buckets); docs/cli.md, \"Cost bounds\"\n",
		        path);
	}
	return -3;
}

int kiln_pipeline_compile(kiln_compilation *c, const char *until, const char *dump_after,
                          FILE *dump, FILE *err)
{
	long last = (long)N_PASSES - 1, dump_at = -1, plan_at = pass_index("plan");
	if (until && (last = pass_index(until)) < 0)
		return -2;
	if (dump_after) {
		if ((dump_at = pass_index(dump_after)) < 0)
			return -2;
		if (dump_at > last)
			last = dump_at;
	}
	const kiln_pass_info *order[N_PASSES];
	for (size_t i = 0; i < N_PASSES; i++)
		order[i] = &passes[i].info;
	if (kiln_pipeline_order_check(order, N_PASSES, err) != 0)
		return -1;
	c->meter = kiln_progress_start(c->progress, "kilnc: compile");
	int rc = 0;
	for (long i = 0; i <= last && rc == 0; i++) {
		struct timespec t0, t1;
		if (i == plan_at && (rc = check_cost(c, err)) != 0)
			break;
		const void *before[KILN_PART_COUNT];
		for (int k = 0; k < KILN_PART_COUNT; k++)
			before[k] = part_of(c, 1u << k);
		for (int k = 0; k < KILN_PART_COUNT; k++) {
			uint32_t b = 1u << k;
			if (((passes[i].info.reads | passes[i].info.updates) & b) && !before[k]) {
				if (err)
					fprintf(err,
					        "kilnc: internal error: pass %s needs %s, which is "
					        "missing\n",
					        passes[i].info.name, kiln_pipeline_part_name(b));
				rc = -1;
			}
		}
		if (rc != 0)
			break;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		kiln_progress_phase(c->meter, passes[i].info.name, "", 0);
		if (passes[i].run(c) != 0) {
			if (err)
				fprintf(
				    err,
				    "kilnc: pass %s failed: out of memory, or a solver refused an "
				    "instance (an internal limit)\n",
				    passes[i].info.name);
			rc = -1;
			break;
		}
		if (check_effects(c, (size_t)i, before, err) != 0) {
			rc = -1;
			break;
		}
		if (kiln_ir_graph_verify(c->graph, err) != 0) {
			if (err)
				fprintf(
				    err,
				    "kilnc: internal error: the graph is invalid after pass %s\n",
				    passes[i].info.name);
			rc = -1;
			break;
		}
		if (kiln_plan_verify(c, err) != 0) {
			if (err)
				fprintf(err,
				        "kilnc: internal error: the plan tables are invalid after "
				        "pass %s\n",
				        passes[i].info.name);
			rc = -1;
			break;
		}
		clock_gettime(CLOCK_MONOTONIC, &t1);
		double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
		if (c->meter)
			kiln_progress_line(c->meter, "kilnc: %-12s %8.1f ms\n", passes[i].info.name,
			                   ms);
		else if (c->progress)
			fprintf(c->progress, "kilnc: %-12s %8.1f ms\n", passes[i].info.name, ms);
		if (i == dump_at && dump)
			kiln_pipeline_dump(c, dump);
	}
	kiln_progress_stop(c->meter);
	c->meter = NULL;
	return rc;
}

int kiln_pipeline_run(const kiln_model *m, kiln_arena *a, const char *dump_after, FILE *dump,
                      FILE *err, kiln_ir_graph **out)
{
	kiln_compilation c = {.model = m, .arena = a};
	*out = NULL;
	int rc = kiln_pipeline_compile(&c, "lower", dump_after, dump, err);
	if (rc == 0)
		*out = c.graph;
	return rc;
}
