// Attention over the f16 KV cache in one launch: a partial softmax per (key tile, head, query), and
// the last tile block of each (head, query) to finish merges the tiles in ascending order. Tiles are
// aligned to absolute positions (tile j holds positions [j*ATT_TILE, (j+1)*ATT_TILE)), so a query meets
// the same tiles, summed in the same order, whether it arrives alone (decode), in a chunk, or staged:
// results are identical across chunkings, and whichever block merges, the merge's order is the same.
// Long contexts spread over many blocks (one per tile); tiles wholly outside a query's window or past
// its position are skipped without reading a key.
//
// Keys are found through the ring placement of the buffer they live in: logical position p sits at
// physical row (origin_physical + p - origin_logical) % capacity. The staged route passes its staging
// buffer with origin_logical = first staged position, origin_physical = 0.
//
// What changes from one decode step to the next (placement origins, the first tile and the number of
// tiles) is read from `meta` in device memory = {origin_logical, origin_physical, tile_lo, n_tiles},
// and the grid spans `tile_cap` tiles (blocks past n_tiles exit at once), so a captured CUDA graph
// replays every step with new `meta` contents.
#define ATT_TILE 128
#define MAX_HEAD_DIM 256

// partial layout: [(q * n_head + h) * tile_cap + tile] * (head_dim + 2): m, l, acc[head_dim].
// One block of ATT_THREADS threads per (tile, head, query) (or per KV head: `attend_tiles_body`);
// warp w takes the tile's keys
// ATT_KEYS * w .. ATT_KEYS * w + ATT_KEYS - 1. Scores: ATT_KEY_LANES lanes a key, lane part p of a
// key taking its 16-byte pieces p, p + ATT_KEY_LANES, ... (a dot over them in ascending order), then
// the key's lanes summed in a fixed butterfly. Weighted V: the row is C = head_dim / 8 chunks of 8
// dimensions; lane l takes chunk l % C of the warp's keys l / C, l / C + P, ... (P = 32 / C lanes
// share a chunk), all their loads in flight at once, and the P lanes of a chunk then sum in a fixed
// butterfly. The warps' partials merge in ascending order. Every sum's order is fixed by the tile
// and the key positions alone. The head size D is a template parameter, a power of two from 32 to
// MAX_HEAD_DIM, with one kernel per size (`attend_tiles_d<D>`): with D known, every loop over a row
// unrolls and no load or product sits behind a runtime bound (the runtime-D kernel ran about 1,550
// instructions a warp, 9 µs a decode step's layer on the H200).
//
// Eight warps of 16 keys, two lanes a key: at a short context a decode step has one block per KV
// head, so a block's time is one warp's dependent chain per query head. With four warps of 32 keys, a lane ran a 128-term dot per key and
// the weighted sums of 16 keys, about 750 instructions issued every 9 cycles (Nsight Compute,
// docs/gpu-runs/2026-11-30-host); here a lane's share of both is half. Sixteen warps of eight keys
// were slower in the graph (docs/gpu-runs/2026-11-30-fold: 7.6 µs a layer against 7.0; tg128 -1.2%
// where eight warps gained 0.8-1.7%).
#define ATT_THREADS 256
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_KEYS (ATT_TILE / ATT_WARPS)
#define ATT_KEY_LANES (32 / ATT_KEYS)
// Threads of the fresh row's RoPE and QK-norm: `rms_norm` runs a head with 128 threads, and the head
// norms' sums must run in its order.
#define ATT_FRESH 128

// A decode step's own row, fused in (`attend_rope_d<D>`): q arrives before RoPE, and K and V of the
// step's position `key` arrive as f32 rows (`k`, `v`: one row of n_kv_head heads) instead of from the
// cache. Every block rotates its own q head; the blocks of the tile holding `key` also rotate that K
// row (and round V) into shared memory and attend to it from there, and one block per KV head (the
// first q head of its group) stores it to cache row `d_row` (-1: not stored). The rotations are
// `rope_angle` and `rope_rotate`, so q, the cache and the scores have the bits of `rope_kv_store`
// followed by `attend_tiles`. No other block of the grid reads the stored row (it lies in this tile,
// whose blocks read it from shared memory), so the store needs no ordering within the launch.
//
// With QK-norm (Gemma 3, Qwen3) the kernel also applies the per-head RMS norms before RoPE: `norms`
// holds the q and k norm weights (copied to shared memory before the wait: model vectors, which no
// kernel writes), and each head's sum of squares runs in the order of `rms_norm` (ops.cu) over a
// head with ATT_FRESH threads (thread i: elements i, i + ATT_FRESH, ...; then `block_total`'s tree,
// the other warps adding zeros), so q and K have the bits of `rms_norm` followed by `rope_kv_store`.
struct FreshRow {
    const float* k;
    const float* v;
    u16* kc;
    u16* vc;
    int d_row;
    int n_rot, neox, key;
    // Thread i's pair angle (pair i < n_rot / 2), formed before the kernel's wait.
    float2 cs;
    // The q norm's weights then the k norm's (shared memory, 2 * head_dim), or null without QK-norm.
    const float* norms;
    float eps;
};

// Copies the head norms' weights (`qn`, `kn`: head_dim each, or null) to `norms` in shared memory.
template <int D>
__device__ __forceinline__ void load_head_norms(const float* __restrict__ qn, const float* __restrict__ kn,
                                                float* norms) {
    if (qn == nullptr) return;
    for (int i = threadIdx.x; i < D; i += ATT_THREADS) {
        norms[i] = qn[i];
        norms[D + i] = kn[i];
    }
}

// Where a block's query and keys are: the buffer's placement and tile span (`meta`) and the query's
// position. Both are parameters the host wrote before the launch (the graph's arena or a direct
// launch's upload), never another kernel's output, so the kernels read them before their wait: the
// cache rows' addresses are ready when the wait ends, and the K and V loads go out without another
// round trip first.
struct Placement {
    int origin_logical, origin_physical, tile_lo, n_tiles, p;
};

__device__ __forceinline__ Placement read_placement(const int* __restrict__ meta, const int* __restrict__ pos) {
    return Placement{meta[0], meta[1], meta[2], meta[3], pos[blockIdx.z]};
}

// Thread i's RoPE angle at position `key` (pair i; threads past the rotated pairs get none).
__device__ __forceinline__ float2 rope_pair_angle(int key, int n_rot, float base, float freq_scale) {
    return (int)threadIdx.x < n_rot / 2 ? rope_angle(key, threadIdx.x, n_rot, base, freq_scale) : make_float2(1.f, 0.f);
}

// The fused step's q head and fresh K/V row (FRESH): QK-norm when given, RoPE, rounded to f16; q into
// `qs`, K and V into `fresh_kv` (the tile holding the row) and the cache row (`store`). Threads below
// ATT_FRESH do the work, in the order described above FreshRow; all threads call it.
template <int D>
__device__ __forceinline__ void fresh_row(const float* __restrict__ qr, const FreshRow& fr, int kvh, bool fresh_tile,
                                          bool store, int kv_width, float* qs, u16* fresh_kv) {
    constexpr int head_dim = D;
    const float* kx = fr.k + kvh * head_dim;
    const float* vx = fr.v + kvh * head_dim;
    size_t d_row = store ? (size_t)fr.d_row : 0;
    u16* kd = fr.kc + d_row * kv_width + kvh * head_dim;
    u16* vd = fr.vc + d_row * kv_width + kvh * head_dim;
    // Thread i rotates pair i (at most D / 2 <= ATT_FRESH pairs) by the angle the kernel formed
    // before its wait, and passes dimensions n_rot + i + ATT_FRESH * j through. Every load is
    // issued before the first store (the cache rows written here could alias the rows read, as
    // far as the compiler knows), so the step's rows cost one round trip.
    constexpr int PASSES = (D + ATT_FRESH - 1) / ATT_FRESH;
    bool lead = threadIdx.x < ATT_FRESH;
    int half = fr.n_rot / 2, pp = threadIdx.x;
    bool rot = lead && pp < half;
    int a = fr.neox ? pp : 2 * pp, b = fr.neox ? pp + half : 2 * pp + 1;
    float q0 = rot ? qr[a] : 0.f, q1 = rot ? qr[b] : 0.f;
    float k0 = rot && fresh_tile ? kx[a] : 0.f, k1 = rot && fresh_tile ? kx[b] : 0.f;
    float qp[PASSES], kp[PASSES], vp[PASSES];
#pragma unroll
    for (int j = 0; j < PASSES; j++) {
        int d = fr.n_rot + threadIdx.x + j * ATT_FRESH, e = threadIdx.x + j * ATT_FRESH;
        qp[j] = lead && d < D ? qr[d] : 0.f;
        kp[j] = lead && d < D && fresh_tile ? kx[d] : 0.f;
        vp[j] = lead && e < D && fresh_tile ? vx[e] : 0.f;
    }
    if (fr.norms != nullptr) {
        // QK-norm: each head's sums of squares in `rms_norm`'s order, then x * scale * weight.
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int j = 0; j < PASSES; j++) {
            int e = threadIdx.x + j * ATT_FRESH;
            if (lead && e < D) {
                float x = qr[e], y = fresh_tile ? kx[e] : 0.f;
                sq = fmaf(x, x, sq);
                sk = fmaf(y, y, sk);
            }
        }
        float2 tot = block_total2(sq, sk);
        float qs_ = rsqrtf(tot.x / D + fr.eps), ks_ = rsqrtf(tot.y / D + fr.eps);
        const float *wq = fr.norms, *wk = fr.norms + D;
        // Only rotating threads hold a pair (a and b are past the head for the others).
        if (rot) {
            q0 = q0 * qs_ * wq[a], q1 = q1 * qs_ * wq[b];
            k0 = k0 * ks_ * wk[a], k1 = k1 * ks_ * wk[b];
        }
#pragma unroll
        for (int j = 0; j < PASSES; j++) {
            int d = fr.n_rot + threadIdx.x + j * ATT_FRESH;
            if (lead && d < D) {
                qp[j] = qp[j] * qs_ * wq[d];
                kp[j] = kp[j] * ks_ * wk[d];
            }
        }
    }
    if (rot) {
        float2 y = rope_rotate(q0, q1, fr.cs);
        qs[a] = h2f(f2h(y.x));
        qs[b] = h2f(f2h(y.y));
        if (fresh_tile) {
            float2 ky = rope_rotate(k0, k1, fr.cs);
            u16 ka = f2h(ky.x), kb = f2h(ky.y);
            fresh_kv[a] = ka;
            fresh_kv[b] = kb;
            if (store) {
                kd[a] = ka;
                kd[b] = kb;
            }
        }
    }
    if (!lead) return;
#pragma unroll
    for (int j = 0; j < PASSES; j++) {
        int d = fr.n_rot + threadIdx.x + j * ATT_FRESH, e = threadIdx.x + j * ATT_FRESH;
        if (d < D) {
            qs[d] = h2f(f2h(qp[j]));
            if (fresh_tile) {
                u16 kh = f2h(kp[j]);
                fresh_kv[d] = kh;
                if (store) kd[d] = kh;
            }
        }
        if (e < D && fresh_tile) {
            u16 vh = f2h(vp[j]);
            fresh_kv[D + e] = vh;
            if (store) vd[e] = vh;
        }
    }
}

// One tile's partial softmax over keys [lo, hi] for query qi and query heads h_first .. h_first +
// heads - 1 (of one KV head), in turn, into `out0 + h * head_stride` = m, l, acc[head_dim] for head h.
// The tile's K and V are loaded once, into registers, for all of them; each head's sums are those a
// block of its own forms.
template <int D, bool FRESH>
__device__ __forceinline__ void tile_partials(const float* __restrict__ q, const u16* __restrict__ kc,
                                              const u16* __restrict__ vc, int capacity, int kv_width, int n_head,
                                              int n_kv_head, float scale, int tile, int h_first, int heads, int qi,
                                              int lo, int hi,
                                              int origin_logical, int origin_physical, float* out0,
                                              size_t head_stride, const FreshRow& fr) {
    constexpr int head_dim = D;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int group_of_kv = n_head / n_kv_head, kvh = h_first / group_of_kv;
    // Queries are rounded to f16, as the CPU backend (and llama.cpp) does before the K product.
    __shared__ float4 qs4[D / 4];
    __shared__ float wm[ATT_WARPS], wl[ATT_WARPS];
    __shared__ float wacc[ATT_WARPS][D];
    float* qs = (float*)qs4;
    // Scores: lane part `part` of the warp's key `slot` takes pieces part, part + KL, ... of its row.
    constexpr int n8 = D / 8, KL = ATT_KEY_LANES, per_key = n8 / KL;
    static_assert(n8 % KL == 0, "a key's lanes share its row evenly");
    int slot = lane / KL, part = lane % KL;
    int key = tile * ATT_TILE + ATT_KEYS * w + slot;
    bool valid = key >= lo && key <= hi;
    int phys = valid ? (origin_physical + (key - origin_logical)) % capacity : 0;
    // Every K and V load is issued before q is staged: none of them depends on q, so their memory
    // latencies overlap instead of following one another.
    const uint4* kr = (const uint4*)(kc + (size_t)phys * kv_width + kvh * head_dim);
    uint4 kv[per_key];
    if (valid) {
#pragma unroll
        for (int i = 0; i < per_key; i++) kv[i] = kr[part + KL * i];
    }
    constexpr int n_chunks = n8, share = 32 / n_chunks, per_lane = ATT_KEYS / share;
    static_assert(per_lane >= 1, "every lane takes a key's chunk");
    int c = lane % n_chunks, first_key = lane / n_chunks;
    uint4 vv[per_lane];
#pragma unroll
    for (int j = 0; j < per_lane; j++) {
        int pk = __shfl_sync(0xffffffffu, phys, (first_key + share * j) * KL);
        vv[j] = ((const uint4*)(vc + (size_t)pk * kv_width + kvh * head_dim))[c];
    }
    // The step's own K and V row (FRESH, in the tile holding it), f16 as the cache holds it.
    __shared__ __align__(16) u16 fresh_kv[FRESH ? 2 * D : 8];
    bool fresh_tile = FRESH && tile == fr.key / ATT_TILE;
    int warp_key0 = tile * ATT_TILE + ATT_KEYS * w;
    // The fused decode kernel takes one head a block (a block per KV head measured no faster for one
    // query, docs/gpu-runs/2026-12-01-depth), so its loop and syncs fold away.
    const int n_heads = FRESH ? 1 : heads;
    for (int hh = 0; hh < n_heads; hh++) {
        int h = h_first + hh;
        const float* qr = q + ((size_t)qi * n_head + h) * head_dim;
        float* out = out0 + (size_t)h * head_stride;
        if constexpr (FRESH) {
            // The fresh K and V row with the block's first head (stored to the cache by the block of
            // the KV head's first query head); q alone with the others (its bits do not depend on
            // whether K is formed beside it).
            bool kv_here = fresh_tile && hh == 0;
            bool store = kv_here && h % group_of_kv == 0 && fr.d_row >= 0;
            fresh_row<D>(qr, fr, kvh, kv_here, store, kv_width, qs, fresh_kv);
        } else {
#pragma unroll
            for (int d = threadIdx.x; d < head_dim; d += ATT_THREADS) qs[d] = h2f(f2h(qr[d]));
        }
        __syncthreads();
        // The lanes holding the fresh key take its K (their pieces) and V (their chunk) from shared
        // memory; what they loaded from its cache row before is dropped unread.
        if constexpr (FRESH) {
            const uint4* fresh_k = (const uint4*)fresh_kv;
            const uint4* fresh_v = (const uint4*)(fresh_kv + D);
            if (hh == 0 && fresh_tile && key == fr.key) {
#pragma unroll
                for (int i = 0; i < per_key; i++) kv[i] = fresh_k[part + KL * i];
            }
#pragma unroll
            for (int j = 0; j < per_lane; j++)
                if (hh == 0 && fresh_tile && warp_key0 + first_key + share * j == fr.key) vv[j] = fresh_v[c];
        }
        float dot = 0.f;
        if (valid) {
#pragma unroll
            for (int i = 0; i < per_key; i++) {
                const u16* hv = (const u16*)&kv[i];
                int piece = part + KL * i;
                float4 qa = qs4[2 * piece], qb = qs4[2 * piece + 1];
                dot = fmaf(qa.x, h2f(hv[0]), dot);
                dot = fmaf(qa.y, h2f(hv[1]), dot);
                dot = fmaf(qa.z, h2f(hv[2]), dot);
                dot = fmaf(qa.w, h2f(hv[3]), dot);
                dot = fmaf(qb.x, h2f(hv[4]), dot);
                dot = fmaf(qb.y, h2f(hv[5]), dot);
                dot = fmaf(qb.z, h2f(hv[6]), dot);
                dot = fmaf(qb.w, h2f(hv[7]), dot);
            }
        }
        // A key's KL partial dots in a fixed butterfly: every lane of the key gets the same sum.
#pragma unroll
        for (int o = 1; o < KL; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        float s = valid ? dot * scale : -INFINITY;
        float m = warp_max(s);
        float e = valid ? expf(s - m) : 0.f;
        // Each key counted once: by its first lane.
        float l = warp_sum(part == 0 ? e : 0.f);
        // Keys out of range have e = 0 and read row 0 (always allocated) without a branch; a zero weight
        // leaves the sum as it was (select, not 0 * v).
        float acc[8];
#pragma unroll
        for (int d = 0; d < 8; d++) acc[d] = 0.f;
#pragma unroll
        for (int j = 0; j < per_lane; j++) {
            float ek = __shfl_sync(0xffffffffu, e, (first_key + share * j) * KL);
            const u16* hv = (const u16*)&vv[j];
#pragma unroll
            for (int d = 0; d < 8; d++) acc[d] = ek != 0.f ? fmaf(ek, h2f(hv[d]), acc[d]) : acc[d];
        }
#pragma unroll
        for (int o = n_chunks; o < 32; o <<= 1) {
#pragma unroll
            for (int d = 0; d < 8; d++) acc[d] += __shfl_xor_sync(0xffffffffu, acc[d], o);
        }
        if (lane == 0) {
            wm[w] = m;
            wl[w] = l;
        }
        if (first_key == 0) {
#pragma unroll
            for (int d = 0; d < 8; d++) wacc[w][8 * c + d] = acc[d];
        }
        __syncthreads();
        // Merge the warps in ascending order (warps with no key in range carry l = 0 and are skipped).
        float mm = -INFINITY;
#pragma unroll
        for (int k = 0; k < ATT_WARPS; k++)
            if (wl[k] > 0.f) mm = fmaxf(mm, wm[k]);
        float f[ATT_WARPS], ll = 0.f;
#pragma unroll
        for (int k = 0; k < ATT_WARPS; k++) {
            f[k] = wl[k] > 0.f ? expf(wm[k] - mm) : 0.f;
            ll += wl[k] * f[k];
        }
        if (threadIdx.x == 0) {
            out[0] = mm;
            out[1] = ll;
        }
#pragma unroll
        for (int d = threadIdx.x; d < head_dim; d += ATT_THREADS) {
            float v = 0.f;
#pragma unroll
            for (int k = 0; k < ATT_WARPS; k++) v += wacc[k][d] * f[k];
            out[2 + d] = v;
        }
        // The next head stages its q and writes its warps' sums in the same shared memory.
        if (hh + 1 < n_heads) __syncthreads();
    }
}

// The merge of one (query, head)'s tile partials (`partial`: its n_tiles records) in ascending tile
// order, by one warp: lane l takes dimensions l, l + 32, ... Partials written by other blocks of the
// grid are read with __ldcg, from L2, never from a stale L1 line. The loads of MERGE_AHEAD tiles go
// out together before their merges: a merge that loaded each tile after the one before took two L2
// round trips a tile, about 1 µs, which made a decode step at 4,096 keys (32 tiles) 30 µs a layer
// slower than at 128 (docs/gpu-runs/2026-12-01-depth). The merges themselves run in the same order,
// so the bits are those of one tile at a time. The head's output goes to `o`, and to `staged` (shared
// memory, for a Q8_K block) when given; `q8_blk0` >= 0 quantizes it as Q8 blocks q8_blk0, q8_blk0 + 1,
// ... of row `t` of `a` (n_t rows of `cols`).
template <int D>
__device__ __forceinline__ void merge_tiles(const float* partial, int n_tiles, float* o, int lane, float* staged,
                                            u8* a, int n_t, int t, int cols, int q8_blk0) {
    constexpr int head_dim = D, per = D / 32;
    // Tiles whose loads are in flight at once: about 48 registers of them at any head size.
    constexpr int MERGE_AHEAD = 32 / per < 4 ? 4 : (32 / per > 16 ? 16 : 32 / per);
    float m = -INFINITY, l = 0.f, acc[per];
#pragma unroll
    for (int j = 0; j < per; j++) acc[j] = 0.f;
    for (int k0 = 0; k0 < n_tiles; k0 += MERGE_AHEAD) {
        float pm[MERGE_AHEAD], pl[MERGE_AHEAD], pv[MERGE_AHEAD][per];
#pragma unroll
        for (int i = 0; i < MERGE_AHEAD; i++) {
            const float* p = partial + (size_t)(k0 + i) * (head_dim + 2);
            bool live = k0 + i < n_tiles;
            pl[i] = live ? __ldcg(p + 1) : 0.f;
            pm[i] = live ? __ldcg(p) : 0.f;
            // An empty tile's values were never written; they are loaded here and left unused.
#pragma unroll
            for (int j = 0; j < per; j++) pv[i][j] = live ? __ldcg(p + 2 + lane + 32 * j) : 0.f;
        }
#pragma unroll
        for (int i = 0; i < MERGE_AHEAD; i++) {
            if (pl[i] == 0.f) continue;
            float m_new = fmaxf(m, pm[i]);
            float e0 = expf(m - m_new), e1 = expf(pm[i] - m_new);
            l = l * e0 + pl[i] * e1;
#pragma unroll
            for (int j = 0; j < per; j++) acc[j] = acc[j] * e0 + pv[i][j] * e1;
            m = m_new;
        }
    }
#pragma unroll
    for (int j = 0; j < per; j++) {
        float v = acc[j] / l;
        o[lane + 32 * j] = v;
        if (staged) staged[lane + 32 * j] = v;
        if (q8_blk0 >= 0) q8_block(v, a, n_t, t, cols, q8_blk0 + j);
    }
}

// Merges the heads of group `g` (heads g * group ..) of query qi from their n_tiles partials into `dst`,
// and quantizes them as `quant` says (RN_Q8K: the group's heads are one Q8_K block, staged in
// `staged`; RN_Q8: Q8 blocks within each head). Warps take the heads; all threads call it.
template <int D>
__device__ __forceinline__ void merge_group(const float* partial, int tile_cap, int n_tiles, float* __restrict__ dst,
                                            int group, int quant, u8* __restrict__ a, int n_t, int qi, int n_head,
                                            int g, float* staged) {
    constexpr int head_dim = D;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int cols = n_head * head_dim, h0 = g * group;
    for (int k = w; k < group; k += ATT_WARPS) {
        int hh = h0 + k;
        merge_tiles<D>(partial + (size_t)(qi * n_head + hh) * tile_cap * (head_dim + 2), n_tiles,
                       dst + ((size_t)qi * n_head + hh) * head_dim, lane,
                       quant == RN_Q8K ? staged + k * head_dim : nullptr, a, n_t, qi, cols,
                       quant == RN_Q8 ? hh * head_dim / 32 : -1);
    }
    if (quant != RN_Q8K) return;
    __syncthreads();
    if (w == 0) q8k_block(staged, a, n_t, qi, cols, h0 * head_dim / 256);
}

// The kernel: a block per (tile, query head, query) writes the tile's partial of its head into
// `partial`, or, from `group_tiles` live tiles on, the block of each KV head's first query head
// writes those of all the KV head's query heads, from one load of the tile's K and V, and the other
// blocks exit. A chunk of many queries then loads each tile once per KV head instead of once per
// query head (deterministic pp512 at depth 4,096 on the 8B: 1,611 tok/s against 1,138); one decode
// query gained nothing from it (docs/gpu-runs/2026-12-01-depth), so the fused decode kernel never
// groups. Each head's partial is the same either way. The partials go into `partial` ([(q * n_head + h) * tile_cap + tile] * (head_dim + 2)), then counts
// them in, per (query, group of `group` consecutive heads), in `arrivals` (zero between launches): a
// group is complete after n_tiles * group heads, and the block completing it merges each of its heads
// into `dst` and quantizes them as `quant` says into `a` (n_t rows): RN_Q8K, one Q8_K block per group
// (`group` * head_dim = 256), or RN_Q8, Q8 blocks of 32 within each head, or 0. A block's heads may
// meet several groups, or part of one (12 heads over 4 KV heads in groups of 4). The kernels
// (`ATTEND_TILES` below) read their placement (`read_placement`), wait for the kernel before, then run
// this body for their head size.
template <int D, bool FRESH>
__device__ __forceinline__ void attend_tiles_body(const float* __restrict__ q, const u16* __restrict__ kc,
                                                  const u16* __restrict__ vc, int capacity, int kv_width,
                                                  const Placement& pl, int n_head, int n_kv_head, float scale,
                                                  int window, int tile_cap, float* partial,
                                                  int* __restrict__ arrivals, float* __restrict__ dst, int group,
                                                  int quant, u8* __restrict__ a, int n_t, int group_tiles,
                                                  const FreshRow& fr) {
    constexpr int head_dim = D;
    int origin_logical = pl.origin_logical, origin_physical = pl.origin_physical, n_tiles = pl.n_tiles;
    if ((int)blockIdx.x >= n_tiles) return;
    int group_of_kv = n_head / n_kv_head;
    bool by_kv_head = !FRESH && n_tiles >= group_tiles && group_of_kv > 1;
    if (by_kv_head && blockIdx.y % group_of_kv != 0) return;
    int tile = pl.tile_lo + blockIdx.x, h_first = blockIdx.y, qi = blockIdx.z;
    int heads = by_kv_head ? group_of_kv : 1;
    int p = pl.p;
    int first = window > 0 ? max(0, p + 1 - window) : 0;
    first = max(first, origin_logical);
    int lo = max(first, tile * ATT_TILE), hi = min(p, tile * ATT_TILE + ATT_TILE - 1);
    size_t head_stride = (size_t)tile_cap * (head_dim + 2);
    float* out0 = partial + ((size_t)qi * n_head * tile_cap + blockIdx.x) * (head_dim + 2);
    if (lo > hi) {
        if (threadIdx.x < heads) {
            out0[(h_first + threadIdx.x) * head_stride] = -INFINITY;
            out0[(h_first + threadIdx.x) * head_stride + 1] = 0.f;
        }
    } else {
        tile_partials<D, FRESH>(q, kc, vc, capacity, kv_width, n_head, n_kv_head, scale, tile, h_first, heads, qi,
                                lo, hi, origin_logical, origin_physical, out0, head_stride, fr);
    }
    // Publish the partials, then count this block's heads in, group by group; a group's last block
    // merges it.
    __threadfence();
    __syncthreads();
    __shared__ int merges;
    __shared__ __align__(16) float staged[256];
    if constexpr (FRESH) {
        // One head a block, so one group, counted and merged as a block of one head always was.
        if (threadIdx.x == 0) {
            int* count = arrivals + (size_t)qi * (n_head / group) + h_first / group;
            merges = atomicAdd(count, 1) == n_tiles * group - 1;
            if (merges) *count = 0;
        }
        __syncthreads();
        if (!merges) return;
        __threadfence();
        merge_group<D>(partial, tile_cap, n_tiles, dst, group, quant, a, n_t, qi, n_head, h_first / group, staged);
        return;
    }
    int g_last = (h_first + heads - 1) / group;
    for (int g = h_first / group; g <= g_last; g++) {
        if (threadIdx.x == 0) {
            int mine = min(h_first + heads, (g + 1) * group) - max(h_first, g * group);
            int* count = arrivals + (size_t)qi * (n_head / group) + g;
            merges = atomicAdd(count, mine) + mine == n_tiles * group;
            // Every head of this group has counted: the counter is ready for the next launch.
            if (merges) *count = 0;
        }
        __syncthreads();
        bool merging = merges;
        // `merges` is written again for the next group only after every thread has read it.
        __syncthreads();
        if (!merging) continue;
        __threadfence();
        merge_group<D>(partial, tile_cap, n_tiles, dst, group, quant, a, n_t, qi, n_head, g, staged);
        // `staged` is filled again for the next group only after the quantization has read it.
        __syncthreads();
    }
}

// ATTEND_TILES(D) defines two kernels for head size D: `attend_tiles_d<D>` over K and V already in
// the cache, and `attend_rope_d<D>` for a decode step of one row whose q, K and V come straight from
// the projections (`FreshRow`; one launch where `rope_kv_store` and `attend_tiles` took two). The
// step's position is a parameter the host wrote before the launch, not another kernel's output, so
// `attend_rope` reads it (with the placement and cache row, as `read_placement` says) and forms its
// angle (powf, cosf, sinf) before its wait: under a programmatic edge that runs while the kernel
// before still does (formed after the wait, the fused kernel took as long as the two it replaced,
// 9.15 µs a layer on the 8B Q8_0).
#define ATTEND_TILES(D, MIN_BLOCKS)                                                                     \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS, MIN_BLOCKS) attend_tiles_d##D(            \
        const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc, int capacity, \
        int kv_width, const int* __restrict__ pos, const int* __restrict__ meta, int n_head, int n_kv_head, \
        float scale, int window, int tile_cap, float* partial, int* __restrict__ arrivals,              \
        float* __restrict__ dst, int group, int quant, u8* __restrict__ a, int n_t, int group_tiles) {  \
        Placement pl = read_placement(meta, pos);                                                       \
        WAIT_PRIOR_GRID();                                                                              \
        FreshRow none{};                                                                                \
        attend_tiles_body<D, false>(q, kc, vc, capacity, kv_width, pl, n_head, n_kv_head, scale, window, \
                                    tile_cap, partial, arrivals, dst, group, quant, a, n_t, group_tiles, none); \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS) attend_rope_d##D(                         \
        const float* __restrict__ q, u16* kc, u16* vc, int capacity, int kv_width,                      \
        const int* __restrict__ pos, const int* __restrict__ meta, int n_head, int n_kv_head, float scale, \
        int window, int tile_cap, float* partial, int* __restrict__ arrivals, float* __restrict__ dst,  \
        int group, int quant, u8* __restrict__ a, const float* __restrict__ k,                          \
        const float* __restrict__ v, const int* __restrict__ cache_row, int n_rot, float base,          \
        float freq_scale, int neox, const float* __restrict__ qn, const float* __restrict__ kn, float eps, \
        int group_tiles) {                                                                              \
        Placement pl = read_placement(meta, pos);                                                       \
        int d_row = cache_row[0];                                                                       \
        float2 cs = rope_pair_angle(pl.p, n_rot, base, freq_scale);                                     \
        __shared__ float head_norms[2 * D];                                                             \
        load_head_norms<D>(qn, kn, head_norms);                                                         \
        WAIT_PRIOR_GRID();                                                                              \
        FreshRow fr{k, v, kc, vc, d_row, n_rot, neox, pl.p, cs, qn ? head_norms : nullptr, eps};        \
        attend_tiles_body<D, true>(q, kc, vc, capacity, kv_width, pl, n_head, n_kv_head, scale, window, \
                                   tile_cap, partial, arrivals, dst, group, quant, a, 1, group_tiles, fr); \
    }
// ATTEND_TILES(head size, blocks a multiprocessor for `attend_tiles_d<D>`): the sizes
// `routes::head_dim_supported` admits. Two blocks hold 128 registers a thread, which its heads loop
// (a block per KV head) would pass at head size 128 (152) without the bound; at 256 the kernel held
// more than 128 before the loop (158) and would spill under it, so it stays at one block.
ATTEND_TILES(32, 2)
ATTEND_TILES(64, 2)
ATTEND_TILES(128, 2)
ATTEND_TILES(256, 1)
