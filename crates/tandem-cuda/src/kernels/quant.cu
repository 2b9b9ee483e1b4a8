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

// Y[t][r] = W[r] · X[t]. One block of MV_WARPS warps per weight row. The row is cut into segments of
// MV_SEG elements (32 units); warp w takes segments w, w + MV_WARPS, ...: it copies a segment into
// shared memory with 16-byte loads (all issued before any is used, so many bytes are in flight), and
// lane l decodes unit l of it. Lanes are summed in a fixed butterfly, then warps in a fixed tree. The
// order of every sum is fixed by `cols` alone: a row's result never depends on T, on the rows batched
// with it, or on which kernel (single or batched) computed it.
#define MV_WARPS 4
#define MV_SEG 1024
#define MV_MAX_U4 8

// Copies `bytes` (at most 32 * 16 * MV_MAX_U4) from global `src` to shared `dst`.
__device__ __forceinline__ void warp_copy(u8* dst, const u8* src, int bytes, int lane) {
    if ((((size_t)src) & 15) == 0) {
        int n16 = bytes >> 4;
        const uint4* s4 = (const uint4*)src;
        uint4* d4 = (uint4*)dst;
        uint4 tmp[MV_MAX_U4];
#pragma unroll
        for (int k = 0; k < MV_MAX_U4; k++)
            if (lane + 32 * k < n16) tmp[k] = __ldg(s4 + lane + 32 * k);
#pragma unroll
        for (int k = 0; k < MV_MAX_U4; k++)
            if (lane + 32 * k < n16) d4[lane + 32 * k] = tmp[k];
        for (int i = (n16 << 4) + lane; i < bytes; i += 32) dst[i] = src[i];
    } else {
        for (int i = lane; i < bytes; i += 32) dst[i] = src[i];
    }
}

#define MATVEC_KERNEL(NAME, T, NB)                                                                  \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32) NAME(                               \
        const u8* __restrict__ W, const float* __restrict__ X, float* __restrict__ Y, int rows,     \
        int cols, int n_t) {                                                                        \
        WAIT_PRIOR_GRID();                                                                           \
        __shared__ uint4 seg_buf[MV_WARPS][(ROW_BYTES(T, MV_SEG) + 15) / 16];                       \
        __shared__ float red[NB][MV_WARPS];                                                         \
        int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;                                        \
        int r = blockIdx.x, t0 = blockIdx.y * NB;                                                   \
        int nt = min(NB, n_t - t0);                                                                 \
        const u8* row = W + (size_t)r * ROW_BYTES(T, cols);                                         \
        u8* seg = (u8*)seg_buf[wid];                                                                \
        const float* x = X + (size_t)t0 * cols;                                                     \
        float acc[NB];                                                                              \
        _Pragma("unroll") for (int t = 0; t < NB; t++) acc[t] = 0.f;                                \
        for (int s0 = wid * MV_SEG; s0 < cols; s0 += MV_WARPS * MV_SEG) {                           \
            int n = min(MV_SEG, cols - s0);                                                         \
            __syncwarp();                                                                           \
            warp_copy(seg, row + ROW_BYTES(T, s0), (int)ROW_BYTES(T, n), lane);                     \
            __syncwarp();                                                                           \
            if (lane < n / 32) {                                                                    \
                float w[32];                                                                        \
                unit_##T(seg, lane, w);                                                             \
                const float* xu = x + s0 + lane * 32;                                               \
                _Pragma("unroll") for (int t = 0; t < NB; t++) if (t < nt) acc[t] +=                 \
                    dot32(w, xu + (size_t)t * cols);                                                \
            }                                                                                       \
        }                                                                                           \
        _Pragma("unroll") for (int t = 0; t < NB; t++) {                                            \
            float v = warp_sum(acc[t]);                                                             \
            if (lane == 0) red[t][wid] = v;                                                         \
        }                                                                                           \
        __syncthreads();                                                                            \
        if (threadIdx.x < nt) {                                                                     \
            const float* p = red[threadIdx.x];                                                      \
            Y[(size_t)(t0 + threadIdx.x) * rows + r] = (p[0] + p[1]) + (p[2] + p[3]);               \
        }                                                                                           \
    }

#define MATVEC(T)                                                                                   \
    MATVEC_KERNEL(matvec_##T, T, 1)                                                                 \
    MATVEC_KERNEL(matvecb_##T, T, MV_BATCH)                                                         \
    /* The whole matrix as f16 (the prefill route's GEMM operand): one thread per unit. */          \
    extern "C" __global__ void dequant_f16_##T(const u8* __restrict__ W, u16* __restrict__ out,     \
                                               int rows, int cols) {                                \
        WAIT_PRIOR_GRID();                                                                           \
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
        WAIT_PRIOR_GRID();                                                                           \
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

// ---- Variant 2: one warp per weight row, no shared memory. Lane l decodes units l, l + 32, ...
// straight from global memory with the widest loads the type's layout allows (16-byte loads for
// F16/BF16/F32 and the K-quants with 16-byte aligned rows), and the warp sums in a fixed butterfly.
// Its sums are ordered differently from `matvec_`: a model uses one variant for every row count.

__device__ __forceinline__ void gunit_f32(const u8* row, int u, float* w) {
    const float4* p = (const float4*)(row + (size_t)u * 128);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float4 v = __ldg(p + k);
        w[4 * k] = v.x;
        w[4 * k + 1] = v.y;
        w[4 * k + 2] = v.z;
        w[4 * k + 3] = v.w;
    }
}

__device__ __forceinline__ void gunit_q4_k(const u8* row, int u, float* w) {
    const u8* b = row + (size_t)(u >> 3) * 144;
    int s = u & 7;
    uint4 head = __ldg((const uint4*)b);
    const u8* hb = (const u8*)&head;
    int sc, m;
    scale_min_k4(s, hb + 4, &sc, &m);
    float d1 = h2f((u16)hb[0] | ((u16)hb[1] << 8)) * sc, m1 = h2f((u16)hb[2] | ((u16)hb[3] << 8)) * m;
    const uint4* q4 = (const uint4*)(b + 16 + (s >> 1) * 32);
    uint4 qa = __ldg(q4), qb = __ldg(q4 + 1);
    const u8* q0 = (const u8*)&qa;
    const u8* q1 = (const u8*)&qb;
    int shift = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 16; l++) {
        w[l] = d1 * ((q0[l] >> shift) & 0xF) - m1;
        w[l + 16] = d1 * ((q1[l] >> shift) & 0xF) - m1;
    }
}

__device__ __forceinline__ void gunit_q5_k(const u8* row, int u, float* w) {
    const u8* b = row + (size_t)(u >> 3) * 176;
    int s = u & 7;
    uint4 head = __ldg((const uint4*)b);
    const u8* hb = (const u8*)&head;
    int sc, m;
    scale_min_k4(s, hb + 4, &sc, &m);
    float d1 = h2f((u16)hb[0] | ((u16)hb[1] << 8)) * sc, m1 = h2f((u16)hb[2] | ((u16)hb[3] << 8)) * m;
    uint4 ha = __ldg((const uint4*)(b + 16)), hbv = __ldg((const uint4*)(b + 32));
    const uint4* q4 = (const uint4*)(b + 48 + (s >> 1) * 32);
    uint4 qa = __ldg(q4), qb = __ldg(q4 + 1);
    const u8* h0 = (const u8*)&ha;
    const u8* h1 = (const u8*)&hbv;
    const u8* q0 = (const u8*)&qa;
    const u8* q1 = (const u8*)&qb;
    int shift = (s & 1) * 4;
    u8 bit = (u8)(1 << s);
#pragma unroll
    for (int l = 0; l < 16; l++) {
        w[l] = d1 * (((q0[l] >> shift) & 0xF) + ((h0[l] & bit) ? 16 : 0)) - m1;
        w[l + 16] = d1 * (((q1[l] >> shift) & 0xF) + ((h1[l] & bit) ? 16 : 0)) - m1;
    }
}

// Types whose blocks are not 16-byte aligned decode with the byte loads of `unit_<T>` (through L1).
#define gunit_q4_0 unit_q4_0
#define gunit_q4_1 unit_q4_1
#define gunit_q5_0 unit_q5_0
#define gunit_q8_0 unit_q8_0
#define gunit_q6_k unit_q6_k

#define MATVEC2_KERNEL(NAME, T, NB)                                                                 \
    extern "C" __global__ void __launch_bounds__(128) NAME(const u8* __restrict__ W,                \
                                                           const float* __restrict__ X,             \
                                                           float* __restrict__ Y, int rows, int cols, \
                                                           int n_t) {                               \
        WAIT_PRIOR_GRID();                                                                           \
        WarpRow<NB> m;                                                                              \
        if (!warp_row<NB>(rows, n_t, &m)) return;                                                   \
        const u8* row = W + (size_t)m.r * ROW_BYTES(T, cols);                                       \
        const float* x = X + (size_t)m.t0 * cols;                                                   \
        for (int u = m.lane; u < cols / 32; u += 32) {                                              \
            float w[32];                                                                            \
            gunit_##T(row, u, w);                                                                   \
            _Pragma("unroll") for (int t = 0; t < NB; t++) if (t < m.nt) m.acc[t] +=                \
                dot32(w, x + (size_t)t * cols + u * 32);                                            \
        }                                                                                           \
        warp_row_store<NB>(m, Y, rows);                                                             \
    }

#define MATVEC2(T)                                                                                  \
    MATVEC2_KERNEL(matvec2_##T, T, 1)                                                               \
    MATVEC2_KERNEL(matvec2b_##T, T, MV_BATCH)

MATVEC2(f32)
// 16-bit floats (F16, BF16) stream instead: lane l reads 8-element chunks l, l + 32, ... of the row
// with coalesced 16-byte loads (a warp's load is 512 contiguous bytes), MV2_WIDE_U chunks in flight
// before any is converted, and sums them in ascending order; then the warp butterfly. (Its sums are
// ordered differently from MATVEC2's other types; a matrix uses one kernel for every row count.)
#define MV2_WIDE_U 8
template <bool BF>
__device__ __forceinline__ float half_to_f32(u16 h) {
    return BF ? bf2f(h) : h2f(h);
}
template <int NB, bool BF>
__device__ __forceinline__ void matvec2_16bit(const u8* W, const float* X, float* Y, int rows, int cols, int n_t) {
    WarpRow<NB> m;
    if (!warp_row<NB>(rows, n_t, &m)) return;
    const uint4* row = (const uint4*)(W + (size_t)m.r * cols * 2);
    const float* x = X + (size_t)m.t0 * cols;
    int nc = cols / 8;
    for (int c0 = m.lane; c0 < nc; c0 += 32 * MV2_WIDE_U) {
        uint4 raw[MV2_WIDE_U];
#pragma unroll
        for (int k = 0; k < MV2_WIDE_U; k++)
            if (c0 + 32 * k < nc) raw[k] = ld_weights16(row + c0 + 32 * k);  // first out of L2
        // One activation row: its chunks are loaded up front too, so they arrive while the weights
        // do (loaded beside their use, each would wait its own round trip to the cache).
        float4 xs[NB == 1 ? 2 * MV2_WIDE_U : 1];
        if (NB == 1) {
#pragma unroll
            for (int k = 0; k < MV2_WIDE_U; k++) {
                if (c0 + 32 * k < nc) {
                    const float4* xc = (const float4*)(x + 8 * (c0 + 32 * k));
                    xs[2 * k] = xc[0];
                    xs[2 * k + 1] = xc[1];
                }
            }
        }
#pragma unroll
        for (int k = 0; k < MV2_WIDE_U; k++) {
            int c = c0 + 32 * k;
            if (c >= nc) break;
            const u16* h = (const u16*)&raw[k];
#pragma unroll
            for (int t = 0; t < NB; t++) {
                if (t < m.nt) {
                    const float4* xc = (const float4*)(x + (size_t)t * cols + 8 * c);
                    float4 a = NB == 1 ? xs[2 * k] : xc[0], b = NB == 1 ? xs[2 * k + 1] : xc[1];
                    float s = m.acc[t];
                    s = fmaf(half_to_f32<BF>(h[0]), a.x, s);
                    s = fmaf(half_to_f32<BF>(h[1]), a.y, s);
                    s = fmaf(half_to_f32<BF>(h[2]), a.z, s);
                    s = fmaf(half_to_f32<BF>(h[3]), a.w, s);
                    s = fmaf(half_to_f32<BF>(h[4]), b.x, s);
                    s = fmaf(half_to_f32<BF>(h[5]), b.y, s);
                    s = fmaf(half_to_f32<BF>(h[6]), b.z, s);
                    s = fmaf(half_to_f32<BF>(h[7]), b.w, s);
                    m.acc[t] = s;
                }
            }
        }
    }
    warp_row_store<NB>(m, Y, rows);
}
#define MATVEC2_16(T, BF)                                                                           \
    extern "C" __global__ void __launch_bounds__(128) matvec2_##T(const u8* __restrict__ W,         \
                                                                  const float* __restrict__ X,      \
                                                                  float* __restrict__ Y, int rows,  \
                                                                  int cols, int n_t) {              \
        WAIT_PRIOR_GRID();                                                                           \
        matvec2_16bit<1, BF>(W, X, Y, rows, cols, n_t);                                              \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(128) matvec2b_##T(const u8* __restrict__ W,        \
                                                                   const float* __restrict__ X,     \
                                                                   float* __restrict__ Y, int rows, \
                                                                   int cols, int n_t) {             \
        WAIT_PRIOR_GRID();                                                                           \
        matvec2_16bit<MV_BATCH, BF>(W, X, Y, rows, cols, n_t);                                       \
    }
MATVEC2_16(f16, false)
MATVEC2_16(bf16, true)
MATVEC2(q4_0)
MATVEC2(q4_1)
MATVEC2(q5_0)
MATVEC2(q8_0)
MATVEC2(q4_k)
MATVEC2(q5_k)
MATVEC2(q6_k)

// ---- Variant 3: one warp per weight row, one element per lane. For each unit (32 elements) lane l
// decodes element l and multiplies it by x[l] of that unit: consecutive lanes read consecutive bytes
// of the weights and consecutive floats of x, so every load is coalesced whatever the block layout.
// Four units are in flight per iteration. Lane partial sums run over units in ascending order; the
// warp sums its lanes in a fixed butterfly.

__device__ __forceinline__ float elem_f32(const u8* row, int u, int l) { return ((const float*)row)[u * 32 + l]; }
__device__ __forceinline__ float elem_f16(const u8* row, int u, int l) { return h2f(((const u16*)row)[u * 32 + l]); }
__device__ __forceinline__ float elem_bf16(const u8* row, int u, int l) { return bf2f(((const u16*)row)[u * 32 + l]); }

__device__ __forceinline__ float elem_q4_0(const u8* row, int u, int l) {
    const u8* b = row + (size_t)u * 18;
    int q = (b[2 + (l & 15)] >> ((l >> 4) * 4)) & 0xF;
    return (q - 8) * ld_f16(b);
}

__device__ __forceinline__ float elem_q4_1(const u8* row, int u, int l) {
    const u8* b = row + (size_t)u * 20;
    int q = (b[4 + (l & 15)] >> ((l >> 4) * 4)) & 0xF;
    return q * ld_f16(b) + ld_f16(b + 2);
}

__device__ __forceinline__ float elem_q5_0(const u8* row, int u, int l) {
    const u8* b = row + (size_t)u * 22;
    u32 qh = (u32)b[2] | ((u32)b[3] << 8) | ((u32)b[4] << 16) | ((u32)b[5] << 24);
    int j = l & 15;
    u32 lo = l < 16 ? (b[6 + j] & 0xF) : (b[6 + j] >> 4);
    u32 hi = l < 16 ? ((qh >> j) << 4) & 0x10 : (qh >> (j + 12)) & 0x10;
    return ((int)(lo | hi) - 16) * ld_f16(b);
}

__device__ __forceinline__ float elem_q8_0(const u8* row, int u, int l) {
    const u8* b = row + (size_t)u * 34;
    return (float)(signed char)b[2 + l] * ld_f16(b);
}

__device__ __forceinline__ float elem_q4_k(const u8* row, int u, int l) {
    const u8* b = row + (size_t)(u >> 3) * 144;
    int s = u & 7, sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    int q = (b[16 + (s >> 1) * 32 + l] >> ((s & 1) * 4)) & 0xF;
    return ld_f16(b) * sc * q - ld_f16(b + 2) * m;
}

__device__ __forceinline__ float elem_q5_k(const u8* row, int u, int l) {
    const u8* b = row + (size_t)(u >> 3) * 176;
    int s = u & 7, sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    int q = ((b[48 + (s >> 1) * 32 + l] >> ((s & 1) * 4)) & 0xF) + ((b[16 + l] >> s) & 1) * 16;
    return ld_f16(b) * sc * q - ld_f16(b + 2) * m;
}

__device__ __forceinline__ float elem_q6_k(const u8* row, int u, int l) {
    const u8* b = row + (size_t)(u >> 3) * 210;
    int h = (u & 7) >> 2, k = u & 3;
    int ql = b[64 * h + ((k & 1) ? 32 : 0) + l];
    int qh = b[128 + 32 * h + l];
    int q = (((ql >> ((k >> 1) * 4)) & 0xF) | (((qh >> (2 * k)) & 3) << 4)) - 32;
    return ld_f16(b + 208) * (float)((const signed char*)b)[192 + 8 * h + 2 * k + (l >> 4)] * q;
}

#define MV3_UNROLL 4
#define MATVEC3_KERNEL(NAME, T, NB)                                                                 \
    extern "C" __global__ void __launch_bounds__(128) NAME(const u8* __restrict__ W,                \
                                                           const float* __restrict__ X,             \
                                                           float* __restrict__ Y, int rows, int cols, \
                                                           int n_t) {                               \
        WAIT_PRIOR_GRID();                                                                           \
        WarpRow<NB> m;                                                                              \
        if (!warp_row<NB>(rows, n_t, &m)) return;                                                   \
        const u8* row = W + (size_t)m.r * ROW_BYTES(T, cols);                                       \
        const float* x = X + (size_t)m.t0 * cols + m.lane;                                          \
        int units = cols / 32, u = 0;                                                               \
        for (; u + MV3_UNROLL <= units; u += MV3_UNROLL) {                                          \
            float w[MV3_UNROLL];                                                                    \
            _Pragma("unroll") for (int k = 0; k < MV3_UNROLL; k++) w[k] = elem_##T(row, u + k, m.lane); \
            _Pragma("unroll") for (int k = 0; k < MV3_UNROLL; k++)                                  \
                _Pragma("unroll") for (int t = 0; t < NB; t++) if (t < m.nt) m.acc[t] =             \
                    fmaf(w[k], x[(size_t)t * cols + (u + k) * 32], m.acc[t]);                       \
        }                                                                                           \
        for (; u < units; u++) {                                                                    \
            float w = elem_##T(row, u, m.lane);                                                     \
            _Pragma("unroll") for (int t = 0; t < NB; t++) if (t < m.nt) m.acc[t] =                 \
                fmaf(w, x[(size_t)t * cols + u * 32], m.acc[t]);                                    \
        }                                                                                           \
        warp_row_store<NB>(m, Y, rows);                                                             \
    }

#define MATVEC3(T)                                                                                  \
    MATVEC3_KERNEL(matvec3_##T, T, 1)                                                               \
    MATVEC3_KERNEL(matvec3b_##T, T, MV_BATCH)

MATVEC3(f32)
MATVEC3(f16)
MATVEC3(bf16)
MATVEC3(q4_0)
MATVEC3(q4_1)
MATVEC3(q5_0)
MATVEC3(q8_0)
MATVEC3(q4_k)
MATVEC3(q5_k)
MATVEC3(q6_k)
