/* bench/bench_schedule.c: how long dual-batch scheduling takes (target:
 * every plan class of kimi-k2-1t in under 1 s on this 2-core machine), and
 * what it buys: per plan class the interleaved makespan against the serial
 * one, and per table point the scheduled exposed time against the first
 * estimate. Prints its numbers; asserts nothing.
 *
 * usage: bench_schedule [MODEL] [RUNS] [--per-class]
 *   --per-class  also print serial and overlapped makespan of every plan class
 */
#include <math.h>
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

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* Compiles model up to "plan" into c (arena a). Returns 0 or -1. */
static int front(const char *model, kiln_arena *a, kiln_compilation *c)
{
	kiln_model *m = NULL;
	if (kiln_frontend_load_file(model, a, stderr, &m) != 0)
		return -1;
	*c = (kiln_compilation){.model = m, .arena = a, .solver = KILN_SOLVER_DP};
	return kiln_pipeline_compile(c, "plan", NULL, NULL, stderr);
}

int main(int argc, char **argv)
{
	const char *model = KILN_SOURCE_DIR "/examples/models/kimi-k2-1t.yaml";
	int runs = 5;
	int per_class = 0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--per-class") == 0)
			per_class = 1;
		else if (argv[i][0] >= '0' && argv[i][0] <= '9')
			runs = atoi(argv[i]);
		else
			model = argv[i];
	}
	if (runs < 1 || runs > 1000) {
		fprintf(stderr, "bench_schedule: RUNS must be 1..1000\n");
		return 2;
	}
	double *t_tpl = calloc((size_t)runs, sizeof(double));
	double *t_pass = calloc((size_t)runs, sizeof(double));
	double *t_all = calloc((size_t)runs, sizeof(double));
	if (!t_tpl || !t_pass || !t_all)
		return 1;
	int32_t n_plans = 0, max_tasks = 0;
	double sum_tasks = 0;
	for (int r = 0; r < runs; r++) {
		/* Every plan class: build its chains at its first table's load and
		 * run the DP (what the pass does per template, without serial). */
		kiln_arena *a = kiln_arena_new();
		kiln_compilation c;
		if (!a || front(model, a, &c) != 0) {
			fprintf(stderr, "bench_schedule: %s does not compile\n", model);
			return 1;
		}
		int32_t np = c.pool->n, n_tab = c.n_sets * c.n_buckets;
		int32_t *first = calloc((size_t)(np ? np : 1), sizeof(int32_t));
		if (!first)
			return 1;
		for (int32_t p = 0; p < np; p++)
			first[p] = -1;
		for (int32_t ti = 0; ti < n_tab; ti++)
			for (int32_t k = 0; k < c.tables[ti].n_points; k++)
				if (first[c.tables[ti].plan[k]] < 0)
					first[c.tables[ti].plan[k]] = ti;
		kiln_arena *sa = kiln_arena_new();
		double t0 = now_s();
		n_plans = 0;
		sum_tasks = 0;
		for (int32_t p = 0; p < np; p++) {
			if (first[p] < 0)
				continue;
			const kiln_plan_table *t = &c.tables[first[p]];
			kiln_task *tasks;
			int32_t n;
			if (kiln_schedule_build(c.graph, t->set, c.pool->actions[p], t->n, sa, &tasks, &n) !=
			        0 ||
			    kiln_schedule_dp(tasks, n, INFINITY, sa) < 0) {
				fprintf(stderr, "bench_schedule: plan %d does not schedule\n", p);
				return 1;
			}
			n_plans++;
			sum_tasks += n;
			if (n > max_tasks)
				max_tasks = n;
		}
		t_tpl[r] = now_s() - t0;
		kiln_arena_free(sa);
		free(first);
		/* The whole pass: templates, serial baselines, bases, feedback. */
		t0 = now_s();
		if (kiln_pass_interleave(&c) != 0) {
			fprintf(stderr, "bench_schedule: the interleave pass failed\n");
			return 1;
		}
		t_pass[r] = now_s() - t0;
		kiln_arena_free(a);
		/* The whole compilation. */
		t0 = now_s();
		a = kiln_arena_new();
		kiln_model *m = NULL;
		if (!a || kiln_frontend_load_file(model, a, stderr, &m) != 0)
			return 1;
		c = (kiln_compilation){.model = m, .arena = a, .solver = KILN_SOLVER_DP};
		if (kiln_pipeline_compile(&c, NULL, NULL, NULL, stderr) != 0)
			return 1;
		t_all[r] = now_s() - t0;
		kiln_arena_free(a);
	}
	qsort(t_tpl, (size_t)runs, sizeof(double), cmp_double);
	qsort(t_pass, (size_t)runs, sizeof(double), cmp_double);
	qsort(t_all, (size_t)runs, sizeof(double), cmp_double);
	printf("bench_schedule: %s\n", model);
	printf("  %d plan classes, %.1f tasks per template on average, %d at most\n", n_plans,
	       n_plans ? sum_tasks / n_plans : 0.0, max_tasks);
	printf("  schedule every plan class (build + DP): min %.3f s, median %.3f s (target < 1 s)\n",
	       t_tpl[0], t_tpl[runs / 2]);
	printf("  interleave pass (templates, serial, bases, feedback): median %.3f s\n",
	       t_pass[runs / 2]);
	printf("  whole compile: min %.3f s, median %.3f s (target well under 2 s)\n", t_all[0],
	       t_all[runs / 2]);

	/* What overlap buys, from one more compilation. */
	kiln_arena *a = kiln_arena_new();
	kiln_compilation c;
	if (!a || front(model, a, &c) != 0)
		return 1;
	/* First estimates, before feedback overwrites the tables. */
	int32_t n_tab = c.n_sets * c.n_buckets, before_points = 0;
	double first_sum = 0;
	for (int32_t ti = 0; ti < n_tab; ti++) {
		const kiln_plan_table *t = &c.tables[ti];
		before_points += t->n_points;
		for (int32_t k = 0; k < t->n_points; k++)
			first_sum += kiln_plan_table_exposed_us(t, k);
	}
	if (kiln_pass_interleave(&c) != 0)
		return 1;
	const kiln_plan_schedule *s = c.schedule;
	int32_t np = c.pool->n;
	double *ratio = calloc((size_t)(np ? np : 1), sizeof(double));
	if (!ratio)
		return 1;
	int32_t best = 0, worst = 0;
	double hidden = 0, extra_serial = 0;
	for (int32_t p = 0; p < np; p++) {
		const kiln_template *t = &s->templates[p];
		ratio[p] = t->serial_us > 0 ? t->makespan_us / t->serial_us : 1;
		if (ratio[p] < ratio[best])
			best = p;
		if (ratio[p] > ratio[worst])
			worst = p;
		hidden += t->serial_us - t->makespan_us;
		extra_serial += t->serial_us;
	}
	double *sorted = calloc((size_t)(np ? np : 1), sizeof(double));
	if (!sorted)
		return 1;
	memcpy(sorted, ratio, sizeof(double) * (size_t)np);
	qsort(sorted, (size_t)np, sizeof(double), cmp_double);
	printf("  overlapped / serial makespan over %d plan classes: min %.3f, median %.3f, max "
	       "%.3f; mean time saved %.1f%%\n",
	       np, sorted[0], sorted[np / 2], sorted[np - 1], 100.0 * hidden / extra_serial);
	int32_t ex[4] = {best, worst, c.tables[0].plan[c.tables[0].n_points - 1], 0};
	const char *why[4] = {"best", "worst", "max-saving", "keep-all"};
	ex[3] = c.tables[0].plan[0];
	for (int i = 0; i < 4; i++) {
		const kiln_template *t = &s->templates[ex[i]];
		int32_t rec = 0, copies = 0;
		for (int32_t k = 0; k < t->n_tasks; k++) {
			rec += t->tasks[k].kind == KILN_TASK_RECOMPUTE;
			copies += t->tasks[k].kind == KILN_TASK_COPY;
		}
		printf("    %-10s plan %4d stage %d %-5s r %.2f: %2d tasks (%d recompute, %d copies) "
		       "serial %9.1f us, overlapped %9.1f us (%.3f), keep-all %9.1f us\n",
		       why[i], ex[i], t->stage, kiln_ir_layer_kind_name(t->kind), t->load_factor,
		       t->n_tasks, rec, copies, t->serial_us, t->makespan_us, ratio[ex[i]], t->base_us);
	}
	if (per_class) {
		printf("  %5s %5s %-5s %6s %12s %12s %6s\n", "plan", "stage", "kind", "load",
		       "serial_us", "overlap_us", "ratio");
		for (int32_t p = 0; p < np; p++) {
			const kiln_template *t = &s->templates[p];
			printf("  %5d %5d %-5s %6.2f %12.1f %12.1f %6.3f\n", p, t->stage,
			       kiln_ir_layer_kind_name(t->kind), t->load_factor, t->serial_us,
			       t->makespan_us, ratio[p]);
		}
	}
	int32_t after_points = 0;
	double sched_sum = 0;
	int32_t lower = 0, higher = 0, tot = 0;
	for (int32_t ti = 0; ti < n_tab; ti++) {
		const kiln_plan_table *t = &c.tables[ti];
		after_points += t->n_points;
		for (int32_t k = 0; k < t->n_points; k++) {
			double e = t->exposed_us[k], f = t->frontier->points[t->point[k]].exposed_us;
			sched_sum += e;
			lower += e < f - 1e-9;
			higher += e > f + 1e-9;
			tot++;
		}
	}
	printf("  feedback: %d table points before, %d after dropping dominated ones\n", before_points,
	       after_points);
	printf("    of the kept points %d have a lower scheduled exposed time than the first "
	       "estimate, %d a higher one (of %d); mean %.1f us before, %.1f us after\n",
	       lower, higher, tot, before_points ? first_sum / before_points : 0.0,
	       tot ? sched_sum / tot : 0.0);
	kiln_arena_free(a);
	free(ratio);
	free(sorted);
	free(t_tpl);
	free(t_pass);
	free(t_all);
	return 0;
}
