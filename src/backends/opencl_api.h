/* The slice of the OpenCL 1.2 API the opencl backend uses, declared here so that stoke builds
 * without OpenCL headers (values and signatures are those of the Khronos cl.h / cl_ext.h), and
 * the private table of entry points resolved from the ICD loader (libOpenCL.so.1). */
#ifndef STOKE_OPENCL_API_H
#define STOKE_OPENCL_API_H

#include <stddef.h>
#include <stdint.h>

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_uint cl_bool;
typedef cl_ulong cl_bitfield;
typedef cl_bitfield cl_device_type;
typedef cl_bitfield cl_mem_flags;
typedef cl_bitfield cl_map_flags;
typedef cl_bitfield cl_command_queue_properties;
typedef intptr_t cl_context_properties;
typedef cl_uint cl_platform_info;
typedef cl_uint cl_device_info;
typedef cl_uint cl_event_info;
typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_event *cl_event;

#define CL_SUCCESS 0
#define CL_DEVICE_NOT_FOUND (-1)
#define CL_DEVICE_NOT_AVAILABLE (-2)
#define CL_MEM_OBJECT_ALLOCATION_FAILURE (-4)
#define CL_OUT_OF_RESOURCES (-5)
#define CL_OUT_OF_HOST_MEMORY (-6)
#define CL_MAP_FAILURE (-12)
#define CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST (-14)
#define CL_INVALID_VALUE (-30)
#define CL_INVALID_PLATFORM (-32)
#define CL_INVALID_DEVICE (-33)
#define CL_INVALID_CONTEXT (-34)
#define CL_INVALID_COMMAND_QUEUE (-36)
#define CL_INVALID_HOST_PTR (-37)
#define CL_INVALID_MEM_OBJECT (-38)
#define CL_INVALID_EVENT (-58)
#define CL_INVALID_OPERATION (-59)
#define CL_INVALID_BUFFER_SIZE (-61)
#define CL_PLATFORM_NOT_FOUND_KHR (-1001)

#define CL_FALSE 0u
#define CL_TRUE 1u

#define CL_PLATFORM_VERSION 0x0901u
#define CL_PLATFORM_NAME 0x0902u

#define CL_DEVICE_TYPE_CPU (1u << 1)
#define CL_DEVICE_TYPE_GPU (1u << 2)
#define CL_DEVICE_TYPE_ACCELERATOR (1u << 3)
#define CL_DEVICE_TYPE_CUSTOM (1u << 4)
#define CL_DEVICE_TYPE_ALL 0xFFFFFFFFu

#define CL_DEVICE_TYPE 0x1000u
#define CL_DEVICE_GLOBAL_MEM_SIZE 0x101Fu
#define CL_DEVICE_NAME 0x102Bu
#define CL_DEVICE_VENDOR 0x102Cu
#define CL_DRIVER_VERSION 0x102Du
#define CL_DEVICE_VERSION 0x102Fu
#define CL_DEVICE_EXTENSIONS 0x1030u
#define CL_DEVICE_PCI_BUS_INFO_KHR 0x410Fu /* cl_khr_pci_bus_info */

typedef struct {
    cl_uint pci_domain, pci_bus, pci_device, pci_function;
} stoke__cl_pci_bus_info;

#define CL_CONTEXT_PLATFORM 0x1084

#define CL_MEM_READ_WRITE (1u << 0)
#define CL_MEM_USE_HOST_PTR (1u << 3)
#define CL_MEM_ALLOC_HOST_PTR (1u << 4)
#define CL_MAP_READ (1u << 0)
#define CL_MAP_WRITE (1u << 1)

#define CL_EVENT_COMMAND_EXECUTION_STATUS 0x11D3u
#define CL_COMPLETE 0x0

/* Entry points (all exported by every ICD loader since OpenCL 1.2). */
struct stoke__ocl_api {
    cl_int (*clGetPlatformIDs)(cl_uint n, cl_platform_id *p, cl_uint *num);
    cl_int (*clGetPlatformInfo)(cl_platform_id p, cl_platform_info what, size_t size, void *val,
                                size_t *ret);
    cl_int (*clGetDeviceIDs)(cl_platform_id p, cl_device_type type, cl_uint n, cl_device_id *d,
                             cl_uint *num);
    cl_int (*clGetDeviceInfo)(cl_device_id d, cl_device_info what, size_t size, void *val,
                              size_t *ret);
    cl_context (*clCreateContext)(const cl_context_properties *props, cl_uint n,
                                  const cl_device_id *d,
                                  void (*notify)(const char *, const void *, size_t, void *),
                                  void *user, cl_int *err);
    cl_int (*clReleaseContext)(cl_context c);
    cl_command_queue (*clCreateCommandQueue)(cl_context c, cl_device_id d,
                                             cl_command_queue_properties props, cl_int *err);
    cl_int (*clReleaseCommandQueue)(cl_command_queue q);
    cl_mem (*clCreateBuffer)(cl_context c, cl_mem_flags flags, size_t size, void *host,
                             cl_int *err);
    cl_int (*clReleaseMemObject)(cl_mem m);
    void *(*clEnqueueMapBuffer)(cl_command_queue q, cl_mem m, cl_bool blocking,
                                cl_map_flags flags, size_t offset, size_t size, cl_uint nwait,
                                const cl_event *wait, cl_event *ev, cl_int *err);
    cl_int (*clEnqueueUnmapMemObject)(cl_command_queue q, cl_mem m, void *mapped, cl_uint nwait,
                                      const cl_event *wait, cl_event *ev);
    cl_int (*clEnqueueWriteBuffer)(cl_command_queue q, cl_mem m, cl_bool blocking,
                                   size_t offset, size_t size, const void *src, cl_uint nwait,
                                   const cl_event *wait, cl_event *ev);
    cl_int (*clEnqueueReadBuffer)(cl_command_queue q, cl_mem m, cl_bool blocking, size_t offset,
                                  size_t size, void *dst, cl_uint nwait, const cl_event *wait,
                                  cl_event *ev);
    cl_int (*clEnqueueMarkerWithWaitList)(cl_command_queue q, cl_uint nwait,
                                          const cl_event *wait, cl_event *ev);
    cl_int (*clGetEventInfo)(cl_event e, cl_event_info what, size_t size, void *val,
                             size_t *ret);
    cl_int (*clWaitForEvents)(cl_uint n, const cl_event *e);
    cl_int (*clRetainEvent)(cl_event e);
    cl_int (*clReleaseEvent)(cl_event e);
    cl_int (*clFlush)(cl_command_queue q);
    cl_int (*clFinish)(cl_command_queue q);
};

/* Tests only: 1 if the backend has created the context of (exposed) device `dev`, else 0. */
int stoke__opencl_context_created(int dev);

#endif
