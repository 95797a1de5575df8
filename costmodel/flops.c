/* costmodel/flops.c: model FLOPs as Megatron-LM counts them.
 *
 * Megatron-LM's num_floating_point_operations
 * (megatron/training/training.py at d98e8a64dd, transformer_flops(), lines
 * 1040-1320) is the figure every published TFLOPS/GPU of a Megatron-Core run
 * divides by; kiln's MFU and `make calibrate` use the same count so that they
 * compare with published runs. It counts GEMMs only (3x for forward, wgrad
 * and dgrad; 2 FLOPs per multiply-add), the causal mask halves the core
 * attention, a MoE layer counts its top_k routed experts and its shared
 * experts, MLA its low-rank projections (with Megatron's "+1" per rank for
 * the norms), and the logit layer the vocabulary padded to a multiple of
 * 128 * tp (megatron/training/vocab_utils.py line 58, the default of
 * --make-vocab-size-divisible-by in arguments.py line 2441). Multi-token
 * prediction layers (megatron.mtp_num_layers) count as one more transformer
 * layer of the last layer's kind each, plus their projections and an extra
 * logit layer (lines 1019-1030 and 1286-1305). docs/cost-model.md, "Model
 * FLOPs".
 */
#include "costmodel/costmodel.h"

double kiln_cost_padded_vocab(const kiln_model *m)
{
	int64_t multiple = 128 * m->tp;
	return (double)(((m->vocab + multiple - 1) / multiple) * multiple);
}

double kiln_cost_model_flops_per_token(const kiln_model *m)
{
	return kiln_cost_model_flops_per_token_ex(m, true);
}

double kiln_cost_model_flops_per_token_ex(const kiln_model *m, bool causal_halved)
{
	const double fb = 3, fma = 2; /* forward + wgrad + dgrad; FLOPs per multiply-add */
	double h = (double)m->hidden, s = (double)m->seq_len, a = (double)m->heads;
	/* Megatron counts a gated MLP as three GEMMs only when its activation
	 * is SiLU: ffn_expansion_factor = 3 if args.swiglu else 2
	 * (megatron/training/training.py line 1070 at d98e8a64dd; --quick-geglu
	 * does not set args.swiglu), as Megatron-Bridge 0.4's
	 * gated_linear_multiplier does (src/megatron/bridge/training/utils/
	 * flop_utils.py lines 296-297 at r0.4.0: gated_linear_unit and
	 * activation_func == F.silu). GeGLU and GPT-OSS's quick GeGLU run three
	 * GEMMs (the lowering and the step model price them) but count as two. */
	double ffn_dense =
	    m->activation == KILN_FN_SWIGLU && m->activation_fn == KILN_ACTFN_SWIGLU ? 3 : 2;
	double ffn_moe =
	    m->moe_activation == KILN_FN_SWIGLU && m->moe_activation_fn == KILN_ACTFN_SWIGLU ? 3
	                                                                                     : 2;
	int64_t mtp = m->megatron.mtp_num_layers;
	int64_t moe_layers = m->moe ? m->layers - m->dense_layers : 0;
	int64_t dense_layers = m->layers - moe_layers;
	bool last_is_moe = m->moe && m->layers > m->dense_layers;
	if (last_is_moe)
		moe_layers += mtp;
	else
		dense_layers += mtp;
	double layers = (double)(m->layers + mtp);

	double attn_linear, attn_core; /* per token per layer, before fb * fma */
	if (m->mla) {
		double qk = (double)m->head_dim, rope = (double)m->rope_head_dim;
		double v = (double)m->v_head_dim, kvr = (double)m->kv_lora_rank;
		double q_term = m->q_lora_rank == 0
		                    ? h * a * (qk + rope)
		                    : (double)m->q_lora_rank * (h + a * (qk + rope) + 1);
		attn_linear = q_term + kvr * (h + a * (qk + v) + 1) + h * rope + a * v * h;
		attn_core = s * (a * (qk + rope) / 2 + a * v / 2);
	} else {
		double q = (double)m->head_dim * a, kv = (double)m->head_dim * (double)m->kv_heads;
		attn_linear = h * (q + 2 * kv) + q * h;
		attn_core = q * s / 2 * 2; /* causal half of QK^T and of (QK^T)V */
	}
	double mlp =
	    h * ((double)m->ffn_hidden * ffn_dense * (double)dense_layers +
	         (double)m->expert_ffn_hidden * (double)m->top_k * ffn_moe * (double)moe_layers +
	         (double)m->expert_ffn_hidden * (double)m->shared_experts * ffn_moe *
	             (double)moe_layers);
	if (!m->moe)
		mlp = h * (double)m->ffn_hidden * ffn_dense * (double)dense_layers;
	double mtp_proj = (double)mtp * (3 * h + 2 * h * h);
	double logit = h * kiln_cost_padded_vocab(m) * (double)(mtp + 1);
	if (!causal_halved)
		attn_core *= 2;
	return fb * fma * (mlp + layers * (attn_linear + attn_core) + mtp_proj + logit);
}
