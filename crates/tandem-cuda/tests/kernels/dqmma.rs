//! Decode batches past qmma's rows (`matmul::dqmma`): the Q4_K kernel against an f64 reference over
//! the exactly dequantized weights and the f16 activations it reads, outputs poisoned first, at every
//! tile count, with and without a K split, launched twice (same bits).

use anyhow::{Context, Result};
use tandem_cuda::lab::launch::{to_f16_into, type_suffix};
use tandem_cuda::lab::matmul::dqmma::{dqmma_group_into, grid, kernel, DqmmaScratch};
use tandem_cuda::lab::matmul::int8::{repack, MmvqTarget};
use tandem_cuda::Gpu;
use tandem_gguf::GgmlType;

use crate::common::{bits_equal, host_weights, rel_err, Rng, Row};

#[test]
fn dqmma_against_f64() {
    crate::common::run("dqmma checks", dqmma_checks);
}

/// Weights and activations rounded to f16 once each, f32 sums: the GEMM route's class (its bound).
const BOUND: f64 = 5e-3;

/// Batch rows covering each kernel (1, 2 and 4 n-tiles), partial tiles and two grid rows.
const ROWS: [usize; 12] = [1, 2, 8, 9, 13, 16, 17, 24, 32, 33, 47, 64];

pub(crate) fn dqmma_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let ty = GgmlType::Q4_K;
    let suffix = type_suffix(ty).context("type has kernels")?;
    let sm = gpu.sm_count as usize;
    // 5 row blocks: split along K; 300 (the matrix 60 times): one split.
    let (rows, copies) = (640, 60);
    let mut scratch = DqmmaScratch::new(gpu, rows * copies)?;
    let (mut worst, mut failures, mut repeat_equal, mut splits_seen) = (0f64, Vec::new(), true, Vec::new());
    for cols in [2560, 4352] {
        let host = host_weights(rng, ty, rows, cols)?;
        let deq = tandem_quant::dequantize(ty, &host)?;
        let wq = repack(gpu, ty, &gpu.upload(&host)?, rows, cols)?.context("an integer layout")?;
        let tall: Vec<u8> = (0..copies).flat_map(|_| host.iter().copied()).collect();
        let tall_q = repack(gpu, ty, &gpu.upload(&tall)?, rows * copies, cols)?.context("an integer layout")?;
        for t in ROWS {
            let x: Vec<f32> = (0..t * cols).map(|_| rng.normal()).collect();
            let mut x16 = gpu.alloc::<u16>(t * cols)?;
            to_f16_into(gpu, &gpu.upload(&x)?.as_view(), &mut x16, t * cols)?;
            let xh: Vec<f64> = gpu
                .download(&x16)?
                .iter()
                .map(|&h| half::f16::from_bits(h).to_f64())
                .collect();
            let reference: Vec<f64> = (0..t * rows)
                .map(|i| {
                    let (ti, r) = (i / rows, i % rows);
                    (0..cols).map(|c| deq[r * cols + c] as f64 * xh[ti * cols + c]).sum()
                })
                .collect();
            for (w, n, what) in [(&wq, rows, "split"), (&tall_q, rows * copies, "whole")] {
                splits_seen.push(grid(n, cols, t, sm).splits);
                let mut runs = Vec::new();
                for _ in 0..2 {
                    let mut out = gpu.upload(&vec![f32::NAN; t * n])?;
                    let mut targets = [MmvqTarget {
                        w,
                        rows: n,
                        out: &mut out,
                    }];
                    dqmma_group_into(gpu, suffix, &mut targets, &x16, t, cols, &mut scratch)?;
                    runs.push(gpu.download(&out)?);
                }
                repeat_equal &= bits_equal(&runs[0], &runs[1]);
                // Every copy of the tall matrix against the one reference.
                let out = &runs[0];
                for copy in 0..n / rows {
                    let part: Vec<f32> = (0..t)
                        .flat_map(|ti| out[ti * n + copy * rows..ti * n + (copy + 1) * rows].iter().copied())
                        .collect();
                    let err = rel_err(&part, &reference);
                    worst = worst.max(err);
                    if err >= BOUND {
                        failures.push(format!(
                            "{} {what} {cols} wide, t={t}, copy {copy}: {err:.2e}",
                            kernel(suffix, t)
                        ));
                        break;
                    }
                }
            }
            // Three matrices in one launch (q, k and v; gate and up): each against the reference.
            let mut outs = (0..3)
                .map(|_| gpu.upload(&vec![f32::NAN; t * rows]))
                .collect::<Result<Vec<_>, _>>()?;
            let mut targets: Vec<MmvqTarget> = outs.iter_mut().map(|out| MmvqTarget { w: &wq, rows, out }).collect();
            dqmma_group_into(gpu, suffix, &mut targets, &x16, t, cols, &mut scratch)?;
            for (k, out) in outs.iter().enumerate() {
                let err = rel_err(&gpu.download(out)?, &reference);
                worst = worst.max(err);
                if err >= BOUND {
                    failures.push(format!(
                        "{} grouped {cols} wide, t={t}, member {k}: {err:.2e}",
                        kernel(suffix, t)
                    ));
                }
            }
        }
    }
    splits_seen.sort_unstable();
    splits_seen.dedup();
    let pass = failures.is_empty() && repeat_equal && splits_seen.contains(&1) && splits_seen.len() > 1;
    table.push(Row {
        check: format!(
            "dqmma {ty} ({rows} rows, x{copies}, 3 in a launch; 2560 and 4352 wide; t={ROWS:?}) against f64"
        ),
        result: match failures.is_empty() {
            true => format!(
                "rel err {worst:.2e} (bound {BOUND:.0e}); K splits {splits_seen:?}; repeated launch bit-equal: {repeat_equal}"
            ),
            false => failures.join("; "),
        },
        pass,
    });
    Ok(())
}
