//! The integer decode route timed: each variant with and without quantizing the activations in the
//! same step, and the 8B files' choices from a flushed L2 and a hot one.

use std::time::Instant;

use anyhow::{Context, Result};
use tandem_cuda::lab::launch::type_suffix;
use tandem_cuda::lab::matmul::int8::{int8_format, mmvq_into, quantize_act_into, repack};
use tandem_cuda::lab::matmul::tune::time_cold_and_hot;
use tandem_cuda::{CudaSlice, Gpu};
use tandem_gguf::GgmlType;

use crate::common::{tiled_weights, Rng, Row};

/// Times the integer matvec on `copies` of a `rows × cols` matrix of type `ty` (ggml layout), with
/// and without quantizing the activations in the same step.
pub fn int8_bench(
    gpu: &Gpu,
    ty: GgmlType,
    copies: &[CudaSlice<u8>],
    x: &CudaSlice<f32>,
    (rows, cols): (usize, usize),
    table: &mut Vec<Row>,
) -> Result<()> {
    let Some(fmt) = int8_format(ty) else { return Ok(()) };
    let suffix = type_suffix(ty).context("type has kernels")?;
    let packed: Vec<_> = copies
        .iter()
        .map(|w| Ok(repack(gpu, ty, w, rows, cols)?))
        .collect::<Result<Vec<_>>>()?;
    let weights: Vec<_> = packed
        .iter()
        .zip(copies)
        .map(|(p, w)| p.as_ref().unwrap_or(w))
        .collect();
    let bytes = copies[0].len();
    let mut a = gpu.alloc::<u8>(fmt.bytes(1, cols))?;
    let mut out = gpu.alloc::<f32>(rows)?;
    quantize_act_into(gpu, fmt, x, 1, cols, &mut a)?;
    let iters = 40;
    for variant in tandem_cuda::lab::matmul::int8::variants(suffix)
        .into_iter()
        .filter(|v| v.fits(&[rows], cols))
    {
        for with_quantize in [false, true] {
            for w in &weights {
                mmvq_into(gpu, suffix, variant, w, &a, 1, rows, cols, &mut out)?;
            }
            gpu.synchronize()?;
            let t0 = Instant::now();
            for i in 0..iters {
                if with_quantize {
                    quantize_act_into(gpu, fmt, x, 1, cols, &mut a)?;
                }
                mmvq_into(
                    gpu,
                    suffix,
                    variant,
                    weights[i % weights.len()],
                    &a,
                    1,
                    rows,
                    cols,
                    &mut out,
                )?;
            }
            gpu.synchronize()?;
            let secs = t0.elapsed().as_secs_f64() / iters as f64;
            let gbs = bytes as f64 / secs / 1e9;
            let f = gpu.function(&variant.kernel(suffix, false))?;
            table.push(Row {
                what: format!(
                    "matvec Int8 {} {ty} {rows}x{cols} speed{}",
                    variant.label(),
                    if with_quantize { " (+ quantize)" } else { "" }
                ),
                result: format!(
                    "{:.1} us, {gbs:.0} GB/s ({:.0}% of 4.3 TB/s copy); {} regs",
                    secs * 1e6,
                    gbs / 43.0,
                    f.num_regs().unwrap_or(-1)
                ),
            });
        }
    }
    Ok(())
}

/// The 8B files' decode matvecs (variants as their load-time choices) timed from a flushed L2 and
/// hot (`tune::time_cold_and_hot`).
pub fn l2_bench(gpu: &Gpu, table: &mut Vec<Row>) -> Result<()> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let cases = [
        (GgmlType::Q4_K, 4096, 4096, "u1r2s1"),
        (GgmlType::Q4_K, 14336, 4096, "u2r1s1p"),
        (GgmlType::Q6_K, 4096, 14336, "u1r1s1"),
        (GgmlType::Q6_K, 1024, 4096, "u2r1s4"),
        (GgmlType::Q6_K, 128256, 4096, "u2r1s1p"),
        (GgmlType::Q8_0, 4096, 4096, "u2r1s1"),
        (GgmlType::Q8_0, 14336, 4096, "u2r1s1"),
    ];
    for (ty, rows, cols, label) in cases {
        let fmt = int8_format(ty).context("an integer type")?;
        let suffix = type_suffix(ty).context("type has kernels")?;
        let w = tiled_weights(gpu, &mut rng, ty, rows, cols, 1)?.remove(0);
        let w = repack(gpu, ty, &w, rows, cols)?.unwrap_or(w);
        let variant = tandem_cuda::lab::matmul::int8::variants(suffix)
            .into_iter()
            .find(|v| v.label() == label && v.fits(&[rows], cols))
            .with_context(|| format!("variant {label} for {ty} {rows}x{cols}"))?;
        let x = gpu.upload(&(0..cols).map(|_| rng.normal()).collect::<Vec<f32>>())?;
        let mut a = gpu.alloc::<u8>(fmt.bytes(1, cols))?;
        let mut out = gpu.alloc::<f32>(rows)?;
        quantize_act_into(gpu, fmt, &x, 1, cols, &mut a)?;
        let bytes = w.len() as f64;
        let [cold, hot] = time_cold_and_hot(gpu, &mut || {
            mmvq_into(gpu, suffix, variant, &w, &a, 1, rows, cols, &mut out)
        })?;
        table.push(Row {
            what: format!("matvec Int8 {label} {ty} {rows}x{cols}: cold / hot L2"),
            result: format!(
                "{:.1} / {:.1} us ({:.0} / {:.0} GB/s)",
                cold * 1e6,
                hot * 1e6,
                bytes / cold / 1e9,
                bytes / hot / 1e9
            ),
        });
    }
    Ok(())
}
