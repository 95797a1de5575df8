/* tests/test_text.c: ir/text.c, the one number syntax (docs/cli.md,
 * "Numbers") and the escaping of untrusted text. Expected values are the
 * numbers as written in decimal by hand. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ir/ir.h"

static int i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
	return kiln_num_i64_parse(s, strlen(s), lo, hi, out);
}

static int u64(const char *s, uint64_t *out)
{
	return kiln_num_u64_parse(s, strlen(s), 0, UINT64_MAX, out);
}

static int f64(const char *s, double *out)
{
	return kiln_num_f64_parse(s, strlen(s), -DBL_MAX, DBL_MAX, out);
}

Test(text, integers_are_decimal_digits_with_an_optional_sign)
{
	int64_t v = 0;
	cr_assert_eq(i64("42", INT64_MIN, INT64_MAX, &v), KILN_NUM_OK);
	cr_assert_eq(v, 42);
	cr_assert_eq(i64("+7", INT64_MIN, INT64_MAX, &v), KILN_NUM_OK);
	cr_assert_eq(v, 7);
	cr_assert_eq(i64("007", INT64_MIN, INT64_MAX, &v), KILN_NUM_OK);
	cr_assert_eq(v, 7, "leading zeros are decimal, not octal");
	cr_assert_eq(i64("-9223372036854775808", INT64_MIN, INT64_MAX, &v), KILN_NUM_OK);
	cr_assert_eq(v, INT64_MIN);
	cr_assert_eq(i64("9223372036854775807", INT64_MIN, INT64_MAX, &v), KILN_NUM_OK);
	cr_assert_eq(v, INT64_MAX);
	/* Not integers as kiln writes them: the value is left alone. */
	v = 99;
	const char *bad[] = {"",    "+",   "-",     " 1",    "1 ",  "\t1", "1\n", "0x10", "010e1",
	                     "1e3", "1.0", "1_000", "1,000", "--1", "inf", "nan", "١"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_assert_eq(i64(bad[i], INT64_MIN, INT64_MAX, &v), KILN_NUM_SYNTAX, "'%s'",
		             bad[i]);
	cr_assert_eq(v, 99);
	/* Written right, but outside the type or the range. */
	cr_assert_eq(i64("9223372036854775808", INT64_MIN, INT64_MAX, &v), KILN_NUM_RANGE);
	cr_assert_eq(i64("-9223372036854775809", INT64_MIN, INT64_MAX, &v), KILN_NUM_RANGE);
	cr_assert_eq(i64("99999999999999999999999999", INT64_MIN, INT64_MAX, &v), KILN_NUM_RANGE);
	cr_assert_eq(i64("0", 1, 100000000, &v), KILN_NUM_RANGE);
	cr_assert_eq(i64("100000001", 1, 100000000, &v), KILN_NUM_RANGE);
	cr_assert_eq(i64("100000000", 1, 100000000, &v), KILN_NUM_OK);
	cr_assert_eq(v, 100000000);
	/* Only len bytes are read: "12" of "123". */
	cr_assert_eq(kiln_num_i64_parse("123", 2, 0, 1000, &v), KILN_NUM_OK);
	cr_assert_eq(v, 12);
}

Test(text, unsigned_integers_reach_2_to_the_64)
{
	uint64_t v = 0;
	cr_assert_eq(u64("18446744073709551615", &v), KILN_NUM_OK);
	cr_assert_eq(v, UINT64_MAX);
	cr_assert_eq(u64("18446744073709551616", &v), KILN_NUM_RANGE);
	cr_assert_eq(u64("-1", &v), KILN_NUM_RANGE, "negative: written right, below the range");
	cr_assert_eq(u64("-0", &v), KILN_NUM_OK);
	cr_assert_eq(v, 0);
	cr_assert_eq(u64(" 5", &v), KILN_NUM_SYNTAX);
	cr_assert_eq(kiln_num_u64_parse("5", 1, 6, 10, &v), KILN_NUM_RANGE);
}

Test(text, decimals_are_decimal_notation_only)
{
	double v = 0;
	cr_assert_eq(f64("2.5e-1", &v), KILN_NUM_OK);
	cr_assert_eq(v, 0.25);
	cr_assert_eq(f64(".5", &v), KILN_NUM_OK);
	cr_assert_eq(v, 0.5);
	cr_assert_eq(f64("5.", &v), KILN_NUM_OK);
	cr_assert_eq(v, 5.0);
	cr_assert_eq(f64("-3", &v), KILN_NUM_OK);
	cr_assert_eq(v, -3.0);
	cr_assert_eq(f64("1E2", &v), KILN_NUM_OK);
	cr_assert_eq(v, 100.0);
	/* -0 is 0: its sign bit is cleared (docs/cli.md, "Numbers"). */
	const char *zeros[] = {"-0", "-0.0", "-0e5", "-.0"};
	for (size_t i = 0; i < sizeof zeros / sizeof zeros[0]; i++) {
		cr_assert_eq(f64(zeros[i], &v), KILN_NUM_OK, "'%s'", zeros[i]);
		cr_assert(v == 0 && !signbit(v), "'%s' read as %g", zeros[i], v);
	}
	v = 7;
	const char *bad[] = {"",      ".",    "e5",   "1e",   "1e+", " 1.5", "1.5 ",
	                     "0x1p1", "0X10", "inf",  "-inf", "nan", "NaN",  "infinity",
	                     ".inf",  "1,5",  "1.5f", "1..5", "+-1", "1e5.5"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_assert_eq(f64(bad[i], &v), KILN_NUM_SYNTAX, "'%s'", bad[i]);
	cr_assert_eq(v, 7);
	cr_assert_eq(f64("1e999", &v), KILN_NUM_RANGE, "overflows a double");
	cr_assert_eq(kiln_num_f64_parse("1000001", 7, 0, 1e6, &v), KILN_NUM_RANGE);
	cr_assert_eq(kiln_num_f64_parse("-0.5", 4, 0, 1e6, &v), KILN_NUM_RANGE);
	/* "1." of "1.5": the copy stops at len. */
	cr_assert_eq(kiln_num_f64_parse("1.5", 2, 0, 10, &v), KILN_NUM_OK);
	cr_assert_eq(v, 1.0);
	/* At most 256 characters: 0.000...1 with 254 zeros after the point is
	 * 257 characters. */
	char longnum[300] = "0.";
	memset(longnum + 2, '0', 254);
	longnum[256] = '1';
	longnum[257] = '\0';
	cr_assert_eq(f64(longnum, &v), KILN_NUM_SYNTAX);
	longnum[255] = '1';
	longnum[256] = '\0';
	cr_assert_eq(f64(longnum, &v), KILN_NUM_OK, "256 characters");
}

Test(text, byte_counts_take_binary_suffixes)
{
	uint64_t v = 0;
	struct {
		const char *s;
		uint64_t want;
	} ok[] = {{"0", 0},
	          {"1073741824", 1073741824},
	          {"3M", 3u << 20},
	          {"3MiB", 3u << 20},
	          {"3MB", 3u << 20},
	          {"12G", (uint64_t)12 << 30},
	          {"1KiB", 1024},
	          {"5B", 5},
	          {"2T", (uint64_t)2 << 40},
	          /* 2^64 - 2^30, the largest G count: */
	          {"17179869183G", UINT64_MAX - ((uint64_t)1 << 30) + 1}};
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		cr_assert_eq(kiln_num_bytes_parse(ok[i].s, strlen(ok[i].s), &v), KILN_NUM_OK, "%s",
		             ok[i].s);
		cr_assert_eq(v, ok[i].want, "%s", ok[i].s);
	}
	const char *bad[] = {"",    "G",  "1k",   "1g",   "1 G", " 1G",  "1G ",
	                     "+1G", "-1", "1.5G", "0x10", "1P",  "1GiBB"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_assert_eq(kiln_num_bytes_parse(bad[i], strlen(bad[i]), &v), KILN_NUM_SYNTAX,
		             "'%s'", bad[i]);
	/* 2^34 G = 2^64 bytes, one past the largest. */
	cr_assert_eq(kiln_num_bytes_parse("17179869184G", 12, &v), KILN_NUM_RANGE);
	cr_assert_eq(kiln_num_bytes_parse("18446744073709551616", 20, &v), KILN_NUM_RANGE);
}

static const char *esc(const char *s, size_t len, size_t cap, char *buf)
{
	return kiln_text_escape(s, len, cap, buf);
}

Test(text, control_characters_and_invalid_utf8_are_escaped)
{
	char buf[256];
	/* An OSC sequence that would retitle a terminal: ESC ] 0 ; ... BEL. */
	const char osc[] = "\x1b]0;title\x07";
	cr_assert_str_eq(esc(osc, sizeof osc - 1, sizeof buf, buf), "\\x1b]0;title\\x07");
	cr_assert_str_eq(esc("a\nb\tc\rd\x7f", 8, sizeof buf, buf), "a\\x0ab\\x09c\\x0dd\\x7f");
	/* A NUL inside the text is shown, not an end. */
	cr_assert_str_eq(esc("a\0b", 3, sizeof buf, buf), "a\\x00b");
	/* Backslashes are doubled, so an escape in the output is always ours. */
	cr_assert_str_eq(esc("a\\x1b", 5, sizeof buf, buf), "a\\\\x1b");
	/* Valid UTF-8 stays: e-acute (C3 A9), the euro sign (E2 82 AC), U+1F600
	 * (F0 9F 98 80). */
	const char utf8[] = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
	cr_assert_str_eq(esc(utf8, sizeof utf8 - 1, sizeof buf, buf), utf8);
	/* C1 controls are valid UTF-8 but control a terminal: U+009B (CSI),
	 * U+0085 (NEL). */
	cr_assert_str_eq(esc("\xc2\x9b"
	                     "2J",
	                     4, sizeof buf, buf),
	                 "\\xc2\\x9b2J");
	cr_assert_str_eq(esc("\xc2\x85", 2, sizeof buf, buf), "\\xc2\\x85");
	/* U+00A0, the first character after the C1 block, stays. */
	cr_assert_str_eq(esc("\xc2\xa0", 2, sizeof buf, buf), "\xc2\xa0");
	/* Invalid UTF-8: a lone continuation byte, a truncated sequence, an
	 * overlong '/', a surrogate (U+D800), a code point past U+10FFFF,
	 * bytes that never occur. */
	cr_assert_str_eq(esc("\x80", 1, sizeof buf, buf), "\\x80");
	cr_assert_str_eq(esc("\xe2\x82", 2, sizeof buf, buf), "\\xe2\\x82");
	cr_assert_str_eq(esc("\xc0\xaf", 2, sizeof buf, buf), "\\xc0\\xaf");
	cr_assert_str_eq(esc("\xed\xa0\x80", 3, sizeof buf, buf), "\\xed\\xa0\\x80");
	cr_assert_str_eq(esc("\xf4\x90\x80\x80", 4, sizeof buf, buf), "\\xf4\\x90\\x80\\x80");
	cr_assert_str_eq(esc("\xfe\xff", 2, sizeof buf, buf), "\\xfe\\xff");
}

Test(text, escaped_text_that_does_not_fit_is_cut_and_says_so)
{
	char buf[8];
	/* 7 characters and the NUL fit in 8 bytes. */
	cr_assert_str_eq(esc("abcdefg", 7, sizeof buf, buf), "abcdefg");
	/* 8 do not: 4 characters, "..." and the NUL. */
	cr_assert_str_eq(esc("abcdefgh", 8, sizeof buf, buf), "abcd...");
	/* An escape is never cut in half: "ab" + "\x1b" is 6 bytes, and with
	 * "cd" after it 8, which does not fit; "ab..." does. */
	cr_assert_str_eq(esc("ab\x1b"
	                     "cd",
	                     5, sizeof buf, buf),
	                 "ab...");
	/* Nor is a UTF-8 character: "ab" + U+20AC (3 bytes) + "cde". */
	cr_assert_str_eq(esc("a\xe2\x82\xac"
	                     "bcdef",
	                     9, sizeof buf, buf),
	                 "a\xe2\x82\xac...");
}

Test(text, control_characters_are_found)
{
	uint32_t cp = 0;
	cr_assert(!kiln_text_has_control("plain name", 10, &cp));
	cr_assert(!kiln_text_has_control("caf\xc3\xa9 \xc2\xa0", 8, &cp));
	cr_assert(kiln_text_has_control("a\x1b]0", 4, &cp));
	cr_assert_eq(cp, 0x1b);
	cr_assert(kiln_text_has_control("tab\there", 8, &cp));
	cr_assert_eq(cp, 0x09);
	cr_assert(kiln_text_has_control("del\x7f", 4, &cp));
	cr_assert_eq(cp, 0x7f);
	cr_assert(kiln_text_has_control("x\xc2\x9b", 3, &cp));
	cr_assert_eq(cp, 0x9b);
	cr_assert(kiln_text_has_control("a\0b", 3, &cp));
	cr_assert_eq(cp, 0);
}
