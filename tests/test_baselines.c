/* tests/test_baselines.c: the megatron baseline (passes/baselines.c, the
 * module mapping of costmodel/megatron.c) and megatron-capacity's token
 * dropping (sim/policy.c).
 *
 * The bytes a Megatron module set drops from one MoE layer are checked
 * against a hand calculation of what Megatron-LM's code saves (d98e8a64),
 * written from the model's shape alone; the recipe search against an
 * exhaustive evaluation of every recipe; token dropping against its
 * conservation law and the padded memory against its load independence.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "frontend/frontend.h"
#include "kiln_test.h"
#include "passes/passes.h"
#include "sim/sim.h"

/* The shipped models with MoE layers. */
static const char *const MOE_MODELS[] = {
    "examples/models/deepseek-v3-671b.yaml", "examples/models/kimi-k2-1t.yaml",
    "examples/models/qwen3-235b-a22b.yaml",  "examples/models/mixtral-8x22b.yaml",
    "examples/models/custom-moe-188b.yaml",  "examples/models/tiny.yaml"};
#define N_MOE_MODELS (sizeof MOE_MODELS / sizeof MOE_MODELS[0])

/* What Megatron's code stops keeping for one MoE layer under one module,
 * in bytes, at n local expert rows, from the shape alone (bf16
 * activations; fp32 softmax statistics, router probabilities, norm rstd
 * and expert probabilities; int64 row map). T is a micro-batch's tokens on
 * the device outside attention (s * b, over tp with sequence parallelism),
 * S = s * b the tokens attention sees, a = heads / tp:
 * - layernorm (transformer_layer.py:475-527, output-discarding): both norm
 *   outputs and their rstd: 2 * (2*T*h + 4*T);
 * - core_attn (normal checkpoint; flash attention saves q, k, v, its
 *   output and the log-sum-exp; q, k, v are the region's inputs and the
 *   output is saved again by linear_proj): the log-sum-exp, 4*S*a;
 * - mla_up_proj (multi_latent_attention.py:983-988, output-discarding):
 *   q and k, 2*S*a*(head_dim + rope) each, and v, 2*S*a*v_head_dim;
 * - moe_act (experts.py:1019-1030, output-discarding): the activation's
 *   output, 2*n*f (f the expert FFN width);
 * - shared_experts (moe_layer.py:517-531, normal): fc1's output
 *   2*S*(2*fs)/tp and the activation's 2*S*fs/tp, fs the shared width;
 * - moe (moe_layer.py:701-716, normal, the router included): everything
 *   between its input and its output: router probabilities 4*T*E, the row
 *   map 8*n, dispatched rows 2*h*n and their probabilities 4*n, fc1's
 *   output 2*(2f)*n, the activation's 2*f*n, and the shared expert's. */
typedef struct hand {
	double layernorm, core_attn, mla_up, moe_act, shared, moe;
} hand;

static hand hand_drops(const kiln_model *m, double n)
{
	double tp = (double)m->tp, s = (double)(m->seq_len * m->micro_batch);
	double T = m->sequence_parallel && m->tp > 1 ? s / tp : s;
	double a = (double)m->heads / tp, h = (double)m->hidden, f = (double)m->expert_ffn_hidden;
	double glu = m->moe_activation == KILN_FN_SWIGLU ? 2 : 1;
	double fs = (double)m->shared_experts * f;
	hand d = {0};
	d.layernorm = 2 * (2 * T * h + (m->norm_saves_rstd ? 4 * T : 0));
	d.core_attn = 4 * s * a;
	if (m->mla)
		d.mla_up = 2 * (2 * s * a * (double)(m->head_dim + m->rope_head_dim)) +
		           2 * s * a * (double)m->v_head_dim;
	d.moe_act = 2 * n * f;
	d.shared = 2 * s * glu * fs / tp + 2 * s * fs / tp;
	d.moe = 4 * T * (double)m->experts + 8 * n + 2 * h * n + 4 * n + 2 * glu * f * n +
	        2 * f * n + d.shared;
	return d;
}

/* The first MoE unit set of c. */
static int32_t moe_set(const kiln_compilation *c)
{
	for (int32_t i = 0; i < c->n_sets; i++)
		if (c->sets[i].kind == KILN_LAYER_MOE)
			return i;
	return -1;
}

/* Bytes saved (recomputed or offloaded) and offloaded by recipe r on the
 * MoE set at load 1. */
static void recipe_bytes(const kiln_compilation *c, const kiln_megatron *r, kiln_plan_bytes *out)
{
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_megatron_actions ma;
	cr_assert_eq(kiln_megatron_recipe_eval(c, r, 1.0, a, &ma), 0);
	int32_t i = moe_set(c);
	cr_assert_geq(i, 0);
	const kiln_unit_set *set = &c->sets[i];
	cr_assert_eq(kiln_plan_valid(set, ma.tail[i]), 0);
	kiln_plan_bytes_at(set, ma.tail[i], c->graph->layers[set->layer].n_balanced, out);
	kiln_arena_free(a);
}

static kiln_megatron selective(uint32_t mods)
{
	return (kiln_megatron){.recompute = KILN_RECOMPUTE_SELECTIVE, .recompute_modules = mods};
}

Test(baselines, module_sets_drop_what_megatron_saves_no_more, .init = kt_slow)
{
	for (size_t k = 0; k < N_MOE_MODELS; k++) {
		const kiln_compilation *c = kt_compiled(MOE_MODELS[k], KILN_SOLVER_DP, false);
		const kiln_model *m = c->model;
		cr_assert_eq(m->attention, KILN_ATTN_FLASH, "%s", MOE_MODELS[k]);
		int32_t i = moe_set(c);
		double n = c->graph->layers[c->sets[i].layer].n_balanced;
		hand d = hand_drops(m, n);
		struct {
			uint32_t mods;
			double want;
		} cases[] = {
		    {KILN_MRC(LAYERNORM), d.layernorm},
		    {KILN_MRC(CORE_ATTN), d.core_attn},
		    {KILN_MRC(MLA_UP_PROJ), d.mla_up},
		    {KILN_MRC(MOE_ACT), d.moe_act},
		    {KILN_MRC(SHARED_EXPERTS), d.shared},
		    {KILN_MRC(MOE), d.moe},
		    {KILN_MRC(MLP), 0}, /* the dense MLP only (transformer_layer.py:537-539) */
		    /* moe holds moe_act and shared_experts */
		    {KILN_MRC(MOE) | KILN_MRC(MOE_ACT) | KILN_MRC(SHARED_EXPERTS), d.moe},
		    /* Megatron's DeepSeek-V3 recipe: mlp moe mla_up_proj layernorm */
		    {KILN_MRC(MLP) | KILN_MRC(MOE) | KILN_MRC(MLA_UP_PROJ) | KILN_MRC(LAYERNORM),
		     d.moe + d.mla_up + d.layernorm},
		};
		for (size_t j = 0; j < sizeof cases / sizeof cases[0]; j++) {
			kiln_megatron r = selective(cases[j].mods);
			kiln_plan_bytes b;
			recipe_bytes(c, &r, &b);
			cr_expect_float_eq(b.saved, cases[j].want, 0.5,
			                   "%s modules %#x: %.0f, hand %.0f", MOE_MODELS[k],
			                   cases[j].mods, b.saved, cases[j].want);
			cr_expect_eq(b.offloaded, 0);
		}
	}
}

Test(baselines, expert_fc1_offloads_fc1s_input, .init = kt_slow)
{
	for (size_t k = 0; k < N_MOE_MODELS; k++) {
		const kiln_compilation *c = kt_compiled(MOE_MODELS[k], KILN_SOLVER_DP, false);
		const kiln_model *m = c->model;
		double n = c->graph->layers[c->sets[moe_set(c)].layer].n_balanced;
		double h = (double)m->hidden, f = (double)m->expert_ffn_hidden;
		double glu = m->moe_activation == KILN_FN_SWIGLU ? 2 : 1;
		/* Megatron offloads a saved tensor of at least 1M elements
		 * (fine_grained_activation_offload.py:1084). expert_fc1: fc1's
		 * input, h * n elements (experts.py:928-939); moe_act: fc1's
		 * output, glu * f * n, and the probabilities beside it, n fp32
		 * values (2n bf16 elements' worth) (experts.py:941, 1019-1024). */
		double big = 1048576;
		double fc1 = h * n >= big ? 2 * h * n : 0;
		double act =
		    (glu * f * n >= big ? 2 * glu * f * n : 0) + (2 * n >= big ? 4 * n : 0);
		kiln_megatron r = {.offload_modules = KILN_MOF(EXPERT_FC1)};
		kiln_plan_bytes b;
		recipe_bytes(c, &r, &b);
		cr_expect_float_eq(b.offloaded, fc1, 0.5, "%s expert_fc1: %.0f, hand %.0f",
		                   MOE_MODELS[k], b.offloaded, fc1);
		r.offload_modules = KILN_MOF(MOE_ACT);
		recipe_bytes(c, &r, &b);
		cr_expect_float_eq(b.offloaded, act, 0.5, "%s moe_act: %.0f, hand %.0f",
		                   MOE_MODELS[k], b.offloaded, act);
		/* Recompute wins over offload: moe leaves nothing to offload in
		 * the experts. */
		r = selective(KILN_MRC(MOE));
		r.offload_modules = KILN_MOF(EXPERT_FC1) | KILN_MOF(MOE_ACT);
		recipe_bytes(c, &r, &b);
		cr_expect_eq(b.offloaded, 0, "%s", MOE_MODELS[k]);
	}
}

/* Every recipe of the search space, evaluated one by one without the
 * search's pruning or memo: selective or none with every subset of the
 * seven recompute modules and of the seven offload modules (attn_proj only
 * with core_attn), full uniform with 1 .. 16 layers per chunk, and full
 * block with 1 .. 16 layers and every offload subset. Returns the least objective and, among those,
 * the least summed exposed time, of the recipes that fit. */
static bool brute_force(const kiln_compilation *c, double load, double *out_worst, double *out_sum)
{
	const uint32_t all_o = ((1u << KILN_MOF_COUNT) - 1) & ~KILN_MOF(FUSED_GROUP_MLP);
	bool found = false;
	*out_worst = *out_sum = INFINITY;
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	/* mode -1: selective or none; 0 .. 15: full uniform with mode + 1
	 * layers per chunk; 16 .. 31: full block with mode - 15 layers. */
	for (int32_t mode = -1; mode < 32; mode++) {
		bool uniform = mode >= 0 && mode < 16;
		uint32_t n_r = mode == -1 ? 1u << KILN_MRC_COUNT : 1;
		for (uint32_t R = 0; R < n_r; R++)
			for (uint32_t O = 0; O < 1u << KILN_MOF_COUNT; O++) {
				if ((O & ~all_o) || (uniform && O))
					continue;
				if ((O & KILN_MOF(ATTN_PROJ)) && !(O & KILN_MOF(CORE_ATTN)))
					continue;
				kiln_megatron r = {.offload_modules = O};
				if (mode == -1) {
					r.recompute =
					    R ? KILN_RECOMPUTE_SELECTIVE : KILN_RECOMPUTE_NONE;
					r.recompute_modules = R;
				} else {
					r.recompute = KILN_RECOMPUTE_FULL;
					r.recompute_method =
					    uniform ? KILN_RECOMPUTE_UNIFORM : KILN_RECOMPUTE_BLOCK;
					r.recompute_num_layers = uniform ? mode + 1 : mode - 15;
				}
				kiln_megatron_actions ma;
				cr_assert_eq(kiln_megatron_recipe_eval(c, &r, load, a, &ma), 0);
				if (!ma.fits)
					continue;
				double tol = 1e-9 * fmax(1, *out_worst);
				if (!found || ma.worst_us < *out_worst - tol ||
				    (ma.worst_us <= *out_worst + tol && ma.exposed_us < *out_sum)) {
					*out_worst = ma.worst_us;
					*out_sum = ma.exposed_us;
				}
				found = true;
			}
		kiln_arena_free(a);
		a = kiln_arena_new();
		cr_assert_not_null(a);
	}
	kiln_arena_free(a);
	return found;
}

Test(baselines, search_finds_the_brute_force_best, .init = kt_slow, .timeout = 600)
{
	const kiln_compilation *c = kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	const double loads[] = {1.2, 2.5};
	for (size_t j = 0; j < 2; j++) {
		double bw, bs;
		bool any = brute_force(c, loads[j], &bw, &bs);
		kiln_arena *a = kiln_arena_new();
		kiln_megatron r;
		kiln_megatron_actions ma;
		kiln_megatron_search_stats st;
		cr_assert_eq(kiln_megatron_search(c, loads[j], a, &r, &ma, &st), 0);
		cr_assert_eq(ma.fits, any, "load %g", loads[j]);
		if (any) {
			cr_expect_float_eq(ma.worst_us, bw, 1e-9 * fmax(1, bw),
			                   "load %g: %.6f vs %.6f", loads[j], ma.worst_us, bw);
			cr_expect_float_eq(ma.exposed_us, bs, 1e-6 * fmax(1, bs),
			                   "load %g: %.6f vs %.6f", loads[j], ma.exposed_us, bs);
		}
		cr_expect_gt(st.candidates, 0);
		kiln_arena_free(a);
	}
}

Test(baselines, description_recipe_is_run_as_given)
{
	const kiln_compilation *c = kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	const kiln_baseline *bl = &c->baselines[KILN_BASELINE_MEGATRON];
	/* tiny.yaml states no recipe: the search chose one, printed as flags. */
	cr_expect_neq(bl->searched, 0);
	cr_expect(strncmp(bl->models, "Megatron-Core ", 14) == 0, "%s", bl->models);
	char buf[256];
	kiln_megatron r = {.recompute = KILN_RECOMPUTE_SELECTIVE,
	                   .recompute_modules = KILN_MRC(LAYERNORM) | KILN_MRC(MOE_ACT),
	                   .offload_modules = KILN_MOF(CORE_ATTN) | KILN_MOF(EXPERT_FC1)};
	cr_assert_gt(kiln_megatron_flags_format(&r, buf, sizeof buf), 0);
	cr_expect_str_eq(buf, "--recompute-granularity selective --recompute-modules moe_act "
	                      "layernorm --fine-grained-activation-offloading --offload-modules "
	                      "core_attn expert_fc1");
	r = (kiln_megatron){.recompute = KILN_RECOMPUTE_FULL,
	                    .recompute_method = KILN_RECOMPUTE_BLOCK,
	                    .recompute_num_layers = 3};
	cr_assert_gt(kiln_megatron_flags_format(&r, buf, sizeof buf), 0);
	cr_expect_str_eq(buf, "--recompute-granularity full --recompute-method block "
	                      "--recompute-num-layers 3");
	cr_expect_eq(kiln_megatron_flags_format(&r, buf, 8), -1);
}

Test(baselines, capacity_dropping_conserves_rows)
{
	/* Hand example: four experts with 200, 50, 100 and 50 routed rows
	 * against a capacity of 100 each: the first keeps 100 and drops 100,
	 * the others keep all; kept 300, dropped 100, routed 400. */
	const double v[4] = {200, 50, 100, 50};
	double kept, dropped;
	kiln_sim_capacity_drop(v, 4, 100, &kept, &dropped);
	cr_expect_float_eq(kept, 300, 1e-9);
	cr_expect_float_eq(dropped, 100, 1e-9);
	/* kept + dropped = routed at any capacity. */
	const double caps[] = {0, 25, 90, 100, 125, 300};
	const double w[6] = {260, 0, 110, 70, 130, 30};
	for (size_t j = 0; j < 6; j++) {
		kiln_sim_capacity_drop(w, 6, caps[j], &kept, &dropped);
		cr_expect_float_eq(kept + dropped, 600, 1e-9, "capacity %g", caps[j]);
		cr_expect_geq(dropped, 0);
		cr_expect_leq(kept, 6 * caps[j] + 1e-9);
	}
}

/* A hot expert sharing a rank with cold ones drops rows even where its
 * rank's total is within the rank's capacity: dropping is judged per
 * expert (kiln_load_sample_experts), never less than lumping a rank's
 * rows together would drop. */
Test(baselines, capacity_drops_per_expert)
{
	const kiln_compilation *c = kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	kiln_arena *a = kiln_arena_new();
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse("hot-expert", c->model->max_factor, a, stderr, &prof), 0);
	kiln_load_shape shape;
	kiln_sim_load_shape(c, &shape);
	int32_t e = shape.experts_per_rank, n = shape.ep * e;
	double rows[256], routed = 0, dropped = 0, rank_dropped = 0;
	cr_assert_leq(n, 256);
	double bal = (double)shape.tokens * shape.top_k / shape.ep;
	for (int32_t it = 0; it < 4; it++) {
		kiln_load_sample_experts(prof, &shape, 3, it, 0, 0, 0, rows);
		double kept, drop;
		kiln_sim_capacity_drop(rows, n, bal / e, &kept, &drop);
		routed += kept + drop;
		dropped += drop;
		for (int32_t q = 0; q < shape.ep; q++) {
			double sum = 0;
			for (int32_t j = 0; j < e; j++)
				sum += rows[q * e + j];
			rank_dropped += sum > bal ? sum - bal : 0;
		}
	}
	cr_expect_float_eq(routed, 4 * bal * shape.ep, 1e-6 * routed);
	cr_expect_gt(dropped, 0);
	cr_expect_geq(dropped, rank_dropped - 1e-9);
	kiln_arena_free(a);
}

Test(baselines, padded_memory_is_load_independent, .init = kt_slow, .timeout = 600)
{
	const kiln_compilation *c = kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	kiln_arena *a = kiln_arena_new();
	const char *loads[] = {"balanced", "hot-rank", "burst"};
	kiln_sim_result r[3];
	kiln_sim_policy_kind k = KILN_SIM_MEGATRON_CAPACITY;
	for (int j = 0; j < 3; j++) {
		kiln_load_profile *prof;
		cr_assert_eq(kiln_load_parse(loads[j], c->model->max_factor, a, stderr, &prof), 0);
		kiln_sim_config cfg = {.c = c,
		                       .loads = prof,
		                       .iterations = 8,
		                       .seed = 3,
		                       .restart_s = 284,
		                       .checkpoint_every = 100,
		                       .exact = 1,
		                       .capacity_factor = 1.0};
		cr_assert_eq(kiln_sim_run(&cfg, &k, 1, a, stderr, &r[j]), 0);
	}
	for (int j = 1; j < 3; j++)
		for (int32_t s = 0; s < r[0].n_stages; s++)
			cr_expect_eq(r[j].peak_bytes[s], r[0].peak_bytes[s], "%s stage %d",
			             loads[j], s);
	/* Balanced loads sit at capacity: nothing dropped; a hot rank drops. */
	cr_expect_eq(r[0].dropped_fraction, 0);
	cr_expect_gt(r[1].dropped_fraction, 0);
	cr_expect_lt(r[1].dropped_fraction, 1);
	cr_expect_not_null(r[0].flags);
	kiln_arena_free(a);
}

/* kiln_megatron_search_beside (the paged stash's side recipe, sim/policy.c):
 * nothing beside changes nothing; bytes reserved on every stage are the
 * same search on devices that much smaller; modules left out are never
 * chosen, and without full recompute the fallback is every module left
 * in (fits false). */
Test(baselines, search_beside_the_stash, .timeout = 300)
{
	const kiln_compilation *c = kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_megatron r0, r1;
	kiln_megatron_actions m0, m1;
	cr_assert_eq(kiln_megatron_search(c, 1.2, a, &r0, &m0, NULL), 0);
	kiln_megatron_beside none = {0};
	cr_assert_eq(kiln_megatron_search_beside(c, 1.2, &none, a, &r1, &m1, NULL), 0);
	cr_expect_eq(memcmp(&r0, &r1, sizeof r0), 0);
	cr_expect_eq(m0.worst_us, m1.worst_us);
	cr_expect_eq(m0.fits, m1.fits);

	/* 1 MiB reserved on every stage against a copy of the compilation
	 * whose stages are 1 MiB smaller. */
	int32_t ns = c->graph->n_stages;
	double reserved[8];
	cr_assert_leq(ns, 8);
	kiln_compilation small = *c;
	kiln_stage_budget *bu = kiln_arena_alloc(a, sizeof *bu * (size_t)ns);
	cr_assert_not_null(bu);
	for (int32_t s = 0; s < ns; s++) {
		reserved[s] = 1048576;
		bu[s] = c->budgets[s];
		bu[s].capacity_bytes -= reserved[s];
	}
	small.budgets = bu;
	kiln_megatron_beside res = {.reserved_bytes = reserved};
	cr_assert_eq(kiln_megatron_search(&small, 1.2, a, &r0, &m0, NULL), 0);
	cr_assert_eq(kiln_megatron_search_beside(c, 1.2, &res, a, &r1, &m1, NULL), 0);
	cr_expect_eq(memcmp(&r0, &r1, sizeof r0), 0);
	cr_expect_eq(m0.fits, m1.fits);
	cr_expect_eq(m0.worst_us, m1.worst_us);

	/* What the stash leaves out, and nothing fitting (the whole device
	 * reserved): the fallback is selective, without the modules left
	 * out. */
	for (int32_t s = 0; s < ns; s++)
		reserved[s] = c->budgets[s].capacity_bytes;
	kiln_megatron_beside st = {.no_recompute = KILN_MRC(MOE_ACT) | KILN_MRC(MOE),
	                           .no_offload = KILN_MOF(EXPERT_FC1) | KILN_MOF(MOE_ACT) |
	                                         KILN_MOF(FUSED_GROUP_MLP),
	                           .no_full = true,
	                           .reserved_bytes = reserved};
	cr_assert_eq(kiln_megatron_search_beside(c, 1.2, &st, a, &r1, &m1, NULL), 0);
	cr_expect(!m1.fits);
	cr_expect_neq(r1.recompute, KILN_RECOMPUTE_FULL);
	cr_expect_eq(r1.recompute_modules & st.no_recompute, 0);
	cr_expect_eq(r1.offload_modules & st.no_offload, 0);
	cr_expect_neq(r1.recompute_modules, 0);
	/* Everything left out: no recompute, no offload. */
	st.no_recompute = ~0u;
	st.no_offload = ~0u;
	cr_assert_eq(kiln_megatron_search_beside(c, 1.2, &st, a, &r1, &m1, NULL), 0);
	cr_expect_eq(r1.recompute, KILN_RECOMPUTE_NONE);
	cr_expect_eq(r1.offload_modules, 0);
	for (int32_t i = 0; i < c->n_sets; i++)
		for (int32_t u = 0; u < c->sets[i].n_units; u++)
			cr_expect_eq(m1.tail[i][u], KILN_ACT_KEEP);
	kiln_arena_free(a);
}

/* c with the megatron baseline replaced by full recompute with the
 * uniform method in chunks of n layers (the full-recompute plan on every
 * layer, as kiln_megatron_recipe_eval gives it), in out and bls. */
static void with_uniform(const kiln_compilation *c, int64_t n, kiln_compilation *out,
                         kiln_baseline *bls)
{
	*out = *c;
	memcpy(bls, c->baselines, sizeof(kiln_baseline) * KILN_BASELINE_COUNT);
	kiln_baseline *mg = &bls[KILN_BASELINE_MEGATRON];
	mg->recipe = (kiln_megatron){.recompute = KILN_RECOMPUTE_FULL,
	                             .recompute_method = KILN_RECOMPUTE_UNIFORM,
	                             .recompute_num_layers = n};
	mg->plan = bls[KILN_BASELINE_FULL_RECOMPUTE].plan;
	mg->head_plan = NULL;
	mg->block_layers = 0;
	out->baselines = bls;
}

/* Megatron's uniform method (megatron/core/recompute.py:157-166 at
 * d98e8a64) checkpoints each run of N layers of a model chunk as one
 * tensor_parallel.checkpoint: only the run's input is saved
 * (tensor_parallel/random.py:616-628), and its backward re-runs the run's
 * forward with grad before its backward (random.py:656-668). tiny's stage
 * 0 holds model layers 0 (dense) to 3 (MoE); with N = 2 the chunks are
 * {0, 1} and {2, 3}. By hand, a layer's input is a micro-batch's tokens
 * times the hidden size in bf16: seq_len 128 * micro_batch 2 * hidden 64
 * * 2 bytes = 32,768 bytes. So layer 1 keeps nothing (N = 1: its input,
 * 32,768 bytes) and its backward transient is N = 1's plus those 32,768
 * bytes (its input is rebuilt with the chunk); layer 2 starts a chunk and
 * keeps its input. Every layer's forward re-runs once, as with N = 1: the
 * same exposed time. */
Test(baselines, uniform_chunks_keep_one_input_per_chunk)
{
	const kiln_compilation *c = kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	cr_assert_eq(c->graph->n_stages, 2);
	kiln_compilation c1, c2;
	kiln_baseline b1[KILN_BASELINE_COUNT], b2[KILN_BASELINE_COUNT];
	with_uniform(c, 1, &c1, b1);
	with_uniform(c, 2, &c2, b2);
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_sim_policy *p1, *p2;
	cr_assert_eq(kiln_sim_policy_new(KILN_SIM_MEGATRON, &c1, NULL, 0, a, stderr, &p1), 0);
	cr_assert_eq(kiln_sim_policy_new(KILN_SIM_MEGATRON, &c2, NULL, 0, a, stderr, &p2), 0);
	cr_expect_str_eq(kiln_sim_policy_flags(p2),
	                 "--recompute-granularity full --recompute-method "
	                 "uniform --recompute-num-layers 2");
	int32_t set = moe_set(c);
	cr_assert_eq(c->sets[set].stage, 0);
	double n = c->graph->layers[c->sets[set].layer].n_balanced;
	kiln_sim_choice one, rest, head;
	kiln_sim_policy_decide(p1, set, 1, n, 1e12, 0, 0, 0, &one);
	kiln_sim_policy_decide(p2, set, 1, n, 1e12, 0, 0, 0, &rest);
	kiln_sim_policy_decide(p2, set, 2, n, 1e12, 0, 0, 0, &head);
	cr_expect_eq(one.resident_bytes, 32768);
	cr_expect_eq(one.chunk, 0);
	cr_expect_eq(rest.resident_bytes, 0);
	cr_expect_eq(rest.transient_bytes, one.transient_bytes + 32768);
	cr_expect_eq(rest.chunk, 2);
	cr_expect_eq(head.resident_bytes, 32768);
	cr_expect_eq(head.transient_bytes, one.transient_bytes);
	cr_expect_eq(head.chunk, 1);
	cr_expect_float_eq(rest.exposed_us, one.exposed_us, 1e-9);
	cr_expect_eq(kiln_sim_policy_full_layers(p2), 2);
	/* The statistical method's bound covers a chunk's two transients. */
	double rb, rn, tb, tn;
	cr_assert_eq(kiln_sim_policy_bytes_bound(p2, set, &rb, &rn, &tb, &tn), 0);
	cr_expect_geq(tb + tn * n + 1, rest.transient_bytes + head.transient_bytes);
	kiln_sim_policy_free(p1);
	kiln_sim_policy_free(p2);
	kiln_arena_free(a);
}

/* The recipe's fit under uniform chunks, by hand on tiny's stage 0 at load
 * 1: with N = 1 every micro-batch in flight keeps the four layers' inputs
 * (4 * 32,768 bytes) and the backward rebuilds one layer at a time; with
 * N = 4 (one chunk) it keeps the first layer's input only, and the chunk's
 * backward holds what the four layers rebuild, the three later inputs and
 * the larger workspace of one layer at once. With the stage's room set
 * between the two needs, the eval's verdicts must follow them: with two
 * micro-batches in flight (tiny's) N = 1 fits and N = 4 does not; with
 * thirty-two the kept inputs (3 * 32,768 bytes fewer per micro-batch under
 * N = 4) outweigh the chunk's transient and only N = 4 fits. */
Test(baselines, uniform_chunks_fit_by_their_bytes)
{
	const kiln_compilation *c = kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	int32_t moe = moe_set(c), dense = -1;
	for (int32_t i = 0; i < c->n_sets; i++)
		if (c->sets[i].stage == 0 && c->sets[i].kind == KILN_LAYER_DENSE)
			dense = i;
	cr_assert_geq(dense, 0);
	cr_assert_eq(c->sets[moe].stage, 0);
	cr_assert_eq(c->sets[moe].n_layers, 3);
	cr_assert_eq(c->sets[dense].n_layers, 1);
	kiln_plan_bytes bd, bm;
	const uint8_t *fd =
	    c->pool->actions[c->baselines[KILN_BASELINE_FULL_RECOMPUTE].plan[dense]];
	const uint8_t *fm = c->pool->actions[c->baselines[KILN_BASELINE_FULL_RECOMPUTE].plan[moe]];
	kiln_plan_bytes_at(&c->sets[dense], fd, 0, &bd);
	kiln_plan_bytes_at(&c->sets[moe], fm, c->graph->layers[c->sets[moe].layer].n_balanced, &bm);
	cr_expect_float_eq(bd.resident, 32768, 1e-9);
	cr_expect_float_eq(bm.resident, 32768, 1e-9);
	double wsd = bd.transient - bd.saved, wsm = bm.transient - bm.saved;
	kiln_compilation c2 = *c;
	kiln_stage_budget bus[2];
	memcpy(bus, c->budgets, sizeof bus);
	c2.budgets = bus;
	bus[1].capacity_bytes = 1e15; /* the verdict is stage 0's */
	const double inflight[2] = {2, 32};
	for (int j = 0; j < 2; j++) {
		double fixed = bus[0].fixed_bytes, w = inflight[j];
		double need1 = w * (fixed + 4 * 32768.0) + fmax(bd.transient, bm.transient);
		double need4 =
		    w * (fixed + 32768.0) + bd.saved + 3 * bm.saved + 3 * 32768.0 + fmax(wsd, wsm);
		bus[0].inflight = w;
		bus[0].capacity_bytes = bus[0].static_bytes + floor((need1 + need4) / 2);
		kiln_arena *a = kiln_arena_new();
		cr_assert_not_null(a);
		kiln_megatron r = {.recompute = KILN_RECOMPUTE_FULL,
		                   .recompute_method = KILN_RECOMPUTE_UNIFORM,
		                   .recompute_num_layers = 1};
		kiln_megatron_actions m1, m4;
		cr_assert_eq(kiln_megatron_recipe_eval(&c2, &r, 1.0, a, &m1), 0);
		r.recompute_num_layers = 4;
		cr_assert_eq(kiln_megatron_recipe_eval(&c2, &r, 1.0, a, &m4), 0);
		cr_expect_eq(m1.fits, j == 0, "inflight %g: N=1 needs %.0f, N=4 %.0f", w, need1,
		             need4);
		cr_expect_eq(m4.fits, j == 1, "inflight %g: N=1 needs %.0f, N=4 %.0f", w, need1,
		             need4);
		/* The same layers re-run: the same objective. */
		cr_expect_float_eq(m4.worst_us, m1.worst_us, 1e-9 * fmax(1, m1.worst_us));
		if (j == 1) {
			/* Here N=4 fits, so the search finds a recipe that fits.
			 * With every byte of stage 0's room reserved beside the
			 * recipe (the stash's pages), no recipe can fit: each keeps
			 * at least one layer input per micro-batch (32,768 bytes).
			 * Uniform chunks are judged apart from the other recipes
			 * (uniform_fits), so this checks that they see the reserve. */
			kiln_megatron best;
			kiln_megatron_actions mb;
			double reserved[2] = {0, 0};
			kiln_megatron_beside bs = {.reserved_bytes = reserved};
			cr_assert_eq(
			    kiln_megatron_search_beside(&c2, 1.0, &bs, a, &best, &mb, NULL), 0);
			cr_expect(mb.fits, "nothing reserved: the best recipe fits");
			reserved[0] = bus[0].capacity_bytes - bus[0].static_bytes;
			cr_assert_eq(
			    kiln_megatron_search_beside(&c2, 1.0, &bs, a, &best, &mb, NULL), 0);
			char fl[512];
			cr_assert_geq(kiln_megatron_flags_format(&best, fl, sizeof fl), 0);
			cr_expect(!mb.fits, "all of stage 0's room reserved, yet %s fits", fl);
		}
		kiln_arena_free(a);
	}
}

/* tiny.yaml with its first `from` replaced by `to` (from NULL: as it
 * is) and extra (a top-level YAML section) appended, compiled; its arena
 * in *out_a (the caller frees it). */
static kiln_compilation tiny_edited(const char *from, const char *to, const char *extra,
                                    kiln_arena **out_a)
{
	FILE *f = fopen(kt_src("examples/models/tiny.yaml"), "rb");
	cr_assert_not_null(f);
	static char text[1 << 16];
	size_t len = fread(text, 1, sizeof text / 2, f);
	fclose(f);
	text[len] = 0;
	if (from) {
		char *at = strstr(text, from);
		cr_assert_not_null(at, "tiny.yaml has no '%s'", from);
		size_t nf = strlen(from), nt = strlen(to);
		cr_assert_lt(len - nf + nt + strlen(extra), sizeof text);
		memmove(at + nt, at + nf, len - (size_t)(at - text) - nf + 1);
		memcpy(at, to, nt);
		len = len - nf + nt;
	}
	cr_assert_lt(len + strlen(extra), sizeof text);
	memcpy(text + len, extra, strlen(extra) + 1);
	len += strlen(extra);
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_model *m = NULL;
	cr_assert_eq(kiln_frontend_load_buffer("tiny-with.yaml", text, len, a, stderr, &m), 0);
	kiln_compilation c = {.model = m, .arena = a, .solver = KILN_SOLVER_DP};
	cr_assert_eq(kiln_pipeline_compile(&c, NULL, NULL, NULL, stderr), 0);
	*out_a = a;
	return c;
}

static kiln_compilation tiny_with(const char *extra, kiln_arena **out_a)
{
	return tiny_edited(NULL, NULL, extra, out_a);
}

/* The graph layer of model layer `index`. */
static int32_t graph_layer(const kiln_compilation *c, int32_t index)
{
	for (int32_t l = 0; l < c->graph->n_layers; l++)
		if (c->graph->layers[l].index == index)
			return l;
	cr_assert_fail("no model layer %d", index);
	return -1;
}

/* The recipe both offload-group tests apply by hand: fc1's input
 * offloaded, every tensor eligible, fraction 0.5, a delta one byte over
 * one layer's fc1 input at load 1. */
static const char fc1_recipe[] = "megatron:\n"
                                 "  offload_modules: [expert_fc1]\n"
                                 "  min_offloaded_tensor_size: 0\n"
                                 "  activation_offload_fraction: 0.5\n"
                                 "  delta_offload_bytes_across_pp_ranks: 65537\n";

/* What Megatron's offload groups move, by hand (fine_grained_activation_
 * offload.py:609-668 and should_bulk_offload, :1206-1227, at d98e8a64),
 * on tiny with expert_fc1 offloaded (fc1's input: 2 * h * n = 2 * 64 *
 * 512 = 65,536 bytes per MoE layer at load 1, every tensor offloaded with
 * min_offloaded_tensor_size 0), activation_offload_fraction 0.5 and
 * delta_offload_bytes_across_pp_ranks 65,537. tiny has 4 micro-batches
 * (one handler each), stage 0 model layers 0 (dense: no expert_fc1
 * group) to 3, stage 1 layers 4 to 7; stage 0 holds 2 micro-batches in
 * flight, stage 1 one (its handler's backward runs next: the run-time
 * rule keeps the last group).
 * - Stage 0 (rank 0 keeps 0 * delta), micro-batch 0: the margin keeps its
 *   last group (layer 3); of the 2 left int(2 * 0.5) = 1 later one is
 *   kept (layer 2): layer 1 offloads. Micro-batches 1-3: int(3 * 0.5) = 1
 *   (layer 3) kept: layers 1 and 2 offload.
 * - Stage 1 (rank 1 keeps 65,537 bytes), micro-batch 0: the margin keeps
 *   layer 7; the delta turns off layer 4 (65,537 - 65,536 = 1 byte still
 *   to keep) and layer 5; of layer 6 alone int(0.5) = 0 more: layer 6
 *   offloads. Micro-batches 1-3: int(4 * 0.5) = 2 (layers 6, 7) kept:
 *   layers 4 and 5 offload. */
Test(baselines, offload_groups_move_what_megatron_moves)
{
	kiln_arena *a;
	kiln_compilation c = tiny_with(fc1_recipe, &a);
	const kiln_model *m = c.model;
	cr_assert_eq(m->micro_batches, 4);
	cr_assert_eq(c.graph->n_stages, 2);
	double n = c.graph->layers[c.sets[moe_set(&c)].layer].n_balanced;
	double fc1 = 2.0 * (double)m->hidden * n;
	cr_assert_float_eq(fc1, 65536, 0);
	const kiln_baseline *bl = &c.baselines[KILN_BASELINE_MEGATRON];
	cr_expect_str_eq(bl->models,
	                 "Megatron-Core --fine-grained-activation-offloading --offload-modules "
	                 "expert_fc1 --min-offloaded-tensor-size 0 --activation-offload-fraction "
	                 "0.5 --delta-offload-bytes-across-pp-ranks 65537");
	kiln_megatron_actions ma;
	cr_assert_eq(kiln_megatron_recipe_eval(&c, &m->megatron, 1.0, a, &ma), 0);
	/* [stage][run][layer within the stage]: fc1 inputs offloaded */
	static const int want[2][2][4] = {{{0, 1, 0, 0}, {0, 1, 1, 0}},
	                                  {{0, 0, 1, 0}, {1, 1, 0, 0}}};
	for (int s = 0; s < 2; s++) {
		cr_assert_eq(ma.n_runs[s], 2, "stage %d", s);
		cr_expect_eq(ma.run_end[s][0], 1);
		cr_expect_eq(ma.run_end[s][1], 4);
		for (int r = 0; r < 2; r++)
			for (int j = 0; j < 4; j++) {
				int32_t l = graph_layer(&c, 4 * s + j);
				if (c.graph->layers[l].kind != KILN_LAYER_MOE) {
					cr_expect_eq(want[s][r][j], 0);
					continue;
				}
				cr_assert_not_null(ma.layer_actions[l]);
				int32_t i = -1;
				for (int32_t k = 0; k < c.n_sets; k++)
					if (c.sets[k].stage == s &&
					    c.sets[k].kind == KILN_LAYER_MOE)
						i = k;
				kiln_plan_bytes b;
				kiln_plan_bytes_at(&c.sets[i], ma.layer_actions[l][r], n, &b);
				cr_expect_float_eq(b.offloaded, want[s][r][j] * fc1, 0.5,
				                   "stage %d run %d layer %d: %.0f", s, r,
				                   4 * s + j, b.offloaded);
			}
	}
	/* The simulator gives each micro-batch its plan, the baseline's,
	 * chosen at the design load 1.2 (groups of 1.2 * 65,536 = 78,643
	 * bytes): layer 2 keeps fc1's input in micro-batch 0 only (as at load
	 * 1), and so does layer 4 (the delta, 65,537 bytes, is spent on it). */
	kiln_sim_policy *p;
	cr_assert_eq(kiln_sim_policy_new(KILN_SIM_MEGATRON, &c, NULL, 0, a, stderr, &p), 0);
	const int32_t layers[2] = {2, 4};
	for (int k = 0; k < 2; k++) {
		int32_t set = -1;
		for (int32_t i = 0; i < c.n_sets; i++)
			if (c.sets[i].stage == k && c.sets[i].kind == KILN_LAYER_MOE)
				set = i;
		kiln_sim_choice first, later;
		kiln_sim_policy_decide(p, set, layers[k], n, 1e12, 0, 0, 0, &first);
		kiln_sim_policy_decide(p, set, layers[k], n, 1e12, 0, 2, 0, &later);
		cr_expect_eq(first.resident_bytes - later.resident_bytes, fc1, "layer %d",
		             layers[k]);
		cr_expect_gt(later.copy_us, first.copy_us, "layer %d", layers[k]);
	}
	kiln_sim_policy_free(p);
	kiln_arena_free(a);
}

/* The same recipe under the interleaved schedule with vpp 2 (one
 * handler per micro-batch and model chunk, fine_grained_activation_
 * offload.py:742-802 at d98e8a64), by hand. Chunks: stage 0 holds model
 * layers 0 (dense), 1 (chunk 0) and 4, 5 (chunk 1); stage 1 layers 2, 3
 * (chunk 0) and 6, 7 (chunk 1); groups of 65,536 bytes. flush (:580-593)
 * queues the backward handlers as (micro-batch, chunk) (0,1) (1,1) (0,0)
 * (1,0) (2,1) (3,1) (2,0) (3,0). Warm-up forwards: 4 on stage 0, 2 on
 * stage 1 (2 * (pp - s - 1) + (vpp - 1) * pp).
 * - Stage 0: the margin keeps the last group of (0,1), layer 5. Handler
 *   (0,1): of layer 4 alone int(0.5) = 0 kept; other chunk-1 handlers:
 *   int(2 * 0.5) = 1, layer 5 kept; chunk 0: layer 1 alone, offloaded.
 *   Every micro-batch alike: layers 1 and 4 offload (one run).
 * - Stage 1 (65,537 bytes kept): the margin keeps layer 7 of (0,1); the
 *   delta turns off layer 6 of (0,1) (1 byte left) and layer 6 of (1,1).
 *   The run-time rule: forward j of stage 1 runs after max(0, j - 2)
 *   backwards; chunk 1's forwards (positions 2, 3, 6, 7) each find their
 *   own handler next, so layer 7 stays in (1,1) too (and in (2,1), (3,1),
 *   where the fraction, int(2 * 0.5) = 1, keeps it already). Chunk 0:
 *   int(2 * 0.5) = 1, layer 3 kept. Micro-batches 0-1: layer 2 offloads;
 *   2-3: layers 2 and 6 (two runs).
 * One handler per micro-batch (vpp 1's model) would have offloaded
 * layers 2 and 3 in micro-batches 1-3 on stage 1 and layer 4 not at all
 * on stage 0. */
Test(baselines, offload_groups_per_model_chunk)
{
	kiln_arena *a;
	kiln_compilation c =
	    tiny_edited("schedule: 1f1b", "schedule: interleaved\n  vpp: 2", fc1_recipe, &a);
	const kiln_model *m = c.model;
	cr_assert_eq(m->vpp, 2);
	cr_assert_eq(m->micro_batches, 4);
	double n = c.graph->layers[c.sets[moe_set(&c)].layer].n_balanced;
	double fc1 = 2.0 * (double)m->hidden * n;
	cr_assert_float_eq(fc1, 65536, 0);
	kiln_megatron_actions ma;
	cr_assert_eq(kiln_megatron_recipe_eval(&c, &m->megatron, 1.0, a, &ma), 0);
	/* [run][model layer] (0: dense; run 1 only on stage 1): fc1's input offloaded */
	static const int runs[2] = {1, 2};
	static const int64_t ends[2][2] = {{4, 0}, {2, 4}};
	static const int want[2][8] = {{0, 1, 1, 0, 1, 0, 0, 0}, {0, 0, 1, 0, 0, 0, 1, 0}};
	for (int s = 0; s < 2; s++) {
		cr_assert_eq(ma.n_runs[s], runs[s], "stage %d", s);
		for (int r = 0; r < runs[s]; r++)
			cr_expect_eq(ma.run_end[s][r], ends[s][r], "stage %d run %d", s, r);
	}
	for (int32_t idx = 1; idx < 8; idx++) {
		int32_t l = graph_layer(&c, idx);
		int32_t s = c.graph->layers[l].stage;
		cr_assert_not_null(ma.layer_actions[l], "layer %d", idx);
		int32_t i = kiln_set_of_layer(c.sets, c.n_sets, &c.graph->layers[l]);
		for (int r = 0; r < runs[s]; r++) {
			kiln_plan_bytes b;
			kiln_plan_bytes_at(&c.sets[i], ma.layer_actions[l][r], n, &b);
			cr_expect_float_eq(b.offloaded, want[r][idx] * fc1, 0.5,
			                   "stage %d run %d layer %d: %.0f", s, r, idx,
			                   b.offloaded);
		}
	}
	/* The simulator's plan is the baseline's, chosen at the design load
	 * 1.2 (groups of 78,643 bytes): the delta is spent on layer 6 of
	 * handler (0,1) alone, so layer 6 keeps fc1's input in micro-batch 0
	 * and offloads it from micro-batch 1 on. */
	kiln_sim_policy *p;
	cr_assert_eq(kiln_sim_policy_new(KILN_SIM_MEGATRON, &c, NULL, 0, a, stderr, &p), 0);
	int32_t l6 = graph_layer(&c, 6);
	int32_t set = kiln_set_of_layer(c.sets, c.n_sets, &c.graph->layers[l6]);
	kiln_sim_choice first, later;
	kiln_sim_policy_decide(p, set, 6, n, 1e12, 0, 0, 0, &first);
	kiln_sim_policy_decide(p, set, 6, n, 1e12, 0, 1, 0, &later);
	cr_expect_eq(first.resident_bytes - later.resident_bytes, fc1);
	kiln_sim_policy_free(p);
	kiln_arena_free(a);
}

/* The search with Megatron's offload tuning against every recipe of its
 * space on tiny with every tensor offloadable (min_offloaded_tensor_size
 * 0), the modules restricted beside it to layernorm and moe_act
 * recompute and attn_norm, mlp_norm, expert_fc1 and moe_act offload
 * (and no full recompute) to keep the enumeration small: every subset of
 * each, and for each offloading one every fraction with every delta of
 * the grid (passes.h, KILN_MEGATRON_FRACTIONS; the delta's unit from
 * kiln_megatron_delta_unit). Evaluated one by one without the search's
 * pruning or memo; the least objective, then the least summed exposed
 * time, must be the search's. On tiny's own memory the brute-force best
 * is a tuned recipe (a delta across pp ranks) at some load: the tuning is
 * what is tested. */
Test(baselines, search_with_offload_tuning_finds_the_brute_force_best, .timeout = 600)
{
	kiln_arena *ca;
	kiln_compilation c = tiny_with("megatron:\n  min_offloaded_tensor_size: 0\n", &ca);
	const uint32_t rs = KILN_MRC(LAYERNORM) | KILN_MRC(MOE_ACT);
	const uint32_t os =
	    KILN_MOF(ATTN_NORM) | KILN_MOF(MLP_NORM) | KILN_MOF(EXPERT_FC1) | KILN_MOF(MOE_ACT);
	kiln_megatron_beside bs = {.no_recompute = ((1u << KILN_MRC_COUNT) - 1) & ~rs,
	                           .no_offload = ((1u << KILN_MOF_COUNT) - 1) & ~os,
	                           .no_full = true};
	const double loads[] = {1.2, 2.5};
	int tuned = 0;
	for (size_t j = 0; j < 2; j++) {
		kiln_arena *a = kiln_arena_new();
		cr_assert_not_null(a);
		bool found = false, best_tuned = false;
		double bw = INFINITY, bsum = INFINITY;
		for (uint32_t R = 0; R < 1u << KILN_MRC_COUNT; R++) {
			if (R & ~rs)
				continue;
			for (uint32_t O = 0; O < 1u << KILN_MOF_COUNT; O++) {
				if (O & ~os)
					continue;
				kiln_megatron base = {.recompute = R ? KILN_RECOMPUTE_SELECTIVE
				                                     : KILN_RECOMPUTE_NONE,
				                      .recompute_modules = R,
				                      .offload_modules = O,
				                      .min_offloaded_set = true};
				double unit = 0;
				if (O)
					cr_assert_eq(
					    kiln_megatron_delta_unit(&c, &base, loads[j], a, &unit),
					    0);
				for (int fi = 0; fi < KILN_MEGATRON_N_FRACTIONS; fi++)
					for (int di = 0; di < KILN_MEGATRON_N_DELTAS; di++) {
						double f = kiln_megatron_fractions[fi];
						double d = floor(unit * kiln_megatron_deltas[di]);
						if ((fi > 0 || di > 0) && !(unit > 0))
							continue;
						if ((fi > 0 || di > 0) && f == 1 && d == 0)
							continue;
						kiln_megatron r = base;
						r.offload_fraction_set = f < 1;
						r.offload_fraction = f < 1 ? f : 0;
						r.delta_offload_bytes = (int64_t)d;
						kiln_megatron_actions ma;
						cr_assert_eq(kiln_megatron_recipe_eval(
						                 &c, &r, loads[j], a, &ma),
						             0);
						if (!ma.fits)
							continue;
						double tol = 1e-9 * fmax(1, bw);
						if (!found || ma.worst_us < bw - tol ||
						    (ma.worst_us <= bw + tol &&
						     ma.exposed_us < bsum)) {
							bw = ma.worst_us;
							bsum = ma.exposed_us;
							best_tuned = fi > 0 || di > 0;
						}
						found = true;
					}
			}
		}
		kiln_megatron r;
		kiln_megatron_actions ma;
		cr_assert_eq(kiln_megatron_search_beside(&c, loads[j], &bs, a, &r, &ma, NULL), 0);
		char fl[512];
		cr_assert_geq(kiln_megatron_flags_format(&r, fl, sizeof fl), 0);
		cr_assert_eq(ma.fits, found, "load %g: %s", loads[j], fl);
		if (found) {
			cr_expect_float_eq(ma.worst_us, bw, 1e-9 * fmax(1, bw),
			                   "load %g: %s %.6f vs %.6f", loads[j], fl, ma.worst_us,
			                   bw);
			cr_expect_float_eq(ma.exposed_us, bsum, 1e-6 * fmax(1, bsum),
			                   "load %g: %s %.6f vs %.6f", loads[j], fl, ma.exposed_us,
			                   bsum);
		}
		tuned += best_tuned;
		kiln_arena_free(a);
	}
	kiln_arena_free(ca);
	cr_expect_gt(tuned, 0, "no case where the offload tuning wins: the test tests nothing");
}

/* Megatron's uniform full recompute in chunks of N = 2 layers
 * (megatron/core/recompute.py:157-166 at d98e8a64) through the whole
 * simulator, exact and at balanced load (every rank at its 512 rows), on
 * tiny's stage 0: model layers 0 (dense) to 3 (MoE), chunks {0, 1} and
 * {2, 3}, two micro-batches in flight. By hand, per micro-batch the chunk
 * heads 0 and 2 keep their inputs (2 * 32,768 bytes; seq 128 * micro-batch
 * 2 * hidden 64 * 2 bytes each) beside the fixed bytes, the others nothing;
 * a chunk's backward holds what both its layers rebuild (each layer's
 * full-recompute saved bytes, S_d dense and S_m MoE, and the second
 * layer's input, 32,768) beside the larger of their workspaces (W_d,
 * W_m). So the stage's peak, with micro-batch 1 in backward beside
 * micro-batch 0, is
 *   static + 2 * (fixed + 2 * 32,768)
 *          + max(S_d + S_m + 32,768 + max(W_d, W_m), 2 * S_m + 32,768 + W_m),
 * S and W read from one layer's full-recompute plan (kiln_plan_bytes_at).
 * With N = 1 every layer keeps its input and one layer is rebuilt at a
 * time: static + 2 * (fixed + 4 * 32,768) + max(S_d + W_d, S_m + W_m). */
Test(baselines, uniform_chunks_peak_in_the_simulator)
{
	const kiln_compilation *c = kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	int32_t moe = moe_set(c), dense = -1;
	for (int32_t i = 0; i < c->n_sets; i++)
		if (c->sets[i].stage == 0 && c->sets[i].kind == KILN_LAYER_DENSE)
			dense = i;
	cr_assert_geq(dense, 0);
	cr_assert_eq(c->sets[moe].stage, 0);
	const kiln_stage_budget *bu = &c->budgets[0];
	cr_assert_eq(bu->inflight, 2);
	kiln_plan_bytes bd, bm;
	const int32_t *full = c->baselines[KILN_BASELINE_FULL_RECOMPUTE].plan;
	kiln_plan_bytes_at(&c->sets[dense], c->pool->actions[full[dense]], 0, &bd);
	kiln_plan_bytes_at(&c->sets[moe], c->pool->actions[full[moe]],
	                   c->graph->layers[c->sets[moe].layer].n_balanced, &bm);
	double sd = bd.saved, sm = bm.saved, wd = bd.transient - bd.saved,
	       wm = bm.transient - bm.saved, in = 32768;
	double fixed = ceil(bu->fixed_bytes - 1e-6);
	double want2 = bu->static_bytes + 2 * (fixed + 2 * in) +
	               fmax(sd + sm + in + fmax(wd, wm), 2 * sm + in + wm);
	double want1 = bu->static_bytes + 2 * (fixed + 4 * in) + fmax(sd + wd, sm + wm);
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse("balanced", c->model->max_factor, a, stderr, &prof), 0);
	const int64_t ns[2] = {1, 2};
	const double want[2] = {want1, want2};
	for (int k = 0; k < 2; k++) {
		kiln_compilation cu;
		kiln_baseline bls[KILN_BASELINE_COUNT];
		with_uniform(c, ns[k], &cu, bls);
		kiln_sim_config cfg = {.c = &cu,
		                       .loads = prof,
		                       .iterations = 1,
		                       .seed = 1,
		                       .restart_s = 284,
		                       .checkpoint_every = 100,
		                       .exact = 1,
		                       .threads = 1};
		kiln_sim_policy_kind pk = KILN_SIM_MEGATRON;
		kiln_sim_result r;
		cr_assert_eq(kiln_sim_run(&cfg, &pk, 1, a, stderr, &r), 0);
		cr_expect_float_eq(r.peak_bytes[0], want[k], 0.5, "N = %lld: %.0f, hand %.0f",
		                   (long long)ns[k], r.peak_bytes[0], want[k]);
	}
	kiln_arena_free(a);
}
