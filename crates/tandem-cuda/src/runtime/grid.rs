//! Launch geometry shared by every launcher: a grid and block as a `LaunchConfig`, blocks for `n`
//! items, and counts checked into a kernel's `int`.

use cudarc::driver::LaunchConfig;

use crate::CudaError;

pub(crate) fn launch_cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per).max(1) as u32
}

pub(crate) fn i32_of(n: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Driver {
        what: what.into(),
        err: format!("{n} does not fit a kernel's int"),
    })
}
