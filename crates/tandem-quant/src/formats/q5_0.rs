//! Q5_0: 32 elements in 22 bytes, `f16 d | u8 qh[4] | u8 qs[16]`.
//!
//! `qh` is a little-endian u32 whose bit `i` is the 5th bit of element `i`. Element `j` (0..16) is
//! `((qs[j] & 0xF | bit j of qh << 4) - 16) * d`, element `j + 16` is
//! `((qs[j] >> 4 | bit (j + 16) of qh << 4) - 16) * d`.

use super::common::{arrays, get_f16, put_f16, signed_absmax};

pub const BLOCK_ELEMS: usize = 32;
pub const BLOCK_BYTES: usize = 22;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, y) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    let d = get_f16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..];
    for j in 0..16 {
        let xh_0 = ((qh >> j) << 4) & 0x10;
        let xh_1 = (qh >> (j + 12)) & 0x10;
        y[j] = (((qs[j] & 0xF) as u32 | xh_0) as i32 - 16) as f32 * d;
        y[j + 16] = (((qs[j] >> 4) as u32 | xh_1) as i32 - 16) as f32 * d;
    }
}

/// ggml's `quantize_row_q5_0_ref`: `d = max / -16` where `max` is the value of largest magnitude.
pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, b) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    let d = signed_absmax(x) / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_f16(b, 0, d);
    let q = |v: f32| ((v * id + 16.5) as i8).clamp(0, 31) as u32;
    let mut qh = 0u32;
    for j in 0..16 {
        let (q0, q1) = (q(x[j]), q(x[j + 16]));
        b[6 + j] = ((q0 & 0xF) | ((q1 & 0xF) << 4)) as u8;
        qh |= ((q0 & 0x10) >> 4) << j;
        qh |= ((q1 & 0x10) >> 4) << (j + 16);
    }
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_block() {
        let mut b = [0u8; BLOCK_BYTES];
        b[..2].copy_from_slice(&[0x00, 0x3c]); // d = 1
                                               // qh bits: element 0 and element 17 and element 31 have the 5th bit.
        let qh: u32 = 1 | (1 << 17) | (1 << 31);
        b[2..6].copy_from_slice(&qh.to_le_bytes());
        for j in 0..16 {
            b[6 + j] = j as u8 | ((15 - j as u8) << 4);
        }
        let mut y = [0.0; 32];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], 0.0); // 0 | 16 - 16
        assert_eq!(y[1], -15.0); // 1 - 16
        assert_eq!(y[15], -1.0);
        assert_eq!(y[16], -1.0); // 15 - 16
        assert_eq!(y[17], 14.0); // 14 | 16 - 16
        assert_eq!(y[31], 0.0); // 0 | 16 - 16
    }

    #[test]
    fn quantize_sets_high_bits() {
        let x: [f32; 32] = std::array::from_fn(|i| i as f32 - 16.0);
        let mut b = [0u8; BLOCK_BYTES];
        quantize_block(&x, &mut b);
        // d = -16 / -16 = 1; q = x + 16 = i, so bit i of qh is set for i >= 16.
        assert_eq!(u32::from_le_bytes([b[2], b[3], b[4], b[5]]), 0xffff_0000);
        let mut y = [0.0; 32];
        dequantize_block(&b, &mut y);
        assert_eq!(y, x);
    }
}
