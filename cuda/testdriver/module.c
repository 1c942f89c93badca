// Modules and kernels. cuModuleLoadData reads a PTX image as the driver's
// JIT would refuse it (ISA version, target) and lists its entries with
// their parameter types; a kernel runs as its C twin, found by name, whose
// parameters must be exactly the PTX entry's.
#include "double.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ENTRIES 16
#define MAX_PARAMS 8

// Parameter types as PTX spells them (.u64, .u32, ...): size in bytes.
struct entry {
	char name[128];
	int n_params;
	int param_size[MAX_PARAMS];
};

struct CUmod_st {
	struct CUctx_st *ctx;
	int dead;
	int n_entries;
	struct entry entries[MAX_ENTRIES];
	struct CUfunc_st *functions;
	struct CUmod_st *next;
};

struct twin;

struct CUfunc_st {
	struct CUmod_st *mod;
	const struct twin *twin;
	struct CUfunc_st *next;
};

static struct CUmod_st *modules;

// ---- the kernels' twins ------------------------------------------------------

// kvbm_copy_fragments (cuda/kernels/copy.cu): fragment f of n copies
// size[f] bytes from src[f] to dst[f]; the three tables are in device
// memory. Blocks take fragments in turn (f = block, block + grid, ...), so
// every fragment is copied whatever the grid. A table or fragment the
// device cannot reach is an illegal address, as the kernel's load or store
// would be.
static CUresult copy_fragments(const uint64_t *args, unsigned grid) {
	unsigned n = (unsigned)args[3];
	struct kvd_copy *cp = calloc(n ? n : 1, sizeof *cp);
	size_t k = 0;
	CUresult r = CUDA_SUCCESS;
	// Addresses are translated under the lock; the bytes move outside it
	// (memory cannot go away meanwhile: freeing it waits for the streams).
	pthread_mutex_lock(&kvd_mu);
	const uint64_t *src = (const uint64_t *)kvd_device_view(args[0], (size_t)n * 8);
	const uint64_t *dst = (const uint64_t *)kvd_device_view(args[1], (size_t)n * 8);
	const uint64_t *size = (const uint64_t *)kvd_device_view(args[2], (size_t)n * 8);
	if (n && (!src || !dst || !size))
		r = CUDA_ERROR_ILLEGAL_ADDRESS;
	for (unsigned b = 0; b < grid && !r; b++) {
		for (unsigned f = b; f < n && !r; f += grid) {
			char *d = kvd_device_view(dst[f], size[f]);
			const char *s = kvd_device_view(src[f], size[f]);
			if (size[f] && (!d || !s))
				r = CUDA_ERROR_ILLEGAL_ADDRESS;
			else
				cp[k++] = (struct kvd_copy){d, s, size[f]};
		}
	}
	pthread_mutex_unlock(&kvd_mu);
	// A faulting kernel may have written some fragments: those before it.
	for (size_t i = 0; i < k; i++)
		kvd_copy_bytes(cp[i].dst, cp[i].src, cp[i].n);
	free(cp);
	return r;
}

struct twin {
	const char *name;
	int n_params;
	int param_size[MAX_PARAMS];
	kvd_twin run;
};

static const struct twin twins[] = {
	{"kvbm_copy_fragments", 4, {8, 8, 8, 4}, copy_fragments},
};

// ---- PTX ---------------------------------------------------------------------

// The newest PTX ISA each driver JITs (the PTX ISA release notes).
static int max_isa(void) {
	int v = KVD_DRIVER_VERSION;
	if (v >= 13000)
		return 90;
	if (v >= 12080)
		return 87;
	return 80;
}

static int param_size(const char *type) {
	if (!strncmp(type, ".u64", 4) || !strncmp(type, ".s64", 4) || !strncmp(type, ".b64", 4))
		return 8;
	if (!strncmp(type, ".u32", 4) || !strncmp(type, ".s32", 4) || !strncmp(type, ".b32", 4))
		return 4;
	return -1;
}

// parse_entries lists the .entry directives of ptx with their .param
// types; INVALID_PTX for a parameter it cannot read.
static CUresult parse_entries(const char *ptx, struct CUmod_st *m) {
	for (const char *p = strstr(ptx, ".entry"); p; p = strstr(p + 1, ".entry")) {
		if (m->n_entries == MAX_ENTRIES)
			return kvd_unsupported("cuModuleLoadData", "more than 16 entries in a module");
		struct entry *e = &m->entries[m->n_entries++];
		if (sscanf(p, ".entry %127[A-Za-z0-9_$](", e->name) != 1)
			return CUDA_ERROR_INVALID_PTX;
		const char *open = strchr(p, '('), *close = open ? strchr(open, ')') : NULL;
		if (!open || !close)
			return CUDA_ERROR_INVALID_PTX;
		for (const char *q = strstr(open, ".param"); q && q < close; q = strstr(q + 6, ".param")) {
			const char *t = q + 6;
			while (*t == ' ' || *t == '\t')
				t++;
			int size = param_size(t);
			if (size < 0)
				return kvd_unsupported("cuModuleLoadData", "kernel parameters other than 32- and 64-bit scalars");
			if (e->n_params == MAX_PARAMS)
				return kvd_unsupported("cuModuleLoadData", "kernels of more than 8 parameters");
			e->param_size[e->n_params++] = size;
		}
	}
	return CUDA_SUCCESS;
}

// check_ptx refuses an image the driver's JIT would: not PTX, an ISA newer
// than the driver's, or a target newer than the device (compute 9.0).
static CUresult check_ptx(const char *ptx) {
	int major, minor, sm;
	const char *v = strstr(ptx, "\n.version ");
	const char *t = strstr(ptx, "\n.target ");
	if (!v || sscanf(v, "\n.version %d.%d", &major, &minor) != 2 || !t)
		return CUDA_ERROR_INVALID_IMAGE;
	if (major * 10 + minor > max_isa())
		return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
	if (sscanf(t, "\n.target sm_%d", &sm) == 1 || sscanf(t, "\n.target compute_%d", &sm) == 1) {
		if (sm > 90)
			return CUDA_ERROR_NO_BINARY_FOR_GPU;
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_INVALID_PTX;
}

static CUresult module_load(CUmodule *out, const void *image) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	if (!out || !image)
		return CUDA_ERROR_INVALID_VALUE;
	const char *ptx = image;
	if ((unsigned char)ptx[0] == 0x7f || !memcmp(ptx, "\x50\xed\x55\xba", 4))
		return kvd_unsupported("cuModuleLoadData", "cubin and fatbin images (only PTX text)");
	if ((r = check_ptx(ptx)))
		return r;
	struct CUmod_st *m = calloc(1, sizeof *m);
	if ((r = parse_entries(ptx, m))) {
		free(m);
		return r;
	}
	m->ctx = c;
	m->next = modules;
	modules = m;
	*out = m;
	return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *out, const void *image) {
	kvd_called(__func__);
	pthread_mutex_lock(&kvd_mu);
	CUresult r = module_load(out, image);
	pthread_mutex_unlock(&kvd_mu);
	return r;
}

static struct CUmod_st *live_module(CUmodule h) {
	for (struct CUmod_st *m = modules; m; m = m->next)
		if (m == h && !m->dead)
			return m;
	return NULL;
}

static CUresult get_function(CUfunction *out, CUmodule h, const char *name) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	struct CUmod_st *m = live_module(h);
	if (!out || !name || !m)
		return CUDA_ERROR_INVALID_VALUE;
	const struct entry *e = NULL;
	for (int i = 0; i < m->n_entries; i++)
		if (!strcmp(m->entries[i].name, name))
			e = &m->entries[i];
	if (!e)
		return CUDA_ERROR_NOT_FOUND;
	const struct twin *tw = NULL;
	for (size_t i = 0; i < sizeof twins / sizeof twins[0]; i++)
		if (!strcmp(twins[i].name, name))
			tw = &twins[i];
	if (!tw)
		return kvd_unsupported("cuModuleGetFunction", name);
	if (tw->n_params != e->n_params || memcmp(tw->param_size, e->param_size, sizeof(int) * (size_t)e->n_params)) {
		fprintf(stderr, "kvbm CUDA double: cuModuleGetFunction: the PTX's %s takes other parameters than its C twin\n",
		        name);
		return CUDA_ERROR_INVALID_IMAGE;
	}
	struct CUfunc_st *f = calloc(1, sizeof *f);
	f->mod = m;
	f->twin = tw;
	f->next = m->functions;
	m->functions = f;
	*out = f;
	return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *out, CUmodule h, const char *name) {
	kvd_called(__func__);
	pthread_mutex_lock(&kvd_mu);
	CUresult r = get_function(out, h, name);
	pthread_mutex_unlock(&kvd_mu);
	return r;
}

static CUresult module_unload(CUmodule h) {
	struct CUctx_st *c;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	struct CUmod_st *m = live_module(h);
	if (!m)
		return CUDA_ERROR_INVALID_VALUE;
	// Launches already queued still run their twin (held by the op).
	m->dead = 1;
	return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule h) {
	kvd_called(__func__);
	pthread_mutex_lock(&kvd_mu);
	CUresult r = module_unload(h);
	pthread_mutex_unlock(&kvd_mu);
	return r;
}

void kvd_modules_destroy(struct CUctx_st *c) {
	for (struct CUmod_st *m = modules; m; m = m->next)
		if (m->ctx == c)
			m->dead = 1;
}

static struct CUfunc_st *live_function(CUfunction h) {
	for (struct CUmod_st *m = modules; m; m = m->next)
		for (struct CUfunc_st *f = m->functions; f; f = f->next)
			if (f == h && !m->dead)
				return f;
	return NULL;
}

static CUresult launch(CUfunction h, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, unsigned shared, CUstream hs, void **params, void **extra) {
	struct CUctx_st *c;
	struct CUstream_st *s;
	CUresult r = kvd_current(&c);
	if (r)
		return r;
	struct CUfunc_st *f = live_function(h);
	if (!f || f->mod->ctx != c)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!gx || !gy || !gz || !bx || !by || !bz || bx > 1024 || by > 1024 || bz > 64 ||
	    (unsigned long long)bx * by * bz > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	if (extra)
		return kvd_unsupported("cuLaunchKernel", "parameters passed through extra");
	if (!params)
		return CUDA_ERROR_INVALID_VALUE;
	if (gy != 1 || gz != 1 || shared)
		return kvd_unsupported("cuLaunchKernel", "2D/3D grids and dynamic shared memory");
	if ((r = kvd_stream("cuLaunchKernel", hs, 1, &s)))
		return r;
	// The parameters are read now: the caller may reuse them on return.
	struct kvd_op *op = calloc(1, sizeof *op);
	op->kind = KVD_OP_KERNEL;
	op->twin = f->twin->run;
	op->grid = gx;
	for (int i = 0; i < f->twin->n_params; i++) {
		if (f->twin->param_size[i] == 8)
			memcpy(&op->args[i], params[i], 8);
		else
			op->args[i] = *(const uint32_t *)params[i];
	}
	kvd_enqueue(s, op);
	return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shared, CUstream s, void **params,
                        void **extra) {
	kvd_called(__func__);
	pthread_mutex_lock(&kvd_mu);
	CUresult r = launch(f, gx, gy, gz, bx, by, bz, shared, s, params, extra);
	pthread_mutex_unlock(&kvd_mu);
	return r;
}
