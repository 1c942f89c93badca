/* libFuzzer target over the C ABI's input paths: each input is a program of
 * calls with fuzzer-chosen arguments (metadata and layout-response bytes,
 * block ids, tiers, layer ranges, raw handles, object keys, prefix-cache
 * keys and events, handoff facts and outcomes). Whatever the input, every call must return a known status,
 * leave a message when it fails, and never crash, hang or corrupt memory
 * (the build uses ASan/UBSan).
 *
 * Build and run: make fuzz-c FUZZTIME=60 (needs clang; the target installs
 * it). One worker with G1 (host memory, emulated device), G2, G3 and an
 * object store serves every input; handles it creates are freed per input,
 * so the handle count is checked to return to its baseline. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kvbm.h>

enum { NUM_BLOCKS = 8, NUM_LAYERS = 2, OUTER = 2, PAGE = 4, INNER = 16, WIDTH = 2 };
enum { G1_BYTES = NUM_BLOCKS * NUM_LAYERS * OUTER * PAGE * INNER * WIDTH };
enum { MAX_IDS = 12, MAX_BYTES = 512 };

static kvbm_worker_t worker;
static kvbm_event_t layer_events[NUM_LAYERS];
static uint8_t *g1;
static kvbm_layout_config_t g1_config;
static uint8_t metadata[4096];
static size_t metadata_len;
static size_t baseline_handles;

/* A cursor over the input. Reads past the end give zeros. */
typedef struct {
    const uint8_t *p;
    size_t n;
} input_t;

static uint8_t u8(input_t *in) {
    if (in->n == 0) return 0;
    in->n--;
    return *in->p++;
}

static uint64_t u64(input_t *in) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | u8(in);
    return v;
}

static size_t take(input_t *in, uint8_t *dst, size_t max) {
    size_t n = u8(in) % (max + 1);
    if (n > in->n) n = in->n;
    memcpy(dst, in->p, n);
    in->p += n;
    in->n -= n;
    return n;
}

static void check(kvbm_status_t st, const char *what) {
    if (st > KVBM_IN_PROGRESS || st < KVBM_ERR_DEADLINE_EXCEEDED) {
        fprintf(stderr, "%s: unknown status %d\n", what, st);
        abort();
    }
    if (st == KVBM_ERR_INTERNAL) {
        fprintf(stderr, "%s: internal error: %s\n", what, kvbm_last_error());
        abort();
    }
    if (st < 0 && kvbm_last_error()[0] == '\0') {
        fprintf(stderr, "%s: %s without a message\n", what, kvbm_status_string(st));
        abort();
    }
}

static void setup(void) {
    char dir[] = "/tmp/kvbm-fuzz-XXXXXX";
    if (!mkdtemp(dir)) abort();
    static char objects[64];
    snprintf(objects, sizeof objects, "%s/g4", dir);
    kvbm_worker_config_t wc = KVBM_WORKER_CONFIG_INIT;
    wc.worker_id = 0xF00;
    wc.disk_dir = dir;
    wc.object_dir = objects;
    if (kvbm_worker_create(&wc, &worker) != KVBM_OK) abort();
    if (posix_memalign((void **)&g1, 4096, G1_BYTES) != 0) abort();
    memset(g1, 7, G1_BYTES);
    kvbm_layout_config_t c = KVBM_LAYOUT_CONFIG_INIT;
    c.num_blocks = NUM_BLOCKS;
    c.num_layers = NUM_LAYERS;
    c.outer_dim = OUTER;
    c.page_size = PAGE;
    c.inner_dim = INNER;
    c.dtype_width = WIDTH;
    c.layout_kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
    g1_config = c;
    uint64_t ptr = (uint64_t)(uintptr_t)g1;
    if (kvbm_worker_register_g1(worker, &c, &ptr, 1, NULL) != KVBM_OK ||
        kvbm_worker_allocate_g2(worker, &c, NULL) != KVBM_OK ||
        kvbm_worker_allocate_g3(worker, &c, NULL) != KVBM_OK ||
        kvbm_worker_export_metadata(worker, metadata, sizeof metadata, &metadata_len) != KVBM_OK) {
        fprintf(stderr, "setup: %s\n", kvbm_last_error());
        abort();
    }
    kvbm_cache_config_t cc = KVBM_CACHE_CONFIG_INIT;
    if (kvbm_worker_cache_enable(worker, &cc) != KVBM_OK) abort();
    for (int l = 0; l < NUM_LAYERS; l++)
        if (kvbm_event_create(0, &layer_events[l]) != KVBM_OK) abort();
    if (kvbm_handle_count(&baseline_handles) != KVBM_OK) abort();
}

/* Waits for and frees a notification the library issued. Callers store
 * the call's status first: C leaves the order of evaluating arguments
 * open, so the notification must be read after the call returned. */
static void settle(kvbm_status_t st, kvbm_notification_t n, const char *what) {
    check(st, what);
    if (st != KVBM_OK) return;
    check(kvbm_notification_wait(n, 10000), "notification_wait");
    uint32_t failed[NUM_BLOCKS];
    size_t count = 0;
    kvbm_status_t fst = kvbm_notification_failed_blocks(n, failed, NUM_BLOCKS, &count);
    check(fst, "notification_failed_blocks");
    if (kvbm_notification_free(n) != KVBM_OK) abort();
}

static void op_transfer(input_t *in) {
    uint32_t src[MAX_IDS], dst[MAX_IDS];
    size_t n = u8(in) % (MAX_IDS + 1);
    for (size_t i = 0; i < n; i++) {
        src[i] = u8(in) % (NUM_BLOCKS + 2); /* sometimes out of range */
        dst[i] = u8(in) % (NUM_BLOCKS + 2);
    }
    int32_t s = (int32_t)(u8(in) % 6) - 1, d = (int32_t)(u8(in) % 6) - 1;
    kvbm_transfer_options_t o = KVBM_TRANSFER_OPTIONS_INIT;
    o.layer_start = u8(in) % 4;
    o.layer_end = u8(in) % 4;
    if (u8(in) & 1) { /* a head slice, sometimes one that does not fit */
        o.head_count = u8(in) % 4;
        o.src_heads = u8(in) % 5;
        o.src_head_first = u8(in) % 4;
        o.src_head_order = u8(in) % 4;
        o.dst_heads = u8(in) % 5;
        o.dst_head_first = u8(in) % 4;
        o.dst_head_order = u8(in) % 4;
    }
    if (u8(in) & 1) o.struct_size = u8(in);
    kvbm_notification_t note = NULL;
    kvbm_status_t called = kvbm_worker_transfer(worker, s, src, d, dst, n, (u8(in) & 1) ? &o : NULL, &note);
    settle(called, note, "worker_transfer");
}

static void op_import(input_t *in) {
    uint8_t buf[MAX_BYTES + sizeof metadata];
    size_t n;
    if (u8(in) & 1) { /* a mutation of real metadata */
        n = metadata_len;
        memcpy(buf, metadata, n);
        for (int k = u8(in) % 4; k > 0; k--) buf[u64(in) % n] ^= u8(in);
        if (u8(in) & 1) n = u64(in) % (n + 1);
    } else {
        n = take(in, buf, MAX_BYTES);
    }
    check(kvbm_worker_import_metadata(worker, n ? buf : NULL, n), "worker_import_metadata");
    uint64_t exporter = 0;
    check(kvbm_metadata_worker_id(n ? buf : NULL, n, &exporter), "metadata_worker_id");
    kvbm_coordinated_t c;
    if (kvbm_coordinated_create(worker, 0, 1, &c) != KVBM_OK) abort();
    check(kvbm_coordinated_apply_layout_response(c, n ? buf : NULL, n), "coordinated_apply_layout_response");
    check(kvbm_coordinated_import_remote_metadata(c, u64(in), (int32_t)u8(in), n ? buf : NULL, n),
          "coordinated_import_remote_metadata");
    if (kvbm_coordinated_destroy(c) != KVBM_OK) abort();
}

/* A block-scoped export, and sometimes a revocation of the same blocks:
 * tiers and ids sometimes invalid or out of range, struct_size sometimes
 * short, the buffer sometimes too small. */
static void op_scope(input_t *in) {
    int32_t tiers[MAX_IDS];
    uint32_t ids[MAX_IDS];
    size_t n = u8(in) % (MAX_IDS + 1);
    for (size_t i = 0; i < n; i++) {
        tiers[i] = (int32_t)(u8(in) % 6) - 1;
        ids[i] = u8(in) % (NUM_BLOCKS + 2);
    }
    kvbm_block_scope_t scope = KVBM_BLOCK_SCOPE_INIT;
    scope.tiers = (u8(in) % 8) ? tiers : NULL;
    scope.block_ids = (u8(in) % 8) ? ids : NULL;
    scope.num_blocks = n;
    scope.expires_ms = (u8(in) & 1) ? (uint32_t)u64(in) : 0;
    if (u8(in) % 8 == 0) scope.struct_size = u8(in);
    uint8_t buf[sizeof metadata];
    size_t len = 0;
    size_t cap = (u8(in) & 1) ? sizeof buf : u8(in);
    check(kvbm_worker_export_metadata_blocks(worker, (u8(in) % 16) ? &scope : NULL, buf, cap, &len),
          "worker_export_metadata_blocks");
    if (u8(in) & 1)
        check(kvbm_worker_revoke_blocks(worker, (u8(in) % 16) ? &scope : NULL), "worker_revoke_blocks");
}

static void op_objects(input_t *in) {
    uint8_t keybuf[4][80];
    const uint8_t *keys[4];
    size_t lens[4];
    uint32_t ids[4];
    size_t n = u8(in) % 5;
    for (size_t i = 0; i < n; i++) {
        lens[i] = take(in, keybuf[i], 70); /* 0 and > 64 are invalid */
        keys[i] = keybuf[i];
        ids[i] = u8(in) % (NUM_BLOCKS + 1);
    }
    int32_t tier = (int32_t)(u8(in) % 6) - 1;
    uint8_t found[4];
    kvbm_status_t per[4];
    switch (u8(in) % 4) {
    case 0:
        check(kvbm_worker_object_has(worker, keys, lens, n, found), "worker_object_has");
        break;
    case 1:
        check(kvbm_worker_object_put(worker, keys, lens, n, tier, ids, per), "worker_object_put");
        break;
    case 2:
        check(kvbm_worker_object_get(worker, keys, lens, n, tier, ids, per), "worker_object_get");
        break;
    default: {
        kvbm_notification_t note = NULL;
        kvbm_status_t called = kvbm_worker_onboard_objects(worker, keys, lens, n, tier, ids, &note);
        settle(called, note, "worker_onboard_objects");
    }
    }
}

/* The prefix cache: keys from a small space (so that hits, dedupes and
 * evictions happen), sometimes of bad lengths or repeated; ids sometimes
 * out of range or repeated; events sometimes of the wrong count. */
static void op_cache(input_t *in) {
    uint8_t keybuf[MAX_IDS][70];
    const uint8_t *keys[MAX_IDS];
    size_t lens[MAX_IDS];
    uint32_t ids[MAX_IDS];
    int32_t out[MAX_IDS];
    size_t n = u8(in) % (MAX_IDS + 1);
    for (size_t i = 0; i < n; i++) {
        uint8_t kind = u8(in);
        lens[i] = kind % 16 == 0 ? take(in, keybuf[i], 68) : 1 + kind % 3;
        if (kind % 16 != 0) memset(keybuf[i], 'a' + kind % 12, lens[i]);
        keys[i] = keybuf[i];
        ids[i] = u8(in) % (NUM_BLOCKS + 1);
    }
    kvbm_notification_t note = NULL;
    kvbm_status_t st;
    switch (u8(in) % 5) {
    case 0: {
        size_t matched = 0;
        check(kvbm_worker_cache_match(worker, keys, lens, n, &matched, (u8(in) & 1) ? out : NULL),
              "worker_cache_match");
        if (matched > n) abort();
        break;
    }
    case 1:
        st = kvbm_worker_cache_offload(worker, keys, lens, n, ids, NULL, (u8(in) & 1) ? out : NULL, &note);
        settle(st, note, "worker_cache_offload");
        break;
    case 2: {
        size_t ne = (u8(in) & 1) ? NUM_LAYERS : u8(in) % 4;
        st = kvbm_worker_cache_onboard(worker, keys, lens, n, ids, ne ? layer_events : NULL, ne, NULL, &note);
        settle(st, note, "worker_cache_onboard");
        break;
    }
    case 3: {
        kvbm_cache_stats_t stats = KVBM_CACHE_STATS_INIT;
        if (u8(in) & 1) stats.struct_size = u8(in);
        check(kvbm_worker_cache_stats(worker, &stats), "worker_cache_stats");
        break;
    }
    default: {
        kvbm_cache_event_t evs[4];
        size_t count = 0;
        check(kvbm_worker_cache_events(worker, evs, u8(in) % 5, &count), "worker_cache_events");
        if (count > 4) abort();
    }
    }
}

static void op_raw_handles(input_t *in) {
    /* Made-up handle values: never a crash, always INVALID_HANDLE. */
    uintptr_t v = (uintptr_t)u64(in);
    kvbm_status_t st = kvbm_notification_poll((kvbm_notification_t)v);
    if (st != KVBM_ERR_INVALID_HANDLE) {
        fprintf(stderr, "poll of made-up handle %#lx: %s\n", (unsigned long)v, kvbm_status_string(st));
        abort();
    }
    check(kvbm_worker_destroy((kvbm_worker_t)v), "worker_destroy(made-up)");
    check(kvbm_handoff_free((kvbm_handoff_t)v), "handoff_free(made-up)");
    check(kvbm_worker_unregister_g1((kvbm_worker_t)v, NULL), "worker_unregister_g1(made-up)");
    if (u8(in) % 8 == 0) {
        /* Sleep mode: G1 goes, with a reason of any bytes, and comes back. */
        char reason[64];
        size_t n = u8(in) % sizeof reason;
        for (size_t i = 0; i < n; i++) reason[i] = (char)(u8(in) | 1);
        reason[n] = 0;
        check(kvbm_worker_unregister_g1(worker, (u8(in) & 1) ? reason : NULL), "worker_unregister_g1");
        uint64_t ptr = (uint64_t)(uintptr_t)g1;
        if (kvbm_worker_register_g1(worker, &g1_config, &ptr, 1, NULL) != KVBM_OK) {
            fprintf(stderr, "register_g1 after unregister: %s\n", kvbm_last_error());
            abort();
        }
    }
}

static void op_handoff(input_t *in) {
    uint8_t id[16];
    for (int i = 0; i < 16; i++) id[i] = u8(in);
    kvbm_handoff_t h;
    double fallback = (double)(int8_t)u8(in);
    kvbm_status_t st = kvbm_handoff_new(id, (int32_t)(u8(in) % 4), fallback, &h);
    check(st, "handoff_new");
    if (st != KVBM_OK) return;
    kvbm_handoff_action_t acts[KVBM_HANDOFF_MAX_ACTIONS];
    size_t count;
    check(kvbm_handoff_start(h, acts, KVBM_HANDOFF_MAX_ACTIONS, &count), "handoff_start");
    uint64_t last = count ? acts[count - 1].id : 1;
    for (int step = u8(in) % 16; step > 0 && in->n > 0; step--) {
        if (u8(in) & 1) {
            kvbm_handoff_fact_t f = KVBM_HANDOFF_FACT_INIT;
            f.kind = (int32_t)(u8(in) % 8);
            memcpy(f.handoff_id, id, 16);
            if (u8(in) % 8 == 0) f.handoff_id[0] ^= 1;
            f.timing_mode = (int32_t)(u8(in) % 4);
            f.full_prompt_tokens = u64(in) % 100000;
            f.kv_bytes_per_token = u64(in) % 1000000;
            f.has_kv_bytes_per_token = u8(in) & 1;
            f.has_bandwidth_gbs = u8(in) & 1;
            f.bandwidth_gbs = (double)(int16_t)(u8(in) << 8 | u8(in)) / 16.0;
            f.transferable_tokens = u64(in) % 100000;
            check(kvbm_handoff_on_fact(h, &f, acts, KVBM_HANDOFF_MAX_ACTIONS, &count), "handoff_on_fact");
        } else {
            uint64_t action = (u8(in) & 1) ? last : u64(in) % 20;
            const char *msg = (u8(in) & 1) ? "fuzz" : NULL;
            check(kvbm_handoff_on_outcome(h, action, (int32_t)(u8(in) % 8), msg, acts, KVBM_HANDOFF_MAX_ACTIONS,
                                          &count),
                  "handoff_on_outcome");
        }
        if (count) last = acts[count - 1].id;
    }
    int32_t done = 0, completion = 0;
    check(kvbm_handoff_is_complete(h, &done), "handoff_is_complete");
    check(kvbm_handoff_completion(h, &completion), "handoff_completion");
    if (kvbm_handoff_free(h) != KVBM_OK) abort();
}

/* Load or recompute: any tiers, sizes and rates (NaN, negative, huge); a
 * result never beyond the blocks given, an error for what is not valid. */
static void op_load_plan(input_t *in) {
    int32_t tiers[16];
    size_t n = u8(in) % 17;
    for (size_t i = 0; i < n; i++) tiers[i] = (int32_t)(u8(in) % 7) - 1;
    kvbm_load_plan_input_t p = KVBM_LOAD_PLAN_INPUT_INIT;
    uint64_t bits = u64(in);
    memcpy(&p.block_bytes, &bits, sizeof bits);
    if (u8(in) & 1) p.block_bytes = (double)(u64(in) % (1u << 24));
    p.tokens_per_block = (uint32_t)u64(in);
    p.prefill_tokens_per_s = (double)(u64(in) % 100000);
    p.margin = (double)(u8(in) % 120) / 100.0;
    for (int t = 0; t < 5; t++) {
        bits = u64(in);
        memcpy(&p.load_rate[t], &bits, sizeof bits);
        p.load_queued[t] = (double)(u64(in) % (1u << 30));
    }
    if (u8(in) % 8 == 0) p.struct_size = u8(in);
    size_t blocks = 0;
    kvbm_status_t st = kvbm_load_plan(n ? tiers : NULL, n, &p, &blocks);
    if (st == KVBM_OK && blocks > n) abort();
    if (st != KVBM_OK && st != KVBM_ERR_INVALID_ARGUMENT) {
        fprintf(stderr, "load_plan: %s\n", kvbm_status_string(st));
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!worker) setup();
    input_t in = {data, size};
    for (int ops = 0; in.n > 0 && ops < 16; ops++) {
        switch (u8(&in) % 8) {
        case 0: op_transfer(&in); break;
        case 7: op_load_plan(&in); break;
        case 6: op_scope(&in); break;
        case 1: op_import(&in); break;
        case 2: op_objects(&in); break;
        case 3: op_raw_handles(&in); break;
        case 4: op_cache(&in); break;
        default: op_handoff(&in); break;
        }
    }
    size_t handles = 0;
    if (kvbm_handle_count(&handles) != KVBM_OK || handles != baseline_handles) {
        fprintf(stderr, "handle leak: %zu live, %zu expected\n", handles, baseline_handles);
        abort();
    }
    return 0;
}
