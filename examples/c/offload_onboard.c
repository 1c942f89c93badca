/* Offload and onboard through every local tier, checking every byte.
 *
 * G1 is memory this program allocates and registers (g1.h: host memory the
 * emulated device adopts, or device memory from CUDA's driver under the
 * cuda backend); the program fills and checks host copies of its layers. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "g1.h"

enum { NUM_BLOCKS = 8, NUM_LAYERS = 4, OUTER = 2, PAGE = 4, INNER = 64, WIDTH = 2 };
enum { LAYER_BYTES = NUM_BLOCKS * OUTER * PAGE * INNER * WIDTH };

static uint8_t pattern(int layer, size_t off) { return (uint8_t)(layer * 31 + off * 7 + (off >> 8)); }

/* G1's layers, and the host copies they are filled from and checked in. */
static uint64_t g1_layers[NUM_LAYERS];

static void fill(uint8_t *layers[NUM_LAYERS]) {
    for (int l = 0; l < NUM_LAYERS; l++) {
        for (size_t i = 0; i < LAYER_BYTES; i++) layers[l][i] = pattern(l, i);
        g1_put(g1_layers[l], layers[l], LAYER_BYTES);
    }
}

static void verify_layer(uint8_t *layers[NUM_LAYERS], int l, const char *what) {
    g1_get(layers[l], g1_layers[l], LAYER_BYTES);
    for (size_t i = 0; i < LAYER_BYTES; i++) {
        if (layers[l][i] != pattern(l, i)) {
            fprintf(stderr, "%s: layer %d byte %zu is %u, want %u\n", what, l, i, layers[l][i],
                    pattern(l, i));
            exit(1);
        }
    }
}

static void clear(uint8_t *layers[NUM_LAYERS]) {
    for (int l = 0; l < NUM_LAYERS; l++) {
        memset(layers[l], 0, LAYER_BYTES);
        g1_put(g1_layers[l], layers[l], LAYER_BYTES);
    }
}

static void wait_ok(kvbm_notification_t n) {
    CHECK(kvbm_notification_wait(n, 10000));
    EXPECT(kvbm_notification_poll(n) == KVBM_OK);
    size_t failed = 99;
    CHECK(kvbm_notification_failed_blocks(n, NULL, 0, &failed));
    EXPECT(failed == 0);
    CHECK(kvbm_notification_free(n));
}

int main(void) {
    kvbm_info_t info = KVBM_INFO_INIT;
    CHECK(kvbm_info(&info));
    g1_open();
    printf("kvbm %u (ABI %u), device backend %s with %d device(s)\n", kvbm_version(),
           info.abi_version, info.device_backend, info.device_count);
    EXPECT(kvbm_version() == KVBM_VERSION_CODE(KVBM_VERSION_MAJOR, KVBM_VERSION_MINOR,
                                               KVBM_VERSION_PATCH));
    EXPECT(info.abi_version == KVBM_ABI_VERSION);

    char dir[] = "/tmp/kvbm-offload-XXXXXX";
    EXPECT(mkdtemp(dir) != NULL);

    kvbm_worker_config_t wc = KVBM_WORKER_CONFIG_INIT;
    wc.worker_id = 0x1001;
    wc.disk_dir = dir;
    char objects[64];
    snprintf(objects, sizeof objects, "%s/objects", dir);
    wc.object_dir = objects;
    kvbm_worker_t w;
    CHECK(kvbm_worker_create(&wc, &w));

    uint8_t *layers[NUM_LAYERS];
    uint64_t *ptrs = g1_layers;
    for (int l = 0; l < NUM_LAYERS; l++) {
        EXPECT((layers[l] = malloc(LAYER_BYTES)) != NULL);
        ptrs[l] = g1_alloc(LAYER_BYTES);
    }

    kvbm_layout_config_t g1 = KVBM_LAYOUT_CONFIG_INIT;
    g1.num_blocks = NUM_BLOCKS;
    g1.num_layers = NUM_LAYERS;
    g1.outer_dim = OUTER;
    g1.page_size = PAGE;
    g1.inner_dim = INNER;
    g1.dtype_width = WIDTH;
    g1.layout_kind = KVBM_LAYOUT_LAYER_SEPARATE;
    g1.block_dim = KVBM_BLOCK_DIM_FIRST;
    kvbm_layout_handle_t h1;
    CHECK(kvbm_worker_register_g1(w, &g1, ptrs, NUM_LAYERS, &h1));
    EXPECT(h1.worker == 0x1001);

    kvbm_layout_config_t host = g1;
    host.layout_kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
    CHECK(kvbm_worker_allocate_g2(w, &host, NULL));
    CHECK(kvbm_worker_allocate_g3(w, &host, NULL));

    uint32_t ids[NUM_BLOCKS];
    for (uint32_t i = 0; i < NUM_BLOCKS; i++) ids[i] = i;

    /* The engine's compute: it wrote G1 and recorded an event on its stream.
     * Offload after that event. */
    fill(layers);
    kvbm_stream_t compute;
    kvbm_event_t computed;
    CHECK(kvbm_stream_create(0, &compute));
    CHECK(kvbm_event_create(0, &computed));
    CHECK(kvbm_event_record(computed, compute));

    kvbm_transfer_options_t opts = KVBM_TRANSFER_OPTIONS_INIT;
    opts.precondition = computed;
    kvbm_notification_t n;
    CHECK(kvbm_worker_transfer(w, KVBM_TIER_G1, ids, KVBM_TIER_G2, ids, NUM_BLOCKS, &opts, &n));
    wait_ok(n);
    CHECK(kvbm_worker_transfer(w, KVBM_TIER_G1, ids, KVBM_TIER_G3, ids, NUM_BLOCKS, &opts, &n));
    wait_ok(n);

    /* Onboard G2 -> G1 layer by layer, each layer's event recorded after
     * its copies; check each layer as soon as its event completes. */
    clear(layers);
    kvbm_event_t layer_done[NUM_LAYERS];
    for (int l = 0; l < NUM_LAYERS; l++) CHECK(kvbm_event_create(0, &layer_done[l]));
    CHECK(kvbm_worker_onboard_layerwise(w, ids, ids, NUM_BLOCKS, layer_done, NUM_LAYERS, NULL, &n));
    for (int l = 0; l < NUM_LAYERS; l++) {
        CHECK(kvbm_stream_wait_event(compute, layer_done[l]));
        CHECK(kvbm_event_synchronize(layer_done[l]));
        EXPECT(kvbm_event_query(layer_done[l]) == KVBM_OK);
        verify_layer(layers, l, "layer-wise onboard from G2");
    }
    wait_ok(n);
    CHECK(kvbm_stream_synchronize(compute));

    /* Onboard G3 -> G1 (disk to device through a bounce buffer), in two
     * layer ranges. */
    clear(layers);
    opts.precondition = NULL;
    opts.layer_start = 0;
    opts.layer_end = 2;
    CHECK(kvbm_worker_transfer(w, KVBM_TIER_G3, ids, KVBM_TIER_G1, ids, NUM_BLOCKS, &opts, &n));
    wait_ok(n);
    opts.layer_start = 2;
    opts.layer_end = NUM_LAYERS;
    CHECK(kvbm_worker_transfer(w, KVBM_TIER_G3, ids, KVBM_TIER_G1, ids, NUM_BLOCKS, &opts, &n));
    wait_ok(n);
    for (int l = 0; l < NUM_LAYERS; l++) verify_layer(layers, l, "onboard from G3");

    /* G3 -> G2 -> G1 with blocks reversed and back. */
    uint32_t rev[NUM_BLOCKS];
    for (uint32_t i = 0; i < NUM_BLOCKS; i++) rev[i] = NUM_BLOCKS - 1 - i;
    CHECK(kvbm_worker_transfer(w, KVBM_TIER_G3, ids, KVBM_TIER_G2, rev, NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    clear(layers);
    CHECK(kvbm_worker_transfer(w, KVBM_TIER_G2, rev, KVBM_TIER_G1, ids, NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    for (int l = 0; l < NUM_LAYERS; l++) verify_layer(layers, l, "G3 -> G2 -> G1");

    /* G4: store G1's blocks as objects, clear G1, load them back. */
    uint8_t keybuf[NUM_BLOCKS][8];
    const uint8_t *keys[NUM_BLOCKS];
    size_t key_lens[NUM_BLOCKS];
    uint8_t found[NUM_BLOCKS];
    kvbm_status_t per_block[NUM_BLOCKS];
    for (int i = 0; i < NUM_BLOCKS; i++) {
        memcpy(keybuf[i], "hash-00", 7);
        keybuf[i][7] = (uint8_t)('0' + i);
        keys[i] = keybuf[i];
        key_lens[i] = 8;
    }
    CHECK(kvbm_worker_object_has(w, keys, key_lens, NUM_BLOCKS, found));
    for (int i = 0; i < NUM_BLOCKS; i++) EXPECT(found[i] == 0);
    CHECK(kvbm_worker_object_put(w, keys, key_lens, NUM_BLOCKS, KVBM_TIER_G1, ids, per_block));
    CHECK(kvbm_worker_object_has(w, keys, key_lens, NUM_BLOCKS, found));
    for (int i = 0; i < NUM_BLOCKS; i++) EXPECT(found[i] == 1 && per_block[i] == KVBM_OK);
    clear(layers);
    CHECK(kvbm_worker_object_get(w, keys, key_lens, NUM_BLOCKS, KVBM_TIER_G1, ids, per_block));
    for (int l = 0; l < NUM_LAYERS; l++) verify_layer(layers, l, "G1 -> G4 -> G1");

    /* The same in the background, with notifications: G1 -> G4 under new
     * keys, then back; a missing object fails only its own block. */
    for (int i = 0; i < NUM_BLOCKS; i++) keybuf[i][0] = 'H';
    CHECK(kvbm_worker_offload_objects(w, KVBM_TIER_G1, ids, keys, key_lens, NUM_BLOCKS, &n));
    wait_ok(n);
    clear(layers);
    CHECK(kvbm_worker_onboard_objects(w, keys, key_lens, NUM_BLOCKS, KVBM_TIER_G1, ids, &n));
    wait_ok(n);
    for (int l = 0; l < NUM_LAYERS; l++) verify_layer(layers, l, "G1 -> G4 -> G1 (async)");
    keybuf[1][0] = 'X'; /* never stored */
    CHECK(kvbm_worker_onboard_objects(w, keys, key_lens, NUM_BLOCKS, KVBM_TIER_G1, ids, &n));
    EXPECT(kvbm_notification_wait(n, 10000) == KVBM_ERR_NOT_FOUND);
    uint32_t failed[NUM_BLOCKS];
    size_t nfailed = 0;
    CHECK(kvbm_notification_failed_blocks(n, failed, NUM_BLOCKS, &nfailed));
    EXPECT(nfailed == 1 && failed[0] == ids[1]);
    CHECK(kvbm_notification_free(n));

    /* Sleep mode: the engine takes G1's memory back and frees it; every
     * transfer on G1 is refused, saying why; G1 comes back on new memory
     * and G2's blocks load into it. */
    CHECK(kvbm_worker_transfer(w, KVBM_TIER_G1, ids, KVBM_TIER_G2, ids, NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    CHECK(kvbm_worker_unregister_g1(w, "sleep mode"));
    EXPECT(kvbm_worker_unregister_g1(w, NULL) == KVBM_ERR_NOT_FOUND);
    for (int l = 0; l < NUM_LAYERS; l++) g1_free(ptrs[l]);
    EXPECT(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G1, ids, NUM_BLOCKS, NULL, &n) ==
           KVBM_ERR_FAILED_PRECONDITION);
    EXPECT(strstr(kvbm_last_error(), "G1 was unregistered (sleep mode)") != NULL);
    for (int l = 0; l < NUM_LAYERS; l++) ptrs[l] = g1_alloc(LAYER_BYTES);
    clear(layers);
    kvbm_layout_config_t other = g1;
    other.num_blocks = NUM_BLOCKS / 2;
    EXPECT(kvbm_worker_register_g1(w, &other, ptrs, NUM_LAYERS, NULL) == KVBM_ERR_INVALID_ARGUMENT);
    kvbm_layout_handle_t back;
    CHECK(kvbm_worker_register_g1(w, &g1, ptrs, NUM_LAYERS, &back));
    EXPECT(back.layout != h1.layout);
    CHECK(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G1, ids, NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    for (int l = 0; l < NUM_LAYERS; l++) verify_layer(layers, l, "G2 -> G1 after sleep");

    for (int l = 0; l < NUM_LAYERS; l++) CHECK(kvbm_event_destroy(layer_done[l]));
    CHECK(kvbm_event_destroy(computed));
    CHECK(kvbm_stream_destroy(compute));
    CHECK(kvbm_worker_destroy(w));
    expect_no_handles();
    for (int l = 0; l < NUM_LAYERS; l++) {
        g1_free(ptrs[l]);
        free(layers[l]);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    printf("offload_onboard: ok\n");
    return 0;
}
