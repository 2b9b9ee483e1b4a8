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

__device__ __forceinline__ u32 smem_u32(const void* p) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// 16 bytes global -> shared, zero-filled when `valid` is false (then nothing is read).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

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

// Two f32 to one f16x2 register: `lo` in the low half (the lower column).
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Tile `kt` of K or V (BC rows of D halves) into shared memory, rows past nk zero-filled.
template <int D, int BC>
__device__ __forceinline__ void fa_load_tile(u16* dst, const u16* src, int kt, int nk, int kv_width, int col0) {
    constexpr int LD = D + 8, CHUNKS = D / 8;
    for (int i = threadIdx.x; i < BC * CHUNKS; i += FA_THREADS) {
        int r = i / CHUNKS, c = i % CHUNKS;
        int key = kt * BC + r;
        bool valid = key < nk;
        const u16* s = src + (valid ? (size_t)key * kv_width + col0 + c * 8 : 0);
        cp_async16(smem_u32(dst + r * LD + c * 8), s, valid);
    }
}

template <int D, int BC>
__device__ __forceinline__ void flash_prefill(const float* __restrict__ q, const u16* __restrict__ kc,
                                              const u16* __restrict__ vc, float* __restrict__ out,
                                              const int* __restrict__ pos, const int* __restrict__ plan, int t,
                                              int nk, int key_lo, int window, int q_width, int kv_width, int group,
                                              float scale_log2) {
    // Rows padded by 16 bytes: the eight rows an ldmatrix reads fall in distinct bank groups.
    constexpr int LD = D + 8, KS = D / 16, NT = BC / 8;
    __shared__ __align__(16) u16 ks[BC * LD];
    __shared__ __align__(16) u16 vs[BC * LD];
    int qt = gridDim.x - 1 - blockIdx.x;  // the tiles with the most keys start first
    int h = blockIdx.y, col0 = (h / group) * D;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int quad = lane & 3;
    int ra = qt * FA_ROWS + warp * 16 + (lane >> 2), rb = ra + 8;
    int pa = pos[min(ra, t - 1)], pb = pos[min(rb, t - 1)];

    // This warp's 16 query rows as mma A fragments, rounded to f16.
    u32 qf[KS][4];
    {
        const float* qa = q + (size_t)min(ra, t - 1) * q_width + h * D;
        const float* qb = q + (size_t)min(rb, t - 1) * q_width + h * D;
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
    float ma = -INFINITY, mb = -INFINITY, la = 0.f, lb = 0.f;

    int begin = plan[qt], end = plan[qt + 1];
    if (begin < end) {
        fa_load_tile<D, BC>(ks, kc, plan[begin] >> 1, nk, kv_width, col0);
        cp_async_commit();
        fa_load_tile<D, BC>(vs, vc, plan[begin] >> 1, nk, kv_width, col0);
        cp_async_commit();
    }
    // ldmatrix lane addresses: K (non-transposed) and V (transposed), see the fragment layouts of
    // mma.m16n8k16: lane l names row l % 8 of matrix l / 8.
    int k_row = (lane & 7) + ((lane >> 4) << 3), k_col = ((lane >> 3) & 1) * 8;
    int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_col = (lane >> 4) * 8;
    u32 ks_base = smem_u32(ks + k_row * LD + k_col), vs_base = smem_u32(vs + v_row * LD + v_col);

    for (int e = begin; e < end; e++) {
        int kt = plan[e] >> 1;
        bool partial = plan[e] & 1;
        cp_async_wait<1>();
        __syncthreads();
        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                u32 b0, b1, b2, b3;
                ldsm_x4(ks_base + (j * 8 * LD + kk * 16) * 2, b0, b1, b2, b3);
                mma16816(s[j], qf[kk], b0, b1);
                mma16816(s[j + 1], qf[kk], b2, b3);
            }
        }
        __syncthreads();  // every warp is done with ks
        if (e + 1 < end) fa_load_tile<D, BC>(ks, kc, plan[e + 1] >> 1, nk, kv_width, col0);
        cp_async_commit();

        // Scores to log2 units, masked on partial tiles; the running max and sum per row.
        float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
        for (int j = 0; j < NT; j++) {
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
        float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
        // A row that has seen no key yet keeps max -inf: subtract 0 instead (its terms are all 0).
        float ua = na == -INFINITY ? 0.f : na, ub = nb == -INFINITY ? 0.f : nb;
        float ca = exp2f(ma - ua), cb = exp2f(mb - ub);
        ma = na;
        mb = nb;
        la *= ca;
        lb *= cb;
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            o[i][0] *= ca;
            o[i][1] *= ca;
            o[i][2] *= cb;
            o[i][3] *= cb;
        }
        // P as A fragments: the accumulators of key tiles 2k, 2k + 1 are the A layout of keys 16k..16k+15.
        u32 pf[BC / 16][4];
#pragma unroll
        for (int k = 0; k < BC / 16; k++) {
            float p0 = exp2f(s[2 * k][0] - ua), p1 = exp2f(s[2 * k][1] - ua);
            float p2 = exp2f(s[2 * k][2] - ub), p3 = exp2f(s[2 * k][3] - ub);
            float p4 = exp2f(s[2 * k + 1][0] - ua), p5 = exp2f(s[2 * k + 1][1] - ua);
            float p6 = exp2f(s[2 * k + 1][2] - ub), p7 = exp2f(s[2 * k + 1][3] - ub);
            la += p0 + p1 + p4 + p5;
            lb += p2 + p3 + p6 + p7;
            pf[k][0] = pack_f16x2(p0, p1);
            pf[k][1] = pack_f16x2(p2, p3);
            pf[k][2] = pack_f16x2(p4, p5);
            pf[k][3] = pack_f16x2(p6, p7);
        }

        cp_async_wait<1>();
        __syncthreads();  // V of this tile is in
#pragma unroll
        for (int k = 0; k < BC / 16; k++) {
#pragma unroll
            for (int d = 0; d < D / 8; d += 2) {
                u32 b0, b1, b2, b3;
                ldsm_x4_t(vs_base + (k * 16 * LD + d * 8) * 2, b0, b1, b2, b3);
                mma16816(o[d], pf[k], b0, b1);
                mma16816(o[d + 1], pf[k], b2, b3);
            }
        }
        __syncthreads();  // every warp is done with vs
        if (e + 1 < end) fa_load_tile<D, BC>(vs, vc, plan[e + 1] >> 1, nk, kv_width, col0);
        cp_async_commit();
    }
    cp_async_wait<0>();

    la += __shfl_xor_sync(0xffffffffu, la, 1);
    la += __shfl_xor_sync(0xffffffffu, la, 2);
    lb += __shfl_xor_sync(0xffffffffu, lb, 1);
    lb += __shfl_xor_sync(0xffffffffu, lb, 2);
    float ia = la > 0.f ? 1.f / la : 0.f, ib = lb > 0.f ? 1.f / lb : 0.f;
#pragma unroll
    for (int d = 0; d < D / 8; d++) {
        int c = h * D + d * 8 + quad * 2;
        if (ra < t) *(float2*)(out + (size_t)ra * q_width + c) = make_float2(o[d][0] * ia, o[d][1] * ia);
        if (rb < t) *(float2*)(out + (size_t)rb * q_width + c) = make_float2(o[d][2] * ib, o[d][3] * ib);
    }
}

// One entry point per head dimension; wider heads take narrower key tiles to stay in registers.
#define FLASH_ENTRY(D, BC)                                                                                    \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) flash_prefill_d##D(                              \
        const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,                  \
        float* __restrict__ out, const int* __restrict__ pos, const int* __restrict__ plan, int t, int nk,    \
        int key_lo, int window, int q_width, int kv_width, int group, float scale_log2) {                     \
        flash_prefill<D, BC>(q, kc, vc, out, pos, plan, t, nk, key_lo, window, q_width, kv_width, group,      \
                             scale_log2);                                                                     \
    }
FLASH_ENTRY(32, 64)
FLASH_ENTRY(64, 64)
FLASH_ENTRY(128, 64)
FLASH_ENTRY(256, 32)
