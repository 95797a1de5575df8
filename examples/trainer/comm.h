/* examples/trainer/comm.h: the trainer's communication, the only file that
 * calls MPI (comm.c).
 *
 * World ranks are laid out stage-major: rank = stage * ndp + dp. The ranks of
 * one stage form its expert-parallel group, which is also its data-parallel
 * group (ep == dp): the EP all-to-alls and the gradient all-reduce of the
 * replicated weights run inside it. Pipeline transfers go between the same
 * dp index of neighbouring stages. Every call either succeeds or aborts the
 * whole job with a message (an MPI error is not recoverable in a trainer). */
#ifndef KILN_TRAINER_COMM_H
#define KILN_TRAINER_COMM_H

#include <stddef.h>
#include <stdint.h>

typedef struct tr_comm tr_comm;

typedef struct tr_comm_info {
	int rank, world; /* in MPI_COMM_WORLD */
	int stage, pp;   /* pipeline stage of this rank, and stages */
	int dp, ndp;     /* index in the stage's EP/DP group, and its size */
} tr_comm_info;

/* Starts MPI and splits the world into pp stages; when pp does not divide
 * the world size, info.ndp is 0 and only tr_comm_abort and tr_comm_finish
 * may follow. NULL when out of memory. Owned; release with tr_comm_finish. */
tr_comm *tr_comm_start(int *argc, char ***argv, int pp);
void tr_comm_info_get(const tr_comm *c, tr_comm_info *out);

/* Pipeline transfers of n floats: sends are non-blocking (the data is copied
 * into a buffer the handle owns until tr_comm_wait_sends), receives block.
 * dir > 0: to/from the next stage, dir < 0: the previous one. */
void tr_comm_send(tr_comm *c, int dir, const float *buf, size_t n, int tag);
void tr_comm_recv(tr_comm *c, int dir, float *buf, size_t n, int tag);
/* Completes and frees every pending send. */
void tr_comm_wait_sends(tr_comm *c);

/* Inside the stage group: every rank sends per_rank ints to each rank. */
void tr_comm_alltoall_int(tr_comm *c, const int32_t *send, int32_t *recv, int per_rank);
/* Inside the stage group: every rank's v, in rank order, into out (ndp
 * entries): the count exchange that tells every rank of the EP group how
 * many rows each rank receives (as Megatron-Core all-gathers its per-expert
 * counts over the EP group; docs/trainer.md). */
void tr_comm_allgather_u32(tr_comm *c, uint32_t v, uint32_t *out);
/* Inside the stage group: rank r receives scount[r] floats from this rank,
 * packed rank by rank in send; recv is packed likewise by rcount. */
void tr_comm_alltoallv(tr_comm *c, const float *send, const int32_t *scount, float *recv,
                       const int32_t *rcount);
/* Inside the stage group: buf = the sum over its ranks (in place). */
void tr_comm_allreduce_sum(tr_comm *c, float *buf, size_t n);

/* World gathers to rank 0 (out is read on rank 0 only, world entries). */
void tr_comm_gather_u64(tr_comm *c, uint64_t v, uint64_t *out);
void tr_comm_gather_double(tr_comm *c, double v, double *out);
/* World-wide maximum and sum. */
double tr_comm_max(tr_comm *c, double v);
double tr_comm_sum(tr_comm *c, double v);
void tr_comm_barrier(tr_comm *c);

/* Stops every rank of the job with exit status code (after the caller has
 * printed why). Does not return. */
_Noreturn void tr_comm_abort(tr_comm *c, int code);
/* Finalises MPI and frees c. */
void tr_comm_finish(tr_comm *c);

#endif
