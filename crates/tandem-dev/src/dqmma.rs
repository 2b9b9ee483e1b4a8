//! Decode batches past qmma's rows timed on the 8B Q4_K_M's Q4_K shapes: dqmma against cuBLAS over the
//! f16 copy (and qmma, where it takes the rows).

use anyhow::{Context, Result};
use tandem_cuda::lab::launch::{dequant_f16, to_f16_into, type_suffix};
use tandem_cuda::lab::matmul::dqmma::{dqmma_group_into, grid, kernel, DqmmaScratch};
use tandem_cuda::lab::matmul::int8::{int8_format, quantize_act_into, repack, MmvqTarget};
use tandem_cuda::Gpu;
use tandem_gguf::GgmlType;

use crate::common::{host_weights, Rng, Row};
use crate::qmma::{push_speed_row, time_qmma_rotated, time_rotated};

/// Times the 8B Q4_K_M's Q4_K decode shapes at 2-64 batch rows: dqmma against cuBLAS over the f16
/// copy (and qmma up to its 8 rows), over copies rotated so that L2 cannot hold them.
pub fn dqmma_bench(gpu: &Gpu, table: &mut Vec<Row>) -> Result<()> {
    let mut rng = Rng(0x9e37_79b9_51ed_2701);
    let ty = GgmlType::Q4_K;
    let suffix = type_suffix(ty).context("type has kernels")?;
    let fmt = int8_format(ty).context("an integer type")?;
    let cases = [(28672, 4096), (6144, 4096), (4096, 4096), (4096, 14336), (1024, 4096)];
    let mut scratch = DqmmaScratch::new(gpu, 28672)?;
    for (rows, cols) in cases {
        let host = host_weights(&mut rng, ty, rows, cols)?;
        let bytes = host.len();
        let n = (160 << 20) / bytes.max(1) + 2;
        let copies = (0..n)
            .map(|_| repack(gpu, ty, &gpu.upload(&host)?, rows, cols)?.context("an integer layout"))
            .collect::<Result<Vec<_>>>()?;
        let w16 = {
            let w = gpu.upload(&host)?;
            (0..2)
                .map(|_| Ok(dequant_f16(gpu, suffix, &w, rows, cols)?))
                .collect::<Result<Vec<_>>>()?
        };
        for t in [2usize, 4, 8, 12, 16, 24, 32, 48, 64] {
            let x: Vec<f32> = (0..t * cols).map(|_| rng.normal()).collect();
            let x_dev = gpu.upload(&x)?;
            let mut x16 = gpu.alloc::<u16>(t * cols)?;
            to_f16_into(gpu, &x_dev.as_view(), &mut x16, t * cols)?;
            let mut out = gpu.alloc::<f32>(t * rows)?;
            let mut results = Vec::new();
            let us = time_rotated(gpu, copies.len(), &mut |i| {
                let mut targets = [MmvqTarget {
                    w: &copies[i],
                    rows,
                    out: &mut out,
                }];
                Ok(dqmma_group_into(
                    gpu,
                    suffix,
                    &mut targets,
                    &x16,
                    t,
                    cols,
                    &mut scratch,
                )?)
            })?;
            let name = kernel(suffix, t);
            let regs = gpu.function(&name)?.num_regs().unwrap_or(-1);
            let g = grid(rows, cols, t, gpu.sm_count as usize);
            let read = (bytes * g.batch_rows) as f64;
            results.push(format!(
                "dqmma {us:.1} us ({regs} regs, {g:?}, {:.2} TB/s)",
                read / us / 1e6
            ));
            if t <= tandem_cuda::lab::matmul::qmma::MAX_ROWS {
                let mut a = gpu.alloc::<u8>(fmt.bytes(t, cols))?;
                quantize_act_into(gpu, fmt, &x_dev, t, cols, &mut a)?;
                let us = time_qmma_rotated(gpu, suffix, &copies, &a, [t, rows, cols], &mut out)?;
                results.push(format!("qmma {us:.1} us"));
            }
            let what = format!("dqmma speed {ty} {rows}x{cols}, t={t} ({:.1} MB)", bytes as f64 / 1e6);
            push_speed_row(gpu, table, what, results, &w16, &x16, [t, rows, cols], &mut out)?;
        }
    }
    Ok(())
}
