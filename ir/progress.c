/* ir/progress.c: a status line for long work (compile, simulate).
 *
 * A thread of the meter's own rewrites one line on a terminal every
 * KILN_PROGRESS_INTERVAL_MS, whatever the work is doing, so a single long
 * step (one MILP frontier, one simulated iteration of a million
 * micro-batches) cannot silence it. The work only counts: one relaxed
 * atomic add per call, from any thread. Lives beside the arena because
 * the compiler's passes, the solvers and the simulator all count into it
 * and ir/ is the one folder they all may include.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ir/ir.h"

struct kiln_progress {
	FILE *out;
	char what[64];
	pthread_t thread;
	pthread_mutex_t mu; /* guards the labels, the stop flag and writes to out */
	pthread_cond_t cv;
	int stop;
	int shown; /* a status line is on the screen (cleared before other lines) */
	struct timespec t0, phase_t0;
	char phase[64], unit[32], aux_label[32];
	_Atomic int64_t done, total, aux;
};

static double seconds_since(const struct timespec *t0)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - t0->tv_sec) + (double)(now.tv_nsec - t0->tv_nsec) * 1e-9;
}

static void clear_status(kiln_progress *p)
{
	if (p->shown) {
		fputs("\r\033[K", p->out);
		p->shown = 0;
	}
}

/* The status line; called with mu held. */
static void show(kiln_progress *p)
{
	int64_t done = atomic_load_explicit(&p->done, memory_order_relaxed);
	int64_t total = atomic_load_explicit(&p->total, memory_order_relaxed);
	int64_t aux = atomic_load_explicit(&p->aux, memory_order_relaxed);
	double el = seconds_since(&p->t0), ph = seconds_since(&p->phase_t0);
	fprintf(p->out, "\r%s:%s%s", p->what, p->phase[0] ? " " : "", p->phase);
	if (total > 0) {
		double frac = done < total ? (double)done / (double)total : 1.0;
		fprintf(p->out, " %lld of %lld %s (%.1f%%)", (long long)done, (long long)total,
		        p->unit, 100.0 * frac);
		/* The rate of this phase so far predicts the rest of it. */
		if (frac > 0.001 && frac < 1.0 && ph >= 2.0)
			fprintf(p->out, ", about %.0f s left", ceil(ph * (1.0 - frac) / frac));
	} else if (done > 0) {
		fprintf(p->out, " %lld %s", (long long)done, p->unit);
	}
	if (p->aux_label[0])
		fprintf(p->out, ", %lld %s", (long long)aux, p->aux_label);
	fprintf(p->out, ", %.0f s\033[K", el);
	fflush(p->out);
	p->shown = 1;
}

static void *ticker(void *arg)
{
	kiln_progress *p = arg;
	pthread_mutex_lock(&p->mu);
	while (!p->stop) {
		struct timespec until;
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += (long)KILN_PROGRESS_INTERVAL_MS * 1000000L;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
		while (!p->stop && pthread_cond_timedwait(&p->cv, &p->mu, &until) == 0)
			;
		if (!p->stop)
			show(p);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

kiln_progress *kiln_progress_start(FILE *out, const char *what)
{
	if (!out)
		return NULL;
	kiln_progress *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	p->out = out;
	snprintf(p->what, sizeof p->what, "%s", what ? what : "kilnc");
	clock_gettime(CLOCK_MONOTONIC, &p->t0);
	p->phase_t0 = p->t0;
	pthread_condattr_t ca;
	int ok = pthread_mutex_init(&p->mu, NULL) == 0;
	if (ok && pthread_condattr_init(&ca) == 0) {
		ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
		     pthread_cond_init(&p->cv, &ca) == 0;
		pthread_condattr_destroy(&ca);
		if (ok && pthread_create(&p->thread, NULL, ticker, p) != 0) {
			pthread_cond_destroy(&p->cv);
			ok = 0;
		}
	} else {
		ok = 0;
	}
	if (!ok) {
		/* No meter is no failure: the work runs without a status line. */
		free(p);
		return NULL;
	}
	return p;
}

void kiln_progress_phase(kiln_progress *p, const char *phase, const char *unit, int64_t total)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	snprintf(p->phase, sizeof p->phase, "%s", phase ? phase : "");
	snprintf(p->unit, sizeof p->unit, "%s", unit ? unit : "");
	p->aux_label[0] = '\0';
	atomic_store(&p->done, 0);
	atomic_store(&p->aux, 0);
	atomic_store(&p->total, total > 0 ? total : 0);
	clock_gettime(CLOCK_MONOTONIC, &p->phase_t0);
	pthread_mutex_unlock(&p->mu);
}

void kiln_progress_aux(kiln_progress *p, const char *label)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	snprintf(p->aux_label, sizeof p->aux_label, "%s", label ? label : "");
	pthread_mutex_unlock(&p->mu);
}

void kiln_progress_add(kiln_progress *p, int64_t n)
{
	if (p)
		atomic_fetch_add_explicit(&p->done, n, memory_order_relaxed);
}

void kiln_progress_add_aux(kiln_progress *p, int64_t n)
{
	if (p)
		atomic_fetch_add_explicit(&p->aux, n, memory_order_relaxed);
}

void kiln_progress_line(kiln_progress *p, const char *fmt, ...)
{
	if (!p)
		return;
	va_list ap;
	pthread_mutex_lock(&p->mu);
	clear_status(p);
	va_start(ap, fmt);
	vfprintf(p->out, fmt, ap);
	va_end(ap);
	fflush(p->out);
	pthread_mutex_unlock(&p->mu);
}

void kiln_progress_stop(kiln_progress *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->thread, NULL);
	clear_status(p);
	fflush(p->out);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p);
}
