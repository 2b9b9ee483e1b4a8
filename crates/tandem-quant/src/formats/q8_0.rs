//! Q8_0: 32 elements in 34 bytes, `f16 d | i8 qs[32]`. Element `j` is `qs[j] * d`.

use super::common::{arrays, get_f16, put_f16};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 34;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, y) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    let d = get_f16(b, 0);
    for j in 0..32 {
        y[j] = b[2 + j] as i8 as f32 * d;
    }
}

/// ggml's `quantize_row_q8_0_ref`: `d = amax / 127`, `q = round(x / d)` (half away from zero).
pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, b) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    for j in 0..32 {
        b[2 + j] = (x[j] * id).round() as i8 as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_block() {
        let mut b = [0u8; BLOCK_BYTES];
        b[..2].copy_from_slice(&[0x00, 0x38]); // d = 0.5
        for j in 0..32 {
            b[2 + j] = (j as i32 * 8 - 128) as i8 as u8;
        }
        b[2 + 31] = 127;
        let mut y = [0.0; 32];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], -64.0);
        assert_eq!(y[16], 0.0);
        assert_eq!(y[17], 4.0);
        assert_eq!(y[31], 63.5);
    }

    #[test]
    fn quantizes_like_ggml() {
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = -63.5; // rounds away from zero
        x[2] = 0.49;
        let mut b = [0u8; BLOCK_BYTES];
        quantize_block(&x, &mut b);
        assert_eq!(&b[..2], &[0x00, 0x3c]);
        assert_eq!(b[2] as i8, 127);
        assert_eq!(b[3] as i8, -64);
        assert_eq!(b[4] as i8, 0);
    }
}
