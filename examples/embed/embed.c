/* examples/embed/embed.c: the kiln runtime embedded in a (pretend) trainer.
 *
 *   embed PLAN.kiln [STAGE]
 *
 * A trainer links libkiln_rt, opens the plan blob that `kilnc compile -o`
 * wrote, and right after each MoE gate asks kiln_rt_select which saved
 * activations ("units") of that layer to keep, recompute or offload for the
 * running micro-batch, given how many token rows the router really sent to
 * this device's experts and how much device memory is free.
 *
 * This program plays that trainer for one pipeline stage, without a GPU.
 * It runs six micro-batches the 1F1B way (once as many are in flight as
 * the plan says, each new forward follows the oldest one's backward), all
 * at balanced load except micro-batch 3, which routes 2.5 times as many
 * rows. It tracks device memory with the runtime's accounting API, as a
 * trainer whose allocator cannot report free memory would. For each
 * decision it prints the plan's bytes, exposed time and flags and the
 * units it does not keep, then one summary line per micro-batch:
 *
 *   mb 3: load 2.50x, saved 4318119 bytes (4.12 MiB), needed 4282628, ...
 *
 * It includes only <kiln/runtime.h> and libc. README.md, "Embedding the
 * runtime", shows how to build it against an installed kiln.
 */
#include <kiln/runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_MICROBATCHES = 6, SPIKE_MB = 3, MAX_LAYERS = 64 };
static const double SPIKE_FACTOR = 2.5;

/* What one micro-batch holds on this stage between its forward and its
 * backward: per layer, the plan's actions (borrowed from the blob, valid
 * until kiln_rt_close) and the rows the layer saw. */
typedef struct microbatch {
	const uint8_t *actions[MAX_LAYERS];
	uint64_t rows[MAX_LAYERS];
} microbatch;

typedef struct sim {
	kiln_rt *rt;
	int32_t stage;
	kiln_rt_stage_info st;
	int32_t layers[MAX_LAYERS]; /* model layer numbers, in execution order */
	kiln_rt_layer_info info[MAX_LAYERS];
	int32_t n_layers;
	microbatch mb[N_MICROBATCHES];
} sim;

static const char *human(uint64_t bytes, char buf[32])
{
	const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)bytes;
	int u = 0;
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(buf, 32, u ? "%.2f %s" : "%.0f %s", v, unit[u]);
	return buf;
}

static int fail(const char *what, int rc)
{
	fprintf(stderr, "embed: %s: %s\n", what, kiln_rt_strerror(rc));
	return 1;
}

static const char *flag_names(uint32_t flags)
{
	switch (flags & (KILN_PLAN_OVER_BUDGET | KILN_PLAN_LOAD_BEYOND)) {
	case 0:
		return "none";
	case KILN_PLAN_OVER_BUDGET:
		return "over-budget";
	case KILN_PLAN_LOAD_BEYOND:
		return "load-beyond";
	default:
		return "over-budget,load-beyond";
	}
}

/* Lists the units the plan does not keep, by name:
 * "recompute a, b; offload c, d". */
static void print_actions(const sim *s, int32_t li, const kiln_plan *p)
{
	int n = 0;
	printf("     ");
	for (int a = KILN_RT_RECOMPUTE; a <= KILN_RT_OFFLOAD; a++) {
		int first = 1;
		for (int32_t u = 0; u < p->n_units; u++) {
			kiln_rt_unit_info ui;
			if (p->actions[u] != a ||
			    kiln_rt_unit_get(s->rt, s->layers[li], u, &ui) != 0)
				continue;
			if (first)
				printf("%s %s ", n ? ";" : "", kiln_rt_action_name(a));
			else
				printf(", ");
			printf("%s", ui.name);
			first = 0;
			n++;
		}
	}
	printf("%s\n", n ? "" : " keep everything");
}

/* The forward pass of micro-batch k at load factor f: one select per layer,
 * right after its gate, then the layer's units are produced on the device
 * and, where the plan says so, offloaded (recomputed units are dropped
 * right away, so they never count). */
static int forward(sim *s, uint32_t k, double f)
{
	microbatch *m = &s->mb[k];
	uint64_t saved = 0, need = 0;
	double exposed_us = 0;
	uint32_t flags = 0;
	/* The stage's fixed activations, which no plan touches. */
	int rc = kiln_rt_acct_record(s->rt, k, KILN_ACCT_PRODUCED, s->st.fixed_bytes);
	if (rc != 0)
		return fail("acct_record", rc);
	for (int32_t i = 0; i < s->n_layers; i++) {
		/* The router's real count would come from the gate; here it
		 * is the balanced count times f. A trainer that has the count
		 * per local expert passes the array in q.tokens instead. */
		uint64_t rows = (uint64_t)(f * (double)s->info[i].balanced_rows + 0.5);
		kiln_query q = {
		    .stage = s->stage,
		    .layer = s->layers[i],
		    .total_rows = rows,
		    /* Free memory, and the micro-batches still to
		     * come, from the accounting this program keeps. */
		    .free_bytes = KILN_RT_FREE_FROM_ACCOUNTING,
		    .microbatch = k,
		};
		kiln_plan p;
		rc = kiln_rt_select(s->rt, &q, &p);
		if (rc != 0)
			return fail("select", rc);
		printf("  mb %u layer %2d (%s", k, s->layers[i], s->info[i].moe ? "moe" : "dense");
		if (s->info[i].moe)
			printf(", %.2fx", p.load_factor);
		printf(", bucket %d): save %llu of %llu needed, resident %llu of %llu available, "
		       "exposed %.1f us%s%s\n",
		       p.bucket, (unsigned long long)p.saved_bytes,
		       (unsigned long long)p.need_bytes, (unsigned long long)p.resident_bytes,
		       (unsigned long long)p.avail_bytes, p.exposed_us,
		       p.flags & KILN_PLAN_OVER_BUDGET ? ", OVER BUDGET" : "",
		       p.flags & KILN_PLAN_LOAD_BEYOND ? ", LOAD BEYOND PLAN" : "");
		print_actions(s, i, &p);

		/* Follow the plan: this is where a trainer would tag tensors
		 * for the copy engine (kiln_copy_offload) or for recompute. */
		for (int32_t u = 0; u < p.n_units; u++) {
			uint64_t bytes = kiln_rt_unit_bytes(s->rt, s->layers[i], u, rows);
			if (p.actions[u] == KILN_RT_RECOMPUTE)
				continue;
			rc = kiln_rt_acct_record(s->rt, k, KILN_ACCT_PRODUCED, bytes);
			if (rc == 0 && p.actions[u] == KILN_RT_OFFLOAD)
				rc = kiln_rt_acct_record(s->rt, k, KILN_ACCT_OFFLOADED, bytes);
			if (rc != 0)
				return fail("acct_record", rc);
		}
		m->actions[i] = p.actions;
		m->rows[i] = rows;
		saved += p.saved_bytes;
		need += p.need_bytes;
		exposed_us += p.exposed_us;
		flags |= p.flags;
	}
	kiln_acct acct;
	kiln_rt_acct_get(s->rt, &acct);
	char b1[32], b2[32];
	printf("mb %u: load %.2fx, saved %llu bytes (%s), needed %llu, exposed %.1f us, "
	       "flags %s; device %s held\n",
	       k, f, (unsigned long long)saved, human(saved, b1), (unsigned long long)need,
	       exposed_us, flag_names(flags), human(acct.device_bytes, b2));
	return 0;
}

/* The backward pass of micro-batch k releases what its forward left:
 * offloaded units come back first, then everything is freed. */
static int backward(sim *s, uint32_t k)
{
	const microbatch *m = &s->mb[k];
	for (int32_t i = s->n_layers - 1; i >= 0; i--) {
		for (int32_t u = 0; u < s->info[i].n_units; u++) {
			uint64_t bytes = kiln_rt_unit_bytes(s->rt, s->layers[i], u, m->rows[i]);
			int rc = 0;
			if (m->actions[i][u] == KILN_RT_RECOMPUTE)
				continue;
			if (m->actions[i][u] == KILN_RT_OFFLOAD)
				rc = kiln_rt_acct_record(s->rt, k, KILN_ACCT_RELOADED, bytes);
			if (rc == 0)
				rc = kiln_rt_acct_record(s->rt, k, KILN_ACCT_FREED, bytes);
			if (rc != 0)
				return fail("acct_record", rc);
		}
	}
	int rc = kiln_rt_acct_record(s->rt, k, KILN_ACCT_FREED, s->st.fixed_bytes);
	return rc != 0 ? fail("acct_record", rc) : 0;
}

int main(int argc, char **argv)
{
	if (argc < 2 || argc > 3) {
		fprintf(stderr, "usage: %s PLAN.kiln [STAGE]\n", argv[0]);
		return 2;
	}
	static sim s;
	/* STAGE: decimal digits, as kilnc reads numbers (atoi made "x" stage 0). */
	const char *st = argc > 2 ? argv[2] : "0";
	size_t digits = strspn(st, "0123456789");
	if (digits == 0 || digits > 9 || st[digits] != '\0') {
		fprintf(stderr, "%s: STAGE must be a stage number (0 to 999999999), got '%s'\n",
		        argv[0], st);
		return 2;
	}
	s.stage = atoi(st);

	/* Opening validates the whole blob once; afterwards no call allocates. */
	int rc = kiln_rt_open_file(argv[1], &s.rt);
	if (rc != 0)
		return fail(argv[1], rc);

	kiln_rt_info info;
	kiln_rt_info_get(s.rt, &info);
	char b1[32], b2[32], b3[32];
	printf("plan %s: model %s, %s, format %d.%d, %zu bytes\n", argv[1], info.model,
	       info.compiler, info.major, info.minor, info.blob_bytes);
	printf("  %d stages, %d planned layers (%d in the model), %d load buckets up to %.2fx\n",
	       info.n_stages, info.n_layers, info.n_model_layers, info.n_buckets, info.max_factor);

	rc = kiln_rt_stage_get(s.rt, s.stage, &s.st);
	if (rc != 0) {
		kiln_rt_close(s.rt);
		return fail("stage", rc);
	}
	printf("stage %d: capacity %s, static %s, budget %s per micro-batch, %.1f in flight, "
	       "safe up to %.2fx\n",
	       s.stage, human(s.st.capacity_bytes, b1), human(s.st.static_bytes, b2),
	       human(s.st.budget_bytes, b3), s.st.inflight, s.st.safety_factor);

	/* The stage's layers, in execution order. */
	for (int32_t l = 0; l < info.n_model_layers; l++) {
		kiln_rt_layer_info li;
		if (kiln_rt_layer_get(s.rt, l, &li) != 0 || li.stage != s.stage ||
		    li.position < 0 || li.position >= MAX_LAYERS)
			continue;
		s.layers[li.position] = l;
		s.info[li.position] = li;
		if (li.position + 1 > s.n_layers)
			s.n_layers = li.position + 1;
	}

	/* Device memory for activations: the stage's capacity minus its
	 * static bytes (limit 0). Accounting counts what we record. */
	rc = kiln_rt_acct_reset(s.rt, s.stage, 0);
	if (rc != 0) {
		kiln_rt_close(s.rt);
		return fail("acct_reset", rc);
	}

	/* 1F1B: once `slots` micro-batches are in flight, each new forward
	 * follows the backward of the oldest one. */
	uint32_t slots = 1;
	while (slots < s.st.inflight && slots < N_MICROBATCHES)
		slots++;
	uint32_t oldest = 0;
	for (uint32_t k = 0; k < N_MICROBATCHES && rc == 0; k++) {
		if (k - oldest >= slots)
			rc = backward(&s, oldest++);
		if (rc == 0)
			rc = forward(&s, k, k == SPIKE_MB ? SPIKE_FACTOR : 1.0);
	}
	while (rc == 0 && oldest < N_MICROBATCHES)
		rc = backward(&s, oldest++);

	kiln_acct acct;
	kiln_rt_acct_get(s.rt, &acct);
	if (rc == 0)
		printf("peak device %s of %s for activations: %s\n",
		       human(acct.peak_device_bytes, b1), human(acct.limit_bytes, b2),
		       acct.peak_device_bytes <= acct.limit_bytes ? "fits" : "OUT OF MEMORY");
	kiln_rt_close(s.rt);
	return rc;
}
