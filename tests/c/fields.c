/* A C client of libstoker's per-sample fields: attaches with a spec asking for fields, reads
 * every batch of the job and prints each sample's fields as (pointer, length) gave them.
 *
 * Includes only stoker.h (and client_steps.h) and builds as C11 with -Wall -Wextra -Werror
 * -pedantic. Run by tests/fields/ against a real stokerd.
 *
 * usage: fields SOCKET DATASET BATCH_SIZE EPOCHS FIELD_MAX_BYTES START_EPOCH START_STEP FIELD...
 *
 * Prints one line per sample, "sample EPOCH STEP INDEX STATUS LABEL" then per field " HEX" (its
 * bytes in hex, "-" when empty) or " !CODE:LEN" (STOKER_ERR_FIELD: its status and length),
 * and checks that the last error of a refused field names the sample.
 * Exit status: 0 ok, 1 a check failed, 2 a stoker call failed, 64 bad usage. */
#define CLIENT_NAME "fields"
#include "client_steps.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints field `f` of sample `i` of `b` (global index `index`). Returns 0 or an exit status. */
static int print_field(stoker_batch *b, uint32_t f, uint32_t i, uint64_t index) {
    const uint8_t *data = NULL;
    size_t len = 0;
    uint8_t status = 255;
    stoker_result r = stoker_batch_field(b, f, i, &data, &len, &status);
    if (r == STOKER_ERR_FIELD) {
        char want[64];
        snprintf(want, sizeof want, "of sample %llu", (unsigned long long)index);
        CHECK(data == NULL && status >= 1 && status <= 3, "refused field %u: status %u", f,
              status);
        CHECK(strstr(stoker_last_error(), want) != NULL, "error does not name %s: %s", want,
              stoker_last_error());
        printf(" !%u:%zu", status, len);
        return 0;
    }
    if (r != STOKER_OK) return failed_call("stoker_batch_field", r);
    CHECK(status == 0 && (data != NULL || len == 0), "field %u: status %u", f, status);
    printf(" ");
    if (len == 0) printf("-");
    for (size_t k = 0; k < len; k++) printf("%02x", data[k]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 9) {
        fprintf(stderr,
                "usage: %s SOCKET DATASET BATCH_SIZE EPOCHS FIELD_MAX_BYTES START_EPOCH "
                "START_STEP FIELD...\n",
                argv[0]);
        return 64;
    }
    unsigned batch_size = (unsigned)strtoul(argv[3], NULL, 10);
    unsigned epochs = (unsigned)strtoul(argv[4], NULL, 10);
    unsigned max_bytes = (unsigned)strtoul(argv[5], NULL, 10);
    uint32_t fields = (uint32_t)(argc - 8);
    char names[512] = "";
    for (int a = 8; a < argc; a++) {
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s\"%s\"", a > 8 ? ", " : "", argv[a]);
    }
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"batch_size\": %u, \"crop\": {\"kind\": \"random_resized\", \"size\": [16, 16], "
             "\"scale\": [0.08, 1.0], \"ratio\": [0.75, 1.3333333]}, \"dtype\": \"u8\", "
             "\"epochs\": %u, \"fields\": [%s], \"field_max_bytes\": %u}",
             batch_size, epochs, names, max_bytes);

    stoker_attach_options o;
    stoker_result r = stoker_attach_options_init(&o);
    if (r != STOKER_OK) return failed_call("stoker_attach_options_init", r);
    o.socket = argv[1];
    o.dataset = argv[2];
    o.spec_json = spec;
    o.job = "c-fields";
    o.seed = 7;
    o.start_epoch = strtoull(argv[6], NULL, 10);
    o.start_step = strtoull(argv[7], NULL, 10);

    stoker_client *client = NULL;
    stoker_attach_info ai;
    int failed = attach_with_info(&o, &client, &ai);
    if (failed) return failed;
    for (;;) {
        stoker_batch *b = NULL;
        stoker_batch_header h;
        failed = next_batch(client, &b, &h);
        if (failed) return failed;
        if (b == NULL) break;
        for (uint32_t i = 0; i < h.n; i++) {
            printf("sample %llu %llu %llu %u %lld", (unsigned long long)h.epoch,
                   (unsigned long long)h.step, (unsigned long long)h.indices[i], h.status[i],
                   (long long)h.labels[i]);
            for (uint32_t f = 0; f < fields; f++) {
                failed = print_field(b, f, i, h.indices[i]);
                if (failed) return failed;
            }
            printf("\n");
        }
        /* A field past the spec's is an argument error, not a crash. */
        const uint8_t *data = NULL;
        size_t len = 0;
        r = stoker_batch_field(b, fields, 0, &data, &len, NULL);
        CHECK(r == STOKER_ERR_INVALID_ARGUMENT, "field %u: %s", fields, stoker_result_name(r));
        stoker_batch_release(b);
    }
    stoker_detach(client);
    return 0;
}
