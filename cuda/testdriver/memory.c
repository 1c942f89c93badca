// Memory: device allocations, pinned host memory, copies and CUDA IPC.
//
// A device allocation is a memfd mapped twice: once PROT_NONE, whose
// address is the device pointer (so a host access to device memory faults,
// as on a GPU), and once read-write, the view the double copies through.
// The memfd is what IPC hands to another process. Pinned host memory is
// device-accessible at its own address (unified addressing).
#include "double.h"

#include <cudaTypedefs.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct dalloc {
	struct CUctx_st *ctx;
	uint64_t dev;  // the device address (PROT_NONE)
	char *view;    // the same pages, read-write
	size_t size;
	int fd;        // the memfd (-1 for an IPC import: not re-exported)
	uint64_t id;   // unique in the process that allocated it
	pid_t owner;   // that process
	int imports;   // IPC opens of it in this process (0: our own allocation)
	struct dalloc *next;
};

struct pinned {
	struct CUctx_st *ctx;
	char *p;
	size_t size;
	int allocated; // cuMemHostAlloc (else cuMemHostRegister)
	struct pinned *next;
};

static struct dalloc *dallocs;
static struct pinned *pins;
static uint64_t next_id = 1;
static size_t device_used[KVD_MAX_DEVICES];


static struct dalloc *dalloc_at(uint64_t p, size_t n) {
	for (struct dalloc *a = dallocs; a; a = a->next)
		if (p >= a->dev && p - a->dev < a->size && n <= a->size - (p - a->dev))
			return a;
	return NULL;
}

static struct pinned *pinned_at(uint64_t p, size_t n) {
	for (struct pinned *h = pins; h; h = h->next)
		if (p >= (uint64_t)(uintptr_t)h->p && p - (uint64_t)(uintptr_t)h->p < h->size &&
		    n <= h->size - (p - (uint64_t)(uintptr_t)h->p))
			return h;
	return NULL;
}

char *kvd_device_view(uint64_t p, size_t n) {
	struct dalloc *a = dalloc_at(p, n);
	if (a)
		return a->view + (p - a->dev);
	return pinned_at(p, n) ? (char *)(uintptr_t)p : NULL;
}

char *kvd_host_view(uint64_t p, size_t n) {
	struct dalloc *a = dalloc_at(p, n);
	return a ? a->view + (p - a->dev) : (char *)(uintptr_t)p;
}

static size_t page_round(size_t n) {
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	return (n + pg - 1) / pg * pg;
}

// map_device maps fd's size bytes twice (see above).
static CUresult map_device(int fd, size_t size, struct dalloc *a) {
	size_t len = page_round(size);
	a->view = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (a->view == MAP_FAILED)
		return CUDA_ERROR_MAP_FAILED;
	void *dev = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (dev == MAP_FAILED) {
		munmap(a->view, len);
		return CUDA_ERROR_MAP_FAILED;
	}
	a->dev = (uint64_t)(uintptr_t)dev;
	a->size = size;
	return CUDA_SUCCESS;
}

static void unmap_device(struct dalloc *a) {
	munmap(a->view, page_round(a->size));
	munmap((void *)(uintptr_t)a->dev, page_round(a->size));
	if (a->fd >= 0)
		close(a->fd);
}

static CUresult mem_alloc(CUdeviceptr *p, size_t size) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	if (!p || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (size > (16ULL << 30) - device_used[c->device])
		return CUDA_ERROR_OUT_OF_MEMORY;
	struct dalloc *a = calloc(1, sizeof *a);
	char name[64];
	snprintf(name, sizeof name, "kvbm-cuda-double-%d-%llu", (int)getpid(), (unsigned long long)next_id);
	a->fd = memfd_create(name, MFD_CLOEXEC);
	if (a->fd < 0 || ftruncate(a->fd, (off_t)page_round(size)) != 0 || map_device(a->fd, size, a) != 0) {
		if (a->fd >= 0)
			close(a->fd);
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->ctx = c;
	a->id = next_id++;
	a->owner = getpid();
	a->next = dallocs;
	dallocs = a;
	device_used[c->device] += size;
	*p = a->dev;
	return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *p, size_t size) {
	kvd_called(__func__);
	LOCKED(mem_alloc(p, size));
}

static void dalloc_unlink(struct dalloc *a) {
	for (struct dalloc **pp = &dallocs; *pp; pp = &(*pp)->next) {
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	}
	if (!a->imports)
		device_used[a->ctx->device] -= a->size;
	unmap_device(a);
	free(a);
}

static CUresult mem_free(CUdeviceptr p) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	struct dalloc *a = dalloc_at(p, 1);
	if (!a || a->dev != p || a->imports)
		return CUDA_ERROR_INVALID_VALUE;
	// Freeing synchronizes: work still using the memory finishes first, on
	// whichever context's stream it is (unified addressing lets any reach it).
	kvd_ctx_idle(NULL);
	dalloc_unlink(a);
	return CUDA_SUCCESS;
}

CUresult cuMemFree(CUdeviceptr p) {
	kvd_called(__func__);
	LOCKED(mem_free(p));
}

static struct pinned *pinned_overlap(const char *p, size_t n) {
	for (struct pinned *h = pins; h; h = h->next)
		if (p < h->p + h->size && h->p < p + n)
			return h;
	return NULL;
}

static void pinned_unlink(struct pinned *h) {
	for (struct pinned **pp = &pins; *pp; pp = &(*pp)->next) {
		if (*pp == h) {
			*pp = h->next;
			break;
		}
	}
	if (h->allocated)
		munmap(h->p, page_round(h->size));
	free(h);
}

// pin_add records [p, p+size) as pinned in c: allocated by cuMemHostAlloc,
// or registered.
static void pin_add(struct CUctx_st *c, void *p, size_t size, int allocated) {
	struct pinned *h = calloc(1, sizeof *h);
	h->ctx = c;
	h->p = p;
	h->size = size;
	h->allocated = allocated;
	h->next = pins;
	pins = h;
}

// unpin ends the pinning that starts at p, if it is of the kind asked
// (allocated or registered); else notfound.
static CUresult unpin(void *p, int allocated, CUresult notfound) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	struct pinned *h = pinned_at((uint64_t)(uintptr_t)p, 1);
	if (!h || h->p != p || h->allocated != allocated)
		return notfound;
	kvd_ctx_idle(NULL);
	pinned_unlink(h);
	return CUDA_SUCCESS;
}

static CUresult host_alloc(void **pp, size_t size, unsigned flags) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	if (!pp || size == 0 || (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
	                                            CU_MEMHOSTALLOC_WRITECOMBINED)))
		return CUDA_ERROR_INVALID_VALUE;
	// Pinned: the pages are made resident inside the call, on this
	// thread (under its memory policy).
	void *p = mmap(NULL, page_round(size), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pin_add(c, p, size, 1);
	*pp = p;
	return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
	kvd_called(__func__);
	LOCKED(host_alloc(pp, size, flags));
}

CUresult cuMemFreeHost(void *p) {
	kvd_called(__func__);
	LOCKED(unpin(p, 1, CUDA_ERROR_INVALID_VALUE));
}

static CUresult host_register(void *p, size_t size, unsigned flags) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	const unsigned known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
	                       CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
	if (!p || size == 0 || (flags & ~known))
		return CUDA_ERROR_INVALID_VALUE;
	if (flags & (CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY))
		return kvd_unsupported("cuMemHostRegister_v2", "CU_MEMHOSTREGISTER_IOMEMORY and _READ_ONLY");
	if (pinned_overlap(p, size))
		return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
	if (dalloc_at((uint64_t)(uintptr_t)p, 1))
		return CUDA_ERROR_INVALID_VALUE;
	// Pages that are not mapped cannot be pinned.
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)p / pg * pg, end = ((uintptr_t)p + size + pg - 1) / pg * pg;
	unsigned char vec[256];
	for (uintptr_t a = start; a < end; a += 256 * pg) {
		size_t len = end - a < 256 * pg ? end - a : 256 * pg;
		if (mincore((void *)a, len, vec) != 0 && errno == ENOMEM)
			return CUDA_ERROR_INVALID_VALUE;
	}
	pin_add(c, p, size, 0);
	return CUDA_SUCCESS;
}

CUresult cuMemHostRegister(void *p, size_t size, unsigned int flags) {
	kvd_called(__func__);
	LOCKED(host_register(p, size, flags));
}

CUresult cuMemHostUnregister(void *p) {
	kvd_called(__func__);
	LOCKED(unpin(p, 0, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED));
}

static CUresult pointer_attribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	if (!data)
		return CUDA_ERROR_INVALID_VALUE;
	struct dalloc *a = dalloc_at(p, 1);
	struct pinned *h = a ? NULL : pinned_at(p, 1);
	if (!a && !h) // memory the driver does not know
		return CUDA_ERROR_INVALID_VALUE;
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned *)data = a ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = a ? a->ctx->device : h->ctx->device;
		return CUDA_SUCCESS;
	default:
		return kvd_unsupported_attr("cuPointerGetAttribute", (int)attr);
	}
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
	kvd_called(__func__);
	LOCKED(pointer_attribute(data, attr, p));
}

static CUresult get_address_range(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	struct dalloc *a = dalloc_at(p, 1);
	if (!a)
		return CUDA_ERROR_NOT_FOUND;
	if (base)
		*base = a->dev;
	if (size)
		*size = a->size;
	return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	kvd_called(__func__);
	LOCKED(get_address_range(base, size, p));
}

// ---- copies ------------------------------------------------------------------

// enqueue_copies queues n copies (already translated) on h as one piece
// of work.
static CUresult enqueue_copies(const char *call, CUstream h, struct kvd_copy *copies, size_t n) {
	struct CUstream_st *s;
	CUresult r = kvd_stream(call, h, 1, &s);
	if (r) {
		free(copies);
		return r;
	}
	struct kvd_op *op = calloc(1, sizeof *op);
	op->kind = KVD_OP_COPY;
	op->copies = copies;
	op->n_copies = n;
	kvd_enqueue(s, op);
	return CUDA_SUCCESS;
}

// copy_async: dst_dev and src_dev say which side must be device-accessible
// memory; a host side may be any host memory (pageable included).
static CUresult copy_async(const char *call, uint64_t dst, int dst_dev, uint64_t src, int src_dev, size_t n,
                           CUstream h) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	if (n == 0)
		return CUDA_SUCCESS;
	char *d = dst_dev ? kvd_device_view(dst, n) : kvd_host_view(dst, n);
	char *s = src_dev ? kvd_device_view(src, n) : kvd_host_view(src, n);
	if (!d || !s || dst == 0 || src == 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct kvd_copy *cp = malloc(sizeof *cp);
	*cp = (struct kvd_copy){d, s, n};
	return enqueue_copies(call, h, cp, 1);
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream h) {
	kvd_called(__func__);
	LOCKED(copy_async("cuMemcpyHtoDAsync_v2", dst, 1, (uint64_t)(uintptr_t)src, 0, n, h));
}
CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream h) {
	kvd_called(__func__);
	LOCKED(copy_async("cuMemcpyDtoHAsync_v2", (uint64_t)(uintptr_t)dst, 0, src, 1, n, h));
}
CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
	kvd_called(__func__);
	LOCKED(copy_async("cuMemcpyDtoDAsync_v2", dst, 1, src, 1, n, h));
}

// batch checks and queues a cuMemcpyBatchAsync. The whole batch is parsed
// before anything is queued; an error that concerns one copy names it in
// *fail (SIZE_MAX otherwise). Copies of a batch run in no particular order.
static CUresult batch(const char *call, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                      CUmemcpyAttributes *attrs, size_t *attr_idx, size_t n_attrs, size_t *fail, CUstream h) {
	struct CUctx_st *c;
	*fail = SIZE_MAX;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	if (h == NULL || h == CU_STREAM_LEGACY) // never the legacy stream
		return CUDA_ERROR_INVALID_VALUE;
	if (!dsts || !srcs || !sizes || count == 0 || !attrs || !attr_idx || n_attrs == 0 || n_attrs > count)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t k = 0; k < n_attrs; k++) {
		if ((k == 0 && attr_idx[0] != 0) || (k > 0 && attr_idx[k] <= attr_idx[k - 1]) || attr_idx[k] >= count)
			return CUDA_ERROR_INVALID_VALUE;
		int order = attrs[k].srcAccessOrder;
		if (order != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM && order != CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL &&
		    order != CU_MEMCPY_SRC_ACCESS_ORDER_ANY) {
			*fail = attr_idx[k];
			return CUDA_ERROR_INVALID_VALUE;
		}
		if (order != CU_MEMCPY_SRC_ACCESS_ORDER_STREAM || attrs[k].flags)
			return kvd_unsupported(call, "source access orders but STREAM, and copy flags");
	}
	struct kvd_copy *cp = calloc(count, sizeof *cp);
	size_t n = 0;
	for (size_t i = 0; i < count; i++) {
		if (sizes[i] == 0)
			continue;
		// Unified addressing: each side is device or host memory, as it is.
		cp[n] = (struct kvd_copy){kvd_host_view(dsts[i], sizes[i]), kvd_host_view(srcs[i], sizes[i]), sizes[i]};
		if (!dsts[i] || !srcs[i] || (dalloc_at(dsts[i], 1) && !dalloc_at(dsts[i], sizes[i])) ||
		    (dalloc_at(srcs[i], 1) && !dalloc_at(srcs[i], sizes[i]))) {
			free(cp);
			*fail = i;
			return CUDA_ERROR_INVALID_VALUE;
		}
		n++;
	}
	return enqueue_copies(call, h, cp, n);
}

#ifndef KVD_CUDA12
// CUDA 13's cuMemcpyBatchAsync_v2 (cuda.h maps the name to it).
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                            CUmemcpyAttributes *attrs, size_t *attr_idx, size_t n_attrs, CUstream h) {
	kvd_called(__func__);
	size_t fail;
	LOCKED(batch("cuMemcpyBatchAsync_v2", dsts, srcs, sizes, count, attrs, attr_idx, n_attrs, &fail, h));
}
#endif
#undef cuMemcpyBatchAsync

// CUDA 12.8's cuMemcpyBatchAsync, with failIdx; its type is checked against
// cudaTypedefs.h's PFN below.
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                            CUmemcpyAttributes *attrs, size_t *attr_idx, size_t n_attrs, size_t *fail_idx,
                            CUstream h) {
	kvd_called(__func__);
	size_t fail;
	pthread_mutex_lock(&kvd_mu);
	CUresult r = batch("cuMemcpyBatchAsync", dsts, srcs, sizes, count, attrs, attr_idx, n_attrs, &fail, h);
	pthread_mutex_unlock(&kvd_mu);
	if (r && fail_idx)
		*fail_idx = fail;
	return r;
}
static const PFN_cuMemcpyBatchAsync_v12080 batch_v12080 __attribute__((unused)) = cuMemcpyBatchAsync;

// ---- IPC -----------------------------------------------------------------------

// The 64 bytes of a CUipcMemHandle: which process's which allocation, and
// the descriptor of its memfd there.
struct ipc_handle {
	char magic[8];
	int32_t pid, fd;
	uint64_t id, size;
};
_Static_assert(sizeof(struct ipc_handle) <= sizeof(CUipcMemHandle), "handle");
static const char ipc_magic[8] = "kvbmCUD";

static CUresult ipc_get(CUipcMemHandle *out, CUdeviceptr p) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	struct dalloc *a = dalloc_at(p, 1);
	if (!a || a->dev != p || a->imports) // the base of our own allocation only
		return CUDA_ERROR_INVALID_VALUE;
	struct ipc_handle h = {.pid = (int32_t)a->owner, .fd = a->fd, .id = a->id, .size = a->size};
	memcpy(h.magic, ipc_magic, sizeof h.magic);
	memset(out, 0, sizeof *out);
	memcpy(out->reserved, &h, sizeof h);
	return CUDA_SUCCESS;
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *out, CUdeviceptr p) {
	kvd_called(__func__);
	LOCKED(ipc_get(out, p));
}

// open_exported opens the exporter's memfd through /proc, after checking
// the descriptor still is that allocation's (by the memfd's name).
static int open_exported(const struct ipc_handle *h) {
	char path[64], link[256], want[96];
	snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
	ssize_t n = readlink(path, link, sizeof link - 1);
	if (n < 0)
		return -1;
	link[n] = 0;
	snprintf(want, sizeof want, "/memfd:kvbm-cuda-double-%d-%llu ", (int)h->pid, (unsigned long long)h->id);
	if (strncmp(link, want, strlen(want)) != 0)
		return -1;
	return open(path, O_RDWR | O_CLOEXEC);
}

static CUresult ipc_open(CUdeviceptr *p, CUipcMemHandle handle, unsigned flags) {
	struct CUctx_st *c;
	struct ipc_handle h;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	if (!p || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(&h, handle.reserved, sizeof h);
	if (memcmp(h.magic, ipc_magic, sizeof h.magic) != 0)
		return CUDA_ERROR_INVALID_HANDLE;
	if (h.pid == (int32_t)getpid()) // not in the process that exported it
		return CUDA_ERROR_INVALID_CONTEXT;
	for (struct dalloc *a = dallocs; a; a = a->next) {
		if (a->imports && a->owner == h.pid && a->id == h.id && a->ctx == c) {
			a->imports++; // opened already by this context: counted
			*p = a->dev;
			return CUDA_SUCCESS;
		}
	}
	int fd = open_exported(&h);
	if (fd < 0)
		return CUDA_ERROR_INVALID_HANDLE;
	struct stat st;
	struct dalloc *a = calloc(1, sizeof *a);
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < h.size || map_device(fd, h.size, a) != 0) {
		close(fd);
		free(a);
		return CUDA_ERROR_MAP_FAILED;
	}
	close(fd);
	a->fd = -1;
	a->ctx = c;
	a->id = h.id;
	a->owner = h.pid;
	a->imports = 1;
	a->next = dallocs;
	dallocs = a;
	*p = a->dev;
	return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags) {
	kvd_called(__func__);
	LOCKED(ipc_open(p, handle, flags));
}

static CUresult ipc_close(CUdeviceptr p) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	struct dalloc *a = dalloc_at(p, 1);
	if (!a || a->dev != p || !a->imports)
		return CUDA_ERROR_INVALID_VALUE;
	if (--a->imports == 0) {
		kvd_ctx_idle(NULL);
		dalloc_unlink(a);
	}
	return CUDA_SUCCESS;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
	kvd_called(__func__);
	LOCKED(ipc_close(p));
}

void kvd_memory_destroy(struct CUctx_st *c) {
	for (struct dalloc **pp = &dallocs; *pp;) {
		struct dalloc *a = *pp;
		if (a->ctx != c) {
			pp = &a->next;
			continue;
		}
		dalloc_unlink(a);
	}
	for (struct pinned **pp = &pins; *pp;) {
		struct pinned *h = *pp;
		if (h->ctx != c) {
			pp = &h->next;
			continue;
		}
		pinned_unlink(h);
	}
}
