/* passes/lower.c: model description -> graph IR.
 *
 * Builds, stage by stage and chunk by chunk, every layer's forward ops with
 * the tensors they produce, then one backward op per forward op in reverse
 * order. Sizes, FLOPs, traffic, communication and parameter counts follow
 * docs/cost-model.md, section by section; the comments here name the
 * section, the doc carries the derivations and sources.
 *
 * Allocation failures poison the builder; lowering carries on without
 * checking every call and kiln_ir_builder_finish reports the failure once.
 */
#include <stdio.h>
#include <stdlib.h>

#include "passes/passes.h"

#define MAX_LIST 8
#define MAX_FWD_OPS 64

/* Counts the elements of a braced list of tensor indices. */
#define LIST_N(...) ((int32_t)(sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t)))
#define IN(...) .in = {__VA_ARGS__}, .n_in = LIST_N(__VA_ARGS__)
#define OUT(...) .out = {__VA_ARGS__}, .n_out = LIST_N(__VA_ARGS__)
#define NEED(...) .need = {__VA_ARGS__}, .n_need = LIST_N(__VA_ARGS__)

/* One forward op and what its backward op costs. Unset backward fields take
 * the class defaults: GEMM and ATTN 2x FLOPs, MEM and ATTN 2x traffic, COMM
 * the same bytes with the conjugate collective (all-gather <-> reduce-scatter,
 * all-reduce <-> all-reduce, all-to-all <-> all-to-all). */
typedef struct spec {
	kiln_op_kind kind;
	const char *name;
	int32_t in[MAX_LIST], n_in;
	int32_t out[MAX_LIST], n_out;
	int32_t need[MAX_LIST], n_need; /* saved tensors the backward op reads */
	kiln_linf flops, traffic, comm;
	kiln_collective coll;
	int32_t group;
	uint64_t params_local, params_global;
	bool expert;
	double bwd_flops_mult; /* 0: class default */
	bool bwd_comm_set;     /* else: the class default above */
	kiln_linf bwd_comm;
	kiln_collective bwd_coll;
} spec;

typedef struct lowerer {
	const kiln_model *m;
	kiln_ir_builder *b;
	/* Shapes on one device for one micro-batch (docs/cost-model.md, notation). */
	uint64_t e;      /* activation element bytes */
	uint64_t s, mb;  /* sequence length, micro-batch */
	uint64_t h, t;   /* hidden, tensor-parallel size */
	uint64_t T, Tsp; /* tokens; tokens on the sequence-parallel shard */
	uint64_t Tr;     /* tokens routed by this device in a MoE layer */
	uint64_t a;      /* local attention heads */
	bool sp, drop;
	/* Forward ops of the current layer, for the backward ops. */
	spec fwd[MAX_FWD_OPS];
	char fwd_name[MAX_FWD_OPS][64]; /* callers may pass names in scratch buffers */
	int32_t fwd_index[MAX_FWD_OPS];
	int32_t n_fwd;
} lowerer;

static uint64_t div_up(uint64_t x, uint64_t d)
{
	return d ? (x + d - 1) / d : x;
}

static kiln_linf lf(double base)
{
	return (kiln_linf){base, 0};
}

static int32_t tensor(lowerer *L, const char *name, uint64_t base, uint64_t per_n, uint32_t flags)
{
	return kiln_ir_builder_tensor(L->b, name, (kiln_lin){base, per_n}, flags, -1);
}

/* Drops repeated tensors from a list (fused q, k and v are one tensor, so
 * an op reading "q, k, v" reads it once). */
static void list_dedup(int32_t *list, int32_t *n)
{
	int32_t w = 0;
	for (int32_t i = 0; i < *n; i++) {
		bool seen = false;
		for (int32_t j = 0; j < w && !seen; j++)
			seen = list[j] == list[i];
		if (!seen)
			list[w++] = list[i];
	}
	*n = w;
}

/* Adds the forward op of sp and remembers it for the backward pass. */
static void fwd_op(lowerer *L, const spec *sp_in)
{
	spec copy = *sp_in, *sp = &copy;
	list_dedup(sp->in, &sp->n_in);
	list_dedup(sp->need, &sp->n_need);
	if (L->n_fwd >= MAX_FWD_OPS) {
		/* A layer never has this many ops: a bug in this file. */
		fprintf(stderr, "kiln: internal error: layer exceeds %d forward ops\n",
		        MAX_FWD_OPS);
		abort();
	}
	kiln_ir_op op = {
	    .kind = sp->kind,
	    .backward = false,
	    .forward = -1,
	    .name = sp->name,
	    .flops = sp->flops,
	    .traffic = sp->traffic,
	    .comm_bytes = sp->comm,
	    .comm_group = sp->group,
	    .collective = sp->coll,
	    .params_local = sp->params_local,
	    .params_global = sp->params_global,
	    .expert_params = sp->expert,
	    .inputs = (int32_t *)sp->in,
	    .n_inputs = sp->n_in,
	    .outputs = (int32_t *)sp->out,
	    .n_outputs = sp->n_out,
	};
	L->fwd[L->n_fwd] = *sp;
	snprintf(L->fwd_name[L->n_fwd], sizeof(L->fwd_name[0]), "%s", sp->name);
	L->fwd[L->n_fwd].name = L->fwd_name[L->n_fwd];
	L->fwd_index[L->n_fwd] = kiln_ir_builder_op(L->b, &op);
	L->n_fwd++;
}

static kiln_collective conjugate(kiln_collective c)
{
	switch (c) {
	case KILN_COLL_ALL_GATHER:
		return KILN_COLL_REDUCE_SCATTER;
	case KILN_COLL_REDUCE_SCATTER:
		return KILN_COLL_ALL_GATHER;
	default:
		return c;
	}
}

/* Closes the current layer: one backward op per forward op, in reverse. */
static void end_layer(lowerer *L)
{
	for (int32_t i = L->n_fwd - 1; i >= 0; i--) {
		const spec *sp = &L->fwd[i];
		char name[96];
		snprintf(name, sizeof(name), "%s.bwd", sp->name);
		kiln_op_class cls = kiln_ir_op_kind_class(sp->kind);
		kiln_ir_op op = {
		    .kind = sp->kind,
		    .backward = true,
		    .forward = L->fwd_index[i],
		    .name = name,
		    .comm_group = sp->group,
		    .inputs = (int32_t *)sp->need,
		    .n_inputs = sp->n_need,
		};
		double fm = sp->bwd_flops_mult > 0 ? sp->bwd_flops_mult : 2.0;
		switch (cls) {
		case KILN_OPCLASS_GEMM:
		case KILN_OPCLASS_ATTN:
		case KILN_OPCLASS_MEM:
			op.flops = (kiln_linf){fm * sp->flops.base, fm * sp->flops.per_n};
			op.traffic = (kiln_linf){2 * sp->traffic.base, 2 * sp->traffic.per_n};
			break;
		case KILN_OPCLASS_COMM_TP:
		case KILN_OPCLASS_COMM_EP:
		case KILN_OPCLASS_COMM_PP:
			op.comm_bytes = sp->bwd_comm_set ? sp->bwd_comm : sp->comm;
			op.collective = sp->bwd_comm_set ? sp->bwd_coll : conjugate(sp->coll);
			break;
		}
		kiln_ir_builder_op(L->b, &op);
	}
	L->n_fwd = 0;
}

static void begin_layer(lowerer *L, kiln_layer_kind kind, int32_t index, int32_t chunk,
                        double n_balanced)
{
	L->n_fwd = 0;
	kiln_ir_builder_layer(L->b, kind, index, chunk, n_balanced);
}

/* A tensor-parallel collective over e*T*h bytes (docs/cost-model.md,
 * communication): fwd and bwd collectives given, NONE moving nothing. */
static void tp_comm(lowerer *L, const char *name, int32_t in, int32_t out, kiln_collective fwd,
                    kiln_collective bwd)
{
	double bytes = (double)(L->e * L->T * L->h);
	spec sp = {
	    .kind = KILN_OP_TP_COMM,
	    .name = name,
	    .in = {in},
	    .n_in = 1,
	    .out = {out},
	    .n_out = out >= 0 ? 1 : 0,
	    .coll = fwd,
	    .comm = lf(fwd == KILN_COLL_NONE ? 0 : bytes),
	    .group = (int32_t)L->t,
	    .bwd_comm_set = true,
	    .bwd_coll = bwd,
	    .bwd_comm = lf(bwd == KILN_COLL_NONE ? 0 : bytes),
	};
	fwd_op(L, &sp);
}

/* The layer's saved input: produced by a pipeline receive when the previous
 * layer runs on another stage, else by a zero-cost input op. */
static int32_t layer_input(lowerer *L, const char *name, bool recv)
{
	int32_t x = tensor(L, name, L->e * L->Tsp * L->h, 0, KILN_T_SAVED);
	if (recv) {
		spec sp = {
		    .kind = KILN_OP_PP_SEND,
		    .name = "pp.recv",
		    OUT(x),
		    .coll = KILN_COLL_RECV,
		    .group = 2,
		    .bwd_comm_set = true,
		    .bwd_coll = KILN_COLL_SEND,
		    .bwd_comm = lf((double)(L->e * L->Tsp * L->h)),
		};
		fwd_op(L, &sp);
	} else {
		fwd_op(L, &(spec){.kind = KILN_OP_INPUT, .name = "input", OUT(x)});
	}
	return x;
}

/* Sends the layer's output to the next stage; the gradient comes back in
 * backward (charged to its sender, the next stage's pp.recv). */
static void pp_send(lowerer *L, int32_t out)
{
	spec sp = {
	    .kind = KILN_OP_PP_SEND,
	    .name = "pp.send",
	    IN(out),
	    .coll = KILN_COLL_SEND,
	    .comm = lf((double)(L->e * L->Tsp * L->h)),
	    .group = 2,
	    .bwd_comm_set = true,
	    .bwd_coll = KILN_COLL_RECV,
	};
	fwd_op(L, &sp);
}

/* A norm over rows x width elements: reads and writes one activation each.
 * With model.norm_saves_rstd it also saves its fp32 reciprocal RMS, one per
 * row, named NAME.rstd (docs/cost-model.md, "Small saved tensors"). */
static void norm_op(lowerer *L, kiln_op_kind kind, const char *name, int32_t in, int32_t out,
                    uint64_t rows, uint64_t width)
{
	spec sp = {
	    .kind = kind,
	    .name = name,
	    IN(in),
	    OUT(out),
	    NEED(in),
	    .traffic = lf((double)(2 * L->e * rows * width)),
	    .params_local = width,
	    .params_global = width,
	};
	if (L->m->norm_saves_rstd) {
		char rn[80];
		snprintf(rn, sizeof(rn), "%s.rstd", name);
		int32_t rstd = tensor(L, rn, 4 * rows, 0, KILN_T_SAVED);
		sp.out[sp.n_out++] = rstd;
		sp.need[sp.n_need++] = rstd;
		sp.traffic.base += (double)(4 * rows);
	}
	fwd_op(L, &sp);
}

/* Residual add with (when dropout > 0) a dropout whose 1-byte mask is saved:
 * Megatron's fused bias-dropout-add. Returns the sum; *mask_out gets the
 * mask or -1. */
static int32_t resid_op(lowerer *L, const char *name, const char *out_name, const char *mask_name,
                        int32_t branch, int32_t extra, int32_t residual, bool out_saved)
{
	uint64_t n = L->Tsp * L->h;
	int32_t out = tensor(L, out_name, L->e * n, 0, out_saved ? KILN_T_SAVED : 0);
	spec sp = {.kind = KILN_OP_RESID_DROPOUT, .name = name, IN(branch), OUT(out)};
	if (extra >= 0)
		sp.in[sp.n_in++] = extra;
	sp.in[sp.n_in++] = residual;
	uint64_t traffic = (3 + (extra >= 0 ? 1 : 0)) * L->e * n;
	if (L->drop) {
		int32_t mask = tensor(L, mask_name, n, 0, KILN_T_SAVED | KILN_T_MASK);
		sp.out[sp.n_out++] = mask;
		sp.need[sp.n_need++] = mask;
		traffic += n;
	}
	sp.traffic = lf((double)traffic);
	fwd_op(L, &sp);
	return out;
}

/* Attention block (docs/cost-model.md, attention): ln1, projections, core,
 * out_proj, TP collective, residual. Returns ln2.in. */
static int32_t attention(lowerer *L, int32_t x)
{
	const kiln_model *m = L->m;
	uint64_t e = L->e, T = L->T, h = L->h, t = L->t, a = L->a;
	uint64_t H = (uint64_t)m->heads, d = (uint64_t)m->head_dim;

	int32_t qkv_in = tensor(L, "attn.qkv_in", e * L->Tsp * h, 0, KILN_T_SAVED);
	norm_op(L, KILN_OP_NORM, "ln1", x, qkv_in, L->Tsp, h);
	int32_t src = qkv_in;
	if (t > 1 && L->sp) {
		src = tensor(L, "attn.qkv_full", e * T * h, 0, 0);
		tp_comm(L, "attn.tp_in", qkv_in, src, KILN_COLL_ALL_GATHER,
		        KILN_COLL_REDUCE_SCATTER);
	}

	int32_t q, k, v;
	uint64_t dqk, dv;
	if (!m->mla) {
		uint64_t KV = (uint64_t)m->kv_heads;
		uint64_t kv = KV >= t ? KV / t : 1;
		dqk = dv = d;
		spec proj = {.kind = KILN_OP_QKV_PROJ,
		             .name = "attn.qkv_proj",
		             IN(src),
		             NEED(qkv_in),
		             .flops =
		                 lf(2.0 * (double)T * (double)h * (double)(a * d + 2 * kv * d)),
		             .params_local = h * (a * d + 2 * kv * d),
		             .params_global = h * (H * d + 2 * KV * d)};
		if (m->fused_qkv) {
			/* One GEMM writes q, k and v into one storage (Megatron's
			 * linear_qkv, split into views): one unit, so no plan frees
			 * k alone (docs/cost-model.md, "Fused QKV"). */
			q = k = v =
			    tensor(L, "attn.qkv", e * T * (a * d + 2 * kv * d), 0, KILN_T_SAVED);
			proj.out[proj.n_out++] = q;
		} else {
			q = tensor(L, "attn.q", e * T * a * d, 0, KILN_T_SAVED);
			k = tensor(L, "attn.k", e * T * kv * d, 0, KILN_T_SAVED);
			v = tensor(L, "attn.v", e * T * kv * d, 0, KILN_T_SAVED);
			proj.out[proj.n_out++] = q;
			proj.out[proj.n_out++] = k;
			proj.out[proj.n_out++] = v;
		}
		fwd_op(L, &proj);
	} else {
		uint64_t ql = (uint64_t)m->q_lora_rank, kl = (uint64_t)m->kv_lora_rank;
		uint64_t r = (uint64_t)m->rope_head_dim;
		dqk = d + r;
		dv = (uint64_t)m->v_head_dim;
		q = tensor(L, "attn.q", e * T * a * dqk, 0, KILN_T_SAVED);
		if (ql > 0) {
			int32_t qd = tensor(L, "attn.q_down", e * T * ql, 0, KILN_T_SAVED);
			fwd_op(L, &(spec){.kind = KILN_OP_Q_DOWN,
			                  .name = "attn.q_down",
			                  IN(src),
			                  OUT(qd),
			                  NEED(qkv_in),
			                  .flops = lf(2.0 * (double)T * (double)h * (double)ql),
			                  .params_local = h * ql,
			                  .params_global = h * ql});
			int32_t qn = tensor(L, "attn.q_norm", e * T * ql, 0, KILN_T_SAVED);
			norm_op(L, KILN_OP_Q_NORM, "attn.q_norm", qd, qn, T, ql);
			fwd_op(L, &(spec){.kind = KILN_OP_Q_UP,
			                  .name = "attn.q_up",
			                  IN(qn),
			                  OUT(q),
			                  NEED(qn),
			                  .flops =
			                      lf(2.0 * (double)T * (double)ql * (double)(a * dqk)),
			                  .params_local = ql * a * dqk,
			                  .params_global = ql * H * dqk});
		} else {
			fwd_op(L,
			       &(spec){.kind = KILN_OP_Q_UP,
			               .name = "attn.q_up",
			               IN(src),
			               OUT(q),
			               NEED(qkv_in),
			               .flops = lf(2.0 * (double)T * (double)h * (double)(a * dqk)),
			               .params_local = h * a * dqk,
			               .params_global = h * H * dqk});
		}
		int32_t kd = tensor(L, "attn.kv_down", e * T * (kl + r), 0, KILN_T_SAVED);
		fwd_op(L, &(spec){.kind = KILN_OP_KV_DOWN,
		                  .name = "attn.kv_down",
		                  IN(src),
		                  OUT(kd),
		                  NEED(qkv_in),
		                  .flops = lf(2.0 * (double)T * (double)h * (double)(kl + r)),
		                  .params_local = h * (kl + r),
		                  .params_global = h * (kl + r)});
		int32_t kn = tensor(L, "attn.kv_norm", e * T * kl, 0, KILN_T_SAVED);
		norm_op(L, KILN_OP_KV_NORM, "attn.kv_norm", kd, kn, T, kl);
		k = tensor(L, "attn.k", e * T * a * dqk, 0, KILN_T_SAVED);
		v = tensor(L, "attn.v", e * T * a * dv, 0, KILN_T_SAVED);
		/* kv_down's rotary part joins k unprojected (shared by all heads). */
		fwd_op(L,
		       &(spec){.kind = KILN_OP_KV_UP,
		               .name = "attn.kv_up",
		               IN(kn, kd),
		               OUT(k, v),
		               NEED(kn),
		               .flops = lf(2.0 * (double)T * (double)kl * (double)(a * (d + dv))),
		               .params_local = kl * a * (d + dv),
		               .params_global = kl * H * (d + dv)});
	}

	uint64_t s2b = L->s * L->s * L->mb;
	uint64_t q_bytes = e * T * a * dqk;
	int32_t out = tensor(L, "attn.out", e * T * a * dv, 0, KILN_T_SAVED);
	uint64_t out_bytes = e * T * a * dv;
	/* Bytes of k and v together (fewer heads than q under GQA). */
	uint64_t kv_bytes;
	if (!m->mla) {
		uint64_t KV = (uint64_t)m->kv_heads;
		uint64_t kv = KV >= t ? KV / t : 1;
		kv_bytes = 2 * e * T * kv * d;
	} else {
		kv_bytes = e * T * a * dqk + e * T * a * dv;
	}
	double core_flops_qk = 2.0 * (double)s2b * (double)a * (double)dqk;
	double core_flops_v = 2.0 * (double)s2b * (double)a * (double)dv;
	if (m->attention == KILN_ATTN_FLASH) {
		int32_t lse = tensor(L, "attn.lse", 4 * a * T, 0, KILN_T_SAVED);
		fwd_op(L,
		       &(spec){.kind = KILN_OP_ATTN_CORE,
		               .name = "attn.core",
		               IN(q, k, v),
		               OUT(out, lse),
		               NEED(q, k, v, out, lse),
		               .flops = lf(core_flops_qk + core_flops_v),
		               .traffic = lf((double)(q_bytes + kv_bytes + out_bytes + 4 * a * T)),
		               .bwd_flops_mult = 2.5});
	} else {
		uint64_t sm_bytes = e * a * s2b;
		int32_t sm = tensor(L, "attn.softmax", sm_bytes, 0, KILN_T_SAVED);
		uint64_t k_bytes = m->mla ? e * T * a * dqk : kv_bytes / 2;
		uint64_t v_bytes = kv_bytes - k_bytes;
		fwd_op(L, &(spec){.kind = KILN_OP_ATTN_CORE,
		                  .name = "attn.scores",
		                  IN(q, k),
		                  OUT(sm),
		                  NEED(q, k, sm),
		                  .flops = lf(core_flops_qk),
		                  .traffic = lf((double)(q_bytes + k_bytes + sm_bytes))});
		int32_t probs = sm;
		if (L->drop) {
			int32_t mask =
			    tensor(L, "attn.dropout_mask", a * s2b, 0, KILN_T_SAVED | KILN_T_MASK);
			probs = tensor(L, "attn.probs", sm_bytes, 0, KILN_T_SAVED);
			fwd_op(L, &(spec){.kind = KILN_OP_ATTN_DROPOUT,
			                  .name = "attn.dropout",
			                  IN(sm),
			                  OUT(mask, probs),
			                  NEED(mask),
			                  .traffic = lf((double)(2 * sm_bytes + a * s2b))});
		}
		fwd_op(L, &(spec){.kind = KILN_OP_ATTN_CORE,
		                  .name = "attn.context",
		                  IN(probs, v),
		                  OUT(out),
		                  NEED(probs, v),
		                  .flops = lf(core_flops_v),
		                  .traffic = lf((double)(sm_bytes + v_bytes + out_bytes))});
	}

	int32_t proj = tensor(L, "attn.proj", e * T * h, 0, 0);
	fwd_op(L, &(spec){.kind = KILN_OP_OUT_PROJ,
	                  .name = "attn.out_proj",
	                  IN(out),
	                  OUT(proj),
	                  NEED(out),
	                  .flops = lf(2.0 * (double)T * (double)(a * dv) * (double)h),
	                  .params_local = a * dv * h,
	                  .params_global = H * dv * h});
	int32_t red = proj;
	if (t > 1) {
		red = tensor(L, L->sp ? "attn.proj_rs" : "attn.proj_ar", e * L->Tsp * h, 0, 0);
		tp_comm(L, "attn.tp_out", proj, red,
		        L->sp ? KILN_COLL_REDUCE_SCATTER : KILN_COLL_ALL_REDUCE,
		        L->sp ? KILN_COLL_ALL_GATHER : KILN_COLL_ALL_REDUCE);
	}
	return resid_op(L, "attn.resid", "ln2.in", "attn.resid_mask", red, -1, x, true);
}

/* Name of a tensor or op of a feed-forward block: prefix + what. */
static const char *ffn_name(char *buf, size_t size, const char *prefix, const char *what)
{
	snprintf(buf, size, "%s%s", prefix, what);
	return buf;
}

/* A TP-sharded two-GEMM feed-forward on all T tokens (the dense FFN, kinds
 * FFN_*, or the shared experts, kinds SHARED_*), from the saved norm output
 * `in` to the branch output reduced over TP. Tensors and ops are named
 * prefix + "up", "act", .... */
static int32_t ffn(lowerer *L, const char *prefix, bool shared, int32_t in, uint64_t width,
                   kiln_fn fn)
{
	uint64_t e = L->e, T = L->T, h = L->h, t = L->t;
	uint64_t up_w = fn == KILN_FN_SWIGLU ? 2 * width : width;
	uint64_t up_l = div_up(up_w, t), f_l = div_up(width, t);
	char n1[64], n2[64];
	int32_t src = in;
	if (t > 1 && L->sp) {
		src = tensor(L, ffn_name(n1, sizeof(n1), prefix, "in_full"), e * T * h, 0, 0);
		tp_comm(L, ffn_name(n2, sizeof(n2), prefix, "tp_in"), in, src, KILN_COLL_ALL_GATHER,
		        KILN_COLL_REDUCE_SCATTER);
	}
	const char *up_name = ffn_name(n1, sizeof(n1), prefix, "up");
	int32_t up = tensor(L, up_name, e * T * up_l, 0, KILN_T_SAVED);
	fwd_op(L, &(spec){.kind = shared ? KILN_OP_SHARED_UP : KILN_OP_FFN_UP,
	                  .name = up_name,
	                  IN(src),
	                  OUT(up),
	                  NEED(in),
	                  .flops = lf(2.0 * (double)T * (double)h * (double)up_l),
	                  .params_local = h * up_l,
	                  .params_global = h * up_w});
	const char *act_name = ffn_name(n1, sizeof(n1), prefix, "act");
	int32_t act = tensor(L, act_name, e * T * f_l, 0, KILN_T_SAVED);
	fwd_op(L, &(spec){.kind = shared ? KILN_OP_SHARED_ACT : KILN_OP_FFN_ACT,
	                  .name = act_name,
	                  IN(up),
	                  OUT(act),
	                  NEED(up),
	                  .traffic = lf((double)(e * T * (up_l + f_l)))});
	const char *down_name = ffn_name(n1, sizeof(n1), prefix, "down");
	int32_t down = tensor(L, down_name, e * T * h, 0, 0);
	fwd_op(L, &(spec){.kind = shared ? KILN_OP_SHARED_DOWN : KILN_OP_FFN_DOWN,
	                  .name = down_name,
	                  IN(act),
	                  OUT(down),
	                  NEED(act),
	                  .flops = lf(2.0 * (double)T * (double)f_l * (double)h),
	                  .params_local = f_l * h,
	                  .params_global = width * h});
	if (t == 1)
		return down;
	int32_t red = tensor(L, ffn_name(n1, sizeof(n1), prefix, L->sp ? "down_rs" : "down_ar"),
	                     e * L->Tsp * h, 0, 0);
	tp_comm(L, ffn_name(n2, sizeof(n2), prefix, "tp_out"), down, red,
	        L->sp ? KILN_COLL_REDUCE_SCATTER : KILN_COLL_ALL_REDUCE,
	        L->sp ? KILN_COLL_ALL_GATHER : KILN_COLL_ALL_REDUCE);
	return red;
}

/* Dense FFN block (docs/cost-model.md, dense FFN). Returns the layer output. */
static int32_t dense_block(lowerer *L, int32_t x2)
{
	int32_t in = tensor(L, "ffn.in", L->e * L->Tsp * L->h, 0, KILN_T_SAVED);
	norm_op(L, KILN_OP_NORM, "ln2", x2, in, L->Tsp, L->h);
	int32_t y = ffn(L, "ffn.", false, in, (uint64_t)L->m->ffn_hidden, L->m->activation);
	return resid_op(L, "ffn.resid", "out", "ffn.resid_mask", y, -1, x2, false);
}

/* MoE block (docs/cost-model.md, MoE): router, permute, dispatch, experts,
 * combine, unpermute, shared experts. Returns the layer output. */
static int32_t moe_block(lowerer *L, int32_t x2)
{
	const kiln_model *m = L->m;
	uint64_t e = L->e, h = L->h, Tr = L->Tr, t = L->t;
	uint64_t E = (uint64_t)m->experts, k = (uint64_t)m->top_k;
	uint64_t fe = (uint64_t)m->expert_ffn_hidden;
	uint64_t up_w = m->moe_activation == KILN_FN_SWIGLU ? 2 * fe : fe;
	uint64_t local_e = div_up(E, (uint64_t)m->ep);
	uint64_t nb = Tr * k; /* rows this device sends; also N at load factor 1 */

	int32_t in = tensor(L, "moe.in", e * L->Tsp * h, 0, KILN_T_SAVED);
	norm_op(L, KILN_OP_NORM, "ln2", x2, in, L->Tsp, h);
	int32_t logits = tensor(L, "moe.logits", 4 * Tr * E, 0, 0);
	fwd_op(L, &(spec){.kind = KILN_OP_ROUTER,
	                  .name = "moe.router",
	                  IN(in),
	                  OUT(logits),
	                  NEED(in),
	                  .flops = lf(2.0 * (double)Tr * (double)h * (double)E),
	                  .params_local = h * E,
	                  .params_global = h * E});
	int32_t probs = tensor(L, "moe.probs", 4 * Tr * E, 0, KILN_T_SAVED);
	fwd_op(L, &(spec){.kind = KILN_OP_ROUTER_SOFTMAX,
	                  .name = "moe.router_softmax",
	                  IN(logits),
	                  OUT(probs),
	                  NEED(probs),
	                  .traffic = lf((double)(8 * Tr * E))});
	/* Where the probabilities multiply decides what is saved around the
	 * experts (docs/cost-model.md, "Router probabilities"). */
	kiln_prob_apply pa = m->prob_apply;
	/* Row map at its real width: int32 from the fused permutation, int64
	 * from torch's argsort (docs/cost-model.md, "Small saved tensors"). */
	uint64_t iw = m->moe_permute_fusion ? 4 : 8;
	int32_t idx = tensor(L, "moe.perm_idx", 0, iw, KILN_T_SAVED | KILN_T_EXPERT);
	int32_t rows = tensor(L, "moe.permuted", e * nb * h, 0, 0);
	spec perm = {.kind = KILN_OP_PERMUTE,
	             .name = "moe.permute",
	             IN(in, probs),
	             OUT(idx, rows),
	             NEED(idx),
	             .traffic = {(double)(e * Tr * h + e * nb * h), (double)iw}};
	/* The probabilities of the routed rows, fp32 (4 bytes per row): on the
	 * token side for the activation (dispatched with the rows) and for the
	 * combine (saved there), none for the expert output. */
	int32_t row_probs = -1;
	if (pa == KILN_PROB_ACTIVATION || pa == KILN_PROB_COMBINE) {
		row_probs = tensor(L, "moe.row_probs", 4 * nb, 0,
		                   pa == KILN_PROB_COMBINE ? KILN_T_SAVED : 0);
		perm.out[perm.n_out++] = row_probs;
		perm.traffic.base += (double)(4 * nb);
	}
	fwd_op(L, &perm);
	int32_t ein = tensor(L, "moe.expert_in", 0, e * h, KILN_T_SAVED | KILN_T_EXPERT);
	kiln_linf a2a = {0, (double)(e * h)};
	spec disp = {.kind = KILN_OP_DISPATCH,
	             .name = "moe.dispatch",
	             IN(rows),
	             OUT(ein),
	             .comm = a2a,
	             .coll = KILN_COLL_ALL_TO_ALL,
	             .group = (int32_t)m->ep};
	int32_t eprobs = -1;
	if (pa == KILN_PROB_ACTIVATION) {
		/* Megatron sends the permuted probabilities in an all-to-all of
		 * their own (token_dispatcher.py:718). */
		eprobs = tensor(L, "moe.expert_probs", 0, 4, KILN_T_SAVED | KILN_T_EXPERT);
		disp.in[disp.n_in++] = row_probs;
		disp.out[disp.n_out++] = eprobs;
		disp.comm.per_n += 4;
	}
	fwd_op(L, &disp);
	int32_t eup = tensor(L, "moe.expert_up", 0, e * up_w, KILN_T_SAVED | KILN_T_EXPERT);
	fwd_op(L, &(spec){.kind = KILN_OP_EXPERT_UP,
	                  .name = "moe.expert_up",
	                  IN(ein),
	                  OUT(eup),
	                  NEED(ein),
	                  .flops = {0, 2.0 * (double)h * (double)up_w},
	                  .params_local = local_e * h * up_w,
	                  .params_global = E * h * up_w,
	                  .expert = true});
	int32_t eact = tensor(L, "moe.expert_act", 0, e * fe, KILN_T_SAVED | KILN_T_EXPERT);
	spec act = {.kind = KILN_OP_EXPERT_ACT,
	            .name = "moe.expert_act",
	            IN(eup),
	            OUT(eact),
	            NEED(eup),
	            .traffic = {0, (double)(e * (up_w + fe))}};
	if (pa == KILN_PROB_ACTIVATION) {
		act.in[act.n_in++] = eprobs;
		act.need[act.n_need++] = eprobs;
		act.traffic.per_n += 4;
		if (m->moe_activation_fn != KILN_ACTFN_SWIGLU &&
		    m->moe_activation_fn != KILN_ACTFN_QUICK_GEGLU) {
			/* No fused weighted kernel (Megatron-Core fuses the
			 * probabilities into SwiGLU and quick GeGLU only,
			 * experts.py:964-981): the activation's output is saved by
			 * the multiply for the probabilities' gradient
			 * (experts.py:996-1013). */
			int32_t raw = tensor(L, "moe.expert_act_raw", 0, e * fe,
			                     KILN_T_SAVED | KILN_T_EXPERT);
			act.out[act.n_out++] = raw;
			act.need[act.n_need++] = raw;
			act.traffic.per_n += (double)(e * fe);
		}
	}
	fwd_op(L, &act);
	bool eout_saved = pa == KILN_PROB_EXPERT_OUTPUT;
	int32_t eout = tensor(L, "moe.expert_out", 0, e * h,
	                      eout_saved ? KILN_T_SAVED | KILN_T_EXPERT : KILN_T_EXPERT);
	fwd_op(L, &(spec){.kind = KILN_OP_EXPERT_DOWN,
	                  .name = "moe.expert_down",
	                  IN(eact),
	                  OUT(eout),
	                  NEED(eact),
	                  .flops = {0, 2.0 * (double)fe * (double)h},
	                  .params_local = local_e * fe * h,
	                  .params_global = E * fe * h,
	                  .expert = true});
	int32_t comb =
	    tensor(L, "moe.combined", e * nb * h, 0, pa == KILN_PROB_COMBINE ? KILN_T_SAVED : 0);
	fwd_op(L, &(spec){.kind = KILN_OP_COMBINE,
	                  .name = "moe.combine",
	                  IN(eout),
	                  OUT(comb),
	                  .comm = a2a,
	                  .coll = KILN_COLL_ALL_TO_ALL,
	                  .group = (int32_t)m->ep});
	int32_t routed = tensor(L, "moe.routed_out", e * Tr * h, 0, 0);
	spec unperm = {.kind = KILN_OP_UNPERMUTE,
	               .name = "moe.unpermute",
	               IN(comb, idx),
	               OUT(routed),
	               NEED(idx),
	               .traffic = lf((double)(e * nb * h + e * Tr * h))};
	if (pa == KILN_PROB_EXPERT_OUTPUT) {
		/* The probability gradient needs the expert outputs (saved before
		 * the combine, where they are N rows) along with the row map and
		 * probs. */
		unperm.in[unperm.n_in++] = probs;
		unperm.need[0] = eout;
		unperm.need[1] = idx;
		unperm.need[2] = probs;
		unperm.n_need = 3;
		unperm.traffic.base += (double)(4 * nb);
	} else if (pa == KILN_PROB_COMBINE) {
		/* The weighted sum on the token side: its input rows and their
		 * probabilities are saved there (moe_utils.py:598). */
		unperm.in[unperm.n_in++] = row_probs;
		unperm.need[unperm.n_need++] = comb;
		unperm.need[unperm.n_need++] = row_probs;
		unperm.traffic.base += (double)(4 * nb);
	}
	fwd_op(L, &unperm);
	if (t > 1 && !L->sp) {
		/* Each TP rank routed a 1/t share of the replicated tokens. The
		 * gradient of a replicated output needs only a local split in
		 * backward: no collective there. */
		int32_t full = tensor(L, "moe.routed_full", e * L->T * h, 0, 0);
		tp_comm(L, "moe.tp_gather", routed, full, KILN_COLL_ALL_GATHER, KILN_COLL_NONE);
		routed = full;
	}
	int32_t shared = -1;
	if (m->shared_experts > 0)
		shared = ffn(L, "moe.shared_", true, in, (uint64_t)m->shared_experts * fe,
		             m->moe_activation);
	return resid_op(L, "moe.resid", "out", "moe.resid_mask", routed, shared, x2, false);
}

/* Embedding pseudo-layer (docs/cost-model.md, embedding and head). Returns
 * its output. */
static int32_t embed_layer(lowerer *L)
{
	const kiln_model *m = L->m;
	uint64_t e = L->e, T = L->T, h = L->h, t = L->t, V = (uint64_t)m->vocab;
	int32_t out = tensor(L, "embed.out", e * T * h, 0, 0);
	fwd_op(L, &(spec){.kind = KILN_OP_EMBED,
	                  .name = "embed",
	                  OUT(out),
	                  .traffic = lf((double)(2 * e * T * h)),
	                  .params_local = div_up(V, t) * h,
	                  .params_global = V * h});
	if (t > 1) {
		/* Vocab-parallel lookup: partial rows are summed over TP. The
		 * backward of the all-reduce is the identity. */
		int32_t red = tensor(L, "embed.reduced", e * L->Tsp * h, 0, 0);
		tp_comm(L, "embed.tp_out", out, red,
		        L->sp ? KILN_COLL_REDUCE_SCATTER : KILN_COLL_ALL_REDUCE,
		        L->sp ? KILN_COLL_ALL_GATHER : KILN_COLL_NONE);
		out = red;
	}
	if (L->drop) {
		uint64_t n = L->Tsp * h;
		int32_t mask = tensor(L, "embed.dropout_mask", n, 0, KILN_T_SAVED | KILN_T_MASK);
		int32_t y = tensor(L, "embed.dropout_out", e * n, 0, 0);
		fwd_op(L, &(spec){.kind = KILN_OP_RESID_DROPOUT,
		                  .name = "embed.dropout",
		                  IN(out),
		                  OUT(y, mask),
		                  NEED(mask),
		                  .traffic = lf((double)((2 * e + 1) * n))});
		out = y;
	}
	return out;
}

/* Output pseudo-layer: final norm, output projection, fp32 cross entropy. */
static void head_layer(lowerer *L, bool recv)
{
	const kiln_model *m = L->m;
	uint64_t e = L->e, T = L->T, h = L->h, t = L->t, V = (uint64_t)m->vocab;
	uint64_t V_l = div_up(V, t);
	int32_t x = layer_input(L, "head.norm_in", recv);
	int32_t in = tensor(L, "head.in", e * L->Tsp * h, 0, KILN_T_SAVED);
	norm_op(L, KILN_OP_FINAL_NORM, "head.final_norm", x, in, L->Tsp, h);
	int32_t src = in;
	if (t > 1 && L->sp) {
		src = tensor(L, "head.in_full", e * T * h, 0, 0);
		tp_comm(L, "head.tp_in", in, src, KILN_COLL_ALL_GATHER, KILN_COLL_REDUCE_SCATTER);
	} else if (t > 1) {
		/* Column-parallel input: identity forward, all-reduce backward. */
		tp_comm(L, "head.tp_in", in, -1, KILN_COLL_NONE, KILN_COLL_ALL_REDUCE);
	}
	int32_t logits = tensor(L, "head.logits", 4 * T * V_l, 0, KILN_T_SAVED);
	fwd_op(L, &(spec){.kind = KILN_OP_LM_HEAD,
	                  .name = "head.lm_head",
	                  IN(src),
	                  OUT(logits),
	                  NEED(in),
	                  .flops = lf(2.0 * (double)T * (double)h * (double)V_l),
	                  .params_local = V_l * h,
	                  .params_global = V * h});
	int32_t loss = tensor(L, "head.loss", 4 * T, 0, 0);
	fwd_op(L, &(spec){.kind = KILN_OP_LOSS,
	                  .name = "head.loss",
	                  IN(logits),
	                  OUT(loss),
	                  NEED(logits),
	                  .traffic = lf((double)(4 * T * V_l + 4 * T))});
}

/* One transformer layer; returns its output tensor. */
static int32_t transformer_layer(lowerer *L, int64_t index, bool recv)
{
	int32_t x = layer_input(L, "ln1.in", recv);
	int32_t x2 = attention(L, x);
	bool dense = !L->m->moe || index < L->m->dense_layers;
	return dense ? dense_block(L, x2) : moe_block(L, x2);
}

static void init_shapes(lowerer *L, const kiln_model *m)
{
	L->m = m;
	L->e = kiln_model_act_bytes(m);
	L->s = (uint64_t)m->seq_len;
	L->mb = (uint64_t)m->micro_batch;
	L->h = (uint64_t)m->hidden;
	L->t = (uint64_t)m->tp;
	L->T = L->s * L->mb;
	L->sp = m->sequence_parallel && m->tp > 1;
	L->Tsp = L->sp ? div_up(L->T, L->t) : L->T;
	L->Tr = div_up(L->T, L->t);
	L->a = (uint64_t)m->heads / L->t;
	if (L->a == 0)
		L->a = 1;
	L->drop = m->dropout > 0;
}

int kiln_pass_lower(const kiln_model *m, kiln_arena *a, kiln_ir_graph **out)
{
	*out = NULL;
	lowerer *L = calloc(1, sizeof(*L));
	if (!L)
		return -1;
	init_shapes(L, m);
	L->b = kiln_ir_builder_new(a, m);
	if (!L->b) {
		free(L);
		return -1;
	}
	int64_t chunks = (int64_t)m->n_stage_layers;
	double n_balanced = m->moe ? (double)(L->Tr * (uint64_t)m->top_k) : 0;
	for (int64_t s = 0; s < m->pp; s++) {
		kiln_ir_builder_stage(L->b);
		for (int64_t v = 0; v < m->vpp; v++) {
			int64_t c = v * m->pp + s;
			if (c >= chunks)
				break;
			int64_t first = 0;
			for (int64_t i = 0; i < c; i++)
				first += m->stage_layers[i];
			int64_t n = m->stage_layers[c];
			/* The chunk's layers in execution order: the embedding joins
			 * chunk 0, the head the last chunk; data crosses stages at
			 * chunk boundaries. */
			bool has_embed = c == 0, has_head = c == chunks - 1;
			int64_t count = n + has_embed + has_head;
			for (int64_t j = 0; j < count; j++) {
				bool recv = m->pp > 1 && c > 0 && j == 0;
				bool send = m->pp > 1 && c < chunks - 1 && j == count - 1;
				int32_t y = -1;
				if (has_embed && j == 0) {
					begin_layer(L, KILN_LAYER_EMBED, -1, 0, 0);
					y = embed_layer(L);
				} else if (has_head && j == count - 1) {
					begin_layer(L, KILN_LAYER_HEAD, -1, (int32_t)v, 0);
					head_layer(L, recv);
				} else {
					int64_t i = first + j - has_embed;
					bool dense = !m->moe || i < m->dense_layers;
					begin_layer(L, dense ? KILN_LAYER_DENSE : KILN_LAYER_MOE,
					            (int32_t)i, (int32_t)v, dense ? 0 : n_balanced);
					y = transformer_layer(L, i, recv);
				}
				if (send)
					pp_send(L, y);
				end_layer(L);
			}
		}
	}
	kiln_ir_graph *g = kiln_ir_builder_finish(L->b);
	free(L);
	if (!g)
		return -1;
	*out = g;
	return 0;
}
