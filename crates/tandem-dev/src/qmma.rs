//! Decode batches of 2-8 rows timed on the 8B Q4_K_M's shapes: the tensor-core kernel over the
//! quantized weights (qmma) against the routes a batch takes otherwise (the batched `dp4a` matvec,
//! cuBLAS over the f16 copy); and the timing helpers the dqmma benchmark shares.

use std::time::Instant;

use anyhow::{Context, Result};
use tandem_cuda::lab::launch::{dequant_f16, gemm_f16_into, to_f16_into, type_suffix};
use tandem_cuda::lab::matmul::int8::{
    int8_format, mmvq_group_into, mmvq_group_into_with, quantize_act_into, repack, staged_batch, variants, MmvqKernels,
    MmvqTarget,
};
use tandem_cuda::lab::matmul::kinds::MmvqVariant;
use tandem_cuda::lab::matmul::qmma::{has_kernel, kernel, qmma_group_into};
use tandem_cuda::{CudaSlice, Gpu};
use tandem_gguf::GgmlType;

use crate::common::{host_weights, Rng, Row};

/// Times the 8B Q4_K_M's decode shapes at 2-8 rows: the qmma kernel (Q4_K), the batched `dp4a`
/// matvec staged and unstaged, and cuBLAS over the f16 copy, over copies rotated so that L2 cannot
/// hold them. One row's staged matvec is timed too, as the bound a batch's single weight read sets.
pub fn qmma_bench(gpu: &Gpu, table: &mut Vec<Row>) -> Result<()> {
    let mut rng = Rng(0x51ed_2701_9e37_79b9);
    let cases = [
        (GgmlType::Q4_K, 28672, 4096),
        (GgmlType::Q4_K, 6144, 4096),
        (GgmlType::Q4_K, 4096, 4096),
        (GgmlType::Q4_K, 4096, 14336),
        (GgmlType::Q6_K, 4096, 14336),
        (GgmlType::Q6_K, 1024, 4096),
    ];
    for (ty, rows, cols) in cases {
        let fmt = int8_format(ty).context("an integer type")?;
        let suffix = type_suffix(ty).context("type has kernels")?;
        let host = host_weights(&mut rng, ty, rows, cols)?;
        let bytes = host.len();
        let n = (160 << 20) / bytes.max(1) + 2;
        let copies = (0..n)
            .map(|_| {
                let w = gpu.upload(&host)?;
                repack(gpu, ty, &w, rows, cols)?.context("an integer layout")
            })
            .collect::<Result<Vec<_>>>()?;
        let w16 = {
            let w = gpu.upload(&host)?;
            (0..2)
                .map(|_| Ok(dequant_f16(gpu, suffix, &w, rows, cols)?))
                .collect::<Result<Vec<_>>>()?
        };
        let variant = variants(suffix)
            .into_iter()
            .find(|v| !v.staged && v.split == 1 && v.fits(&[rows], cols))
            .context("a batched variant")?;
        let one_row = variants(suffix)
            .into_iter()
            .find(|v| v.staged && v.fits(&[rows], cols))
            .unwrap_or(variant);
        for t in [1usize, 2, 3, 4, 6, 8] {
            let x: Vec<f32> = (0..t * cols).map(|_| rng.normal()).collect();
            let x_dev = gpu.upload(&x)?;
            let mut a = gpu.alloc::<u8>(fmt.bytes(t, cols))?;
            quantize_act_into(gpu, fmt, &x_dev, t, cols, &mut a)?;
            let mut x16 = gpu.alloc::<u16>(t * cols)?;
            to_f16_into(gpu, &x_dev.as_view(), &mut x16, t * cols)?;
            let mut out = gpu.alloc::<f32>(t * rows)?;
            let mut results = Vec::new();
            if t == 1 {
                let us = time_rotated(gpu, copies.len(), &mut |i| {
                    let mut targets = [MmvqTarget {
                        w: &copies[i],
                        rows,
                        out: &mut out,
                    }];
                    Ok(mmvq_group_into(gpu, suffix, one_row, &mut targets, &a, 1, cols)?)
                })?;
                table.push(Row {
                    what: format!("batch speed {ty} {rows}x{cols}, t=1 ({:.1} MB)", bytes as f64 / 1e6),
                    result: format!("one-row {} {us:.1} us", one_row.label()),
                });
                continue;
            }
            if has_kernel(suffix) {
                let us = time_qmma_rotated(gpu, suffix, &copies, &a, [t, rows, cols], &mut out)?;
                let regs = gpu.function(&kernel(suffix))?.num_regs().unwrap_or(-1);
                results.push(format!("qmma {us:.1} us ({regs} regs)"));
            }
            for staged_batch in [true, false] {
                let Some(nb) = staged_batch_nb(suffix, variant, t, cols, staged_batch) else {
                    continue;
                };
                let us = time_rotated(gpu, copies.len(), &mut |i| {
                    let mut targets = [MmvqTarget {
                        w: &copies[i],
                        rows,
                        out: &mut out,
                    }];
                    let kernels = MmvqKernels {
                        tensor_cores: false,
                        staged_batch,
                    };
                    Ok(mmvq_group_into_with(
                        gpu,
                        suffix,
                        variant,
                        &mut targets,
                        &a,
                        t,
                        cols,
                        kernels,
                    )?)
                })?;
                let (what, name) = match nb {
                    0 => ("dp4a", variant.kernel(suffix, true)),
                    nb => ("dp4a staged", variant.staged_batch_kernel(suffix, nb)),
                };
                let regs = gpu.function(&name)?.num_regs().unwrap_or(-1);
                results.push(format!("{what} {us:.1} us ({regs} regs)"));
            }
            let what = format!("batch speed {ty} {rows}x{cols}, t={t} ({:.1} MB)", bytes as f64 / 1e6);
            push_speed_row(gpu, table, what, results, &w16, &x16, [t, rows, cols], &mut out)?;
        }
    }
    Ok(())
}

/// The batch kernel a timing takes: `Some(nb)` for the staged batch kernel of `nb` rows, `Some(0)`
/// for the unstaged one, `None` when `staged` is asked for and no staged kernel takes the batch.
fn staged_batch_nb(suffix: &str, variant: MmvqVariant, t: usize, cols: usize, staged: bool) -> Option<usize> {
    match staged {
        true => staged_batch(suffix, variant, t, cols),
        false => Some(0),
    }
}

/// Mean microseconds of `run(i)` over copies `i` in turn, after one warm-up pass.
/// Times qmma over the rotated `copies` of a matrix on the quantized activations `a`, `[t, rows,
/// cols]`.
pub fn time_qmma_rotated(
    gpu: &Gpu,
    suffix: &str,
    copies: &[CudaSlice<u8>],
    a: &CudaSlice<u8>,
    [t, rows, cols]: [usize; 3],
    out: &mut CudaSlice<f32>,
) -> Result<f64> {
    time_rotated(gpu, copies.len(), &mut |i| {
        let mut targets = [MmvqTarget {
            w: &copies[i],
            rows,
            out: &mut *out,
        }];
        Ok(qmma_group_into(gpu, suffix, &mut targets, a, t, cols)?)
    })
}

/// Times cuBLAS over the f16 copies `w16` (rotated) on `x16`, `[t, rows, cols]`, and pushes the
/// speed row `what`: the other kernels' `results`, then cuBLAS's time.
#[allow(clippy::too_many_arguments)]
pub fn push_speed_row(
    gpu: &Gpu,
    table: &mut Vec<Row>,
    what: String,
    mut results: Vec<String>,
    w16: &[CudaSlice<u16>],
    x16: &CudaSlice<u16>,
    [t, rows, cols]: [usize; 3],
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    let us = time_rotated(gpu, w16.len(), &mut |i| {
        Ok(gemm_f16_into(gpu, &w16[i].as_view(), x16, t, rows, cols, &mut *out)?)
    })?;
    results.push(format!("cuBLAS f16 {us:.1} us"));
    table.push(Row {
        what,
        result: results.join("; "),
    });
    Ok(())
}

pub fn time_rotated(gpu: &Gpu, copies: usize, run: &mut dyn FnMut(usize) -> Result<()>) -> Result<f64> {
    for i in 0..copies {
        run(i)?;
    }
    gpu.synchronize()?;
    let iters = 40.max(copies);
    let t0 = Instant::now();
    for i in 0..iters {
        run(i % copies)?;
    }
    gpu.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() * 1e6 / iters as f64)
}
