/* passes/pipeline.c: the compiler, top to bottom.
 *
 * A flat, ordered table of passes over one kiln_compilation. The graph
 * verifier runs after every pass; --dump-after=NAME prints the state after
 * pass NAME: the IR, then whatever planning state exists by then.
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

static const struct {
	const char *name;
	int (*run)(kiln_compilation *c);
} passes[] = {
    {"lower", run_lower},
    {"activations", run_activations},
    {"plan", kiln_pass_plan},
    {"interleave", kiln_pass_interleave},
    {"budget", kiln_pass_budget},
    {"baselines", kiln_pass_baselines},
};

#define N_PASSES (sizeof(passes) / sizeof(passes[0]))

size_t kiln_pipeline_pass_count(void)
{
	return N_PASSES;
}

const char *kiln_pipeline_pass_name(size_t i)
{
	return i < N_PASSES ? passes[i].name : NULL;
}

static long pass_index(const char *name)
{
	for (size_t i = 0; i < N_PASSES; i++)
		if (strcmp(passes[i].name, name) == 0)
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
	c->meter = kiln_progress_start(c->progress, "kilnc: compile");
	int rc = 0;
	for (long i = 0; i <= last && rc == 0; i++) {
		struct timespec t0, t1;
		if (i == plan_at && (rc = check_cost(c, err)) != 0)
			break;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		kiln_progress_phase(c->meter, passes[i].name, "", 0);
		if (passes[i].run(c) != 0) {
			if (err)
				fprintf(err,
				        "kilnc: pass %s failed: out of memory, or a solver refused an "
				        "instance (an internal limit)\n",
				        passes[i].name);
			rc = -1;
			break;
		}
		if (kiln_ir_graph_verify(c->graph, err) != 0) {
			if (err)
				fprintf(err,
				        "kilnc: internal error: the graph is invalid after pass %s\n",
				        passes[i].name);
			rc = -1;
			break;
		}
		clock_gettime(CLOCK_MONOTONIC, &t1);
		double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
		if (c->meter)
			kiln_progress_line(c->meter, "kilnc: %-12s %8.1f ms\n", passes[i].name, ms);
		else if (c->progress)
			fprintf(c->progress, "kilnc: %-12s %8.1f ms\n", passes[i].name, ms);
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
