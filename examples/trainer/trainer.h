/* examples/trainer/trainer.h: the CPU MoE trainer's model and its units.
 *
 * The model is the one examples/trainer/trainer.yaml describes: 4 MoE
 * layers, hidden 64, 4 query heads and 2 KV heads of 16, 8 experts with
 * top-2 routing, SwiGLU experts of 128, RMSNorm, causal attention, a
 * byte-level vocabulary, fp32 throughout; 2 pipeline stages of 2 layers,
 * each stage with 2 expert-parallel ranks (4 local experts each) that are
 * also data-parallel replicas. A micro-batch is 2 sequences of 64 bytes.
 *
 * Each layer saves exactly the tensors kiln's cost model names for it
 * (docs/cost-model.md, "Activations"), in the same order: these are the
 * plan's units, and their bytes are base + per_row * rows, rows being the
 * (token, expert) rows routed to this rank's experts. The trainer refuses a
 * plan blob whose units differ. */
#ifndef KILN_TRAINER_H
#define KILN_TRAINER_H

#define TR_LAYERS 4
#define TR_PP 2
#define TR_EP 2
#define TR_H 64
#define TR_NH 4
#define TR_NKV 2
#define TR_HD 16
#define TR_E 8
#define TR_TOPK 2
#define TR_FE 128
#define TR_V 256
#define TR_S 64
#define TR_B 2
#define TR_T (TR_S * TR_B)   /* tokens per micro-batch */
#define TR_LE (TR_E / TR_EP) /* local experts per rank */
#define TR_M 8               /* micro-batches per step per replica */
#define TR_STAGE_LAYERS (TR_LAYERS / TR_PP)

/* X(id, name, base bytes, bytes per routed row): the units of one MoE layer,
 * in the cost model's order. fp32 everywhere: 4 bytes per element. */
#define TR_UNITS(X)                                                                                \
	X(LN1_IN, "ln1.in", 4 * TR_T * TR_H, 0)                                                    \
	X(QKV_IN, "attn.qkv_in", 4 * TR_T * TR_H, 0)                                               \
	X(Q, "attn.q", 4 * TR_T * TR_NH * TR_HD, 0)                                                \
	X(K, "attn.k", 4 * TR_T * TR_NKV * TR_HD, 0)                                               \
	X(V, "attn.v", 4 * TR_T * TR_NKV * TR_HD, 0)                                               \
	X(OUT, "attn.out", 4 * TR_T * TR_NH * TR_HD, 0)                                            \
	X(LSE, "attn.lse", 4 * TR_NH * TR_T, 0)                                                    \
	X(LN2_IN, "ln2.in", 4 * TR_T * TR_H, 0)                                                    \
	X(MOE_IN, "moe.in", 4 * TR_T * TR_H, 0)                                                    \
	X(PROBS, "moe.probs", 4 * TR_T * TR_E, 0)                                                  \
	X(PERM, "moe.perm_idx", 0, 4)                                                              \
	X(EIN, "moe.expert_in", 0, 4 * TR_H)                                                       \
	X(EUP, "moe.expert_up", 0, 4 * 2 * TR_FE)                                                  \
	X(EACT, "moe.expert_act", 0, 4 * TR_FE)                                                    \
	X(EOUT, "moe.expert_out", 0, 4 * TR_H)

enum {
#define X(id, name, base, per_row) TR_U_##id,
	TR_UNITS(X)
#undef X
	    TR_NU
};

/* The head's saved tensors on the last stage (fixed bytes in the plan). */
#define TR_HEAD_NORM_IN_BYTES (4u * TR_T * TR_H)
#define TR_HEAD_IN_BYTES (4u * TR_T * TR_H)
#define TR_HEAD_LOGITS_BYTES (4u * TR_T * TR_V)

#endif
