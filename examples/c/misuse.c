/* Every misuse returns its documented status with a message, and the
 * process survives: NULL pointers, freed, stale, foreign and made-up
 * handles, double frees, wrong lengths, short buffers, bad configs, and use
 * in a child after fork(). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static int checks;

#define EXPECT_STATUS(call, want)                                                             \
    do {                                                                                      \
        kvbm_status_t got_ = (call);                                                          \
        checks++;                                                                             \
        if (got_ != (want)) {                                                                 \
            fprintf(stderr, "%s:%d: %s -> %s, want %s (%s)\n", __FILE__, __LINE__, #call,      \
                    kvbm_status_string(got_), kvbm_status_string(want), kvbm_last_error());   \
            exit(1);                                                                          \
        }                                                                                     \
        if ((want) < 0 && kvbm_last_error()[0] == '\0') {                                     \
            fprintf(stderr, "%s:%d: %s: empty last error\n", __FILE__, __LINE__, #call);       \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static kvbm_layout_config_t config(uint32_t blocks) {
    kvbm_layout_config_t c = KVBM_LAYOUT_CONFIG_INIT;
    c.num_blocks = blocks;
    c.num_layers = 2;
    c.outer_dim = 2;
    c.page_size = 4;
    c.inner_dim = 16;
    c.dtype_width = 2;
    c.layout_kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
    return c;
}

static void statuses(void) {
    EXPECT(strcmp(kvbm_status_string(KVBM_OK), "KVBM_OK") == 0);
    EXPECT(strcmp(kvbm_status_string(KVBM_ERR_INVALID_HANDLE), "KVBM_ERR_INVALID_HANDLE") == 0);
    EXPECT(strcmp(kvbm_status_string(-1000), "KVBM_ERR_UNKNOWN") == 0);
    for (kvbm_status_t s = KVBM_ERR_DEADLINE_EXCEEDED; s <= KVBM_IN_PROGRESS; s++)
        EXPECT(strcmp(kvbm_status_string(s), "KVBM_ERR_UNKNOWN") != 0);
}

static void nulls_and_configs(void) {
    kvbm_worker_t w;
    EXPECT_STATUS(kvbm_worker_create(NULL, &w), KVBM_ERR_INVALID_ARGUMENT);
    kvbm_worker_config_t wc = KVBM_WORKER_CONFIG_INIT;
    EXPECT_STATUS(kvbm_worker_create(&wc, NULL), KVBM_ERR_INVALID_ARGUMENT);
    wc.struct_size = 4;
    EXPECT_STATUS(kvbm_worker_create(&wc, &w), KVBM_ERR_INVALID_ARGUMENT);
    /* Devices that do not exist are refused at create, naming the id and
     * the number of devices. */
    kvbm_info_t info = KVBM_INFO_INIT;
    CHECK(kvbm_info(&info));
    const int32_t absent[] = {7, -1, 1000000, info.device_count};
    for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++) {
        kvbm_worker_config_t dc = KVBM_WORKER_CONFIG_INIT;
        dc.worker_id = 0x5100 + i;
        dc.device_id = absent[i];
        char want[64];
        snprintf(want, sizeof want, "device %d does not exist", (int)absent[i]);
        EXPECT_STATUS(kvbm_worker_create(&dc, &w), KVBM_ERR_INVALID_ARGUMENT);
        EXPECT(strstr(kvbm_last_error(), want) != NULL);
        snprintf(want, sizeof want, "has %d device", (int)info.device_count);
        EXPECT(strstr(kvbm_last_error(), want) != NULL);
    }
    EXPECT_STATUS(kvbm_handle_count(NULL), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_info(NULL), KVBM_ERR_INVALID_ARGUMENT);
    kvbm_info_t zero = {0};
    EXPECT_STATUS(kvbm_info(&zero), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_event_create(0, NULL), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_stream_create(0, NULL), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_event_destroy((kvbm_event_t)(uintptr_t)0x7777777), KVBM_ERR_CUDA);
}

static void handles(void) {
    kvbm_worker_config_t wc = KVBM_WORKER_CONFIG_INIT;
    wc.worker_id = 0x5001;
    kvbm_worker_t w;
    CHECK(kvbm_worker_create(&wc, &w));

    /* Never issued, made up, NULL. */
    EXPECT_STATUS(kvbm_worker_destroy(NULL), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_worker_unregister_g1(NULL, "x"), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_worker_destroy((kvbm_worker_t)(uintptr_t)1), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_worker_destroy((kvbm_worker_t)(uintptr_t)0xdeadbeef), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_notification_poll((kvbm_notification_t)(uintptr_t)-1), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_notification_cancel((kvbm_notification_t)(uintptr_t)-1), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_worker_disconnect_remote((kvbm_worker_t)(uintptr_t)-1, 1), KVBM_ERR_INVALID_HANDLE);
    /* A handle of another kind. */
    EXPECT_STATUS(kvbm_notification_free((kvbm_notification_t)(void *)w), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_handoff_free((kvbm_handoff_t)(void *)w), KVBM_ERR_INVALID_HANDLE);

    /* Wrong lengths and NULL arrays. */
    kvbm_layout_config_t c = config(4);
    CHECK(kvbm_worker_allocate_g2(w, &c, NULL));
    EXPECT_STATUS(kvbm_worker_allocate_g2(w, &c, NULL), KVBM_ERR_ALREADY_EXISTS);
    kvbm_layout_config_t small = c;
    small.struct_size = 8;
    EXPECT_STATUS(kvbm_worker_allocate_g3(w, &small, NULL), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_allocate_g3(w, NULL, NULL), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_allocate_g3(w, &c, NULL), KVBM_ERR_INVALID_ARGUMENT); /* no disk_dir */
    kvbm_layout_config_t bad = c;
    bad.page_size = 3;
    EXPECT_STATUS(kvbm_worker_register_g1(w, &bad, (uint64_t[]){4096}, 1, NULL), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_register_g1(w, &c, NULL, 1, NULL), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_register_g2(w, &c, NULL, 1, NULL), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_register_g2(w, &c, (uint64_t[]){4096}, 1, NULL), KVBM_ERR_ALREADY_EXISTS);

    uint32_t ids[2] = {0, 1}, far[2] = {0, 99}, dup[2] = {1, 1};
    kvbm_notification_t n;
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, NULL, KVBM_TIER_G2, ids, 2, NULL, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G2, ids, 0, NULL, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G2, ids, 2, NULL, NULL),
                  KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_transfer(w, 9, ids, KVBM_TIER_G2, ids, 2, NULL, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    /* 4 (G4, object storage) is not a kvbm_tier_t: the object calls reach it. */
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, 4, (uint32_t[]){2, 3}, 2, NULL, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_transfer(w, 4, ids, KVBM_TIER_G2, (uint32_t[]){2, 3}, 2, NULL, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_transfer(w, 0, ids, KVBM_TIER_G2, (uint32_t[]){2, 3}, 2, NULL, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    /* A block that is both a source and a destination in one layout. */
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G2, (uint32_t[]){1, 2}, 2, NULL, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G1, ids, 2, NULL, &n),
                  KVBM_ERR_NOT_FOUND); /* G1 never registered */
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G2, far, 2, NULL, &n),
                  KVBM_ERR_OUT_OF_RANGE);
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G2, dup, 2, NULL, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    kvbm_transfer_options_t opts = KVBM_TRANSFER_OPTIONS_INIT;
    opts.struct_size = 1;
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G2, ids, 2, &opts, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    /* Head slices: an order that is none, heads beyond the fragment's. */
    kvbm_transfer_options_t heads = KVBM_TRANSFER_OPTIONS_INIT;
    heads.head_count = 1;
    heads.src_heads = heads.dst_heads = 1;
    heads.src_head_order = KVBM_HEADS_OUTER;
    heads.dst_head_order = 7;
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G2, far, 2, &heads, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    heads.dst_head_order = KVBM_TOKENS_OUTER;
    heads.src_head_first = 1;
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G2, far, 2, &heads, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    kvbm_event_t evs[1] = {0};
    EXPECT_STATUS(kvbm_worker_onboard_layerwise(w, ids, ids, 2, evs, 0, NULL, &n),
                  KVBM_ERR_INVALID_ARGUMENT);

    /* Metadata: short buffers, garbage, own metadata. */
    size_t need = 0;
    uint8_t tiny[4];
    EXPECT_STATUS(kvbm_worker_export_metadata(w, tiny, sizeof tiny, &need), KVBM_ERR_BUFFER_TOO_SMALL);
    EXPECT(need > sizeof tiny);
    EXPECT_STATUS(kvbm_worker_export_metadata(w, NULL, 16, &need), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_export_metadata(w, tiny, sizeof tiny, NULL), KVBM_ERR_INVALID_ARGUMENT);
    uint8_t *md = malloc(need);
    size_t len = 0;
    CHECK(kvbm_worker_export_metadata(w, md, need, &len));
    EXPECT_STATUS(kvbm_worker_import_metadata(w, md, len), KVBM_ERR_INVALID_ARGUMENT);
    uint8_t garbage[64];
    memset(garbage, 0xab, sizeof garbage);
    EXPECT_STATUS(kvbm_worker_import_metadata(w, garbage, sizeof garbage), KVBM_ERR_DATA_CORRUPTION);
    EXPECT_STATUS(kvbm_worker_import_metadata(w, md, 0), KVBM_ERR_INVALID_ARGUMENT);
    uint64_t exporter = 0;
    CHECK(kvbm_metadata_worker_id(md, len, &exporter));
    EXPECT(exporter == 0x5001);
    EXPECT_STATUS(kvbm_metadata_worker_id(NULL, len, &exporter), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_metadata_worker_id(md, 0, &exporter), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_metadata_worker_id(md, len, NULL), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_metadata_worker_id(md, len - 1, &exporter), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_metadata_worker_id(garbage, sizeof garbage, &exporter), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_connect_remote(w, 1, md, len - 1), KVBM_ERR_DATA_CORRUPTION);
    EXPECT_STATUS(kvbm_worker_disconnect_remote(w, 1), KVBM_ERR_NOT_FOUND); /* never connected */
    free(md);

    /* Block-scoped metadata: bad scopes refused, a good one exported. */
    int32_t scope_tiers[] = {KVBM_TIER_G2, KVBM_TIER_G2};
    uint32_t scope_ids[] = {1, 0};
    kvbm_block_scope_t scope = KVBM_BLOCK_SCOPE_INIT;
    scope.tiers = scope_tiers;
    scope.block_ids = scope_ids;
    scope.num_blocks = 2;
    scope.expires_ms = 60000;
    EXPECT_STATUS(kvbm_worker_export_metadata_blocks(w, NULL, NULL, 0, &need), KVBM_ERR_INVALID_ARGUMENT);
    kvbm_block_scope_t short_scope = scope;
    short_scope.struct_size = sizeof(size_t);
    EXPECT_STATUS(kvbm_worker_export_metadata_blocks(w, &short_scope, NULL, 0, &need), KVBM_ERR_INVALID_ARGUMENT);
    kvbm_block_scope_t none = scope;
    none.num_blocks = 0;
    EXPECT_STATUS(kvbm_worker_export_metadata_blocks(w, &none, NULL, 0, &need), KVBM_ERR_INVALID_ARGUMENT);
    kvbm_block_scope_t badtier = scope;
    badtier.tiers = (int32_t[]){4, KVBM_TIER_G2};
    EXPECT_STATUS(kvbm_worker_export_metadata_blocks(w, &badtier, NULL, 0, &need), KVBM_ERR_INVALID_ARGUMENT);
    kvbm_block_scope_t far_scope = scope;
    far_scope.block_ids = (uint32_t[]){1, 1u << 30};
    EXPECT_STATUS(kvbm_worker_export_metadata_blocks(w, &far_scope, NULL, 0, &need), KVBM_ERR_OUT_OF_RANGE);
    EXPECT_STATUS(kvbm_worker_export_metadata_blocks(w, &scope, NULL, 0, &need), KVBM_ERR_BUFFER_TOO_SMALL);
    md = malloc(need);
    CHECK(kvbm_worker_export_metadata_blocks(w, &scope, md, need, &len));
    CHECK(kvbm_metadata_worker_id(md, len, &exporter));
    EXPECT(exporter == 0x5001);
    free(md);
    /* Revoking it: the same checks, nothing revoked by a refused call. */
    EXPECT_STATUS(kvbm_worker_revoke_blocks(w, NULL), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_revoke_blocks(w, &short_scope), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_revoke_blocks(w, &none), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_revoke_blocks(w, &badtier), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_revoke_blocks(w, &far_scope), KVBM_ERR_OUT_OF_RANGE);
    EXPECT_STATUS(kvbm_worker_revoke_blocks(NULL, &scope), KVBM_ERR_INVALID_HANDLE);
    CHECK(kvbm_worker_revoke_blocks(w, &scope));

    /* Object store: none configured; bad keys. */
    const uint8_t key[] = "block-0";
    const uint8_t *keys[1] = {key};
    size_t key_lens[1] = {sizeof key - 1};
    uint8_t found[1] = {9};
    CHECK(kvbm_worker_object_has(w, keys, key_lens, 1, found));
    EXPECT(found[0] == 0);
    kvbm_status_t per_block[1];
    EXPECT_STATUS(kvbm_worker_object_put(w, keys, key_lens, 1, KVBM_TIER_G2, ids, per_block),
                  KVBM_ERR_UNSUPPORTED);
    EXPECT(per_block[0] == KVBM_ERR_UNSUPPORTED);
    EXPECT_STATUS(kvbm_worker_object_put(w, keys, key_lens, 1, 4, ids, per_block),
                  KVBM_ERR_INVALID_ARGUMENT);
    size_t too_long[1] = {KVBM_MAX_KEY_LEN + 1};
    EXPECT_STATUS(kvbm_worker_object_has(w, keys, too_long, 1, found), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_offload_objects(w, KVBM_TIER_G2, ids, keys, key_lens, 1, &n),
                  KVBM_ERR_UNSUPPORTED);
    EXPECT_STATUS(kvbm_worker_onboard_objects(w, keys, key_lens, 1, KVBM_TIER_G2, ids, NULL),
                  KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_onboard_objects(w, NULL, key_lens, 1, KVBM_TIER_G2, ids, &n),
                  KVBM_ERR_INVALID_ARGUMENT);

    /* Remote transfers by handle: NULL, unknown, own-worker id out of range. */
    kvbm_layout_handle_t nobody = {0x9999, 1};
    EXPECT_STATUS(kvbm_worker_transfer_from_remote(w, NULL, ids, KVBM_TIER_G2, ids, 2, NULL, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_worker_transfer_from_remote(w, &nobody, ids, KVBM_TIER_G2, ids, 2, NULL, &n),
                  KVBM_ERR_NOT_FOUND);
    kvbm_layout_handle_t wide = {0x9999, 1u << 20};
    EXPECT_STATUS(kvbm_worker_transfer_to_remote(w, KVBM_TIER_G2, ids, &wide, ids, 2, NULL, &n),
                  KVBM_ERR_OUT_OF_RANGE);
    EXPECT_STATUS(kvbm_worker_counters(w, NULL), KVBM_ERR_INVALID_ARGUMENT);

    /* Notifications: short buffer, double free, use after free. */
    CHECK(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G2, (uint32_t[]){2, 3}, 2, NULL, &n));
    CHECK(kvbm_notification_wait(n, -1));
    size_t count = 99;
    EXPECT_STATUS(kvbm_notification_failed_blocks(n, NULL, 0, NULL), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_notification_failed_blocks(n, NULL, 4, &count), KVBM_ERR_INVALID_ARGUMENT);
    CHECK(kvbm_notification_failed_blocks(n, NULL, 0, &count));
    EXPECT(count == 0);
    CHECK(kvbm_notification_free(n));
    EXPECT_STATUS(kvbm_notification_free(n), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_notification_poll(n), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_notification_wait(n, 0), KVBM_ERR_INVALID_HANDLE);

    /* Coordinated worker over a worker, then the worker freed first. */
    kvbm_coordinated_t cw;
    EXPECT_STATUS(kvbm_coordinated_create(w, 0, 1, NULL), KVBM_ERR_INVALID_ARGUMENT);
    CHECK(kvbm_coordinated_create(w, 0, 1, &cw));
    EXPECT_STATUS(kvbm_coordinated_set_local(cw, KVBM_TIER_G2, NULL), KVBM_ERR_INVALID_ARGUMENT);
    kvbm_layout_handle_t resolved;
    EXPECT_STATUS(kvbm_coordinated_resolve_remote_handle(cw, 1, 0, 4, &resolved),
                  KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_coordinated_apply_layout_response(cw, garbage, sizeof garbage),
                  KVBM_ERR_DATA_CORRUPTION);

    /* Freed worker: every call on it, and a second destroy. */
    CHECK(kvbm_worker_destroy(w));
    EXPECT_STATUS(kvbm_worker_destroy(w), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_worker_allocate_g2(w, &c, NULL), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G2, ids, 2, NULL, &n),
                  KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_coordinated_create(w, 0, 1, &cw), KVBM_ERR_INVALID_HANDLE);
    kvbm_counters_t ctr = KVBM_COUNTERS_INIT;
    EXPECT_STATUS(kvbm_worker_counters(w, &ctr), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_worker_onboard_objects(w, keys, key_lens, 1, KVBM_TIER_G2, ids, &n),
                  KVBM_ERR_INVALID_HANDLE);
    /* A stale handle stays invalid after its slot is reused. */
    kvbm_worker_t w2;
    wc.worker_id = 0x5002;
    CHECK(kvbm_worker_create(&wc, &w2));
    EXPECT(w2 != w);
    EXPECT_STATUS(kvbm_worker_destroy(w), KVBM_ERR_INVALID_HANDLE);
    /* The same worker id twice in one process. */
    kvbm_worker_t w3;
    EXPECT_STATUS(kvbm_worker_create(&wc, &w3), KVBM_ERR_ALREADY_EXISTS);
    CHECK(kvbm_worker_destroy(w2));

    CHECK(kvbm_coordinated_destroy(cw));
    EXPECT_STATUS(kvbm_coordinated_destroy(cw), KVBM_ERR_INVALID_HANDLE);
}

static void handoff(void) {
    uint8_t id[16] = {1, 2, 3};
    kvbm_handoff_t h;
    EXPECT_STATUS(kvbm_handoff_new(NULL, KVBM_HANDOFF_SOURCE_FIRST, 0, &h), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_handoff_new(id, 7, 0, &h), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_handoff_new(id, KVBM_HANDOFF_SOURCE_FIRST, -1, &h), KVBM_ERR_INVALID_ARGUMENT);
    CHECK(kvbm_handoff_new(id, KVBM_HANDOFF_SOURCE_FIRST, 0, &h));

    kvbm_handoff_action_t acts[KVBM_HANDOFF_MAX_ACTIONS];
    size_t n = 99;
    EXPECT_STATUS(kvbm_handoff_start(h, acts, 1, &n), KVBM_ERR_BUFFER_TOO_SMALL);
    EXPECT(n == 0);
    EXPECT_STATUS(kvbm_handoff_start(h, NULL, 2, &n), KVBM_ERR_INVALID_ARGUMENT);
    CHECK(kvbm_handoff_start(h, acts, KVBM_HANDOFF_MAX_ACTIONS, &n));
    EXPECT(n == 1 && acts[0].kind == KVBM_ACTION_SUBMIT_PREFILL);

    kvbm_handoff_fact_t f = KVBM_HANDOFF_FACT_INIT;
    f.kind = KVBM_FACT_SOURCE_HELD;
    EXPECT_STATUS(kvbm_handoff_on_fact(h, &f, acts, 2, &n), KVBM_ERR_INVALID_ARGUMENT); /* other id */
    memcpy(f.handoff_id, id, 16);
    EXPECT_STATUS(kvbm_handoff_on_fact(h, &f, acts, 2, &n), KVBM_ERR_FAILED_PRECONDITION); /* not submitted */
    f.kind = 77;
    EXPECT_STATUS(kvbm_handoff_on_fact(h, &f, acts, 2, &n), KVBM_ERR_INVALID_ARGUMENT);
    f.struct_size = 0;
    EXPECT_STATUS(kvbm_handoff_on_fact(h, &f, acts, 2, &n), KVBM_ERR_INVALID_ARGUMENT);
    EXPECT_STATUS(kvbm_handoff_on_fact(h, NULL, acts, 2, &n), KVBM_ERR_INVALID_ARGUMENT);

    EXPECT_STATUS(kvbm_handoff_on_outcome(h, 42, KVBM_OUTCOME_SUBMITTED, NULL, acts, 2, &n),
                  KVBM_ERR_NOT_FOUND);
    EXPECT_STATUS(kvbm_handoff_on_outcome(h, acts[0].id, KVBM_OUTCOME_APPLIED, NULL, acts, 2, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    uint64_t submit = acts[0].id;
    CHECK(kvbm_handoff_on_outcome(h, submit, KVBM_OUTCOME_SUBMITTED, NULL, acts, 2, &n));
    CHECK(kvbm_handoff_on_outcome(h, submit, KVBM_OUTCOME_SUBMITTED, NULL, acts, 2, &n));
    EXPECT(n == 0);
    EXPECT_STATUS(kvbm_handoff_on_outcome(h, submit, KVBM_OUTCOME_FAILED, "late", acts, 2, &n),
                  KVBM_ERR_ALREADY_EXISTS);
    int32_t complete;
    EXPECT_STATUS(kvbm_handoff_is_complete(h, NULL), KVBM_ERR_INVALID_ARGUMENT);
    CHECK(kvbm_handoff_is_complete(h, &complete));
    EXPECT(complete == 0);
    CHECK(kvbm_handoff_free(h));
    EXPECT_STATUS(kvbm_handoff_free(h), KVBM_ERR_INVALID_HANDLE);
    EXPECT_STATUS(kvbm_handoff_start(h, acts, 2, &n), KVBM_ERR_INVALID_HANDLE);
}

/* Object calls with an object store: bad requests are refused before
 * anything starts, blocking or in the background, with the statuses of
 * kvbm_worker_transfer; a corrupt object is "not found" for has, not an
 * error of the whole call. */
static void objects(void) {
    char dir[] = "/tmp/kvbm-misuse-XXXXXX";
    EXPECT(mkdtemp(dir) != NULL);
    kvbm_worker_config_t wc = KVBM_WORKER_CONFIG_INIT;
    wc.worker_id = 0x5003;
    wc.object_dir = dir;
    kvbm_worker_t w;
    CHECK(kvbm_worker_create(&wc, &w));
    kvbm_layout_config_t c = config(16);
    CHECK(kvbm_worker_allocate_g2(w, &c, NULL));

    const uint8_t *keys[3] = {(const uint8_t *)"obj-0", (const uint8_t *)"obj-1",
                              (const uint8_t *)"obj-2"};
    size_t key_lens[3] = {5, 5, 5};
    uint32_t ids[3] = {0, 1, 2}, beyond[3] = {0, 1, 16}, twice[2] = {13, 13};
    kvbm_status_t per_block[3] = {0, 0, 0};
    CHECK(kvbm_worker_object_put(w, keys, key_lens, 3, KVBM_TIER_G2, ids, per_block));

    /* Ids beyond the 16-block layout, repeated destinations. */
    kvbm_notification_t n = NULL;
    EXPECT_STATUS(kvbm_worker_onboard_objects(w, keys, key_lens, 3, KVBM_TIER_G2, beyond, &n),
                  KVBM_ERR_OUT_OF_RANGE);
    EXPECT(strstr(kvbm_last_error(), "16") != NULL);
    EXPECT_STATUS(kvbm_worker_offload_objects(w, KVBM_TIER_G2, beyond, keys, key_lens, 3, &n),
                  KVBM_ERR_OUT_OF_RANGE);
    EXPECT_STATUS(kvbm_worker_onboard_objects(w, keys, key_lens, 2, KVBM_TIER_G2, twice, &n),
                  KVBM_ERR_INVALID_ARGUMENT);
    EXPECT(strstr(kvbm_last_error(), "13") != NULL);
    EXPECT_STATUS(kvbm_worker_object_put(w, keys, key_lens, 3, KVBM_TIER_G2, beyond, per_block),
                  KVBM_ERR_OUT_OF_RANGE);
    EXPECT(per_block[2] == KVBM_ERR_OUT_OF_RANGE);
    EXPECT_STATUS(kvbm_worker_object_get(w, keys, key_lens, 3, KVBM_TIER_G2, beyond, per_block),
                  KVBM_ERR_OUT_OF_RANGE);
    EXPECT_STATUS(kvbm_worker_object_get(w, keys, key_lens, 2, KVBM_TIER_G2, twice, NULL),
                  KVBM_ERR_INVALID_ARGUMENT);
    EXPECT(n == NULL);

    /* Truncate obj-1's file (rank 0's directory, the key in hex). */
    char path[sizeof dir + 32];
    snprintf(path, sizeof path, "%s/0/%s", dir, "6f626a2d31");
    EXPECT(truncate(path, 10) == 0);
    uint8_t found[3] = {9, 9, 9};
    CHECK(kvbm_worker_object_has(w, keys, key_lens, 3, found));
    checks++;
    EXPECT(found[0] == 1 && found[1] == 0 && found[2] == 1);
    EXPECT(strstr(kvbm_last_error(), "index 1") != NULL);
    CHECK(kvbm_worker_object_has(w, keys, key_lens, 1, found));
    EXPECT(found[0] == 1 && kvbm_last_error()[0] == '\0');
    EXPECT_STATUS(kvbm_worker_object_get(w, keys, key_lens, 3, KVBM_TIER_G2, ids, per_block),
                  KVBM_ERR_DATA_CORRUPTION);
    EXPECT(per_block[0] == KVBM_OK && per_block[1] == KVBM_ERR_DATA_CORRUPTION &&
           per_block[2] == KVBM_OK);

    CHECK(kvbm_worker_destroy(w));
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/0/6f626a2d3%d", dir, i);
        EXPECT(unlink(path) == 0);
    }
    snprintf(path, sizeof path, "%s/0", dir);
    EXPECT(rmdir(path) == 0);
    EXPECT(rmdir(dir) == 0);
}

/* A child after fork() is refused with a message, without hanging. */
static void after_fork(void) {
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) {
        size_t count;
        kvbm_status_t st = kvbm_handle_count(&count);
        int ok = st == KVBM_ERR_FAILED_PRECONDITION && strstr(kvbm_last_error(), "fork") != NULL &&
                 kvbm_version() == KVBM_VERSION_CODE(KVBM_VERSION_MAJOR, KVBM_VERSION_MINOR,
                                                     KVBM_VERSION_PATCH);
        kvbm_worker_config_t wc = KVBM_WORKER_CONFIG_INIT;
        kvbm_worker_t w;
        ok = ok && kvbm_worker_create(&wc, &w) == KVBM_ERR_FAILED_PRECONDITION;
        if (!ok) fprintf(stderr, "child: %s: %s\n", kvbm_status_string(st), kvbm_last_error());
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The parent is unaffected. */
    size_t count = 99;
    CHECK(kvbm_handle_count(&count));
    checks++;
}

/* Each thread sees its own last error, while other threads fail too. */
static void *thread_errors(void *arg) {
    int which = (int)(intptr_t)arg;
    for (int i = 0; i < 2000; i++) {
        kvbm_status_t st = which ? kvbm_handoff_free(NULL) : kvbm_worker_destroy(NULL);
        const char *want = which ? "handoff handle" : "worker handle";
        if (st != KVBM_ERR_INVALID_HANDLE || strstr(kvbm_last_error(), want) == NULL) {
            fprintf(stderr, "thread %d: %s: %s\n", which, kvbm_status_string(st), kvbm_last_error());
            return (void *)1;
        }
    }
    return NULL;
}

static void threads(void) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) EXPECT(pthread_create(&t[i], NULL, thread_errors, (void *)(intptr_t)(i % 2)) == 0);
    for (int i = 0; i < 4; i++) {
        void *ret = (void *)1;
        EXPECT(pthread_join(t[i], &ret) == 0);
        EXPECT(ret == NULL);
    }
    checks++;
}

int main(void) {
    statuses();
    threads();
    nulls_and_configs();
    handles();
    handoff();
    objects();
    after_fork();
    expect_no_handles();
    printf("misuse: ok (%d checks)\n", checks);
    return 0;
}
