/* costmodel/costmodel.h: memory and time models over the graph IR.
 *
 * Every equation, its assumptions and its source are in docs/cost-model.md.
 * Byte counts are per device; times in microseconds (_us) or seconds (_s).
 */
#ifndef KILN_COSTMODEL_H
#define KILN_COSTMODEL_H

#include <stdint.h>

#include "ir/ir.h"

/* memory.c */

typedef struct kiln_cost_params {
	uint64_t total;  /* weight elements in the whole model */
	uint64_t active; /* weight elements one token passes through (top_k experts) */
	uint64_t expert; /* routed-expert weight elements in the whole model */
} kiln_cost_params;

/* Parameter counts of the whole model, from the graph. */
void kiln_cost_params_count(const kiln_ir_graph *g, kiln_cost_params *out);

typedef struct kiln_cost_static {
	uint64_t params;    /* weight elements on one device of this stage */
	uint64_t weights;   /* bytes: 2 per element */
	uint64_t grads;     /* bytes: 4 per element (fp32 main grads) */
	uint64_t optimizer; /* bytes: master copy and moments, sharded with a distributed optimizer */
	uint64_t total;
} kiln_cost_static;

/* Static (weight, gradient, optimizer) bytes on one device of stage. */
void kiln_cost_stage_static(const kiln_ir_graph *g, int32_t stage, kiln_cost_static *out);

/* Saved-activation bytes of one layer for one micro-batch with everything
 * kept, each alias group once, as an exact linear function of N. */
kiln_lin kiln_cost_layer_activation(const kiln_ir_graph *g, int32_t layer);

/* Saved-activation bytes of a whole stage (all its chunks) for one
 * micro-batch at load factor r (N = r * n_balanced in every MoE layer). */
double kiln_cost_stage_activation_bytes(const kiln_ir_graph *g, int32_t stage, double r);

/* Micro-batches whose activations a stage holds at once at steady state,
 * in units of whole-stage micro-batches (fractional under interleaving). */
double kiln_cost_stage_inflight(const kiln_ir_graph *g, int32_t stage);

/* time.c */

/* Time of one op for one micro-batch at local expert load n. */
double kiln_cost_op_time_us(const kiln_ir_graph *g, const kiln_ir_op *op, double n);

/* Forward and backward time of one micro-batch through a stage at load factor r. */
void kiln_cost_stage_time(const kiln_ir_graph *g, int32_t stage, double r, double *out_fwd_us,
                          double *out_bwd_us);

typedef struct kiln_cost_iteration {
	double iteration_s;     /* one optimizer step */
	double tokens_per_s;    /* whole job */
	double model_flops;     /* per iteration, whole job, recompute excluded */
	double mfu;             /* model_flops / (iteration_s * devices * peak) */
	double bubble_fraction; /* pipeline idle share of the iteration */
	int32_t slowest_stage;
} kiln_cost_iteration;

/* Iteration estimate with everything kept at load factor r. */
void kiln_cost_iteration_estimate(const kiln_ir_graph *g, double r, kiln_cost_iteration *out);

/* report.c-facing summary: one stage at r = 1 and r = max_factor. */
typedef struct kiln_cost_stage_summary {
	int32_t stage;
	int32_t layers;     /* transformer layers */
	int32_t moe_layers;
	bool embedding, head;
	kiln_cost_static st;
	double act_r1_bytes;  /* per micro-batch at r = 1 */
	double act_max_bytes; /* per micro-batch at r = max_factor */
	double inflight;      /* micro-batches held at steady state */
	double peak_r1_bytes;    /* static + inflight * act_r1 */
	double peak_spike_bytes; /* static + (inflight - 1) * act_r1 + act_max */
	double capacity_bytes;   /* memory - reserved */
	double headroom_bytes;   /* capacity - peak_spike (negative: keep-everything OOMs) */
	double fwd_us, bwd_us;   /* per micro-batch at r = 1 */
} kiln_cost_stage_summary;

void kiln_cost_stage_summarize(const kiln_ir_graph *g, int32_t stage, kiln_cost_stage_summary *out);

#endif
