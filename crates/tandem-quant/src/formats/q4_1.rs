//! Q4_1: 32 elements in 20 bytes, `f16 d | f16 m | u8 qs[16]`.
//!
//! Element `j` (0..16) is `(qs[j] & 0xF) * d + m`, element `j + 16` is `(qs[j] >> 4) * d + m`.

use super::common::{arrays, get_f16, put_f16};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 20;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, y) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    let (d, m) = (get_f16(b, 0), get_f16(b, 2));
    let qs = &b[4..];
    for j in 0..16 {
        y[j] = (qs[j] & 0xF) as f32 * d + m;
        y[j + 16] = (qs[j] >> 4) as f32 * d + m;
    }
}

/// ggml's `quantize_row_q4_1_ref`: `d = (max - min) / 15`, `m = min`.
pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, b) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    let min = x.iter().copied().fold(f32::MAX, f32::min);
    let max = x.iter().copied().fold(-f32::MAX, f32::max);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let q = |v: f32| (((v - min) * id + 0.5) as i8).clamp(0, 15) as u8;
    for j in 0..16 {
        b[4 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_block() {
        let mut b = [0u8; BLOCK_BYTES];
        b[..2].copy_from_slice(&[0x00, 0x40]); // d = 2
        b[2..4].copy_from_slice(&[0x00, 0xbc]); // m = -1
        for j in 0..16 {
            b[4 + j] = j as u8 | ((15 - j as u8) << 4);
        }
        let mut y = [0.0; 32];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], -1.0);
        assert_eq!(y[5], 9.0);
        assert_eq!(y[15], 29.0);
        assert_eq!(y[16], 29.0);
        assert_eq!(y[31], -1.0);
    }

    #[test]
    fn quantizes_min_and_max_exactly() {
        let x: [f32; 32] = std::array::from_fn(|i| -3.0 + i as f32 * 0.5);
        let mut b = [0u8; BLOCK_BYTES];
        quantize_block(&x, &mut b);
        let mut y = [0.0; 32];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], -3.0);
        assert!((y[31] - 12.5).abs() < 0.02, "{}", y[31]);
    }
}
