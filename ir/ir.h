/* ir/ir.h: the model description and the graph IR, shared by the compiler.
 *
 * The frontend fills a kiln_model; passes/lower.c turns it into a
 * kiln_ir_graph; the cost model and later passes read the graph. Everything
 * here lives in one kiln_arena per compilation and is freed with it.
 *
 * Sizes that depend on expert load are linear functions of N, the number of
 * (token, expert) rows this device's local experts receive for one
 * micro-batch in one MoE layer. Everything else is constant in N.
 */
#ifndef KILN_IR_H
#define KILN_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------------- arena.c */

typedef struct kiln_arena kiln_arena;

/* A new empty arena, or NULL when memory is exhausted. Owned by the caller;
 * release with kiln_arena_free. */
kiln_arena *kiln_arena_new(void);
/* Zeroed memory aligned to 16 bytes, valid until the arena is freed; NULL when
 * memory is exhausted or bytes is absurd (over 1 GiB). */
void *kiln_arena_alloc(kiln_arena *a, size_t bytes);
/* Arena copy of s (borrowed); NULL on exhaustion. */
char *kiln_arena_strdup(kiln_arena *a, const char *s);
/* Arena copy of len bytes of s plus a terminating NUL. */
char *kiln_arena_strndup(kiln_arena *a, const char *s, size_t len);
/* Frees every allocation made from a. NULL is allowed. */
void kiln_arena_free(kiln_arena *a);
/* Bytes handed out so far (for benchmarks). */
size_t kiln_arena_used(const kiln_arena *a);

/* ---------------------------------------------------------------- text.c */

/* Numbers in text, one rule set for the command line, model descriptions
 * and load traces (docs/cli.md, "Numbers"): the whole of s[0..len) is the
 * number, with no blanks around it; decimal digits only (no hex, octal,
 * digit separators, inf or nan); an optional leading sign. Each returns
 * KILN_NUM_OK and sets *out, KILN_NUM_SYNTAX when s is not written that
 * way, or KILN_NUM_RANGE when it is but its value lies outside [lo, hi]
 * (or outside the type, or is not finite); *out is untouched on failure.
 * s is borrowed and need not be NUL-terminated. */
enum { KILN_NUM_OK = 0, KILN_NUM_SYNTAX = -1, KILN_NUM_RANGE = -2 };
/* An integer: [+-] digits (leading zeros allowed). */
int kiln_num_i64_parse(const char *s, size_t len, int64_t lo, int64_t hi, int64_t *out);
int kiln_num_u64_parse(const char *s, size_t len, uint64_t lo, uint64_t hi, uint64_t *out);
/* A decimal number of at most 256 characters:
 * [+-] (digits [. [digits]] | . digits) [(e|E) [+-] digits]. */
int kiln_num_f64_parse(const char *s, size_t len, double lo, double hi, double *out);
/* A byte count: digits, then optionally one of the suffixes B, K, KB, KiB,
 * M, MB, MiB, G, GB, GiB, T, TB, TiB (powers of 1024; case matters); no
 * sign. KILN_NUM_RANGE when the product exceeds UINT64_MAX. */
int kiln_num_bytes_parse(const char *s, size_t len, uint64_t *out);

/* Untrusted text (names and paths from a description, a blob, a trace or
 * the command line) as it may be printed to a terminal: valid UTF-8 stays
 * as it is, except C1 controls; every other byte that is not printable
 * ASCII (C0 controls, DEL, C1 controls, bytes of invalid UTF-8) becomes
 * \xNN, and a backslash becomes \\, so that the output is one line
 * that cannot move the cursor, retitle the terminal or fake other output.
 * kiln_text_escape writes it into out (cap bytes, NUL-terminated; text
 * that does not fit is cut at a character and ends in "...") and returns
 * out. kiln_text_put writes all of it to f; 0, or -1 on a write error. */
const char *kiln_text_escape(const char *s, size_t len, size_t cap, char *out);
int kiln_text_put(FILE *f, const char *s, size_t len);
/* Whether s[0..len) holds a control character (C0, DEL, or a C1 control
 * encoded in UTF-8); if so *out_cp is the first one's code point. */
bool kiln_text_has_control(const char *s, size_t len, uint32_t *out_cp);

/* ---------------------------------------------------------------- progress.c */

/* A status line for long work on a terminal (DESIGN.md 5.2: compile and
 * simulate show progress when stderr is a terminal). While a meter runs, a
 * thread of its own rewrites one line on out every
 * KILN_PROGRESS_INTERVAL_MS, "WHAT: PHASE DONE of TOTAL UNIT (P%), about R
 * s left, AUX LABEL, T s", whatever the work is doing; the work only
 * counts. Every function accepts NULL and then does nothing, so work counts
 * unconditionally and costs one relaxed atomic add per call. */
#define KILN_PROGRESS_INTERVAL_MS 1000

typedef struct kiln_progress kiln_progress;

/* Starts a meter writing to out (borrowed; a terminal: the line is
 * rewritten with "\r" and erased with "\033[K"), labelled what (copied).
 * NULL when out is NULL or the meter cannot start (then the work simply
 * runs silent). Owned by the caller: kiln_progress_stop. */
kiln_progress *kiln_progress_start(FILE *out, const char *what);
/* A new phase: its name and unit (copied), its total (0: unknown), and its
 * counters at 0. */
void kiln_progress_phase(kiln_progress *p, const char *phase, const char *unit, int64_t total);
/* A second count shown after the first, with label (copied; "" hides it). */
void kiln_progress_aux(kiln_progress *p, const char *label);
/* Counts n more done (any thread). */
void kiln_progress_add(kiln_progress *p, int64_t n);
void kiln_progress_add_aux(kiln_progress *p, int64_t n);
/* Prints one whole line (printf-style) on out, erasing the status first. */
void kiln_progress_line(kiln_progress *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Stops the thread, erases the status line and frees p. */
void kiln_progress_stop(kiln_progress *p);

/* ---------------------------------------------------------------- model */

typedef enum { KILN_ATTN_FLASH, KILN_ATTN_EAGER } kiln_attention;
/* The activation's shape as the lowering sees it: KILN_FN_SWIGLU is any gated
 * linear unit (an up GEMM of twice the width, three GEMMs in all),
 * KILN_FN_GELU an ungated one. The function itself is a kiln_act_fn. */
typedef enum { KILN_FN_SWIGLU, KILN_FN_GELU } kiln_fn;
/* The activation function a description names (model.activation,
 * model.moe.activation; docs/model-format.md): Megatron-Core's
 * gated_linear_unit with F.silu, F.gelu alone, gated with F.gelu, and gated
 * with quick_gelu as GPT-OSS configures it (glu_linear_offset 1,
 * activation_func_clamp_value 7). Model FLOPs and the step-time model read
 * it; the lowering reads its kiln_fn. */
typedef enum {
	KILN_ACTFN_SWIGLU,
	KILN_ACTFN_GELU,
	KILN_ACTFN_GEGLU,
	KILN_ACTFN_QUICK_GEGLU
} kiln_act_fn;
typedef enum { KILN_DTYPE_BF16, KILN_DTYPE_FP16, KILN_DTYPE_FP8, KILN_DTYPE_FP32 } kiln_dtype;
typedef enum { KILN_OPTIM_ADAM, KILN_OPTIM_SGD } kiln_optimizer;
typedef enum { KILN_SCHED_1F1B, KILN_SCHED_INTERLEAVED } kiln_schedule;
/* Where the router probabilities multiply (docs/model-format.md, prob_apply). */
typedef enum {
	KILN_PROB_ACTIVATION,    /* inside the expert activation (weighted SwiGLU) */
	KILN_PROB_EXPERT_OUTPUT, /* on the expert output, on the expert's device */
	KILN_PROB_COMBINE        /* after the combine, on the token's device */
} kiln_prob_apply;

/* issue 15, item 2: what a measured Megatron-Core run used (docs/model-format.md). */
typedef enum {
	KILN_DISPATCH_ALLTOALL,
	KILN_DISPATCH_DEEPEP,
	KILN_DISPATCH_HYBRIDEP
} kiln_dispatcher;
typedef enum { KILN_RECOMPUTE_NONE, KILN_RECOMPUTE_SELECTIVE, KILN_RECOMPUTE_FULL } kiln_recompute;
typedef enum { KILN_RECOMPUTE_UNIFORM, KILN_RECOMPUTE_BLOCK } kiln_recompute_method;

/* Megatron-Core's module names (megatron/core/transformer/transformer_config.py:
 * recompute_modules' allowed set, and offload_modules' for fine-grained
 * activation offloading), one bit each. */
#define KILN_MEGATRON_RECOMPUTE_MODULES(X)                                                         \
	X(CORE_ATTN, "core_attn")                                                                  \
	X(MOE_ACT, "moe_act")                                                                      \
	X(LAYERNORM, "layernorm")                                                                  \
	X(MLA_UP_PROJ, "mla_up_proj")                                                              \
	X(MLP, "mlp")                                                                              \
	X(MOE, "moe")                                                                              \
	X(SHARED_EXPERTS, "shared_experts")
#define KILN_MEGATRON_OFFLOAD_MODULES(X)                                                           \
	X(CORE_ATTN, "core_attn")                                                                  \
	X(ATTN_PROJ, "attn_proj")                                                                  \
	X(EXPERT_FC1, "expert_fc1")                                                                \
	X(FUSED_GROUP_MLP, "fused_group_mlp")                                                      \
	X(MOE_ACT, "moe_act")                                                                      \
	X(ATTN_NORM, "attn_norm")                                                                  \
	X(MLP_NORM, "mlp_norm")                                                                    \
	X(QKV_LINEAR, "qkv_linear")
enum {
#define X(id, name) KILN_MRC_BIT_##id,
	KILN_MEGATRON_RECOMPUTE_MODULES(X)
#undef X
	    KILN_MRC_COUNT
};
enum {
#define X(id, name) KILN_MOF_BIT_##id,
	KILN_MEGATRON_OFFLOAD_MODULES(X)
#undef X
	    KILN_MOF_COUNT
};
#define KILN_MRC(id) (1u << KILN_MRC_BIT_##id)
#define KILN_MOF(id) (1u << KILN_MOF_BIT_##id)

/* The megatron: section: the recipe of the run being described. */
typedef struct kiln_megatron {
	kiln_recompute recompute; /* NONE when recompute_granularity is absent */
	kiln_recompute_method recompute_method;
	int64_t recompute_num_layers; /* full recompute: 0 means every layer */
	uint32_t recompute_modules;   /* KILN_MRC bits; selective */
	uint32_t offload_modules;     /* KILN_MOF bits */
	/* Fine-grained offloading's tuning (transformer_config.py:1343-1362):
	 * --activation-offload-fraction (offload_fraction, in [0, 1], when
	 * offload_fraction_set; 1 otherwise: kiln_megatron_fraction),
	 * --delta-offload-bytes-across-pp-ranks (bytes, 0: none) and
	 * --min-offloaded-tensor-size (elements, when min_offloaded_set;
	 * Megatron's 1M otherwise). */
	bool offload_fraction_set;
	double offload_fraction;
	int64_t delta_offload_bytes;
	bool min_offloaded_set;
	int64_t min_offloaded_elements;
	double capacity_factor;       /* 0: dropless */
	bool pad_to_capacity;
	bool force_load_balancing;
	int64_t mtp_num_layers; /* multi-token prediction layers (counted in FLOPs only) */
	/* The paged stash's flags (megatron-paged-stash; the simulator
	 * chooses those absent): 0 when absent. */
	double rank_capacity_factor;    /* --moe-expert-rank-capacity-factor */
	bool paged_stash_cuda_set;      /* --moe-paged-stash-buffer-size-factor-cuda given */
	double paged_stash_cuda_factor; /* its value (>= 0) */
	bool paged_stash_cpu_set;       /* --moe-paged-stash-buffer-size-factor-cpu given */
	double paged_stash_cpu_factor;  /* its value (>= 0) */
	int64_t paged_stash_page_size;  /* --moe-paged-stash-page-size */
} kiln_megatron;

/* A hardware profile (DESIGN.md 5.1). Bandwidths in GB/s (1e9 bytes/s),
 * memory in GiB (2^30 bytes), compute in TFLOP/s (1e12). */
typedef struct kiln_hardware {
	const char *name;
	const char *source; /* file the profile came from, or "<shipped:NAME>" */
	double memory_gib;
	double reserved_gib;
	double peak_tflops;
	double gemm_efficiency; /* (0, 1] */
	double hbm_gbps;
	double sfu_tops; /* special-function (exp) results per second, 1e12; 0: not modelled */
	double h2d_gbps;
	double d2h_gbps;
	double host_memory_gib;
	int64_t devices_per_node;
	double intra_node_gbps;
	double inter_node_gbps;
	/* issue 15, item 2: the step-time model's fitted efficiencies
	 * (docs/calibration.md); 0 means the default named. */
	double time_gemm_efficiency;       /* a large GEMM's share of peak; 0: gemm_efficiency */
	double time_gemm_half_rows;        /* rows at which a GEMM reaches half of that; 0: none */
	double time_attention_efficiency;  /* flash attention's share of peak; 0: gemm_efficiency */
	double time_comm_efficiency;       /* collectives' share of NVLink bandwidth; 0: 1 */
	double time_inter_node_efficiency; /* of the inter-node links'; 0: time_comm_efficiency */
	double time_kernel_floor_us;       /* least time of a small kernel (per launch) */
	double time_host_layer_us;         /* host time to issue one layer's forward and backward */
} kiln_hardware;

/* A validated model description (DESIGN.md 5.1). Every field is set: the
 * frontend applies defaults. Counts are positive unless noted. */
typedef struct kiln_model {
	const char *path; /* file it was read from */
	const char *name;

	/* model: */
	int64_t layers;
	int64_t dense_layers; /* >= 0; all layers when moe is false */
	int64_t hidden;
	int64_t ffn_hidden;
	int64_t heads;
	int64_t kv_heads;
	int64_t head_dim; /* for MLA: the no-position (nope) part of q/k heads */
	int64_t vocab;
	int64_t seq_len;
	kiln_attention attention;
	kiln_fn activation;
	double dropout; /* [0, 1) */

	/* model.mla: (multi-head latent attention, DeepSeek-V2/V3, Kimi K2) */
	bool mla;
	int64_t q_lora_rank;   /* 0: queries are projected directly */
	int64_t kv_lora_rank;
	int64_t rope_head_dim; /* extra q/k head width carrying rotary position */
	int64_t v_head_dim;

	/* model.moe: */
	bool moe;
	int64_t experts;
	int64_t shared_experts; /* >= 0 */
	int64_t top_k;
	int64_t expert_ffn_hidden;
	kiln_fn moe_activation;
	kiln_act_fn activation_fn;     /* model.activation as named */
	kiln_act_fn moe_activation_fn; /* model.moe.activation as named */
	bool linear_bias;              /* model.linear_bias: Megatron's add_bias_linear */

	/* Memory options where implementations differ (docs/model-format.md). */
	bool fused_qkv;             /* q, k, v one storage from one GEMM (not with mla) */
	bool norm_saves_rstd;       /* norms save their fp32 reciprocal RMS per row */
	kiln_prob_apply prob_apply; /* MoE only */
	bool moe_permute_fusion;    /* fused permutation: int32 indices, else int64 */

	/* training: */
	int64_t micro_batch;   /* sequences per micro-batch */
	int64_t global_batch;  /* sequences per iteration */
	kiln_dtype dtype;
	kiln_optimizer optimizer;
	bool distributed_optimizer;

	/* parallel: */
	int64_t devices;
	int64_t tp;
	int64_t pp;
	int64_t ep; /* 1 for a dense model */
	bool sequence_parallel;
	kiln_schedule schedule;
	int64_t vpp; /* model chunks per stage; 1 unless interleaved */
	/* Layers per model chunk, pp * vpp entries in model order; chunk c runs
	 * on stage c % pp. Always filled (the default split is computed). */
	int64_t *stage_layers;
	size_t n_stage_layers;
	/* issue 15, item 2: the time model's layout keys. */
	kiln_dispatcher dispatcher;
	bool overlap_ep_comm;
	bool account_for_embedding; /* the split counted the embedding as a layer */
	bool account_for_loss;      /* ... and the loss */
	kiln_megatron megatron;

	kiln_hardware hw;

	/* load: */
	double max_factor; /* >= 1 */

	/* Derived by the frontend after validation. */
	int64_t dp;            /* devices / (tp * pp) */
	int64_t edp;           /* expert data-parallel size: dp * tp / ep */
	int64_t micro_batches; /* per iteration per pipeline: global / (micro * dp) */
} kiln_model;

/* ---------------------------------------------------------------- graph */

/* value = base + per_n * N, exact in bytes. */
typedef struct kiln_lin {
	uint64_t base;
	uint64_t per_n;
} kiln_lin;

/* value = base + per_n * N, for FLOPs and traffic (not exact). */
typedef struct kiln_linf {
	double base;
	double per_n;
} kiln_linf;

static inline double kiln_lin_at(kiln_lin l, double n)
{
	return (double)l.base + (double)l.per_n * n;
}

static inline double kiln_linf_at(kiln_linf l, double n)
{
	return l.base + l.per_n * n;
}

typedef enum {
#define X(e, s, c) KILN_OP_##e,
#include "ops.def"
#undef X
	KILN_OP_COUNT
} kiln_op_kind;

typedef enum {
	KILN_OPCLASS_GEMM,
	KILN_OPCLASS_MEM,
	KILN_OPCLASS_ATTN,
	KILN_OPCLASS_COMM_TP,
	KILN_OPCLASS_COMM_EP,
	KILN_OPCLASS_COMM_PP
} kiln_op_class;

typedef enum {
	KILN_LAYER_EMBED, /* embedding, on the first stage */
	KILN_LAYER_DENSE, /* attention + dense FFN */
	KILN_LAYER_MOE,   /* attention + MoE */
	KILN_LAYER_HEAD   /* final norm, output layer, loss, on the last stage */
} kiln_layer_kind;

/* What a COMM op does on the wire. The cost model times an all-reduce at
 * 2(g-1)/g of its bytes, all-gather and reduce-scatter at (g-1)/g, an
 * all-to-all at (g-1)/g, a point-to-point send at its bytes; NONE and RECV
 * move nothing this op pays for (a receive is charged to its sender). */
typedef enum {
	KILN_COLL_NONE,
	KILN_COLL_ALL_REDUCE,
	KILN_COLL_ALL_GATHER,
	KILN_COLL_REDUCE_SCATTER,
	KILN_COLL_ALL_TO_ALL,
	KILN_COLL_SEND,
	KILN_COLL_RECV
} kiln_collective;

/* Tensor flags. */
enum {
	KILN_T_SAVED = 1u << 0,  /* backward needs it: resident until backward */
	KILN_T_EXPERT = 1u << 1, /* size scales with the local expert load N */
	KILN_T_MASK = 1u << 2    /* a 1-byte dropout mask */
};

typedef struct kiln_ir_tensor {
	const char *name;  /* unique within its layer, e.g. "attn.q" */
	int32_t layer;     /* index into graph->layers */
	int32_t producer;  /* forward op that writes it, index into graph->ops */
	int32_t alias;     /* tensor whose buffer this one shares (counted once), or -1 */
	uint32_t flags;
	kiln_lin bytes;    /* per micro-batch, on one device */
} kiln_ir_tensor;

typedef struct kiln_ir_op {
	kiln_op_kind kind;
	bool backward;
	int32_t layer;     /* index into graph->layers */
	int32_t forward;   /* for a backward op: its forward op; else -1 */
	const char *name;  /* unique within its layer, e.g. "attn.qkv_proj" */
	kiln_linf flops;   /* per micro-batch on one device */
	kiln_linf traffic; /* HBM bytes read + written, for MEM and ATTN ops */
	kiln_linf comm_bytes; /* bytes each rank sends, for COMM ops */
	int32_t comm_group;   /* ranks in the collective, for COMM ops */
	kiln_collective collective; /* for COMM ops; NONE otherwise */
	/* Weights are recorded on forward ops only; backward ops carry 0. */
	uint64_t params_local;  /* weight elements held by one device */
	uint64_t params_global; /* weight elements in the whole model */
	bool expert_params;     /* weights sharded by EP (optimizer by edp) */
	int32_t *inputs;  /* tensor indices, arena-owned */
	int32_t n_inputs;
	int32_t *outputs;
	int32_t n_outputs;
} kiln_ir_op;

typedef struct kiln_ir_layer {
	kiln_layer_kind kind;
	int32_t index;       /* model layer number, 0-based; -1 for embed and head */
	int32_t stage;
	int32_t chunk;       /* virtual pipeline chunk on its stage, 0..vpp-1 */
	int32_t op_begin, op_end;         /* [begin, end) into graph->ops: forward ops, then backward */
	int32_t tensor_begin, tensor_end; /* [begin, end) into graph->tensors */
	double n_balanced;   /* N at load factor 1 (0 when not MoE) */
} kiln_ir_layer;

typedef struct kiln_ir_stage {
	int32_t index;
	int32_t layer_begin, layer_end; /* [begin, end) into graph->layers, in execution order */
} kiln_ir_stage;

typedef struct kiln_ir_graph {
	const kiln_model *model; /* borrowed; outlives the graph */
	kiln_ir_stage *stages;
	int32_t n_stages;
	kiln_ir_layer *layers;
	int32_t n_layers;
	kiln_ir_op *ops;
	int32_t n_ops;
	kiln_ir_tensor *tensors;
	int32_t n_tensors;
} kiln_ir_graph;

/* ---------------------------------------------------------------- ir.c */

/* Printed name and class of an op kind. */
const char *kiln_ir_op_kind_name(kiln_op_kind k);
kiln_op_class kiln_ir_op_kind_class(kiln_op_kind k);
const char *kiln_ir_layer_kind_name(kiln_layer_kind k);
/* Printed name of a collective ("all_reduce", ...). */
const char *kiln_ir_collective_name(kiln_collective c);
/* Bytes per activation element for the model's dtype (2 for bf16/fp16, 1 for fp8, 4 for fp32). */
uint64_t kiln_model_act_bytes(const kiln_model *m);

typedef struct kiln_ir_builder kiln_ir_builder;

/* A builder that allocates the graph from a (borrowed, must outlive the
 * graph). NULL on exhaustion. */
kiln_ir_builder *kiln_ir_builder_new(kiln_arena *a, const kiln_model *m);
/* Starts a new stage; stages must come in order 0..pp-1. Returns 0 or -1. */
int kiln_ir_builder_stage(kiln_ir_builder *b);
/* Starts a new layer on the current stage. Returns its index or -1. */
int32_t kiln_ir_builder_layer(kiln_ir_builder *b, kiln_layer_kind kind, int32_t index,
                              int32_t chunk, double n_balanced);
/* Adds a tensor to the current layer; name is copied. producer is set by the
 * op that lists it as an output. Returns its index or -1. */
int32_t kiln_ir_builder_tensor(kiln_ir_builder *b, const char *name, kiln_lin bytes,
                               uint32_t flags, int32_t alias);
/* Adds a copy of *op (name, inputs and outputs are copied; layer is set) to the
 * current layer. Returns its index or -1. */
int32_t kiln_ir_builder_op(kiln_ir_builder *b, const kiln_ir_op *op);
/* The finished graph, arena-owned; NULL on exhaustion or when any earlier
 * builder call failed. The builder is consumed (freed) in every case, so a
 * caller that meets an error midway still calls finish to release it.
 * NULL is allowed (returns NULL). */
kiln_ir_graph *kiln_ir_builder_finish(kiln_ir_builder *b);

/* ---------------------------------------------------------------- verify.c */

/* Checks the graph's invariants (indices in range, every saved tensor has a
 * producer before its consumers, aliases point to earlier tensors of the same
 * size in the same layer, stages cover the model's layers in order, backward
 * ops follow forward ops, ...). Returns 0, or -1 after writing one line per
 * violation to err (may be NULL). A violation is a compiler bug. */
int kiln_ir_graph_verify(const kiln_ir_graph *g, FILE *err);

/* ---------------------------------------------------------------- print.c */

/* Readable text form of the whole graph. */
void kiln_ir_graph_print(const kiln_ir_graph *g, FILE *out);

#endif
