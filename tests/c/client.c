/* A C client of stokerd through libstoker: attaches, reads every batch, checks each DLPack
 * tensor's shape and that it views the ring (same pointer as the batch info), and prints
 * "batches B samples N index_sum S". Usage: client SOCKET DATASET SPEC_JSON */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "stoker.h"

#define CHECK(cond, ...)                      \
    do {                                      \
        if (!(cond)) {                        \
            fprintf(stderr, __VA_ARGS__);     \
            fprintf(stderr, "\n");            \
            return 1;                         \
        }                                     \
    } while (0)

int main(int argc, char **argv) {
    CHECK(argc == 4, "usage: client SOCKET DATASET SPEC_JSON");
    stoker_attach_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.socket = argv[1];
    o.dataset = argv[2];
    o.spec_json = argv[3];
    o.job = "c-client";
    o.rank = 0;
    o.world_size = 1;
    o.seed = 5;
    stoker_client *c = NULL;
    stoker_result r = stoker_attach(&o, &c);
    CHECK(r == STOKER_OK, "attach: %d %s", (int)r, stoker_last_error());

    stoker_client_info ci;
    memset(&ci, 0, sizeof ci);
    ci.struct_size = sizeof ci;
    CHECK(stoker_client_get_info(c, &ci) == STOKER_OK, "info: %s", stoker_last_error());

    uint64_t batches = 0, samples = 0, index_sum = 0;
    stoker_batch *b = NULL;
    while ((r = stoker_next(c, &b)) == STOKER_OK) {
        stoker_batch_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        CHECK(stoker_batch_get_info(b, &info) == STOKER_OK, "batch info: %s",
              stoker_last_error());
        CHECK(info.step == batches, "step %" PRIu64 " after %" PRIu64, info.step, batches);
        DLManagedTensorVersioned *t = NULL;
        CHECK(stoker_batch_dlpack(b, STOKER_TENSOR_IMAGES, &t) == STOKER_OK, "dlpack: %s",
              stoker_last_error());
        CHECK(t->version.major == 1, "dlpack version");
        CHECK(t->dl_tensor.ndim == 4, "ndim %d", t->dl_tensor.ndim);
        CHECK(t->dl_tensor.shape[0] == (int64_t)info.n, "shape[0]");
        CHECK(t->dl_tensor.shape[1] == 3, "shape[1] %" PRId64, t->dl_tensor.shape[1]);
        CHECK(t->dl_tensor.data == info.images, "the tensor must view the ring, not a copy");
        CHECK(t->dl_tensor.device.device_type == 1, "kDLCPU");
        stoker_batch_free(b); /* the tensor still holds the lease */
        const volatile uint8_t *px = (const uint8_t *)t->dl_tensor.data;
        (void)px[info.n * info.image_bytes - 1];
        for (uint32_t i = 0; i < info.n; i++) {
            CHECK(info.status[i] == 0, "status %u", info.status[i]);
            index_sum += info.indices[i];
        }
        t->deleter(t);
        samples += info.n;
        batches++;
    }
    CHECK(r == STOKER_END, "next: %d %s", (int)r, stoker_last_error());
    CHECK(batches == ci.steps_per_epoch, "batches %" PRIu64 " of %" PRIu64, batches,
          ci.steps_per_epoch);
    uint64_t epoch = 0, step = 0;
    CHECK(stoker_position(c, &epoch, &step) == STOKER_OK, "position");
    CHECK(epoch == 1 && step == 0, "position %" PRIu64 ",%" PRIu64, epoch, step);
    stoker_detach(c);
    printf("batches %" PRIu64 " samples %" PRIu64 " index_sum %" PRIu64 "\n", batches, samples,
           index_sum);
    return 0;
}
