//! Model graphs configured from GGUF metadata, and the KV cache they attend through.
//!
//! - `config`: hyper-parameters per architecture (llama, gemma3, qwen3, qwen3moe), llama.cpp's defaults where keys are missing.
//! - `weights`: tensors checked at load and left in the memory-mapped file.
//! - `backend`: what the graph asks of a backend; `cpu`: the CPU backend.
//! - `expert_stream`: prefill's non-resident experts streamed through a ring of GPU slots, unrouted ones skipped.
//! - `graph`: the layer graph, written once for one row (decode) or many (prefill), any mix of sequences
//!   and any backend.
//! - `kv`: per-sequence f16 caches with ring placement for sliding-window layers.
//! - `logits`: a span's logits as a backend hands them over (its own vector, or memory it lends).
//! - `moe`: mixture-of-experts routing (each row's experts and weights) and the weighted sum.
//! - `serving`: what the serving engine asks of a backend (request sizing, KV budget, prefix reuse).

pub mod backend;
pub mod config;
pub mod cpu;
pub mod expert_stream;
pub mod graph;
pub mod kv;
pub mod logits;
pub mod moe;
pub mod serving;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

use tandem_backend::cpu::pool::ThreadPool;
use tandem_gguf::GgufFile;

pub use backend::{AttendRows, Backend, LogitRows, SequenceCache, Span};
pub use config::{Arch, ModelConfig, MoeConfig};
pub use cpu::{Rows, Workspace};
pub use kv::{KvPool, SequenceKv};
pub use logits::{LentLogits, Logits};
pub use serving::{ExpertTraffic, KvCheckpoint, KvSizing, ServingBackend, ServingCache};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] tandem_gguf::GgufError),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("model config: {0}")]
    Config(String),
    #[error("tensor {name:?}: {reason}")]
    Tensor { name: String, reason: String },
    #[error("kernel: {0}")]
    Kernel(String),
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    Token { id: u32, n_vocab: usize },
    #[error("context full: {len} of {n_ctx} positions used, {adding} more requested")]
    ContextFull { n_ctx: usize, len: usize, adding: usize },
    #[error("the KV cache budget of {budget_bytes} bytes is spent")]
    KvFull { budget_bytes: usize },
    #[error("KV transfer: {0}")]
    Kv(String),
}

/// A loaded model: configuration, weights (in the mapped file) and the threads its kernels run on.
pub struct Model {
    pub config: ModelConfig,
    pub weights: weights::Weights,
    pub file: GgufFile,
    pub pool: ThreadPool,
    /// Where every sequence's KV blocks come from.
    pub kv_pool: Arc<KvPool>,
    /// Rows sliding-window layers keep past their window (`kv::RING_SLACK` when serving, else 0).
    pub ring_slack: usize,
}

impl Model {
    pub fn load(path: &Path, threads: usize) -> Result<Self, ModelError> {
        let file = GgufFile::open(path)?;
        Self::from_file(file, threads)
    }

    pub fn from_file(file: GgufFile, threads: usize) -> Result<Self, ModelError> {
        let config = ModelConfig::from_gguf(&file)?;
        let weights = weights::Weights::load(&file, &config)?;
        let kv_pool = KvPool::new(config.kv_width(), None);
        Ok(Model {
            config,
            weights,
            file,
            pool: ThreadPool::new(threads.max(1)),
            kv_pool,
            ring_slack: 0,
        })
    }

    /// A fresh KV cache for one sequence of up to `n_ctx` positions.
    pub fn new_sequence(&self, n_ctx: usize) -> SequenceKv {
        SequenceKv::new(&self.config, n_ctx, self.ring_slack, &self.kv_pool)
    }

    /// The model's identity for KV exchange (`kv::wire::fingerprint`). Reads the whole file (on several
    /// threads) unless `memo_dir` remembers its digest from an earlier start (`kv::file_digest`).
    pub fn fingerprint(&self, memo_dir: Option<&std::path::Path>) -> [u8; 32] {
        let file = kv::file_digest::file_digest(self.file.bytes(), self.file.path(), memo_dir);
        kv::wire::fingerprint(&self.config, &file)
    }

    /// Caps KV memory (all sequences together) at `bytes`; takes effect for sequences made afterwards.
    pub fn set_kv_budget(&mut self, bytes: usize) {
        self.kv_pool = KvPool::new(self.config.kv_width(), Some(bytes));
    }
}
