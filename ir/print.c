/* ir/print.c: the graph as text, one line per stage, layer, tensor and op.
 *
 * The format is a golden-file target: change it only on purpose. Numbers are
 * printed as exact integers where they are integers ("%.17g"), sizes that
 * depend on the expert load as "BASE + PER_N*N".
 */
#include <inttypes.h>

#include "ir/ir.h"

static const char *class_name(kiln_op_class c)
{
	switch (c) {
	case KILN_OPCLASS_GEMM:
		return "gemm";
	case KILN_OPCLASS_MEM:
		return "mem";
	case KILN_OPCLASS_ATTN:
		return "attn";
	case KILN_OPCLASS_COMM_TP:
		return "comm_tp";
	case KILN_OPCLASS_COMM_EP:
		return "comm_ep";
	case KILN_OPCLASS_COMM_PP:
		return "comm_pp";
	}
	return "?";
}

static void print_linf(FILE *out, const char *what, kiln_linf v)
{
	fprintf(out, " %s %.17g + %.17g*N", what, v.base, v.per_n);
}

static void print_list(FILE *out, const kiln_ir_graph *g, const char *what, const int32_t *idx,
                       int32_t n)
{
	fprintf(out, " %s (", what);
	for (int32_t i = 0; i < n; i++) {
		int32_t t = idx[i];
		const char *name =
		    t >= 0 && t < g->n_tensors && g->tensors[t].name ? g->tensors[t].name : "?";
		fprintf(out, "%s%s", i ? " " : "", name);
	}
	fputc(')', out);
}

static void print_tensor(FILE *out, const kiln_ir_graph *g, int32_t t)
{
	const kiln_ir_tensor *tn = &g->tensors[t];
	fprintf(out, "    tensor %d %s bytes %" PRIu64 " + %" PRIu64 "*N", (int)t,
	        tn->name ? tn->name : "?", tn->bytes.base, tn->bytes.per_n);
	if (tn->flags & KILN_T_SAVED)
		fputs(" saved", out);
	if (tn->flags & KILN_T_EXPERT)
		fputs(" expert", out);
	if (tn->flags & KILN_T_MASK)
		fputs(" mask", out);
	if (tn->alias >= 0)
		fprintf(out, " alias %d", (int)tn->alias);
	fputc('\n', out);
}

static void print_op(FILE *out, const kiln_ir_graph *g, int32_t o)
{
	const kiln_ir_op *op = &g->ops[o];
	kiln_op_class cls = kiln_ir_op_kind_class(op->kind);
	fprintf(out, "    op %d %s %s kind %s class %s", (int)o, op->backward ? "bwd" : "fwd",
	        op->name ? op->name : "?", kiln_ir_op_kind_name(op->kind), class_name(cls));
	if (op->backward)
		fprintf(out, " of %d", (int)op->forward);
	print_linf(out, "flops", op->flops);
	print_linf(out, "traffic", op->traffic);
	if (cls == KILN_OPCLASS_COMM_TP || cls == KILN_OPCLASS_COMM_EP ||
	    cls == KILN_OPCLASS_COMM_PP) {
		fprintf(out, " comm %s group %d", kiln_ir_collective_name(op->collective),
		        (int)op->comm_group);
		print_linf(out, "bytes", op->comm_bytes);
	}
	if (op->params_global)
		fprintf(out, " params %" PRIu64 "/%" PRIu64 "%s", op->params_local,
		        op->params_global, op->expert_params ? " expert" : "");
	print_list(out, g, "in", op->inputs, op->n_inputs);
	print_list(out, g, "out", op->outputs, op->n_outputs);
	fputc('\n', out);
}

void kiln_ir_graph_print(const kiln_ir_graph *g, FILE *out)
{
	if (!g || !out)
		return;
	const kiln_model *m = g->model;
	fprintf(out, "graph %s stages %d layers %d ops %d tensors %d\n",
	        m && m->name ? m->name : "?", (int)g->n_stages, (int)g->n_layers, (int)g->n_ops,
	        (int)g->n_tensors);
	for (int32_t s = 0; s < g->n_stages; s++) {
		const kiln_ir_stage *st = &g->stages[s];
		fprintf(out, "stage %d layers [%d, %d)\n", (int)st->index, (int)st->layer_begin,
		        (int)st->layer_end);
		for (int32_t l = st->layer_begin; l < st->layer_end && l < g->n_layers; l++) {
			const kiln_ir_layer *ly = &g->layers[l];
			fprintf(out, "  layer %d %s index %d chunk %d n_balanced %.17g\n", (int)l,
			        kiln_ir_layer_kind_name(ly->kind), (int)ly->index, (int)ly->chunk,
			        ly->n_balanced);
			for (int32_t t = ly->tensor_begin; t < ly->tensor_end && t < g->n_tensors;
			     t++)
				print_tensor(out, g, t);
			for (int32_t o = ly->op_begin; o < ly->op_end && o < g->n_ops; o++)
				print_op(out, g, o);
		}
	}
}
