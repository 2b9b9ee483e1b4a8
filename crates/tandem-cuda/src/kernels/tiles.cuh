// One tile of keys' partial softmax for one query, and the in-order merge of a query's tiles: the
// sums every attention kernel of attention.cu forms (the chunk kernel a block a tile, the fused decode
// kernel several tiles a block), so a query's output has the same bits whichever forms it. See the top
// of attention.cu for the tiles and the merge.

#define ATT_TILE 128
#define MAX_HEAD_DIM 256

// partial layout: [(q * n_head + h) * tile_cap + tile] * (head_dim + 2): m, l, acc[head_dim].
// One block of ATT_THREADS threads per (tile, head, query) (or per KV head: `attend_tiles_body`; the
// fused decode kernel's blocks take tiles in turn, `decode_tiles`); warp w takes the tile's keys
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
// head, so a block's time is one warp's dependent chain per query head. With four warps of 32 keys,
// a lane ran a 128-term dot per key and the weighted sums of 16 keys, about 750 instructions issued
// every 9 cycles (Nsight Compute); here a lane's share of both is half. Sixteen warps of eight keys
// were slower in the graph (7.6 µs a layer against 7.0 on the H200; tg128 -1.2% where eight warps
// gained 0.8-1.7%).
#define ATT_THREADS 256
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_KEYS (ATT_TILE / ATT_WARPS)
#define ATT_KEY_LANES (32 / ATT_KEYS)
// The keys [lo, hi] of `tile` that a query at position p whose first key is `first` attends to
// (lo > hi: none).
__device__ __forceinline__ void tile_keys(int tile, int first, int p, int* lo, int* hi) {
    *lo = max(first, tile * ATT_TILE);
    *hi = min(p, tile * ATT_TILE + ATT_TILE - 1);
}

// A tile's lanes: lane `part` of the warp's key `slot` takes the key's 16-byte pieces part, part + KL,
// ... for the scores; for the weighted values lane l takes chunk c = l % C of the warp's keys
// first_key, first_key + P, ... (C = D / 8 chunks of 8 dimensions, P = 32 / C lanes a chunk).
template <int D>
struct TileLanes {
    static constexpr int n8 = D / 8, KL = ATT_KEY_LANES, per_key = n8 / KL;
    static constexpr int n_chunks = n8, share = 32 / n_chunks, per_lane = ATT_KEYS / share;
    static_assert(n8 % KL == 0, "a key's lanes share its row evenly");
    static_assert(per_lane >= 1, "every lane takes a key's chunk");
    int lane, w, slot, part, c, first_key;
    __device__ __forceinline__ TileLanes() {
        lane = threadIdx.x & 31;
        w = threadIdx.x >> 5;
        slot = lane / KL;
        part = lane % KL;
        c = lane % n_chunks;
        first_key = lane / n_chunks;
    }
};

// This lane's key of `tile` (in range [lo, hi] or not) and its physical cache row (row 0, always
// allocated, when out of range).
template <int D>
__device__ __forceinline__ int tile_key_row(const TileLanes<D>& tl, int tile, int lo, int hi, int origin_logical,
                                            int origin_physical, int capacity, bool* valid) {
    int key = tile * ATT_TILE + ATT_KEYS * tl.w + tl.slot;
    *valid = key >= lo && key <= hi;
    return *valid ? (origin_physical + (key - origin_logical)) % capacity : 0;
}

// Issues the loads of this lane's K pieces (`kv`) of its key at row `phys`.
template <int D>
__device__ __forceinline__ void load_tile_k(const TileLanes<D>& tl, const u16* __restrict__ kc, int phys, bool valid,
                                            int kv_width, int kvh, uint4 (&kv)[TileLanes<D>::per_key]) {
    const uint4* kr = (const uint4*)(kc + (size_t)phys * kv_width + kvh * D);
    if (valid) {
#pragma unroll
        for (int i = 0; i < TileLanes<D>::per_key; i++) kv[i] = kr[tl.part + TileLanes<D>::KL * i];
    }
}

// Issues the loads of this lane's V chunks (`vv`): the rows are the key lanes' `phys`.
template <int D>
__device__ __forceinline__ void load_tile_v(const TileLanes<D>& tl, const u16* __restrict__ vc, int phys, int kv_width,
                                            int kvh, uint4 (&vv)[TileLanes<D>::per_lane]) {
    using L = TileLanes<D>;
#pragma unroll
    for (int j = 0; j < L::per_lane; j++) {
        int pk = __shfl_sync(0xffffffffu, phys, (tl.first_key + L::share * j) * L::KL);
        vv[j] = ((const uint4*)(vc + (size_t)pk * kv_width + kvh * D))[tl.c];
    }
}

// The warp's scores over its keys of the tile for NH query heads at once (q, f16-rounded, in
// `qs4[hh]`), and their softmax within the warp: this lane's key weights `e`, the warp's max `m` and
// sum `l`, per head. Each head's sums are those of a block of its own: a key element is converted
// once and multiplied into every head's dot, each dot in the order of one head alone.
template <int D, int NH>
__device__ __forceinline__ void tile_scores(const TileLanes<D>& tl, const uint4 (&kv)[TileLanes<D>::per_key],
                                            const float4 (*qs4)[D / 4], bool valid, float scale, float (&e)[NH],
                                            float (&m)[NH], float (&l)[NH]) {
    using L = TileLanes<D>;
    float dot[NH];
#pragma unroll
    for (int hh = 0; hh < NH; hh++) dot[hh] = 0.f;
    if (valid) {
#pragma unroll
        for (int i = 0; i < L::per_key; i++) {
            const u16* hv = (const u16*)&kv[i];
            int piece = tl.part + L::KL * i;
            // The conversions are the same for every head: the compiler forms them once.
#pragma unroll
            for (int hh = 0; hh < NH; hh++) {
                float4 qa = qs4[hh][2 * piece], qb = qs4[hh][2 * piece + 1];
                dot[hh] = fmaf(qa.x, h2f(hv[0]), dot[hh]);
                dot[hh] = fmaf(qa.y, h2f(hv[1]), dot[hh]);
                dot[hh] = fmaf(qa.z, h2f(hv[2]), dot[hh]);
                dot[hh] = fmaf(qa.w, h2f(hv[3]), dot[hh]);
                dot[hh] = fmaf(qb.x, h2f(hv[4]), dot[hh]);
                dot[hh] = fmaf(qb.y, h2f(hv[5]), dot[hh]);
                dot[hh] = fmaf(qb.z, h2f(hv[6]), dot[hh]);
                dot[hh] = fmaf(qb.w, h2f(hv[7]), dot[hh]);
            }
        }
    }
#pragma unroll
    for (int hh = 0; hh < NH; hh++) {
        // A key's KL partial dots in a fixed butterfly: every lane of the key gets the same sum.
#pragma unroll
        for (int o = 1; o < L::KL; o <<= 1) dot[hh] += __shfl_xor_sync(0xffffffffu, dot[hh], o);
        float s = valid ? dot[hh] * scale : -INFINITY;
        m[hh] = warp_max(s);
        e[hh] = valid ? expf(s - m[hh]) : 0.f;
        // Each key counted once: by its first lane.
        l[hh] = warp_sum(tl.part == 0 ? e[hh] : 0.f);
    }
}

// The warp's weighted sums of its keys' V rows for NH heads: this lane's chunk (8 dimensions) per
// head, summed over the P lanes of the chunk in a fixed butterfly. A value is converted once for all
// heads. Keys out of range have e = 0 and read row 0 without a branch; a zero weight leaves the sum as
// it was (select, not 0 * v).
template <int D, int NH>
__device__ __forceinline__ void tile_values(const TileLanes<D>& tl, const uint4 (&vv)[TileLanes<D>::per_lane],
                                            const float (&e)[NH], float (&acc)[NH][8]) {
    using L = TileLanes<D>;
#pragma unroll
    for (int hh = 0; hh < NH; hh++) {
#pragma unroll
        for (int d = 0; d < 8; d++) acc[hh][d] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < L::per_lane; j++) {
        const u16* hv = (const u16*)&vv[j];
#pragma unroll
        for (int hh = 0; hh < NH; hh++) {
            float ek = __shfl_sync(0xffffffffu, e[hh], (tl.first_key + L::share * j) * L::KL);
#pragma unroll
            for (int d = 0; d < 8; d++) acc[hh][d] = ek != 0.f ? fmaf(ek, h2f(hv[d]), acc[hh][d]) : acc[hh][d];
        }
    }
#pragma unroll
    for (int hh = 0; hh < NH; hh++) {
#pragma unroll
        for (int o = L::n_chunks; o < 32; o <<= 1) {
#pragma unroll
            for (int d = 0; d < 8; d++) acc[hh][d] += __shfl_xor_sync(0xffffffffu, acc[hh][d], o);
        }
    }
}

// Shared memory for one tile's warps: their max, sum and weighted rows, per head.
template <int D>
struct TileWarps {
    float m[ATT_WARPS], l[ATT_WARPS];
    float acc[ATT_WARPS][D];
};

// Writes the warps' m, l and weighted rows of NH heads to `sw`, then (after a barrier) merges each
// head's warps in ascending order (warps with no key in range carry l = 0 and are skipped) into its
// record `out + hh * stride` = m, l, acc[D]. All threads call it; `sw` is read until the caller's next
// barrier.
template <int D, int NH>
__device__ __forceinline__ void tile_record(const TileLanes<D>& tl, const float (&m)[NH], const float (&l)[NH],
                                            const float (&acc)[NH][8], TileWarps<D> (&sw)[NH], float* out,
                                            size_t stride) {
#pragma unroll
    for (int hh = 0; hh < NH; hh++) {
        if (tl.lane == 0) {
            sw[hh].m[tl.w] = m[hh];
            sw[hh].l[tl.w] = l[hh];
        }
        if (tl.first_key == 0) {
#pragma unroll
            for (int d = 0; d < 8; d++) sw[hh].acc[tl.w][8 * tl.c + d] = acc[hh][d];
        }
    }
    __syncthreads();
    // Thread i takes element i, i + ATT_THREADS, ... of the NH records' D values each.
#pragma unroll
    for (int x = threadIdx.x; x < NH * D; x += ATT_THREADS) {
        int hh = x / D, d = x % D;
        const TileWarps<D>& t = sw[hh];
        float mm = -INFINITY;
#pragma unroll
        for (int k = 0; k < ATT_WARPS; k++)
            if (t.l[k] > 0.f) mm = fmaxf(mm, t.m[k]);
        float f[ATT_WARPS], ll = 0.f;
#pragma unroll
        for (int k = 0; k < ATT_WARPS; k++) {
            f[k] = t.l[k] > 0.f ? expf(t.m[k] - mm) : 0.f;
            ll += t.l[k] * f[k];
        }
        float* o = out + hh * stride;
        if (d == 0) {
            o[0] = mm;
            o[1] = ll;
        }
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < ATT_WARPS; k++) v += t.acc[k][d] * f[k];
        o[2 + d] = v;
    }
}

// The merge of one (query, head)'s tile partials (`partial`: its n_tiles records) in ascending tile
// order, for the head's dimensions 32 c .. 32 c + 31, by one warp: lane l takes dimension 32 c + l.
// Partials written by other blocks of the grid are read with __ldcg, from L2, never from a stale L1
// line. The loads of MERGE_AHEAD tiles go out together before their merges: a merge that loaded each
// tile after the one before took two L2 round trips a tile, about 1 µs, which made a decode step at
// 4,096 keys (32 tiles) 30 µs a layer slower than at 128. The merges themselves run in the same
// order, and every dimension's sums are those of one tile at a time, however the dimensions are
// shared among warps. The dimensions go to `o`, and to `staged` (shared memory,
// for a Q8_K block) when given; `q8_blk` >= 0 quantizes them as Q8 block `q8_blk` of row `t` of `a`
// (n_t rows of `cols`).
template <int D>
__device__ __forceinline__ void merge_tiles(const float* partial, int n_tiles, int c, float* o, int lane,
                                            float* staged, u8* a, int n_t, int t, int cols, int q8_blk) {
    constexpr int head_dim = D;
    // Tiles whose loads are in flight at once (48 registers of them).
    constexpr int MERGE_AHEAD = 16;
    int d = 32 * c + lane;
    float m = -INFINITY, l = 0.f, acc = 0.f;
    for (int k0 = 0; k0 < n_tiles; k0 += MERGE_AHEAD) {
        float pm[MERGE_AHEAD], pl[MERGE_AHEAD], pv[MERGE_AHEAD];
#pragma unroll
        for (int i = 0; i < MERGE_AHEAD; i++) {
            const float* p = partial + (size_t)(k0 + i) * (head_dim + 2);
            bool live = k0 + i < n_tiles;
            pl[i] = live ? __ldcg(p + 1) : 0.f;
            pm[i] = live ? __ldcg(p) : 0.f;
            // An empty tile's values were never written; they are loaded here and left unused.
            pv[i] = live ? __ldcg(p + 2 + d) : 0.f;
        }
#pragma unroll
        for (int i = 0; i < MERGE_AHEAD; i++) {
            if (pl[i] == 0.f) continue;
            float m_new = fmaxf(m, pm[i]);
            float e0 = expf(m - m_new), e1 = expf(pm[i] - m_new);
            // Written out as fused multiply-adds, in the form the compiler had chosen, so every
            // kernel that merges sums alike.
            l = fmaf(l, e0, __fmul_rn(pl[i], e1));
            acc = fmaf(acc, e0, __fmul_rn(pv[i], e1));
            m = m_new;
        }
    }
    float v = acc / l;
    o[d] = v;
    if (staged) staged[d] = v;
    if (q8_blk >= 0) q8_block(v, a, n_t, t, cols, q8_blk);
}

// Merges the heads of group `g` (heads g * group ..) of query qi from their n_tiles partials into `dst`,
// and quantizes them as `quant` says (RN_Q8K: the group's heads are one Q8_K block, staged in
// `staged`; RN_Q8: Q8 blocks within each head). Warps take the heads' 32-dimension chunks (so the
// group's tiles load in as few rounds as the warps allow); all threads call it.
template <int D>
__device__ __forceinline__ void merge_group(const float* partial, int tile_cap, int n_tiles, float* __restrict__ dst,
                                            int group, int quant, u8* __restrict__ a, int n_t, int qi, int n_head,
                                            int g, float* staged) {
    constexpr int head_dim = D, chunks = D / 32;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int cols = n_head * head_dim, h0 = g * group;
    for (int x = w; x < group * chunks; x += ATT_WARPS) {
        int k = x / chunks, c = x % chunks, hh = h0 + k;
        merge_tiles<D>(partial + (size_t)(qi * n_head + hh) * tile_cap * (head_dim + 2), n_tiles, c,
                       dst + ((size_t)qi * n_head + hh) * head_dim, lane,
                       quant == RN_Q8K ? staged + k * head_dim : nullptr, a, n_t, qi, cols,
                       quant == RN_Q8 ? hh * chunks + c : -1);
    }
    if (quant != RN_Q8K) return;
    __syncthreads();
    if (w == 0) q8k_block(staged, a, n_t, qi, cols, h0 * head_dim / 256);
}
