// Attention over the f16 KV cache in two launches: partial softmax per (key tile, head, query), then a
// combine over tiles in ascending order. Tiles are aligned to absolute positions (tile j holds positions
// [j*ATT_TILE, (j+1)*ATT_TILE)), so a query meets the same tiles, summed in the same order, whether it
// arrives alone (decode), in a chunk, or staged: results are identical across chunkings. Long contexts
// spread over many blocks (one per tile); tiles wholly outside a query's window or past its position
// are skipped without reading a key.
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
extern "C" __global__ void __launch_bounds__(32) attend_partial(
    const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc, int capacity,
    int kv_width, const int* __restrict__ pos, const int* __restrict__ meta, int n_head, int n_kv_head,
    int head_dim, float scale, int window, int tile_cap, float* __restrict__ partial) {
    int origin_logical = meta[0], origin_physical = meta[1], tile_lo = meta[2], n_tiles = meta[3];
    if ((int)blockIdx.x >= n_tiles) return;
    int tile = tile_lo + blockIdx.x, h = blockIdx.y, qi = blockIdx.z, lane = threadIdx.x;
    int p = pos[qi];
    int first = window > 0 ? max(0, p + 1 - window) : 0;
    first = max(first, origin_logical);
    int lo = max(first, tile * ATT_TILE), hi = min(p, tile * ATT_TILE + ATT_TILE - 1);
    float* out = partial + ((size_t)(qi * n_head + h) * tile_cap + blockIdx.x) * (head_dim + 2);
    int per = head_dim / 32;
    if (lo > hi) {
        if (lane == 0) {
            out[0] = -INFINITY;
            out[1] = 0.f;
        }
        return;
    }
    int kvh = h / (n_head / n_kv_head);
    const float* qr = q + ((size_t)qi * n_head + h) * head_dim;
    // Queries are rounded to f16, as the CPU backend (and llama.cpp) does before the K product.
    __shared__ float qs[MAX_HEAD_DIM];
    for (int d = lane; d < head_dim; d += 32) qs[d] = h2f(f2h(qr[d]));
    __syncwarp();
    float acc[MAX_HEAD_DIM / 32];
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; j++) acc[j] = 0.f;
    float m = -INFINITY, l = 0.f;
    // Keys in blocks of 32: lane i scores key base + i on its own (a whole-row dot), the block's
    // maximum and sum are warp reductions, then every lane adds the 32 weighted V rows for its dims.
    for (int base = lo; base <= hi; base += 32) {
        int key = base + lane;
        bool valid = key <= hi;
        size_t phys = valid ? (size_t)((origin_physical + (key - origin_logical)) % capacity) : 0;
        float s = -INFINITY;
        if (valid) {
            const uint4* kr = (const uint4*)(kc + phys * kv_width + kvh * head_dim);
            float dot = 0.f;
            for (int d8 = 0; d8 < head_dim / 8; d8++) {
                uint4 v = kr[d8];
                const u16* hv = (const u16*)&v;
#pragma unroll
                for (int i = 0; i < 8; i++) dot = fmaf(qs[d8 * 8 + i], h2f(hv[i]), dot);
            }
            s = dot * scale;
        }
        float m_new = fmaxf(m, warp_max(s));
        float corr = expf(m - m_new);
        float e = valid ? expf(s - m_new) : 0.f;
        l = l * corr + warp_sum(e);
#pragma unroll
        for (int j = 0; j < MAX_HEAD_DIM / 32; j++) acc[j] *= corr;
        int n = min(32, hi - base + 1);
        for (int k = 0; k < n; k++) {
            float ek = __shfl_sync(0xffffffffu, e, k);
            size_t pk = (size_t)__shfl_sync(0xffffffffu, (unsigned long long)phys, k);
            const u16* vr = vc + pk * kv_width + kvh * head_dim;
#pragma unroll
            for (int j = 0; j < MAX_HEAD_DIM / 32; j++)
                if (j < per) acc[j] = fmaf(ek, h2f(vr[lane + 32 * j]), acc[j]);
        }
        m = m_new;
    }
    if (lane == 0) {
        out[0] = m;
        out[1] = l;
    }
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; j++)
        if (j < per) out[2 + lane + 32 * j] = acc[j];
}

// out[q][h] = merge of the tiles' partial softmaxes, in ascending tile order. One warp per (head, query).
extern "C" __global__ void __launch_bounds__(32) attend_combine(const float* __restrict__ partial,
                                                                const int* __restrict__ meta, int n_head,
                                                                int head_dim, int tile_cap, float* __restrict__ out) {
    int h = blockIdx.x, qi = blockIdx.y, lane = threadIdx.x;
    int n_tiles = meta[3];
    int per = head_dim / 32;
    float m = -INFINITY, l = 0.f, acc[MAX_HEAD_DIM / 32];
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; j++) acc[j] = 0.f;
    for (int t = 0; t < n_tiles; t++) {
        const float* p = partial + ((size_t)(qi * n_head + h) * tile_cap + t) * (head_dim + 2);
        float pl = p[1];
        if (pl == 0.f) continue;
        float pm = p[0];
        float m_new = fmaxf(m, pm);
        float a = expf(m - m_new), b = expf(pm - m_new);
        l = l * a + pl * b;
#pragma unroll
        for (int j = 0; j < MAX_HEAD_DIM / 32; j++)
            if (j < per) acc[j] = acc[j] * a + p[2 + lane + 32 * j] * b;
        m = m_new;
    }
    float* o = out + ((size_t)qi * n_head + h) * head_dim;
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; j++)
        if (j < per) o[lane + 32 * j] = acc[j] / l;
}
