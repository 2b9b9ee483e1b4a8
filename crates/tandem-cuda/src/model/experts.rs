//! A mixture-of-experts feed-forward block on the device (`Backend::expert_ffn`).
//!
//! The router's logits are a matmul like any other (its f32 matrix has no f16 copy, so it always
//! takes the matvec route: the routing reads logits as exact as the CPU's up to rounding). The
//! `moe_route` kernel routes every row as `Routing::from_logits` does and leaves the expert ids and
//! weights on the device. The ids then come back to the host (a few bytes a row), which groups the
//! rows by expert: each routed expert's rows are gathered and run through its gate, up and down
//! matrices by the dense block's own ops (the route of each product chosen by its row count, as for
//! any matmul), and its outputs are copied into one stack, group after group. `moe_combine` sums
//! each row's slots in slot order from there, weighted by the weights the routing kernel left.
//!
//! A row's output is computed by the same kernels in the same order whatever rows share its chunk,
//! given row-exact products (deterministic mode's routes); the grouping only decides which rows
//! share an expert's launch.
//!
//! The ids' trip to the host is why a mixture's decode steps are launched directly rather than
//! replayed from a captured graph (`MIXTURE_GRAPHS_OFF`): a captured graph would replay the expert
//! launches of the step it was captured on.

use tandem_model::config::{Activation, MoeConfig};
use tandem_model::moe::{group_by_expert, Routing};
use tandem_model::weights::ExpertFfn;
use tandem_model::ModelError;

use crate::model::{CudaModel, GpuAct, Mode};
use crate::ops::moe::{combine_into, route_into, stacked_positions, RouteShape};
use crate::runtime::checked::driver;

/// Why a model with a mixture decodes without CUDA graphs (`GraphCache::blocked`).
pub(crate) const MIXTURE_GRAPHS_OFF: &str =
    "a mixture's expert launches follow routing read back on the host, which a captured graph cannot";

impl CudaModel {
    /// `Backend::expert_ffn`.
    pub(crate) fn mixture(
        &self,
        x: &GpuAct,
        experts: &ExpertFfn,
        moe: &MoeConfig,
        act: Activation,
    ) -> Result<GpuAct, ModelError> {
        if self.pass.mode.get() != Mode::Normal {
            return Err(ModelError::Kernel(format!(
                "experts in a captured or replayed pass: {MIXTURE_GRAPHS_OFF}"
            )));
        }
        let (rows, n, k) = (x.rows, moe.n_expert, moe.n_expert_used);
        let Some(width) = experts.down.experts.first().map(|m| m.rows) else {
            return Err(ModelError::Kernel("a mixture without experts".into()));
        };
        let logits = self.matmul_rows(&experts.router, x)?;
        let pairs = rows * k;
        let mut ids = self.gpu.alloc_out::<i32>(pairs)?;
        let mut weights = self.act(rows, k)?;
        let shape = RouteShape {
            rows,
            n,
            k,
            norm: moe.norm_weights,
        };
        self.profiled("moe_route", || {
            route_into(&self.gpu, logits.buf()?, shape, &mut ids, weights.buf_mut()?)
        })?;
        let chosen: Vec<u32> = self
            .gpu
            .download(&ids)?
            .into_iter()
            .map(|e| u32::try_from(e).ok().filter(|&e| (e as usize) < n))
            .collect::<Option<_>>()
            .ok_or_else(|| ModelError::Kernel(format!("moe_route chose an expert outside 0..{n}")))?;
        if self.gpu.options.lab.check_routing {
            self.check_routing(&logits, &weights, &chosen, moe)?;
        }
        let groups = group_by_expert(&chosen, n);
        let (starts, pos) = stacked_positions(&groups, pairs)
            .ok_or_else(|| ModelError::Kernel("expert groups do not cover each routed row once".into()))?;
        let mut stack = self.act(pairs, width)?;
        for (g, &start) in groups.iter().zip(&starts) {
            let members: Vec<usize> = g.rows(k).collect();
            let xe = tandem_model::backend::Backend::gather_rows(self, x, &members)?;
            let (gate, up, down) = (
                &experts.gate.experts[g.expert],
                &experts.up.experts[g.expert],
                &experts.down.experts[g.expert],
            );
            let h = self.gated_pair_products(&xe, gate, up, act, down)?;
            let y = self.matmul_rows(down, &h)?;
            let range = start * width..(start + members.len()) * width;
            let dst = stack.buf_mut()?;
            driver(
                "cuMemcpyDtoD (expert outputs)",
                self.gpu.stream.memcpy_dtod(y.buf()?, &mut dst.slice_mut(range)),
            )?;
        }
        let pos = self.param(&pos, "expert output row")?;
        let mut out = self.act(rows, width)?;
        self.profiled("moe_combine", || {
            combine_into(
                &self.gpu,
                stack.buf()?,
                &self.view(&pos),
                weights.buf()?,
                rows,
                k,
                width,
                out.buf_mut()?,
            )
        })?;
        Ok(out)
    }

    /// `TANDEM_CUDA_CHECK_ROUTING=1`: the routing kernel's choice against `Routing::from_logits` on
    /// the same logits read back: the same experts in the same slots, weights within 1e-6.
    fn check_routing(
        &self,
        logits: &GpuAct,
        weights: &GpuAct,
        chosen: &[u32],
        moe: &MoeConfig,
    ) -> Result<(), ModelError> {
        let host = Routing::from_logits(&self.gpu.download(logits.buf()?)?, moe)?;
        let device_weights = self.gpu.download(weights.buf()?)?;
        if host.experts != chosen {
            let at = host.experts.iter().zip(chosen).position(|(a, b)| a != b).unwrap_or(0);
            return Err(ModelError::Kernel(format!(
                "moe_route: pair {at} (row {}) chose expert {:?}, the host {:?}",
                at / moe.n_expert_used,
                chosen.get(at),
                host.experts.get(at)
            )));
        }
        let worst = host
            .weights
            .iter()
            .zip(&device_weights)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        if worst > 1e-6 || device_weights.len() != host.weights.len() {
            return Err(ModelError::Kernel(format!(
                "moe_route: weights differ from the host's by {worst:e}"
            )));
        }
        Ok(())
    }
}
