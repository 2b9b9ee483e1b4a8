//! Q2_K: 256 elements in 84 bytes, `u8 scales[16] | u8 qs[64] | f16 d | f16 dmin`.
//!
//! Sixteen 16-element sub-blocks; `scales[i]` holds sub-block `i`'s 4-bit scale (low nibble) and
//! 4-bit min (high nibble). `qs` holds 2-bit quants: for the 128-element half `h`, byte
//! `qs[32h + l]` carries elements `128h + l + 32k` at bits `2k..2k+2` (k = 0..4).
//! Element = `d * scale * q - dmin * min`.

use super::common::{arrays, get_f16, make_qkx2_quants, nearest_int, pack_2bit, put_f16, via_f16};

pub const BLOCK_ELEMS: usize = 256;
pub const BLOCK_BYTES: usize = 84;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, y) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    let scales = &b[..16];
    let (d, dmin) = (get_f16(b, 80), get_f16(b, 82));
    let mut is = 0;
    let mut o = 0;
    for q in b[16..80].chunks_exact(32) {
        for shift in [0, 2, 4, 6] {
            for half in [&q[..16], &q[16..]] {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                for &v in half {
                    y[o] = dl * ((v >> shift) & 3) as f32 - ml;
                    o += 1;
                }
            }
        }
    }
}

/// ggml's `quantize_row_q2_K_ref`: per sub-block scale and min by `make_qkx2_quants` (|x|-weighted,
/// absolute error), both quantized to 4 bits against the block maxima, then quants re-derived.
pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, b) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    let mut l = [0u8; 256];
    let mut scales = [0f32; 16];
    let mut mins = [0f32; 16];
    let mut weights = [0f32; 16];
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let ls = &mut l[16 * j..16 * j + 16];
        (scales[j], mins[j]) = make_qkx2_quants(3, xs, &weights, ls, -0.5, 0.1, 15, true);
    }
    let max_scale = scales.iter().fold(0f32, |a, &s| a.max(s));
    let max_min = mins.iter().fold(0f32, |a, &m| a.max(m));

    let mut packed = [0u8; 16];
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for j in 0..16 {
            packed[j] = nearest_int(iscale * scales[j]).clamp(0, 15) as u8;
        }
    }
    let d = if max_scale > 0.0 { max_scale / 15.0 } else { 0.0 };
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for j in 0..16 {
            packed[j] |= (nearest_int(iscale * mins[j]).clamp(0, 15) as u8) << 4;
        }
    }
    let dmin = if max_min > 0.0 { max_min / 15.0 } else { 0.0 };
    put_f16(b, 80, d);
    put_f16(b, 82, dmin);
    b[..16].copy_from_slice(&packed);

    let (d, dmin) = (via_f16(d), via_f16(dmin));
    for ((&sc, xs), ls) in packed.iter().zip(x.chunks_exact(16)).zip(l.chunks_exact_mut(16)) {
        let dl = d * (sc & 0xF) as f32;
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * (sc >> 4) as f32;
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = nearest_int((v + dm) / dl).clamp(0, 3) as u8;
        }
    }
    let qs: &mut [u8; 64] = (&mut b[16..80]).try_into().unwrap();
    pack_2bit(&l, qs);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_block() {
        let mut b = [0u8; BLOCK_BYTES];
        for (i, s) in b[..16].iter_mut().enumerate() {
            // scale = i % 16, min = 1 for odd sub-blocks.
            *s = i as u8 | (((i & 1) as u8) << 4);
        }
        // Half 0, byte 0: elements 0, 32, 64, 96 get q = 1, 2, 3, 0.
        b[16] = 1 | (2 << 2) | (3 << 4);
        // Half 1, byte 20: elements 148, 180, 212, 244 get q = 3, 3, 3, 3.
        b[16 + 32 + 20] = 0xff;
        b[80..82].copy_from_slice(&[0x00, 0x3c]); // d = 1
        b[82..84].copy_from_slice(&[0x00, 0x40]); // dmin = 2
        let mut y = [0.0; 256];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], 0.0); // sub-block 0: scale 0
        assert_eq!(y[32], 2.0 * 2.0); // sub-block 2: scale 2, q 2
        assert_eq!(y[64], 4.0 * 3.0); // sub-block 4: scale 4, q 3
        assert_eq!(y[96], 0.0); // sub-block 6, q 0
        assert_eq!(y[16], -2.0); // sub-block 1: min 1 * dmin 2, q 0
        assert_eq!(y[148], 9.0 * 3.0 - 2.0); // sub-block 9
        assert_eq!(y[180], 11.0 * 3.0 - 2.0); // sub-block 11
        assert_eq!(y[212], 13.0 * 3.0 - 2.0);
        assert_eq!(y[244], 15.0 * 3.0 - 2.0);
        assert_eq!(y[245], -2.0);
    }
}
