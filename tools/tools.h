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

/* kilnc.c: the files the description at path (loaded into m) reads, for
 * the output rule (tools/output.h): out[0] itself, out[1] its hardware
 * profile when it names one by path (else a NULL path). */
struct kiln_model;
void kilnc_model_inputs(const char *path, const struct kiln_model *m, kiln_out_name *out);

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
