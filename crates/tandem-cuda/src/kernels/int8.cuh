// The integer route's pieces that both its kernel files use (mmvq.cu: the one-row and batched
// matvecs; mmq.cu: the same sums on the tensor cores for prefill chunks): NVRTC compiles each of them
// with common.cuh and this file in front (`nvrtc::INT8`). Whatever here forms a float from the exact
// integers is shared on purpose: the tensor-core kernels must contract the same expressions into the
// same instructions as the matvecs, so that a prefill chunk's bits are a decode step's.

__device__ __forceinline__ int4 ldx16(const signed char* p) { return __ldg((const int4*)p); }

// Q8_K activation rows read from global memory, row t0 on.
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

// A super-block's float step of a lane's sum, from its exact integers: shared by the matvecs and the
// tensor-core kernels (`mmq_*`), so both contract the same expression into the same instructions.
__device__ __forceinline__ float q4k_fold(float acc, float dx, float d, float dmin, int isum, int msum) {
    return acc + dx * (d * (float)isum - dmin * (float)msum);
}

__device__ __forceinline__ float q6k_fold(float acc, float dx, float d, int isum) { return acc + dx * d * (float)isum; }

__device__ __forceinline__ float q8_fold(float acc, float d, float dx, int s) { return acc + d * dx * (float)s; }

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

// The integer products on the tensor cores (mmq.cu, qmma.cu): d += A (16 x k, s8, row-major) times
// B (k x 8, s8, column-major), exact in int32.
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

// Q6_K's piece (16 quants, one scale) that the matvec lane at position k reads in its quarter q.
__device__ __forceinline__ int q6k_piece(int k, int q) { return 8 * (k >> 1) + 2 * q + (k & 1); }

// The tensor-core batch kernels' loads (qmma.cu, dqmma.cu).
// Weights are read once a step: marked first to go from L2, as `ld_weights16` marks them, but left
// to allocate in L1 (`ld_weights16` bypasses it): a lane's 8- or 4-byte piece shares its sector with
// the next lane's, and the heads' lines serve several lanes.
__device__ __forceinline__ unsigned long long evict_first() {
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

__device__ __forceinline__ uint4 ld_weights16_l1(const void* p) {
    uint4 r;
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(evict_first()));
    return r;
}

__device__ __forceinline__ uint2 ld_weights8(const void* p) {
    uint2 r;
    asm volatile("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;" : "=r"(r.x), "=r"(r.y) : "l"(p), "l"(evict_first()));
    return r;
}

// A Q4_K head's eight 6-bit scales (or mins: `mins`) as bytes, sub-blocks 0..3 in .x, 4..7 in .y.
__device__ __forceinline__ uint2 q4k_packed(uint4 h, bool mins) {
    u32 lo = mins ? h.z : h.y;
    return make_uint2(lo & 0x3F3F3F3Fu, ((mins ? h.w >> 4 : h.w) & 0x0F0F0F0Fu) | ((lo >> 2) & 0x30303030u));
}

// Byte s (0..7, known at compile time) of packed bytes, as an int.
__device__ __forceinline__ int byte_of(uint2 v, int s) { return (int)(((s < 4 ? v.x : v.y) >> (8 * (s & 3))) & 0xFFu); }
