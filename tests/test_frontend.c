/* tests/test_frontend.c: the model-description frontend (frontend/).
 *
 * Each input is written inline, one YAML line per C line, so the expected
 * LINE:COL of a diagnostic can be read off the source. Expected values come
 * from the rules in docs/model-format.md, computed by hand in the comments.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "costmodel/costmodel.h"
#include "frontend/frontend.h"

static kiln_arena *arena;
static char *diag_text;
static size_t diag_len;

static void setup(void)
{
	arena = kiln_arena_new();
	cr_assert_not_null(arena);
	diag_text = NULL;
}

static void teardown(void)
{
	free(diag_text);
	kiln_arena_free(arena);
}

/* Loads text as the file "m.yaml"; diagnostics land in diag_text. */
static int load_n(const char *text, size_t len, kiln_model **out)
{
	free(diag_text);
	diag_text = NULL;
	FILE *f = open_memstream(&diag_text, &diag_len);
	cr_assert_not_null(f);
	int rc = kiln_frontend_load_buffer("m.yaml", text, len, arena, f, out);
	fclose(f);
	return rc;
}

static int load(const char *text, kiln_model **out)
{
	return load_n(text, strlen(text), out);
}

static int load_path(const char *path, kiln_model **out)
{
	free(diag_text);
	diag_text = NULL;
	FILE *f = open_memstream(&diag_text, &diag_len);
	cr_assert_not_null(f);
	int rc = kiln_frontend_load_file(path, arena, f, out);
	fclose(f);
	return rc;
}

/* The load fails and the diagnostics contain needle. */
static void expect_invalid(const char *text, const char *needle)
{
	kiln_model *m = (kiln_model *)&m;
	int rc = load(text, &m);
	cr_assert_eq(rc, KILN_FRONTEND_INVALID, "rc %d; diagnostics:\n%s", rc,
	             diag_text ? diag_text : "");
	cr_assert_null(m);
	cr_assert_not_null(strstr(diag_text, needle), "expected \"%s\" in:\n%s", needle, diag_text);
}

static void expect_in_diag(const char *needle)
{
	cr_assert_not_null(strstr(diag_text, needle), "expected \"%s\" in:\n%s", needle, diag_text);
}

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;
	for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

static kiln_model *load_ok(const char *text)
{
	kiln_model *m = NULL;
	int rc = load(text, &m);
	cr_assert_eq(rc, KILN_FRONTEND_OK, "rc %d; diagnostics:\n%s", rc, diag_text);
	cr_assert_not_null(m);
	cr_assert_eq(diag_len, 0, "unexpected diagnostics:\n%s", diag_text);
	return m;
}

static void write_file(const char *path, const char *text, size_t len)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "cannot write %s", path);
	cr_assert_eq(fwrite(text, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
}

/* ------------------------------------------------------------ valid models */

TestSuite(frontend_valid, .init = setup, .fini = teardown);

Test(frontend_valid, minimal_dense_model_gets_defaults)
{
	kiln_model *m = load_ok("kiln: 1\n"
	                        "model:\n"
	                        "  layers: 4\n"
	                        "  hidden: 64\n"
	                        "  ffn_hidden: 256\n"
	                        "  heads: 8\n"
	                        "  vocab: 1000\n"
	                        "  seq_len: 128\n"
	                        "training:\n"
	                        "  global_batch: 8\n"
	                        "parallel:\n"
	                        "  devices: 2\n"
	                        "hardware: bw1000\n");
	cr_expect_str_eq(m->name, "m"); /* file name without extension */
	cr_expect_str_eq(m->path, "m.yaml");
	cr_expect_eq(m->layers, 4);
	cr_expect_eq(m->dense_layers, 4); /* no moe: every layer is dense */
	cr_expect_eq(m->kv_heads, 8);     /* = heads */
	cr_expect_eq(m->head_dim, 8);     /* 64 / 8 */
	cr_expect_eq(m->attention, KILN_ATTN_FLASH);
	cr_expect_eq(m->activation, KILN_FN_SWIGLU);
	cr_expect_eq(m->dropout, 0.0);
	cr_expect(!m->mla);
	cr_expect(!m->moe);
	cr_expect_eq(m->experts, 0);
	cr_expect_eq(m->v_head_dim, 8);
	cr_expect_eq(m->micro_batch, 1);
	cr_expect_eq(m->global_batch, 8);
	cr_expect_eq(m->dtype, KILN_DTYPE_BF16);
	cr_expect_eq(m->optimizer, KILN_OPTIM_ADAM);
	cr_expect(!m->distributed_optimizer);
	cr_expect_eq(m->tp, 1);
	cr_expect_eq(m->pp, 1);
	cr_expect_eq(m->ep, 1);
	cr_expect(!m->sequence_parallel); /* tp == 1 */
	cr_expect_eq(m->schedule, KILN_SCHED_1F1B);
	cr_expect_eq(m->vpp, 1);
	cr_assert_eq(m->n_stage_layers, 1);
	cr_expect_eq(m->stage_layers[0], 4);
	cr_expect_eq(m->max_factor, 1.0); /* a dense model's load never varies */
	cr_expect_eq(m->dp, 2);            /* 2 / (1 * 1) */
	cr_expect_eq(m->edp, 2);           /* dp * tp / ep */
	cr_expect_eq(m->micro_batches, 4); /* 8 / (1 * 2) */
	cr_expect_str_eq(m->hw.name, "bw1000");
	cr_expect_str_eq(m->hw.source, "<shipped:bw1000>");
}

Test(frontend_valid, moe_model_gets_defaults)
{
	kiln_model *m = load_ok("kiln: 1\n"
	                        "name: moe-test\n"
	                        "model:\n"
	                        "  layers: 6\n"
	                        "  dense_layers: 1\n"
	                        "  hidden: 128\n"
	                        "  ffn_hidden: 512\n"
	                        "  heads: 16\n"
	                        "  kv_heads: 4\n"
	                        "  vocab: 5000\n"
	                        "  seq_len: 256\n"
	                        "  activation: gelu\n"
	                        "  moe:\n"
	                        "    experts: 16\n"
	                        "    top_k: 2\n"
	                        "    expert_ffn_hidden: 64\n"
	                        "training:\n"
	                        "  micro_batch: 2\n"
	                        "  global_batch: 64\n"
	                        "parallel:\n"
	                        "  devices: 16\n"
	                        "  tp: 2\n"
	                        "  pp: 2\n"
	                        "  ep: 8\n"
	                        "hardware: h100-sxm\n");
	cr_expect_str_eq(m->name, "moe-test");
	cr_expect(m->moe);
	cr_expect_eq(m->dense_layers, 1);
	cr_expect_eq(m->experts, 16);
	cr_expect_eq(m->shared_experts, 0);
	cr_expect_eq(m->top_k, 2);
	cr_expect_eq(m->moe_activation, KILN_FN_GELU); /* = model.activation */
	cr_expect_eq(m->head_dim, 8);                  /* 128 / 16 */
	cr_expect(m->sequence_parallel);               /* tp > 1 */
	cr_expect_eq(m->dp, 4);                        /* 16 / (2 * 2) */
	cr_expect_eq(m->edp, 1);                       /* 4 * 2 / 8 */
	cr_expect_eq(m->micro_batches, 8);             /* 64 / (2 * 4) */
	cr_assert_eq(m->n_stage_layers, 2);
	cr_expect_eq(m->stage_layers[0], 3); /* 6 / 2, no remainder */
	cr_expect_eq(m->stage_layers[1], 3);
	cr_expect_eq(m->hw.memory_gib, 80);
	/* The memory options default to Megatron-Core's (docs/model-format.md). */
	cr_expect(m->fused_qkv);
	cr_expect(m->norm_saves_rstd);
	cr_expect_eq(m->prob_apply, KILN_PROB_ACTIVATION);
	cr_expect_not(m->moe_permute_fusion);
}

/* Each memory option's values, as written. */
Test(frontend_valid, memory_options_as_written)
{
	static const struct {
		const char *value;
		kiln_prob_apply want;
	} pa[] = {{"activation", KILN_PROB_ACTIVATION},
	          {"expert_output", KILN_PROB_EXPERT_OUTPUT},
	          {"combine", KILN_PROB_COMBINE}};
	for (size_t i = 0; i < sizeof pa / sizeof pa[0]; i++) {
		char text[1024];
		snprintf(text, sizeof text,
		         "kiln: 1\n"
		         "model:\n"
		         "  layers: 2\n"
		         "  hidden: 64\n"
		         "  heads: 4\n"
		         "  vocab: 100\n"
		         "  seq_len: 32\n"
		         "  fused_qkv: %s\n"
		         "  norm_saves_rstd: %s\n"
		         "  moe: {experts: 4, top_k: 2, expert_ffn_hidden: 32, prob_apply: %s}\n"
		         "training: {global_batch: 1}\n"
		         "parallel: {devices: 1, moe_permute_fusion: %s}\n"
		         "hardware: bw1000\n",
		         i % 2 ? "true" : "false", i % 2 ? "false" : "true", pa[i].value,
		         i % 2 ? "false" : "true");
		kiln_model *m = load_ok(text);
		cr_expect_eq(m->prob_apply, pa[i].want, "%s", pa[i].value);
		cr_expect_eq(m->fused_qkv, i % 2 == 1, "%s", pa[i].value);
		cr_expect_eq(m->norm_saves_rstd, i % 2 == 0, "%s", pa[i].value);
		cr_expect_eq(m->moe_permute_fusion, i % 2 == 0, "%s", pa[i].value);
	}
}

Test(frontend_valid, design_example_loads)
{
	/* DESIGN.md 5.1, verbatim but for the comments. */
	kiln_model *m = load_ok("kiln: 1\n"
	                        "name: deepseek-v3-671b\n"
	                        "model:\n"
	                        "  layers: 61\n"
	                        "  dense_layers: 3\n"
	                        "  hidden: 7168\n"
	                        "  ffn_hidden: 18432\n"
	                        "  heads: 128\n"
	                        "  kv_heads: 128\n"
	                        "  head_dim: 128\n"
	                        "  vocab: 129280\n"
	                        "  seq_len: 4096\n"
	                        "  attention: flash\n"
	                        "  activation: swiglu\n"
	                        "  dropout: 0.0\n"
	                        "  moe:\n"
	                        "    experts: 256\n"
	                        "    shared_experts: 1\n"
	                        "    top_k: 8\n"
	                        "    expert_ffn_hidden: 2048\n"
	                        "    activation: swiglu\n"
	                        "training:\n"
	                        "  micro_batch: 1\n"
	                        "  global_batch: 4096\n"
	                        "  dtype: bf16\n"
	                        "  optimizer: adam\n"
	                        "  distributed_optimizer: true\n"
	                        "parallel:\n"
	                        "  devices: 2048\n"
	                        "  tp: 1\n"
	                        "  pp: 16\n"
	                        "  ep: 64\n"
	                        "  sequence_parallel: true\n"
	                        "  schedule: 1f1b\n"
	                        "  vpp: 1\n"
	                        "  stage_layers: []\n"
	                        "hardware: bw1000\n"
	                        "load:\n"
	                        "  max_factor: 3.0\n");
	cr_expect_eq(m->dp, 128);           /* 2048 / 16 */
	cr_expect_eq(m->edp, 2);            /* 128 * 1 / 64 */
	cr_expect_eq(m->micro_batches, 32); /* 4096 / 128 */
	cr_expect(m->distributed_optimizer);
	/* 61 = 16 * 3 + 13: chunks 1..13 get 4 layers, the others 3. */
	cr_assert_eq(m->n_stage_layers, 16);
	for (size_t i = 0; i < 16; i++)
		cr_expect_eq(m->stage_layers[i], i >= 1 && i <= 13 ? 4 : 3, "chunk %zu", i);
}

Test(frontend_valid, default_split_remainder_skips_chunk_zero)
{
	/* 10 = 4 * 2 + 2: chunks 1 and 2 get one more. */
	kiln_model *m = load_ok("kiln: 1\n"
	                        "model: {layers: 10, hidden: 64, ffn_hidden: 64, heads: 8, "
	                        "vocab: 100, seq_len: 16}\n"
	                        "training: {global_batch: 4}\n"
	                        "parallel: {devices: 4, pp: 4}\n"
	                        "hardware: bw1000\n");
	int64_t want[] = {2, 3, 3, 2};
	cr_assert_eq(m->n_stage_layers, 4);
	for (size_t i = 0; i < 4; i++)
		cr_expect_eq(m->stage_layers[i], want[i], "chunk %zu", i);
}

Test(frontend_valid, interleaved_default_split_and_explicit_split)
{
	/* pp 2 * vpp 3 = 6 chunks; 10 = 6 * 1 + 4: chunks 1..4 get 2. */
	kiln_model *m = load_ok("kiln: 1\n"
	                        "model: {layers: 10, hidden: 64, ffn_hidden: 64, heads: 8, "
	                        "vocab: 100, seq_len: 16}\n"
	                        "training: {global_batch: 4}\n"
	                        "parallel: {devices: 2, pp: 2, vpp: 3, schedule: interleaved}\n"
	                        "hardware: bw1000\n");
	int64_t want[] = {1, 2, 2, 2, 2, 1};
	cr_assert_eq(m->n_stage_layers, 6);
	for (size_t i = 0; i < 6; i++)
		cr_expect_eq(m->stage_layers[i], want[i], "chunk %zu", i);
	cr_expect_eq(m->micro_batches, 4); /* 4 / (1 * 1) */

	m = load_ok("kiln: 1\n"
	            "model: {layers: 10, hidden: 64, ffn_hidden: 64, heads: 8, vocab: 100, "
	            "seq_len: 16}\n"
	            "training: {global_batch: 4}\n"
	            "parallel:\n"
	            "  devices: 2\n"
	            "  pp: 2\n"
	            "  stage_layers:\n"
	            "    - 7\n"
	            "    - 3\n"
	            "hardware: bw1000\n");
	cr_assert_eq(m->n_stage_layers, 2);
	cr_expect_eq(m->stage_layers[0], 7);
	cr_expect_eq(m->stage_layers[1], 3);
}

Test(frontend_valid, mla_defaults_and_aliases)
{
	kiln_model *m = load_ok("kiln: 1\n"
	                        "model:\n"
	                        "  layers: 2\n"
	                        "  hidden: &h 64\n"
	                        "  ffn_hidden: *h\n"
	                        "  heads: 4\n"
	                        "  vocab: 100\n"
	                        "  seq_len: 32\n"
	                        "  mla: {kv_lora_rank: 16, rope_head_dim: 8}\n"
	                        "training: {global_batch: 1}\n"
	                        "parallel: {devices: 1}\n"
	                        "hardware: mi300x\n");
	cr_expect(m->mla);
	cr_expect_eq(m->ffn_hidden, 64); /* through the alias */
	cr_expect_eq(m->q_lora_rank, 0);
	cr_expect_eq(m->kv_lora_rank, 16);
	cr_expect_eq(m->rope_head_dim, 8);
	cr_expect_eq(m->v_head_dim, 16); /* = head_dim = 64 / 4 */
	cr_expect_not(m->fused_qkv);     /* q and kv have projections of their own */
}

Test(frontend_valid, moe_without_dense_layers_needs_no_ffn_hidden)
{
	kiln_model *m = load_ok("kiln: 1\n"
	                        "model:\n"
	                        "  layers: 2\n"
	                        "  hidden: 64\n"
	                        "  heads: 4\n"
	                        "  vocab: 100\n"
	                        "  seq_len: 32\n"
	                        "  moe: {experts: 4, top_k: 1, expert_ffn_hidden: 32, "
	                        "shared_experts: 1, activation: gelu}\n"
	                        "training: {global_batch: 1, dtype: fp8, optimizer: sgd}\n"
	                        "parallel: {devices: 1}\n"
	                        "hardware: h200\n");
	cr_expect_eq(m->dense_layers, 0);
	cr_expect_eq(m->ffn_hidden, 0);
	cr_expect_eq(m->shared_experts, 1);
	cr_expect_eq(m->moe_activation, KILN_FN_GELU);
	cr_expect_eq(m->activation, KILN_FN_SWIGLU);
	cr_expect_eq(m->dtype, KILN_DTYPE_FP8);
	cr_expect_eq(m->optimizer, KILN_OPTIM_SGD);
}

/* fp32 activations (the CPU trainer in examples/trainer): 4 bytes per
 * element, so a layer input of seq 32 x hidden 64 holds 32*64*4 = 8192 bytes. */
Test(frontend_valid, fp32_activations)
{
	kiln_model *m = load_ok("kiln: 1\n"
	                        "model: {layers: 2, hidden: 64, heads: 4, vocab: 100, seq_len: 32,\n"
	                        "        moe: {experts: 4, top_k: 1, expert_ffn_hidden: 32}}\n"
	                        "training: {global_batch: 1, dtype: fp32}\n"
	                        "parallel: {devices: 1}\n"
	                        "hardware: h200\n");
	cr_expect_eq(m->dtype, KILN_DTYPE_FP32);
	cr_expect_eq(kiln_model_act_bytes(m), 4);
	cr_expect_eq(kiln_model_act_bytes(m) * (uint64_t)m->seq_len * (uint64_t)m->hidden, 8192);
}

/* ------------------------------------------------------------ rules */

TestSuite(frontend_rules, .init = setup, .fini = teardown);

Test(frontend_rules, missing_required_key_at_section)
{
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  hidden: 64\n"
	               "  ffn_hidden: 64\n"
	               "  heads: 8\n"
	               "  vocab: 100\n"
	               "  seq_len: 16\n"
	               "training: {global_batch: 4}\n"
	               "parallel: {devices: 1}\n"
	               "hardware: bw1000\n",
	               "m.yaml:2:1: error: missing required key 'layers' in model");
}

Test(frontend_rules, missing_sections_and_version)
{
	expect_invalid("name: x\n", "m.yaml:1:1: error: missing required key 'kiln'");
	expect_in_diag("m.yaml:1:1: error: missing required section 'model'");
	expect_in_diag("m.yaml:1:1: error: missing required section 'training'");
	expect_in_diag("m.yaml:1:1: error: missing required section 'parallel'");
	expect_in_diag("m.yaml:1:1: error: missing required key 'hardware'");
	expect_invalid(
	    "kiln: 2\n"
	    "model: {layers: 1, hidden: 8, ffn_hidden: 8, heads: 1, vocab: 8, seq_len: 8}\n"
	    "training: {global_batch: 1}\n"
	    "parallel: {devices: 1}\n"
	    "hardware: bw1000\n",
	    "m.yaml:1:7: error: unsupported format version kiln: 2");
}

Test(frontend_rules, sizes_must_be_positive)
{
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 0\n"
	               "  hidden: 64\n"
	               "  ffn_hidden: 64\n"
	               "  heads: -8\n"
	               "  vocab: 100\n"
	               "  seq_len: 16\n"
	               "training: {global_batch: 4}\n"
	               "parallel: {devices: 1}\n"
	               "hardware: bw1000\n",
	               "m.yaml:3:11: error: layers must be positive, got 0");
	expect_in_diag("m.yaml:6:10: error: heads must be positive, got -8");
	cr_expect_eq(count(diag_text, "error:"), 2, "no cascades:\n%s", diag_text);
}

Test(frontend_rules, heads_divisible_by_tp)
{
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 2\n"
	               "  hidden: 96\n"
	               "  ffn_hidden: 64\n"
	               "  heads: 48\n"
	               "  kv_heads: 1\n"
	               "  vocab: 100\n"
	               "  seq_len: 20\n"
	               "training: {global_batch: 5}\n"
	               "parallel:\n"
	               "  devices: 5\n"
	               "  tp: 5\n"
	               "hardware: bw1000\n",
	               "m.yaml:13:7: error: heads (48) must be divisible by tp (5)");
	cr_expect_eq(count(diag_text, "error:"), 1, "%s", diag_text);
}

Test(frontend_rules, kv_heads_divide_heads)
{
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 2\n"
	               "  hidden: 64\n"
	               "  ffn_hidden: 64\n"
	               "  heads: 64\n"
	               "  kv_heads: 6\n"
	               "  vocab: 100\n"
	               "  seq_len: 16\n"
	               "training: {global_batch: 1}\n"
	               "parallel: {devices: 1}\n"
	               "hardware: bw1000\n",
	               "m.yaml:7:13: error: kv_heads (6) must divide heads (64)");
}

Test(frontend_rules, kv_heads_and_tp_divide_one_another)
{
	/* 24 % 6 == 0 and 24 % 4 == 0, but neither of 6 and 4 divides the other. */
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 2\n"
	               "  hidden: 48\n"
	               "  ffn_hidden: 64\n"
	               "  heads: 24\n"
	               "  kv_heads: 6\n"
	               "  vocab: 100\n"
	               "  seq_len: 16\n"
	               "training: {global_batch: 1}\n"
	               "parallel:\n"
	               "  devices: 4\n"
	               "  tp: 4\n"
	               "hardware: bw1000\n",
	               "m.yaml:13:7: error: kv_heads (6) and tp (4) must divide one another");
	cr_expect_eq(count(diag_text, "error:"), 1, "%s", diag_text);
}

Test(frontend_rules, seq_len_divisible_by_tp_with_sequence_parallel)
{
	/* 100 tokens cannot be split evenly over 8 ranks. */
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 2\n"
	               "  hidden: 64\n"
	               "  ffn_hidden: 64\n"
	               "  heads: 8\n"
	               "  vocab: 100\n"
	               "  seq_len: 100\n"
	               "training: {global_batch: 1}\n"
	               "parallel:\n"
	               "  devices: 8\n"
	               "  tp: 8\n"
	               "hardware: bw1000\n",
	               "m.yaml:12:7: error: seq_len (100) must be divisible by tp (8): "
	               "sequence_parallel splits");
	cr_expect_eq(count(diag_text, "error:"), 1, "%s", diag_text);
}

/* A small MoE model with a configurable moe line and parallel section. */
#define MOE_HEAD                                                                                   \
	"kiln: 1\n"                                                                                \
	"model:\n"                                                                                 \
	"  layers: 4\n"                                                                            \
	"  hidden: 64\n"                                                                           \
	"  heads: 8\n"                                                                             \
	"  vocab: 100\n"                                                                           \
	"  seq_len: 16\n"

Test(frontend_rules, experts_divisible_by_ep)
{
	expect_invalid(MOE_HEAD /* lines 1-7 */
	               "  moe: {experts: 10, top_k: 2, expert_ffn_hidden: 32}\n"
	               "training: {global_batch: 8}\n"
	               "parallel:\n"
	               "  devices: 8\n"
	               "  ep: 4\n"
	               "hardware: bw1000\n",
	               "m.yaml:12:7: error: experts (10) must be divisible by ep (4)");
	cr_expect_eq(count(diag_text, "error:"), 1, "%s", diag_text);
}

Test(frontend_rules, top_k_at_most_experts)
{
	expect_invalid(MOE_HEAD "  moe:\n"
	                        "    experts: 4\n"
	                        "    top_k: 8\n"
	                        "    expert_ffn_hidden: 32\n"
	                        "training: {global_batch: 8}\n"
	                        "parallel: {devices: 1}\n"
	                        "hardware: bw1000\n",
	               "m.yaml:10:12: error: top_k (8) must not exceed experts (4)");
}

Test(frontend_rules, shared_experts_not_negative)
{
	expect_invalid(MOE_HEAD "  moe:\n"
	                        "    experts: 4\n"
	                        "    shared_experts: -1\n"
	                        "    top_k: 2\n"
	                        "    expert_ffn_hidden: 32\n"
	                        "training: {global_batch: 8}\n"
	                        "parallel: {devices: 1}\n"
	                        "hardware: bw1000\n",
	               "m.yaml:10:21: error: shared_experts must be >= 0, got -1");
}

Test(frontend_rules, ep_layout_over_dp_times_tp)
{
	/* dp = 8 / (1 * 1) = 8; ep 16 does not divide dp * tp = 8. */
	expect_invalid(MOE_HEAD "  moe: {experts: 16, top_k: 2, expert_ffn_hidden: 32}\n"
	                        "training: {global_batch: 8}\n"
	                        "parallel:\n"
	                        "  devices: 8\n"
	                        "  ep: 16\n"
	                        "hardware: bw1000\n",
	               "m.yaml:12:7: error: ep (16) must divide dp * tp (8 * 1)");
}

Test(frontend_rules, ep_is_one_without_moe_and_dense_layers_below_layers)
{
	expect_invalid(MOE_HEAD "  ffn_hidden: 64\n"
	                        "training: {global_batch: 8}\n"
	                        "parallel:\n"
	                        "  devices: 2\n"
	                        "  ep: 2\n"
	                        "hardware: bw1000\n",
	               "m.yaml:12:7: error: ep (2) must be 1 without moe");
	expect_invalid(MOE_HEAD "  dense_layers: 4\n"
	                        "  ffn_hidden: 64\n"
	                        "  moe: {experts: 4, top_k: 2, expert_ffn_hidden: 32}\n"
	                        "training: {global_batch: 8}\n"
	                        "parallel: {devices: 1}\n"
	                        "hardware: bw1000\n",
	               "m.yaml:8:17: error: dense_layers (4) must be less than layers (4) when moe "
	               "is present");
}

Test(frontend_rules, ffn_hidden_required_for_dense_layers)
{
	expect_invalid(MOE_HEAD "training: {global_batch: 8}\n"
	                        "parallel: {devices: 1}\n"
	                        "hardware: bw1000\n",
	               "m.yaml:2:1: error: missing required key 'ffn_hidden' in model");
	expect_invalid(MOE_HEAD "  dense_layers: 1\n"
	                        "  moe: {experts: 4, top_k: 2, expert_ffn_hidden: 32}\n"
	                        "training: {global_batch: 8}\n"
	                        "parallel: {devices: 1}\n"
	                        "hardware: bw1000\n",
	               "m.yaml:2:1: error: missing required key 'ffn_hidden' in model");
}

Test(frontend_rules, head_dim_default_needs_divisible_hidden)
{
	expect_invalid(
	    "kiln: 1\n"
	    "model:\n"
	    "  layers: 2\n"
	    "  hidden: 100\n"
	    "  ffn_hidden: 64\n"
	    "  heads: 3\n"
	    "  kv_heads: 1\n"
	    "  vocab: 100\n"
	    "  seq_len: 16\n"
	    "training: {global_batch: 1}\n"
	    "parallel: {devices: 1}\n"
	    "hardware: bw1000\n",
	    "m.yaml:6:10: error: heads (3) must divide hidden (100) when head_dim is not "
	    "given");
}

#define DENSE_MODEL                                                                                \
	"kiln: 1\n"                                                                                \
	"model:\n"                                                                                 \
	"  layers: 4\n"                                                                            \
	"  hidden: 64\n"                                                                           \
	"  ffn_hidden: 64\n"                                                                       \
	"  heads: 8\n"                                                                             \
	"  vocab: 100\n"                                                                           \
	"  seq_len: 16\n"

Test(frontend_rules, pp_at_most_layers)
{
	expect_invalid(DENSE_MODEL /* lines 1-8 */
	               "training: {global_batch: 8}\n"
	               "parallel:\n"
	               "  devices: 8\n"
	               "  pp: 8\n"
	               "hardware: bw1000\n",
	               "m.yaml:12:7: error: pp (8) must not exceed layers (4)");
	cr_expect_eq(count(diag_text, "error:"), 1, "%s", diag_text);
}

Test(frontend_rules, layers_at_least_pp_times_vpp)
{
	expect_invalid(DENSE_MODEL "training: {global_batch: 2}\n"
	                           "parallel:\n"
	                           "  devices: 2\n"
	                           "  pp: 2\n"
	                           "  schedule: interleaved\n"
	                           "  vpp: 3\n"
	                           "hardware: bw1000\n",
	               "m.yaml:14:8: error: layers (4) must be at least pp * vpp (2 * 3)");
	cr_expect_eq(count(diag_text, "error:"), 1, "%s", diag_text);
}

Test(frontend_rules, stage_layers_length_entries_and_sum)
{
	expect_invalid(DENSE_MODEL "training: {global_batch: 2}\n"
	                           "parallel:\n"
	                           "  devices: 2\n"
	                           "  pp: 2\n"
	                           "  stage_layers: [4]\n"
	                           "hardware: bw1000\n",
	               "m.yaml:13:17: error: stage_layers has length 1, expected pp * vpp = 2");
	expect_invalid(DENSE_MODEL "training: {global_batch: 2}\n"
	                           "parallel:\n"
	                           "  devices: 2\n"
	                           "  pp: 2\n"
	                           "  stage_layers: [4, 0]\n"
	                           "hardware: bw1000\n",
	               "m.yaml:13:21: error: stage_layers entries must be positive, got 0");
	expect_invalid(DENSE_MODEL "training: {global_batch: 2}\n"
	                           "parallel:\n"
	                           "  devices: 2\n"
	                           "  pp: 2\n"
	                           "  stage_layers:\n"
	                           "  - 1\n"
	                           "  - 2\n"
	                           "hardware: bw1000\n",
	               "m.yaml:14:3: error: stage_layers sum to 3, expected layers (4)");
}

Test(frontend_rules, devices_divisible_by_tp_times_pp)
{
	expect_invalid(DENSE_MODEL "training: {global_batch: 8}\n"
	                           "parallel:\n"
	                           "  devices: 6\n"
	                           "  tp: 4\n"
	                           "hardware: bw1000\n",
	               "m.yaml:11:12: error: devices (6) must be divisible by tp * pp (4 * 1)");
}

Test(frontend_rules, global_batch_divisible_by_micro_batch_times_dp)
{
	/* dp = 4; 12 % (2 * 4) != 0. */
	expect_invalid(DENSE_MODEL "training:\n"
	                           "  micro_batch: 2\n"
	                           "  global_batch: 12\n"
	                           "parallel: {devices: 4}\n"
	                           "hardware: bw1000\n",
	               "m.yaml:11:17: error: global_batch (12) must be divisible by micro_batch * "
	               "dp (2 * 4)");
}

/* Micro-batches per iteration are global_batch / (micro_batch * dp), at
 * most KILN_FRONTEND_MAX_MICRO_BATCHES = 2^20, reported at global_batch:
 * 4,294,967,300 = 2^32 + 4 (which a 32-bit count reads as 4) and 2^62 (a
 * 32-bit count reads as 0) are refused; 2^20 itself is accepted. */
Test(frontend_rules, micro_batches_per_iteration_limited)
{
	expect_invalid(DENSE_MODEL "training:\n"
	                           "  global_batch: 4294967300\n"
	                           "parallel: {devices: 1}\n"
	                           "hardware: bw1000\n",
	               "m.yaml:10:17: error: micro-batches per iteration (global_batch / "
	               "(micro_batch * dp) = 4294967300 / (1 * 1) = 4294967300) exceed the limit "
	               "of 1048576");
	expect_invalid(DENSE_MODEL "training:\n"
	                           "  global_batch: 4611686018427387904\n"
	                           "parallel: {devices: 1}\n"
	                           "hardware: bw1000\n",
	               "m.yaml:10:17: error: micro-batches per iteration (global_batch / "
	               "(micro_batch * dp) = 4611686018427387904 / (1 * 1) = 4611686018427387904) "
	               "exceed the limit of 1048576");
	/* 2^20 + 1 with dp 2: 2 * (2^20 + 1) sequences; the value starts at column
	 * 26 ("training: {" is 11 characters, "global_batch: " 14). */
	expect_invalid(DENSE_MODEL "training: {global_batch: 2097154}\n"
	                           "parallel: {devices: 2}\n"
	                           "hardware: bw1000\n",
	               "m.yaml:9:26: error: micro-batches per iteration (global_batch / "
	               "(micro_batch * dp) = 2097154 / (1 * 2) = 1048577) exceed the limit of "
	               "1048576");
	kiln_model *m = load_ok(DENSE_MODEL "training: {global_batch: 2097152}\n"
	                                    "parallel: {devices: 2}\n"
	                                    "hardware: bw1000\n");
	cr_expect_eq(m->micro_batches, 1048576);
}

Test(frontend_rules, schedule_vpp_and_pp)
{
	expect_invalid(DENSE_MODEL "training: {global_batch: 8}\n"
	                           "parallel:\n"
	                           "  devices: 2\n"
	                           "  pp: 2\n"
	                           "  vpp: 2\n"
	                           "hardware: bw1000\n",
	               "m.yaml:13:8: error: vpp (2) must be 1 with schedule 1f1b");
	expect_invalid(DENSE_MODEL "training: {global_batch: 8}\n"
	                           "parallel:\n"
	                           "  devices: 2\n"
	                           "  pp: 2\n"
	                           "  schedule: interleaved\n"
	                           "hardware: bw1000\n",
	               "m.yaml:13:13: error: schedule interleaved needs vpp >= 2, got vpp (1)");
	expect_invalid(DENSE_MODEL "training: {global_batch: 8}\n"
	                           "parallel:\n"
	                           "  devices: 2\n"
	                           "  schedule: interleaved\n"
	                           "  vpp: 2\n"
	                           "hardware: bw1000\n",
	               "m.yaml:12:13: error: schedule interleaved needs pp >= 2, got pp (1)");
	/* dp = 1: micro_batches = 3, not a multiple of pp = 2. */
	expect_invalid(DENSE_MODEL "training: {global_batch: 3}\n"
	                           "parallel:\n"
	                           "  devices: 2\n"
	                           "  pp: 2\n"
	                           "  schedule: interleaved\n"
	                           "  vpp: 2\n"
	                           "hardware: bw1000\n",
	               "m.yaml:9:26: error: schedule interleaved needs micro-batches per iteration "
	               "(global_batch / (micro_batch * dp) = 3) to be a multiple of pp (2)");
}

/* Each activation value: its shape for the lowering (gated or not) and the
 * function as named; model.moe.activation defaults to model.activation;
 * linear_bias defaults to false (Megatron's add_bias_linear is set per
 * model). */
Test(frontend_valid, activation_values_and_linear_bias)
{
	static const struct {
		const char *name;
		kiln_act_fn fn;
		kiln_fn shape;
	} cases[] = {
	    {"swiglu", KILN_ACTFN_SWIGLU, KILN_FN_SWIGLU},
	    {"gelu", KILN_ACTFN_GELU, KILN_FN_GELU},
	    {"geglu", KILN_ACTFN_GEGLU, KILN_FN_SWIGLU},
	    {"quick_geglu", KILN_ACTFN_QUICK_GEGLU, KILN_FN_SWIGLU},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char text[1024];
		snprintf(text, sizeof text,
		         DENSE_MODEL "  activation: %s\n"
		                     "  moe: {experts: 4, top_k: 2, expert_ffn_hidden: 32}\n"
		                     "  linear_bias: %s\n"
		                     "training: {global_batch: 4}\n"
		                     "parallel: {devices: 1}\n"
		                     "hardware: bw1000\n",
		         cases[i].name, i % 2 ? "true" : "false");
		kiln_model *m = load_ok(text);
		cr_expect_eq(m->activation_fn, cases[i].fn, "%s", cases[i].name);
		cr_expect_eq(m->moe_activation_fn, cases[i].fn, "%s", cases[i].name);
		cr_expect_eq(m->activation, cases[i].shape, "%s", cases[i].name);
		cr_expect_eq(m->moe_activation, cases[i].shape, "%s", cases[i].name);
		cr_expect_eq(m->linear_bias, i % 2 == 1, "%s", cases[i].name);
	}
	kiln_model *m = load_ok(DENSE_MODEL "  moe: {experts: 4, top_k: 2, expert_ffn_hidden: 32,\n"
	                                    "        activation: quick_geglu}\n"
	                                    "training: {global_batch: 4}\n"
	                                    "parallel: {devices: 1}\n"
	                                    "hardware: bw1000\n");
	cr_expect_eq(m->activation_fn, KILN_ACTFN_SWIGLU); /* the default */
	cr_expect_eq(m->moe_activation_fn, KILN_ACTFN_QUICK_GEGLU);
	cr_expect_not(m->linear_bias);
}

Test(frontend_rules, moe_activation_and_linear_bias_errors)
{
	expect_invalid(DENSE_MODEL "  moe: {experts: 4, top_k: 2, expert_ffn_hidden: 32,\n"
	                           "        activation: clamped_geglu}\n"
	                           "  linear_bias: 1\n"
	                           "training: {global_batch: 4}\n"
	                           "parallel: {devices: 1}\n"
	                           "hardware: bw1000\n",
	               "m.yaml:10:21: error: activation must be one of swiglu, gelu, geglu, "
	               "quick_geglu; got 'clamped_geglu'");
	expect_in_diag("m.yaml:11:16: error: linear_bias must be true or false, got '1'");
}

Test(frontend_rules, enums_list_allowed_values)
{
	expect_invalid(DENSE_MODEL "  attention: slow\n"
	                           "  activation: relu\n"
	                           "training: {global_batch: 1, dtype: fp64, optimizer: lion}\n"
	                           "parallel: {devices: 1, schedule: gpipe}\n"
	                           "hardware: bw1000\n",
	               "m.yaml:9:14: error: attention must be one of flash, eager; got 'slow'");
	expect_in_diag("m.yaml:10:15: error: activation must be one of swiglu, gelu, geglu, "
	               "quick_geglu; got 'relu'");
	expect_in_diag("m.yaml:11:36: error: dtype must be one of bf16, fp16, fp8, fp32; got 'fp64'");
	expect_in_diag("m.yaml:11:53: error: optimizer must be one of adam, sgd; got 'lion'");
	expect_in_diag("m.yaml:12:34: error: schedule must be one of 1f1b, interleaved; got "
	               "'gpipe'");
}

/* The memory options (docs/model-format.md, "Memory options"): a bad value
 * is an error at the value; an option that cannot apply to the model is an
 * error at its value too. */
Test(frontend_rules, memory_options_rejected_at_their_values)
{
	expect_invalid(DENSE_MODEL "  fused_qkv: maybe\n"
	                           "  norm_saves_rstd: 2\n"
	                           "training: {global_batch: 1}\n"
	                           "parallel: {devices: 1, moe_permute_fusion: true}\n"
	                           "hardware: bw1000\n",
	               "m.yaml:9:14: error: fused_qkv must be true or false, got 'maybe'");
	expect_in_diag("m.yaml:10:20: error: norm_saves_rstd must be true or false, got '2'");
	expect_in_diag("m.yaml:12:44: error: moe_permute_fusion needs a moe section");
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 2\n"
	               "  hidden: 64\n"
	               "  heads: 4\n"
	               "  vocab: 100\n"
	               "  seq_len: 32\n"
	               "  moe:\n"
	               "    experts: 4\n"
	               "    top_k: 2\n"
	               "    expert_ffn_hidden: 32\n"
	               "    prob_apply: router\n"
	               "training: {global_batch: 1}\n"
	               "parallel: {devices: 1, moe_permute_fusion: 1}\n"
	               "hardware: bw1000\n",
	               "m.yaml:12:17: error: prob_apply must be one of activation, expert_output, "
	               "combine; got 'router'");
	expect_in_diag("m.yaml:14:44: error: moe_permute_fusion must be true or false, got '1'");
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 2\n"
	               "  hidden: 64\n"
	               "  heads: 4\n"
	               "  vocab: 100\n"
	               "  seq_len: 32\n"
	               "  mla: {kv_lora_rank: 16, rope_head_dim: 8}\n"
	               "  fused_qkv: false\n"
	               "training: {global_batch: 1}\n"
	               "parallel: {devices: 1}\n"
	               "hardware: bw1000\n",
	               "m.yaml:9:14: error: fused_qkv does not apply with mla");
}

Test(frontend_rules, dropout_max_factor_and_booleans)
{
	expect_invalid(DENSE_MODEL "  dropout: 1\n"
	                           "training: {global_batch: 1, distributed_optimizer: yes}\n"
	                           "parallel: {devices: 1, sequence_parallel: 1}\n"
	                           "hardware: bw1000\n"
	                           "load:\n"
	                           "  max_factor: 0.5\n",
	               "m.yaml:9:12: error: dropout (1) must be in [0, 1)");
	expect_in_diag("m.yaml:10:52: error: distributed_optimizer must be true or false, got "
	               "'yes'");
	expect_in_diag("m.yaml:11:43: error: sequence_parallel must be true or false, got '1'");
	expect_in_diag("m.yaml:14:15: error: max_factor (0.5) must be at least 1");
	expect_invalid(DENSE_MODEL "  dropout: -0.1\n"
	                           "training: {global_batch: 1}\n"
	                           "parallel: {devices: 1}\n"
	                           "hardware: bw1000\n",
	               "m.yaml:9:12: error: dropout (-0.1) must be in [0, 1)");
}

Test(frontend_rules, scalar_types)
{
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 4.5\n"
	               "  hidden: \"64\"\n"
	               "  ffn_hidden: [64]\n"
	               "  heads:\n"
	               "  vocab: 0x10\n"
	               "  seq_len: 16\n"
	               "  dropout: .nan\n"
	               "  mla: 3\n"
	               "training: {global_batch: 1}\n"
	               "parallel: {devices: 1}\n"
	               "hardware: bw1000\n"
	               "load: {max_factor: 1e999}\n",
	               "m.yaml:3:11: error: expected an integer for 'layers', got '4.5'");
	expect_in_diag(
	    "m.yaml:4:11: error: expected an integer for 'hidden', got the quoted string "
	    "'64'");
	expect_in_diag("m.yaml:5:15: error: expected an integer for 'ffn_hidden', got a sequence");
	expect_in_diag("m.yaml:6:9: error: expected an integer for 'heads', got null");
	expect_in_diag("m.yaml:7:10: error: expected an integer for 'vocab', got '0x10'");
	expect_in_diag("m.yaml:9:12: error: expected a finite number for 'dropout', got '.nan'");
	expect_in_diag("m.yaml:10:8: error: mla must be a mapping, got '3'");
	expect_in_diag("m.yaml:14:20: error: number out of range for 'max_factor': '1e999'");
}

Test(frontend_rules, integers_beyond_int64)
{
	expect_invalid(DENSE_MODEL "training:\n"
	                           "  global_batch: 9223372036854775808\n"
	                           "  micro_batch: 123456789012345678901234567890\n"
	                           "parallel: {devices: 9223372036854775807}\n"
	                           "hardware: bw1000\n",
	               "m.yaml:10:17: error: integer out of range for 'global_batch': "
	               "'9223372036854775808'");
	expect_in_diag("m.yaml:11:16: error: integer out of range for 'micro_batch'");
	/* INT64_MAX itself is an integer; no error about devices. */
	cr_expect_null(strstr(diag_text, "'devices'"), "%s", diag_text);
	expect_invalid(DENSE_MODEL "training: {global_batch: 1}\n"
	                           "parallel: {devices: -9223372036854775809}\n"
	                           "hardware: bw1000\n",
	               "m.yaml:10:21: error: integer out of range for 'devices'");
}

/* A model whose attention scores overflow at seq_len, with extra model keys. */
#define SCORES_YAML(extra)                                                                         \
	"kiln: 1\n"                                                                                \
	"model:\n"                                                                                 \
	"  layers: 4\n"                                                                            \
	"  hidden: 64\n"                                                                           \
	"  ffn_hidden: 64\n"                                                                       \
	"  heads: 8\n"                                                                             \
	"  vocab: 100\n"                                                                           \
	"  seq_len: 2147483648\n" extra "training: {global_batch: 1}\n"                            \
	"parallel: {devices: 1}\n"                                                                 \
	"hardware: bw1000\n"

Test(frontend_rules, sizes_overflowing_64_bits)
{
	/* 2^31 * 2^31 * 8 * 1 * 4 = 2^67: the scores, at seq_len; flash (the
	 * default) names them as its work, eager as its stored bytes. */
	expect_invalid(SCORES_YAML(""),
	               "m.yaml:8:12: error: attention scores (flash attention stores none, but "
	               "prices its work by them) seq_len * seq_len * heads * micro_batch * 4 = "
	               "2147483648 * 2147483648 * 8 * 1 * 4 bytes reaches 2^62");
	cr_expect_eq(count(diag_text, "error:"), 1, "%s", diag_text);
	expect_invalid(SCORES_YAML("  attention: eager\n"),
	               "m.yaml:8:12: error: eager attention scores seq_len * seq_len * heads * "
	               "micro_batch * 4 = 2147483648 * 2147483648 * 8 * 1 * 4 bytes reaches 2^62");
	cr_expect_eq(count(diag_text, "error:"), 1, "%s", diag_text);
	/* 16 * 1 * 2^58 * 4 = 2^64: logits at vocab; the parameters (vocab *
	 * hidden dominates) overflow too, also at vocab. */
	expect_invalid(
	    "kiln: 1\n"
	    "model:\n"
	    "  layers: 4\n"
	    "  hidden: 64\n"
	    "  ffn_hidden: 64\n"
	    "  heads: 8\n"
	    "  vocab: 288230376151711744\n"
	    "  seq_len: 16\n"
	    "training: {global_batch: 1}\n"
	    "parallel: {devices: 1}\n"
	    "hardware: bw1000\n",
	    "m.yaml:7:10: error: fp32 logits seq_len * micro_batch * vocab * 4 = 16 * 1 * "
	    "288230376151711744 * 4 bytes reaches 2^62");
	expect_in_diag("m.yaml:7:10: error: parameter bytes layers");
	/* 16 * 1 * 2 * (2 * 2^55) * 4 * 1 = 2^62: expert activations at
	 * expert_ffn_hidden (max_factor defaults to 1 here: with ep 1 routing
	 * cannot load a rank beyond balance). */
	expect_invalid(
	    MOE_HEAD "  moe: {experts: 4, top_k: 2, expert_ffn_hidden: 36028797018963968}\n"
	             "training: {global_batch: 1}\n"
	             "parallel: {devices: 1}\n"
	             "hardware: bw1000\n",
	    "m.yaml:8:50: error: expert activations seq_len * micro_batch * top_k * "
	    "max(hidden, 2 * expert_ffn_hidden, 2 * ffn_hidden) * 4 * ceil(max_factor) = "
	    "16 * 1 * 2 * 72057594037927936 * 4 * 1 bytes reaches 2^62");
	/* 4 * (2^30)^2 * ... = 2^62 and more: parameters, at hidden. */
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 4\n"
	               "  hidden: 1073741824\n"
	               "  ffn_hidden: 64\n"
	               "  heads: 8\n"
	               "  vocab: 100\n"
	               "  seq_len: 16\n"
	               "training: {global_batch: 1}\n"
	               "parallel: {devices: 1}\n"
	               "hardware: bw1000\n",
	               "m.yaml:4:11: error: parameter bytes layers * (4 * hidden^2");
	cr_expect_eq(count(diag_text, "error:"), 1, "%s", diag_text);
}

Test(frontend_rules, attention_and_shared_expert_sizes_overflowing_64_bits)
{
	/* heads * (head_dim + rope) = 8 * 2^55 = 2^58; 16 * 1 * 2^58 * 4 = 2^64. */
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 4\n"
	               "  hidden: 64\n"
	               "  ffn_hidden: 64\n"
	               "  heads: 8\n"
	               "  head_dim: 36028797018963968\n"
	               "  vocab: 100\n"
	               "  seq_len: 16\n"
	               "training: {global_batch: 1}\n"
	               "parallel: {devices: 1}\n"
	               "hardware: bw1000\n",
	               "m.yaml:6:10: error: activation seq_len * micro_batch * heads * (head_dim + "
	               "rope_head_dim) * 4 = 16 * 1 * 288230376151711744 * 4 bytes reaches 2^62");
	/* 2^52 shared experts: their parameters, 4 * 3 * 64 * 32 * 2^52 * 18
	 * bytes, reach 2^62 before their activation row does. */
	expect_invalid(MOE_HEAD "  moe: {experts: 4, shared_experts: 4503599627370496, top_k: 2, "
	                        "expert_ffn_hidden: 32}\n"
	                        "training: {global_batch: 1}\n"
	                        "parallel: {devices: 1}\n"
	                        "hardware: bw1000\n",
	               "error: parameter bytes layers");
	expect_in_diag("experts 4 + 4503599627370496");
	/* MLA ranks: layers * (kv_lora_rank * (hidden + heads * widths)) * 18
	 * with kv_lora_rank = 2^50 reaches 2^62 long before any row does. */
	expect_invalid(MOE_HEAD "  mla: {kv_lora_rank: 1125899906842624, rope_head_dim: 8}\n"
	                        "training: {global_batch: 1}\n"
	                        "parallel: {devices: 1}\n"
	                        "hardware: bw1000\n",
	               "error: attention and shared-expert parameter bytes reach 2^62");
}

Test(frontend_rules, all_errors_reported_in_position_order)
{
	/* The semantic error (line 7) is found after the unknown key (line 12)
	 * and the type error (line 9), but printed in line order. */
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 4\n"
	               "  hidden: 64\n"
	               "  ffn_hidden: 64\n"
	               "  heads: 64\n"
	               "  kv_heads: 6\n"
	               "  vocab: 100\n"
	               "  seq_len: x\n"
	               "training: {global_batch: 1}\n"
	               "parallel: {devices: 1}\n"
	               "hardwre: bw1000\n",
	               "m.yaml:7:13: error: kv_heads (6) must divide heads (64)");
	const char *a = strstr(diag_text, "m.yaml:1:1: error: missing required key 'hardware'");
	const char *b = strstr(diag_text, "m.yaml:7:13:");
	const char *c = strstr(diag_text, "m.yaml:9:12: error: expected an integer for 'seq_len'");
	const char *d = strstr(diag_text, "m.yaml:12:1: error: unknown key 'hardwre' in the top "
	                                  "level; did you mean 'hardware'?");
	cr_assert(a && b && c && d, "%s", diag_text);
	cr_expect(a < b && b < c && c < d, "%s", diag_text);
	cr_expect_eq(count(diag_text, "error:"), 4, "%s", diag_text);
}

Test(frontend_rules, unknown_keys_suggest)
{
	expect_invalid(DENSE_MODEL "  layer: 4\n"
	                           "  colour: blue\n"
	                           "  tp: 2\n"
	                           "  Vocab: 3\n"
	                           "training: {global_batch: 1, micro: 1}\n"
	                           "parallel: {devices: 1}\n"
	                           "hardware: bw1000\n",
	               "m.yaml:9:3: error: unknown key 'layer' in model; did you mean 'layers'?");
	expect_in_diag("m.yaml:10:3: error: unknown key 'colour' in model\n");
	expect_in_diag("m.yaml:11:3: error: unknown key 'tp' in model\n"
	               "m.yaml:11:3: note: 'tp' is a key of parallel\n");
	expect_in_diag("m.yaml:12:3: error: unknown key 'Vocab' in model; did you mean 'vocab'?");
	expect_in_diag("m.yaml:13:29: error: unknown key 'micro' in training; did you mean "
	               "'micro_batch'?");
}

Test(frontend_rules, duplicate_keys_note_the_first)
{
	expect_invalid(DENSE_MODEL "  heads: 8\n"
	                           "training: {global_batch: 1}\n"
	                           "parallel: {devices: 1}\n"
	                           "hardware: bw1000\n"
	                           "training: {global_batch: 2}\n",
	               "m.yaml:9:3: error: duplicate key 'heads' in model\n"
	               "m.yaml:6:3: note: 'heads' was first set here\n");
	expect_in_diag("m.yaml:13:1: error: duplicate key 'training' in the top level\n"
	               "m.yaml:10:1: note: 'training' was first set here\n");
}

Test(frontend_rules, too_many_errors_are_capped)
{
	/* 150 unknown keys plus 5 missing: kiln, model, training, parallel,
	 * hardware (all at 1:1). */
	char text[4096];
	size_t o = 0;
	for (int i = 0; i < 150; i++)
		o += (size_t)snprintf(text + o, sizeof(text) - o, "zz%d: 1\n", i);
	expect_invalid(text, "m.yaml:1:1: error: unknown key 'zz0' in the top level");
	cr_expect_eq(count(diag_text, ": error: "), KILN_FRONTEND_MAX_ERRORS + 1, "%s", diag_text);
	expect_in_diag("m.yaml: error: too many errors (155); only the first 100 are shown\n");
	/* The kept ones are the earliest: the 5 at 1:1, then lines 1..95, so
	 * zz94 is the last shown. */
	expect_in_diag("m.yaml:95:1: error: unknown key 'zz94'");
	cr_expect_null(strstr(diag_text, "'zz95'"), "%s", diag_text);
}

/* ------------------------------------------------------------ hostile input */

TestSuite(frontend_hostile, .init = setup, .fini = teardown);

Test(frontend_hostile, empty_and_comment_only)
{
	expect_invalid("", "m.yaml:1:1: error: empty document, expected a mapping starting with "
	                   "`kiln: 1`");
	expect_invalid("# nothing\n\n", "m.yaml:1:1: error: empty document");
	expect_invalid("---\n", "m.yaml:1:1: error: empty document");
	kiln_model *m;
	cr_expect_eq(kiln_frontend_load_buffer("n.yaml", NULL, 0, arena, NULL, &m),
	             KILN_FRONTEND_INVALID);
}

Test(frontend_hostile, binary_garbage)
{
	static const char bytes[] = {'k',        'i',  'l',        'n', ':', ' ',
	                             '1',        '\n', 'a',        ':', ' ', (char)0xff,
	                             (char)0xfe, '\0', (char)0x80, 'x', '\n'};
	kiln_model *m;
	int rc = load_n(bytes, sizeof(bytes), &m);
	cr_assert_eq(rc, KILN_FRONTEND_INVALID, "%s", diag_text);
	expect_in_diag("m.yaml:2:4: error: not valid YAML text:");
	static const char nul[] = {'k', 'i', 'l', 'n', ':', '\0', '1'};
	rc = load_n(nul, sizeof(nul), &m);
	cr_assert_eq(rc, KILN_FRONTEND_INVALID, "%s", diag_text);
	expect_in_diag(
	    "m.yaml:1:6: error: not valid YAML text: control characters are not allowed");
	/* Every byte value, in a loop, never crashes. */
	char all[256];
	for (int i = 0; i < 256; i++)
		all[i] = (char)(255 - i);
	cr_expect_eq(load_n(all, sizeof(all), &m), KILN_FRONTEND_INVALID);
	cr_expect_gt(diag_len, 0);
}

Test(frontend_hostile, huge_file_rejected_before_parsing)
{
	char path[] = "/tmp/kiln-fe-big-XXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	FILE *f = fdopen(fd, "wb");
	cr_assert_not_null(f);
	static char chunk[1 << 20];
	for (size_t i = 0; i < sizeof(chunk); i += 16)
		memcpy(chunk + i, "# comment line\n\n", 16);
	for (int i = 0; i < 50; i++)
		cr_assert_eq(fwrite(chunk, 1, sizeof(chunk), f), sizeof(chunk));
	cr_assert_eq(fclose(f), 0);
	kiln_model *m;
	int rc = load_path(path, &m);
	unlink(path);
	cr_assert_eq(rc, KILN_FRONTEND_INVALID, "%s", diag_text);
	char want[128];
	snprintf(want, sizeof(want), "%s: error: '%s' is larger than the limit of 1048576 bytes",
	         path, path);
	expect_in_diag(want);
	/* The same through a buffer one byte over the limit. */
	rc = load_n(chunk, KILN_FRONTEND_MAX_FILE_BYTES + 1, &m);
	cr_assert_eq(rc, KILN_FRONTEND_INVALID);
	expect_in_diag("m.yaml: error: input of 1048577 bytes is larger than the limit of 1048576 "
	               "bytes");
}

Test(frontend_hostile, deep_nesting)
{
	static char text[40010];
	memcpy(text, "kiln: ", 6);
	memset(text + 6, '[', 10000);
	text[10006] = '\0';
	/* The root mapping is level 1; the 32nd '[' would be level 33, at column
	 * 6 + 32. */
	expect_invalid(text, "m.yaml:1:38: error: nesting too deep: more than 32 levels");
	for (int i = 0; i < 10000; i++)
		memcpy(text + 4 * i, "{a: ", 4);
	text[40000] = '\0';
	/* Each level is 4 columns wide: the 33rd '{' is at column 129. */
	expect_invalid(text, "m.yaml:1:129: error: nesting too deep");
	/* Block mappings, one space deeper per line, 100 levels. */
	size_t o = 0;
	for (int i = 0; i < 100; i++) {
		memset(text + o, ' ', (size_t)i);
		o += (size_t)i;
		memcpy(text + o, "a:\n", 3);
		o += 3;
	}
	text[o] = '\0';
	expect_invalid(text, "m.yaml:33:33: error: nesting too deep");
}

Test(frontend_hostile, alias_bomb)
{
	expect_invalid("a: &a [x, x, x, x, x, x, x, x, x, x]\n"
	               "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
	               "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
	               "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
	               "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
	               "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
	               "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n"
	               "h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
	               "i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\n",
	               "error: document too large: more than 100000 nodes after expanding aliases");
	/* Sizes are 11, 111, 1111, 11111 (plus keys): line 5 crosses the limit. */
	cr_expect(strncmp(diag_text, "m.yaml:5:", 9) == 0, "%s", diag_text);
	cr_expect_eq(count(diag_text, "error:"), 1, "%s", diag_text);
}

Test(frontend_hostile, aliases_anchors_tags_documents)
{
	expect_invalid("kiln: *nope\n", "m.yaml:1:7: error: unknown alias 'nope'");
	cr_expect_eq(count(diag_text, "error:"), 5, "one alias error, then only missing keys:\n%s",
	             diag_text);
	expect_invalid("a: &x [1, *x]\n", "m.yaml:1:11: error: alias 'x' refers to a node that "
	                                  "contains it");
	expect_invalid("kiln: !!int 1\n", "m.yaml:1:7: error: YAML tags are not supported");
	expect_invalid("kiln: 1\n---\nkiln: 1\n",
	               "m.yaml:2:1: error: more than one YAML document in the file");
	expect_invalid("- kiln\n- 1\n", "m.yaml:1:1: error: the top level must be a mapping "
	                                "starting with `kiln: 1`, not a sequence");
	expect_invalid("kiln\n", "m.yaml:1:1: error: the top level must be a mapping starting with "
	                         "`kiln: 1`, not 'kiln'");
	expect_invalid("kiln: [1\n", "m.yaml:2:1: error: not valid YAML:");
	expect_invalid("{[a]: 1}\n", "m.yaml:1:2: error: keys in the top level must be plain "
	                             "names, not a sequence");

	char text[8192];
	size_t o = 0;
	for (int i = 0; i < KILN_FRONTEND_MAX_ANCHORS + 1; i++)
		o += (size_t)snprintf(text + o, sizeof(text) - o, "k%d: &a%d 1\n", i, i);
	expect_invalid(text, "m.yaml:257:7: error: too many anchors (the limit is 256)");
}

/* ------------------------------------------------------------ hardware */

TestSuite(frontend_hardware, .init = setup, .fini = teardown);

Test(frontend_hardware, shipped_profiles)
{
	cr_assert_eq(kiln_frontend_hardware_count(), 4);
	const char *names[] = {"bw1000", "h100-sxm", "h200", "mi300x"};
	for (size_t i = 0; i < 4; i++)
		cr_expect_str_eq(kiln_frontend_hardware_name(i), names[i]);
	cr_expect_null(kiln_frontend_hardware_name(4));

	kiln_hardware hw;
	cr_assert_eq(kiln_frontend_load_hardware("bw1000", arena, stderr, &hw), KILN_FRONTEND_OK);
	/* DESIGN.md 5.1, figure by figure. */
	cr_expect_str_eq(hw.name, "bw1000");
	cr_expect_eq(hw.memory_gib, 64);
	cr_expect_eq(hw.reserved_gib, 4);
	cr_expect_eq(hw.peak_tflops, 480);
	cr_expect_eq(hw.gemm_efficiency, 0.55);
	cr_expect_eq(hw.hbm_gbps, 1600);
	cr_expect_eq(hw.h2d_gbps, 24);
	cr_expect_eq(hw.d2h_gbps, 24);
	cr_expect_eq(hw.host_memory_gib, 1024);
	cr_expect_eq(hw.devices_per_node, 8);
	cr_expect_eq(hw.intra_node_gbps, 184);
	cr_expect_eq(hw.inter_node_gbps, 25);

	cr_assert_eq(kiln_frontend_load_hardware("h100-sxm", arena, stderr, &hw), KILN_FRONTEND_OK);
	cr_expect_eq(hw.memory_gib, 80);
	cr_expect_eq(hw.peak_tflops, 989);
	cr_expect_eq(hw.hbm_gbps, 3350);
	cr_expect_eq(hw.h2d_gbps, 35);
	cr_expect_eq(hw.d2h_gbps, 50);
	cr_expect_eq(hw.intra_node_gbps, 450);
	cr_expect_eq(hw.inter_node_gbps, 50);
	cr_assert_eq(kiln_frontend_load_hardware("h200", arena, stderr, &hw), KILN_FRONTEND_OK);
	cr_expect_eq(hw.memory_gib, 140);
	cr_expect_eq(hw.hbm_gbps, 4800);
	cr_assert_eq(kiln_frontend_load_hardware("mi300x", arena, stderr, &hw), KILN_FRONTEND_OK);
	cr_expect_eq(hw.memory_gib, 192);
	cr_expect_eq(hw.peak_tflops, 1307);
	cr_expect_eq(hw.hbm_gbps, 5300);
	cr_expect_eq(hw.gemm_efficiency, 0.5);
	cr_expect_eq(hw.intra_node_gbps, 448);
	cr_expect_str_eq(hw.source, "<shipped:mi300x>");
}

Test(frontend_hardware, unknown_shipped_name)
{
	expect_invalid(DENSE_MODEL "training: {global_batch: 1}\n"
	                           "parallel: {devices: 1}\n"
	                           "hardware: h100\n",
	               "m.yaml:11:11: error: unknown hardware profile 'h100'; did you mean "
	               "'h100-sxm'?\n"
	               "m.yaml:11:11: note: shipped profiles: bw1000, h100-sxm, h200, mi300x");
	expect_invalid(DENSE_MODEL "training: {global_batch: 1}\n"
	                           "parallel: {devices: 1}\n"
	                           "hardware: h210\n",
	               "m.yaml:11:11: error: unknown hardware profile 'h210'; did you mean "
	               "'h200'?");
	/* mi250 -> mi300x needs 3 edits: no suggestion. */
	expect_invalid(DENSE_MODEL "training: {global_batch: 1}\n"
	                           "parallel: {devices: 1}\n"
	                           "hardware: mi250\n",
	               "m.yaml:11:11: error: unknown hardware profile 'mi250'\n");
}

Test(frontend_hardware, inline_profile)
{
	kiln_model *m = load_ok(DENSE_MODEL "training: {global_batch: 1}\n"
	                                    "parallel: {devices: 1}\n"
	                                    "hardware:\n"
	                                    "  memory_gib: 32\n"
	                                    "  reserved_gib: 2.5\n"
	                                    "  peak_tflops: 100\n"
	                                    "  gemm_efficiency: 1\n"
	                                    "  hbm_gbps: 900\n"
	                                    "  h2d_gbps: 12\n"
	                                    "  d2h_gbps: 13\n"
	                                    "  host_memory_gib: 256\n"
	                                    "  devices_per_node: 4\n"
	                                    "  intra_node_gbps: 100\n"
	                                    "  inter_node_gbps: 12.5\n");
	cr_expect_str_eq(m->hw.name, "inline");
	cr_expect_str_eq(m->hw.source, "m.yaml");
	cr_expect_eq(m->hw.reserved_gib, 2.5);
	cr_expect_eq(m->hw.gemm_efficiency, 1.0);
	cr_expect_eq(m->hw.devices_per_node, 4);
	cr_expect_eq(m->hw.inter_node_gbps, 12.5);

	expect_invalid(DENSE_MODEL "training: {global_batch: 1}\n"
	                           "parallel: {devices: 1}\n"
	                           "hardware:\n"
	                           "  kiln_hardware: 1\n"
	                           "  name: small\n"
	                           "  memory_gib: 64\n"
	                           "  reserved_gib: 80\n"
	                           "  peak_tflops: 0\n"
	                           "  gemm_efficiency: 1.5\n"
	                           "  hbm_gbps: .inf\n"
	                           "  h2d_gbps: 12\n"
	                           "  d2h_gbps: 13\n"
	                           "  host_memory_gib: 256\n"
	                           "  devices_per_node: 4\n"
	                           "  intra_node_gbps: 100\n"
	                           "  inter_nodes_gbps: 12.5\n",
	               "m.yaml:15:17: error: reserved_gib (80) must be less than memory_gib (64)");
	expect_in_diag("m.yaml:16:16: error: peak_tflops must be positive, got '0'");
	expect_in_diag("m.yaml:17:20: error: gemm_efficiency (1.5) is out of range [0.001, 1]");
	expect_in_diag("m.yaml:18:13: error: expected a finite number for 'hbm_gbps', got '.inf'");
	expect_in_diag("m.yaml:24:3: error: unknown key 'inter_nodes_gbps' in hardware; did you "
	               "mean 'inter_node_gbps'?");
	expect_in_diag("m.yaml:11:1: error: missing required key 'inter_node_gbps' in hardware");
}

/* A temporary directory holding model.yaml and hw/NAME; removed by
 * rm_tree. */
static char tmpdir[64];

static void make_tree(const char *model, const char *hw_name, const char *hw)
{
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kiln-fe-XXXXXX");
	cr_assert_not_null(mkdtemp(tmpdir));
	char path[256];
	snprintf(path, sizeof(path), "%s/hw", tmpdir);
	cr_assert_eq(mkdir(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/model.yaml", tmpdir);
	write_file(path, model, strlen(model));
	if (hw) {
		snprintf(path, sizeof(path), "%s/hw/%s", tmpdir, hw_name);
		write_file(path, hw, strlen(hw));
	}
}

static void rm_tree(const char *hw_name)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/hw/%s", tmpdir, hw_name);
	unlink(path);
	snprintf(path, sizeof(path), "%s/model.yaml", tmpdir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/hw", tmpdir);
	rmdir(path);
	rmdir(tmpdir);
}

#define HW_FILE                                                                                    \
	"kiln_hardware: 1\n"                                                                       \
	"name: lab-gpu\n"                                                                          \
	"memory_gib: 48\n"                                                                         \
	"reserved_gib: 3\n"                                                                        \
	"peak_tflops: 200\n"                                                                       \
	"gemm_efficiency: 0.7\n"                                                                   \
	"hbm_gbps: 1000\n"                                                                         \
	"h2d_gbps: 20\n"                                                                           \
	"d2h_gbps: 20\n"                                                                           \
	"host_memory_gib: 512\n"                                                                   \
	"devices_per_node: 4\n"                                                                    \
	"intra_node_gbps: 100\n"

Test(frontend_hardware, relative_path_resolves_against_model_dir)
{
	make_tree(DENSE_MODEL "training: {global_batch: 1}\n"
	                      "parallel: {devices: 1}\n"
	                      "hardware: hw/lab.yaml\n",
	          "lab.yaml", HW_FILE "inter_node_gbps: 10\n");
	char path[256];
	snprintf(path, sizeof(path), "%s/model.yaml", tmpdir);
	kiln_model *m = NULL;
	int rc = load_path(path, &m);
	char hw_path[256];
	snprintf(hw_path, sizeof(hw_path), "%s/hw/lab.yaml", tmpdir);
	rm_tree("lab.yaml");
	cr_assert_eq(rc, KILN_FRONTEND_OK, "%s", diag_text);
	cr_expect_str_eq(m->name, "model");
	cr_expect_str_eq(m->hw.name, "lab-gpu");
	cr_expect_str_eq(m->hw.source, hw_path);
	cr_expect_eq(m->hw.memory_gib, 48);
	cr_expect_eq(m->hw.inter_node_gbps, 10);
}

Test(frontend_hardware, errors_in_profile_file_name_that_file)
{
	make_tree(DENSE_MODEL "training: {global_batch: 1}\n"
	                      "parallel: {devices: 1}\n"
	                      "hardware: hw/bad.yml\n",
	          "bad.yml", HW_FILE "inter_node_gbps: fast\n");
	char path[256], want[512];
	snprintf(path, sizeof(path), "%s/model.yaml", tmpdir);
	kiln_model *m = NULL;
	int rc = load_path(path, &m);
	rm_tree("bad.yml");
	cr_assert_eq(rc, KILN_FRONTEND_INVALID, "%s", diag_text);
	snprintf(want, sizeof(want),
	         "%s/hw/bad.yml:13:18: error: expected a finite number for 'inter_node_gbps', got "
	         "'fast'",
	         tmpdir);
	expect_in_diag(want);

	/* A profile file without its version line, and a missing file. */
	make_tree(DENSE_MODEL "training: {global_batch: 1}\n"
	                      "parallel: {devices: 1}\n"
	                      "hardware: hw/nover.yaml\n",
	          "nover.yaml", HW_FILE + 17);
	snprintf(path, sizeof(path), "%s/model.yaml", tmpdir);
	rc = load_path(path, &m);
	rm_tree("nover.yaml");
	cr_assert_eq(rc, KILN_FRONTEND_INVALID, "%s", diag_text);
	snprintf(want, sizeof(want),
	         "%s/hw/nover.yaml:1:1: error: missing required key 'kiln_hardware' in the "
	         "hardware profile",
	         tmpdir);
	expect_in_diag(want);
	snprintf(want, sizeof(want),
	         "%s/hw/nover.yaml:1:1: error: missing required key "
	         "'inter_node_gbps' in the hardware profile",
	         tmpdir);
	expect_in_diag(want);

	make_tree(DENSE_MODEL "training: {global_batch: 1}\n"
	                      "parallel: {devices: 1}\n"
	                      "hardware: hw/none.yaml\n",
	          "none.yaml", NULL);
	snprintf(path, sizeof(path), "%s/model.yaml", tmpdir);
	rc = load_path(path, &m);
	rm_tree("none.yaml");
	cr_assert_eq(rc, KILN_FRONTEND_INVALID, "%s", diag_text);
	snprintf(want, sizeof(want),
	         "%s:11:11: error: cannot read '%s/hw/none.yaml': No such file or directory", path,
	         tmpdir);
	expect_in_diag(want);
}

Test(frontend_hardware, load_hardware_by_path_and_missing_model_file)
{
	make_tree("unused\n", "p.yaml", HW_FILE "inter_node_gbps: 10\n");
	char path[256];
	snprintf(path, sizeof(path), "%s/hw/p.yaml", tmpdir);
	kiln_hardware hw;
	int rc = kiln_frontend_load_hardware(path, arena, stderr, &hw);
	rm_tree("p.yaml");
	cr_assert_eq(rc, KILN_FRONTEND_OK);
	cr_expect_str_eq(hw.name, "lab-gpu");
	cr_expect_eq(hw.devices_per_node, 4);

	cr_expect_eq(kiln_frontend_load_hardware("nosuch", arena, NULL, &hw),
	             KILN_FRONTEND_INVALID);
	kiln_model *m;
	rc = load_path("/nonexistent/kiln/model.yaml", &m);
	cr_assert_eq(rc, KILN_FRONTEND_INVALID);
	expect_in_diag("/nonexistent/kiln/model.yaml: error: cannot read "
	               "'/nonexistent/kiln/model.yaml': No such file or directory");
}

Test(frontend_rules, remaining_model_rules)
{
	expect_invalid(
	    DENSE_MODEL "  dense_layers: 3\n"
	                "training: {global_batch: 1}\n"
	                "parallel: {devices: 1}\n"
	                "hardware: bw1000\n",
	    "m.yaml:9:17: error: dense_layers (3) needs a moe section; without moe all 4 "
	    "layers are dense");
	expect_invalid("kiln: 1\n"
	               "name: ''\n"
	               "model:\n"
	               "  layers: 100001\n"
	               "  hidden: 64\n"
	               "  ffn_hidden: 64\n"
	               "  heads: 8\n"
	               "  vocab: 100\n"
	               "  seq_len: 16\n"
	               "  mla: {q_lora_rank: 8}\n"
	               "training: {global_batch: 1}\n"
	               "parallel: {devices: 1}\n"
	               "hardware: [bw1000]\n",
	               "m.yaml:2:7: error: name must be a non-empty string, got ''");
	expect_in_diag("m.yaml:4:11: error: layers (100001) exceeds the limit of 4096");
	expect_in_diag("m.yaml:10:3: error: missing required key 'kv_lora_rank' in model.mla");
	expect_in_diag("m.yaml:10:3: error: missing required key 'rope_head_dim' in model.mla");
	expect_in_diag("m.yaml:13:11: error: hardware must be a profile name, a path or a mapping, "
	               "got a sequence");
	expect_invalid(MOE_HEAD "  moe: {top_k: 1}\n"
	                        "training: {global_batch: 1}\n"
	                        "parallel: {devices: 1}\n"
	                        "hardware: {kiln_hardware: 2}\n",
	               "m.yaml:8:3: error: missing required key 'experts' in model.moe");
	expect_in_diag("m.yaml:8:3: error: missing required key 'expert_ffn_hidden' in model.moe");
	expect_in_diag("m.yaml:11:27: error: unsupported kiln_hardware version 2");
	expect_in_diag("m.yaml:11:1: error: missing required key 'memory_gib' in hardware");
}

Test(frontend_hardware, figures_out_of_range)
{
	/* 1e-300 TFLOP/s would make every time infinite; 1e308 GiB overflows
	 * the byte counts: both are typos. */
	expect_invalid(DENSE_MODEL "training: {global_batch: 1}\n"
	                           "parallel: {devices: 1}\n"
	                           "hardware:\n"
	                           "  memory_gib: 1e308\n"
	                           "  reserved_gib: 2.5\n"
	                           "  peak_tflops: 1e-300\n"
	                           "  gemm_efficiency: 0.5\n"
	                           "  hbm_gbps: 900\n"
	                           "  h2d_gbps: 12\n"
	                           "  d2h_gbps: 13\n"
	                           "  host_memory_gib: 256\n"
	                           "  devices_per_node: 4\n"
	                           "  intra_node_gbps: 100\n"
	                           "  inter_node_gbps: 12.5\n",
	               "m.yaml:12:15: error: memory_gib (1e+308) is out of range [1e-06, 1e+07]");
	expect_in_diag("m.yaml:14:16: error: peak_tflops (1e-300) is out of range [1e-06, 1e+07]");
}

Test(frontend_rules, max_factor_beyond_what_routing_can_produce)
{
	/* ep 2, 8 experts (4 per rank), top-2: a rank receives at most
	 * 2 * min(2, 4) = 4 rows per token slot pair, r_max = 2 * 2 / 2 = 2. */
	expect_invalid(MOE_HEAD "  moe: {experts: 8, top_k: 2, expert_ffn_hidden: 32}\n"
	                        "training: {global_batch: 2}\n"
	                        "parallel: {devices: 2, ep: 2}\n"
	                        "hardware: bw1000\n"
	                        "load: {max_factor: 2.5}\n",
	               "m.yaml:12:20: error: max_factor (2.5) exceeds the largest load routing can "
	               "produce with this layout: ep * min(top_k, experts / ep) / top_k = 2 * 2 / 2 "
	               "= 2");
	/* Without load.max_factor the default, 3, is cut to that bound. */
	kiln_model *m = load_ok(MOE_HEAD "  moe: {experts: 8, top_k: 2, expert_ffn_hidden: 32}\n"
	                                 "training: {global_batch: 2}\n"
	                                 "parallel: {devices: 2, ep: 2}\n"
	                                 "hardware: bw1000\n");
	cr_expect_eq(m->max_factor, 2.0);
	expect_invalid(MOE_HEAD "  moe: {experts: 64, top_k: 2, expert_ffn_hidden: 32}\n"
	                        "training: {global_batch: 8}\n"
	                        "parallel: {devices: 8, ep: 8}\n"
	                        "hardware: bw1000\n"
	                        "load: {max_factor: 17}\n",
	               "m.yaml:12:20: error: max_factor (17) must be at most 16");
}

/* An escape in a double-quoted scalar makes a control character after
 * libyaml's reader has checked the text (which refuses raw ones): ESC ] 0 ;
 * title BEL would retitle the terminal that check prints the name to. Such
 * text is refused where the scalar starts, like any other bad value. */
Test(frontend_rules, escapes_that_make_control_characters_are_refused)
{
	expect_invalid("kiln: 1\n"
	               "name: \"\\e]0;title\\a\"\n" /* line 2, the scalar at column 7 */
	               "model:\n"
	               "  layers: 4\n",
	               "m.yaml:2:7: error: control character U+001B in '\\x1b]0;title\\x07'; text "
	               "values must be printable");
	/* NUL (which would cut the name short), a C1 control (CSI, U+009B), a
	 * line break from a block scalar, a tab, DEL, a key made by an escape. */
	expect_invalid("kiln: 1\n"
	               "name: \"a\\0b\"\n"
	               "hardware: \"bw\\x9b\"\n"
	               "model: {layers: 4}\n"
	               "training:\n"
	               "  dtype: |\n"
	               "    bf16\n"
	               "parallel: {schedule: \"1f1b\\t\"}\n"
	               "\"load\\x7f\": 1\n",
	               "m.yaml:2:7: error: control character U+0000 in 'a\\x00b'");
	expect_in_diag("m.yaml:3:11: error: control character U+009B in 'bw\\xc2\\x9b'");
	expect_in_diag("m.yaml:6:10: error: control character U+000A in 'bf16\\x0a'");
	expect_in_diag("m.yaml:8:22: error: control character U+0009 in '1f1b\\x09'");
	expect_in_diag("m.yaml:9:1: error: control character U+007F in 'load\\x7f'");
	/* Printable Unicode, escaped or not, is a name like any other. */
	kiln_model *m = load_ok(DENSE_MODEL "training: {global_batch: 1}\n"
	                                    "parallel: {devices: 1}\n"
	                                    "hardware: bw1000\n"
	                                    "name: \"caf\\u00e9 \xe2\x9c\x93\"\n");
	cr_expect_str_eq(m->name, "caf\xc3\xa9 \xe2\x9c\x93");
}

/* The limit on layers is the code's KILN_FRONTEND_MAX_LAYERS, and
 * docs/model-format.md states that number wherever it states the limit
 * (its key table and its rule table once disagreed: 4096 and 100000). */
Test(frontend_rules, layer_limit_is_the_one_the_docs_state)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/docs/model-format.md", KILN_SOURCE_DIR);
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f);
	static char doc[1 << 20];
	size_t n = fread(doc, 1, sizeof doc - 1, f);
	fclose(f);
	doc[n] = '\0';
	/* Every line that states the limit (the key table names the constant,
	 * the rule table starts "| `layers` <="): each number it gives after
	 * "at most ", "<= " or "limit of " is the code's. */
	int found = 0;
	for (char *line = doc; line && *line;) {
		char *nl = strchr(line, '\n');
		if (nl)
			*nl = '\0';
		if (strstr(line, "KILN_FRONTEND_MAX_LAYERS") ||
		    strncmp(line, "| `layers` <=", 13) == 0) {
			found++;
			const char *before[] = {"at most ", "<= ", "limit of "};
			for (int k = 0; k < 3; k++)
				for (const char *p = strstr(line, before[k]); p;
				     p = strstr(p + 1, before[k])) {
					long v = 0;
					for (const char *d = p + strlen(before[k]);
					     *d >= '0' && *d <= '9'; d++)
						v = v * 10 + (*d - '0');
					cr_expect_eq(v, KILN_FRONTEND_MAX_LAYERS,
					             "model-format.md states %ld, the code %d: %s",
					             v, KILN_FRONTEND_MAX_LAYERS, line);
				}
		}
		line = nl ? nl + 1 : NULL;
	}
	cr_assert_geq(found, 2, "the key table and the rule table state the limit");
	/* And the code's message is the one the rule table gives: 4096 + 1 layers. */
	expect_invalid("kiln: 1\n"
	               "model:\n"
	               "  layers: 4097\n",
	               "m.yaml:3:11: error: layers (4097) exceeds the limit of 4096");
	kiln_model *m = NULL;
	load("kiln: 1\nmodel:\n  layers: 4096\n", &m);
	cr_expect_null(strstr(diag_text, "exceeds the limit"), "%s", diag_text);
}

/* ------------------------------------------- issue 15, item 2: layout keys */

TestSuite(frontend_megatron, .init = setup, .fini = teardown);

/* A MoE model on 16 devices, with room for one more parallel: line (line 11)
 * and a megatron: section from line 12. */
#define MG_HEAD                                                                                    \
	"kiln: 1\n"                                                                                \
	"model:\n"                                                                                 \
	"  layers: 12\n"                                                                           \
	"  hidden: 64\n"                                                                           \
	"  heads: 8\n"                                                                             \
	"  vocab: 1000\n"                                                                          \
	"  seq_len: 128\n"                                                                         \
	"  moe: {experts: 8, top_k: 2, expert_ffn_hidden: 32}\n"                                   \
	"training: {global_batch: 64}\n"                                                           \
	"hardware: h100-sxm\n"

Test(frontend_megatron, defaults_match_megatron_core)
{
	kiln_model *m = load_ok(MG_HEAD "parallel: {devices: 16, pp: 2, ep: 8}\n");
	cr_expect_eq(m->dispatcher, KILN_DISPATCH_ALLTOALL);
	cr_expect(!m->overlap_ep_comm);
	cr_expect(!m->account_for_embedding && !m->account_for_loss);
	cr_expect_eq(m->megatron.recompute, KILN_RECOMPUTE_NONE);
	cr_expect_eq(m->megatron.capacity_factor, 0.0); /* dropless */
	cr_expect_eq(m->megatron.mtp_num_layers, 0);
	/* Selective recompute without a module list recomputes core_attn, as
	 * Megatron-Core's TransformerConfig defaults recompute_modules. */
	m = load_ok(MG_HEAD "parallel: {devices: 16, pp: 2, ep: 8, dispatcher: deepep}\n"
	                    "megatron: {recompute_granularity: selective}\n");
	cr_expect_eq(m->dispatcher, KILN_DISPATCH_DEEPEP);
	cr_expect_eq(m->megatron.recompute, KILN_RECOMPUTE_SELECTIVE);
	cr_expect_eq(m->megatron.recompute_modules, KILN_MRC(CORE_ATTN));
	m = load_ok(MG_HEAD "parallel: {devices: 16, ep: 8, dispatcher: hybridep, "
	                    "overlap_ep_comm: true}\n"
	                    "megatron:\n"
	                    "  recompute_granularity: selective\n"
	                    "  recompute_modules: [moe_act, layernorm]\n"
	                    "  offload_modules: [expert_fc1]\n"
	                    "  moe_expert_capacity_factor: 1.25\n"
	                    "  moe_pad_expert_input_to_capacity: true\n"
	                    "  moe_router_force_load_balancing: true\n");
	cr_expect_eq(m->dispatcher, KILN_DISPATCH_HYBRIDEP);
	cr_expect(m->overlap_ep_comm);
	cr_expect_eq(m->megatron.recompute_modules, KILN_MRC(MOE_ACT) | KILN_MRC(LAYERNORM));
	cr_expect_eq(m->megatron.offload_modules, KILN_MOF(EXPERT_FC1));
	cr_expect_float_eq(m->megatron.capacity_factor, 1.25, 1e-12);
	cr_expect(m->megatron.pad_to_capacity && m->megatron.force_load_balancing);
}

/* Fine-grained offloading's tuning keys (transformer_config.py:1343-1362)
 * and Megatron-Core's rules for them (:2176-2184): the fraction in [0, 1],
 * the delta non-negative; both only beside offload_modules; the minimum
 * size alone tells the recipe search what Megatron would offload. */
Test(frontend_megatron, offload_tuning_keys)
{
	kiln_model *m = load_ok(MG_HEAD "parallel: {devices: 16, pp: 2, ep: 8}\n"
	                                "megatron:\n"
	                                "  offload_modules: [core_attn, expert_fc1]\n"
	                                "  activation_offload_fraction: 0.8\n"
	                                "  delta_offload_bytes_across_pp_ranks: 1073741824\n"
	                                "  min_offloaded_tensor_size: 4096\n");
	cr_expect(m->megatron.offload_fraction_set);
	cr_expect_float_eq(m->megatron.offload_fraction, 0.8, 1e-15);
	cr_expect_eq(m->megatron.delta_offload_bytes, 1073741824);
	cr_expect(m->megatron.min_offloaded_set);
	cr_expect_eq(m->megatron.min_offloaded_elements, 4096);
	char fl[512];
	cr_assert_geq(kiln_megatron_flags_format(&m->megatron, fl, sizeof fl), 0);
	cr_expect_str_eq(fl, "--fine-grained-activation-offloading --offload-modules core_attn "
	                     "expert_fc1 --min-offloaded-tensor-size 4096 "
	                     "--activation-offload-fraction 0.8 "
	                     "--delta-offload-bytes-across-pp-ranks 1073741824");
	/* Absent: Megatron's defaults (fraction 1, no delta, 1M elements). */
	m = load_ok(MG_HEAD "parallel: {devices: 16, pp: 2, ep: 8}\n"
	                    "megatron: {min_offloaded_tensor_size: 0}\n");
	cr_expect(!m->megatron.offload_fraction_set);
	cr_expect_float_eq(kiln_megatron_fraction(&m->megatron), 1.0, 0);
	cr_expect_float_eq(kiln_megatron_min_offloaded(&m->megatron), 0.0, 0);
	expect_invalid(MG_HEAD "parallel: {devices: 16, ep: 8}\n"
	                       "megatron: {offload_modules: [core_attn], "
	                       "activation_offload_fraction: 1.5}\n",
	               "error: activation_offload_fraction must be in [0, 1]");
	expect_invalid(MG_HEAD "parallel: {devices: 16, ep: 8}\n"
	                       "megatron: {activation_offload_fraction: 0.5}\n",
	               "error: activation_offload_fraction needs offload_modules");
	expect_invalid(MG_HEAD "parallel: {devices: 16, ep: 8}\n"
	                       "megatron: {delta_offload_bytes_across_pp_ranks: 1024}\n",
	               "error: delta_offload_bytes_across_pp_ranks needs offload_modules");
	expect_invalid(MG_HEAD "parallel: {devices: 16, ep: 8}\n"
	                       "megatron: {offload_modules: [core_attn], "
	                       "delta_offload_bytes_across_pp_ranks: -1}\n",
	               "error: delta_offload_bytes_across_pp_ranks");
}

/* Megatron-Core's uneven split (transformer_block.py get_num_layers_to_build):
 * 12 layers, pp 4, first stage 2, last stage 1: the 9 left over 2 middle
 * stages is not whole, refused; first 4 and last 2 leave 6, 3 per middle
 * stage: 4 3 3 2. With vpp 2 (chunk c on stage c % 4), first 4 and last 2
 * give chunks of 2, 1.5 -> refused for 3 per middle stage, so first 2 last 2
 * leave 8, 4 per stage, 2 per chunk: chunks 1 2 2 1 | 1 2 2 1. */
Test(frontend_megatron, first_and_last_stage_layers)
{
	kiln_model *m =
	    load_ok(MG_HEAD "parallel: {devices: 16, pp: 4, ep: 4, first_stage_layers: 4, "
	                    "last_stage_layers: 2}\n");
	cr_assert_eq(m->n_stage_layers, 4);
	int64_t want[4] = {4, 3, 3, 2};
	for (int i = 0; i < 4; i++)
		cr_expect_eq(m->stage_layers[i], want[i], "stage %d", i);
	expect_invalid(MG_HEAD "parallel: {devices: 16, pp: 4, ep: 4, first_stage_layers: 2, "
	                       "last_stage_layers: 1}\n",
	               "m.yaml:11:59: error: first_stage_layers and last_stage_layers leave 9 of "
	               "the 12 layers for 2 other stages");
	m = load_ok(MG_HEAD "parallel: {devices: 16, pp: 4, ep: 4, schedule: interleaved, vpp: 2, "
	                    "first_stage_layers: 2, last_stage_layers: 2}\n");
	cr_assert_eq(m->n_stage_layers, 8);
	int64_t want2[8] = {1, 2, 2, 1, 1, 2, 2, 1};
	for (int i = 0; i < 8; i++)
		cr_expect_eq(m->stage_layers[i], want2[i], "chunk %d", i);
	expect_invalid(MG_HEAD "parallel: {devices: 16, pp: 4, ep: 4, schedule: interleaved, "
	                       "vpp: 2, first_stage_layers: 3}\n",
	               "m.yaml:11:90: error: first_stage_layers (3) must be divisible by vpp (2)");
	expect_invalid(MG_HEAD "parallel: {devices: 16, pp: 2, ep: 8, stage_layers: [6, 6], "
	                       "last_stage_layers: 6}\n",
	               "m.yaml:11:80: error: last_stage_layers cannot be combined with an explicit "
	               "stage_layers");
	expect_invalid(MG_HEAD "parallel: {devices: 16, pp: 2, ep: 8, first_stage_layers: 6, "
	                       "account_for_loss: true}\n",
	               "cannot be combined with account_for_embedding / account_for_loss");
}

/* --account-for-embedding/loss-in-pipeline-split: 94 layers + embedding +
 * loss = 96 = pp 32 * vpp 3, one per chunk; chunk 0 holds the embedding only
 * and chunk 95 the loss only. 12 layers + 1 on pp 4 is not whole: refused. */
Test(frontend_megatron, account_for_embedding_and_loss)
{
	kiln_model *m = load_ok("kiln: 1\n"
	                        "model:\n"
	                        "  layers: 94\n"
	                        "  hidden: 64\n"
	                        "  heads: 8\n"
	                        "  vocab: 1000\n"
	                        "  seq_len: 128\n"
	                        "  moe: {experts: 8, top_k: 2, expert_ffn_hidden: 32}\n"
	                        "training: {global_batch: 192}\n"
	                        "hardware: h100-sxm\n"
	                        "parallel: {devices: 64, pp: 32, ep: 2, schedule: interleaved, "
	                        "vpp: 3, account_for_embedding: true, account_for_loss: true}\n");
	cr_assert_eq(m->n_stage_layers, 96);
	cr_expect_eq(m->stage_layers[0], 0);
	cr_expect_eq(m->stage_layers[95], 0);
	int64_t sum = 0;
	for (int i = 0; i < 96; i++)
		sum += m->stage_layers[i];
	cr_expect_eq(sum, 94);
	cr_expect(m->account_for_embedding && m->account_for_loss);
	expect_invalid(MG_HEAD "parallel: {devices: 16, pp: 4, ep: 4, account_for_loss: true}\n",
	               "m.yaml:11:57: error: with account_for_embedding / account_for_loss, layers "
	               "+ 1 = 13 must be divisible by pp * vpp = 4");
}

Test(frontend_megatron, recipe_rules_positioned)
{
	expect_invalid(
	    MG_HEAD "parallel: {devices: 16, ep: 8}\n"
	            "megatron:\n"
	            "  recompute_granularity: selective\n"
	            "  recompute_modules: [moe_act, layernorn]\n",
	    "m.yaml:14:32: error: recompute_modules entries must be Megatron-Core module "
	    "names");
	expect_in_diag("m.yaml:14:32: note: did you mean 'layernorm'?");
	expect_invalid(MG_HEAD
	               "parallel: {devices: 16, ep: 8}\n"
	               "megatron: {recompute_granularity: selective, recompute_method: block}\n",
	               "m.yaml:12:64: error: recompute_method needs recompute_granularity: full");
	expect_invalid(MG_HEAD "parallel: {devices: 16, ep: 8}\n"
	                       "megatron: {recompute_granularity: full, recompute_num_layers: 2}\n",
	               "m.yaml:12:63: error: recompute_num_layers needs recompute_method");
	expect_invalid(MG_HEAD "parallel: {devices: 16, ep: 8}\n"
	                       "megatron: {recompute_modules: [mlp]}\n",
	               "m.yaml:12:31: error: recompute_modules needs recompute_granularity: "
	               "selective");
	expect_invalid(MG_HEAD "parallel: {devices: 16, ep: 8}\n"
	                       "megatron: {moe_pad_expert_input_to_capacity: true}\n",
	               "m.yaml:12:46: error: moe_pad_expert_input_to_capacity needs "
	               "moe_expert_capacity_factor");
	expect_invalid(
	    MG_HEAD "parallel: {devices: 16, ep: 8}\n"
	            "megatron: {offload_modules: [attn_proj]}\n",
	    "m.yaml:12:29: error: offload_modules: attn_proj cannot be offloaded without "
	    "core_attn");
	expect_invalid(MG_HEAD "parallel: {devices: 16, ep: 1, overlap_ep_comm: true}\n",
	               "m.yaml:11:49: error: overlap_ep_comm needs ep >= 2");
	expect_invalid(MG_HEAD "parallel: {devices: 16, ep: 8, dispatcher: nccl}\n",
	               "m.yaml:11:44: error: dispatcher must be one of alltoall, deepep, hybridep");
	expect_invalid(MG_HEAD "parallel: {devices: 16, ep: 8}\n"
	                       "megatron: {recompute_granularity: some}\n",
	               "m.yaml:12:35: error: recompute_granularity must be one of selective, full");
	expect_invalid(MG_HEAD "parallel: {devices: 16, ep: 8}\n"
	                       "megatron: {mtp_layers: 1}\n",
	               "m.yaml:12:12: error: unknown key 'mtp_layers' in megatron");
}
