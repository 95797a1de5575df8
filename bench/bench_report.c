/* bench/bench_report.c: how long `kilnc report` takes on the largest shipped
 * model (target: under 100 ms), measured in-process from reading the YAML to
 * the last byte of the text and JSON reports. Prints its numbers; asserts
 * nothing.
 *
 * usage: bench_report [MODEL] [RUNS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	const char *model = argc > 1 ? argv[1] : KILN_SOURCE_DIR "/examples/models/kimi-k2-1t.yaml";
	int runs = argc > 2 ? atoi(argv[2]) : 50;
	if (runs < 1 || runs > 100000) {
		fprintf(stderr, "bench_report: RUNS must be 1..100000\n");
		return 2;
	}
	FILE *sink = fopen("/dev/null", "w");
	if (!sink)
		return 1;
	double *ms = calloc((size_t)runs, sizeof *ms);
	if (!ms)
		return 1;
	int32_t ops = 0, tensors = 0;
	size_t arena_bytes = 0;
	for (int i = 0; i < runs; i++) {
		double t0 = now_ms();
		kiln_arena *a = kiln_arena_new();
		kiln_model *m = NULL;
		kiln_ir_graph *g = NULL;
		if (!a || kiln_frontend_load_file(model, a, stderr, &m) != 0 ||
		    kiln_pipeline_run(m, a, NULL, NULL, stderr, &g) != 0) {
			fprintf(stderr, "bench_report: %s does not compile\n", model);
			return 1;
		}
		kiln_report_text(g, sink);
		kiln_json *doc = kiln_report_json(g);
		kiln_json_write(doc, sink);
		kiln_json_free(doc);
		ops = g->n_ops;
		tensors = g->n_tensors;
		arena_bytes = kiln_arena_used(a);
		kiln_arena_free(a);
		ms[i] = now_ms() - t0;
	}
	qsort(ms, (size_t)runs, sizeof *ms, cmp_double);
	printf("bench_report: %s\n", model);
	printf("  graph: %d ops, %d tensors, %.1f KiB arena\n", ops, tensors, arena_bytes / 1024.0);
	printf("  parse + lower + text and JSON report, %d runs: min %.2f ms, median %.2f ms, max %.2f "
	       "ms (target < 100 ms)\n",
	       runs, ms[0], ms[runs / 2], ms[runs - 1]);
	free(ms);
	fclose(sink);
	return 0;
}
