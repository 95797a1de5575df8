/* tools/hfcmd.c: `kilnc import hf`, a kiln model description from a Hugging
 * Face config.json (docs/cli.md, "kilnc import hf"; docs/model-format.md
 * says what each key means).
 *
 * The config gives the shapes; the command line gives what a config cannot
 * know (the parallel layout, the batch, the sequence length, the hardware).
 * Per family (its model_type) a table of where each kiln key comes from;
 * unknown fields are ignored, every missing required one is named. The
 * description is validated by the frontend before it is written, so what
 * this command writes is what `kilnc check` accepts.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "tools/tools.h"

/* A config.json is a few KB; the largest public ones are under 100 KB. */
#define HF_MAX_BYTES ((off_t)16 << 20)
/* The default expert parallel size is the largest divisor of the experts
 * that divides tp x dp, up to this (docs/cli.md, --ep); --ep sets any
 * other. */
#define HF_DEFAULT_EP_MAX 64
/* Every size a config gives (widths, head, expert and layer counts, ranks)
 * is at most 2^24, a hundred times the largest public one (vocab_size
 * 202048): an absurd size (2^32 heads) is refused here rather than
 * imported, where the frontend bounds only the byte sizes it computes;
 * positions (max_position_embeddings, sliding_window) at most
 * 2^53, integers a JSON number holds exactly. */
#define HF_MAX_DIM ((int64_t)1 << 24)
#define HF_MAX_POSITIONS ((int64_t)1 << 53)

/* The help text keeps its lines as printed. */
/* clang-format off */
static const char HELP_IMPORT[] =
    "usage: kilnc import hf CONFIG.json --devices N [--tp T] [--pp P] [--ep E]\n"
    "                       [--vpp V] [--micro-batch B] [--global-batch G]\n"
    "                       [--seq-len S] [--hardware H] [--name NAME] [-o MODEL.yaml]\n"
    "\n"
    "Writes a kiln model description (docs/model-format.md) for the model a\n"
    "Hugging Face config.json describes, trained on N devices in the given\n"
    "layout. Families (model_type): deepseek_v2, deepseek_v3 and kimi_k2\n"
    "(DeepSeek-V3, Kimi K2), qwen3_moe, qwen2_moe, mixtral, gpt_oss, and llama\n"
    "and mistral for dense models. A config that wraps its language model in\n"
    "text_config is read there. Unknown fields are ignored; every missing\n"
    "required field is named.\n"
    "\n"
    "  --devices N       devices of the whole job (required)\n"
    "  --tp T, --pp P    tensor and pipeline parallel sizes (default 1)\n"
    "  --ep E            expert parallel size (MoE; default: the largest divisor\n"
    "                    of the experts that divides tp x dp, at most "
    KILNC_STR(HF_DEFAULT_EP_MAX) ")\n"
    "  --vpp V           virtual stages per pipeline rank (default 1; V > 1\n"
    "                    uses the interleaved 1F1B schedule)\n"
    "  --micro-batch B   sequences per micro-batch (default 1)\n"
    "  --global-batch G  sequences per iteration (default: 4 x pp micro-batches\n"
    "                    per data-parallel rank)\n"
    "  --seq-len S       tokens per sequence (default 4096, or the config's\n"
    "                    max_position_embeddings when smaller)\n"
    "  --hardware H      a shipped profile (bw1000, h100-sxm, h200, mi300x) or\n"
    "                    a profile file (default h100-sxm)\n"
    "  --name NAME       the description's name (default: from the config's\n"
    "                    _name_or_path, else its directory or file name)\n"
    "  -o MODEL.yaml     write there (by the output rule of docs/cli.md), not\n"
    "                    to stdout\n"
    "\n"
    "Exit status 1 for a config that cannot be read or imported, or a layout\n"
    "the description cannot take (the frontend's errors); 2 for bad arguments.\n"
    "Notes on stderr name what the description leaves out (tied embeddings,\n"
    "multi-token prediction layers, sliding-window attention).\n";
/* clang-format on */

int kilnc_help_import(void)
{
	fputs(HELP_IMPORT, stdout);
	return 0;
}

typedef enum { FAM_DEEPSEEK, FAM_QWEN_MOE, FAM_MIXTRAL, FAM_GPT_OSS, FAM_DENSE } family;

static const struct {
	const char *model_type;
	family kind;
} FAMILIES[] = {
    {"deepseek_v2", FAM_DEEPSEEK}, {"deepseek_v3", FAM_DEEPSEEK}, {"kimi_k2", FAM_DEEPSEEK},
    {"qwen3_moe", FAM_QWEN_MOE},   {"qwen2_moe", FAM_QWEN_MOE},   {"mixtral", FAM_MIXTRAL},
    {"gpt_oss", FAM_GPT_OSS},      {"llama", FAM_DENSE},          {"mistral", FAM_DENSE},
};
#define N_FAMILIES (sizeof FAMILIES / sizeof *FAMILIES)

/* The shapes a config describes, in kiln's terms (docs/model-format.md). */
typedef struct shape {
	int64_t layers, dense_layers, hidden, ffn, heads, kv_heads, head_dim, vocab, max_pos;
	bool mla;
	int64_t q_lora, kv_lora, rope, v_head;
	bool moe;
	int64_t experts, shared, top_k, expert_ffn;
	/* GPT-OSS: a clamped quick GeGLU and biases on every linear layer
	 * (Megatron-Bridge's gpt_oss_bridge.py; docs/model-format.md). */
	bool quick_geglu_bias;
	/* For the notes: tied embeddings, multi-token prediction layers, a
	 * sliding window on some layer. */
	bool tied, sliding;
	int64_t mtp;
} shape;

/* Reading one config: every problem is reported, then the import stops. */
typedef struct reader {
	const char *path, *model_type;
	const kiln_json *c;
	int errors;
} reader;

static void bad(reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bad(reader *r, const char *fmt, ...)
{
	char esc[160];
	fprintf(stderr, "%s: error: ", kiln_text_escape(r->path, strlen(r->path), sizeof esc, esc));
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (model_type %s)\n", r->model_type);
	r->errors++;
}

/* How a field may be absent: required ones are named when missing;
 * NULLABLE ones may be null, which means absent (Hugging Face writes null
 * for "none" there); any other present value of the wrong type is an
 * error naming the field and the type expected. */
enum { OPTIONAL = 0, REQUIRED = 1, NULLABLE = 2 };

/* Integer field key in [lo, hi] (lo is 0 or 1): its value, or dflt when
 * absent. A bad value is reported once, and dflt returned. */
static int64_t int_field(reader *r, const char *key, int how, int64_t lo, int64_t hi, int64_t dflt)
{
	const kiln_json *v = kiln_json_get(r->c, key);
	const char *what =
	    lo > 0 ? (how & NULLABLE ? "a positive integer or null" : "a positive integer")
	    : how & NULLABLE ? "a non-negative integer or null"
	                     : "a non-negative integer";
	if (!v || ((how & NULLABLE) && kiln_json_is_null(v))) {
		if (how & REQUIRED)
			bad(r, "missing required field '%s'", key);
		return dflt;
	}
	if (!kiln_json_is_number(v)) {
		bad(r, "field '%s' is %s, expected %s", key, kiln_json_kind(v), what);
		return dflt;
	}
	double x = kiln_json_number(v);
	if (x != floor(x) || x < 0)
		bad(r, "field '%s' is %g, not %s", key, x, what);
	else if (x < (double)lo)
		bad(r, "field '%s' is 0, must be positive", key);
	else if (x > (double)hi)
		bad(r,
		    x < 1e18 ? "field '%s' is %.0f, over kiln's bound of %lld for it"
		             : "field '%s' is %g, over kiln's bound of %lld for it",
		    key, x, (long long)hi);
	else
		return (int64_t)x;
	return dflt;
}

/* A required size of the model (a width, a count, a rank). */
static int64_t dim(reader *r, const char *key)
{
	return int_field(r, key, REQUIRED, 1, HF_MAX_DIM, 0);
}

/* Boolean field key: its value, or false when absent. */
static bool bool_field(reader *r, const char *key)
{
	const kiln_json *v = kiln_json_get(r->c, key);
	if (v && !kiln_json_is_bool(v))
		bad(r, "field '%s' is %s, expected a boolean (true or false)", key,
		    kiln_json_kind(v));
	return kiln_json_bool(v);
}

/* String field key: its value (borrowed from the document), or NULL when
 * absent. */
static const char *string_field(reader *r, const char *key)
{
	const kiln_json *v = kiln_json_get(r->c, key);
	if (v && !kiln_json_string(v))
		bad(r, "field '%s' is %s, expected a string", key, kiln_json_kind(v));
	return kiln_json_string(v);
}

/* Array field key: the array, or NULL when absent (or not an array, after
 * reporting). */
static const kiln_json *array_field(reader *r, const char *key, const char *of)
{
	const kiln_json *v = kiln_json_get(r->c, key);
	if (v && !kiln_json_is_array(v)) {
		bad(r, "field '%s' is %s, expected an array of %s", key, kiln_json_kind(v), of);
		return NULL;
	}
	return v;
}

/* mlp_only_layers (qwen MoE): layer indices, the dense layers, which must
 * be the first k. Returns k. */
static int64_t dense_prefix(reader *r, const char *key)
{
	const kiln_json *a = array_field(r, key, "layer indices");
	int n = kiln_json_size(a);
	for (int i = 0; i < n; i++) {
		const kiln_json *e = kiln_json_at(a, i);
		double x = kiln_json_number(e);
		if (!kiln_json_is_number(e) || x != floor(x) || !(x >= 0 && x <= HF_MAX_DIM)) {
			char what[32];
			if (kiln_json_is_number(e))
				snprintf(what, sizeof what, "%g", x);
			bad(r,
			    "element %d of field '%s' is %s, not a non-negative integer (a layer "
			    "index)",
			    i, key, kiln_json_is_number(e) ? what : kiln_json_kind(e));
			return 0;
		}
	}
	for (int i = 0; i < n; i++)
		if (kiln_json_number(kiln_json_at(a, i)) != i) {
			bad(r,
			    "field '%s' lists dense layers other than the first ones (element %d); "
			    "kiln "
			    "models dense layers before the MoE ones only",
			    key, i);
			return 0;
		}
	return n;
}

/* Whether some layer has sliding-window attention: a window of at least
 * one token (sliding_window; null: none; gpt-oss's default 128), not
 * turned off (use_sliding_window false, as Qwen configs write), and, where
 * layer_types lists the layers, one of them "sliding_attention" (gpt-oss
 * alternates by default). */
static bool sliding(reader *r, family f)
{
	const kiln_json *w = kiln_json_get(r->c, "sliding_window");
	int64_t window = kiln_json_is_null(w)
	                     ? 0
	                     : int_field(r, "sliding_window", NULLABLE, 0, HF_MAX_POSITIONS,
	                                 f == FAM_GPT_OSS ? 128 : 0);
	bool off =
	    kiln_json_get(r->c, "use_sliding_window") && !bool_field(r, "use_sliding_window");
	const kiln_json *types = array_field(r, "layer_types", "strings");
	bool any = !types && f == FAM_GPT_OSS;
	for (int i = 0; i < kiln_json_size(types); i++) {
		const char *t = kiln_json_string(kiln_json_at(types, i));
		if (!t) {
			bad(r, "element %d of field 'layer_types' is %s, expected a string", i,
			    kiln_json_kind(kiln_json_at(types, i)));
			return false;
		}
		any |= strcmp(t, "sliding_attention") == 0;
	}
	return window > 0 && !off && (types ? any : true);
}

/* Reads the shapes of family f. Returns 0, or -1 after reporting. */
static int read_shape(reader *r, family f, shape *s)
{
	*s = (shape){0};
	s->hidden = dim(r, "hidden_size");
	s->layers = dim(r, "num_hidden_layers");
	s->heads = dim(r, "num_attention_heads");
	s->vocab = dim(r, "vocab_size");
	s->kv_heads = int_field(r, "num_key_value_heads", OPTIONAL, 1, HF_MAX_DIM, s->heads);
	s->max_pos = int_field(r, "max_position_embeddings", OPTIONAL, 1, HF_MAX_POSITIONS, 0);
	s->head_dim = int_field(r, "head_dim", OPTIONAL, 1, HF_MAX_DIM, 0);
	s->tied = bool_field(r, "tie_word_embeddings");
	s->mtp = int_field(r, "num_nextn_predict_layers", OPTIONAL, 0, HF_MAX_DIM, 0);
	s->sliding = sliding(r, f);
	const char *act = string_field(r, "hidden_act");
	if (act && f != FAM_GPT_OSS && strcmp(act, "silu") != 0 && strcmp(act, "swish") != 0) {
		char esc[64];
		bad(r,
		    "field 'hidden_act' is '%s': kiln models this family's gated MLP as SwiGLU "
		    "(silu) only",
		    kiln_text_escape(act, strlen(act), sizeof esc, esc));
	}
	switch (f) {
	case FAM_DEEPSEEK: {
		s->moe = s->mla = true;
		s->ffn = dim(r, "intermediate_size");
		s->experts = dim(r, "n_routed_experts");
		s->shared = int_field(r, "n_shared_experts", OPTIONAL, 0, HF_MAX_DIM, 0);
		s->top_k = dim(r, "num_experts_per_tok");
		s->expert_ffn = dim(r, "moe_intermediate_size");
		s->dense_layers = int_field(r, "first_k_dense_replace", OPTIONAL, 0, HF_MAX_DIM, 0);
		int64_t freq = int_field(r, "moe_layer_freq", OPTIONAL, 0, HF_MAX_DIM, 1);
		if (freq != 1)
			bad(r,
			    "field 'moe_layer_freq' is %lld: kiln models every layer after the "
			    "dense "
			    "ones as MoE",
			    (long long)freq);
		s->q_lora = int_field(r, "q_lora_rank", NULLABLE, 0, HF_MAX_DIM, 0);
		s->kv_lora = dim(r, "kv_lora_rank");
		s->rope = dim(r, "qk_rope_head_dim");
		s->v_head = dim(r, "v_head_dim");
		s->head_dim = dim(r, "qk_nope_head_dim");
		s->kv_heads = s->heads;
		break;
	}
	case FAM_QWEN_MOE: {
		s->moe = true;
		s->experts = dim(r, "num_experts");
		s->top_k = dim(r, "num_experts_per_tok");
		s->expert_ffn = dim(r, "moe_intermediate_size");
		int64_t step = int_field(r, "decoder_sparse_step", OPTIONAL, 0, HF_MAX_DIM, 1);
		if (step != 1)
			bad(r,
			    "field 'decoder_sparse_step' is %lld: kiln models every layer after "
			    "the "
			    "dense ones as MoE",
			    (long long)step);
		s->dense_layers = dense_prefix(r, "mlp_only_layers");
		if (s->dense_layers > 0)
			s->ffn = dim(r, "intermediate_size");
		int64_t shared =
		    int_field(r, "shared_expert_intermediate_size", OPTIONAL, 0, HF_MAX_DIM, 0);
		if (shared > 0 && s->expert_ffn > 0) {
			if (shared % s->expert_ffn != 0)
				bad(r,
				    "field 'shared_expert_intermediate_size' is %lld, not a "
				    "multiple of "
				    "moe_intermediate_size %lld: kiln models shared experts as "
				    "whole "
				    "experts",
				    (long long)shared, (long long)s->expert_ffn);
			s->shared = shared / s->expert_ffn;
		}
		break;
	}
	case FAM_MIXTRAL:
	case FAM_GPT_OSS:
		s->quick_geglu_bias = f == FAM_GPT_OSS;
		s->moe = true;
		s->experts = dim(r, "num_local_experts");
		s->top_k = dim(r, "num_experts_per_tok");
		s->expert_ffn = dim(r, "intermediate_size");
		break;
	case FAM_DENSE:
		s->ffn = dim(r, "intermediate_size");
		s->dense_layers = s->layers;
		break;
	}
	if (!s->head_dim && s->heads)
		s->head_dim = s->hidden / s->heads;
	return r->errors ? -1 : 0;
}

/* Notes on what the description leaves out; they change no figure kiln
 * cannot model. */
static void notes(const reader *r, const shape *s)
{
	char esc[160];
	const char *path = kiln_text_escape(r->path, strlen(r->path), sizeof esc, esc);
	if (s->tied)
		fprintf(
		    stderr,
		    "kilnc: note: %s ties its input embedding and output layer; kiln counts them "
		    "apart, so its parameters and static bytes are high by vocab x hidden = %lld "
		    "weights\n",
		    path, (long long)(s->vocab * s->hidden));
	if (s->mtp > 0)
		fprintf(stderr,
		        "kilnc: note: %s has %lld multi-token prediction layer(s); kiln describes "
		        "the main model only\n",
		        path, (long long)s->mtp);
	if (s->sliding)
		fprintf(stderr,
		        "kilnc: note: %s has sliding-window attention layers; kiln models every "
		        "layer's attention as full causal attention\n",
		        path);
}

/* ---------------------------------------------------------------- options */

typedef struct layout {
	int64_t devices, tp, pp, ep, vpp, mb, gb, seq;
	const char *hardware, *name, *out;
	bool ep_given, gb_given, seq_given;
} layout;

static int64_t gcd(int64_t a, int64_t b)
{
	while (b) {
		int64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* The name of the description: letters, digits, '.', '_' and '-' kept,
 * upper case lowered, anything else '-'. */
static void clean_name(const char *s, size_t n, char *out, size_t cap)
{
	size_t k = 0;
	for (size_t i = 0; i < n && k + 1 < cap; i++) {
		unsigned char c = (unsigned char)s[i];
		if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
		    c == '-')
			out[k++] = (char)c;
		else if (c >= 'A' && c <= 'Z')
			out[k++] = (char)(c - 'A' + 'a');
		else
			out[k++] = '-';
	}
	out[k] = '\0';
	if (!k)
		snprintf(out, cap, "imported");
}

/* The default name: the last part of _name_or_path, else the directory of
 * a file named config.json, else the file name without .json. */
static void default_name(const kiln_json *root, const char *path, char *out, size_t cap)
{
	const char *p = kiln_json_string(kiln_json_get(root, "_name_or_path"));
	if (p && *p) {
		const char *slash = strrchr(p, '/');
		const char *b = slash && slash[1] ? slash + 1 : p;
		clean_name(b, strlen(b), out, cap);
		return;
	}
	const char *slash = strrchr(path, '/');
	const char *base = slash ? slash + 1 : path;
	if (strcmp(base, "config.json") == 0 && slash && slash > path) {
		const char *d = slash - 1;
		while (d > path && d[-1] != '/')
			d--;
		clean_name(d, (size_t)(slash - d), out, cap);
		return;
	}
	size_t n = strlen(base);
	if (n > 5 && strcasecmp(base + n - 5, ".json") == 0)
		n -= 5;
	clean_name(base, n, out, cap);
}

/* Checks the layout against the shapes before any YAML exists, with
 * messages in terms of the options. Returns 0 or KILNC_EXIT_USAGE. */
static int check_layout(layout *L, const shape *s)
{
	if (L->devices % (L->tp * L->pp) != 0) {
		kilnc_usage("import",
		            "--devices %lld is not a multiple of tp x pp = %lld x %lld: no whole "
		            "data-parallel size",
		            (long long)L->devices, (long long)L->tp, (long long)L->pp);
		return KILNC_EXIT_USAGE;
	}
	int64_t dp = L->devices / (L->tp * L->pp);
	if (s->moe) {
		if (!L->ep_given) {
			int64_t g = gcd(s->experts, dp * L->tp);
			L->ep = 1;
			for (int64_t e = 1; e <= g && e <= HF_DEFAULT_EP_MAX; e++)
				if (g % e == 0)
					L->ep = e;
		}
		if (s->experts % L->ep != 0 || (dp * L->tp) % L->ep != 0) {
			kilnc_usage(
			    "import",
			    "--ep %lld must divide the %lld experts and tp x dp = %lld x %lld",
			    (long long)L->ep, (long long)s->experts, (long long)L->tp,
			    (long long)dp);
			return KILNC_EXIT_USAGE;
		}
	} else if (L->ep_given && L->ep != 1) {
		kilnc_usage("import", "--ep %lld: %s", (long long)L->ep,
		            "a dense model has no experts to spread (ep 1)");
		return KILNC_EXIT_USAGE;
	}
	if (!L->gb_given)
		L->gb = dp * L->mb * 4 * L->pp;
	if (L->gb % (L->mb * dp) != 0) {
		kilnc_usage(
		    "import",
		    "--global-batch %lld is not a multiple of micro-batch x dp = %lld x %lld",
		    (long long)L->gb, (long long)L->mb, (long long)dp);
		return KILNC_EXIT_USAGE;
	}
	if (!L->seq_given)
		L->seq = s->max_pos > 0 && s->max_pos < 4096 ? s->max_pos : 4096;
	return KILNC_EXIT_OK;
}

/* ---------------------------------------------------------------- writing */

/* Writes s as a YAML double-quoted scalar, so that no byte of a path
 * (" #", ": ", quotes, a backslash, a leading '-' or '&') is read as YAML
 * syntax: '"' and '\\' are escaped, control bytes written as \xNN (which
 * the frontend then refuses by name), every other byte as it is. */
static void yaml_quoted(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20 || *p == 0x7f)
			fprintf(f, "\\x%02x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

typedef struct doc {
	const shape *s;
	const layout *L;
	const char *path, *model_type, *name, *hardware;
} doc;

static int write_yaml(FILE *f, void *ctx)
{
	const doc *d = ctx;
	const shape *s = d->s;
	const layout *L = d->L;
	char esc[4200];
	fprintf(f, "# Imported by `kilnc import hf` from %s (model_type %s).\n",
	        kiln_text_escape(d->path, strlen(d->path), sizeof esc, esc), d->model_type);
	fputs("# Shapes from the config; layout, batch, sequence length and hardware from\n"
	      "# the command line; every other key at its documented default\n"
	      "# (docs/model-format.md).\n",
	      f);
	fprintf(f, "kiln: 1\nname: %s\nmodel:\n", d->name);
	fprintf(f, "  layers: %lld\n", (long long)s->layers);
	if (s->moe && s->dense_layers > 0)
		fprintf(f, "  dense_layers: %lld\n", (long long)s->dense_layers);
	fprintf(f, "  hidden: %lld\n", (long long)s->hidden);
	if (s->dense_layers > 0)
		fprintf(f, "  ffn_hidden: %lld\n", (long long)s->ffn);
	fprintf(f, "  heads: %lld\n  kv_heads: %lld\n  head_dim: %lld\n", (long long)s->heads,
	        (long long)s->kv_heads, (long long)s->head_dim);
	fprintf(f, "  vocab: %lld\n  seq_len: %lld\n", (long long)s->vocab, (long long)L->seq);
	fprintf(f, "  attention: flash\n  activation: %s\n",
	        s->quick_geglu_bias ? "quick_geglu" : "swiglu");
	if (s->quick_geglu_bias)
		fputs("  linear_bias: true\n", f);
	if (s->mla) {
		fputs("  mla:\n", f);
		if (s->q_lora > 0)
			fprintf(f, "    q_lora_rank: %lld\n", (long long)s->q_lora);
		fprintf(f,
		        "    kv_lora_rank: %lld\n    rope_head_dim: %lld\n    v_head_dim: %lld\n",
		        (long long)s->kv_lora, (long long)s->rope, (long long)s->v_head);
	}
	if (s->moe) {
		fprintf(f, "  moe:\n    experts: %lld\n", (long long)s->experts);
		if (s->shared > 0)
			fprintf(f, "    shared_experts: %lld\n", (long long)s->shared);
		fprintf(f, "    top_k: %lld\n    expert_ffn_hidden: %lld\n", (long long)s->top_k,
		        (long long)s->expert_ffn);
	}
	fprintf(f,
	        "training:\n  micro_batch: %lld\n  global_batch: %lld\n  dtype: bf16\n"
	        "  optimizer: adam\n  distributed_optimizer: true\n",
	        (long long)L->mb, (long long)L->gb);
	fprintf(f, "parallel:\n  devices: %lld\n  tp: %lld\n  pp: %lld\n", (long long)L->devices,
	        (long long)L->tp, (long long)L->pp);
	if (s->moe)
		fprintf(f, "  ep: %lld\n", (long long)L->ep);
	if (L->tp > 1)
		fputs("  sequence_parallel: true\n", f);
	if (L->vpp > 1)
		fprintf(f, "  schedule: interleaved\n  vpp: %lld\n", (long long)L->vpp);
	else
		fputs("  schedule: 1f1b\n", f);
	fputs("hardware: ", f);
	yaml_quoted(f, d->hardware);
	fputc('\n', f);
	return 0;
}

/* ---------------------------------------------------------------- the command */

static int parse(int argc, char **argv, const char **config, layout *L)
{
	*L = (layout){.tp = 1, .pp = 1, .ep = 1, .vpp = 1, .mb = 1, .hardware = "h100-sxm"};
	const char *v[10] = {0};
	static const char *const names[10] = {
	    "--devices",     "--tp",           "--pp",      "--ep",       "--vpp",
	    "--micro-batch", "--global-batch", "--seq-len", "--hardware", "--name"};
	*config = NULL;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		int m = 0;
		for (int k = 0; k < 10 && m == 0; k++)
			m = kilnc_option_value("import", names[k], argc, argv, &i, &v[k]);
		if (m == KILNC_EXIT_USAGE)
			return m;
		if (m)
			continue;
		if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0 ||
		    strncmp(a, "--output=", 9) == 0) {
			const char *o = NULL;
			if (strcmp(a, "-o") == 0) {
				if (i + 1 >= argc || !*argv[i + 1]) {
					kilnc_usage("import", "-o needs a file name");
					return KILNC_EXIT_USAGE;
				}
				o = argv[++i];
			} else if ((m = kilnc_option_value("import", "--output", argc, argv, &i,
			                                   &o)) == KILNC_EXIT_USAGE) {
				return m;
			}
			if (L->out) {
				kilnc_usage("import", "-o given twice");
				return KILNC_EXIT_USAGE;
			}
			L->out = o;
		} else if (a[0] == '-' && a[1]) {
			kilnc_usage("import", "unknown option '%s' for 'import hf'", a);
			return KILNC_EXIT_USAGE;
		} else if (!*config) {
			*config = a;
		} else {
			kilnc_usage("import",
			            "'import hf' takes one CONFIG.json, got a second: '%s'", a);
			return KILNC_EXIT_USAGE;
		}
	}
	if (!*config) {
		kilnc_usage("import", "'import hf' needs a CONFIG.json");
		return KILNC_EXIT_USAGE;
	}
	if (!v[0]) {
		kilnc_usage("import", "'import hf' needs --devices N (the job's devices)");
		return KILNC_EXIT_USAGE;
	}
	int64_t *slots[8] = {&L->devices, &L->tp, &L->pp, &L->ep, &L->vpp, &L->mb, &L->gb, &L->seq};
	static const int64_t hi[8] = {1 << 24, 1024,    4096,      65536,
	                              4096,    1 << 20, 1LL << 40, 1 << 24};
	for (int k = 0; k < 8; k++)
		if (v[k] && kilnc_arg_i64("import", names[k], v[k], 1, hi[k], slots[k]))
			return KILNC_EXIT_USAGE;
	L->ep_given = v[3] != NULL;
	L->gb_given = v[6] != NULL;
	L->seq_given = v[7] != NULL;
	if (v[8])
		L->hardware = v[8];
	L->name = v[9];
	return KILNC_EXIT_OK;
}

int kilnc_import(int argc, char **argv)
{
	if (argc >= 1 && (strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "--help") == 0))
		return kilnc_help_import();
	if (argc < 1 || strcmp(argv[0], "hf") != 0) {
		kilnc_usage("import", "'import' reads one format: kilnc import hf CONFIG.json ...");
		return KILNC_EXIT_USAGE;
	}
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
			return kilnc_help_import();
	const char *config;
	layout L;
	int rc = parse(argc - 1, argv + 1, &config, &L);
	if (rc)
		return rc;
	const kiln_out_name in = {"CONFIG", config}, out = {"-o", L.out};
	if (kilnc_check_outputs(&in, 1, NULL, &out, 1) != KILNC_EXIT_OK)
		return KILNC_EXIT_USAGE;

	char *text;
	size_t len;
	if ((rc = kilnc_read_file(config, HF_MAX_BYTES, &text, &len)) != KILNC_EXIT_OK)
		return rc;
	kiln_json_error jerr;
	kiln_json *root = kiln_json_parse_strict(text, len, &jerr);
	free(text);
	char shown[200];
	if (!root) {
		fprintf(stderr, "%s:%d:%d: error: %s\n", kilnc_shown(config, shown, sizeof shown),
		        jerr.line, jerr.col, jerr.reason);
		return KILNC_EXIT_INPUT;
	}
	if (!kiln_json_is_object(root)) {
		fprintf(stderr,
		        "%s: error: the JSON value is %s, not an object (a Hugging Face "
		        "config.json)\n",
		        kilnc_shown(config, shown, sizeof shown), kiln_json_kind(root));
		kiln_json_free(root);
		return KILNC_EXIT_INPUT;
	}
	rc = KILNC_EXIT_INPUT;
	char *yaml = NULL;
	size_t ylen = 0;
	kiln_arena *a = NULL;
	/* Multimodal configs carry the language model in text_config. */
	const kiln_json *tc = kiln_json_get(root, "text_config");
	const kiln_json *c = kiln_json_is_object(tc) ? tc : root;
	/* The fields read before the family is known, typed as the others. */
	static const struct {
		const char *key, *kind;
		bool (*is)(const kiln_json *);
	} top[] = {{"text_config", "an object", kiln_json_is_object},
	           {"_name_or_path", "a string", kiln_json_is_string},
	           {"model_type", "a string", kiln_json_is_string}};
	bool typed = true;
	for (size_t k = 0; k < sizeof top / sizeof *top; k++) {
		const kiln_json *v = kiln_json_get(k == 2 ? c : root, top[k].key);
		if (v && !top[k].is(v)) {
			fprintf(stderr, "%s: error: field '%s' is %s, expected %s\n",
			        kilnc_shown(config, shown, sizeof shown), top[k].key,
			        kiln_json_kind(v), top[k].kind);
			typed = false;
		}
	}
	if (!typed)
		goto done;
	const char *type = kiln_json_string(kiln_json_get(c, "model_type"));
	size_t fam = 0;
	while (type && fam < N_FAMILIES && strcmp(FAMILIES[fam].model_type, type) != 0)
		fam++;
	if (!type || fam == N_FAMILIES) {
		char esc[64];
		fprintf(stderr, "%s: error: %s%s%s; kiln imports",
		        kilnc_shown(config, shown, sizeof shown),
		        type ? "model_type '" : "no model_type",
		        type ? kiln_text_escape(type, strlen(type), sizeof esc, esc) : "",
		        type ? "' is not a family kiln knows" : "");
		for (size_t k = 0; k < N_FAMILIES; k++)
			fprintf(stderr, "%s %s", k ? "," : "", FAMILIES[k].model_type);
		fputc('\n', stderr);
		goto done;
	}
	reader r = {.path = config, .model_type = type, .c = c};
	shape s;
	if (read_shape(&r, FAMILIES[fam].kind, &s) != 0)
		goto done;
	if ((rc = check_layout(&L, &s)) != KILNC_EXIT_OK)
		goto done;
	rc = KILNC_EXIT_INPUT;
	char name[128], hw[PATH_MAX];
	if (L.name)
		clean_name(L.name, strlen(L.name), name, sizeof name);
	else
		default_name(root, config, name, sizeof name);
	/* A profile file is named absolutely: the description may be written
	 * anywhere, and its relative paths resolve against its own directory. */
	snprintf(hw, sizeof hw, "%s", L.hardware);
	if (strchr(L.hardware, '/') || strstr(L.hardware, ".yaml") || strstr(L.hardware, ".yml")) {
		if (!realpath(L.hardware, hw)) {
			fprintf(stderr, "kilnc: error: --hardware %s: %s\n",
			        kilnc_shown(L.hardware, shown, sizeof shown), strerror(errno));
			goto done;
		}
	}
	doc d = {
	    .s = &s, .L = &L, .path = config, .model_type = type, .name = name, .hardware = hw};
	FILE *mem = open_memstream(&yaml, &ylen);
	if (!mem) {
		fprintf(stderr, "kilnc: error: out of memory\n");
		goto done;
	}
	write_yaml(mem, &d);
	if (fclose(mem) != 0 || !yaml) {
		fprintf(stderr, "kilnc: error: out of memory\n");
		goto done;
	}
	/* What is written is what check accepts: the frontend has the last word. */
	char label[PATH_MAX + 16];
	snprintf(label, sizeof label, "%s (imported)", config);
	a = kiln_arena_new();
	kiln_model *m = NULL;
	if (!a || kiln_frontend_load_buffer(label, yaml, ylen, a, stderr, &m) != KILN_FRONTEND_OK) {
		fprintf(stderr,
		        "kilnc: error: the description imported from %s with these options is "
		        "invalid (above; the lines are those of the YAML it would write)\n",
		        kilnc_shown(config, shown, sizeof shown));
		goto done;
	}
	/* The profile file the description names is an input too: -o (or
	 * stdout redirected) may not name it, as a symlink or hard link
	 * neither. Checked against the file the frontend read. */
	if (kilnc_check_outputs(&in, 1, m, &out, 1) != KILNC_EXIT_OK) {
		rc = KILNC_EXIT_USAGE;
		goto done;
	}
	notes(&r, &s);
	if (L.out) {
		if (kiln_out_write("kilnc", L.out, write_yaml, &d, stderr) != 0)
			goto done;
	} else {
		fwrite(yaml, 1, ylen, stdout);
	}
	rc = KILNC_EXIT_OK;
done:
	kiln_arena_free(a);
	free(yaml);
	kiln_json_free(root);
	return rc;
}
