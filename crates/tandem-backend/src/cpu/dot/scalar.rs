//! Portable kernels: one weight row against one activation row. Integer sums per block are exact;
//! the float combination is a plain multiply then add (no FMA, which would be a slow libm call on
//! targets without it), accumulated block by block in row order.

// Index loops over lanes and rows are deliberate: they mirror the vector lanes they fill.
#![allow(clippy::needless_range_loop)]

use super::super::act_quant::{Q8KRow, Q8Row};
use super::layout::{self as l, f16_at, Legacy};

/// Legacy 32-element blocks: `Σ_b (d_w·d_a)·isum_b [+ m_w·s_a]` in block order. The integer
/// loops are written so compilers vectorise them for the baseline of any target.
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
        acc += f16_at(blk, 0) * a.d[b] * isum as f32;
        if T::HAS_MIN {
            acc += f16_at(blk, 2) * a.s[b];
        }
    }
    acc
}

/// K-quants: per super-block exact `sumi = Σ_j sc_j·Σ q·a` (offset folded in) and
/// `summ = Σ_j m_j·bsum_j`, then `acc += (d·d_a)·sumi - (dmin·d_a)·summ` in block order.
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
        acc += u.d * da * sumi as f32;
        if T::HAS_MIN {
            acc -= u.dmin * da * summ as f32;
        }
    }
    acc
}

/// Float weights (F32, F16, BF16) against f32 activations: eight interleaved partial sums (so the
/// compiler can keep them in one vector register), then summed pairwise.
pub(crate) fn dot_float<const F: u8>(w: &[u8], x: &[f32]) -> f32 {
    let ty = l::Float::from_u8(F);
    let mut acc = [0.0f32; 8];
    let w_at = |i: usize| l::float_at(ty, w, i);
    let n8 = x.len() / 8 * 8;
    for i in (0..n8).step_by(8) {
        for (j, a) in acc.iter_mut().enumerate() {
            *a += w_at(i + j) * x[i + j];
        }
    }
    for i in n8..x.len() {
        acc[i % 8] += w_at(i) * x[i];
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}
