//! Decode steps' routed experts in host memory, computed on the CPU (`--expert-decode`).
//!
//! A decode step (or a batch of up to `routes::INDEXED_EXPERTS_MAX_ROWS` rows) that routes to an
//! expert kept in host memory can copy its three matrices into a device slot and run them there (the
//! slot cache), or leave them where they are and run them on the CPU from the model file, as
//! llama.cpp's `--n-cpu-moe` does. The grouped route already reads the step's routing back, so the
//! CPU side costs one more small download (the step's normed rows), its products, and one upload of
//! each expert's outputs into the stack `moe_combine` reads; the GPU meanwhile runs the experts it
//! holds, whose launches are queued first.
//!
//! Which is cheaper depends on the machine: the link's rate against the CPU's memory bandwidth and
//! cores. `auto` times one expert each way at load (`settle_expert_decode`): an expert found in a
//! slot always runs there (no copy), a missed one where that timing says. The CPU's sums are other
//! bits than the GPU's, so deterministic mode keeps every expert on the GPU.

use std::time::{Duration, Instant};

use tandem_model::backend::Backend;
use tandem_model::config::Activation;
use tandem_model::weights::{ExpertFfn, FeedForward, Matrix};
use tandem_model::ModelError;
use tandem_model::Rows;

use crate::model::{CudaModel, GpuAct, Mode};
use crate::offload::DecodeSide;
use crate::options::ExpertDecode;
use crate::routes::INDEXED_EXPERTS_MAX_ROWS;
use crate::runtime::checked::driver;
use crate::CudaError;

/// Experts timed each way at load (distinct ones, so every slot copy is a miss).
const TIMED_EXPERTS: usize = 6;

impl CudaModel {
    /// Settles where decode steps compute non-resident experts, from `--expert-decode` (timing one
    /// layer's experts each way for `auto`). Nothing to settle without experts in host memory.
    pub(crate) fn settle_expert_decode(&self, deterministic: bool) -> Result<(), CudaError> {
        let Some(o) = &self.offload else {
            return Ok(());
        };
        let side = match (o.options.decode, deterministic) {
            (ExpertDecode::Cpu, true) => {
                return Err(CudaError::Driver {
                    what: "--expert-decode cpu".into(),
                    err: "the CPU's sums are not the GPU's bits: deterministic mode computes every expert on the GPU"
                        .into(),
                })
            }
            (ExpertDecode::Gpu, _) | (ExpertDecode::Auto, true) => DecodeSide::Slots,
            (ExpertDecode::Cpu, false) => DecodeSide::Cpu,
            (ExpertDecode::Auto, false) => {
                let (on_gpu, on_cpu) = self.time_expert_decode().map_err(|e| CudaError::Driver {
                    what: "timing experts for --expert-decode auto".into(),
                    err: e.to_string(),
                })?;
                let side = if on_cpu < on_gpu {
                    DecodeSide::CpuWhenMissed
                } else {
                    DecodeSide::Slots
                };
                if o.options.trace {
                    eprintln!(
                        "expert decode: a missed expert {:.0} us copied and run on the GPU, {:.0} us on the CPU: {side:?}",
                        on_gpu.as_secs_f64() * 1e6,
                        on_cpu.as_secs_f64() * 1e6
                    );
                }
                side
            }
        };
        o.decode_side.set(side);
        Ok(())
    }

    /// Whether a chunk of `rows` rows (not streamed) computes `layer`'s non-resident `expert` on the
    /// CPU.
    pub(crate) fn expert_on_cpu(&self, layer: usize, expert: usize, rows: usize, streamed: bool) -> bool {
        let Some(o) = &self.offload else {
            return false;
        };
        if streamed || rows > INDEXED_EXPERTS_MAX_ROWS || self.pass.mode.get() != Mode::Normal || self.dry() {
            return false;
        }
        if o.residency.is_resident(layer, expert) {
            return false;
        }
        match o.decode_side.get() {
            DecodeSide::Slots => false,
            DecodeSide::Cpu => true,
            DecodeSide::CpuWhenMissed => !o.slots.holds(layer, expert),
        }
    }

    /// The outputs of `expert`'s gate, up and down over `members` (chunk rows) of `x_host` (the
    /// chunk's normed rows, read back), computed on the CPU from the model file.
    pub(crate) fn cpu_expert_rows(
        &self,
        x_host: &Rows,
        members: &[usize],
        experts: &ExpertFfn,
        expert: usize,
        act: Activation,
    ) -> Result<Vec<f32>, ModelError> {
        let [gate, up, down]: [&Matrix; 3] = [&experts.gate, &experts.up, &experts.down].map(|s| &s.experts[expert]);
        let xe = self.cpu.gather_rows(x_host, members)?;
        let h = self.cpu.gated_products(&xe, gate, up, act, down)?;
        Ok(self.cpu.matmul(down, &h)?.data)
    }

    /// A decode step's cost for one missed expert each way, on the first mixture layer with experts
    /// in host memory: copied into a slot and run on the GPU (to the end of its products), against
    /// run on the CPU with its output uploaded. Medians over `TIMED_EXPERTS` distinct experts after
    /// one of each to warm up; the slots and counters are left as they were found.
    fn time_expert_decode(&self) -> Result<(Duration, Duration), ModelError> {
        let o = self
            .offload
            .as_ref()
            .ok_or_else(|| ModelError::Kernel("no experts in host memory".into()))?;
        let found = self
            .cpu
            .weights
            .layers
            .iter()
            .enumerate()
            .find_map(|(l, layer)| match &layer.ffn {
                FeedForward::Experts(e) => {
                    let missing: Vec<usize> = (0..e.gate.experts.len())
                        .filter(|&x| !o.residency.is_resident(l, x))
                        .collect();
                    (!missing.is_empty()).then_some((l, e, missing))
                }
                _ => None,
            });
        let Some((layer, experts, missing)) = found else {
            return Err(ModelError::Kernel(
                "no mixture layer with experts in host memory".into(),
            ));
        };
        let act = self.cpu.config.activation;
        let width = self.cpu.config.d_model;
        // Any row: the cost does not depend on the values.
        let row: Vec<f32> = (0..width).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
        let x_host = Rows {
            data: row.clone(),
            width,
        };
        let counters = o.slots.counters.get();
        let mut gpu_times = Vec::new();
        let mut cpu_times = Vec::new();
        for (i, &expert) in missing.iter().cycle().take(TIMED_EXPERTS + 1).enumerate() {
            o.slots.forget();
            let x = self.act_from_host(&row, width)?;
            self.gpu.synchronize()?;
            let t0 = Instant::now();
            let matrices = [&experts.gate, &experts.up, &experts.down].map(|s| &s.experts[expert]);
            let placed = self
                .place_expert(layer, expert, &matrices, false)?
                .ok_or_else(|| ModelError::Kernel(format!("layer {layer} expert {expert} is resident")))?;
            let [gate, up, down] = placed.matrices.each_ref();
            let h = self.gated_pair_products(&x, gate, up, act, down)?;
            let y = self.matmul_rows(down, &h)?;
            self.gpu.synchronize()?;
            let on_gpu = t0.elapsed();
            drop(y);
            let t0 = Instant::now();
            let out = self.cpu_expert_rows(&x_host, &[0], experts, expert, act)?;
            let up_y = self.gpu.upload(&out)?;
            self.gpu.synchronize()?;
            let on_cpu = t0.elapsed();
            drop(up_y);
            if i > 0 {
                gpu_times.push(on_gpu);
                cpu_times.push(on_cpu);
            }
        }
        o.slots.forget();
        o.slots.counters.set(counters);
        Ok((median(&mut gpu_times), median(&mut cpu_times)))
    }

    /// One host row on the device as an activation.
    fn act_from_host(&self, row: &[f32], width: usize) -> Result<GpuAct, ModelError> {
        let mut x = self.act(1, width)?;
        driver(
            "cuMemcpyHtoD (timing row)",
            self.gpu.stream.memcpy_htod(row, x.buf_mut()?),
        )?;
        Ok(x)
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}
