//! Prefill attention on the tensor cores (`kernels/flash.cu`), for chunks longer than
//! `MATVEC_MAX_ROWS` outside deterministic mode (`routes::attention_route`): a block takes 64 or 128
//! queries of one head and walks the key tiles they may see with a running softmax, so the scores
//! never leave the chip and each key row is read once per block. Its products are `mma.sync` by each
//! warp, or on sm_90 (128-wide heads) `wgmma` by each warpgroup, K and V read by the tensor cores
//! from shared memory (`Products`; `chosen` picks by head size, chunk length and GPU).
//!
//! Which key tiles each query tile reads, and which of them the causal or window edge cuts through,
//! is the chunk's *plan* (`plan`): made on the host once per chunk and key range, uploaded once, and
//! shared by every layer that reads the same range (`CudaModel::flash_plan`).
//!
//! The kernel needs the chunk's keys contiguous in the buffer (`key_range`): always so for global
//! layers, staged buffers and rings that have not wrapped inside the range; otherwise the tile kernel
//! takes the chunk.

use cudarc::driver::{CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use crate::routes::first_key;
use crate::runtime::checked::driver;
use crate::runtime::device::{allow_dynamic_shared, Gpu};
use crate::runtime::grid::{i32_of, launch_cfg};
use crate::CudaError;

/// How a variant's products run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Products {
    /// `mma.sync` by each warp, its Q fragments in registers.
    QInRegisters,
    /// `mma.sync` by each warp, Q read from shared memory at each step.
    QInShared,
    /// `wgmma` by each warpgroup (`m_tiles` of them a block), K and V read from shared memory by the
    /// tensor cores (sm_90), a tile's softmax running while they do the previous tile's P·V.
    Warpgroup,
}

/// One compiled form of the kernel (`FLASH_ENTRY`, `FLASH_WG_ENTRY` in `kernels/flash.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashVariant {
    pub head_dim: usize,
    /// Keys a tile.
    pub key_tile: usize,
    /// The warp forms: m-tiles of 16 query rows a warp (each K and V fragment loaded serves all of
    /// them). The warpgroup form: warpgroups a block, sharing the K and V tiles.
    pub m_tiles: usize,
    pub products: Products,
}

impl FlashVariant {
    pub fn kernel(&self) -> String {
        let form = match self.products {
            Products::QInRegisters => 'r',
            Products::QInShared => 's',
            Products::Warpgroup => 'w',
        };
        format!(
            "flash_prefill_d{}_k{}_m{}_{form}",
            self.head_dim, self.key_tile, self.m_tiles
        )
    }

    /// Query rows a block takes: four warps of `m_tiles` times 16, or `m_tiles` warpgroups of 64.
    pub fn query_tile(&self) -> usize {
        64 * self.m_tiles
    }

    /// Threads a block: four warps, or four a warpgroup.
    pub fn threads(&self) -> u32 {
        if self.warpgroup() {
            128 * self.m_tiles as u32
        } else {
            128
        }
    }

    fn warpgroup(&self) -> bool {
        self.products == Products::Warpgroup
    }

    /// Whether the variant runs on a GPU of compute capability `major` (the warpgroup products exist
    /// on sm_90 only; elsewhere their entry points trap).
    pub fn runs_on(&self, major: i32) -> bool {
        !self.warpgroup() || major == 9
    }

    /// Dynamic shared memory. The warp forms: K and V tiles, and the block's queries unless in
    /// registers, rows padded by 8 halves. The warpgroup form: K and V tiles in two stages, unpadded.
    pub fn shared_bytes(&self) -> usize {
        let tile = self.key_tile * self.head_dim * 2;
        let padded_rows = |rows: usize| rows * (self.head_dim + 8) * 2;
        match self.products {
            Products::Warpgroup => 4 * tile,
            Products::QInRegisters => padded_rows(2 * self.key_tile),
            Products::QInShared => padded_rows(2 * self.key_tile + self.query_tile()),
        }
    }
}

const fn variant(head_dim: usize, key_tile: usize, m_tiles: usize, products: Products) -> FlashVariant {
    FlashVariant {
        head_dim,
        key_tile,
        m_tiles,
        products,
    }
}

/// Every compiled variant, in `kernels/flash.cu` order. 256-wide heads take 32 keys a tile so that
/// their accumulators fit in registers; two m-tiles a warp need Q in shared memory for the same reason.
pub const VARIANTS: [FlashVariant; 8] = [
    variant(32, 64, 1, Products::QInRegisters),
    variant(64, 64, 1, Products::QInRegisters),
    variant(128, 64, 1, Products::QInRegisters),
    variant(128, 64, 2, Products::QInShared),
    variant(256, 32, 1, Products::QInRegisters),
    variant(128, 64, 1, Products::Warpgroup),
    variant(128, 64, 2, Products::Warpgroup),
    variant(128, 128, 2, Products::Warpgroup),
];

/// Chunks from which 128-wide heads take two m-tiles a warp. Measured on the H200 (Llama-3-8B shape,
/// 32 query heads): 638 against 700 µs for 4096 rows from position 0, but 176 against 159 µs for the
/// last 512 rows of 4096, where 128-row blocks are too few (4 per head) to keep every SM busy.
pub const TWO_M_TILES_FROM: usize = 2048;

/// The variant prefill attention takes for a head size and a chunk of `t` rows on a GPU of compute
/// capability `major` (`None`: no kernel for that head size).
pub fn chosen(head_dim: usize, t: usize, major: i32) -> Option<FlashVariant> {
    let wanted = |v: &FlashVariant| {
        if !v.runs_on(major) || v.head_dim != head_dim {
            return false;
        }
        if head_dim == 128 && major == 9 {
            // Two warpgroups over 128-key tiles, measured fastest on the H200 (`tandem-dev
            // bench flash`: 374 µs for 4096 rows from position 0 against 378 for one warpgroup at
            // 64-key tiles, 401 for two, and 625 for `mma.sync`'s best; 84.6 against 84.2-85.8 and
            // 155 for the last 512 of 4096); chunks of at most 64 rows take one warpgroup, whose
            // 64-row blocks leave no query rows idle.
            let (warpgroups, keys) = if t <= 64 { (1, 64) } else { (2, 128) };
            return v.products == Products::Warpgroup && v.m_tiles == warpgroups && v.key_tile == keys;
        }
        let m_tiles = if head_dim == 128 && t >= TWO_M_TILES_FROM { 2 } else { 1 };
        v.m_tiles == m_tiles && !v.warpgroup()
    };
    VARIANTS.iter().copied().find(wanted)
}

/// The keys a chunk reads: logical positions `lo .. lo + n`, at physical rows `phys .. phys + n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub lo: usize,
    pub n: usize,
    pub phys: usize,
}

/// The keys queries at `positions` may see in a buffer of `capacity` rows holding positions from
/// `origin_logical` at physical row `origin_physical`, or `None` when they wrap around its end.
pub fn key_range(
    positions: &[usize],
    window: Option<usize>,
    (capacity, origin_logical, origin_physical): (usize, usize, usize),
) -> Option<KeyRange> {
    let lo = positions
        .iter()
        .map(|&p| first_key(p, window).max(origin_logical))
        .min()?;
    let n = (positions.iter().max()? + 1).checked_sub(lo)?;
    let phys = (origin_physical + lo - origin_logical) % capacity;
    (phys + n <= capacity).then_some(KeyRange { lo, n, phys })
}

/// The chunk's plan: `plan[i] .. plan[i + 1]` index the entries of query tile `i` (of `query_tile`
/// rows), each `key_tile_index * 2 + partial`. A key tile is listed when some query of the tile may
/// see one of its keys; it is dense (`partial` 0, no mask) when every query sees every key of it.
/// Queries see keys from `max(keys.lo, p + 1 - window)` through their own position `p`.
pub fn plan(
    positions: &[usize],
    window: Option<usize>,
    keys: KeyRange,
    (query_tile, key_tile): (usize, usize),
) -> Vec<i32> {
    let query_tiles = positions.chunks(query_tile);
    let n_qt = query_tiles.len();
    let n_kt = keys.n.div_ceil(key_tile);
    let mut offsets = Vec::with_capacity(n_qt + 1);
    let mut entries = Vec::new();
    for rows in query_tiles {
        offsets.push(n_qt + 1 + entries.len());
        let firsts = rows.iter().map(|&p| first_key(p, window).max(keys.lo));
        let (first_min, first_max) = (firsts.clone().min().unwrap_or(0), firsts.max().unwrap_or(0));
        let (last_min, last_max) = (
            rows.iter().copied().min().unwrap_or(0),
            rows.iter().copied().max().unwrap_or(0),
        );
        for kt in 0..n_kt {
            let lo = keys.lo + kt * key_tile;
            let hi = keys.lo + keys.n.min((kt + 1) * key_tile) - 1;
            if hi < first_min || lo > last_max {
                continue;
            }
            let full = (kt + 1) * key_tile <= keys.n;
            let dense = full && lo >= first_max && hi <= last_min;
            entries.push(kt * 2 + usize::from(!dense));
        }
    }
    offsets.push(n_qt + 1 + entries.len());
    offsets.into_iter().chain(entries).map(|x| x as i32).collect()
}

/// Shapes and scalars of one flash-attention launch.
#[derive(Clone, Copy, Debug)]
pub struct FlashShape {
    /// Query rows in the chunk.
    pub t: usize,
    pub keys: KeyRange,
    pub window: Option<usize>,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Multiplies Q·K before the softmax.
    pub scale: f32,
}

/// Attention of `t` query rows (`q`, f32, `n_head * head_dim` wide) over `keys.n` key and value rows
/// (`kc`, `vc`: f16, `n_kv_head * head_dim` wide, starting at the chunk's first key) into `out` (f32,
/// as wide as `q`). `pos`: the queries' positions; `plan`: `plan(...)` for the same arguments and
/// this variant's tiles.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_into(
    gpu: &Gpu,
    v: FlashVariant,
    s: FlashShape,
    q: &CudaView<'_, f32>,
    kc: &CudaView<'_, u16>,
    vc: &CudaView<'_, u16>,
    pos: &CudaView<'_, i32>,
    plan: &CudaView<'_, i32>,
    out: &mut CudaViewMut<'_, f32>,
) -> Result<(), CudaError> {
    if v.head_dim != s.head_dim {
        return Err(CudaError::UnsupportedHeadDim(s.head_dim));
    }
    let (qw, kvw) = (s.n_head * s.head_dim, s.n_kv_head * s.head_dim);
    let too_small = |what: &str, have: usize, need: usize| CudaError::Driver {
        what: format!("flash attention {what}"),
        err: format!("{have} elements, {need} needed"),
    };
    if q.len() < s.t * qw || out.len() < s.t * qw {
        return Err(too_small("queries or output", q.len().min(out.len()), s.t * qw));
    }
    if kc.len() < s.keys.n * kvw || vc.len() < s.keys.n * kvw {
        return Err(too_small("keys or values", kc.len().min(vc.len()), s.keys.n * kvw));
    }
    let name = v.kernel();
    let f = gpu.function(&name)?;
    let shared = v.shared_bytes();
    allow_dynamic_shared(&name, f, shared)?;
    let ints = |n: usize, what: &str| i32_of(n, what);
    let (t, nk, lo) = (
        ints(s.t, "t")?,
        ints(s.keys.n, "keys")?,
        ints(s.keys.lo, "key position")?,
    );
    let (win, qwi, kvwi) = (
        ints(s.window.unwrap_or(0), "window")?,
        ints(qw, "q width")?,
        ints(kvw, "kv width")?,
    );
    let group = ints(s.n_head / s.n_kv_head, "kv group")?;
    let scale_log2 = s.scale * std::f32::consts::LOG2_E;
    let mut b = gpu.launch_builder(f)?;
    b.arg(q)
        .arg(kc)
        .arg(vc)
        .arg(out)
        .arg(pos)
        .arg(plan)
        .arg(&t)
        .arg(&nk)
        .arg(&lo)
        .arg(&win)
        .arg(&qwi)
        .arg(&kvwi)
        .arg(&group)
        .arg(&scale_log2);
    let grid = (s.t.div_ceil(v.query_tile()) as u32, s.n_head as u32, 1);
    let cfg = LaunchConfig {
        shared_mem_bytes: shared as u32,
        ..launch_cfg(grid, v.threads())
    };
    driver(&name, unsafe { b.launch(cfg) })?;
    Ok(())
}

/// What a plan depends on: the span's query positions (spans of one pass may share a key range with
/// different queries), the window, the key range and the variant's tiles.
pub(crate) type PlanKey = (Vec<usize>, Option<usize>, KeyRange, FlashVariant);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_global_cache_gives_every_key_from_the_start() {
        let positions: Vec<usize> = (512..1024).collect();
        let k = key_range(&positions, None, (4096, 0, 0)).unwrap();
        assert_eq!(
            k,
            KeyRange {
                lo: 0,
                n: 1024,
                phys: 0
            }
        );
    }

    #[test]
    fn a_window_starts_at_the_first_query_window() {
        // Window 512, queries 600..700: the first query sees 89..=600.
        let positions: Vec<usize> = (600..700).collect();
        let k = key_range(&positions, Some(512), (8192, 0, 0)).unwrap();
        assert_eq!(
            k,
            KeyRange {
                lo: 89,
                n: 611,
                phys: 89
            }
        );
    }

    #[test]
    fn keys_that_wrap_around_a_ring_are_refused() {
        // A ring of 8 holding 12..20 from physical 4; queries 18, 19 with window 8 need 11..=19,
        // clamped to 12..=19: physical 4..8 then 0..4, which wraps.
        assert_eq!(key_range(&[18, 19], Some(8), (8, 12, 4)), None);
        // A staging buffer (origin physical 0) is contiguous.
        assert_eq!(
            key_range(&[18, 19], Some(8), (10, 12, 0)),
            Some(KeyRange { lo: 12, n: 8, phys: 0 })
        );
    }

    /// The plan's entries as (query tile, key tile, partial).
    fn entries(plan: &[i32]) -> Vec<(usize, usize, bool)> {
        let n_qt = plan[0] as usize - 1;
        (0..n_qt)
            .flat_map(|i| {
                (plan[i] as usize..plan[i + 1] as usize).map(move |e| (i, plan[e] as usize / 2, plan[e] % 2 == 1))
            })
            .collect()
    }

    #[test]
    fn a_causal_chunk_reads_the_lower_triangle_with_partial_diagonal_tiles() {
        // 128 queries at 0..128 over keys 0..128, tiles of 64: tile 0 sees key tile 0 (diagonal),
        // tile 1 sees key tile 0 whole and key tile 1 on its diagonal.
        let positions: Vec<usize> = (0..128).collect();
        let keys = key_range(&positions, None, (4096, 0, 0)).unwrap();
        let p = plan(&positions, None, keys, (64, 64));
        assert_eq!(entries(&p), vec![(0, 0, true), (1, 0, false), (1, 1, true)]);
    }

    #[test]
    fn a_chunk_after_a_prefix_reads_the_prefix_densely() {
        // 100 queries at 1000..1100 over keys 0..1100: 17 full key tiles below 1000 are dense for
        // both query tiles except where the diagonal or the short last tile cuts them.
        let positions: Vec<usize> = (1000..1100).collect();
        let keys = key_range(&positions, None, (4096, 0, 0)).unwrap();
        let e = entries(&plan(&positions, None, keys, (64, 64)));
        // Query tile 0 (1000..1064): key tiles 0..=16 (keys up to 1087); tile 15 holds 960..1023,
        // which query 1000 only partly sees; tile 16 (1024..1087) is cut by the diagonal.
        let t0: Vec<_> = e.iter().filter(|x| x.0 == 0).collect();
        assert_eq!(t0.len(), 17);
        assert!(t0[..15].iter().all(|x| !x.2));
        assert!(t0[15].2 && t0[16].2);
        // Query tile 1 (1064..1100): key tile 17 (1088..1099) is short, so partial.
        let t1: Vec<_> = e.iter().filter(|x| x.0 == 1).collect();
        assert_eq!(t1.len(), 18);
        assert!(t1[..16].iter().all(|x| !x.2));
        assert!(t1[16].2 && t1[17].2);
    }

    #[test]
    fn a_window_drops_the_tiles_behind_it() {
        // Window 100, queries 1000..1064 see keys from 901..=964 on: key range 901..1064, tiles of
        // 32 from 901. Only 965..=996 is seen whole by every query; the others meet a query that
        // misses part of them.
        let positions: Vec<usize> = (1000..1064).collect();
        let keys = key_range(&positions, Some(100), (4096, 0, 0)).unwrap();
        assert_eq!(keys.lo, 901);
        let e = entries(&plan(&positions, Some(100), keys, (64, 32)));
        assert_eq!(e.len(), keys.n.div_ceil(32));
        let dense: Vec<usize> = e.iter().filter(|x| !x.2).map(|x| x.1).collect();
        assert_eq!(dense, vec![2]);
        // A later query tile no longer lists the tiles its window has passed.
        let later: Vec<usize> = (1200..1264).collect();
        let keys = key_range(&later, Some(100), (4096, 0, 0)).unwrap();
        let all: Vec<usize> = (1000..1264).collect();
        let from_start = key_range(&all, Some(100), (4096, 0, 0)).unwrap();
        let e = entries(&plan(&all, Some(100), from_start, (64, 32)));
        let first_tile_of_last = e.iter().filter(|x| x.0 == 3).map(|x| x.1).min().unwrap();
        assert_eq!(from_start.lo + first_tile_of_last * 32, 1093);
        assert_eq!(keys.lo, 1101);
        // A window wider than the whole range changes nothing against no window.
        let wide = key_range(&positions, Some(5000), (4096, 0, 0)).unwrap();
        assert_eq!(
            plan(&positions, Some(5000), wide, (64, 64)),
            plan(&positions, None, wide, (64, 64))
        );
    }

    #[test]
    fn every_visible_pair_is_in_a_listed_tile_and_dense_tiles_hide_nothing() {
        // Exhaustive on a small case with a window: a pair (query, key) is visible iff its tile is
        // listed and, when dense, every pair of the tile is visible.
        for window in [None, Some(7), Some(70)] {
            let positions: Vec<usize> = (40..240).collect();
            let keys = key_range(&positions, window, (4096, 0, 0)).unwrap();
            let p = plan(&positions, window, keys, (128, 32));
            let listed = entries(&p);
            for (r, &pos) in positions.iter().enumerate() {
                for j in 0..keys.n {
                    let kp = keys.lo + j;
                    let visible = kp <= pos && kp >= first_key(pos, window);
                    let tile = listed.iter().find(|x| x.0 == r / 128 && x.1 == j / 32);
                    match tile {
                        None => assert!(!visible, "query {pos} key {kp} window {window:?}"),
                        Some(&(_, _, false)) => assert!(visible, "dense tile hides query {pos} key {kp}"),
                        Some(_) => {}
                    }
                }
            }
        }
    }
}
