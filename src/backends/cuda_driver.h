/* The slice of the CUDA driver API the cuda backend uses, declared here so that stoke builds
 * without any CUDA SDK (the values and signatures are those of the driver's public cuda.h), and
 * the private table of driver entry points, swappable by tests for a mock driver.
 *
 * The backend resolves the table once from dlopen("libcuda.so.1") (or STOKE_CUDA_LIBRARY) using
 * the versioned `_v2` names where the driver has them; see cuda.c for which symbols are
 * required and which optional.  These types are also those of the driver-shaped table the cuda
 * and hip backends share (gpu_core.h). */
#ifndef STOKE_CUDA_DRIVER_H
#define STOKE_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

/* CUresult values the backend distinguishes. */
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_STUB_LIBRARY = 34,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803
};

/* CUdevice_attribute values. */
enum {
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
};

/* CUpointer_attribute and CUmemorytype values. */
enum { CU_POINTER_ATTRIBUTE_CONTEXT = 1, CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2 };
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMORYTYPE_ARRAY = 3,
       CU_MEMORYTYPE_UNIFIED = 4 };

#define CU_MEMHOSTALLOC_PORTABLE 0x01u
#define CU_MEMHOSTREGISTER_PORTABLE 0x01u
#define CU_STREAM_NON_BLOCKING 0x1u
#define CU_EVENT_DISABLE_TIMING 0x2u
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1u
#define CU_IPC_HANDLE_SIZE 64

/* A device allocation's IPC handle (passed by value, as in cuda.h). */
typedef struct CUipcMemHandle_st {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;

/* The oldest driver the backend accepts (cuDriverGetVersion's 1000*major + 10*minor):
 * CUDA 11.0, the first with cuDevicePrimaryCtxRelease_v2. */
#define STOKE_CUDA_DRIVER_MIN 11000

/* Driver entry points.  The member name is the API name; the symbol resolved for it is listed in
 * cuda.c (e.g. cuMemAlloc -> "cuMemAlloc_v2").  Optional members may be NULL. */
struct stoke__cuda_driver {
    /* required */
    CUresult (*cuInit)(unsigned flags);
    CUresult (*cuDriverGetVersion)(int *version);
    CUresult (*cuDeviceGetCount)(int *count);
    CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*cuDeviceGetName)(char *name, int len, CUdevice dev);
    CUresult (*cuDeviceTotalMem)(size_t *bytes, CUdevice dev);
    CUresult (*cuDeviceGetAttribute)(int *value, int attrib, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev);
    CUresult (*cuCtxPushCurrent)(CUcontext ctx);
    CUresult (*cuCtxPopCurrent)(CUcontext *ctx);
    CUresult (*cuMemHostAlloc)(void **p, size_t size, unsigned flags);
    CUresult (*cuMemFreeHost)(void *p);
    CUresult (*cuMemHostRegister)(void *p, size_t size, unsigned flags);
    CUresult (*cuMemHostUnregister)(void *p);
    CUresult (*cuMemAlloc)(CUdeviceptr *dptr, size_t size);
    CUresult (*cuMemFree)(CUdeviceptr dptr);
    CUresult (*cuStreamCreate)(CUstream *s, unsigned flags);
    CUresult (*cuStreamDestroy)(CUstream s);
    CUresult (*cuStreamSynchronize)(CUstream s);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t n, CUstream s);
    CUresult (*cuMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t n, CUstream s);
    CUresult (*cuEventCreate)(CUevent *e, unsigned flags);
    CUresult (*cuEventDestroy)(CUevent e);
    CUresult (*cuEventRecord)(CUevent e, CUstream s);
    CUresult (*cuEventQuery)(CUevent e);
    CUresult (*cuEventSynchronize)(CUevent e);
    /* optional */
    CUresult (*cuDeviceGetPCIBusId)(char *bus_id, int len, CUdevice dev);
    CUresult (*cuPointerGetAttribute)(void *data, int attribute, CUdeviceptr ptr);
    CUresult (*cuGetErrorString)(CUresult err, const char **msg);
    CUresult (*cuGetErrorName)(CUresult err, const char **name);
    /* optional: sharing device memory with other processes (stoke/ipc.h) */
    CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *h, CUdeviceptr dptr);
    CUresult (*cuIpcOpenMemHandle)(CUdeviceptr *dptr, CUipcMemHandle h, unsigned flags);
    CUresult (*cuIpcCloseMemHandle)(CUdeviceptr dptr);
};

/* Tests only: makes the backend use `d` (copied) instead of loading libcuda.so.1, and forgets
 * every probe result and retained context; NULL returns to loading the real library.  Call it
 * with no stoke object of the cuda backend alive, then reset the registry (tu_env does). */
void stoke__cuda_set_driver_for_test(const struct stoke__cuda_driver *d);

/* Tests only: how many primary contexts the backend holds for device `dev` (0 or 1). */
int stoke__cuda_context_retained(int dev);

#endif
