/* tests/test_oracle.c: the clairvoyant oracle (sim/oracle.c).
 *
 * Expected values come from brute force over every combination of one
 * table point per layer, each point's bytes summed here from its units
 * (kept units resident; recomputed ones with their workspace and
 * offloaded ones transient) and its time from the simulator's pricing
 * (kiln_sim_plan_cost, the same for every policy); and from the other
 * policies run on the same loads.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "kiln/runtime.h"
#include "kiln_test.h"
#include "passes/passes.h"
#include "sim/sim.h"

#define MAXP 80

typedef struct bpoint {
	double r, t, e;
} bpoint;

/* Layer candidates of set at n rows, from the units. */
static int32_t brute_points(const kiln_compilation *c, int32_t set, double n, bpoint *out)
{
	const kiln_unit_set *S = &c->sets[set];
	if (S->kind != KILN_LAYER_MOE)
		n = 0;
	double f;
	int32_t b = kiln_sim_policy_bucket(c, set, n, &f);
	const kiln_plan_table *t = &c->tables[(size_t)set * c->n_buckets + b];
	cr_assert_leq(t->n_points, MAXP);
	for (int32_t k = 0; k < t->n_points; k++) {
		const uint8_t *act = c->pool->actions[t->plan[k]];
		double r = 0, tr = 0;
		for (int32_t u = 0; u < S->n_units; u++) {
			const kiln_unit *un = &S->units[u];
			double bytes = (double)un->bytes.base + (double)un->bytes.per_n * n;
			if (act[u] == KILN_ACT_KEEP)
				r += bytes;
			else if (act[u] == KILN_ACT_OFFLOAD)
				tr += bytes;
			else if (act[u] == KILN_ACT_RECOMPUTE)
				tr += bytes + (double)un->workspace_bytes.base +
				      (double)un->workspace_bytes.per_n * n;
		}
		double ex, serial, rec;
		cr_assert_eq(kiln_sim_plan_cost(c, set, b, act, &ex, &serial, &rec), 0);
		out[k] = (bpoint){ceil(r - 1e-6), ceil(tr - 1e-6), ex};
	}
	return t->n_points;
}

/* Three planned layers of tiny's stage 0 at loads 0.7, 1.6 and 2.6. */
typedef struct inst {
	const kiln_compilation *c;
	int32_t sets[3];
	double rows[3];
	bpoint pts[3][MAXP];
	int32_t np[3];
	double fixed;
} inst;

static void inst_init(inst *x)
{
	x->c = kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	const kiln_ir_graph *g = x->c->graph;
	const kiln_ir_stage *st = &g->stages[0];
	static const double load[3] = {0.7, 1.6, 2.6};
	int32_t k = 0;
	for (int32_t l = st->layer_begin; l < st->layer_end && k < 3; l++) {
		const kiln_ir_layer *L = &g->layers[l];
		int32_t set = -1;
		for (int32_t j = 0; j < x->c->n_sets && L->index >= 0; j++)
			if (x->c->sets[j].stage == 0 && x->c->sets[j].kind == L->kind)
				set = j;
		if (set < 0)
			continue;
		x->sets[k] = set;
		x->rows[k] = L->kind == KILN_LAYER_MOE ? load[k] * L->n_balanced : 0;
		x->np[k] = brute_points(x->c, set, x->rows[k], x->pts[k]);
		k++;
	}
	cr_assert_eq(k, 3);
	x->fixed = ceil(x->c->budgets[0].fixed_bytes - 1e-6);
}

/* The least time over every combination with H <= max_held and
 * H + T <= max_device (INFINITY when none). */
static double brute_best(const inst *x, double max_held, double max_device)
{
	double best = INFINITY;
	for (int32_t a = 0; a < x->np[0]; a++)
		for (int32_t b = 0; b < x->np[1]; b++)
			for (int32_t d = 0; d < x->np[2]; d++) {
				const bpoint *p = &x->pts[0][a], *q = &x->pts[1][b],
				             *r = &x->pts[2][d];
				double h = x->fixed + p->r + q->r + r->r;
				double t = fmax(p->t, fmax(q->t, r->t));
				double e = p->e + q->e + r->e;
				if (h <= max_held && h + t <= max_device && e < best)
					best = e;
			}
	return best;
}

static kiln_sim_oracle *oracle_of(const kiln_compilation *c, kiln_arena *a, kiln_sim_policy **p)
{
	cr_assert_eq(kiln_sim_policy_new(KILN_SIM_ORACLE, c, NULL, 0, a, stderr, p), 0);
	kiln_sim_oracle *o = kiln_sim_policy_oracle(*p);
	cr_assert_not_null(o);
	return o;
}

Test(oracle, one_micro_batch_equals_brute_force)
{
	inst x;
	inst_init(&x);
	kiln_arena *a = kiln_arena_new();
	kiln_sim_policy *p;
	kiln_sim_oracle *o = oracle_of(x.c, a, &p);
	/* Caps from the least to the most any combination holds. */
	double lo = brute_best(&x, INFINITY, INFINITY) < INFINITY ? x.fixed : 0, hi = x.fixed;
	for (int k = 0; k < 3; k++) {
		double most = 0;
		for (int32_t j = 0; j < x.np[k]; j++)
			most = fmax(most, x.pts[k][j].r + x.pts[k][j].t);
		hi += most;
	}
	int finite = 0, infinite = 0;
	for (int i = 0; i <= 24; i++)
		for (int j = 0; j <= 4; j++) {
			double held = lo + (hi - lo) * i / 24, device = held + (hi - lo) * j / 8;
			double want = brute_best(&x, held, device);
			double got = kiln_sim_oracle_micro(
			    o, 3, x.sets, x.rows, x.c->budgets[0].fixed_bytes, held, device, NULL);
			if (isinf(want)) {
				cr_assert(isinf(got), "held %.0f device %.0f: %g", held, device,
				          got);
				infinite++;
			} else {
				cr_assert_float_eq(got, want, 1e-9 * fmax(1, want),
				                   "held %.0f device %.0f", held, device);
				finite++;
			}
		}
	/* The grid covers caps where nothing fits and where something does. */
	cr_assert_gt(finite, 10);
	cr_assert_gt(infinite, 0);
	kiln_sim_policy_free(p);
	kiln_arena_free(a);
}

Test(oracle, every_supported_point_is_optimal_by_brute_force)
{
	inst x;
	inst_init(&x);
	kiln_arena *a = kiln_arena_new();
	kiln_sim_policy *p;
	kiln_sim_oracle *o = oracle_of(x.c, a, &p);
	double held[3 * MAXP + 1], ex[3 * MAXP + 1];
	int64_t n = kiln_sim_oracle_path(o, 3, x.sets, x.rows, x.c->budgets[0].fixed_bytes, held,
	                                 ex, 3 * MAXP + 1);
	cr_assert_gt(n, 3);
	cr_assert_leq(n, 3 * MAXP + 1);
	for (int64_t k = 0; k < n; k++) {
		/* No combination holding at most H takes less time. */
		cr_assert_float_eq(ex[k], brute_best(&x, held[k], INFINITY), 1e-9 * fmax(1, ex[k]),
		                   "point %lld", (long long)k);
		if (k > 0) {
			cr_assert_gt(held[k], held[k - 1]);
			cr_assert_lt(ex[k], ex[k - 1]);
		}
	}
	/* The first holds the least of any combination, the last takes the
	 * least time of all. */
	cr_assert(isinf(brute_best(&x, held[0] - 1, INFINITY)));
	cr_assert_float_eq(ex[n - 1], brute_best(&x, INFINITY, INFINITY), 1e-9);
	kiln_sim_policy_free(p);
	kiln_arena_free(a);
}

/* On tiny under loads that make memory bind (hot-expert, hot-rank,
 * zipf:1.2) and under paper: the oracle is never slower than kiln or any
 * static policy that neither fails nor drops rows nor reruns, and fails
 * only where every other policy fails. */
Test(oracle, never_worse_than_kiln_or_a_static_policy, .timeout = 600)
{
	const kiln_compilation *c0 =
	    kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, false);
	const kiln_compilation *c1 = kt_compiled("examples/models/tiny.yaml", KILN_SOLVER_DP, true);
	kiln_compilation c = *c0, c2 = *c1;
	unsigned char *blob, *blob2;
	size_t len, len2;
	kiln_rt *rt, *rt2;
	cr_assert_eq(kiln_blob_build(&c, stderr, &blob, &len), 0);
	cr_assert_eq(kiln_rt_open(blob, len, &rt), 0);
	cr_assert_eq(kiln_blob_build(&c2, stderr, &blob2, &len2), 0);
	cr_assert_eq(kiln_rt_open(blob2, len2, &rt2), 0);
	static const char *const loads[] = {"paper", "hot-expert", "hot-rank", "zipf:1.2"};
	for (int l = 0; l < 4; l++) {
		kiln_arena *a = kiln_arena_new();
		kiln_load_profile *prof;
		cr_assert_eq(kiln_load_parse(loads[l], c.model->max_factor, a, stderr, &prof), 0);
		kiln_sim_config cfg = {.c = &c,
		                       .rt = rt,
		                       .c_no_offload = &c2,
		                       .rt_no_offload = rt2,
		                       .loads = prof,
		                       .iterations = 6,
		                       .seed = 5,
		                       .restart_s = 284,
		                       .checkpoint_every = 100};
		kiln_sim_policy_kind all[KILN_SIM_POLICY_COUNT];
		for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++)
			all[k] = (kiln_sim_policy_kind)k;
		kiln_sim_result r[KILN_SIM_POLICY_COUNT];
		cr_assert_eq(kiln_sim_run(&cfg, all, KILN_SIM_POLICY_COUNT, a, stderr, r), 0);
		const kiln_sim_result *orc = &r[KILN_SIM_ORACLE];
		int any_fits = 0;
		for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++) {
			if (k == KILN_SIM_ORACLE || k == KILN_SIM_UNBOUNDED)
				continue;
			any_fits |= r[k].ooms == 0;
			if (r[k].ooms || r[k].reruns || r[k].dropped_fraction > 0)
				continue;
			cr_assert_geq(orc->tokens_per_s, r[k].tokens_per_s * (1 - 1e-12), "%s: %s",
			              loads[l], kiln_sim_policy_name((kiln_sim_policy_kind)k));
		}
		if (any_fits)
			cr_assert_eq(orc->ooms, 0, "%s", loads[l]);
		cr_assert_leq(orc->tokens_per_s, r[KILN_SIM_UNBOUNDED].tokens_per_s * (1 + 1e-12));
		kiln_arena_free(a);
	}
	kiln_rt_close(rt);
	kiln_rt_close(rt2);
	free(blob);
	free(blob2);
}
