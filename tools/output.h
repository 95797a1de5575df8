/* tools/output.h: the one output rule of kiln's programs (docs/cli.md,
 * "Output files"), shared by kilnc and examples/trainer. libc only.
 *
 *  - No output names an input of the same command or another of its outputs
 *    (kiln_out_check): paths are compared as files (device and inode) where
 *    they exist, as resolved names (symlinks followed) where they do not.
 *  - A regular file, or a new one, is written to a temporary file in the
 *    directory of its target (a symlink's target is written, the link stays)
 *    and renamed over the target once every write, the flush, the fsync and
 *    the close have succeeded: the target is either whole or as it was.
 *  - A character device or a FIFO is written directly, never replaced.
 *  - Every write is checked; a failure is reported once, with the reason of
 *    the first failed call (strerror), and leaves no temporary file behind.
 *  - SIGINT, SIGTERM, SIGHUP and SIGQUIT remove the temporary files still
 *    open, then end the process with status 128 + the signal; exit()
 *    removes them too. Once an output is open, SIGPIPE and SIGXFSZ are
 *    ignored, so a reader that leaves or a file-size limit is a failed
 *    write (EPIPE, EFBIG) reported with its file's name.
 *  - Root replacing a file keeps its owner and group.
 *
 * Messages go to the err stream given, as "PROG: error: ...", PROG being the
 * program name given to kiln_out_check and kiln_out_open.
 */
#ifndef KILN_TOOLS_OUTPUT_H
#define KILN_TOOLS_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* A file one command reads or writes, as the user named it. */
typedef struct kiln_out_name {
	const char *what; /* the option or operand: "-o", "--plan", "MODEL" */
	const char *path; /* NULL: not given (skipped) */
} kiln_out_name;

/* Refuses outputs that would overwrite an input or another output: returns
 * 0, or -1 after printing both names (the caller exits with status 2).
 * Arrays and strings are borrowed. O((n_in + n_out) * n_out) stat calls. */
int kiln_out_check(const char *prog, const kiln_out_name *inputs, size_t n_in,
                   const kiln_out_name *outputs, size_t n_out, FILE *err);

/* One output on its way to its file. */
typedef struct kiln_out kiln_out;

/* Opens path for writing by the rule above. Returns the handle (owned by the
 * caller until kiln_out_commit or kiln_out_discard), or NULL after
 * reporting (a directory, a missing directory, no permission, too many
 * outputs open at once). prog and path are borrowed for the handle's life. */
kiln_out *kiln_out_open(const char *prog, const char *path, FILE *err);

/* The stream to write to; borrowed, valid until kiln_out_finish. */
FILE *kiln_out_stream(kiln_out *o);

/* Flushes, syncs (regular files) and closes the stream, checking each step
 * and every write before them. Returns 0, or -1 after reporting; after -1
 * the handle can only be discarded. */
int kiln_out_finish(kiln_out *o, FILE *err);

/* Renames a finished output into place (nothing to do for a device or
 * FIFO) and frees the handle. Returns 0, or -1 after reporting (the
 * temporary file is removed, the target is as it was). */
int kiln_out_commit(kiln_out *o, FILE *err);

/* Removes the temporary file, if any, and frees the handle; the target is as
 * it was (a device or FIFO keeps what was written). NULL is ignored. */
void kiln_out_discard(kiln_out *o);

/* All or none: finishes every handle of v, then commits each when all
 * finished, else discards each. Frees every handle. Returns 0 or -1
 * (reported). */
int kiln_out_commit_all(kiln_out **v, size_t n, FILE *err);

/* Opens path and writes fill's content into it (as kiln_out_write), but
 * leaves the output to be committed (kiln_out_commit, _commit_all) or
 * discarded. NULL after reporting. */
kiln_out *kiln_out_stage(const char *prog, const char *path, int (*fill)(FILE *f, void *ctx),
                         void *ctx, FILE *err);

/* Writes one file: fill(stream, ctx) returns 0, or -1 when it failed: a
 * failed write is found and reported here (fill need not check its
 * writes), any other failure fill reports itself. On -1 the target is as
 * it was. Returns 0 or -1. */
int kiln_out_write(const char *prog, const char *path, int (*fill)(FILE *f, void *ctx), void *ctx,
                   FILE *err);

/* Makes stdout a stream over the same checked writes (line-buffered on a
 * terminal), so that the reason of a failed write to it is known; call it
 * first thing in main. Returns 0, or -1 (stdout stays as it was). */
int kiln_out_stdout_init(void);

/* Flushes stdout and reports a failed write to it with its reason
 * ("PROG: error: writing the standard output: No space left on device").
 * Returns 0 or -1. */
int kiln_out_stdout_finish(const char *prog, FILE *err);

/* Flushes stdout and says whether every write to it so far succeeded,
 * reporting nothing (kiln_out_stdout_finish reports). Callers check it
 * before committing their files, so a failed stdout leaves them as they
 * were. */
bool kiln_out_stdout_ok(void);

#endif
