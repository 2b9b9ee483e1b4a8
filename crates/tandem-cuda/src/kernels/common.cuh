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
