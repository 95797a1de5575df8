/* examples/trainer/arena.c: the capped activation arena (arena.h). */
#include "arena.h"

#include <stdlib.h>
#include <string.h>

#define GUARD_BYTES 16
#define GUARD 0xA5
#define FRESH 0xFF

void tr_arena_init(tr_arena *a, uint64_t cap_bytes)
{
	memset(a, 0, sizeof *a);
	a->cap_bytes = cap_bytes;
}

void *tr_arena_alloc(tr_arena *a, uint32_t mb, uint64_t bytes)
{
	if (bytes > a->cap_bytes - a->used_bytes || bytes > SIZE_MAX)
		return NULL;
	unsigned char *p = malloc((size_t)bytes + GUARD_BYTES);
	if (!p)
		return NULL;
	memset(p, FRESH, (size_t)bytes);
	memset(p + bytes, GUARD, GUARD_BYTES);
	a->used_bytes += bytes;
	a->mb_bytes[mb % TR_ARENA_MB_SLOTS] += bytes;
	a->n_allocs++;
	if (a->used_bytes > a->peak_bytes)
		a->peak_bytes = a->used_bytes;
	return p;
}

int tr_arena_free(tr_arena *a, uint32_t mb, void *p, uint64_t bytes)
{
	if (!p)
		return 0;
	const unsigned char *g = (const unsigned char *)p + bytes;
	int broken = 0;
	for (int i = 0; i < GUARD_BYTES; i++)
		broken |= g[i] != GUARD;
	free(p);
	a->used_bytes -= bytes;
	a->mb_bytes[mb % TR_ARENA_MB_SLOTS] -= bytes;
	return broken ? -1 : 0;
}

uint64_t tr_arena_unwritten(const void *p, uint64_t bytes)
{
	const unsigned char *b = p;
	uint64_t n = 0;
	for (uint64_t i = 0; i + 4 <= bytes; i += 4)
		n += b[i] == FRESH && b[i + 1] == FRESH && b[i + 2] == FRESH && b[i + 3] == FRESH;
	return n;
}

uint64_t tr_arena_free_bytes(const tr_arena *a)
{
	return a->cap_bytes - a->used_bytes;
}
