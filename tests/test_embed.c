/* tests/test_embed.c: examples/embed, the embedding example, run as a user
 * would run it on tiny's compiled plan. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln_test.h"

/* Compiles tiny.yaml into a temporary blob; the caller unlinks and frees it. */
static char *tiny_blob(void)
{
	char *path = kt_temp_file(".kiln", "", 0);
	kt_run r = kt_kilnc(
	    (const char *const[]){"compile", kt_src("examples/models/tiny.yaml"), "-o", path, NULL},
	    NULL);
	cr_assert_eq(r.status, 0, "kilnc compile -o: %s", r.err);
	kt_run_free(&r);
	return path;
}

enum { MAX_MB = 16 };

/* The example's per-micro-batch summary lines:
 * "mb K: load F, saved BYTES bytes (...), ...". Returns how many. */
static int summaries(const char *out, double load[MAX_MB], unsigned long long saved[MAX_MB])
{
	int n = 0;
	for (const char *line = out; line && *line; line = strchr(line, '\n'), line += !!line) {
		unsigned k;
		double f;
		unsigned long long s;
		if (sscanf(line, "mb %u: load %lfx, saved %llu bytes", &k, &f, &s) == 3) {
			cr_assert_eq(k, (unsigned)n, "micro-batches out of order at %u", k);
			cr_assert_lt(n, MAX_MB);
			load[n] = f;
			saved[n] = s;
			n++;
		}
	}
	return n;
}

Test(embed, spike_microbatch_saves_more_than_balanced_ones)
{
	char *blob = tiny_blob();
	/* Stage 0 of tiny offloads a little even at balanced load (tiny.yaml);
	 * a 2.5x spike has to save much more to fit. */
	char cmd[4096], *out = NULL;
	snprintf(cmd, sizeof cmd, "'%s' '%s' 0", KILN_EMBED_EXAMPLE, blob);
	int status = kt_sh(&out, "%s", cmd);
	cr_assert_eq(status, 0, "embed exited %d:\n%s", status, out);

	cr_assert_not_null(strstr(out, "model tiny"), "no blob info:\n%s", out);
	cr_assert_not_null(strstr(out, "fits"), "the run did not fit:\n%s", out);
	/* Unit names come from the blob, e.g. the experts' up projection. */
	cr_assert_not_null(strstr(out, "moe.expert_up"), "no unit names:\n%s", out);

	double load[MAX_MB];
	unsigned long long saved[MAX_MB];
	int n = summaries(out, load, saved);
	cr_assert_eq(n, 6, "expected 6 micro-batch summaries, got %d:\n%s", n, out);
	int spike = -1;
	unsigned long long most_balanced = 0;
	for (int k = 0; k < n; k++) {
		if (load[k] > 2.4 && load[k] < 2.6) {
			cr_assert_eq(spike, -1, "two spikes");
			spike = k;
		} else {
			cr_assert_float_eq(load[k], 1.0, 1e-9, "mb %d load %g", k, load[k]);
			if (saved[k] > most_balanced)
				most_balanced = saved[k];
		}
	}
	cr_assert_neq(spike, -1, "no 2.5x micro-batch:\n%s", out);
	cr_assert_gt(saved[spike], most_balanced,
	             "the spike (mb %d) saved %llu bytes, a balanced one %llu:\n%s", spike,
	             saved[spike], most_balanced, out);
	/* At 2.5x the experts' activations alone are 2.5 times their
	 * balanced size: tiny's spike saves more than 1 MiB on stage 0. */
	cr_assert_gt(saved[spike], 1u << 20, "spike saved only %llu bytes", saved[spike]);

	free(out);
	unlink(blob);
	free(blob);
}

Test(embed, refuses_what_is_not_a_blob_and_bad_usage)
{
	char cmd[4096], *out = NULL;
	/* A YAML file is not a blob: exit 1, and the runtime's message. */
	snprintf(cmd, sizeof cmd, "'%s' '%s'", KILN_EMBED_EXAMPLE,
	         kt_src("examples/models/tiny.yaml"));
	int status = kt_sh(&out, "%s", cmd);
	cr_assert_eq(status, 1, "status %d:\n%s", status, out);
	cr_assert_not_null(strstr(out, "not a kiln plan blob"), "got:\n%s", out);
	free(out);

	status = kt_sh(&out, "%s", "'" KILN_EMBED_EXAMPLE "'");
	cr_assert_eq(status, 2, "status %d:\n%s", status, out);
	cr_assert_not_null(strstr(out, "usage:"), "got:\n%s", out);
	free(out);

	/* A STAGE that is not a number was stage 0 (atoi); now a usage error. */
	const char *stages[] = {"x", " 1", "1x", "0x1", "-1", ""};
	for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
		status = kt_sh(&out, "'%s' plan.kiln '%s'", KILN_EMBED_EXAMPLE, stages[i]);
		cr_assert_eq(status, 2, "'%s': status %d:\n%s", stages[i], status, out);
		cr_assert_not_null(strstr(out, "STAGE must be a stage number"), "got:\n%s", out);
		free(out);
	}
}
