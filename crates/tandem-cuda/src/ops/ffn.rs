//! The feed-forward block's input to its down projection on the GEMM route: gate's and up's products
//! written side by side in one f16 buffer, by one GEMM over their stacked operands (quantized files'
//! f16 copies, F16 files' weights themselves, stacked at load) for chunks under
//! `routes::STACKED_GATE_UP_MAX_ROWS` rows, else by two GEMMs, then the gating kernel reads both halves of each row
//! and writes the down GEMM's f16 operand. The products are only read there, so they never exist in
//! f32: that halves the GEMMs' output and the gating kernel's input. Other routes take the
//! `Backend::gated_products` default (matmuls, then `gated`).

use cudarc::driver::{CudaSlice, PushKernelArg};
use tandem_model::config::Activation;

use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::runtime::grid::{i32_of, launch_cfg};
use crate::CudaError;

/// Elements one `gated_pair` thread reads from each half (one 16-byte load).
pub(crate) const PAIR_VECTOR: usize = 8;

/// The `act` argument of the gating kernels (`gate_value` in ops.cu): 0 = SiLU, 1 = GELU (tanh).
pub(crate) fn gate_code(act: Activation) -> i32 {
    match act {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
    }
}

/// The `gated_pair` kernel: row r of `pair` holds gate's `width` products then up's (f16);
/// `h[r] = f16(act(gate) * up)`.
pub fn gated_pair_into(
    gpu: &Gpu,
    pair: &CudaSlice<u16>,
    rows: usize,
    width: usize,
    act: Activation,
    h: &mut CudaSlice<u16>,
) -> Result<(), CudaError> {
    if !width.is_multiple_of(PAIR_VECTOR) || pair.len() < rows * 2 * width || h.len() < rows * width {
        return Err(CudaError::Driver {
            what: "gated_pair".into(),
            err: format!("{rows} rows of {width} (a multiple of {PAIR_VECTOR})"),
        });
    }
    let a = gate_code(act);
    let wi = i32_of(width, "width")?;
    let f = gpu.function("gated_pair")?;
    let mut b = gpu.launch_builder(f)?;
    b.arg(pair).arg(&wi).arg(&a).arg(h);
    let grid = ((width / PAIR_VECTOR).div_ceil(256) as u32, rows as u32, 1);
    driver("gated_pair", unsafe { b.launch(launch_cfg(grid, 256)) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn pair_vector_matches_the_kernel() {
        let src = crate::runtime::nvrtc::assemble(&crate::runtime::nvrtc::OPS);
        assert!(src.contains("#define PAIR_VECTOR 8"), "PAIR_VECTOR in ops.cu");
    }
}
