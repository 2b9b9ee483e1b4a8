// Attention over the f16 KV cache in one launch: a partial softmax per (key tile, head, query), and
// the last tile block of each (head, query) to finish merges the tiles in ascending order. Tiles are
// aligned to absolute positions (tile j holds positions [j*ATT_TILE, (j+1)*ATT_TILE)), so a query meets
// the same tiles, summed in the same order, whether it arrives alone (decode), in a chunk, or staged:
// results are identical across chunkings, and whichever block merges, the merge's order is the same.
// Long contexts spread over many blocks (one per tile, or for the fused decode step one wave of
// blocks each taking a share of the tiles in turn, `attend_decode`); tiles wholly outside a query's
// window or past its position are skipped without reading a key.
//
// Keys are found through the ring placement of the buffer they live in: logical position p sits at
// physical row (origin_physical + p - origin_logical) % capacity. The staged route passes its staging
// buffer with origin_logical = first staged position, origin_physical = 0.
//
// What changes from one decode step to the next (placement origins, the first tile and the number of
// tiles) is read from `meta` in device memory = {origin_logical, origin_physical, tile_lo, n_tiles},
// and the grid spans `tile_cap` tiles (blocks past n_tiles exit at once; the fused decode kernel's
// blocks divide the live tiles among them), so a captured CUDA graph replays every step with new
// `meta` contents.
//
// The tile constants, one tile's sums and the merge are in tiles.cuh, compiled ahead of this file.

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

// The query's first key: the window's first position, or the buffer's first, whichever is later.
__device__ __forceinline__ int first_key(const Placement& pl, int window) {
    int first = window > 0 ? max(0, pl.p + 1 - window) : 0;
    return max(first, pl.origin_logical);
}

// Thread i's RoPE angle at position `key` (pair i; threads past the rotated pairs get none).
__device__ __forceinline__ float2 rope_pair_angle(int key, int n_rot, float base, float freq_scale) {
    return (int)threadIdx.x < n_rot / 2 ? rope_angle(key, threadIdx.x, n_rot, base, freq_scale) : make_float2(1.f, 0.f);
}

// The fused step's NH consecutive q heads (from `qr`, into `qs`: NH heads of D) and its fresh K/V row
// (FRESH): QK-norm when given, RoPE, rounded to f16; K and V into `fresh_kv` (the tile holding the
// row) and the cache row (`store`). Threads below ATT_FRESH do the work, in the order described above
// FreshRow, each head as alone; all threads call it. Every load (all heads) is issued before the
// first store, so the step's rows cost one round trip.
template <int D, int NH>
__device__ __forceinline__ void fresh_rows(const float* __restrict__ qr, const FreshRow& fr, int kvh, bool fresh_tile,
                                           bool store, int kv_width, float* qs, u16* fresh_kv) {
    const float* kx = fr.k + kvh * D;
    const float* vx = fr.v + kvh * D;
    size_t d_row = store ? (size_t)fr.d_row : 0;
    u16* kd = fr.kc + d_row * kv_width + kvh * D;
    u16* vd = fr.vc + d_row * kv_width + kvh * D;
    // Thread i rotates pair i (at most D / 2 <= ATT_FRESH pairs) by the angle the kernel formed
    // before its wait, and passes dimensions n_rot + i + ATT_FRESH * j through.
    constexpr int PASSES = (D + ATT_FRESH - 1) / ATT_FRESH;
    bool lead = threadIdx.x < ATT_FRESH;
    int half = fr.n_rot / 2, pp = threadIdx.x;
    bool rot = lead && pp < half;
    int a = fr.neox ? pp : 2 * pp, b = fr.neox ? pp + half : 2 * pp + 1;
    float q0[NH], q1[NH], qp[NH][PASSES], kp[PASSES], vp[PASSES];
#pragma unroll
    for (int hh = 0; hh < NH; hh++) {
        q0[hh] = rot ? qr[hh * D + a] : 0.f;
        q1[hh] = rot ? qr[hh * D + b] : 0.f;
    }
    float k0 = rot && fresh_tile ? kx[a] : 0.f, k1 = rot && fresh_tile ? kx[b] : 0.f;
#pragma unroll
    for (int j = 0; j < PASSES; j++) {
        int d = fr.n_rot + threadIdx.x + j * ATT_FRESH, e = threadIdx.x + j * ATT_FRESH;
#pragma unroll
        for (int hh = 0; hh < NH; hh++) qp[hh][j] = lead && d < D ? qr[hh * D + d] : 0.f;
        kp[j] = lead && d < D && fresh_tile ? kx[d] : 0.f;
        vp[j] = lead && e < D && fresh_tile ? vx[e] : 0.f;
    }
    if (fr.norms != nullptr) {
        // QK-norm: each head's sums of squares in `rms_norm`'s order, then x * scale * weight.
        float sums[NH + 1];
#pragma unroll
        for (int i = 0; i <= NH; i++) sums[i] = 0.f;
#pragma unroll
        for (int j = 0; j < PASSES; j++) {
            int e = threadIdx.x + j * ATT_FRESH;
            if (lead && e < D) {
#pragma unroll
                for (int hh = 0; hh < NH; hh++) {
                    float x = qr[hh * D + e];
                    sums[hh] = fmaf(x, x, sums[hh]);
                }
                float y = fresh_tile ? kx[e] : 0.f;
                sums[NH] = fmaf(y, y, sums[NH]);
            }
        }
        block_totals<NH + 1>(sums);
        const float *wq = fr.norms, *wk = fr.norms + D;
        float ks_ = rsqrtf(sums[NH] / D + fr.eps);
#pragma unroll
        for (int hh = 0; hh < NH; hh++) {
            float qs_ = rsqrtf(sums[hh] / D + fr.eps);
            // Only rotating threads hold a pair (a and b are past the head for the others).
            if (rot) q0[hh] = q0[hh] * qs_ * wq[a], q1[hh] = q1[hh] * qs_ * wq[b];
#pragma unroll
            for (int j = 0; j < PASSES; j++) {
                int d = fr.n_rot + threadIdx.x + j * ATT_FRESH;
                if (lead && d < D) qp[hh][j] = qp[hh][j] * qs_ * wq[d];
            }
        }
        if (rot) k0 = k0 * ks_ * wk[a], k1 = k1 * ks_ * wk[b];
#pragma unroll
        for (int j = 0; j < PASSES; j++) {
            int d = fr.n_rot + threadIdx.x + j * ATT_FRESH;
            if (lead && d < D) kp[j] = kp[j] * ks_ * wk[d];
        }
    }
    if (rot) {
#pragma unroll
        for (int hh = 0; hh < NH; hh++) {
            float2 y = rope_rotate(q0[hh], q1[hh], fr.cs);
            qs[hh * D + a] = h2f(f2h(y.x));
            qs[hh * D + b] = h2f(f2h(y.y));
        }
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
#pragma unroll
            for (int hh = 0; hh < NH; hh++) qs[hh * D + d] = h2f(f2h(qp[hh][j]));
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
template <int D>
__device__ __forceinline__ void tile_partials(const float* __restrict__ q, const u16* __restrict__ kc,
                                              const u16* __restrict__ vc, int capacity, int kv_width, int n_head,
                                              int n_kv_head, float scale, int tile, int h_first, int heads, int qi,
                                              int lo, int hi, int origin_logical, int origin_physical, float* out0,
                                              size_t head_stride) {
    using L = TileLanes<D>;
    TileLanes<D> tl;
    int kvh = h_first / (n_head / n_kv_head);
    // Queries are rounded to f16, as the CPU backend (and llama.cpp) does before the K product.
    __shared__ float4 qs4[1][D / 4];
    __shared__ TileWarps<D> sw[1];
    float* qs = (float*)qs4;
    bool valid;
    int phys = tile_key_row<D>(tl, tile, lo, hi, origin_logical, origin_physical, capacity, &valid);
    // Every K and V load is issued before q is staged: none of them depends on q, so their memory
    // latencies overlap instead of following one another.
    uint4 kv[L::per_key], vv[L::per_lane];
    load_tile_k<D>(tl, kc, phys, valid, kv_width, kvh, kv);
    load_tile_v<D>(tl, vc, phys, kv_width, kvh, vv);
    for (int hh = 0; hh < heads; hh++) {
        int h = h_first + hh;
        const float* qr = q + ((size_t)qi * n_head + h) * D;
#pragma unroll
        for (int d = threadIdx.x; d < D; d += ATT_THREADS) qs[d] = h2f(f2h(qr[d]));
        __syncthreads();
        float e[1], m[1], l[1], acc[1][8];
        tile_scores<D, 1>(tl, kv, qs4, valid, scale, e, m, l);
        tile_values<D, 1>(tl, vv, e, acc);
        tile_record<D, 1>(tl, m, l, acc, sw, out0 + (size_t)h * head_stride, 0);
        // The next head stages its q and writes its warps' sums in the same shared memory.
        if (hh + 1 < heads) __syncthreads();
    }
}

// A fused decode block's part of the grid (`attend_decode`): its first query head h0 and `heads` heads
// (1, or NH once the live tiles outnumber the blocks a head), and its share of the live tiles,
// j0 .. j1 - 1 (share s of S: n / S tiles, one more below n % S; with S at least n, tile s, as a block
// per tile did, and block 0 always has one, so the timeline records its wait). Formed from the grid
// and the placement alone, before the kernel's wait.
struct DecodeShare {
    int heads, h0, j0, j1;
};

template <int NH>
__device__ __forceinline__ DecodeShare decode_share(const Placement& pl) {
    int x = blockIdx.x, y = blockIdx.y, shares = gridDim.x;
    DecodeShare sh{1, y, 0, 0};
    int s = x, splits = shares;
    if (NH > 1 && pl.n_tiles > shares) {
        sh = DecodeShare{NH, y / NH * NH, 0, 0};
        s = x * NH + y % NH;
        splits = shares * NH;
    }
    int per = pl.n_tiles / splits, rem = pl.n_tiles % splits;
    sh.j0 = s * per + min(s, rem);
    sh.j1 = sh.j0 + per + (s < rem ? 1 : 0);
    return sh;
}

// A block's first tile: this lane's key range, cache row and K and V loads (`decode_tiles` sums it).
template <int D>
struct FirstTile {
    TileLanes<D> tl;
    int lo, hi, phys;
    bool valid;
    uint4 kv[TileLanes<D>::per_key], vv[TileLanes<D>::per_lane];
};

// Issues the loads of the block's first tile before the kernel's wait, so they overlap the kernel
// before (tg128 on the 8B: +1.4% at 4,096 keys, +2.9% at 7,168; bench/records/2026-12-01-early/f1).
// Its rows are those of earlier steps, written by this layer's fused kernel in an earlier graph
// replay or by a direct launch, all finished before this step's graph began; the kernel before in
// the step (the q, K, V projections) writes none of them. The step's own row, which this kernel
// stores, is taken from shared memory instead of from these loads (`decode_tiles`).
template <int D>
__device__ __forceinline__ void load_first_tile(FirstTile<D>& ft, const DecodeShare& sh, const Placement& pl,
                                                int window, const u16* __restrict__ kc, const u16* __restrict__ vc,
                                                int capacity, int kv_width, int n_head, int n_kv_head) {
    if (sh.j0 >= sh.j1) return;
    int kvh = sh.h0 / (n_head / n_kv_head), tile = pl.tile_lo + sh.j0;
    tile_keys(tile, first_key(pl, window), pl.p, &ft.lo, &ft.hi);
    ft.phys = tile_key_row<D>(ft.tl, tile, ft.lo, ft.hi, pl.origin_logical, pl.origin_physical, capacity, &ft.valid);
    load_tile_k<D>(ft.tl, kc, ft.phys, ft.valid, kv_width, kvh, ft.kv);
    load_tile_v<D>(ft.tl, vc, ft.phys, kv_width, kvh, ft.vv);
}

// A decode step's tiles j0 .. j1 - 1 (of the span starting at `tile_lo`) for query heads h0 .. h0 +
// NH - 1 (of one KV head), one tile after another in one block (`attend_decode_body`): q is rotated
// and staged once, each tile's K and V are loaded once for the NH heads and each element converted
// once, and the next tile's loads go out while the tile before is still being summed (K's once its
// scores are done, V's once its weighted sums are), so a block's memory latency overlaps its
// arithmetic; the first tile's went out before the kernel's wait (`load_first_tile`). Each head's
// record of a tile is the one a block of its own (`tile_partials` for one head) writes: the same lanes,
// sums and order. The tile holding the step's key takes that key's K and V from shared memory
// (`FreshRow`).
template <int D, int NH>
__device__ __forceinline__ void decode_tiles(const float* __restrict__ q, const u16* __restrict__ kc,
                                             const u16* __restrict__ vc, int capacity, int kv_width, int n_head,
                                             int n_kv_head, float scale, int h0, int tile_lo, int j0, int j1,
                                             int first, int p, int origin_logical, int origin_physical,
                                             float* out0, size_t head_stride, const FreshRow& fr,
                                             FirstTile<D>& ft) {
    using L = TileLanes<D>;
    const TileLanes<D>& tl = ft.tl;
    int group_of_kv = n_head / n_kv_head, kvh = h0 / group_of_kv;
    __shared__ float4 qs4[NH][D / 4];
    // Two sets, used by turns: a tile's warps write theirs while the slowest warp may still read the
    // set of the record before (each record has a barrier, so one lies between two uses of a set).
    __shared__ TileWarps<D> sw[2][NH];
    __shared__ __align__(16) u16 fresh_kv[2 * D];
    int records = 0;
    int fresh_tile = fr.key / ATT_TILE;
    bool kv_here = fresh_tile >= tile_lo + j0 && fresh_tile < tile_lo + j1;
    int lo = ft.lo, hi = ft.hi, phys = ft.phys;
    bool valid = ft.valid;
    uint4(&kv)[L::per_key] = ft.kv;
    uint4(&vv)[L::per_lane] = ft.vv;
    // The fresh K and V row in the block whose tiles hold it (stored to the cache by the block of the
    // KV head's first query head); q alone elsewhere (its bits do not depend on whether K is formed
    // beside it).
    bool store = kv_here && h0 % group_of_kv == 0 && fr.d_row >= 0;
    fresh_rows<D, NH>(q + (size_t)h0 * D, fr, kvh, kv_here, store, kv_width, (float*)qs4, fresh_kv);
    __syncthreads();
    for (int j = j0; j < j1; j++) {
        int tile = tile_lo + j;
        float* out = out0 + (size_t)j * (D + 2);
        int lo_n = 0, hi_n = -1, phys_n = 0;
        bool valid_n = false, more = j + 1 < j1;
        if (more) {
            tile_keys(tile + 1, first, p, &lo_n, &hi_n);
            phys_n = tile_key_row<D>(tl, tile + 1, lo_n, hi_n, origin_logical, origin_physical, capacity, &valid_n);
        }
        if (lo > hi) {
            // A tile wholly outside the query's keys: empty records (the merge skips l = 0).
            if (threadIdx.x < NH) {
                out[threadIdx.x * head_stride] = -INFINITY;
                out[threadIdx.x * head_stride + 1] = 0.f;
            }
            if (more) {
                load_tile_k<D>(tl, kc, phys_n, valid_n, kv_width, kvh, kv);
                load_tile_v<D>(tl, vc, phys_n, kv_width, kvh, vv);
            }
        } else {
            if (tile == fresh_tile) {
                // The lanes holding the fresh key take its K (their pieces) and V (their chunk) from
                // shared memory; what they loaded from its cache row before is dropped unread.
                const uint4* fresh_k = (const uint4*)fresh_kv;
                const uint4* fresh_v = (const uint4*)(fresh_kv + D);
                int key = tile * ATT_TILE + ATT_KEYS * tl.w + tl.slot;
                if (key == fr.key) {
#pragma unroll
                    for (int i = 0; i < L::per_key; i++) kv[i] = fresh_k[tl.part + L::KL * i];
                }
                int warp_key0 = tile * ATT_TILE + ATT_KEYS * tl.w;
#pragma unroll
                for (int i = 0; i < L::per_lane; i++)
                    if (warp_key0 + tl.first_key + L::share * i == fr.key) vv[i] = fresh_v[tl.c];
            }
            float e[NH], m[NH], l[NH], acc[NH][8];
            tile_scores<D, NH>(tl, kv, qs4, valid, scale, e, m, l);
            if (more) load_tile_k<D>(tl, kc, phys_n, valid_n, kv_width, kvh, kv);
            tile_values<D, NH>(tl, vv, e, acc);
            if (more) load_tile_v<D>(tl, vc, phys_n, kv_width, kvh, vv);
            tile_record<D, NH>(tl, m, l, acc, sw[records++ & 1], out, head_stride);
        }
        lo = lo_n, hi = hi_n, phys = phys_n, valid = valid_n;
    }
}

// The kernel: a block per (tile, query head, query) writes the tile's partial of its head into
// `partial`, or, from `group_tiles` live tiles on, the block of each KV head's first query head
// writes those of all the KV head's query heads, from one load of the tile's K and V, and the other
// blocks exit. A chunk of many queries then loads each tile once per KV head instead of once per
// query head (deterministic pp512 at depth 4,096 on the 8B: 1,611 tok/s against 1,138); one decode
// query gained nothing from it, so the fused decode kernel never groups. Each head's partial is the
// same either way. The partials go into `partial` ([(q * n_head + h) * tile_cap + tile] *
// (head_dim + 2)), then counts them in, per (query, group of `group` consecutive heads), in
// `arrivals` (zero between launches): a group is complete after n_tiles * group heads, and the
// block completing it merges each of its heads into `dst` and quantizes them as `quant` says into
// `a` (n_t rows): RN_Q8K, one Q8_K block per group (`group` * head_dim = 256), or RN_Q8, Q8 blocks
// of 32 within each head, or 0. A block's heads may meet several groups, or part of one (12 heads
// over 4 KV heads in groups of 4). The kernels (`ATTEND_TILES` below) read their placement
// (`read_placement`), wait for the kernel before, then run this body for their head size.
template <int D>
__device__ __forceinline__ void attend_tiles_body(const float* __restrict__ q, const u16* __restrict__ kc,
                                                  const u16* __restrict__ vc, int capacity, int kv_width,
                                                  const Placement& pl, int n_head, int n_kv_head, float scale,
                                                  int window, int tile_cap, float* partial,
                                                  int* __restrict__ arrivals, float* __restrict__ dst, int group,
                                                  int quant, u8* __restrict__ a, int n_t, int group_tiles) {
    constexpr int head_dim = D;
    int origin_logical = pl.origin_logical, origin_physical = pl.origin_physical, n_tiles = pl.n_tiles;
    if ((int)blockIdx.x >= n_tiles) return;
    int group_of_kv = n_head / n_kv_head;
    bool by_kv_head = n_tiles >= group_tiles && group_of_kv > 1;
    if (by_kv_head && blockIdx.y % group_of_kv != 0) return;
    int tile = pl.tile_lo + blockIdx.x, h_first = blockIdx.y, qi = blockIdx.z;
    int heads = by_kv_head ? group_of_kv : 1;
    int lo, hi;
    tile_keys(tile, first_key(pl, window), pl.p, &lo, &hi);
    size_t head_stride = (size_t)tile_cap * (head_dim + 2);
    float* out0 = partial + ((size_t)qi * n_head * tile_cap + blockIdx.x) * (head_dim + 2);
    if (lo > hi) {
        if (threadIdx.x < heads) {
            out0[(h_first + threadIdx.x) * head_stride] = -INFINITY;
            out0[(h_first + threadIdx.x) * head_stride + 1] = 0.f;
        }
    } else {
        tile_partials<D>(q, kc, vc, capacity, kv_width, n_head, n_kv_head, scale, tile, h_first, heads, qi, lo, hi,
                         origin_logical, origin_physical, out0, head_stride);
    }
    // Publish the partials, then count this block's heads in, group by group; a group's last block
    // merges it. The barrier orders every thread's writes before thread 0's fence, which releases them
    // with the counts (one fence a block, as in `attend_decode_body`, where each thread fenced its own
    // writes; its fence after a completing count acquires the other blocks' partials before the barrier
    // that lets the block merge).
    __syncthreads();
    if (threadIdx.x == 0) __threadfence();
    __shared__ int merges;
    __shared__ __align__(16) float staged[256];
    int g_last = (h_first + heads - 1) / group;
    for (int g = h_first / group; g <= g_last; g++) {
        if (threadIdx.x == 0) {
            int mine = min(h_first + heads, (g + 1) * group) - max(h_first, g * group);
            int* count = arrivals + (size_t)qi * (n_head / group) + g;
            merges = atomicAdd(count, mine) + mine == n_tiles * group;
            // Every head of this group has counted: the counter is ready for the next launch.
            if (merges) {
                *count = 0;
                __threadfence();
            }
        }
        __syncthreads();
        bool merging = merges;
        // `merges` is written again for the next group only after every thread has read it.
        __syncthreads();
        if (!merging) continue;
        merge_group<D>(partial, tile_cap, n_tiles, dst, group, quant, a, n_t, qi, n_head, g, staged);
        // `staged` is filled again for the next group only after the quantization has read it.
        __syncthreads();
    }
}

// The fused decode kernel's body for one block: query heads h0 .. h0 + NH - 1 (of one KV head) over
// share s of `splits` of the live tiles (`decode_tiles`), so a deep context runs in one wave of blocks
// that each stream several tiles, where a block per tile and head took several waves of short blocks,
// each paying its setup, q's rotation, its publication and its arrival (a 4,096-key step of the 8B:
// 1,088 blocks, 4.1 waves, 32 µs a layer). With `splits` at least the live tiles and NH = 1 it is
// a block per tile and head, as before. The records are those of a block per tile and head, so the
// merge (the group's last block to count its tiles in) and the output are too.
template <int D, int NH>
__device__ __forceinline__ void attend_decode_body(const float* __restrict__ q, const u16* __restrict__ kc,
                                                   const u16* __restrict__ vc, int capacity, int kv_width,
                                                   const Placement& pl, int n_head, int n_kv_head, float scale,
                                                   int window, int tile_cap, float* partial,
                                                   int* __restrict__ arrivals, float* __restrict__ dst, int group,
                                                   int quant, u8* __restrict__ a, const FreshRow& fr,
                                                   const DecodeShare& sh, FirstTile<D>& ft, int qi, int n_t) {
    int n_tiles = pl.n_tiles, h0 = sh.h0, j0 = sh.j0, j1 = sh.j1;
    if (j0 >= j1) return;
    size_t head_stride = (size_t)tile_cap * (D + 2);
    decode_tiles<D, NH>(q + (size_t)qi * n_head * D, kc, vc, capacity, kv_width, n_head, n_kv_head, scale, h0,
                        pl.tile_lo, j0, j1, first_key(pl, window), pl.p, pl.origin_logical, pl.origin_physical,
                        partial + ((size_t)qi * n_head + h0) * head_stride, head_stride, fr, ft);
    // Publish the records and count them in, per merge group the heads meet: the barrier orders every
    // thread's writes before thread 0's fence, which releases them with the counts (and, for a block
    // that completes a group, acquires the other blocks' records before the barrier that lets its
    // threads merge).
    __shared__ int merges;
    __shared__ __align__(16) float staged[256];
    int g_first = h0 / group, g_last = (h0 + NH - 1) / group;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        int done = 0;
        for (int g = g_first; g <= g_last; g++) {
            int mine = (min(h0 + NH, (g + 1) * group) - max(h0, g * group)) * (j1 - j0);
            int* count = arrivals + (size_t)qi * (n_head / group) + g;
            if (atomicAdd(count, mine) + mine == n_tiles * group) {
                // Every head of this group has counted: the counter is ready for the next launch.
                *count = 0;
                done |= 1 << (g - g_first);
            }
        }
        if (done) __threadfence();
        merges = done;
    }
    __syncthreads();
    int done = merges;
    for (int g = g_first; g <= g_last; g++) {
        if (!(done >> (g - g_first) & 1)) continue;
        merge_group<D>(partial, tile_cap, n_tiles, dst, group, quant, a, n_t, qi, n_head, g, staged);
        // `staged` is filled again for the next group only after the quantization has read it.
        __syncthreads();
    }
}

// The fused decode kernel's grid is S x n_head: a block per query head and share of the live tiles
// (`attend_decode_body`, one head). With NH > 1, once the tiles outnumber the shares (a block of one
// head would take several in turn), the same blocks take NH heads of a KV head each over NH times as
// many shares: block (x, y) heads y / NH * NH .., share x * NH + y % NH. Each tile's K and V are then
// loaded and converted once for NH heads (tg128 at 4,096 keys on the 8B: 427 tok/s with two heads a
// block against 413 with one), while a short context keeps a block a head (two heads a block from the
// first tile: 524 against 532 at depth 0). The records are the same either way.
template <int D, int NH>
__device__ __forceinline__ void attend_decode(const float* __restrict__ q, const u16* __restrict__ kc,
                                              const u16* __restrict__ vc, int capacity, int kv_width,
                                              const Placement& pl, int n_head, int n_kv_head, float scale, int window,
                                              int tile_cap, float* partial, int* __restrict__ arrivals,
                                              float* __restrict__ dst, int group, int quant, u8* __restrict__ a,
                                              const FreshRow& fr, const DecodeShare& sh, FirstTile<D>& ft, int qi,
                                              int n_t) {
    if constexpr (NH > 1) {
        if (sh.heads == NH) {
            attend_decode_body<D, NH>(q, kc, vc, capacity, kv_width, pl, n_head, n_kv_head, scale, window, tile_cap,
                                      partial, arrivals, dst, group, quant, a, fr, sh, ft, qi, n_t);
            return;
        }
    }
    attend_decode_body<D, 1>(q, kc, vc, capacity, kv_width, pl, n_head, n_kv_head, scale, window, tile_cap, partial,
                             arrivals, dst, group, quant, a, fr, sh, ft, qi, n_t);
}

// ATTEND_TILES(D) defines two kernels for head size D: `attend_tiles_d<D>` over K and V already in
// the cache, and `attend_rope_d<D>` for a decode step of one row whose q, K and V come straight from
// the projections (`FreshRow`; one launch where `rope_kv_store` and `attend_tiles` took two), one
// query head a block. ATTEND_ROPE_HEADS(D, NH) defines `attend_rope_h<NH>_d<D>`, the same taking NH
// query heads of a KV head a block in a deep context (`attend_decode`). The step's position is a parameter the host wrote before the
// launch, not another kernel's output, so the fused kernels read it (with the placement and cache
// row, as `read_placement` says) and form its angle (powf, cosf, sinf) before their wait: under a
// programmatic edge that runs while the kernel before still does (formed after the wait, the fused
// kernel took as long as the two it replaced, 9.15 µs a layer on the 8B Q8_0).
#define ATTEND_ROPE(NAME, D, NH, MIN_BLOCKS)                                                            \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS, MIN_BLOCKS) NAME(                         \
        const float* __restrict__ q, u16* kc, u16* vc, int capacity, int kv_width,                      \
        const int* __restrict__ pos, const int* __restrict__ meta, int n_head, int n_kv_head, float scale, \
        int window, int tile_cap, float* partial, int* __restrict__ arrivals, float* __restrict__ dst,  \
        int group, int quant, u8* __restrict__ a, const float* __restrict__ k,                          \
        const float* __restrict__ v, const int* __restrict__ cache_row, int n_rot, float base,          \
        float freq_scale, int neox, const float* __restrict__ qn, const float* __restrict__ kn, float eps) { \
        Placement pl = read_placement(meta, pos);                                                       \
        int d_row = cache_row[0];                                                                       \
        float2 cs = rope_pair_angle(pl.p, n_rot, base, freq_scale);                                     \
        __shared__ float head_norms[2 * D];                                                             \
        load_head_norms<D>(qn, kn, head_norms);                                                         \
        DecodeShare sh = decode_share<NH>(pl);                                                          \
        FirstTile<D> ft;                                                                                \
        load_first_tile<D>(ft, sh, pl, window, kc, vc, capacity, kv_width, n_head, n_kv_head);          \
        WAIT_PRIOR_GRID();                                                                              \
        FreshRow fr{k, v, kc, vc, d_row, n_rot, neox, pl.p, cs, qn ? head_norms : nullptr, eps};        \
        attend_decode<D, NH>(q, kc, vc, capacity, kv_width, pl, n_head, n_kv_head, scale, window, tile_cap, \
                             partial, arrivals, dst, group, quant, a, fr, sh, ft, 0, 1);                \
    }
// ATTEND_ROPE_ROWS defines the fused decode kernel for a batch of decode steps, one row of each of
// n_t sequences (the serving engine's decode step): grid S x n_head x n_t, block (x, y, r) runs row
// r's step as the one-row kernel runs a lone one. Row r's sequence lists its layers' K and V buffers
// (K then V, layer by layer) at seqs[r], and `rows` holds ROW_INTS ints a row: the buffer's capacity,
// its placement (`meta`'s four), the position and the cache row. Both are written by the host before
// the launch, so they are read before the wait. Row r's q, K, V, records, counters, output and
// quantized output are row r's of the launch's buffers, so each row has the bits of its own launch.
#define ROW_INTS 8
#define ATTEND_ROPE_ROWS(NAME, D, NH, MIN_BLOCKS)                                                       \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS, MIN_BLOCKS) NAME(                         \
        const float* __restrict__ q, u16* const* const* __restrict__ seqs, int layer,                   \
        const int* __restrict__ rows, int kv_width, int n_head, int n_kv_head, float scale, int window, \
        int tile_cap, float* partial, int* __restrict__ arrivals, float* __restrict__ dst, int group,   \
        int quant, u8* __restrict__ a, const float* __restrict__ k, const float* __restrict__ v,        \
        int n_rot, float base, float freq_scale, int neox, const float* __restrict__ qn,                \
        const float* __restrict__ kn, float eps, int n_t) {                                             \
        int r = blockIdx.z;                                                                             \
        const int* row = rows + r * ROW_INTS;                                                           \
        u16* kc = seqs[r][2 * layer];                                                                   \
        u16* vc = seqs[r][2 * layer + 1];                                                               \
        int capacity = row[0], d_row = row[6];                                                          \
        Placement pl{row[1], row[2], row[3], row[4], row[5]};                                           \
        float2 cs = rope_pair_angle(pl.p, n_rot, base, freq_scale);                                     \
        __shared__ float head_norms[2 * D];                                                             \
        load_head_norms<D>(qn, kn, head_norms);                                                         \
        DecodeShare sh = decode_share<NH>(pl);                                                          \
        FirstTile<D> ft;                                                                                \
        load_first_tile<D>(ft, sh, pl, window, kc, vc, capacity, kv_width, n_head, n_kv_head);          \
        WAIT_PRIOR_GRID();                                                                              \
        FreshRow fr{k + (size_t)r * kv_width, v + (size_t)r * kv_width, kc, vc, d_row, n_rot, neox, pl.p, cs, \
                    qn ? head_norms : nullptr, eps};                                                    \
        attend_decode<D, NH>(q, kc, vc, capacity, kv_width, pl, n_head, n_kv_head, scale, window, tile_cap, \
                             partial, arrivals, dst, group, quant, a, fr, sh, ft, r, n_t);              \
    }
#define ATTEND_TILES(D, MIN_BLOCKS)                                                                     \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS, MIN_BLOCKS) attend_tiles_d##D(            \
        const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc, int capacity, \
        int kv_width, const int* __restrict__ pos, const int* __restrict__ meta, int n_head, int n_kv_head, \
        float scale, int window, int tile_cap, float* partial, int* __restrict__ arrivals,              \
        float* __restrict__ dst, int group, int quant, u8* __restrict__ a, int n_t, int group_tiles) {  \
        Placement pl = read_placement(meta, pos);                                                       \
        WAIT_PRIOR_GRID();                                                                              \
        attend_tiles_body<D>(q, kc, vc, capacity, kv_width, pl, n_head, n_kv_head, scale, window, tile_cap, \
                             partial, arrivals, dst, group, quant, a, n_t, group_tiles);                \
    }                                                                                                   \
    ATTEND_ROPE(attend_rope_d##D, D, 1, MIN_BLOCKS)                                                     \
    ATTEND_ROPE_ROWS(attend_rope_rows_d##D, D, 1, MIN_BLOCKS)
#define ATTEND_ROPE_HEADS(D, NH)                                                                        \
    ATTEND_ROPE(attend_rope_h##NH##_d##D, D, NH, 2)                                                     \
    ATTEND_ROPE_ROWS(attend_rope_rows_h##NH##_d##D, D, NH, 2)
// ATTEND_TILES(head size, blocks a multiprocessor for both kernels): the sizes
// `routes::head_dim_supported` admits. Two blocks hold 128 registers a thread, which its heads loop
// (a block per KV head) would pass at head size 128 (152) without the bound; at 256 the kernel held
// more than 128 before the loop (158) and would spill under it, so it stays at one block.
ATTEND_TILES(32, 2)
ATTEND_TILES(64, 2)
ATTEND_TILES(128, 2)
ATTEND_TILES(256, 1)
// ATTEND_ROPE_HEADS(head size, query heads a block in a deep context), two blocks a multiprocessor:
// `routes::decode_attention_heads`. (Four heads a block measured no faster than two at 4,096 keys on
// the 8B, 419 against 427 tok/s, and slower at depth 0.)
ATTEND_ROPE_HEADS(64, 2)
ATTEND_ROPE_HEADS(128, 2)
