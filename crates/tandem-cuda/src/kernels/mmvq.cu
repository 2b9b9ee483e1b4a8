// The integer decode route: activations are quantized to int8 once per matmul input, then the weights'
// integer quants meet them in `dp4a` (four int8 products summed in one instruction), so a weight costs
// a fraction of an instruction instead of a decode to f32 and an FMA. That is what lets one step read
// the weights at memory speed: the float kernels in quant.cu are instruction-bound.
//
// Activations are quantized exactly as the CPU backend does it (itself llama.cpp's x86 CPU backend):
// Q8_K blocks of 256 (`nearest_int(x * -127 / max)`, f32 scale) for K-quant weights, Q8 blocks of 32
// (`round_half_even(x * 127 / amax)`, scale rounded to f16) for Q8_0 weights. The integer products
// are then the CPU's exactly; only the order of the float sums over blocks differs.
//
// Quantized activations of `n_t` rows of `cols`, in one byte buffer (see `act_bytes` in launch.rs):
//   qs: n_t * cols int8 | sums: n_t * (cols / 16) int32 (Q8_K only) | d: n_t * (cols / B) f32
// with B = 256 (Q8_K) or 32 (Q8). The quants and sums are whole 16-byte lines (cols is a multiple of
// 256 for Q8_K), so kernels read them with 16-byte loads.
//
// Weights: Q4_K is read in its ggml layout (144-byte super-blocks, 16-byte aligned). Q6_K (210 bytes)
// and Q8_0 (34 bytes) are not 16-byte aligned, so they are repacked once at load (`repack_*`): each row
// keeps its quants in aligned blocks, and every block's f16 scale moves to a table after all rows.
// The repacked matrix has exactly the bytes of the original.

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

__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

// One block of 256 threads per (row, Q8_K block): thread i quantizes element i.
extern "C" __global__ void __launch_bounds__(256) quantize_q8k(const float* __restrict__ x, u8* __restrict__ a,
                                                               int n_t, int cols) {
    __shared__ float red_abs[8];
    __shared__ int red_idx[8];
    __shared__ int qsum[16];
    int t = blockIdx.y, blk = blockIdx.x, i = threadIdx.x, lane = i & 31, wid = i >> 5;
    float v = x[(size_t)t * cols + blk * 256 + i];
    float av = fabsf(v);
    // The largest magnitude, then the first element holding it: its sign sets the scale's sign.
    float m = warp_max(av);
    if (lane == 0) red_abs[wid] = m;
    __syncthreads();
    float amax = red_abs[0];
    for (int k = 1; k < 8; k++) amax = fmaxf(amax, red_abs[k]);
    int idx = av == amax ? i : 256;
    for (int o = 16; o > 0; o >>= 1) idx = min(idx, __shfl_xor_sync(0xffffffffu, idx, o));
    if (lane == 0) red_idx[wid] = idx;
    __syncthreads();
    int first = red_idx[0];
    for (int k = 1; k < 8; k++) first = min(first, red_idx[k]);
    float vmax = x[(size_t)t * cols + blk * 256 + first];
    signed char* qs = (signed char*)a + (size_t)t * cols + blk * 256;
    float* d = act_d(a, n_t, t, cols, 256) + blk;
    int* sums = act_sums(a, n_t, t, cols) + blk * 16;
    int q = 0;
    if (vmax != 0.f) {
        float iscale = -127.f / vmax;
        q = min(127, max(-128, __float2int_rn(iscale * v)));
        if (i == 0) *d = 1.f / iscale;
    } else if (i == 0) {
        *d = 0.f;
    }
    qs[i] = (signed char)q;
    // Sums of 16 consecutive quants: half-warps.
    int s = q;
    for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((lane & 15) == 0) qsum[i >> 4] = s;
    __syncthreads();
    if (i < 16) sums[i] = qsum[i];
}

// One warp per (row, Q8 block of 32): lane i quantizes element i.
extern "C" __global__ void __launch_bounds__(128) quantize_q8(const float* __restrict__ x, u8* __restrict__ a,
                                                              int n_t, int cols) {
    int lane = threadIdx.x & 31;
    int blk = blockIdx.x * 4 + (threadIdx.x >> 5), t = blockIdx.y;
    if (blk >= cols / 32) return;
    float v = x[(size_t)t * cols + blk * 32 + lane];
    float amax = warp_max(fabsf(v));
    float id = amax != 0.f ? 127.f / amax : 0.f;
    int q = __float2int_rn(v * id);
    ((signed char*)a)[(size_t)t * cols + blk * 32 + lane] = (signed char)q;
    if (lane == 0) act_d(a, n_t, t, cols, 32)[blk] = h2f(f2h(amax / 127.f));
}

// Repacking for the integer route: each block of `block_bytes` (a 2-byte f16 scale at `scale_off`, its
// `quant_len` quant bytes at `quant_off`) gives its quants to a run of aligned blocks, in order, and
// its scale to a table after all of them. Q6_K: 210-byte blocks, quants (ql, qh, scales) at 0..208,
// d at 208. Q8_0: 34-byte blocks, d at 0, quants at 2..34. One thread per block.
extern "C" __global__ void repack_scales_out(const u8* __restrict__ src, u8* __restrict__ dst, size_t n_blocks,
                                             int block_bytes, int quant_off, int quant_len, int scale_off) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const u8* s = src + i * block_bytes;
    u8* o = dst + i * quant_len;
    for (int k = 0; k < quant_len; k++) o[k] = s[quant_off + k];
    u8* d = dst + n_blocks * quant_len + i * 2;
    d[0] = s[scale_off];
    d[1] = s[scale_off + 1];
}

__device__ __forceinline__ uint4 ldg16(const u8* p) { return __ldg((const uint4*)p); }
__device__ __forceinline__ int4 ldx16(const signed char* p) { return __ldg((const int4*)p); }

// Every kernel below: one warp per weight row (4 per block), up to NB activation rows per grid row
// (grid.y). Lanes split a row's blocks in a fixed pattern; each lane first issues the loads of
// MMVQ_UNROLL steps (so a warp keeps several KB in flight: the smaller matrices of a decode step are
// otherwise bound by memory latency, not bandwidth), then computes them in ascending order. Per-lane
// float sums run in ascending block order, then the fixed warp butterfly: a row's result depends on
// `cols` alone, never on n_t or on the rows batched with it.
#define MMVQ_UNROLL 4

// Four int8 products of 16 weights with 16 activations, summed.
__device__ __forceinline__ int dot16(const int* v, int4 x) {
    return dp4a(v[3], x.w, dp4a(v[2], x.z, dp4a(v[1], x.y, dp4a(v[0], x.x, 0))));
}

// Q4_K: four lanes per super-block, eight super-blocks per step. Lane c = lane % 4 takes chunk c of
// the quants (32 bytes: low nibbles are sub-block 2c, high nibbles sub-block 2c + 1), so one decode of
// the packed scales serves 64 weights.
template <int NB>
__device__ __forceinline__ void mmvq_q4_k_rows(const u8* W, const u8* A, float* Y, int rows, int cols, int n_t) {
    WarpRow<NB> m;
    if (!warp_row<NB>(rows, n_t, &m)) return;
    int nsb = cols / 256;
    const u8* row = W + (size_t)m.r * nsb * 144;
    int c = m.lane & 3;
    constexpr int U = MMVQ_UNROLL / 2;
    for (int base = m.lane >> 2; base < nsb; base += 8 * U) {
        uint4 head[U], qa[U], qb[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int sb = base + 8 * u;
            if (sb < nsb) {
                const u8* b = row + (size_t)sb * 144;
                head[u] = ldg16(b);
                qa[u] = ldg16(b + 16 + c * 32);
                qb[u] = ldg16(b + 32 + c * 32);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int sb = base + 8 * u;
            if (sb >= nsb) break;
            const u8* hb = (const u8*)&head[u];
            float d = h2f((u16)hb[0] | ((u16)hb[1] << 8)), dmin = h2f((u16)hb[2] | ((u16)hb[3] << 8));
            int sc0, m0, sc1, m1;
            scale_min_k4(2 * c, hb + 4, &sc0, &m0);
            scale_min_k4(2 * c + 1, hb + 4, &sc1, &m1);
            u32 q[8] = {qa[u].x, qa[u].y, qa[u].z, qa[u].w, qb[u].x, qb[u].y, qb[u].z, qb[u].w};
            int lo[8], hi[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                lo[i] = (int)(q[i] & 0x0F0F0F0Fu);
                hi[i] = (int)((q[i] >> 4) & 0x0F0F0F0Fu);
            }
            int e = sb * 256 + c * 64;
#pragma unroll
            for (int t = 0; t < NB; t++) {
                if (t < m.nt) {
                    const signed char* xq = act_qs(A, m.t0 + t, cols) + e;
                    int dl = dot16(lo + 4, ldx16(xq + 16)) + dot16(lo, ldx16(xq));
                    int dh = dot16(hi + 4, ldx16(xq + 48)) + dot16(hi, ldx16(xq + 32));
                    int4 bs = __ldg((const int4*)(act_sums(A, n_t, m.t0 + t, cols) + e / 16));
                    int isum = sc0 * dl + sc1 * dh, msum = m0 * (bs.x + bs.y) + m1 * (bs.z + bs.w);
                    float dx = __ldg(act_d(A, n_t, m.t0 + t, cols, 256) + sb);
                    m.acc[t] += dx * (d * (float)isum - dmin * (float)msum);
                }
            }
        }
    }
    warp_row_store<NB>(m, Y, rows);
}

// Six bits per quant from a word of low nibbles (`ql >> nib`) and the matching 2-bit field of `qh`
// (moved to bits 4-5 by `hshift`), minus 32, as four signed bytes.
__device__ __forceinline__ int q6_word(u32 ql, int nib, u32 qh, int hshift) {
    u32 lo = (ql >> nib) & 0x0F0F0F0Fu;
    u32 hi = (hshift >= 0 ? (qh << hshift) : (qh >> -hshift)) & 0x30303030u;
    return (int)__vsubss4(lo | hi, 0x20202020u);
}

// Q6_K (repacked): four lanes per super-block, eight super-blocks per step. Lane k = lane % 4 takes
// half h = k / 2 (128 elements) and l0 = 16 * (k % 2): ql[l0..+16] and ql[32 + l0..+16] of the half,
// and qh[l0..+16], which hold elements {0, 32, 64, 96} + l0 .. + 16 of the half (one 16-element scale
// group each).
template <int NB>
__device__ __forceinline__ void mmvq_q6_k_rows(const u8* W, const u8* A, float* Y, int rows, int cols, int n_t) {
    WarpRow<NB> m;
    if (!warp_row<NB>(rows, n_t, &m)) return;
    int nsb = cols / 256;
    const u8* row = W + (size_t)m.r * nsb * 208;
    const u16* dtab = (const u16*)(W + (size_t)rows * nsb * 208) + (size_t)m.r * nsb;
    int k = m.lane & 3, h = k >> 1, l0 = (k & 1) * 16, g = l0 >> 4;
    constexpr int U = MMVQ_UNROLL / 2;
    for (int base = m.lane >> 2; base < nsb; base += 8 * U) {
        uint4 qa[U], qb[U], qh[U];
        uint2 scw[U];
        u16 dh[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int sb = base + 8 * u;
            if (sb < nsb) {
                const u8* b = row + (size_t)sb * 208;
                qa[u] = ldg16(b + 64 * h + l0);
                qb[u] = ldg16(b + 64 * h + 32 + l0);
                qh[u] = ldg16(b + 128 + 32 * h + l0);
                scw[u] = __ldg((const uint2*)(b + 192 + 8 * h));
                dh[u] = __ldg(dtab + sb);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int sb = base + 8 * u;
            if (sb >= nsb) break;
            const signed char* sc = (const signed char*)&scw[u];
            int s1 = sc[g], s2 = sc[g + 2], s3 = sc[g + 4], s4 = sc[g + 6];
            float d = h2f(dh[u]);
            u32 A4[4] = {qa[u].x, qa[u].y, qa[u].z, qa[u].w}, B4[4] = {qb[u].x, qb[u].y, qb[u].z, qb[u].w};
            u32 H4[4] = {qh[u].x, qh[u].y, qh[u].z, qh[u].w};
            int v1[4], v2[4], v3[4], v4[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                v1[i] = q6_word(A4[i], 0, H4[i], 4);
                v2[i] = q6_word(B4[i], 0, H4[i], 2);
                v3[i] = q6_word(A4[i], 4, H4[i], 0);
                v4[i] = q6_word(B4[i], 4, H4[i], -2);
            }
            int e = sb * 256 + h * 128 + l0;
#pragma unroll
            for (int t = 0; t < NB; t++) {
                if (t < m.nt) {
                    const signed char* xq = act_qs(A, m.t0 + t, cols) + e;
                    int isum = s1 * dot16(v1, ldx16(xq)) + s2 * dot16(v2, ldx16(xq + 32)) +
                               s3 * dot16(v3, ldx16(xq + 64)) + s4 * dot16(v4, ldx16(xq + 96));
                    float dx = __ldg(act_d(A, n_t, m.t0 + t, cols, 256) + sb);
                    m.acc[t] += dx * d * (float)isum;
                }
            }
        }
    }
    warp_row_store<NB>(m, Y, rows);
}

// Q8_0 (repacked): two lanes per 32-element block (16 quants each), sixteen blocks per step.
template <int NB>
__device__ __forceinline__ void mmvq_q8_0_rows(const u8* W, const u8* A, float* Y, int rows, int cols, int n_t) {
    WarpRow<NB> m;
    if (!warp_row<NB>(rows, n_t, &m)) return;
    int nb = cols / 32;
    const u8* row = W + (size_t)m.r * cols;
    const u16* dtab = (const u16*)(W + (size_t)rows * cols) + (size_t)m.r * nb;
    int half = m.lane & 1;
    for (int base = m.lane >> 1; base < nb; base += 16 * MMVQ_UNROLL) {
        int4 w[MMVQ_UNROLL];
        u16 dw[MMVQ_UNROLL];
#pragma unroll
        for (int u = 0; u < MMVQ_UNROLL; u++) {
            int ib = base + 16 * u;
            if (ib < nb) {
                w[u] = __ldg((const int4*)(row + ib * 32 + half * 16));
                dw[u] = __ldg(dtab + ib);
            }
        }
#pragma unroll
        for (int u = 0; u < MMVQ_UNROLL; u++) {
            int ib = base + 16 * u;
            if (ib >= nb) break;
            int wv[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
            float d = h2f(dw[u]);
#pragma unroll
            for (int t = 0; t < NB; t++) {
                if (t < m.nt) {
                    int s = dot16(wv, ldx16(act_qs(A, m.t0 + t, cols) + ib * 32 + half * 16));
                    float dx = __ldg(act_d(A, n_t, m.t0 + t, cols, 32) + ib);
                    m.acc[t] += d * dx * (float)s;
                }
            }
        }
    }
    warp_row_store<NB>(m, Y, rows);
}

// One row of activations takes the single-row kernel, more the batched one: same sums, same bits.
#define MMVQ(T)                                                                                     \
    extern "C" __global__ void __launch_bounds__(128)                                               \
        mmvq_##T(const u8* __restrict__ W, const u8* __restrict__ A, float* __restrict__ Y, int rows, \
                 int cols, int n_t) {                                                               \
        mmvq_##T##_rows<1>(W, A, Y, rows, cols, n_t);                                               \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(128)                                               \
        mmvqb_##T(const u8* __restrict__ W, const u8* __restrict__ A, float* __restrict__ Y, int rows, \
                  int cols, int n_t) {                                                              \
        mmvq_##T##_rows<MV_BATCH>(W, A, Y, rows, cols, n_t);                                        \
    }

MMVQ(q4_k)
MMVQ(q6_k)
MMVQ(q8_0)
