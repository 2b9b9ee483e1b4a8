//! Tandem's CUDA backend: the same layer graph as the CPU (`tandem_model::graph`), run on an NVIDIA GPU.
//!
//! The modules form a one-way stack, lowest first:
//! - `options`: every `TANDEM_CUDA_*` switch, read once; `routes`: which kernel a call takes, by
//!   shape (GPU-free, unit-tested).
//! - `runtime`: the device (context, stream, cuBLAS, kernels compiled by NVRTC and cached on disk),
//!   launch geometry and the float launchers, buffer pools, the KV byte ledger, profiling and tracing.
//! - `matmul`: the integer decode route, tensor-core decode batches (`qmma`, `dqmma`), the load-time
//!   timing that picks each shape's kernel and route, and the weights on the device.
//! - `attention`: the tile kernel and its KV store, batched decode rows, flash attention for prefill;
//!   `ops`: norms, RoPE and gating.
//! - `cache`: what the model keeps between passes: per-sequence KV caches, the decode-graph cache's
//!   types, page-locked logits.
//! - `model`: `CudaModel`, its `Backend` and `ServingBackend`, its loading, and its side of every op
//!   (in the pass's mode: launched, captured into a decode graph, or dry).
//! - `lab`: the developer surface, outside the stack: the launchers the kernel tests and
//!   `tandem-dev` reach (re-exported from the modules above), and the GPU probes (`handover`,
//!   `latency`).
//!
//! The CUDA libraries are loaded at run time (`cudarc` with dynamic loading), so this crate builds and
//! its GPU-free parts test on machines with no CUDA at all; on such a machine `Gpu::new` returns
//! `CudaError::Unavailable` with the reason.

pub(crate) mod attention;
pub(crate) mod cache;
#[cfg(test)]
mod kernel_tables;
#[doc(hidden)]
pub mod lab;
pub(crate) mod matmul;
pub(crate) mod model;
pub(crate) mod offload;
pub(crate) mod ops;
pub(crate) mod options;
pub(crate) mod routes;
pub(crate) mod runtime;

pub use cache::graphs::GraphCache;
pub use cache::kv::GpuSequenceKv;
pub use cudarc::driver::CudaSlice;
pub use matmul::weights::{DeviceWeights, GpuMemory};
pub use model::CudaModel;
pub use offload::slots::ExpertCounters;
pub use options::{CudaOptions, ExpertBudget, ExpertDecode, ExpertOffload, LabOptions};
pub use runtime::device::Gpu;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No driver, no GPU, or no NVRTC: the machine cannot run the CUDA backend.
    #[error("CUDA unavailable: {0}")]
    Unavailable(String),
    #[error("NVRTC could not compile {file}:\n{log}")]
    Compile { file: String, log: String },
    #[error("CUDA driver call failed ({what}): {err}")]
    Driver { what: String, err: String },
    #[error("cuBLAS call failed ({what}): {err}")]
    Blas { what: String, err: String },
    #[error("head_dim {0} has no CUDA attention kernel (a power of two from 32 to 256)")]
    UnsupportedHeadDim(usize),
    #[error("{0} has no CUDA path yet: run it with --device cpu")]
    UnsupportedModel(String),
    #[error("weight {name}: type {ty} has no CUDA kernel")]
    UnsupportedType { name: String, ty: tandem_gguf::GgmlType },
    #[error("the KV cache budget of {budget_bytes} bytes has {in_use} in use, no room for {need} more")]
    KvFull {
        budget_bytes: usize,
        in_use: usize,
        need: usize,
    },
}

impl From<CudaError> for tandem_model::ModelError {
    fn from(e: CudaError) -> Self {
        match e {
            // A spent budget keeps its kind, as the CPU pool reports it.
            CudaError::KvFull { budget_bytes, .. } => tandem_model::ModelError::KvFull { budget_bytes },
            e => tandem_model::ModelError::Kernel(e.to_string()),
        }
    }
}
