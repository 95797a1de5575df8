/* fuzz/fuzz_yaml.c: libFuzzer target for the YAML frontend.
 *
 * Each input is a model description, fed through kiln_frontend_load_buffer
 * into a fresh arena with diagnostics written to /dev/null (so the
 * formatting of every message runs too). A description the frontend accepts
 * has passed validation, so the rest of the compiler trusts it: lowering it
 * must succeed and the graph must verify, or the frontend let through
 * something it should have refused. The arena is freed on every path, so
 * LeakSanitizer catches anything allocated outside it. docs/fuzzing.md says
 * how to run it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "frontend/frontend.h"
#include "passes/passes.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *devnull;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	devnull = fopen("/dev/null", "w");
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kiln_arena *a = kiln_arena_new();
	if (!a)
		return 0;
	kiln_model *m = NULL;
	int rc = kiln_frontend_load_buffer("fuzz.yaml", (const char *)data, size, a, devnull, &m);
	if (rc == KILN_FRONTEND_OK) {
		if (!m)
			__builtin_trap(); /* OK must come with a model */
		kiln_ir_graph *g = NULL;
		/* Lowering can only fail on memory exhaustion, which an
		 * accepted description (bounded by the frontend's limits)
		 * must not reach. */
		if (kiln_pass_lower(m, a, &g) != 0 || !g)
			__builtin_trap();
		if (kiln_ir_graph_verify(g, devnull) != 0)
			__builtin_trap();
	} else if (m) {
		__builtin_trap(); /* failure must leave *out NULL */
	}
	kiln_arena_free(a);
	return 0;
}
