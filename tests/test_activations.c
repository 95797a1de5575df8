/* tests/test_activations.c: passes/activations.c.
 *
 * Expected units, closures and sources are read off the layer structure in
 * docs/cost-model.md ("Activations", "Units and options") by hand; byte
 * totals are checked against costmodel/memory.c, which counts the same
 * tensors independently.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "frontend/frontend.h"
#include "kiln_test.h"
#include "passes/passes.h"


static kiln_arena *arena;

static void setup(void)
{
	arena = kiln_arena_new();
	cr_assert_not_null(arena);
}

static void teardown(void)
{
	kiln_arena_free(arena);
}

static kiln_model *load_model(const char *rel)
{
	kiln_model *m = NULL;
	cr_assert_eq(kiln_frontend_load_file(kt_src(rel), arena, stderr, &m), 0, "%s", rel);
	return m;
}

static kiln_ir_graph *lower(const kiln_model *m)
{
	kiln_ir_graph *g = NULL;
	cr_assert_eq(kiln_pipeline_run(m, arena, NULL, NULL, stderr, &g), 0);
	return g;
}

static void units_of(const kiln_ir_graph *g, kiln_unit_set **sets, int32_t *n)
{
	cr_assert_eq(kiln_pass_activations(g, arena, sets, n), 0);
}

static int32_t unit_named(const kiln_unit_set *s, const char *name)
{
	for (int32_t u = 0; u < s->n_units; u++)
		if (strcmp(s->units[u].name, name) == 0)
			return u;
	return -1;
}

static const kiln_unit_set *set_of(const kiln_unit_set *sets, int32_t n, int32_t stage,
                                   kiln_layer_kind kind)
{
	for (int32_t i = 0; i < n; i++)
		if (sets[i].stage == stage && sets[i].kind == kind)
			return &sets[i];
	cr_assert_fail("no set for stage %d kind %d", stage, (int)kind);
	return NULL;
}

TestSuite(activations, .init = setup, .fini = teardown);

/* Every shipped model: one set per (stage, kind) with transformer layers of
 * that kind, the first such layer as representative, and unit bytes summing
 * exactly to the layer's saved activation (each alias group once) for every
 * layer the set stands for. */
Test(activations, shipped_sets_cover_layers_and_bytes)
{
	for (size_t i = 0; i < KT_N_SHIPPED; i++) {
		kiln_ir_graph *g = lower(load_model(kt_shipped[i]));
		kiln_unit_set *sets;
		int32_t n;
		units_of(g, &sets, &n);
		int32_t expect_sets = 0;
		for (int32_t s = 0; s < g->n_stages; s++) {
			int32_t dense = 0, moe = 0;
			for (int32_t l = g->stages[s].layer_begin; l < g->stages[s].layer_end;
			     l++) {
				dense += g->layers[l].kind == KILN_LAYER_DENSE;
				moe += g->layers[l].kind == KILN_LAYER_MOE;
			}
			expect_sets += (dense > 0) + (moe > 0);
		}
		cr_assert_eq(n, expect_sets, "%s", kt_shipped[i]);
		for (int32_t k = 0; k < n; k++) {
			const kiln_unit_set *set = &sets[k];
			const kiln_ir_stage *st = &g->stages[set->stage];
			int32_t count = 0, first = -1;
			for (int32_t l = st->layer_begin; l < st->layer_end; l++)
				if (g->layers[l].kind == set->kind) {
					if (first < 0)
						first = l;
					count++;
				}
			cr_assert_eq(set->layer, first, "%s", kt_shipped[i]);
			cr_assert_eq(set->n_layers, count, "%s", kt_shipped[i]);
			kiln_lin sum = {0, 0};
			for (int32_t u = 0; u < set->n_units; u++) {
				sum.base += set->units[u].bytes.base;
				sum.per_n += set->units[u].bytes.per_n;
			}
			for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
				if (g->layers[l].kind != set->kind)
					continue;
				kiln_lin want = kiln_cost_layer_activation(g, l);
				cr_assert_eq(sum.base, want.base, "%s layer %d", kt_shipped[i], l);
				cr_assert_eq(sum.per_n, want.per_n, "%s layer %d", kt_shipped[i], l);
			}
		}
	}
}

static bool in_list(const int32_t *v, int32_t n, int32_t x)
{
	for (int32_t i = 0; i < n; i++)
		if (v[i] == x)
			return true;
	return false;
}

/* Structural facts every unit of every shipped model obeys: closures are in
 * forward order, contain the producer and are closed over non-saved inputs;
 * sources are exactly the other units the closure reads; flags follow the
 * closure's ops and the bytes. */
Test(activations, shipped_units_well_formed)
{
	for (size_t i = 0; i < KT_N_SHIPPED; i++) {
		kiln_ir_graph *g = lower(load_model(kt_shipped[i]));
		kiln_unit_set *sets;
		int32_t n;
		units_of(g, &sets, &n);
		for (int32_t k = 0; k < n; k++) {
			const kiln_unit_set *set = &sets[k];
			const kiln_ir_layer *ly = &g->layers[set->layer];
			for (int32_t u = 0; u < set->n_units; u++) {
				const kiln_unit *un = &set->units[u];
				const kiln_ir_tensor *tn = &g->tensors[un->tensor];
				cr_assert(tn->flags & KILN_T_SAVED);
				cr_assert_eq(tn->producer, un->producer);
				cr_assert(un->n_closure > 0);
				cr_assert(in_list(un->closure, un->n_closure, un->producer), "%s",
				          un->name);
				bool input = false, coll = false, rng = false;
				uint64_t ws = 0;
				for (int32_t c = 0; c < un->n_closure; c++) {
					int32_t o = un->closure[c];
					cr_assert(o >= ly->op_begin && o < ly->op_end &&
					          !g->ops[o].backward);
					if (c > 0)
						cr_assert_gt(o, un->closure[c - 1]);
					const kiln_ir_op *op = &g->ops[o];
					kiln_op_class cls = kiln_ir_op_kind_class(op->kind);
					input |= op->kind == KILN_OP_INPUT ||
					         cls == KILN_OPCLASS_COMM_PP;
					coll |= (cls == KILN_OPCLASS_COMM_TP ||
					         cls == KILN_OPCLASS_COMM_EP) &&
					        op->collective != KILN_COLL_NONE;
					for (int32_t j = 0; j < op->n_inputs; j++) {
						int32_t x = op->inputs[j];
						if (g->tensors[x].flags & KILN_T_SAVED) {
							int32_t s =
							    unit_named(set, g->tensors[x].name);
							cr_assert(s >= 0);
							if (s != u)
								cr_assert(in_list(un->sources,
								                  un->n_sources, s),
								          "%s: %s", un->name,
								          g->tensors[x].name);
						} else {
							cr_assert(in_list(un->closure,
							                  un->n_closure,
							                  g->tensors[x].producer),
							          "%s not closed at %s", un->name,
							          g->tensors[x].name);
						}
					}
					for (int32_t j = 0; j < op->n_outputs; j++) {
						const kiln_ir_tensor *out =
						    &g->tensors[op->outputs[j]];
						rng |= (out->flags & KILN_T_MASK) != 0;
						if (!(out->flags & KILN_T_SAVED))
							ws += out->bytes.base + out->bytes.per_n;
					}
				}
				for (int32_t s = 0; s < un->n_sources; s++) {
					cr_assert_neq(un->sources[s], u);
					if (s > 0)
						cr_assert_gt(un->sources[s], un->sources[s - 1]);
				}
				cr_assert_eq(un->workspace_bytes.base + un->workspace_bytes.per_n,
				             ws);
				cr_assert_eq(!!(un->flags & KILN_UNIT_LAYER_INPUT), input, "%s",
				             un->name);
				cr_assert_eq(!!(un->flags & KILN_UNIT_COLLECTIVE), coll, "%s",
				             un->name);
				cr_assert_eq(!!(un->flags & KILN_UNIT_RNG), rng, "%s", un->name);
				cr_assert_eq(!!(un->flags & KILN_UNIT_EXPERT), un->bytes.per_n > 0);
			}
		}
	}
}

/* tiny's MoE layer (tp 1, no dropout, flash attention, SwiGLU experts, and
 * the memory options' defaults: fused QKV, norms saving their rstd,
 * probabilities inside the expert activation), as lowered in
 * passes/lower.c: every unit with its sources, by hand. */
Test(activations, tiny_moe_units_and_sources)
{
	static const struct {
		const char *name;
		const char *sources[3];
		uint32_t flags;
	} want[] = {
	    {"ln1.in", {NULL}, KILN_UNIT_LAYER_INPUT},
	    {"attn.qkv_in", {"ln1.in"}, 0},
	    /* ln1's second output: one re-run of ln1 gives both. */
	    {"ln1.rstd", {"ln1.in"}, 0},
	    /* q, k and v: one storage, one unit. */
	    {"attn.qkv", {"attn.qkv_in"}, 0},
	    {"attn.out", {"attn.qkv"}, 0},
	    {"attn.lse", {"attn.qkv"}, 0},
	    /* out_proj's output is not saved: the closure re-runs it. */
	    {"ln2.in", {"ln1.in", "attn.out"}, 0},
	    {"moe.in", {"ln2.in"}, 0},
	    {"ln2.rstd", {"ln2.in"}, 0},
	    /* the router logits are not saved: router + softmax. */
	    {"moe.probs", {"moe.in"}, 0},
	    {"moe.perm_idx", {"moe.in", "moe.probs"}, KILN_UNIT_EXPERT},
	    /* the permuted rows and their probabilities are not saved:
	     * permute + dispatch. */
	    {"moe.expert_in", {"moe.in", "moe.probs"}, KILN_UNIT_EXPERT | KILN_UNIT_COLLECTIVE},
	    {"moe.expert_probs", {"moe.in", "moe.probs"}, KILN_UNIT_EXPERT | KILN_UNIT_COLLECTIVE},
	    {"moe.expert_up", {"moe.expert_in"}, KILN_UNIT_EXPERT},
	    /* the weighted SwiGLU reads the probabilities; no expert output. */
	    {"moe.expert_act", {"moe.expert_probs", "moe.expert_up"}, KILN_UNIT_EXPERT},
	};
	kiln_ir_graph *g = lower(load_model("examples/models/tiny.yaml"));
	kiln_unit_set *sets;
	int32_t n;
	units_of(g, &sets, &n);
	/* tiny: 8 layers, pp 2: layers 0 (dense), 1-3 on stage 0; 4-7 on stage 1. */
	cr_assert_eq(n, 3);
	const kiln_unit_set *dense = set_of(sets, n, 0, KILN_LAYER_DENSE);
	cr_assert_eq(dense->n_layers, 1);
	cr_assert_eq(dense->n_units, 11);
	const kiln_unit_set *moe1 = set_of(sets, n, 1, KILN_LAYER_MOE);
	cr_assert_eq(moe1->n_layers, 4);
	const kiln_unit_set *set = set_of(sets, n, 0, KILN_LAYER_MOE);
	cr_assert_eq(set->n_layers, 3);
	size_t nw = sizeof want / sizeof want[0];
	cr_assert_eq(set->n_units, (int32_t)nw);
	for (size_t i = 0; i < nw; i++) {
		const kiln_unit *un = &set->units[i];
		cr_assert_str_eq(un->name, want[i].name);
		cr_assert_eq(un->flags, want[i].flags, "%s: flags %#x", un->name, un->flags);
		int32_t ns = 0;
		while (ns < 3 && want[i].sources[ns])
			ns++;
		cr_assert_eq(un->n_sources, ns, "%s", un->name);
		for (int32_t s = 0; s < ns; s++)
			cr_assert_str_eq(set->units[un->sources[s]].name, want[i].sources[s], "%s",
			                 un->name);
	}
	/* Closures by op name. */
	const kiln_unit *ein = &set->units[unit_named(set, "moe.expert_in")];
	cr_assert_eq(ein->n_closure, 2);
	cr_assert_str_eq(g->ops[ein->closure[0]].name, "moe.permute");
	cr_assert_str_eq(g->ops[ein->closure[1]].name, "moe.dispatch");
	/* Workspace: the permuted rows, e * N_balanced * h = 2 * 512 * 64 =
	 * 65,536, and their fp32 probabilities, 4 * 512 = 2,048. */
	cr_assert_eq(ein->workspace_bytes.base, 65536 + 2048);
	cr_assert_eq(ein->workspace_bytes.per_n, 0);
	const kiln_unit *probs = &set->units[unit_named(set, "moe.probs")];
	/* fp32 logits: 4 * Tr * E = 4 * 256 * 8. */
	cr_assert_eq(probs->workspace_bytes.base, 8192);
	/* On stage 1 the first MoE layer receives its input from stage 0. */
	const kiln_unit *in1 = &moe1->units[unit_named(moe1, "ln1.in")];
	cr_assert(in1->flags & KILN_UNIT_LAYER_INPUT);
	cr_assert_eq(g->ops[in1->producer].kind, KILN_OP_PP_SEND);
	const kiln_unit *in0 = &set->units[unit_named(set, "ln1.in")];
	cr_assert_eq(g->ops[in0->producer].kind, KILN_OP_INPUT);
}

/* Dropout adds masks; their recomputes, and every recompute that re-runs a
 * dropout, replay saved RNG state. Eager attention saves the softmax and
 * the attention-dropout mask. */
Test(activations, dropout_units_flag_rng)
{
	kiln_model *m = load_model("examples/models/tiny.yaml");
	m->dropout = 0.1;
	m->attention = KILN_ATTN_EAGER;
	kiln_ir_graph *g = lower(m);
	kiln_unit_set *sets;
	int32_t n;
	units_of(g, &sets, &n);
	const kiln_unit_set *set = set_of(sets, n, 0, KILN_LAYER_MOE);
	static const char *const rng[] = {"attn.dropout_mask", "attn.probs", "attn.resid_mask",
	                                  "ln2.in"};
	for (size_t i = 0; i < sizeof rng / sizeof rng[0]; i++) {
		int32_t u = unit_named(set, rng[i]);
		cr_assert_geq(u, 0, "%s", rng[i]);
		cr_assert(set->units[u].flags & KILN_UNIT_RNG, "%s", rng[i]);
	}
	static const char *const plain[] = {"attn.qkv", "attn.softmax", "moe.probs",
	                                    "moe.expert_act"};
	for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
		int32_t u = unit_named(set, plain[i]);
		cr_assert_geq(u, 0, "%s", plain[i]);
		cr_assert_not(set->units[u].flags & KILN_UNIT_RNG, "%s", plain[i]);
	}
	/* The mask (1 byte per element) and its probs share one op. */
	const kiln_unit *mask = &set->units[unit_named(set, "attn.dropout_mask")];
	const kiln_unit *pr = &set->units[unit_named(set, "attn.probs")];
	cr_assert_eq(mask->n_closure, 1);
	cr_assert_eq(pr->closure[0], mask->closure[0]);
	kiln_lin sum = {0, 0};
	for (int32_t u = 0; u < set->n_units; u++) {
		sum.base += set->units[u].bytes.base;
		sum.per_n += set->units[u].bytes.per_n;
	}
	kiln_lin want = kiln_cost_layer_activation(g, set->layer);
	cr_assert_eq(sum.base, want.base);
	cr_assert_eq(sum.per_n, want.per_n);
}

/* A hand-built layer:
 *   in:   INPUT            -> x (saved, 100)
 *   a:    x                -> y (saved, 40)
 *   b:    y (in place)     -> z (saved, alias of y)
 *   c:    z                -> w (not saved, 30 + 2N)
 *   tp:   w (all-reduce)   -> r (not saved, 30)
 *   d:    r, x             -> s (saved, 8N), m (saved mask, 5)
 * Units: x, y+z (40 once), s, m. s and m share d, whose closure also
 * re-runs tp (collective) and c; d writes a mask (RNG). */
static kiln_ir_graph *hand_graph(const kiln_model *m, int32_t *t)
{
	kiln_ir_builder *b = kiln_ir_builder_new(arena, m);
	cr_assert_not_null(b);
	cr_assert_eq(kiln_ir_builder_stage(b), 0);
	cr_assert_geq(kiln_ir_builder_layer(b, KILN_LAYER_DENSE, 0, 0, 0), 0);
	t[0] = kiln_ir_builder_tensor(b, "x", (kiln_lin){100, 0}, KILN_T_SAVED, -1);
	t[1] = kiln_ir_builder_tensor(b, "y", (kiln_lin){40, 0}, KILN_T_SAVED, -1);
	t[2] = kiln_ir_builder_tensor(b, "z", (kiln_lin){40, 0}, KILN_T_SAVED, t[1]);
	t[3] = kiln_ir_builder_tensor(b, "w", (kiln_lin){30, 2}, 0, -1);
	t[4] = kiln_ir_builder_tensor(b, "r", (kiln_lin){30, 0}, 0, -1);
	t[5] = kiln_ir_builder_tensor(b, "s", (kiln_lin){0, 8}, KILN_T_SAVED | KILN_T_EXPERT, -1);
	t[6] = kiln_ir_builder_tensor(b, "m", (kiln_lin){5, 0}, KILN_T_SAVED | KILN_T_MASK, -1);
	struct {
		kiln_op_kind kind;
		const char *name;
		int32_t in[2], n_in, out[2], n_out;
		kiln_collective coll;
	} ops[] = {
	    {KILN_OP_INPUT, "in", {0}, 0, {t[0]}, 1, KILN_COLL_NONE},
	    {KILN_OP_NORM, "a", {t[0]}, 1, {t[1]}, 1, KILN_COLL_NONE},
	    {KILN_OP_FFN_ACT, "b", {t[1]}, 1, {t[2]}, 1, KILN_COLL_NONE},
	    {KILN_OP_FFN_DOWN, "c", {t[2]}, 1, {t[3]}, 1, KILN_COLL_NONE},
	    {KILN_OP_TP_COMM, "tp", {t[3]}, 1, {t[4]}, 1, KILN_COLL_ALL_REDUCE},
	    {KILN_OP_RESID_DROPOUT, "d", {t[4], t[0]}, 2, {t[5], t[6]}, 2, KILN_COLL_NONE},
	};
	for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
		kiln_ir_op op = {.kind = ops[i].kind,
		                 .forward = -1,
		                 .name = ops[i].name,
		                 .collective = ops[i].coll,
		                 .comm_group = ops[i].coll == KILN_COLL_NONE ? 0 : 2,
		                 .comm_bytes = {ops[i].coll == KILN_COLL_NONE ? 0 : 30, 0},
		                 .traffic = {10, 1},
		                 .inputs = ops[i].in,
		                 .n_inputs = ops[i].n_in,
		                 .outputs = ops[i].out,
		                 .n_outputs = ops[i].n_out};
		cr_assert_geq(kiln_ir_builder_op(b, &op), 0);
	}
	kiln_ir_graph *g = kiln_ir_builder_finish(b);
	cr_assert_not_null(g);
	return g;
}

Test(activations, hand_graph_alias_closure_flags)
{
	kiln_model *m = load_model("examples/models/tiny.yaml");
	int32_t t[7];
	kiln_ir_graph *g = hand_graph(m, t);
	kiln_unit_set *sets;
	int32_t n;
	units_of(g, &sets, &n);
	cr_assert_eq(n, 1);
	const kiln_unit_set *set = &sets[0];
	cr_assert_eq(set->kind, KILN_LAYER_DENSE);
	cr_assert_eq(set->n_units, 4);
	const kiln_unit *x = &set->units[0], *y = &set->units[1], *s = &set->units[2],
	                *mk = &set->units[3];
	cr_assert_str_eq(x->name, "x");
	cr_assert_str_eq(y->name, "y");
	cr_assert_str_eq(s->name, "s");
	cr_assert_str_eq(mk->name, "m");
	/* Alias group counted once: 100 + 40 + 8N + 5. */
	cr_assert_eq(y->bytes.base, 40);
	kiln_lin want = kiln_cost_layer_activation(g, 0);
	cr_assert_eq(want.base, 145);
	cr_assert_eq(want.per_n, 8);
	cr_assert_eq(x->bytes.base + y->bytes.base + s->bytes.base + mk->bytes.base, want.base);
	cr_assert_eq(s->bytes.per_n, want.per_n);

	cr_assert_eq(x->flags, KILN_UNIT_LAYER_INPUT);
	/* y's buffer has two writers, a (y) and b (z in place): both re-run;
	 * b reads the group's own buffer, so x is the only source. */
	cr_assert_eq(y->n_closure, 2);
	cr_assert_eq(y->n_sources, 1);
	cr_assert_eq(y->sources[0], 0);
	cr_assert_eq(y->flags, 0);
	/* s: d, tp and c (w and r are not saved); reads z (unit y) and x. */
	cr_assert_eq(s->n_closure, 3);
	cr_assert_str_eq(g->ops[s->closure[0]].name, "c");
	cr_assert_str_eq(g->ops[s->closure[1]].name, "tp");
	cr_assert_str_eq(g->ops[s->closure[2]].name, "d");
	cr_assert_eq(s->n_sources, 2);
	cr_assert_eq(s->sources[0], 0);
	cr_assert_eq(s->sources[1], 1);
	cr_assert_eq(s->workspace_bytes.base, 60);
	cr_assert_eq(s->workspace_bytes.per_n, 2);
	cr_assert_eq(s->flags, KILN_UNIT_COLLECTIVE | KILN_UNIT_RNG | KILN_UNIT_EXPERT);
	cr_assert_eq(mk->flags, KILN_UNIT_COLLECTIVE | KILN_UNIT_RNG);
	cr_assert_eq(mk->n_closure, 3);
}

/* A stage with no transformer layers (a dense head-only graph) has no set;
 * a graph with none has no sets at all. */
Test(activations, no_transformer_layers_no_sets)
{
	kiln_model *m = load_model("examples/models/tiny.yaml");
	kiln_ir_builder *b = kiln_ir_builder_new(arena, m);
	cr_assert_not_null(b);
	cr_assert_eq(kiln_ir_builder_stage(b), 0);
	cr_assert_geq(kiln_ir_builder_layer(b, KILN_LAYER_HEAD, -1, 0, 0), 0);
	int32_t x = kiln_ir_builder_tensor(b, "head.in", (kiln_lin){10, 0}, KILN_T_SAVED, -1);
	kiln_ir_op op = {
	    .kind = KILN_OP_INPUT, .forward = -1, .name = "input", .outputs = &x, .n_outputs = 1};
	cr_assert_geq(kiln_ir_builder_op(b, &op), 0);
	kiln_ir_graph *g = kiln_ir_builder_finish(b);
	cr_assert_not_null(g);
	kiln_unit_set *sets = (kiln_unit_set *)&sets;
	int32_t n = -1;
	units_of(g, &sets, &n);
	cr_assert_eq(n, 0);
	cr_assert_null(sets);
}
