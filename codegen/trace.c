/* codegen/trace.c: the schedule as Chrome trace-event JSON.
 *
 * Perfetto (ui.perfetto.dev) and chrome://tracing open the file as it is.
 * Layout (docs/schedule.md, "Views"): a process per stage (pid = stage), a
 * thread per stream (tid = kiln_stream), an "X" complete event per task. A
 * stage runs its layers back to back, each layer its template, so layer k
 * starts where layer k-1's template ends.
 */
#include <math.h>
#include <stdio.h>

#include "codegen/codegen.h"
#include "passes/passes.h"

/* The views' own names: what a person reading a timeline sees, longer than
 * the scheduler's short kiln_stream_name / kiln_task_kind_name. Indexed by
 * kiln_stream and kiln_task_kind. */
static const char *const STREAM_NAMES[KILN_STREAM_COUNT] = {
    [KILN_STREAM_COMPUTE] = "compute",
    [KILN_STREAM_COMM] = "communication",
    [KILN_STREAM_D2H] = "device-to-host",
    [KILN_STREAM_H2D] = "host-to-device",
};
static const char *const KIND_NAMES[KILN_TASK_KIND_COUNT] = {
    [KILN_TASK_FORWARD] = "forward",     [KILN_TASK_BACKWARD] = "backward",
    [KILN_TASK_RECOMPUTE] = "recompute", [KILN_TASK_COPY] = "copy",
    [KILN_TASK_COMM] = "communication",
};

const char *kiln_view_stream_name(int stream)
{
	return stream >= 0 && stream < KILN_STREAM_COUNT ? STREAM_NAMES[stream] : "?";
}

const char *kiln_view_kind_name(int kind)
{
	return kind >= 0 && kind < KILN_TASK_KIND_COUNT ? KIND_NAMES[kind] : "?";
}

/* The micro-batch a chain works on in 1F1B steady state: the forward of
 * micro-batch 1 runs beside the backward of micro-batch 0. */
static int micro_batch(int32_t chain)
{
	return chain == 0 ? 1 : 0;
}

static void add_meta(kiln_json *events, const char *name, int32_t pid, int32_t tid, const char *key,
                     const char *str, double num)
{
	kiln_json *e = kiln_json_add_object(events, NULL);
	kiln_json_add_string(e, "name", name);
	kiln_json_add_string(e, "ph", "M");
	kiln_json_add_i64(e, "pid", pid);
	kiln_json_add_i64(e, "tid", tid);
	kiln_json *args = kiln_json_add_object(e, "args");
	if (str)
		kiln_json_add_string(args, key, str);
	else
		kiln_json_add_number(args, key, num);
}

static void add_stage_meta(kiln_json *events, int32_t stage)
{
	char name[32];
	snprintf(name, sizeof name, "stage %d", (int)stage);
	add_meta(events, "process_name", stage, 0, "name", name, 0);
	add_meta(events, "process_sort_index", stage, 0, "sort_index", NULL, stage);
	for (int s = 0; s < KILN_STREAM_COUNT; s++) {
		add_meta(events, "thread_name", stage, s, "name", kiln_view_stream_name(s), 0);
		add_meta(events, "thread_sort_index", stage, s, "sort_index", NULL, s);
	}
}

static void add_task(kiln_json *events, int32_t stage, int32_t layer, int32_t template_id,
                     const kiln_template *t, const kiln_task *k, double offset_us)
{
	/* Chunk names are short compiler-made strings ("recompute moe.expert_up");
	 * a longer one is cut, never overflowed. */
	char name[256];
	snprintf(name, sizeof name, "L%d %s mb%d", (int)layer, k->name ? k->name : "?",
	         micro_batch(k->chain));
	kiln_json *e = kiln_json_add_object(events, NULL);
	kiln_json_add_string(e, "name", name);
	kiln_json_add_string(e, "cat", kiln_view_kind_name((int)k->kind));
	kiln_json_add_string(e, "ph", "X");
	kiln_json_add_i64(e, "pid", stage);
	kiln_json_add_i64(e, "tid", k->stream);
	kiln_json_add_number(e, "ts", offset_us + k->start_us);
	kiln_json_add_number(e, "dur", fmax(0.0, k->end_us - k->start_us));
	kiln_json *args = kiln_json_add_object(e, "args");
	kiln_json_add_i64(args, "layer", layer);
	kiln_json_add_i64(args, "chain", k->chain);
	kiln_json_add_i64(args, "template", template_id);
	kiln_json_add_i64(args, "plan", t->plan);
	kiln_json_add_number(args, "load_factor", t->load_factor);
}

/* Builds the whole document; NULL on exhaustion or a timeline naming a
 * template that does not exist. */
static kiln_json *build(const struct kiln_plan_schedule *s)
{
	kiln_json *root = kiln_json_object();
	kiln_json *events = kiln_json_add_array(root, "traceEvents");
	for (int32_t i = 0; i < s->n_stages; i++)
		add_stage_meta(events, s->stages[i].stage);
	for (int32_t i = 0; i < s->n_stages; i++) {
		const kiln_stage_timeline *st = &s->stages[i];
		double offset_us = 0;
		for (int32_t l = 0; l < st->n_layers; l++) {
			int32_t id = st->template_id[l];
			if (id < 0 || id >= s->n_templates) {
				kiln_json_free(root);
				return NULL;
			}
			const kiln_template *t = &s->templates[id];
			for (int32_t k = 0; k < t->n_tasks; k++)
				add_task(events, st->stage, st->layer[l], id, t, &t->tasks[k],
				         offset_us);
			offset_us += t->makespan_us;
		}
	}
	/* The Trace Event Format knows only "ms" and "ns" here (chrome://tracing
	 * refuses other units); timestamps are microseconds either way. */
	kiln_json_add_string(root, "displayTimeUnit", "ms");
	kiln_json *other = kiln_json_add_object(root, "otherData");
	kiln_json_add_string(other, "model", s->model ? s->model : "");
	kiln_json_add_string(other, "time_unit", "us");
	return root;
}

int kiln_trace_write(const struct kiln_plan_schedule *s, FILE *out)
{
	kiln_json *root = build(s);
	if (!root)
		return -1;
	int rc = kiln_json_write(root, out);
	kiln_json_free(root);
	/* Buffered bytes fail only when flushed (a full disk, /dev/full). */
	if (fflush(out) != 0 || ferror(out))
		rc = -1;
	return rc;
}
