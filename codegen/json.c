/* codegen/json.c: the one file that touches cJSON. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

/* kiln_json is cJSON under another name; the header keeps it opaque. */
static cJSON *C(const kiln_json *j)
{
	return (cJSON *)j;
}

static kiln_json *K(cJSON *c)
{
	return (kiln_json *)c;
}

/* Set on the root when any add failed, so write can report it. cJSON nodes
 * have no spare field, so failures are remembered by marking the root with a
 * child named below; it is removed again before printing. */
static const char OOM_KEY[] = "\x01kiln-oom";

static void mark_failed(cJSON *parent)
{
	/* Best effort: if even this fails, the missing child will still make
	 * the output incomplete, which the caller cannot detect; cJSON's
	 * allocations are tiny, so this path is practically unreachable. */
	if (parent)
		cJSON_AddItemToObjectCS(parent, OOM_KEY, cJSON_CreateNull());
}

static kiln_json *attach(kiln_json *parent, const char *key, cJSON *child)
{
	cJSON *p = C(parent);
	if (!p) {
		cJSON_Delete(child);
		return NULL;
	}
	if (!child) {
		mark_failed(p);
		return NULL;
	}
	cJSON_bool ok = cJSON_IsArray(p) ? cJSON_AddItemToArray(p, child)
	                                 : cJSON_AddItemToObject(p, key, child);
	if (!ok) {
		cJSON_Delete(child);
		mark_failed(p);
		return NULL;
	}
	return K(child);
}

kiln_json *kiln_json_object(void)
{
	return K(cJSON_CreateObject());
}

kiln_json *kiln_json_array(void)
{
	return K(cJSON_CreateArray());
}

kiln_json *kiln_json_add_object(kiln_json *parent, const char *key)
{
	return attach(parent, key, parent ? cJSON_CreateObject() : NULL);
}

kiln_json *kiln_json_add_array(kiln_json *parent, const char *key)
{
	return attach(parent, key, parent ? cJSON_CreateArray() : NULL);
}

/* The shortest decimal form of v that reads back as exactly v. cJSON's own
 * printer accepts a form within one ulp, so numbers would not round-trip
 * bit for bit; kiln's traces and reports promise they do. */
static cJSON *exact_number(double v)
{
	char buf[40];
	/* An integral value (a byte count the compiler keeps as a double) in
	 * integer notation, every digit exact: %g would write 1e+15 past 15
	 * digits. Larger magnitudes keep the exponent. */
	if (v == floor(v) && fabs(v) < 1e19) {
		snprintf(buf, sizeof buf, "%.0f", v);
		return cJSON_CreateRaw(buf);
	}
	for (int digits = 15; digits <= 17; digits++) {
		snprintf(buf, sizeof buf, "%.*g", digits, v);
		if (strtod(buf, NULL) == v)
			break;
	}
	return cJSON_CreateRaw(buf);
}

void kiln_json_add_number(kiln_json *parent, const char *key, double v)
{
	/* JSON has no NaN or infinity; a non-finite figure becomes null. */
	attach(parent, key, parent ? (isfinite(v) ? exact_number(v) : cJSON_CreateNull()) : NULL);
}

void kiln_json_add_u64(kiln_json *parent, const char *key, uint64_t v)
{
	char buf[24];
	snprintf(buf, sizeof buf, "%" PRIu64, v);
	attach(parent, key, parent ? cJSON_CreateRaw(buf) : NULL);
}

void kiln_json_add_i64(kiln_json *parent, const char *key, int64_t v)
{
	char buf[24];
	snprintf(buf, sizeof buf, "%" PRId64, v);
	attach(parent, key, parent ? cJSON_CreateRaw(buf) : NULL);
}

/* The length of the valid UTF-8 sequence at s (1 to 4 bytes: no overlong
 * form, no surrogate, nothing past U+10FFFF), or 0. */
static size_t utf8_len(const unsigned char *s)
{
	unsigned c = s[0];
	size_t n = c < 0x80                 ? 1
	           : c >= 0xc2 && c <= 0xdf ? 2
	           : c >= 0xe0 && c <= 0xef ? 3
	           : c >= 0xf0 && c <= 0xf4 ? 4
	                                    : 0;
	for (size_t i = 1; i < n; i++)
		if ((s[i] & 0xc0) != 0x80)
			return 0;
	if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] > 0x9f) ||
	    (c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] > 0x8f))
		return 0;
	return n;
}

/* v as a JSON string (quotes included) that is valid UTF-8 whatever v is:
 * escapes as cJSON writes them, and each byte that is not valid UTF-8 as
 * \u00XX, the code point of the same number (docs/cli.md). NULL when out
 * of memory. */
static cJSON *string_of_bytes(const char *v)
{
	size_t n = strlen(v);
	char *buf = malloc(6 * n + 3), *w = buf;
	if (!buf)
		return NULL;
	*w++ = '"';
	for (const unsigned char *s = (const unsigned char *)v; *s;) {
		size_t k = utf8_len(s);
		if (k == 1 && (*s == '"' || *s == '\\')) {
			*w++ = '\\';
			*w++ = (char)*s++;
		} else if (k == 1 && *s < 0x20) {
			static const char shorts[] = "btn?fr"; /* 0x08 to 0x0d */
			char sh = *s >= 8 && *s <= 13 ? shorts[*s - 8] : '?';
			if (sh != '?') {
				*w++ = '\\';
				*w++ = sh;
			} else {
				w += sprintf(w, "\\u%04x", *s);
			}
			s++;
		} else if (k == 0) {
			w += sprintf(w, "\\u%04x", *s++);
		} else {
			memcpy(w, s, k);
			w += k;
			s += k;
		}
	}
	*w++ = '"';
	*w = '\0';
	cJSON *j = cJSON_CreateRaw(buf);
	free(buf);
	return j;
}

static bool valid_utf8(const char *v)
{
	for (const unsigned char *s = (const unsigned char *)v; *s;) {
		size_t k = utf8_len(s);
		if (!k)
			return false;
		s += k;
	}
	return true;
}

void kiln_json_add_string(kiln_json *parent, const char *key, const char *v)
{
	cJSON *j = NULL;
	if (parent)
		j = !v              ? cJSON_CreateNull()
		    : valid_utf8(v) ? cJSON_CreateString(v)
		                    : string_of_bytes(v);
	attach(parent, key, j);
}

void kiln_json_add_bool(kiln_json *parent, const char *key, bool v)
{
	attach(parent, key, parent ? cJSON_CreateBool(v) : NULL);
}

void kiln_json_add_null(kiln_json *parent, const char *key)
{
	attach(parent, key, parent ? cJSON_CreateNull() : NULL);
}

static bool has_failure(const cJSON *node)
{
	for (const cJSON *c = node ? node->child : NULL; c; c = c->next) {
		if (c->string && c->string == OOM_KEY)
			return true;
		if (has_failure(c))
			return true;
	}
	return false;
}

int kiln_json_write(const kiln_json *root, FILE *out)
{
	if (!root || has_failure(C(root)))
		return KILN_JSON_ENOMEM;
	char *text = cJSON_Print(C(root));
	if (!text)
		return KILN_JSON_ENOMEM;
	int rc = (fputs(text, out) < 0 || fputc('\n', out) == EOF) ? KILN_JSON_EWRITE : 0;
	cJSON_free(text);
	return rc;
}

void kiln_json_free(kiln_json *root)
{
	cJSON_Delete(C(root));
}

kiln_json *kiln_json_parse(const char *text, size_t len)
{
	return K(cJSON_ParseWithLength(text, len));
}

const kiln_json *kiln_json_get(const kiln_json *obj, const char *key)
{
	if (!obj || !cJSON_IsObject(C(obj)))
		return NULL;
	return K(cJSON_GetObjectItemCaseSensitive(C(obj), key));
}

const kiln_json *kiln_json_at(const kiln_json *arr, int index)
{
	if (!arr || !cJSON_IsArray(C(arr)))
		return NULL;
	return K(cJSON_GetArrayItem(C(arr), index));
}

int kiln_json_size(const kiln_json *arr)
{
	return arr && cJSON_IsArray(C(arr)) ? cJSON_GetArraySize(C(arr)) : 0;
}

bool kiln_json_is_number(const kiln_json *v)
{
	return v && cJSON_IsNumber(C(v));
}

double kiln_json_number(const kiln_json *v)
{
	return kiln_json_is_number(v) ? C(v)->valuedouble : NAN;
}

const char *kiln_json_string(const kiln_json *v)
{
	return v && cJSON_IsString(C(v)) ? C(v)->valuestring : NULL;
}

bool kiln_json_is_bool(const kiln_json *v)
{
	return v && cJSON_IsBool(C(v));
}

bool kiln_json_bool(const kiln_json *v)
{
	return v && cJSON_IsTrue(C(v));
}

bool kiln_json_is_null(const kiln_json *v)
{
	return v && cJSON_IsNull(C(v));
}

bool kiln_json_is_object(const kiln_json *v)
{
	return v && cJSON_IsObject(C(v));
}

bool kiln_json_is_array(const kiln_json *v)
{
	return v && cJSON_IsArray(C(v));
}

bool kiln_json_is_string(const kiln_json *v)
{
	return v && cJSON_IsString(C(v));
}

const char *kiln_json_kind(const kiln_json *v)
{
	const cJSON *c = C(v);
	return !c                  ? "nothing"
	       : cJSON_IsObject(c) ? "an object"
	       : cJSON_IsArray(c)  ? "an array"
	       : cJSON_IsString(c) ? "a string"
	       : cJSON_IsNumber(c) ? "a number"
	       : cJSON_IsBool(c)   ? "a boolean"
	                           : "null";
}

/* ---------------------------------------------------------------- strict parsing */

/* cJSON's own depth limit, so that what passes here cJSON parses too. */
#define STRICT_MAX_DEPTH 1000
#if CJSON_NESTING_LIMIT < STRICT_MAX_DEPTH
#error "cJSON nests less deeply than the strict check allows"
#endif

/* The strict syntax check that runs before cJSON: RFC 8259's grammar, one
 * pass, recording where each object key starts (in document order) so the
 * duplicate check on cJSON's tree can say where a duplicate is. */
typedef struct scan {
	const char *s;
	size_t n, i;
	const char *why; /* the first problem, at err_at; NULL: none yet */
	size_t err_at;
	char why_buf[96];
	size_t *keys, n_keys, cap_keys;
	bool oom;
} scan;

static bool fail_at(scan *k, size_t at, const char *why)
{
	if (!k->why) {
		k->why = why;
		k->err_at = at;
	}
	return false;
}

static void skip_ws(scan *k)
{
	while (k->i < k->n && (k->s[k->i] == ' ' || k->s[k->i] == '\t' || k->s[k->i] == '\n' ||
	                       k->s[k->i] == '\r'))
		k->i++;
}

static bool at_word(const scan *k, const char *w)
{
	size_t m = strlen(w);
	return k->n - k->i >= m && memcmp(k->s + k->i, w, m) == 0;
}

/* An unexpected byte c: shown when printable, as \xNN otherwise. */
static bool unexpected(scan *k, const char *expected)
{
	unsigned char c = (unsigned char)k->s[k->i];
	if (c == 0)
		return fail_at(k, k->i, "a NUL byte (not JSON text)");
	if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
		return fail_at(
		    k, k->i,
		    "an unquoted word (JSON's words are true, false and null; strings are "
		    "double-quoted)");
	if (c >= 0x21 && c < 0x7f)
		snprintf(k->why_buf, sizeof k->why_buf, "unexpected '%c'; expected %s", c,
		         expected);
	else
		snprintf(k->why_buf, sizeof k->why_buf, "unexpected byte \\x%02x; expected %s", c,
		         expected);
	return fail_at(k, k->i, k->why_buf);
}

static int hex4(const char *p)
{
	int v = 0;
	for (int j = 0; j < 4; j++) {
		char c = p[j];
		int d = c >= '0' && c <= '9'   ? c - '0'
		        : c >= 'a' && c <= 'f' ? c - 'a' + 10
		        : c >= 'A' && c <= 'F' ? c - 'A' + 10
		                               : -1;
		if (d < 0)
			return -1;
		v = v * 16 + d;
	}
	return v;
}

static bool scan_string(scan *k)
{
	size_t start = k->i++;
	for (;;) {
		if (k->i >= k->n)
			return fail_at(k, start, "unterminated string");
		unsigned char c = (unsigned char)k->s[k->i];
		if (c == '"') {
			k->i++;
			return true;
		}
		if (c == 0)
			return fail_at(k, k->i, "a NUL byte in a string");
		if (c < 0x20) {
			snprintf(k->why_buf, sizeof k->why_buf,
			         "control character U+%04X in a string (JSON needs it escaped)", c);
			return fail_at(k, k->i, k->why_buf);
		}
		if (c != '\\') {
			k->i++;
			continue;
		}
		size_t esc = k->i;
		if (k->i + 1 >= k->n)
			return fail_at(k, start, "unterminated string");
		char e = k->s[k->i + 1];
		if (e && strchr("\"\\/bfnrt", e)) {
			k->i += 2;
			continue;
		}
		if (e != 'u') {
			if ((unsigned char)e >= 0x21 && (unsigned char)e < 0x7f)
				snprintf(k->why_buf, sizeof k->why_buf,
				         "invalid escape '\\%c' in a string", e);
			else
				snprintf(k->why_buf, sizeof k->why_buf,
				         "invalid escape in a string");
			return fail_at(k, esc, k->why_buf);
		}
		int u = k->n - k->i >= 6 ? hex4(k->s + k->i + 2) : -1;
		if (u < 0)
			return fail_at(k, esc, "invalid \\u escape (four hex digits must follow)");
		if (u == 0)
			return fail_at(k, esc, "\\u0000 (a NUL character) in a string");
		k->i += 6;
		if (u >= 0xDC00 && u <= 0xDFFF)
			return fail_at(k, esc,
			               "a lone UTF-16 low surrogate (\\uDC00-\\uDFFF) in a string");
		if (u >= 0xD800 && u <= 0xDBFF) {
			int lo = k->n - k->i >= 6 && k->s[k->i] == '\\' && k->s[k->i + 1] == 'u'
			             ? hex4(k->s + k->i + 2)
			             : -1;
			if (lo < 0xDC00 || lo > 0xDFFF)
				return fail_at(
				    k, esc,
				    "a lone UTF-16 high surrogate (\\uD800-\\uDBFF) in a string");
			k->i += 6;
		}
	}
}

static bool digit(const scan *k)
{
	return k->i < k->n && k->s[k->i] >= '0' && k->s[k->i] <= '9';
}

static bool scan_number(scan *k)
{
	size_t start = k->i;
	if (k->s[k->i] == '-')
		k->i++;
	if (at_word(k, "Infinity"))
		return fail_at(k, start, "Infinity is not a JSON number");
	if (!digit(k))
		return k->i < k->n ? unexpected(k, "a digit")
		                   : fail_at(k, start, "unexpected end of input in a number");
	if (k->s[k->i] == '0' && (k->i++, digit(k)))
		return fail_at(k, start, "a number with a leading zero is not JSON");
	while (digit(k))
		k->i++;
	if (k->i < k->n && k->s[k->i] == '.') {
		k->i++;
		if (!digit(k))
			return fail_at(k, k->i, "a digit must follow the decimal point");
		while (digit(k))
			k->i++;
	}
	if (k->i < k->n && (k->s[k->i] == 'e' || k->s[k->i] == 'E')) {
		k->i++;
		if (k->i < k->n && (k->s[k->i] == '+' || k->s[k->i] == '-'))
			k->i++;
		if (!digit(k))
			return fail_at(k, k->i, "a digit must follow the exponent");
		while (digit(k))
			k->i++;
	}
	return true;
}

static bool note_key(scan *k)
{
	if (k->n_keys == k->cap_keys) {
		size_t cap = k->cap_keys ? 2 * k->cap_keys : 64;
		size_t *v = realloc(k->keys, cap * sizeof *v);
		if (!v) {
			k->oom = true;
			return fail_at(k, k->i, "out of memory");
		}
		k->keys = v;
		k->cap_keys = cap;
	}
	k->keys[k->n_keys++] = k->i;
	return true;
}

static bool scan_value(scan *k, int depth);

/* An object or array at k->i ('{' or '['). */
static bool scan_container(scan *k, int depth)
{
	bool obj = k->s[k->i] == '{';
	char close = obj ? '}' : ']';
	if (depth >= STRICT_MAX_DEPTH)
		return fail_at(k, k->i, "nested deeper than 1000 levels");
	k->i++;
	skip_ws(k);
	if (k->i < k->n && k->s[k->i] == close) {
		k->i++;
		return true;
	}
	for (;;) {
		if (obj) {
			if (k->i >= k->n)
				return fail_at(k, k->i, "unexpected end of input in an object");
			if (k->s[k->i] != '"')
				return unexpected(k, "a string (a key)");
			if (!note_key(k) || !scan_string(k))
				return false;
			skip_ws(k);
			if (k->i >= k->n)
				return fail_at(k, k->i, "unexpected end of input in an object");
			if (k->s[k->i] != ':')
				return unexpected(k, "':' after the key");
			k->i++;
		}
		if (!scan_value(k, depth + 1))
			return false;
		skip_ws(k);
		if (k->i >= k->n)
			return fail_at(k, k->i,
			               obj ? "unexpected end of input in an object"
			                   : "unexpected end of input in an array");
		if (k->s[k->i] == close) {
			k->i++;
			return true;
		}
		if (k->s[k->i] != ',')
			return unexpected(k, obj ? "',' or '}'" : "',' or ']'");
		k->i++;
		skip_ws(k);
		if (k->i < k->n && k->s[k->i] == close)
			return fail_at(k, k->i, "a comma before the closing bracket is not JSON");
	}
}

static bool scan_value(scan *k, int depth)
{
	skip_ws(k);
	if (k->i >= k->n)
		return fail_at(k, k->i, "unexpected end of input; expected a value");
	char c = k->s[k->i];
	if (c == '{' || c == '[')
		return scan_container(k, depth);
	if (c == '"')
		return scan_string(k);
	if (c == '-' || (c >= '0' && c <= '9'))
		return scan_number(k);
	static const char *const words[] = {"true", "false", "null"};
	for (size_t w = 0; w < 3; w++)
		if (at_word(k, words[w])) {
			k->i += strlen(words[w]);
			return true;
		}
	if (at_word(k, "NaN"))
		return fail_at(k, k->i, "NaN is not a JSON number");
	if (at_word(k, "Infinity"))
		return fail_at(k, k->i, "Infinity is not a JSON number");
	return unexpected(k, "a value");
}

/* Line and column (characters) of byte offset at. */
static void locate(const char *s, size_t n, size_t at, int *line, int *col)
{
	int l = 1, c = 1;
	for (size_t i = 0; i < at && i < n; i++) {
		if (s[i] == '\n') {
			l++;
			c = 1;
		} else if (((unsigned char)s[i] & 0xC0) != 0x80) {
			c++;
		}
	}
	*line = l;
	*col = c;
}

/* A member and its key's number in document order. */
typedef struct member {
	const cJSON *item;
	size_t nr;
} member;

static int by_key_then_nr(const void *a, const void *b)
{
	const member *x = a, *y = b;
	int d = strcmp(x->item->string, y->item->string);
	return d ? d : (x->nr > y->nr) - (x->nr < y->nr);
}

/* Numbers the keys under node in document order from *nr, and records in
 * *dup the number of the earliest key in the text that repeats an earlier
 * key of its object (SIZE_MAX: none). false when out of memory. */
static bool find_duplicates(const cJSON *node, size_t *nr, size_t *dup, const char **dup_key)
{
	int n = 0;
	for (const cJSON *c = node->child; c; c = c->next)
		n++;
	member *m = NULL;
	if (cJSON_IsObject(node) && n > 1 && !(m = malloc((size_t)n * sizeof *m)))
		return false;
	int j = 0;
	for (const cJSON *c = node->child; c; c = c->next) {
		if (m)
			m[j++] = (member){c, *nr};
		if (cJSON_IsObject(node))
			++*nr;
		if ((cJSON_IsObject(c) || cJSON_IsArray(c)) &&
		    !find_duplicates(c, nr, dup, dup_key)) {
			free(m);
			return false;
		}
	}
	if (m) {
		qsort(m, (size_t)n, sizeof *m, by_key_then_nr);
		for (int i = 1; i < n; i++)
			if (strcmp(m[i].item->string, m[i - 1].item->string) == 0 &&
			    m[i].nr < *dup) {
				*dup = m[i].nr;
				*dup_key = m[i].item->string;
			}
		free(m);
	}
	return true;
}

kiln_json *kiln_json_parse_strict(const char *text, size_t len, kiln_json_error *out_err)
{
	*out_err = (kiln_json_error){0};
	scan k = {.s = text, .n = len};
	if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
		k.i = 3;
	skip_ws(&k);
	if (k.i >= k.n)
		fail_at(&k, k.i, "no JSON value (the text is empty or only white space)");
	else if (scan_value(&k, 0)) {
		skip_ws(&k);
		if (k.i < k.n)
			fail_at(&k, k.i, "trailing content after the JSON value");
	}
	cJSON *root = NULL;
	if (!k.why) {
		const char *end = NULL;
		root = cJSON_ParseWithLengthOpts(text, len, &end, false);
		if (!root)
			/* The grammar passed: cJSON can only have run out of memory. */
			fail_at(&k, end && end >= text ? (size_t)(end - text) : 0, "out of memory");
	}
	if (root) {
		size_t nr = 0, dup = SIZE_MAX;
		const char *key = NULL;
		if (!find_duplicates(root, &nr, &dup, &key)) {
			fail_at(&k, 0, "out of memory");
		} else if (dup != SIZE_MAX) {
			char shown[64];
			snprintf(out_err->reason, sizeof out_err->reason,
			         "duplicate key '%s' in an object (JSON parsers disagree on which "
			         "one counts)",
			         kiln_text_escape(key, strlen(key), sizeof shown, shown));
			fail_at(&k, dup < k.n_keys ? k.keys[dup] : 0, out_err->reason);
		}
		if (k.why) {
			cJSON_Delete(root);
			root = NULL;
		}
	}
	free(k.keys);
	if (k.why) {
		if (k.why != out_err->reason)
			snprintf(out_err->reason, sizeof out_err->reason, "%s", k.why);
		locate(text, len, k.err_at, &out_err->line, &out_err->col);
	}
	return K(root);
}
