/* codegen/report.c: `kilnc check` and `kilnc report`, as text and JSON.
 *
 * Every figure comes from the cost model (docs/cost-model.md); this file only
 * arranges it. Text is for people (GiB, ms); JSON is for tools (bytes, us).
 */
#include <math.h>
#include <string.h>

#include "codegen/codegen.h"
#include "costmodel/costmodel.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static const char *fn_name(kiln_act_fn f)
{
	static const char *const names[] = {"swiglu", "gelu", "geglu", "quick_geglu"};
	return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

static const char *dtype_name(kiln_dtype d)
{
	switch (d) {
	case KILN_DTYPE_BF16:
		return "bf16";
	case KILN_DTYPE_FP16:
		return "fp16";
	case KILN_DTYPE_FP8:
		return "fp8";
	case KILN_DTYPE_FP32:
		return "fp32";
	}
	return "?";
}

static const char *schedule_name(kiln_schedule s)
{
	return s == KILN_SCHED_1F1B ? "1f1b" : "interleaved";
}

/* "671.0 B" style parameter counts. */
static void fmt_count(char *buf, size_t n, double v)
{
	if (v >= 1e12)
		snprintf(buf, n, "%.3f T", v / 1e12);
	else if (v >= 1e9)
		snprintf(buf, n, "%.1f B", v / 1e9);
	else if (v >= 1e6)
		snprintf(buf, n, "%.1f M", v / 1e6);
	else
		snprintf(buf, n, "%.0f", v);
}

/* label, then the names of the modules set in mask (bit i: names[i]). */
static void put_modules(FILE *out, const char *label, const char *const *names, int n,
                        uint32_t mask)
{
	fputs(label, out);
	for (int i = 0; i < n; i++)
		if (mask & (1u << i))
			fprintf(out, " %s", names[i]);
}

static double balanced_rows(const kiln_ir_graph *g)
{
	for (int32_t i = 0; i < g->n_layers; i++)
		if (g->layers[i].kind == KILN_LAYER_MOE)
			return g->layers[i].n_balanced;
	return 0;
}

void kiln_report_check(const kiln_ir_graph *g, FILE *out)
{
	const kiln_model *m = g->model;
	kiln_cost_params p;
	kiln_cost_params_count(g, &p);
	char total[32], active[32];
	fmt_count(total, sizeof total, (double)p.total);
	fmt_count(active, sizeof active, (double)p.active);

	/* Text from the description and the command line, escaped for the terminal. */
	char nb[1024], pb[4096];
	const char *path = m->path ? m->path : "-";
	fprintf(out, "%s: ok (%s)\n", kiln_text_escape(m->name, strlen(m->name), sizeof nb, nb),
	        kiln_text_escape(path, strlen(path), sizeof pb, pb));
	int64_t moe_layers = m->moe ? m->layers - m->dense_layers : 0;
	fprintf(out, "  model     %lld layers (%lld dense, %lld MoE), hidden %lld, %lld heads",
	        (long long)m->layers, (long long)(m->layers - moe_layers), (long long)moe_layers,
	        (long long)m->hidden, (long long)m->heads);
	if (m->mla)
		fprintf(out, " (MLA, kv rank %lld)", (long long)m->kv_lora_rank);
	else if (m->kv_heads != m->heads)
		fprintf(out, " / %lld kv", (long long)m->kv_heads);
	fprintf(out, ", %s attention, vocab %lld, seq %lld\n",
	        m->attention == KILN_ATTN_FLASH ? "flash" : "eager", (long long)m->vocab,
	        (long long)m->seq_len);
	if (m->moe)
		fprintf(out,
		        "  moe       %lld experts + %lld shared, top-%lld, expert ffn %lld (%s)\n",
		        (long long)m->experts, (long long)m->shared_experts, (long long)m->top_k,
		        (long long)m->expert_ffn_hidden, fn_name(m->moe_activation_fn));
	if (m->layers - moe_layers > 0)
		fprintf(out, "  ffn       %lld (%s)\n", (long long)m->ffn_hidden,
		        fn_name(m->activation_fn));
	/* The memory options (docs/model-format.md, "Memory options"). */
	static const char *const prob_where[] = {"in the expert activation", "on the expert output",
	                                         "after the combine"};
	fprintf(out, "  memory    %s, norms %s rstd",
	        m->mla         ? "MLA q, k, v"
	        : m->fused_qkv ? "fused qkv"
	                       : "separate q, k, v",
	        m->norm_saves_rstd ? "save" : "recompute");
	if (m->moe)
		fprintf(out, ", probabilities %s, %s row map", prob_where[m->prob_apply],
		        m->moe_permute_fusion ? "int32" : "int64");
	fputc('\n', out);
	fprintf(out, "  params    %s total, %s active per token\n", total, active);
	fprintf(out, "  training  micro-batch %lld x %lld micro-batches x dp %lld = %lld sequences, %s%s\n",
	        (long long)m->micro_batch, (long long)m->micro_batches, (long long)m->dp,
	        (long long)m->global_batch, dtype_name(m->dtype),
	        m->distributed_optimizer ? ", distributed optimizer" : "");
	fprintf(out, "  parallel  %lld devices = tp %lld x pp %lld x dp %lld; ep %lld (edp %lld)%s; %s",
	        (long long)m->devices, (long long)m->tp, (long long)m->pp, (long long)m->dp,
	        (long long)m->ep, (long long)m->edp,
	        m->sequence_parallel && m->tp > 1 ? ", sequence parallel" : "",
	        schedule_name(m->schedule));
	if (m->schedule == KILN_SCHED_INTERLEAVED)
		fprintf(out, " (vpp %lld)", (long long)m->vpp);
	fputc('\n', out);
	/* The measured-run keys (issue 15), when the description states any. */
	const kiln_megatron *mg = &m->megatron;
	if (m->dispatcher != KILN_DISPATCH_ALLTOALL || m->overlap_ep_comm ||
	    m->account_for_embedding || m->account_for_loss ||
	    mg->recompute != KILN_RECOMPUTE_NONE || mg->offload_modules ||
	    mg->capacity_factor > 0 || mg->force_load_balancing || mg->mtp_num_layers) {
		static const char *const dispatchers[] = {"alltoall", "deepep", "hybridep"};
		fprintf(out, "  megatron  dispatcher %s%s%s%s", dispatchers[m->dispatcher],
		        m->overlap_ep_comm ? ", EP overlap" : "",
		        m->account_for_embedding ? ", embedding counted in the split" : "",
		        m->account_for_loss ? ", loss counted in the split" : "");
		if (mg->recompute == KILN_RECOMPUTE_FULL)
			fprintf(out, ", full recompute");
		if (mg->recompute == KILN_RECOMPUTE_SELECTIVE) {
			static const char *const mods[] = {
#define X(id, name) name,
			    KILN_MEGATRON_RECOMPUTE_MODULES(X)
#undef X
			};
			put_modules(out, ", recompute", mods, KILN_MRC_COUNT,
			            mg->recompute_modules);
		}
		if (mg->offload_modules) {
			static const char *const offs[] = {
#define X(id, name) name,
			    KILN_MEGATRON_OFFLOAD_MODULES(X)
#undef X
			};
			put_modules(out, ", offload", offs, KILN_MOF_COUNT, mg->offload_modules);
		}
		if (mg->capacity_factor > 0)
			fprintf(out, ", capacity factor %g%s", mg->capacity_factor,
			        mg->pad_to_capacity ? " (padded)" : "");
		if (mg->force_load_balancing)
			fprintf(out, ", forced balance");
		if (mg->mtp_num_layers)
			fprintf(out, ", %lld MTP layers", (long long)mg->mtp_num_layers);
		fputc('\n', out);
	}
	fprintf(out, "  stages    layers per stage:");
	for (int32_t s = 0; s < g->n_stages; s++) {
		int n = 0;
		for (int32_t l = g->stages[s].layer_begin; l < g->stages[s].layer_end; l++)
			n += g->layers[l].index >= 0;
		fprintf(out, " %d", n);
	}
	fputc('\n', out);
	const kiln_hardware *hw = &m->hw;
	fprintf(out,
	        "  hardware  %s: %.4g GiB (%.4g reserved), %.4g TFLOP/s x %.2f, HBM %.4g GB/s, "
	        "host copies %.4g/%.4g GB/s\n",
	        kiln_text_escape(hw->name, strlen(hw->name), sizeof nb, nb), hw->memory_gib,
	        hw->reserved_gib, hw->peak_tflops, hw->gemm_efficiency, hw->hbm_gbps, hw->h2d_gbps,
	        hw->d2h_gbps);
	if (m->moe)
		fprintf(out,
		        "  load      balanced N = %.0f expert rows per device per MoE layer; plans up to "
		        "%.3gx\n",
		        balanced_rows(g), m->max_factor);
	fprintf(out, "  graph     %d stages, %d layers, %d ops, %d tensors\n", g->n_stages,
	        g->n_layers, g->n_ops, g->n_tensors);
}

void kiln_report_text(const kiln_ir_graph *g, FILE *out)
{
	const kiln_model *m = g->model;
	double rmax = m->max_factor;
	char nb[1024], hb[1024];
	fprintf(out,
	        "%s on %lld x %s (tp %lld, pp %lld, dp %lld, ep %lld), %s, %lld micro-batches\n\n",
	        kiln_text_escape(m->name, strlen(m->name), sizeof nb, nb), (long long)m->devices,
	        kiln_text_escape(m->hw.name, strlen(m->hw.name), sizeof hb, hb), (long long)m->tp,
	        (long long)m->pp, (long long)m->dp, (long long)m->ep, schedule_name(m->schedule),
	        (long long)m->micro_batches);
	/* Small models read better in MiB. */
	double unit = (m->hw.memory_gib - m->hw.reserved_gib) >= 1.0 ? GIB : GIB / 1024.0;
	const char *unit_name = unit == GIB ? "GiB" : "MiB";
	fprintf(out, "memory per device, %s (activations per micro-batch; peak keeps everything)\n",
	        unit_name);
	fprintf(out, "%5s %6s | %7s %7s %7s %7s | %7s %7s | %8s | %7s %7s %8s %8s | %7s %7s\n",
	        "stage", "layers", "weights", "grads", "optim", "static", "act@1", "act@max",
	        "inflight", "peak@1", "spike", "capacity", "headroom", "fwd ms", "bwd ms");
	int over = 0;
	for (int32_t s = 0; s < g->n_stages; s++) {
		kiln_cost_stage_summary r;
		kiln_cost_stage_summarize(g, s, &r);
		char layers[16];
		snprintf(layers, sizeof layers, "%d%s%s", r.layers, r.embedding ? "+E" : "",
		         r.head ? "+H" : "");
		fprintf(out,
		        "%5d %6s | %7.2f %7.2f %7.2f %7.2f | %7.2f %7.2f | %8.3g | %7.2f %7.2f %8.2f "
		        "%8.2f | %7.2f %7.2f\n",
		        s, layers, r.st.weights / unit, r.st.grads / unit, r.st.optimizer / unit,
		        r.st.total / unit, r.act_r1_bytes / unit, r.act_max_bytes / unit, r.inflight,
		        r.peak_r1_bytes / unit, r.peak_spike_bytes / unit, r.capacity_bytes / unit,
		        r.headroom_bytes / unit, r.fwd_us / 1e3, r.bwd_us / 1e3);
		over += r.headroom_bytes < 0;
	}
	fprintf(out, "\nact@max: every MoE layer at load factor %.3g; spike: one in-flight micro-batch at "
	             "%.3g, the others at 1.\n",
	        rmax, rmax);
	fprintf(out, "+E: embedding, +H: output layer and loss on this stage.\n");
	if (over)
		fprintf(out,
		        "%d of %d stages cannot keep every activation through a %.3gx spike "
		        "(negative headroom).\n",
		        over, g->n_stages, rmax);
	else
		fprintf(out, "every stage keeps every activation through a %.3gx spike.\n", rmax);

	/* The step-time model calibrated against measured runs (costmodel/step.c);
	 * the per-stage columns above are the planner's per-op costs. */
	kiln_cost_step it;
	double run_r = kiln_cost_step_run_load(m);
	kiln_cost_step_estimate(g, run_r, NULL, &it);
	char load_note[64];
	if (run_r == 1.0)
		snprintf(load_note, sizeof load_note, "balanced load");
	else
		snprintf(load_note, sizeof load_note, "busiest EP rank at %.3gx", run_r);
	fprintf(out,
	        "\niteration (everything kept, %s): %.3f s, %.4g tokens/s, MFU %.1f%%, "
	        "bubble %.1f%%, slowest stage %d\n",
	        load_note, it.iteration_s, it.tokens_per_s, 100.0 * it.mfu,
	        100.0 * it.bubble_fraction, it.slowest_stage);
	fprintf(out,
	        "  step model: slowest stage %.2f + %.2f ms per micro-batch (fwd + bwd%s), EP "
	        "all-to-all %.2f ms%s, %.4g GFLOP/token (Megatron's count)\n",
	        it.stage_fwd_us / 1e3, it.stage_bwd_us / 1e3,
	        m->megatron.recompute != KILN_RECOMPUTE_NONE ? " with the recipe's recompute" : "",
	        it.a2a_us / 1e3, m->overlap_ep_comm && m->ep > 1 ? " (overlapped)" : "",
	        kiln_cost_model_flops_per_token(m) / 1e9);
}

kiln_json *kiln_report_json(const kiln_ir_graph *g)
{
	const kiln_model *m = g->model;
	kiln_json *root = kiln_json_object();
	kiln_json_add_i64(root, "kiln_report", 1);
	kiln_json_add_string(root, "model", m->name);
	kiln_json_add_string(root, "path", m->path);
	kiln_json_add_string(root, "hardware", m->hw.name);
	kiln_json_add_i64(root, "layers", m->layers);

	kiln_json *par = kiln_json_add_object(root, "parallel");
	kiln_json_add_i64(par, "devices", m->devices);
	kiln_json_add_i64(par, "tp", m->tp);
	kiln_json_add_i64(par, "pp", m->pp);
	kiln_json_add_i64(par, "dp", m->dp);
	kiln_json_add_i64(par, "ep", m->ep);
	kiln_json_add_i64(par, "edp", m->edp);
	kiln_json_add_i64(par, "vpp", m->vpp);
	kiln_json_add_string(par, "schedule", schedule_name(m->schedule));
	kiln_json_add_bool(par, "sequence_parallel", m->sequence_parallel && m->tp > 1);
	kiln_json_add_i64(par, "micro_batches", m->micro_batches);

	kiln_cost_params p;
	kiln_cost_params_count(g, &p);
	kiln_json *params = kiln_json_add_object(root, "params");
	kiln_json_add_u64(params, "total", p.total);
	kiln_json_add_u64(params, "active", p.active);
	kiln_json_add_u64(params, "expert", p.expert);

	kiln_json *load = kiln_json_add_object(root, "load");
	kiln_json_add_number(load, "max_factor", m->max_factor);
	kiln_json_add_number(load, "balanced_rows", balanced_rows(g));

	kiln_json *stages = kiln_json_add_array(root, "stages");
	for (int32_t s = 0; s < g->n_stages; s++) {
		kiln_cost_stage_summary r;
		kiln_cost_stage_summarize(g, s, &r);
		kiln_json *st = kiln_json_add_object(stages, NULL);
		kiln_json_add_i64(st, "stage", s);
		kiln_json_add_i64(st, "layers", r.layers);
		kiln_json_add_i64(st, "moe_layers", r.moe_layers);
		kiln_json_add_bool(st, "embedding", r.embedding);
		kiln_json_add_bool(st, "head", r.head);
		kiln_json_add_u64(st, "params", r.st.params);
		kiln_json *sb = kiln_json_add_object(st, "static_bytes");
		kiln_json_add_u64(sb, "weights", r.st.weights);
		kiln_json_add_u64(sb, "grads", r.st.grads);
		kiln_json_add_u64(sb, "optimizer", r.st.optimizer);
		kiln_json_add_u64(sb, "total", r.st.total);
		kiln_json *ab = kiln_json_add_object(st, "activation_bytes");
		kiln_json_add_number(ab, "r1", r.act_r1_bytes);
		kiln_json_add_number(ab, "max", r.act_max_bytes);
		kiln_json_add_number(st, "inflight", r.inflight);
		kiln_json *pb = kiln_json_add_object(st, "peak_bytes");
		kiln_json_add_number(pb, "r1", r.peak_r1_bytes);
		kiln_json_add_number(pb, "spike", r.peak_spike_bytes);
		kiln_json_add_number(st, "capacity_bytes", r.capacity_bytes);
		kiln_json_add_number(st, "headroom_bytes", r.headroom_bytes);
		kiln_json *tu = kiln_json_add_object(st, "time_us");
		kiln_json_add_number(tu, "forward", r.fwd_us);
		kiln_json_add_number(tu, "backward", r.bwd_us);
	}

	kiln_cost_step it;
	double run_r = kiln_cost_step_run_load(m);
	kiln_cost_step_estimate(g, run_r, NULL, &it);
	kiln_json *itj = kiln_json_add_object(root, "iteration");
	kiln_json_add_number(itj, "seconds", it.iteration_s);
	kiln_json_add_number(itj, "tokens_per_second", it.tokens_per_s);
	kiln_json_add_number(itj, "model_flops", it.model_flops);
	kiln_json_add_number(itj, "model_flops_per_token", kiln_cost_model_flops_per_token(m));
	kiln_json_add_number(itj, "load_factor", run_r);
	kiln_json_add_number(itj, "mfu", it.mfu);
	kiln_json_add_number(itj, "bubble_fraction", it.bubble_fraction);
	kiln_json_add_i64(itj, "slowest_stage", it.slowest_stage);
	kiln_json *sm = kiln_json_add_object(itj, "step_model_us");
	kiln_json_add_number(sm, "stage_forward", it.stage_fwd_us);
	kiln_json_add_number(sm, "stage_backward", it.stage_bwd_us);
	kiln_json_add_number(sm, "ep_all_to_all", it.a2a_us);
	kiln_json_add_number(sm, "pp_send", it.p2p_us);
	kiln_json_add_number(sm, "dp_exposed", it.dp_exposed_us);
	kiln_json_add_number(sm, "optimizer", it.optimizer_us);
	kiln_json *lay = kiln_json_add_object(par, "megatron_layout");
	static const char *const dispatchers[] = {"alltoall", "deepep", "hybridep"};
	kiln_json_add_string(lay, "dispatcher", dispatchers[m->dispatcher]);
	kiln_json_add_bool(lay, "overlap_ep_comm", m->overlap_ep_comm);
	kiln_json_add_bool(lay, "account_for_embedding", m->account_for_embedding);
	kiln_json_add_bool(lay, "account_for_loss", m->account_for_loss);
	return root;
}
