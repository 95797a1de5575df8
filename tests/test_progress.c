/* tests/test_progress.c: the status line of long work (ir/progress.c) and
 * the bounds on what one compile or simulate may cost (passes/pipeline.c,
 * sim/sim.c, tools/simcmd.c; docs/cli.md, "Cost bounds" and "Progress").
 *
 * The contract (DESIGN.md 5.2, issue 14): on a terminal, compile (DP and
 * MILP) and simulate show progress at least every two seconds; on anything
 * else they print none. Runs on a terminal are made on a pseudo-terminal,
 * the arrival time of every chunk of output recorded.
 */
#define _XOPEN_SOURCE 600
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ir/ir.h"
#include "kiln_test.h"

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* What kilnc wrote to a terminal: the whole text, and when each chunk
 * arrived (seconds after the start). */
typedef struct tty_run {
	char *text;
	size_t len;
	double at[8192];
	int n;
	double ran_s; /* until it exited or was stopped */
	int status;   /* exit status, or -1 when stopped or crashed */
} tty_run;

static size_t count(const char *hay, const char *needle);

/* Runs kilnc with args, its stderr on a pseudo-terminal (stdout to
 * /dev/null), until its output holds `times` copies of `until` or
 * stop_after_s seconds have passed (then SIGTERM). */
static void run_on_tty(const char *const *args, const char *until, size_t times,
                       double stop_after_s, tty_run *o)
{
	memset(o, 0, sizeof *o);
	int master = posix_openpt(O_RDWR | O_NOCTTY);
	cr_assert(master >= 0 && grantpt(master) == 0 && unlockpt(master) == 0, "no pty");
	const char *slave = ptsname(master);
	cr_assert_not_null(slave);
	const char *argv[64];
	size_t n = 0;
	argv[n++] = KILN_KILNC;
	for (; args[n - 1] && n < 63; n++)
		argv[n] = args[n - 1];
	argv[n] = NULL;
	double t0 = now_s();
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		setsid();
		int s = open(slave, O_RDWR);
		int null = open("/dev/null", O_RDWR);
		if (s < 0 || null < 0)
			_exit(127);
		dup2(s, 2);
		dup2(null, 1);
		dup2(null, 0);
		close(master);
		signal(SIGTERM, SIG_DFL); /* exec keeps an ignored signal ignored */
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	size_t cap = 1 << 16;
	o->text = malloc(cap);
	cr_assert_not_null(o->text);
	int stopped = 0;
	for (;;) {
		double left = stop_after_s - (now_s() - t0);
		o->text[o->len] = '\0';
		if (!stopped && count(o->text, until) >= times)
			left = 0;
		if (left <= 0 && !stopped) {
			kill(pid, SIGTERM);
			stopped = 1;
			o->ran_s = now_s() - t0;
		}
		struct pollfd p = {.fd = master, .events = POLLIN};
		int r = poll(&p, 1, stopped ? 2000 : (int)(left * 1000) + 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			continue;
		if (cap - o->len < 4096) {
			cap *= 2;
			o->text = realloc(o->text, cap);
			cr_assert_not_null(o->text);
		}
		ssize_t got = read(master, o->text + o->len, cap - o->len - 1);
		if (got <= 0)
			break; /* EIO: every writer has gone */
		o->len += (size_t)got;
		if (o->n < 8192)
			o->at[o->n++] = now_s() - t0;
	}
	o->text[o->len] = '\0';
	int st = 0;
	waitpid(pid, &st, 0);
	if (!stopped)
		o->ran_s = now_s() - t0;
	o->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	close(master);
}

/* The longest stretch without output from the start to the end of the
 * run. */
static double longest_silence(const tty_run *o)
{
	double last = 0, most = 0;
	for (int i = 0; i < o->n; i++) {
		most = o->at[i] - last > most ? o->at[i] - last : most;
		last = o->at[i];
	}
	return o->ran_s - last > most ? o->ran_s - last : most;
}

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;
	for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
		n++;
	return n;
}

/* ---------------------------------------------------------------- the meter */

/* A meter on a pipe: its status lines come every KILN_PROGRESS_INTERVAL_MS
 * (1 s), each "\rWHAT: PHASE DONE of TOTAL UNIT (P%)..., T s\033[K" with
 * the counts made so far, and stopping erases the line ("\r\033[K"). With
 * no stream there is no meter and every call is a no-op. */
Test(progress, meter_rewrites_one_status_line)
{
	cr_assert_null(kiln_progress_start(NULL, "x"));
	kiln_progress_phase(NULL, "p", "u", 3);
	kiln_progress_add(NULL, 1);
	kiln_progress_line(NULL, "%s", "nothing\n");
	kiln_progress_stop(NULL);

	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	FILE *w = fdopen(fds[1], "w");
	cr_assert_not_null(w);
	kiln_progress *p = kiln_progress_start(w, "kilnc: test");
	cr_assert_not_null(p);
	kiln_progress_phase(p, "plan", "tables", 40);
	kiln_progress_aux(p, "MILP solves");
	kiln_progress_add(p, 10);
	kiln_progress_add_aux(p, 7);
	usleep(1500 * 1000); /* one status line: 10 of 40 */
	kiln_progress_add(p, 20);
	usleep(1000 * 1000); /* another: 30 of 40 */
	kiln_progress_line(p, "a whole line %d\n", 5);
	kiln_progress_stop(p);
	fclose(w);
	char buf[4096];
	ssize_t n = read(fds[0], buf, sizeof buf - 1);
	close(fds[0]);
	cr_assert_gt(n, 0);
	buf[n] = '\0';
	cr_expect_not_null(
	    strstr(buf, "\rkilnc: test: plan 10 of 40 tables (25.0%), 7 MILP solves, 1 s\033[K"),
	    "%s", buf);
	cr_expect_not_null(strstr(buf, "\rkilnc: test: plan 30 of 40 tables (75.0%)"), "%s", buf);
	/* The whole line erases the status first. */
	cr_expect_not_null(strstr(buf, "\r\033[Ka whole line 5\n"), "%s", buf);
	cr_expect_geq(count(buf, "\rkilnc: test: plan "), 2, "%s", buf);
}

/* ---------------------------------------------------------------- on a terminal */

/* The MILP takes minutes on tiny, in the plan pass: the status line keeps
 * coming (the tables and the MILP solves so far), never two seconds
 * apart. Stopped at the third status line of the pass. Before, nothing
 * came after the first two passes' lines until the pass ended. */
Test(progress, milp_compile_shows_progress_on_a_terminal, .timeout = 60)
{
	char *out = kt_temp_file(".kiln", "", 0);
	tty_run o;
	run_on_tty((const char *const[]){"compile", kt_src("examples/models/tiny.yaml"), "--solver",
	                                 "milp", "-o", out, NULL},
	           "\rkilnc: compile: plan ", 3, 30.0, &o);
	cr_expect_leq(longest_silence(&o), 2.0, "silent for %.2f s:\n%s", longest_silence(&o),
	              o.text);
	cr_expect_geq(count(o.text, "\rkilnc: compile: plan "), 3, "%s", o.text);
	cr_expect_not_null(strstr(o.text, " MILP solves, "), "%s", o.text);
	free(o.text);
	unlink(out);
	free(out);
}

/* 5,000,000 iterations of kiln on tiny (1e9 layer decisions, within the
 * bound): the status line counts decisions and iterations, never two
 * seconds apart, from the compile through the run (stopped at its third
 * status line; before: one line per 10% of the iterations, minutes apart).
 * Off a terminal, nothing of it. */
Test(progress, simulate_shows_progress_on_a_terminal_only, .timeout = 60)
{
	tty_run o;
	run_on_tty((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                 "--policy", "kiln", "--iters", "5000000", NULL},
	           " of 1000000000 layer decisions (", 3, 30.0, &o);
	cr_expect_leq(longest_silence(&o), 2.0, "silent for %.2f s:\n%s", longest_silence(&o),
	              o.text);
	cr_expect_geq(count(o.text, " of 1000000000 layer decisions ("), 3, "%s", o.text);
	cr_expect_not_null(strstr(o.text, " iterations done, "), "%s", o.text);
	free(o.text);
	kt_run r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                          "--policy", "kiln", "--iters", "3", NULL},
	                    NULL);
	cr_expect_eq(r.status, 0, "%s", r.err);
	cr_expect_eq(r.err_len, 0, "progress off a terminal:\n%s", r.err);
	kt_run_free(&r);
}

/* ---------------------------------------------------------------- cost bounds */

/* tiny's text with layers, pp, devices and global_batch replaced. */
static char *tiny_variant(int layers, int pp, long long global_batch)
{
	char *path = NULL;
	char *text = NULL;
	cr_assert_eq(kt_sh(&text,
	                   "sed -e 's/^  layers: 8/  layers: %d/' -e 's/^  pp: 2/  pp: %d/' "
	                   "-e 's/^  devices: 8/  devices: %d/' "
	                   "-e 's/^  global_batch: 32/  global_batch: %lld/' "
	                   "-e 's/memory_gib: 0.009765625 .*/memory_gib: 80/' '%s'",
	                   layers, pp, 4 * pp, global_batch, kt_src("examples/models/tiny.yaml")),
	             0, "%s", text);
	path = kt_temp_file(".yaml", text, strlen(text));
	free(text);
	return path;
}

/* 4,096 layers on 4,096 stages (layers = pp, the largest the frontend
 * takes): 4,096 unit sets (one layer kind per stage) x 30 load buckets at
 * max_factor 3 (0.25, 0.5, 0.75, 0.9, 1.0; 1.05 to 1.5 by 0.05: 10; 1.6 to
 * 2.9 by 0.1: 14; 3.0) = 122,880 plan tables of 15 units or fewer: at
 * least 1.2 million unit choices, over the 2^20 = 1,048,576 allowed. It was
 * compiled in 15 s and 3.5 GB; now it is refused at once, nothing written. */
Test(progress, compile_beyond_the_cost_bound_is_refused, .timeout = 60)
{
	char *model = tiny_variant(4096, 4096, 32);
	char *out = kt_temp_file(".kiln", "", 0);
	unlink(out);
	double t0 = now_s();
	kt_run r = kt_kilnc((const char *const[]){"compile", model, "-o", out, NULL}, NULL);
	double took = now_s() - t0;
	cr_expect_eq(r.status, 1, "%s", r.err);
	char want[512];
	snprintf(want, sizeof want, "%s: error: compiling would plan ", model);
	cr_expect_not_null(strstr(r.err, want), "%s", r.err);
	cr_expect_not_null(strstr(r.err, " unit choices (4096 unit sets x 30 load buckets = 122880 "
	                                 "plan tables), an estimated "),
	                   "%s", r.err);
	cr_expect_not_null(strstr(r.err, "over the limit of 1048576 unit choices\n"), "%s", r.err);
	cr_expect_not_null(strstr(r.err, ": note: a unit set is one layer kind on one pipeline "
	                                 "stage; use fewer stages"),
	                   "%s", r.err);
	cr_expect_neq(access(out, F_OK), 0, "a plan was written");
	cr_expect_lt(took, 10.0, "refused after %.1f s", took);
	kt_run_free(&r);
	/* simulate compiles first: the same refusal, the same status. */
	r = kt_kilnc((const char *const[]){"simulate", model, "--policy", "kiln", NULL}, NULL);
	cr_expect_eq(r.status, 1, "%s", r.err);
	cr_expect_not_null(strstr(r.err, "over the limit of 1048576 unit choices\n"), "%s", r.err);
	cr_expect_eq(r.out_len, 0, "%s", r.out);
	kt_run_free(&r);
	unlink(model);
	free(model);
	free(out);
}

/* --iters 100000000 of every policy on tiny: 10^8 iterations x 1 EP group
 * (dp 4 * tp 1 / ep 4) x 14 policy passes (13 policies, megatron-paged-stash twice) x 10 layers (8
 * and the embedding and head) x 4 micro-batches x 5 ranks followed (the envelope and min(4, ep)
 * candidates) = 2.8e11 layer decisions, over 1e10: a usage error at once,
 * with the --iters that fits (1e10 / 2,800 per iteration = 3,571,428).
 * Before, it ran for days. */
Test(progress, simulate_beyond_the_decision_bound_is_refused, .timeout = 60)
{
	double t0 = now_s();
	kt_run r = kt_kilnc((const char *const[]){"simulate", kt_src("examples/models/tiny.yaml"),
	                                          "--policy", "all", "--iters", "100000000", NULL},
	                    NULL);
	cr_expect_eq(r.status, 2, "%s", r.err);
	/* 14 policies, megatron-paged-stash counted twice (its rerun): 15;
	 * 1e8 * 15 * 10 * 4 * 5 = 3e11, and 1e10 / 3000 = 3333333.3. */
	cr_expect_not_null(strstr(r.err,
	                          "kilnc: error: simulate: 100000000 iterations x 1 EP groups "
	                          "x 15 policies x 10 layers x 4 micro-batches x 5 ranks "
	                          "followed = 3e+11 layer decisions"),
	                   "%s", r.err);
	cr_expect_not_null(strstr(r.err, "over the limit of 1e+10"), "%s", r.err);
	cr_expect_not_null(strstr(r.err, "kilnc: note: use --iters 3333333 or fewer"), "%s", r.err);
	cr_expect_eq(r.out_len, 0, "%s", r.out);
	cr_expect_lt(now_s() - t0, 20.0);
	kt_run_free(&r);
}

/* 2^20 micro-batches per iteration (global_batch 2^23 over dp 4 at
 * micro_batch 2) of a 64-layer model on 2 stages: one iteration's scratch
 * alone, two numbers per (stage, micro-batch, layer of the largest stage:
 * 33) per thread, is 2 x 8 B x 2 x 2^20 x 66 = 2.2 GB, and the loads
 * 2^20 x 63 MoE layers x 4 ranks x 8 B = 2.1 GB more: over 4 GiB, bad
 * input (no argument makes one iteration smaller). */
Test(progress, simulate_beyond_the_memory_bound_is_refused, .timeout = 60)
{
	char *model = tiny_variant(64, 2, 8388608);
	kt_run r = kt_kilnc(
	    (const char *const[]){"simulate", model, "--policy", "kiln", "--iters", "1", NULL},
	    NULL);
	cr_expect_eq(r.status, 1, "%s", r.err);
	char want[512];
	snprintf(want, sizeof want, "%s: error: simulating needs an estimated ", model);
	cr_expect_not_null(strstr(r.err, want), "%s", r.err);
	cr_expect_not_null(strstr(r.err, "GiB of memory (1048576 micro-batches per iteration x 66 "
	                                 "layers, 1 threads), over the limit of 4 GiB"),
	                   "%s", r.err);
	kt_run_free(&r);
	unlink(model);
	free(model);
}
