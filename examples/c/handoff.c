/* Drives the hand-off coordinator the way an engine connector does: execute
 * each action, report its outcome, feed the facts the engines produce. */
#include <stdio.h>
#include <string.h>

#include "check.h"

static const char *action_name(int32_t k) {
    static const char *names[] = {"?", "SubmitPrefill", "ReserveDestination", "StartTransfer",
                                  "ActivateDestination", "ReleaseSource", "CancelSource",
                                  "CancelDestination", "Complete"};
    return k >= 1 && k <= 8 ? names[k] : "?";
}

typedef struct {
    kvbm_handoff_t h;
    uint8_t id[16];
    int fail_reserve; /* report ReserveDestination as failed */
    int actions_seen;
    int32_t completion;
} driver_t;

static void run(driver_t *d, kvbm_handoff_action_t *acts, size_t n);

static void fact(driver_t *d, int32_t kind) {
    kvbm_handoff_fact_t f = KVBM_HANDOFF_FACT_INIT;
    f.kind = kind;
    memcpy(f.handoff_id, d->id, 16);
    f.full_prompt_tokens = 128;
    f.kv_bytes_per_token = 131072;
    f.has_kv_bytes_per_token = 1;
    f.bandwidth_gbs = 25.0;
    f.has_bandwidth_gbs = 1;
    f.transferable_tokens = 128;
    kvbm_handoff_action_t acts[KVBM_HANDOFF_MAX_ACTIONS];
    size_t n = 0;
    CHECK(kvbm_handoff_on_fact(d->h, &f, acts, KVBM_HANDOFF_MAX_ACTIONS, &n));
    run(d, acts, n);
}

static void outcome(driver_t *d, uint64_t id, int32_t kind, const char *msg) {
    kvbm_handoff_action_t acts[KVBM_HANDOFF_MAX_ACTIONS];
    size_t n = 0;
    CHECK(kvbm_handoff_on_outcome(d->h, id, kind, msg, acts, KVBM_HANDOFF_MAX_ACTIONS, &n));
    run(d, acts, n);
}

/* Executes actions in order; outcomes and facts may return more. */
static void run(driver_t *d, kvbm_handoff_action_t *acts, size_t n) {
    kvbm_handoff_action_t mine[KVBM_HANDOFF_MAX_ACTIONS];
    memcpy(mine, acts, n * sizeof *acts);
    for (size_t i = 0; i < n; i++) {
        kvbm_handoff_action_t a = mine[i];
        EXPECT(memcmp(a.handoff_id, d->id, 16) == 0);
        d->actions_seen++;
        printf("  action %llu %s", (unsigned long long)a.id, action_name(a.kind));
        if (a.kind == KVBM_ACTION_START_TRANSFER) printf(" delay=%.3fms", a.delay_ms);
        printf("\n");
        switch (a.kind) {
        case KVBM_ACTION_SUBMIT_PREFILL:
            outcome(d, a.id, KVBM_OUTCOME_SUBMITTED, NULL);
            fact(d, KVBM_FACT_SOURCE_HELD);
            break;
        case KVBM_ACTION_RESERVE_DESTINATION:
            if (d->fail_reserve) {
                outcome(d, a.id, KVBM_OUTCOME_FAILED, "destination has no free blocks");
            } else {
                outcome(d, a.id, KVBM_OUTCOME_ACCEPTED, NULL);
                fact(d, KVBM_FACT_DESTINATION_RESERVED);
            }
            break;
        case KVBM_ACTION_START_TRANSFER:
            EXPECT(a.delay_ms > 0);
            outcome(d, a.id, KVBM_OUTCOME_SCHEDULED, NULL);
            fact(d, KVBM_FACT_TRANSFER_COMPLETED);
            break;
        case KVBM_ACTION_ACTIVATE_DESTINATION:
        case KVBM_ACTION_RELEASE_SOURCE:
        case KVBM_ACTION_CANCEL_SOURCE:
        case KVBM_ACTION_CANCEL_DESTINATION:
            outcome(d, a.id, KVBM_OUTCOME_APPLIED, NULL);
            break;
        case KVBM_ACTION_COMPLETE:
            d->completion = a.completion;
            break;
        default:
            fprintf(stderr, "unknown action kind %d\n", a.kind);
            exit(1);
        }
    }
}

static void handoff(int32_t order, int fail_reserve, int32_t want) {
    driver_t d = {0};
    for (int i = 0; i < 16; i++) d.id[i] = (uint8_t)(order * 16 + i + fail_reserve);
    d.fail_reserve = fail_reserve;
    printf("%s%s:\n", order == KVBM_HANDOFF_SOURCE_FIRST ? "source first" : "destination first",
           fail_reserve ? ", reservation fails" : "");
    CHECK(kvbm_handoff_new(d.id, order, 1.5, &d.h));

    int32_t complete = -1, completion = -1;
    CHECK(kvbm_handoff_is_complete(d.h, &complete));
    EXPECT(complete == 0);

    kvbm_handoff_action_t acts[KVBM_HANDOFF_MAX_ACTIONS];
    size_t n = 0;
    CHECK(kvbm_handoff_start(d.h, acts, KVBM_HANDOFF_MAX_ACTIONS, &n));
    EXPECT(n == 1);
    EXPECT(acts[0].kind == (order == KVBM_HANDOFF_SOURCE_FIRST ? KVBM_ACTION_SUBMIT_PREFILL
                                                               : KVBM_ACTION_RESERVE_DESTINATION));
    run(&d, acts, n);

    CHECK(kvbm_handoff_is_complete(d.h, &complete));
    CHECK(kvbm_handoff_completion(d.h, &completion));
    EXPECT(complete == 1);
    EXPECT(completion == want);
    EXPECT(d.completion == want);

    /* Once complete every call returns nothing. */
    CHECK(kvbm_handoff_start(d.h, acts, KVBM_HANDOFF_MAX_ACTIONS, &n));
    EXPECT(n == 0);
    CHECK(kvbm_handoff_free(d.h));
}

int main(void) {
    handoff(KVBM_HANDOFF_SOURCE_FIRST, 0, KVBM_COMPLETION_SUCCESS);
    handoff(KVBM_HANDOFF_DESTINATION_FIRST, 0, KVBM_COMPLETION_SUCCESS);
    handoff(KVBM_HANDOFF_SOURCE_FIRST, 1, KVBM_COMPLETION_CANCELED);
    handoff(KVBM_HANDOFF_DESTINATION_FIRST, 1, KVBM_COMPLETION_CANCELED);

    /* A request canceled before anything happened. */
    {
        printf("source first, canceled at once:\n");
        uint8_t id[16] = {9};
        kvbm_handoff_t h;
        CHECK(kvbm_handoff_new(id, KVBM_HANDOFF_SOURCE_FIRST, 0, &h));
        kvbm_handoff_action_t acts[KVBM_HANDOFF_MAX_ACTIONS];
        size_t n = 0;
        CHECK(kvbm_handoff_start(h, acts, KVBM_HANDOFF_MAX_ACTIONS, &n));
        kvbm_handoff_fact_t f = KVBM_HANDOFF_FACT_INIT;
        f.kind = KVBM_FACT_CANCELED;
        memcpy(f.handoff_id, id, 16);
        CHECK(kvbm_handoff_on_fact(h, &f, acts, KVBM_HANDOFF_MAX_ACTIONS, &n));
        driver_t d = {.h = h};
        memcpy(d.id, id, 16);
        run(&d, acts, n);
        int32_t completion = 0;
        CHECK(kvbm_handoff_completion(h, &completion));
        EXPECT(completion == KVBM_COMPLETION_CANCELED);
        CHECK(kvbm_handoff_free(h));
    }
    expect_no_handles();
    printf("handoff: ok\n");
    return 0;
}
