//! A mixture-of-experts feed-forward block on the device (`Backend::expert_ffn`).
//!
//! The router's logits are a matmul like any other (its f32 matrix has no f16 copy, so it always
//! takes the matvec route: the routing reads logits as exact as the CPU's up to rounding). The
//! `moe_route` kernel routes every row as `Routing::from_logits` does and leaves the expert ids and
//! weights on the device. Then one of three routes (`routes::expert_route`, by the chunk's rows and
//! the expert tensors' kernels):
//!
//! - Indexed (decode steps and batches of up to `routes::INDEXED_EXPERTS_MAX_ROWS` rows, where every
//!   expert tensor has an address table): one launch for gate and up and one for down over every
//!   (row, slot) pair, each pair reading the matrix of the expert its id names (`matmul::indexed`).
//!   Nothing comes back to the host, so these steps are captured and replayed as graphs.
//! - Sorted (longer chunks and batches, where every expert tensor's table takes the grouped
//!   tensor-core kernel): `moe_sort` orders the (row, slot) pairs by expert on the device, the rows
//!   are gathered in that order and quantized once, and one `mmq_ids_*` launch for gate and up and
//!   one for down run tiles of up to 16 pairs of one expert. No host sync, and nine launches a layer
//!   instead of a handful per routed expert.
//! - Grouped (experts in host memory, or of a type without those kernels): the ids come back to the
//!   host (a few bytes a row), which groups the
//!   rows by expert: each routed expert's rows are gathered and run through its gate, up and down
//!   matrices by the dense block's own ops (the route of each product chosen by its row count, as for
//!   any matmul), and its outputs are copied into one stack, group after group.
//!
//! `moe_combine` then sums each row's slots in slot order, weighted by the weights the routing kernel
//! left. A row's output is computed by the same kernels in the same order whatever rows share its
//! chunk, given row-exact products (deterministic mode's routes): the indexed route's products are
//! each expert's one-row sums, which the grouped route's row-exact products equal.

use cudarc::driver::PushKernelArg;
use tandem_model::config::{Activation, MoeConfig};
use tandem_model::moe::{group_by_expert, Routing};
use tandem_model::weights::ExpertFfn;
use tandem_model::ModelError;
use tandem_model::Rows;

use crate::matmul::indexed::{mmq_ids_into, mmvq_ids_into, ExpertTable, Pairs};
use crate::model::{CudaModel, GpuAct, Mode};
use crate::ops::moe::{
    combine_into, max_sort_tiles, route_into, sort_into, stacked_positions, RouteShape, SortedPairs,
};
use crate::routes::{expert_route, ExpertRoute};
use crate::runtime::checked::driver;
use crate::runtime::grid::{i32_of, launch_cfg};
use crate::runtime::pool::DevBuf;

/// Why a model with a mixture decodes without CUDA graphs (`GraphCache::blocked`).
pub(crate) const MIXTURE_GRAPHS_OFF: &str = "a mixture whose experts have no integer kernel takes the grouped route, \
     whose expert launches follow routing read back on the host, which a captured graph cannot replay";

/// Why a model with experts in host memory decodes without CUDA graphs: they have no address table,
/// and the slot each one is staged in follows routing read back on the host.
pub(crate) const OFFLOADED_GRAPHS_OFF: &str = "experts in host memory take the grouped route, staged in slots \
     by routing read back on the host, which a captured graph cannot replay";

/// A chunk's routing, on the device: `rows × k` expert ids (none in a dry pass) and weights.
struct Routed {
    ids: Option<DevBuf<i32>>,
    weights: GpuAct,
}

impl Routed {
    fn ids(&self) -> Result<&DevBuf<i32>, ModelError> {
        self.ids
            .as_ref()
            .ok_or_else(|| ModelError::Kernel("expert ids read in a dry pass".into()))
    }
}

impl CudaModel {
    /// `Backend::expert_ffn`.
    pub(crate) fn mixture(
        &self,
        layer: usize,
        x: &GpuAct,
        experts: &ExpertFfn,
        moe: &MoeConfig,
        act: Activation,
    ) -> Result<GpuAct, ModelError> {
        let tables = [&experts.gate, &experts.up, &experts.down].map(|set| self.weights.expert_tables.get(&set.name));
        let indexed = match tables {
            [Some(g), Some(u), Some(d)] => Some([g, u, d]),
            _ => None,
        };
        let sorted = indexed.is_some_and(|t| t.iter().all(|t| t.groups_on_tensor_cores()));
        match (expert_route(x.rows, indexed.is_some(), sorted), indexed) {
            (ExpertRoute::Indexed, Some(tables)) => self.indexed_experts(x, experts, moe, act, tables),
            (ExpertRoute::Sorted, Some(tables)) => self.sorted_experts(x, experts, moe, act, tables),
            _ if self.pass.mode.get() != Mode::Normal => Err(ModelError::Kernel(format!(
                "{} rows of experts in a captured or replayed pass: {MIXTURE_GRAPHS_OFF}",
                x.rows
            ))),
            _ => self.grouped_experts(layer, x, experts, moe, act),
        }
    }

    /// The router's logits and `moe_route`'s choice (checked against the host's when
    /// `TANDEM_CUDA_CHECK_ROUTING` is set and the pass launches now).
    fn route_rows(&self, x: &GpuAct, experts: &ExpertFfn, moe: &MoeConfig) -> Result<Routed, ModelError> {
        let (rows, n, k) = (x.rows, moe.n_expert, moe.n_expert_used);
        let logits = self.matmul_rows(&experts.router, x)?;
        let mut weights = self.act(rows, k)?;
        if self.dry() {
            return Ok(Routed { ids: None, weights });
        }
        let may_allocate = self.pass.mode.get() == Mode::Normal;
        let mut ids = self.buffers.i32_pool.take(&self.gpu, rows * k, may_allocate)?;
        let shape = RouteShape {
            rows,
            n,
            k,
            norm: moe.norm_weights,
        };
        self.profiled("moe_route", || {
            route_into(&self.gpu, logits.buf()?, shape, &mut ids, weights.buf_mut()?)
        })?;
        if self.gpu.options.lab.check_routing && self.pass.mode.get() == Mode::Normal {
            let chosen = self.chosen_experts(&ids, n)?;
            self.check_routing(&logits, &weights, &chosen, moe)?;
        }
        Ok(Routed {
            ids: Some(ids),
            weights,
        })
    }

    /// The ids `moe_route` wrote, read back: each an expert of `0..n`.
    fn chosen_experts(&self, ids: &DevBuf<i32>, n: usize) -> Result<Vec<u32>, ModelError> {
        self.gpu
            .download(ids)?
            .into_iter()
            .map(|e| u32::try_from(e).ok().filter(|&e| (e as usize) < n))
            .collect::<Option<_>>()
            .ok_or_else(|| ModelError::Kernel(format!("moe_route chose an expert outside 0..{n}")))
    }

    /// The indexed route: gate and up for every pair in one launch, the gating (quantized for down),
    /// down for every pair, and the combine over the pairs in their own order.
    fn indexed_experts(
        &self,
        x: &GpuAct,
        experts: &ExpertFfn,
        moe: &MoeConfig,
        act: Activation,
        [gate, up, down]: [&ExpertTable; 3],
    ) -> Result<GpuAct, ModelError> {
        let (rows, k) = (x.rows, moe.n_expert_used);
        let pairs = rows * k;
        let routed = self.route_rows(x, experts, moe)?;
        let mut g = self.act(pairs, gate.rows)?;
        let mut u = self.act(pairs, up.rows)?;
        if !self.dry() {
            let ids = routed.ids()?;
            self.with_quantized(x, gate.fmt, |a| {
                let src = Pairs {
                    ids,
                    pairs,
                    a,
                    a_rows: rows,
                    a_div: k,
                };
                self.profiled(format_args!("experts gate+up {pairs} pairs"), || {
                    if gate.same_shape(up) {
                        return mmvq_ids_into(&self.gpu, &[gate, up], &src, &mut [g.buf_mut()?, u.buf_mut()?]);
                    }
                    mmvq_ids_into(&self.gpu, &[gate], &src, &mut [g.buf_mut()?])?;
                    mmvq_ids_into(&self.gpu, &[up], &src, &mut [u.buf_mut()?])
                })
            })?;
        }
        self.gate_rows_into(&mut g, &u, act, Some(down.fmt), false)?;
        let mut y = self.act(pairs, down.rows)?;
        let mut out = self.act(rows, down.rows)?;
        if self.dry() {
            return Ok(out);
        }
        let ids = routed.ids()?;
        self.with_quantized(&g, down.fmt, |a| {
            let src = Pairs {
                ids,
                pairs,
                a,
                a_rows: pairs,
                a_div: 1,
            };
            self.profiled(format_args!("experts down {pairs} pairs"), || {
                mmvq_ids_into(&self.gpu, &[down], &src, &mut [y.buf_mut()?])
            })
        })?;
        self.profiled("moe_combine", || {
            combine_into(
                &self.gpu,
                y.buf()?,
                None,
                routed.weights.buf()?,
                rows,
                k,
                down.rows,
                out.buf_mut()?,
            )
        })?;
        Ok(out)
    }

    /// The sorted route: the pairs sorted by expert on the device, the chunk's rows gathered in that
    /// order and quantized once, gate and up in one tensor-core launch over tiles of one expert's
    /// pairs, the gating (quantized for down), down likewise, and the combine reading each pair's
    /// output at its sorted position.
    fn sorted_experts(
        &self,
        x: &GpuAct,
        experts: &ExpertFfn,
        moe: &MoeConfig,
        act: Activation,
        [gate, up, down]: [&ExpertTable; 3],
    ) -> Result<GpuAct, ModelError> {
        let (rows, n, k) = (x.rows, moe.n_expert, moe.n_expert_used);
        let pairs = rows * k;
        let max_tiles = max_sort_tiles(pairs, n);
        let routed = self.route_rows(x, experts, moe)?;
        let mut xs = self.act(pairs, x.width)?;
        let mut g = self.act(pairs, gate.rows)?;
        let mut u = self.act(pairs, up.rows)?;
        let mut y = self.act(pairs, down.rows)?;
        let mut out = self.act(rows, down.rows)?;
        if self.dry() {
            return Ok(out);
        }
        let may_allocate = self.pass.mode.get() == Mode::Normal;
        let pool = &self.buffers.i32_pool;
        let mut src_row = pool.take(&self.gpu, pairs, may_allocate)?;
        let mut pos = pool.take(&self.gpu, pairs, may_allocate)?;
        let mut tiles = pool.take(&self.gpu, 1 + 3 * max_tiles, may_allocate)?;
        let ids = routed.ids()?;
        self.profiled("moe_sort", || {
            let out = SortedPairs {
                src_row: &mut src_row,
                pos: &mut pos,
                tiles: &mut tiles,
            };
            sort_into(&self.gpu, ids, rows, n, k, out)
        })?;
        self.profiled("gather_rows (sorted pairs)", || {
            let f = self.gpu.function("gather_rows")?;
            let wi = i32_of(x.width, "width")?;
            let mut b = self.gpu.launch_builder(f)?;
            b.arg(x.buf()?).arg(&*src_row).arg(xs.buf_mut()?).arg(&wi);
            // SAFETY: src_row holds `pairs` rows of x, each below x.rows (the sort's chunk rows).
            driver("gather_rows", unsafe {
                b.launch(launch_cfg((pairs as u32, 1, 1), 256))
            })
        })?;
        self.with_quantized(&xs, gate.fmt, |a| {
            self.profiled(format_args!("experts gate+up {pairs} sorted pairs"), || {
                if gate.same_shape(up) {
                    return mmq_ids_into(
                        &self.gpu,
                        &[gate, up],
                        &tiles,
                        max_tiles,
                        a,
                        pairs,
                        &mut [g.buf_mut()?, u.buf_mut()?],
                    );
                }
                mmq_ids_into(&self.gpu, &[gate], &tiles, max_tiles, a, pairs, &mut [g.buf_mut()?])?;
                mmq_ids_into(&self.gpu, &[up], &tiles, max_tiles, a, pairs, &mut [u.buf_mut()?])
            })
        })?;
        self.gate_rows_into(&mut g, &u, act, Some(down.fmt), false)?;
        self.with_quantized(&g, down.fmt, |a| {
            self.profiled(format_args!("experts down {pairs} sorted pairs"), || {
                mmq_ids_into(&self.gpu, &[down], &tiles, max_tiles, a, pairs, &mut [y.buf_mut()?])
            })
        })?;
        self.profiled("moe_combine", || {
            combine_into(
                &self.gpu,
                y.buf()?,
                Some(&pos.as_view()),
                routed.weights.buf()?,
                rows,
                k,
                down.rows,
                out.buf_mut()?,
            )
        })?;
        Ok(out)
    }

    /// The grouped route (launched now only: the grouping reads the ids on the host). Experts in host
    /// memory come through the slots: from the chunk's stream where it streams (`offload.rs`), else
    /// from the slot cache.
    fn grouped_experts(
        &self,
        layer: usize,
        x: &GpuAct,
        experts: &ExpertFfn,
        moe: &MoeConfig,
        act: Activation,
    ) -> Result<GpuAct, ModelError> {
        let (rows, n, k) = (x.rows, moe.n_expert, moe.n_expert_used);
        let Some(width) = experts.down.experts.first().map(|m| m.rows) else {
            return Err(ModelError::Kernel("a mixture without experts".into()));
        };
        let pairs = rows * k;
        let routed = self.route_rows(x, experts, moe)?;
        let chosen = self.chosen_experts(routed.ids()?, n)?;
        let groups = group_by_expert(&chosen, n);
        let (starts, pos) = stacked_positions(&groups, pairs)
            .ok_or_else(|| ModelError::Kernel("expert groups do not cover each routed row once".into()))?;
        let stream = self.expert_stream(layer, rows, &groups)?;
        self.decode_trial_step(layer, rows, stream);
        // Experts a decode step computes on the CPU (`cpu_experts.rs`) read its rows from the host,
        // read back before the GPU's experts are queued so that the two run side by side.
        let on_cpu: Vec<bool> = groups
            .iter()
            .map(|g| self.expert_on_cpu(layer, g.expert, rows, stream))
            .collect();
        let x_host = match on_cpu.contains(&true) {
            true => Some(Rows {
                data: self.gpu.download(x.buf()?)?,
                width: x.width,
            }),
            false => None,
        };
        let mut stack = self.act(pairs, width)?;
        for ((g, &start), _) in groups.iter().zip(&starts).zip(&on_cpu).filter(|(_, &cpu)| !cpu) {
            let members: Vec<usize> = g.rows(k).collect();
            let xe = tandem_model::backend::Backend::gather_rows(self, x, &members)?;
            let matrices = [&experts.gate, &experts.up, &experts.down].map(|set| &set.experts[g.expert]);
            let placed = self.place_expert(layer, g.expert, &matrices, stream)?;
            let [gate, up, down] = match &placed {
                Some(in_slot) => in_slot.matrices.each_ref(),
                None => matrices,
            };
            let h = self.gated_pair_products(&xe, gate, up, act, down)?;
            let y = self.matmul_rows(down, &h)?;
            if let (Some(k), Some(offload)) = (placed.as_ref().and_then(|p| p.entry), &self.offload) {
                if let Some(s) = offload.active.borrow().as_ref() {
                    s.release(&self.gpu.stream, k)?;
                }
            }
            let range = start * width..(start + members.len()) * width;
            let dst = stack.buf_mut()?;
            driver(
                "cuMemcpyDtoD (expert outputs)",
                self.gpu.stream.memcpy_dtod(y.buf()?, &mut dst.slice_mut(range)),
            )?;
        }
        if let Some(x_host) = &x_host {
            let jobs: Vec<(usize, Vec<usize>, usize)> = groups
                .iter()
                .zip(&starts)
                .zip(&on_cpu)
                .filter(|(_, &cpu)| cpu)
                .map(|((g, &start), _)| (g.expert, g.rows(k).collect(), start))
                .collect();
            let outputs = self.cpu_experts(x_host, &jobs, experts, act)?;
            for ((_, members, start), y) in jobs.iter().zip(&outputs) {
                let dst = stack.buf_mut()?;
                driver(
                    "cuMemcpyHtoD (expert outputs from the CPU)",
                    self.gpu
                        .stream
                        .memcpy_htod(y, &mut dst.slice_mut(start * width..(start + members.len()) * width)),
                )?;
            }
            if let Some(o) = &self.offload {
                o.slots.count_cpu(jobs.len());
            }
        }
        if stream {
            self.end_layer_stream(layer)?;
        }
        let pos = self.param(&pos, "expert output row")?;
        let mut out = self.act(rows, width)?;
        self.profiled("moe_combine", || {
            combine_into(
                &self.gpu,
                stack.buf()?,
                Some(&self.view(&pos)),
                routed.weights.buf()?,
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
