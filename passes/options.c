/* passes/options.c: the planning instance of one unit set at one load.
 *
 * Turns the units of passes/activations.c into the multiple-choice knapsack
 * that the solvers (costmodel/knapsack.c, milp.c) read: per unit the
 * actions allowed, bytes in quanta, recompute time from the closure's op
 * times, groups of units whose recomputes share ops with every valid,
 * undominated joint choice, and the copy link's idle capacity. Also the
 * exact byte accounting and source tracking of a per-unit plan.
 * docs/cost-model.md, "Units and options", gives the equations.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

#define MAX_JOINT 729 /* 3^KILN_PLAN_MAX_GROUP */

/* ---------------------------------------------------------------- source tracking */

/* Least fixpoint of "available": kept and offloaded units are; a recomputed
 * unit is once every source is and it is not the layer's input. Recompute
 * cycles therefore stay unavailable. avail has set->n_units entries. */
static int valid_with(const kiln_unit_set *set, const uint8_t *actions, uint8_t *avail)
{
	for (int32_t u = 0; u < set->n_units; u++) {
		if (actions[u] >= KILN_ACT_COUNT)
			return -1;
		avail[u] = actions[u] != KILN_ACT_RECOMPUTE;
	}
	for (bool changed = true; changed;) {
		changed = false;
		for (int32_t u = 0; u < set->n_units; u++) {
			const kiln_unit *un = &set->units[u];
			if (avail[u] || (un->flags & KILN_UNIT_LAYER_INPUT))
				continue;
			bool ok = true;
			for (int32_t i = 0; i < un->n_sources && ok; i++) {
				int32_t s = un->sources[i];
				ok = s >= 0 && s < set->n_units && avail[s];
			}
			if (ok) {
				avail[u] = 1;
				changed = true;
			}
		}
	}
	for (int32_t u = 0; u < set->n_units; u++)
		if (!avail[u])
			return -1;
	return 0;
}

int kiln_plan_valid(const kiln_unit_set *set, const uint8_t *actions)
{
	uint8_t local[KILN_PLAN_MAX_UNITS];
	uint8_t *avail = local;
	if (set->n_units > KILN_PLAN_MAX_UNITS) {
		avail = malloc((size_t)set->n_units);
		if (!avail)
			return -1; /* cannot prove it valid */
	}
	int rc = valid_with(set, actions, avail);
	if (avail != local)
		free(avail);
	return rc;
}

void kiln_plan_bytes_at(const kiln_unit_set *set, const uint8_t *actions, double n,
                        kiln_plan_bytes *out)
{
	memset(out, 0, sizeof(*out));
	for (int32_t u = 0; u < set->n_units; u++) {
		const kiln_unit *un = &set->units[u];
		double b = kiln_lin_at(un->bytes, n);
		switch (actions[u]) {
		case KILN_ACT_KEEP:
			out->resident += b;
			break;
		case KILN_ACT_RECOMPUTE:
			out->saved += b;
			out->transient += b + kiln_lin_at(un->workspace_bytes, n);
			break;
		case KILN_ACT_OFFLOAD:
			out->saved += b;
			out->offloaded += b;
			out->transient += b;
			break;
		default:
			break;
		}
	}
}

void kiln_plan_actions(const kiln_plan_instance *in, const kiln_plan_point *p, uint8_t *out)
{
	for (int32_t g = 0; g < in->n_groups; g++) {
		const kiln_plan_group *gr = &in->groups[g];
		const kiln_plan_choice *c = &gr->choices[p->choice[g]];
		for (int32_t k = 0; k < gr->n_units; k++)
			out[gr->units[k]] = c->actions[k];
	}
}

/* ---------------------------------------------------------------- instance */

/* Per-unit numbers at the instance's load. */
typedef struct unit_opt {
	uint32_t saved_q, offload_q;
	double copy_hbm_us; /* HBM time an offload's two copies take from compute */
	uint8_t allowed;    /* bit per kiln_action */
} unit_opt;

static int32_t find(int32_t *parent, int32_t x)
{
	while (parent[x] != x) {
		parent[x] = parent[parent[x]];
		x = parent[x];
	}
	return x;
}

/* a dominates b: no worse in all three, better in one. */
static bool dominates(const kiln_plan_choice *a, const kiln_plan_choice *b)
{
	if (a->saved_q < b->saved_q || a->offload_q > b->offload_q ||
	    a->recompute_us > b->recompute_us)
		return false;
	return a->saved_q > b->saved_q || a->offload_q < b->offload_q ||
	       a->recompute_us < b->recompute_us;
}

static bool same_totals(const kiln_plan_choice *a, const kiln_plan_choice *b)
{
	return a->saved_q == b->saved_q && a->offload_q == b->offload_q &&
	       a->recompute_us == b->recompute_us;
}

/* Scratch shared by the groups of one instance. */
typedef struct opt_ctx {
	const kiln_ir_graph *g;
	const kiln_unit_set *set;
	const unit_opt *uo;
	const double *op_us; /* per local op of the representative layer */
	int32_t op_begin, n_ops;
	uint8_t *op_mark; /* per local op */
	uint8_t *actions; /* per unit, all KEEP outside the group being built */
	uint8_t *avail;   /* per unit, for valid_with */
	kiln_plan_choice cand[MAX_JOINT];
	uint8_t dead[MAX_JOINT];
} opt_ctx;

/* Totals of one joint choice; false when an action is not allowed or the
 * plan fails source tracking (units outside the group count as kept). */
static bool joint_choice(opt_ctx *c, const kiln_plan_group *gr, int32_t idx, kiln_plan_choice *out)
{
	memset(out, 0, sizeof(*out));
	for (int32_t k = 0; k < gr->n_units; k++, idx /= KILN_ACT_COUNT) {
		uint8_t act = (uint8_t)(idx % KILN_ACT_COUNT);
		if (!(c->uo[gr->units[k]].allowed & (1u << act)))
			return false;
		out->actions[k] = act;
	}
	for (int32_t k = 0; k < gr->n_units; k++)
		c->actions[gr->units[k]] = out->actions[k];
	bool ok = valid_with(c->set, c->actions, c->avail) == 0;
	for (int32_t k = 0; k < gr->n_units; k++)
		c->actions[gr->units[k]] = KILN_ACT_KEEP;
	if (!ok)
		return false;
	memset(c->op_mark, 0, (size_t)c->n_ops);
	for (int32_t k = 0; k < gr->n_units; k++) {
		const unit_opt *uo = &c->uo[gr->units[k]];
		const kiln_unit *un = &c->set->units[gr->units[k]];
		switch (out->actions[k]) {
		case KILN_ACT_RECOMPUTE:
			out->saved_q += uo->saved_q;
			/* A shared op runs once for the whole group. */
			for (int32_t i = 0; i < un->n_closure; i++) {
				int32_t lo = un->closure[i] - c->op_begin;
				if (lo >= 0 && lo < c->n_ops)
					c->op_mark[lo] = 1;
			}
			break;
		case KILN_ACT_OFFLOAD:
			out->saved_q += uo->saved_q;
			out->offload_q += uo->offload_q;
			out->recompute_us += uo->copy_hbm_us;
			break;
		default:
			break;
		}
	}
	for (int32_t lo = 0; lo < c->n_ops; lo++)
		if (c->op_mark[lo])
			out->recompute_us += c->op_us[lo];
	return true;
}

/* Fills gr->choices: every valid joint choice, dominated ones and later
 * exact ties dropped, keep-all first. Returns 0 or -1 on exhaustion. */
static int group_choices(opt_ctx *c, kiln_plan_group *gr, kiln_arena *a)
{
	int32_t total = 1, n = 0;
	for (int32_t k = 0; k < gr->n_units; k++)
		total *= KILN_ACT_COUNT;
	/* idx 0 is keep-all, always allowed and valid. */
	for (int32_t idx = 0; idx < total; idx++)
		if (joint_choice(c, gr, idx, &c->cand[n]))
			n++;
	memset(c->dead, 0, (size_t)n);
	int32_t alive = n;
	/* Keep-all stays even if something dominates it: the solvers need the
	 * identity choice at index 0. */
	for (int32_t i = 1; i < n; i++) {
		for (int32_t j = 0; j < n; j++) {
			/* Dead candidates still count: whatever killed them also
			 * dominates or ties i. */
			if (j == i)
				continue;
			if (dominates(&c->cand[j], &c->cand[i]) ||
			    (j < i && same_totals(&c->cand[j], &c->cand[i]))) {
				c->dead[i] = 1;
				alive--;
				break;
			}
		}
	}
	gr->choices = kiln_arena_alloc(a, (size_t)alive * sizeof(*gr->choices));
	if (!gr->choices)
		return -1;
	gr->n_choices = 0;
	for (int32_t i = 0; i < n; i++)
		if (!c->dead[i])
			gr->choices[gr->n_choices++] = c->cand[i];
	return 0;
}

/* Partitions the units into groups: connected components of "closures share
 * an op" among recomputable units, split into runs of KILN_PLAN_MAX_GROUP in
 * unit order when larger. Returns the number of groups, or -1. */
static int32_t make_groups(const kiln_unit_set *set, const unit_opt *uo, int32_t op_begin,
                           int32_t n_ops, kiln_arena *a, kiln_plan_group **out)
{
	int32_t nu = set->n_units;
	int32_t *parent = kiln_arena_alloc(a, (size_t)nu * sizeof(int32_t));
	int32_t *first = kiln_arena_alloc(a, (size_t)(n_ops > 0 ? n_ops : 1) * sizeof(int32_t));
	int32_t *gid = kiln_arena_alloc(a, (size_t)nu * sizeof(int32_t));
	kiln_plan_group *groups = kiln_arena_alloc(a, (size_t)nu * sizeof(*groups));
	if (!parent || !first || !gid || !groups)
		return -1;
	for (int32_t u = 0; u < nu; u++)
		parent[u] = u;
	for (int32_t lo = 0; lo < n_ops; lo++)
		first[lo] = -1;
	for (int32_t u = 0; u < nu; u++) {
		/* A unit that is never recomputed shares nothing. */
		if (!(uo[u].allowed & (1u << KILN_ACT_RECOMPUTE)))
			continue;
		const kiln_unit *un = &set->units[u];
		for (int32_t i = 0; i < un->n_closure; i++) {
			int32_t lo = un->closure[i] - op_begin;
			if (lo < 0 || lo >= n_ops)
				continue;
			if (first[lo] < 0)
				first[lo] = u;
			else
				parent[find(parent, u)] = find(parent, first[lo]);
		}
	}
	/* Components in order of their first unit; an oversized component
	 * continues in a fresh group (its shared ops are then counted once per
	 * group: conservative). */
	int32_t ng = 0;
	for (int32_t u = 0; u < nu; u++)
		gid[u] = -1;
	for (int32_t u = 0; u < nu; u++) {
		int32_t r = find(parent, u);
		int32_t gi = gid[r];
		if (gi < 0 || groups[gi].n_units == KILN_PLAN_MAX_GROUP) {
			gi = ng++;
			gid[r] = gi;
		}
		groups[gi].units[groups[gi].n_units++] = u;
	}
	*out = groups;
	return ng;
}

int kiln_pass_options(const kiln_ir_graph *g, const kiln_unit_set *set, double n,
                      const kiln_option_flags *flags, kiln_arena *a, kiln_plan_instance *out)
{
	memset(out, 0, sizeof(*out));
	if (set->n_units < 0 || set->n_units > KILN_PLAN_MAX_UNITS || !(n >= 0) || !isfinite(n))
		return -1;
	const kiln_ir_layer *ly = &g->layers[set->layer];
	double nl = set->kind == KILN_LAYER_MOE ? n : 0;
	int32_t nu = set->n_units, n_ops = ly->op_end - ly->op_begin;

	/* Quantum: the layer's saved bytes span at most MAX_QUANTA / 4 quanta. */
	double total = 0;
	for (int32_t u = 0; u < nu; u++)
		total += kiln_lin_at(set->units[u].bytes, nl);
	double qd = ceil(total / (double)(KILN_PLAN_MAX_QUANTA / 4));
	uint64_t q = qd > 1 ? (uint64_t)qd : 1;

	/* Copy link: full duplex, beside compute; the layer's forward and
	 * backward time is the idle window its share of the link has. */
	const kiln_hardware *hw = &g->model->hw;
	double bw_gbps = hw->d2h_gbps < hw->h2d_gbps ? hw->d2h_gbps : hw->h2d_gbps;
	bool link = bw_gbps > 0 && isfinite(bw_gbps);
	double *op_us = kiln_arena_alloc(a, (size_t)(n_ops > 0 ? n_ops : 1) * sizeof(double));
	if (!op_us)
		return -1;
	double window_us = 0;
	for (int32_t lo = 0; lo < n_ops; lo++) {
		op_us[lo] = kiln_cost_op_time_us(g, &g->ops[ly->op_begin + lo], nl);
		window_us += op_us[lo];
	}
	if (link) {
		double free_q = floor(window_us * 1e-6 * bw_gbps * 1e9 / (double)q);
		out->free_offload_q =
		    free_q >= KILN_PLAN_MAX_QUANTA ? KILN_PLAN_MAX_QUANTA : (uint32_t)free_q;
		out->offload_us_per_q = (double)q / (bw_gbps * 1e9) * 1e6;
	}
	out->quantum_bytes = q;
	out->n_units = nu;
	if (nu == 0)
		return 0;

	unit_opt *uo = kiln_arena_alloc(a, (size_t)nu * sizeof(*uo));
	if (!uo)
		return -1;
	for (int32_t u = 0; u < nu; u++) {
		const kiln_unit *un = &set->units[u];
		double b = kiln_lin_at(un->bytes, nl);
		uo[u].saved_q = (uint32_t)floor(b / (double)q);
		uo[u].offload_q = (uint32_t)ceil(b / (double)q);
		/* Even when the link is idle, the copy engine reads the tensor
		 * from HBM on the way out and writes it on the way back: bandwidth
		 * the kernels running beside it lose. This keeps offloading from
		 * being free, so the frontier prefers keeping what fits. */
		uo[u].copy_hbm_us = kiln_cost_hbm_us(hw, 2.0 * b);
		uo[u].allowed = 1u << KILN_ACT_KEEP;
		bool rec = !(un->flags & KILN_UNIT_LAYER_INPUT) &&
		           (!(un->flags & KILN_UNIT_COLLECTIVE) || flags->collective_recompute);
		if (rec)
			uo[u].allowed |= 1u << KILN_ACT_RECOMPUTE;
		if (flags->offload && link && b > 0)
			uo[u].allowed |= 1u << KILN_ACT_OFFLOAD;
	}

	int32_t ng = make_groups(set, uo, ly->op_begin, n_ops, a, &out->groups);
	if (ng < 0)
		return -1;
	out->n_groups = ng;
	opt_ctx *c = kiln_arena_alloc(a, sizeof(*c));
	if (!c)
		return -1;
	c->g = g;
	c->set = set;
	c->uo = uo;
	c->op_us = op_us;
	c->op_begin = ly->op_begin;
	c->n_ops = n_ops;
	c->op_mark = kiln_arena_alloc(a, (size_t)(n_ops > 0 ? n_ops : 1));
	c->actions = kiln_arena_alloc(a, (size_t)nu); /* zero: KILN_ACT_KEEP */
	c->avail = kiln_arena_alloc(a, (size_t)nu);
	if (!c->op_mark || !c->actions || !c->avail)
		return -1;
	for (int32_t i = 0; i < ng; i++)
		if (group_choices(c, &out->groups[i], a) != 0)
			return -1;
	return 0;
}
