/* A C client of libstoker's soft labels (a spec with batch_mix: MixUp / CutMix,
 * docs/augment.md): attaches with the spec given as JSON, reads every batch and prints its
 * soft labels' DLPack shape and the FNV-1a hash of their bytes.
 *
 * Includes only stoker.h (and client_steps.h) and builds as C11 with -Wall -Wextra -Werror
 * -pedantic. Run by tests/mix/ against a real stokerd.
 *
 * usage: mix SOCKET DATASET SPEC_JSON SEED
 *
 * Prints one line per batch: "soft EPOCH STEP N C HASH", or "nosoft EPOCH STEP N" for a job
 * without a batch mix (stoker_batch_soft_labels must then be an argument error and the
 * header's soft_labels NULL); checks that the header's soft_labels and num_classes are the
 * tensor's data and second dimension, float32 on the host.
 * Exit status: 0 ok, 1 a check failed, 2 a stoker call failed, 64 bad usage. */
#define CLIENT_NAME "mix"
#include "client_steps.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t fnv1a(const uint8_t *p, size_t len) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t k = 0; k < len; k++) {
        h ^= p[k];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* Prints the soft labels of `b`. Returns 0 or an exit status. */
static int print_soft(stoker_batch *b, const stoker_batch_header *h) {
    DLManagedTensorVersioned *t = NULL;
    stoker_result r = stoker_batch_soft_labels(b, &t);
    if (h->num_classes == 0) {
        CHECK(r == STOKER_ERR_INVALID_ARGUMENT && t == NULL, "no mix: %s",
              stoker_result_name(r));
        CHECK(h->soft_labels == NULL, "no mix: the header has soft labels");
        printf("nosoft %llu %llu %u\n", (unsigned long long)h->epoch,
               (unsigned long long)h->step, h->n);
        return 0;
    }
    if (r != STOKER_OK) return failed_call("stoker_batch_soft_labels", r);
    const DLTensor *d = &t->dl_tensor;
    CHECK(d->ndim == 2 && d->shape[0] == (int64_t)h->n, "ndim %d", d->ndim);
    CHECK(d->shape[1] == (int64_t)h->num_classes, "classes %lld", (long long)d->shape[1]);
    CHECK(d->dtype.code == kDLFloat && d->dtype.bits == 32, "not float32");
    CHECK(d->device.device_type == kDLCPU, "not host memory");
    CHECK((const void *)h->soft_labels == d->data, "the header's soft labels are elsewhere");
    size_t bytes = (size_t)h->n * h->num_classes * sizeof(float);
    printf("soft %llu %llu %u %u %016llx\n", (unsigned long long)h->epoch,
           (unsigned long long)h->step, h->n, h->num_classes,
           (unsigned long long)fnv1a((const uint8_t *)d->data + d->byte_offset, bytes));
    stoker_dlpack_delete(t);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s SOCKET DATASET SPEC_JSON SEED\n", argv[0]);
        return 64;
    }
    stoker_attach_options o;
    stoker_result r = stoker_attach_options_init(&o);
    if (r != STOKER_OK) return failed_call("stoker_attach_options_init", r);
    o.socket = argv[1];
    o.dataset = argv[2];
    o.spec_json = argv[3];
    o.job = "c-mix";
    o.seed = strtoull(argv[4], NULL, 10);

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
        failed = print_soft(b, &h);
        if (failed) return failed;
        stoker_batch_release(b);
    }
    stoker_detach(client);
    return 0;
}
