//! AVX2 kernels (with FMA and F16C): one weight row, or four, against one to four activation rows.
//!
//! Every kernel computes the canonical order documented in `avx512` (exact integer sums per block,
//! then one FMA chain per output in block order; float types in sixteen lanes), so this level
//! gives the AVX-512 and scalar levels' bits: a model's logits do not depend on the machine's
//! instruction set. At this level the matrix product uses these kernels on every route.

// Index loops over lanes and rows are deliberate: they mirror the vector lanes they fill.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::act_quant::{Q8KRow, Q8Row};
use super::decode_x86::{legacy_q, load256, KDecode, KScales};
use super::layout::Legacy;
use super::PREFETCH_BYTES;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Sum of 8 f32 lanes in a fixed order: halves, then pairs, then the last two.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn i8_bytes(v: &[i8]) -> &[u8] {
    // SAFETY: i8 and u8 have the same layout.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len()) }
}

/// Exact sums of products of signed bytes, as 8 i32 lanes (the sign trick: |x| · sign(y, x),
/// exact because activations never hold -128 and |x| <= 128).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// The f16 scale `d` (and min `m`, at +2) of the block at byte `off` of each of the four rows.
/// Assembled with scalar loads and shifts: the integer pipes are idle while vector pipes are not.
///
/// # Safety
/// Each of the four rows must hold at least 4 bytes from `off`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scales4(rows: &[*const u8; 4], off: usize, min: bool) -> (__m128, __m128) {
    // SAFETY: every block starts with at least 4 bytes (d, then m or quants).
    let f = |r: usize| unsafe { (rows[r].add(off) as *const u32).read_unaligned() as u64 };
    let (f0, f1, f2, f3) = (f(0), f(1), f(2), f(3));
    let lo = |v: u64| v & 0xffff;
    let d = lo(f0) | lo(f1) << 16 | lo(f2) << 32 | lo(f3) << 48;
    let d = _mm_cvtph_ps(_mm_cvtsi64_si128(d as i64));
    if !min {
        return (d, _mm_setzero_ps());
    }
    let m = (f0 >> 16) | (f1 >> 16) << 16 | (f2 >> 16) << 32 | (f3 >> 16) << 48;
    (d, _mm_cvtph_ps(_mm_cvtsi64_si128(m as i64)))
}

/// Lane `r` of the result is the sum of the 8 lanes of `p[r]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn reduce4(p: [__m256i; 4]) -> __m128i {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// One block's quants as this level multiplies them: the stored signed bytes for Q8_0 (the sign
/// trick of [`dot_i8`] needs them), the unsigned quants of `legacy_q` for nibble types.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn legacy_block_q<T: Legacy>(blk: &[u8]) -> __m256i {
    if T::BYTE_QUANTS {
        load256(&blk[T::QS_AT..])
    } else {
        legacy_q::<T>(blk)
    }
}

/// Lane `r`: the exact `Σ q·a` of nibble quants `q[r]` (< 32) against one Q8 block `av`
/// (|a| <= 127). The i16 pair sums of `maddubs` are added across the four rows with `hadd_epi16`
/// before widening: two levels add eight products (at most 8·31·127 = 31,496, within i16), so one
/// `madd` widens all four rows where `reduce4` needs one a row and three `hadd_epi32`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibble_isums4(q: &[__m256i; 4], av: __m256i) -> __m128i {
    let p: [__m256i; 4] = std::array::from_fn(|r| _mm256_maddubs_epi16(q[r], av));
    let h = _mm256_hadd_epi16(_mm256_hadd_epi16(p[0], p[1]), _mm256_hadd_epi16(p[2], p[3]));
    let w = _mm256_madd_epi16(h, _mm256_set1_epi16(1));
    _mm_add_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256::<1>(w))
}

/// Four legacy-type rows against `N` Q8 rows in the canonical order of the AVX-512 kernels
/// (`avx512` module docs): per block in row order, each row's exact `isum = Σ (q - OFFSET)·a`,
/// then `acc = fma(d_w·d_a, f32(isum), acc)` and, for Q4_1 / Q5_1, `acc = fma(m_w, s_a, acc)`. Lane
/// `r` of the 4-lane accumulator is weight row `r`, so each output gets exactly the operations of
/// the one-row chain, whatever the batch, and the same bits as the AVX-512 and scalar levels.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C; each weight row must hold `a[0].d.len()` blocks of `T`,
/// and every activation row that many blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot4xn_legacy<T: Legacy, const N: usize>(w: [&[u8]; 4], a: [&Q8Row; N]) -> [[f32; 4]; N] {
    let nb = a[0].d.len();
    assert!(w.iter().all(|r| r.len() >= nb * T::BYTES));
    assert!(a
        .iter()
        .all(|a| a.d.len() == nb && a.qs.len() >= 32 * nb && a.sum.len() >= nb && a.s.len() >= nb));
    let rows = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
    let mut acc = [_mm_setzero_ps(); N];
    // Raw pointers in the loop: the sizes were asserted above, and per-block slice checks cost as
    // much as the arithmetic on these short rows.
    let qa: [*const u8; N] = std::array::from_fn(|n| a[n].qs.as_ptr() as *const u8);
    for b in 0..nb {
        let mut q = [_mm256_setzero_si256(); 4];
        for r in 0..4 {
            // Four sequential streams (see `matmul::dot_rows`); prefetching never faults.
            _mm_prefetch::<_MM_HINT_T0>(rows[r].wrapping_add(b * T::BYTES + PREFETCH_BYTES) as *const i8);
            // SAFETY: block b of row r is in bounds (asserted).
            let blk = unsafe { std::slice::from_raw_parts(rows[r].add(b * T::BYTES), T::BYTES) };
            q[r] = legacy_block_q::<T>(blk);
        }
        // SAFETY: block b of every row is in bounds (asserted).
        let (dw, mw) = unsafe { scales4(&rows, b * T::BYTES, T::HAS_MIN) };
        for n in 0..N {
            // SAFETY (all): activation block b of row n is in bounds (asserted).
            let (av, sum, d, s) = unsafe {
                (
                    _mm256_loadu_si256(qa[n].add(32 * b) as *const __m256i),
                    *a[n].sum.get_unchecked(b),
                    *a[n].d.get_unchecked(b),
                    *a[n].s.get_unchecked(b),
                )
            };
            let mut isum = if T::BYTE_QUANTS {
                reduce4(std::array::from_fn(|r| dot_i8(q[r], av)))
            } else {
                nibble_isums4(&q, av)
            };
            if !T::BYTE_QUANTS && T::OFFSET != 0 {
                isum = _mm_sub_epi32(isum, _mm_set1_epi32(sum << T::SHIFT));
            }
            acc[n] = _mm_fmadd_ps(_mm_mul_ps(dw, _mm_set1_ps(d)), _mm_cvtepi32_ps(isum), acc[n]);
            if T::HAS_MIN {
                acc[n] = _mm_fmadd_ps(mw, _mm_set1_ps(s), acc[n]);
            }
        }
    }
    let mut out = [[0.0f32; 4]; N];
    for n in 0..N {
        // SAFETY: 4 floats.
        unsafe { _mm_storeu_ps(out[n].as_mut_ptr(), acc[n]) };
    }
    out
}

/// The scales of a K-quant super-block as `k_scaled_sums` takes them: each 128-bit half of the 16
/// i16 sub-block scales broadcast to both halves of a vector.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k_scale_halves(kb: &KScales) -> [__m256i; 2] {
    [
        _mm256_permute2x128_si256::<0x00>(kb.scales, kb.scales),
        _mm256_permute2x128_si256::<0x11>(kb.scales, kb.scales),
    ]
}

/// The 8 partial sums (lanes) of `Σ_j scale_j·Σ q·a` over a super-block of unsigned quants `q`
/// against a Q8_K block `qa`; their sum is exact.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k_scaled_sums(q: &[__m256i; 8], sc: &[__m256i; 2], qa: &[u8]) -> __m256i {
    assert!(qa.len() >= 256);
    // Chunk i (32 elements) covers sub-blocks 2i and 2i + 1: i16 lanes 0..8 and 8..16 of the
    // maddubs result, so each takes its pair of scales from the matching half.
    let pick = |i: usize| {
        let (lo, hi) = ((4 * i) as i8, (4 * i + 2) as i8);
        _mm256_setr_epi8(
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            lo,
            lo + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
            hi,
            hi + 1,
        )
    };
    let mut s = _mm256_setzero_si256();
    for i in 0..8 {
        // Unsigned quants are at most 63 and |a| <= 127, so the i16 pair sums cannot saturate.
        let p = _mm256_maddubs_epi16(q[i], load256(&qa[32 * i..]));
        let scv = _mm256_shuffle_epi8(sc[i / 4], pick(i % 4));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(p, scv));
    }
    s
}

/// The exact integer parts of a K-quant super-block against a Q8_K block:
/// `sumi = Σ_j scale_j·Σ (q - OFFSET)·a` and `summ = Σ_j min_j·bsum_j`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn k_ints<T: KDecode>(q: &[__m256i; 8], kb: &KScales, qa: &[u8], bsums: &[i16]) -> (i32, i32) {
    assert!(bsums.len() >= 16);
    let s = k_scaled_sums(q, &k_scale_halves(kb), qa);
    // SAFETY: 16 i16 are in bounds.
    let bs = unsafe { _mm256_loadu_si256(bsums.as_ptr() as *const __m256i) };
    let mut sumi = hsum_i32(s);
    if T::OFFSET != 0 {
        sumi = sumi.wrapping_sub((T::OFFSET as i32).wrapping_mul(hsum_i32(_mm256_madd_epi16(kb.scales, bs))));
    }
    let summ = if T::HAS_MIN {
        hsum_i32(_mm256_madd_epi16(kb.mins, bs))
    } else {
        0
    };
    (sumi, summ)
}

/// K-quant dot product in the canonical form shared with the AVX-512 GEMM: per super-block
/// `acc = fma(d·d_a, sumi, acc)`, then (types with mins) `acc = fnmadd(dmin·d_a, summ, acc)`.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C; `w` must hold `a.d.len()` blocks of `T`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_kquant<T: KDecode>(w: &[u8], a: &Q8KRow) -> f32 {
    let qa = i8_bytes(a.qs);
    let mut acc = _mm_setzero_ps();
    for (b, blk) in w.chunks_exact(T::BYTES).enumerate().take(a.d.len()) {
        // SAFETY: features and block length are guaranteed by the caller.
        let (kb, q) = unsafe { (T::scales(blk), T::quants(blk)) };
        let (sumi, summ) = k_ints::<T>(&q, &kb, &qa[256 * b..], &a.bsums[16 * b..]);
        let da = a.d[b];
        acc = _mm_fmadd_ss(_mm_set_ss(kb.d * da), _mm_set_ss(sumi as f32), acc);
        if T::HAS_MIN {
            acc = _mm_fnmadd_ss(_mm_set_ss(kb.dmin * da), _mm_set_ss(summ as f32), acc);
        }
    }
    _mm_cvtss_f32(acc)
}

/// Four K-quant rows against `N` Q8_K rows (a decode batch, or prefill rows at this level): each
/// weight super-block decoded once for them all, and each output formed lane-wise by the
/// operations of [`dot_kquant`] (weight row `r` in lane `r`), so its bits do not depend on the
/// batch or on how many rows share a pass.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C; each weight row must hold `a[0].d.len()` blocks of `T`,
/// and every activation row that many blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot4xn_kquant<T: KDecode, const N: usize>(w: [&[u8]; 4], a: [&Q8KRow; N]) -> [[f32; 4]; N] {
    let nb = a[0].d.len();
    assert!(w.iter().all(|r| r.len() >= nb * T::BYTES));
    assert!(a
        .iter()
        .all(|a| a.d.len() == nb && a.qs.len() >= 256 * nb && a.bsums.len() >= 16 * nb));
    let mut acc = [_mm_setzero_ps(); N];
    let zero = _mm256_setzero_si256();
    for b in 0..nb {
        // Per activation row and weight row, the unreduced lanes of the scaled sums; reduced four
        // weight rows at a time below (with the offset and min terms), so each output's integers
        // are those of `k_ints`.
        let mut sums = [[zero; 4]; N];
        let (mut scales, mut mins) = ([zero; 4], [zero; 4]);
        let (mut d, mut dmin) = ([0f32; 4], [0f32; 4]);
        for r in 0..4 {
            // SAFETY (all slices): block b of weight row r and of every activation row is in
            // bounds (asserted); unchecked, as the per-block checks cost as much as the arithmetic.
            let blk = unsafe { std::slice::from_raw_parts(w[r].as_ptr().add(b * T::BYTES), T::BYTES) };
            for off in (0..T::BYTES).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(blk.as_ptr().wrapping_add(PREFETCH_BYTES + off) as *const i8);
            }
            // SAFETY: features per the function contract; a whole block.
            let (kb, q) = unsafe { (T::scales(blk), T::quants(blk)) };
            let sc = k_scale_halves(&kb);
            for n in 0..N {
                let qa = unsafe { std::slice::from_raw_parts(a[n].qs.as_ptr().add(256 * b) as *const u8, 256) };
                sums[n][r] = k_scaled_sums(&q, &sc, qa);
            }
            (scales[r], mins[r], d[r], dmin[r]) = (kb.scales, kb.mins, kb.d, kb.dmin);
        }
        // SAFETY (all loads): four lanes each.
        let (dv, dminv) = unsafe { (_mm_loadu_ps(d.as_ptr()), _mm_loadu_ps(dmin.as_ptr())) };
        for n in 0..N {
            // SAFETY (both): as above.
            let bs = unsafe { _mm256_loadu_si256(a[n].bsums.as_ptr().add(16 * b) as *const __m256i) };
            let da = _mm_set1_ps(unsafe { *a[n].d.get_unchecked(b) });
            let mut si = reduce4(sums[n]);
            if T::OFFSET != 0 {
                let offs = reduce4(std::array::from_fn(|r| _mm256_madd_epi16(scales[r], bs)));
                si = _mm_sub_epi32(si, _mm_mullo_epi32(offs, _mm_set1_epi32(T::OFFSET as i32)));
            }
            acc[n] = _mm_fmadd_ps(_mm_mul_ps(dv, da), _mm_cvtepi32_ps(si), acc[n]);
            if T::HAS_MIN {
                let sm = reduce4(std::array::from_fn(|r| _mm256_madd_epi16(mins[r], bs)));
                acc[n] = _mm_fnmadd_ps(_mm_mul_ps(dminv, da), _mm_cvtepi32_ps(sm), acc[n]);
            }
        }
    }
    let mut out = [[0.0f32; 4]; N];
    for n in 0..N {
        // SAFETY: 4 floats.
        unsafe { _mm_storeu_ps(out[n].as_mut_ptr(), acc[n]) };
    }
    out
}

/// Eight float weights starting at element `i`, widened to f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_w8<const F: u8>(w: &[u8], i: usize) -> __m256 {
    use super::layout::Float;
    match Float::from_u8(F) {
        // SAFETY (all arms): the caller checked that 8 elements from `i` are in bounds.
        Float::F32 => unsafe { _mm256_loadu_ps(w[4 * i..4 * i + 32].as_ptr() as *const f32) },
        Float::F16 => _mm256_cvtph_ps(super::decode_x86::load128(&w[2 * i..2 * i + 16])),
        Float::BF16 => {
            let h = super::decode_x86::load128(&w[2 * i..2 * i + 16]);
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

/// Float weights against f32 activations in the canonical float order of the AVX-512 level
/// (`avx512` module docs): sixteen accumulator lanes (two 8-lane halves here), `acc = fma(w, x,
/// acc)` over chunks of 16 in order with the tail chunk zero-padded (an `fma(0, 0, acc)` leaves a
/// lane as it is), then the 16 → 8 → 4 → 2 → 1 tree of `avx512::hsum16`.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C; `w` must hold `x.len()` elements of type `F`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_float<const F: u8>(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    // SAFETY: the callers keep 8 elements from `i` in bounds.
    let xv = |x: &[f32], i: usize| unsafe { _mm256_loadu_ps(x[i..i + 8].as_ptr()) };
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i + 16 <= n {
        lo = _mm256_fmadd_ps(load_w8::<F>(w, i), xv(x, i), lo);
        hi = _mm256_fmadd_ps(load_w8::<F>(w, i + 8), xv(x, i + 8), hi);
        i += 16;
    }
    if i < n {
        let ty = super::layout::Float::from_u8(F);
        let (mut wt, mut xt) = ([0.0f32; 16], [0.0f32; 16]);
        for j in i..n {
            wt[j - i] = super::layout::float_at(ty, w, j);
            xt[j - i] = x[j];
        }
        lo = _mm256_fmadd_ps(xv(&wt, 0), xv(&xt, 0), lo);
        hi = _mm256_fmadd_ps(xv(&wt, 8), xv(&xt, 8), hi);
    }
    hsum_ps(_mm256_add_ps(lo, hi))
}
