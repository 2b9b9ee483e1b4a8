// Decode batches on the tensor cores, default mode (`qmma_*`; `routes::matmul_route` says when): a
// step of 2 to `QUANT_MMA_MAX_ROWS` sequences reads each quantized Q4_K weight once, as one
// sequence's matvec does, and forms the integer products with `mma.sync` s8 instead of `dp4a` per row.
//
// Why a kernel of its own: the batched `dp4a` matvec repeats its per-row work (activation loads,
// products, one float fold per lane and super-block) for every row, about 1 ms a row a step on the
// 8B Q4_K_M; cuBLAS over the f16 copy reads four times the bytes (about 5.7 ms a step at any batch
// up to 64); `mmq_*` (mmq.cu) reproduces the matvec lanes' float order, 32 partial sums an output,
// about 65 instructions an mma. Here each output has one float sum, folded once a super-block from
// exact integers, so a batch's rows do not have a lone row's bits (the deterministic mode never takes
// this route).
//
// A block is four warps and one group of 16 weight rows (the mma's m), across up to three matrices
// read with one input (q, k and v; gate and up): block x takes row group x of W0, then W1, then W2.
// Warp w takes super-blocks w, w + 4, ... of the rows (the K split keeps blocks on every
// multiprocessor for matrices of few rows, like o and down), and the four warps' sums are added in a
// fixed order. A warp takes BT tiles of 8 batch rows (the mma's n): rows 8 BT y .. + 8 BT of grid row
// y (one tile is instantiated: two, for 9-16 rows, ran slower than cuBLAS over the f16 copy).
// Fragments (PTX ISA, mma .s8): lane = 4 g + i; A weight rows g and g + 8, B batch row g; C weight
// rows g and g + 8 times batch rows 2 i and 2 i + 1, output e = 2 h + w. The weights sit on A so that
// the batch's loads land in B's registers as they are (8 or 4 bytes of one row), and the weights'
// registers, which are unpacked anyway, are formed in A's order: no register moves before an mma.
//
// Weights are read in the integer route's repacked layout (mmvq.cu), 8 bytes a lane and row;
// activations from global memory (L1), 8 bytes a lane. (A Q6_K form, 4-byte loads a lane from its
// three regions, ran at half the batched `dp4a` matvec's speed or less at every batch size, and was
// dropped: c1.)
//
// Integer sizes: a Q4_K super-block's sum of scale x product is at most 8 x 63 x 32 x 15 x 127 (3.1e7):
// it fits an int.

#define QMMA_WARPS 4

// The block's row group among the launch's matrices, and the lane's place in the warp's tiles.
struct QmmaPlace {
    const u8* W;
    float* Y;
    int rows, r0;  // the matrix's rows; the group's first
    int g, i, warp, t0, nsb, n_t;
    __device__ __forceinline__ static QmmaPlace at(const u8* W0, const u8* W1, const u8* W2, float* Y0, float* Y1,
                                                   float* Y2, int rows0, int rows1, int rows2, int cols, int n_t,
                                                   int bt) {
        QmmaPlace p;
        int r = blockIdx.x * 16;
        p.W = W0, p.Y = Y0, p.rows = rows0;
        if (r >= rows0) {
            r -= rows0;
            p.W = W1, p.Y = Y1, p.rows = rows1;
            if (r >= rows1) {
                r -= rows1;
                p.W = W2, p.Y = Y2, p.rows = rows2;
            }
        }
        int lane = threadIdx.x & 31;
        p.r0 = r, p.g = lane >> 2, p.i = lane & 3, p.warp = threadIdx.x >> 5;
        p.t0 = blockIdx.y * 8 * bt, p.nsb = cols / 256, p.n_t = n_t;
        return p;
    }
    // The batch row of tile b this lane loads for B, and whether tile b has any row in the batch
    // (the same for the whole warp).
    __device__ __forceinline__ int b_row(int b) const { return t0 + 8 * b + g; }
    __device__ __forceinline__ bool tile_live(int b) const { return t0 + 8 * b < n_t; }
    // The batch row of output e of tile b.
    __device__ __forceinline__ int c_row(int b, int e) const { return t0 + 8 * b + 2 * i + (e & 1); }
};

// Adds the four warps' sums of each output in a fixed order and stores those inside the batch.
template <int BT>
__device__ __forceinline__ void qmma_store(const QmmaPlace& p, const float (&acc)[BT][4]) {
    __shared__ float red[QMMA_WARPS][BT * 4][32];
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int b = 0; b < BT; b++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[p.warp][b * 4 + e][lane] = acc[b][e];
    __syncthreads();
    for (int k = threadIdx.x; k < BT * 4 * 32; k += 32 * QMMA_WARPS) {
        int slot = k >> 5, ln = k & 31, e = slot & 3, b = slot >> 2;
        int t = p.t0 + 8 * b + 2 * (ln & 3) + (e & 1), r = p.r0 + (ln >> 2) + 8 * (e >> 1);
        if (t < p.n_t)
            p.Y[(size_t)t * p.rows + r] = (red[0][slot][ln] + red[1][slot][ln]) + (red[2][slot][ln] + red[3][slot][ln]);
    }
}

// The fold's activation scales: batch rows 2 i and 2 i + 1 of tile b (0 past the batch).
template <int BT>
__device__ __forceinline__ void qmma_dx(const QmmaPlace& p, const float* dd, int sb, float (&dx)[BT][2]) {
#pragma unroll
    for (int b = 0; b < BT; b++)
#pragma unroll
        for (int w = 0; w < 2; w++) {
            int t = p.c_row(b, w);
            dx[b][w] = t < p.n_t ? __ldg(dd + (size_t)t * p.nsb + sb) : 0.f;
        }
}

// Q4_K (repacked, `repack_q4_k_regions`): a row is A | B | heads; chunk c of a super-block (32 bytes:
// low nibbles sub-block 2 c, high nibbles 2 c + 1) has its first 16 bytes in A, its second in B. Lane
// i reads bytes 8 i .. + 8 of every chunk of weight rows g and g + 8 (from A for i < 2, from B else:
// the other half of each 32-byte sector is the next lane's): quants 8 i .. + 8 of both sub-blocks, A
// fragments of their m16n8k32 products. The B fragments are the same quants of the batch rows (the
// integer sum is the same for any pairing of positions A and B share). The mins' term (the sum over
// sub-blocks of min x the activations' sum) is a product too: A holds the sub-block's min in every
// byte, so it needs no activation sums.
struct QmmaQ4kLoad {
    uint2 q[2][4];  // chunk c's bytes 8 i .. + 8 of weight row g + 8 h
    uint4 head[2];  // the heads of weight rows g + 8 h
};

// Byte s of packed bytes in every byte of a word (`prmt`).
__device__ __forceinline__ u32 byte_everywhere(uint2 v, int s) {
    return __byte_perm(s < 4 ? v.x : v.y, 0u, (u32)(s & 3) * 0x1111u);
}

template <int BT>
__device__ __forceinline__ void qmma_q4_k(const QmmaPlace& p, const u8* __restrict__ A, int cols) {
    int nsb = p.nsb, i = p.i;
    size_t row_bytes = (size_t)nsb * 144;
    const u8* row = p.W + (size_t)(p.r0 + p.g) * row_bytes;  // weight row g; g + 8 is 8 rows on
    const u8* qrow = row + (i < 2 ? 0 : nsb * 64) + 8 * (i & 1);
    const signed char* qs = act_qs(A, 0, cols);
    const float* dd = act_d(A, p.n_t, 0, cols, 256);
    auto load = [&](int sb, QmmaQ4kLoad& l) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            size_t rh = 8 * h * row_bytes;
#pragma unroll
            for (int c = 0; c < 4; c++) l.q[h][c] = ld_weights8(qrow + rh + sb * 64 + c * 16);
            l.head[h] = ld_weights16_l1(row + rh + nsb * 128 + sb * 16);
        }
    };
    float acc[BT][4];
#pragma unroll
    for (int b = 0; b < BT; b++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[b][e] = 0.f;
    QmmaQ4kLoad cur, next;
    if (p.warp < nsb) load(p.warp, cur);
    // The first weights are in flight before the wait: no kernel writes them, and the activations
    // (the kernel before's output) are read only after it.
    WAIT_PRIOR_GRID();
    for (int sb = p.warp; sb < nsb; sb += QMMA_WARPS) {
        if (sb + QMMA_WARPS < nsb) load(sb + QMMA_WARPS, next);
        int isum[BT][4], msum[BT][4];
#pragma unroll
        for (int b = 0; b < BT; b++)
#pragma unroll
            for (int e = 0; e < 4; e++) isum[b][e] = msum[b][e] = 0;
        uint2 sc[2] = {q4k_packed(cur.head[0], false), q4k_packed(cur.head[1], false)};
        uint2 mn[2] = {q4k_packed(cur.head[0], true), q4k_packed(cur.head[1], true)};
#pragma unroll
        for (int c = 0; c < 4; c++) {
            uint2 q0 = cur.q[0][c], q1 = cur.q[1][c];
            u32 l0 = q0.x & 0x0F0F0F0Fu, l1 = q1.x & 0x0F0F0F0Fu, l2 = q0.y & 0x0F0F0F0Fu, l3 = q1.y & 0x0F0F0F0Fu;
            u32 h0 = (q0.x >> 4) & 0x0F0F0F0Fu, h1 = (q1.x >> 4) & 0x0F0F0F0Fu;
            u32 h2 = (q0.y >> 4) & 0x0F0F0F0Fu, h3 = (q1.y >> 4) & 0x0F0F0F0Fu;
            u32 m00 = byte_everywhere(mn[0], 2 * c), m01 = byte_everywhere(mn[1], 2 * c);
            u32 m10 = byte_everywhere(mn[0], 2 * c + 1), m11 = byte_everywhere(mn[1], 2 * c + 1);
#pragma unroll
            for (int b = 0; b < BT; b++) {
                if (!p.tile_live(b)) continue;
                uint2 xl = make_uint2(0u, 0u), xh = xl;
                int t = p.b_row(b);
                if (t < p.n_t) {
                    const signed char* x = qs + (size_t)t * cols + sb * 256 + 64 * c + 8 * i;
                    xl = __ldg((const uint2*)x);
                    xh = __ldg((const uint2*)(x + 32));
                }
                int dl[4] = {0, 0, 0, 0}, dh[4] = {0, 0, 0, 0};
                imma_k32(dl, l0, l1, l2, l3, xl.x, xl.y);
                imma_k32(dh, h0, h1, h2, h3, xh.x, xh.y);
                imma_k32(msum[b], m00, m01, m00, m01, xl.x, xl.y);
                imma_k32(msum[b], m10, m11, m10, m11, xh.x, xh.y);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    isum[b][e] += byte_of(sc[e >> 1], 2 * c) * dl[e] + byte_of(sc[e >> 1], 2 * c + 1) * dh[e];
            }
        }
        float dx[BT][2];
        qmma_dx<BT>(p, dd, sb, dx);
        float dw[2], dmin[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            dw[h] = h2f((u16)(cur.head[h].x & 0xFFFF));
            dmin[h] = h2f((u16)(cur.head[h].x >> 16));
        }
#pragma unroll
        for (int b = 0; b < BT; b++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[b][e] = q4k_fold(acc[b][e], dx[b][e & 1], dw[e >> 1], dmin[e >> 1], isum[b][e], msum[b][e]);
        cur = next;
    }
    qmma_store<BT>(p, acc);
}

// QMMA_Q4_K(batch tiles): `qmma_q4_k_b<BT>`, up to 8 BT batch rows a grid row (further rows would
// take further grid rows, each reading the weights again; the route sends batches past 8 rows to
// cuBLAS over the f16 copy: `routes::BATCH_TUNED_MAX_ROWS`). The kernel is one call to the body,
// which waits for the kernel before once its first weights are in flight.
#define QMMA_Q4_K(BT)                                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * QMMA_WARPS) qmma_q4_k_b##BT(                         \
        const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2,                   \
        const u8* __restrict__ A, float* __restrict__ Y0, float* __restrict__ Y1, float* __restrict__ Y2,  \
        int rows0, int rows1, int rows2, int cols, int n_t) {                                              \
        qmma_q4_k<BT>(QmmaPlace::at(W0, W1, W2, Y0, Y1, Y2, rows0, rows1, rows2, cols, n_t, BT), A, cols); \
    }

QMMA_Q4_K(1)
