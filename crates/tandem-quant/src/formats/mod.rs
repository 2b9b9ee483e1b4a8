//! One module per supported ggml block format. Each exposes `BLOCK_ELEMS`, `BLOCK_BYTES`,
//! `dequantize_block` and `quantize_block`; the block functions take exactly one block and panic
//! on other lengths (the crate-level API checks lengths and returns errors instead).

pub(crate) mod common;

pub mod bf16;
pub mod f16;
pub mod f32;
pub mod q2_k;
pub mod q3_k;
pub mod q4_0;
pub mod q4_1;
pub mod q4_k;
pub mod q5_0;
pub mod q5_1;
pub mod q5_k;
pub mod q6_k;
pub mod q8_0;
pub mod q8_k;
