//! The small types every matmul route shares: how activations are quantized, the integer kernel's
//! variants, the float matvec families, and the decode kernel a matrix takes. GPU-free; the route
//! choices (`routes`) and the launchers above them read these.

use crate::runtime::grid::blocks;

/// How activation rows are quantized for the integer kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActQuant {
    /// 256-element blocks, f32 scale, sums of each 16 quants (for K-quant weights).
    Q8K,
    /// 32-element blocks, scale rounded to f16 (for Q8_0 weights).
    Q8,
}

impl ActQuant {
    pub fn block(self) -> usize {
        match self {
            ActQuant::Q8K => 256,
            ActQuant::Q8 => 32,
        }
    }

    /// Bytes of `t` quantized rows of `cols`: quants, then (Q8_K) sums of 16, then block scales.
    pub fn bytes(self, t: usize, cols: usize) -> usize {
        let sums = match self {
            ActQuant::Q8K => t * (cols / 16) * 4,
            ActQuant::Q8 => 0,
        };
        t * cols + t * (cols / self.block()) * 4 + sums
    }
}

/// Shared-memory bytes of a staged kernel's copy of one Q8_K activation row of `cols` (`stage_q8k`:
/// quants in whole groups of eight super-blocks, sums of 16, block scales).
pub fn staged_bytes(cols: usize) -> usize {
    let nsb = cols / 256;
    nsb.div_ceil(8) * 2048 + nsb * 64 + nsb * 4
}

/// The most shared memory a staged launch takes without opting in to more per kernel.
pub(crate) const STAGED_MAX_BYTES: usize = 48 * 1024;

/// One of the integer kernels of a weight type: `unroll` steps of loads a lane issues before it
/// computes, `rows` consecutive weight rows per group (sharing the activation loads), `split` warps
/// per group (1, or 4 splitting a row's blocks). Variants of one `split` give the same bits; `split`
/// sets the order of a row's sums, and a matrix keeps one variant for every row count. The load-time
/// timing keeps the fastest per shape.
///
/// `staged` (K-quants, split 1): a one-row product copies the activation row into shared memory
/// once per block, in an order where each load instruction of a warp reads consecutive bytes, and
/// runs a grid of the blocks that fit on the GPU at once, each warp looping over row groups. Its
/// batched launches take the unstaged kernel of the same unroll and rows; the sums are the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmvqVariant {
    pub unroll: u32,
    pub rows: u32,
    pub split: u32,
    pub staged: bool,
}

impl MmvqVariant {
    pub fn kernel(self, suffix: &str, batched: bool) -> String {
        let kind = match (batched, self.staged) {
            (true, _) => "b",
            (false, true) => "p",
            (false, false) => "",
        };
        format!("mmvq{kind}_{suffix}_u{}_r{}_s{}", self.unroll, self.rows, self.split)
    }

    /// The routed experts' kernel of this unroll, rows and split (`matmul::indexed`): the unstaged
    /// one-row sums, so a staged variant's too.
    pub fn ids_kernel(self, suffix: &str) -> String {
        format!("mmvq_ids_{suffix}_u{}_r{}_s{}", self.unroll, self.rows, self.split)
    }

    /// The staged batch kernel of this unroll and rows for batches of up to `nb` rows (`staged_batch`).
    pub fn staged_batch_kernel(self, suffix: &str, nb: usize) -> String {
        format!("mmvqpb{nb}_{suffix}_u{}_r{}_s1", self.unroll, self.rows)
    }

    /// A short name for tables: `u2r1s1`, with `p` for staged.
    pub fn label(self) -> String {
        let p = if self.staged { "p" } else { "" };
        format!("u{}r{}s{}{p}", self.unroll, self.rows, self.split)
    }

    /// Thread blocks (of four warps) for `rows` weight rows, unstaged.
    pub fn blocks(self, rows: usize) -> u32 {
        let groups = rows / self.rows as usize;
        if self.split == 1 {
            blocks(groups, 4)
        } else {
            groups.max(1) as u32
        }
    }

    /// Whether it can take matrices of these row counts (whole groups of `rows`) and width.
    pub fn fits(self, rows: &[usize], cols: usize) -> bool {
        rows.iter().all(|r| r.is_multiple_of(self.rows as usize))
            && (!self.staged || staged_bytes(cols) <= STAGED_MAX_BYTES)
    }
}

/// The three float matvec kernel families (`kernels/quant.cu`): same function, different summation
/// orders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatvecFamily {
    /// A block per row; warps take 1024-element segments staged in shared memory.
    Segmented,
    /// A warp per row; lanes read their units straight from global memory.
    WarpPerRow,
    /// A warp per row; lane l takes element l of every unit (coalesced loads for every layout).
    Lanewise,
}

impl MatvecFamily {
    pub fn prefix(self, batched: bool) -> &'static str {
        match (self, batched) {
            (MatvecFamily::Segmented, false) => "matvec_",
            (MatvecFamily::Segmented, true) => "matvecb_",
            (MatvecFamily::WarpPerRow, false) => "matvec2_",
            (MatvecFamily::WarpPerRow, true) => "matvec2b_",
            (MatvecFamily::Lanewise, false) => "matvec3_",
            (MatvecFamily::Lanewise, true) => "matvec3b_",
        }
    }
}

/// The kernel that takes a matrix's matvec route (decode and very short chunks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeKernel {
    /// A float matvec family over the ggml layout.
    Float(MatvecFamily),
    /// The integer (`dp4a`) kernel `variant` over the integer-route layout, activations quantized as
    /// `fmt`.
    Int8 { fmt: ActQuant, variant: MmvqVariant },
}
