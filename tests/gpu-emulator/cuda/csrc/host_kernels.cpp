// Host builds of stoker's CUDA kernels, for the emulated driver's cuLaunchKernel.
//
// The .cu sources are included unchanged behind a shim for CUDA's built-ins. The built-in
// index variables are thread_local: two streams may run kernels at the same time. Each entry
// reads its arguments out of the parameter buffer the driver packed from the cubin's own
// parameter table, at the offsets the C++ ABI gives them; a disagreement shows as wrong
// results, as it would on a GPU.

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct dim3 {
    unsigned x, y, z;
};
static thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
static inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

#include "augment.cu"

template <class F>
static void run_grid(const unsigned* grid, const unsigned* block, F body) {
    gridDim = dim3{grid[0], grid[1], grid[2]};
    blockDim = dim3{block[0], block[1], block[2]};
    for (unsigned bz = 0; bz < grid[2]; ++bz)
        for (unsigned by = 0; by < grid[1]; ++by)
            for (unsigned bx = 0; bx < grid[0]; ++bx)
                for (unsigned tz = 0; tz < block[2]; ++tz)
                    for (unsigned ty = 0; ty < block[1]; ++ty)
                        for (unsigned tx = 0; tx < block[0]; ++tx) {
                            blockIdx = dim3{bx, by, bz};
                            threadIdx = dim3{tx, ty, tz};
                            body();
                        }
}

template <class T>
static T arg(const unsigned char* p, size_t offset) {
    T v;
    memcpy(&v, p + offset, sizeof v);
    return v;
}

static void run_augment(const unsigned char* p, const unsigned* g, const unsigned* b) {
    AugmentBatch batch = arg<AugmentBatch>(p, 0);
    run_grid(g, b, [&] { stoker_augment(batch); });
}

static void run_fill_pattern(const unsigned char* p, const unsigned* g, const unsigned* b) {
    u8* dst = arg<u8*>(p, 0);
    u64 n = arg<u64>(p, 8);
    u32 seed = arg<u32>(p, 16);
    run_grid(g, b, [&] { stoker_fill_pattern(dst, n, seed); });
}

static void run_check_pattern(const unsigned char* p, const unsigned* g, const unsigned* b) {
    const u8* src = arg<const u8*>(p, 0);
    u64 n = arg<u64>(p, 8);
    u32 seed = arg<u32>(p, 16);
    u32* mismatches = arg<u32*>(p, 24);
    run_grid(g, b, [&] { stoker_check_pattern(src, n, seed, mismatches); });
}

static void run_op_step(const unsigned char* p, const unsigned* g, const unsigned* b) {
    OpsBatch batch = arg<OpsBatch>(p, 0);
    run_grid(g, b, [&] { stoker_op_step(batch); });
}

static void run_op_stats(const unsigned char* p, const unsigned* g, const unsigned* b) {
    OpsBatch batch = arg<OpsBatch>(p, 0);
    run_grid(g, b, [&] { stoker_op_stats(batch); });
}

static void run_op_convert(const unsigned char* p, const unsigned* g, const unsigned* b) {
    FinishBatch batch = arg<FinishBatch>(p, 0);
    run_grid(g, b, [&] { stoker_op_convert(batch); });
}

static void run_op_erase(const unsigned char* p, const unsigned* g, const unsigned* b) {
    FinishBatch batch = arg<FinishBatch>(p, 0);
    run_grid(g, b, [&] { stoker_op_erase(batch); });
}

static void run_mix(const unsigned char* p, const unsigned* g, const unsigned* b) {
    MixBatch batch = arg<MixBatch>(p, 0);
    run_grid(g, b, [&] { stoker_mix(batch); });
}

struct HostKernel {
    const char* name;
    long long param_bytes;  // as the cubin's parameter bank holds them (last offset + size)
    void (*run)(const unsigned char*, const unsigned*, const unsigned*);
};

static const HostKernel KERNELS[] = {
    {"stoker_augment", (long long)sizeof(AugmentBatch), run_augment},
    {"stoker_op_step", (long long)sizeof(OpsBatch), run_op_step},
    {"stoker_op_stats", (long long)sizeof(OpsBatch), run_op_stats},
    {"stoker_op_convert", (long long)sizeof(FinishBatch), run_op_convert},
    {"stoker_op_erase", (long long)sizeof(FinishBatch), run_op_erase},
    {"stoker_mix", (long long)sizeof(MixBatch), run_mix},
    {"stoker_fill_pattern", 8 + 8 + 4, run_fill_pattern},
    {"stoker_check_pattern", 8 + 8 + 8 + 8, run_check_pattern},
};

static const HostKernel* find(const char* name) {
    for (const HostKernel& k : KERNELS) {
        if (strcmp(k.name, name) == 0) return &k;
    }
    return nullptr;
}

extern "C" long long stoker_emu_host_kernel_params(const char* name) {
    const HostKernel* k = find(name);
    return k ? k->param_bytes : -1;
}

extern "C" int stoker_emu_run_host_kernel(const char* name, const unsigned char* params,
                                          const unsigned* grid, const unsigned* block) {
    const HostKernel* k = find(name);
    if (!k) return 1;
    k->run(params, grid, block);
    return 0;
}
