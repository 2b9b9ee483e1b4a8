//! `out = x · Wᵀ` for a weight matrix in any supported ggml type.
//!
//! The activation rows are quantized once per call (Q8 or Q8_K, into a reusable [`Scratch`]),
//! then one of two routes runs:
//!
//! * **Row route** (one activation row, i.e. decode; or small batches; or no GEMM kernel for the
//!   type/ISA): the weight rows are split across threads in chunks, and each weight row is
//!   streamed once through the row kernels of `dot`, four rows per call where a 4-row kernel
//!   exists. The four rows of a call come from the four quarters of the chunk, so the weights
//!   are read as four long sequential streams (see `dot_rows`). With several activation rows,
//!   chunks are small enough to stay in L2 while every activation row passes over them (float
//!   weights then go through 4 × 4 register tiles of weight rows × activation rows at AVX-512, and
//!   legacy types and K-quants at AVX2 and AVX-512 take activation rows four, three or two at a
//!   time, each decoded weight block serving them all: `dot_rows_batch`).
//! * **GEMM route** (AVX-512 VNNI or AVX2, quantized weights but Q8_0 at AVX2, `t >=
//!   GEMM_MIN_T_*`): tasks are (chunk of weight rows) × (span of activation groups); a task
//!   decodes its weight rows once and runs the register-tiled microkernels of `dot::gemm_avx512` or
//!   `dot::gemm_avx2` over them (each decoded weight byte is reused for `NR·16` or `NR·8` activation
//!   rows straight from registers).
//!
//! Exactness: every route and every ISA level computes an output element with the same float
//! operations in the same order (`dot::avx512` documents the canonical order), so `out[r][j]` is
//! bit-identical whatever `t`, the thread count, the route, where row `r` falls in a tile, or the
//! CPU's instruction set.

use std::cell::RefCell;

use tandem_gguf::GgmlType;

#[cfg(target_arch = "x86_64")]
use super::act_quant::AVec;
use super::act_quant::QuantizedActs;
use super::dot::{row_kernel, BatchedFor, Dot4xn, RowKernel, TileF, WeightClass};
use super::pool::{SendPtr, ThreadPool};
use crate::BackendError;

/// A row-major weight matrix in ggml layout: `rows` rows (outputs) of `cols` elements (inputs),
/// each `ty.row_bytes(cols)` bytes — ggml's layout for a tensor of dims `[cols, rows]`.
#[derive(Clone, Copy, Debug)]
pub struct WeightMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl WeightMatrix<'_> {
    /// Bytes of one row, after checking the type has a kernel and the sizes agree.
    fn validate(&self) -> Result<usize, BackendError> {
        let ty = self.ty;
        WeightClass::of(ty).ok_or(BackendError::UnsupportedType(ty))?;
        let block = ty.block_elems();
        if !self.cols.is_multiple_of(block) {
            return Err(BackendError::NotWholeBlocks {
                ty,
                cols: self.cols,
                block,
            });
        }
        let row_bytes = self.cols / block * ty.block_bytes();
        let expected = row_bytes.checked_mul(self.rows).ok_or(BackendError::Overflow)?;
        if self.data.len() != expected {
            let (rows, cols, got) = (self.rows, self.cols, self.data.len());
            return Err(BackendError::WeightSize {
                ty,
                rows,
                cols,
                expected,
                got,
            });
        }
        Ok(row_bytes)
    }

    fn row(&self, j: usize, row_bytes: usize) -> &[u8] {
        &self.data[j * row_bytes..(j + 1) * row_bytes]
    }
}

/// Reusable buffers for quantized and packed activations. Keep one per calling thread (as
/// [`matmul`] does) so steady-state calls do not allocate.
#[derive(Default)]
pub struct Scratch {
    acts: QuantizedActs,
    #[cfg(target_arch = "x86_64")]
    packed: AVec<u8>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// `out[r·rows + j] = Σ_k W[j][k]·x[r·cols + k]` for `r < t`, `j < rows`, with a scratch buffer
/// owned by the calling thread. See [`matmul_with`].
pub fn matmul(pool: &ThreadPool, w: &WeightMatrix, x: &[f32], t: usize, out: &mut [f32]) -> Result<(), BackendError> {
    SCRATCH.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => matmul_with(pool, &mut s, w, x, t, out),
        // Re-entered on this thread (from inside a task): use a temporary.
        Err(_) => matmul_with(pool, &mut Scratch::default(), w, x, t, out),
    })
}

#[cfg(target_arch = "x86_64")]
/// Smallest batch that goes to the AVX-512 GEMM (smaller ones take the row kernels, which decode each
/// weight block once for up to four activation rows). Measured on 2 threads with those kernels
/// (decode batches, A B B A): at 6 / 7 / 8 sequences the row kernels ran 1.42x /
/// 1.30x / 1.19x the GEMM on Gemma 3 270M and 1.45x / 1.29x / 1.22x on SmolLM2 Q4_1; at 10 the two
/// tied (Gemma 236-239 against 238-240 tok/s), at 12 the GEMM won (271-275 against 237). When the row
/// kernels took one activation row a pass, the GEMM won from 6 rows.
const GEMM_MIN_T_AVX512: usize = 9;

#[cfg(target_arch = "x86_64")]
/// Smallest batch that goes to the AVX2 GEMM, whose tiles hold half as many activation rows. Measured
/// on 2 threads (2026-12-04, decode batches at depth 64, two runs a side A B B A): at 9 and 12
/// sequences the row kernels ran ahead (SmolLM2 Q4_1 174-215 / 197-229 tok/s against 152-155 /
/// 182-190 through the GEMM; Gemma 3 270M alike, noisier), at 16 the GEMM was ahead or tied (SmolLM2
/// 219-228 against 172-218, Gemma 105-106 against 98-106), at 24 ahead (SmolLM2 236-278 against
/// 161-197). 13-15 were not measured.
const GEMM_MIN_T_AVX2: usize = 16;

/// The GEMM for `w` at `isa`, where `t` rows are worth it.
#[cfg(target_arch = "x86_64")]
fn gemm_for(isa: super::dot::Isa, ty: GgmlType, t: usize) -> Option<super::dot::Gemm> {
    let min_t = match isa.or_scalar() {
        super::dot::Isa::Avx512 => GEMM_MIN_T_AVX512,
        _ => GEMM_MIN_T_AVX2,
    };
    if t < min_t {
        return None;
    }
    super::dot::gemm(isa, ty)
}

/// `x` (`t × cols`, row-major) times the transposed weights into `out` (`t × rows`), on `pool`
/// with the pool's instruction set. Sizes are validated first; nothing is written on error.
pub fn matmul_with(
    pool: &ThreadPool,
    scratch: &mut Scratch,
    w: &WeightMatrix,
    x: &[f32],
    t: usize,
    out: &mut [f32],
) -> Result<(), BackendError> {
    let row_bytes = w.validate()?;
    let (rows, cols) = (w.rows, w.cols);
    let n_in = t.checked_mul(cols).ok_or(BackendError::Overflow)?;
    if x.len() != n_in {
        return Err(BackendError::InputSize {
            t,
            cols,
            expected: n_in,
            got: x.len(),
        });
    }
    let n_out = t.checked_mul(rows).ok_or(BackendError::Overflow)?;
    if out.len() != n_out {
        return Err(BackendError::OutputSize {
            t,
            rows,
            expected: n_out,
            got: out.len(),
        });
    }
    if n_out == 0 {
        return Ok(());
    }
    if cols == 0 {
        out.fill(0.0);
        return Ok(());
    }
    let isa = pool.isa();
    let class = WeightClass::of(w.ty).ok_or(BackendError::UnsupportedType(w.ty))?;
    if let Some(format) = class.act_format() {
        scratch.acts.quantize(pool, isa, format, x, t, cols);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) = gemm_for(isa, w.ty, t) {
        gemm::run(pool, kernel, w, row_bytes, scratch, t, out);
        return Ok(());
    }
    let kernel = row_kernel(isa, w.ty).ok_or(BackendError::UnsupportedType(w.ty))?;
    row_route(pool, kernel, w, row_bytes, &scratch.acts, x, t, out);
    Ok(())
}

/// Weight rows `j0..j1` as the 4-row kernels take them: rows j, j + q, j + 2q, j + 3q (q = a quarter
/// of the range) in one call, so the weights are read as four long sequential streams, which
/// hardware prefetchers follow; four adjacent short rows read as interleaved streams run at a third
/// of the DRAM bandwidth. The last quarter's missing rows repeat the range's last row.
struct Quarters<'a> {
    w: &'a WeightMatrix<'a>,
    row_bytes: usize,
    j0: usize,
    j1: usize,
    q: usize,
}

impl<'a> Quarters<'a> {
    /// The quarters of `j0..j1`, each stream's start fetched (the kernels prefetch ahead within it).
    fn new(w: &'a WeightMatrix<'a>, row_bytes: usize, j0: usize, j1: usize) -> Self {
        let q = (j1 - j0).div_ceil(4);
        if j1 > j0 {
            for i in 0..4 {
                let start = (j0 + i * q).min(j1 - 1) * row_bytes;
                super::dot::prefetch(&w.data[start..(start + super::dot::PREFETCH_BYTES).min(w.data.len())]);
            }
        }
        Quarters {
            w,
            row_bytes,
            j0,
            j1,
            q,
        }
    }

    /// The first rows of the calls: one per row of the first quarter.
    fn calls(&self) -> std::ops::Range<usize> {
        self.j0..self.j0 + self.q
    }

    /// The four weight rows of the call at `j`.
    fn rows4(&self, j: usize) -> [&'a [u8]; 4] {
        std::array::from_fn(|i| self.w.row((j + i * self.q).min(self.j1 - 1), self.row_bytes))
    }

    /// The weight row that result `i` of the call at `j` belongs to, unless it is a repeated one.
    fn row_of(&self, j: usize, i: usize) -> Option<usize> {
        let row = j + i * self.q;
        (row < self.j1).then_some(row)
    }
}

/// One activation row against weight rows `j0..j1`, four at a time where a 4-row kernel
/// exists (the last group repeats its final row; extra results are dropped).
///
/// # Safety
/// The kernel's ISA must be available and all sizes validated (as `matmul_with` does).
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows(
    kernel: RowKernel,
    w: &WeightMatrix,
    row_bytes: usize,
    acts: &QuantizedActs,
    x: &[f32],
    r: usize,
    j0: usize,
    j1: usize,
    out: &mut [f32],
) {
    let cols = w.cols;
    let quarters = Quarters::new(w, row_bytes, j0, j1);
    let rows4 = |j: usize| quarters.rows4(j);
    let put4 = |out: &mut [f32], j: usize, v: [f32; 4]| {
        for (i, v) in v.into_iter().enumerate() {
            if let Some(row) = quarters.row_of(j, i) {
                out[row - j0] = v;
            }
        }
    };
    // SAFETY (all kernel calls): per the function contract.
    unsafe {
        match kernel {
            RowKernel::Q8 { dot, dot4, .. } => {
                let a = acts.q8_row(r);
                match dot4 {
                    Some(dot4) => quarters.calls().for_each(|j| put4(out, j, dot4(rows4(j), &a))),
                    None => (j0..j1).for_each(|j| out[j - j0] = dot(w.row(j, row_bytes), &a)),
                }
            }
            RowKernel::Q8K { dot, dot4, .. } => {
                let a = acts.q8k_row(r);
                match dot4 {
                    Some(dot4) => quarters.calls().for_each(|j| put4(out, j, dot4(rows4(j), &a))),
                    None => (j0..j1).for_each(|j| out[j - j0] = dot(w.row(j, row_bytes), &a)),
                }
            }
            RowKernel::Float { dot, dot4, .. } => {
                let xr = &x[r * cols..(r + 1) * cols];
                match dot4 {
                    Some(dot4) => quarters.calls().for_each(|j| put4(out, j, dot4(rows4(j), xr))),
                    None => (j0..j1).for_each(|j| out[j - j0] = dot(w.row(j, row_bytes), xr)),
                }
            }
        }
    }
}

/// `N` activation rows `a` (rows `r0..r0 + N`) against weight rows `j0..j1` in one pass over them
/// (a decode batch): the four weight rows of a call come from the range's quarters, as in
/// [`dot_rows`], and each decoded block serves all `N` rows, each with the bits `dot_rows` gives it
/// alone. `A` is the activation format's row (`Q8Row` or `Q8KRow`).
///
/// # Safety
/// As for [`dot_rows`]; `out` must be valid for `t · rows` floats (`t > r0 + N - 1`), columns
/// `j0..j1` of rows `r0..r0 + N` this caller's alone.
#[allow(clippy::too_many_arguments)]
unsafe fn dot_rows_batch<A, const N: usize>(
    dot4n: Dot4xn<A, N>,
    w: &WeightMatrix,
    row_bytes: usize,
    a: [A; N],
    r0: usize,
    j0: usize,
    j1: usize,
    out: SendPtr<f32>,
) {
    let quarters = Quarters::new(w, row_bytes, j0, j1);
    for j in quarters.calls() {
        // SAFETY (the kernel): per the function contract.
        let v = unsafe { dot4n(quarters.rows4(j), std::array::from_fn(|n| &a[n])) };
        for (n, v) in v.iter().enumerate() {
            for (i, &v) in v.iter().enumerate() {
                if let Some(row) = quarters.row_of(j, i) {
                    // SAFETY: row r0 + n < t and column `row` < j1 <= rows: this caller's alone.
                    unsafe { *out.0.add((r0 + n) * w.rows + row) = v };
                }
            }
        }
    }
}

/// One pass of `kernel`'s batched form (where the level has one) over activation rows from `r`,
/// four of them if `left >= 4` remain, else all `left` if 2 or 3: how many it took (0 for none, and
/// the caller takes row `r` alone).
///
/// # Safety
/// As for [`dot_rows_batch`], with `r + left <= t`.
#[allow(clippy::too_many_arguments)]
unsafe fn batch_pass(
    kernel: RowKernel,
    w: &WeightMatrix,
    row_bytes: usize,
    acts: &QuantizedActs,
    r: usize,
    left: usize,
    j0: usize,
    j1: usize,
    out: SendPtr<f32>,
) -> usize {
    /// The pass for one activation format, its rows from `row`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn pass<A>(
        k: BatchedFor<A>,
        row: impl Fn(usize) -> A,
        w: &WeightMatrix,
        row_bytes: usize,
        r: usize,
        left: usize,
        j0: usize,
        j1: usize,
        out: SendPtr<f32>,
    ) -> usize {
        let rows = |n: usize| row(r + n);
        // SAFETY (all): per `batch_pass`'s contract; rows r..r + min(left, 4) are below t.
        match left {
            0 | 1 => 0,
            2 => {
                unsafe { dot_rows_batch(k.two, w, row_bytes, std::array::from_fn(rows), r, j0, j1, out) };
                2
            }
            3 => {
                unsafe { dot_rows_batch(k.three, w, row_bytes, std::array::from_fn(rows), r, j0, j1, out) };
                3
            }
            _ => {
                unsafe { dot_rows_batch(k.four, w, row_bytes, std::array::from_fn(rows), r, j0, j1, out) };
                4
            }
        }
    }
    // SAFETY (both): per the function contract.
    match kernel {
        RowKernel::Q8 { batch: Some(k), .. } => unsafe {
            pass(k, |i| acts.q8_row(i), w, row_bytes, r, left, j0, j1, out)
        },
        RowKernel::Q8K { batch: Some(k), .. } => unsafe {
            pass(k, |i| acts.q8k_row(i), w, row_bytes, r, left, j0, j1, out)
        },
        _ => 0,
    }
}

/// Float weights, several activation rows: 4 × 4 tiles of (weight rows, activation rows) over
/// weight rows `j0..j1` (padding rows repeat the last one; their results are dropped).
///
/// # Safety
/// As for [`dot_rows`]; `out` must be valid for `t · rows` floats, columns `j0..j1` this
/// caller's alone.
#[allow(clippy::too_many_arguments)]
unsafe fn float_tiles(
    tile: TileF,
    w: &WeightMatrix,
    row_bytes: usize,
    x: &[f32],
    t: usize,
    j0: usize,
    j1: usize,
    out: SendPtr<f32>,
) {
    let cols = w.cols;
    let xrow = |r: usize| &x[r.min(t - 1) * cols..][..cols];
    for r0 in (0..t).step_by(4) {
        let xs = [xrow(r0), xrow(r0 + 1), xrow(r0 + 2), xrow(r0 + 3)];
        for j in (j0..j1).step_by(4) {
            let ws: [&[u8]; 4] = std::array::from_fn(|i| w.row((j + i).min(j1 - 1), row_bytes));
            // SAFETY: per the function contract.
            let v = unsafe { tile(ws, xs) };
            for (i, v) in v.iter().enumerate().take(j1 - j) {
                for (c, &v) in v.iter().enumerate().take(t - r0) {
                    // SAFETY: (r0 + c) < t and j + i < j1 <= rows.
                    unsafe { *out.0.add((r0 + c) * w.rows + j + i) = v };
                }
            }
        }
    }
}

/// Row kernels over (chunk of weight rows) × (activation row) tasks. The weight rows of a task
/// stay in cache while every activation row passes over them.
#[allow(clippy::too_many_arguments)]
fn row_route(
    pool: &ThreadPool,
    kernel: RowKernel,
    w: &WeightMatrix,
    row_bytes: usize,
    acts: &QuantizedActs,
    x: &[f32],
    t: usize,
    out: &mut [f32],
) {
    let rows = w.rows;
    // Enough chunks to balance (4 per thread; more, shorter chunks make the weight streams too
    // short for the prefetchers). With several activation rows, also small enough (≤ 64 KiB of
    // weights) that a chunk stays in L2 while they all pass over it.
    let by_balance = rows.div_ceil(4 * pool.n_threads());
    let by_cache = if t > 1 {
        (65536 / row_bytes.max(1)).max(4)
    } else {
        usize::MAX
    };
    let chunk = by_balance.min(by_cache).max(16).next_multiple_of(4);
    let n_chunks = rows.div_ceil(chunk);
    let outp = SendPtr(out.as_mut_ptr());
    if let (RowKernel::Float { tile: Some(tile), .. }, true) = (kernel, t > 1) {
        pool.run(n_chunks, &|c| {
            let (j0, j1) = (c * chunk, ((c + 1) * chunk).min(rows));
            // SAFETY: validated sizes; this task alone writes columns j0..j1 of `out`.
            unsafe { float_tiles(tile, w, row_bytes, x, t, j0, j1, outp) };
        });
        return;
    }
    pool.run(n_chunks, &|c| {
        let (j0, j1) = (c * chunk, ((c + 1) * chunk).min(rows));
        let mut r = 0;
        while r < t {
            // Activation rows in fours, threes and twos where the level has kernels that decode each
            // weight block once for several rows (the chunk is read once for them all); one at a
            // time else.
            // SAFETY (both): validated sizes; this task alone writes columns j0..j1 of these rows.
            match unsafe { batch_pass(kernel, w, row_bytes, acts, r, t - r, j0, j1, outp) } {
                0 => {
                    unsafe {
                        dot_rows(
                            kernel,
                            w,
                            row_bytes,
                            acts,
                            x,
                            r,
                            j0,
                            j1,
                            outp.slice(r * rows + j0, j1 - j0),
                        )
                    };
                    r += 1;
                }
                n => r += n,
            }
        }
    });
}

#[cfg(target_arch = "x86_64")]
mod gemm {
    use std::cell::RefCell;

    use super::super::dot::gemm_avx512::{OutTile, Panel, TaskSpec, MR};
    use super::super::dot::Gemm;
    use super::super::pool::{SendPtr, ThreadPool};
    use super::{Scratch, WeightMatrix};

    thread_local! {
        static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
    }

    /// Weight rows per task at most (the decoded panel, 64 × cols bytes, stays in L2).
    const MAX_CHUNK: usize = 64;
    pub(super) fn run(
        pool: &ThreadPool,
        kernel: Gemm,
        w: &WeightMatrix,
        row_bytes: usize,
        scratch: &mut Scratch,
        t: usize,
        out: &mut [f32],
    ) {
        let (rows, k) = (w.rows, w.cols);
        let groups = t.div_ceil(kernel.lanes);
        let gbytes = (kernel.group_bytes)(k);
        scratch.packed.resize(groups * gbytes);
        {
            let acts = &scratch.acts;
            let packed = SendPtr(scratch.packed.as_mut_slice().as_mut_ptr());
            pool.run(groups, &|gi| {
                // SAFETY: each group's bytes are written by one task only.
                let dst = unsafe { packed.slice(gi * gbytes, gbytes) };
                (kernel.pack)(acts, gi, dst)
            });
        }
        let packed = scratch.packed.as_slice();

        // Activation groups per task: two register tiles' worth (AVX-512: 96 activation rows, AVX2:
        // 32), so a task re-decodes its weight rows once per that many.
        let group_span = 2 * kernel.nr;
        let spans = groups.div_ceil(group_span);
        let chunks_wanted = (4 * pool.n_threads()).div_ceil(spans);
        let chunk = rows.div_ceil(chunks_wanted).next_multiple_of(MR).clamp(MR, MAX_CHUNK);
        let n_chunks = rows.div_ceil(chunk);
        let out = OutTile {
            out: out.as_mut_ptr(),
            rows,
            t,
            row0: 0,
            act0: 0,
        };
        pool.run(n_chunks * spans, &|task_id| {
            let (c, s) = (task_id / spans, task_id % spans);
            let (j0, j1) = (c * chunk, ((c + 1) * chunk).min(rows));
            let mut row_refs: [&[u8]; MAX_CHUNK] = [&[]; MAX_CHUNK];
            for (i, j) in (j0..j1).enumerate() {
                row_refs[i] = w.row(j, row_bytes);
            }
            let spec = TaskSpec {
                rows: &row_refs[..j1 - j0],
                k,
                packed,
                group_bytes: gbytes,
                groups: s * group_span..((s + 1) * group_span).min(groups),
            };
            let tile = out.at_row(j0);
            PANEL.with(|p| {
                let mut panel = p.borrow_mut();
                // SAFETY: `kernel` exists only for an available level; the task writes only
                // rows j0..j1 × its activation groups of `out`, disjoint from other tasks.
                unsafe { (kernel.task)(&spec, &mut panel, tile) };
            });
        });
    }
}
