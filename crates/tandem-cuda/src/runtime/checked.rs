//! Every CUDA driver call's result as a `CudaError` naming what failed.

use crate::CudaError;

/// `r`, its error as `CudaError::Driver` naming `what`.
pub(crate) fn driver<T>(what: &str, r: Result<T, cudarc::driver::DriverError>) -> Result<T, CudaError> {
    r.map_err(|e| CudaError::Driver {
        what: what.into(),
        err: format!("{e:?}"),
    })
}
