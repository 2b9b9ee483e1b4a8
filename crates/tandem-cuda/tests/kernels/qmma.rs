//! Decode batches on the tensor cores (`matmul::qmma`): the Q4_K kernel against an f64 reference over
//! the same dequantized weights and quantized activations, outputs poisoned first; a grouped launch
//! against each matrix alone.

use anyhow::{Context, Result};
use tandem_cuda::lab::launch::type_suffix;
use tandem_cuda::lab::matmul::int8::{int8_format, quantize_act_into, repack, MmvqTarget};
use tandem_cuda::lab::matmul::qmma::{kernel, qmma_group_into, MAX_ROWS};
use tandem_cuda::Gpu;
use tandem_gguf::GgmlType;

use crate::common::{bits_equal, host_weights, rel_err, Rng, Row};
use crate::int8::dequantized_activations;

#[test]
fn qmma_against_f64() {
    crate::common::run("qmma checks", qmma_checks);
}

/// Every batch size the kernel takes, on widths whose super-blocks leave the four warps unequal
/// shares.
pub(crate) fn qmma_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
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
