/* passes/plan.c: load buckets, a frontier per (stage, layer kind, bucket),
 * and the pool of distinct plans (docs/cost-model.md, "Plan tables").
 *
 * Frontiers depend only on the numbers of their instance, so tables whose
 * instances are identical (the same layer kind on different stages, a dense
 * layer at every load) share one frontier, solved once.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "passes/passes.h"

static bool same_units(const kiln_unit_set *x, const kiln_unit_set *y)
{
	if (x == y)
		return true;
	if (x->kind != y->kind || x->n_units != y->n_units)
		return false;
	for (int32_t i = 0; i < x->n_units; i++)
		if (strcmp(x->units[i].name, y->units[i].name) != 0)
			return false;
	return true;
}

static uint64_t fnv(uint64_t h, const void *data, size_t len);

static uint64_t actions_hash(const kiln_unit_set *set, const uint8_t *actions)
{
	uint64_t h = fnv(14695981039346656037ull, &set->kind, sizeof set->kind);
	return fnv(h, actions, (size_t)set->n_units);
}

static int pool_grow(kiln_plan_pool *p, kiln_arena *a)
{
	int32_t cap = p->cap ? 2 * p->cap : 64;
	uint8_t **na = kiln_arena_alloc(a, sizeof(*na) * (size_t)cap);
	const kiln_unit_set **ns = kiln_arena_alloc(a, sizeof(*ns) * (size_t)cap);
	int32_t n_slots = 4 * cap;
	int32_t *slots = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)n_slots);
	if (!na || !ns || !slots)
		return -1;
	if (p->n) {
		memcpy(na, p->actions, sizeof(*na) * (size_t)p->n);
		memcpy(ns, p->set, sizeof(*ns) * (size_t)p->n);
	}
	for (int32_t i = 0; i < p->n; i++) {
		uint64_t h = actions_hash(ns[i], na[i]);
		int32_t k = (int32_t)(h % (uint64_t)n_slots);
		while (slots[k])
			k = (k + 1) % n_slots;
		slots[k] = i + 1;
	}
	p->actions = na;
	p->set = ns;
	p->cap = cap;
	p->slots = slots;
	p->n_slots = n_slots;
	return 0;
}

int32_t kiln_plan_pool_add(kiln_plan_pool *p, kiln_arena *a, const kiln_unit_set *set,
                           const uint8_t *actions)
{
	if (p->n == p->cap && pool_grow(p, a) != 0)
		return -1;
	uint64_t h = actions_hash(set, actions);
	int32_t k = (int32_t)(h % (uint64_t)p->n_slots);
	for (; p->slots[k]; k = (k + 1) % p->n_slots) {
		int32_t i = p->slots[k] - 1;
		if (same_units(p->set[i], set) &&
		    memcmp(p->actions[i], actions, (size_t)set->n_units) == 0)
			return i;
	}
	uint8_t *copy = kiln_arena_alloc(a, (size_t)set->n_units + 1);
	if (!copy)
		return -1;
	memcpy(copy, actions, (size_t)set->n_units);
	p->actions[p->n] = copy;
	p->set[p->n] = set;
	p->slots[k] = p->n + 1;
	return p->n++;
}

/* ---- instance identity */

static uint64_t fnv(uint64_t h, const void *data, size_t len)
{
	const unsigned char *p = data;
	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 1099511628211ull;
	}
	return h;
}

static uint64_t instance_hash(const kiln_plan_instance *in)
{
	uint64_t h = 14695981039346656037ull;
	h = fnv(h, &in->n_units, sizeof in->n_units);
	h = fnv(h, &in->quantum_bytes, sizeof in->quantum_bytes);
	h = fnv(h, &in->free_offload_q, sizeof in->free_offload_q);
	h = fnv(h, &in->offload_us_per_q, sizeof in->offload_us_per_q);
	for (int32_t g = 0; g < in->n_groups; g++) {
		const kiln_plan_group *gr = &in->groups[g];
		h = fnv(h, gr->units, sizeof(int32_t) * (size_t)gr->n_units);
		for (int32_t k = 0; k < gr->n_choices; k++) {
			const kiln_plan_choice *ch = &gr->choices[k];
			h = fnv(h, ch->actions, (size_t)gr->n_units);
			h = fnv(h, &ch->saved_q, sizeof ch->saved_q);
			h = fnv(h, &ch->offload_q, sizeof ch->offload_q);
			h = fnv(h, &ch->recompute_us, sizeof ch->recompute_us);
		}
	}
	return h;
}

static bool instance_equal(const kiln_plan_instance *x, const kiln_plan_instance *y)
{
	if (x->n_units != y->n_units || x->n_groups != y->n_groups ||
	    x->quantum_bytes != y->quantum_bytes || x->free_offload_q != y->free_offload_q ||
	    x->offload_us_per_q != y->offload_us_per_q)
		return false;
	for (int32_t g = 0; g < x->n_groups; g++) {
		const kiln_plan_group *a = &x->groups[g], *b = &y->groups[g];
		if (a->n_units != b->n_units || a->n_choices != b->n_choices ||
		    memcmp(a->units, b->units, sizeof(int32_t) * (size_t)a->n_units) != 0)
			return false;
		for (int32_t k = 0; k < a->n_choices; k++) {
			const kiln_plan_choice *p = &a->choices[k], *q = &b->choices[k];
			if (memcmp(p->actions, q->actions, (size_t)a->n_units) != 0 ||
			    p->saved_q != q->saved_q || p->offload_q != q->offload_q ||
			    p->recompute_us != q->recompute_us)
				return false;
		}
	}
	return true;
}

static double balanced_n(const kiln_compilation *c, const kiln_unit_set *set)
{
	return c->graph->layers[set->layer].n_balanced;
}

int kiln_plan_table_fill(kiln_plan_table *t, int32_t steps, kiln_plan_pool *pool, kiln_arena *a)
{
	const kiln_frontier *f = t->frontier;
	int32_t cap = steps > 0 && steps + 1 < f->n_points ? steps + 1 : f->n_points;
	t->point = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)cap);
	t->bytes = kiln_arena_alloc(a, sizeof(kiln_plan_bytes) * (size_t)cap);
	t->plan = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)cap);
	uint8_t *actions = kiln_arena_alloc(a, (size_t)t->set->n_units + 1);
	if (!t->point || !t->bytes || !t->plan || !actions)
		return -1;
	/* Point 0 (keep-all), then for each step the cheapest point saving at
	 * least step / steps of the maximum; the last step is the maximum. */
	int32_t n = 0;
	if (cap == f->n_points) {
		for (int32_t p = 0; p < f->n_points; p++)
			t->point[n++] = p;
	} else {
		uint64_t max_q = f->points[f->n_points - 1].saved_q;
		t->point[n++] = 0;
		int32_t p = 0;
		for (int32_t k = 1; k <= steps; k++) {
			uint64_t want = (max_q * (uint64_t)k + (uint64_t)steps - 1) / (uint64_t)steps;
			while (p < f->n_points - 1 && f->points[p].saved_q < want)
				p++;
			if (p > t->point[n - 1])
				t->point[n++] = p;
		}
	}
	t->n_points = n;
	for (int32_t i = 0; i < n; i++) {
		kiln_plan_actions(&t->instance, &f->points[t->point[i]], actions);
		/* Choices are valid within their group; a source cycle across
		 * groups would need aliased units the lowering never makes. Check
		 * anyway: an invalid plan must never reach a table. */
		if (kiln_plan_valid(t->set, actions) != 0)
			return -1;
		kiln_plan_bytes_at(t->set, actions, t->n, &t->bytes[i]);
		t->plan[i] = -1;
		if (pool && (t->plan[i] = kiln_plan_pool_add(pool, a, t->set, actions)) < 0)
			return -1;
	}
	return 0;
}

/* The copy link's idle window, measured (docs/cost-model.md, "Copy link").
 * The first estimate (options.c) lets a layer's copies use the link for its
 * whole forward plus backward time; a template confines them to its own
 * window (an offload after its producer, a reload before its first reader:
 * docs/schedule.md), so the frontier solved with it is full of offloads
 * that lengthen the schedule. Each of t's points (solved with the first
 * estimate) is scheduled against keep-everything; a point offloading B
 * quanta whose template is E us longer hides at least B - E /
 * offload_us_per_q of them (E counts its recompute too, so this errs low).
 * Two windows come out, both clamped to [0, first estimate]:
 * - *lo: the most quanta offloaded by a point that hides entirely (E = 0);
 * - *hi: the most quanta hidden by any point, partly hidden ones included
 *   (>= *lo): with it the estimate of that point's exposed copy time is
 *   its scheduled delay.
 * Returns 0, or -1 on exhaustion. */
/* A scratch arena for scheduling t's plans, in *out, and an actions
 * buffer in it; NULL (and nothing to free) on exhaustion. */
static uint8_t *scratch_actions(const kiln_plan_table *t, kiln_arena **out)
{
	kiln_arena *sa = kiln_arena_new();
	uint8_t *actions = sa ? kiln_arena_alloc(sa, (size_t)t->set->n_units + 1) : NULL;
	if (!actions)
		kiln_arena_free(sa);
	*out = actions ? sa : NULL;
	return actions;
}

/* A makespan per point of f, NAN until scheduled (arena-owned), so that a
 * plan scheduled to measure a window, to score a table or to choose its
 * points is scheduled once. NULL on exhaustion. */
static double *makespan_memo(const kiln_frontier *f, kiln_arena *a)
{
	double *m = kiln_arena_alloc(a, sizeof(double) * (size_t)(f->n_points ? f->n_points : 1));
	for (int32_t p = 0; m && p < f->n_points; p++)
		m[p] = NAN;
	return m;
}

/* Makespan of point p of f at t (memo[p] when known). -1 on exhaustion. */
static double memo_makespan(const kiln_compilation *c, const kiln_plan_table *t,
                            const kiln_frontier *f, int32_t p, double *memo, uint8_t *actions,
                            kiln_arena *sa)
{
	if (isnan(memo[p])) {
		kiln_plan_actions(&t->instance, &f->points[p], actions);
		memo[p] = kiln_interleave_makespan(c, t, actions, sa);
	}
	return memo[p];
}

static int measure_window(const kiln_compilation *c, const kiln_plan_table *t, double *memo,
                          uint32_t *lo, uint32_t *hi)
{
	const kiln_plan_instance *in = &t->instance;
	*lo = *hi = in->free_offload_q;
	if (in->free_offload_q == 0 || t->n_points < 2)
		return 0;
	kiln_arena *sa;
	uint8_t *actions = scratch_actions(t, &sa);
	if (!actions)
		return -1;
	static const uint8_t keep[KILN_PLAN_MAX_UNITS]; /* zero: KILN_ACT_KEEP */
	double base = kiln_interleave_makespan(c, t, keep, sa), whole_q = 0, part_q = 0;
	int rc = base < 0 ? -1 : 0;
	for (int32_t p = 1; p < t->n_points && rc == 0; p++) {
		const kiln_plan_point *pt = &t->frontier->points[t->point[p]];
		if ((double)pt->offload_q <= whole_q)
			continue; /* it can raise neither: h <= B <= whole_q <= part_q */
		double mk = memo_makespan(c, t, t->frontier, t->point[p], memo, actions, sa);
		if (mk < 0) {
			rc = -1;
			break;
		}
		double h = (double)pt->offload_q;
		if (mk > base * (1 + 1e-9))
			h = in->offload_us_per_q > 0 ? floor(h - (mk - base) / in->offload_us_per_q) : 0;
		else if (h > whole_q)
			whole_q = h;
		if (h > part_q)
			part_q = h;
	}
	kiln_arena_free(sa);
	if (rc != 0)
		return -1;
	if (whole_q < (double)in->free_offload_q)
		*lo = (uint32_t)whole_q;
	if (part_q < (double)in->free_offload_q)
		*hi = (uint32_t)part_q;
	return 0;
}

/* The total scheduled time of f's table at t's load: for each of the
 * table's saving targets (kiln_plan_table_fill), the template makespan of
 * the cheapest point saving at least as much. Windows are compared by it
 * (lower is better). Returns -1 on exhaustion. */
static double table_score(const kiln_compilation *c, const kiln_plan_table *t,
                          const kiln_frontier *f, double *memo)
{
	kiln_arena *sa;
	uint8_t *actions = scratch_actions(t, &sa);
	if (!actions)
		return -1;
	uint64_t max_q = f->points[f->n_points - 1].saved_q;
	int32_t p = 0, last = -1;
	double sum = 0, mk = 0;
	for (int32_t k = 1; k <= KILN_PLAN_TABLE_STEPS; k++) {
		uint64_t want = (max_q * (uint64_t)k + KILN_PLAN_TABLE_STEPS - 1) /
		                KILN_PLAN_TABLE_STEPS;
		while (p < f->n_points - 1 && f->points[p].saved_q < want)
			p++;
		if (p != last) {
			mk = memo_makespan(c, t, f, p, memo, actions, sa);
			last = p;
			if (mk < 0)
				break;
		}
		sum += mk;
	}
	kiln_arena_free(sa);
	return mk < 0 ? -1 : sum;
}

/* The MILP's frontier as a plan table reads it (docs/cost-model.md,
 * "Solvers"). The DP's frontier, as a warm start, says which targets the
 * table reads: every point when it keeps them all (at most
 * KILN_PLAN_TABLE_STEPS + 1), else the table's step targets; the MILP
 * solves each. Its levels are then re-traced by the canonical rule
 * (kiln_cost_frontier_levels), so both solvers name the same plans; where
 * the two exact solvers disagree on a level's cost the MILP's own plans
 * stand (and the final tables differ: tests/test_plan.c compares them). */
static int solve_milp(const kiln_compilation *c, const kiln_plan_instance *in, kiln_arena *a,
                      kiln_frontier *out)
{
	kiln_frontier fd, fm, fc;
	if (kiln_cost_frontier_dp(in, a, &fd) != 0)
		return -1;
	int rc;
	if (fd.n_points <= KILN_PLAN_TABLE_STEPS + 1) {
		rc = kiln_cost_frontier_milp_metered(in, c->meter, a, &fm);
	} else {
		uint32_t targets[KILN_PLAN_TABLE_STEPS];
		int32_t nt = 0;
		uint64_t max_q = fd.points[fd.n_points - 1].saved_q;
		for (int k = 1; k <= KILN_PLAN_TABLE_STEPS; k++) {
			uint64_t want = (max_q * (uint64_t)k + KILN_PLAN_TABLE_STEPS - 1) /
			                KILN_PLAN_TABLE_STEPS;
			if (nt == 0 || want > targets[nt - 1])
				targets[nt++] = (uint32_t)want;
		}
		rc = kiln_cost_frontier_milp_targets(in, targets, nt, c->meter, a, &fm);
	}
	if (rc != 0 || fm.n_points < 1)
		return -1;
	uint32_t *levels = kiln_arena_alloc(a, sizeof(uint32_t) * (size_t)fm.n_points);
	if (!levels)
		return -1;
	for (int32_t p = 1; p < fm.n_points; p++)
		levels[p - 1] = fm.points[p].saved_q;
	bool same = kiln_cost_frontier_levels(in, levels, fm.n_points - 1, a, &fc) == 0 &&
	            fc.n_points == fm.n_points;
	for (int32_t p = 1; same && p < fm.n_points; p++) {
		double x = fc.points[p].exposed_us, y = fm.points[p].exposed_us;
		same = fc.points[p].saved_q == fm.points[p].saved_q &&
		       fabs(x - y) <= 1e-9 * fmax(1.0, fmax(fabs(x), fabs(y)));
	}
	*out = same ? fc : fm;
	return 0;
}

static int solve(const kiln_compilation *c, const kiln_plan_instance *in, kiln_arena *a,
                 const kiln_frontier **out)
{
	kiln_frontier *f = kiln_arena_alloc(a, sizeof *f);
	if (!f)
		return -1;
	int rc = c->solver == KILN_SOLVER_MILP ? solve_milp(c, in, a, f)
	                                       : kiln_cost_frontier_dp(in, a, f);
	*out = f;
	return rc;
}

typedef struct pick {
	const kiln_plan_point *pt;
	double us; /* makespan + kiln_interleave_hbm_us */
} pick;

static int pick_cmp(const void *x, const void *y)
{
	const pick *a = x, *b = y;
	return a->pt->saved_q < b->pt->saved_q ? -1 : a->pt->saved_q > b->pt->saved_q;
}

/* The table's points chosen by the schedule (docs/cost-model.md, "Points
 * chosen by the schedule"): fs[0..nf) are canonical frontiers of the same
 * groups solved with different copy windows, fs[0] the one whose window t
 * keeps. For each saving the table reads from fs[0] (its table points),
 * every frontier offers the first of its own table points (the points a
 * table filled from it would hold) saving at least as much, and so do the
 * KILN_PLAN_KBEST cheapest plans under t->instance saving at least as
 * much (kiln_cost_kbest; the first is fs[0]'s point); among
 * those saving no fewer exact bytes and holding no more transient or
 * offloaded bytes than fs[0]'s, the one whose template schedules shortest
 * wins (fs[0] on a tie, then the lower index). The winners, in ascending saving (one per
 * saving: the shorter scheduled), their totals re-evaluated under
 * t->instance, become t->frontier. Returns 0 or -1. */
static int choose_by_schedule(const kiln_compilation *c, kiln_plan_table *t,
                              const kiln_frontier *const *fs, double *const *memo, int32_t nf,
                              kiln_arena *a)
{
	t->frontier = fs[0];
	if (kiln_plan_table_fill(t, KILN_PLAN_TABLE_STEPS, NULL, a) != 0)
		return -1;
	kiln_arena *sa;
	uint8_t *actions = scratch_actions(t, &sa);
	pick *picks = kiln_arena_alloc(a, sizeof(pick) * (size_t)t->n_points);
	if (!actions || !picks) {
		kiln_arena_free(sa);
		return -1;
	}
	/* Each frontier offers the points its own table would read: what both
	 * solvers' frontiers hold alike (--solver milp solves only those). */
	kiln_plan_table *own = kiln_arena_alloc(a, sizeof(kiln_plan_table) * (size_t)nf);
	if (!own) {
		kiln_arena_free(sa);
		return -1;
	}
	int rc = 0;
	for (int32_t i = 0; i < nf && rc == 0; i++) {
		own[i] = *t;
		own[i].frontier = fs[i];
		rc = kiln_plan_table_fill(&own[i], KILN_PLAN_TABLE_STEPS, NULL, a);
	}
	/* The k cheapest plans (by t->instance's cost) saving at least each
	 * table point's saving: where the solvers tie, the schedule decides.
	 * Their first is fs[0]'s own point; an instance too large for the
	 * search (kiln_cost_kbest refuses) offers none. */
	const int32_t kb = KILN_PLAN_KBEST, nt = t->n_points > 1 ? t->n_points - 1 : 0;
	uint32_t *targets = kiln_arena_alloc(a, sizeof(uint32_t) * (size_t)(nt ? nt : 1));
	int32_t *kbn = kiln_arena_alloc(a, sizeof(int32_t) * (size_t)(nt ? nt : 1));
	kiln_plan_point *kbp =
	    kiln_arena_alloc(a, sizeof(kiln_plan_point) * (size_t)(nt ? nt : 1) * (size_t)kb);
	if (!targets || !kbn || !kbp)
		rc = -1;
	for (int32_t k = 1; k < t->n_points && rc == 0; k++)
		targets[k - 1] = fs[0]->points[t->point[k]].saved_q;
	if (rc == 0 && (kb < 2 || kiln_cost_kbest(&t->instance, targets, nt, kb, a, kbp, kbn) != 0))
		for (int32_t i = 0; i < nt; i++)
			kbn[i] = 0;
	int32_t n = 0;
	for (int32_t k = 1; k < t->n_points && rc == 0; k++) {
		uint32_t want = targets[k - 1];
		pick best = {NULL, INFINITY};
		kiln_plan_bytes ref;
		/* Candidates: each frontier's first own table point saving at
		 * least want (i < nf), then the k-best plans after the first. */
		for (int32_t i = 0; i < nf + kbn[k - 1]; i++) {
			const kiln_plan_point *pt;
			int32_t p = -1;
			if (i < nf) {
				const kiln_frontier *f = fs[i];
				int32_t j = 0;
				while (j < own[i].n_points - 1 &&
				       f->points[own[i].point[j]].saved_q < want)
					j++;
				p = own[i].point[j];
				pt = &f->points[p];
				if (pt->saved_q < want)
					continue;
			} else if (i == nf) {
				continue; /* fs[0]'s point again */
			} else {
				pt = &kbp[(size_t)(k - 1) * (size_t)kb + (size_t)(i - nf)];
			}
			/* Only a plan the budget cannot like less replaces fs[0]'s:
			 * no less saved, no more transient or offloaded bytes. */
			kiln_plan_bytes by;
			kiln_plan_actions(&t->instance, pt, actions);
			kiln_plan_bytes_at(t->set, actions, t->n, &by);
			if (i == 0)
				ref = by;
			else if (by.saved < ref.saved || by.transient > ref.transient ||
			         by.offloaded > ref.offloaded)
				continue;
			double us = kiln_interleave_hbm_us(c, t, actions);
			double mk = p >= 0 ? memo_makespan(c, t, fs[i], p, memo[i], actions, sa)
			                   : kiln_interleave_makespan(c, t, actions, sa);
			if (mk < 0) {
				rc = -1;
				break;
			}
			if (mk + us < best.us)
				best = (pick){pt, mk + us};
		}
		if (rc == 0 && best.pt)
			picks[n++] = best;
	}
	kiln_arena_free(sa);
	if (rc != 0)
		return -1;
	qsort(picks, (size_t)n, sizeof(pick), pick_cmp);
	kiln_frontier *out = kiln_arena_alloc(a, sizeof *out);
	kiln_plan_point *pts = kiln_arena_alloc(a, sizeof(kiln_plan_point) * (size_t)(n + 1));
	if (!out || !pts)
		return -1;
	pts[0] = fs[0]->points[0];
	int32_t m = 1;
	double last_us = 0;
	for (int32_t k = 0; k < n; k++) {
		if (picks[k].pt->saved_q == pts[m - 1].saved_q) {
			if (m > 1 && picks[k].us < last_us) { /* one per saving: the shorter */
				kiln_cost_plan_eval(&t->instance, picks[k].pt->choice, &pts[m - 1]);
				pts[m - 1].choice = picks[k].pt->choice;
				last_us = picks[k].us;
			}
			continue;
		}
		kiln_cost_plan_eval(&t->instance, picks[k].pt->choice, &pts[m]);
		pts[m++].choice = picks[k].pt->choice;
		last_us = picks[k].us;
	}
	out->points = pts;
	out->n_points = m;
	t->frontier = out;
	return 0;
}

/* Solves t's frontier: with the first estimate of the copy window, then,
 * once its plans are scheduled, with each measured window (measure_window)
 * that is smaller; keeps the frontier whose table schedules shortest
 * (table_score), the lower window on a tie. Returns 0 or -1. */
static int solve_measured(const kiln_compilation *c, kiln_plan_table *t, kiln_arena *a)
{
	uint32_t est_q = t->instance.free_offload_q, lo, hi;
	double *est_memo;
	if (solve(c, &t->instance, a, &t->frontier) != 0 ||
	    kiln_plan_table_fill(t, KILN_PLAN_TABLE_STEPS, NULL, a) != 0 ||
	    !(est_memo = makespan_memo(t->frontier, a)) ||
	    measure_window(c, t, est_memo, &lo, &hi) != 0)
		return -1;
	if (lo >= est_q) /* one window: the schedule still picks among its k best */
		return choose_by_schedule(c, t, (const kiln_frontier *const[]){t->frontier},
		                          (double *const[]){est_memo}, 1, a);
	/* Every frontier solved is a source of table points (fs, with their
	 * makespans in ms); the kept window's comes first. */
	const kiln_frontier *est_f = t->frontier, *fs[3] = {est_f, NULL, NULL};
	double *ms[3] = {est_memo, NULL, NULL};
	int32_t nf = 1, best_i = -1;
	uint32_t best_q = 0;
	double best = INFINITY;
	const uint32_t cand[2] = {lo, hi};
	for (int i = 0; i < 2; i++) {
		if (i == 1 && hi == lo)
			break;
		int32_t fi = 0; /* a window at the first estimate keeps its frontier */
		t->instance.free_offload_q = cand[i];
		if (cand[i] < est_q) {
			fi = nf++;
			if (solve(c, &t->instance, a, &fs[fi]) != 0 ||
			    !(ms[fi] = makespan_memo(fs[fi], a)))
				return -1;
		}
		double sc = table_score(c, t, fs[fi], ms[fi]);
		if (sc < 0)
			return -1;
		if (sc < best) {
			best = sc;
			best_i = fi;
			best_q = cand[i];
		}
	}
	t->instance.free_offload_q = best_q;
	const kiln_frontier *order[3] = {fs[best_i], NULL, NULL};
	double *order_ms[3] = {ms[best_i], NULL, NULL};
	int32_t no = 1;
	for (int32_t i = 0; i < nf; i++)
		if (i != best_i) {
			order[no] = fs[i];
			order_ms[no++] = ms[i];
		}
	return choose_by_schedule(c, t, order, order_ms, no, a);
}

int kiln_plan_table_static(const kiln_ir_graph *g, const kiln_unit_set *set, double load_factor,
                           double n, const kiln_option_flags *flags, kiln_arena *a,
                           kiln_plan_table *out)
{
	memset(out, 0, sizeof *out);
	out->set = set;
	out->load_factor = load_factor;
	out->n = n;
	kiln_frontier *f = kiln_arena_alloc(a, sizeof *f);
	if (!f || kiln_pass_options(g, set, n, flags, a, &out->instance) != 0 ||
	    kiln_cost_frontier_dp(&out->instance, a, f) != 0)
		return -1;
	out->frontier = f;
	out->frontier_id = -1;
	return kiln_plan_table_fill(out, KILN_PLAN_TABLE_STEPS, NULL, a);
}

int kiln_pass_plan(kiln_compilation *c)
{
	kiln_arena *a = c->arena;
	if (kiln_plan_buckets(c->model->max_factor, a, &c->buckets, &c->n_buckets) != 0)
		return -1;
	size_t n_tables = (size_t)c->n_sets * (size_t)c->n_buckets;
	c->tables = kiln_arena_alloc(a, sizeof(kiln_plan_table) * (n_tables ? n_tables : 1));
	c->pool = kiln_arena_alloc(a, sizeof(kiln_plan_pool));
	uint64_t *hashes = kiln_arena_alloc(a, sizeof(uint64_t) * (n_tables ? n_tables : 1));
	int32_t *distinct = kiln_arena_alloc(a, sizeof(int32_t) * (n_tables ? n_tables : 1));
	uint32_t *first_q = kiln_arena_alloc(a, sizeof(uint32_t) * (n_tables ? n_tables : 1));
	if (!c->tables || !c->pool || !hashes || !distinct || !first_q)
		return -1;
	int32_t n_distinct = 0;
	kiln_option_flags flags = {.offload = !c->no_offload, .collective_recompute = false};
	kiln_progress_phase(c->meter, "plan", "tables", (int64_t)n_tables);
	if (c->solver == KILN_SOLVER_MILP)
		kiln_progress_aux(c->meter, "MILP solves");

	for (int32_t s = 0; s < c->n_sets; s++) {
		const kiln_unit_set *set = &c->sets[s];
		for (int32_t b = 0; b < c->n_buckets; b++) {
			size_t ti = (size_t)s * (size_t)c->n_buckets + (size_t)b;
			kiln_plan_table *t = &c->tables[ti];
			t->set = set;
			t->load_factor = c->buckets[b];
			t->n = set->kind == KILN_LAYER_MOE ? t->load_factor * balanced_n(c, set) : 0;
			if (kiln_pass_options(c->graph, set, t->n, &flags, a, &t->instance) != 0)
				return -1;
			hashes[ti] = instance_hash(&t->instance);
			int32_t same = -1;
			for (int32_t d = 0; d < n_distinct && same < 0; d++) {
				/* Compared as first estimated, before the window of
				 * the shared frontier was measured. */
				kiln_plan_instance o = c->tables[distinct[d]].instance;
				o.free_offload_q = first_q[d];
				if (hashes[distinct[d]] == hashes[ti] &&
				    instance_equal(&o, &t->instance))
					same = d;
			}
			if (same >= 0) {
				const kiln_plan_table *o = &c->tables[distinct[same]];
				t->frontier = o->frontier;
				t->frontier_id = same;
				t->instance.free_offload_q =
				    o->instance.free_offload_q; /* measured */
			} else {
				uint32_t est_q = t->instance.free_offload_q;
				if (solve_measured(c, t, a) != 0)
					return -1;
				t->frontier_id = n_distinct;
				first_q[n_distinct] = est_q;
				distinct[n_distinct++] = (int32_t)ti;
			}
			if (kiln_plan_table_fill(t, KILN_PLAN_TABLE_STEPS, c->pool, a) != 0)
				return -1;
			kiln_progress_add(c->meter, 1);
		}
	}
	c->pool->n_frontiers = n_distinct;
	return 0;
}
