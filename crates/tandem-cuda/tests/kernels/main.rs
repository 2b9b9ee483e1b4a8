//! The CUDA kernels against f64 references on the host and against each other, on random inputs: each
//! test opens GPU 0, prints its rows (`--nocapture` shows them) and fails on any row that fails. On a
//! machine without a GPU they say so and pass. Each prints its seed; `TANDEM_KERNEL_SEED=N` runs a
//! failed test's inputs again.
//!
//! `cargo test --release -p tandem-cuda --test kernels -- --nocapture` on a GPU machine.

mod common;
mod decode_rows;
mod dqmma;
mod flash;
mod gemm;
mod int8;
mod matvec;
mod moe;
mod qmma;
mod rows;
mod split_rope;
mod tiles;
