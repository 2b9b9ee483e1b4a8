//! A mixture's experts beyond the GPU's budget (`--gpu-expert-budget`): which stay on the device
//! (`residency`), the others' bytes in page-locked host memory (`host`), the device slots they pass
//! through (`slots`: a cache filled on the compute stream for decode steps and short chunks), and the
//! stream that takes a long prefill chunk's non-resident experts through those slots as a ring on a
//! copy stream (`stream`: the CUDA side of `tandem_model::expert_stream`).

pub(crate) mod host;
pub(crate) mod residency;
pub(crate) mod slots;
pub(crate) mod stream;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use tandem_model::weights::{FeedForward, Weights};

use crate::matmul::tune::Tuning;
use crate::matmul::weights::{GpuMatrix, WeightBytes};
use crate::offload::host::HostExperts;
use crate::offload::residency::{budget_bytes, Residency};
use crate::offload::slots::{slot_matrix_name, SlotPool};
use crate::offload::stream::{ActiveStream, StreamRing};
use crate::options::ExpertOffload;
use crate::runtime::device::Gpu;
use crate::runtime::launch::type_suffix;
use crate::CudaError;

/// Slots a model with experts in host memory keeps: two layers' worth of experts (a streamed chunk's
/// copies can run a layer ahead of its compute), at least `MIN_SLOTS`, at most what is non-resident.
pub const MIN_SLOTS: usize = 8;

fn slot_count(n_expert: usize, non_resident: usize) -> usize {
    (2 * n_expert).max(MIN_SLOTS).min(non_resident)
}

/// Each mixture layer's gate, up and down matrix bytes (one expert's).
fn part_bytes(w: &Weights) -> Vec<Option<[usize; 3]>> {
    w.layers
        .iter()
        .map(|l| match &l.ffn {
            FeedForward::Experts(e) => Some([&e.gate, &e.up, &e.down].map(|s| s.expert_bytes())),
            _ => None,
        })
        .collect()
}

/// What the load needs to place a mixture's experts: the residency, the host memory for the rest, and
/// which matrix names go there.
pub struct OffloadLoad {
    residency: Residency,
    host: HostExperts,
    /// Name of each non-resident expert matrix: (layer, expert, part).
    placed: HashMap<String, (usize, usize, usize)>,
    /// The tuning each (part, weight type) took: the slots' matrices read with it.
    templates: HashMap<(usize, &'static str), Tuning>,
    part_bytes: Vec<Option<[usize; 3]>>,
    n_slots: usize,
}

impl OffloadLoad {
    /// The placement `options` asks for: `None` when every expert stays resident (no budget, a budget
    /// that holds them all, or no mixture). `dense` estimates the device bytes the other weights take.
    pub fn plan(
        gpu: &Gpu,
        w: &Weights,
        n_expert: usize,
        options: &ExpertOffload,
        dense: u64,
    ) -> Result<Option<Self>, CudaError> {
        let parts = part_bytes(w);
        let layer_bytes: Vec<Option<u64>> = parts
            .iter()
            .map(|p| p.map(|p| p.iter().sum::<usize>() as u64))
            .collect();
        let entry = layer_bytes.iter().flatten().copied().max().unwrap_or(0);
        let slots_bytes = slot_count(n_expert, usize::MAX) as u64 * entry;
        let Some(budget) = budget_bytes(options.budget, gpu.total_mem as u64, dense, slots_bytes) else {
            return Ok(None);
        };
        let residency = Residency::plan(&layer_bytes, n_expert, Some(budget));
        if residency.all_resident() {
            return Ok(None);
        }
        let mut placed = HashMap::new();
        for (l, layer) in w.layers.iter().enumerate() {
            let FeedForward::Experts(e) = &layer.ffn else { continue };
            for (part, set) in [&e.gate, &e.up, &e.down].into_iter().enumerate() {
                for (expert, m) in set.experts.iter().enumerate() {
                    if !residency.is_resident(l, expert) {
                        placed.insert(m.name.clone(), (l, expert, part));
                    }
                }
            }
        }
        let host = HostExperts::new(gpu, &residency, &parts)?;
        let n_slots = slot_count(n_expert, residency.non_resident());
        Ok(Some(OffloadLoad {
            residency,
            host,
            placed,
            templates: HashMap::new(),
            part_bytes: parts,
            n_slots,
        }))
    }

    /// Where matrix `name` goes, if to host memory: (layer, expert, part).
    pub fn placed(&self, name: &str) -> Option<(usize, usize, usize)> {
        self.placed.get(name).copied()
    }

    /// Keeps a non-resident expert matrix's settled bytes in host memory, and the tuning its shape
    /// took for the slots that will read it.
    pub fn keep(
        &mut self,
        gpu: &Gpu,
        (layer, expert, part): (usize, usize, usize),
        suffix: &'static str,
        tuning: Tuning,
        settled: &cudarc::driver::CudaSlice<u8>,
    ) -> Result<(), CudaError> {
        self.host.write(gpu, layer, expert, part, settled)?;
        self.templates.entry((part, suffix)).or_insert(tuning);
        Ok(())
    }

    /// The slots, their matrices in `matrices` (one per slot, part and weight type), and the ring.
    pub fn finish(
        self,
        gpu: &Gpu,
        w: &Weights,
        options: ExpertOffload,
        matrices: &mut HashMap<String, GpuMatrix>,
    ) -> Result<Offload, CudaError> {
        let mut room = [0usize; 3];
        for parts in self.part_bytes.iter().flatten() {
            for p in 0..3 {
                room[p] = room[p].max(parts[p]);
            }
        }
        let slots = SlotPool::new(gpu, self.n_slots, room)?;
        for (&(part, suffix), tuning) in &self.templates {
            for slot in 0..slots.n_slots() {
                let buffer = slots.buffer(slot, part).ok_or_else(|| CudaError::Driver {
                    what: "expert slots".into(),
                    err: format!("no slot {slot}"),
                })?;
                matrices.insert(
                    slot_matrix_name(slot, part, suffix),
                    GpuMatrix {
                        suffix,
                        quantized: WeightBytes::Shared(buffer),
                        f16: None,
                        decode: tuning.kernel,
                        decode_cublas: tuning.cublas,
                        batch: tuning.batch,
                        embed_rows: None,
                    },
                );
            }
        }
        let ring = StreamRing::new(gpu, slots.n_slots())?;
        let mixture_layers: Vec<usize> = w
            .layers
            .iter()
            .enumerate()
            .filter(|(_, l)| matches!(l.ffn, FeedForward::Experts(_)))
            .map(|(i, _)| i)
            .collect();
        Ok(Offload {
            residency: self.residency,
            host: self.host,
            slots,
            ring,
            active: RefCell::new(None),
            options,
            decode_side: Cell::new(DecodeSide::Slots),
            trial: RefCell::new(None),
            n_layers: w.layers.len(),
            first_layer: mixture_layers.first().copied().unwrap_or(0),
            last_layer: mixture_layers.last().copied().unwrap_or(0),
        })
    }
}

/// Where a decode step computes a routed expert in host memory, as settled after load
/// (`CudaModel::settle_expert_decode`, from `--expert-decode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeSide {
    /// Copied into a device slot unless one holds it, and run on the GPU.
    Slots,
    /// Run on the GPU when a slot holds it, else on the CPU.
    CpuWhenMissed,
    /// Always on the CPU.
    Cpu,
}

/// `--expert-decode auto`'s trial: decode steps alternate between the slots and the CPU for missed
/// experts, each timed from its first mixture layer to the next step's (at the synced point where the
/// layer's routing has come back), until each side has `DecodeTrial::STEPS` samples; the side with
/// the smaller median is kept.
#[derive(Debug, Default)]
pub struct DecodeTrial {
    /// Step times with the slots (0) and with missed experts on the CPU (1), the first of each
    /// thrown away (a warm-up).
    pub samples: [Vec<std::time::Duration>; 2],
    /// The step under way: when it reached its first mixture layer, its rows and its side.
    pub current: Option<(std::time::Instant, usize, usize)>,
}

impl DecodeTrial {
    /// Samples each side takes before the choice (one more is thrown away).
    pub const STEPS: usize = 8;
}

/// A model's experts beyond its budget, while it runs.
pub struct Offload {
    pub residency: Residency,
    pub host: HostExperts,
    pub slots: SlotPool,
    pub ring: StreamRing,
    /// The stream of the chunk whose pass is running, from its first mixture layer to its last.
    pub active: RefCell<Option<ActiveStream>>,
    pub options: ExpertOffload,
    pub decode_side: Cell<DecodeSide>,
    /// `auto`'s trial while it runs (`model::cpu_experts`).
    pub trial: RefCell<Option<DecodeTrial>>,
    pub n_layers: usize,
    pub first_layer: usize,
    pub last_layer: usize,
}

impl Offload {
    /// The name under which `m` (part `part` of a non-resident expert) is read while in `slot`.
    pub fn slot_matrix(
        &self,
        slot: usize,
        part: usize,
        m: &tandem_model::weights::Matrix,
    ) -> Result<tandem_model::weights::Matrix, CudaError> {
        let suffix = type_suffix(m.ty).ok_or_else(|| CudaError::UnsupportedType {
            name: m.name.clone(),
            ty: m.ty,
        })?;
        let mut in_slot = m.clone();
        in_slot.name = slot_matrix_name(slot, part, suffix);
        Ok(in_slot)
    }
}
