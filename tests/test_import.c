/* tests/test_import.c: `kilnc import hf` (tools/hfcmd.c) on the shipped
 * Hugging Face configs (examples/hf/) and on broken ones. */
#include <criterion/criterion.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "costmodel/costmodel.h"
#include "frontend/frontend.h"
#include "kiln_test.h"

#define RUN(...) kt_kilnc((const char *const[]){__VA_ARGS__, NULL}, NULL)

/* Imports config with args (NULL-terminated, after the config) into a new
 * temporary YAML file; asserts success. Returns its path (caller frees). */
static char *import_ok(const char *config, const char *const *args)
{
	char *yaml = kt_temp_file(".yaml", "", 0);
	const char *argv[32] = {"import", "hf", config, "-o", yaml};
	int n = 5;
	for (; args && args[n - 5]; n++)
		argv[n] = args[n - 5];
	argv[n] = NULL;
	kt_run r = kt_kilnc(argv, NULL);
	cr_assert_eq(r.status, 0, "import %s: %s", config, r.err);
	kt_run_free(&r);
	return yaml;
}

/* `kilnc report YAML --json`, parsed; caller frees. */
static kiln_json *report_of(const char *yaml)
{
	kt_run r = RUN("report", yaml, "--json");
	cr_assert_eq(r.status, 0, "report %s: %s", yaml, r.err);
	kiln_json *doc = kiln_json_parse(r.out, r.out_len);
	cr_assert_not_null(doc);
	kt_run_free(&r);
	return doc;
}

/* A model card's total, as the card writes it ("671B", "8.03B", "1T"),
 * and the interval it stands for: the larger of 0.5% and half a unit of
 * its last digit (a card that writes "57B" says 56.5B to 57.5B). */
static void card_interval(const char *card, double *lo, double *hi)
{
	char *end;
	double v = strtod(card, &end);
	double unit = *end == 'T' ? 1e12 : 1e9;
	const char *dot = strchr(card, '.');
	double last = dot ? pow(10, -(double)(end - dot - 1)) : 1;
	double half = 0.5 * last * unit, pct = 0.005 * v * unit;
	double tol = half > pct ? half : pct;
	*lo = v * unit - tol;
	*hi = v * unit + tol;
}

/* Every shipped config imports to a description check accepts, with the
 * model card's parameter count. Cards (each model's Hugging Face page):
 * DeepSeek-V3 "671B total parameters" (the main model: its 14B multi-token
 * prediction module is apart, as kiln counts); Kimi K2 "1T" (counted from
 * its config by hand: 60 MoE layers x (384 + 1) x 3 x 7168 x 2048 plus the
 * router 7168 x 384 = 1017.4B, one dense FFN 3 x 7168 x 18432 = 0.40B,
 * MLA 101.0M x 61 = 6.16B, embedding and head 2 x 163840 x 7168 = 2.35B:
 * 1.026T; the technical report's headline 1.04T does not follow from the
 * config, docs/cost-model.md); Qwen3-235B-A22B "235B"; Mixtral-8x22B
 * "141B"; Llama 3 8B "8.03B"; gpt-oss-120b "117B"; Qwen2-57B-A14B "57B". */
Test(import, every_shipped_config_imports_with_its_card_count)
{
	static const struct {
		const char *file, *card;
	} cases[] = {
	    {"deepseek-v3-671b", "671B"}, {"kimi-k2-1t", "1T"},         {"qwen3-235b-a22b", "235B"},
	    {"mixtral-8x22b", "141B"},    {"llama3-8b-dense", "8.03B"}, {"gpt-oss-120b", "117B"},
	    {"qwen2-57b-a14b", "57B"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char rel[128];
		snprintf(rel, sizeof rel, "examples/hf/%s.json", cases[i].file);
		const char *args[] = {"--devices", "512", "--pp", "4", "--tp", "2", NULL};
		char *yaml = import_ok(kt_src(rel), args);
		kt_run r = RUN("check", yaml);
		cr_assert_eq(r.status, 0, "%s: %s", cases[i].file, r.err);
		/* The default name is the file's. */
		cr_assert(strncmp(r.out, cases[i].file, strlen(cases[i].file)) == 0, "%s", r.out);
		kt_run_free(&r);
		kiln_json *doc = report_of(yaml);
		double total =
		    kiln_json_number(kiln_json_get(kiln_json_get(doc, "params"), "total"));
		double lo, hi;
		card_interval(cases[i].card, &lo, &hi);
		cr_expect(total >= lo && total <= hi, "%s: %.4g parameters, the card says %s",
		          cases[i].file, total, cases[i].card);
		kiln_json_free(doc);
		unlink(yaml);
		free(yaml);
	}
}

/* Removes the line of the "path" key from a report's JSON text. */
static void drop_path(char *text)
{
	char *p = strstr(text, "\n\t\"path\":");
	cr_assert_not_null(p, "no path in %s", text);
	char *e = strchr(p + 1, '\n');
	cr_assert_not_null(e);
	memmove(p, e, strlen(e) + 1);
}

/* Where an import and a hand-written example describe the same run (same
 * layout, batch, sequence length and hardware), their reports are the
 * same, key for key, but for the file path. */
Test(import, reports_equal_the_hand_written_examples)
{
	static const struct {
		const char *name;
		const char *args[20];
	} cases[] = {
	    {"deepseek-v3-671b",
	     {"--devices", "4096", "--pp", "16", "--ep", "64", "--global-batch", "15360",
	      "--hardware", "bw1000", NULL}},
	    {"kimi-k2-1t",
	     {"--devices", "12288", "--pp", "16", "--ep", "96", "--global-batch", "16128",
	      "--hardware", "bw1000", NULL}},
	    {"qwen3-235b-a22b",
	     {"--devices", "1024", "--tp", "4", "--pp", "8", "--ep", "32", "--global-batch", "1024",
	      "--hardware", "bw1000", NULL}},
	    {"mixtral-8x22b",
	     {"--devices", "1024", "--tp", "4", "--pp", "4", "--vpp", "2", "--ep", "8",
	      "--global-batch", "512", NULL}},
	    {"llama3-8b-dense",
	     {"--devices", "64", "--tp", "2", "--pp", "4", "--global-batch", "128", "--seq-len",
	      "8192", "--hardware", KILN_SOURCE_DIR "/examples/hardware/h100-sxm.yaml", NULL}},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char rel[128], model[128];
		snprintf(rel, sizeof rel, "examples/hf/%s.json", cases[i].name);
		char *yaml = import_ok(kt_src(rel), cases[i].args);
		kt_run ra = RUN("report", yaml, "--json");
		snprintf(model, sizeof model, "examples/models/%s.yaml", cases[i].name);
		kt_run rb = RUN("report", kt_src(model), "--json");
		cr_assert(ra.status == 0 && rb.status == 0, "%s %s", ra.err, rb.err);
		drop_path(ra.out);
		drop_path(rb.out);
		cr_expect_str_eq(ra.out, rb.out, "%s: the imported report differs", cases[i].name);
		kt_run_free(&ra);
		kt_run_free(&rb);
		unlink(yaml);
		free(yaml);
	}
}

/* Runs `kilnc import hf` on text with args; expects status and want in
 * stderr. */
static void import_fails(const char *text, const char *const *args, int status, const char *want)
{
	char *cfg = kt_temp_file(".json", text, strlen(text));
	const char *argv[32] = {"import", "hf", cfg};
	int n = 3;
	for (; args && args[n - 3]; n++)
		argv[n] = args[n - 3];
	argv[n] = NULL;
	kt_run r = kt_kilnc(argv, NULL);
	cr_expect_eq(r.status, status, "%s: status %d: %s", want, r.status, r.err);
	cr_expect_not_null(strstr(r.err, want), "want '%s' in: %s", want, r.err);
	cr_expect_eq(r.out_len, 0, "wrote to stdout: %s", r.out);
	kt_run_free(&r);
	unlink(cfg);
	free(cfg);
}

static const char *const DEV8[] = {"--devices", "8", NULL};

Test(import, bad_configs_name_what_is_wrong)
{
	/* Every missing required field of the family, at once. */
	static const char qwen[] = "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64}";
	import_fails(qwen, DEV8, 1, "missing required field 'num_hidden_layers'");
	import_fails(qwen, DEV8, 1, "missing required field 'num_attention_heads'");
	import_fails(qwen, DEV8, 1, "missing required field 'vocab_size'");
	import_fails(qwen, DEV8, 1, "missing required field 'num_experts'");
	import_fails(qwen, DEV8, 1, "missing required field 'moe_intermediate_size'");
	import_fails("{\"model_type\": \"bert\"}", DEV8, 1,
	             "model_type 'bert' is not a family kiln knows; kiln imports deepseek_v2");
	import_fails("{\"hidden_size\": 1}", DEV8, 1, "no model_type");
	import_fails("[1, 2]", DEV8, 1, "not an object");
	import_fails("{\"model_type\": \"llama\",", DEV8, 1,
	             ":1:24: error: unexpected end of input");
	static const char frac[] =
	    "{\"model_type\": \"llama\", \"hidden_size\": 64.5, \"num_hidden_layers\": 2, "
	    "\"num_attention_heads\": 4, \"vocab_size\": 100, \"intermediate_size\": \"big\"}";
	import_fails(frac, DEV8, 1, "field 'hidden_size' is 64.5, not a positive integer");
	import_fails(frac, DEV8, 1,
	             "field 'intermediate_size' is a string, expected a positive integer");
	static const char gelu[] =
	    "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
	    "\"num_attention_heads\": 4, \"vocab_size\": 100, \"intermediate_size\": 128, "
	    "\"hidden_act\": \"gelu\"}";
	import_fails(gelu, DEV8, 1, "field 'hidden_act' is 'gelu'");
	/* Layer patterns kiln cannot describe. */
	static const char sparse[] =
	    "{\"model_type\": \"qwen2_moe\", \"hidden_size\": 64, \"num_hidden_layers\": 4, "
	    "\"num_attention_heads\": 4, \"vocab_size\": 100, \"num_experts\": 8, "
	    "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"intermediate_size\": "
	    "128, "
	    "\"mlp_only_layers\": [1], \"shared_expert_intermediate_size\": 48}";
	import_fails(sparse, DEV8, 1, "'mlp_only_layers' lists dense layers other than the first");
	import_fails(sparse, DEV8, 1, "shared_expert_intermediate_size' is 48, not a multiple");
}

Test(import, bad_arguments_are_usage_errors)
{
	const char *cfg = kt_src("examples/hf/mixtral-8x22b.json");
	const char *const *cases[] = {
	    (const char *const[]){"import", NULL},
	    (const char *const[]){"import", "gguf", "x", NULL},
	    (const char *const[]){"import", "hf", NULL},
	    (const char *const[]){"import", "hf", "CFG", NULL}, /* no --devices */
	    (const char *const[]){"import", "hf", "CFG", "--devices", "0", NULL},
	    (const char *const[]){"import", "hf", "CFG", "--devices", "8", "--devices", "8", NULL},
	    (const char *const[]){"import", "hf", "CFG", "--devices", "100", "--pp", "8", NULL},
	    (const char *const[]){"import", "hf", "CFG", "--devices", "64", "--ep", "3", NULL},
	    (const char *const[]){"import", "hf", "CFG", "--devices", "8", "--global-batch", "3",
	                          "--micro-batch", "2", NULL},
	    (const char *const[]){"import", "hf", "CFG", "--devices", "8", "--bogus", NULL},
	    (const char *const[]){"import", "hf", "CFG", "--devices", "8", "-o", "CFG", NULL},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		const char *argv[16];
		size_t n = 0;
		for (; cases[i][n]; n++)
			argv[n] = strcmp(cases[i][n], "CFG") == 0 ? cfg : cases[i][n];
		argv[n] = NULL;
		kt_run r = kt_kilnc(argv, NULL);
		cr_expect_eq(r.status, 2, "case %zu: status %d: %s", i, r.status, r.err);
		cr_expect_gt(r.err_len, 0, "case %zu: no message", i);
		kt_run_free(&r);
	}
	kt_run r = RUN("import", "hf", cfg, "--devices", "100", "--pp", "8");
	cr_expect_not_null(strstr(r.err, "--devices 100 is not a multiple of tp x pp = 1 x 8"),
	                   "%s", r.err);
	kt_run_free(&r);
	/* A layout the description cannot take: the frontend's error, exit 1. */
	r = RUN("import", "hf", cfg, "--devices", "8", "--pp", "8", "--vpp", "8");
	cr_expect_eq(r.status, 1, "%s", r.err);
	cr_expect_not_null(strstr(r.err, "(imported)"), "%s", r.err);
	kt_run_free(&r);
	r = RUN("help", "import");
	cr_expect_eq(r.status, 0);
	cr_expect_not_null(strstr(r.out, "usage: kilnc import hf CONFIG.json --devices N"));
	kt_run_free(&r);
}

/* Unknown fields are ignored; a config wrapping its language model in
 * text_config (Kimi K2.5's) is read there; the defaults are the documented
 * ones (ep: the largest divisor of the experts dividing tp x dp, at most
 * 64; 4 x pp micro-batches; seq_len min(4096, max_position_embeddings)). */
Test(import, wrapped_configs_unknown_fields_and_defaults)
{
	static const char text[] =
	    "{\"model_type\": \"kimi_k25\", \"vision_config\": {\"depth\": 27},\n"
	    " \"text_config\": {\"model_type\": \"mixtral\", \"hidden_size\": 64, "
	    "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
	    "\"vocab_size\": 256, \"num_local_experts\": 8, \"num_experts_per_tok\": 2, "
	    "\"intermediate_size\": 128, \"max_position_embeddings\": 1024, "
	    "\"some_future_field\": [1, {\"x\": null}]}}";
	char *cfg = kt_temp_file(".json", text, strlen(text));
	kt_run r = RUN("import", "hf", cfg, "--devices", "32", "--pp", "2");
	cr_assert_eq(r.status, 0, "%s", r.err);
	/* dp = 16: ep = gcd(8, 16) = 8; global batch = 16 x 1 x 4 x 2 = 128. */
	cr_expect_not_null(strstr(r.out, "\n  ep: 8\n"), "%s", r.out);
	cr_expect_not_null(strstr(r.out, "\n  global_batch: 128\n"), "%s", r.out);
	cr_expect_not_null(strstr(r.out, "\n  seq_len: 1024\n"), "%s", r.out);
	cr_expect_not_null(strstr(r.out, "\n  kv_heads: 2\n  head_dim: 16\n"), "%s", r.out);
	kt_run_free(&r);
	unlink(cfg);
	free(cfg);
}

/* gpt-oss's clamped quick GeGLU and its biases (Megatron-Bridge's
 * gpt_oss_bridge.py: gated_linear_unit, quick_gelu, add_bias_linear) are
 * stated; a Mixtral import keeps swiglu without biases. The model's FLOPs
 * follow: the import of gpt-oss-120b at seq 4096 counts 27.16 GFLOP/token
 * (tests/test_flops.c's hand calculation). */
Test(import, gpt_oss_states_quick_geglu_and_biases)
{
	const char *args[] = {"--devices", "64",        "--pp", "4", "--ep",
	                      "8",         "--seq-len", "4096", NULL};
	char *yaml = import_ok(kt_src("examples/hf/gpt-oss-120b.json"), args);
	kiln_arena *a = kiln_arena_new();
	kiln_model *m;
	cr_assert_eq(kiln_frontend_load_file(yaml, a, stderr, &m), KILN_FRONTEND_OK);
	cr_expect_eq(m->moe_activation_fn, KILN_ACTFN_QUICK_GEGLU);
	cr_expect(m->linear_bias);
	cr_expect(fabs(kiln_cost_model_flops_per_token(m) / 27164491776.0 - 1) < 1e-9, "%g",
	          kiln_cost_model_flops_per_token(m));
	kiln_arena_free(a);
	unlink(yaml);
	free(yaml);
	yaml = import_ok(kt_src("examples/hf/mixtral-8x22b.json"), args);
	a = kiln_arena_new();
	cr_assert_eq(kiln_frontend_load_file(yaml, a, stderr, &m), KILN_FRONTEND_OK);
	cr_expect_eq(m->moe_activation_fn, KILN_ACTFN_SWIGLU);
	cr_expect_not(m->linear_bias);
	kiln_arena_free(a);
	unlink(yaml);
	free(yaml);
}

/* Reads the whole file at path (caller frees); *len its bytes. */
static char *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	char *buf = NULL;
	size_t cap = 0;
	FILE *m = open_memstream(&buf, &cap);
	int c;
	while ((c = fgetc(f)) != EOF)
		fputc(c, m);
	fclose(f);
	fclose(m);
	*len = cap;
	return buf;
}

/* The hardware profile file is an input (docs/cli.md, "Output files"): -o
 * naming it, by its name, a symlink or a hard link, or standard output
 * appended to it, is a usage error, and the profile stays byte for byte
 * as it was. */
Test(import, output_may_not_be_the_hardware_profile)
{
	size_t want_len;
	char *want = slurp(kt_src("examples/hardware/h200.yaml"), &want_len);
	char *prof = kt_temp_file(".yaml", want, want_len);
	char sym[4200], hard[4200];
	snprintf(sym, sizeof sym, "%s.link.yaml", prof);
	snprintf(hard, sizeof hard, "%s.hard.yaml", prof);
	cr_assert_eq(symlink(prof, sym), 0);
	cr_assert_eq(link(prof, hard), 0);
	const char *cfg = kt_src("examples/hf/mixtral-8x22b.json");
	const char *outs[] = {prof, sym, hard};
	for (size_t i = 0; i < 3; i++) {
		kt_run r =
		    RUN("import", "hf", cfg, "--devices", "8", "--hardware", prof, "-o", outs[i]);
		cr_expect_eq(r.status, 2, "-o %s: status %d: %s", outs[i], r.status, r.err);
		cr_expect_not_null(strstr(r.err, "is the input hardware profile"), "%s", r.err);
		kt_run_free(&r);
	}
	char *msg = NULL;
	int st = kt_sh(&msg, "{ '%s' import hf '%s' --devices 8 --hardware '%s' >> '%s'; }",
	               KILN_KILNC, cfg, prof, prof);
	cr_expect_eq(st, 2, "stdout appended to the profile: status %d: %s", st, msg);
	free(msg);
	size_t got_len;
	char *got = slurp(prof, &got_len);
	cr_expect(got_len == want_len && memcmp(got, want, want_len) == 0,
	          "the profile changed (%zu bytes, was %zu): %s", got_len, want_len, got);
	free(got);
	free(want);
	unlink(sym);
	unlink(hard);
	unlink(prof);
	free(prof);
}

/* A profile path is written as a quoted YAML scalar: " #" (a comment),
 * ": " (a mapping), quotes and a backslash in it reach the frontend as
 * they are, so the description names that very file (h200, not the
 * default h100-sxm) and `kilnc check` accepts it. */
Test(import, hardware_path_is_quoted_yaml)
{
	char *dir = kt_temp_file(".d", "", 0);
	unlink(dir);
	cr_assert_eq(mkdir(dir, 0700), 0);
	char sub[4200], prof[4300];
	snprintf(sub, sizeof sub, "%s/a #b: c \"d' e\\f", dir);
	cr_assert_eq(mkdir(sub, 0700), 0);
	snprintf(prof, sizeof prof, "%s/p #x: y.yaml", sub);
	size_t len;
	char *h200 = slurp(kt_src("examples/hardware/h200.yaml"), &len);
	FILE *f = fopen(prof, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(h200, 1, len, f), len);
	fclose(f);
	const char *args[] = {"--devices", "8", "--hardware", prof, NULL};
	char *yaml = import_ok(kt_src("examples/hf/mixtral-8x22b.json"), args);
	kt_run r = RUN("check", yaml);
	cr_expect_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	kiln_arena *a = kiln_arena_new();
	kiln_model *m;
	cr_assert_eq(kiln_frontend_load_file(yaml, a, stderr, &m), KILN_FRONTEND_OK);
	cr_expect_str_eq(m->hw.name, "h200");
	char *real = realpath(prof, NULL);
	cr_assert_not_null(real);
	cr_expect_str_eq(m->hw.source, real);
	free(real);
	kiln_arena_free(a);
	unlink(yaml);
	free(yaml);
	unlink(prof);
	rmdir(sub);
	rmdir(dir);
	free(dir);
	free(h200);
}

/* A config that is not strict JSON is refused at the line and column of
 * its first problem, with the reason: what JSON parsers read differently
 * (leading zeros, trailing content, duplicate keys, NUL) included, so no
 * config imports to other shapes than Python's json reads. */
Test(import, json_errors_have_a_position_and_a_reason)
{
	static const struct {
		const char *text;
		size_t len; /* 0: strlen */
		const char *want;
	} cases[] = {
	    {"{\"model_type\": \"llama\",", 0,
	     ":1:24: error: unexpected end of input in an object"},
	    {"{\n \"a\": 1,\n \"b\": NaN}", 0, ":3:7: error: NaN is not a JSON number"},
	    {"{\"a\": -Infinity}", 0, ":1:7: error: Infinity is not a JSON number"},
	    {"{\"hidden_size\": 02048}", 0, ":1:17: error: a number with a leading zero"},
	    {"{\"a\": 1}\n\n  {}", 0, ":3:3: error: trailing content after the JSON value"},
	    {"\0{}", 3, ":1:1: error: a NUL byte"},
	    {"{\"a\": \"x\0y\"}", 12, ":1:9: error: a NUL byte in a string"},
	    {"{\"model_type\": \"lla\\u0000ma\"}", 0, ":1:20: error: \\u0000 (a NUL character)"},
	    {"{\"a\": 1, \"b\": {\"c\": 1, \"c\": 2}, \"a\": 3}", 0,
	     ":1:24: error: duplicate key 'c' in an object"},
	    {"{\"hidden_size\": 64, \"hidden_size\": 128}", 0,
	     ":1:21: error: duplicate key 'hidden_size'"},
	    {"{\"a\": [1,]}", 0, ":1:10: error: a comma before the closing bracket"},
	    {"{\"a\": \"\\uD800\"}", 0, ":1:8: error: a lone UTF-16 high surrogate"},
	    {"{\"a\": \"\xc3\xa9\", \"b\": tru}", 0, ":1:17: error: an unquoted word"},
	    {"", 0, ":1:1: error: no JSON value"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		size_t n = cases[i].len ? cases[i].len : strlen(cases[i].text);
		char *cfg = kt_temp_file(".json", cases[i].text, n);
		kt_run r = RUN("import", "hf", cfg, "--devices", "8");
		cr_expect_eq(r.status, 1, "case %zu: status %d: %s", i, r.status, r.err);
		char want[512];
		snprintf(want, sizeof want, "%s%s", cfg, cases[i].want);
		cr_expect_not_null(strstr(r.err, want), "case %zu: want '%s' in: %s", i, want,
		                   r.err);
		cr_expect_eq(r.out_len, 0, "case %zu: wrote %s", i, r.out);
		kt_run_free(&r);
		unlink(cfg);
		free(cfg);
	}
	import_fails("[1, 2]", DEV8, 1, "the JSON value is an array, not an object");
}

/* A small config of each kind, with extra (", KEY: VALUE") before its
 * closing brace; caller frees. */
static char *config_with(const char *body, const char *extra)
{
	char *t = malloc(1024);
	cr_assert_not_null(t);
	cr_assert(snprintf(t, 1024, "{%s%s}", body, extra) < 1024);
	return t;
}

static char *qwen_with(const char *extra)
{
	return config_with("\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, "
	                   "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"vocab_size\": "
	                   "256, \"num_experts\": 8, \"num_experts_per_tok\": 2, "
	                   "\"moe_intermediate_size\": 32, \"intermediate_size\": 128",
	                   extra);
}

static char *gpt_oss_with(const char *extra)
{
	return config_with("\"model_type\": \"gpt_oss\", \"hidden_size\": 64, "
	                   "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"vocab_size\": "
	                   "256, \"num_local_experts\": 8, \"num_experts_per_tok\": 2, "
	                   "\"intermediate_size\": 32",
	                   extra);
}

/* A field kiln reads that is present with the wrong type is an error that
 * names it and the type expected; null stands for absent only in
 * q_lora_rank and sliding_window, where Hugging Face writes it; a size of
 * 0 is refused, never replaced by a default; every size is at most 2^24
 * (docs/cli.md); and each bad field is reported once. */
Test(import, every_field_read_is_checked_once)
{
	static const struct {
		const char *extra, *want;
	} cases[] = {
	    {", \"hidden_act\": null", "field 'hidden_act' is null, expected a string"},
	    {", \"hidden_act\": 1", "field 'hidden_act' is a number, expected a string"},
	    {", \"mlp_only_layers\": \"0,1\"",
	     "field 'mlp_only_layers' is a string, expected an array of layer indices"},
	    {", \"mlp_only_layers\": [\"0\"]",
	     "element 0 of field 'mlp_only_layers' is a string, not a non-negative integer"},
	    {", \"mlp_only_layers\": [-1]",
	     "element 0 of field 'mlp_only_layers' is -1, not a non-negative integer"},
	    {", \"tie_word_embeddings\": \"yes\"",
	     "field 'tie_word_embeddings' is a string, expected a boolean"},
	    {", \"use_sliding_window\": 0",
	     "field 'use_sliding_window' is a number, expected a boolean"},
	    {", \"sliding_window\": \"4096\"",
	     "field 'sliding_window' is a string, expected a non-negative integer or null"},
	    {", \"num_nextn_predict_layers\": \"x\"",
	     "field 'num_nextn_predict_layers' is a string, expected a non-negative integer"},
	    {", \"layer_types\": 7",
	     "field 'layer_types' is a number, expected an array of strings"},
	    {", \"layer_types\": [\"full_attention\", 2]",
	     "element 1 of field 'layer_types' is a number, expected a string"},
	    {", \"head_dim\": 0", "field 'head_dim' is 0, must be positive"},
	    {", \"head_dim\": null", "field 'head_dim' is null, expected a positive integer"},
	    {", \"max_position_embeddings\": 0", "field 'max_position_embeddings' is 0, must be"},
	    {", \"num_key_value_heads\": 0", "field 'num_key_value_heads' is 0, must be positive"},
	    {", \"head_dim\": 4294967296",
	     "field 'head_dim' is 4294967296, over kiln's bound of 16777216"},
	    {", \"max_position_embeddings\": 1e300",
	     "field 'max_position_embeddings' is 1e+300, over kiln's bound of 9007199254740992"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char *text = qwen_with(cases[i].extra);
		import_fails(text, DEV8, 1, cases[i].want);
		free(text);
	}
	import_fails("{\"model_type\": 3}", DEV8, 1,
	             "field 'model_type' is a number, expected a string");
	import_fails("{\"model_type\": \"llama\", \"text_config\": []}", DEV8, 1,
	             "field 'text_config' is an array, expected an object");
	import_fails("{\"model_type\": \"llama\", \"_name_or_path\": null}", DEV8, 1,
	             "field '_name_or_path' is null, expected a string");
	/* Required sizes: 2^32 of any of them, or null. */
	static const char *const sizes[] = {"hidden_size", "num_attention_heads", "vocab_size",
	                                    "moe_intermediate_size", "num_experts"};
	for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
		char base[1024], want[256];
		char *text = qwen_with("");
		/* Replace the field's value by 4294967296. */
		char *at = strstr(text, sizes[i]);
		cr_assert_not_null(at);
		char *colon = strchr(at, ':'), *end = strpbrk(colon, ",}");
		snprintf(base, sizeof base, "%.*s: 4294967296%s", (int)(colon - text), text, end);
		snprintf(want, sizeof want,
		         "field '%s' is 4294967296, over kiln's bound of 16777216", sizes[i]);
		import_fails(base, DEV8, 1, want);
		snprintf(base, sizeof base, "%.*s: null%s", (int)(colon - text), text, end);
		snprintf(want, sizeof want, "field '%s' is null, expected a positive integer",
		         sizes[i]);
		import_fails(base, DEV8, 1, want);
		free(text);
	}
	/* Once: a negative size is not reported again as 0. */
	static const char neg[] =
	    "{\"model_type\": \"llama\", \"hidden_size\": -1, \"num_hidden_layers\": 2, "
	    "\"num_attention_heads\": 4, \"vocab_size\": 100, \"intermediate_size\": 128}";
	char *cfg = kt_temp_file(".json", neg, strlen(neg));
	kt_run r = RUN("import", "hf", cfg, "--devices", "8");
	cr_expect_eq(r.status, 1);
	cr_expect_not_null(strstr(r.err, "field 'hidden_size' is -1, not a positive integer"), "%s",
	                   r.err);
	cr_expect_eq(kt_count(r.err, "'hidden_size'"), 1, "%s", r.err);
	kt_run_free(&r);
	unlink(cfg);
	free(cfg);
	/* Null as absent where Hugging Face writes it. */
	char *ok = qwen_with(", \"sliding_window\": null, \"use_sliding_window\": false");
	cfg = kt_temp_file(".json", ok, strlen(ok));
	r = RUN("import", "hf", cfg, "--devices", "8");
	cr_expect_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	unlink(cfg);
	free(cfg);
	free(ok);
}

/* The sliding-window note is printed where some layer has a window: not
 * for gpt-oss layers all full_attention or a window of 0, as for Mistral's
 * window with no layer_types, or Qwen's with use_sliding_window false. */
Test(import, sliding_window_note_only_where_a_layer_slides)
{
	static const struct {
		bool gpt_oss;
		const char *extra;
		bool note;
	} cases[] = {
	    {true, "", true}, /* gpt-oss's default: window 128, alternating layers */
	    {true,
	     ", \"sliding_window\": 128, \"layer_types\": [\"sliding_attention\", "
	     "\"full_attention\", \"sliding_attention\", \"full_attention\"]",
	     true},
	    {true,
	     ", \"sliding_window\": 128, \"layer_types\": [\"full_attention\", "
	     "\"full_attention\", \"full_attention\", \"full_attention\"]",
	     false},
	    {true, ", \"sliding_window\": 0", false},
	    {true, ", \"sliding_window\": null", false},
	    {false, ", \"sliding_window\": 4096", true},
	    {false, ", \"sliding_window\": 4096, \"use_sliding_window\": false", false},
	    {false, "", false},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char *text =
		    cases[i].gpt_oss ? gpt_oss_with(cases[i].extra) : qwen_with(cases[i].extra);
		char *cfg = kt_temp_file(".json", text, strlen(text));
		kt_run r = RUN("import", "hf", cfg, "--devices", "8");
		cr_expect_eq(r.status, 0, "case %zu: %s", i, r.err);
		cr_expect_eq(strstr(r.err, "sliding-window") != NULL, cases[i].note, "case %zu: %s",
		             i, r.err);
		kt_run_free(&r);
		unlink(cfg);
		free(cfg);
		free(text);
	}
}

/* import's messages follow kilnc's conventions: an option's usage error
 * points to `kilnc help import` as the command's others do; problems in the
 * config are "CONFIG: error: ..."; an output that cannot be written gives
 * its real reason (/proc/version: its directory takes no new file, or, for
 * a user, permission), not a missing file. */
Test(import, messages_follow_kilnc_conventions)
{
	const char *cfg = kt_src("examples/hf/mixtral-8x22b.json");
	kt_run r = RUN("import", "hf", cfg, "--devices", "8", "--devices", "8");
	cr_expect_eq(r.status, 2);
	cr_expect_not_null(strstr(r.err, "--devices given twice\nTry 'kilnc help import'."), "%s",
	                   r.err);
	kt_run_free(&r);
	r = RUN("import", "hf", cfg, "--devices", "8", "--name");
	cr_expect_eq(r.status, 2);
	cr_expect_not_null(strstr(r.err, "--name needs a value\nTry 'kilnc help import'."), "%s",
	                   r.err);
	kt_run_free(&r);
	static const char bert[] = "{\"model_type\": \"bert\"}";
	char *path = kt_temp_file(".json", bert, strlen(bert));
	r = RUN("import", "hf", path, "--devices", "8");
	char want[4200];
	snprintf(want, sizeof want, "%s: error: model_type 'bert'", path);
	cr_expect(strncmp(r.err, want, strlen(want)) == 0, "want '%s' at the start of: %s", want,
	          r.err);
	kt_run_free(&r);
	unlink(path);
	free(path);
	if (access("/proc/version", F_OK) == 0) {
		r = RUN("import", "hf", cfg, "--devices", "8", "-o", "/proc/version");
		cr_expect_eq(r.status, 1, "%s", r.err);
		cr_expect(strstr(r.err,
		                 "cannot write /proc/version: cannot create a temporary file "
		                 "in /proc") ||
		              strstr(r.err, "cannot write /proc/version: Permission denied"),
		          "%s", r.err);
		kt_run_free(&r);
	}
}
