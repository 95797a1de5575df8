/* runtime/copy.c: the copy engine: buffers, pool, tickets, host backend.
 *
 * The bookkeeping every backend shares lives here; copy_gpu.c only moves
 * bytes for HIP and CUDA. docs/copy-engine.md has the contract. A buffer's
 * life:
 *
 *   FREE --offload--> OFFLOADING --offload done--> OFFLOADED --drop--> FREE
 *                          |                           |
 *                          +--------reload-------------+
 *                                      |
 *                                      v
 *                                  RELOADING --reload done--> FREE
 *
 * Buffer b owns two request slots, 2b for its offload and 2b + 1 for its
 * reload. A buffer has at most one of each in flight, so the request table
 * (2 * max_buffers slots) cannot overflow and needs no free list. A ticket
 * is seq * n_slots + slot, seq counting requests from 1: tickets increase,
 * are never 0, and name their slot without a search. A slot is reused only
 * after its request has finished, so a ticket whose slot holds a later seq
 * has finished.
 *
 * The pool is first-fit over the live buffers kept in address order (a
 * doubly linked list through the buffer table): free space is the gaps
 * between them, so releasing a buffer merges its range with its neighbours'
 * free space with no extra work, and the table of max_buffers entries made
 * at open is the allocator's whole state.
 *
 * The host backend queues requests on a ring (n_slots entries, FIFO) that
 * one worker thread empties, copying with the mutex released. The GPU
 * backends issue each copy at once on the vendor stream of its direction
 * and learn completion by polling or waiting on the request's event.
 */
#include <pthread.h>
#include <string.h>

#include "internal.h"

#define ALIGN_BYTES 256u
#define DEFAULT_BUFFERS 1024u
#define MAX_BUFFERS (1u << 20)
#define NIL UINT32_MAX

enum { BUF_FREE, BUF_OFFLOADING, BUF_OFFLOADED, BUF_RELOADING };

typedef struct buffer {
	size_t off;          /* pool offset, bytes */
	size_t span;         /* pool bytes reserved: bytes rounded up to ALIGN_BYTES */
	size_t bytes;        /* bytes offloaded */
	uint32_t prev, next; /* live: neighbours in address order; free: next free */
	uint32_t gen;        /* generation, the high bits of the buffer's id */
	int state;           /* BUF_* */
} buffer;

typedef struct request {
	uint64_t seq; /* of the slot's latest request; 0: never used */
	void *dst;
	const void *src;
	int result; /* once done: 0 or a KILN_RT_E* code */
	int done;
} request;

struct kiln_copy {
	kiln_copy_backend backend;
	pthread_mutex_t mu;
	pthread_cond_t done_cv; /* host: a request finished */
	pthread_cond_t work_cv; /* host: the ring is not empty, or close began */
	int n_sync;             /* pthread objects initialised, for cleanup */
	unsigned char *pool;
	size_t pool_bytes;
	buffer *bufs;
	request *reqs;
	uint32_t *ring; /* host: slots queued, FIFO */
	uint32_t n_bufs, n_slots;
	uint32_t idx_bits; /* low id bits holding the buffer index */
	uint32_t free_head, first;
	uint32_t ring_head, ring_len;
	uint64_t seq, max_seq; /* last issued; the last that keeps tickets in range */
	int failed;            /* a copy failed: refuse new work */
	int stopping;
	int worker_started;
	pthread_t worker;
	kiln_rti_gpu *gpu;
};

static size_t round_up(size_t bytes)
{
	return (bytes + (ALIGN_BYTES - 1)) & ~(size_t)(ALIGN_BYTES - 1);
}

static const kiln_rti_gpu_vendor *vendor_of(kiln_copy_backend b)
{
	return b == KILN_COPY_HIP ? &kiln_rti_gpu_hip : &kiln_rti_gpu_cuda;
}

static int is_gpu(const kiln_copy *ce)
{
	return ce->backend != KILN_COPY_HOST;
}

/* ------------------------------------------------------------ buffers */

static uint32_t buffer_id(const kiln_copy *ce, uint32_t b)
{
	return ce->bufs[b].gen << ce->idx_bits | b;
}

/* The buffer named by id: KILN_RT_EINVAL for an id this engine never
 * issues, KILN_RT_ESTATE for one that names no live buffer (released, or
 * not yet offloaded). */
static int buffer_of(const kiln_copy *ce, uint32_t id, uint32_t *out)
{
	uint32_t b = id & ((1u << ce->idx_bits) - 1);
	uint32_t gen = id >> ce->idx_bits;
	if (b >= ce->n_bufs || gen == 0)
		return KILN_RT_EINVAL;
	if (ce->bufs[b].gen != gen || ce->bufs[b].state == BUF_FREE)
		return KILN_RT_ESTATE;
	*out = b;
	return 0;
}

/* First fit: the live buffer after which a range of span bytes fits (NIL:
 * at the start) and its offset. Returns 0 when no gap is large enough. */
static int pool_fit(const kiln_copy *ce, size_t span, uint32_t *out_prev, size_t *out_off)
{
	size_t cursor = 0;
	uint32_t prev = NIL;
	for (uint32_t i = ce->first; i != NIL; i = ce->bufs[i].next) {
		if (ce->bufs[i].off - cursor >= span)
			break;
		cursor = ce->bufs[i].off + ce->bufs[i].span;
		prev = i;
	}
	uint32_t next = prev == NIL ? ce->first : ce->bufs[prev].next;
	size_t end = next == NIL ? ce->pool_bytes : ce->bufs[next].off;
	if (end - cursor < span)
		return 0;
	*out_prev = prev;
	*out_off = cursor;
	return 1;
}

/* Takes a free buffer and links it after prev at off. */
static uint32_t buffer_take(kiln_copy *ce, uint32_t prev, size_t off, size_t bytes)
{
	uint32_t b = ce->free_head;
	buffer *p = &ce->bufs[b];
	ce->free_head = p->next;
	p->off = off;
	p->bytes = bytes;
	p->span = round_up(bytes);
	p->prev = prev;
	p->next = prev == NIL ? ce->first : ce->bufs[prev].next;
	if (p->next != NIL)
		ce->bufs[p->next].prev = b;
	if (prev == NIL)
		ce->first = b;
	else
		ce->bufs[prev].next = b;
	p->state = BUF_OFFLOADING;
	return b;
}

/* Unlinks b and returns it to the free list. With new_gen its id goes
 * stale; without, as when an offload is undone before its id escaped, the
 * id is simply reissued. */
static void buffer_release(kiln_copy *ce, uint32_t b, int new_gen)
{
	buffer *p = &ce->bufs[b];
	if (p->prev == NIL)
		ce->first = p->next;
	else
		ce->bufs[p->prev].next = p->next;
	if (p->next != NIL)
		ce->bufs[p->next].prev = p->prev;
	p->state = BUF_FREE;
	if (new_gen) {
		uint32_t gen_mask = UINT32_MAX >> ce->idx_bits;
		p->gen = (p->gen + 1) & gen_mask;
		if (p->gen == 0)
			p->gen = 1;
	}
	p->prev = NIL;
	p->next = ce->free_head;
	ce->free_head = b;
}

/* ------------------------------------------------------------ requests */

/* Issues the request of slot; returns its ticket. */
static kiln_copy_event request_issue(kiln_copy *ce, uint32_t slot, void *dst, const void *src)
{
	request *r = &ce->reqs[slot];
	r->seq = ++ce->seq;
	r->dst = dst;
	r->src = src;
	r->result = 0;
	r->done = 0;
	return r->seq * ce->n_slots + slot;
}

/* Marks the request of slot finished with result and moves its buffer on. */
static void request_finish(kiln_copy *ce, uint32_t slot, int result)
{
	request *r = &ce->reqs[slot];
	uint32_t b = slot >> 1;
	r->done = 1;
	r->result = result;
	if (result < 0)
		ce->failed = 1;
	if ((slot & 1) == 0) {
		if (ce->bufs[b].state == BUF_OFFLOADING)
			ce->bufs[b].state = BUF_OFFLOADED;
	} else {
		/* A reload runs after its offload (FIFO on the host, a stream
		 * wait on GPUs), so its end is the offload's too; GPU tickets
		 * can be polled out of order, so close the offload here. */
		request *o = &ce->reqs[slot - 1];
		if (!o->done)
			o->done = 1;
		buffer_release(ce, b, 1);
	}
	pthread_cond_broadcast(&ce->done_cv);
}

/* Finds ticket ev: *out_slot is its slot while the slot still holds it,
 * NIL when it finished and the slot moved on. KILN_RT_EINVAL for a ticket
 * never issued. */
static int ticket_slot(const kiln_copy *ce, kiln_copy_event ev, uint32_t *out_slot)
{
	uint64_t seq = ev / ce->n_slots;
	uint32_t slot = (uint32_t)(ev % ce->n_slots);
	if (seq == 0 || seq > ce->seq || ce->reqs[slot].seq < seq)
		return KILN_RT_EINVAL;
	*out_slot = ce->reqs[slot].seq == seq ? slot : NIL;
	return 0;
}

/* GPU: finishes slot's request if its event has completed. Returns 1 when
 * done, 0 when not yet. */
static int gpu_poll_slot(kiln_copy *ce, uint32_t slot)
{
	if (ce->reqs[slot].done)
		return 1;
	int rc = kiln_rti_gpu_poll(ce->gpu, slot);
	if (rc == 0)
		return 0;
	request_finish(ce, slot, rc < 0 ? rc : 0);
	return 1;
}

/* GPU: finishes every reload whose event has completed, freeing its buffer
 * and pool range; the host worker does this as copies end. */
static void gpu_reap(kiln_copy *ce)
{
	uint32_t next;
	for (uint32_t b = ce->first; b != NIL; b = next) {
		next = ce->bufs[b].next;
		if (ce->bufs[b].state == BUF_RELOADING)
			gpu_poll_slot(ce, 2 * b + 1);
	}
}

/* ------------------------------------------------------------ host worker */

static void *worker_main(void *arg)
{
	kiln_copy *ce = arg;
	pthread_mutex_lock(&ce->mu);
	for (;;) {
		while (ce->ring_len == 0 && !ce->stopping)
			pthread_cond_wait(&ce->work_cv, &ce->mu);
		if (ce->ring_len == 0)
			break;
		uint32_t slot = ce->ring[ce->ring_head];
		ce->ring_head = ce->ring_head + 1 == ce->n_slots ? 0 : ce->ring_head + 1;
		ce->ring_len--;
		void *dst = ce->reqs[slot].dst;
		const void *src = ce->reqs[slot].src;
		size_t bytes = ce->bufs[slot >> 1].bytes;
		/* Requests ahead of this one are done, and nobody else touches
		 * the pool range or the caller's memory until it is: copy
		 * without the lock. */
		pthread_mutex_unlock(&ce->mu);
		if (bytes)
			memcpy(dst, src, bytes);
		pthread_mutex_lock(&ce->mu);
		request_finish(ce, slot, 0);
	}
	pthread_mutex_unlock(&ce->mu);
	return NULL;
}

static void host_queue(kiln_copy *ce, uint32_t slot)
{
	uint32_t tail = ce->ring_head + ce->ring_len;
	if (tail >= ce->n_slots)
		tail -= ce->n_slots;
	ce->ring[tail] = slot;
	ce->ring_len++;
	pthread_cond_signal(&ce->work_cv);
}

/* ------------------------------------------------------------ open, close */

static void destroy(kiln_copy *ce)
{
	if (ce->n_sync > 2)
		pthread_cond_destroy(&ce->work_cv);
	if (ce->n_sync > 1)
		pthread_cond_destroy(&ce->done_cv);
	if (ce->n_sync > 0)
		pthread_mutex_destroy(&ce->mu);
	if (ce->gpu)
		kiln_rti_gpu_close(ce->gpu);
	else
		kiln_rti_free(ce->pool);
	kiln_rti_free(ce->ring);
	kiln_rti_free(ce->reqs);
	kiln_rti_free(ce->bufs);
	kiln_rti_free(ce);
}

static int setup(kiln_copy *ce, const kiln_copy_config *cfg)
{
	ce->bufs = kiln_rti_alloc(ce->n_bufs * sizeof *ce->bufs);
	ce->reqs = kiln_rti_alloc(ce->n_slots * sizeof *ce->reqs);
	if (!ce->bufs || !ce->reqs)
		return KILN_RT_ENOMEM;
	memset(ce->reqs, 0, ce->n_slots * sizeof *ce->reqs);
	for (uint32_t b = 0; b < ce->n_bufs; b++) {
		ce->bufs[b] = (buffer){.prev = NIL,
		                       .next = b + 1 < ce->n_bufs ? b + 1 : NIL,
		                       .gen = 1,
		                       .state = BUF_FREE};
	}
	ce->free_head = 0;
	ce->first = NIL;

	if (pthread_mutex_init(&ce->mu, NULL) != 0)
		return KILN_RT_ENOMEM;
	ce->n_sync = 1;
	if (pthread_cond_init(&ce->done_cv, NULL) != 0)
		return KILN_RT_ENOMEM;
	ce->n_sync = 2;
	if (pthread_cond_init(&ce->work_cv, NULL) != 0)
		return KILN_RT_ENOMEM;
	ce->n_sync = 3;

	if (is_gpu(ce))
		return kiln_rti_gpu_open(vendor_of(ce->backend), cfg, ce->pool_bytes, ce->n_slots,
		                         &ce->gpu, &ce->pool);
	ce->ring = kiln_rti_alloc(ce->n_slots * sizeof *ce->ring);
	ce->pool = kiln_rti_alloc(ce->pool_bytes);
	if (!ce->ring || !ce->pool)
		return KILN_RT_ENOMEM;
	if (pthread_create(&ce->worker, NULL, worker_main, ce) != 0)
		return KILN_RT_ENOMEM;
	ce->worker_started = 1;
	return 0;
}

int kiln_copy_open(const kiln_copy_config *cfg, kiln_copy **out)
{
	if (!out)
		return KILN_RT_EINVAL;
	*out = NULL;
	if (!cfg || cfg->pool_bytes == 0 || cfg->pool_bytes > SIZE_MAX - ALIGN_BYTES)
		return KILN_RT_EINVAL;
	if (cfg->backend != KILN_COPY_HOST && cfg->backend != KILN_COPY_HIP &&
	    cfg->backend != KILN_COPY_CUDA)
		return KILN_RT_EINVAL;
	uint32_t n_bufs = cfg->max_buffers ? cfg->max_buffers : DEFAULT_BUFFERS;
	if (n_bufs > MAX_BUFFERS)
		return KILN_RT_EINVAL;

	kiln_copy *ce = kiln_rti_alloc(sizeof *ce);
	if (!ce)
		return KILN_RT_ENOMEM;
	memset(ce, 0, sizeof *ce);
	ce->backend = cfg->backend;
	ce->pool_bytes = round_up(cfg->pool_bytes);
	ce->n_bufs = n_bufs;
	ce->n_slots = 2 * n_bufs;
	ce->idx_bits = 1;
	while ((1u << ce->idx_bits) < n_bufs)
		ce->idx_bits++;
	ce->max_seq = UINT64_MAX / ce->n_slots - 1;

	int rc = setup(ce, cfg);
	if (rc != 0) {
		destroy(ce);
		return rc;
	}
	*out = ce;
	return 0;
}

void kiln_copy_close(kiln_copy *ce)
{
	if (!ce)
		return;
	if (ce->worker_started) {
		/* The worker empties the ring before it exits. */
		pthread_mutex_lock(&ce->mu);
		ce->stopping = 1;
		pthread_cond_signal(&ce->work_cv);
		pthread_mutex_unlock(&ce->mu);
		pthread_join(ce->worker, NULL);
	}
	destroy(ce); /* GPU: waits for both streams first */
}

/* ------------------------------------------------------------ copies */

int kiln_copy_offload(kiln_copy *ce, const void *src, size_t bytes, uint32_t *out_buf,
                      kiln_copy_event *out_ev)
{
	if (!ce || !out_buf || !out_ev || (!src && bytes))
		return KILN_RT_EINVAL;
	pthread_mutex_lock(&ce->mu);
	int rc = 0;
	uint32_t prev = NIL;
	size_t off = 0;
	if (ce->failed)
		rc = KILN_RT_EBACKEND;
	else if (bytes > ce->pool_bytes || ce->seq == ce->max_seq)
		rc = KILN_RT_ENOSPC;
	else {
		int fits = ce->free_head != NIL && pool_fit(ce, round_up(bytes), &prev, &off);
		if (!fits && is_gpu(ce)) {
			gpu_reap(ce);
			fits = ce->free_head != NIL && pool_fit(ce, round_up(bytes), &prev, &off);
		}
		if (!fits || (!is_gpu(ce) && ce->ring_len == ce->n_slots))
			rc = KILN_RT_ENOSPC;
	}
	if (rc != 0) {
		pthread_mutex_unlock(&ce->mu);
		return rc;
	}

	uint32_t b = buffer_take(ce, prev, off, bytes);
	uint32_t slot = 2 * b;
	unsigned char *dst = ce->pool + off;
	if (is_gpu(ce)) {
		rc = kiln_rti_gpu_d2h(ce->gpu, dst, src, bytes, slot);
		if (rc != 0) {
			buffer_release(ce, b, 0);
			pthread_mutex_unlock(&ce->mu);
			return rc;
		}
	} else {
		host_queue(ce, slot);
	}
	*out_ev = request_issue(ce, slot, dst, src);
	*out_buf = buffer_id(ce, b);
	pthread_mutex_unlock(&ce->mu);
	return 0;
}

int kiln_copy_reload(kiln_copy *ce, uint32_t buf, void *dst, kiln_copy_event *out_ev)
{
	if (!ce || !out_ev)
		return KILN_RT_EINVAL;
	pthread_mutex_lock(&ce->mu);
	uint32_t b = NIL;
	int rc = buffer_of(ce, buf, &b);
	if (rc == 0 && ce->bufs[b].state == BUF_RELOADING)
		rc = KILN_RT_ESTATE;
	else if (rc == 0 && !dst && ce->bufs[b].bytes)
		rc = KILN_RT_EINVAL;
	else if (rc == 0 && ce->failed)
		rc = KILN_RT_EBACKEND;
	else if (rc == 0 &&
	         (ce->seq == ce->max_seq || (!is_gpu(ce) && ce->ring_len == ce->n_slots)))
		rc = KILN_RT_ENOSPC;
	if (rc != 0) {
		pthread_mutex_unlock(&ce->mu);
		return rc;
	}

	buffer *p = &ce->bufs[b];
	uint32_t slot = 2 * b + 1;
	const unsigned char *src = ce->pool + p->off;
	if (is_gpu(ce)) {
		uint32_t after = p->state == BUF_OFFLOADING ? 2 * b : KILN_RTI_GPU_NO_EVENT;
		rc = kiln_rti_gpu_h2d(ce->gpu, dst, src, p->bytes, after, slot);
		if (rc != 0) {
			pthread_mutex_unlock(&ce->mu);
			return rc;
		}
	} else {
		host_queue(ce, slot);
	}
	p->state = BUF_RELOADING;
	*out_ev = request_issue(ce, slot, dst, src);
	pthread_mutex_unlock(&ce->mu);
	return 0;
}

int kiln_copy_drop(kiln_copy *ce, uint32_t buf)
{
	if (!ce)
		return KILN_RT_EINVAL;
	pthread_mutex_lock(&ce->mu);
	uint32_t b = NIL;
	int rc = buffer_of(ce, buf, &b);
	/* A GPU offload ends unobserved: look before refusing. */
	if (rc == 0 && is_gpu(ce) && ce->bufs[b].state == BUF_OFFLOADING)
		gpu_poll_slot(ce, 2 * b);
	if (rc == 0 && ce->bufs[b].state != BUF_OFFLOADED)
		rc = KILN_RT_ESTATE;
	if (rc == 0)
		buffer_release(ce, b, 1);
	pthread_mutex_unlock(&ce->mu);
	return rc;
}

int kiln_copy_query(kiln_copy *ce, kiln_copy_event ev)
{
	if (!ce)
		return KILN_RT_EINVAL;
	pthread_mutex_lock(&ce->mu);
	uint32_t slot = NIL;
	int rc = ticket_slot(ce, ev, &slot);
	if (rc == 0 && slot == NIL)
		rc = 1;
	else if (rc == 0) {
		if (is_gpu(ce))
			gpu_poll_slot(ce, slot);
		const request *r = &ce->reqs[slot];
		rc = !r->done ? 0 : r->result < 0 ? r->result : 1;
	}
	pthread_mutex_unlock(&ce->mu);
	return rc;
}

int kiln_copy_wait(kiln_copy *ce, kiln_copy_event ev)
{
	if (!ce)
		return KILN_RT_EINVAL;
	pthread_mutex_lock(&ce->mu);
	uint32_t slot = NIL;
	int rc = ticket_slot(ce, ev, &slot);
	if (rc != 0 || slot == NIL) {
		pthread_mutex_unlock(&ce->mu);
		return rc;
	}
	uint64_t seq = ev / ce->n_slots;
	request *r = &ce->reqs[slot];
	if (!is_gpu(ce)) {
		while (r->seq == seq && !r->done)
			pthread_cond_wait(&ce->done_cv, &ce->mu);
	} else if (!r->done) {
		/* Wait outside the lock so that other threads go on; the slot
		 * may finish (even be reused) meanwhile, which only makes the
		 * vendor's wait return later. */
		pthread_mutex_unlock(&ce->mu);
		int sync = kiln_rti_gpu_sync(ce->gpu, slot);
		pthread_mutex_lock(&ce->mu);
		if (r->seq == seq && !r->done)
			request_finish(ce, slot, sync);
	}
	rc = r->seq == seq ? r->result : 0;
	pthread_mutex_unlock(&ce->mu);
	return rc;
}

/* ------------------------------------------------------------ probe */

int kiln_copy_probe(kiln_copy_backend b, const char *library, kiln_copy_probe_report *out)
{
	if (!out)
		return KILN_RT_EINVAL;
	if (b == KILN_COPY_HIP || b == KILN_COPY_CUDA)
		return kiln_rti_gpu_probe(vendor_of(b), library, out);
	memset(out, 0, sizeof *out);
	out->devices = b == KILN_COPY_HOST ? 1 : -1;
	out->status = b == KILN_COPY_HOST ? 0 : KILN_RT_EINVAL;
	return out->status;
}
