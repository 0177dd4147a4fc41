/* The slice of the HIP runtime API (ROCm) the hip backend uses, declared here so that stoke
 * builds without ROCm headers (values and signatures as in hip_runtime_api.h; the few enums are
 * numbered like CUDA's and have not moved between ROCm 5 and 6), and the private table of
 * runtime entry points, swappable by tests for a mock runtime.
 *
 * Nothing version-dependent is used: no hipDeviceProp_t (its layout and the symbol that fills
 * it changed in ROCm 6), no hipDeviceAttribute_t (renumbered in ROCm 5), no
 * hipPointerAttribute_t (reshaped in ROCm 6).  See hip.c for which symbols are required. */
#ifndef STOKE_HIP_RUNTIME_H
#define STOKE_HIP_RUNTIME_H

#include <stddef.h>

typedef int hipError_t;
typedef int hipDevice_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipEvent_t *hipEvent_t;

/* hipError_t values the backend distinguishes. */
enum {
    hipSuccess = 0,
    hipErrorInvalidValue = 1,
    hipErrorOutOfMemory = 2,
    hipErrorNotInitialized = 3,
    hipErrorInsufficientDriver = 35,
    hipErrorNoDevice = 100,
    hipErrorInvalidDevice = 101,
    hipErrorNotReady = 600,
    hipErrorHostMemoryAlreadyRegistered = 712,
    hipErrorHostMemoryNotRegistered = 713,
    hipErrorNotSupported = 801,
    hipErrorUnknown = 999
};

/* hipMemcpyKind values. */
enum { hipMemcpyHostToDevice = 1, hipMemcpyDeviceToHost = 2 };

#define hipHostMallocPortable 0x1u
#define hipHostRegisterPortable 0x1u
#define hipStreamNonBlocking 0x1u
#define hipEventDisableTiming 0x2u
#define hipIpcMemLazyEnablePeerAccess 0x1u
#define HIP_IPC_HANDLE_SIZE 64

/* A device allocation's IPC handle (passed by value, as in hip_runtime_api.h). */
typedef struct hipIpcMemHandle_st {
    char reserved[HIP_IPC_HANDLE_SIZE];
} hipIpcMemHandle_t;

/* The oldest runtime the backend accepts, in hipRuntimeGetVersion's encoding
 * (10000000 * major + 100000 * minor + patch): HIP 5.0 (ROCm 5.0). */
#define STOKE_HIP_RUNTIME_MIN 50000000

/* Runtime entry points, resolved by these exact names.  Optional members may be NULL. */
struct stoke__hip_runtime {
    /* required */
    hipError_t (*hipRuntimeGetVersion)(int *version);
    hipError_t (*hipGetDeviceCount)(int *count);
    hipError_t (*hipDeviceGet)(hipDevice_t *dev, int ordinal);
    hipError_t (*hipDeviceGetName)(char *name, int len, hipDevice_t dev);
    hipError_t (*hipDeviceTotalMem)(size_t *bytes, hipDevice_t dev);
    hipError_t (*hipGetDevice)(int *ordinal);
    hipError_t (*hipSetDevice)(int ordinal);
    hipError_t (*hipHostMalloc)(void **p, size_t size, unsigned flags);
    hipError_t (*hipHostFree)(void *p);
    hipError_t (*hipHostRegister)(void *p, size_t size, unsigned flags);
    hipError_t (*hipHostUnregister)(void *p);
    hipError_t (*hipMalloc)(void **p, size_t size);
    hipError_t (*hipFree)(void *p);
    hipError_t (*hipStreamCreateWithFlags)(hipStream_t *s, unsigned flags);
    hipError_t (*hipStreamDestroy)(hipStream_t s);
    hipError_t (*hipStreamSynchronize)(hipStream_t s);
    hipError_t (*hipMemcpyAsync)(void *dst, const void *src, size_t n, int kind, hipStream_t s);
    hipError_t (*hipEventCreateWithFlags)(hipEvent_t *e, unsigned flags);
    hipError_t (*hipEventDestroy)(hipEvent_t e);
    hipError_t (*hipEventRecord)(hipEvent_t e, hipStream_t s);
    hipError_t (*hipEventQuery)(hipEvent_t e);
    hipError_t (*hipEventSynchronize)(hipEvent_t e);
    /* optional */
    hipError_t (*hipDriverGetVersion)(int *version);
    hipError_t (*hipDeviceGetPCIBusId)(char *bus_id, int len, hipDevice_t dev);
    hipError_t (*hipDeviceComputeCapability)(int *major, int *minor, hipDevice_t dev);
    const char *(*hipGetErrorName)(hipError_t err);
    const char *(*hipGetErrorString)(hipError_t err);
    /* optional: sharing device memory with other processes (stoke/ipc.h) */
    hipError_t (*hipIpcGetMemHandle)(hipIpcMemHandle_t *h, void *dev_ptr);
    hipError_t (*hipIpcOpenMemHandle)(void **dev_ptr, hipIpcMemHandle_t h, unsigned flags);
    hipError_t (*hipIpcCloseMemHandle)(void *dev_ptr);
};

/* Tests only: makes the backend use `rt` (copied) instead of loading libamdhip64, and forgets
 * the probe result and everything still pinned; NULL returns to loading the real library.
 * Call it with no stoke object of the hip backend alive, then reset the registry (tu_env
 * does). */
void stoke__hip_set_runtime_for_test(const struct stoke__hip_runtime *rt);

#endif
