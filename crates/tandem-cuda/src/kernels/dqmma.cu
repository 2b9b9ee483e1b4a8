// Decode batches in default mode (`dqmma_*`; `routes::matmul_route` says when, as timed at load per
// shape: a candidate at 2-8 rows beside the matvec and qmma, and for 9 to `DQMMA_MAX_ROWS` beside
// cuBLAS): the batch reads each quantized Q4_K weight once (per 32 batch rows), where cuBLAS over the
// f16 copy reads 3.6 times the bytes. The weights are dequantized to f16 in
// registers, once for every batch row, and multiplied by the f16 activations (the operand cuBLAS
// reads) with `mma.sync` f16, f32 accumulation.
//
// Why not qmma's integer products: each of them needs its sub-block scale applied per batch row
// (integer multiplies and a float fold an output), so qmma's work grows with every tile of 8 rows;
// here the scales are applied once, to the weights, and a tile of rows costs only its products.
//
// A block is four warps over 64 weight rows (an m-tile of 16 a warp) and a range of super-blocks
// (the grid's y: the K split, so that matrices of few rows still fill the GPU). No block barrier
// stands between a warp and its weights: at one n-tile (up to 8 batch rows) each lane loads them
// straight into registers, the next super-block's while it multiplies this one's; past that, where
// the products need the registers, each warp copies its own rows into its shared stages
// (`cp.async`, three super-blocks ahead) and waits for them alone. The first weights are requested
// before the wait. The block's batch rows of each super-block go through registers into one of two
// interleaved shared buffers (below), one barrier a super-block. With a K split, each block writes its partial sums, and the
// last block of a row group to arrive (a counter a row group, reset by that block) adds them in
// split order, so a launch's bits do not depend on timing.
//
// Fragments (PTX ISA, mma m16n8k16 .f16): lane = 4 g + i; A weight rows g and g + 8, B batch row g,
// C weight rows g and g + 8 times batch rows 2 i and 2 i + 1. The product is a sum over k, so any
// order of k that A and B share gives it: lane i takes half i / 2 (16 bytes) of chunks 2 (i % 2) and
// 2 (i % 2) + 1 of the repacked Q4_K row, one 16-byte load each. Byte l holds weight l of sub-blocks
// 2 c (low nibble) and 2 c + 1 (high), and becomes one f16 pair, scaled by the pair of those
// sub-blocks' scales (no scale is broadcast); the staged activations are interleaved to match, word
// l of chunk c holding positions 64 c + l and 64 c + 32 + l, so each lane's B is four 16-byte
// shared loads a chunk.
//
// Weights: w = f16(d sc) q - f16(dmin m), q exact in f16 (1024 + q, less 1024), one f16 fma, so each
// weight is rounded about as the f16 copy rounds it (which, like it, has no room past 65504). The
// scales are formed in f16 too: sc (6 bits) exact as 1024 + sc less 1024, times d rounded once,
// the same bits as f16(d * sc) in f32; no conversion instruction is on the weights' path.

#define DQ_WARPS 4
#define DQ_BLOCK_ROWS (16 * DQ_WARPS)
// An interleaved activation row: four chunks of 32 words, 36 words apart, and 4 words of padding
// (148 words), so that the eight lanes of each phase of a 16-byte shared load (rows g and g + 1,
// lanes i 0..3: chunks 2 (i % 2) + j, halves i / 2) hit distinct banks.
#define DQ_ROW_WORDS 148
// Super-blocks of weights a warp keeps in flight in its shared stages (`cp.async`), each its 16 rows
// of 144 bytes (region A's 64, region B's 64, the head), rows 144 bytes apart: the eight lanes of a
// phase of a lane's 16-byte reads (rows g and g + 1) then hit distinct banks.
#define DQ_W_STAGES 4
#define DQ_W_ROW 144
#define DQ_W_WARP (16 * DQ_W_ROW)
#define DQ_MAGIC 0x64006400u  // 1024 in each half: 1024 + q is exact for q < 1024

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ void hmma_k16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// (a & mask) | bits in one instruction: as two constants, the compiler gave it two.
__device__ __forceinline__ u32 and_or(u32 a, u32 mask, u32 bits) {
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(bits));
    return d;
}

// Bytes 2 c' and 2 c' + 1 of packed 6-bit values (`q4k_packed`; c' = c & 1 within the word) as an
// exact f16 pair, times `mul` (a pair): the scales (or offsets) of sub-blocks 2 c and 2 c + 1.
__device__ __forceinline__ u32 dq_scale_pair(u32 packed, int c, u32 mul) {
    u32 v = and_or(__byte_perm(packed, 0u, (c & 1) ? 0x4342u : 0x4140u), 0x003F003Fu, DQ_MAGIC);
    return hmul2(hsub2(v, DQ_MAGIC), mul);
}

// Byte j of `word` as weights (low nibble, high nibble), each its sub-block's s q - o (`s`, `o` pairs;
// `shifted` = word >> 4).
__device__ __forceinline__ u32 dq_pair(u32 word, u32 shifted, u32 sel, u32 s, u32 o) {
    u32 h = and_or(__byte_perm(word, shifted, sel), 0x000F000Fu, DQ_MAGIC);
    return hfma2(hsub2(h, DQ_MAGIC), s, o);
}

// A lane's weights of one super-block, read from its warp's stage: for its rows g and g + 8 of the
// warp's m-tile, region h = i / 2 (A: the chunks' first 16 bytes, B: their second) of chunks
// 2 (i % 2) and 2 (i % 2) + 1, and the row's 16-byte head (d, dmin, scales), which the four lanes of
// a row share.
struct DqWeights {
    uint4 q[2][2];  // [row g, g + 8][chunk of the two]
    uint4 head[2];
};

template <int NT>
__device__ __forceinline__ void dqmma_q4_k(const u8* __restrict__ W0, const u8* __restrict__ W1,
                                           const u8* __restrict__ W2, const u16* __restrict__ X, float* __restrict__ Y0,
                                           float* __restrict__ Y1, float* __restrict__ Y2, int rows0, int rows1,
                                           int rows2, int cols, int n_t, float* __restrict__ part,
                                           unsigned* __restrict__ counters) {
    // [2][8 NT][DQ_ROW_WORDS] words: x of this and the next super-block; then each warp's weight
    // stages, [DQ_WARPS][DQ_W_STAGES][16 rows][DQ_W_ROW bytes].
    extern __shared__ __align__(16) u32 dq_ilv[];
    __shared__ unsigned ticket;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, i = lane & 3;
    // The block's matrix and first row.
    int gr0 = blockIdx.x * DQ_BLOCK_ROWS, r0 = gr0;
    const u8* W = W0;
    float* Y = Y0;
    int rows = rows0;
    if (r0 >= rows0) {
        r0 -= rows0, W = W1, Y = Y1, rows = rows1;
        if (r0 >= rows1) r0 -= rows1, W = W2, Y = Y2, rows = rows2;
    }
    int nsb = cols / 256, splits = gridDim.y, split = blockIdx.y;
    int sb0 = split * nsb / splits, sb1 = (split + 1) * nsb / splits;
    int t0 = blockIdx.z * 8 * NT;
    size_t row_bytes = (size_t)nsb * 144;
    const u8* wwarp = W + (size_t)(r0 + 16 * warp) * row_bytes;
    u8* wst = (u8*)(dq_ilv + 2 * 8 * NT * DQ_ROW_WORDS) + warp * DQ_W_STAGES * DQ_W_WARP;
    int h = i >> 1, cbase = 2 * (i & 1);
    // One n-tile: each lane loads its weights straight into registers, the next super-block's while
    // this one multiplies (`load_w`). More: each warp copies its rows into its shared stages, three
    // super-blocks ahead (`stage_w`), which leaves the registers to the wider products.
    constexpr bool STAGED = NT > 1;
    size_t qoff = (h ? (size_t)nsb * 64 : 0) + 16 * cbase;
    const u8* wrow = wwarp + (size_t)g * row_bytes;
    auto load_w = [&](int sb, DqWeights& w) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const u8* row = wrow + 8 * r * row_bytes;
            w.q[r][0] = ld_weights16(row + qoff + sb * 64);
            w.q[r][1] = ld_weights16(row + qoff + sb * 64 + 16);
            w.head[r] = ld_weights16(row + nsb * 128 + sb * 16);
        }
    };
    // The warp's 16 rows of super-block sb into its stage `st` (nine 16-byte pieces a row: region A's
    // four, region B's four, the head), committed as one group; past the range, an empty group, so
    // that every step waits for the same count.
    auto stage_w = [&](int sb, int st) {
        if (sb < sb1) {
            u8* dst = wst + st * DQ_W_WARP;
#pragma unroll
            for (int m = 0; m < 5; m++) {
                int p = lane + 32 * m, rr = p / 9, k = p % 9;
                if (p < 144) {
                    const u8* row = wwarp + (size_t)rr * row_bytes;
                    const u8* src = k < 4   ? row + sb * 64 + 16 * k
                                    : k < 8 ? row + nsb * 64 + sb * 64 + 16 * (k - 4)
                                            : row + nsb * 128 + sb * 16;
                    cp_async16(smem_u32(dst + rr * DQ_W_ROW + 16 * k), src, true);
                }
            }
        }
        cp_async_commit();
    };
    float acc[NT][4];
#pragma unroll
    for (int b = 0; b < NT; b++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[b][e] = 0.f;
    // The first weights are in flight before the wait: no kernel writes them; the activations (the
    // kernel before's output) are read only after it.
    DqWeights wa, wb;
    if constexpr (STAGED) {
#pragma unroll
        for (int st = 0; st < DQ_W_STAGES - 1; st++) stage_w(sb0 + st, st);
    } else {
        if (sb0 < sb1) load_w(sb0, wa);
    }
    WAIT_PRIOR_GRID();
    // A lane's pieces of its warp's stage st.
    auto read_w = [&](int st, DqWeights& w) {
        const u8* s0 = wst + st * DQ_W_WARP + g * DQ_W_ROW;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const u8* row = s0 + 8 * r * DQ_W_ROW;
            w.q[r][0] = *(const uint4*)(row + 64 * h + 16 * cbase);
            w.q[r][1] = *(const uint4*)(row + 64 * h + 16 * cbase + 16);
            w.head[r] = *(const uint4*)(row + 128);
        }
    };
    // A thread's share of the block's batch rows of super-block sb (rows past the batch are zeros):
    // unit u = thread + 128 k is batch row u / 16, chunk (u / 4) % 4, positions 8 (u % 4) .. + 8 of
    // both its sub-blocks.
    auto load_x = [&](int sb, uint4 (&x)[NT][2]) {
#pragma unroll
        for (int k = 0; k < NT; k++) {
            int u = threadIdx.x + 32 * DQ_WARPS * k, n = u >> 4, c = (u >> 2) & 3, l0 = 8 * (u & 3);
            int t = t0 + n;
            if (t < n_t) {
                const u16* src = X + (size_t)t * cols + sb * 256 + 64 * c + l0;
                x[k][0] = __ldg((const uint4*)src);
                x[k][1] = __ldg((const uint4*)(src + 32));
            } else {
                x[k][0] = x[k][1] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    };
    // Those halves interleaved into `buf`: word 36 c + l of a batch row holds positions 64 c + l and
    // 64 c + 32 + l (a byte's two nibbles), chunk c 36 words on (`DQ_ROW_WORDS`: banks).
    auto store_x = [&](const uint4 (&x)[NT][2], u32* buf) {
#pragma unroll
        for (int k = 0; k < NT; k++) {
            int u = threadIdx.x + 32 * DQ_WARPS * k, n = u >> 4, c = (u >> 2) & 3, l0 = 8 * (u & 3);
            uint4 lo = x[k][0], hi = x[k][1];
            uint4 w0 = make_uint4(__byte_perm(lo.x, hi.x, 0x5410u), __byte_perm(lo.x, hi.x, 0x7632u),
                                  __byte_perm(lo.y, hi.y, 0x5410u), __byte_perm(lo.y, hi.y, 0x7632u));
            uint4 w1 = make_uint4(__byte_perm(lo.z, hi.z, 0x5410u), __byte_perm(lo.z, hi.z, 0x7632u),
                                  __byte_perm(lo.w, hi.w, 0x5410u), __byte_perm(lo.w, hi.w, 0x7632u));
            *(uint4*)&buf[n * DQ_ROW_WORDS + 36 * c + l0] = w0;
            *(uint4*)&buf[n * DQ_ROW_WORDS + 36 * c + l0 + 4] = w1;
        }
    };
    // The products of one super-block: each of the lane's two chunks, its 16 bytes of rows g and
    // g + 8 as f16 pairs (a byte: weights of sub-blocks 2 c and 2 c + 1), against x's matching words.
    auto products = [&](const DqWeights& w, const u32* buf) {
        u32 dd[2], nm[2];
        uint2 sc[2], mn[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            dd[r] = __byte_perm(w.head[r].x, 0u, 0x1010u);                // (d, d)
            nm[r] = __byte_perm(w.head[r].x, 0u, 0x3232u) ^ 0x80008000u;  // (-dmin, -dmin)
            sc[r] = q4k_packed(w.head[r], false);
            mn[r] = q4k_packed(w.head[r], true);
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
            int c = cbase + j;
            u32 spair[2], opair[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                spair[r] = dq_scale_pair(cbase == 0 ? sc[r].x : sc[r].y, j, dd[r]);
                opair[r] = dq_scale_pair(cbase == 0 ? mn[r].x : mn[r].y, j, nm[r]);
            }
            // A word (4 bytes) of each row at a time, so few weights are live at once.
#pragma unroll
            for (int d = 0; d < 4; d++) {
                u32 a[2][4];  // [row g, g + 8][byte of the word]
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    u32 word = d == 0 ? w.q[r][j].x : d == 1 ? w.q[r][j].y : d == 2 ? w.q[r][j].z : w.q[r][j].w;
                    u32 shifted = word >> 4;
#pragma unroll
                    for (int e = 0; e < 4; e++) a[r][e] = dq_pair(word, shifted, (u32)e | ((u32)(4 + e) << 8), spair[r], opair[r]);
                }
#pragma unroll
                for (int b = 0; b < NT; b++) {
                    if (t0 + 8 * b >= n_t) continue;
                    uint4 xb = *(const uint4*)(buf + (8 * b + g) * DQ_ROW_WORDS + 36 * c + 16 * h + 4 * d);
                    hmma_k16(acc[b], a[0][0], a[1][0], a[0][1], a[1][1], xb.x, xb.y);
                    hmma_k16(acc[b], a[0][2], a[1][2], a[0][3], a[1][3], xb.z, xb.w);
                }
            }
        }
    };
    u32* ilv0 = dq_ilv;
    u32* ilv1 = dq_ilv + 8 * NT * DQ_ROW_WORDS;
    uint4 xr[NT][2];
    if (sb0 < sb1) {
        load_x(sb0, xr);
        store_x(xr, ilv0);
    }
    __syncthreads();
    if constexpr (STAGED) {
        // One super-block a step: the weights DQ_W_STAGES - 1 on and the next x requested, this one's
        // weights waited for (the warp's own copies: no block barrier), its products, the next x stored
        // into the other buffer, one barrier (every warp is past its reads of this step's buffers).
        for (int sb = sb0, st = 0; sb < sb1; sb++, st = st + 1 == DQ_W_STAGES ? 0 : st + 1) {
            bool more = sb + 1 < sb1;
            stage_w(sb + DQ_W_STAGES - 1, st == 0 ? DQ_W_STAGES - 1 : st - 1);
            if (more) load_x(sb + 1, xr);
            cp_async_wait<DQ_W_STAGES - 1>();
            __syncwarp();
            read_w(st, wa);
            int odd = (sb - sb0) & 1;
            products(wa, odd ? ilv1 : ilv0);
            if (more) store_x(xr, odd ? ilv0 : ilv1);
            __syncthreads();
        }
    } else {
        // One super-block a step: the next one's weights and x requested, this one's products, the
        // next x stored into the other buffer, one barrier (every warp is past its reads of `cur`).
        auto step = [&](int sb, const DqWeights& use, DqWeights& fill, const u32* cur, u32* nxt) {
            bool more = sb + 1 < sb1;
            if (more) {
                load_w(sb + 1, fill);
                load_x(sb + 1, xr);
            }
            products(use, cur);
            if (more) store_x(xr, nxt);
            __syncthreads();
        };
        for (int sb = sb0; sb < sb1; sb += 2) {
            step(sb, wa, wb, ilv0, ilv1);
            if (sb + 1 < sb1) step(sb + 1, wb, wa, ilv1, ilv0);
        }
    }
    // Outputs: weight row (block row) 16 warp + g + 8 (e >> 1), batch row t0 + 8 b + 2 i + (e & 1).
    if (splits == 1) {
#pragma unroll
        for (int b = 0; b < NT; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int t = t0 + 8 * b + 2 * i + (e & 1), r = r0 + 16 * warp + g + 8 * (e >> 1);
                if (t < n_t) Y[(size_t)t * rows + r] = acc[b][e];
            }
        return;
    }
    int total = rows0 + rows1 + rows2;
#pragma unroll
    for (int b = 0; b < NT; b++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int t = t0 + 8 * b + 2 * i + (e & 1), r = gr0 + 16 * warp + g + 8 * (e >> 1);
            if (t < n_t) part[((size_t)split * n_t + t) * total + r] = acc[b][e];
        }
    __threadfence();
    __syncthreads();
    unsigned* count = counters + blockIdx.z * gridDim.x + blockIdx.x;
    if (threadIdx.x == 0) ticket = atomicAdd(count, 1u);
    __syncthreads();
    if (ticket != (unsigned)splits - 1) return;
    __threadfence();
    // The last block of the row group: the splits' partials in split order, a thread an output.
    int n_rows = min(8 * NT, n_t - t0);
    for (int o = threadIdx.x; o < n_rows * DQ_BLOCK_ROWS; o += 32 * DQ_WARPS) {
        int t = t0 + o / DQ_BLOCK_ROWS, r = o % DQ_BLOCK_ROWS;
        float sum = 0.f;
        for (int j = 0; j < splits; j++) sum += __ldcg(part + ((size_t)j * n_t + t) * total + gr0 + r);
        Y[(size_t)t * rows + r0 + r] = sum;
    }
    if (threadIdx.x == 0) *count = 0u;
}

// DQMMA_Q4_K(n-tiles, blocks a multiprocessor): `dqmma_q4_k_n<NT>`, 8 NT batch rows a grid row
// (grid.z); the registers are held to what that many resident blocks leave (`dqmma::resident_per_sm`).
#define DQMMA_Q4_K(NT, BLOCKS)                                                                                \
    extern "C" __global__ void __launch_bounds__(32 * DQ_WARPS, BLOCKS) dqmma_q4_k_n##NT(                    \
        const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2,                     \
        const u16* __restrict__ X, float* __restrict__ Y0, float* __restrict__ Y1, float* __restrict__ Y2,   \
        int rows0, int rows1, int rows2, int cols, int n_t, float* __restrict__ part, unsigned* counters) { \
        dqmma_q4_k<NT>(W0, W1, W2, X, Y0, Y1, Y2, rows0, rows1, rows2, cols, n_t, part, counters);         \
    }

DQMMA_Q4_K(1, 4)
DQMMA_Q4_K(2, 4)
DQMMA_Q4_K(4, 3)
