/* tests/test_stash.c: megatron-paged-stash (sim/policy.c, sim/sim.c;
 * docs/simulator.md, "The paged stash").
 *
 * Every expected value is worked out by hand below from Megatron-LM's
 * sizing rules (megatron/core/transformer/moe/paged_stash.py,
 * token_dispatcher.py) on the tiny model, whose numbers are small enough
 * to follow: hidden 64, expert FFN 128 (SwiGLU), bf16, 8 experts on 4 EP
 * ranks (2 local experts), top-2, 512 balanced rows per rank and MoE
 * layer, 2 pipeline stages of 4 layers (stage 0: the dense layer and MoE
 * layers 0-2; stage 1: MoE layers 3-6), 4 micro-batches, so 1F1B holds 2
 * micro-batches in flight on stage 0 and 1 on stage 1.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "kiln_test.h"
#include "passes/passes.h"
#include "sim/sim.h"

/* tiny with 64 MiB of device memory, so that the stash and its rerun fit
 * and the loads alone decide. */
typedef struct big_tiny {
	kiln_arena *a;
	kiln_compilation c;
} big_tiny;

/* big_tiny with extra (a top-level YAML section, or NULL) appended; the
 * frontend's messages go to err. Returns kiln_frontend_load_buffer's
 * status (the compilation only when it is 0). */
static int big_tiny_setup_with(big_tiny *t, const char *extra, FILE *err)
{
	FILE *f = fopen(kt_src("examples/models/tiny.yaml"), "rb");
	cr_assert_not_null(f);
	static char text[1 << 16];
	size_t len = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	text[len] = 0;
	char *at = strstr(text, "memory_gib: 0.009765625");
	cr_assert_not_null(at);
	memcpy(at, "memory_gib: 0.0625     ", strlen("memory_gib: 0.009765625"));
	if (extra) {
		cr_assert_lt(len + strlen(extra), sizeof text);
		memcpy(text + len, extra, strlen(extra) + 1);
		len += strlen(extra);
	}
	t->a = kiln_arena_new();
	cr_assert_not_null(t->a);
	kiln_model *m = NULL;
	int rc = kiln_frontend_load_buffer("big-tiny.yaml", text, len, t->a, err, &m);
	if (rc != 0)
		return rc;
	t->c = (kiln_compilation){.model = m, .arena = t->a, .solver = KILN_SOLVER_DP};
	cr_assert_eq(kiln_pipeline_compile(&t->c, NULL, NULL, NULL, stderr), 0);
	return 0;
}

static void big_tiny_setup(big_tiny *t)
{
	cr_assert_eq(big_tiny_setup_with(t, NULL, stderr), 0);
}

/* Megatron-Bridge's DeepSeek-V3 flags (KILN_SIM_STASH_DEFAULTS), given
 * explicitly: the hand calculations below are sized with them. NULL asks
 * for the factors chosen at the design load. */
static const kiln_sim_stash_flags BRIDGE = {1.5, 1.2, 1.0, 64, 256};

/* One run of megatron-paged-stash with flags (NULL: the chosen ones) on
 * loads, every rank followed (exact) or the statistical method. */
static kiln_sim_result stash_run(big_tiny *t, const char *loads, int64_t iters, int exact,
                                 const kiln_sim_stash_flags *flags)
{
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse(loads, t->c.model->max_factor, t->a, stderr, &prof), 0);
	kiln_sim_config cfg = {.c = &t->c,
	                       .loads = prof,
	                       .iterations = iters,
	                       .seed = 7,
	                       .restart_s = 284,
	                       .checkpoint_every = 100,
	                       .exact = exact,
	                       .threads = 1,
	                       .stash = flags};
	kiln_sim_policy_kind k = KILN_SIM_MEGATRON_PAGED_STASH;
	kiln_sim_result r;
	cr_assert_eq(kiln_sim_run(&cfg, &k, 1, t->a, stderr, &r), 0);
	return r;
}

/* A trace of two iterations: everything balanced except, in iteration 0,
 * micro-batch mb, MoE layer layer, rank 0 at rows / 512. The row for
 * layer 6 makes the trace cover all 7 MoE layers, the row for iteration 1
 * its two iterations (docs/simulator.md, "Traces"). */
static char *spike_trace(int mb, int layer, int rows)
{
	char text[512];
	snprintf(text, sizeof text,
	         "iteration,microbatch,layer,rank,factor\n0,%d,%d,0,%.17g\n0,0,6,1,1\n1,0,6,0,1\n",
	         mb, layer, rows / 512.0);
	return kt_temp_file(".csv", text, strlen(text));
}

static kiln_sim_result spike_run(big_tiny *t, int mb, int layer, int rows,
                                 const kiln_sim_stash_flags *flags)
{
	char *path = spike_trace(mb, layer, rows);
	kiln_sim_result r = stash_run(t, path, 2, 1, flags);
	unlink(path);
	free(path);
	return r;
}

/* Sizes, by hand (defaults: rank capacity factor 1.5, CUDA 1.2, CPU 1.0,
 * 64-row pages, 256-row alignment):
 * - a paged row: fc1 input 2 * 64 + probability 4 + fc1 output 2 * 256 +
 *   activation output 2 * 128 = 900 bytes;
 * - budget: floor(1.5 * 512) = 768, a multiple of 256 already; average
 *   rows floor(768 / 1.5) = 512;
 * - stage 0: peak 2 * 3 * 512 = 3072 rows held; CUDA int(3072 * 1.2) =
 *   3686 rows -> ceil(3686 / 64) = 58 pages (3,340,800 bytes); host 3072
 *   rows -> 48 pages;
 * - stage 1: 1 * 4 * 512 = 2048; CUDA int(2457.6) = 2457 -> 39 pages
 *   (2,246,400 bytes); host 2048 -> 32 pages. */
Test(sim_stash, buffers_are_sized_as_megatron_sizes_them)
{
	big_tiny t;
	big_tiny_setup(&t);
	kiln_sim_policy *p;
	cr_assert_eq(kiln_sim_policy_new_stash(KILN_SIM_MEGATRON_PAGED_STASH, &t.c, NULL, 0,
	                                       &BRIDGE, t.a, stderr, &p),
	             0);
	static const int64_t cuda[2] = {58, 39}, host[2] = {48, 32};
	for (int32_t s = 0; s < 2; s++) {
		kiln_sim_stash st;
		cr_assert_eq(kiln_sim_policy_stash(p, s, &st), 0);
		cr_expect_eq(st.row_bytes, 900, "stage %d", s);
		cr_expect_eq(st.budget_rows, 768, "stage %d", s);
		cr_expect_eq(st.avg_rows, 512, "stage %d", s);
		cr_expect_eq(st.cuda_pages, cuda[s], "stage %d: %lld", s, (long long)st.cuda_pages);
		cr_expect_eq(st.host_pages, host[s], "stage %d: %lld", s, (long long)st.host_pages);
		cr_expect_eq(st.cuda_bytes, (double)cuda[s] * 64 * 900, "stage %d", s);
		cr_expect_eq(st.experts, 2);
		/* Two local experts, each padded to 256 rows: 512 rows split
		 * 256 + 256 stay 512; 513 split 257 + 256 pad to 512 + 256; 514
		 * split 257 + 257 pad to 1024; 1 row pads to 256. */
		cr_expect_eq(kiln_sim_stash_padded_rows(&st, 512), 512);
		cr_expect_eq(kiln_sim_stash_padded_rows(&st, 513), 768);
		cr_expect_eq(kiln_sim_stash_padded_rows(&st, 514), 1024);
		cr_expect_eq(kiln_sim_stash_padded_rows(&st, 1), 256);
		cr_expect_eq(kiln_sim_stash_padded_rows(&st, 0), 0);
		cr_expect_eq(kiln_sim_stash_pages(&st, 768), 12);
		cr_expect_eq(kiln_sim_stash_pages(&st, 1), 1);
	}
	/* Its rerun pages nothing; other policies have no stash. */
	kiln_sim_stash st;
	cr_expect_eq(kiln_sim_policy_stash(kiln_sim_policy_rerun(p), 0, &st), -1);
	kiln_sim_policy *q;
	cr_assert_eq(
	    kiln_sim_policy_new(KILN_SIM_STATIC_AGGRESSIVE, &t.c, NULL, 0, t.a, stderr, &q), 0);
	cr_expect_eq(kiln_sim_policy_stash(q, 0, &st), -1);
	cr_expect_null(kiln_sim_policy_rerun(q));
	cr_expect_null(kiln_sim_policy_recipe(q, NULL));
	/* 64 MiB: keeping everything beside the stash fits at load 1.2, but
	 * the budget does not take that load: 1.2 * 512 = 614.4 rows, 615 as
	 * 308 + 307, padded to 512 + 512 = 1024 > 768. The flags print as a
	 * command line carries them, with no recipe beside. */
	int fits = 1;
	cr_expect_str_eq(
	    kiln_sim_policy_recipe(p, &fits),
	    "--moe-paged-stash --moe-expert-rank-capacity-factor 1.5 "
	    "--moe-paged-stash-buffer-size-factor-cuda 1.2 "
	    "--moe-paged-stash-buffer-size-factor-cpu 1 --moe-paged-stash-page-size 64");
	cr_expect(!fits);
	kiln_sim_policy_free(p);
	kiln_sim_policy_free(q);
	kiln_arena_free(t.a);
}

/* On the shipped tiny (10 MiB) with the chosen factors, the flags say
 * they fit at load 1.2, and at balanced load (below the design load) the
 * run never runs out of memory nor reruns. With Bridge's factors keeping
 * everything beside the stash does not fit there (10 MiB less the pages
 * and the budget's buffers): the recipe found recomputes. */
Test(sim_stash, recipe_fits_where_it_says_it_does, .timeout = 120)
{
	kiln_compilation c = *kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_sim_policy *p;
	cr_assert_eq(kiln_sim_policy_new(KILN_SIM_MEGATRON_PAGED_STASH, &c, NULL, 0, a, stderr, &p),
	             0);
	int fits = 0;
	const char *recipe = kiln_sim_policy_recipe(p, &fits);
	cr_expect(fits, "%s", recipe);
	kiln_sim_policy_free(p);
	cr_assert_eq(kiln_sim_policy_new_stash(KILN_SIM_MEGATRON_PAGED_STASH, &c, NULL, 0, &BRIDGE,
	                                       a, stderr, &p),
	             0);
	const char *bridge = kiln_sim_policy_recipe(p, NULL);
	cr_expect_not_null(strstr(bridge, "--recompute-granularity selective"), "%s", bridge);
	kiln_sim_policy_free(p);
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse("balanced", c.model->max_factor, a, stderr, &prof), 0);
	kiln_sim_config cfg = {.c = &c,
	                       .loads = prof,
	                       .iterations = 3,
	                       .seed = 7,
	                       .restart_s = 284,
	                       .checkpoint_every = 100,
	                       .exact = 1,
	                       .threads = 1};
	kiln_sim_policy_kind k = KILN_SIM_MEGATRON_PAGED_STASH;
	kiln_sim_result r;
	cr_assert_eq(kiln_sim_run(&cfg, &k, 1, a, stderr, &r), 0);
	cr_expect_eq(r.ooms, 0, "%s", recipe);
	cr_expect_eq(r.reruns, 0);
	cr_expect_leq(r.peak_bytes[0], c.budgets[0].capacity_bytes);
	kiln_arena_free(a);
}

/* The dispatcher's budget is 768 rows per rank (above). 513 rows pad to
 * 768: within it, no rerun; 514 pad to 1024: tokens are dropped and the
 * step runs again (in stage 1's first MoE layer, where 39 CUDA pages hold
 * the 3 * 8 + 12 = 36 pages the step needs with the rows the budget kept,
 * so the stash itself never overflows). */
Test(sim_stash, reruns_exactly_when_rows_exceed_the_receive_budget, .timeout = 120)
{
	big_tiny t;
	big_tiny_setup(&t);
	kiln_sim_result in = spike_run(&t, 0, 3, 513, &BRIDGE);
	kiln_sim_result over = spike_run(&t, 0, 3, 514, &BRIDGE);
	cr_expect_eq(in.reruns, 0);
	cr_expect_eq(in.stash_over_budget, 0);
	cr_expect_eq(over.reruns, 1);
	cr_expect_eq(over.stash_over_budget, 1);
	cr_expect_eq(over.stash_overflows, 0);
	cr_expect_eq(in.ooms, 0);
	cr_expect_eq(over.ooms, 0);
	/* The step is paid twice: the mean iteration grows by the rerun's
	 * time over the two iterations (to within the one row more the
	 * first attempt computes), and the rerun took about an iteration
	 * (dropless, no stash copies: a little less). */
	cr_expect_gt(over.rerun_s, 0);
	cr_expect(fabs(over.iteration_s - (in.iteration_s + over.rerun_s / 2)) <
	              1e-3 * over.iteration_s,
	          "%.17g vs %.17g + %.17g / 2", over.iteration_s, in.iteration_s, over.rerun_s);
	cr_expect_gt(over.rerun_s, 0.9 * in.iteration_s);
	cr_expect_leq(over.rerun_s, in.iteration_s * (1 + 1e-12));
	kiln_arena_free(t.a);
}

/* The padding is per local expert, so the split of a rank's rows
 * decides: a token trace (one column per local expert) of 514 rows as
 * 512 + 2 pads to 512 + 256 = 768, within the budget; as 257 + 257 to
 * 1024, over it: a rerun. Shares 1/4 and 3/4 of 514 rows: 128.5 and
 * 385.5, floors 128 and 385, the row left to the lower expert (equal
 * remainders): 129 + 385, padded 256 + 512 = 768. */
Test(sim_stash, padding_follows_each_experts_rows, .timeout = 120)
{
	big_tiny t;
	big_tiny_setup(&t);
	static const char *const fmt = "iteration,microbatch,layer,rank,e0,e1\n0,0,3,0,%d,%d\n"
	                               "0,0,6,1,256,256\n1,0,6,0,256,256\n";
	static const int split[2][2] = {{512, 2}, {257, 257}};
	for (int c = 0; c < 2; c++) {
		char text[256];
		snprintf(text, sizeof text, fmt, split[c][0], split[c][1]);
		char *path = kt_temp_file(".csv", text, strlen(text));
		kiln_sim_result r = stash_run(&t, path, 2, 1, &BRIDGE);
		cr_expect_eq(r.reruns, c, "%d + %d", split[c][0], split[c][1]);
		cr_expect_eq(r.stash_over_budget, c);
		unlink(path);
		free(path);
	}
	kiln_sim_policy *p;
	cr_assert_eq(kiln_sim_policy_new_stash(KILN_SIM_MEGATRON_PAGED_STASH, &t.c, NULL, 0,
	                                       &BRIDGE, t.a, stderr, &p),
	             0);
	kiln_sim_stash st;
	cr_assert_eq(kiln_sim_policy_stash(p, 1, &st), 0);
	static const double quarter[2] = {0.25, 0.75}, half[2] = {0.5, 0.5};
	cr_expect_eq(kiln_sim_stash_padded_rows_of(&st, 514, quarter), 768);
	cr_expect_eq(kiln_sim_stash_padded_rows_of(&st, 514, half), 1024);
	cr_expect_eq(kiln_sim_stash_padded_rows_of(&st, 513, half), 768);
	cr_expect_eq(kiln_sim_stash_padded_rows_of(&st, 514, NULL), 1024);
	kiln_sim_policy_free(p);
	kiln_arena_free(t.a);
}

/* With --moe-paged-stash-buffer-size-factor-cuda 1.0 and no host buffer,
 * stage 1 has int(2048 * 1.0) / 64 = 32 CUDA pages, and a balanced step
 * takes 4 layers * 8 pages = 32: exactly full, no rerun. 513 rows in its
 * first MoE layer take 12 pages (768 padded rows, within the budget):
 * 12 + 8 + 8 = 28, and the last layer's 8 find 4 free: overflow, rerun.
 * On stage 0 (48 pages; 2 micro-batches * 3 layers * 8 = 48 balanced) the
 * same 513 rows in micro-batch 0 overflow at micro-batch 1's last layer
 * (28 + 16 held, 8 asked, 4 free). */
Test(sim_stash, reruns_exactly_when_the_stash_overflows, .timeout = 120)
{
	big_tiny t;
	big_tiny_setup(&t);
	kiln_sim_stash_flags tight = {1.5, 1.0, 0.0, 64, 256};
	kiln_sim_result bal = spike_run(&t, 0, 3, 512, &tight);
	kiln_sim_result s1 = spike_run(&t, 0, 3, 513, &tight);
	kiln_sim_result s0 = spike_run(&t, 0, 0, 513, &tight);
	cr_expect_eq(bal.reruns, 0);
	cr_expect_eq(bal.stash_overflows, 0);
	cr_expect_eq(s1.reruns, 1);
	cr_expect_eq(s1.stash_overflows, 1);
	cr_expect_eq(s1.stash_over_budget, 0);
	cr_expect_eq(s0.reruns, 1);
	cr_expect_eq(s0.stash_overflows, 1);
	/* A host buffer of int(2048 * 0.125) = 256 rows (4 pages) cannot take
	 * the last layer's 8 pages: still an overflow. One of 512 rows (8
	 * pages) takes them: a spill of 512 * 900 = 460,800 bytes, no rerun. */
	kiln_sim_stash_flags small_host = {1.5, 1.0, 0.125, 64, 256};
	kiln_sim_stash_flags host = {1.5, 1.0, 0.25, 64, 256};
	kiln_sim_result sh = spike_run(&t, 0, 3, 513, &small_host);
	kiln_sim_result h = spike_run(&t, 0, 3, 513, &host);
	cr_expect_eq(sh.reruns, 1);
	cr_expect_eq(sh.spilled_bytes, 0);
	cr_expect_eq(h.reruns, 0);
	cr_expect_eq(h.stash_overflows, 0);
	cr_expect_eq(h.spilled_bytes, 460800, "%.17g", h.spilled_bytes);
	/* The spill costs time the CUDA stash does not. */
	cr_expect_gt(h.copy_s, bal.copy_s);
	kiln_arena_free(t.a);
}

/* One layer's placement, by hand, on a stash of 8 CUDA and 16 host pages
 * (900-byte rows, budget 768 rows, 2 experts), HBM 100 GB/s, 10 GB/s each
 * way to the host:
 * - 500 rows: 250 + 250 pad to 512: 8 pages, on the device; the stash
 *   and the reload each read and write 512 * 900 = 460,800 bytes:
 *   2 * 2 * 460,800 / 100e3 = 18.432 us;
 * - 600 rows: 300 + 300 pad to 1024, over the budget (dropped, a rerun):
 *   768 rows, 12 pages; the device has 0 free (8 held), the host 16:
 *   spilled, 691,200 bytes. The copy kernel holds its SMs for the whole
 *   copy (Megatron's moe/ops/paged_stash.py:113-137), so nothing hides:
 *   out, one HBM read (691,200 / 100e3 = 6.912 us) beside the link's
 *   691,200 / 10e3 = 69.12 us, the slower 69.12; back the same: 138.24 us
 *   (the old model hid the link under the layer's compute: 32.944);
 * - 500 rows more, host 4 free: overflow, nothing stashed, no time. */
Test(sim_stash, placement_and_spill_time_equal_a_hand_calculation)
{
	kiln_sim_stash st = {.flags = KILN_SIM_STASH_DEFAULTS,
	                     .row_bytes = 900,
	                     .budget_rows = 768,
	                     .avg_rows = 512,
	                     .cuda_pages = 8,
	                     .host_pages = 16,
	                     .experts = 2};
	kiln_hardware hw = {.hbm_gbps = 100, .d2h_gbps = 10, .h2d_gbps = 10};
	int64_t cuda = 0, host = 0;
	int overflowed = 0, dropped = 0;
	double spilled = 0;
	double us = kiln_sim_stash_place(&st, &hw, 500, NULL, &cuda, &host, 0, 0, &overflowed,
	                                 &spilled, &dropped);
	cr_expect(fabs(us - 18.432) < 1e-9, "%.17g", us);
	cr_expect_eq(cuda, 8);
	cr_expect_eq(host, 0);
	cr_expect_eq(dropped, 0);
	us = kiln_sim_stash_place(&st, &hw, 600, NULL, &cuda, &host, 0, 0, &overflowed, &spilled,
	                          &dropped);
	cr_expect(fabs(us - 138.24) < 1e-9, "%.17g", us);
	cr_expect_eq(host, 12);
	cr_expect_eq(spilled, 691200);
	cr_expect_eq(dropped, 1);
	cr_expect_eq(overflowed, 0);
	us = kiln_sim_stash_place(&st, &hw, 500, NULL, &cuda, &host, 0, 0, &overflowed, &spilled,
	                          &dropped);
	cr_expect_eq(us, 0);
	cr_expect_eq(overflowed, 1);
	cr_expect_eq(cuda, 8);
	cr_expect_eq(host, 12);
	/* After an overflow the device stashes nothing more (the copy
	 * kernel returns at once), even what would fit. */
	cuda = 0;
	us = kiln_sim_stash_place(&st, &hw, 100, NULL, &cuda, &host, 0, 0, &overflowed, &spilled,
	                          &dropped);
	cr_expect_eq(us, 0);
	cr_expect_eq(cuda, 0);
}

/* The stash follows every rank with distinct loads on each stage, as an
 * adaptive policy: the statistical method gives exactly what exact mode
 * gives, and so is never more optimistic. */
Test(sim_stash, statistical_method_equals_exact, .timeout = 300)
{
	big_tiny t;
	big_tiny_setup(&t);
	static const char *const loads[] = {"paper", "hot-rank", "rotating", "hot-expert",
	                                    "zipf:1.2"};
	for (int l = 0; l < 5; l++) {
		kiln_sim_result st = stash_run(&t, loads[l], 6, 0, NULL);
		kiln_sim_result ex = stash_run(&t, loads[l], 6, 1, NULL);
		cr_expect_eq(st.ooms, ex.ooms, "%s", loads[l]);
		cr_expect_eq(st.reruns, ex.reruns, "%s", loads[l]);
		cr_expect_eq(st.stash_overflows, ex.stash_overflows, "%s", loads[l]);
		cr_expect_eq(st.spilled_bytes, ex.spilled_bytes, "%s", loads[l]);
		cr_expect_eq(st.tokens_per_s, ex.tokens_per_s, "%s", loads[l]);
		for (int32_t s = 0; s < st.n_stages; s++)
			cr_expect_eq(st.peak_bytes[s], ex.peak_bytes[s], "%s", loads[l]);
	}
	kiln_arena_free(t.a);
}

/* Flags Megatron refuses or kiln does not model are an error, never a
 * silent default. */
Test(sim_stash, bad_flags_are_an_error)
{
	big_tiny t;
	big_tiny_setup(&t);
	static const kiln_sim_stash_flags bad[] = {
	    {0, 1.2, 1.0, 64, 256},  {-1, 1.2, 1.0, 64, 256}, {1.5, -1.2, 1.0, 64, 256},
	    {1.5, 1.2, -1, 64, 256}, {1.5, 1.2, 1.0, 0, 256}, {1.5, NAN, 1.0, 64, 256},
	    {1.5, 1.2, 1.0, 64, -1},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char *msg = NULL;
		size_t len = 0;
		FILE *err = open_memstream(&msg, &len);
		kiln_sim_policy *p = NULL;
		cr_expect_eq(kiln_sim_policy_new_stash(KILN_SIM_MEGATRON_PAGED_STASH, &t.c, NULL, 0,
		                                       &bad[i], t.a, err, &p),
		             -1, "case %zu", i);
		fclose(err);
		cr_expect_not_null(strstr(msg, "megatron-paged-stash"), "case %zu: %s", i, msg);
		free(msg);
	}
	kiln_arena_free(t.a);
}

/* Megatron's pages for a stage holding peak average rows at factor x:
 * ceil(int(peak * x) / page) (paged_stash.py:551-632 and PagedStashBuffer,
 * written out here from Megatron's code, not from sim/policy.c). */
static int64_t megatron_pages(double peak, double x, double page)
{
	return (int64_t)ceil(floor(peak * x) / page);
}

/* The factors chosen at the design load on big_tiny (every byte fits):
 * - capacity factor: 1.2 * 512 = 614.4 rows, 615 as 308 + 307, padded to
 *   512 + 512 = 1024. Bridge's 1.5 gives a budget of 768 < 1024, so it is
 *   raised to the next of Bridge's values, 2: floor(2 * 512) = 1024, the
 *   average floor(1024 / 2) = 512; 1.4, 1.3 and 1.2 hold less, so 2 it is;
 * - CPU factor: the least multiple of 0.1 with which both stages' pages
 *   hold every in-flight layer at the budget (1024 rows: 16 pages each):
 *   stage 0 2 * 3 = 6 tensors (peak 3072 average rows), stage 1 1 * 4 = 4
 *   (peak 2048), a tensor whole on one side. Worked here by brute force
 *   from Megatron's sizing for whatever CUDA factor was chosen.
 * And the chosen flags beat Bridge's on the paper profile: at 1.5 nearly
 * every step has a rank over the budget (a rerun), at 2 fewer. */
Test(sim_stash, factors_are_chosen_at_the_design_load, .timeout = 300)
{
	big_tiny t;
	big_tiny_setup(&t);
	kiln_sim_policy *p;
	cr_assert_eq(
	    kiln_sim_policy_new(KILN_SIM_MEGATRON_PAGED_STASH, &t.c, NULL, 0, t.a, stderr, &p), 0);
	kiln_sim_stash st[2];
	for (int32_t s = 0; s < 2; s++)
		cr_assert_eq(kiln_sim_policy_stash(p, s, &st[s]), 0);
	double cuda = st[0].flags.cuda_factor;
	cr_expect_eq(st[0].flags.rank_capacity_factor, 2);
	cr_expect_eq(st[0].budget_rows, 1024);
	cr_expect_eq(st[0].avg_rows, 512);
	cr_expect_eq(st[0].flags.page_rows, 64);
	cr_expect_eq(st[0].flags.align_rows, 256);
	cr_expect(cuda >= 0 && cuda <= 2.0 + 1e-12, "%g", cuda);
	cr_expect(fabs(cuda * 10 - round(cuda * 10)) < 1e-9, "%g", cuda);
	static const double peak[2] = {3072, 2048}, tensors[2] = {6, 4};
	double want = -1;
	for (int k = 0; k <= 200 && want < 0; k++) {
		int ok = 1;
		for (int s = 0; s < 2; s++)
			ok &= (double)(megatron_pages(peak[s], cuda, 64) / 16) +
			          (double)(megatron_pages(peak[s], k / 10.0, 64) / 16) >=
			      tensors[s];
		if (ok)
			want = k / 10.0;
	}
	for (int32_t s = 0; s < 2; s++) {
		cr_expect_eq(st[s].flags.cpu_factor, want, "%g vs %g", st[s].flags.cpu_factor,
		             want);
		cr_expect_eq(st[s].cuda_pages, megatron_pages(peak[s], cuda, 64));
		cr_expect_eq(st[s].host_pages, megatron_pages(peak[s], want, 64));
	}
	int fits = 0;
	const char *flags = kiln_sim_policy_recipe(p, &fits);
	cr_expect(fits, "%s", flags);
	cr_expect_not_null(strstr(flags, "--moe-paged-stash --moe-expert-rank-capacity-factor 2 "),
	                   "%s", flags);
	kiln_sim_policy_free(p);
	kiln_sim_result tuned = stash_run(&t, "paper", 6, 1, NULL);
	kiln_sim_result bridge = stash_run(&t, "paper", 6, 1, &BRIDGE);
	cr_expect_eq(bridge.reruns, 6);
	cr_expect_lt(tuned.reruns, bridge.reruns);
	cr_expect_gt(tuned.tokens_per_s, bridge.tokens_per_s);
	kiln_arena_free(t.a);
}

/* The description's stash flags are kept: all four given, they are the
 * stash's (stage 0 holds 3072 average rows, stage 1 2048; at 32-row
 * pages CUDA 1.0 takes 96 and 64 pages, CPU 0.5 48 and 32); the CUDA
 * factor alone given, it stays and the others are chosen: capacity 2 (as
 * above) and the least CPU factor with which the pages hold the window at
 * the budget: stage 0 has 48 CUDA pages (3 tensors of 16), the other 3
 * need 48 host pages: int(3072 h) > 47 * 64 = 3008, h = 1.0 (0.9 gives
 * ceil(2764 / 64) = 44); stage 1 32 CUDA pages, 2 tensors, 2 more need 32
 * host pages: int(2048 h) > 1984, again 1.0. */
Test(sim_stash, description_flags_are_kept, .timeout = 300)
{
	big_tiny t;
	cr_assert_eq(big_tiny_setup_with(&t,
	                                 "megatron:\n  moe_expert_rank_capacity_factor: 1.5\n"
	                                 "  moe_paged_stash_buffer_size_factor_cuda: 1.0\n"
	                                 "  moe_paged_stash_buffer_size_factor_cpu: 0.5\n"
	                                 "  moe_paged_stash_page_size: 32\n",
	                                 stderr),
	             0);
	kiln_sim_policy *p;
	cr_assert_eq(
	    kiln_sim_policy_new(KILN_SIM_MEGATRON_PAGED_STASH, &t.c, NULL, 0, t.a, stderr, &p), 0);
	static const int64_t cuda[2] = {96, 64}, host[2] = {48, 32};
	for (int32_t s = 0; s < 2; s++) {
		kiln_sim_stash st;
		cr_assert_eq(kiln_sim_policy_stash(p, s, &st), 0);
		cr_expect_eq(st.flags.rank_capacity_factor, 1.5);
		cr_expect_eq(st.flags.cuda_factor, 1.0);
		cr_expect_eq(st.flags.cpu_factor, 0.5);
		cr_expect_eq(st.flags.page_rows, 32);
		cr_expect_eq(st.budget_rows, 768);
		cr_expect_eq(st.cuda_pages, cuda[s], "stage %d: %lld", s, (long long)st.cuda_pages);
		cr_expect_eq(st.host_pages, host[s], "stage %d: %lld", s, (long long)st.host_pages);
	}
	kiln_sim_policy_free(p);
	kiln_arena_free(t.a);

	cr_assert_eq(big_tiny_setup_with(
	                 &t, "megatron:\n  moe_paged_stash_buffer_size_factor_cuda: 1.0\n", stderr),
	             0);
	cr_assert_eq(
	    kiln_sim_policy_new(KILN_SIM_MEGATRON_PAGED_STASH, &t.c, NULL, 0, t.a, stderr, &p), 0);
	static const int64_t cuda1[2] = {48, 32}, host1[2] = {48, 32};
	for (int32_t s = 0; s < 2; s++) {
		kiln_sim_stash st;
		cr_assert_eq(kiln_sim_policy_stash(p, s, &st), 0);
		cr_expect_eq(st.flags.rank_capacity_factor, 2);
		cr_expect_eq(st.flags.cuda_factor, 1.0);
		cr_expect_eq(st.flags.cpu_factor, 1.0, "%g", st.flags.cpu_factor);
		cr_expect_eq(st.cuda_pages, cuda1[s], "stage %d", s);
		cr_expect_eq(st.host_pages, host1[s], "stage %d", s);
	}
	kiln_sim_policy_free(p);
	kiln_arena_free(t.a);
}

/* Stash flags the description cannot carry are an error at the key. */
Test(sim_stash, bad_description_flags_are_an_error)
{
	static const char *const bad[] = {
	    "megatron:\n  moe_paged_stash_buffer_size_factor_cuda: -1.1\n",
	    "megatron:\n  moe_paged_stash_buffer_size_factor_cpu: -0.5\n",
	    "megatron:\n  moe_expert_rank_capacity_factor: 0\n",
	    "megatron:\n  moe_paged_stash_page_size: 0\n",
	};
	static const char *const key[] = {
	    "moe_paged_stash_buffer_size_factor_cuda", "moe_paged_stash_buffer_size_factor_cpu",
	    "moe_expert_rank_capacity_factor", "moe_paged_stash_page_size"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char *msg = NULL;
		size_t len = 0;
		FILE *err = open_memstream(&msg, &len);
		big_tiny t;
		cr_expect_neq(big_tiny_setup_with(&t, bad[i], err), 0, "case %zu", i);
		fclose(err);
		cr_expect_not_null(strstr(msg, key[i]), "case %zu: %s", i, msg);
		free(msg);
		kiln_arena_free(t.a);
	}
}
