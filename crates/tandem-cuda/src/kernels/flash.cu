// Prefill attention on the tensor cores, the scores kept on chip (the FlashAttention-2 scheme): a block
// of four warps takes 64 query rows of one head (16 rows a warp) and walks the key tiles its plan lists,
// keeping a running max and sum per row. S = Q·Kᵀ and O += P·V are `mma.sync` m16n8k16 products of f16
// operands with f32 accumulators: Q is rounded to f16 (as the CPU backend rounds it before the K
// product) and P to f16 before the V product. K and V tiles stream into shared memory with `cp.async`:
// the next tile's K loads while this tile's softmax and P·V run, the next V while the next S runs.
//
// The plan (`flash::plan` on the host, computed once per chunk and shared by every layer of it) lists
// for query tile i the entries plan[plan[i]] .. plan[plan[i + 1]], each `key_tile * 2 + partial`:
// tiles no query of the tile may see are not listed; dense ones (every query sees every key) skip the
// mask; partial ones mask element by element from the query positions and the window.
//
// Keys: `kc`/`vc` point at the chunk's first key row (logical position key_lo), rows kv_width apart,
// contiguous for nk rows. Query row r (position pos[r]) sees key j iff key_lo + j <= pos[r] and, with a
// window, key_lo + j > pos[r] - window.
#define FA_ROWS 64
#define FA_THREADS 128

__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

// c += a · b for one m16n8k16 tile (a: 16x16 row-major f16, b: 16x8 column-major f16, c: f32).
__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x, one MUFU instruction (inputs here are <= 0; -inf gives 0, tiny results flush to 0).
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Two f32 to one f16x2 register: `lo` in the low half (the lower column).
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Tile `kt` of K or V (BC rows of D halves) into shared memory, rows past nk zero-filled.
// HOISTED: consecutive threads take consecutive 16-byte chunks of a key row, a pass of the block
// covers PASS rows, and a thread's chunk stays the same from pass to pass, so each copy costs only its
// key's address (as in `fa_load_tile_wg`): 26-43% fewer SASS instructions in the one-m-tile kernels.
// The two-m-tile kernel keeps the loop that works out each chunk's place: at its register count the
// hoisted copies spilled inside its main loop.
template <int D, int BC, bool HOISTED>
__device__ __forceinline__ void fa_load_tile(u16* dst, const u16* src, int kt, int nk, int kv_width, int col0) {
    constexpr int LD = D + 8, CHUNKS = D / 8, PASS = FA_THREADS / CHUNKS;
    if constexpr (HOISTED) {
        static_assert(FA_THREADS % CHUNKS == 0 && BC % PASS == 0, "whole passes of the tile");
        int c = threadIdx.x % CHUNKS, r0 = threadIdx.x / CHUNKS;
        u32 at = smem_u32(dst + r0 * LD + c * 8);
        const u16* from = src + col0 + c * 8;
#pragma unroll
        for (int k = 0; k < BC / PASS; k++) {
            int key = kt * BC + r0 + k * PASS;
            bool valid = key < nk;
            cp_async16(at + k * PASS * LD * 2, from + (valid ? (size_t)key * kv_width : 0), valid);
        }
    } else {
        for (int i = threadIdx.x; i < BC * CHUNKS; i += FA_THREADS) {
            int r = i / CHUNKS, c = i % CHUNKS;
            int key = kt * BC + r;
            bool valid = key < nk;
            const u16* s = src + (valid ? (size_t)key * kv_width + col0 + c * 8 : 0);
            cp_async16(smem_u32(dst + r * LD + c * 8), s, valid);
        }
    }
}

// Variant <D, BC, MT, QREG>: head size D, BC keys a tile, MT m-tiles of 16 query rows per warp (so
// 64 * MT rows a block), the warp's Q fragments held in registers (QREG) or read from shared memory at
// each step. Each K or V fragment a warp loads serves its MT m-tiles, so MT = 2 halves the shared-memory
// reads per product. Shared memory (dynamic): K and V tiles, then the block's Q rows unless QREG.
template <int D, int BC, int MT, bool QREG>
__device__ __forceinline__ void flash_prefill(const float* __restrict__ q, const u16* __restrict__ kc,
                                              const u16* __restrict__ vc, float* __restrict__ out,
                                              const int* __restrict__ pos, const int* __restrict__ plan, int t,
                                              int nk, int key_lo, int window, int q_width, int kv_width, int group,
                                              float scale_log2) {
    // Rows padded by 16 bytes: the eight rows an ldmatrix reads fall in distinct bank groups.
    constexpr int LD = D + 8, KS = D / 16, NT = BC / 8, BR = FA_ROWS * MT;
    extern __shared__ __align__(16) u16 fa_smem[];
    u16* ks = fa_smem;
    u16* vs = ks + BC * LD;
    u16* qs = vs + BC * LD;
    int qt = gridDim.x - 1 - blockIdx.x;  // the tiles with the most keys start first
    int h = blockIdx.y, col0 = (h / group) * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int quad = lane & 3;
    int row0 = qt * BR + warp * 16 * MT;  // this warp's first query row
    int ra[MT], pa[MT], pb[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        ra[m] = row0 + m * 16 + (lane >> 2);
        pa[m] = pos[min(ra[m], t - 1)];
        pb[m] = pos[min(ra[m] + 8, t - 1)];
    }

    // The warp's query rows as mma A fragments, rounded to f16: in registers, or staged in shared memory
    // by the whole block (rows past t repeat the last row; their results are not written).
    u32 qf[QREG ? MT : 1][QREG ? KS : 1][4];
    if (QREG) {
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const float* qa = q + (size_t)min(ra[m], t - 1) * q_width + h * D;
            const float* qb = q + (size_t)min(ra[m] + 8, t - 1) * q_width + h * D;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                int c = kk * 16 + quad * 2;
                float2 a0 = *(const float2*)(qa + c), b0 = *(const float2*)(qb + c);
                float2 a1 = *(const float2*)(qa + c + 8), b1 = *(const float2*)(qb + c + 8);
                qf[QREG ? m : 0][QREG ? kk : 0][0] = pack_f16x2(a0.x, a0.y);
                qf[QREG ? m : 0][QREG ? kk : 0][1] = pack_f16x2(b0.x, b0.y);
                qf[QREG ? m : 0][QREG ? kk : 0][2] = pack_f16x2(a1.x, a1.y);
                qf[QREG ? m : 0][QREG ? kk : 0][3] = pack_f16x2(b1.x, b1.y);
            }
        }
    } else {
        for (int i = threadIdx.x; i < BR * D / 4; i += FA_THREADS) {
            int r = i / (D / 4), c = (i % (D / 4)) * 4;
            float4 v = *(const float4*)(q + (size_t)min(qt * BR + r, t - 1) * q_width + h * D + c);
            *(uint2*)(qs + r * LD + c) = make_uint2(pack_f16x2(v.x, v.y), pack_f16x2(v.z, v.w));
        }
    }

    float o[MT][D / 8][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < D / 8; i++) o[m][i][0] = o[m][i][1] = o[m][i][2] = o[m][i][3] = 0.f;
    float ma[MT], mb[MT], la[MT], lb[MT];
#pragma unroll
    for (int m = 0; m < MT; m++) {
        ma[m] = mb[m] = -INFINITY;
        la[m] = lb[m] = 0.f;
    }

    int begin = plan[qt], end = plan[qt + 1];
    if (begin < end) {
        fa_load_tile<D, BC, QREG>(ks, kc, plan[begin] >> 1, nk, kv_width, col0);
        cp_async_commit();
        fa_load_tile<D, BC, QREG>(vs, vc, plan[begin] >> 1, nk, kv_width, col0);
        cp_async_commit();
    }
    // ldmatrix lane addresses (lane l names row l % 8 of matrix l / 8, see the fragment layouts of
    // mma.m16n8k16): K as B operand, non-transposed; V as B operand, transposed; Q as A operand.
    int k_row = (lane & 7) + ((lane >> 4) << 3), k_col = ((lane >> 3) & 1) * 8;
    int a_row = (lane & 7) + (((lane >> 3) & 1) << 3), a_col = (lane >> 4) * 8;
    u32 ks_base = smem_u32(ks + k_row * LD + k_col), vs_base = smem_u32(vs + a_row * LD + a_col);
    u32 qs_base = smem_u32(qs + (warp * 16 * MT + a_row) * LD + a_col);

    for (int e = begin; e < end; e++) {
        int kt = plan[e] >> 1;
        bool partial = plan[e] & 1;
        cp_async_wait<1>();
        __syncthreads();
        float s[MT][NT][4];
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int j = 0; j < NT; j++) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            u32 a[MT][4];
#pragma unroll
            for (int m = 0; m < MT; m++) {
                if (QREG) {
#pragma unroll
                    for (int i = 0; i < 4; i++) a[m][i] = qf[QREG ? m : 0][QREG ? kk : 0][i];
                } else {
                    ldsm_x4(qs_base + (m * 16 * LD + kk * 16) * 2, a[m][0], a[m][1], a[m][2], a[m][3]);
                }
            }
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                u32 b0, b1, b2, b3;
                ldsm_x4(ks_base + (j * 8 * LD + kk * 16) * 2, b0, b1, b2, b3);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    mma16816(s[m][j], a[m], b0, b1);
                    mma16816(s[m][j + 1], a[m], b2, b3);
                }
            }
        }
        __syncthreads();  // every warp is done with ks
        if (e + 1 < end) fa_load_tile<D, BC, QREG>(ks, kc, plan[e + 1] >> 1, nk, kv_width, col0);
        cp_async_commit();

        // Scores to log2 units, masked on partial tiles; the running max and sum per row; P as A
        // fragments (the accumulators of key tiles 2k, 2k + 1 are the A layout of keys 16k..16k+15).
        u32 pf[MT][BC / 16][4];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
            for (int j = 0; j < NT; j++) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float x = s[m][j][i] * scale_log2;
                    if (partial) {
                        int key = kt * BC + j * 8 + quad * 2 + (i & 1);
                        int kp = key_lo + key, p = i < 2 ? pa[m] : pb[m];
                        bool seen = key < nk && kp <= p && (window == 0 || kp > p - window);
                        if (!seen) x = -INFINITY;
                    }
                    s[m][j][i] = x;
                    if (i < 2) xa = fmaxf(xa, x);
                    else xb = fmaxf(xb, x);
                }
            }
            xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
            xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
            xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
            xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
            float na = fmaxf(ma[m], xa), nb = fmaxf(mb[m], xb);
            // A row that has seen no key yet keeps max -inf: subtract 0 instead (its terms are all 0).
            float ua = na == -INFINITY ? 0.f : na, ub = nb == -INFINITY ? 0.f : nb;
            float ca = exp2_approx(ma[m] - ua), cb = exp2_approx(mb[m] - ub);
            ma[m] = na;
            mb[m] = nb;
            la[m] *= ca;
            lb[m] *= cb;
#pragma unroll
            for (int i = 0; i < D / 8; i++) {
                o[m][i][0] *= ca;
                o[m][i][1] *= ca;
                o[m][i][2] *= cb;
                o[m][i][3] *= cb;
            }
#pragma unroll
            for (int k = 0; k < BC / 16; k++) {
                float p0 = exp2_approx(s[m][2 * k][0] - ua), p1 = exp2_approx(s[m][2 * k][1] - ua);
                float p2 = exp2_approx(s[m][2 * k][2] - ub), p3 = exp2_approx(s[m][2 * k][3] - ub);
                float p4 = exp2_approx(s[m][2 * k + 1][0] - ua), p5 = exp2_approx(s[m][2 * k + 1][1] - ua);
                float p6 = exp2_approx(s[m][2 * k + 1][2] - ub), p7 = exp2_approx(s[m][2 * k + 1][3] - ub);
                la[m] += p0 + p1 + p4 + p5;
                lb[m] += p2 + p3 + p6 + p7;
                pf[m][k][0] = pack_f16x2(p0, p1);
                pf[m][k][1] = pack_f16x2(p2, p3);
                pf[m][k][2] = pack_f16x2(p4, p5);
                pf[m][k][3] = pack_f16x2(p6, p7);
            }
        }

        cp_async_wait<1>();
        __syncthreads();  // V of this tile is in
#pragma unroll
        for (int k = 0; k < BC / 16; k++) {
#pragma unroll
            for (int d = 0; d < D / 8; d += 2) {
                u32 b0, b1, b2, b3;
                ldsm_x4_t(vs_base + (k * 16 * LD + d * 8) * 2, b0, b1, b2, b3);
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    mma16816(o[m][d], pf[m][k], b0, b1);
                    mma16816(o[m][d + 1], pf[m][k], b2, b3);
                }
            }
        }
        __syncthreads();  // every warp is done with vs
        if (e + 1 < end) fa_load_tile<D, BC, QREG>(vs, vc, plan[e + 1] >> 1, nk, kv_width, col0);
        cp_async_commit();
    }
    cp_async_wait<0>();

#pragma unroll
    for (int m = 0; m < MT; m++) {
        float a = la[m], b = lb[m];
        a += __shfl_xor_sync(0xffffffffu, a, 1);
        a += __shfl_xor_sync(0xffffffffu, a, 2);
        b += __shfl_xor_sync(0xffffffffu, b, 1);
        b += __shfl_xor_sync(0xffffffffu, b, 2);
        float ia = a > 0.f ? 1.f / a : 0.f, ib = b > 0.f ? 1.f / b : 0.f;
        int r = ra[m];
#pragma unroll
        for (int d = 0; d < D / 8; d++) {
            int c = h * D + d * 8 + quad * 2;
            if (r < t) *(float2*)(out + (size_t)r * q_width + c) = make_float2(o[m][d][0] * ia, o[m][d][1] * ia);
            if (r + 8 < t)
                *(float2*)(out + (size_t)(r + 8) * q_width + c) = make_float2(o[m][d][2] * ib, o[m][d][3] * ib);
        }
    }
}

// The warpgroup form (sm_90 only): a warpgroup of four warps takes 64 query rows (16 a warp, Q in
// registers), and S = Q·Kᵀ and O += P·V are `wgmma` products reading K and V straight from shared
// memory (`wgmma.cuh`): no warp loads B fragments itself, and the tensor cores run while the warps
// go on. WG warpgroups a block take 64 · WG rows and share the K and V tiles (BC = 64 or 128 keys).
//
// Tile e's S is issued together with the previous tile's P·V, so the softmax of tile e runs while
// the tensor cores do P·V of e - 1 (the scheme of FlashAttention-3's intra-warpgroup overlap); O is
// rescaled once that P·V is done. The masks, the running softmax, the f16 rounding of Q and P and
// the output are those of `flash_prefill` with one m-tile.
//
// K and V tiles (BC keys × D halves) are stored in the 128-byte swizzle: D / 64 panels of BC keys ×
// 64 halves; a key's 128 bytes in a panel are one row, its 16-byte chunk c stored at c ^ (key % 8),
// so a whole 256-byte key row is one coalesced read and lands without bank conflicts. For S, B = Kᵀ
// is K-major: 8-key groups 1024 bytes apart (SBO), a K step of 16 halves 32 bytes on inside a panel.
// For P·V the same bytes are B = V N-major: panels (64 columns) BC · 128 bytes apart (LBO), 8-key
// groups 1024 bytes apart (SBO). (Without the swizzle, in core matrices of 8 keys' 16-byte chunks,
// each copy request reads 16 bytes of 8 keys: the kernel ran 18% slower, its L2 3.4 times as busy.)
#if defined(TANDEM_WGMMA)
template <int D, int BC, int THREADS>
__device__ __forceinline__ void fa_load_tile_wg(u16* dst, const u16* src, int kt, int nk, int kv_width, int col0) {
    // Consecutive threads take consecutive chunks of a key row; a pass of the block covers PASS rows.
    // A thread's chunk and its swizzled place stay the same from pass to pass (PASS is a multiple of
    // 8), so each copy costs only its key's address.
    constexpr int CHUNKS = D / 8, PASS = THREADS / CHUNKS;
    static_assert(THREADS % CHUNKS == 0 && PASS % 8 == 0 && BC % PASS == 0, "whole passes of the tile");
    int c = threadIdx.x % CHUNKS, r0 = threadIdx.x / CHUNKS;
    u32 at = smem_u32(dst) + (c / 8) * BC * 128 + r0 * 128 + (((c % 8) ^ (r0 % 8)) * 16);
    const u16* from = src + col0 + c * 8;
#pragma unroll
    for (int k = 0; k < BC / PASS; k++) {
        int key = kt * BC + r0 + k * PASS;
        bool valid = key < nk;
        cp_async16(at + k * PASS * 128, from + (valid ? (size_t)key * kv_width : 0), valid);
    }
}

// One row pair's running softmax state: rows lane / 4 (a) and lane / 4 + 8 (b) of the warp's 16.
struct WgSoftmax {
    float ma, mb, la, lb;
};

// Tile scores `s` (a warp's 16 rows × BC keys, accumulator layout) to log2 units, masked on partial
// tiles, then to exp2(s - running max) in place; the running max and sum move on and `ca`, `cb` are
// the factors O must be scaled by.
// (`flash_prefill` writes the same steps inline: calling this from its m-tile loop made the 256-wide
// form spill registers and the two-m-tile form 48 instructions longer.)
template <int BC>
__device__ __forceinline__ void wg_softmax(float (&s)[BC / 8][4], WgSoftmax& st, float& ca, float& cb, bool partial,
                                           int kt, int quad, int pa, int pb, int key_lo, int nk, int window,
                                           float scale_log2) {
    float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
    for (int j = 0; j < BC / 8; j++) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float x = s[j][i] * scale_log2;
            if (partial) {
                int key = kt * BC + j * 8 + quad * 2 + (i & 1);
                int kp = key_lo + key, p = i < 2 ? pa : pb;
                bool seen = key < nk && kp <= p && (window == 0 || kp > p - window);
                if (!seen) x = -INFINITY;
            }
            s[j][i] = x;
            if (i < 2) xa = fmaxf(xa, x);
            else xb = fmaxf(xb, x);
        }
    }
    xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
    xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
    xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
    xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
    float na = fmaxf(st.ma, xa), nb = fmaxf(st.mb, xb);
    // A row that has seen no key yet keeps max -inf: subtract 0 instead (its terms are all 0).
    float ua = na == -INFINITY ? 0.f : na, ub = nb == -INFINITY ? 0.f : nb;
    ca = exp2_approx(st.ma - ua);
    cb = exp2_approx(st.mb - ub);
    st.ma = na;
    st.mb = nb;
    st.la *= ca;
    st.lb *= cb;
#pragma unroll
    for (int k = 0; k < BC / 16; k++) {
        float* lo = s[2 * k];
        float* hi = s[2 * k + 1];
        lo[0] = exp2_approx(lo[0] - ua);
        lo[1] = exp2_approx(lo[1] - ua);
        lo[2] = exp2_approx(lo[2] - ub);
        lo[3] = exp2_approx(lo[3] - ub);
        hi[0] = exp2_approx(hi[0] - ua);
        hi[1] = exp2_approx(hi[1] - ua);
        hi[2] = exp2_approx(hi[2] - ub);
        hi[3] = exp2_approx(hi[3] - ub);
        st.la += lo[0] + lo[1] + hi[0] + hi[1];
        st.lb += lo[2] + lo[3] + hi[2] + hi[3];
    }
}

// P as A fragments (the accumulators of key columns 16k .. 16k + 15 are the A layout of that K step).
template <int BC>
__device__ __forceinline__ void wg_pack_p(u32 (&pf)[BC / 16][4], const float (&s)[BC / 8][4]) {
#pragma unroll
    for (int k = 0; k < BC / 16; k++) {
        pf[k][0] = pack_f16x2(s[2 * k][0], s[2 * k][1]);
        pf[k][1] = pack_f16x2(s[2 * k][2], s[2 * k][3]);
        pf[k][2] = pack_f16x2(s[2 * k + 1][0], s[2 * k + 1][1]);
        pf[k][3] = pack_f16x2(s[2 * k + 1][2], s[2 * k + 1][3]);
    }
}

template <int D>
__device__ __forceinline__ void wg_scale_o(float (&o)[D / 8][4], float ca, float cb) {
#pragma unroll
    for (int i = 0; i < D / 8; i++) {
        o[i][0] *= ca;
        o[i][1] *= ca;
        o[i][2] *= cb;
        o[i][3] *= cb;
    }
}

template <int D, int BC>
__device__ __forceinline__ void wg_issue_s(float (&s)[BC / 8][4], const u32 (&qf)[D / 16][4], const u16* ks) {
    u32 kb = smem_u32(ks);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        u64 desc = wg_desc(kb + (kk / 4) * BC * 128 + (kk % 4) * 32, 16, 1024, 1);
        if constexpr (BC == 64) wg_mma_n64(&s[0][0], qf[kk], desc, kk > 0);
        else wg_mma_n128<0>(&s[0][0], qf[kk], desc, kk > 0);
    }
    wg_commit();
}

template <int D, int BC>
__device__ __forceinline__ void wg_issue_pv(float (&o)[D / 8][4], const u32 (&pf)[BC / 16][4], const u16* vs) {
    static_assert(D == 128, "the P·V product is written for 128 columns");
    u32 vb = smem_u32(vs);
    wg_fence();
#pragma unroll
    for (int k = 0; k < BC / 16; k++) {
        wg_mma_n128<1>(&o[0][0], pf[k], wg_desc(vb + k * 2048, BC * 128, 1024, 1), 1);
    }
    wg_commit();
}

template <int N, int M>
__device__ __forceinline__ void wg_hold_all(float (&r)[N][M]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < M; j++) wg_hold(r[i][j]);
}
#endif

template <int D, int BC, int WG>
__device__ __forceinline__ void flash_prefill_wg(const float* __restrict__ q, const u16* __restrict__ kc,
                                                 const u16* __restrict__ vc, float* __restrict__ out,
                                                 const int* __restrict__ pos, const int* __restrict__ plan, int t,
                                                 int nk, int key_lo, int window, int q_width, int kv_width,
                                                 int group, float scale_log2) {
#if defined(TANDEM_WGMMA)
    constexpr int KS = D / 16, NT = BC / 8, TILE = BC * D, THREADS = 128 * WG;
    extern __shared__ __align__(1024) u16 fa_smem[];
    // The swizzle is applied to address bits, so its atoms must start 1024-byte aligned.
    if (smem_u32(fa_smem) & 1023) __trap();
    // Stage i (two of them): K at fa_smem + 2i · TILE, V after it.
    auto k_stage = [&](int i) { return fa_smem + (i & 1) * 2 * TILE; };
    auto v_stage = [&](int i) { return fa_smem + (i & 1) * 2 * TILE + TILE; };
    int qt = gridDim.x - 1 - blockIdx.x;  // the tiles with the most keys start first
    int h = blockIdx.y, col0 = (h / group) * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int quad = lane & 3;
    int ra = qt * FA_ROWS * WG + warp * 16 + (lane >> 2);  // warp w of the block: rows 16w ..
    int pa = pos[min(ra, t - 1)], pb = pos[min(ra + 8, t - 1)];

    // The warp's query rows as A fragments, rounded to f16 (rows past t repeat the last row).
    u32 qf[KS][4];
    {
        const float* qa = q + (size_t)min(ra, t - 1) * q_width + h * D;
        const float* qb = q + (size_t)min(ra + 8, t - 1) * q_width + h * D;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            int c = kk * 16 + quad * 2;
            float2 a0 = *(const float2*)(qa + c), b0 = *(const float2*)(qb + c);
            float2 a1 = *(const float2*)(qa + c + 8), b1 = *(const float2*)(qb + c + 8);
            qf[kk][0] = pack_f16x2(a0.x, a0.y);
            qf[kk][1] = pack_f16x2(b0.x, b0.y);
            qf[kk][2] = pack_f16x2(a1.x, a1.y);
            qf[kk][3] = pack_f16x2(b1.x, b1.y);
        }
    }

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    WgSoftmax st = {-INFINITY, -INFINITY, 0.f, 0.f};
    float s[NT][4];
    u32 pf[BC / 16][4];
    float ca, cb;

    int begin = plan[qt], end = plan[qt + 1];
    auto load = [&](u16* dst, const u16* src, int e) {
        fa_load_tile_wg<D, BC, THREADS>(dst, src, plan[e] >> 1, nk, kv_width, col0);
    };
    if (begin < end) {
        load(k_stage(0), kc, begin);
        cp_async_commit();
    }
    for (int e = begin; e < end; e++) {
        int i = e - begin, kt = plan[e] >> 1;
        bool partial = plan[e] & 1;
        // This tile's K and the last tile's V are in, and every warp is done with what the next copies
        // overwrite: stage i + 1 held K of tile i - 1, whose S is done, and stage i V of tile i - 2,
        // whose P·V finished in the last iteration. The copies are issued only after the fence, which
        // would otherwise wait for them too.
        cp_async_wait<0>();
        fence_async_shared();
        __syncthreads();
        if (e + 1 < end) load(k_stage(i + 1), kc, e + 1);
        load(v_stage(i), vc, e);
        cp_async_commit();
        wg_issue_s<D, BC>(s, qf, k_stage(i));
        if (i > 0) {
            wg_issue_pv<D, BC>(o, pf, v_stage(i - 1));
            wg_wait<1>();
        } else {
            wg_wait<0>();
        }
        wg_hold_all(s);
        wg_softmax<BC>(s, st, ca, cb, partial, kt, quad, pa, pb, key_lo, nk, window, scale_log2);
        wg_wait<0>();
        wg_hold_all(o);
        wg_scale_o<D>(o, ca, cb);
        wg_pack_p<BC>(pf, s);
    }
    if (begin < end) {
        // The last tile's P·V.
        cp_async_wait<0>();
        fence_async_shared();
        __syncthreads();
        wg_issue_pv<D, BC>(o, pf, v_stage(end - 1 - begin));
        wg_wait<0>();
        wg_hold_all(o);
    }
    cp_async_wait<0>();

    float a = st.la, b = st.lb;
    a += __shfl_xor_sync(0xffffffffu, a, 1);
    a += __shfl_xor_sync(0xffffffffu, a, 2);
    b += __shfl_xor_sync(0xffffffffu, b, 1);
    b += __shfl_xor_sync(0xffffffffu, b, 2);
    float ia = a > 0.f ? 1.f / a : 0.f, ib = b > 0.f ? 1.f / b : 0.f;
#pragma unroll
    for (int d = 0; d < D / 8; d++) {
        int c = h * D + d * 8 + quad * 2;
        if (ra < t) *(float2*)(out + (size_t)ra * q_width + c) = make_float2(o[d][0] * ia, o[d][1] * ia);
        if (ra + 8 < t)
            *(float2*)(out + (size_t)(ra + 8) * q_width + c) = make_float2(o[d][2] * ib, o[d][3] * ib);
    }
#else
    __trap();  // the host offers this form only on sm_90 (`FlashVariant::runs_on`)
#endif
}

// One entry point per variant: FLASH_ENTRY(head size, keys a tile, m-tiles a warp, r: Q in registers,
// s: Q in shared memory). The host's table of them is `flash::VARIANTS`.
#define FLASH_Q_r true
#define FLASH_Q_s false
#define FLASH_ENTRY(D, BC, MT, Q)                                                                             \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) flash_prefill_d##D##_k##BC##_m##MT##_##Q(        \
        const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,                  \
        float* __restrict__ out, const int* __restrict__ pos, const int* __restrict__ plan, int t, int nk,    \
        int key_lo, int window, int q_width, int kv_width, int group, float scale_log2) {                     \
        WAIT_PRIOR_GRID();                                                                                     \
        flash_prefill<D, BC, MT, FLASH_Q_##Q>(q, kc, vc, out, pos, plan, t, nk, key_lo, window, q_width,      \
                                              kv_width, group, scale_log2);                                   \
    }
FLASH_ENTRY(32, 64, 1, r)
FLASH_ENTRY(64, 64, 1, r)
FLASH_ENTRY(128, 64, 1, r)
FLASH_ENTRY(128, 64, 2, s)
FLASH_ENTRY(256, 32, 1, r)

// The warpgroup form: FLASH_WG_ENTRY(head size, keys a tile, warpgroups a block (of 64 query rows
// each, sharing the K and V tiles)).
#define FLASH_WG_ENTRY(D, BC, WG)                                                                             \
    extern "C" __global__ void __launch_bounds__(128 * WG) flash_prefill_d##D##_k##BC##_m##WG##_w(            \
        const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,                  \
        float* __restrict__ out, const int* __restrict__ pos, const int* __restrict__ plan, int t, int nk,    \
        int key_lo, int window, int q_width, int kv_width, int group, float scale_log2) {                     \
        WAIT_PRIOR_GRID();                                                                                     \
        flash_prefill_wg<D, BC, WG>(q, kc, vc, out, pos, plan, t, nk, key_lo, window, q_width,                \
                                                    kv_width, group, scale_log2);                             \
    }
FLASH_WG_ENTRY(128, 64, 1)
FLASH_WG_ENTRY(128, 64, 2)
FLASH_WG_ENTRY(128, 128, 2)
