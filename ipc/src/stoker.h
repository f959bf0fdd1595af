/* stoker.h: the C ABI of libstoker, the client of the stoker daemon (stokerd).
 *
 * Written by hand to match ipc/src/capi.rs; a Rust test checks that both name the same
 * functions, and a C test compiles this header on its own as C11.
 *
 * Usage:
 *   stoker_attach_options o = {0};
 *   o.struct_size = sizeof o; o.job = "run-1"; o.rank = 0; o.world_size = 1;
 *   o.spec_json = "{\"batch_size\": 64, \"crop\": {\"kind\": \"random_resized\", ...}}";
 *   o.dataset = "/data/train";
 *   stoker_client *c;
 *   if (stoker_attach(&o, &c) != STOKER_OK) fprintf(stderr, "%s\n", stoker_last_error());
 *   stoker_batch *b;
 *   while (stoker_next(c, &b) == STOKER_OK) {
 *       stoker_batch_info info = { .struct_size = sizeof info };
 *       stoker_batch_get_info(b, &info);   ... use info.images, info.labels ...
 *       stoker_batch_free(b);          releases the slot (once its tensors are freed too)
 *   }
 *   stoker_detach(c);
 *
 * Threads: a client is used by one thread at a time; batches and tensors may be freed from
 * any thread. stoker_last_error() is per thread.
 */
#ifndef STOKER_H
#define STOKER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum stoker_result {
    STOKER_OK = 0,
    STOKER_END = 1,                    /* stoker_next: the data has ended */
    STOKER_ERR_INVALID_ARGUMENT = -1,
    STOKER_ERR_NO_DAEMON = -2,         /* no daemon listens at the socket */
    STOKER_ERR_DISCONNECTED = -3,      /* the daemon went away: attach again, resume */
    STOKER_ERR_REFUSED = -4,           /* spec mismatch, rank taken, unknown dataset, ... */
    STOKER_ERR_PROTOCOL = -5,
    STOKER_ERR_INTERNAL = -6
} stoker_result;

typedef struct stoker_client stoker_client;
typedef struct stoker_batch stoker_batch;

typedef struct stoker_attach_options {
    uint32_t struct_size;      /* sizeof(stoker_attach_options) */
    uint32_t rank;
    uint32_t world_size;
    const char *socket;        /* NULL: $STOKER_SOCKET, /run/stoker/stoker.sock, ... */
    const char *job;           /* the job key, the same for every rank */
    const char *device;        /* NULL or "cpu", or a GPU UUID */
    const char *spec_json;     /* the pipeline spec, JSON */
    const char *dataset;       /* a registered dataset name or a path */
    uint64_t seed;
    uint64_t start_epoch;
    uint64_t start_step;
} stoker_attach_options;

typedef struct stoker_client_info {
    uint32_t struct_size;
    uint32_t slots;
    uint64_t steps_per_epoch;
    uint64_t dataset_len;
    uint64_t classes;
    uint64_t slot_bytes;
    uint64_t ring_bytes;
} stoker_client_info;

#define STOKER_DTYPE_U8 0
#define STOKER_DTYPE_F16 1
#define STOKER_DTYPE_BF16 2
#define STOKER_DTYPE_F32 3
#define STOKER_LAYOUT_NCHW 0
#define STOKER_LAYOUT_NHWC 1

typedef struct stoker_batch_info {
    uint32_t struct_size;
    uint32_t n;                /* samples in this batch */
    uint64_t epoch;
    uint64_t step;
    const void *images;        /* n images, image_bytes each */
    uint64_t image_bytes;
    const int64_t *labels;     /* n */
    const uint64_t *indices;   /* n global sample indices */
    const uint8_t *status;     /* n: 0 ok, 1 replaced, 2 failed, 3 empty */
    uint32_t height;
    uint32_t width;
    uint32_t channels;
    uint32_t dtype;            /* STOKER_DTYPE_* */
    uint32_t layout;           /* STOKER_LAYOUT_* */
} stoker_batch_info;

/* DLPack 1.0 (https://github.com/dmlc/dlpack), declared here unless dlpack.h came first. */
#ifndef DLPACK_VERSION
typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;
typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif

#define STOKER_TENSOR_IMAGES 0u    /* [n,3,H,W] or [n,H,W,3], the spec's dtype */
#define STOKER_TENSOR_LABELS 1u    /* [n] int64 */
#define STOKER_TENSOR_INDICES 2u   /* [n] uint64 */
#define STOKER_TENSOR_STATUS 3u    /* [n] uint8 */

/* The message of the last failed call on this thread ("" if none). */
const char *stoker_last_error(void);
uint32_t stoker_protocol_version(void);

stoker_result stoker_attach(const stoker_attach_options *opts, stoker_client **out);
void stoker_detach(stoker_client *client);
stoker_result stoker_client_get_info(const stoker_client *client, stoker_client_info *info);
/* Where to resume: the batch after the last one received. */
stoker_result stoker_position(const stoker_client *client, uint64_t *epoch, uint64_t *step);

/* Blocks for the next batch: STOKER_OK and *out set, or STOKER_END and *out NULL. */
stoker_result stoker_next(stoker_client *client, stoker_batch **out);
stoker_result stoker_batch_get_info(const stoker_batch *batch, stoker_batch_info *info);
/* Frees the handle; the slot is released once every tensor made from it is freed too. */
void stoker_batch_free(stoker_batch *batch);
/* A zero-copy DLPack view of one part of the batch; free it with its deleter. */
stoker_result stoker_batch_dlpack(const stoker_batch *batch, uint32_t which,
                                  DLManagedTensorVersioned **out);

#ifdef __cplusplus
}
#endif

#endif /* STOKER_H */
