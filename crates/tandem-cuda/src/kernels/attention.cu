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
#define ATT_TILE 128
#define MAX_HEAD_DIM 256

// partial layout: [(q * n_head + h) * n_tiles + tile] * (head_dim + 2): m, l, acc[head_dim].
extern "C" __global__ void __launch_bounds__(32) attend_partial(
    const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc, int capacity,
    int origin_logical, int origin_physical, int kv_width, const int* __restrict__ pos, int n_head, int n_kv_head,
    int head_dim, float scale, int window, int tile_lo, int n_tiles, float* __restrict__ partial) {
    int tile = tile_lo + blockIdx.x, h = blockIdx.y, qi = blockIdx.z, lane = threadIdx.x;
    int p = pos[qi];
    int first = window > 0 ? max(0, p + 1 - window) : 0;
    first = max(first, origin_logical);
    int lo = max(first, tile * ATT_TILE), hi = min(p, tile * ATT_TILE + ATT_TILE - 1);
    float* out = partial + ((size_t)(qi * n_head + h) * n_tiles + blockIdx.x) * (head_dim + 2);
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
    float qv[MAX_HEAD_DIM / 32], acc[MAX_HEAD_DIM / 32];
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; j++) {
        // Queries are rounded to f16, as the CPU backend (and llama.cpp) does before the K product.
        qv[j] = j < per ? h2f(f2h(qr[lane + 32 * j])) : 0.f;
        acc[j] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int key = lo; key <= hi; key++) {
        size_t phys = (size_t)((origin_physical + (key - origin_logical)) % capacity);
        const u16* kr = kc + phys * kv_width + kvh * head_dim;
        const u16* vr = vc + phys * kv_width + kvh * head_dim;
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < MAX_HEAD_DIM / 32; j++)
            if (j < per) s = fmaf(qv[j], h2f(kr[lane + 32 * j]), s);
        s = warp_sum(s) * scale;
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new), e = expf(s - m_new);
        l = l * corr + e;
#pragma unroll
        for (int j = 0; j < MAX_HEAD_DIM / 32; j++)
            if (j < per) acc[j] = acc[j] * corr + e * h2f(vr[lane + 32 * j]);
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
extern "C" __global__ void __launch_bounds__(32) attend_combine(const float* __restrict__ partial, int n_head,
                                                                int head_dim, int n_tiles, float* __restrict__ out) {
    int h = blockIdx.x, qi = blockIdx.y, lane = threadIdx.x;
    int per = head_dim / 32;
    float m = -INFINITY, l = 0.f, acc[MAX_HEAD_DIM / 32];
#pragma unroll
    for (int j = 0; j < MAX_HEAD_DIM / 32; j++) acc[j] = 0.f;
    for (int t = 0; t < n_tiles; t++) {
        const float* p = partial + ((size_t)(qi * n_head + h) * n_tiles + t) * (head_dim + 2);
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
