/* runtime/copy_gpu.c: the copy engine's GPU side, for HIP and CUDA alike.
 *
 * Loads the vendor's runtime library with dlopen (never linked, no vendor
 * header), resolves the functions listed in gpu_symbols.def, and keeps one
 * device's copy resources: a pinned host pool from the vendor's host
 * allocator, one non-blocking stream per direction, and one event per
 * request slot, all made at open. Every name, code and flag that differs
 * between the vendors comes from a kiln_rti_gpu_vendor (copy_hip.c,
 * copy_cuda.c); nothing here names either.
 *
 * Libraries are opened with RTLD_NODELETE: GPU runtimes start threads and
 * keep allocations from their initialisers that unmapping would orphan, so
 * dlclose drops our reference but leaves the code mapped.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

#include "internal.h"

#define REQUIRED 1
#define OPTIONAL 0

typedef struct gpu_api {
#define X(need, field, hip, cuda, ret, params) ret(*field) params;
#include "gpu_symbols.def"
#undef X
} gpu_api;

/* dlsym returns an object pointer; POSIX guarantees it converts to a
 * function pointer, which ISO C only allows through memcpy. */
_Static_assert(sizeof(void *) == sizeof(void (*)(void)), "function and object pointers differ");

struct kiln_rti_gpu {
	const kiln_rti_gpu_vendor *v;
	void *lib;
	gpu_api api;
	int device;
	unsigned char *pool;
	void *d2h, *h2d; /* streams */
	int n_streams;   /* created: d2h, then h2d */
	void **events;
	uint32_t n_events; /* created */
	int broken;        /* a stream may still hold work we lost track of */
	/* The last failing vendor call, for a debugger or a core dump: the
	 * runtime never prints. */
	_Atomic int last_error;
	_Atomic(const char *) last_error_text;
};

/* Records a failed vendor call; returns KILN_RT_EBACKEND. */
static int failed(kiln_rti_gpu *g, int code)
{
	atomic_store_explicit(&g->last_error, code, memory_order_relaxed);
	if (g->api.get_error_string)
		atomic_store_explicit(&g->last_error_text, g->api.get_error_string(code),
		                      memory_order_relaxed);
	return KILN_RT_EBACKEND;
}

/* Opens v's library (library, or each default in turn) and resolves every
 * listed symbol into *api; fills the loading half of *rep. Returns 0 with
 * *out_lib open, or KILN_RT_EUNAVAILABLE with nothing open. */
static int load(const kiln_rti_gpu_vendor *v, const char *library, void **out_lib, gpu_api *api,
                kiln_copy_probe_report *rep)
{
	const char *const one[] = {library, NULL};
	const char *const *names = library ? one : v->libraries;
	void *lib = NULL;

	memset(api, 0, sizeof *api);
	memset(rep, 0, sizeof *rep);
	rep->devices = -1;
#define X(need, field, hip, cuda, ret, params)                                                     \
	if (need == REQUIRED)                                                                      \
		rep->n_required++;                                                                 \
	else                                                                                       \
		rep->n_optional++;
#include "gpu_symbols.def"
#undef X

	for (int i = 0; names[i] && !lib; i++) {
		lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
		if (lib)
			rep->library = names[i];
	}
	if (!lib) {
		rep->status = KILN_RT_EUNAVAILABLE;
		return rep->status;
	}

	void *sym;
#define X(need, field, hip, cuda, ret, params)                                                     \
	sym = dlsym(lib, v->symbols[KILN_RTI_GPU_SYM_##field]);                                    \
	if (sym) {                                                                                 \
		memcpy(&api->field, &sym, sizeof sym);                                             \
		rep->n_resolved++;                                                                 \
	} else if (need == REQUIRED && !rep->missing) {                                            \
		rep->missing = v->symbols[KILN_RTI_GPU_SYM_##field];                               \
	}
#include "gpu_symbols.def"
#undef X

	if (rep->missing) {
		dlclose(lib);
		memset(api, 0, sizeof *api);
		rep->status = KILN_RT_EUNAVAILABLE;
		return rep->status;
	}
	*out_lib = lib;
	return 0;
}

/* Asks for the device count; fills the rest of *rep. */
static int count_devices(const kiln_rti_gpu_vendor *v, const gpu_api *api,
                         kiln_copy_probe_report *rep)
{
	int n = 0;
	int rc = api->get_device_count(&n);
	if (rc == v->no_device[0] || rc == v->no_device[1])
		rep->status = KILN_RT_ENODEVICE;
	else if (rc != 0 || n < 0)
		rep->status = KILN_RT_EBACKEND;
	else {
		rep->devices = n;
		rep->status = n == 0 ? KILN_RT_ENODEVICE : 0;
	}
	return rep->status;
}

int kiln_rti_gpu_probe(const kiln_rti_gpu_vendor *v, const char *library,
                       kiln_copy_probe_report *out)
{
	void *lib = NULL;
	gpu_api api;
	if (load(v, library, &lib, &api, out) == 0) {
		count_devices(v, &api, out);
		dlclose(lib);
	}
	return out->status;
}

/* Releases whatever of g exists, in reverse order of creation. */
static void teardown(kiln_rti_gpu *g)
{
	const gpu_api *a = &g->api;
	if (g->pool || g->n_streams > 0 || g->n_events > 0) {
		int prev = 0;
		int have_prev = a->get_device(&prev) == 0;
		a->set_device(g->device);
		for (uint32_t i = 0; i < g->n_events; i++)
			a->event_destroy(g->events[i]);
		if (g->n_streams > 1)
			a->stream_destroy(g->h2d);
		if (g->n_streams > 0)
			a->stream_destroy(g->d2h);
		if (g->pool)
			a->host_free(g->pool);
		if (have_prev)
			a->set_device(prev);
	}
	if (g->lib)
		dlclose(g->lib);
	kiln_rti_free(g->events);
	kiln_rti_free(g);
}

/* Makes the pool, the streams and the events on the current device,
 * counting what exists in g for teardown. */
static int create(kiln_rti_gpu *g, size_t pool_bytes, uint32_t n_events)
{
	const kiln_rti_gpu_vendor *v = g->v;
	const gpu_api *a = &g->api;
	void *pool = NULL;
	int e = a->host_alloc(&pool, pool_bytes, v->host_alloc_flags);
	if (e != 0)
		return failed(g, e);
	g->pool = pool;
	if ((e = a->stream_create(&g->d2h, v->stream_flags)) != 0)
		return failed(g, e);
	g->n_streams = 1;
	if ((e = a->stream_create(&g->h2d, v->stream_flags)) != 0)
		return failed(g, e);
	g->n_streams = 2;
	for (; g->n_events < n_events; g->n_events++)
		if ((e = a->event_create(&g->events[g->n_events], v->event_flags)) != 0)
			return failed(g, e);
	return 0;
}

int kiln_rti_gpu_open(const kiln_rti_gpu_vendor *v, const kiln_copy_config *cfg, size_t pool_bytes,
                      uint32_t n_events, kiln_rti_gpu **out, unsigned char **out_pool)
{
	kiln_copy_probe_report rep;
	*out = NULL;
	*out_pool = NULL;
	kiln_rti_gpu *g = kiln_rti_alloc(sizeof *g);
	if (!g)
		return KILN_RT_ENOMEM;
	memset(g, 0, sizeof *g);
	g->v = v;
	g->device = cfg->device;

	int rc = load(v, cfg->library, &g->lib, &g->api, &rep);
	if (rc == 0)
		rc = count_devices(v, &g->api, &rep);
	if (rc == 0 && (cfg->device < 0 || cfg->device >= rep.devices))
		rc = KILN_RT_ENODEVICE;
	if (rc == 0) {
		g->events = kiln_rti_alloc((size_t)n_events * sizeof *g->events);
		rc = g->events ? 0 : KILN_RT_ENOMEM;
	}
	/* Streams, events and pinned memory belong to the current device:
	 * switch to ours for creating them, then back to the caller's. */
	int prev = 0, e;
	if (rc == 0 && (e = g->api.get_device(&prev)) != 0)
		rc = failed(g, e);
	if (rc == 0) {
		if ((e = g->api.set_device(g->device)) != 0)
			rc = failed(g, e);
		else
			rc = create(g, pool_bytes, n_events);
		g->api.set_device(prev);
	}
	if (rc != 0) {
		teardown(g);
		return rc;
	}
	*out = g;
	*out_pool = g->pool;
	return 0;
}

/* Queues one copy on stream s and records event ev after it. When the
 * record fails the copy cannot be tracked: wait for the stream so that
 * nothing stays queued, and refuse all later work if even that fails. */
static int copy_on(kiln_rti_gpu *g, void *s, int kind, void *dst, const void *src, size_t bytes,
                   uint32_t ev)
{
	const gpu_api *a = &g->api;
	int e = a->memcpy_async(dst, src, bytes, kind, s);
	if (e != 0)
		return failed(g, e);
	e = a->event_record(g->events[ev], s);
	if (e != 0) {
		if (a->stream_synchronize(s) != 0)
			g->broken = 1;
		return failed(g, e);
	}
	return 0;
}

int kiln_rti_gpu_d2h(kiln_rti_gpu *g, void *dst, const void *src, size_t bytes, uint32_t ev)
{
	if (g->broken)
		return KILN_RT_EBACKEND;
	return copy_on(g, g->d2h, g->v->memcpy_d2h, dst, src, bytes, ev);
}

int kiln_rti_gpu_h2d(kiln_rti_gpu *g, void *dst, const void *src, size_t bytes, uint32_t after,
                     uint32_t ev)
{
	if (g->broken)
		return KILN_RT_EBACKEND;
	if (after != KILN_RTI_GPU_NO_EVENT) {
		int e = g->api.stream_wait_event(g->h2d, g->events[after], 0);
		if (e != 0)
			return failed(g, e);
	}
	return copy_on(g, g->h2d, g->v->memcpy_h2d, dst, src, bytes, ev);
}

int kiln_rti_gpu_poll(kiln_rti_gpu *g, uint32_t ev)
{
	int e = g->api.event_query(g->events[ev]);
	if (e == 0)
		return 1;
	if (e == g->v->not_ready)
		return 0;
	return failed(g, e);
}

int kiln_rti_gpu_sync(kiln_rti_gpu *g, uint32_t ev)
{
	int e = g->api.event_synchronize(g->events[ev]);
	return e == 0 ? 0 : failed(g, e);
}

void kiln_rti_gpu_close(kiln_rti_gpu *g)
{
	if (!g)
		return;
	/* Copies still queued read or write the pool: let them finish. */
	g->api.stream_synchronize(g->d2h);
	g->api.stream_synchronize(g->h2d);
	teardown(g);
}
