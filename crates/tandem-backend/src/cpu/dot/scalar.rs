//! Portable kernels: one weight row against one activation row, in the canonical order of the
//! SIMD levels (`avx512` module docs), so every level gives the same bits. Integer sums per block
//! are exact; the float combination is one fused multiply-add per block (per element for float
//! types), accumulated in row order. `mul_add` is an instruction on most targets and a correctly
//! rounded libm call on x86-64 without FMA, where this level only runs on CPUs without AVX2.

// Index loops over lanes and rows are deliberate: they mirror the vector lanes they fill.
#![allow(clippy::needless_range_loop)]

use super::super::act_quant::{Q8KRow, Q8Row};
use super::layout::{self as l, f16_at, Legacy};

/// Legacy 32-element blocks: per block in order `acc = fma(d_w·d_a, isum_b, acc)`, then for types
/// with mins `acc = fma(m_w, s_a, acc)`. The integer loops are written so compilers vectorise them
/// for the baseline of any target.
pub(crate) fn dot_legacy<T: Legacy>(w: &[u8], a: &Q8Row) -> f32 {
    let mut acc = 0.0f32;
    for (b, blk) in w.chunks_exact(T::BYTES).enumerate().take(a.d.len()) {
        let qa: &[i8; 32] = a.qs[32 * b..32 * b + 32].try_into().unwrap();
        let isum = if T::BYTE_QUANTS {
            let q: &[u8; 32] = blk[T::QS_AT..T::QS_AT + 32].try_into().unwrap();
            (0..32).map(|j| q[j] as i8 as i32 * qa[j] as i32).sum::<i32>()
        } else {
            let q: &[u8; 16] = blk[T::QS_AT..T::QS_AT + 16].try_into().unwrap();
            let qh = T::QH_AT.map_or(0, |o| u32::from_le_bytes(blk[o..o + 4].try_into().unwrap()));
            let mut dot = 0i32;
            for j in 0..16 {
                let lo = (q[j] & 0xF) as i32 | (((qh >> j) & 1) << 4) as i32;
                let hi = (q[j] >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32;
                dot += lo * qa[j] as i32 + hi * qa[j + 16] as i32;
            }
            dot - T::OFFSET as i32 * a.sum[b]
        };
        acc = (f16_at(blk, 0) * a.d[b]).mul_add(isum as f32, acc);
        if T::HAS_MIN {
            acc = f16_at(blk, 2).mul_add(a.s[b], acc);
        }
    }
    acc
}

/// K-quants: per super-block exact `sumi = Σ_j sc_j·Σ q·a` (offset folded in) and
/// `summ = Σ_j m_j·bsum_j`, then `acc = fma(d·d_a, sumi, acc)` and (types with mins)
/// `acc = fma(-(dmin·d_a), summ, acc)` in block order.
pub(crate) fn dot_kquant<T: l::KQuant>(w: &[u8], a: &Q8KRow) -> f32 {
    let mut acc = 0.0f32;
    for (b, blk) in w.chunks_exact(T::BYTES).enumerate() {
        let u = T::unpack(blk);
        let qa = &a.qs[256 * b..256 * b + 256];
        let bs = &a.bsums[16 * b..16 * b + 16];
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..16 {
            let dot: i32 = (16 * j..16 * j + 16).map(|i| u.q[i] as i32 * qa[i] as i32).sum();
            sumi += u.scales[j] * (dot - T::OFFSET as i32 * bs[j] as i32);
            summ += u.mins[j] * bs[j] as i32;
        }
        let da = a.d[b];
        acc = (u.d * da).mul_add(sumi as f32, acc);
        if T::HAS_MIN {
            acc = (-(u.dmin * da)).mul_add(summ as f32, acc);
        }
    }
    acc
}

/// Float weights (F32, F16, BF16) against f32 activations: sixteen interleaved partial sums, each
/// `acc = fma(w, x, acc)` in element order (a short last chunk leaves the missing lanes as they
/// are), then the tree 16 → 8 → 4 → 2 → 1 of the SIMD levels' horizontal sum.
pub(crate) fn dot_float<const F: u8>(w: &[u8], x: &[f32]) -> f32 {
    let ty = l::Float::from_u8(F);
    let mut acc = [0.0f32; 16];
    for (i, &x) in x.iter().enumerate() {
        acc[i % 16] = l::float_at(ty, w, i).mul_add(x, acc[i % 16]);
    }
    let s8: [f32; 8] = std::array::from_fn(|l| acc[l] + acc[l + 8]);
    let s4: [f32; 4] = std::array::from_fn(|l| s8[l] + s8[l + 4]);
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}
