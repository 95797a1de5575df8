/* costmodel/megatron.c: Megatron-Core's recompute and offload modules mapped
 * onto kiln's ops and saved tensors, the one mapping the step model
 * (step.c) and the megatron baseline (passes/baselines.c) share
 * (docs/cost-model.md, "Baselines").
 *
 * Read against NVIDIA/Megatron-LM at d98e8a64 (2026-08-22):
 * - recompute_modules, transformer_config.py:560-582: "moe_act", "layernorm"
 *   and "mla_up_proj" use output-discarding checkpointing
 *   (CheckpointWithoutOutput: the region's inputs are saved, its outputs
 *   are freed after their consumer saved them and rebuilt in backward);
 *   "core_attn", "mlp", "moe" and "shared_experts" use normal checkpointing
 *   (tensor_parallel.checkpoint: the region's inputs are saved, tensors only
 *   the region saves are dropped, its outputs stay as ordinary outputs that
 *   later modules save);
 * - layernorm: input_layernorm and pre_mlp_layernorm only
 *   (transformer_layer.py:475-527), not MLA's q/kv layernorms;
 * - mlp: the dense MLP only, never an MoE layer (transformer_layer.py:537-539);
 * - moe: the whole MoE layer with its router, shared experts included
 *   (moe/moe_layer.py:247-249, 701-716); shared_experts: the shared expert
 *   alone (moe/moe_layer.py:252-254, 517-531); moe_act: the expert
 *   activation (moe/experts.py:269-271, 1019-1030);
 * - mla_up_proj: q and kv up projections with RoPE
 *   (multi_latent_attention.py:171-174, 983-988, discarded at 455-458).
 * - offload_modules (transformer_config.py:1328-1342): every tensor saved
 *   inside the module's offload context is moved to the host once at least
 *   min_offloaded_tensor_size (1M) elements
 *   (pipeline_parallel/fine_grained_activation_offload.py:835-870,
 *   1077-1091); expert_fc1's context is fc1 (saves fc1's input,
 *   moe/experts.py:928-939), moe_act's the activation (saves fc1's output,
 *   experts.py:941, 1019-1037), qkv_linear's the whole QKV computation
 *   (MLA: the down and up projections and their norms,
 *   multi_latent_attention.py:343-352; attention.py:1386-1395), core_attn's
 *   the core attention (attention.py:1553-1605), attn_proj's the output
 *   projection (attention.py:1626-1629), attn_norm's and mlp_norm's the two
 *   layer norms (transformer_layer.py:697-712, 819).
 */
#include <stdio.h>
#include <string.h>

#include "costmodel/costmodel.h"

uint32_t kiln_megatron_recompute_cover(kiln_op_kind k)
{
	switch (k) {
	case KILN_OP_ATTN_CORE:
	case KILN_OP_ATTN_DROPOUT:
		return KILN_MRC(CORE_ATTN);
	case KILN_OP_NORM:
		return KILN_MRC(LAYERNORM);
	case KILN_OP_EXPERT_ACT:
		return KILN_MRC(MOE_ACT) | KILN_MRC(MOE);
	case KILN_OP_Q_UP:
	case KILN_OP_KV_UP:
		return KILN_MRC(MLA_UP_PROJ);
	case KILN_OP_FFN_UP:
	case KILN_OP_FFN_ACT:
	case KILN_OP_FFN_DOWN:
		return KILN_MRC(MLP);
	case KILN_OP_SHARED_UP:
	case KILN_OP_SHARED_ACT:
	case KILN_OP_SHARED_DOWN:
		return KILN_MRC(SHARED_EXPERTS) | KILN_MRC(MOE);
	case KILN_OP_ROUTER:
	case KILN_OP_ROUTER_SOFTMAX:
	case KILN_OP_PERMUTE:
	case KILN_OP_DISPATCH:
	case KILN_OP_EXPERT_UP:
	case KILN_OP_EXPERT_DOWN:
	case KILN_OP_COMBINE:
	case KILN_OP_UNPERMUTE:
		return KILN_MRC(MOE);
	default:
		return 0;
	}
}

/* Whether forward op o is the first NORM of its layer (the attention's
 * input layernorm; the second is pre_mlp_layernorm). */
static bool first_norm(const kiln_ir_graph *g, int32_t o)
{
	const kiln_ir_layer *ly = &g->layers[g->ops[o].layer];
	for (int32_t i = ly->op_begin; i < o; i++)
		if (!g->ops[i].backward && g->ops[i].kind == KILN_OP_NORM)
			return false;
	return true;
}

uint32_t kiln_megatron_offload_cover(const kiln_ir_graph *g, int32_t o)
{
	switch (g->ops[o].kind) {
	case KILN_OP_NORM:
		return first_norm(g, o) ? KILN_MOF(ATTN_NORM) : KILN_MOF(MLP_NORM);
	case KILN_OP_QKV_PROJ:
	case KILN_OP_Q_DOWN:
	case KILN_OP_Q_NORM:
	case KILN_OP_Q_UP:
	case KILN_OP_KV_DOWN:
	case KILN_OP_KV_NORM:
	case KILN_OP_KV_UP:
		return KILN_MOF(QKV_LINEAR);
	case KILN_OP_ATTN_CORE:
	case KILN_OP_ATTN_DROPOUT:
		return KILN_MOF(CORE_ATTN);
	case KILN_OP_OUT_PROJ:
		return KILN_MOF(ATTN_PROJ);
	case KILN_OP_EXPERT_UP:
		return KILN_MOF(EXPERT_FC1) | KILN_MOF(FUSED_GROUP_MLP);
	case KILN_OP_EXPERT_ACT:
		return KILN_MOF(MOE_ACT) | KILN_MOF(FUSED_GROUP_MLP);
	case KILN_OP_EXPERT_DOWN:
		return KILN_MOF(FUSED_GROUP_MLP);
	default:
		return 0;
	}
}

/* Whether tensor t is a member of the alias group rooted at root (aliases
 * point to earlier tensors of the same layer). */
static bool in_group(const kiln_ir_graph *g, int32_t t, int32_t root)
{
	for (int32_t steps = 0; steps < 64 && t >= 0; steps++) {
		if (t == root)
			return true;
		int32_t a = g->tensors[t].alias;
		if (a < 0 || a >= t)
			return false;
		t = a;
	}
	return false;
}

void kiln_megatron_tensor_uses(const kiln_ir_graph *g, int32_t root, kiln_megatron_uses *out)
{
	memset(out, 0, sizeof *out);
	const kiln_ir_layer *ly = &g->layers[g->ops[g->tensors[root].producer].layer];
	for (int32_t o = ly->op_begin; o < ly->op_end; o++) {
		const kiln_ir_op *op = &g->ops[o];
		if (!op->backward) {
			for (int32_t i = 0; i < op->n_outputs; i++)
				if (in_group(g, op->outputs[i], root))
					out->made_by |= kiln_megatron_recompute_cover(op->kind);
			continue;
		}
		int32_t f = op->forward;
		if (f < 0)
			continue;
		for (int32_t i = 0; i < op->n_inputs; i++) {
			if (!in_group(g, op->inputs[i], root))
				continue;
			uint32_t rc = kiln_megatron_recompute_cover(g->ops[f].kind);
			out->saved_by |= rc;
			out->saved_outside_of |= ~rc;
			out->offloaded_by |= kiln_megatron_offload_cover(g, f);
		}
	}
}

uint32_t kiln_megatron_drops(const kiln_megatron_uses *u, uint32_t modules)
{
	uint32_t drop = 0;
	for (uint32_t bit = 1; bit && bit <= modules; bit <<= 1) {
		if (!(modules & bit) || !(u->made_by & bit))
			continue;
		/* Output-discarding: the region's outputs are freed. Normal: a
		 * tensor the region makes is dropped only when no op outside
		 * the region saves it. */
		if ((bit & KILN_MRC_DISCARDS_OUTPUT) || !(u->saved_outside_of & bit))
			drop |= bit;
	}
	return drop;
}

double kiln_megatron_fraction(const kiln_megatron *r)
{
	return r->offload_fraction_set ? r->offload_fraction : 1.0;
}

double kiln_megatron_min_offloaded(const kiln_megatron *r)
{
	return r->min_offloaded_set ? (double)r->min_offloaded_elements : 1048576.0;
}

/* attn_norm (input_layernorm, transformer_layer.py:697-712), qkv_linear
 * (attention.py:1386-1395), core_attn (:1553-1605), attn_proj
 * (:1626-1629), mlp_norm (transformer_layer.py:819), then the experts:
 * expert_fc1 (moe/experts.py:928-939), moe_act (:941), or the fused
 * grouped MLP in their place. */
const uint32_t kiln_megatron_group_order[KILN_MOF_COUNT] = {
    KILN_MOF(ATTN_NORM), KILN_MOF(QKV_LINEAR), KILN_MOF(CORE_ATTN), KILN_MOF(ATTN_PROJ),
    KILN_MOF(MLP_NORM),  KILN_MOF(EXPERT_FC1), KILN_MOF(MOE_ACT),   KILN_MOF(FUSED_GROUP_MLP)};

int kiln_megatron_flags_format(const kiln_megatron *r, char *buf, size_t size)
{
	static const char *const rmods[] = {
#define X(id, name) name,
	    KILN_MEGATRON_RECOMPUTE_MODULES(X)
#undef X
	};
	static const char *const omods[] = {
#define X(id, name) name,
	    KILN_MEGATRON_OFFLOAD_MODULES(X)
#undef X
	};
	size_t n = 0;
	int w;
#define PUT(...)                                                                                   \
	do {                                                                                       \
		w = snprintf(buf + n, n < size ? size - n : 0, __VA_ARGS__);                       \
		if (w < 0)                                                                         \
			return -1;                                                                 \
		n += (size_t)w;                                                                    \
	} while (0)
	if (size)
		buf[0] = '\0';
	if (r->recompute == KILN_RECOMPUTE_FULL) {
		PUT("--recompute-granularity full --recompute-method %s --recompute-num-layers "
		    "%lld",
		    r->recompute_method == KILN_RECOMPUTE_BLOCK ? "block" : "uniform",
		    (long long)(r->recompute_num_layers > 0 ? r->recompute_num_layers : 1));
	} else if (r->recompute == KILN_RECOMPUTE_SELECTIVE) {
		PUT("--recompute-granularity selective --recompute-modules");
		for (int b = 0; b < KILN_MRC_COUNT; b++)
			if (r->recompute_modules & (1u << b))
				PUT(" %s", rmods[b]);
	}
	if (r->offload_modules) {
		PUT("%s--fine-grained-activation-offloading --offload-modules", n ? " " : "");
		for (int b = 0; b < KILN_MOF_COUNT; b++)
			if (r->offload_modules & (1u << b))
				PUT(" %s", omods[b]);
	}
	if (r->offload_modules && r->min_offloaded_set)
		PUT(" --min-offloaded-tensor-size %lld", (long long)r->min_offloaded_elements);
	if (r->offload_modules && r->offload_fraction_set)
		PUT(" --activation-offload-fraction %g", r->offload_fraction);
	if (r->offload_modules && r->delta_offload_bytes > 0)
		PUT(" --delta-offload-bytes-across-pp-ranks %lld",
		    (long long)r->delta_offload_bytes);
	if (r->capacity_factor > 0) {
		PUT("%s--moe-expert-capacity-factor %g%s", n ? " " : "", r->capacity_factor,
		    r->pad_to_capacity ? " --moe-pad-expert-input-to-capacity" : "");
	}
	if (n == 0)
		PUT("(no recompute, no offload)");
#undef PUT
	return n < size ? (int)n : -1;
}
