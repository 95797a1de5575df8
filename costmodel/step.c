/* costmodel/step.c: the step-time model `kilnc report` prices an iteration
 * with, calibrated against measured Megatron-Core runs (docs/cost-model.md,
 * "Step time"; docs/calibration.md for the fit and the table).
 *
 * It walks the same lowered graph as time.c but prices each op as the
 * kernels of a Megatron-Core run take:
 * - GEMMs at a shape-dependent share of peak: eff(rows) = E * rows / (rows +
 *   R), rows being the tokens of a dense GEMM or the rows one expert of a
 *   grouped GEMM receives (N / local experts): few rows per expert run far
 *   below peak; in backward only the data gradient has that shape, the
 *   weight gradient (a reduction over the rows) runs at E;
 * - the attention core at its own share of peak, the causal mask halving
 *   its work (flash kernels skip the masked blocks), plus its softmax's
 *   exponentials on the special-function units (hardware sfu_tops);
 * - memory-bound kernels at HBM bandwidth, each at least a floor (launch and
 *   tail of a small kernel);
 * - the passes Megatron-Core's stack makes beyond the fused kernels the
 *   lowering counts (megatron_extra_bytes: quick GeGLU's clamps, the
 *   experts' eager fc2 biases, the fused cross entropy's fp32 passes);
 * - the EP all-to-all over the real topology: the part of the group inside
 *   a node over NVLink, the rest over the inter-node links, the two
 *   concurrently; DeepEP / HybridEP send a token once per destination node
 *   and once per destination rank (not once per expert) and fuse the
 *   permutation into the communication kernels;
 * - TP collectives on NVLink (with sequence parallelism the all-gather and
 *   reduce-scatter the lowering emits);
 * - with overlap_ep_comm, in 1F1B steady state the forward of one
 *   micro-batch runs beside the backward of another, so a layer's
 *   all-to-all hides under the other micro-batch's compute: each layer pair
 *   costs max(compute, all-to-all) instead of their sum;
 * - pipeline sends overlap with compute in steady state (Megatron's
 *   --overlap-p2p-communication) and add to the fill and drain only;
 * - the distributed optimizer's gradient reduce-scatter overlaps the last
 *   micro-batch's backward and its parameter all-gather the first one's
 *   forward; only what does not fit is exposed; then the optimizer step at
 *   HBM bandwidth;
 * - the megatron: recipe's recompute adds the recomputed modules' forward
 *   time to the backward;
 * - the host (Python and kernel launches) needs a time per transformer
 *   layer's forward and backward of its own; a layer takes the longer of
 *   the device's and the host's time (small models are host-bound).
 * The hardware figures are the datasheet's; the time_* figures of the profile
 * are the only fitted numbers (six are fitted for h100-sxm).
 */
#include <math.h>
#include <string.h>

#include "costmodel/costmodel.h"

void kiln_cost_step_params_of(const kiln_hardware *hw, kiln_cost_step_params *out)
{
	out->gemm_efficiency =
	    hw->time_gemm_efficiency > 0 ? hw->time_gemm_efficiency : hw->gemm_efficiency;
	out->gemm_half_rows = hw->time_gemm_half_rows;
	out->attention_efficiency =
	    hw->time_attention_efficiency > 0 ? hw->time_attention_efficiency : hw->gemm_efficiency;
	out->comm_efficiency = hw->time_comm_efficiency > 0 ? hw->time_comm_efficiency : 1;
	out->inter_node_efficiency = hw->time_inter_node_efficiency > 0
	                                 ? hw->time_inter_node_efficiency
	                                 : out->comm_efficiency;
	out->kernel_floor_us = hw->time_kernel_floor_us;
	out->host_layer_us = hw->time_host_layer_us;
}

double kiln_cost_step_run_load(const kiln_model *m)
{
	if (!m->moe || m->ep <= 1)
		return 1.0;
	const kiln_megatron *mg = &m->megatron;
	if (mg->force_load_balancing)
		return 1.0;
	if (mg->capacity_factor > 0) {
		/* Padded: every expert computes exactly its capacity; unpadded:
		 * at most that. */
		if (mg->pad_to_capacity)
			return mg->capacity_factor;
		return mg->capacity_factor < KILN_COST_NATURAL_PEAK ? mg->capacity_factor
		                                                    : KILN_COST_NATURAL_PEAK;
	}
	return KILN_COST_NATURAL_PEAK;
}

/* log C(n, k) for the hypergeometric probabilities below. */
static double log_choose(double n, double k)
{
	if (k < 0 || k > n)
		return -INFINITY;
	return lgamma(n + 1) - lgamma(k + 1) - lgamma(n - k + 1);
}

/* The probability that a token routed to k distinct experts of E, chosen
 * uniformly (balanced routing), picks at least one of a group of g experts:
 * 1 - C(E - g, k) / C(E, k). */
static double p_touch(double E, double k, double g)
{
	if (g >= E)
		return 1;
	if (E - g < k)
		return 1;
	return 1 - exp(log_choose(E - g, k) - log_choose(E, k));
}

/* Bytes one rank sends in one all-to-all of n rows (dispatch or combine, in
 * either direction) over NVLink (out_intra) and over the inter-node links
 * (out_inter). */
static void a2a_bytes(const kiln_model *m, double row_bytes, double n, double *out_intra,
                      double *out_inter)
{
	double ep = (double)m->ep, k = (double)m->top_k, E = (double)m->experts;
	double dpn = (double)m->hw.devices_per_node;
	double in_node = ep < dpn ? ep : dpn; /* ranks of the group in one node */
	double nodes = ep / in_node;
	if (m->dispatcher == KILN_DISPATCH_ALLTOALL) {
		/* One copy per (token, expert) pair, spread evenly over the ranks:
		 * the own rank's share stays, the node's other ranks' share goes
		 * over NVLink, the rest leaves the node. */
		*out_intra = n * row_bytes * (in_node - 1) / ep;
		*out_inter = n * row_bytes * (ep - in_node) / ep;
		return;
	}
	/* DeepEP / HybridEP: a token crosses to each other node it has an
	 * expert on once, then is forwarded inside that node once per rank; in
	 * its own node once per other rank. n / k tokens. */
	double tokens = n / k;
	double per_rank = E / ep, per_node = per_rank * in_node;
	double pr = p_touch(E, k, per_rank), pn = p_touch(E, k, per_node);
	double inter = tokens * row_bytes * (nodes - 1) * pn;
	/* The copy arriving in a node lands on one rank, which forwards it over
	 * NVLink to the node's touched ranks: in_node * pr / pn of them given
	 * the node is touched, all but a 1 / in_node share on other ranks. By
	 * symmetry a rank forwards as much as it sends out. */
	double fwd = pn > 0 ? inter * (in_node * pr / pn) * (in_node - 1) / in_node : 0;
	*out_intra = tokens * row_bytes * (in_node - 1) * pr + fwd;
	*out_inter = inter;
}

static double bw_bytes_per_us(double gbps)
{
	return gbps * 1e3;
}

/* Bytes per microsecond over NVLink (in_node) or the inter-node links, at
 * the profile's fitted efficiency for that link. */
static double link_bytes_per_us(const kiln_hardware *hw, const kiln_cost_step_params *p,
                                bool in_node)
{
	return bw_bytes_per_us(in_node ? hw->intra_node_gbps : hw->inter_node_gbps) *
	       (in_node ? p->comm_efficiency : p->inter_node_efficiency);
}

/* Memory traffic (bytes) and kernels that Megatron-Core's implementation of
 * op adds to what the lowering counts (docs/cost-model.md, "Step time",
 * "What Megatron-Core runs"), at n expert rows; the IR's traffic is what a
 * fused kernel moves, these are the passes the measured stack makes on top:
 * - GPT-OSS's clamped quick GeGLU: weighted_bias_quick_geglu_impl clamps the
 *   two halves of the fc1 output and concatenates them before its fused
 *   function (megatron/core/fusions/fused_bias_geglu.py lines 424-432 at
 *   core_v0.17.1): forward two clamps and a cat over the n x 2f input
 *   (each pass reads and writes it, 4e bytes per element), backward the
 *   clamps' masks (read the gradient and the input, write: 3e; cat's
 *   backward is a view);
 * - biases on the experts' fc2 (linear_bias): TEGroupedMLP adds them after
 *   the grouped GEMM with one eager multiply and add per local expert in
 *   fp32, since the router probabilities are fp32, then a cat and a cast
 *   back (_apply_bias, megatron/core/transformer/moe/experts.py lines
 *   250-268 and 398 at core_v0.17.1): per element of the n x h output
 *   forward 4 + (e + 8) + 8 + (4 + e) bytes, backward the cast (e + 4), the
 *   add's cast of the gradient (4 + e) and the multiply's two gradients
 *   (g * p and its row sum, g * b and its sum, 12 each);
 * - the loss: Megatron's fused vocab-parallel cross entropy
 *   (megatron/core/fusions/fused_cross_entropy.py at core_v0.17.1) casts the
 *   logits to fp32 and takes their max (read e, write 4 bytes per logit),
 *   subtracts, exponentiates and sums (read 4, write 4), normalises in place
 *   (read 4, write 4) and saves the fp32 softmax; its backward updates that
 *   softmax in place (read 4, write 4) and the fp32 gradient is cast to the
 *   logits' dtype (read 4, write e): forward e + 20, backward e + 12 bytes
 *   per logit, against the one fp32 pass (4, 8) the lowering counts, which
 *   this replaces.
 * Returns the extra bytes; *out_kernels gets the extra kernel launches. */
static double megatron_extra_bytes(const kiln_model *m, const kiln_ir_op *op, double n,
                                   double *out_kernels)
{
	double e = (double)kiln_model_act_bytes(m), h = (double)m->hidden;
	double f = (double)m->expert_ffn_hidden;
	double local = (double)((m->experts + m->ep - 1) / (m->ep > 0 ? m->ep : 1));
	*out_kernels = 0;
	switch (op->kind) {
	case KILN_OP_EXPERT_ACT:
		if (m->moe_activation_fn != KILN_ACTFN_QUICK_GEGLU)
			return 0;
		*out_kernels = op->backward ? 2 : 3;
		return n * 2 * f * e * (op->backward ? 3 : 4);
	case KILN_OP_EXPERT_DOWN:
		if (!m->linear_bias)
			return 0;
		*out_kernels = op->backward ? 5 * local + 1 : 2 * local + 2;
		return n * h * (op->backward ? 32 + 2 * e : 24 + 2 * e);
	case KILN_OP_LOSS: {
		double tokens = (double)(m->micro_batch * m->seq_len);
		double v_local = (double)((m->vocab + m->tp - 1) / m->tp);
		double logits = tokens * v_local;
		*out_kernels = op->backward ? 1 : 2;
		return op->backward ? logits * (e + 12 - 8) : logits * (e + 20 - 4);
	}
	default:
		return 0;
	}
}

double kiln_cost_step_op_us(const kiln_ir_graph *g, const kiln_ir_op *op, double n,
                            const kiln_cost_step_params *p)
{
	const kiln_model *m = g->model;
	const kiln_hardware *hw = &m->hw;
	double peak = hw->peak_tflops * 1e6; /* FLOPs per us */
	double flops = kiln_linf_at(op->flops, n);
	double traffic = kiln_linf_at(op->traffic, n);
	double bytes = kiln_linf_at(op->comm_bytes, n);
	double tokens = (double)(m->micro_batch * m->seq_len);
	switch (op->kind) {
	case KILN_OP_INPUT:
		return 0;
	case KILN_OP_PERMUTE:
	case KILN_OP_UNPERMUTE:
		/* Fused into DeepEP's and HybridEP's dispatch and combine kernels. */
		if (m->dispatcher != KILN_DISPATCH_ALLTOALL)
			return 0;
		break;
	default:
		break;
	}
	switch (kiln_ir_op_kind_class(op->kind)) {
	case KILN_OPCLASS_GEMM: {
		if (flops <= 0)
			return 0;
		double rows = tokens;
		if (op->kind == KILN_OP_EXPERT_UP || op->kind == KILN_OP_EXPERT_DOWN) {
			int64_t local = (m->experts + m->ep - 1) / m->ep;
			rows = n / (double)(local > 0 ? local : 1);
		} else if (op->kind == KILN_OP_ROUTER || op->kind == KILN_OP_SHARED_UP ||
		           op->kind == KILN_OP_SHARED_DOWN) {
			rows = tokens / (double)m->tp;
		}
		double eff = p->gemm_efficiency;
		if (p->gemm_half_rows > 0)
			eff *= rows / (rows + p->gemm_half_rows);
		double kernels, extra = megatron_extra_bytes(m, op, n, &kernels);
		double around =
		    extra > 0 ? kiln_cost_hbm_us(hw, extra) + kernels * p->kernel_floor_us : 0;
		if (!op->backward)
			return flops / (peak * eff) + around;
		/* Backward: the data gradient has the forward's shape (rows x K x
		 * N); the weight gradient reduces over the rows into a K x N
		 * output, which fills the device however few the rows are. */
		return flops / 2 / (peak * eff) + flops / 2 / (peak * p->gemm_efficiency) + around;
	}
	case KILN_OPCLASS_MEM: {
		double kernels, extra = megatron_extra_bytes(m, op, n, &kernels);
		if (traffic + extra <= 0)
			return 0;
		return kiln_cost_hbm_us(hw, traffic + extra) + (1 + kernels) * p->kernel_floor_us;
	}
	case KILN_OPCLASS_ATTN: {
		/* Causal: flash kernels skip the masked half; eager computes the
		 * whole score matrix. */
		double work = m->attention == KILN_ATTN_FLASH ? flops / 2 : flops;
		double c = work / (peak * p->attention_efficiency),
		       mem = kiln_cost_hbm_us(hw, traffic);
		if (op->kind == KILN_OP_ATTN_CORE && m->attention == KILN_ATTN_FLASH &&
		    hw->sfu_tops > 0) {
			double a = (double)(m->heads >= m->tp ? m->heads / m->tp : 1);
			double s = (double)m->seq_len;
			double exps = a * s * s * (double)m->micro_batch / 2;
			c += exps / (hw->sfu_tops * 1e6);
		}
		return (c > mem ? c : mem) + p->kernel_floor_us;
	}
	case KILN_OPCLASS_COMM_TP: {
		int32_t grp = op->comm_group;
		if (grp <= 1 || bytes <= 0 || op->collective == KILN_COLL_NONE ||
		    op->collective == KILN_COLL_RECV)
			return 0;
		double share = (double)(grp - 1) / (double)grp;
		if (op->collective == KILN_COLL_ALL_REDUCE)
			share *= 2;
		return share * bytes / link_bytes_per_us(hw, p, grp <= hw->devices_per_node);
	}
	case KILN_OPCLASS_COMM_EP: {
		if (m->ep <= 1 || bytes <= 0 || op->collective != KILN_COLL_ALL_TO_ALL)
			return 0;
		double row_bytes = n > 0 ? bytes / n : 0, intra, inter;
		a2a_bytes(m, row_bytes, n, &intra, &inter);
		double t_in = intra / link_bytes_per_us(hw, p, true);
		double t_out = inter / link_bytes_per_us(hw, p, false);
		return t_in > t_out ? t_in : t_out;
	}
	case KILN_OPCLASS_COMM_PP:
		/* Overlapped in steady state; see kiln_cost_step_estimate. */
		return 0;
	}
	return 0;
}

/* Whether the recipe recomputes op (a forward op) in the backward pass:
 * a selective module re-runs its whole region (costmodel/megatron.c). */
static bool recomputed(const kiln_model *m, const kiln_ir_op *op, bool full_layer)
{
	if (full_layer)
		return op->kind != KILN_OP_INPUT && op->kind != KILN_OP_PP_SEND;
	if (m->megatron.recompute != KILN_RECOMPUTE_SELECTIVE)
		return false;
	return (kiln_megatron_recompute_cover(op->kind) & m->megatron.recompute_modules) != 0;
}

void kiln_cost_step_layer(const kiln_ir_graph *g, int32_t layer, double r,
                          const kiln_cost_step_params *p, bool full_recompute,
                          kiln_cost_step_layer_time *out)
{
	memset(out, 0, sizeof(*out));
	const kiln_ir_layer *ly = &g->layers[layer];
	double n = r * ly->n_balanced;
	for (int32_t o = ly->op_begin; o < ly->op_end; o++) {
		const kiln_ir_op *op = &g->ops[o];
		double us = kiln_cost_step_op_us(g, op, n, p);
		bool comm = kiln_ir_op_kind_class(op->kind) == KILN_OPCLASS_COMM_EP;
		bool moe = op->kind >= KILN_OP_ROUTER && op->kind <= KILN_OP_SHARED_DOWN;
		if (op->backward) {
			out->bwd_us += us;
			if (comm)
				out->bwd_a2a_us += us;
			if (moe)
				out->moe_bwd_us += us;
		} else {
			out->fwd_us += us;
			if (comm)
				out->fwd_a2a_us += us;
			if (moe)
				out->moe_fwd_us += us;
			if (recomputed(g->model, op, full_recompute)) {
				out->recompute_us += us;
				if (comm)
					out->recompute_a2a_us += us;
			}
		}
	}
}

/* Whether the recipe's full recompute covers the j-th transformer layer of a
 * stage holding count of them. */
static bool full_covers(const kiln_model *m, int64_t j)
{
	if (m->megatron.recompute != KILN_RECOMPUTE_FULL)
		return false;
	int64_t k = m->megatron.recompute_num_layers;
	if (k <= 0 || m->megatron.recompute_method == KILN_RECOMPUTE_UNIFORM)
		return true; /* uniform recomputes every layer (in units of k) */
	return j < k;        /* block: the first k layers of the stage */
}

void kiln_cost_step_host_floor(const kiln_cost_step_params *p, bool transformer, double *fwd_us,
                               double *bwd_us)
{
	/* The host issues a transformer layer's kernels at its own pace: when
	 * it is slower than the device, the device waits. */
	double host = transformer ? p->host_layer_us : 0, dev = *fwd_us + *bwd_us;
	if (host > dev && dev > 0) {
		*fwd_us *= host / dev;
		*bwd_us *= host / dev;
	}
}

double kiln_cost_step_pair_us(const kiln_cost_step_params *p, bool transformer, double fwd_us,
                              double fwd_a2a_us, double bwd_us, double bwd_a2a_us)
{
	/* Each one's all-to-all under the other's compute: the compute stream
	 * runs both computes, the communication stream both all-to-alls. */
	double a2a = fwd_a2a_us + bwd_a2a_us, compute = fwd_us + bwd_us - a2a;
	double dev = compute > a2a ? compute : a2a, host = transformer ? p->host_layer_us : 0;
	return dev > host ? dev : host;
}

void kiln_cost_step_stage_dp(const kiln_ir_graph *g, int32_t stage, const kiln_cost_step_params *p,
                             kiln_cost_step_dp *out)
{
	const kiln_model *m = g->model;
	const kiln_hardware *hw = &m->hw;
	uint64_t dense_params, expert_params;
	kiln_cost_stage_params(g, stage, &dense_params, &expert_params);
	double dpg = (double)m->dp, edpg = (double)m->edp;
	double dpn = (double)hw->devices_per_node;
	bool dp_in = dpg * (double)m->tp <= dpn, edp_in = edpg * (double)m->ep <= dpn;
	double bw_dp = link_bytes_per_us(hw, p, dp_in), bw_edp = link_bytes_per_us(hw, p, edp_in);
	double grad_b = 2, param_b = 2; /* bf16 gradient buffer and parameters */
	double rs = 0, ag = 0;
	if (dpg > 1) {
		double sh = (dpg - 1) / dpg * (double)dense_params;
		rs += sh * grad_b / bw_dp;
		ag += sh * param_b / bw_dp;
	}
	if (edpg > 1) {
		double sh = (edpg - 1) / edpg * (double)expert_params;
		rs += sh * grad_b / bw_edp;
		ag += sh * param_b / bw_edp;
	}
	if (!m->distributed_optimizer) {
		rs *= 2; /* an all-reduce instead of a reduce-scatter */
		ag = 0;
	}
	/* Adam on this device's shard: fp32 main weights, two moments and the
	 * gradient read and written, the bf16 weights written (16 + 16 + 2
	 * bytes per element). */
	double shard = m->distributed_optimizer
	                   ? (double)dense_params / dpg + (double)expert_params / edpg
	                   : (double)(dense_params + expert_params);
	out->reduce_scatter_us = rs;
	out->all_gather_us = ag;
	out->optimizer_us = kiln_cost_hbm_us(hw, shard * 34);
}

double kiln_cost_step_dp_exposed_us(const kiln_cost_step_dp *d, double first_fwd_us,
                                    double last_bwd_us)
{
	double rs = d->reduce_scatter_us, ag = d->all_gather_us;
	return (rs > last_bwd_us ? rs - last_bwd_us : 0) +
	       (ag > first_fwd_us ? ag - first_fwd_us : 0);
}

void kiln_cost_step_estimate(const kiln_ir_graph *g, double r, const kiln_cost_step_params *pp,
                             kiln_cost_step *out)
{
	const kiln_model *m = g->model;
	const kiln_hardware *hw = &m->hw;
	kiln_cost_step_params own;
	if (!pp) {
		kiln_cost_step_params_of(hw, &own);
		pp = &own;
	}
	memset(out, 0, sizeof(*out));
	double mb = (double)m->micro_batches, p = (double)m->pp;
	double v = m->schedule == KILN_SCHED_INTERLEAVED && m->vpp > 1 ? (double)m->vpp : 1.0;
	double worst = 0, worst_f = 0, worst_b = 0, worst_single = 0;
	for (int32_t s = 0; s < g->n_stages; s++) {
		const kiln_ir_stage *st = &g->stages[s];
		double f = 0, b = 0, pair = 0, a2a = 0;
		int64_t j = 0;
		double send_bytes = 0;
		for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
			const kiln_ir_layer *ly = &g->layers[l];
			bool tl = ly->kind == KILN_LAYER_DENSE || ly->kind == KILN_LAYER_MOE;
			kiln_cost_step_layer_time t;
			kiln_cost_step_layer(g, l, r, pp, tl && full_covers(m, j), &t);
			j += tl;
			double lf = t.fwd_us, lb = t.bwd_us + t.recompute_us;
			double la2a = t.fwd_a2a_us + t.bwd_a2a_us + t.recompute_a2a_us;
			/* Overlapped pair: this layer's forward compute of one
			 * micro-batch beside its backward of another, each one's
			 * all-to-all under the other's compute. */
			pair += kiln_cost_step_pair_us(pp, tl, lf, t.fwd_a2a_us, lb,
			                               t.bwd_a2a_us + t.recompute_a2a_us);
			kiln_cost_step_host_floor(pp, tl, &lf, &lb);
			f += lf;
			b += lb;
			a2a += la2a;
			for (int32_t o = ly->op_begin; o < ly->op_end; o++) {
				const kiln_ir_op *op = &g->ops[o];
				if (!op->backward && op->kind == KILN_OP_PP_SEND &&
				    op->collective == KILN_COLL_SEND)
					send_bytes +=
					    kiln_linf_at(op->comm_bytes, ly->n_balanced * r);
			}
		}
		double steady = m->overlap_ep_comm && m->ep > 1 ? pair : f + b;
		if (steady > worst) {
			worst = steady;
			worst_f = f;
			worst_b = b;
			worst_single = f + b;
			out->slowest_stage = s;
		}
		if (a2a > out->a2a_us)
			out->a2a_us = a2a;
		/* Data-parallel gradient and parameter traffic of this stage, and
		 * its optimizer step. */
		kiln_cost_step_dp dp;
		kiln_cost_step_stage_dp(g, s, pp, &dp);
		double exposed = kiln_cost_step_dp_exposed_us(&dp, f, b), opt = dp.optimizer_us;
		double dpn = (double)hw->devices_per_node;
		bool pp_out =
		    (double)m->devices / p >= dpn; /* stages are devices / pp ranks apart */
		double send_us = send_bytes / link_bytes_per_us(hw, pp, !pp_out);
		if (exposed + opt > out->dp_exposed_us + out->optimizer_us) {
			out->dp_exposed_us = exposed;
			out->optimizer_us = opt;
		}
		if (send_us > out->p2p_us)
			out->p2p_us = send_us;
	}
	/* 1F1B: m micro-batches through the slowest stage, plus the fill and
	 * drain of (p - 1) / v stage times; with EP overlap the first forward
	 * and the last backward run alone. */
	double bubble = (p - 1) / v;
	double steady_us = mb * worst;
	if (m->overlap_ep_comm && m->ep > 1 && mb >= 1)
		steady_us = (mb - 1) * worst + worst_single;
	double fill_us = bubble * (worst_f + worst_b) + 2 * (p - 1) * out->p2p_us;
	double total_us = steady_us + fill_us + out->dp_exposed_us + out->optimizer_us;
	out->iteration_s = total_us * 1e-6;
	out->bubble_fraction = total_us > 0 ? fill_us / total_us : 0;
	out->stage_fwd_us = worst_f;
	out->stage_bwd_us = worst_b;
	out->model_flops =
	    kiln_cost_model_flops_per_token(m) * (double)m->global_batch * (double)m->seq_len;
	if (out->iteration_s > 0) {
		out->tokens_per_s = (double)m->global_batch * (double)m->seq_len / out->iteration_s;
		out->mfu = out->model_flops /
		           (out->iteration_s * (double)m->devices * hw->peak_tflops * 1e12);
	}
}
