/* tests/test_cli.c: the kilnc command line, run as a user would run it. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "kiln_test.h"

#define RUN(...) kt_kilnc((const char *const[]){__VA_ARGS__, NULL}, NULL)


Test(cli, version)
{
	kt_run r = RUN("--version");
	cr_assert_eq(r.status, 0);
	cr_assert(strncmp(r.out, "kilnc " KILN_VERSION "\n", strlen("kilnc " KILN_VERSION)) == 0,
	          "got: %s", r.out);
	kt_run_free(&r);
}

Test(cli, help_lists_commands_and_exit_statuses)
{
	kt_run r = RUN("--help");
	cr_assert_eq(r.status, 0);
	cr_assert_not_null(strstr(r.out, "check MODEL"));
	cr_assert_not_null(strstr(r.out, "report MODEL"));
	cr_assert_not_null(strstr(r.out, "Exit status"));
	kt_run_free(&r);
	r = RUN("help", "report");
	cr_assert_eq(r.status, 0);
	cr_assert_not_null(strstr(r.out, "headroom"));
	kt_run_free(&r);
	r = RUN("report", "--help");
	cr_assert_eq(r.status, 0);
	cr_assert_not_null(strstr(r.out, "usage: kilnc report"));
	kt_run_free(&r);
}

Test(cli, usage_errors_exit_2)
{
	const char *const *cases[] = {
		(const char *const[]){NULL},
		(const char *const[]){"frobnicate", NULL},
		(const char *const[]){"--frobnicate", NULL},
		(const char *const[]){"check", NULL},
		(const char *const[]){"report", "a.yaml", "b.yaml", NULL},
		(const char *const[]){"report", "--bogus", "a.yaml", NULL},
		(const char *const[]){"check", "--json", "a.yaml", NULL},
		(const char *const[]){"help", "frobnicate", NULL},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		kt_run r = kt_kilnc(cases[i], NULL);
		cr_assert_eq(r.status, 2, "case %zu: status %d, stderr: %s", i, r.status, r.err);
		cr_assert(r.err_len > 0, "case %zu: no message", i);
		cr_assert_eq(r.out_len, 0, "case %zu: wrote to stdout", i);
		kt_run_free(&r);
	}
}

Test(cli, unknown_dump_pass_is_a_usage_error)
{
	kt_run r = RUN("check", kt_src("examples/models/tiny.yaml"), "--dump-after=nope");
	cr_assert_eq(r.status, 2, "stderr: %s", r.err);
	cr_assert_not_null(strstr(r.err, "nope"));
	kt_run_free(&r);
}

Test(cli, dump_after_lower_prints_the_ir)
{
	kt_run r = RUN("check", kt_src("examples/models/tiny.yaml"), "--dump-after=lower");
	cr_assert_eq(r.status, 0, "stderr: %s", r.err);
	/* The tiny model's IR names its MoE tensors. */
	cr_assert_not_null(strstr(r.out, "moe.expert_in"), "stdout: %.400s", r.out);
	kt_run_free(&r);
}

Test(cli, every_shipped_model_checks)
{
	for (size_t i = 0; i < KT_N_SHIPPED; i++) {
		kt_run r = RUN("check", kt_src(kt_shipped[i]));
		cr_assert_eq(r.status, 0, "%s: status %d, stderr: %s", kt_shipped[i], r.status, r.err);
		cr_assert_not_null(strstr(r.out, ": ok"), "%s: %s", kt_shipped[i], r.out);
		cr_assert_eq(r.err_len, 0, "%s: stderr: %s", kt_shipped[i], r.err);
		kt_run_free(&r);
	}
}

static double num(const kiln_json *o, const char *k1, const char *k2)
{
	const kiln_json *v = kiln_json_get(o, k1);
	if (k2)
		v = kiln_json_get(v, k2);
	cr_assert(kiln_json_is_number(v), "missing number %s.%s", k1, k2 ? k2 : "");
	return kiln_json_number(v);
}

/* The JSON report is one document whose per-stage figures add up. */
Test(cli, report_json_is_consistent_for_every_shipped_model)
{
	for (size_t i = 0; i < KT_N_SHIPPED; i++) {
		kt_run r = RUN("report", kt_src(kt_shipped[i]), "--json");
		cr_assert_eq(r.status, 0, "%s: %s", kt_shipped[i], r.err);
		kiln_json *doc = kiln_json_parse(r.out, r.out_len);
		cr_assert_not_null(doc, "%s: stdout is not JSON", kt_shipped[i]);
		const kiln_json *stages = kiln_json_get(doc, "stages");
		double pp = num(doc, "parallel", "pp");
		cr_assert_eq(kiln_json_size(stages), (int)pp, "%s", kt_shipped[i]);
		double layers = 0;
		for (int s = 0; s < kiln_json_size(stages); s++) {
			const kiln_json *st = kiln_json_at(stages, s);
			layers += num(st, "layers", NULL);
			double total = num(st, "static_bytes", "total");
			cr_assert_eq(total,
			             num(st, "static_bytes", "weights") + num(st, "static_bytes", "grads") +
			                     num(st, "static_bytes", "optimizer"),
			             "%s stage %d", kt_shipped[i], s);
			double inflight = num(st, "inflight", NULL);
			double a1 = num(st, "activation_bytes", "r1");
			double amax = num(st, "activation_bytes", "max");
			cr_assert(amax >= a1, "%s stage %d", kt_shipped[i], s);
			double spike = total + (inflight - 1) * a1 + amax;
			cr_assert(fabs(num(st, "peak_bytes", "spike") - spike) <= 1e-9 * spike + 1,
			          "%s stage %d", kt_shipped[i], s);
			cr_assert(fabs(num(st, "headroom_bytes", NULL) -
			               (num(st, "capacity_bytes", NULL) - spike)) <= 1e-9 * spike + 1,
			          "%s stage %d", kt_shipped[i], s);
		}
		/* Every model layer lands on exactly one stage. */
		cr_assert_eq(layers, num(doc, "layers", NULL), "%s", kt_shipped[i]);
		const kiln_json *params = kiln_json_get(doc, "params");
		cr_assert(num(params, "total", NULL) > 0);
		double mfu = num(doc, "iteration", "mfu");
		cr_assert(mfu > 0 && mfu < 1, "%s: mfu %g", kt_shipped[i], mfu);
		kiln_json_free(doc);
		kt_run_free(&r);
	}
}

/* tiny.yaml's inline hardware: memory 10 MiB, reserved 1 MiB, so
 * capacity = 9 * 2^20 = 9,437,184 bytes on every stage. */
Test(cli, report_capacity_follows_the_hardware_profile)
{
	kt_run r = RUN("report", kt_src("examples/models/tiny.yaml"), "--json");
	cr_assert_eq(r.status, 0, "%s", r.err);
	kiln_json *doc = kiln_json_parse(r.out, r.out_len);
	cr_assert_not_null(doc);
	const kiln_json *stages = kiln_json_get(doc, "stages");
	cr_assert_eq(kiln_json_size(stages), 2);
	for (int s = 0; s < 2; s++)
		cr_assert_eq(num(kiln_json_at(stages, s), "capacity_bytes", NULL), 9437184.0);
	/* 1F1B with p = 2, m = 32 / (2 * 4) = 4: stage 0 holds 2, stage 1 holds 1. */
	cr_assert_eq(num(kiln_json_at(stages, 0), "inflight", NULL), 2.0);
	cr_assert_eq(num(kiln_json_at(stages, 1), "inflight", NULL), 1.0);
	kiln_json_free(doc);
	kt_run_free(&r);
}

Test(cli, report_text_names_every_stage)
{
	kt_run r = RUN("report", kt_src("examples/models/deepseek-v3-671b.yaml"));
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "headroom"));
	cr_assert_not_null(strstr(r.out, "MFU"));
	/* 16 stages: rows 0..15. */
	cr_assert_not_null(strstr(r.out, "\n   15 "), "%s", r.out);
	kt_run_free(&r);
}

Test(cli, write_failure_is_an_error)
{
	if (access("/dev/full", W_OK) != 0)
		cr_skip_test("no /dev/full");
	kt_run r = kt_kilnc((const char *const[]){"report", kt_src("examples/models/tiny.yaml"), NULL},
	                    "/dev/full");
	cr_assert_neq(r.status, 0);
	cr_assert_not_null(strstr(r.err, "writing the standard output: No space left on device"),
	                   "%s", r.err);
	kt_run_free(&r);
}

Test(cli, missing_file_is_bad_input)
{
	kt_run r = RUN("check", "/nonexistent/model.yaml");
	cr_assert_eq(r.status, 1);
	cr_assert_not_null(strstr(r.err, "/nonexistent/model.yaml"), "%s", r.err);
	kt_run_free(&r);
}

/* A file with several mistakes: all are reported, each as FILE:LINE:COL. */
Test(cli, every_error_is_reported_with_its_position)
{
	static const char text[] = "kiln: 1\n"
	                           "name: broken\n"
	                           "model:\n"
	                           "  layers: 0\n"         /* line 4: not positive */
	                           "  hidden: 64\n"
	                           "  ffn_hiden: 256\n"    /* line 6: unknown key */
	                           "  heads: 4\n"
	                           "  vocab: 256\n"
	                           "  seq_len: 128\n"
	                           "  attention: sparse\n" /* line 10: bad enum */
	                           "training:\n"
	                           "  global_batch: 8\n"
	                           "parallel:\n"
	                           "  devices: 1\n"
	                           "hardware: bw1000\n";
	char *path = kt_temp_file(".yaml", text, sizeof text - 1);
	kt_run r = RUN("check", path);
	cr_assert_eq(r.status, 1);
	cr_assert_eq(r.out_len, 0, "stdout: %s", r.out);
	char want[4200];
	snprintf(want, sizeof want, "%s:4:11: error:", path);
	cr_assert_not_null(strstr(r.err, want), "stderr: %s", r.err);
	snprintf(want, sizeof want, "%s:6:3: error:", path);
	cr_assert_not_null(strstr(r.err, want), "stderr: %s", r.err);
	cr_assert_not_null(strstr(r.err, "ffn_hidden"), "no suggestion: %s", r.err);
	snprintf(want, sizeof want, "%s:10:14: error:", path);
	cr_assert_not_null(strstr(r.err, want), "stderr: %s", r.err);
	unlink(path);
	free(path);
	kt_run_free(&r);
}

/* Hostile input: exit 1 with a message, no crash, no output, quickly. */
static void expect_rejected(const char *what, const void *data, size_t len)
{
	char *path = kt_temp_file(".yaml", data, len);
	kt_run r = RUN("check", path);
	cr_assert_eq(r.status, 1, "%s: status %d, stderr: %.300s", what, r.status, r.err);
	cr_assert(strstr(r.err, "error:") != NULL, "%s: no error message: %.300s", what, r.err);
	cr_assert_eq(r.out_len, 0, "%s: wrote to stdout", what);
	unlink(path);
	free(path);
	kt_run_free(&r);
}

Test(cli_hostile, empty_file)
{
	expect_rejected("empty", "", 0);
}

Test(cli_hostile, binary_garbage)
{
	unsigned char junk[4096];
	unsigned x = 12345;
	for (size_t i = 0; i < sizeof junk; i++) {
		x = x * 1103515245u + 12345u;
		junk[i] = (unsigned char)(x >> 16);
	}
	expect_rejected("garbage", junk, sizeof junk);
}

Test(cli_hostile, fifty_megabytes)
{
	size_t len = 50u * 1000u * 1000u;
	char *big = malloc(len);
	cr_assert_not_null(big);
	static const char line[] = "# padding padding padding padding padding padding padding\n";
	for (size_t i = 0; i < len; i++)
		big[i] = line[i % (sizeof line - 1)];
	expect_rejected("50 MB", big, len);
	free(big);
}

Test(cli_hostile, deep_nesting)
{
	size_t depth = 10000;
	char *deep = malloc(2 * depth + 16);
	cr_assert_not_null(deep);
	memcpy(deep, "kiln: ", 6);
	for (size_t i = 0; i < depth; i++)
		deep[6 + i] = '[';
	for (size_t i = 0; i < depth; i++)
		deep[6 + depth + i] = ']';
	deep[6 + 2 * depth] = '\n';
	expect_rejected("[ x 10000", deep, 6 + 2 * depth + 1);
	/* And block mappings nested by indentation are cut off too. */
	free(deep);
}

Test(cli_hostile, integer_beyond_2_63)
{
	static const char text[] = "kiln: 1\nmodel:\n  layers: 9223372036854775808\n";
	expect_rejected("2^63", text, sizeof text - 1);
	static const char text2[] = "kiln: 1\nmodel:\n  hidden: 99999999999999999999999999999\n";
	expect_rejected("10^29", text2, sizeof text2 - 1);
}

Test(cli_hostile, duplicate_keys)
{
	static const char text[] = "kiln: 1\nkiln: 1\n";
	expect_rejected("duplicate", text, sizeof text - 1);
}

Test(cli_hostile, alias_bomb)
{
	static const char text[] = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
	                           "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
	                           "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
	                           "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
	                           "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
	                           "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
	                           "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n"
	                           "h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
	                           "i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\n";
	expect_rejected("billion laughs", text, sizeof text - 1);
}

/* A FIFO would block a reader forever; a directory is no file. */
Test(cli_hostile, not_a_regular_file)
{
	char fifo[] = "/tmp/kiln-test-fifo-XXXXXX";
	int fd = mkstemp(fifo);
	cr_assert(fd >= 0);
	close(fd);
	unlink(fifo);
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	kt_run r = RUN("check", fifo);
	cr_assert_eq(r.status, 1);
	cr_assert_not_null(strstr(r.err, "not a regular file"), "%s", r.err);
	kt_run_free(&r);
	unlink(fifo);
	r = RUN("check", "/tmp");
	cr_assert_eq(r.status, 1);
	cr_assert_not_null(strstr(r.err, "not a regular file"), "%s", r.err);
	kt_run_free(&r);
}

/* Views go into place whole, all or none, and never replace what is not a
 * regular file. */
Test(cli_views, devices_symlinks_and_aliases)
{
	const char *tiny = kt_src("examples/models/tiny.yaml");
	/* /dev/null stays a device (renaming over it would replace the node). */
	kt_run r = RUN("compile", tiny, "--emit-trace", "/dev/null");
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	struct stat st;
	cr_assert_eq(stat("/dev/null", &st), 0);
	cr_assert(S_ISCHR(st.st_mode), "/dev/null is no longer a device");

	char dir[] = "/tmp/kiln-views-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char a[128], b[128], link[128], real[128];
	snprintf(a, sizeof a, "%s/x.json", dir);
	snprintf(b, sizeof b, "%s/./x.json", dir);
	/* Two names of one file: refused as a usage error, nothing written. */
	r = RUN("compile", tiny, "--emit-trace", a, "--emit-svg", b);
	cr_assert_eq(r.status, 2, "%s", r.err);
	cr_assert_not_null(strstr(r.err, "are the same file"), "%s", r.err);
	cr_assert_neq(access(a, F_OK), 0, "a view was left behind");
	kt_run_free(&r);
	/* One unwritable view: the other is not written either. */
	r = RUN("compile", tiny, "--emit-trace", a, "--emit-svg", "/nonexistent-dir/y.svg");
	cr_assert_eq(r.status, 1);
	cr_assert_neq(access(a, F_OK), 0, "a view was written although another failed");
	kt_run_free(&r);
	/* A dangling symlink: the view lands at its target, the link stays. */
	snprintf(link, sizeof link, "%s/link.svg", dir);
	snprintf(real, sizeof real, "%s/real.svg", dir);
	cr_assert_eq(symlink("real.svg", link), 0);
	r = RUN("compile", tiny, "--emit-svg", link);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	cr_assert_eq(lstat(link, &st), 0);
	cr_assert(S_ISLNK(st.st_mode), "the symlink was replaced");
	cr_assert_eq(stat(real, &st), 0);
	cr_assert(S_ISREG(st.st_mode) && st.st_size > 0);
	unlink(link);
	unlink(real);
	rmdir(dir);
}

/* viz reads only what kilnc writes: MLIR that would send MLIR's parser into
 * deep recursion, and schedules that are not schedules, are refused. */
Test(cli_views, viz_refuses_foreign_mlir_and_invalid_schedules)
{
	size_t n = 20000;
	char *deep = malloc(n + 256);
	cr_assert_not_null(deep);
	int k = snprintf(deep, 256, "\"builtin.module\"() ({}) {x = affine_map<(d0) -> (");
	memset(deep + k, '-', n);
	snprintf(deep + k + n, 64, "d0)>} : () -> ()\n");
	char *path = kt_temp_file(".mlir", deep, strlen(deep));
	kt_run r = RUN("viz", path, "-o", "/tmp/kiln-never.svg");
	cr_assert_eq(r.status, 1, "status %d: %s", r.status, r.err);
	cr_assert_not_null(strstr(r.err, "affine_map"), "%s", r.err);
	kt_run_free(&r);
	unlink(path);
	free(path);
	free(deep);
	/* A template whose second task starts before its dependency ends. */
	static const char bad[] =
	    "\"kiln.schedule\"() ({\n"
	    "\"kiln.template\"() ({\n"
	    "\"kiln.task\"() {chain = 0 : i64, deps = array<i32>, duration_us = 2.0 : f64, "
	    "end_us = 2.0 : f64, index = 0 : i64, kind = \"forward\", mem_bytes = 0.0 : f64, "
	    "name = \"a\", start_us = 0.0 : f64, stream = \"compute\"} : () -> ()\n"
	    "\"kiln.task\"() {chain = 0 : i64, deps = array<i32: 0>, duration_us = 1.0 : f64, "
	    "end_us = 2.0 : f64, index = 1 : i64, kind = \"forward\", mem_bytes = 0.0 : f64, "
	    "name = \"b\", start_us = 1.0 : f64, stream = \"comm\"} : () -> ()\n"
	    "}) {base_us = 2.0 : f64, id = 0 : i64, kind = \"moe\", load_factor = 1.0 : f64, "
	    "makespan_us = 2.0 : f64, plan = 0 : i64, serial_us = 3.0 : f64, stage = 0 : i64} : () "
	    "-> ()\n"
	    "\"kiln.timeline\"() {layers = array<i32: 0>, stage = 0 : i64, templates = "
	    "array<i32: 0>} : () -> ()\n"
	    "}) {model = \"m\"} : () -> ()\n";
	path = kt_temp_file(".mlir", bad, sizeof bad - 1);
	r = RUN("viz", path, "-o", "/tmp/kiln-never.json");
	cr_assert_eq(r.status, 1, "status %d: %s", r.status, r.err);
	cr_assert_not_null(strstr(r.err, "not a valid schedule"), "%s", r.err);
	cr_assert_neq(access("/tmp/kiln-never.json", F_OK), 0);
	kt_run_free(&r);
	unlink(path);
	free(path);
}

/* ---------------------------------------------------------------- numbers, options, text */

/* tiny compiled to a fresh temporary blob; the caller unlinks and frees it. */
static char *tiny_blob(void)
{
	char *p = kt_temp_file(".kiln", "", 0);
	kt_run r = RUN("compile", kt_src("examples/models/tiny.yaml"), "-o", p);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	return p;
}

/* args exits 2 with want in its message and nothing on stdout. */
static void expect_usage(const char *const *args, const char *want)
{
	kt_run r = kt_kilnc(args, NULL);
	char line[512] = "";
	for (int i = 0; args[i]; i++)
		snprintf(line + strlen(line), sizeof line - strlen(line), " %s", args[i]);
	cr_assert_eq(r.status, 2, "kilnc%s: status %d, stderr: %s", line, r.status, r.err);
	cr_assert_not_null(strstr(r.err, want), "kilnc%s: stderr: %s", line, r.err);
	cr_assert_eq(r.out_len, 0, "kilnc%s wrote to stdout: %.200s", line, r.out);
	kt_run_free(&r);
}

/* Every number option of every command, with a value written in a way
 * docs/cli.md ("Numbers") refuses: a hex float, which strtod reads
 * (0x1p1 is 2), and hex integers, which no kiln parser reads. */
Test(cli_args, hex_numbers_are_refused_by_every_parser)
{
	char *plan = tiny_blob();
	const char *tiny = kt_src("examples/models/tiny.yaml");
	char model[4096];
	snprintf(model, sizeof model, "%s", tiny);
	/* strtod read these two (as 2 and 8): the hex floats first. */
	expect_usage((const char *const[]){"select", plan, "--stage", "0", "--layer", "1",
	                                   "--load-factor", "0x1p1", "--free", "3M", NULL},
	             "--load-factor: must be a decimal number from 0 to 1000000, got '0x1p1'");
	expect_usage((const char *const[]){"simulate", model, "--policy", "kiln", "--restart-s",
	                                   "0x1p3", NULL},
	             "--restart-s: must be a decimal number from 0 to 1000000000, got '0x1p3'");
	const char *opts[][2] = {{"--stage", "0"},
	                         {"--layer", "1"},
	                         {"--load-factor", "2"},
	                         {"--free", "3M"},
	                         {"--pending", "0"}};
	/* select: each option in turn gets the hex spelling of its good value. */
	const char *hex[] = {"0x0", "0x1", "0x1p1", "0x300000", "0x0"};
	for (int k = 0; k < 5; k++) {
		const char *a[16] = {"select", plan};
		int n = 2;
		for (int j = 0; j < 5; j++) {
			a[n++] = opts[j][0];
			a[n++] = j == k ? hex[k] : opts[j][1];
		}
		expect_usage(a, "must be");
	}
	expect_usage((const char *const[]){"select", plan, "--stage", "0", "--layer", "1", "--rows",
	                                   "0x10", "--free", "3M", NULL},
	             "--rows: must be an integer from 0 to 18446744073709551615, got '0x10'");
	expect_usage((const char *const[]){"select", plan, "--stage", "0", "--layer", "1",
	                                   "--tokens", "1,0x2", "--free", "3M", NULL},
	             "--tokens: must be a list of integers");
	const char *sim[][2] = {{"--iters", "0x2"},
	                        {"--seed", "0x1"},
	                        {"--groups", "0x1"},
	                        {"--checkpoint-every", "0x10"},
	                        {"--restart-s", "0x1p3"}};
	for (int k = 0; k < 5; k++)
		expect_usage((const char *const[]){"simulate", model, "--policy", "kiln", sim[k][0],
		                                   sim[k][1], NULL},
		             "must be");
	/* The description, the load profiles and traces refuse them as well
	 * (they did before: this is the same rule). */
	char *yaml = NULL, *hexed = kt_temp_file(".yaml", "", 0);
	cr_assert_eq(
	    kt_sh(&yaml, "sed 's/max_factor: 3.0/max_factor: 0x1p1/' '%s' > '%s'", tiny, hexed), 0);
	free(yaml);
	kt_run r = RUN("check", hexed);
	cr_assert_eq(r.status, 1, "%s", r.err);
	cr_assert_not_null(strstr(r.err, "expected a finite number for 'max_factor', got '0x1p1'"),
	                   "%s", r.err);
	kt_run_free(&r);
	unlink(hexed);
	free(hexed);
	r = RUN("simulate", model, "--policy", "kiln", "--loads", "zipf:0x1p0");
	cr_assert_eq(r.status, 1, "%s", r.err);
	kt_run_free(&r);
	static const char trace[] = "iteration,microbatch,layer,rank,factor\n0,0,1,0,0x1p1\n";
	char *tp = kt_temp_file(".csv", trace, sizeof trace - 1);
	r = RUN("simulate", model, "--policy", "kiln", "--loads", tp);
	cr_assert_eq(r.status, 1, "%s", r.err);
	cr_assert_not_null(strstr(r.err, "'0x1p1', not a number"), "%s", r.err);
	kt_run_free(&r);
	unlink(tp);
	free(tp);
	unlink(plan);
	free(plan);
}

/* Blanks before a number were skipped by strtol and strtod, blanks after it
 * refused: both are refused now, by every command-line parser. */
Test(cli_args, blanks_around_numbers_are_refused_alike)
{
	char *plan = tiny_blob();
	const char *model = kt_src("examples/models/tiny.yaml");
	const char *spellings[] = {" 2", "2 ", "\t2", "2\n"};
	for (int s = 0; s < 4; s++) {
		const char *v = spellings[s];
		expect_usage((const char *const[]){"simulate", model, "--policy", "kiln", "--iters",
		                                   v, NULL},
		             "--iters: must be an integer from 1 to 100000000, got '");
		expect_usage(
		    (const char *const[]){"simulate", model, "--policy", "kiln", "--seed", v, NULL},
		    "--seed: must be an integer");
		expect_usage((const char *const[]){"simulate", model, "--policy", "kiln",
		                                   "--groups", v, NULL},
		             "--groups: must be an integer");
		expect_usage((const char *const[]){"simulate", model, "--policy", "kiln",
		                                   "--checkpoint-every", v, NULL},
		             "--checkpoint-every: must be an integer");
		expect_usage((const char *const[]){"simulate", model, "--policy", "kiln",
		                                   "--restart-s", v, NULL},
		             "--restart-s: must be a decimal number from 0 to 1000000000");
		expect_usage((const char *const[]){"select", plan, "--stage", v, "--layer", "1",
		                                   "--rows", "1", "--free", "3M", NULL},
		             "--stage: must be an integer from 0 to 2147483647");
		expect_usage((const char *const[]){"select", plan, "--stage", "0", "--layer", v,
		                                   "--rows", "1", "--free", "3M", NULL},
		             "--layer: must be an integer");
		expect_usage((const char *const[]){"select", plan, "--stage", "0", "--layer", "1",
		                                   "--rows", v, "--free", "3M", NULL},
		             "--rows: must be an integer");
		expect_usage((const char *const[]){"select", plan, "--stage", "0", "--layer", "1",
		                                   "--load-factor", v, "--free", "3M", NULL},
		             "--load-factor: must be a decimal number from 0 to 1000000");
		expect_usage((const char *const[]){"select", plan, "--stage", "0", "--layer", "1",
		                                   "--rows", "1", "--free", v, NULL},
		             "--free: must be a byte count");
		expect_usage((const char *const[]){"select", plan, "--stage", "0", "--layer", "1",
		                                   "--rows", "1", "--free", "3M", "--pending", v,
		                                   NULL},
		             "--pending: must be an integer from 0 to 1000000");
		expect_usage((const char *const[]){"select", plan, "--stage", "0", "--layer", "1",
		                                   "--tokens", v, "--free", "3M", NULL},
		             "--tokens: must be a list of integers");
	}
	/* The control character in the value is shown escaped. */
	kt_run r =
	    RUN("select", plan, "--stage", "0", "--layer", "1", "--rows", "2\n", "--free", "3M");
	cr_assert_not_null(strstr(r.err, "got '2\\x0a'"), "%s", r.err);
	kt_run_free(&r);
	/* A sign and leading zeros are decimal: accepted by every parser. */
	r = RUN("select", plan, "--stage", "+0", "--layer", "01", "--rows", "+0010", "--free", "3M",
	        "--json");
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "\"rows\":\t10,"), "%s", r.out);
	kt_run_free(&r);
	unlink(plan);
	free(plan);
}

/* docs/cli.md: every option is given at most once. Each option of each
 * command, twice: a usage error naming it, nothing on stdout. */
Test(cli_args, every_option_given_twice_is_a_usage_error)
{
	char *plan = tiny_blob();
	const char *model = kt_src("examples/models/tiny.yaml");
	char *o1 = kt_temp_file(".kiln", "", 0), *o2 = kt_temp_file(".svg", "", 0);
	unlink(o1);
	unlink(o2);
	struct {
		const char *args[16];
		const char *name;
	} cases[] = {
	    {{"check", model, "--dump-after=lower", "--dump-after=lower"}, "--dump-after"},
	    {{"check", model, "--dump-after", "lower", "--dump-after", "plan"}, "--dump-after"},
	    {{"report", model, "--json", "--json"}, "--json"},
	    {{"compile", model, "--json", "--json"}, "--json"},
	    {{"compile", model, "--solver", "dp", "--solver", "milp"}, "--solver"},
	    {{"compile", model, "--solver=dp", "--solver=dp"}, "--solver"},
	    {{"compile", model, "--dump-after=plan", "--dump-after=budget"}, "--dump-after"},
	    {{"compile", model, "-o", o1, "-o", o1}, "-o"},
	    {{"compile", model, "--output", o1, "--output=x.kiln"}, "--output"},
	    {{"compile", model, "--emit-mlir", "a.mlir", "--emit-mlir", "b.mlir"}, "--emit-mlir"},
	    {{"compile", model, "--emit-trace", "a.json", "--emit-trace", "b.json"},
	     "--emit-trace"},
	    {{"compile", model, "--emit-svg", "a.svg", "--emit-svg", "b.svg"}, "--emit-svg"},
	    {{"inspect", plan, "--json", "--json"}, "--json"},
	    {{"inspect", plan, "--templates", "--templates"}, "--templates"},
	    {{"select", plan, "--stage", "0", "--stage", "0", "--layer", "1", "--rows", "1",
	      "--free", "1G"},
	     "--stage"},
	    {{"select", plan, "--stage", "0", "--layer", "1", "--layer", "1", "--rows", "1",
	      "--free", "1G"},
	     "--layer"},
	    {{"select", plan, "--stage", "0", "--layer", "1", "--rows", "1", "--rows", "1",
	      "--free", "1G"},
	     "--rows"},
	    {{"select", plan, "--stage", "0", "--layer", "1", "--tokens", "1", "--tokens", "1",
	      "--free", "1G"},
	     "--tokens"},
	    {{"select", plan, "--stage", "0", "--layer", "1", "--load-factor", "1", "--load-factor",
	      "1", "--free", "1G"},
	     "--load-factor"},
	    {{"select", plan, "--stage", "0", "--layer", "1", "--rows", "1", "--free", "1G",
	      "--free", "1G"},
	     "--free"},
	    {{"select", plan, "--stage", "0", "--layer", "1", "--rows", "1", "--free", "1G",
	      "--pending", "0", "--pending", "0"},
	     "--pending"},
	    {{"select", plan, "--stage", "0", "--layer", "1", "--rows", "1", "--free", "1G",
	      "--json", "--json"},
	     "--json"},
	    {{"simulate", model, "--policy", "kiln", "--json", "--json"}, "--json"},
	    {{"simulate", model, "--policy", "kiln", "--exact", "--exact"}, "--exact"},
	    {{"simulate", model, "--policy", "kiln", "--policy", "kiln"}, "--policy"},
	    {{"simulate", model, "--policy", "kiln", "--plan", plan, "--plan", plan}, "--plan"},
	    {{"simulate", model, "--policy", "kiln", "--iters", "1", "--iters", "1"}, "--iters"},
	    {{"simulate", model, "--policy", "kiln", "--seed", "1", "--seed", "1"}, "--seed"},
	    {{"simulate", model, "--policy", "kiln", "--loads", "paper", "--loads", "paper"},
	     "--loads"},
	    {{"simulate", model, "--policy", "kiln", "--groups", "1", "--groups", "1"}, "--groups"},
	    {{"simulate", model, "--policy", "kiln", "--restart-s", "1", "--restart-s", "1"},
	     "--restart-s"},
	    {{"simulate", model, "--policy", "kiln", "--checkpoint-every", "1",
	      "--checkpoint-every", "1"},
	     "--checkpoint-every"},
	    {{"simulate", model, "--policy", "kiln", "--emit-trace", "a.json", "--emit-trace",
	      "a.json"},
	     "--emit-trace"},
	    {{"simulate", model, "--emit-loads", "a.csv", "--emit-loads", "a.csv"}, "--emit-loads"},
	    {{"viz", "p.mlir", "-o", o2, "-o", o2}, "-o"},
	    {{"viz", "p.mlir", "--output", o2, "--output", o2}, "--output"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char want[64];
		snprintf(want, sizeof want, "%s given twice", cases[i].name);
		expect_usage(cases[i].args, want);
	}
	/* Nothing was written under the names given. */
	cr_assert_neq(access(o1, F_OK), 0);
	cr_assert_neq(access(o2, F_OK), 0);
	free(o1);
	free(o2);
	unlink(plan);
	free(plan);
}

Test(cli_args, version_and_help_take_no_arguments)
{
	expect_usage((const char *const[]){"--version", "extra", NULL},
	             "'--version' takes no arguments, got 'extra'");
	expect_usage((const char *const[]){"-V", "extra", NULL}, "'-V' takes no arguments");
	expect_usage((const char *const[]){"--help", "check", NULL},
	             "'--help' takes no arguments, got 'check' (one command's help: kilnc help "
	             "COMMAND)");
	kt_run r = RUN("--version");
	cr_assert_eq(r.status, 0);
	kt_run_free(&r);
}

/* --seed reads any 64-bit seed; past 2^64 - 1 the message says the limit. */
Test(cli_args, seed_limit_is_stated_and_reached)
{
	const char *model = kt_src("examples/models/tiny.yaml");
	expect_usage((const char *const[]){"simulate", model, "--policy", "kiln", "--seed",
	                                   "18446744073709551616", NULL},
	             "--seed: must be an integer from 0 to 18446744073709551615, got "
	             "'18446744073709551616'");
	expect_usage(
	    (const char *const[]){"simulate", model, "--policy", "kiln", "--seed", "-1", NULL},
	    "--seed: must be an integer from 0 to 18446744073709551615, got '-1'");
	/* 2^64 - 1 = 18446744073709551615 runs, and comes back exactly in the
	 * JSON (a double would print 1.8446744073709552e+19) and the text. */
	kt_run r = RUN("simulate", model, "--policy", "kiln", "--iters", "2", "--seed",
	               "18446744073709551615", "--json");
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "\"seed\":\t18446744073709551615,"), "%s", r.out);
	kt_run_free(&r);
	r = RUN("simulate", model, "--policy", "kiln", "--iters", "2", "--seed",
	        "18446744073709551615");
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "(seed 18446744073709551615)"), "%s", r.out);
	kt_run_free(&r);
	/* The seed above 2^63 is a seed of its own, not 2^63 - 1 clamped: two
	 * seeds that a double cannot tell apart (2^64 - 1 and 2^64 - 2) give
	 * different load traces. */
	char *a = kt_temp_file(".csv", "", 0), *b = kt_temp_file(".csv", "", 0);
	r = RUN("simulate", model, "--iters", "3", "--seed", "18446744073709551615", "--emit-loads",
	        a);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	r = RUN("simulate", model, "--iters", "3", "--seed", "18446744073709551614", "--emit-loads",
	        b);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	char *diff = NULL;
	cr_assert_neq(kt_sh(&diff, "cmp -s '%s' '%s'", a, b), 0, "same loads for different seeds");
	free(diff);
	unlink(a);
	unlink(b);
	free(a);
	free(b);
}

/* JSON integers are exact past 2^53: a double would print 2^64 - 1 as
 * 1.8446744073709552e+19. */
Test(cli_args, json_integers_are_exact)
{
	char *plan = tiny_blob();
	kt_run r = RUN("select", plan, "--stage", "0", "--layer", "1", "--rows",
	               "18446744073709551615", "--free", "18446744073709551614", "--json");
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "\"rows\":\t18446744073709551615,"), "%s", r.out);
	cr_assert_not_null(strstr(r.out, "\"free_bytes\":\t18446744073709551614,"), "%s", r.out);
	cr_assert_null(strstr(r.out, "e+"), "a number in exponent form: %s", r.out);
	kt_run_free(&r);
	/* 2^53 + 1 = 9007199254740993, the first integer a double cannot hold. */
	r = RUN("select", plan, "--stage", "0", "--layer", "1", "--rows", "9007199254740993",
	        "--free", "9007199254740993", "--json");
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "\"rows\":\t9007199254740993,"), "%s", r.out);
	cr_assert_not_null(strstr(r.out, "\"free_bytes\":\t9007199254740993,"), "%s", r.out);
	kt_run_free(&r);
	unlink(plan);
	free(plan);
}

/* Text outputs escape what they did not write themselves: here a path,
 * which may hold any byte but '/' and NUL. ESC ] 0 ; ... BEL would retitle
 * the terminal; the output shows it as \x1b...\x07 instead. */
Test(cli_text, paths_are_escaped_in_text_outputs)
{
	char dir[] = "/tmp/kiln-test-dir-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char path[256], want[300];
	snprintf(path, sizeof path, "%s/m\x1b]0;pwned\x07.yaml", dir);
	char *cp = NULL;
	cr_assert_eq(kt_sh(&cp, "cp '%s' '%s'", kt_src("examples/models/tiny.yaml"), path), 0);
	free(cp);
	kt_run r = RUN("check", path);
	cr_assert_eq(r.status, 0, "%s", r.err);
	snprintf(want, sizeof want, "tiny: ok (%s/m\\x1b]0;pwned\\x07.yaml)\n", dir);
	cr_assert(strncmp(r.out, want, strlen(want)) == 0, "%s", r.out);
	cr_assert_null(memchr(r.out, 0x1b, r.out_len), "a raw ESC on stdout");
	kt_run_free(&r);
	/* A trace path is shown by simulate, and in the trace's diagnostics. */
	static const char trace[] = "iteration,microbatch,layer,rank,factor\n0,0,1,0,1.5\n";
	char tp[256];
	snprintf(tp, sizeof tp, "%s/t\x1b[2J.csv", dir);
	FILE *f = fopen(tp, "w");
	cr_assert_not_null(f);
	fputs(trace, f);
	fclose(f);
	r = RUN("simulate", kt_src("examples/models/tiny.yaml"), "--policy", "kiln", "--iters", "1",
	        "--loads", tp);
	cr_assert_eq(r.status, 0, "%s", r.err);
	snprintf(want, sizeof want, "loads %s/t\\x1b[2J.csv (seed 1)", dir);
	cr_assert_not_null(strstr(r.out, want), "%s", r.out);
	cr_assert_null(memchr(r.out, 0x1b, r.out_len), "a raw ESC on stdout");
	kt_run_free(&r);
	/* A description's diagnostics name its file escaped too. */
	char bad[256];
	snprintf(bad, sizeof bad, "%s/b\x1b[2J.yaml", dir);
	f = fopen(bad, "w");
	cr_assert_not_null(f);
	fputs("kiln: 2\n", f);
	fclose(f);
	r = RUN("check", bad);
	cr_assert_eq(r.status, 1);
	snprintf(want, sizeof want, "%s/b\\x1b[2J.yaml:1:7: error:", dir);
	cr_assert_not_null(strstr(r.err, want), "%s", r.err);
	cr_assert_null(memchr(r.err, 0x1b, r.err_len), "a raw ESC on stderr");
	kt_run_free(&r);
	unlink(path);
	unlink(tp);
	unlink(bad);
	rmdir(dir);
}

/* Usage errors quote the argument they refuse, escaped. */
Test(cli_text, usage_errors_escape_what_they_quote)
{
	const char *model = kt_src("examples/models/tiny.yaml");
	const char *const *cases[] = {
	    (const char *const[]){"report", model, "--\x1b[2J", NULL},
	    (const char *const[]){"check", model, "extra\x1b[2J", NULL},
	    (const char *const[]){"simulate", model, "--policy", "kiln\x1b[2J", NULL},
	    (const char *const[]){"simulate", model, "--\x1b[2J", NULL},
	    (const char *const[]){"inspect", "a.kiln", "--\x1b[2J", NULL},
	    (const char *const[]){"select", "a.kiln", "--\x1b[2J", NULL},
	    (const char *const[]){"viz", "a.mlir", "--\x1b[2J", NULL},
	    (const char *const[]){"compile", model, "--solver", "dp\x1b[2J", NULL},
	    (const char *const[]){"help", "check\x1b[2J", NULL},
	    (const char *const[]){"\x1b[2J", NULL},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		kt_run r = kt_kilnc(cases[i], NULL);
		cr_assert_eq(r.status, 2, "case %zu: %s", i, r.err);
		cr_assert_not_null(strstr(r.err, "\\x1b[2J"), "case %zu: %s", i, r.err);
		cr_assert_null(memchr(r.err, 0x1b, r.err_len), "case %zu: a raw ESC: %s", i, r.err);
		cr_assert_null(strstr(r.err, "\\\\x1b"), "case %zu: escaped twice: %s", i, r.err);
		kt_run_free(&r);
	}
}
