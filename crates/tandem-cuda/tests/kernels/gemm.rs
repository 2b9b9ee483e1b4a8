//! The prefill GEMM route's other forms against an f64 product of the same f16 operands: gate's and
//! up's products side by side in one f16 buffer (two GEMMs, or one over the stacked weights), and q,
//! k and v from one stacked GEMM cut apart by `split_columns`.

use anyhow::Result;
use tandem_cuda::lab::launch::{gemm_f16_into, gemm_f16_out, split_columns_into};
use tandem_cuda::Gpu;

use crate::common::{rel_err, Rng, Row};

#[test]
fn stacked_gemm_split_against_f64() {
    crate::common::run("stacked gemm split checks", stacked_split_checks);
}

#[test]
fn gate_and_up_side_by_side_against_f64() {
    crate::common::run("gate and up pair checks", pair_checks);
}

/// `n` f16 values drawn from `rng` (roughly normal).
fn normal_f16s(rng: &mut Rng, n: usize) -> Vec<u16> {
    (0..n).map(|_| half::f16::from_f32(rng.normal()).to_bits()).collect()
}

/// `x · wᵀ` in f64 from f16 operands: `t` rows of `rows` outputs, `w` row-major `rows x cols`, `x`
/// row-major `t x cols`.
fn f64_product(w: &[u16], x: &[u16], t: usize, rows: usize, cols: usize) -> Vec<f64> {
    let val = |b: u16| half::f16::from_bits(b).to_f32() as f64;
    let mut out = vec![0f64; t * rows];
    for r in 0..t {
        for o in 0..rows {
            out[r * rows + o] = (0..cols).map(|c| val(w[o * cols + c]) * val(x[r * cols + c])).sum();
        }
    }
    out
}

/// q, k and v made by one GEMM over their stacked weights and cut apart by `split_columns`, against
/// an f64 product of the same f16 operands and bit for bit against the stacked products; the parts
/// poisoned with NaN first.
pub(crate) fn stacked_split_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let (t, cols) = (37usize, 256usize);
    let widths = [384usize, 128, 132];
    let total: usize = widths.iter().sum();
    let (w, x) = (normal_f16s(rng, total * cols), normal_f16s(rng, t * cols));
    // Every part count's products are the first rows of this one.
    let want_all = f64_product(&w, &x, t, total, cols);
    let (w_dev, x_dev) = (gpu.upload(&w)?, gpu.upload(&x)?);
    for n in [3usize, 2] {
        let parts_w = &widths[..n];
        let width: usize = parts_w.iter().sum();
        let mut src = gpu.alloc::<f32>(t * width)?;
        gemm_f16_into(gpu, &w_dev.slice(..width * cols), &x_dev, t, width, cols, &mut src)?;
        let mut outs = parts_w
            .iter()
            .map(|&r| gpu.upload(&vec![f32::NAN; t * r]))
            .collect::<Result<Vec<_>, _>>()?;
        let mut parts: Vec<_> = outs.iter_mut().zip(parts_w.iter().copied()).collect();
        split_columns_into(gpu, &src, t, &mut parts)?;
        let whole = gpu.download(&src)?;
        let (mut exact, mut worst) = (true, 0f64);
        let mut at = 0;
        for (out, &r) in outs.iter().zip(parts_w) {
            let got = gpu.download(out)?;
            let mut want = vec![0f64; t * r];
            for row in 0..t {
                for o in 0..r {
                    want[row * r + o] = want_all[row * total + at + o];
                    exact &= got[row * r + o].to_bits() == whole[row * width + at + o].to_bits();
                }
            }
            worst = worst.max(rel_err(&got, &want));
            at += r;
        }
        // f16 operands are exact; the f32 sums cost far less than this.
        let bound = 1e-5;
        table.push(Row {
            check: format!("gemm stacked, split into {n} parts {parts_w:?}, t={t}"),
            result: format!(
                "rel err {worst:.2e} (bound {bound:.0e}); {} the stacked products",
                if exact { "bit-equal to" } else { "NOT bit-equal to" }
            ),
            pass: worst < bound && exact,
        });
    }
    Ok(())
}

/// Gate's and up's products written side by side in one f16 buffer, by two GEMMs (each at its offset,
/// rows of twice the width) and by one GEMM over the stacked weights, against an f64 product of the
/// same f16 operands; the buffer poisoned with NaN first.
pub(crate) fn pair_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let (t, width, cols) = (24usize, 384usize, 256usize);
    let (w, x) = (normal_f16s(rng, 2 * width * cols), normal_f16s(rng, t * cols));
    let want = f64_product(&w, &x, t, 2 * width, cols);
    let (w_dev, x_dev) = (gpu.upload(&w)?, gpu.upload(&x)?);
    let split = width * cols;
    for one_gemm in [false, true] {
        let mut pair = gpu.upload(&vec![0x7e00u16; t * 2 * width])?;
        if one_gemm {
            gemm_f16_out(
                gpu,
                &w_dev.slice(..),
                &x_dev,
                t,
                2 * width,
                cols,
                &mut pair,
                0,
                2 * width,
            )?;
        } else {
            gemm_f16_out(
                gpu,
                &w_dev.slice(..split),
                &x_dev,
                t,
                width,
                cols,
                &mut pair,
                0,
                2 * width,
            )?;
            gemm_f16_out(
                gpu,
                &w_dev.slice(split..),
                &x_dev,
                t,
                width,
                cols,
                &mut pair,
                width,
                2 * width,
            )?;
        }
        let got: Vec<f32> = gpu
            .download(&pair)?
            .into_iter()
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect();
        let err = rel_err(&got, &want);
        // f16 operands are exact here; the f16 output costs about 2^-12 relative.
        let bound = 2e-3;
        table.push(Row {
            check: format!(
                "gemm gate+up into one f16 buffer ({}), t={t}",
                if one_gemm {
                    "one stacked GEMM"
                } else {
                    "two GEMMs side by side"
                }
            ),
            result: format!("rel err {err:.2e} (bound {bound:.0e})"),
            pass: err < bound,
        });
    }
    Ok(())
}
