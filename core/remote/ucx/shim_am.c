// See shim.h: kvbm's active messages. The handler runs inside
// ucp_worker_progress, on the progress thread: it only queues what came,
// and Go decides after progress returns what to do with each message.
#include "shim.h"
#include "ucxabi.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static ucs_status_t on_message(void *arg, const void *header, size_t header_len, void *data, size_t length,
                               const ucp_am_recv_param_t *param) {
	kvbm_ucx_inbox_t *in = arg;
	int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
	kvbm_ucx_msg_t *m = calloc(1, sizeof *m + header_len);
	void *copy = NULL;
	if (m && !rndv && length > 0 && !(copy = malloc(length))) {
		free(m);
		m = NULL;
	}
	if (!m) {
		// Dropped: the requester's deadline fails its request.
		in->refused++;
		return UCS_OK;
	}
	memcpy(m->header, header, header_len);
	m->header_len = (uint32_t)header_len;
	m->length = length;
	if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
		m->reply_ep = (uint64_t)(uintptr_t)param->reply_ep;
	}
	if (rndv) {
		m->desc = (uint64_t)(uintptr_t)data; // kept by returning UCS_INPROGRESS
	} else if (length > 0) {
		memcpy(copy, data, length);
		m->data = copy;
	}
	if (in->tail) {
		in->tail->next = m;
	} else {
		in->head = m;
	}
	in->tail = m;
	return rndv ? UCS_INPROGRESS : UCS_OK;
}

int32_t kvbm_ucx_am_listen(uint64_t worker, unsigned id, kvbm_ucx_inbox_t *in) {
	ucp_am_handler_param_t p;
	memset(&p, 0, sizeof p);
	p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
	               UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
	p.id = id;
	p.flags = UCP_AM_FLAG_WHOLE_MSG;
	p.cb = on_message;
	p.arg = in;
	return U.worker_set_am_recv_handler((ucp_worker_h)(uintptr_t)worker, &p);
}

kvbm_ucx_msg_t *kvbm_ucx_am_take(kvbm_ucx_inbox_t *in) {
	kvbm_ucx_msg_t *m = in->head;
	in->head = in->tail = NULL;
	return m;
}

void kvbm_ucx_msg_free(kvbm_ucx_msg_t *m) {
	free(m->data);
	free(m);
}

static void req_finish(kvbm_ucx_req_t *r, ucs_status_ptr_t p) {
	if (p == NULL) {
		r->done = 1;
	} else if (PTR_IS_ERR(p)) {
		r->status = PTR_STATUS(p);
		r->done = 1;
	}
}

// set_buffer sets p's datatype for the iovcnt pieces of iov and returns
// the buffer and count to pass: one piece as contiguous bytes (which UCX
// can move zero-copy), several as an iov, none as nothing; always an iov
// with as_iov.
static void *set_buffer(ucp_request_param_t *p, const kvbm_ucx_iov_t *iov, size_t iovcnt, size_t *count, int as_iov) {
	if (iovcnt > 1 || (as_iov && iovcnt == 1)) {
		p->datatype = UCP_DATATYPE_IOV;
		*count = iovcnt;
		return (void *)iov;
	}
	p->datatype = UCP_DT_CONTIG_BYTES;
	*count = iovcnt == 1 ? iov[0].length : 0;
	return iovcnt == 1 ? (void *)(uintptr_t)iov[0].buffer : NULL;
}

static void send_done(void *request, ucs_status_t status, void *user_data) {
	kvbm_ucx_req_t *r = user_data;
	r->status = status;
	r->done = 1;
	U.request_free(request);
}

void kvbm_ucx_am_send(uint64_t ep, unsigned id, const void *header, size_t header_len,
                      const kvbm_ucx_iov_t *iov, size_t iovcnt, int eager, int reply, kvbm_ucx_req_t *r) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof p);
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS |
	                 UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
	p.cb.send = send_done;
	p.user_data = r;
	p.flags = (eager ? UCP_AM_SEND_FLAG_EAGER : 0) | (reply ? UCP_AM_SEND_FLAG_REPLY : 0);
	p.memory_type = UCS_MEMORY_TYPE_HOST;
	size_t count;
	void *buf = set_buffer(&p, iov, iovcnt, &count, 0);
	req_finish(r, U.am_send_nbx((ucp_ep_h)(uintptr_t)ep, id, header, header_len, buf, count, &p));
}

static void recv_done(void *request, ucs_status_t status, size_t length, void *user_data) {
	kvbm_ucx_req_t *r = user_data;
	r->status = status;
	r->length = length;
	r->done = 1;
	U.request_free(request);
}

// recv_param sets p for a receive of host memory that completes into r.
static void recv_param(ucp_request_param_t *p, kvbm_ucx_req_t *r) {
	memset(p, 0, sizeof *p);
	p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE |
	                  UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FIELD_RECV_INFO;
	p->cb.recv_am = recv_done;
	p->user_data = r;
	p->recv_info.length = (size_t *)&r->length; // set when it completes at once
	p->memory_type = UCS_MEMORY_TYPE_HOST;
}

void kvbm_ucx_am_recv(uint64_t worker, uint64_t desc, const kvbm_ucx_iov_t *iov, size_t iovcnt, kvbm_ucx_req_t *r) {
	ucp_request_param_t p;
	recv_param(&p, r);
	size_t count;
	// Received as an iov, even one piece: UCX (1.13's protocols, whatever
	// RNDV_SCHEME says) registers a contiguous receive buffer and sends
	// its rkey to the sender, which then writes it with RDMA (rendezvous
	// put); a buffer that is not contiguous gets the data in messages.
	void *buf = set_buffer(&p, iov, iovcnt, &count, 1);
	req_finish(r, U.am_recv_data_nbx((ucp_worker_h)(uintptr_t)worker, (void *)(uintptr_t)desc, buf, count, &p));
}

void kvbm_ucx_am_drop(uint64_t worker, uint64_t desc) {
	U.am_data_release((ucp_worker_h)(uintptr_t)worker, (void *)(uintptr_t)desc);
}

// The sink's datatype. UCX calls these on the progress thread, inside
// ucp_worker_progress (or ucp_am_recv_data_nbx), as Go closes sinks: so a
// sink Go closed gets no byte more.

static uint64_t sinks_live; // of every transport of the process

uint64_t kvbm_ucx_sinks_live(void) { return __atomic_load_n(&sinks_live, __ATOMIC_RELAXED); }

kvbm_ucx_sink_t *kvbm_ucx_sink_new(uint64_t n) {
	kvbm_ucx_sink_t *s = calloc(1, sizeof *s + n * sizeof s->pieces[0]);
	if (s) {
		s->refs = 1;
		s->open = 1;
		s->n = n;
		__atomic_add_fetch(&sinks_live, 1, __ATOMIC_RELAXED);
	}
	return s;
}

void kvbm_ucx_sink_release(kvbm_ucx_sink_t *s) {
	if (--s->refs == 0) {
		free(s);
		__atomic_sub_fetch(&sinks_live, 1, __ATOMIC_RELAXED);
	}
}

static void *sink_start_unpack(void *context, void *buffer, size_t count) {
	(void)context;
	(void)count;
	kvbm_ucx_sink_t *s = buffer;
	s->refs++;
	return s;
}

static size_t sink_packed_size(void *state) { return ((kvbm_ucx_sink_t *)state)->total; }

static ucs_status_t sink_unpack(void *state, size_t offset, const void *src, size_t length) {
	kvbm_ucx_sink_t *s = state;
	// Never an error: UCX would finish with the sink on it, and perhaps
	// again at the last piece. A piece beyond the message (UCX checks
	// that first) is dropped, and the receive fails in Go on the count.
	if (!s->open || offset > s->total || length > s->total - offset) {
		s->dropped += length;
		return UCS_OK;
	}
	// Fragments mostly come in order: start from the piece the last one
	// ended in, stepping back for one that comes out of order (several
	// lanes, or an exporter's choice: any offset inside the message).
	uint64_t i = s->cursor, at = s->cursor_off;
	while (offset < at && i > 0) {
		i--;
		at -= s->pieces[i].length;
	}
	while (length > 0 && i < s->n) {
		uint64_t len = s->pieces[i].length;
		if (offset >= at + len) {
			at += len;
			i++;
			continue;
		}
		uint64_t skip = offset - at, k = len - skip < length ? len - skip : length;
		memcpy((char *)(uintptr_t)s->pieces[i].buffer + skip, src, k);
		src = (const char *)src + k;
		offset += k;
		length -= k;
		s->landed += k;
	}
	s->cursor = i;
	s->cursor_off = at;
	return UCS_OK;
}

static void sink_finish(void *state) { kvbm_ucx_sink_release(state); }

void kvbm_ucx_sink_unpack(kvbm_ucx_sink_t *s, uint64_t offset, const void *src, uint64_t length) {
	sink_unpack(s, offset, src, length);
}

static void *sink_start_pack(void *context, const void *buffer, size_t count) {
	(void)context;
	(void)buffer;
	(void)count;
	return NULL; // never sent
}

static size_t sink_pack(void *state, size_t offset, void *dest, size_t max_length) {
	(void)state;
	(void)offset;
	(void)dest;
	(void)max_length;
	return 0;
}

static const ucp_generic_dt_ops_t sink_ops = {
	.start_pack = sink_start_pack,
	.start_unpack = sink_start_unpack,
	.packed_size = sink_packed_size,
	.pack = sink_pack,
	.unpack = sink_unpack,
	.finish = sink_finish,
};

static pthread_once_t sink_once = PTHREAD_ONCE_INIT;
static uint64_t sink_dt;
static ucs_status_t sink_dt_status;

// The datatype is made once per process, as the library is loaded once
// (shim.c), and never destroyed.
static void make_sink_dt(void) { sink_dt_status = U.dt_create_generic(&sink_ops, NULL, &sink_dt); }

void kvbm_ucx_am_recv_sink(uint64_t worker, uint64_t desc, kvbm_ucx_sink_t *s, kvbm_ucx_req_t *r) {
	pthread_once(&sink_once, make_sink_dt);
	if (sink_dt_status != UCS_OK) {
		U.am_data_release((ucp_worker_h)(uintptr_t)worker, (void *)(uintptr_t)desc);
		r->status = sink_dt_status;
		r->done = 1;
		return;
	}
	ucp_request_param_t p;
	recv_param(&p, r);
	p.datatype = sink_dt;
	req_finish(r, U.am_recv_data_nbx((ucp_worker_h)(uintptr_t)worker, (void *)(uintptr_t)desc, s, 1, &p));
}
