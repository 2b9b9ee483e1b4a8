//! AVX2 kernels (with FMA and F16C): one weight row against one activation row.
//!
//! Legacy types accumulate `d_w·d_a·(block's 8 partial sums)` in an 8-lane f32 vector with FMA
//! and reduce it once at the end (as ggml does). K-quants use the per-super-block form documented
//! in `avx512` (exact integer sums, then a scalar FMA chain). At this level the matrix product
//! uses these kernels on every route, so any fixed order is exact across routes.

// Index loops over lanes and rows are deliberate: they mirror the vector lanes they fill.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::act_quant::{Q8KRow, Q8Row};
use super::decode_x86::{legacy_q, load256, KDecode, KScales};
use super::layout::Legacy;

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

/// The 8 partial sums of one block's products `Σ q·a` (nibble types: without the offset).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn legacy_prod<T: Legacy>(blk: &[u8], qa: &[u8], b: usize) -> __m256 {
    let q = legacy_q::<T>(blk);
    let av = load256(&qa[32 * b..]);
    let p = if T::BYTE_QUANTS {
        // Back to the stored signed bytes; unsigned·signed pairs could saturate maddubs.
        dot_i8(_mm256_xor_si256(q, _mm256_set1_epi8(-128)), av)
    } else {
        // Nibbles (< 32) times activations (|a| <= 127): pair sums fit i16.
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), _mm256_set1_epi16(1))
    };
    _mm256_cvtepi32_ps(p)
}

/// The f16 fields at byte `off` of two blocks, as f32 lanes 0 and 1. (Both lanes are used, so
/// LLVM loads a whole register; for a lone f16 it inserts into whatever register is at hand — a
/// false dependency, seen on a loop's accumulator.)
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16x2(b0: &[u8], b1: &[u8], off: usize) -> __m128 {
    let h = |b: &[u8]| u16::from_le_bytes([b[off], b[off + 1]]) as u32;
    _mm_cvtph_ps(_mm_cvtsi32_si128((h(b0) | (h(b1) << 16)) as i32))
}

/// `Σ_b d_w·d_a·Σ (q - OFFSET)·a [+ m_w·s_a]`, two blocks per step: the products go to two
/// 8-lane accumulators (even and odd blocks, halving the FMA dependency chain); the per-block
/// offset and min terms to a 2-lane one.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C; `w` must hold `a.d.len()` blocks of `T`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_legacy<T: Legacy>(w: &[u8], a: &Q8Row) -> f32 {
    let nb = a.d.len();
    assert!(w.len() >= nb * T::BYTES && a.sum.len() >= nb && a.s.len() >= nb);
    let qa = i8_bytes(a.qs);
    let (mut acc0, mut acc1, mut acc_e) = (_mm256_setzero_ps(), _mm256_setzero_ps(), _mm_setzero_ps());
    // Lanes 0 and 1 of two per-block f32 / i32 arrays at `b` (lanes 2, 3 zero).
    // SAFETY (both): the callers below keep b + 1 < nb.
    let two_f = |v: &[f32], b: usize| unsafe { _mm_castpd_ps(_mm_load_sd(v.as_ptr().add(b) as *const f64)) };
    let two_i = |v: &[i32], b: usize| unsafe { _mm_cvtepi32_ps(_mm_loadl_epi64(v.as_ptr().add(b) as *const __m128i)) };
    let mut b = 0;
    while b + 2 <= nb {
        let (blk0, blk1) = (&w[b * T::BYTES..], &w[(b + 1) * T::BYTES..]);
        let s = _mm_mul_ps(f16x2(blk0, blk1, 0), two_f(a.d, b));
        acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(s), legacy_prod::<T>(blk0, qa, b), acc0);
        acc1 = _mm256_fmadd_ps(
            _mm256_broadcastss_ps(_mm_movehdup_ps(s)),
            legacy_prod::<T>(blk1, qa, b + 1),
            acc1,
        );
        if !T::BYTE_QUANTS && T::OFFSET != 0 {
            acc_e = _mm_fnmadd_ps(_mm_mul_ps(s, _mm_set1_ps(T::OFFSET as f32)), two_i(a.sum, b), acc_e);
        }
        if T::HAS_MIN {
            acc_e = _mm_fmadd_ps(f16x2(blk0, blk1, 2), two_f(a.s, b), acc_e);
        }
        b += 2;
    }
    let mut tail = 0.0f32;
    if b < nb {
        // An odd last block: lane 0 of the same steps.
        let blk = &w[b * T::BYTES..];
        let s = _mm_cvtss_f32(f16x2(blk, blk, 0)) * a.d[b];
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s), legacy_prod::<T>(blk, qa, b), acc0);
        if !T::BYTE_QUANTS && T::OFFSET != 0 {
            tail -= s * T::OFFSET as f32 * a.sum[b] as f32;
        }
        if T::HAS_MIN {
            tail += _mm_cvtss_f32(f16x2(blk, blk, 2)) * a.s[b];
        }
    }
    let e = _mm_add_ss(acc_e, _mm_movehdup_ps(acc_e));
    hsum_ps(_mm256_add_ps(acc0, acc1)) + (_mm_cvtss_f32(e) + tail)
}

/// The exact integer parts of a K-quant super-block against a Q8_K block:
/// `sumi = Σ_j scale_j·Σ (q - OFFSET)·a` and `summ = Σ_j min_j·bsum_j`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn k_ints<T: KDecode>(q: &[__m256i; 8], kb: &KScales, qa: &[u8], bsums: &[i16]) -> (i32, i32) {
    assert!(qa.len() >= 256 && bsums.len() >= 16);
    // Chunk i (32 elements) covers sub-blocks 2i and 2i + 1: i16 lanes 0..8 and 8..16 of the
    // maddubs result. Broadcast each 128-bit half of the scales, then pick the pair per chunk.
    let sc = [
        _mm256_permute2x128_si256::<0x00>(kb.scales, kb.scales),
        _mm256_permute2x128_si256::<0x11>(kb.scales, kb.scales),
    ];
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

/// Float weights against f32 activations: four 8-lane FMA accumulators, then a scalar tail.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C; `w` must hold `x.len()` elements of type `F`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_float<const F: u8>(w: &[u8], x: &[f32]) -> f32 {
    let n = x.len();
    let xv = |i: usize| unsafe { _mm256_loadu_ps(x[i..i + 8].as_ptr()) };
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_fmadd_ps(load_w8::<F>(w, i + 8 * j), xv(i + 8 * j), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(load_w8::<F>(w, i), xv(i), acc[0]);
        i += 8;
    }
    let mut sum = hsum_ps(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    for j in i..n {
        sum += super::layout::float_at(super::layout::Float::from_u8(F), w, j) * x[j];
    }
    sum
}
