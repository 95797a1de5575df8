/* tests/test_flops.c: model FLOPs as Megatron counts them (costmodel/flops.c).
 *
 * Expected values: hand calculations from Megatron-LM's
 * num_floating_point_operations (megatron/training/training.py, written out
 * in the comments), and the FLOPs per token published measured runs imply
 * (shared/anchors/throughput.md: TFLOPS/GPU divided by tokens/s/GPU).
 */
#include <criterion/criterion.h>
#include <math.h>

#include "costmodel/costmodel.h"
#include "frontend/frontend.h"
#include "kiln_test.h"

/* kt_model_init's dense model (h 64, 4 heads of 16, kv 4, ffn 256, seq 128,
 * vocab 1000), 1 layer, GeLU: per token 6 * (MLP 64*256*2 = 32,768 + qkv and
 * out projections 64*(64+128) + 64*64 = 16,384 + causal core 64*128/2*2 =
 * 8,192 + logits 64*1024 (vocab padded to 128) = 65,536) = 737,280. */
Test(costmodel_flops, dense_by_hand)
{
	kt_model tm;
	kt_model_init(&tm);
	tm.m.layers = 1;
	tm.m.dense_layers = 1;
	tm.m.activation = KILN_FN_GELU;
	kt_model_finish(&tm);
	cr_expect_float_eq(kiln_cost_model_flops_per_token(&tm.m), 737280.0, 1e-6);
	/* Megatron before core 0.12 counted the whole score matrix: the core
	 * term doubles, 6 * 8,192 more. */
	cr_expect_float_eq(kiln_cost_model_flops_per_token_ex(&tm.m, false), 737280.0 + 49152.0,
	                   1e-6);
	/* SwiGLU: the MLP term is 64*256*3 = 49,152 instead: 6 * 139,264. */
	tm.m.activation = KILN_FN_SWIGLU;
	cr_expect_float_eq(kiln_cost_model_flops_per_token(&tm.m), 835584.0, 1e-6);
	/* GeGLU and quick GeGLU run the same three GEMMs, but Megatron counts the
	 * gated multiplier for SiLU only (args.swiglu): two GEMMs, 737,280. */
	tm.m.activation_fn = KILN_ACTFN_GEGLU;
	cr_expect_float_eq(kiln_cost_model_flops_per_token(&tm.m), 737280.0, 1e-6);
	tm.m.activation_fn = KILN_ACTFN_QUICK_GEGLU;
	cr_expect_float_eq(kiln_cost_model_flops_per_token(&tm.m), 737280.0, 1e-6);
	tm.m.activation_fn = KILN_ACTFN_SWIGLU;
	/* tp 2 pads the vocabulary to a multiple of 256: still 1024. tp 16: 2048,
	 * so the logits add 6 * 64 * 1024 more. */
	tm.m.tp = 16;
	cr_expect_float_eq(kiln_cost_padded_vocab(&tm.m), 2048.0, 1e-9);
	cr_expect_float_eq(kiln_cost_model_flops_per_token(&tm.m), 835584.0 + 6.0 * 64 * 1024,
	                   1e-6);
}

/* h 64, 4 heads, MLA (q_lora 32, kv_lora 16, nope 16, rope 8, v 16), seq 128,
 * 2 layers (1 dense of SwiGLU ffn 256), MoE of 4 experts, 1 shared, top-2,
 * expert ffn 32, vocab 1000 -> 1024. Per token, before the factor 6:
 *   q: 32*(64 + 4*(16+8) + 1) = 5,152; kv: 16*(64 + 4*(16+16) + 1) = 3,088;
 *   rope k: 64*8 = 512; out: 4*16*64 = 4,096; linear 12,848;
 *   core: 128*(4*24/2 + 4*16/2) = 10,240; per layer 23,088, two: 46,176;
 *   MLP: 64*(256*3 + 32*2*3 + 32*1*3) = 67,584; logits 65,536.
 *   Sum 179,296, times 6: 1,075,776.
 * With one MTP layer (the last layer is MoE, so it counts as a MoE layer):
 *   + 23,088 attention + 64*(192 + 96) = 18,432 MLP + (3*64 + 2*64*64) = 8,384
 *   projections + 65,536 second logits = 294,736, times 6: 1,768,416. */
Test(costmodel_flops, moe_mla_mtp_by_hand)
{
	kt_model tm;
	kt_model_init(&tm);
	kiln_model *m = &tm.m;
	m->layers = 2;
	m->dense_layers = 1;
	m->mla = true;
	m->q_lora_rank = 32;
	m->kv_lora_rank = 16;
	m->head_dim = 16;
	m->rope_head_dim = 8;
	m->v_head_dim = 16;
	m->moe = true;
	m->experts = 4;
	m->shared_experts = 1;
	m->top_k = 2;
	m->expert_ffn_hidden = 32;
	kt_model_finish(&tm);
	cr_expect_float_eq(kiln_cost_model_flops_per_token(m), 1075776.0, 1e-6);
	m->megatron.mtp_num_layers = 1;
	cr_expect_float_eq(kiln_cost_model_flops_per_token(m), 1768416.0, 1e-6);
	/* Without the q low-rank projection: q is 64*4*(16+8) = 6,144 instead of
	 * 5,152, per layer +992, for the 3 layers +2,976, times 6. */
	m->q_lora_rank = 0;
	cr_expect_float_eq(kiln_cost_model_flops_per_token(m), 1768416.0 + 6.0 * 2976, 1e-6);
}

static double flops_of(const char *rel)
{
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_model *m;
	cr_assert_eq(kiln_frontend_load_file(kt_src(rel), a, stderr, &m), KILN_FRONTEND_OK, "%s",
	             rel);
	double f = kiln_cost_model_flops_per_token(m);
	kiln_arena_free(a);
	return f;
}

/* The published runs' FLOPs per token (shared/anchors/throughput.md, TFLOPS
 * divided by tokens/s): kiln's count within 2%. */
Test(costmodel_flops, published_runs_within_two_percent)
{
	static const struct {
		const char *rel;
		double gflop;
	} cases[] = {
	    {"examples/anchors/f-deepseek-v3-671b-mtp.yaml", 260.0},
	    {"examples/models/qwen3-235b-a22b.yaml", 147.5},
	    {"examples/anchors/a3-qwen3-30b-a3b-hybridep.yaml", 23.0},
	    {"examples/models/kimi-k2-1t.yaml", 205.0},
	    {"examples/anchors/a5-gpt-oss-120b.yaml", 27.1},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		double g = flops_of(cases[i].rel) / 1e9;
		cr_expect(fabs(g / cases[i].gflop - 1) < 0.02,
		          "%s: %.2f GFLOP/token, published %.1f", cases[i].rel, g, cases[i].gflop);
	}
}

/* GPT-OSS-120B (examples/anchors/a5-gpt-oss-120b.yaml: quick_geglu experts),
 * by hand, per token before the factor 6:
 *   attention projections 2880*(4096 + 2*512) + 4096*2880 = 26,542,080;
 *   causal core 4096*4096 = 16,777,216; both times 36 layers: 1,559,494,656;
 *   experts, counted as two GEMMs (Megatron's gated multiplier is for SiLU
 *   only: training.py line 1070, Megatron-Bridge 0.4's flop_utils.py lines
 *   296-297): 2880*2880*4*2*36 = 2,388,787,200;
 *   logits 2880*201,088 (a multiple of 128) = 579,133,440.
 *   Sum 4,527,415,296, times 6: 27,164,491,776 = 27.16 GFLOP/token; the
 *   published runs imply 158e12 / 5824 = 27.13 and 153e12 / 5630 = 27.18.
 * Counted with the gated multiplier (swiglu) it would be 34.33. */
Test(costmodel_flops, gpt_oss_counted_as_megatron_counts_it)
{
	kiln_arena *a = kiln_arena_new();
	kiln_model *m;
	cr_assert_eq(
	    kiln_frontend_load_file(kt_src("examples/anchors/a5-gpt-oss-120b.yaml"), a, stderr, &m),
	    KILN_FRONTEND_OK);
	cr_expect_eq(m->moe_activation_fn, KILN_ACTFN_QUICK_GEGLU);
	cr_expect_float_eq(kiln_cost_model_flops_per_token(m), 27164491776.0, 1.0);
	m->moe_activation_fn = m->activation_fn = KILN_ACTFN_SWIGLU;
	cr_expect_float_eq(kiln_cost_model_flops_per_token(m), 34330853376.0, 1.0);
	kiln_arena_free(a);
}
