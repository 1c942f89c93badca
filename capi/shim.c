// The public kvbm_* functions. Each one refuses calls in a child after
// fork() — entering the Go runtime there would hang, since the runtime's
// threads did not survive the fork — and otherwise forwards to its Go
// export (kvbmgo_*, in exports_*.go). Static strings and the per-thread
// last error live here, in C, so that they need no Go call.
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "kvbm.h"
#include "_cgo_export.h"

// ---- per-thread last error -------------------------------------------------

static __thread char last_error[1024];

__attribute__((visibility("hidden"))) void kvbm_capi_set_error(const char *msg, size_t len) {
    if (len >= sizeof last_error) {
        len = sizeof last_error - 1;
    }
    if (len > 0) {
        memcpy(last_error, msg, len);
    }
    last_error[len] = '\0';
}

const char *kvbm_last_error(void) { return last_error; }

// ---- fork detection --------------------------------------------------------

static pid_t init_pid;
static volatile int forked;

static void on_fork_child(void) { forked = 1; }

__attribute__((constructor)) static void kvbm_capi_init(void) {
    init_pid = getpid();
    pthread_atfork(NULL, NULL, on_fork_child);
}

static kvbm_status_t fork_error(void) {
    char msg[256];
    int n = snprintf(msg, sizeof msg,
                     "kvbm: the library was initialized in process %d and cannot be used in a "
                     "child process (%d) after fork(); use it in the parent, or exec a new program",
                     (int)init_pid, (int)getpid());
    kvbm_capi_set_error(msg, n < 0 ? 0 : (size_t)n);
    return KVBM_ERR_FAILED_PRECONDITION;
}

#define FORWARD(call)          \
    do {                       \
        if (forked) {          \
            return fork_error(); \
        }                      \
        return call;           \
    } while (0)

#define H(x) ((uintptr_t)(x))

// ---- static information ----------------------------------------------------

uint32_t kvbm_version(void) {
    return KVBM_VERSION_CODE(KVBM_VERSION_MAJOR, KVBM_VERSION_MINOR, KVBM_VERSION_PATCH);
}

uint32_t kvbm_abi_version(void) { return KVBM_ABI_VERSION; }

const char *kvbm_status_string(kvbm_status_t s) {
    switch (s) {
    case KVBM_OK: return "KVBM_OK";
    case KVBM_IN_PROGRESS: return "KVBM_IN_PROGRESS";
    case KVBM_ERR_INVALID_ARGUMENT: return "KVBM_ERR_INVALID_ARGUMENT";
    case KVBM_ERR_INVALID_HANDLE: return "KVBM_ERR_INVALID_HANDLE";
    case KVBM_ERR_NOT_FOUND: return "KVBM_ERR_NOT_FOUND";
    case KVBM_ERR_ALREADY_EXISTS: return "KVBM_ERR_ALREADY_EXISTS";
    case KVBM_ERR_FAILED_PRECONDITION: return "KVBM_ERR_FAILED_PRECONDITION";
    case KVBM_ERR_OUT_OF_RANGE: return "KVBM_ERR_OUT_OF_RANGE";
    case KVBM_ERR_BUFFER_TOO_SMALL: return "KVBM_ERR_BUFFER_TOO_SMALL";
    case KVBM_ERR_IO: return "KVBM_ERR_IO";
    case KVBM_ERR_CUDA: return "KVBM_ERR_CUDA";
    case KVBM_ERR_TIMEOUT: return "KVBM_ERR_TIMEOUT";
    case KVBM_ERR_CANCELED: return "KVBM_ERR_CANCELED";
    case KVBM_ERR_UNSUPPORTED: return "KVBM_ERR_UNSUPPORTED";
    case KVBM_ERR_DATA_CORRUPTION: return "KVBM_ERR_DATA_CORRUPTION";
    case KVBM_ERR_INTERNAL: return "KVBM_ERR_INTERNAL";
    case KVBM_ERR_DEADLINE_EXCEEDED: return "KVBM_ERR_DEADLINE_EXCEEDED";
    }
    return "KVBM_ERR_UNKNOWN";
}

// ---- forwarded calls -------------------------------------------------------

kvbm_status_t kvbm_handle_count(size_t *count) { FORWARD(kvbmgo_handle_count(count)); }
kvbm_status_t kvbm_info(kvbm_info_t *info) { FORWARD(kvbmgo_info(info)); }

kvbm_status_t kvbm_stream_create(int32_t device, kvbm_stream_t *stream) {
    FORWARD(kvbmgo_stream_create(device, (uintptr_t *)stream));
}
kvbm_status_t kvbm_stream_destroy(kvbm_stream_t s) { FORWARD(kvbmgo_stream_destroy(H(s))); }
kvbm_status_t kvbm_stream_synchronize(kvbm_stream_t s) { FORWARD(kvbmgo_stream_synchronize(H(s))); }
kvbm_status_t kvbm_stream_wait_event(kvbm_stream_t s, kvbm_event_t e) {
    FORWARD(kvbmgo_stream_wait_event(H(s), H(e)));
}
kvbm_status_t kvbm_event_create(int32_t device, kvbm_event_t *event) {
    FORWARD(kvbmgo_event_create(device, (uintptr_t *)event));
}
kvbm_status_t kvbm_event_destroy(kvbm_event_t e) { FORWARD(kvbmgo_event_destroy(H(e))); }
kvbm_status_t kvbm_event_record(kvbm_event_t e, kvbm_stream_t s) { FORWARD(kvbmgo_event_record(H(e), H(s))); }
kvbm_status_t kvbm_event_query(kvbm_event_t e) { FORWARD(kvbmgo_event_query(H(e))); }
kvbm_status_t kvbm_event_synchronize(kvbm_event_t e) { FORWARD(kvbmgo_event_synchronize(H(e))); }

kvbm_status_t kvbm_worker_create(const kvbm_worker_config_t *config, kvbm_worker_t *worker) {
    FORWARD(kvbmgo_worker_create((kvbm_worker_config_t *)config, (uintptr_t *)worker));
}
kvbm_status_t kvbm_worker_destroy(kvbm_worker_t w) { FORWARD(kvbmgo_worker_destroy(H(w))); }
kvbm_status_t kvbm_worker_register_g1(kvbm_worker_t w, const kvbm_layout_config_t *config,
                                      const uint64_t *ptrs, size_t num_ptrs,
                                      kvbm_layout_handle_t *handle) {
    FORWARD(kvbmgo_worker_register_g1(H(w), (kvbm_layout_config_t *)config, (uint64_t *)ptrs,
                                      num_ptrs, handle));
}
kvbm_status_t kvbm_worker_unregister_g1(kvbm_worker_t w, const char *reason) {
    FORWARD(kvbmgo_worker_unregister_g1(H(w), (char *)reason));
}
kvbm_status_t kvbm_worker_register_g1_host(kvbm_worker_t w, const kvbm_layout_config_t *config,
                                           const uint64_t *ptrs, size_t num_ptrs,
                                           kvbm_layout_handle_t *handle) {
    FORWARD(kvbmgo_worker_register_g1_host(H(w), (kvbm_layout_config_t *)config, (uint64_t *)ptrs,
                                           num_ptrs, handle));
}
kvbm_status_t kvbm_worker_register_g2(kvbm_worker_t w, const kvbm_layout_config_t *config,
                                      const uint64_t *ptrs, size_t num_ptrs,
                                      kvbm_layout_handle_t *handle) {
    FORWARD(kvbmgo_worker_register_g2(H(w), (kvbm_layout_config_t *)config, (uint64_t *)ptrs,
                                      num_ptrs, handle));
}
kvbm_status_t kvbm_worker_allocate_g2(kvbm_worker_t w, const kvbm_layout_config_t *config,
                                      kvbm_layout_handle_t *handle) {
    FORWARD(kvbmgo_worker_allocate_g2(H(w), (kvbm_layout_config_t *)config, handle));
}
kvbm_status_t kvbm_worker_allocate_g3(kvbm_worker_t w, const kvbm_layout_config_t *config,
                                      kvbm_layout_handle_t *handle) {
    FORWARD(kvbmgo_worker_allocate_g3(H(w), (kvbm_layout_config_t *)config, handle));
}
kvbm_status_t kvbm_worker_transfer(kvbm_worker_t w, int32_t src, const uint32_t *src_ids,
                                   int32_t dst, const uint32_t *dst_ids, size_t num_blocks,
                                   const kvbm_transfer_options_t *options,
                                   kvbm_notification_t *notification) {
    FORWARD(kvbmgo_worker_transfer(H(w), src, (uint32_t *)src_ids, dst, (uint32_t *)dst_ids,
                                   num_blocks, (kvbm_transfer_options_t *)options,
                                   (uintptr_t *)notification));
}
kvbm_status_t kvbm_worker_onboard_layerwise(kvbm_worker_t w, const uint32_t *src_ids,
                                            const uint32_t *dst_ids, size_t num_blocks,
                                            const kvbm_event_t *events, size_t num_events,
                                            kvbm_stream_t stream,
                                            kvbm_notification_t *notification) {
    FORWARD(kvbmgo_worker_onboard_layerwise(H(w), (uint32_t *)src_ids, (uint32_t *)dst_ids,
                                            num_blocks, (uintptr_t *)events, num_events,
                                            H(stream), (uintptr_t *)notification));
}
kvbm_status_t kvbm_worker_export_metadata(kvbm_worker_t w, uint8_t *buf, size_t capacity,
                                          size_t *size) {
    FORWARD(kvbmgo_worker_export_metadata(H(w), buf, capacity, size));
}
kvbm_status_t kvbm_worker_export_metadata_scoped(kvbm_worker_t w, uint32_t flags, uint8_t *buf,
                                                 size_t capacity, size_t *size) {
    FORWARD(kvbmgo_worker_export_metadata_scoped(H(w), flags, buf, capacity, size));
}
kvbm_status_t kvbm_worker_export_metadata_blocks(kvbm_worker_t w, const kvbm_block_scope_t *scope,
                                                 uint8_t *buf, size_t capacity, size_t *size) {
    FORWARD(kvbmgo_worker_export_metadata_blocks(H(w), (kvbm_block_scope_t *)scope, buf, capacity, size));
}
kvbm_status_t kvbm_worker_revoke_blocks(kvbm_worker_t w, const kvbm_block_scope_t *blocks) {
    FORWARD(kvbmgo_worker_revoke_blocks(H(w), (kvbm_block_scope_t *)blocks));
}
kvbm_status_t kvbm_worker_import_metadata(kvbm_worker_t w, const uint8_t *metadata, size_t len) {
    FORWARD(kvbmgo_worker_import_metadata(H(w), (uint8_t *)metadata, len));
}
kvbm_status_t kvbm_metadata_worker_id(const uint8_t *metadata, size_t len, uint64_t *worker_id) {
    FORWARD(kvbmgo_metadata_worker_id((uint8_t *)metadata, len, worker_id));
}
kvbm_status_t kvbm_worker_connect_remote(kvbm_worker_t w, uint64_t instance,
                                         const uint8_t *metadata, size_t len) {
    FORWARD(kvbmgo_worker_connect_remote(H(w), instance, (uint8_t *)metadata, len));
}
kvbm_status_t kvbm_worker_disconnect_remote(kvbm_worker_t w, uint64_t instance) {
    FORWARD(kvbmgo_worker_disconnect_remote(H(w), instance));
}
kvbm_status_t kvbm_worker_transfer_from_instance(kvbm_worker_t w, uint64_t instance,
                                                 int32_t src, const uint32_t *src_ids,
                                                 int32_t dst, const uint32_t *dst_ids,
                                                 size_t num_blocks,
                                                 const kvbm_transfer_options_t *options,
                                                 kvbm_notification_t *notification) {
    FORWARD(kvbmgo_worker_transfer_from_instance(H(w), instance, src, (uint32_t *)src_ids, dst,
                                                 (uint32_t *)dst_ids, num_blocks,
                                                 (kvbm_transfer_options_t *)options,
                                                 (uintptr_t *)notification));
}
kvbm_status_t kvbm_worker_transfer_from_remote(kvbm_worker_t w, const kvbm_layout_handle_t *remote,
                                               const uint32_t *src_ids, int32_t dst,
                                               const uint32_t *dst_ids, size_t num_blocks,
                                               const kvbm_transfer_options_t *options,
                                               kvbm_notification_t *notification) {
    FORWARD(kvbmgo_worker_transfer_from_remote(H(w), (kvbm_layout_handle_t *)remote,
                                               (uint32_t *)src_ids, dst, (uint32_t *)dst_ids,
                                               num_blocks, (kvbm_transfer_options_t *)options,
                                               (uintptr_t *)notification));
}
kvbm_status_t kvbm_worker_transfer_to_remote(kvbm_worker_t w, int32_t src, const uint32_t *src_ids,
                                             const kvbm_layout_handle_t *remote,
                                             const uint32_t *dst_ids, size_t num_blocks,
                                             const kvbm_transfer_options_t *options,
                                             kvbm_notification_t *notification) {
    FORWARD(kvbmgo_worker_transfer_to_remote(H(w), src, (uint32_t *)src_ids,
                                             (kvbm_layout_handle_t *)remote, (uint32_t *)dst_ids,
                                             num_blocks, (kvbm_transfer_options_t *)options,
                                             (uintptr_t *)notification));
}
kvbm_status_t kvbm_worker_counters(kvbm_worker_t w, kvbm_counters_t *counters) {
    FORWARD(kvbmgo_worker_counters(H(w), counters));
}
kvbm_status_t kvbm_worker_onboard_objects(kvbm_worker_t w, const uint8_t *const *keys,
                                          const size_t *key_lens, size_t num_keys, int32_t dst,
                                          const uint32_t *dst_ids,
                                          kvbm_notification_t *notification) {
    FORWARD(kvbmgo_worker_onboard_objects(H(w), (uint8_t **)keys, (size_t *)key_lens, num_keys, dst,
                                          (uint32_t *)dst_ids, (uintptr_t *)notification));
}
kvbm_status_t kvbm_worker_offload_objects(kvbm_worker_t w, int32_t src, const uint32_t *src_ids,
                                          const uint8_t *const *keys, const size_t *key_lens,
                                          size_t num_keys, kvbm_notification_t *notification) {
    FORWARD(kvbmgo_worker_offload_objects(H(w), src, (uint32_t *)src_ids, (uint8_t **)keys,
                                          (size_t *)key_lens, num_keys, (uintptr_t *)notification));
}
kvbm_status_t kvbm_worker_cache_enable(kvbm_worker_t w, const kvbm_cache_config_t *config) {
    FORWARD(kvbmgo_worker_cache_enable(H(w), (kvbm_cache_config_t *)config));
}
kvbm_status_t kvbm_worker_cache_match(kvbm_worker_t w, const uint8_t *const *keys,
                                      const size_t *key_lens, size_t num_keys, size_t *matched,
                                      int32_t *tiers) {
    FORWARD(kvbmgo_worker_cache_match(H(w), (uint8_t **)keys, (size_t *)key_lens, num_keys, matched,
                                      tiers));
}
kvbm_status_t kvbm_worker_cache_offload(kvbm_worker_t w, const uint8_t *const *keys,
                                        const size_t *key_lens, size_t num_keys,
                                        const uint32_t *g1_ids, kvbm_event_t precondition,
                                        int32_t *decisions, kvbm_notification_t *notification) {
    FORWARD(kvbmgo_worker_cache_offload(H(w), (uint8_t **)keys, (size_t *)key_lens, num_keys,
                                        (uint32_t *)g1_ids, H(precondition), decisions,
                                        (uintptr_t *)notification));
}
kvbm_status_t kvbm_worker_cache_onboard(kvbm_worker_t w, const uint8_t *const *keys,
                                        const size_t *key_lens, size_t num_keys,
                                        const uint32_t *g1_ids, const kvbm_event_t *layer_events,
                                        size_t num_events, kvbm_stream_t stream,
                                        kvbm_notification_t *notification) {
    FORWARD(kvbmgo_worker_cache_onboard(H(w), (uint8_t **)keys, (size_t *)key_lens, num_keys,
                                        (uint32_t *)g1_ids, (uintptr_t *)layer_events, num_events,
                                        H(stream), (uintptr_t *)notification));
}
kvbm_status_t kvbm_worker_cache_stats(kvbm_worker_t w, kvbm_cache_stats_t *stats) {
    FORWARD(kvbmgo_worker_cache_stats(H(w), stats));
}
kvbm_status_t kvbm_load_plan(const int32_t *tiers, size_t num_blocks,
                             const kvbm_load_plan_input_t *input, size_t *blocks) {
    FORWARD(kvbmgo_load_plan((int32_t *)tiers, num_blocks, (kvbm_load_plan_input_t *)input, blocks));
}
kvbm_status_t kvbm_worker_cache_reset(kvbm_worker_t w, uint64_t *g2_removed, uint64_t *g3_removed) {
    FORWARD(kvbmgo_worker_cache_reset(H(w), g2_removed, g3_removed));
}
kvbm_status_t kvbm_worker_cache_events(kvbm_worker_t w, kvbm_cache_event_t *events,
                                       size_t capacity, size_t *count) {
    FORWARD(kvbmgo_worker_cache_events(H(w), events, capacity, count));
}
kvbm_status_t kvbm_worker_object_has(kvbm_worker_t w, const uint8_t *const *keys,
                                     const size_t *key_lens, size_t num_keys, uint8_t *found) {
    FORWARD(kvbmgo_worker_object_has(H(w), (uint8_t **)keys, (size_t *)key_lens, num_keys, found));
}
kvbm_status_t kvbm_worker_object_put(kvbm_worker_t w, const uint8_t *const *keys,
                                     const size_t *key_lens, size_t num_keys, int32_t tier,
                                     const uint32_t *block_ids, kvbm_status_t *statuses) {
    FORWARD(kvbmgo_worker_object_put(H(w), (uint8_t **)keys, (size_t *)key_lens, num_keys, tier,
                                     (uint32_t *)block_ids, statuses));
}
kvbm_status_t kvbm_worker_object_get(kvbm_worker_t w, const uint8_t *const *keys,
                                     const size_t *key_lens, size_t num_keys, int32_t tier,
                                     const uint32_t *block_ids, kvbm_status_t *statuses) {
    FORWARD(kvbmgo_worker_object_get(H(w), (uint8_t **)keys, (size_t *)key_lens, num_keys, tier,
                                     (uint32_t *)block_ids, statuses));
}

kvbm_status_t kvbm_notification_poll(kvbm_notification_t n) { FORWARD(kvbmgo_notification_poll(H(n))); }
kvbm_status_t kvbm_notification_wait(kvbm_notification_t n, int64_t timeout_ms) {
    FORWARD(kvbmgo_notification_wait(H(n), timeout_ms));
}
kvbm_status_t kvbm_notification_failed_blocks(kvbm_notification_t n, uint32_t *ids,
                                              size_t capacity, size_t *count) {
    FORWARD(kvbmgo_notification_failed_blocks(H(n), ids, capacity, count));
}
kvbm_status_t kvbm_notification_cancel(kvbm_notification_t n) { FORWARD(kvbmgo_notification_cancel(H(n))); }
kvbm_status_t kvbm_notification_free(kvbm_notification_t n) { FORWARD(kvbmgo_notification_free(H(n))); }

kvbm_status_t kvbm_coordinated_create(kvbm_worker_t inner, int32_t rank, uint64_t host_instance,
                                      kvbm_coordinated_t *coordinated) {
    FORWARD(kvbmgo_coordinated_create(H(inner), rank, host_instance, (uintptr_t *)coordinated));
}
kvbm_status_t kvbm_coordinated_destroy(kvbm_coordinated_t c) { FORWARD(kvbmgo_coordinated_destroy(H(c))); }
kvbm_status_t kvbm_coordinated_set_local(kvbm_coordinated_t c, int32_t tier,
                                         const kvbm_layout_handle_t *handle) {
    FORWARD(kvbmgo_coordinated_set_local(H(c), tier, (kvbm_layout_handle_t *)handle));
}
kvbm_status_t kvbm_coordinated_apply_layout_response(kvbm_coordinated_t c, const uint8_t *metadata,
                                                     size_t len) {
    FORWARD(kvbmgo_coordinated_apply_layout_response(H(c), (uint8_t *)metadata, len));
}
kvbm_status_t kvbm_coordinated_import_remote_metadata(kvbm_coordinated_t c, uint64_t leader,
                                                      int32_t rank, const uint8_t *metadata,
                                                      size_t len) {
    FORWARD(kvbmgo_coordinated_import_remote_metadata(H(c), leader, rank, (uint8_t *)metadata, len));
}
kvbm_status_t kvbm_coordinated_resolve_remote_handle(kvbm_coordinated_t c, uint64_t leader,
                                                     int32_t rank, int32_t tier,
                                                     kvbm_layout_handle_t *handle) {
    FORWARD(kvbmgo_coordinated_resolve_remote_handle(H(c), leader, rank, tier, handle));
}
kvbm_status_t kvbm_coordinated_transfer_from_remote(kvbm_coordinated_t c, uint64_t leader,
                                                    int32_t rank, int32_t src,
                                                    const uint32_t *src_ids, int32_t dst,
                                                    const uint32_t *dst_ids, size_t num_blocks,
                                                    const kvbm_transfer_options_t *options,
                                                    kvbm_notification_t *notification) {
    FORWARD(kvbmgo_coordinated_transfer_from_remote(H(c), leader, rank, src, (uint32_t *)src_ids,
                                                    dst, (uint32_t *)dst_ids, num_blocks,
                                                    (kvbm_transfer_options_t *)options,
                                                    (uintptr_t *)notification));
}

kvbm_status_t kvbm_handoff_new(const uint8_t id[16], int32_t order, double fallback_delay_ms,
                               kvbm_handoff_t *handoff) {
    FORWARD(kvbmgo_handoff_new((uint8_t *)id, order, fallback_delay_ms, (uintptr_t *)handoff));
}
kvbm_status_t kvbm_handoff_start(kvbm_handoff_t h, kvbm_handoff_action_t *actions, size_t capacity,
                                 size_t *count) {
    FORWARD(kvbmgo_handoff_start(H(h), actions, capacity, count));
}
kvbm_status_t kvbm_handoff_on_fact(kvbm_handoff_t h, const kvbm_handoff_fact_t *fact,
                                   kvbm_handoff_action_t *actions, size_t capacity, size_t *count) {
    FORWARD(kvbmgo_handoff_on_fact(H(h), (kvbm_handoff_fact_t *)fact, actions, capacity, count));
}
kvbm_status_t kvbm_handoff_on_outcome(kvbm_handoff_t h, uint64_t action_id, int32_t outcome,
                                      const char *message, kvbm_handoff_action_t *actions,
                                      size_t capacity, size_t *count) {
    FORWARD(kvbmgo_handoff_on_outcome(H(h), action_id, outcome, (char *)message, actions, capacity,
                                      count));
}
kvbm_status_t kvbm_handoff_is_complete(kvbm_handoff_t h, int32_t *complete) {
    FORWARD(kvbmgo_handoff_is_complete(H(h), complete));
}
kvbm_status_t kvbm_handoff_completion(kvbm_handoff_t h, int32_t *completion) {
    FORWARD(kvbmgo_handoff_completion(H(h), completion));
}
kvbm_status_t kvbm_handoff_free(kvbm_handoff_t h) { FORWARD(kvbmgo_handoff_free(H(h))); }
