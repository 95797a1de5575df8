/* ir/text.c: numbers read from text, and untrusted text made safe to print.
 *
 * One rule set for every number kiln reads: command-line values (tools/),
 * model descriptions (frontend/) and load traces (sim/loads.c). The rules
 * are stated once, in docs/cli.md ("Numbers"); model-format.md and
 * simulator.md point there.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* Longest decimal number accepted, in characters (docs/cli.md). */
#define DECIMAL_MAX_CHARS 256

/* [+-] digits, nothing else: *out_neg, *out_mag (saturated at UINT64_MAX,
 * with *out_over set when the magnitude does not fit). */
static bool int_syntax(const char *s, size_t len, bool *out_neg, uint64_t *out_mag, bool *out_over)
{
	size_t i = 0;
	*out_neg = false;
	*out_mag = 0;
	*out_over = false;
	if (i < len && (s[i] == '+' || s[i] == '-'))
		*out_neg = s[i++] == '-';
	if (i == len)
		return false;
	for (; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		uint64_t d = (uint64_t)(s[i] - '0');
		if (*out_mag > (UINT64_MAX - d) / 10)
			*out_over = true;
		else
			*out_mag = *out_mag * 10 + d;
	}
	return true;
}

int kiln_num_i64_parse(const char *s, size_t len, int64_t lo, int64_t hi, int64_t *out)
{
	bool neg, over;
	uint64_t mag;
	if (!s || !int_syntax(s, len, &neg, &mag, &over))
		return KILN_NUM_SYNTAX;
	int64_t v;
	if (over || (!neg && mag > (uint64_t)INT64_MAX) || (neg && mag > (uint64_t)INT64_MAX + 1))
		return KILN_NUM_RANGE;
	if (neg)
		v = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
	else
		v = (int64_t)mag;
	if (v < lo || v > hi)
		return KILN_NUM_RANGE;
	*out = v;
	return KILN_NUM_OK;
}

int kiln_num_u64_parse(const char *s, size_t len, uint64_t lo, uint64_t hi, uint64_t *out)
{
	bool neg, over;
	uint64_t mag;
	if (!s || !int_syntax(s, len, &neg, &mag, &over))
		return KILN_NUM_SYNTAX;
	/* "-0" is zero; any other negative number is below every range. */
	if (over || (neg && mag != 0) || mag < lo || mag > hi)
		return KILN_NUM_RANGE;
	*out = mag;
	return KILN_NUM_OK;
}

/* [+-] (digits [. [digits]] | . digits) [(e|E) [+-] digits]. */
static bool decimal_syntax(const char *s, size_t len)
{
	size_t i = 0, digits = 0;
	if (i < len && (s[i] == '+' || s[i] == '-'))
		i++;
	while (i < len && s[i] >= '0' && s[i] <= '9')
		i++, digits++;
	if (i < len && s[i] == '.') {
		i++;
		while (i < len && s[i] >= '0' && s[i] <= '9')
			i++, digits++;
	}
	if (!digits)
		return false;
	if (i < len && (s[i] == 'e' || s[i] == 'E')) {
		i++;
		if (i < len && (s[i] == '+' || s[i] == '-'))
			i++;
		size_t exp = 0;
		while (i < len && s[i] >= '0' && s[i] <= '9')
			i++, exp++;
		if (!exp)
			return false;
	}
	return i == len;
}

int kiln_num_f64_parse(const char *s, size_t len, double lo, double hi, double *out)
{
	if (!s || len > DECIMAL_MAX_CHARS || !decimal_syntax(s, len))
		return KILN_NUM_SYNTAX;
	/* strtod needs a terminated copy: s may go on past len. */
	char buf[DECIMAL_MAX_CHARS + 1];
	memcpy(buf, s, len);
	buf[len] = '\0';
	double v = strtod(buf, NULL);
	if (!isfinite(v) || !(v >= lo && v <= hi))
		return KILN_NUM_RANGE;
	*out = v + 0.0; /* -0 is 0: echoed as 0, never as -0 */
	return KILN_NUM_OK;
}

int kiln_num_bytes_parse(const char *s, size_t len, uint64_t *out)
{
	static const struct {
		const char *suffix;
		int shift;
	} sfx[] = {{"B", 0},   {"K", 10},   {"KB", 10}, {"KiB", 10}, {"M", 20},
	           {"MB", 20}, {"MiB", 20}, {"G", 30},  {"GB", 30},  {"GiB", 30},
	           {"T", 40},  {"TB", 40},  {"TiB", 40}};
	if (!s)
		return KILN_NUM_SYNTAX;
	size_t digits = 0;
	while (digits < len && s[digits] >= '0' && s[digits] <= '9')
		digits++;
	if (digits == 0)
		return KILN_NUM_SYNTAX;
	int shift = 0;
	if (digits < len) {
		size_t i = 0, n = sizeof sfx / sizeof sfx[0], k = len - digits;
		while (i < n &&
		       !(strlen(sfx[i].suffix) == k && memcmp(s + digits, sfx[i].suffix, k) == 0))
			i++;
		if (i == n)
			return KILN_NUM_SYNTAX;
		shift = sfx[i].shift;
	}
	uint64_t v;
	if (kiln_num_u64_parse(s, digits, 0, UINT64_MAX >> shift, &v) != KILN_NUM_OK)
		return KILN_NUM_RANGE;
	*out = v << shift;
	return KILN_NUM_OK;
}

/* ---------------------------------------------------------------- escaping */

/* Length of the valid UTF-8 sequence at s (at most len bytes) that encodes
 * a character other than a C1 control (U+0080 to U+009F), or 0. Overlong
 * forms, surrogates and code points past U+10FFFF are not valid. */
static size_t utf8_printable(const unsigned char *s, size_t len)
{
	unsigned char c = s[0];
	size_t n;
	uint32_t cp, min;
	if (c >= 0xc2 && c <= 0xdf)
		n = 2, cp = c & 0x1fu, min = 0x80;
	else if (c >= 0xe0 && c <= 0xef)
		n = 3, cp = c & 0x0fu, min = 0x800;
	else if (c >= 0xf0 && c <= 0xf4)
		n = 4, cp = c & 0x07u, min = 0x10000;
	else
		return 0;
	if (n > len)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3fu);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || cp <= 0x9f)
		return 0;
	return n;
}

/* Writes the escaped form of s[0..len) with put, one piece at a time;
 * stops (returning false) as soon as put does. */
static bool escape_each(const char *s, size_t len, bool (*put)(void *ctx, const char *p, size_t n),
                        void *ctx)
{
	const unsigned char *u = (const unsigned char *)s;
	for (size_t i = 0; i < len;) {
		size_t n = u[i] >= 0x80 ? utf8_printable(u + i, len - i) : 0;
		char esc[5];
		bool ok;
		if (n) {
			ok = put(ctx, s + i, n);
			i += n;
			continue;
		}
		if (u[i] == '\\')
			ok = put(ctx, "\\\\", 2);
		else if (u[i] >= 0x20 && u[i] < 0x7f)
			ok = put(ctx, s + i, 1);
		else {
			static const char hex[] = "0123456789abcdef";
			esc[0] = '\\';
			esc[1] = 'x';
			esc[2] = hex[u[i] >> 4];
			esc[3] = hex[u[i] & 15];
			ok = put(ctx, esc, 4);
		}
		if (!ok)
			return false;
		i++;
	}
	return true;
}

typedef struct sink {
	char *out;
	size_t cap, used; /* bytes out may take, and has taken */
} sink;

static bool put_buf(void *ctx, const char *p, size_t n)
{
	sink *k = ctx;
	if (n > k->cap - k->used)
		return false;
	memcpy(k->out + k->used, p, n);
	k->used += n;
	return true;
}

const char *kiln_text_escape(const char *s, size_t len, size_t cap, char *out)
{
	if (cap == 0)
		return out;
	if (cap < 4 || !s) {
		out[0] = '\0';
		return out;
	}
	sink k = {out, cap - 1, 0};
	if (!escape_each(s, len, put_buf, &k)) {
		/* Too long: again, leaving room for the "..." that says so. */
		k = (sink){out, cap - 4, 0};
		escape_each(s, len, put_buf, &k);
		memcpy(out + k.used, "...", 3);
		k.used += 3;
	}
	out[k.used] = '\0';
	return out;
}

static bool put_file(void *ctx, const char *p, size_t n)
{
	return fwrite(p, 1, n, ctx) == n;
}

int kiln_text_put(FILE *f, const char *s, size_t len)
{
	return s && escape_each(s, len, put_file, f) ? 0 : -1;
}

bool kiln_text_has_control(const char *s, size_t len, uint32_t *out_cp)
{
	const unsigned char *u = (const unsigned char *)s;
	for (size_t i = 0; i < len; i++) {
		uint32_t cp = u[i];
		if (cp == 0xc2 && i + 1 < len && u[i + 1] >= 0x80 && u[i + 1] <= 0x9f)
			cp = u[i + 1];
		else if (cp >= 0x20 && cp != 0x7f)
			continue;
		*out_cp = cp;
		return true;
	}
	return false;
}
