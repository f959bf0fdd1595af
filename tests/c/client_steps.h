/* What the C test clients (client.c, cuda_client.c) share: reporting a failed stoker call or a
 * failed check, attaching with the attach info read back, and taking the next batch with its
 * header.
 *
 * Includes only stoker.h and the C library. A client defines CLIENT_NAME (the name its messages
 * start with) before including it. Exit statuses: 1 a check failed, 2 a stoker call failed. */
#ifndef STOKER_TEST_CLIENT_STEPS_H
#define STOKER_TEST_CLIENT_STEPS_H

#include "stoker.h"

#include <stdio.h>
#include <string.h>

#ifndef CLIENT_NAME
#error "define CLIENT_NAME before including client_steps.h"
#endif

static inline int failed_call(const char *what, stoker_result r) {
    fprintf(stderr, CLIENT_NAME ": %s: %s: %s\n", what, stoker_result_name(r),
            stoker_last_error());
    return 2;
}

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, CLIENT_NAME ": check failed: %s: ", #cond);                      \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fputc('\n', stderr);                                                              \
            return 1;                                                                         \
        }                                                                                     \
    } while (0)

/* Zeroes one of stoker's versioned structs and sets its leading size field. */
#define SIZED_ZERO(p) (memset((p), 0, sizeof *(p)), (p)->size = sizeof *(p))

/* Attaches with `o` and reads the attach info into `ai`. Returns 0, or the exit status. */
static inline int attach_with_info(const stoker_attach_options *o, stoker_client **client,
                                   stoker_attach_info *ai) {
    stoker_result r = stoker_attach(o, client);
    if (r != STOKER_OK) return failed_call("stoker_attach", r);
    SIZED_ZERO(ai);
    r = stoker_client_info(*client, ai);
    if (r != STOKER_OK) return failed_call("stoker_client_info", r);
    return 0;
}

/* Takes the next batch into `b` and its header into `h`; at the end of the data `b` is NULL.
 * Returns 0, or the exit status. */
static inline int next_batch(stoker_client *client, stoker_batch **b, stoker_batch_header *h) {
    *b = NULL;
    stoker_result r = stoker_next(client, b);
    if (r == STOKER_END_OF_DATA) {
        *b = NULL;
        return 0;
    }
    if (r != STOKER_OK) return failed_call("stoker_next", r);
    SIZED_ZERO(h);
    r = stoker_batch_info(*b, h);
    if (r != STOKER_OK) return failed_call("stoker_batch_info", r);
    return 0;
}

#endif
