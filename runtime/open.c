/* runtime/open.c: kiln_rt_open, the blob's one validation point.
 *
 * The blob is untrusted until this file is done with it: the header, the
 * CRC32C, the section table, every record's counts, offsets and indices
 * between sections are checked once, comparing against what remains (never
 * summing past the end), and afterwards the rest of the runtime trusts it.
 * The checks follow docs/blob-format.md, "What a loader must reject".
 */
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define MAX_STAGES 65536u
#define MAX_MODEL_LAYERS 65536u

static int finite_nonneg(double v)
{
	return isfinite(v) && v >= 0;
}

static int range_ok(uint64_t first, uint64_t n, uint64_t total)
{
	return first <= total && n <= total - first;
}

static int check_header(const unsigned char *b, size_t size)
{
	/* Too short for a header: truncated when what is there starts like a
	 * blob (an empty file included: what an interrupted write leaves),
	 * else not a blob at all. */
	if (size < sizeof(kiln_blob_header))
		return memcmp(b, KILN_BLOB_MAGIC, size < 8 ? size : 8) == 0 ? KILN_RT_ETRUNC
		                                                            : KILN_RT_EMAGIC;
	kiln_blob_header h;
	memcpy(&h, b, sizeof h);
	if (memcmp(h.magic, KILN_BLOB_MAGIC, sizeof h.magic) != 0)
		return KILN_RT_EMAGIC;
	if (h.major != KILN_BLOB_MAJOR || h.minor > KILN_BLOB_MINOR)
		return KILN_RT_EVERSION;
	if (h.file_bytes != size)
		return KILN_RT_ETRUNC;
	/* 1.0 has every section but GROUPS, 1.1 adds it at the end (1.2 too). */
	uint32_t n_sections = h.minor == 0 ? KILN_SEC_GROUPS : KILN_SEC_COUNT;
	if (h.header_bytes != sizeof(kiln_blob_header) || h.n_sections != n_sections ||
	    h.table_offset != sizeof(kiln_blob_header))
		return KILN_RT_ECORRUPT;
	for (size_t i = 0; i < sizeof h.reserved; i++)
		if (h.reserved[i])
			return KILN_RT_ECORRUPT;
	const size_t crc_at = offsetof(kiln_blob_header, crc32c);
	uint32_t crc = kiln_rti_crc32c(0, b, crc_at);
	crc = kiln_rti_crc32c(crc, b + crc_at + 4, size - crc_at - 4);
	if (crc != h.crc32c)
		return KILN_RT_ECRC;
	return 0;
}

static size_t record_bytes(uint32_t id)
{
	switch (id) {
#define X(name, type)                                                                              \
	case KILN_SEC_##name:                                                                      \
		return sizeof(type);
		KILN_BLOB_SECTIONS(X)
#undef X
	}
	return 0;
}

/* The section table: ids in order, sections 64-aligned, ascending, within
 * the file, whole records, zero bytes between them. Fills rt's views. */
static int check_sections(kiln_rt *rt)
{
	const unsigned char *b = rt->base;
	size_t size = rt->size;
	size_t table = sizeof(kiln_blob_header);
	/* The header names the count (check_header: 1.0 lacks GROUPS). */
	uint32_t n_sec;
	memcpy(&n_sec, b + offsetof(kiln_blob_header, n_sections), sizeof n_sec);
	size_t table_bytes = sizeof(kiln_blob_section) * n_sec;
	if (table_bytes > size - table)
		return KILN_RT_ECORRUPT;
	uint64_t prev_end = table + table_bytes;
	const void *view[KILN_SEC_COUNT] = {0};
	for (uint32_t i = 0; i < KILN_SEC_COUNT; i++)
		rt->count[i] = 0;
	for (uint32_t i = 0; i < n_sec; i++) {
		kiln_blob_section s;
		memcpy(&s, b + table + i * sizeof s, sizeof s);
		size_t rb = record_bytes(i);
		if (s.id != i || s.record_bytes != rb || s.offset % KILN_BLOB_ALIGN != 0 ||
		    s.offset < prev_end || s.offset > size || s.count > (size - s.offset) / rb)
			return KILN_RT_ECORRUPT;
		for (uint64_t k = prev_end; k < s.offset; k++)
			if (b[k])
				return KILN_RT_ECORRUPT;
		view[i] = b + s.offset;
		rt->count[i] = s.count;
		prev_end = s.offset + s.count * rb;
	}
	for (uint64_t k = prev_end; k < size; k++)
		if (b[k])
			return KILN_RT_ECORRUPT;
	if (size - prev_end >= KILN_BLOB_ALIGN)
		return KILN_RT_ECORRUPT;
	rt->meta = view[KILN_SEC_META];
	rt->strings = view[KILN_SEC_STRINGS];
	rt->stages = view[KILN_SEC_STAGES];
	rt->layers = view[KILN_SEC_LAYERS];
	rt->sets = view[KILN_SEC_SETS];
	rt->units = view[KILN_SEC_UNITS];
	rt->buckets = view[KILN_SEC_BUCKETS];
	rt->tables = view[KILN_SEC_TABLES];
	rt->points = view[KILN_SEC_POINTS];
	rt->plans = view[KILN_SEC_PLANS];
	rt->actions = view[KILN_SEC_ACTIONS];
	rt->chunks = view[KILN_SEC_CHUNKS];
	rt->templates = view[KILN_SEC_TEMPLATES];
	rt->tasks = view[KILN_SEC_TASKS];
	rt->deps = view[KILN_SEC_DEPS];
	rt->groups = n_sec > KILN_SEC_GROUPS ? view[KILN_SEC_GROUPS] : NULL;
	return 0;
}

static int string_ok(const kiln_rt *rt, uint32_t off)
{
	return off < rt->count[KILN_SEC_STRINGS];
}

static int check_meta(const kiln_rt *rt)
{
	if (rt->count[KILN_SEC_META] != 1)
		return KILN_RT_ECORRUPT;
	uint64_t ns = rt->count[KILN_SEC_STRINGS];
	if (ns == 0 || rt->strings[ns - 1] != '\0')
		return KILN_RT_ECORRUPT;
	const kiln_blob_meta *m = rt->meta;
	if (!string_ok(rt, m->model_name) || !string_ok(rt, m->compiler) || m->reserved ||
	    m->solver > KILN_BLOB_SOLVER_MILP || m->n_stages == 0 || m->n_stages > MAX_STAGES ||
	    m->n_model_layers == 0 || m->n_model_layers > MAX_MODEL_LAYERS || m->n_buckets == 0 ||
	    m->n_buckets > KILN_BLOB_MAX_BUCKETS ||
	    !(m->max_factor >= 1 && m->max_factor <= KILN_BLOB_MAX_FACTOR))
		return KILN_RT_ECORRUPT;
	if (rt->count[KILN_SEC_STAGES] != m->n_stages || rt->count[KILN_SEC_LAYERS] != m->n_layers ||
	    m->n_layers > m->n_model_layers)
		return KILN_RT_ECORRUPT;
	uint64_t n_sets = rt->count[KILN_SEC_SETS];
	/* A set is a (stage, layer kind): at most two per stage. */
	if (n_sets == 0 || n_sets > 2 * (uint64_t)m->n_stages ||
	    rt->count[KILN_SEC_BUCKETS] != n_sets * m->n_buckets ||
	    rt->count[KILN_SEC_TABLES] != n_sets * m->n_buckets)
		return KILN_RT_ECORRUPT;
	return 0;
}

/* Stages own consecutive runs of layers; every layer's set is on its stage;
 * model layer numbers are distinct (the index is built here). */
static int check_stages_layers(kiln_rt *rt)
{
	const kiln_blob_meta *m = rt->meta;
	uint64_t next = 0;
	for (uint32_t s = 0; s < m->n_stages; s++) {
		const kiln_blob_stage *st = &rt->stages[s];
		if (st->first_layer != next || !range_ok(st->first_layer, st->n_layers, m->n_layers) ||
		    !finite_nonneg(st->inflight) || !finite_nonneg(st->safety_factor))
			return KILN_RT_ECORRUPT;
		for (uint32_t i = st->first_layer; i < st->first_layer + st->n_layers; i++) {
			const kiln_blob_layer *L = &rt->layers[i];
			if (L->model_layer >= m->n_model_layers || L->set >= rt->count[KILN_SEC_SETS] ||
			    L->steady_bytes > L->head_steady_bytes ||
			    rt->sets[L->set].stage != s || rt->layer_index[L->model_layer] >= 0)
				return KILN_RT_ECORRUPT;
			rt->layer_index[L->model_layer] = (int32_t)i;
		}
		next += st->n_layers;
	}
	return next == m->n_layers ? 0 : KILN_RT_ECORRUPT;
}

static int check_sets_units(const kiln_rt *rt)
{
	uint64_t next_unit = 0, next_chunk = 0;
	for (uint64_t k = 0; k < rt->count[KILN_SEC_SETS]; k++) {
		const kiln_blob_set *s = &rt->sets[k];
		if (s->stage >= rt->meta->n_stages || s->kind > KILN_BLOB_SET_MOE ||
		    s->first_unit != next_unit || s->n_units > KILN_BLOB_MAX_INDEX ||
		    !range_ok(s->first_unit, s->n_units, rt->count[KILN_SEC_UNITS]) ||
		    s->first_chunk != next_chunk || s->n_chunks > KILN_BLOB_MAX_INDEX ||
		    !range_ok(s->first_chunk, s->n_chunks, rt->count[KILN_SEC_CHUNKS]) ||
		    (s->kind == KILN_BLOB_SET_DENSE) != (s->balanced_rows == 0))
			return KILN_RT_ECORRUPT;
		next_unit += s->n_units;
		next_chunk += s->n_chunks;
		for (uint32_t c = s->first_chunk; c < s->first_chunk + s->n_chunks; c++) {
			const kiln_blob_chunk *ch = &rt->chunks[c];
			if (!string_ok(rt, ch->name) || ch->stream > KILN_RT_STREAM_H2D ||
			    ch->kind > KILN_RT_TASK_COMM || ch->chain > 1 ||
			    (ch->unit != KILN_BLOB_NO_UNIT && ch->unit >= s->n_units))
				return KILN_RT_ECORRUPT;
		}
	}
	if (next_unit != rt->count[KILN_SEC_UNITS] || next_chunk != rt->count[KILN_SEC_CHUNKS])
		return KILN_RT_ECORRUPT;
	for (uint64_t u = 0; u < rt->count[KILN_SEC_UNITS]; u++)
		if (!string_ok(rt, rt->units[u].name) || rt->units[u].flags > 15)
			return KILN_RT_ECORRUPT;
	return 0;
}

/* Two sets have the same units (a pooled plan may serve both). */
static int same_units(const kiln_rt *rt, uint32_t a, uint32_t b)
{
	const kiln_blob_set *x = &rt->sets[a], *y = &rt->sets[b];
	if (a == b)
		return 1;
	if (rt->unit_class[a] >= 0 && rt->unit_class[b] >= 0)
		return rt->unit_class[a] == rt->unit_class[b];
	if (x->n_units != y->n_units)
		return 0;
	for (uint32_t u = 0; u < x->n_units; u++) {
		const kiln_blob_unit *p = &rt->units[x->first_unit + u];
		const kiln_blob_unit *q = &rt->units[y->first_unit + u];
		/* Names by offset: the writer stores each string once, and a
		 * text comparison would let long names make open quadratic. */
		if (p->flags != q->flags || p->base_bytes != q->base_bytes ||
		    p->per_row_bytes != q->per_row_bytes || p->name != q->name)
			return 0;
	}
	return 1;
}

/* Classes of sets with equal units, so that the tables' checks compare
 * two class numbers instead of two unit lists. At most MAX_CLASSES classes
 * are formed (a real blob has a handful); sets beyond them stay
 * unclassified (-1) and are compared unit by unit, so a crafted blob costs
 * linear time, never quadratic. */
#define MAX_CLASSES 64

static void classify_sets(kiln_rt *rt)
{
	uint64_t n = rt->count[KILN_SEC_SETS];
	uint32_t reps[MAX_CLASSES];
	int32_t n_reps = 0;
	for (uint64_t k = 0; k < n; k++)
		rt->unit_class[k] = -1;
	for (uint64_t k = 0; k < n; k++) {
		int32_t cls = -1;
		for (int32_t r = 0; r < n_reps && cls < 0; r++)
			if (same_units(rt, reps[r], (uint32_t)k))
				cls = r;
		if (cls < 0 && n_reps < MAX_CLASSES) {
			cls = n_reps;
			reps[n_reps++] = (uint32_t)k;
		}
		rt->unit_class[k] = cls;
	}
}

static int check_plans_templates(const kiln_rt *rt)
{
	uint64_t n_plans = rt->count[KILN_SEC_PLANS], n_tpl = rt->count[KILN_SEC_TEMPLATES];
	for (uint64_t a = 0; a < rt->count[KILN_SEC_ACTIONS]; a++)
		if (rt->actions[a] > KILN_RT_OFFLOAD)
			return KILN_RT_ECORRUPT;
	uint64_t next_action = 0;
	for (uint64_t p = 0; p < n_plans; p++) {
		const kiln_blob_plan *pl = &rt->plans[p];
		if (pl->set >= rt->count[KILN_SEC_SETS] || pl->reserved || pl->actions != next_action)
			return KILN_RT_ECORRUPT;
		uint32_t nu = rt->sets[pl->set].n_units;
		if (!range_ok(pl->actions, nu, rt->count[KILN_SEC_ACTIONS]))
			return KILN_RT_ECORRUPT;
		next_action += nu;
		if (pl->template_id != KILN_BLOB_NONE &&
		    (pl->template_id >= n_tpl || rt->templates[pl->template_id].plan != p))
			return KILN_RT_ECORRUPT;
	}
	if (next_action != rt->count[KILN_SEC_ACTIONS])
		return KILN_RT_ECORRUPT;
	uint64_t next_task = 0, next_dep = 0;
	for (uint64_t t = 0; t < n_tpl; t++) {
		const kiln_blob_template *tp = &rt->templates[t];
		if (tp->plan >= n_plans || rt->plans[tp->plan].template_id != t ||
		    tp->first_task != next_task || tp->first_dep != next_dep ||
		    tp->n_tasks > KILN_BLOB_MAX_INDEX ||
		    !range_ok(tp->first_task, tp->n_tasks, rt->count[KILN_SEC_TASKS]) ||
		    !range_ok(tp->first_dep, tp->n_deps, rt->count[KILN_SEC_DEPS]) ||
		    !finite_nonneg(tp->makespan_us) || !finite_nonneg(tp->serial_us) ||
		    !finite_nonneg(tp->base_us) || !finite_nonneg(tp->load_factor))
			return KILN_RT_ECORRUPT;
		next_task += tp->n_tasks;
		next_dep += tp->n_deps;
		uint32_t n_chunks = rt->sets[rt->plans[tp->plan].set].n_chunks;
		for (uint32_t i = 0; i < tp->n_tasks; i++)
			if (rt->tasks[tp->first_task + i] >= n_chunks)
				return KILN_RT_ECORRUPT;
		for (uint32_t j = 0; j < tp->n_deps; j++) {
			const kiln_blob_dep *d = &rt->deps[tp->first_dep + j];
			if (d->task >= tp->n_tasks || d->dep >= d->task)
				return KILN_RT_ECORRUPT;
		}
	}
	if (next_task != rt->count[KILN_SEC_TASKS] || next_dep != rt->count[KILN_SEC_DEPS])
		return KILN_RT_ECORRUPT;
	return 0;
}

/* Buckets ascend; tables' points ascend in saving and cost, fit in keep
 * bytes, and name plans over the same units. A table's points are either
 * the next fresh range of POINTS, checked in full, or exactly a range an
 * earlier table of the same unit class used, checked in O(1) (its last
 * saving against this table's keep bytes): so every point is checked once,
 * whatever the number of tables. src[t] receives the table whose range t
 * uses first (for build_luts); scratch holds 3 * TABLES entries. */
static int check_tables(const kiln_rt *rt, uint32_t *src, uint32_t *scratch)
{
	uint32_t nb = rt->meta->n_buckets;
	uint32_t *fr_first = scratch, *fr_n = scratch + rt->count[KILN_SEC_TABLES],
	         *fr_tab = scratch + 2 * rt->count[KILN_SEC_TABLES];
	uint64_t n_fresh = 0, next = 0;
	for (uint64_t k = 0; k < rt->count[KILN_SEC_SETS]; k++) {
		const kiln_blob_set *s = &rt->sets[k];
		for (uint32_t b = 0; b < nb; b++) {
			const kiln_blob_bucket *bk = &rt->buckets[k * nb + b];
			if (!(bk->load_factor > 0 &&
			      bk->load_factor <= rt->meta->max_factor * (1 + 1e-9)) ||
			    (b > 0 && !(bk->load_factor > bk[-1].load_factor)) ||
			    (b > 0 && bk->max_rows < bk[-1].max_rows) ||
			    (s->kind == KILN_BLOB_SET_DENSE && bk->max_rows))
				return KILN_RT_ECORRUPT;
			uint64_t ti = k * nb + b;
			const kiln_blob_table *t = &rt->tables[ti];
			if (t->quantum_bytes == 0 || t->n_points == 0 || t->n_points > UINT16_MAX ||
			    !range_ok(t->first_point, t->n_points, rt->count[KILN_SEC_POINTS]))
				return KILN_RT_ECORRUPT;
			uint64_t max_q = t->keep_bytes / t->quantum_bytes;
			if (t->first_point != next) {
				/* A repeat: binary search of the fresh ranges (ascending). */
				uint64_t lo = 0, hi = n_fresh;
				while (lo < hi) {
					uint64_t mid = (lo + hi) / 2;
					if (fr_first[mid] < t->first_point)
						lo = mid + 1;
					else
						hi = mid;
				}
				if (lo == n_fresh || fr_first[lo] != t->first_point ||
				    fr_n[lo] != t->n_points || rt->unit_class[k] < 0 ||
				    rt->unit_class[fr_tab[lo] / nb] != rt->unit_class[k] ||
				    rt->points[t->first_point + t->n_points - 1].saved_q > max_q)
					return KILN_RT_ECORRUPT;
				src[ti] = fr_tab[lo];
				continue;
			}
			fr_first[n_fresh] = t->first_point;
			fr_n[n_fresh] = t->n_points;
			fr_tab[n_fresh++] = (uint32_t)ti;
			src[ti] = (uint32_t)ti;
			next += t->n_points;
			for (uint32_t p = 0; p < t->n_points; p++) {
				const kiln_blob_point *pt = &rt->points[t->first_point + p];
				if (pt->reserved || pt->saved_q > max_q || pt->plan >= rt->count[KILN_SEC_PLANS] ||
				    !finite_nonneg(pt->exposed_us) ||
				    !same_units(rt, (uint32_t)k, rt->plans[pt->plan].set))
					return KILN_RT_ECORRUPT;
				if (p > 0 && (pt->saved_q <= pt[-1].saved_q || pt->exposed_us < pt[-1].exposed_us))
					return KILN_RT_ECORRUPT;
			}
		}
	}
	return next == rt->count[KILN_SEC_POINTS] ? 0 : KILN_RT_ECORRUPT;
}

/* GROUPS (1.1 on; docs/blob-format.md, "Groups"): one record per set, in
 * set order; a record names no plan and is otherwise zero, or names a plan
 * over the units of its set, which is an MoE set, with bytes that are
 * exactly its units' (kept: resident, the rest: saved; the transient at
 * least the saved bytes), fit_rows within the set's last bucket (1.1) or at
 * most the largest count a query carries (1.2: UINT32_MAX, since past the
 * last bucket it may be), and a finite, non-negative exposed line. Run
 * after the tables' checks. */
static int check_groups(const kiln_rt *rt)
{
	if (!rt->groups)
		return 0;
	uint64_t n_sets = rt->count[KILN_SEC_SETS], nb = rt->meta->n_buckets;
	uint16_t minor = ((const kiln_blob_header *)rt->base)->minor;
	if (rt->count[KILN_SEC_GROUPS] != n_sets)
		return KILN_RT_ECORRUPT;
	for (uint64_t k = 0; k < n_sets; k++) {
		const kiln_blob_group *g = &rt->groups[k];
		const kiln_blob_set *s = &rt->sets[k];
		if (g->set != k || !finite_nonneg(g->exposed_base_us) ||
		    !finite_nonneg(g->exposed_per_row_us))
			return KILN_RT_ECORRUPT;
		if (g->plan == KILN_BLOB_NONE) {
			if (g->fit_rows || g->resident_base_bytes || g->resident_per_row_bytes ||
			    g->saved_base_bytes || g->saved_per_row_bytes ||
			    g->transient_base_bytes || g->transient_per_row_bytes ||
			    g->exposed_base_us || g->exposed_per_row_us)
				return KILN_RT_ECORRUPT;
			continue;
		}
		if (s->kind != KILN_BLOB_SET_MOE || g->plan >= rt->count[KILN_SEC_PLANS] ||
		    !same_units(rt, (uint32_t)k, rt->plans[g->plan].set) ||
		    g->fit_rows > (minor == 1 ? rt->buckets[k * nb + nb - 1].max_rows : UINT32_MAX))
			return KILN_RT_ECORRUPT;
		const uint8_t *act = rt->actions + rt->plans[g->plan].actions;
		uint64_t rb = 0, rp = 0, sb = 0, sp = 0;
		for (uint32_t u = 0; u < s->n_units; u++) {
			const kiln_blob_unit *un = &rt->units[s->first_unit + u];
			int kept = act[u] == KILN_RT_KEEP;
			rb = kept ? kiln_rti_sat_add(rb, un->base_bytes) : rb;
			rp = kept ? kiln_rti_sat_add(rp, un->per_row_bytes) : rp;
			sb = kept ? sb : kiln_rti_sat_add(sb, un->base_bytes);
			sp = kept ? sp : kiln_rti_sat_add(sp, un->per_row_bytes);
		}
		if (rb != g->resident_base_bytes || rp != g->resident_per_row_bytes ||
		    sb != g->saved_base_bytes || sp != g->saved_per_row_bytes ||
		    g->transient_base_bytes < sb || g->transient_per_row_bytes < sp)
			return KILN_RT_ECORRUPT;
	}
	return 0;
}

/* select's lookup tables (internal.h). Entry j of a table over values
 * v[0..n) (ascending) is the first index whose value reaches
 * j * (v[n-1] + 1) / slots; select starts one entry below its computed slot
 * (so floating-point rounding can only start it early) and scans forward. */
static void build_lut(const void *base, size_t stride, size_t off, int wide, uint32_t n,
                      uint32_t shift, uint16_t *lut, double *scale)
{
	const unsigned char *p = base;
	uint64_t last;
	if (wide)
		memcpy(&last, p + (size_t)(n - 1) * stride + off, 8);
	else {
		uint32_t v;
		memcpy(&v, p + (size_t)(n - 1) * stride + off, 4);
		last = v;
	}
	uint32_t slots = 1u << shift; /* a power of two: shifts, not divisions */
	*scale = (double)slots / ((double)last + 1.0);
	/* low(j) = floor(j * (last + 1) / slots) in integers, without
	 * overflow: last = q * slots + r. */
	uint64_t q = last >> shift, r = last & (slots - 1);
	uint32_t i = 0;
	for (uint32_t j = 0; j <= slots; j++) {
		uint64_t low = kiln_rti_sat_add(kiln_rti_sat_mul(q, j), ((r + 1) * j) >> shift);
		for (;;) {
			uint64_t v;
			if (wide) {
				memcpy(&v, p + (size_t)i * stride + off, 8);
			} else {
				uint32_t w;
				memcpy(&w, p + (size_t)i * stride + off, 4);
				v = w;
			}
			if (v >= low || i == n - 1)
				break;
			i++;
		}
		lut[j] = (uint16_t)i;
	}
}

/* The fair scale (docs/runtime.md, step 5): room / want, the room
 * (capacity - static - the stage's largest transient) over ceil(inflight)
 * micro-batches at the steady bytes. A micro-batch's share is that
 * fraction of its steady bytes, an n-th of the room: above 1 where memory
 * is not short at the design load, so that a load above it keeps
 * everything while its n-th holds it; below 1 where the compiler's steady
 * plan (fitted beside its own transient) does not fit beside the largest,
 * so that the window splits what there is instead of leaving one
 * micro-batch in every window the rest. select never lets the room kept
 * for pending micro-batches grow past their steady bytes. */
static double fair_scale(const kiln_blob_stage *st)
{
	double room =
	    (double)st->capacity_bytes - (double)st->static_bytes - (double)st->transient_bytes;
	double want = (double)kiln_rti_inflight(st) * (double)st->steady_bytes;
	if (want <= 0)
		return 1;
	return room > 0 ? room / want : 0;
}

/* The knee of every point of one table (docs/runtime.md, step 7): the last
 * point whose exposed time is within KILN_RTI_KNEE of the table's largest
 * above the point's own, as an index in the table. Both ends move forward
 * only (exposed_us ascends), so one pass. */
static void build_knee(const kiln_blob_point *pts, uint32_t n, uint16_t *knee)
{
	double tol = KILN_RTI_KNEE * (double)pts[n - 1].exposed_us;
	uint32_t j = 0;
	for (uint32_t i = 0; i < n; i++) {
		double lim = (double)pts[i].exposed_us + tol;
		j = j < i ? i : j;
		while (j + 1 < n && (double)pts[j + 1].exposed_us <= lim)
			j++;
		knee[i] = (uint16_t)j;
	}
}

static int build_luts(kiln_rt *rt, const uint32_t *src)
{
	uint64_t n_sets = rt->count[KILN_SEC_SETS], n_tables = rt->count[KILN_SEC_TABLES];
	uint64_t n_stages = rt->meta->n_stages, n_points = rt->count[KILN_SEC_POINTS];
	uint32_t nb = rt->meta->n_buckets;
	size_t bytes =
	    sizeof(double) * (size_t)(n_sets + n_tables + n_stages) +
	    sizeof(uint16_t) * ((size_t)n_sets * (KILN_RTI_BUCKET_SLOTS + 1) +
	                        (size_t)n_tables * (KILN_RTI_POINT_SLOTS + 1) + (size_t)n_points);
	double *block = kiln_rti_alloc(bytes);
	if (!block)
		return KILN_RT_ENOMEM;
	rt->bucket_scale = block;
	rt->point_scale = block + n_sets;
	rt->fair_scale = block + n_sets + n_tables;
	rt->bucket_lut = (uint16_t *)(block + n_sets + n_tables + n_stages);
	for (uint64_t s = 0; s < n_stages; s++)
		rt->fair_scale[s] = fair_scale(&rt->stages[s]);
	rt->point_lut = rt->bucket_lut + n_sets * (KILN_RTI_BUCKET_SLOTS + 1);
	rt->point_knee = rt->point_lut + n_tables * (KILN_RTI_POINT_SLOTS + 1);
	for (uint64_t k = 0; k < n_sets; k++)
		build_lut(&rt->buckets[k * nb], sizeof(kiln_blob_bucket),
		          offsetof(kiln_blob_bucket, max_rows), 1, nb, KILN_RTI_BUCKET_SHIFT,
		          rt->bucket_lut + k * (KILN_RTI_BUCKET_SLOTS + 1), &rt->bucket_scale[k]);
	for (uint64_t t = 0; t < n_tables; t++) {
		const kiln_blob_table *tb = &rt->tables[t];
		if (src[t] != t) { /* the same points as an earlier table: the same lookup */
			memcpy(rt->point_lut + t * (KILN_RTI_POINT_SLOTS + 1),
			       rt->point_lut + (size_t)src[t] * (KILN_RTI_POINT_SLOTS + 1),
			       sizeof(uint16_t) * (KILN_RTI_POINT_SLOTS + 1));
			rt->point_scale[t] = rt->point_scale[src[t]];
			continue;
		}
		build_lut(&rt->points[tb->first_point], sizeof(kiln_blob_point),
		          offsetof(kiln_blob_point, saved_q), 0, tb->n_points, KILN_RTI_POINT_SHIFT,
		          rt->point_lut + t * (KILN_RTI_POINT_SLOTS + 1), &rt->point_scale[t]);
		/* Fresh ranges tile the points (check_tables). */
		build_knee(&rt->points[tb->first_point], tb->n_points,
		           rt->point_knee + tb->first_point);
	}
	return 0;
}

int kiln_rt_open(const void *blob, size_t size, kiln_rt **out)
{
	if (!out)
		return KILN_RT_EINVAL;
	*out = NULL;
	if (!blob || ((uintptr_t)blob % 8) != 0)
		return KILN_RT_EINVAL;
	if (size > KILN_BLOB_MAX_BYTES)
		return KILN_RT_ETRUNC;
	int rc = check_header(blob, size);
	if (rc)
		return rc;
	kiln_rt *rt = kiln_rti_alloc(sizeof *rt);
	if (!rt)
		return KILN_RT_ENOMEM;
	memset(rt, 0, sizeof *rt);
	rt->base = blob;
	rt->size = size;
	if ((rc = check_sections(rt)) != 0 || (rc = check_meta(rt)) != 0)
		goto fail;
	/* check_meta bounds both counts, so the product cannot overflow. */
	rt->layer_index = kiln_rti_alloc(sizeof(int32_t) * ((size_t)rt->meta->n_model_layers +
	                                                    (size_t)rt->count[KILN_SEC_SETS]));
	rt->acct = kiln_rti_alloc(sizeof *rt->acct);
	if (!rt->layer_index || !rt->acct) {
		rc = KILN_RT_ENOMEM;
		goto fail;
	}
	for (uint32_t i = 0; i < rt->meta->n_model_layers; i++)
		rt->layer_index[i] = -1;
	rt->unit_class = rt->layer_index + rt->meta->n_model_layers;
	if ((rc = check_sets_units(rt)) != 0)
		goto fail;
	classify_sets(rt);
	if ((rc = check_stages_layers(rt)) != 0 ||
	    (rc = check_plans_templates(rt)) != 0)
		goto fail;
	/* Scratch for the tables' checks: per table, its lookup's source and
	 * the fresh ranges (freed before returning). */
	uint32_t *tmp = kiln_rti_alloc(sizeof(uint32_t) * 4 * (size_t)rt->count[KILN_SEC_TABLES]);
	if (!tmp) {
		rc = KILN_RT_ENOMEM;
		goto fail;
	}
	rc = check_tables(rt, tmp, tmp + rt->count[KILN_SEC_TABLES]);
	if (rc == 0)
		rc = check_groups(rt);
	if (rc == 0)
		rc = build_luts(rt, tmp);
	kiln_rti_free(tmp);
	if (rc != 0)
		goto fail;
	atomic_init(&rt->acct->stage, -1);
	atomic_init(&rt->acct->limit_bytes, 0);
	atomic_init(&rt->acct->device_bytes, 0);
	atomic_init(&rt->acct->host_bytes, 0);
	atomic_init(&rt->acct->peak_bytes, 0);
	atomic_init(&rt->acct->open, 0);
	for (int i = 0; i < KILN_RTI_MB_SLOTS; i++) {
		atomic_init(&rt->acct->mb_device[i], 0);
		atomic_init(&rt->acct->mb_host[i], 0);
	}
	*out = rt;
	return 0;
fail:
	kiln_rti_free(rt->bucket_scale);
	kiln_rti_free(rt->layer_index);
	kiln_rti_free(rt->acct);
	kiln_rti_free(rt);
	return rc;
}

int kiln_rt_open_file(const char *path, kiln_rt **out)
{
	if (!out)
		return KILN_RT_EINVAL;
	*out = NULL;
	if (!path)
		return KILN_RT_EINVAL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return KILN_RT_EIO;
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return KILN_RT_EIO;
	}
	if (st.st_size == 0 || (uint64_t)st.st_size > KILN_BLOB_MAX_BYTES) {
		close(fd);
		return KILN_RT_ETRUNC;
	}
	size_t size = (size_t)st.st_size;
	void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (map == MAP_FAILED)
		return KILN_RT_EIO;
	int rc = kiln_rt_open(map, size, out);
	if (rc != 0) {
		munmap(map, size);
		return rc;
	}
	(*out)->map = map;
	(*out)->map_bytes = size;
	return 0;
}

void kiln_rt_close(kiln_rt *rt)
{
	if (!rt)
		return;
	if (rt->map)
		munmap(rt->map, rt->map_bytes);
	kiln_rti_free(rt->bucket_scale);
	kiln_rti_free(rt->layer_index);
	kiln_rti_free(rt->acct);
	kiln_rti_free(rt);
}
