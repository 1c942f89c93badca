/* G1 for the examples: the engine's KV cache. Under the emulated device it
 * is host memory, which the device adopts as device memory; under the cuda
 * backend it is device memory from CUDA's driver (libcuda.so.1, opened
 * with dlopen as kvbm opens it: nothing links against it), written and
 * read with the driver's copies. The examples fill and check host copies
 * and move them in and out with g1_put and g1_get. */
#ifndef KVBM_EXAMPLES_G1_H
#define KVBM_EXAMPLES_G1_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* The driver calls used, as cuda.h declares them (handles as pointers,
 * CUdeviceptr as 64 bits). */
static struct {
    int cuda;
    int (*init)(unsigned);
    int (*retain)(void **, int);
    int (*set_current)(void *);
    int (*alloc)(uint64_t *, size_t);
    int (*free)(uint64_t);
    int (*htod)(uint64_t, const void *, size_t, void *);
    int (*dtoh)(void *, uint64_t, size_t, void *);
    int (*query)(void *);
} g1_cu;

#define G1_CU(call)                                                                         \
    do {                                                                                    \
        int g1_r_ = (call);                                                                 \
        if (g1_r_ != 0) {                                                                   \
            fprintf(stderr, "%s:%d: %s -> CUresult %d\n", __FILE__, __LINE__, #call, g1_r_); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* g1_open picks host or device G1 from the backend kvbm opened; under
 * cuda it makes device 0's primary context current on this thread, as an
 * engine's CUDA runtime does (kvbm's calls leave it so). */
static inline void g1_open(void) {
    kvbm_info_t info = KVBM_INFO_INIT;
    CHECK(kvbm_info(&info));
    g1_cu.cuda = strcmp(info.device_backend, "cuda") == 0;
    if (!g1_cu.cuda) return;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    EXPECT(lib != NULL);
    *(void **)&g1_cu.init = dlsym(lib, "cuInit");
    *(void **)&g1_cu.retain = dlsym(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&g1_cu.set_current = dlsym(lib, "cuCtxSetCurrent");
    *(void **)&g1_cu.alloc = dlsym(lib, "cuMemAlloc_v2");
    *(void **)&g1_cu.free = dlsym(lib, "cuMemFree_v2");
    *(void **)&g1_cu.htod = dlsym(lib, "cuMemcpyHtoDAsync_v2");
    *(void **)&g1_cu.dtoh = dlsym(lib, "cuMemcpyDtoHAsync_v2");
    *(void **)&g1_cu.query = dlsym(lib, "cuStreamQuery");
    EXPECT(g1_cu.init && g1_cu.retain && g1_cu.set_current && g1_cu.alloc && g1_cu.free &&
           g1_cu.htod && g1_cu.dtoh && g1_cu.query);
    void *ctx = NULL;
    G1_CU(g1_cu.init(0));
    G1_CU(g1_cu.retain(&ctx, 0));
    G1_CU(g1_cu.set_current(ctx));
}

/* The legacy default stream (0): its copies are waited for here. */
static inline void g1_wait(void) {
    int r;
    while ((r = g1_cu.query(NULL)) == 600) /* CUDA_ERROR_NOT_READY */
        ;
    G1_CU(r);
}

static inline void g1_put(uint64_t dst, const void *src, size_t n) {
    if (!g1_cu.cuda) {
        memcpy((void *)(uintptr_t)dst, src, n);
        return;
    }
    G1_CU(g1_cu.htod(dst, src, n, NULL));
    g1_wait();
}

static inline void g1_get(void *dst, uint64_t src, size_t n) {
    if (!g1_cu.cuda) {
        memcpy(dst, (const void *)(uintptr_t)src, n);
        return;
    }
    G1_CU(g1_cu.dtoh(dst, src, n, NULL));
    g1_wait();
}

/* g1_clear zeroes n bytes of G1 at p. */
static inline void g1_clear(uint64_t p, size_t n) {
    void *zero = calloc(1, n);
    EXPECT(zero != NULL);
    g1_put(p, zero, n);
    free(zero);
}

/* g1_alloc returns n zeroed bytes of G1 memory. */
static inline uint64_t g1_alloc(size_t n) {
    uint64_t p = 0;
    if (g1_cu.cuda) {
        G1_CU(g1_cu.alloc(&p, n));
    } else {
        void *h = NULL;
        EXPECT(posix_memalign(&h, 4096, n) == 0);
        p = (uint64_t)(uintptr_t)h;
    }
    g1_clear(p, n);
    return p;
}

static inline void g1_free(uint64_t p) {
    if (g1_cu.cuda)
        G1_CU(g1_cu.free(p));
    else
        free((void *)(uintptr_t)p);
}

#endif
