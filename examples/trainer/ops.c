/* examples/trainer/ops.c: fp32 CPU kernels of the small MoE trainer (ops.h).
 *
 * Reductions are plain float loops in index order: without -ffast-math the
 * compiler may not reorder them, so results do not depend on alignment or
 * vector width. Loops it does vectorize (the inner j loops of the matmuls,
 * the axpy updates) are elementwise, with the same operations per element.
 */
#include "ops.h"

#include <math.h>

/* Eight partial sums in a fixed order, added pairwise at the end: the same
 * bits on every call (nothing depends on alignment), and a shape the
 * compiler can keep in one vector register. */
static float dot(const float *a, const float *b, int n)
{
	float acc[8] = {0};
	int i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			acc[j] += a[i + j] * b[i + j];
	float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
	for (; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* y[i] += a * x[i] */
static void axpy(float *y, float a, const float *x, int n)
{
	for (int i = 0; i < n; i++)
		y[i] += a * x[i];
}

static float row_max(const float *x, int n)
{
	float m = x[0];
	for (int i = 1; i < n; i++)
		if (x[i] > m)
			m = x[i];
	return m;
}

void tr_matmul(const float *x, const float *w, float *y, int n, int in, int out)
{
	for (int i = 0; i < n; i++) {
		float *yi = y + i * out;
		for (int j = 0; j < out; j++)
			yi[j] = 0.0f;
		for (int k = 0; k < in; k++)
			axpy(yi, x[i * in + k], w + k * out, out);
	}
}

void tr_matmul_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw, int n,
                   int in, int out)
{
	if (dx)
		for (int i = 0; i < n; i++)
			for (int k = 0; k < in; k++)
				dx[i * in + k] += dot(dy + i * out, w + k * out, out);
	if (dw)
		for (int i = 0; i < n; i++)
			for (int k = 0; k < in; k++)
				axpy(dw + k * out, x[i * in + k], dy + i * out, out);
}

/* 1 / sqrt(mean(x^2) + eps) of one row. */
static float rms_inv(const float *x, int h)
{
	return 1.0f / sqrtf(dot(x, x, h) / (float)h + TR_RMSNORM_EPS);
}

void tr_rmsnorm(const float *x, const float *g, float *y, int n, int h)
{
	for (int i = 0; i < n; i++) {
		const float *xi = x + i * h;
		float r = rms_inv(xi, h);
		for (int j = 0; j < h; j++)
			y[i * h + j] = xi[j] * r * g[j];
	}
}

void tr_rmsnorm_bwd(const float *x, const float *g, const float *dy, float *dx, float *dg, int n,
                    int h)
{
	for (int i = 0; i < n; i++) {
		const float *xi = x + i * h, *dyi = dy + i * h;
		float r = rms_inv(xi, h);
		/* y_j = x_j r g_j with dr/dx_j = -r^3 x_j / h, so
		 * dx_j = r g_j dy_j - x_j r^3 / h * sum_k dy_k g_k x_k. */
		float c = 0.0f;
		for (int j = 0; j < h; j++)
			c += dyi[j] * g[j] * xi[j];
		c *= r * r * r / (float)h;
		for (int j = 0; j < h; j++) {
			dx[i * h + j] += r * g[j] * dyi[j] - xi[j] * c;
			dg[j] += dyi[j] * xi[j] * r;
		}
	}
}

void tr_attn(const float *q, const float *k, const float *v, float *out, float *lse, float *scratch,
             int b, int s, int a, int kv, int d)
{
	const float scale = 1.0f / sqrtf((float)d);
	const int group = a / kv, qw = a * d, kw = kv * d, rows = b * s;
	for (int bi = 0; bi < b; bi++)
		for (int j = 0; j < a; j++) {
			const int ko = (j / group) * d;
			for (int i = 0; i < s; i++) {
				const int t = bi * s + i;
				const float *qi = q + t * qw + j * d;
				float *o = out + t * qw + j * d;
				for (int u = 0; u <= i; u++)
					scratch[u] = scale * dot(qi, k + (bi * s + u) * kw + ko, d);
				float m = row_max(scratch, i + 1), sum = 0.0f;
				for (int u = 0; u <= i; u++) {
					scratch[u] = expf(scratch[u] - m);
					sum += scratch[u];
				}
				float inv = 1.0f / sum;
				for (int e = 0; e < d; e++)
					o[e] = 0.0f;
				for (int u = 0; u <= i; u++)
					axpy(o, scratch[u] * inv, v + (bi * s + u) * kw + ko, d);
				lse[j * rows + t] = m + logf(sum);
			}
		}
}

void tr_attn_bwd(const float *q, const float *k, const float *v, const float *out, const float *lse,
                 const float *dout, float *dq, float *dk, float *dv, float *scratch, int b, int s,
                 int a, int kv, int d)
{
	const float scale = 1.0f / sqrtf((float)d);
	const int group = a / kv, qw = a * d, kw = kv * d, rows = b * s;
	float *p = scratch, *ds = scratch + s;
	for (int bi = 0; bi < b; bi++)
		for (int j = 0; j < a; j++) {
			const int ko = (j / group) * d;
			for (int i = 0; i < s; i++) {
				const int t = bi * s + i;
				const float *qi = q + t * qw + j * d, *doi = dout + t * qw + j * d;
				const float l = lse[j * rows + t];
				/* ds_u = p_u (dout.v_u - dout.out): the softmax backward
				 * with sum_u p_u dout.v_u = dout.out. */
				const float dd = dot(doi, out + t * qw + j * d, d);
				for (int u = 0; u <= i; u++) {
					const int tu = (bi * s + u) * kw + ko;
					p[u] = expf(scale * dot(qi, k + tu, d) - l);
					ds[u] = p[u] * (dot(doi, v + tu, d) - dd);
				}
				float *dqi = dq + t * qw + j * d;
				for (int u = 0; u <= i; u++) {
					const int tu = (bi * s + u) * kw + ko;
					axpy(dqi, scale * ds[u], k + tu, d);
					axpy(dk + tu, scale * ds[u], qi, d);
					axpy(dv + tu, p[u], doi, d);
				}
			}
		}
}

static float sigmoid(float z)
{
	return 1.0f / (1.0f + expf(-z));
}

void tr_swiglu(const float *up, float *act, int n, int f)
{
	for (int i = 0; i < n; i++) {
		const float *gi = up + i * 2 * f, *ui = gi + f;
		for (int j = 0; j < f; j++)
			act[i * f + j] = gi[j] * sigmoid(gi[j]) * ui[j];
	}
}

void tr_swiglu_bwd(const float *up, const float *dact, float *dup, int n, int f)
{
	for (int i = 0; i < n; i++) {
		const float *gi = up + i * 2 * f, *ui = gi + f, *di = dact + i * f;
		float *dg = dup + i * 2 * f, *du = dg + f;
		for (int j = 0; j < f; j++) {
			/* silu'(z) = sig(z) (1 + z (1 - sig(z))) */
			float sg = sigmoid(gi[j]);
			dg[j] = di[j] * ui[j] * sg * (1.0f + gi[j] * (1.0f - sg));
			du[j] = di[j] * gi[j] * sg;
		}
	}
}

void tr_softmax(const float *x, float *y, int n, int c)
{
	for (int i = 0; i < n; i++) {
		const float *xi = x + i * c;
		float *yi = y + i * c;
		float m = row_max(xi, c), sum = 0.0f;
		for (int j = 0; j < c; j++) {
			yi[j] = expf(xi[j] - m);
			sum += yi[j];
		}
		float inv = 1.0f / sum;
		for (int j = 0; j < c; j++)
			yi[j] *= inv;
	}
}

void tr_softmax_bwd(const float *y, const float *dy, float *dx, int n, int c)
{
	for (int i = 0; i < n; i++) {
		const float *yi = y + i * c, *dyi = dy + i * c;
		float sd = dot(dy + i * c, yi, c);
		for (int j = 0; j < c; j++)
			dx[i * c + j] = yi[j] * (dyi[j] - sd);
	}
}

/* Whether column a comes before column b: higher value, then lower index. */
static int before(const float *p, int a, int b)
{
	return p[a] > p[b] || (p[a] == p[b] && a < b);
}

void tr_topk(const float *p, int n, int c, int k, int32_t *idx)
{
	for (int i = 0; i < n; i++) {
		const float *pi = p + i * c;
		int32_t *out = idx + i * k;
		/* Each pick is the first column in the order that comes after the
		 * previous pick: k scans, no marks to keep. */
		for (int r = 0; r < k; r++) {
			int best = -1;
			for (int j = 0; j < c; j++) {
				if (r > 0 && !before(pi, out[r - 1], j))
					continue;
				if (best < 0 || before(pi, j, best))
					best = j;
			}
			out[r] = best;
		}
	}
}

float tr_xent(const float *logits, const int32_t *targets, int n, int v, float grad_scale,
              float *dlogits)
{
	double total = 0.0;
	for (int i = 0; i < n; i++) {
		const float *li = logits + i * v;
		float m = row_max(li, v), sum = 0.0f;
		for (int j = 0; j < v; j++)
			sum += expf(li[j] - m);
		total += (double)(m + logf(sum) - li[targets[i]]);
		if (dlogits) {
			float *di = dlogits + i * v, inv = 1.0f / sum;
			for (int j = 0; j < v; j++)
				di[j] = expf(li[j] - m) * inv * grad_scale;
			di[targets[i]] -= grad_scale;
		}
	}
	return (float)total;
}

void tr_add(float *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] += src[i];
}

void tr_adamw(float *p, float *m, float *v, const float *g, size_t n, int t, float lr, float b1,
              float b2, float eps, float wd)
{
	const float c1 = 1.0f / (1.0f - powf(b1, (float)t));
	const float c2 = 1.0f / (1.0f - powf(b2, (float)t));
	for (size_t i = 0; i < n; i++) {
		m[i] = b1 * m[i] + (1.0f - b1) * g[i];
		v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
		float mhat = m[i] * c1, vhat = v[i] * c2;
		p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
	}
}

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ULL;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
	return x ^ (x >> 31);
}

void tr_init_uniform_at(float *p, size_t n, uint64_t seed, uint64_t stream, uint64_t first,
                        float scale)
{
	const uint64_t key = splitmix64(seed ^ splitmix64(stream));
	for (size_t i = 0; i < n; i++) {
		/* 24 bits give u in [0, 1) exactly representable, so 2u - 1 is
		 * exact and |value| <= scale after the one rounding. */
		uint64_t h = splitmix64(key ^ splitmix64(first + i));
		float u = (float)(uint32_t)(h >> 40) * 0x1p-24f;
		p[i] = (2.0f * u - 1.0f) * scale;
	}
}

void tr_init_uniform(float *p, size_t n, uint64_t seed, uint64_t stream, float scale)
{
	tr_init_uniform_at(p, n, seed, stream, 0, scale);
}

uint64_t tr_fnv1a(uint64_t h, const void *data, size_t bytes)
{
	const unsigned char *b = data;
	for (size_t i = 0; i < bytes; i++) {
		h ^= b[i];
		h *= 0x100000001B3ULL;
	}
	return h;
}
