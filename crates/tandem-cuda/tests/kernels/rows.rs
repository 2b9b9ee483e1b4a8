//! The row kernels against f64 references on the host: `add_norm_rows` (the GEMM route's residual
//! add, with and without a sandwich post-norm, and the next pre-norm written as f16), the decode
//! route's `add_norm_to` (the same, the pre-norm in f32) and `gated_pair`
//! (SiLU and GELU gating of gate's and up's f16 products side by side). Fresh random inputs; the f16
//! outputs poisoned with NaN first, so an unwritten element fails.

use anyhow::Result;
use half::f16;
use tandem_cuda::lab::matmul::kinds::ActQuant;
use tandem_cuda::lab::ops::ffn::gated_pair_into;
use tandem_cuda::lab::ops::rows::{add_norm_rows_into, add_norm_to_into};
use tandem_cuda::Gpu;
use tandem_model::config::Activation;

use crate::common::{rel_err, Rng, Row};

#[test]
fn row_kernels_against_f64() {
    crate::common::run("row kernel checks", row_checks);
}

/// f16 rounding costs about 2^-12 relative per element; a wrong element or row costs far more.
const F16_BOUND: f64 = 2e-3;
/// The residual stays f32: only the order of a few roundings differs from the reference.
const F32_BOUND: f64 = 1e-6;
const F16_NAN: u16 = 0x7e00;
/// The f32 normed row: the scale's f32 sum over thousands of squares adds a few roundings.
const F32_NORMED_BOUND: f64 = 1e-5;

fn halves(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect()
}

pub(crate) fn row_checks(gpu: &Gpu, rng: &mut Rng, table: &mut Vec<Row>) -> Result<()> {
    // (rows, width, add, post, the quantized form): Llama's add + norm (for K-quant and for Q8_0
    // weights), Gemma-3-27B's sandwich norm, a first pre-norm, Llama-70B's width (the decode kernel's
    // longest row in registers), Gemma 3 270M's.
    use ActQuant::{Q8, Q8K};
    for (rows, width, add, post, fmt) in [
        (37, 4096, true, false, Q8K),
        (4, 4096, true, false, Q8),
        (9, 5376, true, true, Q8K),
        (5, 640, false, false, Q8),
        (2, 8192, true, false, Q8K),
        (3, 640, true, true, Q8),
    ] {
        let eps = 1e-6f32;
        let mut normal = |n: usize, s: f32| -> Vec<f32> { (0..n).map(|_| rng.normal() * s).collect() };
        let (x, y) = (normal(rows * width, 1.0), normal(rows * width, 0.5));
        let (pw, nw) = (normal(width, 1.0), normal(width, 1.0));
        let mut want_x = vec![0f64; rows * width];
        let mut want_h = vec![0f64; rows * width];
        for r in 0..rows {
            let row = r * width..(r + 1) * width;
            let ys = &y[row.clone()];
            let inv = |v: &mut dyn Iterator<Item = f64>| {
                1.0 / (v.map(|a| a * a).sum::<f64>() / width as f64 + eps as f64).sqrt()
            };
            let post_scale = inv(&mut ys.iter().map(|&a| a as f64));
            for i in 0..width {
                let delta = match (add, post) {
                    (false, _) => 0.0,
                    (true, false) => ys[i] as f64,
                    (true, true) => ys[i] as f64 * post_scale * pw[i] as f64,
                };
                want_x[r * width + i] = x[r * width + i] as f64 + delta;
            }
            let scale = inv(&mut want_x[row.clone()].iter().copied());
            for i in 0..width {
                want_h[r * width + i] = want_x[r * width + i] * scale * nw[i] as f64;
            }
        }
        let x_dev = gpu.upload(&x)?;
        let y_dev = gpu.upload(&y)?;
        let (pw_dev, nw_dev) = (gpu.upload(&pw)?, gpu.upload(&nw)?);
        let mut h = gpu.upload(&vec![F16_NAN; rows * width])?;
        let y_arg = add.then_some(&y_dev);
        let post_arg = post.then_some(&pw_dev);
        // The decode route's kernel on its own copy of x, f32 out poisoned with NaN.
        let x_decode = gpu.upload(&x)?;
        let mut out = gpu.upload(&vec![f32::NAN; rows * width])?;
        let mut a = gpu.upload(&vec![0xA5u8; fmt.bytes(rows, width)])?;
        let shape = (rows, width, eps);
        add_norm_to_into(
            gpu,
            &x_decode,
            y_arg,
            post_arg,
            &nw_dev,
            shape,
            &mut out,
            Some((fmt, &mut a)),
        )?;
        let normed = gpu.download(&out)?;
        let (err_xd, err_out) = (rel_err(&gpu.download(&x_decode)?, &want_x), rel_err(&normed, &want_h));
        // The quants must be the CPU's quantization of the kernel's own f32 output, bit for bit.
        let quant_equal = gpu.download(&a)? == crate::int8::cpu_quantize(fmt, &normed, rows, width);
        table.push(Row {
            check: format!("add_norm_to {rows}x{width}, add {add}, post-norm {post}, {fmt:?} out"),
            result: format!(
                "residual rel err {err_xd:.2e} (bound {F32_BOUND:.0e}); normed {err_out:.2e} (bound {F32_NORMED_BOUND:.0e}); quants as the CPU's: {quant_equal}"
            ),
            pass: err_xd < F32_BOUND && err_out < F32_NORMED_BOUND && quant_equal,
        });
        add_norm_rows_into(gpu, &x_dev, y_arg, post_arg, &nw_dev, (rows, width, eps), &mut h)?;
        let (err_x, err_h) = (
            rel_err(&gpu.download(&x_dev)?, &want_x),
            rel_err(&halves(&gpu.download(&h)?), &want_h),
        );
        table.push(Row {
            check: format!("add_norm_rows {rows}x{width}, add {add}, post-norm {post}"),
            result: format!(
                "residual rel err {err_x:.2e} (bound {F32_BOUND:.0e}); f16 normed {err_h:.2e} (bound {F16_BOUND:.0e})"
            ),
            pass: err_x < F32_BOUND && err_h < F16_BOUND,
        });
    }

    for (rows, width, act) in [(6, 14336, Activation::Silu), (3, 5120, Activation::GeluTanh)] {
        let pair: Vec<u16> = (0..rows * 2 * width)
            .map(|_| f16::from_f32(rng.normal() * 2.0).to_bits())
            .collect();
        let values = halves(&pair);
        let mut want = vec![0f64; rows * width];
        for r in 0..rows {
            for i in 0..width {
                let g = values[r * 2 * width + i] as f64;
                let u = values[r * 2 * width + width + i] as f64;
                let a = match act {
                    Activation::Silu => g / (1.0 + (-g).exp()),
                    Activation::GeluTanh => {
                        0.5 * g * (1.0 + (0.797_884_560_802_865_4 * g * (1.0 + 0.044715 * g * g)).tanh())
                    }
                };
                want[r * width + i] = a * u;
            }
        }
        let pair_dev = gpu.upload(&pair)?;
        let mut h = gpu.upload(&vec![F16_NAN; rows * width])?;
        gated_pair_into(gpu, &pair_dev, rows, width, act, &mut h)?;
        let err = rel_err(&halves(&gpu.download(&h)?), &want);
        table.push(Row {
            check: format!("gated_pair {rows}x{width} {act:?}"),
            result: format!("rel err {err:.2e} (bound {F16_BOUND:.0e})"),
            pass: err < F16_BOUND,
        });
    }
    Ok(())
}
