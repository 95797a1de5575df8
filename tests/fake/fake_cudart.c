/* tests/fake/fake_cudart.c: a stand-in for libcudart, for tests/test_copy.c.
 *
 * Built as a shared library (CMakeLists.txt, last block) and loaded by the
 * copy engine's CUDA backend through kiln_copy_config.library. It exports
 * the cuda* functions runtime/gpu_symbols.def lists, except the optional
 * cudaGetErrorString, over host memory: "device" pointers are host
 * pointers, copies are memcpy. Streams are a single global queue of
 * operations in issue order (which respects every stream's order and every
 * event wait), run at once, or, while held, only when a synchronize call or
 * fake_cudart_release asks. Knobs (fake_cudart_*) set the device count,
 * hold copies, make the nth call of a function fail, and count what is
 * live so that tests can check the engine releases everything.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OK = 0, NO_DEVICE = 100, INVALID_VALUE = 1, NOT_READY = 600 };

/* The CUDA runtime API, as gpu_symbols.def declares it. */
int cudaGetDeviceCount(int *count);
int cudaGetDevice(int *device);
int cudaSetDevice(int device);
int cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags);
int cudaFreeHost(void *ptr);
int cudaStreamCreateWithFlags(void **stream, unsigned int flags);
int cudaStreamDestroy(void *stream);
int cudaStreamSynchronize(void *stream);
int cudaStreamWaitEvent(void *stream, void *event, unsigned int flags);
int cudaMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, void *stream);
int cudaEventCreateWithFlags(void **event, unsigned int flags);
int cudaEventRecord(void *event, void *stream);
int cudaEventQuery(void *event);
int cudaEventSynchronize(void *event);
int cudaEventDestroy(void *event);

/* Knobs for the tests. */
void fake_cudart_reset(int devices, int held);
void fake_cudart_fail(const char *fn, int nth, int code);
void fake_cudart_release(void);
void fake_cudart_counts(int *live_streams, int *live_events, int *live_host, int *wait_events);
int fake_cudart_pending(void);

typedef struct fake_event {
	uint64_t recorded; /* op number of its latest record, 0: never */
	uint64_t reached;  /* op number of the latest record that ran */
} fake_event;

typedef struct op {
	void *dst;
	const void *src;
	size_t bytes;
	fake_event *ev; /* a record when set, else a copy */
	uint64_t number;
} op;

#define MAX_OPS 65536

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int n_devices = 1; /* < 0: cudaGetDeviceCount fails with NO_DEVICE */
static int held;
static op ops[MAX_OPS];
static size_t ops_head, ops_len;
static uint64_t ops_issued;
static int live_streams, live_events, live_host, wait_events;
static char fail_fn[64];
static int fail_nth, fail_code;
static _Thread_local int current_device;

/* The injected failure for fn, or OK. Called with mu held. */
static int injected(const char *fn)
{
	if (fail_nth > 0 && strcmp(fn, fail_fn) == 0 && --fail_nth == 0)
		return fail_code;
	return OK;
}

#define INJECT(fn)                                                                                 \
	do {                                                                                       \
		int injected_rc_ = injected(fn);                                                   \
		if (injected_rc_ != OK) {                                                          \
			pthread_mutex_unlock(&mu);                                                 \
			return injected_rc_;                                                       \
		}                                                                                  \
	} while (0)

/* Runs queued operations up to op number upto (all: UINT64_MAX). */
static void run_until(uint64_t upto)
{
	while (ops_len > 0 && ops[ops_head].number <= upto) {
		op *o = &ops[ops_head];
		if (o->ev) {
			if (o->ev->recorded == o->number)
				o->ev->reached = o->number;
		} else if (o->bytes) {
			memcpy(o->dst, o->src, o->bytes);
		}
		ops_head = (ops_head + 1) % MAX_OPS;
		ops_len--;
	}
}

static int push(void *dst, const void *src, size_t bytes, fake_event *ev)
{
	if (ops_len == MAX_OPS)
		return INVALID_VALUE;
	op *o = &ops[(ops_head + ops_len) % MAX_OPS];
	*o = (op){.dst = dst, .src = src, .bytes = bytes, .ev = ev, .number = ++ops_issued};
	ops_len++;
	if (ev)
		ev->recorded = o->number;
	if (!held)
		run_until(UINT64_MAX);
	return OK;
}

void fake_cudart_reset(int devices, int hold)
{
	pthread_mutex_lock(&mu);
	run_until(UINT64_MAX);
	n_devices = devices;
	held = hold;
	fail_nth = 0;
	wait_events = 0;
	current_device = 0;
	pthread_mutex_unlock(&mu);
}

void fake_cudart_fail(const char *fn, int nth, int code)
{
	pthread_mutex_lock(&mu);
	strncpy(fail_fn, fn, sizeof fail_fn - 1);
	fail_nth = nth;
	fail_code = code;
	pthread_mutex_unlock(&mu);
}

void fake_cudart_release(void)
{
	pthread_mutex_lock(&mu);
	run_until(UINT64_MAX);
	pthread_mutex_unlock(&mu);
}

void fake_cudart_counts(int *streams, int *events, int *host, int *waits)
{
	pthread_mutex_lock(&mu);
	*streams = live_streams;
	*events = live_events;
	*host = live_host;
	*waits = wait_events;
	pthread_mutex_unlock(&mu);
}

int fake_cudart_pending(void)
{
	pthread_mutex_lock(&mu);
	int n = (int)ops_len;
	pthread_mutex_unlock(&mu);
	return n;
}

int cudaGetDeviceCount(int *count)
{
	pthread_mutex_lock(&mu);
	INJECT("cudaGetDeviceCount");
	int n = n_devices;
	pthread_mutex_unlock(&mu);
	*count = n < 0 ? 0 : n;
	return n < 0 ? NO_DEVICE : OK;
}

int cudaGetDevice(int *device)
{
	pthread_mutex_lock(&mu);
	INJECT("cudaGetDevice");
	pthread_mutex_unlock(&mu);
	*device = current_device;
	return OK;
}

int cudaSetDevice(int device)
{
	pthread_mutex_lock(&mu);
	INJECT("cudaSetDevice");
	int ok = device >= 0 && device < n_devices;
	pthread_mutex_unlock(&mu);
	if (!ok)
		return INVALID_VALUE;
	current_device = device;
	return OK;
}

int cudaHostAlloc(void **ptr, size_t bytes, unsigned int flags)
{
	(void)flags;
	pthread_mutex_lock(&mu);
	INJECT("cudaHostAlloc");
	*ptr = malloc(bytes);
	live_host += *ptr != NULL;
	pthread_mutex_unlock(&mu);
	return *ptr ? OK : 2 /* cudaErrorMemoryAllocation */;
}

int cudaFreeHost(void *ptr)
{
	pthread_mutex_lock(&mu);
	live_host -= ptr != NULL;
	pthread_mutex_unlock(&mu);
	free(ptr);
	return OK;
}

int cudaStreamCreateWithFlags(void **stream, unsigned int flags)
{
	(void)flags;
	pthread_mutex_lock(&mu);
	INJECT("cudaStreamCreateWithFlags");
	*stream = malloc(1);
	live_streams += *stream != NULL;
	pthread_mutex_unlock(&mu);
	return *stream ? OK : 2;
}

int cudaStreamDestroy(void *stream)
{
	pthread_mutex_lock(&mu);
	live_streams--;
	pthread_mutex_unlock(&mu);
	free(stream);
	return OK;
}

int cudaStreamSynchronize(void *stream)
{
	(void)stream;
	pthread_mutex_lock(&mu);
	INJECT("cudaStreamSynchronize");
	run_until(UINT64_MAX);
	pthread_mutex_unlock(&mu);
	return OK;
}

int cudaStreamWaitEvent(void *stream, void *event, unsigned int flags)
{
	(void)stream;
	(void)event;
	pthread_mutex_lock(&mu);
	INJECT("cudaStreamWaitEvent");
	/* One global queue in issue order already runs the record first. */
	wait_events += flags == 0;
	pthread_mutex_unlock(&mu);
	return flags == 0 ? OK : INVALID_VALUE;
}

int cudaMemcpyAsync(void *dst, const void *src, size_t bytes, int kind, void *stream)
{
	(void)stream;
	pthread_mutex_lock(&mu);
	INJECT("cudaMemcpyAsync");
	int rc = kind == 1 || kind == 2 ? push(dst, src, bytes, NULL) : INVALID_VALUE;
	pthread_mutex_unlock(&mu);
	return rc;
}

int cudaEventCreateWithFlags(void **ev, unsigned int flags)
{
	(void)flags;
	pthread_mutex_lock(&mu);
	INJECT("cudaEventCreateWithFlags");
	*ev = calloc(1, sizeof(fake_event));
	live_events += *ev != NULL;
	pthread_mutex_unlock(&mu);
	return *ev ? OK : 2;
}

int cudaEventRecord(void *ev, void *stream)
{
	(void)stream;
	pthread_mutex_lock(&mu);
	INJECT("cudaEventRecord");
	int rc = push(NULL, NULL, 0, ev);
	pthread_mutex_unlock(&mu);
	return rc;
}

int cudaEventQuery(void *ev)
{
	fake_event *e = ev;
	pthread_mutex_lock(&mu);
	INJECT("cudaEventQuery");
	int rc = e->reached == e->recorded ? OK : NOT_READY;
	pthread_mutex_unlock(&mu);
	return rc;
}

int cudaEventSynchronize(void *ev)
{
	fake_event *e = ev;
	pthread_mutex_lock(&mu);
	INJECT("cudaEventSynchronize");
	run_until(e->recorded);
	pthread_mutex_unlock(&mu);
	return OK;
}

int cudaEventDestroy(void *ev)
{
	pthread_mutex_lock(&mu);
	live_events--;
	pthread_mutex_unlock(&mu);
	free(ev);
	return OK;
}
