/* codegen/svg.c: the schedule's stage timelines as an SVG 1.1 picture.
 *
 * For people without a browser (any SVG viewer, rsvg-convert, an editor):
 *
 *   title (model name), a subtitle, a legend of the task kinds
 *   a row per stage: a header band with layer labels, then four lanes, one
 *     per stream (compute, communication, device-to-host, host-to-device),
 *     a rectangle per task coloured by kind, thin lines between layers
 *   a time axis under the rows, ticks at 1-2-5 steps, in us, ms or s by span
 *
 * The width is fixed (WIDTH_PX); the height grows with the stage count.
 * Large schedules stay small: a task narrower than SLIVER_PX merges with
 * the slivers of the same kind that follow it in its lane (gap under
 * MERGE_GAP_PX), and a rectangle still narrower than MIN_PX is dropped; the
 * closing comment counts both. Coordinates are printed with two decimals, so
 * the same schedule gives the same bytes.
 */
#include <math.h>
#include <stdio.h>

#include "codegen/codegen.h"
#include "passes/passes.h"

#define WIDTH_PX 1600
#define PLOT_X0 200.0 /* left edge of the time axis; stage and lane labels sit left of it */
#define PLOT_W 1360.0
#define TOP_PX 88.0    /* first row */
#define HEADER_PX 14.0 /* band above a stage's lanes: layer labels */
#define LANE_PX 16.0
#define ROW_GAP_PX 14.0
#define ROW_PX (HEADER_PX + KILN_STREAM_COUNT * LANE_PX + ROW_GAP_PX)
#define AXIS_PX 56.0 /* below the last row: ticks, tick labels, axis label */

#define SLIVER_PX 1.0
#define MERGE_GAP_PX 0.5
#define MIN_PX 0.2
#define LAYER_LINE_MIN_PX 4.0 /* layers narrower than this get no separator */
#define LAYER_LABEL_MIN_PX 26.0

/* Colours by kiln_task_kind (Tableau 10: distinct, colour-blind tolerant). */
static const char *const KIND_FILL[KILN_TASK_KIND_COUNT] = {
    [KILN_TASK_FORWARD] = "#4e79a7",   [KILN_TASK_BACKWARD] = "#f28e2b",
    [KILN_TASK_RECOMPUTE] = "#e15759", [KILN_TASK_COPY] = "#59a14f",
    [KILN_TASK_COMM] = "#b07aa1",
};

/* Length of the UTF-8 sequence at p when it encodes a character XML 1.0
 * allows, else 0. p is NUL-terminated, so a truncated sequence fails on the
 * NUL before reading past it. */
static int xml_char_len(const unsigned char *p)
{
	unsigned c = p[0];
	if (c < 0x80)
		return (c >= 0x20 || c == '\t' || c == '\n' || c == '\r') ? 1 : 0;
	if (c >= 0xc2 && c <= 0xdf)
		return (p[1] & 0xc0) == 0x80 ? 2 : 0;
	if (c >= 0xe0 && c <= 0xef) {
		unsigned lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
		if (p[1] < lo || p[1] > hi || (p[2] & 0xc0) != 0x80)
			return 0;
		/* U+FFFE and U+FFFF are not XML characters. */
		if (c == 0xef && p[1] == 0xbf && p[2] >= 0xbe)
			return 0;
		return 3;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		unsigned lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
		if (p[1] < lo || p[1] > hi || (p[2] & 0xc0) != 0x80 || (p[3] & 0xc0) != 0x80)
			return 0;
		return 4;
	}
	return 0;
}

/* Writes s as XML character data, safe in text and in quoted attributes;
 * bytes that are not a valid XML character become U+FFFD. */
static void put_text(FILE *out, const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	while (*p) {
		int n = xml_char_len(p);
		switch (n ? *p : 0) {
		case 0:
			fputs("\xef\xbf\xbd", out);
			n = 1;
			break;
		case '&':
			fputs("&amp;", out);
			break;
		case '<':
			fputs("&lt;", out);
			break;
		case '>':
			fputs("&gt;", out);
			break;
		case '"':
			fputs("&quot;", out);
			break;
		case '\'':
			fputs("&apos;", out);
			break;
		default:
			fwrite(p, 1, (size_t)n, out);
			break;
		}
		p += n;
	}
}

typedef struct time_axis {
	const char *unit; /* "us", "ms" or "s" */
	double us_per_unit;
	double step;    /* between ticks, in unit */
	double span_us; /* the plot's full width */
	double px_per_us;
} time_axis;

static time_axis axis_for(double span_us)
{
	/* An empty schedule gets a 1 us axis; below a nanosecond the 1-2-5
	 * step would underflow. */
	time_axis a = {"us", 1.0, 1.0, span_us > 0 ? fmax(span_us, 1e-3) : 1.0, 0};
	if (a.span_us >= 1e6)
		a.unit = "s", a.us_per_unit = 1e6;
	else if (a.span_us >= 1e3)
		a.unit = "ms", a.us_per_unit = 1e3;
	/* About eight ticks at a 1-2-5 step. */
	double raw = a.span_us / a.us_per_unit / 8.0;
	double mag = pow(10.0, floor(log10(raw)));
	double m = raw / mag;
	a.step = (m <= 1.0 ? 1.0 : m <= 2.0 ? 2.0 : m <= 5.0 ? 5.0 : 10.0) * mag;
	a.px_per_us = PLOT_W / a.span_us;
	return a;
}

/* The stage's timeline length: its templates back to back. */
static double stage_span_us(const struct kiln_plan_schedule *s, const kiln_stage_timeline *st)
{
	double offset = 0, end = 0;
	for (int32_t l = 0; l < st->n_layers; l++) {
		const kiln_template *t = &s->templates[st->template_id[l]];
		end = fmax(end, offset + t->makespan_us);
		for (int32_t k = 0; k < t->n_tasks; k++)
			end = fmax(end, offset + t->tasks[k].end_us);
		offset += t->makespan_us;
	}
	return end;
}

/* Whether every time a picture would place is finite. */
static bool finite_times(const struct kiln_plan_schedule *s)
{
	for (int32_t i = 0; i < s->n_templates; i++) {
		const kiln_template *t = &s->templates[i];
		if (!isfinite(t->makespan_us))
			return false;
		for (int32_t k = 0; k < t->n_tasks; k++)
			if (!isfinite(t->tasks[k].start_us) || !isfinite(t->tasks[k].end_us))
				return false;
	}
	return true;
}

static void put_header(FILE *out, const struct kiln_plan_schedule *s, double height,
                       const time_axis *ax)
{
	int32_t n_tasks = 0;
	for (int32_t i = 0; i < s->n_stages; i++)
		for (int32_t l = 0; l < s->stages[i].n_layers; l++)
			n_tasks += s->templates[s->stages[i].template_id[l]].n_tasks;
	fprintf(out,
	        "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
	        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
	        "height=\"%.0f\" viewBox=\"0 0 %d %.0f\" font-family=\"DejaVu Sans, Helvetica, "
	        "Arial, sans-serif\" font-size=\"11\">\n",
	        WIDTH_PX, height, WIDTH_PX, height);
	fputs("<title>", out);
	put_text(out, s->model);
	fputs(": steady-state schedule</title>\n", out);
	fprintf(out, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%.0f\" fill=\"#ffffff\"/>\n",
	        WIDTH_PX, height);
	fputs("<text x=\"10\" y=\"26\" font-size=\"18\" font-weight=\"bold\">", out);
	put_text(out, s->model);
	fputs("</text>\n", out);
	fprintf(out,
	        "<text x=\"10\" y=\"46\" fill=\"#555555\">Steady-state 1F1B schedule: %d stage%s, "
	        "%d task%s; each stage runs its layers back to back, forward of micro-batch 1 "
	        "beside backward of micro-batch 0; span %.4g %s</text>\n",
	        (int)s->n_stages, s->n_stages == 1 ? "" : "s", (int)n_tasks,
	        n_tasks == 1 ? "" : "s", ax->span_us / ax->us_per_unit, ax->unit);
	fputs("<g class=\"legend\">\n", out);
	double x = 10;
	for (int k = 0; k < KILN_TASK_KIND_COUNT; k++) {
		fprintf(out,
		        "<rect x=\"%.0f\" y=\"58\" width=\"12\" height=\"12\" fill=\"%s\"/>"
		        "<text x=\"%.0f\" y=\"68\">",
		        x, KIND_FILL[k], x + 16);
		put_text(out, kiln_view_kind_name(k));
		fputs("</text>\n", out);
		x += 130;
	}
	fputs("</g>\n", out);
}

/* Stage label, lane backgrounds and lane labels of every row. */
static void put_rows(FILE *out, const struct kiln_plan_schedule *s)
{
	for (int32_t i = 0; i < s->n_stages; i++) {
		const kiln_stage_timeline *st = &s->stages[i];
		double y0 = TOP_PX + i * ROW_PX, lanes_y = y0 + HEADER_PX;
		fprintf(out, "<g class=\"stage\" id=\"stage-%d\">\n", (int)st->stage);
		fprintf(out,
		        "<text x=\"10\" y=\"%.0f\" font-size=\"13\" font-weight=\"bold\">stage "
		        "%d</text>\n"
		        "<text x=\"10\" y=\"%.0f\" font-size=\"10\" fill=\"#555555\">%d "
		        "layer%s</text>\n",
		        lanes_y + 2 * LANE_PX - 2, (int)st->stage, lanes_y + 3 * LANE_PX - 2,
		        (int)st->n_layers, st->n_layers == 1 ? "" : "s");
		for (int l = 0; l < KILN_STREAM_COUNT; l++) {
			double y = lanes_y + l * LANE_PX;
			fprintf(out,
			        "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" "
			        "fill=\"%s\"/>"
			        "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" fill=\"#444444\" "
			        "text-anchor=\"end\">",
			        PLOT_X0, y, PLOT_W, LANE_PX, l % 2 ? "#ebebeb" : "#f5f5f5",
			        PLOT_X0 - 6, y + LANE_PX - 4);
			put_text(out, kiln_view_stream_name(l));
			fputs("</text>\n", out);
		}
		fputs("</g>\n", out);
	}
}

/* Vertical grid lines, the axis line, ticks, tick labels and the axis label. */
static void put_axis(FILE *out, const struct kiln_plan_schedule *s, const time_axis *ax)
{
	double top = TOP_PX, y = TOP_PX + s->n_stages * ROW_PX;
	double span_u = ax->span_us / ax->us_per_unit;
	fputs("<g class=\"axis\">\n", out);
	fprintf(out,
	        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#333333\" "
	        "stroke-width=\"1\"/>\n",
	        PLOT_X0, y, PLOT_X0 + PLOT_W, y);
	/* Ticks are i * step, never a running sum, so labels stay round. */
	for (int i = 0; i * ax->step <= span_u * (1 + 1e-9) && i <= 20; i++) {
		double v = i * ax->step;
		double x = PLOT_X0 + v * ax->us_per_unit * ax->px_per_us;
		fprintf(out,
		        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#d0d0d0\" "
		        "stroke-width=\"0.5\"/>"
		        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#333333\"/>"
		        "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%g</text>\n",
		        x, top, x, y, x, y, x, y + 5, x, y + 18, v);
	}
	fprintf(out,
	        "<text x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\" font-size=\"12\">time "
	        "(%s)</text>\n",
	        PLOT_X0 + PLOT_W / 2, y + 38, ax->unit);
	fputs("</g>\n", out);
}

typedef struct svg_counts {
	long tasks, rects, merged, dropped;
} svg_counts;

/* A rectangle being grown from slivers. */
typedef struct pending {
	double x0, x1;
	kiln_task_kind kind;
	long n;                /* tasks in it; 0: none pending */
	bool sliver;           /* it began as a sliver, so more slivers may join */
	const kiln_task *task; /* the first, for the tooltip */
	int32_t layer;
} pending;

static void flush(FILE *out, pending *p, double y, svg_counts *cnt, const time_axis *ax)
{
	if (p->n == 0)
		return;
	double w = p->x1 - p->x0;
	if (w < MIN_PX) {
		cnt->dropped += p->n;
	} else {
		/* A hairline of background between touching wide rectangles keeps
		 * neighbours of one kind apart. */
		fprintf(out,
		        "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\"%s>",
		        p->x0, y + 2, w, LANE_PX - 4,
		        (unsigned)p->kind < KILN_TASK_KIND_COUNT ? KIND_FILL[p->kind] : "#999999",
		        w >= 3 ? " stroke=\"#ffffff\" stroke-width=\"0.5\"" : "");
		if (p->n == 1) {
			const kiln_task *k = p->task;
			fprintf(out, "<title>L%d ", (int)p->layer);
			put_text(out, k->name);
			fprintf(out, " mb%d: %.4g %s</title>", k->chain == 0 ? 1 : 0,
			        (k->end_us - k->start_us) / ax->us_per_unit, ax->unit);
		} else {
			fprintf(out, "<title>%d ", (int)p->n);
			put_text(out, kiln_view_kind_name((int)p->kind));
			fputs(" tasks</title>", out);
			cnt->merged += p->n;
		}
		fputs("</rect>\n", out);
		cnt->rects++;
	}
	p->n = 0;
}

/* Layer separators and labels, then the tasks of every lane of one stage. */
static void put_stage_tasks(FILE *out, const struct kiln_plan_schedule *s, int32_t i,
                            const time_axis *ax, svg_counts *cnt)
{
	const kiln_stage_timeline *st = &s->stages[i];
	double y0 = TOP_PX + i * ROW_PX, lanes_y = y0 + HEADER_PX;
	double offset = 0;
	for (int32_t l = 0; l < st->n_layers; l++) {
		const kiln_template *t = &s->templates[st->template_id[l]];
		double x = PLOT_X0 + offset * ax->px_per_us, w = t->makespan_us * ax->px_per_us;
		if (l > 0 && w >= LAYER_LINE_MIN_PX)
			fprintf(out,
			        "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" "
			        "stroke=\"#999999\" "
			        "stroke-width=\"0.5\"/>\n",
			        x, y0 + 2, x, lanes_y + KILN_STREAM_COUNT * LANE_PX);
		if (w >= LAYER_LABEL_MIN_PX)
			fprintf(out,
			        "<text x=\"%.2f\" y=\"%.2f\" font-size=\"9\" "
			        "fill=\"#555555\">L%d</text>\n",
			        x + 2, lanes_y - 3, (int)st->layer[l]);
		offset += t->makespan_us;
	}
	for (int lane = 0; lane < KILN_STREAM_COUNT; lane++) {
		double y = lanes_y + lane * LANE_PX;
		pending p = {0};
		offset = 0;
		for (int32_t l = 0; l < st->n_layers; l++) {
			const kiln_template *t = &s->templates[st->template_id[l]];
			for (int32_t k = 0; k < t->n_tasks; k++) {
				const kiln_task *task = &t->tasks[k];
				if ((int)task->stream != lane)
					continue;
				cnt->tasks++;
				double x0 = PLOT_X0 + (offset + task->start_us) * ax->px_per_us;
				double x1 =
				    PLOT_X0 +
				    (offset + fmax(task->start_us, task->end_us)) * ax->px_per_us;
				bool sliver = x1 - x0 < SLIVER_PX;
				if (p.n > 0 && p.sliver && sliver && p.kind == task->kind &&
				    x0 - p.x1 < MERGE_GAP_PX) {
					p.x1 = fmax(p.x1, x1);
					p.n++;
					continue;
				}
				flush(out, &p, y, cnt, ax);
				p = (pending){x0, x1, task->kind, 1, sliver, task, st->layer[l]};
			}
			offset += t->makespan_us;
		}
		flush(out, &p, y, cnt, ax);
	}
}

int kiln_svg_write(const struct kiln_plan_schedule *s, FILE *out)
{
	double span_us = 0;
	for (int32_t i = 0; i < s->n_stages; i++) {
		const kiln_stage_timeline *st = &s->stages[i];
		for (int32_t l = 0; l < st->n_layers; l++)
			if (st->template_id[l] < 0 || st->template_id[l] >= s->n_templates)
				return -1;
	}
	if (!finite_times(s))
		return -1;
	for (int32_t i = 0; i < s->n_stages; i++)
		span_us = fmax(span_us, stage_span_us(s, &s->stages[i]));
	time_axis ax = axis_for(span_us);
	double height = TOP_PX + s->n_stages * ROW_PX + AXIS_PX;

	put_header(out, s, height, &ax);
	put_rows(out, s);
	put_axis(out, s, &ax);
	svg_counts cnt = {0};
	fputs("<g class=\"tasks\">\n", out);
	for (int32_t i = 0; i < s->n_stages; i++)
		put_stage_tasks(out, s, i, &ax, &cnt);
	fputs("</g>\n", out);
	fprintf(out,
	        "<!-- %ld tasks: %ld rectangles, %ld tasks merged into neighbours, %ld dropped "
	        "(narrower than %.1f px) -->\n</svg>\n",
	        cnt.tasks, cnt.rects, cnt.merged, cnt.dropped, MIN_PX);
	/* Buffered bytes fail only when flushed (a full disk, /dev/full). */
	return fflush(out) != 0 || ferror(out) ? -1 : 0;
}
