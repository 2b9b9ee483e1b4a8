//! F16: one element per 2-byte "block", a little-endian IEEE half. Quantizing rounds to nearest
//! even (as `GGML_FP32_TO_FP16`).

use super::common::{arrays, get_f16, put_f16};

pub const BLOCK_ELEMS: usize = 1;
pub const BLOCK_BYTES: usize = 2;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, o) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    o[0] = get_f16(b, 0);
}

pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, o) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    put_f16(o, 0, x[0]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_bytes() {
        let mut y = [0.0];
        dequantize_block(&[0x00, 0x3c], &mut y);
        assert_eq!(y, [1.0]);
        dequantize_block(&[0x00, 0xc1], &mut y);
        assert_eq!(y, [-2.5]);
        let mut b = [0u8; 2];
        quantize_block(&[0.5], &mut b);
        assert_eq!(b, [0x00, 0x38]);
        // 1 + 2^-11 is halfway between 1 and the next half; ties go to even (1.0).
        quantize_block(&[1.0 + 2f32.powi(-11)], &mut b);
        assert_eq!(b, [0x00, 0x3c]);
    }
}
