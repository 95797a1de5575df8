/* codegen/codegen.h: everything the compiler writes for people and tools.
 *
 * json.c is the one file that uses cJSON; the rest build documents through
 * the small kiln_json API below, so key names and number formatting live in
 * one place.
 */
#ifndef KILN_CODEGEN_H
#define KILN_CODEGEN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ir/ir.h"

/* ---------------------------------------------------------------- json.c */

/* A JSON value. Documents are trees owned by their root: free the root
 * with kiln_json_free. Every add function tolerates a NULL parent (it then
 * does nothing and returns NULL), so a failed allocation surfaces once, at
 * kiln_json_write, instead of at every call site. */
typedef struct kiln_json kiln_json;

kiln_json *kiln_json_object(void);
kiln_json *kiln_json_array(void);
/* Adds a child object or array; key is ignored (may be NULL) when parent is an
 * array. The child is owned by parent. */
kiln_json *kiln_json_add_object(kiln_json *parent, const char *key);
kiln_json *kiln_json_add_array(kiln_json *parent, const char *key);
void kiln_json_add_number(kiln_json *parent, const char *key, double v);
/* An integer, printed exactly in decimal whatever its size (a double holds
 * integers exactly only up to 2^53): every integer field of kiln's JSON
 * (byte counts, rows, counts, indices, seeds) goes through these. */
void kiln_json_add_u64(kiln_json *parent, const char *key, uint64_t v);
void kiln_json_add_i64(kiln_json *parent, const char *key, int64_t v);
void kiln_json_add_string(kiln_json *parent, const char *key, const char *v);
void kiln_json_add_bool(kiln_json *parent, const char *key, bool v);
void kiln_json_add_null(kiln_json *parent, const char *key);
/* Writes the document, pretty-printed, with a trailing newline. Returns 0,
 * KILN_JSON_ENOMEM when building or printing the document ran out of
 * memory (nothing written), or KILN_JSON_EWRITE when a write to out failed
 * (errno and ferror(out) tell why). */
enum { KILN_JSON_ENOMEM = -1, KILN_JSON_EWRITE = -2 };
int kiln_json_write(const kiln_json *root, FILE *out);
void kiln_json_free(kiln_json *root);

/* Parsing kiln's own JSON back (tests): cJSON's reading, which is lax
 * (leading zeros, trailing content and duplicate keys pass). */
kiln_json *kiln_json_parse(const char *text, size_t len);

/* Why a text is not (strict) JSON, and where: line and column from 1, the
 * column in characters (UTF-8). */
typedef struct kiln_json_error {
	int line, col;
	char reason[192];
} kiln_json_error;

/* Parses len bytes of untrusted text (`kilnc import hf`'s configs) as
 * exactly one JSON value by RFC 8259's grammar, with what JSON parsers
 * disagree on refused: leading zeros, NaN and Infinity, content after the
 * value, a NUL byte anywhere, \u0000 in a string, lone UTF-16 surrogates,
 * nesting over 1000 levels, and an object with the same key twice (cJSON
 * keeps the first, Python's json the last). A UTF-8 byte order mark is
 * skipped. Returns the document (owned by the caller, kiln_json_free), or
 * NULL with *out_err set to the first problem (out of memory included).
 * O(len log len). */
kiln_json *kiln_json_parse_strict(const char *text, size_t len, kiln_json_error *out_err);
/* Member of an object by key, element of an array by index; NULL when absent. */
const kiln_json *kiln_json_get(const kiln_json *obj, const char *key);
const kiln_json *kiln_json_at(const kiln_json *arr, int index);
int kiln_json_size(const kiln_json *arr);
bool kiln_json_is_number(const kiln_json *v);
double kiln_json_number(const kiln_json *v); /* NaN when not a number */
const char *kiln_json_string(const kiln_json *v); /* NULL when not a string */
bool kiln_json_is_bool(const kiln_json *v);
bool kiln_json_bool(const kiln_json *v); /* false when not a boolean */
bool kiln_json_is_null(const kiln_json *v);
bool kiln_json_is_object(const kiln_json *v);
bool kiln_json_is_array(const kiln_json *v);
bool kiln_json_is_string(const kiln_json *v);
/* What v is, for messages: "an object", "an array", "a string", "a
 * number", "a boolean", "null" (static strings); "nothing" for NULL. */
const char *kiln_json_kind(const kiln_json *v);

/* ---------------------------------------------------------------- report.c */

/* `kilnc check`: a one-screen summary of a validated model and its graph. */
void kiln_report_check(const kiln_ir_graph *g, FILE *out);

/* `kilnc report`: per-stage memory and the iteration estimate, as text. */
void kiln_report_text(const kiln_ir_graph *g, FILE *out);

/* The same as one JSON document (keys in docs/cli.md). Caller frees. */
kiln_json *kiln_report_json(const kiln_ir_graph *g);

/* ---------------------------------------------------------------- plans.c */

struct kiln_compilation;

/* `kilnc compile`: stages whose safety bound is below load.max_factor. */
int32_t kiln_plans_infeasible_stages(const struct kiln_compilation *c);
/* The exit-3 message: each such stage with its largest feasible factor. */
void kiln_plans_report_infeasible(const struct kiln_compilation *c, FILE *err);
/* A summary of budgets, frontiers and baselines, as text. */
void kiln_plans_text(const struct kiln_compilation *c, FILE *out);
/* The plan tables as one JSON document (keys in docs/cli.md). Caller frees. */
kiln_json *kiln_plans_json(const struct kiln_compilation *c);

/* ---------------------------------------------------------------- blob.c */

/* The plan blob of a finished compilation (docs/blob-format.md), in a new
 * malloc'd buffer (*out, *out_len; the caller frees *out). Deterministic:
 * the same compilation gives the same bytes. Returns 0, or -1 with a
 * message on err. */
int kiln_blob_build(const struct kiln_compilation *c, FILE *err, unsigned char **out,
                    size_t *out_len);
/* FNV-1a 64 of the normalised model description (every validated field,
 * defaults applied, the file path left out). */
uint64_t kiln_blob_model_hash(const kiln_model *m);

/* ---------------------------------------------------------------- views */

struct kiln_plan_schedule;

/* trace.c: Chrome trace-event JSON (Perfetto, chrome://tracing) of the
 * schedule's stage timelines: one process per stage, one thread per stream,
 * one complete event per task, category = task kind (docs/schedule.md).
 * Returns 0 or -1 (out of memory or a failed write). */
int kiln_trace_write(const struct kiln_plan_schedule *s, FILE *out);

/* trace.c: the names both views show for a kiln_stream ("compute",
 * "communication", "device-to-host", "host-to-device") and a kiln_task_kind
 * ("forward", "backward", "recompute", "copy", "communication"); "?" out of
 * range. Static strings. */
const char *kiln_view_stream_name(int stream);
const char *kiln_view_kind_name(int kind);

/* svg.c: the same timelines as an SVG readable without a browser: a row per
 * stage (a lane per stream), a time axis with units, a legend. Returns 0 or -1. */
int kiln_svg_write(const struct kiln_plan_schedule *s, FILE *out);

/* mlir.c (the one file that uses the MLIR C API): the lowered graph, units
 * with their costs, frontiers and templates as MLIR in generic syntax with
 * the unregistered `kiln` dialect (docs/mlir-dialect.md). The text is parsed
 * back through the C API before it is written. Returns 0, or -1 with a
 * message on err. */
int kiln_mlir_emit(const struct kiln_compilation *c, FILE *out, FILE *err);

/* Reads the schedule (templates and stage timelines) back from emitted MLIR
 * text (len bytes, borrowed) into a-owned memory. Returns 0, or -1 with a
 * message on err (bad MLIR, not kiln's, missing attributes). */
int kiln_mlir_read_schedule(const char *text, size_t len, kiln_arena *a,
                            struct kiln_plan_schedule *out, FILE *err);

#endif
