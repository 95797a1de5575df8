/* examples/trainer/ops.h: fp32 CPU kernels of the small MoE trainer.
 *
 * Every matrix is row-major float32. Every function is single-threaded,
 * keeps no state, allocates nothing, and adds in a fixed order with float
 * accumulators, so the same call on the same inputs gives bitwise-identical
 * outputs wherever the buffers lie in memory (the build must not contract
 * a*b+c into FMA differently in the scalar and vector paths: GCC's ISO C
 * modes, -std=c11, turn contraction off). Pointers are borrowed for the
 * call only; outputs must not overlap inputs unless a comment says so.
 * Sizes are positive and every element count (n*in, b*s*a*d, ...) fits in
 * an int.
 */
#ifndef KILN_TRAINER_OPS_H
#define KILN_TRAINER_OPS_H

#include <stddef.h>
#include <stdint.h>

#define TR_RMSNORM_EPS 1e-5f
#define TR_FNV_OFFSET 14695981039346656037ULL

/* y[n,out] = x[n,in] * w[in,out] (overwrites y). O(n*in*out). */
void tr_matmul(const float *x, const float *w, float *y, int n, int in, int out);
/* Backward of tr_matmul: dx[n,in] += dy * w^T (skipped when dx NULL);
 * dw[in,out] += x^T * dy (skipped when dw NULL). dy is [n,out]. */
void tr_matmul_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw, int n,
                   int in, int out);

/* RMSNorm, eps = TR_RMSNORM_EPS: y[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * g
 * (overwrites y). x and y are [n,h], g is [h]. */
void tr_rmsnorm(const float *x, const float *g, float *y, int n, int h);
/* Backward of tr_rmsnorm from dy[n,h]: dx[n,h] += dL/dx, dg[h] += dL/dg. */
void tr_rmsnorm_bwd(const float *x, const float *g, const float *dy, float *dx, float *dg, int n,
                    int h);

/* Causal multi-head attention with grouped KV heads ("flash" style: saves
 * only out and the log-sum-exp). b sequences of s tokens, token row
 * t = seq*s + pos. q is [b*s, a*d], k and v are [b*s, kv*d]; kv divides a
 * and query head j uses kv head j / (a/kv). scale = 1/sqrtf(d).
 * out [b*s, a*d] (overwritten): row t, head j = sum_{u<=pos} p_u v_u with
 * p = softmax over u<=pos of scale*q.k.
 * lse [a, b*s] (overwritten): lse[j*(b*s)+t] = log sum_{u<=pos} exp(scale*q.k).
 * scratch: at least s floats. O(b*a*s^2*d). */
void tr_attn(const float *q, const float *k, const float *v, float *out, float *lse, float *scratch,
             int b, int s, int a, int kv, int d);
/* Backward of tr_attn from q, k, v, its out and lse, and dout [b*s, a*d]
 * (probabilities are recomputed from lse): dq [b*s, a*d], dk and dv
 * [b*s, kv*d] are ACCUMULATED (+=). scratch: at least 2*s floats. */
void tr_attn_bwd(const float *q, const float *k, const float *v, const float *out, const float *lse,
                 const float *dout, float *dq, float *dk, float *dv, float *scratch, int b, int s,
                 int a, int kv, int d);

/* SwiGLU: up [n, 2f] holds gate (columns 0..f-1) then up (f..2f-1);
 * act[n,f] = silu(gate) * up, silu(z) = z / (1 + exp(-z)) (overwrites act). */
void tr_swiglu(const float *up, float *act, int n, int f);
/* Backward of tr_swiglu from dact [n,f]: dup [n,2f] (overwritten) holds
 * dL/dgate then dL/dup. */
void tr_swiglu_bwd(const float *up, const float *dact, float *dup, int n, int f);

/* Row softmax with max subtraction: y[n,c] = softmax(x[n,c]) (overwrites y;
 * y may equal x). */
void tr_softmax(const float *x, float *y, int n, int c);
/* Backward of tr_softmax from its output y and dy [n,c]:
 * dx[n,c] = y * (dy - sum(dy*y)) per row (overwritten). */
void tr_softmax_bwd(const float *y, const float *dy, float *dx, int n, int c);

/* Top-k per row of p[n,c], 1 <= k <= c: idx[n,k] (overwritten) lists column
 * indices in descending order of value, ties broken by the lower column
 * index. Values must not be NaN. O(n*k*c). */
void tr_topk(const float *p, int n, int c, int k, int32_t *idx);

/* Cross entropy of logits[n,v] against targets[n] (each in [0,v)): returns
 * the SUM over rows of -log softmax(logits)[target] (per row in float,
 * summed in double, rounded to float at the end). When dlogits [n,v] is not
 * NULL it is overwritten with (softmax - onehot) * grad_scale. */
float tr_xent(const float *logits, const int32_t *targets, int n, int v, float grad_scale,
              float *dlogits);

/* dst[i] += src[i] for i < n. */
void tr_add(float *dst, const float *src, size_t n);

/* AdamW step t (1-based) on n parameters p, with moments m and v updated in
 * place: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; mhat = m / (1-b1^t);
 * vhat = v / (1-b2^t); p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p). */
void tr_adamw(float *p, float *m, float *v, const float *g, size_t n, int t, float lr, float b1,
              float b2, float eps, float wd);

/* Deterministic init: p[i] (i < n) = a uniform value in [-scale, scale] (24
 * random bits) drawn from a splitmix64 hash of (seed, stream, i) alone, so
 * independent of call order and of how a tensor is split across calls. */
void tr_init_uniform(float *p, size_t n, uint64_t seed, uint64_t stream, float scale);
/* The same for elements first .. first+n-1 of the stream: p[i] gets the
 * value tr_init_uniform gives element first+i. */
void tr_init_uniform_at(float *p, size_t n, uint64_t seed, uint64_t stream, uint64_t first,
                        float scale);

/* 64-bit FNV-1a over bytes bytes of data, continuing from h (start with
 * TR_FNV_OFFSET). */
uint64_t tr_fnv1a(uint64_t h, const void *data, size_t bytes);

#endif
