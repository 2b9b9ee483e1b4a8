//! CPU compute kernels.

pub mod act_quant;
pub mod attention;
pub mod dot;
pub mod isa;
pub mod matmul;
pub mod ops;
pub mod pool;
