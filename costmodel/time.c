/* costmodel/time.c: op and stage times, as the planner and the simulator
 * see them.
 *
 * There is one time model: the calibrated step-time model of step.c
 * (docs/cost-model.md, "Step time"; docs/calibration.md). An op's time here
 * is kiln_cost_step_op_us with the graph's hardware profile's own figures
 * (kiln_cost_step_params_of), so that plans, exposed times, the
 * simulator's throughput and `kilnc report` rest on the same numbers. Times
 * in microseconds.
 */
#include "costmodel/costmodel.h"

double kiln_cost_op_time_us(const kiln_ir_graph *g, const kiln_ir_op *op, double n)
{
	/* Filling the figures is a handful of loads and compares, cheaper than
	 * any cache would be to keep right when a caller edits the model's
	 * hardware (tests do); the op's own pricing dominates. */
	kiln_cost_step_params p;
	kiln_cost_step_params_of(&g->model->hw, &p);
	return kiln_cost_step_op_us(g, op, n, &p);
}

void kiln_cost_stage_time(const kiln_ir_graph *g, int32_t stage, double r, double *out_fwd_us,
                          double *out_bwd_us)
{
	const kiln_ir_stage *st = &g->stages[stage];
	kiln_cost_step_params p;
	kiln_cost_step_params_of(&g->model->hw, &p);
	double fwd = 0, bwd = 0;
	for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
		const kiln_ir_layer *ly = &g->layers[l];
		double n = r * ly->n_balanced;
		for (int32_t o = ly->op_begin; o < ly->op_end; o++) {
			double us = kiln_cost_step_op_us(g, &g->ops[o], n, &p);
			if (g->ops[o].backward)
				bwd += us;
			else
				fwd += us;
		}
	}
	*out_fwd_us = fwd;
	*out_bwd_us = bwd;
}
