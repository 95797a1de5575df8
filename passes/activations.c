/* passes/activations.c: the saved activations ("units") of each layer kind.
 *
 * For every stage and every transformer layer kind on it, the saved tensors
 * of a representative layer become units: one per alias group, with the
 * forward ops a recompute re-runs (its closure), the units that recompute
 * reads (its sources), the scratch it materialises (its workspace) and the
 * flags that restrict its actions. docs/cost-model.md, "Units and options",
 * gives the rules and their reasons.
 */
#include <string.h>

#include "passes/passes.h"

/* Working state over one layer; indices into the arrays are local
 * (tensor - tensor_begin, op - op_begin). Arena-owned scratch. */
typedef struct unit_builder {
	const kiln_ir_graph *g;
	const kiln_ir_layer *ly;
	int32_t nt, no;
	int32_t *unit_of;   /* per local tensor: its alias group's unit, or -1 */
	uint8_t *mark;      /* per local op: in the closure being built */
	int32_t *stack;     /* local ops still to expand */
	uint8_t *is_source; /* per unit: read by the closure being built */
} unit_builder;

/* The alias root of tensor t inside the layer: aliases point to earlier
 * tensors of the same layer (the verifier checks it); a malformed link ends
 * the walk at the tensor that carries it. */
static int32_t alias_root(const unit_builder *b, int32_t t)
{
	for (int32_t steps = 0; steps < b->nt; steps++) {
		int32_t a = b->g->tensors[t].alias;
		if (a < b->ly->tensor_begin || a >= t)
			break;
		t = a;
	}
	return t;
}

/* Pushes the forward op o of the layer onto the closure; returns false when
 * o is not a forward op of this layer (the value cannot be rebuilt here). */
static bool push_op(unit_builder *b, int32_t o, int32_t *sp)
{
	if (o < b->ly->op_begin || o >= b->ly->op_end || b->g->ops[o].backward)
		return false;
	int32_t lo = o - b->ly->op_begin;
	if (!b->mark[lo]) {
		b->mark[lo] = 1;
		b->stack[(*sp)++] = lo;
	}
	return true;
}

/* Fills closure, sources, workspace and flags of unit u. Returns 0 or -1 on
 * exhaustion. */
static int build_unit(unit_builder *b, kiln_unit *units, int32_t n_units, int32_t u, kiln_arena *a)
{
	const kiln_ir_graph *g = b->g;
	const kiln_ir_layer *ly = b->ly;
	kiln_unit *un = &units[u];
	bool missing = false;
	int32_t sp = 0;
	memset(b->mark, 0, (size_t)b->no);
	memset(b->is_source, 0, (size_t)n_units);

	/* Every member of the alias group is rebuilt: each writer of the
	 * buffer is re-run. */
	for (int32_t lt = 0; lt < b->nt; lt++)
		if (b->unit_of[lt] == u &&
		    !push_op(b, g->tensors[ly->tensor_begin + lt].producer, &sp))
			missing = true;
	while (sp > 0) {
		const kiln_ir_op *op = &g->ops[ly->op_begin + b->stack[--sp]];
		for (int32_t i = 0; i < op->n_inputs; i++) {
			int32_t x = op->inputs[i];
			if (x < ly->tensor_begin || x >= ly->tensor_end) {
				missing = true;
				continue;
			}
			int32_t src = b->unit_of[x - ly->tensor_begin];
			if (src >= 0) {
				if (src != u)
					b->is_source[src] = 1;
			} else if (!push_op(b, g->tensors[x].producer, &sp)) {
				missing = true;
			}
		}
	}

	int32_t nc = 0, ns = 0;
	for (int32_t lo = 0; lo < b->no; lo++)
		nc += b->mark[lo];
	for (int32_t s = 0; s < n_units; s++)
		ns += b->is_source[s];
	un->closure = nc ? kiln_arena_alloc(a, (size_t)nc * sizeof(int32_t)) : NULL;
	un->sources = ns ? kiln_arena_alloc(a, (size_t)ns * sizeof(int32_t)) : NULL;
	if ((nc && !un->closure) || (ns && !un->sources))
		return -1;
	for (int32_t s = 0; s < n_units; s++)
		if (b->is_source[s])
			un->sources[un->n_sources++] = s;

	uint32_t flags = un->bytes.per_n > 0 ? KILN_UNIT_EXPERT : 0;
	if (missing)
		flags |= KILN_UNIT_LAYER_INPUT;
	for (int32_t lo = 0; lo < b->no; lo++) {
		if (!b->mark[lo])
			continue;
		int32_t o = ly->op_begin + lo;
		const kiln_ir_op *op = &g->ops[o];
		un->closure[un->n_closure++] = o;
		kiln_op_class cls = kiln_ir_op_kind_class(op->kind);
		/* The layer's input comes from the layer before (INPUT) or from
		 * the previous stage (a pipeline receive): not rebuildable here. */
		if (op->kind == KILN_OP_INPUT || cls == KILN_OPCLASS_COMM_PP)
			flags |= KILN_UNIT_LAYER_INPUT;
		if ((cls == KILN_OPCLASS_COMM_TP || cls == KILN_OPCLASS_COMM_EP) &&
		    op->collective != KILN_COLL_NONE)
			flags |= KILN_UNIT_COLLECTIVE;
		for (int32_t i = 0; i < op->n_outputs; i++) {
			int32_t x = op->outputs[i];
			if (x < ly->tensor_begin || x >= ly->tensor_end)
				continue;
			const kiln_ir_tensor *tn = &g->tensors[x];
			if (tn->flags & KILN_T_MASK)
				flags |= KILN_UNIT_RNG;
			if (b->unit_of[x - ly->tensor_begin] < 0) {
				un->workspace_bytes.base += tn->bytes.base;
				un->workspace_bytes.per_n += tn->bytes.per_n;
			}
		}
	}
	un->flags = flags;
	return 0;
}

/* The unit set of layer kind `kind` on stage s, represented by layer rep.
 * Returns 0 or -1 on exhaustion. */
static int build_set(const kiln_ir_graph *g, int32_t s, int32_t rep, int32_t count, kiln_arena *a,
                     kiln_unit_set *out)
{
	const kiln_ir_layer *ly = &g->layers[rep];
	unit_builder b = {.g = g, .ly = ly};
	b.nt = ly->tensor_end - ly->tensor_begin;
	b.no = ly->op_end - ly->op_begin;
	out->stage = s;
	out->kind = ly->kind;
	out->layer = rep;
	out->n_layers = count;
	out->units = NULL;
	out->n_units = 0;
	if (b.nt <= 0)
		return 0;
	int32_t *root_unit = kiln_arena_alloc(a, (size_t)b.nt * sizeof(int32_t));
	b.unit_of = kiln_arena_alloc(a, (size_t)b.nt * sizeof(int32_t));
	b.mark = kiln_arena_alloc(a, (size_t)(b.no > 0 ? b.no : 1));
	b.stack = kiln_arena_alloc(a, (size_t)(b.no > 0 ? b.no : 1) * sizeof(int32_t));
	if (!root_unit || !b.unit_of || !b.mark || !b.stack)
		return -1;
	int32_t n_units = 0;
	for (int32_t lt = 0; lt < b.nt; lt++)
		root_unit[lt] = -1;
	for (int32_t lt = 0; lt < b.nt; lt++) {
		int32_t t = ly->tensor_begin + lt;
		if (!(g->tensors[t].flags & KILN_T_SAVED))
			continue;
		int32_t r = alias_root(&b, t) - ly->tensor_begin;
		if (root_unit[r] < 0)
			root_unit[r] = n_units++;
	}
	if (n_units == 0)
		return 0;
	kiln_unit *units = kiln_arena_alloc(a, (size_t)n_units * sizeof(*units));
	b.is_source = kiln_arena_alloc(a, (size_t)n_units);
	if (!units || !b.is_source)
		return -1;
	/* Units in tensor order of their first saved member, which names the
	 * unit and gives its producer; the root's bytes count once. */
	for (int32_t lt = 0; lt < b.nt; lt++) {
		int32_t t = ly->tensor_begin + lt;
		int32_t r = alias_root(&b, t);
		int32_t u = root_unit[r - ly->tensor_begin];
		b.unit_of[lt] = u;
		if (u < 0 || !(g->tensors[t].flags & KILN_T_SAVED) || units[u].name)
			continue;
		units[u].name = g->tensors[t].name;
		units[u].tensor = r;
		units[u].bytes = g->tensors[r].bytes;
		units[u].producer = g->tensors[t].producer;
	}
	for (int32_t u = 0; u < n_units; u++)
		if (build_unit(&b, units, n_units, u, a) != 0)
			return -1;
	out->units = units;
	out->n_units = n_units;
	return 0;
}

int32_t kiln_set_of_layer(const kiln_unit_set *sets, int32_t n_sets, const kiln_ir_layer *ly)
{
	for (int32_t i = 0; i < n_sets; i++)
		if (sets[i].stage == ly->stage && sets[i].kind == ly->kind)
			return i;
	return -1;
}

int kiln_pass_activations(const kiln_ir_graph *g, kiln_arena *a, kiln_unit_set **out_sets,
                          int32_t *out_n)
{
	static const kiln_layer_kind kinds[] = {KILN_LAYER_DENSE, KILN_LAYER_MOE};
	*out_sets = NULL;
	*out_n = 0;
	int32_t n = 0;
	for (int32_t s = 0; s < g->n_stages; s++)
		for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
			for (int32_t l = g->stages[s].layer_begin; l < g->stages[s].layer_end; l++)
				if (g->layers[l].kind == kinds[k]) {
					n++;
					break;
				}
	if (n == 0)
		return 0;
	kiln_unit_set *sets = kiln_arena_alloc(a, (size_t)n * sizeof(*sets));
	if (!sets)
		return -1;
	int32_t i = 0;
	for (int32_t s = 0; s < g->n_stages; s++) {
		for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
			int32_t rep = -1, count = 0;
			for (int32_t l = g->stages[s].layer_begin; l < g->stages[s].layer_end;
			     l++) {
				if (g->layers[l].kind != kinds[k])
					continue;
				if (rep < 0)
					rep = l;
				count++;
			}
			if (rep >= 0 && build_set(g, s, rep, count, a, &sets[i++]) != 0)
				return -1;
		}
	}
	*out_sets = sets;
	*out_n = n;
	return 0;
}
