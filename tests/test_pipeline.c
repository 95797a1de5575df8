/* tests/test_pipeline.c: sim/pipeline.c, pipeline timing of one iteration.
 *
 * Every expected time below is worked out by hand in the comment above its
 * test (or follows from a closed form derived there), never the simulator's
 * output pasted back. Notation: F_s(i) and B_s(i) are the forward and the
 * backward of micro-batch i on stage s; with chunks, F_s(c,i). An op starts
 * at the later of "its stage is free" and "its inputs arrived" (the end of
 * the op it needs, plus p2p_us when that ran on another stage).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/sim.h"

#define EPS 1e-9
#define MAX_CHUNKS 256

/* Durations per (stage, chunk, micro-batch) that depend on the stage only. */
typedef struct fixture {
	double fwd[MAX_CHUNKS], bwd[MAX_CHUNKS];
	kiln_pipe_work w;
} fixture;

static void fixture_init(fixture *fx, kiln_pipe_kind kind, int32_t p, int32_t m, int32_t v,
                         const double *f_stage, const double *b_stage, double p2p_us)
{
	cr_assert(p * v * m <= MAX_CHUNKS);
	for (int32_t s = 0; s < p; s++)
		for (int32_t k = 0; k < v * m; k++) {
			fx->fwd[s * v * m + k] = f_stage[s];
			fx->bwd[s * v * m + k] = b_stage[s];
		}
	fx->w = (kiln_pipe_work){.kind = kind,
	                         .p = p,
	                         .m = m,
	                         .v = v,
	                         .fwd_us = fx->fwd,
	                         .bwd_us = fx->bwd,
	                         .p2p_us = p2p_us};
}

static void fixture_uniform(fixture *fx, kiln_pipe_kind kind, int32_t p, int32_t m, int32_t v,
                            double f, double b, double p2p_us)
{
	double fs[64], bs[64];
	for (int32_t s = 0; s < p; s++) {
		fs[s] = f;
		bs[s] = b;
	}
	fixture_init(fx, kind, p, m, v, fs, bs, p2p_us);
}

static kiln_pipe_result simulate_ok(const kiln_pipe_work *w, kiln_arena *a)
{
	kiln_pipe_result r;
	memset(&r, 0, sizeof r);
	int rc = kiln_pipe_simulate(w, a, stderr, &r);
	cr_assert_eq(rc, 0);
	cr_assert_not_null(r.ops);
	return r;
}

/* One expected op: chunk, micro-batch, backward, start, end. */
typedef struct want_op {
	int32_t c, i;
	int bwd;
	double start, end;
} want_op;

/* Compares stage s's ops, in order, with want (2 * v * m of them). */
static void expect_stage(const kiln_pipe_work *w, const kiln_pipe_result *r, int32_t s,
                         const want_op *want)
{
	int32_t per = 2 * w->v * w->m;
	for (int32_t k = 0; k < per; k++) {
		const kiln_pipe_op *o = &r->ops[s * per + k];
		const want_op *e = &want[k];
		cr_expect_eq(o->stage, s);
		cr_expect(o->chunk == e->c && o->microbatch == e->i && o->backward == e->bwd,
		          "stage %d op %d: got %s(%d,%d), want %s(%d,%d)", s, k,
		          o->backward ? "B" : "F", o->chunk, o->microbatch, e->bwd ? "B" : "F",
		          e->c, e->i);
		cr_expect_float_eq(o->start_us, e->start, EPS, "stage %d op %d start %g, want %g",
		                   s, k, o->start_us, e->start);
		cr_expect_float_eq(o->end_us, e->end, EPS, "stage %d op %d end %g, want %g", s, k,
		                   o->end_us, e->end);
	}
}

/* ------------------------------------------------------------ 1F1B, uniform */

/* Uniform 1F1B (every forward f, every backward b, p2p 0), closed forms.
 * Stage s runs W = p - s - 1 warm-up forwards F_s(0..W-1), then the pairs
 * F_s(W+k), B_s(k) for k = 0..m-W-1, then B_s(m-W..m-1).
 *
 * Claim: B_s(i) ends at E(s, i) = p*f + (p - s)*b + i*(f + b).
 *  - The pipeline fills: F_s(i) for i <= W starts at (s + i)*f (stage s is
 *    busy with its earlier forwards, its input arrived at (s + i)*f). So the
 *    last stage's F(0) ends at p*f and B_{p-1}(0) ends at p*f + b = E(p-1, 0).
 *  - On the last stage, F(i) for i >= 1 arrives from stage p-2, where it is
 *    the forward paired with B_{p-2}(i-2) (or a fill forward for i = 1), so it
 *    ends at E(p-2, i-2) + f = E(p-1, i-1) (for i = 1: p*f <= E(p-1, 0)):
 *    exactly when B_{p-1}(i-1) ends. The last stage never idles, and
 *    B_{p-1}(i) ends at E(p-1, i-1) + f + b = E(p-1, i).
 *  - On stage s < p-1, B_s(i) waits for B_{s+1}(i), ending E(s+1, i), and for
 *    its stage: in the steady state that is busy until F_s(W+i) ends, which
 *    by the same tightness is E(s, i-1) + f = E(s+1, i); in the cool-down
 *    until B_s(i-1) ends at E(s, i-1) = E(s+1, i) - f <= E(s+1, i). Either
 *    way B_s(i) runs from E(s+1, i) to E(s+1, i) + b = E(s, i).
 * The iteration ends with B_0(m-1):
 *   makespan = E(0, m-1) = p*f + p*b + (m-1)*(f + b) = (m + p - 1)*(f + b),
 * e.g. f = 1, b = 2: 3*(m + p - 1). */
Test(pipeline, onef1b_uniform_makespan_is_m_plus_p_minus_1_steps)
{
	const double fb[][2] = {{1, 2}, {3, 1}};
	for (int t = 0; t < 2; t++)
		for (int32_t p = 2; p <= 4; p++)
			for (int32_t m = 4; m <= 8; m++) {
				double f = fb[t][0], b = fb[t][1];
				fixture fx;
				fixture_uniform(&fx, KILN_PIPE_1F1B, p, m, 1, f, b, 0);
				kiln_arena *a = kiln_arena_new();
				kiln_pipe_result r = simulate_ok(&fx.w, a);
				cr_expect_float_eq(r.makespan_us, (m + p - 1) * (f + b), EPS,
				                   "p %d m %d f %g b %g: makespan %g, want %g", p,
				                   m, f, b, r.makespan_us, (m + p - 1) * (f + b));
				for (int32_t s = 0; s < p; s++) {
					cr_expect_float_eq(r.busy_us[s], m * (f + b), EPS);
					for (int32_t k = 0; k < 2 * m; k++) {
						const kiln_pipe_op *o = &r.ops[s * 2 * m + k];
						if (!o->backward)
							continue;
						double e =
						    p * f + (p - s) * b + o->microbatch * (f + b);
						cr_expect_float_eq(
						    o->end_us, e, EPS,
						    "p %d m %d: B_%d(%d) ends %g, want %g", p, m, s,
						    o->microbatch, o->end_us, e);
					}
				}
				kiln_arena_free(a);
			}
}

/* p = 1: no pipeline, F(0) B(0) F(1) B(1) ..., back to back: m*(f + b). */
Test(pipeline, single_stage_runs_back_to_back)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_1F1B, 1, 5, 1, 1.5, 2, 7);
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r = simulate_ok(&fx.w, a);
	cr_expect_float_eq(r.makespan_us, 5 * 3.5, EPS);
	cr_expect_eq(r.peak_inflight[0], 1);
	for (int32_t k = 0; k < 10; k++)
		cr_expect_eq(r.ops[k].backward, k % 2);
	kiln_arena_free(a);
}

/* ------------------------------------------------------------ 1F1B, by hand */

/* p = 2, m = 4, a slow last stage: stage 0 f = 1, b = 2; stage 1 f = 2,
 * b = 4; p2p 0. Orders: stage 0 (W = 1) F0 F1 B0 F2 B1 F3 B2 B3; stage 1
 * (W = 0) F0 B0 F1 B1 F2 B2 F3 B3.
 *   F_0(0) [0,1]   F_0(1) [1,2]
 *   F_1(0) needs F_0(0) (1)                 [1,3]   B_1(0) [3,7]
 *   B_0(0) needs B_1(0) (7)                 [7,9]
 *   F_1(1) needs F_0(1) (2), stage free 7   [7,9]   B_1(1) [9,13]
 *   F_0(2) stage free 9                     [9,10]
 *   B_0(1) needs B_1(1) (13)                [13,15]
 *   F_1(2) needs F_0(2) (10), free 13       [13,15] B_1(2) [15,19]
 *   F_0(3) free 15                          [15,16]
 *   B_0(2) needs B_1(2) (19)                [19,21]
 *   F_1(3) needs F_0(3) (16), free 19       [19,21] B_1(3) [21,25]
 *   B_0(3) needs B_1(3) (25)                [25,27]
 * Makespan 27 = f_0 + m*(f_1 + b_1) + b_0 = 1 + 24 + 2: the last stage is the
 * bottleneck and never idles once started. Busy: stage 0 12, stage 1 24. */
Test(pipeline, onef1b_slow_last_stage_by_hand)
{
	const double f[] = {1, 2}, b[] = {2, 4};
	fixture fx;
	fixture_init(&fx, KILN_PIPE_1F1B, 2, 4, 1, f, b, 0);
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r = simulate_ok(&fx.w, a);
	const want_op s0[] = {{0, 0, 0, 0, 1},   {0, 1, 0, 1, 2},   {0, 0, 1, 7, 9},
	                      {0, 2, 0, 9, 10},  {0, 1, 1, 13, 15}, {0, 3, 0, 15, 16},
	                      {0, 2, 1, 19, 21}, {0, 3, 1, 25, 27}};
	const want_op s1[] = {{0, 0, 0, 1, 3},   {0, 0, 1, 3, 7},   {0, 1, 0, 7, 9},
	                      {0, 1, 1, 9, 13},  {0, 2, 0, 13, 15}, {0, 2, 1, 15, 19},
	                      {0, 3, 0, 19, 21}, {0, 3, 1, 21, 25}};
	expect_stage(&fx.w, &r, 0, s0);
	expect_stage(&fx.w, &r, 1, s1);
	cr_expect_float_eq(r.makespan_us, 27, EPS);
	cr_expect_float_eq(r.busy_us[0], 12, EPS);
	cr_expect_float_eq(r.busy_us[1], 24, EPS);
	cr_expect_eq(r.peak_inflight[0], 2);
	cr_expect_eq(r.peak_inflight[1], 1);
	kiln_arena_free(a);
}

/* Peak bytes of the case above. Stage 0 holds micro-batch i from F_0(i)'s
 * start to B_0(i)'s end: 0 [0,9], 1 [1,15], 2 [9,21], 3 [15,27]. With
 * 100, 200, 300, 400 bytes and base 1000:
 *   [0,1) 100; [1,9) 300; at 9 micro-batch 0 leaves as 2 arrives: [9,15)
 *   500; at 15 1 leaves as 3 arrives: [15,21) 700; [21,27) 400.
 * Peak 1000 + 700 = 1700 (had 2 arrived before 0 left: 600 at 9, still
 * below 700; the next case tells the tie apart).
 * Stage 1 holds i over [1,7], [7,13], [13,19], [19,25]: each release at t
 * comes before the take at t, so with 10, 20, 30, 40 bytes and base 5 the
 * peak is 5 + 40 = 45, not 5 + 30 + 40. */
Test(pipeline, peak_bytes_by_hand)
{
	const double f[] = {1, 2}, b[] = {2, 4};
	fixture fx;
	fixture_init(&fx, KILN_PIPE_1F1B, 2, 4, 1, f, b, 0);
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r = simulate_ok(&fx.w, a);
	const double bytes[] = {100, 200, 300, 400, 10, 20, 30, 40};
	cr_expect_float_eq(kiln_pipe_peak_bytes(&fx.w, &r, 0, bytes, 1000), 1700, EPS);
	cr_expect_float_eq(kiln_pipe_peak_bytes(&fx.w, &r, 1, bytes, 5), 45, EPS);
	cr_expect_float_eq(kiln_pipe_peak_bytes(&fx.w, &r, 2, bytes, 5), -1, 0);
	cr_expect_float_eq(kiln_pipe_peak_bytes(&fx.w, &r, -1, bytes, 5), -1, 0);
	cr_expect_float_eq(kiln_pipe_peak_bytes(&fx.w, &r, 0, NULL, 5), -1, 0);
	cr_expect_float_eq(kiln_pipe_peak_bytes(&fx.w, NULL, 0, bytes, 5), -1, 0);
	kiln_arena_free(a);
}

/* p = 3, m = 4, f = 1, b = 2, p2p 0.5. Orders: stage 0 (W = 2) F0 F1 F2 B0
 * F3 B1 B2 B3; stage 1 (W = 1) F0 F1 B0 F2 B1 F3 B2 B3; stage 2 (W = 0) F0
 * B0 F1 B1 F2 B2 F3 B3. "x + .5" is an input from another stage.
 *   F_0(0) [0,1]  F_0(1) [1,2]  F_0(2) [2,3]
 *   F_1(0) 1 + .5                        [1.5,2.5]
 *   F_1(1) 2 + .5                        [2.5,3.5]
 *   F_2(0) 2.5 + .5                      [3,4]     B_2(0) [4,6]
 *   F_2(1) 3.5 + .5, stage free 6        [6,7]     B_2(1) [7,9]
 *   B_1(0) 6 + .5                        [6.5,8.5]
 *   F_1(2) 3 + .5, free 8.5              [8.5,9.5]
 *   B_1(1) 9 + .5                        [9.5,11.5]
 *   B_0(0) 8.5 + .5                      [9,11]
 *   F_0(3) free 11                       [11,12]
 *   B_0(1) 11.5 + .5                     [12,14]
 *   F_2(2) 9.5 + .5                      [10,11]   B_2(2) [11,13]
 *   F_1(3) 12 + .5                       [12.5,13.5]
 *   B_1(2) 13 + .5                       [13.5,15.5]
 *   F_2(3) 13.5 + .5                     [14,15]   B_2(3) [15,17]
 *   B_1(3) 17 + .5                       [17.5,19.5]
 *   B_0(2) 15.5 + .5, free 14            [16,18]
 *   B_0(3) 19.5 + .5                     [20,22]
 * Makespan 22: the critical path F_0(0) F_1(0) F_2(0) B_2(0) B_1(0) B_0(0)
 * F_0(3) F_1(3) F_2(3) B_2(3) B_1(3) B_0(3) has 18 of compute (the 18 of
 * (m + p - 1)*(f + b) without transfers) and 8 transfers of 0.5. */
Test(pipeline, onef1b_p2p_by_hand)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_1F1B, 3, 4, 1, 1, 2, 0.5);
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r = simulate_ok(&fx.w, a);
	const want_op s0[] = {{0, 0, 0, 0, 1},   {0, 1, 0, 1, 2},   {0, 2, 0, 2, 3},
	                      {0, 0, 1, 9, 11},  {0, 3, 0, 11, 12}, {0, 1, 1, 12, 14},
	                      {0, 2, 1, 16, 18}, {0, 3, 1, 20, 22}};
	const want_op s1[] = {{0, 0, 0, 1.5, 2.5},   {0, 1, 0, 2.5, 3.5},  {0, 0, 1, 6.5, 8.5},
	                      {0, 2, 0, 8.5, 9.5},   {0, 1, 1, 9.5, 11.5}, {0, 3, 0, 12.5, 13.5},
	                      {0, 2, 1, 13.5, 15.5}, {0, 3, 1, 17.5, 19.5}};
	const want_op s2[] = {{0, 0, 0, 3, 4},   {0, 0, 1, 4, 6},   {0, 1, 0, 6, 7},
	                      {0, 1, 1, 7, 9},   {0, 2, 0, 10, 11}, {0, 2, 1, 11, 13},
	                      {0, 3, 0, 14, 15}, {0, 3, 1, 15, 17}};
	expect_stage(&fx.w, &r, 0, s0);
	expect_stage(&fx.w, &r, 1, s1);
	expect_stage(&fx.w, &r, 2, s2);
	cr_expect_float_eq(r.makespan_us, 22, EPS);
	for (int32_t s = 0; s < 3; s++) {
		cr_expect_float_eq(r.busy_us[s], 12, EPS);
		cr_expect_eq(r.peak_inflight[s], 3 - s);
	}
	kiln_arena_free(a);
}

/* ------------------------------------------------------------ interleaved */

/* p = 2, v = 2, m = 4, every chunk's forward f = 1 and backward b = 2, p2p 0.
 * Chunk c of stage s is virtual stage 2c + s: F_0(0,i) -> F_1(0,i) ->
 * F_0(1,i) -> F_1(1,i) -> B_1(1,i) -> B_0(1,i) -> B_1(0,i) -> B_0(0,i).
 * Megatron's order: forward k (k = 0..7) runs chunk (k mod 4) / 2 of
 * micro-batch (k / 4)*2 + k mod 2: (0,0) (0,1) (1,0) (1,1) (0,2) (0,3) (1,2)
 * (1,3); backward k the mirrored chunk: (1,0) (1,1) (0,0) (0,1) (1,2) (1,3)
 * (0,2) (0,3). Warm-up: stage 0 2*(2-0-1) + (2-1)*2 = 4, stage 1 0 + 2 = 2
 * (below m*v = 8, so no cap). Then forward k+W, backward k pairs, then the
 * rest of the backwards.
 *   F_0(0,0) [0,1]  F_0(0,1) [1,2]
 *   F_1(0,0) needs F_0(0,0) 1            [1,2]
 *   F_1(0,1) needs F_0(0,1) 2            [2,3]
 *   F_0(1,0) needs F_1(0,0) 2            [2,3]
 *   F_0(1,1) needs F_1(0,1) 3            [3,4]
 *   F_0(0,2) (warm-up done; first pair)  [4,5]
 *   F_1(1,0) needs F_0(1,0) 3            [3,4]   B_1(1,0) [4,6]
 *   F_1(1,1) needs F_0(1,1) 4, free 6    [6,7]   B_1(1,1) [7,9]
 *   F_1(0,2) needs F_0(0,2) 5, free 9    [9,10]
 *   B_0(1,0) needs B_1(1,0) 6            [6,8]
 *   F_0(0,3) free 8                      [8,9]
 *   B_0(1,1) needs B_1(1,1) 9            [9,11]
 *   F_0(1,2) needs F_1(0,2) 10, free 11  [11,12]
 *   B_1(0,0) needs B_0(1,0) 8, free 10   [10,12]
 *   F_1(0,3) needs F_0(0,3) 9, free 12   [12,13]
 *   B_1(0,1) needs B_0(1,1) 11, free 13  [13,15]
 *   F_1(1,2) needs F_0(1,2) 12, free 15  [15,16]  B_1(1,2) [16,18]
 *   B_0(0,0) needs B_1(0,0) 12           [12,14]
 *   F_0(1,3) needs F_1(0,3) 13, free 14  [14,15]
 *   B_0(0,1) needs B_1(0,1) 15           [15,17]
 *   B_0(1,2) needs B_1(1,2) 18           [18,20]
 *   F_1(1,3) needs F_0(1,3) 15, free 18  [18,19]  B_1(1,3) [19,21]
 *   B_1(0,2) needs B_0(1,2) 20, free 21  [21,23]
 *   B_0(1,3) needs B_1(1,3) 21           [21,23]
 *   B_0(0,2) needs B_1(0,2) 23           [23,25]
 *   B_1(0,3) needs B_0(1,3) 23           [23,25]
 *   B_0(0,3) needs B_1(0,3) 25           [25,27]
 * Makespan 27 = m*v*(f + b) + (p - 1)*(f + b) = 24 + 3: each stage works 24
 * and the bubble is (p - 1) chunk steps. The same stages under 1F1B (one
 * chunk per stage, forward 2f, backward 2b) take (m + p - 1)*(2f + 2b) = 30,
 * bubble (p - 1)*v*(f + b) = 6: interleaving divides the bubble by v. In
 * flight: stage 0 holds 5 chunks from time 4 (W + 1), stage 1 3 from 3. */
Test(pipeline, interleaved_by_hand)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_INTERLEAVED, 2, 4, 2, 1, 2, 0);
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r = simulate_ok(&fx.w, a);
	const want_op s0[] = {
	    {0, 0, 0, 0, 1},   {0, 1, 0, 1, 2},   {1, 0, 0, 2, 3},   {1, 1, 0, 3, 4},
	    {0, 2, 0, 4, 5},   {1, 0, 1, 6, 8},   {0, 3, 0, 8, 9},   {1, 1, 1, 9, 11},
	    {1, 2, 0, 11, 12}, {0, 0, 1, 12, 14}, {1, 3, 0, 14, 15}, {0, 1, 1, 15, 17},
	    {1, 2, 1, 18, 20}, {1, 3, 1, 21, 23}, {0, 2, 1, 23, 25}, {0, 3, 1, 25, 27}};
	const want_op s1[] = {
	    {0, 0, 0, 1, 2},   {0, 1, 0, 2, 3},   {1, 0, 0, 3, 4},   {1, 0, 1, 4, 6},
	    {1, 1, 0, 6, 7},   {1, 1, 1, 7, 9},   {0, 2, 0, 9, 10},  {0, 0, 1, 10, 12},
	    {0, 3, 0, 12, 13}, {0, 1, 1, 13, 15}, {1, 2, 0, 15, 16}, {1, 2, 1, 16, 18},
	    {1, 3, 0, 18, 19}, {1, 3, 1, 19, 21}, {0, 2, 1, 21, 23}, {0, 3, 1, 23, 25}};
	expect_stage(&fx.w, &r, 0, s0);
	expect_stage(&fx.w, &r, 1, s1);
	cr_expect_float_eq(r.makespan_us, 27, EPS);
	cr_expect_float_eq(r.busy_us[0], 24, EPS);
	cr_expect_float_eq(r.busy_us[1], 24, EPS);
	cr_expect_eq(r.peak_inflight[0], 5);
	cr_expect_eq(r.peak_inflight[1], 3);

	/* The same stages under 1F1B (one chunk of f = 2, b = 4 per stage):
	 * (m + p - 1)*(2 + 4) = 30. */
	fixture one;
	fixture_uniform(&one, KILN_PIPE_1F1B, 2, 4, 1, 2, 4, 0);
	kiln_pipe_result r1 = simulate_ok(&one.w, a);
	cr_expect_float_eq(r1.makespan_us, 30, EPS);
	kiln_arena_free(a);
}

/* p = 2, v = 2, m = 2, f = b = 1, p2p 1: the transfer also costs on the
 * wrap from stage 1's chunk 0 to stage 0's chunk 1, and stage 0's warm-up
 * 2 + 2 = 4 reaches m*v = 4 (all forwards first). Stage 1's is 2.
 * Orders: stage 0 F(0,0) F(0,1) F(1,0) F(1,1) B(1,0) B(1,1) B(0,0) B(0,1);
 * stage 1 F(0,0) F(0,1) F(1,0) B(1,0) F(1,1) B(1,1) B(0,0) B(0,1).
 *   F_0(0,0) [0,1]  F_0(0,1) [1,2]
 *   F_1(0,0) 1 + 1 [2,3]   F_1(0,1) 2 + 1 [3,4]
 *   F_0(1,0) 3 + 1 [4,5]   F_0(1,1) 4 + 1 [5,6]
 *   F_1(1,0) 5 + 1 [6,7]   B_1(1,0) [7,8]
 *   F_1(1,1) 6 + 1, free 8 [8,9]   B_1(1,1) [9,10]
 *   B_0(1,0) 8 + 1 [9,10]  B_0(1,1) 10 + 1 [11,12]
 *   B_1(0,0) 10 + 1 [11,12]  B_1(0,1) 12 + 1 [13,14]
 *   B_0(0,0) 12 + 1 [13,14]  B_0(0,1) 14 + 1 [15,16]
 * Makespan 16; stage 0 holds all 4 chunks at 5, stage 1 3. */
Test(pipeline, interleaved_wrap_pays_p2p_by_hand)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_INTERLEAVED, 2, 2, 2, 1, 1, 1);
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r = simulate_ok(&fx.w, a);
	const want_op s0[] = {{0, 0, 0, 0, 1},   {0, 1, 0, 1, 2},  {1, 0, 0, 4, 5},
	                      {1, 1, 0, 5, 6},   {1, 0, 1, 9, 10}, {1, 1, 1, 11, 12},
	                      {0, 0, 1, 13, 14}, {0, 1, 1, 15, 16}};
	const want_op s1[] = {{0, 0, 0, 2, 3},   {0, 1, 0, 3, 4},  {1, 0, 0, 6, 7},
	                      {1, 0, 1, 7, 8},   {1, 1, 0, 8, 9},  {1, 1, 1, 9, 10},
	                      {0, 0, 1, 11, 12}, {0, 1, 1, 13, 14}};
	expect_stage(&fx.w, &r, 0, s0);
	expect_stage(&fx.w, &r, 1, s1);
	cr_expect_float_eq(r.makespan_us, 16, EPS);
	cr_expect_eq(kiln_pipe_warmup(&fx.w, 0), 4);
	cr_expect_eq(kiln_pipe_warmup(&fx.w, 1), 2);
	cr_expect_eq(r.peak_inflight[0], 4);
	cr_expect_eq(r.peak_inflight[1], 3);
	kiln_arena_free(a);
}

/* p = 1, v = 2, m = 2: chunks hand over within the one stage, so p2p (7)
 * never applies and the ops run back to back: m*v*(f + b) = 4*3 = 12. */
Test(pipeline, interleaved_single_stage_pays_no_p2p)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_INTERLEAVED, 1, 2, 2, 1, 2, 7);
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r = simulate_ok(&fx.w, a);
	cr_expect_float_eq(r.makespan_us, 12, EPS);
	kiln_arena_free(a);
}

/* Megatron-core's warm-up, 2*(p - s - 1) + (v - 1)*p capped at m*v, and so
 * the chunks held at once: one more than the warm-up, or all m*v (the
 * in-flight count costmodel/memory.c assumes, times v). */
Test(pipeline, interleaved_inflight_is_warmup_plus_one)
{
	const int32_t cases[][3] = {{2, 2, 2}, {2, 2, 4},  {2, 3, 6}, {4, 2, 4},
	                            {4, 2, 8}, {4, 3, 12}, {3, 2, 9}};
	for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
		int32_t p = cases[t][0], v = cases[t][1], m = cases[t][2];
		fixture fx;
		fixture_uniform(&fx, KILN_PIPE_INTERLEAVED, p, m, v, 1, 2, 0.1);
		kiln_arena *a = kiln_arena_new();
		kiln_pipe_result r = simulate_ok(&fx.w, a);
		for (int32_t s = 0; s < p; s++) {
			int32_t warm = 2 * (p - s - 1) + (v - 1) * p;
			if (warm > m * v)
				warm = m * v;
			int32_t held = warm + 1 < m * v ? warm + 1 : m * v;
			cr_expect_eq(kiln_pipe_warmup(&fx.w, s), warm);
			cr_expect_eq(r.peak_inflight[s], held, "p %d v %d m %d s %d: %d, want %d",
			             p, v, m, s, r.peak_inflight[s], held);
			cr_expect_float_eq(r.busy_us[s], m * v * 3.0, EPS);
		}
		kiln_arena_free(a);
	}
}

/* ------------------------------------------------------------ caller's order */

/* p = 2, m = 2, f = b = 1: GPipe (all forwards, then all backwards) timed
 * by kiln_pipe_run. Stage 0 F0 [0,1] F1 [1,2]; stage 1 F0 [1,2] F1 [2,3]
 * B0 [3,4] B1 [4,5]; stage 0 B0 needs B_1(0) 4 [4,5], B1 needs 5 [5,6]. */
Test(pipeline, run_times_a_callers_order)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_1F1B, 2, 2, 1, 1, 1, 0);
	kiln_pipe_op ops[8];
	for (int32_t s = 0; s < 2; s++)
		for (int32_t k = 0; k < 4; k++)
			ops[s * 4 + k] = (kiln_pipe_op){s, 0, k % 2, k / 2, 0, 0};
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r;
	cr_assert_eq(kiln_pipe_run(&fx.w, ops, a, stderr, &r), 0);
	cr_expect(r.ops == ops);
	const want_op s0[] = {{0, 0, 0, 0, 1}, {0, 1, 0, 1, 2}, {0, 0, 1, 4, 5}, {0, 1, 1, 5, 6}};
	const want_op s1[] = {{0, 0, 0, 1, 2}, {0, 1, 0, 2, 3}, {0, 0, 1, 3, 4}, {0, 1, 1, 4, 5}};
	expect_stage(&fx.w, &r, 0, s0);
	expect_stage(&fx.w, &r, 1, s1);
	cr_expect_float_eq(r.makespan_us, 6, EPS);
	cr_expect_eq(r.peak_inflight[0], 2);
	kiln_arena_free(a);
}

/* Runs kiln_pipe_run on ops and expects -1 with a message containing want. */
static void expect_run_refused(const kiln_pipe_work *w, kiln_pipe_op *ops, const char *want)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *err = open_memstream(&buf, &len);
	cr_assert_not_null(err);
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r;
	int rc = kiln_pipe_run(w, ops, a, err, &r);
	fclose(err);
	cr_expect_eq(rc, -1, "expected a refusal mentioning '%s'", want);
	cr_expect(strstr(buf, want) != NULL, "message '%s' lacks '%s'", buf, want);
	cr_expect(!strncmp(buf, "pipeline: ", 10), "message '%s'", buf);
	kiln_arena_free(a);
	free(buf);
}

/* p = 2, m = 2: stage 0 runs F0 B1 F1 B0. B_0(1) needs B_1(1), which needs
 * F_1(1), which needs F_0(1), queued behind B_0(1) on stage 0: a cycle.
 * Stage 1 (F0 B0 F1 B1) gets through F0 and B0 and then waits too. */
Test(pipeline, run_reports_a_deadlock)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_1F1B, 2, 2, 1, 1, 1, 0);
	kiln_pipe_op ops[8] = {{0, 0, 0, 0, 0, 0}, {0, 0, 1, 1, 0, 0}, {0, 0, 1, 0, 0, 0},
	                       {0, 0, 0, 1, 0, 0}, {1, 0, 0, 0, 0, 0}, {1, 0, 0, 1, 0, 0},
	                       {1, 0, 1, 0, 0, 0}, {1, 0, 1, 1, 0, 0}};
	expect_run_refused(&fx.w, ops,
	                   "deadlocks: stage 0 cannot start the backward of chunk 0, "
	                   "micro-batch 1 (op 1");
	/* A backward ahead of its own forward on one stage deadlocks as well. */
	fixture one;
	fixture_uniform(&one, KILN_PIPE_1F1B, 1, 1, 1, 1, 1, 0);
	kiln_pipe_op back_first[2] = {{0, 0, 0, 1, 0, 0}, {0, 0, 0, 0, 0, 0}};
	expect_run_refused(&one.w, back_first, "deadlocks");
}

Test(pipeline, run_refuses_orders_that_are_not_permutations)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_1F1B, 2, 2, 1, 1, 1, 0);
	kiln_pipe_op twice[8] = {{0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0}, {0, 0, 1, 1, 0, 0},
	                         {0, 0, 0, 1, 0, 0}, {1, 0, 0, 0, 0, 0}, {1, 0, 0, 1, 0, 0},
	                         {1, 0, 1, 0, 0, 0}, {1, 0, 1, 1, 0, 0}};
	expect_run_refused(&fx.w, twice,
	                   "stage 0 runs the forward of chunk 0, micro-batch 0 twice");
	kiln_pipe_op stray[8] = {{0, 0, 0, 0, 0, 0}, {0, 0, 1, 0, 0, 0}, {0, 0, 1, 1, 0, 0},
	                         {0, 0, 0, 1, 0, 0}, {1, 0, 0, 0, 0, 0}, {1, 0, 0, 1, 0, 0},
	                         {1, 0, 2, 0, 0, 0}, {1, 0, 1, 1, 0, 0}};
	expect_run_refused(&fx.w, stray, "op 2 of stage 1 is out of range");
	kiln_pipe_op wrong_stage[8] = {{0, 0, 0, 0, 0, 0}, {0, 0, 1, 0, 0, 0}, {0, 0, 1, 1, 0, 0},
	                               {0, 0, 0, 1, 0, 0}, {0, 0, 0, 0, 0, 0}, {1, 0, 0, 1, 0, 0},
	                               {1, 0, 1, 0, 0, 0}, {1, 0, 1, 1, 0, 0}};
	expect_run_refused(&fx.w, wrong_stage, "op 0 of stage 1 is out of range");
	expect_run_refused(&fx.w, NULL, "no ops");
}

/* ------------------------------------------------------------ bad work */

/* Simulates w and expects -1 with a message containing want. */
static void expect_refused(const kiln_pipe_work *w, const char *want)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *err = open_memstream(&buf, &len);
	cr_assert_not_null(err);
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r;
	memset(&r, 0, sizeof r);
	int rc = kiln_pipe_simulate(w, a, err, &r);
	fclose(err);
	cr_expect_eq(rc, -1, "expected a refusal mentioning '%s'", want);
	cr_expect(strstr(buf, want) != NULL, "message '%s' lacks '%s'", buf, want);
	cr_expect(!strncmp(buf, "pipeline: ", 10), "message '%s'", buf);
	/* Without a stream the refusal is silent and the same. */
	cr_expect_eq(kiln_pipe_simulate(w, a, NULL, &r), -1);
	kiln_arena_free(a);
	free(buf);
}

Test(pipeline, bad_work_is_refused)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_INTERLEAVED, 4, 6, 2, 1, 2, 0);
	expect_refused(&fx.w, "needs m (6) to be a multiple of p (4)");

	fixture_uniform(&fx, KILN_PIPE_1F1B, 2, 4, 1, 1, 2, 0);
	kiln_pipe_work w = fx.w;
	w.p = 0;
	expect_refused(&w, "p (0), m (4) and v (1) must be at least 1");
	w = fx.w;
	w.m = 0;
	expect_refused(&w, "must be at least 1");
	w = fx.w;
	w.m = -3;
	expect_refused(&w, "must be at least 1");
	w = fx.w;
	w.v = 2;
	expect_refused(&w, "1f1b schedule needs v = 1, got v (2)");
	w = fx.w;
	w.kind = (kiln_pipe_kind)7;
	expect_refused(&w, "unknown schedule kind 7");
	w = fx.w;
	w.fwd_us = NULL;
	expect_refused(&w, "fwd_us is NULL");
	w = fx.w;
	w.bwd_us = NULL;
	expect_refused(&w, "bwd_us is NULL");
	w = fx.w;
	w.p2p_us = -1;
	expect_refused(&w, "p2p_us is -1");
	w = fx.w;
	w.p2p_us = NAN;
	expect_refused(&w, "p2p_us is nan");
	w = fx.w;
	w.m = INT32_MAX;
	w.p = 2;
	expect_refused(&w, "exceed the limit");
	expect_refused(NULL, "no work");

	/* Durations of stage 1, micro-batch 2 sit at index (1*1 + 0)*4 + 2 = 6. */
	fx.fwd[6] = -0.5;
	expect_refused(&fx.w, "fwd_us[6] (stage 1, chunk 0, micro-batch 2) is -0.5");
	fx.fwd[6] = 1;
	fx.bwd[6] = NAN;
	expect_refused(&fx.w, "bwd_us[6] (stage 1, chunk 0, micro-batch 2) is nan");
	fx.bwd[6] = INFINITY;
	expect_refused(&fx.w, "bwd_us[6] (stage 1, chunk 0, micro-batch 2) is inf");
	fx.bwd[6] = 2;

	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r;
	cr_expect_eq(kiln_pipe_simulate(&fx.w, NULL, NULL, &r), -1);
	cr_expect_eq(kiln_pipe_simulate(&fx.w, a, NULL, NULL), -1);
	cr_expect_eq(kiln_pipe_simulate(&fx.w, a, NULL, &r), 0);
	kiln_arena_free(a);
}

/* ------------------------------------------------------------ EP overlap */

/* Combined steps (kiln_pipe_work.pair_us): the callback records the pairs
 * it is asked for and prices each at a constant. */
typedef struct pairs_seen {
	double us;
	int32_t n, stage[16], f_mb[16], b_mb[16];
} pairs_seen;

static double pair_const(const void *ctx, const kiln_pipe_op *fo, const kiln_pipe_op *bo)
{
	pairs_seen *ps = (pairs_seen *)ctx;
	cr_assert(!fo->backward && bo->backward && fo->stage == bo->stage);
	if (ps->n < 16) {
		ps->stage[ps->n] = fo->stage;
		ps->f_mb[ps->n] = fo->microbatch;
		ps->b_mb[ps->n++] = bo->microbatch;
	}
	return ps->us;
}

/* p = 1, m = 4, f = 1, b = 2, a combined step 2.5: Megatron's combined 1F1B
 * without pipelining runs F(0) alone, then F(1)+B(0), F(2)+B(1), F(3)+B(2),
 * then B(3) alone (combined_1f1b.py lines 76-135 at d98e8a64): one warm-up
 * forward. F(0) [0,1]; the steps [1,3.5] [3.5,6] [6,8.5]; B(3) [8.5,10.5]:
 * the makespan f + (m - 1) * 2.5 + b = 10.5, the step's form; two
 * micro-batches held during a combined step. */
Test(pipeline, overlap_single_stage_by_hand)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_1F1B, 1, 4, 1, 1, 2, 0);
	pairs_seen ps = {.us = 2.5};
	fx.w.pair_us = pair_const;
	fx.w.pair_ctx = &ps;
	cr_expect_eq(kiln_pipe_warmup(&fx.w, 0), 1);
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r = simulate_ok(&fx.w, a);
	const want_op s0[] = {{0, 0, 0, 0, 1},   {0, 1, 0, 1, 3.5},   {0, 0, 1, 1, 3.5},
	                      {0, 2, 0, 3.5, 6}, {0, 1, 1, 3.5, 6},   {0, 3, 0, 6, 8.5},
	                      {0, 2, 1, 6, 8.5}, {0, 3, 1, 8.5, 10.5}};
	expect_stage(&fx.w, &r, 0, s0);
	cr_expect_float_eq(r.makespan_us, 10.5, EPS);
	cr_expect_float_eq(r.busy_us[0], 10.5, EPS);
	cr_expect_eq(r.peak_inflight[0], 2);
	cr_assert_eq(ps.n, 3);
	for (int k = 0; k < 3; k++)
		cr_expect(ps.f_mb[k] == k + 1 && ps.b_mb[k] == k);
	kiln_arena_free(a);
}

/* p = 2, m = 3, f = 1, b = 2, p2p 0, a combined step 2.5. Warm-up one more
 * than 1F1B's: stage 0 2, stage 1 1. Orders: stage 0 F0 F1 [F2 B0] B1 B2;
 * stage 1 F0 [F1 B0] [F2 B1] B2. A combined step starts when the stage is
 * free and both inputs are there:
 *   S0 F0 [0,1], F1 [1,2]
 *   S1 F0 needs S0 F0 (1): [1,2]
 *   S1 [F1 B0]: F1 needs S0 F1 (2), B0 its own F0 (2): [2,4.5]
 *   S0 [F2 B0]: B0 needs S1 B0 (4.5): [4.5,7]
 *   S1 [F2 B1]: F2 needs S0 F2 (7): [7,9.5]
 *   S0 B1 needs S1 B1 (9.5): [9.5,11.5]; S1 B2 (own F2 at 9.5): [9.5,11.5]
 *   S0 B2 needs S1 B2 (11.5): [11.5,13.5]
 * Makespan 13.5; busy 1 + 1 + 2.5 + 2 + 2 = 8.5 and 1 + 2.5 + 2.5 + 2 = 8;
 * held at once min(p - s + 1, m): 3 and 2. */
Test(pipeline, overlap_two_stages_by_hand)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_1F1B, 2, 3, 1, 1, 2, 0);
	pairs_seen ps = {.us = 2.5};
	fx.w.pair_us = pair_const;
	fx.w.pair_ctx = &ps;
	kiln_arena *a = kiln_arena_new();
	kiln_pipe_result r = simulate_ok(&fx.w, a);
	const want_op s0[] = {{0, 0, 0, 0, 1},   {0, 1, 0, 1, 2},      {0, 2, 0, 4.5, 7},
	                      {0, 0, 1, 4.5, 7}, {0, 1, 1, 9.5, 11.5}, {0, 2, 1, 11.5, 13.5}};
	const want_op s1[] = {{0, 0, 0, 1, 2},   {0, 1, 0, 2, 4.5}, {0, 0, 1, 2, 4.5},
	                      {0, 2, 0, 7, 9.5}, {0, 1, 1, 7, 9.5}, {0, 2, 1, 9.5, 11.5}};
	expect_stage(&fx.w, &r, 0, s0);
	expect_stage(&fx.w, &r, 1, s1);
	cr_expect_float_eq(r.makespan_us, 13.5, EPS);
	cr_expect_float_eq(r.busy_us[0], 8.5, EPS);
	cr_expect_float_eq(r.busy_us[1], 8, EPS);
	cr_expect_eq(r.peak_inflight[0], 3);
	cr_expect_eq(r.peak_inflight[1], 2);
	cr_expect_eq(ps.n, 3);
	kiln_arena_free(a);
}

/* Under 1F1B stage s holds its W = min(p - s - 1, m) warm-up forwards, then
 * takes one more before its first backward frees one: min(p - s, m), the
 * in-flight count DESIGN.md section 1 gives. With EP overlap one warm-up
 * forward more, and a combined step holds both of its micro-batches:
 * min(p - s + 1, m), the memory model's count then (costmodel/memory.c,
 * kiln_cost_stage_inflight). Over p = 1..4 and m = 1..8, from the
 * simulated start and end times. */
Test(pipeline, onef1b_peak_inflight_is_p_minus_s)
{
	for (int ov = 0; ov <= 1; ov++)
		for (int32_t p = 1; p <= 4; p++)
			for (int32_t m = 1; m <= 8; m++) {
				fixture fx;
				fixture_uniform(&fx, KILN_PIPE_1F1B, p, m, 1, 1, 2, 0.25);
				pairs_seen ps = {.us = 2.5};
				if (ov) {
					fx.w.pair_us = pair_const;
					fx.w.pair_ctx = &ps;
				}
				kiln_arena *a = kiln_arena_new();
				kiln_pipe_result r = simulate_ok(&fx.w, a);
				for (int32_t s = 0; s < p; s++) {
					int32_t want = p - s + ov < m ? p - s + ov : m;
					cr_expect_eq(r.peak_inflight[s], want,
					             "overlap %d p %d m %d s %d: %d, want %d", ov,
					             p, m, s, r.peak_inflight[s], want);
					int32_t warm = p - s - 1 + ov < m ? p - s - 1 + ov : m;
					cr_expect_eq(kiln_pipe_warmup(&fx.w, s), warm);
				}
				kiln_arena_free(a);
			}
}

/* A combined step's price is checked like any duration. */
Test(pipeline, overlap_bad_pair_time_is_refused)
{
	fixture fx;
	fixture_uniform(&fx, KILN_PIPE_1F1B, 1, 4, 1, 1, 2, 0);
	pairs_seen ps = {.us = NAN};
	fx.w.pair_us = pair_const;
	fx.w.pair_ctx = &ps;
	expect_refused(&fx.w, "the combined step of stage 0 (forward of chunk 0, micro-batch 1; "
	                      "backward of chunk 0, micro-batch 0) takes nan us");
	ps.us = -1;
	expect_refused(&fx.w, "takes -1 us; durations must be finite and >= 0");
}
