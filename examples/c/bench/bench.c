/* ns per call from C, each beside an empty C call measured in the same run.
 * kvbm_version() is answered in C; kvbm_handle_count() and
 * kvbm_notification_poll() cross into the Go runtime (a cgo callback). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
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

/* Threads, each on its own worker: 4 KiB G2 -> G1 transfer + wait in a
 * loop, and the poll of a done notification (the ABI call alone). The
 * figure is ns per call per thread; with no lock shared between workers it
 * stays as one thread's while there are cores for the threads. */
enum { TH_BLOCKS = 64, TH_BYTES = 4096 };

struct thread_arg {
    int index;
    long iters;
    int poll_only;
    double ns;
};

static void *thread_main(void *p) {
    struct thread_arg *a = p;
    kvbm_worker_config_t wc = KVBM_WORKER_CONFIG_INIT;
    wc.worker_id = 0x7000 + (uint64_t)a->index;
    kvbm_worker_t w;
    kvbm_status_t st = kvbm_worker_create(&wc, &w);
    if (st != KVBM_OK) die("thread worker_create", st);
    uint8_t *g1mem;
    if (posix_memalign((void **)&g1mem, 4096, TH_BLOCKS * TH_BYTES) != 0) die("posix_memalign", KVBM_ERR_INTERNAL);
    memset(g1mem, 0, TH_BLOCKS * TH_BYTES);
    kvbm_layout_config_t sc = KVBM_LAYOUT_CONFIG_INIT;
    sc.num_blocks = TH_BLOCKS;
    sc.num_layers = 1;
    sc.outer_dim = 1;
    sc.page_size = 1;
    sc.inner_dim = TH_BYTES;
    sc.dtype_width = 1;
    sc.layout_kind = KVBM_LAYOUT_FULLY_CONTIGUOUS;
    uint64_t ptr = (uint64_t)(uintptr_t)g1mem;
    if ((st = kvbm_worker_register_g1(w, &sc, &ptr, 1, NULL)) != KVBM_OK) die("thread register_g1", st);
    if ((st = kvbm_worker_allocate_g2(w, &sc, NULL)) != KVBM_OK) die("thread allocate_g2", st);
    uint32_t id = 0;
    kvbm_notification_t done;
    if ((st = kvbm_worker_transfer(w, KVBM_TIER_G2, &id, KVBM_TIER_G1, &id, 1, NULL, &done)) != KVBM_OK)
        die("thread transfer", st);
    if ((st = kvbm_notification_wait(done, -1)) != KVBM_OK) die("thread wait", st);
    double t0 = now_ns();
    for (long i = 0; i < a->iters; i++) {
        if (a->poll_only) {
            if (kvbm_notification_poll(done) != KVBM_OK) die("thread poll", KVBM_ERR_INTERNAL);
            continue;
        }
        id = (uint32_t)(i % TH_BLOCKS);
        kvbm_notification_t n;
        if ((st = kvbm_worker_transfer(w, KVBM_TIER_G2, &id, KVBM_TIER_G1, &id, 1, NULL, &n)) != KVBM_OK)
            die("thread transfer", st);
        if ((st = kvbm_notification_wait(n, -1)) != KVBM_OK) die("thread wait", st);
        kvbm_notification_free(n);
    }
    a->ns = (now_ns() - t0) / (double)a->iters;
    kvbm_notification_free(done);
    kvbm_worker_destroy(w);
    free(g1mem);
    return NULL;
}

/* Runs n threads and returns their mean ns per call. */
static double run_threads(int n, long iters, int poll_only) {
    pthread_t th[8];
    struct thread_arg args[8];
    for (int i = 0; i < n; i++) {
        args[i] = (struct thread_arg){.index = i + 16 * poll_only, .iters = iters, .poll_only = poll_only};
        pthread_create(&th[i], NULL, thread_main, &args[i]);
    }
    double sum = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        sum += args[i].ns;
    }
    return sum / n;
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

    for (int poll_only = 1; poll_only >= 0; poll_only--) {
        const char *what = poll_only ? "notification_poll" : "4 KiB transfer+wait";
        long it = poll_only ? iters : small_iters;
        double one = run_threads(1, it, poll_only);
        for (int n = 1; n <= 2; n++) {
            double ns = n == 1 ? one : run_threads(n, it, poll_only);
            char name[64];
            snprintf(name, sizeof name, "%s, %d thread%s", what, n, n == 1 ? "" : "s");
            printf("%-36s %9.1f ns/call  %8.2fx 1 thread\n", name, ns, ns / one);
        }
    }
    return 0;
}
