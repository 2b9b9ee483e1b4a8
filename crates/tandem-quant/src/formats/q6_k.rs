//! Q6_K: 256 elements in 210 bytes, `u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d`.
//!
//! Sixteen 16-element sub-blocks with signed 8-bit scales. For the 128-element half `h`, with
//! `ql = ql[64h..]`, `qh = qh[32h..]` and `l < 32`, the quants of elements `128h + l + 32k` are:
//! k=0: `ql[l] & 0xF`, k=1: `ql[l + 32] & 0xF`, k=2: `ql[l] >> 4`, k=3: `ql[l + 32] >> 4`, each
//! with high bits `(qh[l] >> 2k) & 3` on top (bits 4..6). Element = `d * scale * (q - 32)`.

use super::common::{arrays, get_f16, make_qx_quants_lanes, nearest_int, put_f16, via_f16, GROUP_MAX_EPS};

pub const BLOCK_ELEMS: usize = 256;
pub const BLOCK_BYTES: usize = 210;

pub fn dequantize_block(block: &[u8], out: &mut [f32]) {
    let (b, y) = arrays::<_, _, BLOCK_BYTES, BLOCK_ELEMS>(block, out);
    let d = get_f16(b, 208);
    for (h, y) in y.chunks_exact_mut(128).enumerate() {
        let ql = &b[64 * h..64 * h + 64];
        let qh = &b[128 + 32 * h..128 + 32 * h + 32];
        let sc = &b[192 + 8 * h..192 + 8 * h + 8];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

/// ggml's `quantize_row_q6_K_ref`: per sub-block scales by `make_qx_quants` (`make_qx_quants_lanes`), quantized to 8 bits
/// against the scale of largest magnitude (`d = max_scale / -128`), then quants re-derived.
pub fn quantize_block(x: &[f32], out: &mut [u8]) {
    let (x, b) = arrays::<_, _, BLOCK_ELEMS, BLOCK_BYTES>(x, out);
    let mut l = [0i8; 256];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    // The sixteen groups side by side (`xt[i][j]`: element i of group j), one lane each.
    let xt: [[f32; 16]; 16] = std::array::from_fn(|i| std::array::from_fn(|j| x[16 * j + i]));
    let mut lt = [[0i8; 16]; 16];
    let scales = make_qx_quants_lanes(32, &xt, &mut lt);
    for (i, row) in lt.iter().enumerate() {
        for (j, &q) in row.iter().enumerate() {
            l[16 * j + i] = q;
        }
    }
    for &s in &scales {
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    b.fill(0);
    if max_abs_scale < GROUP_MAX_EPS {
        return;
    }
    let iscale = -128.0 / max_scale;
    put_f16(b, 208, 1.0 / iscale);
    let d = via_f16(1.0 / iscale);
    for j in 0..16 {
        let s = nearest_int(iscale * scales[j]).clamp(-128, 127) as i8;
        b[192 + j] = s as u8;
        let dl = d * s as f32;
        if dl == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / dl).clamp(-32, 31) + 32) as i8;
        }
    }
    for h in 0..2 {
        let l = &l[128 * h..];
        for i in 0..32 {
            let q = |k: usize| l[i + 32 * k] as u8;
            b[64 * h + i] = (q(0) & 0xF) | ((q(2) & 0xF) << 4);
            b[64 * h + i + 32] = (q(1) & 0xF) | ((q(3) & 0xF) << 4);
            b[128 + 32 * h + i] = (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_built_block() {
        let mut b = [0u8; BLOCK_BYTES];
        b[208..210].copy_from_slice(&[0x00, 0x38]); // d = 0.5
        for (j, s) in b[192..208].iter_mut().enumerate() {
            *s = (j as i8 - 8) as u8; // scale of sub-block j = j - 8
        }
        // Element 0: q = 0x5 | 0b10 << 4 = 37 -> 5.   (sub-block 0, scale -8)
        b[0] = 0x5;
        b[128] = 0b10;
        // Element 32 + 17 = 49: ql[49] low nibble, qh[17] bits 2..4. (sub-block 3, scale -5)
        b[49] = 0xF;
        b[128 + 17] = 0b11 << 2;
        // Element 128 + 64 + 3 = 195: half 1, ql[64 + 3] high nibble, qh[32 + 3] bits 4..6.
        // (sub-block 12, scale 4)
        b[64 + 3] = 0x1 << 4;
        b[128 + 32 + 3] = 0b01 << 4;
        // Element 128 + 96 + 31 = 255: ql[64 + 63] high nibble, qh[32 + 31] bits 6..8.
        b[64 + 63] = 0x0;
        b[128 + 32 + 31] = 0b00 << 6;
        let mut y = [0.0; 256];
        dequantize_block(&b, &mut y);
        assert_eq!(y[0], 0.5 * -8.0 * 5.0);
        assert_eq!(y[49], 0.5 * -5.0 * (63.0 - 32.0));
        assert_eq!(y[195], 0.5 * 4.0 * (17.0 - 32.0));
        assert_eq!(y[255], 0.5 * 7.0 * -32.0);
        assert_eq!(y[1], 0.5 * -8.0 * -32.0);
    }
}
