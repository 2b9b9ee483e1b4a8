//! Q8_K: 256 elements in 292 bytes, `f32 d | i8 qs[256] | i16 bsums[16]`.
//!
//! Element `j` is `d * qs[j]`; `bsums[i]` is the sum of `qs[16i..16i + 16]` (used by dot products,
//! not by dequantization). Q8_K is the intermediate format for activations in K-quant dot products.

use super::common::{arrays, nearest_int, signed_absmax};

pub const BLOCK_ELEMS: usize = 256;
pub const BLOCK_BYTES: usize = 292;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, y) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for j in 0..256 {
        y[j] = d * (b[4 + j] as i8) as f32;
    }
}

/// ggml's `quantize_row_q8_K_ref`: `iscale = -127 / max` (max = value of largest magnitude),
/// `q = min(127, nearest_int(iscale * x))`, `d = 1 / iscale`, bsums filled.
pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, b) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    let max = signed_absmax(x);
    b.fill(0);
    if max == 0.0 {
        return;
    }
    let iscale = -127.0 / max;
    for j in 0..256 {
        b[4 + j] = nearest_int(iscale * x[j]).clamp(-128, 127) as i8 as u8;
    }
    for i in 0..16 {
        let sum: i32 = b[4 + 16 * i..4 + 16 * i + 16].iter().map(|&q| q as i8 as i32).sum();
        b[260 + 2 * i..262 + 2 * i].copy_from_slice(&(sum as i16).to_le_bytes());
    }
    b[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_block() {
        let mut b = [0u8; BLOCK_BYTES];
        b[..4].copy_from_slice(&0.25f32.to_le_bytes());
        b[4] = (-128i8) as u8;
        b[4 + 100] = 8;
        b[4 + 255] = 127;
        let mut y = [0.0; 256];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], -32.0);
        assert_eq!(y[100], 2.0);
        assert_eq!(y[255], 31.75);
        assert_eq!(y[1], 0.0);
    }

    #[test]
    fn quantize_fills_bsums() {
        let x: [f32; 256] = std::array::from_fn(|i| (i as f32 - 100.0) / 7.0);
        let mut b = [0u8; BLOCK_BYTES];
        quantize_block(&x, &mut b);
        // max is x[255] = 155/7, so iscale = -127 * 7 / 155 and d < 0.
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        assert!((d - -155.0 / 7.0 / 127.0).abs() < 1e-6);
        assert_eq!(b[4 + 255] as i8, -127);
        for i in 0..16 {
            let want: i32 = (0..16).map(|k| b[4 + 16 * i + k] as i8 as i32).sum();
            let got = i16::from_le_bytes([b[260 + 2 * i], b[261 + 2 * i]]) as i32;
            assert_eq!(got, want);
        }
    }
}
