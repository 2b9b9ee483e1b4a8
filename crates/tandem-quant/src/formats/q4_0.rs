//! Q4_0: 32 elements in 18 bytes, `f16 d | u8 qs[16]`.
//!
//! Element `j` (0..16) is `((qs[j] & 0xF) - 8) * d`, element `j + 16` is `((qs[j] >> 4) - 8) * d`.

use super::common::{arrays, get_f16, put_f16, signed_absmax};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 18;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, y) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    let d = get_f16(b, 0);
    let qs = &b[2..];
    for j in 0..16 {
        y[j] = ((qs[j] & 0xF) as i32 - 8) as f32 * d;
        y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
    }
}

/// ggml's `quantize_row_q4_0_ref`: `d = max / -8` where `max` is the value of largest magnitude.
pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, b) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    let d = signed_absmax(x) / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    let q = |v: f32| ((v * id + 8.5) as i8).clamp(0, 15) as u8;
    for j in 0..16 {
        b[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_block() {
        let mut b = [0u8; BLOCK_BYTES];
        b[..2].copy_from_slice(&[0x00, 0x38]); // d = 0.5
        for j in 0..16 {
            b[2 + j] = j as u8 | ((15 - j as u8) << 4);
        }
        let mut y = [0.0; 32];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], -4.0);
        assert_eq!(y[8], 0.0);
        assert_eq!(y[15], 3.5);
        assert_eq!(y[16], 3.5);
        assert_eq!(y[31], -4.0);
        assert_eq!(y[20], 1.5);
    }

    #[test]
    fn quantizes_like_ggml() {
        let mut x = [0.0f32; 32];
        x[3] = -8.0;
        x[4] = 4.0;
        x[20] = 7.0;
        let mut b = [0u8; BLOCK_BYTES];
        quantize_block(&x, &mut b);
        // d = -8 / -8 = 1; -8 -> q 0, 4 -> q 12, 7 -> q 15, 0 -> q 8.
        assert_eq!(&b[..2], &[0x00, 0x3c]);
        assert_eq!(b[2 + 3], 0x80);
        assert_eq!(b[2 + 4], 0xfc);
        assert_eq!(b[2], 0x88);
        let mut y = [0.0; 32];
        dequantize_block(&b, &mut y);
        assert_eq!(y, x);
    }
}
