/* frontend/validate.c: requiredness, defaults, the semantic rules and the
 * derived fields of a model description (docs/model-format.md).
 *
 * A field that already has an error is BAD; every rule that reads a BAD field
 * is skipped, so one mistake gives one message. All arithmetic on user
 * integers is checked. */
#include <math.h>
#include <string.h>

#include "frontend/internal.h"

/* Sizes whose byte counts reach this are rejected (headroom for the sums the
 * compiler forms from them). */
#define SIZE_LIMIT ((uint64_t)1 << 62)

/* The largest load.max_factor accepted. */
#define KILN_MAX_LOAD_FACTOR 16.0

typedef struct vctx {
	kiln_fe_ctx *c;
	const kiln_fe_node *root;
	kiln_fe_field f[KILN_FE_F_COUNT];
} vctx;

#define FLD(id) (&v->f[KILN_FE_F_##id])
#define OK(id) (v->f[KILN_FE_F_##id].state != KILN_FE_BAD)
#define VAL(id) (v->f[KILN_FE_F_##id].i)

/* The value node of the first present field among a, b; else the root. */
static const kiln_fe_node *where2(const vctx *v, kiln_fe_field_id a, kiln_fe_field_id b)
{
	if (v->f[a].value)
		return v->f[a].value;
	if (v->f[b].value)
		return v->f[b].value;
	return v->root;
}

static const kiln_fe_node *where(const vctx *v, kiln_fe_field_id a)
{
	return where2(v, a, a);
}

/* The node a missing key of section s is reported at: its section's key. */
static const kiln_fe_node *section_node(const vctx *v, kiln_fe_section s)
{
	switch (s) {
	case KILN_FE_S_MODEL:
		return FLD(MODEL)->key;
	case KILN_FE_S_MLA:
		return FLD(MLA)->key;
	case KILN_FE_S_MOE:
		return FLD(MOE)->key;
	case KILN_FE_S_TRAINING:
		return FLD(TRAINING)->key;
	case KILN_FE_S_PARALLEL:
		return FLD(PARALLEL)->key;
	case KILN_FE_S_LOAD:
		return FLD(LOAD)->key;
	case KILN_FE_S_MEGATRON:
		return FLD(MEGATRON)->key;
	default:
		return v->root;
	}
}

/* A required key: reports it when absent (unless its section is unusable,
 * which was reported already) and marks it BAD. */
static void require(vctx *v, kiln_fe_field_id id, const char *why)
{
	kiln_fe_field *f = &v->f[id];
	if (f->state != KILN_FE_ABSENT)
		return;
	kiln_fe_section s = kiln_fe_field_section(id);
	const kiln_fe_node *at = section_node(v, s);
	if (!at)
		at = v->root;
	kiln_fe_error(v->c, at->line, at->col, "missing required key '%s' in %s%s",
	              kiln_fe_field_key(id), kiln_fe_section_name(s), why ? why : "");
	f->state = KILN_FE_BAD;
}

/* Gives an absent integer field its default; it is BAD when the default is
 * computed from a BAD field (source_ok false). */
static void default_int(vctx *v, kiln_fe_field_id id, int64_t value, bool source_ok)
{
	kiln_fe_field *f = &v->f[id];
	if (f->state != KILN_FE_ABSENT)
		return;
	f->i = value;
	if (!source_ok)
		f->state = KILN_FE_BAD;
}

static void rule_error(vctx *v, const kiln_fe_node *at, kiln_fe_field_id bad, const char *msg)
{
	kiln_fe_error(v->c, at->line, at->col, "%s", msg);
	v->f[bad].state = KILN_FE_BAD;
}

/* Reads a section mapping into v->f, or poisons its fields. */
static void read_section(vctx *v, kiln_fe_field_id holder, kiln_fe_section s, bool required)
{
	kiln_fe_field *h = &v->f[holder];
	if (h->state == KILN_FE_SET) {
		kiln_fe_section_read(v->c, s, h->value, v->f);
		return;
	}
	if (h->state == KILN_FE_ABSENT && required) {
		kiln_fe_error(v->c, v->root->line, v->root->col, "missing required section '%s'",
		              kiln_fe_field_key(holder));
		h->state = KILN_FE_BAD;
	}
	if (h->state == KILN_FE_BAD)
		kiln_fe_section_poison(s, v->f);
}

/* ---- model: */

static void check_model(vctx *v)
{
	require(v, KILN_FE_F_LAYERS, NULL);
	require(v, KILN_FE_F_HIDDEN, NULL);
	require(v, KILN_FE_F_HEADS, NULL);
	require(v, KILN_FE_F_VOCAB, NULL);
	require(v, KILN_FE_F_SEQ_LEN, NULL);
	char msg[256];

	if (FLD(LAYERS)->state == KILN_FE_SET && VAL(LAYERS) > KILN_FRONTEND_MAX_LAYERS) {
		snprintf(msg, sizeof(msg), "layers (%lld) exceeds the limit of %d",
		         (long long)VAL(LAYERS), KILN_FRONTEND_MAX_LAYERS);
		rule_error(v, where(v, KILN_FE_F_LAYERS), KILN_FE_F_LAYERS, msg);
	}

	kiln_fe_state moe = FLD(MOE)->state;
	kiln_fe_field *dense = FLD(DENSE_LAYERS);
	if (moe == KILN_FE_SET) {
		default_int(v, KILN_FE_F_DENSE_LAYERS, 0, true);
		if (dense->state == KILN_FE_SET && OK(LAYERS) && dense->i >= VAL(LAYERS)) {
			snprintf(msg, sizeof(msg),
			         "dense_layers (%lld) must be less than layers (%lld) when moe is "
			         "present",
			         (long long)dense->i, (long long)VAL(LAYERS));
			rule_error(v, dense->value, KILN_FE_F_DENSE_LAYERS, msg);
		}
	} else if (moe == KILN_FE_ABSENT) {
		if (dense->state == KILN_FE_SET && OK(LAYERS) && dense->i != VAL(LAYERS)) {
			snprintf(msg, sizeof(msg),
			         "dense_layers (%lld) needs a moe section; without moe all %lld "
			         "layers are dense",
			         (long long)dense->i, (long long)VAL(LAYERS));
			rule_error(v, dense->value, KILN_FE_F_DENSE_LAYERS, msg);
		}
		default_int(v, KILN_FE_F_DENSE_LAYERS, VAL(LAYERS), OK(LAYERS));
	} else {
		default_int(v, KILN_FE_F_DENSE_LAYERS, 0, false);
	}

	/* ffn_hidden is needed when some layer is dense. */
	if (moe == KILN_FE_ABSENT || (moe == KILN_FE_SET && OK(DENSE_LAYERS) && dense->i > 0))
		require(v, KILN_FE_F_FFN_HIDDEN, " (the width of the dense layers' FFN)");
	else
		default_int(v, KILN_FE_F_FFN_HIDDEN, 0, moe == KILN_FE_SET && OK(DENSE_LAYERS));

	default_int(v, KILN_FE_F_KV_HEADS, VAL(HEADS), OK(HEADS));
	if (FLD(HEAD_DIM)->state == KILN_FE_ABSENT) {
		if (OK(HIDDEN) && OK(HEADS) && VAL(HIDDEN) % VAL(HEADS) != 0) {
			snprintf(
			    msg, sizeof(msg),
			    "heads (%lld) must divide hidden (%lld) when head_dim is not given",
			    (long long)VAL(HEADS), (long long)VAL(HIDDEN));
			rule_error(v, where(v, KILN_FE_F_HEADS), KILN_FE_F_HEAD_DIM, msg);
		} else {
			default_int(v, KILN_FE_F_HEAD_DIM,
			            OK(HIDDEN) && OK(HEADS) ? VAL(HIDDEN) / VAL(HEADS) : 0,
			            OK(HIDDEN) && OK(HEADS));
		}
	}
	if (OK(HEADS) && OK(KV_HEADS) && VAL(HEADS) % VAL(KV_HEADS) != 0) {
		snprintf(msg, sizeof(msg), "kv_heads (%lld) must divide heads (%lld)",
		         (long long)VAL(KV_HEADS), (long long)VAL(HEADS));
		rule_error(v, where2(v, KILN_FE_F_KV_HEADS, KILN_FE_F_HEADS), KILN_FE_F_KV_HEADS,
		           msg);
	}
	kiln_fe_field *dropout = FLD(DROPOUT);
	if (dropout->state == KILN_FE_SET && !(dropout->f >= 0 && dropout->f < 1)) {
		snprintf(msg, sizeof(msg), "dropout (%g) must be in [0, 1)", dropout->f);
		rule_error(v, dropout->value, KILN_FE_F_DROPOUT, msg);
	}

	if (FLD(MLA)->state == KILN_FE_SET) {
		require(v, KILN_FE_F_KV_LORA_RANK, NULL);
		require(v, KILN_FE_F_ROPE_HEAD_DIM, NULL);
	}
	default_int(v, KILN_FE_F_V_HEAD_DIM, VAL(HEAD_DIM), OK(HEAD_DIM));

	if (moe == KILN_FE_SET) {
		require(v, KILN_FE_F_EXPERTS, NULL);
		require(v, KILN_FE_F_TOP_K, NULL);
		require(v, KILN_FE_F_EXPERT_FFN_HIDDEN, NULL);
		default_int(v, KILN_FE_F_MOE_ACTIVATION, VAL(ACTIVATION), OK(ACTIVATION));
		if (OK(TOP_K) && OK(EXPERTS) && VAL(TOP_K) > VAL(EXPERTS)) {
			snprintf(msg, sizeof(msg), "top_k (%lld) must not exceed experts (%lld)",
			         (long long)VAL(TOP_K), (long long)VAL(EXPERTS));
			rule_error(v, where2(v, KILN_FE_F_TOP_K, KILN_FE_F_EXPERTS),
			           KILN_FE_F_TOP_K, msg);
		}
	} else {
		default_int(v, KILN_FE_F_MOE_ACTIVATION, VAL(ACTIVATION), OK(ACTIVATION));
	}
}

/* ---- memory options where implementations differ (issue 15): */

/* Defaults follow current Megatron-Core (docs/model-format.md, "Memory
 * options"); a key that cannot apply to the model is an error at its value,
 * so a description never states an option that silently does nothing. */
static void check_memory_options(vctx *v)
{
	kiln_fe_field *fq = FLD(FUSED_QKV);
	bool mla = FLD(MLA)->state == KILN_FE_SET;
	if (fq->state == KILN_FE_SET && mla)
		rule_error(v, fq->value, KILN_FE_F_FUSED_QKV,
		           "fused_qkv does not apply with mla: the queries and the latent kv have "
		           "projections of their own");
	else if (fq->state == KILN_FE_ABSENT)
		fq->b = !mla; /* Megatron's linear_qkv: one GEMM, one storage */
	kiln_fe_field *rs = FLD(NORM_SAVES_RSTD);
	if (rs->state == KILN_FE_ABSENT)
		rs->b = true; /* Transformer Engine's RMSNorm and LayerNorm save rsigma */
	kiln_fe_field *pf = FLD(MOE_PERMUTE_FUSION);
	if (pf->state == KILN_FE_SET && FLD(MOE)->state == KILN_FE_ABSENT)
		rule_error(v, pf->value, KILN_FE_F_MOE_PERMUTE_FUSION,
		           "moe_permute_fusion needs a moe section (a dense model permutes no "
		           "tokens)");
	/* Absent prob_apply is 0 (activation) and absent moe_permute_fusion
	 * false: Megatron's defaults. */
}

/* ---- parallel: */

typedef struct derived {
	bool chunks_ok;
	int64_t chunks; /* pp * vpp */
	bool dp_ok;
	int64_t dp;
	bool edp_ok;
	int64_t edp;
	bool mbs_ok;
	int64_t micro_batches;
	int64_t *stage_layers; /* chunks entries when chunks_ok and set */
} derived;

/* ---- issue 15, item 2: Megatron's pipeline layout flags and the megatron:
 * section (docs/model-format.md). */

/* The split Megatron-Core makes from --decoder-first/last-pipeline-num-layers
 * or --account-for-embedding/loss-in-pipeline-split
 * (megatron/core/transformer/transformer_block.py, get_num_layers_to_build,
 * lines 103-198 at d98e8a64dd; the checks in transformer_config.py lines
 * 2229-2330): true when one of those keys is set, with d->stage_layers
 * filled or an error reported; false when none is set (the default split
 * applies). Chunk c runs on stage c % pp as its virtual stage c / pp. */
static bool megatron_split(vctx *v, derived *d)
{
	kiln_fe_field *fs = FLD(FIRST_STAGE_LAYERS), *ls = FLD(LAST_STAGE_LAYERS);
	kiln_fe_field *ae = FLD(ACCOUNT_FOR_EMBEDDING), *al = FLD(ACCOUNT_FOR_LOSS);
	bool uneven = fs->state == KILN_FE_SET || ls->state == KILN_FE_SET;
	bool account = (ae->state == KILN_FE_SET && ae->b) || (al->state == KILN_FE_SET && al->b);
	if (fs->state == KILN_FE_BAD || ls->state == KILN_FE_BAD || ae->state == KILN_FE_BAD ||
	    al->state == KILN_FE_BAD)
		return true;
	if (!uneven && !account)
		return false;
	char msg[320];
	const kiln_fe_node *at = uneven
	                             ? (fs->value ? fs->value : ls->value)
	                             : (ae->state == KILN_FE_SET && ae->b ? ae->value : al->value);
	if (uneven && account) {
		rule_error(v, at,
		           uneven ? (fs->value ? KILN_FE_F_FIRST_STAGE_LAYERS
		                               : KILN_FE_F_LAST_STAGE_LAYERS)
		                  : KILN_FE_F_ACCOUNT_FOR_EMBEDDING,
		           "first_stage_layers / last_stage_layers cannot be combined with "
		           "account_for_embedding / account_for_loss (Megatron-Core refuses the "
		           "combination too)");
		return true;
	}
	int64_t pp = VAL(PP), vpp = VAL(VPP), layers = VAL(LAYERS);
	int64_t per_rank[3]; /* first, middle, last pipeline rank */
	if (uneven) {
		int64_t rest = layers, left = pp;
		const kiln_fe_field *both[2] = {fs, ls};
		for (int k = 0; k < 2; k++) {
			const kiln_fe_field *f = both[k];
			if (f->state != KILN_FE_SET)
				continue;
			if (f->i % vpp != 0) {
				snprintf(msg, sizeof msg,
				         "%s (%lld) must be divisible by vpp (%lld): each of the "
				         "stage's "
				         "model chunks holds the same number of layers",
				         k ? "last_stage_layers" : "first_stage_layers",
				         (long long)f->i, (long long)vpp);
				rule_error(v, f->value,
				           k ? KILN_FE_F_LAST_STAGE_LAYERS
				             : KILN_FE_F_FIRST_STAGE_LAYERS,
				           msg);
				return true;
			}
			rest -= f->i;
			left -= 1;
		}
		if (left < 0 || (pp == 1)) {
			rule_error(v, at,
			           fs->value ? KILN_FE_F_FIRST_STAGE_LAYERS
			                     : KILN_FE_F_LAST_STAGE_LAYERS,
			           "first_stage_layers and last_stage_layers need pp >= 2 (pp >= 2 "
			           "distinct first and last stages)");
			return true;
		}
		if (rest < 0 || (left == 0 && rest != 0) || (left > 0 && rest < left * vpp) ||
		    (left > 0 && rest % (left * vpp) != 0)) {
			snprintf(
			    msg, sizeof msg,
			    "first_stage_layers and last_stage_layers leave %lld of the %lld "
			    "layers "
			    "for %lld other stages of %lld chunks each; that must be a positive "
			    "multiple of %lld (Megatron-Core's uneven split)",
			    (long long)rest, (long long)layers, (long long)left, (long long)vpp,
			    (long long)(left > 0 ? left * vpp : 1));
			rule_error(v, at,
			           fs->value ? KILN_FE_F_FIRST_STAGE_LAYERS
			                     : KILN_FE_F_LAST_STAGE_LAYERS,
			           msg);
			return true;
		}
		int64_t mid = left > 0 ? rest / left : 0;
		per_rank[0] = fs->state == KILN_FE_SET ? fs->i : mid;
		per_rank[1] = mid;
		per_rank[2] = ls->state == KILN_FE_SET ? ls->i : mid;
	} else {
		int64_t e = ae->state == KILN_FE_SET && ae->b,
		        l = al->state == KILN_FE_SET && al->b;
		int64_t total = layers + e + l;
		if (total % (pp * vpp) != 0) {
			snprintf(
			    msg, sizeof msg,
			    "with account_for_embedding / account_for_loss, layers + %lld = %lld "
			    "must be divisible by pp * vpp = %lld",
			    (long long)(e + l), (long long)total, (long long)(pp * vpp));
			rule_error(v, at,
			           e ? KILN_FE_F_ACCOUNT_FOR_EMBEDDING : KILN_FE_F_ACCOUNT_FOR_LOSS,
			           msg);
			return true;
		}
		per_rank[0] = per_rank[1] = per_rank[2] = total / pp;
	}
	int64_t n = d->chunks;
	d->stage_layers = kiln_arena_alloc(v->c->a, (size_t)n * sizeof(int64_t));
	if (!d->stage_layers) {
		kiln_fe_oom(v->c);
		return true;
	}
	for (int64_t c = 0; c < n; c++) {
		int64_t s = c % pp;
		d->stage_layers[c] = per_rank[s == 0 ? 0 : s == pp - 1 ? 2 : 1] / vpp;
	}
	if (!uneven) {
		/* The embedding and the loss fill one layer's place in the first and
		 * the last chunk. */
		if (ae->state == KILN_FE_SET && ae->b)
			d->stage_layers[0] -= 1;
		if (al->state == KILN_FE_SET && al->b)
			d->stage_layers[n - 1] -= 1;
		if (d->stage_layers[0] < 0 || d->stage_layers[n - 1] < 0 ||
		    (n == 1 && d->stage_layers[0] < 0)) {
			rule_error(
			    v, at, KILN_FE_F_ACCOUNT_FOR_EMBEDDING,
			    "account_for_embedding / account_for_loss leave a chunk with fewer "
			    "than zero layers");
			d->stage_layers = NULL;
			return true;
		}
		if (n == 1 && d->stage_layers[0] == 0) {
			rule_error(
			    v, at, KILN_FE_F_ACCOUNT_FOR_EMBEDDING,
			    "account_for_embedding / account_for_loss leave no transformer layer");
			d->stage_layers = NULL;
		}
	}
	return true;
}

/* An item of a module list: one of names[0..n-1]; sets its bit in *bits. */
static void module_item(vctx *v, const kiln_fe_node *it, const char *key, const char *const *names,
                        size_t n, uint32_t *bits, bool *ok)
{
	if (it->kind == KILN_FE_SCALAR && !it->broken) {
		for (size_t i = 0; i < n; i++)
			if (strlen(names[i]) == it->len &&
			    memcmp(names[i], it->text, it->len) == 0) {
				*bits |= 1u << i;
				return;
			}
	}
	*ok = false;
	if (it->broken)
		return;
	const char *hint =
	    it->kind == KILN_FE_SCALAR ? kiln_fe_suggest(it->text, it->len, names, n) : NULL;
	char list[256];
	size_t o = 0;
	for (size_t i = 0; i < n && o + 24 < sizeof list; i++)
		o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", names[i]);
	kiln_fe_diag *dg = kiln_fe_error(
	    v->c, it->line, it->col, "%s entries must be Megatron-Core module names (%s); got %s",
	    key, list, kiln_fe_node_describe(v->c, it));
	if (hint)
		kiln_fe_note_at(v->c, dg, it->line, it->col, "did you mean '%s'?", hint);
}

static const char *const recompute_names[] = {
#define X(id, name) name,
    KILN_MEGATRON_RECOMPUTE_MODULES(X)
#undef X
};
static const char *const offload_names[] = {
#define X(id, name) name,
    KILN_MEGATRON_OFFLOAD_MODULES(X)
#undef X
};

/* The megatron: section's rules, as Megatron-Core checks them
 * (transformer_config.py __post_init__: recompute at lines 1900-2030,
 * fine-grained offloading at 2125-2160, capacity and padding in the MoE
 * checks), and its values into out. */
static void check_megatron(vctx *v, kiln_megatron *out)
{
	memset(out, 0, sizeof(*out));
	kiln_fe_field *gr = FLD(RECOMPUTE_GRANULARITY), *me = FLD(RECOMPUTE_METHOD);
	kiln_fe_field *nl = FLD(RECOMPUTE_NUM_LAYERS), *rm = FLD(RECOMPUTE_MODULES);
	kiln_fe_field *om = FLD(OFFLOAD_MODULES), *cf = FLD(MOE_EXPERT_CAPACITY_FACTOR);
	kiln_fe_field *pad = FLD(MOE_PAD_EXPERT_INPUT_TO_CAPACITY);
	kiln_fe_field *fb = FLD(MOE_ROUTER_FORCE_LOAD_BALANCING), *mtp = FLD(MTP_NUM_LAYERS);
	bool full = gr->state == KILN_FE_SET && gr->i == 1;
	bool selective = gr->state == KILN_FE_SET && gr->i == 0;
	out->recompute = full        ? KILN_RECOMPUTE_FULL
	                 : selective ? KILN_RECOMPUTE_SELECTIVE
	                             : KILN_RECOMPUTE_NONE;
	if (me->state == KILN_FE_SET && !full)
		rule_error(v, me->value, KILN_FE_F_RECOMPUTE_METHOD,
		           "recompute_method needs recompute_granularity: full");
	if (nl->state == KILN_FE_SET && !full)
		rule_error(v, nl->value, KILN_FE_F_RECOMPUTE_NUM_LAYERS,
		           "recompute_num_layers needs recompute_granularity: full (Megatron-Core: "
		           "it must be None for selective recompute)");
	if (me->state == KILN_FE_SET)
		out->recompute_method = (kiln_recompute_method)me->i;
	if (nl->state == KILN_FE_SET)
		out->recompute_num_layers = nl->i;
	if (full && me->state == KILN_FE_ABSENT && nl->state == KILN_FE_SET)
		rule_error(v, nl->value, KILN_FE_F_RECOMPUTE_NUM_LAYERS,
		           "recompute_num_layers needs recompute_method (uniform or block)");
	if (rm->state == KILN_FE_SET) {
		if (!selective)
			rule_error(v, rm->value, KILN_FE_F_RECOMPUTE_MODULES,
			           "recompute_modules needs recompute_granularity: selective");
		bool ok = true;
		for (size_t i = 0; i < rm->value->n; i++)
			module_item(v, rm->value->items[i], "recompute_modules", recompute_names,
			            KILN_MRC_COUNT, &out->recompute_modules, &ok);
		if (!ok)
			rm->state = KILN_FE_BAD;
	} else if (selective) {
		out->recompute_modules = KILN_MRC(CORE_ATTN); /* Megatron-Core's default */
	}
	if (selective && (out->recompute_modules & KILN_MRC(MLA_UP_PROJ)) && OK(MLA) &&
	    FLD(MLA)->state != KILN_FE_SET)
		rule_error(v, rm->value, KILN_FE_F_RECOMPUTE_MODULES,
		           "recompute_modules: mla_up_proj needs model.mla");
	if (om->state == KILN_FE_SET) {
		bool ok = true;
		for (size_t i = 0; i < om->value->n; i++)
			module_item(v, om->value->items[i], "offload_modules", offload_names,
			            KILN_MOF_COUNT, &out->offload_modules, &ok);
		if (!ok)
			om->state = KILN_FE_BAD;
		else if ((out->offload_modules & KILN_MOF(ATTN_PROJ)) &&
		         !(out->offload_modules & KILN_MOF(CORE_ATTN)))
			rule_error(
			    v, om->value, KILN_FE_F_OFFLOAD_MODULES,
			    "offload_modules: attn_proj cannot be offloaded without core_attn "
			    "(Megatron-Core's rule)");
	}
	/* Fine-grained offloading's tuning: Megatron checks it only with
	 * offloading on (transformer_config.py:2176-2184). The fraction and
	 * the delta without offload_modules would change nothing and are
	 * refused; the minimum size also tells the recipe search (which
	 * chooses the modules) what Megatron would offload. */
	kiln_fe_field *fr = FLD(ACTIVATION_OFFLOAD_FRACTION);
	kiln_fe_field *dl = FLD(DELTA_OFFLOAD_BYTES_ACROSS_PP_RANKS);
	kiln_fe_field *mo = FLD(MIN_OFFLOADED_TENSOR_SIZE);
	const kiln_fe_field *off_keys[2] = {fr, dl};
	const kiln_fe_field_id off_ids[2] = {KILN_FE_F_ACTIVATION_OFFLOAD_FRACTION,
	                                     KILN_FE_F_DELTA_OFFLOAD_BYTES_ACROSS_PP_RANKS};
	for (int k = 0; k < 2; k++)
		if (off_keys[k]->state == KILN_FE_SET && om->state == KILN_FE_ABSENT) {
			char msg[256];
			snprintf(msg, sizeof msg,
			         "%s needs offload_modules (it tunes fine-grained activation "
			         "offloading)",
			         kiln_fe_field_key(off_ids[k]));
			rule_error(v, off_keys[k]->value, off_ids[k], msg);
		}
	if (fr->state == KILN_FE_SET) {
		if (!(fr->f >= 0 && fr->f <= 1))
			rule_error(v, fr->value, KILN_FE_F_ACTIVATION_OFFLOAD_FRACTION,
			           "activation_offload_fraction must be in [0, 1] (Megatron-Core's "
			           "rule)");
		else
			out->offload_fraction_set = true, out->offload_fraction = fr->f;
	}
	if (dl->state == KILN_FE_SET) {
		if (dl->i >= (INT64_C(1) << 50))
			rule_error(v, dl->value, KILN_FE_F_DELTA_OFFLOAD_BYTES_ACROSS_PP_RANKS,
			           "delta_offload_bytes_across_pp_ranks must be below 2^50 bytes");
		else
			out->delta_offload_bytes = dl->i;
	}
	if (mo->state == KILN_FE_SET) {
		if (mo->i >= (INT64_C(1) << 50))
			rule_error(v, mo->value, KILN_FE_F_MIN_OFFLOADED_TENSOR_SIZE,
			           "min_offloaded_tensor_size must be below 2^50 elements");
		else
			out->min_offloaded_set = true, out->min_offloaded_elements = mo->i;
	}
	bool moe = FLD(MOE)->state == KILN_FE_SET;
	const kiln_fe_field *moe_keys[3] = {cf, pad, fb};
	for (int k = 0; k < 3; k++)
		if (moe_keys[k]->state == KILN_FE_SET && !moe && FLD(MOE)->state != KILN_FE_BAD)
			rule_error(v, moe_keys[k]->value,
			           k == 0   ? KILN_FE_F_MOE_EXPERT_CAPACITY_FACTOR
			           : k == 1 ? KILN_FE_F_MOE_PAD_EXPERT_INPUT_TO_CAPACITY
			                    : KILN_FE_F_MOE_ROUTER_FORCE_LOAD_BALANCING,
			           "this megatron key needs model.moe");
	if (cf->state == KILN_FE_SET)
		out->capacity_factor = cf->f;
	if (pad->state == KILN_FE_SET) {
		out->pad_to_capacity = pad->b;
		if (pad->b && cf->state == KILN_FE_ABSENT)
			rule_error(
			    v, pad->value, KILN_FE_F_MOE_PAD_EXPERT_INPUT_TO_CAPACITY,
			    "moe_pad_expert_input_to_capacity needs moe_expert_capacity_factor");
	}
	if (fb->state == KILN_FE_SET)
		out->force_load_balancing = fb->b;
	if (mtp->state == KILN_FE_SET)
		out->mtp_num_layers = mtp->i;
	/* The paged stash's flags (transformer_config.py:1364-1381); a
	 * negative buffer factor is Megatron's measured sizing, not
	 * modelled. */
	kiln_fe_field *rcf = FLD(MOE_EXPERT_RANK_CAPACITY_FACTOR);
	kiln_fe_field *sc = FLD(MOE_PAGED_STASH_BUFFER_SIZE_FACTOR_CUDA);
	kiln_fe_field *sh = FLD(MOE_PAGED_STASH_BUFFER_SIZE_FACTOR_CPU);
	kiln_fe_field *ps = FLD(MOE_PAGED_STASH_PAGE_SIZE);
	const kiln_fe_field *stash_keys[4] = {rcf, sc, sh, ps};
	const kiln_fe_field_id stash_ids[4] = {KILN_FE_F_MOE_EXPERT_RANK_CAPACITY_FACTOR,
	                                       KILN_FE_F_MOE_PAGED_STASH_BUFFER_SIZE_FACTOR_CUDA,
	                                       KILN_FE_F_MOE_PAGED_STASH_BUFFER_SIZE_FACTOR_CPU,
	                                       KILN_FE_F_MOE_PAGED_STASH_PAGE_SIZE};
	for (int k = 0; k < 4; k++)
		if (stash_keys[k]->state == KILN_FE_SET && !moe && FLD(MOE)->state != KILN_FE_BAD)
			rule_error(v, stash_keys[k]->value, stash_ids[k],
			           "this megatron key needs model.moe");
	if (rcf->state == KILN_FE_SET) {
		if (rcf->f >= 1e6)
			rule_error(v, rcf->value, KILN_FE_F_MOE_EXPERT_RANK_CAPACITY_FACTOR,
			           "moe_expert_rank_capacity_factor must be below 1e6");
		else
			out->rank_capacity_factor = rcf->f;
	}
	for (int k = 1; k <= 2; k++) {
		const kiln_fe_field *f = stash_keys[k];
		if (f->state != KILN_FE_SET)
			continue;
		if (!(f->f >= 0 && f->f < 1e6)) {
			char msg[256];
			snprintf(msg, sizeof msg,
			         "%s must be in [0, 1e6) (Megatron's negative factor, sized from "
			         "measured rows, is not modelled)",
			         kiln_fe_field_key(stash_ids[k]));
			rule_error(v, f->value, stash_ids[k], msg);
		} else if (k == 1) {
			out->paged_stash_cuda_set = true;
			out->paged_stash_cuda_factor = f->f;
		} else {
			out->paged_stash_cpu_set = true;
			out->paged_stash_cpu_factor = f->f;
		}
	}
	if (ps->state == KILN_FE_SET) {
		if (ps->i > 1048576)
			rule_error(v, ps->value, KILN_FE_F_MOE_PAGED_STASH_PAGE_SIZE,
			           "moe_paged_stash_page_size must be at most 1048576 rows");
		else
			out->paged_stash_page_size = ps->i;
	}
}

static void check_stage_layers(vctx *v, derived *d)
{
	kiln_fe_field *sl = FLD(STAGE_LAYERS);
	char msg[256];
	if (sl->state == KILN_FE_SET && sl->value->n == 0)
		sl->state = KILN_FE_ABSENT; /* `stage_layers: []` asks for the default split */
	if (sl->state == KILN_FE_SET) {
		const kiln_fe_node *seq = sl->value;
		bool items_ok = true;
		int64_t sum = 0;
		bool sum_overflow = false;
		for (size_t i = 0; i < seq->n; i++) {
			const kiln_fe_node *it = seq->items[i];
			int64_t x;
			if (!kiln_fe_node_int(v->c, it, "stage_layers", &x)) {
				items_ok = false;
				continue;
			}
			if (x < 1) {
				kiln_fe_error(v->c, it->line, it->col,
				              "stage_layers entries must be positive, got %lld",
				              (long long)x);
				items_ok = false;
				continue;
			}
			if (__builtin_add_overflow(sum, x, &sum))
				sum_overflow = true;
		}
		if (d->chunks_ok && (uint64_t)seq->n != (uint64_t)d->chunks) {
			snprintf(msg, sizeof(msg),
			         "stage_layers has length %zu, expected pp * vpp = %lld", seq->n,
			         (long long)d->chunks);
			rule_error(v, seq, KILN_FE_F_STAGE_LAYERS, msg);
			return;
		}
		if (!items_ok) {
			sl->state = KILN_FE_BAD;
			return;
		}
		if (OK(LAYERS) && (sum_overflow || sum != VAL(LAYERS))) {
			if (sum_overflow)
				snprintf(msg, sizeof(msg),
				         "stage_layers sum past 2^63, expected layers (%lld)",
				         (long long)VAL(LAYERS));
			else
				snprintf(msg, sizeof(msg),
				         "stage_layers sum to %lld, expected layers (%lld)",
				         (long long)sum, (long long)VAL(LAYERS));
			rule_error(v, seq, KILN_FE_F_STAGE_LAYERS, msg);
			return;
		}
		if (!d->chunks_ok || !OK(LAYERS))
			return;
		d->stage_layers = kiln_arena_alloc(v->c->a, seq->n * sizeof(int64_t));
		if (!d->stage_layers) {
			kiln_fe_oom(v->c);
			return;
		}
		for (size_t i = 0; i < seq->n; i++)
			kiln_fe_node_int(v->c, seq->items[i], "stage_layers", &d->stage_layers[i]);
		return;
	}
	if (!d->chunks_ok || !OK(LAYERS) || sl->state == KILN_FE_BAD)
		return;
	if (megatron_split(v, d))
		return;
	/* Default split: even, and the remainder goes one layer each to chunks
	 * 1..r, since chunk 0 also carries the embedding. */
	int64_t n = d->chunks, base = VAL(LAYERS) / n, r = VAL(LAYERS) % n;
	d->stage_layers = kiln_arena_alloc(v->c->a, (size_t)n * sizeof(int64_t));
	if (!d->stage_layers) {
		kiln_fe_oom(v->c);
		return;
	}
	for (int64_t i = 0; i < n; i++)
		d->stage_layers[i] = base + (i >= 1 && i <= r ? 1 : 0);
}

static void check_parallel(vctx *v, derived *d)
{
	char msg[320];
	require(v, KILN_FE_F_GLOBAL_BATCH, NULL);
	default_int(v, KILN_FE_F_MICRO_BATCH, 1, true);
	require(v, KILN_FE_F_DEVICES, NULL);
	default_int(v, KILN_FE_F_TP, 1, true);
	default_int(v, KILN_FE_F_PP, 1, true);
	default_int(v, KILN_FE_F_EP, 1, true);
	default_int(v, KILN_FE_F_VPP, 1, true);
	kiln_fe_field *sp = FLD(SEQUENCE_PARALLEL);
	if (sp->state == KILN_FE_ABSENT) {
		sp->b = VAL(TP) > 1;
		if (!OK(TP))
			sp->state = KILN_FE_BAD;
	}
	kiln_fe_state moe = FLD(MOE)->state;
	bool interleaved =
	    FLD(SCHEDULE)->state != KILN_FE_BAD && VAL(SCHEDULE) == KILN_SCHED_INTERLEAVED;

	if (moe == KILN_FE_ABSENT && FLD(EP)->state == KILN_FE_SET && VAL(EP) != 1) {
		snprintf(msg, sizeof(msg),
		         "ep (%lld) must be 1 without moe (a dense model has no "
		         "experts)",
		         (long long)VAL(EP));
		rule_error(v, FLD(EP)->value, KILN_FE_F_EP, msg);
	}
	if (OK(HEADS) && OK(TP) && VAL(HEADS) % VAL(TP) != 0) {
		snprintf(msg, sizeof(msg), "heads (%lld) must be divisible by tp (%lld)",
		         (long long)VAL(HEADS), (long long)VAL(TP));
		kiln_fe_error(v->c, where2(v, KILN_FE_F_TP, KILN_FE_F_HEADS)->line,
		              where2(v, KILN_FE_F_TP, KILN_FE_F_HEADS)->col, "%s", msg);
	}
	if (OK(KV_HEADS) && OK(TP) && VAL(KV_HEADS) % VAL(TP) != 0 &&
	    VAL(TP) % VAL(KV_HEADS) != 0) {
		snprintf(msg, sizeof(msg),
		         "kv_heads (%lld) and tp (%lld) must divide one another (each rank holds "
		         "whole kv heads, or a kv head is replicated over whole ranks)",
		         (long long)VAL(KV_HEADS), (long long)VAL(TP));
		const kiln_fe_node *at = where2(v, KILN_FE_F_TP, KILN_FE_F_KV_HEADS);
		kiln_fe_error(v->c, at->line, at->col, "%s", msg);
	}
	/* Sequence parallelism splits the sequence over the tp ranks, and so does
	 * the MoE block (expert tensor parallelism is 1: each tp rank routes its
	 * own share of the tokens). Megatron requires the same. */
	if (OK(SEQ_LEN) && OK(TP) && VAL(TP) > 1 && VAL(SEQ_LEN) % VAL(TP) != 0 &&
	    (moe == KILN_FE_SET || (sp->state != KILN_FE_BAD && sp->b))) {
		snprintf(msg, sizeof(msg),
		         "seq_len (%lld) must be divisible by tp (%lld): %s splits the sequence "
		         "over the tp ranks",
		         (long long)VAL(SEQ_LEN), (long long)VAL(TP),
		         moe == KILN_FE_SET ? "the MoE block" : "sequence_parallel");
		rule_error(v, where2(v, KILN_FE_F_TP, KILN_FE_F_SEQ_LEN), KILN_FE_F_TP, msg);
	}
	if (moe == KILN_FE_SET && OK(EXPERTS) && OK(EP) && VAL(EXPERTS) % VAL(EP) != 0) {
		snprintf(msg, sizeof(msg), "experts (%lld) must be divisible by ep (%lld)",
		         (long long)VAL(EXPERTS), (long long)VAL(EP));
		rule_error(v, where2(v, KILN_FE_F_EP, KILN_FE_F_EXPERTS), KILN_FE_F_EP, msg);
	}

	/* Schedule and chunks. */
	if (OK(SCHEDULE) && OK(VPP)) {
		if (!interleaved && VAL(VPP) != 1) {
			snprintf(msg, sizeof(msg),
			         "vpp (%lld) must be 1 with schedule 1f1b (virtual stages need "
			         "schedule: interleaved)",
			         (long long)VAL(VPP));
			rule_error(v, FLD(VPP)->value, KILN_FE_F_VPP, msg);
		} else if (interleaved && VAL(VPP) < 2) {
			snprintf(msg, sizeof(msg),
			         "schedule interleaved needs vpp >= 2, got vpp (%lld)",
			         (long long)VAL(VPP));
			rule_error(v, where2(v, KILN_FE_F_VPP, KILN_FE_F_SCHEDULE), KILN_FE_F_VPP,
			           msg);
		}
	}
	if (interleaved && OK(PP) && VAL(PP) < 2) {
		snprintf(msg, sizeof(msg), "schedule interleaved needs pp >= 2, got pp (%lld)",
		         (long long)VAL(PP));
		rule_error(v, where2(v, KILN_FE_F_PP, KILN_FE_F_SCHEDULE), KILN_FE_F_PP, msg);
	}
	if (OK(PP) && OK(LAYERS) && VAL(PP) > VAL(LAYERS)) {
		snprintf(msg, sizeof(msg), "pp (%lld) must not exceed layers (%lld)",
		         (long long)VAL(PP), (long long)VAL(LAYERS));
		rule_error(v, where2(v, KILN_FE_F_PP, KILN_FE_F_LAYERS), KILN_FE_F_PP, msg);
	}
	if (OK(PP) && OK(VPP) && OK(LAYERS)) {
		int64_t chunks;
		/* The embedding and the loss may stand in for a layer of their
		 * chunk (account_for_embedding / account_for_loss). */
		int64_t extra =
		    (FLD(ACCOUNT_FOR_EMBEDDING)->state == KILN_FE_SET &&
		     FLD(ACCOUNT_FOR_EMBEDDING)->b) +
		    (FLD(ACCOUNT_FOR_LOSS)->state == KILN_FE_SET && FLD(ACCOUNT_FOR_LOSS)->b);
		if (__builtin_mul_overflow(VAL(PP), VAL(VPP), &chunks) ||
		    chunks > VAL(LAYERS) + extra) {
			snprintf(msg, sizeof(msg),
			         "layers (%lld) must be at least pp * vpp (%lld * %lld)",
			         (long long)VAL(LAYERS), (long long)VAL(PP), (long long)VAL(VPP));
			rule_error(v, where2(v, KILN_FE_F_VPP, KILN_FE_F_PP), KILN_FE_F_VPP, msg);
		} else {
			d->chunks_ok = true;
			d->chunks = chunks;
		}
	}
	/* issue 15, item 2: the time model's layout keys. */
	if (FLD(DISPATCHER)->state == KILN_FE_ABSENT)
		FLD(DISPATCHER)->i = KILN_DISPATCH_ALLTOALL;
	kiln_fe_field *ov = FLD(OVERLAP_EP_COMM);
	if (ov->state == KILN_FE_ABSENT)
		ov->b = false;
	if (FLD(ACCOUNT_FOR_EMBEDDING)->state == KILN_FE_ABSENT)
		FLD(ACCOUNT_FOR_EMBEDDING)->b = false;
	if (FLD(ACCOUNT_FOR_LOSS)->state == KILN_FE_ABSENT)
		FLD(ACCOUNT_FOR_LOSS)->b = false;
	if (ov->state == KILN_FE_SET && ov->b && OK(EP) && VAL(EP) < 2)
		rule_error(v, ov->value, KILN_FE_F_OVERLAP_EP_COMM,
		           "overlap_ep_comm needs ep >= 2 (there is no all-to-all to overlap)");
	if (FLD(STAGE_LAYERS)->state == KILN_FE_SET && FLD(STAGE_LAYERS)->value->n > 0) {
		const kiln_fe_field_id split[4] = {
		    KILN_FE_F_FIRST_STAGE_LAYERS, KILN_FE_F_LAST_STAGE_LAYERS,
		    KILN_FE_F_ACCOUNT_FOR_EMBEDDING, KILN_FE_F_ACCOUNT_FOR_LOSS};
		for (int k = 0; k < 4; k++)
			if (v->f[split[k]].state == KILN_FE_SET) {
				snprintf(
				    msg, sizeof(msg),
				    "%s cannot be combined with an explicit stage_layers (which "
				    "already gives every chunk's layers)",
				    kiln_fe_field_key(split[k]));
				rule_error(v, v->f[split[k]].value, split[k], msg);
			}
	}
	check_stage_layers(v, d);

	/* Data parallelism must be whole. */
	if (OK(DEVICES) && OK(TP) && OK(PP)) {
		int64_t tpp;
		if (__builtin_mul_overflow(VAL(TP), VAL(PP), &tpp) || VAL(DEVICES) % tpp != 0) {
			snprintf(msg, sizeof(msg),
			         "devices (%lld) must be divisible by tp * pp (%lld * %lld)",
			         (long long)VAL(DEVICES), (long long)VAL(TP), (long long)VAL(PP));
			rule_error(v, where(v, KILN_FE_F_DEVICES), KILN_FE_F_DEVICES, msg);
		} else {
			d->dp_ok = true;
			d->dp = VAL(DEVICES) / tpp;
		}
	}
	/* Experts are laid out over the tp * dp ranks of a stage (expert tensor
	 * parallelism 1, as in Megatron-Core's MoE parallel folding). dp * tp
	 * cannot overflow: it is at most devices. */
	if (d->dp_ok && OK(EP) && OK(TP) && moe != KILN_FE_BAD) {
		int64_t dptp = d->dp * VAL(TP);
		if (dptp % VAL(EP) != 0) {
			snprintf(msg, sizeof(msg),
			         "ep (%lld) must divide dp * tp (%lld * %lld): experts are laid "
			         "out over "
			         "the tp * dp ranks of a pipeline stage",
			         (long long)VAL(EP), (long long)d->dp, (long long)VAL(TP));
			rule_error(v, where(v, KILN_FE_F_EP), KILN_FE_F_EP, msg);
		} else {
			d->edp_ok = true;
			d->edp = dptp / VAL(EP);
		}
	}
	if (d->dp_ok && OK(MICRO_BATCH) && OK(GLOBAL_BATCH)) {
		int64_t mbdp;
		if (__builtin_mul_overflow(VAL(MICRO_BATCH), d->dp, &mbdp) ||
		    VAL(GLOBAL_BATCH) % mbdp != 0) {
			snprintf(
			    msg, sizeof(msg),
			    "global_batch (%lld) must be divisible by micro_batch * dp (%lld * "
			    "%lld)",
			    (long long)VAL(GLOBAL_BATCH), (long long)VAL(MICRO_BATCH),
			    (long long)d->dp);
			rule_error(v, where(v, KILN_FE_F_GLOBAL_BATCH), KILN_FE_F_GLOBAL_BATCH,
			           msg);
		} else if (VAL(GLOBAL_BATCH) / mbdp > KILN_FRONTEND_MAX_MICRO_BATCHES) {
			snprintf(msg, sizeof(msg),
			         "micro-batches per iteration (global_batch / (micro_batch * dp) = "
			         "%lld / (%lld * %lld) = %lld) exceed the limit of %d",
			         (long long)VAL(GLOBAL_BATCH), (long long)VAL(MICRO_BATCH),
			         (long long)d->dp, (long long)(VAL(GLOBAL_BATCH) / mbdp),
			         KILN_FRONTEND_MAX_MICRO_BATCHES);
			rule_error(v, where(v, KILN_FE_F_GLOBAL_BATCH), KILN_FE_F_GLOBAL_BATCH,
			           msg);
		} else {
			d->mbs_ok = true;
			d->micro_batches = VAL(GLOBAL_BATCH) / mbdp;
		}
	}
	if (interleaved && d->mbs_ok && OK(PP) && VAL(PP) >= 2 && d->micro_batches % VAL(PP)) {
		snprintf(msg, sizeof(msg),
		         "schedule interleaved needs micro-batches per iteration (global_batch / "
		         "(micro_batch * dp) = %lld) to be a multiple of pp (%lld)",
		         (long long)d->micro_batches, (long long)VAL(PP));
		rule_error(v, where(v, KILN_FE_F_GLOBAL_BATCH), KILN_FE_F_GLOBAL_BATCH, msg);
	}
}

/* ---- sizes that must stay below 2^62 bytes */

typedef struct factor {
	const char *name;
	int64_t value;
	const kiln_fe_node *node; /* where a violation is reported; NULL: never */
} factor;

/* Reports when the product of fs (all positive) reaches SIZE_LIMIT, at the
 * node of the largest factor. what names the size; formula the product. */
static void check_product(vctx *v, const char *what, const char *formula, const factor *fs,
                          size_t n)
{
	uint64_t p = 1;
	bool over = false;
	for (size_t i = 0; i < n; i++)
		if (__builtin_mul_overflow(p, (uint64_t)fs[i].value, &p))
			over = true;
	if (!over && p < SIZE_LIMIT)
		return;
	size_t big = n;
	for (size_t i = 0; i < n; i++)
		if (fs[i].node && (big == n || fs[i].value > fs[big].value))
			big = i;
	const kiln_fe_node *at = big < n ? fs[big].node : v->root;
	char nums[256];
	size_t o = 0;
	nums[0] = '\0';
	for (size_t i = 0; i < n && o < sizeof(nums); i++)
		o += (size_t)snprintf(nums + o, sizeof(nums) - o, "%s%lld", i ? " * " : "",
		                      (long long)fs[i].value);
	kiln_fe_error(v->c, at->line, at->col, "%s %s = %s bytes reaches 2^62 (too large)", what,
	              formula, nums);
}

static int64_t imax(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

/* 2 * x, saturating. */
static int64_t twice(int64_t x)
{
	return x > INT64_MAX / 2 ? INT64_MAX : 2 * x;
}

static void check_sizes(vctx *v)
{
	kiln_fe_state moe = FLD(MOE)->state;
	if (moe == KILN_FE_BAD || !OK(SEQ_LEN) || !OK(MICRO_BATCH))
		return;
	const kiln_fe_node *seq = where(v, KILN_FE_F_SEQ_LEN);
	const kiln_fe_node *mb = FLD(MICRO_BATCH)->value;
	bool is_moe = moe == KILN_FE_SET;

	if (OK(HEADS)) {
		factor fs[] = {{"seq_len", VAL(SEQ_LEN), seq},
		               {"seq_len", VAL(SEQ_LEN), seq},
		               {"heads", VAL(HEADS), FLD(HEADS)->value},
		               {"micro_batch", VAL(MICRO_BATCH), mb},
		               {"4", 4, NULL}};
		/* Flash attention stores no scores, but its work is priced from the
		 * same product (passes/lower.c), so the bound holds for both. */
		const char *what = FLD(ATTENTION)->state == KILN_FE_BAD ? "attention scores"
		                   : VAL(ATTENTION) == KILN_ATTN_EAGER
		                       ? "eager attention scores"
		                       : "attention scores (flash attention stores none, but "
		                         "prices its work by them)";
		check_product(v, what, "seq_len * seq_len * heads * micro_batch * 4", fs, 5);
	}
	if (OK(VOCAB)) {
		factor fs[] = {{"seq_len", VAL(SEQ_LEN), seq},
		               {"micro_batch", VAL(MICRO_BATCH), mb},
		               {"vocab", VAL(VOCAB), FLD(VOCAB)->value},
		               {"4", 4, NULL}};
		check_product(v, "fp32 logits", "seq_len * micro_batch * vocab * 4", fs, 4);
	}
	bool widths_ok = OK(HIDDEN) && OK(FFN_HIDDEN) && (!is_moe || OK(EXPERT_FFN_HIDDEN));
	if (widths_ok && (!is_moe || (OK(TOP_K) && OK(MAX_FACTOR)))) {
		/* The widest activation row, and the factor it comes from. */
		int64_t w = VAL(HIDDEN);
		const kiln_fe_node *wn = FLD(HIDDEN)->value;
		if (twice(VAL(FFN_HIDDEN)) > w) {
			w = twice(VAL(FFN_HIDDEN));
			wn = FLD(FFN_HIDDEN)->value;
		}
		if (is_moe && twice(VAL(EXPERT_FFN_HIDDEN)) > w) {
			w = twice(VAL(EXPERT_FFN_HIDDEN));
			wn = FLD(EXPERT_FFN_HIDDEN)->value;
		}
		double mf = ceil(FLD(MAX_FACTOR)->f);
		int64_t factor_ceil = !is_moe ? 1 : mf >= 0x1p62 ? INT64_MAX : (int64_t)mf;
		factor fs[] = {{"seq_len", VAL(SEQ_LEN), seq},
		               {"micro_batch", VAL(MICRO_BATCH), mb},
		               {"top_k", is_moe ? VAL(TOP_K) : 1, FLD(TOP_K)->value},
		               {"width", w, wn},
		               {"4", 4, NULL},
		               {"max_factor", factor_ceil, FLD(MAX_FACTOR)->value}};
		check_product(
		    v, "expert activations",
		    "seq_len * micro_batch * top_k * max(hidden, 2 * expert_ffn_hidden, 2 "
		    "* ffn_hidden) * 4 * ceil(max_factor)",
		    fs, 6);
	}
	if (widths_ok && OK(LAYERS) && OK(VOCAB) &&
	    (!is_moe || (OK(EXPERTS) && OK(SHARED_EXPERTS)))) {
		int64_t h = VAL(HIDDEN),
		        f = imax(VAL(FFN_HIDDEN), is_moe ? VAL(EXPERT_FFN_HIDDEN) : 0);
		int64_t e = is_moe ? VAL(EXPERTS) : 0, s = is_moe ? VAL(SHARED_EXPERTS) : 0;
		uint64_t t1, t2, t3, per, total, n_ffn;
		bool over =
		    __builtin_mul_overflow((uint64_t)h, (uint64_t)h, &t1) ||
		    __builtin_mul_overflow(t1, 4u, &t1) ||
		    __builtin_add_overflow((uint64_t)e, (uint64_t)s, &n_ffn) ||
		    __builtin_add_overflow(n_ffn, 1u, &n_ffn) ||
		    __builtin_mul_overflow((uint64_t)h, (uint64_t)f, &t2) ||
		    __builtin_mul_overflow(t2, 3u, &t2) || __builtin_mul_overflow(t2, n_ffn, &t2) ||
		    __builtin_mul_overflow((uint64_t)VAL(VOCAB), (uint64_t)h, &t3) ||
		    __builtin_add_overflow(t1, t2, &per) || __builtin_add_overflow(per, t3, &per) ||
		    __builtin_mul_overflow(per, (uint64_t)VAL(LAYERS), &total) ||
		    __builtin_mul_overflow(total, 18u, &total);
		if (over || total >= SIZE_LIMIT) {
			/* Report at the largest of the sizes involved. */
			factor fs[] = {{"layers", VAL(LAYERS), FLD(LAYERS)->value},
			               {"hidden", h, FLD(HIDDEN)->value},
			               {"ffn_hidden", VAL(FFN_HIDDEN), FLD(FFN_HIDDEN)->value},
			               {"expert_ffn_hidden", is_moe ? VAL(EXPERT_FFN_HIDDEN) : 0,
			                FLD(EXPERT_FFN_HIDDEN)->value},
			               {"experts", e, FLD(EXPERTS)->value},
			               {"vocab", VAL(VOCAB), FLD(VOCAB)->value}};
			size_t big = 6;
			for (size_t i = 0; i < 6; i++)
				if (fs[i].node && (big == 6 || fs[i].value > fs[big].value))
					big = i;
			const kiln_fe_node *at = big < 6 ? fs[big].node : v->root;
			kiln_fe_error(
			    v->c, at->line, at->col,
			    "parameter bytes layers * (4 * hidden^2 + 3 * hidden * "
			    "max(ffn_hidden, expert_ffn_hidden) * (experts + shared_experts + "
			    "1) + vocab * hidden) * 18 reach 2^62 (layers %lld, hidden %lld, "
			    "ffn width %lld, experts %lld + %lld, vocab %lld)",
			    (long long)VAL(LAYERS), (long long)h, (long long)f, (long long)e,
			    (long long)s, (long long)VAL(VOCAB));
		}
	}
}

/* Saturating arithmetic on non-negative sizes. */
static uint64_t sat_mul(uint64_t a, uint64_t b)
{
	uint64_t r;
	return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	uint64_t r;
	return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* The attention (MLA included), router and shared-expert sizes the
 * lowering multiplies, which the checks above do not bound: one activation
 * row of each kind, and their parameters over all layers. */
static void check_more_sizes(vctx *v)
{
	bool is_moe = FLD(MOE)->state == KILN_FE_SET;
	if (FLD(MOE)->state == KILN_FE_BAD || !OK(SEQ_LEN) || !OK(MICRO_BATCH) || !OK(HEADS) ||
	    !OK(KV_HEADS) || !OK(HEAD_DIM) || !OK(HIDDEN) || !OK(LAYERS) || !OK(Q_LORA_RANK) ||
	    !OK(KV_LORA_RANK) || !OK(ROPE_HEAD_DIM) || !OK(V_HEAD_DIM) ||
	    (is_moe && (!OK(EXPERTS) || !OK(SHARED_EXPERTS) || !OK(EXPERT_FFN_HIDDEN))))
		return;
	uint64_t h = (uint64_t)VAL(HIDDEN), H = (uint64_t)VAL(HEADS), kv = (uint64_t)VAL(KV_HEADS);
	uint64_t d = (uint64_t)VAL(HEAD_DIM), rope = (uint64_t)VAL(ROPE_HEAD_DIM);
	uint64_t dv = (uint64_t)VAL(V_HEAD_DIM), ql = (uint64_t)VAL(Q_LORA_RANK);
	uint64_t kl = (uint64_t)VAL(KV_LORA_RANK);
	uint64_t E = is_moe ? (uint64_t)VAL(EXPERTS) : 0;
	uint64_t fs = is_moe ? sat_mul((uint64_t)VAL(SHARED_EXPERTS), (uint64_t)VAL(EXPERT_FFN_HIDDEN))
	                     : 0;
	uint64_t qk = sat_mul(H, sat_add(d, rope)); /* q and k row width */
	uint64_t head_width = sat_add(sat_add(qk, sat_mul(H, dv)), sat_mul(kv, d));

	/* The widest of these rows, in bytes (fp32 at most), per token. */
	struct {
		const char *name;
		uint64_t width;
		kiln_fe_field_id at;
	} rows[] = {
	    {"heads * (head_dim + rope_head_dim)", qk, KILN_FE_F_HEADS},
	    {"heads * v_head_dim", sat_mul(H, dv), KILN_FE_F_V_HEAD_DIM},
	    {"kv_heads * head_dim", sat_mul(kv, d), KILN_FE_F_KV_HEADS},
	    {"q_lora_rank", ql, KILN_FE_F_Q_LORA_RANK},
	    {"kv_lora_rank + rope_head_dim", sat_add(kl, rope), KILN_FE_F_KV_LORA_RANK},
	    {"experts", E, KILN_FE_F_EXPERTS},
	    {"2 * shared_experts * expert_ffn_hidden", sat_mul(2, fs), KILN_FE_F_SHARED_EXPERTS},
	};
	size_t w = 0;
	for (size_t i = 1; i < sizeof rows / sizeof rows[0]; i++)
		if (rows[i].width > rows[w].width)
			w = i;
	uint64_t row_bytes = sat_mul(sat_mul((uint64_t)VAL(SEQ_LEN), (uint64_t)VAL(MICRO_BATCH)),
	                             sat_mul(rows[w].width, 4));
	if (row_bytes >= SIZE_LIMIT) {
		const kiln_fe_node *at = where(v, rows[w].at);
		kiln_fe_error(v->c, at->line, at->col,
		              "activation seq_len * micro_batch * %s * 4 = %lld * %lld * %llu * 4 "
		              "bytes reaches 2^62 (too large)",
		              rows[w].name, (long long)VAL(SEQ_LEN), (long long)VAL(MICRO_BATCH),
		              (unsigned long long)rows[w].width);
		return;
	}

	/* Attention and shared-expert parameters, 18 bytes each, all layers. */
	uint64_t attn = sat_add(sat_mul(h, head_width), sat_mul(sat_mul(H, dv), h));
	attn = sat_add(attn, sat_mul(sat_add(sat_add(ql, kl), rope), sat_add(h, head_width)));
	uint64_t shared = sat_mul(sat_mul(3, h), fs);
	uint64_t bytes = sat_mul(sat_mul(sat_add(attn, shared), (uint64_t)VAL(LAYERS)), 18);
	if (bytes >= SIZE_LIMIT) {
		kiln_fe_field_id at_id = shared > attn ? KILN_FE_F_SHARED_EXPERTS : KILN_FE_F_HEADS;
		const kiln_fe_node *at = where(v, at_id);
		kiln_fe_error(v->c, at->line, at->col,
		              "attention and shared-expert parameter bytes reach 2^62 (too large): "
		              "layers %lld x (%llu attention + %llu shared-expert parameters) x 18",
		              (long long)VAL(LAYERS), (unsigned long long)attn,
		              (unsigned long long)shared);
	}
}

/* ---- the model */

/* The file name of path without directory and extension, arena-owned. */
static const char *default_name(kiln_fe_ctx *c, const char *path)
{
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	const char *dot = strrchr(base, '.');
	size_t len = dot && dot != base ? (size_t)(dot - base) : strlen(base);
	if (len == 0)
		return "model";
	return kiln_arena_strndup(c->a, base, len);
}

kiln_model *kiln_fe_model_build(kiln_fe_ctx *c, const kiln_fe_node *root, const char *path,
                                const char *base_dir)
{
	vctx *v = kiln_arena_alloc(c->a, sizeof(*v));
	if (!v) {
		kiln_fe_oom(c);
		return NULL;
	}
	v->c = c;
	v->root = root;
	kiln_fe_section_read(c, KILN_FE_S_TOP, root, v->f);

	kiln_fe_field *ver = FLD(KILN);
	require(v, KILN_FE_F_KILN, " (the format version; write `kiln: 1` first)");
	if (ver->state == KILN_FE_SET && ver->i != 1)
		kiln_fe_error(c, ver->value->line, ver->value->col,
		              "unsupported format version kiln: %lld; this kiln reads version 1",
		              (long long)ver->i);

	read_section(v, KILN_FE_F_MODEL, KILN_FE_S_MODEL, true);
	read_section(v, KILN_FE_F_MLA, KILN_FE_S_MLA, false);
	read_section(v, KILN_FE_F_MOE, KILN_FE_S_MOE, false);
	read_section(v, KILN_FE_F_TRAINING, KILN_FE_S_TRAINING, true);
	read_section(v, KILN_FE_F_PARALLEL, KILN_FE_S_PARALLEL, true);
	read_section(v, KILN_FE_F_LOAD, KILN_FE_S_LOAD, false);
	read_section(v, KILN_FE_F_MEGATRON, KILN_FE_S_MEGATRON, false);

	kiln_model *m = kiln_arena_alloc(c->a, sizeof(*m));
	if (!m) {
		kiln_fe_oom(c);
		return NULL;
	}
	kiln_fe_field *hw = FLD(HARDWARE);
	if (hw->state == KILN_FE_ABSENT)
		kiln_fe_error(
		    c, root->line, root->col,
		    "missing required key 'hardware' (a shipped profile name, a path or a "
		    "mapping)");
	else if (hw->state == KILN_FE_SET)
		kiln_fe_hardware_resolve(c, hw->key, hw->value, base_dir, path, &m->hw);

	check_model(v);
	check_memory_options(v);
	kiln_fe_field *mf = FLD(MAX_FACTOR);
	if (mf->state == KILN_FE_ABSENT) /* a dense model's load never varies */
		mf->f = FLD(MOE)->state == KILN_FE_ABSENT ? 1.0 : 3.0;
	else if (mf->state == KILN_FE_SET && !(mf->f >= 1)) {
		char msg[128];
		snprintf(msg, sizeof(msg), "max_factor (%g) must be at least 1", mf->f);
		rule_error(v, mf->value, KILN_FE_F_MAX_FACTOR, msg);
	}
	else if (mf->state == KILN_FE_SET && mf->f > KILN_MAX_LOAD_FACTOR) {
		char msg[160];
		snprintf(msg, sizeof(msg), "max_factor (%g) must be at most %g (plan tables stop there)",
		         mf->f, KILN_MAX_LOAD_FACTOR);
		rule_error(v, mf->value, KILN_FE_F_MAX_FACTOR, msg);
	}
	derived d;
	memset(&d, 0, sizeof(d));
	check_parallel(v, &d);
	kiln_megatron mg;
	check_megatron(v, &mg);
	/* Routing cannot load a rank beyond the point where every token of the
	 * ep ranks sends it min(top_k, experts / ep) rows: r_max = ep *
	 * min(top_k, experts / ep) / top_k. Planning beyond that plans for loads
	 * that cannot happen. */
	if (FLD(MOE)->state == KILN_FE_SET && OK(EXPERTS) && OK(TOP_K) && OK(EP) &&
	    VAL(EXPERTS) % VAL(EP) == 0 && mf->state != KILN_FE_BAD) {
		int64_t local = VAL(EXPERTS) / VAL(EP);
		int64_t per_token = VAL(TOP_K) < local ? VAL(TOP_K) : local;
		double r_max = (double)VAL(EP) * (double)per_token / (double)VAL(TOP_K);
		if (mf->state == KILN_FE_ABSENT) {
			mf->f = r_max < 3.0 ? r_max : 3.0;
		} else if (mf->f > r_max + 1e-9) {
			char msg[320];
			snprintf(msg, sizeof(msg),
			         "max_factor (%g) exceeds the largest load routing can produce with "
			         "this layout: ep * min(top_k, experts / ep) / top_k = %lld * %lld / "
			         "%lld = %g",
			         mf->f, (long long)VAL(EP), (long long)per_token, (long long)VAL(TOP_K),
			         r_max);
			rule_error(v, mf->value, KILN_FE_F_MAX_FACTOR, msg);
		}
	}
	size_t errors_before = c->n_errors;
	check_sizes(v);
	if (c->n_errors == errors_before) /* one size error is enough */
		check_more_sizes(v);
	if (c->n_errors || c->nomem)
		return NULL;

	/* Every field is SET or defaulted from here on. */
	m->path = kiln_arena_strdup(c->a, path);
	m->name = FLD(NAME)->state == KILN_FE_SET ? FLD(NAME)->s : default_name(c, path);
	m->layers = VAL(LAYERS);
	m->dense_layers = VAL(DENSE_LAYERS);
	m->hidden = VAL(HIDDEN);
	m->ffn_hidden = VAL(FFN_HIDDEN);
	m->heads = VAL(HEADS);
	m->kv_heads = VAL(KV_HEADS);
	m->head_dim = VAL(HEAD_DIM);
	m->vocab = VAL(VOCAB);
	m->seq_len = VAL(SEQ_LEN);
	m->attention = (kiln_attention)VAL(ATTENTION);
	m->activation_fn = (kiln_act_fn)VAL(ACTIVATION);
	m->activation = m->activation_fn == KILN_ACTFN_GELU ? KILN_FN_GELU : KILN_FN_SWIGLU;
	m->dropout = FLD(DROPOUT)->f;
	m->mla = FLD(MLA)->state == KILN_FE_SET;
	m->q_lora_rank = VAL(Q_LORA_RANK);
	m->kv_lora_rank = VAL(KV_LORA_RANK);
	m->rope_head_dim = VAL(ROPE_HEAD_DIM);
	m->v_head_dim = VAL(V_HEAD_DIM);
	m->moe = FLD(MOE)->state == KILN_FE_SET;
	m->experts = VAL(EXPERTS);
	m->shared_experts = VAL(SHARED_EXPERTS);
	m->top_k = VAL(TOP_K);
	m->expert_ffn_hidden = VAL(EXPERT_FFN_HIDDEN);
	m->moe_activation_fn = (kiln_act_fn)VAL(MOE_ACTIVATION);
	m->moe_activation = m->moe_activation_fn == KILN_ACTFN_GELU ? KILN_FN_GELU : KILN_FN_SWIGLU;
	m->linear_bias = FLD(LINEAR_BIAS)->b;
	m->fused_qkv = FLD(FUSED_QKV)->b;
	m->norm_saves_rstd = FLD(NORM_SAVES_RSTD)->b;
	m->prob_apply = (kiln_prob_apply)VAL(PROB_APPLY);
	m->moe_permute_fusion = FLD(MOE_PERMUTE_FUSION)->b;
	m->micro_batch = VAL(MICRO_BATCH);
	m->global_batch = VAL(GLOBAL_BATCH);
	m->dtype = (kiln_dtype)VAL(DTYPE);
	m->optimizer = (kiln_optimizer)VAL(OPTIMIZER);
	m->distributed_optimizer = FLD(DISTRIBUTED_OPTIMIZER)->b;
	m->devices = VAL(DEVICES);
	m->tp = VAL(TP);
	m->pp = VAL(PP);
	m->ep = VAL(EP);
	m->sequence_parallel = FLD(SEQUENCE_PARALLEL)->b;
	m->schedule = (kiln_schedule)VAL(SCHEDULE);
	m->vpp = VAL(VPP);
	m->stage_layers = d.stage_layers;
	m->n_stage_layers = (size_t)d.chunks;
	m->dispatcher = (kiln_dispatcher)VAL(DISPATCHER);
	m->overlap_ep_comm = FLD(OVERLAP_EP_COMM)->b;
	m->account_for_embedding = FLD(ACCOUNT_FOR_EMBEDDING)->b;
	m->account_for_loss = FLD(ACCOUNT_FOR_LOSS)->b;
	m->megatron = mg;
	m->max_factor = mf->f;
	m->dp = d.dp;
	m->edp = d.edp;
	m->micro_batches = d.micro_batches;
	if (!m->path || !m->name || !m->stage_layers) {
		kiln_fe_oom(c);
		return NULL;
	}
	return m;
}

/* The enum lists in schema.def are in the order of these C enums. */
_Static_assert(KILN_ATTN_FLASH == 0 && KILN_ATTN_EAGER == 1, "attention order");
_Static_assert(KILN_ACTFN_SWIGLU == 0 && KILN_ACTFN_GELU == 1 && KILN_ACTFN_GEGLU == 2 &&
                   KILN_ACTFN_QUICK_GEGLU == 3,
               "activation order");
_Static_assert(KILN_DTYPE_BF16 == 0 && KILN_DTYPE_FP16 == 1 && KILN_DTYPE_FP8 == 2 &&
                   KILN_DTYPE_FP32 == 3,
               "dtype order");
_Static_assert(KILN_PROB_ACTIVATION == 0 && KILN_PROB_EXPERT_OUTPUT == 1 && KILN_PROB_COMBINE == 2,
               "prob_apply order");
_Static_assert(KILN_OPTIM_ADAM == 0 && KILN_OPTIM_SGD == 1, "optimizer order");
_Static_assert(KILN_SCHED_1F1B == 0 && KILN_SCHED_INTERLEAVED == 1, "schedule order");
_Static_assert(KILN_DISPATCH_ALLTOALL == 0 && KILN_DISPATCH_DEEPEP == 1 &&
                   KILN_DISPATCH_HYBRIDEP == 2,
               "dispatcher order");
_Static_assert(KILN_RECOMPUTE_UNIFORM == 0 && KILN_RECOMPUTE_BLOCK == 1, "recompute method order");
