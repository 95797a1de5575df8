/* tests/test_adapipe.c: AdaPipe's joint partition and recompute search
 * (passes/adapipe.c) and the simulator running adapipe on its own
 * partition (sim/sim.c, tools/simcmd.c).
 *
 * The expected values come from brute force: every partition of the
 * layers into the stages (the partition search), every keep / recompute
 * vector of every unit set of a stage with its exact bytes and the forward
 * time of the ops its recomputes re-run (the stage's plan), and a second
 * simulation on the compiled partition alone (the simulator).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "frontend/frontend.h"
#include "kiln_test.h"
#include "passes/passes.h"
#include "sim/sim.h"

/* tiny.yaml with the substitutions subs[0] -> subs[1], subs[2] -> subs[3],
 * ... (each must occur), loaded into a. */
static kiln_model *tiny_variant(const char *const *subs, int n_subs, kiln_arena *a)
{
	char *text = NULL;
	cr_assert_eq(kt_sh(&text, "cat %s", kt_src("examples/models/tiny.yaml")), 0);
	for (int k = 0; k + 1 < n_subs; k += 2) {
		char *at = strstr(text, subs[k]);
		cr_assert_not_null(at, "tiny.yaml has no '%s'", subs[k]);
		size_t before = (size_t)(at - text), old = strlen(subs[k]),
		       add = strlen(subs[k + 1]);
		char *next = malloc(strlen(text) - old + add + 1);
		cr_assert_not_null(next);
		memcpy(next, text, before);
		memcpy(next + before, subs[k + 1], add);
		strcpy(next + before + add, at + old);
		free(text);
		text = next;
	}
	kiln_model *m = NULL;
	cr_assert_eq(kiln_frontend_load_buffer("tiny-variant", text, strlen(text), a, stderr, &m),
	             KILN_FRONTEND_OK);
	free(text);
	return m;
}

static void compile(const kiln_model *m, kiln_arena *a, kiln_compilation *c)
{
	*c = (kiln_compilation){.model = m, .arena = a};
	cr_assert_eq(kiln_pipeline_compile(c, NULL, NULL, NULL, stderr), 0);
}

/* The variants the tests run on: shapes where the even split is best,
 * where a heavy head moves layers off the last stage, with more stages,
 * with several dense layers, and with too little memory for some splits. */
static const char *const V_TINY[] = {""};
static const char *const V_HEAD[] = {"vocab: 256", "vocab: 2048"};
static const char *const V_PP4[] = {"vocab: 256", "vocab: 2048", "  pp: 2",   "  pp: 4",
                                    "devices: 8", "devices: 16", "layers: 8", "layers: 10"};
static const char *const V_PP3[] = {
    "  pp: 2",   "  pp: 3",         "devices: 8",      "devices: 12", "layers: 8",
    "layers: 9", "dense_layers: 1", "dense_layers: 3", "vocab: 256",  "vocab: 1024"};
static const char *const V_TIGHT[] = {"  pp: 2",           "  pp: 4",     "devices: 8",
                                      "devices: 16",       "layers: 8",   "layers: 12",
                                      "vocab: 256",        "vocab: 1024", "memory_gib: 0.009765625",
                                      "memory_gib: 0.0054"};
static const struct {
	const char *name;
	const char *const *subs;
	int n;
} variants[] = {
    {"tiny", V_TINY, 0},
    {"heavy head", V_HEAD, 2},
    {"pp 4, 10 layers", V_PP4, 8},
    {"pp 3, 9 layers, 3 dense", V_PP3, 10},
    {"pp 4, 12 layers, tight memory", V_TIGHT, 10},
};
#define N_VARIANTS (sizeof variants / sizeof variants[0])

/* Brute force over every split of L layers into p non-empty stages: the
 * least slowest stage, then the least sum among the splits reaching it. */
typedef struct brute {
	kiln_adapipe *x;
	int32_t p;
	int64_t L;
	int64_t cur[16];
	double best_max, best_sum;
	int64_t best[16];
	int64_t n_splits, n_infeasible;
} brute;

static void enumerate(brute *b, int32_t s, int64_t first)
{
	if (s == b->p - 1) {
		b->cur[s] = b->L - first;
		double top = 0, sum = 0;
		for (int32_t k = 0, f = 0; k < b->p; f += (int32_t)b->cur[k], k++) {
			double t = kiln_adapipe_stage_us(b->x, k, f, b->cur[k]);
			top = t > top ? t : top;
			sum += t;
		}
		b->n_splits++;
		b->n_infeasible += !isfinite(top);
		if (top < b->best_max || (top == b->best_max && sum < b->best_sum)) {
			b->best_max = top;
			b->best_sum = sum;
			memcpy(b->best, b->cur, sizeof b->cur);
		}
		return;
	}
	for (int64_t n = 1; first + n <= b->L - (b->p - 1 - s); n++) {
		b->cur[s] = n;
		enumerate(b, s + 1, first + n);
	}
}

Test(adapipe, partition_equals_brute_force)
{
	int moved = 0, infeasible = 0;
	for (size_t v = 0; v < N_VARIANTS; v++) {
		kiln_arena *a = kiln_arena_new();
		kiln_compilation c;
		kiln_model *m = tiny_variant(variants[v].subs, variants[v].n, a);
		compile(m, a, &c);
		kiln_adapipe *x;
		kiln_adapipe_split sp;
		cr_assert_eq(kiln_adapipe_new(&c, a, &x), 0);
		cr_assert_eq(kiln_adapipe_partition(x, a, &sp), 0);
		brute b = {.x = x,
		           .p = (int32_t)m->pp,
		           .L = m->layers,
		           .best_max = INFINITY,
		           .best_sum = INFINITY};
		cr_assert_leq(b.p, 16);
		enumerate(&b, 0, 0);
		infeasible += b.n_infeasible > 0;
		if (!isfinite(b.best_max)) {
			cr_assert(!sp.fits && sp.kept, "%s: nothing fits, yet a split was chosen",
			          variants[v].name);
			kiln_arena_free(a);
			continue;
		}
		cr_assert_null(sp.kept, "%s: %s", variants[v].name, sp.kept);
		cr_assert(sp.fits);
		cr_assert_eq(sp.max_us, b.best_max, "%s: dp slowest %.17g, brute force %.17g",
		             variants[v].name, sp.max_us, b.best_max);
		cr_assert_float_eq(sp.sum_us, b.best_sum, 1e-9 * b.best_sum,
		                   "%s: dp sum %.17g, brute force %.17g", variants[v].name,
		                   sp.sum_us, b.best_sum);
		int64_t total = 0, own_differs = 0;
		for (int32_t s = 0; s < b.p; s++) {
			cr_assert_geq(sp.layers[s], 1);
			total += sp.layers[s];
			own_differs |= sp.layers[s] != m->stage_layers[s];
		}
		cr_assert_eq(total, m->layers);
		moved += own_differs != 0;
		kiln_arena_free(a);
	}
	/* Not vacuous: some variant's best split is not the even one, and in
	 * some variant a split does not fit at all. */
	cr_assert_gt(moved, 0);
	cr_assert_gt(infeasible, 0);
}

/* Forward time of the ops the recomputes of actions re-run, each once,
 * at n rows (units of one layer of set). */
static double recompute_us(const kiln_ir_graph *g, const kiln_unit_set *set, const uint8_t *act,
                           double n)
{
	const kiln_ir_layer *L = &g->layers[set->layer];
	uint8_t seen[512] = {0};
	cr_assert_leq(L->op_end - L->op_begin, 512);
	double us = 0;
	for (int32_t u = 0; u < set->n_units; u++) {
		if (act[u] != KILN_ACT_RECOMPUTE)
			continue;
		for (int32_t k = 0; k < set->units[u].n_closure; k++) {
			int32_t op = set->units[u].closure[k];
			if (op < L->op_begin || op >= L->op_end || seen[op - L->op_begin])
				continue;
			seen[op - L->op_begin] = 1;
			us += kiln_cost_op_time_us(g, &g->ops[op], n);
		}
	}
	return us;
}

/* Every valid keep / recompute vector of one unit set: its bytes and time. */
typedef struct plan_row {
	double resident, transient, us;
} plan_row;

static int32_t all_plans(const kiln_compilation *c, const kiln_unit_set *set, double n,
                         plan_row **out)
{
	int32_t free_u[32], n_free = 0;
	for (int32_t u = 0; u < set->n_units; u++)
		if (!(set->units[u].flags & KILN_UNIT_LAYER_INPUT))
			free_u[n_free++] = u;
	cr_assert_leq(n_free, 20, "too many units for brute force");
	plan_row *rows = malloc(sizeof *rows << n_free);
	cr_assert_not_null(rows);
	int32_t k = 0;
	uint8_t act[64];
	for (uint32_t mask = 0; mask < 1u << n_free; mask++) {
		memset(act, KILN_ACT_KEEP, sizeof act);
		for (int32_t i = 0; i < n_free; i++)
			if (mask >> i & 1)
				act[free_u[i]] = KILN_ACT_RECOMPUTE;
		if (kiln_plan_valid(set, act) != 0)
			continue;
		kiln_plan_bytes pb;
		kiln_plan_bytes_at(set, act, n, &pb);
		rows[k++] =
		    (plan_row){pb.resident, pb.transient, recompute_us(c->graph, set, act, n)};
	}
	*out = rows;
	return k;
}

Test(adapipe, stage_plans_are_the_cheapest_fitting, .timeout = 120)
{
	int recomputing = 0;
	for (size_t v = 0; v < 2; v++) {
		kiln_arena *a = kiln_arena_new();
		kiln_compilation c, c3;
		kiln_model *m = tiny_variant(variants[v].subs, variants[v].n, a);
		compile(m, a, &c);
		kiln_adapipe *x, *x3;
		kiln_adapipe_split sp;
		cr_assert_eq(kiln_adapipe_new(&c, a, &x), 0);
		cr_assert_eq(kiln_adapipe_partition(x, a, &sp), 0);
		cr_assert(sp.fits);
		/* The model compiled on the chosen partition, as simulate does. */
		kiln_model m3 = *m;
		m3.stage_layers = sp.layers;
		m3.n_stage_layers = (size_t)sp.n_stages;
		compile(&m3, a, &c3);
		cr_assert_eq(kiln_adapipe_new(&c3, a, &x3), 0);
		const kiln_baseline *ada = &c3.baselines[KILN_BASELINE_ADAPIPE];
		cr_assert(ada->fits);
		for (int32_t s = 0, first = 0; s < sp.n_stages;
		     first += (int32_t)sp.layers[s], s++) {
			/* The cost model does not depend on the split it came from. */
			double us = kiln_adapipe_stage_us(x, s, first, sp.layers[s]);
			cr_assert_eq(kiln_adapipe_stage_us(x3, s, first, sp.layers[s]), us);
			cr_assert_eq(us, sp.stage_us[s]);
			const kiln_stage_budget *bu = &c3.budgets[s];
			double avail = bu->capacity_bytes - bu->static_bytes;
			/* The stage's sets (one or two kinds) and every plan of each. */
			int32_t sets[2], n_sets = 0;
			for (int32_t i = 0; i < c3.n_sets; i++)
				if (c3.sets[i].stage == s)
					sets[n_sets++] = i;
			cr_assert(n_sets >= 1 && n_sets <= 2);
			plan_row *rows[2] = {NULL, NULL};
			int32_t n_rows[2] = {1, 1};
			double nn[2] = {0, 0}, lay[2] = {0, 0};
			plan_row none = {0, 0, 0};
			for (int32_t k = 0; k < n_sets; k++) {
				const kiln_unit_set *set = &c3.sets[sets[k]];
				nn[k] = set->kind == KILN_LAYER_MOE
				            ? KILN_BASELINE_DESIGN_LOAD *
				                  c3.graph->layers[set->layer].n_balanced
				            : 0;
				lay[k] = set->n_layers;
				n_rows[k] = all_plans(&c3, set, nn[k], &rows[k]);
			}
			/* Brute force: the cheapest pair that fits with every in-flight
			 * micro-batch (budget.c's rule: inflight * resident + the worst
			 * transient within capacity - static). */
			double best = INFINITY;
			for (int32_t i = 0; i < n_rows[0]; i++)
				for (int32_t j = 0; j < (n_sets > 1 ? n_rows[1] : 1); j++) {
					const plan_row *p0 = &rows[0][i],
					               *p1 = n_sets > 1 ? &rows[1][j] : &none;
					double res = bu->fixed_bytes + lay[0] * p0->resident +
					             lay[1] * p1->resident;
					double tr = p0->transient > p1->transient ? p0->transient
					                                          : p1->transient;
					if (bu->inflight * res + tr > avail)
						continue;
					double cost = lay[0] * p0->us + lay[1] * p1->us;
					best = cost < best ? cost : best;
				}
			cr_assert(isfinite(best), "%s stage %d: no plan fits", variants[v].name, s);
			/* The baseline's plans on the compiled partition, costed alike. */
			double got = 0;
			for (int32_t k = 0; k < n_sets; k++) {
				const kiln_unit_set *set = &c3.sets[sets[k]];
				got += lay[k] * recompute_us(c3.graph, set,
				                             c3.pool->actions[ada->plan[sets[k]]],
				                             nn[k]);
			}
			cr_assert_float_eq(
			    got, best, 1e-9 * fmax(1, best),
			    "%s stage %d: adapipe's plan costs %.17g us, the cheapest "
			    "fitting one %.17g us",
			    variants[v].name, s, got, best);
			recomputing += best > 0;
			/* And the search costed the stage as its layers' compute plus
			 * that plan's recompute. */
			double compute = 0;
			const kiln_ir_stage *st = &c3.graph->stages[s];
			for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
				const kiln_ir_layer *L = &c3.graph->layers[l];
				double n = L->kind == KILN_LAYER_MOE
				               ? KILN_BASELINE_DESIGN_LOAD * L->n_balanced
				               : 0;
				for (int32_t o = L->op_begin; o < L->op_end; o++)
					if (c3.graph->ops[o].kind != KILN_OP_PP_SEND)
						compute += kiln_cost_op_time_us(
						    c3.graph, &c3.graph->ops[o], n);
			}
			cr_assert_float_eq(us, compute + best, 1e-9 * us,
			                   "%s stage %d: %.17g vs %.17g", variants[v].name, s, us,
			                   compute + best);
			free(rows[0]);
			free(rows[1]);
		}
		kiln_arena_free(a);
	}
	cr_assert_gt(recomputing, 0, "no stage recomputes: the memory never binds");
}

Test(adapipe, simulator_runs_adapipe_on_its_partition, .timeout = 120)
{
	kiln_arena *a = kiln_arena_new();
	kiln_compilation c, c3;
	kiln_model *m = tiny_variant(V_HEAD, 2, a);
	compile(m, a, &c);
	kiln_adapipe *x;
	kiln_adapipe_split sp;
	cr_assert_eq(kiln_adapipe_new(&c, a, &x), 0);
	cr_assert_eq(kiln_adapipe_partition(x, a, &sp), 0);
	cr_assert_neq(sp.layers[0], m->stage_layers[0], "the variant keeps the even split");
	kiln_model m3 = *m;
	m3.stage_layers = sp.layers;
	m3.n_stage_layers = (size_t)sp.n_stages;
	compile(&m3, a, &c3);
	kiln_load_profile *prof;
	cr_assert_eq(kiln_load_parse("hot-rank", m->max_factor, a, stderr, &prof), 0);
	for (int exact = 0; exact < 2; exact++) {
		kiln_sim_policy_kind both[2] = {KILN_SIM_ADAPIPE, KILN_SIM_UNBOUNDED};
		kiln_sim_result joint[2], alone[1], own[1];
		kiln_sim_config cfg = {.c = &c,
		                       .c_adapipe = &c3,
		                       .loads = prof,
		                       .iterations = 6,
		                       .seed = 3,
		                       .restart_s = 284,
		                       .checkpoint_every = 100,
		                       .exact = exact,
		                       .threads = 2};
		cr_assert_eq(kiln_sim_run(&cfg, both, 2, a, stderr, joint), 0);
		/* adapipe alone on the compiled partition: the same run. */
		kiln_sim_config solo = cfg;
		solo.c = &c3;
		solo.c_adapipe = NULL;
		cr_assert_eq(kiln_sim_run(&solo, both, 1, a, stderr, alone), 0);
		cr_assert_eq(joint[0].tokens_per_s, alone[0].tokens_per_s);
		cr_assert_eq(joint[0].ooms, alone[0].ooms);
		cr_assert_eq(joint[0].recompute_s, alone[0].recompute_s);
		for (int32_t s = 0; s < joint[0].n_stages; s++)
			cr_assert_eq(joint[0].peak_bytes[s], alone[0].peak_bytes[s]);
		/* And the partition matters: on the model's split it differs. */
		kiln_sim_config even = cfg;
		even.c_adapipe = NULL;
		cr_assert_eq(kiln_sim_run(&even, both, 1, a, stderr, own), 0);
		cr_assert_neq(own[0].iteration_s, joint[0].iteration_s);
	}
	kiln_arena_free(a);
}

Test(adapipe, simulate_prints_the_partition)
{
	kt_run r =
	    kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                   "--policy", "adapipe", "--iters", "2", "--json", NULL},
	             NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "\"partition\""));
	cr_assert_not_null(strstr(r.out, "\"stage_layers\""));
	cr_assert_not_null(strstr(r.out, "\"searched\":\ttrue"));
	kt_run_free(&r);
	kt_run t =
	    kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                   "--policy", "adapipe,unbounded", "--iters", "2", NULL},
	             NULL);
	cr_assert_eq(t.status, 0, "%s", t.err);
	/* tiny's 8 layers on 2 stages: the even split is AdaPipe's too (the
	 * brute force of partition_equals_brute_force finds it). */
	cr_assert_not_null(strstr(t.out, "adapipe partition (layers per stage"), "%s", t.out);
	cr_assert_not_null(strstr(t.out, "): 4 4;"), "%s", t.out);
	kt_run_free(&t);
}

/* The model's split stays, with the reason, where AdaPipe's search does not
 * apply: an interleaved schedule, and memory in which no split fits. */
Test(adapipe, keeps_the_models_split_when_it_must)
{
	static const char *const il[] = {"schedule: 1f1b", "schedule: interleaved\n  vpp: 2"};
	static const char *const small[] = {"memory_gib: 0.009765625", "memory_gib: 0.0040"};
	static const struct {
		const char *const *subs;
		const char *why;
		bool fits;
	} cases[] = {{il, "interleaved schedule", true}, {small, "no partition fits", false}};
	for (size_t k = 0; k < 2; k++) {
		kiln_arena *a = kiln_arena_new();
		kiln_compilation c;
		kiln_model *m = tiny_variant(cases[k].subs, 2, a);
		compile(m, a, &c);
		kiln_adapipe *x;
		kiln_adapipe_split sp;
		cr_assert_eq(kiln_adapipe_new(&c, a, &x), 0);
		cr_assert_eq(kiln_adapipe_partition(x, a, &sp), 0);
		cr_assert_not_null(sp.kept);
		cr_assert_not_null(strstr(sp.kept, cases[k].why), "%s", sp.kept);
		cr_assert_eq(sp.fits, cases[k].fits);
		/* Per stage, the layers of its chunks (chunk i on stage i % pp). */
		int64_t want[2] = {0, 0};
		for (size_t ch = 0; ch < m->n_stage_layers; ch++)
			want[ch % 2] += m->stage_layers[ch];
		cr_assert_eq(sp.layers[0], want[0]);
		cr_assert_eq(sp.layers[1], want[1]);
		kiln_arena_free(a);
	}
}
