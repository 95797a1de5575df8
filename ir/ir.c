/* ir/ir.c: op-kind tables (from ops.def) and the graph builder.
 *
 * The builder grows its four arrays with malloc/realloc while a pass adds
 * stages, layers, tensors and ops, then copies them into the arena in
 * kiln_ir_builder_finish and frees its own memory. Names and op input/output
 * lists go to the arena straight away. Once any call fails, the builder is
 * poisoned: every later call fails and finish returns NULL.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

static const char *const op_names[KILN_OP_COUNT] = {
#define X(e, s, c) [KILN_OP_##e] = s,
#include "ops.def"
#undef X
};

static const kiln_op_class op_classes[KILN_OP_COUNT] = {
#define X(e, s, c) [KILN_OP_##e] = KILN_OPCLASS_##c,
#include "ops.def"
#undef X
};

const char *kiln_ir_op_kind_name(kiln_op_kind k)
{
	if ((unsigned)k >= KILN_OP_COUNT)
		return "?";
	return op_names[k];
}

kiln_op_class kiln_ir_op_kind_class(kiln_op_kind k)
{
	if ((unsigned)k >= KILN_OP_COUNT)
		return KILN_OPCLASS_MEM;
	return op_classes[k];
}

const char *kiln_ir_layer_kind_name(kiln_layer_kind k)
{
	switch (k) {
	case KILN_LAYER_EMBED:
		return "embed";
	case KILN_LAYER_DENSE:
		return "dense";
	case KILN_LAYER_MOE:
		return "moe";
	case KILN_LAYER_HEAD:
		return "head";
	}
	return "?";
}

const char *kiln_ir_collective_name(kiln_collective c)
{
	switch (c) {
	case KILN_COLL_NONE:
		return "none";
	case KILN_COLL_ALL_REDUCE:
		return "all_reduce";
	case KILN_COLL_ALL_GATHER:
		return "all_gather";
	case KILN_COLL_REDUCE_SCATTER:
		return "reduce_scatter";
	case KILN_COLL_ALL_TO_ALL:
		return "all_to_all";
	case KILN_COLL_SEND:
		return "send";
	case KILN_COLL_RECV:
		return "recv";
	}
	return "?";
}

uint64_t kiln_model_act_bytes(const kiln_model *m)
{
	return m->dtype == KILN_DTYPE_FP8 ? 1u : m->dtype == KILN_DTYPE_FP32 ? 4u : 2u;
}

/* ---------------------------------------------------------------- builder */

struct kiln_ir_builder {
	kiln_arena *arena;
	const kiln_model *model;
	kiln_ir_stage *stages;
	int32_t n_stages, cap_stages;
	kiln_ir_layer *layers;
	int32_t n_layers, cap_layers;
	kiln_ir_op *ops;
	int32_t n_ops, cap_ops;
	kiln_ir_tensor *tensors;
	int32_t n_tensors, cap_tensors;
	bool failed;
};

/* Makes room for one more element in *arr (n used, *cap allocated). */
static int grow(void **arr, int32_t n, int32_t *cap, size_t elem)
{
	if (n < *cap)
		return 0;
	if (*cap > INT32_MAX / 2)
		return -1;
	int32_t ncap = *cap ? *cap * 2 : 16;
	if ((size_t)ncap > SIZE_MAX / elem)
		return -1;
	void *p = realloc(*arr, (size_t)ncap * elem);
	if (!p)
		return -1;
	*arr = p;
	*cap = ncap;
	return 0;
}

kiln_ir_builder *kiln_ir_builder_new(kiln_arena *a, const kiln_model *m)
{
	if (!a || !m)
		return NULL;
	kiln_ir_builder *b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	b->arena = a;
	b->model = m;
	return b;
}

static int fail(kiln_ir_builder *b)
{
	b->failed = true;
	return -1;
}

int kiln_ir_builder_stage(kiln_ir_builder *b)
{
	if (!b || b->failed)
		return -1;
	if (b->n_stages >= b->model->pp)
		return fail(b);
	if (grow((void **)&b->stages, b->n_stages, &b->cap_stages, sizeof(*b->stages)))
		return fail(b);
	kiln_ir_stage *s = &b->stages[b->n_stages];
	s->index = b->n_stages;
	s->layer_begin = b->n_layers;
	s->layer_end = b->n_layers;
	b->n_stages++;
	return 0;
}

int32_t kiln_ir_builder_layer(kiln_ir_builder *b, kiln_layer_kind kind, int32_t index,
                              int32_t chunk, double n_balanced)
{
	if (!b || b->failed)
		return -1;
	if (b->n_stages == 0)
		return fail(b);
	if (grow((void **)&b->layers, b->n_layers, &b->cap_layers, sizeof(*b->layers)))
		return fail(b);
	int32_t li = b->n_layers++;
	kiln_ir_layer *l = &b->layers[li];
	l->kind = kind;
	l->index = index;
	l->stage = b->n_stages - 1;
	l->chunk = chunk;
	l->op_begin = l->op_end = b->n_ops;
	l->tensor_begin = l->tensor_end = b->n_tensors;
	l->n_balanced = n_balanced;
	b->stages[b->n_stages - 1].layer_end = b->n_layers;
	return li;
}

/* The layer that new tensors and ops go to, or NULL when the current stage
 * has none yet. */
static kiln_ir_layer *current_layer(kiln_ir_builder *b)
{
	if (b->n_stages == 0 || b->n_layers == 0)
		return NULL;
	if (b->stages[b->n_stages - 1].layer_end == b->stages[b->n_stages - 1].layer_begin)
		return NULL;
	return &b->layers[b->n_layers - 1];
}

int32_t kiln_ir_builder_tensor(kiln_ir_builder *b, const char *name, kiln_lin bytes, uint32_t flags,
                               int32_t alias)
{
	if (!b || b->failed)
		return -1;
	kiln_ir_layer *l = current_layer(b);
	if (!l || !name)
		return fail(b);
	if (grow((void **)&b->tensors, b->n_tensors, &b->cap_tensors, sizeof(*b->tensors)))
		return fail(b);
	char *copy = kiln_arena_strdup(b->arena, name);
	if (!copy)
		return fail(b);
	int32_t ti = b->n_tensors++;
	kiln_ir_tensor *t = &b->tensors[ti];
	t->name = copy;
	t->layer = b->n_layers - 1;
	t->producer = -1;
	t->alias = alias;
	t->flags = flags;
	t->bytes = bytes;
	l->tensor_end = b->n_tensors;
	return ti;
}

/* Arena copy of n tensor indices; *out is NULL when n is 0. */
static int copy_indices(kiln_arena *a, const int32_t *src, int32_t n, int32_t **out)
{
	*out = NULL;
	if (n < 0 || (n > 0 && !src))
		return -1;
	if (n == 0)
		return 0;
	int32_t *p = kiln_arena_alloc(a, (size_t)n * sizeof(*p));
	if (!p)
		return -1;
	memcpy(p, src, (size_t)n * sizeof(*p));
	*out = p;
	return 0;
}

int32_t kiln_ir_builder_op(kiln_ir_builder *b, const kiln_ir_op *op)
{
	if (!b || b->failed)
		return -1;
	kiln_ir_layer *l = current_layer(b);
	if (!l || !op || !op->name)
		return fail(b);
	if (grow((void **)&b->ops, b->n_ops, &b->cap_ops, sizeof(*b->ops)))
		return fail(b);
	kiln_ir_op copy = *op;
	copy.layer = b->n_layers - 1;
	copy.name = kiln_arena_strdup(b->arena, op->name);
	if (!copy.name)
		return fail(b);
	if (copy_indices(b->arena, op->inputs, op->n_inputs, &copy.inputs) ||
	    copy_indices(b->arena, op->outputs, op->n_outputs, &copy.outputs))
		return fail(b);
	int32_t oi = b->n_ops++;
	b->ops[oi] = copy;
	l->op_end = b->n_ops;
	/* The first forward op to list a tensor as output is its producer; a
	 * second one is left for the verifier to report. */
	if (!copy.backward) {
		for (int32_t i = 0; i < copy.n_outputs; i++) {
			int32_t t = copy.outputs[i];
			if (t >= 0 && t < b->n_tensors && b->tensors[t].producer < 0)
				b->tensors[t].producer = oi;
		}
	}
	return oi;
}

static void builder_free(kiln_ir_builder *b)
{
	free(b->stages);
	free(b->layers);
	free(b->ops);
	free(b->tensors);
	free(b);
}

/* Arena copy of n elements of size elem, or NULL for n == 0; sets *ok false
 * on exhaustion. */
static void *arena_copy(kiln_arena *a, const void *src, int32_t n, size_t elem, bool *ok)
{
	if (n == 0)
		return NULL;
	void *p = kiln_arena_alloc(a, (size_t)n * elem);
	if (!p) {
		*ok = false;
		return NULL;
	}
	memcpy(p, src, (size_t)n * elem);
	return p;
}

kiln_ir_graph *kiln_ir_builder_finish(kiln_ir_builder *b)
{
	if (!b)
		return NULL;
	kiln_ir_graph *g = NULL;
	if (!b->failed) {
		bool ok = true;
		g = kiln_arena_alloc(b->arena, sizeof(*g));
		if (g) {
			g->model = b->model;
			g->stages =
			    arena_copy(b->arena, b->stages, b->n_stages, sizeof(*b->stages), &ok);
			g->layers =
			    arena_copy(b->arena, b->layers, b->n_layers, sizeof(*b->layers), &ok);
			g->ops = arena_copy(b->arena, b->ops, b->n_ops, sizeof(*b->ops), &ok);
			g->tensors = arena_copy(b->arena, b->tensors, b->n_tensors,
			                        sizeof(*b->tensors), &ok);
			g->n_stages = b->n_stages;
			g->n_layers = b->n_layers;
			g->n_ops = b->n_ops;
			g->n_tensors = b->n_tensors;
			if (!ok)
				g = NULL;
		}
	}
	builder_free(b);
	return g;
}
