//! The activation layout both GEMMs (`gemm_avx512`, 16 lanes; `gemm_avx2`, 8 lanes) read: a group
//! of `lanes` activation rows is packed so that one vector load gives 4 consecutive quants of each
//! row (row `l` in bytes `4l..4l + 4` of each step), followed per block by the rows' per-block
//! fields, one 4-byte lane each.

use super::super::act_quant::QuantizedActs;

/// Packed bytes per 32-element block: 8 steps of `4·lanes` quant bytes, then `lanes` lanes each of
/// `-sum` (i32), `d` and `s` (f32), at [`leg_fields`].
pub(crate) const fn leg_block(lanes: usize) -> usize {
    (8 + 3) * 4 * lanes
}

/// Where a legacy block's `-sum`, `d` and `s` lanes start.
pub(crate) const fn leg_fields(lanes: usize) -> [usize; 3] {
    [32 * lanes, 36 * lanes, 40 * lanes]
}

/// Packed bytes per 256-element super-block: 64 steps of `4·lanes` quant bytes, 8 vectors of
/// `bsums` pairs (two i16 per lane), then `lanes` lanes of `d`, at [`k_fields`].
pub(crate) const fn k_block(lanes: usize) -> usize {
    (64 + 8 + 1) * 4 * lanes
}

/// Where a super-block's `bsums` pairs and `d` lanes start.
pub(crate) const fn k_fields(lanes: usize) -> [usize; 2] {
    [256 * lanes, 288 * lanes]
}

/// Packs group `g` (activation rows `lanes·g..lanes·(g + 1)`, missing rows as zeros) of Q8 rows
/// into `dst` (`(k / 32) · leg_block(lanes)` bytes).
pub(crate) fn pack_q8(acts: &QuantizedActs, g: usize, dst: &mut [u8], lanes: usize) {
    let nb = acts.cols() / 32;
    assert_eq!(dst.len(), nb * leg_block(lanes));
    let [neg_sum, d, s] = leg_fields(lanes);
    dst.fill(0);
    for l in 0..lanes {
        let m = g * lanes + l;
        if m >= acts.rows() {
            break;
        }
        let row = acts.q8_row(m);
        for (b, blk) in dst.chunks_exact_mut(leg_block(lanes)).enumerate() {
            for (step, q) in row.qs[32 * b..32 * b + 32].chunks_exact(4).enumerate() {
                for (i, &v) in q.iter().enumerate() {
                    blk[4 * lanes * step + 4 * l + i] = v as u8;
                }
            }
            blk[neg_sum + 4 * l..][..4].copy_from_slice(&(-row.sum[b]).to_le_bytes());
            blk[d + 4 * l..][..4].copy_from_slice(&row.d[b].to_le_bytes());
            blk[s + 4 * l..][..4].copy_from_slice(&row.s[b].to_le_bytes());
        }
    }
}

/// Packs group `g` of Q8_K rows into `dst` (`(k / 256) · k_block(lanes)` bytes).
pub(crate) fn pack_q8k(acts: &QuantizedActs, g: usize, dst: &mut [u8], lanes: usize) {
    let nb = acts.cols() / 256;
    assert_eq!(dst.len(), nb * k_block(lanes));
    let [bsums, d] = k_fields(lanes);
    dst.fill(0);
    for l in 0..lanes {
        let m = g * lanes + l;
        if m >= acts.rows() {
            break;
        }
        let row = acts.q8k_row(m);
        for (b, blk) in dst.chunks_exact_mut(k_block(lanes)).enumerate() {
            for (step, q) in row.qs[256 * b..256 * b + 256].chunks_exact(4).enumerate() {
                for (i, &v) in q.iter().enumerate() {
                    blk[4 * lanes * step + 4 * l + i] = v as u8;
                }
            }
            for p in 0..16 {
                let at = bsums + 4 * lanes * (p / 2) + 4 * l + 2 * (p % 2);
                blk[at..at + 2].copy_from_slice(&row.bsums[16 * b + p].to_le_bytes());
            }
            blk[d + 4 * l..][..4].copy_from_slice(&row.d[b].to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::act_quant::ActFormat;
    use crate::{Isa, ThreadPool};

    /// Every quant and field lands where the GEMMs read it, for both lane counts, with rows past
    /// the end of the batch as zeros.
    #[test]
    fn fields_land_where_the_tiles_read_them() {
        let pool = ThreadPool::new(1);
        let (t, cols) = (11, 512);
        let x: Vec<f32> = (0..t * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        for lanes in [8, 16] {
            let mut acts = QuantizedActs::default();
            acts.quantize(&pool, Isa::Scalar, ActFormat::Q8, &x, t, cols);
            let mut dst = vec![0xAAu8; (cols / 32) * leg_block(lanes)];
            let [neg_sum, d, s] = leg_fields(lanes);
            let i32_at = |blk: &[u8], at: usize| i32::from_le_bytes(blk[at..at + 4].try_into().unwrap());
            let f32_at = |blk: &[u8], at: usize| f32::from_le_bytes(blk[at..at + 4].try_into().unwrap());
            for g in 0..t.div_ceil(lanes) {
                pack_q8(&acts, g, &mut dst, lanes);
                for l in 0..lanes {
                    let m = g * lanes + l;
                    for (b, blk) in dst.chunks_exact(leg_block(lanes)).enumerate() {
                        let want = |f: &dyn Fn(&crate::cpu::act_quant::Q8Row) -> i64| {
                            if m < t {
                                f(&acts.q8_row(m))
                            } else {
                                0
                            }
                        };
                        for i in 0..32 {
                            let got = blk[4 * lanes * (i / 4) + 4 * l + i % 4] as i8 as i64;
                            assert_eq!(got, want(&|r| r.qs[32 * b + i] as i64), "lanes {lanes} row {m} q{i}");
                        }
                        assert_eq!(i32_at(blk, neg_sum + 4 * l) as i64, want(&|r| -r.sum[b] as i64));
                        let (gd, gs) = (f32_at(blk, d + 4 * l), f32_at(blk, s + 4 * l));
                        assert_eq!(gd.to_bits() as i64, want(&|r| r.d[b].to_bits() as i64));
                        assert_eq!(gs.to_bits() as i64, want(&|r| r.s[b].to_bits() as i64));
                    }
                }
            }
            acts.quantize(&pool, Isa::Scalar, ActFormat::Q8K, &x, t, cols);
            let mut dst = vec![0xAAu8; (cols / 256) * k_block(lanes)];
            let [bsums, d] = k_fields(lanes);
            for g in 0..t.div_ceil(lanes) {
                pack_q8k(&acts, g, &mut dst, lanes);
                for l in 0..lanes {
                    let m = g * lanes + l;
                    let row = (m < t).then(|| acts.q8k_row(m));
                    for (b, blk) in dst.chunks_exact(k_block(lanes)).enumerate() {
                        for i in 0..256 {
                            let got = blk[4 * lanes * (i / 4) + 4 * l + i % 4] as i8;
                            assert_eq!(
                                got,
                                row.as_ref().map_or(0, |r| r.qs[256 * b + i]),
                                "lanes {lanes} row {m}"
                            );
                        }
                        for p in 0..16 {
                            let at = bsums + 4 * lanes * (p / 2) + 4 * l + 2 * (p % 2);
                            let got = i16::from_le_bytes([blk[at], blk[at + 1]]);
                            assert_eq!(got, row.as_ref().map_or(0, |r| r.bsums[16 * b + p]));
                        }
                        let got = f32_at(blk, d + 4 * l);
                        assert_eq!(got.to_bits(), row.as_ref().map_or(0, |r| r.d[b].to_bits()));
                    }
                }
            }
        }
    }
}
