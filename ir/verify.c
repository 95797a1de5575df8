/* ir/verify.c: the graph's invariants, checked between passes.
 *
 * Every violation is one line on err ("verify: WHERE: WHAT"); checking goes on
 * after a violation where the structure still allows it, so a broken pass
 * shows all its mistakes at once. Once the index ranges are found broken, the
 * checks that would follow bad indices are skipped.
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

typedef struct checker {
	const kiln_ir_graph *g;
	FILE *err;
	int violations;
} checker;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
bad(checker *c, const char *fmt, ...)
{
	c->violations++;
	if (!c->err)
		return;
	va_list ap;
	va_start(ap, fmt);
	fputs("verify: ", c->err);
	vfprintf(c->err, fmt, ap);
	fputc('\n', c->err);
	va_end(ap);
}

static const char *op_name(const kiln_ir_op *op)
{
	return op->name ? op->name : "(null)";
}

static bool linf_ok(kiln_linf v)
{
	return isfinite(v.base) && isfinite(v.per_n) && v.base >= 0 && v.per_n >= 0;
}

/* Stages and layers: ranges tile their arrays in order. Returns false when
 * the ranges are unusable for the checks that follow. */
static bool check_ranges(checker *c)
{
	const kiln_ir_graph *g = c->g;
	bool ok = true;
	if (g->n_stages != g->model->pp)
		bad(c, "graph has %d stages, the model has pp = %lld", (int)g->n_stages,
		    (long long)g->model->pp);
	int32_t next = 0;
	for (int32_t s = 0; s < g->n_stages; s++) {
		const kiln_ir_stage *st = &g->stages[s];
		if (st->index != s)
			bad(c, "stage %d: index is %d", (int)s, (int)st->index);
		if (st->layer_begin != next || st->layer_end < st->layer_begin ||
		    st->layer_end > g->n_layers) {
			bad(c, "stage %d: layers [%d, %d) do not continue the partition at %d",
			    (int)s, (int)st->layer_begin, (int)st->layer_end, (int)next);
			ok = false;
			break;
		}
		next = st->layer_end;
	}
	if (ok && next != g->n_layers) {
		bad(c, "stages cover layers [0, %d) of %d", (int)next, (int)g->n_layers);
		ok = false;
	}
	int32_t next_op = 0, next_t = 0;
	for (int32_t l = 0; l < g->n_layers; l++) {
		const kiln_ir_layer *ly = &g->layers[l];
		if (ly->op_begin != next_op || ly->op_end < ly->op_begin || ly->op_end > g->n_ops) {
			bad(c, "layer %d: ops [%d, %d) are not contiguous after op %d", (int)l,
			    (int)ly->op_begin, (int)ly->op_end, (int)next_op);
			return false;
		}
		if (ly->tensor_begin != next_t || ly->tensor_end < ly->tensor_begin ||
		    ly->tensor_end > g->n_tensors) {
			bad(c, "layer %d: tensors [%d, %d) are not contiguous after tensor %d",
			    (int)l, (int)ly->tensor_begin, (int)ly->tensor_end, (int)next_t);
			return false;
		}
		next_op = ly->op_end;
		next_t = ly->tensor_end;
	}
	if (next_op != g->n_ops) {
		bad(c, "layers cover ops [0, %d) of %d", (int)next_op, (int)g->n_ops);
		ok = false;
	}
	if (next_t != g->n_tensors) {
		bad(c, "layers cover tensors [0, %d) of %d", (int)next_t, (int)g->n_tensors);
		ok = false;
	}
	return ok;
}

/* Model chunk that holds model layer i, or -1. */
static int64_t chunk_of(const kiln_model *m, int64_t i)
{
	int64_t begin = 0;
	for (size_t c = 0; c < m->n_stage_layers; c++) {
		int64_t end = begin + m->stage_layers[c];
		if (i >= begin && i < end)
			return (int64_t)c;
		begin = end;
	}
	return -1;
}

/* Layer kinds, model indices, stages, chunks and execution order. */
static void check_layers(checker *c)
{
	const kiln_ir_graph *g = c->g;
	const kiln_model *m = g->model;
	int64_t total = 0;
	for (size_t i = 0; i < m->n_stage_layers; i++)
		total += m->stage_layers[i];
	if ((int64_t)m->n_stage_layers != m->pp * m->vpp || total != m->layers)
		bad(c, "model: %zu chunks of %lld layers in all, expected %lld chunks of %lld",
		    m->n_stage_layers, (long long)total, (long long)(m->pp * m->vpp),
		    (long long)m->layers);
	unsigned char *seen = calloc(m->layers > 0 ? (size_t)m->layers : 1, 1);
	if (!seen) {
		bad(c, "out of memory while checking layer indices");
		return;
	}
	int embeds = 0, heads = 0;
	for (int32_t s = 0; s < g->n_stages; s++) {
		const kiln_ir_stage *st = &g->stages[s];
		int64_t prev_key = -1;
		for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
			const kiln_ir_layer *ly = &g->layers[l];
			if (ly->stage != s)
				bad(c, "layer %d: stage is %d, but it lies in stage %d", (int)l,
				    (int)ly->stage, (int)s);
			if (ly->chunk < 0 || ly->chunk >= m->vpp)
				bad(c, "layer %d: chunk %d outside [0, %lld)", (int)l,
				    (int)ly->chunk, (long long)m->vpp);
			switch (ly->kind) {
			case KILN_LAYER_EMBED:
				embeds++;
				if (s != 0 || l != st->layer_begin || ly->index != -1)
					bad(c,
					    "layer %d: the embedding must be the first layer of "
					    "stage 0 with index -1",
					    (int)l);
				break;
			case KILN_LAYER_HEAD:
				heads++;
				if (s != g->n_stages - 1 || l != st->layer_end - 1 ||
				    ly->index != -1)
					bad(c,
					    "layer %d: the head must be the last layer of the last "
					    "stage with index -1",
					    (int)l);
				break;
			case KILN_LAYER_DENSE:
			case KILN_LAYER_MOE: {
				int64_t i = ly->index;
				if (i < 0 || i >= m->layers) {
					bad(c, "layer %d: model index %lld outside [0, %lld)",
					    (int)l, (long long)i, (long long)m->layers);
					break;
				}
				if (seen[i])
					bad(c, "layer %d: model layer %lld appears twice", (int)l,
					    (long long)i);
				seen[i] = 1;
				bool dense = !m->moe || i < m->dense_layers;
				if (dense != (ly->kind == KILN_LAYER_DENSE))
					bad(c, "layer %d: model layer %lld should be %s", (int)l,
					    (long long)i, dense ? "dense" : "moe");
				int64_t ch = chunk_of(m, i);
				if (ch >= 0 && (ly->stage != ch % m->pp || ly->chunk != ch / m->pp))
					bad(c,
					    "layer %d: model layer %lld belongs to chunk %lld on "
					    "stage "
					    "%lld",
					    (int)l, (long long)i, (long long)ch,
					    (long long)(ch % m->pp));
				int64_t key = (int64_t)ly->chunk * (m->layers + 1) + i;
				if (key <= prev_key)
					bad(c,
					    "layer %d: model layer %lld is out of execution order",
					    (int)l, (long long)i);
				prev_key = key;
				break;
			}
			default:
				bad(c, "layer %d: unknown kind %d", (int)l, (int)ly->kind);
				break;
			}
			bool wants_n = ly->kind == KILN_LAYER_MOE;
			if (!(ly->n_balanced >= 0) || !isfinite(ly->n_balanced) ||
			    (wants_n != (ly->n_balanced > 0)))
				bad(c, "layer %d: n_balanced %g does not fit a %s layer", (int)l,
				    ly->n_balanced, kiln_ir_layer_kind_name(ly->kind));
		}
	}
	for (int64_t i = 0; i < m->layers; i++)
		if (!seen[i])
			bad(c, "model layer %lld is missing from the graph", (long long)i);
	free(seen);
	if (embeds != 1)
		bad(c, "graph has %d embedding layers, expected 1", embeds);
	if (heads != 1)
		bad(c, "graph has %d head layers, expected 1", heads);
}

static bool tensor_in_layer(const kiln_ir_graph *g, int32_t t, int32_t l)
{
	return t >= g->layers[l].tensor_begin && t < g->layers[l].tensor_end;
}

static void check_tensors(checker *c, int32_t l)
{
	const kiln_ir_graph *g = c->g;
	const kiln_ir_layer *ly = &g->layers[l];
	for (int32_t t = ly->tensor_begin; t < ly->tensor_end; t++) {
		const kiln_ir_tensor *tn = &g->tensors[t];
		if (!tn->name) {
			bad(c, "tensor %d: no name", (int)t);
			continue;
		}
		if (tn->layer != l)
			bad(c, "tensor %d '%s': layer is %d, but it lies in layer %d", (int)t,
			    tn->name, (int)tn->layer, (int)l);
		for (int32_t u = ly->tensor_begin; u < t; u++)
			if (g->tensors[u].name && !strcmp(g->tensors[u].name, tn->name))
				bad(c, "tensor %d '%s': name repeats tensor %d", (int)t, tn->name,
				    (int)u);
		if (tn->alias != -1) {
			if (tn->alias < ly->tensor_begin || tn->alias >= t)
				bad(c,
				    "tensor %d '%s': alias %d is not an earlier tensor of its "
				    "layer",
				    (int)t, tn->name, (int)tn->alias);
			else if (g->tensors[tn->alias].bytes.base != tn->bytes.base ||
			         g->tensors[tn->alias].bytes.per_n != tn->bytes.per_n)
				bad(c, "tensor %d '%s': alias %d has a different size", (int)t,
				    tn->name, (int)tn->alias);
		}
		if (tn->bytes.per_n > 0 && !(tn->flags & KILN_T_EXPERT))
			bad(c, "tensor %d '%s': size depends on N but it is not marked expert",
			    (int)t, tn->name);
		if ((tn->flags & KILN_T_EXPERT) && ly->kind != KILN_LAYER_MOE)
			bad(c, "tensor %d '%s': expert tensor outside a moe layer", (int)t,
			    tn->name);
	}
}

/* One layer's ops: order, pairing, indices, producers and consumers. counts
 * and used are per-tensor scratch (zeroed by the caller). */
static void check_ops(checker *c, int32_t l, int32_t *producers, unsigned char *used)
{
	const kiln_ir_graph *g = c->g;
	const kiln_ir_layer *ly = &g->layers[l];
	int32_t n_fwd = 0;
	while (ly->op_begin + n_fwd < ly->op_end && !g->ops[ly->op_begin + n_fwd].backward)
		n_fwd++;
	int32_t n_bwd = ly->op_end - ly->op_begin - n_fwd;
	if (n_bwd != n_fwd)
		bad(c,
		    "layer %d: %d forward ops but %d backward ops (backward must follow all "
		    "forward ops, one each)",
		    (int)l, (int)n_fwd, (int)n_bwd);
	for (int32_t o = ly->op_begin; o < ly->op_end; o++) {
		const kiln_ir_op *op = &g->ops[o];
		const char *name = op_name(op);
		if (!op->name)
			bad(c, "op %d: no name", (int)o);
		else
			for (int32_t p = ly->op_begin; p < o; p++)
				if (g->ops[p].name && !strcmp(g->ops[p].name, op->name))
					bad(c, "op %d '%s': name repeats op %d", (int)o, name,
					    (int)p);
		if (op->layer != l)
			bad(c, "op %d '%s': layer is %d, but it lies in layer %d", (int)o, name,
			    (int)op->layer, (int)l);
		if ((unsigned)op->kind >= KILN_OP_COUNT) {
			bad(c, "op %d '%s': unknown kind %d", (int)o, name, (int)op->kind);
			continue;
		}
		int32_t j = o - ly->op_begin;
		if (!op->backward) {
			if (j >= n_fwd)
				bad(c, "op %d '%s': forward op after backward ops", (int)o, name);
			if (op->forward != -1)
				bad(c, "op %d '%s': a forward op has forward = %d", (int)o, name,
				    (int)op->forward);
		} else {
			int32_t want = ly->op_begin + (n_fwd - 1 - (j - n_fwd));
			if (j < n_fwd || want < ly->op_begin || op->forward != want)
				bad(c,
				    "op %d '%s': backward op pairs with op %d, expected op %d "
				    "(reverse forward order)",
				    (int)o, name, (int)op->forward, (int)want);
			else if (g->ops[want].kind != op->kind)
				bad(c, "op %d '%s': kind differs from its forward op", (int)o,
				    name);
			if (op->params_local || op->params_global)
				bad(c, "op %d '%s': a backward op carries parameters", (int)o,
				    name);
			if (op->n_outputs != 0)
				bad(c, "op %d '%s': a backward op lists outputs", (int)o, name);
		}
		if (op->params_local > op->params_global)
			bad(c, "op %d '%s': more local than global parameters", (int)o, name);
		if (!linf_ok(op->flops) || !linf_ok(op->traffic) || !linf_ok(op->comm_bytes))
			bad(c, "op %d '%s': negative or non-finite cost", (int)o, name);
		kiln_op_class cls = kiln_ir_op_kind_class(op->kind);
		bool comm = cls == KILN_OPCLASS_COMM_TP || cls == KILN_OPCLASS_COMM_EP ||
		            cls == KILN_OPCLASS_COMM_PP;
		if (comm && op->comm_group < 1)
			bad(c, "op %d '%s': comm group %d", (int)o, name, (int)op->comm_group);
		if (!comm && (op->comm_bytes.base != 0 || op->comm_bytes.per_n != 0 ||
		              op->collective != KILN_COLL_NONE))
			bad(c, "op %d '%s': communication on a compute op", (int)o, name);
		if (op->n_inputs < 0 || op->n_outputs < 0 || (op->n_inputs > 0 && !op->inputs) ||
		    (op->n_outputs > 0 && !op->outputs)) {
			bad(c, "op %d '%s': malformed input or output list", (int)o, name);
			continue;
		}
		for (int32_t i = 0; i < op->n_inputs; i++) {
			int32_t t = op->inputs[i];
			if (!tensor_in_layer(g, t, l)) {
				bad(c,
				    "op %d '%s': input %d (tensor %d) is not a tensor of its layer",
				    (int)o, name, (int)i, (int)t);
				continue;
			}
			const kiln_ir_tensor *tn = &g->tensors[t];
			if (op->backward) {
				if (!(tn->flags & KILN_T_SAVED))
					bad(c, "op %d '%s': backward input '%s' is not saved",
					    (int)o, name, tn->name);
				used[t - g->layers[l].tensor_begin] = 1;
			} else if (tn->producer < 0 || tn->producer >= o) {
				bad(c, "op %d '%s': input '%s' is not produced before it", (int)o,
				    name, tn->name);
			}
		}
		for (int32_t i = 0; i < op->n_outputs; i++) {
			int32_t t = op->outputs[i];
			if (!tensor_in_layer(g, t, l)) {
				bad(c,
				    "op %d '%s': output %d (tensor %d) is not a tensor of its "
				    "layer",
				    (int)o, name, (int)i, (int)t);
				continue;
			}
			if (!op->backward)
				producers[t - g->layers[l].tensor_begin]++;
		}
	}
	for (int32_t t = ly->tensor_begin; t < ly->tensor_end; t++) {
		const kiln_ir_tensor *tn = &g->tensors[t];
		const char *name = tn->name ? tn->name : "(null)";
		int32_t k = t - ly->tensor_begin;
		if (producers[k] != 1)
			bad(c, "tensor %d '%s': %d producer ops, expected exactly 1", (int)t, name,
			    (int)producers[k]);
		else if (tn->producer < ly->op_begin || tn->producer >= ly->op_end ||
		         g->ops[tn->producer].backward)
			bad(c, "tensor %d '%s': producer %d is not a forward op of its layer",
			    (int)t, name, (int)tn->producer);
		else {
			const kiln_ir_op *p = &g->ops[tn->producer];
			bool lists = false;
			for (int32_t i = 0; i < p->n_outputs; i++)
				lists = lists || p->outputs[i] == t;
			if (!lists)
				bad(c, "tensor %d '%s': producer op %d does not list it", (int)t,
				    name, (int)tn->producer);
		}
		if ((tn->flags & KILN_T_SAVED) && !used[k])
			bad(c, "tensor %d '%s': saved but no backward op reads it", (int)t, name);
	}
}

int kiln_ir_graph_verify(const kiln_ir_graph *g, FILE *err)
{
	checker c = {g, err, 0};
	if (!g || !g->model) {
		bad(&c, "no graph or no model");
		return -1;
	}
	if (g->n_stages < 0 || g->n_layers < 0 || g->n_ops < 0 || g->n_tensors < 0 ||
	    (g->n_stages && !g->stages) || (g->n_layers && !g->layers) || (g->n_ops && !g->ops) ||
	    (g->n_tensors && !g->tensors)) {
		bad(&c, "malformed array counts");
		return -1;
	}
	if (!check_ranges(&c))
		return -1;
	check_layers(&c);
	int32_t max_t = 0;
	for (int32_t l = 0; l < g->n_layers; l++) {
		int32_t n = g->layers[l].tensor_end - g->layers[l].tensor_begin;
		if (n > max_t)
			max_t = n;
	}
	int32_t *producers = calloc((size_t)max_t + 1, sizeof(*producers));
	unsigned char *used = calloc((size_t)max_t + 1, 1);
	if (!producers || !used) {
		free(producers);
		free(used);
		bad(&c, "out of memory while checking ops");
		return -1;
	}
	for (int32_t l = 0; l < g->n_layers; l++) {
		size_t n = (size_t)(g->layers[l].tensor_end - g->layers[l].tensor_begin);
		memset(producers, 0, n * sizeof(*producers));
		memset(used, 0, n);
		check_tensors(&c, l);
		check_ops(&c, l, producers, used);
	}
	free(producers);
	free(used);
	return c.violations ? -1 : 0;
}
