/* tools/kilnc.c: the kiln compiler driver.
 *
 * Exit status (docs/cli.md): 0 success, 1 bad input, 2 usage error,
 * 3 infeasible plan (from `compile`).
 */
#include <errno.h>
#include <math.h>
#include <fcntl.h>
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
	"still fits. Baselines (full recompute, Megatron selective, static aggressive,\n"
	"AdaPipe) are planned too, and each plan's forward and backward chunks are\n"
	"interleaved into a schedule template.\n"
	"\n"
	"  -o PLAN.kiln    write the plan blob the runtime loads (docs/blob-format.md);\n"
	"                  it is opened with the runtime's own validator before it is\n"
	"                  written\n"
	"  --solver dp     dynamic programming over quantised bytes (default)\n"
	"  --solver milp   an exact MILP (GLPK) for every frontier point; slower\n"
	"  --json          the plan tables as one JSON document (docs/cli.md)\n"
	"  --dump-after=P  print the compiler state after pass P\n"
	"  --emit-mlir F   the graph, units, plan tables, plans and schedules as MLIR\n"
	"                  (unregistered kiln dialect, docs/mlir-dialect.md); open it\n"
	"                  with mlir-opt-16 --allow-unregistered-dialect F, redraw it\n"
	"                  with kilnc viz\n"
	"  --emit-trace F  the stage timelines as Chrome trace JSON (Perfetto)\n"
	"  --emit-svg F    the stage timelines as an SVG\n"
	"\n"
	"Each view goes to a temporary file beside F, renamed into place when\n"
	"complete: F is either whole or untouched, and so is PLAN.kiln. Views are\n"
	"written on exit 3 too; the blob is not (a plan that cannot take the\n"
	"load it promises must not reach a trainer).\n"
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
	"--emit-trace write. OUT goes to a temporary file beside it, renamed into\n"
	"place when complete. A plan blob (PLAN.kiln) cannot be drawn: it keeps each\n"
	"template's task order for the runtime, not the predicted times.\n"
	"\n"
	"Exit status 1 when PLAN is not a regular file, is over 1 GiB or is not\n"
	"kiln's MLIR (each problem on stderr as PLAN:LINE:COL: error: MESSAGE);\n"
	"2 on a usage error (no -o, an extension other than .svg or .json).\n";

static void usage_error(const char *fmt, const char *arg)
{
	fputs("kilnc: error: ", stderr);
	fprintf(stderr, fmt, arg);
	fputs("\nTry 'kilnc --help'.\n", stderr);
}

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
	} else if (kilnc_help_blob(cmd) == 0) {
		/* printed */
	} else {
		usage_error("no help for unknown command '%s'", cmd);
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

int kilnc_option_value(const char *name, int argc, char **argv, int *i, const char **out)
{
	const char *a = argv[*i];
	size_t n = strlen(name);
	if (strncmp(a, name, n) != 0 || (a[n] != '\0' && a[n] != '='))
		return 0;
	const char *v = a[n] == '=' ? a + n + 1 : *i + 1 < argc ? argv[++*i] : NULL;
	if (!v || !*v) {
		usage_error("%s needs a value", name);
		return EXIT_USAGE;
	}
	if (*out) {
		usage_error("%s given twice", name);
		return EXIT_USAGE;
	}
	*out = v;
	return 1;
}

/* Parses the arguments after the command name. Returns 0 or EXIT_USAGE. */
static int parse_args(const char *cmd, int argc, char **argv, bool allow_json, bool allow_dump,
                      options *out)
{
	bool allow_solver = strcmp(cmd, "compile") == 0;
	memset(out, 0, sizeof *out);
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			out->help = true;
		} else if (allow_json && strcmp(a, "--json") == 0) {
			out->json = true;
		} else if (allow_dump && strncmp(a, "--dump-after=", 13) == 0) {
			out->dump_after = a + 13;
		} else if (allow_dump && strcmp(a, "--dump-after") == 0) {
			if (i + 1 >= argc) {
				usage_error("%s needs a pass name", a);
				return EXIT_USAGE;
			}
			out->dump_after = argv[++i];
		} else if (allow_solver && (strcmp(a, "--solver") == 0 || strncmp(a, "--solver=", 9) == 0)) {
			if (a[8] == '=') {
				out->solver = a + 9;
			} else if (i + 1 < argc) {
				out->solver = argv[++i];
			} else {
				usage_error("%s needs dp or milp", a);
				return EXIT_USAGE;
			}
			if (strcmp(out->solver, "dp") != 0 && strcmp(out->solver, "milp") != 0) {
				usage_error("--solver must be dp or milp, got '%s'", out->solver);
				return EXIT_USAGE;
			}
		} else if (allow_solver && strncmp(a, "--emit-", 7) == 0) {
			int m = kilnc_option_value("--emit-mlir", argc, argv, &i, &out->emit_mlir);
			if (m == 0)
				m = kilnc_option_value("--emit-trace", argc, argv, &i, &out->emit_trace);
			if (m == 0)
				m = kilnc_option_value("--emit-svg", argc, argv, &i, &out->emit_svg);
			if (m == EXIT_USAGE)
				return EXIT_USAGE;
			if (m == 0) {
				fprintf(stderr, "kilnc: error: unknown option '%s' for '%s'\n", a, cmd);
				fprintf(stderr, "Try 'kilnc help %s'.\n", cmd);
				return EXIT_USAGE;
			}
		} else if (allow_solver && strcmp(a, "-o") == 0) {
			if (i + 1 >= argc || !*argv[i + 1]) {
				usage_error("%s needs a file name", a);
				return EXIT_USAGE;
			}
			if (out->blob) {
				usage_error("%s given twice", a);
				return EXIT_USAGE;
			}
			out->blob = argv[++i];
		} else if (allow_solver && strncmp(a, "--output", 8) == 0) {
			int m = kilnc_option_value("--output", argc, argv, &i, &out->blob);
			if (m == EXIT_USAGE)
				return EXIT_USAGE;
			if (m == 0) {
				fprintf(stderr, "kilnc: error: unknown option '%s' for '%s'\n", a, cmd);
				return EXIT_USAGE;
			}
		} else if (a[0] == '-' && a[1] != '\0') {
			fprintf(stderr, "kilnc: error: unknown option '%s' for '%s'\n", a, cmd);
			fprintf(stderr, "Try 'kilnc help %s'.\n", cmd);
			return EXIT_USAGE;
		} else if (!out->model) {
			out->model = a;
		} else {
			fprintf(stderr, "kilnc: error: '%s' takes one MODEL, got '%s' and '%s'\n", cmd,
			        out->model, a);
			return EXIT_USAGE;
		}
	}
	if (out->dump_after) {
		size_t i = 0;
		while (i < kiln_pipeline_pass_count() &&
		       strcmp(kiln_pipeline_pass_name(i), out->dump_after) != 0)
			i++;
		if (i == kiln_pipeline_pass_count()) {
			usage_error("--dump-after: no pass named '%s' (see kilnc --help)",
			            out->dump_after);
			return EXIT_USAGE;
		}
	}
	const char *views[] = {out->emit_mlir, out->emit_trace, out->emit_svg, out->blob};
	for (int i = 0; i < 4; i++)
		for (int j = i + 1; j < 4; j++)
			if (views[i] && views[j] && strcmp(views[i], views[j]) == 0) {
				usage_error("two views would be written to '%s'", views[i]);
				return EXIT_USAGE;
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
	kiln_model *m = NULL;
	int rc = kiln_frontend_load_file(o->model, a, stderr, &m);
	if (rc == KILN_FRONTEND_INVALID)
		return EXIT_INPUT;
	if (rc != KILN_FRONTEND_OK) {
		fprintf(stderr, "kilnc: error: out of memory reading %s\n", o->model);
		return EXIT_INPUT;
	}
	rc = kiln_pipeline_run(m, a, o->dump_after, stdout, stderr, out);
	if (rc == -2) {
		usage_error("--dump-after: no pass named '%s'", o->dump_after);
		return EXIT_USAGE;
	}
	if (rc != 0) {
		fprintf(stderr, "kilnc: error: compiling %s failed\n", o->model);
		return EXIT_INPUT;
	}
	return EXIT_OK;
}

/* Flushes stdout and turns a failed write (full disk, closed pipe) into an error. */
static int finish_output(int rc)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "kilnc: error: writing the output failed\n");
		return rc ? rc : EXIT_INPUT;
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
			if (kiln_json_write(doc, stdout) != 0) {
				fprintf(stderr, "kilnc: error: out of memory writing JSON\n");
				rc = EXIT_INPUT;
			}
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

/* A view on its way to its file. Regular files (and new ones) are written
 * to a temporary file beside their real target (symlinks resolved) and
 * renamed into place only when every view of the command has succeeded, so
 * a failing command leaves every target as it was. Anything else (a device
 * such as /dev/null, a FIFO) is written directly: renaming over it would
 * replace the node. */
typedef struct staged_view {
	const char *path;  /* as given */
	char *target;      /* where the bytes go in the end (malloc'd) */
	char *tmp;         /* temporary file, or NULL when written directly */
} staged_view;

/* The canonical name of path: realpath of the file, or of its directory plus
 * its base name when it does not exist yet. malloc'd, or NULL. */
static char *canonical_path(const char *path)
{
	char *r = realpath(path, NULL);
	if (r)
		return r;
	/* A dangling symlink: follow it to where its target would be. */
	struct stat lst;
	char link[4096];
	ssize_t len;
	if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode) &&
	    (len = readlink(path, link, sizeof link - 1)) > 0) {
		link[len] = '\0';
		static int depth;
		if (depth > 8)
			return NULL;
		const char *slash = strrchr(path, '/');
		char *next;
		if (link[0] == '/' || !slash) {
			next = strdup(link);
		} else {
			size_t n = (size_t)(slash - path) + 1 + strlen(link) + 1;
			next = malloc(n);
			if (next)
				snprintf(next, n, "%.*s/%s", (int)(slash - path), path, link);
		}
		if (!next)
			return NULL;
		depth++;
		char *out = canonical_path(next);
		depth--;
		free(next);
		return out;
	}
	const char *slash = strrchr(path, '/');
	char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
	char *rdir = dir ? realpath(dir, NULL) : NULL;
	free(dir);
	if (!rdir)
		return NULL;
	const char *base = slash ? slash + 1 : path;
	size_t n = strlen(rdir) + strlen(base) + 2;
	char *out = malloc(n);
	if (out)
		snprintf(out, n, "%s/%s", rdir, base);
	free(rdir);
	return out;
}

/* Writes one view into its staging place. Returns 0 or EXIT_INPUT (reported). */
static int stage_view(staged_view *v, view_fn fn, const void *arg)
{
	struct stat st;
	v->target = canonical_path(v->path);
	if (!v->target) {
		fprintf(stderr, "kilnc: error: cannot write %s: %s\n", v->path, strerror(errno));
		return EXIT_INPUT;
	}
	bool exists = stat(v->target, &st) == 0;
	if (exists && S_ISDIR(st.st_mode)) {
		fprintf(stderr, "kilnc: error: cannot write %s: it is a directory\n", v->path);
		return EXIT_INPUT;
	}
	FILE *f;
	if (exists && !S_ISREG(st.st_mode)) {
		f = fopen(v->target, "wb");
		if (!f) {
			fprintf(stderr, "kilnc: error: cannot write %s: %s\n", v->path, strerror(errno));
			return EXIT_INPUT;
		}
	} else {
		static const char suffix[] = ".tmp.XXXXXX";
		size_t n = strlen(v->target);
		v->tmp = malloc(n + sizeof suffix);
		if (!v->tmp) {
			fprintf(stderr, "kilnc: error: out of memory writing %s\n", v->path);
			return EXIT_INPUT;
		}
		memcpy(v->tmp, v->target, n);
		memcpy(v->tmp + n, suffix, sizeof suffix);
		int fd = mkstemp(v->tmp);
		if (fd < 0) {
			fprintf(stderr, "kilnc: error: cannot write %s: %s\n", v->path, strerror(errno));
			free(v->tmp);
			v->tmp = NULL;
			return EXIT_INPUT;
		}
		/* mkstemp makes the file 0600; give it the mode a plain fopen would. */
		mode_t mask = umask(0);
		umask(mask);
		if (fchmod(fd, exists ? st.st_mode & 07777 : 0666 & ~mask) != 0 ||
		    !(f = fdopen(fd, "wb"))) {
			close(fd);
			fprintf(stderr, "kilnc: error: cannot write %s: %s\n", v->path, strerror(errno));
			return EXIT_INPUT;
		}
	}
	int rc = fn(arg, f);
	if (fflush(f) != 0 || ferror(f))
		rc = -1;
	if (fclose(f) != 0)
		rc = -1;
	if (rc != 0) {
		fprintf(stderr, "kilnc: error: writing %s failed\n", v->path);
		return EXIT_INPUT;
	}
	return EXIT_OK;
}

/* Renames every staged view into place when ok, else removes the temporary
 * files; frees everything. Returns 0 or EXIT_INPUT (reported). */
static int commit_views(staged_view *v, int n, bool ok)
{
	int rc = ok ? EXIT_OK : EXIT_INPUT;
	for (int i = 0; i < n; i++) {
		if (v[i].tmp) {
			if (rc == EXIT_OK && rename(v[i].tmp, v[i].target) != 0) {
				fprintf(stderr, "kilnc: error: cannot write %s: %s\n", v[i].path,
				        strerror(errno));
				rc = EXIT_INPUT;
			}
			if (rc != EXIT_OK)
				unlink(v[i].tmp);
		}
		free(v[i].tmp);
		free(v[i].target);
	}
	return rc;
}

/* One view to one file (kilnc viz). */
static int write_view(const char *path, view_fn fn, const void *arg)
{
	staged_view v = {.path = path};
	int rc = stage_view(&v, fn, arg);
	return commit_views(&v, 1, rc == EXIT_OK);
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

/* The views compile was asked for, and the blob when feasible: all or none.
 * Returns 0 or EXIT_INPUT (reported). */
static int write_views(const options *o, const kiln_compilation *c, bool feasible)
{
	bool blob = o->blob && feasible;
	if (!o->emit_mlir && !o->emit_trace && !o->emit_svg && !blob)
		return EXIT_OK;
	if (!c->schedule) {
		fprintf(stderr, "kilnc: internal error: no schedule to write (the interleave pass did "
		                "not run)\n");
		return EXIT_INPUT;
	}
	staged_view v[4];
	blob_bytes bytes = {0};
	int n = 0, rc = EXIT_OK;
	if (blob) {
		rc = build_blob(c, &bytes);
		if (rc == EXIT_OK) {
			v[n] = (staged_view){.path = o->blob};
			rc = stage_view(&v[n++], view_blob, &bytes);
		}
	}
	if (rc == EXIT_OK && o->emit_mlir) {
		v[n] = (staged_view){.path = o->emit_mlir};
		rc = stage_view(&v[n++], view_mlir, c);
	}
	if (rc == EXIT_OK && o->emit_trace) {
		v[n] = (staged_view){.path = o->emit_trace};
		rc = stage_view(&v[n++], view_trace, c->schedule);
	}
	if (rc == EXIT_OK && o->emit_svg) {
		v[n] = (staged_view){.path = o->emit_svg};
		rc = stage_view(&v[n++], view_svg, c->schedule);
	}
	free(bytes.p);
	/* Two names for one file (x.json and ./x.json) would overwrite each other. */
	for (int i = 0; i < n && rc == EXIT_OK; i++)
		for (int j = i + 1; j < n && rc == EXIT_OK; j++)
			if (v[i].target && v[j].target && strcmp(v[i].target, v[j].target) == 0) {
				fprintf(stderr, "kilnc: error: '%s' and '%s' are the same file\n", v[i].path,
				        v[j].path);
				rc = EXIT_INPUT;
			}
	return commit_views(v, n, rc == EXIT_OK);
}

/* Reads a regular file of at most VIZ_MAX_BYTES into a malloc'd buffer.
 * Returns 0, or EXIT_INPUT after reporting. */
static int read_plan_file(const char *path, char **out, size_t *out_len)
{
	*out = NULL;
	*out_len = 0;
	/* O_NONBLOCK: a FIFO must not hang us before fstat refuses it. */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "kilnc: error: cannot open %s: %s\n", path, strerror(errno));
		return EXIT_INPUT;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		fprintf(stderr, "kilnc: error: %s: not a regular file\n", path);
		close(fd);
		return EXIT_INPUT;
	}
	if (st.st_size > VIZ_MAX_BYTES) {
		fprintf(stderr, "kilnc: error: %s: %lld bytes, over the 1 GiB limit\n", path,
		        (long long)st.st_size);
		close(fd);
		return EXIT_INPUT;
	}
	size_t cap = (size_t)st.st_size, len = 0;
	char *buf = malloc(cap + 1);
	if (!buf) {
		fprintf(stderr, "kilnc: error: out of memory reading %s\n", path);
		close(fd);
		return EXIT_INPUT;
	}
	while (len < cap) {
		ssize_t k = read(fd, buf + len, cap - len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			fprintf(stderr, "kilnc: error: reading %s: %s\n", path, strerror(errno));
			free(buf);
			close(fd);
			return EXIT_INPUT;
		}
		if (k == 0)
			break;
		len += (size_t)k;
	}
	close(fd);
	buf[len] = '\0';
	*out = buf;
	*out_len = len;
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
		int m;
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			help = true;
		} else if (strcmp(a, "-o") == 0) {
			if (i + 1 >= argc || !*argv[i + 1]) {
				usage_error("%s needs a file name", a);
				return EXIT_USAGE;
			}
			if (out) {
				usage_error("%s given twice", a);
				return EXIT_USAGE;
			}
			out = argv[++i];
		} else if ((m = kilnc_option_value("--output", argc, argv, &i, &out)) != 0) {
			if (m == EXIT_USAGE)
				return EXIT_USAGE;
		} else if (a[0] == '-' && a[1] != '\0') {
			fprintf(stderr, "kilnc: error: unknown option '%s' for 'viz'\n", a);
			fprintf(stderr, "Try 'kilnc help viz'.\n");
			return EXIT_USAGE;
		} else if (!plan) {
			plan = a;
		} else {
			fprintf(stderr, "kilnc: error: 'viz' takes one PLAN, got '%s' and '%s'\n", plan,
			        a);
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
		usage_error("'viz' needs -o OUT.svg or -o OUT.json (%s)", plan);
		return EXIT_USAGE;
	}
	view_fn fn = has_suffix(out, ".svg") ? view_svg : has_suffix(out, ".json") ? view_trace : NULL;
	if (!fn) {
		usage_error("-o %s: the output must end in .svg (SVG timeline) or .json (Chrome trace)",
		            out);
		return EXIT_USAGE;
	}
	if (has_suffix(plan, ".kiln")) {
		usage_error("%s: a plan blob keeps task order, not times, so viz cannot draw it; use "
		            "the MLIR of kilnc compile --emit-mlir (kilnc inspect --templates lists "
		            "a blob's templates)",
		            plan);
		return EXIT_USAGE;
	}
	char *text;
	size_t len;
	int rc = read_plan_file(plan, &text, &len);
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
	kiln_compilation c = {.model = m, .arena = a};
	c.solver = o.solver && strcmp(o.solver, "milp") == 0 ? KILN_SOLVER_MILP : KILN_SOLVER_DP;
	c.progress = isatty(2) ? stderr : NULL;
	rc = kiln_pipeline_compile(&c, NULL, o.dump_after, stdout, stderr);
	if (rc == -2) {
		usage_error("--dump-after: no pass named '%s'", o.dump_after);
		rc = EXIT_USAGE;
	} else if (rc == -3) {
		rc = EXIT_INPUT; /* over the cost bound, reported */
	} else if (rc != 0) {
		fprintf(stderr, "kilnc: error: compiling %s failed\n", o.model);
		rc = EXIT_INPUT;
	} else if ((rc = write_views(&o, &c, kiln_plans_infeasible_stages(&c) == 0)) != EXIT_OK) {
		/* reported; nothing on stdout */
	} else if (kiln_plans_infeasible_stages(&c) > 0) {
		kiln_plans_report_infeasible(&c, stderr);
		rc = EXIT_INFEASIBLE;
	} else if (o.json) {
		kiln_json *doc = kiln_plans_json(&c);
		if (kiln_json_write(doc, stdout) != 0) {
			fprintf(stderr, "kilnc: error: out of memory writing JSON\n");
			rc = EXIT_INPUT;
		}
		kiln_json_free(doc);
	} else if (!o.dump_after) {
		kiln_plans_text(&c, stdout);
	}
	kiln_arena_free(a);
	return finish_output(rc);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		print_usage(stderr);
		return EXIT_USAGE;
	}
	const char *cmd = argv[1];
	if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0)
		return finish_output(print_help(NULL));
	if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
		printf("kilnc %s\n", KILN_VERSION);
		return finish_output(EXIT_OK);
	}
	if (strcmp(cmd, "help") == 0) {
		if (argc > 3) {
			usage_error("'help' takes at most one COMMAND, got '%s'", argv[3]);
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
	if (strcmp(cmd, "select") == 0)
		return finish_output(kilnc_select(argc - 2, argv + 2));
	if (cmd[0] == '-')
		usage_error("unknown option '%s'", cmd);
	else
		usage_error("unknown command '%s'", cmd);
	return EXIT_USAGE;
}
