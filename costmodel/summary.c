/* costmodel/summary.c: one stage's memory and time at r = 1 and at the
 * largest load factor the plan must survive (docs/cost-model.md, "Stage
 * summary"). */
#include "costmodel/costmodel.h"

void kiln_cost_stage_summarize(const kiln_ir_graph *g, int32_t stage, kiln_cost_stage_summary *out)
{
	const kiln_model *m = g->model;
	const kiln_ir_stage *st = &g->stages[stage];
	kiln_cost_stage_summary s = {0};
	s.stage = stage;
	for (int32_t l = st->layer_begin; l < st->layer_end; l++) {
		switch (g->layers[l].kind) {
		case KILN_LAYER_EMBED:
			s.embedding = true;
			break;
		case KILN_LAYER_HEAD:
			s.head = true;
			break;
		case KILN_LAYER_MOE:
			s.moe_layers++;
			s.layers++;
			break;
		case KILN_LAYER_DENSE:
			s.layers++;
			break;
		}
	}
	kiln_cost_stage_static(g, stage, &s.st);
	s.act_r1_bytes = kiln_cost_stage_activation_bytes(g, stage, 1.0);
	s.act_max_bytes = kiln_cost_stage_activation_bytes(g, stage, m->max_factor);
	s.inflight = kiln_cost_stage_inflight(g, stage);
	s.peak_r1_bytes = (double)s.st.total + s.inflight * s.act_r1_bytes;
	s.peak_spike_bytes =
	    (double)s.st.total + (s.inflight - 1) * s.act_r1_bytes + s.act_max_bytes;
	s.capacity_bytes = (m->hw.memory_gib - m->hw.reserved_gib) * 1073741824.0;
	s.headroom_bytes = s.capacity_bytes - s.peak_spike_bytes;
	kiln_cost_stage_time(g, stage, 1.0, &s.fwd_us, &s.bwd_us);
	*out = s;
}
