// See shim.h. Declarations copied from UCX 1.13.1's public headers.
#include "shim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "ucxabi.h"

kvbm_ucx_table_t kvbm_ucx_U;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static const char *load_path;
static char load_err[512];
static int load_rc = -1;

#define SYM(field, name)                                                                 \
	do {                                                                             \
		*(void **)&U.field = dlsym(lib, name);                                   \
		if (!U.field) {                                                          \
			snprintf(load_err, sizeof load_err, "%s: symbol %s not found", load_path, name); \
			return;                                                          \
		}                                                                        \
	} while (0)

static void load(void) {
	void *lib = dlopen(load_path, RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		const char *e = dlerror();
		snprintf(load_err, sizeof load_err, "%s", e ? e : "dlopen failed");
		return;
	}
	SYM(get_version, "ucp_get_version");
	SYM(status_string, "ucs_status_string");
	SYM(config_read, "ucp_config_read");
	SYM(config_modify, "ucp_config_modify");
	SYM(config_release, "ucp_config_release");
	SYM(config_print, "ucp_config_print");
	SYM(init_version, "ucp_init_version");
	SYM(cleanup, "ucp_cleanup");
	SYM(worker_create, "ucp_worker_create");
	SYM(worker_destroy, "ucp_worker_destroy");
	SYM(worker_get_address, "ucp_worker_get_address");
	SYM(worker_release_address, "ucp_worker_release_address");
	SYM(worker_progress, "ucp_worker_progress");
	SYM(mem_map, "ucp_mem_map");
	SYM(mem_unmap, "ucp_mem_unmap");
	SYM(mem_query, "ucp_mem_query");
	SYM(rkey_pack, "ucp_rkey_pack");
	SYM(rkey_buffer_release, "ucp_rkey_buffer_release");
	SYM(ep_create, "ucp_ep_create");
	SYM(ep_close_nbx, "ucp_ep_close_nbx");
	SYM(ep_flush_nbx, "ucp_ep_flush_nbx");
	SYM(ep_rkey_unpack, "ucp_ep_rkey_unpack");
	SYM(rkey_destroy, "ucp_rkey_destroy");
	SYM(put_nbx, "ucp_put_nbx");
	SYM(get_nbx, "ucp_get_nbx");
	SYM(request_free, "ucp_request_free");
	SYM(ep_print_info, "ucp_ep_print_info");
	SYM(context_print_info, "ucp_context_print_info");
	SYM(worker_set_am_recv_handler, "ucp_worker_set_am_recv_handler");
	SYM(am_send_nbx, "ucp_am_send_nbx");
	SYM(am_recv_data_nbx, "ucp_am_recv_data_nbx");
	SYM(am_data_release, "ucp_am_data_release");
	SYM(dt_create_generic, "ucp_dt_create_generic");
	// The library is never closed: one per process, like libkvbm.so.
	load_rc = 0;
}

int kvbm_ucx_load(const char *path, char *err, size_t errlen) {
	load_path = strdup(path);
	pthread_once(&load_once, load);
	if (load_rc != 0) {
		snprintf(err, errlen, "%s", load_err);
	}
	return load_rc;
}

void kvbm_ucx_version(unsigned *major, unsigned *minor, unsigned *release) {
	U.get_version(major, minor, release);
}

const char *kvbm_ucx_status_string(int32_t status) { return U.status_string(status); }

// The API version we are written against (ucp_version.h of 1.13): the
// library checks it only to warn when it is older than that.
#define API_MAJOR 1
#define API_MINOR 10

int32_t kvbm_ucx_init(const char **names, const char **values, int n, int one_sided, uint64_t *context) {
	ucp_config_t *config;
	ucs_status_t st = U.config_read(NULL, NULL, &config);
	if (st != UCS_OK) {
		return st;
	}
	for (int i = 0; i < n; i++) {
		if ((st = U.config_modify(config, names[i], values[i])) != UCS_OK) {
			U.config_release(config);
			return st;
		}
	}
	ucp_params_t params;
	memset(&params, 0, sizeof params);
	params.field_mask = UCP_PARAM_FIELD_FEATURES;
	// Without RMA, UCX installs no handler that reads or writes memory
	// at an address a peer names (its software RMA, rma_sw.c): a peer
	// reaches memory only through the requests kvbm answers.
	params.features = one_sided ? UCP_FEATURE_RMA : UCP_FEATURE_AM;
	ucp_context_h ctx;
	st = U.init_version(API_MAJOR, API_MINOR, &params, config, &ctx);
	U.config_release(config);
	if (st == UCS_OK) {
		*context = (uint64_t)(uintptr_t)ctx;
	}
	return st;
}

void kvbm_ucx_cleanup(uint64_t context) { U.cleanup((ucp_context_h)(uintptr_t)context); }

int32_t kvbm_ucx_worker_create(uint64_t context, uint64_t *worker) {
	ucp_worker_params_t params;
	memset(&params, 0, sizeof params);
	params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	params.thread_mode = UCS_THREAD_MODE_SINGLE;
	ucp_worker_h w;
	ucs_status_t st = U.worker_create((ucp_context_h)(uintptr_t)context, &params, &w);
	if (st == UCS_OK) {
		*worker = (uint64_t)(uintptr_t)w;
	}
	return st;
}

void kvbm_ucx_worker_destroy(uint64_t worker) { U.worker_destroy((ucp_worker_h)(uintptr_t)worker); }

int32_t kvbm_ucx_worker_address(uint64_t worker, void **addr, size_t *len) {
	return U.worker_get_address((ucp_worker_h)(uintptr_t)worker, (ucp_address_t **)addr, len);
}

void kvbm_ucx_worker_release_address(uint64_t worker, void *addr) {
	U.worker_release_address((ucp_worker_h)(uintptr_t)worker, (ucp_address_t *)addr);
}

void kvbm_ucx_precise_naps(void) { prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL); }

void kvbm_ucx_nap(unsigned usec) {
	struct timespec ts = {.tv_sec = usec / 1000000, .tv_nsec = (long)(usec % 1000000) * 1000};
	nanosleep(&ts, NULL);
}

unsigned kvbm_ucx_progress(uint64_t worker, int max) {
	ucp_worker_h w = (ucp_worker_h)(uintptr_t)worker;
	unsigned total = 0;
	for (int i = 0; i < max; i++) {
		unsigned n = U.worker_progress(w);
		total += n;
		if (n == 0) {
			break;
		}
	}
	if (total == 0) {
		// Nothing happened: let the peer's progress thread (on the
		// same cores, when both processes share a host) run.
		sched_yield();
	}
	return total;
}

int32_t kvbm_ucx_mem_map(uint64_t context, uint64_t addr, uint64_t size, int cuda, uint64_t *memh) {
	ucp_mem_map_params_t params;
	memset(&params, 0, sizeof params);
	params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
	                    UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
	params.address = (void *)(uintptr_t)addr;
	params.length = size;
	params.memory_type = cuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
	ucp_mem_h h;
	ucs_status_t st = U.mem_map((ucp_context_h)(uintptr_t)context, &params, &h);
	if (st == UCS_OK) {
		*memh = (uint64_t)(uintptr_t)h;
	}
	return st;
}

int32_t kvbm_ucx_mem_alloc(uint64_t context, uint64_t size, uint64_t *memh, uint64_t *addr, uint64_t *len) {
	ucp_mem_map_params_t params;
	memset(&params, 0, sizeof params);
	params.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
	params.length = size;
	params.flags = UCP_MEM_MAP_ALLOCATE;
	ucp_mem_h h;
	ucs_status_t st = U.mem_map((ucp_context_h)(uintptr_t)context, &params, &h);
	if (st != UCS_OK) {
		return st;
	}
	ucp_mem_attr_t attr;
	memset(&attr, 0, sizeof attr);
	attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
	if ((st = U.mem_query(h, &attr)) != UCS_OK) {
		U.mem_unmap((ucp_context_h)(uintptr_t)context, h);
		return st;
	}
	*memh = (uint64_t)(uintptr_t)h;
	*addr = (uint64_t)(uintptr_t)attr.address;
	*len = attr.length;
	return UCS_OK;
}

int32_t kvbm_ucx_mem_unmap(uint64_t context, uint64_t memh) {
	return U.mem_unmap((ucp_context_h)(uintptr_t)context, (ucp_mem_h)(uintptr_t)memh);
}

int32_t kvbm_ucx_rkey_pack(uint64_t context, uint64_t memh, void **buf, size_t *len) {
	return U.rkey_pack((ucp_context_h)(uintptr_t)context, (ucp_mem_h)(uintptr_t)memh, buf, len);
}

void kvbm_ucx_rkey_buffer_release(void *buf) { U.rkey_buffer_release(buf); }

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status) {
	(void)ep;
	kvbm_ucx_epstate_t *s = arg;
	if (s->failed == 0) {
		s->failed = status;
	}
}

int32_t kvbm_ucx_ep_create(uint64_t worker, const void *addr, kvbm_ucx_epstate_t *state, uint64_t *ep) {
	ucp_ep_params_t params;
	memset(&params, 0, sizeof params);
	params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
	                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
	params.address = addr;
	params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
	params.err_handler.cb = ep_error;
	params.err_handler.arg = state;
	ucp_ep_h e;
	ucs_status_t st = U.ep_create((ucp_worker_h)(uintptr_t)worker, &params, &e);
	if (st == UCS_OK) {
		*ep = (uint64_t)(uintptr_t)e;
	}
	return st;
}

static void close_done(void *request, ucs_status_t status, void *user_data) {
	(void)status;
	((kvbm_ucx_epstate_t *)user_data)->closing = 0;
	U.request_free(request);
}

void kvbm_ucx_ep_close(uint64_t ep, int force, kvbm_ucx_epstate_t *state) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
	p.cb.send = close_done;
	p.user_data = state;
	state->closing = 1;
	ucs_status_ptr_t r = U.ep_close_nbx((ucp_ep_h)(uintptr_t)ep, &p);
	if (!PTR_IS_PTR(r)) {
		state->closing = 0; // done at once, or failed (the endpoint is released either way)
	}
}

int32_t kvbm_ucx_rkey_unpack(uint64_t ep, const void *buf, uint64_t *rkey) {
	ucp_rkey_h k;
	ucs_status_t st = U.ep_rkey_unpack((ucp_ep_h)(uintptr_t)ep, buf, &k);
	if (st == UCS_OK) {
		*rkey = (uint64_t)(uintptr_t)k;
	}
	return st;
}

void kvbm_ucx_rkey_destroy(uint64_t rkey) { U.rkey_destroy((ucp_rkey_h)(uintptr_t)rkey); }

static void op_fail(kvbm_ucx_batch_t *b, ucs_status_t st) {
	if (b->status == 0) {
		b->status = st;
	}
}

static void op_done(void *request, ucs_status_t status, void *user_data) {
	kvbm_ucx_op_t *op = user_data;
	kvbm_ucx_batch_t *b = op->batch;
	if (status != UCS_OK) {
		op_fail(b, status);
	}
	b->done_bytes += op->size;
	b->outstanding--;
	U.request_free(request);
}

int kvbm_ucx_post(uint64_t ep, int write, kvbm_ucx_op_t *ops, int from, int n, int64_t budget, int64_t *posted) {
	ucp_ep_h e = (ucp_ep_h)(uintptr_t)ep;
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
	p.cb.send = op_done;
	p.memory_type = UCS_MEMORY_TYPE_HOST; // the local side is host memory of this process
	int i = from;
	int64_t sent = 0;
	for (; i < n && (i == from || sent < budget); i++) {
		kvbm_ucx_op_t *op = &ops[i];
		kvbm_ucx_batch_t *b = op->batch;
		if (b->status != 0) {
			break;
		}
		p.user_data = op;
		ucs_status_ptr_t r;
		if (write) {
			r = U.put_nbx(e, (const void *)(uintptr_t)op->local, op->size, op->remote,
			              (ucp_rkey_h)(uintptr_t)op->rkey, &p);
		} else {
			r = U.get_nbx(e, (void *)(uintptr_t)op->local, op->size, op->remote,
			              (ucp_rkey_h)(uintptr_t)op->rkey, &p);
		}
		sent += op->size;
		if (r == NULL) {
			b->done_bytes += op->size;
		} else if (PTR_IS_ERR(r)) {
			op_fail(b, PTR_STATUS(r));
			b->done_bytes += op->size;
			i++;
			break;
		} else {
			b->outstanding++;
		}
	}
	*posted += sent;
	return i;
}

static void flush_done(void *request, ucs_status_t status, void *user_data) {
	kvbm_ucx_batch_t *b = user_data;
	if (status != UCS_OK) {
		op_fail(b, status);
	}
	b->flush_pending = 0;
	U.request_free(request);
}

void kvbm_ucx_flush(uint64_t ep, kvbm_ucx_batch_t *b) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.cb.send = flush_done;
	p.user_data = b;
	b->flush_pending = 1;
	ucs_status_ptr_t r = U.ep_flush_nbx((ucp_ep_h)(uintptr_t)ep, &p);
	if (r == NULL) {
		b->flush_pending = 0;
	} else if (PTR_IS_ERR(r)) {
		op_fail(b, PTR_STATUS(r));
		b->flush_pending = 0;
	}
}

// print_buf opens buf (len bytes, zeroed) as a stream for UCX's print
// functions, keeping its last byte a NUL; NULL when it cannot.
static FILE *print_buf(char *buf, size_t len) {
	if (len == 0) {
		return NULL;
	}
	memset(buf, 0, len);
	return fmemopen(buf, len - 1, "w");
}

size_t kvbm_ucx_print_ep(uint64_t ep, char *buf, size_t len) {
	FILE *f = print_buf(buf, len);
	if (!f) {
		return 0;
	}
	U.ep_print_info((ucp_ep_h)(uintptr_t)ep, f);
	fclose(f);
	return strlen(buf);
}

size_t kvbm_ucx_print_context(uint64_t context, char *buf, size_t len) {
	FILE *f = print_buf(buf, len);
	if (!f) {
		return 0;
	}
	U.context_print_info((ucp_context_h)(uintptr_t)context, f);
	fclose(f);
	return strlen(buf);
}

// UCS_CONFIG_PRINT_CONFIG (ucs/config/types.h): the values, one
// "UCX_NAME=value" line each.
#define PRINT_CONFIG 1

size_t kvbm_ucx_print_config(char *buf, size_t len) {
	ucp_config_t *config;
	if (U.config_read(NULL, NULL, &config) != UCS_OK) {
		return 0;
	}
	FILE *f = print_buf(buf, len);
	if (f) {
		U.config_print(config, f, NULL, PRINT_CONFIG);
		fclose(f);
	}
	U.config_release(config);
	return f ? strlen(buf) : 0;
}
