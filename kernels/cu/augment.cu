// stoker's augmentation kernels, compiled at run time by NVRTC (see docs/cuda.md).
//
// Self-contained: no system headers, only NVRTC's built-ins, so the same file compiles in CI
// from the PyPI NVRTC wheel without a CUDA toolkit. Every entry point is extern "C" so its
// name is stable. The structs below are mirrored, field for field, by #[repr(C)] types in
// kernels/src/augment.rs, whose tests check sizes and offsets.
//
// stoker_augment: one launch per output batch. For each sample it takes the crop box of the
// decoded RGB image, resizes it to out_h x out_w with torchvision's resize(antialias=True)
// bilinear (= Pillow's separable triangle filter), flips it if asked, normalises, converts
// to the output dtype and writes it in the output layout straight into the slot. The math is
// the CPU reference's (docs/augment.md):
//   scale = crop / out; fs = max(scale, 1); support = fs; center = x0 + (o + 0.5) * scale
//   taps xmin = max(floor(center - support + 0.5), 0), xmax = min(floor(center + support + 0.5), size)
//   w(x) = tri((x - center + 0.5) / fs), tri(t) = max(0, 1 - |t|), normalised to sum 1
//   value = sum_y wy * sum_x wx * pixel   (0..255)
//   flip: output column ox takes the value computed for column out_w - 1 - ox
//   u8: clamp(round_half_away(value), 0, 255); float: (value / 255 - mean[c]) / std[c],
//   stored as f32, or as f16 / bf16 rounded to nearest even.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// Output dtypes and layouts (kernels::augment::{DTYPE_*, LAYOUT_*}).
#define DTYPE_U8 0u
#define DTYPE_F16 1u
#define DTYPE_BF16 2u
#define DTYPE_F32 3u
#define LAYOUT_NCHW 0u
#define LAYOUT_NHWC 1u

// One sample of a batch: 64 bytes.
struct AugmentSample {
    u64 src;      // device address of the decoded image, packed RGB u8
    u64 pitch;    // bytes from one row of src to the next
    u32 width;    // of the decoded image
    u32 height;
    u32 flip;     // nonzero: mirror horizontally
    u32 zero;     // nonzero: write zeros (a failed sample or padding), read nothing
    double crop_x; // crop box in the decoded image's pixel coordinates
    double crop_y;
    double crop_w;
    double crop_h;
};

// One batch, passed by value: 72 bytes.
struct AugmentBatch {
    u64 dst;          // device address of image 0 of the slot
    u64 samples;      // device address of n AugmentSample
    u64 image_bytes;  // bytes from one output image to the next
    u32 n;
    u32 out_w;
    u32 out_h;
    u32 dtype;
    u32 layout;
    u32 clamp_to_crop; // nonzero: taps stay inside the crop box widened to whole pixels
    float mean[3];
    float std[3];
};

// The taps of one output coordinate along one axis.
struct Taps {
    int min;        // first source index
    int count;      // number of taps
    float c;        // center - min - 0.5: weight(k) = tri((k - c) * inv_fs) for k in 0..count
    float inv_fs;
    float inv_sum;  // 1 / sum of the raw weights
};

__device__ __forceinline__ float tri(float t) {
    float a = 1.0f - fabsf(t);
    return a > 0.0f ? a : 0.0f;
}

// The readable window [lo, hi) of an axis of `size` samples for a box [x0, x0 + crop): the
// whole axis, or with clamp the box widened to whole pixels (reference::tap_window).
__device__ void tap_window(double x0, double crop, u32 size, u32 clamp, int* lo, int* hi) {
    *lo = 0;
    *hi = (int)size;
    if (clamp) {
        double a = floor(x0);
        double b = ceil(x0 + crop);
        a = a < 0.0 ? 0.0 : a;
        b = b > (double)size ? (double)size : b;
        if (a < b) {
            *lo = (int)a;
            *hi = (int)b;
        }
    }
}

__device__ Taps taps(double x0, double crop, u32 out, u32 o, u32 size, u32 clamp) {
    int win_lo, win_hi;
    tap_window(x0, crop, size, clamp, &win_lo, &win_hi);
    double scale = crop / (double)out;
    double fs = scale > 1.0 ? scale : 1.0;
    double center = x0 + ((double)o + 0.5) * scale;
    double lo = floor(center - fs + 0.5);
    double hi = floor(center + fs + 0.5);
    int xmin = lo < (double)win_lo ? win_lo : (int)lo;
    int xmax = hi > (double)win_hi ? win_hi : (int)hi;
    Taps t;
    t.min = xmin;
    t.count = xmax - xmin;
    t.c = (float)(center - (double)xmin - 0.5);
    t.inv_fs = (float)(1.0 / fs);
    float sum = 0.0f;
    for (int k = 0; k < t.count; ++k) {
        sum += tri(((float)k - t.c) * t.inv_fs);
    }
    if (!(sum > 0.0f)) {
        // Only for a box outside the image: the nearest edge sample, weight 1 (as the CPU
        // reference does).
        double f = floor(center);
        int nearest = f < (double)win_lo ? win_lo : (int)f;
        t.min = nearest > win_hi - 1 ? win_hi - 1 : nearest;
        t.count = 1;
        t.c = 0.0f;
        t.inv_fs = 1.0f;
        sum = 1.0f;
    }
    t.inv_sum = 1.0f / sum;
    return t;
}

// f32 -> IEEE binary16, round to nearest even, with subnormals, infinities and NaN.
__device__ u16 f32_to_f16(float f) {
    u32 x = __float_as_uint(f);
    u32 sign = (x >> 16) & 0x8000u;
    u32 ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {
        return (u16)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    }
    if (ax >= 0x477ff000u) {  // >= 65520 rounds to infinity
        return (u16)(sign | 0x7c00u);
    }
    if (ax < 0x38800000u) {  // below 2^-14: subnormal half or zero
        if (ax <= 0x33000000u) {  // <= 2^-25 rounds to zero (the tie goes to even 0)
            return (u16)sign;
        }
        u32 e = ax >> 23;
        u32 m = (ax & 0x7fffffu) | 0x800000u;
        u32 shift = 126u - e;
        u32 h = m >> shift;
        u32 rem = m & ((1u << shift) - 1u);
        u32 half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u))) {
            h += 1u;
        }
        return (u16)(sign | h);
    }
    u32 h = (ax - 0x38000000u) >> 13;
    u32 rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) {
        h += 1u;
    }
    return (u16)(sign | h);
}

// f32 -> bfloat16, round to nearest even; NaN stays a quiet NaN.
__device__ u16 f32_to_bf16(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((x >> 16) | 0x0040u);
    }
    x += 0x7fffu + ((x >> 16) & 1u);
    return (u16)(x >> 16);
}

__device__ __forceinline__ void store(const AugmentBatch& b, u8* img, u64 elem, u32 c, float v) {
    switch (b.dtype) {
    case DTYPE_U8: {
        float r = roundf(v);  // half away from zero
        r = r < 0.0f ? 0.0f : (r > 255.0f ? 255.0f : r);
        img[elem] = (u8)r;
        break;
    }
    case DTYPE_F16:
        ((u16*)img)[elem] = f32_to_f16((v / 255.0f - b.mean[c]) / b.std[c]);
        break;
    case DTYPE_BF16:
        ((u16*)img)[elem] = f32_to_bf16((v / 255.0f - b.mean[c]) / b.std[c]);
        break;
    default:
        ((float*)img)[elem] = (v / 255.0f - b.mean[c]) / b.std[c];
        break;
    }
}

__device__ __forceinline__ void store_zero(const AugmentBatch& b, u8* img, u64 elem) {
    switch (b.dtype) {
    case DTYPE_U8:
        img[elem] = 0;
        break;
    case DTYPE_F16:
    case DTYPE_BF16:
        ((u16*)img)[elem] = 0;
        break;
    default:
        ((float*)img)[elem] = 0.0f;
        break;
    }
}

// Grid: x over output columns, y over output rows, z over samples (looping when n > gridDim.z).
// One thread computes the three channels of one output pixel.
extern "C" __global__ void stoker_augment(AugmentBatch b) {
    u32 ox = blockIdx.x * blockDim.x + threadIdx.x;
    u32 oy = blockIdx.y * blockDim.y + threadIdx.y;
    if (ox >= b.out_w || oy >= b.out_h) {
        return;
    }
    const AugmentSample* samples = (const AugmentSample*)b.samples;
    u64 plane = (u64)b.out_w * b.out_h;
    u64 pix = (u64)oy * b.out_w + ox;
    for (u32 i = blockIdx.z; i < b.n; i += gridDim.z) {
        const AugmentSample s = samples[i];
        u8* img = (u8*)(b.dst + (u64)i * b.image_bytes);
        u64 elem[3];
        for (u32 c = 0; c < 3; ++c) {
            elem[c] = b.layout == LAYOUT_NHWC ? pix * 3u + c : (u64)c * plane + pix;
        }
        if (s.zero) {
            for (u32 c = 0; c < 3; ++c) {
                store_zero(b, img, elem[c]);
            }
            continue;
        }
        u32 sx = s.flip ? b.out_w - 1u - ox : ox;
        Taps tx = taps(s.crop_x, s.crop_w, b.out_w, sx, s.width, b.clamp_to_crop);
        Taps ty = taps(s.crop_y, s.crop_h, b.out_h, oy, s.height, b.clamp_to_crop);
        const u8* src = (const u8*)s.src;
        float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f;
        for (int ky = 0; ky < ty.count; ++ky) {
            float wy = tri(((float)ky - ty.c) * ty.inv_fs) * ty.inv_sum;
            const u8* row = src + (u64)(ty.min + ky) * s.pitch + (u64)tx.min * 3u;
            float r0 = 0.0f, r1 = 0.0f, r2 = 0.0f;
            for (int kx = 0; kx < tx.count; ++kx) {
                float wx = tri(((float)kx - tx.c) * tx.inv_fs);
                r0 += wx * (float)row[kx * 3 + 0];
                r1 += wx * (float)row[kx * 3 + 1];
                r2 += wx * (float)row[kx * 3 + 2];
            }
            acc0 += wy * (r0 * tx.inv_sum);
            acc1 += wy * (r1 * tx.inv_sum);
            acc2 += wy * (r2 * tx.inv_sum);
        }
        store(b, img, elem[0], 0, acc0);
        store(b, img, elem[1], 1, acc1);
        store(b, img, elem[2], 2, acc2);
    }
}

// The byte stoker_fill_pattern writes at index i (mirrored by kernels::augment::pattern_byte).
__device__ __forceinline__ u8 pattern_byte(u64 i, u32 seed) {
    u64 x = (i ^ ((u64)seed << 32)) * 0x9e3779b97f4a7c15ull;
    return (u8)(x >> 56);
}

// Self-test: fills n bytes with a pattern a second process can check (IPC across processes).
extern "C" __global__ void stoker_fill_pattern(u8* dst, u64 n, u32 seed) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        dst[i] = pattern_byte(i, seed);
    }
}

// Self-test: counts bytes that differ from the pattern into *mismatches.
extern "C" __global__ void stoker_check_pattern(const u8* src, u64 n, u32 seed, u32* mismatches) {
    u32 bad = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        bad += src[i] != pattern_byte(i, seed) ? 1u : 0u;
    }
    if (bad) {
        atomicAdd(mismatches, bad);
    }
}
