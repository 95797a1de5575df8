/* sim/sim.h: the iteration-level simulator (DESIGN.md section 9).
 *
 * Files, one idea each, grouped here as QBE's all.h does:
 *   loads.c     load profiles: per (iteration, micro-batch, layer) the load
 *               factor of every EP rank, deterministic by seed
 *   pipeline.c  1F1B and interleaved pipeline timing and memory over time
 *   policy.c    the policies: static plans, thresholds, kiln through the runtime
 *   oracle.c    the clairvoyant oracle: a stage's plans chosen knowing every load
 *   sim.c       the iteration loop
 *
 * The simulator depends on costmodel/ and ir/, and on the runtime only
 * through include/kiln/runtime.h.
 */
#ifndef KILN_SIM_H
#define KILN_SIM_H

#include <stdint.h>
#include <stdio.h>

#include "ir/ir.h"
#include "kiln/runtime.h"

struct kiln_compilation;

/* ---------------------------------------------------------------- loads.c */

typedef enum {
	KILN_LOAD_PAPER,      /* 97.1% of iterations below 1.2x job-wide, 2.9% spikes up to 2.6x */
	KILN_LOAD_BALANCED,   /* every rank at 1.0 */
	KILN_LOAD_HOT_EXPERT, /* one expert draws a large share; its rank is hot */
	KILN_LOAD_HOT_RANK,   /* one EP rank's experts all run hot */
	KILN_LOAD_ROTATING,   /* the hot rank moves every iteration */
	KILN_LOAD_BURST,      /* balanced, with short bursts of heavy imbalance */
	KILN_LOAD_ZIPF,       /* expert popularity ~ Zipf(alpha), re-drawn per micro-batch */
	KILN_LOAD_TRACE       /* a CSV trace (docs/simulator.md, "Traces") */
} kiln_load_kind;

typedef struct kiln_load_trace kiln_load_trace; /* loads.c */

/* A parsed load profile. Arena-owned. */
typedef struct kiln_load_profile {
	kiln_load_kind kind;
	const char *name;       /* as given: "paper", "zipf:1.2", a file path */
	double alpha;           /* zipf */
	double max_factor;      /* synthetic profiles never exceed this (load.max_factor) */
	const kiln_load_trace *trace;
	const double *zipf_w;   /* zipf: zipf_w[j] = j^-alpha for j = 1..zipf_n, arena-owned */
	const double *zipf_cum; /* zipf: zipf_cum[j] = zipf_w[1] + ... + zipf_w[j] */
	int32_t zipf_n;
} kiln_load_profile;

/* Parses PROFILE ("paper", "balanced", "hot-expert", "hot-rank",
 * "rotating", "burst", "zipf:ALPHA") or a CSV trace path (a spec that
 * contains '/' or ends in ".csv"). Errors go to err as "kilnc: error: ..."
 * or "FILE:LINE: error: ..." and return -1. max_factor (>= 1) caps every
 * synthetic load factor. spec is borrowed; *out and the trace live in a. */
int kiln_load_parse(const char *spec, double max_factor, kiln_arena *a, FILE *err,
                    kiln_load_profile **out);

/* The shape one sample is drawn for. */
typedef struct kiln_load_shape {
	int32_t ep;               /* EP ranks of one MoE layer */
	int32_t experts_per_rank; /* local experts per rank */
	int32_t top_k;
	int64_t tokens;           /* tokens of one micro-batch entering one EP group */
	/* Optional (0 means 1): how many micro-batches per iteration and MoE
	 * layers the caller samples, so that the paper profile can place an
	 * iteration's spike on one of them (docs/simulator.md). */
	int32_t microbatches;
	int32_t layers;
} kiln_load_shape;

/* Load factors of every EP rank (out[ep]: rows / balanced rows) for one
 * (iteration, micro-batch, MoE layer, EP group), deterministic in (seed and
 * these indices): the same call gives the same numbers whatever was drawn
 * before. Synthetic profiles conserve rows (the mean over ranks is 1) and
 * stay within [0, max_factor]; traces give 1.0 where they have no row.
 * Never allocates; safe from many threads. O(ep) (zipf: O(ep *
 * experts_per_rank); traces: O(log rows + ep)). */
void kiln_load_sample(const kiln_load_profile *p, const kiln_load_shape *shape, uint64_t seed,
                      int64_t iteration, int32_t microbatch, int32_t layer, int32_t group,
                      double *out);

/* Rows (tokens times routing choices) of every expert for the same sample
 * as kiln_load_sample: out[r * e + j] for local expert j of EP rank r
 * (e = experts_per_rank, 0 counting as 1; ep * e entries). Consistent
 * with kiln_load_sample: rank r's rows add up to its factor times the
 * balanced rows tokens * top_k / ep (up to float rounding, 1e-12 relative,
 * tested). Profiles with per-expert structure give it as drawn (zipf: each
 * expert's Zipf share, its rank's cap applied to its experts in
 * proportion; hot-expert: the hot expert lifts its rank, every other
 * expert of the layer alike); token traces of one column per local expert
 * give the columns as recorded (experts beyond the columns 0); the rank-
 * level profiles (paper, balanced, hot-rank, rotating, burst), factor
 * traces, one-column token traces and ranks without a row spread a rank's
 * rows evenly over its experts (docs/simulator.md, "Per-expert rows").
 * Deterministic in the seed and indices, never allocates, safe from many
 * threads. O(ep * e) (traces: O(log rows + ep * e)). */
void kiln_load_sample_experts(const kiln_load_profile *p, const kiln_load_shape *shape,
                              uint64_t seed, int64_t iteration, int32_t microbatch, int32_t layer,
                              int32_t group, double *out);

/* What a CSV trace may hold, for the reader (kiln_load_parse) and the
 * writer (kiln_load_write_csv) alike: a regular file of at most this many
 * bytes and data rows. */
#define KILN_LOAD_TRACE_MAX_BYTES ((int64_t)256 << 20)
#define KILN_LOAD_TRACE_MAX_ROWS 10000000

/* Writes the samples of p for group 0 as a CSV trace (docs/simulator.md,
 * "Traces"): a comment line, the header iteration,microbatch,layer,rank,factor,
 * then one row per (iteration below iterations, micro-batch, MoE layer, EP
 * rank) of shape, factors printed exactly (%.17g). Returns 0, or -1 when
 * writing failed or the rows exceed KILN_LOAD_TRACE_MAX_ROWS (nothing is
 * written then). */
int kiln_load_write_csv(const kiln_load_profile *p, const kiln_load_shape *shape, uint64_t seed,
                        int64_t iterations, FILE *f);
/* The data rows kiln_load_write_csv writes: iterations x micro-batches x
 * MoE layers x EP ranks of shape, INT64_MAX when that overflows. O(1). */
int64_t kiln_load_csv_rows(const kiln_load_shape *shape, int64_t iterations);
/* The exact bytes kiln_load_write_csv writes, found by formatting every row
 * without writing it; -1 when the rows exceed KILN_LOAD_TRACE_MAX_ROWS (so
 * the count costs at most that many rows) or the shape cannot be written. */
int64_t kiln_load_csv_bytes(const kiln_load_profile *p, const kiln_load_shape *shape, uint64_t seed,
                            int64_t iterations);

/* What a parsed trace covers: the iterations first_iteration ..
 * first_iteration + iterations - 1 (replayed modulo iterations), layer
 * indices below layers (replayed modulo layers), the largest micro-batch and
 * rank index plus one, the data rows, and the value columns per row (tokens:
 * 1 when they are tokens per local expert, 0 for one load factor). */
typedef struct kiln_load_trace_info {
	int64_t first_iteration, iterations, rows;
	int32_t microbatches, layers, ranks;
	int32_t values;
	int tokens;
} kiln_load_trace_info;

/* Describes t (borrowed) into *out. */
void kiln_load_trace_describe(const kiln_load_trace *t, kiln_load_trace_info *out);

/* Checks t against the shape it replays on (docs/simulator.md, "Traces
 * checked against the model") and reports on err as "PATH:LINE: warning:
 * ..." (the replay goes on: rows it ignores, token counts that do not add up
 * to the routed rows, factors that do not average 1 or exceed what routing
 * can produce, iterations, micro-batches and ranks left out) or "PATH:LINE:
 * error: ..." (a replay would be meaningless: more token columns than
 * experts per rank, no row within the shape). One line per kind of
 * finding, its first occurrence with a count. Returns the number of errors.
 * O(rows). */
int kiln_load_trace_check(const kiln_load_trace *t, const kiln_load_shape *shape, FILE *err);

/* The largest load factor routing can produce on one rank of shape s: every
 * token sends its top_k rows to distinct experts, at most
 * min(top_k, experts_per_rank) of them on one rank, so a rank receives at
 * most tokens * min(top_k, experts_per_rank) rows against tokens * top_k /
 * ep balanced: ep * min(top_k, experts_per_rank) / top_k (1 for ep 1). The
 * simulator clamps every sampled factor to [0, this]. */
double kiln_sim_load_factor_max(const kiln_load_shape *s);

/* ---------------------------------------------------------------- sim.c (shape) */

/* The load shape the simulator samples for c's model: EP ranks, local
 * experts, top-k, tokens of a micro-batch entering one EP group, micro-
 * batches per iteration and MoE layers. */
void kiln_sim_load_shape(const struct kiln_compilation *c, kiln_load_shape *out);

/* ---------------------------------------------------------------- pipeline.c */

typedef enum { KILN_PIPE_1F1B, KILN_PIPE_INTERLEAVED } kiln_pipe_kind;

/* One pipeline's work for one iteration: p stages, m micro-batches, v model
 * chunks per stage (1 unless interleaved; chunk c of stage s holds virtual
 * stage c * p + s); durations per (stage, chunk, micro-batch) in
 * microseconds, finite and >= 0: the forward of chunk c of micro-batch i on
 * stage s is fwd_us[(s * v + c) * m + i], and likewise bwd_us. A transfer
 * between two different stages takes p2p_us (0 for none); a hand-off within
 * one stage (its own forward to its backward, or chunk to chunk when p = 1)
 * takes none. Borrowed for the duration of each call. */
typedef struct kiln_pipe_op kiln_pipe_op;
typedef struct kiln_pipe_work {
	kiln_pipe_kind kind;
	int32_t p, m, v;
	const double *fwd_us;
	const double *bwd_us;
	double p2p_us;
	/* EP overlap (Megatron's --overlap-moe-expert-parallel-comm): NULL for
	 * none. Else every stage runs one warm-up forward more (capped at m *
	 * v), and each steady-state forward (at warm-up + 2j of its stage's
	 * order, j < m * v - warm-up; the order's forward then backward there,
	 * of different (chunk, micro-batch)) runs with that backward as one
	 * combined step:
	 * both start when the stage is free and the inputs of both have
	 * arrived, both end pair_us(pair_ctx, forward, backward) us later
	 * (finite and >= 0), when both outputs leave. */
	double (*pair_us)(const void *ctx, const kiln_pipe_op *fwd, const kiln_pipe_op *bwd);
	const void *pair_ctx;
} kiln_pipe_work;

/* One scheduled op (a combined step's forward and backward both carry its
 * start and end). */
struct kiln_pipe_op {
	int32_t stage, chunk, microbatch;
	int backward;
	double start_us, end_us;
};

/* The schedule of one iteration: ops per stage in execution order, the
 * makespan, and per stage its busy time and the most micro-batch chunks
 * held at once, a chunk being held from its forward's start to its
 * backward's end (in flight). */
typedef struct kiln_pipe_result {
	kiln_pipe_op *ops;      /* 2 * p * v * m, stage-major, each stage's in order */
	double makespan_us;
	double *busy_us;        /* per stage */
	int32_t *peak_inflight; /* per stage, in chunks */
} kiln_pipe_result;

/* Warm-up forwards of stage s before its first backward: min(p - s - 1, m)
 * for 1F1B, min(2 * (p - s - 1) + (v - 1) * p, m * v) for interleaved (as
 * Megatron-core's get_pp_rank_microbatches), one more (within the same
 * cap) with EP overlap (w->pair_us). w must be valid and s in [0, p). */
int32_t kiln_pipe_warmup(const kiln_pipe_work *w, int32_t s);

/* Writes the execution order of every stage into ops (2 * p * v * m,
 * stage-major; start and end zero): Megatron's 1F1B (warm-up forwards, then
 * one forward one backward, then the cool-down backwards) or its
 * interleaved 1F1B (forward k runs chunk (k mod (p * v)) / p of micro-batch
 * (k / (p * v)) * p + k mod p, backward k the mirrored chunk
 * v - 1 - that). w must be valid (kiln_pipe_simulate checks it). */
void kiln_pipe_order(const kiln_pipe_work *w, kiln_pipe_op *ops);

/* Times ops, an execution order for w (each stage's 2 * v * m ops holding
 * every (chunk, micro-batch, direction) of that stage once, stage-major):
 * every op starts when its stage is free and its inputs have arrived (the
 * forward from the previous virtual stage, the backward from the next one
 * and from its own forward) and runs for its duration. Fills the ops' start
 * and end, and out (out->ops = ops, borrowed from the caller; busy_us and
 * peak_inflight allocated in a). Returns 0, or -1 with a message on err
 * (when not NULL) for invalid work, an order that is not a permutation of
 * the stage's ops, an order that deadlocks, or exhaustion. O(p * v * m)
 * time; its scratch memory (malloc) is freed before returning. */
int kiln_pipe_run(const kiln_pipe_work *w, kiln_pipe_op *ops, kiln_arena *a, FILE *err,
                  kiln_pipe_result *out);

/* Simulates the schedule: checks w, then kiln_pipe_order and kiln_pipe_run
 * (Megatron's 1F1B needs v = 1; its interleaved 1F1B needs m a multiple of
 * p). Returns 0, or -1 on exhaustion or inconsistent work (p, m or v below
 * 1, a NULL or negative or non-finite duration, ...), reported on err when
 * not NULL. The result lives in a (2 * p * v * m ops and 2 * p numbers, per
 * call: loops over many iterations should use an arena per iteration). */
int kiln_pipe_simulate(const kiln_pipe_work *w, kiln_arena *a, FILE *err, kiln_pipe_result *out);

/* Peak bytes of stage s over the schedule when micro-batch chunk (c, i)
 * holds bytes[(s * v + c) * m + i] from its forward's start to its
 * backward's end, on top of base_bytes; a chunk released at time t makes
 * room for one taken at t. r is kiln_pipe_simulate's (or kiln_pipe_run's)
 * result for w; bytes is borrowed. O(v * m), no allocation. Returns -1 when
 * bytes or r is NULL or s is out of range. */
double kiln_pipe_peak_bytes(const kiln_pipe_work *w, const kiln_pipe_result *r, int32_t s,
                            const double *bytes, double base_bytes);


/* ---------------------------------------------------------------- policy.c */

/* The policies, side by side (docs/simulator.md, "Policies"): name, and the
 * peer flags or paper each models. */
#define KILN_SIM_POLICIES(X)                                                                       \
	X(UNBOUNDED, "unbounded", "infinite memory, everything kept: the upper bound")             \
	X(FULL_RECOMPUTE, "full-recompute",                                                        \
	  "Megatron --recompute-granularity full --recompute-method uniform")                      \
	X(MEGATRON, "megatron",                                                                    \
	  "Megatron-Core: the description's recipe, else the best static recipe at load 1.2")      \
	X(MEGATRON_CAPACITY, "megatron-capacity",                                                  \
	  "Megatron-Core token dropping at an expert capacity factor, padded to capacity")         \
	X(STATIC_AGGRESSIVE, "static-aggressive", "keep nearly everything, static")                \
	X(ADAPIPE, "adapipe",                                                                      \
	  "AdaPipe (ASPLOS'24): stage partition and per-stage recompute by DP at load 1.2")        \
	X(MINDSPEED, "mindspeed",                                                                  \
	  "MindSpeed 2.1.0_core_r0.8.0 (1e898a29) --moe-adaptive-recompute-activation: the "       \
	  "whole MoE layer checkpointed when the previous forward's largest expert exceeded 2x "   \
	  "the balanced per-expert count; with --recompute-activation-function --recompute-norm "  \
	  "and, where needed to fit at load 1.2, --recompute-method block --recompute-num-layers " \
	  "N")                                                                                     \
	X(MEGATRON_PAGED_STASH, "megatron-paged-stash",                                            \
	  "Megatron-Core --moe-paged-stash with its capacity, CUDA and CPU buffer factors chosen " \
	  "at load 1.2 (the description's when given) and a recompute/offload recipe beside it: "  \
	  "expert activations in 64-row pages, spill to pinned host, the step rerun once "         \
	  "dropless on overflow")                                                                  \
	X(KILN, "kiln", "kiln's runtime on the compiled blob")                                     \
	X(KILN_NO_OFFLOAD, "kiln:no-offload", "kiln without offloading (recompute only)")          \
	X(KILN_NO_ADAPTIVE, "kiln:no-adaptive", "kiln's plan for load 1.2 at every load (static)") \
	X(KILN_NO_OVERLAP, "kiln:no-overlap",                                                      \
	  "kiln without dual-batch overlap (serial extra work)")                                   \
	X(KILN_STATIC_SERIAL, "kiln:no-adaptive+no-overlap",                                       \
	  "kiln's per-unit plan for load 1.2, static and serial: the first ablation step")         \
	X(ORACLE, "oracle",                                                                        \
	  "clairvoyant: every load of the iteration known in advance, each micro-batch's plans "   \
	  "from kiln's plan tables by an exact DP over its layers, the micro-batches of a "        \
	  "stage by the best common cap and coordinate descent")

typedef enum {
#define X(id, name, models) KILN_SIM_##id,
	KILN_SIM_POLICIES(X)
#undef X
	KILN_SIM_POLICY_COUNT
} kiln_sim_policy_kind;

const char *kiln_sim_policy_name(kiln_sim_policy_kind k);
const char *kiln_sim_policy_models(kiln_sim_policy_kind k);
/* The policy named s, or -1. "megatron-selective" is an alias of
 * "megatron" (whose search covers every module set it tried), and
 * "megatron-capacity:CF" names megatron-capacity at capacity factor CF
 * (a number in (0, KILN_SIM_MAX_CAPACITY_FACTOR]), stored in *out_cf when out_cf is set; without
 * ":CF", *out_cf is 0 (the default: the description's factor, else 1). */
int kiln_sim_policy_parse(const char *s);
int kiln_sim_policy_parse_cf(const char *s, double *out_cf);
/* The largest capacity factor megatron-capacity:CF takes (64 times the
 * balanced rows per expert: past any load a shipped profile produces). */
#define KILN_SIM_MAX_CAPACITY_FACTOR 64
/* Policies one simulation runs side by side at most (--policy P,P,...). */
#define KILN_SIM_MAX_POLICIES 64
/* The capacity factor megatron-capacity runs at: cf when positive, else
 * the description's moe_expert_capacity_factor, else 1. */
double kiln_sim_capacity_factor(const kiln_model *m, double cf);

/* What one layer's decision costs one device for one micro-batch. */
typedef struct kiln_sim_choice {
	double resident_bytes;  /* held from the layer's forward to its backward */
	double transient_bytes; /* extra during the layer's backward (rebuilt units, workspace) */
	double workspace_bytes; /* of which the recompute workspace */
	/* Megatron's uniform chunks (--recompute-method uniform
	 * --recompute-num-layers N > 1): 1 for a chunk's first layer, 2 for
	 * the others, 0 outside one. A chunk's layers are rebuilt together in
	 * its backward, so the simulator adds their transients (the largest
	 * workspace once): sim.c, run_rank. */
	int chunk;
	double exposed_us;      /* extra time on the critical path */
	double recompute_us;    /* of which recompute */
	double copy_us;         /* of which copies (exposed share) */
	int over_budget;        /* kiln: nothing fitted (best effort) */
} kiln_sim_choice;

typedef struct kiln_sim_policy kiln_sim_policy;

/* Prepares policy k for compilation c (finished, borrowed) and, for the kiln
 * policies, the runtime handle rt on c's blob (borrowed; for
 * kiln:no-offload, c and rt are the compilation without offloading and its
 * blob). Precomputes static plans' exposed times per load bucket.
 * Arena-owned; release caches with kiln_sim_policy_free. Returns 0, or -1
 * with a message on err. */
int kiln_sim_policy_new(kiln_sim_policy_kind k, const struct kiln_compilation *c, const kiln_rt *rt,
                        double capacity_factor, kiln_arena *a, FILE *err, kiln_sim_policy **out);
void kiln_sim_policy_free(kiln_sim_policy *p);

/* mindspeed's trigger: the whole MoE layer is checkpointed when the
 * previous forward's largest per-expert count exceeded this multiple of
 * the balanced per-expert count (docs/simulator.md, "Policies"). */
#define KILN_SIM_MINDSPEED_TRIGGER 2.0

/* Whether policy p decides by a trigger on the previous forward's per-
 * expert counts (mindspeed), and then the multiple of the balanced
 * per-expert rows it fires above into *out_multiple. The simulator keeps
 * the trigger's state (sim.c) and decides its MoE layers through
 * kiln_sim_policy_decide_triggered. Returns 1 or 0. */
int kiln_sim_policy_trigger(const kiln_sim_policy *p, double *out_multiple);

/* A triggered policy's decision for unit set `set` at n local expert rows,
 * of model layer `layer`, with its trigger fired (triggered 1: the whole
 * MoE layer recomputed) or not (its selective plan); dense sets always
 * take the latter, and the layers it recomputes in full (below) full
 * recompute. Like kiln_sim_policy_decide, it ignores free memory. */
void kiln_sim_policy_decide_triggered(const kiln_sim_policy *p, int32_t set, int32_t layer,
                                      double n, int triggered, kiln_sim_choice *out);

/* The layers a static policy recomputes in full beside its plan (one
 * mechanism, sim/policy.c): mindspeed's --recompute-num-layers (block
 * method), how many model layers at the start of every stage it recomputes
 * in full, the fewest with which every stage fits at
 * KILN_BASELINE_DESIGN_LOAD (the others take the trigger and the selective
 * plan); megatron's --recompute-method block --recompute-num-layers N, N;
 * -1 for a policy without such layers. */
int32_t kiln_sim_policy_full_layers(const kiln_sim_policy *p);

/* One decision: unit set `set` of the compilation (model layer `layer`) at
 * n local expert rows, with free_bytes free on the device, pending
 * micro-batches still to start (1F1B warm-up), and held_bytes already held
 * by this micro-batch on the stage. */
void kiln_sim_policy_decide(const kiln_sim_policy *p, int32_t set, int32_t layer, double n,
                            double free_bytes, uint32_t pending, uint32_t microbatch,
                            double held_bytes, kiln_sim_choice *out);

/* kiln_sim_policy_decide with the rows of every rank of the EP group
 * (group_size entries; kiln_query.group_rows), so that the runtime may take
 * the group's fallback (KILN_PLAN_GROUP_FALLBACK), priced as the
 * full-recompute policy prices that layer: its plan scheduled at the
 * bucket of n (the last beyond it). Static policies ignore the counts. */
void kiln_sim_policy_decide_group(const kiln_sim_policy *p, int32_t set, int32_t layer, double n,
                                  double free_bytes, uint32_t pending, uint32_t microbatch,
                                  double held_bytes, const uint32_t *group_rows, int32_t group_size,
                                  kiln_sim_choice *out);

/* For a static policy: the two lines of its plan's bytes for unit set
 * `set`, base + per_n * n for what it keeps (resident) and for its backward
 * transient, each the larger over its plans (mindspeed has two);
 * every decision of set at n rows keeps at most res_base + res_per_n * n
 * plus one byte of rounding, and likewise for the transient. Returns 0, or
 * -1 for an adaptive policy. */
int kiln_sim_policy_bytes_bound(const kiln_sim_policy *p, int32_t set, double *res_base,
                                double *res_per_n, double *tr_base, double *tr_per_n);

/* megatron-paged-stash (docs/simulator.md, "The paged stash"): Megatron-
 * Core's flags, as Megatron-LM megatron/core/transformer/transformer_config.py
 * (commit d98e8a6) declares them. KILN_SIM_STASH_DEFAULTS is Megatron-Bridge's
 * DeepSeek-V3 recipe (src/megatron/bridge/perf_recipes/deepseek/common.py:63-69,
 * commit 067f987), the grid's starting point; without flags the policy
 * chooses them at the design load (docs/simulator.md, "The paged stash"). */
typedef struct kiln_sim_stash_flags {
	double rank_capacity_factor; /* --moe-expert-rank-capacity-factor (> 0) */
	double cuda_factor;          /* --moe-paged-stash-buffer-size-factor-cuda (>= 0:
	                                sized from the balanced rows; negative is refused) */
	double cpu_factor;           /* --moe-paged-stash-buffer-size-factor-cpu (0: no host
	                                buffer, so no spill) */
	int32_t page_rows;           /* --moe-paged-stash-page-size */
	int32_t align_rows;          /* the dispatcher's per-expert alignment: 256 with
	                                --use-transformer-engine-op-fuser */
} kiln_sim_stash_flags;

#define KILN_SIM_STASH_DEFAULTS ((kiln_sim_stash_flags){1.5, 1.2, 1.0, 64, 256})

/* One stage's paged stash as Megatron sizes it, for its MoE layers. */
typedef struct kiln_sim_stash {
	kiln_sim_stash_flags flags;
	double row_bytes;   /* bytes of one row over the units Megatron pages (the experts'
	                       fc1 input and probabilities, fc1 output, activation output) */
	double budget_rows; /* the rank's receive budget: CF * balanced rows, rounded up to
	                       align_rows; more padded rows drop tokens (a rerun) */
	double avg_rows;    /* floor(budget_rows / CF): Megatron's "average" rows */
	int64_t cuda_pages; /* ceil(int(W * L * avg_rows * cuda_factor) / page_rows) */
	int64_t host_pages; /* likewise with cpu_factor; 0 when it is 0 */
	double cuda_bytes;  /* device memory the CUDA pages take, held all the time */
	double host_bytes;  /* pinned host memory the host pages take */
	int32_t experts;    /* local experts per rank */
} kiln_sim_stash;

/* 0 and the stash of stage s in *out for megatron-paged-stash's first
 * attempt (not its rerun); -1 for every other policy, or a stage without
 * MoE layers. */
int kiln_sim_policy_stash(const kiln_sim_policy *p, int32_t s, kiln_sim_stash *out);

/* The rows the dispatcher hands one rank's experts for `rows` routed rows:
 * each local expert's rows rounded up to align_rows, the rows spread over
 * the experts as evenly as integers allow (q + 1 rows on rows mod E of
 * them, q = floor(rows / E) on the rest; rows rounded up to an integer).
 * The simulator uses kiln_sim_stash_padded_rows_of with the experts'
 * shares of the load profile; this is its spread without them. */
double kiln_sim_stash_padded_rows(const kiln_sim_stash *st, double rows);

/* The same with expert j taking the share shares[j] of the rows
 * (st->experts of them, summing to 1; kiln_load_sample_experts
 * normalised): the rows, rounded up to an integer, apportioned to whole
 * rows by largest remainder (even shares: kiln_sim_stash_padded_rows's
 * spread), each expert's rounded up to align_rows. NULL shares, or more
 * than KILN_SIM_STASH_MAX_EXPERTS experts: kiln_sim_stash_padded_rows.
 * O(experts^2) at most; never allocates. */
#define KILN_SIM_STASH_MAX_EXPERTS 1024
double kiln_sim_stash_padded_rows_of(const kiln_sim_stash *st, double rows, const double *shares);

/* Pages one stashed tensor of padded_rows rows takes: ceil(rows /
 * page_rows), as Megatron's copy kernel asks the free list for. */
int64_t kiln_sim_stash_pages(const kiln_sim_stash *st, double padded_rows);

/* As kiln_sim_policy_new, with megatron-paged-stash's flags, run as given
 * (NULL: the description's stash keys kept and the other factors chosen
 * at KILN_BASELINE_DESIGN_LOAD; other policies ignore them). Bad flags
 * are an error on err. */
int kiln_sim_policy_new_stash(kiln_sim_policy_kind k, const struct kiln_compilation *c,
                              const kiln_rt *rt, double capacity_factor,
                              const kiln_sim_stash_flags *flags, kiln_arena *a, FILE *err,
                              kiln_sim_policy **out);

/* megatron-paged-stash: its flags as a command line carries them, the
 * stash's (--moe-paged-stash --moe-expert-rank-capacity-factor ...) then
 * the recompute and offload flags of the recipe beside it, and in *fits
 * (when not NULL) whether every stage fits at the design load with its
 * stash taking that load without dropped rows or overflow; NULL (and 0)
 * for every other policy. Owned by p. */
const char *kiln_sim_policy_recipe(const kiln_sim_policy *p, int *fits);

/* One MoE layer's stash on one device, at rows n split over its experts
 * by shares (kiln_sim_stash_padded_rows_of), with forward f_us and
 * backward b_us (0 when untimed): the pages go to the CUDA buffer when
 * its free pages suffice, else to the host buffer, else the device
 * overflows (Megatron's paged_stash_copy_kernel, moe/ops/paged_stash.py:
 * 13-144: a whole tensor on one side, pages from a free list). Rows the
 * budget cannot take are dropped (a rerun). *cuda and *host are the
 * micro-batch's pages, used_c and used_h the window's before it. Returns
 * the exposed time of its copy kernels (sim/policy.c, stash_copy_us):
 * each holds its SMs for the whole copy, so none hides under compute;
 * into device pages the stash and the reload each read and write the
 * bytes in HBM, into host pages each takes the slower of one HBM pass and
 * the link (d2h out, h2d back). Sets *overflowed (after
 * which the device stashes nothing more this step) and *dropped, adds
 * spilled bytes to *spilled. Never allocates. */
double kiln_sim_stash_place(const kiln_sim_stash *st, const kiln_hardware *hw, double n,
                            const double *shares, int64_t *cuda, int64_t *host, int64_t used_c,
                            int64_t used_h, int *overflowed, double *spilled, int *dropped);

/* megatron-paged-stash's rerun: the same recipe with the stash off and no
 * capacity (dropless), every unit at its actual rows; NULL for every other
 * policy. Owned by p. */
const kiln_sim_policy *kiln_sim_policy_rerun(const kiln_sim_policy *p);
/* The expert rows a rank of unit set `set` processes when n are routed to
 * it: megatron-capacity pads every expert to its capacity, so cf times the
 * balanced rows whatever the load (moe_utils.py:1019-1077,
 * apply_capacity with pad_to_capacity); n for every other policy. */
double kiln_sim_policy_rows(const kiln_sim_policy *p, int32_t set, double n);
/* A rank's n routed rows (a load factor times the balanced rows) as the
 * whole rows a query and a stash count: ceil(n - 1e-9), the margin taking
 * up the product's rounding. */
double kiln_sim_whole_rows(double n);
/* megatron's and megatron-capacity's recipe as Megatron command-line
 * flags (policy-owned); NULL for every other policy. */
const char *kiln_sim_policy_flags(const kiln_sim_policy *p);
/* megatron-capacity's capacity factor; 0 for every other policy. */
double kiln_sim_policy_cf(const kiln_sim_policy *p);

/* Token dropping over n_experts experts holding rows[0 .. n_experts)
 * routed rows each, against a capacity of capacity_rows per expert (cf
 * times the balanced rows tokens * top_k / experts, Megatron's
 * get_capacity, moe_utils.py:248-266): the rows kept and dropped, summed
 * (kept + dropped = the routed rows). */
void kiln_sim_capacity_drop(const double *rows, int32_t n_experts, double capacity_rows,
                            double *out_kept, double *out_dropped);

/* A bucket set (kiln_sim_policy_exposed_bound): bucket k is bit
 * k % KILN_SIM_BUCKET_WORD_BITS of word k / KILN_SIM_BUCKET_WORD_BITS of
 * uint64_t words, with room for every bucket a compilation has
 * (KILN_PLAN_MAX_BUCKETS, passes/passes.h). */
#define KILN_SIM_BUCKET_WORD_BITS 64

/* For a static policy (every policy but the kiln ones that decide through
 * the runtime): *out is the largest exposed time (serial time for the
 * serial ablation) of its decision for unit set `set` over the load
 * buckets in the bitset `buckets` (a bucket set, KILN_PLAN_MAX_BUCKETS
 * bits), taking mindspeed's untriggered plan when cold
 * and its triggered plan when hot. It does not depend on free
 * memory, so it is at least the exposed time of every decision at a load
 * in those buckets. The statistical method times a layer by it
 * (docs/simulator.md, "Scale"). Returns 0, or -1 for an adaptive policy (no
 * such bound: its time depends on free memory). */
int kiln_sim_policy_exposed_bound(const kiln_sim_policy *p, int32_t set, const uint64_t *buckets,
                                  int cold, int hot, double *out);

/* ---------------------------------------------------------------- price.c */

/* What a plan of kiln's tables costs and holds, as every policy and the
 * oracle price and size it (docs/simulator.md, "What a static plan costs"). */

/* The load bucket a static policy's decision for unit set `set` at n rows
 * takes (the bucket holding the load factor r = n / balanced rows, the last
 * beyond it), with r. */
int32_t kiln_sim_policy_bucket(const struct kiln_compilation *c, int32_t set, double n, double *r);

/* A plan's bytes at n rows as two lines, base + per_n * n: its kept
 * units (resident), and its recomputed and offloaded ones with their
 * workspace (transient; an offload's workspace is zero). The sums are
 * taken once per plan, in whole bytes, so a decision costs two products. */
typedef struct kiln_sim_plan_form {
	int32_t set;
	double res_base, res_per_n;
	double tr_base, tr_per_n;
	double ws_base, ws_per_n; /* of the transient: the recompute workspace */
} kiln_sim_plan_form;

/* The form of plan `actions` (one kiln_action per unit of set `set` of c,
 * borrowed) in *out. */
void kiln_sim_plan_form_of(const struct kiln_compilation *c, int32_t set, const uint8_t *actions,
                           kiln_sim_plan_form *out);

/* Plan `actions` of unit set `set` scheduled at load bucket `bucket`
 * (kiln_interleave_exposed, plus the recompute time of the ops it re-runs
 * at the bucket's load): returns 0, or -1 when it cannot be scheduled (the
 * outputs then untouched). */
int kiln_sim_plan_cost(const struct kiln_compilation *c, int32_t set, int32_t bucket,
                       const uint8_t *actions, double *out_exposed_us, double *out_serial_us,
                       double *out_recompute_us);

/* ---------------------------------------------------------------- oracle.c */

/* The clairvoyant oracle (docs/simulator.md, "The oracle"). */
typedef struct kiln_sim_oracle kiln_sim_oracle;

/* The oracle (the policy of kind KILN_SIM_ORACLE) for compilation c
 * (borrowed, finished); arena-owned, its caches freed by
 * kiln_sim_oracle_free. Returns 0, or -1 (a message on err) when c has no
 * plan tables or on exhaustion. Used by one thread at a time. */
int kiln_sim_oracle_new(const struct kiln_compilation *c, kiln_arena *a, FILE *err,
                        kiln_sim_oracle **out);
void kiln_sim_oracle_free(kiln_sim_oracle *o);
/* The oracle of a policy, NULL for every policy but oracle (policy.c). */
kiln_sim_oracle *kiln_sim_policy_oracle(const kiln_sim_policy *p);

/* One rank's stage for one iteration, as sim/sim.c runs it: m micro-
 * batches of n_layers layers (sets[l]: the unit set of layer l, -1 when
 * not planned), rows[i * n_layers + l] the rows of layer l in micro-batch
 * i (0 for a dense layer), W = window micro-batches in flight, the
 * device's capacity and static bytes, and the fixed bytes every micro-
 * batch holds before its layers. Borrowed. */
typedef struct kiln_sim_oracle_stage {
	int32_t m, n_layers, window;
	const int32_t *sets;
	const double *rows;
	double capacity, static_bytes, fixed_bytes;
} kiln_sim_oracle_stage;

/* Chooses every (micro-batch, layer)'s plan of st into
 * out[i * n_layers + l] (unplanned layers: zero), and in *out_over_budget
 * the micro-batches counted over budget: all m of them when no memory cap
 * shared by the stage's micro-batches fits (their choices are then the
 * least memory the tables allow), else 0. Returns 0, or -1 on exhaustion
 * or a plan that cannot be scheduled (the simulator counts the stage as
 * out of memory then, never as a fit). */
int kiln_sim_oracle_plan(kiln_sim_oracle *o, const kiln_sim_oracle_stage *st, kiln_sim_choice *out,
                         int64_t *out_over_budget);

/* One micro-batch alone (the oracle's exact step, for the tests): the
 * least summed exposed time of n_layers layers (sets, rows as above)
 * whose held bytes (fixed_bytes rounded up plus the resident bytes) are at
 * most max_held and whose held plus largest transient are at most
 * max_device; the choices into out (n_layers, or NULL). INFINITY when no
 * combination fits, NAN on failure. */
double kiln_sim_oracle_micro(kiln_sim_oracle *o, int32_t n_layers, const int32_t *sets,
                             const double *rows, double fixed_bytes, double max_held,
                             double max_device, kiln_sim_choice *out);

/* The supported points the oracle chooses each micro-batch's plan among
 * (docs/simulator.md, "The oracle"), for the tests: up to max of them,
 * held bytes (H) ascending and summed exposed time falling, into out_held
 * and out_exposed_us; each minimises exposed_us + lambda * held over every
 * combination of one table point per layer for some lambda >= 0. Returns
 * their count (all, even beyond max), -1 on failure. */
int64_t kiln_sim_oracle_path(kiln_sim_oracle *o, int32_t n_layers, const int32_t *sets,
                             const double *rows, double fixed_bytes, double *out_held,
                             double *out_exposed_us, int64_t max);

/* ---------------------------------------------------------------- sim.c */

typedef struct kiln_sim_config {
	const struct kiln_compilation *c; /* finished compilation, borrowed */
	const kiln_rt *rt;                /* its blob, for the kiln policies */
	const struct kiln_compilation *c_no_offload; /* kiln:no-offload's compilation */
	const kiln_rt *rt_no_offload;                /* and its blob (NULL without) */
	/* adapipe's compilation on its own partition (the model with
	 * stage_layers set to kiln_adapipe_partition's split; the same pp and
	 * micro-batches), or NULL: adapipe then runs on cfg->c's split. */
	const struct kiln_compilation *c_adapipe;
	const kiln_load_profile *loads;
	int64_t iterations;
	uint64_t seed;
	double restart_s;           /* an out-of-memory failure's restart (default 284) */
	int64_t checkpoint_every;   /* iterations between checkpoints (progress since is lost) */
	int exact;                  /* 1: every EP rank; 0: the statistical method (sim.c) */
	int32_t max_groups;         /* EP groups simulated (0: all) */
	FILE *progress;             /* a terminal: a status line of the run's progress */
	int32_t threads;            /* threads to run the policies on (0: one per online CPU,
	                               at most 8); the results do not depend on it */
	/* When set (a second handle on cfg->rt's blob), the kiln policy's
	 * memory is also recorded through the runtime's accounting API and
	 * compared with the simulator's own count at every layer
	 * (kiln_sim_result.acct_checks, acct_mismatches). */
	kiln_rt *acct_rt;
	/* megatron-paged-stash's flags; NULL: KILN_SIM_STASH_DEFAULTS. */
	const kiln_sim_stash_flags *stash;
	/* megatron-capacity's capacity factor (0: the description's, else 1;
	 * kiln_sim_capacity_factor). */
	double capacity_factor;
	/* 1: the kiln policies' queries carry no EP group counts (the
	 * runtime's decision as before blob 1.1, for measuring what the
	 * group fallback changes); 0: each query carries the rows of every
	 * rank of its EP group (docs/runtime.md, "Beyond the declared load"). */
	int no_group_counts;
	/* 1: no exposed time hides behind a slower rank of the EP group: a
	 * layer takes the group's largest compute plus its largest exposed
	 * time (the bound for exposed work that runs where every rank waits,
	 * before the dispatch all-to-all); 0: each rank's exposed time adds to
	 * its own compute and the layer takes the largest sum
	 * (docs/simulator.md, "Slack"). */
	int no_slack;
} kiln_sim_config;

typedef struct kiln_sim_result {
	kiln_sim_policy_kind policy;
	double tokens_per_s;
	double mfu, hfu;
	double iteration_s;      /* mean, restarts excluded */
	double total_s;          /* all iterations, restarts and lost progress included */
	int64_t ooms;
	double oom_lost_s;       /* restarts plus lost progress */
	double recompute_s;      /* exposed recompute per micro-batch pass, averaged over stages,
	                            summed over micro-batches and iterations */
	double copy_s;           /* exposed copies, likewise */
	int64_t over_budget;     /* kiln decisions that found nothing fitting */
	int64_t triggered;       /* mindspeed: (group, micro-batch, MoE layer) forwards its
	                            trigger checkpointed, over all iterations */
	/* megatron-paged-stash: iterations whose step ran twice (a stash
	 * overflow or tokens over the receive budget on some rank), the time
	 * the second runs took (in total_s and iteration_s), the iterations
	 * with each trigger, and the bytes spilled to pinned host: per
	 * iteration the most any one device spilled (over its layers and
	 * micro-batches), summed over iterations. 0 for the other policies. */
	int64_t reruns;
	double rerun_s;
	int64_t stash_overflows, stash_over_budget; /* iterations with each trigger */
	double spilled_bytes;
	const char *recipe; /* kiln_sim_policy_recipe, or NULL */
	int recipe_fits;
	double dropped_fraction; /* routed expert rows dropped over routed (megatron-capacity;
	                            0 for every other policy) */
	const char *flags;       /* megatron, megatron-capacity: the recipe's Megatron flags
	                            (arena-owned); NULL otherwise */
	int64_t acct_checks, acct_mismatches; /* with cfg->acct_rt, for kiln */
	double *peak_bytes;      /* per stage: the largest device memory seen */
	int32_t n_stages;
	kiln_pipe_op *last_ops;  /* the last iteration's pipeline schedule (its slowest EP
	                            group), arena-owned; NULL when none */
	int32_t n_last_ops;
} kiln_sim_result;

/* Runs cfg's iterations for each of the n policies. out[n] is filled,
 * peak_bytes arena-owned. With cfg->progress a status line counts the
 * layer decisions done (kiln_sim_cost_estimate's) and the iterations.
 * Returns 0, or -1 with a message on err. */
int kiln_sim_run(const kiln_sim_config *cfg, const kiln_sim_policy_kind *policies, int32_t n,
                 kiln_arena *a, FILE *err, kiln_sim_result *out);

/* What kiln_sim_run of n policies on cfg costs, from the compilation's
 * shape alone (docs/cli.md, "Cost bounds"). The work is layer decisions:
 * per iteration, simulated EP group and policy, every layer of every stage
 * for every micro-batch, once per rank followed (exact: ep; the
 * statistical method: at most 1 + ep, the envelope and every rank, and
 * usually far fewer); the pipeline's 2 * p * v * m ops per run are fewer. The memory is what one
 * iteration holds (nothing grows with iterations). */
typedef struct kiln_sim_cost {
	double groups, layers, microbatches, passes; /* the factors of per_iteration, with n */
	double per_iteration;                        /* decisions */
	double decisions;                            /* all iterations */
	double cpu_s;                                /* at KILN_SIM_CPU_US_PER_DECISION */
	double bytes; /* working memory, the compilation's own excluded */
	int32_t threads;
} kiln_sim_cost;

/* The bounds kilnc simulate holds a run to (1e10 decisions: about 20
 * minutes of CPU), and the measured CPU of one decision (kimi-k2-1t with
 * every policy: 70.5 s for 5.8e8, docs/simulator.md "How long it takes";
 * 0.05 to 0.12 us on one 2.8 GHz core). */
#define KILN_SIM_MAX_DECISIONS 1e10
#define KILN_SIM_MAX_BYTES (4.0 * 1073741824.0)
#define KILN_SIM_CPU_US_PER_DECISION 0.12

/* The EP groups of m's job, dp * tp / ep (1 for a dense model), or the
 * first max_groups of them when max_groups > 0 is fewer (--groups). */
int64_t kiln_sim_groups(const kiln_model *m, int32_t max_groups);

/* Fills out for n policies (1 to 128: megatron-paged-stash counts as two, its
 * rerun) of cfg (cfg->c finished). Returns 0. */
int kiln_sim_cost_estimate(const kiln_sim_config *cfg, int32_t n, kiln_sim_cost *out);

#endif
