/* include/kiln/blob.h: the plan blob's on-disk layout (docs/blob-format.md).
 *
 * Shared by the writer (codegen/blob.c) and the loader (runtime/open.c); libc
 * only. Every integer is little-endian; every struct here has only naturally
 * aligned fields and no padding, so a validated blob is read in place. A
 * blob is: the header, the section table, then the sections, each starting
 * at a multiple of 64 bytes, with zero bytes between them.
 */
#ifndef KILN_BLOB_H
#define KILN_BLOB_H

#include <stdint.h>

#define KILN_BLOB_MAGIC "KILNPLAN" /* 8 bytes, no NUL */
#define KILN_BLOB_MAJOR 1
#define KILN_BLOB_MINOR 2
#define KILN_BLOB_ALIGN 64
/* The loader's sanity bound; larger files are refused before any parsing. */
#define KILN_BLOB_MAX_BYTES (1u << 30)

/* Values of the enumerated fields the records below carry (the writer's
 * static assertions in codegen/blob.c hold the compiler's enums to them;
 * the runtime's kiln_rt_action, kiln_rt_stream, kiln_rt_task_kind and
 * KILN_RT_UNIT_* are the values of ACTIONS, chunk.stream, chunk.kind and
 * unit.flags). */
enum { KILN_BLOB_SOLVER_DP = 0, KILN_BLOB_SOLVER_MILP = 1 }; /* meta.solver */
enum { KILN_BLOB_SET_DENSE = 0, KILN_BLOB_SET_MOE = 1 };     /* set.kind */
/* Byte-wide indices: a set's units and chunks and a template's tasks are
 * at most this many; a chunk that serves no unit has unit KILN_BLOB_NO_UNIT. */
#define KILN_BLOB_MAX_INDEX 255
#define KILN_BLOB_NO_UNIT 255
/* A 32-bit index that points nowhere (plan.template_id, group.plan). */
#define KILN_BLOB_NONE UINT32_MAX
/* The loader's bounds on meta (docs/blob-format.md, META): load buckets
 * per set at most, and the largest meta.max_factor. */
#define KILN_BLOB_MAX_BUCKETS 1024
#define KILN_BLOB_MAX_FACTOR 64

/* Offset 0. The CRC32C covers the whole file except its own 4 bytes. */
typedef struct kiln_blob_header {
	char magic[8];
	uint16_t major;       /* a loader refuses a major it does not know */
	uint16_t minor;       /* ... and a minor newer than its own */
	uint32_t header_bytes; /* sizeof(kiln_blob_header) */
	uint64_t file_bytes;   /* the whole blob */
	uint32_t
	    n_sections; /* entries in the section table: 15 in 1.0, KILN_SEC_COUNT in 1.1 and 1.2 */
	uint32_t crc32c;       /* CRC32C (Castagnoli) of bytes [0, 28) and [32, file_bytes) */
	uint64_t table_offset; /* section table, = 64 */
	uint8_t reserved[24];  /* zero */
} kiln_blob_header;

/* Section ids, in file order. Each section is an array of one record type. */
#define KILN_BLOB_SECTIONS(X)                                                                      \
	X(META, kiln_blob_meta)         /* exactly one */                                          \
	X(STRINGS, char)                /* NUL-terminated strings; ends with NUL */                \
	X(STAGES, kiln_blob_stage)      /* meta.n_stages */                                        \
	X(LAYERS, kiln_blob_layer)      /* planned layers, stage by stage, in execution order */   \
	X(SETS, kiln_blob_set)          /* unit sets: one per (stage, layer kind) */               \
	X(UNITS, kiln_blob_unit)        /* every set's units, set by set */                        \
	X(BUCKETS, kiln_blob_bucket)    /* meta.n_buckets per set, set by set */                   \
	X(TABLES, kiln_blob_table)      /* meta.n_buckets per set, set by set */                   \
	X(POINTS, kiln_blob_point)      /* table points; tables with equal points share them */    \
	X(PLANS, kiln_blob_plan)        /* the plan pool */                                        \
	X(ACTIONS, uint8_t)             /* per plan, one kiln_rt_action per unit */                \
	X(CHUNKS, kiln_blob_chunk)      /* per set, the catalogue of schedulable chunks */         \
	X(TEMPLATES, kiln_blob_template) /* dual-batch schedules, per plan */                      \
	X(TASKS, uint8_t)               /* per template, chunk indices in start order */           \
	X(DEPS, kiln_blob_dep)          /* per template, (task, dependency) pairs */               \
	X(GROUPS, kiln_blob_group)      /* 1.1: one per set, the EP group's fallback */

typedef enum {
#define X(id, type) KILN_SEC_##id,
	KILN_BLOB_SECTIONS(X)
#undef X
	KILN_SEC_COUNT
} kiln_blob_section_id;

typedef struct kiln_blob_section {
	uint32_t id;          /* kiln_blob_section_id; entry i has id i */
	uint32_t record_bytes; /* sizeof the record type */
	uint64_t offset;      /* from the start of the blob; a multiple of 64 */
	uint64_t count;       /* records */
} kiln_blob_section;

typedef struct kiln_blob_meta {
	uint64_t model_hash;   /* FNV-1a 64 of the normalised description (docs) */
	uint32_t model_name;   /* string offset */
	uint32_t compiler;     /* string offset: "kilnc VERSION" */
	uint32_t n_stages;
	uint32_t n_layers;     /* planned layers (LAYERS records) */
	uint32_t n_model_layers; /* transformer layers of the model */
	uint32_t n_buckets;    /* load buckets per set */
	uint32_t solver;       /* KILN_BLOB_SOLVER_* */
	uint32_t reserved;     /* zero */
	double max_factor;     /* load.max_factor */
} kiln_blob_meta;

typedef struct kiln_blob_stage {
	uint64_t capacity_bytes;  /* device memory - reserved */
	uint64_t static_bytes;    /* weights, gradients, optimizer state */
	uint64_t fixed_bytes;     /* per micro-batch activations no plan touches */
	uint64_t budget_bytes;    /* the compiler's budget for a deciding micro-batch */
	uint64_t steady_bytes;    /* what one micro-batch holds at load 1 under the steady plan */
	uint64_t floor_bytes;     /* one micro-batch, every layer maximal-saving at its worst bucket */
	uint64_t transient_bytes; /* the largest backward transient of any table point */
	double inflight;          /* micro-batches held at once at steady state */
	double safety_factor;     /* largest load factor whose maximal saving fits */
	uint32_t first_layer;     /* LAYERS index */
	uint32_t n_layers;
} kiln_blob_stage;

typedef struct kiln_blob_layer {
	uint32_t model_layer;     /* 0-based model layer number */
	uint32_t set;             /* SETS index */
	uint64_t tail_floor_bytes; /* floor of the stage's later layers for this micro-batch */
	uint64_t head_steady_bytes; /* the micro-batch's fixed bytes plus the steady plan's
	                               resident bytes at load 1 of the layers up to and
	                               including this one (select's share is this
	                               times the fair scale) */
	uint64_t steady_bytes;      /* this layer's part of it */
	uint64_t steady_keep_bytes; /* keep_bytes of this layer's table at load 1 */
} kiln_blob_layer;

typedef struct kiln_blob_set {
	uint32_t stage;
	uint32_t kind;         /* KILN_BLOB_SET_* */
	uint32_t first_unit;   /* UNITS index */
	uint32_t n_units;      /* <= 255 */
	uint32_t first_chunk;  /* CHUNKS index */
	uint32_t n_chunks;     /* <= 255 */
	uint64_t balanced_rows; /* local expert rows at load factor 1; 0 for dense sets */
} kiln_blob_set;

typedef struct kiln_blob_unit {
	uint32_t name;        /* string offset */
	uint32_t flags;       /* KILN_RT_UNIT_* */
	uint64_t base_bytes;  /* bytes per micro-batch = base + per_row * rows */
	uint64_t per_row_bytes;
} kiln_blob_unit;

typedef struct kiln_blob_bucket {
	uint64_t max_rows;    /* largest row count in the bucket: floor(edge * balanced_rows) */
	double load_factor;   /* the bucket's upper edge */
} kiln_blob_bucket;

typedef struct kiln_blob_table {
	uint64_t quantum_bytes; /* saved_q counts these */
	uint64_t keep_bytes;    /* everything kept, at the bucket's upper edge (rounded up) */
	uint32_t first_point;   /* POINTS index */
	uint32_t n_points;      /* >= 1; saved_q strictly ascending, exposed_us ascending */
} kiln_blob_table;

typedef struct kiln_blob_point {
	uint32_t saved_q;     /* quanta saved, rounded down */
	uint32_t plan;        /* PLANS index */
	float exposed_us;     /* scheduled exposed time per layer and micro-batch */
	uint32_t reserved;    /* zero */
} kiln_blob_point;

typedef struct kiln_blob_plan {
	uint32_t set;         /* a set whose units the actions follow (units are identical in
	                         every set the plan is used by) */
	uint32_t actions;     /* ACTIONS index of the first of the set's n_units actions */
	uint32_t template_id; /* TEMPLATES index, or UINT32_MAX */
	uint32_t reserved;    /* zero */
} kiln_blob_plan;

typedef struct kiln_blob_chunk {
	uint32_t name;        /* string offset, e.g. "attn", "offload moe.expert_in" */
	uint8_t stream;       /* kiln_rt_stream */
	uint8_t kind;         /* kiln_rt_task_kind */
	uint8_t chain;        /* 0 forward micro-batch, 1 backward micro-batch */
	uint8_t unit;         /* the unit a copy or recompute chunk serves, or KILN_BLOB_NO_UNIT */
} kiln_blob_chunk;

typedef struct kiln_blob_template {
	uint32_t plan;        /* PLANS index */
	uint32_t first_task;  /* TASKS index */
	uint32_t first_dep;   /* DEPS index */
	uint16_t n_tasks;     /* <= 255 */
	uint16_t n_deps;
	float makespan_us;    /* interleaved */
	float serial_us;      /* chain 0 then chain 1 */
	float base_us;        /* keep-everything makespan at the same load */
	float load_factor;    /* the load the durations were taken at */
} kiln_blob_template;

typedef struct kiln_blob_dep {
	uint8_t task;         /* index in the template */
	uint8_t dep;          /* a task (earlier in start order) that must end first */
} kiln_blob_dep;

/* 1.1. Per unit set (record i is set i), the plan every rank of an EP group
 * switches to when some rank of the group has more rows at this layer than
 * fit_rows (docs/runtime.md, "Beyond the declared load"): the full
 * recompute plan, which may re-run the layer's collectives because the whole
 * group re-runs them together, or the cheapest plan of the set's tables that
 * never holds more device memory than it (resident or transient) at any
 * rows a rank can receive (passes/baselines.c, group_fallbacks). Bytes and
 * time are lines in the rank's rows, bytes = base + per_row * rows, exact
 * for the plan's units. */
typedef struct kiln_blob_group {
	uint32_t set;                 /* = the record's index */
	uint32_t plan;                /* PLANS index over the set's units; UINT32_MAX: none
	                                 (dense sets, which have no rows) */
	uint64_t fit_rows;            /* the most rows safe without the fallback: the last
	                                 bucket within safety_factor, and past the last
	                                 bucket where every choice fits (docs/runtime.md);
	                                 <= UINT32_MAX; 0 with no plan */
	uint64_t resident_base_bytes; /* the plan's kept units */
	uint64_t resident_per_row_bytes;
	uint64_t saved_base_bytes; /* its recomputed and offloaded units */
	uint64_t saved_per_row_bytes;
	uint64_t transient_base_bytes; /* its backward transient: what recompute rebuilds and
	                                  the recompute workspace */
	uint64_t transient_per_row_bytes;
	double exposed_base_us; /* the line through its scheduled exposed time at the
	                           first and the last bucket's rows */
	double exposed_per_row_us;
} kiln_blob_group;

#endif
