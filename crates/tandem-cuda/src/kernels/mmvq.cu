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
// Quantized activations: the layout and the quantizers (`q8k_block`, `q8_block`) are in common.cuh,
// shared with the norm and gating kernels that write this form directly. The quants and sums are
// whole 16-byte lines (cols is a multiple of 256 for Q8_K), so kernels read them with 16-byte loads.
//
// Weights: Q4_K is read in its ggml layout (144-byte super-blocks, 16-byte aligned). Q6_K (210 bytes)
// and Q8_0 (34 bytes) are not 16-byte aligned, so they are repacked once at load (`repack_*`): each row
// keeps its quants in aligned blocks, and every block's f16 scale moves to a table after all rows.
// The repacked matrix has exactly the bytes of the original.

__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

// One warp per (row, Q8_K block of 256), four per block.
extern "C" __global__ void __launch_bounds__(128) quantize_q8k(const float* __restrict__ x, u8* __restrict__ a,
                                                               int n_t, int cols) {
    int blk = blockIdx.x * 4 + (threadIdx.x >> 5), t = blockIdx.y;
    if (blk >= cols / 256) return;
    q8k_block(x + (size_t)t * cols + blk * 256, a, n_t, t, cols, blk);
}

// One warp per (row, Q8 block of 32): lane i quantizes element i.
extern "C" __global__ void __launch_bounds__(128) quantize_q8(const float* __restrict__ x, u8* __restrict__ a,
                                                              int n_t, int cols) {
    int blk = blockIdx.x * 4 + (threadIdx.x >> 5), t = blockIdx.y;
    if (blk >= cols / 32) return;
    q8_block(x[(size_t)t * cols + blk * 32 + (threadIdx.x & 31)], a, n_t, t, cols, blk);
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
// (grid.y). Lanes split a row's blocks in a fixed pattern; each lane first issues the loads of U
// steps (so a warp keeps several KB in flight: the smaller matrices of a decode step are otherwise
// bound by memory latency, not bandwidth), then computes them in ascending order. Per-lane float sums
// run in ascending block order whatever U is, then the fixed warp butterfly: a row's result depends on
// `cols` alone, never on n_t, on U or on the rows batched with it. U is chosen per shape at load by
// timing (`tune_decode`).

// Four int8 products of 16 weights with 16 activations, summed.
__device__ __forceinline__ int dot16(const int* v, int4 x) {
    return dp4a(v[3], x.w, dp4a(v[2], x.z, dp4a(v[1], x.y, dp4a(v[0], x.x, 0))));
}

// Q4_K: four lanes per super-block, eight super-blocks per step. Lane c = lane % 4 takes chunk c of
// the quants (32 bytes: low nibbles are sub-block 2c, high nibbles sub-block 2c + 1), so one decode of
// the packed scales serves 64 weights. A warp takes R consecutive rows: each step's activation loads
// serve all of them (per weight byte, the activations are most of what a lane loads).
template <int NB, int U, int R, int S>
__device__ __forceinline__ void mmvq_q4_k_rows(WarpRow<NB>* m, const u8* W, const u8* A, int rows, int cols, int n_t) {
    int nsb = cols / 256;
    int lane = m[0].lane, c = lane & 3, part = S == 1 ? 0 : threadIdx.x >> 5;
    const u8* row[R];
#pragma unroll
    for (int j = 0; j < R; j++) row[j] = W + (size_t)m[j].r * nsb * 144;
    for (int base = (lane >> 2) + 8 * part; base < nsb; base += 8 * S * U) {
        uint4 head[R][U], qa[R][U], qb[R][U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int sb = base + 8 * S * u;
            if (sb < nsb) {
#pragma unroll
                for (int j = 0; j < R; j++) {
                    const u8* b = row[j] + (size_t)sb * 144;
                    head[j][u] = ldg16(b);
                    qa[j][u] = ldg16(b + 16 + c * 32);
                    qb[j][u] = ldg16(b + 32 + c * 32);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int sb = base + 8 * S * u;
            if (sb >= nsb) break;
            float d[R], dmin[R];
            int sc0[R], m0[R], sc1[R], m1[R], lo[R][8], hi[R][8];
#pragma unroll
            for (int j = 0; j < R; j++) {
                const u8* hb = (const u8*)&head[j][u];
                d[j] = h2f((u16)hb[0] | ((u16)hb[1] << 8));
                dmin[j] = h2f((u16)hb[2] | ((u16)hb[3] << 8));
                scale_min_k4(2 * c, hb + 4, &sc0[j], &m0[j]);
                scale_min_k4(2 * c + 1, hb + 4, &sc1[j], &m1[j]);
                u32 q[8] = {qa[j][u].x, qa[j][u].y, qa[j][u].z, qa[j][u].w,
                            qb[j][u].x, qb[j][u].y, qb[j][u].z, qb[j][u].w};
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    lo[j][i] = (int)(q[i] & 0x0F0F0F0Fu);
                    hi[j][i] = (int)((q[i] >> 4) & 0x0F0F0F0Fu);
                }
            }
            int e = sb * 256 + c * 64;
#pragma unroll
            for (int t = 0; t < NB; t++) {
                if (t < m[0].nt) {
                    const signed char* xq = act_qs(A, m[0].t0 + t, cols) + e;
                    int4 x0 = ldx16(xq), x1 = ldx16(xq + 16), x2 = ldx16(xq + 32), x3 = ldx16(xq + 48);
                    int4 bs = __ldg((const int4*)(act_sums(A, n_t, m[0].t0 + t, cols) + e / 16));
                    float dx = __ldg(act_d(A, n_t, m[0].t0 + t, cols, 256) + sb);
#pragma unroll
                    for (int j = 0; j < R; j++) {
                        int dl = dot16(lo[j] + 4, x1) + dot16(lo[j], x0);
                        int dh = dot16(hi[j] + 4, x3) + dot16(hi[j], x2);
                        int isum = sc0[j] * dl + sc1[j] * dh, msum = m0[j] * (bs.x + bs.y) + m1[j] * (bs.z + bs.w);
                        m[j].acc[t] += dx * (d[j] * (float)isum - dmin[j] * (float)msum);
                    }
                }
            }
        }
    }
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
template <int NB, int U, int R, int S>
__device__ __forceinline__ void mmvq_q6_k_rows(WarpRow<NB>* ms, const u8* W, const u8* A, int rows, int cols, int n_t) {
    static_assert(R == 1, "one row per warp");
    WarpRow<NB>& m = ms[0];
    int part = S == 1 ? 0 : threadIdx.x >> 5;
    int nsb = cols / 256;
    const u8* row = W + (size_t)m.r * nsb * 208;
    const u16* dtab = (const u16*)(W + (size_t)rows * nsb * 208) + (size_t)m.r * nsb;
    int k = m.lane & 3, h = k >> 1, l0 = (k & 1) * 16, g = l0 >> 4;
    for (int base = (m.lane >> 2) + 8 * part; base < nsb; base += 8 * S * U) {
        uint4 qa[U], qb[U], qh[U];
        uint2 scw[U];
        u16 dh[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int sb = base + 8 * S * u;
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
            int sb = base + 8 * S * u;
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
}

// Q8_0 (repacked): two lanes per 32-element block (16 quants each), sixteen blocks per step.
template <int NB, int U, int R, int S>
__device__ __forceinline__ void mmvq_q8_0_rows(WarpRow<NB>* ms, const u8* W, const u8* A, int rows, int cols, int n_t) {
    static_assert(R == 1, "one row per warp");
    WarpRow<NB>& m = ms[0];
    int part = S == 1 ? 0 : threadIdx.x >> 5;
    int nb = cols / 32;
    const u8* row = W + (size_t)m.r * cols;
    const u16* dtab = (const u16*)(W + (size_t)rows * cols) + (size_t)m.r * nb;
    int half = m.lane & 1;
    for (int base = (m.lane >> 1) + 16 * part; base < nb; base += 16 * S * U) {
        int4 w[U];
        u16 dw[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int ib = base + 16 * S * u;
            if (ib < nb) {
                w[u] = __ldg((const int4*)(row + ib * 32 + half * 16));
                dw[u] = __ldg(dtab + ib);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int ib = base + 16 * S * u;
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
}

// A launch covers up to three matrices of one type and width that read the same activations (q, k
// and v; gate and up): row groups of W0, then W1, then W2 (rows1 = rows2 = 0 for one matrix), R
// consecutive rows to a group (every matrix's rows a multiple of R). S = 1: each warp of a block takes
// its own group. S = 4: the block's four warps split one group's blocks (warp w takes steps w, w + 4,
// ...) and add their sums in a fixed order, for long rows that would leave too few warps. A row's sums
// are the same in a group as alone and for every U and R; S sets their order. One row of activations
// takes the single-row kernel, more the batched one: same sums, same bits.
template <int NB, int R, int S>
__device__ __forceinline__ bool mmvq_target(int rows0, int rows1, int rows2, int n_t, const u8** W, float** Y,
                                            int* rows, WarpRow<NB>* m, const u8* W1, const u8* W2, float* Y1,
                                            float* Y2) {
    int groups = (rows0 + rows1 + rows2) / R;
    // Lane, activation rows and zeroed sums as every warp-per-row kernel sets them; the row it gives
    // is the warp's group for S = 1, while S = 4 takes a group per block.
    warp_row<NB>(groups, n_t, &m[0]);
    int group = S == 1 ? m[0].r : blockIdx.x;
    if (group >= groups) return false;
    int r = group * R;
    *rows = rows0;
    if (r >= rows0) {
        r -= rows0;
        *W = W1, *Y = Y1, *rows = rows1;
        if (r >= rows1) {
            r -= rows1;
            *W = W2, *Y = Y2, *rows = rows2;
        }
    }
#pragma unroll
    for (int j = 0; j < R; j++) {
        m[j] = m[0];
        m[j].r = r + j;
    }
    return true;
}

// Stores the group's rows: each warp's sums over its lanes (fixed butterfly), then for S = 4 the four
// warps' sums as (w0 + w1) + (w2 + w3).
template <int NB, int R, int S>
__device__ __forceinline__ void mmvq_store(WarpRow<NB>* m, float* Y, int rows) {
    if (S == 1) {
#pragma unroll
        for (int j = 0; j < R; j++) warp_row_store<NB>(m[j], Y, rows);
        return;
    }
    __shared__ float red[R][NB][4];
    int w = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < R; j++)
#pragma unroll
        for (int t = 0; t < NB; t++) {
            float v = warp_sum(m[j].acc[t]);
            if (m[j].lane == 0) red[j][t][w] = v;
        }
    __syncthreads();
    if (threadIdx.x < R * NB) {
        int j = threadIdx.x / NB, t = threadIdx.x % NB;
        const float* p = red[j][t];
        if (t < m[0].nt) Y[(size_t)(m[0].t0 + t) * rows + m[j].r] = (p[0] + p[1]) + (p[2] + p[3]);
    }
}

#define MMVQ_KERNEL(NAME, T, NB, U, R, S)                                                           \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                        \
        const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2,           \
        const u8* __restrict__ A, float* __restrict__ Y0, float* __restrict__ Y1, float* __restrict__ Y2, \
        int rows0, int rows1, int rows2, int cols, int n_t) {                                      \
        WarpRow<NB> m[R];                                                                          \
        const u8* W = W0;                                                                          \
        float* Y = Y0;                                                                             \
        int rows;                                                                                  \
        if (!mmvq_target<NB, R, S>(rows0, rows1, rows2, n_t, &W, &Y, &rows, m, W1, W2, Y1, Y2)) return; \
        mmvq_##T##_rows<NB, U, R, S>(m, W, A, rows, cols, n_t);                                    \
        mmvq_store<NB, R, S>(m, Y, rows);                                                          \
    }
#define MMVQ(T, U, R, S)                                                  \
    MMVQ_KERNEL(mmvq_##T##_u##U##_r##R##_s##S, T, 1, U, R, S)             \
    MMVQ_KERNEL(mmvqb_##T##_u##U##_r##R##_s##S, T, MV_BATCH, U, R, S)

// The variants the load-time timing chooses from (`int8::variants`): U steps of loads in flight per
// lane (K-quant steps are 8 super-blocks of a row, Q8_0 steps 16 blocks of 32), R rows per group, S
// warps per group.
MMVQ(q4_k, 1, 1, 1)
MMVQ(q4_k, 2, 1, 1)
MMVQ(q4_k, 4, 1, 1)
MMVQ(q4_k, 1, 2, 1)
MMVQ(q4_k, 2, 2, 1)
MMVQ(q6_k, 1, 1, 1)
MMVQ(q6_k, 2, 1, 1)
MMVQ(q6_k, 4, 1, 1)
MMVQ(q6_k, 1, 1, 4)
MMVQ(q6_k, 2, 1, 4)
MMVQ(q8_0, 2, 1, 1)
MMVQ(q8_0, 4, 1, 1)
MMVQ(q8_0, 8, 1, 1)
MMVQ(q8_0, 1, 1, 4)
MMVQ(q8_0, 2, 1, 4)
