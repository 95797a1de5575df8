/* frontend/schema.c: the key tables (frontend/schema.def), typed scalars,
 * unknown and duplicate keys, and did-you-mean suggestions. */
#include <ctype.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/internal.h"

typedef struct field_spec {
	const char *key;
	kiln_fe_section section;
	kiln_fe_type type;
	const char *values; /* ENUM: "a|b|c" */
} field_spec;

static const field_spec specs[KILN_FE_F_COUNT] = {
#define X(id, sec, key, type, values) {key, KILN_FE_S_##sec, KILN_FE_T_##type, values},
#include "frontend/schema.def"
#undef X
};

static const char *const section_names[KILN_FE_S_COUNT] = {"the top level", "model",    "model.mla",
                                                           "model.moe",     "training", "parallel",
                                                           "load",          "megatron", "hardware"};

const char *kiln_fe_field_key(kiln_fe_field_id id)
{
	return specs[id].key;
}

const char *kiln_fe_section_name(kiln_fe_section s)
{
	return section_names[s];
}

kiln_fe_section kiln_fe_field_section(kiln_fe_field_id id)
{
	return specs[id].section;
}

/* ---- suggestions */

static int fold(int ch)
{
	return ch == '-' ? '_' : tolower(ch);
}

/* Edit distance between a and b (both at most 64 bytes), case and '-'/'_'
 * folded; values above 2 are reported as 3. */
static int distance(const char *a, size_t la, const char *b, size_t lb)
{
	enum { MAXLEN = 64 };
	if (la > MAXLEN || lb > MAXLEN || (la > lb ? la - lb : lb - la) > 2)
		return 3;
	int row[MAXLEN + 1];
	for (size_t j = 0; j <= lb; j++)
		row[j] = (int)j;
	for (size_t i = 1; i <= la; i++) {
		int diag = row[0];
		row[0] = (int)i;
		for (size_t j = 1; j <= lb; j++) {
			int up = row[j];
			int cost = fold((unsigned char)a[i - 1]) != fold((unsigned char)b[j - 1]);
			int best = diag + cost;
			if (up + 1 < best)
				best = up + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb] > 2 ? 3 : row[lb];
}

const char *kiln_fe_suggest(const char *word, size_t len, const char *const *cands, size_t n)
{
	if (len >= 2) {
		for (size_t i = 0; i < n; i++) {
			size_t lc = strlen(cands[i]);
			if (lc > len && strncmp(cands[i], word, len) == 0)
				return cands[i];
		}
	}
	const char *best = NULL;
	int best_d = 3;
	for (size_t i = 0; i < n; i++) {
		int d = distance(word, len, cands[i], strlen(cands[i]));
		if (d < best_d) {
			best = cands[i];
			best_d = d;
		}
	}
	return best;
}

/* ---- scalars */

static bool is_null(const kiln_fe_node *n)
{
	if (n->kind != KILN_FE_SCALAR || !n->plain)
		return false;
	return n->len == 0 || strcmp(n->text, "~") == 0 || strcmp(n->text, "null") == 0 ||
	       strcmp(n->text, "Null") == 0 || strcmp(n->text, "NULL") == 0;
}

const char *kiln_fe_node_describe(kiln_fe_ctx *c, const kiln_fe_node *n)
{
	if (n->kind == KILN_FE_MAP)
		return "a mapping";
	if (n->kind == KILN_FE_SEQ)
		return "a sequence";
	if (is_null(n))
		return "null";
	return kiln_fe_show(c, n->text, n->len);
}

bool kiln_fe_node_int(kiln_fe_ctx *c, const kiln_fe_node *n, const char *key, int64_t *out)
{
	if (n->broken)
		return false;
	int rc = n->kind == KILN_FE_SCALAR && n->plain
	             ? kiln_num_i64_parse(n->text, n->len, INT64_MIN, INT64_MAX, out)
	             : KILN_NUM_SYNTAX;
	if (rc == KILN_NUM_SYNTAX) {
		kiln_fe_error(c, n->line, n->col, "expected an integer for '%s', got %s%s", key,
		              n->kind == KILN_FE_SCALAR && !n->plain ? "the quoted string " : "",
		              kiln_fe_node_describe(c, n));
		return false;
	}
	if (rc == KILN_NUM_RANGE) {
		bool neg = n->text[0] == '-';
		kiln_fe_error(
		    c, n->line, n->col, "integer out of range for '%s': %s (the limit is %s%llu)",
		    key, kiln_fe_show(c, n->text, n->len), neg ? "-" : "",
		    neg ? (unsigned long long)INT64_MAX + 1 : (unsigned long long)INT64_MAX);
		return false;
	}
	return true;
}

/* Decimal notation only (kiln_num_f64_parse), so nan, inf, .inf and hex
 * floats fail. */
static bool node_float(kiln_fe_ctx *c, const kiln_fe_node *n, const char *key, double *out)
{
	if (n->broken)
		return false;
	int rc = n->kind == KILN_FE_SCALAR && n->plain
	             ? kiln_num_f64_parse(n->text, n->len, -DBL_MAX, DBL_MAX, out)
	             : KILN_NUM_SYNTAX;
	if (rc == KILN_NUM_SYNTAX) {
		kiln_fe_error(c, n->line, n->col, "expected a finite number for '%s', got %s%s",
		              key,
		              n->kind == KILN_FE_SCALAR && !n->plain ? "the quoted string " : "",
		              kiln_fe_node_describe(c, n));
		return false;
	}
	if (rc == KILN_NUM_RANGE) {
		kiln_fe_error(c, n->line, n->col, "number out of range for '%s': %s", key,
		              kiln_fe_show(c, n->text, n->len));
		return false;
	}
	return true;
}

static bool node_enum(kiln_fe_ctx *c, const kiln_fe_node *n, const char *key, const char *values,
                      int64_t *out)
{
	if (n->broken)
		return false;
	if (n->kind == KILN_FE_SCALAR) {
		int64_t idx = 0;
		const char *v = values;
		for (;;) {
			const char *bar = strchr(v, '|');
			size_t vl = bar ? (size_t)(bar - v) : strlen(v);
			if (vl == n->len && memcmp(v, n->text, vl) == 0) {
				*out = idx;
				return true;
			}
			if (!bar)
				break;
			v = bar + 1;
			idx++;
		}
	}
	char list[128];
	size_t o = 0;
	for (const char *v = values; *v && o + 3 < sizeof(list); v++) {
		if (*v == '|') {
			list[o++] = ',';
			list[o++] = ' ';
		} else {
			list[o++] = *v;
		}
	}
	list[o] = '\0';
	kiln_fe_error(c, n->line, n->col, "%s must be one of %s; got %s", key, list,
	              kiln_fe_node_describe(c, n));
	return false;
}

/* Reads one value into f according to spec; false after reporting. */
static bool read_value(kiln_fe_ctx *c, const field_spec *spec, const kiln_fe_node *v,
                       kiln_fe_field *f)
{
	const char *key = spec->key;
	if (v->broken)
		return false;
	switch (spec->type) {
	case KILN_FE_T_INT:
	case KILN_FE_T_POS:
	case KILN_FE_T_NONNEG:
		if (!kiln_fe_node_int(c, v, key, &f->i))
			return false;
		if (spec->type == KILN_FE_T_POS && f->i < 1) {
			kiln_fe_error(c, v->line, v->col, "%s must be positive, got %lld", key,
			              (long long)f->i);
			return false;
		}
		if (spec->type == KILN_FE_T_NONNEG && f->i < 0) {
			kiln_fe_error(c, v->line, v->col, "%s must be >= 0, got %lld", key,
			              (long long)f->i);
			return false;
		}
		return true;
	case KILN_FE_T_FLOAT:
	case KILN_FE_T_FLOAT_POS:
		if (!node_float(c, v, key, &f->f))
			return false;
		if (spec->type == KILN_FE_T_FLOAT_POS && !(f->f > 0)) {
			kiln_fe_error(c, v->line, v->col, "%s must be positive, got %s", key,
			              kiln_fe_show(c, v->text, v->len));
			return false;
		}
		return true;
	case KILN_FE_T_BOOL:
		if (v->kind == KILN_FE_SCALAR && v->plain && strcmp(v->text, "true") == 0) {
			f->b = true;
			return true;
		}
		if (v->kind == KILN_FE_SCALAR && v->plain && strcmp(v->text, "false") == 0) {
			f->b = false;
			return true;
		}
		kiln_fe_error(c, v->line, v->col, "%s must be true or false, got %s", key,
		              kiln_fe_node_describe(c, v));
		return false;
	case KILN_FE_T_STRING:
		if (v->kind != KILN_FE_SCALAR || is_null(v) || v->len == 0 ||
		    memchr(v->text, '\0', v->len)) {
			kiln_fe_error(c, v->line, v->col, "%s must be a non-empty string, got %s",
			              key, kiln_fe_node_describe(c, v));
			return false;
		}
		f->s = v->text;
		return true;
	case KILN_FE_T_ENUM:
		return node_enum(c, v, key, spec->values, &f->i);
	case KILN_FE_T_MAP:
		if (v->kind != KILN_FE_MAP) {
			kiln_fe_error(c, v->line, v->col, "%s must be a mapping, got %s", key,
			              kiln_fe_node_describe(c, v));
			return false;
		}
		return true;
	case KILN_FE_T_SEQ:
		if (v->kind != KILN_FE_SEQ) {
			kiln_fe_error(c, v->line, v->col, "%s must be a sequence, got %s", key,
			              kiln_fe_node_describe(c, v));
			return false;
		}
		return true;
	case KILN_FE_T_HW:
		if (v->kind == KILN_FE_SEQ || is_null(v)) {
			kiln_fe_error(c, v->line, v->col,
			              "%s must be a profile name, a path or a mapping, got %s", key,
			              kiln_fe_node_describe(c, v));
			return false;
		}
		return true;
	}
	return false;
}

/* Reports an unknown key k in section s, with a suggestion from s's keys, or
 * a note when the key belongs to another section. */
static void unknown_key(kiln_fe_ctx *c, kiln_fe_section s, const kiln_fe_node *k)
{
	const char *cands[KILN_FE_F_COUNT];
	size_t n = 0;
	for (size_t i = 0; i < KILN_FE_F_COUNT; i++)
		if (specs[i].section == s)
			cands[n++] = specs[i].key;
	const char *hint = kiln_fe_suggest(k->text, k->len, cands, n);
	const char *shown = kiln_fe_show(c, k->text, k->len);
	kiln_fe_diag *d;
	if (hint)
		d = kiln_fe_error(c, k->line, k->col, "unknown key %s in %s; did you mean '%s'?",
		                  shown, section_names[s], hint);
	else
		d = kiln_fe_error(c, k->line, k->col, "unknown key %s in %s", shown,
		                  section_names[s]);
	if (hint)
		return;
	for (size_t i = 0; i < KILN_FE_F_COUNT; i++) {
		if (specs[i].section != s && strlen(specs[i].key) == k->len &&
		    memcmp(specs[i].key, k->text, k->len) == 0) {
			kiln_fe_note_at(c, d, k->line, k->col, "'%s' is a key of %s", specs[i].key,
			                section_names[specs[i].section]);
			return;
		}
	}
}

void kiln_fe_section_read(kiln_fe_ctx *c, kiln_fe_section s, const kiln_fe_node *map,
                          kiln_fe_field *fields)
{
	for (size_t p = 0; p < map->n; p++) {
		const kiln_fe_node *k = map->items[2 * p];
		const kiln_fe_node *v = map->items[2 * p + 1];
		if (k->broken)
			continue;
		if (k->kind != KILN_FE_SCALAR) {
			kiln_fe_error(c, k->line, k->col, "keys in %s must be plain names, not %s",
			              section_names[s], kiln_fe_node_describe(c, k));
			continue;
		}
		size_t id = 0;
		for (; id < KILN_FE_F_COUNT; id++)
			if (specs[id].section == s && strlen(specs[id].key) == k->len &&
			    memcmp(specs[id].key, k->text, k->len) == 0)
				break;
		if (id == KILN_FE_F_COUNT) {
			unknown_key(c, s, k);
			continue;
		}
		kiln_fe_field *f = &fields[id];
		if (f->key) {
			kiln_fe_diag *d =
			    kiln_fe_error(c, k->line, k->col, "duplicate key '%s' in %s",
			                  specs[id].key, section_names[s]);
			kiln_fe_note_at(c, d, f->key->line, f->key->col, "'%s' was first set here",
			                specs[id].key);
			continue;
		}
		f->key = k;
		f->value = v;
		f->state = read_value(c, &specs[id], v, f) ? KILN_FE_SET : KILN_FE_BAD;
	}
}

void kiln_fe_section_poison(kiln_fe_section s, kiln_fe_field *fields)
{
	for (size_t i = 0; i < KILN_FE_F_COUNT; i++)
		if (specs[i].section == s)
			fields[i].state = KILN_FE_BAD;
}
