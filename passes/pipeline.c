/* passes/pipeline.c: the compiler, top to bottom.
 *
 * A flat, ordered table of passes. Each pass takes the model and the graph so
 * far (NULL before "lower") and leaves the new graph in *g. The verifier runs
 * after every pass; --dump-after=NAME prints the graph after pass NAME.
 */
#include <string.h>

#include "passes/passes.h"

typedef int (*pass_fn)(const kiln_model *m, kiln_arena *a, kiln_ir_graph **g);

static int run_lower(const kiln_model *m, kiln_arena *a, kiln_ir_graph **g)
{
	return kiln_pass_lower(m, a, g);
}

static const struct {
	const char *name;
	pass_fn run;
} passes[] = {
    {"lower", run_lower},
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

int kiln_pipeline_run(const kiln_model *m, kiln_arena *a, const char *dump_after, FILE *dump,
                      FILE *err, kiln_ir_graph **out)
{
	*out = NULL;
	if (dump_after) {
		size_t i = 0;
		while (i < N_PASSES && strcmp(passes[i].name, dump_after) != 0)
			i++;
		if (i == N_PASSES)
			return -2;
	}
	kiln_ir_graph *g = NULL;
	for (size_t i = 0; i < N_PASSES; i++) {
		if (passes[i].run(m, a, &g) != 0) {
			if (err)
				fprintf(err, "kilnc: out of memory in pass %s\n", passes[i].name);
			return -1;
		}
		if (kiln_ir_graph_verify(g, err) != 0) {
			if (err)
				fprintf(
				    err,
				    "kilnc: internal error: the graph is invalid after pass %s\n",
				    passes[i].name);
			return -1;
		}
		if (dump_after && dump && strcmp(passes[i].name, dump_after) == 0)
			kiln_ir_graph_print(g, dump);
	}
	*out = g;
	return 0;
}
