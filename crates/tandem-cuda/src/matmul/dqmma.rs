//! Decode batches in default mode (`kernels/dqmma.cu`; timed at load against the other routes at
//! 2-8 rows and against cuBLAS for each bucket past `routes::BATCH_TUNED_MAX_ROWS`): up to
//! `MAX_ROWS` activation rows (f16, the operand cuBLAS reads) times a Q4_K matrix, its quantized
//! weights read once for every 32 rows and dequantized to f16 in registers, the products on the f16
//! tensor cores. cuBLAS over the f16 copy reads 3.6 times the bytes. Each output's sum order depends
//! on the launch's shape (its K split), not on timing, so graph replays keep their bits; a row's bits
//! are not those it has alone (the deterministic mode never takes this route).

use cudarc::driver::{CudaSlice, PushKernelArg};

use crate::matmul::int8::{grouped_args, MmvqTarget};
use crate::matmul::kinds::DecodeKernel;
use crate::runtime::checked::driver;
use crate::runtime::device::{allow_dynamic_shared, Gpu};
use crate::runtime::grid::{i32_of, launch_cfg};
use crate::CudaError;

/// Threads of a block: four warps (`DQ_WARPS` in dqmma.cu).
const THREADS: u32 = 128;

/// Weight rows a block takes (`DQ_BLOCK_ROWS`): an m-tile of 16 a warp.
pub const BLOCK_ROWS: usize = 64;

/// Batch rows a grid row takes at most: four n-tiles of 8 (`dqmma_q4_k_n4`); more rows take further
/// grid rows (grid.z), each reading the weights again.
pub const GRID_ROW_MAX: usize = 32;

/// Batch rows the route takes at most (`routes::DQMMA_MAX_ROWS`).
pub const MAX_ROWS: usize = 64;

/// Blocks of a form a multiprocessor holds at once (registers, held to it by the launch bounds, and
/// shared memory): four of the one- and two-tile forms (125 and 123 registers a thread), three of
/// the four-tile one (168).
pub fn resident_per_sm(n_tiles: usize) -> usize {
    match n_tiles {
        4 => 3,
        _ => 4,
    }
}

/// The most blocks of any form resident on a multiprocessor (`resident_per_sm`).
const MOST_RESIDENT: usize = 4;

/// Words of one interleaved activation row of a super-block (`DQ_ROW_WORDS`).
const ROW_WORDS: usize = 148;

/// Super-blocks of weights each warp keeps in its shared stages (`DQ_W_STAGES`).
const W_STAGES: usize = 4;

/// Dynamic shared memory of a launch of `n_tiles` n-tiles: two buffers (this super-block's and the
/// next's) of its batch rows' interleaved activations, then, past one n-tile, each warp's weight
/// stages (16 rows of 144 bytes a stage; one n-tile loads its weights into registers).
pub fn shared_bytes(n_tiles: usize) -> usize {
    let stages = if n_tiles > 1 {
        (THREADS as usize / 32) * W_STAGES * 16 * 144
    } else {
        0
    };
    2 * 8 * n_tiles * ROW_WORDS * 4 + stages
}

/// Weight types with a kernel.
pub fn has_kernel(suffix: &str) -> bool {
    suffix == "q4_k"
}

/// Whether decode batches take this route where it fits (`TANDEM_CUDA_DQMMA=0`: cuBLAS instead, to
/// measure it against them).
pub fn enabled(gpu: &Gpu) -> bool {
    gpu.options.dqmma
}

/// Whether decode batches of matrices of `rows` rows (one launch) of type `suffix` whose one-row
/// kernel is `kernel` can take this route: the integer route's layout (which the kernel reads), a
/// type with a kernel, whole blocks, and the route not turned off.
pub(crate) fn takes(gpu: &Gpu, kernel: &DecodeKernel, suffix: &str, rows: &[usize], cols: usize) -> bool {
    matches!(kernel, DecodeKernel::Int8 { .. }) && has_kernel(suffix) && fits(rows, cols) && enabled(gpu)
}

/// Whether matrices of these row counts and `cols` columns fit the kernel: whole blocks of rows,
/// whole super-blocks of columns.
pub fn fits(rows: &[usize], cols: usize) -> bool {
    !rows.is_empty() && rows.iter().all(|r| *r > 0 && r.is_multiple_of(BLOCK_ROWS)) && cols.is_multiple_of(256)
}

/// The n-tiles of 8 rows a grid row takes for `t` batch rows (an instantiated kernel: 1, 2 or 4).
pub fn n_tiles(t: usize) -> usize {
    match t {
        0..=8 => 1,
        9..=16 => 2,
        _ => 4,
    }
}

/// The kernel for `t` batch rows of weights of type `suffix`.
pub fn kernel(suffix: &str, t: usize) -> String {
    format!("dqmma_{suffix}_n{}", n_tiles(t))
}

/// Every kernel the file instantiates.
#[cfg(test)]
pub fn kernels(suffix: &str) -> Vec<String> {
    [1, 9, 17].iter().map(|&t| kernel(suffix, t)).collect()
}

/// A launch's grid: row blocks, K splits, grid rows of the batch. The K split gives matrices of few
/// rows (4096 on the 8B's o and down) enough blocks to fill the GPU in one wave (a partial second
/// wave would run on a fraction of the multiprocessors: Nsight Compute's tail on 1.7 waves); each
/// split keeps at least one super-block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub blocks: usize,
    pub splits: usize,
    pub batch_rows: usize,
}

pub fn grid(total_rows: usize, cols: usize, t: usize, sm_count: usize) -> Grid {
    let blocks = total_rows / BLOCK_ROWS;
    let nsb = cols / 256;
    let wave = resident_per_sm(n_tiles(t)) * sm_count;
    let splits = (wave / blocks.max(1)).clamp(1, nsb.max(1));
    Grid {
        blocks,
        splits,
        batch_rows: t.div_ceil(8 * n_tiles(t)),
    }
}

/// Partial sums and arrival counters a K-split launch needs, shared by every launch of a model (they
/// run one after another on one stream; each launch's last blocks reset the counters they used).
pub struct DqmmaScratch {
    part: CudaSlice<f32>,
    counters: CudaSlice<u32>,
}

impl DqmmaScratch {
    /// Room for launches of up to `max_total_rows` rows and `MAX_ROWS` batch rows on this GPU.
    pub fn new(gpu: &Gpu, max_total_rows: usize) -> Result<Self, CudaError> {
        let (floats, counters) = Self::sizes(max_total_rows, gpu.sm_count as usize);
        Ok(DqmmaScratch {
            part: gpu.alloc_out::<f32>(floats)?,
            counters: gpu.alloc::<u32>(counters)?,
        })
    }

    /// Floats and counters that launches of up to `max_total_rows` rows need: partials of every split
    /// and batch row, a counter a row block and grid row. A launch splits only into as many splits as
    /// one wave of its blocks holds, so its splits times its blocks stay within the largest wave,
    /// whatever its width.
    pub fn sizes(max_total_rows: usize, sm_count: usize) -> (usize, usize) {
        let blocks = max_total_rows.div_ceil(BLOCK_ROWS).max(1);
        let batch_rows = MAX_ROWS.div_ceil(GRID_ROW_MAX);
        (MAX_ROWS * BLOCK_ROWS * MOST_RESIDENT * sm_count, blocks * batch_rows)
    }

    fn fits(&self, g: Grid, total_rows: usize, t: usize) -> bool {
        (g.splits == 1 || g.splits * t * total_rows <= self.part.len())
            && g.blocks * g.batch_rows <= self.counters.len()
    }
}

/// `out[t] = W · x16[t]` for each target (up to three matrices of type `suffix` reading the f16
/// activations `x16`: t rows of `cols`), in one launch.
pub fn dqmma_group_into(
    gpu: &Gpu,
    suffix: &str,
    targets: &mut [MmvqTarget<'_>],
    x16: &CudaSlice<u16>,
    t: usize,
    cols: usize,
    scratch: &mut DqmmaScratch,
) -> Result<(), CudaError> {
    let name = kernel(suffix, t);
    let rows: Vec<usize> = targets.iter().map(|g| g.rows).collect();
    let total: usize = rows.iter().sum();
    let g = grid(total, cols, t, gpu.sm_count as usize);
    if !has_kernel(suffix)
        || targets.is_empty()
        || targets.len() > 3
        || !fits(&rows, cols)
        || !(1..=MAX_ROWS).contains(&t)
        || x16.len() < t * cols
        || !scratch.fits(g, total, t)
    {
        return Err(CudaError::Driver {
            what: name,
            err: format!(
                "{} matrices of rows {rows:?} x {cols} for {t} rows: want 1-3 matrices of whole blocks of {BLOCK_ROWS} rows and 256 columns, 1-{MAX_ROWS} rows, an operand of {t} rows and scratch for {g:?}",
                targets.len()
            ),
        });
    }
    let f = gpu.function(&name)?;
    let (c, n) = (i32_of(cols, "cols")?, i32_of(t, "t")?);
    let ga = grouped_args(&gpu.stream, targets)?;
    let smem = shared_bytes(n_tiles(t));
    allow_dynamic_shared(&name, f, smem)?;
    let mut cfg = launch_cfg((g.blocks as u32, g.splits as u32, g.batch_rows as u32), THREADS);
    cfg.shared_mem_bytes = smem as u32;
    let mut b = gpu.launch_builder(f)?;
    b.arg(&ga.w[0]).arg(&ga.w[1]).arg(&ga.w[2]).arg(x16);
    b.arg(&ga.y[0]).arg(&ga.y[1]).arg(&ga.y[2]);
    b.arg(&ga.rows[0]).arg(&ga.rows[1]).arg(&ga.rows[2]).arg(&c).arg(&n);
    b.arg(&mut scratch.part).arg(&mut scratch.counters);
    // SAFETY: each target's weights are in the integer-route Q4_K layout of rows x cols and its output
    // holds t x rows floats; `x16` holds t rows of cols halves; the scratch holds the grid's partials
    // and counters (checked above); unused slots have zero rows.
    driver(&name, unsafe { b.launch(cfg) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routes_bound_is_the_kernels() {
        assert_eq!(crate::routes::DQMMA_MAX_ROWS, MAX_ROWS);
    }

    #[test]
    fn the_layout_matches_the_kernel_and_the_resident_blocks_fit_a_hopper_multiprocessor() {
        let body = crate::runtime::nvrtc::DQMMA.body;
        for line in [
            format!("#define DQ_ROW_WORDS {ROW_WORDS}"),
            format!("#define DQ_W_STAGES {W_STAGES}"),
            "#define DQ_W_ROW 144".to_string(),
            "#define DQ_BLOCK_ROWS (16 * DQ_WARPS)".to_string(),
            "#define DQ_WARPS 4".to_string(),
        ] {
            assert!(body.lines().any(|l| l.trim() == line), "{line} in dqmma.cu");
        }
        assert_eq!(BLOCK_ROWS, 16 * 4);
        // 228 KB a multiprocessor on the H100/H200, 1 KB of it reserved per block: the resident
        // blocks of each form fit (their registers are held to it by the launch bounds).
        for nt in [1, 2, 4] {
            assert!(
                resident_per_sm(nt) * (shared_bytes(nt) + 1024) <= 228 * 1024,
                "{nt}: {}",
                shared_bytes(nt)
            );
            let bounds = format!("DQMMA_Q4_K({nt}, {})", resident_per_sm(nt));
            assert!(body.lines().any(|l| l.trim() == bounds), "{bounds} in dqmma.cu");
        }
    }

    #[test]
    fn every_kernel_is_instantiated() {
        let names = crate::runtime::device::kernel_names(crate::runtime::nvrtc::DQMMA.body);
        assert_eq!(names, kernels("q4_k"));
    }

    #[test]
    fn batch_rows_take_the_fewest_tiles_that_hold_them() {
        assert_eq!(
            (n_tiles(8), n_tiles(9), n_tiles(16), n_tiles(17), n_tiles(64)),
            (1, 2, 2, 4, 4)
        );
        assert_eq!(grid(4096, 4096, 64, 132).batch_rows, 2);
        assert_eq!(grid(4096, 4096, 32, 132).batch_rows, 1);
        assert_eq!(grid(4096, 4096, 12, 132).batch_rows, 1);
    }

    #[test]
    fn small_matrices_split_their_columns_to_fill_the_gpu() {
        // The 8B's gate and up (one launch): 448 blocks, already most of a wave, so no split.
        assert_eq!(grid(28672, 4096, 16, 132).splits, 1);
        assert_eq!(grid(28672, 4096, 32, 132).splits, 1);
        // Its o: 64 blocks, 8 splits (two super-blocks each); its down: 64 blocks of 56
        // super-blocks, 8 splits (6 at 17-32 rows, three blocks a multiprocessor); q, k and v: 96
        // blocks, 5 splits. None past one wave.
        assert_eq!(grid(4096, 4096, 16, 132).splits, 8);
        assert_eq!(grid(4096, 14336, 16, 132).splits, 8);
        assert_eq!(grid(4096, 14336, 32, 132).splits, 6);
        assert_eq!(grid(6144, 4096, 12, 132).splits, 5);
        for (rows, cols, t) in [(28672, 4096, 16), (4096, 4096, 9), (6144, 4096, 64), (1024, 4096, 24)] {
            let g = grid(rows, cols, t, 132);
            assert!(g.splits == 1 || g.blocks * g.splits <= resident_per_sm(n_tiles(t)) * 132);
        }
        // Never more splits than super-blocks.
        assert_eq!(grid(128, 512, 16, 132).splits, 2);
    }

    #[test]
    fn the_scratch_holds_every_smaller_launch() {
        let sm = 132;
        let (floats, counters) = DqmmaScratch::sizes(28672, sm);
        assert!(floats * 4 <= 20 << 20, "{floats} floats");
        for (rows, cols) in [
            (28672, 4096),
            (4096, 4096),
            (4096, 14336),
            (6144, 4096),
            (1024, 4096),
            (128, 256),
        ] {
            for t in [9, 16, 33, 64] {
                let g = grid(rows, cols, t, sm);
                assert!(g.splits * t * rows <= floats, "{rows}x{cols} t={t}");
                assert!(g.blocks * g.batch_rows <= counters, "{rows}x{cols} t={t}");
            }
        }
    }

    #[test]
    fn only_whole_blocks_of_q4_k_fit() {
        assert!(has_kernel("q4_k") && !has_kernel("q6_k"));
        assert!(fits(&[4096, 1024], 4096));
        assert!(!fits(&[4096, 1000], 4096));
        assert!(!fits(&[4096], 4000));
        assert!(!fits(&[], 4096));
    }
}
