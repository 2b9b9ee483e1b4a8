//! Q5_K: 256 elements in 176 bytes, `f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]`.
//!
//! Scales, mins and the low 4 bits in `qs` are laid out as in Q4_K. The 5th bit of element
//! `64c + l` (l < 32) is bit `2c` of `qh[l]`, and of element `64c + 32 + l` bit `2c + 1`.
//! Element = `d * scale * q - dmin * min`.

use super::common::{arrays, get_f16, get_scale_min_k4};
use super::q4_k::quantize_scales_mins;

pub const BLOCK_ELEMS: usize = 256;
pub const BLOCK_BYTES: usize = 176;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, y) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    let (d, dmin) = (get_f16(b, 0), get_f16(b, 2));
    let scales: &[u8; 12] = b[4..16].try_into().unwrap();
    let qh = &b[16..48];
    let (mut u1, mut u2) = (1u8, 2u8);
    for (c, (ql, y)) in b[48..].chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let (sc1, m1) = get_scale_min_k4(2 * c, scales);
        let (sc2, m2) = get_scale_min_k4(2 * c + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
            y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
        u1 <<= 2;
        u2 <<= 2;
    }
}

/// ggml's `quantize_row_q5_K_ref`.
pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, b) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    let mut scales = [0u8; 12];
    let l = quantize_scales_mins(x, 31, -0.5, 15, &mut b[..4], &mut scales);
    b[4..16].copy_from_slice(&scales);
    let (head, ql) = b.split_at_mut(48);
    let qh = &mut head[16..48];
    qh.fill(0);
    for (c, ql) in ql.chunks_exact_mut(32).enumerate() {
        for i in 0..32 {
            let (l1, l2) = (l[64 * c + i], l[64 * c + i + 32]);
            qh[i] |= ((l1 >> 4) & 1) << (2 * c) | ((l2 >> 4) & 1) << (2 * c + 1);
            ql[i] = (l1 & 0xF) | ((l2 & 0xF) << 4);
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
        b[2..4].copy_from_slice(&[0x00, 0x3c]); // dmin = 1
        let s = &mut b[4..16];
        s[0] = 1; // sub-block 0: scale 1, min 0
        s[3] = 2; // sub-block 3: scale 2
        s[7] = 5; // sub-block 3: min 5
        s[10] = 0x4 | (0x1 << 4); // sub-block 6: scale 4, min 1
                                  // Element 0: q = 3 + 16 (qh[0] bit 0).
        b[48] = 3;
        b[16] |= 1;
        // Element 96 + 5 (chunk 1, high nibble, sub-block 3): q = 10 + 16 (qh[5] bit 3).
        b[48 + 32 + 5] = 10 << 4;
        b[16 + 5] |= 1 << 3;
        // Element 192 + 7 (chunk 3, low nibble, sub-block 6): q = 2, 5th bit (qh[7] bit 6) clear.
        b[48 + 96 + 7] = 2;
        b[16 + 7] |= 1 << 7; // bit 7 belongs to element 224 + 7 (sub-block 7, scale 0)
        let mut y = [0.0; 256];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], 19.0);
        assert_eq!(y[1], 0.0);
        assert_eq!(y[101], 2.0 * 26.0 - 5.0);
        assert_eq!(y[100], -5.0);
        assert_eq!(y[199], 4.0 * 2.0 - 1.0);
        assert_eq!(y[231], 0.0);
    }
}
