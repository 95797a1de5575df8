/* runtime/copy_hip.c: what the copy engine needs to know about HIP.
 *
 * The only file that names AMD's HIP runtime (libamdhip64, Debian package
 * libamdhip64-5). No header is included: the library is loaded with dlopen
 * by copy_gpu.c, and the few constants below are those of HIP 5's
 * hip_runtime_api.h.
 */
#include "internal.h"

static const char *const hip_libraries[] = {"libamdhip64.so", "libamdhip64.so.5", NULL};

const kiln_rti_gpu_vendor kiln_rti_gpu_hip = {
    .name = "HIP",
    .libraries = hip_libraries,
    .symbols =
        {
#define X(need, field, hip, cuda, ret, params) "hip" #hip,
#include "gpu_symbols.def"
#undef X
        },
    .not_ready = 600,        /* hipErrorNotReady */
    .no_device = {100, 35},  /* hipErrorNoDevice, hipErrorInsufficientDriver */
    .memcpy_h2d = 1,         /* hipMemcpyHostToDevice */
    .memcpy_d2h = 2,         /* hipMemcpyDeviceToHost */
    .stream_flags = 0x1,     /* hipStreamNonBlocking */
    .event_flags = 0x2,      /* hipEventDisableTiming */
    .host_alloc_flags = 0x0, /* hipHostMallocDefault */
};
