/* tests/test_views.c: the schedule views (codegen/trace.c, codegen/svg.c).
 *
 * Most tests run on a schedule built here by hand, so the expected event
 * times are sums done in the comments below, not the writer's output pasted
 * back. The golden test compiles tests' tiny model and compares the SVG
 * with tests/golden/tiny.svg (KILN_UPDATE_GOLDEN=1 rewrites it).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "kiln_test.h"
#include "passes/passes.h"

/* ------------------------------------------------------------ fixture */

/* Template 0: an MoE layer at load 1.5 (plan 3), makespan 10 us.
 *   task                     kind       stream   chain  start end
 *   reload moe.expert_in     copy       h2d      1      0     3
 *   attn                     forward    compute  0      0     4
 *   attn.bwd                 backward   compute  1      4     9
 *   dispatch                 comm       comm     0      4     6
 *   offload moe.expert_in    copy       d2h      0      6     8
 *   recompute moe.expert_up  recompute  compute  1      9     10
 * Template 1: a dense layer at load 1 (plan 0), makespan 6 us.
 *   attn                     forward    compute  0      0     2.5
 *   mlp.bwd                  backward   compute  1      2.5   6
 *   allreduce                comm       comm     1      3     5
 * Stage 0 runs layers 0 (template 1), 1 and 2 (template 0): offsets 0, 6, 16.
 * Stage 1 runs layer 3 (template 0): offset 0. */
static kiln_task T0[] = {
    {"reload moe.expert_in", KILN_TASK_COPY, KILN_STREAM_H2D, 1, 0, 3, 0, 3, NULL, 0, 0},
    {"attn", KILN_TASK_FORWARD, KILN_STREAM_COMPUTE, 0, 0, 4, 0, 4, NULL, 0, 0},
    {"attn.bwd", KILN_TASK_BACKWARD, KILN_STREAM_COMPUTE, 1, 1, 5, 4, 9, NULL, 0, 0},
    {"dispatch", KILN_TASK_COMM, KILN_STREAM_COMM, 0, 1, 2, 4, 6, NULL, 0, 0},
    {"offload moe.expert_in", KILN_TASK_COPY, KILN_STREAM_D2H, 0, 2, 2, 6, 8, NULL, 0, 0},
    {"recompute moe.expert_up", KILN_TASK_RECOMPUTE, KILN_STREAM_COMPUTE, 1, 2, 1, 9, 10, NULL, 0,
     0},
};
static kiln_task T1[] = {
    {"attn", KILN_TASK_FORWARD, KILN_STREAM_COMPUTE, 0, 0, 2.5, 0, 2.5, NULL, 0, 0},
    {"mlp.bwd", KILN_TASK_BACKWARD, KILN_STREAM_COMPUTE, 1, 0, 3.5, 2.5, 6, NULL, 0, 0},
    {"allreduce", KILN_TASK_COMM, KILN_STREAM_COMM, 1, 1, 2, 3, 5, NULL, 0, 0},
};
static int32_t S0_LAYERS[] = {0, 1, 2}, S0_TEMPLATES[] = {1, 0, 0};
static int32_t S1_LAYERS[] = {3}, S1_TEMPLATES[] = {0};

static struct kiln_plan_schedule fixture(const char *model, kiln_template out_t[2],
                                         kiln_stage_timeline out_st[2])
{
	out_t[0] = (kiln_template){.stage = 0,
	                           .kind = KILN_LAYER_MOE,
	                           .plan = 3,
	                           .load_factor = 1.5,
	                           .tasks = T0,
	                           .n_tasks = 6,
	                           .makespan_us = 10,
	                           .serial_us = 14,
	                           .base_us = 9};
	out_t[1] = (kiln_template){.stage = 0,
	                           .kind = KILN_LAYER_DENSE,
	                           .plan = 0,
	                           .load_factor = 1.0,
	                           .tasks = T1,
	                           .n_tasks = 3,
	                           .makespan_us = 6,
	                           .serial_us = 6,
	                           .base_us = 6};
	out_st[0] = (kiln_stage_timeline){0, 3, S0_LAYERS, S0_TEMPLATES};
	out_st[1] = (kiln_stage_timeline){1, 1, S1_LAYERS, S1_TEMPLATES};
	return (struct kiln_plan_schedule){model, out_t, 2, out_st, 2};
}

#define FIXTURE(name, model)                                                                       \
	kiln_template name##_t[2];                                                                 \
	kiln_stage_timeline name##_st[2];                                                          \
	struct kiln_plan_schedule name = fixture(model, name##_t, name##_st)

typedef struct text {
	char *buf;
	size_t len;
} text;

static text write_trace(const struct kiln_plan_schedule *s)
{
	text t = {0};
	FILE *f = open_memstream(&t.buf, &t.len);
	cr_assert_not_null(f);
	cr_assert_eq(kiln_trace_write(s, f), 0);
	fclose(f);
	return t;
}

static text write_svg(const struct kiln_plan_schedule *s)
{
	text t = {0};
	FILE *f = open_memstream(&t.buf, &t.len);
	cr_assert_not_null(f);
	cr_assert_eq(kiln_svg_write(s, f), 0);
	fclose(f);
	return t;
}

static kiln_json *parse_trace(const struct kiln_plan_schedule *s)
{
	text t = write_trace(s);
	kiln_json *root = kiln_json_parse(t.buf, t.len);
	cr_assert_not_null(root, "trace is not valid JSON:\n%s", t.buf);
	free(t.buf);
	return root;
}

static bool str_is(const kiln_json *v, const char *s)
{
	const char *got = kiln_json_string(v);
	return got && strcmp(got, s) == 0;
}

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

/* Runs xmllint --noout on text; fails the test when xmllint is absent. */
static void assert_well_formed_xml(const text *t)
{
	cr_assert_eq(system("command -v xmllint >/dev/null 2>&1"), 0,
	             "xmllint not found: install libxml2-utils (scripts/deps.sh lists it)");
	char *path = kt_temp_file(".svg", t->buf, t->len);
	char cmd[256];
	snprintf(cmd, sizeof cmd, "xmllint --noout %s", path);
	int rc = system(cmd);
	unlink(path);
	free(path);
	cr_assert_eq(rc, 0, "xmllint rejects the SVG:\n%s", t->buf);
}

/* ------------------------------------------------------------ trace */

Test(views, trace_is_trace_event_json)
{
	FIXTURE(s, "fixture");
	kiln_json *root = parse_trace(&s);
	cr_assert(str_is(kiln_json_get(root, "displayTimeUnit"), "ms"));
	cr_assert(str_is(kiln_json_get(kiln_json_get(root, "otherData"), "model"), "fixture"));
	const kiln_json *ev = kiln_json_get(root, "traceEvents");
	static const char *const kinds[] = {"forward", "backward", "recompute", "copy",
	                                    "communication"};
	int n_x = 0, n_m = 0;
	for (int i = 0; i < kiln_json_size(ev); i++) {
		const kiln_json *e = kiln_json_at(ev, i);
		const char *ph = kiln_json_string(kiln_json_get(e, "ph"));
		cr_assert_not_null(ph, "event %d has no ph", i);
		cr_assert(kiln_json_is_number(kiln_json_get(e, "pid")), "event %d has no pid", i);
		cr_assert(kiln_json_is_number(kiln_json_get(e, "tid")), "event %d has no tid", i);
		const char *name = kiln_json_string(kiln_json_get(e, "name"));
		cr_assert_not_null(name, "event %d has no name", i);
		if (strcmp(ph, "X") == 0) {
			n_x++;
			cr_assert_geq(kiln_json_number(kiln_json_get(e, "ts")), 0.0);
			cr_assert_geq(kiln_json_number(kiln_json_get(e, "dur")), 0.0);
			const char *cat = kiln_json_string(kiln_json_get(e, "cat"));
			cr_assert_not_null(cat);
			bool known = false;
			for (size_t k = 0; k < 5; k++)
				known = known || strcmp(cat, kinds[k]) == 0;
			cr_assert(known, "unknown category %s", cat);
		} else {
			cr_assert_str_eq(ph, "M");
			n_m++;
			const kiln_json *args = kiln_json_get(e, "args");
			if (strcmp(name, "process_name") == 0 || strcmp(name, "thread_name") == 0)
				cr_assert_not_null(kiln_json_string(kiln_json_get(args, "name")));
			else if (strcmp(name, "process_sort_index") == 0 ||
			         strcmp(name, "thread_sort_index") == 0)
				cr_assert(kiln_json_is_number(kiln_json_get(args, "sort_index")));
			else
				cr_assert_fail("unexpected metadata event %s", name);
		}
	}
	/* Per stage: process_name, process_sort_index, and a name and a sort
	 * index for each of the four streams. Tasks: stage 0 has 3 + 6 + 6,
	 * stage 1 has 6. */
	cr_assert_eq(n_m, 2 * (2 + 2 * 4));
	cr_assert_eq(n_x, 3 + 6 + 6 + 6);
	kiln_json_free(root);
}

static const kiln_json *find_event(const kiln_json *ev, const char *ph, const char *name, int pid,
                                   int tid)
{
	for (int i = 0; i < kiln_json_size(ev); i++) {
		const kiln_json *e = kiln_json_at(ev, i);
		if (str_is(kiln_json_get(e, "ph"), ph) && str_is(kiln_json_get(e, "name"), name) &&
		    kiln_json_number(kiln_json_get(e, "pid")) == pid &&
		    kiln_json_number(kiln_json_get(e, "tid")) == tid)
			return e;
	}
	return NULL;
}

Test(views, trace_names_processes_and_threads)
{
	FIXTURE(s, "fixture");
	kiln_json *root = parse_trace(&s);
	const kiln_json *ev = kiln_json_get(root, "traceEvents");
	static const char *const streams[] = {"compute", "communication", "device-to-host",
	                                      "host-to-device"};
	for (int pid = 0; pid < 2; pid++) {
		char want[32];
		snprintf(want, sizeof want, "stage %d", pid);
		const kiln_json *e = find_event(ev, "M", "process_name", pid, 0);
		cr_assert_not_null(e);
		cr_assert(str_is(kiln_json_get(kiln_json_get(e, "args"), "name"), want));
		e = find_event(ev, "M", "process_sort_index", pid, 0);
		cr_assert_eq(
		    kiln_json_number(kiln_json_get(kiln_json_get(e, "args"), "sort_index")), pid);
		for (int tid = 0; tid < 4; tid++) {
			e = find_event(ev, "M", "thread_name", pid, tid);
			cr_assert_not_null(e, "stage %d stream %d unnamed", pid, tid);
			cr_assert(
			    str_is(kiln_json_get(kiln_json_get(e, "args"), "name"), streams[tid]));
			e = find_event(ev, "M", "thread_sort_index", pid, tid);
			cr_assert_eq(
			    kiln_json_number(kiln_json_get(kiln_json_get(e, "args"), "sort_index")),
			    tid);
		}
	}
	kiln_json_free(root);
}

Test(views, trace_events_equal_hand_timeline)
{
	FIXTURE(s, "fixture");
	kiln_json *root = parse_trace(&s);
	const kiln_json *ev = kiln_json_get(root, "traceEvents");
	/* ts = the layer's offset (sum of earlier makespans on the stage) + start. */
	static const struct {
		const char *name, *cat;
		int pid, tid;
		double ts, dur;
	} want[] = {
	    {"L0 attn mb1", "forward", 0, 0, 0, 2.5},
	    {"L0 mlp.bwd mb0", "backward", 0, 0, 2.5, 3.5},
	    {"L0 allreduce mb0", "communication", 0, 1, 3, 2},
	    {"L1 reload moe.expert_in mb0", "copy", 0, 3, 6 + 0, 3},
	    {"L1 attn mb1", "forward", 0, 0, 6 + 0, 4},
	    {"L1 attn.bwd mb0", "backward", 0, 0, 6 + 4, 5},
	    {"L1 dispatch mb1", "communication", 0, 1, 6 + 4, 2},
	    {"L1 offload moe.expert_in mb1", "copy", 0, 2, 6 + 6, 2},
	    {"L1 recompute moe.expert_up mb0", "recompute", 0, 0, 6 + 9, 1},
	    {"L2 reload moe.expert_in mb0", "copy", 0, 3, 16 + 0, 3},
	    {"L2 attn mb1", "forward", 0, 0, 16 + 0, 4},
	    {"L2 attn.bwd mb0", "backward", 0, 0, 16 + 4, 5},
	    {"L2 dispatch mb1", "communication", 0, 1, 16 + 4, 2},
	    {"L2 offload moe.expert_in mb1", "copy", 0, 2, 16 + 6, 2},
	    {"L2 recompute moe.expert_up mb0", "recompute", 0, 0, 16 + 9, 1},
	    {"L3 reload moe.expert_in mb0", "copy", 1, 3, 0, 3},
	    {"L3 attn mb1", "forward", 1, 0, 0, 4},
	    {"L3 attn.bwd mb0", "backward", 1, 0, 4, 5},
	    {"L3 dispatch mb1", "communication", 1, 1, 4, 2},
	    {"L3 offload moe.expert_in mb1", "copy", 1, 2, 6, 2},
	    {"L3 recompute moe.expert_up mb0", "recompute", 1, 0, 9, 1},
	};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		const kiln_json *e = find_event(ev, "X", want[i].name, want[i].pid, want[i].tid);
		cr_assert_not_null(e, "no event %s on pid %d tid %d", want[i].name, want[i].pid,
		                   want[i].tid);
		cr_assert(str_is(kiln_json_get(e, "cat"), want[i].cat), "%s", want[i].name);
		cr_assert_eq(kiln_json_number(kiln_json_get(e, "ts")), want[i].ts, "%s",
		             want[i].name);
		cr_assert_eq(kiln_json_number(kiln_json_get(e, "dur")), want[i].dur, "%s",
		             want[i].name);
	}
	/* Arguments of one event: the MoE template (id 0, plan 3, load 1.5). */
	const kiln_json *args = kiln_json_get(find_event(ev, "X", "L2 attn.bwd mb0", 0, 0), "args");
	cr_assert_eq(kiln_json_number(kiln_json_get(args, "chain")), 1);
	cr_assert_eq(kiln_json_number(kiln_json_get(args, "template")), 0);
	cr_assert_eq(kiln_json_number(kiln_json_get(args, "plan")), 3);
	cr_assert_eq(kiln_json_number(kiln_json_get(args, "load_factor")), 1.5);
	cr_assert_eq(kiln_json_number(kiln_json_get(args, "layer")), 2);
	args = kiln_json_get(find_event(ev, "X", "L0 attn mb1", 0, 0), "args");
	cr_assert_eq(kiln_json_number(kiln_json_get(args, "template")), 1);
	cr_assert_eq(kiln_json_number(kiln_json_get(args, "chain")), 0);
	kiln_json_free(root);
}

Test(views, trace_times_round_trip)
{
	/* A third of a microsecond has no short decimal form: the printed ts
	 * must still parse back to the very same double. */
	kiln_task task = {"attn",    KILN_TASK_FORWARD, KILN_STREAM_COMPUTE,   0,    0,
	                  1.0 / 3.0, 1.0 / 7.0,         1.0 / 7.0 + 1.0 / 3.0, NULL, 0,
	                  0};
	kiln_template t = {
	    .tasks = &task, .n_tasks = 1, .makespan_us = 0.1 + 0.2, .load_factor = 1.1};
	int32_t layers[] = {5, 6}, ids[] = {0, 0};
	kiln_stage_timeline st = {0, 2, layers, ids};
	struct kiln_plan_schedule s = {"m", &t, 1, &st, 1};
	kiln_json *root = parse_trace(&s);
	const kiln_json *e =
	    find_event(kiln_json_get(root, "traceEvents"), "X", "L6 attn mb1", 0, 0);
	cr_assert_not_null(e);
	double ts = kiln_json_number(kiln_json_get(e, "ts"));
	cr_assert(ts == (0.1 + 0.2) + 1.0 / 7.0, "ts %.17g", ts);
	double dur = kiln_json_number(kiln_json_get(e, "dur"));
	cr_assert(dur == (1.0 / 7.0 + 1.0 / 3.0) - 1.0 / 7.0, "dur %.17g", dur);
	cr_assert(kiln_json_number(kiln_json_get(kiln_json_get(e, "args"), "load_factor")) == 1.1);
	kiln_json_free(root);
}

static const char HOSTILE[] = "<moe & \"friends\"> 'x' \\ </svg> ]]> \x01\t\xff caf\xc3\xa9";

Test(views, trace_keeps_hostile_model_name)
{
	FIXTURE(s, HOSTILE);
	kiln_json *root = parse_trace(&s);
	/* Every byte survives except the one that is not UTF-8: JSON cannot hold
	 * it, so it is written as \u00ff and reads back as U+00FF (c3 bf). */
	static const char READ_BACK[] =
	    "<moe & \"friends\"> 'x' \\ </svg> ]]> \x01\t\xc3\xbf caf\xc3\xa9";
	cr_assert(str_is(kiln_json_get(kiln_json_get(root, "otherData"), "model"), READ_BACK));
	kiln_json_free(root);
}

Test(views, trace_is_deterministic)
{
	FIXTURE(s, "fixture");
	text a = write_trace(&s), b = write_trace(&s);
	cr_assert_eq(a.len, b.len);
	cr_assert_eq(memcmp(a.buf, b.buf, a.len), 0);
	free(a.buf);
	free(b.buf);
}

Test(views, trace_write_failure_returns_minus_one)
{
	FIXTURE(s, "fixture");
	FILE *full = fopen("/dev/full", "w");
	cr_assert_not_null(full, "/dev/full is missing");
	cr_assert_eq(kiln_trace_write(&s, full), -1);
	fclose(full);
}

Test(views, bad_template_id_is_refused)
{
	FIXTURE(s, "fixture");
	int32_t bad[] = {1, 2, 0};
	s.stages[0].template_id = bad;
	FILE *null = fopen("/dev/null", "w");
	cr_assert_not_null(null);
	cr_assert_eq(kiln_trace_write(&s, null), -1);
	cr_assert_eq(kiln_svg_write(&s, null), -1);
	fclose(null);
}

Test(views, svg_refuses_non_finite_times)
{
	FIXTURE(s, "fixture");
	kiln_task t0[6];
	memcpy(t0, T0, sizeof T0);
	t0[2].end_us = INFINITY;
	s_t[0].tasks = t0;
	FILE *null = fopen("/dev/null", "w");
	cr_assert_not_null(null);
	cr_assert_eq(kiln_svg_write(&s, null), -1);
	t0[2].end_us = 9;
	s_t[1].makespan_us = NAN;
	cr_assert_eq(kiln_svg_write(&s, null), -1);
	fclose(null);
}

Test(views, empty_schedule_is_valid)
{
	struct kiln_plan_schedule s = {"empty", NULL, 0, NULL, 0};
	kiln_json *root = parse_trace(&s);
	cr_assert_eq(kiln_json_size(kiln_json_get(root, "traceEvents")), 0);
	kiln_json_free(root);
	text t = write_svg(&s);
	assert_well_formed_xml(&t);
	free(t.buf);
}

/* ------------------------------------------------------------ svg */

Test(views, svg_is_well_formed_with_legend_axis_and_rows)
{
	FIXTURE(s, "fixture");
	text t = write_svg(&s);
	assert_well_formed_xml(&t);
	cr_assert(strncmp(t.buf, "<?xml version=\"1.0\"", 19) == 0);
	cr_assert_not_null(
	    strstr(t.buf, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\""));
	cr_assert_not_null(strstr(t.buf, "width=\"1600\""));
	cr_assert_not_null(strstr(t.buf, ">fixture</text>"), "no title");
	const char *legend = strstr(t.buf, "<g class=\"legend\">");
	cr_assert_not_null(legend);
	static const char *const kinds[] = {">forward<", ">backward<", ">recompute<", ">copy<",
	                                    ">communication<"};
	for (size_t k = 0; k < 5; k++)
		cr_assert_not_null(strstr(legend, kinds[k]), "legend lacks %s", kinds[k]);
	/* The longest stage runs 6 + 10 + 10 us: a microsecond axis. */
	cr_assert_not_null(strstr(t.buf, ">time (us)</text>"));
	cr_assert_eq(count(t.buf, "<g class=\"stage\""), 2);
	cr_assert_not_null(strstr(t.buf, ">stage 0</text>"));
	cr_assert_not_null(strstr(t.buf, ">stage 1</text>"));
	static const char *const lanes[] = {">compute<", ">communication<", ">device-to-host<",
	                                    ">host-to-device<"};
	/* Each lane label once per stage ("communication" is also in the legend). */
	for (size_t l = 0; l < 4; l++)
		cr_assert_eq(count(t.buf, lanes[l]), 2 + (l == 1), "%s", lanes[l]);
	/* Every task is wide enough to draw: 21 rectangles with tooltips. */
	cr_assert_eq(count(t.buf, "</title></rect>"), 21);
	cr_assert_not_null(strstr(t.buf, "<title>L2 recompute moe.expert_up mb0: 1 us</title>"));
	free(t.buf);
}

/* The fixture with every time multiplied by scale. */
static void scale_fixture(kiln_template t[2], double scale, kiln_task *t0, kiln_task *t1)
{
	memcpy(t0, T0, sizeof T0);
	memcpy(t1, T1, sizeof T1);
	for (int i = 0; i < 6; i++)
		t0[i].start_us *= scale, t0[i].end_us *= scale, t0[i].duration_us *= scale;
	for (int i = 0; i < 3; i++)
		t1[i].start_us *= scale, t1[i].end_us *= scale, t1[i].duration_us *= scale;
	t[0].tasks = t0, t[0].makespan_us *= scale;
	t[1].tasks = t1, t[1].makespan_us *= scale;
}

Test(views, svg_axis_unit_follows_span)
{
	static const struct {
		double scale;
		const char *label;
	} cases[] = {{1, ">time (us)<"}, {100, ">time (ms)<"}, {1e5, ">time (s)<"}};
	for (size_t i = 0; i < 3; i++) {
		FIXTURE(s, "fixture");
		kiln_task t0[6], t1[3];
		scale_fixture(s_t, cases[i].scale, t0, t1);
		text t = write_svg(&s);
		cr_assert_not_null(strstr(t.buf, cases[i].label), "scale %g", cases[i].scale);
		free(t.buf);
	}
}

Test(views, svg_ticks_are_round)
{
	/* Span 26 us: a 1-2-5 step near 26 / 8 is 5 us, so ticks 0, 5 .. 25. */
	FIXTURE(s, "fixture");
	text t = write_svg(&s);
	const char *axis = strstr(t.buf, "<g class=\"axis\">");
	cr_assert_not_null(axis);
	static const char *const ticks[] = {">0</text>",  ">5</text>",  ">10</text>",
	                                    ">15</text>", ">20</text>", ">25</text>"};
	for (size_t i = 0; i < 6; i++)
		cr_assert_not_null(strstr(axis, ticks[i]), "no tick %s", ticks[i]);
	cr_assert_null(strstr(axis, ">30</text>"));
	free(t.buf);
}

Test(views, svg_escapes_hostile_model_name)
{
	FIXTURE(s, HOSTILE);
	text t = write_svg(&s);
	assert_well_formed_xml(&t);
	cr_assert_not_null(strstr(t.buf,
	                          "&lt;moe &amp; &quot;friends&quot;&gt; &apos;x&apos; \\ "
	                          "&lt;/svg&gt; ]]&gt; \xef\xbf\xbd\t\xef\xbf\xbd caf\xc3\xa9"));
	cr_assert_null(strstr(t.buf, "<moe"));
	cr_assert_eq(count(t.buf, "</svg>"), 1);
	free(t.buf);
}

Test(views, svg_escapes_hostile_task_names)
{
	FIXTURE(s, "fixture");
	kiln_task t0[6];
	memcpy(t0, T0, sizeof T0);
	t0[1].name = "a<b>&\"c\"";
	s_t[0].tasks = t0;
	text t = write_svg(&s);
	assert_well_formed_xml(&t);
	cr_assert_not_null(
	    strstr(t.buf, "<title>L1 a&lt;b&gt;&amp;&quot;c&quot; mb1: 4 us</title>"));
	free(t.buf);
}

Test(views, svg_is_deterministic)
{
	FIXTURE(s, "fixture");
	text a = write_svg(&s), b = write_svg(&s);
	cr_assert_eq(a.len, b.len);
	cr_assert_eq(memcmp(a.buf, b.buf, a.len), 0);
	free(a.buf);
	free(b.buf);
}

Test(views, svg_write_failure_returns_minus_one)
{
	FIXTURE(s, "fixture");
	FILE *full = fopen("/dev/full", "w");
	cr_assert_not_null(full, "/dev/full is missing");
	cr_assert_eq(kiln_svg_write(&s, full), -1);
	fclose(full);
}

Test(views, svg_of_a_large_schedule_stays_small)
{
	/* 16 stages of 60 layers, each a template of 1000 compute slivers of
	 * 0.01 us side by side and one 100 us backward: 960,960 tasks. A layer
	 * spans 1360 px / 60 = 22.7 px, a sliver 0.002 px: each layer's 1000
	 * slivers merge into one 2 px rectangle beside the backward one. */
	enum { N = 1001, STAGES = 16, LAYERS = 60 };
	kiln_task *tasks = calloc(N, sizeof *tasks);
	cr_assert_not_null(tasks);
	for (int i = 0; i < N - 1; i++)
		tasks[i] = (kiln_task){"expert", KILN_TASK_FORWARD, KILN_STREAM_COMPUTE, 0,    i,
		                       0.01,     i * 0.01,          (i + 1) * 0.01,      NULL, 0,
		                       0};
	tasks[N - 1] = (kiln_task){
	    "experts.bwd", KILN_TASK_BACKWARD, KILN_STREAM_COMPUTE, 1, 0, 100, 10, 110, NULL, 0, 0};
	kiln_template t = {.tasks = tasks, .n_tasks = N, .makespan_us = 110, .load_factor = 1};
	kiln_stage_timeline st[STAGES];
	int32_t layers[STAGES][LAYERS], ids[LAYERS] = {0};
	for (int i = 0; i < STAGES; i++) {
		for (int l = 0; l < LAYERS; l++)
			layers[i][l] = i * LAYERS + l;
		st[i] = (kiln_stage_timeline){i, LAYERS, layers[i], ids};
	}
	struct kiln_plan_schedule s = {"large", &t, 1, st, STAGES};
	text out = write_svg(&s);
	cr_assert_lt(out.len, (size_t)1 << 20, "%zu bytes", out.len);
	cr_assert_eq(count(out.buf, "<title>1000 forward tasks</title></rect>"),
	             (size_t)STAGES * LAYERS);
	cr_assert_eq(count(out.buf, "</title></rect>"), (size_t)STAGES * LAYERS * 2);
	char want[160];
	snprintf(want, sizeof want,
	         "<!-- %d tasks: %d rectangles, %d tasks merged into neighbours, 0 dropped",
	         STAGES * LAYERS * N, STAGES * LAYERS * 2, STAGES * LAYERS * (N - 1));
	cr_assert_not_null(strstr(out.buf, want), "%s", strstr(out.buf, "<!--"));
	assert_well_formed_xml(&out);
	free(out.buf);
	free(tasks);
}

Test(views, svg_merges_touching_slivers_and_drops_lone_ones)
{
	/* On a 1000 us axis (1.36 px per us): 400 forward slivers of 0.25 us
	 * side by side (0.34 px each, 136 px in all) become one rectangle; the
	 * 900 us backward after them stays its own; a lone 0.05 us offload
	 * (0.07 px) is dropped. */
	enum { N = 402 };
	kiln_task tasks[N];
	for (int i = 0; i < 400; i++)
		tasks[i] = (kiln_task){"f",  KILN_TASK_FORWARD, KILN_STREAM_COMPUTE, 0,    i,
		                       0.25, i * 0.25,          (i + 1) * 0.25,      NULL, 0,
		                       0};
	tasks[400] = (kiln_task){
	    "b", KILN_TASK_BACKWARD, KILN_STREAM_COMPUTE, 1, 0, 900, 100, 1000, NULL, 0, 0};
	tasks[401] = (kiln_task){
	    "offload x", KILN_TASK_COPY, KILN_STREAM_D2H, 0, 400, 0.05, 500, 500.05, NULL, 0, 0};
	kiln_template t = {.tasks = tasks, .n_tasks = N, .makespan_us = 1000, .load_factor = 1};
	int32_t layer = 0, id = 0;
	kiln_stage_timeline st = {0, 1, &layer, &id};
	struct kiln_plan_schedule s = {"slivers", &t, 1, &st, 1};
	text out = write_svg(&s);
	cr_assert_not_null(strstr(out.buf, "<title>400 forward tasks</title>"));
	cr_assert_not_null(strstr(out.buf, "<title>L0 b mb0: 0.9 ms</title>"));
	cr_assert_null(strstr(out.buf, "offload x"));
	cr_assert_not_null(
	    strstr(out.buf,
	           "<!-- 402 tasks: 2 rectangles, 400 tasks merged into neighbours, 1 dropped"),
	    "%s", strstr(out.buf, "<!--"));
	free(out.buf);
}

/* ------------------------------------------------------------ golden */

static char *slurp_file(const char *path, size_t *out_len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	cr_assert_not_null(m);
	char chunk[4096];
	size_t n;
	while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
		fwrite(chunk, 1, n, m);
	fclose(f);
	fclose(m);
	*out_len = len;
	return buf;
}

Test(views, golden_tiny_svg)
{
	kiln_arena *a = kiln_arena_new();
	cr_assert_not_null(a);
	kiln_model *m = NULL;
	cr_assert_eq(kiln_frontend_load_file(kt_src("examples/models/tiny.yaml"), a, stderr, &m),
	             0);
	kiln_compilation c = {.model = m, .arena = a, .solver = KILN_SOLVER_DP};
	cr_assert_eq(kiln_pipeline_compile(&c, NULL, NULL, NULL, stderr), 0);
	cr_assert_not_null(c.schedule, "the pipeline produced no schedule (interleave pass)");
	text t = write_svg(c.schedule);
	assert_well_formed_xml(&t);
	const char *golden = kt_src("tests/golden/tiny.svg");
	const char *update = getenv("KILN_UPDATE_GOLDEN");
	if (update && strcmp(update, "1") == 0) {
		FILE *f = fopen(golden, "wb");
		cr_assert_not_null(f, "cannot write %s", golden);
		cr_assert_eq(fwrite(t.buf, 1, t.len, f), t.len);
		cr_assert_eq(fclose(f), 0);
	}
	size_t len = 0;
	char *want = slurp_file(golden, &len);
	cr_assert_not_null(want, "%s is missing: run with KILN_UPDATE_GOLDEN=1", golden);
	cr_assert(len == t.len && memcmp(want, t.buf, len) == 0,
	          "tiny's SVG differs from %s; if the change is intended, review it and rerun "
	          "with KILN_UPDATE_GOLDEN=1",
	          golden);
	free(want);
	free(t.buf);
	kiln_arena_free(a);
}

Test(views, kilnc_emit_svg_and_trace_match_the_writers)
{
	/* kilnc compile --emit-svg writes the same bytes as the golden, and
	 * --emit-trace a trace that parses back. */
	char svg_path[] = "/tmp/kiln-views-XXXXXX", trace_path[] = "/tmp/kiln-views-XXXXXX";
	int fd1 = mkstemp(svg_path), fd2 = mkstemp(trace_path);
	cr_assert(fd1 >= 0 && fd2 >= 0);
	close(fd1);
	close(fd2);
	const char *args[] = {"compile",
	                      kt_src("examples/models/tiny.yaml"),
	                      "--emit-svg",
	                      svg_path,
	                      "--emit-trace",
	                      trace_path,
	                      NULL};
	kt_run r = kt_kilnc(args, NULL);
	cr_assert_eq(r.status, 0, "%s", r.err);
	size_t svg_len = 0, want_len = 0, trace_len = 0;
	char *svg = slurp_file(svg_path, &svg_len);
	char *want = slurp_file(kt_src("tests/golden/tiny.svg"), &want_len);
	char *trace = slurp_file(trace_path, &trace_len);
	cr_assert(svg && want && trace);
	cr_assert(svg_len == want_len && memcmp(svg, want, svg_len) == 0,
	          "kilnc --emit-svg differs from tests/golden/tiny.svg");
	kiln_json *root = kiln_json_parse(trace, trace_len);
	cr_assert_not_null(root);
	cr_assert(str_is(kiln_json_get(kiln_json_get(root, "otherData"), "model"), "tiny"));
	cr_assert_gt(kiln_json_size(kiln_json_get(root, "traceEvents")), 2 * 10);
	kiln_json_free(root);
	free(svg);
	free(want);
	free(trace);
	kt_run_free(&r);
	unlink(svg_path);
	unlink(trace_path);
}
