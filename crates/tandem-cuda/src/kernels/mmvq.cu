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
// out in `int8::repacked_source`, which gpu-check compares with the bytes these kernels write.

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

__device__ __forceinline__ int4 ldx16(const signed char* p) { return __ldg((const int4*)p); }

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

// Where a K-quant kernel reads its Q8_K activations: global memory, or the block's shared copy
// (`stage_q8k`). A lane's 16 quants are named both ways: by their place in the super-block (`piece`,
// 0..15) for global memory, and by the lane's load step `i` (0..3) and its position `lp` (0..3)
// among the super-block's four lanes for the shared copy, which is laid out so that each load
// instruction of a warp reads 512 consecutive bytes (no bank conflicts).
struct GlobalQ8K {
    // Row t0's quants, sums and scales, formed once: a step's loads then add only their offsets (the
    // row arithmetic in 64 bits cost more instructions than the products it fed).
    const signed char* qs;
    const int* sum;
    const float* dd;
    int t0, cols;
    __device__ __forceinline__ static GlobalQ8K at(const u8* A, int n_t, int cols, int t0) {
        return GlobalQ8K{act_qs(A, t0, cols), act_sums(A, n_t, t0, cols), act_d(A, n_t, t0, cols, 256), t0, cols};
    }
    __device__ __forceinline__ int4 q(int t, int sb, int piece, int, int) const {
        return ldx16(qs + ((t - t0) * cols + sb * 256 + piece * 16));
    }
    __device__ __forceinline__ int4 sums(int t, int sb, int c) const {
        return __ldg((const int4*)(sum + ((t - t0) * (cols / 16) + sb * 16 + c * 4)));
    }
    __device__ __forceinline__ float d(int t, int sb) const { return __ldg(dd + (t - t0) * (cols / 256) + sb); }
    // The sums of 16 a Q6_K lane k needs (`q6k_accumulate`): groups p0, p0 + 2, p0 + 4 and p0 + 6 with
    // p0 = 8 * (k / 2) + k % 2, from the two int4s of groups 8 * (k / 2) .. + 8.
    __device__ __forceinline__ int4 q6_sums(int t, int sb, int k) const {
        int4 a = sums(t, sb, 2 * (k >> 1)), b = sums(t, sb, 2 * (k >> 1) + 1);
        return (k & 1) ? make_int4(a.y, a.w, b.y, b.w) : make_int4(a.x, a.z, b.x, b.z);
    }
};

struct SharedQ8K {
    const int4* qs;
    const int4* sum4;
    const float* dq;
    __device__ __forceinline__ int4 q(int, int sb, int, int i, int lp) const {
        return qs[(sb >> 3) * 128 + i * 32 + (sb & 7) * 4 + lp];
    }
    __device__ __forceinline__ int4 sums(int, int sb, int c) const { return sum4[sb * 4 + c]; }
    __device__ __forceinline__ float d(int, int sb) const { return dq[sb]; }
    // Staged for Q6_K (L = 1), the sums are in each lane's order: int4 k of a super-block holds lane
    // k's four (`stage_q8k`).
    __device__ __forceinline__ int4 q6_sums(int, int sb, int k) const { return sum4[sb * 4 + k]; }
};

// Copies one activation row (Q8_K, n_t = 1) into shared memory for a block's four warps, quants
// reordered for the reading kernel: L = 0 for Q4_K (lane position c reads pieces 4c + i), L = 1 for
// Q6_K (lane position 2h + g reads pieces 8h + g + 2i), the sums of 16 as they are for Q4_K and in
// each lane's order for Q6_K (`q6_sums`). Bytes: `int8::staged_bytes`.
template <int L>
__device__ __forceinline__ SharedQ8K stage_q8k(const u8* __restrict__ A, int cols, int4* smem) {
    int nsb = cols / 256;
    int4* qs = smem;
    int4* sum4 = smem + ((nsb + 7) / 8) * 128;
    float* dq = (float*)(sum4 + nsb * 4);
    const int4* gq = (const int4*)A;
    for (int P = threadIdx.x; P < nsb * 16; P += blockDim.x) {
        int sb = P >> 4, p = P & 15;
        int i = L == 0 ? (p & 3) : ((p >> 1) & 3);
        int lp = L == 0 ? (p >> 2) : 2 * (p >> 3) + (p & 1);
        qs[(sb >> 3) * 128 + i * 32 + (sb & 7) * 4 + lp] = __ldg(gq + P);
    }
    const int* gs = act_sums(A, 1, 0, cols);
    if (L == 0) {
        for (int j = threadIdx.x; j < nsb * 4; j += blockDim.x) sum4[j] = __ldg((const int4*)gs + j);
    } else {
        // Lane k's sums of 16 (groups p0 + 2i, p0 = 8 * (k / 2) + k % 2) side by side.
        for (int j = threadIdx.x; j < nsb * 4; j += blockDim.x) {
            const int* g = gs + (j >> 2) * 16 + 8 * ((j & 3) >> 1) + (j & 1);
            sum4[j] = make_int4(__ldg(g), __ldg(g + 2), __ldg(g + 4), __ldg(g + 6));
        }
    }
    const float* gd = act_d(A, 1, 0, cols, 256);
    for (int j = threadIdx.x; j < nsb; j += blockDim.x) dq[j] = __ldg(gd + j);
    __syncthreads();
    return SharedQ8K{qs, sum4, dq};
}

// The 6-bit scales and mins of sub-blocks 2c and 2c + 1 of a Q4_K super-block whose 16-byte head
// (d, dmin, 12 scale bytes) is `h`: ggml's `get_scale_min_k4` on whole words, so no byte of the head
// is addressed by a lane-dependent index (that would put the head in local memory, and make each
// step wait for it to arrive before issuing its quant loads).
__device__ __forceinline__ void q4k_lane_scales(uint4 h, int c, int* sc0, int* m0, int* sc1, int* m1) {
    // Sub-blocks 0..3 are bytes 0..3 of the low six bits; sub-blocks 4..7 take their low four bits
    // from the last four bytes and their top two from the top bits of the first eight.
    u32 sc = c < 2 ? h.y & 0x3F3F3F3Fu : (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
    u32 mn = c < 2 ? h.z & 0x3F3F3F3Fu : ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
    int shift = 16 * (c & 1);
    *sc0 = (sc >> shift) & 0xFF;
    *sc1 = (sc >> (shift + 8)) & 0xFF;
    *m0 = (mn >> shift) & 0xFF;
    *m1 = (mn >> (shift + 8)) & 0xFF;
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

// A super-block's float step of a lane's sum, from its exact integers: shared by the matvecs and the
// tensor-core kernels (`mmq_*`), so both contract the same expression into the same instructions.
__device__ __forceinline__ float q4k_fold(float acc, float dx, float d, float dmin, int isum, int msum) {
    return acc + dx * (d * (float)isum - dmin * (float)msum);
}

__device__ __forceinline__ float q6k_fold(float acc, float dx, float d, int isum) { return acc + dx * d * (float)isum; }

__device__ __forceinline__ float q8_fold(float acc, float d, float dx, int s) { return acc + d * dx * (float)s; }

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

// Six bits per quant from a word of low nibbles (`ql >> nib`) and the matching 2-bit field of `qh`
// (moved to bits 4-5 by `hshift`): four bytes 0..63, the stored quants. Q6_K's offset of 32 is taken
// off one of two ways, with the same integers (so the same bits):
// - OFF_SUMS (one activation row): from the sums, sum((q - 32) x) = sum(q x) - 32 sum(x), with sum(x)
//   the Q8_K sums of 16 (`q6k_accumulate`), so no byte is subtracted at all;
// - OFF_BYTES (batched rows, where those sums would be loaded once per row): from each byte. Each is
//   0..63, so the subtraction runs on the word: with bit 7 set first no byte borrows from the next,
//   and flipping bit 7 back gives the signed difference (sm_90 has no byte-wise subtract;
//   `__vsubss4` takes about eight instructions).
#define OFF_SUMS 0
#define OFF_BYTES 1
template <int OFF>
__device__ __forceinline__ int q6_word(u32 ql, int nib, u32 qh, int hshift) {
    u32 lo = (ql >> nib) & 0x0F0F0F0Fu;
    u32 hi = (hshift >= 0 ? (qh << hshift) : (qh >> -hshift)) & 0x30303030u;
    if (OFF == OFF_SUMS) return (int)(lo | hi);
    return (int)(((lo | hi | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
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
#define MMVQ(T, U, R, S)                                                                          \
    MMVQ_KERNEL(mmvq_##T##_u##U##_r##R##_s##S, STEP_##T(U, R, S), ACT_##T, 1, R, S)               \
    MMVQ_KERNEL(mmvqb_##T##_u##U##_r##R##_s##S, STEP_##T(U, R, S), ACT_##T, MV_BATCH, R, S)

// Staged (one activation row, K-quants): the block copies the activation row into shared memory
// (`stage_q8k`), then each warp takes row groups warp, warp + 4 * gridDim.x, ... The host sizes the
// grid to the blocks that fit on the GPU at once, so the copy is made once per resident block and no
// second wave of blocks starts late. Each warp issues its first group's first step of weight loads
// before the copy: the copy waits on the previous kernel's output (in L2) and the weights come from
// memory, so the two latencies overlap instead of adding up. A row's sums are the S = 1 kernel's:
// same bits. (A version that also kept the next step's loads in flight across rows was slower on the
// 8B shapes: docs/gpu-runs/2026-11-30-decode.)
template <class Step, int L, int R>
__device__ __forceinline__ void mmvq_staged(const u8* __restrict__ W0, const u8* __restrict__ W1,
                                            const u8* __restrict__ W2, const u8* __restrict__ A,
                                            float* __restrict__ Y0, float* __restrict__ Y1, float* __restrict__ Y2,
                                            int rows0, int rows1, int rows2, int cols) {
    extern __shared__ int4 staged_act[];
    int groups = (rows0 + rows1 + rows2) / R, lane = threadIdx.x & 31;
    int group = blockIdx.x * 4 + (threadIdx.x >> 5);
    WarpRow<1> m[R];
    m[0].lane = lane;
    m[0].t0 = 0;
    m[0].nt = 1;
    m[0].acc[0] = 0.f;
    const u8* W = W0;
    float* Y = Y0;
    int rows = rows0;
    Step st;
    int base = lane >> 2;
    if (group < groups) {
        mmvq_resolve<1, R>(group, rows0, rows1, &W, &Y, &rows, m, W1, W2, Y1, Y2, rows2);
        st.template at_rows<1>(m, W, rows, cols);
        st.issue(base);
    }
    WAIT_PRIOR_GRID();
    SharedQ8K act = stage_q8k<L>(A, cols, staged_act);
    if (group >= groups) return;
    st.template consume<1>(m, act, base);
    steps_from<1>(st, m, act, st.next(base));
    mmvq_store<1, R, 1>(m, Y, rows);
    for (group += gridDim.x * 4; group < groups; group += gridDim.x * 4) {
        m[0].acc[0] = 0.f;
        W = W0, Y = Y0;
        mmvq_resolve<1, R>(group, rows0, rows1, &W, &Y, &rows, m, W1, W2, Y1, Y2, rows2);
        st.template at_rows<1>(m, W, rows, cols);
        steps_from<1>(st, m, act, base);
        mmvq_store<1, R, 1>(m, Y, rows);
    }
}

#define MMVQ_STAGED_KERNEL(NAME, STEP, L, R)                                                        \
    extern "C" __global__ void __launch_bounds__(128) NAME(                                        \
        const u8* __restrict__ W0, const u8* __restrict__ W1, const u8* __restrict__ W2,           \
        const u8* __restrict__ A, float* __restrict__ Y0, float* __restrict__ Y1, float* __restrict__ Y2, \
        int rows0, int rows1, int rows2, int cols, int n_t) {                                      \
        mmvq_staged<STEP, L, R>(W0, W1, W2, A, Y0, Y1, Y2, rows0, rows1, rows2, cols);             \
    }
#define MMVQ_STAGED_q4_k(U, R) MMVQ_STAGED_KERNEL(mmvqp_q4_k_u##U##_r##R##_s1, Q4kStep<U COMMA R COMMA 1>, 0, R)
#define MMVQ_STAGED_q6_k(U, R) MMVQ_STAGED_KERNEL(mmvqp_q6_k_u##U##_r##R##_s1, Q6kStep<U COMMA R COMMA 1>, 1, R)
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
// Staged variants (`p`): their batched launches take the `mmvqb` kernel of the same U and R above.
MMVQ_STAGED(q4_k, 0, 1, 1)
MMVQ_STAGED(q4_k, 0, 2, 1)
MMVQ_STAGED(q4_k, 0, 1, 2)
MMVQ_STAGED(q4_k, 0, 2, 2)
MMVQ_STAGED(q4_k, 0, 4, 1)
MMVQ_STAGED(q6_k, 1, 1, 1)
MMVQ_STAGED(q6_k, 1, 2, 1)
MMVQ_STAGED(q6_k, 1, 4, 1)

// ---- The integer matvecs' sums on the tensor cores, for chunks of many rows (`mmq_*`; `int8::mmq_takes`
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

__device__ __forceinline__ void imma_k32(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void imma_k16(int (&d)[4], u32 a0, u32 a1, u32 b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%0, %1, %2, %3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// A chunk's activations for one super-block, staged in shared memory once a block (the four warps
// read the same 16 rows): the profile of these kernels reading them from global memory had the L1 at
// 96-97% of its throughput (docs/gpu-runs/2026-11-30-bulk, call k9). Per row: the 256 quants in a
// 288-byte slot (the 32 bytes of padding put a warp's 8-byte fragment reads of eight rows in distinct
// banks), the 16 sums of 16 in an 80-byte slot, then the 16 rows' scales.
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
    __device__ __forceinline__ static MmqTile at(int cols, int n_t) {
        int lane = threadIdx.x & 31;
        MmqTile tl;
        tl.g = lane >> 2, tl.i = lane & 3;
        tl.r0 = blockIdx.y * 32 + (threadIdx.x >> 5) * 8, tl.t0 = blockIdx.x * 16;
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

// Q6_K's piece (16 quants, one scale) that the matvec lane at position k reads in its quarter q.
__device__ __forceinline__ int q6k_piece(int k, int q) { return 8 * (k >> 1) + 2 * q + (k & 1); }

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
    MmqTile tl = MmqTile::at(cols, n_t);
    bool live = tl.r0 < rows;
    mmq_run(MmqQ4k(W, tl), tl, GlobalQ8K::at(A, n_t, cols, 0), Y, rows, live);
}

extern "C" __global__ void __launch_bounds__(128) mmq_q6_k(const u8* __restrict__ W, const u8* __restrict__ A,
                                                           float* __restrict__ Y, int rows, int cols, int n_t) {
    WAIT_PRIOR_GRID();
    MmqTile tl = MmqTile::at(cols, n_t);
    bool live = tl.r0 < rows;
    mmq_run(MmqQ6k(W, tl, rows), tl, GlobalQ8K::at(A, n_t, cols, 0), Y, rows, live);
}

// Q8_0: blocks of 32 quants and an f16 scale (repacked: quants in aligned blocks, scales in a table
// after all rows), Q8 activations of the same blocks. The matvec's lane 2 j + half takes half `half` (16
// quants) of blocks j, j + 16, ... (`Q8Step`), so a block's two halves are two m16n8k16 products and
// two chains. Its butterfly pairs lanes l ^ 16 (j ^ 8), ^ 8 (j ^ 4), ^ 4 (j ^ 2), ^ 2 (j ^ 1) and ^ 1
// (the halves); chains are formed in an order that merges each pair as soon as both exist.
extern "C" __global__ void __launch_bounds__(128) mmq_q8_0(const u8* __restrict__ W, const u8* __restrict__ A,
                                                           float* __restrict__ Y, int rows, int cols, int n_t) {
    WAIT_PRIOR_GRID();
    MmqTile tl = MmqTile::at(cols, n_t);
    if (tl.r0 >= rows) return;
    int nb = cols / 32, g = tl.g, i = tl.i;
    const signed char* qs = act_qs(A, 0, cols);
    const float* dd = act_d(A, n_t, 0, cols, 32);
    const u8* wrow = W + (size_t)(tl.r0 + g) * cols;
    const u16* dtab = (const u16*)(W + (size_t)rows * cols);
    const u16* drow[2] = {dtab + (size_t)(tl.r0 + 2 * i) * nb, dtab + (size_t)(tl.r0 + 2 * i + 1) * nb};
    // Chains j in the butterfly's order: pairs (j, j + 8) merge first, then those sums by j ^ 4, j ^ 2
    // and j ^ 1. Each output keeps, per half: v3 (j ^ 2 merged), v2 (j ^ 4 merged), v1 (one pair) and
    // the first chain of a pair.
    const int order[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    float v3[2][4][2], v2[4][2], v1[4][2], first[4][2];
#pragma unroll
    for (int oi = 0; oi < 16; oi++) {
        float p[4][2];
#pragma unroll
        for (int e = 0; e < 4; e++) p[e][0] = p[e][1] = 0.f;
        for (int ib = order[oi]; ib < nb; ib += 16) {
            float dx[2], dw[2];
#pragma unroll
            for (int h = 0; h < 2; h++) dx[h] = tl.te[h] < n_t ? dd[(size_t)tl.te[h] * nb + ib] : 0.f;
#pragma unroll
            for (int w = 0; w < 2; w++) dw[w] = h2f(__ldg(drow[w] + ib));
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int d[4] = {0, 0, 0, 0};
                u32 a0 = tl.te[0] < n_t ? *(const u32*)(qs + (size_t)tl.te[0] * cols + ib * 32 + half * 16 + 4 * i) : 0u;
                u32 a1 = tl.te[1] < n_t ? *(const u32*)(qs + (size_t)tl.te[1] * cols + ib * 32 + half * 16 + 4 * i) : 0u;
                imma_k16(d, a0, a1, *(const u32*)(wrow + ib * 32 + half * 16 + 4 * i));
#pragma unroll
                for (int e = 0; e < 4; e++) p[e][half] = q8_fold(p[e][half], dw[e & 1], dx[e >> 1], d[e]);
            }
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
                        v3[oi / 8][e][h] = c;
                    }
                }
            }
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int t = tl.te[e >> 1], r = tl.r0 + 2 * i + (e & 1);
        // ^ 2: j and j + 1; ^ 1: the halves.
        if (t < n_t) Y[(size_t)t * rows + r] = (v3[0][e][0] + v3[1][e][0]) + (v3[0][e][1] + v3[1][e][1]);
    }
}
