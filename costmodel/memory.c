/* costmodel/memory.c: parameters, static bytes, activations, in-flight count.
 *
 * Equations and sources: docs/cost-model.md, sections "Parameters", "Static
 * memory", "Activations" and "In-flight micro-batches".
 */
#include "costmodel/costmodel.h"

static uint64_t div_up(uint64_t x, uint64_t d)
{
	return d ? (x + d - 1) / d : x;
}

void kiln_cost_params_count(const kiln_ir_graph *g, kiln_cost_params *out)
{
	kiln_cost_params p = {0, 0, 0};
	for (int32_t o = 0; o < g->n_ops; o++) {
		const kiln_ir_op *op = &g->ops[o];
		if (op->backward)
			continue;
		p.total += op->params_global;
		if (op->expert_params)
			p.expert += op->params_global;
	}
	const kiln_model *m = g->model;
	p.active = p.total;
	if (m->moe && m->experts > 0)
		p.active =
		    p.total - p.expert + p.expert / (uint64_t)m->experts * (uint64_t)m->top_k;
	*out = p;
}

void kiln_cost_stage_params(const kiln_ir_graph *g, int32_t stage, uint64_t *dense,
                            uint64_t *expert)
{
	const kiln_ir_stage *st = &g->stages[stage];
	*dense = *expert = 0;
	for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
		const kiln_ir_layer *ly = &g->layers[l];
		for (int32_t o = ly->op_begin; o < ly->op_end; o++) {
			const kiln_ir_op *op = &g->ops[o];
			if (op->backward)
				continue;
			if (op->expert_params)
				*expert += op->params_local;
			else
				*dense += op->params_local;
		}
	}
}

void kiln_cost_stage_static(const kiln_ir_graph *g, int32_t stage, kiln_cost_static *out)
{
	uint64_t dense, expert;
	kiln_cost_stage_params(g, stage, &dense, &expert);
	kiln_cost_static_of(g->model, dense, expert, out);
}

void kiln_cost_static_of(const kiln_model *m, uint64_t dense, uint64_t expert,
                         kiln_cost_static *out)
{
	/* Bytes per parameter (docs/cost-model.md, "Static memory"). Mixed
	 * precision (bf16, fp16, fp8 activations) as Megatron's estimator counts
	 * it (megatron/training/theoretical_memory_usage.py:293-296): 16-bit
	 * weights, fp32 main gradients, and in the optimizer fp32 main weights
	 * plus the Adam moments (12) or the momentum (8). fp32 training keeps
	 * the weights themselves in fp32 and has no main copy (Megatron's
	 * FP32Optimizer, megatron/core/optimizer/optimizer.py:1264): 4 + 4,
	 * and the moments alone (8) or the momentum (4). */
	bool fp32 = m->dtype == KILN_DTYPE_FP32;
	uint64_t per;
	if (m->optimizer == KILN_OPTIM_ADAM)
		per = fp32 ? 8 : 12;
	else
		per = fp32 ? 4 : 8;
	kiln_cost_static s;
	s.params = dense + expert;
	s.weights = (fp32 ? 4 : 2) * s.params;
	s.grads = 4 * s.params;
	if (m->distributed_optimizer)
		s.optimizer =
		    div_up(per * dense, (uint64_t)m->dp) + div_up(per * expert, (uint64_t)m->edp);
	else
		s.optimizer = per * s.params;
	s.total = s.weights + s.grads + s.optimizer;
	*out = s;
}

/* Tensor t's alias root (aliases point to earlier tensors, so this ends). */
static int32_t alias_root(const kiln_ir_graph *g, int32_t t)
{
	while (g->tensors[t].alias >= 0)
		t = g->tensors[t].alias;
	return t;
}

kiln_lin kiln_cost_layer_activation(const kiln_ir_graph *g, int32_t layer)
{
	const kiln_ir_layer *ly = &g->layers[layer];
	kiln_lin sum = {0, 0};
	for (int32_t t = ly->tensor_begin; t < ly->tensor_end; t++) {
		if (!(g->tensors[t].flags & KILN_T_SAVED))
			continue;
		/* An alias group counts once: at its first saved member. */
		int32_t root = alias_root(g, t);
		bool first = true;
		for (int32_t u = ly->tensor_begin; u < t && first; u++)
			if ((g->tensors[u].flags & KILN_T_SAVED) && alias_root(g, u) == root)
				first = false;
		if (!first)
			continue;
		sum.base += g->tensors[root].bytes.base;
		sum.per_n += g->tensors[root].bytes.per_n;
	}
	return sum;
}

double kiln_cost_stage_activation_bytes(const kiln_ir_graph *g, int32_t stage, double r)
{
	const kiln_ir_stage *st = &g->stages[stage];
	double bytes = 0;
	for (int32_t l = st->layer_begin; l < st->layer_end; l++)
		bytes += kiln_lin_at(kiln_cost_layer_activation(g, l), r * g->layers[l].n_balanced);
	return bytes;
}

double kiln_cost_stage_inflight(const kiln_ir_graph *g, int32_t stage)
{
	const kiln_model *m = g->model;
	int64_t p = m->pp, mb = m->micro_batches, s = stage;
	/* With EP overlap every stage runs one warm-up forward more, so that a
	 * combined step's forward and backward belong to different micro-batches
	 * and both are held during it (Megatron-LM d98e8a64, schedules.py lines
	 * 966-970; with pp 1, combined_1f1b.py lines 76-135): one micro-batch
	 * (chunk) more in flight. sim/pipeline.c's kiln_pipe_warmup schedules the
	 * same. */
	int64_t extra = m->overlap_ep_comm ? 1 : 0;
	if (m->schedule == KILN_SCHED_INTERLEAVED && m->vpp > 1) {
		int64_t v = m->vpp;
		int64_t chunks = 2 * (p - s - 1) + (v - 1) * p + 1 + extra;
		if (chunks > mb * v)
			chunks = mb * v;
		return (double)chunks / (double)v;
	}
	int64_t n = p - s + extra;
	return (double)(n < mb ? n : mb);
}
