/* passes/passes.h: the compiler's passes, run in order by pipeline.c. */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include <stdio.h>

#include "costmodel/costmodel.h"
#include "ir/ir.h"

/* lower.c */

/* Lowers a validated model to the graph IR: per stage, the embedding (first
 * stage), the transformer layers of each model chunk, and the output layer
 * and loss (last stage), each with forward and backward ops and the tensors
 * they produce. The graph is arena-owned. Returns 0, or -1 on exhaustion. */
int kiln_pass_lower(const kiln_model *m, kiln_arena *a, kiln_ir_graph **out);

/* pipeline.c */

typedef enum { KILN_SOLVER_DP, KILN_SOLVER_MILP } kiln_solver;
#define KILN_SOLVER_COUNT 2
/* The solver's name, as --solver takes it and the outputs print it ("dp",
 * "milp"); "?" for a value that is no kiln_solver. */
const char *kiln_solver_name(int s);
/* The solver named `name` in *out; returns 0, or -1 for no solver's name. */
int kiln_solver_parse(const char *name, kiln_solver *out);

typedef struct kiln_unit_set kiln_unit_set;
typedef struct kiln_plan_table kiln_plan_table;
typedef struct kiln_stage_budget kiln_stage_budget;
typedef struct kiln_baseline kiln_baseline;
typedef struct kiln_plan_pool kiln_plan_pool;
typedef struct kiln_plan_schedule kiln_plan_schedule;
typedef struct kiln_group_fallback kiln_group_fallback;

/* Everything one compilation produces, pass by pass. Arena-owned; fields are
 * NULL / 0 until the pass that fills them has run. */
typedef struct kiln_compilation {
	const kiln_model *model; /* borrowed */
	kiln_arena *arena;       /* borrowed */
	kiln_solver solver;
	bool no_offload;         /* plan without offloading (the simulator's ablation) */
	FILE *progress;          /* when set (a terminal), a status line and one line per pass */
	kiln_progress *meter;    /* kiln_pipeline_compile's status line while it runs, else NULL */
	kiln_ir_graph *graph;    /* lower */
	kiln_unit_set *sets;     /* activations: one per (stage, layer kind) */
	int32_t n_sets;
	double *buckets;         /* plan: upper load-factor edge of each bucket, ascending */
	int32_t n_buckets;
	kiln_plan_table *tables; /* plan: n_sets * n_buckets, set-major */
	kiln_plan_pool *pool;    /* plan: the distinct plans */
	kiln_plan_schedule *schedule; /* interleave: templates and stage timelines */
	kiln_stage_budget *budgets; /* budget: one per stage */
	kiln_baseline *baselines;   /* baselines: KILN_BASELINE_COUNT */
	kiln_group_fallback *groups; /* baselines: one per set, the EP group's fallback */
} kiln_compilation;

/* Per unit set, the plan every rank of an EP group switches to when some
 * rank of the group is past the rows known to fit without it (fit_rows)
 * (docs/runtime.md, "Beyond the declared load"): the full recompute plan
 * (passes/baselines.c), which re-runs the layer's collectives, as every
 * rank does it, or the cheapest plan of the set's tables that never holds
 * more device memory than it, resident or transient, at any rows a rank
 * can receive. Bytes are exact lines in the rows (kiln_plan_bytes_at);
 * the exposed time is the line through its scheduled exposed time
 * (kiln_interleave_exposed, as the simulator prices a static plan) at the
 * first and the last bucket's rows. */
struct kiln_group_fallback {
	int32_t plan;      /* pool index; -1 for a dense set (no rows, no group) */
	uint64_t fit_rows; /* kiln_budget_fit_rows: the most rows safe without the fallback;
	                      0 none */
	kiln_lin resident, saved, transient;
	double exposed_base_us, exposed_per_row_us;
};

/* What compiling a description costs, estimated after the cheap passes
 * (lower, activations) and before the planning passes, which dominate:
 * every (unit set, load bucket) is a plan table whose instance, frontier
 * points and pooled plans grow with its units, so memory and time follow
 * the unit choices, the sum over tables of their units. The per-unit
 * figures are measured (docs/cli.md, "Cost bounds"). */
typedef struct kiln_compile_cost {
	int32_t n_sets, n_buckets;
	int64_t tables;       /* n_sets * n_buckets */
	int64_t unit_choices; /* sum over tables of the set's units */
	int64_t frontiers;    /* at most: distinct layer kinds x buckets (tables share them) */
	double bytes;         /* estimated peak memory */
	double cpu_s;         /* estimated CPU time (DP solver) */
} kiln_compile_cost;

/* The largest unit_choices a compilation may plan: about 1.9 GB and 4 s of
 * CPU (4,096 layers on 2,048 stages at load.max_factor 3); the largest
 * shipped model plans 10,530. The per-unit-choice and per-frontier figures
 * are measured (docs/cli.md, "Cost bounds"). */
#define KILN_COMPILE_MAX_UNIT_CHOICES (1 << 20)
#define KILN_COMPILE_BYTES_PER_UNIT_CHOICE 1800.0
#define KILN_COMPILE_CPU_US_PER_UNIT_CHOICE 3.5
#define KILN_COMPILE_BYTES_PER_FRONTIER 1e6
#define KILN_COMPILE_CPU_US_PER_FRONTIER 20000.0

/* c's cost; c must have run the activations pass. Returns 0, or -1 on
 * exhaustion (the load buckets live in c's arena). */
int kiln_pipeline_cost(const kiln_compilation *c, kiln_compile_cost *out);

/* Runs the passes in order up to and including the pass named until (NULL:
 * every pass), verifying the graph after each. When dump_after names a pass,
 * the state after it is printed to dump (and the run goes at least that far).
 * Before the first planning pass the cost is estimated (kiln_pipeline_cost)
 * and a compilation past KILN_COMPILE_MAX_UNIT_CHOICES is refused. While it
 * runs with c->progress set, a status line shows the pass and its progress
 * (ir/progress.c). Returns 0, -1 on exhaustion or a verifier failure (a
 * compiler bug, reported on err), -2 when dump_after or until names no pass,
 * or -3 when the cost is over the bound (reported on err as
 * "PATH: error: ..."). */
int kiln_pipeline_compile(kiln_compilation *c, const char *until, const char *dump_after,
                          FILE *dump, FILE *err);

/* The front half (every pass up to "lower"), for commands that need only the
 * graph. Same statuses as kiln_pipeline_compile. */
int kiln_pipeline_run(const kiln_model *m, kiln_arena *a, const char *dump_after, FILE *dump,
                      FILE *err, kiln_ir_graph **out);

/* Prints the state of a compilation: the IR, then units, plan tables,
 * budgets and baselines as far as they exist (dump.c). */
void kiln_pipeline_dump(const kiln_compilation *c, FILE *out);

/* The planning passes, in pipeline order (plan.c, budget.c, baselines.c).
 * Each returns 0, or -1 on exhaustion. */
int kiln_pass_plan(kiln_compilation *c);
int kiln_pass_budget(kiln_compilation *c);
int kiln_pass_baselines(kiln_compilation *c);

/* Names of the passes, in order, for --help and --dump-after. */
size_t kiln_pipeline_pass_count(void);
const char *kiln_pipeline_pass_name(size_t i);

/* The parts of a kiln_compilation that passes read and write, one bit each
 * (docs/passes.md): model (the input), graph, sets (and n_sets), buckets
 * (and n_buckets), tables, pool, schedule, budgets, baselines. */
enum {
	KILN_PART_MODEL = 1u << 0,
	KILN_PART_GRAPH = 1u << 1,
	KILN_PART_SETS = 1u << 2,
	KILN_PART_BUCKETS = 1u << 3,
	KILN_PART_TABLES = 1u << 4,
	KILN_PART_POOL = 1u << 5,
	KILN_PART_SCHEDULE = 1u << 6,
	KILN_PART_BUDGETS = 1u << 7,
	KILN_PART_BASELINES = 1u << 8,
	KILN_PART_COUNT = 9,
	KILN_PART_ALL = (1u << 9) - 1
};

/* One row of the pass table: the pass's name, the parts it reads, creates
 * (absent before it, present after) and updates in place (present before,
 * the same pointer after, contents changed), and a line on what it does. */
typedef struct kiln_pass_info {
	const char *name;
	uint32_t reads, creates, updates;
	const char *does;
} kiln_pass_info;

/* Row i of the pass table, in run order; NULL past the end. Static. */
const kiln_pass_info *kiln_pipeline_pass(size_t i);
/* The name of one part bit ("graph", ...); "?" for anything else. */
const char *kiln_pipeline_part_name(uint32_t part);
/* Checks an order of passes (p[0..n), borrowed): every part a pass reads or
 * updates is the model or created by an earlier pass, and no pass creates a
 * part that exists. kiln_pipeline_compile checks its own table with it.
 * Returns 0, or -1 with one line per violation on err (may be NULL). */
int kiln_pipeline_order_check(const kiln_pass_info *const *p, size_t n, FILE *err);

/* activations.c */

/* Unit flags. */
enum {
	KILN_UNIT_LAYER_INPUT = 1u << 0, /* the layer's input: kept or offloaded, never recomputed */
	KILN_UNIT_COLLECTIVE = 1u << 1,  /* its recompute re-runs a collective (TP or EP): only
	                                    static plans, where every rank recomputes alike, may */
	KILN_UNIT_RNG = 1u << 2,         /* its recompute replays saved RNG state (dropout) */
	KILN_UNIT_EXPERT = 1u << 3       /* bytes scale with the load N */
};

/* One saved activation (or alias group) of a layer kind: what backward
 * needs and how it could be rebuilt. Arena-owned. */
typedef struct kiln_unit {
	const char *name;    /* the tensor's name, e.g. "moe.expert_up" */
	int32_t tensor;      /* canonical tensor in the representative layer */
	kiln_lin bytes;      /* per micro-batch; an alias group counts once */
	int32_t producer;    /* forward op that writes it */
	int32_t *sources;    /* units (indices in this set) a recompute reads */
	int32_t n_sources;
	int32_t *closure;    /* forward ops a recompute re-runs, in forward order:
	                        the producer and the producers of non-saved
	                        intermediates it needs */
	int32_t n_closure;
	kiln_lin workspace_bytes; /* non-saved intermediates materialised by the recompute */
	uint32_t flags;
} kiln_unit;

/* The units of one layer kind on one stage. Every layer of that kind on the
 * stage has the same units; layer is a representative. */
struct kiln_unit_set {
	int32_t stage;
	kiln_layer_kind kind; /* KILN_LAYER_DENSE or KILN_LAYER_MOE */
	int32_t layer;        /* representative, index into graph->layers */
	int32_t n_layers;     /* layers of this kind on the stage */
	kiln_unit *units;
	int32_t n_units;
};

/* The unit sets of every (stage, kind) that has layers, stage by stage.
 * Arena-owned. Returns 0 or -1 on exhaustion. */
int kiln_pass_activations(const kiln_ir_graph *g, kiln_arena *a, kiln_unit_set **out_sets,
                          int32_t *out_n);

/* The unit set of layer ly among sets (its stage's set of its kind), or
 * -1 when it has none. */
int32_t kiln_set_of_layer(const kiln_unit_set *sets, int32_t n_sets, const kiln_ir_layer *ly);

/* options.c */

typedef struct kiln_option_flags {
	bool offload;              /* offload allowed (false: the no-offload ablation) */
	bool collective_recompute; /* recomputes that re-run a collective allowed (static plans) */
} kiln_option_flags;

/* Builds the planning instance of one unit set at local expert load n:
 * per unit keep / recompute / offload with bytes, recompute time (the
 * closure's forward op times at n), copy times, grouped where recomputes
 * share ops, dominated choices dropped. The quantum is chosen so that the
 * layer's bytes span at most KILN_PLAN_MAX_QUANTA / 4 quanta. Arena-owned.
 * Returns 0 or -1. */
int kiln_pass_options(const kiln_ir_graph *g, const kiln_unit_set *set, double n,
                      const kiln_option_flags *flags, kiln_arena *a, kiln_plan_instance *out);

/* Exact bytes of a plan at load n: resident (kept units), saved (the rest),
 * offloaded, and transient (rebuilt units plus recompute workspace, live
 * during this layer's backward). actions: one kiln_action per unit. */
typedef struct kiln_plan_bytes {
	double resident, saved, offloaded, transient;
} kiln_plan_bytes;
void kiln_plan_bytes_at(const kiln_unit_set *set, const uint8_t *actions, double n,
                        kiln_plan_bytes *out);

/* Source tracking: 0 when every recomputed unit's sources are kept,
 * offloaded (reloaded before use) or themselves recomputed, and no unit
 * flagged LAYER_INPUT is recomputed; else -1. */
int kiln_plan_valid(const kiln_unit_set *set, const uint8_t *actions);

/* Per-unit actions of a plan point of an instance built from set (out has
 * set->n_units entries). */
void kiln_plan_actions(const kiln_plan_instance *in, const kiln_plan_point *p, uint8_t *out);

/* buckets.c */

/* The most load buckets kiln_plan_buckets makes (edges up to 25.6 and
 * max_factor, well past the frontend's largest load.max_factor, 16: 160
 * buckets). Every bucket array and bitset over one compilation's buckets
 * has room for this many; the blob's loader accepts up to
 * KILN_BLOB_MAX_BUCKETS. */
#define KILN_PLAN_MAX_BUCKETS 256

/* Load buckets: upper edges from 0 to load.max_factor, 0.25 apart below
 * 0.75, then 0.9, 1.0, 0.05 apart up to 1.5, 0.1 apart above, with
 * max_factor itself the last edge (docs/cost-model.md). */
int kiln_plan_buckets(double max_factor, kiln_arena *a, double **out_edges, int32_t *out_n);
/* Index of the bucket holding load factor r (rounding up); n when r exceeds
 * the last edge. */
int32_t kiln_plan_bucket_of(const double *edges, int32_t n, double r);

/* plan.c */

/* Table points per frontier: the exact frontier can hold a thousand points;
 * the table keeps the cheapest point at each 1/64 step of the maximal
 * saving, plus keep-all and the maximal-saving point. */
#define KILN_PLAN_TABLE_STEPS 64
/* Plans per table point that the schedule chooses among: the k cheapest by
 * the instance's cost saving at least the point's saving
 * (kiln_cost_kbest; docs/cost-model.md, "Points chosen by the schedule"). */
#define KILN_PLAN_KBEST 16

/* The plan table of one (unit set, bucket): its instance at the bucket's
 * upper load, its exact frontier (shared by tables with identical
 * instances), and the table points drawn from it, each with its exact bytes
 * at that load and the pool index of its per-unit actions. */
struct kiln_plan_table {
	const kiln_unit_set *set;
	double load_factor; /* the bucket's upper edge */
	double n;           /* local expert rows at that load (0 for dense layers) */
	kiln_plan_instance instance;
	const kiln_frontier *frontier;
	int32_t frontier_id;    /* index among the distinct frontiers */
	int32_t n_points;       /* table points, ascending saving */
	int32_t *point;         /* per table point: index into frontier->points */
	kiln_plan_bytes *bytes; /* per table point, exact at n */
	int32_t *plan;          /* per table point: index into the pool, or -1 without a pool */
	double *exposed_us;     /* per table point: the scheduled exposed time (interleave);
	                           NULL before that pass, or for tables it does not see */
};

/* Exposed time of table point p: the scheduled one once the interleave pass
 * has run, else the frontier's first estimate. */
/* The plan table of unit set `set` at load bucket `bucket` (tables are
 * set-major). */
static inline const kiln_plan_table *kiln_plan_table_of(const kiln_compilation *c, int32_t set,
                                                        int32_t bucket)
{
	return &c->tables[(size_t)set * (size_t)c->n_buckets + (size_t)bucket];
}

static inline double kiln_plan_table_exposed_us(const kiln_plan_table *t, int32_t p)
{
	return t->exposed_us ? t->exposed_us[p] : t->frontier->points[t->point[p]].exposed_us;
}

/* Fills t's table points from t->frontier (steps: table points per maximal
 * saving; 0 keeps every frontier point), with exact bytes at t->n and, when
 * pool is set, pool indices. Returns 0 or -1 on exhaustion. */
int kiln_plan_table_fill(kiln_plan_table *t, int32_t steps, kiln_plan_pool *pool, kiln_arena *a);

/* A plan table outside the compilation's own, for the static baselines
 * (baselines.c, adapipe.c): set's instance at load_factor (n local expert
 * rows, 0 for a dense set) under flags, its DP frontier and its table
 * points with exact bytes, no pool indices (plan[] is -1) and frontier_id
 * -1. The plan pass's interface for a table it does not own: no window
 * measurement, no scheduling. Arena-owned. Returns 0 or -1. */
int kiln_plan_table_static(const kiln_ir_graph *g, const kiln_unit_set *set, double load_factor,
                           double n, const kiln_option_flags *flags, kiln_arena *a,
                           kiln_plan_table *out);

/* The distinct per-unit action vectors of every frontier point and baseline. */
struct kiln_plan_pool {
	uint8_t **actions; /* actions[i]: one kiln_action per unit of set[i] */
	const kiln_unit_set **set;
	int32_t n, cap;
	int32_t *slots; /* open-addressing index over actions: pool index + 1, 0 empty */
	int32_t n_slots;
	int32_t n_frontiers; /* distinct frontiers */
};

/* Adds actions (copied) for set to the pool; returns its index or -1. */
int32_t kiln_plan_pool_add(kiln_plan_pool *p, kiln_arena *a, const kiln_unit_set *set,
                           const uint8_t *actions);

/* budget.c */

struct kiln_stage_budget {
	int32_t stage;
	double capacity_bytes; /* memory - reserved */
	double static_bytes;
	double inflight;
	double fixed_bytes;    /* per micro-batch activations no plan touches (embedding, head) */
	double steady_bytes;   /* what one in-flight micro-batch holds at load 1 under the steady plan */
	double steady_exposed_us; /* that plan's exposed time per micro-batch */
	int32_t *steady_point;    /* per unit set of the stage (in set order): frontier point at load 1 */
	double budget_bytes;   /* capacity - static - (inflight - 1) * steady: for the deciding micro-batch */
	double safety_factor;  /* largest bucket edge at which the maximal-saving plan fits; 0: none */
	bool steady_fits;      /* the steady state fits at all */
};

/* The cheapest stage-level choice: one frontier point per table (tables[k]
 * for the k-th unit set of a stage) such that inflight micro-batches holding
 * R = fixed + sum(layers * resident) each, plus the worst layer's transient,
 * fit in avail_bytes, and so do inflight - 1 of them beside reserve_bytes
 * (what a spiking micro-batch needs; 0 for none); cost = sum(layers *
 * exposed_us). Returns 0 with the choice in out_points (n entries), or 1
 * when nothing fits (out_points then holds the maximal-saving points).
 * O(product of frontier sizes). */
int kiln_budget_cheapest_fit(const kiln_plan_table *const *tables, int32_t n, double fixed_bytes,
                             double inflight, double avail_bytes, double reserve_bytes,
                             int32_t *out_points);

/* Stage resident bytes of one micro-batch at bucket b when each unit set of
 * stage s follows frontier point pts[k] (k over the stage's sets in order),
 * plus the transient of the worst layer; for budget.c and its tests. */
double kiln_budget_stage_bytes(const kiln_compilation *c, int32_t stage, int32_t bucket,
                               const int32_t *pts, double *out_transient);

/* The rows up to which an MoE set's stage is safe without the EP group's
 * fallback (docs/runtime.md, "Beyond the declared load"): within the
 * tables, the rows of the last bucket within the stage's safety_factor
 * (where its maximal-saving plan fits); where that is the last bucket, the
 * largest rows r, capped at UINT32_MAX, at which any choice of points of
 * the last bucket's tables, one per layer, each point's bytes exact at r
 * (every MoE set of the stage at the same load factor), plus its
 * transient, is at most budget_bytes: past the last bucket the runtime
 * chooses by the last bucket's figures, which understate the bytes, so
 * the only choice known to fit is every choice. 0 for a dense set or a
 * stage without a safety factor. Deterministic in the compilation;
 * O(64 bisection steps x the stage's table points). Returns 0, or -1 on
 * exhaustion. */
int kiln_budget_fit_rows(const kiln_compilation *c, int32_t set, uint64_t *out_rows);

/* baselines.c */

typedef enum {
	KILN_BASELINE_FULL_RECOMPUTE,
	KILN_BASELINE_MEGATRON,
	KILN_BASELINE_STATIC_AGGRESSIVE,
	KILN_BASELINE_ADAPIPE,
	KILN_BASELINE_COUNT
} kiln_baseline_kind;

/* A static policy: one action vector per unit set, the same at every load;
 * a Megatron recipe with block recompute gives the first block_layers
 * transformer layers of every model chunk on a stage their own plan. */
struct kiln_baseline {
	kiln_baseline_kind kind;
	const char *name;   /* "full-recompute", ... */
	const char *models; /* the peer flags or paper it models (megatron: the chosen flags) */
	int32_t *plan;      /* per unit set: pool index */
	int32_t
	    *head_plan; /* per unit set: pool index for the block's layers; NULL without a block */
	int32_t block_layers; /* layers per chunk under head_plan (0: none) */
	kiln_megatron recipe; /* megatron: the flags chosen (or the description's) */
	/* megatron: its offload groups' runs (kiln_megatron_actions), per
	 * graph layer per run a pool index in layer_plan (NULL rows: none) */
	int32_t *n_runs;
	int64_t **run_end;
	int32_t **layer_plan;
	int64_t searched;     /* megatron: recipes the search enumerated (0: the description's) */
	double search_cpu_s;  /* and its CPU time */
	double design_load; /* load factor it was tuned for */
	bool fits;          /* every stage fits at the design load (when false, the plan is
	                       the closest the rule gets: the run would go out of memory) */
};

/* The load the tuned static baselines (and the simulator's static kiln
 * ablation) are tuned for: the calm imbalance of a team's most loaded
 * device (passes/baselines.c). */
#define KILN_BASELINE_DESIGN_LOAD 1.2

/* A Megatron recipe as per-unit actions (docs/cost-model.md, "Baselines"):
 * per unit set the actions of the layers outside a block (tail) and, for
 * full recompute with the block method, of the block's layers (head; NULL
 * otherwise), with how many of the set's layers take each. Arena-owned. */
typedef struct kiln_megatron_actions {
	uint8_t **tail, **head;
	int32_t *n_tail, *n_head;
	bool fits;         /* every stage fits with every in-flight micro-batch at the load */
	double worst_us;   /* the objective: the slowest stage's compute plus exposed time
	                      per micro-batch at the load */
	double exposed_us; /* tie-break: exposed time summed over the stages */
	/* Megatron's offload groups (passes/baselines.c, stage_groups): per
	 * stage the micro-batches of an iteration in n_runs[s] runs of equal
	 * plans, run r ending before micro-batch run_end[s][r] (0 runs: every
	 * layer of a set takes tail/head); per graph layer of such a stage,
	 * outside a block, layer_actions[l][r] its actions in run r (NULL
	 * rows: tail/head). */
	int32_t *n_runs;
	int64_t **run_end;
	uint8_t ***layer_actions;
} kiln_megatron_actions;

/* The offload tuning the search tries on a recipe whose groups move
 * bytes (docs/cost-model.md, "Offload groups"): every fraction below with
 * every delta, delta = floor(unit * kiln_megatron_deltas[k]) bytes, unit
 * being what one micro-batch's groups on stage 0 move at fraction 1
 * (kiln_megatron_delta_unit); deltas only with pp >= 2. */
#define KILN_MEGATRON_N_FRACTIONS 4
#define KILN_MEGATRON_N_DELTAS 3
extern const double kiln_megatron_fractions[KILN_MEGATRON_N_FRACTIONS];
extern const double kiln_megatron_deltas[KILN_MEGATRON_N_DELTAS];
/* That unit for recipe r (its fraction and delta ignored) at load, into
 * *out_bytes (0: no group moves bytes on stage 0). c must have run the
 * budget pass. Returns 0, or -1 on exhaustion. */
int kiln_megatron_delta_unit(const struct kiln_compilation *c, const kiln_megatron *r, double load,
                             kiln_arena *a, double *out_bytes);

/* Graph layer l's position among the transformer layers of its model
 * chunk on its stage (0 for the first), or -1 for a layer that is not a
 * transformer layer: the index Megatron's checkpointed_forward counts
 * (megatron/core/recompute.py:157-181 at d98e8a64). */
int32_t kiln_megatron_chunk_pos(const kiln_ir_graph *g, int32_t l);

/* Whether graph layer l is among the first block_layers transformer layers
 * of its model chunk on its stage (Megatron's block method,
 * megatron/core/recompute.py:167-180). */
bool kiln_megatron_in_block(const kiln_ir_graph *g, int32_t l, int32_t block_layers);

/* Recipe r's actions on every unit set of c at load factor load (its
 * expert rows; offload's size threshold is judged there), and its fit and
 * objective, each scheduled exposed time from kiln_interleave_exposed at
 * load's bucket. Full uniform recompute in chunks of N > 1 layers takes
 * the full-recompute plan on every layer (tail) and is judged by its
 * chunks' bytes: one input kept per chunk, a chunk's layers rebuilt
 * together in its backward (passes/baselines.c, uniform_fits). c must have run the budget pass.
 * Returns 0, or -1 on exhaustion. */
int kiln_megatron_recipe_eval(const kiln_compilation *c, const kiln_megatron *r, double load,
                              kiln_arena *a, kiln_megatron_actions *out);

/* Search statistics of kiln_megatron_search. */
typedef struct kiln_megatron_search_stats {
	int64_t candidates; /* recipes enumerated after dominance pruning */
	int64_t fitting;    /* of them, fitting by bytes */
	int64_t scheduled;  /* distinct (unit set, actions) scheduled */
	double cpu_s;
} kiln_megatron_search_stats;

/* The strongest static recipe at load (docs/cost-model.md, "Baselines"):
 * over selective module sets with offload module sets, no recompute with
 * offload, and full recompute (uniform with 1 .. layers per checkpointed
 * chunk, or block with 1 .. layers - 1 per model chunk, with offloads on
 * the other layers; layers: the most transformer layers of one model
 * chunk on a stage), the one that fits with the
 * least objective (ties: less exposed time summed, then fewer flags); when
 * none fits, full uniform recompute (fits false). Into out_recipe and
 * out_actions; stats may be NULL. Returns 0, or -1 on exhaustion. */
int kiln_megatron_search(const kiln_compilation *c, double load, kiln_arena *a,
                         kiln_megatron *out_recipe, kiln_megatron_actions *out_actions,
                         kiln_megatron_search_stats *stats);

/* What runs beside a Megatron recipe and changes its search (the paged
 * stash, sim/policy.c; docs/simulator.md, "The paged stash"): modules it
 * leaves out, units held outside the recipe, and the bytes and time
 * charged beside it. Zero fields and NULL arrays change nothing. */
typedef struct kiln_megatron_beside {
	uint32_t no_recompute; /* KILN_MRC bits not searched */
	uint32_t no_offload;   /* KILN_MOF bits not searched */
	bool no_full;          /* full recompute not searched (nor its fallback) */
	bool no_offload_tuning; /* the offload fraction and delta grid not searched */
	/* per unit set (NULL entries: none), per unit: 1 for a unit held
	 * outside the recipe: always kept, its per-row bytes not resident */
	const uint8_t *const *outside;
	const double *reserved_bytes;  /* per stage: device bytes held all step */
	const double *transient_bytes; /* per unit set: added to each layer's transient */
	const double *stage_us;        /* per stage: time per micro-batch added to its compute */
} kiln_megatron_beside;

/* kiln_megatron_search with beside (NULL: none) in the fit and objective.
 * With no_full, the fallback when nothing fits is every module searched
 * (fits false). */
int kiln_megatron_search_beside(const kiln_compilation *c, double load,
                                const kiln_megatron_beside *beside, kiln_arena *a,
                                kiln_megatron *out_recipe, kiln_megatron_actions *out_actions,
                                kiln_megatron_search_stats *stats);

const char *kiln_baseline_name(kiln_baseline_kind k);

/* adapipe.c
 *
 * AdaPipe's partition (docs/cost-model.md, "AdaPipe's partition"): the
 * stage split and each stage's recomputation chosen jointly at
 * KILN_BASELINE_DESIGN_LOAD, by dynamic programming over stage boundaries. */

typedef struct kiln_adapipe kiln_adapipe; /* the stage cost model of one compilation */

/* Builds the stage cost model of c (borrowed, for x's life; the budget
 * pass must have run): per layer kind its recompute-only plan table at the
 * design load, one layer's time and weights, and the embedding's and the
 * head's. Arena-owned. Returns 0, or -1 on exhaustion. */
int kiln_adapipe_new(const kiln_compilation *c, kiln_arena *a, kiln_adapipe **out);

/* Time of one micro-batch's forward and backward (us) on pipeline stage s
 * holding the transformer layers [first, first + n) of the model, with the
 * cheapest recompute-only plan with which the stage's in-flight
 * micro-batches fit at the design load (the adapipe baseline's rule,
 * passes/baselines.c); INFINITY when none fits or the range is not one.
 * Costs are cached per (stage, dense layers, MoE layers). */
double kiln_adapipe_stage_us(kiln_adapipe *x, int32_t s, int64_t first, int64_t n);

/* A partition: layers per stage, each stage's time, the slowest and the
 * sum. kept is NULL when the search chose it, else why the model's own
 * split stands (interleaved schedule, work bound, nothing fits). */
typedef struct kiln_adapipe_split {
	int32_t n_stages;
	int64_t *layers;  /* per stage, arena-owned */
	double *stage_us; /* per stage (INFINITY: does not fit) */
	double max_us, sum_us;
	bool fits;        /* every stage has a fitting plan */
	const char *kept; /* static string or NULL */
} kiln_adapipe_split;

/* The partition with the least slowest stage and, among those, the least
 * sum of stage times (earliest boundaries on ties); every stage holds at
 * least one layer. Exact, O(p * L * (L - p + 1)) cost lookups. Returns 0,
 * or -1 on exhaustion. */
int kiln_adapipe_partition(kiln_adapipe *x, kiln_arena *a, kiln_adapipe_split *out);

/* adapipe's partition of c's model into *split and, when it differs from
 * the model's own split, the model with that split (an explicit
 * stage_layers, docs/model-format.md) in *m3, compiled into *c3 (arena a3)
 * with *c3_used set. Returns 0; -1 on exhaustion searching the partition;
 * -2 when the second compilation fails, -3 when it is over the cost bound
 * (kiln_pipeline_compile's errors on err). */
int kiln_adapipe_compile(const kiln_compilation *c, kiln_arena *a3, kiln_model *m3,
                         kiln_adapipe_split *split, kiln_compilation *c3, bool *c3_used, FILE *err);

/* verify.c */

/* The plan-table verifier, run by kiln_pipeline_compile after every pass
 * beside kiln_ir_graph_verify, on whatever c holds by then
 * (docs/passes.md, "The verifier"): every frontier's savings ascend
 * strictly from keep-all; every table's points
 * ascend through its frontier from keep-all, and once scheduled (interleave)
 * save strictly more exact bytes and cost no less scheduled time each; every
 * table point's plan is in the pool, of its set's units, the actions of its
 * frontier point and its bytes the plan's; every plan (pooled, table,
 * baseline) is one kiln_action per unit, recomputes no layer input and
 * passes source tracking, and an adaptive table's recomputes no collective
 * nor offloads under no_offload; every template holds exactly its plan's
 * offloads, reloads and recomputes and is a valid schedule
 * (kiln_schedule_verify), and every stage timeline names a template of its
 * stage. Returns 0, or -1 with one line per violation on err (may be NULL;
 * the first 20, then a count). */
int kiln_plan_verify(const kiln_compilation *c, FILE *err);

/* interleave.c: the scheduler's interface, in passes/schedule.h (the one
 * way every pass, view and the simulator gets a schedule). */
#include "passes/schedule.h"

#endif
