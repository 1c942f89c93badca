// Checks of the CUDA double's own rules, where kvbm's tests do not reach
// them: the batch API's failure index, the legacy stream refused by it,
// calls without a current context, a kernel's illegal address (sticky),
// IPC within one process, and the loud refusal of what is not
// implemented. Linked against the double (scripts/cuda-double.sh test).
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define EXPECT_RESULT(call, want)                                                               \
	do {                                                                                        \
		CUresult got_ = (call);                                                                 \
		if (got_ != (want)) {                                                                   \
			fprintf(stderr, "%s:%d: %s = %d, want %d (%s)\n", __FILE__, __LINE__, #call, got_, \
			        (want), #want);                                                             \
			failures++;                                                                         \
		}                                                                                       \
	} while (0)

#define EXPECT(cond)                                                                \
	do {                                                                            \
		if (!(cond)) {                                                              \
			fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);     \
			failures++;                                                             \
		}                                                                           \
	} while (0)

static void wait_stream(CUstream s) {
	CUresult r;
	while ((r = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY)
		;
	EXPECT_RESULT(r, CUDA_SUCCESS);
}

// The batch API: the whole batch is checked first; a bad copy's index
// comes back in failIdx (CUDA 12.8's signature), an error of no copy in
// particular gives SIZE_MAX, and the legacy stream is refused.
static void batch(CUstream s, CUdeviceptr a, char *host) {
	PFN_cuMemcpyBatchAsync_v12080 v1 = (PFN_cuMemcpyBatchAsync_v12080)dlsym(RTLD_DEFAULT, "cuMemcpyBatchAsync");
	EXPECT(v1 != NULL);
	if (!v1)
		return;
	CUdeviceptr dst[3] = {a, a + 4096, a + (1 << 20) - 8}, src[3];
	size_t size[3] = {4096, 4096, 4096}, idx = 0, fail = 7;
	for (int i = 0; i < 3; i++)
		src[i] = (CUdeviceptr)(uintptr_t)(host + i * 4096);
	CUmemcpyAttributes attr;
	memset(&attr, 0, sizeof attr);
	attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
	// Copy 2 runs past the allocation's end.
	EXPECT_RESULT(v1(dst, src, size, 3, &attr, &idx, 1, &fail, s), CUDA_ERROR_INVALID_VALUE);
	EXPECT(fail == 2);
	EXPECT_RESULT(v1(dst, src, size, 2, &attr, &idx, 1, &fail, CU_STREAM_LEGACY), CUDA_ERROR_INVALID_VALUE);
	EXPECT(fail == SIZE_MAX);
	attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_INVALID;
	EXPECT_RESULT(v1(dst, src, size, 2, &attr, &idx, 1, &fail, s), CUDA_ERROR_INVALID_VALUE);
	EXPECT(fail == 0);
	attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
	EXPECT_RESULT(v1(dst, src, size, 2, &attr, &idx, 1, &fail, s), CUDA_SUCCESS);
	wait_stream(s);
}

// A kernel that touches memory the device cannot reach fails the context
// for good (a sticky error): every later call says so.
static void sticky(CUcontext c, CUstream s, CUdeviceptr tables, const char *ptx) {
	CUmodule m;
	CUfunction f;
	EXPECT_RESULT(cuModuleLoadData(&m, ptx), CUDA_SUCCESS);
	EXPECT_RESULT(cuModuleGetFunction(&f, m, "kvbm_copy_fragments"), CUDA_SUCCESS);
	EXPECT_RESULT(cuModuleGetFunction(&f, m, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
	uint64_t bad[3] = {0x1000, 0x2000, 64}; // src, dst, size: nobody's memory
	EXPECT_RESULT(cuMemcpyHtoDAsync(tables, bad, sizeof bad, s), CUDA_SUCCESS);
	CUdeviceptr src = tables, dst = tables + 8, size = tables + 16;
	unsigned n = 1;
	void *args[] = {&src, &dst, &size, &n};
	EXPECT_RESULT(cuLaunchKernel(f, 1, 1, 1, 256, 1, 1, 0, s, args, NULL), CUDA_SUCCESS);
	CUresult r;
	while ((r = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY)
		;
	EXPECT_RESULT(r, CUDA_ERROR_ILLEGAL_ADDRESS);
	CUdeviceptr p;
	EXPECT_RESULT(cuMemAlloc(&p, 64), CUDA_ERROR_ILLEGAL_ADDRESS);
	(void)c;
}

static char *read_file(const char *path) {
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = calloc(1, (size_t)n + 1);
	if (fread(b, 1, (size_t)n, f) != (size_t)n) {
		free(b);
		b = NULL;
	}
	fclose(f);
	return b;
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: %s cuda/kernels/copy.ptx\n", argv[0]);
		return 2;
	}
	char *ptx = read_file(argv[1]);
	EXPECT(ptx != NULL);
	CUdeviceptr a;
	EXPECT_RESULT(cuMemAlloc(&a, 64), CUDA_ERROR_NOT_INITIALIZED);
	EXPECT_RESULT(cuInit(0), CUDA_SUCCESS);
	// No current context: calls on a context's objects are refused.
	EXPECT_RESULT(cuMemAlloc(&a, 64), CUDA_ERROR_INVALID_CONTEXT);
	CUcontext c, cur = (CUcontext)1;
	EXPECT_RESULT(cuDevicePrimaryCtxRetain(&c, 0), CUDA_SUCCESS);
	EXPECT_RESULT(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
	EXPECT(cur == NULL);
	EXPECT_RESULT(cuCtxSetCurrent(c), CUDA_SUCCESS);
	CUstream s;
	EXPECT_RESULT(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	EXPECT_RESULT(cuMemAlloc(&a, 1 << 20), CUDA_SUCCESS);
	char *host;
	EXPECT_RESULT(cuMemHostAlloc((void **)&host, 1 << 20, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
	batch(s, a, host);

	// Not implemented: refused, never silently done.
	EXPECT_RESULT(cuMemcpyHtoDAsync(a, host, 64, CU_STREAM_PER_THREAD), CUDA_ERROR_NOT_SUPPORTED);
	int v;
	EXPECT_RESULT(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 0), CUDA_ERROR_NOT_SUPPORTED);

	// An event never recorded is complete; one recorded covers the work
	// before it.
	CUevent e;
	EXPECT_RESULT(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	EXPECT_RESULT(cuEventQuery(e), CUDA_SUCCESS);
	EXPECT_RESULT(cuEventRecord(e, s), CUDA_SUCCESS);
	while (cuEventQuery(e) == CUDA_ERROR_NOT_READY)
		;
	EXPECT_RESULT(cuEventQuery(e), CUDA_SUCCESS);

	// IPC: a handle names the base of an allocation, and is not opened by
	// the process that made it.
	CUipcMemHandle h;
	EXPECT_RESULT(cuIpcGetMemHandle(&h, a + 64), CUDA_ERROR_INVALID_VALUE);
	EXPECT_RESULT(cuIpcGetMemHandle(&h, a), CUDA_SUCCESS);
	CUdeviceptr opened;
	EXPECT_RESULT(cuIpcOpenMemHandle(&opened, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT);

	const char *name = NULL;
	EXPECT_RESULT(cuGetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &name), CUDA_SUCCESS);
	EXPECT(name && !strcmp(name, "CUDA_ERROR_ILLEGAL_ADDRESS"));
	EXPECT_RESULT(cuGetErrorName((CUresult)12345, &name), CUDA_ERROR_INVALID_VALUE);

	if (ptx)
		sticky(c, s, a, ptx);
	if (failures) {
		fprintf(stderr, "cuda-double selftest: %d failure(s)\n", failures);
		return 1;
	}
	printf("cuda-double selftest: the double's own rules hold\n");
	return 0;
}
