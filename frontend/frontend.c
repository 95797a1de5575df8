/* frontend/frontend.c: the entry points: bytes in, a validated model out. */
#include <string.h>

#include "frontend/internal.h"

/* Parses, validates, prints diagnostics; base_dir as for kiln_fe_model_build. */
static int load_text(kiln_fe_ctx *c, const char *path, const char *text, size_t len,
                     const char *base_dir, FILE *diag, kiln_model **out)
{
	kiln_model *m = NULL;
	kiln_fe_node *root = kiln_fe_parse_text(c, text, len);
	if (root)
		m = kiln_fe_model_build(c, root, path, base_dir);
	int rc = kiln_fe_ctx_finish(c, diag);
	if (rc == KILN_FRONTEND_OK && !m)
		rc = KILN_FRONTEND_INVALID; /* unreachable: no model without a report */
	if (rc == KILN_FRONTEND_OK)
		*out = m;
	return rc;
}

int kiln_frontend_load_buffer(const char *name, const char *text, size_t len, kiln_arena *a,
                              FILE *diag, kiln_model **out)
{
	*out = NULL;
	if (!name)
		name = "<buffer>";
	if (!a) {
		if (diag)
			fprintf(diag, "%s: error: out of memory\n", name);
		return KILN_FRONTEND_NOMEM;
	}
	kiln_fe_ctx c;
	kiln_fe_ctx_init(&c, a, name);
	if (!text)
		len = 0;
	return load_text(&c, name, text ? text : "", len, NULL, diag, out);
}

int kiln_frontend_load_file(const char *path, kiln_arena *a, FILE *diag, kiln_model **out)
{
	*out = NULL;
	if (!a) {
		if (diag)
			fprintf(diag, "%s: error: out of memory\n", path);
		return KILN_FRONTEND_NOMEM;
	}
	kiln_fe_ctx c;
	kiln_fe_ctx_init(&c, a, path);
	char *text;
	size_t len;
	if (!kiln_fe_read_file(&c, path, 0, 0, &text, &len))
		return kiln_fe_ctx_finish(&c, diag);
	const char *slash = strrchr(path, '/');
	char *dir = NULL;
	if (slash) {
		dir = kiln_arena_strndup(a, path, (size_t)(slash - path));
		if (!dir) {
			kiln_fe_oom(&c);
			return kiln_fe_ctx_finish(&c, diag);
		}
	}
	return load_text(&c, path, text, len, dir, diag, out);
}
