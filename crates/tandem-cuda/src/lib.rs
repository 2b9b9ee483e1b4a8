//! Tandem's CUDA backend: the same layer graph as the CPU (`tandem_model::graph`), run on an NVIDIA GPU.
//!
//! - `nvrtc`: kernel sources (`kernels/*.cu`), compiled at run time for the detected architecture and
//!   cached on disk by source hash and arch.
//! - `device`: the context, stream, cuBLAS handle and loaded kernels; every CUDA call is checked.
//! - `routes`: which kernel a call takes, by shape (GPU-free, unit-tested); `flash`: prefill
//!   attention on the tensor cores, scores kept on chip, and its per-chunk tile plan.
//! - `kv`: per-sequence f16 caches on the device under the CPU's `RingPlacement` metadata, their
//!   checkpoints and byte ledger, and the serving engine's `ServingBackend` for `CudaModel`.
//! - `launch`: kernel launchers (matvec families, dequantization, cuBLAS GEMM); `tune`: the
//!   load-time timing that picks each shape's decode kernel and each decode batch size's route;
//!   `int8`: the integer decode route (int8 activations, `dp4a` matvecs); `qmma`: decode batches on
//!   the tensor cores, the quantized weights read once for every row.
//! - `model`: the `Backend` implementation; `rows`: norms, RoPE and gating; `attend`: KV store and
//!   the tile attention kernel (RoPE fused into the store for decode steps); `ffn`: gate and up side
//!   by side in f16 on the GEMM route; `upload`: weights onto the device and the decode kernel
//!   chosen per shape; `pool`: recycled device buffers;
//!   `decode_graph`: decode steps captured once as CUDA graphs and replayed; `programmatic`: their
//!   kernel-to-kernel edges made programmatic while capturing (sm_90+), so launches overlap.
//!
//! The CUDA libraries are loaded at run time (`cudarc` with dynamic loading), so this crate builds and
//! its GPU-free parts test on machines with no CUDA at all; on such a machine `Gpu::new` returns
//! `CudaError::Unavailable` with the reason.

pub mod attend;
pub mod attend_rows;
mod decode_graph;
pub mod device;
pub mod dqmma;
pub mod ffn;
pub mod flash;
pub mod handover;
mod host_logits;
pub mod int8;
pub mod kv;
pub mod latency;
pub mod launch;
mod matmul;
pub mod model;
pub mod nvrtc;
pub mod options;
pub mod pool;
mod profile;
mod programmatic;
mod project;
pub mod qmma;
pub mod routes;
pub mod rows;
mod trace;
pub mod tune;
mod upload;

pub use cudarc::driver::CudaSlice;
pub use device::Gpu;
pub use kv::GpuSequenceKv;
pub use model::CudaModel;
pub use options::{CudaOptions, LabOptions};
pub use upload::GpuMemory;

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
