/* tests/test_ir.c: ir/ir.c (op tables, builder), ir/verify.c, ir/print.c. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "kiln_test.h"


/* A small MoE model with TP, SP and an uneven two-stage split (2 + 1
 * layers): the shared test model with what the IR tests exercise changed. */
static void tm_init(kt_model *t)
{
	kt_model_init(t);
	kiln_model *m = &t->m;
	m->name = "ir-test";
	m->layers = 3;
	m->attention = KILN_ATTN_EAGER;
	m->dropout = 0.1;
	m->moe = true;
	m->dense_layers = 1;
	m->experts = 8;
	m->shared_experts = 1;
	m->top_k = 2;
	m->expert_ffn_hidden = 128;
	m->devices = 8;
	m->tp = 2;
	m->pp = 2;
	m->ep = 2;
	m->sequence_parallel = true;
	kt_model_finish(t); /* chunks 2 + 1, dp 2, edp 2, 4 micro-batches */
}

static kiln_ir_graph *lower_ok(const kiln_model *m, kiln_arena *a)
{
	kiln_ir_graph *g = NULL;
	cr_assert_eq(kiln_pass_lower(m, a, &g), 0);
	cr_assert_not_null(g);
	return g;
}

/* ---------------------------------------------------------------- tables */

Test(ir_ops, names_and_classes)
{
	cr_expect_str_eq(kiln_ir_op_kind_name(KILN_OP_EMBED), "embed");
	cr_expect_str_eq(kiln_ir_op_kind_name(KILN_OP_ATTN_CORE), "attn_core");
	cr_expect_str_eq(kiln_ir_op_kind_name(KILN_OP_PP_SEND), "pp_send");
	cr_expect_str_eq(kiln_ir_op_kind_name(KILN_OP_INPUT), "input");
	cr_expect_str_eq(kiln_ir_op_kind_name((kiln_op_kind)KILN_OP_COUNT), "?");
	cr_expect_eq(kiln_ir_op_kind_class(KILN_OP_QKV_PROJ), KILN_OPCLASS_GEMM);
	cr_expect_eq(kiln_ir_op_kind_class(KILN_OP_ATTN_CORE), KILN_OPCLASS_ATTN);
	cr_expect_eq(kiln_ir_op_kind_class(KILN_OP_NORM), KILN_OPCLASS_MEM);
	cr_expect_eq(kiln_ir_op_kind_class(KILN_OP_TP_COMM), KILN_OPCLASS_COMM_TP);
	cr_expect_eq(kiln_ir_op_kind_class(KILN_OP_DISPATCH), KILN_OPCLASS_COMM_EP);
	cr_expect_eq(kiln_ir_op_kind_class(KILN_OP_COMBINE), KILN_OPCLASS_COMM_EP);
	cr_expect_eq(kiln_ir_op_kind_class(KILN_OP_PP_SEND), KILN_OPCLASS_COMM_PP);
	cr_expect_eq(kiln_ir_op_kind_class(KILN_OP_EXPERT_UP), KILN_OPCLASS_GEMM);
	/* Every kind has a distinct, non-empty name. */
	for (int i = 0; i < KILN_OP_COUNT; i++) {
		const char *n = kiln_ir_op_kind_name((kiln_op_kind)i);
		cr_expect(n && *n && strcmp(n, "?"));
		for (int j = 0; j < i; j++)
			cr_expect_str_neq(n, kiln_ir_op_kind_name((kiln_op_kind)j));
	}
	cr_expect_str_eq(kiln_ir_layer_kind_name(KILN_LAYER_MOE), "moe");
	cr_expect_str_eq(kiln_ir_layer_kind_name(KILN_LAYER_HEAD), "head");
	cr_expect_str_eq(kiln_ir_collective_name(KILN_COLL_REDUCE_SCATTER), "reduce_scatter");
	cr_expect_str_eq(kiln_ir_collective_name(KILN_COLL_ALL_TO_ALL), "all_to_all");
}

Test(ir_ops, act_bytes)
{
	kiln_model m = {0};
	m.dtype = KILN_DTYPE_BF16;
	cr_expect_eq(kiln_model_act_bytes(&m), 2);
	m.dtype = KILN_DTYPE_FP16;
	cr_expect_eq(kiln_model_act_bytes(&m), 2);
	m.dtype = KILN_DTYPE_FP8;
	cr_expect_eq(kiln_model_act_bytes(&m), 1);
	m.dtype = KILN_DTYPE_FP32;
	cr_expect_eq(kiln_model_act_bytes(&m), 4);
}

/* ---------------------------------------------------------------- builder */

Test(ir_builder, builds_ranges_and_producers)
{
	kt_model tm;
	tm_init(&tm);
	kiln_arena *a = kiln_arena_new();
	kiln_ir_builder *b = kiln_ir_builder_new(a, &tm.m);
	cr_assert_not_null(b);
	cr_assert_eq(kiln_ir_builder_stage(b), 0);
	cr_assert_eq(kiln_ir_builder_layer(b, KILN_LAYER_EMBED, -1, 0, 0), 0);
	int32_t t0 = kiln_ir_builder_tensor(b, "x", (kiln_lin){10, 0}, 0, -1);
	int32_t t1 = kiln_ir_builder_tensor(b, "y", (kiln_lin){10, 0}, KILN_T_SAVED, t0);
	cr_expect_eq(t0, 0);
	cr_expect_eq(t1, 1);
	int32_t outs[] = {t0, t1};
	kiln_ir_op op = {
	    .kind = KILN_OP_EMBED, .name = "e", .forward = -1, .outputs = outs, .n_outputs = 2};
	cr_expect_eq(kiln_ir_builder_op(b, &op), 0);
	outs[0] = 99; /* the builder copied the list */
	cr_assert_eq(kiln_ir_builder_stage(b), 0);
	cr_assert_eq(kiln_ir_builder_layer(b, KILN_LAYER_HEAD, -1, 0, 0), 1);
	int32_t t2 = kiln_ir_builder_tensor(b, "z", (kiln_lin){1, 2}, KILN_T_EXPERT, -1);
	cr_expect_eq(t2, 2);
	kiln_ir_graph *g = kiln_ir_builder_finish(b);
	cr_assert_not_null(g);
	cr_expect_eq(g->model, &tm.m);
	cr_expect_eq(g->n_stages, 2);
	cr_expect_eq(g->n_layers, 2);
	cr_expect_eq(g->n_ops, 1);
	cr_expect_eq(g->n_tensors, 3);
	cr_expect_eq(g->stages[0].layer_begin, 0);
	cr_expect_eq(g->stages[0].layer_end, 1);
	cr_expect_eq(g->stages[1].layer_begin, 1);
	cr_expect_eq(g->stages[1].layer_end, 2);
	cr_expect_eq(g->layers[0].tensor_end, 2);
	cr_expect_eq(g->layers[1].tensor_begin, 2);
	cr_expect_eq(g->layers[1].op_begin, 1);
	cr_expect_eq(g->layers[1].stage, 1);
	cr_expect_eq(g->tensors[0].producer, 0);
	cr_expect_eq(g->tensors[1].producer, 0);
	cr_expect_eq(g->tensors[2].producer, -1);
	cr_expect_eq(g->tensors[1].alias, 0);
	cr_expect_eq(g->tensors[2].layer, 1);
	cr_expect_eq(g->ops[0].outputs[0], 0);
	cr_expect_str_eq(g->tensors[2].name, "z");
	kiln_arena_free(a);
}

/* Misuse poisons the builder: later calls fail and finish returns NULL
 * (and frees the builder; ASan checks that). */
Test(ir_builder, misuse_fails)
{
	kt_model tm;
	tm_init(&tm);
	kiln_arena *a = kiln_arena_new();
	kiln_ir_builder *b = kiln_ir_builder_new(a, &tm.m);
	cr_expect_eq(kiln_ir_builder_layer(b, KILN_LAYER_DENSE, 0, 0, 0), -1);
	cr_expect_eq(kiln_ir_builder_stage(b), -1);
	cr_expect_null(kiln_ir_builder_finish(b));

	b = kiln_ir_builder_new(a, &tm.m);
	cr_expect_eq(kiln_ir_builder_stage(b), 0);
	cr_expect_eq(kiln_ir_builder_tensor(b, "t", (kiln_lin){1, 0}, 0, -1), -1);
	cr_expect_null(kiln_ir_builder_finish(b));

	/* More stages than pp. */
	b = kiln_ir_builder_new(a, &tm.m);
	cr_expect_eq(kiln_ir_builder_stage(b), 0);
	cr_expect_eq(kiln_ir_builder_stage(b), 0);
	cr_expect_eq(kiln_ir_builder_stage(b), -1);
	cr_expect_null(kiln_ir_builder_finish(b));

	cr_expect_null(kiln_ir_builder_finish(NULL));
	cr_expect_null(kiln_ir_builder_new(NULL, &tm.m));
	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- verify */

/* A copy of g whose arrays (and every op's input/output lists) can be
 * changed without touching g. */
static kiln_ir_graph *clone(const kiln_ir_graph *g, kiln_arena *a)
{
	kiln_ir_graph *c = kiln_arena_alloc(a, sizeof(*c));
	*c = *g;
	c->stages = kiln_arena_alloc(a, sizeof(*c->stages) * (size_t)g->n_stages);
	memcpy(c->stages, g->stages, sizeof(*c->stages) * (size_t)g->n_stages);
	c->layers = kiln_arena_alloc(a, sizeof(*c->layers) * (size_t)g->n_layers);
	memcpy(c->layers, g->layers, sizeof(*c->layers) * (size_t)g->n_layers);
	c->ops = kiln_arena_alloc(a, sizeof(*c->ops) * (size_t)g->n_ops);
	memcpy(c->ops, g->ops, sizeof(*c->ops) * (size_t)g->n_ops);
	c->tensors = kiln_arena_alloc(a, sizeof(*c->tensors) * (size_t)g->n_tensors);
	memcpy(c->tensors, g->tensors, sizeof(*c->tensors) * (size_t)g->n_tensors);
	for (int32_t o = 0; o < g->n_ops; o++) {
		kiln_ir_op *op = &c->ops[o];
		int32_t *in = kiln_arena_alloc(a, sizeof(int32_t) * ((size_t)op->n_inputs + 1));
		int32_t *out = kiln_arena_alloc(a, sizeof(int32_t) * ((size_t)op->n_outputs + 2));
		if (op->n_inputs)
			memcpy(in, op->inputs, sizeof(int32_t) * (size_t)op->n_inputs);
		if (op->n_outputs)
			memcpy(out, op->outputs, sizeof(int32_t) * (size_t)op->n_outputs);
		op->inputs = in;
		op->outputs = out;
	}
	return c;
}

static int32_t find_op(const kiln_ir_graph *g, const char *name)
{
	for (int32_t o = 0; o < g->n_ops; o++)
		if (!strcmp(g->ops[o].name, name))
			return o;
	cr_assert_fail("no op %s", name);
	return -1;
}

static int32_t find_tensor(const kiln_ir_graph *g, const char *name)
{
	for (int32_t t = 0; t < g->n_tensors; t++)
		if (!strcmp(g->tensors[t].name, name))
			return t;
	cr_assert_fail("no tensor %s", name);
	return -1;
}

/* Runs the verifier on c, expecting failure with a message containing want. */
static void expect_violation(const kiln_ir_graph *c, const char *want)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *err = open_memstream(&buf, &len);
	cr_assert_not_null(err);
	int rc = kiln_ir_graph_verify(c, err);
	fclose(err);
	cr_expect_eq(rc, -1, "expected a violation mentioning '%s'", want);
	cr_expect(strstr(buf, want) != NULL, "message '%s' lacks '%s'", buf, want);
	cr_expect(len > 0 && !strncmp(buf, "verify: ", 8));
	free(buf);
}

Test(ir_verify, lowered_graphs_pass)
{
	kt_model tm;
	tm_init(&tm);
	kiln_arena *a = kiln_arena_new();
	kiln_ir_graph *g = lower_ok(&tm.m, a);
	cr_expect_eq(kiln_ir_graph_verify(g, stderr), 0);
	cr_expect_eq(kiln_ir_graph_verify(g, NULL), 0);
	cr_expect_eq(kiln_ir_graph_verify(NULL, NULL), -1);
	kiln_arena_free(a);
}

Test(ir_verify, corruptions_are_reported)
{
	kt_model tm;
	tm_init(&tm);
	kiln_arena *a = kiln_arena_new();
	const kiln_ir_graph *g = lower_ok(&tm.m, a);
	kiln_ir_graph *c;

	/* An input index outside the graph. */
	c = clone(g, a);
	c->ops[find_op(c, "ln1")].inputs[0] = c->n_tensors + 5;
	expect_violation(c, "is not a tensor of its layer");

	/* A saved flag on a tensor no backward op reads. */
	c = clone(g, a);
	c->tensors[find_tensor(c, "attn.proj")].flags |= KILN_T_SAVED;
	expect_violation(c, "saved but no backward op reads it");

	/* A backward op reading an unsaved tensor. */
	c = clone(g, a);
	c->tensors[find_tensor(c, "attn.q")].flags &= ~(uint32_t)KILN_T_SAVED;
	expect_violation(c, "is not saved");

	/* An alias to a later tensor. */
	c = clone(g, a);
	int32_t t = find_tensor(c, "attn.qkv_in");
	c->tensors[t].alias = t + 1;
	expect_violation(c, "is not an earlier tensor");

	/* An alias of a different size. */
	c = clone(g, a);
	c->tensors[find_tensor(c, "attn.softmax")].alias = find_tensor(c, "attn.qkv_in");
	expect_violation(c, "different size");

	/* A second producer. */
	c = clone(g, a);
	kiln_ir_op *op = &c->ops[find_op(c, "attn.qkv_proj")];
	op->outputs[op->n_outputs++] = find_tensor(c, "attn.qkv_in");
	expect_violation(c, "2 producer ops");

	/* Stage ranges that do not partition the layers. */
	c = clone(g, a);
	c->stages[0].layer_end--;
	expect_violation(c, "partition");

	/* A model layer twice (and so another missing). */
	c = clone(g, a);
	c->layers[2].index = c->layers[1].index;
	expect_violation(c, "appears twice");

	/* Backward ops out of reverse order. */
	c = clone(g, a);
	int32_t b1 = find_op(c, "ln1.bwd");
	c->ops[b1].forward = find_op(c, "attn.qkv_proj");
	expect_violation(c, "reverse forward order");

	/* A dense layer where the model wants MoE. */
	c = clone(g, a);
	for (int32_t l = 0; l < c->n_layers; l++)
		if (c->layers[l].kind == KILN_LAYER_MOE) {
			c->layers[l].kind = KILN_LAYER_DENSE;
			break;
		}
	expect_violation(c, "should be moe");

	/* Op ranges of layers overlapping. */
	c = clone(g, a);
	c->layers[1].op_begin--;
	expect_violation(c, "not contiguous");

	/* A consumer before its producer. */
	c = clone(g, a);
	int32_t ln1 = find_op(c, "ln1");
	c->ops[ln1].inputs[0] = find_tensor(c, "attn.qkv_in");
	expect_violation(c, "not produced before it");

	/* Communication on a compute op. */
	c = clone(g, a);
	c->ops[find_op(c, "attn.qkv_proj")].comm_bytes.base = 1;
	expect_violation(c, "communication on a compute op");

	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- print */

static char *print_to_string(const kiln_ir_graph *g)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	kiln_ir_graph_print(g, f);
	fclose(f);
	return buf;
}

Test(ir_print, lines_and_stability)
{
	kt_model tm;
	tm_init(&tm);
	kiln_arena *a = kiln_arena_new();
	const kiln_ir_graph *g = lower_ok(&tm.m, a);
	char *s1 = print_to_string(g), *s2 = print_to_string(g);
	cr_expect_str_eq(s1, s2);
	size_t lines = 0;
	for (const char *p = s1; *p; p++)
		lines += *p == '\n';
	/* One header line, then one per stage, layer, tensor and op. */
	cr_expect_eq(lines, 1 + (size_t)(g->n_stages + g->n_layers + g->n_tensors + g->n_ops));
	cr_expect(strstr(s1, "graph ir-test stages 2 layers 5 ") == s1);
	cr_expect(strstr(s1, "\nstage 1 layers [3, 5)\n") != NULL);
	/* Expert tensors print as base + per_n*N: 2 bytes * h = 128 per row. */
	cr_expect(strstr(s1, " moe.expert_in bytes 0 + 128*N saved expert\n") != NULL);
	cr_expect(strstr(s1, " attn.dropout_mask bytes ") != NULL);
	cr_expect(strstr(s1, " fwd moe.dispatch kind dispatch class comm_ep flops 0 + 0*N "
	                     "traffic 0 + 0*N comm all_to_all group 2 bytes 0 + 128*N in "
	                     "(moe.permuted) out (moe.expert_in)\n") != NULL);
	cr_expect(strstr(s1, " bwd ln1.bwd kind norm class mem of ") != NULL);
	free(s1);
	free(s2);
	kiln_arena_free(a);
}
