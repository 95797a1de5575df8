/* tools/kilnc.c: the kiln compiler driver.
 *
 * Exit status (docs/cli.md): 0 success, 1 bad input, 2 usage error,
 * 3 infeasible plan (from `compile`).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "passes/passes.h"

enum { EXIT_OK = 0, EXIT_INPUT = 1, EXIT_USAGE = 2, EXIT_INFEASIBLE = 3 };

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
	"  compile MODEL [--solver dp|milp] [--json] [--dump-after=PASS]\n"
	"      Run every pass: units, per-unit keep/recompute/offload options, a\n"
	"      Pareto frontier per (stage, layer kind, load bucket), budgets and\n"
	"      the safety bound, and the baselines. Prints a summary, or the plan\n"
	"      tables with --json. Exit 3 when load.max_factor does not fit.\n"
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
	"usage: kilnc compile MODEL [--solver dp|milp] [--json] [--dump-after=PASS]\n"
	"\n"
	"Plans activation memory for MODEL. For every pipeline stage and layer kind:\n"
	"the saved activations (units), and for each load bucket from 0 to\n"
	"load.max_factor the Pareto frontier of bytes saved against exposed time, each\n"
	"point one keep / recompute / offload action per unit. Then per stage the\n"
	"steady-state plan, the budget of a micro-batch deciding after its MoE gate,\n"
	"and the safety bound: the largest load factor at which the maximal-saving plan\n"
	"still fits. Baselines (full recompute, Megatron selective, static aggressive,\n"
	"AdaPipe) are planned too.\n"
	"\n"
	"  --solver dp     dynamic programming over quantised bytes (default)\n"
	"  --solver milp   an exact MILP (GLPK) for every frontier point; slower\n"
	"  --json          the plan tables as one JSON document (docs/cli.md)\n"
	"  --dump-after=P  print the compiler state after pass P\n"
	"\n"
	"Exit status 3, with each stage and its largest feasible load factor on\n"
	"stderr, when load.max_factor does not fit on some stage. The plan blob\n"
	"(-o PLAN.kiln) arrives with the runtime; until then --json is the output.\n"
	"Progress goes to stderr when stderr is a terminal.\n";

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
		} else if (allow_solver && (strcmp(a, "-o") == 0 || strncmp(a, "--output", 8) == 0)) {
			usage_error("%s: the plan blob is not implemented yet (it arrives with the "
			            "runtime); use --json for the plan tables",
			            a);
			return EXIT_USAGE;
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
	} else if (rc != 0) {
		fprintf(stderr, "kilnc: error: compiling %s failed\n", o.model);
		rc = EXIT_INPUT;
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
	if (cmd[0] == '-')
		usage_error("unknown option '%s'", cmd);
	else
		usage_error("unknown command '%s'", cmd);
	return EXIT_USAGE;
}
