//! The device and what every launch stands on: the context, stream, cuBLAS handle and loaded kernels
//! (`device`), NVRTC compilation and its disk cache (`nvrtc`), launch geometry (`grid`), the float
//! launchers and cuBLAS GEMMs (`launch`), recycled buffers (`pool`), the KV byte ledger (`ledger`),
//! programmatic graph edges (`programmatic`) and the timing and tracing tools (`profile`, `trace`).

pub(crate) mod checked;
pub(crate) mod device;
pub(crate) mod grid;
pub mod launch;
pub(crate) mod ledger;
pub(crate) mod nvrtc;
pub(crate) mod pool;
pub(crate) mod profile;
pub(crate) mod programmatic;
pub(crate) mod trace;
