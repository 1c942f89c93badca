//go:build cgo

// See real_trampolines.h. The CUDA types and the driver functions resolved
// are declared by hand in real_abi.h (checked against the real cuda.h by
// make test-cuda-abi), so that building needs no CUDA headers.

#define _GNU_SOURCE
#include "real_trampolines.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "real_abi.h"

#define CU_FIELD(name, params) CUresult(*name) params;
static struct {
	void *lib;
	CU_REQUIRED_SYMBOLS(CU_FIELD)
	CU_OPTIONAL_SYMBOLS(CU_FIELD)
} cu;
#undef CU_FIELD

// ---- loading ---------------------------------------------------------------

// library_symbol is one entry of a library's table: where dlsym's answer
// goes, and whether the library is unusable without it.
typedef struct {
	const char *name;
	void **slot;
	int optional;
} library_symbol;

// library is one dlopen'd library (libcuda, NVML): opened once per process,
// its table resolved, status 0 when usable, else -1 with a message in err.
typedef struct {
	const char *path;
	void **lib;
	const library_symbol *symbols;
	size_t n;
	int status;
	char err[512];
} library;

// library_open opens l and resolves its table. It returns 0, or -1 with
// l->err set (dlerror's message, or the first missing required symbol).
// RTLD_LOCAL: the library's symbols stay out of the global namespace.
static int library_open(library *l) {
	*l->lib = dlopen(l->path, RTLD_NOW | RTLD_LOCAL);
	if (!*l->lib) {
		const char *e = dlerror();
		snprintf(l->err, sizeof l->err, "%s", e ? e : "dlopen failed");
		return -1;
	}
	for (size_t i = 0; i < l->n; i++) {
		*l->symbols[i].slot = dlsym(*l->lib, l->symbols[i].name);
		if (!*l->symbols[i].slot && !l->symbols[i].optional) {
			snprintf(l->err, sizeof l->err, "%s has no symbol %s", l->path, l->symbols[i].name);
			return -1;
		}
	}
	return 0;
}

// library_status is the result of the one load: 0, or -1 with the message
// copied into err.
static int library_status(const library *l, char *err, size_t errlen) {
	if (l->status != 0)
		snprintf(err, errlen, "%s", l->err);
	return l->status;
}

#define REQUIRED_SYMBOL(table, name) {#name, (void **)&table.name, 0},
#define OPTIONAL_SYMBOL(table, name) {#name, (void **)&table.name, 1},
#define CU_REQUIRED(name, params) REQUIRED_SYMBOL(cu, name)
#define CU_OPTIONAL(name, params) OPTIONAL_SYMBOL(cu, name)
static const library_symbol cu_symbols[] = {
	CU_REQUIRED_SYMBOLS(CU_REQUIRED)
	CU_OPTIONAL_SYMBOLS(CU_OPTIONAL)
};
#undef CU_REQUIRED
#undef CU_OPTIONAL

// Set up before any thread can load: pthread_once's routine reads it on
// whichever thread gets there first.
static library cu_library = {
	.path = "libcuda.so.1",
	.lib = &cu.lib,
	.symbols = cu_symbols,
	.n = sizeof cu_symbols / sizeof cu_symbols[0],
	.status = -1,
};
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

// cu_load_once opens libcuda. A driver too old for a symbol kvbm needs is
// named by its version beside the symbol (cuDriverGetVersion is as old as
// CUDA 2.2), so that the operator knows what to upgrade.
static void cu_load_once(void) {
	cu_library.status = library_open(&cu_library);
	if (cu_library.status == 0 || !cu.lib)
		return;
	CUresult (*version)(int *) = (CUresult(*)(int *))dlsym(cu.lib, "cuDriverGetVersion");
	int v = 0;
	if (version && version(&v) == 0 && v > 0) {
		size_t n = strlen(cu_library.err);
		snprintf(cu_library.err + n, sizeof cu_library.err - n,
		         " (the installed driver is CUDA %d.%d, older than that symbol: kvbm needs a newer driver)",
		         v / 1000, (v % 1000) / 10);
	}
}

int kv_cuda_load(char *err, size_t errlen) {
	pthread_once(&cu_once, cu_load_once);
	return library_status(&cu_library, err, errlen);
}

int kv_cuda_batch_version(void) {
	if (cu.cuMemcpyBatchAsync_v2)
		return 2;
	return cu.cuMemcpyBatchAsync ? 1 : 0;
}

#define LOADED_OR_FAIL()                       \
	do {                                       \
		if (cu_library.status)                 \
			return KV_CUDA_ERROR_NOT_INITIALIZED; \
	} while (0)

// The calling thread's current context, saved by ctx_enter and put back
// by ctx_leave. The caller's thread may be the engine's (a cgo call runs
// on whatever OS thread the goroutine is on, and through libkvbm.so on the
// engine's own threads): its current context is the CUDA runtime's current
// device there, so every trampoline that changes it restores it before
// returning.
typedef struct {
	CUcontext prev;
	int changed;
} ctx_guard;

// ctx_enter makes ctx current on this thread unless it already is.
static CUresult ctx_enter(uint64_t ctx, ctx_guard *g) {
	CUcontext cur = NULL;
	g->prev = NULL;
	g->changed = 0;
	LOADED_OR_FAIL();
	CUresult r = cu.cuCtxGetCurrent(&cur);
	if (r)
		return r;
	if (cur == (CUcontext)(uintptr_t)ctx)
		return 0;
	r = cu.cuCtxSetCurrent((CUcontext)(uintptr_t)ctx);
	if (r == 0) {
		g->prev = cur;
		g->changed = 1;
	}
	return r;
}

// stream_ctx_enter makes current the context of stream s (an engine's
// stream may belong to any context). The legacy and per-thread default
// streams (0, 1, 2) are the current context's, as in CUDA: a thread with
// one (an engine's, on its device) keeps it. Else, and when the driver
// cannot say, fallback.
static CUresult stream_ctx_enter(uint64_t fallback, uint64_t s, ctx_guard *g) {
	CUcontext c = NULL;
	g->prev = NULL;
	g->changed = 0;
	LOADED_OR_FAIL();
	if (s > 2) {
		if (cu.cuStreamGetCtx((CUstream)(uintptr_t)s, &c) == 0 && c)
			return ctx_enter((uint64_t)(uintptr_t)c, g);
	} else if (cu.cuCtxGetCurrent(&c) == 0 && c) {
		return 0;
	}
	return ctx_enter(fallback, g);
}

// ctx_leave puts back the context ctx_enter replaced (NULL included: a
// thread that had none is left with none).
static void ctx_leave(const ctx_guard *g) {
	if (g->changed)
		(void)cu.cuCtxSetCurrent(g->prev);
}

// IN_CTX(enter, call): return call's result, run between enter (ctx_enter
// or stream_ctx_enter on g_) and ctx_leave.
#define IN_CTX(enter, call)         \
	do {                            \
		ctx_guard g_;               \
		CUresult r_ = (enter);      \
		if (r_ == 0) {              \
			r_ = (call);            \
			ctx_leave(&g_);         \
		}                           \
		return r_;                  \
	} while (0)
#define CTX(ctx) ctx_enter((ctx), &g_)
#define STREAM_CTX(ctx, s) stream_ctx_enter((ctx), (s), &g_)

int kv_cuGetErrorName(int code, const char **s) { LOADED_OR_FAIL(); return cu.cuGetErrorName(code, s); }
int kv_cuGetErrorString(int code, const char **s) { LOADED_OR_FAIL(); return cu.cuGetErrorString(code, s); }
int kv_cuInit(unsigned flags) { LOADED_OR_FAIL(); return cu.cuInit(flags); }
int kv_cuDriverGetVersion(int *v) { LOADED_OR_FAIL(); return cu.cuDriverGetVersion(v); }
int kv_cuDeviceGetCount(int *n) { LOADED_OR_FAIL(); return cu.cuDeviceGetCount(n); }
int kv_cuDeviceGet(int *dev, int ordinal) { LOADED_OR_FAIL(); return cu.cuDeviceGet(dev, ordinal); }
int kv_cuDeviceGetName(char *name, int len, int dev) { LOADED_OR_FAIL(); return cu.cuDeviceGetName(name, len, dev); }
int kv_cuDeviceTotalMem(uint64_t *bytes, int dev) {
	size_t n = 0;
	LOADED_OR_FAIL();
	CUresult r = cu.cuDeviceTotalMem_v2(&n, dev);
	*bytes = n;
	return r;
}
int kv_cuDeviceGetAttribute(int *v, int attr, int dev) { LOADED_OR_FAIL(); return cu.cuDeviceGetAttribute(v, attr, dev); }
int kv_cuDeviceGetPCIBusId(char *id, int len, int dev) { LOADED_OR_FAIL(); return cu.cuDeviceGetPCIBusId(id, len, dev); }
int kv_cuDevicePrimaryCtxRetain(uint64_t *ctx, int dev) {
	CUcontext c = NULL;
	LOADED_OR_FAIL();
	CUresult r = cu.cuDevicePrimaryCtxRetain(&c, dev);
	*ctx = (uint64_t)(uintptr_t)c;
	return r;
}
int kv_cuDevicePrimaryCtxRelease(int dev) { LOADED_OR_FAIL(); return cu.cuDevicePrimaryCtxRelease_v2(dev); }

int kv_cuStreamCreate(uint64_t ctx, uint64_t *s, unsigned flags) {
	CUstream h = NULL;
	ctx_guard g;
	CUresult r = ctx_enter(ctx, &g);
	if (r == 0) {
		r = cu.cuStreamCreate(&h, flags);
		ctx_leave(&g);
	}
	*s = (uint64_t)(uintptr_t)h;
	return r;
}
int kv_cuStreamDestroy(uint64_t ctx, uint64_t s) {
	IN_CTX(STREAM_CTX(ctx, s), cu.cuStreamDestroy_v2((CUstream)(uintptr_t)s));
}
int kv_cuStreamQuery(uint64_t ctx, uint64_t s) {
	IN_CTX(STREAM_CTX(ctx, s), cu.cuStreamQuery((CUstream)(uintptr_t)s));
}
int kv_cuStreamGetCtx(uint64_t s, uint64_t *ctx) {
	CUcontext c = NULL;
	LOADED_OR_FAIL();
	CUresult r = cu.cuStreamGetCtx((CUstream)(uintptr_t)s, &c);
	*ctx = (uint64_t)(uintptr_t)c;
	return r;
}
int kv_cuStreamWaitEvent(uint64_t ctx, uint64_t s, uint64_t e) {
	IN_CTX(STREAM_CTX(ctx, s), cu.cuStreamWaitEvent((CUstream)(uintptr_t)s, (CUevent)(uintptr_t)e, 0));
}
int kv_cuEventCreate(uint64_t ctx, uint64_t *e, unsigned flags) {
	CUevent h = NULL;
	ctx_guard g;
	CUresult r = ctx_enter(ctx, &g);
	if (r == 0) {
		r = cu.cuEventCreate(&h, flags);
		ctx_leave(&g);
	}
	*e = (uint64_t)(uintptr_t)h;
	return r;
}
int kv_cuEventDestroy(uint64_t ctx, uint64_t e) {
	IN_CTX(CTX(ctx), cu.cuEventDestroy_v2((CUevent)(uintptr_t)e));
}
int kv_cuEventRecord(uint64_t ctx, uint64_t e, uint64_t s) {
	IN_CTX(STREAM_CTX(ctx, s), cu.cuEventRecord((CUevent)(uintptr_t)e, (CUstream)(uintptr_t)s));
}
int kv_cuEventQuery(uint64_t ctx, uint64_t e) {
	IN_CTX(CTX(ctx), cu.cuEventQuery((CUevent)(uintptr_t)e));
}

static CUresult memcpy_one(int kind, uint64_t dst, uint64_t src, uint64_t size, CUstream s) {
	switch (kind) {
	case KV_COPY_HOST_TO_DEVICE:
		return cu.cuMemcpyHtoDAsync_v2(dst, (const void *)(uintptr_t)src, size, s);
	case KV_COPY_DEVICE_TO_HOST:
		return cu.cuMemcpyDtoHAsync_v2((void *)(uintptr_t)dst, src, size, s);
	case KV_COPY_DEVICE_TO_DEVICE:
		return cu.cuMemcpyDtoDAsync_v2(dst, src, size, s);
	}
	return KV_CUDA_ERROR_INVALID_VALUE;
}

int kv_cuMemcpyAsync(uint64_t ctx, int kind, uint64_t dst, uint64_t src, uint64_t size, uint64_t s) {
	IN_CTX(STREAM_CTX(ctx, s), memcpy_one(kind, dst, src, size, (CUstream)(uintptr_t)s));
}

static CUresult memcpy_loop(int kind, const uint64_t *dst, const uint64_t *src, const uint64_t *size,
                            size_t n, CUstream s, size_t *failed) {
	for (size_t i = 0; i < n; i++) {
		if (size[i] == 0)
			continue;
		CUresult r = memcpy_one(kind, dst[i], src[i], size[i], s);
		if (r) {
			*failed = i;
			return r;
		}
	}
	return 0;
}

int kv_memcpy_loop(uint64_t ctx, int kind, const uint64_t *dst, const uint64_t *src,
                   const uint64_t *size, size_t n, uint64_t s, size_t *failed) {
	*failed = 0;
	IN_CTX(STREAM_CTX(ctx, s), memcpy_loop(kind, dst, src, size, n, (CUstream)(uintptr_t)s, failed));
}

int kv_memcpy_batch(uint64_t ctx, int kind, int dev, uint64_t *dst, uint64_t *src,
                    uint64_t *size, size_t n, uint64_t s, size_t *failed) {
	kv_CUmemcpyAttributes attr;
	size_t attr_idx = 0, fail_idx = 0;
	kv_CUmemLocation host = {KV_CU_MEM_LOCATION_TYPE_HOST, 0}, device = {KV_CU_MEM_LOCATION_TYPE_DEVICE, dev};
	ctx_guard g;
	*failed = 0;
	// Never the legacy default stream (0 or CU_STREAM_LEGACY, 0x1): the
	// batch API rejects it. The Go side does not pass it; this is a guard.
	if (s == 0 || s == 1)
		return KV_CUDA_ERROR_INVALID_VALUE;
	CUresult r = stream_ctx_enter(ctx, s, &g);
	if (r)
		return r;
	memset(&attr, 0, sizeof attr);
	attr.srcAccessOrder = KV_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
	attr.srcLocHint = kind == KV_COPY_HOST_TO_DEVICE ? host : device;
	attr.dstLocHint = kind == KV_COPY_DEVICE_TO_HOST ? host : device;
	// CUdeviceptr and size_t are 64-bit on every platform we build for.
	_Static_assert(sizeof(CUdeviceptr) == sizeof(uint64_t), "CUdeviceptr");
	_Static_assert(sizeof(size_t) == sizeof(uint64_t), "size_t");
	if (cu.cuMemcpyBatchAsync_v2) {
		r = cu.cuMemcpyBatchAsync_v2((CUdeviceptr *)dst, (CUdeviceptr *)src, (size_t *)size, n,
		                             &attr, &attr_idx, 1, (CUstream)(uintptr_t)s);
	} else if (cu.cuMemcpyBatchAsync) {
		r = cu.cuMemcpyBatchAsync((CUdeviceptr *)dst, (CUdeviceptr *)src, (size_t *)size, n,
		                          &attr, &attr_idx, 1, &fail_idx, (CUstream)(uintptr_t)s);
		*failed = fail_idx;
	} else {
		r = KV_CUDA_ERROR_NOT_SUPPORTED;
	}
	ctx_leave(&g);
	return r;
}

int kv_cuMemAlloc(uint64_t ctx, uint64_t *p, uint64_t size) {
	CUdeviceptr d = 0;
	ctx_guard g;
	CUresult r = ctx_enter(ctx, &g);
	if (r == 0) {
		r = cu.cuMemAlloc_v2(&d, size);
		ctx_leave(&g);
	}
	*p = d;
	return r;
}
int kv_cuMemFree(uint64_t ctx, uint64_t p) {
	IN_CTX(CTX(ctx), cu.cuMemFree_v2(p));
}

// CUDA IPC (optional symbols: a driver without them says NOT_SUPPORTED).
int kv_cuIpcExport(uint64_t ctx, uint64_t p, void *handle, uint64_t *base, uint64_t *size) {
	CUdeviceptr b = 0;
	size_t n = 0;
	*base = 0;
	*size = 0;
	if (!cu.cuMemGetAddressRange_v2 || !cu.cuIpcGetMemHandle)
		return KV_CUDA_ERROR_NOT_SUPPORTED;
	ctx_guard g;
	CUresult r = ctx_enter(ctx, &g);
	if (r == 0) {
		r = cu.cuMemGetAddressRange_v2(&b, &n, p);
		if (r == 0)
			r = cu.cuIpcGetMemHandle((kv_CUipcMemHandle *)handle, b);
		ctx_leave(&g);
	}
	*base = b;
	*size = n;
	return r;
}
int kv_cuIpcOpen(uint64_t ctx, const void *handle, uint64_t *p, uint64_t *size) {
	CUdeviceptr d = 0, b = 0;
	size_t n = 0;
	kv_CUipcMemHandle h;
	*p = 0;
	*size = 0;
	if (!cu.cuIpcOpenMemHandle_v2 || !cu.cuMemGetAddressRange_v2)
		return KV_CUDA_ERROR_NOT_SUPPORTED;
	memcpy(&h, handle, sizeof h);
	ctx_guard g;
	CUresult r = ctx_enter(ctx, &g);
	if (r == 0) {
		r = cu.cuIpcOpenMemHandle_v2(&d, h, KV_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
		if (r == 0 && cu.cuMemGetAddressRange_v2(&b, &n, d) != 0)
			n = 0;
		ctx_leave(&g);
	}
	*p = d;
	*size = n;
	return r;
}
int kv_cuIpcClose(uint64_t ctx, uint64_t p) {
	if (!cu.cuIpcCloseMemHandle)
		return KV_CUDA_ERROR_NOT_SUPPORTED;
	IN_CTX(CTX(ctx), cu.cuIpcCloseMemHandle(p));
}

// get_mempolicy(2) and set_mempolicy(2) through syscall(2): no libnuma
// needed. Node masks of KV_MAX_NODES bits.
#define KV_MPOL_DEFAULT 0
#define KV_MPOL_PREFERRED 1
#define KV_MPOL_LOCAL 4
#define KV_MPOL_MODE_FLAGS (1 << 15 | 1 << 14 | 1 << 13) // MPOL_F_STATIC_NODES, _RELATIVE_NODES, _NUMA_BALANCING
#define KV_MAX_NODES 1024
#define KV_LONG_BITS (8 * sizeof(unsigned long))

// host_alloc_on calls cuMemHostAlloc with this thread's memory policy set
// to prefer numa_node, then puts the thread's previous policy back (the
// thread may be the engine's). When the previous policy cannot be read,
// the pages are placed as the thread's policy says.
static CUresult host_alloc_on(void **h, uint64_t size, unsigned flags, int numa_node) {
	unsigned long old_mask[KV_MAX_NODES / KV_LONG_BITS], mask[KV_MAX_NODES / KV_LONG_BITS];
	int old_mode = 0, bound = 0;
	if (numa_node >= 0 && numa_node < KV_MAX_NODES - 1 &&
	    syscall(SYS_get_mempolicy, &old_mode, old_mask, (unsigned long)KV_MAX_NODES, NULL, 0UL) == 0) {
		memset(mask, 0, sizeof mask);
		mask[numa_node / KV_LONG_BITS] |= 1UL << (numa_node % KV_LONG_BITS);
		// maxnode is one more than the bits passed (the kernel reads maxnode-1).
		bound = syscall(SYS_set_mempolicy, KV_MPOL_PREFERRED, mask, (unsigned long)KV_MAX_NODES + 1) == 0;
	}
	// The driver allocates and pins (so faults in) the pages inside this
	// call, on this thread: the policy above places them.
	CUresult r = cu.cuMemHostAlloc(h, size, flags);
	if (bound) {
		int mode = old_mode & ~KV_MPOL_MODE_FLAGS;
		if (mode == KV_MPOL_DEFAULT || mode == KV_MPOL_LOCAL)
			syscall(SYS_set_mempolicy, old_mode, NULL, 0UL);
		else
			syscall(SYS_set_mempolicy, old_mode, old_mask, (unsigned long)KV_MAX_NODES + 1);
	}
	return r;
}

int kv_cuMemHostAlloc(uint64_t ctx, uint64_t *p, uint64_t size, unsigned flags, int numa_node) {
	void *h = NULL;
	ctx_guard g;
	CUresult r = ctx_enter(ctx, &g);
	if (r == 0) {
		r = host_alloc_on(&h, size, flags, numa_node);
		ctx_leave(&g);
	}
	*p = (uint64_t)(uintptr_t)h;
	return r;
}
int kv_cuMemFreeHost(uint64_t ctx, uint64_t p) {
	IN_CTX(CTX(ctx), cu.cuMemFreeHost((void *)(uintptr_t)p));
}
int kv_cuMemHostRegister(uint64_t ctx, uint64_t p, uint64_t size, unsigned flags) {
	IN_CTX(CTX(ctx), cu.cuMemHostRegister_v2((void *)(uintptr_t)p, size, flags));
}
int kv_cuMemHostUnregister(uint64_t ctx, uint64_t p) {
	IN_CTX(CTX(ctx), cu.cuMemHostUnregister((void *)(uintptr_t)p));
}
int kv_cuPointerGetAttribute(uint64_t ctx, void *data, int attr, uint64_t p) {
	IN_CTX(CTX(ctx), cu.cuPointerGetAttribute(data, attr, p));
}

int kv_cuModuleLoadData(uint64_t ctx, uint64_t *mod, const void *image) {
	CUmodule m = NULL;
	ctx_guard g;
	CUresult r = ctx_enter(ctx, &g);
	if (r == 0) {
		r = cu.cuModuleLoadData(&m, image);
		ctx_leave(&g);
	}
	*mod = (uint64_t)(uintptr_t)m;
	return r;
}
int kv_cuModuleGetFunction(uint64_t ctx, uint64_t *fn, uint64_t mod, const char *name) {
	CUfunction f = NULL;
	ctx_guard g;
	CUresult r = ctx_enter(ctx, &g);
	if (r == 0) {
		r = cu.cuModuleGetFunction(&f, (CUmodule)(uintptr_t)mod, name);
		ctx_leave(&g);
	}
	*fn = (uint64_t)(uintptr_t)f;
	return r;
}
int kv_cuModuleUnload(uint64_t ctx, uint64_t mod) {
	IN_CTX(CTX(ctx), cu.cuModuleUnload((CUmodule)(uintptr_t)mod));
}
int kv_launch_copy(uint64_t ctx, uint64_t fn, unsigned grid, unsigned block, uint64_t s,
                   uint64_t src_table, uint64_t dst_table, uint64_t size_table, unsigned n) {
	void *args[] = {&src_table, &dst_table, &size_table, &n};
	IN_CTX(STREAM_CTX(ctx, s), cu.cuLaunchKernel((CUfunction)(uintptr_t)fn, grid, 1, 1, block, 1, 1, 0,
	                                             (CUstream)(uintptr_t)s, args, NULL));
}
int kv_cuCtxSetCurrent(uint64_t ctx) {
	LOADED_OR_FAIL();
	return cu.cuCtxSetCurrent((CUcontext)(uintptr_t)ctx);
}
int kv_cuCtxGetCurrent(uint64_t *ctx) {
	CUcontext c = NULL;
	*ctx = 0;
	LOADED_OR_FAIL();
	CUresult r = cu.cuCtxGetCurrent(&c);
	*ctx = (uint64_t)(uintptr_t)c;
	return r;
}

// ---- NVML ------------------------------------------------------------------

#define NV_FIELD(name, params) nvmlReturn_t(*name) params;
static struct {
	void *lib;
	NV_REQUIRED_SYMBOLS(NV_FIELD)
	NV_OPTIONAL_SYMBOLS(NV_FIELD)
} nv;
#undef NV_FIELD

#define NV_REQUIRED(name, params) REQUIRED_SYMBOL(nv, name)
#define NV_OPTIONAL(name, params) OPTIONAL_SYMBOL(nv, name)
static const library_symbol nv_symbols[] = {
	NV_REQUIRED_SYMBOLS(NV_REQUIRED)
	NV_OPTIONAL_SYMBOLS(NV_OPTIONAL)
};
#undef NV_REQUIRED
#undef NV_OPTIONAL

static library nv_library = {
	.path = "libnvidia-ml.so.1",
	.lib = &nv.lib,
	.symbols = nv_symbols,
	.n = sizeof nv_symbols / sizeof nv_symbols[0],
	.status = -1,
};
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

// nv_load_once opens NVML and initializes it: usable only once both did.
static void nv_load_once(void) {
	if (library_open(&nv_library) != 0)
		return;
	int r = nv.nvmlInit_v2();
	if (r) {
		snprintf(nv_library.err, sizeof nv_library.err, "nvmlInit_v2 failed with NVML error %d", r);
		return;
	}
	nv_library.status = 0;
}

int kv_nvml_load(char *err, size_t errlen) {
	pthread_once(&nv_once, nv_load_once);
	return library_status(&nv_library, err, errlen);
}

int kv_nvml_device_count(unsigned *n) {
	if (nv_library.status)
		return -1;
	return nv.nvmlDeviceGetCount_v2(n);
}

int kv_nvml_numa_node(const char *bus_id, int *node) {
	nvmlDevice_t d = NULL;
	unsigned v = 0;
	*node = -1;
	if (nv_library.status || !nv.nvmlDeviceGetNumaNodeId)
		return -1;
	int r = nv.nvmlDeviceGetHandleByPciBusId_v2(bus_id, &d);
	if (r)
		return r;
	r = nv.nvmlDeviceGetNumaNodeId(d, &v);
	if (r == 0)
		*node = (int)v;
	return r;
}

int kv_nvml_memory(const char *bus_id, uint64_t *total, uint64_t *free_bytes) {
	nvmlDevice_t d = NULL;
	kv_nvmlMemory_t m;
	if (nv_library.status)
		return -1;
	int r = nv.nvmlDeviceGetHandleByPciBusId_v2(bus_id, &d);
	if (r)
		return r;
	r = nv.nvmlDeviceGetMemoryInfo(d, &m);
	if (r == 0) {
		*total = m.total;
		*free_bytes = m.free;
	}
	return r;
}
