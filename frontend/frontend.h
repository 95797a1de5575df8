/* frontend/frontend.h: model descriptions and hardware profiles from YAML.
 *
 * Only frontend/yaml.c includes libyaml. Bad input is reported as
 * "FILE:LINE:COL: error: MESSAGE" lines (with "note:" lines where a hint
 * helps) on the diag stream; every error in the file is reported, up to a cap.
 */
#ifndef KILN_FRONTEND_H
#define KILN_FRONTEND_H

#include <stddef.h>
#include <stdio.h>

#include "ir/ir.h"

/* Limits that bound time and memory on hostile input (documented in docs/model-format.md). */
#define KILN_FRONTEND_MAX_FILE_BYTES (1u << 20) /* 1 MiB */
#define KILN_FRONTEND_MAX_DEPTH 32
#define KILN_FRONTEND_MAX_NODES 100000 /* after alias expansion */
#define KILN_FRONTEND_MAX_ERRORS 100
#define KILN_FRONTEND_MAX_ANCHORS 256   /* distinct anchor names per file */
#define KILN_FRONTEND_MAX_LAYERS 4096 /* model.layers: 30x any real model, keeps the IR small */
/* Micro-batches per iteration (global_batch / (micro_batch * dp)): 256x the
 * largest real schedule (4,096), so every count the compiler, the runtime
 * (32-bit micro-batch ids) and the simulator keep of them fits. */
#define KILN_FRONTEND_MAX_MICRO_BATCHES (1 << 20)

/* Status codes. */
enum {
	KILN_FRONTEND_OK = 0,
	KILN_FRONTEND_INVALID = 1, /* the input had errors; diagnostics were written */
	KILN_FRONTEND_NOMEM = -1   /* out of memory; a message was written */
};

/* Reads, validates and fills a model from the file at path (borrowed).
 * On KILN_FRONTEND_OK, *out is an arena-owned model, valid until a is freed.
 * diag receives diagnostics (NULL: discard). A relative hardware path is
 * resolved against the directory of path. */
int kiln_frontend_load_file(const char *path, kiln_arena *a, FILE *diag, kiln_model **out);

/* Same, from len bytes of text (borrowed); name is used in diagnostics, and
 * relative hardware paths resolve against the current directory. */
int kiln_frontend_load_buffer(const char *name, const char *text, size_t len, kiln_arena *a,
                              FILE *diag, kiln_model **out);

/* The shipped hardware profiles, compiled into the binary. */
size_t kiln_frontend_hardware_count(void);
const char *kiln_frontend_hardware_name(size_t i);
/* Reads a hardware profile: a shipped name, or a path. */
int kiln_frontend_load_hardware(const char *name_or_path, kiln_arena *a, FILE *diag,
                                kiln_hardware *out);

#endif
