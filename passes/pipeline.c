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

int kiln_pipeline_compile(kiln_compilation *c, const char *until, const char *dump_after,
                          FILE *dump, FILE *err)
{
	long last = (long)N_PASSES - 1, dump_at = -1;
	if (until && (last = pass_index(until)) < 0)
		return -2;
	if (dump_after) {
		if ((dump_at = pass_index(dump_after)) < 0)
			return -2;
		if (dump_at > last)
			last = dump_at;
	}
	for (long i = 0; i <= last; i++) {
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		if (passes[i].run(c) != 0) {
			if (err)
				fprintf(err,
				        "kilnc: pass %s failed: out of memory, or a solver refused an "
				        "instance (an internal limit)\n",
				        passes[i].name);
			return -1;
		}
		if (kiln_ir_graph_verify(c->graph, err) != 0) {
			if (err)
				fprintf(err,
				        "kilnc: internal error: the graph is invalid after pass %s\n",
				        passes[i].name);
			return -1;
		}
		if (c->progress) {
			clock_gettime(CLOCK_MONOTONIC, &t1);
			fprintf(c->progress, "kilnc: %-12s %8.1f ms\n", passes[i].name,
			        (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
		}
		if (i == dump_at && dump)
			kiln_pipeline_dump(c, dump);
	}
	return 0;
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
