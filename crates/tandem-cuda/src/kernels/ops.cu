// Element-wise and per-row kernels of the layer graph. Reductions use a fixed order (per-thread strided
// partial sums, then a fixed tree), so a row's result does not depend on the rows batched with it.

// The sum over the block of each thread's `s`: warp butterflies, then the warps' sums in a fixed tree.
__device__ float block_total(float s) {
    __shared__ float part[32];
    s = warp_sum(s);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.f;
        v = warp_sum(v);
        if (threadIdx.x == 0) part[0] = v;
    }
    __syncthreads();
    return part[0];
}

// 1 / rms of g[0..n), summed per thread in a strided order then over the block in a fixed tree.
__device__ float inv_rms(const float* g, int n, float eps) {
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s = fmaf(g[i], g[i], s);
    return rsqrtf(block_total(s) / n + eps);
}

// RMS norm of each `group`-wide slice (one block per slice), times `weight`, in place.
extern "C" __global__ void __launch_bounds__(1024) rms_norm(float* __restrict__ x, const float* __restrict__ weight, int group,
                                    float eps) {
    WAIT_PRIOR_GRID();
    float* g = x + (size_t)blockIdx.x * group;
    float scale = inv_rms(g, group, eps);
    for (int i = threadIdx.x; i < group; i += blockDim.x) g[i] = g[i] * scale * weight[i];
}

// Flags of `add_norm_to` (`residual_norm` in model.rs): what it does to one row.
#define RN_ADD 1    // x += y, or x += norm(y) * post with RN_POST (a block's output joins the residual)
#define RN_POST 2
#define RN_NORM 4   // out = norm(x) * weight (the next block's pre-norm; x itself stays the residual)
// RN_Q8K (8): ... and out quantized into `a` as Q8_K blocks (for the integer kernels); RN_Q8 (16): or
// as Q8 blocks (both in common.cuh, shared with the gating and attention kernels).
#define RN_F16 32   // ... and out rounded to f16 into `a` (row-major, the GEMM route's operand)

// The residual update and the next pre-norm in one pass, one block per row (blockDim a multiple of
// 256): each step's sums are those of the step alone, so a row's bits do not depend on which steps
// share the launch. Quantizing needs `width` a multiple of 256 (Q8_K, at most RN_MAX_Q8K_WIDTH: the
// row is staged in shared memory, one warp per block of 256) or 32 (Q8).
#define RN_MAX_Q8K_WIDTH 8192

// Element i (`live`: inside the row) of a normed row, `v`, written in every form `flags` asks for:
// f32 `o`, the f16 operand, the Q8 blocks, or staged for the Q8_K pass (`norm_out_q8k`). Every
// thread of the block calls it once per pass (q8_block needs whole warps).
__device__ __forceinline__ void norm_out(float v, bool live, int i, float* __restrict__ o, int flags,
                                         u8* __restrict__ a, int n_t, int row, int width, float* staged) {
    if (live) o[i] = v;
    if ((flags & RN_F16) && live) ((u16*)a)[(size_t)row * width + i] = f2h(v);
    if ((flags & RN_Q8K) && live) staged[i] = v;
    if ((flags & RN_Q8) && live) q8_block(v, a, n_t, row, width, i >> 5);
}

// The Q8_K blocks of the staged row, one warp per block of 256.
__device__ __forceinline__ void norm_out_q8k(int flags, u8* __restrict__ a, int n_t, int row, int width,
                                             const float* staged) {
    if (!(flags & RN_Q8K)) return;
    __syncthreads();
    for (int blk = threadIdx.x >> 5; blk < width / 256; blk += blockDim.x >> 5)
        q8k_block(staged + blk * 256, a, n_t, row, width, blk);
}

// `add_norm_to` for rows of at most RN_VECS float4s a thread (width a multiple of 4): each thread
// loads its float4s (x, y, post, weight) once, up front, and keeps them in registers through the
// sums, so the kernel waits for memory once instead of once per pass. Float4 j of a row is thread
// j % RN_THREADS's; a thread sums its elements in ascending order, then the block's fixed tree
// (`block_total`). RN_THREADS threads a row: a decode step has one row, so a block is all the
// kernel's work, and its cost is the block's instructions, not its bandwidth. At 1024 threads and
// one element a thread a pass, 32 warps spent 530 instructions each on an 8B row (Nsight Compute);
// 16 warps of float4s do the row with a fraction of that (eight were slower: the Q8_K pass then
// takes two blocks a warp). Every loop stops at the block's last pass, so a shorter row pays for no
// slot it does not fill.
#define RN_THREADS 512
#define RN_VECS 4
#define RN_IN_REGS (4 * RN_VECS)

// A thread's float4s of the model's own vectors (the post-norm and norm weights), which no kernel
// writes: `add_norm_to` loads them before WAIT_PRIOR_GRID(), so under a programmatic edge they come
// from memory while the kernel before still runs (the weight stream of a decode step has evicted
// them from L2 by then).
struct NormWeights {
    float4 pv[RN_VECS], wv[RN_VECS];
};

__device__ __forceinline__ float4 ld4(const float* p, int j, bool live) {
    return live ? ((const float4*)p)[j] : make_float4(0.f, 0.f, 0.f, 0.f);
}

__device__ __forceinline__ NormWeights norm_weights(const float* __restrict__ post, const float* __restrict__ weight,
                                                    int width, int flags) {
    NormWeights nw;
#pragma unroll
    for (int k = 0; k < RN_VECS; k++) {
        if (4 * k * RN_THREADS >= width) break;
        int j = threadIdx.x + k * RN_THREADS;
        bool live = 4 * j < width;
        nw.pv[k] = ld4(post, j, live && (flags & RN_POST));
        nw.wv[k] = ld4(weight, j, live && (flags & RN_NORM));
    }
    return nw;
}

__device__ __forceinline__ float sum_squares(const float4* v, int width) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < RN_VECS; k++) {
        if (4 * k * RN_THREADS >= width) break;
        s = fmaf(v[k].x, v[k].x, s);
        s = fmaf(v[k].y, v[k].y, s);
        s = fmaf(v[k].z, v[k].z, s);
        s = fmaf(v[k].w, v[k].w, s);
    }
    return s;
}

__device__ __forceinline__ void add_norm_in_regs(float* __restrict__ xr, const float* __restrict__ g,
                                                 const NormWeights& nw, float* __restrict__ o, int width, float eps,
                                                 int flags, u8* __restrict__ a, int n_t, int row, float* staged) {
    float4 xv[RN_VECS], gv[RN_VECS];
#pragma unroll
    for (int k = 0; k < RN_VECS; k++) {
        if (4 * k * RN_THREADS >= width) break;
        int j = threadIdx.x + k * RN_THREADS;
        bool live = 4 * j < width;
        xv[k] = ld4(xr, j, live);
        gv[k] = ld4(g, j, live && (flags & RN_ADD));
    }
    if (flags & RN_ADD) {
        float scale = 1.f;
        if (flags & RN_POST) scale = rsqrtf(block_total(sum_squares(gv, width)) / width + eps);
#pragma unroll
        for (int k = 0; k < RN_VECS; k++) {
            if (4 * k * RN_THREADS >= width) break;
            int j = threadIdx.x + k * RN_THREADS;
            if (4 * j < width) {
                const float4 p = nw.pv[k];
                float4& x = xv[k];
                const float4 y = gv[k];
                if (flags & RN_POST) {
                    x.x += y.x * scale * p.x, x.y += y.y * scale * p.y;
                    x.z += y.z * scale * p.z, x.w += y.w * scale * p.w;
                } else {
                    x.x += y.x, x.y += y.y, x.z += y.z, x.w += y.w;
                }
                ((float4*)xr)[j] = x;
            }
        }
    }
    if (!(flags & RN_NORM)) return;
    float scale = rsqrtf(block_total(sum_squares(xv, width)) / width + eps);
#pragma unroll
    for (int k = 0; k < RN_VECS; k++) {
        if (4 * k * RN_THREADS >= width) break;
        int j = threadIdx.x + k * RN_THREADS;
        if (4 * j >= width) continue;
        const float4 x = xv[k], w = nw.wv[k];
        float4 v = make_float4(x.x * scale * w.x, x.y * scale * w.y, x.z * scale * w.z, x.w * scale * w.w);
        ((float4*)o)[j] = v;
        if (flags & RN_F16) {
            uint2 h = make_uint2(f2h(v.x) | ((u32)f2h(v.y) << 16), f2h(v.z) | ((u32)f2h(v.w) << 16));
            ((uint2*)((u16*)a + (size_t)row * width))[j] = h;
        }
        if (flags & RN_Q8K) ((float4*)staged)[j] = v;
        // Eight consecutive threads hold a Q8 block of 32 (width is a multiple of 32 when quantizing,
        // so they are all live or all past the row).
        if (flags & RN_Q8) q8_block4(v, a, n_t, row, width, j >> 3);
    }
    norm_out_q8k(flags, a, n_t, row, width, staged);
}

extern "C" __global__ void __launch_bounds__(RN_THREADS) add_norm_to(float* __restrict__ x, const float* __restrict__ y,
                                                                const float* __restrict__ post, float* __restrict__ out,
                                                                const float* __restrict__ weight, int width, float eps,
                                                                int flags, u8* __restrict__ a, int n_t) {
    bool in_regs = width <= RN_IN_REGS * RN_THREADS && width % 4 == 0;
    NormWeights nw;
    if (in_regs) nw = norm_weights(post, weight, width, flags);
    WAIT_PRIOR_GRID();
    int row = blockIdx.x;
    __shared__ __align__(16) float staged[RN_MAX_Q8K_WIDTH];
    if (in_regs) {
        add_norm_in_regs(x + (size_t)row * width, y + (size_t)row * width, nw, out + (size_t)row * width, width, eps,
                         flags, a, n_t, row, staged);
        return;
    }
    float* xr = x + (size_t)row * width;
    if (flags & RN_ADD) {
        const float* g = y + (size_t)row * width;
        float scale = (flags & RN_POST) ? inv_rms(g, width, eps) : 1.f;
        for (int i = threadIdx.x; i < width; i += blockDim.x)
            xr[i] += (flags & RN_POST) ? g[i] * scale * post[i] : g[i];
    }
    if (!(flags & RN_NORM)) return;
    // inv_rms reads each element in the thread that just wrote it.
    float scale = inv_rms(xr, width, eps);
    float* o = out + (size_t)row * width;
    for (int base = 0; base < width; base += blockDim.x) {
        int i = base + threadIdx.x;
        bool live = i < width;
        norm_out(live ? xr[i] * scale * weight[i] : 0.f, live, i, o, flags, a, n_t, row, width, staged);
    }
    norm_out_q8k(flags, a, n_t, row, width, staged);
}

// `add_norm_to` for the GEMM route's rows (`residual_norm` in rows.rs): flags RN_ADD, RN_POST and
// RN_NORM as there, and the normed row written only as the GEMMs' f16 operand `h` (their one reader).
// 256 threads a row with 16-byte loads, each thread's float4s held in registers through the sums:
// eight rows share an SM where `add_norm_to` fits two, so one row's sums overlap another's loads. Its
// sums run in its own order: the GEMM route's bits are not the matvec route's anyway. `width` a
// multiple of 4, at most 1024 * RNR_VECS.
#define RNR_VECS 8
extern "C" __global__ void __launch_bounds__(256) add_norm_rows(float* __restrict__ x, const float* __restrict__ y,
                                                                 const float* __restrict__ post,
                                                                 const float* __restrict__ weight, int width,
                                                                 float eps, int flags, u16* __restrict__ h) {
    WAIT_PRIOR_GRID();
    size_t row = blockIdx.x;
    float4* xr = (float4*)(x + row * width);
    const float4* yr = (const float4*)(y + row * width);
    int n4 = width / 4;
    float4 xv[RNR_VECS], yv[RNR_VECS];
    const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < RNR_VECS; k++) {
        int i = threadIdx.x + k * 256;
        xv[k] = i < n4 ? xr[i] : zero;
        yv[k] = i < n4 && (flags & RN_ADD) ? yr[i] : zero;
    }
    if (flags & RN_ADD) {
        float scale = 1.f;
        if (flags & RN_POST) {
            float s = 0.f;
#pragma unroll
            for (int k = 0; k < RNR_VECS; k++)
                s += yv[k].x * yv[k].x + yv[k].y * yv[k].y + yv[k].z * yv[k].z + yv[k].w * yv[k].w;
            scale = rsqrtf(block_total(s) / width + eps);
        }
#pragma unroll
        for (int k = 0; k < RNR_VECS; k++) {
            int i = threadIdx.x + k * 256;
            if (i >= n4) continue;
            float4 p = (flags & RN_POST) ? ((const float4*)post)[i] : make_float4(1.f, 1.f, 1.f, 1.f);
            float c = (flags & RN_POST) ? scale : 1.f;
            xv[k].x += yv[k].x * c * p.x;
            xv[k].y += yv[k].y * c * p.y;
            xv[k].z += yv[k].z * c * p.z;
            xv[k].w += yv[k].w * c * p.w;
            xr[i] = xv[k];
        }
    }
    if (!(flags & RN_NORM)) return;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < RNR_VECS; k++)
        s += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
    float scale = rsqrtf(block_total(s) / width + eps);
    u16* hr = h + row * width;
#pragma unroll
    for (int k = 0; k < RNR_VECS; k++) {
        int i = threadIdx.x + k * 256;
        if (i >= n4) continue;
        float4 w = ((const float4*)weight)[i];
        u32 lo = (u32)f2h(xv[k].x * scale * w.x) | ((u32)f2h(xv[k].y * scale * w.y) << 16);
        u32 hi = (u32)f2h(xv[k].z * scale * w.z) | ((u32)f2h(xv[k].w * scale * w.w) << 16);
        ((uint2*)hr)[i] = make_uint2(lo, hi);
    }
}

// RoPE on every head of every row of x (nx heads a row) and of y (ny heads; q and k in one launch):
// one thread per (row, group of ROPE_HEADS heads, rotated pair), so the angle's sine and cosine are
// computed once for the group (prefill spends its time there, not in the loads). `neox` pairs i with
// i + n_rot/2, otherwise 2i with 2i+1. Angles as ggml forms them: pos * freq_scale * base^(-2i/n_rot).
#define ROPE_HEADS 8

extern "C" __global__ void rope(float* __restrict__ x, float* __restrict__ y, const int* __restrict__ pos, int rows,
                                int nx, int ny, int head_dim, int n_rot, float base, float freq_scale, int neox) {
    WAIT_PRIOR_GRID();
    int half = n_rot / 2, heads = nx + ny, groups = (heads + ROPE_HEADS - 1) / ROPE_HEADS;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, total = (size_t)rows * groups * half;
    if (i >= total) return;
    // 32-bit division where the index fits (a 64-bit one is a long subroutine call).
    int p, r, g;
    if (total <= 0xFFFFFFFFu) {
        u32 k = (u32)i, rg = k / (u32)half;
        p = (int)(k % (u32)half), r = (int)(rg / (u32)groups), g = (int)(rg % (u32)groups);
    } else {
        size_t rg = i / half;
        p = (int)(i % half), r = (int)(rg / groups), g = (int)(rg % groups);
    }
    float2 cs = rope_angle(pos[r], p, n_rot, base, freq_scale);
    int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
    // Every head's pair is loaded before any is written (the loads overlap); the arrays are indexed
    // only by unrolled constants, so they stay in registers.
    float* hp[ROPE_HEADS];
    float x0[ROPE_HEADS], x1[ROPE_HEADS];
#pragma unroll
    for (int j = 0; j < ROPE_HEADS; j++) {
        int hh = g * ROPE_HEADS + j;
        hp[j] = hh < nx ? x + ((size_t)r * nx + hh) * head_dim : y + ((size_t)r * ny + hh - nx) * head_dim;
        bool live = hh < heads;
        x0[j] = live ? hp[j][a] : 0.f;
        x1[j] = live ? hp[j][b] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < ROPE_HEADS; j++) {
        if (g * ROPE_HEADS + j < heads) {
            float2 y = rope_rotate(x0[j], x1[j], cs);
            hp[j][a] = y.x;
            hp[j][b] = y.y;
        }
    }
}

// RoPE of q in place (nq heads a row) and of K on its way into the f16 cache, with V: row r's K and V
// go to cache row dst[r] (-1: skipped). The decode step's `rope` and `kv_store` in one launch (one
// dependent kernel fewer a layer). One thread per (row, head of q or of K, rotated pair); dimensions
// past n_rot are copied as they are. Rows and heads are few here, so plain 32-bit indices.
extern "C" __global__ void rope_kv_store(float* __restrict__ q, const float* __restrict__ k,
                                         const float* __restrict__ v, u16* __restrict__ kc, u16* __restrict__ vc,
                                         const int* __restrict__ dst, const int* __restrict__ pos, int rows,
                                         int nq, int nkv, int head_dim, int n_rot, float base, float freq_scale,
                                         int neox) {
    WAIT_PRIOR_GRID();
    int half = n_rot / 2, heads = nq + nkv;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * heads * half) return;
    int p = i % half, rh = i / half, h = rh % heads, r = rh / heads;
    float2 cs = rope_angle(pos[r], p, n_rot, base, freq_scale);
    int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
    if (h < nq) {
        float* x = q + ((size_t)r * nq + h) * head_dim;
        float2 y = rope_rotate(x[a], x[b], cs);
        x[a] = y.x;
        x[b] = y.y;
        return;
    }
    int d = dst[r];
    if (d < 0) return;
    size_t kvw = (size_t)nkv * head_dim, head = (size_t)(h - nq) * head_dim;
    const float* kx = k + r * kvw + head;
    const float* vx = v + r * kvw + head;
    u16* kd = kc + d * kvw + head;
    u16* vd = vc + d * kvw + head;
    float2 y = rope_rotate(kx[a], kx[b], cs);
    kd[a] = f2h(y.x);
    kd[b] = f2h(y.y);
    vd[a] = f2h(vx[a]);
    vd[b] = f2h(vx[b]);
    for (int j = n_rot + p; j < head_dim; j += half) {
        kd[j] = f2h(kx[j]);
        vd[j] = f2h(vx[j]);
    }
}

__device__ __forceinline__ float gelu_tanh_f16(float x) {
    // llama.cpp's CPU table: the input rounded to f16, GELU in f32, the result rounded to f16.
    if (x <= -10.f) return 0.f;
    if (x >= 10.f) return x;
    float v = h2f(f2h(x));
    float g = 0.5f * v * (1.f + tanhf(0.7978846f * v * (1.f + 0.044715f * v * v)));
    return h2f(f2h(g));
}

__device__ __forceinline__ float gate_value(float g, float u, int act) {
    float a = act == 0 ? g / (1.f + expf(-g)) : gelu_tanh_f16(g);
    return a * u;
}

// gate = act(gate) * up; act 0 = SiLU, 1 = GELU (tanh). With `h` given, the result goes only there,
// rounded to f16 (the GEMM route's operand, its one reader), and gate is left as it was. Four elements
// a thread (vector loads; the same arithmetic per element as one a thread).
extern "C" __global__ void gated(float* __restrict__ gate, const float* __restrict__ up, size_t n, int act,
                                 u16* __restrict__ h) {
    WAIT_PRIOR_GRID();
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (i >= n) return;
    if (i + 4 > n) {
        for (; i < n; i++) {
            float v = gate_value(gate[i], up[i], act);
            if (h) h[i] = f2h(v);
            else gate[i] = v;
        }
        return;
    }
    float4 g = *(const float4*)(gate + i), u = *(const float4*)(up + i);
    float v0 = gate_value(g.x, u.x, act), v1 = gate_value(g.y, u.y, act);
    float v2 = gate_value(g.z, u.z, act), v3 = gate_value(g.w, u.w, act);
    if (h) {
        u32 lo = (u32)f2h(v0) | ((u32)f2h(v1) << 16), hi = (u32)f2h(v2) | ((u32)f2h(v3) << 16);
        *(uint2*)(h + i) = make_uint2(lo, hi);
    } else {
        *(float4*)(gate + i) = make_float4(v0, v1, v2, v3);
    }
}

// The gating of the GEMM route (`ffn.rs`): row t of `pair` holds gate's `width` products then up's, in
// f16; h[t] = f16(act(gate) * up). PAIR_VECTOR elements of each half a thread (16-byte loads); grid
// (columns / (256 * PAIR_VECTOR), rows). `width` a multiple of PAIR_VECTOR.
#define PAIR_VECTOR 8
extern "C" __global__ void __launch_bounds__(256) gated_pair(const u16* __restrict__ pair, int width, int act,
                                                              u16* __restrict__ h) {
    WAIT_PRIOR_GRID();
    int col = (blockIdx.x * blockDim.x + threadIdx.x) * PAIR_VECTOR;
    if (col >= width) return;
    size_t row = blockIdx.y;
    const u16* g = pair + row * 2 * width + col;
    uint4 gv = *(const uint4*)g, uv = *(const uint4*)(g + width);
    const u16* gs = (const u16*)&gv;
    const u16* us = (const u16*)&uv;
    uint4 ov;
    u16* os = (u16*)&ov;
#pragma unroll
    for (int j = 0; j < PAIR_VECTOR; j++) os[j] = f2h(gate_value(h2f(gs[j]), h2f(us[j]), act));
    *(uint4*)(h + row * width + col) = ov;
}

// Row r of `src` (one stacked GEMM's products of q, k and v, `w0 + w1 + w2` values) cut into its parts:
// the first w0 values to row r of out0, the next w1 to out1, the last w2 to out2 (w2 = 0: two parts).
// Widths are multiples of 4: one thread per float4 of a row, grid (float4s of a row / 256, rows).
extern "C" __global__ void __launch_bounds__(256) split_columns(const float* __restrict__ src,
                                                                 float* __restrict__ out0, int w0,
                                                                 float* __restrict__ out1, int w1,
                                                                 float* __restrict__ out2, int w2) {
    WAIT_PRIOR_GRID();
    int col = (blockIdx.x * blockDim.x + threadIdx.x) * 4, width = w0 + w1 + w2;
    if (col >= width) return;
    size_t row = blockIdx.y;
    float4 v = *(const float4*)(src + row * width + col);
    if (col < w0) {
        *(float4*)(out0 + row * w0 + col) = v;
    } else if (col < w0 + w1) {
        *(float4*)(out1 + row * w1 + col - w0) = v;
    } else {
        *(float4*)(out2 + row * w2 + col - w0 - w1) = v;
    }
}

// A prefill chunk's stacked q|k|v products (`split_columns`' input: rows of nq + 2 nkv heads) cut
// apart, rotated and stored in one launch: q's rows, RoPE applied, to `q`; K's, RoPE applied, and V's
// to cache row dst[r] (-1: not stored) as f16. The bits of `split_columns`, `rope` and `kv_store` in
// turn (the same angle, rotation and rounding), without K and V ever written in f32. One thread per
// (row, group of ROPE_HEADS heads of q then K, rotated pair), as `rope`: the angle, whose sine and
// cosine cost more than the rest, once for the group's heads; dimensions past n_rot are copied.
extern "C" __global__ void split_rope_kv_store(const float* __restrict__ qkv, float* __restrict__ q,
                                               u16* __restrict__ kc, u16* __restrict__ vc,
                                               const int* __restrict__ dst, const int* __restrict__ pos, int rows,
                                               int nq, int nkv, int head_dim, int n_rot, float base,
                                               float freq_scale, int neox) {
    WAIT_PRIOR_GRID();
    int half = n_rot / 2, heads = nq + nkv, groups = (heads + ROPE_HEADS - 1) / ROPE_HEADS;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * groups * half) return;
    int p = i % half, rg = i / half, g = rg % groups, r = rg / groups;
    size_t qw = (size_t)nq * head_dim, kvw = (size_t)nkv * head_dim;
    const float* row = qkv + (size_t)r * (qw + 2 * kvw);
    float2 cs = rope_angle(pos[r], p, n_rot, base, freq_scale);
    int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
    int d = dst[r];
    // Every head's pair is loaded before any is written (the loads overlap).
    float x0[ROPE_HEADS], x1[ROPE_HEADS];
#pragma unroll
    for (int j = 0; j < ROPE_HEADS; j++) {
        int h = g * ROPE_HEADS + j;
        bool live = h < nq || (h < heads && d >= 0);
        const float* x = row + (size_t)h * head_dim;
        x0[j] = live ? x[a] : 0.f;
        x1[j] = live ? x[b] : 0.f;
    }
#pragma unroll
    for (int j = 0; j < ROPE_HEADS; j++) {
        int h = g * ROPE_HEADS + j;
        float2 z = rope_rotate(x0[j], x1[j], cs);
        const float* x = row + (size_t)h * head_dim;
        if (h < nq) {
            float* y = q + (size_t)r * qw + (size_t)h * head_dim;
            y[a] = z.x;
            y[b] = z.y;
            for (int e = n_rot + p; e < head_dim; e += half) y[e] = x[e];
        } else if (h < heads && d >= 0) {
            size_t head = (size_t)(h - nq) * head_dim;
            const float* vx = row + qw + kvw + head;
            u16* kd = kc + (size_t)d * kvw + head;
            u16* vd = vc + (size_t)d * kvw + head;
            kd[a] = f2h(z.x);
            kd[b] = f2h(z.y);
            vd[a] = f2h(vx[a]);
            vd[b] = f2h(vx[b]);
            for (int e = n_rot + p; e < head_dim; e += half) {
                kd[e] = f2h(x[e]);
                vd[e] = f2h(vx[e]);
            }
        }
    }
}

// `gated`, and the result quantized for the integer kernels (qfmt RN_Q8K or RN_Q8): one block of 256
// per (256 elements, row); `width` a multiple of 256.
extern "C" __global__ void __launch_bounds__(256) gated_quant(float* __restrict__ gate, const float* __restrict__ up,
                                                               int width, int act, int qfmt, u8* __restrict__ a,
                                                               int n_t) {
    WAIT_PRIOR_GRID();
    int t = blockIdx.y, blk = blockIdx.x;
    size_t i = (size_t)t * width + blk * 256 + threadIdx.x;
    float v = gate_value(gate[i], up[i], act);
    gate[i] = v;
    if (qfmt == RN_Q8K) {
        __shared__ __align__(16) float staged[256];
        staged[threadIdx.x] = v;
        __syncthreads();
        if (threadIdx.x < 32) q8k_block(staged, a, n_t, t, width, blk);
    } else {
        q8_block(v, a, n_t, t, width, blk * 8 + (threadIdx.x >> 5));
    }
}

extern "C" __global__ void to_f16(const float* __restrict__ x, u16* __restrict__ out, size_t n) {
    WAIT_PRIOR_GRID();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2h(x[i]);
}

// out[j] = x[rows[j]]: one block per output row.
extern "C" __global__ void gather_rows(const float* __restrict__ x, const int* __restrict__ rows,
                                       float* __restrict__ out, int width) {
    WAIT_PRIOR_GRID();
    const float* src = x + (size_t)rows[blockIdx.x] * width;
    float* dst = out + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
}

// Mixture-of-experts routing, as `Routing::from_logits` (tandem-model's moe.rs) computes it: one
// warp per row of `logits` (rows x n, row-major; n at most 32 * MOE_ROUTE_MAX_PER_LANE), its
// probabilities in shared memory. The softmax subtracts the row's maximum (order-free: NaNs are
// ignored as f32::max ignores them) and sums the f32 exponentials in f64 in expert order (lane 0, so
// the bits are the host's sequential sum's). Each of the k slots takes the most probable expert not
// yet taken, as the host's scan in expert order does: the first untaken expert starts it, so when
// that one's probability is NaN it keeps the slot; else the largest non-NaN probability wins, the
// lowest index among equals (each lane scans its experts in order, then a butterfly keeps the
// larger, ties to the lower index). The weights are the chosen probabilities, divided by their
// slot-order f32 sum (at least MOE_MIN_WEIGHT_SUM) when `norm` is set. A decode step routes in one
// warp's few microseconds where a thread per row walked every slot over every expert alone.
#define MOE_MIN_WEIGHT_SUM 6.1035156e-5f
#define MOE_ROUTE_WARPS 4
#define MOE_ROUTE_MAX_PER_LANE 32
extern "C" __global__ void __launch_bounds__(32 * MOE_ROUTE_WARPS) moe_route(const float* __restrict__ logits, int rows,
                                                                             int n, int k, int norm,
                                                                             int* __restrict__ ids,
                                                                             float* __restrict__ weights) {
    WAIT_PRIOR_GRID();
    extern __shared__ float moe_route_probs[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int r = blockIdx.x * MOE_ROUTE_WARPS + warp;
    if (r >= rows) return;  // the whole warp: no barrier below spans warps
    float* p = moe_route_probs + warp * n;
    const float* x = logits + (size_t)r * n;
    float mx = -INFINITY;
    for (int e = lane; e < n; e += 32) mx = fmaxf(mx, x[e]);
    mx = warp_max(mx);
    for (int e = lane; e < n; e += 32) p[e] = expf(x[e] - mx);
    __syncwarp();
    float inv = 0.f;
    if (lane == 0) {
        double sum = 0.0;
        for (int e = 0; e < n; e++) sum += (double)p[e];
        inv = (float)(1.0 / sum);
    }
    inv = __shfl_sync(0xffffffffu, inv, 0);
    __syncwarp();
    for (int e = lane; e < n; e += 32) p[e] = __fmul_rn(p[e], inv);
    __syncwarp();
    int* id = ids + (size_t)r * k;
    float* w = weights + (size_t)r * k;
    unsigned taken = 0u;  // bit j: expert lane + 32 j
    for (int s = 0; s < k; s++) {
        int first = n, mine = n;
        float mine_p = 0.f;
        for (int j = 0, e = lane; e < n; j++, e += 32) {
            if ((taken >> j) & 1u) continue;
            float q = p[e];
            if (first == n) first = e;
            if (!isnan(q) && (mine == n || q > mine_p)) {
                mine = e;
                mine_p = q;
            }
        }
        for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
        for (int o = 16; o > 0; o >>= 1) {
            float other_p = __shfl_xor_sync(0xffffffffu, mine_p, o);
            int other = __shfl_xor_sync(0xffffffffu, mine, o);
            if (other < n && (mine == n || other_p > mine_p || (other_p == mine_p && other < mine))) {
                mine = other;
                mine_p = other_p;
            }
        }
        int best = isnan(p[first]) ? first : mine;
        if ((best & 31) == lane) taken |= 1u << (best >> 5);
        if (lane == 0) {
            id[s] = best;
            w[s] = p[best];
        }
    }
    if (norm && lane == 0) {
        float total = 0.f;
        for (int s = 0; s < k; s++) total = __fadd_rn(total, w[s]);
        total = fmaxf(total, MOE_MIN_WEIGHT_SUM);
        for (int s = 0; s < k; s++) w[s] = __fdiv_rn(w[s], total);
    }
}

// Each row's mixture output: out[r] = sum over its k slots, in slot order, of weights[r*k+s] times
// row pos[r*k+s] of `expert_out` (the experts' outputs, `width` wide; a null `pos`: row r*k+s, the
// pairs' own order). Separately rounded products and sums, as the CPU's `combine`; one block per
// row, no atomics.
extern "C" __global__ void moe_combine(const float* __restrict__ expert_out, const int* __restrict__ pos,
                                       const float* __restrict__ weights, float* __restrict__ out, int k,
                                       int width) {
    WAIT_PRIOR_GRID();
    size_t first = (size_t)blockIdx.x * k;
    const float* w = weights + first;
    float* dst = out + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        size_t at = pos ? (size_t)pos[first] : first;
        float acc = __fmul_rn(w[0], expert_out[at * width + i]);
        for (int s = 1; s < k; s++) {
            at = pos ? (size_t)pos[first + s] : first + s;
            acc = __fadd_rn(acc, __fmul_rn(w[s], expert_out[at * width + i]));
        }
        dst[i] = acc;
    }
}

// A chunk's (row, slot) pairs sorted by expert on the device, for the grouped products
// (`mmq_ids_*`), so no routing comes back to the host: `ids` holds `pairs` experts of 0..n, k a row.
// Sorted position s holds the pairs of expert 0 first, each expert's in pair order (stable, so the
// order depends on the routing alone); `src_row[s]` is the chunk row of the pair at s (pair / k) and
// `pos[p]` the position of pair p (what `moe_combine` reads). `tiles` gets the tile count, then per
// tile of up to MOE_SORT_TILE positions of one expert: (expert, first position, end of the expert's
// positions). One block: counts by shared atomics, the offsets by one thread, then warp w places
// experts w, w + warps, ...: each scan of 32 pairs is a ballot, each pair's place the count of earlier
// matching lanes. An id outside 0..n (which `moe_route` never writes) is in no group.
#define MOE_SORT_TILE 16
extern "C" __global__ void moe_sort(const int* __restrict__ ids, int pairs, int n, int k, int* __restrict__ src_row,
                                    int* __restrict__ pos, int* __restrict__ tiles) {
    WAIT_PRIOR_GRID();
    extern __shared__ int moe_sort_shared[];
    int* count = moe_sort_shared;
    int* first = count + n;
    int* first_tile = first + n;
    for (int e = threadIdx.x; e < n; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int e = ids[p];
        if (e >= 0 && e < n) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0, t = 0;
        for (int e = 0; e < n; e++) {
            first[e] = s;
            first_tile[e] = t;
            s += count[e];
            t += (count[e] + MOE_SORT_TILE - 1) / MOE_SORT_TILE;
        }
        tiles[0] = t;
    }
    __syncthreads();
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    unsigned before = (1u << lane) - 1u;
    for (int e = threadIdx.x >> 5; e < n; e += warps) {
        int at = first[e];
        for (int base = 0; base < pairs; base += 32) {
            int p = base + lane;
            bool mine = p < pairs && ids[p] == e;
            unsigned hits = __ballot_sync(0xffffffffu, mine);
            if (mine) {
                int s = at + __popc(hits & before);
                src_row[s] = p / k;
                pos[p] = s;
            }
            at += __popc(hits);
        }
        int end = first[e] + count[e];
        for (int s = first[e], t = first_tile[e]; s < end; s += MOE_SORT_TILE, t++) {
            if (lane == 0) {
                tiles[1 + 3 * t] = e;
                tiles[2 + 3 * t] = s;
                tiles[3 + 3 * t] = end;
            }
        }
    }
}

// Writes rows of K and V (f32) into f16 cache rows: row i goes to physical row dst[i] (-1: skipped,
// a row the ring evicts within the same chunk). One block per row.
extern "C" __global__ void kv_store(const float* __restrict__ k, const float* __restrict__ v,
                                    u16* __restrict__ kc, u16* __restrict__ vc, const int* __restrict__ dst,
                                    int width) {
    WAIT_PRIOR_GRID();
    int d = dst[blockIdx.x];
    if (d < 0) return;
    const float* ks = k + (size_t)blockIdx.x * width;
    const float* vs = v + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        kc[(size_t)d * width + i] = f2h(ks[i]);
        vc[(size_t)d * width + i] = f2h(vs[i]);
    }
}

// Copies cache rows src[i] (physical) to rows i of a staging buffer, K and V. One block per row.
extern "C" __global__ void kv_gather(const u16* __restrict__ kc, const u16* __restrict__ vc,
                                     const int* __restrict__ src, u16* __restrict__ ks, u16* __restrict__ vs,
                                     int width) {
    WAIT_PRIOR_GRID();
    size_t s = (size_t)src[blockIdx.x] * width, d = (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        ks[d + i] = kc[s + i];
        vs[d + i] = vc[s + i];
    }
}

// Reads `n` 16-byte words and keeps nothing (the store runs only for n == 0, which never happens, so
// the loads stay): the load-time tuning runs it between timed launches so that L2 holds clean lines
// of another buffer, as it does after a decode step's earlier kernels, rather than dirty ones a
// memset would leave (their write-back would slow the timed kernel's reads).
extern "C" __global__ void l2_flush(const uint4* __restrict__ p, size_t n, u32* __restrict__ sink) {
    WAIT_PRIOR_GRID();
    u32 acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (n == 0) *sink = acc;
}

// Keeps the GPU busy for `ns` nanoseconds (one thread). The op profiler launches it before each op's
// start event, so the host has enqueued the whole op by the time the GPU reaches it: the events then
// time the GPU's work, not the host's launch overhead.
extern "C" __global__ void gpu_hold(long long ns) {
    WAIT_PRIOR_GRID();
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

// ---- What a hand-over between two dependent steps costs (`tandem-dev bench handover`,
// `handover.rs`): a decode step is about 260 dependent steps, each now a launch under a programmatic
// edge. `handover_link` is one such step: every thread reads what a thread of another block wrote in
// the launch before (from L2), so no launch can skip its predecessor. `handover_resident` runs
// `steps` of the same steps in one resident grid, with a grid-wide barrier between them (an arrival
// counter every block's first thread counts into and polls), as a persistent decode kernel would.
extern "C" __global__ void handover_link(const float* __restrict__ in, float* __restrict__ out) {
    WAIT_PRIOR_GRID();
    int n = gridDim.x * blockDim.x, i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = __ldcg(in + (i + blockDim.x) % n) + 1.f;
}

__device__ __forceinline__ u32 ld_acquire_gpu(const u32* p) {
    u32 v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// `buf`: two rows of gridDim.x * blockDim.x floats (read one, write the other); `arrived`: zero at
// launch. The grid must be resident at once (the host sizes it by occupancy).
extern "C" __global__ void handover_resident(float* __restrict__ buf, u32* __restrict__ arrived, int steps) {
    WAIT_PRIOR_GRID();
    int n = gridDim.x * blockDim.x, i = blockIdx.x * blockDim.x + threadIdx.x;
    for (int s = 1; s <= steps; s++) {
        const float* in = buf + (size_t)((s - 1) & 1) * n;
        float* out = buf + (size_t)(s & 1) * n;
        out[i] = __ldcg(in + (i + blockDim.x) % n) + 1.f;
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(arrived, 1u);
            u32 target = (u32)s * gridDim.x;
            while (ld_acquire_gpu(arrived) < target) {
            }
        }
        __syncthreads();
    }
}

// ---- Memory latency under a weight stream (`tandem-dev bench latency`, `latency.rs`): the
// question an overlapping decode design has to answer first (docs/OVERLAPPED-DECODE.md) is how much
// slower a latency-bound kernel's round trips get while other SMs stream weights at full rate.
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// `chase_latency`: one thread follows `steps` links of a random cycle (`next`) from `start`, each
// load from L2 (`ld.global.cg`, no L1), so each step is one round trip; the final index keeps the
// loads alive. `clock` gets the global clock (ns) at its start and end, to check that it ran beside
// the stream.
extern "C" __global__ void chase_latency(const u32* __restrict__ next, u32 start, int steps, u32* __restrict__ out,
                                         unsigned long long* __restrict__ clock) {
    WAIT_PRIOR_GRID();
    unsigned long long t0 = now_ns();
    u32 i = start;
    for (int s = 0; s < steps; s++) i = __ldcg(next + i);
    *out = i;
    clock[0] = t0;
    clock[1] = now_ns();
}

// `stream_weights`: every thread reads 16-byte pieces of `p` (n of them) `passes` times, as the
// matvecs read weights (evict-first from L2, not kept in L1), four loads in flight a thread.
// `clock`: the earliest block start and the latest block end (ns), zero before the launch.
extern "C" __global__ void stream_weights(const uint4* __restrict__ p, size_t n, int passes, u32* __restrict__ sink,
                                          unsigned long long* __restrict__ clock) {
    WAIT_PRIOR_GRID();
    if (threadIdx.x == 0) atomicMin(clock, now_ns());
    u32 acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (int pass = 0; pass < passes; pass++) {
        size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
        for (; i + 3 * stride < n; i += 4 * stride) {
            uint4 a = ld_weights16(p + i), b = ld_weights16(p + i + stride);
            uint4 c = ld_weights16(p + i + 2 * stride), d = ld_weights16(p + i + 3 * stride);
            acc ^= a.x ^ b.y ^ c.z ^ d.w;
        }
        for (; i < n; i += stride) acc ^= ld_weights16(p + i).x;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
    __syncthreads();
    if (threadIdx.x == 0) atomicMax(clock + 1, now_ns());
}
