/* bench/bench_compile.c: how long `kilnc compile` takes (target: under 2 s
 * for kimi-k2-1t at 12,288 devices with the DP on this 2-core machine), with
 * the DP and with the exact MILP, and their ratio. Prints its numbers;
 * asserts nothing.
 *
 * usage: bench_compile [MODEL] [DP_RUNS] [--no-milp]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "frontend/frontend.h"
#include "passes/passes.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One full compilation; returns seconds, or -1 on failure. */
static double compile_once(const char *model, kiln_solver solver, int32_t *out_frontiers,
                           int32_t *out_plans, int32_t *out_points)
{
	double t0 = now_s();
	kiln_arena *a = kiln_arena_new();
	kiln_model *m = NULL;
	if (!a || kiln_frontend_load_file(model, a, stderr, &m) != 0) {
		kiln_arena_free(a);
		return -1;
	}
	kiln_compilation c = {.model = m, .arena = a, .solver = solver};
	if (kiln_pipeline_compile(&c, NULL, NULL, NULL, stderr) != 0) {
		kiln_arena_free(a);
		return -1;
	}
	double t = now_s() - t0;
	*out_frontiers = c.pool->n_frontiers;
	*out_plans = c.pool->n;
	int32_t points = 0;
	for (int32_t i = 0; i < c.n_sets * c.n_buckets; i++)
		points += c.tables[i].n_points;
	*out_points = points;
	kiln_arena_free(a);
	return t;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	const char *model = KILN_SOURCE_DIR "/examples/models/kimi-k2-1t.yaml";
	int runs = 10;
	int milp = 1;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--no-milp") == 0)
			milp = 0;
		else if (argv[i][0] >= '0' && argv[i][0] <= '9')
			runs = atoi(argv[i]);
		else
			model = argv[i];
	}
	if (runs < 1 || runs > 1000) {
		fprintf(stderr, "bench_compile: DP_RUNS must be 1..1000\n");
		return 2;
	}
	double *dp = calloc((size_t)runs, sizeof *dp);
	if (!dp)
		return 1;
	int32_t frontiers = 0, plans = 0, points = 0;
	for (int i = 0; i < runs; i++)
		if ((dp[i] = compile_once(model, KILN_SOLVER_DP, &frontiers, &plans, &points)) < 0) {
			fprintf(stderr, "bench_compile: %s does not compile\n", model);
			return 1;
		}
	qsort(dp, (size_t)runs, sizeof *dp, cmp_double);
	printf("bench_compile: %s\n", model);
	printf("  %d distinct frontiers, %d table points (at most %d per table), %d distinct "
	       "plans\n",
	       frontiers, points, KILN_PLAN_TABLE_STEPS + 1, plans);
	printf("  dp:   %d runs, min %.3f s, median %.3f s (target < 2 s)\n", runs, dp[0],
	       dp[runs / 2]);
	if (milp) {
		fprintf(stderr, "bench_compile: the MILP solves every frontier point; this takes "
		                "minutes\n");
		int32_t f2, p2, q2;
		double t = compile_once(model, KILN_SOLVER_MILP, &f2, &p2, &q2);
		if (t < 0) {
			fprintf(stderr, "bench_compile: the MILP compile failed\n");
			return 1;
		}
		printf("  milp: 1 run, %.1f s; %d table points (dp %d)\n", t, q2, points);
		printf("  milp / dp time ratio: %.0fx\n", t / dp[runs / 2]);
	}
	free(dp);
	return 0;
}
