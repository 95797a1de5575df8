/* frontend/internal.h: the frontend's private surface, one group per file.
 *
 * The pipeline is: read bytes (source.c) -> node tree (yaml.c) -> typed
 * fields per section (schema.c) -> rules, defaults, derived sizes
 * (validate.c, hardware.c). Diagnostics are collected in a kiln_fe_ctx
 * (diag.c) and printed once, sorted, at the end. Everything is allocated
 * from the caller's arena. frontend.c, the entry points, runs the pipeline.
 */
#ifndef KILN_FRONTEND_INTERNAL_H
#define KILN_FRONTEND_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "frontend/frontend.h"

#if defined(__GNUC__)
#define KILN_FE_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KILN_FE_PRINTF(f, a)
#endif

/* ---------------------------------------------------------------- diag.c */

typedef struct kiln_fe_note {
	struct kiln_fe_note *next;
	const char *file;
	int line, col; /* 1-based; 0: no position */
	const char *msg;
} kiln_fe_note;

typedef struct kiln_fe_diag {
	const char *file;
	int file_index; /* order of the file in this load: the model is 0 */
	int line, col;  /* 1-based; 0: the whole file */
	unsigned seq;   /* tie-break: order of report */
	const char *msg;
	kiln_fe_note *notes;
	kiln_fe_note **notes_tail;
} kiln_fe_diag;

/* One load's diagnostics. Keeps the KILN_FRONTEND_MAX_ERRORS earliest errors
 * (by file, line, column) and counts the rest, so memory stays bounded however
 * many errors a hostile file produces. */
typedef struct kiln_fe_ctx {
	kiln_arena *a;    /* borrowed */
	const char *file; /* file that new diagnostics name; borrowed */
	int file_index;
	int n_files;
	kiln_fe_diag *kept[KILN_FRONTEND_MAX_ERRORS];
	size_t n_kept;
	uint64_t n_errors;
	unsigned seq;
	bool nomem;
} kiln_fe_ctx;

/* Starts a context whose diagnostics name file (borrowed; must outlive c). */
void kiln_fe_ctx_init(kiln_fe_ctx *c, kiln_arena *a, const char *file);
/* Makes file (borrowed) the current file, with a new file index; returns the
 * previous (file, index) in *out_file / *out_index for kiln_fe_ctx_restore. */
void kiln_fe_ctx_enter(kiln_fe_ctx *c, const char *file, const char **out_file, int *out_index);
void kiln_fe_ctx_restore(kiln_fe_ctx *c, const char *file, int index);
/* Records an error at line:col (1-based; 0, 0 for the whole file) of the
 * current file. Returns the diagnostic to attach notes to, or NULL when it was
 * not kept (over the cap, or out of memory); the pointer is arena-owned. */
kiln_fe_diag *kiln_fe_error(kiln_fe_ctx *c, int line, int col, const char *fmt, ...)
    KILN_FE_PRINTF(4, 5);
/* Adds a note (in the current file) to d; d may be NULL (then nothing). */
void kiln_fe_note_at(kiln_fe_ctx *c, kiln_fe_diag *d, int line, int col, const char *fmt, ...)
    KILN_FE_PRINTF(5, 6);
/* Marks the load as failed for lack of memory. */
void kiln_fe_oom(kiln_fe_ctx *c);
/* Writes the kept diagnostics, sorted, to diag (NULL: nowhere), then a
 * "too many errors" line if some were dropped. Returns KILN_FRONTEND_OK when
 * nothing was reported, KILN_FRONTEND_NOMEM after exhaustion, else
 * KILN_FRONTEND_INVALID. */
int kiln_fe_ctx_finish(kiln_fe_ctx *c, FILE *diag);
/* A printable, quoted form of len bytes of s for messages: escaped by
 * kiln_text_escape, at most 64 characters (longer ends in "..."). Arena-owned;
 * never NULL (a static placeholder on exhaustion). */
const char *kiln_fe_show(kiln_fe_ctx *c, const char *s, size_t len);

/* ---------------------------------------------------------------- yaml.c */

typedef enum { KILN_FE_SCALAR, KILN_FE_MAP, KILN_FE_SEQ } kiln_fe_kind;

/* A YAML node. Mappings keep (key, value) pairs in order, duplicates
 * included: items[2 * i] is a key and items[2 * i + 1] its value. An alias is
 * a shallow copy of the anchored node carrying the alias's position. */
typedef struct kiln_fe_node {
	kiln_fe_kind kind;
	int line, col;    /* 1-based start of the node */
	const char *text; /* SCALAR: value, NUL-terminated (may hold NULs) */
	size_t len;       /* SCALAR: bytes in text */
	bool plain;       /* SCALAR: written unquoted (may be a number or null) */
	bool broken;      /* already reported (unknown alias): stay silent */
	struct kiln_fe_node **items;
	size_t n; /* MAP: pairs; SEQ: items */
	/* Parser bookkeeping. */
	struct kiln_fe_node *next;
	size_t weight; /* nodes after alias expansion, saturating */
	bool open;
} kiln_fe_node;

/* Parses len bytes of text (borrowed) into a tree of arena-owned nodes.
 * Iterative; enforces KILN_FRONTEND_MAX_DEPTH, KILN_FRONTEND_MAX_NODES and
 * KILN_FRONTEND_MAX_ANCHORS while reading events. On success *out is the root
 * of the single document, which is a mapping. Returns 0, or -1 after
 * reporting errors to c (*out is then NULL). */
int kiln_fe_yaml_parse(kiln_fe_ctx *c, const char *text, size_t len, kiln_fe_node **out);

/* ---------------------------------------------------------------- schema.c */

typedef enum {
	KILN_FE_S_TOP,
	KILN_FE_S_MODEL,
	KILN_FE_S_MLA,
	KILN_FE_S_MOE,
	KILN_FE_S_TRAINING,
	KILN_FE_S_PARALLEL,
	KILN_FE_S_LOAD,
	KILN_FE_S_MEGATRON,
	KILN_FE_S_HW,
	KILN_FE_S_COUNT
} kiln_fe_section;

typedef enum {
	KILN_FE_T_INT,       /* any int64 */
	KILN_FE_T_POS,       /* int64 >= 1 */
	KILN_FE_T_NONNEG,    /* int64 >= 0 */
	KILN_FE_T_FLOAT,     /* finite number */
	KILN_FE_T_FLOAT_POS, /* finite number > 0 */
	KILN_FE_T_BOOL,
	KILN_FE_T_STRING,
	KILN_FE_T_ENUM,
	KILN_FE_T_MAP,
	KILN_FE_T_SEQ,
	KILN_FE_T_HW /* a string or a mapping */
} kiln_fe_type;

typedef enum {
#define X(id, sec, key, type, values) KILN_FE_F_##id,
#include "frontend/schema.def"
#undef X
	KILN_FE_F_COUNT
} kiln_fe_field_id;

typedef enum {
	KILN_FE_ABSENT, /* not in the file: the default applies */
	KILN_FE_SET,    /* present and well-typed */
	KILN_FE_BAD     /* present but rejected, or missing though required:
	                 * an error was reported, rules that read it are skipped */
} kiln_fe_state;

typedef struct kiln_fe_field {
	kiln_fe_state state;
	const kiln_fe_node *key;   /* NULL when absent */
	const kiln_fe_node *value; /* NULL when absent */
	int64_t i;                 /* INT, POS, NONNEG; ENUM: index in the list */
	double f;                  /* FLOAT, FLOAT_POS */
	bool b;                    /* BOOL */
	const char *s;             /* STRING: NUL-terminated, arena-owned */
} kiln_fe_field;

/* The key of a field ("layers"), its section's name ("model"), its section. */
const char *kiln_fe_field_key(kiln_fe_field_id id);
const char *kiln_fe_section_name(kiln_fe_section s);
kiln_fe_section kiln_fe_field_section(kiln_fe_field_id id);

/* Reads the mapping map (borrowed) as section s into fields[] (the entries of
 * that section only): reports keys that are not scalars, unknown keys (with a
 * suggestion), duplicates (with a note at the first) and values of the wrong
 * type. A field not in map keeps its state (callers start from ABSENT). */
void kiln_fe_section_read(kiln_fe_ctx *c, kiln_fe_section s, const kiln_fe_node *map,
                          kiln_fe_field *fields);
/* Marks every field of section s BAD (its mapping was missing or unusable). */
void kiln_fe_section_poison(kiln_fe_section s, kiln_fe_field *fields);

/* Parses an integer scalar for key (named in messages). Returns true and sets
 * *out, or reports why not and returns false. */
bool kiln_fe_node_int(kiln_fe_ctx *c, const kiln_fe_node *n, const char *key, int64_t *out);
/* What n is, for messages: "a mapping", "a sequence", "null", or the quoted
 * scalar. Arena-owned. */
const char *kiln_fe_node_describe(kiln_fe_ctx *c, const kiln_fe_node *n);
/* The candidate closest to the len bytes of word: one that starts with word
 * (at least 2 bytes), else the first at edit distance <= 2 (ignoring case,
 * '-' equal to '_'). NULL when none is close. Borrowed from cands. */
const char *kiln_fe_suggest(const char *word, size_t len, const char *const *cands, size_t n);

/* ---------------------------------------------------------------- source.c */

/* Reads the whole file at path (borrowed) into arena memory, refusing files
 * over KILN_FRONTEND_MAX_FILE_BYTES after reading at most that many bytes plus
 * one. Errors are reported at line:col of the current file (0, 0: the whole
 * file) and name path. Returns true with *out_text (arena-owned, NUL
 * terminated) and *out_len, or false after reporting. */
bool kiln_fe_read_file(kiln_fe_ctx *c, const char *path, int line, int col, char **out_text,
                       size_t *out_len);
/* Text (borrowed) within the size limit: parse to the root mapping. Reports
 * an oversized text. Returns the root or NULL after reporting. */
kiln_fe_node *kiln_fe_parse_text(kiln_fe_ctx *c, const char *text, size_t len);

/* ---------------------------------------------------------------- hardware.c */

/* The profile named by the hardware: value v (borrowed; key is its key, where
 * missing inline keys are reported): a shipped name, a path (relative to
 * base_dir, may be NULL for the current directory), or an inline mapping.
 * model_path names the model file for an inline profile's source. Returns
 * true with *out filled (strings arena-owned), or false after reporting. */
bool kiln_fe_hardware_resolve(kiln_fe_ctx *c, const kiln_fe_node *key, const kiln_fe_node *v,
                              const char *base_dir, const char *model_path, kiln_hardware *out);
/* The profile in the file at path (borrowed); source is path. */
bool kiln_fe_hardware_file(kiln_fe_ctx *c, const char *path, kiln_hardware *out);
/* The shipped profile called name, or false after reporting (at line:col of
 * the current file; 0, 0 for none) an unknown name with a suggestion. */
bool kiln_fe_hardware_shipped(kiln_fe_ctx *c, const char *name, int line, int col,
                              kiln_hardware *out);

/* ---------------------------------------------------------------- validate.c */

/* Builds the model from the root mapping (borrowed): schema, defaults, every
 * rule, derived fields. path is the model's file name; base_dir the directory
 * relative hardware paths resolve against (NULL: current directory). Returns
 * an arena-owned model, or NULL after reporting errors. */
kiln_model *kiln_fe_model_build(kiln_fe_ctx *c, const kiln_fe_node *root, const char *path,
                                const char *base_dir);

#endif
