// Weight decoding at 32-element granularity ("units"): every supported ggml type is cut into units of
// 32 consecutive elements, and UNIT_<T>(row, u, w) writes unit u of a row into w[0..32). The matvec,
// dequantize and embedding kernels below are instantiated once per type from these.
//
// Layouts (ggml): Q4_0 f16 d|u8 qs[16]; Q4_1 f16 d|f16 m|u8 qs[16]; Q5_0 f16 d|u8 qh[4]|u8 qs[16];
// Q8_0 f16 d|i8 qs[32]; Q4_K f16 d|f16 dmin|u8 scales[12]|u8 qs[128]; Q5_K adds u8 qh[32] before qs;
// Q6_K u8 ql[128]|u8 qh[64]|i8 scales[16]|f16 d.

__device__ __forceinline__ void unit_f32(const u8* row, int u, float* w) {
    const float* p = (const float*)row + u * 32;
#pragma unroll
    for (int i = 0; i < 32; i++) w[i] = p[i];
}

__device__ __forceinline__ void unit_f16(const u8* row, int u, float* w) {
    const u16* p = (const u16*)row + u * 32;
#pragma unroll
    for (int i = 0; i < 32; i++) w[i] = h2f(p[i]);
}

__device__ __forceinline__ void unit_bf16(const u8* row, int u, float* w) {
    const u16* p = (const u16*)row + u * 32;
#pragma unroll
    for (int i = 0; i < 32; i++) w[i] = bf2f(p[i]);
}

__device__ __forceinline__ void unit_q4_0(const u8* row, int u, float* w) {
    const u8* b = row + u * 18;
    float d = ld_f16(b);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        u8 q = b[2 + j];
        w[j] = ((int)(q & 0xF) - 8) * d;
        w[j + 16] = ((int)(q >> 4) - 8) * d;
    }
}

__device__ __forceinline__ void unit_q4_1(const u8* row, int u, float* w) {
    const u8* b = row + u * 20;
    float d = ld_f16(b), m = ld_f16(b + 2);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        u8 q = b[4 + j];
        w[j] = (q & 0xF) * d + m;
        w[j + 16] = (q >> 4) * d + m;
    }
}

__device__ __forceinline__ void unit_q5_0(const u8* row, int u, float* w) {
    const u8* b = row + u * 22;
    float d = ld_f16(b);
    u32 qh = (u32)b[2] | ((u32)b[3] << 8) | ((u32)b[4] << 16) | ((u32)b[5] << 24);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        u8 q = b[6 + j];
        u32 h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        w[j] = ((int)((q & 0xF) | h0) - 16) * d;
        w[j + 16] = ((int)((q >> 4) | h1) - 16) * d;
    }
}

__device__ __forceinline__ void unit_q8_0(const u8* row, int u, float* w) {
    const u8* b = row + u * 34;
    float d = ld_f16(b);
#pragma unroll
    for (int j = 0; j < 32; j++) w[j] = (float)(signed char)b[2 + j] * d;
}

__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Unit u of a K-quant row: super-block u / 8, sub-block s = u % 8 (chunk s / 2, high nibble if odd).
__device__ __forceinline__ void unit_q4_k(const u8* row, int u, float* w) {
    const u8* b = row + (u >> 3) * 144;
    int s = u & 7;
    int sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    float d1 = ld_f16(b) * sc, m1 = ld_f16(b + 2) * m;
    const u8* q = b + 16 + (s >> 1) * 32;
    int shift = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; l++) w[l] = d1 * ((q[l] >> shift) & 0xF) - m1;
}

__device__ __forceinline__ void unit_q5_k(const u8* row, int u, float* w) {
    const u8* b = row + (u >> 3) * 176;
    int s = u & 7;
    int sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    float d1 = ld_f16(b) * sc, m1 = ld_f16(b + 2) * m;
    const u8* qh = b + 16;
    const u8* q = b + 48 + (s >> 1) * 32;
    int shift = (s & 1) * 4;
    u8 bit = (u8)(1 << s);
#pragma unroll
    for (int l = 0; l < 32; l++) w[l] = d1 * (((q[l] >> shift) & 0xF) + ((qh[l] & bit) ? 16 : 0)) - m1;
}

// Q6_K: unit u is super-block u / 8; within it half h = (u % 8) / 4 (128 elements) and quarter
// k = u % 4, which picks (ql offset, nibble, qh shift): 0 -> (0, low, 0), 1 -> (32, low, 2),
// 2 -> (0, high, 4), 3 -> (32, high, 6). Two 16-element scales per unit.
__device__ __forceinline__ void unit_q6_k(const u8* row, int u, float* w) {
    const u8* b = row + (u >> 3) * 210;
    int h = (u & 7) >> 2, k = u & 3;
    float d = ld_f16(b + 208);
    const u8* ql = b + 64 * h + ((k & 1) ? 32 : 0);
    const u8* qh = b + 128 + 32 * h;
    const signed char* sc = (const signed char*)(b + 192 + 8 * h) + 2 * k;
    int nib = (k >> 1) * 4, hs = 2 * k;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        int q = (((ql[l] >> nib) & 0xF) | (((qh[l] >> hs) & 3) << 4)) - 32;
        w[l] = d * sc[l >> 4] * q;
    }
}

// Bytes of one row of `cols` elements: units per row times the bytes a unit takes (K-quants: a
// super-block per 8 units).
#define ROW_BYTES(T, cols) ROW_BYTES_##T(cols)
#define ROW_BYTES_f32(c) ((size_t)(c) * 4)
#define ROW_BYTES_f16(c) ((size_t)(c) * 2)
#define ROW_BYTES_bf16(c) ((size_t)(c) * 2)
#define ROW_BYTES_q4_0(c) ((size_t)(c) / 32 * 18)
#define ROW_BYTES_q4_1(c) ((size_t)(c) / 32 * 20)
#define ROW_BYTES_q5_0(c) ((size_t)(c) / 32 * 22)
#define ROW_BYTES_q8_0(c) ((size_t)(c) / 32 * 34)
#define ROW_BYTES_q4_k(c) ((size_t)(c) / 256 * 144)
#define ROW_BYTES_q5_k(c) ((size_t)(c) / 256 * 176)
#define ROW_BYTES_q6_k(c) ((size_t)(c) / 256 * 210)

__device__ __forceinline__ float dot32(const float* w, const float* x) {
    const float4* x4 = (const float4*)x;
    float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 v = x4[i];
        s0 = fmaf(w[4 * i], v.x, s0);
        s1 = fmaf(w[4 * i + 1], v.y, s1);
        s2 = fmaf(w[4 * i + 2], v.z, s2);
        s3 = fmaf(w[4 * i + 3], v.w, s3);
    }
    return (s0 + s1) + (s2 + s3);
}

// Y[t][r] = W[r] · X[t] for up to MV_BATCH rows of X per block row (grid.y covers the rest). One warp
// per weight row. The row streams through shared memory in segments of MV_SEG elements, copied with
// 16-byte loads (coalesced, whatever the block size of the type), then lane l decodes units l and
// l + 32 of each segment — so lane l takes units l, l + 32, l + 64, ... of the row in ascending order,
// and the warp sums its lanes in a fixed butterfly. Every sum's order is fixed by `cols` alone, so a
// row's result never depends on T or on its neighbours.
#define MV_BATCH 8
#define MV_WARPS 4
#define MV_SEG 2048

// Copies `bytes` from global `src` to shared `dst`: 16-byte loads when both are 16-byte aligned.
__device__ __forceinline__ void warp_copy(u8* dst, const u8* src, int bytes, int lane) {
    if ((((size_t)src) & 15) == 0) {
        int n16 = bytes >> 4;
        const uint4* s4 = (const uint4*)src;
        uint4* d4 = (uint4*)dst;
        for (int i = lane; i < n16; i += 32) d4[i] = __ldg(s4 + i);
        for (int i = (n16 << 4) + lane; i < bytes; i += 32) dst[i] = src[i];
    } else {
        for (int i = lane; i < bytes; i += 32) dst[i] = src[i];
    }
}

#define MATVEC(T)                                                                                   \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32) matvec_##T(                         \
        const u8* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int rows,     \
        int cols, int n_t) {                                                                        \
        __shared__ uint4 seg_buf[MV_WARPS][(ROW_BYTES(T, MV_SEG) + 15) / 16];                       \
        int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;                                        \
        int r = blockIdx.x * MV_WARPS + wid;                                                        \
        int t0 = blockIdx.y * MV_BATCH;                                                             \
        if (r >= rows) return;                                                                      \
        int nt = min(MV_BATCH, n_t - t0);                                                           \
        const u8* row = W + (size_t)r * ROW_BYTES(T, cols);                                         \
        u8* seg = (u8*)seg_buf[wid];                                                                \
        const float* x = X + (size_t)t0 * cols;                                                     \
        float acc[MV_BATCH];                                                                        \
        _Pragma("unroll") for (int t = 0; t < MV_BATCH; t++) acc[t] = 0.f;                          \
        for (int s0 = 0; s0 < cols; s0 += MV_SEG) {                                                 \
            int n = min(MV_SEG, cols - s0);                                                         \
            __syncwarp();                                                                           \
            warp_copy(seg, row + ROW_BYTES(T, s0), (int)ROW_BYTES(T, n), lane);                     \
            __syncwarp();                                                                           \
            for (int u = lane; u < n / 32; u += 32) {                                               \
                float w[32];                                                                        \
                unit_##T(seg, u, w);                                                                \
                const float* xu = x + s0 + u * 32;                                                  \
                _Pragma("unroll") for (int t = 0; t < MV_BATCH; t++) if (t < nt) acc[t] +=           \
                    dot32(w, xu + (size_t)t * cols);                                                \
            }                                                                                       \
        }                                                                                           \
        _Pragma("unroll") for (int t = 0; t < MV_BATCH; t++) {                                      \
            if (t < nt) {                                                                           \
                float s = warp_sum(acc[t]);                                                         \
                if (lane == 0) Y[(size_t)(t0 + t) * rows + r] = s;                                  \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
    /* The whole matrix as f16 (the prefill route's GEMM operand): one thread per unit. */          \
    extern "C" __global__ void dequant_f16_##T(const u8* __restrict__ W, u16* __restrict__ out,     \
                                               int rows, int cols) {                                \
        size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;                                   \
        size_t units = (size_t)rows * (cols / 32);                                                  \
        if (i >= units) return;                                                                     \
        size_t r = i / (cols / 32);                                                                 \
        int u = (int)(i % (cols / 32));                                                             \
        float w[32];                                                                                \
        unit_##T(W + r * ROW_BYTES(T, cols), u, w);                                                 \
        u16* o = out + r * cols + u * 32;                                                           \
        _Pragma("unroll") for (int j = 0; j < 32; j++) o[j] = f2h(w[j]);                            \
    }                                                                                               \
    /* Rows `ids` of an embedding table, times `scale`, as f32. One thread per (token, unit). */     \
    extern "C" __global__ void embed_##T(const u8* __restrict__ W, const int* __restrict__ ids,     \
                                         float* __restrict__ out, int n, int cols, float scale) {   \
        int i = blockIdx.x * blockDim.x + threadIdx.x;                                              \
        int per = cols / 32;                                                                        \
        if (i >= n * per) return;                                                                   \
        int t = i / per, u = i % per;                                                               \
        float w[32];                                                                                \
        unit_##T(W + (size_t)ids[t] * ROW_BYTES(T, cols), u, w);                                    \
        float* o = out + (size_t)t * cols + u * 32;                                                 \
        _Pragma("unroll") for (int j = 0; j < 32; j++) o[j] = w[j] * scale;                         \
    }

MATVEC(f32)
MATVEC(f16)
MATVEC(bf16)
MATVEC(q4_0)
MATVEC(q4_1)
MATVEC(q5_0)
MATVEC(q8_0)
MATVEC(q4_k)
MATVEC(q5_k)
MATVEC(q6_k)
