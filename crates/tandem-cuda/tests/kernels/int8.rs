//! Checks of the integer decode route: the GPU's activation quantization must give the CPU backend's
//! bits, and the `dp4a` matvecs must match an f64 reference over the same dequantized weights and the
//! same quantized activations (`int8_checks`, run for each weight type by `matvec.rs`); the tensor-core
//! kernels for chunks (`mmq_*`) must give the batched matvec's bits.

use anyhow::{Context, Result};
use tandem_backend::cpu::act_quant::{quantize_row_q8, quantize_row_q8k};
use tandem_backend::Isa;
use tandem_cuda::lab::launch::type_suffix;
use tandem_cuda::lab::matmul::int8::{
    int8_format, mmq_takes, mmvq_group_into, mmvq_group_into_with, mmvq_into, quantize_act_into, repack,
    repacked_source, MmvqKernels, MmvqTarget,
};
use tandem_cuda::lab::matmul::kinds::ActQuant;
use tandem_cuda::Gpu;
use tandem_gguf::GgmlType;

use crate::common::{host_weights, rel_err, Rng, Row};

#[test]
fn int8_chunks_on_the_tensor_cores_equal_the_batched_matvec() {
    crate::common::run("int8 tensor-core checks", mmq_checks);
}

/// Activation rows quantized on the CPU, in the GPU buffer's layout (quants, sums of 16, scales).
pub(crate) fn cpu_quantize(fmt: ActQuant, x: &[f32], t: usize, cols: usize) -> Vec<u8> {
    let isa = Isa::detect();
    let nb = cols / fmt.block();
    let mut qs = vec![0i8; t * cols];
    let mut d = vec![0f32; t * nb];
    let mut sums: Vec<i32> = Vec::new();
    for i in 0..t {
        let (xr, q, dr) = (
            &x[i * cols..(i + 1) * cols],
            &mut qs[i * cols..(i + 1) * cols],
            &mut d[i * nb..(i + 1) * nb],
        );
        match fmt {
            ActQuant::Q8K => {
                let mut bsums = vec![0i16; cols / 16];
                quantize_row_q8k(isa, xr, q, dr, &mut bsums);
                sums.extend(bsums.iter().map(|&s| s as i32));
            }
            ActQuant::Q8 => {
                let (mut sum, mut s) = (vec![0i32; nb], vec![0f32; nb]);
                quantize_row_q8(isa, xr, q, dr, &mut sum, &mut s);
            }
        }
    }
    let mut out: Vec<u8> = qs.iter().map(|&q| q as u8).collect();
    out.extend(sums.iter().flat_map(|v| v.to_le_bytes()));
    out.extend(d.iter().flat_map(|v| v.to_le_bytes()));
    out
}

/// The value each quantized activation stands for: `d[block] * q`.
pub(crate) fn dequantized_activations(fmt: ActQuant, a: &[u8], t: usize, cols: usize) -> Vec<f64> {
    let nb = cols / fmt.block();
    let scales = fmt.bytes(t, cols) - t * nb * 4;
    let d = |i: usize| f32::from_le_bytes(a[scales + 4 * i..scales + 4 * i + 4].try_into().unwrap());
    (0..t * cols)
        .map(|i| {
            let (row, c) = (i / cols, i % cols);
            d(row * nb + c / fmt.block()) as f64 * (a[i] as i8) as f64
        })
        .collect()
}

/// How many times the staged kernels' check stacks the matrix, so every warp loops over row groups.
const TALL_COPIES: usize = 80;

/// Row counts the integer checks run: one row, each staged batch kernel size (2, 4 and 8) and one
/// below it, and a chunk on the tensor cores.
const CHECKED_ROWS: [usize; 6] = [1, 2, 3, 5, 8, 64];

/// For weight type `ty` (quantized rows `w`, dequantized `deq`): quantization bits, accuracy for
/// `CHECKED_ROWS`, and batched rows bit-equal to rows alone, staged or not.
pub(crate) fn int8_checks(
    gpu: &Gpu,
    rng: &mut Rng,
    ty: GgmlType,
    w: &[u8],
    deq: &[f32],
    (rows, cols): (usize, usize),
    table: &mut Vec<Row>,
) -> Result<()> {
    let Some(fmt) = int8_format(ty) else { return Ok(()) };
    let suffix = type_suffix(ty).context("type has kernels")?;
    let w_dev = gpu.upload(w)?;
    let wq = repack(gpu, ty, &w_dev, rows, cols)?.unwrap_or(w_dev);
    // The GPU's repacked bytes are the documented layout's.
    let layout: Vec<u8> = repacked_source(ty, rows, cols)
        .context("integer type")?
        .iter()
        .map(|&i| w[i])
        .collect();
    let layout_equal = gpu.download(&wq)? == layout;
    let (mut worst, mut quant_equal, mut batch_equal) = (0f64, true, true);
    let (mut variant_equal, mut group_equal) = (true, true);
    let bits_equal =
        |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    let poisoned = |n: usize| gpu.upload(&vec![f32::NAN; n]);
    let variants = tandem_cuda::lab::matmul::int8::variants(suffix);
    let (mut tall_equal, mut staged_equal) = (true, true);
    // Staged kernels loop over row groups when the matrix has more of them than the resident warps:
    // the matrix stacked TALL_COPIES times must give its rows each time.
    let tall: Vec<u8> = (0..TALL_COPIES).flat_map(|_| w.iter().copied()).collect();
    let tall_q = repack(gpu, ty, &gpu.upload(&tall)?, rows * TALL_COPIES, cols)?;
    for t in CHECKED_ROWS {
        let x: Vec<f32> = (0..t * cols).map(|_| rng.normal()).collect();
        let x_dev = gpu.upload(&x)?;
        let mut a = gpu.upload(&vec![0xA5u8; fmt.bytes(t, cols)])?;
        quantize_act_into(gpu, fmt, &x_dev, t, cols, &mut a)?;
        let a_host = gpu.download(&a)?;
        quant_equal &= a_host == cpu_quantize(fmt, &x, t, cols);
        let xa = dequantized_activations(fmt, &a_host, t, cols);
        let reference: Vec<f64> = (0..t * rows)
            .map(|i| {
                let (ti, r) = (i / rows, i % rows);
                (0..cols).map(|c| deq[r * cols + c] as f64 * xa[ti * cols + c]).sum()
            })
            .collect();
        // Every variant: accurate, and the same bits as the first of its split (the split sets the
        // order of the sums).
        let mut first: Option<Vec<f32>> = None;
        let mut first_of_split: Vec<(u32, Vec<f32>)> = Vec::new();
        for &v in variants.iter().filter(|v| v.fits(&[rows], cols)) {
            let mut out = poisoned(t * rows)?;
            mmvq_into(gpu, suffix, v, &wq, &a, t, rows, cols, &mut out)?;
            let got = gpu.download(&out)?;
            worst = worst.max(rel_err(&got, &reference));
            match first_of_split.iter().find(|(s, _)| *s == v.split) {
                Some((_, f)) => variant_equal &= bits_equal(f, &got),
                None => first_of_split.push((v.split, got.clone())),
            }
            if first.is_none() {
                first = Some(got);
            }
        }
        let got = first.context("at least one variant")?;
        // The matrix three times in one grouped launch: each copy's rows as alone.
        let mut outs = (0..3).map(|_| poisoned(t * rows)).collect::<Result<Vec<_>, _>>()?;
        {
            let mut targets: Vec<MmvqTarget> = outs.iter_mut().map(|out| MmvqTarget { w: &wq, rows, out }).collect();
            // The first variant's order, in a grouped launch of another unroll.
            let grouped = *variants
                .iter()
                .rfind(|v| v.fits(&[rows], cols) && v.split == variants[0].split)
                .context("a variant fits")?;
            mmvq_group_into(gpu, suffix, grouped, &mut targets, &a, t, cols)?;
        }
        for out in &outs {
            group_equal &= bits_equal(&gpu.download(out)?, &got);
        }
        if let Some(tall_q) = tall_q.as_ref().filter(|_| t <= 8) {
            // One row: the staged variants. A batch: every split-1 variant batched (its staged batch
            // kernel where one takes it) and the same unstaged, which must agree bit for bit.
            for &v in variants
                .iter()
                .filter(|v| v.fits(&[rows], cols) && if t == 1 { v.staged } else { v.split == 1 })
            {
                let mut out = poisoned(t * rows * TALL_COPIES)?;
                mmvq_into(gpu, suffix, v, tall_q, &a, t, rows * TALL_COPIES, cols, &mut out)?;
                let out = gpu.download(&out)?;
                let big = rows * TALL_COPIES;
                tall_equal &= (0..t).all(|i| {
                    out[i * big..(i + 1) * big]
                        .chunks(rows)
                        .all(|c| bits_equal(c, &got[i * rows..(i + 1) * rows]))
                });
                if t > 1 {
                    let mut plain = poisoned(t * rows)?;
                    let unstaged = MmvqKernels {
                        staged_batch: false,
                        ..MmvqKernels::all(gpu)
                    };
                    let mut targets = [MmvqTarget {
                        w: &wq,
                        rows,
                        out: &mut plain,
                    }];
                    mmvq_group_into_with(gpu, suffix, v, &mut targets, &a, t, cols, unstaged)?;
                    staged_equal &= bits_equal(&gpu.download(&plain)?, &got);
                }
            }
        }
        if (2..=8).contains(&t) {
            // Each row alone (single-row kernel) as in the batch, for every split.
            for (split, batched) in &first_of_split {
                let v = *variants
                    .iter()
                    .find(|v| v.split == *split && v.fits(&[rows], cols))
                    .context("the split's variant")?;
                for i in 0..t {
                    let xi = gpu.upload(&x[i * cols..(i + 1) * cols])?;
                    let mut ai = gpu.alloc::<u8>(fmt.bytes(1, cols))?;
                    quantize_act_into(gpu, fmt, &xi, 1, cols, &mut ai)?;
                    let mut oi = poisoned(rows)?;
                    mmvq_into(gpu, suffix, v, &wq, &ai, 1, rows, cols, &mut oi)?;
                    batch_equal &= bits_equal(&gpu.download(&oi)?, &batched[i * rows..(i + 1) * rows]);
                }
            }
        }
    }
    table.push(Row {
        check: format!(
            "int8 activations ({fmt:?}) for {ty}: GPU bits = CPU bits; repacked weights = documented layout"
        ),
        result: format!("{quant_equal}; {layout_equal}"),
        pass: quant_equal && layout_equal,
    });
    let bound = 1e-5;
    table.push(Row {
        check: format!(
            "matvec Int8 {ty} {rows}x{cols}, t={CHECKED_ROWS:?}, {} variants",
            variants.len()
        ),
        result: format!(
            "rel err {worst:.2e} (bound {bound:.0e}); bit-equal: batched rows {batch_equal}, variants {variant_equal}, grouped launch {group_equal}, on {TALL_COPIES}x rows {tall_equal}, staged batch = unstaged {staged_equal}"
        ),
        pass: worst < bound && batch_equal && variant_equal && group_equal && tall_equal && staged_equal,
    });
    Ok(())
}

/// The tensor-core kernels (`mmq_*`) for chunks of many rows: the same bits as the split-1 batched
/// matvec (`dp4a`) on every row, for widths whose super-blocks do not fill the eight chains evenly,
/// weight rows that leave a block's last warps idle, and chunks with a partial last tile.
pub(crate) fn mmq_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let rows = 8 * 37;
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0] {
        let fmt = int8_format(ty).context("an integer type")?;
        let suffix = type_suffix(ty).context("type has kernels")?;
        let variant = tandem_cuda::lab::matmul::int8::variants(suffix)
            .into_iter()
            .find(|v| v.split == 1 && !v.staged)
            .context("a split-1 variant")?;
        let (mut equal, mut cases) = (true, Vec::new());
        for cols in [2560, 4352] {
            let w = gpu.upload(&host_weights(rng, ty, rows, cols)?)?;
            let wq = repack(gpu, ty, &w, rows, cols)?.unwrap_or(w);
            for t in [16, 37, 64] {
                if !mmq_takes(suffix, variant, t, &[rows]) {
                    anyhow::bail!("{ty} {rows}x{cols} at t={t} does not take the tensor cores");
                }
                let x: Vec<f32> = (0..t * cols).map(|_| rng.normal()).collect();
                let x_dev = gpu.upload(&x)?;
                let mut a = gpu.alloc::<u8>(fmt.bytes(t, cols))?;
                quantize_act_into(gpu, fmt, &x_dev, t, cols, &mut a)?;
                let mut outs = Vec::new();
                for tensor_cores in [false, true] {
                    let mut out = gpu.upload(&vec![f32::NAN; t * rows])?;
                    let mut targets = [MmvqTarget {
                        w: &wq,
                        rows,
                        out: &mut out,
                    }];
                    let kernels = MmvqKernels {
                        tensor_cores,
                        ..MmvqKernels::all(gpu)
                    };
                    mmvq_group_into_with(gpu, suffix, variant, &mut targets, &a, t, cols, kernels)?;
                    outs.push(gpu.download(&out)?);
                }
                let same = outs[0]
                    .iter()
                    .zip(&outs[1])
                    .all(|(x, y)| x.to_bits() == y.to_bits() && x.is_finite());
                if !same {
                    let first = outs[0]
                        .iter()
                        .zip(&outs[1])
                        .position(|(x, y)| x.to_bits() != y.to_bits());
                    cases.push(format!("{cols} wide, t={t}: first differing element {first:?}"));
                }
                equal &= same;
            }
        }
        table.push(Row {
            check: format!(
                "int8 on the tensor cores ({ty}, {rows} rows, 2560 and 4352 wide, t=16,37,64) = split-1 batched matvec bits"
            ),
            result: if equal { "bit-equal".into() } else { cases.join("; ") },
            pass: equal,
        });
    }
    Ok(())
}
