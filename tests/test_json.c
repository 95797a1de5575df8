/* tests/test_json.c: codegen/json.c, the JSON writer every --json output
 * goes through: integers exactly, past 2^53 too. Expected texts are the
 * numbers written out by hand. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

/* doc as text (caller frees). */
static char *text_of(kiln_json *doc)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cr_assert_not_null(f);
	cr_assert_eq(kiln_json_write(doc, f), 0);
	fclose(f);
	return buf;
}

Test(json, integers_are_exact_past_2_to_the_53)
{
	kiln_json *doc = kiln_json_object();
	kiln_json_add_u64(doc, "max_u64", UINT64_MAX);
	kiln_json_add_u64(doc, "two53_plus_1", ((uint64_t)1 << 53) + 1);
	kiln_json_add_i64(doc, "min_i64", INT64_MIN);
	kiln_json_add_i64(doc, "minus_one", -1);
	kiln_json *arr = kiln_json_add_array(doc, "list");
	kiln_json_add_u64(arr, NULL, 0);
	kiln_json_add_i64(arr, NULL, 42);
	char *t = text_of(doc);
	cr_assert_not_null(strstr(t, "\"max_u64\":\t18446744073709551615,"), "%s", t);
	cr_assert_not_null(strstr(t, "\"two53_plus_1\":\t9007199254740993,"), "%s", t);
	cr_assert_not_null(strstr(t, "\"min_i64\":\t-9223372036854775808,"), "%s", t);
	cr_assert_not_null(strstr(t, "\"minus_one\":\t-1,"), "%s", t);
	cr_assert_not_null(strstr(t, "\"list\":\t[0, 42]"), "%s", t);
	/* And it is still JSON. */
	kiln_json *back = kiln_json_parse(t, strlen(t));
	cr_assert_not_null(back);
	cr_assert_eq(kiln_json_number(kiln_json_get(back, "minus_one")), -1.0);
	kiln_json_free(back);
	free(t);
	kiln_json_free(doc);
}

/* A figure the compiler keeps as a double but that holds an integer (bytes)
 * is written in integer notation: %.17g would write 1e+15. Fractions and
 * magnitudes of 10^19 and up keep the shortest exact form. */
Test(json, integral_doubles_in_integer_notation)
{
	kiln_json *doc = kiln_json_object();
	kiln_json_add_number(doc, "peta", 1e15);
	kiln_json_add_number(doc, "big", 1234567890123456768.0); /* 2^60 + ..., exact */
	kiln_json_add_number(doc, "half", 0.5);
	kiln_json_add_number(doc, "huge", 1e20);
	kiln_json_add_number(doc, "third", 1.0 / 3.0); /* 16 digits read back exactly */
	char *t = text_of(doc);
	cr_assert_not_null(strstr(t, "\"peta\":\t1000000000000000,"), "%s", t);
	cr_assert_not_null(strstr(t, "\"big\":\t1234567890123456768,"), "%s", t);
	cr_assert_not_null(strstr(t, "\"half\":\t0.5,"), "%s", t);
	cr_assert_not_null(strstr(t, "\"huge\":\t1e+20,"), "%s", t);
	cr_assert_not_null(strstr(t, "\"third\":\t0.3333333333333333\n"), "%s", t);
	free(t);
	kiln_json_free(doc);
}

/* The strict parser takes every form RFC 8259 allows (the corner cases of
 * its number and string grammar, a byte order mark, 1000 levels of
 * nesting) and refuses the 1001st level at its bracket. */
Test(json, strict_parse_accepts_every_json_form)
{
	static const char text[] = "\xEF\xBB\xBF { \"n\": [-0, 0.5, -1.25e+3, 2E-2, 0e0],\r\n"
	                           "\t\"s\": \"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\",\n"
	                           "  \"w\": [true, false, null, {}, []], \"e\": \"\" } \n";
	kiln_json_error e;
	kiln_json *doc = kiln_json_parse_strict(text, strlen(text), &e);
	cr_assert_not_null(doc, "%d:%d: %s", e.line, e.col, e.reason);
	cr_expect_eq(kiln_json_number(kiln_json_at(kiln_json_get(doc, "n"), 2)), -1250.0);
	cr_expect_str_eq(kiln_json_string(kiln_json_get(doc, "s")),
	                 "\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
	cr_expect_str_eq(kiln_json_kind(kiln_json_at(kiln_json_get(doc, "w"), 3)), "an object");
	kiln_json_free(doc);
	char deep[2 * 1001 + 1];
	for (int depth = 1000; depth <= 1001; depth++) {
		memset(deep, '[', (size_t)depth);
		memset(deep + depth, ']', (size_t)depth);
		doc = kiln_json_parse_strict(deep, 2 * (size_t)depth, &e);
		if (depth == 1000) {
			cr_expect_not_null(doc, "%d:%d: %s", e.line, e.col, e.reason);
		} else {
			cr_expect_null(doc);
			cr_expect_eq(e.col, 1001);
			cr_expect_str_eq(e.reason, "nested deeper than 1000 levels");
		}
		kiln_json_free(doc);
	}
}

/* A string that is not valid UTF-8 (a blob's unit name) is written as valid
 * UTF-8 JSON: each bad byte as \u00XX, the rest as cJSON writes it. */
Test(json, bytes_that_are_not_utf8_are_escaped)
{
	kiln_json *doc = kiln_json_object();
	kiln_json_add_string(doc, "a", "ln1\xffrstd");
	kiln_json_add_string(doc, "b", "q\"\\\n\x01\xc3\xa9\xc0\xaf\xed\xa0\x80");
	kiln_json_add_string(doc, "c", "caf\xc3\xa9");
	char *t = text_of(doc);
	kiln_json_free(doc);
	cr_assert_not_null(strstr(t, "\"ln1\\u00ffrstd\""), "%s", t);
	/* An overlong form and a surrogate are bytes, é is kept. */
	cr_assert_not_null(
	    strstr(t, "\"q\\\"\\\\\\n\\u0001\xc3\xa9\\u00c0\\u00af\\u00ed\\u00a0\\u0080\""), "%s",
	    t);
	cr_assert_not_null(strstr(t, "\"caf\xc3\xa9\""), "%s", t);
	free(t);
}
