/* runtime/alloc.c: the one place the runtime allocates through. */
#include <stdlib.h>

#include "internal.h"

static void *(*alloc_fn)(size_t) = malloc;
static void (*release_fn)(void *) = free;

void kiln_rt_set_allocator(void *(*alloc)(size_t bytes), void (*release)(void *p))
{
	alloc_fn = alloc ? alloc : malloc;
	release_fn = release ? release : free;
}

void *kiln_rti_alloc(size_t bytes)
{
	return alloc_fn(bytes ? bytes : 1);
}

void kiln_rti_free(void *p)
{
	if (p)
		release_fn(p);
}
