/* Prefill and decode in two processes: this program runs itself again
 * (fork + exec) as the prefill side, which computes KV into G1, offloads it
 * to G2 and prints its metadata; the decode side imports the metadata,
 * pulls the blocks over the network transport (KVBM_TRANSPORT), pushes some
 * back, and finally sees a killed prefill process fail its pull with the
 * blocks named, within the remote deadline. Every byte is checked. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "g1.h"

enum { NUM_BLOCKS = 8, NUM_LAYERS = 4, OUTER = 2, PAGE = 16, INNER = 128, WIDTH = 2 };
enum { BLOCK_BYTES = NUM_LAYERS * OUTER * PAGE * INNER * WIDTH };
enum { TOTAL = NUM_BLOCKS * BLOCK_BYTES };

#define PREFILL_WORKER 0xB1u
#define DECODE_WORKER 0xA1u
#define PREFILL_INSTANCE 0xB0B0u

static uint8_t pattern(size_t off, unsigned seed) { return (uint8_t)(off * 13 + (off >> 9) + seed); }

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

/* A worker whose G1 stands in for the engine's tensors (g1.h), with a G2
 * of the same shape. */
static kvbm_worker_t make_worker(uint64_t id, uint32_t deadline_ms, uint64_t *g1) {
    kvbm_worker_config_t wc = KVBM_WORKER_CONFIG_INIT;
    wc.worker_id = id;
    wc.remote_deadline_ms = deadline_ms;
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
    CHECK(kvbm_notification_wait(n, 30000));
    CHECK(kvbm_notification_free(n));
}

/* G1 is filled and read through a host copy (g1.h). */
static uint8_t host[TOTAL];

static void fill(uint64_t g1, unsigned seed) {
    for (size_t i = 0; i < TOTAL; i++) host[i] = pattern(i, seed);
    g1_put(g1, host, TOTAL);
}

static int same(uint64_t g1, unsigned seed, uint32_t from, uint32_t to) {
    g1_get(host, g1, TOTAL);
    for (size_t i = (size_t)from * BLOCK_BYTES; i < (size_t)to * BLOCK_BYTES; i++)
        if (host[i] != pattern(i, seed)) return 0;
    return 1;
}

static uint32_t ids[NUM_BLOCKS];

/* The prefill process: KV into G1, offload to G2, print the metadata in
 * hex; then "verify" lines check G2 against the decode side's push. */
static int prefill(void) {
    g1_open();
    uint64_t g1;
    kvbm_worker_t w = make_worker(PREFILL_WORKER, 0, &g1);
    fill(g1, 5);
    kvbm_notification_t n;
    CHECK(kvbm_worker_transfer(w, KVBM_TIER_G1, ids, KVBM_TIER_G2, ids, NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    size_t len = 0;
    EXPECT(kvbm_worker_export_metadata(w, NULL, 0, &len) == KVBM_ERR_BUFFER_TOO_SMALL);
    uint8_t *md = malloc(len);
    CHECK(kvbm_worker_export_metadata(w, md, len, &len));
    printf("metadata ");
    for (size_t i = 0; i < len; i++) printf("%02x", md[i]);
    printf("\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "verify", 6) != 0) break;
        /* Blocks 2..3 of G2 were pushed with seed 9; bring G2 up to G1. */
        CHECK(kvbm_worker_transfer(w, KVBM_TIER_G2, ids, KVBM_TIER_G1, ids, NUM_BLOCKS, NULL, &n));
        wait_ok(n);
        int ok = same(g1, 5, 0, 2) && same(g1, 9, 2, 4) && same(g1, 5, 4, NUM_BLOCKS);
        printf("%s\n", ok ? "ok" : "bad");
        fflush(stdout);
    }
    CHECK(kvbm_worker_destroy(w));
    free(md);
    g1_free(g1);
    return 0;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    for (uint32_t i = 0; i < NUM_BLOCKS; i++) ids[i] = i;
    if (argc > 1 && strcmp(argv[1], "--prefill") == 0) return prefill();

    kvbm_info_t info = KVBM_INFO_INIT;
    CHECK(kvbm_info(&info));
    if (strcmp(info.transport, "loopback") == 0) {
        printf("remote_processes: skipped: KVBM_TRANSPORT=loopback reaches only this process\n");
        return 0;
    }

    /* The prefill process, a fresh exec of this program (a forked child
     * may not use the library). */
    int to_child[2], from_child[2];
    EXPECT(pipe(to_child) == 0 && pipe(from_child) == 0);
    pid_t pid = fork();
    EXPECT(pid >= 0);
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        close(to_child[1]);
        close(from_child[0]);
        char *args[] = {argv[0], "--prefill", NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    FILE *in = fdopen(from_child[0], "r");
    FILE *out = fdopen(to_child[1], "w");
    char *line = NULL;
    size_t cap = 0;
    EXPECT(getline(&line, &cap, in) > 0 && strncmp(line, "metadata ", 9) == 0);
    size_t hex = strlen(line + 9) - 1, len = hex / 2;
    uint8_t *md = malloc(len);
    for (size_t i = 0; i < len; i++) EXPECT(sscanf(line + 9 + 2 * i, "%2hhx", &md[i]) == 1);

    g1_open();
    uint64_t g1;
    kvbm_worker_t w = make_worker(DECODE_WORKER, 2000, &g1);
    uint64_t exporter = 0;
    CHECK(kvbm_metadata_worker_id(md, len, &exporter));
    EXPECT(exporter == PREFILL_WORKER);
    CHECK(kvbm_worker_connect_remote(w, PREFILL_INSTANCE, md, len));

    /* Pull the prefill side's G2 into our G1. */
    kvbm_notification_t n;
    CHECK(kvbm_worker_transfer_from_instance(w, PREFILL_INSTANCE, KVBM_TIER_G2, ids, KVBM_TIER_G1, ids,
                                             NUM_BLOCKS, NULL, &n));
    wait_ok(n);
    EXPECT(same(g1, 5, 0, NUM_BLOCKS));

    /* Push blocks 2..3 (seed 9) into the prefill side's G2; it checks. */
    fill(g1, 9);
    kvbm_coordinated_t c;
    CHECK(kvbm_coordinated_create(w, 0, 0xA0A0u, &c));
    CHECK(kvbm_coordinated_import_remote_metadata(c, PREFILL_INSTANCE, 0, md, len));
    kvbm_layout_handle_t remote_g2;
    CHECK(kvbm_coordinated_resolve_remote_handle(c, PREFILL_INSTANCE, 0, KVBM_TIER_G2, &remote_g2));
    CHECK(kvbm_worker_transfer_to_remote(w, KVBM_TIER_G1, ids + 2, &remote_g2, ids + 2, 2, NULL, &n));
    wait_ok(n);
    fprintf(out, "verify\n");
    fflush(out);
    EXPECT(getline(&line, &cap, in) > 0 && strcmp(line, "ok\n") == 0);

    kvbm_counters_t ctr = KVBM_COUNTERS_INIT;
    CHECK(kvbm_worker_counters(w, &ctr));
    /* G1 is device memory: peer <-> G1 goes through a pinned bounce. */
    EXPECT(ctr.paths[KVBM_PATH_TWO_HOP].blocks == NUM_BLOCKS + 2);
    EXPECT(ctr.paths[KVBM_PATH_TWO_HOP].failed_blocks == 0);

    /* The prefill process dies: the pull fails with every block named, well
     * within the 2 s deadline, and so does the next. */
    kill(pid, SIGSTOP);
    usleep(50000);
    g1_clear(g1, TOTAL);
    double start = now();
    CHECK(kvbm_worker_transfer_from_instance(w, PREFILL_INSTANCE, KVBM_TIER_G2, ids, KVBM_TIER_G1, ids,
                                             NUM_BLOCKS, NULL, &n));
    kill(pid, SIGKILL);
    kvbm_status_t st = kvbm_notification_wait(n, 30000);
    EXPECT(st == KVBM_ERR_IO);
    EXPECT(now() - start < 2.0 + 1.0);
    uint32_t failed[NUM_BLOCKS];
    size_t nfailed = 0;
    CHECK(kvbm_notification_failed_blocks(n, failed, NUM_BLOCKS, &nfailed));
    EXPECT(nfailed == NUM_BLOCKS);
    CHECK(kvbm_notification_free(n));
    CHECK(kvbm_worker_transfer_from_instance(w, PREFILL_INSTANCE, KVBM_TIER_G2, ids, KVBM_TIER_G1, ids,
                                             1, NULL, &n));
    st = kvbm_notification_wait(n, 30000);
    EXPECT(st == KVBM_ERR_IO);
    EXPECT(strstr(kvbm_last_error(), "import its metadata again") != NULL ||
           strstr(kvbm_last_error(), "peer") != NULL);
    CHECK(kvbm_notification_free(n));
    int status;
    waitpid(pid, &status, 0);

    CHECK(kvbm_coordinated_destroy(c));
    CHECK(kvbm_worker_destroy(w));
    expect_no_handles();
    fclose(in);
    fclose(out);
    free(line);
    free(md);
    g1_free(g1);
    printf("remote_processes: ok\n");
    return 0;
}
