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

/* Weight elements one device of stage holds (params_local of its forward
 * ops), non-expert (*dense) and expert (*expert). */
void kiln_cost_stage_params(const kiln_ir_graph *g, int32_t stage, uint64_t *dense,
                            uint64_t *expert);

/* Static (weight, gradient, optimizer) bytes on one device of stage. */
void kiln_cost_stage_static(const kiln_ir_graph *g, int32_t stage, kiln_cost_static *out);

/* The same for a device holding dense non-expert and expert weight
 * elements (one device's share: params_local), with m's precision and
 * optimizer; kiln_cost_stage_static is this over the stage's ops. */
void kiln_cost_static_of(const kiln_model *m, uint64_t dense, uint64_t expert,
                         kiln_cost_static *out);

/* Saved-activation bytes of one layer for one micro-batch with everything
 * kept, each alias group once, as an exact linear function of N. */
kiln_lin kiln_cost_layer_activation(const kiln_ir_graph *g, int32_t layer);

/* Saved-activation bytes of a whole stage (all its chunks) for one
 * micro-batch at load factor r (N = r * n_balanced in every MoE layer). */
double kiln_cost_stage_activation_bytes(const kiln_ir_graph *g, int32_t stage, double r);

/* Micro-batches whose activations a stage holds at once at steady state,
 * in units of whole-stage micro-batches (fractional under interleaving). */
double kiln_cost_stage_inflight(const kiln_ir_graph *g, int32_t stage);

/* flops.c */

/* Model FLOPs per token (forward and backward, at model.seq_len) as
 * Megatron-LM's num_floating_point_operations counts them; a training step
 * does global_batch * seq_len times this. docs/cost-model.md, "Model FLOPs". */
double kiln_cost_model_flops_per_token(const kiln_model *m);
/* The same; causal_halved false counts the whole score matrix, as
 * Megatron-LM did before core 0.12 (training.py at core_r0.9.0, line 132). */
double kiln_cost_model_flops_per_token_ex(const kiln_model *m, bool causal_halved);
/* The vocabulary padded as Megatron pads it: up to a multiple of 128 * tp. */
double kiln_cost_padded_vocab(const kiln_model *m);

/* hbm.c */

/* Time to move bytes through HBM at hw->hbm_gbps: bytes / (hbm_gbps * 1e3)
 * us, 0 without a bandwidth. The one formula for the bytes of memory-bound
 * ops (step.c, and so time.c) and the copy engine's HBM share of an offload
 * (2 * bytes per unit, passes/options.c and passes/interleave.c). */
double kiln_cost_hbm_us(const kiln_hardware *hw, double bytes);

/* time.c: the planner's and the simulator's op times, which are step.c's
 * (one time model; docs/cost-model.md, "Op time"). */

/* Time of one op for one micro-batch at local expert load n:
 * kiln_cost_step_op_us with the profile's own figures
 * (kiln_cost_step_params_of(&g->model->hw)). Pipeline sends cost 0 here
 * (they overlap compute in steady state); kiln_cost_step_estimate's p2p_us
 * prices them. */
double kiln_cost_op_time_us(const kiln_ir_graph *g, const kiln_ir_op *op, double n);

/* Forward and backward time of one micro-batch through a stage at load
 * factor r: the sums of kiln_cost_op_time_us over its ops (no host floor,
 * no overlap, no recipe recompute: kiln_cost_step_estimate adds those). */
void kiln_cost_stage_time(const kiln_ir_graph *g, int32_t stage, double r, double *out_fwd_us,
                          double *out_bwd_us);

/* step.c: the step-time model of `kilnc report`, calibrated against measured
 * Megatron-Core runs (docs/cost-model.md "Step time", docs/calibration.md).
 * The planner and the simulator price ops with it too (time.c). */

/* The fitted efficiencies (the hardware profile's time_* figures). */
typedef struct kiln_cost_step_params {
	double gemm_efficiency;       /* a large GEMM's share of peak */
	double gemm_half_rows;        /* rows at which a GEMM runs at half of that */
	double attention_efficiency;  /* flash attention's share of peak (causal work) */
	double comm_efficiency;       /* collectives' share of the NVLink bandwidth */
	double inter_node_efficiency; /* and of the inter-node links' */
	double kernel_floor_us;       /* least time of a memory-bound kernel */
	double host_layer_us;         /* host time to issue one layer's forward and backward */
} kiln_cost_step_params;

/* The profile's figures, its defaults applied (ir.h, kiln_hardware). */
void kiln_cost_step_params_of(const kiln_hardware *hw, kiln_cost_step_params *out);

/* Time of one op for one micro-batch at local expert load n (p borrowed). */
double kiln_cost_step_op_us(const kiln_ir_graph *g, const kiln_ir_op *op, double n,
                            const kiln_cost_step_params *p);

typedef struct kiln_cost_step_layer_time {
	double fwd_us, bwd_us;         /* the layer's forward and backward ops */
	double fwd_a2a_us, bwd_a2a_us; /* their EP all-to-all part */
	double moe_fwd_us, moe_bwd_us; /* the MoE block alone: router to combine, shared experts */
	double recompute_us;           /* forward work the recipe recomputes in backward */
	double recompute_a2a_us;       /* its all-to-all part */
} kiln_cost_step_layer_time;

/* One layer at load factor r; full_recompute: the recipe recomputes the
 * whole layer (else its selective modules, if any). */
void kiln_cost_step_layer(const kiln_ir_graph *g, int32_t layer, double r,
                          const kiln_cost_step_params *p, bool full_recompute,
                          kiln_cost_step_layer_time *out);

/* The step's terms beyond the op times, one function per formula, shared by
 * kiln_cost_step_estimate and the simulator (sim/sim.c; docs/cost-model.md,
 * "Step time"). */

/* The host floor: a transformer layer's forward and backward of one
 * micro-batch take max(device, H) together, H = p->host_layer_us (the host
 * issues their kernels at its own pace). Scales *fwd_us and *bwd_us (the
 * device's times, recompute and exposed work included) by one factor so
 * that their sum is that; other layers (transformer false: embedding,
 * head), H 0 and a layer of no device time stay as they are. */
void kiln_cost_step_host_floor(const kiln_cost_step_params *p, bool transformer, double *fwd_us,
                               double *bwd_us);

/* With overlap_ep_comm, a layer's forward of one micro-batch beside a
 * layer's backward of another (Megatron's combined 1F1B step): the compute
 * stream runs both computes, the communication stream both all-to-alls,
 * and the host issues both in H: max(fwd + bwd - a2a, a2a, H) us, a2a =
 * fwd_a2a_us + bwd_a2a_us (the all-to-all parts of fwd_us and bwd_us), H
 * as in kiln_cost_step_host_floor. */
double kiln_cost_step_pair_us(const kiln_cost_step_params *p, bool transformer, double fwd_us,
                              double fwd_a2a_us, double bwd_us, double bwd_a2a_us);

/* One stage's data-parallel traffic per iteration and its optimizer step:
 * the gradient reduce-scatter (an all-reduce without a distributed
 * optimizer) and the parameter all-gather of its dense weights over the dp
 * group and of its expert weights over the edp group, and Adam over the
 * device's shard at HBM rate. */
typedef struct kiln_cost_step_dp {
	double reduce_scatter_us, all_gather_us, optimizer_us;
} kiln_cost_step_dp;
void kiln_cost_step_stage_dp(const kiln_ir_graph *g, int32_t stage, const kiln_cost_step_params *p,
                             kiln_cost_step_dp *out);

/* The part of d's traffic not hidden: the reduce-scatter overlaps the last
 * micro-batch's backward on the stage, the all-gather the first one's
 * forward; what exceeds them is exposed, once per iteration. */
double kiln_cost_step_dp_exposed_us(const kiln_cost_step_dp *d, double first_fwd_us,
                                    double last_bwd_us);

typedef struct kiln_cost_step {
	double iteration_s;  /* one optimizer step */
	double tokens_per_s; /* whole job */
	double model_flops;  /* per step, whole job, as Megatron counts them */
	double mfu;
	double bubble_fraction; /* fill and drain share of the step */
	int32_t slowest_stage;
	double stage_fwd_us,
	    stage_bwd_us;     /* the slowest stage, one micro-batch (bwd with recompute) */
	double a2a_us;        /* the most EP all-to-all time of a stage per micro-batch */
	double p2p_us;        /* one stage boundary's send per micro-batch */
	double dp_exposed_us; /* gradient reduce-scatter / parameter all-gather not hidden */
	double optimizer_us;  /* the optimizer step */
} kiln_cost_step;

/* The busiest EP rank's load factor in a run as its description states
 * it: 1 for forced balance (or no EP), the capacity factor when experts are
 * padded to it (at most it when not), and KILN_COST_NATURAL_PEAK for
 * dropless natural routing. */
double kiln_cost_step_run_load(const kiln_model *m);
/* Dropless natural routing: the busiest EP rank's load factor in a calm
 * iteration, the mean of the reference report's measured distribution as
 * kiln's paper load profile reproduces it (DESIGN.md section 1: 97.1% of
 * iterations below 1.2x; sim/loads.c, tests/test_loads.c paper_statistics:
 * mean calm maximum 1.100). */
#define KILN_COST_NATURAL_PEAK 1.10

/* A step with everything kept at load factor r, the recipe's recompute
 * priced; p borrowed, NULL for the profile's own figures. */
void kiln_cost_step_estimate(const kiln_ir_graph *g, double r, const kiln_cost_step_params *p,
                             kiln_cost_step *out);

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

/* ---------------------------------------------------------------- planning
 *
 * A planning instance is the multiple-choice knapsack of one layer at one
 * load (docs/cost-model.md, "Planning"): its saved activations ("units")
 * are partitioned into groups of units whose recomputes share work; each
 * group offers joint choices of an action per unit. Bytes are counted in
 * quanta of quantum_bytes: saved bytes rounded down per unit, offloaded
 * bytes rounded up, so a plan never claims more saving or less copy than it
 * has. The copy links carry free_offload_q quanta in idle time; offloading
 * beyond that is exposed at offload_us_per_q per quantum. The passes build
 * instances (passes/options.c); the solvers below only see these numbers.
 */

typedef enum { KILN_ACT_KEEP = 0, KILN_ACT_RECOMPUTE = 1, KILN_ACT_OFFLOAD = 2 } kiln_action;
#define KILN_ACT_COUNT 3
#define KILN_PLAN_MAX_GROUP 6    /* units per group */
#define KILN_PLAN_MAX_UNITS 128  /* units per instance */
#define KILN_PLAN_MAX_QUANTA 4096 /* saved or offloaded quanta per instance */

/* One joint choice for the units of a group. */
typedef struct kiln_plan_choice {
	uint8_t actions[KILN_PLAN_MAX_GROUP]; /* kiln_action per unit, in group order */
	uint32_t saved_q;                     /* quanta saved (rounded down per unit) */
	uint32_t offload_q;                   /* quanta offloaded (rounded up per unit) */
	double recompute_us; /* added to the critical path whatever the copy link does:
	                        recompute, and the HBM time of offload copies */
} kiln_plan_choice;

typedef struct kiln_plan_group {
	int32_t units[KILN_PLAN_MAX_GROUP]; /* unit indices, 0..n_units-1 of the instance */
	int32_t n_units;
	kiln_plan_choice *choices; /* valid, undominated; choices[0] keeps every unit */
	int32_t n_choices;
} kiln_plan_group;

typedef struct kiln_plan_instance {
	int32_t n_units;
	kiln_plan_group *groups; /* every unit is in exactly one group */
	int32_t n_groups;
	uint64_t quantum_bytes;
	uint32_t free_offload_q;
	double offload_us_per_q;
} kiln_plan_instance;

/* A plan: one choice per group, with its totals. */
typedef struct kiln_plan_point {
	uint32_t saved_q;
	uint32_t offload_q;
	double recompute_us;
	double exposed_us; /* recompute_us + kiln_cost_copy_exposed_us(offload_q) */
	int32_t *choice;   /* n_groups indices into groups[g].choices; owned by the solver's arena */
} kiln_plan_point;

/* Pareto frontier of bytes saved against exposed time: points sorted by
 * saved_q ascending; points[0] is keep-everything (0, 0); from points[1] on
 * exposed_us is strictly ascending (points[1] may also cost 0 when some
 * saving is free). */
typedef struct kiln_frontier {
	kiln_plan_point *points;
	int32_t n_points;
} kiln_frontier;

/* Exposed copy time of offloading offload_q quanta:
 * max(0, offload_q - free_offload_q) * offload_us_per_q. */
double kiln_cost_copy_exposed_us(const kiln_plan_instance *in, uint32_t offload_q);

/* Totals of a plan given by one choice per group (choice borrowed). */
void kiln_cost_plan_eval(const kiln_plan_instance *in, const int32_t *choice,
                         kiln_plan_point *out);

/* Checks an instance's shape (indices, sizes within the KILN_PLAN_MAX_*
 * limits, choices[0] keeps all). Returns 0 or -1. */
int kiln_cost_instance_check(const kiln_plan_instance *in);

/* megatron.c: Megatron-Core's recompute and offload modules on kiln's ops,
 * the one mapping step.c and passes/baselines.c share (docs/cost-model.md,
 * "Baselines"; the Megatron-LM code it follows is cited in the file). */

/* The recompute modules that output-discarding checkpointing implements
 * (transformer_config.py:579-582); the others checkpoint normally. */
#define KILN_MRC_DISCARDS_OUTPUT (KILN_MRC(MOE_ACT) | KILN_MRC(LAYERNORM) | KILN_MRC(MLA_UP_PROJ))

/* The recompute modules (KILN_MRC bits) whose checkpointed region holds
 * forward ops of kind k: what a module re-runs in backward. */
uint32_t kiln_megatron_recompute_cover(kiln_op_kind k);
/* The offload modules (KILN_MOF bits) whose offload context holds forward
 * op o of g (every tensor o saves for backward moves with them). */
uint32_t kiln_megatron_offload_cover(const kiln_ir_graph *g, int32_t o);

/* How the modules see one saved tensor (its alias group, rooted at tensor
 * root): the recompute regions that make it, those whose ops save it, those
 * with an op outside them that saves it, and the offload contexts that
 * save it. O(ops of the layer). */
typedef struct kiln_megatron_uses {
	uint32_t made_by, saved_by, saved_outside_of; /* KILN_MRC bits */
	uint32_t offloaded_by;                        /* KILN_MOF bits */
} kiln_megatron_uses;
void kiln_megatron_tensor_uses(const kiln_ir_graph *g, int32_t root, kiln_megatron_uses *out);
/* The modules of `modules` (KILN_MRC bits) that drop a tensor with uses u:
 * an output-discarding region drops what it makes; a normal one what it
 * makes and only it saves. 0: the tensor stays. */
uint32_t kiln_megatron_drops(const kiln_megatron_uses *u, uint32_t modules);

/* Recipe r's --activation-offload-fraction (1 when not given) and
 * --min-offloaded-tensor-size in elements (Megatron's 1M when not given,
 * transformer_config.py:1343). */
double kiln_megatron_fraction(const kiln_megatron *r);
double kiln_megatron_min_offloaded(const kiln_megatron *r);

/* The offload modules in the order a transformer layer's forward enters
 * their contexts (transformer_layer.py, attention.py, moe/experts.py):
 * its offload groups are ordered so (fine_grained_activation_offload.py,
 * on_group_start_forward, :1310-1330). */
extern const uint32_t kiln_megatron_group_order[KILN_MOF_COUNT];

/* Writes recipe r as Megatron's command-line flags (e.g.
 * "--recompute-granularity selective --recompute-modules layernorm moe_act
 * --fine-grained-activation-offloading --offload-modules expert_fc1
 * --activation-offload-fraction 0.75") into
 * buf (size bytes, NUL-terminated). Returns the length, or -1 when it did
 * not fit. */
int kiln_megatron_flags_format(const kiln_megatron *r, char *buf, size_t size);

/* knapsack.c */

/* The whole frontier of one instance by dynamic programming over quanta
 * saved and quanta offloaded (capped at free_offload_q). Exact for the
 * quantised instance. Arrays are allocated from a. Returns 0, or -1 on
 * exhaustion or a malformed instance. O(groups * choices * S * K) time. */
int kiln_cost_frontier_dp(const kiln_plan_instance *in, kiln_arena *a, kiln_frontier *out);

/* The canonical plans at given saving levels (docs/cost-model.md,
 * "Solvers", canonical ties): points[0] keeps everything, then for each of
 * levels[0..n_levels) (strictly ascending quanta saved) the plan the DP of
 * kiln_cost_frontier_dp traces from the cheapest state saving exactly that
 * level, so that every solver's frontier, re-traced here, names the same
 * plans. A level no dearer than the one before it replaces it (as in the
 * DP's frontier). Returns 0, or -1 on exhaustion, a malformed instance or
 * an unreachable level. Same cost as kiln_cost_frontier_dp. */
int kiln_cost_frontier_levels(const kiln_plan_instance *in, const uint32_t *levels,
                              int32_t n_levels, kiln_arena *a, kiln_frontier *out);

/* The k cheapest distinct plans saving at least each target (quanta), by
 * the instance's cost (docs/cost-model.md, "Solvers", k best): for target
 * i, out[i * k + 0 .. out_n[i]) (out holds n_targets * k points). The
 * first is the frontier's answer (kiln_cost_frontier_dp's first point
 * saving at least the target, its canonical plan), then the others in
 * ascending cost (ties: as a deterministic best-first search meets them),
 * fewer when fewer plans save enough (out_n[i] = 0: none) or a target's
 * search reaches its node limit (the plans found are still the cheapest).
 * Depends only on the instance and the targets. 1 <= k <=
 * KILN_PLAN_KBEST_MAX. Returns 0, or -1 on exhaustion (the state values
 * of an instance past 2^25 are refused) or a malformed instance. */
#define KILN_PLAN_KBEST_MAX 64
int kiln_cost_kbest(const kiln_plan_instance *in, const uint32_t *targets, int32_t n_targets,
                    int32_t k, kiln_arena *a, kiln_plan_point *out, int32_t *out_n);

/* The cheapest plan saving at least min_saved_q, by enumerating every
 * combination of choices (for tests; refuses instances with more than
 * 2^22 combinations). Returns 0, 1 when nothing saves enough, -1 when too
 * large. out->choice is allocated from a. Ties: the larger saving wins. */
int kiln_cost_solve_brute(const kiln_plan_instance *in, uint32_t min_saved_q, kiln_arena *a,
                          kiln_plan_point *out);

/* milp.c (the one file that uses GLPK) */

/* The cheapest plan saving at least min_saved_q, as an exact MILP solved by
 * GLPK. Returns 0, 1 when infeasible, -1 when GLPK failed (its error hook
 * catches every abort; the process survives). Ties: the larger saving wins. */
int kiln_cost_solve_milp(const kiln_plan_instance *in, uint32_t min_saved_q, kiln_arena *a,
                         kiln_plan_point *out);

/* The whole frontier by successive MILPs (each solve's saving + 1 is the next
 * target). Same contract as kiln_cost_frontier_dp. */
int kiln_cost_frontier_milp(const kiln_plan_instance *in, kiln_arena *a, kiln_frontier *out);
/* The same, counting every MILP solve into meter's second count
 * (kiln_progress_add_aux; meter borrowed, NULL for none): a frontier can
 * take minutes. */
int kiln_cost_frontier_milp_metered(const kiln_plan_instance *in, kiln_progress *meter,
                                    kiln_arena *a, kiln_frontier *out);

/* The frontier at given saving targets only (strictly ascending quanta):
 * keep-everything, then for each target not met by the last answer the
 * MILP's cheapest plan reaching it (the larger saving at one cost level).
 * What a plan table reads of a frontier (passes/plan.c); each solve counts
 * into meter's second count (NULL for none). Returns 0, or -1 when a solve
 * fails or a target exceeds the maximal saving. */
int kiln_cost_frontier_milp_targets(const kiln_plan_instance *in, const uint32_t *targets,
                                    int32_t n_targets, kiln_progress *meter, kiln_arena *a,
                                    kiln_frontier *out);

#endif
