/* sim/loads.c: load profiles. Per (iteration, micro-batch, MoE layer, EP
 * group) the load factor of every EP rank, synthetic or replayed from a CSV
 * trace. docs/simulator.md ("Load profiles") is the contract; the constants
 * below are the numbers it quotes.
 *
 * Every random draw is a counter-based hash (SplitMix64's finaliser chained
 * over the seed, a tag naming the draw and its indices), so a sample depends
 * only on its own coordinates, never on what was drawn before.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim/sim.h"

/* paper: 29 spike iterations in every block of 1000 (97.1% calm). */
#define PAPER_BLOCK 1000
#define PAPER_SPIKES_PER_BLOCK 29
/* Calm samples: per-rank relative noise of standard deviation 0.04, bounded
 * (Irwin-Hall of four uniforms, |z| < 2 sqrt 3), renormalised to mean 1 and
 * capped at 1.19 so a calm iteration stays below 1.2 job-wide. */
#define PAPER_CALM_SIGMA 0.04
#define PAPER_CALM_CAP 1.19
/* Spikes: the iteration's peak factor is 1.2 + 1.4 u^2 (u uniform in (0,1)),
 * so it lies in (1.2, 2.6) and small spikes are more common than big ones. */
#define PAPER_SPIKE_LOW 1.2
#define PAPER_SPIKE_HIGH 2.6

#define HOT_EXPERT_FACTOR 2.0
#define HOT_RANK_FACTOR 1.8
#define BURST_PERIOD 50
#define BURST_LENGTH 3
#define BURST_OF_MAX 0.95

/* zipf: j^-alpha is tabulated at parse time for j up to this many experts. */
#define ZIPF_TABLE 4096

#define TRACE_MAX_ERRORS 20

/* ---------------------------------------------------------------- hashing */

enum {
	TAG_SPIKE_ORDER = 1,
	TAG_SPIKE,
	TAG_CALM,
	TAG_SPIKE_RANK,
	TAG_SPIKE_LAYER,
	TAG_HOT_EXPERT,
	TAG_HOT_RANK,
	TAG_ROTATING,
	TAG_BURST_OFFSET,
	TAG_BURST_RANK,
	TAG_ZIPF
};

static uint64_t mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The hash of a draw's coordinates: tag names what is drawn, the rest are
 * its indices (0 where an index does not apply). */
static uint64_t coords(uint64_t seed, uint64_t tag, int64_t iteration, int64_t microbatch,
                       int64_t layer, int64_t group)
{
	uint64_t h = mix64(seed);
	h = mix64(h ^ tag);
	h = mix64(h ^ (uint64_t)iteration);
	h = mix64(h ^ (uint64_t)microbatch);
	h = mix64(h ^ (uint64_t)layer);
	return mix64(h ^ (uint64_t)group);
}

/* Draw number index at coordinates c. */
static uint64_t nth(uint64_t c, int64_t index)
{
	return mix64(c ^ (uint64_t)index);
}

static uint64_t draw(uint64_t seed, uint64_t tag, int64_t iteration, int64_t microbatch,
                     int64_t layer, int64_t group, int64_t index)
{
	return nth(coords(seed, tag, iteration, microbatch, layer, group), index);
}

/* Uniform in the open interval (0, 1). */
static double unit_open(uint64_t h)
{
	return ((double)(h >> 11) + 0.5) * 0x1p-53;
}

static uint64_t umod(int64_t a, uint64_t m)
{
	int64_t r = a % (int64_t)m;
	return (uint64_t)(r < 0 ? r + (int64_t)m : r);
}

/* A keyed pseudorandom permutation of [0, n): a four-round Feistel network
 * on 2 * half_bits bits, cycle-walked into range. */
static int half_bits_for(uint64_t n)
{
	int bits = 0;
	while (bits < 62 && ((uint64_t)1 << bits) < n)
		bits++;
	return (bits + 1) / 2;
}

static uint64_t permute(uint64_t x, uint64_t n, int half, uint64_t key)
{
	if (n <= 1)
		return 0;
	uint64_t mask = ((uint64_t)1 << half) - 1;
	do {
		uint64_t l = x >> half, r = x & mask;
		for (uint64_t round = 0; round < 4; round++) {
			uint64_t f = mix64(key ^ (r + (round << 40))) & mask;
			uint64_t t = l ^ f;
			l = r;
			r = t;
		}
		x = (l << half) | r;
	} while (x >= n);
	return x;
}

/* ---------------------------------------------------------------- shaping */

/* Scales f[0..n) so that it sums to n (mean 1). */
static void normalise(double *f, int32_t n)
{
	double sum = 0;
	for (int32_t r = 0; r < n; r++)
		sum += f[r];
	for (int32_t r = 0; r < n; r++)
		f[r] = f[r] * (double)n / sum;
}

/* One value x under cap_mean_one's step: at most cap, lifted by share of
 * its headroom when below. */
static double capped(double x, double cap, double share)
{
	if (x >= cap)
		return cap;
	double v = x + (cap - x) * share;
	return v < cap ? v : cap;
}

/* The share of headroom cap_mean_one hands out, from the excess over cap
 * and the headroom below it; -1 when nothing exceeds the cap. */
static double cap_share(double excess, double headroom)
{
	if (excess <= 0)
		return -1;
	double share = headroom > 0 ? excess / headroom : 0;
	return share > 1 ? 1 : share;
}

/* Caps f (mean 1, cap >= 1) at cap and hands the excess to the ranks below
 * the cap in proportion to their headroom, which keeps the sum and never
 * lifts a rank over the cap: the headroom is n (cap - 1) + excess >= excess. */
static void cap_mean_one(double *f, int32_t n, double cap)
{
	double excess = 0, headroom = 0;
	for (int32_t r = 0; r < n; r++) {
		if (f[r] > cap)
			excess += f[r] - cap;
		else
			headroom += cap - f[r];
	}
	double share = cap_share(excess, headroom);
	if (share < 0)
		return;
	for (int32_t r = 0; r < n; r++)
		f[r] = capped(f[r], cap, share);
}

/* Rank hot at factor hot (clamped to [0, n]); the others share the rest of
 * the rows evenly. */
static void set_hot(double *f, int32_t n, int32_t hot, double factor)
{
	if (factor > n)
		factor = n;
	if (factor < 0)
		factor = 0;
	double rest = ((double)n - factor) / (double)(n - 1);
	for (int32_t r = 0; r < n; r++)
		f[r] = r == hot ? factor : rest;
}

static double min3(double a, double b, double c)
{
	double m = a < b ? a : b;
	return m < c ? m : c;
}

/* ---------------------------------------------------------------- paper */

/* Whether iteration it is one of its block's 29 spike iterations: position
 * it mod 1000 is permuted by a seed- and block-keyed permutation of
 * [0, 1000) and spikes when it lands below 29, so every whole block of
 * 1000 iterations has exactly 29 spikes, at positions that look random. */
static int paper_spike_iteration(uint64_t seed, int64_t it)
{
	uint64_t u = (uint64_t)it;
	uint64_t key = draw(seed, TAG_SPIKE_ORDER, (int64_t)(u / PAPER_BLOCK), 0, 0, 0, 0);
	uint64_t pos = permute(u % PAPER_BLOCK, PAPER_BLOCK, half_bits_for(PAPER_BLOCK), key);
	return pos < PAPER_SPIKES_PER_BLOCK;
}

/* Calm factors: bounded noise around 1, mean 1, at most cap. */
static void paper_calm(double *f, int32_t ep, uint64_t seed, int64_t it, int32_t mb, int32_t layer,
                       int32_t group, double cap)
{
	uint64_t c = coords(seed, TAG_CALM, it, mb, layer, group);
	for (int32_t r = 0; r < ep; r++) {
		uint64_t h = nth(c, r);
		double sum = 0;
		for (int i = 0; i < 4; i++)
			sum += ((double)((h >> (16 * i)) & 0xffff) + 0.5) / 65536.0;
		double z = (sum - 2.0) * sqrt(3.0); /* mean 0, variance 1 */
		f[r] = 1.0 + PAPER_CALM_SIGMA * z;
	}
	normalise(f, ep);
	cap_mean_one(f, ep, cap);
}

static void sample_paper(const kiln_load_profile *p, const kiln_load_shape *s, uint64_t seed,
                         int64_t it, int32_t mb, int32_t layer, int32_t group, double *f)
{
	int32_t ep = s->ep;
	double calm_cap = p->max_factor < PAPER_CALM_CAP ? p->max_factor : PAPER_CALM_CAP;
	paper_calm(f, ep, seed, it, mb, layer, group, calm_cap);
	if (!paper_spike_iteration(seed, it))
		return;
	int32_t mbs = s->microbatches > 0 ? s->microbatches : 1;
	int32_t layers = s->layers > 0 ? s->layers : 1;
	double u = unit_open(draw(seed, TAG_SPIKE, it, 0, 0, 0, 0));
	double peak = PAPER_SPIKE_LOW + (PAPER_SPIKE_HIGH - PAPER_SPIKE_LOW) * u * u;
	int32_t spike_mb = (int32_t)(draw(seed, TAG_SPIKE, it, 0, 0, 0, 1) % (uint64_t)mbs);
	int32_t peak_layer = (int32_t)(draw(seed, TAG_SPIKE, it, 0, 0, 0, 2) % (uint64_t)layers);
	if (mb != spike_mb)
		return;
	/* The spike micro-batch: one rank per layer runs hot, at the peak in
	 * the peak layer and partway there in the others. */
	double hot = peak;
	if (layer != peak_layer)
		hot = 1.0 +
		      (peak - 1.0) * unit_open(draw(seed, TAG_SPIKE_LAYER, it, mb, layer, 0, 0));
	if (hot > ep)
		hot = ep;
	int32_t rank =
	    (int32_t)(draw(seed, TAG_SPIKE_RANK, it, mb, layer, group, 0) % (uint64_t)ep);
	double others = (double)ep - f[rank];
	double scale = others > 0 ? ((double)ep - hot) / others : 0;
	for (int32_t r = 0; r < ep; r++)
		f[r] = r == rank ? hot : f[r] * scale;
	cap_mean_one(f, ep, p->max_factor);
}

/* ---------------------------------------------------------------- hotspots */

/* The largest factor one expert's rank can reach: a token picks top_k
 * distinct experts, so one expert takes at most 1/top_k of the rows; the
 * other n - 1 experts share the rest evenly. */
static double hot_expert_bound(const kiln_load_shape *s)
{
	int64_t n = (int64_t)s->ep * s->experts_per_rank;
	if (s->top_k < 1 || n < 2 || s->top_k > n)
		return (double)s->ep;
	double cap = 1.0 / s->top_k;
	double local = (double)(s->experts_per_rank - 1) / (double)(n - 1);
	return s->ep * (cap + local * (1.0 - cap));
}

static void sample_hot_expert(const kiln_load_profile *p, const kiln_load_shape *s, uint64_t seed,
                              int32_t layer, double *f)
{
	int32_t e = s->experts_per_rank > 0 ? s->experts_per_rank : 1;
	uint64_t n = (uint64_t)s->ep * (uint64_t)e;
	uint64_t expert = draw(seed, TAG_HOT_EXPERT, 0, 0, layer, 0, 0) % n;
	double hot = min3(HOT_EXPERT_FACTOR, p->max_factor, hot_expert_bound(s));
	set_hot(f, s->ep, (int32_t)(expert / (uint64_t)e), hot);
}

static void sample_burst(const kiln_load_profile *p, const kiln_load_shape *s, uint64_t seed,
                         int64_t it, int32_t mb, int32_t layer, int32_t group, double *f)
{
	uint64_t offset = draw(seed, TAG_BURST_OFFSET, 0, 0, 0, 0, 0) % BURST_PERIOD;
	uint64_t phase = (umod(it, BURST_PERIOD) + BURST_PERIOD - offset) % BURST_PERIOD;
	if (phase >= BURST_LENGTH)
		return;
	double hot = BURST_OF_MAX * p->max_factor;
	if (hot < 1)
		hot = 1;
	int32_t rank =
	    (int32_t)(draw(seed, TAG_BURST_RANK, it, mb, layer, group, 0) % (uint64_t)s->ep);
	set_hot(f, s->ep, rank, hot);
}

/* ---------------------------------------------------------------- zipf */

static double zipf_w(const kiln_load_profile *p, int64_t j)
{
	return j <= p->zipf_n ? p->zipf_w[j] : pow((double)j, -p->alpha);
}

/* zipf: per expert x (rank x / e, local expert x % e) its share of the
 * rows times ep, before the rank cap; per_expert (n entries) receives
 * them when not NULL. f[r] is the sum of rank r's, added in expert order. */
static void zipf_shares(const kiln_load_profile *p, const kiln_load_shape *s, uint64_t seed,
                        int64_t it, int32_t mb, int32_t layer, int32_t group, double *f,
                        double *per_expert)
{
	int32_t ep = s->ep;
	int64_t e = s->experts_per_rank > 0 ? s->experts_per_rank : 1;
	int64_t n = ep * e;
	double total = p->zipf_cum[n < p->zipf_n ? n : p->zipf_n];
	for (int64_t j = p->zipf_n + 1; j <= n; j++)
		total += zipf_w(p, j);
	/* Popularity rank j draws the share w_j / total; no expert can take
	 * more than 1/top_k (see hot_expert_bound), so the capped prefix's
	 * excess goes to the others in proportion to their headroom, as
	 * cap_mean_one does for ranks. */
	double cap = s->top_k >= 1 && s->top_k <= n ? 1.0 / s->top_k : 1.0;
	int64_t capped = 0;
	double excess = 0, capped_share = 0;
	while (capped < n && zipf_w(p, capped + 1) / total > cap) {
		double share = zipf_w(p, capped + 1) / total;
		excess += share - cap;
		capped_share += share;
		capped++;
	}
	double headroom = (double)(n - capped) * cap - (1.0 - capped_share);
	double lift = excess > 0 && headroom > 0 ? excess / headroom : 0;
	for (int32_t r = 0; f && r < ep; r++)
		f[r] = 0;
	uint64_t key = draw(seed, TAG_ZIPF, it, mb, layer, group, 0);
	int half = half_bits_for((uint64_t)n);
	for (int64_t x = 0; x < n; x++) {
		int64_t j = (int64_t)permute((uint64_t)x, (uint64_t)n, half, key) + 1;
		double share = j <= capped ? cap : zipf_w(p, j) / total;
		if (j > capped)
			share += (cap - share) * lift;
		if (f)
			f[x / e] += share * ep;
		if (per_expert)
			per_expert[x] = share * ep;
	}
}

static void sample_zipf(const kiln_load_profile *p, const kiln_load_shape *s, uint64_t seed,
                        int64_t it, int32_t mb, int32_t layer, int32_t group, double *f)
{
	zipf_shares(p, s, seed, it, mb, layer, group, f, NULL);
	cap_mean_one(f, s->ep, p->max_factor);
}

/* ---------------------------------------------------------------- traces */

typedef struct trace_row {
	int64_t iteration;
	int32_t microbatch, layer, rank;
	int32_t line;
	double value; /* a load factor, or the sum of the local experts' tokens */
} trace_row;

struct kiln_load_trace {
	const char *path;
	const trace_row *rows; /* sorted by (iteration, microbatch, layer, rank) */
	int64_t n;
	int64_t header_line;
	kiln_load_trace_info info;
	/* Token traces of more than one value column: the columns of every
	 * row in file order (info.values each), and per sorted row its place
	 * in that order; NULL otherwise. */
	const double *cells;
	const int32_t *cell_row;
};

static int key_cmp(int64_t it, int32_t mb, int32_t layer, int32_t rank, const trace_row *r)
{
	if (it != r->iteration)
		return it < r->iteration ? -1 : 1;
	if (mb != r->microbatch)
		return mb < r->microbatch ? -1 : 1;
	if (layer != r->layer)
		return layer < r->layer ? -1 : 1;
	if (rank != r->rank)
		return rank < r->rank ? -1 : 1;
	return 0;
}

/* The first row of the sample that (it, mb, layer) replays (t->n when it
 * has none), and the trace iteration and layer it replays. */
static int64_t trace_first(const kiln_load_trace *t, int64_t it, int32_t mb, int32_t layer,
                           int64_t *out_it, int32_t *out_layer)
{
	int64_t want = t->info.first_iteration + (int64_t)umod(it, (uint64_t)t->info.iterations);
	int32_t want_layer = (int32_t)umod(layer, (uint64_t)t->info.layers);
	int64_t lo = 0, hi = t->n;
	while (lo < hi) {
		int64_t mid = lo + (hi - lo) / 2;
		if (key_cmp(want, mb, want_layer, 0, &t->rows[mid]) > 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*out_it = want;
	*out_layer = want_layer;
	return lo;
}

static void sample_trace(const kiln_load_trace *t, const kiln_load_shape *s, int64_t it, int32_t mb,
                         int32_t layer, double *f)
{
	int64_t want;
	int32_t want_layer;
	int64_t lo = trace_first(t, it, mb, layer, &want, &want_layer);
	double balanced = (double)s->tokens * s->top_k / s->ep;
	for (int64_t i = lo; i < t->n; i++) {
		const trace_row *r = &t->rows[i];
		if (r->iteration != want || r->microbatch != mb || r->layer != want_layer)
			break;
		if (r->rank >= s->ep)
			break;
		if (!t->info.tokens)
			f[r->rank] = r->value;
		else
			f[r->rank] = balanced > 0 ? r->value / balanced : 1.0;
	}
}

/* A token trace's recorded columns into rows (ep * e of them, already
 * filled for the ranks without a row): column j of a rank's row is its
 * local expert j, experts beyond the columns 0. */
static void sample_trace_cells(const kiln_load_trace *t, const kiln_load_shape *s, int64_t it,
                               int32_t mb, int32_t layer, int32_t e, double *rows)
{
	int64_t want;
	int32_t want_layer;
	int32_t v = t->info.values;
	for (int64_t i = trace_first(t, it, mb, layer, &want, &want_layer); i < t->n; i++) {
		const trace_row *r = &t->rows[i];
		if (r->iteration != want || r->microbatch != mb || r->layer != want_layer ||
		    r->rank >= s->ep)
			break;
		const double *c = &t->cells[(size_t)t->cell_row[i] * (size_t)v];
		double *x = &rows[(size_t)r->rank * (size_t)e];
		for (int32_t j = 0; j < e; j++)
			x[j] = j < v ? c[j] : 0;
		/* More columns than experts (kiln_load_trace_check refuses
		 * such a trace): the last expert takes the rest, so the rank's
		 * rows still add up to its row's total. */
		for (int32_t j = e; j < v; j++)
			x[e - 1] += c[j];
	}
}

void kiln_load_trace_describe(const kiln_load_trace *t, kiln_load_trace_info *out)
{
	*out = t->info;
}

/* ---------------------------------------------------------------- trace check */

/* One kind of finding: how many, and the first one's line and message. */
typedef struct finding {
	int64_t count;
	int64_t line;
	char first[256];
} finding;

static void note_finding(finding *f, int64_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void note_finding(finding *f, int64_t line, const char *fmt, ...)
{
	if (f->count++ > 0)
		return;
	f->line = line;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(f->first, sizeof f->first, fmt, ap);
	va_end(ap);
}

static void report(const kiln_load_trace *t, FILE *err, const finding *f, const char *level,
                   const char *more)
{
	if (f->count == 0)
		return;
	if (f->line > 0)
		fprintf(err, "%s:%lld: %s: %s", t->path, (long long)f->line, level, f->first);
	else
		fprintf(err, "%s: %s: %s", t->path, level, f->first);
	if (f->count > 1)
		fprintf(err, " (%lld %s in all)", (long long)f->count, more);
	fputc('\n', err);
}

int kiln_load_trace_check(const kiln_load_trace *t, const kiln_load_shape *s, FILE *err)
{
	const kiln_load_trace_info *in = &t->info;
	int64_t hl = t->header_line;
	int32_t ep = s->ep > 0 ? s->ep : 1, mbs = s->microbatches > 0 ? s->microbatches : 1;
	int32_t layers = s->layers;
	int errors = 0;
	if (layers <= 0) {
		fprintf(err,
		        "%s:%lld: warning: the model has no MoE layers: the trace plays no part\n",
		        t->path, (long long)hl);
		return 0;
	}
	if (in->tokens && in->values > s->experts_per_rank) {
		fprintf(
		    err,
		    "%s:%lld: error: the header has %d per-expert token columns, but the model has "
		    "%d experts per EP rank (ep %d): the trace was recorded with another expert "
		    "layout\n",
		    t->path, (long long)hl, in->values, s->experts_per_rank, ep);
		errors++;
	} else if (in->tokens && in->values > 1 && in->values < s->experts_per_rank) {
		fprintf(
		    err,
		    "%s:%lld: warning: the header has %d per-expert token columns, but the "
		    "model has %d experts per EP rank: the rank's other experts count as 0 rows\n",
		    t->path, (long long)hl, in->values, s->experts_per_rank);
	}
	double balanced = (double)s->tokens * s->top_k / ep;
	double routed = (double)s->tokens * s->top_k; /* rows of one group's layer, all ranks */
	double r_max = kiln_sim_load_factor_max(s);
	finding beyond_rank = {0}, beyond_mb = {0}, beyond_layer = {0}, too_high = {0};
	finding sums = {0}, means = {0}, partial = {0}, gap = {0};
	int64_t replayed_keys = 0, groups = 0;
	int32_t l_eff = in->layers < layers ? in->layers : layers;
	for (int64_t i = 0; i < t->n;) {
		const trace_row *g0 = &t->rows[i];
		int64_t j = i, present = 0;
		double sum = 0;
		int32_t next_rank = 0, missing_rank = -1;
		for (; j < t->n && t->rows[j].iteration == g0->iteration &&
		       t->rows[j].microbatch == g0->microbatch && t->rows[j].layer == g0->layer;
		     j++) {
			const trace_row *r = &t->rows[j];
			if (r->rank >= ep) {
				note_finding(
				    &beyond_rank, r->line,
				    "rank %d is beyond the model's %d EP ranks (0 to %d): the row "
				    "is ignored",
				    r->rank, ep, ep - 1);
				continue;
			}
			if (r->microbatch >= mbs) {
				note_finding(&beyond_mb, r->line,
				             "micro-batch %d is beyond the model's %d per "
				             "iteration: the row is ignored",
				             r->microbatch, mbs);
				continue;
			}
			if (r->layer >= layers) {
				note_finding(
				    &beyond_layer, r->line,
				    "layer %d is beyond the model's %d MoE layers: the row is "
				    "ignored",
				    r->layer, layers);
				continue;
			}
			double f =
			    in->tokens ? (balanced > 0 ? r->value / balanced : 1.0) : r->value;
			if (f > r_max && in->tokens)
				note_finding(
				    &too_high, r->line,
				    "%.17g tokens make load factor %.6g, more than routing can put "
				    "on one rank (ep * min(top_k, experts per rank) / top_k = "
				    "%.6g): replayed as %.6g",
				    r->value, f, r_max, r_max);
			else if (f > r_max)
				note_finding(
				    &too_high, r->line,
				    "factor %.17g is more than routing can put on one rank (ep * "
				    "min(top_k, experts per rank) / top_k = %.6g): replayed as "
				    "%.6g",
				    f, r_max, r_max);
			if (missing_rank < 0 && r->rank != next_rank)
				missing_rank = next_rank;
			next_rank = r->rank + 1;
			present++;
			sum += r->value;
		}
		if (present > 0) {
			groups++;
			replayed_keys += present;
			if (missing_rank < 0 && next_rank < ep)
				missing_rank = next_rank;
			if (missing_rank >= 0) {
				note_finding(
				    &partial, g0->line,
				    "iteration %lld, micro-batch %d, layer %d has no row for rank "
				    "%d: it replays balanced (1.0)",
				    (long long)g0->iteration, g0->microbatch, g0->layer,
				    missing_rank);
			} else if (in->tokens && fabs(sum - routed) > 0.5 + 1e-9 * routed) {
				note_finding(
				    &sums, g0->line,
				    "the token counts of iteration %lld, micro-batch %d, layer %d "
				    "add up to %.17g rows, but the model routes tokens * top_k = "
				    "%lld * %d = %.17g per micro-batch and MoE layer",
				    (long long)g0->iteration, g0->microbatch, g0->layer, sum,
				    (long long)s->tokens, s->top_k, routed);
			} else if (!in->tokens && fabs(sum / ep - 1.0) > 1e-6) {
				note_finding(&means, g0->line,
				             "the factors of iteration %lld, micro-batch %d, layer "
				             "%d average %.9g, not 1 (routing conserves rows)",
				             (long long)g0->iteration, g0->microbatch, g0->layer,
				             sum / ep);
			}
		}
		/* Whole iterations left out between this group and the next. */
		if (j < t->n && t->rows[j].iteration > g0->iteration + 1)
			note_finding(&gap, t->rows[j].line,
			             "iteration %lld follows iteration %lld: iterations %lld to "
			             "%lld have no rows and replay balanced (1.0)",
			             (long long)t->rows[j].iteration, (long long)g0->iteration,
			             (long long)g0->iteration + 1,
			             (long long)t->rows[j].iteration - 1);
		i = j;
	}
	if (replayed_keys == 0) {
		fprintf(err,
		        "%s:%lld: error: no row of the trace lies within the model's shape (%d EP "
		        "ranks, %d micro-batches per iteration, %d MoE layers): nothing would be "
		        "replayed\n",
		        t->path, (long long)hl, ep, mbs, layers);
		return errors + 1;
	}
	report(t, err, &beyond_rank, "warning", "rows");
	report(t, err, &beyond_mb, "warning", "rows");
	report(t, err, &beyond_layer, "warning", "rows");
	report(t, err, &too_high, "warning", "rows");
	report(t, err, &sums, "warning", "micro-batch layers");
	report(t, err, &means, "warning", "micro-batch layers");
	report(t, err, &gap, "warning", "gaps");
	if (in->microbatches < mbs)
		fprintf(err,
		        "%s:%lld: warning: the trace has micro-batches 0 to %d, but the model runs "
		        "%d per iteration: micro-batches %d to %d replay balanced (1.0)\n",
		        t->path, (long long)hl, in->microbatches - 1, mbs, in->microbatches,
		        mbs - 1);
	report(t, err, &partial, "warning", "micro-batch layers short of a rank");
	/* Everything the replay looks up: the span's iterations, the model's
	 * micro-batches and ranks, and the trace layers the model's layers
	 * map to (layer l replays l mod the trace's layers). */
	double looked_up = (double)in->iterations * mbs * l_eff * ep;
	if ((double)replayed_keys < looked_up)
		fprintf(
		    err,
		    "%s:%lld: warning: %.0f of the %.0f (iteration, micro-batch, layer, rank) keys "
		    "the replay looks up have no row and replay balanced (1.0)\n",
		    t->path, (long long)hl, looked_up - (double)replayed_keys, looked_up);
	(void)groups;
	return errors;
}

/* ---------------------------------------------------------------- sample */

void kiln_load_sample(const kiln_load_profile *p, const kiln_load_shape *shape, uint64_t seed,
                      int64_t iteration, int32_t microbatch, int32_t layer, int32_t group,
                      double *out)
{
	int32_t ep = shape->ep;
	if (ep < 1)
		return;
	for (int32_t r = 0; r < ep; r++)
		out[r] = 1.0;
	if (p->kind == KILN_LOAD_TRACE) {
		sample_trace(p->trace, shape, iteration, microbatch, layer, out);
		return;
	}
	if (ep == 1)
		return; /* one rank holds every expert: always balanced */
	switch (p->kind) {
	case KILN_LOAD_PAPER:
		sample_paper(p, shape, seed, iteration, microbatch, layer, group, out);
		break;
	case KILN_LOAD_BALANCED:
		break;
	case KILN_LOAD_HOT_EXPERT:
		sample_hot_expert(p, shape, seed, layer, out);
		break;
	case KILN_LOAD_HOT_RANK: {
		uint64_t rank = draw(seed, TAG_HOT_RANK, 0, 0, 0, 0, 0) % (uint64_t)ep;
		set_hot(out, ep, (int32_t)rank,
		        p->max_factor < HOT_RANK_FACTOR ? p->max_factor : HOT_RANK_FACTOR);
		break;
	}
	case KILN_LOAD_ROTATING: {
		uint64_t start = draw(seed, TAG_ROTATING, 0, 0, 0, 0, 0) % (uint64_t)ep;
		uint64_t rank = (start + umod(iteration, (uint64_t)ep)) % (uint64_t)ep;
		set_hot(out, ep, (int32_t)rank,
		        p->max_factor < HOT_RANK_FACTOR ? p->max_factor : HOT_RANK_FACTOR);
		break;
	}
	case KILN_LOAD_BURST:
		sample_burst(p, shape, seed, iteration, microbatch, layer, group, out);
		break;
	case KILN_LOAD_ZIPF:
		sample_zipf(p, shape, seed, iteration, microbatch, layer, group, out);
		break;
	case KILN_LOAD_TRACE:
		break;
	}
}

/* ---------------------------------------------------------------- per expert */

/* Rank r's factor at rows[r] for every rank, spread evenly over its e
 * local experts as rows: rows[r * e + j] = rows[r] * balanced / e. In
 * place, from the last rank down, so no factor is overwritten before it
 * is read (rank r writes at r * e and beyond, the factors still unread
 * lie below r). */
static void spread_even(double *rows, int32_t ep, int32_t e, double balanced)
{
	for (int32_t r = ep - 1; r >= 0; r--) {
		double each = rows[r] * balanced / e;
		for (int32_t j = e - 1; j >= 0; j--)
			rows[(size_t)r * (size_t)e + (size_t)j] = each;
	}
}

/* The sum of rank r's entries of rows, in expert order (as sample_zipf
 * adds its factor). */
static double rank_sum(const double *rows, int32_t r, int32_t e)
{
	double sum = 0;
	for (int32_t j = 0; j < e; j++)
		sum += rows[(size_t)r * (size_t)e + (size_t)j];
	return sum;
}

/* zipf per expert: every expert's share as sample_zipf draws it, then its
 * rank's cap (cap_mean_one on the rank sums, which equal sample_zipf's
 * factors bit for bit) applied to its experts in proportion. */
static void zipf_experts(const kiln_load_profile *p, const kiln_load_shape *s, uint64_t seed,
                         int64_t it, int32_t mb, int32_t layer, int32_t group, int32_t e,
                         double balanced, double *rows)
{
	int32_t ep = s->ep;
	zipf_shares(p, s, seed, it, mb, layer, group, NULL, rows);
	double cap = p->max_factor, excess = 0, headroom = 0;
	for (int32_t r = 0; r < ep; r++) {
		double u = rank_sum(rows, r, e);
		if (u > cap)
			excess += u - cap;
		else
			headroom += cap - u;
	}
	double share = cap_share(excess, headroom);
	for (int32_t r = 0; r < ep; r++) {
		double u = rank_sum(rows, r, e);
		double f = share < 0 ? u : capped(u, cap, share);
		double *x = &rows[(size_t)r * (size_t)e];
		for (int32_t j = 0; j < e; j++)
			x[j] = u > 0 ? x[j] * (f / u) * balanced : f * balanced / e;
	}
}

/* hot-expert per expert: the hot expert takes what lifts its rank to the
 * profile's factor, every other expert of the layer the same rows, so
 * the other ranks hold sample_hot_expert's rest = (ep - hot) / (ep - 1)
 * each, spread evenly (docs/simulator.md, "Per-expert rows"). */
static void hot_expert_experts(const kiln_load_profile *p, const kiln_load_shape *s, uint64_t seed,
                               int32_t layer, int32_t e, double balanced, double *rows)
{
	int32_t ep = s->ep;
	uint64_t n = (uint64_t)ep * (uint64_t)e;
	uint64_t expert = draw(seed, TAG_HOT_EXPERT, 0, 0, layer, 0, 0) % n;
	double hot = min3(HOT_EXPERT_FACTOR, p->max_factor, hot_expert_bound(s));
	/* As set_hot clamps it. */
	hot = hot > ep ? ep : hot < 0 ? 0 : hot;
	double rest = ((double)ep - hot) / (double)(ep - 1);
	double other = rest * balanced / e;
	for (uint64_t x = 0; x < n; x++)
		rows[x] = other;
	rows[expert] = (hot - (double)(e - 1) * rest / e) * balanced;
}

void kiln_load_sample_experts(const kiln_load_profile *p, const kiln_load_shape *shape,
                              uint64_t seed, int64_t iteration, int32_t microbatch, int32_t layer,
                              int32_t group, double *out)
{
	int32_t ep = shape->ep;
	if (ep < 1)
		return;
	int32_t e = shape->experts_per_rank > 0 ? shape->experts_per_rank : 1;
	double balanced = (double)shape->tokens * shape->top_k / ep;
	if (p->kind == KILN_LOAD_ZIPF) {
		zipf_experts(p, shape, seed, iteration, microbatch, layer, group, e, balanced, out);
		return;
	}
	if (p->kind == KILN_LOAD_HOT_EXPERT && ep > 1) {
		hot_expert_experts(p, shape, seed, layer, e, balanced, out);
		return;
	}
	/* Rank-level profiles, factor traces, one-column token traces and
	 * the ranks a token trace has no row for: the rank's rows evenly. */
	kiln_load_sample(p, shape, seed, iteration, microbatch, layer, group, out);
	spread_even(out, ep, e, balanced);
	if (p->kind == KILN_LOAD_TRACE && p->trace->cells)
		sample_trace_cells(p->trace, shape, iteration, microbatch, layer, e, out);
}

/* ---------------------------------------------------------------- parsing */

/* Writes s (at most len bytes) to f quoted, with control and non-ASCII bytes
 * escaped and anything past 40 characters elided. */
static void put_shown(FILE *f, const char *s, size_t len)
{
	fputc('\'', f);
	for (size_t i = 0; i < len; i++) {
		if (i == 40) {
			fputs("...", f);
			break;
		}
		unsigned char c = (unsigned char)s[i];
		if (c == '\'' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20 || c >= 0x7f)
			fprintf(f, "\\x%02x", c);
		else
			fputc(c, f);
	}
	fputc('\'', f);
}

static const char *const profile_names[] = {"paper",    "balanced", "hot-expert", "hot-rank",
                                            "rotating", "burst",    "zipf"};
#define N_PROFILES (sizeof(profile_names) / sizeof(profile_names[0]))

static size_t edit_distance(const char *a, size_t la, const char *b)
{
	size_t lb = strlen(b);
	size_t row[32];
	if (lb >= 32)
		return (size_t)-1;
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0];
		row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			size_t up = row[j];
			size_t best = diag + (a[i - 1] != b[j - 1]);
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

static void unknown_profile(const char *spec, FILE *err)
{
	size_t len = strlen(spec);
	const char *colon = strchr(spec, ':');
	size_t stem = colon ? (size_t)(colon - spec) : len;
	const char *best = NULL;
	size_t best_d = (size_t)-1;
	for (size_t i = 0; i < N_PROFILES && stem <= 64; i++) {
		size_t d = edit_distance(spec, stem, profile_names[i]);
		if (d < best_d) {
			best_d = d;
			best = profile_names[i];
		}
	}
	fputs("kilnc: error: unknown load profile ", err);
	put_shown(err, spec, len);
	if (best && best_d <= 3 && 2 * best_d < strlen(best))
		fprintf(err, "; did you mean '%s%s'?", best,
		        strcmp(best, "zipf") == 0 ? ":ALPHA" : "");
	fputs("\nkilnc: note: load profiles: paper, balanced, hot-expert, hot-rank, rotating, "
	      "burst, zipf:ALPHA, or the path of a CSV trace (containing '/' or ending in .csv)\n",
	      err);
}

static int parse_zipf(kiln_load_profile *p, const char *spec, FILE *err)
{
	const char *a = spec + strlen("zipf:");
	double alpha = 0;
	if (kiln_num_f64_parse(a, strlen(a), -DBL_MAX, DBL_MAX, &alpha) != KILN_NUM_OK ||
	    !(alpha > 0)) {
		fputs("kilnc: error: load profile ", err);
		put_shown(err, spec, strlen(spec));
		fputs(" needs a positive exponent, as in zipf:1.2\n", err);
		return -1;
	}
	p->alpha = alpha;
	return 0;
}

static int zipf_tables(kiln_load_profile *p, kiln_arena *a)
{
	double *w = kiln_arena_alloc(a, (ZIPF_TABLE + 1) * sizeof(double));
	double *cum = kiln_arena_alloc(a, (ZIPF_TABLE + 1) * sizeof(double));
	if (!w || !cum)
		return -1;
	for (int32_t j = 1; j <= ZIPF_TABLE; j++) {
		w[j] = pow((double)j, -p->alpha);
		cum[j] = cum[j - 1] + w[j];
	}
	p->zipf_w = w;
	p->zipf_cum = cum;
	p->zipf_n = ZIPF_TABLE;
	return 0;
}

/* ---------------------------------------------------------------- trace parsing */

typedef struct tparse {
	const char *path;
	FILE *err;
	int errors;
	/* header: column names, borrowed from the file's text */
	int32_t ncols;
	const char **name;
	size_t *name_len;
} tparse;

static void terr(tparse *t, int64_t line, const char *fmt, ...)
{
	va_list ap;
	if (line > 0)
		fprintf(t->err, "%s:%lld: error: ", t->path, (long long)line);
	else
		fprintf(t->err, "%s: error: ", t->path);
	va_start(ap, fmt);
	vfprintf(t->err, fmt, ap);
	va_end(ap);
	t->errors++;
}

static int is_blank(char c)
{
	return c == ' ' || c == '\t';
}

/* One line of the text: [b, e) without its '\n' and a trailing '\r'. */
typedef struct line_ref {
	const char *b, *e;
} line_ref;

static line_ref next_line(const char **p, const char *end)
{
	line_ref l = {*p, end};
	const char *nl = memchr(*p, '\n', (size_t)(end - *p));
	if (nl) {
		l.e = nl;
		*p = nl + 1;
	} else {
		*p = end;
	}
	if (l.e > l.b && l.e[-1] == '\r')
		l.e--;
	return l;
}

/* Blank lines and '#' comments carry no data. */
static int is_content(line_ref l)
{
	const char *c = l.b;
	while (c < l.e && is_blank(*c))
		c++;
	return c < l.e && *c != '#';
}

static int32_t count_fields(line_ref l)
{
	int32_t n = 1;
	for (const char *c = l.b; c < l.e; c++)
		n += *c == ',';
	return n;
}

/* The next comma-separated field from *p (up to e), trimmed. */
static line_ref next_field(const char **p, const char *e)
{
	const char *c = memchr(*p, ',', (size_t)(e - *p));
	line_ref f = {*p, c ? c : e};
	*p = c ? c + 1 : e;
	while (f.b < f.e && is_blank(*f.b))
		f.b++;
	while (f.e > f.b && is_blank(f.e[-1]))
		f.e--;
	return f;
}

static int field_is(line_ref f, const char *s)
{
	size_t n = strlen(s);
	return (size_t)(f.e - f.b) == n && memcmp(f.b, s, n) == 0;
}

static const char *const key_names[4] = {"iteration", "microbatch", "layer", "rank"};

static int parse_header(tparse *t, line_ref l, int64_t line, kiln_arena *a, int *out_tokens)
{
	int32_t n = count_fields(l);
	const char *p = l.b;
	int ok = n >= 5;
	line_ref f[4];
	for (int i = 0; i < 4 && ok; i++) {
		f[i] = next_field(&p, l.e);
		ok = field_is(f[i], key_names[i]);
	}
	if (!ok) {
		terr(t, line,
		     "expected the header 'iteration,microbatch,layer,rank,...' (then one "
		     "'factor' column, or one column per local expert), got ");
		put_shown(t->err, l.b, (size_t)(l.e - l.b));
		fputc('\n', t->err);
		return -1;
	}
	t->ncols = n;
	t->name = kiln_arena_alloc(a, (size_t)n * sizeof(*t->name));
	t->name_len = kiln_arena_alloc(a, (size_t)n * sizeof(*t->name_len));
	if (!t->name || !t->name_len) {
		fprintf(t->err, "kilnc: error: out of memory\n");
		return -1;
	}
	p = l.b;
	int factor = 0;
	for (int32_t i = 0; i < n; i++) {
		line_ref c = next_field(&p, l.e);
		t->name[i] = c.b;
		t->name_len[i] = (size_t)(c.e - c.b);
		if (c.b == c.e) {
			terr(t, line, "column %d of the header has no name\n", i + 1);
			return -1;
		}
		factor += i >= 4 && field_is(c, "factor");
	}
	if (factor && n != 5) {
		terr(t, line,
		     "a 'factor' column must be the only value column; the header has %d\n", n - 4);
		return -1;
	}
	*out_tokens = !factor;
	return 0;
}

/* A key column: a non-negative integer no larger than max. */
static int parse_key(tparse *t, int64_t line, int32_t col, line_ref f, int64_t max, int64_t *out)
{
	size_t len = (size_t)(f.e - f.b);
	int rc = kiln_num_i64_parse(f.b, len, 0, max, out);
	double d;
	if (rc == KILN_NUM_OK)
		return 0;
	if (len == 0) {
		terr(t, line, "column '%s' is empty\n", key_names[col]);
	} else if (rc == KILN_NUM_RANGE && f.b[0] != '-') {
		terr(t, line, "column '%s' is ", key_names[col]);
		put_shown(t->err, f.b, len);
		fprintf(t->err, ", over the limit %lld\n", (long long)max);
	} else if (kiln_num_f64_parse(f.b, len, -DBL_MAX, DBL_MAX, &d) != KILN_NUM_SYNTAX &&
	           f.b[0] == '-') {
		terr(t, line, "column '%s' has the negative value ", key_names[col]);
		put_shown(t->err, f.b, len);
		fputc('\n', t->err);
	} else {
		terr(t, line, "column '%s' is ", key_names[col]);
		put_shown(t->err, f.b, len);
		fputs(", not a non-negative integer\n", t->err);
	}
	return -1;
}

static int parse_value(tparse *t, int64_t line, int32_t col, line_ref f, double *out)
{
	size_t len = (size_t)(f.e - f.b);
	double v = 0;
	if (len == 0) {
		terr(t, line, "column '%.*s' is empty\n", (int)t->name_len[col], t->name[col]);
		return -1;
	}
	int rc = kiln_num_f64_parse(f.b, len, -DBL_MAX, DBL_MAX, &v);
	if (rc == KILN_NUM_SYNTAX) {
		terr(t, line, "column '%.*s' is ", (int)t->name_len[col], t->name[col]);
		put_shown(t->err, f.b, len);
		fputs(", not a number\n", t->err);
		return -1;
	}
	if (rc == KILN_NUM_RANGE) {
		terr(t, line, "column '%.*s' is ", (int)t->name_len[col], t->name[col]);
		put_shown(t->err, f.b, len);
		fputs(", out of range\n", t->err);
		return -1;
	}
	if (v < 0) {
		terr(t, line, "column '%.*s' has the negative value ", (int)t->name_len[col],
		     t->name[col]);
		put_shown(t->err, f.b, len);
		fputc('\n', t->err);
		return -1;
	}
	*out = v;
	return 0;
}

static int row_cmp(const void *pa, const void *pb)
{
	const trace_row *a = pa, *b = pb;
	int c = key_cmp(a->iteration, a->microbatch, a->layer, a->rank, b);
	if (c)
		return c;
	return (a->line > b->line) - (a->line < b->line);
}

/* Reads the whole regular file at path (at most KILN_LOAD_TRACE_MAX_BYTES) into a
 * malloc'd buffer the caller frees; NULL after reporting why not. */
static char *read_trace(tparse *t, size_t *out_len)
{
	int fd = open(t->path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		terr(t, 0, "cannot open the trace: %s\n", strerror(errno));
		return NULL;
	}
	struct stat st;
	char *buf = NULL;
	if (fstat(fd, &st) != 0) {
		terr(t, 0, "cannot stat the trace: %s\n", strerror(errno));
	} else if (!S_ISREG(st.st_mode)) {
		terr(t, 0, "not a regular file\n");
	} else if ((int64_t)st.st_size > KILN_LOAD_TRACE_MAX_BYTES) {
		terr(t, 0, "the trace is %lld bytes, over the limit of 256 MiB\n",
		     (long long)st.st_size);
	} else if (!(buf = malloc((size_t)st.st_size + 1))) {
		fprintf(t->err, "kilnc: error: out of memory\n");
	} else {
		size_t want = (size_t)st.st_size + 1, got = 0;
		while (got < want) {
			ssize_t r = read(fd, buf + got, want - got);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				if (r < 0) {
					terr(t, 0, "cannot read the trace: %s\n", strerror(errno));
					free(buf);
					buf = NULL;
				}
				break;
			}
			got += (size_t)r;
		}
		if (buf && got > (size_t)st.st_size) {
			terr(t, 0, "the trace changed while it was read\n");
			free(buf);
			buf = NULL;
		}
		*out_len = got;
	}
	close(fd);
	return buf;
}

/* Iterations up to 10^18 - 1 (18 digits); the other keys fit an int32_t. */
static const int64_t key_max[4] = {999999999999999999, INT32_MAX - 1, INT32_MAX - 1, INT32_MAX - 1};

/* The data rows after first_line into rows (and, when cells is not NULL,
 * their value columns into cells, ncols - 4 per row, in file order). */
static int parse_rows(tparse *t, const char *text, size_t len, int64_t first_line, trace_row *rows,
                      double *cells, int64_t *out_n)
{
	const char *p = text, *end = text + len;
	int64_t n = 0;
	for (int64_t line = 1; p < end; line++) {
		line_ref l = next_line(&p, end);
		if (line <= first_line || !is_content(l))
			continue;
		if (t->errors >= TRACE_MAX_ERRORS) {
			fprintf(t->err, "%s: note: stopping after %d errors\n", t->path,
			        TRACE_MAX_ERRORS);
			return -1;
		}
		int32_t nf = count_fields(l);
		if (nf != t->ncols) {
			terr(t, line, "expected %d fields as in the header, got %d\n", t->ncols,
			     nf);
			continue;
		}
		const char *c = l.b;
		int64_t key[4];
		int bad = 0;
		for (int32_t i = 0; i < 4; i++)
			bad |= parse_key(t, line, i, next_field(&c, l.e), key_max[i], &key[i]) != 0;
		double sum = 0;
		for (int32_t i = 4; i < nf; i++) {
			double v = 0;
			bad |= parse_value(t, line, i, next_field(&c, l.e), &v) != 0;
			sum += v;
			if (cells)
				cells[(size_t)n * (size_t)(nf - 4) + (size_t)(i - 4)] = v;
		}
		if (!bad && !isfinite(sum)) {
			terr(t, line, "the value columns sum past the largest number\n");
			bad = 1;
		}
		if (bad)
			continue;
		trace_row *r = &rows[n++];
		r->iteration = key[0];
		r->microbatch = (int32_t)key[1];
		r->layer = (int32_t)key[2];
		r->rank = (int32_t)key[3];
		r->line = (int32_t)line;
		r->value = sum; /* the factor itself when there is one value column */
	}
	*out_n = n;
	return t->errors ? -1 : 0;
}

static int parse_trace(const char *path, kiln_arena *a, FILE *err, const kiln_load_trace **out)
{
	tparse t = {.path = path, .err = err};
	size_t len = 0;
	char *text = read_trace(&t, &len);
	if (!text)
		return -1;
	int rc = -1;
	/* Spreadsheets like to start a CSV with a UTF-8 byte order mark. */
	const char *body = text;
	if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0) {
		body += 3;
		len -= 3;
	}
	/* A trace is text: a NUL byte (a binary file, a truncated write) is
	 * refused wherever it is, a comment included. */
	const char *nul = memchr(body, '\0', len);
	if (nul) {
		int64_t at = 1;
		for (const char *q = body; q < nul; q++)
			at += *q == '\n';
		terr(&t, at, "a NUL byte: a trace is text (CSV), not a binary file\n");
		goto done;
	}
	/* First pass: find the header and count the data rows, so the row
	 * limit is enforced before anything big is allocated. */
	const char *p = body, *end = body + len;
	line_ref header = {NULL, NULL};
	int64_t header_line = 0, nrows = 0, line = 0;
	while (p < end) {
		line_ref l = next_line(&p, end);
		line++;
		if (!is_content(l))
			continue;
		if (!header.b) {
			header = l;
			header_line = line;
		} else if (++nrows > KILN_LOAD_TRACE_MAX_ROWS) {
			terr(&t, line, "the trace has more than %d rows\n",
			     KILN_LOAD_TRACE_MAX_ROWS);
			goto done;
		}
	}
	if (!header.b) {
		terr(&t, line > 0 ? line : 1,
		     "empty trace; expected the header 'iteration,microbatch,layer,rank,...'\n");
		goto done;
	}
	int tokens = 0;
	if (parse_header(&t, header, header_line, a, &tokens) != 0)
		goto done;
	if (nrows == 0) {
		terr(&t, header_line, "no data rows after the header\n");
		goto done;
	}
	trace_row *rows = kiln_arena_alloc(a, (size_t)nrows * sizeof(trace_row));
	kiln_load_trace *tr = kiln_arena_alloc(a, sizeof(*tr));
	if (!rows || !tr) {
		fprintf(err, "kilnc: error: out of memory\n");
		goto done;
	}
	/* Token traces of several columns keep every column (the per-expert
	 * rows, kiln_load_sample_experts). Every field of a row is at least
	 * one character and a separator, so a file whose rows all parse holds
	 * at least 2 * values bytes per row: a header promising more columns
	 * than the text can hold fails below without them. */
	int64_t values = t.ncols - 4;
	double *cells = NULL;
	if (tokens && values > 1 && nrows <= (int64_t)(len / 2) / values) {
		cells = kiln_arena_alloc(a, (size_t)nrows * (size_t)values * sizeof(double));
		if (!cells) {
			fprintf(err, "kilnc: error: out of memory\n");
			goto done;
		}
	}
	int64_t n = 0;
	if (parse_rows(&t, body, len, header_line, rows, cells, &n) != 0)
		goto done;
	if (tokens && values > 1 && !cells) {
		terr(&t, header_line, "the trace is too short for its %lld value columns\n",
		     (long long)values);
		goto done;
	}
	/* The rows' lines in file order (increasing), to find each sorted
	 * row's columns. */
	int32_t *lines = NULL;
	if (cells && !(lines = malloc((size_t)n * sizeof(int32_t) + 1))) {
		fprintf(err, "kilnc: error: out of memory\n");
		goto done;
	}
	for (int64_t i = 0; cells && i < n; i++)
		lines[i] = rows[i].line;
	qsort(rows, (size_t)n, sizeof(trace_row), row_cmp);
	int32_t *cell_row = NULL;
	if (cells && !(cell_row = kiln_arena_alloc(a, (size_t)n * sizeof(int32_t) + 1))) {
		free(lines);
		fprintf(err, "kilnc: error: out of memory\n");
		goto done;
	}
	for (int64_t i = 0; cells && i < n; i++) {
		int64_t lo = 0, hi = n - 1;
		while (lo < hi) {
			int64_t mid = lo + (hi - lo) / 2;
			if (lines[mid] < rows[i].line)
				lo = mid + 1;
			else
				hi = mid;
		}
		cell_row[i] = (int32_t)lo;
	}
	free(lines);
	for (int64_t i = 1, first = 0; i < n; i++) {
		const trace_row *r = &rows[i];
		if (key_cmp(r->iteration, r->microbatch, r->layer, r->rank, &rows[first]) != 0) {
			first = i;
			continue;
		}
		if (t.errors >= TRACE_MAX_ERRORS) {
			fprintf(err, "%s: note: stopping after %d errors\n", path,
			        TRACE_MAX_ERRORS);
			break;
		}
		terr(&t, r->line,
		     "duplicate row for iteration %lld, microbatch %d, layer %d, rank %d (first at "
		     "line %d)\n",
		     (long long)r->iteration, r->microbatch, r->layer, r->rank, rows[first].line);
	}
	if (t.errors)
		goto done;
	tr->path = kiln_arena_strdup(a, path);
	tr->rows = rows;
	tr->n = n;
	tr->header_line = header_line;
	tr->cells = cells;
	tr->cell_row = cell_row;
	kiln_load_trace_info *info = &tr->info;
	info->first_iteration = rows[0].iteration;
	info->iterations = rows[n - 1].iteration - rows[0].iteration + 1;
	info->rows = n;
	info->values = t.ncols - 4;
	info->tokens = tokens;
	for (int64_t i = 0; i < n; i++) {
		if (rows[i].microbatch >= info->microbatches)
			info->microbatches = rows[i].microbatch + 1;
		if (rows[i].layer >= info->layers)
			info->layers = rows[i].layer + 1;
		if (rows[i].rank >= info->ranks)
			info->ranks = rows[i].rank + 1;
	}
	if (!tr->path) {
		fprintf(err, "kilnc: error: out of memory\n");
		goto done;
	}
	*out = tr;
	rc = 0;
done:
	free(text);
	return rc;
}

/* ---------------------------------------------------------------- parse */

static int is_trace_path(const char *spec)
{
	size_t n = strlen(spec);
	return strchr(spec, '/') || (n > 4 && strcmp(spec + n - 4, ".csv") == 0);
}

int kiln_load_parse(const char *spec, double max_factor, kiln_arena *a, FILE *err,
                    kiln_load_profile **out)
{
	static const struct {
		const char *name;
		kiln_load_kind kind;
	} named[] = {
	    {"paper", KILN_LOAD_PAPER},           {"balanced", KILN_LOAD_BALANCED},
	    {"hot-expert", KILN_LOAD_HOT_EXPERT}, {"hot-rank", KILN_LOAD_HOT_RANK},
	    {"rotating", KILN_LOAD_ROTATING},     {"burst", KILN_LOAD_BURST},
	};
	if (!spec || !*spec) {
		unknown_profile("", err);
		return -1;
	}
	if (!isfinite(max_factor) || !(max_factor >= 1)) {
		fprintf(
		    err,
		    "kilnc: error: the load factor cap %g must be at least 1 (load.max_factor)\n",
		    max_factor);
		return -1;
	}
	kiln_load_profile *p = kiln_arena_alloc(a, sizeof(*p));
	if (!p || !(p->name = kiln_arena_strdup(a, spec))) {
		fprintf(err, "kilnc: error: out of memory\n");
		return -1;
	}
	p->max_factor = max_factor;
	int found = 0;
	for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
		if (strcmp(spec, named[i].name) == 0) {
			p->kind = named[i].kind;
			found = 1;
		}
	}
	if (found) {
		/* done */
	} else if (strcmp(spec, "zipf") == 0 || strncmp(spec, "zipf:", 5) == 0) {
		if (strcmp(spec, "zipf") == 0) {
			fputs("kilnc: error: load profile 'zipf' needs a positive exponent, as in "
			      "zipf:1.2\n",
			      err);
			return -1;
		}
		p->kind = KILN_LOAD_ZIPF;
		if (parse_zipf(p, spec, err) != 0)
			return -1;
		if (zipf_tables(p, a) != 0) {
			fprintf(err, "kilnc: error: out of memory\n");
			return -1;
		}
	} else if (is_trace_path(spec)) {
		p->kind = KILN_LOAD_TRACE;
		if (parse_trace(spec, a, err, &p->trace) != 0)
			return -1;
	} else {
		unknown_profile(spec, err);
		return -1;
	}
	*out = p;
	return 0;
}

/* The comment line and header the writer starts with; the profile's name
 * with control bytes shown as '?', so that no name can break the line. */
static int csv_header(char *buf, size_t size, const kiln_load_profile *p, uint64_t seed, int32_t ep)
{
	char name[256];
	size_t n = 0;
	for (const char *c = p->name; *c && n < sizeof name - 1; c++)
		name[n++] = (unsigned char)*c < 0x20 || *c == 0x7f ? '?' : *c;
	name[n] = '\0';
	return snprintf(buf, size,
	                "# kilnc simulate --emit-loads: profile %s, seed %llu, %d EP ranks\n"
	                "iteration,microbatch,layer,rank,factor\n",
	                name, (unsigned long long)seed, (int)ep);
}

/* The shape's counts as the writer takes them (0 means 1). */
static void csv_dims(const kiln_load_shape *shape, int32_t *ep, int32_t *mbs, int32_t *layers)
{
	*ep = shape->ep > 0 ? shape->ep : 1;
	*mbs = shape->microbatches > 0 ? shape->microbatches : 1;
	*layers = shape->layers > 0 ? shape->layers : 1;
}

/* Factors per sample: the writer's buffer. */
#define CSV_MAX_EP 4096

/* Calls row(ctx, text, len) for the header, then every data row of the
 * trace, in order; stops at the first nonzero return. */
static int csv_walk(const kiln_load_profile *p, const kiln_load_shape *shape, uint64_t seed,
                    int64_t iterations, int (*row)(void *ctx, const char *s, int len), void *ctx)
{
	int32_t ep, mbs, layers;
	csv_dims(shape, &ep, &mbs, &layers);
	double out[CSV_MAX_EP];
	char buf[512];
	if (ep > CSV_MAX_EP)
		return -1;
	int len = csv_header(buf, sizeof buf, p, seed, ep);
	if (len < 0 || (size_t)len >= sizeof buf || row(ctx, buf, len) != 0)
		return -1;
	for (int64_t it = 0; it < iterations; it++)
		for (int32_t mb = 0; mb < mbs; mb++)
			for (int32_t l = 0; l < layers; l++) {
				kiln_load_sample(p, shape, seed, it, mb, l, 0, out);
				for (int32_t r = 0; r < ep; r++) {
					len = snprintf(buf, sizeof buf, "%lld,%d,%d,%d,%.17g\n",
					               (long long)it, mb, l, r, out[r]);
					if (len < 0 || (size_t)len >= sizeof buf ||
					    row(ctx, buf, len) != 0)
						return -1;
				}
			}
	return 0;
}

int64_t kiln_load_csv_rows(const kiln_load_shape *shape, int64_t iterations)
{
	int32_t ep, mbs, layers;
	csv_dims(shape, &ep, &mbs, &layers);
	int64_t per = (int64_t)ep * mbs * layers, rows;
	if (iterations < 0 || __builtin_mul_overflow(per, iterations, &rows))
		return INT64_MAX;
	return rows;
}

static int count_bytes(void *ctx, const char *s, int len)
{
	(void)s;
	*(int64_t *)ctx += len;
	return 0;
}

int64_t kiln_load_csv_bytes(const kiln_load_profile *p, const kiln_load_shape *shape, uint64_t seed,
                            int64_t iterations)
{
	int64_t bytes = 0;
	if (kiln_load_csv_rows(shape, iterations) > KILN_LOAD_TRACE_MAX_ROWS ||
	    csv_walk(p, shape, seed, iterations, count_bytes, &bytes) != 0)
		return -1;
	return bytes;
}

static int put_row(void *ctx, const char *s, int len)
{
	return fwrite(s, 1, (size_t)len, ctx) == (size_t)len ? 0 : -1;
}

int kiln_load_write_csv(const kiln_load_profile *p, const kiln_load_shape *shape, uint64_t seed,
                        int64_t iterations, FILE *f)
{
	/* What --loads refuses is never written (the caller checks first and
	 * says why; kiln_load_csv_bytes). */
	if (kiln_load_csv_rows(shape, iterations) > KILN_LOAD_TRACE_MAX_ROWS)
		return -1;
	if (csv_walk(p, shape, seed, iterations, put_row, f) != 0)
		return -1;
	return ferror(f) ? -1 : 0;
}

double kiln_sim_load_factor_max(const kiln_load_shape *s)
{
	if (s->ep <= 1 || s->top_k < 1)
		return 1.0;
	int32_t k = s->top_k < s->experts_per_rank ? s->top_k : s->experts_per_rank;
	return (double)s->ep * (double)k / (double)s->top_k;
}
