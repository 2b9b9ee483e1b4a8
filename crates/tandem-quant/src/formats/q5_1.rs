//! Q5_1: 32 elements in 24 bytes, `f16 d | f16 m | u8 qh[4] | u8 qs[16]`.
//!
//! `qh` is a little-endian u32 whose bit `i` is the 5th bit of element `i`. Element `j` (0..16) is
//! `(qs[j] & 0xF | bit j of qh << 4) * d + m`, element `j + 16` is
//! `(qs[j] >> 4 | bit (j + 16) of qh << 4) * d + m`.

use super::common::{arrays, get_f16, put_f16};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 24;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, y) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    let (d, m) = (get_f16(b, 0), get_f16(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..];
    for j in 0..16 {
        let xh_0 = ((qh >> j) << 4) & 0x10;
        let xh_1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((qs[j] & 0xF) as u32 | xh_0) as f32 * d + m;
        y[j + 16] = ((qs[j] >> 4) as u32 | xh_1) as f32 * d + m;
    }
}

/// ggml's `quantize_row_q5_1_ref`: `d = (max - min) / 31`, `m = min`.
pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, b) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    let min = x.iter().copied().fold(f32::MAX, f32::min);
    let max = x.iter().copied().fold(-f32::MAX, f32::max);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let q = |v: f32| (((v - min) * id + 0.5) as i8).clamp(0, 31) as u32;
    let mut qh = 0u32;
    for j in 0..16 {
        let (q0, q1) = (q(x[j]), q(x[j + 16]));
        b[8 + j] = ((q0 & 0xF) | ((q1 & 0xF) << 4)) as u8;
        qh |= ((q0 & 0x10) >> 4) << j;
        qh |= ((q1 & 0x10) >> 4) << (j + 16);
    }
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_block() {
        let mut b = [0u8; BLOCK_BYTES];
        b[..2].copy_from_slice(&[0x00, 0x38]); // d = 0.5
        b[2..4].copy_from_slice(&[0x00, 0x40]); // m = 2
        let qh: u32 = (1 << 2) | (1 << 16);
        b[4..8].copy_from_slice(&qh.to_le_bytes());
        for j in 0..16 {
            b[8 + j] = j as u8 | ((15 - j as u8) << 4);
        }
        let mut y = [0.0; 32];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], 2.0);
        assert_eq!(y[2], (2 + 16) as f32 * 0.5 + 2.0);
        assert_eq!(y[3], 3.0 * 0.5 + 2.0);
        assert_eq!(y[16], (15 + 16) as f32 * 0.5 + 2.0);
        assert_eq!(y[17], 14.0 * 0.5 + 2.0);
        assert_eq!(y[31], 2.0);
    }

    #[test]
    fn quantize_sets_high_bits() {
        let x: [f32; 32] = std::array::from_fn(|i| i as f32 + 100.0);
        let mut b = [0u8; BLOCK_BYTES];
        quantize_block(&x, &mut b);
        // d = 1, m = 100, q = i.
        assert_eq!(u32::from_le_bytes([b[4], b[5], b[6], b[7]]), 0xffff_0000);
        let mut y = [0.0; 32];
        dequantize_block(&b, &mut y);
        assert_eq!(y, x);
    }
}
