/* A C client of libstoker on a GPU: attaches with a device ("cuda:N" or a GPU UUID), checks
 * that each images tensor is on kDLCUDA with the client's ordinal and views the slot (its data
 * is the header's device address), copies every batch back with
 * stoker_batch_copy_images_to_host and writes it to DUMP for the test to compare with the CPU
 * backend's batches. Releases are fenced on the legacy default stream (stoker_batch_record_stream
 * with 1).
 *
 * Includes only stoker.h (and client_steps.h, the steps both C clients share) and builds as
 * C11 with -Wall -Wextra -Werror -pedantic. Run by
 * tests/cuda_clients.rs against a real stokerd serving from the emulated GPU.
 *
 * usage: cuda_client SOCKET DATASET SPEC_JSON DEVICE RANK WORLD_SIZE JOB SEED DUMP
 *
 * DUMP holds per batch, little-endian: u64 epoch, u64 step, u32 n, u32 0, n x u64 indices,
 * n x i64 labels, n x u8 status, u64 image bytes, the images.
 * Exit status: 0 ok, 1 a check failed, 2 a stoker call failed, 64 bad usage. */
#define CLIENT_NAME "cuda_client"
#include "client_steps.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int write_batch(FILE *f, const stoker_batch_header *h, const void *images) {
    uint32_t zero = 0;
    int ok = fwrite(&h->epoch, 8, 1, f) == 1 && fwrite(&h->step, 8, 1, f) == 1 &&
             fwrite(&h->n, 4, 1, f) == 1 && fwrite(&zero, 4, 1, f) == 1 &&
             fwrite(h->indices, 8, h->n, f) == h->n && fwrite(h->labels, 8, h->n, f) == h->n &&
             fwrite(h->status, 1, h->n, f) == h->n &&
             fwrite(&h->images_bytes, 8, 1, f) == 1 &&
             fwrite(images, 1, h->images_bytes, f) == h->images_bytes;
    CHECK(ok, "writing the dump");
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 10) {
        fprintf(stderr,
                "usage: %s SOCKET DATASET SPEC_JSON DEVICE RANK WORLD_SIZE JOB SEED DUMP\n",
                argv[0]);
        return 64;
    }
    stoker_attach_options o;
    stoker_result r = stoker_attach_options_init(&o);
    if (r != STOKER_OK) return failed_call("stoker_attach_options_init", r);
    o.socket = argv[1];
    o.dataset = argv[2];
    o.spec_json = argv[3];
    o.device = argv[4];
    o.rank = (uint32_t)strtoul(argv[5], NULL, 10);
    o.world_size = (uint32_t)strtoul(argv[6], NULL, 10);
    o.job = argv[7];
    o.seed = strtoull(argv[8], NULL, 10);
    FILE *dump = fopen(argv[9], "wb");
    CHECK(dump != NULL, "cannot open %s", argv[9]);

    stoker_client *client = NULL;
    stoker_attach_info ai;
    int failed = attach_with_info(&o, &client, &ai);
    if (failed) return failed;
    CHECK(ai.image_memory == 1 && ai.device_id >= 0, "attach info: image memory %u device %d",
          ai.image_memory, ai.device_id);

    long got = 0;
    for (;;) {
        stoker_batch *b = NULL;
        stoker_batch_header h;
        failed = next_batch(client, &b, &h);
        if (failed) return failed;
        if (b == NULL) break;
        CHECK(h.images_device_type == kDLCUDA && h.images_device_id == ai.device_id,
              "header device %d:%d", h.images_device_type, h.images_device_id);
        DLManagedTensorVersioned *images = NULL;
        if ((r = stoker_batch_images(b, &images)) != STOKER_OK)
            return failed_call("stoker_batch_images", r);
        const DLTensor *d = &images->dl_tensor;
        CHECK(d->device.device_type == kDLCUDA && d->device.device_id == ai.device_id,
              "tensor device %d:%d", (int)d->device.device_type, d->device.device_id);
        CHECK((uint64_t)(uintptr_t)d->data == h.images, "tensor data is not the slot");
        CHECK(((uintptr_t)d->data % 256) == 0, "images not 256-byte aligned");
        void *host = malloc(h.images_bytes);
        CHECK(host != NULL, "malloc");
        r = stoker_batch_copy_images_to_host(b, host, h.images_bytes);
        if (r != STOKER_OK) return failed_call("stoker_batch_copy_images_to_host", r);
        int rc = write_batch(dump, &h, host);
        free(host);
        if (rc) return rc;
        if ((r = stoker_batch_record_stream(b, 1)) != STOKER_OK)
            return failed_call("stoker_batch_record_stream", r);
        stoker_batch_release(b);
        stoker_dlpack_delete(images);
        got++;
    }
    stoker_detach(client);
    CHECK(fclose(dump) == 0, "closing the dump");
    printf("summary batches=%ld device=%d\n", got, ai.device_id);
    return 0;
}
