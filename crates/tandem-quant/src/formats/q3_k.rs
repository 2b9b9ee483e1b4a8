//! Q3_K: 256 elements in 110 bytes, `u8 hmask[32] | u8 qs[64] | u8 scales[12] | f16 d`.
//!
//! Sixteen 16-element sub-blocks with 6-bit scales stored offset by 32: bytes 0..8 hold the low
//! 4 bits (scales 0..8 in low nibbles, 8..16 in high nibbles); bytes 8..12 hold the top 2 bits,
//! scale `j`'s at byte `8 + j % 4`, bits `2 * (j / 4)`. `qs` holds the low 2 bits of each quant laid
//! out as in Q2_K; bit `e / 32` of `hmask[e % 32]` is the high bit of element `e`.
//! Element = `d * (scale - 32) * (low2 - (high bit set ? 0 : 4))`.

use super::common::{arrays, get_f16, make_q3_quants, nearest_int, pack_2bit, put_f16};

pub const BLOCK_ELEMS: usize = 256;
pub const BLOCK_BYTES: usize = 110;

/// Unpacks the 16 scales exactly as ggml's `dequantize_row_q3_K` (kmask1/kmask2), minus 32.
pub(crate) fn unpack_scales(s: &[u8]) -> [i32; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, tmp) = (word(0), word(1), word(2));
    let aux = [
        (a0 & KMASK2) | ((tmp & KMASK1) << 4),
        (a1 & KMASK2) | (((tmp >> 2) & KMASK1) << 4),
        ((a0 >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4),
        ((a1 >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4),
    ];
    let mut out = [0i32; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (aux[i / 4].to_le_bytes()[i % 4] as i8) as i32 - 32;
    }
    out
}

/// Packs 16 offset scales (each in 0..64) the way `quantize_row_q3_K_ref` does.
pub(crate) fn pack_scales(ls: &[u8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (j, &l) in ls.iter().enumerate() {
        if j < 8 {
            s[j] = l & 0xF;
        } else {
            s[j - 8] |= (l & 0xF) << 4;
        }
        s[j % 4 + 8] |= ((l >> 4) & 3) << (2 * (j / 4));
    }
    s
}

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, y) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    let hm = &b[..32];
    let scales = unpack_scales(&b[96..108]);
    let d_all = get_f16(b, 108);
    let (mut is, mut o, mut m) = (0, 0, 1u8);
    for q in b[32..96].chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for r in [0..16, 16..32] {
                let dl = d_all * scales[is] as f32;
                is += 1;
                for l in r {
                    let low = ((q[l] >> shift) & 3) as i32;
                    let high = if hm[l] & m != 0 { 0 } else { 4 };
                    y[o] = dl * (low - high) as f32;
                    o += 1;
                }
            }
            m <<= 1;
        }
    }
}

/// ggml's `quantize_row_q3_K_ref`: per sub-block scales by `make_q3_quants`, quantized to 6 bits
/// against the scale of largest magnitude (`d = max_scale / -32`), then quants re-derived.
pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, b) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    let mut l = [0i8; 256];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    b.fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        let ls: [u8; 16] = std::array::from_fn(|j| (nearest_int(iscale * scales[j]).clamp(-32, 31) + 32) as u8);
        b[96..108].copy_from_slice(&pack_scales(&ls));
        put_f16(b, 108, 1.0 / iscale);
    }
    let d_all = get_f16(b, 108);
    let sc = unpack_scales(&b[96..108]);
    for ((&sc, xs), ls) in sc.iter().zip(x.chunks_exact(16)).zip(l.chunks_exact_mut(16)) {
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = (nearest_int(v / d).clamp(-4, 3) + 4) as i8;
        }
    }
    let mut low = [0u8; 256];
    for (e, &q) in l.iter().enumerate() {
        let q = q as u8;
        if q > 3 {
            b[e % 32] |= 1 << (e / 32);
        }
        low[e] = q & 3;
    }
    let qs: &mut [u8; 64] = (&mut b[32..96]).try_into().unwrap();
    pack_2bit(&low, qs);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_packing_round_trips() {
        let ls: [u8; 16] = std::array::from_fn(|j| ((j * 37 + 5) % 64) as u8);
        let s = pack_scales(&ls);
        let un = unpack_scales(&s);
        for j in 0..16 {
            assert_eq!(un[j], ls[j] as i32 - 32, "j={j}");
        }
    }

    #[test]
    fn hand_built_block() {
        let mut b = [0u8; BLOCK_BYTES];
        // Scales (offset by 32): scale 0 -> 33 (=1), scale 9 -> 34 (=2), scale 15 -> 0 (=-32),
        // all others 32 (=0).
        let mut ls = [32u8; 16];
        ls[0] = 33;
        ls[9] = 34;
        ls[15] = 0;
        // By hand: low nibbles in bytes 0..8 (lo) and 0..8 (hi), top bits in bytes 8..12.
        let mut s = [0u8; 12];
        for j in 0..16 {
            let l = ls[j];
            if j < 8 {
                s[j] |= l & 0xF;
            } else {
                s[j - 8] |= (l & 0xF) << 4;
            }
            s[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        assert_eq!(s[0], 0x01); // scale 0 low nibble 1, scale 8 low nibble 0
        assert_eq!(s[8], 0b1010_1010); // every scale in column 0 has top bits 0b10 ...
        assert_eq!(s, pack_scales(&ls));
        b[96..108].copy_from_slice(&s);
        b[108..110].copy_from_slice(&[0x00, 0x38]); // d = 0.5
                                                    // Element 0: low 2 bits 3, high bit set -> q = 3; element 1: low 0, high clear -> q = -4.
        b[32] = 3;
        b[0] = 1;
        // Element 144 (sub-block 9): half 1, byte 16, shift 0; high bit at hmask[16] bit 4.
        b[32 + 32 + 16] = 2;
        b[16] = 1 << 4;
        // Element 255 (sub-block 15): half 1, byte 31, shift 6; high bit clear -> q = 1 - 4.
        b[32 + 32 + 31] = 1 << 6;
        let mut y = [0.0; 256];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], 0.5 * 1.0 * 3.0);
        assert_eq!(y[1], 0.5 * 1.0 * -4.0);
        assert_eq!(y[144], 0.5 * 2.0 * 2.0);
        assert_eq!(y[145], 0.5 * 2.0 * -4.0);
        assert_eq!(y[255], 0.5 * -32.0 * -3.0);
        assert_eq!(y[20], 0.0); // scale 0 (= 32 offset)
    }
}
