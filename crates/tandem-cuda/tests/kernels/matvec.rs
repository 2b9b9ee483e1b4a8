//! The decode matvec families and the GEMM route (cuBLAS over f16 copies of the weights) against an f64
//! reference over the same dequantized weights, for every weight type the GPU reads; outputs poisoned
//! with NaN first so an unwritten element fails. The matvec must also give every row the same bits
//! alone and batched.

use anyhow::{Context, Result};
use tandem_cuda::lab::launch::{dequant_f16, gemm_into, matvec_into, type_suffix};
use tandem_cuda::lab::matmul::kinds::MatvecFamily;
use tandem_cuda::Gpu;
use tandem_gguf::GgmlType;

use crate::common::{rel_err, Rng, Row};
use crate::int8;

#[test]
fn every_weight_type_against_f64() {
    crate::common::run("matvec and gemm checks", weight_type_checks);
}

/// For every weight type the GPU reads: a fresh random matrix (quantized on the CPU) and fresh random
/// activations, the integer route's checks (`int8::int8_checks`), then the float matvec families and
/// the GEMM route against an f64 reference over the same dequantized weights.
fn weight_type_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    let types = [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ];
    let (rows, cols) = (300, 2560);
    for ty in types {
        let suffix = type_suffix(ty).expect("checked types have kernels");
        let row_bytes = ty.row_bytes(cols as u64).context("row size")? as usize;
        let mut w = vec![0u8; rows * row_bytes];
        for r in 0..rows {
            let src: Vec<f32> = (0..cols).map(|_| rng.normal() * 0.05).collect();
            tandem_quant::quantize_row(ty, &src, &mut w[r * row_bytes..(r + 1) * row_bytes])?;
        }
        let deq = tandem_quant::dequantize(ty, &w)?;
        int8::int8_checks(gpu, rng, ty, &w, &deq, (rows, cols), table)?;
        let w_dev = gpu.upload(&w)?;
        let w16 = dequant_f16(gpu, suffix, &w_dev, rows, cols)?;
        // F16 weights are their own GEMM operand in the model (no copy): that view is what is checked,
        // and it must hold the bits the dequantizing copy would.
        // SAFETY: an F16 matrix's bytes are rows * cols f16 values in one device allocation.
        let w16_view = match ty {
            GgmlType::F16 => unsafe { w_dev.transmute::<u16>(rows * cols) }.context("f16 view of F16 weights")?,
            _ => w16.as_view(),
        };
        if ty == GgmlType::F16 {
            let same = gpu
                .download(&w16)?
                .iter()
                .zip(w.chunks_exact(2))
                .all(|(h, b)| h.to_le_bytes() == b[..]);
            table.push(Row {
                check: "F16 weights serve as their own f16 GEMM operand".into(),
                result: format!("dequantized copy bit-equal to the original: {same}"),
                pass: same,
            });
        }
        let families = [
            MatvecFamily::Segmented,
            MatvecFamily::WarpPerRow,
            MatvecFamily::Lanewise,
        ];
        let mut worst_mv = [0f64; 3];
        let mut worst_gemm = 0f64;
        let mut batch_bits_equal = [true; 3];
        for t in [1usize, 5, 64] {
            let x: Vec<f32> = (0..t * cols).map(|_| rng.normal()).collect();
            let mut reference = vec![0f64; t * rows];
            for i in 0..t {
                for r in 0..rows {
                    reference[i * rows + r] = (0..cols)
                        .map(|c| deq[r * cols + c] as f64 * x[i * cols + c] as f64)
                        .sum();
                }
            }
            let x_dev = gpu.upload(&x)?;
            for (f, family) in families.into_iter().enumerate() {
                let mut out = gpu.upload(&vec![f32::NAN; t * rows])?;
                matvec_into(gpu, family, suffix, &w_dev.as_view(), &x_dev, t, rows, cols, &mut out)?;
                let mv = gpu.download(&out)?;
                worst_mv[f] = worst_mv[f].max(rel_err(&mv, &reference));
                // Batch invariance: each row of a batched matvec equals that row computed alone.
                if t == 5 {
                    for i in 0..t {
                        let xi = gpu.upload(&x[i * cols..(i + 1) * cols])?;
                        let mut oi = gpu.upload(&vec![f32::NAN; rows])?;
                        matvec_into(gpu, family, suffix, &w_dev.as_view(), &xi, 1, rows, cols, &mut oi)?;
                        let alone = gpu.download(&oi)?;
                        let batched = &mv[i * rows..(i + 1) * rows];
                        batch_bits_equal[f] &= alone.iter().zip(batched).all(|(a, b)| a.to_bits() == b.to_bits());
                    }
                }
            }
            let mut out = gpu.upload(&vec![f32::NAN; t * rows])?;
            let mut x16 = gpu.alloc::<u16>(t * cols)?;
            gemm_into(gpu, &w16_view, &x_dev, &mut x16, t, rows, cols, &mut out)?;
            worst_gemm = worst_gemm.max(rel_err(&gpu.download(&out)?, &reference));
        }
        // f32 accumulation over exactly dequantized weights; the GEMM route rounds both operands to f16.
        let (mv_bound, gemm_bound) = (1e-5, 5e-3);
        for (f, family) in families.into_iter().enumerate() {
            table.push(Row {
                check: format!("matvec {family:?} {ty} {rows}x{cols}, t=1,5,64"),
                result: format!(
                    "rel err {:.2e} (bound {mv_bound:.0e}); batched rows bit-equal: {}",
                    worst_mv[f], batch_bits_equal[f]
                ),
                pass: worst_mv[f] < mv_bound && batch_bits_equal[f],
            });
        }
        table.push(Row {
            check: format!("gemm (cuBLAS f16) {ty}"),
            result: format!("rel err {worst_gemm:.2e} (bound {gemm_bound:.0e})"),
            pass: worst_gemm < gemm_bound,
        });
    }
    Ok(())
}
