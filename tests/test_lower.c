/* tests/test_lower.c: passes/lower.c and passes/pipeline.c.
 *
 * Expected byte counts come from Korthikanti et al. (2022), Table 2, and from
 * hand derivations written next to each check (docs/cost-model.md).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "passes/passes.h"
#include "kiln_test.h"





static int32_t first_layer_of(const kiln_ir_graph *g, kiln_layer_kind kind)
{
	for (int32_t l = 0; l < g->n_layers; l++)
		if (g->layers[l].kind == kind)
			return l;
	cr_assert_fail("no layer of kind %d", (int)kind);
	return -1;
}

static int32_t find_tensor(const kiln_ir_graph *g, int32_t layer, const char *name)
{
	for (int32_t t = g->layers[layer].tensor_begin; t < g->layers[layer].tensor_end; t++)
		if (!strcmp(g->tensors[t].name, name))
			return t;
	return -1;
}

static int32_t find_op(const kiln_ir_graph *g, int32_t layer, const char *name)
{
	for (int32_t o = g->layers[layer].op_begin; o < g->layers[layer].op_end; o++)
		if (!strcmp(g->ops[o].name, name))
			return o;
	return -1;
}

/* Saved bytes of a layer at N = 0, leaving out the named tensors, or keeping
 * only them when only is true. */
static uint64_t saved_bytes(const kiln_ir_graph *g, int32_t layer, const char *const *names,
                            size_t n_names, bool only)
{
	uint64_t sum = 0;
	for (int32_t t = g->layers[layer].tensor_begin; t < g->layers[layer].tensor_end; t++) {
		const kiln_ir_tensor *tn = &g->tensors[t];
		if (!(tn->flags & KILN_T_SAVED))
			continue;
		bool listed = false;
		for (size_t i = 0; i < n_names; i++)
			listed = listed || !strcmp(names[i], tn->name);
		if (listed == only)
			sum += tn->bytes.base;
	}
	return sum;
}

/* ---------------------------------------------------------------- Korthikanti */

typedef struct kcase {
	uint64_t s, b, h, H, t;
} kcase;

static const kcase kcases[] = {
    {2048, 1, 4096, 32, 1}, {2048, 1, 4096, 32, 2}, {2048, 1, 4096, 32, 4},
    {2048, 1, 4096, 32, 8}, {4096, 2, 8192, 64, 8}, {1024, 4, 2048, 16, 2},
};

/* The setting of Korthikanti et al.: eager attention, GeLU, ffn = 4h,
 * dropout, d = h/H, no GQA, 16-bit activations. */
static void korthikanti_model(kt_model *tm, const kcase *k, bool sp)
{
	kt_model_init(tm);
	kiln_model *m = &tm->m;
	m->layers = 2;
	m->seq_len = (int64_t)k->s;
	m->micro_batch = (int64_t)k->b;
	m->hidden = (int64_t)k->h;
	m->ffn_hidden = 4 * (int64_t)k->h;
	m->heads = m->kv_heads = (int64_t)k->H;
	m->head_dim = (int64_t)(k->h / k->H);
	m->attention = KILN_ATTN_EAGER;
	m->activation = KILN_FN_GELU;
	m->dropout = 0.1;
	m->tp = (int64_t)k->t;
	m->devices = m->tp;
	m->sequence_parallel = sp;
	kt_model_finish(tm);
}

static const char *const selective[] = {"attn.softmax", "attn.dropout_mask", "attn.probs"};
static const char *const layer_input[] = {"ln1.in"};

Test(lower_korthikanti, table2_every_setting)
{
	for (size_t i = 0; i < sizeof(kcases) / sizeof(kcases[0]); i++) {
		const kcase *k = &kcases[i];
		uint64_t s = k->s, b = k->b, h = k->h, H = k->H, t = k->t;
		uint64_t sbh = s * b * h, as2b = 5 * H * s * s * b; /* 5*a*s^2*b, exact */
		for (int sp = 0; sp < 2; sp++) {
			if (sp && t == 1)
				continue;
			kt_model tm;
			korthikanti_model(&tm, k, sp);
			kiln_arena *a;
			kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
			int32_t l = first_layer_of(g, KILN_LAYER_DENSE);
			uint64_t all = saved_bytes(g, l, NULL, 0, false);
			uint64_t sel = saved_bytes(g, l, selective, 3, false);
			uint64_t want_all, want_sel;
			if (t == 1) {
				/* s*b*h*(34 + 5*a*s/h) */
				want_all = 34 * sbh + as2b;
				want_sel = 34 * sbh;
			} else if (!sp) {
				/* s*b*h*(10 + 24/t + 5*a*s/(h*t)) */
				want_all = 10 * sbh + 24 * sbh / t + as2b / t;
				/* s*b*h*(10 + 24/t) */
				want_sel = 10 * sbh + 24 * sbh / t;
			} else {
				/* s*b*h/t*(34 + 5*a*s/h) */
				want_all = (34 * sbh + as2b) / t;
				/* 34*s*b*h/t */
				want_sel = 34 * sbh / t;
			}
			cr_expect_eq(all, want_all, "case %zu sp %d: keep-all %llu, want %llu", i,
			             sp, (unsigned long long)all, (unsigned long long)want_all);
			cr_expect_eq(sel, want_sel, "case %zu sp %d: selective %llu, want %llu", i,
			             sp, (unsigned long long)sel, (unsigned long long)want_sel);
			cr_expect_eq(kiln_cost_layer_activation(g, l).base, want_all);
			cr_expect_eq(kiln_cost_layer_activation(g, l).per_n, 0);
			if (!sp) {
				/* Full recompute keeps only the layer input: 2*s*b*h. */
				uint64_t full = saved_bytes(g, l, layer_input, 1, true);
				cr_expect_eq(full, 2 * sbh, "case %zu: full recompute", i);
			}
			kiln_arena_free(a);
		}
	}
}

/* Flash attention without dropout (docs/cost-model.md): attention keeps
 * ln1.in 2, qkv_in 2, q k v 6, out 2 (in units of s*b*h) and the fp32 LSE
 * 4*a*s*b; the FFN keeps ln2.in 2, ffn.in 2, ffn.up 8, ffn.act 8. At t = 1:
 * 32*s*b*h + 4*H*s*b. With TP: 8 replicated (ln1.in, qkv_in, ln2.in, ffn.in)
 * + 24/t sharded, LSE /t; with SP everything /t. */
Test(lower_korthikanti, flash_without_dropout)
{
	for (size_t i = 0; i < sizeof(kcases) / sizeof(kcases[0]); i++) {
		const kcase *k = &kcases[i];
		uint64_t s = k->s, b = k->b, h = k->h, H = k->H, t = k->t;
		uint64_t sbh = s * b * h, lse = 4 * H * s * b;
		for (int sp = 0; sp < 2; sp++) {
			if (sp && t == 1)
				continue;
			kt_model tm;
			korthikanti_model(&tm, k, sp);
			tm.m.attention = KILN_ATTN_FLASH;
			tm.m.dropout = 0;
			kiln_arena *a;
			kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
			int32_t l = first_layer_of(g, KILN_LAYER_DENSE);
			uint64_t want;
			if (t == 1)
				want = 32 * sbh + lse;
			else if (!sp)
				want = 8 * sbh + 24 * sbh / t + lse / t;
			else
				want = (32 * sbh + lse) / t;
			cr_expect_eq(saved_bytes(g, l, NULL, 0, false), want, "case %zu sp %d", i,
			             sp);
			cr_expect_eq(find_tensor(g, l, "attn.softmax"), -1);
			cr_expect_eq(find_tensor(g, l, "attn.resid_mask"), -1);
			kiln_arena_free(a);
		}
	}
}

/* Eager attention without dropout keeps only the softmax (2*a*s^2*b): the
 * AV product reads it directly. */
Test(lower_korthikanti, eager_without_dropout)
{
	kcase k = {1024, 2, 1024, 8, 1};
	kt_model tm;
	korthikanti_model(&tm, &k, false);
	tm.m.dropout = 0;
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	int32_t l = first_layer_of(g, KILN_LAYER_DENSE);
	uint64_t sbh = k.s * k.b * k.h;
	/* 34 minus the two 1-byte residual masks = 32 s*b*h; of the 5*a*s^2*b
	 * term only the softmax 2*a*s^2*b remains. */
	cr_expect_eq(saved_bytes(g, l, NULL, 0, false), 32 * sbh + 2 * k.H * k.s * k.s * k.b);
	int32_t ctx = find_op(g, l, "attn.context");
	cr_assert_geq(ctx, 0);
	cr_expect_eq(g->ops[ctx].inputs[0], find_tensor(g, l, "attn.softmax"));
	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- MoE */

static void moe_model(kt_model *tm)
{
	kt_model_init(tm);
	kiln_model *m = &tm->m;
	m->moe = true;
	m->layers = 3;
	m->dense_layers = 1;
	m->experts = 8;
	m->top_k = 2;
	m->expert_ffn_hidden = 128;
	m->shared_experts = 0;
	kt_model_finish(tm);
	m->dense_layers = 1;
}

/* Expert-side bytes per received row, by hand (h = 64, fe = 128, bf16):
 *   expert_in 2*64 + expert_up 2*(2*128) (SwiGLU gate and up) + expert_act
 *   2*128 + expert_out 2*64 + perm_idx 4 (int32) = 1028 bytes. */
Test(lower_moe, expert_bytes_linear_in_n)
{
	kt_model tm;
	moe_model(&tm);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	int32_t l = first_layer_of(g, KILN_LAYER_MOE);
	kiln_lin act = kiln_cost_layer_activation(g, l);
	cr_expect_eq(act.per_n, 1028);
	static const uint64_t ns[] = {0, 1, 7, 256, 4096, 1000000};
	for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
		uint64_t expert = 0;
		for (int32_t t = g->layers[l].tensor_begin; t < g->layers[l].tensor_end; t++) {
			const kiln_ir_tensor *tn = &g->tensors[t];
			if ((tn->flags & KILN_T_SAVED) && (tn->flags & KILN_T_EXPERT))
				expert += tn->bytes.base + tn->bytes.per_n * ns[i];
		}
		cr_expect_eq(expert, 1028 * ns[i], "N = %llu", (unsigned long long)ns[i]);
	}
	/* The constant part, t = 1, flash, no dropout, no shared expert, T =
	 * 128, h = 64, H = 4, E = 8: ln1.in, qkv_in, q, k, v, out, ln2.in,
	 * moe.in: 8 * 2*T*h; LSE 4*H*T; router probabilities 4*T*E. */
	uint64_t T = 128;
	cr_expect_eq(act.base, 16 * T * 64 + 4 * 4 * T + 4 * T * 8);
	/* N at load factor 1: T * top_k rows. */
	cr_expect_float_eq(g->layers[l].n_balanced, (double)(T * 2), 1e-9);
	kiln_arena_free(a);
}

/* ------------------------------------------------ memory options (issue 15)
 *
 * moe_model is kt_model_init's: prob_apply expert_output, an int32 row map,
 * separate q, k, v, no rstd (the tests above). Below, each option value by
 * hand, T = 128, h = 64, H = kv = 4, d = 16, E = 8, k = 2, fe = 128, bf16,
 * tp 1, so Nb = T*k = 256 rows sent. */

static uint64_t tensor_per_n(const kiln_ir_graph *g, int32_t l, const char *name)
{
	int32_t t = find_tensor(g, l, name);
	cr_assert_geq(t, 0, "%s", name);
	return g->tensors[t].bytes.per_n;
}

static bool tensor_saved(const kiln_ir_graph *g, int32_t l, const char *name)
{
	int32_t t = find_tensor(g, l, name);
	return t >= 0 && (g->tensors[t].flags & KILN_T_SAVED);
}

/* Megatron-Core's defaults: prob_apply activation, fused QKV, rstd saved,
 * unfused permutation (int64 row map).
 *   constant: ln1.in, attn.qkv_in, attn.out, ln2.in, moe.in 2*128*64 =
 *   16,384 each (81,920); attn.qkv 2*128*(4*16 + 2*4*16) = 49,152; attn.lse
 *   4*4*128 = 2,048; moe.probs 4*128*8 = 4,096; ln1.rstd, ln2.rstd 4*128 =
 *   512 each: 138,240.
 *   per row: perm_idx 8 + expert_in 2*64 + expert_probs 4 + expert_up
 *   2*256 + expert_act 2*128 = 908; no expert_out.
 *   The dispatch sends each row with its fp32 probability: 2*64 + 4 = 132
 *   bytes per row; the unpermute's backward reads only the row map. */
Test(lower_moe, prob_apply_activation_by_hand)
{
	kt_model tm;
	moe_model(&tm);
	tm.m.prob_apply = KILN_PROB_ACTIVATION;
	tm.m.fused_qkv = true;
	tm.m.norm_saves_rstd = true;
	tm.m.moe_permute_fusion = false;
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	int32_t l = first_layer_of(g, KILN_LAYER_MOE);
	kiln_lin act = kiln_cost_layer_activation(g, l);
	cr_expect_eq(act.base, 138240);
	cr_expect_eq(act.per_n, 908);
	cr_expect_eq(tensor_per_n(g, l, "moe.perm_idx"), 8);
	cr_expect_eq(tensor_per_n(g, l, "moe.expert_probs"), 4);
	cr_expect(tensor_saved(g, l, "moe.expert_probs"));
	cr_expect_not(tensor_saved(g, l, "moe.expert_out"));
	cr_expect_not(tensor_saved(g, l, "moe.combined"));
	cr_expect_not(tensor_saved(g, l, "moe.row_probs"));
	cr_expect_eq(g->tensors[find_tensor(g, l, "ln2.rstd")].bytes.base, 512);
	int32_t d = find_op(g, l, "moe.dispatch");
	cr_expect_float_eq(g->ops[d].comm_bytes.per_n, 132.0, 1e-9);
	/* The weighted SwiGLU's backward reads its input and the probabilities. */
	int32_t ab = find_op(g, l, "moe.expert_act.bwd");
	cr_assert_eq(g->ops[ab].n_inputs, 2);
	cr_expect_eq(g->ops[ab].inputs[0], find_tensor(g, l, "moe.expert_up"));
	cr_expect_eq(g->ops[ab].inputs[1], find_tensor(g, l, "moe.expert_probs"));
	int32_t ub = find_op(g, l, "moe.unpermute.bwd");
	cr_assert_eq(g->ops[ub].n_inputs, 1);
	cr_expect_eq(g->ops[ub].inputs[0], find_tensor(g, l, "moe.perm_idx"));
	kiln_arena_free(a);
}

/* GeLU experts have no fused weighted kernel: GeLU's output is saved by the
 * multiply too. Per row: perm_idx 8 + expert_in 128 + expert_probs 4 +
 * expert_up 2*128 + expert_act_raw 2*128 + expert_act 2*128 = 908 (the
 * same total as SwiGLU's 512 + 256 by coincidence; the tensors differ). */
Test(lower_moe, prob_apply_activation_gelu)
{
	kt_model tm;
	moe_model(&tm);
	tm.m.moe_activation = KILN_FN_GELU;
	tm.m.moe_activation_fn = KILN_ACTFN_GELU;
	tm.m.prob_apply = KILN_PROB_ACTIVATION;
	tm.m.moe_permute_fusion = false;
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	int32_t l = first_layer_of(g, KILN_LAYER_MOE);
	cr_expect_eq(kiln_cost_layer_activation(g, l).per_n, 908);
	cr_expect_eq(tensor_per_n(g, l, "moe.expert_up"), 256);
	cr_expect_eq(tensor_per_n(g, l, "moe.expert_act_raw"), 256);
	cr_expect(tensor_saved(g, l, "moe.expert_act_raw"));
	kiln_arena_free(a);
}

/* Gated experts: Megatron-Core fuses the probabilities into SwiGLU and
 * quick GeGLU (experts.py:964-981), not into GeGLU, whose unfused multiply
 * saves the activation's output (experts.py:996-1013). Per row, gated (up
 * width 2*128): perm_idx 8 + expert_in 128 + expert_probs 4 + expert_up
 * 2*256 + expert_act 2*128 = 908 for quick GeGLU, and 908 + expert_act_raw
 * 2*128 = 1164 for GeGLU. */
Test(lower_moe, prob_apply_activation_gated_functions)
{
	static const struct {
		kiln_act_fn fn;
		int64_t per_n;
		bool raw;
	} cases[] = {{KILN_ACTFN_QUICK_GEGLU, 908, false}, {KILN_ACTFN_GEGLU, 1164, true}};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		kt_model tm;
		moe_model(&tm);
		tm.m.moe_activation = KILN_FN_SWIGLU;
		tm.m.moe_activation_fn = cases[i].fn;
		tm.m.prob_apply = KILN_PROB_ACTIVATION;
		tm.m.moe_permute_fusion = false;
		kiln_arena *a;
		kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
		int32_t l = first_layer_of(g, KILN_LAYER_MOE);
		cr_expect_eq(kiln_cost_layer_activation(g, l).per_n, cases[i].per_n, "fn %d",
		             (int)cases[i].fn);
		cr_expect_eq(tensor_per_n(g, l, "moe.expert_up"), 512);
		cr_expect_eq(find_tensor(g, l, "moe.expert_act_raw") >= 0, cases[i].raw, "fn %d",
		             (int)cases[i].fn);
		kiln_arena_free(a);
	}
}

/* combine: the probabilities multiply the combined rows on the token side,
 * which are saved with their probabilities and do not grow with the load.
 * With the int32 row map, separate q, k, v and no rstd (moe_model):
 *   constant: the expert_output figure of expert_bytes_linear_in_n,
 *   16*T*64 + 4*4*T + 4*T*8 = 137,216, plus moe.combined 2*256*64 =
 *   32,768 and moe.row_probs 4*256 = 1,024: 171,008.
 *   per row: perm_idx 4 + expert_in 128 + expert_up 512 + expert_act 256
 *   = 900. */
Test(lower_moe, prob_apply_combine_by_hand)
{
	kt_model tm;
	moe_model(&tm);
	tm.m.prob_apply = KILN_PROB_COMBINE;
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	int32_t l = first_layer_of(g, KILN_LAYER_MOE);
	kiln_lin act = kiln_cost_layer_activation(g, l);
	cr_expect_eq(act.base, 171008);
	cr_expect_eq(act.per_n, 900);
	cr_expect(tensor_saved(g, l, "moe.combined"));
	cr_expect_eq(g->tensors[find_tensor(g, l, "moe.combined")].bytes.base, 32768);
	cr_expect_eq(g->tensors[find_tensor(g, l, "moe.row_probs")].bytes.base, 1024);
	cr_expect_not(tensor_saved(g, l, "moe.expert_out"));
	int32_t ub = find_op(g, l, "moe.unpermute.bwd");
	cr_expect_eq(g->ops[ub].n_inputs, 3); /* row map, rows, probabilities */
	/* No probability travels with the rows. */
	cr_expect_float_eq(g->ops[find_op(g, l, "moe.dispatch")].comm_bytes.per_n, 128.0, 1e-9);
	kiln_arena_free(a);
}

/* fused_qkv: one tensor of e*T*(H*d + 2*kv*d) bytes that every reader of
 * q, k or v reads once, and one unit. With GQA (kv = 2): 2*128*(4*16 +
 * 2*2*16) = 32,768 = q 16,384 + k 8,192 + v 8,192. */
Test(lower_structure, fused_qkv_is_one_tensor_and_one_unit)
{
	kt_model tm;
	kt_model_init(&tm);
	tm.m.kv_heads = 2;
	tm.m.fused_qkv = true;
	kt_model_finish(&tm);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	int32_t l = first_layer_of(g, KILN_LAYER_DENSE);
	int32_t qkv = find_tensor(g, l, "attn.qkv");
	cr_assert_geq(qkv, 0);
	cr_expect_eq(g->tensors[qkv].bytes.base, 32768);
	cr_expect_eq(find_tensor(g, l, "attn.k"), -1);
	int32_t core = find_op(g, l, "attn.core");
	cr_assert_eq(g->ops[core].n_inputs, 1);
	cr_expect_eq(g->ops[core].inputs[0], qkv);
	int32_t cb = find_op(g, l, "attn.core.bwd"); /* q, k, v, out, lse -> 3 */
	cr_expect_eq(g->ops[cb].n_inputs, 3);
	/* The same bytes as the three separate tensors: 16,384 + 2 * 8,192. */
	tm.m.fused_qkv = false;
	kiln_arena *b;
	kiln_ir_graph *g2 = kt_lower_ok(&tm.m, &b);
	int32_t l2 = first_layer_of(g2, KILN_LAYER_DENSE);
	cr_expect_eq(g2->tensors[find_tensor(g2, l2, "attn.k")].bytes.base, 8192);
	cr_expect_eq(kiln_cost_layer_activation(g, l).base,
	             kiln_cost_layer_activation(g2, l2).base);
	kiln_unit_set *sets;
	int32_t n;
	cr_assert_eq(kiln_pass_activations(g, a, &sets, &n), 0);
	int32_t found = 0;
	for (int32_t u = 0; u < sets[0].n_units; u++) {
		cr_expect_neq(strcmp(sets[0].units[u].name, "attn.k"), 0);
		if (!strcmp(sets[0].units[u].name, "attn.qkv")) {
			found++;
			cr_expect_eq(sets[0].units[u].bytes.base, 32768);
		}
	}
	cr_expect_eq(found, 1);
	kiln_arena_free(b);
	kiln_arena_free(a);
}

/* norm_saves_rstd: each norm saves 4 bytes per row it normalises: ln1 and
 * ln2 4*T = 512 each in a dense layer (T = 128), the final norm 512 in the
 * head. */
Test(lower_structure, norms_save_rstd)
{
	kt_model tm;
	kt_model_init(&tm);
	kt_model_finish(&tm);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	int32_t l = first_layer_of(g, KILN_LAYER_DENSE);
	uint64_t without = kiln_cost_layer_activation(g, l).base;
	int32_t hl = first_layer_of(g, KILN_LAYER_HEAD);
	uint64_t head_without = kiln_cost_layer_activation(g, hl).base;
	cr_expect_eq(find_tensor(g, l, "ln1.rstd"), -1);
	kiln_arena_free(a);
	tm.m.norm_saves_rstd = true;
	g = kt_lower_ok(&tm.m, &a);
	cr_expect_eq(kiln_cost_layer_activation(g, l).base, without + 2 * 512);
	cr_expect_eq(g->tensors[find_tensor(g, l, "ln1.rstd")].bytes.base, 512);
	cr_expect(tensor_saved(g, l, "ln2.rstd"));
	cr_expect_eq(kiln_cost_layer_activation(g, hl).base, head_without + 512);
	int32_t nb = find_op(g, l, "ln1.bwd"); /* input and rstd */
	cr_expect_eq(g->ops[nb].n_inputs, 2);
	kiln_arena_free(a);
}

/* GeLU experts: 2*64 + 2*128 + 2*128 + 2*64 + 4 = 772 bytes per row. */
Test(lower_moe, gelu_expert_bytes)
{
	kt_model tm;
	moe_model(&tm);
	tm.m.moe_activation = KILN_FN_GELU;
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	cr_expect_eq(kiln_cost_layer_activation(g, first_layer_of(g, KILN_LAYER_MOE)).per_n, 772);
	kiln_arena_free(a);
}

/* Shared experts, TP = 2 with SP: fs = 2*128; moe.shared_up 2*T*(2*fs)/t,
 * moe.shared_act 2*T*fs/t; the routed side works on T/t tokens (n_balanced
 * = T/t * top_k) with full-width experts. */
Test(lower_moe, shared_experts_and_tp)
{
	kt_model tm;
	moe_model(&tm);
	tm.m.shared_experts = 2;
	tm.m.tp = 2;
	tm.m.devices = 4;
	tm.m.ep = 2;
	tm.m.sequence_parallel = true;
	kt_model_finish(&tm);
	tm.m.dense_layers = 1;
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	int32_t l = first_layer_of(g, KILN_LAYER_MOE);
	uint64_t T = 128, fs = 256;
	cr_expect_eq(g->tensors[find_tensor(g, l, "moe.shared_up")].bytes.base, 2 * T * 2 * fs / 2);
	cr_expect_eq(g->tensors[find_tensor(g, l, "moe.shared_act")].bytes.base, 2 * T * fs / 2);
	cr_expect_eq(g->tensors[find_tensor(g, l, "moe.probs")].bytes.base, 4 * (T / 2) * 8);
	cr_expect_eq(g->tensors[find_tensor(g, l, "moe.in")].bytes.base, 2 * (T / 2) * 64);
	cr_expect_float_eq(g->layers[l].n_balanced, (double)(T / 2 * 2), 1e-9);
	int32_t d = find_op(g, l, "moe.dispatch");
	cr_assert_geq(d, 0);
	cr_expect_eq(g->ops[d].comm_group, 2);
	cr_expect_eq(g->ops[d].collective, KILN_COLL_ALL_TO_ALL);
	cr_expect_float_eq(g->ops[d].comm_bytes.per_n, 2.0 * 64, 1e-9);
	cr_expect_float_eq(g->ops[d].comm_bytes.base, 0, 1e-9);
	/* Local experts: 8 / ep = 4, each 3*h*fe (SwiGLU). */
	int32_t up = find_op(g, l, "moe.expert_up"), down = find_op(g, l, "moe.expert_down");
	cr_expect_eq(g->ops[up].params_local + g->ops[down].params_local, 4 * 3 * 64 * 128);
	cr_expect_eq(g->ops[up].params_global + g->ops[down].params_global, 8 * 3 * 64 * 128);
	cr_expect(g->ops[up].expert_params);
	/* Expert GEMM FLOPs per row: 2*h*2fe + 2*fe*h. */
	cr_expect_float_eq(g->ops[up].flops.per_n, 2.0 * 64 * 256, 1e-9);
	cr_expect_float_eq(g->ops[down].flops.per_n, 2.0 * 128 * 64, 1e-9);
	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- MLA */

/* MLA, t = 1, flash, no dropout, T = 128, h = 64, H = 4, d = 16, rope 8,
 * v_head_dim 16, q_lora 32, kv_lora 16, SwiGLU FFN 256. Saved bytes:
 *   ln1.in 2*T*64, attn.qkv_in 2*T*64, q_down 2*T*32, q_norm 2*T*32,
 *   kv_down 2*T*(16+8), kv_norm 2*T*16, q 2*T*4*24, k 2*T*4*24,
 *   v 2*T*4*16, lse 4*4*T, out 2*T*4*16,
 *   ln2.in 2*T*64, ffn.in 2*T*64, ffn.up 2*T*512, ffn.act 2*T*256
 * = T * (128+128+64+64+48+32+192+192+128+16+128+128+128+1024+512) = T*2912. */
Test(lower_mla, saved_bytes_by_hand)
{
	kt_model tm;
	kt_model_init(&tm);
	tm.m.mla = true;
	tm.m.q_lora_rank = 32;
	tm.m.kv_lora_rank = 16;
	tm.m.rope_head_dim = 8;
	tm.m.v_head_dim = 16;
	kt_model_finish(&tm);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	int32_t l = first_layer_of(g, KILN_LAYER_DENSE);
	cr_expect_eq(kiln_cost_layer_activation(g, l).base, 128u * 2912u);
	/* Parameters: q_down 64*32, q_norm 32, q_up 32*4*24, kv_down 64*24,
	 * kv_norm 16, kv_up 16*4*(16+16), out_proj 4*16*64. */
	uint64_t p = 0;
	for (int32_t o = g->layers[l].op_begin; o < g->layers[l].op_end; o++)
		if (!strncmp(g->ops[o].name, "attn.", 5))
			p += g->ops[o].params_global;
	cr_expect_eq(p, 64u * 32 + 32 + 32 * 4 * 24 + 64 * 24 + 16 + 16 * 4 * 32 + 4 * 16 * 64);
	kiln_arena_free(a);
}

/* Without q_lora the queries come straight from the norm output. */
Test(lower_mla, without_q_lora)
{
	kt_model tm;
	kt_model_init(&tm);
	tm.m.mla = true;
	tm.m.q_lora_rank = 0;
	tm.m.kv_lora_rank = 16;
	tm.m.rope_head_dim = 8;
	tm.m.v_head_dim = 16;
	kt_model_finish(&tm);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	int32_t l = first_layer_of(g, KILN_LAYER_DENSE);
	cr_expect_eq(find_tensor(g, l, "attn.q_down"), -1);
	int32_t q = find_op(g, l, "attn.q_up");
	cr_assert_geq(q, 0);
	cr_expect_eq(g->ops[q].params_global, 64u * 4 * 24);
	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- structure */

static bool has_op(const kiln_ir_graph *g, int32_t l, const char *name)
{
	return find_op(g, l, name) >= 0;
}

Test(lower_structure, one_f_one_b_stages)
{
	kt_model tm;
	kt_model_init(&tm);
	tm.m.layers = 8;
	tm.m.pp = 4;
	tm.m.devices = 4;
	kt_model_finish(&tm);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	cr_assert_eq(g->n_stages, 4);
	cr_expect_eq(g->n_layers, 10);
	/* Stage 0: embed, 0, 1; stage 3: 6, 7, head. */
	cr_expect_eq(g->layers[g->stages[0].layer_begin].kind, KILN_LAYER_EMBED);
	cr_expect_eq(g->layers[g->stages[3].layer_end - 1].kind, KILN_LAYER_HEAD);
	for (int32_t s = 0; s < 4; s++) {
		const kiln_ir_stage *st = &g->stages[s];
		int32_t first = st->layer_begin + (s == 0), last = st->layer_end - 1 - (s == 3);
		cr_expect_eq(g->layers[first].index, 2 * s);
		cr_expect_eq(g->layers[last].index, 2 * s + 1);
		cr_expect_eq(has_op(g, last, "pp.send"), s < 3, "stage %d send", s);
		cr_expect_eq(has_op(g, first, "pp.recv"), s > 0, "stage %d recv", s);
		for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
			if (l != last)
				cr_expect(!has_op(g, l, "pp.send"));
			if (l != first)
				cr_expect(!has_op(g, l, "pp.recv"));
		}
	}
	/* The gradient send is the backward of stage 1's receive: e*T*h bytes. */
	int32_t bwd = find_op(g, g->stages[1].layer_begin, "pp.recv.bwd");
	cr_assert_geq(bwd, 0);
	cr_expect_eq(g->ops[bwd].collective, KILN_COLL_SEND);
	cr_expect_float_eq(g->ops[bwd].comm_bytes.base, 2.0 * 128 * 64, 1e-9);
	int32_t fwd = find_op(g, g->stages[1].layer_begin, "pp.recv");
	cr_expect_float_eq(g->ops[fwd].comm_bytes.base, 0, 1e-9);
	int32_t send = find_op(g, g->stages[0].layer_end - 1, "pp.send");
	cr_expect_eq(g->ops[send].kind, KILN_OP_PP_SEND);
	cr_expect_float_eq(g->ops[send].comm_bytes.base, 2.0 * 128 * 64, 1e-9);
	kiln_arena_free(a);
}

/* Interleaved, p = 4, v = 2, 16 layers in 8 chunks of 2: chunk c on stage c
 * % 4 as local chunk c / 4. Stage 0 runs embed, 0, 1 (chunk 0), 8, 9 (chunk
 * 4); stage 3 runs 6, 7, 14, 15 and the head. */
Test(lower_structure, interleaved_chunks)
{
	kt_model tm;
	kt_model_init(&tm);
	tm.m.layers = 16;
	tm.m.pp = 4;
	tm.m.vpp = 2;
	tm.m.schedule = KILN_SCHED_INTERLEAVED;
	tm.m.devices = 4;
	kt_model_finish(&tm);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	static const int32_t want0[] = {-1, 0, 1, 8, 9};
	static const int32_t want3[] = {6, 7, 14, 15, -1};
	cr_assert_eq(g->stages[0].layer_end - g->stages[0].layer_begin, 5);
	cr_assert_eq(g->stages[3].layer_end - g->stages[3].layer_begin, 5);
	for (int i = 0; i < 5; i++) {
		cr_expect_eq(g->layers[g->stages[0].layer_begin + i].index, want0[i]);
		cr_expect_eq(g->layers[g->stages[3].layer_begin + i].index, want3[i]);
	}
	int32_t l9 = g->stages[0].layer_begin + 4, l8 = l9 - 1;
	cr_expect_eq(g->layers[l9].chunk, 1);
	cr_expect(has_op(g, l9, "pp.send"));
	cr_expect(has_op(g, l8, "pp.recv"));
	int32_t head = g->stages[3].layer_end - 1;
	cr_expect_eq(g->layers[head].chunk, 1);
	cr_expect(!has_op(g, head - 1, "pp.send"));
	kiln_arena_free(a);
}

/* Every layer: backward ops mirror forward ops in reverse, same kind. */
Test(lower_structure, backward_mirrors_forward)
{
	kt_model tm;
	moe_model(&tm);
	tm.m.dropout = 0.1;
	tm.m.attention = KILN_ATTN_EAGER;
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	for (int32_t l = 0; l < g->n_layers; l++) {
		const kiln_ir_layer *ly = &g->layers[l];
		int32_t n = ly->op_end - ly->op_begin;
		cr_assert_eq(n % 2, 0);
		for (int32_t j = 0; j < n / 2; j++) {
			const kiln_ir_op *f = &g->ops[ly->op_begin + j];
			const kiln_ir_op *b = &g->ops[ly->op_end - 1 - j];
			cr_expect(!f->backward);
			cr_expect(b->backward);
			cr_expect_eq(b->forward, ly->op_begin + j);
			cr_expect_eq(b->kind, f->kind);
		}
	}
	kiln_arena_free(a);
}

/* TP collectives per layer: with SP an all-gather before qkv and ffn_up and
 * a reduce-scatter after out_proj and ffn_down; without SP one all-reduce
 * after each. All move e*T*h bytes over t ranks. */
Test(lower_structure, tp_collectives)
{
	for (int sp = 0; sp < 2; sp++) {
		kt_model tm;
		kt_model_init(&tm);
		tm.m.tp = 4;
		tm.m.devices = 4;
		tm.m.sequence_parallel = sp;
		kt_model_finish(&tm);
		kiln_arena *a;
		kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
		int32_t l = first_layer_of(g, KILN_LAYER_DENSE);
		int n = 0;
		for (int32_t o = g->layers[l].op_begin; o < g->layers[l].op_end; o++) {
			const kiln_ir_op *op = &g->ops[o];
			if (op->kind != KILN_OP_TP_COMM || op->backward)
				continue;
			n++;
			cr_expect_eq(op->comm_group, 4);
			cr_expect_float_eq(op->comm_bytes.base, 2.0 * 128 * 64, 1e-9);
			bool in = strstr(op->name, "tp_in") != NULL;
			kiln_collective want = !sp  ? KILN_COLL_ALL_REDUCE
			                       : in ? KILN_COLL_ALL_GATHER
			                            : KILN_COLL_REDUCE_SCATTER;
			cr_expect_eq(op->collective, want, "%s", op->name);
		}
		cr_expect_eq(n, sp ? 4 : 2);
		kiln_arena_free(a);
	}
}

/* GEMM and attention FLOPs of one layer, t = 2, flash, T = 128, h = 64,
 * H = 4 (a = 2), d = 16: qkv_proj 2*T*h*(3*a*d) = 2*128*64*96 = 1572864;
 * attention core
 * 2*b*s^2*a*(d+d) = 2*128^2*2*32 = 2097152, backward 2.5x; out_proj
 * 2*T*(a*d)*h = 2*128*32*64 = 524288;
 * ffn_up 2*T*h*(2*256/2) = 4194304, backward 2x. */
Test(lower_structure, flops_by_hand)
{
	kt_model tm;
	kt_model_init(&tm);
	tm.m.tp = 2;
	tm.m.devices = 2;
	kt_model_finish(&tm);
	kiln_arena *a;
	kiln_ir_graph *g = kt_lower_ok(&tm.m, &a);
	int32_t l = first_layer_of(g, KILN_LAYER_DENSE);
	cr_expect_float_eq(g->ops[find_op(g, l, "attn.qkv_proj")].flops.base, 1572864.0, 1e-6);
	cr_expect_float_eq(g->ops[find_op(g, l, "attn.core")].flops.base, 2097152.0, 1e-6);
	cr_expect_float_eq(g->ops[find_op(g, l, "attn.core.bwd")].flops.base, 2.5 * 2097152.0,
	                   1e-6);
	cr_expect_float_eq(g->ops[find_op(g, l, "attn.out_proj")].flops.base, 524288.0, 1e-6);
	cr_expect_float_eq(g->ops[find_op(g, l, "ffn.up")].flops.base, 4194304.0, 1e-6);
	cr_expect_float_eq(g->ops[find_op(g, l, "ffn.up.bwd")].flops.base, 2 * 4194304.0, 1e-6);
	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- pipeline */

Test(lower_pipeline, passes_and_dump)
{
	/* The compiler's passes, in order (passes/pipeline.c). */
	static const char *const names[] = {"lower",      "activations", "plan",
	                                    "interleave", "budget",      "baselines"};
	cr_expect_eq(kiln_pipeline_pass_count(), 6);
	for (size_t i = 0; i < 6; i++)
		cr_expect_str_eq(kiln_pipeline_pass_name(i), names[i]);
	cr_expect_null(kiln_pipeline_pass_name(6));

	kt_model tm;
	moe_model(&tm);
	kiln_arena *a = kiln_arena_new();
	char *buf = NULL, *buf2 = NULL;
	size_t len = 0, len2 = 0;
	FILE *dump = open_memstream(&buf, &len);
	kiln_ir_graph *g = NULL;
	cr_assert_eq(kiln_pipeline_run(&tm.m, a, "lower", dump, stderr, &g), 0);
	fclose(dump);
	cr_assert_not_null(g);
	FILE *direct = open_memstream(&buf2, &len2);
	kiln_ir_graph_print(g, direct);
	fclose(direct);
	cr_expect_gt(len, 0);
	cr_expect_str_eq(buf, buf2);
	free(buf);
	free(buf2);

	kiln_ir_graph *g2 = (kiln_ir_graph *)1;
	cr_expect_eq(kiln_pipeline_run(&tm.m, a, "no-such-pass", stdout, stderr, &g2), -2);
	cr_expect_null(g2);
	kiln_arena_free(a);
}
