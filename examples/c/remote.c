/* Two workers in one process: B holds KV, A pulls it through B's exported
 * metadata, once through the worker (connect_remote) and once through the
 * leader's view (coordinated worker). Every byte is checked. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "g1.h"

enum { NUM_BLOCKS = 6, NUM_LAYERS = 3, OUTER = 2, PAGE = 8, INNER = 32, WIDTH = 2 };
enum { BLOCK_BYTES = NUM_LAYERS * OUTER * PAGE * INNER * WIDTH };
enum { TOTAL = NUM_BLOCKS * BLOCK_BYTES };

#define INSTANCE_B 0xB0B0u
#define WORKER_A 0xA1u
#define WORKER_B 0xB1u

static uint8_t pattern(size_t off) { return (uint8_t)(off * 13 + (off >> 9) + 5); }

static kvbm_layout_config_t config(void) {
    kvbm_layout_config_t c = KVBM_LAYOUT_CONFIG_INIT;
    c.num_blocks = NUM_BLOCKS;
    c.num_layers = NUM_LAYERS;
    c.outer_dim = OUTER;
    c.page_size = PAGE;
    c.inner_dim = INNER;
    c.dtype_width = WIDTH;
    c.layout_kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
    return c;
}

static kvbm_worker_t make_worker(uint64_t id, uint64_t *g1) {
    kvbm_worker_config_t wc = KVBM_WORKER_CONFIG_INIT;
    wc.worker_id = id;
    kvbm_worker_t w;
    CHECK(kvbm_worker_create(&wc, &w));
    *g1 = g1_alloc(TOTAL);
    uint64_t ptr = *g1;
    kvbm_layout_config_t c = config();
    CHECK(kvbm_worker_register_g1(w, &c, &ptr, 1, NULL));
    CHECK(kvbm_worker_allocate_g2(w, &c, NULL));
    return w;
}

static void wait_ok(kvbm_notification_t n) {
    CHECK(kvbm_notification_wait(n, 10000));
    CHECK(kvbm_notification_free(n));
}

/* G1 is read through a host copy (g1.h). */
static uint8_t host[TOTAL];

static void verify(uint64_t g1, const char *what) {
    g1_get(host, g1, TOTAL);
    for (size_t i = 0; i < TOTAL; i++) {
        if (host[i] != pattern(i)) {
            fprintf(stderr, "%s: byte %zu is %u, want %u\n", what, i, host[i], pattern(i));
            exit(1);
        }
    }
}

/* Exports w's metadata into a new buffer, asking for the size first. */
static uint8_t *export_metadata(kvbm_worker_t w, size_t *len) {
    kvbm_status_t st = kvbm_worker_export_metadata(w, NULL, 0, len);
    EXPECT(st == KVBM_ERR_BUFFER_TOO_SMALL);
    EXPECT(*len > 0);
    uint8_t *buf = malloc(*len);
    size_t got = 0;
    CHECK(kvbm_worker_export_metadata(w, buf, *len, &got));
    EXPECT(got == *len);
    return buf;
}

int main(void) {
    g1_open();
    uint64_t g1a, g1b;
    kvbm_worker_t a = make_worker(WORKER_A, &g1a);
    kvbm_worker_t b = make_worker(WORKER_B, &g1b);

    uint32_t ids[NUM_BLOCKS];
    for (uint32_t i = 0; i < NUM_BLOCKS; i++) ids[i] = i;

    /* B's engine computed KV into G1 and offloaded it to G2. */
    for (size_t i = 0; i < TOTAL; i++) host[i] = pattern(i);
    g1_put(g1b, host, TOTAL);
    kvbm_notification_t n;
    CHECK(kvbm_worker_transfer(b, KVBM_TIER_G1, ids, KVBM_TIER_G2, ids, NUM_BLOCKS, NULL, &n));
    wait_ok(n);

    size_t len_b = 0, len_a = 0;
    uint8_t *md_b = export_metadata(b, &len_b);
    uint8_t *md_a = export_metadata(a, &len_a);
    /* Whose metadata is it? Read through the ABI, never parsed by hand. */
    uint64_t exporter = 0;
    CHECK(kvbm_metadata_worker_id(md_b, len_b, &exporter));
    EXPECT(exporter == WORKER_B);
    CHECK(kvbm_metadata_worker_id(md_a, len_a, &exporter));
    EXPECT(exporter == WORKER_A);

    /* Worker path: connect to B's instance and pull B's G2 into A's G1. */
    CHECK(kvbm_worker_connect_remote(a, INSTANCE_B, md_b, len_b));
    CHECK(kvbm_worker_transfer_from_instance(a, INSTANCE_B, KVBM_TIER_G2, ids, KVBM_TIER_G1, ids,
                                             NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    verify(g1a, "pull G2 of B into G1 of A");

    /* Leader path: a coordinated worker over A. */
    g1_clear(g1a, TOTAL);
    kvbm_coordinated_t c;
    CHECK(kvbm_coordinated_create(a, 0, 0xA0A0u, &c));
    CHECK(kvbm_coordinated_apply_layout_response(c, md_a, len_a));
    CHECK(kvbm_coordinated_import_remote_metadata(c, INSTANCE_B, 0, md_b, len_b));
    kvbm_layout_handle_t remote_g1;
    CHECK(kvbm_coordinated_resolve_remote_handle(c, INSTANCE_B, 0, KVBM_TIER_G1, &remote_g1));
    EXPECT(remote_g1.worker == WORKER_B);
    kvbm_layout_handle_t none;
    EXPECT(kvbm_coordinated_resolve_remote_handle(c, INSTANCE_B, 7, KVBM_TIER_G1, &none) ==
           KVBM_ERR_NOT_FOUND);
    /* A's own G1 is already recorded from the layout response. */
    EXPECT(kvbm_coordinated_set_local(c, KVBM_TIER_G1, &remote_g1) == KVBM_ERR_ALREADY_EXISTS);

    /* Pull B's G1 into A's G2 (blocks reversed), then onboard locally. */
    uint32_t rev[NUM_BLOCKS];
    for (uint32_t i = 0; i < NUM_BLOCKS; i++) rev[i] = NUM_BLOCKS - 1 - i;
    CHECK(kvbm_coordinated_transfer_from_remote(c, INSTANCE_B, 0, KVBM_TIER_G1, ids, KVBM_TIER_G2,
                                                rev, NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    CHECK(kvbm_worker_transfer(a, KVBM_TIER_G2, rev, KVBM_TIER_G1, ids, NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    verify(g1a, "pull G1 of B via the coordinated worker");

    /* By handle: pull B's G1 into A's G1 directly, then push A's G1 (the
     * pattern) into B's G2 reversed and check it through B. */
    g1_clear(g1a, TOTAL);
    CHECK(kvbm_worker_transfer_from_remote(a, &remote_g1, ids, KVBM_TIER_G1, ids, NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    verify(g1a, "pull G1 of B by handle");
    kvbm_layout_handle_t remote_g2;
    CHECK(kvbm_coordinated_resolve_remote_handle(c, INSTANCE_B, 0, KVBM_TIER_G2, &remote_g2));
    CHECK(kvbm_worker_transfer_to_remote(a, KVBM_TIER_G1, ids, &remote_g2, rev, NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    g1_clear(g1b, TOTAL);
    CHECK(kvbm_worker_transfer(b, KVBM_TIER_G2, rev, KVBM_TIER_G1, ids, NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    verify(g1b, "push A's G1 into B's G2 by handle");
    kvbm_layout_handle_t unknown = {WORKER_B, 999};
    EXPECT(kvbm_worker_transfer_from_remote(a, &unknown, ids, KVBM_TIER_G1, ids, NUM_BLOCKS, NULL, &n) ==
           KVBM_ERR_NOT_FOUND);
    EXPECT(kvbm_worker_transfer_to_remote(a, KVBM_TIER_G1, ids, NULL, ids, NUM_BLOCKS, NULL, &n) ==
           KVBM_ERR_INVALID_ARGUMENT);

    /* The counters saw A's device-to-device and host paths. */
    kvbm_counters_t ctr = KVBM_COUNTERS_INIT;
    CHECK(kvbm_worker_counters(a, &ctr));
    EXPECT(ctr.paths[KVBM_PATH_D2D].transfers >= 1);
    EXPECT(ctr.paths[KVBM_PATH_D2D].bytes >= (uint64_t)TOTAL);
    EXPECT(ctr.paths[KVBM_PATH_D2D].failed_blocks == 0);
    EXPECT(ctr.paths[KVBM_PATH_H2D].blocks >= NUM_BLOCKS);
    ctr.struct_size = 8;
    EXPECT(kvbm_worker_counters(a, &ctr) == KVBM_ERR_INVALID_ARGUMENT);

    /* An unknown remote is NOT_FOUND, with a message. */
    EXPECT(kvbm_coordinated_transfer_from_remote(c, 0xDEAD, 0, KVBM_TIER_G1, ids, KVBM_TIER_G2, ids,
                                                 NUM_BLOCKS, NULL, &n) == KVBM_ERR_NOT_FOUND);
    EXPECT(kvbm_last_error()[0] != '\0');

    CHECK(kvbm_coordinated_destroy(c));
    /* B goes away first: A's transfers on B's layouts are refused, never
     * reading freed memory. */
    CHECK(kvbm_worker_destroy(b));
    EXPECT(kvbm_worker_transfer_from_instance(a, INSTANCE_B, KVBM_TIER_G2, ids, KVBM_TIER_G1, ids,
                                              NUM_BLOCKS, NULL, &n) == KVBM_ERR_CANCELED);
    EXPECT(kvbm_last_error()[0] != '\0');
    CHECK(kvbm_worker_destroy(a));
    expect_no_handles();
    free(md_a);
    free(md_b);
    g1_free(g1a);
    g1_free(g1b);
    printf("remote: ok\n");
    return 0;
}
