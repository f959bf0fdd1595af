/* A C client of libstoker: attaches to a daemon, reads batches, checks them, prints a summary.
 *
 * Includes only stoker.h (and client_steps.h, the steps both C clients share) and builds as
 * C11 with -Wall -Wextra -Werror -pedantic. Run by
 * tests/c_abi.rs against a real stokerd.
 *
 * usage: client SOCKET DATASET BATCHES BATCH_SIZE SIDE [RANK WORLD_SIZE JOB SEED]
 *
 * Prints one line per batch, "batch EPOCH STEP N idx idx ...", then
 * "summary batches=B samples=S bad=X classes=C dataset_len=L".
 * Exit status: 0 ok, 1 a check failed, 2 a stoker call failed, 64 bad usage. */
#define CLIENT_NAME "client"
#include "client_steps.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(DLTensor) == 48, "DLTensor layout");
_Static_assert(sizeof(DLManagedTensorVersioned) == 80, "DLManagedTensorVersioned layout");

/* Checks the images tensor: version, device, dtype f32, shape [n, 3, side, side], compact
 * strides; reads every element so an unmapped page would fault here. */
static int check_images(const DLManagedTensorVersioned *t, uint32_t n, uint32_t side,
                        double *sum) {
    const DLTensor *d = &t->dl_tensor;
    CHECK(t->version.major == 1, "version %u.%u", t->version.major, t->version.minor);
    CHECK(t->deleter != NULL, "no deleter");
    CHECK((t->flags & DLPACK_FLAG_BITMASK_IS_COPIED) == 0, "flags %llu",
          (unsigned long long)t->flags);
    CHECK(d->device.device_type == kDLCPU && d->device.device_id == 0, "device %d:%d",
          (int)d->device.device_type, d->device.device_id);
    CHECK(d->ndim == 4, "ndim %d", d->ndim);
    CHECK(d->dtype.code == kDLFloat && d->dtype.bits == 32 && d->dtype.lanes == 1,
          "dtype %u/%u/%u", d->dtype.code, d->dtype.bits, d->dtype.lanes);
    CHECK(d->shape[0] == n && d->shape[1] == 3 && d->shape[2] == side && d->shape[3] == side,
          "shape [%lld, %lld, %lld, %lld]", (long long)d->shape[0], (long long)d->shape[1],
          (long long)d->shape[2], (long long)d->shape[3]);
    CHECK(d->strides != NULL && d->strides[3] == 1 && d->strides[2] == side &&
              d->strides[1] == (int64_t)side * side && d->strides[0] == 3LL * side * side,
          "strides not compact");
    CHECK(d->byte_offset == 0, "byte_offset %llu", (unsigned long long)d->byte_offset);
    CHECK(((uintptr_t)d->data % 256) == 0, "images not 256-byte aligned");
    const float *px = (const float *)d->data;
    size_t count = (size_t)n * 3 * side * side;
    for (size_t i = 0; i < count; i++) {
        CHECK(px[i] == px[i] && px[i] > -10.0f && px[i] < 10.0f, "pixel %zu is %f", i,
              (double)px[i]);
        *sum += px[i];
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 10) {
        fprintf(stderr,
                "usage: %s SOCKET DATASET BATCHES BATCH_SIZE SIDE [RANK WORLD_SIZE JOB SEED]\n",
                argv[0]);
        return 64;
    }
    const char *socket = argv[1];
    const char *dataset = argv[2];
    long batches = strtol(argv[3], NULL, 10);
    unsigned batch_size = (unsigned)strtoul(argv[4], NULL, 10);
    unsigned side = (unsigned)strtoul(argv[5], NULL, 10);
    char spec[256];
    snprintf(spec, sizeof spec,
             "{\"batch_size\": %u, \"crop\": {\"kind\": \"random_resized\", \"size\": [%u, %u], "
             "\"scale\": [0.08, 1.0], \"ratio\": [0.75, 1.3333333]}, \"dtype\": \"f32\"}",
             batch_size, side, side);

    stoker_attach_options o;
    stoker_result r = stoker_attach_options_init(&o);
    if (r != STOKER_OK) return failed_call("stoker_attach_options_init", r);
    CHECK(o.size == sizeof o && o.world_size == 1, "defaults");
    o.socket = socket;
    o.dataset = dataset;
    o.spec_json = spec;
    if (argc == 10) {
        o.rank = (uint32_t)strtoul(argv[6], NULL, 10);
        o.world_size = (uint32_t)strtoul(argv[7], NULL, 10);
        o.job = argv[8];
        o.seed = strtoull(argv[9], NULL, 10);
    }

    stoker_client *client = NULL;
    stoker_attach_info ai;
    int failed = attach_with_info(&o, &client, &ai);
    if (failed) return failed;
    CHECK(ai.slots > 0 && ai.batch_size == batch_size && ai.height == side && ai.width == side,
          "attach info: slots %u batch %u %ux%u", ai.slots, ai.batch_size, ai.height, ai.width);
    CHECK(ai.classes > 0 && ai.dataset_len > 0 && ai.steps_per_epoch > 0,
          "attach info: classes %llu len %llu steps %llu", (unsigned long long)ai.classes,
          (unsigned long long)ai.dataset_len, (unsigned long long)ai.steps_per_epoch);

    long got = 0;
    unsigned long long samples = 0, bad = 0;
    double sum = 0.0;
    for (; got < batches; got++) {
        stoker_batch *b = NULL;
        stoker_batch_header h;
        failed = next_batch(client, &b, &h);
        if (failed) return failed;
        if (b == NULL) break;
        CHECK(h.n >= 1 && h.n <= batch_size, "n %u", h.n);
        CHECK(h.slot < ai.slots, "slot %u of %u", h.slot, ai.slots);
        CHECK(h.step < ai.steps_per_epoch, "step %llu", (unsigned long long)h.step);

        DLManagedTensorVersioned *images = NULL, *labels = NULL, *indices = NULL;
        if ((r = stoker_batch_images(b, &images)) != STOKER_OK)
            return failed_call("stoker_batch_images", r);
        if ((r = stoker_batch_labels(b, &labels)) != STOKER_OK)
            return failed_call("stoker_batch_labels", r);
        if ((r = stoker_batch_indices(b, &indices)) != STOKER_OK)
            return failed_call("stoker_batch_indices", r);
        /* The batch handle may go first: the tensors keep the lease. */
        stoker_batch_release(b);

        int rc = check_images(images, h.n, side, &sum);
        if (rc) return rc;
        const DLTensor *lt = &labels->dl_tensor;
        CHECK(lt->ndim == 1 && lt->shape[0] == h.n, "labels shape");
        CHECK(lt->dtype.code == kDLInt && lt->dtype.bits == 64, "labels dtype");
        CHECK(lt->data == (const void *)h.labels, "labels tensor is not the ring's labels");
        CHECK(indices->dl_tensor.data == (const void *)h.indices, "indices not zero-copy");
        CHECK(indices->dl_tensor.dtype.code == kDLUInt && indices->dl_tensor.dtype.bits == 64,
              "indices dtype");
        printf("batch %llu %llu %u", (unsigned long long)h.epoch, (unsigned long long)h.step,
               h.n);
        for (uint32_t i = 0; i < h.n; i++) {
            CHECK(h.labels[i] >= 0 && (uint64_t)h.labels[i] < ai.classes, "label[%u] %lld", i,
                  (long long)h.labels[i]);
            CHECK(h.indices[i] < ai.dataset_len, "index[%u] %llu", i,
                  (unsigned long long)h.indices[i]);
            CHECK(h.status[i] <= 2, "status[%u] %u", i, h.status[i]);
            bad += h.status[i] != 0;
            printf(" %llu", (unsigned long long)h.indices[i]);
        }
        printf("\n");
        samples += h.n;

        /* The legacy wrapper owns the tensor it wraps: delete only the wrapper. */
        DLManagedTensor *legacy = NULL;
        if ((r = stoker_dlpack_to_legacy(indices, &legacy)) != STOKER_OK)
            return failed_call("stoker_dlpack_to_legacy", r);
        CHECK(legacy->dl_tensor.data == (const void *)h.indices, "legacy data");
        legacy->deleter(legacy);
        labels->deleter(labels);
        stoker_dlpack_delete(images);
    }
    stoker_detach(client);
    printf("summary batches=%ld samples=%llu bad=%llu classes=%llu dataset_len=%llu "
           "pixel_sum=%.3f version=%s\n",
           got, samples, bad, (unsigned long long)ai.classes,
           (unsigned long long)ai.dataset_len, sum, stoker_version());
    return 0;
}
