//! The CUDA implementation of the layer graph's `Backend`: weights uploaded once by `upload.rs`
//! (quantized for the matvec route, plus an f16 copy for the GEMM route unless deterministic),
//! activations as f32 device buffers from a pool, KV in `GpuSequenceKv`. Decode steps replay a captured
//! CUDA graph (`decode_graph.rs`), so every op here runs in one of three modes (`Mode`). The heavier ops
//! live beside this file: matmuls in `matmul.rs`, row kernels (norms, RoPE, gating) in `rows.rs`,
//! attention in `attend.rs` (tile route) and `flash.rs` (prefill tensor-core route), a mixture's
//! experts in `experts.rs`.

mod attend;
mod attend_rows;
mod backend;
mod cpu_experts;
mod decode_graph;
mod experts;
mod ffn;
mod flash;
mod host_logits;
mod load;
mod matmul;
mod offload;
mod project;
mod rows;
mod serving;

use std::cell::{Cell, RefCell};
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaView};
use tandem_model::weights::{Matrix, Norm};
use tandem_model::{Model, ModelError};

use crate::cache::graphs::GraphCache;
use crate::cache::host_logits::PinnedLogits;
use crate::cache::kv::GpuSequenceKv;
use crate::matmul::kinds::ActQuant;
use crate::matmul::weights::{DeviceWeights, GpuMatrix};
use crate::offload::slots::ExpertCounters;
use crate::offload::Offload;
use crate::routes::RouteSettings;
use crate::runtime::device::Gpu;
use crate::runtime::grid::i32_of;
use crate::runtime::pool::{BufPool, DevBuf};
use crate::runtime::profile::Diagnostics;
use crate::CudaError;

/// Activations on the device: `rows × width` f32, row-major. `buf` is `None` only in a dry run.
pub struct GpuAct {
    pub buf: Option<DevBuf<f32>>,
    pub rows: usize,
    pub width: usize,
    /// These rows quantized for the integer route, made by the first matmul that needs them and
    /// reused by the others reading the same input (q, k and v; gate and up). Cleared on any write.
    pub(crate) int8: RefCell<Vec<(ActQuant, DevBuf<u8>)>>,
    /// These rows rounded to f16 for the GEMM route, made by the first GEMM reading them and reused by
    /// the others (q, k and v; gate and up). Cleared on any write.
    pub(crate) f16: RefCell<Option<DevBuf<u16>>>,
}

impl GpuAct {
    /// Rows kept only as their GEMM readers' f16 operand `h` (no f32 rows): what a kernel makes when
    /// every reader of its output takes the GEMM route.
    pub(crate) fn f16_only(rows: usize, width: usize, h: DevBuf<u16>) -> Self {
        GpuAct {
            buf: None,
            rows,
            width,
            int8: RefCell::new(Vec::new()),
            f16: RefCell::new(Some(h)),
        }
    }

    pub fn buf(&self) -> Result<&CudaSlice<f32>, CudaError> {
        self.buf.as_deref().ok_or_else(dry_buffer)
    }

    pub(crate) fn buf_mut(&mut self) -> Result<&mut CudaSlice<f32>, CudaError> {
        self.int8.get_mut().clear();
        self.f16.get_mut().take();
        self.buf.as_deref_mut().ok_or_else(dry_buffer)
    }
}

fn dry_buffer() -> CudaError {
    CudaError::Driver {
        what: "activation".into(),
        err: "no f32 rows (a dry run, or rows kept only as their GEMM reader's f16 operand)".into(),
    }
}

/// Scratch of the CUDA backend: buffers live in the model's pools, so nothing is kept here.
#[derive(Default)]
pub struct GpuScratch;

/// How the ops of a forward pass execute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Launch kernels now; index lists are uploaded as they are made.
    Normal,
    /// Record kernels into a CUDA graph; index lists go to the parameter arena (uploaded before the
    /// graph first runs), and no memory may be allocated.
    Capture,
    /// Run only the host side (placement updates, index lists into the arena) for a graph replay.
    Dry,
}

/// An index list on the device: its own upload, or a span of the parameter arena.
pub(crate) enum Param {
    Own(Rc<CudaSlice<i32>>),
    Arena(Range<usize>),
}

/// An index list and its device copy.
type Uploaded = (Vec<i32>, Rc<CudaSlice<i32>>);

/// The CUDA backend's model: the CPU model it mirrors, the device, and a few owned parts, each
/// declared beside the code that owns its concern.
pub struct CudaModel {
    /// The model as loaded for the CPU: config, weights and file (the GPU's oracle in checks).
    pub cpu: Model,
    pub gpu: Gpu,
    /// Route settings fixed at load: deterministic matmuls, the stacked q/k/v GEMM's reach, the
    /// fused q/k/v store (`routes.rs`).
    pub routes: RouteSettings,
    /// The weights on the device, each matrix with the kernels its timing chose, and their memory
    /// (`matmul/weights.rs`).
    pub weights: DeviceWeights,
    /// The pass's mode and its index lists: uploads, flash plans, the parameter arena and staging.
    pub(crate) pass: PassState,
    /// The decode-graph cache, the dry pass made ahead, and their switches and counters
    /// (`cache/graphs.rs`). Declared before `buffers`, so the graphs are dropped before the buffers
    /// their kernels read (as before the grouping, the pools aside).
    pub graphs: GraphCache,
    /// Scratch on the device: activation pools, attention arrival counters, the dequantizing batch
    /// kernel's partials, page-locked logits.
    pub(crate) buffers: Buffers,
    /// Profiling, pass clocks, the profiler's replay window, kernels left out (`runtime/profile.rs`).
    pub(crate) diagnostics: Diagnostics,
    /// A mixture's experts beyond `--gpu-expert-budget`: host memory, slots, the chunk's stream
    /// (`offload`). Declared last: its slots outlive the graphs and matrices that read them.
    pub(crate) offload: Option<Offload>,
}

/// The pass's mode and the index lists its kernels read (`param`, `flash.rs`).
pub(crate) struct PassState {
    pub(crate) uploads: RefCell<Vec<Uploaded>>,
    /// This pass's flash-attention plans, one per span, window, key range and variant (`flash.rs`).
    pub(crate) plans: RefCell<Vec<(crate::attention::flash::PlanKey, Rc<CudaSlice<i32>>)>>,
    pub(crate) mode: Cell<Mode>,
    pub(crate) arena: CudaSlice<i32>,
    pub(crate) staging: RefCell<Vec<i32>>,
    /// Where the last dry or captured pass staged its token ids in the parameter arena.
    pub(crate) token_slot: Cell<Option<usize>>,
}

/// Scratch buffers on the device, shared by the ops of a pass.
pub(crate) struct Buffers {
    pub(crate) f32_pool: Rc<BufPool<f32>>,
    pub(crate) u16_pool: Rc<BufPool<u16>>,
    pub(crate) u8_pool: Rc<BufPool<u8>>,
    /// Expert ids of a mixture's routing (`experts.rs`).
    pub(crate) i32_pool: Rc<BufPool<i32>>,
    /// The attention kernel's arrival counters per (query, head) (`attend.rs`).
    pub(crate) arrivals: RefCell<CudaSlice<i32>>,
    /// Counters outgrown by `arrivals`, kept for the graphs captured with them.
    pub(crate) retired_arrivals: RefCell<Vec<CudaSlice<i32>>>,
    /// The dequantizing batch kernel's K-split partials and arrival counters (`dqmma.rs`), shared by
    /// its launches (one stream, one after another).
    pub(crate) dqmma_scratch: RefCell<crate::matmul::dqmma::DqmmaScratch>,
    /// Page-locked buffers the decode graphs' and batched steps' logits are copied into and lent
    /// out from.
    pub(crate) pinned_logits: Arc<PinnedLogits>,
}

impl Drop for CudaModel {
    fn drop(&mut self) {
        if let Some(p) = &self.diagnostics.profile {
            eprint!("{}", p.report());
        }
        match self.gpu.write_trace() {
            Some(Ok((path, n))) => eprintln!("gpu: kernel trace of {n} launches written to {}", path.display()),
            Some(Err(e)) => eprintln!("gpu: kernel trace not written: {e}"),
            None => {}
        }
    }
}

/// Index slots in the parameter arena: far more than a decode step's few per layer, or a batched
/// step's ten a row and layer (`decode_graph::MAX_BATCH_ROWS` rows of an 80-layer model stage about
/// 51,000).
pub(crate) const ARENA_INTS: usize = 1 << 18;

/// Appends `ints` to a graph's staged parameters from a multiple of `align` slots on (the slots
/// skipped are zero, the same every step); returns where they lie in the arena.
fn stage(staging: &mut Vec<i32>, ints: Vec<i32>, align: usize) -> Result<Range<usize>, CudaError> {
    let start = staging.len().next_multiple_of(align);
    if start + ints.len() > ARENA_INTS {
        return Err(CudaError::Driver {
            what: "graph parameters".into(),
            err: format!("more than {ARENA_INTS} index slots"),
        });
    }
    staging.resize(start, 0);
    staging.extend(ints);
    Ok(start..staging.len())
}

impl CudaModel {
    /// A fresh device KV cache for one sequence of up to `n_ctx` positions.
    pub fn new_sequence(&self, n_ctx: usize) -> Result<GpuSequenceKv, CudaError> {
        GpuSequenceKv::new(&self.gpu, &self.cpu.config, n_ctx, self.cpu.ring_slack)
    }

    pub(crate) fn dry(&self) -> bool {
        self.pass.mode.get() == Mode::Dry
    }

    /// Each distinct decode-route choice made at load: `rows×cols type: kernel` (integer variants by
    /// label; a group's members show the group launch's variant), sorted; for `--verbose`.
    /// The expert traffic of a model with experts in host memory (`None` when all are resident).
    pub fn expert_counters(&self) -> Option<ExpertCounters> {
        self.offload.as_ref().map(|o| o.slots.counters.get())
    }

    pub fn decode_choices(&self) -> Vec<String> {
        let mut seen = std::collections::BTreeSet::new();
        for m in self.cpu.weights.matrices() {
            let Some(g) = self.weights.matrices.get(&m.name) else {
                continue;
            };
            let kernel = match g.decode {
                crate::matmul::kinds::DecodeKernel::Float(family) => format!("{family:?}"),
                crate::matmul::kinds::DecodeKernel::Int8 { variant, .. } => format!("int8 {}", variant.label()),
            };
            let cublas = if g.decode_cublas {
                ", cuBLAS timed faster for one row"
            } else {
                ""
            };
            let batches = match self.routes.deterministic {
                true => String::new(),
                false => format!("; batches: {}", g.batch.describe()),
            };
            seen.insert(format!("{}x{} {}: {kernel}{cublas}{batches}", m.rows, m.cols, g.suffix));
        }
        seen.into_iter().collect()
    }

    /// Whether `kernel` is left out (`Diagnostics::skipped_kernels`); a skipped launch leaves its outputs unwritten.
    pub(crate) fn skips(&self, kernel: &str) -> bool {
        self.diagnostics.skipped_kernels.iter().any(|k| k == kernel)
    }

    pub(crate) fn matrix(&self, m: &Matrix) -> Result<&GpuMatrix, CudaError> {
        self.weights.matrices.get(&m.name).ok_or_else(|| CudaError::Driver {
            what: format!("matrix {}", m.name),
            err: "not uploaded".into(),
        })
    }

    pub(crate) fn norm(&self, n: &Norm) -> Result<&CudaSlice<f32>, ModelError> {
        self.weights
            .norms
            .get(&n.name)
            .ok_or_else(|| ModelError::Kernel(format!("norm {} not uploaded", n.name)))
    }

    /// An output activation: from the pool, or none at all in a dry run.
    pub(crate) fn act(&self, rows: usize, width: usize) -> Result<GpuAct, CudaError> {
        let buf = match self.pass.mode.get() {
            Mode::Dry => None,
            mode => Some(
                self.buffers
                    .f32_pool
                    .take(&self.gpu, rows * width, mode == Mode::Normal)?,
            ),
        };
        Ok(GpuAct {
            buf,
            rows,
            width,
            int8: RefCell::new(Vec::new()),
            f16: RefCell::new(None),
        })
    }

    /// Index lists (positions, cache rows, placement) for kernels. Launched now: uploaded, each distinct
    /// list once per pass. Captured or replayed: appended to the arena, in the same order every step.
    pub(crate) fn param(&self, v: &[usize], what: &str) -> Result<Param, CudaError> {
        let ints: Vec<i32> = v.iter().map(|&x| i32_of(x, what)).collect::<Result<_, _>>()?;
        self.param_ints(ints)
    }

    pub(crate) fn param_ints(&self, ints: Vec<i32>) -> Result<Param, CudaError> {
        self.param_aligned(ints, 1)
    }

    /// Device addresses split into pairs of ints (low, high), which kernels read as 8-byte pointers:
    /// in the arena they start at an even slot (an upload of their own is aligned anyway).
    pub(crate) fn param_addresses(&self, ints: Vec<i32>) -> Result<Param, CudaError> {
        self.param_aligned(ints, 2)
    }

    /// `param_ints`, the list starting at a multiple of `align` slots in the arena (the slots
    /// skipped are zero, the same every step).
    fn param_aligned(&self, ints: Vec<i32>, align: usize) -> Result<Param, CudaError> {
        if self.pass.mode.get() != Mode::Normal {
            return stage(&mut self.pass.staging.borrow_mut(), ints, align).map(Param::Arena);
        }
        let mut memo = self.pass.uploads.borrow_mut();
        if let Some((_, dev)) = memo.iter().find(|(h, _)| *h == ints) {
            return Ok(Param::Own(Rc::clone(dev)));
        }
        let dev = Rc::new(self.gpu.upload(&ints)?);
        memo.push((ints, Rc::clone(&dev)));
        Ok(Param::Own(dev))
    }

    pub(crate) fn view<'a>(&'a self, p: &'a Param) -> CudaView<'a, i32> {
        match p {
            Param::Own(s) => s.as_view(),
            Param::Arena(r) => self.pass.arena.slice(r.clone()),
        }
    }

    /// Runs `f` (which enqueues op `name`), timed when profiling.
    /// The name is only formatted when profiling, so the hot path does not allocate for it.
    pub(crate) fn profiled<T, E: From<CudaError>>(
        &self,
        name: impl std::fmt::Display,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        match &self.diagnostics.profile {
            Some(p) if self.pass.mode.get() == Mode::Normal => p.time(&self.gpu, name.to_string(), f),
            _ => f(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_addresses_start_at_an_even_slot_and_the_arena_bounds_every_list() {
        let mut staging = vec![7];
        assert_eq!(stage(&mut staging, vec![1, 2, 3], 1).unwrap(), 1..4);
        // Four ints so far: an address pair starts right after them; after five, one slot later.
        assert_eq!(stage(&mut staging, vec![10, 11], 2).unwrap(), 4..6);
        assert_eq!(stage(&mut staging, vec![5], 1).unwrap(), 6..7);
        assert_eq!(stage(&mut staging, vec![20, 21, 22, 23], 2).unwrap(), 8..12);
        assert_eq!(staging, vec![7, 1, 2, 3, 10, 11, 5, 0, 20, 21, 22, 23]);
        let mut full = vec![0; ARENA_INTS - 1];
        assert!(stage(&mut full, vec![1], 1).is_ok());
        assert!(stage(&mut full, vec![1], 1).is_err());
        assert_eq!(full.len(), ARENA_INTS, "a refused list stages nothing");
    }
}
