/* passes/passes.h: the compiler's passes, run in order by pipeline.c. */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include <stdio.h>

#include "ir/ir.h"

/* lower.c */

/* Lowers a validated model to the graph IR: per stage, the embedding (first
 * stage), the transformer layers of each model chunk, and the output layer
 * and loss (last stage), each with forward and backward ops and the tensors
 * they produce. The graph is arena-owned. Returns 0, or -1 on exhaustion. */
int kiln_pass_lower(const kiln_model *m, kiln_arena *a, kiln_ir_graph **out);

/* pipeline.c */

/* Runs every pass in order, verifying the graph after each. When dump_after
 * names a pass, the graph is printed to dump after that pass. Returns 0, -1
 * on exhaustion or a verifier failure (a compiler bug, reported on err), or
 * -2 when dump_after names no pass. */
int kiln_pipeline_run(const kiln_model *m, kiln_arena *a, const char *dump_after, FILE *dump,
                      FILE *err, kiln_ir_graph **out);

/* Names of the passes, in order, for --help and --dump-after. */
size_t kiln_pipeline_pass_count(void);
const char *kiln_pipeline_pass_name(size_t i);

#endif
