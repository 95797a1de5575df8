/* tests/test_trainer.c: examples/trainer, the CPU MoE trainer that embeds
 * the runtime, run under MPI on four processes as a user would run it. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/runtime.h"
#include "kiln_test.h"

#ifndef KILN_TRAINER
/* Built without MPI (CMake found none): the trainer does not exist. make
 * test installs Open MPI first, so CI always runs the tests below. */
Test(trainer, skipped_without_mpi)
{
	cr_skip_test("examples/trainer was not built: MPI not found");
}
#else

/* Routing spikes on 5 of 20 steps: every token of steps 4 and 11 to experts
 * 0 and 1 (both on EP rank 0: load factor 2, the model's load.max_factor),
 * 80% to expert 5 on steps 7 and 15, 60% to experts 2 and 6 on step 18. */
#define SPIKES "--spike 4,11:1.0:0+1 --spike 7,15:0.8:5 --spike 18:0.6:2+6"

static char *compile_plan(void)
{
	char *path = kt_temp_file(".kiln", "", 0);
	const char *args[] = {"compile", kt_src("examples/trainer/trainer.yaml"), "-o", path, NULL};
	kt_run r = kt_kilnc(args, NULL);
	cr_assert_eq(r.status, 0, "kilnc compile trainer.yaml: %s", r.err);
	kt_run_free(&r);
	return path;
}

/* mpirun -np np kiln-trainer --plan plan ARGS. Open MPI's own allocations
 * are left to the leak suppressions (tests/lsan.supp): they resolve only
 * with full unwinding and with its components kept loaded. */
static int trainer(char **out, int np, const char *plan, const char *args)
{
	char supp[4096];
	snprintf(supp, sizeof supp, "%s", kt_src("tests/lsan.supp"));
	return kt_sh(out,
	             "env OMPI_MCA_mca_base_component_disable_dlclose=1 "
	             "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:fast_unwind_on_malloc=0 "
	             "LSAN_OPTIONS=suppressions=%s timeout 600 %s --oversubscribe %s -np %d %s "
	             "--plan %s --quiet %s",
	             supp, KILN_MPIEXEC, geteuid() == 0 ? "--allow-run-as-root" : "", np,
	             KILN_TRAINER, plan, args);
}

/* The trainer on 4 processes with --loads of a trace holding text exits 1
 * saying want. */
static void bad_trace(const char *plan, const char *text, const char *want)
{
	char *csv = kt_temp_file(".csv", text, strlen(text));
	char args[512], *out;
	snprintf(args, sizeof args, "--loads %s", csv);
	int st = trainer(&out, 4, plan, args);
	cr_expect_eq(st, 1, "%s", out);
	cr_expect(strstr(out, want), "%s", out);
	free(out);
	unlink(csv);
	free(csv);
}

typedef struct step_log {
	char loss_hex[64];
	char grad_fnv[256];
	double loss, max_load, decisions, recomputed, offloaded, over_budget;
} step_log;

static double num_after(const char *line, const char *key)
{
	const char *p = strstr(line, key);
	cr_assert_not_null(p, "no %s in %s", key, line);
	return strtod(p + strlen(key), NULL);
}

static void text_between(const char *line, const char *open, char close, char *out, size_t cap)
{
	const char *p = strstr(line, open);
	cr_assert_not_null(p, "no %s in %s", open, line);
	p += strlen(open);
	const char *e = strchr(p, close);
	cr_assert_not_null(e);
	cr_assert_lt((size_t)(e - p), cap);
	memcpy(out, p, (size_t)(e - p));
	out[e - p] = '\0';
}

/* Reads the trainer's --log (one JSON object per step); returns the steps. */
static int read_log(const char *path, step_log *out, int cap)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "no log %s", path);
	char line[4096];
	int n = 0;
	while (fgets(line, sizeof line, f)) {
		cr_assert_lt(n, cap);
		step_log *s = &out[n++];
		cr_assert_eq((int)num_after(line, "\"step\": "), n);
		text_between(line, "\"loss_hex\": \"", '"', s->loss_hex, sizeof s->loss_hex);
		text_between(line, "\"grad_fnv\": [", ']', s->grad_fnv, sizeof s->grad_fnv);
		s->loss = num_after(line, "\"loss\": ");
		s->max_load = num_after(line, "\"max_load\": ");
		s->decisions = num_after(line, "\"decisions\": ");
		s->recomputed = num_after(line, "\"recomputed\": ");
		s->offloaded = num_after(line, "\"offloaded\": ");
		s->over_budget = num_after(line, "\"over_budget\": ");
	}
	fclose(f);
	return n;
}

/* One line of the trainer's --unit-log (docs/trainer.md). */
typedef struct unit_line {
	int step, mb, layer, unit, action;
	long rows;
	unsigned long long bytes;
	char name[64];
} unit_line;

/* Rank rank's unit log under prefix, opened (path gets its name). */
static FILE *open_unit_log(const char *prefix, int rank, char *path, size_t cap)
{
	snprintf(path, cap, "%s.%d", prefix, rank);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	return f;
}

/* The next line of a unit log into u; 0 at the end. */
static int next_unit(FILE *f, unit_line *u)
{
	return fscanf(f, "%d %d %d %d %63s %ld %llu %d", &u->step, &u->mb, &u->layer, &u->unit,
	              u->name, &u->rows, &u->bytes, &u->action) == 8;
}

/* Keeping everything in a large arena and following kiln's plans in the
 * stage's real budget give the same losses and the same gradients, bit for
 * bit, over 20 steps with spikes: recomputing re-runs the same forward op on
 * the same bytes, and offloading copies bytes out and back. */
Test(trainer, kiln_is_bitwise_identical_to_keeping_everything, .timeout = 1800, .init = kt_slow)
{
	char *plan = compile_plan();
	char *keep_log = kt_temp_file(".jsonl", "", 0), *kiln_log = kt_temp_file(".jsonl", "", 0);
	char args[1024], *out;
	snprintf(args, sizeof args, "--policy keep --arena 1G --steps 20 " SPIKES " --log %s",
	         keep_log);
	int st = trainer(&out, 4, plan, args);
	cr_assert_eq(st, 0, "keep run failed:\n%s", out);
	free(out);
	snprintf(args, sizeof args, "--policy kiln --steps 20 " SPIKES " --log %s", kiln_log);
	st = trainer(&out, 4, plan, args);
	cr_assert_eq(st, 0, "kiln run failed:\n%s", out);
	cr_expect(strstr(out, "0 out-of-memory failures"), "%s", out);
	free(out);

	step_log k[32], l[32], m[32];
	cr_assert_eq(read_log(keep_log, k, 32), 20);
	cr_assert_eq(read_log(kiln_log, l, 32), 20);

	/* kiln's plans here recompute only cheap elementwise units and offload the
	 * rest; --policy mixed cycles every action over every unit, so every
	 * recompute path (attention's two outputs together and alone, the
	 * residual, the router, the row map, the re-run dispatch, the experts) is
	 * compared too. */
	snprintf(args, sizeof args, "--policy mixed --arena 1G --steps 20 " SPIKES " --log %s",
	         kiln_log);
	st = trainer(&out, 4, plan, args);
	cr_assert_eq(st, 0, "mixed run failed:\n%s", out);
	free(out);
	cr_assert_eq(read_log(kiln_log, m, 32), 20);
	for (int i = 0; i < 20; i++) {
		cr_expect_str_eq(m[i].loss_hex, k[i].loss_hex, "mixed: loss of step %d", i + 1);
		cr_expect_str_eq(m[i].grad_fnv, k[i].grad_fnv, "mixed: gradients of step %d",
		                 i + 1);
		cr_expect_gt(m[i].recomputed, 200);
		cr_expect_gt(m[i].offloaded, 200);
	}
	double recomputed = 0, offloaded = 0;
	for (int i = 0; i < 20; i++) {
		cr_expect_str_eq(l[i].loss_hex, k[i].loss_hex, "loss of step %d", i + 1);
		cr_expect_str_eq(l[i].grad_fnv, k[i].grad_fnv, "gradients of step %d", i + 1);
		cr_expect_eq(k[i].decisions, 0); /* keep never asks */
		/* 2 stages x 2 ranks x 8 micro-batches x 2 layers */
		cr_expect_eq(l[i].decisions, 64);
		cr_expect_eq(l[i].over_budget, 0);
		recomputed += l[i].recomputed;
		offloaded += l[i].offloaded;
	}
	/* The plans did more than keep: the comparison means something. */
	cr_expect_gt(recomputed, 0);
	cr_expect_gt(offloaded, 0);
	/* Steps 4 and 11 send every row to one EP rank: load 2x. */
	cr_expect_float_eq(l[3].max_load, 2.0, 1e-9);
	cr_expect_float_eq(l[10].max_load, 2.0, 1e-9);
	/* It learns: ln 256 = 5.55 at the start, well below after 20 steps. */
	cr_expect_gt(l[0].loss, 5.0);
	cr_expect_lt(l[19].loss, l[0].loss - 1.0);
	unlink(keep_log);
	unlink(kiln_log);
	unlink(plan);
	free(keep_log);
	free(kiln_log);
	free(plan);
}

/* In the stage's real budget (capacity minus static bytes), keeping
 * everything fits calm steps but overflows on the first spike, with the
 * out-of-memory message and exit status 3; kiln runs the same steps with
 * no failure. */
Test(trainer, spike_overflows_keep_everything_but_not_kiln, .timeout = 1800, .init = kt_slow)
{
	char *plan = compile_plan(), *out;
	int st = trainer(&out, 4, plan, "--policy keep --steps 3");
	cr_assert_eq(st, 0, "keep-everything should fit calm steps:\n%s", out);
	free(out);

	st = trainer(&out, 4, plan, "--policy keep --steps 5 " SPIKES);
	cr_expect_eq(st, 3, "%s", out);
	cr_expect(strstr(out, "out of memory: step 4 "), "%s", out);
	cr_expect(strstr(out, "(policy keep)"), "%s", out);
	cr_expect_null(strstr(out, "kiln-trainer: done"), "%s", out);
	free(out);

	st = trainer(&out, 4, plan, "--policy kiln --steps 5 " SPIKES);
	cr_expect_eq(st, 0, "%s", out);
	cr_expect(strstr(out, "done: 5 steps, 0 out-of-memory failures"), "%s", out);
	cr_expect_null(strstr(out, "out of memory:"), "%s", out);
	free(out);
	unlink(plan);
	free(plan);
}

/* The group fallback (docs/runtime.md, "Beyond the declared load"): with
 * trainer.yaml compiled at load.max_factor 1, step 4's spike (every token
 * to experts 0 and 1, both on EP rank 0: load factor 2, twice the declared
 * load) overflows keep-everything, and kiln, whose ranks exchange their
 * rows and fall back together, survives it. (Before the group fallback kiln
 * itself ran out of memory there: step 4, micro-batch 1, layer 1,
 * moe.expert_act; measured with the trainer of commit 8e40aaf.) */
Test(trainer, spike_at_twice_max_factor_survives_by_the_group_fallback, .timeout = 1800)
{
	FILE *f = fopen(kt_src("examples/trainer/trainer.yaml"), "r");
	cr_assert_not_null(f);
	char text[16384];
	size_t len = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	text[len] = '\0';
	char *at = strstr(text, "max_factor: 2.0");
	cr_assert_not_null(at);
	memcpy(at, "max_factor: 1.0", 15);
	char *model = kt_temp_file(".yaml", text, len);
	char *plan = kt_temp_file(".kiln", "", 0);
	const char *compile[] = {"compile", model, "-o", plan, NULL};
	kt_run r = kt_kilnc(compile, NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	char *out;
	int st = trainer(&out, 4, plan, "--policy keep --steps 4 --spike 4:1.0:0+1");
	cr_expect_eq(st, 3, "%s", out);
	cr_expect(strstr(out, "out of memory: step 4 "), "%s", out);
	free(out);
	char *keep_log = kt_temp_file(".jsonl", "", 0), *kiln_log = kt_temp_file(".jsonl", "", 0);
	char *prefix = kt_temp_file(".units", "", 0), args[2048];
	snprintf(args, sizeof args, "--policy keep --arena 1G --steps 5 --spike 4:1.0:0+1 --log %s",
	         keep_log);
	st = trainer(&out, 4, plan, args);
	cr_assert_eq(st, 0, "%s", out);
	free(out);
	snprintf(args, sizeof args,
	         "--policy kiln --steps 5 --spike 4:1.0:0+1 --log %s --unit-log %s", kiln_log,
	         prefix);
	st = trainer(&out, 4, plan, args);
	cr_expect_eq(st, 0, "%s", out);
	cr_expect(strstr(out, "done: 5 steps, 0 out-of-memory failures"), "%s", out);
	free(out);
	/* The group's plan of each layer, from the blob's record (which plan
	 * it is, is tests/test_group.c's business). On step 4 the spike sends
	 * all 512 rows of a stage to EP rank 0 (load 2, past max_factor 1), so
	 * at every layer whose fit_rows is below 512 every one of the 8 x 2
	 * decisions of every rank takes it, unit for unit (the unit log shows
	 * each unit's action). On any step the two EP ranks of a stage (ranks
	 * 2s and 2s + 1) recompute moe.expert_in alike or not at all, since its
	 * recompute re-runs the dispatch, a collective both must call. And the
	 * steps stay bit for bit those of keeping everything. */
	kiln_rt *rt;
	cr_assert_eq(kiln_rt_open_file(plan, &rt), 0);
	const uint8_t *gacts[4] = {NULL};
	int falls = 0;
	for (int layer = 0; layer < 4; layer++) {
		kiln_rt_group_info gi;
		cr_assert_eq(kiln_rt_group_get(rt, layer, &gi), 0);
		int32_t n, tpl;
		if (gi.plan >= 0 && gi.fit_rows < 512) {
			cr_assert_eq(kiln_rt_plan_get(rt, gi.plan, &gacts[layer], &n, &tpl), 0);
			falls++;
		}
	}
	cr_assert_gt(falls, 0,
	             "no layer takes the group's plan at 512 rows: the test shows nothing");
	int ein[6][8][4][2], taken = 0;
	memset(ein, 0, sizeof ein);
	for (int rank = 0; rank < 4; rank++) {
		char path[4200];
		FILE *log = open_unit_log(prefix, rank, path, sizeof path);
		unit_line u;
		while (next_unit(log, &u)) {
			cr_assert(u.step >= 1 && u.step <= 5 && u.mb >= 0 && u.mb < 8 &&
			          u.layer >= 0 && u.layer < 4);
			if (!strcmp(u.name, "moe.expert_in"))
				ein[u.step][u.mb][u.layer][rank % 2] =
				    u.action == KILN_RT_RECOMPUTE;
			if (u.step == 4 && gacts[u.layer]) {
				cr_expect_eq(u.action, gacts[u.layer][u.unit],
				             "step 4 rank %d micro-batch %d layer %d %s: not the "
				             "group's plan",
				             rank, u.mb, u.layer, u.name);
				taken++;
			}
		}
		cr_assert(feof(log), "%s: unreadable line", path);
		fclose(log);
		unlink(path);
	}
	cr_assert_gt(taken, 0);
	kiln_rt_close(rt);
	for (int step = 1; step <= 5; step++)
		for (int m = 0; m < 8; m++)
			for (int layer = 0; layer < 4; layer++)
				cr_expect_eq(ein[step][m][layer][0], ein[step][m][layer][1],
				             "step %d micro-batch %d layer %d", step, m, layer);
	step_log k[8], l[8];
	cr_assert_eq(read_log(keep_log, k, 8), 5);
	cr_assert_eq(read_log(kiln_log, l, 8), 5);
	for (int i = 0; i < 5; i++) {
		cr_expect_str_eq(l[i].loss_hex, k[i].loss_hex, "loss of step %d", i + 1);
		cr_expect_str_eq(l[i].grad_fnv, k[i].grad_fnv, "gradients of step %d", i + 1);
	}
	unlink(keep_log);
	unlink(kiln_log);
	unlink(prefix);
	free(keep_log);
	free(kiln_log);
	free(prefix);
	unlink(plan);
	unlink(model);
	free(plan);
	free(model);
}

/* Each unit's bytes in the trainer's arena, at every decision of every rank,
 * against the runtime's prediction (kiln_rt_unit_bytes at the real rows)
 * and against the cost model's formulas worked by hand for this model
 * (docs/cost-model.md, "Activations"): fp32 (e = 4), T = 2 x 64 = 128
 * tokens, h = 64, 4 heads and 2 KV heads of d = 16, E = 8, fe = 128, N the
 * rows routed to the rank. The trainer also checks that each tensor fills
 * its block exactly (every word written, nothing past the end). */
Test(trainer, arena_bytes_equal_the_runtime_prediction, .timeout = 1800)
{
	char *plan = compile_plan(), *out;
	char *prefix = kt_temp_file(".units", "", 0), args[1024];
	snprintf(args, sizeof args, "--steps 4 --spike 2:1.0:0+1 --spike 3:0.7:6 --unit-log %s",
	         prefix);
	int st = trainer(&out, 4, plan, args);
	cr_assert_eq(st, 0, "%s", out);
	free(out);

	kiln_rt *rt;
	cr_assert_eq(kiln_rt_open_file(plan, &rt), 0);
	const uint64_t hand_base[15] = {4 * 128 * 64,     /* ln1.in      e*T*h */
	                                4 * 128 * 64,     /* attn.qkv_in e*T*h */
	                                4 * 128 * 4 * 16, /* attn.q      e*T*a*d */
	                                4 * 128 * 2 * 16, /* attn.k      e*T*kv*d */
	                                4 * 128 * 2 * 16, /* attn.v */
	                                4 * 128 * 4 * 16, /* attn.out    e*T*a*d */
	                                4 * 4 * 128,      /* attn.lse    4*a*T */
	                                4 * 128 * 64,     /* ln2.in */
	                                4 * 128 * 64,     /* moe.in */
	                                4 * 128 * 8,      /* moe.probs   4*T*E */
	                                0,
	                                0,
	                                0,
	                                0,
	                                0};
	const uint64_t hand_per_row[15] = {0,           0, 0, 0, 0, 0,
	                                   0,           0, 0, 0, 4, /* moe.perm_idx   4*N */
	                                   4 * 64,                  /* moe.expert_in  e*N*h */
	                                   4 * 2 * 128,             /* moe.expert_up  e*N*2fe */
	                                   4 * 128,                 /* moe.expert_act e*N*fe */
	                                   4 * 64};                 /* moe.expert_out e*N*h */
	/* rows[step][mb][layer][dp]: every routed row lands on one of the two
	 * EP ranks of its stage. */
	int64_t rows[5][8][4][2];
	memset(rows, -1, sizeof rows);
	long lines = 0, max_rows = 0, min_rows = 1 << 30;
	for (int rank = 0; rank < 4; rank++) {
		char path[4200];
		FILE *f = open_unit_log(prefix, rank, path, sizeof path);
		unit_line u;
		while (next_unit(f, &u)) {
			lines++;
			cr_assert(u.step >= 1 && u.step <= 4 && u.mb >= 0 && u.mb < 8 &&
			          u.unit >= 0 && u.unit < 15);
			cr_assert_eq(u.layer / 2, rank / 2, "rank %d logged layer %d", rank,
			             u.layer);
			uint64_t hand = hand_base[u.unit] + hand_per_row[u.unit] * (uint64_t)u.rows;
			cr_expect_eq(u.bytes, hand, "%s at %ld rows: arena %llu, hand %llu", u.name,
			             u.rows, u.bytes, (unsigned long long)hand);
			cr_expect_eq(u.bytes,
			             kiln_rt_unit_bytes(rt, u.layer, u.unit, (uint64_t)u.rows),
			             "%s at %ld rows", u.name, u.rows);
			cr_expect(u.action >= KILN_RT_KEEP && u.action <= KILN_RT_OFFLOAD);
			int64_t *slot = &rows[u.step][u.mb][u.layer][rank % 2];
			cr_expect(*slot < 0 || *slot == u.rows,
			          "rows differ between units of one layer");
			*slot = u.rows;
			max_rows = u.rows > max_rows ? u.rows : max_rows;
			min_rows = u.rows < min_rows ? u.rows : min_rows;
		}
		cr_assert(feof(f), "%s: unreadable line", path);
		fclose(f);
		unlink(path);
	}
	/* 4 ranks x 4 steps x 8 micro-batches x 2 layers x 15 units */
	cr_expect_eq(lines, 4 * 4 * 8 * 2 * 15);
	for (int s = 1; s <= 4; s++)
		for (int m = 0; m < 8; m++)
			for (int l = 0; l < 4; l++)
				/* 2 ranks x 128 tokens x top-2 */
				cr_expect_eq(rows[s][m][l][0] + rows[s][m][l][1], 512);
	/* Step 2 sends all 512 rows of a stage to EP rank 0, none to rank 1. */
	cr_expect_eq(max_rows, 512);
	cr_expect_eq(min_rows, 0);
	kiln_rt_close(rt);
	unlink(plan);
	unlink(prefix);
	free(prefix);
	free(plan);
}

/* The whole model's backward (both all-to-alls, the gate weights, the
 * residuals, attention, the head) against central finite differences of the
 * loss: --grad-check probes 29 weights of every kind on both stages and both
 * EP ranks, with the routing pinned so the loss is smooth, and exits 4 when
 * one differs by more than 2%. */
Test(trainer, gradients_match_finite_differences, .timeout = 1800, .init = kt_slow)
{
	char *plan = compile_plan(), *out;
	int st = trainer(&out, 4, plan, "--grad-check");
	cr_expect_eq(st, 0, "%s", out);
	cr_expect(strstr(out, "grad-check: 29 of 29 weights agree with finite differences"), "%s",
	          out);
	cr_expect_null(strstr(out, "FAIL"), "%s", out);
	free(out);
	unlink(plan);
	free(plan);
}

/* The simulator's paper pattern, replayed: kilnc simulate --emit-loads
 * writes the loads it samples for this model (seed 7 puts the pattern's
 * spike, capped at load.max_factor 2, in iteration 12), and the trainer routes
 * to match. kiln runs the 20 steps in the real budget with no failure, and
 * step 13 (iteration 12) reaches 2x: at factor 2 every token sends both
 * rows to the hot rank. */
Test(trainer, replays_the_paper_pattern, .timeout = 1800, .init = kt_slow)
{
	char *plan = compile_plan(), *trace = kt_temp_file(".csv", "", 0);
	char *log = kt_temp_file(".jsonl", "", 0), *out, args[1024];
	const char *sim[] = {"simulate",
	                     kt_src("examples/trainer/trainer.yaml"),
	                     "--loads",
	                     "paper",
	                     "--iters",
	                     "20",
	                     "--seed",
	                     "7",
	                     "--emit-loads",
	                     trace,
	                     NULL};
	kt_run r = kt_kilnc(sim, NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	snprintf(args, sizeof args, "--steps 20 --seed 7 --loads %s --log %s", trace, log);
	int st = trainer(&out, 4, plan, args);
	cr_assert_eq(st, 0, "%s", out);
	cr_expect(strstr(out, "done: 20 steps, 0 out-of-memory failures"), "%s", out);
	free(out);
	step_log l[32];
	cr_assert_eq(read_log(log, l, 32), 20);
	cr_expect_float_eq(l[12].max_load, 2.0, 1e-9);
	for (int i = 0; i < 20; i++)
		cr_expect_eq(l[i].over_budget, 0);
	unlink(trace);
	unlink(log);
	unlink(plan);
	free(trace);
	free(log);
	free(plan);
}

/* Bad input: a clear message and a non-zero exit, never a hang. */
Test(trainer, bad_input, .timeout = 900, .init = kt_slow)
{
	char *plan = compile_plan(), *out;
	int st = trainer(&out, 4, plan, "--help");
	cr_expect_eq(st, 0, "%s", out);
	cr_expect(strstr(out, "usage: mpirun -np 4 kiln-trainer"), "%s", out);
	free(out);

	st = trainer(&out, 4, plan, "--policy sometimes");
	cr_expect_eq(st, 2, "%s", out);
	cr_expect(strstr(out, "--policy is kiln, keep or mixed, got 'sometimes'"), "%s", out);
	free(out);

	st = trainer(&out, 4, plan, "--spike 3:1.5:0");
	cr_expect_eq(st, 2, "%s", out);
	cr_expect(strstr(out, "fraction must lie in [0, 1]"), "%s", out);
	free(out);

	st = trainer(&out, 4, plan, "--arena 0.5");
	cr_expect_eq(st, 2, "%s", out);
	cr_expect(strstr(out, "--arena wants a positive byte count"), "%s", out);
	free(out);

	st = trainer(&out, 2, plan, "--steps 1");
	cr_expect_eq(st, 2, "%s", out);
	cr_expect(strstr(out, "run with 4 processes"), "%s", out);
	free(out);

	st = trainer(&out, 4, plan, "--data /nonexistent/kiln-text");
	cr_expect_eq(st, 1, "%s", out);
	cr_expect(strstr(out, "cannot read training text /nonexistent/kiln-text"), "%s", out);
	free(out);

	/* A trace of tokens per expert: the trainer replays factor traces. */
	bad_trace(plan, "iteration,microbatch,layer,rank,e0,e1\n0,0,0,0,3,4\n",
	          "the trainer replays factor traces");
	/* A trace with a row twice. */
	bad_trace(plan, "iteration,microbatch,layer,rank,factor\n0,1,0,0,1.5\n0,1,0,0,1.5\n",
	          "iteration 0 micro-batch 1 layer 0 rank 0 appears twice");

	/* A plan compiled for another model. */
	char *tiny = kt_temp_file(".kiln", "", 0);
	const char *args[] = {"compile", kt_src("examples/models/tiny.yaml"), "-o", tiny, NULL};
	kt_run r = kt_kilnc(args, NULL);
	cr_assert_eq(r.status, 0);
	kt_run_free(&r);
	st = trainer(&out, 4, tiny, "--steps 1");
	cr_expect_eq(st, 1, "%s", out);
	cr_expect(strstr(out, "is for model 'tiny'"), "%s", out);
	free(out);

	/* A truncated blob. */
	cr_assert_eq(truncate(tiny, 1000), 0);
	st = trainer(&out, 4, tiny, "--steps 1");
	cr_expect_eq(st, 1, "%s", out);
	cr_expect(strstr(out, "cannot open plan"), "%s", out);
	free(out);
	unlink(tiny);
	free(tiny);
	unlink(plan);
	free(plan);
}

/* The trainer's logs follow kilnc's output rule (docs/cli.md, "Output
 * files"): a log that cannot be written fails the run with the reason, and
 * no log may name a file the trainer reads. */
Test(trainer, logs_follow_the_output_rule, .timeout = 900, .init = kt_slow)
{
	char *plan = compile_plan(), *out;
	int st = trainer(&out, 4, plan, "--steps 1 --log /dev/full");
	cr_expect_eq(st, 1, "%s", out);
	cr_expect(strstr(out, "cannot write /dev/full: No space left on device"), "%s", out);
	free(out);

	FILE *f = fopen(plan, "rb");
	cr_assert_not_null(f);
	fseek(f, 0, SEEK_END);
	long before = ftell(f);
	fclose(f);
	char args[4200];
	snprintf(args, sizeof args, "--steps 1 --log %s", plan);
	st = trainer(&out, 4, plan, args);
	cr_expect_eq(st, 2, "%s", out);
	cr_expect(strstr(out, "is the input --plan"), "%s", out);
	free(out);
	f = fopen(plan, "rb");
	cr_assert_not_null(f);
	fseek(f, 0, SEEK_END);
	cr_expect_eq(ftell(f), before, "the plan was overwritten");
	fclose(f);

	/* --unit-log PREFIX writes PREFIX.RANK: rank 1's would be the text. */
	char *text = kt_temp_file(".1", "the training text\n", 18);
	char prefix[256];
	snprintf(prefix, sizeof prefix, "%.*s", (int)(strlen(text) - 2), text);
	snprintf(args, sizeof args, "--steps 1 --data %s --unit-log %s", text, prefix);
	st = trainer(&out, 4, plan, args);
	cr_expect_eq(st, 2, "%s", out);
	cr_expect(strstr(out, "is the input --data"), "%s", out);
	free(out);
	f = fopen(text, "rb");
	cr_assert_not_null(f);
	char buf[64] = "";
	cr_expect(fgets(buf, sizeof buf, f) && strcmp(buf, "the training text\n") == 0,
	          "the text was overwritten");
	fclose(f);
	for (int r = 0; r < 4; r++) {
		char p[300];
		snprintf(p, sizeof p, "%s.%d", prefix, r);
		if (r != 1)
			cr_expect_neq(access(p, F_OK), 0, "%s was written", p);
	}
	/* Rank 0's log may not be another rank's unit log. */
	char log1[300];
	snprintf(log1, sizeof log1, "%s.1", prefix);
	snprintf(args, sizeof args, "--steps 1 --log %s --unit-log %s", log1, prefix);
	st = trainer(&out, 4, plan, args);
	cr_expect_eq(st, 2, "%s", out);
	cr_expect(strstr(out, "are the same file"), "%s", out);
	free(out);
	unlink(text);
	free(text);
	unlink(plan);
	free(plan);
}

/* The trainer reads its options as kilnc does (docs/cli.md, "Options" and
 * "Numbers"): each once (--spike excepted), numbers decimal with nothing
 * around them. */
Test(trainer, options_once_and_numbers_as_kilnc_reads_them, .timeout = 900, .init = kt_slow)
{
	char *plan = compile_plan(), *out;
	struct {
		const char *args, *want;
	} cases[] = {
	    /* The helper passes --plan and --quiet once already. */
	    {"--quiet", "--quiet given twice"},
	    {"--plan x.kiln", "--plan given twice"},
	    {"--seed 1 --seed 2", "--seed given twice"},
	    {"--steps 2 --steps 3", "--steps given twice"},
	    {"--policy keep --policy kiln", "--policy given twice"},
	    {"--grad-check --grad-check", "--grad-check given twice"},
	    /* strtod reads 0x1p-8 as 1/256, strtol skips the blank in ' 3'. */
	    {"--lr 0x1p-8", "--lr wants a number in (0, 1), got '0x1p-8'"},
	    {"--spike 3:0x1p-1:0", "--spike fraction must lie in [0, 1], got '0x1p-1'"},
	    {"--steps ' 3'", "--steps wants an integer in [1, "},
	    {"--arena 1.5M", "--arena wants a positive byte count"},
	    {"--arena 4k", "--arena wants a positive byte count"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int st = trainer(&out, 4, plan, cases[i].args);
		cr_expect_eq(st, 2, "%s: %s", cases[i].args, out);
		cr_expect(strstr(out, cases[i].want), "%s: %s", cases[i].args, out);
		free(out);
	}
	/* A trace's factor in hex is refused as kilnc refuses it. */
	bad_trace(plan, "iteration,microbatch,layer,rank,factor\n0,1,0,0,0x1p1\n",
	          "expected ITERATION,MICROBATCH,LAYER,RANK,FACTOR");
	unlink(plan);
	free(plan);
}

#endif
