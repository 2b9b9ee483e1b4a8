// The integer matvecs' sums on the tensor cores, for chunks of many rows (`mmq_*`; `int8::mmq_takes`
// says when). In deterministic mode every matmul takes the integer route, and a prefill chunk ran the
// batched matvec: each weight unpacked and met by `dp4a` once per eight rows, about 1,300 tok/s of pp512
// on the 8B Q4_K_M. Here `mma.sync` s8 computes each (activation row, weight row, 32 or 16 quants)
// integer dot product, which is exact, so it is the integer the matvec lane forms with `dp4a`; the float
// steps then run as the matvec runs them: the same `q4k_fold` / `q6k_fold` per super-block, in chains
// per (super-block offset j, lane position c) over super-blocks j, j + 8, ... in ascending order (the
// matvec lane 4j + c's sum), merged in `warp_sum`'s butterfly order (lanes l and l ^ 16, then ^ 8, ^ 4,
// ^ 2, ^ 1). So each output has the split-1 matvecs' bits, whatever the chunk.
//
// A block is four warps; warp w takes weight rows 32 * blockIdx.y + 8 * w .. + 8 (the mma's n) and
// activation rows 16 * blockIdx.x .. + 16 (its m). Fragments (PTX ISA, mma .s8): lane = 4 g + i; A row
// g and g + 8, quants 4 i .. + 4 (and 16 + 4 i for k32); B weight row g, the same quants; C rows g and
// g + 8, weight rows 2 i and 2 i + 1. Rows past the chunk read zeros and are not stored.

// A chunk's activations for one super-block, staged in shared memory once a block (the four warps
// read the same 16 rows): the profile of these kernels reading them from global memory had the L1 at
// 96-97% of its throughput. Per row: the 256 quants in a 288-byte slot (the 32 bytes of padding put
// a warp's 8-byte fragment reads of eight rows in distinct banks), the 16 sums of 16 in an 80-byte
// slot, then the 16 rows' scales.
#define MMQ_QS_STRIDE 288
#define MMQ_SUM_STRIDE 80
#define MMQ_STAGE_BYTES (16 * MMQ_QS_STRIDE + 16 * MMQ_SUM_STRIDE + 64)

// Copies super-block sb of activation rows t0 .. + 16 (those before n_t) into `tile` by `cp.async`,
// one block's 128 threads; the caller commits the group.
__device__ __forceinline__ void mmq_stage(const GlobalQ8K& q, int t0, int n_t, int sb, u8* tile) {
    int tid = threadIdx.x;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int chunk = tid + 128 * k, r = chunk >> 4, col = chunk & 15;
        bool valid = t0 + r < n_t;
        const signed char* src = q.qs + (size_t)(valid ? t0 + r : t0) * q.cols + sb * 256 + col * 16;
        cp_async16(smem_u32(tile + r * MMQ_QS_STRIDE + col * 16), src, valid);
    }
    if (tid < 64) {
        int r = tid >> 2, part = tid & 3;
        bool valid = t0 + r < n_t;
        const int* src = q.sum + (size_t)(valid ? t0 + r : t0) * (q.cols / 16) + sb * 16 + part * 4;
        cp_async16(smem_u32(tile + 16 * MMQ_QS_STRIDE + r * MMQ_SUM_STRIDE + part * 16), src, valid);
    } else if (tid < 80) {
        int r = tid - 64;
        bool valid = t0 + r < n_t;
        const float* src = q.dd + (size_t)(valid ? t0 + r : t0) * (q.cols / 256) + sb;
        cp_async4(smem_u32(tile + 16 * MMQ_QS_STRIDE + 16 * MMQ_SUM_STRIDE + r * 4), src, valid);
    }
}

// The staged super-block as the fragments read it: word `k4` (4 quants) of piece `p16` (16 quants),
// quants 8 i .. + 8 of sub-block s (32 quants), the sums and the scale of row t, or zeros past the
// chunk.
struct MmqAct {
    const u8* tile;
    int t0, n_t;
    __device__ __forceinline__ u32 word(int t, int q16, int k4) const {
        if (t >= n_t) return 0u;
        return *(const u32*)(tile + (t - t0) * MMQ_QS_STRIDE + q16 * 16 + k4 * 4);
    }
    __device__ __forceinline__ uint2 pair(int t, int s, int i) const {
        if (t >= n_t) return make_uint2(0u, 0u);
        return *(const uint2*)(tile + (t - t0) * MMQ_QS_STRIDE + s * 32 + i * 8);
    }
    __device__ __forceinline__ int4 sums(int t, int c) const {
        return *(const int4*)(tile + 16 * MMQ_QS_STRIDE + (t - t0) * MMQ_SUM_STRIDE + c * 16);
    }
    __device__ __forceinline__ float d(int t) const {
        return *(const float*)(tile + 16 * MMQ_QS_STRIDE + 16 * MMQ_SUM_STRIDE + (t - t0) * 4);
    }
};

// The per-output chains and their butterfly: chain (j, c) of output e is the matvec lane 4 j + c's sum.
// Chains are formed one j at a time in the order 0, 4, 2, 6, 1, 5, 3, 7, so that each butterfly pair
// is merged as soon as both halves exist. The merge's partial sums wait in shared memory (48 floats a
// thread, touched once a chain), which keeps the registers for the products.
#define MMQ_PARTIALS 48
struct MmqMerge {
    float* mine;  // this thread's partials: slot k at mine[k * 128]
    __device__ __forceinline__ float& at(int k) const { return mine[k * 128]; }
    // Chain j (p: its four positions c for each output e) is done; `oi`: its place in the order.
    __device__ __forceinline__ void done(int oi, const float (&p)[4][4]) const {
#pragma unroll
        for (int e = 0; e < 4; e++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float &half = at(e * 4 + c), &q2 = at(16 + e * 4 + c), &q1 = at(32 + e * 4 + c);
                if (oi % 2 == 0) {
                    half = p[e][c];
                    continue;
                }
                float v1 = half + p[e][c];  // lanes l and l ^ 16: chains j and j + 4
                if (oi == 1) q2 = v1;
                if (oi == 3) q2 = q2 + v1;  // ^ 8: j and j + 2
                if (oi == 5) q1 = v1;
                if (oi == 7) q2 = q2 + (q1 + v1);  // ^ 8, then ^ 4: j and j + 1
            }
    }
    // ^ 2 then ^ 1 over the lane positions c.
    __device__ __forceinline__ float total(int e) const {
        return (at(16 + e * 4 + 0) + at(16 + e * 4 + 2)) + (at(16 + e * 4 + 1) + at(16 + e * 4 + 3));
    }
};

// The warp's tile and this lane's place in it: weight rows r0 .. + 8 (B's n), activation rows t0 ..
// + 16 (A's m); the lane's outputs are rows te[h] (h = 0, 1) times weight rows r0 + 2 i + w (w = 0,
// 1), output e = 2 h + w.
struct MmqTile {
    int g, i, r0, t0, nsb, n_t;
    int te[2];
    // Activation rows t0 .. + 16, those before n_t live.
    __device__ __forceinline__ static MmqTile at(int cols, int t0, int n_t) {
        int lane = threadIdx.x & 31;
        MmqTile tl;
        tl.g = lane >> 2, tl.i = lane & 3;
        tl.r0 = blockIdx.y * 32 + (threadIdx.x >> 5) * 8, tl.t0 = t0;
        tl.nsb = cols / 256, tl.n_t = n_t;
        tl.te[0] = tl.t0 + tl.g, tl.te[1] = tl.t0 + tl.g + 8;
        return tl;
    }
};

// This lane's four outputs, e = 2 h + w.
__device__ __forceinline__ void mmq_store(const MmqMerge& mg, const MmqTile& tl, float* Y, int rows) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int t = tl.te[e >> 1], r = tl.r0 + 2 * tl.i + (e & 1);
        if (t < tl.n_t) Y[(size_t)t * rows + r] = mg.total(e);
    }
}

// Q4_K: one super-block's products into the chains p[e][c] (c: the matvec lane's chunk).
struct MmqQ4k {
    const u8* wrow;     // weight row r0 + g (the B fragments)
    const u8* hrow[2];  // the heads of weight rows r0 + 2 i + w (the scales of this lane's outputs)
    __device__ __forceinline__ MmqQ4k(const u8* W, const MmqTile& tl) {
        wrow = W + (size_t)(tl.r0 + tl.g) * tl.nsb * 144;
#pragma unroll
        for (int w = 0; w < 2; w++) hrow[w] = W + (size_t)(tl.r0 + 2 * tl.i + w) * tl.nsb * 144 + tl.nsb * 128;
    }
    __device__ __forceinline__ void fold(const MmqTile& tl, const MmqAct& act, int sb, float (&p)[4][4]) const {
        int i = tl.i, nsb = tl.nsb;
        uint4 head[2] = {ld_weights16(hrow[0] + sb * 16), ld_weights16(hrow[1] + sb * 16)};
        float dx[2];
#pragma unroll
        for (int h = 0; h < 2; h++) dx[h] = tl.te[h] < tl.n_t ? act.d(tl.te[h]) : 0.f;
#pragma unroll
        for (int c = 0; c < 4; c++) {
            // Sub-blocks 2 c (low nibbles) and 2 c + 1 (high) of chunk c. The mma's k positions
            // 4 i .. + 4 and 16 + 4 i .. + 4 of lane i hold quants 8 i .. + 8 of a sub-block (one
            // 8-byte load each for activations and weights): the integer sum is the same for any
            // pairing of positions that A and B share.
            uint2 wq = *(const uint2*)(wrow + (i < 2 ? 0 : nsb * 64) + sb * 64 + c * 16 + 8 * (i & 1));
            int d[2][4];
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                int s = 2 * c + hi, sh = 4 * hi;
                uint2 x0 = act.pair(tl.te[0], s, i), x1 = act.pair(tl.te[1], s, i);
                d[hi][0] = d[hi][1] = d[hi][2] = d[hi][3] = 0;
                imma_k32(d[hi], x0.x, x1.x, x0.y, x1.y, (wq.x >> sh) & 0x0F0F0F0Fu, (wq.y >> sh) & 0x0F0F0F0Fu);
            }
            int4 bs[2];
#pragma unroll
            for (int h = 0; h < 2; h++)
                bs[h] = tl.te[h] < tl.n_t ? act.sums(tl.te[h], c) : make_int4(0, 0, 0, 0);
#pragma unroll
            for (int w = 0; w < 2; w++) {
                float dw = h2f((u16)(head[w].x & 0xFFFF)), dmin = h2f((u16)(head[w].x >> 16));
                int sc0, m0, sc1, m1;
                q4k_lane_scales(head[w], c, &sc0, &m0, &sc1, &m1);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int e = 2 * h + w;
                    int isum = sc0 * d[0][e] + sc1 * d[1][e];
                    int msum = m0 * (bs[h].x + bs[h].y) + m1 * (bs[h].z + bs[h].w);
                    p[e][c] = q4k_fold(p[e][c], dx[h], dw, dmin, isum, msum);
                }
            }
        }
    }
};

// Q6_K: one super-block's products into the chains p[e][k] (k: the matvec lane's position).
struct MmqQ6k {
    const u8* wrow;     // weight row r0 + g
    const u8* srow[2];  // the scale bytes of weight rows r0 + 2 i + w
    const u16* drow[2];  // their f16 super-block scales
    __device__ __forceinline__ MmqQ6k(const u8* W, const MmqTile& tl, int rows) {
        wrow = W + (size_t)(tl.r0 + tl.g) * tl.nsb * 208;
        const u16* dtab = (const u16*)(W + (size_t)rows * tl.nsb * 208);
#pragma unroll
        for (int w = 0; w < 2; w++) {
            srow[w] = W + (size_t)(tl.r0 + 2 * tl.i + w) * tl.nsb * 208 + tl.nsb * 192;
            drow[w] = dtab + (size_t)(tl.r0 + 2 * tl.i + w) * tl.nsb;
        }
    }
    __device__ __forceinline__ void fold(const MmqTile& tl, const MmqAct& act, int sb, float (&p)[4][4]) const {
        int i = tl.i, nsb = tl.nsb;
        // Piece p16 = 8 h + 2 q + k2 (16 quants): lane position k = 2 h + k2's quarter q, as
        // `q6k_unpack` forms it (v1..v4), minus 32 on the word.
        int d[16][4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u32 la = *(const u32*)(wrow + sb * 64 + k * 16 + 4 * i);
            u32 lb = *(const u32*)(wrow + nsb * 64 + sb * 64 + k * 16 + 4 * i);
            u32 lh = *(const u32*)(wrow + nsb * 128 + sb * 64 + k * 16 + 4 * i);
            u32 v[4] = {(u32)q6_word<OFF_BYTES>(la, 0, lh, 4), (u32)q6_word<OFF_BYTES>(lb, 0, lh, 2),
                        (u32)q6_word<OFF_BYTES>(la, 4, lh, 0), (u32)q6_word<OFF_BYTES>(lb, 4, lh, -2)};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int p16 = q6k_piece(k, q);
                d[p16][0] = d[p16][1] = d[p16][2] = d[p16][3] = 0;
                imma_k16(d[p16], act.word(tl.te[0], p16, i), act.word(tl.te[1], p16, i), v[q]);
            }
        }
        float dx[2];
#pragma unroll
        for (int h = 0; h < 2; h++) dx[h] = tl.te[h] < tl.n_t ? act.d(tl.te[h]) : 0.f;
#pragma unroll
        for (int w = 0; w < 2; w++) {
            uint4 sc = ld_weights16(srow[w] + sb * 16);
            u32 scw[4] = {sc.x, sc.y, sc.z, sc.w};
            float dw = h2f(__ldg(drow[w] + sb));
#pragma unroll
            for (int k = 0; k < 4; k++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int e = 2 * h + w, isum = 0;
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        int p16 = q6k_piece(k, q);
                        int s = (int)(scw[p16 >> 2] << (24 - 8 * (p16 & 3))) >> 24;
                        isum += s * d[p16][e];
                    }
                    p[e][k] = q6k_fold(p[e][k], dx[h], dw, isum);
                }
            }
        }
    }
};

// The super-block staged after sb in chain order `oi` (chains j in `order`, each over j, j + 8, ...), or
// -1 after the last.
__device__ __forceinline__ int mmq_next_sb(const int (&order)[8], int oi, int sb, int nsb) {
    if (sb + 8 < nsb) return sb + 8;
    for (int o = oi + 1; o < 8; o++)
        if (order[o] < nsb) return order[o];
    return -1;
}

// The chains of the warp's outputs, j in the merge's order, each over super-blocks j, j + 8, ... The
// block stages each super-block's activations while it folds the one before (two tiles in turn).
// Every warp takes part in the staging and the barriers; only `live` ones (weight rows inside the
// matrix) fold and store.
template <class Type>
__device__ __forceinline__ void mmq_run(const Type& ty, const MmqTile& tl, const GlobalQ8K& q, float* Y, int rows,
                                        bool live) {
    __shared__ float partials[MMQ_PARTIALS * 128];
    __shared__ __align__(16) u8 tiles[2][MMQ_STAGE_BYTES];
    MmqMerge mg{partials + threadIdx.x};
    const int order[8] = {0, 4, 2, 6, 1, 5, 3, 7};
    mmq_stage(q, tl.t0, tl.n_t, 0, tiles[0]);
    cp_async_commit();
    int k = 0;  // super-blocks folded so far: tile k % 2 holds the current one
#pragma unroll
    for (int oi = 0; oi < 8; oi++) {
        float p[4][4];
#pragma unroll
        for (int e = 0; e < 4; e++)
#pragma unroll
            for (int c = 0; c < 4; c++) p[e][c] = 0.f;
        for (int sb = order[oi]; sb < tl.nsb; sb += 8, k++) {
            int next = mmq_next_sb(order, oi, sb, tl.nsb);
            if (next >= 0) mmq_stage(q, tl.t0, tl.n_t, next, tiles[(k + 1) & 1]);
            cp_async_commit();  // empty after the last: the wait below still means "all but the newest"
            cp_async_wait<1>();
            __syncthreads();
            if (live) ty.fold(tl, MmqAct{tiles[k & 1], tl.t0, tl.n_t}, sb, p);
            __syncthreads();  // the tile is free for the super-block after next
        }
        mg.done(oi, p);
    }
    if (live) mmq_store(mg, tl, Y, rows);
}

extern "C" __global__ void __launch_bounds__(128) mmq_q4_k(const u8* __restrict__ W, const u8* __restrict__ A,
                                                           float* __restrict__ Y, int rows, int cols, int n_t) {
    WAIT_PRIOR_GRID();
    MmqTile tl = MmqTile::at(cols, blockIdx.x * 16, n_t);
    bool live = tl.r0 < rows;
    mmq_run(MmqQ4k(W, tl), tl, GlobalQ8K::at(A, n_t, cols, 0), Y, rows, live);
}

// Four blocks a multiprocessor: staging took the kernel from 128 registers to 150 (three blocks); the
// bound brings back 128 with no local memory (same bits, deterministic pp512 +0.2%, at the edge of
// the spread: bench/records/2026-11-30-stage/s1-results.txt).
extern "C" __global__ void __launch_bounds__(128, 4) mmq_q6_k(const u8* __restrict__ W, const u8* __restrict__ A,
                                                           float* __restrict__ Y, int rows, int cols, int n_t) {
    WAIT_PRIOR_GRID();
    MmqTile tl = MmqTile::at(cols, blockIdx.x * 16, n_t);
    bool live = tl.r0 < rows;
    mmq_run(MmqQ6k(W, tl, rows), tl, GlobalQ8K::at(A, n_t, cols, 0), Y, rows, live);
}

// Q8_0: blocks of 32 quants and an f16 scale (repacked: quants in aligned blocks, scales in a table
// after all rows), Q8 activations of the same blocks. The matvec's lane 2 j + half takes half `half` (16
// quants) of blocks j, j + 16, ... (`Q8Step`), so a block's two halves are two m16n8k16 products and
// two chains. Its butterfly pairs lanes l ^ 16 (j ^ 8), ^ 8 (j ^ 4), ^ 4 (j ^ 2), ^ 2 (j ^ 1) and ^ 1
// (the halves); chains are formed in an order that merges each pair as soon as both exist.
//
// The activations are staged in shared memory as for the K-quants, but a tile of consecutive blocks
// would serve sixteen chains at once. So a tile ("unit") is up to eight blocks of one chain, j + 16 (8
// part + k), for the block's 16 rows; the block stages the next unit while it folds this one, and a
// chain's sums carry over its units in ascending block order, as in the matvec lane.
#define MMQ8_UNIT 8
#define MMQ8_QS_STRIDE 272  // 256 quant bytes a row, padded: fragment reads of eight rows hit distinct banks
#define MMQ8_D_STRIDE 9     // eight scales a row, padded likewise
#define MMQ8_TILE_BYTES (16 * MMQ8_QS_STRIDE + 16 * MMQ8_D_STRIDE * 4 + 16)

// Copies unit (chain j, part) of activation rows t0 .. + 16 (those before n_t; blocks past nb and rows
// past the chunk are zeros) into `tile` by `cp.async`; the caller commits the group.
__device__ __forceinline__ void mmq8_stage(const signed char* qs, const float* dd, int cols, int t0, int n_t, int j,
                                           int part, u8* tile) {
    int nb = cols / 32, tid = threadIdx.x;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int chunk = tid + 128 * k, r = chunk >> 4, kk = (chunk >> 1) & 7, half = chunk & 1;
        int ib = j + 16 * (MMQ8_UNIT * part + kk);
        bool valid = t0 + r < n_t && ib < nb;
        const signed char* src = valid ? qs + (size_t)(t0 + r) * cols + ib * 32 + half * 16 : qs;
        cp_async16(smem_u32(tile + r * MMQ8_QS_STRIDE + kk * 32 + half * 16), src, valid);
    }
    int r = tid >> 3, kk = tid & 7;
    int ib = j + 16 * (MMQ8_UNIT * part + kk);
    bool valid = t0 + r < n_t && ib < nb;
    const float* src = valid ? dd + (size_t)(t0 + r) * nb + ib : dd;
    cp_async4(smem_u32(tile + 16 * MMQ8_QS_STRIDE + (r * MMQ8_D_STRIDE + kk) * 4), src, valid);
}

// The Q8_0 tile `tl` of A (quantized activations laid out for `n_layout` rows; rows from tl.n_t on
// read as zeros and are not stored).
__device__ __forceinline__ void mmq8_run(const u8* __restrict__ W, const u8* __restrict__ A, float* __restrict__ Y,
                                         int rows, int cols, int n_layout, const MmqTile& tl) {
    __shared__ __align__(16) u8 tiles[2][MMQ8_TILE_BYTES];
    int n_t = tl.n_t;
    // Every warp stages and meets the barriers; only live ones (weight rows inside the matrix) fold.
    bool live = tl.r0 < rows;
    int nb = cols / 32, g = tl.g, i = tl.i;
    int parts = (nb + 16 * MMQ8_UNIT - 1) / (16 * MMQ8_UNIT);
    const signed char* qs = act_qs(A, 0, cols);
    const float* dd = act_d(A, n_layout, 0, cols, 32);
    const u8* wrow = W + (size_t)(live ? tl.r0 + g : 0) * cols;
    const u16* dtab = (const u16*)(W + (size_t)rows * cols);
    const u16* drow[2] = {dtab + (size_t)(live ? tl.r0 + 2 * i : 0) * nb,
                          dtab + (size_t)(live ? tl.r0 + 2 * i + 1 : 0) * nb};
    // Chains j in the butterfly's order: pairs (j, j + 8) merge first, then those sums by j ^ 4, j ^ 2
    // and j ^ 1. Each output keeps, per half: v3 (j ^ 2 merged), v2 (j ^ 4 merged), v1 (one pair) and
    // the first chain of a pair. The first half's v3 waits for the second in shared memory, which keeps
    // the registers for the products (in registers, the staging's addresses made the compiler spill).
    const int order[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    __shared__ float v3_first[8][128];
    float v3[4][2], v2[4][2], v1[4][2], first[4][2];
    mmq8_stage(qs, dd, cols, tl.t0, n_t, order[0], 0, tiles[0]);
    cp_async_commit();
    int k = 0;  // units folded so far: tile k % 2 holds the current one
#pragma unroll
    for (int oi = 0; oi < 16; oi++) {
        float p[4][2];
#pragma unroll
        for (int e = 0; e < 4; e++) p[e][0] = p[e][1] = 0.f;
        for (int part = 0; part < parts; part++, k++) {
            // The next unit: this chain's next part, else the next chain's first (none after the last).
            if (part + 1 < parts) mmq8_stage(qs, dd, cols, tl.t0, n_t, order[oi], part + 1, tiles[(k + 1) & 1]);
            else if (oi + 1 < 16) mmq8_stage(qs, dd, cols, tl.t0, n_t, order[oi + 1], 0, tiles[(k + 1) & 1]);
            cp_async_commit();  // empty after the last: the wait below still means "all but the newest"
            cp_async_wait<1>();
            __syncthreads();
            const u8* tile = tiles[k & 1];
            for (int kk = 0; live && kk < MMQ8_UNIT; kk++) {
                int ib = order[oi] + 16 * (MMQ8_UNIT * part + kk);
                if (ib >= nb) break;
                float dx[2], dw[2];
#pragma unroll
                for (int h = 0; h < 2; h++)
                    dx[h] = tl.te[h] < n_t ? *(const float*)(tile + 16 * MMQ8_QS_STRIDE +
                                                             ((tl.te[h] - tl.t0) * MMQ8_D_STRIDE + kk) * 4)
                                           : 0.f;
#pragma unroll
                for (int w = 0; w < 2; w++) dw[w] = h2f(__ldg(drow[w] + ib));
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    int d[4] = {0, 0, 0, 0};
                    int off = kk * 32 + half * 16 + 4 * i;
                    u32 a0 = tl.te[0] < n_t ? *(const u32*)(tile + (tl.te[0] - tl.t0) * MMQ8_QS_STRIDE + off) : 0u;
                    u32 a1 = tl.te[1] < n_t ? *(const u32*)(tile + (tl.te[1] - tl.t0) * MMQ8_QS_STRIDE + off) : 0u;
                    imma_k16(d, a0, a1, *(const u32*)(wrow + ib * 32 + half * 16 + 4 * i));
#pragma unroll
                    for (int e = 0; e < 4; e++) p[e][half] = q8_fold(p[e][half], dw[e & 1], dx[e >> 1], d[e]);
                }
            }
            __syncthreads();  // the tile is free for the unit after next
        }
#pragma unroll
        for (int e = 0; e < 4; e++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (oi % 2 == 0) {
                    first[e][h] = p[e][h];
                    continue;
                }
                float a = first[e][h] + p[e][h];  // ^ 16: j and j + 8
                if (oi % 4 == 1) v1[e][h] = a;
                else {
                    float b = v1[e][h] + a;  // ^ 8: j and j + 4
                    if (oi % 8 == 3) v2[e][h] = b;
                    else {
                        float c = v2[e][h] + b;  // ^ 4: j and j + 2
                        if (oi < 8) v3_first[e * 2 + h][threadIdx.x] = c;
                        else v3[e][h] = c;
                    }
                }
            }
    }
    if (!live) return;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int t = tl.te[e >> 1], r = tl.r0 + 2 * i + (e & 1);
        // ^ 2: j and j + 1; ^ 1: the halves.
        if (t < n_t)
            Y[(size_t)t * rows + r] = (v3_first[e * 2][threadIdx.x] + v3[e][0]) + (v3_first[e * 2 + 1][threadIdx.x] + v3[e][1]);
    }
}

extern "C" __global__ void __launch_bounds__(128) mmq_q8_0(const u8* __restrict__ W, const u8* __restrict__ A,
                                                           float* __restrict__ Y, int rows, int cols, int n_t) {
    WAIT_PRIOR_GRID();
    mmq8_run(W, A, Y, rows, cols, n_t, MmqTile::at(cols, blockIdx.x * 16, n_t));
}

// ---- A mixture's grouped products (`matmul::indexed::mmq_ids_into`, prefill chunks): the chunk's
// (row, slot) pairs sorted by expert (`moe_sort`: A's rows and Y's rows are in that order) and cut into
// tiles of up to 16 rows of one expert. `tiles` holds their count, then (expert, first row, end of
// the expert's rows) per tile; blockIdx.x is the tile (blocks past the count, which the host cannot
// know without reading it back, return at once), blockIdx.y the 32 weight rows as above, blockIdx.z
// the table (T0, or T1: an expert's gate and up in one launch). Each output has the bits of its
// expert's own `mmq_*` (the split-1 matvec's), whatever rows share its tile.
struct MmqGroupTile {
    const u8* W;
    float* Y;
    int t0, t_end;
    __device__ __forceinline__ static bool at(const unsigned long long* __restrict__ T0,
                                              const unsigned long long* __restrict__ T1, const int* __restrict__ tiles,
                                              float* Y0, float* Y1, MmqGroupTile* out) {
        int tile = blockIdx.x;
        if (tile >= tiles[0]) return false;
        const int* t = tiles + 1 + 3 * tile;
        out->W = (const u8*)(blockIdx.z == 0 ? T0 : T1)[t[0]];
        out->Y = blockIdx.z == 0 ? Y0 : Y1;
        out->t0 = t[1];
        out->t_end = t[2];
        return true;
    }
};

#define MMQ_IDS_ARGS                                                                                    \
    const unsigned long long *__restrict__ T0, const unsigned long long *__restrict__ T1,              \
        const int *__restrict__ tiles, const u8 *__restrict__ A, float *__restrict__ Y0, float *__restrict__ Y1, \
        int rows, int cols, int n_total

extern "C" __global__ void __launch_bounds__(128) mmq_ids_q4_k(MMQ_IDS_ARGS) {
    WAIT_PRIOR_GRID();
    MmqGroupTile gt;
    if (!MmqGroupTile::at(T0, T1, tiles, Y0, Y1, &gt)) return;
    MmqTile tl = MmqTile::at(cols, gt.t0, gt.t_end);
    mmq_run(MmqQ4k(gt.W, tl), tl, GlobalQ8K::at(A, n_total, cols, 0), gt.Y, rows, tl.r0 < rows);
}

extern "C" __global__ void __launch_bounds__(128, 4) mmq_ids_q6_k(MMQ_IDS_ARGS) {
    WAIT_PRIOR_GRID();
    MmqGroupTile gt;
    if (!MmqGroupTile::at(T0, T1, tiles, Y0, Y1, &gt)) return;
    MmqTile tl = MmqTile::at(cols, gt.t0, gt.t_end);
    mmq_run(MmqQ6k(gt.W, tl, rows), tl, GlobalQ8K::at(A, n_total, cols, 0), gt.Y, rows, tl.r0 < rows);
}

extern "C" __global__ void __launch_bounds__(128) mmq_ids_q8_0(MMQ_IDS_ARGS) {
    WAIT_PRIOR_GRID();
    MmqGroupTile gt;
    if (!MmqGroupTile::at(T0, T1, tiles, Y0, Y1, &gt)) return;
    mmq8_run(gt.W, A, gt.Y, rows, cols, n_total, MmqTile::at(cols, gt.t0, gt.t_end));
}
