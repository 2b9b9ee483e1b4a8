// The integer decode route: activations are quantized to int8 once per matmul input, then the weights'
// integer quants meet them in `dp4a` (four int8 products summed in one instruction), so a weight costs
// a fraction of an instruction instead of a decode to f32 and an FMA. That is what lets one step read
// the weights at memory speed: the float kernels in quant.cu are instruction-bound.
//
// Activations are quantized exactly as the CPU backend does it (itself llama.cpp's x86 CPU backend):
// Q8_K blocks of 256 (`nearest_int(x * -127 / max)`, f32 scale) for K-quant weights, Q8 blocks of 32
// (`round_half_even(x * 127 / amax)`, scale rounded to f16) for Q8_0 weights. The integer products
// are then the CPU's exactly; only the order of the float sums over blocks differs.
//
// Quantized activations: the layout and the quantizers (`q8k_block`, `q8_block`) are in common.cuh,
// shared with the norm and gating kernels that write this form directly. The quants and sums are
// whole 16-byte lines (cols is a multiple of 256 for Q8_K), so kernels read them with 16-byte loads.
//
// Weights are repacked once at load (`repack_*`, same bytes as the original) so that each load
// instruction of a warp reads one contiguous run: a lane's 16-byte pieces of a K-quant super-block go
// to per-row regions (all super-blocks' first pieces, then all second pieces, ...), so the 32 lanes of
// a warp, eight super-blocks of four lanes, read 512 consecutive bytes where the ggml layout would
// scatter them over twice the cache lines. Q8_0 blocks (34 bytes) keep their quants in aligned blocks,
// and every block's f16 scale moves to a table after all rows (Q6_K's too). The layouts are written
// out in `int8::repacked_source`, which the kernel tests compare with the bytes these kernels write.

__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

// Four products of unsigned bytes (a) with signed bytes (b), summed into c: `dp4a.u32.s32`.
__device__ __forceinline__ int dp4a_us(u32 a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// One warp per (row, Q8_K block of 256), four per block.
extern "C" __global__ void __launch_bounds__(128) quantize_q8k(const float* __restrict__ x, u8* __restrict__ a,
                                                               int n_t, int cols) {
    WAIT_PRIOR_GRID();
    int blk = blockIdx.x * 4 + (threadIdx.x >> 5), t = blockIdx.y;
    if (blk >= cols / 256) return;
    q8k_block(x + (size_t)t * cols + blk * 256, a, n_t, t, cols, blk);
}

// One warp per (row, Q8 block of 32): lane i quantizes element i.
extern "C" __global__ void __launch_bounds__(128) quantize_q8(const float* __restrict__ x, u8* __restrict__ a,
                                                              int n_t, int cols) {
    WAIT_PRIOR_GRID();
    int blk = blockIdx.x * 4 + (threadIdx.x >> 5), t = blockIdx.y;
    if (blk >= cols / 32) return;
    q8_block(x[(size_t)t * cols + blk * 32 + (threadIdx.x & 31)], a, n_t, t, cols, blk);
}

// Repacking for the integer route: each block of `block_bytes` (a 2-byte f16 scale at `scale_off`, its
// `quant_len` quant bytes at `quant_off`) gives its quants to a run of aligned blocks, in order, and
// its scale to a table after all of them. Used for Q8_0: 34-byte blocks, d at 0, quants at 2..34 (the
// K-quants take the region kernels below). One thread per block.
extern "C" __global__ void repack_scales_out(const u8* __restrict__ src, u8* __restrict__ dst, size_t n_blocks,
                                             int block_bytes, int quant_off, int quant_len, int scale_off) {
    WAIT_PRIOR_GRID();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const u8* s = src + i * block_bytes;
    u8* o = dst + i * quant_len;
    for (int k = 0; k < quant_len; k++) o[k] = s[quant_off + k];
    u8* d = dst + n_blocks * quant_len + i * 2;
    d[0] = s[scale_off];
    d[1] = s[scale_off + 1];
}

// K-quant super-blocks to per-row regions of 16-byte pieces, one thread per super-block. Q4_K (144
// bytes: d, dmin, 12 scale bytes, then 128 quant bytes in four 32-byte chunks): region A holds each
// chunk's first 16 bytes, B its second, then the 16-byte heads; a row is A | B | heads. Q6_K (210
// bytes: ql 0..128, qh 128..192, scales 192..208, d 208): lane k = 2h + g of a super-block reads ql at
// 64h + 16g (A) and 64h + 32 + 16g (B), qh at 128 + 32h + 16g (H); a row is A | B | H | scales, and the
// f16 d of every super-block goes to a table after all rows.
extern "C" __global__ void repack_q4_k_regions(const u8* __restrict__ src, u8* __restrict__ dst, int rows, int nsb) {
    WAIT_PRIOR_GRID();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * nsb) return;
    size_t r = i / nsb;
    int sb = (int)(i % nsb);
    const uint4* s = (const uint4*)(src + i * 144);
    uint4* row = (uint4*)(dst + r * nsb * 144);
#pragma unroll
    for (int c = 0; c < 4; c++) {
        row[sb * 4 + c] = s[1 + 2 * c];
        row[nsb * 4 + sb * 4 + c] = s[2 + 2 * c];
    }
    row[nsb * 8 + sb] = s[0];
}

extern "C" __global__ void repack_q6_k_regions(const u8* __restrict__ src, u8* __restrict__ dst, int rows, int nsb) {
    WAIT_PRIOR_GRID();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * nsb) return;
    size_t r = i / nsb;
    int sb = (int)(i % nsb);
    const u8* s = src + i * 210;
    u8* row = dst + r * nsb * 208;
    for (int k = 0; k < 4; k++) {
        int h = k >> 1, l0 = 16 * (k & 1);
        for (int b = 0; b < 16; b++) {
            row[sb * 64 + k * 16 + b] = s[64 * h + l0 + b];
            row[nsb * 64 + sb * 64 + k * 16 + b] = s[64 * h + 32 + l0 + b];
            row[nsb * 128 + sb * 64 + k * 16 + b] = s[128 + 32 * h + l0 + b];
        }
    }
    for (int b = 0; b < 16; b++) row[nsb * 192 + sb * 16 + b] = s[192 + b];
    u8* d = dst + (size_t)rows * nsb * 208 + i * 2;
    d[0] = s[208];
    d[1] = s[209];
}

// Every kernel below: one warp per weight row (4 per block), up to NB activation rows per grid row
// (grid.y). Lanes split a row's blocks in a fixed pattern; each lane first issues the loads of U
// steps (so a warp keeps several KB in flight: the smaller matrices of a decode step are otherwise
// bound by memory latency, not bandwidth), then computes them in ascending order. Per-lane float sums
// run in ascending block order whatever U is, then the fixed warp butterfly: a row's result depends on
// `cols` alone, never on n_t, on U or on the rows batched with it. U is chosen per shape at load by
// timing (`tune_decode`).

// Four int8 products of 16 weights with 16 activations, summed.
__device__ __forceinline__ int dot16(const int* v, int4 x) {
    return dp4a(v[3], x.w, dp4a(v[2], x.z, dp4a(v[1], x.y, dp4a(v[0], x.x, 0))));
}

// The same with unsigned weight bytes.
__device__ __forceinline__ int dot16_us(const u32* v, int4 x) {
    return dp4a_us(v[3], x.w, dp4a_us(v[2], x.z, dp4a_us(v[1], x.y, dp4a_us(v[0], x.x, 0))));
}

// Where a K-quant kernel reads its Q8_K activations: global memory (`GlobalQ8K`, int8.cuh), or the
// block's shared copy (`stage_q8k`). A lane's 16 quants are named both ways: by their place in the
// super-block (`piece`, 0..15) for global memory, and by the lane's load step `i` (0..3) and its
// position `lp` (0..3) among the super-block's four lanes for the shared copy, which is laid out so
// that each load instruction of a warp reads 512 consecutive bytes (no bank conflicts).
template <int NB>
struct SharedQ8K {
    const int4* qs;
    const int4* sum4;
    const float* dq;
    int stride;  // int4s from one activation row's copy to the next (`staged_row_int4s`)
    // Row t's offset: a lone row's kernel (NB = 1) adds nothing.
    __device__ __forceinline__ int row(int t) const { return NB == 1 ? 0 : t * stride; }
    __device__ __forceinline__ int4 q(int t, int sb, int, int i, int lp) const {
        return qs[row(t) + (sb >> 3) * 128 + i * 32 + (sb & 7) * 4 + lp];
    }
    __device__ __forceinline__ int4 sums(int t, int sb, int c) const { return sum4[row(t) + sb * 4 + c]; }
    __device__ __forceinline__ float d(int t, int sb) const { return dq[4 * row(t) + sb]; }
    // Staged for Q6_K (L = 1), the sums are in each lane's order: int4 k of a super-block holds lane
    // k's four (`stage_q8k`).
    __device__ __forceinline__ int4 q6_sums(int t, int sb, int k) const { return sum4[row(t) + sb * 4 + k]; }
};

// One staged activation row's int4s: the quants in whole groups of eight super-blocks, the sums of
// 16, the block scales, rounded up to whole int4s (`int8::staged_row_bytes`).
__device__ __forceinline__ int staged_row_int4s(int nsb) { return ((nsb + 7) / 8) * 128 + nsb * 4 + (nsb + 3) / 4; }

// Copies n_t (at most NB) activation rows (Q8_K) into shared memory for a block's warps, one after
// another (`staged_row_int4s` apart), quants reordered for the reading kernel: L = 0 for Q4_K (lane
// position c reads pieces 4c + i), L = 1 for Q6_K (lane position 2h + g reads pieces 8h + g + 2i), the
// sums of 16 as they are for Q4_K and in each lane's order for Q6_K (`q6_sums`). Bytes:
// `int8::staged_bytes` for one row, `int8::staged_row_bytes` a row for several.
template <int L, int NB>
__device__ __forceinline__ SharedQ8K<NB> stage_q8k(const u8* __restrict__ A, int cols, int n_t, int4* smem) {
    int nsb = cols / 256, stride = staged_row_int4s(nsb);
    int qs_len = ((nsb + 7) / 8) * 128;
#pragma unroll
    for (int t = 0; t < NB; t++) {
        if (t >= n_t) break;
        int4* qs = smem + (NB == 1 ? 0 : t * stride);
        int4* sum4 = qs + qs_len;
        float* dq = (float*)(sum4 + nsb * 4);
        const int4* gq = (const int4*)act_qs(A, t, cols);
        for (int P = threadIdx.x; P < nsb * 16; P += blockDim.x) {
            int sb = P >> 4, p = P & 15;
            int i = L == 0 ? (p & 3) : ((p >> 1) & 3);
            int lp = L == 0 ? (p >> 2) : 2 * (p >> 3) + (p & 1);
            qs[(sb >> 3) * 128 + i * 32 + (sb & 7) * 4 + lp] = __ldg(gq + P);
        }
        const int* gs = act_sums(A, n_t, t, cols);
        if (L == 0) {
            for (int j = threadIdx.x; j < nsb * 4; j += blockDim.x) sum4[j] = __ldg((const int4*)gs + j);
        } else {
            // Lane k's sums of 16 (groups p0 + 2i, p0 = 8 * (k / 2) + k % 2) side by side.
            for (int j = threadIdx.x; j < nsb * 4; j += blockDim.x) {
                const int* g = gs + (j >> 2) * 16 + 8 * ((j & 3) >> 1) + (j & 1);
                sum4[j] = make_int4(__ldg(g), __ldg(g + 2), __ldg(g + 4), __ldg(g + 6));
            }
        }
        const float* gd = act_d(A, n_t, t, cols, 256);
        for (int j = threadIdx.x; j < nsb; j += blockDim.x) dq[j] = __ldg(gd + j);
    }
    __syncthreads();
    return SharedQ8K<NB>{smem, smem + qs_len, (const float*)(smem + qs_len + nsb * 4), stride};
}

// One lane's share of a super-block, as loaded and as unpacked, for each K-quant type; the kernels
// below (one step at a time, or pipelined) share these so that they do the same arithmetic.
//
// Q4_K: four lanes per super-block. Lane c = lane % 4 takes chunk c of the quants (32 bytes: low
// nibbles are sub-block 2c, high nibbles sub-block 2c + 1), so one decode of the packed scales serves
// 64 weights. The high nibbles stay where they are (16 times their value, as unsigned bytes) and meet
// the activations in `dp4a_us`; the sum, a multiple of 16, is shifted back exactly. That saves a
// shift a word, and the integers (so the bits) are those of nibbles moved down first.
struct Q4kLoad {
    uint4 head, qa, qb;
};

__device__ __forceinline__ Q4kLoad q4k_load(const u8* row, int nsb, int sb, int c) {
    return Q4kLoad{ld_weights16(row + nsb * 128 + sb * 16), ld_weights16(row + sb * 64 + c * 16),
                   ld_weights16(row + nsb * 64 + sb * 64 + c * 16)};
}

struct Q4kLane {
    float d, dmin;
    int sc0, m0, sc1, m1, lo[8];
    u32 hi16[8];  // the high nibbles in place: 16 times the quant
};

__device__ __forceinline__ Q4kLane q4k_unpack(const Q4kLoad& w, int c) {
    Q4kLane l;
    l.d = h2f((u16)(w.head.x & 0xFFFF));
    l.dmin = h2f((u16)(w.head.x >> 16));
    q4k_lane_scales(w.head, c, &l.sc0, &l.m0, &l.sc1, &l.m1);
    u32 q[8] = {w.qa.x, w.qa.y, w.qa.z, w.qa.w, w.qb.x, w.qb.y, w.qb.z, w.qb.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        l.lo[i] = (int)(q[i] & 0x0F0F0F0Fu);
        l.hi16[i] = q[i] & 0xF0F0F0F0u;
    }
    return l;
}

// acc += this lane's 64 products with activation row t.
template <class Act>
__device__ __forceinline__ void q4k_accumulate(const Q4kLane& l, const Act& act, int t, int sb, int c, float& acc) {
    int4 x0 = act.q(t, sb, 4 * c, 0, c), x1 = act.q(t, sb, 4 * c + 1, 1, c);
    int4 x2 = act.q(t, sb, 4 * c + 2, 2, c), x3 = act.q(t, sb, 4 * c + 3, 3, c);
    int4 bs = act.sums(t, sb, c);
    float dx = act.d(t, sb);
    int dl = dot16(l.lo + 4, x1) + dot16(l.lo, x0);
    int dh = (dot16_us(l.hi16 + 4, x3) + dot16_us(l.hi16, x2)) >> 4;  // exact: a multiple of 16
    int isum = l.sc0 * dl + l.sc1 * dh, msum = l.m0 * (bs.x + bs.y) + l.m1 * (bs.z + bs.w);
    acc = q4k_fold(acc, dx, l.d, l.dmin, isum, msum);
}

// Q6_K (repacked): four lanes per super-block. Lane k = lane % 4 takes half h = k / 2 (128 elements)
// and l0 = 16 * (k % 2): ql[l0..+16] and ql[32 + l0..+16] of the half, and qh[l0..+16], which hold
// elements {0, 32, 64, 96} + l0 .. + 16 of the half (one 16-element scale group each).
struct Q6kLoad {
    uint4 qa, qb, qh;
    uint2 scw;
    u16 dh;
};

// `dtab`: the row's f16 scales (in the table after all rows).
__device__ __forceinline__ Q6kLoad q6k_load(const u8* row, const u16* dtab, int nsb, int sb, int k) {
    return Q6kLoad{ld_weights16(row + sb * 64 + k * 16), ld_weights16(row + nsb * 64 + sb * 64 + k * 16),
                   ld_weights16(row + nsb * 128 + sb * 64 + k * 16),
                   __ldg((const uint2*)(row + nsb * 192 + sb * 16 + 8 * (k >> 1))), __ldg(dtab + sb)};
}

struct Q6kLane {
    float d;
    int s1, s2, s3, s4, v1[4], v2[4], v3[4], v4[4];
};

template <int OFF>
__device__ __forceinline__ Q6kLane q6k_unpack(const Q6kLoad& w, int k) {
    Q6kLane l;
    // Signed scale bytes g, g + 2, g + 4 and g + 6 of the half, taken from the words (a lane-dependent
    // byte index would put them in local memory).
    int g = k & 1, lo = 24 - 8 * g, hi = 8 - 8 * g;
    l.s1 = (int)(w.scw.x << lo) >> 24, l.s2 = (int)(w.scw.x << hi) >> 24;
    l.s3 = (int)(w.scw.y << lo) >> 24, l.s4 = (int)(w.scw.y << hi) >> 24;
    l.d = h2f(w.dh);
    u32 A4[4] = {w.qa.x, w.qa.y, w.qa.z, w.qa.w}, B4[4] = {w.qb.x, w.qb.y, w.qb.z, w.qb.w};
    u32 H4[4] = {w.qh.x, w.qh.y, w.qh.z, w.qh.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        l.v1[i] = q6_word<OFF>(A4[i], 0, H4[i], 4);
        l.v2[i] = q6_word<OFF>(B4[i], 0, H4[i], 2);
        l.v3[i] = q6_word<OFF>(A4[i], 4, H4[i], 0);
        l.v4[i] = q6_word<OFF>(B4[i], 4, H4[i], -2);
    }
    return l;
}

template <int OFF, class Act>
__device__ __forceinline__ void q6k_accumulate(const Q6kLane& l, const Act& act, int t, int sb, int k, float& acc) {
    int p0 = 8 * (k >> 1) + (k & 1);
    int isum = l.s1 * dot16(l.v1, act.q(t, sb, p0, 0, k)) + l.s2 * dot16(l.v2, act.q(t, sb, p0 + 2, 1, k)) +
               l.s3 * dot16(l.v3, act.q(t, sb, p0 + 4, 2, k)) + l.s4 * dot16(l.v4, act.q(t, sb, p0 + 6, 3, k));
    if (OFF == OFF_SUMS) {
        int4 bs = act.q6_sums(t, sb, k);
        isum -= 32 * (l.s1 * bs.x + l.s2 * bs.y + l.s3 * bs.z + l.s4 * bs.w);
    }
    acc = q6k_fold(acc, act.d(t, sb), l.d, isum);
}

// One step at a time: eight super-blocks of a row per step (lane l takes super-blocks l / 4, l / 4 +
// 8, ...), a lane's U steps of loads issued before it computes them. A warp takes R consecutive rows:
// each step's activation loads serve all of them. A step is two calls, `issue` (the loads) and
// `consume` (the products), so that a staged kernel can issue its first step before it stages the
// activations; the products and their order are the same either way.
template <int U, int R, int S>
struct Q4kStep {
    Q4kLoad w[R][U];
    const u8* row[R];
    int nsb, c;

    template <int NB>
    __device__ __forceinline__ void at_rows(const WarpRow<NB>* m, const u8* W, int, int cols) {
        nsb = cols / 256;
        c = m[0].lane & 3;
#pragma unroll
        for (int j = 0; j < R; j++) row[j] = W + (size_t)m[j].r * nsb * 144;
    }
    // The first step of this lane (warp `part` of S splitting the row).
    __device__ __forceinline__ int first(int lane, int part) const { return (lane >> 2) + 8 * part; }
    __device__ __forceinline__ int next(int base) const { return base + 8 * S * U; }
    __device__ __forceinline__ bool live(int base) const { return base < nsb; }
    __device__ __forceinline__ void issue(int base) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int sb = base + 8 * S * u;
            if (sb < nsb) {
#pragma unroll
                for (int j = 0; j < R; j++) w[j][u] = q4k_load(row[j], nsb, sb, c);
            }
        }
    }
    template <int NB, class Act>
    __device__ __forceinline__ void consume(WarpRow<NB>* m, const Act& act, int base) const {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int sb = base + 8 * S * u;
            if (sb >= nsb) break;
            Q4kLane l[R];
#pragma unroll
            for (int j = 0; j < R; j++) l[j] = q4k_unpack(w[j][u], c);
#pragma unroll
            for (int t = 0; t < NB; t++) {
                if (t < m[0].nt) {
#pragma unroll
                    for (int j = 0; j < R; j++) q4k_accumulate(l[j], act, m[0].t0 + t, sb, c, m[j].acc[t]);
                }
            }
        }
    }
};

template <int U, int R, int S>
struct Q6kStep {
    static_assert(R == 1, "one row per warp");
    Q6kLoad w[U];
    const u8* row;
    const u16* dtab;
    int nsb, k;

    template <int NB>
    __device__ __forceinline__ void at_rows(const WarpRow<NB>* m, const u8* W, int rows, int cols) {
        nsb = cols / 256;
        k = m[0].lane & 3;
        row = W + (size_t)m[0].r * nsb * 208;
        dtab = (const u16*)(W + (size_t)rows * nsb * 208) + (size_t)m[0].r * nsb;
    }
    __device__ __forceinline__ int first(int lane, int part) const { return (lane >> 2) + 8 * part; }
    __device__ __forceinline__ int next(int base) const { return base + 8 * S * U; }
    __device__ __forceinline__ bool live(int base) const { return base < nsb; }
    __device__ __forceinline__ void issue(int base) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int sb = base + 8 * S * u;
            if (sb < nsb) w[u] = q6k_load(row, dtab, nsb, sb, k);
        }
    }
    template <int NB, class Act>
    __device__ __forceinline__ void consume(WarpRow<NB>* m, const Act& act, int base) const {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int sb = base + 8 * S * u;
            if (sb >= nsb) break;
            constexpr int OFF = NB == 1 ? OFF_SUMS : OFF_BYTES;
            Q6kLane l = q6k_unpack<OFF>(w[u], k);
#pragma unroll
            for (int t = 0; t < NB; t++) {
                if (t < m[0].nt) q6k_accumulate<OFF>(l, act, m[0].t0 + t, sb, k, m[0].acc[t]);
            }
        }
    }
};

// A row group's steps from `base` on: issue, then consume, one step at a time.
template <int NB, class Step, class Act>
__device__ __forceinline__ void steps_from(Step& st, WarpRow<NB>* m, const Act& act, int base) {
    for (; st.live(base); base = st.next(base)) {
        st.issue(base);
        st.template consume<NB>(m, act, base);
    }
}

// Q8_0 activations (Q8 blocks of 32) read from global memory: row t0's quants and scales, formed once.
struct GlobalQ8 {
    const signed char* qs;
    const float* dd;
    int cols;
    __device__ __forceinline__ static GlobalQ8 at(const u8* A, int n_t, int cols, int t0) {
        return GlobalQ8{act_qs(A, t0, cols), act_d(A, n_t, t0, cols, 32), cols};
    }
};

// Q8_0 (repacked): two lanes per 32-element block (16 quants each), sixteen blocks per step.
template <int U, int R, int S>
struct Q8Step {
    static_assert(R == 1, "one row per warp");
    int4 w[U];
    u16 dw[U];
    const u8* row;
    const u16* dtab;
    int nb, half;

    template <int NB>
    __device__ __forceinline__ void at_rows(const WarpRow<NB>* m, const u8* W, int rows, int cols) {
        nb = cols / 32;
        half = m[0].lane & 1;
        row = W + (size_t)m[0].r * cols + half * 16;  // this lane's half of each block
        dtab = (const u16*)(W + (size_t)rows * cols) + (size_t)m[0].r * nb;
    }
    __device__ __forceinline__ int first(int lane, int part) const { return (lane >> 1) + 16 * part; }
    __device__ __forceinline__ int next(int base) const { return base + 16 * S * U; }
    __device__ __forceinline__ bool live(int base) const { return base < nb; }
    __device__ __forceinline__ void issue(int base) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int ib = base + 16 * S * u;
            if (ib < nb) {
                uint4 q = ld_weights16(row + ib * 32);
                w[u] = make_int4((int)q.x, (int)q.y, (int)q.z, (int)q.w);
                dw[u] = __ldg(dtab + ib);
            }
        }
    }
    template <int NB>
    __device__ __forceinline__ void consume(WarpRow<NB>* m, const GlobalQ8& act, int base) const {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int ib = base + 16 * S * u;
            if (ib >= nb) break;
            int wv[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
            float d = h2f(dw[u]);
#pragma unroll
            for (int t = 0; t < NB; t++) {
                if (t < m[0].nt) {
                    int s = dot16(wv, ldx16(act.qs + (t * act.cols + ib * 32 + half * 16)));
                    float dx = __ldg(act.dd + t * (act.cols / 32) + ib);
                    m[0].acc[t] = q8_fold(m[0].acc[t], d, dx, s);
                }
            }
        }
    }
};

// The matrix, output and rows of row group `group` (W, Y and rows hold matrix 0's on entry), and its
// R rows in m[0..R] (m[0] holds the lane's state on entry).
template <int NB, int R>
__device__ __forceinline__ void mmvq_resolve(int group, int rows0, int rows1, const u8** W, float** Y, int* rows,
                                             WarpRow<NB>* m, const u8* W1, const u8* W2, float* Y1, float* Y2,
                                             int rows2) {
    int r = group * R;
    *rows = rows0;
    if (r >= rows0) {
        r -= rows0;
        *W = W1, *Y = Y1, *rows = rows1;
        if (r >= rows1) {
            r -= rows1;
            *W = W2, *Y = Y2, *rows = rows2;
        }
    }
#pragma unroll
    for (int j = 0; j < R; j++) {
        m[j] = m[0];
        m[j].r = r + j;
    }
}

// A launch covers up to three matrices of one type and width that read the same activations (q, k
// and v; gate and up): row groups of W0, then W1, then W2 (rows1 = rows2 = 0 for one matrix), R
// consecutive rows to a group (every matrix's rows a multiple of R). S = 1: each warp of a block takes
// its own group. S = 4: the block's four warps split one group's blocks (warp w takes steps w, w + 4,
// ...) and add their sums in a fixed order, for long rows that would leave too few warps. A row's sums
// are the same in a group as alone and for every U and R; S sets their order. One row of activations
// takes the single-row kernel, more the batched one: same sums, same bits.
template <int NB, int R, int S>
__device__ __forceinline__ bool mmvq_target(int rows0, int rows1, int rows2, int n_t, const u8** W, float** Y,
                                            int* rows, WarpRow<NB>* m, const u8* W1, const u8* W2, float* Y1,
                                            float* Y2) {
    int groups = (rows0 + rows1 + rows2) / R;
    // Lane, activation rows and zeroed sums as every warp-per-row kernel sets them; the row it gives
    // is the warp's group for S = 1, while S = 4 takes a group per block.
    warp_row<NB>(groups, n_t, &m[0]);
    int group = S == 1 ? m[0].r : blockIdx.x;
    if (group >= groups) return false;
    mmvq_resolve<NB, R>(group, rows0, rows1, W, Y, rows, m, W1, W2, Y1, Y2, rows2);
    return true;
}

// Stores the group's rows: each warp's sums over its lanes (fixed butterfly), then for S = 4 the four
// warps' sums as (w0 + w1) + (w2 + w3).
template <int NB, int R, int S>
__device__ __forceinline__ void mmvq_store(WarpRow<NB>* m, float* Y, int rows) {
    if (S == 1) {
#pragma unroll
        for (int j = 0; j < R; j++) warp_row_store<NB>(m[j], Y, rows);
        return;
    }
    __shared__ float red[R][NB][4];
    int w = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < R; j++)
#pragma unroll
        for (int t = 0; t < NB; t++) {
            float v = warp_sum(m[j].acc[t]);
            if (m[j].lane == 0) red[j][t][w] = v;
        }
    __syncthreads();
    if (threadIdx.x < R * NB) {
        int j = threadIdx.x / NB, t = threadIdx.x % NB;
        const float* p = red[j][t];
        if (t < m[0].nt) Y[(size_t)(m[0].t0 + t) * rows + m[j].r] = (p[0] + p[1]) + (p[2] + p[3]);
    }
}

// The unstaged kernels (activations read from global memory). The row group and its first step's
// weight loads come before WAIT_PRIOR_GRID(): no kernel writes weights, so under a programmatic
// edge in a decode graph those loads overlap the kernel before, which the activations then wait for.
template <int NB, int R, int S, class Step, class Act>
__device__ __forceinline__ void mmvq_unstaged(const u8* __restrict__ W0, const u8* __restrict__ W1,
                                              const u8* __restrict__ W2, const u8* __restrict__ A,
                                              float* __restrict__ Y0, float* __restrict__ Y1, float* __restrict__ Y2,
                                              int rows0, int rows1, int rows2, int cols, int n_t) {
    WarpRow<NB> m[R];
    const u8* W = W0;
    float* Y = Y0;
    int rows;
    bool mine = mmvq_target<NB, R, S>(rows0, rows1, rows2, n_t, &W, &Y, &rows, m, W1, W2, Y1, Y2);
    Step st;
    int base = 0;
    if (mine) {
        st.template at_rows<NB>(m, W, rows, cols);
        base = st.first(m[0].lane, S == 1 ? 0 : threadIdx.x >> 5);
        if (st.live(base)) st.issue(base);
    }
    WAIT_PRIOR_GRID();
    if (!mine) return;
    Act act = Act::at(A, n_t, cols, m[0].t0);
    if (st.live(base)) {
        st.template consume<NB>(m, act, base);
        steps_from<NB>(st, m, act, st.next(base));
    }
    mmvq_store<NB, R, S>(m, Y, rows);
}

#define MMVQ_KERNEL(NAME, STEP, ACT, NB, R, S)                                                      \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                        \
        const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2,           \
        const u8* __restrict__ A, float* __restrict__ Y0, float* __restrict__ Y1, float* __restrict__ Y2, \
        int rows0, int rows1, int rows2, int cols, int n_t) {                                      \
        mmvq_unstaged<NB, R, S, STEP, ACT>(W0, W1, W2, A, Y0, Y1, Y2, rows0, rows1, rows2, cols, n_t); \
    }
#define COMMA ,
#define STEP_q4_k(U, R, S) Q4kStep<U COMMA R COMMA S>
#define STEP_q6_k(U, R, S) Q6kStep<U COMMA R COMMA S>
#define STEP_q8_0(U, R, S) Q8Step<U COMMA R COMMA S>
#define ACT_q4_k GlobalQ8K
#define ACT_q6_k GlobalQ8K
#define ACT_q8_0 GlobalQ8

// The routed experts' products of a few rows (`matmul::indexed`, a mixture's decode): grid row p =
// blockIdx.y is one (row, slot) pair, which reads the matrix of expert ids[p] (its address in
// table T0, or T1 for grid.z = 1: an expert's gate and up in one launch) and activation row
// p / a_div of A (a_rows rows), and writes row p of Y0 (Y1). The expert comes from device memory,
// so a captured graph replays the step's own choice. A pair's sums are those of
// `mmvq_<T>_u<U>_r<R>_s<S>` over its expert alone: the bits of that expert's own launch. The ids
// are the kernel before's output, so nothing is loaded before WAIT_PRIOR_GRID(); an id outside
// 0..n_expert (which `moe_route` never writes) leaves its row unwritten rather than read stray
// memory.
template <int R, int S, class Step, class Act>
__device__ __forceinline__ void mmvq_ids(const unsigned long long* __restrict__ T0,
                                         const unsigned long long* __restrict__ T1, const int* __restrict__ ids,
                                         const u8* __restrict__ A, float* __restrict__ Y0, float* __restrict__ Y1,
                                         int rows, int cols, int a_rows, int a_div, int n_expert) {
    int p = blockIdx.y;
    WarpRow<1> m[R];
    m[0].lane = threadIdx.x & 31;
    m[0].r = blockIdx.x * 4 + (threadIdx.x >> 5);
    m[0].acc[0] = 0.f;
    int group = S == 1 ? m[0].r : blockIdx.x;
    WAIT_PRIOR_GRID();
    int e = ids[p];
    if (group >= rows / R || e < 0 || e >= n_expert) return;
    int t = p / a_div;
    m[0].t0 = t;
    m[0].nt = 1;
#pragma unroll
    for (int j = 0; j < R; j++) {
        m[j] = m[0];
        m[j].r = group * R + j;
    }
    const u8* W = (const u8*)(blockIdx.z == 0 ? T0 : T1)[e];
    float* Y = blockIdx.z == 0 ? Y0 : Y1;
    Step st;
    st.template at_rows<1>(m, W, rows, cols);
    Act act = Act::at(A, a_rows, cols, t);
    steps_from<1>(st, m, act, st.first(m[0].lane, S == 1 ? 0 : threadIdx.x >> 5));
    // The sums go to the pair's output row.
#pragma unroll
    for (int j = 0; j < R; j++) m[j].t0 = p;
    mmvq_store<1, R, S>(m, Y, rows);
}

#define MMVQ_IDS_KERNEL(NAME, STEP, ACT, R, S)                                                      \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                        \
        const unsigned long long* __restrict__ T0, const unsigned long long* __restrict__ T1,      \
        const int* __restrict__ ids, const u8* __restrict__ A, float* __restrict__ Y0,             \
        float* __restrict__ Y1, int rows, int cols, int a_rows, int a_div, int n_expert) {         \
        mmvq_ids<R, S, STEP, ACT>(T0, T1, ids, A, Y0, Y1, rows, cols, a_rows, a_div, n_expert);    \
    }
#define MMVQ(T, U, R, S)                                                                          \
    MMVQ_KERNEL(mmvq_##T##_u##U##_r##R##_s##S, STEP_##T(U, R, S), ACT_##T, 1, R, S)               \
    MMVQ_KERNEL(mmvqb_##T##_u##U##_r##R##_s##S, STEP_##T(U, R, S), ACT_##T, MV_BATCH, R, S)       \
    MMVQ_IDS_KERNEL(mmvq_ids_##T##_u##U##_r##R##_s##S, STEP_##T(U, R, S), ACT_##T, R, S)

// Staged (K-quants): the block copies the activation rows into shared memory (`stage_q8k`), then each
// warp takes row groups warp, warp + warps * gridDim.x, ... The host sizes the grid to the blocks that
// fit on the GPU at once, so the copy is made once per resident block and no second wave of blocks
// starts late. Each warp issues its first group's first step of weight loads before the copy: the
// copy waits on the previous kernel's output (in L2) and the weights come from memory, so the two
// latencies overlap instead of adding up. A row's sums are the S = 1 kernel's: same bits. (A version
// that also kept the next step's loads in flight across rows was slower on every 8B shape.)
//
// NB = 1: one activation row, four warps a block (`mmvqp_*`). NB = 2, 4, 8: a decode batch of up to
// NB rows, eight warps a block sharing the copy (`mmvqpb<NB>_*`). Read from global memory, a batch's
// activations cost a lane's four 16-byte loads per super-block and row, each warp-wide load touching
// sixteen 128-byte lines (a lane's 64 bytes are one sub-block pair, the warp's eight super-blocks 2
// KB apart), and the batched kernel above ran one row's weight stream's time per row; the staged
// copy is laid out so that each such load reads 512 consecutive bytes.
template <class Step, int L, int R, int NB>
__device__ __forceinline__ void mmvq_staged(const u8* __restrict__ W0, const u8* __restrict__ W1,
                                            const u8* __restrict__ W2, const u8* __restrict__ A,
                                            float* __restrict__ Y0, float* __restrict__ Y1, float* __restrict__ Y2,
                                            int rows0, int rows1, int rows2, int cols, int n_t) {
    extern __shared__ int4 staged_act[];
    int warps = blockDim.x >> 5;
    int groups = (rows0 + rows1 + rows2) / R, lane = threadIdx.x & 31;
    int group = blockIdx.x * warps + (threadIdx.x >> 5);
    WarpRow<NB> m[R];
    m[0].lane = lane;
    m[0].t0 = 0;
    m[0].nt = NB == 1 ? 1 : min(n_t, NB);
#pragma unroll
    for (int t = 0; t < NB; t++) m[0].acc[t] = 0.f;
    const u8* W = W0;
    float* Y = Y0;
    int rows = rows0;
    Step st;
    int base = lane >> 2;
    if (group < groups) {
        mmvq_resolve<NB, R>(group, rows0, rows1, &W, &Y, &rows, m, W1, W2, Y1, Y2, rows2);
        st.template at_rows<NB>(m, W, rows, cols);
        st.issue(base);
    }
    WAIT_PRIOR_GRID();
    SharedQ8K<NB> act = stage_q8k<L, NB>(A, cols, m[0].nt, staged_act);
    if (group >= groups) return;
    st.template consume<NB>(m, act, base);
    steps_from<NB>(st, m, act, st.next(base));
    mmvq_store<NB, R, 1>(m, Y, rows);
    for (group += gridDim.x * warps; group < groups; group += gridDim.x * warps) {
#pragma unroll
        for (int t = 0; t < NB; t++) m[0].acc[t] = 0.f;
        W = W0, Y = Y0;
        mmvq_resolve<NB, R>(group, rows0, rows1, &W, &Y, &rows, m, W1, W2, Y1, Y2, rows2);
        st.template at_rows<NB>(m, W, rows, cols);
        steps_from<NB>(st, m, act, base);
        mmvq_store<NB, R, 1>(m, Y, rows);
    }
}

#define MMVQ_STAGED_KERNEL(NAME, STEP, L, R, NB, THREADS)                                           \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(                                    \
        const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2,           \
        const u8* __restrict__ A, float* __restrict__ Y0, float* __restrict__ Y1, float* __restrict__ Y2, \
        int rows0, int rows1, int rows2, int cols, int n_t) {                                      \
        mmvq_staged<STEP, L, R, NB>(W0, W1, W2, A, Y0, Y1, Y2, rows0, rows1, rows2, cols, n_t);    \
    }
// The one-row kernel (`p`) and the batched ones (`pb2`, `pb4`, `pb8`) of one step and row group. The
// step is named by its template and built here: a `COMMA` expanded one macro level up would split it.
#define MMVQ_STAGED_ALL(T, STEPT, L, U, R)                                                            \
    MMVQ_STAGED_KERNEL(mmvqp_##T##_u##U##_r##R##_s1, STEPT<U COMMA R COMMA 1>, L, R, 1, 128)         \
    MMVQ_STAGED_KERNEL(mmvqpb2_##T##_u##U##_r##R##_s1, STEPT<U COMMA R COMMA 1>, L, R, 2, 256)       \
    MMVQ_STAGED_KERNEL(mmvqpb4_##T##_u##U##_r##R##_s1, STEPT<U COMMA R COMMA 1>, L, R, 4, 256)       \
    MMVQ_STAGED_KERNEL(mmvqpb8_##T##_u##U##_r##R##_s1, STEPT<U COMMA R COMMA 1>, L, R, 8, 256)
#define MMVQ_STAGED_q4_k(U, R) MMVQ_STAGED_ALL(q4_k, Q4kStep, 0, U, R)
#define MMVQ_STAGED_q6_k(U, R) MMVQ_STAGED_ALL(q6_k, Q6kStep, 1, U, R)
// MMVQ_STAGED(type, shared layout, unroll, rows per group).
#define MMVQ_STAGED(T, L, U, R) MMVQ_STAGED_##T(U, R)

// The variants the load-time timing chooses from (`int8::variants`): U steps of loads in flight per
// lane (K-quant steps are 8 super-blocks of a row, Q8_0 steps 16 blocks of 32), R rows per group, S
// warps per group.
MMVQ(q4_k, 1, 1, 1)
MMVQ(q4_k, 2, 1, 1)
MMVQ(q4_k, 4, 1, 1)
MMVQ(q4_k, 1, 2, 1)
MMVQ(q4_k, 2, 2, 1)
MMVQ(q6_k, 1, 1, 1)
MMVQ(q6_k, 2, 1, 1)
MMVQ(q6_k, 4, 1, 1)
MMVQ(q6_k, 1, 1, 4)
MMVQ(q6_k, 2, 1, 4)
MMVQ(q8_0, 2, 1, 1)
MMVQ(q8_0, 4, 1, 1)
MMVQ(q8_0, 8, 1, 1)
MMVQ(q8_0, 1, 1, 4)
MMVQ(q8_0, 2, 1, 4)
// Staged kernels (`p`, `pb2`, `pb4`, `pb8`) of every split-1 K-quant step above: the one-row ones are
// variants of their own; a batch of 2-8 rows of any split-1 variant takes the `pb` kernel of its U
// and R where the rows fit in shared memory (`int8::staged_batch`), else its `mmvqb` kernel.
MMVQ_STAGED(q4_k, 0, 1, 1)
MMVQ_STAGED(q4_k, 0, 2, 1)
MMVQ_STAGED(q4_k, 0, 1, 2)
MMVQ_STAGED(q4_k, 0, 2, 2)
MMVQ_STAGED(q4_k, 0, 4, 1)
MMVQ_STAGED(q6_k, 1, 1, 1)
MMVQ_STAGED(q6_k, 1, 2, 1)
MMVQ_STAGED(q6_k, 1, 4, 1)
