/* tests/test_options.c: passes/options.c and costmodel/plan_eval.c.
 *
 * Per-unit numbers for tiny are derived by hand from examples/models/tiny.yaml
 * (h 64, T = 2 * 128 = 256, E 8, k 2, f_e 128, ep 2, hbm 100 GB/s, links
 * 10 GB/s) and docs/cost-model.md; the pruning is checked against a brute
 * force over per-unit actions that never sees the groups.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "costmodel/costmodel.h"
#include "frontend/frontend.h"
#include "kiln_test.h"
#include "passes/passes.h"

/* HBM bandwidth of the model's device, GB/s. */
static double m_hbm_gbps(const kiln_ir_graph *g)
{
	return g->model->hw.hbm_gbps;
}


static kiln_arena *arena;

static void setup(void)
{
	arena = kiln_arena_new();
	cr_assert_not_null(arena);
}

static void teardown(void)
{
	kiln_arena_free(arena);
}

TestSuite(options, .init = setup, .fini = teardown);

static kiln_ir_graph *lower_file(const char *rel)
{
	kiln_model *m = NULL;
	kiln_ir_graph *g = NULL;
	cr_assert_eq(kiln_frontend_load_file(kt_src(rel), arena, stderr, &m), 0, "%s", rel);
	cr_assert_eq(kiln_pipeline_run(m, arena, NULL, NULL, stderr, &g), 0);
	return g;
}

static void sets_of(const kiln_ir_graph *g, kiln_unit_set **sets, int32_t *n)
{
	cr_assert_eq(kiln_pass_activations(g, arena, sets, n), 0);
}

static const kiln_unit_set *tiny_moe(const kiln_ir_graph *g)
{
	kiln_unit_set *sets;
	int32_t n;
	sets_of(g, &sets, &n);
	for (int32_t i = 0; i < n; i++)
		if (sets[i].stage == 0 && sets[i].kind == KILN_LAYER_MOE)
			return &sets[i];
	cr_assert_fail("tiny has a MoE layer on stage 0");
	return NULL;
}

static int32_t unit_named(const kiln_unit_set *s, const char *name)
{
	for (int32_t u = 0; u < s->n_units; u++)
		if (strcmp(s->units[u].name, name) == 0)
			return u;
	cr_assert_fail("no unit %s", name);
	return -1;
}

/* The group holding unit u, and u's position in it. */
static const kiln_plan_group *group_of(const kiln_plan_instance *in, int32_t u, int32_t *pos)
{
	for (int32_t i = 0; i < in->n_groups; i++)
		for (int32_t k = 0; k < in->groups[i].n_units; k++)
			if (in->groups[i].units[k] == u) {
				*pos = k;
				return &in->groups[i];
			}
	cr_assert_fail("unit %d in no group", u);
	return NULL;
}

static const kiln_option_flags ADAPTIVE = {.offload = true, .collective_recompute = false};

/* tiny's shapes, read from the model so that the hand formulas below follow
 * edits to examples/models/tiny.yaml (tp 1, bf16, SwiGLU experts). */
typedef struct tiny_dims {
	double e, h, T, E, k, fe, ep, n; /* n = N_bal = T * k */
	double hbm_b_per_us, link_b_per_us, ep_b_per_us;
} tiny_dims;

static tiny_dims dims_of(const kiln_ir_graph *g)
{
	const kiln_model *m = g->model;
	cr_assert_eq(m->tp, 1);
	cr_assert_eq(m->dtype, KILN_DTYPE_BF16);
	cr_assert_eq(m->moe_activation, KILN_FN_SWIGLU);
	tiny_dims d = {.e = 2,
	               .h = (double)m->hidden,
	               .T = (double)(m->seq_len * m->micro_batch),
	               .E = (double)m->experts,
	               .k = (double)m->top_k,
	               .fe = (double)m->expert_ffn_hidden,
	               .ep = (double)m->ep};
	d.n = d.T * d.k;
	d.hbm_b_per_us = m->hw.hbm_gbps * 1e3;
	d.link_b_per_us = fmin(m->hw.h2d_gbps, m->hw.d2h_gbps) * 1e3;
	d.ep_b_per_us =
	    (m->ep <= m->hw.devices_per_node ? m->hw.intra_node_gbps : m->hw.inter_node_gbps) * 1e3;
	return d;
}

/* Quantum: with the shipped tiny (h 64, T 256, E 8, k 2, f_e 128) the MoE
 * layer saves 243,712 + 908 N bytes, 708,608 at N = 512, so q =
 * ceil(708608 / 1024) = 692 (tiny_quantum_by_hand below); memory.c counts
 * the layer independently. */
Test(options, tiny_quantum_and_copy_link)
{
	kiln_ir_graph *g = lower_file("examples/models/tiny.yaml");
	tiny_dims d = dims_of(g);
	const kiln_unit_set *set = tiny_moe(g);
	kiln_plan_instance in;
	cr_assert_eq(kiln_pass_options(g, set, d.n, &ADAPTIVE, arena, &in), 0);
	cr_assert_eq(kiln_cost_instance_check(&in), 0);
	cr_assert_eq(in.n_units, 15);
	double total = kiln_lin_at(kiln_cost_layer_activation(g, set->layer), d.n);
	uint64_t q = (uint64_t)ceil(total / 1024);
	cr_assert_eq(in.quantum_bytes, q);
	/* q bytes at the slower link direction (10 GB/s: 0.0692 us for 692). */
	double us_per_q = (double)q / d.link_b_per_us;
	cr_assert_float_eq(in.offload_us_per_q, us_per_q, 1e-12);
	/* Idle window: the layer's forward and backward time at N. */
	const kiln_ir_layer *ly = &g->layers[set->layer];
	double w_us = 0;
	for (int32_t o = ly->op_begin; o < ly->op_end; o++)
		w_us += kiln_cost_op_time_us(g, &g->ops[o], d.n);
	double free_q = floor(w_us / us_per_q);
	cr_assert_eq(in.free_offload_q, free_q > 4096 ? 4096u : (uint32_t)free_q);
	cr_assert_gt(in.free_offload_q, 0);
}

/* moe.expert_act: e f_e N bytes (shipped tiny: 256 * 512 = 131,072, 189
 * quanta of 692 saved rounding down, 190 offloaded rounding up); its
 * recompute re-runs the weighted SwiGLU alone, whose traffic (e * (2 f_e +
 * f_e) + 4) * N (reading each row's fp32 probability too: 772 * 512 =
 * 395,264 bytes) runs at hbm_gbps (100 GB/s: 3.95264 us). Nothing shares
 * that op: three choices. */
Test(options, tiny_expert_act_choices)
{
	kiln_ir_graph *g = lower_file("examples/models/tiny.yaml");
	tiny_dims d = dims_of(g);
	const kiln_unit_set *set = tiny_moe(g);
	kiln_plan_instance in;
	cr_assert_eq(kiln_pass_options(g, set, d.n, &ADAPTIVE, arena, &in), 0);
	double bytes = d.e * d.fe * d.n, q = (double)in.quantum_bytes;
	uint32_t saved_q = (uint32_t)floor(bytes / q), off_q = (uint32_t)ceil(bytes / q);
	double rec_us = (d.e * 3 * d.fe + 4) * d.n / d.hbm_b_per_us;
	int32_t pos;
	const kiln_plan_group *gr = group_of(&in, unit_named(set, "moe.expert_act"), &pos);
	cr_assert_eq(gr->n_units, 1);
	cr_assert_eq(gr->n_choices, 3);
	bool seen[KILN_ACT_COUNT] = {false};
	for (int32_t c = 0; c < gr->n_choices; c++) {
		const kiln_plan_choice *ch = &gr->choices[c];
		seen[ch->actions[0]] = true;
		switch (ch->actions[0]) {
		case KILN_ACT_KEEP:
			cr_assert_eq(c, 0);
			cr_assert_eq(ch->saved_q, 0);
			cr_assert_eq(ch->offload_q, 0);
			cr_assert_eq(ch->recompute_us, 0.0);
			break;
		case KILN_ACT_RECOMPUTE:
			cr_assert_eq(ch->saved_q, saved_q);
			cr_assert_eq(ch->offload_q, 0);
			cr_assert_float_eq(ch->recompute_us, rec_us, 1e-9);
			break;
		case KILN_ACT_OFFLOAD:
			cr_assert_eq(ch->saved_q, saved_q);
			cr_assert_eq(ch->offload_q, off_q);
			/* The copy engine reads it out and writes it back: 2 * bytes
			 * of HBM traffic taken from compute. */
			cr_assert_float_eq(ch->recompute_us, 2 * bytes / d.hbm_b_per_us, 1e-9);
			break;
		}
	}
	cr_assert(seen[0] && seen[1] && seen[2]);
}

/* The adaptive instance never recomputes moe.expert_in (its closure runs the
 * dispatch all-to-all) nor ln1.in; with collective recompute allowed
 * (static baselines) expert_in recomputes, sharing moe.permute with
 * perm_idx and the dispatch with expert_probs (one group of three):
 * permute traffic e*Tr*h + e*N*h + 8N (int64 row map) + 4N (the rows'
 * fp32 probabilities; N = Tr*k at load 1) = 32,768 + 65,536 + 4,096 +
 * 2,048 bytes at hbm_gbps, plus the dispatch all-to-all of rows and
 * probabilities, (ep - 1)/ep * (e*h + 4)*N bytes at the EP group's link
 * (ep 4: 50,688 bytes at 50 GB/s). */
Test(options, tiny_collective_and_layer_input)
{
	kiln_ir_graph *g = lower_file("examples/models/tiny.yaml");
	tiny_dims d = dims_of(g);
	const double TINY_N = d.n;
	double want_us = (d.e * d.T * d.h + d.e * d.n * d.h + 8 * d.n + 4 * d.n) / d.hbm_b_per_us +
	                 (d.ep - 1) / d.ep * (d.e * d.h + 4) * d.n / d.ep_b_per_us;
	const kiln_unit_set *set = tiny_moe(g);
	int32_t ein = unit_named(set, "moe.expert_in"), idx = unit_named(set, "moe.perm_idx");
	int32_t in0 = unit_named(set, "ln1.in");
	kiln_plan_instance in;
	cr_assert_eq(kiln_pass_options(g, set, TINY_N, &ADAPTIVE, arena, &in), 0);
	for (int32_t i = 0; i < in.n_groups; i++)
		for (int32_t k = 0; k < in.groups[i].n_units; k++) {
			int32_t u = in.groups[i].units[k];
			if (u != ein && u != in0)
				continue;
			for (int32_t c = 0; c < in.groups[i].n_choices; c++)
				cr_assert_neq(in.groups[i].choices[c].actions[k],
				              KILN_ACT_RECOMPUTE);
		}

	kiln_option_flags stat = {.offload = true, .collective_recompute = true};
	cr_assert_eq(kiln_pass_options(g, set, TINY_N, &stat, arena, &in), 0);
	cr_assert_eq(kiln_cost_instance_check(&in), 0);
	int32_t pe, pi;
	const kiln_plan_group *gr = group_of(&in, ein, &pe);
	cr_assert_eq(group_of(&in, idx, &pi), gr);
	cr_assert_eq(group_of(&in, unit_named(set, "moe.expert_probs"), &pi), gr);
	cr_assert_eq(gr->n_units, 3);
	bool found = false;
	for (int32_t c = 0; c < gr->n_choices; c++) {
		const kiln_plan_choice *ch = &gr->choices[c];
		if (ch->actions[pe] != KILN_ACT_RECOMPUTE)
			continue;
		found = true;
		/* With or without perm_idx, permute runs once. */
		cr_assert_float_eq(ch->recompute_us, want_us, 1e-9, "%.9f", ch->recompute_us);
	}
	cr_assert(found);
	gr = group_of(&in, in0, &pe);
	for (int32_t c = 0; c < gr->n_choices; c++)
		cr_assert_neq(gr->choices[c].actions[pe], KILN_ACT_RECOMPUTE);
}

Test(options, no_offload_flag)
{
	kiln_ir_graph *g = lower_file("examples/models/tiny.yaml");
	const double TINY_N = dims_of(g).n;
	const kiln_unit_set *set = tiny_moe(g);
	kiln_option_flags f = {.offload = false, .collective_recompute = false};
	kiln_plan_instance in;
	cr_assert_eq(kiln_pass_options(g, set, TINY_N, &f, arena, &in), 0);
	cr_assert_eq(kiln_cost_instance_check(&in), 0);
	for (int32_t i = 0; i < in.n_groups; i++)
		for (int32_t c = 0; c < in.groups[i].n_choices; c++) {
			const kiln_plan_choice *ch = &in.groups[i].choices[c];
			cr_assert_eq(ch->offload_q, 0);
			for (int32_t k = 0; k < in.groups[i].n_units; k++)
				cr_assert_neq(ch->actions[k], KILN_ACT_OFFLOAD);
		}
	/* Only keep and recompute remain for expert_act. */
	int32_t pos;
	cr_assert_eq(group_of(&in, unit_named(set, "moe.expert_act"), &pos)->n_choices, 2);
}

/* Every shipped model, every set, r = 0.5, 1, 3, all flag combinations:
 * well-formed instances whose choices pass source tracking and whose totals
 * equal the per-unit numbers recomputed here (recompute time: the union of
 * closure ops once). */
Test(options, shipped_instances_well_formed)
{
	static const double rs[] = {0.5, 1.0, 3.0};
	for (size_t i = 0; i < KT_N_SHIPPED; i++) {
		kiln_ir_graph *g = lower_file(kt_shipped[i]);
		kiln_unit_set *sets;
		int32_t n;
		sets_of(g, &sets, &n);
		for (int32_t k = 0; k < n; k++) {
			const kiln_unit_set *set = &sets[k];
			const kiln_ir_layer *ly = &g->layers[set->layer];
			for (size_t ri = 0; ri < 3; ri++) {
				for (int fl = 0; fl < 4; fl++) {
					kiln_option_flags f = {.offload = fl & 1,
					                       .collective_recompute = fl & 2};
					double nn = rs[ri] * ly->n_balanced;
					kiln_plan_instance in;
					cr_assert_eq(kiln_pass_options(g, set, nn, &f, arena, &in),
					             0);
					cr_assert_eq(kiln_cost_instance_check(&in), 0,
					             "%s set %d r %g", kt_shipped[i], k, rs[ri]);
					double total = 0;
					for (int32_t u = 0; u < set->n_units; u++)
						total += kiln_lin_at(set->units[u].bytes, nn);
					cr_assert_eq(in.quantum_bytes,
					             total > 1024 ? (uint64_t)ceil(total / 1024)
					                          : 1);
					uint8_t act[KILN_PLAN_MAX_UNITS];
					for (int32_t gi = 0; gi < in.n_groups; gi++) {
						const kiln_plan_group *gr = &in.groups[gi];
						for (int32_t c = 0; c < gr->n_choices; c++) {
							const kiln_plan_choice *ch =
							    &gr->choices[c];
							memset(act, KILN_ACT_KEEP, sizeof act);
							uint32_t sq = 0, oq = 0;
							uint8_t ops[1024] = {0};
							double us = 0;
							for (int32_t j = 0; j < gr->n_units; j++) {
								const kiln_unit *un =
								    &set->units[gr->units[j]];
								double b =
								    kiln_lin_at(un->bytes, nn);
								act[gr->units[j]] = ch->actions[j];
								if (ch->actions[j] == KILN_ACT_KEEP)
									continue;
								sq += (uint32_t)floor(
								    b / (double)in.quantum_bytes);
								if (ch->actions[j] ==
								    KILN_ACT_OFFLOAD) {
									cr_assert(f.offload);
									oq += (uint32_t)ceil(
									    b / (double)in
									            .quantum_bytes);
									us += 2 * b /
									      (m_hbm_gbps(g) * 1e3);
									continue;
								}
								cr_assert_not(
								    un->flags &
								    KILN_UNIT_LAYER_INPUT);
								if (!f.collective_recompute)
									cr_assert_not(
									    un->flags &
									    KILN_UNIT_COLLECTIVE);
								for (int32_t o = 0;
								     o < un->n_closure; o++) {
									int32_t lo =
									    un->closure[o] -
									    ly->op_begin;
									if (!ops[lo])
										us += kiln_cost_op_time_us(
										    g,
										    &g->ops
										         [un->closure
										              [o]],
										    nn);
									ops[lo] = 1;
								}
							}
							cr_assert_eq(kiln_plan_valid(set, act), 0);
							cr_assert_eq(ch->saved_q, sq);
							cr_assert_eq(ch->offload_q, oq);
							cr_assert_float_eq(ch->recompute_us, us,
							                   1e-9 * (1 + us));
						}
					}
				}
			}
		}
	}
}

/* ---------------------------------------------------------------- brute force */

#define MAX_SAVED (KILN_PLAN_MAX_QUANTA + 1)

typedef struct brute {
	const kiln_ir_graph *g;
	const kiln_unit_set *set;
	const kiln_plan_instance *in;
	int32_t op_begin;
	double op_us[256];
	uint32_t sq[KILN_PLAN_MAX_UNITS], oq[KILN_PLAN_MAX_UNITS];
	double copy_us[KILN_PLAN_MAX_UNITS]; /* HBM time of an offload's two copies */
	uint8_t allowed[KILN_PLAN_MAX_UNITS];
	int32_t refs[256];
	double best[MAX_SAVED]; /* least exposed time saving exactly s quanta */
} brute;

static void brute_leaf(brute *b, uint32_t saved, uint32_t off, double rec)
{
	double exposed = rec + kiln_cost_copy_exposed_us(b->in, off);
	cr_assert_lt(saved, MAX_SAVED);
	if (exposed < b->best[saved])
		b->best[saved] = exposed;
}

/* best[s] becomes the least exposed time saving at least s quanta. */
static void suffix_min(double *best)
{
	for (int s = MAX_SAVED - 2; s >= 0; s--)
		if (best[s + 1] < best[s])
			best[s] = best[s + 1];
}

/* Every per-unit action vector (allowed actions only), recompute time as
 * the union of closure ops kept by reference counts. */
static void brute_units(brute *b, int32_t u, uint32_t saved, uint32_t off, double rec)
{
	if (u == b->set->n_units) {
		brute_leaf(b, saved, off, rec);
		return;
	}
	const kiln_unit *un = &b->set->units[u];
	brute_units(b, u + 1, saved, off, rec);
	if (b->allowed[u] & (1u << KILN_ACT_OFFLOAD))
		brute_units(b, u + 1, saved + b->sq[u], off + b->oq[u], rec + b->copy_us[u]);
	if (b->allowed[u] & (1u << KILN_ACT_RECOMPUTE)) {
		double add = 0;
		for (int32_t i = 0; i < un->n_closure; i++) {
			int32_t lo = un->closure[i] - b->op_begin;
			if (b->refs[lo]++ == 0)
				add += b->op_us[lo];
		}
		brute_units(b, u + 1, saved + b->sq[u], off, rec + add);
		for (int32_t i = 0; i < un->n_closure; i++)
			b->refs[un->closure[i] - b->op_begin]--;
	}
}

static void brute_groups(brute *b, int32_t gi, uint32_t saved, uint32_t off, double rec)
{
	if (gi == b->in->n_groups) {
		brute_leaf(b, saved, off, rec);
		return;
	}
	const kiln_plan_group *gr = &b->in->groups[gi];
	for (int32_t c = 0; c < gr->n_choices; c++)
		brute_groups(b, gi + 1, saved + gr->choices[c].saved_q,
		             off + gr->choices[c].offload_q, rec + gr->choices[c].recompute_us);
}

/* The least exposed time for each saving target is the same whether the
 * plan is searched over every per-unit action vector or over the pruned
 * group choices: pruning drops nothing optimal. Both with the copy link's
 * idle capacity and with none (every offloaded quantum exposed). */
static void check_pruning(const kiln_option_flags *f)
{
	kiln_ir_graph *g = lower_file("examples/models/tiny.yaml");
	kiln_unit_set *sets;
	int32_t n;
	sets_of(g, &sets, &n);
	for (int32_t k = 0; k < n; k++) {
		const kiln_unit_set *set = &sets[k];
		const kiln_ir_layer *ly = &g->layers[set->layer];
		double nn = 1.5 * ly->n_balanced;
		kiln_plan_instance in;
		cr_assert_eq(kiln_pass_options(g, set, nn, f, arena, &in), 0);
		static brute b;
		memset(&b, 0, sizeof b);
		b.g = g;
		b.set = set;
		b.in = &in;
		b.op_begin = ly->op_begin;
		cr_assert_leq(ly->op_end - ly->op_begin, 256);
		for (int32_t o = ly->op_begin; o < ly->op_end; o++)
			b.op_us[o - ly->op_begin] = kiln_cost_op_time_us(g, &g->ops[o], nn);
		uint32_t total = 0;
		for (int32_t u = 0; u < set->n_units; u++) {
			const kiln_unit *un = &set->units[u];
			double by = kiln_lin_at(un->bytes, nn);
			b.sq[u] = (uint32_t)floor(by / (double)in.quantum_bytes);
			b.oq[u] = (uint32_t)ceil(by / (double)in.quantum_bytes);
			b.copy_us[u] = 2 * by / (m_hbm_gbps(g) * 1e3);
			total += b.sq[u];
			if (f->offload && by > 0)
				b.allowed[u] |= 1u << KILN_ACT_OFFLOAD;
			if (!(un->flags & KILN_UNIT_LAYER_INPUT) &&
			    (f->collective_recompute || !(un->flags & KILN_UNIT_COLLECTIVE)))
				b.allowed[u] |= 1u << KILN_ACT_RECOMPUTE;
		}
		for (int free_link = 0; free_link < 2; free_link++) {
			kiln_plan_instance var = in;
			if (!free_link)
				var.free_offload_q = 0;
			b.in = &var;
			static double by_units[MAX_SAVED];
			for (int t = 0; t < MAX_SAVED; t++)
				b.best[t] = INFINITY;
			brute_units(&b, 0, 0, 0, 0);
			suffix_min(b.best);
			memcpy(by_units, b.best, sizeof by_units);
			for (int t = 0; t < MAX_SAVED; t++)
				b.best[t] = INFINITY;
			brute_groups(&b, 0, 0, 0, 0);
			suffix_min(b.best);
			cr_assert(isfinite(by_units[total]));
			for (uint32_t t = 0; t < MAX_SAVED; t++) {
				if (isinf(by_units[t])) {
					cr_assert(isinf(b.best[t]));
					continue;
				}
				cr_assert_float_eq(b.best[t], by_units[t], 1e-9 * (1 + by_units[t]),
				                   "set %d target %u: groups %g, units %g", k, t,
				                   b.best[t], by_units[t]);
			}
		}
	}
}

Test(options, pruning_keeps_optimum_adaptive)
{
	check_pruning(&ADAPTIVE);
}

Test(options, pruning_keeps_optimum_static)
{
	kiln_option_flags f = {.offload = true, .collective_recompute = true};
	check_pruning(&f);
}

/* ---------------------------------------------------------------- byte accounting */

/* At N = N_bal: expert_act recomputed (e f_e N, no workspace), expert_up
 * offloaded (e 2 f_e N), moe.probs recomputed (4 Tr E, with its fp32
 * logits, as many bytes, as workspace), the rest kept. */
Test(options, bytes_at_hand)
{
	kiln_ir_graph *g = lower_file("examples/models/tiny.yaml");
	tiny_dims d = dims_of(g);
	const double TINY_N = d.n;
	double act_b = d.e * d.fe * d.n, up_b = d.e * 2 * d.fe * d.n, probs_b = 4 * d.T * d.E;
	const kiln_unit_set *set = tiny_moe(g);
	double total = kiln_lin_at(kiln_cost_layer_activation(g, set->layer), d.n);
	uint8_t act[KILN_PLAN_MAX_UNITS] = {0};
	act[unit_named(set, "moe.expert_act")] = KILN_ACT_RECOMPUTE;
	act[unit_named(set, "moe.expert_up")] = KILN_ACT_OFFLOAD;
	act[unit_named(set, "moe.probs")] = KILN_ACT_RECOMPUTE;
	kiln_plan_bytes pb;
	kiln_plan_bytes_at(set, act, TINY_N, &pb);
	cr_assert_float_eq(pb.saved, act_b + up_b + probs_b, 1e-6);
	cr_assert_float_eq(pb.resident, total - pb.saved, 1e-6);
	cr_assert_float_eq(pb.offloaded, up_b, 1e-6);
	cr_assert_float_eq(pb.transient, act_b + up_b + probs_b + probs_b, 1e-6);
	cr_assert_eq(kiln_plan_valid(set, act), 0);
	/* The layer's input cannot be recomputed. */
	act[unit_named(set, "ln1.in")] = KILN_ACT_RECOMPUTE;
	cr_assert_eq(kiln_plan_valid(set, act), -1);
	act[unit_named(set, "ln1.in")] = KILN_ACT_COUNT;
	cr_assert_eq(kiln_plan_valid(set, act), -1);
}

/* Source tracking in general: a recompute whose source is not available
 * (here: a cycle of recomputes, which no closure model produces) fails. */
Test(options, valid_rejects_recompute_cycle)
{
	int32_t src0 = 1, src1 = 0;
	kiln_unit units[3] = {
	    {.name = "a", .sources = &src0, .n_sources = 1},
	    {.name = "b", .sources = &src1, .n_sources = 1},
	    {.name = "c", .flags = KILN_UNIT_LAYER_INPUT},
	};
	kiln_unit_set set = {.units = units, .n_units = 3};
	uint8_t act[3] = {KILN_ACT_RECOMPUTE, KILN_ACT_RECOMPUTE, KILN_ACT_KEEP};
	cr_assert_eq(kiln_plan_valid(&set, act), -1);
	act[1] = KILN_ACT_OFFLOAD;
	cr_assert_eq(kiln_plan_valid(&set, act), 0);
	act[1] = KILN_ACT_KEEP;
	act[0] = KILN_ACT_KEEP;
	act[2] = KILN_ACT_OFFLOAD;
	cr_assert_eq(kiln_plan_valid(&set, act), 0);
	act[2] = KILN_ACT_RECOMPUTE;
	cr_assert_eq(kiln_plan_valid(&set, act), -1);
}

/* kiln_plan_actions maps group choices back to units. */
Test(options, plan_actions_maps_units)
{
	kiln_ir_graph *g = lower_file("examples/models/tiny.yaml");
	const double TINY_N = dims_of(g).n;
	const kiln_unit_set *set = tiny_moe(g);
	kiln_plan_instance in;
	cr_assert_eq(kiln_pass_options(g, set, TINY_N, &ADAPTIVE, arena, &in), 0);
	int32_t choice[KILN_PLAN_MAX_UNITS];
	for (int32_t i = 0; i < in.n_groups; i++)
		choice[i] = in.groups[i].n_choices - 1;
	kiln_plan_point p = {.choice = choice};
	kiln_cost_plan_eval(&in, choice, &p);
	uint8_t act[KILN_PLAN_MAX_UNITS];
	memset(act, 0xff, sizeof act);
	kiln_plan_actions(&in, &p, act);
	uint32_t sq = 0;
	for (int32_t i = 0; i < in.n_groups; i++) {
		const kiln_plan_group *gr = &in.groups[i];
		sq += gr->choices[choice[i]].saved_q;
		for (int32_t k = 0; k < gr->n_units; k++)
			cr_assert_eq(act[gr->units[k]], gr->choices[choice[i]].actions[k]);
	}
	for (int32_t u = 0; u < set->n_units; u++)
		cr_assert_lt(act[u], KILN_ACT_COUNT);
	cr_assert_eq(p.saved_q, sq);
	cr_assert_eq(p.choice, choice);
}

/* ---------------------------------------------------------------- groups over the limit */

/* One op writing eight saved outputs: one component of eight units, split
 * into groups of six and two; recomputing all of both groups counts the
 * shared op twice (the documented conservative double count). */
Test(options, oversized_group_split)
{
	kiln_model *m = NULL;
	cr_assert_eq(
	    kiln_frontend_load_file(kt_src("examples/models/tiny.yaml"), arena, stderr, &m), 0);
	kiln_ir_builder *b = kiln_ir_builder_new(arena, m);
	cr_assert_not_null(b);
	cr_assert_eq(kiln_ir_builder_stage(b), 0);
	cr_assert_geq(kiln_ir_builder_layer(b, KILN_LAYER_DENSE, 0, 0, 0), 0);
	int32_t x = kiln_ir_builder_tensor(b, "x", (kiln_lin){1000, 0}, KILN_T_SAVED, -1);
	int32_t outs[8];
	for (int i = 0; i < 8; i++) {
		char name[16];
		snprintf(name, sizeof name, "o%d", i);
		outs[i] = kiln_ir_builder_tensor(b, name, (kiln_lin){1000, 0}, KILN_T_SAVED, -1);
	}
	kiln_ir_op in_op = {
	    .kind = KILN_OP_INPUT, .forward = -1, .name = "input", .outputs = &x, .n_outputs = 1};
	cr_assert_geq(kiln_ir_builder_op(b, &in_op), 0);
	/* 1e6 bytes at 100 GB/s: 10 us. */
	kiln_ir_op split = {.kind = KILN_OP_FFN_ACT,
	                    .forward = -1,
	                    .name = "split",
	                    .traffic = {1e6, 0},
	                    .inputs = &x,
	                    .n_inputs = 1,
	                    .outputs = outs,
	                    .n_outputs = 8};
	cr_assert_geq(kiln_ir_builder_op(b, &split), 0);
	kiln_ir_graph *g = kiln_ir_builder_finish(b);
	cr_assert_not_null(g);
	kiln_unit_set *sets;
	int32_t n;
	sets_of(g, &sets, &n);
	cr_assert_eq(n, 1);
	cr_assert_eq(sets[0].n_units, 9);
	kiln_option_flags f = {.offload = false, .collective_recompute = false};
	kiln_plan_instance in;
	cr_assert_eq(kiln_pass_options(g, &sets[0], 0, &f, arena, &in), 0);
	cr_assert_eq(kiln_cost_instance_check(&in), 0);
	/* x alone; o0..o5; o6, o7. */
	cr_assert_eq(in.n_groups, 3);
	cr_assert_eq(in.groups[0].n_units, 1);
	cr_assert_eq(in.groups[1].n_units, 6);
	cr_assert_eq(in.groups[2].n_units, 2);
	/* 9,000 bytes: q = ceil(9000 / 1024) = 9; 111 quanta per unit. Without
	 * offload, recomputing all of a group dominates any part of it. */
	cr_assert_eq(in.quantum_bytes, 9);
	cr_assert_eq(in.groups[1].n_choices, 2);
	cr_assert_eq(in.groups[1].choices[1].saved_q, 6 * 111);
	cr_assert_float_eq(in.groups[1].choices[1].recompute_us, 10.0, 1e-9);
	cr_assert_eq(in.groups[2].n_choices, 2);
	cr_assert_eq(in.groups[2].choices[1].saved_q, 2 * 111);
	cr_assert_float_eq(in.groups[2].choices[1].recompute_us, 10.0, 1e-9);
}

/* A recompute and an offload priced by the one time model (docs/cost-model.md,
 * "HBM time"): tiny's hardware given h100-sxm's 5 us kernel floor; one
 * memory-bound op (1e6 bytes at 100 GB/s: 10 us) makes one 1,000-byte
 * saved tensor y from the layer's input x. Recomputing y re-runs the op:
 * 10 us of HBM time plus the floor of its one kernel, 15 us. Offloading y
 * costs the copy engine's HBM share, both copies of its 1,000 bytes: 2,000
 * bytes at 1e5 bytes per us, 0.02 us, and no floor (a transfer, not a
 * kernel). Without the floor the recompute is the HBM time alone. */
Test(options, recompute_pays_the_kernel_floor_an_offload_does_not)
{
	for (int with_floor = 0; with_floor < 2; with_floor++) {
		kiln_model *m = NULL;
		cr_assert_eq(
		    kiln_frontend_load_file(kt_src("examples/models/tiny.yaml"), arena, stderr, &m),
		    0);
		m->hw.time_kernel_floor_us = with_floor ? 5 : 0;
		kiln_ir_builder *b = kiln_ir_builder_new(arena, m);
		cr_assert_not_null(b);
		cr_assert_eq(kiln_ir_builder_stage(b), 0);
		cr_assert_geq(kiln_ir_builder_layer(b, KILN_LAYER_DENSE, 0, 0, 0), 0);
		int32_t x = kiln_ir_builder_tensor(b, "x", (kiln_lin){1000, 0}, KILN_T_SAVED, -1);
		int32_t y = kiln_ir_builder_tensor(b, "y", (kiln_lin){1000, 0}, KILN_T_SAVED, -1);
		kiln_ir_op in_op = {.kind = KILN_OP_INPUT,
		                    .forward = -1,
		                    .name = "input",
		                    .outputs = &x,
		                    .n_outputs = 1};
		cr_assert_geq(kiln_ir_builder_op(b, &in_op), 0);
		kiln_ir_op act = {.kind = KILN_OP_FFN_ACT,
		                  .forward = -1,
		                  .name = "act",
		                  .traffic = {1e6, 0},
		                  .inputs = &x,
		                  .n_inputs = 1,
		                  .outputs = &y,
		                  .n_outputs = 1};
		cr_assert_geq(kiln_ir_builder_op(b, &act), 0);
		kiln_ir_graph *g = kiln_ir_builder_finish(b);
		cr_assert_not_null(g);
		kiln_unit_set *sets;
		int32_t n;
		sets_of(g, &sets, &n);
		cr_assert_eq(n, 1);
		kiln_plan_instance in;
		cr_assert_eq(kiln_pass_options(g, &sets[0], 0, &ADAPTIVE, arena, &in), 0);
		cr_assert_eq(kiln_cost_instance_check(&in), 0);
		double rec = -1, off = -1;
		for (int32_t gi = 0; gi < in.n_groups; gi++) {
			const kiln_plan_group *gr = &in.groups[gi];
			for (int32_t k = 0; k < gr->n_units; k++) {
				if (strcmp(sets[0].units[gr->units[k]].name, "y") != 0)
					continue;
				cr_assert_eq(gr->n_units, 1);
				for (int32_t c = 0; c < gr->n_choices; c++) {
					if (gr->choices[c].actions[0] == KILN_ACT_RECOMPUTE)
						rec = gr->choices[c].recompute_us;
					if (gr->choices[c].actions[0] == KILN_ACT_OFFLOAD)
						off = gr->choices[c].recompute_us;
				}
			}
		}
		cr_expect_float_eq(rec, with_floor ? 15.0 : 10.0, 1e-9, "recompute %g us", rec);
		cr_expect_float_eq(off, 0.02, 1e-12, "offload %g us", off);
	}
}

/* Bad arguments: too many units, a negative or non-finite load. */
Test(options, rejects_bad_arguments)
{
	kiln_ir_graph *g = lower_file("examples/models/tiny.yaml");
	const double TINY_N = dims_of(g).n;
	const kiln_unit_set *set = tiny_moe(g);
	kiln_plan_instance in;
	cr_assert_eq(kiln_pass_options(g, set, -1.0, &ADAPTIVE, arena, &in), -1);
	cr_assert_eq(kiln_pass_options(g, set, NAN, &ADAPTIVE, arena, &in), -1);
	kiln_unit_set big = *set;
	big.n_units = KILN_PLAN_MAX_UNITS + 1;
	cr_assert_eq(kiln_pass_options(g, &big, TINY_N, &ADAPTIVE, arena, &in), -1);
}

/* ---------------------------------------------------------------- plan_eval.c */

/* Two groups by hand: exposed copy is max(0, 7 - 5) * 2 us = 4 us. */
Test(options, plan_eval_and_copy_exposed)
{
	kiln_plan_choice c0[2] = {{.actions = {0}},
	                          {.actions = {KILN_ACT_OFFLOAD}, .saved_q = 3, .offload_q = 4}};
	kiln_plan_choice c1[2] = {{.actions = {0, 0}},
	                          {.actions = {KILN_ACT_OFFLOAD, KILN_ACT_RECOMPUTE},
	                           .saved_q = 5,
	                           .offload_q = 3,
	                           .recompute_us = 1.5}};
	kiln_plan_group gr[2] = {{.units = {0}, .n_units = 1, .choices = c0, .n_choices = 2},
	                         {.units = {2, 1}, .n_units = 2, .choices = c1, .n_choices = 2}};
	kiln_plan_instance in = {.n_units = 3,
	                         .groups = gr,
	                         .n_groups = 2,
	                         .quantum_bytes = 64,
	                         .free_offload_q = 5,
	                         .offload_us_per_q = 2.0};
	cr_assert_eq(kiln_cost_instance_check(&in), 0);
	cr_assert_eq(kiln_cost_copy_exposed_us(&in, 5), 0.0);
	cr_assert_eq(kiln_cost_copy_exposed_us(&in, 0), 0.0);
	cr_assert_eq(kiln_cost_copy_exposed_us(&in, 7), 4.0);
	int32_t choice[2] = {1, 1};
	kiln_plan_point p = {.choice = NULL};
	kiln_cost_plan_eval(&in, choice, &p);
	cr_assert_eq(p.saved_q, 8);
	cr_assert_eq(p.offload_q, 7);
	cr_assert_eq(p.recompute_us, 1.5);
	cr_assert_eq(p.exposed_us, 5.5);
	cr_assert_null(p.choice);
	uint8_t act[3];
	p.choice = choice;
	kiln_plan_actions(&in, &p, act);
	cr_assert_eq(act[0], KILN_ACT_OFFLOAD);
	cr_assert_eq(act[1], KILN_ACT_RECOMPUTE);
	cr_assert_eq(act[2], KILN_ACT_OFFLOAD);
}

Test(options, instance_check_rejects_malformed)
{
	kiln_plan_choice c[2] = {
	    {.actions = {0, 0}},
	    {.actions = {KILN_ACT_RECOMPUTE, 0}, .saved_q = 1, .recompute_us = 1.0}};
	kiln_plan_group gr[2] = {{.units = {0}, .n_units = 1, .choices = c, .n_choices = 2},
	                         {.units = {1}, .n_units = 1, .choices = c, .n_choices = 1}};
	kiln_plan_instance good = {.n_units = 2, .groups = gr, .n_groups = 2, .quantum_bytes = 1};
	cr_assert_eq(kiln_cost_instance_check(&good), 0);
	cr_assert_eq(kiln_cost_instance_check(NULL), -1);

	kiln_plan_instance in = good;
	in.quantum_bytes = 0;
	cr_assert_eq(kiln_cost_instance_check(&in), -1);
	in = good;
	in.n_units = 3; /* unit 2 in no group */
	cr_assert_eq(kiln_cost_instance_check(&in), -1);
	in = good;
	in.n_units = KILN_PLAN_MAX_UNITS + 1;
	cr_assert_eq(kiln_cost_instance_check(&in), -1);
	in = good;
	in.free_offload_q = KILN_PLAN_MAX_QUANTA + 1;
	cr_assert_eq(kiln_cost_instance_check(&in), -1);
	in = good;
	in.offload_us_per_q = NAN;
	cr_assert_eq(kiln_cost_instance_check(&in), -1);

	kiln_plan_group bad[2];
	memcpy(bad, gr, sizeof bad);
	bad[1].units[0] = 0; /* unit 0 twice */
	in = good;
	in.groups = bad;
	cr_assert_eq(kiln_cost_instance_check(&in), -1);
	memcpy(bad, gr, sizeof bad);
	bad[1].units[0] = 5; /* out of range */
	cr_assert_eq(kiln_cost_instance_check(&in), -1);
	memcpy(bad, gr, sizeof bad);
	bad[1].n_units = KILN_PLAN_MAX_GROUP + 1;
	cr_assert_eq(kiln_cost_instance_check(&in), -1);
	memcpy(bad, gr, sizeof bad);
	bad[1].n_choices = 0;
	cr_assert_eq(kiln_cost_instance_check(&in), -1);

	/* choices[0] must keep everything at zero cost. */
	kiln_plan_choice first[1] = {{.actions = {KILN_ACT_OFFLOAD}, .saved_q = 1, .offload_q = 1}};
	memcpy(bad, gr, sizeof bad);
	bad[1].choices = first;
	cr_assert_eq(kiln_cost_instance_check(&in), -1);
	kiln_plan_choice bad_act[1] = {{.actions = {0, 7}}};
	bad[1].choices = bad_act;
	cr_assert_eq(kiln_cost_instance_check(&in), -1);
	kiln_plan_choice many[2] = {
	    {.actions = {0}}, {.actions = {KILN_ACT_RECOMPUTE}, .saved_q = KILN_PLAN_MAX_QUANTA}};
	kiln_plan_group two[2] = {{.units = {0}, .n_units = 1, .choices = many, .n_choices = 2},
	                          {.units = {1}, .n_units = 1, .choices = many, .n_choices = 2}};
	in.groups = two;
	/* 2 * 4096 quanta saved in all: over the limit. */
	cr_assert_eq(kiln_cost_instance_check(&in), -1);
}

/* tiny's MoE layer at load 1, by hand (h 64, T = s*b = 128*2 = 256 tokens,
 * 4 heads of 16, 2 kv heads, flash, no dropout, 8 experts, top-2, expert
 * width 128, SwiGLU, bf16, tp 1, so N = T * top_k = 512 rows; the memory
 * options' defaults: fused QKV, saved rstd, probabilities in the weighted
 * SwiGLU, unfused permutation):
 *   constant: ln1.in, attn.qkv_in, attn.out, ln2.in, moe.in at 2*256*64 =
 *   32,768 each (5 x = 163,840); attn.qkv 2*256*(4*16 + 2*2*16) = 65,536;
 *   attn.lse 4*4*256 = 4,096; moe.probs 4*256*8 = 8,192; ln1.rstd and
 *   ln2.rstd 4*256 = 1,024 each: 243,712 bytes.
 *   per row: perm_idx 8 (int64) + expert_in 128 + expert_probs 4 +
 *   expert_up 512 + expert_act 256 = 908 bytes; x 512 = 464,896.
 *   total 243,712 + 464,896 = 708,608 bytes; quantum ceil(708,608 / 1,024) = 692. */
Test(options, tiny_quantum_by_hand)
{
	kiln_ir_graph *g = lower_file("examples/models/tiny.yaml");
	const kiln_unit_set *set = tiny_moe(g);
	kiln_plan_instance in;
	cr_assert_eq(kiln_pass_options(g, set, 512.0, &ADAPTIVE, arena, &in), 0);
	cr_assert_eq(g->layers[set->layer].n_balanced, 512.0);
	cr_assert_eq(in.quantum_bytes, 692);
	double total = 0;
	for (int32_t u = 0; u < set->n_units; u++)
		total += kiln_lin_at(set->units[u].bytes, 512.0);
	cr_assert_eq(total, 708608.0);
	/* Copy rate: 692 bytes at min(10, 10) GB/s = 0.0692 us per quantum. */
	cr_assert_float_eq(in.offload_us_per_q, 0.0692, 1e-12);
}
