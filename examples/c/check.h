/* Shared by the C examples: fail loudly with the status and the message. */
#ifndef KVBM_EXAMPLES_CHECK_H
#define KVBM_EXAMPLES_CHECK_H

#include <stdio.h>
#include <stdlib.h>

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

#endif
