// Initialization, devices, primary contexts and the current context of
// each thread, error names.
#include "double.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

pthread_mutex_t kvd_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t kvd_cv = PTHREAD_COND_INITIALIZER;
int kvd_initialized;
int kvd_devices;
struct CUctx_st kvd_ctx[KVD_MAX_DEVICES];
static __thread struct CUctx_st *current;

CUresult kvd_unsupported(const char *call, const char *what) {
	fprintf(stderr, "kvbm CUDA double: %s: %s is not implemented\n", call, what);
	return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult kvd_unsupported_attr(const char *call, int attr) {
	char what[64];
	snprintf(what, sizeof what, "attribute %d", attr);
	return kvd_unsupported(call, what);
}

struct CUctx_st *kvd_thread_ctx(void) { return current; }

// The entry points a process called, each appended to
// KVBM_CUDA_DOUBLE_TRACE at its first call ("name pid" lines; at once, so
// that a process killed later still counts): which calls a test reached.
static const char *called[64];
static pthread_mutex_t called_mu = PTHREAD_MUTEX_INITIALIZER;

void kvd_called(const char *name) {
	const char *path = getenv("KVBM_CUDA_DOUBLE_TRACE");
	if (!path)
		return;
	pthread_mutex_lock(&called_mu);
	for (size_t i = 0; i < sizeof called / sizeof called[0]; i++) {
		if (called[i] == name)
			break;
		if (!called[i]) {
			called[i] = name;
			FILE *f = fopen(path, "a");
			if (f) {
				fprintf(f, "%s %d\n", name, (int)getpid());
				fclose(f);
			}
			break;
		}
	}
	pthread_mutex_unlock(&called_mu);
}

CUresult kvd_current(struct CUctx_st **c) {
	if (!kvd_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!current->active)
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	if (current->sticky)
		return current->sticky;
	*c = current;
	return CUDA_SUCCESS;
}


static CUresult init_locked(unsigned flags) {
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (!kvd_initialized) {
		const char *e = getenv("KVBM_CUDA_DOUBLE_DEVICES");
		kvd_devices = e ? atoi(e) : 1;
		if (kvd_devices < 0 || kvd_devices > KVD_MAX_DEVICES)
			kvd_devices = 1;
		for (int i = 0; i < kvd_devices; i++)
			kvd_ctx[i].device = i;
		kvd_initialized = 1;
	}
	return kvd_devices ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult cuInit(unsigned int flags) {
	kvd_called(__func__);
	LOCKED(init_locked(flags));
}

CUresult cuDriverGetVersion(int *v) {
	kvd_called(__func__);
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = KVD_DRIVER_VERSION;
	return CUDA_SUCCESS;
}

static CUresult device_ok(CUdevice d) {
	if (!kvd_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	return d >= 0 && d < kvd_devices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuDeviceGetCount(int *n) {
	kvd_called(__func__);
	if (!kvd_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	*n = kvd_devices;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	kvd_called(__func__);
	CUresult r = device_ok(ordinal);
	if (r == CUDA_SUCCESS && !d)
		return CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		*d = ordinal;
	return r;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	kvd_called(__func__);
	CUresult r = device_ok(d);
	if (r)
		return r;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "kvbm CUDA double %d (CPU)", d);
	return CUDA_SUCCESS;
}

// The device memory a device says it has: what cuMemAlloc may take.
#define KVD_DEVICE_MEMORY (16ULL << 30)

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice d) {
	kvd_called(__func__);
	CUresult r = device_ok(d);
	if (r)
		return r;
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	*bytes = KVD_DEVICE_MEMORY;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice d) {
	kvd_called(__func__);
	CUresult r = device_ok(d);
	if (r)
		return r;
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	switch (attr) {
	case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
		*v = 1;
		return CUDA_SUCCESS;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
		*v = 9;
		return CUDA_SUCCESS;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
		*v = 0;
		return CUDA_SUCCESS;
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
		*v = 1024;
		return CUDA_SUCCESS;
	default:
		return kvd_unsupported_attr("cuDeviceGetAttribute", (int)attr);
	}
}

CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice d) {
	kvd_called(__func__);
	CUresult r = device_ok(d);
	if (r)
		return r;
	if (!id || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	// Bus E0 and up: not a bus a test machine's sysfs is likely to have.
	snprintf(id, (size_t)len, "0000:%02X:00.0", 0xE0 + d);
	return CUDA_SUCCESS;
}

static CUresult retain_locked(CUcontext *pctx, CUdevice d) {
	CUresult r = device_ok(d);
	if (r)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUctx_st *c = &kvd_ctx[d];
	if (c->refs++ == 0) {
		c->active = 1;
		c->sticky = CUDA_SUCCESS;
	}
	*pctx = c;
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d) {
	kvd_called(__func__);
	LOCKED(retain_locked(pctx, d));
}

// The last release destroys the primary context, with everything made in
// it, whichever threads still have it current.
static CUresult release_locked(CUdevice d) {
	CUresult r = device_ok(d);
	if (r)
		return r;
	struct CUctx_st *c = &kvd_ctx[d];
	if (c->refs == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (--c->refs == 0) {
		kvd_ctx_idle(c);
		kvd_ctx_destroy(c);
		kvd_modules_destroy(c);
		kvd_memory_destroy(c);
		c->active = 0;
	}
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice d) {
	kvd_called(__func__);
	LOCKED(release_locked(d));
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
	kvd_called(__func__);
	if (!kvd_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = current;
	return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
	kvd_called(__func__);
	if (!kvd_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ctx && (ctx < &kvd_ctx[0] || ctx >= &kvd_ctx[kvd_devices]))
		return CUDA_ERROR_INVALID_CONTEXT;
	current = ctx;
	return CUDA_SUCCESS;
}

static const struct {
	CUresult code;
	const char *name, *text;
} errors[] = {
	{CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
	{CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
	{CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
	{CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
	{CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
	{CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
	{CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
	{CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
	{CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
	{CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
	{CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
	{CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain."},
	{CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
	{CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
	{CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
	{CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	{CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
	{CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
	{CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
	{CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
	{CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
	{CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
	{CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

// Both return CUDA_ERROR_INVALID_VALUE, and NULL in *s, for a code they do
// not know (as the driver does).
static CUresult error_text(CUresult code, const char **s, int name) {
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
		if (errors[i].code == code) {
			*s = name ? errors[i].name : errors[i].text;
			return CUDA_SUCCESS;
		}
	}
	*s = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult code, const char **s) {
	kvd_called(__func__);
	return error_text(code, s, 1);
}
CUresult cuGetErrorString(CUresult code, const char **s) {
	kvd_called(__func__);
	return error_text(code, s, 0);
}
