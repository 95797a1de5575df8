/* costmodel/milp.c: the planning instance as an exact MILP, solved by GLPK.
 *
 * The one file that includes <glpk.h> (GLPK is GPL-3: compiler only). The
 * model (docs/cost-model.md, "Solvers"): binaries x_{g,c}, one per group;
 * sum saved_q x >= target; y >= 0, y >= sum offload_q x - K; minimise
 * sum recompute_us x + rate * y. Ties are broken by a second solve that
 * keeps the cost within the frontier's tolerance and maximises the saving.
 *
 * GLPK aborts the process on misuse even with its terminal off, so every
 * call runs under an error hook that longjmps back here; GLPK's environment
 * is then freed whole (glp_free_env), which also frees the problem. The
 * environment is freed after every solve as well, so nothing of GLPK's
 * outlives a call. Not thread-safe: GLPK's environment is per thread, but the
 * hooks installed here assume one solve at a time per thread.
 */
#include <glpk.h>
#include <math.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "costmodel/costmodel.h"

#define MILP_TIME_LIMIT_MS 10000
#define MILP_MAX_COLUMNS (1 << 24)

/* Same rule as knapsack.c: costs this close are one level. */
static double tie_tol(double cost_us)
{
	return 1e-9 * (fabs(cost_us) > 1.0 ? fabs(cost_us) : 1.0);
}

static void milp_on_error(void *info)
{
	longjmp(*(jmp_buf *)info, 1);
}

static int milp_on_term(void *info, const char *s)
{
	(void)info;
	(void)s;
	return 1; /* swallow every line GLPK would print */
}

/* Buffers sized once before the error guard, so a longjmp leaks nothing. */
typedef struct milp_buf {
	int *ind;       /* 1-based GLPK row indices, n_cols + 1 */
	double *val;    /* n_cols + 1 */
	int32_t *first; /* first column of each group */
	int n_cols;     /* every x plus y */
} milp_buf;

/* Reads the incumbent's choice per group; -1 when it is not one per group. */
static int milp_read(const kiln_plan_instance *in, glp_prob *P, const milp_buf *b, int32_t *choice)
{
	for (int32_t g = 0; g < in->n_groups; g++) {
		int32_t pick = -1;
		for (int32_t c = 0; c < in->groups[g].n_choices; c++) {
			if (glp_mip_col_val(P, b->first[g] + c) > 0.5) {
				if (pick >= 0)
					return -1;
				pick = c;
			}
		}
		if (pick < 0)
			return -1;
		choice[g] = pick;
	}
	return 0;
}

/* One glp_intopt: 0 with an incumbent, 1 proven infeasible, -1 otherwise. */
static int milp_intopt(glp_prob *P, int cuts)
{
	glp_iocp parm;
	glp_init_iocp(&parm);
	parm.msg_lev = GLP_MSG_OFF;
	parm.presolve = GLP_ON;
	parm.tm_lim = MILP_TIME_LIMIT_MS;
	parm.mip_gap = 0.0;
	/* Without cuts GLPK's branch and bound stalls on 25-unit instances
	 * (10 s limits hit, suboptimal incumbents); with them it takes ms.
	 * Cover cuts are left off: on some instances GLPK 5.0's cover cut
	 * generator calls glp_add_cols with 0 columns and errors out. */
	if (cuts) {
		parm.mir_cuts = GLP_ON;
		parm.gmi_cuts = GLP_ON;
		parm.clq_cuts = GLP_ON;
	}
	int ret = glp_intopt(P, &parm);
	if (ret == GLP_ENOPFS)
		return 1;
	/* A time-out, even with an incumbent, proves nothing: the MILP exists to
	 * check the DP, so an unproven answer is a failure, not an optimum. */
	if (ret != 0)
		return -1;
	int st = glp_mip_status(P);
	if (st == GLP_OPT)
		return 0;
	if (st == GLP_NOFEAS)
		return 1;
	return -1;
}

/* Builds and solves the model (both passes); runs under the error guard. */
static int milp_run(const kiln_plan_instance *in, uint32_t target, uint32_t s_cap, int cuts,
                    const milp_buf *b, int32_t *choice)
{
	glp_prob *P = glp_create_prob();
	glp_set_obj_dir(P, GLP_MIN);
	const int y = b->n_cols;
	glp_add_cols(P, b->n_cols);
	glp_add_rows(P, in->n_groups + 2);
	for (int32_t g = 0; g < in->n_groups; g++) {
		const kiln_plan_group *gr = &in->groups[g];
		int n = 0;
		for (int32_t c = 0; c < gr->n_choices; c++) {
			int j = b->first[g] + c;
			glp_set_col_kind(P, j, GLP_BV);
			glp_set_obj_coef(P, j, gr->choices[c].recompute_us);
			b->ind[++n] = j;
			b->val[n] = 1.0;
		}
		glp_set_mat_row(P, g + 1, n, b->ind, b->val);
		glp_set_row_bnds(P, g + 1, GLP_FX, 1.0, 1.0);
	}
	glp_set_col_bnds(P, y, GLP_LO, 0.0, 0.0);
	glp_set_obj_coef(P, y, in->offload_us_per_q);

	const int row_save = in->n_groups + 1, row_copy = in->n_groups + 2;
	int ns = 0, no = 0;
	for (int32_t g = 0; g < in->n_groups; g++) {
		const kiln_plan_group *gr = &in->groups[g];
		for (int32_t c = 0; c < gr->n_choices; c++)
			if (gr->choices[c].saved_q > 0) {
				b->ind[++ns] = b->first[g] + c;
				b->val[ns] = (double)gr->choices[c].saved_q;
			}
	}
	glp_set_mat_row(P, row_save, ns, b->ind, b->val);
	glp_set_row_bnds(P, row_save, GLP_LO, (double)target, 0.0);
	for (int32_t g = 0; g < in->n_groups; g++) {
		const kiln_plan_group *gr = &in->groups[g];
		for (int32_t c = 0; c < gr->n_choices; c++)
			if (gr->choices[c].offload_q > 0) {
				b->ind[++no] = b->first[g] + c;
				b->val[no] = (double)gr->choices[c].offload_q;
			}
	}
	b->ind[++no] = y;
	b->val[no] = -1.0;
	glp_set_mat_row(P, row_copy, no, b->ind, b->val);
	glp_set_row_bnds(P, row_copy, GLP_UP, 0.0, (double)in->free_offload_q);

	int rc = milp_intopt(P, cuts);
	if (rc == 0)
		rc = milp_read(in, P, b, choice);
	if (rc != 0) {
		glp_delete_prob(P);
		return rc;
	}

	/* Second pass: the largest saving within the optimal cost level. */
	kiln_plan_point first;
	kiln_cost_plan_eval(in, choice, &first);
	if (first.saved_q < s_cap) {
		int row_cost = glp_add_rows(P, 1);
		int n = 0;
		for (int32_t g = 0; g < in->n_groups; g++) {
			const kiln_plan_group *gr = &in->groups[g];
			for (int32_t c = 0; c < gr->n_choices; c++) {
				int j = b->first[g] + c;
				glp_set_obj_coef(P, j, (double)gr->choices[c].saved_q);
				if (gr->choices[c].recompute_us > 0.0) {
					b->ind[++n] = j;
					b->val[n] = gr->choices[c].recompute_us;
				}
			}
		}
		if (in->offload_us_per_q > 0.0) {
			b->ind[++n] = y;
			b->val[n] = in->offload_us_per_q;
		}
		glp_set_obj_coef(P, y, 0.0);
		glp_set_obj_dir(P, GLP_MAX);
		glp_set_mat_row(P, row_cost, n, b->ind, b->val);
		glp_set_row_bnds(P, row_cost, GLP_UP, 0.0,
		                 first.exposed_us + tie_tol(first.exposed_us));
		int32_t *second = choice + in->n_groups; /* scratch half, see caller */
		if (milp_intopt(P, cuts) == 0 && milp_read(in, P, b, second) == 0) {
			kiln_plan_point p;
			kiln_cost_plan_eval(in, second, &p);
			if (p.saved_q > first.saved_q &&
			    p.exposed_us <= first.exposed_us + tie_tol(first.exposed_us))
				memcpy(choice, second, (size_t)in->n_groups * sizeof(int32_t));
		}
	}
	glp_delete_prob(P);
	return 0;
}

/* Ownership: in is borrowed; out->choice lives in a. Time: GLPK's branch and
 * bound, at most two solves of MILP_TIME_LIMIT_MS each; an instance whose
 * first solve times out without an incumbent returns -1. */
int kiln_cost_solve_milp(const kiln_plan_instance *in, uint32_t min_saved_q, kiln_arena *a,
                         kiln_plan_point *out)
{
	if (!out || kiln_cost_instance_check(in) != 0)
		return -1;
	uint64_t cols = 1, s_cap = 0;
	for (int32_t g = 0; g < in->n_groups; g++) {
		const kiln_plan_group *gr = &in->groups[g];
		cols += (uint64_t)gr->n_choices;
		uint32_t ms = 0;
		for (int32_t c = 0; c < gr->n_choices; c++)
			if (gr->choices[c].saved_q > ms)
				ms = gr->choices[c].saved_q;
		s_cap += ms;
	}
	if (cols > MILP_MAX_COLUMNS)
		return -1;
	if (min_saved_q > s_cap)
		return 1;
	size_t ng = in->n_groups > 0 ? (size_t)in->n_groups : 1;
	int32_t *result = kiln_arena_alloc(a, ng * sizeof(int32_t));
	if (!result)
		return -1;
	if (in->n_groups == 0) {
		kiln_cost_plan_eval(in, result, out);
		out->choice = result;
		return 0;
	}
	milp_buf b;
	b.n_cols = (int)cols;
	b.ind = malloc(((size_t)cols + 1) * sizeof(int));
	b.val = malloc(((size_t)cols + 1) * sizeof(double));
	b.first = malloc(ng * sizeof(int32_t));
	int32_t *choice = malloc(2 * ng * sizeof(int32_t));
	if (!b.ind || !b.val || !b.first || !choice) {
		free(b.ind);
		free(b.val);
		free(b.first);
		free(choice);
		return -1;
	}
	int j = 1;
	for (int32_t g = 0; g < in->n_groups; g++) {
		b.first[g] = j;
		j += in->groups[g].n_choices;
	}

	/* A GLPK error with cuts on is retried once with cuts off, in case
	 * another of GLPK's cut generators misbehaves on some instance. */
	int rc = -1;
	for (int cuts = 1; cuts >= 0 && rc < 0; cuts--) {
		jmp_buf guard;
		if (setjmp(guard) == 0) {
			glp_error_hook(milp_on_error, &guard);
			glp_term_hook(milp_on_term, NULL);
			glp_term_out(GLP_OFF);
			rc = milp_run(in, min_saved_q, (uint32_t)s_cap, cuts, &b, choice);
			glp_free_env();
		} else {
			/* GLPK longjmp'd out of an error: its state is unusable until
			 * the environment is freed, which also frees the problem. */
			glp_free_env();
			rc = -1;
		}
	}
	if (rc == 0) {
		memcpy(result, choice, (size_t)in->n_groups * sizeof(int32_t));
		kiln_cost_plan_eval(in, result, out);
		out->choice = result;
	}
	free(b.ind);
	free(b.val);
	free(b.first);
	free(choice);
	return rc;
}

/* Ownership: in is borrowed; out->points and their choices live in a (the
 * arena also keeps the choices of solves superseded at one cost level).
 * Time: one or two MILP solves per frontier point, at most S + 1 points. */
int kiln_cost_frontier_milp(const kiln_plan_instance *in, kiln_arena *a, kiln_frontier *out)
{
	return kiln_cost_frontier_milp_metered(in, NULL, a, out);
}

int kiln_cost_frontier_milp_metered(const kiln_plan_instance *in, kiln_progress *meter,
                                    kiln_arena *a, kiln_frontier *out)
{
	if (!out || kiln_cost_instance_check(in) != 0)
		return -1;
	out->points = NULL;
	out->n_points = 0;
	uint64_t s_cap = 0;
	for (int32_t g = 0; g < in->n_groups; g++) {
		uint32_t ms = 0;
		for (int32_t c = 0; c < in->groups[g].n_choices; c++)
			if (in->groups[g].choices[c].saved_q > ms)
				ms = in->groups[g].choices[c].saved_q;
		s_cap += ms;
	}
	kiln_plan_point *tmp = malloc(((size_t)s_cap + 1) * sizeof(kiln_plan_point));
	if (!tmp)
		return -1;
	size_t ng = in->n_groups > 0 ? (size_t)in->n_groups : 1;
	int32_t *keep = kiln_arena_alloc(a, ng * sizeof(int32_t));
	int rc = -1;
	if (!keep)
		goto done;
	kiln_cost_plan_eval(in, keep, &tmp[0]);
	tmp[0].choice = keep;
	int32_t n = 1;
	uint32_t target = 0;
	for (;;) {
		kiln_plan_point p;
		int r = kiln_cost_solve_milp(in, target, a, &p);
		kiln_progress_add_aux(meter, 1);
		if (r == 1)
			break;
		if (r != 0)
			goto done;
		if (p.saved_q < target)
			goto done; /* GLPK broke its own constraint: not a usable answer */
		if (p.saved_q > 0) {
			/* Successive targets give nondecreasing costs: one at the
			 * previous level supersedes it with its larger saving. */
			if (n >= 2 &&
			    p.exposed_us <= tmp[n - 1].exposed_us + tie_tol(tmp[n - 1].exposed_us))
				tmp[n - 1] = p;
			else
				tmp[n++] = p;
		}
		if (p.saved_q >= s_cap)
			break;
		target = p.saved_q + 1;
	}
	kiln_plan_point *pts = kiln_arena_alloc(a, (size_t)n * sizeof(kiln_plan_point));
	if (!pts)
		goto done;
	memcpy(pts, tmp, (size_t)n * sizeof(kiln_plan_point));
	out->points = pts;
	out->n_points = n;
	rc = 0;
done:
	free(tmp);
	return rc;
}

/* Ownership: in and targets borrowed; out's points and choices live in a.
 * Time: one or two MILP solves per target not already met. */
int kiln_cost_frontier_milp_targets(const kiln_plan_instance *in, const uint32_t *targets,
                                    int32_t n_targets, kiln_progress *meter, kiln_arena *a,
                                    kiln_frontier *out)
{
	if (!out || n_targets < 0 || (n_targets > 0 && !targets) ||
	    kiln_cost_instance_check(in) != 0)
		return -1;
	out->points = NULL;
	out->n_points = 0;
	size_t ng = in->n_groups > 0 ? (size_t)in->n_groups : 1;
	kiln_plan_point *pts =
	    kiln_arena_alloc(a, ((size_t)n_targets + 1) * sizeof(kiln_plan_point));
	int32_t *keep = kiln_arena_alloc(a, ng * sizeof(int32_t));
	if (!pts || !keep)
		return -1;
	kiln_cost_plan_eval(in, keep, &pts[0]);
	pts[0].choice = keep;
	int32_t n = 1;
	for (int32_t i = 0; i < n_targets; i++) {
		if (i > 0 && targets[i] <= targets[i - 1])
			return -1;
		/* Met by the last answer: costs rise with the target, so the
		 * answer stands. */
		if (targets[i] <= pts[n - 1].saved_q)
			continue;
		kiln_plan_point p;
		int r = kiln_cost_solve_milp(in, targets[i], a, &p);
		kiln_progress_add_aux(meter, 1);
		if (r != 0 || p.saved_q < targets[i])
			return -1; /* a target beyond the maximum, or GLPK broke its constraint */
		if (n >= 2 &&
		    p.exposed_us <= pts[n - 1].exposed_us + tie_tol(pts[n - 1].exposed_us))
			pts[n - 1] = p;
		else
			pts[n++] = p;
	}
	out->points = pts;
	out->n_points = n;
	return 0;
}
