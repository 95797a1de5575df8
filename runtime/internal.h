/* runtime/internal.h: what the runtime's files share; never installed.
 *
 * The runtime is a leaf: it includes libc, pthreads, dlfcn and
 * include/kiln/ only (DESIGN.md section 4).
 */
#ifndef KILN_RUNTIME_INTERNAL_H
#define KILN_RUNTIME_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/blob.h"
#include "kiln/runtime.h"

/* alloc.c */

/* The allocator set with kiln_rt_set_allocator (malloc and free by
 * default). Every allocation of the runtime goes through these two. */
void *kiln_rti_alloc(size_t bytes);
void kiln_rti_free(void *p);

/* A stage's ceil(inflight), clamped to [1, 1e6] (without libm: the
 * runtime needs none; open checks that inflight is finite and >= 0). */
static inline uint32_t kiln_rti_inflight(const kiln_blob_stage *st)
{
	double x = st->inflight < 1e6 ? st->inflight : 1e6;
	uint32_t n = (uint32_t)x;
	n += (double)n < x;
	return n ? n : 1;
}

/* Saturating byte arithmetic: UINT64_MAX where the exact result is not
 * representable, so that a corrupt or huge size never wraps to a small one. */
static inline uint64_t kiln_rti_sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static inline uint64_t kiln_rti_sat_mul(uint64_t a, uint64_t b)
{
	return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* crc32c.c */

/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78) of len bytes,
 * continuing from crc (0 to start). */
uint32_t kiln_rti_crc32c(uint32_t crc, const void *data, size_t len);

/* The same, always by table (for tests of the hardware path). */
uint32_t kiln_rti_crc32c_portable(uint32_t crc, const void *data, size_t len);

/* open.c, select.c, acct.c */

#define KILN_RTI_BUCKET_SHIFT 8
#define KILN_RTI_POINT_SHIFT 6
#define KILN_RTI_BUCKET_SLOTS (1u << KILN_RTI_BUCKET_SHIFT)
#define KILN_RTI_POINT_SLOTS (1u << KILN_RTI_POINT_SHIFT)
/* The knee's tolerance in select, as a fraction of a table's maximal-saving
 * exposed time (docs/runtime.md, step 7). */
#define KILN_RTI_KNEE 0.03

/* Micro-batches accounting tells apart (mb modulo this). */
#define KILN_RTI_MB_SLOTS 256

/* Accounting counters; a separate allocation so that select, which gets a
 * const handle, can still load them atomically. */
typedef struct kiln_rti_acct {
	_Atomic int32_t stage; /* -1 until kiln_rt_acct_reset */
	_Atomic uint64_t limit_bytes;
	_Atomic uint64_t device_bytes;
	_Atomic uint64_t host_bytes;
	_Atomic uint64_t peak_bytes;
	_Atomic uint32_t open;
	_Atomic uint64_t mb_device[KILN_RTI_MB_SLOTS];
	_Atomic uint64_t mb_host[KILN_RTI_MB_SLOTS];
} kiln_rti_acct;

/* A validated blob: typed views of its sections (borrowed from the blob)
 * and the index built at open. After kiln_rt_open every count, offset and
 * cross-reference below is known to be in range. */
struct kiln_rt {
	const unsigned char *base;
	size_t size;
	void *map; /* owned mapping (kiln_rt_open_file), else NULL */
	size_t map_bytes;
	const kiln_blob_meta *meta;
	const char *strings;
	const kiln_blob_stage *stages;
	const kiln_blob_layer *layers;
	const kiln_blob_set *sets;
	const kiln_blob_unit *units;
	const kiln_blob_bucket *buckets;
	const kiln_blob_table *tables;
	const kiln_blob_point *points;
	const kiln_blob_plan *plans;
	const uint8_t *actions;
	const kiln_blob_chunk *chunks;
	const kiln_blob_template *templates;
	const uint8_t *tasks;
	const kiln_blob_dep *deps;
	uint64_t count[KILN_SEC_COUNT];
	int32_t *layer_index; /* per model layer: LAYERS index, or -1 */
	int32_t *unit_class;  /* per set: the first set with the same units (one block with
	                         layer_index) */
	/* Lookup tables that turn select's two searches into an index and a
	 * short forward scan (built by open, in their own block):
	 *   bucket_lut[set * (KILN_RTI_BUCKET_SLOTS + 1) + j]: the first bucket
	 *     of the set whose max_rows >= j * (last max_rows + 1) / SLOTS;
	 *   point_lut[table * (KILN_RTI_POINT_SLOTS + 1) + j]: the first point
	 *     of the table whose saved_q >= j * (last saved_q + 1) / SLOTS;
	 *   bucket_scale[set], point_scale[table]: SLOTS / (last + 1);
	 *   point_knee[point]: per POINTS record, the index in its table of the
	 *     point the knee moves it to (docs/runtime.md, step 7). */
	uint16_t *bucket_lut;
	uint16_t *point_lut;
	uint16_t *point_knee;
	double *bucket_scale;
	double *point_scale;
	/* Per stage, the fair scale of select's shares (docs/runtime.md, step
	 * 5), computed at open from the stage's figures. */
	double *fair_scale;
	kiln_rti_acct *acct;
	/* Blob 1.1: per set the EP group's fallback (GROUPS); NULL for a 1.0
	 * blob, which has none (select then ignores group counts). */
	const kiln_blob_group *groups;
};

/* copy*.c */

/* Indices of gpu_symbols.def's lines. */
enum {
#define X(need, field, hip, cuda, ret, params) KILN_RTI_GPU_SYM_##field,
#include "gpu_symbols.def"
#undef X
	KILN_RTI_GPU_N_SYMBOLS
};

/* Everything in which HIP and CUDA differ, as copy_gpu.c needs it: filled in
 * by copy_hip.c and copy_cuda.c, the only files that name either vendor. */
typedef struct kiln_rti_gpu_vendor {
	const char *name;                            /* "HIP", "CUDA" */
	const char *const *libraries;                /* default dlopen names, NULL-terminated */
	const char *symbols[KILN_RTI_GPU_N_SYMBOLS]; /* dlsym names, gpu_symbols.def order */
	int not_ready;                               /* EventQuery: recorded work still pending */
	int no_device[2];                            /* GetDeviceCount: no usable device */
	int memcpy_h2d, memcpy_d2h;                  /* MemcpyKind values */
	unsigned int stream_flags;                   /* a non-blocking stream */
	unsigned int event_flags;                    /* an event without timing */
	unsigned int host_alloc_flags;               /* default pinned host memory */
} kiln_rti_gpu_vendor;

extern const kiln_rti_gpu_vendor kiln_rti_gpu_hip;  /* copy_hip.c */
extern const kiln_rti_gpu_vendor kiln_rti_gpu_cuda; /* copy_cuda.c */

/* One GPU opened for copies (copy_gpu.c): the vendor library, a pinned
 * pool, a device-to-host and a host-to-device stream, and n_events events
 * named by index. Calls other than kiln_rti_gpu_sync must be serialised by
 * the caller (the engine's mutex); kiln_rti_gpu_sync may run beside them. */
typedef struct kiln_rti_gpu kiln_rti_gpu;

#define KILN_RTI_GPU_NO_EVENT UINT32_MAX

/* Opens device cfg->device of vendor v (library cfg->library, or v's
 * defaults) with a pool of pool_bytes; *out_pool is owned by *out. Returns
 * KILN_RT_EUNAVAILABLE, KILN_RT_ENODEVICE, KILN_RT_EBACKEND or
 * KILN_RT_ENOMEM with nothing left open. Leaves the caller's current device
 * as it was. Allocates. */
int kiln_rti_gpu_open(const kiln_rti_gpu_vendor *v, const kiln_copy_config *cfg, size_t pool_bytes,
                      uint32_t n_events, kiln_rti_gpu **out, unsigned char **out_pool);
/* Queues bytes from device src to host dst on the device-to-host stream and
 * records event ev after it. On failure nothing stays queued. */
int kiln_rti_gpu_d2h(kiln_rti_gpu *g, void *dst, const void *src, size_t bytes, uint32_t ev);
/* The same host to device, on the host-to-device stream, first waiting for
 * event after unless it is KILN_RTI_GPU_NO_EVENT. */
int kiln_rti_gpu_h2d(kiln_rti_gpu *g, void *dst, const void *src, size_t bytes, uint32_t after,
                     uint32_t ev);
/* 1 when event ev has completed, 0 when not yet, KILN_RT_EBACKEND. */
int kiln_rti_gpu_poll(kiln_rti_gpu *g, uint32_t ev);
/* Blocks until event ev completes: 0 or KILN_RT_EBACKEND. */
int kiln_rti_gpu_sync(kiln_rti_gpu *g, uint32_t ev);
/* Waits for both streams, then releases everything (NULL allowed). */
void kiln_rti_gpu_close(kiln_rti_gpu *g);
/* kiln_copy_probe for vendor v. */
int kiln_rti_gpu_probe(const kiln_rti_gpu_vendor *v, const char *library,
                       kiln_copy_probe_report *out);

#endif
