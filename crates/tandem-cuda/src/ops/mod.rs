//! Row kernels between the products: norms, RoPE and quantized outputs (`rows`), the gated
//! feed-forward pair (`ffn`), and a mixture's routing and combination of its experts (`moe`).

pub mod ffn;
pub mod moe;
pub mod rows;
