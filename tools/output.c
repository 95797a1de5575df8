/* tools/output.c: the one output rule (tools/output.h, docs/cli.md "Output
 * files").
 *
 * Writes go through a stdio stream over our own write function
 * (fopencookie), so the first failed write(2) is remembered with its errno
 * and reported once at the end, whatever stdio did in between.
 */
#define _GNU_SOURCE
#include "tools/output.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Temporary files open at once, over all outputs of a process. */
#define KILN_OUT_MAX_OPEN 16
/* Symlinks followed while resolving a name that does not exist yet. */
#define KILN_OUT_MAX_LINKS 40

struct kiln_out {
	const char *prog, *path; /* borrowed */
	char *target;            /* the file the bytes end up in (symlinks resolved) */
	char *tmp;               /* the temporary file, or NULL when written directly */
	int fd;
	FILE *f;
	int err;     /* errno of the first failed call, 0 while all is well */
	int slot;    /* in g_tmp, or -1 */
	bool failed; /* reported; only discard is left */
};

/* ---------------------------------------------------------------- names */

/* The canonical name of path: realpath of the file, or, when it does not
 * exist, of its directory plus its base name, a dangling symlink followed
 * to where its target would be. malloc'd, or NULL with errno set. */
static char *canonical(const char *path, int links)
{
	char *r = realpath(path, NULL);
	if (r)
		return r;
	int saved = errno;
	struct stat lst;
	if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
		if (links >= KILN_OUT_MAX_LINKS) {
			errno = ELOOP;
			return NULL;
		}
		char link[PATH_MAX];
		ssize_t len = readlink(path, link, sizeof link - 1);
		if (len <= 0)
			return NULL;
		link[len] = '\0';
		const char *slash = strrchr(path, '/');
		char *next;
		if (link[0] == '/' || !slash) {
			next = strdup(link);
		} else {
			size_t n = (size_t)(slash - path) + 1 + strlen(link) + 1;
			next = malloc(n);
			if (next)
				snprintf(next, n, "%.*s/%s", (int)(slash - path), path, link);
		}
		if (!next)
			return NULL;
		char *out = canonical(next, links + 1);
		free(next);
		return out;
	}
	if (saved != ENOENT) {
		errno = saved;
		return NULL;
	}
	const char *slash = strrchr(path, '/');
	const char *base = slash ? slash + 1 : path;
	if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
		errno = EISDIR;
		return NULL;
	}
	char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
	char *rdir = dir ? realpath(dir, NULL) : NULL;
	free(dir);
	if (!rdir)
		return NULL;
	size_t n = strlen(rdir) + strlen(base) + 2;
	char *out = malloc(n);
	if (out)
		snprintf(out, n, "%s%s%s", rdir, strcmp(rdir, "/") ? "/" : "", base);
	free(rdir);
	return out;
}

typedef struct ident {
	bool exists;
	dev_t dev;
	ino_t ino;
	char *canon; /* malloc'd, or NULL when it cannot be resolved */
} ident;

static ident identify(const char *path)
{
	ident id = {0};
	struct stat st;
	if (stat(path, &st) == 0) {
		id.exists = true;
		id.dev = st.st_dev;
		id.ino = st.st_ino;
	}
	id.canon = canonical(path, 0);
	return id;
}

static bool same_file(const ident *a, const ident *b)
{
	if (a->exists && b->exists)
		return a->dev == b->dev && a->ino == b->ino;
	return a->canon && b->canon && strcmp(a->canon, b->canon) == 0;
}

int kiln_out_check(const char *prog, const kiln_out_name *inputs, size_t n_in,
                   const kiln_out_name *outputs, size_t n_out, FILE *err)
{
	ident *in = calloc(n_in + 1, sizeof *in), *out = calloc(n_out + 1, sizeof *out);
	int rc = 0;
	if (!in || !out) {
		fprintf(err, "%s: error: out of memory\n", prog);
		rc = -1;
		goto done;
	}
	for (size_t i = 0; i < n_in; i++)
		if (inputs[i].path)
			in[i] = identify(inputs[i].path);
	for (size_t j = 0; j < n_out; j++)
		if (outputs[j].path)
			out[j] = identify(outputs[j].path);
	for (size_t j = 0; j < n_out && rc == 0; j++) {
		if (!outputs[j].path)
			continue;
		for (size_t i = 0; i < n_in && rc == 0; i++)
			if (inputs[i].path && same_file(&out[j], &in[i])) {
				fprintf(
				    err,
				    "%s: error: %s %s is the input %s %s: writing it would destroy "
				    "the input; choose another output\n",
				    prog, outputs[j].what, outputs[j].path, inputs[i].what,
				    inputs[i].path);
				rc = -1;
			}
		for (size_t k = j + 1; k < n_out && rc == 0; k++)
			if (outputs[k].path && same_file(&out[j], &out[k])) {
				fprintf(err,
				        "%s: error: %s %s and %s %s are the same file; give each "
				        "output "
				        "its own\n",
				        prog, outputs[j].what, outputs[j].path, outputs[k].what,
				        outputs[k].path);
				rc = -1;
			}
	}
done:
	for (size_t i = 0; in && i < n_in; i++)
		free(in[i].canon);
	for (size_t j = 0; out && j < n_out; j++)
		free(out[j].canon);
	free(in);
	free(out);
	return rc;
}

/* ---------------------------------------------------------------- signals */

/* The temporary files still open, for the signal handler and exit. A slot
 * is published only once its string is complete and cleared before the
 * string is freed; lock-free atomics are async-signal-safe. */
static _Atomic(const char *) g_tmp[KILN_OUT_MAX_OPEN];
/* The first four end the process with 128 + the signal (docs/cli.md); the
 * others, fatal by default, are raised again with their default action once
 * the temporary files are gone, so the status is the signal's. SIGABRT
 * covers abort(), as from an allocation failure inside MLIR. */
static const int g_signals[] = {SIGINT,  SIGTERM, SIGHUP,    SIGQUIT, SIGUSR1, SIGUSR2,
                                SIGALRM, SIGXCPU, SIGVTALRM, SIGPROF, SIGABRT};
#define N_EXIT_SIGNALS 4
#define N_SIGNALS ((int)(sizeof g_signals / sizeof *g_signals))
static struct sigaction g_old[N_SIGNALS];
static bool g_installed[N_SIGNALS];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void remove_temps(void)
{
	for (int i = 0; i < KILN_OUT_MAX_OPEN; i++) {
		const char *p = atomic_exchange(&g_tmp[i], NULL);
		if (p)
			unlink(p);
	}
}

static void on_signal(int sig)
{
	remove_temps();
	for (int k = 0; k < N_SIGNALS; k++)
		if (g_signals[k] == sig && g_installed[k] && g_old[k].sa_handler != SIG_DFL &&
		    !(g_old[k].sa_flags & SA_SIGINFO)) {
			/* The program's own handler runs after the clean-up. */
			g_old[k].sa_handler(sig);
			return;
		}
	for (int k = 0; k < N_EXIT_SIGNALS; k++)
		if (g_signals[k] == sig)
			_exit(128 + sig);
	/* Delivered with the default action once the handler returns. */
	signal(sig, SIG_DFL);
	raise(sig);
}

static void install(void)
{
	for (int k = 0; k < N_SIGNALS; k++) {
		struct sigaction old;
		if (sigaction(g_signals[k], NULL, &old) != 0 || old.sa_handler == SIG_IGN)
			continue; /* ignored (nohup): stay ignored */
		g_old[k] = old;
		struct sigaction sa = {.sa_handler = on_signal};
		sigemptyset(&sa.sa_mask);
		for (int j = 0; j < N_SIGNALS; j++)
			sigaddset(&sa.sa_mask, g_signals[j]);
		g_installed[k] = sigaction(g_signals[k], &sa, NULL) == 0;
	}
	/* A reader that goes away (a FIFO, a pipe) and a file-size limit end a
	 * write with EPIPE and EFBIG, reported with the file's name, instead of
	 * killing the process with temporary files left behind. */
	signal(SIGPIPE, SIG_IGN);
	signal(SIGXFSZ, SIG_IGN);
	atexit(remove_temps);
}

/* A mkstemp template beside target: target + suffix, or, for a name near
 * the limit, hidden in target's directory. malloc'd, or NULL. */
static char *beside(const char *target, const char *suffix, const char *hidden)
{
	size_t n = strlen(target), ns = strlen(suffix), nh = strlen(hidden);
	const char *slash = strrchr(target, '/');
	size_t base = slash ? n - (size_t)(slash - target) - 1 : n;
	char *t = malloc(n + (ns > nh ? ns : nh) + 1);
	if (!t)
		return NULL;
	memcpy(t, target, n);
	if (base + ns <= NAME_MAX)
		memcpy(t + n, suffix, ns + 1);
	else
		memcpy(t + (n - base), hidden, nh + 1);
	return t;
}

/* Blocks the handled signals into saved, so that a run of renames is not
 * cut in the middle. */
static void block_signals(sigset_t *saved)
{
	sigset_t block;
	sigemptyset(&block);
	for (int k = 0; k < N_SIGNALS; k++)
		sigaddset(&block, g_signals[k]);
	pthread_sigmask(SIG_BLOCK, &block, saved);
}

/* Creates the temporary file for o->target and publishes it. Signals are
 * blocked meanwhile, so no interrupt can leave it behind. Returns the fd, or
 * -1 with errno set. */
static int make_temp(kiln_out *o)
{
	o->tmp = beside(o->target, ".tmp.XXXXXX", ".kiln.tmp.XXXXXX");
	if (!o->tmp)
		return -1;
	sigset_t saved;
	block_signals(&saved);
	int slot = -1;
	for (int i = 0; i < KILN_OUT_MAX_OPEN && slot < 0; i++) {
		const char *expect = NULL;
		if (atomic_compare_exchange_strong(&g_tmp[i], &expect, o->tmp))
			slot = i;
	}
	int fd = -1, e = EMFILE;
	if (slot >= 0) {
		fd = mkstemp(o->tmp);
		e = errno;
		if (fd < 0)
			atomic_store(&g_tmp[slot], NULL);
	}
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	if (fd < 0) {
		free(o->tmp);
		o->tmp = NULL;
		errno = e;
		return -1;
	}
	o->slot = slot;
	return fd;
}

static void forget_temp(kiln_out *o)
{
	if (o->slot >= 0)
		atomic_store(&g_tmp[o->slot], NULL);
	o->slot = -1;
}

/* ---------------------------------------------------------------- writing */

static ssize_t cookie_write(void *cookie, const char *buf, size_t n)
{
	kiln_out *o = cookie;
	if (o->err)
		return 0; /* already failed: the first reason is the one reported */
	size_t done = 0;
	while (done < n) {
		ssize_t k = write(o->fd, buf + done, n - done);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			o->err = k < 0 ? errno : EIO;
			break;
		}
		done += (size_t)k;
	}
	return (ssize_t)done;
}

static int cookie_close(void *cookie)
{
	kiln_out *o = cookie;
	int rc = close(o->fd);
	if (rc != 0 && !o->err && errno != EINTR)
		o->err = errno;
	o->fd = -1;
	return rc;
}

static void report(const kiln_out *o, FILE *err, int e)
{
	fprintf(err, "%s: error: cannot write %s: %s\n", o->prog, o->path, strerror(e));
}

kiln_out *kiln_out_open(const char *prog, const char *path, FILE *err)
{
	kiln_out *o = calloc(1, sizeof *o);
	if (!o) {
		fprintf(err, "%s: error: cannot write %s: %s\n", prog, path, strerror(ENOMEM));
		return NULL;
	}
	*o = (kiln_out){.prog = prog, .path = path, .fd = -1, .slot = -1};
	pthread_once(&g_once, install);
	/* A device or FIFO is written where the path leads, resolved or not:
	 * /dev/stdout and /dev/fd/N name pipes realpath cannot resolve. */
	struct stat st;
	bool special = stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
	o->target = special ? strdup(path) : canonical(path, 0);
	if (!o->target) {
		report(o, err, errno);
		free(o);
		return NULL;
	}
	bool exists = stat(o->target, &st) == 0, temp_failed = false;
	const char *refuse = NULL;
	if (exists && S_ISDIR(st.st_mode))
		refuse = "it is a directory";
	else if (exists && S_ISBLK(st.st_mode))
		refuse =
		    "it is a block device (kiln writes regular files, character devices and FIFOs)";
	else if (exists && S_ISSOCK(st.st_mode))
		refuse = "it is a socket";
	if (refuse) {
		fprintf(err, "%s: error: cannot write %s: %s\n", prog, path, refuse);
		free(o->target);
		free(o);
		return NULL;
	}
	if (exists && !S_ISREG(st.st_mode)) {
		/* A device or FIFO: written in place, never replaced. */
		o->fd = open(o->target, O_WRONLY | O_NOCTTY | O_CLOEXEC);
	} else if (exists && access(o->target, W_OK) != 0) {
		/* The file's own permission says no, even where its directory would
		 * let us replace it. */
		o->fd = -1;
	} else {
		o->fd = make_temp(o);
		temp_failed = o->fd < 0;
		if (o->fd >= 0) {
			/* mkstemp makes the file 0600: give it the existing file's mode,
			 * or what a plain creat would. */
			mode_t mask = umask(0);
			umask(mask);
			/* Root replacing someone's file gives it back to them. */
			if ((exists && geteuid() == 0 &&
			     fchown(o->fd, st.st_uid, st.st_gid) != 0) ||
			    fchmod(o->fd, exists ? st.st_mode & 07777 : 0666 & ~mask) != 0) {
				int e = errno;
				close(o->fd);
				o->fd = -1;
				unlink(o->tmp);
				forget_temp(o);
				errno = e;
			}
		}
	}
	if (o->fd >= 0) {
		cookie_io_functions_t io = {.write = cookie_write, .close = cookie_close};
		o->f = fopencookie(o, "w", io);
		if (o->f)
			setvbuf(o->f, NULL, _IOFBF, 1 << 16);
		else
			close(o->fd);
	}
	if (!o->f) {
		if (temp_failed && errno != EMFILE) {
			/* The target itself may well be writable (/proc/version, as
			 * root): say which step failed, in which directory. */
			int e = errno;
			const char *slash = strrchr(o->target, '/');
			int dir_len =
			    slash ? (slash == o->target ? 1 : (int)(slash - o->target)) : 1;
			fprintf(
			    err,
			    "%s: error: cannot write %s: cannot create a temporary file in %.*s "
			    "(kiln writes one there and renames it over the target): %s\n",
			    prog, path, dir_len, slash ? o->target : ".", strerror(e));
		} else {
			report(o, err, errno);
		}
		if (o->tmp) {
			unlink(o->tmp);
			forget_temp(o);
		}
		free(o->tmp);
		free(o->target);
		free(o);
		return NULL;
	}
	return o;
}

FILE *kiln_out_stream(kiln_out *o)
{
	return o->f;
}

int kiln_out_finish(kiln_out *o, FILE *err)
{
	if (!o->f)
		return o->failed ? -1 : 0;
	if (fflush(o->f) != 0 && !o->err)
		o->err = errno ? errno : EIO;
	if (ferror(o->f) && !o->err)
		o->err = EIO;
	if (o->tmp && !o->err && fsync(o->fd) != 0)
		o->err = errno;
	fclose(o->f); /* cookie_close records a failed close */
	o->f = NULL;
	if (o->err) {
		report(o, err, o->err);
		o->failed = true;
		return -1;
	}
	return 0;
}

/* Makes a rename durable: fsync of the directory that holds target. */
static void sync_dir(const char *target)
{
	const char *slash = strrchr(target, '/');
	if (!slash)
		return;
	char *dir = strndup(target, (size_t)(slash - target) + (slash == target));
	int fd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	if (fd >= 0) {
		(void)fsync(fd);
		close(fd);
	}
	free(dir);
}

int kiln_out_commit(kiln_out *o, FILE *err)
{
	int rc = kiln_out_finish(o, err);
	if (rc == 0 && o->tmp) {
		if (rename(o->tmp, o->target) != 0) {
			report(o, err, errno);
			rc = -1;
		} else {
			forget_temp(o);
			sync_dir(o->target);
		}
	}
	kiln_out_discard(o);
	return rc;
}

void kiln_out_discard(kiln_out *o)
{
	if (!o)
		return;
	if (o->f)
		fclose(o->f);
	if (o->tmp && o->slot >= 0) {
		unlink(o->tmp);
		forget_temp(o);
	}
	free(o->tmp);
	free(o->target);
	free(o);
}

/* A second name for the existing file target, beside it, so that a commit
 * cut short can put it back. Returns the malloc'd name, or NULL with errno
 * set (target missing: ENOENT). */
static char *backup(const char *target)
{
	for (int tries = 0; tries < 8; tries++) {
		char *name = beside(target, ".bak.XXXXXX", ".kiln.bak.XXXXXX");
		if (!name)
			return NULL;
		int fd = mkstemp(name);
		if (fd < 0) {
			free(name);
			return NULL;
		}
		close(fd);
		unlink(name);
		if (link(target, name) == 0)
			return name;
		int e = errno;
		free(name);
		if (e != EEXIST) {
			errno = e;
			return NULL;
		}
	}
	errno = EEXIST;
	return NULL;
}

int kiln_out_commit_all(kiln_out **v, size_t n, FILE *err)
{
	int rc = 0;
	for (size_t i = 0; i < n; i++)
		if (kiln_out_finish(v[i], err) != 0)
			rc = -1;
	char **bak = rc == 0 ? calloc(n + 1, sizeof *bak) : NULL;
	bool *existed = rc == 0 ? calloc(n + 1, sizeof *existed) : NULL;
	if (rc == 0 && (!bak || !existed)) {
		fprintf(err, "%s: error: out of memory\n", n ? v[0]->prog : "kiln");
		rc = -1;
	}
	sigset_t saved;
	block_signals(&saved);
	size_t done = 0;
	if (rc == 0) {
		for (size_t i = 0; i < n; i++) {
			struct stat st;
			existed[i] = v[i]->tmp && stat(v[i]->target, &st) == 0;
			if (existed[i])
				bak[i] = backup(v[i]->target);
		}
		for (; done < n; done++) {
			kiln_out *o = v[done];
			if (!o->tmp)
				continue;
			if (rename(o->tmp, o->target) != 0) {
				report(o, err, errno);
				rc = -1;
				break;
			}
			forget_temp(o);
		}
	}
	/* On a failure, the outputs already renamed get their old content back:
	 * all or none holds to the end. */
	for (size_t i = 0; bak && existed && i < n; i++) {
		kiln_out *o = v[i];
		bool renamed = i < done && o->tmp;
		if (renamed && rc != 0 &&
		    (existed[i] ? !bak[i] || rename(bak[i], o->target) != 0
		                : unlink(o->target) != 0)) {
			if (bak[i])
				fprintf(err,
				        "%s: error: %s was replaced before the failure; its old "
				        "content is in %s\n",
				        o->prog, o->path, bak[i]);
			else
				fprintf(err,
				        "%s: error: %s was replaced before the failure and cannot "
				        "be restored\n",
				        o->prog, o->path);
			continue; /* the backup stays */
		}
		if (renamed && (rc == 0 || !existed[i] || !bak[i]))
			sync_dir(o->target);
		if (bak[i] && (rc == 0 || !renamed))
			unlink(bak[i]);
		else if (renamed)
			sync_dir(o->target); /* the backup went back into place */
	}
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	for (size_t i = 0; i < n; i++) {
		if (bak)
			free(bak[i]);
		kiln_out_discard(v[i]);
		v[i] = NULL;
	}
	free(bak);
	free(existed);
	return rc;
}

kiln_out *kiln_out_stage(const char *prog, const char *path, int (*fill)(FILE *f, void *ctx),
                         void *ctx, FILE *err)
{
	kiln_out *o = kiln_out_open(prog, path, err);
	if (o && fill(o->f, ctx) != 0) {
		/* fill reported what it could not produce; a failed write is
		 * reported here, with its reason. */
		kiln_out_finish(o, err);
		kiln_out_discard(o);
		o = NULL;
	}
	return o;
}

int kiln_out_write(const char *prog, const char *path, int (*fill)(FILE *f, void *ctx), void *ctx,
                   FILE *err)
{
	kiln_out *o = kiln_out_stage(prog, path, fill, ctx, err);
	return o ? kiln_out_commit(o, err) : -1;
}

/* Standard output through the same checked write as the files. */
static kiln_out g_stdout = {.fd = STDOUT_FILENO, .slot = -1};

int kiln_out_stdout_init(void)
{
	cookie_io_functions_t io = {.write = cookie_write};
	FILE *f = fopencookie(&g_stdout, "w", io);
	if (!f || fflush(stdout) != 0)
		return -1;
	setvbuf(f, NULL, isatty(STDOUT_FILENO) ? _IOLBF : _IOFBF, 1 << 16);
	stdout = f;
	return 0;
}

int kiln_out_stdout_finish(const char *prog, FILE *err)
{
	errno = 0;
	int flushed = fflush(stdout) == 0 && !ferror(stdout);
	int e = g_stdout.err ? g_stdout.err : errno;
	if (flushed && !g_stdout.err)
		return 0;
	fprintf(err, "%s: error: writing the standard output: %s\n", prog, strerror(e ? e : EIO));
	return -1;
}

bool kiln_out_stdout_ok(void)
{
	return fflush(stdout) == 0 && !ferror(stdout) && !g_stdout.err;
}
