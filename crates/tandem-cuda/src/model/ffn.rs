//! The model's feed-forward products (`ops/ffn.rs` holds the gating kernel).

use tandem_model::backend::Backend;
use tandem_model::config::Activation;
use tandem_model::weights::Matrix;
use tandem_model::{graph, ModelError};

use crate::matmul::weights::stacked_operand;
use crate::model::{CudaModel, GpuAct, Mode};
use crate::ops::ffn::gated_pair_into;
use crate::ops::ffn::PAIR_VECTOR;
use crate::routes;
use crate::runtime::launch::gemm_f16_out;

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
            && [gate, up].iter().all(|m| {
                self.weights
                    .matrices
                    .get(&m.name)
                    .is_some_and(|g| self.takes_gemm(g, t))
            })
            && self.f16_input(&reader.name, t);
        if !paired {
            let [mut g, u] = graph::exactly(self.matmuls(&[gate, up], x)?)?;
            self.gated(&mut g, &u, act, reader)?;
            return Ok(g);
        }
        let (gg, ug) = (self.matrix(gate)?, self.matrix(up)?);
        let width = gate.rows;
        let may_allocate = self.pass.mode.get() == Mode::Normal;
        let mut pair = self.buffers.u16_pool.take(&self.gpu, t * 2 * width, may_allocate)?;
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
        let mut h = self.buffers.u16_pool.take(&self.gpu, t * width, may_allocate)?;
        self.profiled("gated (f16 pair)", || {
            gated_pair_into(&self.gpu, &pair, t, width, act, &mut h)
        })?;
        Ok(GpuAct::f16_only(t, width, h))
    }
}
