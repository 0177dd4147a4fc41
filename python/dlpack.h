/* DLPack structures (the published specification, ABI version 1.0), written for stoke.
 * Only what the extension exports: DLManagedTensor ("dltensor" capsules, every consumer) and
 * DLManagedTensorVersioned ("dltensor_versioned", for consumers passing max_version >= 1). */
#ifndef STOKE_PY_DLPACK_H
#define STOKE_PY_DLPACK_H

#include <stdint.h>

#define STOKE_DLPACK_MAJOR 1
#define STOKE_DLPACK_MINOR 0

typedef enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLOpenCL = 4,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLExtDev = 12
} DLDeviceType;

typedef struct {
    int32_t device_type; /* DLDeviceType */
    int32_t device_id;
} DLDevice;

typedef enum {
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLOpaqueHandle = 3,
    kDLBfloat = 4,
    kDLComplex = 5,
    kDLBool = 6
} DLDataTypeCode;

typedef struct {
    uint8_t code; /* DLDataTypeCode */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* NULL: compact row-major */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#endif
