// Shared by every Tandem kernel. NVRTC sees this text prepended to each .cu file (no include paths,
// no CUDA headers: f16 conversions are single PTX instructions).
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
#define INFINITY __int_as_float(0x7f800000)

// Every kernel waits here before it reads anything an earlier kernel wrote. In a decode graph,
// kernel-to-kernel edges are programmatic (sm_90+, `programmatic.rs`): a kernel may be launched once
// all blocks of its predecessor have started, and this waits until the predecessor has finished and
// its writes are visible. Before it, a kernel may only compute and read what no kernel writes (the
// matvecs issue their first weight loads there). Launched the ordinary way, it returns at once.
#if __CUDA_ARCH__ >= 900 && defined(TANDEM_TRACE)
// The kernel timeline (`TANDEM_CUDA_TRACE`, `trace.rs`; a timing experiment, compiled only then):
// block (0, 0, 0) of every launch records the global clock before and after its wait, its kernel's
// name (a pointer to the device copy of `__func__`), its grid and its launch number plus one, in a
// ring of TRACE_CAP records of six words after a launch counter. The counter's atomic is taken before the wait, so only the
// stores follow it. The release of a launch's wait is when the launch before it finished: the
// differences between consecutive releases are what each kernel costs inside a replayed graph.
#define TRACE_CAP (1 << 17)
__device__ unsigned long long tandem_trace[1 + 6 * TRACE_CAP];
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void traced_wait(const char* kernel) {
    bool lead = (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) == 0;
    unsigned long long t0 = 0, n = 0;
    if (lead) {
        t0 = global_ns();
        n = atomicAdd(&tandem_trace[0], 1ull);
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (lead) {
        unsigned long long* e = tandem_trace + 1 + 6 * (n % TRACE_CAP);
        e[0] = t0;
        e[1] = global_ns();
        e[2] = (unsigned long long)kernel;
        e[3] = gridDim.x | ((unsigned long long)gridDim.y << 32);
        e[4] = gridDim.z | ((unsigned long long)blockDim.x << 32);
        e[5] = n + 1;  // the launch's number plus one: a slot still zero was never written
    }
}
#define WAIT_PRIOR_GRID() traced_wait(__func__)
#elif __CUDA_ARCH__ >= 900
#define WAIT_PRIOR_GRID() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define WAIT_PRIOR_GRID()
#endif

// The int8 form a kernel writes its output in for the integer matvecs: a flag of `add_norm_to`, and
// the format argument of `gated_quant` and `attend_tiles` (`quant_flag` in rows.rs; 0: none).
#define RN_Q8K 8    // Q8_K blocks of 256
#define RN_Q8 16    // Q8 blocks of 32

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

// Weight loads: 16 bytes read once a step, marked first to go from L2 (and kept out of L1). A decode
// step streams gigabytes of weights through a 50 MB L2; at normal priority they push out what the
// step reads again and again (activations, the KV cache, norm vectors, the kernels' own code), which
// the latency-bound kernels between the matvecs then fetch from memory. The policy is a constant:
// the asm is not volatile, so the compiler may form it once.
__device__ __forceinline__ uint4 ld_weights16(const void* p) {
    uint4 r;
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(policy));
    return r;
}

// Shared-memory address of a generic pointer into shared memory (for `cp.async` and `ldmatrix`).
__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// 16 bytes global -> shared, zero-filled when `valid` is false (then nothing is read).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared, zero-filled when `valid` is false.
__device__ __forceinline__ void cp_async4(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }

__device__ __forceinline__ float ld_f16(const u8* p) { return h2f((u16)p[0] | ((u16)p[1] << 8)); }

// Sum over the warp; every lane gets the result. The butterfly order is fixed, so the result does not
// depend on which rows or how many were batched with this one.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The sums over the block of each thread's values `v[0..N)`: warp butterflies, then the warps' sums
// in a fixed tree, each as `block_total` (ops.cu) sums one value, so a sum has the bits it has there.
template <int N>
__device__ __forceinline__ void block_totals(float (&v)[N]) {
    __shared__ float parts[N][32];
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = warp_sum(v[i]);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int i = 0; i < N; i++) parts[i][threadIdx.x >> 5] = v[i];
    }
    __syncthreads();
    if (threadIdx.x < 32) {
#pragma unroll
        for (int i = 0; i < N; i++) {
            float x = threadIdx.x < (blockDim.x >> 5) ? parts[i][threadIdx.x] : 0.f;
            x = warp_sum(x);
            if (threadIdx.x == 0) parts[i][0] = x;
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; i++) v[i] = parts[i][0];
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

// ---- Activations quantized for the integer kernels (mmvq.cu, mmq.cu), exactly as the CPU backend quantizes
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

// Q8_K block `blk` of row t from its 256 values at `v` (global or shared memory), by one warp: lane
// l takes elements 8l .. 8l + 7. `nearest_int(x * -127 / max)` with max the first element of largest
// magnitude, f32 scale, and the sums of each 16 quants.
__device__ __forceinline__ void q8k_block(const float* v, u8* __restrict__ a, int n_t, int t, int cols, int blk) {
    int lane = threadIdx.x & 31;
    float4 v0 = *(const float4*)(v + 8 * lane), v1 = *(const float4*)(v + 8 * lane + 4);
    float x[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    float am = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) am = fmaxf(am, fabsf(x[i]));
    float amax = warp_max(am);
    // The first element holding the largest magnitude: its sign sets the scale's sign.
    int idx = 256;
#pragma unroll
    for (int i = 7; i >= 0; i--)
        if (fabsf(x[i]) == amax) idx = 8 * lane + i;
    for (int o = 16; o > 0; o >>= 1) idx = min(idx, __shfl_xor_sync(0xffffffffu, idx, o));
    float vmax = v[idx & 255];
    int q[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float* d = act_d(a, n_t, t, cols, 256) + blk;
    if (vmax != 0.f) {
        float iscale = -127.f / vmax;
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = min(127, max(-128, __float2int_rn(iscale * x[i])));
        if (lane == 0) *d = 1.f / iscale;
    } else if (lane == 0) {
        *d = 0.f;
    }
    u32 lo = 0, hi = 0;
    int s = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        lo |= (u32)(q[i] & 0xFF) << (8 * i);
        hi |= (u32)(q[i + 4] & 0xFF) << (8 * i);
        s += q[i] + q[i + 4];
    }
    *(uint2*)(a + (size_t)t * cols + blk * 256 + 8 * lane) = make_uint2(lo, hi);
    // Sums of 16 consecutive quants: lane pairs.
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if ((lane & 1) == 0) act_sums(a, n_t, t, cols)[blk * 16 + (lane >> 1)] = s;
}

// The same Q8 block held as float4s by eight consecutive lanes (lane 8b + i: elements 4i .. 4i + 3),
// so a warp quantizes four blocks at once: the same maximum, scale and roundings as `q8_block`.
__device__ __forceinline__ void q8_block4(float4 v, u8* __restrict__ a, int n_t, int t, int cols, int blk) {
    // Only the block's eight lanes take part: a row's last pass may leave other lanes of the warp out.
    u32 group = 0xFFu << (threadIdx.x & 24);
    float am = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) am = fmaxf(am, __shfl_xor_sync(group, am, o));
    float id = am != 0.f ? 127.f / am : 0.f;
    u32 q = (u32)(__float2int_rn(v.x * id) & 0xFF) | (u32)(__float2int_rn(v.y * id) & 0xFF) << 8 |
            (u32)(__float2int_rn(v.z * id) & 0xFF) << 16 | (u32)(__float2int_rn(v.w * id) & 0xFF) << 24;
    int lane8 = threadIdx.x & 7;
    ((u32*)(a + (size_t)t * cols + blk * 32))[lane8] = q;
    if (lane8 == 0) act_d(a, n_t, t, cols, 32)[blk] = h2f(f2h(am / 127.f));
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

// The angle of rotated pair p at position `pos` (cosine, sine), and a pair rotated by it: shared by
// `rope`, `rope_kv_store` and `attend_rope_d*`, so K rotated on its way into the cache has the bits of
// `rope` then `kv_store`, and q rotated in attention the bits of `rope`.
__device__ __forceinline__ float2 rope_angle(int pos, int p, int n_rot, float base, float freq_scale) {
    float theta = pos * freq_scale * powf(base, -2.0f * p / n_rot);
    return make_float2(cosf(theta), sinf(theta));
}

// Written out as fused multiply-adds: left to the compiler, which product of a difference or sum is
// fused is chosen per kernel, so two kernels could rotate the same pair to different bits (the fused
// attention kernel did once one of its variants was added). This is the form the compiler had
// chosen in `rope_kv_store` and the fused kernel.
__device__ __forceinline__ float2 rope_rotate(float x0, float x1, float2 cs) {
    return make_float2(fmaf(x0, cs.x, -__fmul_rn(x1, cs.y)), fmaf(x0, cs.y, __fmul_rn(x1, cs.x)));
}
