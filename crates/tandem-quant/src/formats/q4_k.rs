//! Q4_K: 256 elements in 144 bytes, `f16 d | f16 dmin | u8 scales[12] | u8 qs[128]`.
//!
//! Eight 32-element sub-blocks, each with a 6-bit scale and 6-bit min packed in `scales` as
//! ggml's `get_scale_min_k4` reads them (see `common`). For 64-element chunk `c`, the 32 bytes
//! `qs[32c..32c + 32]` hold sub-block `2c` in their low nibbles and `2c + 1` in their high nibbles.
//! Element = `d * scale * q - dmin * min`.

use super::common::{
    arrays, get_f16, get_scale_min_k4, make_qkx2_quants_lanes, nearest_int, pack_scale_min_k4, put_f16, via_f16,
};

pub const BLOCK_ELEMS: usize = 256;
pub const BLOCK_BYTES: usize = 144;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, y) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    let (d, dmin) = (get_f16(b, 0), get_f16(b, 2));
    let scales: &[u8; 12] = b[4..16].try_into().unwrap();
    for (c, (q, y)) in b[16..].chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = get_scale_min_k4(2 * c, scales);
        let (sc2, m2) = get_scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0xF) as f32 - m1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// Chooses per-sub-block scales and mins the way `quantize_row_q4_K_ref` / `q5_K_ref` do, packs
/// them into `scales` and returns the stored `(d, dmin)` (as read back from f16) plus the quants.
pub(crate) fn quantize_scales_mins(
    x: &[f32; 256],
    nmax: i32,
    rmin: f32,
    nstep: i32,
    d_out: &mut [u8],
    scales_out: &mut [u8; 12],
) -> [u8; 256] {
    let mut l = [0u8; 256];
    // The eight sub-blocks side by side (`xt[i][j]`: element i of sub-block j), one lane each.
    let mut xt = [[0f32; 8]; 32];
    let mut weights = [[0f32; 8]; 32];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let av_x = (xs.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
        for (i, v) in xs.iter().enumerate() {
            xt[i][j] = *v;
            weights[i][j] = av_x + v.abs();
        }
    }
    let mut lt = [[0u8; 8]; 32];
    let (scales, mins) = make_qkx2_quants_lanes(nmax, &xt, &weights, &mut lt, rmin, 0.1, nstep, false);
    for (i, row) in lt.iter().enumerate() {
        for (j, &q) in row.iter().enumerate() {
            l[32 * j + i] = q;
        }
    }
    let max_scale = scales.iter().fold(0f32, |a, &s| a.max(s));
    let max_min = mins.iter().fold(0f32, |a, &m| a.max(m));
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let q6 = |v: f32| nearest_int(v).clamp(0, 63) as u8;
    let ls: [u8; 8] = std::array::from_fn(|j| q6(inv_scale * scales[j]));
    let lm: [u8; 8] = std::array::from_fn(|j| q6(inv_min * mins[j]));
    *scales_out = pack_scale_min_k4(&ls, &lm);
    put_f16(d_out, 0, max_scale / 63.0);
    put_f16(d_out, 2, max_min / 63.0);

    let (d, dmin) = (via_f16(max_scale / 63.0), via_f16(max_min / 63.0));
    for j in 0..8 {
        let dl = d * ls[j] as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * lm[j] as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dl).clamp(0, nmax) as u8;
        }
    }
    l
}

/// ggml's `quantize_row_q4_K_ref`.
pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, b) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    let mut scales = [0u8; 12];
    let l = quantize_scales_mins(x, 15, -1.0, 20, &mut b[..4], &mut scales);
    b[4..16].copy_from_slice(&scales);
    for (c, q) in b[16..].chunks_exact_mut(32).enumerate() {
        for i in 0..32 {
            q[i] = l[64 * c + i] | (l[64 * c + i + 32] << 4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_block() {
        let mut b = [0u8; BLOCK_BYTES];
        b[0..2].copy_from_slice(&[0x00, 0x3c]); // d = 1
        b[2..4].copy_from_slice(&[0x00, 0x38]); // dmin = 0.5
                                                // Sub-block 0: scale 2, min 4. Sub-block 1: scale 3, min 0.
                                                // Sub-block 5: scale 33 (0b10_0001), min 18 (0b01_0010).
        let s = &mut b[4..16];
        s[0] = 2;
        s[4] = 4;
        s[1] = 3;
        s[5] = 0;
        s[9] = 0x1 | (0x2 << 4); // low 4 bits of scale 5 and min 5
        s[1] |= 0b10 << 6; // top 2 bits of scale 5 live in byte 5 - 4
        s[5] |= 0b01 << 6; // top 2 bits of min 5 live in byte 5
                           // Chunk 0 byte 0: element 0 q = 7, element 32 q = 9.
        b[16] = 7 | (9 << 4);
        // Chunk 2 byte 3: element 131 (sub-block 4) q = 1, element 163 (sub-block 5) q = 15.
        b[16 + 64 + 3] = 1 | (15 << 4);
        let mut y = [0.0; 256];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], 2.0 * 7.0 - 2.0);
        assert_eq!(y[1], -2.0);
        assert_eq!(y[32], 3.0 * 9.0);
        assert_eq!(y[131], 0.0); // sub-block 4 has scale 0, min 0
        assert_eq!(y[163], 33.0 * 15.0 - 0.5 * 18.0);
        assert_eq!(y[164], -0.5 * 18.0);
    }
}
