//! AVX-512 kernels of the attention sweeps. Each returns the bits of its portable counterpart in
//! `mod.rs`: the same multiplications and additions in the same order, never fused, with sixteen keys
//! (or values) side by side in the vector lanes where the portable code takes them one at a time.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use half::f16;

use super::finish_dot;

/// f16 to f32, sixteen at a time (`src.len()` a multiple of 16; the conversion is exact).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn to_f32(src: &[f16], dst: &mut [f32]) {
    debug_assert!(src.len().is_multiple_of(16) && dst.len() >= src.len());
    for c in 0..src.len() / 16 {
        let h = _mm256_loadu_si256(src.as_ptr().add(16 * c) as *const __m256i);
        _mm512_storeu_ps(dst.as_mut_ptr().add(16 * c), _mm512_cvtph_ps(h));
    }
}

/// `dot` with the partial sums held in one vector register.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let chunks = a.len().min(b.len()) / 16;
    let mut acc = _mm512_setzero_ps();
    for c in 0..chunks {
        let x = _mm512_loadu_ps(a.as_ptr().add(16 * c));
        let y = _mm512_loadu_ps(b.as_ptr().add(16 * c));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(x, y));
    }
    if chunks * 16 == a.len() {
        // The tree 16 → 8 → 4 → 2 → 1 of `finish_dot`, in registers: upper half onto lower each time.
        let lo8 = _mm512_castps512_ps256(acc);
        let hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
        let s8 = _mm256_add_ps(lo8, hi8);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
        return _mm_cvtss_f32(s1);
    }
    let mut lanes = [0f32; 16];
    _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
    finish_dot(lanes, a, b, chunks * 16)
}

/// `out[j] = dot(q, key row j) * scale` (`q.len()` a multiple of 16), sixteen keys at a time.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn scores(q: &[f32], keys: &[f32], scale: f32, out: &mut [f32]) {
    let d = q.len();
    debug_assert!(d.is_multiple_of(16) && keys.len() == out.len() * d);
    let scale_v = _mm512_set1_ps(scale);
    let mut j = 0;
    while j + 16 <= out.len() {
        let s = dot16(q, keys.as_ptr().add(j * d));
        _mm512_storeu_ps(out.as_mut_ptr().add(j), _mm512_mul_ps(s, scale_v));
        j += 16;
    }
    for (s, key) in out[j..].iter_mut().zip(keys[j * d..].chunks_exact(d)) {
        *s = dot(q, key) * scale;
    }
}

/// The sixteen dot products of `q` with the rows at `keys` (row k at `keys + k * q.len()`), lane k
/// holding key k's: each key's sixteen partial sums as `dot` forms them, then `finish_dot`'s tree
/// (16 → 8 → 4 → 2 → 1), each step adding the same pairs for all sixteen keys at once.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn dot16(q: &[f32], keys: *const f32) -> __m512 {
    let d = q.len();
    // Slot s holds key 4 (s mod 4) + s / 4: the tree below leaves slot 4j + l's sum in lane 4l + j,
    // so each key lands in its own lane.
    let key = |slot: usize| keys.add(d * (4 * (slot % 4) + slot / 4));
    let mut acc = [_mm512_setzero_ps(); 16];
    for c in 0..d / 16 {
        let qc = _mm512_loadu_ps(q.as_ptr().add(16 * c));
        for (slot, a) in acc.iter_mut().enumerate() {
            *a = _mm512_add_ps(*a, _mm512_mul_ps(qc, _mm512_loadu_ps(key(slot).add(16 * c))));
        }
    }
    // 16 → 8: slot pairs side by side, lanes 0..8 plus lanes 8..16 of each.
    let mut s8 = [_mm512_setzero_ps(); 8];
    for (m, s) in s8.iter_mut().enumerate() {
        let (a, b) = (acc[2 * m], acc[2 * m + 1]);
        let lo = _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b);
        let hi = _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b);
        *s = _mm512_add_ps(lo, hi);
    }
    // 8 → 4: four slots a register, one 128-bit lane each.
    let mut s4 = [_mm512_setzero_ps(); 4];
    for (n, s) in s4.iter_mut().enumerate() {
        let (a, b) = (s8[2 * n], s8[2 * n + 1]);
        let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b);
        let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b);
        *s = _mm512_add_ps(lo, hi);
    }
    // 4 → 2: in each 128-bit lane, elements 0, 1 plus elements 2, 3, of two slots.
    let s2a = _mm512_add_ps(
        _mm512_shuffle_ps::<0b01_00_01_00>(s4[0], s4[1]),
        _mm512_shuffle_ps::<0b11_10_11_10>(s4[0], s4[1]),
    );
    let s2b = _mm512_add_ps(
        _mm512_shuffle_ps::<0b01_00_01_00>(s4[2], s4[3]),
        _mm512_shuffle_ps::<0b11_10_11_10>(s4[2], s4[3]),
    );
    // 2 → 1: element 0 plus element 1 of each slot's pair.
    _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(s2a, s2b),
        _mm512_shuffle_ps::<0b11_01_11_01>(s2a, s2b),
    )
}

/// `softmax_f16_weights`, sixteen keys at a time: the same maximum, `exp_nonpositive` and `sum_f64` in
/// vector lanes, the same scaling and rounding.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn softmax_f16_weights(s: &mut [f32]) {
    let n = s.len();
    let whole = n / 16 * 16;
    let mut max_v = _mm512_set1_ps(f32::NEG_INFINITY);
    for c in 0..n / 16 {
        max_v = _mm512_max_ps(max_v, _mm512_loadu_ps(s.as_ptr().add(16 * c)));
    }
    let max = s[whole..].iter().cloned().fold(_mm512_reduce_max_ps(max_v), f32::max);
    let max_v = _mm512_set1_ps(max);
    // Sum i mod 16 of `sum_f64` is lane i of (lo, hi): lanes 0..8 and 8..16 of each chunk.
    let (mut lo, mut hi) = (_mm512_setzero_pd(), _mm512_setzero_pd());
    for c in 0..n / 16 {
        let p = s.as_mut_ptr().add(16 * c);
        let e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(p), max_v));
        _mm512_storeu_ps(p, e);
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi = _mm512_add_pd(
            hi,
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e)))),
        );
    }
    let mut acc = [0f64; 16];
    _mm512_storeu_pd(acc.as_mut_ptr(), lo);
    _mm512_storeu_pd(acc.as_mut_ptr().add(8), hi);
    for (i, x) in s[whole..].iter_mut().enumerate() {
        *x = super::exp_nonpositive(*x - max);
        acc[i] += *x as f64;
    }
    let inv = (1.0 / super::tree_sum(acc)) as f32;
    let inv_v = _mm512_set1_ps(inv);
    for c in 0..n / 16 {
        let p = s.as_mut_ptr().add(16 * c);
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            _mm512_loadu_ps(p),
            inv_v,
        ));
        _mm512_storeu_ps(p, _mm512_cvtph_ps(h));
    }
    s[whole..]
        .iter_mut()
        .for_each(|x| *x = f16::from_f32(*x * inv).to_f32());
}

/// `exp_nonpositive` in sixteen lanes: the same operations, the same constants.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn exp_nonpositive(x: __m512) -> __m512 {
    use super::{EXP_FLUSH_BELOW, EXP_LN2_HI, EXP_LN2_LO, EXP_POLY};
    let kept = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(EXP_FLUSH_BELOW));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_add_ps(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
        _mm512_set1_ps(0.5),
    ));
    let r = _mm512_sub_ps(
        _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(EXP_LN2_HI))),
        _mm512_mul_ps(n, _mm512_set1_ps(EXP_LN2_LO)),
    );
    let mut y = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(c));
    }
    let e_r = _mm512_add_ps(
        _mm512_add_ps(_mm512_mul_ps(y, _mm512_mul_ps(r, r)), r),
        _mm512_set1_ps(1.0),
    );
    let two_n = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    )));
    let e = _mm512_mul_ps(e_r, two_n);
    // Flushed lanes are 0; NaN lanes keep their NaN, as the portable code returns x.
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
    _mm512_mask_mov_ps(_mm512_maskz_mov_ps(kept, e), nan, x)
}

/// `weighted_rows` with up to eight 16-lane partial sums held in registers across the rows.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn weighted_rows(partial: &mut [f32], weights: &[f32], rows: &[f32]) {
    let d = partial.len();
    debug_assert!(d.is_multiple_of(16) && rows.len() == weights.len() * d);
    let mut j = 0;
    while j < d {
        let (o, r) = (partial.as_mut_ptr().add(j), rows.as_ptr().add(j));
        // A fixed count of registers, so the loop over them unrolls.
        let lanes = match (d - j) / 16 {
            1 => weighted_columns::<1>(o, weights, r, d),
            2 => weighted_columns::<2>(o, weights, r, d),
            3 => weighted_columns::<3>(o, weights, r, d),
            4 => weighted_columns::<4>(o, weights, r, d),
            5 => weighted_columns::<5>(o, weights, r, d),
            6 => weighted_columns::<6>(o, weights, r, d),
            7 => weighted_columns::<7>(o, weights, r, d),
            _ => weighted_columns::<8>(o, weights, r, d),
        };
        j += 16 * lanes;
    }
}

/// Columns `0..16 L` (of `partial` and of each row at `rows + i d`) of `weighted_rows`; returns L.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn weighted_columns<const L: usize>(partial: *mut f32, weights: &[f32], rows: *const f32, d: usize) -> usize {
    let mut acc = [_mm512_setzero_ps(); L];
    for (i, &w) in weights.iter().enumerate() {
        let wv = _mm512_set1_ps(w);
        let row = rows.add(i * d);
        for (k, a) in acc.iter_mut().enumerate() {
            *a = _mm512_add_ps(*a, _mm512_mul_ps(wv, _mm512_loadu_ps(row.add(16 * k))));
        }
    }
    for (k, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(partial.add(16 * k), *a);
    }
    L
}
