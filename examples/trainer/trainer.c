/* examples/trainer/trainer.c: a CPU MoE trainer that embeds the kiln runtime.
 *
 * Four MPI processes train the model of trainer.h on bytes of a text file:
 * two pipeline stages run Megatron's 1F1B schedule, and inside each stage
 * two ranks dispatch and combine the routed tokens with MPI_Alltoallv. At
 * each MoE layer's post-gate point, once the ranks have exchanged how many
 * rows each local expert receives, the trainer asks kiln_rt_select for the
 * layer's plan and carries it out: a kept unit stays in the arena; a
 * recomputed one is freed at the end of the layer's forward and rebuilt by
 * re-running its forward op before the layer's backward; an offloaded one is
 * copied to the host pool by kiln's copy engine and reloaded before the
 * backward. Activations live in a capped arena (arena.h): going over it is
 * an out-of-memory failure that stops the job, as on a GPU.
 *
 * docs/trainer.md has the command line, the log format and what the tests
 * check; README "Embedding kiln in your trainer" walks through the calls. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "comm.h"
#include "kiln/runtime.h"
#include "ops.h"
#include "tools/output.h"
#include "trainer.h"

enum { EXIT_OK = 0, EXIT_INPUT = 1, EXIT_USAGE = 2, EXIT_OOM = 3, EXIT_GRAD = 4 };
enum { POLICY_KILN, POLICY_KEEP, POLICY_MIXED };
enum { UNIT_NONE, UNIT_HELD, UNIT_OFFLOADED };
#define TR_MAX_SPIKES 64
#define TR_MAX_STEPS 100000

static const char *const unit_names[TR_NU] = {
#define X(id, name, base, per_row) name,
    TR_UNITS(X)
#undef X
};
static const uint64_t unit_base[TR_NU] = {
#define X(id, name, base, per_row) (uint64_t)(base),
    TR_UNITS(X)
#undef X
};
static const uint64_t unit_per_row[TR_NU] = {
#define X(id, name, base, per_row) (uint64_t)(per_row),
    TR_UNITS(X)
#undef X
};

/* ---------------------------------------------------------------- state */

typedef struct unit_buf {
	void *p;
	uint64_t bytes;
	int state;          /* UNIT_* */
	uint32_t copy_buf;  /* copy engine buffer while offloaded */
	kiln_copy_event ev; /* its offload */
} unit_buf;

/* One micro-batch's pass through one layer: its units, the plan it got and
 * the routing facts the backward needs (host-side metadata, as Megatron
 * keeps tokens_per_expert on the host). */
typedef struct layer_run {
	unit_buf u[TR_NU];
	uint8_t action[TR_NU];
	int32_t send_cnt[TR_EP * TR_LE]; /* rows sent to (rank, local expert) */
	int32_t recv_cnt[TR_EP * TR_LE]; /* rows received from (rank, local expert) */
	int32_t n_rows;                  /* received rows */
	uint32_t group_rows[TR_EP];      /* rows every rank of the EP group receives */
	uint64_t resident_bytes;         /* kiln's bound on the units the plan keeps */
	uint32_t plan_flags;             /* KILN_PLAN_*; the bound holds without them
	                                    (GROUP_SLACK aside) */
} layer_run;

typedef struct layer_params {
	float *g1, *wq, *wk, *wv, *wo, *g2, *wr, *wup[TR_LE], *wdown[TR_LE];
} layer_params;

typedef struct param {
	float *w, *g, *m, *v;
	size_t n;
	int replicated; /* same on every rank of the stage: its gradient is all-reduced */
} param;

typedef struct spike {
	int32_t step;
	float fraction;
	int n_experts;
	int32_t experts[TR_TOPK];
} spike;

/* A load trace (docs/simulator.md, "Traces", with a factor column), as
 * kilnc simulate --emit-loads writes it: per (iteration, micro-batch, MoE
 * layer, EP rank) a load factor; a missing row is 1.0. */
typedef struct load_trace {
	int64_t first, span; /* iterations first .. first + span - 1 */
	int32_t layers;      /* layer indices below this; layer l replays l mod layers */
	float *factor;       /* [span][TR_M][layers][TR_EP]; negative: no row */
} load_trace;

typedef struct options {
	const char *plan, *data, *log, *unit_log, *loads;
	int policy;
	uint64_t arena_bytes; /* 0: the stage's budget from the blob */
	int32_t steps;
	uint64_t seed;
	spike spikes[TR_MAX_SPIKES];
	int n_spikes;
	int quiet;
	int grad_check;
	float lr;
} options;

typedef struct step_stats {
	uint64_t decisions, keep, recompute, offload, over_budget, beyond;
	uint64_t offloaded_bytes, recomputed_bytes, max_rows, resident_checks;
} step_stats;

typedef struct trainer {
	options opt;
	tr_comm *comm;
	tr_comm_info ci;
	kiln_rt *rt;
	kiln_copy *ce;
	tr_arena arena;
	param params[TR_STAGE_LAYERS * (7 + 2 * TR_LE) + 4];
	int n_params;
	layer_params lp[TR_STAGE_LAYERS];
	float *emb, *gf, *whead; /* stage 0 / last stage */
	layer_run runs[TR_M][TR_STAGE_LAYERS];
	void *head_norm_in[TR_M], *head_in[TR_M], *head_logits[TR_M];
	int32_t input[TR_M][TR_T], target[TR_M][TR_T];
	unsigned char *text;
	size_t text_len;
	int32_t step;
	uint32_t cur_pending;
	double loss_sum;
	step_stats st;
	kiln_out *unit_out, *log_out; /* the output rule (tools/output.h) */
	FILE *unit_log;               /* unit_out's stream */
	load_trace trace;
} trainer;

static const char *policy_name(int p)
{
	return p == POLICY_KEEP ? "keep" : p == POLICY_MIXED ? "mixed" : "kiln";
}

/* ---------------------------------------------------------------- errors */

static trainer *g_tr; /* for messages */

static _Noreturn void fail(int code, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "kiln-trainer: ");
	if (g_tr && g_tr->comm)
		fprintf(stderr, "rank %d (stage %d): ", g_tr->ci.rank, g_tr->ci.stage);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (g_tr && g_tr->comm)
		tr_comm_abort(g_tr->comm, code);
	exit(code);
}

/* Releases everything the trainer holds and finalises MPI. */
static void finish(trainer *tr)
{
	/* Outputs not committed by now belong to a failed run: the files stay
	 * as they were. */
	kiln_out_discard(tr->unit_out);
	kiln_out_discard(tr->log_out);
	tr->unit_out = tr->log_out = NULL;
	tr->unit_log = NULL;
	kiln_copy_close(tr->ce);
	tr->ce = NULL;
	kiln_rt_close(tr->rt);
	tr->rt = NULL;
	for (int i = 0; i < tr->n_params; i++) {
		free(tr->params[i].w);
		free(tr->params[i].g);
		free(tr->params[i].m);
		free(tr->params[i].v);
	}
	tr->n_params = 0;
	free(tr->text);
	tr->text = NULL;
	free(tr->trace.factor);
	tr->trace.factor = NULL;
	if (tr->comm)
		tr_comm_finish(tr->comm);
	tr->comm = NULL;
}

/* For errors every rank meets alike before training starts (arguments, the
 * plan, the text): rank 0 says why once, and every rank leaves with code. */
static _Noreturn void fail_all(int code, const char *fmt, ...)
{
	if (!g_tr || !g_tr->comm || g_tr->ci.rank == 0) {
		va_list ap;
		fprintf(stderr, "kiln-trainer: ");
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fputc('\n', stderr);
	}
	if (g_tr)
		finish(g_tr);
	exit(code);
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (!p)
		fail(EXIT_INPUT, "out of host memory");
	return p;
}

/* ---------------------------------------------------------------- arena */

/* The runtime's accounting API sees every arena event, so that at each
 * decision its device bytes can be checked against the arena's. */
static void acct(trainer *tr, uint32_t mb, kiln_acct_event ev, uint64_t bytes)
{
	int rc = kiln_rt_acct_record(tr->rt, mb, ev, bytes);
	if (rc)
		fail(EXIT_INPUT, "internal error: kiln_rt_acct_record: %s", kiln_rt_strerror(rc));
}

static void *act_alloc_as(trainer *tr, uint32_t mb, uint64_t bytes, int32_t layer, const char *what,
                          kiln_acct_event ev)
{
	void *p = tr_arena_alloc(&tr->arena, mb, bytes);
	if (!p)
		fail(EXIT_OOM,
		     "out of memory: step %d micro-batch %u layer %d %s needs %" PRIu64
		     " bytes; the activation arena holds %" PRIu64 " of its %" PRIu64
		     " bytes (policy %s%s)",
		     tr->step, mb, layer, what, bytes, tr->arena.used_bytes, tr->arena.cap_bytes,
		     policy_name(tr->opt.policy),
		     tr->st.over_budget ? "; kiln returned plans over budget this step" : "");
	acct(tr, mb, ev, bytes);
	return p;
}

/* Bytes written on the device. */
static void *act_alloc(trainer *tr, uint32_t mb, uint64_t bytes, int32_t layer, const char *what)
{
	return act_alloc_as(tr, mb, bytes, layer, what, KILN_ACCT_PRODUCED);
}

/* ---------------------------------------------------------------- data */

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint64_t hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
	return mix(mix(mix(mix(a) ^ b) ^ c) ^ d);
}

/* Micro-batch mb of this step for this replica: TR_B windows of S + 1 bytes
 * at offsets drawn from the seed, so that every stage derives the same
 * batch; inputs are the first S bytes, targets the next S. */
static void load_batch(trainer *tr, uint32_t mb)
{
	for (int b = 0; b < TR_B; b++) {
		uint64_t h = hash4(tr->opt.seed, (uint64_t)tr->step,
		                   (uint64_t)tr->ci.dp * TR_M + mb, (uint64_t)b);
		size_t off = (size_t)(h % (tr->text_len - TR_S));
		for (int i = 0; i < TR_S; i++) {
			tr->input[mb][b * TR_S + i] = tr->text[off + (size_t)i];
			tr->target[mb][b * TR_S + i] = tr->text[off + (size_t)i + 1];
		}
	}
}

static void read_text(trainer *tr)
{
	FILE *f = fopen(tr->opt.data, "rb");
	if (!f)
		fail_all(EXIT_INPUT, "cannot read training text %s: %s", tr->opt.data,
		         strerror(errno));
	size_t cap = 1 << 16, len = 0;
	unsigned char *buf = xcalloc(cap, 1);
	size_t n;
	while ((n = fread(buf + len, 1, cap - len, f)) > 0) {
		len += n;
		if (len == cap) {
			if (cap >= (size_t)1 << 30)
				break;
			unsigned char *b = realloc(buf, cap * 2);
			if (!b)
				fail(EXIT_INPUT, "out of host memory");
			buf = b;
			cap *= 2;
		}
	}
	int err = ferror(f);
	fclose(f);
	if (err)
		fail_all(EXIT_INPUT, "cannot read training text %s", tr->opt.data);
	if (len < 4 * TR_S)
		fail_all(EXIT_INPUT, "training text %s has %zu bytes; it needs at least %d",
		         tr->opt.data, len, 4 * TR_S);
	tr->text = buf;
	tr->text_len = len;
}

/* ---------------------------------------------------------------- parameters */

/* A parameter with its gradient and Adam moments, drawn from the seed and
 * a stream that names it model-wide, so replicas start equal. */
static float *add_param(trainer *tr, size_t n, uint64_t stream, float scale, int replicated)
{
	param *p = &tr->params[tr->n_params++];
	p->n = n;
	p->replicated = replicated;
	p->w = xcalloc(n, sizeof(float));
	p->g = xcalloc(n, sizeof(float));
	p->m = xcalloc(n, sizeof(float));
	p->v = xcalloc(n, sizeof(float));
	if (scale > 0)
		tr_init_uniform(p->w, n, tr->opt.seed, stream, scale);
	else
		for (size_t i = 0; i < n; i++)
			p->w[i] = 1.0f;
	return p->w;
}

/* The gradient buffer of the parameter whose weights are w. */
static float *grad_of(trainer *tr, const float *w)
{
	for (int i = 0; i < tr->n_params; i++)
		if (tr->params[i].w == w)
			return tr->params[i].g;
	fail(EXIT_INPUT, "internal error: unknown parameter");
}

static void init_params(trainer *tr)
{
	const float s_h = 1.0f / sqrtf((float)TR_H);
	const float s_a = 1.0f / sqrtf((float)(TR_NH * TR_HD));
	const float s_f = 1.0f / sqrtf((float)TR_FE);
	for (int li = 0; li < TR_STAGE_LAYERS; li++) {
		uint64_t l = (uint64_t)(tr->ci.stage * TR_STAGE_LAYERS + li);
		layer_params *P = &tr->lp[li];
		uint64_t base = (l + 1) << 16;
		P->g1 = add_param(tr, TR_H, base + 1, 0, 1);
		P->wq = add_param(tr, (size_t)TR_H * TR_NH * TR_HD, base + 2, s_h, 1);
		P->wk = add_param(tr, (size_t)TR_H * TR_NKV * TR_HD, base + 3, s_h, 1);
		P->wv = add_param(tr, (size_t)TR_H * TR_NKV * TR_HD, base + 4, s_h, 1);
		P->wo = add_param(tr, (size_t)TR_NH * TR_HD * TR_H, base + 5, s_a, 1);
		P->g2 = add_param(tr, TR_H, base + 6, 0, 1);
		P->wr = add_param(tr, (size_t)TR_H * TR_E, base + 7, s_h, 1);
		for (int e = 0; e < TR_LE; e++) {
			uint64_t ge = (uint64_t)(tr->ci.dp * TR_LE + e);
			P->wup[e] =
			    add_param(tr, (size_t)TR_H * 2 * TR_FE, base + 256 + ge, s_h, 0);
			P->wdown[e] = add_param(tr, (size_t)TR_FE * TR_H, base + 512 + ge, s_f, 0);
		}
	}
	if (tr->ci.stage == 0)
		tr->emb = add_param(tr, (size_t)TR_V * TR_H, 1, 1.0f, 1);
	if (tr->ci.stage == tr->ci.pp - 1) {
		tr->gf = add_param(tr, TR_H, 2, 0, 1);
		tr->whead = add_param(tr, (size_t)TR_H * TR_V, 3, s_h, 1);
	}
}

/* ---------------------------------------------------------------- routing */

/* The experts token t of micro-batch mb goes to at layer: the top-k of its
 * probabilities, unless the spike injector sends it elsewhere (decided by
 * a hash of the step, micro-batch, layer and token, so that the backward
 * derives the same routing from the saved probabilities). */
static void route_token(const trainer *tr, uint32_t mb, int32_t layer, int t, const float *probs,
                        int32_t *out)
{
	tr_topk(probs + (size_t)t * TR_E, 1, TR_E, TR_TOPK, out);
	for (int i = 0; i < tr->opt.n_spikes; i++) {
		const spike *sp = &tr->opt.spikes[i];
		if (sp->step != tr->step)
			continue;
		uint64_t h = hash4(tr->opt.seed ^ 0x5b1e, (uint64_t)tr->step,
		                   ((uint64_t)tr->ci.dp * TR_M + mb) * TR_LAYERS + (uint64_t)layer,
		                   (uint64_t)t);
		if ((double)(h >> 11) * 0x1.0p-53 >= (double)sp->fraction)
			continue;
		/* The spike's experts first, then the token's own best others
		 * (its top k hold at least k - (spike experts) others). */
		int32_t pick[TR_TOPK], n = 0;
		for (int j = 0; j < sp->n_experts && n < TR_TOPK; j++)
			pick[n++] = sp->experts[j];
		for (int j = 0; j < TR_TOPK && n < TR_TOPK; j++) {
			int dup = 0;
			for (int q = 0; q < n; q++)
				dup |= pick[q] == out[j];
			if (!dup)
				pick[n++] = out[j];
		}
		memcpy(out, pick, sizeof pick);
		return;
	}
	if (!tr->trace.factor)
		return;
	/* A load trace: the hotter EP rank of this (step, micro-batch, layer)
	 * gets both rows of a fraction f - 1 of the tokens (its two experts
	 * the token ranks highest), so that its load comes to about f. */
	const load_trace *lt = &tr->trace;
	int64_t it = (tr->step - 1) % lt->span;
	const float *f =
	    lt->factor +
	    (((size_t)it * TR_M + mb) * (size_t)lt->layers + (size_t)(layer % lt->layers)) * TR_EP;
	int hot = 0;
	for (int r = 1; r < TR_EP; r++)
		if ((f[r] < 0 ? 1.0f : f[r]) > (f[hot] < 0 ? 1.0f : f[hot]))
			hot = r;
	double frac = (f[hot] < 0 ? 1.0 : (double)f[hot]) - 1.0;
	uint64_t h =
	    hash4(tr->opt.seed ^ 0x10ad, (uint64_t)tr->step,
	          ((uint64_t)tr->ci.dp * TR_M + mb) * TR_LAYERS + (uint64_t)layer, (uint64_t)t);
	if (!(frac > 0) || (double)(h >> 11) * 0x1.0p-53 >= frac)
		return;
	int32_t local[TR_LE];
	tr_topk(probs + (size_t)t * TR_E + (size_t)hot * TR_LE, 1, TR_LE, TR_TOPK, local);
	for (int j = 0; j < TR_TOPK; j++)
		out[j] = hot * TR_LE + local[j];
}

/* Per (token, choice) its expert and its row in the send buffer (rows
 * grouped by global expert, which groups them by destination rank). */
static void plan_dispatch(const trainer *tr, uint32_t mb, int32_t layer, const float *probs,
                          int32_t *expert, int32_t *pos, int32_t *send_cnt)
{
	int32_t cnt[TR_E] = {0}, start[TR_E];
	for (int t = 0; t < TR_T; t++) {
		route_token(tr, mb, layer, t, probs, expert + t * TR_TOPK);
		for (int j = 0; j < TR_TOPK; j++)
			cnt[expert[t * TR_TOPK + j]]++;
	}
	int32_t off = 0;
	for (int e = 0; e < TR_E; e++) {
		start[e] = off;
		off += cnt[e];
		send_cnt[e] = cnt[e]; /* global expert e = rank e / LE, local e % LE */
	}
	for (int t = 0; t < TR_T; t++)
		for (int j = 0; j < TR_TOPK; j++)
			pos[t * TR_TOPK + j] = start[expert[t * TR_TOPK + j]]++;
}

/* Rows per local expert, and where each (source rank, local expert) block
 * starts in the received (source-major) order. */
static void recv_layout(const layer_run *r, int32_t *per_expert, int32_t *src_start)
{
	int32_t off = 0;
	for (int e = 0; e < TR_LE; e++)
		per_expert[e] = 0;
	for (int s = 0; s < TR_EP; s++)
		for (int e = 0; e < TR_LE; e++) {
			src_start[s * TR_LE + e] = off;
			off += r->recv_cnt[s * TR_LE + e];
			per_expert[e] += r->recv_cnt[s * TR_LE + e];
		}
}

/* Floats each EP rank gets from this one (send) and sends to it (recv) when
 * every routed row carries width floats. */
static void row_counts(const layer_run *r, int width, int32_t *send, int32_t *recv)
{
	for (int s = 0; s < TR_EP; s++) {
		send[s] = recv[s] = 0;
		for (int e = 0; e < TR_LE; e++) {
			send[s] += r->send_cnt[s * TR_LE + e] * width;
			recv[s] += r->recv_cnt[s * TR_LE + e] * width;
		}
	}
}

/* ---------------------------------------------------------------- units */

static uint64_t unit_bytes(const layer_run *r, int u)
{
	return unit_base[u] + unit_per_row[u] * (uint64_t)r->n_rows;
}

static float *U(layer_run *r, int u)
{
	return (float *)r->u[u].p;
}

/* Bytes for a unit of micro-batch mb, counted in the arena. */
static void unit_alloc(trainer *tr, uint32_t mb, int32_t layer, layer_run *r, int u)
{
	uint64_t b = unit_bytes(r, u);
	r->u[u].p = act_alloc(tr, mb, b, layer, unit_names[u]);
	r->u[u].bytes = b;
	r->u[u].state = UNIT_HELD;
}

/* Releases an arena block, checking that nothing wrote past it. */
static void act_free_as(trainer *tr, uint32_t mb, void *p, uint64_t bytes, const char *what,
                        kiln_acct_event ev)
{
	if (!p)
		return;
	if (tr_arena_free(&tr->arena, mb, p, bytes))
		fail(EXIT_INPUT,
		     "internal error: a write ran past the end of %s (%" PRIu64 " bytes)", what,
		     bytes);
	acct(tr, mb, ev, bytes);
}

static void act_free(trainer *tr, uint32_t mb, void *p, uint64_t bytes, const char *what)
{
	act_free_as(tr, mb, p, bytes, what, KILN_ACCT_FREED);
}

/* Fails unless unit u's tensor filled its arena block: every word written. */
static void check_filled(const layer_run *r, int u)
{
	uint64_t n = tr_arena_unwritten(r->u[u].p, r->u[u].bytes);
	if (n)
		fail(EXIT_INPUT,
		     "internal error: %s holds %" PRIu64 " bytes but %" PRIu64
		     " of its words were never written",
		     unit_names[u], r->u[u].bytes, n);
}

static void unit_free(trainer *tr, uint32_t mb, layer_run *r, int u)
{
	act_free(tr, mb, r->u[u].p, r->u[u].bytes, unit_names[u]);
	r->u[u].p = NULL;
	r->u[u].state = UNIT_NONE;
}

/* Scratch one produce call needs beyond its unit (at most one block): from
 * the arena during a recompute, where it is part of the transient kiln
 * reserves, from the heap in the forward, like the forward's other scratch. */
typedef struct workspace {
	trainer *tr;
	uint32_t mb;
	int32_t layer;
	int arena;
	float *p;
	uint64_t bytes;
} workspace;

static float *ws_get(workspace *w, uint64_t bytes)
{
	w->bytes = bytes;
	w->p = w->arena ? act_alloc(w->tr, w->mb, bytes, w->layer, "recompute workspace")
	                : xcalloc(1, (size_t)bytes);
	return w->p;
}

static void ws_put(workspace *w)
{
	if (w->arena)
		act_free(w->tr, w->mb, w->p, w->bytes, "recompute workspace");
	else
		free(w->p);
	w->p = NULL;
}

/* Computes unit u of micro-batch mb at layer li from its sources, which are
 * held: the forward and a recompute run this same code on the same bytes,
 * so a recomputed unit equals the original bit for bit. */
/* The routing of micro-batch mb's layer again, from its saved
 * probabilities, for a backward or a recompute (where says which): it must
 * send the rows the forward sent. */
static void replay_routing(const trainer *tr, uint32_t mb, int32_t layer, layer_run *r,
                           int32_t *expert, int32_t *pos, const char *where)
{
	int32_t send_cnt[TR_EP * TR_LE];
	plan_dispatch(tr, mb, layer, U(r, TR_U_PROBS), expert, pos, send_cnt);
	if (memcmp(send_cnt, r->send_cnt, sizeof send_cnt))
		fail(EXIT_INPUT,
		     "internal error: layer %d of micro-batch %u routes differently in its %s",
		     layer, mb, where);
}

/* The dispatch all-to-all: the rows of moe.in in send order (pos, from
 * plan_dispatch) to their experts' ranks. recvbuf gets this rank's rows in
 * received (source-major) order; sc and rc the floats sent to and received
 * from each rank. A collective: every rank of the EP group calls it. */
static void dispatch(trainer *tr, layer_run *r, const int32_t *pos, float *sendbuf, float *recvbuf,
                     int32_t *sc, int32_t *rc)
{
	for (int t = 0; t < TR_T; t++)
		for (int j = 0; j < TR_TOPK; j++)
			memcpy(sendbuf + (size_t)pos[t * TR_TOPK + j] * TR_H,
			       U(r, TR_U_MOE_IN) + (size_t)t * TR_H, 4u * TR_H);
	row_counts(r, TR_H, sc, rc);
	tr_comm_alltoallv(tr->comm, sendbuf, sc, recvbuf, rc);
}

/* moe.expert_in from the received rows: expert-major row i is received row
 * perm[i]. */
static void expert_rows(layer_run *r, const float *recvbuf)
{
	const int32_t *perm = (const int32_t *)r->u[TR_U_PERM].p;
	for (int32_t i = 0; i < r->n_rows; i++)
		memcpy(U(r, TR_U_EIN) + (size_t)i * TR_H, recvbuf + (size_t)perm[i] * TR_H,
		       4u * TR_H);
}

static void produce(trainer *tr, uint32_t mb, int li, int u, int recompute)
{
	layer_run *r = &tr->runs[mb][li];
	const layer_params *P = &tr->lp[li];
	int32_t layer = tr->ci.stage * TR_STAGE_LAYERS + li;
	unit_alloc(tr, mb, layer, r, u);
	workspace ws = {.tr = tr, .mb = mb, .layer = layer, .arena = recompute};
	switch (u) {
	case TR_U_QKV_IN:
		tr_rmsnorm(U(r, TR_U_LN1_IN), P->g1, U(r, u), TR_T, TR_H);
		break;
	case TR_U_Q:
		tr_matmul(U(r, TR_U_QKV_IN), P->wq, U(r, u), TR_T, TR_H, TR_NH * TR_HD);
		break;
	case TR_U_K:
		tr_matmul(U(r, TR_U_QKV_IN), P->wk, U(r, u), TR_T, TR_H, TR_NKV * TR_HD);
		break;
	case TR_U_V:
		tr_matmul(U(r, TR_U_QKV_IN), P->wv, U(r, u), TR_T, TR_H, TR_NKV * TR_HD);
		break;
	case TR_U_OUT:
	case TR_U_LSE: {
		/* One op writes both: the forward makes both units, a recompute
		 * makes the other too when the plan recomputes it, and otherwise
		 * writes it to workspace (the held copy is left as it is). */
		int other = u == TR_U_OUT ? TR_U_LSE : TR_U_OUT;
		float *o;
		if (r->u[other].state != UNIT_HELD &&
		    (!recompute || r->action[other] == KILN_RT_RECOMPUTE)) {
			unit_alloc(tr, mb, layer, r, other);
			o = U(r, other);
		} else {
			o = ws_get(&ws, unit_bytes(r, other));
		}
		float scratch[2 * TR_S];
		float *out = u == TR_U_OUT ? U(r, u) : o, *lse = u == TR_U_OUT ? o : U(r, u);
		tr_attn(U(r, TR_U_Q), U(r, TR_U_K), U(r, TR_U_V), out, lse, scratch, TR_B, TR_S,
		        TR_NH, TR_NKV, TR_HD);
		break;
	}
	case TR_U_LN2_IN: {
		float *proj = ws_get(&ws, 4ull * TR_T * TR_H);
		tr_matmul(U(r, TR_U_OUT), P->wo, proj, TR_T, TR_NH * TR_HD, TR_H);
		const float *x = U(r, TR_U_LN1_IN);
		float *y = U(r, u);
		for (size_t i = 0; i < (size_t)TR_T * TR_H; i++)
			y[i] = x[i] + proj[i];
		break;
	}
	case TR_U_MOE_IN:
		tr_rmsnorm(U(r, TR_U_LN2_IN), P->g2, U(r, u), TR_T, TR_H);
		break;
	case TR_U_PROBS: {
		float *logits = ws_get(&ws, 4ull * TR_T * TR_E);
		tr_matmul(U(r, TR_U_MOE_IN), P->wr, logits, TR_T, TR_H, TR_E);
		tr_softmax(logits, U(r, u), TR_T, TR_E);
		break;
	}
	case TR_U_PERM: {
		/* Expert-major row i comes from received row perm[i]. */
		int32_t per_expert[TR_LE], src_start[TR_EP * TR_LE], *perm = (int32_t *)r->u[u].p;
		recv_layout(r, per_expert, src_start);
		int32_t i = 0;
		for (int e = 0; e < TR_LE; e++)
			for (int s = 0; s < TR_EP; s++)
				for (int32_t k = 0; k < r->recv_cnt[s * TR_LE + e]; k++)
					perm[i++] = src_start[s * TR_LE + e] + k;
		break;
	}
	case TR_U_EUP:
	case TR_U_EOUT: {
		int32_t per_expert[TR_LE], src_start[TR_EP * TR_LE], off = 0;
		recv_layout(r, per_expert, src_start);
		for (int e = 0; e < TR_LE; e++) {
			if (u == TR_U_EUP)
				tr_matmul(U(r, TR_U_EIN) + (size_t)off * TR_H, P->wup[e],
				          U(r, u) + (size_t)off * 2 * TR_FE, per_expert[e], TR_H,
				          2 * TR_FE);
			else
				tr_matmul(U(r, TR_U_EACT) + (size_t)off * TR_FE, P->wdown[e],
				          U(r, u) + (size_t)off * TR_H, per_expert[e], TR_FE, TR_H);
			off += per_expert[e];
		}
		break;
	}
	case TR_U_EACT:
		tr_swiglu(U(r, TR_U_EUP), U(r, u), r->n_rows, TR_FE);
		break;
	case TR_U_EIN: {
		/* Only a recompute comes here (the forward's dispatch makes the
		 * unit in layer_forward): the dispatch is re-run, a collective
		 * that every rank of the EP group runs at this point of the same
		 * backward, because every rank recomputes expert_in alike: under
		 * the group's fallback (the same plan on every rank, a function
		 * of the group's counts; docs/runtime.md) or --policy mixed (a
		 * function of the step, micro-batch, layer and unit only). */
		int32_t expert[TR_T * TR_TOPK], pos[TR_T * TR_TOPK];
		replay_routing(tr, mb, layer, r, expert, pos, "recompute");
		float *sendbuf = xcalloc((size_t)TR_T * TR_TOPK * TR_H, sizeof(float));
		float *recvbuf = xcalloc((size_t)r->n_rows * TR_H + 1, sizeof(float));
		int32_t sc[TR_EP], rc[TR_EP];
		dispatch(tr, r, pos, sendbuf, recvbuf, sc, rc);
		expert_rows(r, recvbuf);
		free(sendbuf);
		free(recvbuf);
		break;
	}
	default:
		/* ln1.in is the layer's input: kiln never plans to recompute it. */
		fail(EXIT_INPUT, "internal error: unit %s cannot be produced here", unit_names[u]);
	}
	ws_put(&ws);
}

/* ---------------------------------------------------------------- decision */

/* Forward ops this stage starts before its next backward frees memory: the
 * micro-batches a decision keeps room for (1F1B warm-up). */
static uint32_t pending_after(const int8_t *is_fwd, int n_ops, int at)
{
	uint32_t n = 0;
	for (int i = at + 1; i < n_ops && is_fwd[i]; i++)
		n++;
	return n;
}

/* The post-gate point: the real rows per local expert are known. Asks kiln
 * for the layer's plan (or keeps everything under --policy keep). */
static void decide(trainer *tr, uint32_t mb, int li)
{
	layer_run *r = &tr->runs[mb][li];
	int32_t layer = tr->ci.stage * TR_STAGE_LAYERS + li;
	/* kiln's accounting, fed every arena event, must agree with the arena. */
	kiln_acct ac;
	kiln_rt_acct_get(tr->rt, &ac);
	if (ac.device_bytes != tr->arena.used_bytes)
		fail(EXIT_INPUT,
		     "internal error: kiln's accounting holds %" PRIu64
		     " device bytes, the arena %" PRIu64,
		     ac.device_bytes, tr->arena.used_bytes);
	if (tr->opt.policy == POLICY_KEEP) {
		memset(r->action, KILN_RT_KEEP, sizeof r->action);
		return;
	}
	if (tr->opt.policy == POLICY_MIXED) {
		/* Every action on every unit in turn, for the tests: each recompute
		 * and reload path, alone and in combination. */
		for (int u = 0; u < TR_NU; u++) {
			int a = (u + (int)mb + layer + tr->step) % 3;
			if (a == KILN_RT_RECOMPUTE && u == TR_U_LN1_IN)
				a = KILN_RT_OFFLOAD;
			r->action[u] = (uint8_t)a;
			tr->st.keep += a == KILN_RT_KEEP;
			tr->st.recompute += a == KILN_RT_RECOMPUTE;
			tr->st.offload += a == KILN_RT_OFFLOAD;
		}
		return;
	}
	uint32_t rows[TR_LE];
	int32_t per_expert[TR_LE], src_start[TR_EP * TR_LE];
	recv_layout(r, per_expert, src_start);
	for (int e = 0; e < TR_LE; e++)
		rows[e] = (uint32_t)per_expert[e];
	/* The units made before the gate are this decision's to place: they
	 * count as free room for it, not as held. */
	uint64_t made = 0;
	for (int u = 0; u < TR_NU; u++)
		if (r->u[u].state == UNIT_HELD)
			made += r->u[u].bytes;
	/* The head's activations (the last stage's fixed bytes) come after the
	 * layers: the micro-batch will hold them, so they count as held and are
	 * kept free. */
	uint64_t head = tr->ci.stage == tr->ci.pp - 1
	                    ? TR_HEAD_NORM_IN_BYTES + TR_HEAD_IN_BYTES + TR_HEAD_LOGITS_BYTES
	                    : 0;
	uint64_t free_now = tr_arena_free_bytes(&tr->arena) + made;
	kiln_query q = {.stage = tr->ci.stage,
	                .layer = layer,
	                .tokens = rows,
	                .n_tokens = TR_LE,
	                .free_bytes = free_now > head ? free_now - head : 0,
	                .pending = tr->cur_pending,
	                .microbatch = mb,
	                .held_bytes = tr->arena.mb_bytes[mb % TR_ARENA_MB_SLOTS] - made + head,
	                .group_rows = r->group_rows,
	                .group_size = TR_EP};
	kiln_plan p;
	int rc = kiln_rt_select(tr->rt, &q, &p);
	if (rc)
		fail(EXIT_INPUT, "kiln_rt_select(stage %d, layer %d): %s", q.stage, layer,
		     kiln_rt_strerror(rc));
	if (p.n_units != TR_NU)
		fail(EXIT_INPUT, "plan for layer %d has %d units, the trainer has %d", layer,
		     p.n_units, TR_NU);
	for (int u = 0; u < TR_NU; u++) {
		r->action[u] = p.actions[u];
		/* expert_in is rebuilt by re-running the dispatch, a collective:
		 * only the group's fallback may ask for it, since only then does
		 * every rank of the group ask alike (docs/trainer.md). */
		if (r->action[u] == KILN_RT_RECOMPUTE &&
		    (u == TR_U_LN1_IN || (u == TR_U_EIN && !(p.flags & KILN_PLAN_GROUP_FALLBACK))))
			fail(EXIT_INPUT,
			     "plan %d recomputes %s, which only a collective or the previous "
			     "layer can rebuild",
			     p.plan, unit_names[u]);
		tr->st.keep += r->action[u] == KILN_RT_KEEP;
		tr->st.recompute += r->action[u] == KILN_RT_RECOMPUTE;
		tr->st.offload += r->action[u] == KILN_RT_OFFLOAD;
	}
	r->resident_bytes = p.resident_bytes;
	r->plan_flags = p.flags;
	tr->st.decisions++;
	tr->st.over_budget += (p.flags & KILN_PLAN_OVER_BUDGET) != 0;
	tr->st.beyond += (p.flags & KILN_PLAN_LOAD_BEYOND) != 0;
}

/* ---------------------------------------------------------------- layer forward */

/* The layer's forward for micro-batch mb: x [T,H] in, y [T,H] out (heap). */
static void layer_forward(trainer *tr, uint32_t mb, int li, const float *x, float *y)
{
	layer_run *r = &tr->runs[mb][li];
	int32_t layer = tr->ci.stage * TR_STAGE_LAYERS + li;
	memset(r, 0, sizeof *r);
	r->n_rows = 0;
	unit_alloc(tr, mb, layer, r, TR_U_LN1_IN);
	memcpy(U(r, TR_U_LN1_IN), x, 4u * TR_T * TR_H);
	for (int u = TR_U_QKV_IN; u <= TR_U_PROBS; u++)
		if (r->u[u].state != UNIT_HELD)
			produce(tr, mb, li, u, 0);

	/* The gate: routing, then how many rows each local expert receives. */
	int32_t expert[TR_T * TR_TOPK], pos[TR_T * TR_TOPK];
	plan_dispatch(tr, mb, layer, U(r, TR_U_PROBS), expert, pos, r->send_cnt);
	tr_comm_alltoall_int(tr->comm, r->send_cnt, r->recv_cnt, TR_LE);
	for (int i = 0; i < TR_EP * TR_LE; i++)
		r->n_rows += r->recv_cnt[i];
	/* Every rank's rows, so that the whole group takes the same decision
	 * (kiln_query.group_rows); gathered whatever the policy, so that the
	 * ranks' calls match. */
	tr_comm_allgather_u32(tr->comm, (uint32_t)r->n_rows, r->group_rows);
	if ((uint64_t)r->n_rows > tr->st.max_rows)
		tr->st.max_rows = (uint64_t)r->n_rows;
	decide(tr, mb, li);

	float *sendbuf = xcalloc((size_t)TR_T * TR_TOPK * TR_H, sizeof(float));
	float *recvbuf = xcalloc((size_t)r->n_rows * TR_H + 1, sizeof(float));
	int32_t sc[TR_EP], rc[TR_EP];
	dispatch(tr, r, pos, sendbuf, recvbuf, sc, rc);
	produce(tr, mb, li, TR_U_PERM, 0);
	unit_alloc(tr, mb, layer, r, TR_U_EIN);
	expert_rows(r, recvbuf);
	produce(tr, mb, li, TR_U_EUP, 0);
	produce(tr, mb, li, TR_U_EACT, 0);
	produce(tr, mb, li, TR_U_EOUT, 0);

	/* Combine: expert outputs back to the tokens' ranks, in send order. */
	const int32_t *perm = (const int32_t *)r->u[TR_U_PERM].p;
	for (int32_t i = 0; i < r->n_rows; i++)
		memcpy(recvbuf + (size_t)perm[i] * TR_H, U(r, TR_U_EOUT) + (size_t)i * TR_H,
		       4u * TR_H);
	tr_comm_alltoallv(tr->comm, recvbuf, rc, sendbuf, sc);
	const float *probs = U(r, TR_U_PROBS), *x1 = U(r, TR_U_LN2_IN);
	for (int t = 0; t < TR_T; t++) {
		float *yt = y + (size_t)t * TR_H;
		memcpy(yt, x1 + (size_t)t * TR_H, 4u * TR_H);
		for (int j = 0; j < TR_TOPK; j++) {
			float w = probs[(size_t)t * TR_E + (size_t)expert[t * TR_TOPK + j]];
			const float *row = sendbuf + (size_t)pos[t * TR_TOPK + j] * TR_H;
			for (int h = 0; h < TR_H; h++)
				yt[h] += w * row[h];
		}
	}
	free(sendbuf);
	free(recvbuf);

	/* The plan: the unit log records what the arena held for each unit;
	 * recomputed units go now, offloaded ones once their copy is done. */
	for (int u = 0; u < TR_NU; u++)
		check_filled(r, u);
	if (tr->unit_log)
		for (int u = 0; u < TR_NU; u++)
			fprintf(tr->unit_log, "%d %u %d %d %s %d %" PRIu64 " %d\n", tr->step, mb,
			        layer, u, unit_names[u], r->n_rows, r->u[u].bytes, r->action[u]);
	for (int u = 0; u < TR_NU; u++) {
		if (r->action[u] == KILN_RT_RECOMPUTE) {
			tr->st.recomputed_bytes += r->u[u].bytes;
			unit_free(tr, mb, r, u);
		} else if (r->action[u] == KILN_RT_OFFLOAD) {
			int rc2 = kiln_copy_offload(tr->ce, r->u[u].p, (size_t)r->u[u].bytes,
			                            &r->u[u].copy_buf, &r->u[u].ev);
			if (rc2)
				fail(EXIT_OOM,
				     "out of memory: step %d micro-batch %u layer %d: offload of "
				     "%s (%" PRIu64
				     " bytes) refused by the copy engine's host pool: %s",
				     tr->step, mb, layer, unit_names[u], r->u[u].bytes,
				     kiln_rt_strerror(rc2));
			tr->st.offloaded_bytes += r->u[u].bytes;
		}
	}
	for (int u = 0; u < TR_NU; u++) {
		if (r->action[u] != KILN_RT_OFFLOAD)
			continue;
		int rc2 = kiln_copy_wait(tr->ce, r->u[u].ev);
		if (rc2)
			fail(EXIT_INPUT, "offload of %s: %s", unit_names[u], kiln_rt_strerror(rc2));
		act_free_as(tr, mb, r->u[u].p, r->u[u].bytes, unit_names[u], KILN_ACCT_OFFLOADED);
		r->u[u].p = NULL;
		r->u[u].state = UNIT_OFFLOADED;
	}
	/* What the plan keeps is within what kiln said it would keep (the bound
	 * holds without OVER_BUDGET, LOAD_BEYOND and GROUP_FALLBACK; step 8's
	 * GROUP_SLACK only saves more). */
	if (tr->opt.policy == POLICY_KILN && !(r->plan_flags & ~(uint32_t)KILN_PLAN_GROUP_SLACK)) {
		uint64_t kept = 0;
		for (int u = 0; u < TR_NU; u++)
			kept += r->u[u].state == UNIT_HELD ? r->u[u].bytes : 0;
		if (kept > r->resident_bytes)
			fail(EXIT_INPUT,
			     "internal error: layer %d keeps %" PRIu64 " bytes, above the %" PRIu64
			     " kiln_rt_select promised",
			     layer, kept, r->resident_bytes);
		tr->st.resident_checks++;
	}
}

/* ---------------------------------------------------------------- layer backward */

/* Brings back what the plan sent away, in unit order (a recompute's sources
 * come earlier in the order, so they are back first). */
static void restore(trainer *tr, uint32_t mb, int li)
{
	layer_run *r = &tr->runs[mb][li];
	int32_t layer = tr->ci.stage * TR_STAGE_LAYERS + li;
	kiln_copy_event ev[TR_NU] = {0};
	for (int u = 0; u < TR_NU; u++) {
		if (r->u[u].state != UNIT_OFFLOADED)
			continue;
		r->u[u].p =
		    act_alloc_as(tr, mb, r->u[u].bytes, layer, unit_names[u], KILN_ACCT_RELOADED);
		int rc = kiln_copy_reload(tr->ce, r->u[u].copy_buf, r->u[u].p, &ev[u]);
		if (rc)
			fail(EXIT_INPUT, "reload of %s: %s", unit_names[u], kiln_rt_strerror(rc));
		r->u[u].state = UNIT_HELD;
	}
	for (int u = 0; u < TR_NU; u++)
		if (ev[u]) {
			int rc = kiln_copy_wait(tr->ce, ev[u]);
			if (rc)
				fail(EXIT_INPUT, "reload of %s: %s", unit_names[u],
				     kiln_rt_strerror(rc));
		}
	for (int u = 0; u < TR_NU; u++)
		if (r->action[u] == KILN_RT_RECOMPUTE && r->u[u].state != UNIT_HELD)
			produce(tr, mb, li, u, 1);
	for (int u = 0; u < TR_NU; u++)
		check_filled(r, u);
}

/* The layer's backward: dy [T,H] in, dx [T,H] out (overwritten; heap). */
static void layer_backward(trainer *tr, uint32_t mb, int li, const float *dy, float *dx)
{
	layer_run *r = &tr->runs[mb][li];
	const layer_params *P = &tr->lp[li];
	int32_t layer = tr->ci.stage * TR_STAGE_LAYERS + li;
	restore(tr, mb, li);
	const size_t TH = (size_t)TR_T * TR_H, N = (size_t)r->n_rows;
	const int W = TR_H + 1; /* a row and one float beside it */

	/* Token side: each (token, choice) row carries dy and its gate weight. */
	int32_t expert[TR_T * TR_TOPK], pos[TR_T * TR_TOPK];
	replay_routing(tr, mb, layer, r, expert, pos, "backward");
	const float *probs = U(r, TR_U_PROBS);
	float *sendbuf = xcalloc((size_t)TR_T * TR_TOPK * W, sizeof(float));
	float *recvbuf = xcalloc(N * W + 1, sizeof(float));
	for (int t = 0; t < TR_T; t++)
		for (int j = 0; j < TR_TOPK; j++) {
			float *row = sendbuf + (size_t)pos[t * TR_TOPK + j] * W;
			memcpy(row, dy + (size_t)t * TR_H, 4u * TR_H);
			row[TR_H] = probs[(size_t)t * TR_E + (size_t)expert[t * TR_TOPK + j]];
		}
	int32_t sc[TR_EP], rc[TR_EP];
	row_counts(r, W, sc, rc);
	tr_comm_alltoallv(tr->comm, sendbuf, sc, recvbuf, rc);

	/* Expert side, rows in expert-major order: d expert_out = w * dy, and
	 * the gate weight's gradient dot(dy, expert_out). */
	const int32_t *perm = (const int32_t *)r->u[TR_U_PERM].p;
	float *d_out = xcalloc(N * TR_H + 1, sizeof(float));
	float *d_act = xcalloc(N * TR_FE + 1, sizeof(float));
	float *d_up = xcalloc(N * 2 * TR_FE + 1, sizeof(float));
	float *d_in = xcalloc(N * TR_H + 1, sizeof(float));
	float *d_w = xcalloc(N + 1, sizeof(float));
	for (size_t i = 0; i < N; i++) {
		const float *row = recvbuf + (size_t)perm[i] * W;
		const float *eo = U(r, TR_U_EOUT) + i * TR_H;
		float s = 0;
		for (int h = 0; h < TR_H; h++) {
			d_out[i * TR_H + (size_t)h] = row[TR_H] * row[h];
			s += row[h] * eo[h];
		}
		d_w[i] = s;
	}
	int32_t per_expert[TR_LE], src_start[TR_EP * TR_LE], off = 0;
	recv_layout(r, per_expert, src_start);
	for (int e = 0; e < TR_LE; e++) {
		size_t o = (size_t)off, n = (size_t)per_expert[e];
		tr_matmul_bwd(U(r, TR_U_EACT) + o * TR_FE, P->wdown[e], d_out + o * TR_H,
		              d_act + o * TR_FE, grad_of(tr, P->wdown[e]), (int)n, TR_FE, TR_H);
		off += per_expert[e];
	}
	tr_swiglu_bwd(U(r, TR_U_EUP), d_act, d_up, r->n_rows, TR_FE);
	off = 0;
	for (int e = 0; e < TR_LE; e++) {
		size_t o = (size_t)off, n = (size_t)per_expert[e];
		tr_matmul_bwd(U(r, TR_U_EIN) + o * TR_H, P->wup[e], d_up + o * 2 * TR_FE,
		              d_in + o * TR_H, grad_of(tr, P->wup[e]), (int)n, TR_H, 2 * TR_FE);
		off += per_expert[e];
	}
	/* Back to the tokens' ranks, in received order. */
	for (size_t i = 0; i < N; i++) {
		float *row = recvbuf + (size_t)perm[i] * W;
		memcpy(row, d_in + i * TR_H, 4u * TR_H);
		row[TR_H] = d_w[i];
	}
	tr_comm_alltoallv(tr->comm, recvbuf, rc, sendbuf, sc);

	/* Token side: permute and router backward. */
	float *d_moe_in = xcalloc(TH, sizeof(float));
	float *d_probs = xcalloc((size_t)TR_T * TR_E, sizeof(float));
	float *d_logits = xcalloc((size_t)TR_T * TR_E, sizeof(float));
	for (int t = 0; t < TR_T; t++)
		for (int j = 0; j < TR_TOPK; j++) {
			const float *row = sendbuf + (size_t)pos[t * TR_TOPK + j] * W;
			tr_add(d_moe_in + (size_t)t * TR_H, row, TR_H);
			d_probs[(size_t)t * TR_E + (size_t)expert[t * TR_TOPK + j]] = row[TR_H];
		}
	tr_softmax_bwd(probs, d_probs, d_logits, TR_T, TR_E);
	tr_matmul_bwd(U(r, TR_U_MOE_IN), P->wr, d_logits, d_moe_in, grad_of(tr, P->wr), TR_T, TR_H,
	              TR_E);
	/* ln2.in feeds the residual (dy) and the norm. */
	float *d_x1 = xcalloc(TH, sizeof(float));
	memcpy(d_x1, dy, 4 * TH);
	tr_rmsnorm_bwd(U(r, TR_U_LN2_IN), P->g2, d_moe_in, d_x1, grad_of(tr, P->g2), TR_T, TR_H);

	/* Attention. */
	float *d_o = xcalloc(TH, sizeof(float));
	tr_matmul_bwd(U(r, TR_U_OUT), P->wo, d_x1, d_o, grad_of(tr, P->wo), TR_T, TR_NH * TR_HD,
	              TR_H);
	float *dq = xcalloc((size_t)TR_T * TR_NH * TR_HD, sizeof(float));
	float *dk = xcalloc((size_t)TR_T * TR_NKV * TR_HD, sizeof(float));
	float *dv = xcalloc((size_t)TR_T * TR_NKV * TR_HD, sizeof(float));
	float scratch[2 * TR_S];
	tr_attn_bwd(U(r, TR_U_Q), U(r, TR_U_K), U(r, TR_U_V), U(r, TR_U_OUT), U(r, TR_U_LSE), d_o,
	            dq, dk, dv, scratch, TR_B, TR_S, TR_NH, TR_NKV, TR_HD);
	float *d_qkv_in = xcalloc(TH, sizeof(float));
	tr_matmul_bwd(U(r, TR_U_QKV_IN), P->wq, dq, d_qkv_in, grad_of(tr, P->wq), TR_T, TR_H,
	              TR_NH * TR_HD);
	tr_matmul_bwd(U(r, TR_U_QKV_IN), P->wk, dk, d_qkv_in, grad_of(tr, P->wk), TR_T, TR_H,
	              TR_NKV * TR_HD);
	tr_matmul_bwd(U(r, TR_U_QKV_IN), P->wv, dv, d_qkv_in, grad_of(tr, P->wv), TR_T, TR_H,
	              TR_NKV * TR_HD);
	memcpy(dx, d_x1, 4 * TH);
	tr_rmsnorm_bwd(U(r, TR_U_LN1_IN), P->g1, d_qkv_in, dx, grad_of(tr, P->g1), TR_T, TR_H);

	free(sendbuf);
	free(recvbuf);
	free(d_out);
	free(d_act);
	free(d_up);
	free(d_in);
	free(d_w);
	free(d_moe_in);
	free(d_probs);
	free(d_logits);
	free(d_x1);
	free(d_o);
	free(dq);
	free(dk);
	free(dv);
	free(d_qkv_in);
	for (int u = 0; u < TR_NU; u++)
		if (r->u[u].state == UNIT_HELD)
			unit_free(tr, mb, r, u);
}

/* ---------------------------------------------------------------- embedding and head */

static void embed_forward(trainer *tr, uint32_t mb, float *x)
{
	for (int t = 0; t < TR_T; t++)
		memcpy(x + (size_t)t * TR_H, tr->emb + (size_t)tr->input[mb][t] * TR_H, 4u * TR_H);
}

static void embed_backward(trainer *tr, uint32_t mb, const float *dx)
{
	float *g = grad_of(tr, tr->emb);
	for (int t = 0; t < TR_T; t++)
		tr_add(g + (size_t)tr->input[mb][t] * TR_H, dx + (size_t)t * TR_H, TR_H);
}

/* The head saves its input, the normed input and the fp32 logits (the
 * stage's fixed activations in the plan). */
static void head_forward(trainer *tr, uint32_t mb, const float *y)
{
	int32_t layer = TR_LAYERS;
	tr->head_norm_in[mb] = act_alloc(tr, mb, TR_HEAD_NORM_IN_BYTES, layer, "head.norm_in");
	tr->head_in[mb] = act_alloc(tr, mb, TR_HEAD_IN_BYTES, layer, "head.in");
	tr->head_logits[mb] = act_alloc(tr, mb, TR_HEAD_LOGITS_BYTES, layer, "head.logits");
	memcpy(tr->head_norm_in[mb], y, TR_HEAD_NORM_IN_BYTES);
	tr_rmsnorm(tr->head_norm_in[mb], tr->gf, tr->head_in[mb], TR_T, TR_H);
	tr_matmul(tr->head_in[mb], tr->whead, tr->head_logits[mb], TR_T, TR_H, TR_V);
	tr->loss_sum += (double)tr_xent(tr->head_logits[mb], tr->target[mb], TR_T, TR_V, 0, NULL);
}

static void head_backward(trainer *tr, uint32_t mb, float *dy)
{
	float *dlogits = xcalloc((size_t)TR_T * TR_V, sizeof(float));
	float *dhin = xcalloc((size_t)TR_T * TR_H, sizeof(float));
	/* The loss is the mean over every token of the step's global batch. */
	float scale = 1.0f / (float)(TR_T * TR_M * tr->ci.ndp);
	tr_xent(tr->head_logits[mb], tr->target[mb], TR_T, TR_V, scale, dlogits);
	tr_matmul_bwd(tr->head_in[mb], tr->whead, dlogits, dhin, grad_of(tr, tr->whead), TR_T, TR_H,
	              TR_V);
	memset(dy, 0, 4u * TR_T * TR_H);
	tr_rmsnorm_bwd(tr->head_norm_in[mb], tr->gf, dhin, dy, grad_of(tr, tr->gf), TR_T, TR_H);
	act_free(tr, mb, tr->head_norm_in[mb], TR_HEAD_NORM_IN_BYTES, "head.norm_in");
	act_free(tr, mb, tr->head_in[mb], TR_HEAD_IN_BYTES, "head.in");
	act_free(tr, mb, tr->head_logits[mb], TR_HEAD_LOGITS_BYTES, "head.logits");
	free(dlogits);
	free(dhin);
}

/* ---------------------------------------------------------------- one step */

static void forward_mb(trainer *tr, uint32_t mb)
{
	float *x = xcalloc((size_t)TR_T * TR_H, sizeof(float));
	float *y = xcalloc((size_t)TR_T * TR_H, sizeof(float));
	load_batch(tr, mb);
	if (tr->ci.stage == 0)
		embed_forward(tr, mb, x);
	else
		tr_comm_recv(tr->comm, -1, x, (size_t)TR_T * TR_H, (int)(2 * mb));
	for (int li = 0; li < TR_STAGE_LAYERS; li++) {
		layer_forward(tr, mb, li, x, y);
		float *t = x;
		x = y;
		y = t;
	}
	if (tr->ci.stage == tr->ci.pp - 1)
		head_forward(tr, mb, x);
	else
		tr_comm_send(tr->comm, +1, x, (size_t)TR_T * TR_H, (int)(2 * mb));
	free(x);
	free(y);
}

static void backward_mb(trainer *tr, uint32_t mb)
{
	float *dy = xcalloc((size_t)TR_T * TR_H, sizeof(float));
	float *dx = xcalloc((size_t)TR_T * TR_H, sizeof(float));
	if (tr->ci.stage == tr->ci.pp - 1)
		head_backward(tr, mb, dy);
	else
		tr_comm_recv(tr->comm, +1, dy, (size_t)TR_T * TR_H, (int)(2 * mb + 1));
	for (int li = TR_STAGE_LAYERS - 1; li >= 0; li--) {
		layer_backward(tr, mb, li, dy, dx);
		float *t = dy;
		dy = dx;
		dx = t;
	}
	if (tr->ci.stage == 0)
		embed_backward(tr, mb, dy);
	else
		tr_comm_send(tr->comm, -1, dy, (size_t)TR_T * TR_H, (int)(2 * mb + 1));
	free(dy);
	free(dx);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One training step: Megatron's 1F1B order on this stage (warm-up forwards,
 * then one forward and one backward in turn, then the remaining
 * backwards), the gradient all-reduce of the replicated weights, AdamW.
 * Returns the hash of this rank's gradients, taken before the update. */
static uint64_t train_step(trainer *tr)
{
	int warm = tr->ci.pp - tr->ci.stage - 1;
	warm = warm < TR_M ? warm : TR_M;
	int8_t is_fwd[2 * TR_M];
	int32_t which[2 * TR_M];
	int n = 0;
	for (int i = 0; i < warm; i++)
		is_fwd[n] = 1, which[n++] = i;
	for (int i = 0; i < TR_M - warm; i++) {
		is_fwd[n] = 1, which[n++] = warm + i;
		is_fwd[n] = 0, which[n++] = i;
	}
	for (int i = TR_M - warm; i < TR_M; i++)
		is_fwd[n] = 0, which[n++] = i;
	for (int i = 0; i < n; i++) {
		if (is_fwd[i]) {
			tr->cur_pending = pending_after(is_fwd, n, i);
			forward_mb(tr, (uint32_t)which[i]);
		} else {
			backward_mb(tr, (uint32_t)which[i]);
		}
	}
	tr_comm_wait_sends(tr->comm);
	kiln_acct ac;
	kiln_rt_acct_get(tr->rt, &ac);
	if (tr->arena.used_bytes || ac.device_bytes || ac.host_bytes)
		fail(EXIT_INPUT,
		     "internal error: %" PRIu64 " activation bytes left after the step "
		     "(kiln's accounting: %" PRIu64 " on the device, %" PRIu64 " on the host)",
		     tr->arena.used_bytes, ac.device_bytes, ac.host_bytes);
	uint64_t h = TR_FNV_OFFSET;
	for (int i = 0; i < tr->n_params; i++) {
		param *p = &tr->params[i];
		if (p->replicated)
			tr_comm_allreduce_sum(tr->comm, p->g, p->n);
		h = tr_fnv1a(h, p->g, p->n * sizeof(float));
		tr_adamw(p->w, p->m, p->v, p->g, p->n, tr->step, tr->opt.lr, 0.9f, 0.95f, 1e-8f,
		         0.0f);
		memset(p->g, 0, p->n * sizeof(float));
	}
	return h;
}

/* ---------------------------------------------------------------- load traces */

static _Noreturn void fail_all(int code, const char *fmt, ...);
static int number_text(const char *s, size_t len, int integer);

/* Reads --loads FILE (every rank reads it alike). Rows for micro-batches or
 * ranks beyond this trainer's are ignored, as the simulator ignores ranks
 * beyond its ep. */
static void read_loads(trainer *tr)
{
	const char *path = tr->opt.loads;
	FILE *f = fopen(path, "r");
	if (!f)
		fail_all(EXIT_INPUT, "%s: cannot open the load trace: %s", path, strerror(errno));
	typedef struct row {
		int64_t it;
		int32_t mb, layer, rank;
		float factor;
	} row;
	row *rows = NULL;
	size_t n = 0, cap = 0;
	char line[512];
	long lineno = 0;
	int header = 0;
	int64_t lo = INT64_MAX, hi = -1;
	int32_t layers = 0;
	while (fgets(line, sizeof line, f)) {
		lineno++;
		char *p = line;
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == '#' || *p == '\n' || *p == '\r' || !*p)
			continue;
		if (!header) {
			if (strncmp(p, "iteration,microbatch,layer,rank,factor", 38) ||
			    (p[38] && p[38] != '\n' && p[38] != '\r')) {
				free(rows);
				fclose(f);
				fail_all(EXIT_INPUT,
				         "%s:%ld: the trainer replays factor traces, header "
				         "'iteration,microbatch,layer,rank,factor' (kilnc simulate "
				         "MODEL --loads PROFILE --emit-loads F writes them)",
				         path, lineno);
			}
			header = 1;
			continue;
		}
		long long it, mb, layer, rank;
		double fac;
		int used = 0;
		/* %lf also reads hex floats (0x1p1): the factor must be decimal. */
		const char *fp = p;
		for (int c = 0; c < 4 && fp; c++)
			fp = strchr(fp, ',') ? strchr(fp, ',') + 1 : NULL;
		size_t fl = 0;
		while (fp && (*fp == ' ' || *fp == '\t'))
			fp++;
		while (fp && fp[fl] && !strchr(" \t\r\n", fp[fl]))
			fl++;
		if (!fp || !number_text(fp, fl, 0) ||
		    sscanf(p, "%lld ,%lld ,%lld ,%lld ,%lf %n", &it, &mb, &layer, &rank, &fac,
		           &used) != 5 ||
		    p[used] || it < 0 || it > (1LL << 40) || mb < 0 || mb > INT32_MAX ||
		    layer < 0 || layer > 1023 || rank < 0 || rank > INT32_MAX ||
		    !(fac >= 0 && fac <= 1e6)) {
			free(rows);
			fclose(f);
			fail_all(EXIT_INPUT,
			         "%s:%ld: expected ITERATION,MICROBATCH,LAYER,RANK,FACTOR "
			         "(non-negative; layer below 1024)",
			         path, lineno);
		}
		if (mb >= TR_M || rank >= TR_EP)
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 1024;
			row *r2 = realloc(rows, cap * sizeof *r2);
			if (!r2)
				fail(EXIT_INPUT, "out of host memory");
			rows = r2;
		}
		rows[n++] = (row){it, (int32_t)mb, (int32_t)layer, (int32_t)rank, (float)fac};
		lo = it < lo ? it : lo;
		hi = it > hi ? it : hi;
		layers = (int32_t)layer + 1 > layers ? (int32_t)layer + 1 : layers;
	}
	int err = ferror(f);
	fclose(f);
	if (err || !header || !n) {
		free(rows);
		fail_all(EXIT_INPUT, "%s: %s", path,
		         err ? "cannot read the load trace"
		             : "no rows for this trainer (8 micro-batches, EP ranks 0 and 1)");
	}
	load_trace *lt = &tr->trace;
	lt->first = lo;
	lt->span = hi - lo + 1;
	lt->layers = layers;
	size_t cells = (size_t)lt->span * TR_M * (size_t)layers * TR_EP;
	if (lt->span > 100000 || cells > ((size_t)16 << 20)) {
		free(rows);
		fail_all(EXIT_INPUT,
		         "%s: the trace spans %lld iterations x %d layers, more than the "
		         "trainer replays (100,000 iterations, 16 M cells)",
		         path, (long long)lt->span, layers);
	}
	lt->factor = xcalloc(cells, sizeof(float));
	for (size_t i = 0; i < cells; i++)
		lt->factor[i] = -1;
	for (size_t i = 0; i < n; i++) {
		const row *r = &rows[i];
		float *cell =
		    &lt->factor[(((size_t)(r->it - lo) * TR_M + (size_t)r->mb) * (size_t)layers +
		                 (size_t)r->layer) *
		                    TR_EP +
		                (size_t)r->rank];
		if (*cell >= 0) {
			row dup = *r;
			free(rows);
			fail_all(EXIT_INPUT,
			         "%s: iteration %lld micro-batch %d layer %d rank %d appears "
			         "twice",
			         path, (long long)dup.it, dup.mb, dup.layer, dup.rank);
		}
		*cell = r->factor;
	}
	free(rows);
}

/* ---------------------------------------------------------------- gradient check */

/* Releases every activation a forward-only pass left behind. */
static void drop_activations(trainer *tr)
{
	for (uint32_t mb = 0; mb < TR_M; mb++) {
		for (int li = 0; li < TR_STAGE_LAYERS; li++)
			for (int u = 0; u < TR_NU; u++)
				if (tr->runs[mb][li].u[u].state == UNIT_HELD)
					unit_free(tr, mb, &tr->runs[mb][li], u);
		if (tr->ci.stage == tr->ci.pp - 1) {
			act_free(tr, mb, tr->head_norm_in[mb], TR_HEAD_NORM_IN_BYTES,
			         "head.norm_in");
			act_free(tr, mb, tr->head_in[mb], TR_HEAD_IN_BYTES, "head.in");
			act_free(tr, mb, tr->head_logits[mb], TR_HEAD_LOGITS_BYTES, "head.logits");
		}
	}
}

/* The step's mean loss from a forward pass of every micro-batch. */
static double forward_loss(trainer *tr)
{
	tr->loss_sum = 0;
	for (uint32_t mb = 0; mb < TR_M; mb++)
		forward_mb(tr, mb);
	tr_comm_wait_sends(tr->comm);
	drop_activations(tr);
	return tr_comm_sum(tr->comm, tr->loss_sum) / ((double)TR_T * TR_M * TR_EP);
}

/* --grad-check: the gradients of one step (forwards, then backwards, then
 * the all-reduce; every activation kept) against central finite
 * differences of the loss. Every token is routed to experts 1 and 6 (one on
 * each EP rank), so that a small change of a weight cannot flip the
 * routing and the loss is smooth. Probes: on each stage, every weight of
 * its first layer (the experts that receive rows on each EP rank), the
 * second layer's norm and router, and the embedding or the head; in each,
 * the element with the largest gradient. Returns the number that failed. */
static int grad_check(trainer *tr)
{
	tr->opt.policy = POLICY_KEEP;
	tr->opt.n_spikes = 1;
	tr->opt.spikes[0] = (spike){.step = 1, .fraction = 1.0f, .n_experts = 2, .experts = {1, 6}};
	tr->step = 1;
	tr->loss_sum = 0;
	for (uint32_t mb = 0; mb < TR_M; mb++)
		forward_mb(tr, mb);
	for (uint32_t mb = 0; mb < TR_M; mb++)
		backward_mb(tr, mb);
	tr_comm_wait_sends(tr->comm);
	for (int i = 0; i < tr->n_params; i++)
		if (tr->params[i].replicated)
			tr_comm_allreduce_sum(tr->comm, tr->params[i].g, tr->params[i].n);

	/* (stage, layer on the stage or -1, weight, EP rank or -1: replicated) */
	enum { G1, WQ, WK, WV, WO, G2, WR, WUP, WDOWN, EMB, GF, WHEAD };
	static const char *const names[] = {"g1", "wq",  "wk",    "wv",  "wo", "g2",
	                                    "wr", "wup", "wdown", "emb", "gf", "whead"};
	struct probe {
		int stage, li, kind, dp;
	} probes[64];
	int n = 0;
	for (int s = 0; s < TR_PP; s++) {
		for (int k = G1; k <= WR; k++)
			probes[n++] = (struct probe){s, 0, k, -1};
		for (int dp = 0; dp < TR_EP; dp++) {
			probes[n++] = (struct probe){s, 0, WUP, dp};
			probes[n++] = (struct probe){s, 0, WDOWN, dp};
		}
		probes[n++] = (struct probe){s, 1, G2, -1};
		probes[n++] = (struct probe){s, 1, WR, -1};
		if (s == 0)
			probes[n++] = (struct probe){s, -1, EMB, -1};
		if (s == TR_PP - 1) {
			probes[n++] = (struct probe){s, -1, GF, -1};
			probes[n++] = (struct probe){s, -1, WHEAD, -1};
		}
	}
	int failed = 0;
	for (int i = 0; i < n; i++) {
		const struct probe *pr = &probes[i];
		int mine = tr->ci.stage == pr->stage && (pr->dp < 0 || pr->dp == tr->ci.dp);
		float *w = NULL;
		if (mine) {
			const layer_params *P = pr->li >= 0 ? &tr->lp[pr->li] : NULL;
			/* The expert that receives rows: global 1 is local 1 on rank 0,
			 * global 6 is local 2 on rank 1. */
			int e = tr->ci.dp == 0 ? 1 : 2;
			float *const pick[] = {P ? P->g1 : NULL,
			                       P ? P->wq : NULL,
			                       P ? P->wk : NULL,
			                       P ? P->wv : NULL,
			                       P ? P->wo : NULL,
			                       P ? P->g2 : NULL,
			                       P ? P->wr : NULL,
			                       P ? P->wup[e] : NULL,
			                       P ? P->wdown[e] : NULL,
			                       tr->emb,
			                       tr->gf,
			                       tr->whead};
			w = pick[pr->kind];
		}
		size_t len = 0, at = 0;
		const float *g = NULL;
		for (int k = 0; w && k < tr->n_params; k++)
			if (tr->params[k].w == w) {
				len = tr->params[k].n;
				g = tr->params[k].g;
			}
		for (size_t k = 0; g && k < len; k++)
			if (fabsf(g[k]) > fabsf(g[at]))
				at = k;
		/* Replicated weights change on both replicas at once. */
		const float eps = 1e-2f;
		float saved = mine ? w[at] : 0;
		if (mine)
			w[at] = saved + eps;
		double up = forward_loss(tr);
		if (mine)
			w[at] = saved - eps;
		double down = forward_loss(tr);
		if (mine)
			w[at] = saved;
		double numeric = (up - down) / (2.0 * (double)eps);
		int reporter = mine && (pr->dp >= 0 || tr->ci.dp == 0);
		double analytic = tr_comm_sum(tr->comm, reporter ? (double)g[at] : 0.0);
		/* Central differences of an fp32 loss: truncation O(eps^2) and
		 * rounding of about 1e-7 / eps; 2% plus a small absolute term
		 * covers both and still fails any missing or doubled term. */
		double err = fabs(numeric - analytic);
		int ok = err <= 0.02 * fmax(fabs(numeric), fabs(analytic)) + 1e-5 &&
		         fabs(analytic) > 1e-6;
		failed += !ok;
		char label[64];
		if (pr->li >= 0)
			snprintf(label, sizeof label, "layer %d %s",
			         pr->stage * TR_STAGE_LAYERS + pr->li, names[pr->kind]);
		else
			snprintf(label, sizeof label, "%s", names[pr->kind]);
		if (pr->dp >= 0)
			snprintf(label + strlen(label), sizeof label - strlen(label),
			         " (EP rank %d)", pr->dp);
		if (tr->ci.rank == 0)
			printf("grad-check %-24s analytic % .6e  numeric % .6e  %s\n", label,
			       analytic, numeric, ok ? "ok" : "FAIL");
	}
	if (tr->ci.rank == 0)
		printf("grad-check: %d of %d weights agree with finite differences\n", n - failed,
		       n);
	return failed;
}

/* ---------------------------------------------------------------- the plan */

/* The blob must describe this trainer's model: its stages and layers, and
 * for each layer the trainer's units with their exact bytes. */
static void check_plan(trainer *tr)
{
	kiln_rt_info info;
	kiln_rt_info_get(tr->rt, &info);
	const char *hint = "compile it from examples/trainer/trainer.yaml";
	if (info.n_stages != TR_PP || info.n_model_layers != TR_LAYERS)
		fail_all(EXIT_INPUT,
		         "plan %s is for model '%s' with %d stages and %d layers; this trainer "
		         "runs %d stages of %d layers (%s)",
		         tr->opt.plan, info.model, info.n_stages, info.n_model_layers, TR_PP,
		         TR_LAYERS, hint);
	for (int32_t l = 0; l < TR_LAYERS; l++) {
		kiln_rt_layer_info li;
		if (kiln_rt_layer_get(tr->rt, l, &li) || li.stage != l / TR_STAGE_LAYERS ||
		    !li.moe || li.n_units != TR_NU || li.balanced_rows != (uint64_t)TR_T * TR_TOPK)
			fail_all(
			    EXIT_INPUT,
			    "plan %s: layer %d is not this trainer's MoE layer on stage %d with "
			    "%d units and %d balanced rows (%s)",
			    tr->opt.plan, l, l / TR_STAGE_LAYERS, TR_NU, TR_T * TR_TOPK, hint);
		for (int u = 0; u < TR_NU; u++) {
			kiln_rt_unit_info ui;
			if (kiln_rt_unit_get(tr->rt, l, u, &ui) || strcmp(ui.name, unit_names[u]) ||
			    ui.base_bytes != unit_base[u] || ui.per_row_bytes != unit_per_row[u])
				fail_all(EXIT_INPUT,
				         "plan %s: layer %d unit %d is %s of %" PRIu64 " + %" PRIu64
				         " bytes per row; the trainer holds %s of %" PRIu64
				         " + %" PRIu64 " (%s)",
				         tr->opt.plan, l, u, ui.name ? ui.name : "?", ui.base_bytes,
				         ui.per_row_bytes, unit_names[u], unit_base[u],
				         unit_per_row[u], hint);
			/* kiln never plans to recompute these: the layer's input, and
			 * the rows the dispatch all-to-all brought (docs/cost-model.md). */
			if ((u == TR_U_LN1_IN && !(ui.flags & KILN_RT_UNIT_LAYER_INPUT)) ||
			    (u == TR_U_EIN && !(ui.flags & KILN_RT_UNIT_COLLECTIVE)) ||
			    (u >= TR_U_PERM) != !!(ui.flags & KILN_RT_UNIT_EXPERT))
				fail_all(EXIT_INPUT,
				         "plan %s: layer %d unit %s has flags %#x, not this "
				         "trainer's (%s)",
				         tr->opt.plan, l, ui.name, ui.flags, hint);
		}
	}
}

/* ---------------------------------------------------------------- command line */

static const char usage[] =
    "usage: mpirun -np 4 kiln-trainer --plan PLAN.kiln [options]\n"
    "\n"
    "Trains a 4-layer MoE transformer (examples/trainer/trainer.yaml) on a\n"
    "text file with 2 pipeline stages x 2 expert-parallel ranks, asking kiln\n"
    "at every MoE gate which activations to keep, recompute or offload.\n"
    "\n"
    "  --plan FILE        plan blob from kilnc compile examples/trainer/trainer.yaml\n"
    "  --policy P         kiln (default): kiln_rt_select at each gate;\n"
    "                     keep: keep every activation (the static baseline);\n"
    "                     mixed: keep, recompute and offload units in turn\n"
    "                     (for tests: every recompute and reload path)\n"
    "  --arena BYTES      activation arena per rank (default: the stage's capacity\n"
    "                     minus its static bytes, from the plan); suffixes K M G\n"
    "  --steps N          training steps (default 20)\n"
    "  --seed S           data, initialisation and spike seed (default 1)\n"
    "  --spike STEPS:FRACTION:EXPERTS\n"
    "                     on each listed step (1-based, comma separated), send\n"
    "                     FRACTION of every micro-batch's tokens to EXPERTS\n"
    "                     (E or E+E, global expert numbers 0-7); repeatable\n"
    "  --loads FILE       replay a load trace: per step, micro-batch and layer, the\n"
    "                     hotter EP rank gets both rows of a fraction (factor - 1)\n"
    "                     of the tokens; e.g. the paper pattern, from\n"
    "                     kilnc simulate trainer.yaml --loads paper --emit-loads FILE\n"
    "  --data FILE        training text (default /usr/share/common-licenses/GPL-3)\n"
    "  --lr X             AdamW learning rate (default 0.003)\n"
    "  --log FILE         one JSON object per step: loss (also as a hex float),\n"
    "                     gradient hashes per rank, plan counts, arena peaks\n"
    "  --unit-log PREFIX  per rank, PREFIX.RANK: every unit's arena bytes at each\n"
    "                     decision (step mb layer unit name rows bytes action)\n"
    "  --quiet            no per-step lines on stdout\n"
    "  --grad-check       instead of training: compare the gradients of one step\n"
    "                     with central finite differences of the loss, on a\n"
    "                     spread of weights of every kind (routing pinned)\n"
    "\n"
    "Exit status: 0 done, 1 bad input (plan, text) or an internal error,\n"
    "2 bad arguments, 3 out of memory (the arena overflowed),\n"
    "4 the gradient check failed.\n";

/* Whether s[0..len) is a number as kilnc reads them (docs/cli.md,
 * "Numbers"): [+-]digits for an integer, [+-](digits[.[digits]] | .digits)
 * [(e|E)[+-]digits] otherwise; no blanks around it, no hex, inf or nan.
 * The trainer builds against the runtime alone, so it keeps its own copy
 * of the rule (kilnc's is ir/text.c). */
static int number_text(const char *s, size_t len, int integer)
{
	size_t i = 0, digits = 0;
	if (i < len && (s[i] == '+' || s[i] == '-'))
		i++;
	while (i < len && s[i] >= '0' && s[i] <= '9')
		i++, digits++;
	if (integer)
		return digits > 0 && i == len;
	if (i < len && s[i] == '.')
		for (i++; i < len && s[i] >= '0' && s[i] <= '9'; i++)
			digits++;
	if (!digits)
		return 0;
	if (i < len && (s[i] == 'e' || s[i] == 'E')) {
		size_t exp = 0;
		if (++i < len && (s[i] == '+' || s[i] == '-'))
			i++;
		for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
			exp++;
		if (!exp)
			return 0;
	}
	return i == len;
}

/* A byte count as kilnc's --free takes it: digits, then optionally one of
 * B, K, KB, KiB, M, ..., TiB (powers of 1024). */
static uint64_t parse_bytes(const char *s, const char *flag)
{
	static const struct {
		const char *suffix;
		int shift;
	} sfx[] = {{"", 0},     {"B", 0},   {"K", 10},   {"KB", 10}, {"KiB", 10},
	           {"M", 20},   {"MB", 20}, {"MiB", 20}, {"G", 30},  {"GB", 30},
	           {"GiB", 30}, {"T", 40},  {"TB", 40},  {"TiB", 40}};
	size_t digits = 0;
	while (s[digits] >= '0' && s[digits] <= '9')
		digits++;
	size_t k = 0, n = sizeof sfx / sizeof sfx[0];
	while (k < n && strcmp(s + digits, sfx[k].suffix) != 0)
		k++;
	errno = 0;
	unsigned long long v = digits && k < n ? strtoull(s, NULL, 10) : 0;
	if (errno || v == 0 || v > (1ull << 50) >> sfx[k < n ? k : 0].shift)
		fail_all(
		    EXIT_USAGE,
		    "%s wants a positive byte count up to 2^50: digits with an optional suffix "
		    "K, M, G or T (e.g. 4M), got '%s'",
		    flag, s);
	return (uint64_t)v << sfx[k].shift;
}

static long parse_int(const char *s, const char *flag, long lo, long hi)
{
	int ok = number_text(s, strlen(s), 1);
	errno = 0;
	long v = ok ? strtol(s, NULL, 10) : 0;
	if (!ok || errno || v < lo || v > hi)
		fail_all(EXIT_USAGE, "%s wants an integer in [%ld, %ld], got '%s'", flag, lo, hi,
		         s);
	return v;
}

/* A decimal number (number_text), or -1 when s is not one; callers check
 * their range, which excludes -1. */
static double parse_decimal(const char *s)
{
	return number_text(s, strlen(s), 0) ? strtod(s, NULL) : -1;
}

static void parse_spike(options *o, const char *arg)
{
	char buf[512];
	if (strlen(arg) >= sizeof buf)
		fail_all(EXIT_USAGE, "--spike value too long");
	strcpy(buf, arg);
	char *c1 = strchr(buf, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
	if (!c1 || !c2)
		fail_all(EXIT_USAGE,
		         "--spike wants STEPS:FRACTION:EXPERTS (e.g. 3,7:0.9:0+1), got '%s'", arg);
	*c1 = *c2 = '\0';
	double f = parse_decimal(c1 + 1);
	if (!(f >= 0 && f <= 1))
		fail_all(EXIT_USAGE, "--spike fraction must lie in [0, 1], got '%s'", c1 + 1);
	spike sp = {.fraction = (float)f};
	char *e = c2 + 1;
	for (;;) {
		char *plus = strchr(e, '+');
		if (plus)
			*plus = '\0';
		if (sp.n_experts == TR_TOPK)
			fail_all(EXIT_USAGE, "--spike names at most %d experts (top-%d routing)",
			         TR_TOPK, TR_TOPK);
		int32_t x = (int32_t)parse_int(e, "--spike expert", 0, TR_E - 1);
		for (int i = 0; i < sp.n_experts; i++)
			if (sp.experts[i] == x)
				fail_all(EXIT_USAGE, "--spike names expert %d twice", x);
		sp.experts[sp.n_experts++] = x;
		if (!plus)
			break;
		e = plus + 1;
	}
	for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
		if (o->n_spikes == TR_MAX_SPIKES)
			fail_all(EXIT_USAGE, "at most %d spike steps", TR_MAX_SPIKES);
		sp.step = (int32_t)parse_int(tok, "--spike step", 1, TR_MAX_STEPS);
		o->spikes[o->n_spikes++] = sp;
	}
}

static void parse_args(options *o, int argc, char **argv, int rank)
{
	*o = (options){.policy = POLICY_KILN,
	               .steps = 20,
	               .seed = 1,
	               .data = "/usr/share/common-licenses/GPL-3",
	               .lr = 0.003f};
	unsigned seen = 0; /* bit k: the option names[k] below was given */
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			if (rank == 0)
				fputs(usage, stdout);
			o->steps = -1;
			return;
		}
		/* Every option but --spike at most once (docs/trainer.md). */
		static const char *const names[] = {"--plan",      "--policy", "--arena", "--steps",
		                                    "--seed",      "--spike",  "--data",  "--log",
		                                    "--unit-log",  "--lr",     "--loads", "--quiet",
		                                    "--grad-check"};
		enum { N_NAMES = sizeof names / sizeof *names };
		size_t k = 0;
		while (k < N_NAMES && strcmp(a, names[k]) != 0)
			k++;
		if (k == N_NAMES)
			fail_all(EXIT_USAGE, "unknown option '%s' (see --help)", a);
		if ((seen >> k & 1u) && strcmp(a, "--spike") != 0)
			fail_all(EXIT_USAGE, "%s given twice", a);
		seen |= 1u << k;
		if (!strcmp(a, "--quiet")) {
			o->quiet = 1;
			continue;
		}
		if (!strcmp(a, "--grad-check")) {
			o->grad_check = 1;
			continue;
		}
		if (i + 1 >= argc)
			fail_all(EXIT_USAGE, "%s needs a value", a);
		const char *v = argv[++i];
		if (!strcmp(a, "--plan"))
			o->plan = v;
		else if (!strcmp(a, "--policy")) {
			if (!strcmp(v, "kiln"))
				o->policy = POLICY_KILN;
			else if (!strcmp(v, "keep"))
				o->policy = POLICY_KEEP;
			else if (!strcmp(v, "mixed"))
				o->policy = POLICY_MIXED;
			else
				fail_all(EXIT_USAGE, "--policy is kiln, keep or mixed, got '%s'",
				         v);
		} else if (!strcmp(a, "--arena"))
			o->arena_bytes = parse_bytes(v, a);
		else if (!strcmp(a, "--steps"))
			o->steps = (int32_t)parse_int(v, a, 1, TR_MAX_STEPS);
		else if (!strcmp(a, "--seed"))
			o->seed = (uint64_t)parse_int(v, a, 0, 1L << 40);
		else if (!strcmp(a, "--spike"))
			parse_spike(o, v);
		else if (!strcmp(a, "--data"))
			o->data = v;
		else if (!strcmp(a, "--log"))
			o->log = v;
		else if (!strcmp(a, "--unit-log"))
			o->unit_log = v;
		else if (!strcmp(a, "--loads"))
			o->loads = v;
		else if (!strcmp(a, "--lr")) {
			double x = parse_decimal(v);
			if (!(x > 0 && x < 1))
				fail_all(EXIT_USAGE, "--lr wants a number in (0, 1), got '%s'", v);
			o->lr = (float)x;
		}
	}
	if (!o->plan)
		fail_all(EXIT_USAGE, "--plan PLAN.kiln is required (see --help)");
}

/* The output rule: no output (rank 0's --log, every rank's --unit-log
 * PREFIX.RANK) may be one of the files the trainer reads, or another
 * output. Every rank checks them all, so all reach the same answer and
 * leave together with one status; rank 0 alone prints it. */
static void check_outputs(trainer *tr)
{
	enum { MAX_OUT = 1 + TR_PP * TR_EP };
	static char unit_path[MAX_OUT][4096];
	const kiln_out_name in[] = {
	    {"--plan", tr->opt.plan}, {"--data", tr->opt.data}, {"--loads", tr->opt.loads}};
	kiln_out_name out[MAX_OUT] = {{"--log", tr->opt.log}};
	size_t n = 1;
	for (int r = 0; tr->opt.unit_log && r < tr->ci.world && n < MAX_OUT; r++) {
		snprintf(unit_path[n], sizeof unit_path[n], "%s.%d", tr->opt.unit_log, r);
		out[n] = (kiln_out_name){"--unit-log", unit_path[n]};
		n++;
	}
	FILE *err = stderr, *quiet = NULL;
	if (tr->ci.rank != 0) {
		quiet = fopen("/dev/null", "w");
		if (quiet)
			err = quiet;
	}
	int bad = kiln_out_check("kiln-trainer", in, 3, out, n, err) != 0;
	if (quiet)
		fclose(quiet);
	if (bad)
		fail_all(EXIT_USAGE, "nothing was written");
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
	static trainer T; /* large: static storage */
	trainer *tr = &T;
	kiln_out_stdout_init();
	tr->comm = tr_comm_start(&argc, &argv, TR_PP);
	if (!tr->comm)
		return EXIT_USAGE;
	tr_comm_info_get(tr->comm, &tr->ci);
	g_tr = tr;
	parse_args(&tr->opt, argc, argv, tr->ci.rank);
	if (tr->opt.steps < 0) {
		tr_comm_finish(tr->comm);
		return EXIT_OK;
	}
	check_outputs(tr);
	if (tr->ci.world != TR_PP * TR_EP)
		fail_all(EXIT_USAGE,
		         "run with %d processes (%d stages x %d expert-parallel ranks: "
		         "mpirun -np %d), not %d",
		         TR_PP * TR_EP, TR_PP, TR_EP, TR_PP * TR_EP, tr->ci.world);
	int rc = kiln_rt_open_file(tr->opt.plan, &tr->rt);
	if (rc)
		fail_all(EXIT_INPUT, "cannot open plan %s: %s", tr->opt.plan, kiln_rt_strerror(rc));
	check_plan(tr);
	read_text(tr);
	if (tr->opt.loads)
		read_loads(tr);
	kiln_rt_stage_info si;
	kiln_rt_stage_get(tr->rt, tr->ci.stage, &si);
	uint64_t cap =
	    tr->opt.arena_bytes
	        ? tr->opt.arena_bytes
	        : (si.capacity_bytes > si.static_bytes ? si.capacity_bytes - si.static_bytes : 0);
	tr_arena_init(&tr->arena, cap);
	rc = kiln_rt_acct_reset(tr->rt, tr->ci.stage, cap);
	if (rc)
		fail_all(EXIT_INPUT, "kiln_rt_acct_reset: %s", kiln_rt_strerror(rc));
	kiln_copy_config cc = {.backend = KILN_COPY_HOST, .pool_bytes = (size_t)64 << 20};
	rc = kiln_copy_open(&cc, &tr->ce);
	if (rc)
		fail(EXIT_INPUT, "cannot open the copy engine: %s", kiln_rt_strerror(rc));
	init_params(tr);
	if (tr->opt.grad_check) {
		tr_arena_init(&tr->arena, (uint64_t)1 << 30);
		kiln_rt_acct_reset(tr->rt, tr->ci.stage, (uint64_t)1 << 30);
		int failed = grad_check(tr);
		if (failed)
			fail_all(EXIT_GRAD, "the gradient check failed");
		finish(tr);
		return EXIT_OK;
	}
	char unit_path[4096];
	if (tr->opt.unit_log) {
		snprintf(unit_path, sizeof unit_path, "%s.%d", tr->opt.unit_log, tr->ci.rank);
		tr->unit_out = kiln_out_open("kiln-trainer", unit_path, stderr);
		if (!tr->unit_out)
			fail(EXIT_INPUT, "the unit log cannot be written");
		tr->unit_log = kiln_out_stream(tr->unit_out);
	}
	FILE *log = NULL;
	if (tr->ci.rank == 0 && tr->opt.log) {
		tr->log_out = kiln_out_open("kiln-trainer", tr->opt.log, stderr);
		if (!tr->log_out)
			fail(EXIT_INPUT, "the log cannot be written");
		log = kiln_out_stream(tr->log_out);
	}
	if (tr->ci.rank == 0 && !tr->opt.quiet)
		printf("kiln-trainer: %d ranks (%d stages x %d EP), policy %s, arena %.2f MiB on "
		       "stage "
		       "0, %d steps of %d tokens\n",
		       tr->ci.world, TR_PP, TR_EP, policy_name(tr->opt.policy),
		       (double)cap / 1048576.0, tr->opt.steps, TR_T * TR_M * TR_EP);

	const double tokens_per_step = (double)TR_T * TR_M * TR_EP;
	double time_sum = 0;
	uint64_t total_decisions = 0, total_over = 0;
	for (tr->step = 1; tr->step <= tr->opt.steps; tr->step++) {
		memset(&tr->st, 0, sizeof tr->st);
		tr->loss_sum = 0;
		tr->arena.peak_bytes = tr->arena.used_bytes;
		tr_comm_barrier(tr->comm);
		double t0 = now_s();
		uint64_t h = train_step(tr);
		double dt = tr_comm_max(tr->comm, now_s() - t0);
		if (tr->step > 1)
			time_sum += dt;
		double loss = tr_comm_sum(tr->comm, tr->loss_sum) / tokens_per_step;
		uint64_t hashes[TR_PP * TR_EP], peaks[TR_PP * TR_EP];
		tr_comm_gather_u64(tr->comm, h, hashes);
		tr_comm_gather_u64(tr->comm, tr->arena.peak_bytes, peaks);
		/* Summed over the ranks, but for the largest row count (a maximum). */
		enum {
			DEC,
			KEEP,
			RECOMP,
			OFFL,
			OVER,
			BEYOND,
			OFFL_B,
			RECOMP_B,
			CHECKS,
			MAXROWS,
			NSUM
		};
		const uint64_t mine[NSUM] = {tr->st.decisions,       tr->st.keep,
		                             tr->st.recompute,       tr->st.offload,
		                             tr->st.over_budget,     tr->st.beyond,
		                             tr->st.offloaded_bytes, tr->st.recomputed_bytes,
		                             tr->st.resident_checks, tr->st.max_rows};
		double sums[NSUM];
		for (int k = 0; k < MAXROWS; k++)
			sums[k] = tr_comm_sum(tr->comm, (double)mine[k]);
		sums[MAXROWS] = tr_comm_max(tr->comm, (double)mine[MAXROWS]);
		total_decisions += (uint64_t)sums[DEC];
		total_over += (uint64_t)sums[OVER];
		float lossf = (float)loss;
		if (tr->ci.rank == 0 && !tr->opt.quiet)
			printf("step %3d  loss %.4f  %.3f s  %.0f tokens/s  max load %.2fx  units "
			       "kept %.0f "
			       "recomputed %.0f offloaded %.0f%s\n",
			       tr->step, loss, dt, tokens_per_step / dt,
			       sums[MAXROWS] / (double)(TR_T * TR_TOPK), sums[KEEP], sums[RECOMP],
			       sums[OFFL], sums[OVER] > 0 ? "  (over budget)" : "");
		if (log) {
			fprintf(
			    log,
			    "{\"step\": %d, \"loss\": %.9g, \"loss_hex\": \"%a\", \"grad_fnv\": [",
			    tr->step, (double)lossf, (double)lossf);
			for (int r = 0; r < tr->ci.world; r++)
				fprintf(log, "%s\"%016" PRIx64 "\"", r ? ", " : "", hashes[r]);
			fprintf(log, "], \"arena_peak_bytes\": [");
			for (int r = 0; r < tr->ci.world; r++)
				fprintf(log, "%s%" PRIu64, r ? ", " : "", peaks[r]);
			fprintf(log,
			        "], \"max_load\": %.4f, \"decisions\": %.0f, \"kept\": %.0f, "
			        "\"recomputed\": %.0f, \"offloaded\": %.0f, \"over_budget\": %.0f, "
			        "\"load_beyond\": %.0f, \"offloaded_bytes\": %.0f, "
			        "\"recomputed_bytes\": %.0f, \"resident_checks\": %.0f, "
			        "\"seconds\": %.6f, \"tokens_per_s\": %.1f}\n",
			        sums[MAXROWS] / (double)(TR_T * TR_TOPK), sums[DEC], sums[KEEP],
			        sums[RECOMP], sums[OFFL], sums[OVER], sums[BEYOND], sums[OFFL_B],
			        sums[RECOMP_B], sums[CHECKS], dt, tokens_per_step / dt);
			fflush(log);
		}
	}
	int steps = tr->opt.steps;
	double tps = steps > 1 ? tokens_per_step * (steps - 1) / time_sum : 0;
	if (tr->ci.rank == 0)
		printf("kiln-trainer: done: %d steps, 0 out-of-memory failures, %" PRIu64
		       " decisions (%" PRIu64 " over budget), %.0f tokens/s after the first step\n",
		       steps, total_decisions, total_over, tps);
	/* Every write is checked here, with its reason (tools/output.h). */
	kiln_out *unit_out = tr->unit_out, *log_out = tr->log_out;
	tr->unit_out = tr->log_out = NULL;
	tr->unit_log = NULL;
	/* Each rank commits its own files and says why one failed; then all
	 * ranks leave together with one status (an MPI_Abort here would race
	 * the other ranks' finalisation, which Open MPI's mpiexec does not
	 * always survive). */
	int failed = 0;
	if (log_out && kiln_out_commit(log_out, stderr) != 0) {
		fprintf(stderr, "kiln-trainer: rank 0: the log %s was not written\n", tr->opt.log);
		failed = 1;
	}
	if (unit_out && kiln_out_commit(unit_out, stderr) != 0) {
		fprintf(stderr, "kiln-trainer: rank %d: the unit log %s was not written\n",
		        tr->ci.rank, unit_path);
		failed = 1;
	}
	if (tr->ci.rank == 0 && kiln_out_stdout_finish("kiln-trainer", stderr) != 0) {
		fprintf(stderr, "kiln-trainer: rank 0: the standard output was not written\n");
		failed = 1;
	}
	failed = tr_comm_max(tr->comm, failed) > 0;
	finish(tr);
	return failed ? EXIT_INPUT : EXIT_OK;
}
