/* tests/test_trainer_ops.c: examples/trainer/ops.c.
 *
 * Forward values are worked out by hand (in the comments) or from the
 * defining formula in double. Every backward is checked against central
 * finite differences of L = sum(y * R), R fixed and random, evaluated in
 * double from the float forward. Random inputs come from a generator local
 * to this file, not from the code under test.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/ops.h"

/* Finite differences: step H on inputs of size ~1. L is summed in double
 * from float outputs, whose rounding (~6e-8 relative per element, a few
 * hundred elements with random signs) gives ~1e-6 of noise in L, i.e.
 * ~5e-5 in (L+ - L-) / 2H; truncation error is ~H^2/6 * L''' ~ 2e-5. So an
 * element passes when |num - ana| <= RTOL * max(|num|, |ana|) + ATOL:
 * RTOL 2e-2 leaves a wide margin on gradients of size ~1, while a wrong
 * term (a missing factor, a transposed index) is off by O(1). ATOL 1e-3
 * covers gradients near zero, where only the noise above remains. */
#define FD_H 1e-2f
#define FD_RTOL 2e-2
#define FD_ATOL 1e-3

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state;

/* Uniform in [-1, 1) from a 64-bit LCG (Knuth's MMIX constants). */
static float rnd(void)
{
	rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return (float)((double)(rng_state >> 11) * 0x1p-53 * 2.0 - 1.0);
}

static float *rnd_buf(int n)
{
	float *p = malloc((size_t)n * sizeof *p);
	cr_assert_not_null(p);
	for (int i = 0; i < n; i++)
		p[i] = rnd();
	return p;
}

static float *zero_buf(int n)
{
	float *p = calloc((size_t)n, sizeof *p);
	cr_assert_not_null(p);
	return p;
}

static double dot_d(const float *y, const float *r, int n)
{
	double acc = 0.0;
	for (int i = 0; i < n; i++)
		acc += (double)y[i] * (double)r[i];
	return acc;
}

static void expect_near(double got, double want, double tol, const char *what, int i)
{
	cr_expect(fabs(got - want) <= tol, "%s[%d]: got %.9g, want %.9g (tol %g)", what, i, got,
	          want, tol);
}

/* Compares ana[0..n) with central differences of loss(ctx) in x[0..n). */
static void check_grad(const char *what, float *x, int n, double (*loss)(void *), void *ctx,
                       const float *ana)
{
	double big = 0.0;
	for (int i = 0; i < n; i++) {
		float x0 = x[i], xp = x0 + FD_H, xm = x0 - FD_H;
		x[i] = xp;
		double lp = loss(ctx);
		x[i] = xm;
		double lm = loss(ctx);
		x[i] = x0;
		/* divide by the step actually taken, after rounding to float */
		double num = (lp - lm) / ((double)xp - (double)xm), a = (double)ana[i];
		double tol = FD_RTOL * fmax(fabs(num), fabs(a)) + FD_ATOL;
		cr_expect(fabs(num - a) <= tol, "%s[%d]: numeric %.6g, analytic %.6g", what, i, num,
		          a);
		big = fmax(big, fabs(num));
	}
	cr_expect(big > 0.05, "%s: every gradient is ~0 (max %g), the check proves nothing", what,
	          big);
}

/* ---------------------------------------------------------------- matmul */

Test(trainer_ops, matmul_hand)
{
	/* [1 2 3; 4 5 6] * [1 0; 0 1; 1 1] = [1+3 2+3; 4+6 5+6] */
	const float x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, 0, 0, 1, 1, 1};
	const float want[4] = {4, 5, 10, 11};
	float y[4] = {-7, -7, -7, -7};
	tr_matmul(x, w, y, 2, 3, 2);
	for (int i = 0; i < 4; i++)
		cr_expect_eq(y[i], want[i], "y[%d] = %g", i, (double)y[i]);
}

Test(trainer_ops, matmul_bwd_accumulates_and_skips_null)
{
	/* dy = [1 0; 0 2]: dy w^T = [1 0 1; 0 2 2], added to ones;
	 * x^T dy = [x00 2x10; x01 2x11; x02 2x12] = [1 8; 2 10; 3 12]. */
	const float x[6] = {1, 2, 3, 4, 5, 6}, w[6] = {1, 0, 0, 1, 1, 1};
	const float dy[4] = {1, 0, 0, 2};
	const float want_dx[6] = {2, 1, 2, 1, 3, 3}, want_dw[6] = {1, 8, 2, 10, 3, 12};
	float dx[6] = {1, 1, 1, 1, 1, 1}, dw[6] = {0};
	tr_matmul_bwd(x, w, dy, dx, NULL, 2, 3, 2);
	tr_matmul_bwd(x, w, dy, NULL, dw, 2, 3, 2);
	for (int i = 0; i < 6; i++) {
		cr_expect_eq(dx[i], want_dx[i], "dx[%d] = %g", i, (double)dx[i]);
		cr_expect_eq(dw[i], want_dw[i], "dw[%d] = %g", i, (double)dw[i]);
	}
}

struct mm_ctx {
	float *x, *w, *y, *r;
	int n, in, out;
};

static double mm_loss(void *p)
{
	struct mm_ctx *c = p;
	tr_matmul(c->x, c->w, c->y, c->n, c->in, c->out);
	return dot_d(c->y, c->r, c->n * c->out);
}

Test(trainer_ops, matmul_bwd_matches_finite_differences)
{
	rng_state = 1;
	struct mm_ctx c = {
	    rnd_buf(3 * 4), rnd_buf(4 * 5), zero_buf(3 * 5), rnd_buf(3 * 5), 3, 4, 5};
	float *dx = zero_buf(3 * 4), *dw = zero_buf(4 * 5);
	tr_matmul_bwd(c.x, c.w, c.r, dx, dw, c.n, c.in, c.out);
	check_grad("matmul dx", c.x, 3 * 4, mm_loss, &c, dx);
	check_grad("matmul dw", c.w, 4 * 5, mm_loss, &c, dw);
	free(c.x), free(c.w), free(c.y), free(c.r), free(dx), free(dw);
}

Test(trainer_ops, matmul_same_bits_at_any_alignment)
{
	/* 13 columns: vector body plus remainder; one float of offset moves
	 * every row off the 16- and 32-byte boundaries. */
	enum { N = 7, IN = 9, OUT = 13 };
	rng_state = 2;
	float *x = rnd_buf(N * IN + 1), *w = rnd_buf(IN * OUT + 1), *dy = rnd_buf(N * OUT + 1);
	float *y0 = zero_buf(N * OUT + 1), *y1 = zero_buf(N * OUT + 1);
	float *dw0 = zero_buf(IN * OUT + 1), *dw1 = zero_buf(IN * OUT + 1);
	float *dx0 = zero_buf(N * IN + 1), *dx1 = zero_buf(N * IN + 1);
	tr_matmul(x, w, y0, N, IN, OUT);
	tr_matmul_bwd(x, w, dy, dx0, dw0, N, IN, OUT);
	memmove(x + 1, x, N * IN * sizeof *x);
	memmove(w + 1, w, IN * OUT * sizeof *w);
	memmove(dy + 1, dy, N * OUT * sizeof *dy);
	tr_matmul(x + 1, w + 1, y1 + 1, N, IN, OUT);
	tr_matmul_bwd(x + 1, w + 1, dy + 1, dx1 + 1, dw1 + 1, N, IN, OUT);
	cr_expect(memcmp(y0, y1 + 1, N * OUT * sizeof *y0) == 0);
	cr_expect(memcmp(dx0, dx1 + 1, N * IN * sizeof *dx0) == 0);
	cr_expect(memcmp(dw0, dw1 + 1, IN * OUT * sizeof *dw0) == 0);
	free(x), free(w), free(dy), free(y0), free(y1), free(dw0), free(dw1), free(dx0), free(dx1);
}

/* ---------------------------------------------------------------- rmsnorm */

Test(trainer_ops, rmsnorm_hand)
{
	/* Two rows [3, 4]: mean(x^2) = (9 + 16) / 2 = 12.5, so with g = 1
	 * y = [3, 4] / sqrt(12.5 + 1e-5) = [0.848528, 1.131371]. */
	const float x[4] = {3, 4, 3, 4}, g1[2] = {1, 1}, g2[2] = {2, 0.5f};
	const double r = 1.0 / sqrt(12.5 + 1e-5);
	float y[4];
	tr_rmsnorm(x, g1, y, 2, 2);
	for (int i = 0; i < 4; i++)
		expect_near(y[i], x[i] * r, 1e-6, "y g=1", i);
	/* g = [2, 0.5]: [6, 2] / sqrt(12.5 + 1e-5) */
	tr_rmsnorm(x, g2, y, 2, 2);
	expect_near(y[0], 6 * r, 1e-6, "y g=[2,.5]", 0);
	expect_near(y[1], 2 * r, 1e-6, "y g=[2,.5]", 1);
}

struct rms_ctx {
	float *x, *g, *y, *r;
	int n, h;
};

static double rms_loss(void *p)
{
	struct rms_ctx *c = p;
	tr_rmsnorm(c->x, c->g, c->y, c->n, c->h);
	return dot_d(c->y, c->r, c->n * c->h);
}

Test(trainer_ops, rmsnorm_bwd_matches_finite_differences)
{
	enum { N = 3, H = 6 };
	rng_state = 3;
	struct rms_ctx c = {rnd_buf(N * H), rnd_buf(H), zero_buf(N * H), rnd_buf(N * H), N, H};
	float *dx = zero_buf(N * H), *dg = zero_buf(H);
	tr_rmsnorm_bwd(c.x, c.g, c.r, dx, dg, N, H);
	check_grad("rmsnorm dx", c.x, N * H, rms_loss, &c, dx);
	check_grad("rmsnorm dg", c.g, H, rms_loss, &c, dg);
	/* accumulation: a second call adds the same again */
	float *dx2 = zero_buf(N * H), *dg2 = zero_buf(H);
	tr_rmsnorm_bwd(c.x, c.g, c.r, dx2, dg2, N, H);
	tr_rmsnorm_bwd(c.x, c.g, c.r, dx2, dg2, N, H);
	for (int i = 0; i < N * H; i++)
		expect_near(dx2[i], 2.0 * dx[i], 1e-6, "rmsnorm dx twice", i);
	for (int i = 0; i < H; i++)
		expect_near(dg2[i], 2.0 * dg[i], 1e-6, "rmsnorm dg twice", i);
	free(c.x), free(c.g), free(c.y), free(c.r), free(dx), free(dg), free(dx2), free(dg2);
}

/* ---------------------------------------------------------------- attention */

enum { AB = 2, AS = 5, AA = 4, AKV = 2, AD = 8, AQ = AB * AS * AA * AD, AK = AB * AS * AKV * AD };

Test(trainer_ops, attn_one_token_returns_v)
{
	/* s = 1: each token sees only itself, p = 1, so out = v of the head's KV
	 * group (j / (a/kv) = j / 2) and lse = scale * q.k with scale = 1/sqrt(8). */
	enum { B = 3, A = 4, KV = 2, D = 8 };
	rng_state = 4;
	float *q = rnd_buf(B * A * D), *k = rnd_buf(B * KV * D), *v = rnd_buf(B * KV * D);
	float out[B * A * D], lse[A * B], scratch[1];
	tr_attn(q, k, v, out, lse, scratch, B, 1, A, KV, D);
	for (int t = 0; t < B; t++)
		for (int j = 0; j < A; j++) {
			const float *qj = q + (t * A + j) * D, *kg = k + (t * KV + j / 2) * D;
			double qk = 0.0;
			for (int e = 0; e < D; e++) {
				cr_expect_eq(out[(t * A + j) * D + e], v[(t * KV + j / 2) * D + e],
				             "t %d head %d e %d", t, j, e);
				qk += (double)qj[e] * (double)kg[e];
			}
			expect_near(lse[j * B + t], qk / sqrt(8.0), 1e-6, "lse", j * B + t);
		}
	free(q), free(k), free(v);
}

Test(trainer_ops, attn_two_tokens_hand)
{
	/* d = 4, scale = 1/2, one head. Token 0 sees k0 only: out0 = v0 and
	 * lse0 = scale * q0.k0 = 0 (k0 = 0). Token 1: q1 = [1 1 0 0], k0 = 0,
	 * k1 = [ln3 ln3 0 0], so the scores are 0 and (ln3 + ln3)/2 = ln3,
	 * p = [1/4, 3/4], lse1 = ln(1 + 3) = ln4, and
	 * out1 = v0/4 + 3 v1/4 = [2 0 1 -1]/4 + 3 [6 4 1 3]/4 = [5 3 1 2]. */
	const float l3 = (float)log(3.0);
	const float q[8] = {0.5f, -1, 2, 3, 1, 1, 0, 0}, k[8] = {0, 0, 0, 0, l3, l3, 0, 0};
	const float v[8] = {2, 0, 1, -1, 6, 4, 1, 3};
	const double want[8] = {2, 0, 1, -1, 5, 3, 1, 2};
	float out[8], lse[2], scratch[2];
	tr_attn(q, k, v, out, lse, scratch, 1, 2, 1, 1, 4);
	for (int i = 0; i < 8; i++)
		expect_near(out[i], want[i], 1e-5, "out", i);
	expect_near(lse[0], 0.0, 1e-7, "lse", 0);
	expect_near(lse[1], log(4.0), 1e-6, "lse", 1);
}

Test(trainer_ops, attn_is_causal)
{
	/* Changing token 3's k and v in sequence 0 leaves tokens 0..2 of that
	 * sequence and all of sequence 1 bit-identical, and changes token 3. */
	rng_state = 5;
	float *q = rnd_buf(AQ), *k = rnd_buf(AK), *v = rnd_buf(AK);
	float *o0 = zero_buf(AQ), *o1 = zero_buf(AQ), l0[AA * AB * AS], l1[AA * AB * AS], sc[AS];
	tr_attn(q, k, v, o0, l0, sc, AB, AS, AA, AKV, AD);
	for (int e = 0; e < AKV * AD; e++) {
		k[3 * AKV * AD + e] += 0.5f;
		v[3 * AKV * AD + e] -= 0.5f;
	}
	tr_attn(q, k, v, o1, l1, sc, AB, AS, AA, AKV, AD);
	const int row = AA * AD;
	cr_expect(memcmp(o0, o1, 3 * row * sizeof *o0) == 0, "earlier tokens changed");
	cr_expect(memcmp(o0 + AS * row, o1 + AS * row, AS * row * sizeof *o0) == 0,
	          "other sequence changed");
	for (int j = 0; j < AA; j++)
		for (int t = 0; t < AB * AS; t++)
			if (t < 3 || t >= AS)
				cr_expect_eq(l0[j * AB * AS + t], l1[j * AB * AS + t], "lse %d %d",
				             j, t);
	cr_expect(memcmp(o0 + 3 * row, o1 + 3 * row, row * sizeof *o0) != 0, "token 3 unchanged");
	free(q), free(k), free(v), free(o0), free(o1);
}

struct attn_ctx {
	float *q, *k, *v, *out, *lse, *r, *scratch;
};

static double attn_loss(void *p)
{
	struct attn_ctx *c = p;
	tr_attn(c->q, c->k, c->v, c->out, c->lse, c->scratch, AB, AS, AA, AKV, AD);
	return dot_d(c->out, c->r, AQ);
}

static struct attn_ctx attn_setup(uint64_t seed)
{
	rng_state = seed;
	struct attn_ctx c = {
	    .q = rnd_buf(AQ), .k = rnd_buf(AK), .v = rnd_buf(AK), .r = rnd_buf(AQ)};
	c.out = zero_buf(AQ), c.lse = zero_buf(AA * AB * AS), c.scratch = zero_buf(2 * AS);
	attn_loss(&c);
	return c;
}

static void attn_free(struct attn_ctx *c)
{
	free(c->q), free(c->k), free(c->v), free(c->out), free(c->lse), free(c->r),
	    free(c->scratch);
}

Test(trainer_ops, attn_bwd_matches_finite_differences)
{
	struct attn_ctx c = attn_setup(6);
	float *dq = zero_buf(AQ), *dk = zero_buf(AK), *dv = zero_buf(AK);
	tr_attn_bwd(c.q, c.k, c.v, c.out, c.lse, c.r, dq, dk, dv, c.scratch, AB, AS, AA, AKV, AD);
	check_grad("attn dq", c.q, AQ, attn_loss, &c, dq);
	check_grad("attn dk", c.k, AK, attn_loss, &c, dk);
	check_grad("attn dv", c.v, AK, attn_loss, &c, dv);
	free(dq), free(dk), free(dv);
	attn_free(&c);
}

Test(trainer_ops, attn_bwd_is_deterministic_and_accumulates)
{
	struct attn_ctx c = attn_setup(7);
	float *g[2][3];
	for (int r = 0; r < 2; r++) {
		g[r][0] = zero_buf(AQ), g[r][1] = zero_buf(AK), g[r][2] = zero_buf(AK);
		tr_attn_bwd(c.q, c.k, c.v, c.out, c.lse, c.r, g[r][0], g[r][1], g[r][2], c.scratch,
		            AB, AS, AA, AKV, AD);
	}
	cr_expect(memcmp(g[0][0], g[1][0], AQ * sizeof(float)) == 0, "dq differs");
	cr_expect(memcmp(g[0][1], g[1][1], AK * sizeof(float)) == 0, "dk differs");
	cr_expect(memcmp(g[0][2], g[1][2], AK * sizeof(float)) == 0, "dv differs");
	/* a second call into the same buffers adds the same gradients again */
	tr_attn_bwd(c.q, c.k, c.v, c.out, c.lse, c.r, g[1][0], g[1][1], g[1][2], c.scratch, AB, AS,
	            AA, AKV, AD);
	for (int i = 0; i < AQ; i++)
		expect_near(g[1][0][i], 2.0 * g[0][0][i], 1e-5, "dq twice", i);
	for (int i = 0; i < AK; i++) {
		expect_near(g[1][1][i], 2.0 * g[0][1][i], 1e-5, "dk twice", i);
		expect_near(g[1][2][i], 2.0 * g[0][2][i], 1e-5, "dv twice", i);
	}
	for (int r = 0; r < 2; r++)
		for (int i = 0; i < 3; i++)
			free(g[r][i]);
	attn_free(&c);
}

Test(trainer_ops, attn_same_bits_at_any_alignment)
{
	struct attn_ctx c = attn_setup(8);
	float *q = zero_buf(AQ + 1), *k = zero_buf(AK + 1), *v = zero_buf(AK + 1);
	float *out = zero_buf(AQ + 1), *dout = zero_buf(AQ + 1), lse[AA * AB * AS], sc[2 * AS];
	memcpy(q + 1, c.q, AQ * sizeof *q);
	memcpy(k + 1, c.k, AK * sizeof *k);
	memcpy(v + 1, c.v, AK * sizeof *v);
	memcpy(dout + 1, c.r, AQ * sizeof *dout);
	tr_attn(q + 1, k + 1, v + 1, out + 1, lse, sc, AB, AS, AA, AKV, AD);
	cr_expect(memcmp(out + 1, c.out, AQ * sizeof *out) == 0);
	cr_expect(memcmp(lse, c.lse, sizeof lse) == 0);
	float *dq0 = zero_buf(AQ), *dq1 = zero_buf(AQ + 1);
	float *dk0 = zero_buf(AK), *dk1 = zero_buf(AK + 1), *dv0 = zero_buf(AK),
	      *dv1 = zero_buf(AK + 1);
	tr_attn_bwd(c.q, c.k, c.v, c.out, c.lse, c.r, dq0, dk0, dv0, c.scratch, AB, AS, AA, AKV,
	            AD);
	tr_attn_bwd(q + 1, k + 1, v + 1, out + 1, lse, dout + 1, dq1 + 1, dk1 + 1, dv1 + 1, sc, AB,
	            AS, AA, AKV, AD);
	cr_expect(memcmp(dq0, dq1 + 1, AQ * sizeof *dq0) == 0);
	cr_expect(memcmp(dk0, dk1 + 1, AK * sizeof *dk0) == 0);
	cr_expect(memcmp(dv0, dv1 + 1, AK * sizeof *dv0) == 0);
	free(q), free(k), free(v), free(out), free(dout);
	free(dq0), free(dq1), free(dk0), free(dk1), free(dv0), free(dv1);
	attn_free(&c);
}

/* ---------------------------------------------------------------- swiglu */

Test(trainer_ops, swiglu_hand)
{
	/* silu(z) = z / (1 + e^-z): (gate 0, up 5) -> 0;
	 * (1, 2) -> 2 / (1 + e^-1) = 1.46211715726;
	 * (-2, 3) -> -6 / (1 + e^2) = -0.715217532133. One row, f = 3. */
	const float up[6] = {0, 1, -2, 5, 2, 3};
	const double want[3] = {0.0, 1.4621171572600098, -0.7152175321327053};
	float act[3];
	tr_swiglu(up, act, 1, 3);
	for (int i = 0; i < 3; i++)
		expect_near(act[i], want[i], 1e-6, "act", i);
}

struct swi_ctx {
	float *up, *act, *r;
	int n, f;
};

static double swi_loss(void *p)
{
	struct swi_ctx *c = p;
	tr_swiglu(c->up, c->act, c->n, c->f);
	return dot_d(c->act, c->r, c->n * c->f);
}

Test(trainer_ops, swiglu_bwd_matches_finite_differences)
{
	enum { N = 3, F = 4 };
	rng_state = 9;
	struct swi_ctx c = {rnd_buf(N * 2 * F), zero_buf(N * F), rnd_buf(N * F), N, F};
	/* spread the gates over [-3, 3], where silu is curved */
	for (int i = 0; i < N * 2 * F; i++)
		c.up[i] *= 3.0f;
	float *dup = rnd_buf(N * 2 * F); /* garbage: must be overwritten */
	tr_swiglu_bwd(c.up, c.r, dup, N, F);
	check_grad("swiglu dup", c.up, N * 2 * F, swi_loss, &c, dup);
	free(c.up), free(c.act), free(c.r), free(dup);
}

/* ---------------------------------------------------------------- softmax */

Test(trainer_ops, softmax_hand)
{
	/* [0, ln3] -> [1, 3] / 4 = [0.25, 0.75]; [100, 100 + ln3] gives the same
	 * (e^100 alone would overflow float: the max is subtracted first). */
	const float x[4] = {0, (float)log(3.0), 100, 100 + (float)log(3.0)};
	float y[4];
	tr_softmax(x, y, 2, 2);
	expect_near(y[0], 0.25, 1e-7, "y", 0);
	expect_near(y[1], 0.75, 1e-7, "y", 1);
	expect_near(y[2], 0.25, 1e-5, "y", 2);
	expect_near(y[3], 0.75, 1e-5, "y", 3);
}

struct sm_ctx {
	float *x, *y, *r;
	int n, c;
};

static double sm_loss(void *p)
{
	struct sm_ctx *c = p;
	tr_softmax(c->x, c->y, c->n, c->c);
	return dot_d(c->y, c->r, c->n * c->c);
}

Test(trainer_ops, softmax_bwd_matches_finite_differences)
{
	enum { N = 3, C = 5 };
	rng_state = 10;
	struct sm_ctx c = {rnd_buf(N * C), zero_buf(N * C), rnd_buf(N * C), N, C};
	for (int i = 0; i < N * C; i++)
		c.r[i] *= 4.0f; /* softmax gradients are small: scale them past ATOL */
	sm_loss(&c);
	float *dx = rnd_buf(N * C);
	tr_softmax_bwd(c.y, c.r, dx, N, C);
	check_grad("softmax dx", c.x, N * C, sm_loss, &c, dx);
	free(c.x), free(c.y), free(c.r), free(dx);
}

/* ---------------------------------------------------------------- topk */

Test(trainer_ops, topk_orders_ties_by_index)
{
	/* row 0: three 0.3 ties at 1, 2, 4, then 0.2 at 3, then 0.1 at 0;
	 * row 1: 5 at 2 and 3, then -1 at 0 and 4 (tie), then -2. */
	const float p[10] = {0.1f, 0.3f, 0.3f, 0.2f, 0.3f, -1, -2, 5, 5, -1};
	int32_t idx[10];
	tr_topk(p, 2, 5, 3, idx);
	const int32_t want3[6] = {1, 2, 4, 2, 3, 0};
	for (int i = 0; i < 6; i++)
		cr_expect_eq(idx[i], want3[i], "k=3 idx[%d] = %d", i, idx[i]);
	tr_topk(p, 2, 5, 5, idx);
	const int32_t want5[10] = {1, 2, 4, 3, 0, 2, 3, 0, 4, 1};
	for (int i = 0; i < 10; i++)
		cr_expect_eq(idx[i], want5[i], "k=5 idx[%d] = %d", i, idx[i]);
}

/* ---------------------------------------------------------------- xent */

Test(trainer_ops, xent_hand)
{
	/* 3 rows of 8 equal logits: each row costs ln 8, the sum 3 ln 8 =
	 * 6.23832462504; dlogits = (1/8 - onehot) * grad_scale. */
	float logits[24], d[24];
	const int32_t tg[3] = {0, 5, 7};
	for (int i = 0; i < 24; i++)
		logits[i] = 0.7f;
	expect_near(tr_xent(logits, tg, 3, 8, 0.5f, d), 6.238324625039507, 1e-5, "loss", 0);
	for (int i = 0; i < 24; i++)
		expect_near(d[i], (0.125 - (i % 8 == tg[i / 8])) * 0.5, 1e-7, "dlogits", i);
	/* [0, ln3] against target 1: -ln(3/4) = 0.287682072452 */
	const float two[2] = {0, (float)log(3.0)};
	const int32_t one = 1;
	expect_near(tr_xent(two, &one, 1, 2, 1.0f, NULL), 0.2876820724517809, 1e-6, "loss", 1);
}

struct xe_ctx {
	float *logits;
	int32_t *tg;
	int n, v;
	float gs;
};

static double xe_loss(void *p)
{
	struct xe_ctx *c = p;
	return (double)c->gs * (double)tr_xent(c->logits, c->tg, c->n, c->v, 0.0f, NULL);
}

Test(trainer_ops, xent_bwd_matches_finite_differences)
{
	/* dlogits is the gradient of grad_scale * loss */
	enum { N = 4, V = 6 };
	int32_t tg[N] = {0, 3, 5, 2};
	rng_state = 11;
	struct xe_ctx c = {rnd_buf(N * V), tg, N, V, 0.5f};
	for (int i = 0; i < N * V; i++)
		c.logits[i] *= 3.0f;
	float *d = rnd_buf(N * V);
	tr_xent(c.logits, tg, N, V, c.gs, d);
	check_grad("xent dlogits", c.logits, N * V, xe_loss, &c, d);
	free(c.logits), free(d);
}

/* ---------------------------------------------------------------- add, adamw */

Test(trainer_ops, add)
{
	float a[3] = {1, 2, 3};
	const float b[3] = {0.5f, -2, 4};
	tr_add(a, b, 3);
	cr_expect(a[0] == 1.5f && a[1] == 0.0f && a[2] == 7.0f);
}

Test(trainer_ops, adamw_two_steps_by_hand)
{
	/* Step 1 from m = v = 0: m = (1-b1) g, v = (1-b2) g^2, so after bias
	 * correction mhat = g, vhat = g^2 and
	 * p1 = p - lr (g / (|g| + eps) + wd p) ~ p - lr (sign(g) + wd p).
	 * Step 2 with g2: m2 = b1 (1-b1) g + (1-b1) g2, v2 = b2 (1-b2) g^2 +
	 * (1-b2) g2^2, mhat = m2 / (1-b1^2), vhat = v2 / (1-b2^2). */
	const double lr = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
	float p[4] = {1, -2, 0.5f, 3}, m[4] = {0}, v[4] = {0};
	const float g[4] = {0.1f, -0.3f, 2, 0}, g2[4] = {-1, 0.5f, 2, 0.25f};
	double want[4];
	for (int i = 0; i < 4; i++) {
		double gi = g[i];
		want[i] = p[i] - lr * (gi / (fabs(gi) + eps) + wd * p[i]);
	}
	tr_adamw(p, m, v, g, 4, 1, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd);
	for (int i = 0; i < 4; i++)
		expect_near(p[i], want[i], 1e-6, "p step 1", i);
	for (int i = 0; i < 4; i++) {
		double m2 = b1 * (1 - b1) * g[i] + (1 - b1) * g2[i];
		double v2 = b2 * (1 - b2) * g[i] * g[i] + (1 - b2) * g2[i] * g2[i];
		double mh = m2 / (1 - b1 * b1), vh = v2 / (1 - b2 * b2);
		want[i] = p[i] - lr * (mh / (sqrt(vh) + eps) + wd * p[i]);
	}
	tr_adamw(p, m, v, g2, 4, 2, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd);
	for (int i = 0; i < 4; i++)
		expect_near(p[i], want[i], 1e-5, "p step 2", i);
}

/* ---------------------------------------------------------------- init, hash */

Test(trainer_ops, init_uniform)
{
	enum { N = 10000 };
	static float a[N], b[N], c[N], h[N];
	tr_init_uniform(a, N, 42, 7, 0.02f);
	tr_init_uniform(b, N, 42, 7, 0.02f);
	tr_init_uniform(c, N, 42, 8, 0.02f);
	cr_expect(memcmp(a, b, sizeof a) == 0, "same seed and stream differ");
	int same = 0;
	double lo = 1, hi = -1, mean = 0;
	for (int i = 0; i < N; i++) {
		cr_expect(a[i] >= -0.02f && a[i] <= 0.02f, "a[%d] = %g", i, (double)a[i]);
		same += a[i] == c[i];
		lo = fmin(lo, a[i]), hi = fmax(hi, a[i]), mean += a[i];
	}
	cr_expect(same < 10, "streams 7 and 8 share %d values", same);
	/* uniform on [-0.02, 0.02]: mean ~0 (sd 0.0116 / sqrt(N) = 1.2e-4),
	 * extremes near the ends */
	cr_expect(fabs(mean / N) < 6e-4 && lo < -0.0199 && hi > 0.0199, "mean %g lo %g hi %g",
	          mean / N, lo, hi);
	/* the same tensor filled in two pieces */
	tr_init_uniform_at(h, 3333, 42, 7, 0, 0.02f);
	tr_init_uniform_at(h + 3333, N - 3333, 42, 7, 3333, 0.02f);
	cr_expect(memcmp(a, h, sizeof a) == 0, "two pieces differ from one call");
	tr_init_uniform(c, N, 43, 7, 0.02f);
	cr_expect(memcmp(a, c, sizeof a) != 0, "seeds 42 and 43 agree");
}

Test(trainer_ops, fnv1a_reference_values)
{
	/* Published FNV-1a 64 test vectors (Fowler, Noll, Vo). */
	cr_expect_eq(tr_fnv1a(TR_FNV_OFFSET, "", 0), 0xcbf29ce484222325ULL);
	cr_expect_eq(tr_fnv1a(TR_FNV_OFFSET, "a", 1), 0xaf63dc4c8601ec8cULL);
	cr_expect_eq(tr_fnv1a(TR_FNV_OFFSET, "foobar", 6), 0x85944171f73967e8ULL);
	cr_expect_eq(tr_fnv1a(tr_fnv1a(TR_FNV_OFFSET, "foo", 3), "bar", 3), 0x85944171f73967e8ULL);
}
