/* tests/test_interleave.c: the dual-batch scheduler (passes/interleave.c):
 * the DP against a brute force over every merge order, the verifier, a
 * hand-computed instance, and the pass on every shipped model. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "kiln_test.h"
#include "passes/passes.h"


/* ---------------------------------------------------------------- random instances */

typedef struct rng {
	uint64_t s;
} rng;

static uint32_t rng_below(rng *r, uint32_t n)
{
	r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)((r->s >> 33) % n);
}

#define MAXT 24

typedef struct inst {
	kiln_task t[MAXT];
	int32_t deps[MAXT][MAXT];
	int32_t n, nc[2];
} inst;

/* Tasks in chain order: chain 0 first, then chain 1 (task i of chain c is
 * at array index c * nc[0] + i). Integer durations keep sums exact. */
static void random_inst(rng *r, inst *x, int32_t n0, int32_t n1, bool reloads)
{
	memset(x, 0, sizeof *x);
	x->nc[0] = n0;
	x->nc[1] = n1;
	x->n = n0 + n1;
	for (int32_t i = 0; i < x->n; i++) {
		kiln_task *t = &x->t[i];
		t->chain = i < n0 ? 0 : 1;
		t->index = i < n0 ? i : i - n0;
		t->deps = x->deps[i];
		t->duration_us = rng_below(r, 10);
		if (reloads && t->chain == 1 && rng_below(r, 3) == 0) {
			t->kind = KILN_TASK_COPY;
			t->stream = KILN_STREAM_H2D;
			t->duration_us = 1 + rng_below(r, 6);
			t->mem_bytes = 1 + rng_below(r, 4);
			t->name = "reload";
			continue;
		}
		t->kind = (kiln_task_kind)rng_below(r, KILN_TASK_KIND_COUNT);
		t->stream = (kiln_stream)rng_below(r, reloads ? 3 : KILN_STREAM_COUNT);
		t->name = "task";
		int32_t lo = t->chain == 0 ? 0 : n0;
		for (int32_t j = lo; j < i; j++) {
			/* Reload-shaped instances: every reload has a consumer. */
			bool must = reloads && x->t[j].mem_bytes > 0 && t->kind != KILN_TASK_COPY &&
			            (j == i - 1 || rng_below(r, 2) == 0);
			if (must || (!reloads && rng_below(r, 4) == 0))
				t->deps[t->n_deps++] = j;
		}
	}
	if (reloads) /* a trailing reload with no consumer holds until its own end */
		return;
}

static void copy_inst(const inst *x, inst *y)
{
	*y = *x;
	for (int32_t i = 0; i < y->n; i++)
		y->t[i].deps = y->deps[i];
}

/* ---------------------------------------------------------------- brute force */

/* The scheduling rule, stated independently of the DP: tasks are issued in
 * a merge order; each starts at the latest of its stream's busy-until, the
 * ends of its deps and (non-copy tasks) the end of the previous non-copy
 * task of its chain. With a memory limit a holding task additionally waits,
 * at issue, until the buffers issued before it fit beside it for good: a
 * buffer whose releasing task (its last dependent) is not issued yet counts
 * as held forever. */
typedef struct bf {
	const inst *x;
	double limit;
	double best;
	double end[MAXT], start[MAXT];
	bool issued[MAXT];
} bf;

static int32_t last_dep(const inst *x, int32_t i)
{
	int32_t best = -1;
	for (int32_t j = 0; j < x->n; j++)
		for (int32_t k = 0; k < x->t[j].n_deps; k++)
			if (x->t[j].deps[k] == i && j > best)
				best = j;
	return best;
}

static double mem_wait(bf *b, int32_t i, double s0)
{
	const inst *x = b->x;
	double need = x->t[i].mem_bytes;
	/* Candidate start times: s0 and every known release after it. */
	double cand[MAXT + 1];
	int32_t nc = 0;
	cand[nc++] = s0;
	for (int32_t l = 0; l < x->n; l++) {
		if (!b->issued[l] || x->t[l].mem_bytes <= 0)
			continue;
		int32_t r = last_dep(x, l);
		double rel = r < 0 ? b->end[l] : (b->issued[r] ? b->end[r] : INFINITY);
		if (rel > s0 && isfinite(rel))
			cand[nc++] = rel;
	}
	double best = INFINITY;
	for (int32_t k = 0; k < nc; k++) {
		double t = cand[k], held = 0;
		for (int32_t l = 0; l < x->n; l++) {
			if (!b->issued[l] || x->t[l].mem_bytes <= 0)
				continue;
			int32_t r = last_dep(x, l);
			double rel = r < 0 ? b->end[l] : (b->issued[r] ? b->end[r] : INFINITY);
			if (rel > t)
				held += x->t[l].mem_bytes;
		}
		if (held + need <= b->limit && t < best)
			best = t;
	}
	return best;
}

static void brute(bf *b, int32_t next0, int32_t next1, const double *busy)
{
	const inst *x = b->x;
	if (next0 == x->nc[0] && next1 == x->nc[1]) {
		double mk = 0;
		for (int32_t i = 0; i < x->n; i++)
			mk = fmax(mk, b->end[i]);
		if (mk < b->best)
			b->best = mk;
		return;
	}
	for (int c = 0; c < 2; c++) {
		int32_t p = c == 0 ? next0 : next1;
		if (p == x->nc[c])
			continue;
		int32_t i = c == 0 ? p : x->nc[0] + p;
		const kiln_task *t = &x->t[i];
		double s = busy[t->stream];
		for (int32_t k = 0; k < t->n_deps; k++)
			s = fmax(s, b->end[t->deps[k]]);
		if (t->kind != KILN_TASK_COPY)
			for (int32_t j = i - 1; j >= (c == 0 ? 0 : x->nc[0]); j--)
				if (x->t[j].kind != KILN_TASK_COPY) {
					s = fmax(s, b->end[j]);
					break;
				}
		if (t->mem_bytes > 0 && isfinite(b->limit))
			s = mem_wait(b, i, s);
		if (!isfinite(s))
			continue;
		double nb[KILN_STREAM_COUNT];
		memcpy(nb, busy, sizeof nb);
		b->start[i] = s;
		b->end[i] = s + t->duration_us;
		nb[t->stream] = b->end[i];
		b->issued[i] = true;
		brute(b, next0 + (c == 0), next1 + (c == 1), nb);
		b->issued[i] = false;
		b->end[i] = 0;
	}
}

static double brute_force(const inst *x, double limit)
{
	bf b;
	memset(&b, 0, sizeof b);
	b.x = x;
	b.limit = limit;
	b.best = INFINITY;
	double busy[KILN_STREAM_COUNT] = {0};
	brute(&b, 0, 0, busy);
	return b.best;
}

/* ---------------------------------------------------------------- tests */

Test(interleave, dp_equals_brute_force_on_random_instances, .timeout = 300)
{
	rng r = {12345};
	for (int id = 0; id < 150; id++) {
		int32_t n0 = 1 + (int32_t)rng_below(&r, 10), n1 = 1 + (int32_t)rng_below(&r, 10);
		if (id % 3) { /* keep most instances quick */
			n0 = 1 + (int32_t)rng_below(&r, 7);
			n1 = 1 + (int32_t)rng_below(&r, 7);
		}
		inst x, y, z, w;
		random_inst(&r, &x, n0, n1, false);
		double want = brute_force(&x, INFINITY);
		copy_inst(&x, &y);
		copy_inst(&x, &z);
		copy_inst(&x, &w);
		double exact = kiln_schedule_dp_cap(y.t, y.n, INFINITY, 0, NULL);
		double capped = kiln_schedule_dp(z.t, z.n, INFINITY, NULL);
		double serial = kiln_schedule_serial(w.t, w.n, NULL);
		cr_assert_eq(exact, want, "instance %d (%d+%d): dp %g, brute force %g", id, n0, n1,
		             exact, want);
		cr_assert_eq(capped, want, "instance %d: capped dp %g, brute force %g", id, capped,
		             want);
		cr_assert_leq(capped, serial, "instance %d: overlapped %g > serial %g", id, capped,
		              serial);
		cr_assert_eq(kiln_schedule_verify(y.t, y.n, INFINITY, stderr), 0, "instance %d", id);
		cr_assert_eq(kiln_schedule_verify(w.t, w.n, INFINITY, stderr), 0, "instance %d", id);
		/* Start order, and the makespan is the last end. */
		double mk = 0;
		for (int32_t i = 0; i < y.n; i++) {
			mk = fmax(mk, y.t[i].end_us);
			if (i)
				cr_assert_geq(y.t[i].start_us, y.t[i - 1].start_us);
		}
		cr_assert_eq(mk, exact);
	}
}

Test(interleave, dp_meets_the_reload_memory_limit_like_brute_force, .timeout = 300)
{
	rng r = {777};
	int tested = 0, infeasible = 0;
	for (int id = 0; id < 120; id++) {
		int32_t n0 = 1 + (int32_t)rng_below(&r, 6), n1 = 2 + (int32_t)rng_below(&r, 7);
		inst x, y;
		random_inst(&r, &x, n0, n1, true);
		double limit = 3 + rng_below(&r, 5);
		double want = brute_force(&x, limit);
		copy_inst(&x, &y);
		double got = kiln_schedule_dp_cap(y.t, y.n, limit, 0, NULL);
		if (!isfinite(want)) {
			cr_assert_lt(got, 0, "instance %d: brute force finds no order, dp %g", id, got);
			infeasible++;
			continue;
		}
		cr_assert_eq(got, want, "instance %d (%d+%d, limit %g): dp %g, brute force %g", id, n0,
		             n1, limit, got, want);
		cr_assert_eq(kiln_schedule_verify(y.t, y.n, limit, stderr), 0, "instance %d", id);
		tested++;
	}
	cr_assert_geq(tested, 60, "%d feasible, %d infeasible", tested, infeasible);
}

/* Chain 0: A1 compute 3 us, then A2 comm 2 us. Chain 1: B1 comm 4 us, then
 * B2 compute 1 us. The comm stream carries 6 us, so no order beats 6; B1
 * first reaches it: B1 comm [0, 4), A1 compute [0, 3), B2 compute [4, 5),
 * A2 comm [4, 6). Serial: A1 [0, 3), A2 [3, 5), B1 [5, 9), B2 [9, 10). */
Test(interleave, hand_computed_two_plus_two)
{
	int32_t dep_a2[1] = {0}, dep_b2[1] = {2};
	kiln_task t[4] = {
	    {.name = "A1", .kind = KILN_TASK_FORWARD, .stream = KILN_STREAM_COMPUTE, .chain = 0,
	     .index = 0, .duration_us = 3},
	    {.name = "A2", .kind = KILN_TASK_COMM, .stream = KILN_STREAM_COMM, .chain = 0, .index = 1,
	     .duration_us = 2, .deps = dep_a2, .n_deps = 1},
	    {.name = "B1", .kind = KILN_TASK_COMM, .stream = KILN_STREAM_COMM, .chain = 1, .index = 0,
	     .duration_us = 4},
	    {.name = "B2", .kind = KILN_TASK_BACKWARD, .stream = KILN_STREAM_COMPUTE, .chain = 1,
	     .index = 1, .duration_us = 1, .deps = dep_b2, .n_deps = 1},
	};
	kiln_task s[4];
	int32_t sd_a2[1] = {0}, sd_b2[1] = {2};
	memcpy(s, t, sizeof s);
	s[1].deps = sd_a2;
	s[3].deps = sd_b2;
	cr_assert_eq(kiln_schedule_dp(t, 4, INFINITY, NULL), 6.0);
	cr_assert_eq(kiln_schedule_serial(s, 4, NULL), 10.0);
	cr_assert_eq(kiln_schedule_verify(t, 4, INFINITY, stderr), 0);
	cr_assert_eq(kiln_schedule_verify(s, 4, INFINITY, stderr), 0);
	/* In start order; A2's dep renumbered onto A1's new place. */
	for (int i = 0; i < 4; i++) {
		if (strcmp(t[i].name, "A2") == 0) {
			cr_assert_eq(t[i].start_us, 4.0);
			cr_assert_eq(t[i].end_us, 6.0);
			cr_assert_str_eq(t[t[i].deps[0]].name, "A1");
		}
		if (strcmp(t[i].name, "B2") == 0)
			cr_assert_eq(t[i].start_us, 4.0);
	}
}

Test(interleave, verify_rejects_broken_schedules)
{
	int32_t dep[1] = {0}, rdep[1] = {0};
	kiln_task ok[3] = {
	    {.name = "a", .kind = KILN_TASK_FORWARD, .stream = KILN_STREAM_COMPUTE, .chain = 0,
	     .index = 0, .duration_us = 2, .start_us = 0, .end_us = 2},
	    {.name = "b", .kind = KILN_TASK_FORWARD, .stream = KILN_STREAM_COMPUTE, .chain = 0,
	     .index = 1, .duration_us = 2, .start_us = 2, .end_us = 4, .deps = dep, .n_deps = 1},
	    {.name = "c", .kind = KILN_TASK_COMM, .stream = KILN_STREAM_COMM, .chain = 1, .index = 0,
	     .duration_us = 3, .start_us = 0, .end_us = 3},
	};
	cr_assert_eq(kiln_schedule_verify(ok, 3, INFINITY, NULL), 0);
	kiln_task x[3];
	/* Overlap on one stream. */
	memcpy(x, ok, sizeof x);
	x[2].stream = KILN_STREAM_COMPUTE;
	cr_assert_eq(kiln_schedule_verify(x, 3, INFINITY, NULL), -1);
	/* A dep that ends after its dependent starts (and chain order). */
	memcpy(x, ok, sizeof x);
	x[1].stream = KILN_STREAM_COMM;
	x[1].start_us = 1;
	x[1].end_us = 3;
	x[2].stream = KILN_STREAM_D2H;
	cr_assert_eq(kiln_schedule_verify(x, 3, INFINITY, NULL), -1);
	/* Chain order without an explicit dep. */
	memcpy(x, ok, sizeof x);
	x[1].n_deps = 0;
	x[1].stream = KILN_STREAM_COMM;
	x[1].start_us = 1;
	x[1].end_us = 3;
	x[2].stream = KILN_STREAM_D2H;
	cr_assert_eq(kiln_schedule_verify(x, 3, INFINITY, NULL), -1);
	/* An end that does not match the duration. */
	memcpy(x, ok, sizeof x);
	x[2].end_us = 2;
	cr_assert_eq(kiln_schedule_verify(x, 3, INFINITY, NULL), -1);
	/* Memory: two reloads of 5 bytes held at once over a limit of 8. */
	kiln_task m[3] = {
	    {.name = "r1", .kind = KILN_TASK_COPY, .stream = KILN_STREAM_H2D, .chain = 1, .index = 0,
	     .duration_us = 1, .start_us = 0, .end_us = 1, .mem_bytes = 5},
	    {.name = "r2", .kind = KILN_TASK_COPY, .stream = KILN_STREAM_H2D, .chain = 1, .index = 1,
	     .duration_us = 1, .start_us = 1, .end_us = 2, .mem_bytes = 5},
	    {.name = "use", .kind = KILN_TASK_BACKWARD, .stream = KILN_STREAM_COMPUTE, .chain = 1,
	     .index = 2, .duration_us = 1, .start_us = 2, .end_us = 3, .deps = rdep, .n_deps = 1},
	};
	cr_assert_eq(kiln_schedule_verify(m, 3, 10, NULL), 0);
	cr_assert_eq(kiln_schedule_verify(m, 3, 8, NULL), -1);
	/* r1 is held until "use" ends at 3; r2 starting after that fits. */
	m[1].start_us = 3;
	m[1].end_us = 4;
	cr_assert_eq(kiln_schedule_verify(m, 3, 8, NULL), 0);
	/* The DP waits by itself when r2 comes after "use" in its chain: r1
	 * [0, 1), use [1, 2), r2 [2, 3). A reload never waits for a task after
	 * it in its chain, so in the first order the limit cannot be met. */
	for (int i = 0; i < 3; i++)
		m[i].start_us = m[i].end_us = 0;
	cr_assert_lt(kiln_schedule_dp(m, 3, 8, NULL), 0);
	m[1].index = 2;
	m[2].index = 1;
	cr_assert_eq(kiln_schedule_dp(m, 3, 8, NULL), 3.0);
	cr_assert_eq(kiln_schedule_verify(m, 3, 8, stderr), 0);
	cr_assert_eq(kiln_schedule_dp(m, 3, INFINITY, NULL), 2.0);
}

Test(interleave, dp_refuses_malformed_instances)
{
	int32_t fwd_dep[1] = {1};
	kiln_task t[2] = {
	    {.name = "a", .stream = KILN_STREAM_COMPUTE, .chain = 0, .index = 0, .duration_us = 1,
	     .deps = fwd_dep, .n_deps = 1},
	    {.name = "b", .stream = KILN_STREAM_COMPUTE, .chain = 0, .index = 1, .duration_us = 1},
	};
	cr_assert_lt(kiln_schedule_dp(t, 2, INFINITY, NULL), 0); /* dep on a later task */
	t[0].n_deps = 0;
	t[1].index = 0;
	cr_assert_lt(kiln_schedule_dp(t, 2, INFINITY, NULL), 0); /* duplicate position */
	t[1].index = 1;
	t[1].duration_us = NAN;
	cr_assert_lt(kiln_schedule_serial(t, 2, NULL), 0);
	t[1].duration_us = 1;
	t[1].chain = 2;
	cr_assert_lt(kiln_schedule_dp(t, 2, INFINITY, NULL), 0);
	cr_assert_eq(kiln_schedule_dp(NULL, 0, INFINITY, NULL), 0.0);
}

/* ---------------------------------------------------------------- shipped models */

Test(interleave, templates_of_every_shipped_model_verify_and_beat_serial, .timeout = 300,
     .init = kt_slow)
{
	for (size_t mi = 0; mi < KT_N_SHIPPED; mi++) {
		kiln_arena *a;
		kiln_compilation c = kt_compile(kt_shipped[mi], KILN_SOLVER_DP, &a);
		const kiln_plan_schedule *s = c.schedule;
		cr_assert_not_null(s, "%s", kt_shipped[mi]);
		cr_assert_geq(s->n_templates, 1);
		for (int32_t k = 0; k < s->n_templates; k++) {
			const kiln_template *t = &s->templates[k];
			cr_assert_eq(kiln_schedule_verify(t->tasks, t->n_tasks, INFINITY, stderr), 0,
			             "%s template %d", kt_shipped[mi], k);
			double eps = 1e-9 * fmax(1, t->serial_us);
			cr_assert_leq(t->makespan_us, t->serial_us + eps, "%s template %d: %g > %g",
			              kt_shipped[mi], k, t->makespan_us, t->serial_us);
			/* Extra work never shortens the layer below keep-all. */
			cr_assert_geq(t->makespan_us, t->base_us - eps, "%s template %d", kt_shipped[mi], k);
			double mk = 0;
			for (int32_t i = 0; i < t->n_tasks; i++)
				mk = fmax(mk, t->tasks[i].end_us);
			cr_assert_float_eq(mk, t->makespan_us, eps);
			/* The serial template, rebuilt, verifies too. */
			if (k < 50 && t->plan >= 0 && t->plan < c.pool->n) {
				const kiln_unit_set *set = NULL;
				for (int32_t si = 0; si < c.n_sets && !set; si++)
					if (c.sets[si].stage == t->stage && c.sets[si].kind == t->kind)
						set = &c.sets[si];
				cr_assert_not_null(set);
				double n = set->kind == KILN_LAYER_MOE
				               ? t->load_factor * c.graph->layers[set->layer].n_balanced
				               : 0;
				kiln_task *tasks;
				int32_t nt;
				cr_assert_eq(kiln_schedule_build(c.graph, set, c.pool->actions[t->plan], n, a,
				                                 &tasks, &nt),
				             0);
				cr_assert_eq(nt, t->n_tasks);
				double ser = kiln_schedule_serial(tasks, nt, a);
				cr_assert_float_eq(ser, t->serial_us, eps);
				cr_assert_eq(kiln_schedule_verify(tasks, nt, INFINITY, stderr), 0);
			}
		}
		/* Stage timelines: every transformer layer once, in order. */
		cr_assert_eq(s->n_stages, c.graph->n_stages);
		for (int32_t st = 0; st < s->n_stages; st++) {
			const kiln_stage_timeline *tl = &s->stages[st];
			const kiln_ir_stage *gs = &c.graph->stages[st];
			int32_t k = 0;
			for (int32_t l = gs->layer_begin; l < gs->layer_end; l++) {
				const kiln_ir_layer *ly = &c.graph->layers[l];
				if (ly->kind != KILN_LAYER_DENSE && ly->kind != KILN_LAYER_MOE)
					continue;
				cr_assert_lt(k, tl->n_layers);
				cr_assert_eq(tl->layer[k], ly->index);
				cr_assert(tl->template_id[k] >= 0 && tl->template_id[k] < s->n_templates);
				cr_assert_eq(s->templates[tl->template_id[k]].kind, ly->kind);
				cr_assert_eq(s->templates[tl->template_id[k]].stage, st);
				k++;
			}
			cr_assert_eq(k, tl->n_layers);
		}
		kiln_arena_free(a);
	}
}

/* Feedback: keep-all first at 0, saving ascending, scheduled exposed time
 * strictly ascending from point 1 on, the maximal saving last. */
Test(interleave, feedback_keeps_every_table_monotone, .timeout = 300, .init = kt_slow)
{
	for (size_t mi = 0; mi < KT_N_SHIPPED; mi++) {
		kiln_arena *a;
		kiln_compilation c = kt_compile(kt_shipped[mi], KILN_SOLVER_DP, &a);
		for (int32_t ti = 0; ti < c.n_sets * c.n_buckets; ti++) {
			const kiln_plan_table *t = &c.tables[ti];
			cr_assert_not_null(t->exposed_us);
			cr_assert_geq(t->n_points, 1);
			cr_assert_eq(t->point[0], 0);
			cr_assert_eq(t->point[t->n_points - 1], t->frontier->n_points - 1);
			cr_assert_eq(kiln_plan_table_exposed_us(t, 0), 0.0);
			const uint8_t *keep = c.pool->actions[t->plan[0]];
			for (int32_t u = 0; u < t->set->n_units; u++)
				cr_assert_eq(keep[u], KILN_ACT_KEEP);
			for (int32_t p = 1; p < t->n_points; p++) {
				cr_assert_geq(t->bytes[p].saved, t->bytes[p - 1].saved, "%s table %d point %d",
				              kt_shipped[mi], ti, p);
				cr_assert_geq(t->exposed_us[p], 0.0);
				if (p > 1)
					cr_assert_gt(t->exposed_us[p], t->exposed_us[p - 1],
					             "%s table %d point %d: %g after %g", kt_shipped[mi], ti, p,
					             t->exposed_us[p], t->exposed_us[p - 1]);
			}
		}
		kiln_arena_free(a);
	}
}

/* On the shipped models too, wherever a template is small enough to search
 * exhaustively (at most 10 tasks per chain), the DP's makespan equals the
 * brute force over every merge order. */
Test(interleave, dp_equals_brute_force_on_shipped_templates, .timeout = 300, .init = kt_slow)
{
	int checked = 0;
	for (size_t mi = 0; mi < KT_N_SHIPPED; mi++) {
		kiln_arena *a;
		kiln_compilation c = kt_compile(kt_shipped[mi], KILN_SOLVER_DP, &a);
		const kiln_plan_schedule *s = c.schedule;
		int per_model = 0;
		for (int32_t k = 0; k < s->n_templates && per_model < 12; k++) {
			const kiln_template *t = &s->templates[k];
			if (t->plan < 0 || t->plan >= c.pool->n)
				continue;
			const kiln_unit_set *set = NULL;
			for (int32_t si = 0; si < c.n_sets && !set; si++)
				if (c.sets[si].stage == t->stage && c.sets[si].kind == t->kind)
					set = &c.sets[si];
			cr_assert_not_null(set);
			double n = set->kind == KILN_LAYER_MOE
			               ? t->load_factor * c.graph->layers[set->layer].n_balanced
			               : 0;
			kiln_task *tasks;
			int32_t nt;
			cr_assert_eq(kiln_schedule_build(c.graph, set, c.pool->actions[t->plan], n, a,
			                                 &tasks, &nt),
			             0);
			int32_t nc[2] = {0, 0};
			bool chain_major = true;
			for (int32_t i = 0; i < nt; i++) {
				int32_t ch = tasks[i].chain;
				chain_major &= ch == 0 || ch == 1;
				if (chain_major) {
					chain_major &= tasks[i].index == nc[ch] && (ch == 1 || nc[1] == 0);
					nc[ch]++;
				}
			}
			cr_assert(chain_major, "%s: tasks are not chain 0 then chain 1", kt_shipped[mi]);
			if (nc[0] > 10 || nc[1] > 10 || nt > MAXT)
				continue;
			inst x, y;
			memset(&x, 0, sizeof x);
			x.n = nt;
			x.nc[0] = nc[0];
			x.nc[1] = nc[1];
			for (int32_t i = 0; i < nt; i++) {
				x.t[i] = tasks[i];
				x.t[i].deps = x.deps[i];
				cr_assert_leq(tasks[i].n_deps, MAXT);
				for (int32_t d = 0; d < tasks[i].n_deps; d++)
					x.deps[i][d] = tasks[i].deps[d];
			}
			double want = brute_force(&x, INFINITY);
			copy_inst(&x, &y);
			double got = kiln_schedule_dp_cap(y.t, y.n, INFINITY, 0, NULL);
			cr_assert_float_eq(got, want, 1e-9 * fmax(1, want), "%s template %d: dp %g, brute %g",
			                   kt_shipped[mi], k, got, want);
			cr_assert_float_eq(t->makespan_us, want, 1e-9 * fmax(1, want),
			                   "%s template %d: stored %g, brute %g", kt_shipped[mi], k,
			                   t->makespan_us, want);
			per_model++;
			checked++;
		}
		kiln_arena_free(a);
	}
	cr_assert_geq(checked, 10, "too few shipped templates were small enough to check");
}
