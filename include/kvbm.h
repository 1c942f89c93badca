/*
 * kvbm.h — the C ABI of libkvbm, a KV-cache block manager for LLM inference
 * engines. Written by hand; this file is the contract.
 *
 * Conventions
 *   - Every function that can fail returns a kvbm_status_t: KVBM_OK (0),
 *     KVBM_IN_PROGRESS (1, not an error) or a negative KVBM_ERR_* code.
 *     kvbm_status_string() names a code; kvbm_last_error() returns the
 *     calling thread's message for the last error it got.
 *   - Handles are opaque and typed. They are entries of a generation-checked
 *     table: a freed, stale, never-issued or wrong-kind handle returns
 *     KVBM_ERR_INVALID_HANDLE and never crashes. Every create has a destroy.
 *   - Outputs are passed by pointer, last. A NULL required pointer, a
 *     required array with a zero or mismatched length, or a config whose
 *     struct_size is too small returns KVBM_ERR_INVALID_ARGUMENT.
 *   - Config structs start with struct_size; initialise them with their
 *     KVBM_..._INIT macro, so that older callers keep working when a later
 *     version appends fields.
 *   - The library never takes ownership of caller memory unless a comment
 *     says so, and never keeps a caller pointer past the call except memory
 *     registered as G1.
 *   - Functions are safe to call from any thread unless the comment says
 *     otherwise. The Go runtime lives in-process: the library must never be
 *     dlclose()d. After fork(), a child gets KVBM_ERR_FAILED_PRECONDITION
 *     from every status-returning call (use the library in the parent, or
 *     exec a fresh process).
 *
 * Environment (defaults only): KVBM_DEVICE=auto|cuda|emulated picks the
 * device backend at first use; KVBM_LOG sets the log level (stderr only);
 * KVBM_TRANSPORT=auto|ucx|tcp|loopback picks how workers of other processes
 * are reached (auto: TCP; ucx: UCX through libucp; loopback: this process
 * only), with KVBM_TCP_ADVERTISE (the interface a worker listens on
 * from its first metadata export, and the host peers dial; default
 * 127.0.0.1: peers on other hosts need it set) and KVBM_TCP_LISTEN (an
 * explicit listen address, host:port, listened on from create) for TCP. Between processes of one host, TCP
 * goes over a Unix socket and peers map each other's host layouts (shared
 * memory) and device memory (CUDA IPC; on the real driver only with
 * KVBM_CUDA_IPC=1); KVBM_SAME_HOST=0 turns that off. KVBM_AUTH_KEY (or
 * KVBM_AUTH_KEY_FILE) is a deployment key: where set, a TCP connection
 * proves it with the metadata's key, both sides must have the same, and a
 * bad setting fails kvbm_worker_create.
 */
#ifndef KVBM_H
#define KVBM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- version */

#define KVBM_VERSION_MAJOR 0
#define KVBM_VERSION_MINOR 1
#define KVBM_VERSION_PATCH 0
/* KVBM_VERSION_CODE(0, 1, 0) == 100. */
#define KVBM_VERSION_CODE(major, minor, patch) ((major) * 10000 + (minor) * 100 + (patch))
/* Bumped whenever a declaration in this file changes incompatibly. */
#define KVBM_ABI_VERSION 1

/* The library's version as KVBM_VERSION_CODE(major, minor, patch). Compare
 * with the header's to detect a mismatched library. Never fails; usable
 * after fork(). */
uint32_t kvbm_version(void);

/* The library's KVBM_ABI_VERSION. Never fails; usable after fork(). */
uint32_t kvbm_abi_version(void);

/* ----------------------------------------------------------------- status */

typedef int32_t kvbm_status_t;

enum {
    KVBM_OK = 0,
    /* Not an error: the operation has not completed yet (notification poll,
     * event query). */
    KVBM_IN_PROGRESS = 1,
    KVBM_ERR_INVALID_ARGUMENT = -1,  /* NULL pointer, bad length, bad value */
    KVBM_ERR_INVALID_HANDLE = -2,    /* freed, stale, never issued or wrong kind */
    KVBM_ERR_NOT_FOUND = -3,         /* no such layout, tier, object or remote */
    KVBM_ERR_ALREADY_EXISTS = -4,    /* a tier or handle set twice */
    KVBM_ERR_FAILED_PRECONDITION = -5, /* wrong state (e.g. used after fork()) */
    KVBM_ERR_OUT_OF_RANGE = -6,      /* an index beyond its bound */
    KVBM_ERR_BUFFER_TOO_SMALL = -7,  /* the size needed is written to an out param */
    KVBM_ERR_IO = -8,                /* file system or disk */
    KVBM_ERR_CUDA = -9,              /* the device driver failed */
    KVBM_ERR_TIMEOUT = -10,          /* a wait ended first; the work goes on */
    KVBM_ERR_CANCELED = -11,         /* the worker was destroyed */
    KVBM_ERR_UNSUPPORTED = -12,      /* no such path between tiers or backend */
    KVBM_ERR_DATA_CORRUPTION = -13,  /* a checksum or format check failed */
    KVBM_ERR_INTERNAL = -14,         /* a bug; the message says where */
    /* A transfer's deadline (kvbm_transfer_options_t.deadline_ms) passed
     * and stopped it; unlike KVBM_ERR_TIMEOUT, the work is over. */
    KVBM_ERR_DEADLINE_EXCEEDED = -15
};

/* A static, never-NULL name for a status ("KVBM_ERR_INVALID_HANDLE"); an
 * unknown value gives "KVBM_ERR_UNKNOWN". Never fails; any thread. */
const char *kvbm_status_string(kvbm_status_t status);

/* The message of the last error returned to the calling thread ("" if none).
 * The string belongs to the library and stays valid until the thread's next
 * kvbm_* call; copy it to keep it. Each thread has its own. Never fails. */
const char *kvbm_last_error(void);

/* ---------------------------------------------------------------- handles */

typedef struct kvbm_worker_s *kvbm_worker_t;
typedef struct kvbm_coordinated_s *kvbm_coordinated_t;
typedef struct kvbm_notification_s *kvbm_notification_t;
typedef struct kvbm_handoff_s *kvbm_handoff_t;
/* Streams and events are the device driver's own handles: a CUstream /
 * CUevent under the real driver (cast an engine's cudaEvent_t, e.g.
 * torch.cuda.Event().cuda_event, to kvbm_event_t), or handles made by
 * kvbm_stream_create / kvbm_event_create, which work under every backend
 * and are the only ones under the emulated device. The driver validates
 * them: an unknown one returns KVBM_ERR_CUDA. A NULL stream in options means
 * the library's own streams. */
typedef struct kvbm_stream_s *kvbm_stream_t;
typedef struct kvbm_event_s *kvbm_event_t;

/* Number of live handles of every kind (workers, coordinated workers,
 * notifications, handoff coordinators), for leak checks: it is 0 once
 * everything created has been destroyed.
 * Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (count NULL),
 * KVBM_ERR_FAILED_PRECONDITION (after fork()). */
kvbm_status_t kvbm_handle_count(size_t *count);

/* ------------------------------------------------------------------- info */

typedef struct kvbm_info {
    size_t struct_size;
    uint32_t version;         /* as kvbm_version() */
    uint32_t abi_version;     /* as kvbm_abi_version() */
    char device_backend[16];  /* "emulated" or "cuda", NUL-terminated */
    int32_t device_count;     /* devices the backend sees */
    char transport[16];       /* the network transport new workers get:
                                 "ucx", "tcp" or "loopback" (KVBM_TRANSPORT);
                                 filled when struct_size covers it */
} kvbm_info_t;
#define KVBM_INFO_INIT {sizeof(kvbm_info_t), 0, 0, {0}, 0, {0}}

/* Fills *info; opens the device backend (KVBM_DEVICE) if not yet open.
 * info is the caller's. Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (NULL or
 * struct_size too small), KVBM_ERR_UNSUPPORTED or KVBM_ERR_CUDA (the chosen
 * backend cannot open), KVBM_ERR_FAILED_PRECONDITION (after fork()). */
kvbm_status_t kvbm_info(kvbm_info_t *info);

/* ----------------------------------------------------- streams and events */

/* Creates a non-blocking stream on a device of the active backend and
 * writes it to *stream. The caller releases it with kvbm_stream_destroy.
 * Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (stream NULL), KVBM_ERR_CUDA,
 * KVBM_ERR_FAILED_PRECONDITION (after fork()). */
kvbm_status_t kvbm_stream_create(int32_t device, kvbm_stream_t *stream);
/* Releases a stream from kvbm_stream_create; queued work still runs.
 * Returns KVBM_OK, KVBM_ERR_CUDA (unknown stream),
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_stream_destroy(kvbm_stream_t stream);
/* Blocks until the work queued on stream is done. Returns KVBM_OK,
 * KVBM_ERR_CUDA (unknown stream, or the queued work failed),
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_stream_synchronize(kvbm_stream_t stream);
/* Makes work queued on stream after this call wait for event's capture.
 * Returns KVBM_OK, KVBM_ERR_CUDA, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_stream_wait_event(kvbm_stream_t stream, kvbm_event_t event);

/* Creates an event (timing disabled) on a device and writes it to *event;
 * the caller releases it with kvbm_event_destroy. Returns KVBM_OK,
 * KVBM_ERR_INVALID_ARGUMENT (event NULL), KVBM_ERR_CUDA,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_event_create(int32_t device, kvbm_event_t *event);
/* Releases an event. Returns KVBM_OK, KVBM_ERR_CUDA (unknown event),
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_event_destroy(kvbm_event_t event);
/* Captures the work queued on stream so far (stream NULL: the legacy
 * default stream of the calling thread's current CUDA context, device 0's
 * when it has none). Returns KVBM_OK, KVBM_ERR_CUDA,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_event_record(kvbm_event_t event, kvbm_stream_t stream);
/* KVBM_OK when the captured work is done (or the event was never
 * recorded), KVBM_IN_PROGRESS while it is pending, KVBM_ERR_CUDA when it
 * failed or the event is unknown, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_event_query(kvbm_event_t event);
/* Blocks until the captured work is done. Returns KVBM_OK, KVBM_ERR_CUDA,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_event_synchronize(kvbm_event_t event);

/* ----------------------------------------------------------------- layout */

/* The tiers a block lives in. Every int32_t tier argument takes exactly
 * these values; any other, 4 included, returns KVBM_ERR_INVALID_ARGUMENT.
 * G4, object storage, has no blocks of its own: it is reached through the
 * kvbm_worker_object_* calls and kvbm_worker_onboard/offload_objects. */
typedef enum kvbm_tier {
    KVBM_TIER_G1 = 1, /* the engine's KV cache in device memory */
    KVBM_TIER_G2 = 2, /* pinned host memory, allocated by kvbm */
    KVBM_TIER_G3 = 3  /* local disk, allocated by kvbm */
} kvbm_tier_t;

typedef enum kvbm_layout_kind {
    /* One region [block][layer][outer][page][inner]. */
    KVBM_LAYOUT_FULLY_CONTIGUOUS = 1,
    /* One region per layer, arranged by block_dim. */
    KVBM_LAYOUT_LAYER_SEPARATE = 2
} kvbm_layout_kind_t;

typedef enum kvbm_block_dim {
    /* [block][outer][page][inner] per layer. */
    KVBM_BLOCK_DIM_FIRST = 0,
    /* [outer][block][page][inner] per layer (vLLM FlashAttention). */
    KVBM_BLOCK_DIM_SECOND = 1
} kvbm_block_dim_t;

/* The shape of one tier's KV cache. A block is
 * num_layers * outer_dim * page_size * inner_dim * dtype_width bytes. */
typedef struct kvbm_layout_config {
    size_t struct_size;
    uint32_t num_blocks;
    uint32_t num_layers;
    uint32_t outer_dim;   /* 2: separate K and V; 1: MLA */
    uint32_t page_size;   /* tokens per block, a power of two */
    uint32_t inner_dim;   /* heads * head size */
    uint32_t dtype_width; /* bytes per element: 1, 2, 4 or 8 */
    int32_t layout_kind;  /* kvbm_layout_kind_t */
    int32_t block_dim;    /* kvbm_block_dim_t, read for LAYER_SEPARATE only:
                             FULLY_CONTIGUOUS ignores it */
} kvbm_layout_config_t;
#define KVBM_LAYOUT_CONFIG_INIT {sizeof(kvbm_layout_config_t), 0, 0, 0, 0, 0, 0, 0, 0}

/* A registered layout, valid across instances: the owning worker's id and
 * the layout's id within it. */
typedef struct kvbm_layout_handle {
    uint64_t worker;
    uint64_t layout; /* fits in 16 bits */
} kvbm_layout_handle_t;

/* ----------------------------------------------------------------- worker */

typedef struct kvbm_worker_config {
    size_t struct_size;
    int32_t device_id;      /* device ordinal of the active backend, 0 to
                               kvbm_info_t.device_count - 1 */
    int32_t rank;           /* rank under its leader; prefixes object keys */
    uint64_t worker_id;     /* unique in the process and across instances */
    const char *disk_dir;   /* directory for G3 files; NULL or "": no G3.
                             * It must exist, be owned by this process's
                             * user and be writable by no group or other
                             * user (see kvbm_worker_allocate_g3) */
    const char *object_dir; /* G4 object store location; NULL or "": none.
                             * "/path" or "file:///path": a filesystem store,
                             * private to this user (see kvbm_worker_create);
                             * "s3://bucket/prefix[?endpoint=URL&region=R]":
                             * an S3 store (see kvbm_worker_create) */
    uint32_t remote_deadline_ms; /* bound on each operation on a peer's
                                  * memory: a dead, frozen or unreachable
                                  * peer fails the transfer's blocks within
                                  * it; 0: 30000. Read when struct_size
                                  * covers it. */
    const char *advertise_host; /* the host the TCP transport listens on (from
                                 * the first export) and peers dial, e.g. the
                                 * address a P/D role is given; NULL or "":
                                 * KVBM_TCP_ADVERTISE, else 127.0.0.1.
                                 * KVBM_TCP_LISTEN overrides where it
                                 * listens. Read when struct_size covers it. */
    const char *g3_persist_id; /* NULL or "": G3's file has no name and goes
                                * with the process. Set: G3 is persistent
                                * (a warm restart): its file is disk_dir's
                                * kvbm-g3.blocks, kept after the process
                                * ends (SIGKILL included), with a journal
                                * of which key each block holds; a later
                                * worker with the same id and G3 layout
                                * finds those keys again once each block
                                * is read back and matches the checksums
                                * recorded when it was written (in the
                                * background after kvbm_worker_cache_enable;
                                * STORED events say when). The id says what
                                * the keys are (model, layout, dtype,
                                * rank): another id finds nothing, and
                                * the directory holds one id's G3 at a
                                * time. One process per disk_dir: a second
                                * one's kvbm_worker_allocate_g3 fails
                                * (KVBM_ERR_IO). Read when struct_size
                                * covers it. */
} kvbm_worker_config_t;
#define KVBM_WORKER_CONFIG_INIT {sizeof(kvbm_worker_config_t), 0, 0, 0, NULL, NULL, 0, NULL, NULL}

/* Creates a worker with its own transfer manager on the active device
 * backend, joins it to the process-wide in-process transport so that
 * other workers of this process can import its metadata, and serves its
 * layouts to other processes on the network transport KVBM_TRANSPORT
 * selects (TCP: a port on KVBM_TCP_ADVERTISE, 127.0.0.1 by default,
 * listened on from the first kvbm_worker_export_metadata, or from create
 * at KVBM_TCP_LISTEN; a worker that never exports listens on nothing; its
 * exported metadata carries the address peers dial: a peer may read and
 * write the worker's registered memory, nothing else). The strings are
 * copied. The caller destroys the worker with kvbm_worker_destroy.
 * Thread safety: a worker may be used from many threads at once.
 * Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (NULL, struct_size, a
 * device_id the backend does not have: the message names it and the
 * number of devices), KVBM_ERR_ALREADY_EXISTS (worker_id already used in
 * this process),
 * KVBM_ERR_IO (object_dir cannot be created; an S3 server refuses the
 * credentials, lacks the bucket or does not answer), KVBM_ERR_TIMEOUT (an
 * S3 server silent for 30 s), KVBM_ERR_UNSUPPORTED /
 * KVBM_ERR_CUDA (backend), KVBM_ERR_FAILED_PRECONDITION (after fork();
 * also: a filesystem object_dir, or its rank directory, that is not owned
 * by this process's effective user or that its group or other users can
 * write, the message naming its path, mode and owner: chmod 700 it, chown
 * it, or name another).
 *
 * object_dir: a directory (created if missing) or file:///path names a
 * filesystem store holding objects "{dir}/{rank}/{hex key}". The
 * directories kvbm makes there are 0700 and the objects 0600, whatever the
 * umask; an existing directory is never chmod'ed, and one others may read
 * (0755) is used with a warning logged, since they can list the objects'
 * names (prefix hashes). s3://bucket/prefix an S3 store holding objects
 * "prefix/{rank}/{hex key}" in bucket, which must exist (it is never
 * created); put the deployment and model in prefix. The endpoint and region
 * come from the location's query (endpoint=http://host:port, region=…),
 * else from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL and AWS_REGION or
 * AWS_DEFAULT_REGION (default: AWS's endpoint, us-east-1). Credentials come
 * only from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN,
 * never from the location, and are never logged; without them this returns
 * KVBM_ERR_INVALID_ARGUMENT, as for a malformed location (the message names
 * it). The AWS_* variables are read here, from the environment as it was
 * when this library was loaded: later setenv() calls are not seen. The
 * server, the credentials and the bucket are checked here. Afterwards each
 * object block has a 30 s deadline, retries with backoff included, and
 * fails on its own: KVBM_ERR_NOT_FOUND, KVBM_ERR_DATA_CORRUPTION (checks
 * failed, or another key's object), KVBM_ERR_IO (server error or refusal),
 * KVBM_ERR_TIMEOUT; a restarted server is used again without re-creating
 * the worker. */
kvbm_status_t kvbm_worker_create(const kvbm_worker_config_t *config, kvbm_worker_t *worker);

/* Waits for transfers in flight — its own, and other workers' transfers
 * on layouts they imported from it — releases G2 and G3 and every other
 * resource, and invalidates the handle. Later transfers of other workers on
 * its layouts fail with KVBM_ERR_CANCELED. Notifications of the worker stay
 * valid handles (free them as usual). Registered G1 memory stays the
 * caller's: it may be freed once this returns. Returns KVBM_OK, KVBM_ERR_INVALID_HANDLE (also on double free),
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_destroy(kvbm_worker_t worker);

/* Registers the engine's KV cache as G1: ptrs are device pointers, one per
 * layer for KVBM_LAYOUT_LAYER_SEPARATE (num_ptrs == num_layers), one for
 * KVBM_LAYOUT_FULLY_CONTIGUOUS. Under the emulated device, host memory
 * (e.g. from aligned_alloc) registered here becomes emulated device memory:
 * this is how C tests and engines without a GPU provide G1, reading and
 * writing it directly once transfers into it completed.
 * Ownership: the memory stays the caller's and must outlive the worker;
 * config and ptrs are read during the call only. handle may be NULL.
 * Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (NULL, counts, config),
 * KVBM_ERR_ALREADY_EXISTS (G1 already registered), KVBM_ERR_CUDA,
 * KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_register_g1(kvbm_worker_t worker, const kvbm_layout_config_t *config,
                                      const uint64_t *ptrs, size_t num_ptrs,
                                      kvbm_layout_handle_t *handle);

/* As kvbm_worker_register_g1, with host memory: G1 for engines whose
 * working KV tier is host memory (SGLang's HiCache host pool), under either
 * device backend. The library pins it (cuMemHostRegister), or uses it as
 * it is when CUDA has it pinned already (cudaHostRegister by its owner,
 * left pinned at destroy). Layer-wise onboard needs device G1; plain
 * transfers and the prefix cache work. Returns as
 * kvbm_worker_register_g1. */
kvbm_status_t kvbm_worker_register_g1_host(kvbm_worker_t worker, const kvbm_layout_config_t *config,
                                           const uint64_t *ptrs, size_t num_ptrs,
                                           kvbm_layout_handle_t *handle);

/* Takes G1 away while the worker lives, before its memory goes to another
 * use (vLLM's sleep mode and weight updates lend the KV cache's memory):
 * from the call on, every transfer on G1 (the worker's own, the prefix
 * cache's, and a peer's read or write through any metadata exported before,
 * whole-worker or block-scoped) fails at once with
 * KVBM_ERR_FAILED_PRECONDITION and a message that says G1 was unregistered
 * by its owner and why (reason: a NUL-terminated string read during the
 * call, its first 512 bytes kept; NULL: none given). The call returns once
 * the transfers that were in flight on G1 have finished (completed or
 * failed; a peer's request under way ends within the worker's remote
 * deadline) and the network transport's registrations of the memory are
 * undone (UCX: the peers' keys then reach nothing on RDMA; its intra-node
 * transports may not revoke them): after it returns, the library touches
 * none of that memory. Register G1 again (kvbm_worker_register_g1 or
 * _host, with the config it had) when the memory is back: it gets a new
 * layout handle, so metadata exported before names nothing; export
 * metadata anew for peers. Returns KVBM_OK, KVBM_ERR_NOT_FOUND (G1 is not
 * registered), KVBM_ERR_INVALID_HANDLE, KVBM_ERR_CUDA or KVBM_ERR_IO (the
 * driver's or UCX's registration of the memory not undone: G1 is
 * unregistered all the same and can be registered again). */
kvbm_status_t kvbm_worker_unregister_g1(kvbm_worker_t worker, const char *reason);

/* Registers host memory the caller owns as G2 — an engine's host KV pool
 * (SGLang's HiCache host pool, say) — so that transfers read and write it
 * in place: ptrs are host pointers, one per layer for
 * KVBM_LAYOUT_LAYER_SEPARATE, one for KVBM_LAYOUT_FULLY_CONTIGUOUS. The
 * library pins the memory with the driver (cuMemHostRegister) and unpins it
 * at kvbm_worker_destroy; memory its owner pinned already with CUDA is used
 * as it is (and left pinned).
 * Ownership: the memory stays the caller's and must outlive the worker;
 * config and ptrs are read during the call only. handle may be NULL.
 * Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (NULL, counts, config),
 * KVBM_ERR_ALREADY_EXISTS (G2 already registered or allocated),
 * KVBM_ERR_CUDA, KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_register_g2(kvbm_worker_t worker, const kvbm_layout_config_t *config,
                                      const uint64_t *ptrs, size_t num_ptrs,
                                      kvbm_layout_handle_t *handle);

/* Allocates G2 (pinned host memory, owned by the worker). handle may be
 * NULL. A size the host or this process's memory cgroup cannot hold (less a
 * margin) is refused before a page is touched: KVBM_ERR_CUDA (out of
 * memory), the message naming the bytes requested and available. Returns
 * KVBM_OK, KVBM_ERR_INVALID_ARGUMENT, KVBM_ERR_ALREADY_EXISTS,
 * KVBM_ERR_CUDA (allocation), KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_allocate_g2(kvbm_worker_t worker, const kvbm_layout_config_t *config,
                                      kvbm_layout_handle_t *handle);

/* Allocates G3 (one file in the worker's disk_dir, owned by the worker; the
 * file has no name, O_TMPFILE or unlinked as it is opened, so its space
 * goes back when the worker is destroyed or the process dies, SIGKILL
 * included). The file is 0600, whatever the umask. handle may be NULL.
 * Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (also: no
 * disk_dir), KVBM_ERR_ALREADY_EXISTS, KVBM_ERR_IO (also: larger than the
 * filesystem's free space, the message naming the bytes requested and
 * free; disk_dir missing), KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION (after fork(); also: a disk_dir not owned
 * by this process's effective user or that its group or other users can
 * write, the message naming its path, mode and owner: chmod 700 it, chown
 * it, or name another; nothing is created in it). */
kvbm_status_t kvbm_worker_allocate_g3(kvbm_worker_t worker, const kvbm_layout_config_t *config,
                                      kvbm_layout_handle_t *handle);

/* Options of one transfer. */
typedef struct kvbm_transfer_options {
    size_t struct_size;
    /* Half-open layer range [layer_start, layer_end); both 0: all layers. */
    uint32_t layer_start;
    uint32_t layer_end;
    /* Stream the device copies are enqueued on (single-hop device copies
     * only); NULL: the library's own streams. */
    kvbm_stream_t stream;
    /* Event the copy waits for before it reads (the engine's compute
     * event: "offload after this event"); NULL: none. */
    kvbm_event_t precondition;
    /* Bound on the transfer's operations on a peer's memory as a whole, in
     * ms; 0: none beyond the worker's remote_deadline_ms per operation.
     * When it passes, those not complete stop and their blocks fail with
     * KVBM_ERR_DEADLINE_EXCEEDED (otherwise as kvbm_notification_cancel,
     * whose blocks fail with KVBM_ERR_CANCELED); the peer stays
     * connected. Read when struct_size covers it. */
    uint32_t deadline_ms;
    /* A slice of KV heads, for tensor-parallel sizes that differ: with
     * head_count > 0, heads [src_head_first, src_head_first + head_count)
     * of every source fragment fill heads [dst_head_first, dst_head_first
     * + head_count) of the destination's, every token; the destination's
     * other heads are not written. A fragment (page_size tokens of one
     * layer and outer index) holds src_heads (dst_heads) heads, in
     * src_head_order (dst_head_order): a kvbm_head_order_t. The layouts
     * must agree in layers, outer_dim, page_size and the bytes of one head
     * (a fragment's bytes / (page_size * heads)); memory tiers and peers'
     * memory only (KVBM_ERR_UNSUPPORTED with a disk: its checksum covers
     * the whole block). head_count 0: whole fragments. Read when
     * struct_size covers all seven fields. */
    uint32_t head_count;
    uint32_t src_heads;
    uint32_t src_head_first;
    uint32_t src_head_order;
    uint32_t dst_heads;
    uint32_t dst_head_first;
    uint32_t dst_head_order;
} kvbm_transfer_options_t;
#define KVBM_TRANSFER_OPTIONS_INIT {sizeof(kvbm_transfer_options_t), 0, 0, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0}

/* How a fragment orders its page's tokens and KV heads. */
typedef enum kvbm_head_order {
    KVBM_HEADS_OUTER = 1,  /* [head][token][bytes]: vLLM's HND */
    KVBM_TOKENS_OUTER = 2  /* [token][head][bytes]: vLLM's NHD */
} kvbm_head_order_t;

/* Copies blocks src_ids of tier src into blocks dst_ids of tier dst (both
 * arrays num_blocks long). The request is validated before any byte moves;
 * on success *notification tracks completion and the caller frees it with
 * kvbm_notification_free. options may be NULL (defaults). Arrays are read
 * during the call only.
 * Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (NULL, num_blocks 0, a tier
 * that is not a kvbm_tier_t, destination ids repeated, or — when src and
 * dst are one layout — a block that is both a source and a destination),
 * KVBM_ERR_OUT_OF_RANGE (a block id or the layer range beyond the layout),
 * KVBM_ERR_NOT_FOUND (tier not registered), KVBM_ERR_UNSUPPORTED (no path
 * between the tiers), KVBM_ERR_CUDA, KVBM_ERR_CANCELED (worker closing),
 * KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_transfer(kvbm_worker_t worker, int32_t src, const uint32_t *src_ids,
                                   int32_t dst, const uint32_t *dst_ids, size_t num_blocks,
                                   const kvbm_transfer_options_t *options,
                                   kvbm_notification_t *notification);

/* Layer-wise onboard G2 -> G1: copies one layer at a time on one stream and
 * records events[L] right after layer L's copies, so the engine can make
 * its compute stream wait on layer L's event before attention of layer L.
 * num_events must equal the number of layers. The events stay the
 * caller's (recorded, never destroyed). stream NULL: one of the library's.
 * Returns as kvbm_worker_transfer. */
kvbm_status_t kvbm_worker_onboard_layerwise(kvbm_worker_t worker, const uint32_t *src_ids,
                                            const uint32_t *dst_ids, size_t num_blocks,
                                            const kvbm_event_t *events, size_t num_events,
                                            kvbm_stream_t stream,
                                            kvbm_notification_t *notification);

/* Writes the worker's layout metadata (every registered tier) into buf.
 * *size is set to the bytes needed in every case where the worker could
 * encode it; if capacity is smaller, nothing is written and
 * KVBM_ERR_BUFFER_TOO_SMALL is returned (call again with *size bytes).
 * buf may be NULL when capacity is 0.
 * Returns KVBM_OK, KVBM_ERR_BUFFER_TOO_SMALL, KVBM_ERR_INVALID_ARGUMENT
 * (size NULL, buf NULL with capacity > 0), KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_export_metadata(kvbm_worker_t worker, uint8_t *buf, size_t capacity,
                                          size_t *size);

/* Flags of kvbm_worker_export_metadata_scoped. */
#define KVBM_EXPORT_READ_ONLY 1u /* the metadata reads the layouts, never writes them */

/* kvbm_worker_export_metadata with a scope. Exported metadata is a
 * capability, a secret to pass only to the peers meant to hold it: it
 * carries a key drawn by this worker, which every connection proves.
 * kvbm_worker_export_metadata's lets its holder read and write the
 * worker's registered layouts; with KVBM_EXPORT_READ_ONLY in flags, its
 * holder may read them (a decode pulling from a prefill) and its writes
 * are refused (KVBM_ERR_UNSUPPORTED at the writer). Other flag bits must
 * be 0. Returns as kvbm_worker_export_metadata, and
 * KVBM_ERR_INVALID_ARGUMENT (unknown flags), KVBM_ERR_UNSUPPORTED (read
 * only on a transport that cannot scope: UCX). */
kvbm_status_t kvbm_worker_export_metadata_scoped(kvbm_worker_t worker, uint32_t flags, uint8_t *buf,
                                                 size_t capacity, size_t *size);

/* What kvbm_worker_export_metadata_blocks covers: block block_ids[i] of
 * tier tiers[i], for i < num_blocks (both arrays read during the call
 * only), until expires_ms ms after the call (0: no end). Initialise with
 * KVBM_BLOCK_SCOPE_INIT. */
typedef struct kvbm_block_scope {
    size_t struct_size;
    const int32_t *tiers;      /* KVBM_TIER_G1, _G2 or _G3 of each block */
    const uint32_t *block_ids; /* the blocks, in any order, repeats allowed */
    size_t num_blocks;
    uint32_t expires_ms;
} kvbm_block_scope_t;
#define KVBM_BLOCK_SCOPE_INIT {sizeof(kvbm_block_scope_t), NULL, NULL, 0, 0}

/* kvbm_worker_export_metadata scoped to some blocks, read only: the
 * metadata describes the scope's tiers only, and the worker's server
 * refuses its holder any other block, any write, and any request once the
 * scope expired or its blocks were revoked (kvbm_worker_revoke_blocks;
 * KVBM_ERR_UNSUPPORTED at the reader). A prefill hands a decode the
 * metadata of one request's blocks, not of every request's KV. The worker
 * keeps nothing per export (a revocation epoch per block). Within one process (workers
 * reached directly) the scope is not enforced. A block's bytes may be
 * asked in any piece: a request that touches one byte of a block outside
 * the scope is refused whole. Returns as kvbm_worker_export_metadata, and
 * KVBM_ERR_INVALID_ARGUMENT (scope NULL, struct_size, NULL arrays,
 * num_blocks 0, a tier not G1, G2 or G3, blocks that form more ranges
 * than a hello carries: about 4000), KVBM_ERR_OUT_OF_RANGE (a block id
 * beyond its layout), KVBM_ERR_NOT_FOUND (a tier not registered),
 * KVBM_ERR_UNSUPPORTED (a transport that cannot scope: UCX). */
kvbm_status_t kvbm_worker_export_metadata_blocks(kvbm_worker_t worker,
                                                 const kvbm_block_scope_t *scope, uint8_t *buf,
                                                 size_t capacity, size_t *size);

/* Revokes the block-scoped metadata (kvbm_worker_export_metadata_blocks)
 * made before this call that covers any of the blocks named (tiers,
 * block_ids and num_blocks as in kvbm_block_scope_t; expires_ms is not
 * read): the worker's server refuses its holders those blocks from now on
 * (KVBM_ERR_UNSUPPORTED at the reader, "revoked"), and the call returns
 * once no request such metadata allowed is still reading them. Call it
 * before the blocks go to their next owner (a P/D prefill: when a
 * request's blocks are released, its lease ends, or it is aborted);
 * metadata exported afterwards for the same blocks reads them. Metadata
 * of the whole worker (kvbm_worker_export_metadata, _scoped) is not
 * revoked. Costs a few atomic loads per request served. Everything is
 * checked before anything is revoked. Returns KVBM_OK (also on a
 * transport that cannot scope: nothing to revoke), KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_INVALID_ARGUMENT (blocks NULL, struct_size, NULL arrays,
 * num_blocks 0, a tier not G1, G2 or G3), KVBM_ERR_OUT_OF_RANGE (a block
 * id beyond its layout), KVBM_ERR_NOT_FOUND (a tier not registered). */
kvbm_status_t kvbm_worker_revoke_blocks(kvbm_worker_t worker, const kvbm_block_scope_t *blocks);

/* Imports another worker's metadata so its layouts can be transfer
 * sources and destinations. A worker of this process is reached directly
 * (once it is destroyed, transfers on its layouts fail with
 * KVBM_ERR_CANCELED); a worker of another process, on this host or
 * another, over the network transport both have (KVBM_TRANSPORT): the call
 * connects to it, within the worker's remote deadline. Every later
 * operation on its memory has that deadline too: a peer that died, froze
 * or cannot be reached fails the transfer's blocks with KVBM_ERR_IO (the
 * message says which: closed, reset, silent past the deadline; never
 * KVBM_ERR_TIMEOUT, which a wait returns for a transfer still pending),
 * never reports them done, and
 * fails later transfers at once; importing its metadata again reconnects.
 * Peers reach host (G2) and device (G1) layouts; a disk (G3) layout is
 * staged in G2 first. Importing a worker's metadata again replaces the
 * earlier import. Returns KVBM_OK,
 * KVBM_ERR_INVALID_ARGUMENT (NULL, len 0, own metadata, an endpoint that
 * does not parse), KVBM_ERR_DATA_CORRUPTION (bytes fail decoding, or were
 * written by a kvbm with another metadata version: the message names both),
 * KVBM_ERR_NOT_FOUND (the exporting worker is gone, or the peer now runs
 * another worker), KVBM_ERR_UNSUPPORTED (no transport in common: the
 * message lists both sides'), KVBM_ERR_IO (the peer cannot be reached or
 * did not answer within the deadline),
 * KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_import_metadata(kvbm_worker_t worker, const uint8_t *metadata, size_t len);

/* Writes the id of the worker that exported metadata (bytes from
 * kvbm_worker_export_metadata, len bytes long) to *worker_id, so that a
 * caller can tell whose metadata it holds without parsing it. The bytes are
 * checked as import checks them (format, version, checksum) and read during
 * the call only; no worker is needed. Any thread.
 * Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (metadata or worker_id NULL,
 * len 0, or bytes that are not well-formed metadata; the message says why),
 * KVBM_ERR_FAILED_PRECONDITION (after fork()). */
kvbm_status_t kvbm_metadata_worker_id(const uint8_t *metadata, size_t len, uint64_t *worker_id);

/* As import, and remembers the remote's layouts under instance, for
 * kvbm_worker_transfer_from_instance. Returns as import. */
kvbm_status_t kvbm_worker_connect_remote(kvbm_worker_t worker, uint64_t instance,
                                         const uint8_t *metadata, size_t len);

/* Forgets a connected instance: its layouts are no longer imported and the
 * connection to its worker closes (unless another connected instance uses
 * the same worker); transfers in flight on it fail. For a peer that left,
 * so that connections do not pile up in a long-running instance. Returns
 * KVBM_OK, KVBM_ERR_NOT_FOUND (instance not connected),
 * KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_disconnect_remote(kvbm_worker_t worker, uint64_t instance);

/* Pulls blocks of a connected instance's tier src into local tier dst.
 * Returns as kvbm_worker_transfer, and KVBM_ERR_NOT_FOUND when instance
 * was not connected or has no such tier. */
kvbm_status_t kvbm_worker_transfer_from_instance(kvbm_worker_t worker, uint64_t instance,
                                                 int32_t src, const uint32_t *src_ids,
                                                 int32_t dst, const uint32_t *dst_ids,
                                                 size_t num_blocks,
                                                 const kvbm_transfer_options_t *options,
                                                 kvbm_notification_t *notification);

/* Pulls blocks src_ids of another worker's layout remote (from its
 * metadata, imported with kvbm_worker_import_metadata) into local tier dst.
 * Returns as kvbm_worker_transfer; KVBM_ERR_NOT_FOUND when remote was not
 * imported. */
kvbm_status_t kvbm_worker_transfer_from_remote(kvbm_worker_t worker,
                                               const kvbm_layout_handle_t *remote,
                                               const uint32_t *src_ids, int32_t dst,
                                               const uint32_t *dst_ids, size_t num_blocks,
                                               const kvbm_transfer_options_t *options,
                                               kvbm_notification_t *notification);

/* Pushes blocks src_ids of local tier src into blocks dst_ids of another
 * worker's layout remote (imported as above): offload to a peer.
 * Returns as kvbm_worker_transfer_from_remote. */
kvbm_status_t kvbm_worker_transfer_to_remote(kvbm_worker_t worker, int32_t src,
                                             const uint32_t *src_ids,
                                             const kvbm_layout_handle_t *remote,
                                             const uint32_t *dst_ids, size_t num_blocks,
                                             const kvbm_transfer_options_t *options,
                                             kvbm_notification_t *notification);

/* ------------------------------------------------------------- counters */

/* The paths blocks move along; stable values, indices of
 * kvbm_counters_t.paths. */
typedef enum kvbm_path {
    KVBM_PATH_HOST_COPY = 0,  /* host <-> host memcpy */
    KVBM_PATH_H2D = 1,        /* pinned -> device (layer-wise onboard too) */
    KVBM_PATH_D2H = 2,        /* device -> pinned */
    KVBM_PATH_D2D = 3,        /* device -> device */
    KVBM_PATH_DISK_WRITE = 4, /* host -> disk */
    KVBM_PATH_DISK_READ = 5,  /* disk -> host */
    KVBM_PATH_TWO_HOP = 6,    /* disk <-> device, disk <-> disk, a peer <-> device
                                 or disk, via a bounce buffer */
    KVBM_PATH_REMOTE_READ = 7,  /* a peer's memory -> host, over the transport */
    KVBM_PATH_REMOTE_WRITE = 8, /* host -> a peer's memory */
    KVBM_PATH_COUNT = 9
} kvbm_path_t;

/* Totals of one path since the worker was created. Object store calls are
 * not counted here. */
typedef struct kvbm_path_counters {
    uint64_t transfers;     /* completed transfers, failed or not */
    uint64_t blocks;        /* blocks those transfers moved or tried to */
    uint64_t bytes;
    uint64_t failed_blocks; /* destination blocks reported failed */
    uint64_t nanoseconds;   /* time in flight, call to completion, summed */
} kvbm_path_counters_t;

typedef struct kvbm_counters {
    size_t struct_size;
    kvbm_path_counters_t paths[KVBM_PATH_COUNT];
} kvbm_counters_t;
#define KVBM_COUNTERS_INIT {sizeof(kvbm_counters_t), {{0, 0, 0, 0, 0}}}

/* Reads the worker's counters per path, so that an engine can export them
 * to its metrics system. Cheap (atomic loads); any thread. counters is the
 * caller's. Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (NULL, struct_size),
 * KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_counters(kvbm_worker_t worker, kvbm_counters_t *counters);

/* ---------------------------------------------------- object store (G4) */

/* Keys are byte strings of 1 to KVBM_MAX_KEY_LEN bytes: keys[i] points to
 * key_lens[i] bytes. All arrays have num_keys entries and are read during
 * the call only. The calls block until done. */
#define KVBM_MAX_KEY_LEN 64

/* Writes found[i] = 1 when a well-formed object exists under keys[i],
 * else 0. Without an object store nothing is found. A key whose object
 * exists but cannot be used (truncated, corrupt, unreadable) is not found:
 * the call still returns KVBM_OK for the others, and kvbm_last_error()
 * then names how many keys, the index of the first and why; after a call
 * where every key could be answered it is "". Returns KVBM_OK,
 * KVBM_ERR_INVALID_ARGUMENT, KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_object_has(kvbm_worker_t worker, const uint8_t *const *keys,
                                     const size_t *key_lens, size_t num_keys, uint8_t *found);

/* Stores blocks block_ids of tier under keys. statuses (may be NULL)
 * receives each block's status. A block id beyond the layout
 * (KVBM_ERR_OUT_OF_RANGE) is refused before anything moves, as is a
 * destination block named twice in a get (KVBM_ERR_INVALID_ARGUMENT); every
 * statuses[i] then holds that status. A source block may be stored under
 * several keys. Returns KVBM_OK when every block was stored, else the
 * status of the first failed block (KVBM_ERR_NOT_FOUND, KVBM_ERR_IO,
 * KVBM_ERR_UNSUPPORTED without an object store, ...), or
 * KVBM_ERR_INVALID_ARGUMENT, KVBM_ERR_OUT_OF_RANGE, KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_object_put(kvbm_worker_t worker, const uint8_t *const *keys,
                                     const size_t *key_lens, size_t num_keys, int32_t tier,
                                     const uint32_t *block_ids, kvbm_status_t *statuses);

/* Loads objects into blocks block_ids of tier. As put; a missing object is
 * KVBM_ERR_NOT_FOUND, a corrupt one KVBM_ERR_DATA_CORRUPTION. An object's
 * header (format, recorded key, length) is checked before its payload is
 * read; the payload is read straight into a host block and checked as it
 * lands, so a block that fails may hold any bytes: it is reported failed,
 * never loaded. */
kvbm_status_t kvbm_worker_object_get(kvbm_worker_t worker, const uint8_t *const *keys,
                                     const size_t *key_lens, size_t num_keys, int32_t tier,
                                     const uint32_t *block_ids, kvbm_status_t *statuses);

/* As kvbm_worker_object_get and _put, but in the background: the calls
 * return at once with a notification that completes when every block is
 * done, failing with the destination (onboard) or source (offload) block
 * ids whose objects failed (kvbm_notification_failed_blocks). The arrays
 * are copied during the call. The request is checked before anything
 * starts, as kvbm_worker_object_get and _put check theirs. Returns KVBM_OK,
 * KVBM_ERR_INVALID_ARGUMENT (NULL, lengths, a destination block id
 * repeated), KVBM_ERR_OUT_OF_RANGE (a block id beyond the layout),
 * KVBM_ERR_NOT_FOUND (tier not registered), KVBM_ERR_UNSUPPORTED (no
 * object store), KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_onboard_objects(kvbm_worker_t worker, const uint8_t *const *keys,
                                          const size_t *key_lens, size_t num_keys, int32_t dst,
                                          const uint32_t *dst_ids,
                                          kvbm_notification_t *notification);
kvbm_status_t kvbm_worker_offload_objects(kvbm_worker_t worker, int32_t src,
                                          const uint32_t *src_ids, const uint8_t *const *keys,
                                          const size_t *key_lens, size_t num_keys,
                                          kvbm_notification_t *notification);

/* ----------------------------------------------------------- prefix cache */

/* A worker's tiered prefix cache: which of its G2, G3 and G4 blocks hold
 * which KV, found by key. A key names the KV of one full block given its
 * whole prefix (vLLM's block hashes, SGLang's page keys): 1 to
 * KVBM_MAX_KEY_LEN bytes, passed as for the object calls. The library
 * picks the blocks: it dedupes offloads, evicts the least recently used
 * blocks no transfer holds (writing them down to G3 and G4 as configured),
 * stages G3 and G4 blocks through G2 on onboard, and removes a block found
 * corrupt. A block that fails is reported failed, never loaded. */

typedef enum kvbm_write_mode {
    /* G3: write-back when the worker has G3. G4: write-back from the lowest
     * local tier when the worker has an object store. */
    KVBM_WRITE_AUTO = 0,
    KVBM_WRITE_OFF = 1,      /* the cache never writes the tier */
    KVBM_WRITE_BACK = 2,     /* when a block is evicted from the tier above */
    KVBM_WRITE_THROUGH = 3   /* as soon as a block lands in G2 */
} kvbm_write_mode_t;

typedef struct kvbm_cache_config {
    size_t struct_size;
    uint32_t admit_after; /* offload a key once seen this many times (offered,
                             or onboarded); 0 or 1: always */
    int32_t g3_mode;      /* kvbm_write_mode_t */
    int32_t g4_mode;      /* kvbm_write_mode_t */
    uint32_t max_events;  /* events kept until drained; 0: 65536 */
} kvbm_cache_config_t;
#define KVBM_CACHE_CONFIG_INIT {sizeof(kvbm_cache_config_t), 0, KVBM_WRITE_AUTO, KVBM_WRITE_AUTO, 0}

/* Gives the worker its prefix cache over its G2 (and G3, and object store
 * when it has them); G1 and G2 must be registered first. Once per worker;
 * kvbm_worker_destroy waits for the cache's background work. config NULL:
 * the defaults. Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (struct_size, a
 * mode out of range), KVBM_ERR_NOT_FOUND (G1 or G2 not registered),
 * KVBM_ERR_ALREADY_EXISTS (enabled already), KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_worker_cache_enable(kvbm_worker_t worker, const kvbm_cache_config_t *config);

/* How many leading keys can be onboarded now: *matched, and when tiers is
 * not NULL (num_keys entries) the tier each would come from (2, 3, or 4
 * for G4), 0 past *matched. Changes nothing that later calls depend on, so
 * a scheduler may ask again; it may ask the object store (I/O). Returns
 * KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (NULL, a key length, a key repeated),
 * KVBM_ERR_FAILED_PRECONDITION (no cache: kvbm_worker_cache_enable; or
 * after fork()), KVBM_ERR_INVALID_HANDLE. */
kvbm_status_t kvbm_worker_cache_match(kvbm_worker_t worker, const uint8_t *const *keys,
                                      const size_t *key_lens, size_t num_keys, size_t *matched,
                                      int32_t *tiers);

/* What an offload decided per key (decisions[i]). */
enum {
    KVBM_CACHE_STORE = 0,        /* copied to a G2 block */
    KVBM_CACHE_PRESENT = 1,      /* cached already: nothing to copy */
    KVBM_CACHE_IN_FLIGHT = 2,    /* being stored already: nothing to copy */
    KVBM_CACHE_NOT_ADMITTED = 3, /* not seen admit_after times yet */
    KVBM_CACHE_NO_SPACE = 4      /* every G2 block is held by a transfer */
};

/* Saves G1 block g1_ids[i], holding the KV of keys[i], to G2 — after
 * precondition (the engine's compute event; NULL for none) — unless the key
 * is cached or in flight already, not admitted yet, or no block can be had;
 * decisions (may be NULL; num_keys entries) says which. Blocks that land are
 * registered, then written down to G3/G4 as configured. The notification
 * completes when the G1 blocks may be reused; it fails naming the G1 block
 * ids that were not saved (none of their keys is registered). When G2
 * blocks must be written down before reuse, that happens before the copy:
 * within this call when precondition is given. The arrays are read during
 * the call only. Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (NULL, a key
 * length, a key repeated), KVBM_ERR_OUT_OF_RANGE (a G1 id beyond G1),
 * KVBM_ERR_FAILED_PRECONDITION (no cache), KVBM_ERR_CANCELED (closing),
 * KVBM_ERR_INVALID_HANDLE; nothing changed on an error. */
kvbm_status_t kvbm_worker_cache_offload(kvbm_worker_t worker, const uint8_t *const *keys,
                                        const size_t *key_lens, size_t num_keys,
                                        const uint32_t *g1_ids, kvbm_event_t precondition,
                                        int32_t *decisions, kvbm_notification_t *notification);

/* Loads keys[i] into G1 block g1_ids[i] from the tier that caches it (G2;
 * G3 and G4 staged through G2's free blocks, where they stay; the others go
 * straight to G1 and into G2 after the load, in the background). The notification fails
 * naming the G1 blocks not loaded (a key no longer cached, a corrupt block
 * — removed from its tier — or a failed copy); the others are loaded. With
 * layer_events (num_events = the number of layers) the G2 -> G1 copies go
 * layer by layer on stream (NULL: the library's) and layer_events[L] is
 * recorded after layer L, every one before this call returns (G3 and G4
 * blocks are staged within the call); the events stay the caller's.
 * Without events (NULL, 0) the whole load runs in the background. Returns
 * KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (NULL, a key length, a key or a G1 id
 * repeated, num_events), KVBM_ERR_OUT_OF_RANGE (a G1 id beyond G1),
 * KVBM_ERR_FAILED_PRECONDITION (no cache), KVBM_ERR_CANCELED,
 * KVBM_ERR_INVALID_HANDLE; nothing changed on an error. */
kvbm_status_t kvbm_worker_cache_onboard(kvbm_worker_t worker, const uint8_t *const *keys,
                                        const size_t *key_lens, size_t num_keys,
                                        const uint32_t *g1_ids, const kvbm_event_t *layer_events,
                                        size_t num_events, kvbm_stream_t stream,
                                        kvbm_notification_t *notification);

/* One tier's occupancy (blocks) and counters since the cache was made. */
typedef struct kvbm_cache_tier_stats {
    uint64_t capacity;
    uint64_t free;
    uint64_t registered;
    uint64_t pinned;    /* registered blocks a transfer holds */
    uint64_t in_flight; /* allocated for data not landed yet */
    uint64_t hits;      /* keys looked up for onboards and found here */
    uint64_t misses;    /* ... and not found here */
    uint64_t evictions; /* blocks reused for other keys */
    uint64_t stored;    /* keys registered */
    uint64_t removed;   /* keys removed (found corrupt) */
} kvbm_cache_tier_stats_t;

typedef struct kvbm_cache_stats {
    size_t struct_size;
    kvbm_cache_tier_stats_t g2;
    kvbm_cache_tier_stats_t g3; /* all 0 without G3 */
    uint64_t g4_known;          /* G4 keys remembered as present */
    uint64_t g4_hits;
    uint64_t g4_misses;
    uint64_t g4_puts;
    uint64_t g4_put_failures;
    uint64_t g4_corrupt;
    uint64_t offloaded;         /* blocks copied G1 -> G2 */
    uint64_t deduped;           /* offered blocks cached or in flight already */
    uint64_t not_admitted;
    uint64_t no_space;
    uint64_t offload_failed;
    uint64_t onboarded;         /* blocks loaded into G1 ... */
    uint64_t onboarded_from_g2; /* ... by the tier they were found in */
    uint64_t onboarded_from_g3;
    uint64_t onboarded_from_g4;
    uint64_t onboard_failed;
    uint64_t written_down;      /* blocks written to G3 and G4 */
    uint64_t write_down_failed; /* ... that failed, or found no tier */
    uint64_t events_dropped;    /* not drained in time */
    /* A persistent G3 (kvbm_worker_config_t.g3_persist_id): the blocks its
     * journal named at start that were vouched for and are G3's again, and
     * those that were not (their bytes no longer match). Filled when
     * struct_size covers them. */
    uint64_t g3_restored;
    uint64_t g3_refused;
    /* The bytes per second loads from each tier ran at lately, by tier
     * number (2, 3, 4; 0 until measured: G3 and G4 their staging, G2 the
     * copy into G1 every block takes), and the bytes of each tier's loads
     * in flight: what kvbm_load_plan weighs. Filled when struct_size
     * covers them. */
    double load_rate[5];
    double load_queued[5];
} kvbm_cache_stats_t;
#define KVBM_CACHE_TIER_STATS_ZERO_ {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
#define KVBM_CACHE_STATS_INIT                                                                      \
    {sizeof(kvbm_cache_stats_t), KVBM_CACHE_TIER_STATS_ZERO_, KVBM_CACHE_TIER_STATS_ZERO_, 0, 0, 0, \
     0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, {0}, {0}}

/* Fills *stats (struct_size set by the caller, KVBM_CACHE_STATS_INIT).
 * Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT, KVBM_ERR_FAILED_PRECONDITION
 * (no cache), KVBM_ERR_INVALID_HANDLE. */
kvbm_status_t kvbm_worker_cache_stats(kvbm_worker_t worker, kvbm_cache_stats_t *stats);

/* What kvbm_load_plan weighs besides the prefix's tiers. */
typedef struct kvbm_load_plan_input {
    size_t struct_size;
    double block_bytes;          /* of one block on one rank; > 0 */
    uint32_t tokens_per_block;   /* > 0 */
    double prefill_tokens_per_s; /* the engine's prefill rate; 0: not known
                                    (every block is loaded) */
    double margin;               /* fraction of the recompute time a load
                                    must save, in [0, 1) */
    double load_rate[5];         /* kvbm_cache_stats_t's, by tier number */
    double load_queued[5];
} kvbm_load_plan_input_t;
#define KVBM_LOAD_PLAN_INPUT_INIT {sizeof(kvbm_load_plan_input_t), 0, 0, 0, 0.1, {0}, {0}}

/* Load or recompute: of a matched prefix whose block i is in tier tiers[i]
 * (2, 3 or 4, as kvbm_worker_cache_match says), how many leading blocks
 * are worth loading: those whose load is expected to end before computing
 * them would, by the margin (the tiers' measured rates and queues against
 * the prefill rate; a tier not measured yet counts as fast). *blocks is
 * that count (0: recompute all). Pure: no worker, any thread. Returns
 * KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (NULL, struct_size, a tier out of
 * range, a size or rate that is not a number >= 0, margin outside [0, 1)). */
kvbm_status_t kvbm_load_plan(const int32_t *tiers, size_t num_blocks,
                             const kvbm_load_plan_input_t *input, size_t *blocks);

/* Forgets every key G2 and G3 hold (an engine's reset of its prefix
 * cache): a KVBM_CACHE_EVENT_REMOVED is recorded for each, their blocks
 * take new stores, a block a transfer holds is freed when it lets go. Keys
 * still being stored land afterwards; G4 objects are kept (they outlive the
 * process and may be shared). Sets *g2_removed and *g3_removed (each may be
 * NULL) to the keys that left each tier. Returns KVBM_OK,
 * KVBM_ERR_FAILED_PRECONDITION (no cache), KVBM_ERR_CANCELED (the worker is
 * being destroyed), KVBM_ERR_INVALID_HANDLE. Any thread. */
kvbm_status_t kvbm_worker_cache_reset(kvbm_worker_t worker, uint64_t *g2_removed,
                                      uint64_t *g3_removed);

enum {
    KVBM_CACHE_EVENT_STORED = 1, /* the key became present in the tier */
    KVBM_CACHE_EVENT_REMOVED = 2 /* it left (evicted, or found corrupt) */
};

/* A key entering or leaving a tier, for KV-aware routers. */
typedef struct kvbm_cache_event {
    int32_t kind;     /* KVBM_CACHE_EVENT_* */
    int32_t tier;     /* 2, 3, or 4 for G4 */
    uint32_t key_len;
    uint8_t key[KVBM_MAX_KEY_LEN];
} kvbm_cache_event_t;

/* Moves up to capacity of the oldest events into events, in the order
 * they happened across tiers, and sets *count; call until *count <
 * capacity to drain them all. Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT,
 * KVBM_ERR_FAILED_PRECONDITION (no cache), KVBM_ERR_INVALID_HANDLE. */
kvbm_status_t kvbm_worker_cache_events(kvbm_worker_t worker, kvbm_cache_event_t *events,
                                       size_t capacity, size_t *count);

/* ----------------------------------------------------------- notification */

/* KVBM_OK when the transfer completed successfully, KVBM_IN_PROGRESS while
 * it runs, or the transfer's error status (KVBM_ERR_CUDA, KVBM_ERR_IO,
 * KVBM_ERR_DATA_CORRUPTION, ...; the message names what failed). Also
 * KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. Any thread. */
kvbm_status_t kvbm_notification_poll(kvbm_notification_t notification);

/* Blocks until the transfer completes or timeout_ms passes (negative:
 * forever). Returns as poll, with KVBM_ERR_TIMEOUT instead of
 * KVBM_IN_PROGRESS; after a timeout the transfer goes on and can be waited
 * for again. */
kvbm_status_t kvbm_notification_wait(kvbm_notification_t notification, int64_t timeout_ms);

/* Writes the destination block ids whose data is not valid (sorted; none
 * while pending or on success) into ids and their number into *count.
 * If capacity < the number, nothing is written, *count is the number
 * needed and KVBM_ERR_BUFFER_TOO_SMALL is returned. ids may be NULL when
 * capacity is 0. Returns KVBM_OK, KVBM_ERR_BUFFER_TOO_SMALL,
 * KVBM_ERR_INVALID_ARGUMENT, KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_notification_failed_blocks(kvbm_notification_t notification, uint32_t *ids,
                                              size_t capacity, size_t *count);

/* Stops the transfer's operations on a peer's memory that have not
 * completed (pulls and pushes between workers of different processes):
 * their blocks fail with KVBM_ERR_CANCELED, the others complete as they
 * would. Once the notification completes nothing more is written to the
 * destination blocks, so the caller may reuse them (wait for it). Copies
 * already handed to the device or the disk finish first; a transfer
 * without remote operations is not changed. Any thread, any number of
 * times. Returns KVBM_OK, KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_notification_cancel(kvbm_notification_t notification);

/* Releases the handle. A transfer still running goes on to completion.
 * Returns KVBM_OK, KVBM_ERR_INVALID_HANDLE (also on double free),
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_notification_free(kvbm_notification_t notification);

/* ----------------------------------------------------- coordinated worker */

/* The leader's view of a worker: which handles it has, and the handles of
 * remote workers, by (remote leader instance, rank), it can pull from.
 * Creates one over inner (not owned; destroy the coordinated worker first).
 * Thread safety: any thread. Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT,
 * KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_coordinated_create(kvbm_worker_t inner, int32_t rank, uint64_t host_instance,
                                      kvbm_coordinated_t *coordinated);
/* Releases the handle (not the inner worker). Returns KVBM_OK,
 * KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_coordinated_destroy(kvbm_coordinated_t coordinated);
/* Records the handle of a local tier. Returns KVBM_OK,
 * KVBM_ERR_INVALID_ARGUMENT (bad tier or handle), KVBM_ERR_ALREADY_EXISTS,
 * KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_coordinated_set_local(kvbm_coordinated_t coordinated, int32_t tier,
                                         const kvbm_layout_handle_t *handle);
/* Records the local handles named in the metadata the worker exported
 * (kvbm_worker_export_metadata). Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT,
 * KVBM_ERR_DATA_CORRUPTION, KVBM_ERR_ALREADY_EXISTS (a tier set to another
 * handle; nothing applied), KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_coordinated_apply_layout_response(kvbm_coordinated_t coordinated,
                                                     const uint8_t *metadata, size_t len);
/* Imports the metadata of worker rank of remote leader into the inner
 * worker and records its handles. Returns as kvbm_worker_import_metadata. */
kvbm_status_t kvbm_coordinated_import_remote_metadata(kvbm_coordinated_t coordinated,
                                                      uint64_t leader, int32_t rank,
                                                      const uint8_t *metadata, size_t len);
/* Writes the handle of tier of remote (leader, rank) to *handle. Returns
 * KVBM_OK, KVBM_ERR_NOT_FOUND, KVBM_ERR_INVALID_ARGUMENT,
 * KVBM_ERR_INVALID_HANDLE, KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_coordinated_resolve_remote_handle(kvbm_coordinated_t coordinated,
                                                     uint64_t leader, int32_t rank, int32_t tier,
                                                     kvbm_layout_handle_t *handle);
/* Pulls blocks of remote (leader, rank) tier src into local tier dst.
 * Returns as kvbm_worker_transfer, and KVBM_ERR_NOT_FOUND for an unknown
 * remote or tier. */
kvbm_status_t kvbm_coordinated_transfer_from_remote(kvbm_coordinated_t coordinated,
                                                    uint64_t leader, int32_t rank, int32_t src,
                                                    const uint32_t *src_ids, int32_t dst,
                                                    const uint32_t *dst_ids, size_t num_blocks,
                                                    const kvbm_transfer_options_t *options,
                                                    kvbm_notification_t *notification);

/* ---------------------------------------------------------------- handoff */

/* One prefill->decode hand-off, as a pure state machine: facts and action
 * outcomes in, actions out (see core/handoff's package documentation for
 * the driver's loop). Numeric values below are stable. */

#define KVBM_HANDOFF_MAX_ACTIONS 2 /* most actions one call returns */

typedef enum kvbm_handoff_order {
    KVBM_HANDOFF_SOURCE_FIRST = 1,     /* vLLM */
    KVBM_HANDOFF_DESTINATION_FIRST = 2 /* SGLang */
} kvbm_handoff_order_t;

typedef enum kvbm_handoff_fact_kind {
    KVBM_FACT_SOURCE_HELD = 1,
    KVBM_FACT_DESTINATION_RESERVED = 2,
    KVBM_FACT_TRANSFER_COMPLETED = 3,
    KVBM_FACT_FAILED = 4,
    KVBM_FACT_TIMED_OUT = 5,
    KVBM_FACT_CANCELED = 6
} kvbm_handoff_fact_kind_t;

typedef enum kvbm_handoff_timing_mode {
    KVBM_TIMING_FULL_PROMPT = 1,
    KVBM_TIMING_DESTINATION_MISSING = 2
} kvbm_handoff_timing_mode_t;

typedef enum kvbm_handoff_action_kind {
    KVBM_ACTION_SUBMIT_PREFILL = 1,       /* report SUBMITTED or FAILED */
    KVBM_ACTION_RESERVE_DESTINATION = 2,  /* report ACCEPTED or FAILED */
    KVBM_ACTION_START_TRANSFER = 3,       /* report SCHEDULED or FAILED */
    KVBM_ACTION_ACTIVATE_DESTINATION = 4, /* report APPLIED or FAILED */
    KVBM_ACTION_RELEASE_SOURCE = 5,       /* report APPLIED, NOOP or FAILED */
    KVBM_ACTION_CANCEL_SOURCE = 6,        /* report APPLIED or NOOP */
    KVBM_ACTION_CANCEL_DESTINATION = 7,   /* report APPLIED or NOOP */
    KVBM_ACTION_COMPLETE = 8              /* over; see completion */
} kvbm_handoff_action_kind_t;

typedef enum kvbm_handoff_outcome_kind {
    KVBM_OUTCOME_SUBMITTED = 1,
    KVBM_OUTCOME_ACCEPTED = 2,
    KVBM_OUTCOME_SCHEDULED = 3,
    KVBM_OUTCOME_APPLIED = 4,
    KVBM_OUTCOME_NOOP = 5,
    KVBM_OUTCOME_FAILED = 6
} kvbm_handoff_outcome_kind_t;

typedef enum kvbm_handoff_completion {
    KVBM_COMPLETION_NONE = 0,
    KVBM_COMPLETION_SUCCESS = 1,
    KVBM_COMPLETION_CANCELED = 2
} kvbm_handoff_completion_t;

/* Something the driver learned. Only the fields of its kind are read:
 * timing_* for SOURCE_HELD, transferable_tokens for DESTINATION_RESERVED. */
typedef struct kvbm_handoff_fact {
    size_t struct_size;
    int32_t kind;          /* kvbm_handoff_fact_kind_t */
    uint8_t handoff_id[16];
    int32_t timing_mode;   /* kvbm_handoff_timing_mode_t */
    uint64_t full_prompt_tokens;
    uint64_t kv_bytes_per_token;  /* read when has_kv_bytes_per_token */
    uint8_t has_kv_bytes_per_token;
    uint8_t has_bandwidth_gbs;
    double bandwidth_gbs;         /* read when has_bandwidth_gbs */
    uint64_t transferable_tokens;
} kvbm_handoff_fact_t;
#define KVBM_HANDOFF_FACT_INIT {sizeof(kvbm_handoff_fact_t), 0, {0}, KVBM_TIMING_FULL_PROMPT, 0, 0, 0, 0, 0.0, 0}

/* An action for the driver, written by the library. */
typedef struct kvbm_handoff_action {
    uint64_t id;        /* report its outcome under this id (never 0) */
    int32_t kind;       /* kvbm_handoff_action_kind_t */
    int32_t completion; /* kvbm_handoff_completion_t, for COMPLETE */
    double delay_ms;    /* for START_TRANSFER */
    uint8_t handoff_id[16];
} kvbm_handoff_action_t;

/* Creates the coordinator of hand-off id (16 bytes, copied) in order;
 * fallback_delay_ms (finite, >= 0) is the START_TRANSFER delay when the
 * timing gives none. The caller frees it with kvbm_handoff_free.
 * Thread safety: calls on one coordinator are serialised by the library;
 * the driver still decides their order.
 * Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (NULL, unknown order, bad
 * delay), KVBM_ERR_FAILED_PRECONDITION (after fork()). */
kvbm_status_t kvbm_handoff_new(const uint8_t id[16], int32_t order, double fallback_delay_ms,
                               kvbm_handoff_t *handoff);

/* The calls below write the actions to execute, in order, into actions
 * (capacity entries, at least KVBM_HANDOFF_MAX_ACTIONS, else
 * KVBM_ERR_BUFFER_TOO_SMALL and nothing is applied) and their number into
 * *count. On an error the coordinator is unchanged and *count is 0. */

/* Starts the hand-off. Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT,
 * KVBM_ERR_BUFFER_TOO_SMALL, KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_handoff_start(kvbm_handoff_t handoff, kvbm_handoff_action_t *actions,
                                 size_t capacity, size_t *count);

/* Applies a fact. Returns KVBM_OK, KVBM_ERR_INVALID_ARGUMENT (a fact for
 * another hand-off, an unknown kind, an invalid timing),
 * KVBM_ERR_FAILED_PRECONDITION (a fact out of order),
 * KVBM_ERR_BUFFER_TOO_SMALL, KVBM_ERR_INVALID_HANDLE. */
kvbm_status_t kvbm_handoff_on_fact(kvbm_handoff_t handoff, const kvbm_handoff_fact_t *fact,
                                   kvbm_handoff_action_t *actions, size_t capacity,
                                   size_t *count);

/* Reports how action action_id went; message (may be NULL, copied) says
 * why a KVBM_OUTCOME_FAILED failed. Returns KVBM_OK, KVBM_ERR_NOT_FOUND (no
 * such action), KVBM_ERR_ALREADY_EXISTS (a different outcome was
 * reported), KVBM_ERR_INVALID_ARGUMENT (an outcome the action does not
 * take), KVBM_ERR_FAILED_PRECONDITION (a cancel reported FAILED: retry it),
 * KVBM_ERR_BUFFER_TOO_SMALL, KVBM_ERR_INVALID_HANDLE. */
kvbm_status_t kvbm_handoff_on_outcome(kvbm_handoff_t handoff, uint64_t action_id,
                                      int32_t outcome, const char *message,
                                      kvbm_handoff_action_t *actions, size_t capacity,
                                      size_t *count);

/* *complete = 1 once a KVBM_ACTION_COMPLETE was issued, else 0. Returns
 * KVBM_OK, KVBM_ERR_INVALID_ARGUMENT, KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_handoff_is_complete(kvbm_handoff_t handoff, int32_t *complete);

/* *completion = how the hand-off ended (KVBM_COMPLETION_NONE while not).
 * Returns as kvbm_handoff_is_complete. */
kvbm_status_t kvbm_handoff_completion(kvbm_handoff_t handoff, int32_t *completion);

/* Releases the coordinator. Returns KVBM_OK, KVBM_ERR_INVALID_HANDLE,
 * KVBM_ERR_FAILED_PRECONDITION. */
kvbm_status_t kvbm_handoff_free(kvbm_handoff_t handoff);

#ifdef __cplusplus
}
#endif

#endif /* KVBM_H */
