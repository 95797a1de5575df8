/* examples/trainer/arena.h: the trainer's device memory for activations.
 *
 * A capped arena: every allocation is counted to the byte, by micro-batch,
 * and one that would take the total over the cap fails (the caller reports
 * an out-of-memory failure, as a GPU allocator would). It holds exactly what
 * the cost model calls activations: each layer's saved tensors (the plan's
 * units), the head's saved tensors, and during backward the tensors a plan
 * brings back (reloaded or recomputed) with the recompute workspace. Weights,
 * gradients and per-op scratch live in ordinary host memory, as the cost
 * model counts them apart (static bytes) or not at all. Storage comes from
 * malloc, so a fragmented free list never fails an allocation the count
 * allows: the cap is on bytes held, the quantity kiln plans. Each block
 * has guard bytes past its end and starts filled with a marker, so the
 * trainer checks that every tensor fills its block exactly, no more. */
#ifndef KILN_TRAINER_ARENA_H
#define KILN_TRAINER_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define TR_ARENA_MB_SLOTS 64

typedef struct tr_arena {
	uint64_t cap_bytes;
	uint64_t used_bytes, peak_bytes;
	uint64_t mb_bytes[TR_ARENA_MB_SLOTS]; /* held per micro-batch slot */
	uint64_t n_allocs;
} tr_arena;

void tr_arena_init(tr_arena *a, uint64_t cap_bytes);
/* bytes for micro-batch mb, or NULL when the cap (or malloc) refuses:
 * nothing is counted then. Owned by the caller until tr_arena_free. */
void *tr_arena_alloc(tr_arena *a, uint32_t mb, uint64_t bytes);
/* Releases p (NULL allowed), bytes and mb as given to tr_arena_alloc.
 * Returns -1 when something wrote past the end of the block (its guard
 * bytes changed), else 0. */
int tr_arena_free(tr_arena *a, uint32_t mb, void *p, uint64_t bytes);
/* New blocks are filled with 0xFF bytes, a NaN no arithmetic produces: the
 * number of 4-byte words of p still holding it, so that a caller can check
 * that a tensor filled its block exactly. */
uint64_t tr_arena_unwritten(const void *p, uint64_t bytes);
/* Bytes the cap still allows. */
uint64_t tr_arena_free_bytes(const tr_arena *a);

#endif
