/* passes/schedule.h: the scheduler's interface (defined in
 * passes/interleave.c).
 *
 * Dual-batch interleaving (DESIGN.md section 8, docs/schedule.md). In 1F1B
 * steady state a stage runs the forward of one micro-batch (chain 0) and the
 * backward of another (chain 1) through each layer; a plan adds recompute
 * chunks and reloads to the backward chain and offloads to the forward
 * chain. A template is the merged order of both chains' tasks over four
 * streams with predicted start and end times.
 *
 * Every pass that needs a schedule gets it here and nowhere else
 * (docs/passes.md, "Who schedules"): plan measures copy windows and picks
 * table points with kiln_interleave_makespan and kiln_interleave_hbm_us;
 * interleave builds the templates and the feedback; budget rebuilds the
 * steady templates with kiln_interleave_template; baselines and the
 * simulator price static plans with kiln_interleave_exposed. The scheduled
 * exposed time of a plan is one formula, kiln_interleave_exposed's. */
#ifndef KILN_PASSES_SCHEDULE_H
#define KILN_PASSES_SCHEDULE_H

#include <stdio.h>

#include "ir/ir.h"

typedef struct kiln_compilation kiln_compilation; /* passes/passes.h */
typedef struct kiln_plan_table kiln_plan_table;   /* passes/passes.h */

typedef enum {
	KILN_STREAM_COMPUTE,
	KILN_STREAM_COMM, /* TP collectives, EP all-to-all, pipeline transfers */
	KILN_STREAM_D2H,  /* offloads */
	KILN_STREAM_H2D,  /* reloads */
	KILN_STREAM_COUNT
} kiln_stream;

typedef enum {
	KILN_TASK_FORWARD,
	KILN_TASK_BACKWARD,
	KILN_TASK_RECOMPUTE,
	KILN_TASK_COPY, /* offload or reload */
	KILN_TASK_COMM, /* a collective, in either chain */
	KILN_TASK_KIND_COUNT
} kiln_task_kind;

typedef struct kiln_task {
	const char *name; /* chunk name, e.g. "attn", "dispatch", "experts.bwd",
	                     "recompute moe.expert_up", "offload moe.expert_in" */
	kiln_task_kind kind;
	kiln_stream stream;
	int32_t chain; /* 0: forward micro-batch, 1: backward micro-batch */
	int32_t index; /* position in its chain */
	double duration_us;
	double start_us, end_us; /* in the template; 0 = the template's start */
	int32_t *deps;           /* tasks (indices in the template) that must end first */
	int32_t n_deps;
	double mem_bytes; /* transient bytes held from start to the end of its consumer (reloads) */
} kiln_task;

typedef struct kiln_template {
	int32_t stage;
	kiln_layer_kind kind;
	int32_t plan;       /* pool index of the plan class */
	double load_factor; /* the load its durations were taken at */
	kiln_task *tasks;   /* in start order */
	int32_t n_tasks;
	double makespan_us; /* interleaved */
	double serial_us;   /* the plain serial order: chain 0, then chain 1 */
	double base_us;     /* makespan of the keep-everything template at the same load */
} kiln_template;

/* The steady-state picture of one stage, for views: its layers in execution
 * order, each running the template of its kind's steady plan. */
typedef struct kiln_stage_timeline {
	int32_t stage;
	int32_t n_layers;
	int32_t *layer;       /* model layer numbers */
	int32_t *template_id; /* index into kiln_plan_schedule.templates */
} kiln_stage_timeline;

struct kiln_plan_schedule {
	const char *model; /* name */
	kiln_template *templates;
	int32_t n_templates;
	kiln_stage_timeline *stages;
	int32_t n_stages;
};

/* The interleave pass: a template per plan class (pool plan) at the load of
 * the first table using it, the schedule's stage timelines, and feedback:
 * every table point's exposed time becomes its template's makespan minus
 * base_us, and points a scheduled neighbour dominates leave the table.
 * Returns 0 or -1. */
int kiln_pass_interleave(kiln_compilation *c);

/* The template of one plan (actions: one kiln_action per unit of t->set;
 * plan: its pool index, recorded in the template) at table t's load: both
 * chains scheduled by the DP and serially. base_us is left 0. Returns 0 or
 * -1. */
int kiln_interleave_template(const kiln_compilation *c, const kiln_plan_table *t, int32_t plan,
                             const uint8_t *actions, kiln_arena *a, kiln_template *out);

/* Makespan of the DP schedule of actions' template at table t's set and
 * load (tasks allocated from a), or -1. */
double kiln_interleave_makespan(const kiln_compilation *c, const kiln_plan_table *t,
                                const uint8_t *actions, kiln_arena *a);
/* Exposed time of a plan (actions: one kiln_action per unit of t->set) at
 * table t's load, as the feedback computes it: its scheduled makespan minus
 * the keep-everything makespan, plus the HBM share of its offloads; and
 * *out_serial_us the same without overlap (serial orders). Scratch from a.
 * Returns 0 or -1. */
int kiln_interleave_exposed(const kiln_compilation *c, const kiln_plan_table *t,
                            const uint8_t *actions, kiln_arena *a, double *out_exposed_us,
                            double *out_serial_us);

/* The HBM time the copy engine takes from compute for a plan's offloads
 * (actions: one kiln_action per unit of t->set) at table t's load: twice
 * each offloaded unit's bytes (read for the copy out, written back on the
 * reload) at hbm_gbps (docs/cost-model.md, "Copy link"). The stream model
 * cannot see it, so the exposed time adds it to the scheduled delay. */
double kiln_interleave_hbm_us(const kiln_compilation *c, const kiln_plan_table *t,
                              const uint8_t *actions);

/* ---- the scheduler's building blocks (the functions above, tests, views) */

/* Schedules two chains' tasks (tasks[0..n) with chain, index, stream,
 * duration and deps filled) by the dynamic program; fills start_us, end_us,
 * reorders tasks into start order (deps renumbered) and returns the makespan,
 * or a negative value on failure. mem_limit_bytes bounds the reload buffers
 * held at once (INFINITY: no bound). */
double kiln_schedule_dp(kiln_task *tasks, int32_t n, double mem_limit_bytes, kiln_arena *a);
/* Labels (stream and live-task time vectors) kept per DP state; see
 * docs/schedule.md, "Pruning". */
#define KILN_SCHEDULE_PARETO_CAP 64
/* kiln_schedule_dp with an explicit cap on the Pareto set per state
 * (0: no cap, exact; for tests). Same contract. */
double kiln_schedule_dp_cap(kiln_task *tasks, int32_t n, double mem_limit_bytes, int32_t pareto_cap,
                            kiln_arena *a);
/* The two chains of one layer of set at load n under a plan (actions: one
 * kiln_action per unit): chain 0 the forward chunks with offloads, chain 1
 * the backward chunks with reloads and recomputes (docs/schedule.md,
 * "Chunks"), unscheduled. Tasks, deps and names are allocated from a.
 * Returns 0, or -1 on exhaustion. O(ops + units^2). */
int kiln_schedule_build(const kiln_ir_graph *g, const kiln_unit_set *set, const uint8_t *actions,
                        double n, kiln_arena *a, kiln_task **out_tasks, int32_t *out_n);
/* The plain serial order (chain 0, then chain 1), same contract. */
double kiln_schedule_serial(kiln_task *tasks, int32_t n, kiln_arena *a);
/* Checks a scheduled template: deps end before dependents start, one task at
 * a time per stream, chain order kept, reload memory within mem_limit_bytes.
 * Returns 0, or -1 with one line per violation on err (may be NULL). */
int kiln_schedule_verify(const kiln_task *tasks, int32_t n, double mem_limit_bytes, FILE *err);

/* Names for views and docs. */
const char *kiln_stream_name(kiln_stream s);
const char *kiln_task_kind_name(kiln_task_kind k);

#endif
