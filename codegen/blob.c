/* codegen/blob.c: the plan blob writer (docs/blob-format.md).
 *
 * Turns a finished compilation into the bytes the runtime loads: stages with
 * their budgets and floors, planned layers, unit sets and their units, load
 * buckets, plan tables (point arrays shared between equal tables), the plan
 * pool, per-set chunk catalogues and the per-plan dual-batch templates.
 * Everything is derived from the compilation alone, in a fixed order, with
 * padding zeroed, so the same input gives the same bytes.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "kiln/blob.h"
#include "kiln/runtime.h"
#include "passes/passes.h"

/* Where the compiler's values are written as the blob's (docs/blob-format.md,
 * "Enumerated fields"): the blob's values are owned by include/kiln (blob.h,
 * and runtime.h for what the runtime hands its callers); the compiler's
 * enums below are written unconverted and must agree. */
_Static_assert(KILN_ACT_KEEP == (int)KILN_RT_KEEP && KILN_ACT_RECOMPUTE == (int)KILN_RT_RECOMPUTE &&
                   KILN_ACT_OFFLOAD == (int)KILN_RT_OFFLOAD && KILN_ACT_COUNT == 3,
               "ACTIONS: kiln_action is written as kiln_rt_action");
_Static_assert(KILN_STREAM_COMPUTE == (int)KILN_RT_STREAM_COMPUTE &&
                   KILN_STREAM_COMM == (int)KILN_RT_STREAM_COMM &&
                   KILN_STREAM_D2H == (int)KILN_RT_STREAM_D2H &&
                   KILN_STREAM_H2D == (int)KILN_RT_STREAM_H2D && KILN_STREAM_COUNT == 4,
               "chunk.stream: kiln_stream is written as kiln_rt_stream");
_Static_assert(KILN_TASK_FORWARD == (int)KILN_RT_TASK_FORWARD &&
                   KILN_TASK_BACKWARD == (int)KILN_RT_TASK_BACKWARD &&
                   KILN_TASK_RECOMPUTE == (int)KILN_RT_TASK_RECOMPUTE &&
                   KILN_TASK_COPY == (int)KILN_RT_TASK_COPY &&
                   KILN_TASK_COMM == (int)KILN_RT_TASK_COMM && KILN_TASK_KIND_COUNT == 5,
               "chunk.kind: kiln_task_kind is written as kiln_rt_task_kind");
_Static_assert(KILN_UNIT_LAYER_INPUT == (unsigned)KILN_RT_UNIT_LAYER_INPUT &&
                   KILN_UNIT_COLLECTIVE == (unsigned)KILN_RT_UNIT_COLLECTIVE &&
                   KILN_UNIT_RNG == (unsigned)KILN_RT_UNIT_RNG &&
                   KILN_UNIT_EXPERT == (unsigned)KILN_RT_UNIT_EXPERT,
               "unit.flags: KILN_UNIT_* are written as KILN_RT_UNIT_*");
_Static_assert(KILN_SOLVER_DP == (int)KILN_BLOB_SOLVER_DP &&
                   KILN_SOLVER_MILP == (int)KILN_BLOB_SOLVER_MILP,
               "meta.solver: kiln_solver is written as KILN_BLOB_SOLVER_*");
_Static_assert(KILN_PLAN_MAX_BUCKETS <= KILN_BLOB_MAX_BUCKETS,
               "meta.n_buckets: every compilation's buckets are within the loader's bound");

/* ---------------------------------------------------------------- growable arrays */

typedef struct buf {
	unsigned char *p;
	size_t len, cap;
	int failed;
} buf;

static void *buf_push(buf *b, const void *data, size_t len)
{
	if (b->failed)
		return NULL;
	if (b->len + len > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + len)
			cap *= 2;
		unsigned char *p = realloc(b->p, cap);
		if (!p) {
			b->failed = 1;
			return NULL;
		}
		b->p = p;
		b->cap = cap;
	}
	void *at = b->p + b->len;
	if (data)
		memcpy(at, data, len);
	else
		memset(at, 0, len);
	b->len += len;
	return at;
}

/* ---------------------------------------------------------------- strings */

typedef struct strtab {
	buf bytes;
	uint32_t *offsets; /* open addressing: offset + 1, 0 empty */
	size_t n_slots, n;
	int failed;
} strtab;

static uint64_t fnv1a(uint64_t h, const void *data, size_t len)
{
	const unsigned char *p = data;
	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 1099511628211ull;
	}
	return h;
}

#define FNV_SEED 14695981039346656037ull

/* Offset of s in the string section, adding it once. */
static uint32_t str_add(strtab *t, const char *s)
{
	if (t->failed)
		return 0;
	if (2 * (t->n + 1) > t->n_slots) {
		size_t n_slots = t->n_slots ? 2 * t->n_slots : 1024;
		uint32_t *slots = calloc(n_slots, sizeof(uint32_t));
		if (!slots) {
			t->failed = 1;
			return 0;
		}
		for (size_t i = 0; i < t->n_slots; i++) {
			if (!t->offsets[i])
				continue;
			const char *old = (const char *)t->bytes.p + t->offsets[i] - 1;
			size_t k = fnv1a(FNV_SEED, old, strlen(old)) % n_slots;
			while (slots[k])
				k = (k + 1) % n_slots;
			slots[k] = t->offsets[i];
		}
		free(t->offsets);
		t->offsets = slots;
		t->n_slots = n_slots;
	}
	size_t len = strlen(s);
	size_t k = fnv1a(FNV_SEED, s, len) % t->n_slots;
	for (; t->offsets[k]; k = (k + 1) % t->n_slots) {
		const char *old = (const char *)t->bytes.p + t->offsets[k] - 1;
		if (strcmp(old, s) == 0)
			return t->offsets[k] - 1;
	}
	uint32_t off = (uint32_t)t->bytes.len;
	if (!buf_push(&t->bytes, s, len + 1)) {
		t->failed = 1;
		return 0;
	}
	t->offsets[k] = off + 1;
	t->n++;
	return off;
}

/* ---------------------------------------------------------------- model hash */

/* FNV-1a 64 of the normalised description: every field of the validated
 * model (defaults applied, hardware resolved) printed in a fixed order,
 * numbers with round-trip precision, the file path left out. */
uint64_t kiln_blob_model_hash(const kiln_model *m)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return 0;
	const kiln_hardware *h = &m->hw;
	fprintf(f, "name=%s\n", m->name);
	fprintf(f, "model=%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%lld,%d,%d,%.17g\n",
	        (long long)m->layers, (long long)m->dense_layers, (long long)m->hidden,
	        (long long)m->ffn_hidden, (long long)m->heads, (long long)m->kv_heads,
	        (long long)m->head_dim, (long long)m->vocab, (long long)m->seq_len,
	        (int)m->attention, (int)m->activation, m->dropout);
	fprintf(f, "mla=%d,%lld,%lld,%lld,%lld\n", (int)m->mla, (long long)m->q_lora_rank,
	        (long long)m->kv_lora_rank, (long long)m->rope_head_dim, (long long)m->v_head_dim);
	fprintf(f, "moe=%d,%lld,%lld,%lld,%lld,%d\n", (int)m->moe, (long long)m->experts,
	        (long long)m->shared_experts, (long long)m->top_k, (long long)m->expert_ffn_hidden,
	        (int)m->moe_activation);
	fprintf(f, "training=%lld,%lld,%d,%d,%d\n", (long long)m->micro_batch,
	        (long long)m->global_batch, (int)m->dtype, (int)m->optimizer,
	        (int)m->distributed_optimizer);
	fprintf(f, "parallel=%lld,%lld,%lld,%lld,%d,%d,%lld:", (long long)m->devices,
	        (long long)m->tp, (long long)m->pp, (long long)m->ep, (int)m->sequence_parallel,
	        (int)m->schedule, (long long)m->vpp);
	for (size_t i = 0; i < m->n_stage_layers; i++)
		fprintf(f, "%lld,", (long long)m->stage_layers[i]);
	fprintf(f, "\nhardware=%s,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%.17g,%lld,%.17g,%.17g\n",
	        h->name, h->memory_gib, h->reserved_gib, h->peak_tflops, h->gemm_efficiency,
	        h->hbm_gbps, h->h2d_gbps, h->d2h_gbps, h->host_memory_gib,
	        (long long)h->devices_per_node, h->intra_node_gbps, h->inter_node_gbps);
	fprintf(f, "load=%.17g\n", m->max_factor);
	if (fclose(f) != 0) {
		free(text);
		return 0;
	}
	uint64_t hash = fnv1a(FNV_SEED, text, len);
	free(text);
	return hash;
}

/* ---------------------------------------------------------------- helpers */

static uint64_t ceil_bytes(double v)
{
	if (!(v > 0))
		return 0;
	if (v >= 1.8e19)
		return UINT64_MAX;
	return (uint64_t)ceil(v);
}

static uint64_t keep_bytes(const kiln_plan_table *t)
{
	return ceil_bytes(t->bytes[0].resident + t->bytes[0].saved);
}

/* Resident bytes of table point p as the runtime sees them: everything kept
 * minus the quanta saved (rounded down), so never below the exact figure. */
static uint64_t point_resident(const kiln_plan_table *t, int32_t p)
{
	uint64_t keep = keep_bytes(t);
	uint64_t saved = (uint64_t)t->frontier->points[t->point[p]].saved_q *
	                 t->instance.quantum_bytes;
	return saved < keep ? keep - saved : 0;
}

/* The floor of one layer of set k: the maximal-saving point's resident bytes
 * as the runtime counts them, at the worst bucket (the quanta differ
 * between buckets, so the last bucket is not always the largest). */
static uint64_t layer_floor(const kiln_compilation *c, int32_t k)
{
	uint64_t worst = 0;
	for (int32_t b = 0; b < c->n_buckets; b++) {
		const kiln_plan_table *t = kiln_plan_table_of(c, k, b);
		uint64_t r = point_resident(t, t->n_points - 1);
		worst = r > worst ? r : worst;
	}
	return worst;
}

static int32_t set_index(const kiln_compilation *c, const kiln_unit_set *s)
{
	return (int32_t)(s - c->sets);
}

/* The unit a chunk serves: the name after "offload ", "reload " or
 * "recompute " (docs/schedule.md, "Chunks"), or KILN_BLOB_NO_UNIT. */
static uint8_t chunk_unit(const kiln_unit_set *s, const char *name)
{
	const char *sp = strchr(name, ' ');
	if (!sp)
		return KILN_BLOB_NO_UNIT;
	for (int32_t u = 0; u < s->n_units && u < KILN_BLOB_NO_UNIT; u++)
		if (strcmp(s->units[u].name, sp + 1) == 0)
			return (uint8_t)u;
	return KILN_BLOB_NO_UNIT;
}

/* ---------------------------------------------------------------- the writer */

typedef struct writer {
	const kiln_compilation *c;
	FILE *err;
	strtab strings;
	buf sec[KILN_SEC_COUNT];
	int32_t *plan_template; /* per pool plan: template index in the blob, or -1 */
	int32_t *tpl_of_plan;   /* per pool plan: index into c->schedule->templates, or -1 */
} writer;

#define PUSH(w, id, rec) buf_push(&(w)->sec[KILN_SEC_##id], &(rec), sizeof(rec))

static int fail(writer *w, const char *what)
{
	fprintf(w->err, "kilnc: error: cannot write the blob: %s\n", what);
	return -1;
}

/* The steady plan's resident bytes at load 1 of one layer of set k on
 * stage s (passes/budget.c), as the runtime counts them. */
static uint64_t layer_steady(const kiln_compilation *c, int32_t s, int32_t k)
{
	int32_t j = 0;
	for (int32_t i = 0; i < k; i++)
		j += c->sets[i].stage == s;
	int32_t b1 = kiln_plan_bucket_of(c->buckets, c->n_buckets, 1.0);
	if (b1 >= c->n_buckets)
		b1 = c->n_buckets - 1;
	const kiln_plan_table *t = kiln_plan_table_of(c, k, b1);
	int32_t pt = c->budgets[s].steady_point ? c->budgets[s].steady_point[j] : 0;
	if (pt < 0 || pt >= t->n_points)
		pt = 0;
	return point_resident(t, pt);
}

static int write_stages_layers(writer *w)
{
	const kiln_compilation *c = w->c;
	const kiln_ir_graph *g = c->graph;
	uint32_t n_layers = 0;
	for (int32_t s = 0; s < g->n_stages; s++) {
		const kiln_stage_budget *bu = &c->budgets[s];
		/* The stage's planned layers, in execution order, with their sets. */
		int32_t first_layer = (int32_t)n_layers, count = 0;
		uint64_t floor_bytes = ceil_bytes(bu->fixed_bytes), transient = 0;
		const kiln_ir_stage *st = &g->stages[s];
		int32_t set_of[4096];
		for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
			const kiln_ir_layer *L = &g->layers[l];
			if (L->index < 0)
				continue;
			int32_t set = -1;
			for (int32_t k = 0; k < c->n_sets; k++)
				if (c->sets[k].stage == s && c->sets[k].kind == L->kind)
					set = k;
			if (set < 0 || count >= 4096)
				return fail(w, "a layer without a unit set");
			set_of[count++] = set;
			floor_bytes += layer_floor(c, set);
		}
		for (int32_t k = 0; k < c->n_sets; k++) {
			if (c->sets[k].stage != s)
				continue;
			for (int32_t b = 0; b < c->n_buckets; b++) {
				const kiln_plan_table *t = kiln_plan_table_of(c, k, b);
				for (int32_t p = 0; p < t->n_points; p++) {
					uint64_t tr = ceil_bytes(t->bytes[p].transient);
					transient = tr > transient ? tr : transient;
				}
			}
		}
		/* Layers: the floor of the layers after each one. */
		uint64_t tail = 0;
		int32_t pos = count;
		for (int32_t l = st->layer_end - 1; l >= st->layer_begin; l--) {
			const kiln_ir_layer *L = &g->layers[l];
			if (L->index < 0)
				continue;
			pos--;
			kiln_blob_layer rec = {.model_layer = (uint32_t)L->index,
			                       .set = (uint32_t)set_of[pos],
			                       .tail_floor_bytes = tail};
			/* Written in reverse; fixed below. */
			if (!PUSH(w, LAYERS, rec))
				return -1;
			tail += layer_floor(c, set_of[pos]);
		}
		kiln_blob_layer *recs = (kiln_blob_layer *)w->sec[KILN_SEC_LAYERS].p + first_layer;
		for (int32_t i = 0, j = count - 1; i < j; i++, j--) {
			kiln_blob_layer tmp = recs[i];
			recs[i] = recs[j];
			recs[j] = tmp;
		}
		/* Fair shares, cumulative in execution order. */
		uint64_t head = ceil_bytes(bu->fixed_bytes);
		int32_t b1 = kiln_plan_bucket_of(c->buckets, c->n_buckets, 1.0);
		if (b1 >= c->n_buckets)
			b1 = c->n_buckets - 1;
		for (int32_t i = 0; i < count; i++) {
			uint64_t steady = layer_steady(c, s, set_of[i]);
			head += steady;
			recs[i].head_steady_bytes = head;
			recs[i].steady_bytes = steady;
			recs[i].steady_keep_bytes =
			    keep_bytes(kiln_plan_table_of(c, set_of[i], b1));
		}
		n_layers += (uint32_t)count;
		kiln_blob_stage rec = {
		    .capacity_bytes = ceil_bytes(bu->capacity_bytes),
		    .static_bytes = ceil_bytes(bu->static_bytes),
		    .fixed_bytes = ceil_bytes(bu->fixed_bytes),
		    .budget_bytes = bu->budget_bytes > 0 ? (uint64_t)floor(bu->budget_bytes) : 0,
		    .steady_bytes = ceil_bytes(bu->steady_bytes),
		    .floor_bytes = floor_bytes,
		    .transient_bytes = transient,
		    .inflight = bu->inflight,
		    .safety_factor = bu->safety_factor,
		    .first_layer = (uint32_t)first_layer,
		    .n_layers = (uint32_t)count,
		};
		if (!PUSH(w, STAGES, rec))
			return -1;
	}
	return 0;
}

/* Point arrays of equal tables are written once. */
typedef struct point_key {
	uint64_t hash;
	uint32_t first, n;
} point_key;

static int write_tables(writer *w)
{
	const kiln_compilation *c = w->c;
	size_t n_tab = (size_t)c->n_sets * (size_t)c->n_buckets;
	point_key *seen = calloc(n_tab ? n_tab : 1, sizeof(point_key));
	if (!seen)
		return fail(w, "out of memory");
	size_t n_seen = 0;
	kiln_blob_point *pts = NULL;
	for (int32_t k = 0; k < c->n_sets; k++) {
		const kiln_unit_set *s = &c->sets[k];
		double balanced = s->kind == KILN_LAYER_MOE ? c->graph->layers[s->layer].n_balanced : 0;
		for (int32_t b = 0; b < c->n_buckets; b++) {
			const kiln_plan_table *t = kiln_plan_table_of(c, k, b);
			double rows = floor(c->buckets[b] * balanced + 1e-9);
			kiln_blob_bucket bk = {.max_rows = balanced > 0 ? (uint64_t)rows : 0,
			                       .load_factor = c->buckets[b]};
			if (!PUSH(w, BUCKETS, bk))
				goto oom;
			if (t->n_points < 1 || t->n_points > 65536) {
				free(seen);
				return fail(w, "a plan table without points");
			}
			pts = calloc((size_t)t->n_points, sizeof(kiln_blob_point));
			if (!pts)
				goto oom;
			for (int32_t p = 0; p < t->n_points; p++) {
				pts[p].saved_q = t->frontier->points[t->point[p]].saved_q;
				pts[p].plan = (uint32_t)t->plan[p];
				pts[p].exposed_us = (float)kiln_plan_table_exposed_us(t, p);
			}
			uint64_t h = fnv1a(FNV_SEED, pts, sizeof(kiln_blob_point) * (size_t)t->n_points);
			uint32_t first = UINT32_MAX;
			const kiln_blob_point *all = (const kiln_blob_point *)w->sec[KILN_SEC_POINTS].p;
			for (size_t i = 0; i < n_seen && first == UINT32_MAX; i++)
				if (seen[i].hash == h && seen[i].n == (uint32_t)t->n_points &&
				    memcmp(all + seen[i].first, pts,
				           sizeof(kiln_blob_point) * (size_t)t->n_points) == 0)
					first = seen[i].first;
			if (first == UINT32_MAX) {
				first = (uint32_t)(w->sec[KILN_SEC_POINTS].len / sizeof(kiln_blob_point));
				if (!buf_push(&w->sec[KILN_SEC_POINTS], pts,
				              sizeof(kiln_blob_point) * (size_t)t->n_points))
					goto oom;
				seen[n_seen++] = (point_key){h, first, (uint32_t)t->n_points};
			}
			free(pts);
			pts = NULL;
			kiln_blob_table rec = {.quantum_bytes = t->instance.quantum_bytes,
			                       .keep_bytes = keep_bytes(t),
			                       .first_point = first,
			                       .n_points = (uint32_t)t->n_points};
			if (!PUSH(w, TABLES, rec))
				goto oom;
		}
	}
	free(seen);
	return 0;
oom:
	free(pts);
	free(seen);
	return fail(w, "out of memory");
}

/* The chunk catalogue of set k: every distinct (name, stream, kind, chain)
 * of the templates whose plan follows set k's units. */
static int chunk_of(writer *w, int32_t k, uint32_t first_chunk, const kiln_task *task,
                    uint8_t *out)
{
	const kiln_unit_set *s = &w->c->sets[k];
	kiln_blob_chunk rec = {.name = str_add(&w->strings, task->name),
	                       .stream = (uint8_t)task->stream,
	                       .kind = (uint8_t)task->kind,
	                       .chain = (uint8_t)task->chain,
	                       .unit = chunk_unit(s, task->name)};
	kiln_blob_chunk *all = (kiln_blob_chunk *)w->sec[KILN_SEC_CHUNKS].p;
	size_t n = w->sec[KILN_SEC_CHUNKS].len / sizeof(kiln_blob_chunk);
	for (size_t i = first_chunk; i < n; i++)
		if (memcmp(&all[i], &rec, sizeof rec) == 0) {
			*out = (uint8_t)(i - first_chunk);
			return 0;
		}
	if (n - first_chunk >= KILN_BLOB_MAX_INDEX)
		return fail(w, "more than 255 distinct chunks in one unit set");
	if (!PUSH(w, CHUNKS, rec))
		return fail(w, "out of memory");
	*out = (uint8_t)(n - first_chunk);
	return 0;
}

static int write_sets_and_templates(writer *w)
{
	const kiln_compilation *c = w->c;
	const kiln_plan_pool *pool = c->pool;
	const kiln_plan_schedule *sc = c->schedule;
	uint32_t n_units = 0, n_tpl = 0;
	for (int32_t k = 0; k < c->n_sets; k++) {
		const kiln_unit_set *s = &c->sets[k];
		if (s->n_units > KILN_BLOB_MAX_INDEX)
			return fail(w, "more than 255 units in one layer");
		for (int32_t u = 0; u < s->n_units; u++) {
			const kiln_unit *un = &s->units[u];
			kiln_blob_unit rec = {.name = str_add(&w->strings, un->name),
			                      .flags = un->flags,
			                      .base_bytes = un->bytes.base,
			                      .per_row_bytes = un->bytes.per_n};
			if (!PUSH(w, UNITS, rec))
				return fail(w, "out of memory");
		}
		uint32_t first_chunk = (uint32_t)(w->sec[KILN_SEC_CHUNKS].len / sizeof(kiln_blob_chunk));
		/* Templates of the plans recorded against this set, in pool order. */
		for (int32_t p = 0; p < pool->n; p++) {
			if (pool->set[p] != s || w->tpl_of_plan[p] < 0)
				continue;
			const kiln_template *tpl = &sc->templates[w->tpl_of_plan[p]];
			if (tpl->n_tasks > KILN_BLOB_MAX_INDEX)
				return fail(w, "a template with more than 255 tasks");
			int32_t n_deps = 0;
			kiln_blob_template rec = {
			    .plan = (uint32_t)p,
			    .first_task = (uint32_t)w->sec[KILN_SEC_TASKS].len,
			    .first_dep = (uint32_t)(w->sec[KILN_SEC_DEPS].len / sizeof(kiln_blob_dep)),
			    .n_tasks = (uint16_t)tpl->n_tasks,
			    .makespan_us = (float)tpl->makespan_us,
			    .serial_us = (float)tpl->serial_us,
			    .base_us = (float)tpl->base_us,
			    .load_factor = (float)tpl->load_factor,
			};
			for (int32_t i = 0; i < tpl->n_tasks; i++) {
				uint8_t chunk;
				if (chunk_of(w, k, first_chunk, &tpl->tasks[i], &chunk) != 0)
					return -1;
				if (!PUSH(w, TASKS, chunk))
					return fail(w, "out of memory");
				for (int32_t d = 0; d < tpl->tasks[i].n_deps; d++) {
					kiln_blob_dep dep = {(uint8_t)i, (uint8_t)tpl->tasks[i].deps[d]};
					if (!PUSH(w, DEPS, dep))
						return fail(w, "out of memory");
					n_deps++;
				}
			}
			if (n_deps > 65535)
				return fail(w, "a template with too many dependencies");
			rec.n_deps = (uint16_t)n_deps;
			if (!PUSH(w, TEMPLATES, rec))
				return fail(w, "out of memory");
			w->plan_template[p] = (int32_t)n_tpl++;
		}
		uint32_t n_chunks =
		    (uint32_t)(w->sec[KILN_SEC_CHUNKS].len / sizeof(kiln_blob_chunk)) - first_chunk;
		double balanced = s->kind == KILN_LAYER_MOE ? c->graph->layers[s->layer].n_balanced : 0;
		kiln_blob_set rec = {.stage = (uint32_t)s->stage,
		                     .kind = s->kind == KILN_LAYER_MOE ? KILN_BLOB_SET_MOE
		                                                       : KILN_BLOB_SET_DENSE,
		                     .first_unit = n_units,
		                     .n_units = (uint32_t)s->n_units,
		                     .first_chunk = first_chunk,
		                     .n_chunks = n_chunks,
		                     .balanced_rows = (uint64_t)llround(balanced)};
		if (!PUSH(w, SETS, rec))
			return fail(w, "out of memory");
		n_units += (uint32_t)s->n_units;
	}
	/* The plan pool and its actions. */
	for (int32_t p = 0; p < pool->n; p++) {
		int32_t k = set_index(c, pool->set[p]);
		kiln_blob_plan rec = {.set = (uint32_t)k,
		                      .actions = (uint32_t)w->sec[KILN_SEC_ACTIONS].len,
		                      .template_id = w->plan_template[p] < 0
		                                         ? KILN_BLOB_NONE
		                                         : (uint32_t)w->plan_template[p]};
		if (!PUSH(w, PLANS, rec) ||
		    !buf_push(&w->sec[KILN_SEC_ACTIONS], pool->actions[p], (size_t)c->sets[k].n_units))
			return fail(w, "out of memory");
	}
	return 0;
}

/* 1.1: per set, the EP group's fallback (passes/passes.h,
 * kiln_group_fallback); a compilation without it writes plan none. */
static int write_groups(writer *w)
{
	const kiln_compilation *c = w->c;
	for (int32_t k = 0; k < c->n_sets; k++) {
		kiln_blob_group rec = {.set = (uint32_t)k, .plan = KILN_BLOB_NONE};
		const kiln_group_fallback *gf = c->groups ? &c->groups[k] : NULL;
		if (gf && gf->plan >= 0) {
			rec.plan = (uint32_t)gf->plan;
			rec.fit_rows = gf->fit_rows;
			rec.resident_base_bytes = gf->resident.base;
			rec.resident_per_row_bytes = gf->resident.per_n;
			rec.saved_base_bytes = gf->saved.base;
			rec.saved_per_row_bytes = gf->saved.per_n;
			rec.transient_base_bytes = gf->transient.base;
			rec.transient_per_row_bytes = gf->transient.per_n;
			rec.exposed_base_us = gf->exposed_base_us;
			rec.exposed_per_row_us = gf->exposed_per_row_us;
		}
		if (!PUSH(w, GROUPS, rec))
			return fail(w, "out of memory");
	}
	return 0;
}

static size_t record_bytes(int id)
{
	switch (id) {
#define X(name, type)                                                                              \
	case KILN_SEC_##name:                                                                      \
		return sizeof(type);
		KILN_BLOB_SECTIONS(X)
#undef X
	}
	return 1;
}

static size_t align64(size_t v)
{
	return (v + KILN_BLOB_ALIGN - 1) / KILN_BLOB_ALIGN * KILN_BLOB_ALIGN;
}

/* CRC32C, bytewise (the writer runs once per compile). */
static uint32_t crc32c(uint32_t crc, const unsigned char *p, size_t len)
{
	crc = ~crc;
	for (size_t i = 0; i < len; i++) {
		crc ^= p[i];
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
	}
	return ~crc;
}

static int assemble(writer *w, unsigned char **out, size_t *out_len)
{
	const kiln_compilation *c = w->c;
	kiln_blob_meta meta = {
	    .model_hash = kiln_blob_model_hash(c->model),
	    .model_name = str_add(&w->strings, c->model->name),
	    .compiler = str_add(&w->strings, "kilnc " KILN_VERSION),
	    .n_stages = (uint32_t)c->graph->n_stages,
	    .n_layers = (uint32_t)(w->sec[KILN_SEC_LAYERS].len / sizeof(kiln_blob_layer)),
	    .n_model_layers = (uint32_t)c->model->layers,
	    .n_buckets = (uint32_t)c->n_buckets,
	    .solver = (uint32_t)c->solver,
	    .max_factor = c->model->max_factor,
	};
	if (w->strings.failed)
		return fail(w, "out of memory");
	if (!PUSH(w, META, meta))
		return fail(w, "out of memory");
	w->sec[KILN_SEC_STRINGS] = w->strings.bytes;
	w->strings.bytes = (buf){0};
	if (w->sec[KILN_SEC_STRINGS].len == 0 && !buf_push(&w->sec[KILN_SEC_STRINGS], "", 1))
		return fail(w, "out of memory");

	size_t table_off = sizeof(kiln_blob_header);
	size_t off = align64(table_off + sizeof(kiln_blob_section) * KILN_SEC_COUNT);
	kiln_blob_section secs[KILN_SEC_COUNT];
	for (int i = 0; i < KILN_SEC_COUNT; i++) {
		if (w->sec[i].failed)
			return fail(w, "out of memory");
		secs[i] = (kiln_blob_section){.id = (uint32_t)i,
		                              .record_bytes = (uint32_t)record_bytes(i),
		                              .offset = off,
		                              .count = w->sec[i].len / record_bytes(i)};
		off = align64(off + w->sec[i].len);
	}
	if (off > KILN_BLOB_MAX_BYTES)
		return fail(w, "the blob would exceed 1 GiB");
	unsigned char *blob = calloc(1, off);
	if (!blob)
		return fail(w, "out of memory");
	kiln_blob_header h = {.major = KILN_BLOB_MAJOR,
	                      .minor = KILN_BLOB_MINOR,
	                      .header_bytes = sizeof(kiln_blob_header),
	                      .file_bytes = off,
	                      .n_sections = KILN_SEC_COUNT,
	                      .table_offset = table_off};
	memcpy(h.magic, KILN_BLOB_MAGIC, sizeof h.magic);
	memcpy(blob, &h, sizeof h);
	memcpy(blob + table_off, secs, sizeof secs);
	for (int i = 0; i < KILN_SEC_COUNT; i++)
		if (w->sec[i].len)
			memcpy(blob + secs[i].offset, w->sec[i].p, w->sec[i].len);
	const size_t crc_at = offsetof(kiln_blob_header, crc32c);
	uint32_t crc = crc32c(0, blob, crc_at);
	crc = crc32c(crc, blob + crc_at + 4, off - crc_at - 4);
	memcpy(blob + crc_at, &crc, sizeof crc);
	*out = blob;
	*out_len = off;
	return 0;
}

int kiln_blob_build(const kiln_compilation *c, FILE *err, unsigned char **out, size_t *out_len)
{
	*out = NULL;
	*out_len = 0;
	if (!c->budgets || !c->tables || !c->pool || !c->schedule) {
		fprintf(err, "kilnc: error: cannot write the blob: the compilation is incomplete\n");
		return -1;
	}
	writer w = {.c = c, .err = err};
	int rc = -1;
	int32_t np = c->pool->n;
	w.plan_template = malloc(sizeof(int32_t) * (size_t)(np ? np : 1));
	w.tpl_of_plan = malloc(sizeof(int32_t) * (size_t)(np ? np : 1));
	if (!w.plan_template || !w.tpl_of_plan) {
		fail(&w, "out of memory");
		goto out;
	}
	for (int32_t p = 0; p < np; p++)
		w.plan_template[p] = w.tpl_of_plan[p] = -1;
	/* A plan's template is the first one made for it (the interleave
	 * pass's per-class template; the budget pass appends copies at load 1
	 * for the views). */
	for (int32_t i = c->schedule->n_templates - 1; i >= 0; i--) {
		int32_t p = c->schedule->templates[i].plan;
		if (p >= 0 && p < np)
			w.tpl_of_plan[p] = i;
	}
	if (write_stages_layers(&w) == 0 && write_tables(&w) == 0 &&
	    write_sets_and_templates(&w) == 0 && write_groups(&w) == 0 &&
	    assemble(&w, out, out_len) == 0)
		rc = 0;
out:
	for (int i = 0; i < KILN_SEC_COUNT; i++)
		free(w.sec[i].p);
	free(w.strings.bytes.p);
	free(w.strings.offsets);
	free(w.plan_template);
	free(w.tpl_of_plan);
	return rc;
}
