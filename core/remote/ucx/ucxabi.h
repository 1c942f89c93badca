// The part of UCX's ABI the shim uses, declared here rather than included
// (see shim.h): copied from UCX 1.13.1's public headers (ucp/api/ucp.h,
// ucp/api/ucp_def.h, ucs/type/status.h), the active message parts checked
// against 1.22's. Internal to shim.c and shim_am.c.
#ifndef KVBM_UCX_ABI_H
#define KVBM_UCX_ABI_H

#include <stdint.h>
#include <stdio.h>

#pragma GCC visibility push(hidden)

#define BIT(i) (1ull << (i))

// ucs/type/status.h
enum {
	UCS_OK = 0,
	UCS_INPROGRESS = 1,
	UCS_ERR_NO_MESSAGE = -2,
	UCS_ERR_UNSUPPORTED = -22,
	UCS_ERR_LAST = -100,
};
#define PTR_IS_ERR(p) (((uintptr_t)(p)) >= ((uintptr_t)UCS_ERR_LAST))
#define PTR_IS_PTR(p) (((uintptr_t)(p) - 1) < ((uintptr_t)UCS_ERR_LAST - 1))
#define PTR_STATUS(p) ((int32_t)(intptr_t)(p))

typedef int32_t ucs_status_t;
typedef void *ucs_status_ptr_t;
typedef struct ucp_context *ucp_context_h;
typedef struct ucp_worker *ucp_worker_h;
typedef struct ucp_ep *ucp_ep_h;
typedef struct ucp_rkey *ucp_rkey_h;
typedef struct ucp_mem *ucp_mem_h;
typedef struct ucp_config ucp_config_t;
typedef struct ucp_address ucp_address_t;

// ucp/api/ucp.h: ucp_params_t
enum { UCP_PARAM_FIELD_FEATURES = BIT(0) };
enum { UCP_FEATURE_RMA = BIT(1), UCP_FEATURE_AM = BIT(6) };
typedef struct {
	uint64_t field_mask;
	uint64_t features;
	size_t request_size;
	void (*request_init)(void *);
	void (*request_cleanup)(void *);
	uint64_t tag_sender_mask;
	int mt_workers_shared;
	size_t estimated_num_eps;
	size_t estimated_num_ppn;
	const char *name;
} ucp_params_t;

// ucp_worker_params_t
enum { UCP_WORKER_PARAM_FIELD_THREAD_MODE = BIT(0) };
enum { UCS_THREAD_MODE_SINGLE = 0 };
typedef struct {
	uint64_t field_mask;
	int thread_mode;                 // ucs_thread_mode_t
	unsigned long cpu_mask[1024 / (8 * sizeof(unsigned long))]; // ucs_cpu_set_t
	unsigned events;
	void *user_data;
	int event_fd;
	uint64_t flags;
	const char *name;
	size_t am_alignment;
	uint64_t client_id;
} ucp_worker_params_t;

// ucp/api/ucp_def.h: ucp_ep_params_t
enum {
	UCP_EP_PARAM_FIELD_REMOTE_ADDRESS = BIT(0),
	UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE = BIT(1),
	UCP_EP_PARAM_FIELD_ERR_HANDLER = BIT(2),
};
enum { UCP_ERR_HANDLING_MODE_NONE = 0, UCP_ERR_HANDLING_MODE_PEER = 1 };
typedef void (*ucp_err_handler_cb_t)(void *arg, ucp_ep_h ep, ucs_status_t status);
typedef struct {
	const void *addr;  // const struct sockaddr *
	unsigned addrlen;  // socklen_t
} ucs_sock_addr_t;
typedef struct {
	uint64_t field_mask;
	const ucp_address_t *address;
	int err_mode;      // ucp_err_handling_mode_t
	struct {
		ucp_err_handler_cb_t cb;
		void *arg;
	} err_handler;     // ucp_err_handler_t
	void *user_data;
	unsigned flags;
	ucs_sock_addr_t sockaddr;
	void *conn_request;
	const char *name;
	ucs_sock_addr_t local_sockaddr;
} ucp_ep_params_t;

// ucp_mem_map_params_t
enum {
	UCP_MEM_MAP_PARAM_FIELD_ADDRESS = BIT(0),
	UCP_MEM_MAP_PARAM_FIELD_LENGTH = BIT(1),
	UCP_MEM_MAP_PARAM_FIELD_FLAGS = BIT(2),
	UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE = BIT(4),
};
enum { UCS_MEMORY_TYPE_HOST = 0, UCS_MEMORY_TYPE_CUDA = 1 };
typedef struct {
	uint64_t field_mask;
	void *address;
	size_t length;
	unsigned flags;
	unsigned prot;
	int memory_type;   // ucs_memory_type_t
} ucp_mem_map_params_t;

enum { UCP_MEM_MAP_ALLOCATE = BIT(1) };
enum { UCP_MEM_ATTR_FIELD_ADDRESS = BIT(0), UCP_MEM_ATTR_FIELD_LENGTH = BIT(1) };
typedef struct {
	uint64_t field_mask;
	void *address;
	size_t length;
	int mem_type;      // ucs_memory_type_t
} ucp_mem_attr_t;

// ucp_request_param_t
enum {
	UCP_OP_ATTR_FIELD_CALLBACK = BIT(1),
	UCP_OP_ATTR_FIELD_USER_DATA = BIT(2),
	UCP_OP_ATTR_FIELD_FLAGS = BIT(4),
	UCP_OP_ATTR_FIELD_MEMORY_TYPE = BIT(6),
};
enum { UCP_EP_CLOSE_FLAG_FORCE = BIT(0) };
typedef void (*ucp_send_nbx_callback_t)(void *request, ucs_status_t status, void *user_data);
typedef struct {
	uint32_t op_attr_mask;
	uint32_t flags;
	void *request;
	union {
		ucp_send_nbx_callback_t send;
		void (*recv_am)(void *request, ucs_status_t status, size_t length, void *user_data);
		void *other;
	} cb;
	uint64_t datatype;  // ucp_datatype_t
	void *user_data;
	void *reply_buffer;
	int memory_type;    // ucs_memory_type_t
	union {
		size_t *length;
		void *tag_info;
	} recv_info;
	ucp_mem_h memh;
} ucp_request_param_t;

// Active messages (ucp.h, ucp_def.h; unchanged from 1.13 to 1.22).
enum { UCP_OP_ATTR_FIELD_DATATYPE = BIT(3), UCP_OP_ATTR_FIELD_RECV_INFO = BIT(7) };
enum { UCP_DATATYPE_IOV = 2 };
#define UCP_DT_CONTIG_BYTES ((uint64_t)1 << 3 | 0) // ucp_dt_make_contig(1)
typedef struct {
	void *buffer;
	size_t length;
} ucp_dt_iov_t;
// A datatype of the user's (ucp_dt_create_generic): UCX hands each piece
// of a message it receives to unpack, at its offset in the message.
typedef struct {
	void *(*start_pack)(void *context, const void *buffer, size_t count);
	void *(*start_unpack)(void *context, void *buffer, size_t count);
	size_t (*packed_size)(void *state);
	size_t (*pack)(void *state, size_t offset, void *dest, size_t max_length);
	ucs_status_t (*unpack)(void *state, size_t offset, const void *src, size_t length);
	void (*finish)(void *state);
} ucp_generic_dt_ops_t;
enum { UCP_AM_FLAG_WHOLE_MSG = BIT(0) };
enum { UCP_AM_SEND_FLAG_REPLY = BIT(0), UCP_AM_SEND_FLAG_EAGER = BIT(1) };
enum { UCP_AM_RECV_ATTR_FIELD_REPLY_EP = BIT(0), UCP_AM_RECV_ATTR_FLAG_DATA = BIT(16), UCP_AM_RECV_ATTR_FLAG_RNDV = BIT(17) };
enum {
	UCP_AM_HANDLER_PARAM_FIELD_ID = BIT(0),
	UCP_AM_HANDLER_PARAM_FIELD_FLAGS = BIT(1),
	UCP_AM_HANDLER_PARAM_FIELD_CB = BIT(2),
	UCP_AM_HANDLER_PARAM_FIELD_ARG = BIT(3),
};
typedef struct {
	uint64_t recv_attr;
	ucp_ep_h reply_ep;
} ucp_am_recv_param_t;
typedef ucs_status_t (*ucp_am_recv_callback_t)(void *arg, const void *header, size_t header_length,
                                               void *data, size_t length, const ucp_am_recv_param_t *param);
typedef struct {
	uint64_t field_mask;
	unsigned id;
	uint32_t flags;
	ucp_am_recv_callback_t cb;
	void *arg;
} ucp_am_handler_param_t;

// The function table, resolved by kvbm_ucx_load (shim.c).
typedef struct {
	void (*get_version)(unsigned *, unsigned *, unsigned *);
	const char *(*status_string)(ucs_status_t);
	ucs_status_t (*config_read)(const char *, const char *, ucp_config_t **);
	ucs_status_t (*config_modify)(ucp_config_t *, const char *, const char *);
	void (*config_release)(ucp_config_t *);
	void (*config_print)(const ucp_config_t *, FILE *, const char *, int); // flags: ucs_config_print_flags_t
	ucs_status_t (*init_version)(unsigned, unsigned, const ucp_params_t *, const ucp_config_t *, ucp_context_h *);
	void (*cleanup)(ucp_context_h);
	ucs_status_t (*worker_create)(ucp_context_h, const ucp_worker_params_t *, ucp_worker_h *);
	void (*worker_destroy)(ucp_worker_h);
	ucs_status_t (*worker_get_address)(ucp_worker_h, ucp_address_t **, size_t *);
	void (*worker_release_address)(ucp_worker_h, ucp_address_t *);
	unsigned (*worker_progress)(ucp_worker_h);
	ucs_status_t (*mem_map)(ucp_context_h, const ucp_mem_map_params_t *, ucp_mem_h *);
	ucs_status_t (*mem_unmap)(ucp_context_h, ucp_mem_h);
	ucs_status_t (*mem_query)(const ucp_mem_h, ucp_mem_attr_t *);
	ucs_status_t (*rkey_pack)(ucp_context_h, ucp_mem_h, void **, size_t *);
	void (*rkey_buffer_release)(void *);
	ucs_status_t (*ep_create)(ucp_worker_h, const ucp_ep_params_t *, ucp_ep_h *);
	ucs_status_ptr_t (*ep_close_nbx)(ucp_ep_h, const ucp_request_param_t *);
	ucs_status_ptr_t (*ep_flush_nbx)(ucp_ep_h, const ucp_request_param_t *);
	ucs_status_t (*ep_rkey_unpack)(ucp_ep_h, const void *, ucp_rkey_h *);
	void (*rkey_destroy)(ucp_rkey_h);
	ucs_status_ptr_t (*put_nbx)(ucp_ep_h, const void *, size_t, uint64_t, ucp_rkey_h, const ucp_request_param_t *);
	ucs_status_ptr_t (*get_nbx)(ucp_ep_h, void *, size_t, uint64_t, ucp_rkey_h, const ucp_request_param_t *);
	void (*request_free)(void *);
	void (*ep_print_info)(ucp_ep_h, FILE *);
	void (*context_print_info)(ucp_context_h, FILE *);
	ucs_status_t (*worker_set_am_recv_handler)(ucp_worker_h, const ucp_am_handler_param_t *);
	ucs_status_ptr_t (*am_send_nbx)(ucp_ep_h, unsigned, const void *, size_t, const void *, size_t, const ucp_request_param_t *);
	ucs_status_ptr_t (*am_recv_data_nbx)(ucp_worker_h, void *, void *, size_t, const ucp_request_param_t *);
	void (*am_data_release)(ucp_worker_h, void *);
	ucs_status_t (*dt_create_generic)(const ucp_generic_dt_ops_t *, void *, uint64_t *);
} kvbm_ucx_table_t;
extern kvbm_ucx_table_t kvbm_ucx_U;
#define U kvbm_ucx_U

#pragma GCC visibility pop

#endif
