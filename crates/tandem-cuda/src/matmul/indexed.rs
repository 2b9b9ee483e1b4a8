//! The routed experts' integer products, each expert's matrix found through a table of the experts'
//! device addresses (`ExpertTable`), so no id comes back to the host and a captured graph replays
//! each step's own choice:
//! - a few rows (a mixture's decode): each (row, slot) pair reads the matrix of the expert the
//!   routing kernel chose for it (`mmvq_ids_*` in `kernels/mmvq.cu`);
//! - prefill chunks: the pairs sorted by expert on the device (`ops::moe::sort_into`), tiles of up to
//!   16 pairs of one expert on the tensor cores, each expert's weights read once a tile
//!   (`mmq_ids_*` in `kernels/mmq.cu`).

use cudarc::driver::{CudaSlice, DevicePtr, LaunchArgs, PushKernelArg};

use crate::matmul::kinds::{ActQuant, MmvqVariant};
use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::runtime::grid::{i32_of, launch_cfg};
use crate::CudaError;

/// One expert tensor of a layer on the device: every expert's integer-route matrix (`rows × cols`
/// of type `suffix`, the same kernel variant for all), and their addresses in expert order.
pub struct ExpertTable {
    pub suffix: &'static str,
    pub fmt: ActQuant,
    pub variant: MmvqVariant,
    pub rows: usize,
    pub cols: usize,
    /// Expert e's weights start at `addresses[e]`; the matrices they point into live as long as the
    /// model, which owns both.
    pub addresses: CudaSlice<u64>,
}

impl ExpertTable {
    /// The table of `experts` (their integer-route weights, in expert order), uploaded.
    pub fn new(
        gpu: &Gpu,
        experts: &[&CudaSlice<u8>],
        suffix: &'static str,
        fmt: ActQuant,
        variant: MmvqVariant,
        rows: usize,
        cols: usize,
    ) -> Result<Self, CudaError> {
        let addresses: Vec<u64> = experts
            .iter()
            .map(|w| {
                let (ptr, _record) = w.device_ptr(&gpu.stream);
                ptr
            })
            .collect();
        Ok(ExpertTable {
            suffix,
            fmt,
            variant,
            rows,
            cols,
            addresses: gpu.upload(&addresses)?,
        })
    }

    pub fn n_expert(&self) -> usize {
        self.addresses.len()
    }

    /// Whether the grouped tensor-core kernel (`mmq_ids_*`) takes this table: Q4_K, Q6_K and Q8_0
    /// in whole groups of eight weight rows (one mma's n). Its outputs have the split-1 matvec's bits,
    /// so they equal the indexed route's where the variant's split is 1 (always in deterministic mode).
    pub fn groups_on_tensor_cores(&self) -> bool {
        matches!(self.suffix, "q4_k" | "q6_k" | "q8_0") && self.rows.is_multiple_of(8)
    }

    /// Whether `other` can share a launch with this table (an expert's gate and up).
    pub fn same_shape(&self, other: &ExpertTable) -> bool {
        (
            self.suffix,
            self.fmt,
            self.variant,
            self.rows,
            self.cols,
            self.n_expert(),
        ) == (
            other.suffix,
            other.fmt,
            other.variant,
            other.rows,
            other.cols,
            other.n_expert(),
        )
    }
}

/// The pairs of one indexed launch: `ids` (`pairs` expert ids on the device, as `moe_route` writes
/// them) and the quantized activations `a` of `a_rows` rows, pair p reading row `p / a_div`.
pub struct Pairs<'a> {
    pub ids: &'a CudaSlice<i32>,
    pub pairs: usize,
    pub a: &'a CudaSlice<u8>,
    pub a_rows: usize,
    pub a_div: usize,
}

/// `outs[i][p] = W(tables[i], ids[p]) · a[p / a_div]` for one or two tables of one shape, in one
/// launch (`mmvq_ids_*`): each output row has the bits of its expert's own one-row launch of the
/// table's variant.
pub fn mmvq_ids_into(
    gpu: &Gpu,
    tables: &[&ExpertTable],
    pairs: &Pairs<'_>,
    outs: &mut [&mut CudaSlice<f32>],
) -> Result<(), CudaError> {
    let fail = |err: String| CudaError::Driver {
        what: "mmvq_ids".into(),
        err,
    };
    let first = one_shape(tables, outs.len(), &fail)?;
    let p = pairs.pairs;
    let (rows, cols) = (first.rows, first.cols);
    if !rows.is_multiple_of(first.variant.rows as usize)
        || pairs.ids.len() < p
        || pairs.a_div == 0
        || p.div_ceil(pairs.a_div) > pairs.a_rows
        || pairs.a.len() < first.fmt.bytes(pairs.a_rows, cols)
        || outs.iter().any(|o| o.len() < p * rows)
    {
        return Err(fail(format!(
            "{p} pairs of {rows}x{cols} over {} activation rows (a pair each {})",
            pairs.a_rows, pairs.a_div
        )));
    }
    let name = first.variant.ids_kernel(first.suffix);
    let f = gpu.function(&name)?;
    let (r, c) = (i32_of(rows, "rows")?, i32_of(cols, "cols")?);
    let (a_rows, a_div) = (i32_of(pairs.a_rows, "rows")?, i32_of(pairs.a_div, "rows")?);
    let n_expert = i32_of(first.n_expert(), "experts")?;
    let grid_y = u32::try_from(p).map_err(|_| fail(format!("{p} pairs")))?;
    let second = tables.get(1).copied().unwrap_or(first);
    let mut b = gpu.launch_builder(f)?;
    b.arg(&first.addresses)
        .arg(&second.addresses)
        .arg(pairs.ids)
        .arg(pairs.a);
    arg_outputs(&mut b, outs, &fail)?;
    b.arg(&r).arg(&c).arg(&a_rows).arg(&a_div).arg(&n_expert);
    let cfg = launch_cfg((first.variant.blocks(rows), grid_y, tables.len() as u32), 128);
    // SAFETY: every address in the tables is an expert's integer-route matrix of rows x cols (the
    // model owns them for its lifetime); `a` holds a_rows quantized rows of cols; each output holds
    // `pairs` rows of `rows` floats; ids outside the table leave their row unwritten.
    driver(&name, unsafe { b.launch(cfg) })?;
    Ok(())
}

/// `outs[i][s] = W(tables[i], expert of s) · a[s]` for the `n_total` pairs sorted by expert, whose
/// tiles `moe_sort` wrote (at most `max_tiles`), for one or two tables of one shape in one launch
/// (`mmq_ids_*`): each output row has the bits of its expert's own `mmq_*`, the split-1 matvec's.
pub fn mmq_ids_into(
    gpu: &Gpu,
    tables: &[&ExpertTable],
    tiles: &CudaSlice<i32>,
    max_tiles: usize,
    a: &CudaSlice<u8>,
    n_total: usize,
    outs: &mut [&mut CudaSlice<f32>],
) -> Result<(), CudaError> {
    let fail = |err: String| CudaError::Driver {
        what: "mmq_ids".into(),
        err,
    };
    let first = one_shape(tables, outs.len(), &fail)?;
    let (rows, cols) = (first.rows, first.cols);
    if !first.groups_on_tensor_cores()
        || tiles.len() < 1 + 3 * max_tiles
        || a.len() < first.fmt.bytes(n_total, cols)
        || outs.iter().any(|o| o.len() < n_total * rows)
    {
        return Err(fail(format!(
            "{n_total} sorted pairs of {rows}x{cols} {} in {max_tiles} tiles",
            first.suffix
        )));
    }
    let name = format!("mmq_ids_{}", first.suffix);
    let f = gpu.function(&name)?;
    let (r, c, n) = (i32_of(rows, "rows")?, i32_of(cols, "cols")?, i32_of(n_total, "pairs")?);
    let grid_x = u32::try_from(max_tiles.max(1)).map_err(|_| fail(format!("{max_tiles} tiles")))?;
    let second = tables.get(1).copied().unwrap_or(first);
    let mut b = gpu.launch_builder(f)?;
    b.arg(&first.addresses).arg(&second.addresses).arg(tiles).arg(a);
    arg_outputs(&mut b, outs, &fail)?;
    b.arg(&r).arg(&c).arg(&n);
    let cfg = launch_cfg((grid_x, rows.div_ceil(32) as u32, tables.len() as u32), 128);
    // SAFETY: every address in the tables is an expert's integer-route matrix of rows x cols (the
    // model owns them for its lifetime); `tiles` names positions inside the n_total rows of `a`
    // (quantized as the tables' format) and of each output (n_total rows of `rows` floats).
    driver(&name, unsafe { b.launch(cfg) })?;
    Ok(())
}

/// The first of one or two tables of one shape, one output each: what a launch of `*_ids_*` takes
/// (a second table shares the first's grid, in grid.z).
fn one_shape<'t>(
    tables: &[&'t ExpertTable],
    n_outs: usize,
    fail: &impl Fn(String) -> CudaError,
) -> Result<&'t ExpertTable, CudaError> {
    let [first, ..] = tables else {
        return Err(fail("no expert table".into()));
    };
    if tables.len() > 2 || n_outs != tables.len() || !tables.iter().all(|t| t.same_shape(first)) {
        return Err(fail(format!(
            "{} tables of differing shapes, {n_outs} outputs",
            tables.len()
        )));
    }
    Ok(first)
}

/// The outputs Y0 and Y1 of a `*_ids_*` launch: the second table's, or the first's again when there
/// is one table (grid.z is then 1 and never writes Y1).
fn arg_outputs<'a>(
    b: &mut LaunchArgs<'a>,
    outs: &'a mut [&mut CudaSlice<f32>],
    fail: &impl Fn(String) -> CudaError,
) -> Result<(), CudaError> {
    let (y0, rest) = outs.split_first_mut().ok_or_else(|| fail("no output".into()))?;
    match rest.first_mut() {
        Some(y1) => b.arg(&mut **y0).arg(&mut **y1),
        None => {
            let y0: &CudaSlice<f32> = y0;
            b.arg(y0).arg(y0)
        }
    };
    Ok(())
}
