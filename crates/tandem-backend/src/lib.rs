//! Tandem's compute backend. For now: CPU matrix multiplication over ggml-quantized weights
//! ([`cpu::matmul`]) and the thread pool it runs on ([`cpu::pool::ThreadPool`]).
//!
//! Results are deterministic: every output element is bit-identical whatever the batch size,
//! thread count, code path or CPU instruction-set level (scalar, AVX2, AVX-512) that computed it.

pub mod cpu;

pub use cpu::dot::{Isa, WeightClass};
pub use cpu::matmul::{matmul, matmul_with, Scratch, WeightMatrix};
pub use cpu::pool::ThreadPool;
pub use tandem_gguf::GgmlType;

/// Why a kernel call was refused. Kernels validate sizes and never panic on bad ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error("weight type {0} has no CPU matmul kernel")]
    UnsupportedType(GgmlType),
    #[error("{ty}: {cols} columns is not a whole number of {block}-element blocks")]
    NotWholeBlocks { ty: GgmlType, cols: usize, block: usize },
    #[error("{ty} weights: expected {expected} bytes for {rows} rows of {cols} columns, got {got}")]
    WeightSize {
        ty: GgmlType,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("input: expected {expected} values for {t} rows of {cols} columns, got {got}")]
    InputSize {
        t: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("output: expected {expected} values for {t} rows of {rows} outputs, got {got}")]
    OutputSize {
        t: usize,
        rows: usize,
        expected: usize,
        got: usize,
    },
    #[error("quantized activation row does not match {cols} columns")]
    ActivationRow { cols: usize },
    #[error("matrix size overflows usize")]
    Overflow,
}
