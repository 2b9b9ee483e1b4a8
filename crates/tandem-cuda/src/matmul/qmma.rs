//! Decode batches on the tensor cores in default mode (`kernels/qmma.cu`): 2 to
//! `routes::BATCH_TUNED_MAX_ROWS` activation rows times a Q4_K matrix, the quantized weights read once
//! for all rows. The route (`routes::matmul_route`) sends such batches here instead of the
//! batched `dp4a` matvec (whose work grows with each row) or cuBLAS over the f16 copy (four times the
//! bytes). Each output has one float sum per super-block, so a row's bits depend on the kernel's
//! tiles, not on the matvec's lanes: the deterministic mode never takes this route.

use cudarc::driver::CudaSlice;

use crate::matmul::int8::{launch_grouped, MmvqTarget};
use crate::matmul::kinds::DecodeKernel;
use crate::runtime::device::Gpu;
use crate::runtime::grid::launch_cfg;
use crate::CudaError;

/// Threads of a block: four warps splitting a row group's super-blocks (`QMMA_WARPS` in qmma.cu).
const THREADS: u32 = 128;

/// Weight rows a block takes: one m-tile of the mma.
pub const GROUP_ROWS: usize = 16;

/// Batch rows a launch takes: one tile of the mma's n (`routes::BATCH_TUNED_MAX_ROWS`).
pub const MAX_ROWS: usize = 8;

/// Weight types with a kernel (Q6_K's ran slower than the batched matvec and cuBLAS: qmma.cu).
pub fn has_kernel(suffix: &str) -> bool {
    suffix == "q4_k"
}

/// Whether decode batches take this route where it fits (`TANDEM_CUDA_QMMA=0`: the batched matvec
/// and cuBLAS instead, to measure it against them).
pub fn enabled(gpu: &Gpu) -> bool {
    gpu.options.qmma
}

/// Whether decode batches of a matrix of `rows` rows of type `suffix` whose one-row kernel is
/// `kernel` can take this route (up to `routes::BATCH_TUNED_MAX_ROWS` rows): the integer route's layout, a
/// type with a kernel, whole groups of rows, and the route not turned off.
pub(crate) fn takes(gpu: &Gpu, kernel: &DecodeKernel, suffix: &str, rows: usize) -> bool {
    matches!(kernel, DecodeKernel::Int8 { .. }) && has_kernel(suffix) && fits(&[rows]) && enabled(gpu)
}

/// Whether matrices of these row counts fit the kernel (whole groups of `GROUP_ROWS`).
pub fn fits(rows: &[usize]) -> bool {
    rows.iter().all(|r| r.is_multiple_of(GROUP_ROWS))
}

/// The kernel for weights of type `suffix` (one batch tile: `qmma_<type>_b1`).
pub fn kernel(suffix: &str) -> String {
    format!("qmma_{suffix}_b1")
}

/// `out[t] = W · x[t]` for each target (up to three matrices of type `suffix` reading the quantized
/// activations `a`: t rows of `cols`), in one launch.
pub fn qmma_group_into(
    gpu: &Gpu,
    suffix: &str,
    targets: &mut [MmvqTarget<'_>],
    a: &CudaSlice<u8>,
    t: usize,
    cols: usize,
) -> Result<(), CudaError> {
    let name = kernel(suffix);
    let rows: Vec<usize> = targets.iter().map(|g| g.rows).collect();
    if !has_kernel(suffix)
        || targets.is_empty()
        || targets.len() > 3
        || !fits(&rows)
        || !cols.is_multiple_of(256)
        || !(1..=MAX_ROWS).contains(&t)
    {
        return Err(CudaError::Driver {
            what: name,
            err: format!(
                "{} matrices of rows {rows:?} x {cols} for {t} rows: want 1-3 matrices of whole groups of {GROUP_ROWS} rows and 256 columns, 1-{MAX_ROWS} rows",
                targets.len()
            ),
        });
    }
    let total: usize = rows.iter().sum();
    let cfg = launch_cfg(((total / GROUP_ROWS) as u32, 1, 1), THREADS);
    launch_grouped(gpu, &name, cfg, targets, a, t, cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_sends_no_more_rows_than_one_launch_takes() {
        assert_eq!(crate::routes::BATCH_TUNED_MAX_ROWS, MAX_ROWS);
    }

    #[test]
    fn only_whole_groups_of_sixteen_rows_of_q4_k_have_a_kernel() {
        assert!(has_kernel("q4_k"));
        assert!(!has_kernel("q6_k") && !has_kernel("q8_0") && !has_kernel("q5_k") && !has_kernel("f16"));
        assert!(fits(&[4096, 1024, 16]));
        assert!(!fits(&[4096, 1032]));
    }

    #[test]
    fn every_kernel_is_instantiated() {
        let names = crate::runtime::device::kernel_names(crate::runtime::nvrtc::QMMA.body);
        assert_eq!(names, vec![kernel("q4_k")]);
    }
}
