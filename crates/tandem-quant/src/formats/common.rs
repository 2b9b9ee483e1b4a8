//! Helpers shared by the format modules: size-checked block views, f16 fields, ggml's rounding, the
//! K-quant 6-bit scale packing and the scale searches of ggml's reference quantizers.

use half::f16;

/// Views a block and its output as fixed-size arrays, so the format code indexes without bounds checks.
///
/// # Panics
/// If `a.len() != A` or `b.len() != B`; the public API checks sizes before calling a block function.
#[inline]
pub(crate) fn arrays<'a, 'b, T, U, const A: usize, const B: usize>(
    a: &'a [T],
    b: &'b mut [U],
) -> (&'a [T; A], &'b mut [U; B]) {
    let a: &[T; A] = a.try_into().expect("input block has the wrong length");
    let b: &mut [U; B] = b.try_into().expect("output block has the wrong length");
    (a, b)
}

/// Reads the little-endian IEEE half at `b[off..off + 2]` as f32.
#[inline]
pub(crate) fn get_f16(b: &[u8], off: usize) -> f32 {
    f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

/// Writes `v` as a little-endian IEEE half (round to nearest even, as `GGML_FP32_TO_FP16`).
#[inline]
pub(crate) fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// `v` after a trip through f16: what a dequantizer will read back from a stored scale.
#[inline]
pub(crate) fn via_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// ggml's `nearest_int`: round half to even. In ggml's range (|v| <= 2^22 - 1) by ggml's trick:
/// adding 1.5 * 2^23 moves the value to where the float's step is 1, so the addition itself rounds
/// it half to even and the integer sits in the low mantissa bits. `round_ties_even` gives the same
/// integers but is a library call on the baseline x86-64 target (no SSE4.1 rounding instruction),
/// which was a fifth of `tandem synth`'s time and kept the quantizers' loops from vectorizing.
/// Outside that range the same trick in f64 (1.5 * 2^52) covers every value an i32 holds; beyond,
/// a value is already whole and the cast saturates (NaN gives 0), as `round_ties_even() as i32` does.
/// No branch calls the rounding intrinsic, which LLVM would otherwise compute on every path.
#[inline]
pub(crate) fn nearest_int(v: f32) -> i32 {
    if v.abs() <= 4_194_303.0 {
        let bits = (v + 12_582_912.0).to_bits() as i32;
        (bits & 0x007f_ffff) - 0x0040_0000
    } else if v.abs() < 2_147_483_648.0 {
        ((v as f64 + 6_755_399_441_055_744.0).to_bits() as i64 - 0x4338_0000_0000_0000) as i32
    } else {
        v as i32
    }
}

/// `nearest_int` of each lane. The quantizers' products lie in the trick's range, so the lanes are
/// rounded by it without a branch (which the compiler turns into vector code); a lane out of range
/// (or NaN) sends the whole row to the scalar `nearest_int`, so every value is what it would give.
#[inline(always)]
pub(crate) fn nearest_ints<const L: usize>(v: [f32; L]) -> [i32; L] {
    if v.iter().all(|x| x.abs() <= 4_194_303.0) {
        v.map(|x| ((x + 12_582_912.0).to_bits() as i32 & 0x007f_ffff) - 0x0040_0000)
    } else {
        v.map(nearest_int)
    }
}

/// The signed value of largest magnitude (first one on ties), as ggml's quantizers pick `max`.
#[inline]
pub(crate) fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// Groups whose largest magnitude is below this are treated as all zero (ggml's `GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block.
///
/// Bytes 0..4 hold scales 0..4 in their low 6 bits, bytes 4..8 mins 0..4; bytes 8..12 hold the low
/// 4 bits of scales 4..8 (low nibble) and mins 4..8 (high nibble), whose top 2 bits sit in the top
/// 2 bits of bytes 0..4 (scales) and 4..8 (mins).
#[inline]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The inverse of [`get_scale_min_k4`]: packs 8 scales and 8 mins (each < 64).
pub(crate) fn pack_scale_min_k4(scales: &[u8; 8], mins: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        let (ls, lm) = (scales[j].min(63), mins[j].min(63));
        if j < 4 {
            q[j] |= ls;
            q[j + 4] |= lm;
        } else {
            q[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            q[j - 4] |= (ls >> 4) << 6;
            q[j] |= (lm >> 4) << 6;
        }
    }
    q
}

/// ggml's `make_qkx2_quants`: an asymmetric scale and min for `x[i] ≈ scale * L[i] - min` with
/// `L[i]` in `0..=nmax`, minimising the weighted error (squared, or absolute with `use_mad`) over a
/// small grid of trial scales. Returns `(scale, min)` where `min >= 0` is the amount subtracted.
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    // One lane (groups hold at most 32 elements).
    let n = x.len();
    let xs: [[f32; 1]; 32] = std::array::from_fn(|i| [if i < n { x[i] } else { 0.0 }]);
    let ws: [[f32; 1]; 32] = std::array::from_fn(|i| [if i < n { weights[i] } else { 0.0 }]);
    let mut ls = [[0u8; 1]; 32];
    let (scale, min) = make_qkx2_quants_lanes(nmax, &xs[..n], &ws[..n], &mut ls[..n], rmin, rdelta, nstep, use_mad);
    for (o, l) in l_out.iter_mut().zip(&ls[..n]) {
        *o = l[0];
    }
    (scale[0], min[0])
}

/// `make_qkx2_quants` for `L` independent groups at once (`x[i][k]`: element i of group k). Each
/// group's arithmetic is the single group's, in the same order, so the results are the same bits;
/// what changes is that the L groups' sums, each a chain of dependent float additions, interleave
/// (one group alone waits on every addition's latency, which made this most of `tandem synth`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants_lanes<const L: usize>(
    nmax: i32,
    x: &[[f32; L]],
    weights: &[[f32; L]],
    l_out: &mut [[u8; L]],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> ([f32; L], [f32; L]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { qkx2_lanes_avx2(nmax, x, weights, l_out, rmin, rdelta, nstep, use_mad) };
    }
    qkx2_lanes(nmax, x, weights, l_out, rmin, rdelta, nstep, use_mad)
}

/// `qkx2_lanes` compiled with AVX2: twice the vector width for the lane loops. Rust never fuses a
/// product and a sum into one rounding, so the arithmetic, and every bit of the result, is the same.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn qkx2_lanes_avx2<const L: usize>(
    nmax: i32,
    x: &[[f32; L]],
    weights: &[[f32; L]],
    l_out: &mut [[u8; L]],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> ([f32; L], [f32; L]) {
    qkx2_lanes(nmax, x, weights, l_out, rmin, rdelta, nstep, use_mad)
}

/// The body of `make_qkx2_quants_lanes` (inlined into each of its compilations).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn qkx2_lanes<const L: usize>(
    nmax: i32,
    x: &[[f32; L]],
    weights: &[[f32; L]],
    l_out: &mut [[u8; L]],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> ([f32; L], [f32; L]) {
    let n = x.len();
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let quants = |iscale: &[f32; L], v: &[f32; L], min: &[f32; L]| {
        nearest_ints::<L>(std::array::from_fn(|k| iscale[k] * (v[k] - min[k]))).map(|l| l.clamp(0, nmax) as u8)
    };
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = [0f32; L];
    for k in 0..L {
        sum_x[k] = sum_w[k] * x[0][k];
    }
    for i in 1..n {
        for k in 0..L {
            min[k] = min[k].min(x[i][k]);
            max[k] = max[k].max(x[i][k]);
            sum_w[k] += weights[i][k];
            sum_x[k] += weights[i][k] * x[i][k];
        }
    }
    let mut scale = [0f32; L];
    let mut best_error = [0f32; L];
    let mut iscale = [0f32; L];
    let mut flat = [false; L];
    for k in 0..L {
        if min[k] > 0.0 {
            min[k] = 0.0;
        }
        flat[k] = max[k] == min[k];
        iscale[k] = nmax as f32 / (max[k] - min[k]);
        scale[k] = 1.0 / iscale[k];
    }
    for i in 0..n {
        let ls = quants(&iscale, &x[i], &min);
        for k in 0..L {
            let l = ls[k];
            l_out[i][k] = l;
            best_error[k] += weights[i][k] * err(scale[k] * l as f32 + min[k] - x[i][k]);
        }
    }
    let mut laux = [[0u8; L]; 32];
    let laux = &mut laux[..n];
    for is in 0..=nstep {
        let (mut sum_l, mut sum_l2, mut sum_xl) = ([0f32; L], [0f32; L], [0f32; L]);
        for k in 0..L {
            iscale[k] = (rmin + rdelta * is as f32 + nmax as f32) / (max[k] - min[k]);
        }
        for i in 0..n {
            let ls = quants(&iscale, &x[i], &min);
            for k in 0..L {
                let l = ls[k];
                laux[i][k] = l;
                let (w, lf) = (weights[i][k], l as f32);
                sum_l[k] += w * lf;
                sum_l2[k] += w * lf * lf;
                sum_xl[k] += w * lf * x[i][k];
            }
        }
        let (mut this_scale, mut this_min, mut cur_error) = ([0f32; L], [0f32; L], [0f32; L]);
        let mut tried = [false; L];
        for k in 0..L {
            let det = sum_w[k] * sum_l2[k] - sum_l[k] * sum_l[k];
            tried[k] = det > 0.0;
            this_scale[k] = (sum_w[k] * sum_xl[k] - sum_x[k] * sum_l[k]) / det;
            this_min[k] = (sum_l2[k] * sum_x[k] - sum_l[k] * sum_xl[k]) / det;
            if this_min[k] > 0.0 {
                this_min[k] = 0.0;
                this_scale[k] = sum_xl[k] / sum_l2[k];
            }
        }
        for i in 0..n {
            for k in 0..L {
                cur_error[k] += weights[i][k] * err(this_scale[k] * laux[i][k] as f32 + this_min[k] - x[i][k]);
            }
        }
        for k in 0..L {
            if tried[k] && cur_error[k] < best_error[k] {
                for (o, a) in l_out.iter_mut().zip(laux.iter()) {
                    o[k] = a[k];
                }
                best_error[k] = cur_error[k];
                scale[k] = this_scale[k];
                min[k] = this_min[k];
            }
        }
    }
    for k in 0..L {
        // A group of one value: all quants 0 and that value as the min (the trials above divided by
        // zero and adopted nothing).
        if flat[k] {
            for o in l_out.iter_mut() {
                o[k] = 0;
            }
            scale[k] = 0.0;
        }
    }
    (scale, min.map(|m| -m))
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights, for `L` independent
/// groups at once (`x[i][k]`: element i of group k): a symmetric scale for `x[i] ≈ scale * (L[i] -
/// nmax)` with `L[i]` in `0..2*nmax`, refined over 18 trial scales by x²-weighted least squares.
/// Returns each group's scale (0 and all `L = 0` for an all-zero group). Each group's arithmetic
/// is the single group's, in the same order (the same bits); the groups' dependent sums interleave
/// (see `make_qkx2_quants_lanes`). Groups of at most 32.
pub(crate) fn make_qx_quants_lanes<const L: usize>(nmax: i32, x: &[[f32; L]], l_out: &mut [[i8; L]]) -> [f32; L] {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { qx_lanes_avx2(nmax, x, l_out) };
    }
    qx_lanes(nmax, x, l_out)
}

/// `qx_lanes` compiled with AVX2 (the same bits, as for `qkx2_lanes_avx2`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn qx_lanes_avx2<const L: usize>(nmax: i32, x: &[[f32; L]], l_out: &mut [[i8; L]]) -> [f32; L] {
    qx_lanes(nmax, x, l_out)
}

/// The body of `make_qx_quants_lanes` (inlined into each of its compilations).
#[inline(always)]
fn qx_lanes<const L: usize>(nmax: i32, x: &[[f32; L]], l_out: &mut [[i8; L]]) -> [f32; L] {
    let n = x.len();
    let nmaxf = nmax as f32;
    let quants = |iscale: &[f32; L], v: &[f32; L]| {
        nearest_ints::<L>(std::array::from_fn(|k| iscale[k] * v[k])).map(|l| l.clamp(-nmax, nmax - 1))
    };
    let mut max = [0f32; L];
    let mut zero = [false; L];
    for k in 0..L {
        let column: [f32; 32] = std::array::from_fn(|i| if i < n { x[i][k] } else { 0.0 });
        max[k] = signed_absmax(&column[..n]);
        zero[k] = max[k].abs() < GROUP_MAX_EPS;
    }
    // One trial scale per group: its quants (offset by nmax, as stored) and sums.
    let mut laux = [[0i8; L]; 32];
    let laux = &mut laux[..n];
    let trial = |iscale: &[f32; L], laux: &mut [[i8; L]]| {
        let (mut sumlx, mut suml2) = ([0f32; L], [0f32; L]);
        for i in 0..n {
            let ls = quants(iscale, &x[i]);
            for k in 0..L {
                let v = x[i][k];
                let l = ls[k];
                laux[i][k] = (l + nmax) as i8;
                let (w, lf) = (v * v, l as f32);
                sumlx[k] += w * v * lf;
                suml2[k] += w * lf * lf;
            }
        }
        (sumlx, suml2)
    };
    let (mut scale, mut best) = ([0f32; L], [0f32; L]);
    let iscale: [f32; L] = std::array::from_fn(|k| -nmaxf / max[k]);
    let (sumlx, suml2) = trial(&iscale, laux);
    l_out.copy_from_slice(laux);
    for k in 0..L {
        scale[k] = if suml2[k] != 0.0 { sumlx[k] / suml2[k] } else { 0.0 };
        best[k] = scale[k] * sumlx[k];
    }
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale: [f32; L] = std::array::from_fn(|k| -(nmaxf + 0.1 * is as f32) / max[k]);
        let (sumlx, suml2) = trial(&iscale, laux);
        for k in 0..L {
            if suml2[k] > 0.0 && sumlx[k] * sumlx[k] > best[k] * suml2[k] {
                for (o, a) in l_out.iter_mut().zip(laux.iter()) {
                    o[k] = a[k];
                }
                scale[k] = sumlx[k] / suml2[k];
                best[k] = scale[k] * sumlx[k];
            }
        }
    }
    for k in 0..L {
        if zero[k] {
            for o in l_out.iter_mut() {
                o[k] = 0;
            }
            scale[k] = 0.0;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse`: a symmetric scale for `x[i] ≈ scale * (L[i] - nmax)` with
/// `L[i]` in `0..2*nmax`, improved by up to 5 passes of coordinate descent on the x²-weighted error.
/// Returns the scale (0 and all `L = 0` for an all-zero group).
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let max = signed_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (o, &v) in l_out.iter_mut().zip(x) {
        let l = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *o = l as i8;
        let (w, lf) = (v * v, l as f32);
        sumlx += w * v * lf;
        suml2 += w * lf * lf;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (o, &v) in l_out.iter_mut().zip(x) {
            let w = v * v;
            let cur = *o as f32;
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *o as i32 {
                    let nl = new_l as f32;
                    slx += w * v * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *o = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for o in l_out.iter_mut() {
        *o += nmax as i8;
    }
    sumlx / suml2
}

/// Packs 256 2-bit values the K-quant way: per 128-element half, byte `l` of its 32 holds elements
/// `l`, `l+32`, `l+64`, `l+96` at bit offsets 0, 2, 4, 6.
pub(crate) fn pack_2bit(l: &[u8; 256], qs: &mut [u8; 64]) {
    for (half, q) in qs.chunks_exact_mut(32).enumerate() {
        let l = &l[half * 128..];
        for i in 0..32 {
            q[i] = (l[i] & 3) | (l[i + 32] & 3) << 2 | (l[i + 64] & 3) << 4 | (l[i + 96] & 3) << 6;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_k4_round_trips() {
        let scales = [0, 1, 17, 63, 32, 5, 40, 63];
        let mins = [63, 2, 0, 31, 1, 62, 16, 47];
        let q = pack_scale_min_k4(&scales, &mins);
        for j in 0..8 {
            assert_eq!(get_scale_min_k4(j, &q), (scales[j], mins[j]), "j={j}");
        }
    }

    /// The one-group `make_qkx2_quants` as it was written before the lanes (ggml's loop, line by line):
    /// finds `scale` and `min` so that `x[i] ≈ scale * L[i] - min` with
    /// `L[i]` in `0..=nmax`, minimising the weighted error (squared, or absolute with `use_mad`) over a
    /// small grid of trial scales. Returns `(scale, min)` where `min >= 0` is the amount subtracted.
    #[allow(clippy::too_many_arguments)]
    fn reference_qkx2(
        nmax: i32,
        x: &[f32],
        weights: &[f32],
        l_out: &mut [u8],
        rmin: f32,
        rdelta: f32,
        nstep: i32,
        use_mad: bool,
    ) -> (f32, f32) {
        let n = x.len();
        let err = |d: f32| if use_mad { d.abs() } else { d * d };
        let mut min = x[0];
        let mut max = x[0];
        let mut sum_w = weights[0];
        let mut sum_x = sum_w * x[0];
        for i in 1..n {
            min = min.min(x[i]);
            max = max.max(x[i]);
            sum_w += weights[i];
            sum_x += weights[i] * x[i];
        }
        if min > 0.0 {
            min = 0.0;
        }
        if max == min {
            l_out.fill(0);
            return (0.0, -min);
        }
        let mut iscale = nmax as f32 / (max - min);
        let mut scale = 1.0 / iscale;
        let mut best_error = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_out[i] = l as u8;
            best_error += weights[i] * err(scale * l as f32 + min - x[i]);
        }
        let mut laux = [0u8; 32];
        let laux = &mut laux[..n];
        for is in 0..=nstep {
            iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
            let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
            for i in 0..n {
                let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
                laux[i] = l as u8;
                let (w, lf) = (weights[i], l as f32);
                sum_l += w * lf;
                sum_l2 += w * lf * lf;
                sum_xl += w * lf * x[i];
            }
            let det = sum_w * sum_l2 - sum_l * sum_l;
            if det > 0.0 {
                let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
                let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
                if this_min > 0.0 {
                    this_min = 0.0;
                    this_scale = sum_xl / sum_l2;
                }
                let mut cur_error = 0.0f32;
                for i in 0..n {
                    cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
                }
                if cur_error < best_error {
                    l_out.copy_from_slice(laux);
                    best_error = cur_error;
                    scale = this_scale;
                    min = this_min;
                }
            }
        }
        (scale, -min)
    }

    #[test]
    fn qkx2_lanes_give_the_one_group_bits() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        // (elements, nmax, rmin, nstep, use_mad): Q4_K, Q5_K, Q2_K.
        for (n, nmax, rmin, nstep, mad) in [
            (32, 15, -1.0, 20, false),
            (32, 31, -0.5, 15, false),
            (16, 3, -0.5, 15, true),
        ] {
            for round in 0..200 {
                let mut x = [[0f32; 8]; 32];
                let mut w = [[0f32; 8]; 32];
                for k in 0..8 {
                    // Lane kinds: spread, all negative, all positive, one value (flat), tiny.
                    let (shift, scale, flat) = match (round + k) % 5 {
                        0 => (0.0, 3.0, false),
                        1 => (-2.0, 1.0, false),
                        2 => (2.0, 1.0, false),
                        3 => (-0.5, 0.0, true),
                        _ => (0.0, 1e-6, false),
                    };
                    for i in 0..n {
                        x[i][k] = if flat { shift } else { shift + scale * next() };
                        w[i][k] = 0.5 + next().abs();
                    }
                }
                let mut lanes = [[0u8; 8]; 32];
                let (sc, mn) = make_qkx2_quants_lanes(nmax, &x[..n], &w[..n], &mut lanes[..n], rmin, 0.1, nstep, mad);
                // The body as compiled for the baseline CPU gives what the dispatched one (AVX2
                // where the CPU has it) gave.
                let mut body = [[0u8; 8]; 32];
                let (sb, mb) = qkx2_lanes(nmax, &x[..n], &w[..n], &mut body[..n], rmin, 0.1, nstep, mad);
                assert_eq!(
                    (sb.map(f32::to_bits), mb.map(f32::to_bits)),
                    (sc.map(f32::to_bits), mn.map(f32::to_bits))
                );
                assert_eq!(body, lanes);
                for k in 0..8 {
                    let xs: Vec<f32> = (0..n).map(|i| x[i][k]).collect();
                    let ws: Vec<f32> = (0..n).map(|i| w[i][k]).collect();
                    let mut want = vec![0u8; n];
                    let (s1, m1) = reference_qkx2(nmax, &xs, &ws, &mut want, rmin, 0.1, nstep, mad);
                    assert_eq!(
                        (sc[k].to_bits(), mn[k].to_bits()),
                        (s1.to_bits(), m1.to_bits()),
                        "lane {k}"
                    );
                    assert_eq!((0..n).map(|i| lanes[i][k]).collect::<Vec<_>>(), want, "lane {k}");
                    let mut one = vec![0u8; n];
                    let (s2, m2) = make_qkx2_quants(nmax, &xs, &ws, &mut one, rmin, 0.1, nstep, mad);
                    assert_eq!((s2.to_bits(), m2.to_bits(), one), (s1.to_bits(), m1.to_bits(), want));
                }
            }
        }
    }

    /// The one-group `make_qx_quants` as it was written before the lanes: ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights: a symmetric scale for
    /// `x[i] ≈ scale * (L[i] - nmax)` with `L[i]` in `0..2*nmax`, refined over 18 trial scales by
    /// x²-weighted least squares. Returns the scale (0 and all `L = 0` for an all-zero group).
    fn reference_qx(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
        let max = signed_absmax(x);
        if max.abs() < GROUP_MAX_EPS {
            l_out.fill(0);
            return 0.0;
        }
        let nmaxf = nmax as f32;
        let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let sums = |iscale: f32| {
            let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
            for &v in x {
                let l = quant(iscale, v) as f32;
                let w = v * v;
                sumlx += w * v * l;
                suml2 += w * l * l;
            }
            (sumlx, suml2)
        };
        let mut iscale = -nmaxf / max;
        for (o, &v) in l_out.iter_mut().zip(x) {
            *o = (quant(iscale, v) + nmax) as i8;
        }
        let (sumlx, suml2) = sums(iscale);
        let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
        let mut best = scale * sumlx;
        for is in -9..=9 {
            if is == 0 {
                continue;
            }
            iscale = -(nmaxf + 0.1 * is as f32) / max;
            let (sumlx, suml2) = sums(iscale);
            if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
                for (o, &v) in l_out.iter_mut().zip(x) {
                    *o = (quant(iscale, v) + nmax) as i8;
                }
                scale = sumlx / suml2;
                best = scale * sumlx;
            }
        }
        scale
    }

    #[test]
    fn qx_lanes_give_the_one_group_bits() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        for (n, nmax) in [(16, 32), (16, 4), (32, 32)] {
            for round in 0..200 {
                let mut x = [[0f32; 16]; 32];
                for k in 0..16 {
                    // Lane kinds: spread, one-signed, all zero, tiny (under GROUP_MAX_EPS), one value.
                    let (shift, scale) = match (round + k) % 5 {
                        0 => (0.0, 3.0),
                        1 => (-2.0, 1.0),
                        2 => (0.0, 0.0),
                        3 => (0.0, 1e-20),
                        _ => (0.75, 0.0),
                    };
                    for row in x.iter_mut().take(n) {
                        row[k] = shift + scale * next();
                    }
                }
                let mut lanes = [[0i8; 16]; 32];
                let sc = make_qx_quants_lanes(nmax, &x[..n], &mut lanes[..n]);
                // The baseline compilation of the body against the dispatched one.
                let mut body = [[0i8; 16]; 32];
                assert_eq!(
                    qx_lanes(nmax, &x[..n], &mut body[..n]).map(f32::to_bits),
                    sc.map(f32::to_bits)
                );
                assert_eq!(body, lanes);
                for k in 0..16 {
                    let xs: Vec<f32> = (0..n).map(|i| x[i][k]).collect();
                    let mut want = vec![0i8; n];
                    let s1 = reference_qx(nmax, &xs, &mut want);
                    assert_eq!(sc[k].to_bits(), s1.to_bits(), "lane {k}");
                    assert_eq!((0..n).map(|i| lanes[i][k]).collect::<Vec<_>>(), want, "lane {k}");
                    let column: Vec<[f32; 1]> = xs.iter().map(|&v| [v]).collect();
                    let mut one = vec![[0i8; 1]; n];
                    assert_eq!(make_qx_quants_lanes(nmax, &column, &mut one)[0].to_bits(), s1.to_bits());
                    assert_eq!(one.iter().map(|l| l[0]).collect::<Vec<_>>(), want);
                }
            }
        }
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(-2.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(f32::NAN), 0);
        assert_eq!(nearest_int(f32::INFINITY), i32::MAX);
        assert_eq!(nearest_int(1e9), 1_000_000_000);
        assert_eq!(nearest_int(-4_194_303.5), -4_194_304);
    }

    #[test]
    fn nearest_int_matches_round_ties_even() {
        // Every half and quarter step over the quantizers' range, the edges of the trick's range,
        // and a sweep of values of every magnitude.
        let mut vs: Vec<f32> = (-2048..=2048).map(|i| i as f32 * 0.25).collect();
        vs.extend([
            4_194_303.0,
            -4_194_303.0,
            4_194_302.5,
            -4_194_302.5,
            4_194_304.0,
            0.49999997,
            -0.0,
        ]);
        vs.extend([
            4_194_303.5,
            -4_194_304.5,
            8_388_607.5,
            2_147_483_520.0,
            -2_147_483_648.0,
            3e9,
            -3e9,
        ]);
        vs.extend([f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN]);
        let mut bits = 0x3000_0000u32;
        while bits < 0x5000_0000 {
            vs.push(f32::from_bits(bits));
            vs.push(-f32::from_bits(bits));
            bits += 0x1357;
        }
        for v in vs {
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
    }

    #[test]
    fn nearest_ints_rounds_every_lane_as_nearest_int_does() {
        // Rows inside the trick's range, rows with one lane past it (huge, infinite, NaN with a
        // payload), and lanes at the range's edges.
        let edge = [4_194_303.0f32, -4_194_303.0, 4_194_302.5, -0.0, 0.5, -1.5, 2.5, -2.5];
        let rows: Vec<[f32; 8]> = vec![
            std::array::from_fn(|k| k as f32 * 0.75 - 3.0),
            edge,
            [1.5, 2.5, 3e9, -0.5, 0.0, 7.0, -7.5, 1.0],
            [1.5, f32::INFINITY, 0.0, 0.0, 0.0, 0.0, 0.0, f32::NEG_INFINITY],
            [f32::from_bits(0x7fc0_0123), 1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 2.5],
            [4_194_303.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ];
        for row in rows {
            assert_eq!(nearest_ints(row), row.map(nearest_int), "{row:?}");
        }
    }
}
