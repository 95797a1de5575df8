/* tests/test_costmodel.c: costmodel/memory.c, time.c and summary.c.
 *
 * Expected values are derived by hand in the comments (docs/cost-model.md
 * gives the equations), never pasted from the code's output.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "passes/passes.h"
#include "kiln_test.h"





/* ---------------------------------------------------------------- params */

/* DeepSeek-V3 / Kimi K2 shapes (DESIGN.md section 10, public configs). */
static void mla_moe_model(kt_model *tm, int64_t dense, int64_t heads, int64_t experts, int64_t vocab)
{
	kt_model_init(tm);
	kiln_model *m = &tm->m;
	m->layers = 61;
	m->dense_layers = dense;
	m->hidden = 7168;
	m->ffn_hidden = 18432;
	m->heads = m->kv_heads = heads;
	m->head_dim = 128;
	m->vocab = vocab;
	m->seq_len = 4096;
	m->mla = true;
	m->q_lora_rank = 1536;
	m->kv_lora_rank = 512;
	m->rope_head_dim = 64;
	m->v_head_dim = 128;
	m->moe = true;
	m->experts = experts;
	m->shared_experts = 1;
	m->top_k = 8;
	m->expert_ffn_hidden = 2048;
	m->global_batch = 16;
	kt_model_finish(tm);
	m->dense_layers = dense;
}

/* DeepSeek-V3, by hand (h = 7168):
 *   MLA attention per layer:
 *     q_down h*1536 = 11,010,048; q_norm 1,536; q_up 1536*128*(128+64) =
 *     37,748,736; kv_down h*(512+64) = 4,128,768; kv_norm 512; kv_up
 *     512*128*(128+128) = 16,777,216; out_proj 128*128*h = 117,440,512
 *     = 187,107,328; plus two norms 2h = 14,336 -> 187,121,664.
 *   dense FFN 3*h*18432 = 396,361,728 -> dense layer 583,483,392 (x3 =
 *     1,750,450,176).
 *   MoE: router h*256 = 1,835,008; routed 256*3*h*2048 = 11,274,289,152;
 *     shared 3*h*2048 = 44,040,192 -> MoE layer 11,507,286,016 (x58 =
 *     667,422,588,928).
 *   embedding 129280*h = 926,679,040; head: final norm 7,168 + lm_head
 *     926,679,040.
 *   total = 671,026,404,352 (about 671.0e9).
 *   routed experts 58 * 11,274,289,152 = 653,908,770,816; active = total -
 *   routed + 58*8*3*h*2048 (20,434,649,088) = 37,552,282,624. */
Test(costmodel_params, deepseek_v3)
{
	kt_model tm;
	mla_moe_model(&tm, 3, 128, 256, 129280);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	kiln_cost_params p;
	kiln_cost_params_count(g, &p);
	cr_expect(fabs((double)p.total - 671e9) < 0.01 * 671e9, "total %llu",
	          (unsigned long long)p.total);
	cr_expect_eq(p.total, 671026404352ull);
	cr_expect_eq(p.expert, 653908770816ull);
	cr_expect_eq(p.active, 37552282624ull);
	kiln_arena_free(a);
}

/* Kimi K2, by hand (h = 7168, 64 heads, 384 experts, vocab 163840):
 *   MLA attention per layer: q_down 11,010,048; q_norm 1,536; q_up
 *     1536*64*192 = 18,874,368; kv_down 4,128,768; kv_norm 512; kv_up
 *     512*64*256 = 8,388,608; out_proj 64*128*h = 58,720,256
 *     = 101,124,096; plus norms 14,336 -> 101,138,432.
 *   dense layer (1): 101,138,432 + 396,361,728 = 497,500,160.
 *   MoE layer (60): router h*384 = 2,752,512; routed 384*44,040,192 =
 *     16,911,433,728; shared 44,040,192 -> 17,059,364,864 (x60 =
 *     1,023,561,891,840).
 *   embedding 163840*h = 1,174,405,120; head 1,174,405,120 + 7,168.
 *   total = 1,026,408,209,408 (about 1.026e12).
 * The Kimi K2 report's headline is 1.04T, 1.3% above what its public config
 * gives; the gap is about one MoE layer (17.06e9), e.g. a multi-token
 * prediction module the config does not list. kiln counts what the config
 * describes, so the test holds the hand count exactly and the headline
 * within 1.5% (not the 1% the issue asked for: see the README's note). */
Test(costmodel_params, kimi_k2)
{
	kt_model tm;
	mla_moe_model(&tm, 1, 64, 384, 163840);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	kiln_cost_params p;
	kiln_cost_params_count(g, &p);
	double hand = 1026408209408.0;
	cr_expect(fabs((double)p.total - hand) < 0.001 * hand, "total %llu",
	          (unsigned long long)p.total);
	cr_expect_eq(p.expert, 60ull * 16911433728ull);
	cr_expect(fabs((double)p.total - 1.04e12) < 0.015 * 1.04e12, "total %llu",
	          (unsigned long long)p.total);
	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- static */

/* A small MoE layout: h 64, 4 heads of 16, SwiGLU FFN 256, vocab 1000,
 * layers 4 (1 dense), 4 experts of fe 32 + 1 shared, tp 2, pp 2, 8 devices
 * (dp 2), ep 2 (edp = dp*tp/ep = 2), Adam, distributed optimizer.
 * Stage 0 = embedding + layer 0 (dense) + layer 1 (moe), per device:
 *   embedding ceil(1000/2)*64 = 32,000
 *   dense layer: ln1 64 + qkv 64*(2*16 + 2*2*16) = 6,144 + out_proj
 *     2*16*64 = 2,048 + ln2 64 + ffn_up 64*(512/2) = 16,384 + ffn_down
 *     (256/2)*64 = 8,192 = 32,896
 *   moe layer: attention + norms 64+6,144+2,048+64 = 8,320, router 64*4 =
 *     256, shared up 64*(64/2) = 2,048, shared down (32/2)*64 = 1,024 ->
 *     11,648 non-expert; experts (4/2)*(64*64 + 32*64) = 12,288 expert.
 *   non-expert 76,544, expert 12,288, params 88,832
 *   weights 2*88,832 = 177,664; grads 4*88,832 = 355,328
 *   optimizer 12*76,544/2 + 12*12,288/2 = 459,264 + 73,728 = 532,992
 *   total 1,065,984. */
static void static_model(kt_model *tm)
{
	kt_model_init(tm);
	kiln_model *m = &tm->m;
	m->moe = true;
	m->dense_layers = 1;
	m->experts = 4;
	m->shared_experts = 1;
	m->top_k = 2;
	m->expert_ffn_hidden = 32;
	m->tp = 2;
	m->pp = 2;
	m->devices = 8;
	m->ep = 2;
	m->sequence_parallel = true;
	m->distributed_optimizer = true;
	kt_model_finish(tm);
	m->dense_layers = 1;
}

Test(costmodel_static, distributed_adam_by_hand)
{
	kt_model tm;
	static_model(&tm);
	cr_assert_eq(tm.m.dp, 2);
	cr_assert_eq(tm.m.edp, 2);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	kiln_cost_static s;
	kiln_cost_stage_static(g, 0, &s);
	cr_expect_eq(s.params, 88832);
	cr_expect_eq(s.weights, 177664);
	cr_expect_eq(s.grads, 355328);
	cr_expect_eq(s.optimizer, 532992);
	cr_expect_eq(s.total, 1065984);
	kiln_arena_free(a);
}

/* Same layout, plain SGD without sharding: optimizer 8 bytes per parameter,
 * 8*88,832 = 710,656. */
Test(costmodel_static, sgd_unsharded)
{
	kt_model tm;
	static_model(&tm);
	tm.m.distributed_optimizer = false;
	tm.m.optimizer = KILN_OPTIM_SGD;
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	kiln_cost_static s;
	kiln_cost_stage_static(g, 0, &s);
	cr_expect_eq(s.optimizer, 710656);
	cr_expect_eq(s.total, 177664 + 355328 + 710656);
	kiln_arena_free(a);
}

/* fp32 training (training.dtype fp32) keeps fp32 weights, which are their
 * own main copy (Megatron's FP32Optimizer): weights 4*88,832 = 355,328,
 * grads 4*88,832 = 355,328; Adam's two moments 8 bytes per parameter,
 * sharded: 8*76,544/2 + 8*12,288/2 = 306,176 + 49,152 = 355,328; total
 * 1,065,984. Unsharded: 8*88,832 = 710,656, total 1,421,312 (16 bytes per
 * parameter). SGD's momentum alone, unsharded: 4*88,832 = 355,328. */
Test(costmodel_static, fp32_weights_and_optimizer)
{
	kt_model tm;
	static_model(&tm);
	tm.m.dtype = KILN_DTYPE_FP32;
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	kiln_cost_static s;
	kiln_cost_stage_static(g, 0, &s);
	cr_expect_eq(s.params, 88832);
	cr_expect_eq(s.weights, 355328);
	cr_expect_eq(s.grads, 355328);
	cr_expect_eq(s.optimizer, 355328);
	cr_expect_eq(s.total, 1065984);
	kiln_arena_free(a);

	tm.m.distributed_optimizer = false;
	g = kt_lower_ok(&tm.m, &a);
	kiln_cost_stage_static(g, 0, &s);
	cr_expect_eq(s.optimizer, 710656);
	cr_expect_eq(s.total, 1421312);
	kiln_arena_free(a);

	tm.m.optimizer = KILN_OPTIM_SGD;
	g = kt_lower_ok(&tm.m, &a);
	kiln_cost_stage_static(g, 0, &s);
	cr_expect_eq(s.optimizer, 355328);
	kiln_arena_free(a);
}

/* Mixed precision with fp8 activations counts as Megatron's estimator
 * does (16-bit weights): the bf16 figures of distributed_adam_by_hand. */
Test(costmodel_static, fp8_counts_as_mixed_precision)
{
	kt_model tm;
	static_model(&tm);
	tm.m.dtype = KILN_DTYPE_FP8;
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	kiln_cost_static s;
	kiln_cost_stage_static(g, 0, &s);
	cr_expect_eq(s.weights, 177664);
	cr_expect_eq(s.grads, 355328);
	cr_expect_eq(s.optimizer, 532992);
	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- inflight */

static void pp_model(kt_model *tm, int64_t pp, int64_t vpp, int64_t mb)
{
	kt_model_init(tm);
	kiln_model *m = &tm->m;
	m->layers = pp * vpp * 2;
	m->pp = pp;
	m->vpp = vpp;
	m->schedule = vpp > 1 ? KILN_SCHED_INTERLEAVED : KILN_SCHED_1F1B;
	m->devices = pp;
	m->global_batch = mb;
	kt_model_finish(tm);
}

Test(costmodel_inflight, one_f_one_b)
{
	/* p = 4, m = 8: min(p - s, m) = 4, 3, 2, 1. */
	kt_model tm;
	pp_model(&tm, 4, 1, 8);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	for (int32_t s = 0; s < 4; s++)
		cr_expect_float_eq(kiln_cost_stage_inflight(g, s), (double)(4 - s), 1e-12);
	kiln_arena_free(a);
	/* p = 4, m = 2: 2, 2, 2, 1. */
	pp_model(&tm, 4, 1, 2);
	g = kt_lower_ok(&tm.m, &a);
	static const double want[] = {2, 2, 2, 1};
	for (int32_t s = 0; s < 4; s++)
		cr_expect_float_eq(kiln_cost_stage_inflight(g, s), want[s], 1e-12);
	kiln_arena_free(a);
}

Test(costmodel_inflight, interleaved)
{
	/* p = 4, v = 2, m = 8: chunks in flight min(16, 2*(p-s-1) + (v-1)*p + 1)
	 * = 11, 9, 7, 5 -> 5.5, 4.5, 3.5, 2.5 stage micro-batches. */
	kt_model tm;
	pp_model(&tm, 4, 2, 8);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	static const double want[] = {5.5, 4.5, 3.5, 2.5};
	for (int32_t s = 0; s < 4; s++)
		cr_expect_float_eq(kiln_cost_stage_inflight(g, s), want[s], 1e-12);
	kiln_arena_free(a);
	/* m = 2: at most m*v = 4 chunks -> 2, 2, 2, 2. */
	pp_model(&tm, 4, 2, 2);
	g = kt_lower_ok(&tm.m, &a);
	for (int32_t s = 0; s < 4; s++)
		cr_expect_float_eq(kiln_cost_stage_inflight(g, s), 2.0, 1e-12);
	kiln_arena_free(a);
}

/* With EP overlap (Megatron's --overlap-moe-expert-parallel-comm) each stage
 * runs one warm-up forward more (schedules.py lines 966-970 at d98e8a64;
 * combined_1f1b.py lines 76-135 with pp 1), and a combined step holds the
 * forward's and the backward's micro-batches at once: one more in flight.
 * By hand: 1F1B p = 4, m = 8: min(p - s + 1, m) = 5, 4, 3, 2; m = 3: 3, 3,
 * 3, 2; p = 1, m = 4: 2. Interleaved p = 4, v = 2, m = 8: chunks
 * min(16, 2*(p-s-1) + (v-1)*p + 2) = 12, 10, 8, 6 -> 6, 5, 4, 3. */
Test(costmodel_inflight, overlap_holds_one_more)
{
	static const struct {
		int64_t pp, vpp, mb;
		double want[4];
	} cases[] = {{4, 1, 8, {5, 4, 3, 2}},
	             {4, 1, 3, {3, 3, 3, 2}},
	             {1, 1, 4, {2}},
	             {1, 1, 1, {1}},
	             {4, 2, 8, {6, 5, 4, 3}}};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		kt_model tm;
		pp_model(&tm, cases[k].pp, cases[k].vpp, cases[k].mb);
		tm.m.overlap_ep_comm = true;
		kiln_arena *a;
		kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
		for (int32_t s = 0; s < cases[k].pp; s++)
			cr_expect_float_eq(kiln_cost_stage_inflight(g, s), cases[k].want[s], 1e-12,
			                   "case %zu stage %d: %g, want %g", k, s,
			                   kiln_cost_stage_inflight(g, s), cases[k].want[s]);
		kiln_arena_free(a);
	}
}

/* ---------------------------------------------------------------- activations */

/* Aliased tensors count once: a builder graph with x (100 B saved), y
 * aliasing x (saved), z (7 B + 3 B per row, saved expert), w (unsaved). */
Test(costmodel_activation, alias_groups_once)
{
	kt_model tm;
	kt_model_init(&tm);
	kiln_arena *a = kiln_arena_new();
	kiln_ir_builder *b = kiln_ir_builder_new(a, &tm.m);
	kiln_ir_builder_stage(b);
	kiln_ir_builder_layer(b, KILN_LAYER_MOE, 0, 0, 10);
	int32_t x = kiln_ir_builder_tensor(b, "x", (kiln_lin){100, 0}, KILN_T_SAVED, -1);
	kiln_ir_builder_tensor(b, "y", (kiln_lin){100, 0}, KILN_T_SAVED, x);
	kiln_ir_builder_tensor(b, "z", (kiln_lin){7, 3}, KILN_T_SAVED | KILN_T_EXPERT, -1);
	kiln_ir_builder_tensor(b, "w", (kiln_lin){1000, 0}, 0, -1);
	kiln_ir_graph *g = kiln_ir_builder_finish(b);
	cr_assert_not_null(g);
	kiln_lin l = kiln_cost_layer_activation(g, 0);
	cr_expect_eq(l.base, 107);
	cr_expect_eq(l.per_n, 3);
	/* At r = 2: N = 2 * 10, bytes = 107 + 3*20 = 167. */
	cr_expect_float_eq(kiln_cost_stage_activation_bytes(g, 0, 2.0), 167.0, 1e-9);
	kiln_arena_free(a);
}

/* A stage's bytes at r are the sum of its layers at N = r * n_balanced:
 * equal to the keep-all sums plus per_n * r * n_balanced per MoE layer. */
Test(costmodel_activation, stage_sum_at_load)
{
	kt_model tm;
	static_model(&tm);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	/* Stage 1: layers 2, 3 (moe) and the head. n_balanced = T/t * k = 64 * 2. */
	const kiln_ir_stage *st = &g->stages[1];
	double base = 0, per_n = 0;
	for (int32_t t = g->layers[st->layer_begin].tensor_begin;
	     t < g->layers[st->layer_end - 1].tensor_end; t++) {
		if (g->tensors[t].flags & KILN_T_SAVED) {
			base += (double)g->tensors[t].bytes.base;
			per_n += (double)g->tensors[t].bytes.per_n;
		}
	}
	/* Two MoE layers, each per row: perm_idx 4 + expert_in 2*64 + expert_up
	 * 2*(2*32) + expert_act 2*32 + expert_out 2*64 = 452 bytes. */
	cr_expect_float_eq(per_n, 2.0 * (4 + 128 + 128 + 64 + 128), 1e-9);
	for (double r = 0; r <= 3; r += 0.5)
		cr_expect_float_eq(kiln_cost_stage_activation_bytes(g, 1, r),
		                   base + per_n * r * 128, 1e-6);
	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- time */

/* Op times by hand through kiln_cost_op_time_us, which is the step-time
 * model's kiln_cost_step_op_us with the profile's own figures
 * (docs/cost-model.md, "Op time" and "Step time"). kt_model_init's profile
 * states no time_* figure, so its defaults hold: GEMMs and attention at
 * gemm_efficiency 0.5 whatever their rows, collectives at the full link
 * rate, no kernel floor. Peak 1000 TFLOP/s at 0.5 = 5e8 FLOPs per us; HBM
 * 3000 GB/s = 3e6 bytes per us; intra-node 400 GB/s = 4e5 bytes per us,
 * inter-node 50 GB/s = 5e4; nodes of 8. */
Test(costmodel_time, ops_by_hand)
{
	kt_model tm;
	kt_model_init(&tm);
	kiln_ir_graph g = {.model = &tm.m};
	kiln_ir_op op = {.kind = KILN_OP_FFN_UP, .flops = {1e12, 0}};
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 2000.0, 1e-9);
	/* Backward: data gradient and weight gradient, each half the FLOPs,
	 * both at 0.5 without a rows figure: 2e12 / 5e8. */
	op.backward = true;
	op.flops.base = 2e12;
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 4000.0, 1e-9);
	op = (kiln_ir_op){.kind = KILN_OP_EXPERT_UP, .flops = {0, 1e9}};
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 3), 6.0, 1e-9);
	op = (kiln_ir_op){.kind = KILN_OP_NORM, .traffic = {6e9, 0}};
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 2000.0, 1e-9);
	/* Flash attention: the causal mask halves the work: 5e11 FLOPs (1000
	 * us) against 3e9 bytes (1000 us); 9e9 bytes (3000 us) win. Eager
	 * computes the whole score matrix: 1e12 FLOPs, 2000 us. */
	op = (kiln_ir_op){.kind = KILN_OP_ATTN_CORE, .flops = {1e12, 0}, .traffic = {3e9, 0}};
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 1000.0, 1e-9);
	op.traffic.base = 9e9;
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 3000.0, 1e-9);
	tm.m.attention = KILN_ATTN_EAGER;
	op.traffic.base = 3e9;
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 2000.0, 1e-9);
	tm.m.attention = KILN_ATTN_FLASH;
	/* All-reduce of 4e9 bytes over 4 ranks in a node: 2*3/4*4e9/400e9 s. */
	op = (kiln_ir_op){.kind = KILN_OP_TP_COMM,
	                  .comm_bytes = {4e9, 0},
	                  .comm_group = 4,
	                  .collective = KILN_COLL_ALL_REDUCE};
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 15000.0, 1e-6);
	op.collective = KILN_COLL_ALL_GATHER;
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 7500.0, 1e-6);
	op.collective = KILN_COLL_REDUCE_SCATTER;
	op.comm_group = 16; /* beyond a node: 15/16*4e9/50e9 s */
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 75000.0, 1e-6);
	op.collective = KILN_COLL_NONE;
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 0.0, 1e-12);
	/* All-to-all of 1e6 bytes per row at N = 1000 over ep = 8 in one node:
	 * the rank's own 1/8 stays, 7/8 * 1e9 bytes over NVLink at 4e5 bytes
	 * per us: 2187.5 us. */
	tm.m.moe = true;
	tm.m.experts = 16;
	tm.m.top_k = 2;
	tm.m.ep = 8;
	op = (kiln_ir_op){.kind = KILN_OP_DISPATCH,
	                  .comm_bytes = {0, 1e6},
	                  .comm_group = 8,
	                  .collective = KILN_COLL_ALL_TO_ALL};
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 1000), 2187.5, 1e-6);
	/* ep = 16 over two nodes: 7/16 of 1e9 bytes over NVLink (1093.75 us)
	 * beside 8/16 over the inter-node links (5e8 / 5e4 = 10000 us); the
	 * slower sets the time (the roofline priced all 15/16 at 50 GB/s:
	 * 18750 us). */
	tm.m.ep = 16;
	op.comm_group = 16;
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 1000), 10000.0, 1e-6);
	tm.m.ep = 1;
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 1000), 0.0, 1e-12);
	/* Pipeline sends overlap compute in steady state and cost 0 per op;
	 * the step's p2p_us prices them (pipeline_bubble below). */
	op = (kiln_ir_op){.kind = KILN_OP_PP_SEND,
	                  .comm_bytes = {1e9, 0},
	                  .comm_group = 2,
	                  .collective = KILN_COLL_SEND};
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 0.0, 1e-12);
	op.collective = KILN_COLL_RECV;
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 0.0, 1e-12);
}

/* The profile's fitted figures reach the planner's op times: the test
 * profile given h100-sxm.yaml's time_* values (time_gemm_efficiency 0.85,
 * time_gemm_half_rows 1600, time_attention_efficiency 0.30,
 * time_comm_efficiency 0.95, time_inter_node_efficiency 0.57,
 * time_kernel_floor_us 5), its own round peak and bandwidths kept. */
Test(costmodel_time, ops_use_the_profile_figures)
{
	kt_model tm;
	kt_model_init(&tm);
	kiln_hardware *hw = &tm.m.hw;
	hw->time_gemm_efficiency = 0.85;
	hw->time_gemm_half_rows = 1600;
	hw->time_attention_efficiency = 0.30;
	hw->time_comm_efficiency = 0.95;
	hw->time_inter_node_efficiency = 0.57;
	hw->time_kernel_floor_us = 5;
	kiln_ir_graph g = {.model = &tm.m};
	/* A dense GEMM of one micro-batch's 128 rows runs at 0.85 * 128 /
	 * (128 + 1600) = 0.062963 of peak: 1e12 / (1e9 * 0.85 * 128 / 1728) =
	 * 1728e3 / 108.8 = 15882.352941 us. */
	kiln_ir_op op = {.kind = KILN_OP_FFN_UP, .flops = {1e12, 0}};
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 1728e3 / 108.8, 1e-6);
	/* Its backward: the data gradient (1e12 FLOPs) at that share, the
	 * weight gradient (1e12) at 0.85: 15882.352941 + 1e3 / 0.85 =
	 * 15882.352941 + 1176.470588 = 17058.823529 us. */
	op.backward = true;
	op.flops.base = 2e12;
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 1728e3 / 108.8 + 1e3 / 0.85, 1e-6);
	/* A memory-bound kernel: 6e9 bytes at 3e6 bytes per us, 2000 us, plus
	 * the 5 us floor. */
	op = (kiln_ir_op){.kind = KILN_OP_NORM, .traffic = {6e9, 0}};
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 2005.0, 1e-9);
	/* Flash attention: 5e11 causal FLOPs at 0.30 of 1e9 per us =
	 * 1666.666667 us, above its 3e9 bytes (1000 us); plus the floor. */
	op = (kiln_ir_op){.kind = KILN_OP_ATTN_CORE, .flops = {1e12, 0}, .traffic = {3e9, 0}};
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 5e11 / 3e8 + 5, 1e-6);
	/* All-reduce of 4e9 bytes over 4 ranks in a node at 0.95 of 4e5 bytes
	 * per us: 6e9 / 3.8e5 = 15789.473684 us. */
	op = (kiln_ir_op){.kind = KILN_OP_TP_COMM,
	                  .comm_bytes = {4e9, 0},
	                  .comm_group = 4,
	                  .collective = KILN_COLL_ALL_REDUCE};
	cr_expect_float_eq(kiln_cost_op_time_us(&g, &op, 0), 6e9 / 3.8e5, 1e-6);
}

/* One dense layer, t = 1, flash, GeLU ffn 256, T = 128, h = 64, H = 4,
 * d = 16, vocab 1000, with HBM made so fast that memory-bound ops vanish,
 * on the test profile (every GEMM and the attention core at 0.5 of 1000
 * TFLOP/s: 5e8 FLOPs per us; no floor, no host time).
 * Forward FLOPs: qkv 2*128*64*192 = 3,145,728; core 2*128^2*4*32 =
 * 4,194,304, halved by the causal mask: 2,097,152; out_proj 2*128*64*64 =
 * 1,048,576; ffn_up and ffn_down 2*128*64*256 = 4,194,304 each; lm_head
 * 2*128*64*1000 = 16,384,000; total 31,064,064. Backward: 2x the GEMMs
 * (2 * 28,966,912 = 57,933,824) and 2.5x the core, halved (5,242,880):
 * 63,176,704. */
Test(costmodel_time, iteration_by_hand)
{
	kt_model tm;
	kt_model_init(&tm);
	tm.m.layers = 1;
	tm.m.activation = KILN_FN_GELU;
	tm.m.hw.hbm_gbps = 1e15;
	tm.m.global_batch = 4;
	kt_model_finish(&tm);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	double rate = 5e8; /* FLOPs per us */
	double f, b;
	kiln_cost_stage_time(g, 0, 1.0, &f, &b);
	cr_expect(fabs(f - 31064064.0 / rate) < 1e-6 * f, "fwd %g", f);
	cr_expect(fabs(b - 63176704.0 / rate) < 1e-6 * b, "bwd %g", b);
	kiln_cost_step it;
	kiln_cost_step_estimate(g, 1.0, NULL, &it);
	/* p = 1, m = 4, one device: iteration = 4 * (fwd + bwd) plus the
	 * optimizer step at the (vanishing) HBM rate. */
	double iter_s = 4 * (31064064.0 + 63176704.0) / rate * 1e-6;
	cr_expect(fabs(it.iteration_s - iter_s) < 1e-6 * iter_s);
	cr_expect_float_eq(it.bubble_fraction, 0.0, 1e-12);
	/* Model FLOPs as Megatron counts them (training.py, transformer_flops):
	 * per token 6 * (GeLU MLP 64*256*2 = 32,768 + qkv and out projections
	 * 64*(64+128) + 64*64 = 16,384 + causal core 64*128/2*2 = 8,192 + logits
	 * over the vocabulary padded to 1024: 64*1024 = 65,536) = 737,280; 4
	 * sequences of 128 tokens: 377,487,360. */
	cr_expect_float_eq(it.model_flops, 377487360.0, 1.0);
	cr_expect(fabs(it.mfu - 377487360.0 / (iter_s * 1e15)) < 1e-6);
	cr_expect(fabs(it.tokens_per_s - 4 * 128 / iter_s) < 1e-6 * it.tokens_per_s);
	cr_expect_eq(it.slowest_stage, 0);
	kiln_arena_free(a);
}

/* 1F1B with p = 4, m = 8 on 4 devices (one per stage, all in one node):
 * the step is (m + p - 1) * slowest stage, plus the fill's and drain's
 * pipeline sends, 2 * (p - 1) of them, plus the optimizer; interleaved v =
 * 2: (m + (p-1)/v) stage times. A send is one micro-batch's activation,
 * 2 bytes * 128 tokens * 64 = 16,384 bytes, at NVLink's 4e5 bytes per us
 * (stages are one device apart, inside a node): 0.04096 us; the busiest
 * stage sends once per chunk it holds, v times. The optimizer (Adam, no
 * distributed optimizer, dp 1): 34 bytes per weight element at 3e6 bytes
 * per us on the stage with most: the last, 2v layers (pp_model: 2 per
 * chunk) of (qkv 64*192 + out 64*64 + SwiGLU 3*64*256 + norms 2*64) =
 * 65,664 each, the final norm 64 and the untied lm_head 1000*64: 195,392
 * elements for v = 1 (2.214443 us), 326,720 for v = 2 (3.702827 us). */
Test(costmodel_time, pipeline_bubble)
{
	for (int64_t v = 1; v <= 2; v++) {
		kt_model tm;
		pp_model(&tm, 4, v, 8);
		kiln_arena *a;
		kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
		double worst = 0;
		for (int32_t s = 0; s < 4; s++) {
			double f, b;
			kiln_cost_stage_time(g, s, 1.0, &f, &b);
			worst = f + b > worst ? f + b : worst;
		}
		kiln_cost_step it;
		kiln_cost_step_estimate(g, 1.0, NULL, &it);
		double bubble = 3.0 / (double)v;
		double p2p = 16384.0 * (double)v / 4e5;
		double opt = (2.0 * (double)v * 65664 + 64064) * 34 / 3e6;
		cr_expect(fabs(it.p2p_us - p2p) < 1e-12, "p2p %g", it.p2p_us);
		cr_expect(fabs(it.optimizer_us - opt) < 1e-9, "optimizer %g", it.optimizer_us);
		cr_expect_float_eq(it.dp_exposed_us, 0.0, 1e-12);
		double fill = bubble * worst + 2 * 3 * p2p;
		double total = 8 * worst + fill + opt;
		cr_expect(fabs(it.iteration_s - total * 1e-6) < 1e-9 * it.iteration_s);
		cr_expect_float_eq(it.bubble_fraction, fill / total, 1e-12);
		cr_expect_eq(it.slowest_stage, 3); /* the head's lm_head dominates */
		kiln_arena_free(a);
	}
}

/* Time grows with the load in MoE layers only through per-row costs. */
Test(costmodel_time, moe_time_grows_with_load)
{
	kt_model tm;
	static_model(&tm);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	double f1, b1, f2, b2;
	kiln_cost_stage_time(g, 1, 1.0, &f1, &b1);
	kiln_cost_stage_time(g, 1, 2.0, &f2, &b2);
	cr_expect_gt(f2, f1);
	cr_expect_gt(b2, b1);
	/* Linear in r: t(3) - t(2) = t(2) - t(1). */
	double f3, b3;
	kiln_cost_stage_time(g, 1, 3.0, &f3, &b3);
	cr_expect(fabs((f3 - f2) - (f2 - f1)) < 1e-9 * f3);
	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- summary */

Test(costmodel_summary, fields_consistent)
{
	kt_model tm;
	static_model(&tm);
	tm.m.max_factor = 3.0;
	tm.m.global_batch = 16; /* m = 8 */
	kt_model_finish(&tm);
	tm.m.dense_layers = 1;
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	kiln_cost_stage_summary s;
	kiln_cost_stage_summarize(g, 0, &s);
	cr_expect_eq(s.stage, 0);
	cr_expect_eq(s.layers, 2);
	cr_expect_eq(s.moe_layers, 1);
	cr_expect(s.embedding);
	cr_expect(!s.head);
	cr_expect_eq(s.st.total, 1065984); /* distributed_adam_by_hand */
	cr_expect_float_eq(s.inflight, 2.0, 1e-12);
	cr_expect_float_eq(s.capacity_bytes, 76.0 * 1073741824.0, 1e-3);
	cr_expect_float_eq(s.peak_r1_bytes, 1065984.0 + 2 * s.act_r1_bytes, 1e-3);
	cr_expect_float_eq(s.peak_spike_bytes, 1065984.0 + s.act_r1_bytes + s.act_max_bytes, 1e-3);
	cr_expect_float_eq(s.headroom_bytes, s.capacity_bytes - s.peak_spike_bytes, 1e-3);
	cr_expect_float_eq(s.act_max_bytes, kiln_cost_stage_activation_bytes(g, 0, 3.0), 1e-6);
	cr_expect_gt(s.act_max_bytes, s.act_r1_bytes);
	cr_expect_gt(s.fwd_us, 0);
	cr_expect_gt(s.bwd_us, s.fwd_us);
	kiln_cost_stage_summarize(g, 1, &s);
	cr_expect(s.head);
	cr_expect_float_eq(s.inflight, 1.0, 1e-12);
	kiln_arena_free(a);
}

/* The one HBM formula: 3,000 GB/s moves 3e9 bytes per ms, so 6e6 bytes
 * take 2 us; no bandwidth (or no bytes) costs nothing. A memory-bound op
 * and an offload's copy-engine traffic of the same bytes are priced by it
 * alike, so the planner's instance holds bit-identical costs for them. */
Test(costmodel_time, hbm_formula_by_hand)
{
	kiln_hardware hw = {.hbm_gbps = 3000};
	cr_expect_float_eq(kiln_cost_hbm_us(&hw, 6e6), 2.0, 1e-12);
	cr_expect_eq(kiln_cost_hbm_us(&hw, 0), 0.0);
	hw.hbm_gbps = 0;
	cr_expect_eq(kiln_cost_hbm_us(&hw, 6e6), 0.0);
}
