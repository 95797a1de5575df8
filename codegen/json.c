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
