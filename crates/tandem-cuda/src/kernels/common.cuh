// Shared by every Tandem kernel. NVRTC sees this text prepended to each .cu file (no include paths,
// no CUDA headers: f16 conversions are single PTX instructions).
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }

__device__ __forceinline__ float ld_f16(const u8* p) { return h2f((u16)p[0] | ((u16)p[1] << 8)); }

// Sum over the warp; every lane gets the result. The butterfly order is fixed, so the result does not
// depend on which rows or how many were batched with this one.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Activation rows one batched matvec block takes (`MV_BATCH` in routes.rs).
#define MV_BATCH 8

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (ggml's `get_scale_min_k4`).
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// The layout of every warp-per-row matvec: one warp per weight row, four rows per block, up to NB
// activation rows per grid row (grid.y). `acc` holds the lane's partial sums, one per activation row.
template <int NB>
struct WarpRow {
    int lane, r, t0, nt;
    float acc[NB];
};

// Fills `m` for this thread (partial sums zeroed); false when the warp's row is past the matrix.
template <int NB>
__device__ __forceinline__ bool warp_row(int rows, int n_t, WarpRow<NB>* m) {
    m->lane = threadIdx.x & 31;
    m->r = blockIdx.x * 4 + (threadIdx.x >> 5);
    m->t0 = blockIdx.y * NB;
    m->nt = min(NB, n_t - m->t0);
#pragma unroll
    for (int t = 0; t < NB; t++) m->acc[t] = 0.f;
    return m->r < rows;
}

// Sums each activation row's partials over the warp (fixed butterfly) and stores Y[t][r].
template <int NB>
__device__ __forceinline__ void warp_row_store(const WarpRow<NB>& m, float* Y, int rows) {
#pragma unroll
    for (int t = 0; t < NB; t++) {
        if (t < m.nt) {
            float s = warp_sum(m.acc[t]);
            if (m.lane == 0) Y[(size_t)(m.t0 + t) * rows + m.r] = s;
        }
    }
}

// ---- Activations quantized for the integer kernels (mmvq.cu), exactly as the CPU backend quantizes
// them. Layout of `n_t` rows of `cols` in one byte buffer (see `ActQuant::bytes`):
//   qs: n_t * cols int8 | sums: n_t * (cols / 16) int32 (Q8_K only) | d: n_t * (cols / B) f32
// with B = 256 (Q8_K) or 32 (Q8). Besides the quantize kernels, the norm and gating kernels write
// this form directly when the matrices reading their output take the integer route.
__device__ __forceinline__ const signed char* act_qs(const u8* a, int t, int cols) {
    return (const signed char*)a + (size_t)t * cols;
}

__device__ __forceinline__ int* act_sums(const u8* a, int n_t, int t, int cols) {
    return (int*)(a + (size_t)n_t * cols) + (size_t)t * (cols / 16);
}

__device__ __forceinline__ float* act_d(const u8* a, int n_t, int t, int cols, int blk) {
    size_t sums = blk == 256 ? (size_t)n_t * (cols / 16) * 4 : 0;
    return (float*)(a + (size_t)n_t * cols + sums) + (size_t)t * (cols / blk);
}

// Q8_K block `blk` of row t: `v` is element (threadIdx.x % 256) of the block, held by the 256
// consecutive threads of group `group` (threadIdx.x / 256) of the block. `nearest_int(v * -127 / max)`
// with max the first element of largest magnitude, f32 scale, and the sums of each 16 quants. Every
// thread of the thread block must call it (it synchronizes the block); a group past the end of the row
// passes blk = -1 and writes nothing.
__device__ void q8k_block(float v, int group, u8* __restrict__ a, int n_t, int t, int cols, int blk) {
    __shared__ float red_abs[4][8], vmax_of[4];
    __shared__ int red_idx[4][8], qsum[4][16];
    int i = threadIdx.x & 255, lane = i & 31, wid = i >> 5;
    float av = fabsf(v);
    // The largest magnitude, then the first element holding it: its sign sets the scale's sign.
    float m = warp_max(av);
    if (lane == 0) red_abs[group][wid] = m;
    __syncthreads();
    float amax = red_abs[group][0];
    for (int k = 1; k < 8; k++) amax = fmaxf(amax, red_abs[group][k]);
    int idx = av == amax ? i : 256;
    for (int o = 16; o > 0; o >>= 1) idx = min(idx, __shfl_xor_sync(0xffffffffu, idx, o));
    if (lane == 0) red_idx[group][wid] = idx;
    __syncthreads();
    int first = red_idx[group][0];
    for (int k = 1; k < 8; k++) first = min(first, red_idx[group][k]);
    if (i == first) vmax_of[group] = v;
    __syncthreads();
    float vmax = vmax_of[group];
    bool live = blk >= 0;
    signed char* qs = (signed char*)a + (size_t)t * cols + blk * 256;
    float* d = act_d(a, n_t, t, cols, 256) + blk;
    int* sums = act_sums(a, n_t, t, cols) + blk * 16;
    int q = 0;
    if (vmax != 0.f) {
        float iscale = -127.f / vmax;
        q = min(127, max(-128, __float2int_rn(iscale * v)));
        if (i == 0 && live) *d = 1.f / iscale;
    } else if (i == 0 && live) {
        *d = 0.f;
    }
    if (live) qs[i] = (signed char)q;
    // Sums of 16 consecutive quants: half-warps.
    int s = q;
    for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((lane & 15) == 0) qsum[group][i >> 4] = s;
    __syncthreads();
    if (i < 16 && live) sums[i] = qsum[group][i];
}

// Q8 block `blk` of row t, one warp (lane i holds element i): `round_half_even(v * 127 / amax)`, scale
// rounded to f16.
__device__ __forceinline__ void q8_block(float v, u8* __restrict__ a, int n_t, int t, int cols, int blk) {
    int lane = threadIdx.x & 31;
    float amax = warp_max(fabsf(v));
    float id = amax != 0.f ? 127.f / amax : 0.f;
    int q = __float2int_rn(v * id);
    ((signed char*)a)[(size_t)t * cols + blk * 32 + lane] = (signed char)q;
    if (lane == 0) act_d(a, n_t, t, cols, 32)[blk] = h2f(f2h(amax / 127.f));
}
