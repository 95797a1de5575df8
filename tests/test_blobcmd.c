/* tests/test_blobcmd.c: `kilnc compile -o`, `kilnc inspect` and `kilnc
 * select` (tools/blobcmd.c, tools/kilnc.c), run as a user would. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "kiln/blob.h"
#include "kiln/runtime.h"
#include "kiln_test.h"
#include "runtime/internal.h"

static char *read_all(const char *path, size_t *out_len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	buf[n] = '\0';
	*out_len = (size_t)n;
	return buf;
}

/* A fresh path in the temporary directory (the file does not exist). */
static char *fresh_path(const char *suffix)
{
	char *p = kt_temp_file(suffix, "", 0);
	unlink(p);
	return p;
}

static char *compile_tiny(void)
{
	char *out = fresh_path(".kiln");
	kt_run r = kt_kilnc(
	    (const char *const[]){"compile", kt_src("examples/models/tiny.yaml"), "-o", out, NULL},
	    NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	return out;
}

Test(blobcmd, compile_writes_the_same_blob_twice)
{
	char *a = compile_tiny(), *b = compile_tiny();
	size_t na, nb;
	char *x = read_all(a, &na), *y = read_all(b, &nb);
	cr_assert_not_null(x);
	cr_assert_eq(na, nb);
	cr_assert_eq(memcmp(x, y, na), 0, "the same model gives the same bytes");
	cr_assert_eq(memcmp(x, "KILNPLAN", 8), 0);
	/* And the runtime opens the file directly (mmap). */
	kiln_rt *rt = NULL;
	cr_assert_eq(kiln_rt_open_file(a, &rt), 0);
	kiln_rt_close(rt);
	unlink(a);
	unlink(b);
	free(a);
	free(b);
	free(x);
	free(y);
}

Test(blobcmd, compile_refuses_bad_output_and_leaves_no_file)
{
	/* -o without a name is a usage error. */
	kt_run r = kt_kilnc((const char *const[]){"compile", kt_src("examples/models/tiny.yaml"),
	                                          "-o", NULL},
	                    NULL);
	cr_assert_eq(r.status, 2, "%s", r.err);
	kt_run_free(&r);
	/* A directory that does not exist: exit 1, nothing written. */
	r = kt_kilnc((const char *const[]){"compile", kt_src("examples/models/tiny.yaml"), "-o",
	                                   "/nonexistent-dir/plan.kiln", NULL},
	             NULL);
	cr_assert_eq(r.status, 1, "%s", r.err);
	cr_assert_not_null(strstr(r.err, "plan.kiln"), "%s", r.err);
	kt_run_free(&r);
	/* The blob and a view on one file. */
	char *p = fresh_path(".kiln");
	r = kt_kilnc((const char *const[]){"compile", kt_src("examples/models/tiny.yaml"), "-o", p,
	                                   "--emit-svg", p, NULL},
	             NULL);
	cr_assert_eq(r.status, 2, "%s", r.err);
	cr_assert_neq(access(p, F_OK), 0);
	kt_run_free(&r);
	free(p);
}

/* Exit 3 writes the views but not the blob: a plan that cannot take the
 * load it promises must not reach a trainer. */
Test(blobcmd, infeasible_model_writes_no_blob)
{
	FILE *f = fopen(kt_src("examples/models/tiny.yaml"), "r");
	char text[8192];
	size_t len = fread(text, 1, sizeof text - 1, f);
	fclose(f);
	text[len] = '\0';
	char *at = strstr(text, "memory_gib:");
	char *eol = strchr(at, '\n');
	char out[8400];
	/* 5 MiB (tests/test_plan.c: not even load 1 fits). */
	snprintf(out, sizeof out, "%.*smemory_gib: 0.0048828125%s", (int)(at - text), text, eol);
	char *model = kt_temp_file(".yaml", out, strlen(out));
	char *blob = fresh_path(".kiln"), *svg = fresh_path(".svg");
	kt_run r = kt_kilnc((const char *const[]){"compile", model, "-o", blob, "--emit-svg", svg,
	                                          NULL},
	                    NULL);
	cr_assert_eq(r.status, 3, "%s", r.err);
	cr_assert_neq(access(blob, F_OK), 0, "no blob on exit 3");
	cr_assert_eq(access(svg, F_OK), 0, "views are written on exit 3");
	kt_run_free(&r);
	unlink(svg);
	unlink(model);
	free(svg);
	free(blob);
	free(model);
}

Test(blobcmd, inspect_text_and_json)
{
	char *p = compile_tiny();
	kt_run r = kt_kilnc((const char *const[]){"inspect", p, NULL}, NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "kiln plan blob 1.2"), "%s", r.out);
	cr_assert_not_null(strstr(r.out, "model tiny"), "%s", r.out);
	cr_assert_not_null(strstr(r.out, "moe.expert_up"), "%s", r.out);
	cr_assert_not_null(strstr(r.out, "TEMPLATES"), "%s", r.out);
	kt_run_free(&r);

	r = kt_kilnc((const char *const[]){"inspect", p, "--json", "--templates", NULL}, NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kiln_json *doc = kiln_json_parse(r.out, r.out_len);
	cr_assert_not_null(doc, "inspect --json is one JSON document");
	cr_assert_eq(kiln_json_number(kiln_json_get(kiln_json_get(doc, "blob"), "major")), 1);
	cr_assert_str_eq(kiln_json_string(kiln_json_get(kiln_json_get(doc, "model"), "name")),
	                 "tiny");
	const kiln_json *stages = kiln_json_get(doc, "stages");
	cr_assert_eq(kiln_json_size(stages), 2, "tiny has pp = 2");
	/* tiny: 8 layers, 4 per stage (examples/models/tiny.yaml). */
	cr_assert_eq(kiln_json_size(kiln_json_get(kiln_json_at(stages, 0), "layers")), 4);
	const kiln_json *kinds = kiln_json_get(doc, "layer_kinds");
	cr_assert_geq(kiln_json_size(kinds), 2);
	const kiln_json *tables = kiln_json_get(kiln_json_at(kinds, 0), "tables");
	cr_assert_eq(kiln_json_size(tables), 30, "30 load buckets up to 3x");
	cr_assert_gt(kiln_json_size(kiln_json_get(doc, "template_list")), 0);
	kiln_json_free(doc);
	kt_run_free(&r);
	unlink(p);
	free(p);
}

Test(blobcmd, bad_blobs_exit_1_with_the_reason)
{
	char *p = compile_tiny();
	size_t len;
	char *bytes = read_all(p, &len);
	struct {
		const char *what;
		size_t len;
		int flip;
		const char *msg;
	} cases[] = {
	    {"truncated", 1000, -1, "truncated"},
	    {"checksum", 0, 5000, "checksum"},
	    {"magic", 0, 0, "bad magic"},
	    /* An empty file starts like a blob (with nothing): truncated, what an
	     * interrupted write leaves (blob-format.md). */
	    {"empty", 0, -2, "truncated"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		size_t n = cases[i].len ? cases[i].len : len;
		if (cases[i].flip == -2)
			n = 0;
		char *copy = malloc(len);
		memcpy(copy, bytes, len);
		if (cases[i].flip >= 0)
			copy[cases[i].flip] ^= 0x40;
		char *bad = kt_temp_file(".kiln", copy, n);
		kt_run r = kt_kilnc((const char *const[]){"inspect", bad, NULL}, NULL);
		cr_assert_eq(r.status, 1, "%s: %s", cases[i].what, r.err);
		cr_assert_not_null(strstr(r.err, cases[i].msg), "%s: %s", cases[i].what, r.err);
		cr_assert_eq(r.out_len, 0);
		kt_run_free(&r);
		r = kt_kilnc((const char *const[]){"select", bad, "--stage", "0", "--layer", "0",
		                                   "--rows", "0", "--free", "1G", NULL},
		             NULL);
		cr_assert_eq(r.status, 1, "%s: %s", cases[i].what, r.err);
		kt_run_free(&r);
		unlink(bad);
		free(bad);
		free(copy);
	}
	/* Not a regular file; a missing file. */
	kt_run r = kt_kilnc((const char *const[]){"inspect", "/tmp", NULL}, NULL);
	cr_assert_eq(r.status, 1);
	kt_run_free(&r);
	r = kt_kilnc((const char *const[]){"inspect", "/nonexistent.kiln", NULL}, NULL);
	cr_assert_eq(r.status, 1);
	kt_run_free(&r);
	unlink(p);
	free(p);
	free(bytes);
}

/* select from the command line agrees with the library. */
Test(blobcmd, select_matches_the_runtime)
{
	char *p = compile_tiny();
	kiln_rt *rt = NULL;
	cr_assert_eq(kiln_rt_open_file(p, &rt), 0);
	kiln_rt_layer_info li;
	cr_assert_eq(kiln_rt_layer_get(rt, 5, &li), 0);
	cr_assert(li.moe, "tiny's layer 5 is an MoE layer");
	/* A spike of 2.5x with 3 MiB free, and the calm case with 8 MiB. */
	const char *frees[] = {"3MiB", "8M"};
	const uint64_t free_bytes[] = {3u << 20, 8u << 20};
	for (int k = 0; k < 2; k++) {
		char stage[16];
		snprintf(stage, sizeof stage, "%d", li.stage);
		kt_run r = kt_kilnc((const char *const[]){"select", p, "--stage", stage, "--layer", "5",
		                                          "--load-factor", k ? "1" : "2.5", "--free",
		                                          frees[k], "--json", NULL},
		                    NULL);
		cr_assert_eq(r.status, 0, "%s", r.err);
		kiln_json *doc = kiln_json_parse(r.out, r.out_len);
		cr_assert_not_null(doc);
		kiln_query q = {.stage = li.stage,
		                .layer = 5,
		                .total_rows = (uint64_t)ceil((k ? 1.0 : 2.5) * li.balanced_rows - 1e-9),
		                .free_bytes = free_bytes[k]};
		kiln_plan want;
		cr_assert_eq(kiln_rt_select(rt, &q, &want), 0);
		cr_assert_eq(kiln_json_number(kiln_json_get(doc, "plan")), want.plan);
		cr_assert_eq(kiln_json_number(kiln_json_get(doc, "rows")), (double)q.total_rows);
		cr_assert_eq(kiln_json_number(kiln_json_get(doc, "avail_bytes")),
		             (double)want.avail_bytes);
		const kiln_json *units = kiln_json_get(doc, "units");
		cr_assert_eq(kiln_json_size(units), want.n_units);
		static const char *names[] = {"keep", "recompute", "offload"};
		for (int32_t u = 0; u < want.n_units; u++)
			cr_assert_str_eq(kiln_json_string(kiln_json_get(kiln_json_at(units, u), "action")),
			                 names[want.actions[u]]);
		kiln_json_free(doc);
		kt_run_free(&r);
	}
	/* Text output names the units and the decision. */
	kt_run r = kt_kilnc((const char *const[]){"select", p, "--stage", "1", "--layer", "5",
	                                          "--tokens", "100,200,0,3", "--free", "2MiB", NULL},
	                    NULL);
	if (li.stage == 1) {
		cr_assert_eq(r.status, 0, "%s", r.err);
		cr_assert_not_null(strstr(r.out, "303 rows"), "%s", r.out);
		cr_assert_not_null(strstr(r.out, "moe.expert_up"), "%s", r.out);
	}
	kt_run_free(&r);
	kiln_rt_close(rt);
	unlink(p);
	free(p);
}

Test(blobcmd, select_usage_errors_exit_2)
{
	char *p = compile_tiny();
	const char *const cases[][12] = {
	    {"select", NULL},
	    {"select", "PLAN", "--stage", "0", "--layer", "0", "--free", "1G", NULL},
	    {"select", "PLAN", "--stage", "0", "--layer", "0", "--rows", "1", "--load-factor", "1",
	     "--free", NULL},
	    {"select", "PLAN", "--stage", "x", "--layer", "0", "--rows", "1", "--free", "1G", NULL},
	    {"select", "PLAN", "--stage", "0", "--layer", "0", "--rows", "1", "--free", "1Q", NULL},
	    {"select", "PLAN", "--stage", "0", "--layer", "0", "--tokens", "1,,2", "--free", "1G",
	     NULL},
	    {"select", "PLAN", "--stage", "0", "--layer", "0", "--load-factor", "-1", "--free", "1G",
	     NULL},
	    {"select", "PLAN", "--stage", "7", "--layer", "0", "--rows", "1", "--free", "1G", NULL},
	    {"select", "PLAN", "--stage", "1", "--layer", "0", "--rows", "1", "--free", "1G", NULL},
	    {"select", "PLAN", "--stage", "0", "--layer", "99", "--rows", "1", "--free", "1G", NULL},
	    {"select", "PLAN", "--stage", "0", "--layer", "0", "--rows", "1", "--free", "1G",
	     "--bogus"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *args[13] = {0};
		for (int k = 0; k < 12 && cases[i][k]; k++)
			args[k] = strcmp(cases[i][k], "PLAN") == 0 ? p : cases[i][k];
		kt_run r = kt_kilnc(args, NULL);
		cr_assert_eq(r.status, 2, "case %zu: status %d: %s", i, r.status, r.err);
		cr_assert_gt(r.err_len, 0, "case %zu explains itself", i);
		cr_assert_eq(r.out_len, 0);
		kt_run_free(&r);
	}
	kt_run r = kt_kilnc((const char *const[]){"help", "select", NULL}, NULL);
	cr_assert_eq(r.status, 0);
	cr_assert_not_null(strstr(r.out, "--load-factor"));
	kt_run_free(&r);
	unlink(p);
	free(p);
}

/* --free of KILN_RT_FREE_FROM_ACCOUNTING (2^64 - 1) says what that value
 * means and why the command line refuses it. */
Test(blobcmd, free_of_the_accounting_sentinel_is_explained)
{
	char *p = compile_tiny();
	const char *frees[] = {"18446744073709551615", "18446744073709551615B"};
	for (int k = 0; k < 2; k++) {
		kt_run r =
		    kt_kilnc((const char *const[]){"select", p, "--stage", "0", "--layer", "1",
		                                   "--rows", "1", "--free", frees[k], NULL},
		             NULL);
		cr_assert_eq(r.status, 2, "%s", r.err);
		cr_assert_not_null(strstr(r.err, "--free: 18446744073709551615 is "
		                                 "KILN_RT_FREE_FROM_ACCOUNTING"),
		                   "%s", r.err);
		cr_assert_not_null(strstr(r.err, "at most 18446744073709551614"), "%s", r.err);
		cr_assert_eq(r.out_len, 0);
		kt_run_free(&r);
	}
	/* One byte less is a byte count like any other. */
	kt_run r =
	    kt_kilnc((const char *const[]){"select", p, "--stage", "0", "--layer", "1", "--rows",
	                                   "1", "--free", "18446744073709551614", NULL},
	             NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	/* Past 2^64 - 1 (2^34 G = 2^64 bytes): the range. */
	r = kt_kilnc((const char *const[]){"select", p, "--stage", "0", "--layer", "1", "--rows",
	                                   "1", "--free", "17179869184G", NULL},
	             NULL);
	cr_assert_eq(r.status, 2, "%s", r.err);
	cr_assert_not_null(strstr(r.err, "--free: must be a byte count from 0 to "
	                                 "18446744073709551615"),
	                   "%s", r.err);
	kt_run_free(&r);
	unlink(p);
	free(p);
}

/* A plan file that cannot be read is "kilnc: error: PLAN: REASON" from
 * every command that reads one (docs/cli.md, exit status 1). */
Test(blobcmd, unreadable_plans_use_the_plan_reason_form)
{
	const char *missing = "/nonexistent/kiln/plan.kiln";
	const char *model = kt_src("examples/models/tiny.yaml");
	const char *const *cmds[] = {
	    (const char *const[]){"inspect", missing, NULL},
	    (const char *const[]){"inspect", missing, "--json", NULL},
	    (const char *const[]){"select", missing, "--stage", "0", "--layer", "1", "--rows", "1",
	                          "--free", "1G", NULL},
	    (const char *const[]){"simulate", model, "--policy", "kiln", "--iters", "1", "--plan",
	                          missing, NULL},
	};
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		kt_run r = kt_kilnc(cmds[i], NULL);
		cr_assert_eq(r.status, 1, "%s: %s", cmds[i][0], r.err);
		cr_assert_str_eq(
		    r.err,
		    "kilnc: error: /nonexistent/kiln/plan.kiln: cannot open: No such file "
		    "or directory\n",
		    "%s", cmds[i][0]);
		cr_assert_eq(r.out_len, 0);
		kt_run_free(&r);
	}
	/* A directory: the same form. */
	kt_run r = kt_kilnc((const char *const[]){"inspect", "/tmp", NULL}, NULL);
	cr_assert_str_eq(r.err, "kilnc: error: /tmp: not a regular file\n");
	kt_run_free(&r);
}

static void fix_crc(unsigned char *b, size_t len)
{
	const size_t at = offsetof(kiln_blob_header, crc32c);
	uint32_t crc = kiln_rti_crc32c(0, b, at);
	crc = kiln_rti_crc32c(crc, b + at + 4, len - at - 4);
	memcpy(b + at, &crc, 4);
}

/* A blob of another format version names its version and the ones this
 * kilnc reads (1.0, blob-format.md "Versions"). */
Test(blobcmd, unsupported_version_names_both_versions)
{
	char *p = compile_tiny();
	size_t len;
	char *bytes = read_all(p, &len);
	struct {
		uint16_t major, minor;
		const char *want;
	} cases[] = {{2, 0, "unsupported blob version 2.0; this kilnc reads 1.0 to 1.2"},
	             {1, 3, "unsupported blob version 1.3; this kilnc reads 1.0 to 1.2"},
	             {0, 9, "unsupported blob version 0.9; this kilnc reads 1.0 to 1.2"}};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		memcpy(bytes + offsetof(kiln_blob_header, major), &cases[i].major, 2);
		memcpy(bytes + offsetof(kiln_blob_header, minor), &cases[i].minor, 2);
		fix_crc((unsigned char *)bytes, len);
		char *bad = kt_temp_file(".kiln", bytes, len);
		const char *const *cmds[] = {
		    (const char *const[]){"inspect", bad, NULL},
		    (const char *const[]){"select", bad, "--stage", "0", "--layer", "1", "--rows",
		                          "1", "--free", "1G", NULL},
		    (const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
		                          "--policy", "kiln", "--iters", "1", "--plan", bad, NULL},
		};
		for (size_t k = 0; k < 3; k++) {
			kt_run r = kt_kilnc(cmds[k], NULL);
			cr_assert_eq(r.status, 1, "%s", r.err);
			char want[512];
			snprintf(want, sizeof want, "kilnc: error: %s: %s", bad, cases[i].want);
			cr_assert(strncmp(r.err, want, strlen(want)) == 0, "%s: %s", cmds[k][0],
			          r.err);
			kt_run_free(&r);
		}
		unlink(bad);
		free(bad);
	}
	unlink(p);
	free(p);
	free(bytes);
}

/* Replaces the NUL-terminated string from with to (same length) wherever
 * it stands whole in b's STRINGS, then fixes the CRC: a blob whose names
 * the runtime accepts (it checks offsets, not contents). */
static void replace_string(char *b, size_t len, const char *from, const char *to)
{
	size_t n = strlen(from) + 1;
	cr_assert_eq(strlen(to), strlen(from));
	int found = 0;
	for (size_t i = 1; i + n <= len; i++)
		if (b[i - 1] == '\0' && memcmp(b + i, from, n) == 0) {
			memcpy(b + i, to, n - 1);
			found++;
		}
	cr_assert_eq(found, 1, "'%s' found %d times", from, found);
	fix_crc((unsigned char *)b, len);
}

/* Names in a blob are untrusted: inspect and select print them escaped. */
Test(blobcmd, names_from_the_blob_are_escaped)
{
	char *p = compile_tiny();
	size_t len;
	char *bytes = read_all(p, &len);
	/* ESC ] 0 ; (retitle the terminal) as the model's name; ESC [ 2 J
	 * (clear the screen) and a C1 CSI (U+009B, C2 9B) in unit names. */
	replace_string(bytes, len, "tiny", "\x1b]0;");
	replace_string(bytes, len, "moe.probs", "\x1b[2J.prob");
	replace_string(bytes, len, "moe.expert_up",
	               "\xc2\x9b"
	               "2J.expert_u");
	char *bad = kt_temp_file(".kiln", bytes, len);
	kt_run r = kt_kilnc((const char *const[]){"inspect", bad, NULL}, NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "model \\x1b]0; (hash "), "%.400s", r.out);
	cr_assert_not_null(strstr(r.out, "\\x1b[2J.prob"), "%s", r.out);
	cr_assert_not_null(strstr(r.out, "\\xc2\\x9b2J.expert_u"), "%s", r.out);
	cr_assert_null(memchr(r.out, 0x1b, r.out_len), "a raw ESC on stdout");
	cr_assert_null(strstr(r.out, "\xc2\x9b"), "a raw CSI on stdout");
	kt_run_free(&r);
	r = kt_kilnc((const char *const[]){"inspect", bad, "--templates", NULL}, NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_null(memchr(r.out, 0x1b, r.out_len), "a raw ESC on stdout");
	kt_run_free(&r);
	r = kt_kilnc((const char *const[]){"select", bad, "--stage", "0", "--layer", "1",
	                                   "--load-factor", "1", "--free", "1G", NULL},
	             NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "\\x1b[2J.prob"), "%s", r.out);
	cr_assert_null(memchr(r.out, 0x1b, r.out_len), "a raw ESC on stdout");
	kt_run_free(&r);
	/* An error naming the model escapes it too. */
	r = kt_kilnc((const char *const[]){"select", bad, "--stage", "0", "--layer", "99", "--rows",
	                                   "1", "--free", "1G", NULL},
	             NULL);
	cr_assert_eq(r.status, 2, "%s", r.err);
	cr_assert_not_null(strstr(r.err, "not a planned layer of \\x1b]0;"), "%s", r.err);
	kt_run_free(&r);
	unlink(bad);
	free(bad);
	unlink(p);
	free(p);
	free(bytes);
}

/* n with a comma every three digits, as the docs write figures. */
static const char *commas(uint64_t n, char *buf, size_t cap)
{
	char digits[32];
	int len = snprintf(digits, sizeof digits, "%llu", (unsigned long long)n);
	size_t o = 0;
	for (int i = 0; i < len && o + 2 < cap; i++) {
		if (i > 0 && (len - i) % 3 == 0)
			buf[o++] = ',';
		buf[o++] = digits[i];
	}
	buf[o] = '\0';
	return buf;
}

/* docs/blob-format.md quotes tiny's blob: its first 64 bytes, their
 * file_bytes and CRC, and a row of "Measured sizes". Every figure is
 * checked against the blob compiled now, so the docs cannot go stale
 * unnoticed (they had: 150,976 bytes quoted for a 135,936-byte blob). */
Test(blobcmd, tiny_figures_in_blob_format_md_are_current)
{
	char *p = compile_tiny();
	size_t len;
	char *bytes = read_all(p, &len);
	kiln_rt *rt = NULL;
	cr_assert_eq(kiln_rt_open_file(p, &rt), 0);
	char path[4096];
	snprintf(path, sizeof path, "%s", kt_src("docs/blob-format.md"));
	size_t doc_len;
	char *doc = read_all(path, &doc_len);
	cr_assert_not_null(doc);
	/* The hex dump, as xxd prints it: 16 bytes a line, in pairs. */
	const unsigned char *u = (const unsigned char *)bytes;
	for (int line = 0; line < 4; line++) {
		char want[128];
		int o = snprintf(want, sizeof want, "%08x:", line * 16);
		for (int i = 0; i < 16; i += 2)
			o += snprintf(want + o, sizeof want - (size_t)o, " %02x%02x",
			              u[line * 16 + i], u[line * 16 + i + 1]);
		cr_expect_not_null(strstr(doc, want), "blob-format.md lacks the dump line \"%s\"",
		                   want);
	}
	kiln_blob_header h;
	memcpy(&h, bytes, sizeof h);
	char a[32], want[256];
	snprintf(want, sizeof want,
	         "(`file_bytes` = 0x%" PRIX64 " = %s; 16 sections; CRC32C 0x%08X.)", h.file_bytes,
	         commas(h.file_bytes, a, sizeof a), (unsigned)h.crc32c);
	cr_expect_not_null(strstr(doc, want), "blob-format.md lacks \"%s\"", want);
	/* The row: stages, planned layers, sets, buckets, points stored, plans,
	 * templates, bytes, KiB. */
	kiln_rt_info info;
	kiln_rt_info_get(rt, &info);
	uint64_t count[KILN_SEC_COUNT];
	for (int i = 0; i < KILN_SEC_COUNT; i++) {
		kiln_blob_section s;
		memcpy(&s, bytes + h.table_offset + (size_t)i * sizeof s, sizeof s);
		count[s.id] = s.count;
	}
	char b[32], c[32], d[32], e[32];
	snprintf(want, sizeof want,
	         "| `tiny` | %d | %d | %llu | %d | %s | %s | %s | %s | %.1f KiB |", info.n_stages,
	         info.n_layers, (unsigned long long)count[KILN_SEC_SETS], info.n_buckets,
	         commas(count[KILN_SEC_POINTS], b, sizeof b),
	         commas((uint64_t)kiln_rt_plan_count(rt), c, sizeof c),
	         commas((uint64_t)kiln_rt_template_count(rt), d, sizeof d),
	         commas(len, e, sizeof e), len / 1024.0);
	cr_expect_not_null(strstr(doc, want), "blob-format.md lacks the row \"%s\"", want);
	kiln_rt_close(rt);
	free(doc);
	free(bytes);
	unlink(p);
	free(p);
}
