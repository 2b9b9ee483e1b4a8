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
//! Which is cheaper depends on the machine (the link's rate against the CPU's memory bandwidth and
//! cores) and on how often a step finds its experts in a slot already. `auto` measures it on the
//! model's own decode steps: an expert found in a slot always runs there (no copy); for the missed
//! ones, the first decode steps alternate between the two sides, each timed from its first mixture
//! layer to the next step's, and the side with the smaller median step is kept
//! (`offload::DecodeTrial`). The CPU's sums are other bits than the GPU's, so deterministic mode
//! keeps every expert on the GPU.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tandem_model::backend::Backend;
use tandem_model::config::Activation;
use tandem_model::weights::{ExpertFfn, Matrix};
use tandem_model::ModelError;
use tandem_model::{Model, Rows};

use crate::model::{CudaModel, Mode};
use crate::offload::{DecodeSide, DecodeTrial};
use crate::options::ExpertDecode;
use crate::routes::INDEXED_EXPERTS_MAX_ROWS;
use crate::CudaError;

impl CudaModel {
    /// Settles where decode steps compute non-resident experts, from `--expert-decode` (`auto`
    /// starts its trial). Nothing to settle without experts in host memory.
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
                *o.trial.borrow_mut() = Some(DecodeTrial::default());
                DecodeSide::Slots
            }
        };
        o.decode_side.set(side);
        Ok(())
    }

    /// At a pass's first mixture layer, once its routing has come back: `auto`'s trial takes the
    /// previous decode step's time (when it had as many rows) and picks this step's side, or, with
    /// enough samples, settles the side for good.
    pub(crate) fn decode_trial_step(&self, layer: usize, rows: usize, streamed: bool) {
        let Some(o) = &self.offload else {
            return;
        };
        if layer != o.first_layer {
            return;
        }
        let mut trial = o.trial.borrow_mut();
        let Some(t) = trial.as_mut() else {
            return;
        };
        let now = Instant::now();
        let previous = t.current.take();
        if streamed || rows > INDEXED_EXPERTS_MAX_ROWS || self.pass.mode.get() != Mode::Normal {
            return;
        }
        if let Some((at, _, side)) = previous.filter(|&(_, r, _)| r == rows) {
            t.samples[side].push(now - at);
        }
        let [slots, cpu] = &mut t.samples;
        if slots.len() > DecodeTrial::STEPS && cpu.len() > DecodeTrial::STEPS {
            let (on_gpu, on_cpu) = (median(&mut slots[1..]), median(&mut cpu[1..]));
            let side = if on_cpu < on_gpu {
                DecodeSide::CpuWhenMissed
            } else {
                DecodeSide::Slots
            };
            if o.options.trace {
                eprintln!(
                    "expert decode: median step {:.2} ms with missed experts copied to the GPU, {:.2} ms with them on the CPU: {side:?}",
                    on_gpu.as_secs_f64() * 1e3,
                    on_cpu.as_secs_f64() * 1e3
                );
            }
            o.decode_side.set(side);
            *trial = None;
            return;
        }
        let side = usize::from(slots.len() > cpu.len());
        o.decode_side.set(if side == 0 {
            DecodeSide::Slots
        } else {
            DecodeSide::CpuWhenMissed
        });
        t.current = Some((now, rows, side));
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

    /// The outputs of each job's expert (`(expert, members, _)`: its gate, up and down over those
    /// chunk rows of `x_host`, the chunk's normed rows read back), computed on the CPU from the model
    /// file. The experts run side by side, one a task of the CPU model's pool, each task's products
    /// on its own thread (a pool called from inside a task runs serially): a step's few one-row
    /// experts would otherwise each split three small products over every thread, one expert after
    /// another. A product's rows are the same bits on one thread or many.
    pub(crate) fn cpu_experts(
        &self,
        x_host: &Rows,
        jobs: &[(usize, Vec<usize>, usize)],
        experts: &ExpertFfn,
        act: Activation,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let cpu = &self.cpu;
        let results: Vec<ExpertSlot> = jobs.iter().map(|_| Mutex::new(None)).collect();
        cpu.pool.run(jobs.len(), &|i| {
            let (expert, members, _) = &jobs[i];
            let y = cpu_expert(cpu, x_host, members, experts, *expert, act);
            *results[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(y);
        });
        results
            .into_iter()
            .map(|r| {
                r.into_inner()
                    .unwrap_or_else(|p| p.into_inner())
                    .unwrap_or_else(|| Err(ModelError::Kernel("a CPU expert task did not run".into())))
            })
            .collect()
    }
}

/// Where a CPU expert task leaves its outputs (or its error) for the calling thread.
type ExpertSlot = Mutex<Option<Result<Vec<f32>, ModelError>>>;

/// `expert`'s gate, up and down over `members` of `x_host`, by the CPU backend.
fn cpu_expert(
    cpu: &Model,
    x_host: &Rows,
    members: &[usize],
    experts: &ExpertFfn,
    expert: usize,
    act: Activation,
) -> Result<Vec<f32>, ModelError> {
    let [gate, up, down]: [&Matrix; 3] = [&experts.gate, &experts.up, &experts.down].map(|s| &s.experts[expert]);
    let xe = cpu.gather_rows(x_host, members)?;
    let h = cpu.gated_products(&xe, gate, up, act, down)?;
    Ok(cpu.matmul(down, &h)?.data)
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}
