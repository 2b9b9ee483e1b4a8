//! The feed-forward block's input to its down projection on the GEMM route: gate's and up's products
//! written side by side in one f16 buffer, by one GEMM over their stacked operands (quantized files'
//! f16 copies, F16 files' weights themselves, stacked at load) for chunks under
//! `routes::STACKED_GATE_UP_MAX_ROWS` rows, else by two GEMMs, then the gating kernel reads both halves of each row
//! and writes the down GEMM's f16 operand. The products are only read there, so they never exist in
//! f32: that halves the GEMMs' output and the gating kernel's input. Other routes take the
//! `Backend::gated_products` default (matmuls, then `gated`).

use cudarc::driver::{CudaSlice, PushKernelArg};
use tandem_model::backend::Backend;
use tandem_model::config::Activation;
use tandem_model::weights::Matrix;
use tandem_model::{graph, ModelError};

use crate::device::{driver, Gpu};
use crate::launch::{gemm_f16_out, i32_of, launch_cfg};
use crate::model::{CudaModel, GpuAct, Mode};
use crate::routes;
use crate::upload::stacked_operand;
use crate::CudaError;

/// Elements one `gated_pair` thread reads from each half (one 16-byte load).
const PAIR_VECTOR: usize = 8;

/// The `act` argument of the gating kernels (`gate_value` in ops.cu): 0 = SiLU, 1 = GELU (tanh).
pub(crate) fn gate_code(act: Activation) -> i32 {
    match act {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
    }
}

/// The `gated_pair` kernel: row r of `pair` holds gate's `width` products then up's (f16);
/// `h[r] = f16(act(gate) * up)`. Public for `tandem gpu-check`.
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

impl CudaModel {
    /// `Backend::gated_products`.
    pub(crate) fn gated_pair_products(
        &self,
        x: &GpuAct,
        gate: &Matrix,
        up: &Matrix,
        act: Activation,
        reader: &Matrix,
    ) -> Result<GpuAct, ModelError> {
        let t = x.rows;
        let paired = !self.dry()
            && gate.rows == up.rows
            && gate.rows.is_multiple_of(PAIR_VECTOR)
            && [gate, up]
                .iter()
                .all(|m| self.matrices.get(&m.name).is_some_and(|g| self.takes_gemm(g, t)))
            && self.f16_input(&reader.name, t);
        if !paired {
            let [mut g, u] = graph::exactly(self.matmuls(&[gate, up], x)?)?;
            self.gated(&mut g, &u, act, reader)?;
            return Ok(g);
        }
        let (gg, ug) = (self.matrix(gate)?, self.matrix(up)?);
        let width = gate.rows;
        let may_allocate = self.mode.get() == Mode::Normal;
        let mut pair = self.u16_pool.take(&self.gpu, t * 2 * width, may_allocate)?;
        let x16 = self.f16_operand(x)?;
        // Both halves of one stacked copy: one GEMM can make both products.
        let stacked = stacked_operand(&[gg, ug]);
        let one_gemm = routes::gate_up_in_one_gemm(t, stacked.is_some());
        let cols = gate.cols;
        self.profiled(
            format_args!(
                "gemm gate+up {}x{cols} {} ({}), t={t}",
                2 * width,
                gg.suffix,
                if one_gemm { "one GEMM" } else { "two GEMMs" }
            ),
            || -> Result<(), ModelError> {
                if let (true, Some(w16)) = (one_gemm, &stacked) {
                    gemm_f16_out(&self.gpu, w16, &x16, t, 2 * width, cols, &mut pair, 0, 2 * width)?;
                } else {
                    for (g, offset) in [(gg, 0), (ug, width)] {
                        let w16 = g
                            .f16_view()?
                            .ok_or_else(|| ModelError::Kernel("no f16 operand".into()))?;
                        gemm_f16_out(&self.gpu, &w16, &x16, t, width, cols, &mut pair, offset, 2 * width)?;
                    }
                }
                Ok(())
            },
        )?;
        *x.f16.borrow_mut() = Some(x16);
        let mut h = self.u16_pool.take(&self.gpu, t * width, may_allocate)?;
        self.profiled("gated (f16 pair)", || {
            gated_pair_into(&self.gpu, &pair, t, width, act, &mut h)
        })?;
        Ok(GpuAct::f16_only(t, width, h))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pair_vector_matches_the_kernel() {
        let src = crate::nvrtc::assemble(&crate::nvrtc::OPS);
        assert!(src.contains("#define PAIR_VECTOR 8"), "PAIR_VECTOR in ops.cu");
    }
}
