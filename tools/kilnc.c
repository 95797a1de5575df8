/* tools/kilnc.c: the kiln compiler driver.
 *
 * Exit status (docs/cli.md): 0 success, 1 bad input, 2 usage error,
 * 3 infeasible plan (from `compile`).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "kiln/runtime.h"
#include "passes/passes.h"
#include "tools/output.h"
#include "tools/tools.h"

enum {
	EXIT_OK = KILNC_EXIT_OK,
	EXIT_INPUT = KILNC_EXIT_INPUT,
	EXIT_USAGE = KILNC_EXIT_USAGE,
	EXIT_INFEASIBLE = KILNC_EXIT_INFEASIBLE
};

/* `kilnc viz` refuses larger inputs (kimi-k2-1t's MLIR is tens of MB). */
#define VIZ_MAX_BYTES ((off_t)1 << 30)

static const char USAGE[] =
    "usage: kilnc [--help] [--version] COMMAND [ARGS]\n"
    "\n"
    "kiln compiles a Mixture-of-Experts training description (YAML) into\n"
    "activation-memory plans. Commands:\n"
    "\n"
    "  check MODEL [--dump-after=PASS]\n"
    "      Validate MODEL and print a one-screen summary. Every error in the\n"
    "      file is reported as FILE:LINE:COL: error: MESSAGE.\n"
    "  report MODEL [--json]\n"
    "      Per pipeline stage: static bytes (weights, gradients, optimizer),\n"
    "      activation bytes per micro-batch at load factor 1 and at\n"
    "      load.max_factor, in-flight micro-batches, peak with everything kept,\n"
    "      capacity and headroom; then the iteration time and MFU estimate.\n"
    "  compile MODEL [-o PLAN.kiln] [--solver dp|milp] [--json] [--dump-after=PASS]\n"
    "          [--emit-mlir F] [--emit-trace F] [--emit-svg F]\n"
    "      Run every pass: units, per-unit keep/recompute/offload options, a\n"
    "      Pareto frontier per (stage, layer kind, load bucket), budgets and\n"
    "      the safety bound, the baselines and the interleaved schedules. Prints\n"
    "      a summary, or the plan tables with --json, and writes the views asked\n"
    "      for; -o writes the plan blob the runtime loads. Exit 3 when\n"
    "      load.max_factor does not fit.\n"
    "  inspect PLAN.kiln [--json] [--templates]\n"
    "      Validate a plan blob as the runtime does and decode it.\n"
    "  select PLAN.kiln --stage S --layer L (--tokens A,B,..|--rows N|--load-factor R)\n"
    "         --free BYTES [--pending N] [--json]\n"
    "      One runtime decision from the command line.\n"
    "  simulate MODEL --policy P[,P...] [--plan PLAN.kiln] [--iters N] [--seed S]\n"
    "           [--loads PROFILE|FILE] [--exact] [--groups G] [--restart-s X]\n"
    "           [--checkpoint-every N] [--json] [--emit-trace F]\n"
    "      Replay iterations through memory policies side by side.\n"
    "  viz PLAN.mlir -o OUT.svg|OUT.json\n"
    "      Redraw the schedules of a plan emitted with --emit-mlir as an SVG\n"
    "      timeline or a Chrome trace (Perfetto, chrome://tracing).\n"
    "  import hf CONFIG.json --devices N [--tp T] [--pp P] [--ep E] [-o MODEL.yaml] ...\n"
    "      A model description from a Hugging Face config.json.\n"
    "  help [COMMAND]\n"
    "      This text, or one command's.\n"
    "\n"
    "Options:\n"
    "  --json             one JSON document on stdout (keys in docs/cli.md)\n"
    "  --dump-after=PASS  print the IR after PASS (passes: %s)\n"
    "  -h, --help         show help\n"
    "  --version          print the version\n"
    "\n"
    "Exit status: 0 success, 1 bad input, 2 usage error, 3 infeasible.\n"
    "MODEL is a kiln model description (docs/model-format.md); shipped ones are\n"
    "in examples/models/.\n";

static const char HELP_CHECK[] =
	"usage: kilnc check MODEL [--dump-after=PASS]\n"
	"\n"
	"Validates MODEL (schema, sizes, parallel layout, hardware profile) and prints\n"
	"a one-screen summary: shapes, parameter counts, layout, stages, hardware and\n"
	"the balanced expert load. Errors go to stderr as FILE:LINE:COL: error: MESSAGE,\n"
	"all of them, and the exit status is 1. --dump-after=PASS also prints the IR\n"
	"after that compiler pass.\n";

static const char HELP_REPORT[] =
	"usage: kilnc report MODEL [--json]\n"
	"\n"
	"Where device memory goes, per pipeline stage, with every activation kept:\n"
	"  weights, grads, optim, static   bytes on one device of the stage\n"
	"  act@1, act@max                  activations of one micro-batch at load factor 1\n"
	"                                  and at load.max_factor\n"
	"  inflight                        micro-batches held at once at steady state\n"
	"  peak@1                          static + inflight * act@1\n"
	"  spike                           static + (inflight - 1) * act@1 + act@max\n"
	"  capacity, headroom              memory - reserved, and capacity - spike\n"
	"  fwd ms, bwd ms                  one micro-batch through the stage at load 1\n"
	"Then the iteration estimate: time, tokens/s, MFU, pipeline bubble.\n"
	"Text shows GiB (MiB when a device has under 1 GiB) and ms; --json gives\n"
	"bytes and microseconds (docs/cli.md).\n";

static const char HELP_COMPILE[] =
    "usage: kilnc compile MODEL [-o PLAN.kiln] [--solver dp|milp] [--json]\n"
    "                     [--dump-after=PASS] [--emit-mlir F] [--emit-trace F] [--emit-svg F]\n"
    "\n"
    "Plans activation memory for MODEL. For every pipeline stage and layer kind:\n"
    "the saved activations (units), and for each load bucket from 0 to\n"
    "load.max_factor the Pareto frontier of bytes saved against exposed time, each\n"
    "point one keep / recompute / offload action per unit. Then per stage the\n"
    "steady-state plan, the budget of a micro-batch deciding after its MoE gate,\n"
    "and the safety bound: the largest load factor at which the maximal-saving plan\n"
    "still fits. Baselines (full recompute, the best Megatron recipe with its\n"
    "flags, static aggressive, AdaPipe) are planned too, and each plan's forward\n"
    "and backward chunks are interleaved into a schedule template.\n"
    "\n"
    "  -o PLAN.kiln    write the plan blob the runtime loads (docs/blob-format.md);\n"
    "                  it is opened with the runtime's own validator before it is\n"
    "                  written\n"
    "  --solver dp     dynamic programming over quantised bytes (default)\n"
    "  --solver milp   an exact MILP (GLPK) at every target a plan table reads;\n"
    "                  slower; the same final tables (docs/cost-model.md)\n"
    "  --json          the plan tables as one JSON document (docs/cli.md)\n"
    "  --dump-after=P  print the compiler state after pass P\n"
    "  --emit-mlir F   the graph, units, plan tables, plans and schedules as MLIR\n"
    "                  (unregistered kiln dialect, docs/mlir-dialect.md); open it\n"
    "                  with mlir-opt-16 --allow-unregistered-dialect F, redraw it\n"
    "                  with kilnc viz\n"
    "  --emit-trace F  the stage timelines as Chrome trace JSON (Perfetto)\n"
    "  --emit-svg F    the stage timelines as an SVG\n"
    "\n"
    "Outputs follow kiln's output rule (docs/cli.md, \"Output files\"): one that\n"
    "names MODEL, its hardware profile or another output is refused (exit 2);\n"
    "each goes to a temporary file beside it, renamed into place once every\n"
    "output is complete: F is either whole or untouched, and so is PLAN.kiln;\n"
    "devices and FIFOs are written in place. Views are written on exit 3 too;\n"
    "the blob is not (a plan that cannot take the load it promises must not\n"
    "reach a trainer).\n"
    "Exit status 3, with each stage and its largest feasible load factor on\n"
    "stderr, when load.max_factor does not fit on some stage. Exit status 1,\n"
    "nothing written, past the cost bound of docs/cli.md (2^20 unit choices).\n"
    "Progress goes to stderr when stderr is a terminal.\n";

static const char HELP_VIZ[] =
    "usage: kilnc viz PLAN.mlir -o OUT.svg|OUT.json\n"
    "\n"
    "Reads the schedules (templates and stage timelines) back from the MLIR of\n"
    "`kilnc compile MODEL --emit-mlir PLAN.mlir` and draws them: OUT.svg as an SVG\n"
    "timeline, OUT.json as Chrome trace JSON, the same bytes --emit-svg and\n"
    "--emit-trace write. OUT follows kiln's output rule (docs/cli.md, \"Output\n"
    "files\"): it may not be PLAN; a temporary file beside it is renamed into\n"
    "place when complete. A plan blob (PLAN.kiln) cannot be drawn: it keeps each\n"
    "template's task order for the runtime, not the predicted times.\n"
    "\n"
    "Exit status 1 when PLAN is not a regular file, is over 1 GiB or is not\n"
    "kiln's MLIR (each problem on stderr as PLAN:LINE:COL: error: MESSAGE);\n"
    "2 on a usage error (no -o, an extension other than .svg or .json).\n";

static void print_usage(FILE *out)
{
	char passes[256] = "";
	for (size_t i = 0; i < kiln_pipeline_pass_count(); i++) {
		if (i)
			strncat(passes, ", ", sizeof passes - strlen(passes) - 1);
		strncat(passes, kiln_pipeline_pass_name(i), sizeof passes - strlen(passes) - 1);
	}
	fprintf(out, USAGE, passes);
}

static int print_help(const char *cmd)
{
	if (!cmd) {
		print_usage(stdout);
	} else if (strcmp(cmd, "check") == 0) {
		fputs(HELP_CHECK, stdout);
	} else if (strcmp(cmd, "report") == 0) {
		fputs(HELP_REPORT, stdout);
	} else if (strcmp(cmd, "compile") == 0) {
		fputs(HELP_COMPILE, stdout);
	} else if (strcmp(cmd, "viz") == 0) {
		fputs(HELP_VIZ, stdout);
	} else if (strcmp(cmd, "simulate") == 0) {
		kilnc_help_simulate();
	} else if (strcmp(cmd, "import") == 0) {
		kilnc_help_import();
	} else if (kilnc_help_blob(cmd) == 0) {
		/* printed */
	} else {
		kilnc_usage_error("no help for unknown command '%s'", cmd);
		return EXIT_USAGE;
	}
	return EXIT_OK;
}

typedef struct options {
	const char *model;
	const char *dump_after;
	const char *solver;
	const char *emit_mlir, *emit_trace, *emit_svg; /* compile: view paths, or NULL */
	const char *blob;                              /* compile: -o PLAN.kiln, or NULL */
	bool json;
	bool help;
} options;

/* Parses the arguments after the command name. Returns 0 or EXIT_USAGE. */
static int parse_args(const char *cmd, int argc, char **argv, bool allow_json, bool allow_dump,
                      options *out)
{
	bool allow_solver = strcmp(cmd, "compile") == 0;
	memset(out, 0, sizeof *out);
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		char eb[200]; /* a value, escaped for a message */
		int m = 0;
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			out->help = true;
		} else if (allow_json && (m = kilnc_flag(NULL, "--json", a, &out->json)) != 0) {
			if (m == EXIT_USAGE)
				return EXIT_USAGE;
		} else if (allow_dump && (m = kilnc_option_value(NULL, "--dump-after", argc, argv,
		                                                 &i, &out->dump_after)) != 0) {
			if (m == EXIT_USAGE)
				return EXIT_USAGE;
		} else if (allow_solver && (m = kilnc_option_value(NULL, "--solver", argc, argv, &i,
		                                                   &out->solver)) != 0) {
			if (m == EXIT_USAGE)
				return EXIT_USAGE;
			kiln_solver solver;
			if (kiln_solver_parse(out->solver, &solver) != 0) {
				kilnc_usage_error("--solver must be dp or milp, got '%s'",
				                  out->solver);
				return EXIT_USAGE;
			}
		} else if (allow_solver && strncmp(a, "--emit-", 7) == 0) {
			m = kilnc_option_value(NULL, "--emit-mlir", argc, argv, &i,
			                       &out->emit_mlir);
			if (m == 0)
				m = kilnc_option_value(NULL, "--emit-trace", argc, argv, &i,
				                       &out->emit_trace);
			if (m == 0)
				m = kilnc_option_value(NULL, "--emit-svg", argc, argv, &i,
				                       &out->emit_svg);
			if (m == EXIT_USAGE)
				return EXIT_USAGE;
			if (m == 0) {
				fprintf(stderr, "kilnc: error: unknown option '%s' for '%s'\n",
				        kilnc_shown(a, eb, sizeof eb), cmd);
				fprintf(stderr, "Try 'kilnc help %s'.\n", cmd);
				return EXIT_USAGE;
			}
		} else if (allow_solver && strcmp(a, "-o") == 0) {
			if (i + 1 >= argc || !*argv[i + 1]) {
				kilnc_usage_error("%s needs a file name", a);
				return EXIT_USAGE;
			}
			if (out->blob) {
				kilnc_usage_error("%s given twice", a);
				return EXIT_USAGE;
			}
			out->blob = argv[++i];
		} else if (allow_solver && strncmp(a, "--output", 8) == 0) {
			m = kilnc_option_value(NULL, "--output", argc, argv, &i, &out->blob);
			if (m == EXIT_USAGE)
				return EXIT_USAGE;
			if (m == 0) {
				fprintf(stderr, "kilnc: error: unknown option '%s' for '%s'\n",
				        kilnc_shown(a, eb, sizeof eb), cmd);
				return EXIT_USAGE;
			}
		} else if (a[0] == '-' && a[1] != '\0') {
			fprintf(stderr, "kilnc: error: unknown option '%s' for '%s'\n",
			        kilnc_shown(a, eb, sizeof eb), cmd);
			fprintf(stderr, "Try 'kilnc help %s'.\n", cmd);
			return EXIT_USAGE;
		} else if (!out->model) {
			out->model = a;
		} else {
			char eb2[200];
			fprintf(stderr, "kilnc: error: '%s' takes one MODEL, got '%s' and '%s'\n",
			        cmd, kilnc_shown(out->model, eb, sizeof eb),
			        kilnc_shown(a, eb2, sizeof eb2));
			return EXIT_USAGE;
		}
	}
	if (out->dump_after) {
		size_t i = 0;
		while (i < kiln_pipeline_pass_count() &&
		       strcmp(kiln_pipeline_pass_name(i), out->dump_after) != 0)
			i++;
		if (i == kiln_pipeline_pass_count()) {
			kilnc_usage_error("--dump-after: no pass named '%s' (see kilnc --help)",
			                  out->dump_after);
			return EXIT_USAGE;
		}
	}
	if (!out->help && !out->model) {
		fprintf(stderr, "kilnc: error: '%s' needs a MODEL file\n", cmd);
		fprintf(stderr, "Try 'kilnc help %s'.\n", cmd);
		return EXIT_USAGE;
	}
	return EXIT_OK;
}

/* Loads and lowers the model. Returns 0, or the exit status to use. */
static int load_graph(const options *o, kiln_arena *a, kiln_ir_graph **out)
{
	/* Only stdout is written: redirected (`>> m.yaml`) onto the model or
	 * its hardware profile, it is refused before and after loading. */
	const kiln_out_name model = {"MODEL", o->model};
	if (kilnc_check_outputs(&model, 1, NULL, NULL, 0) != EXIT_OK)
		return EXIT_USAGE;
	kiln_model *m = NULL;
	int rc = kiln_frontend_load_file(o->model, a, stderr, &m);
	if (rc == KILN_FRONTEND_INVALID)
		return EXIT_INPUT;
	if (rc != KILN_FRONTEND_OK) {
		fprintf(stderr, "kilnc: error: out of memory reading %s\n", o->model);
		return EXIT_INPUT;
	}
	if (kilnc_check_outputs(NULL, 0, m, NULL, 0) != EXIT_OK)
		return EXIT_USAGE;
	rc = kiln_pipeline_run(m, a, o->dump_after, stdout, stderr, out);
	if (rc == -2) {
		kilnc_usage_error("--dump-after: no pass named '%s'", o->dump_after);
		return EXIT_USAGE;
	}
	if (rc != 0) {
		fprintf(stderr, "kilnc: error: compiling %s failed\n", o->model);
		return EXIT_INPUT;
	}
	return EXIT_OK;
}

/* Flushes stdout and turns a failed write (full disk, closed pipe) into an
 * error that gives its reason. */
static int finish_output(int rc)
{
	if (kiln_out_stdout_finish("kilnc", stderr) != 0)
		return rc ? rc : EXIT_INPUT;
	return rc;
}

/* Writes doc to stdout; a failed write is left to finish_output, which gives
 * its reason. Returns rc, or EXIT_INPUT (reported) when the document could
 * not be built. */
static int write_json_stdout(const kiln_json *doc, int rc)
{
	if (kiln_json_write(doc, stdout) == KILN_JSON_ENOMEM) {
		fprintf(stderr, "kilnc: error: out of memory building the JSON output\n");
		return EXIT_INPUT;
	}
	return rc;
}

static int cmd_check(int argc, char **argv)
{
	options o;
	int rc = parse_args("check", argc, argv, false, true, &o);
	if (rc || o.help)
		return rc ? rc : print_help("check");
	kiln_arena *a = kiln_arena_new();
	kiln_ir_graph *g = NULL;
	rc = a ? load_graph(&o, a, &g) : EXIT_INPUT;
	if (rc == EXIT_OK)
		kiln_report_check(g, stdout);
	kiln_arena_free(a);
	return finish_output(rc);
}

static int cmd_report(int argc, char **argv)
{
	options o;
	int rc = parse_args("report", argc, argv, true, false, &o);
	if (rc || o.help)
		return rc ? rc : print_help("report");
	kiln_arena *a = kiln_arena_new();
	kiln_ir_graph *g = NULL;
	rc = a ? load_graph(&o, a, &g) : EXIT_INPUT;
	if (rc == EXIT_OK) {
		if (o.json) {
			kiln_json *doc = kiln_report_json(g);
			rc = write_json_stdout(doc, rc);
			kiln_json_free(doc);
		} else {
			kiln_report_text(g, stdout);
		}
	}
	kiln_arena_free(a);
	return finish_output(rc);
}

/* ---------------------------------------------------------------- views */

/* Copies a library's diagnostics (lines "LINE:COL: error: ..." or
 * "error: ...") to stderr, each prefixed with path, or with "kilnc: " when
 * path is NULL. */
static void relay(const char *text, size_t len, const char *path)
{
	const char *p = text, *end = text + len;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		if (!path)
			fputs("kilnc: ", stderr);
		else if (*p >= '0' && *p <= '9')
			fprintf(stderr, "%s:", path);
		else
			fprintf(stderr, "%s: ", path);
		fwrite(p, 1, n, stderr);
		fputc('\n', stderr);
		p += n + 1;
	}
}

/* Writes one view of arg to f; returns 0 or -1 (reported on stderr). */
typedef int (*view_fn)(const void *arg, FILE *f);

static int view_trace(const void *arg, FILE *f)
{
	return kiln_trace_write(arg, f);
}

static int view_svg(const void *arg, FILE *f)
{
	return kiln_svg_write(arg, f);
}

static int view_mlir(const void *arg, FILE *f)
{
	char *msg = NULL;
	size_t len = 0;
	FILE *err = open_memstream(&msg, &len);
	int rc = kiln_mlir_emit(arg, f, err ? err : stderr);
	if (err) {
		fclose(err);
		relay(msg, len, NULL);
		free(msg);
	}
	return rc;
}

/* Opens path by the output rule (tools/output.h) and writes fn's view into
 * it. Returns the output, to be committed or discarded, or NULL (reported:
 * a failed write with its reason). */
static kiln_out *stage_view(const char *path, view_fn fn, const void *arg)
{
	kiln_out *o = kiln_out_open("kilnc", path, stderr);
	if (o && fn(arg, kiln_out_stream(o)) != 0) {
		/* Not a failed write: the writers' other failure is memory. */
		if (kiln_out_finish(o, stderr) == 0)
			fprintf(stderr, "kilnc: error: cannot write %s: out of memory\n", path);
		kiln_out_discard(o);
		o = NULL;
	}
	return o;
}

/* One view to one file (kilnc viz). */
static int write_view(const char *path, view_fn fn, const void *arg)
{
	kiln_out *o = stage_view(path, fn, arg);
	return o && kiln_out_commit(o, stderr) == 0 ? EXIT_OK : EXIT_INPUT;
}

/* The blob's bytes, for view_blob. */
typedef struct blob_bytes {
	unsigned char *p;
	size_t len;
} blob_bytes;

static int view_blob(const void *arg, FILE *f)
{
	const blob_bytes *b = arg;
	return fwrite(b->p, 1, b->len, f) == b->len ? 0 : -1;
}

/* Builds the blob and opens it with the runtime's validator, which must
 * accept what the compiler wrote. Returns 0 or EXIT_INPUT (reported). */
static int build_blob(const kiln_compilation *c, blob_bytes *out)
{
	*out = (blob_bytes){0};
	if (kiln_blob_build(c, stderr, &out->p, &out->len) != 0)
		return EXIT_INPUT;
	kiln_rt *rt = NULL;
	int rc = kiln_rt_open(out->p, out->len, &rt);
	kiln_rt_close(rt);
	if (rc != KILN_RT_OK) {
		fprintf(stderr, "kilnc: internal error: the runtime rejects the blob just written: %s\n",
		        kiln_rt_strerror(rc));
		free(out->p);
		*out = (blob_bytes){0};
		return EXIT_INPUT;
	}
	return EXIT_OK;
}

/* Writes the views compile was asked for, and the blob when feasible, into
 * their temporary files and finishes them: out[0..*n_out) (at most 4), to be
 * committed all or none (tools/output.h) once stdout is written. Returns 0
 * or EXIT_INPUT (reported; nothing staged). */
static int write_views(const options *o, const kiln_compilation *c, bool feasible, kiln_out **out,
                       size_t *n_out)
{
	bool blob = o->blob && feasible;
	*n_out = 0;
	if (!o->emit_mlir && !o->emit_trace && !o->emit_svg && !blob)
		return EXIT_OK;
	if (!c->schedule) {
		fprintf(stderr, "kilnc: internal error: no schedule to write (the interleave pass did "
		                "not run)\n");
		return EXIT_INPUT;
	}
	blob_bytes bytes = {0};
	struct {
		const char *path;
		view_fn fn;
		const void *arg;
	} views[] = {{blob ? o->blob : NULL, view_blob, &bytes},
	             {o->emit_mlir, view_mlir, c},
	             {o->emit_trace, view_trace, c->schedule},
	             {o->emit_svg, view_svg, c->schedule}};
	size_t n = 0;
	int rc = blob ? build_blob(c, &bytes) : EXIT_OK;
	for (size_t i = 0; i < 4 && rc == EXIT_OK; i++) {
		if (!views[i].path)
			continue;
		out[n] = stage_view(views[i].path, views[i].fn, views[i].arg);
		if (out[n])
			n++;
		else
			rc = EXIT_INPUT;
	}
	free(bytes.p);
	for (size_t i = 0; i < n && rc == EXIT_OK; i++)
		if (kiln_out_finish(out[i], stderr) != 0)
			rc = EXIT_INPUT;
	if (rc != EXIT_OK) {
		for (size_t i = 0; i < n; i++)
			kiln_out_discard(out[i]);
		return rc;
	}
	*n_out = n;
	return EXIT_OK;
}

static bool has_suffix(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && strcasecmp(s + n - k, suffix) == 0;
}

/* Task events a view may draw: a small file that repeats a big template in
 * long timelines would otherwise ask for gigabytes of output. */
#define VIZ_MAX_EVENTS 20000000

/* The writers trust their schedule; one read from a file must first be a
 * schedule (every template verifies) of a drawable size. Returns 0 or
 * EXIT_INPUT (reported). */
static int check_drawable(const char *plan, const kiln_plan_schedule *s)
{
	for (int32_t k = 0; k < s->n_templates; k++) {
		const kiln_template *t = &s->templates[k];
		if (kiln_schedule_verify(t->tasks, t->n_tasks, INFINITY, NULL) != 0) {
			fprintf(stderr,
			        "%s: error: kiln.template %d is not a valid schedule (dependencies, "
			        "streams, chain order or times)\n",
			        plan, (int)k);
			return EXIT_INPUT;
		}
	}
	int64_t events = 0;
	double span = 0;
	for (int32_t k = 0; k < s->n_stages; k++) {
		const kiln_stage_timeline *tl = &s->stages[k];
		double stage_span = 0;
		for (int32_t l = 0; l < tl->n_layers; l++) {
			events += s->templates[tl->template_id[l]].n_tasks;
			stage_span += s->templates[tl->template_id[l]].makespan_us;
		}
		if (stage_span > span)
			span = stage_span;
	}
	if (events > VIZ_MAX_EVENTS || !(span <= 1e15)) {
		fprintf(stderr,
		        "%s: error: the timelines hold %lld task events over %g us, more than a view "
		        "draws (at most %d events and 1e15 us)\n",
		        plan, (long long)events, span, VIZ_MAX_EVENTS);
		return EXIT_INPUT;
	}
	return EXIT_OK;
}

static int cmd_viz(int argc, char **argv)
{
	const char *plan = NULL, *out = NULL;
	bool help = false;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		char eb[200]; /* a value, escaped for a message */
		int m;
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			help = true;
		} else if (strcmp(a, "-o") == 0) {
			if (i + 1 >= argc || !*argv[i + 1]) {
				kilnc_usage_error("%s needs a file name", a);
				return EXIT_USAGE;
			}
			if (out) {
				kilnc_usage_error("%s given twice", a);
				return EXIT_USAGE;
			}
			out = argv[++i];
		} else if ((m = kilnc_option_value(NULL, "--output", argc, argv, &i, &out)) != 0) {
			if (m == EXIT_USAGE)
				return EXIT_USAGE;
		} else if (a[0] == '-' && a[1] != '\0') {
			fprintf(stderr, "kilnc: error: unknown option '%s' for 'viz'\n",
			        kilnc_shown(a, eb, sizeof eb));
			fprintf(stderr, "Try 'kilnc help viz'.\n");
			return EXIT_USAGE;
		} else if (!plan) {
			plan = a;
		} else {
			char eb2[200];
			fprintf(stderr, "kilnc: error: 'viz' takes one PLAN, got '%s' and '%s'\n",
			        kilnc_shown(plan, eb, sizeof eb), kilnc_shown(a, eb2, sizeof eb2));
			return EXIT_USAGE;
		}
	}
	if (help)
		return print_help("viz");
	if (!plan) {
		fprintf(stderr, "kilnc: error: 'viz' needs a PLAN.mlir file\n");
		fprintf(stderr, "Try 'kilnc help viz'.\n");
		return EXIT_USAGE;
	}
	if (!out) {
		kilnc_usage_error("'viz' needs -o OUT.svg or -o OUT.json (%s)", plan);
		return EXIT_USAGE;
	}
	view_fn fn = has_suffix(out, ".svg") ? view_svg : has_suffix(out, ".json") ? view_trace : NULL;
	if (!fn) {
		kilnc_usage_error(
		    "-o %s: the output must end in .svg (SVG timeline) or .json (Chrome trace)",
		    out);
		return EXIT_USAGE;
	}
	if (has_suffix(plan, ".kiln")) {
		kilnc_usage_error(
		    "%s: a plan blob keeps task order, not times, so viz cannot draw it; use "
		    "the MLIR of kilnc compile --emit-mlir (kilnc inspect --templates lists "
		    "a blob's templates)",
		    plan);
		return EXIT_USAGE;
	}
	const kiln_out_name in = {"PLAN", plan}, outn = {"-o", out};
	if (kilnc_check_outputs(&in, 1, NULL, &outn, 1) != EXIT_OK)
		return EXIT_USAGE;
	char *text;
	size_t len;
	int rc = kilnc_read_file(plan, VIZ_MAX_BYTES, &text, &len);
	if (rc != EXIT_OK)
		return rc;
	kiln_arena *a = kiln_arena_new();
	char *msg = NULL;
	size_t msg_len = 0;
	FILE *err = open_memstream(&msg, &msg_len);
	kiln_plan_schedule s;
	if (!a || !err) {
		fprintf(stderr, "kilnc: error: out of memory\n");
		rc = EXIT_INPUT;
	} else if (kiln_mlir_read_schedule(text, len, a, &s, err) != 0) {
		rc = EXIT_INPUT;
	}
	free(text);
	if (err) {
		fclose(err);
		relay(msg, msg_len, plan);
		free(msg);
	}
	if (rc == EXIT_OK)
		rc = check_drawable(plan, &s);
	if (rc == EXIT_OK)
		rc = write_view(out, fn, &s);
	kiln_arena_free(a);
	return rc;
}

static int cmd_compile(int argc, char **argv)
{
	options o;
	int rc = parse_args("compile", argc, argv, true, true, &o);
	if (rc || o.help)
		return rc ? rc : print_help("compile");
	const kiln_out_name model = {"MODEL", o.model};
	const kiln_out_name out[] = {{"-o", o.blob},
	                             {"--emit-mlir", o.emit_mlir},
	                             {"--emit-trace", o.emit_trace},
	                             {"--emit-svg", o.emit_svg}};
	if (kilnc_check_outputs(&model, 1, NULL, out, 4) != EXIT_OK)
		return EXIT_USAGE;
	kiln_arena *a = kiln_arena_new();
	kiln_model *m = NULL;
	if (!a) {
		fprintf(stderr, "kilnc: error: out of memory\n");
		return EXIT_INPUT;
	}
	int frc = kiln_frontend_load_file(o.model, a, stderr, &m);
	if (frc != KILN_FRONTEND_OK) {
		if (frc != KILN_FRONTEND_INVALID)
			fprintf(stderr, "kilnc: error: out of memory reading %s\n", o.model);
		kiln_arena_free(a);
		return EXIT_INPUT;
	}
	/* The hardware profile is known now; the rest was checked before. */
	if (kilnc_check_outputs(NULL, 0, m, out, 4) != EXIT_OK) {
		kiln_arena_free(a);
		return EXIT_USAGE;
	}
	kiln_compilation c = {.model = m, .arena = a};
	kiln_out *views[4];
	size_t n_views = 0;
	c.solver = KILN_SOLVER_DP;
	if (o.solver)
		kiln_solver_parse(o.solver, &c.solver); /* checked with the options */
	c.progress = isatty(2) ? stderr : NULL;
	rc = kiln_pipeline_compile(&c, NULL, o.dump_after, stdout, stderr);
	if (rc == -2) {
		kilnc_usage_error("--dump-after: no pass named '%s'", o.dump_after);
		rc = EXIT_USAGE;
	} else if (rc == -3) {
		rc = EXIT_INPUT; /* over the cost bound, reported */
	} else if (rc != 0) {
		fprintf(stderr, "kilnc: error: compiling %s failed\n", o.model);
		rc = EXIT_INPUT;
	} else if ((rc = write_views(&o, &c, kiln_plans_infeasible_stages(&c) == 0, views,
	                             &n_views)) != EXIT_OK) {
		/* reported; nothing on stdout */
	} else if (kiln_plans_infeasible_stages(&c) > 0) {
		kiln_plans_report_infeasible(&c, stderr);
		rc = EXIT_INFEASIBLE;
	} else if (o.json) {
		kiln_json *doc = kiln_plans_json(&c);
		rc = write_json_stdout(doc, rc);
		kiln_json_free(doc);
	} else if (!o.dump_after) {
		kiln_plans_text(&c, stdout);
	}
	/* The files go into place only once stdout is written: a command that
	 * fails leaves them as they were. A failed stdout is reported by
	 * finish_output. */
	if (n_views && (rc == EXIT_OK || rc == EXIT_INFEASIBLE) && kiln_out_stdout_ok()) {
		if (kiln_out_commit_all(views, n_views, stderr) != 0)
			rc = EXIT_INPUT;
	} else {
		for (size_t i = 0; i < n_views; i++)
			kiln_out_discard(views[i]);
		if (n_views && rc == EXIT_OK)
			rc = EXIT_INPUT;
	}
	kiln_arena_free(a);
	return finish_output(rc);
}

int main(int argc, char **argv)
{
	kiln_out_stdout_init();
	if (argc < 2) {
		print_usage(stderr);
		return EXIT_USAGE;
	}
	const char *cmd = argv[1];
	bool help = strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0;
	bool version = strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0;
	if ((help || version) && argc > 2) {
		char buf[200];
		fprintf(stderr, "kilnc: error: '%s' takes no arguments, got '%s'%s\n", cmd,
		        kilnc_shown(argv[2], buf, sizeof buf),
		        help ? " (one command's help: kilnc help COMMAND)" : "");
		fputs("Try 'kilnc --help'.\n", stderr);
		return EXIT_USAGE;
	}
	if (help)
		return finish_output(print_help(NULL));
	if (version) {
		printf("kilnc %s\n", KILN_VERSION);
		return finish_output(EXIT_OK);
	}
	if (strcmp(cmd, "help") == 0) {
		if (argc > 3) {
			kilnc_usage_error("'help' takes at most one COMMAND, got '%s'", argv[3]);
			return EXIT_USAGE;
		}
		return finish_output(print_help(argc > 2 ? argv[2] : NULL));
	}
	if (strcmp(cmd, "check") == 0)
		return cmd_check(argc - 2, argv + 2);
	if (strcmp(cmd, "report") == 0)
		return cmd_report(argc - 2, argv + 2);
	if (strcmp(cmd, "compile") == 0)
		return cmd_compile(argc - 2, argv + 2);
	if (strcmp(cmd, "viz") == 0)
		return finish_output(cmd_viz(argc - 2, argv + 2));
	if (strcmp(cmd, "simulate") == 0)
		return finish_output(kilnc_simulate(argc - 2, argv + 2));
	if (strcmp(cmd, "inspect") == 0)
		return finish_output(kilnc_inspect(argc - 2, argv + 2));
	if (strcmp(cmd, "import") == 0)
		return finish_output(kilnc_import(argc - 2, argv + 2));
	if (strcmp(cmd, "select") == 0)
		return finish_output(kilnc_select(argc - 2, argv + 2));
	if (cmd[0] == '-')
		kilnc_usage_error("unknown option '%s'", cmd);
	else
		kilnc_usage_error("unknown command '%s'", cmd);
	return EXIT_USAGE;
}
