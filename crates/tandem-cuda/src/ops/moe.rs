//! Mixture-of-experts kernels: each row's routing from its router logits (`moe_route`) and the
//! weighted sum of its experts' outputs in slot order (`moe_combine`); and the host's part between
//! them, where each (row, slot) pair's expert output lies once the rows are grouped by expert.

use cudarc::driver::{CudaSlice, CudaView, PushKernelArg};
use tandem_model::moe::ExpertRows;

use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::runtime::grid::{blocks, i32_of, launch_cfg};
use crate::CudaError;

/// Rows (warps) of one `moe_route` block (`MOE_ROUTE_WARPS` in ops.cu).
const ROUTE_WARPS: usize = 4;

/// Experts a row can route over: 32 a lane (`MOE_ROUTE_MAX_PER_LANE` in ops.cu, the bits of one
/// lane's taken mask).
pub const ROUTE_MAX_EXPERTS: usize = 32 * 32;

/// A mixture's shape for the routing kernel: `n` experts, `k` chosen a row, weights renormalised
/// when `norm`.
#[derive(Clone, Copy, Debug)]
pub struct RouteShape {
    pub rows: usize,
    pub n: usize,
    pub k: usize,
    pub norm: bool,
}

/// The `moe_route` kernel: `ids` and `weights` (`rows × k` each) from `logits` (`rows × n`), as
/// `Routing::from_logits` computes them.
pub fn route_into(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    shape: RouteShape,
    ids: &mut CudaSlice<i32>,
    weights: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    let RouteShape { rows, n, k, norm } = shape;
    if n == 0
        || n > ROUTE_MAX_EXPERTS
        || k == 0
        || k > n
        || logits.len() < rows * n
        || ids.len() < rows * k
        || weights.len() < rows * k
    {
        return Err(CudaError::Driver {
            what: "moe_route".into(),
            err: format!("{rows} rows of {n} router logits, {k} experts a row"),
        });
    }
    let (r, ni, ki, norm) = (
        i32_of(rows, "rows")?,
        i32_of(n, "experts")?,
        i32_of(k, "experts used")?,
        i32::from(norm),
    );
    let f = gpu.function("moe_route")?;
    let mut b = gpu.launch_builder(f)?;
    b.arg(logits).arg(&r).arg(&ni).arg(&ki).arg(&norm).arg(ids).arg(weights);
    let mut cfg = launch_cfg((blocks(rows, ROUTE_WARPS), 1, 1), 32 * ROUTE_WARPS as u32);
    cfg.shared_mem_bytes = (ROUTE_WARPS * n * 4) as u32;
    // SAFETY: logits hold rows x n floats, ids and weights rows x k; the shared memory a row's n
    // probabilities for each of the block's warps.
    driver("moe_route", unsafe { b.launch(cfg) })?;
    Ok(())
}

/// The `moe_combine` kernel: `out[r] = Σ_s weights[r·k+s] · expert_out[pos[r·k+s]]` over the `k`
/// slots in order, `rows` rows of `width`; without `pos`, pair r·k+s's output is row r·k+s.
#[allow(clippy::too_many_arguments)]
pub fn combine_into(
    gpu: &Gpu,
    expert_out: &CudaSlice<f32>,
    pos: Option<&CudaView<'_, i32>>,
    weights: &CudaSlice<f32>,
    rows: usize,
    k: usize,
    width: usize,
    out: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    let pairs = rows * k;
    if k == 0
        || pos.is_some_and(|p| p.len() < pairs)
        || expert_out.len() < pairs * width
        || weights.len() < pairs
        || out.len() < rows * width
    {
        return Err(CudaError::Driver {
            what: "moe_combine".into(),
            err: format!("{rows} rows of {width}, {k} slots a row"),
        });
    }
    let (ki, wi) = (i32_of(k, "experts used")?, i32_of(width, "width")?);
    let f = gpu.function("moe_combine")?;
    let mut b = gpu.launch_builder(f)?;
    let in_pair_order = 0u64;
    b.arg(expert_out);
    match pos {
        Some(p) => b.arg(p),
        None => b.arg(&in_pair_order),
    };
    b.arg(weights).arg(out).arg(&ki).arg(&wi);
    driver("moe_combine", unsafe { b.launch(launch_cfg((rows as u32, 1, 1), 256)) })?;
    Ok(())
}

/// Positions of one sorted tile (`MOE_SORT_TILE` in ops.cu): the grouped kernels' activation rows
/// a block (`mmq_ids_*`, 16 rows of the mma's m).
pub const SORT_TILE: usize = 16;

/// Experts a chunk's pairs can be sorted over in one block (`moe_sort` keeps three ints an expert in
/// shared memory, within the 48 KiB a launch gets without opting in).
pub const SORT_MAX_EXPERTS: usize = 4096;

/// The most tiles `pairs` sorted pairs of `n` experts make: each expert's partial tile on top of
/// the whole ones. The grouped kernels' grids take this many (the count itself stays on the device).
pub fn max_sort_tiles(pairs: usize, n: usize) -> usize {
    pairs.div_ceil(SORT_TILE) + n.min(pairs)
}

/// The device's sort of a chunk's (row, slot) pairs by expert (`moe_sort`): `src_row[s]` the chunk
/// row of the pair at sorted position s, `pos[p]` the position of pair p, `tiles` the tile count and
/// (expert, first position, end of the expert's positions) per tile. The same order as the host's
/// `stacked_positions` over `group_by_expert`.
pub struct SortedPairs<'a> {
    pub src_row: &'a mut CudaSlice<i32>,
    pub pos: &'a mut CudaSlice<i32>,
    pub tiles: &'a mut CudaSlice<i32>,
}

/// The `moe_sort` kernel over `ids` (`rows × k` experts of `0..n`, as `moe_route` writes them).
pub fn sort_into(
    gpu: &Gpu,
    ids: &CudaSlice<i32>,
    rows: usize,
    n: usize,
    k: usize,
    out: SortedPairs<'_>,
) -> Result<(), CudaError> {
    let pairs = rows * k;
    if k == 0
        || n == 0
        || n > SORT_MAX_EXPERTS
        || ids.len() < pairs
        || out.src_row.len() < pairs
        || out.pos.len() < pairs
        || out.tiles.len() < 1 + 3 * max_sort_tiles(pairs, n)
    {
        return Err(CudaError::Driver {
            what: "moe_sort".into(),
            err: format!("{rows} rows of {k} of {n} experts"),
        });
    }
    let (p, ni, ki) = (
        i32_of(pairs, "pairs")?,
        i32_of(n, "experts")?,
        i32_of(k, "experts used")?,
    );
    let f = gpu.function("moe_sort")?;
    let mut b = gpu.launch_builder(f)?;
    b.arg(ids)
        .arg(&p)
        .arg(&ni)
        .arg(&ki)
        .arg(out.src_row)
        .arg(out.pos)
        .arg(out.tiles);
    let mut cfg = launch_cfg((1, 1, 1), 1024);
    cfg.shared_mem_bytes = (3 * n * 4) as u32;
    // SAFETY: ids holds `pairs` ints; src_row and pos `pairs`; tiles room for the most tiles the
    // pairs can make; the shared memory three ints an expert.
    driver("moe_sort", unsafe { b.launch(cfg) })?;
    Ok(())
}

/// Where the expert outputs of `groups` lie when stacked group after group in one buffer: each
/// group's first row there, and for each (row, slot) pair (`pairs` of them, `Routing::experts`'
/// order) the row of its expert's output. `None` when a pair has no group or two.
pub fn stacked_positions(groups: &[ExpertRows], pairs: usize) -> Option<(Vec<usize>, Vec<usize>)> {
    let mut pos = vec![usize::MAX; pairs];
    let mut starts = Vec::with_capacity(groups.len());
    let mut at = 0;
    for g in groups {
        starts.push(at);
        for &p in &g.pairs {
            if *pos.get(p)? != usize::MAX {
                return None;
            }
            pos[p] = at;
            at += 1;
        }
    }
    pos.iter().all(|&p| p != usize::MAX).then_some((starts, pos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_model::config::MoeConfig;
    use tandem_model::moe::Routing;

    #[test]
    fn sorted_tiles_never_outnumber_the_grid_the_host_launches() {
        // Every expert's pairs cut into tiles of SORT_TILE, as moe_sort cuts them, for routings from
        // one expert taking everything to every pair on its own expert.
        let tiles = |counts: &[usize]| counts.iter().map(|c| c.div_ceil(SORT_TILE)).sum::<usize>();
        for (pairs, n) in [(1, 128), (8, 128), (4096, 128), (4096, 4), (33, 2), (17 * 3, 7)] {
            let mut all_on_one = vec![0; n];
            all_on_one[0] = pairs;
            let mut spread = vec![0; n];
            for p in 0..pairs {
                spread[p % n] += 1;
            }
            let mut ragged = vec![0; n];
            for p in 0..pairs {
                ragged[(p * p + 3 * p) % n] += 1;
            }
            for counts in [all_on_one, spread, ragged] {
                assert!(
                    tiles(&counts) <= max_sort_tiles(pairs, n),
                    "{pairs} pairs of {n}: {counts:?}"
                );
            }
        }
        assert_eq!(max_sort_tiles(4096, 128), 256 + 128);
        assert_eq!(max_sort_tiles(3, 128), 1 + 3);
    }

    #[test]
    fn each_pair_finds_its_expert_output_in_the_stack() {
        // Rows route to (0, 1), (1, 2), (3, 0): the groups are experts 0, 1, 2 and 3.
        let logits = [5.0, 4.0, 0.0, 0.0, 0.0, 5.0, 4.0, 0.0, 4.0, 0.0, 0.0, 5.0];
        let moe = MoeConfig {
            n_expert: 4,
            n_expert_used: 2,
            d_ff_expert: 8,
            norm_weights: true,
        };
        let r = Routing::from_logits(&logits, &moe).unwrap();
        let groups = r.by_expert();
        let (starts, pos) = stacked_positions(&groups, r.experts.len()).unwrap();
        // Expert 0 holds rows 0 and 2 (stack rows 0, 1), expert 1 rows 0 and 1 (2, 3), expert 2
        // row 1 (4), expert 3 row 2 (5).
        assert_eq!(starts, vec![0, 2, 4, 5]);
        assert_eq!(pos, vec![0, 2, 3, 4, 5, 1]);
        // Every stack row is some pair's, once, and holds that pair's expert.
        for (p, &at) in pos.iter().enumerate() {
            let g = starts.iter().rposition(|&s| s <= at).unwrap();
            assert_eq!(groups[g].expert as u32, r.experts[p]);
        }
    }

    #[test]
    fn a_pair_missing_or_in_two_groups_is_refused() {
        let g = |expert, pairs: Vec<usize>| ExpertRows { expert, pairs };
        assert!(stacked_positions(&[g(0, vec![0]), g(1, vec![1])], 2).is_some());
        assert!(stacked_positions(&[g(0, vec![0])], 2).is_none());
        assert!(stacked_positions(&[g(0, vec![0, 1]), g(1, vec![1])], 2).is_none());
        assert!(stacked_positions(&[g(0, vec![0, 5])], 2).is_none());
    }

    #[test]
    fn the_kernels_are_in_the_ops_file_with_the_cpu_clamp() {
        let src = crate::runtime::nvrtc::assemble(&crate::runtime::nvrtc::OPS);
        let names = crate::runtime::device::kernel_names(crate::runtime::nvrtc::OPS.body);
        assert!(names.contains(&"moe_route".to_string()) && names.contains(&"moe_combine".to_string()));
        // The renormalisation's clamp is moe.rs's (the smallest normal f16).
        assert!(src.contains("#define MOE_MIN_WEIGHT_SUM 6.1035156e-5f"));
        assert_eq!(6.103_515_6e-5f32, f32::from_bits(0x3880_0000));
    }
}
