//! Microbenchmarks for `gpu-check`: memory latency (`latency`) and kernel-to-kernel handover
//! (`handover`).

pub mod handover;
pub mod latency;
