/* tests/test_output.c: the output rule (tools/output.c, docs/cli.md "Output
 * files"): the helper itself, then every command that writes files, fed
 * the paths a careless user or an attacker would give. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kiln_test.h"
#include "tools/output.h"

#define RUN(...) kt_kilnc((const char *const[]){__VA_ARGS__, NULL}, NULL)

/* ---------------------------------------------------------------- helpers */

typedef struct tdir {
	char path[64];
} tdir;

static tdir dir_new(void)
{
	tdir d;
	snprintf(d.path, sizeof d.path, "/tmp/kiln-out-XXXXXX");
	cr_assert_not_null(mkdtemp(d.path));
	return d;
}

/* d/name in a static ring of buffers, so a test can hold several. */
static const char *in_dir(const tdir *d, const char *name)
{
	static char buf[8][320];
	static int k;
	char *b = buf[k++ % 8];
	snprintf(b, sizeof buf[0], "%s/%s", d->path, name);
	return b;
}

static void put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fputs(text, f);
	cr_assert_eq(fclose(f), 0);
}

/* The whole file, NUL-terminated (caller frees), or NULL when unreadable. */
static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 1 << 16, len = 0, k;
	char *b = malloc(cap + 1);
	cr_assert_not_null(b);
	while ((k = fread(b + len, 1, cap - len, f)) > 0) {
		len += k;
		if (len == cap) {
			cap *= 2;
			b = realloc(b, cap + 1);
			cr_assert_not_null(b);
		}
	}
	fclose(f);
	b[len] = '\0';
	return b;
}

static bool same_text(const char *path, const char *text)
{
	char *s = slurp(path);
	bool same = s && strcmp(s, text) == 0;
	free(s);
	return same;
}

/* Entries of d whose name contains ".tmp." (the rule's temporary files). */
static int temps_in(const tdir *d)
{
	DIR *dp = opendir(d->path);
	cr_assert_not_null(dp);
	int n = 0;
	for (struct dirent *e; (e = readdir(dp));)
		n += strstr(e->d_name, ".tmp.") != NULL;
	closedir(dp);
	return n;
}

/* Removes d and what a test left in it (no subdirectories). */
static void dir_free(tdir *d)
{
	DIR *dp = opendir(d->path);
	if (!dp)
		return;
	for (struct dirent *e; (e = readdir(dp));)
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			unlink(in_dir(d, e->d_name));
	closedir(dp);
	rmdir(d->path);
}

static int fill_text(FILE *f, void *ctx)
{
	fputs(ctx, f);
	return 0;
}

/* A stream the messages go to, read back with err_text. */
static FILE *err_stream(char **buf, size_t *len)
{
	FILE *f = open_memstream(buf, len);
	cr_assert_not_null(f);
	return f;
}

/* ---------------------------------------------------------------- the check */

Test(output, check_refuses_one_file_under_two_names)
{
	tdir d = dir_new();
	const char *model = in_dir(&d, "m.yaml"), *sym = in_dir(&d, "link.yaml"),
	           *hard = in_dir(&d, "hard.yaml"), *dotted = in_dir(&d, "./m.yaml");
	put(model, "x\n");
	cr_assert_eq(symlink("m.yaml", sym), 0);
	cr_assert_eq(link(model, hard), 0);
	const char *aliases[] = {model, dotted, sym, hard};
	for (int i = 0; i < 4; i++) {
		char *msg = NULL;
		size_t len = 0;
		FILE *err = err_stream(&msg, &len);
		kiln_out_name in = {"MODEL", model}, out = {"-o", aliases[i]};
		cr_assert_eq(kiln_out_check("kilnc", &in, 1, &out, 1, err), -1, "%s", aliases[i]);
		fclose(err);
		/* Both names, as given. */
		cr_assert_not_null(strstr(msg, aliases[i]), "%s", msg);
		cr_assert_not_null(strstr(msg, "MODEL"), "%s", msg);
		free(msg);
	}
	/* Two outputs that do not exist yet, one name resolved two ways. */
	mkdir(in_dir(&d, "sub"), 0700);
	kiln_out_name outs[] = {{"--emit-trace", in_dir(&d, "new.json")},
	                        {"--emit-loads", in_dir(&d, "sub/../new.json")}};
	FILE *null = fopen("/dev/null", "w");
	cr_assert_eq(kiln_out_check("kilnc", NULL, 0, outs, 2, null), -1);
	/* A dangling symlink and the file it would create. */
	cr_assert_eq(symlink("future.json", in_dir(&d, "dangling.json")), 0);
	kiln_out_name outs2[] = {{"--emit-trace", in_dir(&d, "dangling.json")},
	                         {"--emit-loads", in_dir(&d, "future.json")}};
	cr_assert_eq(kiln_out_check("kilnc", NULL, 0, outs2, 2, null), -1);
	/* Different files pass; absent names are skipped. */
	kiln_out_name in = {"MODEL", model}, none = {"--plan", NULL};
	kiln_out_name fine[] = {{"-o", in_dir(&d, "a.kiln")},
	                        {"--emit-svg", in_dir(&d, "a.svg")},
	                        {"--emit-mlir", NULL}};
	const kiln_out_name ins[] = {in, none};
	cr_assert_eq(kiln_out_check("kilnc", ins, 2, fine, 3, null), 0);
	fclose(null);
	rmdir(in_dir(&d, "sub"));
	dir_free(&d);
}

/* ---------------------------------------------------------------- writing */

Test(output, replaces_a_file_whole_keeping_its_mode)
{
	tdir d = dir_new();
	const char *p = in_dir(&d, "f.txt");
	put(p, "old\n");
	cr_assert_eq(chmod(p, 0640), 0);
	kiln_out *o = kiln_out_open("t", p, stderr);
	cr_assert_not_null(o);
	fputs("new content\n", kiln_out_stream(o));
	/* Until the commit the file is as it was, beside one temporary file. */
	cr_assert(same_text(p, "old\n"));
	cr_assert_eq(temps_in(&d), 1);
	cr_assert_eq(kiln_out_commit(o, stderr), 0);
	cr_assert(same_text(p, "new content\n"));
	cr_assert_eq(temps_in(&d), 0);
	struct stat st;
	cr_assert_eq(stat(p, &st), 0);
	cr_assert_eq(st.st_mode & 07777, 0640);
	/* Discarding leaves the file as it was. */
	o = kiln_out_open("t", p, stderr);
	cr_assert_not_null(o);
	fputs("never\n", kiln_out_stream(o));
	kiln_out_discard(o);
	cr_assert(same_text(p, "new content\n"));
	cr_assert_eq(temps_in(&d), 0);
	dir_free(&d);
}

Test(output, a_symlink_s_target_is_written_and_the_link_stays)
{
	tdir d = dir_new();
	const char *real = in_dir(&d, "real.csv"), *sym = in_dir(&d, "link.csv");
	put(real, "old\n");
	cr_assert_eq(symlink("real.csv", sym), 0);
	cr_assert_eq(kiln_out_write("t", sym, fill_text, "via the link\n", stderr), 0);
	struct stat st;
	cr_assert_eq(lstat(sym, &st), 0);
	cr_assert(S_ISLNK(st.st_mode), "the link was replaced");
	cr_assert(same_text(real, "via the link\n"));
	dir_free(&d);
}

/* A character device is written in place: the node keeps its inode and
 * device number. As root a private null device is made for the test;
 * otherwise /dev/null itself (nobody but root could replace it). */
Test(output, a_character_device_is_written_not_replaced)
{
	tdir d = dir_new();
	const char *dev = in_dir(&d, "null");
	if (mknod(dev, S_IFCHR | 0666, makedev(1, 3)) != 0)
		dev = "/dev/null";
	struct stat before, after;
	cr_assert_eq(stat(dev, &before), 0);
	cr_assert(S_ISCHR(before.st_mode));
	cr_assert_eq(kiln_out_write("t", dev, fill_text, "discarded\n", stderr), 0);
	cr_assert_eq(stat(dev, &after), 0);
	cr_assert(S_ISCHR(after.st_mode), "%s is no longer a device", dev);
	cr_assert_eq(after.st_ino, before.st_ino);
	cr_assert_eq(after.st_rdev, before.st_rdev);
	cr_assert_eq(temps_in(&d), 0);
	dir_free(&d);
}

Test(output, a_fifo_is_written_not_replaced)
{
	tdir d = dir_new();
	const char *fifo = in_dir(&d, "pipe");
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	pid_t reader = fork();
	cr_assert(reader >= 0);
	if (reader == 0) {
		/* Reads everything and exits 0 when it is the text. */
		char *s = slurp(fifo);
		_exit(s && strcmp(s, "through the pipe\n") == 0 ? 0 : 1);
	}
	cr_assert_eq(kiln_out_write("t", fifo, fill_text, "through the pipe\n", stderr), 0);
	int st;
	cr_assert_eq(waitpid(reader, &st, 0), reader);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the reader did not get the text");
	struct stat s;
	cr_assert_eq(lstat(fifo, &s), 0);
	cr_assert(S_ISFIFO(s.st_mode), "the FIFO was replaced");
	dir_free(&d);
}

/* A failed write keeps the old file, leaves no temporary file and gives the
 * reason: a file-size limit makes a regular file's write fail with EFBIG,
 * /dev/full with ENOSPC. */
Test(output, a_failed_write_keeps_the_old_file_and_gives_the_reason)
{
	tdir d = dir_new();
	const char *p = in_dir(&d, "big.csv");
	put(p, "old\n");
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		/* The output ignores SIGXFSZ itself: the write fails with EFBIG. */
		struct rlimit lim = {4096, 4096};
		setrlimit(RLIMIT_FSIZE, &lim);
		char *big = malloc(1 << 20);
		memset(big, 'x', 1 << 20);
		big[(1 << 20) - 1] = '\0';
		char *msg = NULL;
		size_t len = 0;
		FILE *err = open_memstream(&msg, &len);
		int rc = kiln_out_write("t", p, fill_text, big, err);
		fclose(err);
		_exit(rc == -1 && strstr(msg, "File too large") ? 0 : 1);
	}
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "no failure, or not its reason");
	cr_assert(same_text(p, "old\n"), "the old file was touched");
	cr_assert_eq(temps_in(&d), 0, "a temporary file was left");

	char *msg = NULL;
	size_t len = 0;
	FILE *err = err_stream(&msg, &len);
	cr_assert_eq(kiln_out_write("t", "/dev/full", fill_text, "x\n", err), -1);
	fclose(err);
	cr_assert_not_null(strstr(msg, "No space left on device"), "%s", msg);
	free(msg);
	dir_free(&d);
}

Test(output, all_or_none)
{
	tdir d = dir_new();
	const char *a = in_dir(&d, "a.json");
	put(a, "old a\n");
	kiln_out *v[2] = {kiln_out_open("t", a, stderr), kiln_out_open("t", "/dev/full", stderr)};
	cr_assert(v[0] && v[1]);
	fputs("new a\n", kiln_out_stream(v[0]));
	fputs("never fits\n", kiln_out_stream(v[1]));
	FILE *null = fopen("/dev/null", "w");
	cr_assert_eq(kiln_out_commit_all(v, 2, null), -1);
	fclose(null);
	cr_assert(same_text(a, "old a\n"), "one output went into place although another failed");
	cr_assert_eq(temps_in(&d), 0);
	dir_free(&d);
}

/* A rename that fails after another output went into place puts that one
 * back: all or none holds through the renames too. */
Test(output, a_failed_rename_restores_the_outputs_already_renamed)
{
	tdir d = dir_new();
	const char *a = in_dir(&d, "a.json");
	put(a, "old a\n");
	char b[4096], c[4096];
	snprintf(b, sizeof b, "%s", in_dir(&d, "b.json"));
	snprintf(c, sizeof c, "%s", in_dir(&d, "c.json"));
	kiln_out *v[3] = {kiln_out_open("t", a, stderr), kiln_out_open("t", c, stderr),
	                  kiln_out_open("t", b, stderr)};
	cr_assert(v[0] && v[1] && v[2]);
	fputs("new a\n", kiln_out_stream(v[0]));
	fputs("new c\n", kiln_out_stream(v[1]));
	fputs("new b\n", kiln_out_stream(v[2]));
	/* b becomes a directory: renaming a file over it fails (EISDIR). */
	cr_assert_eq(mkdir(b, 0700), 0);
	char *msg = NULL;
	size_t len = 0;
	FILE *err = err_stream(&msg, &len);
	cr_assert_eq(kiln_out_commit_all(v, 3, err), -1);
	fclose(err);
	cr_assert_not_null(strstr(msg, "b.json"), "%s", msg);
	free(msg);
	cr_assert(same_text(a, "old a\n"), "a stayed replaced after b failed");
	cr_assert_eq(access(c, F_OK), -1, "c was created although b failed");
	cr_assert_eq(rmdir(b), 0);
	DIR *dp = opendir(d.path);
	int left = 0;
	for (struct dirent *e; (e = readdir(dp));)
		left += e->d_name[0] != '.';
	closedir(dp);
	cr_assert_eq(left, 1, "a backup or temporary file was left");
	dir_free(&d);
}

Test(output, refuses_what_is_no_file_to_write)
{
	tdir d = dir_new();
	FILE *null = fopen("/dev/null", "w");
	cr_assert_null(kiln_out_open("t", d.path, null));                        /* a directory */
	cr_assert_null(kiln_out_open("t", in_dir(&d, "no/such/dir.txt"), null)); /* missing dir */
	fclose(null);
	cr_assert_eq(temps_in(&d), 0);
	dir_free(&d);
}

/* An interrupt removes the temporary files still open and ends the process
 * with 128 + the signal; so does exit(). */
Test(output, signals_and_exit_remove_temporary_files)
{
	static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, 0};
	for (int k = 0; k < 4; k++) {
		tdir d = dir_new();
		const char *p = in_dir(&d, "out.kiln"), *q = in_dir(&d, "out.svg");
		put(p, "old\n");
		pid_t pid = fork();
		cr_assert(pid >= 0);
		if (pid == 0) {
			/* A run started in the background (`nohup`, `&`) inherits
			 * SIGINT ignored, and kiln_out leaves an ignored signal
			 * ignored (tools/output.c); this test is of the handler. */
			for (int j = 0; j < 3; j++)
				signal(sigs[j], SIG_DFL);
			kiln_out *a = kiln_out_open("t", p, stderr),
			         *b = kiln_out_open("t", q, stderr);
			if (!a || !b)
				_exit(99);
			fputs("partial", kiln_out_stream(a));
			fflush(kiln_out_stream(a));
			if (temps_in(&d) != 2)
				_exit(98);
			if (sigs[k])
				raise(sigs[k]);
			exit(7);
		}
		int st;
		cr_assert_eq(waitpid(pid, &st, 0), pid);
		int want = sigs[k] ? 128 + sigs[k] : 7;
		cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == want, "signal %d: status %d", sigs[k],
		          WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
		cr_assert_eq(temps_in(&d), 0, "signal %d left temporary files", sigs[k]);
		cr_assert(same_text(p, "old\n"));
		cr_assert_neq(access(q, F_OK), 0);
		dir_free(&d);
	}
}

/* ---------------------------------------------------------------- kilnc */

/* kilnc refuses (exit 2, both names) any output that is one of its inputs,
 * and never touches the input. */
/* A signal that kills by default (and abort(), as from an allocation
 * failure inside MLIR) removes the temporary files, then kills the process
 * by that same signal. */
Test(output, fatal_signals_and_abort_remove_temporary_files)
{
	static const int sigs[] = {SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU, SIGABRT};
	for (size_t k = 0; k < sizeof sigs / sizeof *sigs; k++) {
		tdir d = dir_new();
		const char *p = in_dir(&d, "out.kiln");
		put(p, "old\n");
		pid_t pid = fork();
		cr_assert(pid >= 0);
		if (pid == 0) {
			signal(sigs[k], SIG_DFL);
			kiln_out *a = kiln_out_open("t", p, stderr);
			if (!a)
				_exit(99);
			fputs("partial", kiln_out_stream(a));
			fflush(kiln_out_stream(a));
			if (temps_in(&d) != 1)
				_exit(98);
			if (sigs[k] == SIGABRT)
				abort();
			raise(sigs[k]);
			_exit(7);
		}
		int st;
		cr_assert_eq(waitpid(pid, &st, 0), pid);
		cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == sigs[k], "signal %d: status %d",
		          sigs[k], WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
		cr_assert_eq(temps_in(&d), 0, "signal %d left temporary files", sigs[k]);
		cr_assert(same_text(p, "old\n"));
		dir_free(&d);
	}
}

Test(cli_output, outputs_that_are_inputs_are_refused)
{
	tdir d = dir_new();
	char *tiny = slurp(kt_src("examples/models/tiny.yaml"));
	cr_assert_not_null(tiny);
	const char *m = in_dir(&d, "m.yaml");
	put(m, tiny);
	const char *const cases[][9] = {
	    {"compile", m, "-o", m, NULL},
	    {"compile", m, "--emit-svg", m, NULL},
	    {"compile", m, "--emit-mlir", in_dir(&d, "./m.yaml"), NULL},
	    {"simulate", m, "--policy", "kiln", "--iters", "1", "--emit-trace", m},
	    {"simulate", m, "--emit-loads", m, NULL},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		kt_run r = kt_kilnc(cases[i], NULL);
		cr_assert_eq(r.status, 2, "%s %s: status %d: %s", cases[i][0], cases[i][2],
		             r.status, r.err);
		cr_assert_not_null(strstr(r.err, "is the input MODEL"), "%s", r.err);
		cr_assert(same_text(m, tiny), "case %zu destroyed the model", i);
		kt_run_free(&r);
	}
	cr_assert_eq(temps_in(&d), 0);

	/* The plan given to simulate survives --emit-loads naming it. */
	const char *plan = in_dir(&d, "p.kiln");
	kt_run r = RUN("compile", m, "-o", plan);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	char *before = slurp(plan);
	r = RUN("simulate", m, "--plan", plan, "--policy", "kiln", "--emit-loads", plan);
	cr_assert_eq(r.status, 2, "%s", r.err);
	cr_assert_not_null(strstr(r.err, "is the input --plan"), "%s", r.err);
	kt_run_free(&r);
	char *after = slurp(plan);
	cr_assert(after && strcmp(before, after) == 0, "the plan was destroyed");
	free(before);
	free(after);

	/* A hardware profile named by path is an input too. */
	const char *hw = in_dir(&d, "hw.yaml");
	char *prof = slurp(kt_src("examples/hardware/h100-sxm.yaml"));
	cr_assert_not_null(prof);
	put(hw, prof);
	char *mh = strdup(tiny);
	char *at = strstr(mh, "hardware:");
	cr_assert_not_null(at, "tiny names its hardware");
	/* tiny's hardware is an inline mapping: write a model naming hw.yaml. */
	const char *m2 = in_dir(&d, "m2.yaml");
	FILE *f = fopen(m2, "w");
	cr_assert_not_null(f);
	fwrite(mh, 1, (size_t)(at - mh), f);
	fprintf(f, "hardware: ./hw.yaml\n");
	/* The rest of tiny after its hardware mapping (indented lines). */
	const char *rest = strchr(at, '\n');
	while (rest && (rest[1] == ' ' || rest[1] == '\t'))
		rest = strchr(rest + 1, '\n');
	if (rest)
		fputs(rest + 1, f);
	fclose(f);
	r = RUN("check", m2);
	cr_assert_eq(r.status, 0, "the test's model with a hardware path: %s", r.err);
	kt_run_free(&r);
	r = RUN("compile", m2, "--emit-trace", hw);
	cr_assert_eq(r.status, 2, "%s", r.err);
	cr_assert_not_null(strstr(r.err, "is the input hardware profile"), "%s", r.err);
	cr_assert(same_text(hw, prof), "the hardware profile was destroyed");
	kt_run_free(&r);

	/* viz: the MLIR it reads. */
	const char *mlir = in_dir(&d, "p.json");
	put(mlir, "not mlir\n");
	r = RUN("viz", mlir, "-o", mlir);
	cr_assert_eq(r.status, 2, "%s", r.err);
	cr_assert(same_text(mlir, "not mlir\n"));
	kt_run_free(&r);
	free(prof);
	free(mh);
	free(tiny);
	dir_free(&d);
}

Test(cli_output, two_outputs_to_one_file_are_refused)
{
	tdir d = dir_new();
	const char *tiny = kt_src("examples/models/tiny.yaml");
	const char *x = in_dir(&d, "x.out");
	kt_run r = RUN("simulate", tiny, "--policy", "kiln", "--iters", "1", "--emit-loads", x,
	               "--emit-trace", x);
	cr_assert_eq(r.status, 2, "%s", r.err);
	cr_assert_not_null(strstr(r.err, "are the same file"), "%s", r.err);
	cr_assert_neq(access(x, F_OK), 0, "something was written");
	kt_run_free(&r);
	r = RUN("compile", tiny, "-o", x, "--emit-svg", in_dir(&d, "./x.out"));
	cr_assert_eq(r.status, 2, "%s", r.err);
	cr_assert_neq(access(x, F_OK), 0, "something was written");
	kt_run_free(&r);
	dir_free(&d);
}

/* simulate's outputs keep a device a device, a FIFO a FIFO, a symlink a
 * symlink. */
Test(cli_output, simulate_writes_into_devices_fifos_and_links)
{
	tdir d = dir_new();
	const char *tiny = kt_src("examples/models/tiny.yaml");
	const char *dev = in_dir(&d, "null");
	if (mknod(dev, S_IFCHR | 0666, makedev(1, 3)) != 0)
		dev = "/dev/null";
	struct stat before, after;
	cr_assert_eq(stat(dev, &before), 0);
	const char *opts[] = {"--emit-loads", "--emit-trace"};
	for (int k = 0; k < 2; k++) {
		kt_run r = RUN("simulate", tiny, "--policy", "kiln", "--iters", "2", opts[k], dev);
		cr_assert_eq(r.status, 0, "%s: %s", opts[k], r.err);
		kt_run_free(&r);
		cr_assert_eq(stat(dev, &after), 0);
		cr_assert(S_ISCHR(after.st_mode) && after.st_ino == before.st_ino &&
		              after.st_rdev == before.st_rdev,
		          "%s replaced the device %s", opts[k], dev);
	}
	/* A FIFO with a reader: the reader gets the CSV, the FIFO stays. */
	const char *fifo = in_dir(&d, "pipe");
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	pid_t reader = fork();
	cr_assert(reader >= 0);
	if (reader == 0) {
		char *s = slurp(fifo);
		_exit(s && strstr(s, "\niteration,microbatch,layer,rank,factor\n") ? 0 : 1);
	}
	kt_run r = RUN("simulate", tiny, "--iters", "2", "--emit-loads", fifo);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	int st;
	cr_assert_eq(waitpid(reader, &st, 0), reader);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the reader did not get a trace");
	cr_assert_eq(lstat(fifo, &after), 0);
	cr_assert(S_ISFIFO(after.st_mode), "the FIFO was replaced");
	/* A symlink: its target is written. */
	const char *sym = in_dir(&d, "link.json"), *real = in_dir(&d, "real.json");
	cr_assert_eq(symlink("real.json", sym), 0);
	r = RUN("simulate", tiny, "--policy", "kiln", "--iters", "2", "--emit-trace", sym);
	cr_assert_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	cr_assert_eq(lstat(sym, &after), 0);
	cr_assert(S_ISLNK(after.st_mode), "the link was replaced");
	cr_assert_eq(stat(real, &after), 0);
	cr_assert(S_ISREG(after.st_mode) && after.st_size > 0);
	cr_assert_eq(temps_in(&d), 0);
	dir_free(&d);
}

/* Standard output that cannot be written is an error with its reason. */
Test(cli_output, a_full_stdout_gives_the_reason)
{
	if (access("/dev/full", W_OK) != 0)
		cr_skip_test("no /dev/full");
	const char *tiny = kt_src("examples/models/tiny.yaml");
	const char *const cases[][4] = {{"compile", tiny, "--json", NULL},
	                                {"report", tiny, "--json", NULL},
	                                {"check", tiny, NULL}};
	for (size_t i = 0; i < 3; i++) {
		kt_run r = kt_kilnc(cases[i], "/dev/full");
		cr_assert_eq(r.status, 1, "%s: %d", cases[i][0], r.status);
		cr_assert_not_null(strstr(r.err, "No space left on device"), "%s: %s", cases[i][0],
		                   r.err);
		cr_assert_null(strstr(r.err, "out of memory"), "%s", r.err);
		kt_run_free(&r);
	}
}

/* SIGINT while compile writes its views: the blob and the MLIR already sit
 * in temporary files when the trace view blocks opening a FIFO nobody
 * reads; the interrupt removes them and kilnc exits 130. */
/* A command whose stdout fails leaves its files as they were: they go into
 * place only after stdout is written. */
Test(cli_output, a_full_stdout_leaves_the_files_untouched)
{
	if (access("/dev/full", W_OK) != 0)
		cr_skip_test("no /dev/full");
	tdir d = dir_new();
	char blob[320], loads[320], trace[320];
	snprintf(blob, sizeof blob, "%s", in_dir(&d, "x.kiln"));
	snprintf(loads, sizeof loads, "%s", in_dir(&d, "el.csv"));
	snprintf(trace, sizeof trace, "%s", in_dir(&d, "tr.json"));
	put(blob, "old\n");
	put(loads, "old\n");
	put(trace, "old\n");
	const char *tiny = kt_src("examples/models/tiny.yaml");
	const char *const compile[] = {"compile", tiny, "-o", blob, NULL};
	const char *const simulate[] = {
	    "simulate",     tiny,  "--policy",     "kiln", "--iters", "2",
	    "--emit-loads", loads, "--emit-trace", trace,  NULL};
	const char *const *cases[] = {compile, simulate};
	for (size_t i = 0; i < 2; i++) {
		kt_run r = kt_kilnc(cases[i], "/dev/full");
		cr_assert_eq(r.status, 1, "%s: %d", cases[i][0], r.status);
		cr_assert_not_null(strstr(r.err, "No space left on device"), "%s", r.err);
		kt_run_free(&r);
	}
	cr_assert(same_text(blob, "old\n"), "the blob was replaced although stdout failed");
	cr_assert(same_text(loads, "old\n"), "--emit-loads was replaced although stdout failed");
	cr_assert(same_text(trace, "old\n"), "--emit-trace was replaced although stdout failed");
	cr_assert_eq(temps_in(&d), 0);
	dir_free(&d);
}

Test(cli_output, an_interrupted_compile_leaves_no_temporary_file)
{
	tdir d = dir_new();
	const char *blob = in_dir(&d, "p.kiln"), *mlir = in_dir(&d, "p.mlir"),
	           *fifo = in_dir(&d, "trace.json");
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 1);
		/* exec keeps an ignored SIGINT ignored (a run started in the
		 * background has it so); this test is of kilnc's handler. */
		signal(SIGINT, SIG_DFL);
		execl(KILN_KILNC, KILN_KILNC, "compile", kt_src("examples/models/tiny.yaml"), "-o",
		      blob, "--emit-mlir", mlir, "--emit-trace", fifo, (char *)NULL);
		_exit(127);
	}
	/* Up to 60 s (the sanitizer build is slow) for both temporary files. */
	int seen = 0;
	for (int t = 0; t < 6000 && seen < 2; t++) {
		seen = temps_in(&d);
		if (seen < 2)
			usleep(10000);
	}
	cr_assert_eq(seen, 2, "the compile never wrote its temporary files");
	cr_assert_eq(kill(pid, SIGINT), 0);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGINT, "status %d",
	          WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
	cr_assert_eq(temps_in(&d), 0, "temporary files left after the interrupt");
	cr_assert_neq(access(blob, F_OK), 0);
	cr_assert_neq(access(mlir, F_OK), 0);
	dir_free(&d);
}

/* A file-size limit and a reader that leaves are failed writes with their
 * reason (not a SIGXFSZ or SIGPIPE death that leaves temporary files), and
 * nothing goes into place. */
Test(cli_output, a_size_limit_or_a_departed_reader_is_a_failed_write)
{
	tdir d = dir_new();
	const char *tiny = kt_src("examples/models/tiny.yaml");
	char *out;
	int st = kt_sh(&out, "ulimit -f 100; %s compile %s -o %s --emit-mlir %s", KILN_KILNC, tiny,
	               in_dir(&d, "p.kiln"), in_dir(&d, "x.mlir"));
	cr_expect_eq(st, 1, "%s", out);
	cr_expect_not_null(strstr(out, "File too large"), "%s", out);
	free(out);
	cr_expect_eq(temps_in(&d), 0, "temporary files left");
	cr_expect_neq(access(in_dir(&d, "p.kiln"), F_OK), 0);
	/* tiny's MLIR (megabytes) outgrows the pipe's buffer long before the
	 * reader's 10 bytes are read, so the writer surely meets a closed pipe. */
	const char *fifo = in_dir(&d, "f.mlir");
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	st = kt_sh(&out, "(head -c 10 %s > /dev/null &); %s compile %s -o %s --emit-mlir %s", fifo,
	           KILN_KILNC, tiny, in_dir(&d, "q.kiln"), fifo);
	cr_expect_eq(st, 1, "%s", out);
	cr_expect_not_null(strstr(out, "cannot write"), "%s", out);
	cr_expect_not_null(strstr(out, "Broken pipe"), "%s", out);
	free(out);
	cr_expect_eq(temps_in(&d), 0, "temporary files left");
	cr_expect_neq(access(in_dir(&d, "q.kiln"), F_OK), 0);
	dir_free(&d);
}

/* A pipe reached through /dev/stdout is written in place; standard output
 * redirected to one of the outputs is refused. */
Test(cli_output, stdout_pipes_and_stdout_files)
{
	tdir d = dir_new();
	const char *tiny = kt_src("examples/models/tiny.yaml");
	char *out;
	int st =
	    kt_sh(&out, "%s compile %s --emit-trace /dev/stdout 2>/dev/null | head -c 15", KILN_KILNC, tiny);
	cr_expect_eq(st, 0, "%s", out);
	cr_expect(strncmp(out, "{", 1) == 0, "not the trace: %s", out);
	free(out);
	const char *both = in_dir(&d, "out.txt");
	const char *argv[] = {"compile", tiny, "--json", "--emit-svg", both, NULL};
	kt_run r = kt_kilnc(argv, both);
	cr_expect_eq(r.status, 2, "%s", r.err);
	cr_expect_not_null(strstr(r.err, "the standard output"), "%s", r.err);
	kt_run_free(&r);
	dir_free(&d);
}

/* Commands that write only stdout refuse it too when it is redirected onto
 * what they read: `report --json >> m.yaml` would append JSON to the model,
 * `inspect --json >> p.kiln` would break the blob's checksum. */
Test(cli_output, stdout_appended_to_an_input)
{
	tdir d = dir_new();
	const char *m = in_dir(&d, "m.yaml");
	char *out;
	int st = kt_sh(&out, "cp %s %s", kt_src("examples/models/tiny.yaml"), m);
	cr_assert_eq(st, 0, "%s", out);
	free(out);
	struct stat model_before, model_after;
	cr_assert_eq(stat(m, &model_before), 0);
	const char *cmds[] = {"check", "report --json", NULL};
	for (int i = 0; cmds[i]; i++) {
		st = kt_sh(&out, "{ %s %s %s >> %s; }", KILN_KILNC, cmds[i], m, m);
		cr_expect_eq(st, 2, "%s: %s", cmds[i], out);
		cr_expect(strstr(out, "the standard output") && strstr(out, "is the input MODEL"),
		          "%s: %s", cmds[i], out);
		free(out);
	}
	const char *plan = in_dir(&d, "p.kiln");
	st = kt_sh(&out, "%s compile %s -o %s", KILN_KILNC, m, plan);
	cr_assert_eq(st, 0, "%s", out);
	free(out);
	struct stat before, after;
	cr_assert_eq(stat(plan, &before), 0);
	const char *bcmds[] = {"inspect --json",
	                       "select --stage 0 --layer 0 --free 1G --load-factor 1", NULL};
	for (int i = 0; bcmds[i]; i++) {
		const char *sp = strchr(bcmds[i], ' ');
		st = kt_sh(&out, "{ %s %.*s %s%s >> %s; }", KILN_KILNC, (int)(sp - bcmds[i]),
		           bcmds[i], plan, sp, plan);
		cr_expect_eq(st, 2, "%s: %s", bcmds[i], out);
		cr_expect(strstr(out, "is the input PLAN"), "%s: %s", bcmds[i], out);
		free(out);
	}
	cr_assert_eq(stat(plan, &after), 0);
	cr_expect_eq(after.st_size, before.st_size, "the blob grew");
	cr_assert_eq(stat(m, &model_after), 0);
	cr_expect_eq(model_after.st_size, model_before.st_size, "the model grew");
	dir_free(&d);
}

/* Root replacing a file keeps its owner; a name near NAME_MAX still gets a
 * temporary file beside it. */
Test(cli_output, owners_and_long_names)
{
	tdir d = dir_new();
	const char *tiny = kt_src("examples/models/tiny.yaml");
	char name[256];
	memset(name, 'n', 250);
	strcpy(name + 250, ".svg"); /* 254 bytes: the ".tmp.XXXXXX" suffix would not fit */
	kt_run r = RUN("compile", tiny, "--emit-svg", in_dir(&d, name));
	cr_expect_eq(r.status, 0, "%s", r.err);
	kt_run_free(&r);
	struct stat st;
	cr_expect_eq(stat(in_dir(&d, name), &st), 0);
	cr_expect_eq(temps_in(&d), 0);
	if (geteuid() == 0) {
		const char *own = in_dir(&d, "own.svg");
		put(own, "old\n");
		cr_assert_eq(chown(own, 65534, 65534), 0);
		r = RUN("compile", tiny, "--emit-svg", own);
		cr_expect_eq(r.status, 0, "%s", r.err);
		kt_run_free(&r);
		cr_assert_eq(stat(own, &st), 0);
		cr_expect(st.st_uid == 65534 && st.st_gid == 65534, "owner %d:%d", (int)st.st_uid,
		          (int)st.st_gid);
	}
	dir_free(&d);
}

/* simulate's two outputs go into place together, only when the whole run
 * succeeded: a bad --plan or an unwritable --emit-trace leaves the
 * --emit-loads file as it was. */
Test(cli_output, simulate_outputs_are_all_or_none)
{
	tdir d = dir_new();
	const char *tiny = kt_src("examples/models/tiny.yaml");
	const char *loads = in_dir(&d, "l.csv"), *bad = in_dir(&d, "bad.kiln");
	put(loads, "old\n");
	put(bad, "not a blob\n");
	kt_run r = RUN("simulate", tiny, "--policy", "kiln", "--iters", "2", "--plan", bad,
	               "--emit-loads", loads);
	cr_expect_eq(r.status, 1, "%s", r.err);
	kt_run_free(&r);
	cr_expect(same_text(loads, "old\n"), "--emit-loads was written before --plan was read");
	r = RUN("simulate", tiny, "--policy", "kiln", "--iters", "2", "--emit-loads", loads,
	        "--emit-trace", in_dir(&d, "no/such/t.json"));
	cr_expect_eq(r.status, 1, "%s", r.err);
	kt_run_free(&r);
	cr_expect(same_text(loads, "old\n"),
	          "--emit-loads went into place though the trace failed");
	cr_expect_eq(temps_in(&d), 0);
	dir_free(&d);
}
