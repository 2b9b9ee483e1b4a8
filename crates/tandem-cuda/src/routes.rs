//! Which kernel takes a call, decided from shapes alone (no GPU needed, so CI tests it).
//!
//! Matmul route tree, for `t` activation rows:
//! - `t == 1` (decode): `Matvec` — one warp per weight row reads the quantized blocks once; the
//!   step is memory-bound, so reading 4-6 bits per weight is what sets its speed. Unless cuBLAS over
//!   the f16 copy was measured faster for this matrix at load (`one_row_cublas`): then `Gemm` with one
//!   row, which reads 4x the bytes of Q4 weights but streams them at full bandwidth.
//! - `2 <= t <= BATCH_TUNED_MAX_ROWS` (decode batches, very short chunks): the route measured
//!   fastest for this matrix and row count at load (`BatchRoutes`, `tune::batch_routes`), among
//!   `Matvec` batched (the quantized weights read once for all rows; K-quants copy the rows into
//!   shared memory first, `int8::staged_batch`, other types apply each decoded weight unit to up to
//!   8 rows; on the integer variant of the one-row kernel's split that was fastest for that batch,
//!   so each row keeps its lone bits), `QuantMma` for Q4_K (the same single read, the integer
//!   products on the tensor cores, `qmma.rs`) and `Gemm` over the f16 copy (4x the bytes, on the
//!   tensor cores). The matvec's instructions grow with the rows, the other two barely do, so which
//!   wins depends on the shape.
//! - `BATCH_TUNED_MAX_ROWS < t <= DQMMA_MAX_ROWS` (larger decode batches): the route measured faster
//!   for this matrix at load at the top of the rows' bucket (`WIDE_ROWS`: 16, 32, 64), between
//!   `DequantMma` for Q4_K (`dqmma.rs`: the quantized weights read once per 32 rows and dequantized
//!   to f16 in registers, the products on the f16 tensor cores, over the same f16 activations cuBLAS
//!   reads) and `Gemm` over the f16 copy (3.6x the bytes).
//! - `t > DQMMA_MAX_ROWS` (prefill, larger decode batches): `Gemm` — tensor-core GEMM (cuBLAS,
//!   f16 operands, f32 accumulation) over an f16 copy of the weights made at load; prefill is
//!   compute-bound, so the weights are kept in the form the tensor cores read fastest, at 2 bytes per
//!   weight of memory. Matrices reading one input keep their copies side by side (a layer's q, k and
//!   v; its gate and up), so one GEMM can make all their products where that is faster: q, k and v
//!   in chunks of up to `STACKED_SPLIT_MAX_ROWS` rows (then cut apart by `split_columns`; where one
//!   span's chunk without QK-norm goes on to flash attention over the cache in place, cut, rotated
//!   and stored by one `split_rope_kv_store` instead, `project.rs`), gate and up below
//!   `STACKED_GATE_UP_MAX_ROWS` (`ffn.rs`, into one f16 buffer the gating kernel reads).
//! - `deterministic`: always `Matvec`, whose per-element summation order depends on the matrix width
//!   alone, so logits are bit-identical across chunk sizes and batch compositions. There, chunks of
//!   `int8::MMQ_MIN_ROWS` or more rows times Q4_K, Q6_K or Q8_0 matrices run the integer matvec's sums on
//!   the tensor cores (`mma.sync` s8 forms the same exact integers; the float steps follow the
//!   matvec lanes' order: `int8::mmq_takes`), so a prefill chunk's bits are still a decode step's.
//!
//! On the `Matvec` route, matrices that read one input with the same integer kernel (q, k and v;
//! gate and up) share one launch where load-time timing found that faster; each row's bits are those
//! of its own launch. The norm or gating kernel that makes such an input also writes it quantized.
//!
//! Attention route tree (`attention_route`), for a chunk of `t` queries:
//! - `t <= MATVEC_MAX_ROWS` (decode, very short chunks) or `deterministic`: `Tiles` — partial softmax
//!   per position-aligned key tile, merged in tile order by the last block to finish, in the same
//!   launch (`kernels/attention.cu`); the merge also writes the output projection's int8 input. A
//!   query meets the same tiles in the same order however it is chunked, so this is the bit-exact
//!   route; each query reads its keys itself, which is what a single decode query needs anyway.
//! - `t > MATVEC_MAX_ROWS` (prefill): `Flash` — blocks of 64 or 128 queries (`flash::chosen`: on
//!   sm_90, 128-wide heads take two warpgroups' `wgmma` products over 128-key tiles, chunks of up to
//!   64 rows one warpgroup; elsewhere `mma.sync` warps, 128 queries in long chunks) walk the key tiles
//!   with a running softmax, Q·Kᵀ and P·V on the tensor cores, the scores kept on chip (`flash.rs`):
//!   each key is read once per block, and tiles wholly outside the causal triangle or the window are
//!   never visited (the chunk's tile plan, made once and shared by its layers). It needs the chunk's
//!   keys contiguous in the buffer; where a ring wraps inside them, the chunk takes `Tiles`.
//!
//! On either route, what changes with the chunk is where the keys are read from (`KvRoute`: the cache
//! in place, or a staged copy when the chunk would overwrite ring rows its own early queries still
//! need), and which tiles the tile kernel's grid spans (`TileSpan`).

use tandem_model::kv::{ChunkRoute, RingPlacement};

use crate::matmul::kinds::{ActQuant, MmvqVariant};

/// The route settings a model keeps from its load (`CudaModel::routes`).
#[derive(Clone, Copy, Debug)]
pub struct RouteSettings {
    /// Every matmul on the matvec route: bit-identical logits across chunkings and batches.
    pub deterministic: bool,
    /// Rows up to which q, k and v take one stacked GEMM and a split (`STACKED_SPLIT_MAX_ROWS`
    /// unless `TANDEM_CUDA_STACKED_SPLIT_MAX_ROWS` says otherwise; 0 turns it off).
    pub stacked_split_max_rows: usize,
    /// Whether prefill chunks on the stacked q/k/v GEMM cut, rotate and store its product in one
    /// launch (`project.rs`; `TANDEM_CUDA_FUSED_QKV_STORE=0` turns it off, to compare).
    pub fused_qkv_store: bool,
}

/// Rows up to which a chunk takes the tile attention kernel rather than the flash kernel
/// (`attention_route`; a decode batch of any size takes its batched form, one row a sequence).
pub const MATVEC_MAX_ROWS: usize = 8;
/// Rows up to which each matrix's batch route is measured at load (`BatchRoutes`): one n-tile of the
/// `qmma` kernel's mma and the largest staged batch kernel. Past it every matrix with an f16 copy
/// takes cuBLAS: at 16 rows cuBLAS was faster than qmma with two n-tiles on every 8B shape (gate and
/// up 60 against 67 µs).
pub const BATCH_TUNED_MAX_ROWS: usize = 8;
/// Rows up to which a matrix's decode batches past `BATCH_TUNED_MAX_ROWS` may take the dequantizing
/// tensor-core kernel (`dqmma::MAX_ROWS`), as measured at load for each bucket of `WIDE_ROWS`.
pub const DQMMA_MAX_ROWS: usize = 64;
/// The tops of the row buckets past `BATCH_TUNED_MAX_ROWS` whose route is measured at load (at the
/// top row count, the bucket's costliest for a kernel whose work grows with the rows): 9-16, 17-32,
/// 33-64.
pub const WIDE_ROWS: [usize; 3] = [16, 32, DQMMA_MAX_ROWS];
/// Keys per attention tile (must match `ATT_TILE` in `kernels/tiles.cuh`).
pub const ATT_TILE: usize = 128;
/// Threads of an attention block (must match `ATT_THREADS` in `kernels/tiles.cuh`).
pub const ATT_THREADS: usize = 256;
/// Rows one matvec block batches (must match `MV_BATCH` in `kernels/quant.cu`).
pub const MV_BATCH: usize = 8;

/// Waves of tile attention blocks (a block per query head and tile, two a multiprocessor at the
/// kernel's 128 registers a thread) past which a block takes all of its KV head's query heads instead.
pub const ATT_GROUP_WAVES: usize = 2;

/// Live key tiles from which a block of the tile attention kernel takes all of its KV head's query
/// heads, over one load of the tile's K and V, instead of its own head (`attend_tiles_body` in
/// `kernels/attention.cu`), for a chunk of `t` queries: where a block per query head would take more
/// than `ATT_GROUP_WAVES` waves of the multiprocessors for one query. A chunk then loads each tile
/// once per KV head instead of once per query head (deterministic pp512 at depth 4,096: +42%); one
/// query measured no faster (`usize::MAX`: never). Each head's partial is the same either way.
pub fn attention_group_tiles(t: usize, n_head: usize, sm_count: usize) -> usize {
    if t <= 1 {
        return usize::MAX;
    }
    ATT_GROUP_WAVES * 2 * sm_count / n_head.max(1) + 1
}

/// Whether the fused decode attention kernel has a form taking `heads` query heads of a KV head a
/// block in a deep context (`attend_rope_h<NH>_d<D>`: two, at head size 64 or 128; 1:
/// `attend_rope_d<D>`, every shape): the heads must divide each KV head's group.
pub fn decode_attention_heads_fit(n_head: usize, n_kv_head: usize, head_dim: usize, heads: usize) -> bool {
    if heads == 1 {
        return true;
    }
    let grouped = n_kv_head > 0 && n_head.is_multiple_of(n_kv_head);
    grouped && heads == 2 && matches!(head_dim, 64 | 128) && (n_head / n_kv_head).is_multiple_of(heads)
}

/// Query heads of one KV head a block of the fused decode attention kernel takes together once the
/// live tiles outnumber its blocks a head (`attend_decode` in `kernels/attention.cu`): each tile's K
/// and V are then loaded and converted once for both, and their sums interleave. Two where the
/// group divides evenly and the head size has the kernel.
pub fn decode_attention_heads(n_head: usize, n_kv_head: usize, head_dim: usize) -> usize {
    if decode_attention_heads_fit(n_head, n_kv_head, head_dim, 2) {
        2
    } else {
        1
    }
}

/// Blocks of the fused decode attention kernel (`attend_rope_d<D>`, `attend_rope_h<NH>_d<D>`) a
/// multiprocessor holds: two at 128 registers a thread up to head size 128, one above.
pub fn decode_attention_blocks_per_sm(head_dim: usize) -> usize {
    if head_dim <= 128 {
        2
    } else {
        1
    }
}

/// Blocks per query head of the fused decode attention kernel (`attend_decode` in
/// `kernels/attention.cu`): as many as one wave of the multiprocessors holds for all heads, and never
/// more than the tiles the grid spans. Each block takes an even share of the live tiles one after
/// another, so a deep context runs in one wave of blocks that each stream several tiles (a block per
/// tile and head took 4.1 waves at 4,096 keys on the 8B). Up to that many live tiles it is a block per
/// tile.
pub fn decode_attention_splits(tile_cap: usize, n_head: usize, head_dim: usize, sm_count: usize) -> usize {
    let wave = decode_attention_blocks_per_sm(head_dim) * sm_count / n_head.max(1);
    wave.clamp(1, tile_cap.max(1))
}

/// Head sizes the tile attention kernel takes: it splits a row into 8-dimension chunks shared evenly
/// by a warp's lanes, and its merge gives each lane dimensions l, l + 32, ... (`kernels/attention.cu`).
pub fn head_dim_supported(head_dim: usize) -> bool {
    head_dim.is_power_of_two() && (32..=256).contains(&head_dim)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulRoute {
    Matvec,
    QuantMma,
    DequantMma,
    Gemm,
}

/// The bucket of `WIDE_ROWS` that `t` rows fall in (`None` at or below `BATCH_TUNED_MAX_ROWS` and
/// past `DQMMA_MAX_ROWS`).
pub fn wide_bucket(t: usize) -> Option<usize> {
    match t {
        0..=BATCH_TUNED_MAX_ROWS => None,
        _ => WIDE_ROWS.iter().position(|&top| t <= top),
    }
}

/// A matrix's route for each batch of 2 to `BATCH_TUNED_MAX_ROWS` rows, as measured at load: which
/// kernel wins moved with the shape and the rows on the 8B Q4_K_M (cuBLAS from 3 rows on its Q6_K
/// down projection, from 4 on its Q6_K v, the tensor-core `qmma` on Q4_K from 2), so a fixed row count per route left time on several shapes. On the matvec route, also
/// the integer variant a batch of that size takes where it differs from the one-row kernel's
/// (`matvec_variant`): one of the same split, so each row keeps its lone bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRoutes {
    routes: [MatmulRoute; BATCH_TUNED_MAX_ROWS - 1],
    variants: [Option<MmvqVariant>; BATCH_TUNED_MAX_ROWS - 1],
    /// The route of each bucket of `WIDE_ROWS` (`Gemm` unless `DequantMma` was measured faster).
    wide: [MatmulRoute; WIDE_ROWS.len()],
}

impl BatchRoutes {
    /// Every batch on the matvec: deterministic mode, or a matrix with no other route to take.
    pub const MATVEC: BatchRoutes = BatchRoutes {
        routes: [MatmulRoute::Matvec; BATCH_TUNED_MAX_ROWS - 1],
        variants: [None; BATCH_TUNED_MAX_ROWS - 1],
        wide: [MatmulRoute::Gemm; WIDE_ROWS.len()],
    };

    /// The routes `route(t)` gives for t = 2 ..= `BATCH_TUNED_MAX_ROWS`, each matvec batch on the
    /// one-row kernel's variant.
    #[cfg(test)]
    pub fn from_fn(mut route: impl FnMut(usize) -> MatmulRoute) -> Self {
        Self::with_variants(|t| (route(t), None))
    }

    /// The routes and matvec variants `choice(t)` gives for t = 2 ..= `BATCH_TUNED_MAX_ROWS` (a
    /// variant is kept only with the matvec route).
    pub fn with_variants(mut choice: impl FnMut(usize) -> (MatmulRoute, Option<MmvqVariant>)) -> Self {
        let chosen: [(MatmulRoute, Option<MmvqVariant>); BATCH_TUNED_MAX_ROWS - 1] =
            std::array::from_fn(|i| choice(i + 2));
        BatchRoutes {
            routes: chosen.map(|c| c.0),
            variants: chosen.map(|(r, v)| v.filter(|_| r == MatmulRoute::Matvec)),
            wide: [MatmulRoute::Gemm; WIDE_ROWS.len()],
        }
    }

    /// These routes with `wide` for the buckets of `WIDE_ROWS` (only `DequantMma` or `Gemm`).
    pub fn with_wide(self, wide: [MatmulRoute; WIDE_ROWS.len()]) -> Self {
        let wide = wide.map(|r| match r {
            MatmulRoute::DequantMma => r,
            _ => MatmulRoute::Gemm,
        });
        BatchRoutes { wide, ..self }
    }

    /// The route of `t` rows, 2 ..= `DQMMA_MAX_ROWS` (smaller counts as 2, larger as `Gemm`).
    pub fn at(&self, t: usize) -> MatmulRoute {
        match wide_bucket(t) {
            Some(k) => self.wide[k],
            None if t > BATCH_TUNED_MAX_ROWS => MatmulRoute::Gemm,
            None => self.routes[t.clamp(2, BATCH_TUNED_MAX_ROWS) - 2],
        }
    }

    /// The integer variant a matvec batch of `t` rows takes: the one measured for it, else `one_row`
    /// (one row, batches past `BATCH_TUNED_MAX_ROWS`, or nothing measured).
    pub fn matvec_variant(&self, t: usize, one_row: MmvqVariant) -> MmvqVariant {
        match t {
            2..=BATCH_TUNED_MAX_ROWS => self.variants[t - 2].unwrap_or(one_row),
            _ => one_row,
        }
    }

    /// Runs of rows and their route, for `--verbose`: `2-3 matvec, 4-8 qmma` (a matvec run on a
    /// variant of its own names it: `2 matvec u2r2s1`).
    pub fn describe(&self) -> String {
        let name = |t: usize| match (self.at(t), self.variants[t - 2]) {
            (MatmulRoute::Matvec, Some(v)) => format!("matvec {}", v.label()),
            (MatmulRoute::Matvec, None) => "matvec".to_string(),
            (MatmulRoute::QuantMma, _) => "qmma".to_string(),
            (MatmulRoute::DequantMma, _) => "dqmma".to_string(),
            (MatmulRoute::Gemm, _) => "cuBLAS".to_string(),
        };
        let mut runs: Vec<(usize, usize, String)> = Vec::new();
        let tops = (2..=BATCH_TUNED_MAX_ROWS).map(|t| (t, t)).chain(
            WIDE_ROWS.iter().scan(BATCH_TUNED_MAX_ROWS, |lo, &top| {
                Some((std::mem::replace(lo, top) + 1, top))
            }),
        );
        for (lo, t) in tops {
            let n = match self.at(t) {
                MatmulRoute::DequantMma => "dqmma".to_string(),
                MatmulRoute::Gemm if t > BATCH_TUNED_MAX_ROWS => "cuBLAS".to_string(),
                _ => name(t),
            };
            match runs.last_mut() {
                Some(run) if run.2 == n => run.1 = t,
                _ => runs.push((lo, t, n)),
            }
        }
        runs.iter()
            .map(|(lo, hi, r)| match lo == hi {
                true => format!("{lo} {r}"),
                false => format!("{lo}-{hi} {r}"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The route for `t` rows of a matrix; `one_row_cublas`: the load-time measurement found cuBLAS over
/// the f16 copy faster than every matvec family for one row of this matrix; `batch`: the routes
/// measured for batches of up to `BATCH_TUNED_MAX_ROWS` rows.
pub fn matmul_route(t: usize, deterministic: bool, one_row_cublas: bool, batch: &BatchRoutes) -> MatmulRoute {
    if deterministic {
        MatmulRoute::Matvec
    } else if t <= 1 {
        if one_row_cublas {
            MatmulRoute::Gemm
        } else {
            MatmulRoute::Matvec
        }
    } else if t <= DQMMA_MAX_ROWS {
        batch.at(t)
    } else {
        MatmulRoute::Gemm
    }
}

/// Rows below which gate and up take one GEMM over their stacked f16 copies rather than two GEMMs
/// writing side by side. Measured on the H200 (`tandem-dev bench gemm`, Llama-3-8B shapes, f16
/// out): one 28672-row GEMM 168 µs against two 14336-row ones 183 µs at 512 rows, but 1,342 against
/// 1,287 µs at 4096 rows.
pub const STACKED_GATE_UP_MAX_ROWS: usize = 2048;

/// Whether `t` rows of gate and up take one GEMM (`stacked`: their copies are adjacent in memory).
pub fn gate_up_in_one_gemm(t: usize, stacked: bool) -> bool {
    stacked && t < STACKED_GATE_UP_MAX_ROWS
}

/// Rows up to which matrices reading one input on the GEMM route (q, k and v) take one GEMM over
/// their stacked f16 copies, its products then cut apart by `split_columns`, rather than a GEMM each.
/// The stacked GEMM fills the GPU where k's and v's 1024 rows alone do not, but the split moves every
/// product once more. H200, Llama-3-8B shapes (`tandem-dev bench gemm`): at
/// 512 rows three GEMMs 58.1 µs, the stacked one 43.9 and with the split 51.9 (1.12x; pp512 and
/// pp4096 at 512-row micro-batches 1.01x end to end); at 1024 rows 0.95x, at 2048 0.90x, at 4096
/// 0.86x. `TANDEM_CUDA_STACKED_SPLIT_MAX_ROWS` overrides it (0: off).
pub const STACKED_SPLIT_MAX_ROWS: usize = 512;

/// Whether `t` rows take the stacked GEMM and split (`max_rows`: `STACKED_SPLIT_MAX_ROWS` or its
/// override). Short batches stay on their own routes: the GEMM route starts above them.
pub fn stacked_gemm_and_split(t: usize, max_rows: usize) -> bool {
    t > BATCH_TUNED_MAX_ROWS && t <= max_rows
}

/// Rows of a chunk or decode batch up to which a mixture's routed experts take the indexed route
/// (one launch a matrix, each (row, slot) pair reading its expert through the device's address
/// table: no id comes back to the host, so the step can be captured). Each pair reads its expert's
/// weights itself: 8 rows of 8 slots read 64 expert matrices where the grouped route reads each
/// distinct expert once (about 50 of 128 for uniform routing), and past that the grouped route's
/// single read per expert outweighs the host round trip.
pub const INDEXED_EXPERTS_MAX_ROWS: usize = 8;

/// How a mixture's routed experts are computed for a chunk (`model/experts.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertRoute {
    /// Ids stay on the device; one launch a matrix over every (row, slot) pair (`matmul::indexed`).
    Indexed,
    /// Ids stay on the device, which sorts the pairs by expert; one tensor-core launch a matrix over
    /// tiles of one expert's pairs (`matmul::indexed::mmq_ids_into`).
    Sorted,
    /// Ids read back; each routed expert's rows gathered and run through the dense ops (experts
    /// without tables: in host memory, or of a type the integer kernels lack).
    Grouped,
}

/// The route of `t` rows through a mixture: `indexed` when its expert tensors all have address
/// tables, `sorted` when the grouped tensor-core kernels also take all three
/// (`ExpertTable::groups_on_tensor_cores`). Every route gives each row the bits of its experts' own
/// one-row products where products are row-exact (deterministic mode, whose variants are split 1),
/// so a step's bits do not depend on the route.
pub fn expert_route(t: usize, indexed: bool, sorted: bool) -> ExpertRoute {
    match (indexed, sorted) {
        (true, _) if t <= INDEXED_EXPERTS_MAX_ROWS => ExpertRoute::Indexed,
        (true, true) => ExpertRoute::Sorted,
        _ => ExpertRoute::Grouped,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionRoute {
    Tiles,
    Flash,
}

/// The attention route for a chunk of `t` queries (see the route tree above).
pub fn attention_route(t: usize, deterministic: bool) -> AttentionRoute {
    if deterministic || t <= MATVEC_MAX_ROWS {
        AttentionRoute::Tiles
    } else {
        AttentionRoute::Flash
    }
}

/// The tiles an attention launch covers: `lo .. lo + n`, aligned to absolute positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileSpan {
    pub lo: usize,
    pub n: usize,
}

/// The tiles a batched decode step's attention grid spans, given the furthest row's position: a bound
/// on any row's `tile_span(..).n` (at most `p / ATT_TILE + 1`), rounded up to a power of two so that a
/// graph captured for it serves the sequences' next steps until the furthest context doubles (a
/// decode graph's grid is fixed). The caller also caps it at the most a row's cache can hold.
pub fn batch_tiles(max_position: usize) -> usize {
    (max_position / ATT_TILE + 1).next_power_of_two()
}

/// The first position a query at `p` sees (`window`: keys from `p + 1 - window`).
pub fn first_key(p: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (p + 1).saturating_sub(w))
}

/// Tiles that hold any key a query at `positions` may see (`window`: keys from `p + 1 - window`),
/// given that the cache holds positions from `origin` on.
pub fn tile_span(positions: &[usize], window: Option<usize>, origin: usize) -> TileSpan {
    let first = positions
        .iter()
        .map(|&p| first_key(p, window).max(origin))
        .min()
        .unwrap_or(0);
    let last = positions.iter().copied().max().unwrap_or(0);
    let lo = first / ATT_TILE;
    TileSpan {
        lo,
        n: last / ATT_TILE + 1 - lo,
    }
}

/// Where a chunk's attention reads its keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvRoute {
    /// Store the chunk into the cache, attend from the cache in place.
    InPlace,
    /// Copy the cache rows `gather` (physical, in logical order from `first`) into a staging buffer,
    /// append the chunk there, attend from it, then commit the chunk to the cache.
    Staged { first: usize, gather: Vec<usize> },
}

/// The route of a chunk of `t` rows, from the CPU cache's placement logic.
pub fn kv_route(placement: &RingPlacement, t: usize, window: Option<usize>) -> KvRoute {
    match placement.route(t, window) {
        ChunkRoute::StoreThenAttend => KvRoute::InPlace,
        ChunkRoute::Staged { retained_from } => KvRoute::Staged {
            first: retained_from,
            gather: (retained_from..placement.end())
                .map(|p| placement.physical(p).expect("retained rows are cached"))
                .collect(),
        },
    }
}

/// Physical rows (`-1`: evicted within the chunk) that `t` appended rows land on, for `kv_store`.
pub fn store_rows(placement: &RingPlacement, t: usize) -> (Vec<i32>, RingPlacement) {
    let (rows, after) = placement.append(t);
    (rows.into_iter().map(|r| r.map_or(-1, |r| r as i32)).collect(), after)
}

/// How the tile attention's merge writes the output projection's int8 input (`want`: the format
/// that projection's kernel reads, if it takes the integer route): the heads merged together and the
/// format. A Q8_K block spans 256 / head_dim heads, so the last block of such a group merges all of
/// them; Q8 blocks (32) lie within a head. Rows that are not whole Q8_K blocks (SmolLM2's 576) are
/// left to the matmul to quantize.
pub fn attention_merge(want: Option<ActQuant>, q_width: usize, head_dim: usize) -> (usize, Option<ActQuant>) {
    match want {
        Some(ActQuant::Q8K) if q_width.is_multiple_of(256) && head_dim <= 256 => (256 / head_dim, want),
        Some(ActQuant::Q8) if head_dim.is_multiple_of(32) => (1, want),
        _ => (1, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tile_size_matches_the_attention_kernel() {
        // The launch gives a block ATT_THREADS threads and the host's tile spans assume its tiles.
        let body = crate::runtime::nvrtc::TILES.body;
        for line in [
            format!("#define ATT_TILE {ATT_TILE}"),
            format!("#define ATT_THREADS {ATT_THREADS}"),
        ] {
            assert!(body.lines().any(|l| l.trim() == line), "{line} in tiles.cuh");
        }
    }

    #[test]
    fn experts_keep_their_ids_on_the_device_wherever_tables_allow() {
        for t in 1..=INDEXED_EXPERTS_MAX_ROWS {
            assert_eq!(expert_route(t, true, true), ExpertRoute::Indexed);
            assert_eq!(expert_route(t, true, false), ExpertRoute::Indexed);
            assert_eq!(expert_route(t, false, false), ExpertRoute::Grouped);
        }
        for t in [INDEXED_EXPERTS_MAX_ROWS + 1, 512, 8192] {
            assert_eq!(expert_route(t, true, true), ExpertRoute::Sorted);
            // Tables the grouped kernels do not take (another type): ids come back to the host.
            assert_eq!(expert_route(t, true, false), ExpertRoute::Grouped);
            // No tables (experts in host memory): likewise.
            assert_eq!(expert_route(t, false, false), ExpertRoute::Grouped);
        }
        // A decode step of one sequence always has a route a graph can replay.
        assert_eq!(expert_route(1, true, false), ExpertRoute::Indexed);
    }

    #[test]
    fn gate_and_up_share_a_gemm_only_for_shorter_chunks_of_stacked_copies() {
        assert!(gate_up_in_one_gemm(512, true));
        assert!(gate_up_in_one_gemm(STACKED_GATE_UP_MAX_ROWS - 1, true));
        assert!(!gate_up_in_one_gemm(STACKED_GATE_UP_MAX_ROWS, true));
        assert!(!gate_up_in_one_gemm(4096, true));
        // Operands not stacked at load: always two GEMMs.
        assert!(!gate_up_in_one_gemm(512, false));
    }

    #[test]
    fn only_prefill_chunks_up_to_the_limit_take_the_stacked_gemm() {
        assert!(stacked_gemm_and_split(512, STACKED_SPLIT_MAX_ROWS));
        assert!(stacked_gemm_and_split(STACKED_SPLIT_MAX_ROWS, STACKED_SPLIT_MAX_ROWS));
        assert!(!stacked_gemm_and_split(
            STACKED_SPLIT_MAX_ROWS + 1,
            STACKED_SPLIT_MAX_ROWS
        ));
        assert!(
            !stacked_gemm_and_split(BATCH_TUNED_MAX_ROWS, 4096),
            "decode batches keep their routes"
        );
        assert!(stacked_gemm_and_split(BATCH_TUNED_MAX_ROWS + 1, 4096));
        assert!(!stacked_gemm_and_split(512, 0), "an override of 0 turns it off");
    }

    #[test]
    fn the_attention_merge_groups_heads_into_whole_q8k_blocks() {
        // Llama-3-8B: 32 heads of 128, a Q8_K block per two heads.
        assert_eq!(
            attention_merge(Some(ActQuant::Q8K), 4096, 128),
            (2, Some(ActQuant::Q8K))
        );
        // Gemma 3 270M: 4 heads of 256, a block per head; SmolLM2: 9 heads of 64 are 576 wide.
        assert_eq!(
            attention_merge(Some(ActQuant::Q8K), 1024, 256),
            (1, Some(ActQuant::Q8K))
        );
        assert_eq!(attention_merge(Some(ActQuant::Q8K), 576, 64), (1, None));
        assert_eq!(attention_merge(Some(ActQuant::Q8K), 2048, 64), (4, Some(ActQuant::Q8K)));
        // Q8 blocks lie within a head; no integer reader, no quantization.
        assert_eq!(attention_merge(Some(ActQuant::Q8), 576, 64), (1, Some(ActQuant::Q8)));
        assert_eq!(attention_merge(None, 4096, 128), (1, None));
    }

    #[test]
    fn attention_groups_heads_of_chunks_past_two_waves_of_blocks_and_never_for_one_query() {
        // The 8B on an H200: 32 heads, 132 multiprocessors, two blocks each: 16 tiles are two waves.
        assert_eq!(attention_group_tiles(512, 32, 132), 17);
        assert_eq!(attention_group_tiles(2, 4, 132), 133);
        assert_eq!(attention_group_tiles(8, 0, 132), 529);
        assert_eq!(attention_group_tiles(1, 32, 132), usize::MAX);
    }

    #[test]
    fn attention_takes_power_of_two_heads_from_32_to_256() {
        for hd in [32, 64, 128, 256] {
            assert!(head_dim_supported(hd), "{hd}");
        }
        // 16: the merge's lanes would hold no dimension.
        for hd in [8, 16, 80, 96, 512] {
            assert!(!head_dim_supported(hd), "{hd}");
        }
    }

    fn filled(capacity: usize, n: usize) -> RingPlacement {
        RingPlacement::new(capacity).append(n).1
    }

    #[test]
    fn decode_attention_takes_two_heads_of_a_group_where_they_divide_it() {
        // The 8B (32 over 8), gemma3-27b (32 over 16), SmolLM2 (9 over 3).
        assert_eq!(decode_attention_heads(32, 8, 128), 2);
        assert_eq!(decode_attention_heads(32, 16, 128), 2);
        assert_eq!(decode_attention_heads(9, 3, 64), 1);
        // Head sizes without such a kernel, and heads that do not split over the KV heads.
        assert_eq!(decode_attention_heads(4, 1, 256), 1);
        assert_eq!(decode_attention_heads(8, 2, 32), 1);
        assert_eq!(decode_attention_heads(8, 3, 128), 1);
        assert_eq!(decode_attention_heads(8, 0, 128), 1);
        assert!(decode_attention_heads_fit(32, 8, 128, 1));
        assert!(!decode_attention_heads_fit(32, 8, 128, 4));
        assert!(!decode_attention_heads_fit(9, 3, 64, 2));
    }

    #[test]
    fn decode_attention_fills_one_wave_and_never_spans_more_blocks_than_tiles() {
        // The 8B on the H200: 32 heads of 128, two blocks a multiprocessor, 132 multiprocessors.
        assert_eq!(decode_attention_splits(65, 32, 128, 132), 8);
        assert_eq!(decode_attention_splits(3, 32, 128, 132), 3);
        // Head size 256 holds one block a multiprocessor.
        assert_eq!(decode_attention_splits(65, 16, 256, 132), 8);
        // More heads than blocks in a wave: still one block a head.
        assert_eq!(decode_attention_splits(65, 512, 128, 132), 1);
        assert_eq!(decode_attention_splits(0, 32, 128, 132), 1);
        // A batched step shares the wave among its rows' heads: 64 rows of 32 heads, one block a head.
        assert_eq!(decode_attention_splits(3, 32 * 64, 128, 132), 1);
        assert_eq!(decode_attention_splits(17, 32 * 2, 128, 132), 4);
    }

    #[test]
    fn decode_takes_the_matvec_and_prefill_the_gemm() {
        let m = BatchRoutes::MATVEC;
        assert_eq!(matmul_route(1, false, false, &m), MatmulRoute::Matvec);
        assert_eq!(
            matmul_route(BATCH_TUNED_MAX_ROWS, false, false, &m),
            MatmulRoute::Matvec
        );
        assert_eq!(
            matmul_route(BATCH_TUNED_MAX_ROWS + 1, false, false, &m),
            MatmulRoute::Gemm
        );
        assert_eq!(matmul_route(512, false, false, &m), MatmulRoute::Gemm);
        // Deterministic mode: the matvec's order at every row count.
        assert_eq!(matmul_route(512, true, false, &m), MatmulRoute::Matvec);
    }

    #[test]
    fn small_batches_take_the_route_measured_for_their_rows() {
        let b = BatchRoutes::from_fn(|t| match t {
            2 => MatmulRoute::Matvec,
            3..=5 => MatmulRoute::QuantMma,
            _ => MatmulRoute::Gemm,
        });
        assert_eq!(matmul_route(2, false, false, &b), MatmulRoute::Matvec);
        assert_eq!(matmul_route(3, false, false, &b), MatmulRoute::QuantMma);
        assert_eq!(matmul_route(5, false, true, &b), MatmulRoute::QuantMma);
        assert_eq!(matmul_route(6, false, false, &b), MatmulRoute::Gemm);
        assert_eq!(matmul_route(8, false, false, &b), MatmulRoute::Gemm);
        // One row and deterministic mode never read the batch table.
        assert_eq!(matmul_route(1, false, false, &b), MatmulRoute::Matvec);
        assert_eq!(matmul_route(3, true, false, &b), MatmulRoute::Matvec);
        assert_eq!(b.describe(), "2 matvec, 3-5 qmma, 6-64 cuBLAS");
        assert_eq!(BatchRoutes::MATVEC.describe(), "2-8 matvec, 9-64 cuBLAS");
    }

    #[test]
    fn batches_past_eight_rows_take_the_route_measured_for_their_bucket_up_to_64() {
        assert_eq!(
            [8, 9, 16, 17, 32, 33, 64, 65].map(wide_bucket),
            [None, Some(0), Some(0), Some(1), Some(1), Some(2), Some(2), None]
        );
        let dq = MatmulRoute::DequantMma;
        let b = BatchRoutes::from_fn(|_| MatmulRoute::QuantMma).with_wide([dq, dq, MatmulRoute::Gemm]);
        assert_eq!(matmul_route(8, false, false, &b), MatmulRoute::QuantMma);
        assert_eq!(matmul_route(9, false, false, &b), dq);
        assert_eq!(matmul_route(32, false, false, &b), dq);
        assert_eq!(matmul_route(33, false, false, &b), MatmulRoute::Gemm);
        assert_eq!(matmul_route(65, false, false, &b), MatmulRoute::Gemm);
        assert_eq!(matmul_route(512, false, false, &b), MatmulRoute::Gemm);
        assert_eq!(matmul_route(16, true, false, &b), MatmulRoute::Matvec);
        assert_eq!(b.describe(), "2-8 qmma, 9-32 dqmma, 33-64 cuBLAS");
        // Only the dequantizing kernel or cuBLAS take those buckets.
        let odd = BatchRoutes::MATVEC.with_wide([MatmulRoute::QuantMma, MatmulRoute::Matvec, dq]);
        assert_eq!(odd.describe(), "2-8 matvec, 9-32 cuBLAS, 33-64 dqmma");
    }

    #[test]
    fn a_matvec_batch_takes_the_variant_measured_for_its_rows_and_else_the_one_rows() {
        let one = MmvqVariant {
            unroll: 1,
            rows: 2,
            split: 1,
            staged: true,
        };
        let u2 = MmvqVariant {
            unroll: 2,
            rows: 2,
            split: 1,
            staged: false,
        };
        let b = BatchRoutes::with_variants(|t| match t {
            2 => (MatmulRoute::Matvec, None),
            3..=4 => (MatmulRoute::Matvec, Some(u2)),
            // A variant beside another route is dropped.
            _ => (MatmulRoute::QuantMma, Some(u2)),
        });
        assert_eq!(b.matvec_variant(2, one), one);
        assert_eq!(b.matvec_variant(3, one), u2);
        assert_eq!(b.matvec_variant(4, one), u2);
        assert_eq!(b.matvec_variant(5, one), one);
        assert_eq!(b.matvec_variant(1, one), one);
        assert_eq!(b.matvec_variant(BATCH_TUNED_MAX_ROWS + 1, one), one);
        assert_eq!(b.describe(), "2 matvec, 3-4 matvec u2r2s1, 5-8 qmma, 9-64 cuBLAS");
        assert_eq!(BatchRoutes::MATVEC.matvec_variant(4, one), one);
    }

    #[test]
    fn one_row_takes_cublas_only_where_the_load_time_timing_found_it_faster() {
        let m = BatchRoutes::MATVEC;
        assert_eq!(matmul_route(1, false, true, &m), MatmulRoute::Gemm);
        assert_eq!(matmul_route(2, false, true, &m), MatmulRoute::Matvec);
        assert_eq!(matmul_route(1, true, true, &m), MatmulRoute::Matvec);
    }

    #[test]
    fn prefill_chunks_attend_on_the_tensor_cores_except_in_deterministic_mode() {
        assert_eq!(attention_route(1, false), AttentionRoute::Tiles);
        assert_eq!(attention_route(MATVEC_MAX_ROWS, false), AttentionRoute::Tiles);
        assert_eq!(attention_route(MATVEC_MAX_ROWS + 1, false), AttentionRoute::Flash);
        assert_eq!(attention_route(512, true), AttentionRoute::Tiles);
    }

    #[test]
    fn a_batched_steps_tiles_bound_every_row_and_double_as_the_context_grows() {
        for p in [0, 1, 127, 128, 129, 255, 256, 1000, 4095, 4096, 70_000] {
            let tiles = batch_tiles(p);
            assert!(tiles.is_power_of_two(), "{p}");
            // Any row at or before p, with or without a window, spans no more.
            for (q, window) in [(p, None), (p, Some(512)), (p / 2, None), (0, None)] {
                assert!(tile_span(&[q], window, 0).n <= tiles, "{q} {window:?}");
            }
            assert!(tiles < 2 * (p / ATT_TILE + 1), "{p}: {tiles}");
        }
        assert_eq!(batch_tiles(127), 1);
        assert_eq!(batch_tiles(128), 2);
        assert_eq!(batch_tiles(383), 4);
        assert_eq!(batch_tiles(512), 8);
    }

    #[test]
    fn tiles_are_aligned_to_absolute_positions() {
        // One decode query at 300 over a global cache: tiles 0, 1, 2.
        assert_eq!(tile_span(&[300], None, 0), TileSpan { lo: 0, n: 3 });
        // Window 128 at position 300 sees 173..=300: tiles 1 and 2.
        assert_eq!(tile_span(&[300], Some(128), 0), TileSpan { lo: 1, n: 2 });
        // A chunk 256..512 with window 512 starts from position 0.
        let chunk: Vec<usize> = (256..512).collect();
        assert_eq!(tile_span(&chunk, Some(512), 0), TileSpan { lo: 0, n: 4 });
        // A staged buffer from position 600 never spans tiles before 600's.
        assert_eq!(tile_span(&[1000], Some(512), 600), TileSpan { lo: 4, n: 4 });
    }

    #[test]
    fn a_chunk_that_fits_is_stored_in_place() {
        let p = filled(512, 100);
        assert_eq!(kv_route(&p, 64, Some(512)), KvRoute::InPlace);
        assert_eq!(kv_route(&filled(512, 600), 1, Some(512)), KvRoute::InPlace);
    }

    #[test]
    fn a_chunk_meeting_a_wrapped_ring_stages_the_retained_rows_in_logical_order() {
        // Ring of 8 holding positions 12..20 (origin physical 4), window 8, a chunk of 4 at 20..24.
        let p = filled(8, 20);
        assert_eq!(p.origin_logical, 12);
        assert_eq!(p.origin_physical, 4);
        match kv_route(&p, 4, Some(8)) {
            KvRoute::Staged { first, gather } => {
                // Query 20 sees 13..=20: retained rows 13..20, physical 5, 6, 7, 0, 1, 2, 3.
                assert_eq!(first, 13);
                assert_eq!(gather, vec![5, 6, 7, 0, 1, 2, 3]);
            }
            other => panic!("expected staging, got {other:?}"),
        }
    }

    #[test]
    fn store_rows_skip_rows_the_ring_evicts_within_the_chunk() {
        let p = filled(4, 2);
        let (rows, after) = store_rows(&p, 5);
        // Positions 2..7 into a ring of 4 holding 0..2: only the last four survive.
        assert_eq!(rows, vec![-1, 3, 0, 1, 2]);
        assert_eq!(after.origin_logical, 3);
        assert_eq!(after.len, 4);
    }
}
