/* codegen/mlir.c: the compilation as MLIR, and the schedule read back.
 *
 * The one file that uses the MLIR C API (DESIGN.md section 4). Everything is
 * an op of the unregistered `kiln` dialect in generic syntax carrying plain
 * builtin attributes (i64, f64, strings, booleans, dense i8 / i32 / f64
 * arrays), so any MLIR 16 tool reads it with --allow-unregistered-dialect and
 * no kiln code. The ops, their attributes and their nesting are the contract
 * in docs/mlir-dialect.md.
 *
 * Doubles are f64 FloatAttrs: MLIR prints a float in short decimal form only
 * when that form parses back to the same bits, and in hexadecimal
 * (0x3FB999999999999A) otherwise, so every value survives the text exactly
 * (tests/test_mlir.c checks it bit for bit).
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mlir-c/BuiltinAttributes.h>
#include <mlir-c/BuiltinTypes.h>
#include <mlir-c/Diagnostics.h>
#include <mlir-c/IR.h>

#include "codegen/codegen.h"
#include "costmodel/costmodel.h"
#include "passes/passes.h"

/* The dialect's version, on the module as kiln.version. Bump it on any change
 * a reader could notice. */
#define KILN_MLIR_VERSION 1

/* Bracket nesting deeper than this is refused before MLIR's recursive-descent
 * parser sees it, so hostile input cannot exhaust the stack (kiln itself
 * emits about 10 levels). */
#define MAX_NESTING 256

/* Attributes of the op being built; kiln.op has the most (18). */
#define MAX_ATTRS 24

#define N_LAYER_KINDS (KILN_LAYER_HEAD + 1)

/* ---------------------------------------------------------------- text */

/* A growing, NUL-terminated buffer the printer appends to. */
typedef struct text_buf {
	char *p;
	size_t len, cap;
	bool oom;
} text_buf;

static void text_append(MlirStringRef s, void *user)
{
	text_buf *b = user;
	if (b->oom || s.length == 0)
		return;
	if (!b->p || s.length >= b->cap - b->len) {
		size_t cap = b->cap ? b->cap : (size_t)1 << 16;
		while (cap - b->len <= s.length) {
			if (cap > SIZE_MAX / 2) {
				b->oom = true;
				return;
			}
			cap *= 2;
		}
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s.data, s.length);
	b->len += s.length;
	b->p[b->len] = '\0';
}

static void file_append(MlirStringRef s, void *user)
{
	fwrite(s.data, 1, s.length, (FILE *)user);
}

static MlirStringRef sref(const char *s)
{
	return s ? mlirStringRefCreate(s, strlen(s)) : mlirStringRefCreate("", 0);
}

/* MLIR hands out empty strings as (NULL, 0); libc wants a pointer. */
static MlirStringRef sref_safe(MlirStringRef s)
{
	return s.data ? s : mlirStringRefCreate("", 0);
}

static bool sref_eq(MlirStringRef s, const char *c)
{
	size_t n = strlen(c);
	return s.length == n && (n == 0 || memcmp(s.data, c, n) == 0);
}

/* ---------------------------------------------------------------- diagnostics */

/* Where messages go (err may be NULL); MLIR's own diagnostics are capped. */
typedef struct diag_sink {
	FILE *err;
	int n_mlir;
} diag_sink;

/* Line and column of a location that prints as loc("NAME":LINE:COL); false
 * for any other location. */
static bool loc_line_col(MlirLocation loc, int *line, int *col)
{
	if (mlirLocationIsNull(loc))
		return false;
	text_buf b = {0};
	mlirLocationPrint(loc, text_append, &b);
	bool ok = false;
	if (b.p && !b.oom) {
		const char *q = strrchr(b.p, '"');
		ok = q && sscanf(q, "\":%d:%d)", line, col) == 2;
	}
	free(b.p);
	return ok;
}

/* One line on err: "LINE:COL: error: MESSAGE", or "error: MESSAGE" when loc
 * is null or has no line. Callers prefix the file name (tools/kilnc.c). */
static void report(diag_sink *d, MlirLocation loc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void report(diag_sink *d, MlirLocation loc, const char *fmt, ...)
{
	if (!d->err)
		return;
	int line, col;
	if (loc_line_col(loc, &line, &col))
		fprintf(d->err, "%d:%d: error: ", line, col);
	else
		fputs("error: ", d->err);
	va_list ap;
	va_start(ap, fmt);
	vfprintf(d->err, fmt, ap);
	va_end(ap);
	fputc('\n', d->err);
}

static MlirLogicalResult on_diagnostic(MlirDiagnostic diag, void *user)
{
	diag_sink *d = user;
	if (d->err && d->n_mlir++ < 8) {
		MlirDiagnosticSeverity s = mlirDiagnosticGetSeverity(diag);
		const char *sev = s == MlirDiagnosticError     ? "error"
		                  : s == MlirDiagnosticWarning ? "warning"
		                                               : "note";
		int line, col;
		if (loc_line_col(mlirDiagnosticGetLocation(diag), &line, &col))
			fprintf(d->err, "%d:%d: %s: ", line, col, sev);
		else
			fprintf(d->err, "%s: ", sev);
		mlirDiagnosticPrint(diag, file_append, d->err);
		fputc('\n', d->err);
	}
	return mlirLogicalResultSuccess();
}

/* A context for kiln's dialect: unregistered ops allowed, one thread (the
 * work is small and the compiler is single-threaded), diagnostics to d. */
static MlirContext context_new(diag_sink *d)
{
	MlirContext ctx = mlirContextCreate();
	mlirContextSetAllowUnregisteredDialects(ctx, true);
	mlirContextEnableMultithreading(ctx, false);
	mlirContextAttachDiagnosticHandler(ctx, on_diagnostic, d, NULL);
	return ctx;
}

/* ---------------------------------------------------------------- emit */

typedef struct emitter {
	MlirContext ctx;
	MlirLocation loc;
	MlirType i64, f64;
	MlirNamedAttribute attrs[MAX_ATTRS];
	int n;
} emitter;

static void attr(emitter *e, const char *name, MlirAttribute v)
{
	if (e->n >= MAX_ATTRS)
		abort(); /* a compiler bug: raise MAX_ATTRS */
	e->attrs[e->n++] = mlirNamedAttributeGet(mlirIdentifierGet(e->ctx, sref(name)), v);
}

static void a_i64(emitter *e, const char *name, int64_t v)
{
	attr(e, name, mlirIntegerAttrGet(e->i64, v));
}

/* Byte counts are below 2^63 (the frontend bounds every size). */
static void a_u64(emitter *e, const char *name, uint64_t v)
{
	a_i64(e, name, v > INT64_MAX ? INT64_MAX : (int64_t)v);
}

static void a_f64(emitter *e, const char *name, double v)
{
	attr(e, name, mlirFloatAttrDoubleGet(e->ctx, e->f64, v));
}

static void a_str(emitter *e, const char *name, const char *v)
{
	attr(e, name, mlirStringAttrGet(e->ctx, sref(v)));
}

static void a_bool(emitter *e, const char *name, bool v)
{
	attr(e, name, mlirBoolAttrGet(e->ctx, v));
}

static void a_i32s(emitter *e, const char *name, const int32_t *v, int32_t n)
{
	attr(e, name, mlirDenseI32ArrayGet(e->ctx, n > 0 && v ? n : 0, v));
}

/* Appends op NAME with the pending attributes to parent. With a body, the op
 * gets one region of one block, which is returned; else a null block. */
static MlirBlock emit_op(emitter *e, MlirBlock parent, const char *name, bool body)
{
	MlirOperationState st = mlirOperationStateGet(sref(name), e->loc);
	MlirBlock block = {NULL};
	if (body) {
		MlirRegion r = mlirRegionCreate();
		block = mlirBlockCreate(0, NULL, NULL);
		mlirRegionAppendOwnedBlock(r, block);
		mlirOperationStateAddOwnedRegions(&st, 1, &r);
	}
	mlirOperationStateAddAttributes(&st, e->n, e->attrs);
	e->n = 0;
	mlirBlockAppendOwnedOperation(parent, mlirOperationCreate(&st));
	return block;
}

static void emit_graph(emitter *e, MlirBlock parent, const kiln_compilation *c)
{
	const kiln_ir_graph *g = c->graph;
	const kiln_model *m = c->model;
	a_str(e, "model", m->name);
	a_str(e, "hardware", m->hw.name);
	a_i64(e, "layers", m->layers);
	a_i64(e, "tp", m->tp);
	a_i64(e, "pp", m->pp);
	a_i64(e, "ep", m->ep);
	a_i64(e, "dp", m->dp);
	a_i64(e, "vpp", m->vpp);
	a_i64(e, "micro_batch", m->micro_batch);
	a_i64(e, "seq_len", m->seq_len);
	a_f64(e, "max_factor", m->max_factor);
	MlirBlock gb = emit_op(e, parent, "kiln.graph", true);
	for (int32_t s = 0; s < g->n_stages; s++) {
		const kiln_ir_stage *st = &g->stages[s];
		a_i64(e, "index", st->index);
		MlirBlock sb = emit_op(e, gb, "kiln.stage", true);
		for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
			const kiln_ir_layer *L = &g->layers[l];
			a_i64(e, "id", l);
			a_str(e, "kind", kiln_ir_layer_kind_name(L->kind));
			a_i64(e, "index", L->index);
			a_i64(e, "chunk", L->chunk);
			a_f64(e, "n_balanced", L->n_balanced);
			MlirBlock lb = emit_op(e, sb, "kiln.layer", true);
			for (int32_t i = L->op_begin; i < L->op_end; i++) {
				const kiln_ir_op *op = &g->ops[i];
				a_i64(e, "id", i);
				a_str(e, "name", op->name);
				a_str(e, "kind", kiln_ir_op_kind_name(op->kind));
				a_str(e, "dir", op->backward ? "bwd" : "fwd");
				a_i64(e, "forward", op->forward);
				a_f64(e, "flops_base", op->flops.base);
				a_f64(e, "flops_per_n", op->flops.per_n);
				a_f64(e, "traffic_base", op->traffic.base);
				a_f64(e, "traffic_per_n", op->traffic.per_n);
				a_str(e, "collective", kiln_ir_collective_name(op->collective));
				a_f64(e, "comm_bytes_base", op->comm_bytes.base);
				a_f64(e, "comm_bytes_per_n", op->comm_bytes.per_n);
				a_i64(e, "comm_group", op->comm_group);
				a_u64(e, "params_local", op->params_local);
				a_bool(e, "expert_params", op->expert_params);
				a_i32s(e, "inputs", op->inputs, op->n_inputs);
				a_i32s(e, "outputs", op->outputs, op->n_outputs);
				a_f64(e, "time_us", kiln_cost_op_time_us(g, op, L->n_balanced));
				emit_op(e, lb, "kiln.op", false);
			}
			for (int32_t i = L->tensor_begin; i < L->tensor_end; i++) {
				const kiln_ir_tensor *t = &g->tensors[i];
				a_i64(e, "id", i);
				a_str(e, "name", t->name);
				a_i64(e, "producer", t->producer);
				a_i64(e, "alias", t->alias);
				a_i64(e, "flags", t->flags);
				a_u64(e, "bytes_base", t->bytes.base);
				a_u64(e, "bytes_per_n", t->bytes.per_n);
				emit_op(e, lb, "kiln.tensor", false);
			}
		}
	}
}

static void emit_units(emitter *e, MlirBlock parent, const kiln_compilation *c)
{
	const kiln_ir_graph *g = c->graph;
	for (int32_t i = 0; i < c->n_sets; i++) {
		const kiln_unit_set *set = &c->sets[i];
		double n = g->layers[set->layer].n_balanced;
		a_i64(e, "id", i);
		a_i64(e, "stage", set->stage);
		a_str(e, "kind", kiln_ir_layer_kind_name(set->kind));
		a_i64(e, "layer", set->layer);
		a_i64(e, "n_layers", set->n_layers);
		MlirBlock ub = emit_op(e, parent, "kiln.units", true);
		for (int32_t u = 0; u < set->n_units; u++) {
			const kiln_unit *unit = &set->units[u];
			double recompute_us = 0;
			for (int32_t k = 0; k < unit->n_closure; k++)
				recompute_us +=
				    kiln_cost_op_time_us(g, &g->ops[unit->closure[k]], n);
			a_i64(e, "id", u);
			a_str(e, "name", unit->name);
			a_i64(e, "tensor", unit->tensor);
			a_i64(e, "producer", unit->producer);
			a_u64(e, "bytes_base", unit->bytes.base);
			a_u64(e, "bytes_per_n", unit->bytes.per_n);
			a_u64(e, "workspace_base", unit->workspace_bytes.base);
			a_u64(e, "workspace_per_n", unit->workspace_bytes.per_n);
			a_i32s(e, "sources", unit->sources, unit->n_sources);
			a_i32s(e, "closure", unit->closure, unit->n_closure);
			a_i64(e, "flags", unit->flags);
			a_f64(e, "recompute_us", recompute_us);
			emit_op(e, ub, "kiln.unit", false);
		}
	}
}

static void emit_tables(emitter *e, MlirBlock parent, const kiln_compilation *c)
{
	for (int32_t i = 0; i < c->n_sets; i++) {
		for (int32_t b = 0; b < c->n_buckets; b++) {
			const kiln_plan_table *t = kiln_plan_table_of(c, i, b);
			a_i64(e, "set", i);
			a_i64(e, "bucket", b);
			a_f64(e, "load_factor", t->load_factor);
			a_f64(e, "n", t->n);
			a_i64(e, "frontier_id", t->frontier_id);
			a_u64(e, "quantum_bytes", t->instance.quantum_bytes);
			MlirBlock tb = emit_op(e, parent, "kiln.table", true);
			for (int32_t p = 0; p < t->n_points; p++) {
				a_i64(e, "point", t->point[p]);
				a_f64(e, "saved_bytes", t->bytes[p].saved);
				a_f64(e, "resident_bytes", t->bytes[p].resident);
				a_f64(e, "offloaded_bytes", t->bytes[p].offloaded);
				a_f64(e, "transient_bytes", t->bytes[p].transient);
				a_f64(e, "exposed_us", kiln_plan_table_exposed_us(t, p));
				a_i64(e, "plan", t->plan ? t->plan[p] : -1);
				emit_op(e, tb, "kiln.point", false);
			}
		}
	}
}

static int32_t set_index(const kiln_compilation *c, const kiln_unit_set *set)
{
	for (int32_t i = 0; i < c->n_sets; i++)
		if (&c->sets[i] == set)
			return i;
	return -1;
}

static void emit_pool(emitter *e, MlirBlock parent, const kiln_compilation *c)
{
	const kiln_plan_pool *pool = c->pool;
	a_i64(e, "n_frontiers", pool->n_frontiers);
	MlirBlock pb = emit_op(e, parent, "kiln.pool", true);
	for (int32_t i = 0; i < pool->n; i++) {
		int32_t n_units = pool->set[i] ? pool->set[i]->n_units : 0;
		a_i64(e, "id", i);
		a_i64(e, "set", set_index(c, pool->set[i]));
		attr(e, "actions",
		     mlirDenseI8ArrayGet(e->ctx, n_units, (const int8_t *)pool->actions[i]));
		emit_op(e, pb, "kiln.plan", false);
	}
}

static void emit_budgets(emitter *e, MlirBlock parent, const kiln_compilation *c)
{
	int32_t *pts = malloc(sizeof(int32_t) * (size_t)(c->n_sets > 0 ? c->n_sets : 1));
	for (int32_t s = 0; s < c->graph->n_stages && pts; s++) {
		const kiln_stage_budget *bu = &c->budgets[s];
		int32_t n = 0;
		for (int32_t i = 0; i < c->n_sets; i++)
			if (c->sets[i].stage == bu->stage && bu->steady_point)
				pts[n] = bu->steady_point[n], n++;
		a_i64(e, "stage", bu->stage);
		a_f64(e, "capacity_bytes", bu->capacity_bytes);
		a_f64(e, "static_bytes", bu->static_bytes);
		a_f64(e, "inflight", bu->inflight);
		a_f64(e, "fixed_bytes", bu->fixed_bytes);
		a_f64(e, "steady_bytes", bu->steady_bytes);
		a_f64(e, "steady_exposed_us", bu->steady_exposed_us);
		a_i32s(e, "steady_points", pts, n);
		a_f64(e, "budget_bytes", bu->budget_bytes);
		a_f64(e, "safety_factor", bu->safety_factor);
		a_bool(e, "steady_fits", bu->steady_fits);
		emit_op(e, parent, "kiln.budget", false);
	}
	free(pts);
}

static void emit_baselines(emitter *e, MlirBlock parent, const kiln_compilation *c)
{
	for (int k = 0; k < KILN_BASELINE_COUNT; k++) {
		const kiln_baseline *b = &c->baselines[k];
		a_str(e, "name", b->name);
		a_str(e, "models", b->models);
		a_f64(e, "design_load", b->design_load);
		a_i32s(e, "plans", b->plan, c->n_sets);
		emit_op(e, parent, "kiln.baseline", false);
	}
}

/* Returns 0, or -1 after reporting a schedule kiln could not read back. */
static int emit_schedule(emitter *e, MlirBlock parent, const kiln_plan_schedule *s, diag_sink *d)
{
	MlirLocation none = {NULL};
	a_str(e, "model", s->model);
	MlirBlock sb = emit_op(e, parent, "kiln.schedule", true);
	for (int32_t j = 0; j < s->n_templates; j++) {
		const kiln_template *t = &s->templates[j];
		if ((unsigned)t->kind >= N_LAYER_KINDS) {
			report(d, none, "internal: template %d has layer kind %d", (int)j,
			       (int)t->kind);
			return -1;
		}
		a_i64(e, "id", j);
		a_i64(e, "stage", t->stage);
		a_str(e, "kind", kiln_ir_layer_kind_name(t->kind));
		a_i64(e, "plan", t->plan);
		a_f64(e, "load_factor", t->load_factor);
		a_f64(e, "makespan_us", t->makespan_us);
		a_f64(e, "serial_us", t->serial_us);
		a_f64(e, "base_us", t->base_us);
		MlirBlock tb = emit_op(e, sb, "kiln.template", true);
		for (int32_t i = 0; i < t->n_tasks; i++) {
			const kiln_task *k = &t->tasks[i];
			if ((unsigned)k->kind >= KILN_TASK_KIND_COUNT ||
			    (unsigned)k->stream >= KILN_STREAM_COUNT) {
				report(d, none,
				       "internal: task %d of template %d has kind %d, stream %d",
				       (int)i, (int)j, (int)k->kind, (int)k->stream);
				return -1;
			}
			a_str(e, "name", k->name);
			a_str(e, "kind", kiln_task_kind_name(k->kind));
			a_str(e, "stream", kiln_stream_name(k->stream));
			a_i64(e, "chain", k->chain);
			a_i64(e, "index", k->index);
			a_f64(e, "duration_us", k->duration_us);
			a_f64(e, "start_us", k->start_us);
			a_f64(e, "end_us", k->end_us);
			a_i32s(e, "deps", k->deps, k->n_deps);
			a_f64(e, "mem_bytes", k->mem_bytes);
			emit_op(e, tb, "kiln.task", false);
		}
	}
	for (int32_t i = 0; i < s->n_stages; i++) {
		const kiln_stage_timeline *tl = &s->stages[i];
		a_i64(e, "stage", tl->stage);
		a_i32s(e, "layers", tl->layer, tl->n_layers);
		a_i32s(e, "templates", tl->template_id, tl->n_layers);
		emit_op(e, sb, "kiln.timeline", false);
	}
	return 0;
}

int kiln_mlir_emit(const kiln_compilation *c, FILE *out, FILE *err)
{
	diag_sink d = {.err = err};
	MlirLocation none = {NULL};
	if (!c || !c->graph || !c->model) {
		report(&d, none, "internal: kiln_mlir_emit needs a lowered graph");
		return -1;
	}
	MlirContext ctx = context_new(&d);
	emitter e = {.ctx = ctx, .loc = mlirLocationUnknownGet(ctx)};
	e.i64 = mlirIntegerTypeGet(ctx, 64);
	e.f64 = mlirF64TypeGet(ctx);
	MlirModule mod = mlirModuleCreateEmpty(e.loc);
	MlirOperation mop = mlirModuleGetOperation(mod);
	MlirBlock body = mlirModuleGetBody(mod);
	int rc = 0;

	mlirOperationSetAttributeByName(mop, sref("kiln.version"),
	                                mlirIntegerAttrGet(e.i64, KILN_MLIR_VERSION));
	if (c->buckets)
		mlirOperationSetAttributeByName(
		    mop, sref("kiln.buckets"), mlirDenseF64ArrayGet(ctx, c->n_buckets, c->buckets));
	emit_graph(&e, body, c);
	if (c->sets)
		emit_units(&e, body, c);
	if (c->tables)
		emit_tables(&e, body, c);
	if (c->pool)
		emit_pool(&e, body, c);
	if (c->budgets)
		emit_budgets(&e, body, c);
	if (c->baselines)
		emit_baselines(&e, body, c);
	if (c->schedule)
		rc = emit_schedule(&e, body, c->schedule, &d);

	text_buf buf = {0};
	if (rc == 0) {
		MlirOpPrintingFlags flags = mlirOpPrintingFlagsCreate();
		mlirOpPrintingFlagsPrintGenericOpForm(flags);
		mlirOperationPrintWithFlags(mop, flags, text_append, &buf);
		mlirOpPrintingFlagsDestroy(flags);
		text_append(mlirStringRefCreate("\n", 1), &buf);
		if (buf.oom || !buf.p) {
			report(&d, none, "out of memory printing MLIR");
			rc = -1;
		}
	}
	if (rc == 0) {
		/* The check DESIGN.md 5.5 asks for: what we write must parse. */
		MlirModule back = mlirModuleCreateParse(ctx, mlirStringRefCreate(buf.p, buf.len));
		if (mlirModuleIsNull(back)) {
			report(&d, none, "internal: the emitted MLIR does not parse back");
			rc = -1;
		} else {
			mlirModuleDestroy(back);
		}
	}
	if (rc == 0 && (fwrite(buf.p, 1, buf.len, out) != buf.len || fflush(out) != 0)) {
		report(&d, none, "writing the MLIR failed");
		rc = -1;
	}
	free(buf.p);
	mlirModuleDestroy(mod);
	mlirContextDestroy(ctx);
	return rc;
}

/* ---------------------------------------------------------------- read */

/* When s[*i] opens a string literal or a // comment, moves *i to its last
 * character (counting newlines into *line) and returns true. */
static bool skip_string_or_comment(const char *s, size_t len, size_t *i, size_t *line)
{
	if (s[*i] == '"') {
		for ((*i)++; *i < len && s[*i] != '"'; (*i)++) {
			if (s[*i] == '\\')
				(*i)++;
			else if (s[*i] == '\n')
				(*line)++;
		}
		return true;
	}
	if (s[*i] == '/' && *i + 1 < len && s[*i + 1] == '/') {
		while (*i + 1 < len && s[*i + 1] != '\n')
			(*i)++;
		return true;
	}
	return false;
}

/* The deepest bracket nesting in text, counting ( [ { < outside string
 * literals and comments ("->" closes nothing); stops early past MAX_NESTING
 * and sets *out_line to where. */
static size_t max_nesting(const char *s, size_t len, size_t *out_line)
{
	size_t depth = 0, max = 0, line = 1;
	for (size_t i = 0; i < len; i++) {
		char ch = s[i];
		if (ch == '\n') {
			line++;
		} else if (skip_string_or_comment(s, len, &i, &line)) {
			continue;
		} else if (ch == '(' || ch == '[' || ch == '{' || ch == '<') {
			if (++depth > max && (max = depth) > MAX_NESTING) {
				*out_line = line;
				return max;
			}
		} else if (ch == ')' || ch == ']' || ch == '}' ||
		           (ch == '>' && (i == 0 || s[i - 1] != '-'))) {
			if (depth)
				depth--;
		}
	}
	return max;
}

/* kiln writes a small subset of MLIR's syntax: quoted op names, regions,
 * attribute dictionaries whose values are strings, integers and floats
 * (decimal or hex) with `: i64` / `: f64`, `array<i32: ...>`, true and
 * false, and `: () -> ()`. MLIR's parser recurses on much more (affine
 * maps, dialect attributes, tensor types...), so anything outside that
 * subset is refused before MLIR sees it: a file only kiln could have written
 * cannot exhaust the stack. Returns 0, or -1 with the line of the first
 * stranger in *out_line and the offending word in out_word. */
static bool is_ident_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       ch == '_' || ch == '.' || ch == '$';
}

static int only_kiln_syntax(const char *s, size_t len, size_t *out_line, char *out_word,
                            size_t word_cap)
{
	static const char *const words[] = {"array", "i1",    "i8",   "i16",
	                                    "i32",   "i64",   "f32",  "f64",
	                                    "true",  "false", "unit", "module",
	                                    "builtin.module", "attributes"};
	size_t line = 1;
	for (size_t i = 0; i < len; i++) {
		char ch = s[i];
		if (ch == '\n') {
			line++;
		} else if (skip_string_or_comment(s, len, &i, &line)) {
			continue;
		} else if (ch >= '0' && ch <= '9') {
			/* A number: digits, a hex body, a fraction, an exponent. */
			while (i + 1 < len && (is_ident_char(s[i + 1]) ||
			                       ((s[i + 1] == '+' || s[i + 1] == '-') &&
			                        (s[i] == 'e' || s[i] == 'E'))))
				i++;
		} else if (is_ident_char(ch)) {
			size_t b = i;
			while (i + 1 < len && is_ident_char(s[i + 1]))
				i++;
			size_t n = i - b + 1, j = i + 1;
			while (j < len && (s[j] == ' ' || s[j] == '\t'))
				j++;
			bool ok = j < len && s[j] == '='; /* an attribute name */
			for (size_t w = 0; !ok && w < sizeof words / sizeof words[0]; w++)
				ok = strlen(words[w]) == n && memcmp(words[w], s + b, n) == 0;
			if (!ok) {
				snprintf(out_word, word_cap, "%.*s", (int)(n < 40 ? n : 40), s + b);
				*out_line = line;
				return -1;
			}
		} else if (ch == '^') {
			/* A block label (^bb0:), which generic form prints for empty
			 * blocks. */
			while (i + 1 < len && is_ident_char(s[i + 1]))
				i++;
		} else if (!strchr(" \t\r(){}[]<>=:,-+", ch)) {
			snprintf(out_word, word_cap, "%c", ch);
			*out_line = line;
			return -1;
		}
	}
	return 0;
}

typedef struct reader {
	diag_sink d;
	kiln_arena *a;
} reader;

static MlirStringRef op_name(MlirOperation op)
{
	return sref_safe(mlirIdentifierStr(mlirOperationGetName(op)));
}

static bool is_kiln_op(MlirOperation op)
{
	MlirStringRef n = op_name(op);
	return n.length > 5 && memcmp(n.data, "kiln.", 5) == 0;
}

/* The attribute name of op, or false after reporting it missing. what names
 * the op for messages ("kiln.task 3 of kiln.template 7"). */
static bool get_attr(reader *r, MlirOperation op, const char *what, const char *name,
                     const char *type, MlirAttribute *out)
{
	*out = mlirOperationGetAttributeByName(op, sref(name));
	if (mlirAttributeIsNull(*out)) {
		report(&r->d, mlirOperationGetLocation(op), "%s: missing attribute '%s' (%s)", what,
		       name, type);
		return false;
	}
	return true;
}

static bool mistyped(reader *r, MlirOperation op, const char *what, const char *name,
                     const char *type)
{
	report(&r->d, mlirOperationGetLocation(op), "%s: attribute '%s' must be %s", what, name,
	       type);
	return false;
}

static bool get_i64(reader *r, MlirOperation op, const char *what, const char *name, int64_t lo,
                    int64_t hi, int64_t *out)
{
	MlirAttribute v;
	if (!get_attr(r, op, what, name, "i64", &v))
		return false;
	MlirType t = mlirAttributeGetType(v);
	if (!mlirAttributeIsAInteger(v) || !mlirTypeIsAInteger(t) ||
	    !mlirIntegerTypeIsSignless(t) || mlirIntegerTypeGetWidth(t) != 64)
		return mistyped(r, op, what, name, "an i64 integer");
	*out = mlirIntegerAttrGetValueInt(v);
	if (*out < lo || *out > hi) {
		report(&r->d, mlirOperationGetLocation(op),
		       "%s: attribute '%s' is %lld, outside [%lld, %lld]", what, name,
		       (long long)*out, (long long)lo, (long long)hi);
		return false;
	}
	return true;
}

static bool get_i32(reader *r, MlirOperation op, const char *what, const char *name, int64_t lo,
                    int64_t hi, int32_t *out)
{
	int64_t v;
	if (!get_i64(r, op, what, name, lo, hi, &v))
		return false;
	*out = (int32_t)v;
	return true;
}

/* A finite f64; non-negative too when nonneg. */
static bool get_f64(reader *r, MlirOperation op, const char *what, const char *name, bool nonneg,
                    double *out)
{
	MlirAttribute v;
	if (!get_attr(r, op, what, name, "f64", &v))
		return false;
	if (!mlirAttributeIsAFloat(v) || !mlirTypeIsAF64(mlirAttributeGetType(v)))
		return mistyped(r, op, what, name, "an f64 float");
	*out = mlirFloatAttrGetValueDouble(v);
	if (!isfinite(*out) || (nonneg && *out < 0)) {
		report(&r->d, mlirOperationGetLocation(op),
		       "%s: attribute '%s' is %g, expected a %s", what, name, *out,
		       nonneg ? "finite value >= 0" : "finite value");
		return false;
	}
	return true;
}

/* A string, copied into the arena (NULL on exhaustion, reported). */
static bool get_str(reader *r, MlirOperation op, const char *what, const char *name,
                    const char **out)
{
	MlirAttribute v;
	if (!get_attr(r, op, what, name, "string", &v))
		return false;
	if (!mlirAttributeIsAString(v))
		return mistyped(r, op, what, name, "a string");
	MlirStringRef s = sref_safe(mlirStringAttrGetValue(v));
	if (!(*out = kiln_arena_strndup(r->a, s.data, s.length))) {
		report(&r->d, mlirOperationGetLocation(op), "out of memory");
		return false;
	}
	return true;
}

/* One of names[0..n) given as a string; its index in *out. */
static bool get_enum(reader *r, MlirOperation op, const char *what, const char *name,
                     const char *const *names, int n, int *out)
{
	MlirAttribute v;
	if (!get_attr(r, op, what, name, "string", &v))
		return false;
	if (!mlirAttributeIsAString(v))
		return mistyped(r, op, what, name, "a string");
	MlirStringRef s = sref_safe(mlirStringAttrGetValue(v));
	for (int i = 0; i < n; i++) {
		if (names[i] && sref_eq(s, names[i])) {
			*out = i;
			return true;
		}
	}
	char got[48];
	size_t k = s.length < sizeof got - 1 ? s.length : sizeof got - 1;
	memcpy(got, s.data, k);
	got[k] = '\0';
	for (size_t i = 0; i < k; i++)
		if ((unsigned char)got[i] < 0x20 || (unsigned char)got[i] >= 0x7f)
			got[i] = '?';
	report(&r->d, mlirOperationGetLocation(op),
	       "%s: attribute '%s' is \"%s\", expected one of:", what, name, got);
	if (r->d.err)
		for (int i = 0; i < n; i++)
			if (names[i])
				fprintf(r->d.err, "%s%s", i ? ", " : "  ", names[i]);
	if (r->d.err)
		fputc('\n', r->d.err);
	return false;
}

/* A dense i32 array, copied into the arena; each element in [lo, hi]. */
static bool get_i32s(reader *r, MlirOperation op, const char *what, const char *name, int32_t lo,
                     int32_t hi, int32_t **out, int32_t *out_n)
{
	MlirAttribute v;
	if (!get_attr(r, op, what, name, "array<i32>", &v))
		return false;
	if (!mlirAttributeIsADenseI32Array(v))
		return mistyped(r, op, what, name, "an array<i32: ...>");
	intptr_t n = mlirDenseArrayGetNumElements(v);
	if (n < 0 || n > INT32_MAX / 4) {
		report(&r->d, mlirOperationGetLocation(op), "%s: attribute '%s' is too long", what,
		       name);
		return false;
	}
	*out_n = (int32_t)n;
	*out = NULL;
	if (n == 0)
		return true;
	if (!(*out = kiln_arena_alloc(r->a, sizeof(int32_t) * (size_t)n))) {
		report(&r->d, mlirOperationGetLocation(op), "out of memory");
		return false;
	}
	for (intptr_t i = 0; i < n; i++) {
		int32_t x = mlirDenseI32ArrayGetElement(v, i);
		if (x < lo || x > hi) {
			report(&r->d, mlirOperationGetLocation(op),
			       "%s: attribute '%s' element %ld is %d, outside [%d, %d]", what, name,
			       (long)i, (int)x, (int)lo, (int)hi);
			return false;
		}
		(*out)[i] = x;
	}
	return true;
}

/* The block of op's one region (a null block when the region has none), or
 * false after reporting an op without exactly one region of at most one block. */
static bool body_of(reader *r, MlirOperation op, const char *what, MlirBlock *out)
{
	if (mlirOperationGetNumRegions(op) != 1) {
		report(&r->d, mlirOperationGetLocation(op), "%s: expected one region", what);
		return false;
	}
	*out = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, 0));
	if (!mlirBlockIsNull(*out) && !mlirBlockIsNull(mlirBlockGetNextInRegion(*out))) {
		report(&r->d, mlirOperationGetLocation(op), "%s: expected one block", what);
		return false;
	}
	return true;
}

static MlirOperation first_op(MlirBlock b)
{
	if (mlirBlockIsNull(b)) {
		MlirOperation none = {NULL};
		return none;
	}
	return mlirBlockGetFirstOperation(b);
}

static bool read_template(reader *r, MlirOperation op, int32_t j, kiln_template *t)
{
	char what[64], twhat[96];
	snprintf(what, sizeof what, "kiln.template %d", (int)j);
	int32_t id;
	int kind;
	/* Enumerations are spelled by their printers (ir.c, interleave.c). */
	const char *lk[N_LAYER_KINDS], *tkn[KILN_TASK_KIND_COUNT], *sn[KILN_STREAM_COUNT];
	for (int k = 0; k < N_LAYER_KINDS; k++)
		lk[k] = kiln_ir_layer_kind_name((kiln_layer_kind)k);
	for (int k = 0; k < KILN_TASK_KIND_COUNT; k++)
		tkn[k] = kiln_task_kind_name((kiln_task_kind)k);
	for (int k = 0; k < KILN_STREAM_COUNT; k++)
		sn[k] = kiln_stream_name((kiln_stream)k);
	MlirBlock body;
	if (!get_i32(r, op, what, "id", j, j, &id) ||
	    !get_i32(r, op, what, "stage", 0, INT32_MAX, &t->stage) ||
	    !get_enum(r, op, what, "kind", lk, N_LAYER_KINDS, &kind) ||
	    !get_i32(r, op, what, "plan", -1, INT32_MAX, &t->plan) ||
	    !get_f64(r, op, what, "load_factor", true, &t->load_factor) ||
	    !get_f64(r, op, what, "makespan_us", true, &t->makespan_us) ||
	    !get_f64(r, op, what, "serial_us", true, &t->serial_us) ||
	    !get_f64(r, op, what, "base_us", true, &t->base_us) || !body_of(r, op, what, &body))
		return false;
	t->kind = (kiln_layer_kind)kind;
	int32_t n = 0;
	for (MlirOperation o = first_op(body); !mlirOperationIsNull(o);
	     o = mlirOperationGetNextInBlock(o)) {
		if (!sref_eq(op_name(o), "kiln.task")) {
			MlirStringRef s = op_name(o);
			report(&r->d, mlirOperationGetLocation(o),
			       "%s: unexpected op '%.*s' (only kiln.task)", what,
			       (int)(s.length > 64 ? 64 : s.length), s.data);
			return false;
		}
		if (n == INT32_MAX / 2) {
			report(&r->d, mlirOperationGetLocation(o), "%s: too many tasks", what);
			return false;
		}
		n++;
	}
	t->n_tasks = n;
	if (n && !(t->tasks = kiln_arena_alloc(r->a, sizeof(kiln_task) * (size_t)n))) {
		report(&r->d, mlirOperationGetLocation(op), "%s: out of memory for %d tasks", what,
		       (int)n);
		return false;
	}
	int32_t i = 0;
	for (MlirOperation o = first_op(body); !mlirOperationIsNull(o);
	     o = mlirOperationGetNextInBlock(o), i++) {
		kiln_task *k = &t->tasks[i];
		int tk, st;
		snprintf(twhat, sizeof twhat, "kiln.task %d of %s", (int)i, what);
		if (!get_str(r, o, twhat, "name", &k->name) ||
		    !get_enum(r, o, twhat, "kind", tkn, KILN_TASK_KIND_COUNT, &tk) ||
		    !get_enum(r, o, twhat, "stream", sn, KILN_STREAM_COUNT, &st) ||
		    !get_i32(r, o, twhat, "chain", 0, 1, &k->chain) ||
		    !get_i32(r, o, twhat, "index", 0, INT32_MAX, &k->index) ||
		    !get_f64(r, o, twhat, "duration_us", true, &k->duration_us) ||
		    !get_f64(r, o, twhat, "start_us", true, &k->start_us) ||
		    !get_f64(r, o, twhat, "end_us", true, &k->end_us) ||
		    !get_i32s(r, o, twhat, "deps", 0, n - 1, &k->deps, &k->n_deps) ||
		    !get_f64(r, o, twhat, "mem_bytes", true, &k->mem_bytes))
			return false;
		k->kind = (kiln_task_kind)tk;
		k->stream = (kiln_stream)st;
		for (int32_t q = 0; q < k->n_deps; q++) {
			if (k->deps[q] == i) {
				report(&r->d, mlirOperationGetLocation(o), "%s: depends on itself",
				       twhat);
				return false;
			}
		}
		if (k->end_us < k->start_us) {
			report(&r->d, mlirOperationGetLocation(o),
			       "%s: ends (%g us) before it starts (%g us)", twhat, k->end_us,
			       k->start_us);
			return false;
		}
	}
	return true;
}

static bool read_timeline(reader *r, MlirOperation op, int32_t i, int32_t n_templates,
                          kiln_stage_timeline *tl)
{
	char what[64];
	snprintf(what, sizeof what, "kiln.timeline %d", (int)i);
	int32_t n_tpl;
	if (!get_i32(r, op, what, "stage", 0, INT32_MAX, &tl->stage) ||
	    !get_i32s(r, op, what, "layers", INT32_MIN, INT32_MAX, &tl->layer, &tl->n_layers))
		return false;
	if (n_templates == 0 && tl->n_layers > 0) {
		report(&r->d, mlirOperationGetLocation(op),
		       "%s: names templates but the schedule has none", what);
		return false;
	}
	if (!get_i32s(r, op, what, "templates", 0, n_templates - 1, &tl->template_id, &n_tpl))
		return false;
	if (n_tpl != tl->n_layers) {
		report(&r->d, mlirOperationGetLocation(op),
		       "%s: %d layers but %d template ids (one per layer)", what, (int)tl->n_layers,
		       (int)n_tpl);
		return false;
	}
	return true;
}

/* Fills out from the module's one kiln.schedule. Returns 0 or -1 (reported). */
static int read_module(reader *r, MlirModule mod, kiln_plan_schedule *out)
{
	MlirLocation none = {NULL};
	MlirOperation mop = mlirModuleGetOperation(mod);
	MlirAttribute ver = mlirOperationGetAttributeByName(mop, sref("kiln.version"));
	if (!mlirAttributeIsNull(ver) &&
	    (!mlirAttributeIsAInteger(ver) || !mlirTypeIsAInteger(mlirAttributeGetType(ver)) ||
	     mlirIntegerTypeGetWidth(mlirAttributeGetType(ver)) > 64 ||
	     mlirIntegerAttrGetValueSInt(ver) != KILN_MLIR_VERSION)) {
		report(&r->d, none,
		       "kiln.version is not %d: this MLIR is from another kiln version",
		       KILN_MLIR_VERSION);
		return -1;
	}
	MlirOperation sched = {NULL};
	bool any_kiln = false;
	for (MlirOperation o = first_op(mlirModuleGetBody(mod)); !mlirOperationIsNull(o);
	     o = mlirOperationGetNextInBlock(o)) {
		any_kiln = any_kiln || is_kiln_op(o);
		if (!sref_eq(op_name(o), "kiln.schedule"))
			continue;
		if (!mlirOperationIsNull(sched)) {
			report(&r->d, mlirOperationGetLocation(o),
			       "a second kiln.schedule (expected one)");
			return -1;
		}
		sched = o;
	}
	if (!any_kiln) {
		report(&r->d, none,
		       "no kiln ops: this MLIR was not written by `kilnc compile --emit-mlir`");
		return -1;
	}
	if (mlirOperationIsNull(sched)) {
		report(&r->d, none, "no kiln.schedule op: the plan was emitted without schedules");
		return -1;
	}
	MlirBlock body;
	if (!get_str(r, sched, "kiln.schedule", "model", &out->model) ||
	    !body_of(r, sched, "kiln.schedule", &body))
		return -1;

	int32_t n_tpl = 0, n_tl = 0;
	for (MlirOperation o = first_op(body); !mlirOperationIsNull(o);
	     o = mlirOperationGetNextInBlock(o)) {
		MlirStringRef s = op_name(o);
		if (sref_eq(s, "kiln.template") && n_tpl < INT32_MAX / 2) {
			n_tpl++;
		} else if (sref_eq(s, "kiln.timeline") && n_tl < INT32_MAX / 2) {
			n_tl++;
		} else {
			report(&r->d, mlirOperationGetLocation(o),
			       "kiln.schedule: unexpected op '%.*s' (only kiln.template and "
			       "kiln.timeline)",
			       (int)(s.length > 64 ? 64 : s.length), s.data);
			return -1;
		}
	}
	if ((n_tpl &&
	     !(out->templates = kiln_arena_alloc(r->a, sizeof(kiln_template) * (size_t)n_tpl))) ||
	    (n_tl &&
	     !(out->stages = kiln_arena_alloc(r->a, sizeof(kiln_stage_timeline) * (size_t)n_tl)))) {
		report(&r->d, none, "out of memory for %d templates", (int)n_tpl);
		return -1;
	}
	out->n_templates = n_tpl;
	out->n_stages = n_tl;
	int32_t j = 0, i = 0;
	for (MlirOperation o = first_op(body); !mlirOperationIsNull(o);
	     o = mlirOperationGetNextInBlock(o)) {
		if (sref_eq(op_name(o), "kiln.template")) {
			if (!read_template(r, o, j, &out->templates[j]))
				return -1;
			j++;
		} else {
			if (!read_timeline(r, o, i, n_tpl, &out->stages[i]))
				return -1;
			i++;
		}
	}
	/* As the compiler builds them (passes/interleave.c) and its verifier
	 * holds them (passes/verify.c, check_schedule): one timeline per stage,
	 * in stage order, each naming only its stage's templates; every
	 * template of a stage that exists. Reported at the op. */
	j = i = 0;
	for (MlirOperation o = first_op(body); !mlirOperationIsNull(o);
	     o = mlirOperationGetNextInBlock(o)) {
		MlirLocation at = mlirOperationGetLocation(o);
		if (sref_eq(op_name(o), "kiln.template")) {
			const kiln_template *t = &out->templates[j];
			if (t->stage >= n_tl) {
				report(&r->d, at,
				       "kiln.template %d: stage %d, but there are %d timelines",
				       (int)j, (int)t->stage, (int)n_tl);
				return -1;
			}
			j++;
			continue;
		}
		const kiln_stage_timeline *tl = &out->stages[i];
		if (tl->stage != i) {
			report(
			    &r->d, at,
			    "kiln.timeline %d: stage %d, expected %d (one timeline per stage, in "
			    "stage order)",
			    (int)i, (int)tl->stage, (int)i);
			return -1;
		}
		for (int32_t l = 0; l < tl->n_layers; l++) {
			const kiln_template *t = &out->templates[tl->template_id[l]];
			if (t->stage != i) {
				report(&r->d, at,
				       "kiln.timeline %d: layer %d names template %d of stage %d",
				       (int)i, (int)tl->layer[l], (int)tl->template_id[l],
				       (int)t->stage);
				return -1;
			}
		}
		i++;
	}
	return 0;
}

int kiln_mlir_read_schedule(const char *text, size_t len, kiln_arena *a, kiln_plan_schedule *out,
                            FILE *err)
{
	reader r = {.d = {.err = err}, .a = a};
	MlirLocation none = {NULL};
	memset(out, 0, sizeof *out);
	if (!text || len == 0) {
		report(&r.d, none, "empty input: expected the MLIR of `kilnc compile --emit-mlir`");
		return -1;
	}
	size_t line = 0;
	char word[48];
	if (only_kiln_syntax(text, len, &line, word, sizeof word) != 0) {
		report(&r.d, none,
		       "not valid MLIR as kilnc writes it: '%s' (line %zu) is outside its syntax", word,
		       line);
		return -1;
	}
	if (max_nesting(text, len, &line) > MAX_NESTING) {
		report(&r.d, none,
		       "brackets nest deeper than %d levels (line %zu): not kiln's MLIR",
		       MAX_NESTING, line);
		return -1;
	}
	if (len > SIZE_MAX - 1)
		return -1;
	/* MLIR's lexer expects a NUL after the last byte; text is borrowed as is. */
	char *copy = malloc(len + 1);
	if (!copy) {
		report(&r.d, none, "out of memory");
		return -1;
	}
	memcpy(copy, text, len);
	copy[len] = '\0';

	MlirContext ctx = context_new(&r.d);
	MlirModule mod = mlirModuleCreateParse(ctx, mlirStringRefCreate(copy, len));
	free(copy);
	int rc = -1;
	if (mlirModuleIsNull(mod))
		report(&r.d, none, "not valid MLIR");
	else
		rc = read_module(&r, mod, out);
	if (!mlirModuleIsNull(mod))
		mlirModuleDestroy(mod);
	mlirContextDestroy(ctx);
	if (rc != 0)
		memset(out, 0, sizeof *out);
	return rc;
}
