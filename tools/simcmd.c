/* tools/simcmd.c: `kilnc simulate`, the policies side by side on one load
 * pattern (sim/, docs/simulator.md). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "frontend/frontend.h"
#include "kiln/runtime.h"
#include "passes/passes.h"
#include "sim/sim.h"
#include "tools/output.h"
#include "tools/tools.h"

static const char HELP_SIMULATE[] =
    "usage: kilnc simulate MODEL --policy P[,P...] [--plan PLAN.kiln] [--iters N]\n"
    "                      [--seed S] [--loads PROFILE|FILE.csv] [--exact] [--groups G]\n"
    "                      [--restart-s SECONDS] [--checkpoint-every N] [--json]\n"
    "                      [--no-group-counts] [--no-slack]\n"
    "                      [--emit-trace F] [--emit-loads F]\n"
    "\n"
    "Replays iterations of MODEL's training through memory policies, side by side\n"
    "on the same loads: per iteration and EP group the load of every rank for\n"
    "every micro-batch and MoE layer, each layer's decision with the memory\n"
    "really free, the pipeline's timing, out-of-memory failures (a restart plus\n"
    "the progress since the last checkpoint). docs/simulator.md.\n"
    "\n"
    "  --policy P,...   unbounded, full-recompute, megatron, megatron-capacity[:CF],\n"
    "                   static-aggressive, adapipe, mindspeed, megatron-paged-stash,\n"
    "                   kiln,\n"
    "                   kiln:no-offload, kiln:no-adaptive, kiln:no-overlap,\n"
    "                   kiln:no-adaptive+no-overlap, or all\n"
    "  --plan F         the blob kiln decides with (default: compiled now); it\n"
    "                   must have been compiled from MODEL (same model hash)\n"
    "  --iters N        iterations (default 100)\n"
    "  --seed S         load seed (default 1)\n"
    "  --loads L        paper (default), balanced, hot-expert, hot-rank, rotating,\n"
    "                   burst, zipf:ALPHA, or a CSV trace\n"
    "  --exact          follow every EP rank (default: the statistical method of\n"
    "                   docs/simulator.md, \"Scale\")\n"
    "  --groups G       simulate G of the EP groups (default all)\n"
    "  --no-group-counts  kiln's queries without the EP group's counts (no group\n"
    "                   fallback beyond the declared load; docs/runtime.md)\n"
    "  --no-slack       no exposed time hides behind a slower rank of the EP group:\n"
    "                   each layer takes the group's largest compute plus its\n"
    "                   largest exposed time (default: each rank's exposed time\n"
    "                   adds to its own compute; docs/simulator.md, \"Slack\")\n"
    "  --restart-s X    cost of one restart after an out-of-memory failure (284)\n"
    "  --checkpoint-every N  iterations between checkpoints (100)\n"
    "  --json           one JSON document (docs/cli.md)\n"
    "  --emit-trace F   the last iteration's pipeline schedule of every policy as\n"
    "                   Chrome trace JSON (Perfetto): a process per policy, a\n"
    "                   thread per stage\n"
    "  --emit-loads F   the sampled loads of EP group 0 as a CSV trace\n"
    "                   (iteration,microbatch,layer,rank,factor), what --loads\n"
    "                   and examples/trainer replay; without --policy, only that\n"
    "\n"
    "Both outputs follow kiln's output rule (docs/cli.md, \"Output files\"):\n"
    "whole or untouched; refused (exit 2) when one names MODEL, its hardware\n"
    "profile, --plan, the --loads trace or the other output; devices and FIFOs\n"
    "are written in place.\n"
    "Exit status 1 for a bad model, blob or trace, 2 for bad arguments.\n"
    "A run past the cost bounds of docs/cli.md (1e10 layer decisions: exit 2;\n"
    "4 GiB per iteration: exit 1) or an --emit-loads trace larger than --loads\n"
    "reads (exit 2) is refused before anything is written or simulated.\n"
    "Progress goes to stderr when stderr is a terminal.\n";

int kilnc_help_simulate(void)
{
	fputs(HELP_SIMULATE, stdout);
	return 0;
}

/* "kilnc: error: " fmt, with arg (from the command line) escaped. */
static int usage(const char *fmt, const char *arg)
{
	char buf[512];
	fputs("kilnc: error: ", stderr);
	fprintf(stderr, fmt, kiln_text_escape(arg, strlen(arg), sizeof buf, buf));
	fputs("\nTry 'kilnc help simulate'.\n", stderr);
	return KILNC_EXIT_USAGE;
}

/* Compiles m (with or without offloading) and builds its blob and handle. */
static int compile_model(const kiln_model *m, bool no_offload, kiln_arena *a,
                         kiln_compilation *c, unsigned char **blob, kiln_rt **rt)
{
	*c = (kiln_compilation){.model = m,
	                        .arena = a,
	                        .no_offload = no_offload,
	                        .progress = isatty(2) ? stderr : NULL};
	int prc = kiln_pipeline_compile(c, NULL, NULL, NULL, stderr);
	if (prc != 0) {
		if (prc != -3) /* -3: over the cost bound, reported */
			fprintf(stderr, "kilnc: error: compiling %s failed\n", m->name);
		return KILNC_EXIT_INPUT;
	}
	size_t len;
	if (kiln_blob_build(c, stderr, blob, &len) != 0)
		return KILNC_EXIT_INPUT;
	int rc = kiln_rt_open(*blob, len, rt);
	if (rc != 0) {
		fprintf(stderr, "kilnc: internal error: the runtime rejects the blob: %s\n",
		        kiln_rt_strerror(rc));
		return KILNC_EXIT_INPUT;
	}
	return KILNC_EXIT_OK;
}

/* adapipe's partition of c's model and its compilation
 * (kiln_adapipe_compile), with the command's errors. Returns a KILNC_EXIT_
 * status. */
static int adapipe_compile(const kiln_compilation *c, kiln_arena *a3, kiln_model *m3,
                           kiln_adapipe_split *split, kiln_compilation *c3, bool *c3_used)
{
	int rc = kiln_adapipe_compile(c, a3, m3, split, c3, c3_used, stderr);
	if (rc == -1)
		fprintf(stderr, "kilnc: error: out of memory searching adapipe's partition\n");
	else if (rc != 0 && rc != -3)
		fprintf(stderr, "kilnc: error: compiling %s on adapipe's partition failed\n",
		        c->model->name);
	return rc == 0 ? KILNC_EXIT_OK : KILNC_EXIT_INPUT;
}

static int fill_json(FILE *f, void *doc)
{
	int rc = kiln_json_write(doc, f);
	if (rc == KILN_JSON_ENOMEM)
		fprintf(stderr, "kilnc: error: out of memory building the trace\n");
	return rc;
}

typedef struct load_csv {
	const kiln_load_profile *profile;
	kiln_load_shape shape;
	uint64_t seed;
	int64_t iterations;
} load_csv;

static int fill_loads(FILE *f, void *ctx)
{
	const load_csv *lc = ctx;
	return kiln_load_write_csv(lc->profile, &lc->shape, lc->seed, lc->iterations, f);
}

/* Whether --emit-loads fits what --loads reads back (KILN_LOAD_TRACE_MAX_ROWS
 * and _BYTES), checked before anything is written: the rows from the shape,
 * then the exact bytes by formatting them. KILNC_EXIT_OK, or
 * KILNC_EXIT_USAGE with the reason and the --iters that would fit. */
static int emit_loads_fits(const char *path, const load_csv *lc)
{
	const kiln_load_shape *sh = &lc->shape;
	int64_t rows = kiln_load_csv_rows(sh, lc->iterations);
	int64_t per = kiln_load_csv_rows(sh, 1);
	if (rows > KILN_LOAD_TRACE_MAX_ROWS) {
		fprintf(
		    stderr,
		    "kilnc: error: --emit-loads %s: %lld iterations x %d micro-batches x %d MoE "
		    "layers x %d EP ranks = %lld rows, over the %d rows --loads reads; use --iters "
		    "%lld or fewer\nTry 'kilnc help simulate'.\n",
		    path, (long long)lc->iterations,
		    (int)(sh->microbatches > 0 ? sh->microbatches : 1),
		    (int)(sh->layers > 0 ? sh->layers : 1), (int)(sh->ep > 0 ? sh->ep : 1),
		    (long long)rows, KILN_LOAD_TRACE_MAX_ROWS,
		    (long long)(KILN_LOAD_TRACE_MAX_ROWS / per));
		return KILNC_EXIT_USAGE;
	}
	int64_t bytes = kiln_load_csv_bytes(lc->profile, sh, lc->seed, lc->iterations);
	if (bytes < 0) {
		fprintf(stderr,
		        "kilnc: error: --emit-loads %s: this shape cannot be written (%d EP "
		        "ranks)\n",
		        path, (int)sh->ep);
		return KILNC_EXIT_INPUT;
	}
	if (bytes > KILN_LOAD_TRACE_MAX_BYTES) {
		/* Rows are about the same length, so the iterations that fit
		 * scale with the bytes. */
		int64_t fit = (int64_t)((double)lc->iterations * (double)KILN_LOAD_TRACE_MAX_BYTES /
		                        (double)bytes);
		fprintf(
		    stderr,
		    "kilnc: error: --emit-loads %s: %lld rows make %lld bytes, over the %lld bytes "
		    "(256 MiB) --loads reads; use --iters %lld or fewer\nTry 'kilnc help "
		    "simulate'.\n",
		    path, (long long)rows, (long long)bytes, (long long)KILN_LOAD_TRACE_MAX_BYTES,
		    (long long)(fit > 0 ? fit : 1));
		return KILNC_EXIT_USAGE;
	}
	return KILNC_EXIT_OK;
}

/* Whether the run fits KILN_SIM_MAX_DECISIONS and KILN_SIM_MAX_BYTES
 * (docs/cli.md, "Cost bounds"), checked before anything is written or
 * simulated. KILNC_EXIT_OK; KILNC_EXIT_USAGE over the decisions (fewer
 * iterations, policies or groups, or no --exact, fit: the frontend's limits
 * keep one iteration's layers x micro-batches below 4.3e9);
 * KILNC_EXIT_INPUT over the memory, which one iteration of the
 * description's micro-batches and layers takes whatever the arguments. */
static int simulate_fits(const kiln_sim_config *cfg, int32_t n, const char *model)
{
	kiln_sim_cost k;
	kiln_sim_cost_estimate(cfg, n, &k);
	if (k.bytes > KILN_SIM_MAX_BYTES) {
		fprintf(stderr,
		        "%s: error: simulating needs an estimated %.1f GiB of memory (%.0f "
		        "micro-batches "
		        "per iteration x %.0f layers, %d threads), over the limit of %.0f GiB; use "
		        "fewer "
		        "micro-batches per iteration (training.global_batch) or fewer layers per "
		        "stage; "
		        "docs/cli.md, \"Cost bounds\"\n",
		        model, k.bytes / 1073741824.0, k.microbatches, k.layers, (int)k.threads,
		        KILN_SIM_MAX_BYTES / 1073741824.0);
		return KILNC_EXIT_INPUT;
	}
	if (k.decisions <= KILN_SIM_MAX_DECISIONS)
		return KILNC_EXIT_OK;
	fprintf(stderr,
	        "kilnc: error: simulate: %lld iterations x %.0f EP groups x %d policies x %.0f "
	        "layers x "
	        "%.0f micro-batches x %.0f ranks followed = %.3g layer decisions (about %.0f s of "
	        "CPU), over the limit of %.3g (docs/cli.md, \"Cost bounds\")\n",
	        (long long)cfg->iterations, k.groups, (int)n, k.layers, k.microbatches, k.passes,
	        k.decisions, k.cpu_s, KILN_SIM_MAX_DECISIONS);
	double fit = floor(KILN_SIM_MAX_DECISIONS / k.per_iteration);
	if (fit >= 1)
		fprintf(stderr,
		        "kilnc: note: use --iters %.0f or fewer, fewer policies, --groups G%s\n",
		        fit, cfg->exact ? ", or drop --exact" : "");
	else
		fprintf(stderr, "kilnc: note: use fewer policies, --groups G%s\n",
		        cfg->exact ? ", or drop --exact" : "");
	fputs("Try 'kilnc help simulate'.\n", stderr);
	return KILNC_EXIT_USAGE;
}

/* The last iteration's schedules as Chrome trace JSON into an output to be
 * committed (tools/output.h). NULL after reporting. */
static kiln_out *stage_trace(const char *path, const kiln_sim_result *res, int32_t n)
{
	kiln_json *doc = kiln_json_object();
	kiln_json_add_string(doc, "displayTimeUnit", "ms");
	kiln_json *ev = kiln_json_add_array(doc, "traceEvents");
	for (int32_t k = 0; k < n; k++) {
		kiln_json *meta = kiln_json_add_object(ev, NULL);
		kiln_json_add_string(meta, "name", "process_name");
		kiln_json_add_string(meta, "ph", "M");
		kiln_json_add_number(meta, "pid", k);
		kiln_json_add_string(kiln_json_add_object(meta, "args"), "name",
		                     kiln_sim_policy_name(res[k].policy));
		for (int32_t s = 0; s < res[k].n_stages; s++) {
			char name[32];
			snprintf(name, sizeof name, "stage %d", s);
			kiln_json *t = kiln_json_add_object(ev, NULL);
			kiln_json_add_string(t, "name", "thread_name");
			kiln_json_add_string(t, "ph", "M");
			kiln_json_add_number(t, "pid", k);
			kiln_json_add_number(t, "tid", s);
			kiln_json_add_string(kiln_json_add_object(t, "args"), "name", name);
		}
		for (int32_t i = 0; i < res[k].n_last_ops; i++) {
			const kiln_pipe_op *op = &res[k].last_ops[i];
			char name[48];
			snprintf(name, sizeof name, "%s mb %d chunk %d", op->backward ? "B" : "F",
			         op->microbatch, op->chunk);
			kiln_json *e = kiln_json_add_object(ev, NULL);
			kiln_json_add_string(e, "name", name);
			kiln_json_add_string(e, "cat", op->backward ? "backward" : "forward");
			kiln_json_add_string(e, "ph", "X");
			kiln_json_add_number(e, "pid", k);
			kiln_json_add_number(e, "tid", op->stage);
			kiln_json_add_number(e, "ts", op->start_us);
			kiln_json_add_number(e, "dur", op->end_us - op->start_us);
		}
	}
	kiln_out *o = kiln_out_stage("kilnc", path, fill_json, doc, stderr);
	kiln_json_free(doc);
	return o;
}

static void print_bytes(char *buf, size_t n, double v)
{
	if (v >= 1073741824.0)
		snprintf(buf, n, "%.2fG", v / 1073741824.0);
	else
		snprintf(buf, n, "%.2fM", v / 1048576.0);
}

int kilnc_simulate(int argc, char **argv)
{
	const char *model = NULL, *plan = NULL, *policy = NULL, *iters = NULL, *seed = NULL,
	           *loads = NULL, *groups = NULL, *restart = NULL, *ckpt = NULL, *trace = NULL,
	           *emit_loads = NULL;
	bool json = false, exact = false, no_group = false, no_slack = false;
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		static const char *names[] = {"--plan",   "--policy",    "--iters",
		                              "--seed",   "--loads",     "--groups",
		                              "--restart-s", "--checkpoint-every", "--emit-trace",
		                              "--emit-loads"};
		const char **slots[] = {&plan,  &policy,  &iters, &seed, &loads,
		                        &groups, &restart, &ckpt, &trace, &emit_loads};
		int m = 0;
		for (int k = 0; k < 10 && m == 0; k++)
			m = kilnc_option_value("simulate", names[k], argc, argv, &i, slots[k]);
		if (m == KILNC_EXIT_USAGE)
			return m;
		if (m)
			continue;
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
			return kilnc_help_simulate();
		if ((m = kilnc_flag("simulate", "--json", a, &json)) != 0 ||
		    (m = kilnc_flag("simulate", "--exact", a, &exact)) != 0 ||
		    (m = kilnc_flag("simulate", "--no-group-counts", a, &no_group)) != 0 ||
		    (m = kilnc_flag("simulate", "--no-slack", a, &no_slack)) != 0) {
			if (m == KILNC_EXIT_USAGE)
				return m;
		} else if (a[0] == '-' && a[1])
			return usage("unknown option '%s' for 'simulate'", a);
		else if (!model)
			model = a;
		else
			return usage("'simulate' takes one MODEL, got a second: '%s'", a);
	}
	if (!model)
		return usage("%s", "'simulate' needs a MODEL file");
	if (!policy && !emit_loads)
		return usage("%s", "'simulate' needs --policy P[,P...] (or --policy all)");
	kiln_sim_policy_kind kinds[KILN_SIM_POLICY_COUNT];
	int32_t n = 0;
	bool need_no_offload = false, need_adapipe = false;
	double capacity_factor = 0; /* megatron-capacity[:CF]; 0: the description's, else 1 */
	if (!policy) {
		/* --emit-loads alone: no policy to run. */
	} else if (strcmp(policy, "all") == 0) {
		for (int k = 0; k < KILN_SIM_POLICY_COUNT; k++)
			kinds[n++] = (kiln_sim_policy_kind)k;
	} else {
		char buf[512];
		if (strlen(policy) >= sizeof buf)
			return usage("--policy: list too long: '%s'", policy);
		strcpy(buf, policy);
		if (policy[0] == ',' || policy[strlen(policy) - 1] == ',' || strstr(policy, ",,"))
			return usage("--policy: an empty name in '%s'", policy);
		for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
			double cf = 0;
			int k = kiln_sim_policy_parse_cf(tok, &cf);
			if (k < 0 && strncmp(tok, "megatron-capacity:", 18) == 0)
				return usage(
				    "--policy: '%s': the capacity factor must be a number in "
				    "(0, " KILNC_STR(KILN_SIM_MAX_CAPACITY_FACTOR) "]",
				    tok);
			if (k < 0)
				return usage("--policy: unknown policy '%s' (see kilnc help simulate)", tok);
			if (cf > 0)
				capacity_factor = cf;
			for (int32_t j = 0; j < n; j++)
				if (kinds[j] == (kiln_sim_policy_kind)k)
					return usage("--policy: '%s' given twice", tok);
			kinds[n++] = (kiln_sim_policy_kind)k;
		}
	}
	for (int32_t j = 0; j < n; j++)
		need_no_offload |= kinds[j] == KILN_SIM_KILN_NO_OFFLOAD,
		    need_adapipe |= kinds[j] == KILN_SIM_ADAPIPE;
	int64_t n_iters = 100, n_groups = 0, n_ckpt = 100;
	uint64_t n_seed = 1;
	double restart_s = 284;
	if ((iters && kilnc_arg_i64("simulate", "--iters", iters, 1, 100000000, &n_iters)) ||
	    (seed && kilnc_arg_u64("simulate", "--seed", seed, 0, UINT64_MAX, &n_seed)) ||
	    (groups && kilnc_arg_i64("simulate", "--groups", groups, 1, 1000000, &n_groups)) ||
	    (ckpt &&
	     kilnc_arg_i64("simulate", "--checkpoint-every", ckpt, 1, 100000000, &n_ckpt)) ||
	    (restart && kilnc_arg_f64("simulate", "--restart-s", restart, 0, 1e9, &restart_s)))
		return KILNC_EXIT_USAGE;

	/* The output rule; a --loads that names no file is a profile (paper). */
	struct stat st;
	const kiln_out_name in[] = {{"MODEL", model},
	                            {"--plan", plan},
	                            {"--loads", loads && stat(loads, &st) == 0 ? loads : NULL}};
	const kiln_out_name outs[] = {{"--emit-trace", trace}, {"--emit-loads", emit_loads}};
	if (kilnc_check_outputs(in, 3, NULL, outs, 2) != KILNC_EXIT_OK)
		return KILNC_EXIT_USAGE;

	int rc = KILNC_EXIT_INPUT;
	kiln_arena *a = kiln_arena_new(), *a2 = kiln_arena_new(), *a3 = kiln_arena_new();
	kiln_model *m = NULL, m3;
	kiln_compilation c, c2, c3;
	kiln_adapipe_split split = {0};
	bool c3_used = false;
	unsigned char *blob = NULL, *blob2 = NULL, *file_bytes = NULL;
	kiln_rt *rt = NULL, *rt2 = NULL, *file_rt = NULL;
	kiln_load_profile *prof = NULL;
	kiln_sim_result *res = NULL;
	kiln_out *loads_out = NULL, *trace_out = NULL;
	if (!a || !a2 || !a3) {
		fprintf(stderr, "kilnc: error: out of memory\n");
		goto out;
	}
	if (kiln_frontend_load_file(model, a, stderr, &m) != KILN_FRONTEND_OK)
		goto out;
	if ((rc = kilnc_check_outputs(NULL, 0, m, outs, 2)) != KILNC_EXIT_OK)
		goto out;
	rc = KILNC_EXIT_INPUT;
	if (kiln_load_parse(loads ? loads : "paper", m->max_factor, a, stderr, &prof) != 0)
		goto out;
	if ((rc = compile_model(m, false, a, &c, &blob, &rt)) != 0)
		goto out;
	rc = KILNC_EXIT_INPUT;
	load_csv lc = {.profile = prof, .seed = (uint64_t)n_seed, .iterations = n_iters};
	kiln_sim_load_shape(&c, &lc.shape);
	if (prof->kind == KILN_LOAD_TRACE && kiln_load_trace_check(prof->trace, &lc.shape, stderr))
		goto out;
	if (emit_loads && (rc = emit_loads_fits(emit_loads, &lc)) != KILNC_EXIT_OK)
		goto out;
	kiln_sim_config est = {
	    .c = &c, .iterations = n_iters, .exact = exact, .max_groups = (int32_t)n_groups};
	/* megatron-paged-stash runs each step twice (its rerun): it costs
	 * what two policies cost. */
	int32_t n_cost = n;
	for (int32_t j = 0; j < n; j++)
		n_cost += kinds[j] == KILN_SIM_MEGATRON_PAGED_STASH;
	if (policy && (rc = simulate_fits(&est, n_cost, model)) != KILNC_EXIT_OK)
		goto out;
	rc = KILNC_EXIT_INPUT;
	if (plan) {
		size_t file_len;
		if (kilnc_blob_load(plan, &file_bytes, &file_len, &file_rt) != 0)
			goto out;
		kiln_rt_info fi;
		kiln_rt_info_get(file_rt, &fi);
		char pb[1024], mb[1024], cb[256];
		kiln_text_escape(plan, strlen(plan), sizeof pb, pb);
		kiln_text_escape(model, strlen(model), sizeof mb, mb);
		kiln_text_escape(fi.compiler, strlen(fi.compiler), sizeof cb, cb);
		if (fi.model_hash != kiln_blob_model_hash(m)) {
			fprintf(stderr,
			        "kilnc: error: %s was compiled from another description than %s "
			        "(model hash %016llx, expected %016llx)\n",
			        pb, mb, (unsigned long long)fi.model_hash,
			        (unsigned long long)kiln_blob_model_hash(m));
			goto out;
		}
		kiln_rt_info ci;
		kiln_rt_info_get(rt, &ci);
		if (fi.n_buckets != ci.n_buckets || strcmp(fi.compiler, ci.compiler) != 0) {
			fprintf(stderr,
			        "kilnc: error: %s was written by %s with %d load buckets; this "
			        "kilnc (%s) plans with %d: compile the plan again\n",
			        pb, cb, fi.n_buckets, ci.compiler, ci.n_buckets);
			goto out;
		}
	}
	/* The trace of loads is written now but goes into place with the
	 * schedule trace, when both are complete: all or none. */
	if (emit_loads) {
		if (!(loads_out = kiln_out_stage("kilnc", emit_loads, fill_loads, &lc, stderr)))
			goto out;
		if (!policy) {
			kiln_out *o = loads_out;
			loads_out = NULL;
			rc = kiln_out_commit(o, stderr) == 0 ? KILNC_EXIT_OK : KILNC_EXIT_INPUT;
			goto out;
		}
	}
	if (need_no_offload && (rc = compile_model(m, true, a2, &c2, &blob2, &rt2)) != 0)
		goto out;
	if (need_adapipe && (rc = adapipe_compile(&c, a3, &m3, &split, &c3, &c3_used)) != 0)
		goto out;
	rc = KILNC_EXIT_INPUT;
	res = calloc((size_t)n, sizeof *res);
	if (!res)
		goto out;
	kiln_sim_config cfg = {.c = &c,
	                       .rt = file_rt ? file_rt : rt,
	                       .c_no_offload = need_no_offload ? &c2 : NULL,
	                       .rt_no_offload = rt2,
	                       .c_adapipe = c3_used ? &c3 : NULL,
	                       .loads = prof,
	                       .iterations = n_iters,
	                       .seed = n_seed,
	                       .restart_s = restart_s,
	                       .checkpoint_every = n_ckpt,
	                       .exact = exact,
	                       .no_group_counts = no_group,
	                       .no_slack = no_slack,
	                       .max_groups = (int32_t)n_groups,
	                       .progress = isatty(2) ? stderr : NULL,
	                       .capacity_factor = capacity_factor};
	if (kiln_sim_run(&cfg, kinds, n, a, stderr, res) != 0)
		goto out;
	if (trace && !(trace_out = stage_trace(trace, res, n)))
		goto out;
	/* Finished now, so that a failed write leaves stdout empty; committed
	 * once stdout is written. */
	if ((loads_out && kiln_out_finish(loads_out, stderr) != 0) ||
	    (trace_out && kiln_out_finish(trace_out, stderr) != 0))
		goto out;
	/* The baseline for relative throughput: full-recompute when run. */
	double base = 0;
	for (int32_t k = 0; k < n; k++)
		if (res[k].policy == KILN_SIM_FULL_RECOMPUTE)
			base = res[k].tokens_per_s;
	/* kiln against the clairvoyant oracle and against infinite memory,
	 * when run beside them (docs/simulator.md, "The oracle"). */
	double t_kiln = -1, t_oracle = -1, t_unb = -1;
	for (int32_t k = 0; k < n; k++) {
		if (res[k].policy == KILN_SIM_KILN)
			t_kiln = res[k].tokens_per_s;
		else if (res[k].policy == KILN_SIM_ORACLE)
			t_oracle = res[k].tokens_per_s;
		else if (res[k].policy == KILN_SIM_UNBOUNDED)
			t_unb = res[k].tokens_per_s;
	}
	if (json) {
		kiln_json *doc = kiln_json_object();
		kiln_json_add_string(doc, "model", m->name);
		if (t_kiln >= 0 && t_oracle > 0)
			kiln_json_add_number(doc, "kiln_vs_oracle", t_kiln / t_oracle);
		if (t_kiln >= 0 && t_unb > 0)
			kiln_json_add_number(doc, "kiln_vs_unbounded", t_kiln / t_unb);
		kiln_json_add_string(doc, "loads", prof->name);
		kiln_json_add_i64(doc, "iterations", n_iters);
		kiln_json_add_u64(doc, "seed", n_seed);
		kiln_json_add_bool(doc, "exact", exact);
		kiln_json_add_bool(doc, "slack", !no_slack);
		kiln_json_add_number(doc, "restart_s", restart_s);
		kiln_json_add_i64(doc, "checkpoint_every", n_ckpt);
		kiln_json_add_i64(doc, "groups", kiln_sim_groups(cfg.c->model, cfg.max_groups));
		kiln_json_add_i64(doc, "groups_total", kiln_sim_groups(cfg.c->model, 0));
		kiln_json *ps = kiln_json_add_array(doc, "policies");
		for (int32_t k = 0; k < n; k++) {
			const kiln_sim_result *r = &res[k];
			kiln_json *o = kiln_json_add_object(ps, NULL);
			kiln_json_add_string(o, "policy", kiln_sim_policy_name(r->policy));
			kiln_json_add_string(o, "models", kiln_sim_policy_models(r->policy));
			if (r->flags)
				kiln_json_add_string(o, "megatron_flags", r->flags);
			kiln_json_add_number(o, "tokens_per_s", r->tokens_per_s);
			kiln_json_add_number(o, "dropped_fraction", r->dropped_fraction);
			if (base > 0)
				kiln_json_add_number(o, "vs_full_recompute", r->tokens_per_s / base);
			kiln_json_add_number(o, "iteration_s", r->iteration_s);
			kiln_json_add_number(o, "total_s", r->total_s);
			kiln_json_add_number(o, "mfu", r->mfu);
			kiln_json_add_number(o, "hfu", r->hfu);
			kiln_json_add_i64(o, "ooms", r->ooms);
			kiln_json_add_number(o, "oom_lost_s", r->oom_lost_s);
			kiln_json_add_number(o, "exposed_recompute_s", r->recompute_s);
			kiln_json_add_number(o, "exposed_copy_s", r->copy_s);
			kiln_json_add_i64(o, "over_budget_decisions", r->over_budget);
			if (r->policy == KILN_SIM_MINDSPEED)
				kiln_json_add_i64(o, "moe_forwards_checkpointed", r->triggered);
			kiln_json_add_i64(o, "reruns", r->reruns);
			kiln_json_add_number(o, "rerun_s", r->rerun_s);
			kiln_json_add_i64(o, "stash_overflows", r->stash_overflows);
			kiln_json_add_i64(o, "stash_over_budget", r->stash_over_budget);
			kiln_json_add_number(o, "spilled_bytes", r->spilled_bytes);
			if (r->recipe) {
				kiln_json_add_string(o, "recipe", r->recipe);
				kiln_json_add_bool(o, "recipe_fits", r->recipe_fits);
			}
			kiln_json *pk = kiln_json_add_array(o, "peak_bytes");
			for (int32_t s = 0; s < r->n_stages; s++)
				kiln_json_add_number(pk, NULL, r->peak_bytes[s]);
			if (r->policy != KILN_SIM_ADAPIPE)
				continue;
			/* The partition it ran on (docs/cli.md). */
			kiln_json *pt = kiln_json_add_object(o, "partition");
			kiln_json_add_bool(pt, "searched", split.kept == NULL);
			if (split.kept)
				kiln_json_add_string(pt, "kept", split.kept);
			kiln_json_add_bool(pt, "fits", split.fits);
			kiln_json *sl = kiln_json_add_array(pt, "stage_layers");
			/* Predicted times, when every stage fits (a stage that
			 * does not has none). */
			kiln_json *su = split.fits ? kiln_json_add_array(pt, "stage_us") : NULL;
			for (int32_t s = 0; s < split.n_stages; s++) {
				kiln_json_add_i64(sl, NULL, split.layers[s]);
				if (su)
					kiln_json_add_number(su, NULL, split.stage_us[s]);
			}
			kiln_json *ml = kiln_json_add_array(pt, "model_stage_layers");
			for (size_t ch = 0; ch < m->n_stage_layers; ch++)
				kiln_json_add_i64(ml, NULL, m->stage_layers[ch]);
		}
		/* A failed write is reported, with its reason, by main's
		 * finish_output. */
		int wrc = kiln_json_write(doc, stdout);
		kiln_json_free(doc);
		if (wrc == KILN_JSON_ENOMEM) {
			fprintf(stderr, "kilnc: error: out of memory building the JSON output\n");
			goto out;
		}
	} else {
		/* The name comes from the description, the profile maybe from a path. */
		char nb[1024], lb[1024];
		printf("%s: %lld iterations, loads %s (seed %" PRIu64 "), %s%s\n",
		       kiln_text_escape(m->name, strlen(m->name), sizeof nb, nb),
		       (long long)n_iters,
		       kiln_text_escape(prof->name, strlen(prof->name), sizeof lb, lb), n_seed,
		       exact ? "every EP rank followed" : "statistical method (docs/simulator.md)",
		       no_slack ? ", no slack" : "");
		printf("\n%-28s %12s %7s %8s %10s %6s %6s %5s %6s %10s %10s %9s %9s\n", "policy",
		       "tokens/s", "vs full", "dropped", "iter s", "MFU", "HFU", "OOMs", "reruns",
		       "lost s", "recomp s", "copy s", "peak");
		for (int32_t k = 0; k < n; k++) {
			const kiln_sim_result *r = &res[k];
			double peak = 0;
			for (int32_t s = 0; s < r->n_stages; s++)
				peak = r->peak_bytes[s] > peak ? r->peak_bytes[s] : peak;
			char pb[32], vs[16] = "-";
			print_bytes(pb, sizeof pb, peak);
			if (base > 0)
				snprintf(vs, sizeof vs, "%.3fx", r->tokens_per_s / base);
			printf("%-28s %12.0f %7s %7.2f%% %10.3f %5.1f%% %5.1f%% %5lld %6lld %10.1f "
			       "%10.2f %9.2f "
			       "%9s\n",
			       kiln_sim_policy_name(r->policy), r->tokens_per_s, vs,
			       100 * r->dropped_fraction, r->iteration_s, 100 * r->mfu,
			       100 * r->hfu, (long long)r->ooms, (long long)r->reruns,
			       r->oom_lost_s, r->recompute_s, r->copy_s, pb);
		}
		if (t_kiln >= 0 && (t_oracle > 0 || t_unb > 0)) {
			printf("\nkiln");
			if (t_oracle > 0)
				printf(" / oracle %.2f%%", 100 * t_kiln / t_oracle);
			if (t_unb > 0)
				printf("%s / unbounded %.2f%%", t_oracle > 0 ? ", kiln" : "",
				       100 * t_kiln / t_unb);
			printf(" (tokens/s)\n");
		}
		for (int32_t k = 0; k < n; k++)
			if (res[k].flags)
				printf("%s%s: %s\n", k == 0 || !res[k - 1].flags ? "\n" : "",
				       kiln_sim_policy_name(res[k].policy), res[k].flags);
		for (int32_t k = 0; k < n; k++)
			if (res[k].recipe)
				printf("\n%s: %s (%s at load %.1f)\n",
				       kiln_sim_policy_name(res[k].policy), res[k].recipe,
				       res[k].recipe_fits ? "fits" : "does not fit",
				       KILN_BASELINE_DESIGN_LOAD);
		char cb[32];
		print_bytes(cb, sizeof cb, c.budgets[0].capacity_bytes);
		if (need_adapipe && split.kept) {
			printf("\nadapipe partition: the model's split, kept (%s)\n", split.kept);
		} else if (need_adapipe) {
			printf("\nadapipe partition (layers per stage, chosen with each stage's "
			       "recompute at load %.1f):",
			       KILN_BASELINE_DESIGN_LOAD);
			for (int32_t s = 0; s < split.n_stages; s++)
				printf(" %lld", (long long)split.layers[s]);
			printf("; slowest stage %.0f us per micro-batch\nmodel's split:",
			       split.max_us);
			for (size_t ch = 0; ch < m->n_stage_layers; ch++)
				printf(" %lld", (long long)m->stage_layers[ch]);
			printf("\n");
		}
		printf(
		    "\npeak: the largest device memory of any stage (capacity %s); lost: restarts "
		    "plus progress since the last checkpoint; dropped: routed expert rows dropped "
		    "at capacity; reruns: iterations run twice (megatron-paged-stash); recomp, "
		    "copy: exposed time, averaged over stages, summed over micro-batches and "
		    "iterations\n",
		    cb);
	}
	/* The files go into place only once stdout is written: a command that
	 * fails leaves them as they were (main's finish_output reports a failed
	 * stdout). */
	kiln_out *staged[2];
	size_t n_staged = 0;
	if (loads_out)
		staged[n_staged++] = loads_out;
	if (trace_out)
		staged[n_staged++] = trace_out;
	loads_out = trace_out = NULL;
	if (n_staged && !kiln_out_stdout_ok()) {
		for (size_t i = 0; i < n_staged; i++)
			kiln_out_discard(staged[i]);
		goto out;
	}
	if (kiln_out_commit_all(staged, n_staged, stderr) != 0)
		goto out;
	rc = KILNC_EXIT_OK;
out:
	kiln_out_discard(loads_out);
	kiln_out_discard(trace_out);
	free(res);
	kiln_rt_close(rt);
	kiln_rt_close(rt2);
	kiln_rt_close(file_rt);
	free(file_bytes);
	free(blob);
	free(blob2);
	kiln_arena_free(a);
	kiln_arena_free(a2);
	kiln_arena_free(a3);
	return rc;
}
