/* tools/tools.h: what kilnc's files share. */
#ifndef KILN_TOOLS_H
#define KILN_TOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tools/output.h"

/* A numeric constant's digits as a string literal, for messages and help
 * texts that name one (KILNC_STR(KILN_SIM_MAX_POLICIES) is "64"). */
#define KILNC_STR_(x) #x
#define KILNC_STR(x) KILNC_STR_(x)

/* Exit status (docs/cli.md). */
enum { KILNC_EXIT_OK = 0, KILNC_EXIT_INPUT = 1, KILNC_EXIT_USAGE = 2, KILNC_EXIT_INFEASIBLE = 3 };

/* args.c: matches "--NAME V" and "--NAME=V" at argv[*i]; sets *out
 * (advancing *i past V). Returns 1 when matched, 0 when not, and
 * KILNC_EXIT_USAGE (reported on stderr, with "Try 'kilnc help CMD'." or,
 * cmd NULL, "Try 'kilnc --help'.") when V is missing or empty or NAME was
 * given before. */
int kilnc_option_value(const char *cmd, const char *name, int argc, char **argv, int *i,
                       const char **out);
/* args.c: matches the flag NAME at arg and sets *flag. Returns 1 when
 * matched, 0 when not, and KILNC_EXIT_USAGE (reported as above) when *flag
 * was set already: every option of kilnc is given at most once
 * (docs/cli.md). */
int kilnc_flag(const char *cmd, const char *name, const char *arg, bool *flag);
/* args.c: "kilnc: error: MESSAGE" and "Try 'kilnc help CMD'." on stderr. */
void kilnc_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* args.c: "kilnc: error: " fmt with its one %s, arg (from the command line,
 * borrowed) escaped, then "Try 'kilnc --help'." on stderr. */
void kilnc_usage_error(const char *fmt, const char *arg);
/* args.c: s (borrowed) escaped for the terminal (kiln_text_escape) into buf
 * of cap bytes; returns buf. */
const char *kilnc_shown(const char *s, char *buf, size_t cap);

/* args.c: the value v of option opt of command cmd, read by the rules of
 * docs/cli.md, "Numbers" (kiln_num_*_parse in ir/ir.h). Each sets *out and
 * returns 0, or reports "kilnc: error: OPT: must be ... from LO to HI, got
 * 'V'" and returns KILNC_EXIT_USAGE. Bounds are inclusive; a byte count's
 * lower bound is 0. */
int kilnc_arg_i64(const char *cmd, const char *opt, const char *v, int64_t lo, int64_t hi,
                  int64_t *out);
int kilnc_arg_u64(const char *cmd, const char *opt, const char *v, uint64_t lo, uint64_t hi,
                  uint64_t *out);
int kilnc_arg_f64(const char *cmd, const char *opt, const char *v, double lo, double hi,
                  double *out);
int kilnc_arg_bytes(const char *cmd, const char *opt, const char *v, uint64_t hi, uint64_t *out);

/* blobcmd.c: reads the plan blob file at path into an 8-aligned malloc'd
 * buffer (*out_bytes, *out_len, the caller frees it after closing *out) and
 * opens it with kiln_rt_open. Returns 0, or KILNC_EXIT_INPUT after
 * reporting "kilnc: error: PATH: REASON" (a blob of another version names
 * both versions). */
struct kiln_rt;
int kilnc_blob_load(const char *path, unsigned char **out_bytes, size_t *out_len,
                    struct kiln_rt **out);

/* args.c: the output rule's check (tools/output.h) of a command's outputs
 * against its inputs and, once the description is loaded (m not NULL), the
 * hardware profile it names by path. Returns 0, or KILNC_EXIT_USAGE after
 * reporting. Commands call it before the description is read, so that
 * naming the model as an output is refused whether or not it loads, and
 * again with m. */
struct kiln_model;
int kilnc_check_outputs(const kiln_out_name *in, size_t n_in, const struct kiln_model *m,
                        const kiln_out_name *out, size_t n_out);

/* args.c: reads the regular file at path, of at most max_bytes, into a
 * malloc'd, NUL-terminated buffer (*out, the caller frees; *out_len bytes).
 * Returns 0, or KILNC_EXIT_INPUT after reporting "kilnc: error: PATH:
 * REASON" (missing, not a regular file (a FIFO is never waited on), too
 * large, unreadable). */
int kilnc_read_file(const char *path, off_t max_bytes, char **out, size_t *out_len);

/* hfcmd.c: `kilnc import hf` (arguments after "import"), and its help. */
int kilnc_import(int argc, char **argv);
int kilnc_help_import(void);

/* blobcmd.c: `kilnc inspect` and `kilnc select` (arguments after the command
 * name); each returns the exit status. */
int kilnc_inspect(int argc, char **argv);
int kilnc_select(int argc, char **argv);
/* simcmd.c: `kilnc simulate`, and its help. */
int kilnc_simulate(int argc, char **argv);
int kilnc_help_simulate(void);

/* Prints the help of "inspect" or "select"; -1 for another name. */
int kilnc_help_blob(const char *cmd);

#endif
