/* sim/oracle.c: the clairvoyant oracle policy (docs/simulator.md, "The
 * oracle").
 *
 * The oracle knows every load of the iteration before it starts. On each
 * followed rank and stage it chooses every micro-batch's plans at once,
 * from the same plan tables kiln's runtime chooses from (the compilation's
 * tables, whose frontiers the blob carries), priced and sized exactly as
 * the simulator prices and sizes kiln's choices (sim/price.c: the plan's
 * scheduled exposed time at its load bucket, cached per frontier point;
 * its bytes at the actual rows, rounded up to whole bytes), and under the
 * memory check sim/sim.c applies to every policy: after micro-batch i's
 * last layer on the stage the device holds
 *
 *   static + sum_{j = i-W+1}^{i-1} H_j + H_i + T_i <= capacity,
 *
 * H_j the bytes micro-batch j holds (the stage's fixed bytes plus every
 * layer's resident bytes), T_i the largest backward transient of i's
 * layers, W the stage's in-flight window.
 *
 * 1. One micro-batch: its supported points. Every combination of one
 *    table point per layer has (H, T, E), E the summed exposed time. The
 *    full Pareto set is exact but large (tens of thousands of states for
 *    four layers of 65 points on tiny: a 3-D DP over the layers,
 *    micro_pareto, kept for kiln_sim_oracle_micro and its brute-force
 *    test). The oracle chooses among the supported points instead: per
 *    layer the lower convex hull of (resident, time), and the hull edges
 *    of every layer taken in order of falling time saved per byte. Each
 *    point minimises E + lambda * H over every combination for some
 *    lambda >= 0, hence (Lagrangian sufficiency) no combination holding at
 *    most its H takes less time: exact at those H, tested against brute
 *    force. Between two of them a non-convex combination may be missed.
 *    O(L * P) per micro-batch (L layers, P table points).
 * 2. The micro-batches together. The window couples each micro-batch to
 *    the W - 1 before it; an exact optimum over all of them is a dynamic
 *    program whose state is the last W - 1 choices, exponential in W
 *    (16 on the first stage of deepseek-v3-671b). The oracle instead
 *    takes (a) the best common cap h: every micro-batch takes its least-
 *    time supported point with H <= h (the smallest H among equals), and h is
 *    the largest cap under which every check holds, which is the best such
 *    h because every micro-batch's time is non-increasing in h (found by
 *    bisection on the checks without transients, which are monotone in h,
 *    then by stepping down through the points' H until the checks
 *    with transients hold); then (b) coordinate descent: each micro-batch
 *    in turn takes its least-time point within the room every check it
 *    enters leaves it, given everyone else's choice, until a pass changes
 *    nothing (at most KILN_ORACLE_PASSES passes). Every move keeps every
 *    check, so the result fits whenever the start does; with no common cap
 *    feasible, every micro-batch takes its smallest H + T (the least any
 *    policy on these tables can hold) and the simulator counts the
 *    failure. Exact within one micro-batch; across micro-batches the best
 *    common cap improved to a local optimum, not the exponential DP.
 *
 * Costs: per (rank, stage) O(m * L * P * L) for the supported points and
 * O(m * (W^2 + L * P)) per pass; docs/simulator.md gives the measured CPU
 * per iteration.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"
#include "sim/sim.h"

/* Coordinate-descent passes at most (each a strict improvement). */
#define KILN_ORACLE_PASSES 8

/* One table point as the simulator prices it. */
typedef struct opoint {
	double res_base, res_per_n, tr_base, tr_per_n;
	double exposed_us, recompute_us;
} opoint;

/* One (H, T, E) state of a micro-batch prefix; parent indexes the
 * previous layer's states, point the layer's candidate. */
typedef struct ostate {
	double h, t, e;
	int32_t parent, point;
} ostate;

/* One layer's candidate at its rows. */
typedef struct ocand {
	double r, t, e, rec;
} ocand;

/* A growable array. */
typedef struct obuf {
	void *p;
	size_t n, cap, size;
} obuf;

struct kiln_sim_oracle {
	const kiln_compilation *c;
	/* Per (frontier, frontier point) the cost, NAN until computed at the
	 * bucket of first use (as sim/policy.c caches kiln's). */
	opoint **costs;
	/* Per layer level of a micro-batch: its candidates and states. */
	obuf *cands, *states;
	int32_t n_levels;
	obuf tmp;    /* merge candidates */
	obuf pareto; /* per micro-batch: its final Pareto set, concatenated */
	obuf begin;  /* per micro-batch: offset into pareto (m + 1) */
	obuf best;   /* per Pareto point: prefix argmin of E */
	obuf pick;   /* per micro-batch: chosen Pareto index (absolute) */
	obuf paths;  /* per Pareto point and layer: its candidate (backtracked) */
	obuf hull;   /* per layer: its hull vertices */
	obuf edges;  /* a micro-batch's hull edges */
	obuf tmpch;  /* micro_path's states' choices */
	obuf lcands; /* per micro-batch and layer: its candidates, flattened */
	obuf lbegin; /* offsets into lcands */
};

static int obuf_reserve(obuf *b, size_t n, size_t size)
{
	b->size = size;
	if (n <= b->cap)
		return 0;
	size_t cap = b->cap ? b->cap : 64;
	while (cap < n)
		cap *= 2;
	void *p = realloc(b->p, cap * size);
	if (!p)
		return -1;
	b->p = p;
	b->cap = cap;
	return 0;
}

int kiln_sim_oracle_new(const kiln_compilation *c, kiln_arena *a, FILE *err, kiln_sim_oracle **out)
{
	*out = NULL;
	if (!c->pool || !c->tables || c->n_buckets < 1) {
		fprintf(err, "kilnc: error: simulate: policy oracle needs the plan tables\n");
		return -1;
	}
	kiln_sim_oracle *o = kiln_arena_alloc(a, sizeof *o);
	if (!o)
		return -1;
	memset(o, 0, sizeof *o);
	o->c = c;
	o->costs = kiln_arena_alloc(a, sizeof(opoint *) * (size_t)(c->pool->n_frontiers + 1));
	if (!o->costs)
		return -1;
	memset(o->costs, 0, sizeof(opoint *) * (size_t)(c->pool->n_frontiers + 1));
	*out = o;
	return 0;
}

void kiln_sim_oracle_free(kiln_sim_oracle *o)
{
	if (!o)
		return;
	for (int32_t i = 0; i <= o->c->pool->n_frontiers; i++)
		free(o->costs[i]);
	for (int32_t l = 0; l < o->n_levels; l++) {
		free(o->cands[l].p);
		free(o->states[l].p);
	}
	free(o->cands);
	free(o->states);
	obuf *bufs[] = {&o->tmp,    &o->pareto, &o->begin, &o->best,  &o->pick, &o->paths,
	                &o->lcands, &o->lbegin, &o->hull,  &o->edges, &o->tmpch};
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		free(bufs[i]->p);
}

/* The cost of table point k of t (set `set`, bucket b), NULL on failure. */
static const opoint *point_of(kiln_sim_oracle *o, int32_t set, int32_t b, const kiln_plan_table *t,
                              int32_t k)
{
	int32_t fid = t->frontier_id, plan = t->plan[k];
	if (plan < 0 || plan >= o->c->pool->n)
		return NULL;
	if (!o->costs[fid]) {
		o->costs[fid] = malloc(sizeof(opoint) * (size_t)t->frontier->n_points);
		if (!o->costs[fid])
			return NULL;
		for (int32_t i = 0; i < t->frontier->n_points; i++)
			o->costs[fid][i].exposed_us = NAN;
	}
	opoint *pt = &o->costs[fid][t->point[k]];
	if (isnan(pt->exposed_us)) {
		const uint8_t *act = o->c->pool->actions[plan];
		double ex, serial, rec;
		if (kiln_sim_plan_cost(o->c, set, b, act, &ex, &serial, &rec) != 0)
			return NULL;
		kiln_sim_plan_form f;
		kiln_sim_plan_form_of(o->c, set, act, &f);
		pt->res_base = f.res_base, pt->res_per_n = f.res_per_n;
		pt->tr_base = f.tr_base, pt->tr_per_n = f.tr_per_n;
		pt->recompute_us = rec;
		pt->exposed_us = ex;
	}
	return pt;
}

static int by_re(const void *a, const void *b)
{
	const ocand *x = a, *y = b;
	if (x->r != y->r)
		return x->r < y->r ? -1 : 1;
	if (x->e != y->e)
		return x->e < y->e ? -1 : 1;
	return (x->t > y->t) - (x->t < y->t);
}

/* Layer l's candidates at n rows of set `set` into cands: every table
 * point, sorted by (resident, time, transient). Returns the count, -1 on
 * failure. */
static int32_t layer_cands(kiln_sim_oracle *o, int32_t set, double n, obuf *cands)
{
	const kiln_compilation *c = o->c;
	double r;
	if (c->sets[set].kind != KILN_LAYER_MOE)
		n = 0;
	int32_t b = kiln_sim_policy_bucket(c, set, n, &r);
	const kiln_plan_table *t = kiln_plan_table_of(c, set, b);
	if (obuf_reserve(cands, (size_t)t->n_points + 1, sizeof(ocand)) != 0)
		return -1;
	ocand *cs = cands->p;
	int32_t nc = 0;
	for (int32_t k = 0; k < t->n_points; k++) {
		const opoint *pt = point_of(o, set, b, t, k);
		if (!pt)
			return -1;
		/* Whole bytes, as sim/policy.c's fill rounds them. */
		ocand x = {.r = ceil(pt->res_base + pt->res_per_n * n - 1e-6),
		           .t = ceil(pt->tr_base + pt->tr_per_n * n - 1e-6),
		           .e = pt->exposed_us,
		           .rec = pt->recompute_us};
		/* In order of (resident, time, transient) by insertion: the
		 * table lists points by ascending saving at the bucket's rows,
		 * so taken from the last they are nearly in order already. */
		cs[nc++] = x;
	}
	for (int32_t a = 0, z = nc - 1; a < z; a++, z--) {
		ocand x = cs[a];
		cs[a] = cs[z];
		cs[z] = x;
	}
	for (int32_t k = 1; k < nc; k++) {
		ocand x = cs[k];
		int32_t j = k;
		while (j > 0 && by_re(&x, &cs[j - 1]) < 0) {
			cs[j] = cs[j - 1];
			j--;
		}
		cs[j] = x;
	}
	cands->n = (size_t)nc;
	return nc;
}

static int by_hte(const void *a, const void *b)
{
	const ostate *x = a, *y = b;
	if (x->h != y->h)
		return x->h < y->h ? -1 : 1;
	if (x->e != y->e)
		return x->e < y->e ? -1 : 1;
	if (x->t != y->t)
		return x->t < y->t ? -1 : 1;
	return (x->parent > y->parent) - (x->parent < y->parent);
}

/* Sorts s[0 .. n) by (H, E, T) and keeps those no other dominates; returns
 * the count kept, in that order. */
static size_t prune(ostate *s, size_t n)
{
	qsort(s, n, sizeof *s, by_hte);
	size_t keep = 0;
	for (size_t i = 0; i < n; i++) {
		int dominated = 0;
		/* Every kept state has H <= s[i].h (sorted). */
		for (size_t j = keep; j-- > 0 && !dominated;)
			dominated = s[j].e <= s[i].e && s[j].t <= s[i].t;
		if (!dominated)
			s[keep++] = s[i];
	}
	return keep;
}

static int ensure_levels(kiln_sim_oracle *o, int32_t n)
{
	if (n <= o->n_levels)
		return 0;
	obuf *c = realloc(o->cands, sizeof(obuf) * (size_t)n);
	if (!c)
		return -1;
	o->cands = c;
	obuf *s = realloc(o->states, sizeof(obuf) * (size_t)n);
	if (!s)
		return -1;
	o->states = s;
	for (int32_t l = o->n_levels; l < n; l++)
		memset(&o->cands[l], 0, sizeof(obuf)), memset(&o->states[l], 0, sizeof(obuf));
	o->n_levels = n;
	return 0;
}

/* The Pareto set of one micro-batch (rows[l] for layer l of sets[l], -1
 * unplanned), starting from fixed bytes: the states of the last planned
 * layer, in o->states[last]; *out_last its level (-1: no planned layer,
 * one state (fixed, 0, 0) in o->tmp). Returns the count, -1 on failure. */
static int64_t micro_pareto(kiln_sim_oracle *o, int32_t n_layers, const int32_t *sets,
                            const double *rows, double fixed, int32_t *out_last)
{
	if (ensure_levels(o, n_layers + 1) != 0)
		return -1;
	int32_t prev = -1;
	size_t n_prev = 1;
	for (int32_t l = 0; l < n_layers; l++) {
		if (sets[l] < 0)
			continue;
		int32_t nc = layer_cands(o, sets[l], rows[l], &o->cands[l]);
		if (nc < 0)
			return -1;
		size_t n_new = n_prev * (size_t)nc;
		if (obuf_reserve(&o->states[l], n_new, sizeof(ostate)) != 0)
			return -1;
		ostate *ns = o->states[l].p;
		const ocand *cs = o->cands[l].p;
		const ostate *ps = prev >= 0 ? o->states[prev].p : NULL;
		size_t k = 0;
		for (size_t a = 0; a < n_prev; a++) {
			double h = ps ? ps[a].h : fixed, t = ps ? ps[a].t : 0, e = ps ? ps[a].e : 0;
			for (int32_t j = 0; j < nc; j++)
				ns[k++] = (ostate){.h = h + cs[j].r,
				                   .t = cs[j].t > t ? cs[j].t : t,
				                   .e = e + cs[j].e,
				                   .parent = (int32_t)a,
				                   .point = j};
		}
		n_prev = prune(ns, k);
		o->states[l].n = n_prev;
		prev = l;
	}
	*out_last = prev;
	if (prev < 0) {
		if (obuf_reserve(&o->tmp, 1, sizeof(ostate)) != 0)
			return -1;
		((ostate *)o->tmp.p)[0] = (ostate){.h = fixed, .parent = -1, .point = -1};
		o->tmp.n = 1;
	}
	return (int64_t)n_prev;
}

/* Walks state `at` of level last back, writing each planned layer's
 * candidate into out (n_layers entries; -1 for unplanned layers). */
static void backtrack(const kiln_sim_oracle *o, int32_t n_layers, const int32_t *sets, int32_t last,
                      int32_t at, int32_t *out)
{
	for (int32_t l = 0; l < n_layers; l++)
		out[l] = -1;
	for (int32_t l = last; l >= 0 && at >= 0; l--) {
		if (sets[l] < 0)
			continue;
		const ostate *s = &((const ostate *)o->states[l].p)[at];
		out[l] = s->point;
		at = s->parent;
	}
}

/* One hull edge of one layer: from vertex j to j + 1, time saved per
 * extra byte held. */
typedef struct oedge {
	double slope;
	int32_t layer, j;
} oedge;

static int by_slope(const void *a, const void *b)
{
	const oedge *x = a, *y = b;
	if (x->slope != y->slope)
		return x->slope > y->slope ? -1 : 1;
	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	return (x->j > y->j) - (x->j < y->j);
}

/* The supported points of one micro-batch's (H, E) set (its lower convex
 * hull): per layer the lower convex hull of its candidates' (resident,
 * time) (o->cands[l] sorted by resident, hull vertices first, the count in
 * hull[l]), then every layer's hull edges taken in order of falling slope
 * from the least-bytes vertex of every layer. State k of the path (into
 * o->tmp, its layers' candidates into o->tmpch, n_layers per state)
 * minimises E + lambda * H over every combination for lambda = the slope of
 * edge k (k >= 1), so no combination holding at most its H takes less
 * time than it (Lagrangian sufficiency). H grows and E falls along the
 * path. Returns the count, -1 on failure. */
static int64_t micro_path(kiln_sim_oracle *o, int32_t n_layers, const int32_t *sets,
                          const double *rows, double fixed)
{
	if (ensure_levels(o, n_layers + 1) != 0 ||
	    obuf_reserve(&o->hull, (size_t)n_layers + 1, sizeof(int32_t)) != 0)
		return -1;
	int32_t *hull = o->hull.p;
	size_t n_edges = 0;
	for (int32_t l = 0; l < n_layers; l++) {
		hull[l] = 0;
		if (sets[l] < 0)
			continue;
		int32_t nc = layer_cands(o, sets[l], rows[l], &o->cands[l]);
		if (nc <= 0)
			return -1; /* an empty table is an error, never a free layer */
		ocand *cs = o->cands[l].p;
		/* Lower convex hull of the falling part, in place: cs[0] has the
		 * least bytes (the least time among them); collinear vertices
		 * are kept (each is a supported point). */
		int32_t h = 0;
		for (int32_t k = 0; k < nc; k++) {
			if (h > 0 && cs[k].e >= cs[h - 1].e)
				continue;
			while (h >= 2) {
				const ocand *a = &cs[h - 2], *b = &cs[h - 1], *c = &cs[k];
				/* Pop b when a -> c saves more per byte before b than
				 * after: slope(a, b) < slope(b, c). */
				if ((a->e - b->e) * (c->r - b->r) < (b->e - c->e) * (b->r - a->r))
					h--;
				else
					break;
			}
			ocand x = cs[k];
			cs[h++] = x;
		}
		hull[l] = h;
		n_edges += (size_t)(h - 1);
	}
	if (obuf_reserve(&o->edges, n_edges + 1, sizeof(oedge)) != 0 ||
	    obuf_reserve(&o->tmp, n_edges + 1, sizeof(ostate)) != 0 ||
	    obuf_reserve(&o->tmpch, (n_edges + 1) * (size_t)n_layers + 1, sizeof(int32_t)) != 0)
		return -1;
	oedge *ed = o->edges.p;
	/* Each layer's edges fall in slope along its hull: merged, in the
	 * order by_slope gives (ties: the lower layer first). */
	int32_t *at = o->tmpch.p; /* per layer: its next edge (reused below) */
	for (int32_t l = 0; l < n_layers; l++)
		at[l] = 0;
	for (size_t k = 0; k < n_edges; k++) {
		oedge top = {.slope = -INFINITY, .layer = -1};
		for (int32_t l = 0; l < n_layers; l++) {
			if (at[l] + 1 >= hull[l])
				continue;
			const ocand *cs = o->cands[l].p;
			int32_t j = at[l];
			oedge x = {.slope = (cs[j].e - cs[j + 1].e) / (cs[j + 1].r - cs[j].r),
			           .layer = l,
			           .j = j};
			if (top.layer < 0 || by_slope(&x, &top) < 0)
				top = x;
		}
		ed[k] = top;
		at[top.layer]++;
	}
	ostate *st = o->tmp.p;
	int32_t *ch = o->tmpch.p;
	double h = fixed, e = 0;
	for (int32_t l = 0; l < n_layers; l++) {
		ch[l] = sets[l] >= 0 ? 0 : -1;
		if (sets[l] >= 0) {
			const ocand *c = o->cands[l].p;
			h += c[0].r;
			e += c[0].e;
		}
	}
	for (size_t x = 0; x <= n_edges; x++) {
		int32_t *cur = &ch[x * (size_t)n_layers];
		if (x > 0) {
			memcpy(cur, cur - n_layers, sizeof(int32_t) * (size_t)n_layers);
			const ocand *c = o->cands[ed[x - 1].layer].p;
			int32_t j = ed[x - 1].j;
			/* Recomputed, not updated, so that H sums in layer order as
			 * the simulator's does. */
			cur[ed[x - 1].layer] = j + 1;
			(void)c;
			h = fixed, e = 0;
			for (int32_t l = 0; l < n_layers; l++)
				if (cur[l] >= 0) {
					const ocand *cl = o->cands[l].p;
					h += cl[cur[l]].r;
					e += cl[cur[l]].e;
				}
		}
		double t = 0;
		for (int32_t l = 0; l < n_layers; l++)
			if (cur[l] >= 0) {
				const ocand *cl = o->cands[l].p;
				t = cl[cur[l]].t > t ? cl[cur[l]].t : t;
			}
		st[x] = (ostate){.h = h, .t = t, .e = e, .parent = -1, .point = (int32_t)x};
	}
	o->tmp.n = n_edges + 1;
	return (int64_t)(n_edges + 1);
}

int64_t kiln_sim_oracle_path(kiln_sim_oracle *o, int32_t n_layers, const int32_t *sets,
                             const double *rows, double fixed_bytes, double *out_held,
                             double *out_exposed_us, int64_t max)
{
	int64_t n = micro_path(o, n_layers, sets, rows, ceil(fixed_bytes - 1e-6));
	const ostate *st = o->tmp.p;
	for (int64_t k = 0; k < n && k < max; k++) {
		out_held[k] = st[k].h;
		out_exposed_us[k] = st[k].e;
	}
	return n;
}

double kiln_sim_oracle_micro(kiln_sim_oracle *o, int32_t n_layers, const int32_t *sets,
                             const double *rows, double fixed_bytes, double max_held,
                             double max_device, kiln_sim_choice *out)
{
	int32_t last;
	int64_t n = micro_pareto(o, n_layers, sets, rows, ceil(fixed_bytes - 1e-6), &last);
	if (n < 0)
		return NAN;
	const ostate *s = last >= 0 ? o->states[last].p : o->tmp.p;
	int64_t best = -1;
	for (int64_t k = 0; k < n; k++)
		if (s[k].h <= max_held && s[k].h + s[k].t <= max_device &&
		    (best < 0 || s[k].e < s[best].e))
			best = k;
	if (best < 0)
		return INFINITY;
	int32_t pick[256];
	if (n_layers > 256)
		return NAN;
	backtrack(o, n_layers, sets, last, (int32_t)best, pick);
	for (int32_t l = 0; l < n_layers && out; l++) {
		out[l] = (kiln_sim_choice){0};
		if (sets[l] < 0)
			continue;
		/* The candidates of level l are still those of this call. */
		const ocand *c = &((const ocand *)o->cands[l].p)[pick[l]];
		double rec = c->rec < c->e ? c->rec : c->e;
		out[l] = (kiln_sim_choice){.resident_bytes = c->r,
		                           .transient_bytes = c->t,
		                           .exposed_us = c->e,
		                           .recompute_us = rec,
		                           .copy_us = c->e - rec};
	}
	return s[best].e;
}

/* The checks of the stage with micro-batch i's choice at Pareto index
 * pick[i] (absolute into ps): returns 1 when every check holds, computed
 * in the order sim/sim.c sums them (static + others + held + transient). */
static int check_all(const ostate *ps, const int32_t *pick, int32_t m, int32_t w, double stat,
                     double capacity, int with_t)
{
	for (int32_t i = 0; i < m; i++) {
		double others = 0;
		for (int32_t j = i - w + 1; j < i; j++)
			if (j >= 0)
				others += ps[pick[j]].h;
		double device = stat + others + ps[pick[i]].h + (with_t ? ps[pick[i]].t : 0);
		if (device > capacity)
			return 0;
	}
	return 1;
}

/* The checks micro-batch i enters (its own and the next w - 1). */
static int check_near(const ostate *ps, const int32_t *pick, int32_t m, int32_t w, double stat,
                      double capacity, int32_t i)
{
	for (int32_t x = i; x < i + w && x < m; x++) {
		double others = 0;
		for (int32_t j = x - w + 1; j < x; j++)
			if (j >= 0)
				others += ps[pick[j]].h;
		if (stat + others + ps[pick[x]].h + ps[pick[x]].t > capacity)
			return 0;
	}
	return 1;
}

/* Every micro-batch's choice under common cap h (least E with H <= h,
 * best[] prefix argmins); returns 0 when some micro-batch has no point. */
static int under_cap(const ostate *ps, const size_t *begin, const int32_t *best, int32_t m,
                     double h, int32_t *pick)
{
	for (int32_t i = 0; i < m; i++) {
		size_t lo = begin[i], hi = begin[i + 1];
		/* The last point with H <= h (sorted by H). */
		size_t a = lo, b = hi;
		while (a < b) {
			size_t mid = a + (b - a) / 2;
			if (ps[mid].h <= h)
				a = mid + 1;
			else
				b = mid;
		}
		if (a == lo)
			return 0;
		pick[i] = best[a - 1];
	}
	return 1;
}

int kiln_sim_oracle_plan(kiln_sim_oracle *o, const kiln_sim_oracle_stage *st, kiln_sim_choice *out,
                         int64_t *out_over_budget)
{
	int32_t m = st->m, L = st->n_layers, w = st->window > 0 ? st->window : 1;
	double fixed = ceil(st->fixed_bytes - 1e-6);
	*out_over_budget = 0;
	if (obuf_reserve(&o->begin, (size_t)m + 1, sizeof(size_t)) != 0 ||
	    obuf_reserve(&o->pick, (size_t)m + 1, sizeof(int32_t)) != 0 ||
	    obuf_reserve(&o->lbegin, (size_t)m * (size_t)L + 1, sizeof(size_t)) != 0)
		return -1;
	size_t *begin = o->begin.p;
	size_t total = 0, n_lc = 0;
	/* 1. Every micro-batch's supported points, kept with the candidates
	 *    they point to (the levels are reused per micro-batch). */
	for (int32_t i = 0; i < m; i++) {
		int64_t n = micro_path(o, L, st->sets, &st->rows[(size_t)i * (size_t)L], fixed);
		if (n < 0)
			return -1;
		size_t *lb = o->lbegin.p;
		for (int32_t l = 0; l < L; l++) {
			size_t nc = st->sets[l] >= 0 ? o->cands[l].n : 0;
			lb[(size_t)i * L + l] = n_lc;
			if (obuf_reserve(&o->lcands, n_lc + nc + 1, sizeof(ocand)) != 0)
				return -1;
			if (nc > 0) /* a layer without a set has no candidates (p NULL) */
				memcpy((ocand *)o->lcands.p + n_lc, o->cands[l].p,
				       nc * sizeof(ocand));
			n_lc += nc;
		}
		if (obuf_reserve(&o->pareto, total + (size_t)n + 1, sizeof(ostate)) != 0 ||
		    obuf_reserve(&o->best, total + (size_t)n + 1, sizeof(int32_t)) != 0 ||
		    obuf_reserve(&o->paths, (total + (size_t)n) * (size_t)L + 1, sizeof(int32_t)) !=
		        0)
			return -1;
		begin = o->begin.p;
		begin[i] = total;
		if (n > 0) {
			memcpy((ostate *)o->pareto.p + total, o->tmp.p, (size_t)n * sizeof(ostate));
			memcpy((int32_t *)o->paths.p + total * (size_t)L, o->tmpch.p,
			       (size_t)n * (size_t)L * sizeof(int32_t));
		}
		total += (size_t)n;
	}
	begin[m] = total;
	ostate *ps = o->pareto.p;
	int32_t *best = o->best.p, *pick = o->pick.p;
	/* Prefix argmin of E per micro-batch (sorted by H; the first of equal
	 * E, so the smallest H). */
	for (int32_t i = 0; i < m; i++)
		for (size_t k = begin[i]; k < begin[i + 1]; k++)
			best[k] =
			    k == begin[i] || ps[k].e < ps[best[k - 1]].e ? (int32_t)k : best[k - 1];
	/* 2a. The best common cap h: every micro-batch its least time with
	 *     H <= h. Below the largest of the micro-batches' least H some
	 *     micro-batch has no point; above it the checks without
	 *     transients fail from some h on (each micro-batch's H grows with
	 *     h), found by bisection on h; then down through the levels (the
	 *     points' H) until the checks with transients hold too. */
	double least = 0, most = 0;
	for (int32_t i = 0; i < m; i++) {
		least = ps[begin[i]].h > least ? ps[begin[i]].h : least;
		most = ps[begin[i + 1] - 1].h > most ? ps[begin[i + 1] - 1].h : most;
	}
	int found = 0;
	double h = most;
	if (!(under_cap(ps, begin, best, m, h, pick) &&
	      check_all(ps, pick, m, w, st->static_bytes, st->capacity, 0))) {
		double lo = least, hi = most; /* lo passes (or nothing does), hi fails */
		for (int k = 0; k < 200 && lo < hi; k++) {
			double mid = lo + (hi - lo) / 2;
			if (mid <= lo || mid >= hi)
				break;
			if (under_cap(ps, begin, best, m, mid, pick) &&
			    check_all(ps, pick, m, w, st->static_bytes, st->capacity, 0))
				lo = mid;
			else
				hi = mid;
		}
		h = lo;
	}
	while (h >= least && under_cap(ps, begin, best, m, h, pick)) {
		if (check_all(ps, pick, m, w, st->static_bytes, st->capacity, 1)) {
			found = 1;
			break;
		}
		/* The next lower level: the largest H below the largest picked. */
		double top = 0, next = -1;
		for (int32_t i = 0; i < m; i++)
			top = ps[pick[i]].h > top ? ps[pick[i]].h : top;
		for (int32_t i = 0; i < m; i++)
			for (size_t k = begin[i + 1]; k-- > begin[i];)
				if (ps[k].h < top) {
					next = ps[k].h > next ? ps[k].h : next;
					break;
				}
		h = next;
	}
	if (!found) {
		/* Nothing common fits: each micro-batch its least H + T. */
		for (int32_t i = 0; i < m; i++) {
			size_t b = begin[i];
			for (size_t k = begin[i]; k < begin[i + 1]; k++)
				if (ps[k].h + ps[k].t < ps[b].h + ps[b].t ||
				    (ps[k].h + ps[k].t == ps[b].h + ps[b].t && ps[k].e < ps[b].e))
					b = k;
			pick[i] = (int32_t)b;
		}
		*out_over_budget = m;
	} else {
		/* 2b. Coordinate descent: each micro-batch its least time within
		 *     the room every check it enters leaves it, the others fixed. */
		for (int pass = 0; pass < KILN_ORACLE_PASSES; pass++) {
			int changed = 0;
			for (int32_t i = 0; i < m; i++) {
				int32_t cur = pick[i];
				/* Room for more H: the least slack of the later checks
				 * micro-batch i enters; its own check bounds H + T. */
				double room = INFINITY, own = 0;
				for (int32_t j = i - w + 1; j < i; j++)
					if (j >= 0)
						own += ps[pick[j]].h;
				for (int32_t x = i + 1; x < i + w && x < m; x++) {
					double others = 0;
					for (int32_t j = x - w + 1; j < x; j++)
						if (j >= 0)
							others += ps[pick[j]].h;
					double slack =
					    st->capacity - (st->static_bytes + others +
					                    ps[pick[x]].h + ps[pick[x]].t);
					room = slack < room ? slack : room;
				}
				int32_t b = cur;
				for (size_t k = begin[i]; k < begin[i + 1]; k++)
					if (ps[k].e < ps[b].e && ps[k].h - ps[cur].h <= room &&
					    st->static_bytes + own + ps[k].h + ps[k].t <=
					        st->capacity)
						b = (int32_t)k;
				if (b == cur)
					continue;
				/* The slacks were taken by subtraction: confirm in the
				 * simulator's order of summation. */
				pick[i] = b;
				if (check_near(ps, pick, m, w, st->static_bytes, st->capacity, i))
					changed = 1;
				else
					pick[i] = cur;
			}
			if (!changed)
				break;
		}
	}
	const ocand *lc = o->lcands.p;
	const size_t *lb = o->lbegin.p;
	const int32_t *paths = o->paths.p;
	for (int32_t i = 0; i < m; i++)
		for (int32_t l = 0; l < L; l++) {
			kiln_sim_choice *ch = &out[(size_t)i * L + l];
			int32_t j = paths[(size_t)pick[i] * (size_t)L + l];
			*ch = (kiln_sim_choice){.over_budget = !found};
			if (st->sets[l] < 0 || j < 0)
				continue;
			const ocand *c = &lc[lb[(size_t)i * L + l] + (size_t)j];
			double rec = c->rec < c->e ? c->rec : c->e;
			ch->resident_bytes = c->r;
			ch->transient_bytes = c->t;
			ch->exposed_us = c->e;
			ch->recompute_us = rec;
			ch->copy_us = c->e - rec;
		}
	return 0;
}
