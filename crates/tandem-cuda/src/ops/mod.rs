//! Row kernels between the products: norms, RoPE and quantized outputs (`rows`), and the gated
//! feed-forward pair (`ffn`).

pub mod ffn;
pub mod rows;
