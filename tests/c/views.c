/* A C client of libstoker's views (docs/views.md): attaches with the spec given as JSON, reads
 * every batch and prints, per view, its DLPack shape and the FNV-1a hash of its bytes.
 *
 * Includes only stoker.h (and client_steps.h) and builds as C11 with -Wall -Wextra -Werror
 * -pedantic. Run by tests/views/ against a real stokerd (u8 output in host memory).
 *
 * usage: views SOCKET DATASET SPEC_JSON SEED
 *
 * Prints one line per view of each batch: "view EPOCH STEP V N H W C HASH" (NHWC dims as
 * N H W C, NCHW as N C H W, as the tensor's shape says), checks that view 0 is
 * stoker_batch_images' tensor and that a view past the count is an argument error.
 * Exit status: 0 ok, 1 a check failed, 2 a stoker call failed, 64 bad usage. */
#define CLIENT_NAME "views"
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

/* Prints view `v` of `b`. Returns 0 or an exit status. */
static int print_view(stoker_batch *b, const stoker_batch_header *h, uint32_t v) {
    DLManagedTensorVersioned *t = NULL;
    stoker_result r = stoker_batch_view(b, v, &t);
    if (r != STOKER_OK) return failed_call("stoker_batch_view", r);
    const DLTensor *d = &t->dl_tensor;
    CHECK(d->ndim == 4 && d->shape[0] == (int64_t)h->n, "view %u: ndim %d", v, d->ndim);
    CHECK(d->dtype.code == kDLUInt && d->dtype.bits == 8, "view %u: not u8", v);
    CHECK(d->device.device_type == kDLCPU, "view %u: not host memory", v);
    size_t bytes = 1;
    for (int k = 0; k < 4; k++) bytes *= (size_t)d->shape[k];
    if (v == 0) {
        DLManagedTensorVersioned *images = NULL;
        r = stoker_batch_images(b, &images);
        if (r != STOKER_OK) return failed_call("stoker_batch_images", r);
        CHECK(images->dl_tensor.data == d->data, "view 0 is not the images");
        stoker_dlpack_delete(images);
    }
    printf("view %llu %llu %u %lld %lld %lld %lld %016llx\n", (unsigned long long)h->epoch,
           (unsigned long long)h->step, v, (long long)d->shape[0], (long long)d->shape[1],
           (long long)d->shape[2], (long long)d->shape[3],
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
    o.job = "c-views";
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
        uint32_t views = 0;
        r = stoker_batch_view_count(b, &views);
        if (r != STOKER_OK) return failed_call("stoker_batch_view_count", r);
        for (uint32_t v = 0; v < views; v++) {
            failed = print_view(b, &h, v);
            if (failed) return failed;
        }
        DLManagedTensorVersioned *t = NULL;
        r = stoker_batch_view(b, views, &t);
        CHECK(r == STOKER_ERR_INVALID_ARGUMENT && t == NULL, "view %u: %s", views,
              stoker_result_name(r));
        stoker_batch_release(b);
    }
    stoker_detach(client);
    return 0;
}
