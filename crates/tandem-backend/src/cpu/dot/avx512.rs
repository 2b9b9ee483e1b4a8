//! AVX-512 (F, BW, VL, DQ, VNNI) row kernels, used for matrix-vector products. They compute
//! every output in exactly the canonical order that the GEMM microkernels of `gemm_avx512` use,
//! so a value is bit-identical whichever route produced it:
//!
//! * legacy types, per 32-element block `b` in row order (acc starts at +0.0):
//!   `isum = Σ (q - OFFSET)·a` (exact), `acc = fma(d_w·d_a, f32(isum), acc)`, then for Q4_1 / Q5_1
//!   `acc = fma(m_w, s_a, acc)`;
//! * K-quants, per 256-element super-block in row order: exact `sumi = Σ_j sc_j·Σ (q - OFFSET)·a`
//!   and `summ = Σ_j m_j·bsum_j`, then `acc = fma(d·d_a, f32(sumi), acc)` and, for types with
//!   mins, `acc = fnmadd(dmin·d_a, f32(summ), acc)` (the AVX2 level uses the same form);
//! * float types: one 16-lane accumulator per output, `acc = fma(w[16c..], x[16c..], acc)` over
//!   chunks `c` in order (the tail chunk masked), then `hsum16`.
//!
//! Four weight rows are processed together against one activation row: the activation block is
//! loaded once, and the four per-row integer sums are reduced together and combined in one
//! 4-lane vector (lane-wise the same operations as the scalar chain of a single row). For a decode
//! batch, the quantized kernels take two to four activation rows a pass (`dot4xn_legacy`,
//! `dot4xn_kquant`, whose one-row cases are `dot4_legacy` and `dot4_kquant`): each weight block is
//! decoded once for them all, and each row's outputs come from the one-row operations.

// Index loops over lanes and rows are deliberate: they mirror the vector lanes they fill.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::act_quant::{Q8KRow, Q8Row};
use super::avx2::{hsum_i32, reduce4, scales4};
use super::decode_x86::{legacy_q, load256, KDecode};
use super::layout::{Float, Legacy};
use super::PREFETCH_BYTES;

/// The 64 unsigned quants of two consecutive blocks starting at `p`, in element order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn legacy_q2<T: Legacy>(p: *const u8) -> __m512i {
    // SAFETY: the caller guarantees two whole blocks at `p`.
    unsafe {
        let p1 = p.add(T::BYTES);
        if T::BYTE_QUANTS {
            let lo = _mm256_loadu_si256(p.add(T::QS_AT) as *const __m256i);
            let hi = _mm256_loadu_si256(p1.add(T::QS_AT) as *const __m256i);
            return _mm512_xor_si512(
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi),
                _mm512_set1_epi8(-128),
            );
        }
        // 128-bit lanes [qs0, qs0, qs1, qs1], shifted by [0, 4, 0, 4]: low then high nibbles.
        let a = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.add(T::QS_AT) as *const __m128i));
        let b = _mm256_broadcastsi128_si256(_mm_loadu_si128(p1.add(T::QS_AT) as *const __m128i));
        let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
        let sh = _mm512_setr_epi64(
            0,
            0,
            0x0004_0004_0004_0004,
            0x0004_0004_0004_0004,
            0,
            0,
            0x0004_0004_0004_0004,
            0x0004_0004_0004_0004,
        );
        let q = _mm512_and_si512(_mm512_srlv_epi16(z, sh), _mm512_set1_epi8(0xF));
        match T::QH_AT {
            Some(o) => {
                // Bit i of the two 32-bit masks is the 5th bit of byte i: add 16 there.
                let h0 = (p.add(o) as *const u32).read_unaligned() as u64;
                let h1 = (p1.add(o) as *const u32).read_unaligned() as u64;
                _mm512_mask_add_epi8(q, h0 | (h1 << 32), q, _mm512_set1_epi8(0x10))
            }
            None => q,
        }
    }
}

/// For `p[r]` holding two blocks' partial sums (lanes 0..8, 8..16): the four rows' sums of the
/// first block, and of the second.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
fn reduce4x2(p: [__m512i; 4]) -> (__m128i, __m128i) {
    let x01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
    let x23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
    // Each 128-bit lane now holds the four rows' sums of its four source lanes.
    let y = _mm512_add_epi32(_mm512_unpacklo_epi64(x01, x23), _mm512_unpackhi_epi64(x01, x23));
    let z = _mm512_add_epi32(y, _mm512_shuffle_i32x4::<0b10_11_00_01>(y, y));
    (_mm512_castsi512_si128(z), _mm512_extracti32x4_epi32::<2>(z))
}

/// Four legacy-type rows against one Q8 row.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ/VNNI; each row must hold `a.d.len()` blocks of `T`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot4_legacy<T: Legacy>(w: [&[u8]; 4], a: &Q8Row) -> [f32; 4] {
    // SAFETY: per the function contract.
    unsafe { dot4xn_legacy::<T, 1>(w, [a])[0] }
}

/// Four legacy-type rows against `N` Q8 rows (a decode batch): each weight block decoded once for
/// all of them, and each activation row's outputs formed by exactly the operations of the one-row
/// form (`dot4_legacy` is this with `N = 1`), so a row's results do not depend on its batch.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ/VNNI; each weight row must hold `a[0].d.len()` blocks of
/// `T`, and every activation row that many blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot4xn_legacy<T: Legacy, const N: usize>(w: [&[u8]; 4], a: [&Q8Row; N]) -> [[f32; 4]; N] {
    let nb = a[0].d.len();
    assert!(w.iter().all(|r| r.len() >= nb * T::BYTES));
    assert!(a
        .iter()
        .all(|a| a.d.len() == nb && a.qs.len() >= 32 * nb && a.sum.len() >= nb && a.s.len() >= nb));
    let rows = [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()];
    let mut acc = [_mm_setzero_ps(); N];
    // The canonical per-block step (module docs), for block `b` of activation row `a` with the
    // weight rows' scales `(dw, mw)` and sums `isum`.
    let step = |acc: __m128, a: &Q8Row, b: usize, (dw, mw): (__m128, __m128), isum: __m128i| {
        let mut isum = isum;
        if T::OFFSET != 0 {
            isum = _mm_sub_epi32(isum, _mm_set1_epi32(a.sum[b] << T::SHIFT));
        }
        let mut acc = _mm_fmadd_ps(_mm_mul_ps(dw, _mm_set1_ps(a.d[b])), _mm_cvtepi32_ps(isum), acc);
        if T::HAS_MIN {
            acc = _mm_fmadd_ps(mw, _mm_set1_ps(a.s[b]), acc);
        }
        acc
    };
    let mut b = 0;
    // Two blocks per row at a time: one 64-byte multiply per row, then one shared reduction.
    // (Plain loops: closures passed to iterator adapters would not inherit target features.)
    while b + 2 <= nb {
        let mut q = [_mm512_setzero_si512(); 4];
        for r in 0..4 {
            // Each row is a stretch of one sequential stream (see `matmul::dot_rows`); fetching
            // ahead keeps DRAM busy when the streams are too short for the hardware prefetcher.
            // Prefetching never faults, so running past the end of the matrix is harmless.
            _mm_prefetch::<_MM_HINT_T0>(rows[r].wrapping_add(b * T::BYTES + PREFETCH_BYTES) as *const i8);
            // SAFETY: blocks b and b + 1 are in bounds.
            q[r] = unsafe { legacy_q2::<T>(rows[r].add(b * T::BYTES)) };
        }
        // SAFETY: blocks b and b + 1 of every row.
        let (s0, s1) = unsafe {
            (
                scales4(&rows, b * T::BYTES, T::HAS_MIN),
                scales4(&rows, (b + 1) * T::BYTES, T::HAS_MIN),
            )
        };
        for n in 0..N {
            // SAFETY: activation bytes 32b..32b + 64 are in bounds.
            let av = unsafe { _mm512_loadu_si512(a[n].qs.as_ptr().add(32 * b) as *const _) };
            let mut p = [_mm512_setzero_si512(); 4];
            for r in 0..4 {
                p[r] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r], av);
            }
            let (i0, i1) = reduce4x2(p);
            acc[n] = step(acc[n], a[n], b, s0, i0);
            acc[n] = step(acc[n], a[n], b + 1, s1, i1);
        }
        b += 2;
    }
    if b < nb {
        let mut q = [_mm256_setzero_si256(); 4];
        for r in 0..4 {
            q[r] = legacy_q::<T>(&w[r][b * T::BYTES..]);
        }
        // SAFETY: block b of every row.
        let sb = unsafe { scales4(&rows, b * T::BYTES, T::HAS_MIN) };
        for n in 0..N {
            // SAFETY: the row's 32·nb quants (asserted), read as bytes.
            let qa = unsafe { std::slice::from_raw_parts(a[n].qs.as_ptr() as *const u8, 32 * nb) };
            let av = load256(&qa[32 * b..]);
            let mut p = [_mm256_setzero_si256(); 4];
            for r in 0..4 {
                p[r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q[r], av);
            }
            acc[n] = step(acc[n], a[n], b, sb, reduce4(p));
        }
    }
    let mut out = [[0.0f32; 4]; N];
    for n in 0..N {
        // SAFETY: 4 floats.
        unsafe { _mm_storeu_ps(out[n].as_mut_ptr(), acc[n]) };
    }
    out
}

/// One K-quant row against one Q8_K row, in the canonical form above (the integer parts are
/// computed 64 elements per instruction).
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ/VNNI; `w` must hold `a.d.len()` blocks of `T`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot_kquant<T: KDecode>(w: &[u8], a: &Q8KRow) -> f32 {
    let nb = a.d.len();
    assert!(w.len() >= nb * T::BYTES && a.qs.len() >= 256 * nb && a.bsums.len() >= 16 * nb);
    let qa = a.qs.as_ptr() as *const u8;
    let zero = _mm512_setzero_si512();
    // After the reduction below, dword 4q + i holds sub-block 4i + q: permute scales alike.
    let perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut acc = _mm_setzero_ps();
    for b in 0..nb {
        let blk = &w[b * T::BYTES..(b + 1) * T::BYTES];
        for off in (0..T::BYTES).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(blk.as_ptr().wrapping_add(PREFETCH_BYTES + off) as *const i8);
        }
        // SAFETY: whole block; activation block `b` is in bounds (asserted).
        let (ks, q) = unsafe { (T::scales(blk), T::quants512(blk)) };
        let mut p = [zero; 4];
        for i in 0..4 {
            let av = unsafe { _mm512_loadu_si512(qa.add(256 * b + 64 * i) as *const _) };
            p[i] = _mm512_dpbusd_epi32(zero, q[i], av);
        }
        // Sum each 4-lane group (a 16-element sub-block) of the four products.
        let x01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
        let x23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
        let y = _mm512_add_epi32(_mm512_unpacklo_epi64(x01, x23), _mm512_unpackhi_epi64(x01, x23));
        let sc = _mm512_permutexvar_epi32(perm, _mm512_cvtepi16_epi32(ks.scales));
        let mut sumi = _mm512_reduce_add_epi32(_mm512_mullo_epi32(y, sc));
        // SAFETY: 16 bsums of block `b`.
        let bs = unsafe { _mm256_loadu_si256(a.bsums.as_ptr().add(16 * b) as *const __m256i) };
        if T::OFFSET != 0 {
            sumi = sumi.wrapping_sub((T::OFFSET as i32).wrapping_mul(hsum_i32(_mm256_madd_epi16(ks.scales, bs))));
        }
        let da = a.d[b];
        acc = _mm_fmadd_ss(_mm_set_ss(ks.d * da), _mm_set_ss(sumi as f32), acc);
        if T::HAS_MIN {
            let summ = hsum_i32(_mm256_madd_epi16(ks.mins, bs));
            acc = _mm_fnmadd_ss(_mm_set_ss(ks.dmin * da), _mm_set_ss(summ as f32), acc);
        }
    }
    _mm_cvtss_f32(acc)
}

/// Lane `r` of the result is the sum of the 16 lanes of `v[r]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
fn reduce4x16(v: [__m512i; 4]) -> __m128i {
    let x01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
    let x23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
    let y = _mm512_add_epi32(_mm512_unpacklo_epi64(x01, x23), _mm512_unpackhi_epi64(x01, x23));
    let y = _mm256_add_epi32(_mm512_castsi512_si256(y), _mm512_extracti64x4_epi64::<1>(y));
    _mm_add_epi32(_mm256_castsi256_si128(y), _mm256_extracti128_si256::<1>(y))
}

/// Four K-quant rows against one Q8_K row: [`dot_kquant`] for each (the same operations lane by
/// lane), interleaved for instruction-level parallelism and reduced together.
///
/// # Safety
/// As for [`dot_kquant`], for each row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot4_kquant<T: KDecode>(w: [&[u8]; 4], a: &Q8KRow) -> [f32; 4] {
    // SAFETY: per the function contract.
    unsafe { dot4xn_kquant::<T, 1>(w, [a])[0] }
}

/// Four K-quant rows against `N` Q8_K rows (a decode batch): each weight super-block decoded once
/// for all of them, and each activation row's outputs formed by exactly the operations of the
/// one-row form (`dot4_kquant` is this with `N = 1`), so a row's results do not depend on its batch.
///
/// A block's activations stay in registers (4·N of them) while the weight rows are decoded one at
/// a time, each serving every activation row before the next is decoded.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ/VNNI; each weight row must hold `a[0].d.len()` blocks of
/// `T`, and every activation row that many blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot4xn_kquant<T: KDecode, const N: usize>(w: [&[u8]; 4], a: [&Q8KRow; N]) -> [[f32; 4]; N] {
    let nb = a[0].d.len();
    assert!(w.iter().all(|r| r.len() >= nb * T::BYTES));
    assert!(a
        .iter()
        .all(|a| a.d.len() == nb && a.qs.len() >= 256 * nb && a.bsums.len() >= 16 * nb));
    let zero = _mm512_setzero_si512();
    let perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut acc = [_mm_setzero_ps(); N];
    // Per activation row and weight row: the scaled sub-block sums, and the offset and min terms
    // (every entry rewritten each block, so set once).
    let (mut prod, mut corr, mut mins) = (
        [[zero; 4]; N],
        [[_mm256_setzero_si256(); 4]; N],
        [[_mm256_setzero_si256(); 4]; N],
    );
    let (mut d, mut dmin) = ([0f32; 4], [0f32; 4]);
    for b in 0..nb {
        let mut bs = [_mm256_setzero_si256(); N];
        let mut av = [[zero; 4]; N];
        for n in 0..N {
            let qa = a[n].qs.as_ptr() as *const u8;
            // SAFETY: 16 bsums and 256 quants of activation block `b` (asserted).
            bs[n] = unsafe { _mm256_loadu_si256(a[n].bsums.as_ptr().add(16 * b) as *const __m256i) };
            for i in 0..4 {
                av[n][i] = unsafe { _mm512_loadu_si512(qa.add(256 * b + 64 * i) as *const _) };
            }
        }
        for r in 0..4 {
            let blk = &w[r][b * T::BYTES..(b + 1) * T::BYTES];
            for off in (0..T::BYTES).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(blk.as_ptr().wrapping_add(PREFETCH_BYTES + off) as *const i8);
            }
            // SAFETY: a whole block.
            let (ks, q) = unsafe { (T::scales(blk), T::quants512(blk)) };
            let sc = _mm512_permutexvar_epi32(perm, _mm512_cvtepi16_epi32(ks.scales));
            for n in 0..N {
                let mut p = [zero; 4];
                for i in 0..4 {
                    p[i] = _mm512_dpbusd_epi32(zero, q[i], av[n][i]);
                }
                let x01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
                let x23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
                let y = _mm512_add_epi32(_mm512_unpacklo_epi64(x01, x23), _mm512_unpackhi_epi64(x01, x23));
                prod[n][r] = _mm512_mullo_epi32(y, sc);
                corr[n][r] = _mm256_madd_epi16(ks.scales, bs[n]);
                mins[n][r] = _mm256_madd_epi16(ks.mins, bs[n]);
            }
            (d[r], dmin[r]) = (ks.d, ks.dmin);
        }
        // SAFETY: 4 floats each.
        let (dv, dminv) = unsafe { (_mm_loadu_ps(d.as_ptr()), _mm_loadu_ps(dmin.as_ptr())) };
        for n in 0..N {
            let mut sumi = reduce4x16(prod[n]);
            if T::OFFSET != 0 {
                sumi = _mm_sub_epi32(
                    sumi,
                    _mm_mullo_epi32(reduce4(corr[n]), _mm_set1_epi32(T::OFFSET as i32)),
                );
            }
            let da = _mm_set1_ps(a[n].d[b]);
            acc[n] = _mm_fmadd_ps(_mm_mul_ps(dv, da), _mm_cvtepi32_ps(sumi), acc[n]);
            if T::HAS_MIN {
                acc[n] = _mm_fnmadd_ps(_mm_mul_ps(dminv, da), _mm_cvtepi32_ps(reduce4(mins[n])), acc[n]);
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

/// Sum of 16 lanes in a fixed order (halves, quarters, then pairs): the final step of every
/// float dot product at this level.
#[inline]
#[target_feature(enable = "avx512f,avx512dq,avx2,fma,f16c")]
pub(crate) fn hsum16(v: __m512) -> f32 {
    let s = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps::<1>(v));
    let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// 16 weights from `w` starting at element `i` (only the lanes in `mask` are read; the others
/// are zero), widened to f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
unsafe fn load_w16<const F: u8>(w: *const u8, i: usize, mask: __mmask16) -> __m512 {
    // SAFETY: the caller guarantees the masked lanes are in bounds.
    unsafe {
        match Float::from_u8(F) {
            Float::F32 => _mm512_maskz_loadu_ps(mask, w.add(4 * i) as *const f32),
            Float::F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, w.add(2 * i) as *const i16)),
            Float::BF16 => {
                let h = _mm256_maskz_loadu_epi16(mask, w.add(2 * i) as *const i16);
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            }
        }
    }
}

/// `R` float weight rows against `A` f32 rows: each of the `R·A` outputs in the canonical float
/// form above (its own accumulator), so any tile shape gives the same bits.
///
/// # Safety
/// The CPU must support AVX-512 F/BW/VL/DQ; all `x` rows must have one length `n`, and each
/// weight row hold `n` elements of type `F`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(crate) unsafe fn dot_tile_float<const F: u8, const R: usize, const A: usize>(
    w: [&[u8]; R],
    x: [&[f32]; A],
) -> [[f32; A]; R] {
    let n = x[0].len();
    let esize = if F == 0 { 4 } else { 2 };
    assert!(w.iter().all(|r| r.len() >= n * esize) && x.iter().all(|x| x.len() == n));
    let mut acc = [[_mm512_setzero_ps(); A]; R];
    let mut i = 0;
    while i < n {
        let mask: __mmask16 = if n - i >= 16 { 0xffff } else { (1u16 << (n - i)) - 1 };
        let mut xv = [_mm512_setzero_ps(); A];
        for c in 0..A {
            // SAFETY: the masked lanes lie within each row (asserted above).
            xv[c] = unsafe { _mm512_maskz_loadu_ps(mask, x[c].as_ptr().add(i)) };
        }
        for r in 0..R {
            let wv = unsafe { load_w16::<F>(w[r].as_ptr(), i, mask) };
            for c in 0..A {
                acc[r][c] = _mm512_fmadd_ps(wv, xv[c], acc[r][c]);
            }
        }
        i += 16;
    }
    let mut out = [[0.0f32; A]; R];
    for r in 0..R {
        for c in 0..A {
            out[r][c] = hsum16(acc[r][c]);
        }
    }
    out
}
