/* tests/kiln_test.h: helpers shared by the test suites. */
#ifndef KILN_TEST_H
#define KILN_TEST_H

#include <stddef.h>

/* Result of running kilnc: exit status (or -1 when it did not exit
 * normally, e.g. a crash), and its whole stdout and stderr, NUL-terminated,
 * owned by the caller (free with kt_run_free). */
typedef struct kt_run {
	int status;
	char *out;
	size_t out_len;
	char *err;
	size_t err_len;
} kt_run;

/* Runs the kilnc under test with argv (NULL-terminated, argv[0] excluded),
 * with stdout redirected to stdout_path when it is not NULL. */
kt_run kt_kilnc(const char *const *args, const char *stdout_path);
void kt_run_free(kt_run *r);

/* Writes len bytes to a new temporary file; returns its path (caller frees
 * and unlinks). */
char *kt_temp_file(const char *suffix, const void *data, size_t len);

/* Path of a file in the source tree (static buffer, valid until next call). */
const char *kt_src(const char *rel);

#endif
