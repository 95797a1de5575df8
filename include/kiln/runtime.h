/* include/kiln/runtime.h: the kiln runtime, embedded in a trainer.
 *
 * A handle over a compiled plan blob (kilnc compile -o PLAN.kiln). At the
 * point after each MoE gate the trainer asks kiln_rt_select which units of
 * this layer to keep, recompute or offload for this micro-batch, given the
 * real token counts and the free device memory. Accounting keeps a running
 * count of activation bytes when the trainer's allocator cannot report free
 * memory. The copy engine moves offloaded buffers to host memory and back.
 *
 * The library depends on libc and pthreads only, never prints, and returns
 * negative KILN_RT_E* codes (kiln_rt_strerror names them). It allocates only
 * in kiln_rt_open* and kiln_copy_open; nothing else allocates or blocks
 * except the copy engine's waits. docs/runtime.md has the whole contract.
 */
#ifndef KILN_RUNTIME_H
#define KILN_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- errors */

#define KILN_RT_ERRORS(X)                                                                          \
	X(OK, 0, "success")                                                                        \
	X(EINVAL, -1, "invalid argument")                                                          \
	X(ENOMEM, -2, "out of memory")                                                             \
	X(EIO, -3, "cannot read the blob file")                                                    \
	X(EMAGIC, -4, "not a kiln plan blob (bad magic)")                                          \
	X(EVERSION, -5, "unsupported blob version")                                                \
	X(ETRUNC, -6, "blob size does not match its header (truncated or extended)")               \
	X(ECRC, -7, "blob checksum mismatch")                                                      \
	X(ECORRUPT, -8, "blob structure is invalid")                                               \
	X(ERANGE, -9, "stage, layer or unit out of range")                                         \
	X(EACCT, -10, "accounting would go negative or overflow")                                  \
	X(EUNAVAILABLE, -11, "copy backend unavailable (library not found or incomplete)")         \
	X(ENODEVICE, -12, "copy backend found no device")                                          \
	X(EBACKEND, -13, "copy backend call failed")                                               \
	X(ENOSPC, -14, "copy engine pool or queue full")                                           \
	X(ESTATE, -15, "copy buffer is not in a state that allows this")

enum {
#define X(name, code, text) KILN_RT_##name = code,
	KILN_RT_ERRORS(X)
#undef X
};

/* A static string for any code (unknown codes included). */
const char *kiln_rt_strerror(int code);

/* ---------------------------------------------------------------- handle */

typedef struct kiln_rt kiln_rt;

/* Opens a blob held in memory: validates every byte of it once (header,
 * CRC32C, every count and offset, every index between sections) and builds
 * a small lookup index. The blob is borrowed and read in place: it must stay
 * mapped and unchanged until kiln_rt_close. On success *out is an owned
 * handle; on failure *out is NULL and nothing is leaked. Allocates. */
int kiln_rt_open(const void *blob, size_t size, kiln_rt **out);

/* Opens a blob file: maps it read-only (no copy) and calls kiln_rt_open;
 * the mapping is released by kiln_rt_close. */
int kiln_rt_open_file(const char *path, kiln_rt **out);

/* Releases rt (NULL allowed). No call may be running on rt. */
void kiln_rt_close(kiln_rt *rt);

/* Replaces the allocator kiln_rt_open uses (NULL: malloc and free), for
 * hosts with their own and for tests that inject failures. Process-wide;
 * set it before opening handles. */
void kiln_rt_set_allocator(void *(*alloc)(size_t bytes), void (*release)(void *p));

/* ---------------------------------------------------------------- blob facts */

typedef enum { KILN_RT_KEEP = 0, KILN_RT_RECOMPUTE = 1, KILN_RT_OFFLOAD = 2 } kiln_rt_action;

/* The name of action a ("keep", "recompute", "offload"): a static string,
 * "?" for a value that is no kiln_rt_action. The one table of action names
 * in C: the compiler's dumps and reports, kilnc and the examples print it. */
const char *kiln_rt_action_name(int a);

enum {
	KILN_RT_UNIT_LAYER_INPUT = 1u << 0, /* never recomputed */
	KILN_RT_UNIT_COLLECTIVE = 1u << 1,  /* recompute re-runs a collective */
	KILN_RT_UNIT_RNG = 1u << 2,         /* recompute replays saved RNG state */
	KILN_RT_UNIT_EXPERT = 1u << 3       /* bytes scale with the rows routed here */
};

typedef struct kiln_rt_info {
	const char *model;    /* borrowed from the blob */
	const char *compiler; /* "kilnc VERSION" */
	uint64_t model_hash;
	int major, minor;
	int32_t n_stages;
	int32_t n_layers;       /* planned layers over all stages */
	int32_t n_model_layers; /* transformer layers of the model */
	int32_t n_buckets;
	double max_factor;
	size_t blob_bytes;
} kiln_rt_info;

void kiln_rt_info_get(const kiln_rt *rt, kiln_rt_info *out);

typedef struct kiln_rt_stage_info {
	uint64_t capacity_bytes, static_bytes, fixed_bytes, budget_bytes, steady_bytes;
	uint64_t floor_bytes;     /* one micro-batch at max_factor, maximal saving everywhere */
	uint64_t transient_bytes; /* reserved for the largest backward transient */
	double inflight;
	double safety_factor;
	int32_t n_layers;         /* planned layers on the stage */
} kiln_rt_stage_info;

int kiln_rt_stage_get(const kiln_rt *rt, int32_t stage, kiln_rt_stage_info *out);

typedef struct kiln_rt_layer_info {
	int32_t model_layer; /* 0-based model layer number */
	int32_t stage;
	int32_t position;    /* among the stage's planned layers, in execution order */
	int moe;             /* 1 for an MoE layer */
	int32_t n_units;
	uint64_t balanced_rows; /* local expert rows at load factor 1 (0: dense) */
	uint64_t tail_floor_bytes; /* floor of the stage's later layers, kept free by select */
	uint64_t head_steady_bytes; /* steady-plan bytes through this layer (load 1); the
	                               share is this times the fair scale */
	uint64_t steady_bytes;      /* this layer's part of it */
	uint64_t steady_keep_bytes; /* the layer's keep-everything bytes at load 1 */
} kiln_rt_layer_info;

/* Layers are named by their model layer number. */
int kiln_rt_layer_get(const kiln_rt *rt, int32_t model_layer, kiln_rt_layer_info *out);

typedef struct kiln_rt_unit_info {
	const char *name; /* borrowed from the blob, e.g. "moe.expert_up" */
	uint32_t flags;   /* KILN_RT_UNIT_* */
	uint64_t base_bytes, per_row_bytes;
} kiln_rt_unit_info;

int kiln_rt_unit_get(const kiln_rt *rt, int32_t model_layer, int32_t unit,
                     kiln_rt_unit_info *out);

/* Exact bytes unit holds for one micro-batch when rows (token, expert) rows
 * reach this device's experts: base + per_row * rows. 0 when out of range. */
uint64_t kiln_rt_unit_bytes(const kiln_rt *rt, int32_t model_layer, int32_t unit, uint64_t rows);

/* Plan tables: one per (layer, load bucket), buckets ascending. */
typedef struct kiln_rt_table_info {
	double load_factor;     /* the bucket's upper edge */
	uint64_t max_rows;      /* largest row count in the bucket (0 for dense layers) */
	uint64_t quantum_bytes; /* savings are counted in these */
	uint64_t keep_bytes;    /* everything kept, at the upper edge */
	int32_t n_points;
} kiln_rt_table_info;

/* One table point: a plan, ascending in saving and in cost along the table. */
typedef struct kiln_rt_point {
	uint64_t saved_bytes; /* at least this much, at the bucket's upper edge */
	float exposed_us;
	int32_t plan;
} kiln_rt_point;

int kiln_rt_table_get(const kiln_rt *rt, int32_t model_layer, int32_t bucket,
                      kiln_rt_table_info *out);
int kiln_rt_point_get(const kiln_rt *rt, int32_t model_layer, int32_t bucket, int32_t i,
                      kiln_rt_point *out);
/* A pooled plan: its actions (borrowed from the blob), unit count and
 * template (-1 for none, e.g. the static baselines' plans). */
int kiln_rt_plan_get(const kiln_rt *rt, int32_t plan, const uint8_t **out_actions,
                     int32_t *out_n_units, int32_t *out_template);
/* Plans and templates in the blob. */
int32_t kiln_rt_plan_count(const kiln_rt *rt);
int32_t kiln_rt_template_count(const kiln_rt *rt);

/* A layer's EP-group fallback (blob 1.1, GROUPS; docs/runtime.md, "Beyond
 * the declared load"): select switches to `plan` when the group's counts
 * give some rank more than `fit_rows` rows. Bytes and exposed time are lines
 * in this rank's rows: base + per_row * rows. plan is -1, fit_rows and every
 * line 0, where there is no fallback: a dense layer, or a 1.0 blob. */
typedef struct kiln_rt_group_info {
	int32_t plan;
	uint64_t fit_rows;
	uint64_t resident_base_bytes, resident_per_row_bytes;
	uint64_t saved_base_bytes, saved_per_row_bytes;
	uint64_t transient_base_bytes, transient_per_row_bytes;
	double exposed_base_us, exposed_per_row_us;
} kiln_rt_group_info;

int kiln_rt_group_get(const kiln_rt *rt, int32_t model_layer, kiln_rt_group_info *out);

/* ---------------------------------------------------------------- select */

/* free_bytes value that asks select to derive free memory and pending
 * micro-batches from the handle's accounting. */
#define KILN_RT_FREE_FROM_ACCOUNTING UINT64_MAX

typedef struct kiln_query {
	int32_t stage;
	int32_t layer;          /* model layer number; must lie on stage */
	const uint32_t *tokens; /* rows per local expert, n_tokens entries; NULL: use total_rows */
	int32_t n_tokens;
	uint64_t total_rows;    /* rows routed to this device's experts, when tokens is NULL */
	uint64_t free_bytes;    /* device bytes free now, or KILN_RT_FREE_FROM_ACCOUNTING */
	uint32_t pending;       /* micro-batches that will start a forward on this stage before
	                           memory is next freed (1F1B warm-up); they are kept room for */
	uint32_t microbatch;    /* the deciding micro-batch, as given to kiln_rt_acct_record
	                           (used with KILN_RT_FREE_FROM_ACCOUNTING) */
	uint64_t held_bytes;    /* device bytes the deciding micro-batch already holds on this
	                           stage (its fixed activations and earlier layers); taken from
	                           accounting with KILN_RT_FREE_FROM_ACCOUNTING; 0: unknown */
	/* Optional, blob 1.1 (docs/runtime.md, "Beyond the declared load"): the
	 * rows every rank of this device's EP group receives at this layer, as
	 * the count exchange before the dispatch all-to-all tells every rank
	 * (group_size entries, this rank's among them, in any order); NULL or
	 * group_size 0: no group counts (no group plan, no step 8's slack). */
	const uint32_t *group_rows;
	int32_t group_size;
} kiln_query;

enum {
	KILN_PLAN_OVER_BUDGET = 1u << 0,    /* nothing fits: the maximal-saving plan, best effort */
	KILN_PLAN_LOAD_BEYOND = 1u << 1,    /* load above max_factor: the last bucket's numbers,
	                                       which underestimate */
	KILN_PLAN_GROUP_FALLBACK = 1u << 2, /* some rank of the group is past the set's
	                                       fit_rows: the group's plan (full recompute's,
	                                       or a cheaper one that never holds more device
	                                       memory), the same on every rank of the group */
	KILN_PLAN_GROUP_SLACK = 1u << 3     /* a more loaded rank of the group takes longer:
	                                       the plan saves more than this rank needs, within
	                                       the exposed time of that rank's decision */
};

typedef struct kiln_plan {
	const uint8_t *actions; /* one kiln_rt_action per unit; borrowed from the blob */
	int32_t n_units;
	int32_t plan;           /* plan pool index */
	int32_t template_id;    /* template to follow (kiln_rt_template_get), or -1 */
	int32_t bucket;
	double load_factor;     /* observed: rows / balanced rows (0 for dense layers) */
	uint64_t need_bytes;    /* bytes this layer had to save */
	uint64_t saved_bytes;   /* bytes the plan saves (at least), at the bucket's upper edge */
	uint64_t resident_bytes; /* bytes the plan keeps (at most), at the bucket's upper edge */
	uint64_t avail_bytes;   /* free bytes minus the reserve for later work */
	float exposed_us;       /* estimated extra time on the critical path */
	uint32_t flags;         /* KILN_PLAN_* */
	/* With KILN_PLAN_GROUP_FALLBACK: the fallback's backward transient at
	 * this rank's rows (its resident and saved bytes above are exact at
	 * these rows too); else 0. */
	uint64_t transient_bytes;
	uint64_t group_max_rows; /* the most rows of any rank of the group; 0 without counts */
} kiln_plan;

/* One decision. Load rounds up to its bucket and the bytes to save round up
 * to the table's quantum, so a plan with neither flag fits: its units' real
 * bytes at these rows <= resident_bytes <= avail_bytes. avail is free memory
 * minus a reserve for work still to come (this micro-batch's later layers
 * on the stage at their floor, the stage transient, and each pending
 * micro-batch at the stage's steady bytes), and on the first try also at
 * most the micro-batch's fair share, an n-th of the room spread over the
 * layers as the steady plan's bytes (head_steady_bytes, scaled by the room
 * over ceil(inflight) micro-batches at the steady bytes, beside the
 * transient in capacity - static) less held_bytes; the room for pending
 * micro-batches shrinks by that factor where it is below 1; when
 * no plan fits, the share is dropped, then the pending micro-batches are
 * reserved only their floor (docs/runtime.md). Of the points that fit,
 * the cheapest, except where the layer must save something or the share was
 * dropped: then the largest saving whose exposed time is within 3% of the
 * table's maximal-saving exposed time of the cheapest (the knee), so that
 * a layer does not keep gigabytes to save a millisecond that its
 * micro-batch's later layers then pay for many times over. With
 * KILN_PLAN_LOAD_BEYOND the figures are the last bucket's and the real bytes
 * may exceed them. With group_rows (blob 1.1), when some rank of the
 * group has more rows than the set's fit_rows, every rank of the group
 * gets the set's fallback plan instead, with KILN_PLAN_GROUP_FALLBACK: a
 * function of the blob, the layer and the largest count only, so every
 * rank given the same counts in any order answers alike (docs/runtime.md,
 * "Beyond the declared load"). Never allocates, never blocks; safe from
 * many threads on one handle; O(n_tokens + group_size) plus two table
 * lookups with short scans, and one lookup for the knee. */
int kiln_rt_select(const kiln_rt *rt, const kiln_query *q, kiln_plan *out);

/* ---------------------------------------------------------------- templates */

typedef enum {
	KILN_RT_STREAM_COMPUTE,
	KILN_RT_STREAM_COMM,
	KILN_RT_STREAM_D2H,
	KILN_RT_STREAM_H2D
} kiln_rt_stream;

typedef enum {
	KILN_RT_TASK_FORWARD,
	KILN_RT_TASK_BACKWARD,
	KILN_RT_TASK_RECOMPUTE,
	KILN_RT_TASK_COPY,
	KILN_RT_TASK_COMM
} kiln_rt_task_kind;

typedef struct kiln_rt_template_info {
	int32_t plan;
	int32_t n_tasks;
	int32_t n_deps;
	float makespan_us, serial_us, base_us, load_factor;
} kiln_rt_template_info;

typedef struct kiln_rt_task {
	const char *name;  /* borrowed from the blob */
	int stream;        /* kiln_rt_stream */
	int kind;          /* kiln_rt_task_kind */
	int chain;         /* 0: the forward micro-batch, 1: the backward one */
	int32_t unit;      /* the unit a copy or recompute serves, or -1 */
} kiln_rt_task;

int kiln_rt_template_get(const kiln_rt *rt, int32_t template_id, kiln_rt_template_info *out);
/* Task i of a template, in start order. */
int kiln_rt_template_task(const kiln_rt *rt, int32_t template_id, int32_t i, kiln_rt_task *out);
/* Dependency j of a template: task *out_task waits for task *out_dep to end. */
int kiln_rt_template_dep(const kiln_rt *rt, int32_t template_id, int32_t j, int32_t *out_task,
                         int32_t *out_dep);

/* ---------------------------------------------------------------- accounting */

typedef enum {
	KILN_ACCT_PRODUCED,  /* bytes written on the device */
	KILN_ACCT_FREED,     /* device bytes released (consumed by backward, or dropped) */
	KILN_ACCT_OFFLOADED, /* device bytes moved to host */
	KILN_ACCT_RELOADED,  /* host bytes moved back to the device */
	KILN_ACCT_DROPPED    /* host bytes released */
} kiln_acct_event;

typedef struct kiln_acct {
	uint64_t limit_bytes;  /* activation bytes the device may hold */
	uint64_t device_bytes; /* held now */
	uint64_t host_bytes;   /* offloaded now */
	uint64_t peak_device_bytes;
	uint32_t open_microbatches; /* holding device or host bytes */
	uint64_t free_bytes;   /* limit - device (0 when over) */
} kiln_acct;

/* Starts accounting for stage with limit_bytes of device memory for
 * activations (0: the stage's capacity minus its static bytes); clears every
 * counter. Not thread-safe against other accounting calls. */
int kiln_rt_acct_reset(kiln_rt *rt, int32_t stage, uint64_t limit_bytes);
/* Records one event for micro-batch mb. Thread-safe and lock-free; refuses
 * (KILN_RT_EACCT, nothing changed) an event that would make a count negative
 * or take it past UINT64_MAX. */
int kiln_rt_acct_record(kiln_rt *rt, uint32_t mb, kiln_acct_event ev, uint64_t bytes);
/* A consistent-enough snapshot (each counter read atomically). */
void kiln_rt_acct_get(const kiln_rt *rt, kiln_acct *out);

/* ---------------------------------------------------------------- copy engine */

typedef enum { KILN_COPY_HOST, KILN_COPY_HIP, KILN_COPY_CUDA } kiln_copy_backend;

typedef struct kiln_copy_config {
	kiln_copy_backend backend;
	size_t pool_bytes;     /* host (pinned, for HIP and CUDA) pool size */
	uint32_t max_buffers;  /* offloaded buffers held at once (0: 1024) */
	int device;            /* HIP/CUDA device ordinal */
	const char *library;   /* dlopen name override (NULL: the backend's defaults) */
} kiln_copy_config;

typedef struct kiln_copy kiln_copy;
typedef uint64_t kiln_copy_event; /* completion ticket; 0 is never issued */

/* Opens a copy engine: loads the backend (dlopen for HIP and CUDA), checks
 * for a device, allocates the host pool and starts its worker or stream.
 * KILN_RT_EUNAVAILABLE / KILN_RT_ENODEVICE when the backend cannot run. */
int kiln_copy_open(const kiln_copy_config *cfg, kiln_copy **out);
/* Queues a copy of bytes from device memory src (host memory for the host
 * backend) into a new pool buffer; *out_buf names it, *out_ev completes
 * when the copy is done. src must stay valid until then. */
int kiln_copy_offload(kiln_copy *ce, const void *src, size_t bytes, uint32_t *out_buf,
                      kiln_copy_event *out_ev);
/* Queues a copy of buffer buf back to dst (its offload must have been
 * queued); the buffer is released when the copy completes. */
int kiln_copy_reload(kiln_copy *ce, uint32_t buf, void *dst, kiln_copy_event *out_ev);
/* Releases an offloaded buffer without reloading it (after its offload completed). */
int kiln_copy_drop(kiln_copy *ce, uint32_t buf);
/* 1 when ev has completed, 0 when not yet, or an error. Never blocks. */
int kiln_copy_query(kiln_copy *ce, kiln_copy_event ev);
/* Blocks until ev completes; returns 0 or the copy's error. */
int kiln_copy_wait(kiln_copy *ce, kiln_copy_event ev);
/* Waits for every queued copy, stops the worker, frees the pool (NULL allowed). */
void kiln_copy_close(kiln_copy *ce);

typedef struct kiln_copy_probe_report {
	const char *library;      /* the name that loaded, or NULL */
	int32_t n_required, n_optional; /* symbols listed */
	int32_t n_resolved;       /* of all listed */
	const char *missing;      /* first required symbol that did not resolve, or NULL */
	int32_t devices;          /* device count, when the call succeeded; else -1 */
	int status;               /* what kiln_copy_open would fail with, or 0 */
} kiln_copy_probe_report;

/* Loads backend b's library (or library), resolves every listed symbol and
 * asks for the device count, without opening an engine; for tests and
 * diagnostics. Returns report->status. */
int kiln_copy_probe(kiln_copy_backend b, const char *library, kiln_copy_probe_report *out);

#ifdef __cplusplus
}
#endif

#endif
