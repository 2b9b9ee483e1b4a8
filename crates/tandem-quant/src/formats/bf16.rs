//! BF16: one element per 2-byte "block", little-endian; the upper 16 bits of an f32. Quantizing is
//! ggml's `ggml_compute_fp32_to_bf16`: round to nearest even, NaN becomes a quiet NaN.

use super::common::arrays;

pub const BLOCK_ELEMS: usize = 1;
pub const BLOCK_BYTES: usize = 2;

/// ggml's `ggml_compute_fp32_to_bf16`.
pub fn f32_to_bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u as u64 + (0x7fff + ((u as u64 >> 16) & 1))) >> 16) as u16
}

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, o) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    o[0] = f32::from_bits((u16::from_le_bytes(*b) as u32) << 16);
}

pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, o) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    *o = f32_to_bf16_bits(x[0]).to_le_bytes();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_bytes() {
        let mut y = [0.0];
        dequantize_block(&[0x80, 0x3f], &mut y);
        assert_eq!(y, [1.0]);
        dequantize_block(&[0x20, 0xc0], &mut y);
        assert_eq!(y, [-2.5]);
    }

    #[test]
    fn rounds_to_nearest_even_and_quiets_nan() {
        // Exactly halfway: ties to even.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
        // Above halfway rounds up, below rounds down.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_7fff)), 0x3f80);
        // A signalling NaN whose payload is all in the low half stays a NaN.
        assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(f32_to_bf16_bits(f32::INFINITY), 0x7f80);
        let mut b = [0u8; 2];
        quantize_block(&[-1.0], &mut b);
        assert_eq!(b, [0x80, 0xbf]);
    }
}
