// The C side of the real CUDA driver: libcuda.so.1 and libnvidia-ml.so.1
// opened with dlopen, a table of function pointers resolved with dlsym, and
// small trampolines that Go calls through cgo. Nothing here links against
// CUDA: the only undefined symbols are glibc's (dlopen, dlsym, syscall).
//
// Handles cross as integers (uint64_t) so that Go never converts them to
// unsafe.Pointer. Every trampoline that needs a current context takes the
// context to use and makes it current first, inside the same C call (one
// cgo call runs on one OS thread, so no runtime.LockOSThread is needed),
// and puts the thread's previous current context back before it returns:
// the thread may be the engine's, whose current context is its CUDA
// runtime's current device.
#ifndef KVBM_REAL_TRAMPOLINES_H
#define KVBM_REAL_TRAMPOLINES_H

#include <stddef.h>
#include <stdint.h>

// None of these is part of libkvbm.so's interface: keep them out of its
// dynamic symbol table.
#pragma GCC visibility push(hidden)

// kv_cuda_load opens libcuda.so.1 and resolves the table. It returns 0, or
// -1 with a message in err (dlerror's, or the missing symbol's name).
// Loading happens once per process; later calls return the first result.
int kv_cuda_load(char *err, size_t errlen);

// kv_cuda_batch_version: 0 when the driver has no cuMemcpyBatchAsync, 1 for
// the CUDA 12.8 signature (with failIdx), 2 for cuMemcpyBatchAsync_v2
// (CUDA 13, without failIdx).
int kv_cuda_batch_version(void);

int kv_cuGetErrorName(int code, const char **s);
int kv_cuGetErrorString(int code, const char **s);
int kv_cuInit(unsigned flags);
int kv_cuDriverGetVersion(int *v);
int kv_cuDeviceGetCount(int *n);
int kv_cuDeviceGet(int *dev, int ordinal);
int kv_cuDeviceGetName(char *name, int len, int dev);
int kv_cuDeviceTotalMem(uint64_t *bytes, int dev);
int kv_cuDeviceGetAttribute(int *v, int attr, int dev);
int kv_cuDeviceGetPCIBusId(char *id, int len, int dev);
int kv_cuDevicePrimaryCtxRetain(uint64_t *ctx, int dev);
int kv_cuDevicePrimaryCtxRelease(int dev);
// kv_cuCtxGetCurrent: this thread's current context (0 when none).
int kv_cuCtxGetCurrent(uint64_t *ctx);
// kv_cuCtxSetCurrent makes ctx (0: none) this thread's current context, as
// an engine's CUDA runtime does; for tests.
int kv_cuCtxSetCurrent(uint64_t ctx);

int kv_cuStreamCreate(uint64_t ctx, uint64_t *s, unsigned flags);
int kv_cuStreamDestroy(uint64_t ctx, uint64_t s);
int kv_cuStreamQuery(uint64_t ctx, uint64_t s);
// kv_cuStreamGetCtx: the context of stream s (no current context needed).
int kv_cuStreamGetCtx(uint64_t s, uint64_t *ctx);
int kv_cuStreamWaitEvent(uint64_t ctx, uint64_t s, uint64_t e);
int kv_cuEventCreate(uint64_t ctx, uint64_t *e, unsigned flags);
int kv_cuEventDestroy(uint64_t ctx, uint64_t e);
int kv_cuEventRecord(uint64_t ctx, uint64_t e, uint64_t s);
int kv_cuEventQuery(uint64_t ctx, uint64_t e);

// The direction of a copy: the values of cuda.CopyKind (real_copy.go
// checks that they agree).
enum kv_copy_kind {
	KV_COPY_HOST_TO_DEVICE = 1,
	KV_COPY_DEVICE_TO_HOST = 2,
	KV_COPY_DEVICE_TO_DEVICE = 3,
};

// kind: a kv_copy_kind.
int kv_cuMemcpyAsync(uint64_t ctx, int kind, uint64_t dst, uint64_t src, uint64_t size, uint64_t s);
// kv_memcpy_loop enqueues n copies in order with the kind's cuMemcpy*Async;
// on failure *failed is the index of the copy that failed.
int kv_memcpy_loop(uint64_t ctx, int kind, const uint64_t *dst, const uint64_t *src,
                   const uint64_t *size, size_t n, uint64_t s, size_t *failed);
// kv_memcpy_batch enqueues n copies with cuMemcpyBatchAsync (one attribute
// entry: source access in stream order, location hints from kind and dev).
// s must not be the legacy default stream (0 or CU_STREAM_LEGACY, 1): the
// batch API rejects it, and so does this (CUDA_ERROR_INVALID_VALUE).
int kv_memcpy_batch(uint64_t ctx, int kind, int dev, uint64_t *dst, uint64_t *src,
                    uint64_t *size, size_t n, uint64_t s, size_t *failed);

int kv_cuMemAlloc(uint64_t ctx, uint64_t *p, uint64_t size);
int kv_cuMemFree(uint64_t ctx, uint64_t p);
// numa_node >= 0: the pages are placed on that node (set_mempolicy
// MPOL_PREFERRED for this thread during the call, then the thread's
// previous policy, read with get_mempolicy, is put back).
int kv_cuMemHostAlloc(uint64_t ctx, uint64_t *p, uint64_t size, unsigned flags, int numa_node);
int kv_cuMemFreeHost(uint64_t ctx, uint64_t p);
int kv_cuMemHostRegister(uint64_t ctx, uint64_t p, uint64_t size, unsigned flags);
int kv_cuIpcExport(uint64_t ctx, uint64_t p, void *handle, uint64_t *base, uint64_t *size);
int kv_cuIpcOpen(uint64_t ctx, const void *handle, uint64_t *p, uint64_t *size);
int kv_cuIpcClose(uint64_t ctx, uint64_t p);
int kv_cuMemHostUnregister(uint64_t ctx, uint64_t p);
int kv_cuPointerGetAttribute(uint64_t ctx, void *data, int attr, uint64_t p);

int kv_cuModuleLoadData(uint64_t ctx, uint64_t *mod, const void *image);
// kv_cuModuleGetFunction needs the module's context current, as every
// call on a context's objects does.
int kv_cuModuleGetFunction(uint64_t ctx, uint64_t *fn, uint64_t mod, const char *name);
int kv_cuModuleUnload(uint64_t ctx, uint64_t mod);
// kv_launch_copy launches the fragment-copy kernel fn on s.
int kv_launch_copy(uint64_t ctx, uint64_t fn, unsigned grid, unsigned block, uint64_t s,
                   uint64_t src_table, uint64_t dst_table, uint64_t size_table, unsigned n);

// NVML (libnvidia-ml.so.1), opened once like libcuda. kv_nvml_load returns
// 0 or -1 with err.
int kv_nvml_load(char *err, size_t errlen);
int kv_nvml_device_count(unsigned *n);
// kv_nvml_numa_node: NVML's NUMA node of the device at PCI bus id, or -1.
// On Grace systems that is the GPU's own (CPU-less) HBM node: the Go side
// prefers sysfs's numa_node of the PCI device and checks the node has CPUs.
int kv_nvml_numa_node(const char *bus_id, int *node);
int kv_nvml_memory(const char *bus_id, uint64_t *total, uint64_t *free_bytes);

#pragma GCC visibility pop

#endif
