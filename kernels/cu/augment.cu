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

// ---------------------------------------------------------------------------------------------
// The operations of a view (docs/augment.md, "On the GPU"): torchvision's uint8 arithmetic as
// daemon/pipeline/src/transform/ops computes it on the CPU, on the view's 8-bit crop (packed
// RGB, height x width, one image after another). The host draws every sample's steps with the
// CPU backend's code and lowers each to an OpStep (kernels/src/ops.rs mirrors the structs);
// one stoker_op_step launch per step position reads one buffer and writes the other
// (ping-pong), a sample with fewer steps copies. Contrast, equalize and autocontrast need a
// per-image statistic first: stoker_op_stats, one thread per image channel, before the step.
// Then stoker_op_convert normalises into the slot and stoker_op_erase writes RandomErasing's
// box. No __syncthreads anywhere (the emulated GPU runs threads one after another).

#define OP_NONE 0u
#define OP_BRIGHTNESS 1u
#define OP_CONTRAST 2u
#define OP_SATURATION 3u
#define OP_HUE 4u
#define OP_SHARPNESS 5u
#define OP_GRAYSCALE 6u
#define OP_BLUR 7u
#define OP_SOLARIZE 8u
#define OP_POSTERIZE 9u
#define OP_EQUALIZE 10u
#define OP_AUTOCONTRAST 11u
#define OP_INVERT 12u
#define OP_VFLIP 13u
#define OP_WARP 14u
#define OP_ROT90 15u

// One step of one sample: 64 bytes.
struct OpStep {
    u32 kind;  // OP_*
    u32 i[3];  // blur: taps across, taps down, first weight in the pool; posterize: mask;
               // warp: 1 for bilinear; rot90: quarter turns
    float f[12];  // factor / threshold in f[0]; warp: ax bx cx ay by cy, fill in f[6..9]
};

// The statistics of one image a step needs (written by stoker_op_stats): 784 bytes.
struct OpStats {
    float mean;  // contrast: mean of the floored luma
    u32 pad[3];
    u8 lut[768];  // equalize / autocontrast: a table per channel
};
static_assert(sizeof(OpStats) == 784, "OpStats: kernels::ops::OP_STATS_BYTES");

// One step position of a batch, passed by value: 64 bytes.
struct OpsBatch {
    u64 src;      // n images of height * width * 3 bytes
    u64 dst;
    u64 steps;    // OpStep[n * max_steps]
    u64 weights;  // float pool of the blur kernels
    u64 stats;    // OpStats[n]
    u32 n;
    u32 width;
    u32 height;
    u32 max_steps;
    u32 step;     // the position launched
    u32 pad;
};

// OpsHead::erase: nothing, the box filled with value[c], or with the values drawn per element.
#define ERASE_FILL 1u
#define ERASE_RANDOM 2u

// What the last kernels do per sample: 40 bytes.
struct OpsHead {
    u32 zero;   // nonzero: write zeros (a failed sample), erase nothing
    u32 erase;  // 0, ERASE_FILL or ERASE_RANDOM
    u32 top;
    u32 left;
    u32 height;
    u32 width;
    float value[3];  // ERASE_FILL: the erased value per channel, in output units
    u32 values;      // ERASE_RANDOM: index of the box's 3 * height * width values in the pool
};

// The conversion of a batch into the slot and its erasing, passed by value: 80 bytes.
struct FinishBatch {
    u64 src;    // stoker_op_convert: the 8-bit crops; stoker_op_erase: the float pool of
                // ERASE_RANDOM's values
    u64 dst;    // image 0 of the slot
    u64 heads;  // OpsHead[n]
    u64 image_bytes;
    u32 n;
    u32 out_w;
    u32 out_h;
    u32 dtype;
    u32 layout;
    u32 pad;
    float mean[3];
    float std[3];
};

__device__ __forceinline__ float luma(const u8* p) {
    return (float)p[0] * 0.2989f + (float)p[1] * 0.587f + (float)p[2] * 0.114f;
}

// .clamp_(0, 255).to(uint8): clamped, truncated.
__device__ __forceinline__ u8 trunc_u8(float v) {
    v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
    return (u8)v;
}

// .round_() (half to even) then .to(uint8).
__device__ __forceinline__ u8 round_even_u8(float v) {
    v = rintf(v);
    v = v < 0.0f ? 0.0f : (v > 255.0f ? 255.0f : v);
    return (u8)v;
}

__device__ __forceinline__ u8 blend_u8(u8 v, float other, float ratio) {
    return trunc_u8((float)v * ratio + other * (1.0f - ratio));
}

// Index pos - radius reflected into 0..n without repeating the edge (colour.rs, reflect).
__device__ u32 reflect_index(u32 pos, u32 radius, u32 n) {
    if (n == 1u) {
        return 0u;
    }
    u32 period = 2u * (n - 1u);
    u32 i = (pos + period * ((radius + period - 1u) / period) - radius) % period;
    return i >= n ? period - i : i;
}

__device__ void hue_pixel(const u8* p, float factor, u8* out) {
    float r = (float)p[0] * (1.0f / 255.0f);
    float g = (float)p[1] * (1.0f / 255.0f);
    float b = (float)p[2] * (1.0f / 255.0f);
    float maxc = fmaxf(fmaxf(r, g), b);
    float minc = fminf(fminf(r, g), b);
    bool eqc = maxc == minc;
    float range = maxc - minc;
    float s = range / (eqc ? 1.0f : maxc);
    float divisor = eqc ? 1.0f : range;
    float rc = (maxc - r) / divisor, gc = (maxc - g) / divisor, bc = (maxc - b) / divisor;
    bool max_r = maxc == r, max_g = maxc == g;
    float hr = max_r ? bc - gc : 0.0f;
    float hg = (max_g && !max_r) ? rc + 2.0f - bc : 0.0f;
    float hb = (!max_r && !max_g) ? gc + 4.0f - rc : 0.0f;
    float h = (hr + hg + hb) * (1.0f / 6.0f) + 1.0f;
    h = h >= 1.0f ? h - 1.0f : h;
    float t = h + factor;
    t = t < 0.0f ? t + 1.0f : (t >= 1.0f ? t - 1.0f : t);
    float h6 = t * 6.0f;
    int i = (int)h6;
    float f = h6 - (float)i;
    i = i >= 6 ? i - 6 : i;
    float v = maxc;
    float sxf = s * f, one_minus_s = 1.0f - s;
    float q = fminf(fmaxf((1.0f - sxf) * v, 0.0f), 1.0f);
    float tt = fminf(fmaxf((sxf + one_minus_s) * v, 0.0f), 1.0f);
    float pp = fminf(fmaxf(one_minus_s * v, 0.0f), 1.0f);
    const float rs[6] = {v, q, pp, pp, tt, v};
    const float gs[6] = {tt, v, v, q, pp, pp};
    const float bs[6] = {pp, pp, tt, v, v, q};
    const float scale = 255.0f + 1.0f - 1e-3f;
    float o[3] = {rs[i] * scale, gs[i] * scale, bs[i] * scale};
    for (int c = 0; c < 3; ++c) {
        out[c] = trunc_u8(o[c]);
    }
}

// The source pixel (x, y) of a warp, or the fill; as geometry.rs's warp.
__device__ void warp_pixel(const OpStep& s, const u8* src, u32 w, u32 h, u32 x, u32 y, u8* out) {
    float wf = (float)w, hf = (float)h;
    // torch.linspace((1 - n) / 2, (n - 1) / 2, n) in f32, as ops::linspace.
    float xs0 = (1.0f - wf) * 0.5f, xs1 = (wf - 1.0f) * 0.5f;
    float ys0 = (1.0f - hf) * 0.5f, ys1 = (hf - 1.0f) * 0.5f;
    float xc = xs0, yc = ys0;
    if (w > 1u) {
        float st = (xs1 - xs0) / (float)(w - 1u);
        xc = x < w / 2u ? xs0 + st * (float)x : xs1 - st * (float)(w - 1u - x);
    }
    if (h > 1u) {
        float st = (ys1 - ys0) / (float)(h - 1u);
        yc = y < h / 2u ? ys0 + st * (float)y : ys1 - st * (float)(h - 1u - y);
    }
    float gx = (xc * s.f[0] + yc * s.f[1]) + s.f[2];
    float gy = (xc * s.f[3] + yc * s.f[4]) + s.f[5];
    float sx = ((gx + 1.0f) * wf - 1.0f) / 2.0f;
    float sy = ((gy + 1.0f) * hf - 1.0f) / 2.0f;
    float value[3];
    if (s.i[0] == 0u) {
        long long nx = (long long)rintf(sx), ny = (long long)rintf(sy);
        bool inside = nx >= 0 && ny >= 0 && nx < (long long)w && ny < (long long)h;
        for (int c = 0; c < 3; ++c) {
            value[c] = inside ? (float)src[((u64)ny * w + (u64)nx) * 3u + c] : s.f[6 + c];
        }
    } else {
        float x0f = floorf(sx), y0f = floorf(sy);
        float fx = sx - x0f, fy = sy - y0f;
        long long x0 = (long long)x0f, y0 = (long long)y0f;
        float acc[3] = {0.0f, 0.0f, 0.0f};
        float mask = 0.0f;
        const int dxs[4] = {0, 1, 0, 1};
        const int dys[4] = {0, 0, 1, 1};
        const float wg[4] = {(1.0f - fx) * (1.0f - fy), fx * (1.0f - fy), (1.0f - fx) * fy,
                             fx * fy};
        for (int k = 0; k < 4; ++k) {
            long long px = x0 + dxs[k], py = y0 + dys[k];
            if (px < 0 || py < 0 || px >= (long long)w || py >= (long long)h) {
                continue;
            }
            mask += wg[k];
            const u8* q = src + ((u64)py * w + (u64)px) * 3u;
            for (int c = 0; c < 3; ++c) {
                acc[c] += (float)q[c] * wg[k];
            }
        }
        for (int c = 0; c < 3; ++c) {
            value[c] = (acc[c] - s.f[6 + c]) * mask + s.f[6 + c];
        }
    }
    for (int c = 0; c < 3; ++c) {
        out[c] = round_even_u8(value[c]);
    }
}

// gaussian_blur at (x, y): the horizontal sums of each row in tap order, then the vertical
// sum in tap order, as colour.rs's two passes add them.
__device__ void blur_pixel(const OpStep& s, const float* pool, const u8* src, u32 w, u32 h,
                           u32 x, u32 y, u8* out) {
    u32 kx = s.i[0], ky = s.i[1];
    const float* wx = pool + s.i[2];
    const float* wy = wx + kx;
    float acc[3] = {0.0f, 0.0f, 0.0f};
    for (u32 ty = 0; ty < ky; ++ty) {
        u32 sy = reflect_index(y + ty, ky / 2u, h);
        float row[3] = {0.0f, 0.0f, 0.0f};
        for (u32 tx = 0; tx < kx; ++tx) {
            u32 sx = reflect_index(x + tx, kx / 2u, w);
            const u8* q = src + ((u64)sy * w + sx) * 3u;
            for (int c = 0; c < 3; ++c) {
                row[c] += (float)q[c] * wx[tx];
            }
        }
        for (int c = 0; c < 3; ++c) {
            acc[c] += row[c] * wy[ty];
        }
    }
    for (int c = 0; c < 3; ++c) {
        out[c] = round_even_u8(acc[c]);
    }
}

// adjust_sharpness at (x, y): the border kept, the interior blended with its rounded 3x3
// smoothing.
__device__ void sharpness_pixel(float factor, const u8* src, u32 w, u32 h, u32 x, u32 y,
                                u8* out) {
    const u8* here = src + ((u64)y * w + x) * 3u;
    if (w <= 2u || h <= 2u || x == 0u || y == 0u || x == w - 1u || y == h - 1u) {
        out[0] = here[0];
        out[1] = here[1];
        out[2] = here[2];
        return;
    }
    long long row = (long long)w * 3;
    const float a = 1.0f / 13.0f, b = 5.0f / 13.0f;
    float keep = 1.0f - factor;
    for (int c = 0; c < 3; ++c) {
        const u8* p = here + c;
        u32 ring = (u32)p[-row - 3] + p[-row] + p[-row + 3] + p[-3] + p[3] + p[row - 3] +
                   p[row] + p[row + 3];
        float v = (float)p[0];
        float blurred = rintf((float)ring * a + v * b);
        out[c] = trunc_u8(v + (blurred - v) * keep);
    }
}

// One step of one pixel: from src at (x, y) to out (3 bytes).
__device__ void op_pixel(const OpStep& s, const OpsBatch& b, const u8* src, const OpStats& st,
                         u32 x, u32 y, u8* out) {
    u32 w = b.width, h = b.height;
    const u8* p = src + ((u64)y * w + x) * 3u;
    switch (s.kind) {
    case OP_BRIGHTNESS:
        for (int c = 0; c < 3; ++c) out[c] = trunc_u8((float)p[c] * s.f[0]);
        break;
    case OP_CONTRAST:
        for (int c = 0; c < 3; ++c) out[c] = blend_u8(p[c], st.mean, s.f[0]);
        break;
    case OP_SATURATION: {
        float grey = floorf(luma(p));
        for (int c = 0; c < 3; ++c) out[c] = blend_u8(p[c], grey, s.f[0]);
        break;
    }
    case OP_HUE:
        hue_pixel(p, s.f[0], out);
        break;
    case OP_SHARPNESS:
        sharpness_pixel(s.f[0], src, w, h, x, y, out);
        break;
    case OP_GRAYSCALE: {
        u8 grey = trunc_u8(luma(p));
        out[0] = out[1] = out[2] = grey;
        break;
    }
    case OP_BLUR:
        blur_pixel(s, (const float*)b.weights, src, w, h, x, y, out);
        break;
    case OP_SOLARIZE:
        for (int c = 0; c < 3; ++c) out[c] = (float)p[c] >= s.f[0] ? (u8)(255u - p[c]) : p[c];
        break;
    case OP_POSTERIZE:
        for (int c = 0; c < 3; ++c) out[c] = (u8)(p[c] & s.i[0]);
        break;
    case OP_EQUALIZE:
    case OP_AUTOCONTRAST:
        for (int c = 0; c < 3; ++c) out[c] = st.lut[c * 256 + p[c]];
        break;
    case OP_INVERT:
        for (int c = 0; c < 3; ++c) out[c] = (u8)(255u - p[c]);
        break;
    case OP_VFLIP: {
        const u8* q = src + ((u64)(h - 1u - y) * w + x) * 3u;
        for (int c = 0; c < 3; ++c) out[c] = q[c];
        break;
    }
    case OP_WARP:
        warp_pixel(s, src, w, h, x, y, out);
        break;
    case OP_ROT90: {
        u32 sx = x, sy = y;
        if (s.i[0] == 1u) {
            sy = x;
            sx = w - 1u - y;
        } else if (s.i[0] == 2u) {
            sy = h - 1u - y;
            sx = w - 1u - x;
        } else if (s.i[0] == 3u) {
            sy = h - 1u - x;
            sx = y;
        }
        const u8* q = src + ((u64)sy * w + sx) * 3u;
        for (int c = 0; c < 3; ++c) out[c] = q[c];
        break;
    }
    default:
        for (int c = 0; c < 3; ++c) out[c] = p[c];
        break;
    }
}

// Grid: x over columns, y over rows, z over samples (looping). Step b.step of each sample,
// from src to dst.
extern "C" __global__ void stoker_op_step(OpsBatch b) {
    u32 x = blockIdx.x * blockDim.x + threadIdx.x;
    u32 y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= b.width || y >= b.height) {
        return;
    }
    u64 image = (u64)b.width * b.height * 3u;
    const OpStep* steps = (const OpStep*)b.steps;
    const OpStats* stats = (const OpStats*)b.stats;
    for (u32 i = blockIdx.z; i < b.n; i += gridDim.z) {
        const OpStep& s = steps[(u64)i * b.max_steps + b.step];
        const u8* src = (const u8*)b.src + i * image;
        u8* out = (u8*)b.dst + i * image + ((u64)y * b.width + x) * 3u;
        op_pixel(s, b, src, stats[i], x, y, out);
    }
}

// The lookup table of one channel for equalize or autocontrast (colour.rs).
__device__ void channel_lut(u32 kind, const u8* img, u64 pixels, u32 c, u8* lut) {
    for (u32 v = 0; v < 256u; ++v) lut[v] = (u8)v;
    if (kind == OP_AUTOCONTRAST) {
        u32 lo = 255u, hi = 0u;
        for (u64 p = 0; p < pixels; ++p) {
            u32 v = img[p * 3u + c];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        if (lo >= hi) return;
        float minimum = (float)lo;
        float inv_scale = ((float)hi - minimum) * (1.0f / 255.0f);
        for (u32 v = 0; v < 256u; ++v) lut[v] = trunc_u8(((float)v - minimum) / inv_scale);
        return;
    }
    u64 hist[256];
    for (u32 v = 0; v < 256u; ++v) hist[v] = 0;
    for (u64 p = 0; p < pixels; ++p) hist[img[p * 3u + c]] += 1;
    u32 last = 0;
    for (u32 v = 0; v < 256u; ++v) last = hist[v] ? v : last;
    u64 step = (pixels - hist[last]) / 255u;
    if (step == 0) return;
    u64 cumulative = 0;
    lut[0] = 0;
    for (u32 k = 1; k < 256u; ++k) {
        cumulative += hist[k - 1];
        u64 v = (cumulative + step / 2u) / step;
        lut[k] = (u8)(v > 255u ? 255u : v);
    }
}

// Grid: x over samples * 3 (one thread per image channel). The statistics of step b.step of
// each sample whose step needs them, from src.
extern "C" __global__ void stoker_op_stats(OpsBatch b) {
    u32 t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= b.n * 3u) {
        return;
    }
    u32 i = t / 3u, c = t % 3u;
    const OpStep& s = ((const OpStep*)b.steps)[(u64)i * b.max_steps + b.step];
    OpStats* st = (OpStats*)b.stats + i;
    u64 pixels = (u64)b.width * b.height;
    const u8* img = (const u8*)b.src + i * pixels * 3u;
    if (s.kind == OP_CONTRAST && c == 0u) {
        // The floored lumas are integers: their f64 sum is exact in any order.
        double sum = 0.0;
        for (u64 p = 0; p < pixels; ++p) sum += (double)floorf(luma(img + p * 3u));
        st->mean = pixels ? (float)(sum / (double)pixels) : 0.0f;
    } else if (s.kind == OP_EQUALIZE || s.kind == OP_AUTOCONTRAST) {
        channel_lut(s.kind, img, pixels, c, st->lut + c * 256u);
    }
}

__device__ __forceinline__ void store_zero_elem(u32 dtype, u8* img, u64 elem) {
    if (dtype == DTYPE_U8) {
        img[elem] = 0;
    } else if (dtype == DTYPE_F32) {
        ((float*)img)[elem] = 0.0f;
    } else {
        ((u16*)img)[elem] = 0;
    }
}

__device__ __forceinline__ u64 out_elem(const FinishBatch& b, u32 x, u32 y, u32 c) {
    u64 pix = (u64)y * b.out_w + x;
    return b.layout == LAYOUT_NHWC ? pix * 3u + c : (u64)c * b.out_w * b.out_h + pix;
}

// A value in output units into element `elem`: u8 clamped and truncated, floats as they are
// (f16 / bf16 rounded to nearest even), as ops::convert::store.
__device__ __forceinline__ void store_value(const FinishBatch& b, u8* img, u64 elem, float v) {
    switch (b.dtype) {
    case DTYPE_U8:
        img[elem] = trunc_u8(v);
        break;
    case DTYPE_F16:
        ((u16*)img)[elem] = f32_to_f16(v);
        break;
    case DTYPE_BF16:
        ((u16*)img)[elem] = f32_to_bf16(v);
        break;
    default:
        ((float*)img)[elem] = v;
        break;
    }
}

// Grid: x over columns, y over rows, z over samples. The 8-bit crops into the slot:
// (px * (1 / 255) - mean) / std, or the bytes for u8; zeros for a zero sample.
extern "C" __global__ void stoker_op_convert(FinishBatch b) {
    u32 x = blockIdx.x * blockDim.x + threadIdx.x;
    u32 y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= b.out_w || y >= b.out_h) {
        return;
    }
    const OpsHead* heads = (const OpsHead*)b.heads;
    for (u32 i = blockIdx.z; i < b.n; i += gridDim.z) {
        const u8* p = (const u8*)b.src + ((u64)i * b.out_w * b.out_h + (u64)y * b.out_w + x) * 3u;
        u8* img = (u8*)(b.dst + (u64)i * b.image_bytes);
        for (u32 c = 0; c < 3u; ++c) {
            u64 elem = out_elem(b, x, y, c);
            if (heads[i].zero) {
                store_zero_elem(b.dtype, img, elem);
            } else if (b.dtype == DTYPE_U8) {
                img[elem] = p[c];
            } else {
                store_value(b, img, elem, ((float)p[c] * (1.0f / 255.0f) - b.mean[c]) / b.std[c]);
            }
        }
    }
}

// Grid as stoker_op_convert. RandomErasing: each sample's box gets its value, or with
// ERASE_RANDOM its values from the pool at src (channel by channel, row by row, as the host
// drew them: ops::erase_into's order).
extern "C" __global__ void stoker_op_erase(FinishBatch b) {
    u32 x = blockIdx.x * blockDim.x + threadIdx.x;
    u32 y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= b.out_w || y >= b.out_h) {
        return;
    }
    const OpsHead* heads = (const OpsHead*)b.heads;
    for (u32 i = blockIdx.z; i < b.n; i += gridDim.z) {
        const OpsHead& hd = heads[i];
        if (hd.zero || !hd.erase || y < hd.top || y >= hd.top + hd.height || x < hd.left ||
            x >= hd.left + hd.width) {
            continue;
        }
        u8* img = (u8*)(b.dst + (u64)i * b.image_bytes);
        const float* drawn = (const float*)b.src + hd.values;
        u64 at = (u64)(y - hd.top) * hd.width + (x - hd.left);
        for (u32 c = 0; c < 3u; ++c) {
            float v = hd.value[c];
            if (hd.erase == ERASE_RANDOM) {
                v = drawn[(u64)c * hd.height * hd.width + at];
            }
            store_value(b, img, out_elem(b, x, y, c), v);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The batch mix (docs/augment.md, "MixUp and CutMix"): torchvision's MixUp and CutMix as
// daemon/pipeline/src/transform/mix.rs computes them on the host, over one view's images in the
// slot once the whole batch is there. The batch is rolled by one (image i pairs with i - 1,
// image 0 with the last). MixUp: round(round(prev * other) + round(own * x)) in the dtype (f32
// products, no contraction, each rounded to f16 / bf16 before the sum as torch rounds its
// in-place products); CutMix: the box's elements are the previous image's. In place: each
// thread owns one element position of the view and walks the batch from the last image down,
// the last image's element kept in a register, so every element is read and written once and
// no thread reads what another writes. Threads in x take consecutive elements of a row's run
// in memory (a row's (x2 - x1) * 3 interleaved elements in NHWC, one channel's x2 - x1 in
// NCHW), so a warp's loads and stores are contiguous in either layout.

#define MIX_UP 0u
#define MIX_CUT 1u

// One view of a batch, passed by value: 64 bytes (kernels::mix::MixBatch).
struct MixBatch {
    u64 dst;          // image 0 of the view in the slot
    u64 image_bytes;  // bytes from one image to the next
    u32 n;            // images mixed (the served ones)
    u32 width;
    u32 height;
    u32 dtype;  // DTYPE_F16, DTYPE_BF16 or DTYPE_F32
    u32 layout;
    u32 kind;     // MIX_UP or MIX_CUT
    float own;    // MixUp: lam as f32, the weight of an image's own pixels
    float other;  // MixUp: 1 - lam as f32, the previous image's
    u32 x1;       // the region mixed: columns x1..x2, rows y1..y2 (the whole image for
    u32 y1;       // MixUp, CutMix's box)
    u32 x2;
    u32 y2;
};

// IEEE binary16 -> f32, exactly (subnormals, infinities and NaN kept).
__device__ float f16_to_f32(u16 h) {
    u32 sign = ((u32)h & 0x8000u) << 16;
    u32 exp = ((u32)h >> 10) & 0x1fu;
    u32 mant = (u32)h & 0x3ffu;
    if (exp == 0u) {
        float v = (float)mant * 5.9604644775390625e-8f;  // mant * 2^-24, exact
        return sign ? -v : v;
    }
    if (exp == 31u) {
        return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

__device__ __forceinline__ float mix_load(u32 dtype, const u8* img, u64 elem) {
    if (dtype == DTYPE_F32) {
        return ((const float*)img)[elem];
    }
    u16 h = ((const u16*)img)[elem];
    return dtype == DTYPE_F16 ? f16_to_f32(h) : __uint_as_float((u32)h << 16);
}

// `v` rounded to the dtype and back (f32 unchanged).
__device__ __forceinline__ float mix_round(u32 dtype, float v) {
    if (dtype == DTYPE_F16) {
        return f16_to_f32(f32_to_f16(v));
    }
    if (dtype == DTYPE_BF16) {
        return __uint_as_float((u32)f32_to_bf16(v) << 16);
    }
    return v;
}

// Element `elem` of `img` (whose own value is `x`) mixed with the previous image's `prev`.
__device__ __forceinline__ void mix_store(const MixBatch& b, u8* img, u64 elem, float x, float prev) {
    float v = prev;
    if (b.kind == MIX_UP) {
        v = mix_round(b.dtype, prev * b.other) + mix_round(b.dtype, x * b.own);
    }
    if (b.dtype == DTYPE_F32) {
        ((float*)img)[elem] = v;
    } else {
        ((u16*)img)[elem] = b.dtype == DTYPE_F16 ? f32_to_f16(v) : f32_to_bf16(v);
    }
}

// Grid: x over the elements of a row's run, y over the region's rows, z over the channel
// planes (3 in NCHW, 1 in NHWC).
extern "C" __global__ void stoker_mix(MixBatch b) {
    bool nhwc = b.layout == LAYOUT_NHWC;
    u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    u32 y = b.y1 + blockIdx.y * blockDim.y + threadIdx.y;
    u32 c = blockIdx.z;
    if (b.x1 >= b.x2 || i >= (b.x2 - b.x1) * (nhwc ? 3u : 1u) || y >= b.y2 ||
        c >= (nhwc ? 1u : 3u) || b.n == 0u) {
        return;
    }
    u64 elem = nhwc ? ((u64)y * b.width + b.x1) * 3u + i : ((u64)c * b.height + y) * b.width + b.x1 + i;
    u8* base = (u8*)b.dst;
    float last = mix_load(b.dtype, base + (u64)(b.n - 1u) * b.image_bytes, elem);
    float cur = last;
    for (u32 i = b.n - 1u; i > 0u; --i) {
        float prev = mix_load(b.dtype, base + (u64)(i - 1u) * b.image_bytes, elem);
        mix_store(b, base + (u64)i * b.image_bytes, elem, cur, prev);
        cur = prev;
    }
    mix_store(b, base, elem, cur, last);
}
