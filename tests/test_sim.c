/* tests/test_sim.c: the simulator's iteration loop and policies (sim/sim.c,
 * sim/policy.c) and `kilnc simulate`.
 *
 * The facts checked hold whatever the numbers: nothing beats infinite
 * memory; a policy that never fails is never slower than recomputing
 * everything; the same seed gives the same result; kiln's memory as the
 * simulator counts it equals what the runtime's accounting API counts; and
 * the statistical method is never more optimistic than the exact per-rank
 * simulation (failures, over-budget decisions, peaks, throughput).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "kiln/runtime.h"
#include "kiln_test.h"
#include "passes/passes.h"
#include "sim/sim.h"

/* c and c2 are copies of kt_compiled's cached compilations (the tests
 * below set one model up several times; each is compiled once per test
 * process); a is the fixture's own arena for load profiles and results. */
typedef struct fixture {
	kiln_arena *a;
	kiln_compilation c, c2;
	unsigned char *blob, *blob2;
	kiln_rt *rt, *rt2, *acct;
} fixture;

static void setup(fixture *f, const char *rel)
{
	memset(f, 0, sizeof *f);
	f->c = *kt_compiled(rel, KILN_SOLVER_DP, false);
	f->c2 = *kt_compiled(rel, KILN_SOLVER_DP, true);
	f->a = kiln_arena_new();
	cr_assert_not_null(f->a);
	size_t len;
	cr_assert_eq(kiln_blob_build(&f->c, stderr, &f->blob, &len), 0);
	cr_assert_eq(kiln_rt_open(f->blob, len, &f->rt), 0);
	cr_assert_eq(kiln_rt_open(f->blob, len, &f->acct), 0);
	cr_assert_eq(kiln_blob_build(&f->c2, stderr, &f->blob2, &len), 0);
	cr_assert_eq(kiln_rt_open(f->blob2, len, &f->rt2), 0);
}

static void teardown(fixture *f)
{
	kiln_rt_close(f->rt);
	kiln_rt_close(f->rt2);
	kiln_rt_close(f->acct);
	free(f->blob);
	free(f->blob2);
	kiln_arena_free(f->a);
}

/* The simulation of c under loads with rt as the kiln policies' blob
 * (NULL: the compilation's own): seed 7, restarts of 284 s, checkpoints
 * every 100 iterations. */
static kiln_sim_config config_of(const kiln_compilation *c, const kiln_rt *rt, kiln_arena *a,
                                 const char *loads, int64_t iters, int exact)
{
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse(loads, c->model->max_factor, a, stderr, &prof), 0);
	return (kiln_sim_config){.c = c,
	                         .rt = rt,
	                         .loads = prof,
	                         .iterations = iters,
	                         .seed = 7,
	                         .restart_s = 284,
	                         .checkpoint_every = 100,
	                         .exact = exact};
}

/* The same for f's model, with both blobs. */
static kiln_sim_config config(fixture *f, const char *loads, int64_t iters, int exact)
{
	kiln_sim_config cfg = config_of(&f->c, f->rt, f->a, loads, iters, exact);
	cfg.c_no_offload = &f->c2;
	cfg.rt_no_offload = f->rt2;
	return cfg;
}

static void run_on(fixture *f, const char *loads, int64_t iters, int exact, int32_t threads,
                   kiln_sim_result *out)
{
	kiln_sim_policy_kind all[KILN_SIM_POLICY_COUNT];
	for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++)
		all[k] = (kiln_sim_policy_kind)k;
	kiln_sim_config cfg = config(f, loads, iters, exact);
	cfg.acct_rt = f->acct;
	cfg.threads = threads;
	cr_assert_eq(kiln_sim_run(&cfg, all, KILN_SIM_POLICY_COUNT, f->a, stderr, out), 0);
}

static void run(fixture *f, const char *loads, int64_t iters, int exact, kiln_sim_result *out)
{
	run_on(f, loads, iters, exact, 0, out);
}

static const char *const MODELS[] = {"examples/models/tiny.yaml",
                                     "examples/models/mixtral-8x22b.yaml"};
static const char *const LOADS[] = {"paper", "hot-rank", "burst", "balanced"};

Test(sim, nothing_beats_unbounded_and_no_failure_free_policy_is_slower_than_full_recompute,
     .timeout = 900, .init = kt_slow)
{
	for (int m = 0; m < 2; m++)
		for (int l = 0; l < 4; l++) {
			fixture f;
			setup(&f, MODELS[m]);
			kiln_sim_result r[KILN_SIM_POLICY_COUNT];
			run(&f, LOADS[l], 15, 0, r);
			const kiln_sim_result *unb = &r[KILN_SIM_UNBOUNDED],
			                      *full = &r[KILN_SIM_FULL_RECOMPUTE];
			cr_assert_eq(unb->ooms, 0);
			for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++) {
				/* megatron-capacity drops expert rows above capacity, so
				 * it does less work than unbounded; without a drop every
				 * load was within capacity and padding only adds rows. */
				if (k == KILN_SIM_MEGATRON_CAPACITY && r[k].dropped_fraction > 0)
					continue;
				cr_assert_leq(unb->iteration_s, r[k].iteration_s * (1 + 1e-12),
				              "%s %s: %s", MODELS[m], LOADS[l],
				              kiln_sim_policy_name((kiln_sim_policy_kind)k));
				cr_assert_geq(unb->tokens_per_s, r[k].tokens_per_s * (1 - 1e-12));
				/* The ablations are switches, not policies: kiln:no-overlap
				 * pays serially for plans chosen for overlap, and can
				 * fall below full recompute (docs/simulator.md). */
				/* A step the paged stash runs twice is a failure
				 * of its own kind (reruns). The stash is not held to
				 * it either way: its copy kernels hold their SMs for
				 * the whole copy (docs/simulator.md), so where its
				 * copies' HBM time exceeds what recomputing the same
				 * tensors takes, stashing is slower than full
				 * recompute (tiny under hot-rank: 0.951x). */
				if (r[k].ooms == 0 && r[k].reruns == 0 &&
				    k < KILN_SIM_KILN_NO_OFFLOAD &&
				    k != KILN_SIM_MEGATRON_PAGED_STASH)
					cr_assert_geq(
					    r[k].tokens_per_s, full->tokens_per_s * (1 - 1e-9),
					    "%s %s: %s is slower than full-recompute without "
					    "failing",
					    MODELS[m], LOADS[l],
					    kiln_sim_policy_name((kiln_sim_policy_kind)k));
			}
			/* kiln never fails within load.max_factor. */
			cr_assert_eq(r[KILN_SIM_KILN].ooms, 0, "%s %s", MODELS[m], LOADS[l]);
			teardown(&f);
		}
}

Test(sim, same_seed_same_result)
{
	fixture f;
	setup(&f, "examples/models/tiny.yaml");
	kiln_sim_result r1[KILN_SIM_POLICY_COUNT], r2[KILN_SIM_POLICY_COUNT];
	run(&f, "paper", 40, 0, r1);
	run(&f, "paper", 40, 0, r2);
	for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++) {
		cr_assert_eq(r1[k].tokens_per_s, r2[k].tokens_per_s);
		cr_assert_eq(r1[k].ooms, r2[k].ooms);
		cr_assert_eq(r1[k].recompute_s, r2[k].recompute_s);
		for (int32_t s = 0; s < r1[k].n_stages; s++)
			cr_assert_eq(r1[k].peak_bytes[s], r2[k].peak_bytes[s]);
	}
	teardown(&f);
}

/* The policies run on threads; the results are the same to the last bit
 * on one thread or several (more threads than CPUs included). */
Test(sim, same_result_on_any_number_of_threads, .timeout = 300, .init = kt_slow)
{
	static const int32_t THREADS[] = {2, 3, 8};
	for (int l = 0; l < 2; l++) {
		fixture f;
		setup(&f, "examples/models/mixtral-8x22b.yaml");
		kiln_sim_result one[KILN_SIM_POLICY_COUNT], r[KILN_SIM_POLICY_COUNT];
		run_on(&f, LOADS[l], 6, 0, 1, one);
		for (int t = 0; t < 3; t++) {
			run_on(&f, LOADS[l], 6, 0, THREADS[t], r);
			for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++) {
				cr_assert_eq(r[k].tokens_per_s, one[k].tokens_per_s, "%s %d threads: %s",
				             LOADS[l], THREADS[t],
				             kiln_sim_policy_name((kiln_sim_policy_kind)k));
				cr_assert_eq(r[k].iteration_s, one[k].iteration_s);
				cr_assert_eq(r[k].ooms, one[k].ooms);
				cr_assert_eq(r[k].recompute_s, one[k].recompute_s);
				cr_assert_eq(r[k].copy_s, one[k].copy_s);
				cr_assert_eq(r[k].over_budget, one[k].over_budget);
				cr_assert_eq(r[k].acct_checks, one[k].acct_checks);
				cr_assert_eq(r[k].acct_mismatches, 0);
				for (int32_t s = 0; s < r[k].n_stages; s++)
					cr_assert_eq(r[k].peak_bytes[s], one[k].peak_bytes[s]);
				cr_assert_eq(r[k].n_last_ops, one[k].n_last_ops);
				cr_assert_eq(memcmp(r[k].last_ops, one[k].last_ops,
				                    sizeof(kiln_pipe_op) * (size_t)r[k].n_last_ops),
				             0);
			}
		}
		teardown(&f);
	}
}

/* kilnc simulate --emit-loads writes the loads the simulator samples, and
 * replaying that file gives the very same simulation (tiny has one EP
 * group, the one written): every factor survives the round trip (%.17g). */
Test(sim, emitted_loads_replay_as_the_profile)
{
	fixture f;
	setup(&f, "examples/models/tiny.yaml");
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse("paper", f.c.model->max_factor, f.a, stderr, &prof), 0);
	kiln_load_shape shape;
	kiln_sim_load_shape(&f.c, &shape);
	/* tiny: ep 4 with 2 local experts, top-2, 256 tokens per micro-batch and
	 * rank (1,024 per EP group), 4 micro-batches, 7 MoE layers */
	cr_assert_eq(shape.ep, 4);
	cr_assert_eq(shape.experts_per_rank, 2);
	cr_assert_eq(shape.tokens, 4 * 2 * 128);
	cr_assert_eq(shape.layers, 7);
	char *path = kt_temp_file(".csv", "", 0);
	FILE *out = fopen(path, "w");
	cr_assert_not_null(out);
	cr_assert_eq(kiln_load_write_csv(prof, &shape, 7, 30, out), 0);
	cr_assert_eq(fclose(out), 0);
	kiln_sim_result a[KILN_SIM_POLICY_COUNT], b[KILN_SIM_POLICY_COUNT];
	run(&f, "paper", 30, 1, a);
	run(&f, path, 30, 1, b);
	for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++) {
		cr_expect_eq(a[k].tokens_per_s, b[k].tokens_per_s, "%s",
		             kiln_sim_policy_name(a[k].policy));
		cr_expect_eq(a[k].ooms, b[k].ooms);
		for (int32_t s = 0; s < a[k].n_stages; s++)
			cr_expect_eq(a[k].peak_bytes[s], b[k].peak_bytes[s]);
	}
	/* The command writes the same rows: a comment, the header, then
	 * 3 iterations x 4 micro-batches x 7 layers x 4 ranks. */
	kt_run r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                          "--iters", "3", "--emit-loads", path, NULL},
	                    NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	FILE *in = fopen(path, "r");
	cr_assert_not_null(in);
	char line[256];
	int lines = 0;
	while (fgets(line, sizeof line, in))
		lines++;
	fclose(in);
	cr_expect_eq(lines, 2 + 3 * 4 * 7 * 4);
	unlink(path);
	free(path);
	teardown(&f);
}

/* kiln's bytes, counted by the simulator, equal the runtime's accounting
 * fed the same events (the check runs at every layer decision). */
Test(sim, kiln_memory_equals_the_runtime_accounting, .init = kt_slow)
{
	for (int m = 0; m < 2; m++) {
		fixture f;
		setup(&f, MODELS[m]);
		kiln_sim_result r[KILN_SIM_POLICY_COUNT];
		run(&f, "paper", 20, 1, r);
		cr_assert_gt(r[KILN_SIM_KILN].acct_checks, 100, "%s", MODELS[m]);
		cr_assert_eq(r[KILN_SIM_KILN].acct_mismatches, 0, "%s", MODELS[m]);
		teardown(&f);
	}
}

/* The statistical method is never more optimistic than exact mode on the
 * same loads (docs/simulator.md, "Scale"): no fewer failures or
 * over-budget decisions, no lower peak, no higher throughput. Exact by
 * construction: an adaptive policy follows every distinct rank; a static
 * policy is timed by the slowest rank of each load bucket and follows
 * every rank whose memory bound could raise a peak or fail. */
static void never_optimistic(const kiln_sim_result *st, const kiln_sim_result *ex, const char *what)
{
	for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++) {
		const char *name = kiln_sim_policy_name((kiln_sim_policy_kind)k);
		cr_assert_geq(st[k].ooms, ex[k].ooms, "%s %s", what, name);
		cr_assert_geq(st[k].over_budget, ex[k].over_budget, "%s %s", what, name);
		cr_assert_geq(st[k].reruns, ex[k].reruns, "%s %s", what, name);
		cr_assert_leq(st[k].tokens_per_s, ex[k].tokens_per_s, "%s %s: %.17g vs %.17g", what,
		              name, st[k].tokens_per_s, ex[k].tokens_per_s);
		cr_assert_geq(st[k].iteration_s, ex[k].iteration_s, "%s %s", what, name);
		for (int32_t s = 0; s < st[k].n_stages; s++)
			cr_assert_geq(st[k].peak_bytes[s], ex[k].peak_bytes[s], "%s %s stage %d",
			              what, name, s);
	}
}

/* The statistical method against the exact per-rank simulation on the
 * synthetic profiles: never more optimistic, and, as it follows every rank
 * that could matter, not less accurate than the tolerances this test held
 * the former method (the four ranks with the most rows, and an envelope
 * for time) to: the same failures, throughput at least 94% of exact, peaks
 * at most 5% above. */
Test(sim, statistical_method_matches_the_exact_simulation, .timeout = 900, .init = kt_slow)
{
	static const char *const cases[][2] = {{"examples/models/tiny.yaml", "burst"},
	                                       {"examples/models/tiny.yaml", "hot-rank"},
	                                       {"examples/models/mixtral-8x22b.yaml", "paper"},
	                                       {"examples/models/mixtral-8x22b.yaml", "zipf:1.2"}};
	for (int ci = 0; ci < 4; ci++) {
		fixture f;
		setup(&f, cases[ci][0]);
		kiln_sim_result ex[KILN_SIM_POLICY_COUNT], st[KILN_SIM_POLICY_COUNT];
		const char *loads = cases[ci][1];
		char what[256];
		snprintf(what, sizeof what, "%s %s", cases[ci][0], loads);
		run(&f, loads, 15, 1, ex);
		run(&f, loads, 15, 0, st);
		never_optimistic(st, ex, what);
		for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++) {
			const char *name = kiln_sim_policy_name((kiln_sim_policy_kind)k);
			cr_assert_eq(st[k].ooms, ex[k].ooms, "%s %s", what, name);
			cr_assert_geq(st[k].tokens_per_s, ex[k].tokens_per_s * 0.94, "%s %s", what,
			              name);
			for (int32_t s = 0; s < st[k].n_stages; s++)
				cr_assert_leq(st[k].peak_bytes[s], ex[k].peak_bytes[s] * 1.05,
				              "%s %s", what, name);
		}
		teardown(&f);
	}
}

/* Traces for the statistical method's test, per (iteration, micro-batch,
 * MoE layer, rank) of a shape with ep >= 8 ranks, m micro-batches and L MoE
 * layers; every sample averages 1 over the ranks (rows are conserved). */
typedef double (*trace_fn)(int64_t it, int32_t i, int32_t l, int32_t r, const kiln_load_shape *sh);

/* Hot experts sharing a rank (the withheld workload): ranks 0 to 3
 * carry 1.35x everywhere, so they have the most rows of the iteration;
 * rank 4 holds two hot experts at 2.5x in the first min(16, m) micro-batches
 * (those in flight together on the first stages) of the first L / 4 layers,
 * and 0.8x elsewhere. Its rows over the iteration average at most
 * 0.25 * 2.5 + 0.75 * 0.8 = 1.225 < 1.35 (DeepSeek-V3: 16 x 14 of 60 x 58
 * samples hot, 0.91), so the four ranks with the most rows leave it out,
 * though it holds the most memory. The other ranks share the rest. */
static double trace_shared(int64_t it, int32_t i, int32_t l, int32_t r, const kiln_load_shape *sh)
{
	(void)it;
	if (r < 4)
		return 1.35;
	double hot = i < 16 && i < sh->microbatches && l < sh->layers / 4 ? 2.5 : 0.8;
	double rest = (sh->ep - 4 * 1.35 - hot) / (sh->ep - 5);
	return r == 4 ? hot : rest > 0 ? rest : 0;
}

/* Hot experts spread over many ranks: every even rank at 1.5x, every odd
 * one at 0.5x. */
static double trace_spread(int64_t it, int32_t i, int32_t l, int32_t r, const kiln_load_shape *sh)
{
	(void)it, (void)i, (void)l, (void)sh;
	return r % 2 == 0 ? 1.5 : 0.5;
}

/* The hot rank moves every micro-batch (and layer, and iteration): rank
 * (i + l + it) mod ep at 2.5x, the others even. */
static double trace_moving(int64_t it, int32_t i, int32_t l, int32_t r, const kiln_load_shape *sh)
{
	return r == (i + l + it) % sh->ep ? 2.5 : (sh->ep - 2.5) / (sh->ep - 1);
}

/* Writes iters iterations of fn for shape sh as a factor trace
 * (docs/simulator.md, "Traces"); returns its path (free it, unlink it). */
static char *write_trace(const kiln_load_shape *sh, int64_t iters, trace_fn fn)
{
	char *path = kt_temp_file(".csv", "", 0);
	FILE *out = fopen(path, "w");
	cr_assert_not_null(out);
	fprintf(out, "iteration,microbatch,layer,rank,factor\n");
	for (int64_t it = 0; it < iters; it++)
		for (int32_t i = 0; i < sh->microbatches; i++)
			for (int32_t l = 0; l < sh->layers; l++)
				for (int32_t r = 0; r < sh->ep; r++)
					fprintf(out, "%lld,%d,%d,%d,%.17g\n", (long long)it, (int)i,
					        (int)l, (int)r, fn(it, i, l, r, sh));
	cr_assert_eq(fclose(out), 0);
	return path;
}

/* The statistical method on the profiles that defeat a method following a
 * few ranks: hot experts sharing a rank, spread over many ranks, moving
 * every micro-batch; on Mixtral (8 ranks per group) and DeepSeek-V3 (64,
 * memory-bound, one group), every policy. The former method, on the same
 * traces (measured with kilnc simulate, --loads and --exact): on DeepSeek-V3
 * with hot experts sharing a rank it reported no failure for
 * kiln:no-offload where exact mode found one in each of the 4 iterations,
 * and peaks up to 38% low; on Mixtral it missed the failures of five static
 * policies. Besides never more optimistic, the exact run must fail
 * somewhere on the shared trace of DeepSeek-V3, or the trace would not
 * test failures: rank 4 holds 2.5x in 16 micro-batches in flight together,
 * more than the plans tuned for 1.2x keep room for. */
Test(sim, statistical_method_is_never_more_optimistic_than_exact, .timeout = 900, .init = kt_slow)
{
	static const char *const models[] = {"examples/models/mixtral-8x22b.yaml",
	                                     "examples/models/deepseek-v3-671b.yaml"};
	static const trace_fn fns[] = {trace_shared, trace_spread, trace_moving};
	static const char *const names[] = {"shared", "spread", "moving"};
	for (int m = 0; m < 2; m++) {
		fixture f;
		setup(&f, models[m]);
		kiln_load_shape sh;
		kiln_sim_load_shape(&f.c, &sh);
		cr_assert_geq(sh.ep, 8);
		for (int t = 0; t < 3; t++) {
			char *path = write_trace(&sh, 2, fns[t]);
			kiln_sim_result ex[KILN_SIM_POLICY_COUNT], st[KILN_SIM_POLICY_COUNT];
			char what[256];
			snprintf(what, sizeof what, "%s %s", models[m], names[t]);
			kiln_sim_policy_kind all[KILN_SIM_POLICY_COUNT];
			for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++)
				all[k] = (kiln_sim_policy_kind)k;
			for (int exact = 0; exact < 2; exact++) {
				kiln_sim_config cfg = config(&f, path, 4, exact);
				cfg.max_groups = 1;
				cr_assert_eq(kiln_sim_run(&cfg, all, KILN_SIM_POLICY_COUNT, f.a,
				                          stderr, exact ? ex : st),
				             0);
			}
			never_optimistic(st, ex, what);
			/* mindspeed's trigger is the EP group's, from the loads
			 * alone: both methods fire it alike. Where a rank is hot
			 * only in some micro-batches (shared), it fires in some
			 * forwards and not in others: the previous forward's
			 * state is exercised both ways. */
			const kiln_sim_result *ms = &ex[KILN_SIM_MINDSPEED];
			cr_assert_eq(st[KILN_SIM_MINDSPEED].triggered, ms->triggered, "%s", what);
			if (t == 0)
				cr_assert(ms->triggered > 0 &&
				              ms->triggered <
				                  4 * (int64_t)sh.microbatches * sh.layers,
				          "%s: mindspeed fired %lld times", what,
				          (long long)ms->triggered);
			if (m == 1 && t == 0) {
				int64_t ooms = 0;
				for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++)
					ooms += ex[k].ooms;
				cr_assert_gt(ooms, 0, "%s: no failure to test", what);
			}
			unlink(path);
			free(path);
		}
		teardown(&f);
	}
}

/* The target, followed exactly: kiln at 95% or more of unbounded,
 * without a failure, on DeepSeek-V3 (one EP group, every rank) under the
 * profiles where ranks stay hot across layers. Before the knee in select
 * (docs/runtime.md, step 7) zipf:1.2 gave 93.9% here: a rank hot in two
 * layers running kept 2.45 GB for 12.0 ms in the first and was left 0.1 GB,
 * 70.6 ms, in the second. */
Test(sim, kiln_reaches_95_percent_of_unbounded_exactly_on_deepseek, .timeout = 900, .init = kt_slow)
{
	static const char *const loads[] = {"zipf:1.2", "hot-rank"};
	fixture f;
	setup(&f, "examples/models/deepseek-v3-671b.yaml");
	for (int l = 0; l < 2; l++) {
		kiln_sim_policy_kind two[] = {KILN_SIM_KILN, KILN_SIM_UNBOUNDED};
		kiln_sim_config cfg = config(&f, loads[l], 5, 1);
		cfg.seed = 1; /* as docs/results.md's exact runs */
		cfg.max_groups = 1;
		kiln_sim_result r[2];
		cr_assert_eq(kiln_sim_run(&cfg, two, 2, f.a, stderr, r), 0);
		cr_assert_eq(r[0].ooms, 0, "%s", loads[l]);
		cr_assert_eq(r[0].over_budget, 0, "%s", loads[l]);
		cr_assert_geq(r[0].tokens_per_s, 0.95 * r[1].tokens_per_s,
		              "%s: kiln at %.2f%% of unbounded", loads[l],
		              100 * r[0].tokens_per_s / r[1].tokens_per_s);
	}
	teardown(&f);
}

/* kiln's static ablation is tuned for the baselines' design load
 * (KILN_BASELINE_DESIGN_LOAD, 1.2), so on loads that stay at or below it on
 * every rank it cannot run out of memory. With the memory options (issue
 * 15) keeping everything fits DeepSeek-V3's stage 9 at load 1 with 93 MiB
 * to spare, and the load-1 steady point, used before, failed every
 * iteration of these calm loads (the largest factor 1.138). */
Test(sim, static_ablation_fits_the_loads_it_is_tuned_for, .timeout = 600, .init = kt_slow)
{
	const char *model = "examples/models/deepseek-v3-671b.yaml";
	char *out;
	char trace[] = "/tmp/kiln-static-XXXXXX";
	int fd = mkstemp(trace);
	cr_assert_geq(fd, 0);
	close(fd);
	int st =
	    kt_sh(&out,
	          "%s simulate %s --iters 3 --seed 1 --emit-loads %s >/dev/null && "
	          "awk -F, '!/^#/ && $1 != \"iteration\" && $5 > m { m = $5 } END { print m }' %s",
	          KILN_KILNC, kt_src(model), trace, trace);
	cr_assert_eq(st, 0, "%s", out);
	double largest = strtod(out, NULL);
	free(out);
	unlink(trace);
	cr_assert(largest > 1.0 && largest <= 1.2, "the loads reach %g", largest);

	fixture f;
	setup(&f, model);
	kiln_sim_policy_kind two[] = {KILN_SIM_KILN_NO_ADAPTIVE, KILN_SIM_KILN_STATIC_SERIAL};
	kiln_sim_config cfg = config(&f, "paper", 3, 0);
	cfg.seed = 1;
	kiln_sim_result r[2];
	cr_assert_eq(kiln_sim_run(&cfg, two, 2, f.a, stderr, r), 0);
	for (int k = 0; k < 2; k++) {
		cr_expect_eq(r[k].ooms, 0, "%s", kiln_sim_policy_name(two[k]));
		for (int32_t s = 0; s < r[k].n_stages; s++)
			cr_expect_leq(r[k].peak_bytes[s], f.c.budgets[s].capacity_bytes,
			              "%s stage %d", kiln_sim_policy_name(two[k]), s);
	}
	teardown(&f);
}

Test(sim, cli_table_json_and_errors)
{
	kt_run r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                          "--policy", "full-recompute,kiln,unbounded",
	                                          "--iters", "10", "--json", NULL},
	                    NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kiln_json *doc = kiln_json_parse(r.out, r.out_len);
	cr_assert_not_null(doc);
	const kiln_json *ps = kiln_json_get(doc, "policies");
	cr_assert_eq(kiln_json_size(ps), 3);
	cr_assert_str_eq(kiln_json_string(kiln_json_get(kiln_json_at(ps, 1), "policy")), "kiln");
	cr_assert_eq(kiln_json_number(kiln_json_get(kiln_json_at(ps, 0), "vs_full_recompute")), 1);
	cr_assert(kiln_json_bool(kiln_json_get(doc, "slack")));
	kiln_json_free(doc);
	kt_run_free(&r);
	r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                   "--policy", "kiln", "--iters", "5", "--no-slack",
	                                   "--json", NULL},
	             NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	doc = kiln_json_parse(r.out, r.out_len);
	cr_assert_not_null(doc);
	cr_assert_not(kiln_json_bool(kiln_json_get(doc, "slack")));
	kiln_json_free(doc);
	kt_run_free(&r);
	r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                   "--policy", "kiln", "--iters", "5", NULL},
	             NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "kiln"), "%s", r.out);
	cr_assert_null(strstr(r.out, "no slack"), "%s", r.out);
	kt_run_free(&r);
	r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                   "--policy", "kiln", "--iters", "5", "--no-slack", NULL},
	             NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "), statistical method (docs/simulator.md), no slack\n"),
	                   "%s", r.out);
	kt_run_free(&r);
	const char *const bad[][8] = {
	    {"simulate", "MODEL", NULL},
	    {"simulate", "MODEL", "--policy", "bogus", NULL},
	    {"simulate", "MODEL", "--policy", "kiln,kiln", NULL},
	    {"simulate", "MODEL", "--policy", "kiln", "--iters", "0", NULL},
	    {"simulate", "MODEL", "--policy", "kiln", "--seed", "-3", NULL},
	    {"simulate", "MODEL", "--policy", "kiln", "--frobnicate", NULL},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		const char *args[9] = {0};
		for (int k = 0; k < 8 && bad[i][k]; k++)
			args[k] = strcmp(bad[i][k], "MODEL") == 0
			              ? kt_src("examples/models/tiny.yaml")
			              : bad[i][k];
		kt_run x = kt_kilnc(args, NULL);
		cr_assert_eq(x.status, 2, "case %zu: %s", i, x.err);
		kt_run_free(&x);
	}
	/* --emit-trace: one complete event per pipeline op of the last
	 * iteration, 2 * p * m per policy (tiny: pp 2, 1F1B). */
	char *trace = kt_temp_file(".json", "", 0);
	r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                   "--policy", "full-recompute,kiln", "--iters", "3",
	                                   "--emit-trace", trace, NULL},
	             NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	FILE *tf = fopen(trace, "r");
	cr_assert_not_null(tf);
	char *text = malloc(1 << 20);
	size_t tlen = fread(text, 1, (1 << 20) - 1, tf);
	fclose(tf);
	kiln_json *tdoc = kiln_json_parse(text, tlen);
	cr_assert_not_null(tdoc, "the trace is JSON");
	const kiln_json *evs = kiln_json_get(tdoc, "traceEvents");
	kiln_arena *ta = kiln_arena_new();
	kiln_model *tm;
	cr_assert_eq(kiln_frontend_load_file(kt_src("examples/models/tiny.yaml"), ta, stderr, &tm),
	             0);
	int complete = 0;
	for (int i = 0; i < kiln_json_size(evs); i++) {
		const char *ph = kiln_json_string(kiln_json_get(kiln_json_at(evs, i), "ph"));
		complete += ph && strcmp(ph, "X") == 0;
	}
	cr_assert_eq(complete, 2 * 2 * tm->pp * tm->micro_batches, "%d events", complete);
	kiln_arena_free(ta);
	kiln_json_free(tdoc);
	free(text);
	unlink(trace);
	free(trace);
	r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                   "--policy", "kiln", "--iters", "2", "--emit-trace",
	                                   "/nonexistent-dir/t.json", NULL},
	             NULL);
	cr_assert_eq(r.status, 1, "%s", r.err);
	kt_run_free(&r);
	/* A bad load profile and a blob of another model are bad input. */
	r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                   "--policy", "kiln", "--loads", "zipf:-1", NULL},
	             NULL);
	cr_assert_eq(r.status, 1, "%s", r.err);
	kt_run_free(&r);
	char *other = kt_temp_file(".kiln", "", 0);
	kt_run c = kt_kilnc((const char *const[]){"compile",
	                                          kt_src("examples/models/llama3-8b-dense.yaml"),
	                                          "-o", other, NULL},
	                    NULL);
	cr_assert_eq(c.status, 0, "%s", c.err);
	kt_run_free(&c);
	r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                   "--policy", "kiln", "--plan", other, NULL},
	             NULL);
	cr_assert_eq(r.status, 1, "%s", r.err);
	cr_assert_not_null(strstr(r.err, "another description"), "%s", r.err);
	kt_run_free(&r);
	unlink(other);
	free(other);
}

/* docs/cli.md, simulate's JSON: "groups" is the EP groups simulated and
 * "groups_total" the job's. tiny.yaml on 16 devices: pp 2, tp 1, so dp 8
 * and 8 / ep 4 = 2 EP groups (by hand). "--restart-s -0" reads back as 0. */
Test(sim, json_reports_the_groups_simulated_and_the_jobs)
{
	char *out = NULL, *yaml = kt_temp_file(".yaml", "", 0);
	cr_assert_eq(kt_sh(&out, "sed 's/devices: 8/devices: 16/' '%s' > '%s'",
	                   kt_src("examples/models/tiny.yaml"), yaml),
	             0);
	free(out);
	const char *groups[] = {NULL, "1", "2", "1000"};
	const double want[] = {2, 1, 2, 2};
	for (int k = 0; k < 4; k++) {
		kt_run r =
		    kt_kilnc((const char *const[]){"simulate", yaml, "--policy", "full-recompute",
		                                   "--iters", "2", "--restart-s", "-0", "--json",
		                                   groups[k] ? "--groups" : NULL, groups[k], NULL},
		             NULL);
		cr_assert_eq(r.status, 0, "%s", r.err);
		kiln_json *doc = kiln_json_parse(r.out, r.out_len);
		cr_assert_not_null(doc, "%s", r.out);
		cr_assert_eq(kiln_json_number(kiln_json_get(doc, "groups")), want[k], "%s", r.out);
		cr_assert_eq(kiln_json_number(kiln_json_get(doc, "groups_total")), 2, "%s", r.out);
		cr_assert_not_null(strstr(r.out, "\"restart_s\":\t0,"), "%s", r.out);
		kiln_json_free(doc);
		kt_run_free(&r);
	}
	unlink(yaml);
	free(yaml);
}

/* Writes text to a temporary .csv trace; the caller unlinks and frees. */
static char *trace_of(const char *text)
{
	return kt_temp_file(".csv", text, strlen(text));
}

/* tiny: ep 4, 2 experts per rank, top-2, so routing puts at most
 * min(2, 2) / 2 * 4 = 4x the balanced rows on one rank (1,024 tokens of a
 * micro-batch entering the group, 512 balanced rows per rank). A trace
 * asking for a factor of 1e9, 1e308 (whose rows overflow a double) or
 * 1e12 tokens is replayed as a factor of 4: the very simulation a trace
 * giving 4 makes, for every policy, and never an out-of-range conversion
 * (before, a SIGSEGV). */
Test(sim, trace_loads_beyond_routing_replay_as_the_routing_maximum, .timeout = 300)
{
	fixture f;
	setup(&f, "examples/models/tiny.yaml");
	static const char *const texts[] = {
	    "iteration,microbatch,layer,rank,factor\n0,1,2,3,4\n",
	    "iteration,microbatch,layer,rank,factor\n0,1,2,3,1e9\n",
	    "iteration,microbatch,layer,rank,factor\n0,1,2,3,1e308\n",
	    "iteration,microbatch,layer,rank,e0,e1\n0,1,2,3,1e12,0\n",
	};
	kiln_sim_result r[4][KILN_SIM_POLICY_COUNT];
	char *paths[4];
	for (int t = 0; t < 4; t++) {
		paths[t] = trace_of(texts[t]);
		run(&f, paths[t], 3, 1, r[t]);
	}
	for (int t = 1; t < 4; t++)
		for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++) {
			const char *name = kiln_sim_policy_name((kiln_sim_policy_kind)k);
			cr_expect_eq(r[t][k].tokens_per_s, r[0][k].tokens_per_s, "%s: %s", texts[t],
			             name);
			cr_expect_eq(r[t][k].ooms, r[0][k].ooms, "%s: %s", texts[t], name);
			for (int32_t s = 0; s < r[0][k].n_stages; s++)
				cr_expect_eq(r[t][k].peak_bytes[s], r[0][k].peak_bytes[s], "%s: %s",
				             texts[t], name);
		}
	/* The factor 4 is a real spike: unbounded holds more than at load 1. */
	kiln_sim_result bal[KILN_SIM_POLICY_COUNT];
	run(&f, "balanced", 3, 1, bal);
	cr_expect_gt(r[0][KILN_SIM_UNBOUNDED].peak_bytes[1], bal[KILN_SIM_UNBOUNDED].peak_bytes[1]);
	/* The command replays them too, with a warning naming the line. */
	kt_run x = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                          "--policy", "all", "--iters", "2", "--loads",
	                                          paths[3], NULL},
	                    NULL);
	cr_expect_eq(x.status, 0, "%s", x.err);
	char want[512];
	snprintf(want, sizeof want,
	         "%s:2: warning: 1000000000000 tokens make load factor 1.95312e+09, more than "
	         "routing can put on one rank",
	         paths[3]);
	cr_expect_not_null(strstr(x.err, want), "%s", x.err);
	kt_run_free(&x);
	for (int t = 0; t < 4; t++) {
		unlink(paths[t]);
		free(paths[t]);
	}
	teardown(&f);
}

/* A compilation built past the frontend (which allows 2^20 micro-batches)
 * with 2^32 + 4 of them: the simulator refuses it with a prefixed message,
 * never simulates 4 (the count cut to 32 bits). */
Test(sim, micro_batch_counts_are_never_truncated)
{
	kt_model t;
	kt_model_init(&t);
	t.m.global_batch = ((int64_t)1 << 32) + 4;
	kt_model_finish(&t);
	cr_assert_eq(t.m.micro_batches, ((int64_t)1 << 32) + 4);
	kiln_arena *a = kiln_arena_new();
	kiln_compilation c = {.model = &t.m, .arena = a};
	cr_assert_eq(kiln_pipeline_compile(&c, NULL, NULL, NULL, stderr), 0);
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse("balanced", 2.0, a, stderr, &prof), 0);
	kiln_sim_config cfg = {.c = &c, .loads = prof, .iterations = 1, .restart_s = 284};
	kiln_sim_policy_kind k = KILN_SIM_UNBOUNDED;
	kiln_sim_result res;
	char *msg = NULL;
	size_t len = 0;
	FILE *err = open_memstream(&msg, &len);
	cr_assert_not_null(err);
	int rc = kiln_sim_run(&cfg, &k, 1, a, err, &res);
	fclose(err);
	cr_expect_eq(rc, -1);
	cr_expect_str_eq(msg, "kilnc: error: simulate: 4294967300 micro-batches per iteration; the "
	                      "simulator takes 1 to 2147483647\n");
	free(msg);
	kiln_arena_free(a);
}

/* --emit-loads writes nothing --loads would refuse, and says so before
 * writing anything (exit 2). tiny: 4 micro-batches x 7 MoE layers x 4
 * ranks = 112 rows per iteration, so 90,000 iterations are 10,080,000 rows
 * (over 10,000,000) and 10^8 are 11,200,000,000 (which would fill a disk
 * rather than finish); 80,000 are 8,960,000 rows of at least 28 bytes each
 * ("7xxxx,m,l,r," is 12 and a 17-digit factor 16 more), over 256 MiB. The
 * byte count is exact: the file of 3 iterations is as long as it says. */
Test(sim, emitted_loads_stay_within_what_loads_reads, .timeout = 300, .init = kt_slow)
{
	char *path = kt_temp_file(".csv", "", 0);
	unlink(path);
	const char *tiny = kt_src("examples/models/tiny.yaml");
	kt_run r = kt_kilnc(
	    (const char *const[]){"simulate", tiny, "--iters", "90000", "--emit-loads", path, NULL},
	    NULL);
	cr_expect_eq(r.status, 2, "%s", r.err);
	cr_expect_not_null(strstr(r.err, "90000 iterations x 4 micro-batches x 7 MoE layers x 4 EP "
	                                 "ranks = 10080000 rows, over the 10000000 rows --loads "
	                                 "reads; use --iters 89285 or fewer"),
	                   "%s", r.err);
	cr_expect_neq(access(path, F_OK), 0, "a file was written");
	kt_run_free(&r);
	r = kt_kilnc((const char *const[]){"simulate", tiny, "--iters", "100000000", "--emit-loads",
	                                   path, "--policy", "kiln", NULL},
	             NULL);
	cr_expect_eq(r.status, 2, "%s", r.err);
	cr_expect_not_null(strstr(r.err, "= 11200000000 rows, over the 10000000 rows"), "%s",
	                   r.err);
	cr_expect_neq(access(path, F_OK), 0, "a file was written");
	kt_run_free(&r);
	r = kt_kilnc(
	    (const char *const[]){"simulate", tiny, "--iters", "80000", "--emit-loads", path, NULL},
	    NULL);
	cr_expect_eq(r.status, 2, "%s", r.err);
	cr_expect_not_null(strstr(r.err, "8960000 rows make "), "%s", r.err);
	cr_expect_not_null(strstr(r.err, "bytes, over the 268435456 bytes (256 MiB) --loads reads"),
	                   "%s", r.err);
	cr_expect_neq(access(path, F_OK), 0, "a file was written");
	kt_run_free(&r);
	/* Exact: what kiln_load_csv_bytes counts is what is written. */
	fixture f;
	setup(&f, "examples/models/tiny.yaml");
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse("paper", 3.0, f.a, stderr, &prof), 0);
	kiln_load_shape shape;
	kiln_sim_load_shape(&f.c, &shape);
	cr_expect_eq(kiln_load_csv_rows(&shape, 3), 3 * 112);
	r = kt_kilnc(
	    (const char *const[]){"simulate", tiny, "--iters", "3", "--emit-loads", path, NULL},
	    NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	cr_expect_eq(kiln_load_csv_bytes(prof, &shape, 1, 3), (int64_t)st.st_size);
	teardown(&f);
	unlink(path);
	free(path);
}

/* A trace recorded with another expert layout (three token columns; tiny
 * has two experts per rank) is bad input: exit 1 with the line. */
Test(sim, trace_of_another_layout_is_refused)
{
	char *path = trace_of("iteration,microbatch,layer,rank,e0,e1,e2\n0,0,0,0,1,2,3\n");
	kt_run r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                          "--policy", "kiln", "--loads", path, NULL},
	                    NULL);
	cr_expect_eq(r.status, 1, "%s", r.err);
	char want[512];
	snprintf(want, sizeof want,
	         "%s:1: error: the header has 3 per-expert token columns, but the model has 2 "
	         "experts per EP rank (ep 4)",
	         path);
	cr_expect_not_null(strstr(r.err, want), "%s", r.err);
	cr_expect_eq(r.out_len, 0, "%s", r.out);
	kt_run_free(&r);
	unlink(path);
	free(path);
}

/* examples/traces/router_log_to_trace.py turns a router log into a token
 * trace. tiny: 4 EP ranks of 2 experts, 1,024 tokens per micro-batch and
 * group, top-2: 2,048 routed rows per micro-batch and MoE layer, 512 per
 * rank balanced. The log (Megatron's 1-based layer numbers 2 to 8 are
 * tiny's seven MoE layers; every second record tagged inside a log line)
 * gives every expert 256 tokens (factor 512 / 512 = 1), except in
 * iteration 1, micro-batch 2, layer 2, where rank 3's experts take 640
 * each (1,280 rows: 2.5) and the others' 128 (256 rows: 0.5). Replayed,
 * that is exactly the simulation of the factor trace written by hand with
 * 2.5 and 0.5 there and 1 elsewhere, without a warning. */
Test(sim, router_log_converts_to_a_trace_that_replays, .timeout = 120)
{
	char *log = kt_temp_file(".log", "", 0);
	FILE *f = fopen(log, "w");
	cr_assert_not_null(f);
	fputs("iteration 0 | lm loss 9.87 | this line is not a record\n", f);
	for (int it = 0; it < 2; it++)
		for (int mb = 0; mb < 4; mb++)
			for (int layer = 2; layer <= 8; layer++)
				for (int r = 0; r < 4; r++) {
					int spike = it == 1 && mb == 2 && layer == 2, e = 256;
					if (spike)
						e = r == 3 ? 640 : 128;
					fprintf(
					    f,
					    "%s{\"iteration\": %d, \"microbatch\": %d, \"layer\": "
					    "%d, "
					    "\"ep_rank\": %d, \"tokens_per_expert\": [%d, %d]}\n",
					    r % 2 ? "[rank 1] kiln-tokens " : "", it, mb, layer, r,
					    e, e);
				}
	cr_assert_eq(fclose(f), 0);
	char *tokens = kt_temp_file(".csv", "", 0);
	char *out = NULL;
	int rc = kt_sh(&out, "/usr/bin/python3 '%s' '%s' -o '%s'",
	               kt_src("examples/traces/router_log_to_trace.py"), log, tokens);
	cr_assert_eq(rc, 0, "%s", out);
	free(out);
	/* The output may not be the log it reads (kilnc's output rule). */
	rc = kt_sh(&out, "/usr/bin/python3 '%s' '%s' -o '%s'",
	           kt_src("examples/traces/router_log_to_trace.py"), log, log);
	cr_expect_eq(rc, 2, "%s", out);
	cr_expect_not_null(strstr(out, "would destroy the log"), "%s", out);
	free(out);
	/* The same loads as factors, by hand. */
	char *factors = kt_temp_file(".csv", "", 0);
	f = fopen(factors, "w");
	cr_assert_not_null(f);
	fputs("iteration,microbatch,layer,rank,factor\n", f);
	for (int it = 0; it < 2; it++)
		for (int mb = 0; mb < 4; mb++)
			for (int l = 0; l < 7; l++)
				for (int r = 0; r < 4; r++)
					fprintf(f, "%d,%d,%d,%d,%s\n", it, mb, l, r,
					        it == 1 && mb == 2 && l == 0
					            ? (r == 3 ? "2.5" : "0.5")
					            : "1");
	cr_assert_eq(fclose(f), 0);
	kt_run a = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                          "--policy", "all", "--iters", "4", "--json",
	                                          "--loads", tokens, NULL},
	                    NULL);
	kt_run b = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                          "--policy", "all", "--iters", "4", "--json",
	                                          "--loads", factors, NULL},
	                    NULL);
	cr_assert_eq(a.status, 0, "%s", a.err);
	cr_assert_eq(b.status, 0, "%s", b.err);
	cr_expect_eq(a.err_len, 0, "warnings on the converted trace:\n%s", a.err);
	kiln_json *ja = kiln_json_parse(a.out, a.out_len), *jb = kiln_json_parse(b.out, b.out_len);
	cr_assert(ja && jb);
	const kiln_json *pa = kiln_json_get(ja, "policies"), *pb = kiln_json_get(jb, "policies");
	cr_assert_eq(kiln_json_size(pa), KILN_SIM_POLICY_COUNT);
	for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++) {
		static const char *const keys[] = {"tokens_per_s", "iteration_s", "ooms",
		                                   "exposed_recompute_s", "exposed_copy_s"};
		for (size_t j = 0; j < sizeof keys / sizeof keys[0]; j++)
			cr_expect_eq(kiln_json_number(kiln_json_get(kiln_json_at(pa, k), keys[j])),
			             kiln_json_number(kiln_json_get(kiln_json_at(pb, k), keys[j])),
			             "%s %s", kiln_sim_policy_name((kiln_sim_policy_kind)k),
			             keys[j]);
		const kiln_json *ka = kiln_json_get(kiln_json_at(pa, k), "peak_bytes"),
		                *kb = kiln_json_get(kiln_json_at(pb, k), "peak_bytes");
		for (int s = 0; s < kiln_json_size(ka); s++)
			cr_expect_eq(kiln_json_number(kiln_json_at(ka, s)),
			             kiln_json_number(kiln_json_at(kb, s)));
	}
	/* The spike is seen: unbounded holds more on stage 0 than balanced. */
	kt_run c = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                          "--policy", "all", "--iters", "4", "--json",
	                                          "--loads", "balanced", NULL},
	                    NULL);
	kiln_json *jc = kiln_json_parse(c.out, c.out_len);
	cr_assert_not_null(jc);
	cr_expect_gt(
	    kiln_json_number(
	        kiln_json_at(kiln_json_get(kiln_json_at(pa, KILN_SIM_UNBOUNDED), "peak_bytes"), 0)),
	    kiln_json_number(kiln_json_at(
	        kiln_json_get(kiln_json_at(kiln_json_get(jc, "policies"), KILN_SIM_UNBOUNDED),
	                      "peak_bytes"),
	        0)));
	kiln_json_free(ja);
	kiln_json_free(jb);
	kiln_json_free(jc);
	kt_run_free(&a);
	kt_run_free(&b);
	kt_run_free(&c);
	/* A record given twice and one with three experts: exit 1, each
	 * error at its line, nothing written. */
	f = fopen(log, "w");
	cr_assert_not_null(f);
	fputs("{\"iteration\": 0, \"microbatch\": 0, \"layer\": 2, \"ep_rank\": 0, "
	      "\"tokens_per_expert\": [1, 2]}\n"
	      "{\"iteration\": 0, \"microbatch\": 0, \"layer\": 2, \"ep_rank\": 0, "
	      "\"tokens_per_expert\": [3, 4]}\n"
	      "{\"iteration\": 0, \"microbatch\": 0, \"layer\": 2, \"ep_rank\": 1, "
	      "\"tokens_per_expert\": [3, 4, 5]}\n",
	      f);
	cr_assert_eq(fclose(f), 0);
	unlink(tokens);
	rc = kt_sh(&out, "/usr/bin/python3 '%s' '%s' -o '%s'",
	           kt_src("examples/traces/router_log_to_trace.py"), log, tokens);
	cr_expect_eq(rc, 1, "%s", out);
	char want[1024];
	snprintf(want, sizeof want,
	         "%s:2: error: a second record for iteration 0, micro-batch 0, layer 2, EP rank 0 "
	         "(the first is on line 1)\n%s:3: error: 3 token counts, but line 1 has 2",
	         log, log);
	cr_expect_not_null(strstr(out, want), "%s", out);
	cr_expect_neq(access(tokens, F_OK), 0, "a trace was written");
	free(out);
	unlink(log);
	unlink(factors);
	free(log);
	free(tokens);
	free(factors);
}

/* Policies pols of c under loads, every rank followed, for iterations,
 * with rt as the kiln policy's blob (NULL: the compilation's own; the
 * blob's policies are not asked for). */
static void run_loads(const kiln_compilation *c, const kiln_rt *rt, const char *loads,
                      int32_t iterations, kiln_arena *a, const kiln_sim_policy_kind *pols,
                      int32_t n, kiln_sim_result *out)
{
	kiln_sim_config cfg = config_of(c, rt, a, loads, iterations, 1);
	cr_assert_eq(kiln_sim_run(&cfg, pols, n, a, stderr, out), 0);
}

/* The same under balanced loads, 2 iterations. */
static void run_balanced(const kiln_compilation *c, kiln_arena *a, const kiln_sim_policy_kind *pols,
                         int32_t n, kiln_sim_result *out)
{
	run_loads(c, NULL, "balanced", 2, a, pols, n, out);
}

/* The pipeline's transfers take the step-time model's send time
 * (docs/simulator.md, "Pipeline and iteration time"). tiny: pp 2, 8
 * devices, nodes of 4, so a stage's 4 ranks fill a node and the two stages
 * talk over the inter-node links, 10 GB/s at the default efficiency 1 (its
 * profile states no time_* figure): one micro-batch's activation, 2 bytes *
 * 256 tokens * 64 = 32,768 bytes, takes 32,768 / 1e4 = 3.2768 us. Under the
 * balanced profile every rank takes its balanced rows, so with unbounded
 * (no plan, no exposure) the iteration is the 1F1B makespan of m = 32 / (2 *
 * 4) = 4 micro-batches of each stage's forward and backward at load 1
 * (kiln_cost_stage_time, the op times the simulator tabulates) with that
 * transfer between the stages: sim/pipeline.c's timing, checked by hand in
 * tests/test_pipeline.c. */
Test(sim, pipeline_transfers_take_the_step_models_send_time)
{
	fixture f;
	setup(&f, "examples/models/tiny.yaml");
	const kiln_ir_graph *g = f.c.graph;
	cr_assert_eq(g->n_stages, 2);
	cr_assert_eq(f.c.model->micro_batches, 4);
	kiln_cost_step st;
	kiln_cost_step_estimate(g, 1.0, NULL, &st);
	cr_expect(fabs(st.p2p_us - 3.2768) < 1e-12, "p2p %.17g us", st.p2p_us);
	double fwd[8], bwd[8];
	for (int32_t s = 0; s < 2; s++) {
		double fs, bs;
		kiln_cost_stage_time(g, s, 1.0, &fs, &bs);
		for (int i = 0; i < 4; i++) {
			fwd[s * 4 + i] = fs;
			bwd[s * 4 + i] = bs;
		}
	}
	kiln_pipe_work pw = {.kind = KILN_PIPE_1F1B,
	                     .p = 2,
	                     .m = 4,
	                     .v = 1,
	                     .fwd_us = fwd,
	                     .bwd_us = bwd,
	                     .p2p_us = 3.2768};
	kiln_pipe_result with, without;
	cr_assert_eq(kiln_pipe_simulate(&pw, f.a, stderr, &with), 0);
	pw.p2p_us = 0;
	cr_assert_eq(kiln_pipe_simulate(&pw, f.a, stderr, &without), 0);
	cr_assert_gt(with.makespan_us, without.makespan_us);
	kiln_sim_policy_kind unb = KILN_SIM_UNBOUNDED;
	kiln_sim_result r;
	run_balanced(&f.c, f.a, &unb, 1, &r);
	cr_expect_eq(r.ooms, 0);
	/* Each stage then ends with its exposed data-parallel traffic and its
	 * optimizer step (tiny's profile has no host time and no EP overlap);
	 * the later of the two ends the iteration. */
	double end = 0;
	for (int32_t s = 0; s < 2; s++) {
		kiln_cost_step_params sp;
		kiln_cost_step_params_of(&f.c.model->hw, &sp);
		kiln_cost_step_dp dp;
		kiln_cost_step_stage_dp(g, s, &sp, &dp);
		double e = with.ops[s * 8 + 7].end_us +
		           kiln_cost_step_dp_exposed_us(&dp, fwd[s * 4], bwd[s * 4 + 3]) +
		           dp.optimizer_us;
		end = e > end ? e : end;
	}
	cr_expect(end > with.makespan_us);
	cr_expect(fabs(r.iteration_s - end * 1e-6) < 1e-9 * r.iteration_s,
	          "iteration %.17g s, pipeline and tails %.17g s", r.iteration_s, end * 1e-6);
	teardown(&f);
}

/* ---- The step's terms in the simulator's iteration (docs/simulator.md,
 * "Pipeline and iteration time"): the host floor per layer, EP overlap's
 * combined steps, exposed data-parallel traffic and the optimizer. */

/* tiny.yaml with each (from, to) of base, then of edits (NULL-terminated
 * pairs; either NULL), replaced once, compiled; the arena in *out_a. */
static kiln_compilation tiny_edited(const char *const *base, const char *const *edits,
                                    kiln_arena **out_a)
{
	FILE *fp = fopen(kt_src("examples/models/tiny.yaml"), "rb");
	cr_assert_not_null(fp);
	static char text[1 << 16];
	size_t len = fread(text, 1, sizeof text - 1, fp);
	fclose(fp);
	text[len] = 0;
	for (int pass = 0; pass < 2; pass++) {
		const char *const *e = pass ? edits : base;
		for (; e && e[0]; e += 2) {
			char *at = strstr(text, e[0]);
			cr_assert_not_null(at, "no %s in tiny.yaml", e[0]);
			size_t a = strlen(e[0]), b = strlen(e[1]);
			cr_assert_lt(len - a + b, sizeof text);
			memmove(at + b, at + a, len - (size_t)(at - text) - a + 1);
			memcpy(at, e[1], b);
			len = len - a + b;
		}
	}
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_model *m = NULL;
	cr_assert_eq(kiln_frontend_load_buffer("tiny-one-stage.yaml", text, len, a, stderr, &m), 0);
	kiln_compilation c = {.model = m, .arena = a, .solver = KILN_SOLVER_DP};
	cr_assert_eq(kiln_pipeline_compile(&c, NULL, NULL, NULL, stderr), 0);
	*out_a = a;
	return c;
}

/* tiny.yaml on one pipeline stage (pp 1: dp 8, two EP groups, m = 32 / (2 *
 * 8) = 2 micro-batches) with 64 MiB per device, then edits. */
static kiln_compilation tiny_one_stage(const char *const *edits, kiln_arena **out_a)
{
	static const char *const base[] = {"memory_gib: 0.009765625", "memory_gib: 0.0625     ",
	                                   "  pp: 2\n", "  pp: 1\n", NULL};
	return tiny_edited(base, edits, out_a);
}

/* Host-bound: with H = time_host_layer_us = 100,000 us, far above any
 * tiny layer's device time (asserted below, recompute included), each of
 * the 8 transformer layers takes H per micro-batch, forward and backward
 * together; the embedding and the output layer (E us together, the
 * device's) take no host floor. On one stage with m = 2 the iteration is
 * 2 * (8 * H + E) plus the optimizer step (the data-parallel traffic, a few
 * hundred us, hides under the 400,000 us backward and forward: asserted).
 * Full recompute re-runs every layer's forward in its backward, still
 * under H: it costs nothing, and its exposed recompute is reported as 0.
 * Without the host floor (tiny's own profile) it is slower than keeping
 * everything, so the test can tell. */
Test(sim, host_floor_decides_and_a_recompute_under_it_is_free)
{
	const char *host[] = {"  inter_node_gbps: 10\n",
	                      "  inter_node_gbps: 10\n  time_host_layer_us: 100000\n", NULL};
	kiln_sim_policy_kind pols[2] = {KILN_SIM_UNBOUNDED, KILN_SIM_FULL_RECOMPUTE};
	for (int with = 0; with < 2; with++) {
		kiln_arena *a;
		kiln_compilation c = tiny_one_stage(with ? host : NULL, &a);
		const kiln_ir_graph *g = c.graph;
		cr_assert_eq(g->n_stages, 1);
		cr_assert_eq(c.model->micro_batches, 2);
		kiln_sim_result r[2];
		run_balanced(&c, a, pols, 2, r);
		cr_expect_eq(r[0].ooms + r[1].ooms, 0);
		if (!with) {
			cr_expect_gt(r[1].iteration_s, r[0].iteration_s * (1 + 1e-6));
			cr_expect_gt(r[1].recompute_s, 0);
			kiln_arena_free(a);
			continue;
		}
		kiln_cost_step_params sp;
		kiln_cost_step_params_of(&c.model->hw, &sp);
		cr_assert_eq(sp.host_layer_us, 1e5);
		double eh = 0, fwd = 0, bwd = 0;
		for (int32_t l = 0; l < g->n_layers; l++) {
			kiln_cost_step_layer_time t;
			kiln_cost_step_layer(g, l, 1.0, &sp, true, &t);
			bool tl = g->layers[l].kind == KILN_LAYER_DENSE ||
			          g->layers[l].kind == KILN_LAYER_MOE;
			if (tl) {
				cr_assert_lt(t.fwd_us + t.bwd_us + t.recompute_us, 1e5);
				fwd += 1e5 * t.fwd_us / (t.fwd_us + t.bwd_us);
				bwd += 1e5 * t.bwd_us / (t.fwd_us + t.bwd_us);
			} else {
				eh += t.fwd_us + t.bwd_us;
				fwd += t.fwd_us;
				bwd += t.bwd_us;
			}
		}
		kiln_cost_step_dp dp;
		kiln_cost_step_stage_dp(g, 0, &sp, &dp);
		cr_assert_lt(dp.reduce_scatter_us, bwd);
		cr_assert_lt(dp.all_gather_us, fwd);
		double want = 2 * (8 * 1e5 + eh) + dp.optimizer_us;
		for (int k = 0; k < 2; k++)
			cr_expect(fabs(r[k].iteration_s * 1e6 - want) < 1e-9 * want,
			          "%s: %.17g vs %.17g us", kiln_sim_policy_name(pols[k]),
			          r[k].iteration_s * 1e6, want);
		cr_expect_eq(r[1].recompute_s, 0);
		kiln_arena_free(a);
	}
}

/* The data-parallel traffic made slow (inter-node links at 0.1 GB/s, 100
 * bytes per us; dp 8 and edp 2 both span tiny's nodes of 4): by hand from
 * the stage's parameters (the forward ops' params_local, dense D and expert
 * X), the gradient reduce-scatter takes 7/8 * D * 2 / 100 + 1/2 * X * 2 /
 * 100 us and the parameter all-gather the same; what exceeds the last
 * micro-batch's backward B and the first one's forward F is exposed. The
 * optimizer reads and writes 34 bytes per element of the device's shard,
 * D / 8 + X / 2, at 100 GB/s (1e5 bytes per us). So the iteration is 2 * (F
 * + B) + (RS - B) + (AG - F) + OPT: the traffic and the optimizer once per
 * iteration (not per micro-batch, not per EP group: two groups, the
 * slower one decides), as kilnc report's step has it too. */
Test(sim, exposed_data_parallel_traffic_and_optimizer_once_per_iteration)
{
	const char *slow[] = {"  inter_node_gbps: 10\n", "  inter_node_gbps: 0.1\n", NULL};
	kiln_arena *a;
	kiln_compilation c = tiny_one_stage(slow, &a);
	const kiln_ir_graph *g = c.graph;
	cr_assert_eq(c.model->dp, 8);
	cr_assert_eq(c.model->edp, 2);
	double dense = 0, expert = 0;
	for (int32_t o = 0; o < g->n_ops; o++)
		if (!g->ops[o].backward)
			*(g->ops[o].expert_params ? &expert : &dense) +=
			    (double)g->ops[o].params_local;
	cr_assert_gt(dense, 0);
	cr_assert_gt(expert, 0);
	double traffic = 7.0 / 8 * dense * 2 / 100 + 1.0 / 2 * expert * 2 / 100;
	double opt = 34 * (dense / 8 + expert / 2) / 1e5;
	double F, B;
	kiln_cost_stage_time(g, 0, 1.0, &F, &B);
	cr_assert_gt(traffic, F + B);
	double want = 2 * (F + B) + (traffic - B) + (traffic - F) + opt;
	kiln_sim_policy_kind unb = KILN_SIM_UNBOUNDED;
	kiln_sim_result r;
	run_balanced(&c, a, &unb, 1, &r);
	cr_expect(fabs(r.iteration_s * 1e6 - want) < 1e-9 * want, "%.17g vs %.17g us",
	          r.iteration_s * 1e6, want);
	kiln_cost_step st;
	kiln_cost_step_estimate(g, 1.0, NULL, &st);
	cr_expect(fabs(st.iteration_s * 1e6 - want) < 1e-9 * want, "step %.17g vs %.17g us",
	          st.iteration_s * 1e6, want);
	kiln_arena_free(a);
}

/* EP overlap on one stage, m = 4 (global batch 64), NVLink made slow (0.5
 * GB/s) so that the MoE layers' all-to-alls outweigh their compute:
 * Megatron's combined 1F1B runs the first forward alone, then three
 * combined steps, then the last backward alone. A combined step pairs the
 * forward's transformer layer q with the backward's layer 7 - q (the
 * backward runs its layers from the last): max(compute, all-to-all) per
 * pair (no host time here), the embedding and the output layer alone. So
 * the iteration is (F + B) + 3 * T + the tail (data-parallel exposure and
 * optimizer), T = sum over q of max(f_q + b_7-q - a2a, a2a), a2a = fa_q +
 * ba_7-q, plus the embedding's and output layer's forward and backward.
 * kilnc report's step pairs each layer with itself (dense layer 0 with
 * dense layer 0), which here costs more: the simulator's sum is the
 * smaller. */
Test(sim, overlap_combined_steps_pair_layers_as_megatron_does)
{
	const char *ov[] = {"  intra_node_gbps: 50\n",
	                    "  intra_node_gbps: 0.5\n",
	                    "  global_batch: 32\n",
	                    "  global_batch: 64\n",
	                    "  schedule: 1f1b\n",
	                    "  schedule: 1f1b\n  overlap_ep_comm: true\n",
	                    NULL};
	kiln_arena *a;
	kiln_compilation c = tiny_one_stage(ov, &a);
	const kiln_ir_graph *g = c.graph;
	cr_assert(c.model->overlap_ep_comm);
	cr_assert_eq(c.model->micro_batches, 4);
	kiln_cost_step_params sp;
	kiln_cost_step_params_of(&c.model->hw, &sp);
	double f[8], b[8], fa[8], ba[8], single = 0, alone = 0, same = 0;
	int32_t n = 0;
	for (int32_t l = 0; l < g->n_layers; l++) {
		kiln_cost_step_layer_time t;
		kiln_cost_step_layer(g, l, 1.0, &sp, false, &t);
		single += t.fwd_us + t.bwd_us;
		if (g->layers[l].kind == KILN_LAYER_EMBED || g->layers[l].kind == KILN_LAYER_HEAD) {
			alone += t.fwd_us + t.bwd_us;
			continue;
		}
		cr_assert_lt(n, 8);
		f[n] = t.fwd_us, b[n] = t.bwd_us, fa[n] = t.fwd_a2a_us, ba[n] = t.bwd_a2a_us;
		double x = t.fwd_a2a_us + t.bwd_a2a_us, y = t.fwd_us + t.bwd_us - x;
		same += y > x ? y : x;
		n++;
	}
	cr_assert_eq(n, 8);
	cr_assert_gt(fa[7] + ba[7], f[7] + b[7] - fa[7] - ba[7]); /* MoE: all-to-all bound */
	double T = alone;
	for (int q = 0; q < 8; q++) {
		double x = fa[q] + ba[7 - q], y = f[q] + b[7 - q] - x;
		T += y > x ? y : x;
	}
	same += alone;
	cr_assert_lt(T, same * (1 - 1e-6));
	double F, B;
	kiln_cost_stage_time(g, 0, 1.0, &F, &B);
	cr_assert(fabs(F + B - single) < 1e-9 * single);
	kiln_cost_step_dp dp;
	kiln_cost_step_stage_dp(g, 0, &sp, &dp);
	double want = single + 3 * T + kiln_cost_step_dp_exposed_us(&dp, F, B) + dp.optimizer_us;
	kiln_sim_policy_kind unb = KILN_SIM_UNBOUNDED;
	kiln_sim_result r;
	run_balanced(&c, a, &unb, 1, &r);
	cr_expect(fabs(r.iteration_s * 1e6 - want) < 1e-9 * want, "%.17g vs %.17g us",
	          r.iteration_s * 1e6, want);
	/* The step: the same form with the same-layer pairs. */
	kiln_cost_step st;
	kiln_cost_step_estimate(g, 1.0, NULL, &st);
	double step = single + 3 * same + st.dp_exposed_us + st.optimizer_us;
	cr_expect(fabs(st.iteration_s * 1e6 - step) < 1e-9 * step);
	kiln_arena_free(a);
}

/* One shipped example priced both ways: anchor A3 (Qwen3-30B-A3B on 16
 * H100, pp 1, HybridEP, EP overlap, h100-sxm's host floor of 6.2 ms per
 * layer) keeping everything under balanced loads. Its 48 layers are alike,
 * so Megatron's pairing of layer q with layer 47 - q prices each combined
 * step as kilnc report's same-layer pairs do, and on one stage the
 * simulator's schedule is the step's form exactly: first forward, m - 1
 * combined steps, last backward, then the exposed data-parallel traffic and
 * the optimizer: the iteration times agree to rounding. (kilnc report
 * prices the run at the natural routing peak, load 1.10; here both take
 * load 1.) */
Test(sim, iteration_equals_the_step_on_a_shipped_anchor, .timeout = 300)
{
	const kiln_compilation *c =
	    kt_compiled("examples/anchors/a3-qwen3-30b-a3b-hybridep.yaml", KILN_SOLVER_DP, false);
	cr_assert_eq(c->graph->n_stages, 1);
	cr_assert(c->model->overlap_ep_comm);
	kiln_cost_step_params sp;
	kiln_cost_step_params_of(&c->model->hw, &sp);
	cr_assert_gt(sp.host_layer_us, 0);
	kiln_arena *a = kiln_arena_new();
	kiln_sim_policy_kind unb = KILN_SIM_UNBOUNDED;
	kiln_sim_result r;
	run_balanced(c, a, &unb, 1, &r);
	kiln_cost_step st;
	kiln_cost_step_estimate(c->graph, 1.0, NULL, &st);
	cr_expect(fabs(r.iteration_s - st.iteration_s) < 1e-9 * st.iteration_s,
	          "simulator %.17g s, step %.17g s", r.iteration_s, st.iteration_s);
	cr_expect(fabs(r.mfu - st.mfu) < 1e-9 * st.mfu, "MFU %.17g vs %.17g", r.mfu, st.mfu);
	kiln_arena_free(a);
}

/* Keep everything where everything fits (issue 18, item 1): tiny on its two
 * stages with 64 MiB per device instead of 10. Checked from the blob first:
 * on each stage, ceil(inflight) micro-batches holding the fixed bytes and
 * every layer's keep_bytes at the last bucket (load.max_factor, 3x) fit in
 * capacity - static - transient, so no decision within the declared loads
 * needs to save and nothing one micro-batch keeps can leave another short;
 * and that much is more than the steady plan's bytes (load 1), so a share
 * that stopped there would bind. Under loads within the declared range,
 * every rank followed, kiln then runs as unbounded does: no exposed copy
 * or recompute, the same iteration time. Until 2026-12-03 the share
 * stopped at the steady plan's bytes, and a micro-batch above load 1 in its
 * earlier layers saved in its later ones with most of the device free
 * (Mixtral under zipf:1.2 ran at 98.4% of unbounded). */
Test(sim, kiln_keeps_everything_where_everything_fits, .timeout = 300)
{
	static const char *const roomy[] = {"memory_gib: 0.009765625", "memory_gib: 0.0625     ",
	                                    NULL};
	kiln_arena *a;
	kiln_compilation c = tiny_edited(roomy, NULL, &a);
	unsigned char *blob;
	size_t len;
	kiln_rt *rt;
	cr_assert_eq(kiln_blob_build(&c, stderr, &blob, &len), 0);
	cr_assert_eq(kiln_rt_open(blob, len, &rt), 0);
	kiln_rt_info info;
	kiln_rt_info_get(rt, &info);
	cr_assert_eq(info.n_stages, 2);
	for (int32_t s = 0; s < info.n_stages; s++) {
		kiln_rt_stage_info si;
		cr_assert_eq(kiln_rt_stage_get(rt, s, &si), 0);
		uint64_t keep = si.fixed_bytes;
		for (int32_t l = 0; l < info.n_model_layers; l++) {
			kiln_rt_layer_info li;
			kiln_rt_table_info ti;
			if (kiln_rt_layer_get(rt, l, &li) != 0 || li.stage != s)
				continue;
			cr_assert_eq(kiln_rt_table_get(rt, l, info.n_buckets - 1, &ti), 0);
			keep += ti.keep_bytes;
		}
		double n = ceil(si.inflight);
		cr_assert_leq(n * (double)keep + (double)si.static_bytes +
		                  (double)si.transient_bytes,
		              (double)si.capacity_bytes, "stage %d", s);
		cr_assert_gt(keep, si.steady_bytes, "stage %d", s);
	}
	static const char *const loads[] = {"hot-rank", "burst", "zipf:1.2"};
	kiln_sim_policy_kind two[] = {KILN_SIM_KILN, KILN_SIM_UNBOUNDED};
	for (int l = 0; l < 3; l++) {
		kiln_sim_result r[2];
		run_loads(&c, rt, loads[l], 3, a, two, 2, r);
		cr_expect_eq(r[0].ooms, 0, "%s", loads[l]);
		cr_expect_eq(r[0].recompute_s, 0, "%s: %g s recompute", loads[l], r[0].recompute_s);
		cr_expect_eq(r[0].copy_s, 0, "%s: %g s copies", loads[l], r[0].copy_s);
		cr_expect(fabs(r[0].iteration_s - r[1].iteration_s) <= 1e-12 * r[1].iteration_s,
		          "%s: kiln %.17g s, unbounded %.17g s", loads[l], r[0].iteration_s,
		          r[1].iteration_s);
	}
	kiln_rt_close(rt);
	free(blob);
	kiln_arena_free(a);
}

/* kiln_sim_config.no_slack changes timing only: the same decisions (so the
 * same failures, over-budget decisions and peaks) and, per layer, the
 * group's largest compute plus its largest exposed time instead of the
 * largest sum; since max(a) + max(b) >= max(a + b), never a shorter
 * iteration. Where every rank has the same load (balanced) the two are the
 * same sum, and a policy that exposes nothing (unbounded) is unchanged
 * everywhere. run is each policy with slack, rn without. */
static void slack_only_times(const kiln_sim_result *r, const kiln_sim_result *rn, int alike,
                             const char *what)
{
	for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++) {
		const char *name = kiln_sim_policy_name((kiln_sim_policy_kind)k);
		cr_assert_eq(rn[k].ooms, r[k].ooms, "%s %s", what, name);
		cr_assert_eq(rn[k].over_budget, r[k].over_budget, "%s %s", what, name);
		cr_assert_eq(rn[k].reruns, r[k].reruns, "%s %s", what, name);
		for (int32_t s = 0; s < r[k].n_stages; s++)
			cr_assert_eq(rn[k].peak_bytes[s], r[k].peak_bytes[s], "%s %s stage %d",
			             what, name, s);
		double a = r[k].iteration_s, b = rn[k].iteration_s;
		cr_assert_geq(b, a * (1 - 1e-12), "%s %s: %.17g vs %.17g", what, name, b, a);
		if (alike || k == KILN_SIM_UNBOUNDED)
			cr_assert_leq(b, a * (1 + 1e-12), "%s %s: %.17g vs %.17g", what, name, b,
			              a);
	}
}

static void run_slack(fixture *f, const char *loads, int64_t iters, int exact, int no_slack,
                      kiln_sim_result *out)
{
	kiln_sim_policy_kind all[KILN_SIM_POLICY_COUNT];
	for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++)
		all[k] = (kiln_sim_policy_kind)k;
	kiln_sim_config cfg = config(f, loads, iters, exact);
	cfg.max_groups = 1;
	cfg.no_slack = no_slack;
	cr_assert_eq(kiln_sim_run(&cfg, all, KILN_SIM_POLICY_COUNT, f->a, stderr, out), 0);
}

Test(sim, no_slack_changes_only_the_time_of_layers_whose_ranks_differ, .timeout = 300)
{
	fixture f;
	setup(&f, "examples/models/tiny.yaml");
	static const char *const loads[] = {"balanced", "paper", "hot-rank", "zipf:1.2"};
	for (int l = 0; l < 4; l++)
		for (int exact = 0; exact < 2; exact++) {
			kiln_sim_result r[KILN_SIM_POLICY_COUNT], rn[KILN_SIM_POLICY_COUNT];
			char what[64];
			snprintf(what, sizeof what, "tiny %s exact %d", loads[l], exact);
			run_slack(&f, loads[l], 3, exact, 0, r);
			run_slack(&f, loads[l], 3, exact, 1, rn);
			slack_only_times(r, rn, l == 0, what);
		}
	teardown(&f);
}

/* On DeepSeek-V3 under a shared hot trace both ways, and the statistical
 * method still never more optimistic than the exact one without slack; at
 * least one policy exposes time on a rank other than the slowest (measured:
 * kiln, 99.71 s against 101.02 s per iteration under zipf:1.2, 3
 * iterations), so the option is seen to act. */
Test(sim, no_slack_on_deepseek_is_never_shorter_and_statistical_stays_pessimistic, .timeout = 900,
     .init = kt_slow)
{
	fixture f;
	setup(&f, "examples/models/deepseek-v3-671b.yaml");
	kiln_load_shape sh;
	kiln_sim_load_shape(&f.c, &sh);
	char *path = write_trace(&sh, 2, trace_shared);
	kiln_sim_result ex[KILN_SIM_POLICY_COUNT], exn[KILN_SIM_POLICY_COUNT];
	kiln_sim_result st[KILN_SIM_POLICY_COUNT], stn[KILN_SIM_POLICY_COUNT];
	run_slack(&f, path, 2, 1, 0, ex);
	run_slack(&f, path, 2, 1, 1, exn);
	run_slack(&f, path, 2, 0, 0, st);
	run_slack(&f, path, 2, 0, 1, stn);
	slack_only_times(ex, exn, 0, "deepseek shared exact");
	slack_only_times(st, stn, 0, "deepseek shared statistical");
	never_optimistic(stn, exn, "deepseek shared, no slack");
	unlink(path);
	free(path);
	kiln_sim_result z[KILN_SIM_POLICY_COUNT], zn[KILN_SIM_POLICY_COUNT];
	run_slack(&f, "zipf:1.2", 3, 0, 0, z);
	run_slack(&f, "zipf:1.2", 3, 0, 1, zn);
	slack_only_times(z, zn, 0, "deepseek zipf:1.2");
	double longer = 0;
	for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++)
		longer += zn[k].iteration_s - z[k].iteration_s;
	cr_assert_gt(longer, 0, "no policy is slower without slack");
	teardown(&f);
}
