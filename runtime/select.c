/* runtime/select.c: the post-gate decision and the read-only getters.
 *
 * Everything here reads a validated blob (runtime/open.c) and the atomic
 * accounting counters; nothing allocates, locks or waits.
 */
#include <string.h>

#include "internal.h"

static const kiln_blob_layer *layer_of(const kiln_rt *rt, int32_t model_layer)
{
	if (!rt || model_layer < 0 || (uint32_t)model_layer >= rt->meta->n_model_layers)
		return NULL;
	int32_t i = rt->layer_index[model_layer];
	return i < 0 ? NULL : &rt->layers[i];
}

/* A byte count computed in double, as uint64_t: 0 below 0 (and for NaN),
 * UINT64_MAX past 1.8e19 (no cast out of range). */
static uint64_t sat_bytes(double x)
{
	return x > 0 ? (x < 1.8e19 ? (uint64_t)x : UINT64_MAX) : 0;
}

/* The group's mode (docs/runtime.md, "Beyond the declared load"): 1 when
 * the query carries the EP group's rows and some rank of the group has more
 * rows at this layer than the set's fit_rows, so that every rank of the
 * group takes the fallback; 0 otherwise (no counts, a 1.0 blob, a dense
 * layer); KILN_RT_EINVAL for a count that is not one. A function of the
 * blob, the layer and the largest of the counts only: every rank of the
 * group, given the same counts in any order, returns the same. */
static int group_mode(const kiln_rt *rt, const kiln_query *q, const kiln_blob_layer *L,
                      uint64_t *out_max)
{
	*out_max = 0;
	if (!q->group_rows || q->group_size == 0)
		return 0;
	if (q->group_size < 0 || q->group_size > (1 << 20))
		return KILN_RT_EINVAL;
	uint32_t most = 0;
	for (int32_t r = 0; r < q->group_size; r++)
		most = q->group_rows[r] > most ? q->group_rows[r] : most;
	*out_max = most;
	if (!rt->groups)
		return 0;
	const kiln_blob_group *g = &rt->groups[L->set];
	return g->plan != KILN_BLOB_NONE && most > g->fit_rows;
}

/* Puts the set's fallback in *out (the adaptive decision's bucket, load
 * factor, need and avail stay): its bytes and exposed time at this rank's
 * rows (exact: the real bytes equal resident_bytes), OVER_BUDGET when they
 * do not fit this rank's avail, counting the part of the fallback's
 * backward transient beyond the stage's transient, which avail already
 * reserves. The flag is this rank's; the plan is the group's. */
static void group_substitute(const kiln_rt *rt, const kiln_blob_set *S, const kiln_blob_group *g,
                             uint64_t rows, uint64_t stage_transient, kiln_plan *out)
{
	const kiln_blob_plan *pl = &rt->plans[g->plan];
	uint64_t res = kiln_rti_sat_add(g->resident_base_bytes,
	                                kiln_rti_sat_mul(g->resident_per_row_bytes, rows));
	uint64_t tr = kiln_rti_sat_add(g->transient_base_bytes,
	                               kiln_rti_sat_mul(g->transient_per_row_bytes, rows));
	out->actions = rt->actions + pl->actions;
	out->n_units = (int32_t)S->n_units;
	out->plan = (int32_t)g->plan;
	out->template_id = pl->template_id == KILN_BLOB_NONE ? -1 : (int32_t)pl->template_id;
	out->resident_bytes = res;
	out->saved_bytes =
	    kiln_rti_sat_add(g->saved_base_bytes, kiln_rti_sat_mul(g->saved_per_row_bytes, rows));
	out->transient_bytes = tr;
	/* Finite and >= 0 (open checks both terms); past FLT_MAX a float
	 * conversion would be undefined. */
	double ex = g->exposed_base_us + g->exposed_per_row_us * (double)rows;
	out->exposed_us = ex < 3.0e38 ? (float)ex : 3.0e38f;
	out->flags = (out->flags & KILN_PLAN_LOAD_BEYOND) | KILN_PLAN_GROUP_FALLBACK;
	if (kiln_rti_sat_add(res, tr > stage_transient ? tr - stage_transient : 0) >
	    out->avail_bytes)
		out->flags |= KILN_PLAN_OVER_BUDGET;
}

/* What select decides with besides the table (docs/runtime.md, steps 4
 * and 5): free memory, the pending micro-batches, the deciding
 * micro-batch's held bytes, the reserve's base and the room kept for each
 * pending micro-batch on tries 0 and 1, and the stage's fair scale. */
typedef struct {
	uint64_t free_bytes, held_self, base, roomy;
	uint32_t pending;
	double share_scale;
} select_budget;

/* Steps 5 to 7 for table ti of layer L: the three tries, the first point
 * that saves what the try needs, and the knee. Returns the point's index
 * in the table, or n_points when no try fits (the caller takes the last
 * point, over budget); *need and *avail are the try's (the last try's
 * when none fits). */
static inline uint32_t choose_point(const kiln_rt *rt, const kiln_blob_stage *st,
                                    const kiln_blob_layer *L, size_t ti, const select_budget *c,
                                    uint64_t *need, uint64_t *avail)
{
	const kiln_blob_table *t = &rt->tables[ti];
	const uint16_t *plut = rt->point_lut + ti * (KILN_RTI_POINT_SLOTS + 1);
	const kiln_blob_point *pts = &rt->points[t->first_point];
	uint32_t last_q = pts[t->n_points - 1].saved_q, lo = t->n_points;
	int pass_used = 0;
	/* The share through this layer, with this layer's part scaled from
	 * load 1 to this bucket as the keep-everything bytes scale. */
	double part =
	    L->steady_keep_bytes
	        ? (double)L->steady_bytes * ((double)t->keep_bytes / (double)L->steady_keep_bytes)
	        : (double)L->steady_bytes;
	double fair = c->share_scale * ((double)(L->head_steady_bytes - L->steady_bytes) + part) -
	              (double)c->held_self;
	uint64_t share = sat_bytes(fair);
	*need = *avail = 0;
	for (int pass = 0; pass < 3; pass++) {
		if (pass == 2 && !c->pending)
			break;
		uint64_t reserve = kiln_rti_sat_add(
		    c->base, kiln_rti_sat_mul(c->pending, pass == 2 ? st->floor_bytes : c->roomy));
		*avail = c->free_bytes > reserve ? c->free_bytes - reserve : 0;
		if (pass == 0 && *avail > share)
			*avail = share;
		/* Bytes to save round up to the table's quantum; the first point
		 * that saves that much is the cheapest (points ascend in both). */
		*need = t->keep_bytes > *avail ? t->keep_bytes - *avail : 0;
		uint64_t need_q = *need / t->quantum_bytes + (*need % t->quantum_bytes != 0);
		if (need_q > last_q) {
			lo = t->n_points;
			continue;
		}
		/* The table's lookup entry one below the slot, then a scan. */
		uint32_t j = (uint32_t)((double)need_q * rt->point_scale[ti]);
		j = j > KILN_RTI_POINT_SLOTS ? KILN_RTI_POINT_SLOTS : j;
		lo = plut[j ? j - 1 : 0];
		while (pts[lo].saved_q < need_q)
			lo++;
		pass_used = pass;
		break;
	}
	/* The knee (docs/runtime.md, step 7): where this layer must save, or
	 * takes more than its share, what it keeps the micro-batch's later
	 * layers lack; it saves the most it can within a small fraction of
	 * the table's maximal-saving cost of the cheapest (each point's knee
	 * is found at open). */
	if (lo < t->n_points && (*need || pass_used))
		lo = rt->point_knee[t->first_point + lo];
	return lo;
}

/* The bucket of rows in set S (load rounds up: the first bucket whose
 * largest row count holds rows; the last past it, with LOAD_BEYOND added
 * to *flags). */
static inline uint32_t bucket_of(const kiln_rt *rt, uint32_t set, uint64_t rows, uint32_t *flags)
{
	uint32_t nb = rt->meta->n_buckets;
	const kiln_blob_bucket *bk = &rt->buckets[(size_t)set * nb];
	if (rows > bk[nb - 1].max_rows) {
		*flags |= KILN_PLAN_LOAD_BEYOND;
		return nb - 1;
	}
	/* An index into the set's lookup table, one entry early, then a short
	 * scan (open.c, build_lut). */
	uint32_t j = (uint32_t)((double)rows * rt->bucket_scale[set]);
	j = j > KILN_RTI_BUCKET_SLOTS ? KILN_RTI_BUCKET_SLOTS : j;
	uint32_t b = rt->bucket_lut[(size_t)set * (KILN_RTI_BUCKET_SLOTS + 1) + (j ? j - 1 : 0)];
	while (bk[b].max_rows < rows)
		b++;
	return b;
}

int kiln_rt_select(const kiln_rt *rt, const kiln_query *q, kiln_plan *out)
{
	if (!rt || !q || !out)
		return KILN_RT_EINVAL;
	if (q->stage < 0 || (uint32_t)q->stage >= rt->meta->n_stages)
		return KILN_RT_ERANGE;
	const kiln_blob_layer *L = layer_of(rt, q->layer);
	if (!L || rt->sets[L->set].stage != (uint32_t)q->stage)
		return KILN_RT_ERANGE;
	const kiln_blob_set *S = &rt->sets[L->set];
	const kiln_blob_stage *st = &rt->stages[q->stage];
	uint64_t group_max;
	int fallback = group_mode(rt, q, L, &group_max);
	if (fallback < 0)
		return fallback;

	uint64_t rows = q->total_rows;
	if (q->tokens) {
		if (q->n_tokens < 0 || q->n_tokens > (1 << 20))
			return KILN_RT_EINVAL;
		rows = 0;
		for (int32_t i = 0; i < q->n_tokens; i++)
			rows += q->tokens[i];
	}

	uint32_t nb = rt->meta->n_buckets, flags = 0, b = 0;
	double lf = 0;
	if (S->balanced_rows) {
		lf = (double)rows / (double)S->balanced_rows;
		b = bucket_of(rt, L->set, rows, &flags);
	}

	/* Free memory, and what must stay free for later work: the floor of
	 * this micro-batch's later layers, the backward transient, and room for
	 * the micro-batches that start before memory is next freed. */
	uint64_t free_bytes = q->free_bytes;
	uint32_t pending = q->pending;
	uint64_t held_self = q->held_bytes;
	if (free_bytes == KILN_RT_FREE_FROM_ACCOUNTING) {
		if (atomic_load(&rt->acct->stage) != q->stage)
			return KILN_RT_EINVAL;
		uint64_t limit = atomic_load(&rt->acct->limit_bytes);
		uint64_t held = atomic_load(&rt->acct->device_bytes);
		uint32_t open = atomic_load(&rt->acct->open);
		free_bytes = limit > held ? limit - held : 0;
		/* The deciding micro-batch is one of the inflight even before
		 * it has recorded anything. */
		uint32_t s = q->microbatch % KILN_RTI_MB_SLOTS;
		uint32_t self = !atomic_load(&rt->acct->mb_device[s]) && !atomic_load(&rt->acct->mb_host[s]);
		uint32_t counted = open + self, inflight = kiln_rti_inflight(st);
		pending = inflight > counted ? inflight - counted : 0;
		held_self = atomic_load(&rt->acct->mb_device[s]);
	}
	/* Three tries, each a lookup (docs/runtime.md, "Reserve and avail"):
	 * 0. fair: the micro-batch keeps to its share, an n-th of the room
	 *    spread over the layers as the steady plan's bytes through this
	 *    layer (head_steady_bytes), less what it holds, so that
	 *    1F1B's steady state does not alternate between micro-batches that
	 *    grab free memory and micro-batches left short; pending ones are
	 *    kept room for their steady plan (the share scaled by the fair
	 *    scale, the pending room by at most 1, below);
	 * 1. the share dropped (a spike may use whatever is free);
	 * 2. pending micro-batches kept only their floor, all they need to be
	 *    safe. */
	select_budget c = {.free_bytes = free_bytes,
	                   .held_self = held_self,
	                   .base = kiln_rti_sat_add(L->tail_floor_bytes, st->transient_bytes),
	                   .pending = pending,
	                   /* The fair scale (open.c, fair_scale): the share is an
	                    * n-th of the room; the room kept for pending
	                    * micro-batches shrinks with it where the stage cannot
	                    * hold its window at the steady plan beside the largest
	                    * transient, and never grows. */
	                   .share_scale = rt->fair_scale[q->stage]};
	double scale = c.share_scale < 1 ? c.share_scale : 1;
	/* Below 1 the product is below 2^64 (no cast out of range). */
	uint64_t steady =
	    scale >= 1 ? st->steady_bytes : (uint64_t)((double)st->steady_bytes * scale);
	c.roomy = steady > st->floor_bytes ? steady : st->floor_bytes;
	size_t ti = (size_t)L->set * nb + b;
	const kiln_blob_table *t = &rt->tables[ti];
	const kiln_blob_point *pts = &rt->points[t->first_point];
	uint64_t avail, need;
	uint32_t lo = choose_point(rt, st, L, ti, &c, &need, &avail);
	if (lo == t->n_points) {
		lo = t->n_points - 1;
		flags |= KILN_PLAN_OVER_BUDGET;
	} else if (!fallback && S->balanced_rows && group_max > rows) {
		/* Step 8, the group's slowest rank (docs/runtime.md): a layer
		 * takes as long as the group's slowest rank, so exposed time up
		 * to what the group's most loaded rank takes costs the group
		 * nothing. That rank's decision, by steps 3 to 7 at its rows
		 * with this rank's free memory, bounds the exposure; this rank
		 * saves the most it can within it. */
		uint64_t n2, a2;
		uint32_t beyond2 = 0; /* the most loaded rank's flag, not this rank's */
		size_t to = (size_t)L->set * nb + bucket_of(rt, L->set, group_max, &beyond2);
		select_budget c2 = c;
		/* That rank's micro-batch is taken to hold its fair share
		 * through the earlier layers: what this rank's micro-batch
		 * holds beyond it is this rank's own history, not the group's
		 * (it counts as free there). */
		double fh = c.share_scale * (double)(L->head_steady_bytes - L->steady_bytes);
		double f2 = (double)free_bytes + (double)held_self - fh;
		c2.held_self = sat_bytes(fh);
		c2.free_bytes = sat_bytes(f2);
		uint32_t p2 = choose_point(rt, st, L, to, &c2, &n2, &a2);
		const kiln_blob_table *t2 = &rt->tables[to];
		float bound =
		    rt->points[t2->first_point + (p2 < t2->n_points ? p2 : t2->n_points - 1)]
		        .exposed_us;
		if (bound > pts[lo].exposed_us) {
			uint32_t from = lo;
			while (lo + 1 < t->n_points && pts[lo + 1].exposed_us <= bound)
				lo++;
			if (lo != from)
				flags |= KILN_PLAN_GROUP_SLACK;
		}
	}
	const kiln_blob_point *p = &pts[lo];
	const kiln_blob_plan *pl = &rt->plans[p->plan];
	uint64_t saved = (uint64_t)p->saved_q * t->quantum_bytes;
	*out = (kiln_plan){
	    .actions = rt->actions + pl->actions,
	    .n_units = (int32_t)S->n_units,
	    .plan = (int32_t)p->plan,
	    .template_id = pl->template_id == KILN_BLOB_NONE ? -1 : (int32_t)pl->template_id,
	    .bucket = (int32_t)b,
	    .load_factor = lf,
	    .need_bytes = need,
	    .saved_bytes = saved,
	    .resident_bytes = t->keep_bytes - saved,
	    .avail_bytes = avail,
	    .exposed_us = p->exposed_us,
	    .flags = flags,
	    .group_max_rows = group_max,
	};
	if (fallback)
		group_substitute(rt, S, &rt->groups[L->set], rows, st->transient_bytes, out);
	return 0;
}

/* ---------------------------------------------------------------- getters */

void kiln_rt_info_get(const kiln_rt *rt, kiln_rt_info *out)
{
	if (!out)
		return;
	if (!rt) {
		*out = (kiln_rt_info){0};
		return;
	}
	const kiln_blob_meta *m = rt->meta;
	const kiln_blob_header *h = (const kiln_blob_header *)rt->base;
	*out = (kiln_rt_info){
	    .model = rt->strings + m->model_name,
	    .compiler = rt->strings + m->compiler,
	    .model_hash = m->model_hash,
	    .major = h->major,
	    .minor = h->minor,
	    .n_stages = (int32_t)m->n_stages,
	    .n_layers = (int32_t)m->n_layers,
	    .n_model_layers = (int32_t)m->n_model_layers,
	    .n_buckets = (int32_t)m->n_buckets,
	    .max_factor = m->max_factor,
	    .blob_bytes = rt->size,
	};
}

int kiln_rt_stage_get(const kiln_rt *rt, int32_t stage, kiln_rt_stage_info *out)
{
	if (!rt || !out)
		return KILN_RT_EINVAL;
	if (stage < 0 || (uint32_t)stage >= rt->meta->n_stages)
		return KILN_RT_ERANGE;
	const kiln_blob_stage *s = &rt->stages[stage];
	*out = (kiln_rt_stage_info){
	    .capacity_bytes = s->capacity_bytes,
	    .static_bytes = s->static_bytes,
	    .fixed_bytes = s->fixed_bytes,
	    .budget_bytes = s->budget_bytes,
	    .steady_bytes = s->steady_bytes,
	    .floor_bytes = s->floor_bytes,
	    .transient_bytes = s->transient_bytes,
	    .inflight = s->inflight,
	    .safety_factor = s->safety_factor,
	    .n_layers = (int32_t)s->n_layers,
	};
	return 0;
}

int kiln_rt_layer_get(const kiln_rt *rt, int32_t model_layer, kiln_rt_layer_info *out)
{
	if (!out)
		return KILN_RT_EINVAL;
	const kiln_blob_layer *L = layer_of(rt, model_layer);
	if (!L)
		return rt ? KILN_RT_ERANGE : KILN_RT_EINVAL;
	const kiln_blob_set *S = &rt->sets[L->set];
	*out = (kiln_rt_layer_info){
	    .model_layer = model_layer,
	    .stage = (int32_t)S->stage,
	    .position = (int32_t)((size_t)(L - rt->layers) - rt->stages[S->stage].first_layer),
	    .moe = S->kind == KILN_BLOB_SET_MOE,
	    .n_units = (int32_t)S->n_units,
	    .balanced_rows = S->balanced_rows,
	    .tail_floor_bytes = L->tail_floor_bytes,
	    .head_steady_bytes = L->head_steady_bytes,
	    .steady_bytes = L->steady_bytes,
	    .steady_keep_bytes = L->steady_keep_bytes,
	};
	return 0;
}

static const kiln_blob_unit *unit_of(const kiln_rt *rt, int32_t model_layer, int32_t unit)
{
	const kiln_blob_layer *L = layer_of(rt, model_layer);
	if (!L || unit < 0 || (uint32_t)unit >= rt->sets[L->set].n_units)
		return NULL;
	return &rt->units[rt->sets[L->set].first_unit + (uint32_t)unit];
}

int kiln_rt_unit_get(const kiln_rt *rt, int32_t model_layer, int32_t unit, kiln_rt_unit_info *out)
{
	if (!rt || !out)
		return KILN_RT_EINVAL;
	const kiln_blob_unit *u = unit_of(rt, model_layer, unit);
	if (!u)
		return KILN_RT_ERANGE;
	*out = (kiln_rt_unit_info){.name = rt->strings + u->name,
	                           .flags = u->flags,
	                           .base_bytes = u->base_bytes,
	                           .per_row_bytes = u->per_row_bytes};
	return 0;
}

uint64_t kiln_rt_unit_bytes(const kiln_rt *rt, int32_t model_layer, int32_t unit, uint64_t rows)
{
	const kiln_blob_unit *u = rt ? unit_of(rt, model_layer, unit) : NULL;
	return u ? kiln_rti_sat_add(u->base_bytes, kiln_rti_sat_mul(u->per_row_bytes, rows)) : 0;
}

/* ---------------------------------------------------------------- templates */

int kiln_rt_template_get(const kiln_rt *rt, int32_t template_id, kiln_rt_template_info *out)
{
	if (!rt || !out)
		return KILN_RT_EINVAL;
	if (template_id < 0 || (uint64_t)template_id >= rt->count[KILN_SEC_TEMPLATES])
		return KILN_RT_ERANGE;
	const kiln_blob_template *t = &rt->templates[template_id];
	*out = (kiln_rt_template_info){.plan = (int32_t)t->plan,
	                               .n_tasks = t->n_tasks,
	                               .n_deps = t->n_deps,
	                               .makespan_us = t->makespan_us,
	                               .serial_us = t->serial_us,
	                               .base_us = t->base_us,
	                               .load_factor = t->load_factor};
	return 0;
}

int kiln_rt_template_task(const kiln_rt *rt, int32_t template_id, int32_t i, kiln_rt_task *out)
{
	if (!rt || !out)
		return KILN_RT_EINVAL;
	if (template_id < 0 || (uint64_t)template_id >= rt->count[KILN_SEC_TEMPLATES])
		return KILN_RT_ERANGE;
	const kiln_blob_template *t = &rt->templates[template_id];
	if (i < 0 || i >= t->n_tasks)
		return KILN_RT_ERANGE;
	const kiln_blob_set *S = &rt->sets[rt->plans[t->plan].set];
	const kiln_blob_chunk *c = &rt->chunks[S->first_chunk + rt->tasks[t->first_task + (uint32_t)i]];
	*out = (kiln_rt_task){.name = rt->strings + c->name,
	                      .stream = c->stream,
	                      .kind = c->kind,
	                      .chain = c->chain,
	                      .unit = c->unit == KILN_BLOB_NO_UNIT ? -1 : c->unit};
	return 0;
}

int kiln_rt_template_dep(const kiln_rt *rt, int32_t template_id, int32_t j, int32_t *out_task,
                         int32_t *out_dep)
{
	if (!rt || !out_task || !out_dep)
		return KILN_RT_EINVAL;
	if (template_id < 0 || (uint64_t)template_id >= rt->count[KILN_SEC_TEMPLATES])
		return KILN_RT_ERANGE;
	const kiln_blob_template *t = &rt->templates[template_id];
	if (j < 0 || j >= t->n_deps)
		return KILN_RT_ERANGE;
	*out_task = rt->deps[t->first_dep + (uint32_t)j].task;
	*out_dep = rt->deps[t->first_dep + (uint32_t)j].dep;
	return 0;
}

/* ---------------------------------------------------------------- tables and plans */

static const kiln_blob_table *table_of(const kiln_rt *rt, int32_t model_layer, int32_t bucket,
                                       const kiln_blob_bucket **out_bucket)
{
	const kiln_blob_layer *L = layer_of(rt, model_layer);
	if (!L || bucket < 0 || (uint32_t)bucket >= rt->meta->n_buckets)
		return NULL;
	size_t i = (size_t)L->set * rt->meta->n_buckets + (size_t)bucket;
	*out_bucket = &rt->buckets[i];
	return &rt->tables[i];
}

int kiln_rt_table_get(const kiln_rt *rt, int32_t model_layer, int32_t bucket,
                      kiln_rt_table_info *out)
{
	if (!rt || !out)
		return KILN_RT_EINVAL;
	const kiln_blob_bucket *bk;
	const kiln_blob_table *t = table_of(rt, model_layer, bucket, &bk);
	if (!t)
		return KILN_RT_ERANGE;
	*out = (kiln_rt_table_info){.load_factor = bk->load_factor,
	                            .max_rows = bk->max_rows,
	                            .quantum_bytes = t->quantum_bytes,
	                            .keep_bytes = t->keep_bytes,
	                            .n_points = (int32_t)t->n_points};
	return 0;
}

int kiln_rt_point_get(const kiln_rt *rt, int32_t model_layer, int32_t bucket, int32_t i,
                      kiln_rt_point *out)
{
	if (!rt || !out)
		return KILN_RT_EINVAL;
	const kiln_blob_bucket *bk;
	const kiln_blob_table *t = table_of(rt, model_layer, bucket, &bk);
	if (!t || i < 0 || (uint32_t)i >= t->n_points)
		return KILN_RT_ERANGE;
	const kiln_blob_point *p = &rt->points[t->first_point + (uint32_t)i];
	*out = (kiln_rt_point){.saved_bytes = (uint64_t)p->saved_q * t->quantum_bytes,
	                       .exposed_us = p->exposed_us,
	                       .plan = (int32_t)p->plan};
	return 0;
}

int kiln_rt_plan_get(const kiln_rt *rt, int32_t plan, const uint8_t **out_actions,
                     int32_t *out_n_units, int32_t *out_template)
{
	if (!rt || !out_actions || !out_n_units || !out_template)
		return KILN_RT_EINVAL;
	if (plan < 0 || (uint64_t)plan >= rt->count[KILN_SEC_PLANS])
		return KILN_RT_ERANGE;
	const kiln_blob_plan *p = &rt->plans[plan];
	*out_actions = rt->actions + p->actions;
	*out_n_units = (int32_t)rt->sets[p->set].n_units;
	*out_template = p->template_id == KILN_BLOB_NONE ? -1 : (int32_t)p->template_id;
	return 0;
}

int32_t kiln_rt_plan_count(const kiln_rt *rt)
{
	return rt ? (int32_t)rt->count[KILN_SEC_PLANS] : 0;
}

int32_t kiln_rt_template_count(const kiln_rt *rt)
{
	return rt ? (int32_t)rt->count[KILN_SEC_TEMPLATES] : 0;
}

int kiln_rt_group_get(const kiln_rt *rt, int32_t model_layer, kiln_rt_group_info *out)
{
	if (!out)
		return KILN_RT_EINVAL;
	const kiln_blob_layer *L = layer_of(rt, model_layer);
	if (!L)
		return rt ? KILN_RT_ERANGE : KILN_RT_EINVAL;
	*out = (kiln_rt_group_info){.plan = -1};
	const kiln_blob_group *g = rt->groups ? &rt->groups[L->set] : NULL;
	if (!g || g->plan == KILN_BLOB_NONE)
		return 0;
	*out = (kiln_rt_group_info){.plan = (int32_t)g->plan,
	                            .fit_rows = g->fit_rows,
	                            .resident_base_bytes = g->resident_base_bytes,
	                            .resident_per_row_bytes = g->resident_per_row_bytes,
	                            .saved_base_bytes = g->saved_base_bytes,
	                            .saved_per_row_bytes = g->saved_per_row_bytes,
	                            .transient_base_bytes = g->transient_base_bytes,
	                            .transient_per_row_bytes = g->transient_per_row_bytes,
	                            .exposed_base_us = g->exposed_base_us,
	                            .exposed_per_row_us = g->exposed_per_row_us};
	return 0;
}
