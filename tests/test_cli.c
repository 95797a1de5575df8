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
