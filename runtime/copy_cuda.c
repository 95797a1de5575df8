/* runtime/copy_cuda.c: what the copy engine needs to know about CUDA.
 *
 * The only file that names NVIDIA's CUDA runtime (libcudart). No header is
 * included: the library is loaded with dlopen by copy_gpu.c, and the few
 * constants below are those of the CUDA runtime API (driver_types.h), the
 * same from CUDA 11 to 13.
 */
#include "internal.h"

/* The unversioned name comes with CUDA's development package; the
 * versioned ones are the runtime sonames of CUDA 13, 12 and 11. */
static const char *const cuda_libraries[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                                             "libcudart.so.11.0", NULL};

const kiln_rti_gpu_vendor kiln_rti_gpu_cuda = {
    .name = "CUDA",
    .libraries = cuda_libraries,
    .symbols =
        {
#define X(need, field, hip, cuda, ret, params) "cuda" #cuda,
#include "gpu_symbols.def"
#undef X
        },
    .not_ready = 600,        /* cudaErrorNotReady */
    .no_device = {100, 35},  /* cudaErrorNoDevice, cudaErrorInsufficientDriver (no driver) */
    .memcpy_h2d = 1,         /* cudaMemcpyHostToDevice */
    .memcpy_d2h = 2,         /* cudaMemcpyDeviceToHost */
    .stream_flags = 0x1,     /* cudaStreamNonBlocking */
    .event_flags = 0x2,      /* cudaEventDisableTiming */
    .host_alloc_flags = 0x0, /* cudaHostAllocDefault */
};
