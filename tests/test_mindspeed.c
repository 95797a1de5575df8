/* tests/test_mindspeed.c: the mindspeed policy (sim/policy.c, sim/sim.c;
 * docs/simulator.md, "Policies"): MindSpeed's adaptive MoE recompute as
 * its code decides, from the previous forward's per-expert counts, with the
 * selective recompute its users run beside it.
 *
 * Expected values are worked out by hand in the comments from tiny's shape
 * (examples/models/tiny.yaml: hidden 64, 4 heads of 16, 2 KV heads, 128
 * tokens of 2 sequences per micro-batch, 8 experts of 128, top-2, SwiGLU,
 * ep 4: 2 experts per rank) and from the trigger's definition.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "kiln/runtime.h"
#include "kiln_test.h"
#include "passes/passes.h"
#include "sim/sim.h"

TestSuite(sim_mindspeed, .timeout = 300);

/* The MoE unit set of tiny's stage 1. */
static int32_t moe_set(const kiln_compilation *c, int32_t stage)
{
	for (int32_t k = 0; k < c->n_sets; k++)
		if (c->sets[k].stage == stage && c->sets[k].kind == KILN_LAYER_MOE)
			return k;
	cr_assert_fail("no MoE set on stage %d", stage);
	return -1;
}

/* What each plan keeps, by hand. A micro-batch is s * b = 256 tokens of
 * h = 64: 2 s b h = 32,768 bytes for one hidden-sized bf16 tensor.
 * Untriggered (selective: norms and activation functions recomputed), an
 * MoE layer keeps its input 32,768, q, k and v (64 + 2 * 2 * 16 = 128
 * columns: 65,536), the attention output 32,768, the softmax statistics
 * (fp32 per token and head: 4 * 256 * 4 = 4,096), the residual entering
 * the second norm 32,768 and the router's probabilities (fp32 per token
 * and expert: 4 * 256 * 8 = 8,192): 176,128 bytes; and per routed row N
 * the permutation index (8), the dispatched input (2 h = 128), its routing
 * probability (fp32, 4) and fc1's output (SwiGLU: 2 * 2 * 128 = 512), 652
 * N. Triggered, the whole MoE layer is checkpointed: the router's
 * probabilities and every per-row tensor go, 176,128 - 8,192 = 167,936
 * bytes and nothing per row. */
Test(sim_mindspeed, the_trigger_checkpoints_the_whole_moe_layer)
{
	const kiln_compilation *c = kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_sim_policy *p;
	cr_assert_eq(kiln_sim_policy_new(KILN_SIM_MINDSPEED, c, NULL, 0, a, stderr, &p), 0);
	double multiple = 0;
	cr_assert_eq(kiln_sim_policy_trigger(p, &multiple), 1);
	/* tiny keeps everything within memory at 1.2 (its unbounded peak
	 * under paper, at most 1.19x, is 8.93 of 9 MiB), so no layer needs
	 * full recompute beside the trigger. */
	cr_expect_eq(kiln_sim_policy_full_layers(p), 0);
	cr_expect_eq(multiple, 2.0);
	int32_t set = moe_set(c, 1);
	for (double n = 0; n <= 3000; n += 1000) {
		kiln_sim_choice cold, hot, plain;
		kiln_sim_policy_decide_triggered(p, set, 5, n, 0, &cold);
		kiln_sim_policy_decide_triggered(p, set, 5, n, 1, &hot);
		kiln_sim_policy_decide(p, set, 5, n, 1e12, 0, 0, 0, &plain);
		cr_expect_eq(cold.resident_bytes, 176128 + 652 * n, "n %g: %.17g", n,
		             cold.resident_bytes);
		cr_expect_eq(hot.resident_bytes, 167936, "n %g: %.17g", n, hot.resident_bytes);
		cr_expect_eq(plain.resident_bytes, cold.resident_bytes, "without a trigger state");
		/* What the triggered plan drops is rebuilt in the backward. */
		cr_expect_geq(hot.transient_bytes, cold.transient_bytes + 8192 + 652 * n);
	}
	/* A dense layer has no MoE layer to checkpoint: one plan. */
	for (int32_t k = 0; k < c->n_sets; k++) {
		if (c->sets[k].kind != KILN_LAYER_DENSE)
			continue;
		kiln_sim_choice cold, hot;
		kiln_sim_policy_decide_triggered(p, k, 0, 0, 0, &cold);
		kiln_sim_policy_decide_triggered(p, k, 0, 0, 1, &hot);
		cr_expect_eq(cold.resident_bytes, hot.resident_bytes);
	}
	/* Other policies have no trigger; the former name still parses. */
	kiln_sim_policy *q;
	cr_assert_eq(kiln_sim_policy_new(KILN_SIM_FULL_RECOMPUTE, c, NULL, 0, a, stderr, &q), 0);
	cr_expect_eq(kiln_sim_policy_trigger(q, &multiple), 0);
	cr_expect_eq(kiln_sim_policy_full_layers(q), -1);
	cr_expect_eq(kiln_sim_policy_parse("mindspeed"), KILN_SIM_MINDSPEED);
	cr_expect_eq(kiln_sim_policy_parse("mindspeed-threshold"), KILN_SIM_MINDSPEED);
	kiln_sim_policy_free(p);
	kiln_sim_policy_free(q);
	kiln_arena_free(a);
}

/* tiny routes 1,024 tokens * top-2 = 2,048 rows per micro-batch and MoE
 * layer over 8 experts: 256 balanced rows per expert, so the trigger
 * fires above 512. A token trace of one layer (every MoE layer replays
 * it) and one iteration (every iteration replays it), the largest expert
 * of micro-batches 0 to 3 at 512 (exactly 2x: not above), 513, 300 and
 * 256. Deciding before each forward from the previous one:
 *   iteration 0: micro-batch 0 has no previous forward (MindSpeed's counts
 *     are None): fires; 1 follows 512: no; 2 follows 513: fires; 3
 *     follows 300: no;
 *   iteration 1: 0 follows iteration 0's micro-batch 3 (256): no; 1: no;
 *     2: fires; 3: no.
 * So 3 of 8 forwards per MoE layer, 3 * 7 = 21 over tiny's 7 MoE layers,
 * and for 3 iterations 21 + 7 = 28; the same with --exact (the trigger is
 * the EP group's). */
Test(sim_mindspeed, the_trigger_follows_the_previous_forward)
{
	const char *text =
	    "iteration,microbatch,layer,rank,e0,e1\n"
	    "0,0,0,0,512,256\n0,0,0,1,256,256\n0,0,0,2,256,256\n0,0,0,3,128,128\n"
	    "0,1,0,0,513,256\n0,1,0,1,256,256\n0,1,0,2,256,256\n0,1,0,3,127.5,127.5\n"
	    "0,2,0,0,300,256\n0,2,0,1,256,256\n0,2,0,2,256,256\n0,2,0,3,234,234\n"
	    "0,3,0,0,256,256\n0,3,0,1,256,256\n0,3,0,2,256,256\n0,3,0,3,256,256\n";
	char *path = kt_temp_file(".csv", text, strlen(text));
	kiln_compilation c = *kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse(path, c.model->max_factor, a, stderr, &prof), 0);
	kiln_load_shape sh;
	kiln_sim_load_shape(&c, &sh);
	cr_assert(sh.ep == 4 && sh.experts_per_rank == 2 && sh.tokens == 1024 && sh.top_k == 2 &&
	          sh.microbatches == 4 && sh.layers == 7);
	static const int64_t iters[] = {2, 3};
	static const int64_t want[] = {21, 28};
	for (int x = 0; x < 2; x++)
		for (int exact = 0; exact < 2; exact++) {
			kiln_sim_config cfg = {.c = &c,
			                       .loads = prof,
			                       .iterations = iters[x],
			                       .seed = 1,
			                       .restart_s = 284,
			                       .checkpoint_every = 100,
			                       .exact = exact};
			kiln_sim_policy_kind k = KILN_SIM_MINDSPEED;
			kiln_sim_result r;
			cr_assert_eq(kiln_sim_run(&cfg, &k, 1, a, stderr, &r), 0);
			cr_expect_eq(r.triggered, want[x], "%lld iterations, exact %d: %lld",
			             (long long)iters[x], exact, (long long)r.triggered);
		}
	unlink(path);
	free(path);
	kiln_arena_free(a);
}

/* A factor trace spreads a rank's rows evenly over its experts
 * (docs/simulator.md, "Per-expert rows"), so the trigger sees the rank's
 * factor: rank 2 at 2.25x (each expert at 2.25 x 256 = 576 > 512) in
 * micro-batch 1 fires micro-batch 2, and at 2.0x (512) in micro-batch 3
 * fires nothing. Over 1 iteration: micro-batch 0 (no previous forward)
 * and 2, 2 * 7 = 14. A second iteration's micro-batch 0 follows the
 * first's micro-batch 3 (2.0x: no), failure or not (a restart replays the
 * failed iteration before the next one), and its micro-batch 2 fires:
 * 14 + 7 = 21. */
Test(sim_mindspeed, rank_level_loads_trigger_on_the_rank_factor)
{
	const char *text = "iteration,microbatch,layer,rank,factor\n"
	                   "0,1,0,0,0.75\n0,1,0,1,0.5\n0,1,0,2,2.25\n0,1,0,3,0.5\n"
	                   "0,3,0,0,1\n0,3,0,1,0.5\n0,3,0,2,2\n0,3,0,3,0.5\n";
	char *path = kt_temp_file(".csv", text, strlen(text));
	kiln_compilation c = *kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse(path, c.model->max_factor, a, stderr, &prof), 0);
	kiln_sim_config cfg = {.c = &c,
	                       .loads = prof,
	                       .iterations = 1,
	                       .seed = 1,
	                       .restart_s = 284,
	                       .checkpoint_every = 100};
	kiln_sim_policy_kind k = KILN_SIM_MINDSPEED;
	kiln_sim_result r;
	cr_assert_eq(kiln_sim_run(&cfg, &k, 1, a, stderr, &r), 0);
	cr_expect_eq(r.triggered, 14, "%lld", (long long)r.triggered);
	cfg.iterations = 2;
	cr_assert_eq(kiln_sim_run(&cfg, &k, 1, a, stderr, &r), 0);
	cr_expect_eq(r.triggered, 21, "%lld", (long long)r.triggered);
	unlink(path);
	free(path);
	kiln_arena_free(a);
}

/* DeepSeek-V3 does not fit keeping everything but norms and activations
 * (each stage holds its in-flight micro-batches' expert activations), so
 * MindSpeed's users recompute the first N layers of each stage in full
 * (--recompute-method block --recompute-num-layers N), the fewest that
 * fit at the design load 1.2. Checked against the simulator's own memory
 * count: every rank at 1.2x (a factor trace) for one iteration of one EP
 * group, exactly, fails nowhere; and N is below the stage's layers. */
Test(sim_mindspeed, block_recompute_fits_the_design_load, .init = kt_slow)
{
	kiln_compilation c =
	    *kt_compiled("examples/models/deepseek-v3-671b.yaml", KILN_SOLVER_DP, false);
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_sim_policy *p;
	cr_assert_eq(kiln_sim_policy_new(KILN_SIM_MINDSPEED, &c, NULL, 0, a, stderr, &p), 0);
	int32_t n = kiln_sim_policy_full_layers(p);
	int32_t most = 0;
	for (int32_t s = 0; s < c.graph->n_stages; s++)
		if (c.graph->stages[s].layer_end - c.graph->stages[s].layer_begin > most)
			most = c.graph->stages[s].layer_end - c.graph->stages[s].layer_begin;
	cr_expect(n >= 1 && n < most, "%d of %d layers", n, most);
	kiln_sim_policy_free(p);
	kiln_load_shape sh;
	kiln_sim_load_shape(&c, &sh);
	char *path = kt_temp_file(".csv", "", 0);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "iteration,microbatch,layer,rank,factor\n");
	for (int32_t i = 0; i < sh.microbatches; i++)
		for (int32_t l = 0; l < sh.layers; l++)
			for (int32_t r = 0; r < sh.ep; r++)
				fprintf(f, "0,%d,%d,%d,1.2\n", (int)i, (int)l, (int)r);
	cr_assert_eq(fclose(f), 0);
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse(path, c.model->max_factor, a, stderr, &prof), 0);
	kiln_sim_config cfg = {.c = &c,
	                       .loads = prof,
	                       .iterations = 1,
	                       .seed = 1,
	                       .restart_s = 284,
	                       .checkpoint_every = 100,
	                       .exact = 1,
	                       .max_groups = 1};
	kiln_sim_policy_kind k = KILN_SIM_MINDSPEED;
	kiln_sim_result r;
	cr_assert_eq(kiln_sim_run(&cfg, &k, 1, a, stderr, &r), 0);
	cr_expect_eq(r.ooms, 0);
	for (int32_t s = 0; s < r.n_stages; s++)
		cr_expect_leq(r.peak_bytes[s], c.budgets[s].capacity_bytes, "stage %d", s);
	unlink(path);
	free(path);
	kiln_arena_free(a);
}
