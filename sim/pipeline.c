/* sim/pipeline.c: pipeline timing of one iteration (DESIGN.md section 9).
 *
 * Each stage runs its ops one at a time in a fixed order (Megatron's 1F1B
 * or interleaved 1F1B, kiln_pipe_order); an op starts when its stage is free
 * and the ops it needs have finished, plus p2p_us when they ran on another
 * stage. The times follow by list scheduling over a work list of stages:
 * a stage runs its next ops for as long as their inputs are there, then the
 * stages it feeds get another look. The list running dry while ops remain
 * means the order deadlocks. docs/simulator.md, "Pipeline timing", has the rules and the
 * hand-checked cases.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "sim/sim.h"

#define REPORT(...)                                                                                \
	do {                                                                                       \
		if (err)                                                                           \
			fprintf(err, __VA_ARGS__);                                                 \
	} while (0)

/* Ops of one stage and in all: 2 * v * m and 2 * p * v * m; checked to fit
 * int32 by check_work. */
static int32_t stage_ops(const kiln_pipe_work *w)
{
	return 2 * w->v * w->m;
}

/* Index of a duration, an activation size or (with dir) an op's key. */
static int64_t chunk_index(const kiln_pipe_work *w, int32_t s, int32_t c, int32_t i)
{
	return ((int64_t)s * w->v + c) * w->m + i;
}

static int check_durations(const kiln_pipe_work *w, const double *d, const char *name, FILE *err)
{
	if (!d) {
		REPORT("pipeline: no durations (%s is NULL)\n", name);
		return -1;
	}
	for (int32_t s = 0; s < w->p; s++)
		for (int32_t c = 0; c < w->v; c++)
			for (int32_t i = 0; i < w->m; i++) {
				double x = d[chunk_index(w, s, c, i)];
				if (isfinite(x) && x >= 0)
					continue;
				REPORT("pipeline: %s[%lld] (stage %d, chunk %d, micro-batch %d) "
				       "is %g; durations must be finite and >= 0\n",
				       name, (long long)chunk_index(w, s, c, i), s, c, i, x);
				return -1;
			}
	return 0;
}

/* 0 when w describes a schedule this file can time, else -1 with a message. */
static int check_work(const kiln_pipe_work *w, FILE *err)
{
	if (!w) {
		REPORT("pipeline: no work\n");
		return -1;
	}
	if (w->kind != KILN_PIPE_1F1B && w->kind != KILN_PIPE_INTERLEAVED) {
		REPORT("pipeline: unknown schedule kind %d\n", (int)w->kind);
		return -1;
	}
	if (w->p < 1 || w->m < 1 || w->v < 1) {
		REPORT("pipeline: p (%d), m (%d) and v (%d) must be at least 1\n", w->p, w->m,
		       w->v);
		return -1;
	}
	if (w->kind == KILN_PIPE_1F1B && w->v != 1) {
		REPORT("pipeline: the 1f1b schedule needs v = 1, got v (%d)\n", w->v);
		return -1;
	}
	if (w->kind == KILN_PIPE_INTERLEAVED && w->m % w->p != 0) {
		REPORT("pipeline: the interleaved schedule needs m (%d) to be a multiple of p "
		       "(%d)\n",
		       w->m, w->p);
		return -1;
	}
	int64_t pv = (int64_t)w->p * w->v;
	if (pv > INT32_MAX || 2 * pv * w->m > INT32_MAX) {
		REPORT("pipeline: 2 * p * v * m ops (p %d, v %d, m %d) exceed the limit of %d\n",
		       w->p, w->v, w->m, INT32_MAX);
		return -1;
	}
	if (check_durations(w, w->fwd_us, "fwd_us", err) ||
	    check_durations(w, w->bwd_us, "bwd_us", err))
		return -1;
	if (!(isfinite(w->p2p_us) && w->p2p_us >= 0)) {
		REPORT("pipeline: p2p_us is %g; it must be finite and >= 0\n", w->p2p_us);
		return -1;
	}
	return 0;
}

int32_t kiln_pipe_warmup(const kiln_pipe_work *w, int32_t s)
{
	int64_t n = (int64_t)w->m * w->v, warm;
	if (w->kind == KILN_PIPE_INTERLEAVED)
		warm = 2 * ((int64_t)w->p - s - 1) + ((int64_t)w->v - 1) * w->p;
	else
		warm = (int64_t)w->p - s - 1;
	/* With EP overlap Megatron schedules one forward more before the
	 * steady state, so that the forward and the backward of every combined
	 * step belong to different micro-batches (schedules.py lines 966-970,
	 * get_pp_rank_microbatches, at d98e8a64; with p = 1,
	 * combined_1f1b_schedule_for_no_pipelining runs the first forward
	 * alone, combined_1f1b.py lines 76-135). */
	if (w->pair_us)
		warm++;
	return (int32_t)(warm < n ? warm : n);
}

/* The k-th forward (or backward) of a stage in Megatron's order: micro-batches
 * go in groups of p, each group through chunk 0, 1, ..., v - 1 (backwards
 * through v - 1, ..., 0). With v = 1 this is micro-batch k. */
static kiln_pipe_op nth_op(const kiln_pipe_work *w, int32_t s, int64_t k, int backward)
{
	int64_t group = (int64_t)w->p * w->v;
	int32_t c = (int32_t)(k % group / w->p);
	kiln_pipe_op op = {
	    .stage = s,
	    .chunk = backward ? w->v - 1 - c : c,
	    .microbatch = (int32_t)(k / group * w->p + k % w->p),
	    .backward = backward,
	};
	return op;
}

void kiln_pipe_order(const kiln_pipe_work *w, kiln_pipe_op *ops)
{
	int64_t n = (int64_t)w->m * w->v;
	for (int32_t s = 0; s < w->p; s++) {
		kiln_pipe_op *o = ops + (int64_t)s * stage_ops(w);
		int64_t warm = kiln_pipe_warmup(w, s), j = 0;
		for (int64_t k = 0; k < warm; k++)
			o[j++] = nth_op(w, s, k, 0);
		for (int64_t k = 0; k < n - warm; k++) {
			o[j++] = nth_op(w, s, warm + k, 0);
			o[j++] = nth_op(w, s, k, 1);
		}
		for (int64_t k = n - warm; k < n; k++)
			o[j++] = nth_op(w, s, k, 1);
	}
}

/* What an op waits for besides its stage: at most two earlier ops. */
typedef struct dep {
	int32_t stage, chunk, microbatch;
	int backward;
} dep;

/* The inputs of op on virtual stage c * p + s: a forward needs the forward of
 * the virtual stage before it; a backward needs its own forward and the
 * backward of the virtual stage after it (the last one only its forward). */
static int op_deps(const kiln_pipe_work *w, const kiln_pipe_op *op, dep out[2])
{
	int32_t s = op->stage, c = op->chunk, i = op->microbatch;
	int n = 0;
	if (!op->backward) {
		if (s > 0)
			out[n++] = (dep){s - 1, c, i, 0};
		else if (c > 0)
			out[n++] = (dep){w->p - 1, c - 1, i, 0};
		return n;
	}
	out[n++] = (dep){s, c, i, 0};
	if (s < w->p - 1)
		out[n++] = (dep){s + 1, c, i, 1};
	else if (c < w->v - 1)
		out[n++] = (dep){0, c + 1, i, 1};
	return n;
}

static int64_t op_key(const kiln_pipe_work *w, int32_t s, int32_t c, int32_t i, int backward)
{
	return (backward ? (int64_t)w->p * w->v * w->m : 0) + chunk_index(w, s, c, i);
}

static const char *dir_name(int backward)
{
	return backward ? "backward" : "forward";
}

/* A stage while it is being timed. */
typedef struct lane {
	int32_t next;   /* its first op not yet timed */
	int32_t queued; /* on the work list */
	double free_us; /* when its last timed op ends */
} lane;

static double op_duration(const kiln_pipe_work *w, const kiln_pipe_op *op)
{
	const double *d = op->backward ? w->bwd_us : w->fwd_us;
	return d[chunk_index(w, op->stage, op->chunk, op->microbatch)];
}

/* Whether op o[k] of stage s's order (per ops) is a forward that runs with
 * o[k + 1] as one combined step (kiln_pipe_work.pair_us): the steady
 * state's pairs only, at warm + 2j for j < n - warm (build_order). A stage
 * whose warm-up takes every forward has none: its last warm-up forward and
 * first backward are adjacent but not a step (pairing them would wait on
 * the next stage's step, which waits on that forward: a deadlock). */
static int combined(const kiln_pipe_work *w, int32_t s, const kiln_pipe_op *o, int32_t k,
                    int32_t per)
{
	if (!w->pair_us)
		return 0;
	int64_t warm = kiln_pipe_warmup(w, s), n = (int64_t)w->m * w->v;
	if (k < warm || (k - warm) % 2 != 0 || k >= warm + 2 * (n - warm))
		return 0;
	return k + 1 < per && !o[k].backward && o[k + 1].backward &&
	       (o[k].chunk != o[k + 1].chunk || o[k].microbatch != o[k + 1].microbatch);
}

/* Times stage s's next ops for as long as their inputs are there; returns
 * how many it timed. */
static int32_t advance(const kiln_pipe_work *w, kiln_pipe_op *ops, const int32_t *pos, lane *ln,
                       int32_t s, int *bad, FILE *err)
{
	int32_t per = stage_ops(w), ran = 0;
	kiln_pipe_op *o = ops + (int64_t)s * per;
	while (ln[s].next < per) {
		int32_t k0 = ln[s].next, n_ops = combined(w, s, o, k0, per) ? 2 : 1;
		double start = ln[s].free_us;
		for (int32_t x = 0; x < n_ops; x++) {
			dep d[2];
			int nd = op_deps(w, &o[k0 + x], d);
			for (int k = 0; k < nd; k++) {
				int32_t at = pos[op_key(w, d[k].stage, d[k].chunk, d[k].microbatch,
				                        d[k].backward)];
				if (at >= ln[d[k].stage].next)
					return ran;
				double in_us = ops[(int64_t)d[k].stage * per + at].end_us +
				               (d[k].stage != s ? w->p2p_us : 0);
				if (in_us > start)
					start = in_us;
			}
		}
		double dur = op_duration(w, &o[k0]);
		if (n_ops == 2) {
			dur = w->pair_us(w->pair_ctx, &o[k0], &o[k0 + 1]);
			if (!(isfinite(dur) && dur >= 0)) {
				REPORT(
				    "pipeline: the combined step of stage %d (forward of chunk %d, "
				    "micro-batch %d; backward of chunk %d, micro-batch %d) takes "
				    "%g us; durations must be finite and >= 0\n",
				    s, o[k0].chunk, o[k0].microbatch, o[k0 + 1].chunk,
				    o[k0 + 1].microbatch, dur);
				*bad = 1;
				return ran;
			}
		}
		for (int32_t x = 0; x < n_ops; x++) {
			o[k0 + x].start_us = start;
			o[k0 + x].end_us = start + dur;
		}
		ln[s].free_us = start + dur;
		ln[s].next += n_ops;
		ran += n_ops;
	}
	return ran;
}

/* Times a checked order; pos maps an op's key to its place in its stage.
 * A work list of stages: a stage that ran ops may have unblocked the stages
 * its ops feed (its neighbours, and across the wrap between the last stage
 * and the first when v > 1), so those are (re)visited. Every visit either
 * times an op or is one of at most four per visit that did, so the whole is
 * O(ops). The list running dry with ops left is a deadlock. */
static int time_ops(const kiln_pipe_work *w, kiln_pipe_op *ops, const int32_t *pos, lane *ln,
                    int32_t *queue, FILE *err)
{
	int32_t p = w->p, per = stage_ops(w), head = 0, len = p;
	int64_t remaining = (int64_t)p * per;
	for (int32_t s = 0; s < p; s++) {
		queue[s] = s;
		ln[s].queued = 1;
	}
	while (len > 0) {
		int32_t s = queue[head];
		head = (head + 1) % p;
		len--;
		ln[s].queued = 0;
		int bad = 0;
		int32_t ran = advance(w, ops, pos, ln, s, &bad, err);
		if (bad)
			return -1;
		if (ran == 0)
			continue;
		remaining -= ran;
		int32_t wake[4] = {s - 1, s + 1, 0, p - 1};
		for (int k = 0; k < 4; k++) {
			int32_t t = wake[k];
			if (t < 0 || t >= p || t == s || ln[t].queued || ln[t].next == per)
				continue;
			ln[t].queued = 1;
			queue[(head + len) % p] = t;
			len++;
		}
	}
	if (remaining == 0)
		return 0;
	for (int32_t s = 0; s < p; s++) {
		if (ln[s].next == per)
			continue;
		const kiln_pipe_op *op = &ops[(int64_t)s * per + ln[s].next];
		REPORT("pipeline: the order deadlocks: stage %d cannot start the %s of chunk %d, "
		       "micro-batch %d (op %d of its order)\n",
		       s, dir_name(op->backward), op->chunk, op->microbatch, ln[s].next);
		break;
	}
	return -1;
}

int kiln_pipe_run(const kiln_pipe_work *w, kiln_pipe_op *ops, kiln_arena *a, FILE *err,
                  kiln_pipe_result *out)
{
	if (check_work(w, err))
		return -1;
	if (!ops || !a || !out) {
		REPORT("pipeline: no ops, arena or result\n");
		return -1;
	}
	int32_t p = w->p, per = stage_ops(w);
	int64_t total = (int64_t)p * per;
	int32_t *pos = malloc((size_t)total * sizeof *pos);
	lane *ln = calloc((size_t)p, sizeof *ln);
	int32_t *queue = malloc((size_t)p * sizeof *queue);
	double *busy = kiln_arena_alloc(a, (size_t)p * sizeof *busy);
	int32_t *peak = kiln_arena_alloc(a, (size_t)p * sizeof *peak);
	int rc = -1;
	if (!pos || !ln || !queue || !busy || !peak) {
		REPORT("pipeline: out of memory\n");
		goto done;
	}
	for (int64_t k = 0; k < total; k++)
		pos[k] = -1;
	for (int32_t s = 0; s < p; s++)
		for (int32_t k = 0; k < per; k++) {
			const kiln_pipe_op *op = &ops[(int64_t)s * per + k];
			if (op->stage != s || op->chunk < 0 || op->chunk >= w->v ||
			    op->microbatch < 0 || op->microbatch >= w->m ||
			    (op->backward != 0 && op->backward != 1)) {
				REPORT("pipeline: op %d of stage %d is out of range (stage %d, "
				       "chunk %d, micro-batch %d, backward %d)\n",
				       k, s, op->stage, op->chunk, op->microbatch, op->backward);
				goto done;
			}
			int64_t key = op_key(w, s, op->chunk, op->microbatch, op->backward);
			if (pos[key] >= 0) {
				REPORT("pipeline: stage %d runs the %s of chunk %d, micro-batch %d "
				       "twice (ops %d and %d)\n",
				       s, dir_name(op->backward), op->chunk, op->microbatch,
				       pos[key], k);
				goto done;
			}
			pos[key] = k;
		}
	if (time_ops(w, ops, pos, ln, queue, err))
		goto done;
	out->ops = ops;
	out->busy_us = busy;
	out->peak_inflight = peak;
	out->makespan_us = 0;
	for (int32_t s = 0; s < p; s++) {
		const kiln_pipe_op *o = ops + (int64_t)s * per;
		int32_t held = 0;
		busy[s] = 0;
		peak[s] = 0;
		/* A stage's ops do not overlap (a combined step's forward takes
		 * before its backward releases, both held during the step), so
		 * walking them in order visits the takes and releases in time
		 * order, a release at t before a take at t. */
		for (int32_t k = 0; k < per; k++) {
			/* A combined step counts once. */
			if (combined(w, s, o, k, per))
				busy[s] += o[k].end_us - o[k].start_us;
			else if (!(k > 0 && combined(w, s, o, k - 1, per)))
				busy[s] += op_duration(w, &o[k]);
			held += o[k].backward ? -1 : 1;
			if (held > peak[s])
				peak[s] = held;
		}
		if (o[per - 1].end_us > out->makespan_us)
			out->makespan_us = o[per - 1].end_us;
	}
	rc = 0;
done:
	free(pos);
	free(ln);
	free(queue);
	return rc;
}

int kiln_pipe_simulate(const kiln_pipe_work *w, kiln_arena *a, FILE *err, kiln_pipe_result *out)
{
	if (check_work(w, err))
		return -1;
	if (!a || !out) {
		REPORT("pipeline: no arena or result\n");
		return -1;
	}
	int64_t total = (int64_t)w->p * stage_ops(w);
	kiln_pipe_op *ops = kiln_arena_alloc(a, (size_t)total * sizeof *ops);
	if (!ops) {
		REPORT("pipeline: out of memory\n");
		return -1;
	}
	kiln_pipe_order(w, ops);
	return kiln_pipe_run(w, ops, a, err, out);
}

double kiln_pipe_peak_bytes(const kiln_pipe_work *w, const kiln_pipe_result *r, int32_t s,
                            const double *bytes, double base_bytes)
{
	if (!w || !r || !r->ops || !bytes || s < 0 || s >= w->p || w->v < 1 || w->m < 1)
		return -1;
	int32_t per = stage_ops(w);
	const kiln_pipe_op *o = r->ops + (int64_t)s * per;
	double held = 0, peak = 0;
	/* In stage order the events come in time order (see kiln_pipe_run). */
	for (int32_t k = 0; k < per; k++) {
		double b = bytes[chunk_index(w, s, o[k].chunk, o[k].microbatch)];
		held += o[k].backward ? -b : b;
		if (held > peak)
			peak = held;
	}
	return base_bytes + peak;
}
