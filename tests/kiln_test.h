/* tests/kiln_test.h: helpers shared by the test suites. */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ir/ir.h"
#include "kiln/runtime.h"
#include "passes/passes.h"

/* Result of running kilnc: exit status (or -1 when it did not exit
 * normally, e.g. a crash), and its whole stdout and stderr, NUL-terminated,
 * owned by the caller (free with kt_run_free). */
typedef struct kt_run {
	int status;
	char *out;
	size_t out_len;
	char *err;
	size_t err_len;
} kt_run;

/* Runs the kilnc under test with argv (NULL-terminated, argv[0] excluded),
 * with stdout redirected to stdout_path when it is not NULL. */
kt_run kt_kilnc(const char *const *args, const char *stdout_path);
void kt_run_free(kt_run *r);

/* Runs a shell command (printf-style) with stderr folded into stdout;
 * returns its exit status (-1 when it did not exit normally) and, in *out
 * unless out is NULL, its whole output (caller frees). */
int kt_sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Writes len bytes to a new temporary file; returns its path (caller frees
 * and unlinks). */
char *kt_temp_file(const char *suffix, const void *data, size_t len);

/* How many times needle (not empty) occurs in hay, overlaps included, in one
 * pass: a strstr loop would do, but ASan's strstr measures the whole rest of
 * the haystack on every call, which makes such a loop quadratic under the
 * sanitizers (33 s of CPU for tiny's 7.8 MB of MLIR). */
size_t kt_count(const char *hay, const char *needle);

/* Path of a file in the source tree (static buffer, valid until next call). */
const char *kt_src(const char *rel);

/* A model built in C for tests of the IR and cost model, with every field
 * set: kt_model_init gives a small dense model on one device; change what
 * the test is about, then kt_model_finish derives the stage split and sizes
 * as the frontend does. */
typedef struct kt_model {
	kiln_model m;
	int64_t chunks[64];
} kt_model;

void kt_model_init(kt_model *t);
void kt_model_finish(kt_model *t);

/* The shipped example models, relative to the source tree. */
extern const char *const kt_shipped[];
#define KT_N_SHIPPED 7

/* Loads a shipped model (path relative to the source tree) and runs every
 * pass with solver; asserts success. *out_a receives the arena the caller
 * frees. */
struct kiln_compilation kt_compile(const char *rel, int solver, kiln_arena **out_a);

/* The same compilation (planned without offloading when no_offload is set,
 * as the simulator's kiln:no-offload wants it), from a cache of this test
 * process: each (model, solver, no_offload) is compiled once per process,
 * and both variants of a model share one loaded kiln_model. Criterion 2.4
 * starts every test in a fresh process (BoxFort re-executes the binary), so
 * the cache serves the tests that compile one model several times; nothing
 * is shared between tests. The compilation and everything it points to
 * belong to the cache until the process exits: read it, copy the struct,
 * never change or free it. Asserts success. */
const struct kiln_compilation *kt_compiled(const char *rel, int solver, bool no_offload);

/* Test tiers. `make check` runs the quick tier (KILN_TEST_TIER=quick) and
 * `make test` the full one (KILN_TEST_TIER unset or "full"). A test tagged
 * `.init = kt_slow` is skipped in the quick tier, and Criterion reports it
 * as skipped, not passed; any other value of KILN_TEST_TIER fails the test.
 * Tag the heavy cases: loops over every shipped model, MILP cross-checks,
 * exact simulations, trainer runs of many steps, exhaustive loops over a
 * blob's bytes. It may also be called first thing in a test's body. */
void kt_slow(void);

/* The runtime's fair scale of a stage (docs/runtime.md, step 5), by its
 * formula from the public stage figures: the room (capacity less static
 * less transient) over the in-flight micro-batches (ceil) at the steady
 * bytes; 1 without steady bytes, 0 without room. */
double kt_fair_scale(const kiln_rt_stage_info *si);

/* Lowers m into a new arena (*arena, the caller frees it) and asserts the
 * graph verifies. */
kiln_ir_graph *kt_lower_ok(const kiln_model *m, kiln_arena **arena);

#endif
