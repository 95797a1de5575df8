/* passes/verify.c: the plan-table verifier, run between passes beside the
 * graph's (docs/passes.md, "The verifier").
 *
 * It checks what the planning passes hand each other and the blob, as far
 * as it exists: frontiers and table points monotone, every plan one legal
 * action per unit that source tracking accepts, every table point's plan
 * the actions of its frontier point, baselines' plans in the pool, and
 * every template the schedule of its plan. A failure is a compiler bug.
 */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "kiln/runtime.h"
#include "passes/passes.h"

/* At most this many violations are printed; the rest are counted. */
#define VERIFY_MAX_LINES 20

typedef struct vctx {
	const kiln_compilation *c;
	FILE *err;
	int64_t n;
} vctx;

static void fail(vctx *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(vctx *v, const char *fmt, ...)
{
	if (v->err && v->n < VERIFY_MAX_LINES) {
		va_list ap;
		fputs("kilnc: verify: ", v->err);
		va_start(ap, fmt);
		vfprintf(v->err, fmt, ap);
		va_end(ap);
		fputc('\n', v->err);
	}
	v->n++;
}

static bool same_units(const kiln_unit_set *x, const kiln_unit_set *y)
{
	if (x == y)
		return true;
	if (!x || !y || x->kind != y->kind || x->n_units != y->n_units)
		return false;
	for (int32_t u = 0; u < x->n_units; u++)
		if (strcmp(x->units[u].name, y->units[u].name) != 0)
			return false;
	return true;
}

/* Relative slack for comparing times that went through different sums. */
static bool less(double x, double y)
{
	return x < y - 1e-9 * fmax(1.0, fmax(fabs(x), fabs(y)));
}

/* One action per unit, each a kiln_action, legal for the unit's flags
 * (adaptive: no recompute that re-runs a collective) and for the
 * compilation (no offload under no_offload), accepted by source tracking.
 * what names the plan in messages. */
static void check_actions(vctx *v, const char *what, const kiln_unit_set *set,
                          const uint8_t *actions, bool adaptive)
{
	bool ok = true;
	for (int32_t u = 0; u < set->n_units; u++) {
		const kiln_unit *un = &set->units[u];
		uint8_t a = actions[u];
		if (a >= KILN_ACT_COUNT) {
			fail(v, "%s: unit %s has action %u, not a kiln_action", what, un->name, a);
			ok = false;
		} else if (a == KILN_ACT_RECOMPUTE && (un->flags & KILN_UNIT_LAYER_INPUT)) {
			fail(v, "%s: recomputes %s, the layer's input", what, un->name);
			ok = false;
		} else if (a == KILN_ACT_RECOMPUTE && adaptive &&
		           (un->flags & KILN_UNIT_COLLECTIVE)) {
			fail(v,
			     "%s: recomputes %s, which re-runs a collective, in an adaptive table",
			     what, un->name);
			ok = false;
		} else if (a == KILN_ACT_OFFLOAD && adaptive && v->c->no_offload) {
			fail(v, "%s: offloads %s in a compilation without offload", what, un->name);
			ok = false;
		}
	}
	if (ok && kiln_plan_valid(set, actions) != 0)
		fail(v, "%s: source tracking refuses it (a recompute that needs itself)", what);
}

static void check_frontier(vctx *v, const char *where, const kiln_frontier *f)
{
	if (!f || f->n_points < 1) {
		fail(v, "%s: no frontier points", where);
		return;
	}
	if (f->points[0].saved_q != 0)
		fail(v, "%s: frontier point 0 saves %u quanta, not 0 (keep everything)", where,
		     f->points[0].saved_q);
	for (int32_t p = 1; p < f->n_points; p++) {
		const kiln_plan_point *a = &f->points[p - 1], *b = &f->points[p];
		/* Savings only: a frontier whose points the schedule chose
		 * (plan.c, choose_by_schedule) is ordered by scheduled time, and
		 * its first estimates need not ascend (on custom-moe-188b and
		 * kimi-k2-1t they do not); the cost the tables carry is checked
		 * once it is the scheduled one (check_table). */
		if (b->saved_q <= a->saved_q)
			fail(v,
			     "%s: frontier point %d saves %u quanta, point %d %u: savings must "
			     "ascend",
			     where, p, b->saved_q, p - 1, a->saved_q);
	}
}

static void check_table(vctx *v, int32_t ti, uint8_t *actions)
{
	const kiln_compilation *c = v->c;
	const kiln_plan_table *t = &c->tables[ti];
	int32_t s = ti / c->n_buckets, b = ti % c->n_buckets;
	char where[160];
	const kiln_unit_set *set = &c->sets[s];
	snprintf(where, sizeof where, "table (stage %d, %s, bucket %d)", set->stage,
	         kiln_ir_layer_kind_name(set->kind), b);
	if (t->set != set) {
		fail(v, "%s: belongs to another unit set", where);
		return;
	}
	if (t->load_factor != c->buckets[b])
		fail(v, "%s: built at load %.9g, its bucket's edge is %.9g", where, t->load_factor,
		     c->buckets[b]);
	check_frontier(v, where, t->frontier);
	if (!t->frontier || t->frontier->n_points < 1)
		return;
	const kiln_frontier *f = t->frontier;
	if (t->n_points < 1 || t->n_points > f->n_points) {
		fail(v, "%s: %d table points for a frontier of %d", where, t->n_points,
		     f->n_points);
		return;
	}
	for (int32_t k = 0; k < t->n_points; k++) {
		char what[200];
		snprintf(what, sizeof what, "%s point %d", where, k);
		int32_t fp = t->point[k];
		if (fp < 0 || fp >= f->n_points || (k > 0 && fp <= t->point[k - 1]) ||
		    (k == 0 && fp != 0)) {
			fail(v, "%s: frontier index %d out of order (keep-all first, ascending)",
			     what, fp);
			continue;
		}
		if (k > 0 && t->exposed_us) {
			if (t->bytes[k].saved <= t->bytes[k - 1].saved)
				fail(v, "%s: saves %.0f bytes, no more than point %d's %.0f", what,
				     t->bytes[k].saved, k - 1, t->bytes[k - 1].saved);
			if (less(t->exposed_us[k], t->exposed_us[k - 1]))
				fail(v, "%s: scheduled at %.9g us, less than point %d's %.9g us",
				     what, t->exposed_us[k], k - 1, t->exposed_us[k - 1]);
		}
		int32_t p = t->plan[k];
		if (!c->pool)
			continue;
		if (p < 0 || p >= c->pool->n) {
			fail(v, "%s: plan %d is not in the pool of %d", what, p, c->pool->n);
			continue;
		}
		if (!same_units(c->pool->set[p], set)) {
			fail(v, "%s: plan %d is a plan of other units", what, p);
			continue;
		}
		const uint8_t *pa = c->pool->actions[p];
		check_actions(v, what, set, pa, true);
		kiln_plan_actions(&t->instance, &f->points[fp], actions);
		if (memcmp(actions, pa, (size_t)set->n_units) != 0)
			fail(v, "%s: plan %d is not the actions of its frontier point %d", what, p,
			     fp);
		kiln_plan_bytes by;
		kiln_plan_bytes_at(set, pa, t->n, &by);
		if (memcmp(&by, &t->bytes[k], sizeof by) != 0)
			fail(v, "%s: its bytes are not its plan's at the bucket's load", what);
	}
}

static void check_baselines(vctx *v)
{
	const kiln_compilation *c = v->c;
	for (int k = 0; k < KILN_BASELINE_COUNT; k++) {
		const kiln_baseline *bl = &c->baselines[k];
		for (int32_t i = 0; i < c->n_sets; i++) {
			for (int h = 0; h < 2; h++) {
				const int32_t *plans = h ? bl->head_plan : bl->plan;
				if (!plans)
					continue;
				char what[160];
				snprintf(what, sizeof what, "baseline %s, %s plan of unit set %d",
				         kiln_baseline_name(bl->kind), h ? "block" : "", i);
				int32_t p = plans[i];
				if (p < 0 || p >= c->pool->n ||
				    !same_units(c->pool->set[p], &c->sets[i])) {
					fail(v, "%s: plan %d is not a pooled plan of the set", what,
					     p);
					continue;
				}
				check_actions(v, what, &c->sets[i], c->pool->actions[p], false);
			}
		}
	}
}

/* The offload, reload and recompute tasks of a template against its plan:
 * an offloaded unit has one offload (device to host, forward chain) and
 * one reload (host to device, backward chain), a recomputed unit one
 * recompute (compute stream, backward chain), a kept unit none; and no
 * such task names anything else. */
static void check_template(vctx *v, int32_t id, const kiln_template *tpl)
{
	const kiln_compilation *c = v->c;
	char what[160];
	snprintf(what, sizeof what, "template %d (stage %d, %s, plan %d)", id, tpl->stage,
	         kiln_ir_layer_kind_name(tpl->kind), tpl->plan);
	if (tpl->plan < 0 || tpl->plan >= c->pool->n) {
		fail(v, "%s: its plan is not in the pool of %d", what, c->pool->n);
		return;
	}
	const kiln_unit_set *set = c->pool->set[tpl->plan];
	const uint8_t *act = c->pool->actions[tpl->plan];
	if (set->kind != tpl->kind || tpl->stage < 0 || tpl->stage >= c->graph->n_stages) {
		fail(v, "%s: its plan is for another layer kind, or its stage does not exist",
		     what);
		return;
	}
	int32_t off[KILN_PLAN_MAX_UNITS] = {0}, rel[KILN_PLAN_MAX_UNITS] = {0},
	        rec[KILN_PLAN_MAX_UNITS] = {0};
	static const struct {
		const char *prefix;
		kiln_task_kind kind;
		kiln_stream stream;
		int32_t chain;
	} forms[3] = {{"offload ", KILN_TASK_COPY, KILN_STREAM_D2H, 0},
	              {"reload ", KILN_TASK_COPY, KILN_STREAM_H2D, 1},
	              {"recompute ", KILN_TASK_RECOMPUTE, KILN_STREAM_COMPUTE, 1}};
	int32_t *count[3] = {off, rel, rec};
	for (int32_t i = 0; i < tpl->n_tasks; i++) {
		const kiln_task *tk = &tpl->tasks[i];
		if (tk->kind != KILN_TASK_COPY && tk->kind != KILN_TASK_RECOMPUTE)
			continue;
		int f = -1;
		for (int k = 0; k < 3 && f < 0; k++)
			if (tk->name &&
			    strncmp(tk->name, forms[k].prefix, strlen(forms[k].prefix)) == 0 &&
			    tk->kind == forms[k].kind && tk->stream == forms[k].stream &&
			    tk->chain == forms[k].chain)
				f = k;
		int32_t u = -1;
		for (int32_t w = 0; f >= 0 && w < set->n_units && u < 0; w++)
			if (strcmp(tk->name + strlen(forms[f].prefix), set->units[w].name) == 0)
				u = w;
		if (u < 0) {
			fail(v, "%s: task '%s' is no offload, reload or recompute of a unit", what,
			     tk->name ? tk->name : "");
			continue;
		}
		count[f][u]++;
	}
	for (int32_t u = 0; u < set->n_units && u < KILN_PLAN_MAX_UNITS; u++) {
		int32_t want_copy = act[u] == KILN_ACT_OFFLOAD,
		        want_rec = act[u] == KILN_ACT_RECOMPUTE;
		if (off[u] != want_copy || rel[u] != want_copy || rec[u] != want_rec)
			fail(v,
			     "%s: unit %s is to %s, but the template has %d offloads, %d reloads "
			     "and %d "
			     "recomputes of it",
			     what, set->units[u].name, kiln_rt_action_name(act[u]), off[u], rel[u],
			     rec[u]);
	}
	if (kiln_schedule_verify(tpl->tasks, tpl->n_tasks, INFINITY, NULL) != 0)
		fail(v, "%s: not a valid schedule (kiln_schedule_verify)", what);
}

static void check_schedule(vctx *v)
{
	const kiln_plan_schedule *sc = v->c->schedule;
	for (int32_t i = 0; i < sc->n_templates; i++)
		check_template(v, i, &sc->templates[i]);
	if (sc->n_stages != v->c->graph->n_stages)
		fail(v, "the schedule has %d timelines for %d stages", sc->n_stages,
		     v->c->graph->n_stages);
	for (int32_t s = 0; s < sc->n_stages; s++) {
		const kiln_stage_timeline *tl = &sc->stages[s];
		if (tl->stage != s)
			fail(v, "timeline %d is stage %d's (one per stage, in stage order)", s,
			     tl->stage);
		for (int32_t k = 0; k < tl->n_layers; k++) {
			int32_t id = tl->template_id[k];
			if (id < 0 || id >= sc->n_templates || sc->templates[id].stage != s)
				fail(v,
				     "stage %d timeline, layer %d: template %d is not one of the "
				     "stage's",
				     s, tl->layer[k], id);
		}
	}
}

int kiln_plan_verify(const kiln_compilation *c, FILE *err)
{
	vctx v = {c, err, 0};
	if (c->tables && c->sets && c->buckets) {
		uint8_t actions[KILN_PLAN_MAX_UNITS + 1];
		for (int32_t s = 0; s < c->n_sets; s++)
			if (c->sets[s].n_units < 0 || c->sets[s].n_units > KILN_PLAN_MAX_UNITS)
				fail(&v, "unit set %d: %d units, over KILN_PLAN_MAX_UNITS", s,
				     c->sets[s].n_units);
		if (v.n == 0)
			for (int32_t ti = 0; ti < c->n_sets * c->n_buckets; ti++)
				check_table(&v, ti, actions);
	}
	if (c->pool) {
		for (int32_t p = 0; p < c->pool->n; p++) {
			char what[64];
			snprintf(what, sizeof what, "pooled plan %d", p);
			check_actions(&v, what, c->pool->set[p], c->pool->actions[p], false);
		}
		if (c->baselines)
			check_baselines(&v);
		if (c->schedule && c->graph)
			check_schedule(&v);
	}
	if (err && v.n > VERIFY_MAX_LINES)
		fprintf(err, "kilnc: verify: ... and %lld more\n",
		        (long long)(v.n - VERIFY_MAX_LINES));
	return v.n ? -1 : 0;
}
