//! F32: one element per 4-byte "block", a little-endian IEEE single. Stored as-is.

use super::common::arrays;

pub const BLOCK_ELEMS: usize = 1;
pub const BLOCK_BYTES: usize = 4;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, o) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    o[0] = f32::from_le_bytes(*b);
}

pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, o) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    *o = x[0].to_le_bytes();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_bytes() {
        let mut y = [0.0];
        dequantize_block(&[0x00, 0x00, 0x80, 0x3f], &mut y);
        assert_eq!(y, [1.0]);
        let mut b = [0u8; 4];
        quantize_block(&[-2.0], &mut b);
        assert_eq!(b, [0x00, 0x00, 0x00, 0xc0]);
    }
}
