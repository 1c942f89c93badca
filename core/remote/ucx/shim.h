// The C side of the UCX transport: libucp.so.0 opened with dlopen, the few
// functions it needs resolved with dlsym, and loops that Go calls through
// cgo (posting a batch of RMA operations, progressing the worker) so that
// no per-operation callback crosses into Go.
//
// No UCX header is included: the structures, enumerations and constants
// below are declared here, copied from UCX 1.13.1's public headers
// (ucp/api/ucp.h, ucp/api/ucp_def.h, ucs/type/status.h; Debian's
// libucx-dev 1.13.1). That ABI is stable across 1.x releases: every
// parameter structure starts with a field_mask (op_attr_mask for
// ucp_request_param_t) and the library reads only the fields whose bit is
// set; fields are only ever appended, and the bits and enumeration values
// we use have not changed since UCX 1.10 (when the *_nbx calls appeared).
// A newer libucp (1.14 … 1.19, a CUDA/RDMA build loaded through
// KVBM_UCX_LIB) therefore reads exactly what we write.
//
// Handles cross into Go as uint64_t, so that Go never holds a C pointer as
// unsafe.Pointer. Every function here except kvbm_ucx_load runs on the
// transport's progress thread, the only thread that touches its worker.
#ifndef KVBM_UCX_SHIM_H
#define KVBM_UCX_SHIM_H

#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

// One RMA operation of a batch: posted by kvbm_ucx_post, completed by
// UCX's callback or at once.
typedef struct kvbm_ucx_op {
	uint64_t remote, local, size;
	uint64_t rkey;                 // ucp_rkey_h
	struct kvbm_ucx_batch *batch;
} kvbm_ucx_op_t;

// A batch: the operations of one Read or Write call on one endpoint.
typedef struct kvbm_ucx_batch {
	int64_t outstanding;      // posted and not yet completed
	int64_t done_bytes;       // bytes of completed operations, failed or not
	int32_t status;           // first error (ucs_status_t), 0 if none
	int32_t flush_pending;    // 1 while the endpoint flush of a write is in flight
} kvbm_ucx_batch_t;

// The state of one endpoint that its error handler sets.
typedef struct kvbm_ucx_epstate {
	int32_t failed;   // ucs_status_t of the peer failure, 0 while none
	int32_t closing;  // 1 while a close request is in flight
} kvbm_ucx_epstate_t;

// kvbm_ucx_load opens the library at path and resolves its functions. It
// returns 0, or -1 with the reason in err. Loading happens once per
// process; later calls return the first result.
int kvbm_ucx_load(const char *path, char *err, size_t errlen);
void kvbm_ucx_version(unsigned *major, unsigned *minor, unsigned *release);
const char *kvbm_ucx_status_string(int32_t status);

// Context and worker.
// one_sided: UCP_FEATURE_RMA (reads and writes of registered memory);
// otherwise UCP_FEATURE_AM only (messages, shim_am.c).
int32_t kvbm_ucx_init(const char **names, const char **values, int n, int one_sided, uint64_t *context);
void kvbm_ucx_cleanup(uint64_t context);
int32_t kvbm_ucx_worker_create(uint64_t context, uint64_t *worker);
void kvbm_ucx_worker_destroy(uint64_t worker);
int32_t kvbm_ucx_worker_address(uint64_t worker, void **addr, size_t *len);
void kvbm_ucx_worker_release_address(uint64_t worker, void *addr);
// kvbm_ucx_progress calls ucp_worker_progress up to max times, until it
// reports no progress; it returns the events progressed.
unsigned kvbm_ucx_progress(uint64_t worker, int max);
// kvbm_ucx_precise_naps makes the calling thread's sleeps end on time
// (a timer slack of 1 ns instead of 50 us); kvbm_ucx_nap sleeps usec.
void kvbm_ucx_precise_naps(void);
void kvbm_ucx_nap(unsigned usec);

// Memory registration. cuda: register as CUDA device memory.
int32_t kvbm_ucx_mem_map(uint64_t context, uint64_t addr, uint64_t size, int cuda, uint64_t *memh);
// kvbm_ucx_mem_alloc allocates and maps size bytes (UCP_MEM_MAP_ALLOCATE).
int32_t kvbm_ucx_mem_alloc(uint64_t context, uint64_t size, uint64_t *memh, uint64_t *addr, uint64_t *len);
int32_t kvbm_ucx_mem_unmap(uint64_t context, uint64_t memh);
int32_t kvbm_ucx_rkey_pack(uint64_t context, uint64_t memh, void **buf, size_t *len);
void kvbm_ucx_rkey_buffer_release(void *buf);

// Endpoints. The error handler sets state->failed.
int32_t kvbm_ucx_ep_create(uint64_t worker, const void *addr, kvbm_ucx_epstate_t *state, uint64_t *ep);
// kvbm_ucx_ep_close starts closing ep (force: without waiting for the
// peer); state->closing is 1 until it completes.
void kvbm_ucx_ep_close(uint64_t ep, int force, kvbm_ucx_epstate_t *state);
int32_t kvbm_ucx_rkey_unpack(uint64_t ep, const void *buf, uint64_t *rkey);
void kvbm_ucx_rkey_destroy(uint64_t rkey);

// kvbm_ucx_post posts ops[from, n) as gets (write 0) or puts (write 1)
// until budget bytes are posted (at least one op), or one fails to post
// (recorded in its batch). It returns the index of the first op not
// posted and adds the bytes posted to *posted.
int kvbm_ucx_post(uint64_t ep, int write, kvbm_ucx_op_t *ops, int from, int n, int64_t budget, int64_t *posted);
// kvbm_ucx_flush starts flushing ep for batch b (b->flush_pending).
void kvbm_ucx_flush(uint64_t ep, kvbm_ucx_batch_t *b);
// kvbm_ucx_print_ep writes ucp_ep_print_info's text into buf (at most
// len bytes, NUL-terminated); it returns the length written.
size_t kvbm_ucx_print_ep(uint64_t ep, char *buf, size_t len);
// kvbm_ucx_print_context writes ucp_context_print_info's text into buf, as
// kvbm_ucx_print_ep does.
size_t kvbm_ucx_print_context(uint64_t context, char *buf, size_t len);
// kvbm_ucx_print_config writes the values of UCX's own settings (its
// defaults, its configuration files, the environment) into buf, one
// "UCX_NAME=value" line each, as kvbm_ucx_print_ep does.
size_t kvbm_ucx_print_config(char *buf, size_t len);

// Active messages (shim_am.c): kvbm's own requests and replies, all under
// one AM id, told apart by the header's first byte (am.go).

// A message received: queued by the handler during progress, taken by
// Go after it (kvbm_ucx_am_take) and freed with kvbm_ucx_msg_free.
typedef struct kvbm_ucx_msg {
	struct kvbm_ucx_msg *next;
	uint64_t desc;        // a rendezvous descriptor: kvbm_ucx_am_recv or kvbm_ucx_am_drop it; 0 when data holds the bytes
	uint64_t reply_ep;    // the endpoint to the sender (sent with reply), valid until the next progress; 0 otherwise
	uint64_t length;      // the data's length
	void *data;           // the data, copied (desc == 0)
	uint32_t header_len;
	unsigned char header[]; // header_len bytes
} kvbm_ucx_msg_t;

typedef struct kvbm_ucx_inbox {
	kvbm_ucx_msg_t *head, *tail;
	uint64_t refused; // messages dropped because memory ran out
} kvbm_ucx_inbox_t;

// The state of one send or receive, set by its completion.
typedef struct kvbm_ucx_req {
	int32_t status; // ucs_status_t
	int32_t done;   // 1 once complete
	uint64_t length;
} kvbm_ucx_req_t;

// One piece of a vectored send or receive (ucp_dt_iov_t's layout).
typedef struct kvbm_ucx_iov {
	uint64_t buffer, length;
} kvbm_ucx_iov_t;

// A sink: where the data of one rendezvous message goes. UCX is never
// given the destination's address: it hands each piece it received to
// kvbm (a datatype of kvbm's, shim_am.c), which copies it to the
// destination only while the sink is open. Closing it (the pull ended)
// takes effect at once: the pieces UCX hands in later are counted and
// dropped. Go makes it (refs 1) and releases its reference once the
// receive completed, or frees it once the worker is gone; UCX holds one
// from the receive's start until it finishes with it.
typedef struct kvbm_ucx_sink {
	int32_t refs;
	int32_t open;
	uint64_t total;   // the message's length
	uint64_t landed;  // bytes copied to the destination
	uint64_t dropped; // bytes handed in after the sink closed
	uint64_t cursor, cursor_off; // the piece the last one ended in, and its offset in the message
	uint64_t n;
	kvbm_ucx_iov_t pieces[]; // the destination, n pieces, total bytes
} kvbm_ucx_sink_t;

// kvbm_ucx_sink_new makes an open sink for n pieces (to be filled in);
// NULL when memory ran out.
kvbm_ucx_sink_t *kvbm_ucx_sink_new(uint64_t n);
static inline kvbm_ucx_iov_t *kvbm_ucx_sink_pieces(kvbm_ucx_sink_t *s) { return s->pieces; }
// kvbm_ucx_sink_release drops a reference; the last frees the sink.
void kvbm_ucx_sink_release(kvbm_ucx_sink_t *s);
// kvbm_ucx_sinks_live counts the sinks of the process not freed.
uint64_t kvbm_ucx_sinks_live(void);
// kvbm_ucx_sink_unpack is what UCX calls for each fragment (for tests).
void kvbm_ucx_sink_unpack(kvbm_ucx_sink_t *s, uint64_t offset, const void *src, uint64_t length);
// kvbm_ucx_am_recv_sink receives a rendezvous message's data through s.
void kvbm_ucx_am_recv_sink(uint64_t worker, uint64_t desc, kvbm_ucx_sink_t *s, kvbm_ucx_req_t *r);

int32_t kvbm_ucx_am_listen(uint64_t worker, unsigned id, kvbm_ucx_inbox_t *in);
// kvbm_ucx_am_take returns the messages queued, oldest first (linked by
// next), and empties the inbox.
kvbm_ucx_msg_t *kvbm_ucx_am_take(kvbm_ucx_inbox_t *in);
void kvbm_ucx_msg_free(kvbm_ucx_msg_t *m);
// kvbm_ucx_am_send sends header and the iovcnt pieces of iov (header,
// iov and the pieces' memory stay untouched until r->done). eager: the
// whole message through UCX's eager protocol (requests, small replies);
// reply: the receiver gets an endpoint back to this worker.
void kvbm_ucx_am_send(uint64_t ep, unsigned id, const void *header, size_t header_len,
                      const kvbm_ucx_iov_t *iov, size_t iovcnt, int eager, int reply, kvbm_ucx_req_t *r);
// kvbm_ucx_am_recv receives a rendezvous message's data into the iovcnt
// pieces of iov (which stay until r->done).
void kvbm_ucx_am_recv(uint64_t worker, uint64_t desc, const kvbm_ucx_iov_t *iov, size_t iovcnt, kvbm_ucx_req_t *r);
// kvbm_ucx_am_drop releases a rendezvous message's data unreceived.
void kvbm_ucx_am_drop(uint64_t worker, uint64_t desc);

#pragma GCC visibility pop

#endif
