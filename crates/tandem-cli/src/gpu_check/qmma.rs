//! Decode batches on the tensor cores (`tandem_cuda::matmul::qmma`): the Q4_K kernel against an f64 reference
//! over the same dequantized weights and quantized activations, outputs poisoned first; a grouped
//! launch against each matrix alone; and a timing of the 8B decode shapes against the routes a batch
//! takes otherwise (the batched `dp4a` matvec, cuBLAS over the f16 copy).

use std::time::Instant;

use anyhow::{Context, Result};
use tandem_cuda::matmul::int8::{
    int8_format, mmvq_group_into, mmvq_group_into_with, quantize_act_into, repack, staged_batch, variants, MmvqKernels,
    MmvqTarget,
};
use tandem_cuda::matmul::kinds::MmvqVariant;
use tandem_cuda::matmul::qmma::{has_kernel, kernel, qmma_group_into, MAX_ROWS};
use tandem_cuda::runtime::launch::{dequant_f16, gemm_f16_into, to_f16_into, type_suffix};
use tandem_cuda::{CudaSlice, Gpu};
use tandem_gguf::GgmlType;

use super::int8::dequantized_activations;
use super::{rel_err, Rng, Row};

/// Quantized rows of `ty`: 64 distinct random rows, tiled to `rows` (host bytes).
pub(super) fn host_weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Result<Vec<u8>> {
    let row_bytes = ty.row_bytes(cols as u64).context("row size")? as usize;
    let mut tile = vec![0u8; 64 * row_bytes];
    for r in 0..64 {
        let src: Vec<f32> = (0..cols).map(|_| rng.normal() * 0.05).collect();
        tandem_quant::quantize_row(ty, &src, &mut tile[r * row_bytes..(r + 1) * row_bytes])?;
    }
    Ok(tile.iter().copied().cycle().take(rows * row_bytes).collect())
}

pub(super) fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Every batch size the kernel takes, on widths whose super-blocks leave the four warps unequal
/// shares.
pub(super) fn qmma_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let rows = 16 * 37;
    for ty in [GgmlType::Q4_K] {
        let fmt = int8_format(ty).context("an integer type")?;
        let suffix = type_suffix(ty).context("type has kernels")?;
        let (mut worst, mut group_equal, mut failures) = (0f64, true, Vec::new());
        let mut tall_equal = true;
        for cols in [2560, 4352] {
            let host = host_weights(rng, ty, rows, cols)?;
            let deq = tandem_quant::dequantize(ty, &host)?;
            let w = gpu.upload(&host)?;
            let wq = repack(gpu, ty, &w, rows, cols)?.context("an integer layout")?;
            // The matrix stacked TALL_COPIES times: more row groups than one wave of blocks holds.
            let tall: Vec<u8> = (0..TALL_COPIES).flat_map(|_| host.iter().copied()).collect();
            let tall_q =
                repack(gpu, ty, &gpu.upload(&tall)?, rows * TALL_COPIES, cols)?.context("an integer layout")?;
            for t in 1..=MAX_ROWS {
                let x: Vec<f32> = (0..t * cols).map(|_| rng.normal()).collect();
                let mut a = gpu.alloc::<u8>(fmt.bytes(t, cols))?;
                quantize_act_into(gpu, fmt, &gpu.upload(&x)?, t, cols, &mut a)?;
                let xa = dequantized_activations(fmt, &gpu.download(&a)?, t, cols);
                let reference: Vec<f64> = (0..t * rows)
                    .map(|i| {
                        let (ti, r) = (i / rows, i % rows);
                        (0..cols).map(|c| deq[r * cols + c] as f64 * xa[ti * cols + c]).sum()
                    })
                    .collect();
                let mut alone = gpu.upload(&vec![f32::NAN; t * rows])?;
                qmma_group_into(
                    gpu,
                    suffix,
                    &mut [MmvqTarget {
                        w: &wq,
                        rows,
                        out: &mut alone,
                    }],
                    &a,
                    t,
                    cols,
                )?;
                let alone = gpu.download(&alone)?;
                if [2, 5, MAX_ROWS].contains(&t) {
                    let big = rows * TALL_COPIES;
                    let mut out = gpu.upload(&vec![f32::NAN; t * big])?;
                    let mut targets = [MmvqTarget {
                        w: &tall_q,
                        rows: big,
                        out: &mut out,
                    }];
                    qmma_group_into(gpu, suffix, &mut targets, &a, t, cols)?;
                    let out = gpu.download(&out)?;
                    tall_equal &= (0..t).all(|i| {
                        out[i * big..(i + 1) * big]
                            .chunks(rows)
                            .all(|c| bits_equal(c, &alone[i * rows..(i + 1) * rows]))
                    });
                }
                let err = rel_err(&alone, &reference);
                if err >= BOUND {
                    failures.push(format!("{} {cols} wide, t={t}: {err:.2e}", kernel(suffix)));
                }
                worst = worst.max(err);
                // Three matrices in one launch (q, k and v; gate and up): each as alone.
                let mut outs = (0..3)
                    .map(|_| gpu.upload(&vec![f32::NAN; t * rows]))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut targets: Vec<MmvqTarget> =
                    outs.iter_mut().map(|out| MmvqTarget { w: &wq, rows, out }).collect();
                qmma_group_into(gpu, suffix, &mut targets, &a, t, cols)?;
                for out in &outs {
                    group_equal &= bits_equal(&gpu.download(out)?, &alone);
                }
            }
        }
        table.push(Row {
            check: format!(
                "qmma {ty} ({rows} rows, 2560 and 4352 wide, t=1-{MAX_ROWS}) against f64; grouped launch; {TALL_COPIES}x rows"
            ),
            result: if failures.is_empty() {
                format!(
                    "rel err {worst:.2e} (bound {BOUND:.0e}); bit-equal: grouped launch {group_equal}, on {TALL_COPIES}x rows {tall_equal}"
                )
            } else {
                failures.join("; ")
            },
            pass: failures.is_empty() && group_equal && tall_equal,
        });
    }
    Ok(())
}

/// How many times the tall check stacks the matrix (37 row groups a copy): more groups than the
/// blocks resident at once on a GPU of up to 132 multiprocessors at 16 blocks each.
const TALL_COPIES: usize = 60;

/// The matvec's bound (`int8_checks`): the same exact integers, only the float sums' order differs.
const BOUND: f64 = 1e-5;

/// Times the 8B Q4_K_M's decode shapes at 2-8 rows: the qmma kernel (Q4_K), the batched `dp4a`
/// matvec staged and unstaged, and cuBLAS over the f16 copy, over copies rotated so that L2 cannot
/// hold them. One row's staged matvec is timed too, as the bound a batch's single weight read sets.
pub(super) fn qmma_bench(gpu: &Gpu, table: &mut Vec<Row>) -> Result<()> {
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
                    check: format!("batch speed {ty} {rows}x{cols}, t=1 ({:.1} MB)", bytes as f64 / 1e6),
                    result: format!("one-row {} {us:.1} us", one_row.label()),
                    pass: true,
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
            let check = format!("batch speed {ty} {rows}x{cols}, t={t} ({:.1} MB)", bytes as f64 / 1e6);
            push_speed_row(gpu, table, check, results, &w16, &x16, [t, rows, cols], &mut out)?;
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
pub(super) fn time_qmma_rotated(
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
/// speed row `check`: the other kernels' `results`, then cuBLAS's time.
#[allow(clippy::too_many_arguments)]
pub(super) fn push_speed_row(
    gpu: &Gpu,
    table: &mut Vec<Row>,
    check: String,
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
        check,
        result: results.join("; "),
        pass: true,
    });
    Ok(())
}

pub(super) fn time_rotated(gpu: &Gpu, copies: usize, run: &mut dyn FnMut(usize) -> Result<()>) -> Result<f64> {
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
