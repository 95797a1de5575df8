/* bench/bench_select.c: what the runtime costs on the critical path.
 *
 * Compiles a model (default kimi-k2-1t), writes its blob in memory and
 * prints: the blob's size (target under 256 KiB for kimi-k2-1t), the time of
 * kiln_rt_open (median of 200), and the time of kiln_rt_select per call over
 * 10 million random queries across every stage and layer (loads from 0 to
 * 1.2 x max_factor, per-expert token vectors, free memory from nothing to
 * the stage's capacity): median and p99 per call (targets: under 50 ns and
 * under 200 ns), from the time-stamp counter around each call minus the cost
 * of reading it, and the mean from the wall clock over the whole run.
 * Prints its numbers; asserts nothing.
 *
 * usage: bench_select [MODEL] [QUERIES]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "kiln/runtime.h"
#include "passes/passes.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

#if defined(__x86_64__)
static inline uint64_t ticks(void)
{
	return __builtin_ia32_rdtsc();
}
#else
static inline uint64_t ticks(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#endif

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

#define POOL 4096 /* distinct queries, cycled (about 300 KiB with their token vectors) */
#define EXPERTS 8
#define GROUP 8 /* ranks of an EP group, for the queries with group counts */

/* Times n_queries calls over the pool qs (cycled), printing the median,
 * p99 and p99.9 per call from the time-stamp counter (less the cost of
 * reading it twice) and the wall clock with and without the timing. */
static void time_queries(const kiln_rt *rt, const kiln_query *qs, long n_queries,
                         uint64_t *per_call, const char *label)
{
	uint64_t overhead = UINT64_MAX;
	for (int i = 0; i < 100000; i++) {
		uint64_t t0 = ticks();
		uint64_t d = ticks() - t0;
		overhead = d < overhead ? d : overhead;
	}
	double tick_t0 = now_s();
	uint64_t tick0 = ticks();
	kiln_plan p;
	uint64_t checksum = 0;
	double w0 = now_s();
	for (long i = 0; i < n_queries; i++) {
		const kiln_query *q = &qs[i & (POOL - 1)];
		uint64_t t0 = ticks();
		kiln_rt_select(rt, q, &p);
		uint64_t d = ticks() - t0;
		per_call[i] = d > overhead ? d - overhead : 0;
		checksum += (uint64_t)p.plan;
	}
	double wall = now_s() - w0;
	double ns_per_tick = (now_s() - tick_t0) * 1e9 / (double)(ticks() - tick0);
	qsort(per_call, (size_t)n_queries, sizeof(uint64_t), cmp_u64);
	double med = per_call[n_queries / 2] * ns_per_tick;
	double p99 = per_call[(size_t)(n_queries * 0.99)] * ns_per_tick;
	double p999 = per_call[(size_t)(n_queries * 0.999)] * ns_per_tick;
	printf("kiln_rt_select, %s, over %ld random queries:\n", label, n_queries);
	printf("  per call: median %.1f ns (target < 50), p99 %.1f ns (target < 200), p99.9 %.1f "
	       "ns\n",
	       med, p99, p999);
	printf("  wall clock: %.1f ns per call including the timing itself (checksum %llu)\n",
	       wall * 1e9 / (double)n_queries, (unsigned long long)checksum);
	/* Without the per-call timing: the loop alone. */
	w0 = now_s();
	for (long i = 0; i < n_queries; i++) {
		kiln_rt_select(rt, &qs[i & (POOL - 1)], &p);
		checksum += (uint64_t)p.plan;
	}
	wall = now_s() - w0;
	printf("  untimed loop: %.1f ns per call (checksum %llu)\n", wall * 1e9 / (double)n_queries,
	       (unsigned long long)checksum);
}

int main(int argc, char **argv)
{
	const char *model = KILN_SOURCE_DIR "/examples/models/kimi-k2-1t.yaml";
	long n_queries = 10000000;
	for (int i = 1; i < argc; i++) {
		if (argv[i][0] >= '0' && argv[i][0] <= '9')
			n_queries = atol(argv[i]);
		else
			model = argv[i];
	}
	if (n_queries < 1000 || n_queries > 1000000000) {
		fprintf(stderr, "bench_select: QUERIES must be 1000..1e9\n");
		return 2;
	}
	kiln_arena *a = kiln_arena_new();
	kiln_model *m = NULL;
	if (!a || kiln_frontend_load_file(model, a, stderr, &m) != 0)
		return 1;
	kiln_compilation c = {.model = m, .arena = a};
	if (kiln_pipeline_compile(&c, NULL, NULL, NULL, stderr) != 0)
		return 1;
	unsigned char *blob;
	size_t len;
	if (kiln_blob_build(&c, stderr, &blob, &len) != 0)
		return 1;
	printf("model %s: blob %zu bytes (%.1f KiB; target < 256 KiB)\n", m->name, len, len / 1024.0);

	/* kiln_rt_open: validation of every byte, CRC included. */
	enum { OPENS = 200 };
	double t_open[OPENS];
	kiln_rt *rt = NULL;
	for (int i = 0; i < OPENS; i++) {
		double t0 = now_s();
		if (kiln_rt_open(blob, len, &rt) != 0)
			return 1;
		t_open[i] = now_s() - t0;
		if (i < OPENS - 1)
			kiln_rt_close(rt);
	}
	qsort(t_open, OPENS, sizeof(double), cmp_double);
	printf("kiln_rt_open: median %.1f us, min %.1f us (%d runs)\n", t_open[OPENS / 2] * 1e6,
	       t_open[0] * 1e6, OPENS);

	/* Random queries over every planned layer of every stage. */
	kiln_rt_info info;
	kiln_rt_info_get(rt, &info);
	int32_t *layers = malloc(sizeof(int32_t) * (size_t)info.n_model_layers);
	int32_t n_layers = 0;
	for (int32_t l = 0; l < info.n_model_layers; l++) {
		kiln_rt_layer_info li;
		if (kiln_rt_layer_get(rt, l, &li) == 0)
			layers[n_layers++] = l;
	}
	kiln_query *qs = calloc(POOL, sizeof *qs);
	uint32_t *tokens = calloc((size_t)POOL * EXPERTS, sizeof(uint32_t));
	uint32_t *group = calloc((size_t)POOL * GROUP, sizeof(uint32_t));
	if (!qs || !tokens || !group || !n_layers)
		return 1;
	for (int i = 0; i < POOL; i++) {
		kiln_rt_layer_info li;
		kiln_rt_stage_info si;
		int32_t l = layers[next() % (uint64_t)n_layers];
		kiln_rt_layer_get(rt, l, &li);
		kiln_rt_stage_get(rt, li.stage, &si);
		double r = (double)(next() % 1000000) / 1e6 * 1.2 * info.max_factor;
		uint64_t rows = (uint64_t)(r * (double)li.balanced_rows);
		uint32_t *t = tokens + (size_t)i * EXPERTS;
		for (int e = 0; e < EXPERTS; e++)
			t[e] = (uint32_t)(rows / EXPERTS + (e < (int)(rows % EXPERTS)));
		qs[i] = (kiln_query){.stage = li.stage,
		                     .layer = l,
		                     .tokens = t,
		                     .n_tokens = EXPERTS,
		                     .free_bytes = next() % (si.capacity_bytes + 1),
		                     .pending = (uint32_t)(next() % 4 == 0)};
	}

	uint64_t *per_call = malloc(sizeof(uint64_t) * (size_t)n_queries);
	if (!per_call)
		return 1;
	printf("queries over %d layers of %d stages, %d experts per query\n", n_layers,
	       info.n_stages, EXPERTS);
	time_queries(rt, qs, n_queries, per_call, "no group counts");
	/* The same queries with an EP group of GROUP ranks' rows (this rank's
	 * and GROUP - 1 others drawn as the loads above): step 8 of select (the
	 * group's slowest rank) decides the most loaded rank's point too. */
	for (int i = 0; i < POOL; i++) {
		kiln_rt_layer_info li;
		kiln_rt_layer_get(rt, qs[i].layer, &li);
		uint32_t *g = group + (size_t)i * GROUP;
		uint64_t mine = 0;
		for (int e = 0; e < EXPERTS; e++)
			mine += qs[i].tokens[e];
		g[0] = (uint32_t)mine;
		for (int r = 1; r < GROUP; r++) {
			double x = (double)(next() % 1000000) / 1e6 * 1.2 * info.max_factor;
			g[r] = (uint32_t)(x * (double)li.balanced_rows);
		}
		qs[i].group_rows = g;
		qs[i].group_size = GROUP;
	}
	time_queries(rt, qs, n_queries, per_call, "with the counts of an EP group of 8 ranks");
	free(per_call);
	free(qs);
	free(tokens);
	free(group);
	free(layers);
	kiln_rt_close(rt);
	free(blob);
	kiln_arena_free(a);
	return 0;
}
