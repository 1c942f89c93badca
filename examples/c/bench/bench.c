/* ns per call from C, each beside an empty C call measured in the same run.
 * kvbm_version() is answered in C; kvbm_handle_count() and
 * kvbm_notification_poll() cross into the Go runtime (a cgo callback). */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvbm.h>

void kvbm_bench_empty(void);

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#define BENCH(name, iters, body)                                                             \
    do {                                                                                     \
        for (long i_ = 0; i_ < (iters) / 10; i_++) { body; }                                 \
        double t0_ = now_ns();                                                               \
        for (long i_ = 0; i_ < (iters); i_++) { body; }                                      \
        double ns_ = (now_ns() - t0_) / (double)(iters);                                     \
        printf("%-36s %9.1f ns/call  %8.1fx empty\n", name, ns_, ns_ / empty_ns);            \
    } while (0)

static void die(const char *what, kvbm_status_t st) {
    fprintf(stderr, "%s: %s: %s\n", what, kvbm_status_string(st), kvbm_last_error());
    exit(1);
}

int main(void) {
    const long iters = 2000000;
    double empty_ns = 1;
    {
        double t0 = now_ns();
        for (long i = 0; i < iters * 10; i++) kvbm_bench_empty();
        empty_ns = (now_ns() - t0) / (double)(iters * 10);
        printf("%-36s %9.2f ns/call\n", "empty C function", empty_ns);
    }

    /* A completed notification to poll: one G2 -> G2 block copy. */
    kvbm_worker_config_t wc = KVBM_WORKER_CONFIG_INIT;
    wc.worker_id = 0xbe4c;
    kvbm_worker_t w;
    kvbm_status_t st = kvbm_worker_create(&wc, &w);
    if (st != KVBM_OK) die("worker_create", st);
    kvbm_layout_config_t c = KVBM_LAYOUT_CONFIG_INIT;
    c.num_blocks = 2;
    c.num_layers = 1;
    c.outer_dim = 1;
    c.page_size = 1;
    c.inner_dim = 64;
    c.dtype_width = 1;
    c.layout_kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
    if ((st = kvbm_worker_allocate_g2(w, &c, NULL)) != KVBM_OK) die("allocate_g2", st);
    uint32_t src = 0, dst = 1;
    kvbm_notification_t n;
    if ((st = kvbm_worker_transfer(w, KVBM_TIER_G2, &src, KVBM_TIER_G2, &dst, 1, NULL, &n)) != KVBM_OK)
        die("transfer", st);
    if ((st = kvbm_notification_wait(n, -1)) != KVBM_OK) die("wait", st);

    volatile uint32_t sink = 0;
    size_t count = 0;
    BENCH("kvbm_version (C)", iters * 10, sink += kvbm_version());
    BENCH("kvbm_handle_count (Go)", iters, kvbm_handle_count(&count));
    BENCH("kvbm_notification_poll (Go, done)", iters, sink += (uint32_t)kvbm_notification_poll(n));
    BENCH("kvbm_notification_poll (bad handle)", iters,
          sink += (uint32_t)kvbm_notification_poll((kvbm_notification_t)(uintptr_t)12345));

    /* One 4 KiB block G2 -> G1 and its wait, a call at a time, as an
     * engine's small transfers go; beside a memcpy of the same 4 KiB. G1 is
     * the engine's memory, registered by pointer. */
    enum { SMALL_BLOCKS = 256, SMALL_BYTES = 4096 };
    uint8_t *g1mem;
    if (posix_memalign((void **)&g1mem, 4096, SMALL_BLOCKS * SMALL_BYTES) != 0) die("posix_memalign", KVBM_ERR_INTERNAL);
    for (size_t i = 0; i < SMALL_BLOCKS * SMALL_BYTES; i++) g1mem[i] = (uint8_t)i;
    kvbm_worker_t sw;
    wc.worker_id = 0xbe4d;
    if ((st = kvbm_worker_create(&wc, &sw)) != KVBM_OK) die("worker_create", st);
    kvbm_layout_config_t sc = KVBM_LAYOUT_CONFIG_INIT;
    sc.num_blocks = SMALL_BLOCKS;
    sc.num_layers = 1;
    sc.outer_dim = 1;
    sc.page_size = 1;
    sc.inner_dim = SMALL_BYTES / 2;
    sc.dtype_width = 2;
    sc.layout_kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
    uint64_t g1ptr = (uint64_t)(uintptr_t)g1mem;
    kvbm_layout_handle_t g1h;
    if ((st = kvbm_worker_register_g1(sw, &sc, &g1ptr, 1, &g1h)) != KVBM_OK) die("register_g1", st);
    if ((st = kvbm_worker_allocate_g2(sw, &sc, NULL)) != KVBM_OK) die("allocate_g2", st);
    static uint8_t a[SMALL_BLOCKS * SMALL_BYTES], b[SMALL_BLOCKS * SMALL_BYTES];
    for (size_t i = 0; i < sizeof a; i++) a[i] = (uint8_t)(i * 7);
    uint32_t blk = 0;
    const long small_iters = 20000;
    BENCH("memcpy of 4 KiB (C)", small_iters * 10,
          (memcpy(b + (blk % SMALL_BLOCKS) * SMALL_BYTES, a + (blk % SMALL_BLOCKS) * SMALL_BYTES, SMALL_BYTES),
           sink += b[(blk % SMALL_BLOCKS) * SMALL_BYTES], blk++));
    BENCH("4 KiB G2->G1 transfer + wait (Go)", small_iters, {
        uint32_t id = blk++ % SMALL_BLOCKS;
        kvbm_notification_t sn;
        if ((st = kvbm_worker_transfer(sw, KVBM_TIER_G2, &id, KVBM_TIER_G1, &id, 1, NULL, &sn)) != KVBM_OK)
            die("small transfer", st);
        if ((st = kvbm_notification_wait(sn, -1)) != KVBM_OK) die("small wait", st);
        kvbm_notification_free(sn);
    });
    kvbm_worker_destroy(sw);
    free(g1mem);

    kvbm_notification_free(n);
    kvbm_worker_destroy(w);
    return 0;
}
