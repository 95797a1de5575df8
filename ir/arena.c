/* ir/arena.c: one bump allocator per compilation, freed whole. */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

#define ARENA_CHUNK_BYTES (64u * 1024u)
#define ARENA_MAX_ALLOC ((size_t)1 << 30)

typedef struct chunk {
	struct chunk *next;
	size_t size; /* usable bytes after the header */
	size_t used;
	_Alignas(16) unsigned char data[];
} chunk;

struct kiln_arena {
	chunk *head;
	size_t used;
};

kiln_arena *kiln_arena_new(void)
{
	return calloc(1, sizeof(kiln_arena));
}

void *kiln_arena_alloc(kiln_arena *a, size_t bytes)
{
	if (!a || bytes > ARENA_MAX_ALLOC)
		return NULL;
	size_t need = (bytes + 15u) & ~(size_t)15u;
	if (need == 0)
		need = 16;
	chunk *c = a->head;
	if (!c || c->size - c->used < need) {
		size_t size = need > ARENA_CHUNK_BYTES ? need : ARENA_CHUNK_BYTES;
		c = malloc(sizeof(chunk) + size);
		if (!c)
			return NULL;
		c->size = size;
		c->used = 0;
		/* A big one-off allocation goes behind the current chunk so the
		 * current chunk's free space is not wasted. */
		if (a->head && size > ARENA_CHUNK_BYTES) {
			c->next = a->head->next;
			a->head->next = c;
		} else {
			c->next = a->head;
			a->head = c;
		}
	}
	void *p = c->data + c->used;
	c->used += need;
	a->used += need;
	memset(p, 0, need);
	return p;
}

char *kiln_arena_strndup(kiln_arena *a, const char *s, size_t len)
{
	if (len >= ARENA_MAX_ALLOC)
		return NULL;
	char *p = kiln_arena_alloc(a, len + 1);
	if (p) {
		memcpy(p, s, len);
		p[len] = '\0';
	}
	return p;
}

char *kiln_arena_strdup(kiln_arena *a, const char *s)
{
	return kiln_arena_strndup(a, s, strlen(s));
}

size_t kiln_arena_used(const kiln_arena *a)
{
	return a ? a->used : 0;
}

void kiln_arena_free(kiln_arena *a)
{
	if (!a)
		return;
	chunk *c = a->head;
	while (c) {
		chunk *next = c->next;
		free(c);
		c = next;
	}
	free(a);
}
