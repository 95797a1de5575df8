/* examples/trainer/comm.c: MPI for the trainer (comm.h). */
#include "comm.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tr_comm {
	tr_comm_info info;
	MPI_Comm stage_comm;
	MPI_Request *req;
	float **bufs;
	size_t n_req, cap_req;
	int *counts, *displs, *rcounts, *rdispls;
};

static _Noreturn void die(tr_comm *c, const char *what)
{
	fprintf(stderr, "kiln-trainer: rank %d: %s\n", c ? c->info.rank : -1, what);
	MPI_Abort(MPI_COMM_WORLD, 1);
	exit(1);
}

static void *xmalloc(tr_comm *c, size_t bytes)
{
	void *p = malloc(bytes ? bytes : 1);
	if (!p)
		die(c, "out of host memory");
	return p;
}

static void check(tr_comm *c, int rc, const char *call)
{
	if (rc != MPI_SUCCESS) {
		char msg[256];
		snprintf(msg, sizeof msg, "%s failed (MPI error %d)", call, rc);
		die(c, msg);
	}
}

tr_comm *tr_comm_start(int *argc, char ***argv, int pp)
{
	MPI_Init(argc, argv);
	int rank = 0, world = 1;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	tr_comm *c = calloc(1, sizeof *c);
	if (!c) {
		fprintf(stderr, "kiln-trainer: out of host memory\n");
		MPI_Abort(MPI_COMM_WORLD, 1);
		return NULL;
	}
	/* A world that pp does not divide still starts (so that --help works
	 * in a single process); the caller checks info.ndp before any transfer. */
	int ndp = pp >= 1 && world % pp == 0 ? world / pp : 0;
	c->info = (tr_comm_info){.rank = rank,
	                         .world = world,
	                         .pp = pp,
	                         .ndp = ndp,
	                         .stage = ndp ? rank / ndp : 0,
	                         .dp = ndp ? rank % ndp : rank};
	/* Errors come back as codes, so that each one is reported with its call. */
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	check(c, MPI_Comm_split(MPI_COMM_WORLD, c->info.stage, c->info.dp, &c->stage_comm),
	      "MPI_Comm_split");
	MPI_Comm_set_errhandler(c->stage_comm, MPI_ERRORS_RETURN);
	size_t n = (size_t)(ndp ? ndp : 1);
	c->counts = xmalloc(c, n * sizeof *c->counts);
	c->displs = xmalloc(c, n * sizeof *c->displs);
	c->rcounts = xmalloc(c, n * sizeof *c->rcounts);
	c->rdispls = xmalloc(c, n * sizeof *c->rdispls);
	return c;
}

void tr_comm_info_get(const tr_comm *c, tr_comm_info *out)
{
	*out = c->info;
}

static int peer(const tr_comm *c, int dir)
{
	int s = c->info.stage + (dir > 0 ? 1 : -1);
	return s * c->info.ndp + c->info.dp;
}

void tr_comm_send(tr_comm *c, int dir, const float *buf, size_t n, int tag)
{
	if (c->n_req == c->cap_req) {
		size_t cap = c->cap_req ? 2 * c->cap_req : 16;
		MPI_Request *r = realloc(c->req, cap * sizeof *r);
		if (r)
			c->req = r;
		float **b = realloc(c->bufs, cap * sizeof *b);
		if (b)
			c->bufs = b;
		if (!r || !b)
			die(c, "out of host memory");
		c->cap_req = cap;
	}
	float *copy = xmalloc(c, n * sizeof *copy);
	memcpy(copy, buf, n * sizeof *copy);
	c->bufs[c->n_req] = copy;
	check(c,
	      MPI_Isend(copy, (int)n, MPI_FLOAT, peer(c, dir), tag, MPI_COMM_WORLD,
	                &c->req[c->n_req]),
	      "MPI_Isend");
	c->n_req++;
}

void tr_comm_recv(tr_comm *c, int dir, float *buf, size_t n, int tag)
{
	check(
	    c,
	    MPI_Recv(buf, (int)n, MPI_FLOAT, peer(c, dir), tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
	    "MPI_Recv");
}

void tr_comm_wait_sends(tr_comm *c)
{
	if (c->n_req)
		check(c, MPI_Waitall((int)c->n_req, c->req, MPI_STATUSES_IGNORE), "MPI_Waitall");
	for (size_t i = 0; i < c->n_req; i++)
		free(c->bufs[i]);
	c->n_req = 0;
}

void tr_comm_alltoall_int(tr_comm *c, const int32_t *send, int32_t *recv, int per_rank)
{
	check(c,
	      MPI_Alltoall(send, per_rank, MPI_INT32_T, recv, per_rank, MPI_INT32_T, c->stage_comm),
	      "MPI_Alltoall");
}

void tr_comm_allgather_u32(tr_comm *c, uint32_t v, uint32_t *out)
{
	check(c, MPI_Allgather(&v, 1, MPI_UINT32_T, out, 1, MPI_UINT32_T, c->stage_comm),
	      "MPI_Allgather");
}

void tr_comm_alltoallv(tr_comm *c, const float *send, const int32_t *scount, float *recv,
                       const int32_t *rcount)
{
	int off = 0, roff = 0;
	for (int r = 0; r < c->info.ndp; r++) {
		c->counts[r] = scount[r];
		c->displs[r] = off;
		off += scount[r];
		c->rcounts[r] = rcount[r];
		c->rdispls[r] = roff;
		roff += rcount[r];
	}
	check(c,
	      MPI_Alltoallv(send, c->counts, c->displs, MPI_FLOAT, recv, c->rcounts, c->rdispls,
	                    MPI_FLOAT, c->stage_comm),
	      "MPI_Alltoallv");
}

void tr_comm_allreduce_sum(tr_comm *c, float *buf, size_t n)
{
	if (c->info.ndp > 1)
		check(c,
		      MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c->stage_comm),
		      "MPI_Allreduce");
}

void tr_comm_gather_u64(tr_comm *c, uint64_t v, uint64_t *out)
{
	check(c, MPI_Gather(&v, 1, MPI_UINT64_T, out, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD),
	      "MPI_Gather");
}

void tr_comm_gather_double(tr_comm *c, double v, double *out)
{
	check(c, MPI_Gather(&v, 1, MPI_DOUBLE, out, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD),
	      "MPI_Gather");
}

double tr_comm_max(tr_comm *c, double v)
{
	double r = v;
	check(c, MPI_Allreduce(&v, &r, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
	return r;
}

double tr_comm_sum(tr_comm *c, double v)
{
	double r = v;
	check(c, MPI_Allreduce(&v, &r, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
	return r;
}

void tr_comm_barrier(tr_comm *c)
{
	check(c, MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

_Noreturn void tr_comm_abort(tr_comm *c, int code)
{
	(void)c;
	fflush(stdout);
	fflush(stderr);
	MPI_Abort(MPI_COMM_WORLD, code);
	exit(code);
}

void tr_comm_finish(tr_comm *c)
{
	if (!c)
		return;
	tr_comm_wait_sends(c);
	MPI_Comm_free(&c->stage_comm);
	free(c->req);
	free(c->bufs);
	free(c->counts);
	free(c->displs);
	free(c->rcounts);
	free(c->rdispls);
	free(c);
	MPI_Finalize();
}
