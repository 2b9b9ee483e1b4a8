//! The decode matvecs timed per weight type: the float families, then the integer route
//! (`int8::int8_bench`), over matrices larger than L2.

use std::time::Instant;

use anyhow::{Context, Result};
use tandem_cuda::lab::launch::{dequant_f16, gemm_into, matvec_into, type_suffix};
use tandem_cuda::lab::matmul::kinds::MatvecFamily;
use tandem_cuda::Gpu;
use tandem_gguf::GgmlType;

use crate::common::{tiled_weights, Rng, Row};

/// Times the single-row matvec over matrices larger than L2 (four copies, rotated), the decode
/// route's whole cost: weight bytes read once over elapsed time. 16384×8192 for every type, then the
/// Llama-3-8B decode shapes (gate/up, down, q/o, q+k+v as one launch) for Q4_K, Q8_0 and F16, and
/// Q4_K_M's Q6_K down and v.
pub fn matvec_bench(gpu: &Gpu, table: &mut Vec<Row>) -> Result<()> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut cases: Vec<(GgmlType, usize, usize)> = [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::F16,
    ]
    .into_iter()
    .map(|ty| (ty, 16384, 8192))
    .collect();
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16] {
        cases.extend([(ty, 14336, 4096), (ty, 4096, 14336), (ty, 4096, 4096), (ty, 6144, 4096)]);
    }
    // Q4_K_M's Q6_K matrices: down in half the layers, v in half, and the output head.
    cases.extend([
        (GgmlType::Q6_K, 4096, 14336),
        (GgmlType::Q6_K, 1024, 4096),
        (GgmlType::Q6_K, 128256, 4096),
    ]);
    for (ty, rows, cols) in cases {
        let suffix = type_suffix(ty).expect("benched types have kernels");
        let row_bytes = ty.row_bytes(cols as u64).context("row size")? as usize;
        let copies = tiled_weights(gpu, &mut rng, ty, rows, cols, 4)?;
        let x = gpu.upload(&(0..cols).map(|_| rng.normal()).collect::<Vec<f32>>())?;
        let mut out = gpu.alloc::<f32>(rows)?;
        for family in [
            MatvecFamily::Segmented,
            MatvecFamily::WarpPerRow,
            MatvecFamily::Lanewise,
        ] {
            for w in &copies {
                matvec_into(gpu, family, suffix, &w.as_view(), &x, 1, rows, cols, &mut out)?;
            }
            gpu.synchronize()?;
            let iters = 40;
            let t0 = Instant::now();
            for i in 0..iters {
                matvec_into(
                    gpu,
                    family,
                    suffix,
                    &copies[i % 4].as_view(),
                    &x,
                    1,
                    rows,
                    cols,
                    &mut out,
                )?;
            }
            gpu.synchronize()?;
            let secs = t0.elapsed().as_secs_f64() / iters as f64;
            let gbs = (rows * row_bytes) as f64 / secs / 1e9;
            let f = gpu.function(&format!("{}{suffix}", family.prefix(false)))?;
            let regs = f.num_regs().unwrap_or(-1);
            let local = f.local_size_bytes().unwrap_or(-1);
            table.push(Row {
                what: format!("matvec {family:?} {ty} {rows}x{cols} speed"),
                result: format!(
                    "{:.1} us, {gbs:.0} GB/s ({:.0}% of 4.3 TB/s copy); {regs} regs, {local} B local",
                    secs * 1e6,
                    gbs / 43.0
                ),
            });
        }
        crate::int8::int8_bench(gpu, ty, &copies, &x, (rows, cols), table)?;
        if ty == GgmlType::Q4_K && rows == 16384 {
            // The alternative for one row: cuBLAS over an f16 copy (4x the bytes of Q4_K).
            let w16: Vec<_> = copies
                .iter()
                .map(|w| dequant_f16(gpu, suffix, w, rows, cols))
                .collect::<Result<_, _>>()?;
            let mut x16 = gpu.alloc::<u16>(cols)?;
            gemm_into(gpu, &w16[0].as_view(), &x, &mut x16, 1, rows, cols, &mut out)?;
            gpu.synchronize()?;
            let t0 = Instant::now();
            for i in 0..40 {
                gemm_into(gpu, &w16[i % 4].as_view(), &x, &mut x16, 1, rows, cols, &mut out)?;
            }
            gpu.synchronize()?;
            let secs = t0.elapsed().as_secs_f64() / 40.0;
            let gbs = (rows * cols * 2) as f64 / secs / 1e9;
            table.push(Row {
                what: format!("cuBLAS f16 gemv {rows}x{cols} speed"),
                result: format!("{:.1} us, {gbs:.0} GB/s of f16 weights", secs * 1e6),
            });
        }
    }
    Ok(())
}
