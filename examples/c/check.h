/* Shared by the C examples: fail loudly with the status and the message. */
#ifndef KVBM_EXAMPLES_CHECK_H
#define KVBM_EXAMPLES_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvbm.h>

#define CHECK(call)                                                                         \
    do {                                                                                    \
        kvbm_status_t check_st_ = (call);                                                   \
        if (check_st_ != KVBM_OK) {                                                         \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call,             \
                    kvbm_status_string(check_st_), kvbm_last_error());                      \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define EXPECT(cond)                                                                        \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);             \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

/* Fails unless the handle table is empty: every create had its destroy. */
static inline void expect_no_handles(void) {
    size_t n = 99;
    CHECK(kvbm_handle_count(&n));
    if (n != 0) {
        fprintf(stderr, "leak: %zu kvbm handles still live\n", n);
        exit(1);
    }
}

/* The examples that make G1 from host memory they fill and read with the
 * CPU: the emulated device adopts it as device memory. Under the cuda
 * backend G1 must be device memory, which a C program reaches only through
 * CUDA: such an example skips there, saying why (exit 77: ctest's
 * SKIP_RETURN_CODE). */
static inline void skip_unless_emulated_g1(const char *example) {
    kvbm_info_t info = KVBM_INFO_INIT;
    CHECK(kvbm_info(&info));
    if (strcmp(info.device_backend, "emulated") != 0) {
        printf("%s: skipped: its G1 is host memory the program fills and reads, which the %s "
               "backend does not take as device memory (the emulated device does)\n",
               example, info.device_backend);
        exit(77);
    }
}

#endif
