//! `--bench-gemm`: the prefill GEMM shapes of the Llama-3-8B layer through cuBLAS (f16 operands, f32
//! accumulation), timed at 512 and 4096 rows: each projection with f32 output as the GEMM route
//! writes it, and gate and up three ways (two GEMMs with f32 outputs; two GEMMs writing f16 side by
//! side into one buffer; one GEMM over the stacked weights), which is how `ffn.rs` chose its form.

use std::time::Instant;

use anyhow::Result;
use tandem_cuda::runtime::launch::{gemm_f16_into, gemm_f16_out, split_columns_into};
use tandem_cuda::Gpu;

use super::{rel_err, Rng, Row};

/// `n` f16 values spread over (-1, 1), from a fixed generator.
fn random_f16(n: usize, seed: u64) -> Vec<u16> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            half::f16::from_f32(((state >> 40) as f32 / (1u64 << 23) as f32) - 1.0).to_bits()
        })
        .collect()
}

/// Times `f` (which enqueues one GEMM set) over `iters` runs after two warm-up runs.
fn time(gpu: &Gpu, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    f()?;
    gpu.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    gpu.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() / iters as f64)
}

pub(super) fn gemm_bench(gpu: &Gpu, table: &mut Vec<Row>) -> Result<()> {
    let (d, ff) = (4096usize, 14336usize);
    // Random values: the tensor cores draw more power on them than on zeros, and clocks follow power.
    let w_gate_up = gpu.upload(&random_f16(2 * ff * d, 1))?;
    let w_down = gpu.upload(&random_f16(d * ff, 2))?;
    for t in [512usize, 4096] {
        let x = gpu.upload(&random_f16(t * ff, 3))?;
        let mut out32 = gpu.alloc::<f32>(t * 2 * ff)?;
        let mut out32b = gpu.alloc::<f32>(t * ff)?;
        let mut pair = gpu.alloc::<u16>(t * 2 * ff)?;
        let iters = if t == 512 { 40 } else { 10 };
        let mut report = |what: String, flops: f64, secs: f64| {
            table.push(Row {
                check: format!("gemm timing {what}, t={t}"),
                result: format!("{:.1} us, {:.0} TFLOP/s", secs * 1e6, flops / secs / 1e12),
                pass: true,
            });
        };
        for (rows, cols) in [(d, d), (1024, d), (ff, d), (d, ff), (6144, d)] {
            let w = if cols == ff {
                w_down.slice(0..rows * cols)
            } else {
                w_gate_up.slice(0..rows * cols)
            };
            let secs = time(gpu, iters, || {
                Ok(gemm_f16_into(gpu, &w, &x, t, rows, cols, &mut out32)?)
            })?;
            report(format!("{rows}x{cols} f32 out"), 2.0 * (t * rows * cols) as f64, secs);
        }
        let flops = 4.0 * (t * ff * d) as f64;
        let (wg, wu) = (w_gate_up.slice(0..ff * d), w_gate_up.slice(ff * d..));
        let secs = time(gpu, iters, || {
            gemm_f16_into(gpu, &wg, &x, t, ff, d, &mut out32)?;
            Ok(gemm_f16_into(gpu, &wu, &x, t, ff, d, &mut out32b)?)
        })?;
        report("gate, up: two GEMMs, f32 out".into(), flops, secs);
        let secs = time(gpu, iters, || {
            gemm_f16_out(gpu, &wg, &x, t, ff, d, &mut pair, 0, 2 * ff)?;
            Ok(gemm_f16_out(gpu, &wu, &x, t, ff, d, &mut pair, ff, 2 * ff)?)
        })?;
        report("gate, up: two GEMMs, f16 side by side".into(), flops, secs);
        let all = w_gate_up.slice(..);
        let secs = time(gpu, iters, || {
            Ok(gemm_f16_out(gpu, &all, &x, t, 2 * ff, d, &mut pair, 0, 2 * ff)?)
        })?;
        report("gate+up: one stacked GEMM, f16".into(), flops, secs);
    }
    stacked_qkv_bench(gpu, &w_gate_up, table)
}

/// q, k and v of the Llama-3-8B shape (4096, 1024 and 1024 rows over 4096 columns) as three GEMMs
/// against one GEMM over stacked weights and the split into three activations
/// (`routes::STACKED_SPLIT_MAX_ROWS` was set from this).
fn stacked_qkv_bench(gpu: &Gpu, w: &tandem_cuda::CudaSlice<u16>, table: &mut Vec<Row>) -> Result<()> {
    let d = 4096usize;
    let widths = [d, 1024, 1024];
    let total: usize = widths.iter().sum();
    let all = w.slice(0..total * d);
    for t in [512usize, 1024, 2048, 4096] {
        let x = gpu.upload(&random_f16(t * d, 4))?;
        let mut outs = widths
            .iter()
            .map(|&r| gpu.alloc::<f32>(t * r))
            .collect::<Result<Vec<_>, _>>()?;
        let mut stacked = gpu.alloc::<f32>(t * total)?;
        let iters = 4096 / t * 10;
        let separate = time(gpu, iters, || {
            let mut at = 0;
            for (out, &r) in outs.iter_mut().zip(&widths) {
                gemm_f16_into(gpu, &w.slice(at * d..(at + r) * d), &x, t, r, d, out)?;
                at += r;
            }
            Ok(())
        })?;
        let gemm_only = time(gpu, iters, || {
            Ok(gemm_f16_into(gpu, &all, &x, t, total, d, &mut stacked)?)
        })?;
        let with_split = time(gpu, iters, || {
            gemm_f16_into(gpu, &all, &x, t, total, d, &mut stacked)?;
            let mut parts: Vec<_> = outs.iter_mut().zip(widths).collect();
            Ok(split_columns_into(gpu, &stacked, t, &mut parts)?)
        })?;
        let flops = 2.0 * (t * total * d) as f64;
        table.push(Row {
            check: format!("gemm timing q, k, v {total}x{d}, t={t}"),
            result: format!(
                "three GEMMs {:.1} us ({:.0} TFLOP/s); one stacked GEMM {:.1} us ({:.0}), with the split {:.1} us: {:.2}x",
                separate * 1e6,
                flops / separate / 1e12,
                gemm_only * 1e6,
                flops / gemm_only / 1e12,
                with_split * 1e6,
                separate / with_split
            ),
            pass: true,
        });
    }
    Ok(())
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
pub(super) fn stacked_split_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
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
pub(super) fn pair_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
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
