/* runtime/crc32c.c: CRC32C (Castagnoli).
 *
 * kiln_rt_open checks the whole blob once, so this is on the open path only.
 * On x86-64 with SSE4.2 the crc32 instruction computes exactly this CRC
 * (about 10x the table's speed, which the exhaustive corruption tests
 * notice); elsewhere a 256-entry table built at compile time from the
 * polynomial does it bytewise. */
#include <string.h>

#include "internal.h"

#define P 0x82F63B78u
#define B1(c) (((c) >> 1) ^ (((c)&1u) ? P : 0u))
#define B2(c) B1(B1(c))
#define B4(c) B2(B2(c))
#define B8(c) B4(B4(c))
#define T1(i) B8((uint32_t)(i))
#define T4(i) T1(i), T1((i) + 1), T1((i) + 2), T1((i) + 3)
#define T16(i) T4(i), T4((i) + 4), T4((i) + 8), T4((i) + 12)
#define T64(i) T16(i), T16((i) + 16), T16((i) + 32), T16((i) + 48)

static const uint32_t table[256] = {T64(0), T64(64), T64(128), T64(192)};

static uint32_t crc_table(uint32_t crc, const unsigned char *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		crc = table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
	return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const unsigned char *p,
                                                            size_t len)
{
	uint64_t c = crc;
	for (; len >= 8; p += 8, len -= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		c = __builtin_ia32_crc32di(c, v);
	}
	crc = (uint32_t)c;
	for (; len; p++, len--)
		crc = __builtin_ia32_crc32qi(crc, *p);
	return crc;
}

static int have_sse42(void)
{
	static int known = -1; /* a benign race: every thread computes the same value */
	if (known < 0) {
		__builtin_cpu_init();
		known = __builtin_cpu_supports("sse4.2") ? 1 : 0;
	}
	return known;
}
#endif

uint32_t kiln_rti_crc32c(uint32_t crc, const void *data, size_t len)
{
	crc = ~crc;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	if (have_sse42())
		return ~crc_sse42(crc, data, len);
#endif
	return ~crc_table(crc, data, len);
}

/* Exposed for the tests, which check both paths against each other. */
uint32_t kiln_rti_crc32c_portable(uint32_t crc, const void *data, size_t len)
{
	return ~crc_table(~crc, data, len);
}
