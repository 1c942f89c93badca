/* The prefix cache: request A computes a prompt and offloads its blocks by
 * key; other work evicts part of it from G2 to G3; request B, sharing A's
 * prefix, matches it, onboards it layer by layer, and finds A's bytes.
 * Every byte is checked, and so are the events a KV-aware router reads.
 *
 * G1 is memory registered as the engine's KV cache (g1.h: host memory the
 * emulated device adopts, or device memory from CUDA's driver under the
 * cuda backend); the program writes and checks it through host copies. */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "g1.h"

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

enum { G1_BLOCKS = 16, G2_BLOCKS = 8, G3_BLOCKS = 16 };
enum { NUM_LAYERS = 4, OUTER = 2, PAGE = 4, INNER = 64, WIDTH = 2 };
enum { BLOCK_LAYER_BYTES = OUTER * PAGE * INNER * WIDTH }; /* one block of one layer */

static uint8_t *layers[NUM_LAYERS]; /* host copies, block-first: [block][outer][page][inner] */
static uint64_t g1_layers[NUM_LAYERS]; /* G1 itself */

static uint8_t pattern(int key, int layer, size_t off) {
    return (uint8_t)(key * 13 + layer * 31 + off * 7 + (off >> 8));
}

/* The forward pass: G1 block id now holds the KV of key. */
static void compute(uint32_t id, int key) {
    for (int l = 0; l < NUM_LAYERS; l++) {
        for (size_t i = 0; i < BLOCK_LAYER_BYTES; i++)
            layers[l][id * BLOCK_LAYER_BYTES + i] = pattern(key, l, i);
        g1_put(g1_layers[l] + id * BLOCK_LAYER_BYTES, &layers[l][id * BLOCK_LAYER_BYTES],
               BLOCK_LAYER_BYTES);
    }
}

/* clear_g1 zeroes every block of G1. */
static void clear_g1(void) {
    for (int l = 0; l < NUM_LAYERS; l++) {
        memset(layers[l], 0, G1_BLOCKS * BLOCK_LAYER_BYTES);
        g1_put(g1_layers[l], layers[l], G1_BLOCKS * BLOCK_LAYER_BYTES);
    }
}

static void verify(uint32_t id, int key, int layer) {
    g1_get(&layers[layer][id * BLOCK_LAYER_BYTES], g1_layers[layer] + id * BLOCK_LAYER_BYTES,
           BLOCK_LAYER_BYTES);
    for (size_t i = 0; i < BLOCK_LAYER_BYTES; i++) {
        uint8_t got = layers[layer][id * BLOCK_LAYER_BYTES + i];
        if (got != pattern(key, layer, i)) {
            fprintf(stderr, "G1 block %u layer %d byte %zu is %u, want %u (key %d)\n", id, layer, i, got,
                    pattern(key, layer, i), key);
            exit(1);
        }
    }
}

/* Keys: 32 bytes, as vLLM's SHA-256 block hashes. */
static uint8_t key_bytes[64][32];
static const uint8_t *keys[64];
static size_t key_lens[64];

static void make_keys(void) {
    for (int k = 0; k < 64; k++) {
        for (int j = 0; j < 32; j++) key_bytes[k][j] = (uint8_t)(k * 37 + j * 101 + 1);
        keys[k] = key_bytes[k];
        key_lens[k] = 32;
    }
}

static size_t wait_failed(kvbm_notification_t n) {
    kvbm_status_t st = kvbm_notification_wait(n, 10000);
    EXPECT(st != KVBM_ERR_TIMEOUT);
    size_t failed = 99;
    CHECK(kvbm_notification_failed_blocks(n, NULL, 0, &failed));
    EXPECT((st == KVBM_OK) == (failed == 0));
    CHECK(kvbm_notification_free(n));
    return failed;
}

int main(void) {
    make_keys();
    char dir[] = "/tmp/kvbm-prefix-XXXXXX";
    EXPECT(mkdtemp(dir) != NULL);
    char objects[64];
    snprintf(objects, sizeof objects, "%s/objects", dir);

    kvbm_worker_config_t wc = KVBM_WORKER_CONFIG_INIT;
    wc.worker_id = 0x2001;
    wc.disk_dir = dir;
    wc.object_dir = objects;
    kvbm_worker_t w;
    CHECK(kvbm_worker_create(&wc, &w));

    /* No cache yet: a clear error. */
    size_t matched = 99;
    EXPECT(kvbm_worker_cache_match(w, keys, key_lens, 1, &matched, NULL) == KVBM_ERR_FAILED_PRECONDITION);
    EXPECT(strstr(kvbm_last_error(), "kvbm_worker_cache_enable") != NULL);

    g1_open();
    uint64_t *ptrs = g1_layers;
    for (int l = 0; l < NUM_LAYERS; l++) {
        EXPECT((layers[l] = calloc(1, G1_BLOCKS * BLOCK_LAYER_BYTES)) != NULL);
        ptrs[l] = g1_alloc(G1_BLOCKS * BLOCK_LAYER_BYTES);
    }
    kvbm_layout_config_t g1 = KVBM_LAYOUT_CONFIG_INIT;
    g1.num_blocks = G1_BLOCKS;
    g1.num_layers = NUM_LAYERS;
    g1.outer_dim = OUTER;
    g1.page_size = PAGE;
    g1.inner_dim = INNER;
    g1.dtype_width = WIDTH;
    g1.layout_kind = KVBM_LAYOUT_LAYER_SEPARATE;
    g1.block_dim = KVBM_BLOCK_DIM_FIRST;
    kvbm_layout_handle_t h1;
    CHECK(kvbm_worker_register_g1(w, &g1, ptrs, NUM_LAYERS, &h1));
    kvbm_layout_config_t host = g1;
    host.layout_kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
    host.num_blocks = G2_BLOCKS;
    CHECK(kvbm_worker_allocate_g2(w, &host, NULL));
    host.num_blocks = G3_BLOCKS;
    CHECK(kvbm_worker_allocate_g3(w, &host, NULL));

    kvbm_cache_config_t cc = KVBM_CACHE_CONFIG_INIT;
    cc.g3_mode = 7;
    EXPECT(kvbm_worker_cache_enable(w, &cc) == KVBM_ERR_INVALID_ARGUMENT);
    cc.g3_mode = KVBM_WRITE_BACK;
    CHECK(kvbm_worker_cache_enable(w, &cc));
    EXPECT(kvbm_worker_cache_enable(w, &cc) == KVBM_ERR_ALREADY_EXISTS);

    /* Request A: 6 blocks of prompt (keys 0-5) computed into G1 blocks 0-5,
     * offloaded after the compute event. */
    kvbm_stream_t stream;
    kvbm_event_t computed;
    CHECK(kvbm_stream_create(0, &stream));
    CHECK(kvbm_event_create(0, &computed));
    uint32_t a_ids[6] = {0, 1, 2, 3, 4, 5};
    for (int i = 0; i < 6; i++) compute(a_ids[i], i);
    CHECK(kvbm_event_record(computed, stream));
    int32_t decisions[8];
    kvbm_notification_t n;
    CHECK(kvbm_worker_cache_offload(w, keys, key_lens, 6, a_ids, computed, decisions, &n));
    EXPECT(wait_failed(n) == 0);
    for (int i = 0; i < 6; i++) EXPECT(decisions[i] == KVBM_CACHE_STORE);
    /* Offloading it again is a no-op that says so. */
    CHECK(kvbm_worker_cache_offload(w, keys, key_lens, 2, a_ids, NULL, decisions, &n));
    EXPECT(wait_failed(n) == 0);
    EXPECT(decisions[0] == KVBM_CACHE_PRESENT && decisions[1] == KVBM_CACHE_PRESENT);

    /* Other requests (keys 20-23) fill G2: A's least recently used blocks
     * are written back to G3. */
    uint32_t other_ids[4] = {6, 7, 8, 9};
    for (int i = 0; i < 4; i++) compute(other_ids[i], 20 + i);
    CHECK(kvbm_worker_cache_offload(w, keys + 20, key_lens + 20, 4, other_ids, NULL, NULL, &n));
    EXPECT(wait_failed(n) == 0);

    /* Request B shares A's 6-block prefix, then diverges (key 40). */
    const uint8_t *b_keys[7];
    size_t b_lens[7];
    for (int i = 0; i < 6; i++) b_keys[i] = keys[i], b_lens[i] = 32;
    b_keys[6] = keys[40], b_lens[6] = 32;
    int32_t tiers[7];
    CHECK(kvbm_worker_cache_match(w, b_keys, b_lens, 7, &matched, tiers));
    EXPECT(matched == 6);
    int from_g3 = 0;
    for (int i = 0; i < 6; i++) {
        EXPECT(tiers[i] == KVBM_TIER_G2 || tiers[i] == KVBM_TIER_G3);
        from_g3 += tiers[i] == KVBM_TIER_G3;
    }
    EXPECT(from_g3 == 2 && tiers[6] == 0);
    printf("request B: %zu of 7 blocks cached (%d in G3, %d in G2)\n", matched, from_g3, 6 - from_g3);

    /* B onboards the prefix into G1 blocks 10-15, layer by layer. */
    clear_g1();
    uint32_t b_ids[6] = {10, 11, 12, 13, 14, 15};
    kvbm_event_t layer_done[NUM_LAYERS];
    for (int l = 0; l < NUM_LAYERS; l++) CHECK(kvbm_event_create(0, &layer_done[l]));
    CHECK(kvbm_worker_cache_onboard(w, b_keys, b_lens, 6, b_ids, layer_done, NUM_LAYERS, stream, &n));
    for (int l = 0; l < NUM_LAYERS; l++) {
        CHECK(kvbm_event_synchronize(layer_done[l]));
        for (int i = 0; i < 6; i++) verify(b_ids[i], i, l);
    }
    EXPECT(wait_failed(n) == 0);
    for (int l = 0; l < NUM_LAYERS; l++) { /* the blocks around are untouched */
        g1_get(layers[l], g1_layers[l], 10 * BLOCK_LAYER_BYTES);
        for (size_t i = 0; i < 10 * BLOCK_LAYER_BYTES; i++) EXPECT(layers[l][i] == 0);
    }

    /* A key that is not cached fails its block only. */
    const uint8_t *mixed[2] = {keys[0], keys[41]};
    size_t mixed_lens[2] = {32, 32};
    uint32_t mixed_ids[2] = {0, 1};
    CHECK(kvbm_worker_cache_onboard(w, mixed, mixed_lens, 2, mixed_ids, NULL, 0, NULL, &n));
    EXPECT(kvbm_notification_wait(n, 10000) == KVBM_ERR_NOT_FOUND);
    uint32_t failed[2];
    size_t nfailed = 0;
    CHECK(kvbm_notification_failed_blocks(n, failed, 2, &nfailed));
    EXPECT(nfailed == 1 && failed[0] == 1);
    CHECK(kvbm_notification_free(n));
    for (int l = 0; l < NUM_LAYERS; l++) verify(0, 0, l);

    /* Bad input: a clear error, nothing changed. */
    size_t long_len[1] = {65};
    EXPECT(kvbm_worker_cache_match(w, keys, long_len, 1, &matched, NULL) == KVBM_ERR_INVALID_ARGUMENT);
    const uint8_t *dup[2] = {keys[0], keys[0]};
    EXPECT(kvbm_worker_cache_offload(w, dup, mixed_lens, 2, mixed_ids, NULL, NULL, &n) == KVBM_ERR_INVALID_ARGUMENT);
    uint32_t beyond[1] = {G1_BLOCKS};
    EXPECT(kvbm_worker_cache_offload(w, keys + 50, key_lens, 1, beyond, NULL, NULL, &n) == KVBM_ERR_OUT_OF_RANGE);
    EXPECT(kvbm_worker_cache_onboard(w, keys, key_lens, 1, mixed_ids, layer_done, 1, NULL, &n) ==
           KVBM_ERR_INVALID_ARGUMENT);

    /* The events: what entered and left each tier, in order. */
    kvbm_cache_event_t evs[8];
    size_t count, stored_g2 = 0, removed_g2 = 0, stored_g3 = 0, total = 0;
    do {
        CHECK(kvbm_worker_cache_events(w, evs, 8, &count));
        for (size_t i = 0; i < count; i++) {
            EXPECT(evs[i].key_len == 32);
            stored_g2 += evs[i].kind == KVBM_CACHE_EVENT_STORED && evs[i].tier == KVBM_TIER_G2;
            removed_g2 += evs[i].kind == KVBM_CACHE_EVENT_REMOVED && evs[i].tier == KVBM_TIER_G2;
            stored_g3 += evs[i].kind == KVBM_CACHE_EVENT_STORED && evs[i].tier == KVBM_TIER_G3;
        }
        total += count;
    } while (count == 8);
    EXPECT(stored_g2 >= 10 && removed_g2 >= 2 && stored_g3 >= 2);

    kvbm_cache_stats_t st = KVBM_CACHE_STATS_INIT;
    CHECK(kvbm_worker_cache_stats(w, &st));
    printf("offloaded %llu (deduped %llu); onboarded %llu (G2 %llu, G3 %llu), failed %llu; "
           "G2 hits %llu misses %llu evictions %llu; %zu events\n",
           (unsigned long long)st.offloaded, (unsigned long long)st.deduped,
           (unsigned long long)st.onboarded, (unsigned long long)st.onboarded_from_g2,
           (unsigned long long)st.onboarded_from_g3, (unsigned long long)st.onboard_failed,
           (unsigned long long)st.g2.hits, (unsigned long long)st.g2.misses,
           (unsigned long long)st.g2.evictions, total);
    EXPECT(st.offloaded == 10 && st.deduped == 2 && st.onboarded == 7 && st.onboard_failed == 1);
    EXPECT(st.onboarded_from_g3 == 2 && st.g2.evictions >= 2);

    for (int l = 0; l < NUM_LAYERS; l++) CHECK(kvbm_event_destroy(layer_done[l]));
    CHECK(kvbm_event_destroy(computed));
    CHECK(kvbm_stream_destroy(stream));
    CHECK(kvbm_worker_destroy(w));
    expect_no_handles();
    for (int l = 0; l < NUM_LAYERS; l++) {
        g1_free(g1_layers[l]);
        free(layers[l]);
    }
    EXPECT(nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS) == 0); // the G3 and G4 directories
    printf("prefix cache: every byte verified\n");
    return 0;
}
