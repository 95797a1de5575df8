/* frontend/diag.c: collecting, sorting and printing diagnostics. */
#include <stdlib.h>
#include <string.h>

#include "frontend/internal.h"

#define DIAG_MSG_BYTES 512

void kiln_fe_ctx_init(kiln_fe_ctx *c, kiln_arena *a, const char *file)
{
	memset(c, 0, sizeof(*c));
	c->a = a;
	c->file = file;
	c->file_index = 0;
	c->n_files = 1;
}

void kiln_fe_ctx_enter(kiln_fe_ctx *c, const char *file, const char **out_file, int *out_index)
{
	*out_file = c->file;
	*out_index = c->file_index;
	c->file = file;
	c->file_index = c->n_files++;
}

void kiln_fe_ctx_restore(kiln_fe_ctx *c, const char *file, int index)
{
	c->file = file;
	c->file_index = index;
}

void kiln_fe_oom(kiln_fe_ctx *c)
{
	c->nomem = true;
}

/* Orders by file, then position, then report order. */
static int diag_before(const kiln_fe_diag *x, const kiln_fe_diag *y)
{
	if (x->file_index != y->file_index)
		return x->file_index < y->file_index;
	if (x->line != y->line)
		return x->line < y->line;
	if (x->col != y->col)
		return x->col < y->col;
	return x->seq < y->seq;
}

static int diag_cmp(const void *p, const void *q)
{
	const kiln_fe_diag *x = *(const kiln_fe_diag *const *)p;
	const kiln_fe_diag *y = *(const kiln_fe_diag *const *)q;
	if (diag_before(x, y))
		return -1;
	return diag_before(y, x) ? 1 : 0;
}

kiln_fe_diag *kiln_fe_error(kiln_fe_ctx *c, int line, int col, const char *fmt, ...)
{
	c->n_errors++;
	kiln_fe_diag probe = {
	    .file_index = c->file_index, .line = line, .col = col, .seq = c->seq++};
	size_t slot = c->n_kept;
	if (c->n_kept == KILN_FRONTEND_MAX_ERRORS) {
		/* Keep the earliest: replace the latest kept one if this is earlier. */
		size_t last = 0;
		for (size_t i = 1; i < c->n_kept; i++)
			if (diag_before(c->kept[last], c->kept[i]))
				last = i;
		if (!diag_before(&probe, c->kept[last]))
			return NULL;
		slot = last;
	}
	char buf[DIAG_MSG_BYTES];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	kiln_fe_diag *d = kiln_arena_alloc(c->a, sizeof(*d));
	char *msg = kiln_arena_strdup(c->a, buf);
	if (!d || !msg) {
		kiln_fe_oom(c);
		return NULL;
	}
	*d = probe;
	d->file = c->file;
	d->msg = msg;
	d->notes_tail = &d->notes;
	c->kept[slot] = d;
	if (slot == c->n_kept)
		c->n_kept++;
	return d;
}

void kiln_fe_note_at(kiln_fe_ctx *c, kiln_fe_diag *d, int line, int col, const char *fmt, ...)
{
	if (!d)
		return;
	char buf[DIAG_MSG_BYTES];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	kiln_fe_note *n = kiln_arena_alloc(c->a, sizeof(*n));
	char *msg = kiln_arena_strdup(c->a, buf);
	if (!n || !msg) {
		kiln_fe_oom(c);
		return;
	}
	n->file = c->file;
	n->line = line;
	n->col = col;
	n->msg = msg;
	*d->notes_tail = n;
	d->notes_tail = &n->next;
}

static void print_line(FILE *out, const char *file, int line, int col, const char *kind,
                       const char *msg)
{
	/* The file name may come from the description (hardware: PATH). */
	kiln_text_put(out, file, strlen(file));
	if (line > 0)
		fprintf(out, ":%d:%d: %s: %s\n", line, col, kind, msg);
	else
		fprintf(out, ": %s: %s\n", kind, msg);
}

int kiln_fe_ctx_finish(kiln_fe_ctx *c, FILE *diag)
{
	qsort(c->kept, c->n_kept, sizeof(c->kept[0]), diag_cmp);
	if (diag) {
		for (size_t i = 0; i < c->n_kept; i++) {
			const kiln_fe_diag *d = c->kept[i];
			print_line(diag, d->file, d->line, d->col, "error", d->msg);
			for (const kiln_fe_note *n = d->notes; n; n = n->next)
				print_line(diag, n->file, n->line, n->col, "note", n->msg);
		}
		if (c->n_errors > c->n_kept && !c->nomem && c->n_kept > 0) {
			char msg[96];
			snprintf(msg, sizeof msg,
			         "too many errors (%llu); only the first %d are shown",
			         (unsigned long long)c->n_errors, KILN_FRONTEND_MAX_ERRORS);
			print_line(diag, c->kept[0]->file, 0, 0, "error", msg);
		}
		if (c->nomem)
			print_line(diag, c->file ? c->file : "kiln", 0, 0, "error",
			           "out of memory");
	}
	if (c->nomem)
		return KILN_FRONTEND_NOMEM;
	return c->n_errors ? KILN_FRONTEND_INVALID : KILN_FRONTEND_OK;
}

const char *kiln_fe_show(kiln_fe_ctx *c, const char *s, size_t len)
{
	enum { SHOW_MAX = 64 };
	char buf[SHOW_MAX + 3];
	buf[0] = '\'';
	kiln_text_escape(s, len, SHOW_MAX + 1, buf + 1);
	strcat(buf, "'");
	char *r = kiln_arena_strdup(c->a, buf);
	if (!r) {
		kiln_fe_oom(c);
		return "'...'";
	}
	return r;
}
