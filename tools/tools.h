/* tools/tools.h: what kilnc's files share. */
#ifndef KILN_TOOLS_H
#define KILN_TOOLS_H

#include "tools/output.h"

/* Exit status (docs/cli.md). */
enum { KILNC_EXIT_OK = 0, KILNC_EXIT_INPUT = 1, KILNC_EXIT_USAGE = 2, KILNC_EXIT_INFEASIBLE = 3 };

/* kilnc.c: matches "--NAME V" and "--NAME=V" at argv[*i]; sets *out
 * (advancing *i past V). Returns 1 when matched, 0 when not, and
 * KILNC_EXIT_USAGE (reported on stderr) when V is missing or empty or NAME
 * was given before. */
int kilnc_option_value(const char *name, int argc, char **argv, int *i, const char **out);

/* kilnc.c: the output rule's check (tools/output.h) of a command's outputs
 * against its inputs and, once the description is loaded (m not NULL), the
 * hardware profile it names by path. Returns 0, or KILNC_EXIT_USAGE after
 * reporting. Commands call it before the description is read, so that
 * naming the model as an output is refused whether or not it loads, and
 * again with m. */
struct kiln_model;
int kilnc_check_outputs(const kiln_out_name *in, size_t n_in, const struct kiln_model *m,
                        const kiln_out_name *out, size_t n_out);

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
