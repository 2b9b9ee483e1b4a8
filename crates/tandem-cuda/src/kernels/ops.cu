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

// `add_norm_to` for rows of at most RN_IN_REGS elements a thread: each thread loads its elements (x,
// y, post, weight) once, up front, and keeps them in registers through the sums, so the kernel waits
// for memory once instead of once per pass. Element i is thread i % blockDim's, summed in the order
// the passes of `add_norm_to` sum them: the same bits.
#define RN_IN_REGS 4
__device__ __forceinline__ void add_norm_in_regs(float* __restrict__ xr, const float* __restrict__ g,
                                                 const float* __restrict__ post, float* __restrict__ o,
                                                 const float* __restrict__ weight, int width, float eps, int flags,
                                                 u8* __restrict__ a, int n_t, int row, float* staged) {
    float xv[RN_IN_REGS], gv[RN_IN_REGS], pv[RN_IN_REGS], wv[RN_IN_REGS];
#pragma unroll
    for (int k = 0; k < RN_IN_REGS; k++) {
        int i = threadIdx.x + k * blockDim.x;
        bool live = i < width;
        xv[k] = live ? xr[i] : 0.f;
        gv[k] = live && (flags & RN_ADD) ? g[i] : 0.f;
        pv[k] = live && (flags & RN_POST) ? post[i] : 0.f;
        wv[k] = live && (flags & RN_NORM) ? weight[i] : 0.f;
    }
    if (flags & RN_ADD) {
        float scale = 1.f;
        if (flags & RN_POST) {
            float s = 0.f;
#pragma unroll
            for (int k = 0; k < RN_IN_REGS; k++)
                if (threadIdx.x + k * blockDim.x < width) s = fmaf(gv[k], gv[k], s);
            scale = rsqrtf(block_total(s) / width + eps);
        }
#pragma unroll
        for (int k = 0; k < RN_IN_REGS; k++) {
            int i = threadIdx.x + k * blockDim.x;
            if (i < width) {
                xv[k] += (flags & RN_POST) ? gv[k] * scale * pv[k] : gv[k];
                xr[i] = xv[k];
            }
        }
    }
    if (!(flags & RN_NORM)) return;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < RN_IN_REGS; k++)
        if (threadIdx.x + k * blockDim.x < width) s = fmaf(xv[k], xv[k], s);
    float scale = rsqrtf(block_total(s) / width + eps);
#pragma unroll
    for (int k = 0; k < RN_IN_REGS; k++) {
        // Whole passes of the block, as `add_norm_to` takes them (q8_block needs whole warps).
        if (k * (int)blockDim.x >= width) break;
        int i = threadIdx.x + k * blockDim.x;
        bool live = i < width;
        norm_out(live ? xv[k] * scale * wv[k] : 0.f, live, i, o, flags, a, n_t, row, width, staged);
    }
    norm_out_q8k(flags, a, n_t, row, width, staged);
}

extern "C" __global__ void __launch_bounds__(1024) add_norm_to(float* __restrict__ x, const float* __restrict__ y,
                                                                const float* __restrict__ post, float* __restrict__ out,
                                                                const float* __restrict__ weight, int width, float eps,
                                                                int flags, u8* __restrict__ a, int n_t) {
    int row = blockIdx.x;
    __shared__ __align__(16) float staged[RN_MAX_Q8K_WIDTH];
    if (width <= RN_IN_REGS * (int)blockDim.x) {
        add_norm_in_regs(x + (size_t)row * width, y + (size_t)row * width, post, out + (size_t)row * width, weight,
                         width, eps, flags, a, n_t, row, staged);
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

// RoPE on every head of every row of x (nx heads a row) and of y (ny heads; q and k in one launch):
// one thread per (row, group of ROPE_HEADS heads, rotated pair), so the angle's sine and cosine are
// computed once for the group (prefill spends its time there, not in the loads). `neox` pairs i with
// i + n_rot/2, otherwise 2i with 2i+1. Angles as ggml forms them: pos * freq_scale * base^(-2i/n_rot).
#define ROPE_HEADS 8
extern "C" __global__ void rope(float* __restrict__ x, float* __restrict__ y, const int* __restrict__ pos, int rows,
                                int nx, int ny, int head_dim, int n_rot, float base, float freq_scale, int neox) {
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
    float theta = pos[r] * freq_scale * powf(base, -2.0f * p / n_rot);
    float c = cosf(theta), s = sinf(theta);
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
            hp[j][a] = x0[j] * c - x1[j] * s;
            hp[j][b] = x0[j] * s + x1[j] * c;
        }
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

// `gated`, and the result quantized for the integer kernels (qfmt RN_Q8K or RN_Q8): one block of 256
// per (256 elements, row); `width` a multiple of 256.
extern "C" __global__ void __launch_bounds__(256) gated_quant(float* __restrict__ gate, const float* __restrict__ up,
                                                               int width, int act, int qfmt, u8* __restrict__ a,
                                                               int n_t) {
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
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f2h(x[i]);
}

// out[j] = x[rows[j]]: one block per output row.
extern "C" __global__ void gather_rows(const float* __restrict__ x, const int* __restrict__ rows,
                                       float* __restrict__ out, int width) {
    const float* src = x + (size_t)rows[blockIdx.x] * width;
    float* dst = out + (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i];
}

// Writes rows of K and V (f32) into f16 cache rows: row i goes to physical row dst[i] (-1: skipped,
// a row the ring evicts within the same chunk). One block per row.
extern "C" __global__ void kv_store(const float* __restrict__ k, const float* __restrict__ v,
                                    u16* __restrict__ kc, u16* __restrict__ vc, const int* __restrict__ dst,
                                    int width) {
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
    size_t s = (size_t)src[blockIdx.x] * width, d = (size_t)blockIdx.x * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        ks[d + i] = kc[s + i];
        vs[d + i] = vc[s + i];
    }
}

// Keeps the GPU busy for `ns` nanoseconds (one thread). The op profiler launches it before each op's
// start event, so the host has enqueued the whole op by the time the GPU reaches it: the events then
// time the GPU's work, not the host's launch overhead.
extern "C" __global__ void gpu_hold(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
