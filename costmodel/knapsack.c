/* costmodel/knapsack.c: the planning frontier by dynamic programming, and a
 * brute-force reference for tests.
 *
 * The DP state after a prefix of groups is (s, u): s quanta saved so far and
 * u = min(O, K) quanta of the free copy capacity K used by the O quanta
 * offloaded so far. Its value is the least recompute time plus paid copy
 * time max(0, O - K) * rate of any prefix plan reaching it. Offloading w more
 * quanta from u costs max(0, u + w - K) * rate and moves to min(K, u + w), so
 * the paid total is exactly max(0, O - K) and the DP is exact for the
 * quantised instance (docs/cost-model.md, "Solvers").
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/costmodel.h"

/* Costs closer than this (relative, 1e-9 us floor) are one cost level: the
 * larger saving wins, so float noise from summing in another order never
 * turns one level into two frontier points. milp.c uses the same rule. */
static double tie_tol(double cost_us)
{
	return 1e-9 * (fabs(cost_us) > 1.0 ? fabs(cost_us) : 1.0);
}

typedef struct dp_group {
	uint16_t *choice; /* (smax + 1) rows of width ucols: winning choice per state */
	uint16_t *sat_u;  /* smax + 1: predecessor u of the state u = kd (copy saturated) */
	uint32_t smax;    /* largest s reachable after this group */
	uint32_t ucols;   /* 1 + largest u reachable after this group */
} dp_group;

typedef struct dp_work {
	double *cur, *nxt;             /* (s_cap + 1) rows of width kd + 1 */
	uint32_t *cur_cols, *nxt_cols; /* columns of each row written so far; 0: unreachable */
	dp_group *groups;
	uint16_t *tables; /* every group's choice table, back to back */
	uint16_t *sats;
	int32_t *path;  /* n_groups: one reconstructed plan */
	uint32_t *pick; /* s_cap + 1: frontier saving levels */
	uint16_t *live; /* kd + 1: undominated u of one row */
} dp_work;

static void dp_work_free(dp_work *w)
{
	free(w->cur);
	free(w->nxt);
	free(w->cur_cols);
	free(w->nxt_cols);
	free(w->groups);
	free(w->tables);
	free(w->sats);
	free(w->path);
	free(w->pick);
	free(w->live);
}

/* kiln_cost_kbest keeps every group's state values (8 bytes each) for its
 * search; past this many it refuses (256 MiB). */
#define KBEST_MAX_VALUES ((size_t)1 << 25)

/* The choice tables grow with groups * S * K; past this the instance is
 * refused as exhaustion rather than thrashing (4096 x 4096 x 32 groups). */
#define DP_MAX_TABLE_ENTRIES ((size_t)1 << 29)

/* One group's transitions from w->cur into w->nxt. kd is the copy capacity
 * the state tracks (0 when copies are never paid), rate the paid cost.
 *
 * A state (s, u) is skipped as a source when some (s, u' < u) is no dearer:
 * every continuation costs at least as much from u as from u' (paid copy is
 * nondecreasing in u), so it never leads anywhere cheaper. Values of the
 * states that are not dominated stay exact, and tracing back from one only
 * visits such states. With exact set nothing is skipped, so every value is
 * exact (kiln_cost_kbest's bound). */
static void dp_step(const kiln_plan_group *gr, const dp_group *prev, dp_group *dg, uint32_t kd,
                    double rate, bool exact, dp_work *w)
{
	const size_t width = (size_t)kd + 1;
	/* Rows are filled with INFINITY lazily, only as far as a write reaches:
	 * most of the (s, u) rectangle is never reachable. */
	memset(w->nxt_cols, 0, ((size_t)dg->smax + 1) * sizeof(uint32_t));
	uint16_t *live = w->live;
	for (uint32_t s = 0; s <= prev->smax; s++) {
		if (!w->cur_cols[s])
			continue;
		const double *src = w->cur + s * width;
		uint32_t n_live = 0;
		double run = INFINITY;
		for (uint32_t u = 0; u < w->cur_cols[s]; u++)
			if (src[u] < run) {
				if (!exact)
					run = src[u];
				live[n_live++] = (uint16_t)u;
			}
		if (n_live == 0)
			continue;
		for (int32_t c = 0; c < gr->n_choices; c++) {
			const kiln_plan_choice *ch = &gr->choices[c];
			const uint32_t wq = ch->offload_q, t = s + ch->saved_q;
			const double r = ch->recompute_us;
			/* u + wq < kd stays unsaturated; the rest lands on u = kd. */
			const uint32_t ulo = kd > wq ? kd - wq : 0;
			double *dst = w->nxt + t * width;
			uint16_t *tab = dg->choice + (size_t)t * dg->ucols;
			uint32_t reach = live[n_live - 1] + wq;
			uint32_t need = (reach < kd ? reach : kd) + 1;
			for (uint32_t u = w->nxt_cols[t]; u < need; u++)
				dst[u] = INFINITY;
			if (w->nxt_cols[t] < need)
				w->nxt_cols[t] = need;
			uint32_t i = 0;
			for (; i < n_live && live[i] < ulo; i++) {
				uint32_t u = live[i];
				double v = src[u] + r;
				if (v < dst[u + wq]) {
					dst[u + wq] = v;
					tab[u + wq] = (uint16_t)c;
				}
			}
			for (; i < n_live; i++) {
				uint32_t u = live[i];
				double v = src[u] + r + (double)(u + wq - kd) * rate;
				if (v < dst[kd]) {
					dst[kd] = v;
					tab[kd] = (uint16_t)c;
					dg->sat_u[t] = (uint16_t)u;
				}
			}
		}
	}
}

/* Fills w->path with the plan that reaches state (s, u) after every group. */
static void dp_trace(const kiln_plan_instance *in, const dp_work *w, uint32_t kd, uint32_t s,
                     uint32_t u)
{
	for (int32_t g = in->n_groups - 1; g >= 0; g--) {
		const dp_group *dg = &w->groups[g];
		uint16_t c = dg->choice[(size_t)s * dg->ucols + u];
		const kiln_plan_choice *ch = &in->groups[g].choices[c];
		w->path[g] = c;
		uint32_t pu = u == kd ? dg->sat_u[s] : u - ch->offload_q;
		s -= ch->saved_q;
		u = pu;
	}
}

static int dp_alloc(const kiln_plan_instance *in, uint32_t s_cap, uint32_t kd, dp_work *w)
{
	const size_t width = (size_t)kd + 1, rows = (size_t)s_cap + 1;
	size_t g_n = in->n_groups > 0 ? (size_t)in->n_groups : 1;
	w->cur = malloc(rows * width * sizeof(double));
	w->nxt = malloc(rows * width * sizeof(double));
	w->cur_cols = calloc(rows, sizeof(uint32_t));
	w->nxt_cols = calloc(rows, sizeof(uint32_t));
	w->groups = calloc(g_n, sizeof(dp_group));
	w->path = calloc(g_n, sizeof(int32_t));
	w->pick = malloc(rows * sizeof(uint32_t));
	w->live = malloc(width * sizeof(uint16_t));
	if (!w->cur || !w->nxt || !w->cur_cols || !w->nxt_cols || !w->groups || !w->path ||
	    !w->pick || !w->live)
		return -1;
	/* Reachable states after each group fit in the rectangle of its prefix's
	 * largest saving and offload, so the tables store only that. */
	size_t entries = 0, sat_entries = 0;
	uint64_t ps = 0, po = 0;
	for (int32_t g = 0; g < in->n_groups; g++) {
		const kiln_plan_group *gr = &in->groups[g];
		uint32_t ms = 0, mo = 0;
		for (int32_t c = 0; c < gr->n_choices; c++) {
			if (gr->choices[c].saved_q > ms)
				ms = gr->choices[c].saved_q;
			if (gr->choices[c].offload_q > mo)
				mo = gr->choices[c].offload_q;
		}
		ps += ms;
		po += mo;
		dp_group *dg = &w->groups[g];
		dg->smax = (uint32_t)ps;
		dg->ucols = (po < kd ? (uint32_t)po : kd) + 1;
		entries += (size_t)(dg->smax + 1) * dg->ucols;
		sat_entries += (size_t)dg->smax + 1;
		if (entries > DP_MAX_TABLE_ENTRIES)
			return -1;
	}
	w->tables = malloc((entries ? entries : 1) * sizeof(uint16_t));
	w->sats = malloc((sat_entries ? sat_entries : 1) * sizeof(uint16_t));
	if (!w->tables || !w->sats)
		return -1;
	size_t off = 0, soff = 0;
	for (int32_t g = 0; g < in->n_groups; g++) {
		dp_group *dg = &w->groups[g];
		dg->choice = w->tables + off;
		dg->sat_u = w->sats + soff;
		off += (size_t)(dg->smax + 1) * dg->ucols;
		soff += (size_t)dg->smax + 1;
	}
	return 0;
}

/* Copies the plan in w->path into a frontier point allocated from a. */
static int dp_emit(const kiln_plan_instance *in, const int32_t *path, kiln_arena *a,
                   kiln_plan_point *p)
{
	size_t n = in->n_groups > 0 ? (size_t)in->n_groups : 1;
	int32_t *choice = kiln_arena_alloc(a, n * sizeof(int32_t));
	if (!choice)
		return -1;
	memcpy(choice, path, (size_t)in->n_groups * sizeof(int32_t));
	kiln_cost_plan_eval(in, choice, p);
	p->choice = choice;
	return 0;
}

/* Runs the DP over every group of in into w (allocated here; the caller
 * frees it with dp_work_free). *out_kd is the copy capacity the states
 * track, *out_last the table of the last group (or the empty start when
 * there are no groups: *start), *out_rate (NULL: not wanted) the paid rate
 * the states use. With out_vals, no source is skipped (dp_step's exact
 * mode: every state's value is its least prefix cost, but the choice
 * tables are not the canonical ones) and *out_vals (malloc'd, the caller
 * frees it even on failure; NULL until allocated) holds every group's
 * state values, row by row as its table. Returns 0 or -1. */
static int dp_fill(const kiln_plan_instance *in, dp_work *w, dp_group *start, uint32_t *out_kd,
                   const dp_group **out_last, double **out_vals, double *out_rate)
{
	if (kiln_cost_instance_check(in) != 0)
		return -1;
	uint64_t s_cap = 0, o_cap = 0;
	for (int32_t g = 0; g < in->n_groups; g++) {
		const kiln_plan_group *gr = &in->groups[g];
		if (gr->n_choices > 65535)
			return -1;
		uint32_t ms = 0, mo = 0;
		for (int32_t c = 0; c < gr->n_choices; c++) {
			if (gr->choices[c].saved_q > ms)
				ms = gr->choices[c].saved_q;
			if (gr->choices[c].offload_q > mo)
				mo = gr->choices[c].offload_q;
		}
		s_cap += ms;
		o_cap += mo;
	}
	/* Copies are never paid when they are free or the capacity covers every
	 * possible offload: one u column then suffices. */
	uint32_t kd = in->free_offload_q;
	double rate = in->offload_us_per_q;
	if (rate == 0.0 || o_cap <= kd) {
		kd = 0;
		rate = 0.0;
	}
	if (dp_alloc(in, (uint32_t)s_cap, kd, w) != 0)
		return -1;
	double *vals = NULL;
	if (out_vals) {
		size_t entries = 0;
		for (int32_t g = 0; g < in->n_groups; g++)
			entries += (size_t)(w->groups[g].smax + 1) * w->groups[g].ucols;
		if (entries > KBEST_MAX_VALUES)
			return -1;
		if (!(vals = malloc((entries ? entries : 1) * sizeof(double))))
			return -1;
		*out_vals = vals;
	}
	*start = (dp_group){.choice = NULL, .sat_u = NULL, .smax = 0, .ucols = 1};
	w->cur[0] = 0.0;
	w->cur_cols[0] = 1;
	const dp_group *prev = start;
	const size_t width = (size_t)kd + 1;
	for (int32_t g = 0; g < in->n_groups; g++) {
		dp_step(&in->groups[g], prev, &w->groups[g], kd, rate, out_vals != NULL, w);
		double *t = w->cur;
		w->cur = w->nxt;
		w->nxt = t;
		uint32_t *tc = w->cur_cols;
		w->cur_cols = w->nxt_cols;
		w->nxt_cols = tc;
		prev = &w->groups[g];
		if (vals) {
			/* Each state's least prefix cost: exact, as no source was
			 * skipped (the bound of kb_search_target). */
			const dp_group *dg = &w->groups[g];
			for (uint32_t s = 0; s <= dg->smax; s++)
				for (uint32_t u = 0; u < dg->ucols; u++)
					vals[(size_t)s * dg->ucols + u] =
					    u < w->cur_cols[s] ? w->cur[s * width + u] : INFINITY;
			vals += (size_t)(dg->smax + 1) * dg->ucols;
		}
	}
	*out_kd = kd;
	*out_last = prev;
	if (out_rate)
		*out_rate = rate;
	return 0;
}

/* Points of levels[0..n) (ascending savings, each reachable) after
 * keep-everything: at each level the plan traced from its cheapest state,
 * ties to the lower u. A level no dearer than the one before it (rounding
 * of re-evaluated totals) replaces it, from points[2] on. */
static int dp_emit_levels(const kiln_plan_instance *in, dp_work *w, uint32_t kd,
                          const dp_group *last, const uint32_t *levels, uint32_t n_levels,
                          kiln_arena *a, kiln_frontier *out)
{
	const size_t width = (size_t)kd + 1;
	kiln_plan_point *pts =
	    kiln_arena_alloc(a, ((size_t)n_levels + 1) * sizeof(kiln_plan_point));
	if (!pts)
		return -1;
	memset(w->path, 0, (size_t)(in->n_groups > 0 ? in->n_groups : 1) * sizeof(int32_t));
	if (dp_emit(in, w->path, a, &pts[0]) != 0)
		return -1;
	int32_t n = 1;
	for (uint32_t i = 0; i < n_levels; i++) {
		uint32_t s = levels[i];
		if (s == 0 || s > last->smax || !w->cur_cols[s])
			return -1;
		const double *row = w->cur + s * width;
		uint32_t bu = 0;
		for (uint32_t u = 1; u < w->cur_cols[s]; u++)
			if (row[u] < row[bu])
				bu = u;
		if (!(row[bu] < INFINITY))
			return -1;
		dp_trace(in, w, kd, s, bu);
		if (dp_emit(in, w->path, a, &pts[n]) != 0)
			return -1;
		/* Re-evaluated totals differ from the DP's sums only by rounding;
		 * keep the order strict regardless (points[1] may tie points[0] at
		 * zero cost when free copy capacity saves bytes). */
		if (n >= 2 && pts[n].exposed_us <= pts[n - 1].exposed_us)
			pts[n - 1] = pts[n];
		else
			n++;
	}
	out->points = pts;
	out->n_points = n;
	return 0;
}

/* The frontier's saving levels into w->pick, ascending; returns how many.
 * From the largest saving down, a saving is kept when it is strictly
 * cheaper than every larger one, so at one cost level the largest saving
 * wins. Saving 0 (keep-everything) is not among them. */
static uint32_t dp_levels(dp_work *w, uint32_t kd, const dp_group *last)
{
	const size_t width = (size_t)kd + 1;
	uint32_t n_pick = 0;
	double run = INFINITY;
	for (uint32_t s = last->smax; s >= 1; s--) {
		if (!w->cur_cols[s])
			continue;
		const double *row = w->cur + s * width;
		double best = INFINITY;
		for (uint32_t u = 0; u < w->cur_cols[s]; u++)
			if (row[u] < best)
				best = row[u];
		if (best < INFINITY && (isinf(run) || best < run - tie_tol(run))) {
			w->pick[n_pick++] = s;
			run = best;
		}
	}
	for (uint32_t i = 0; i < n_pick / 2; i++) {
		uint32_t t = w->pick[i];
		w->pick[i] = w->pick[n_pick - 1 - i];
		w->pick[n_pick - 1 - i] = t;
	}
	return n_pick;
}

/* Ownership: in is borrowed for the call; out->points and every point's
 * choice live in a. Temporary tables are malloc'd and freed on every path.
 * Time O(groups * choices * S * (K' + 1)), memory O(groups * S * (K' + 1))
 * bytes, where S is the sum of the groups' largest savings and K' the free
 * copy capacity capped at the largest possible offload (0 when copies are
 * free: offload_us_per_q == 0 or K covers every offload). Refuses (-1)
 * groups with more than 65535 choices and tables over 2^29 entries. */
int kiln_cost_frontier_dp(const kiln_plan_instance *in, kiln_arena *a, kiln_frontier *out)
{
	if (!out)
		return -1;
	out->points = NULL;
	out->n_points = 0;
	dp_work w;
	memset(&w, 0, sizeof(w));
	dp_group start;
	const dp_group *last;
	uint32_t kd;
	int rc = -1;
	if (dp_fill(in, &w, &start, &kd, &last, NULL, NULL) != 0)
		goto done;

	uint32_t n_pick = dp_levels(&w, kd, last);
	rc = dp_emit_levels(in, &w, kd, last, w.pick, n_pick, a, out);
done:
	dp_work_free(&w);
	return rc;
}

/* Ownership: in and levels borrowed; out's points and choices live in a.
 * Same cost as kiln_cost_frontier_dp. */
int kiln_cost_frontier_levels(const kiln_plan_instance *in, const uint32_t *levels,
                              int32_t n_levels, kiln_arena *a, kiln_frontier *out)
{
	if (!out || n_levels < 0 || (n_levels > 0 && !levels))
		return -1;
	out->points = NULL;
	out->n_points = 0;
	for (int32_t i = 1; i < n_levels; i++)
		if (levels[i] <= levels[i - 1])
			return -1;
	dp_work w;
	memset(&w, 0, sizeof(w));
	dp_group start;
	const dp_group *last;
	uint32_t kd;
	int rc = -1;
	if (dp_fill(in, &w, &start, &kd, &last, NULL, NULL) == 0)
		rc = dp_emit_levels(in, &w, kd, last, levels, (uint32_t)n_levels, a, out);
	dp_work_free(&w);
	return rc;
}

/* Ownership: in is borrowed; out->choice lives in a. Time O(combinations *
 * groups), memory O(groups). Ties (within the frontier's tolerance): the
 * larger saving, then the lexicographically smallest choice vector. */
int kiln_cost_solve_brute(const kiln_plan_instance *in, uint32_t min_saved_q, kiln_arena *a,
                          kiln_plan_point *out)
{
	if (!out || kiln_cost_instance_check(in) != 0)
		return -1;
	uint64_t combos = 1;
	for (int32_t g = 0; g < in->n_groups; g++) {
		combos *= (uint64_t)in->groups[g].n_choices;
		if (combos > ((uint64_t)1 << 22))
			return -1;
	}
	size_t n = in->n_groups > 0 ? (size_t)in->n_groups : 1;
	int32_t *cur = calloc(n, sizeof(int32_t));
	int32_t *best = kiln_arena_alloc(a, n * sizeof(int32_t));
	if (!cur || !best) {
		free(cur);
		return -1;
	}
	int found = 0;
	kiln_plan_point bp = {0};
	for (uint64_t k = 0; k < combos; k++) {
		kiln_plan_point p;
		kiln_cost_plan_eval(in, cur, &p);
		if (p.saved_q >= min_saved_q) {
			int better = !found ||
			             p.exposed_us < bp.exposed_us - tie_tol(bp.exposed_us) ||
			             (p.exposed_us <= bp.exposed_us + tie_tol(bp.exposed_us) &&
			              p.saved_q > bp.saved_q);
			if (better) {
				bp = p;
				memcpy(best, cur, (size_t)in->n_groups * sizeof(int32_t));
				found = 1;
			}
		}
		/* Odometer over choice vectors, last group fastest: lexicographic. */
		for (int32_t g = in->n_groups - 1; g >= 0; g--) {
			if (++cur[g] < in->groups[g].n_choices)
				break;
			cur[g] = 0;
		}
	}
	free(cur);
	if (!found)
		return 1;
	*out = bp;
	out->choice = best;
	return 0;
}

/* ---- the k cheapest plans (kiln_cost_kbest)
 *
 * A best-first search backwards over the DP's layered states: a node is a
 * suffix of choices (groups g..G-1) ending in a final state, standing at
 * the state (s, u) after groups 0..g-1; its key is the suffix's cost plus
 * V_g(s, u), the least cost of any prefix reaching (s, u), from a DP run
 * that skips no source (dp_step's exact mode). So a node's key is the
 * cost of the cheapest plan completing it, and complete plans (g = 0 at
 * (0, 0), where the key is the plan's own cost) leave the queue cheapest
 * first. Each plan is one path (its state sequence follows from its
 * choices), so plans come out distinct. A row node (u = KB_ROW) stands for
 * every final state of one saving row and opens them when it leaves the
 * queue. The canonical plans come from the usual (skipping) run, whose
 * traces the frontier's. */

#define KB_ROW UINT32_MAX
/* Nodes one target's search may create; past it the plans found so far
 * (the cheapest, in order) are returned. */
#define KB_MAX_NODES ((size_t)1 << 20)

typedef struct kb_node {
	double key, suffix;
	uint32_t s, u;
	int32_t g, parent, choice;
} kb_node;

typedef struct kb_search {
	kb_node *nodes;
	size_t n, cap;
	int32_t *heap;
	size_t hn, hcap;
} kb_search;

/* Heap order: smaller key, then deeper (smaller g: nearer a whole plan),
 * then older. Deterministic for a given instance. */
static bool kb_before(const kb_search *k, int32_t x, int32_t y)
{
	const kb_node *a = &k->nodes[x], *b = &k->nodes[y];
	if (a->key != b->key)
		return a->key < b->key;
	if (a->g != b->g)
		return a->g < b->g;
	return x < y;
}

/* p (*cap elements of size elem, n used) with room for one more: itself,
 * or reallocated at twice the size when full (*cap updated); NULL when
 * that fails, p then unchanged and still owned by the caller. */
static void *kb_room(void *p, size_t *cap, size_t n, size_t elem)
{
	if (n < *cap)
		return p;
	size_t c = *cap ? 2 * *cap : 1024;
	void *q = realloc(p, c * elem);
	if (q)
		*cap = c;
	return q;
}

static int kb_push(kb_search *k, const kb_node *nd)
{
	if (k->n >= KB_MAX_NODES)
		return 1;
	kb_node *nn = kb_room(k->nodes, &k->cap, k->n, sizeof *nn);
	if (!nn)
		return -1;
	k->nodes = nn;
	int32_t *nh = kb_room(k->heap, &k->hcap, k->hn, sizeof *nh);
	if (!nh)
		return -1;
	k->heap = nh;
	int32_t id = (int32_t)k->n;
	k->nodes[k->n++] = *nd;
	size_t i = k->hn++;
	while (i > 0 && kb_before(k, id, k->heap[(i - 1) / 2])) {
		k->heap[i] = k->heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	k->heap[i] = id;
	return 0;
}

static int32_t kb_pop(kb_search *k)
{
	int32_t top = k->heap[0], last = k->heap[--k->hn];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= k->hn)
			break;
		if (c + 1 < k->hn && kb_before(k, k->heap[c + 1], k->heap[c]))
			c++;
		if (!kb_before(k, k->heap[c], last))
			break;
		k->heap[i] = k->heap[c];
		i = c;
	}
	if (k->hn)
		k->heap[i] = last;
	return top;
}

/* V_g(s, u): vals[g - 1] holds groups[g - 1]'s states (g >= 1); layer 0
 * is the start (0, 0). */
static double kb_bound(double *const *vals, const dp_work *w, int32_t g, uint32_t s, uint32_t u)
{
	if (g == 0)
		return s == 0 && u == 0 ? 0.0 : INFINITY;
	const dp_group *dg = &w->groups[g - 1];
	if (s > dg->smax || u >= dg->ucols)
		return INFINITY;
	return vals[g - 1][(size_t)s * dg->ucols + u];
}

/* The up to k - 1 cheapest plans saving at least target other than
 * skip (a choice vector), cheapest first, into out (their choices from a);
 * *out_n how many. Returns 0 or -1. */
static int kb_search_target(const kiln_plan_instance *in, const dp_work *w, double *const *vals,
                            const double *row_min, uint32_t kd, double rate, uint32_t target,
                            const int32_t *skip, int32_t k, kiln_arena *a, kiln_plan_point *out,
                            int32_t *out_n)
{
	const int32_t G = in->n_groups;
	kb_search ks = {0};
	int rc = 0;
	*out_n = 0;
	if (G == 0)
		return 0; /* keep-everything is the only plan */
	const uint32_t smax = w->groups[G - 1].smax;
	for (uint32_t s = target; s <= smax && rc == 0; s++) {
		double h = row_min[s];
		if (h < INFINITY)
			rc = kb_push(&ks, &(kb_node){h, 0.0, s, KB_ROW, G, -1, -1});
	}
	int32_t *path = w->path;
	while (rc == 0 && ks.hn > 0 && *out_n < k - 1) {
		int32_t id = kb_pop(&ks);
		kb_node nd = ks.nodes[id];
		if (nd.u == KB_ROW) {
			const dp_group *dg = &w->groups[G - 1];
			for (uint32_t u = 0; u < dg->ucols && rc == 0; u++) {
				double h = kb_bound(vals, w, G, nd.s, u);
				if (h < INFINITY)
					rc = kb_push(&ks, &(kb_node){h, 0.0, nd.s, u, G, -1, -1});
			}
			continue;
		}
		if (nd.g == 0) {
			for (int32_t x = id; ks.nodes[x].g < G; x = ks.nodes[x].parent)
				path[ks.nodes[x].g] = ks.nodes[x].choice;
			if (skip && memcmp(path, skip, (size_t)G * sizeof(int32_t)) == 0)
				continue;
			if (dp_emit(in, path, a, &out[*out_n]) != 0) {
				rc = -1;
				break;
			}
			(*out_n)++;
			continue;
		}
		/* Predecessors through each choice of group g - 1. */
		const kiln_plan_group *gr = &in->groups[nd.g - 1];
		for (int32_t c = 0; c < gr->n_choices && rc == 0; c++) {
			const kiln_plan_choice *ch = &gr->choices[c];
			if (ch->saved_q > nd.s)
				continue;
			uint32_t ps = nd.s - ch->saved_q, wq = ch->offload_q;
			uint32_t lo, hi;
			if (nd.u < kd) { /* unsaturated: u came from u - wq */
				if (wq > nd.u)
					continue;
				lo = hi = nd.u - wq;
			} else { /* saturated (or one column): any u' with u' + wq >= kd */
				lo = kd > wq ? kd - wq : 0;
				hi = kd;
			}
			for (uint32_t pu = lo; pu <= hi && rc == 0; pu++) {
				double h = kb_bound(vals, w, nd.g - 1, ps, pu);
				if (!(h < INFINITY))
					continue;
				double step = ch->recompute_us;
				if (nd.u >= kd)
					step += (double)(pu + wq - kd) * rate;
				double suf = nd.suffix + step;
				rc =
				    kb_push(&ks, &(kb_node){h + suf, suf, ps, pu, nd.g - 1, id, c});
			}
		}
	}
	free(ks.nodes);
	free(ks.heap);
	return rc < 0 ? -1 : 0;
}

/* Ownership: in and targets borrowed; out (n_targets * k points, caller's)
 * gets choices allocated from a. Time: one DP fill (kiln_cost_frontier_dp's)
 * plus per target a search of at most 2^20 nodes; memory: the DP's plus 8
 * bytes per state of every group's table (refused, -1, past 2^25). */
int kiln_cost_kbest(const kiln_plan_instance *in, const uint32_t *targets, int32_t n_targets,
                    int32_t k, kiln_arena *a, kiln_plan_point *out, int32_t *out_n)
{
	if (!out || !out_n || n_targets < 0 || (n_targets > 0 && !targets) || k < 1 ||
	    k > KILN_PLAN_KBEST_MAX)
		return -1;
	for (int32_t i = 0; i < n_targets; i++)
		out_n[i] = 0;
	dp_work w;
	memset(&w, 0, sizeof(w));
	dp_group start;
	const dp_group *last;
	uint32_t kd;
	double rate, *all = NULL, *row_min = NULL;
	double **vals = NULL;
	int rc = -1;
	if (dp_fill(in, &w, &start, &kd, &last, NULL, NULL) != 0)
		goto done;
	uint32_t n_pick = dp_levels(&w, kd, last);
	const size_t width = (size_t)kd + 1;
	for (int32_t i = 0; i < n_targets; i++) {
		kiln_plan_point *o = &out[(size_t)i * (size_t)k];
		/* First the frontier's own answer: the first level saving at least
		 * the target, traced by the canonical rule (dp_emit_levels). */
		uint32_t j = 0;
		while (j < n_pick && w.pick[j] < targets[i])
			j++;
		if (targets[i] == 0) {
			memset(w.path, 0,
			       (size_t)(in->n_groups > 0 ? in->n_groups : 1) * sizeof(int32_t));
		} else if (j < n_pick) {
			uint32_t s = w.pick[j], bu = 0;
			const double *row = w.cur + s * width;
			for (uint32_t u = 1; u < w.cur_cols[s]; u++)
				if (row[u] < row[bu])
					bu = u;
			dp_trace(in, &w, kd, s, bu);
		} else {
			continue; /* nothing saves that much */
		}
		if (dp_emit(in, w.path, a, &o[0]) != 0)
			goto done;
		out_n[i] = 1;
	}
	if (k > 1) {
		dp_work_free(&w);
		memset(&w, 0, sizeof(w));
		if (dp_fill(in, &w, &start, &kd, &last, &all, &rate) != 0)
			goto done;
		vals = malloc((size_t)(in->n_groups > 0 ? in->n_groups : 1) * sizeof *vals);
		if (!vals)
			goto done;
		size_t off = 0;
		for (int32_t g = 0; g < in->n_groups; g++) {
			vals[g] = all + off;
			off += (size_t)(w.groups[g].smax + 1) * w.groups[g].ucols;
		}
		/* Each final row's cheapest state: the key of its row node. */
		if (!(row_min = malloc(((size_t)last->smax + 1) * sizeof(double))))
			goto done;
		for (uint32_t s = 0; s <= last->smax; s++) {
			row_min[s] = INFINITY;
			for (uint32_t u = 0; in->n_groups > 0 && u < last->ucols; u++)
				row_min[s] =
				    fmin(row_min[s], kb_bound(vals, &w, in->n_groups, s, u));
		}
		for (int32_t i = 0; i < n_targets; i++) {
			kiln_plan_point *o = &out[(size_t)i * (size_t)k];
			int32_t n = 0;
			if (out_n[i] == 1 &&
			    kb_search_target(in, &w, vals, row_min, kd, rate, targets[i],
			                     o[0].choice, k, a, o + 1, &n) != 0)
				goto done;
			out_n[i] += n;
		}
	}
	rc = 0;
done:
	free(row_min);
	free(vals);
	free(all);
	dp_work_free(&w);
	return rc;
}
