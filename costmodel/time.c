/* costmodel/time.c: op, stage and iteration times.
 *
 * Equations and sources: docs/cost-model.md, sections "Op time" and
 * "Iteration". Times in microseconds unless named _s.
 */
#include "costmodel/costmodel.h"

/* Bandwidth in bytes per microsecond of a group of g ranks. */
static double group_bw(const kiln_hardware *hw, int32_t g)
{
	double gbps = g <= hw->devices_per_node ? hw->intra_node_gbps : hw->inter_node_gbps;
	return gbps * 1e3;
}

double kiln_cost_op_time_us(const kiln_ir_graph *g, const kiln_ir_op *op, double n)
{
	const kiln_hardware *hw = &g->model->hw;
	double gemm_rate = hw->peak_tflops * 1e6 * hw->gemm_efficiency; /* FLOPs per us */
	double flops = kiln_linf_at(op->flops, n);
	double traffic = kiln_linf_at(op->traffic, n);
	double bytes = kiln_linf_at(op->comm_bytes, n);
	switch (kiln_ir_op_kind_class(op->kind)) {
	case KILN_OPCLASS_GEMM:
		return flops / gemm_rate;
	case KILN_OPCLASS_MEM:
		return kiln_cost_hbm_us(hw, traffic);
	case KILN_OPCLASS_ATTN: {
		double c = flops / gemm_rate, mem = kiln_cost_hbm_us(hw, traffic);
		return c > mem ? c : mem;
	}
	case KILN_OPCLASS_COMM_TP:
	case KILN_OPCLASS_COMM_EP: {
		int32_t grp = op->comm_group;
		if (grp <= 1 || bytes <= 0)
			return 0;
		double share = (double)(grp - 1) / (double)grp;
		if (op->collective == KILN_COLL_ALL_REDUCE)
			share *= 2;
		else if (op->collective == KILN_COLL_NONE || op->collective == KILN_COLL_RECV)
			return 0;
		return share * bytes / group_bw(hw, grp);
	}
	case KILN_OPCLASS_COMM_PP:
		if (op->collective != KILN_COLL_SEND)
			return 0;
		return bytes / (hw->inter_node_gbps * 1e3);
	}
	return 0;
}

void kiln_cost_stage_time(const kiln_ir_graph *g, int32_t stage, double r, double *out_fwd_us,
                          double *out_bwd_us)
{
	const kiln_ir_stage *st = &g->stages[stage];
	double fwd = 0, bwd = 0;
	for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
		const kiln_ir_layer *ly = &g->layers[l];
		double n = r * ly->n_balanced;
		for (int32_t o = ly->op_begin; o < ly->op_end; o++) {
			double us = kiln_cost_op_time_us(g, &g->ops[o], n);
			if (g->ops[o].backward)
				bwd += us;
			else
				fwd += us;
		}
	}
	*out_fwd_us = fwd;
	*out_bwd_us = bwd;
}

void kiln_cost_iteration_estimate(const kiln_ir_graph *g, double r, kiln_cost_iteration *out)
{
	const kiln_model *m = g->model;
	double worst_us = 0;
	int32_t slowest = 0;
	for (int32_t s = 0; s < g->n_stages; s++) {
		double f, b;
		kiln_cost_stage_time(g, s, r, &f, &b);
		if (f + b > worst_us) {
			worst_us = f + b;
			slowest = s;
		}
	}
	double mb = (double)m->micro_batches, p = (double)m->pp;
	double v = m->schedule == KILN_SCHED_INTERLEAVED && m->vpp > 1 ? (double)m->vpp : 1.0;
	double bubble = (p - 1) / v;
	kiln_cost_iteration it;
	it.iteration_s = (mb + bubble) * worst_us * 1e-6;
	it.bubble_fraction = mb + bubble > 0 ? bubble / (mb + bubble) : 0;
	/* As Megatron counts them (flops.c), so that MFU compares with
	 * published runs. */
	it.model_flops =
	    kiln_cost_model_flops_per_token(m) * (double)m->global_batch * (double)m->seq_len;
	it.slowest_stage = slowest;
	if (it.iteration_s > 0) {
		it.tokens_per_s = (double)m->global_batch * (double)m->seq_len / it.iteration_s;
		it.mfu = it.model_flops /
		         (it.iteration_s * (double)m->devices * m->hw.peak_tflops * 1e12);
	} else {
		it.tokens_per_s = 0;
		it.mfu = 0;
	}
	*out = it;
}
