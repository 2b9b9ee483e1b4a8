//! The prefill GEMM shapes of the Llama-3-8B layer through cuBLAS (f16 operands, f32 accumulation),
//! timed at 512 and 4096 rows: each projection with f32 output as the GEMM route writes it, and gate
//! and up three ways (two GEMMs with f32 outputs; two GEMMs writing f16 side by side into one buffer;
//! one GEMM over the stacked weights), which is how `ffn.rs` chose its form; and q, k and v as three
//! GEMMs or one stacked GEMM and a split.

use std::time::Instant;

use anyhow::Result;
use tandem_cuda::lab::launch::{gemm_f16_into, gemm_f16_out, split_columns_into};
use tandem_cuda::{CudaSlice, Gpu};

use crate::common::Row;

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

pub fn gemm_bench(gpu: &Gpu, table: &mut Vec<Row>) -> Result<()> {
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
                what: format!("gemm timing {what}, t={t}"),
                result: format!("{:.1} us, {:.0} TFLOP/s", secs * 1e6, flops / secs / 1e12),
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
fn stacked_qkv_bench(gpu: &Gpu, w: &CudaSlice<u16>, table: &mut Vec<Row>) -> Result<()> {
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
            what: format!("gemm timing q, k, v {total}x{d}, t={t}"),
            result: format!(
                "three GEMMs {:.1} us ({:.0} TFLOP/s); one stacked GEMM {:.1} us ({:.0}), with the split {:.1} us: {:.2}x",
                separate * 1e6,
                flops / separate / 1e12,
                gemm_only * 1e6,
                flops / gemm_only / 1e12,
                with_split * 1e6,
                separate / with_split
            ),
        });
    }
    Ok(())
}
