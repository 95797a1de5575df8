/* tests/test_solvers.c: costmodel/knapsack.c and costmodel/milp.c.
 *
 * Expected values come from outside the solvers: a hand-worked instance,
 * and for random instances an exhaustive enumeration written here (its own
 * totals, not kiln_cost_plan_eval) that gives the cheapest exposed time for
 * every saving target. The DP frontier, the MILP and the brute-force solver
 * must all agree with it, and with each other where it is too large to run.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "kiln_test.h"

#define T_MAX_GROUPS 12
#define T_MAX_CHOICES 9
/* Instances up to this many plans are enumerated by the test itself. */
#define T_ENUM_LIMIT (1u << 18)

typedef struct tinst {
	kiln_plan_instance in;
	kiln_plan_group groups[T_MAX_GROUPS];
	kiln_plan_choice choices[T_MAX_GROUPS][T_MAX_CHOICES];
	uint32_t s_cap; /* sum of the groups' largest savings */
	uint64_t combos;
} tinst;

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_next(uint64_t *s)
{
	/* splitmix64 */
	uint64_t z = (*s += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

static uint32_t rng_below(uint64_t *s, uint32_t n)
{
	return (uint32_t)(rng_next(s) % n);
}

/* Relative 0.1% with a 1e-6 us floor. */
static int close_us(double a, double b)
{
	return fabs(a - b) <= 1e-3 * fmax(fabs(a), fabs(b)) + 1e-6;
}

/* Totals of a plan by the equations of docs/cost-model.md, written here
 * independently of kiln_cost_plan_eval. */
static void t_eval(const kiln_plan_instance *in, const int32_t *choice, uint32_t *s, uint32_t *o,
                   double *e)
{
	uint32_t ss = 0, oo = 0;
	double r = 0.0;
	for (int32_t g = 0; g < in->n_groups; g++) {
		const kiln_plan_choice *c = &in->groups[g].choices[choice[g]];
		ss += c->saved_q;
		oo += c->offload_q;
		r += c->recompute_us;
	}
	double paid = oo > in->free_offload_q ? (double)(oo - in->free_offload_q) : 0.0;
	*s = ss;
	*o = oo;
	*e = r + paid * in->offload_us_per_q;
}

static void t_finish(tinst *t)
{
	t->s_cap = 0;
	t->combos = 1;
	for (int32_t g = 0; g < t->in.n_groups; g++) {
		uint32_t ms = 0;
		for (int32_t c = 0; c < t->groups[g].n_choices; c++)
			if (t->choices[g][c].saved_q > ms)
				ms = t->choices[g][c].saved_q;
		t->s_cap += ms;
		t->combos *= (uint64_t)t->groups[g].n_choices;
		t->groups[g].choices = t->choices[g];
	}
	t->in.groups = t->groups;
}

/* A random instance: 1..12 groups of 1..3 units, 1..9 distinct joint
 * choices per group (choices[0] keeps all), each unit with its own saved and
 * offloaded quanta (some zero) and recompute time; recomputing two or more
 * units of a group together shares part of the work. Costs are multiples of
 * 0.25 us, so sums are exact and cost ties are real ties. */
static void t_random(tinst *t, uint64_t *rng)
{
	memset(t, 0, sizeof(*t));
	int32_t ng = 1 + (int32_t)rng_below(rng, T_MAX_GROUPS);
	int32_t unit = 0;
	uint64_t o_cap = 0;
	for (int32_t g = 0; g < ng; g++) {
		kiln_plan_group *gr = &t->groups[g];
		gr->n_units = 1 + (int32_t)rng_below(rng, 3);
		uint32_t q[3], oq[3];
		double rc[3];
		for (int32_t k = 0; k < gr->n_units; k++) {
			gr->units[k] = unit++;
			q[k] = rng_below(rng, 6) == 0 ? 0 : rng_below(rng, 67);
			oq[k] = q[k] + rng_below(rng, 3);
			rc[k] = 0.5 * rng_below(rng, 600);
		}
		int32_t vectors = gr->n_units == 1 ? 3 : gr->n_units == 2 ? 9 : 27;
		int32_t want = 1 + (int32_t)rng_below(rng, T_MAX_CHOICES);
		if (want > vectors)
			want = vectors;
		/* Distinct action vectors: vector 0 (all keep) first, then a random
		 * subset of the others, as base-3 numbers. */
		uint8_t used[27] = {1};
		int32_t nc = 1;
		while (nc < want) {
			int32_t v = 1 + (int32_t)rng_below(rng, (uint32_t)vectors - 1);
			if (used[v])
				continue;
			used[v] = 1;
			kiln_plan_choice *c = &t->choices[g][nc++];
			int32_t nrec = 0;
			double rsum = 0.0, rmin = INFINITY;
			for (int32_t k = 0, x = v; k < gr->n_units; k++, x /= 3) {
				c->actions[k] = (uint8_t)(x % 3);
				if (c->actions[k] != KILN_ACT_KEEP)
					c->saved_q += q[k];
				if (c->actions[k] == KILN_ACT_OFFLOAD)
					c->offload_q += oq[k];
				if (c->actions[k] == KILN_ACT_RECOMPUTE) {
					nrec++;
					rsum += rc[k];
					rmin = fmin(rmin, rc[k]);
				}
			}
			c->recompute_us = nrec >= 2 ? rsum - 0.5 * rmin : rsum;
		}
		gr->n_choices = nc;
		uint32_t mo = 0;
		for (int32_t c = 0; c < nc; c++)
			if (t->choices[g][c].offload_q > mo)
				mo = t->choices[g][c].offload_q;
		o_cap += mo;
	}
	t->in.n_units = unit;
	t->in.n_groups = ng;
	t->in.quantum_bytes = 1u << 20;
	switch (rng_below(rng, 5)) {
	case 0:
		t->in.free_offload_q = 0;
		break;
	case 1:
		t->in.free_offload_q = KILN_PLAN_MAX_QUANTA; /* covers any offload */
		break;
	case 2:
		t->in.free_offload_q = (uint32_t)(o_cap / 2);
		break;
	default:
		t->in.free_offload_q = rng_below(rng, (uint32_t)o_cap + 1);
		break;
	}
	static const double rates[] = {0.0, 0.25, 1.0, 2.5, 7.0, 40.0};
	t->in.offload_us_per_q = rates[rng_below(rng, 6)];
	t_finish(t);
}

/* Cheapest exposed time of any plan saving at least t, for t in
 * 0..s_cap + 1 (INFINITY: none), by enumerating every plan. Caller frees. */
static double *t_oracle(const tinst *t)
{
	double *best = malloc(((size_t)t->s_cap + 2) * sizeof(double));
	cr_assert_not_null(best);
	for (uint32_t s = 0; s <= t->s_cap + 1; s++)
		best[s] = INFINITY;
	int32_t cur[T_MAX_GROUPS] = {0};
	for (uint64_t k = 0; k < t->combos; k++) {
		uint32_t s, o;
		double e;
		t_eval(&t->in, cur, &s, &o, &e);
		if (e < best[s])
			best[s] = e;
		for (int32_t g = t->in.n_groups - 1; g >= 0; g--) {
			if (++cur[g] < t->groups[g].n_choices)
				break;
			cur[g] = 0;
		}
	}
	for (uint32_t s = t->s_cap; s-- > 0;)
		best[s] = fmin(best[s], best[s + 1]);
	return best;
}

/* The frontier's answer for a target: the first point saving enough. */
static const kiln_plan_point *lookup(const kiln_frontier *f, uint32_t target)
{
	for (int32_t i = 0; i < f->n_points; i++)
		if (f->points[i].saved_q >= target)
			return &f->points[i];
	return NULL;
}

/* Shape of any frontier: keep-all first, strictly increasing saving,
 * strictly increasing exposed time from points[1] on (points[1] may tie at
 * zero cost when free copy capacity saves bytes), totals that match the
 * point's own choices. */
static void check_frontier_shape(const tinst *t, const kiln_frontier *f, const char *who, int id)
{
	cr_assert(f->n_points >= 1, "%s %d: empty frontier", who, id);
	const kiln_plan_point *p0 = &f->points[0];
	cr_assert(p0->saved_q == 0 && p0->offload_q == 0 && p0->exposed_us == 0.0,
	          "%s %d: points[0] is not (0, 0)", who, id);
	for (int32_t g = 0; g < t->in.n_groups; g++)
		cr_assert_eq(p0->choice[g], 0, "%s %d: points[0] does not keep group %d", who, id,
		             g);
	for (int32_t i = 0; i < f->n_points; i++) {
		const kiln_plan_point *p = &f->points[i];
		for (int32_t g = 0; g < t->in.n_groups; g++)
			cr_assert(p->choice[g] >= 0 && p->choice[g] < t->groups[g].n_choices,
			          "%s %d: point %d group %d choice out of range", who, id, i, g);
		kiln_plan_point ev;
		kiln_cost_plan_eval(&t->in, p->choice, &ev);
		uint32_t s, o;
		double e;
		t_eval(&t->in, p->choice, &s, &o, &e);
		cr_assert(p->saved_q == ev.saved_q && p->offload_q == ev.offload_q &&
		              p->recompute_us == ev.recompute_us && p->exposed_us == ev.exposed_us,
		          "%s %d: point %d totals differ from kiln_cost_plan_eval", who, id, i);
		cr_assert(s == p->saved_q && o == p->offload_q && close_us(e, p->exposed_us),
		          "%s %d: point %d totals differ from the equations", who, id, i);
		if (i > 0) {
			const kiln_plan_point *q = &f->points[i - 1];
			cr_assert(p->saved_q > q->saved_q, "%s %d: saving not increasing at %d",
			          who, id, i);
			if (i > 1)
				cr_assert(p->exposed_us > q->exposed_us,
				          "%s %d: exposed not increasing at %d", who, id, i);
			else
				cr_assert(p->exposed_us >= q->exposed_us,
				          "%s %d: points[1] below (0, 0)", who, id);
		}
	}
}

/* Every frontier point is optimal for its saving and no plan saves more at
 * its cost (no plan dominates it); every target gets the oracle's cost. */
static void check_against_oracle(const tinst *t, const kiln_frontier *f, const double *best,
                                 const char *who, int id)
{
	for (int32_t i = 0; i < f->n_points; i++) {
		const kiln_plan_point *p = &f->points[i];
		cr_assert(close_us(p->exposed_us, best[p->saved_q]),
		          "%s %d: point %d (saved %u) costs %g, a plan saving as much costs %g",
		          who, id, i, p->saved_q, p->exposed_us, best[p->saved_q]);
		if (i > 0 && p->saved_q < t->s_cap)
			cr_assert(best[p->saved_q + 1] > p->exposed_us + 1e-9,
			          "%s %d: a plan saves more than point %d at its cost", who, id, i);
	}
	for (uint32_t target = 0; target <= t->s_cap + 1; target++) {
		const kiln_plan_point *p = lookup(f, target);
		if (isinf(best[target])) {
			cr_assert_null(p, "%s %d: target %u is infeasible", who, id, target);
			continue;
		}
		cr_assert_not_null(p, "%s %d: target %u is feasible", who, id, target);
		cr_assert(close_us(p->exposed_us, best[target]), "%s %d: target %u: %g, oracle %g",
		          who, id, target, p->exposed_us, best[target]);
	}
}

/* ---------------------------------------------------------------- hand-worked */

/* K = 2 free quanta, rate 10 us per paid quantum.
 *   group 0 (unit 0):    keep; R: saved 4, 5 us; O: saved 4, offload 4
 *   group 1 (unit 1):    keep; R: saved 2, 1 us; O: saved 2, offload 2
 *   group 2 (units 2,3): keep; (R,K): saved 3, 6 us; (R,R): saved 5, 7 us;
 *                        (O,K): saved 3, offload 3
 * Cheapest per exact saving, cost = R + 10 * max(0, O - 2), over all 36 plans:
 *   S=0: 0 keep-all     S=2: 0 (k,O,k)        S=3: 6 (k,k,RK)
 *   S=4: 5 (R,k,k)      S=5: 6 (k,O,RK)       S=6: 5 (R,O,k)
 *   S=7: 7 (k,O,RR)     S=9: 11 (R,O,RK)      S=11: 12 (R,O,RR)
 * (e.g. S=6: (R,R,k) 6, (R,O,k) 5, (O,R,k) 4 paid = 21, (O,O,k) 40.)
 * Walking down from S=11 and keeping what is strictly cheaper than every
 * larger saving: 11:12, 9:11, 7:7, 6:5, then 5:6, 4:5 (tie: 6 wins), 3:6
 * drop, 2:0 kept; plus keep-all. Frontier:
 *   (0, 0) [0,0,0]; (2, 0) [0,2,0]; (6, 5) [1,2,0]; (7, 7) [0,2,2];
 *   (9, 11) [1,2,1]; (11, 12) [1,2,2]; every non-first point offloads 2.
 */
static void hand_instance(tinst *t)
{
	memset(t, 0, sizeof(*t));
	const kiln_plan_choice c0[] = {
	    {.actions = {0}},
	    {.actions = {KILN_ACT_RECOMPUTE}, .saved_q = 4, .recompute_us = 5.0},
	    {.actions = {KILN_ACT_OFFLOAD}, .saved_q = 4, .offload_q = 4},
	};
	const kiln_plan_choice c1[] = {
	    {.actions = {0}},
	    {.actions = {KILN_ACT_RECOMPUTE}, .saved_q = 2, .recompute_us = 1.0},
	    {.actions = {KILN_ACT_OFFLOAD}, .saved_q = 2, .offload_q = 2},
	};
	const kiln_plan_choice c2[] = {
	    {.actions = {0}},
	    {.actions = {KILN_ACT_RECOMPUTE, KILN_ACT_KEEP}, .saved_q = 3, .recompute_us = 6.0},
	    {.actions = {KILN_ACT_RECOMPUTE, KILN_ACT_RECOMPUTE},
	     .saved_q = 5,
	     .recompute_us = 7.0},
	    {.actions = {KILN_ACT_OFFLOAD, KILN_ACT_KEEP}, .saved_q = 3, .offload_q = 3},
	};
	memcpy(t->choices[0], c0, sizeof(c0));
	memcpy(t->choices[1], c1, sizeof(c1));
	memcpy(t->choices[2], c2, sizeof(c2));
	t->groups[0] = (kiln_plan_group){.units = {0}, .n_units = 1, .n_choices = 3};
	t->groups[1] = (kiln_plan_group){.units = {1}, .n_units = 1, .n_choices = 3};
	t->groups[2] = (kiln_plan_group){.units = {2, 3}, .n_units = 2, .n_choices = 4};
	t->in = (kiln_plan_instance){.n_units = 4,
	                             .n_groups = 3,
	                             .quantum_bytes = 4096,
	                             .free_offload_q = 2,
	                             .offload_us_per_q = 10.0};
	t_finish(t);
}

static void check_hand_frontier(const kiln_frontier *f, const char *who)
{
	static const uint32_t saved[] = {0, 2, 6, 7, 9, 11};
	static const double exposed[] = {0, 0, 5, 7, 11, 12};
	static const int32_t choice[][3] = {{0, 0, 0}, {0, 2, 0}, {1, 2, 0},
	                                    {0, 2, 2}, {1, 2, 1}, {1, 2, 2}};
	cr_assert_eq(f->n_points, 6, "%s: %d points", who, f->n_points);
	for (int32_t i = 0; i < 6; i++) {
		const kiln_plan_point *p = &f->points[i];
		cr_assert_eq(p->saved_q, saved[i], "%s: point %d saved", who, i);
		cr_assert_eq(p->offload_q, i == 0 ? 0u : 2u, "%s: point %d offload", who, i);
		cr_assert_eq(p->exposed_us, exposed[i], "%s: point %d exposed %g", who, i,
		             p->exposed_us);
		cr_assert_eq(p->recompute_us, exposed[i], "%s: point %d recompute", who, i);
		for (int32_t g = 0; g < 3; g++)
			cr_assert_eq(p->choice[g], choice[i][g], "%s: point %d group %d", who, i,
			             g);
	}
}

Test(solvers, dp_hand_worked_frontier)
{
	tinst t;
	hand_instance(&t);
	kiln_arena *a = kiln_arena_new();
	kiln_frontier f;
	cr_assert_eq(kiln_cost_frontier_dp(&t.in, a, &f), 0);
	check_hand_frontier(&f, "dp");
	kiln_arena_free(a);
}

Test(solvers, milp_hand_worked_frontier)
{
	tinst t;
	hand_instance(&t);
	kiln_arena *a = kiln_arena_new();
	kiln_frontier f;
	cr_assert_eq(kiln_cost_frontier_milp(&t.in, a, &f), 0);
	check_hand_frontier(&f, "milp");
	kiln_arena_free(a);
}

Test(solvers, hand_worked_targets)
{
	/* Cheapest saving at least t, from the table above (suffix minima). */
	static const double want[] = {0, 0, 0, 5, 5, 5, 5, 7, 11, 11, 12, 12};
	static const uint32_t want_saved[] = {2, 2, 2, 6, 6, 6, 6, 7, 9, 9, 11, 11};
	tinst t;
	hand_instance(&t);
	kiln_arena *a = kiln_arena_new();
	for (uint32_t target = 0; target <= 12; target++) {
		kiln_plan_point pb, pm;
		int rb = kiln_cost_solve_brute(&t.in, target, a, &pb);
		int rm = kiln_cost_solve_milp(&t.in, target, a, &pm);
		if (target == 12) {
			cr_assert_eq(rb, 1, "brute: 12 is infeasible");
			cr_assert_eq(rm, 1, "milp: 12 is infeasible");
			continue;
		}
		cr_assert_eq(rb, 0, "brute target %u", target);
		cr_assert_eq(rm, 0, "milp target %u", target);
		cr_assert_eq(pb.exposed_us, want[target], "brute target %u: %g", target,
		             pb.exposed_us);
		cr_assert_eq(pm.exposed_us, want[target], "milp target %u: %g", target,
		             pm.exposed_us);
		/* Ties go to the larger saving. */
		cr_assert_eq(pb.saved_q, want_saved[target], "brute target %u saved", target);
		cr_assert_eq(pm.saved_q, want_saved[target], "milp target %u saved", target);
	}
	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- random */

/* Instances [first, first + count) of the fixed random sequence: the DP
 * frontier's shape, DP against the oracle (all targets) and against the
 * MILP (several targets), brute force against the oracle on small ones. */
static void random_batch(int first, int count)
{
	uint64_t rng = 0x6b696c6eu; /* "kiln" */
	tinst t;
	for (int id = 0; id < first + count; id++) {
		t_random(&t, &rng);
		if (id < first)
			continue;
		kiln_arena *a = kiln_arena_new();
		kiln_frontier f;
		cr_assert_eq(kiln_cost_frontier_dp(&t.in, a, &f), 0, "dp %d", id);
		check_frontier_shape(&t, &f, "dp", id);
		double *best = NULL;
		if (t.combos <= T_ENUM_LIMIT) {
			best = t_oracle(&t);
			check_against_oracle(&t, &f, best, "dp", id);
		}

		uint32_t targets[6] = {0,
		                       t.s_cap,
		                       t.s_cap + 1,
		                       1 + rng_below(&rng, t.s_cap + 1),
		                       rng_below(&rng, t.s_cap + 1),
		                       0};
		const kiln_plan_point *mid = &f.points[rng_below(&rng, (uint32_t)f.n_points)];
		targets[5] = mid->saved_q + 1;
		for (int k = 0; k < 6; k++) {
			uint32_t target = targets[k];
			const kiln_plan_point *d = lookup(&f, target);
			kiln_plan_point m;
			int rm = kiln_cost_solve_milp(&t.in, target, a, &m);
			cr_assert(rm == 0 || rm == 1, "milp %d target %u: %d", id, target, rm);
			cr_assert_eq(rm == 0, d != NULL, "milp %d target %u: feasibility differs",
			             id, target);
			if (rm == 0) {
				uint32_t s, o;
				double e;
				t_eval(&t.in, m.choice, &s, &o, &e);
				cr_assert(s == m.saved_q && s >= target &&
				              close_us(e, m.exposed_us),
				          "milp %d target %u: totals", id, target);
				cr_assert(close_us(m.exposed_us, d->exposed_us),
				          "milp %d target %u: milp %g, dp %g", id, target,
				          m.exposed_us, d->exposed_us);
			}
			if (best && t.in.n_units <= 12) {
				kiln_plan_point b;
				int rb = kiln_cost_solve_brute(&t.in, target, a, &b);
				cr_assert_eq(rb, isinf(best[target]) ? 1 : 0,
				             "brute %d target %u: %d", id, target, rb);
				if (rb == 0) {
					cr_assert(b.saved_q >= target &&
					              close_us(b.exposed_us, best[target]),
					          "brute %d target %u: %g, oracle %g", id, target,
					          b.exposed_us, best[target]);
					cr_assert(close_us(b.exposed_us, d->exposed_us),
					          "brute %d target %u: brute %g, dp %g", id, target,
					          b.exposed_us, d->exposed_us);
				}
			}
		}
		free(best);
		kiln_arena_free(a);
	}
}

Test(solvers, random_instances_0_to_59)
{
	random_batch(0, 60);
}

Test(solvers, random_instances_60_to_119)
{
	random_batch(60, 60);
}

Test(solvers, random_instances_120_to_179)
{
	random_batch(120, 60);
}

Test(solvers, random_instances_180_to_239)
{
	random_batch(180, 60);
}

/* The MILP frontier (successive solves) equals the DP frontier point for
 * point: costs are exact multiples of 0.25 us, so both keep the same
 * largest saving at each cost level. */
Test(solvers, milp_frontier_equals_dp_frontier, .init = kt_slow)
{
	uint64_t rng = 0x66726f6e74u;
	tinst t;
	for (int id = 0; id < 40; id++) {
		t_random(&t, &rng);
		kiln_arena *a = kiln_arena_new();
		kiln_frontier fd, fm;
		cr_assert_eq(kiln_cost_frontier_dp(&t.in, a, &fd), 0);
		cr_assert_eq(kiln_cost_frontier_milp(&t.in, a, &fm), 0, "milp frontier %d", id);
		check_frontier_shape(&t, &fm, "milp frontier", id);
		cr_assert_eq(fm.n_points, fd.n_points, "%d: milp %d points, dp %d", id, fm.n_points,
		             fd.n_points);
		for (int32_t i = 0; i < fd.n_points; i++) {
			cr_assert_eq(fm.points[i].saved_q, fd.points[i].saved_q, "%d: point %d", id,
			             i);
			cr_assert(close_us(fm.points[i].exposed_us, fd.points[i].exposed_us),
			          "%d: point %d: %g vs %g", id, i, fm.points[i].exposed_us,
			          fd.points[i].exposed_us);
		}
		kiln_arena_free(a);
	}
}

/* What --solver milp does per frontier (passes/plan.c): the MILP at a
 * table's step targets only, its levels re-traced by the canonical rule.
 * Each answer is the oracle's (brute force over every plan) least cost
 * reaching the target, and the re-traced plans are the DP frontier's own,
 * choice for choice: both solvers name the same plan at a level. */
Test(solvers, milp_at_targets_retraced_names_the_dp_plans)
{
	uint64_t rng = 0x7461726765u;
	tinst t;
	int checked = 0;
	for (int id = 0; id < 40; id++) {
		t_random(&t, &rng);
		if (t.combos > T_ENUM_LIMIT || t.s_cap == 0)
			continue;
		kiln_arena *a = kiln_arena_new();
		double *best = t_oracle(&t);
		kiln_frontier fd, fm, fc;
		cr_assert_eq(kiln_cost_frontier_dp(&t.in, a, &fd), 0);
		uint32_t targets[8];
		int32_t nt = 0;
		for (uint32_t k = 1; k <= 8; k++) {
			uint32_t want = (t.s_cap * k + 7) / 8;
			if (nt == 0 || want > targets[nt - 1])
				targets[nt++] = want;
		}
		cr_assert_eq(kiln_cost_frontier_milp_targets(&t.in, targets, nt, NULL, a, &fm), 0,
		             "%d", id);
		for (int32_t k = 0; k < nt; k++) {
			int32_t p = 0;
			while (fm.points[p].saved_q < targets[k])
				p++;
			cr_assert(close_us(fm.points[p].exposed_us, best[targets[k]]),
			          "%d target %u: milp %g, oracle %g", id, targets[k],
			          fm.points[p].exposed_us, best[targets[k]]);
		}
		uint32_t levels[8];
		for (int32_t p = 1; p < fm.n_points; p++)
			levels[p - 1] = fm.points[p].saved_q;
		cr_assert_eq(kiln_cost_frontier_levels(&t.in, levels, fm.n_points - 1, a, &fc), 0);
		cr_assert_eq(fc.n_points, fm.n_points, "%d", id);
		for (int32_t p = 1; p < fc.n_points; p++) {
			int32_t q = 0;
			while (q < fd.n_points && fd.points[q].saved_q != levels[p - 1])
				q++;
			cr_assert_lt(q, fd.n_points, "%d: level %u not on the dp frontier", id,
			             levels[p - 1]);
			cr_assert_eq(memcmp(fc.points[p].choice, fd.points[q].choice,
			                    sizeof(int32_t) * (size_t)t.in.n_groups),
			             0, "%d level %u: another plan than the dp's", id,
			             levels[p - 1]);
			uint32_t s, o;
			double e;
			t_eval(&t.in, fc.points[p].choice, &s, &o, &e);
			cr_assert(s == levels[p - 1] && close_us(e, best[s]), "%d level %u", id, s);
		}
		/* An unreachable level and an unordered list are refused. */
		uint32_t bad[2] = {t.s_cap + 1, 1};
		cr_assert_eq(kiln_cost_frontier_levels(&t.in, bad, 1, a, &fc), -1);
		bad[0] = t.s_cap;
		cr_assert_eq(kiln_cost_frontier_levels(&t.in, bad, 2, a, &fc), -1);
		free(best);
		kiln_arena_free(a);
		checked++;
	}
	cr_assert_gt(checked, 10);
}

/* The k cheapest plans saving at least a target (kiln_cost_kbest) against
 * an exhaustive enumeration here: every plan's cost by the equations
 * (t_eval), those saving enough sorted; the solver's k plans must be
 * distinct, save enough, cost what the equations say, and their costs must
 * be the k smallest of the enumeration (as multisets, in ascending order);
 * the first is the DP frontier's own answer, choice for choice. */
static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return a < b ? -1 : a > b;
}

Test(solvers, kbest_are_the_k_cheapest_by_enumeration)
{
	uint64_t rng = 0x6b62657374u; /* "kbest" */
	tinst t;
	int checked = 0, ties = 0;
	static const int32_t ks[] = {1, 2, 5, 16};
	for (int id = 0; id < 80; id++) {
		t_random(&t, &rng);
		if (t.combos > (1u << 14))
			continue;
		kiln_arena *a = kiln_arena_new();
		kiln_frontier fd;
		cr_assert_eq(kiln_cost_frontier_dp(&t.in, a, &fd), 0);
		double *cost = malloc(sizeof(double) * (size_t)t.combos);
		uint32_t *sv = malloc(sizeof(uint32_t) * (size_t)t.combos);
		cr_assert(cost && sv);
		int32_t cur[T_MAX_GROUPS] = {0};
		for (uint64_t c = 0; c < t.combos; c++) {
			uint32_t o;
			t_eval(&t.in, cur, &sv[c], &o, &cost[c]);
			for (int32_t g = t.in.n_groups - 1; g >= 0; g--) {
				if (++cur[g] < t.groups[g].n_choices)
					break;
				cur[g] = 0;
			}
		}
		uint32_t targets[4] = {0, rng_below(&rng, t.s_cap + 1), t.s_cap, t.s_cap + 1};
		if (targets[1] > targets[2])
			targets[1] = targets[2];
		double *want = malloc(sizeof(double) * (size_t)t.combos);
		cr_assert_not_null(want);
		for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
			int32_t k = ks[ki];
			kiln_plan_point out[4 * 16];
			int32_t n[4];
			cr_assert_eq(kiln_cost_kbest(&t.in, targets, 4, k, a, out, n), 0, "%d", id);
			for (int32_t i = 0; i < 4; i++) {
				size_t m = 0;
				for (uint64_t c = 0; c < t.combos; c++)
					if (sv[c] >= targets[i])
						want[m++] = cost[c];
				qsort(want, m, sizeof(double), cmp_double);
				int32_t expect = (size_t)k < m ? k : (int32_t)m;
				cr_assert_eq(n[i], expect,
				             "%d k %d target %u: %d plans, %d expected", id, k,
				             targets[i], n[i], expect);
				if (n[i] == 0)
					continue;
				const kiln_plan_point *fp = lookup(&fd, targets[i]);
				cr_assert_not_null(fp);
				cr_assert_eq(memcmp(out[i * k].choice, fp->choice,
				                    sizeof(int32_t) * (size_t)t.in.n_groups),
				             0, "%d k %d target %u: first is not the frontier's",
				             id, k, targets[i]);
				double got[16];
				for (int32_t j = 0; j < n[i]; j++) {
					const kiln_plan_point *p = &out[i * k + j];
					uint32_t s, o;
					double e;
					t_eval(&t.in, p->choice, &s, &o, &e);
					cr_assert(s == p->saved_q && s >= targets[i] &&
					              close_us(e, p->exposed_us),
					          "%d k %d target %u plan %d: totals", id, k,
					          targets[i], j);
					got[j] = e;
					if (j > 0)
						cr_assert(e >= got[j - 1] - 1e-9,
						          "%d: not ascending", id);
					for (int32_t x = 0; x < j; x++)
						cr_assert_neq(
						    memcmp(p->choice, out[i * k + x].choice,
						           sizeof(int32_t) * (size_t)t.in.n_groups),
						    0, "%d k %d target %u: plans %d and %d equal",
						    id, k, targets[i], x, j);
				}
				for (int32_t j = 0; j < n[i]; j++)
					cr_assert(close_us(got[j], want[j]),
					          "%d k %d target %u: plan %d costs %g, the %d-th "
					          "cheapest %g",
					          id, k, targets[i], j, got[j], j, want[j]);
				if (n[i] > 1 && close_us(got[1], got[0]))
					ties++;
			}
		}
		/* Deterministic: the same call names the same plans. */
		kiln_plan_point o1[16], o2[16];
		int32_t n1, n2;
		cr_assert_eq(kiln_cost_kbest(&t.in, &targets[1], 1, 16, a, o1, &n1), 0);
		cr_assert_eq(kiln_cost_kbest(&t.in, &targets[1], 1, 16, a, o2, &n2), 0);
		cr_assert_eq(n1, n2);
		for (int32_t j = 0; j < n1; j++)
			cr_assert_eq(memcmp(o1[j].choice, o2[j].choice,
			                    sizeof(int32_t) * (size_t)t.in.n_groups),
			             0);
		free(want);
		free(cost);
		free(sv);
		kiln_arena_free(a);
		checked++;
	}
	cr_assert_gt(checked, 30);
	cr_assert_gt(ties, 0, "no co-optimal plans met: the instances test too little");
}

Test(solvers, kbest_refuses_bad_arguments)
{
	tinst t;
	hand_instance(&t);
	kiln_arena *a = kiln_arena_new();
	kiln_plan_point out[KILN_PLAN_KBEST_MAX + 1];
	int32_t n;
	uint32_t target = 3;
	cr_assert_eq(kiln_cost_kbest(&t.in, &target, 1, 0, a, out, &n), -1);
	cr_assert_eq(kiln_cost_kbest(&t.in, &target, 1, KILN_PLAN_KBEST_MAX + 1, a, out, &n), -1);
	cr_assert_eq(kiln_cost_kbest(&t.in, NULL, 1, 2, a, out, &n), -1);
	t.groups[0].n_choices = 0; /* malformed */
	cr_assert_eq(kiln_cost_kbest(&t.in, &target, 1, 2, a, out, &n), -1);
	kiln_arena_free(a);
}

/* The hand-worked instance (hand_instance), plans saving at least 6
 * quanta by hand, cost R + 10 * max(0, O - 2):
 *   (R,O,k) 6: 5    (R,R,k) 6: 6    (k,O,RR) 7: 7    (k,R,RR) 7: 8
 *   (R,O,RK) 9: 11  (R,R,RK) 9: 12  (R,O,RR) 11: 12  (R,k,OK) 7: 15 ...
 *   (O,R,k) 6: 1 + 20 = 21, every plan offloading group 0 pays >= 20.
 * So the two cheapest are (R,O,k) at 5 us, the frontier's, then (R,R,k) at
 * 6 us, and the third is (k,O,RR) at 7 us. */
Test(solvers, kbest_hand_worked)
{
	tinst t;
	hand_instance(&t);
	kiln_arena *a = kiln_arena_new();
	kiln_plan_point out[3];
	int32_t n;
	uint32_t target = 6;
	cr_assert_eq(kiln_cost_kbest(&t.in, &target, 1, 3, a, out, &n), 0);
	cr_assert_eq(n, 3);
	static const int32_t want[3][3] = {{1, 2, 0}, {1, 1, 0}, {0, 2, 2}};
	static const double us[3] = {5.0, 6.0, 7.0};
	for (int32_t j = 0; j < 3; j++) {
		cr_assert_eq(memcmp(out[j].choice, want[j], sizeof want[j]), 0, "plan %d", j);
		cr_assert_eq(out[j].exposed_us, us[j], "plan %d: %g", j, out[j].exposed_us);
	}
	kiln_arena_free(a);
}

/* ---------------------------------------------------------------- edges */

Test(solvers, empty_instance_is_keep_all)
{
	kiln_plan_instance in = {.n_units = 0, .n_groups = 0, .quantum_bytes = 1};
	kiln_arena *a = kiln_arena_new();
	kiln_frontier f;
	kiln_plan_point p;
	cr_assert_eq(kiln_cost_frontier_dp(&in, a, &f), 0);
	cr_assert_eq(f.n_points, 1);
	cr_assert_eq(f.points[0].saved_q, 0u);
	cr_assert_eq(kiln_cost_frontier_milp(&in, a, &f), 0);
	cr_assert_eq(f.n_points, 1);
	cr_assert_eq(kiln_cost_solve_milp(&in, 0, a, &p), 0);
	cr_assert_eq(kiln_cost_solve_milp(&in, 1, a, &p), 1);
	cr_assert_eq(kiln_cost_solve_brute(&in, 0, a, &p), 0);
	cr_assert_eq(kiln_cost_solve_brute(&in, 1, a, &p), 1);
	kiln_arena_free(a);
}

/* Every solver refuses each malformed instance with -1 (GLPK never sees it,
 * and would not abort the process if it did). */
Test(solvers, malformed_instances_are_refused)
{
	kiln_arena *a = kiln_arena_new();
	for (int k = 0; k < 9; k++) {
		tinst t;
		hand_instance(&t);
		kiln_plan_instance *in = &t.in;
		switch (k) {
		case 0:
			in->n_groups = -1;
			break;
		case 1:
			in->n_units = -3;
			break;
		case 2:
			t.groups[1].choices = NULL;
			break;
		case 3:
			t.groups[2].n_choices = 0;
			break;
		case 4:
			t.groups[0].n_choices = -2;
			break;
		case 5:
			t.choices[1][1].recompute_us = NAN;
			break;
		case 6:
			in->offload_us_per_q = -1.0;
			break;
		case 7:
			t.groups[2].units[1] = 9; /* no such unit */
			break;
		default:
			in->groups = NULL;
			break;
		}
		kiln_frontier f;
		kiln_plan_point p;
		cr_assert_eq(kiln_cost_frontier_dp(in, a, &f), -1, "dp case %d", k);
		cr_assert_eq(kiln_cost_frontier_milp(in, a, &f), -1, "milp frontier case %d", k);
		cr_assert_eq(kiln_cost_solve_milp(in, 3, a, &p), -1, "milp case %d", k);
		cr_assert_eq(kiln_cost_solve_brute(in, 3, a, &p), -1, "brute case %d", k);
	}
	kiln_plan_point p;
	kiln_frontier f;
	cr_assert_eq(kiln_cost_solve_milp(NULL, 0, a, &p), -1);
	cr_assert_eq(kiln_cost_frontier_dp(NULL, a, &f), -1);
	kiln_arena_free(a);
}

Test(solvers, brute_refuses_more_than_2_pow_22_plans)
{
	/* 23 groups of two choices: 2^23 plans. */
	kiln_plan_group groups[23];
	kiln_plan_choice choices[23][2];
	memset(choices, 0, sizeof(choices));
	for (int32_t g = 0; g < 23; g++) {
		choices[g][1].actions[0] = KILN_ACT_RECOMPUTE;
		choices[g][1].saved_q = 1;
		choices[g][1].recompute_us = 1.0;
		groups[g] = (kiln_plan_group){
		    .units = {g}, .n_units = 1, .choices = choices[g], .n_choices = 2};
	}
	kiln_plan_instance in = {
	    .n_units = 23, .n_groups = 23, .groups = groups, .quantum_bytes = 1};
	kiln_arena *a = kiln_arena_new();
	kiln_plan_point p;
	cr_assert_eq(kiln_cost_solve_brute(&in, 0, a, &p), -1);
	/* The DP and the MILP have no such limit: saving 5 costs 5 us. */
	kiln_frontier f;
	cr_assert_eq(kiln_cost_frontier_dp(&in, a, &f), 0);
	cr_assert_eq(f.n_points, 24);
	cr_assert_eq(kiln_cost_solve_milp(&in, 5, a, &p), 0);
	cr_assert_eq(p.exposed_us, 5.0);
	kiln_arena_free(a);
}

/* The largest instance the limits allow in units (128, groups of 3 and one
 * of 2, 9 choices each, 4095 quanta in all): GLPK solves it without
 * aborting and agrees with the DP. */
Test(solvers, milp_survives_a_huge_instance)
{
	enum { NG = 43, NC = 9 };
	kiln_plan_group *groups = calloc(NG, sizeof(*groups));
	kiln_plan_choice(*choices)[NC] = calloc(NG, sizeof(*choices));
	cr_assert(groups && choices);
	uint64_t rng = 0x68756765u;
	int32_t unit = 0;
	for (int32_t g = 0; g < NG; g++) {
		kiln_plan_group *gr = &groups[g];
		gr->n_units = g == NG - 1 ? 2 : 3;
		for (int32_t k = 0; k < gr->n_units; k++)
			gr->units[k] = unit++;
		gr->choices = choices[g];
		gr->n_choices = NC;
		for (int32_t c = 1; c < NC; c++) {
			kiln_plan_choice *ch = &choices[g][c];
			ch->actions[c % gr->n_units] =
			    c & 1 ? KILN_ACT_RECOMPUTE : KILN_ACT_OFFLOAD;
			ch->saved_q = c == NC - 1 ? 95 : 1 + rng_below(&rng, 95);
			ch->offload_q = c & 1 ? 0 : ch->saved_q;
			ch->recompute_us = c & 1 ? 0.25 * (1 + rng_below(&rng, 400)) : 0.0;
		}
	}
	kiln_plan_instance in = {.n_units = unit,
	                         .n_groups = NG,
	                         .groups = groups,
	                         .quantum_bytes = 1,
	                         .free_offload_q = 0,
	                         .offload_us_per_q = 2.0};
	cr_assert_eq(kiln_cost_instance_check(&in), 0);
	kiln_arena *a = kiln_arena_new();
	kiln_frontier f;
	cr_assert_eq(kiln_cost_frontier_dp(&in, a, &f), 0);
	for (uint32_t target = 1000; target <= 4000; target += 1500) {
		kiln_plan_point p;
		cr_assert_eq(kiln_cost_solve_milp(&in, target, a, &p), 0, "target %u", target);
		const kiln_plan_point *d = lookup(&f, target);
		cr_assert_not_null(d);
		cr_assert(close_us(p.exposed_us, d->exposed_us), "target %u: milp %g dp %g", target,
		          p.exposed_us, d->exposed_us);
	}
	kiln_arena_free(a);
	free(groups);
	free(choices);
}

/* A layer-sized instance (25 units in groups of 3, S about 1000 quanta):
 * GLPK 5.0's cover cuts once errored on the K = 0 version; the MILP must
 * answer every target and agree with the DP. */
Test(solvers, milp_agrees_on_layer_sized_instances)
{
	enum { NG = 9 };
	kiln_plan_group groups[NG];
	kiln_plan_choice choices[NG][9];
	memset(groups, 0, sizeof(groups));
	memset(choices, 0, sizeof(choices));
	uint64_t rng = 0x6c61796572u;
	int32_t unit = 0;
	for (int32_t g = 0; g < NG; g++) {
		kiln_plan_group *gr = &groups[g];
		gr->n_units = g == NG - 1 ? 1 : 3;
		uint32_t q[3];
		double rc[3];
		for (int32_t k = 0; k < gr->n_units; k++) {
			gr->units[k] = unit++;
			q[k] = 36 + rng_below(&rng, 10);
			rc[k] = 10 + rng_below(&rng, 300);
		}
		int32_t vec = gr->n_units == 3 ? 27 : 3, nc = vec < 9 ? vec : 9;
		for (int32_t c = 1; c < nc; c++) {
			kiln_plan_choice *ch = &choices[g][c];
			for (int32_t k = 0, x = c * (vec - 1) / (nc - 1); k < gr->n_units;
			     k++, x /= 3) {
				ch->actions[k] = (uint8_t)(x % 3);
				if (x % 3 != KILN_ACT_KEEP)
					ch->saved_q += q[k];
				if (x % 3 == KILN_ACT_OFFLOAD)
					ch->offload_q += q[k] + 1;
				if (x % 3 == KILN_ACT_RECOMPUTE)
					ch->recompute_us += rc[k];
			}
		}
		gr->choices = choices[g];
		gr->n_choices = nc;
	}
	static const uint32_t caps[] = {0, 512};
	for (int k = 0; k < 2; k++) {
		kiln_plan_instance in = {.n_units = unit,
		                         .n_groups = NG,
		                         .groups = groups,
		                         .quantum_bytes = 1 << 20,
		                         .free_offload_q = caps[k],
		                         .offload_us_per_q = 3.0};
		kiln_arena *a = kiln_arena_new();
		kiln_frontier f;
		cr_assert_eq(kiln_cost_frontier_dp(&in, a, &f), 0);
		uint32_t s_max = f.points[f.n_points - 1].saved_q;
		for (uint32_t target = 0; target <= s_max; target += s_max / 7) {
			kiln_plan_point p;
			cr_assert_eq(kiln_cost_solve_milp(&in, target, a, &p), 0, "K %u target %u",
			             caps[k], target);
			const kiln_plan_point *d = lookup(&f, target);
			cr_assert(close_us(p.exposed_us, d->exposed_us),
			          "K %u target %u: milp %g dp %g", caps[k], target, p.exposed_us,
			          d->exposed_us);
		}
		kiln_arena_free(a);
	}
}
