/* tools/args.c: what every kilnc command shares: its options and their
 * values (docs/cli.md, "Numbers"), usage errors, the output rule's check
 * and reading a regular file. Below kilnc.c and the command files
 * (blobcmd.c, simcmd.c, hfcmd.c), which all call it and none of which it
 * calls. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frontend/frontend.h"
#include "tools/output.h"
#include "tools/tools.h"

/* s escaped for the terminal (kiln_text_escape) into buf of cap bytes. */
const char *kilnc_shown(const char *s, char *buf, size_t cap)
{
	return kiln_text_escape(s, strlen(s), cap, buf);
}

/* "kilnc: error: " fmt, with arg (from the command line) escaped. */
void kilnc_usage_error(const char *fmt, const char *arg)
{
	char buf[200];
	fputs("kilnc: error: ", stderr);
	fprintf(stderr, fmt, kilnc_shown(arg, buf, sizeof buf));
	fputs("\nTry 'kilnc --help'.\n", stderr);
}

/* A problem with option name of command cmd: "Try 'kilnc help CMD'." where
 * the command has its own help, as its other usage errors say. */
static void option_error(const char *cmd, const char *fmt, const char *name)
{
	if (!cmd) {
		kilnc_usage_error(fmt, name);
		return;
	}
	char buf[200];
	fputs("kilnc: error: ", stderr);
	fprintf(stderr, fmt, kilnc_shown(name, buf, sizeof buf));
	fprintf(stderr, "\nTry 'kilnc help %s'.\n", cmd);
}

int kilnc_option_value(const char *cmd, const char *name, int argc, char **argv, int *i,
                       const char **out)
{
	const char *a = argv[*i];
	size_t n = strlen(name);
	if (strncmp(a, name, n) != 0 || (a[n] != '\0' && a[n] != '='))
		return 0;
	const char *v = a[n] == '=' ? a + n + 1 : *i + 1 < argc ? argv[++*i] : NULL;
	if (!v || !*v) {
		option_error(cmd, "%s needs a value", name);
		return KILNC_EXIT_USAGE;
	}
	if (*out) {
		option_error(cmd, "%s given twice", name);
		return KILNC_EXIT_USAGE;
	}
	*out = v;
	return 1;
}

int kilnc_flag(const char *cmd, const char *name, const char *arg, bool *flag)
{
	if (strcmp(arg, name) != 0)
		return 0;
	if (*flag) {
		option_error(cmd, "%s given twice", name);
		return KILNC_EXIT_USAGE;
	}
	*flag = true;
	return 1;
}

void kilnc_usage(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	fputs("kilnc: error: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry 'kilnc help %s'.\n", cmd);
}

int kilnc_arg_i64(const char *cmd, const char *opt, const char *v, int64_t lo, int64_t hi,
                  int64_t *out)
{
	if (kiln_num_i64_parse(v, strlen(v), lo, hi, out) == KILN_NUM_OK)
		return KILNC_EXIT_OK;
	char buf[200];
	kilnc_usage(cmd, "%s: must be an integer from %" PRId64 " to %" PRId64 ", got '%s'", opt,
	            lo, hi, kilnc_shown(v, buf, sizeof buf));
	return KILNC_EXIT_USAGE;
}

int kilnc_arg_u64(const char *cmd, const char *opt, const char *v, uint64_t lo, uint64_t hi,
                  uint64_t *out)
{
	if (kiln_num_u64_parse(v, strlen(v), lo, hi, out) == KILN_NUM_OK)
		return KILNC_EXIT_OK;
	char buf[200];
	kilnc_usage(cmd, "%s: must be an integer from %" PRIu64 " to %" PRIu64 ", got '%s'", opt,
	            lo, hi, kilnc_shown(v, buf, sizeof buf));
	return KILNC_EXIT_USAGE;
}

int kilnc_arg_f64(const char *cmd, const char *opt, const char *v, double lo, double hi,
                  double *out)
{
	if (kiln_num_f64_parse(v, strlen(v), lo, hi, out) == KILN_NUM_OK)
		return KILNC_EXIT_OK;
	char buf[200];
	kilnc_usage(cmd, "%s: must be a decimal number from %.15g to %.15g, got '%s'", opt, lo, hi,
	            kilnc_shown(v, buf, sizeof buf));
	return KILNC_EXIT_USAGE;
}

int kilnc_arg_bytes(const char *cmd, const char *opt, const char *v, uint64_t hi, uint64_t *out)
{
	uint64_t b;
	if (kiln_num_bytes_parse(v, strlen(v), &b) == KILN_NUM_OK && b <= hi) {
		*out = b;
		return KILNC_EXIT_OK;
	}
	char buf[200];
	kilnc_usage(cmd,
	            "%s: must be a byte count from 0 to %" PRIu64 ": digits with an optional "
	            "suffix K, M, G or T (powers of 1024; KiB, KB, ... alike; B for bytes), as in "
	            "12G or 3500MiB; got '%s'",
	            opt, hi, kilnc_shown(v, buf, sizeof buf));
	return KILNC_EXIT_USAGE;
}

int kilnc_check_outputs(const kiln_out_name *in, size_t n_in, const kiln_model *m,
                        const kiln_out_name *out, size_t n_out)
{
	kiln_out_name all_in[8], all_out[8];
	if (n_in + 1 > 8 || n_out + 1 > 8)
		return KILNC_EXIT_USAGE; /* not reached: commands have a few files */
	for (size_t i = 0; i < n_in; i++)
		all_in[i] = in[i];
	/* A shipped or inline profile has no file ("<shipped:NAME>", the model). */
	all_in[n_in++] = (kiln_out_name){
	    "hardware profile", m && m->hw.source && m->hw.source[0] != '<' ? m->hw.source : NULL};
	for (size_t j = 0; j < n_out; j++)
		all_out[j] = out[j];
	/* stdout redirected to a file is an output too (`> out.svg` beside
	 * --emit-svg out.svg, `>> m.yaml`). */
	struct stat st;
	all_out[n_out++] = (kiln_out_name){
	    "the standard output",
	    fstat(STDOUT_FILENO, &st) == 0 && S_ISREG(st.st_mode) ? "/dev/stdout" : NULL};
	return kiln_out_check("kilnc", all_in, n_in, all_out, n_out, stderr) == 0
	           ? KILNC_EXIT_OK
	           : KILNC_EXIT_USAGE;
}

int kilnc_read_file(const char *path, off_t max_bytes, char **out, size_t *out_len)
{
	*out = NULL;
	*out_len = 0;
	/* O_NONBLOCK: a FIFO must not hang us before fstat refuses it. */
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "kilnc: error: %s: cannot open: %s\n", path, strerror(errno));
		return KILNC_EXIT_INPUT;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		fprintf(stderr, "kilnc: error: %s: not a regular file\n", path);
		close(fd);
		return KILNC_EXIT_INPUT;
	}
	if (st.st_size > max_bytes) {
		fprintf(stderr, "kilnc: error: %s: %lld bytes, over the limit of %lld\n", path,
		        (long long)st.st_size, (long long)max_bytes);
		close(fd);
		return KILNC_EXIT_INPUT;
	}
	size_t cap = (size_t)st.st_size, len = 0;
	char *buf = malloc(cap + 1);
	if (!buf) {
		fprintf(stderr, "kilnc: error: out of memory reading %s\n", path);
		close(fd);
		return KILNC_EXIT_INPUT;
	}
	while (len < cap) {
		ssize_t k = read(fd, buf + len, cap - len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			fprintf(stderr, "kilnc: error: %s: cannot read: %s\n", path,
			        strerror(errno));
			free(buf);
			close(fd);
			return KILNC_EXIT_INPUT;
		}
		if (k == 0)
			break;
		len += (size_t)k;
	}
	close(fd);
	buf[len] = '\0';
	*out = buf;
	*out_len = len;
	return KILNC_EXIT_OK;
}
