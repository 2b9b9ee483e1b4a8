//! Attention over an f16 KV cache, one query row at a time, in fixed tiles of keys.
//!
//! Keys are walked in tiles of `KV_TILE` logical positions, aligned to absolute positions, in increasing
//! order. A query at position `p` sees keys `lo(p) ..= p`, where `lo(p) = p + 1 - window` for
//! sliding-window layers and 0 otherwise; tiles outside that range are never read. Everything a query's
//! result depends on (its position, its tiles, the order of operations) is fixed by the query alone, so
//! a row gets the same bits whether it came in a prefill chunk of 512 rows or as a single decode step,
//! and whichever thread ran it.
//!
//! The arithmetic reproduces llama.cpp's CPU attention (the one its reference outputs come from): the
//! query is rounded to f16 like the f16 keys it meets, scores are scaled and soft-maxed in f32 with the
//! normalizer summed in f64, and each probability is rounded to f16 before it weights its value row.
//! So the softmax runs in three sweeps over the tiles (scores and their maximum; the sum of
//! exponentials; the weighted values), keeping one f32 score per visible key.
//!
//! The kernels of each sweep (`Simd`'s methods) exist portably and for AVX-512; the AVX-512 ones
//! (`avx512.rs`) run the same operations in the same order, sixteen keys side by side, so the level
//! changes speed, never bits (the tests compare them bit for bit).

use half::f16;

use super::pool::ThreadPool;

mod avx512;
mod long_row;

/// Logical positions per key tile.
pub const KV_TILE: usize = 64;

#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Multiplies q·k.
    pub scale: f32,
    /// Sliding window: a query at p sees keys k with p - window < k <= p.
    pub window: Option<usize>,
}

impl AttentionShape {
    /// The first key position a query at `pos` sees.
    pub fn first_visible(&self, pos: usize) -> usize {
        match self.window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
    }
}

/// K and V rows by logical position (each `n_kv_head * head_dim` values, heads contiguous).
pub trait KvRows: Sync {
    /// The cached K rows from `pos` on that lie contiguously in memory: whole rows, at least row `pos`
    /// (a cache stored in blocks or a ring returns the rest of `pos`'s block).
    fn k_rows(&self, pos: usize) -> &[f16];
    /// The same for V.
    fn v_rows(&self, pos: usize) -> &[f16];
}

struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint (row, head) slices of the output; see `attend`.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// A method, so closures capture the whole (Sync) wrapper rather than the raw pointer field.
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// Consecutive query rows one task handles: they share each key/value tile converted to f32 once.
const Q_BLOCK: usize = 8;

/// `out[r]` = attention of query row `r` (at `positions[r]`, ascending) over `kv`. `q` and `out` are
/// `positions.len()` rows of `n_head * head_dim`.
pub fn attend(
    pool: &ThreadPool,
    q: &[f32],
    positions: &[usize],
    kv: &dyn KvRows,
    shape: &AttentionShape,
    out: &mut [f32],
) {
    attend_with(pool, Simd::detect(), q, positions, kv, shape, out)
}

fn attend_with(
    pool: &ThreadPool,
    isa: Simd,
    q: &[f32],
    positions: &[usize],
    kv: &dyn KvRows,
    shape: &AttentionShape,
    out: &mut [f32],
) {
    let width = shape.n_head * shape.head_dim;
    assert_eq!(q.len(), positions.len() * width, "query rows");
    assert_eq!(out.len(), q.len(), "output rows");
    assert!(
        shape.n_kv_head > 0 && shape.n_head.is_multiple_of(shape.n_kv_head),
        "GQA grouping"
    );
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "positions ascend");
    if let [pos] = positions {
        if pool.n_threads() > 1 && pos + 1 - shape.first_visible(*pos) >= long_row::MIN_KEYS {
            return long_row::attend(pool, isa, q, *pos, kv, shape, out);
        }
    }
    let out_ptr = OutPtr(out.as_mut_ptr());
    let n_blocks = positions.len().div_ceil(Q_BLOCK);
    let group = shape.n_head / shape.n_kv_head;
    // Too few (block, kv head) pairs to spread evenly over the threads (a decode step): give each query
    // head its own task. A head's result is the same either way; only its K and V tiles are converted
    // once per head instead of once per group.
    let parts = if n_blocks * shape.n_kv_head < 4 * pool.n_threads() {
        group
    } else {
        1
    };
    pool.run(n_blocks * shape.n_kv_head * parts, &|task| {
        let (block, rest) = (task / (shape.n_kv_head * parts), task % (shape.n_kv_head * parts));
        let (kv_head, part) = (rest / parts, rest % parts);
        let per_part = group / parts;
        let rows = block * Q_BLOCK..((block + 1) * Q_BLOCK).min(positions.len());
        let job = Block {
            q,
            positions: &positions[rows.clone()],
            first_row: rows.start,
            kv,
            kv_head,
            heads: part * per_part..(part + 1) * per_part,
            shape,
            simd: isa,
        };
        match isa {
            // SAFETY: `Simd::detect` checked the CPU has these features.
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 => unsafe { job.run_avx512(&out_ptr) },
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 => unsafe { job.run_avx2(&out_ptr) },
            _ => job.run(&out_ptr),
        }
    });
}

/// One row of a batched decode step: one sequence's query (every head) at `position`, the rows its
/// cache holds, and its output row.
pub struct DecodeRow<'a> {
    pub q: &'a [f32],
    pub position: usize,
    pub kv: &'a dyn KvRows,
    pub out: &'a mut [f32],
}

/// A batched decode step's attention (one row of each of several sequences) in one dispatch of the
/// pool, where a call of `attend` a sequence cost a hand-off to the threads each. Each (row, KV head)
/// task runs the block job `attend` runs for that row alone, whose values the long-row route also
/// forms in the same order, so each row gets the bits of its own call.
pub fn attend_decode_rows(pool: &ThreadPool, rows: &mut [DecodeRow<'_>], shape: &AttentionShape) {
    let isa = Simd::detect();
    let width = shape.n_head * shape.head_dim;
    assert!(
        rows.iter().all(|r| r.q.len() == width && r.out.len() == width),
        "query and output rows"
    );
    assert!(
        shape.n_kv_head > 0 && shape.n_head.is_multiple_of(shape.n_kv_head),
        "GQA grouping"
    );
    let positions: Vec<[usize; 1]> = rows.iter().map(|r| [r.position]).collect();
    let outs: Vec<OutPtr> = rows.iter_mut().map(|r| OutPtr(r.out.as_mut_ptr())).collect();
    let group = shape.n_head / shape.n_kv_head;
    // As `attend` splits a step's heads: a task a query head when the KV heads are too few.
    let parts = if rows.len() * shape.n_kv_head < 4 * pool.n_threads() {
        group
    } else {
        1
    };
    let rows = &*rows;
    pool.run(rows.len() * shape.n_kv_head * parts, &|task| {
        let (row, rest) = (task / (shape.n_kv_head * parts), task % (shape.n_kv_head * parts));
        let (kv_head, part) = (rest / parts, rest % parts);
        let per_part = group / parts;
        let job = Block {
            q: rows[row].q,
            positions: &positions[row],
            first_row: 0,
            kv: rows[row].kv,
            kv_head,
            heads: part * per_part..(part + 1) * per_part,
            shape,
            simd: isa,
        };
        let out = &outs[row];
        match isa {
            // SAFETY: `Simd::detect` checked the CPU has these features; this task alone writes
            // these heads of this row's output.
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 => unsafe { job.run_avx512(out) },
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 => unsafe { job.run_avx2(out) },
            _ => job.run(out),
        }
    });
}

/// The widest vectors the attention loops may be compiled for. Every level runs the same operations in
/// the same order (no fused multiply-add), so the level changes speed, never bits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Simd {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Simd {
    /// The widest level this CPU has, within the user's `TANDEM_CPU_ISA` ceiling ([`crate::Isa::ceiling`]).
    fn detect() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            use crate::Isa;
            let cap = Isa::ceiling().unwrap_or(Isa::Avx512);
            if cap >= Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512f") {
                return Simd::Avx512;
            }
            if cap >= Isa::Avx2 && std::arch::is_x86_feature_detected!("avx2") {
                return Simd::Avx2;
            }
        }
        Simd::Baseline
    }

    /// Every level this CPU can run, the portable one first.
    #[cfg(test)]
    fn available() -> Vec<Simd> {
        let mut levels = vec![Simd::Baseline];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                levels.push(Simd::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                levels.push(Simd::Avx512);
            }
        }
        levels
    }
}

/// A block of consecutive query rows and the heads that share one KV head.
struct Block<'a> {
    q: &'a [f32],
    positions: &'a [usize],
    first_row: usize,
    kv: &'a dyn KvRows,
    kv_head: usize,
    /// Which heads of the group (0-based within it) this task computes.
    heads: std::ops::Range<usize>,
    shape: &'a AttentionShape,
    simd: Simd,
}

impl Block<'_> {
    /// The same code compiled for AVX2 and AVX-512: wider vectors, the same operations in the same
    /// order (no fused multiply-add), so the same bits.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn run_avx2(&self, out: &OutPtr) {
        self.run(out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn run_avx512(&self, out: &OutPtr) {
        self.run(out)
    }

    #[inline(always)]
    fn run(&self, out_ptr: &OutPtr) {
        let shape = self.shape;
        let d = shape.head_dim;
        let first_head = self.kv_head * (shape.n_head / shape.n_kv_head) + self.heads.start;
        let group = self.heads.len();
        let width = shape.n_head * d;
        let head_of = |r: usize, h: usize| (self.first_row + r) * width + (first_head + h) * d;
        let lo = shape.first_visible(self.positions[0]);
        let hi = *self.positions.last().expect("a block has rows");

        let n = self.positions.len();
        let q16: Vec<f32> = (0..n * group)
            .flat_map(|i| query_as_f16(&self.q[head_of(i / group, i % group)..][..d]))
            .collect();
        // Scores per (row, head), indexed by key position from each row's own first visible key.
        let spans: Vec<(usize, usize)> = self.positions.iter().map(|&p| (shape.first_visible(p), p)).collect();
        let mut scores: Vec<Vec<f32>> = (0..n * group)
            .map(|i| vec![0f32; spans[i / group].1 + 1 - spans[i / group].0])
            .collect();

        let mut tile_rows = vec![0f32; KV_TILE * d];
        // Sweep 1: scores, tile by tile; each tile converted once for the whole block.
        let load =
            |values, span, tile: &mut [f32]| load_tile(self.kv, shape, self.kv_head, self.simd, values, span, tile);
        for tile in lo / KV_TILE..=hi / KV_TILE {
            let (first, last) = tile_span(tile, lo, hi);
            load(false, (first, last), &mut tile_rows);
            for (i, s) in scores.iter_mut().enumerate() {
                let (from, to) = spans[i / group];
                let (a, b) = (first.max(from), last.min(to));
                if a > b {
                    continue;
                }
                let qh = &q16[i * d..(i + 1) * d];
                let keys = &tile_rows[(a - first) * d..(b - first + 1) * d];
                self.simd.scores(qh, keys, shape.scale, &mut s[a - from..=b - from]);
            }
        }
        // Sweep 2: softmax weights, each rounded to f16 (llama.cpp converts them for the f16 V product).
        for s in &mut scores {
            self.simd.softmax_f16_weights(s);
        }
        // Sweep 3: weighted values, one partial sum per tile, tiles added in order.
        // SAFETY: this task alone writes these (row, head) slices of the output (see `attend`), which
        // outlives the task; each slice lies inside it.
        let mut outs: Vec<&mut [f32]> = (0..n * group)
            .map(|i| unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(head_of(i / group, i % group)), d) })
            .collect();
        outs.iter_mut().for_each(|o| o.iter_mut().for_each(|v| *v = 0.0));
        let mut partial = vec![0f32; d];
        for tile in lo / KV_TILE..=hi / KV_TILE {
            let (first, last) = tile_span(tile, lo, hi);
            load(true, (first, last), &mut tile_rows);
            for (i, s) in scores.iter().enumerate() {
                let (from, to) = spans[i / group];
                let (a, b) = (first.max(from), last.min(to));
                if a > b {
                    continue;
                }
                let weights = &s[a - from..=b - from];
                let rows = &tile_rows[(a - first) * d..(b - first + 1) * d];
                self.simd.weighted_rows(&mut partial, weights, rows);
                add(outs[i], &partial);
            }
        }
    }
}

/// Converts the K (or V) columns of KV head `kv_head` at positions `first..=last` into consecutive f32
/// rows of `tile`.
#[inline(always)]
fn load_tile(
    kv: &dyn KvRows,
    shape: &AttentionShape,
    kv_head: usize,
    simd: Simd,
    values: bool,
    (first, last): (usize, usize),
    tile: &mut [f32],
) {
    let d = shape.head_dim;
    let width = shape.n_kv_head * d;
    let col = kv_head * d;
    let mut p = first;
    while p <= last {
        let run = if values { kv.v_rows(p) } else { kv.k_rows(p) };
        let n = (run.len() / width).min(last + 1 - p);
        assert!(n > 0, "the cache returned no row at position {p}");
        for (i, row) in run.chunks_exact(width).take(n).enumerate() {
            simd.to_f32(&row[col..col + d], &mut tile[(p - first + i) * d..][..d]);
        }
        p += n;
    }
}

/// The positions of key tile `tile` that lie in `lo..=hi`.
#[inline(always)]
fn tile_span(tile: usize, lo: usize, hi: usize) -> (usize, usize) {
    ((tile * KV_TILE).max(lo), (tile * KV_TILE + KV_TILE - 1).min(hi))
}

/// A query head's values rounded to f16, as llama.cpp converts them for its f16 × f16 dot products.
#[inline(always)]
fn query_as_f16(q: &[f32]) -> impl Iterator<Item = f32> + '_ {
    q.iter().map(|&x| f16::from_f32(x).to_f32())
}

#[inline(always)]
fn add(acc: &mut [f32], x: &[f32]) {
    acc.iter_mut().zip(x).for_each(|(a, &b)| *a += b);
}

#[inline(always)]
fn to_f32(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

/// A dot product with 16 independent partial sums (element i goes to sum i mod 16) combined in a fixed
/// tree: the same bits on any ISA (no fused multiply-add, no reassociation).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = a.len() / 16;
    for c in 0..chunks {
        let (x, y) = (&a[c * 16..c * 16 + 16], &b[c * 16..c * 16 + 16]);
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    finish_dot(acc, a, b, chunks * 16)
}

/// Adds the tail (elements from `from`) to the partial sums and reduces them: 16 → 8 → 4 → 2 → 1.
#[inline(always)]
fn finish_dot(mut acc: [f32; 16], a: &[f32], b: &[f32], from: usize) -> f32 {
    for i in from..a.len() {
        acc[i % 16] += a[i] * b[i];
    }
    tree_sum(acc)
}

/// Sixteen partial sums combined 16 → 8 → 4 → 2 → 1, upper half onto lower each time: the tree of
/// `dot`'s sums (f32) and of the softmax normalizer's (f64), which vector lanes follow.
#[inline(always)]
fn tree_sum<T: Copy + std::ops::AddAssign>(mut acc: [T; 16]) -> T {
    let mut width = 8;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0]
}

/// The softmax of `s` in place, each weight rounded to f16: the maximum subtracted, `exp_nonpositive`,
/// the normalizer summed in f64 (`sum_f64`), then each weight times its f32 inverse.
fn softmax_f16_weights(s: &mut [f32]) {
    let max = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    s.iter_mut().for_each(|x| *x = exp_nonpositive(*x - max));
    let inv = (1.0 / sum_f64(s)) as f32;
    s.iter_mut().for_each(|x| *x = f16::from_f32(*x * inv).to_f32());
}

/// The constants of `exp_nonpositive`: ln 2 split in two (the high part has few enough bits that
/// `n * LN2_HI` is exact), and the minimax polynomial for e^r on |r| <= ln 2 / 2 (Cephes' `expf`).
const EXP_LN2_HI: f32 = 0.693_359_4;
const EXP_LN2_LO: f32 = -2.121_944_4e-4;
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];
/// Below this e^x is under f32's smallest normal: it counts as 0 (a weight of e^-87 rounds to 0 in
/// f16, and adds nothing to a normalizer of at least 1).
const EXP_FLUSH_BELOW: f32 = -87.33;

/// e^x for x <= 0 within about one ulp, written with separate multiplications and additions so a
/// vector version (`avx512::exp_nonpositive`) computes the same bits: x = n ln 2 + r, e^x = 2^n e^r.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x < EXP_FLUSH_BELOW {
        return 0.0;
    }
    let n = (x * std::f32::consts::LOG2_E + 0.5).floor();
    let r = (x - n * EXP_LN2_HI) - n * EXP_LN2_LO;
    let mut y = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        y = y * r + c;
    }
    let e_r = (y * (r * r) + r) + 1.0;
    e_r * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Σ x in f64, element i into partial sum i mod 16, the partial sums then combined 16 → 8 → 4 → 2 → 1
/// (`dot`'s tree): an order fixed by the slice alone, which sixteen vector lanes can follow.
fn sum_f64(s: &[f32]) -> f64 {
    let mut acc = [0f64; 16];
    for (i, &x) in s.iter().enumerate() {
        acc[i % 16] += x as f64;
    }
    tree_sum(acc)
}

#[inline(always)]
fn axpy(acc: &mut [f32], w: f32, v: &[f32]) {
    acc.iter_mut().zip(v).for_each(|(a, &x)| *a += w * x);
}

/// `partial = Σ_i weights[i] · rows[i]`, formed from zero in order (one tile's partial sum, which the
/// caller then adds to its output).
#[inline(always)]
fn weighted_rows(partial: &mut [f32], weights: &[f32], rows: &[f32]) {
    let d = partial.len();
    partial.iter_mut().for_each(|p| *p = 0.0);
    for (w, row) in weights.iter().zip(rows.chunks_exact(d)) {
        axpy(partial, *w, row);
    }
}

/// The kernels of the three sweeps, at each level. The AVX-512 ones take heads of whole 16-lane
/// vectors; other widths use the portable code, which is the definition of the bits.
impl Simd {
    #[inline(always)]
    fn wide(self, d: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self == Simd::Avx512 {
            return d.is_multiple_of(16);
        }
        let _ = d;
        false
    }

    #[inline(always)]
    fn to_f32(self, src: &[f16], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.wide(src.len()) {
            // SAFETY: `Simd::detect` checked the feature; `dst` holds as many values as `src`.
            return unsafe { avx512::to_f32(src, dst) };
        }
        to_f32(src, dst)
    }

    /// `out[j] = dot(q, key row j) * scale` for the consecutive rows of `keys`.
    #[inline(always)]
    fn scores(self, q: &[f32], keys: &[f32], scale: f32, out: &mut [f32]) {
        let d = q.len();
        debug_assert_eq!(keys.len(), out.len() * d);
        #[cfg(target_arch = "x86_64")]
        if self.wide(d) {
            // SAFETY: `Simd::detect` checked the feature; `keys` holds `out.len()` rows of `d`.
            return unsafe { avx512::scores(q, keys, scale, out) };
        }
        for (s, key) in out.iter_mut().zip(keys.chunks_exact(d)) {
            *s = self.dot(q, key) * scale;
        }
    }

    #[inline(always)]
    fn softmax_f16_weights(self, s: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self == Simd::Avx512 {
            // SAFETY: `Simd::detect` checked the feature.
            return unsafe { avx512::softmax_f16_weights(s) };
        }
        softmax_f16_weights(s)
    }

    /// `weighted_rows`, vectorized where the head is a whole number of 16-lane vectors.
    #[inline(always)]
    fn weighted_rows(self, partial: &mut [f32], weights: &[f32], rows: &[f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.wide(partial.len()) {
            // SAFETY: `Simd::detect` checked the feature; every load and store is inside the slices.
            return unsafe { avx512::weighted_rows(partial, weights, rows) };
        }
        weighted_rows(partial, weights, rows)
    }

    /// `dot` with the partial sums held in vector registers.
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        debug_assert_eq!(a.len(), b.len());
        match self {
            // SAFETY: `Simd::detect` checked the features; loads stay inside the slices (whole chunks).
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 => unsafe { avx512::dot(a, b) },
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 => unsafe { dot_avx2(a, b) },
            Simd::Baseline => dot(a, b),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let chunks = a.len().min(b.len()) / 16;
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for c in 0..chunks {
        let (pa, pb) = (a.as_ptr().add(16 * c), b.as_ptr().add(16 * c));
        lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(pa), _mm256_loadu_ps(pb)));
        hi = _mm256_add_ps(
            hi,
            _mm256_mul_ps(_mm256_loadu_ps(pa.add(8)), _mm256_loadu_ps(pb.add(8))),
        );
    }
    let mut lanes = [0f32; 16];
    _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
    finish_dot(lanes, a, b, chunks * 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dense {
        k: Vec<f16>,
        v: Vec<f16>,
        width: usize,
        run: usize,
    }

    /// Rows in runs of at most `run` (a cache stored in blocks), so tiles are gathered from pieces.
    impl KvRows for Dense {
        fn k_rows(&self, pos: usize) -> &[f16] {
            &self.k[pos * self.width..((pos / self.run + 1) * self.run * self.width).min(self.k.len())]
        }
        fn v_rows(&self, pos: usize) -> &[f16] {
            &self.v[pos * self.width..((pos / self.run + 1) * self.run * self.width).min(self.v.len())]
        }
    }

    impl Dense {
        /// `n_pos` rows of `width` random keys (in [-3, 3]) and values (in [-1, 1]), from `seed` and
        /// `seed + 1`, handed out in runs of `run` rows.
        fn random(n_pos: usize, width: usize, seed: u32, run: usize) -> Dense {
            let halves = |seed, scale: f32| {
                values(n_pos * width, seed)
                    .into_iter()
                    .map(move |x| f16::from_f32(scale * x))
            };
            Dense {
                k: halves(seed, 3.0).collect(),
                v: halves(seed + 1, 1.0).collect(),
                width,
                run,
            }
        }

        fn k_row(&self, pos: usize) -> &[f16] {
            &self.k[pos * self.width..(pos + 1) * self.width]
        }
        fn v_row(&self, pos: usize) -> &[f16] {
            &self.v[pos * self.width..(pos + 1) * self.width]
        }
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    fn test_shape(n_head: usize, n_kv_head: usize, head_dim: usize, window: Option<usize>) -> AttentionShape {
        AttentionShape {
            n_head,
            n_kv_head,
            head_dim,
            scale: 0.125,
            window,
        }
    }

    /// Plain softmax attention in f64, the reference.
    fn reference(q: &[f32], pos: usize, kv: &Dense, shape: &AttentionShape, head: usize) -> Vec<f64> {
        let d = shape.head_dim;
        let kvh = head / (shape.n_head / shape.n_kv_head);
        let qh = &q[head * d..(head + 1) * d];
        let keys: Vec<usize> = (shape.first_visible(pos)..=pos).collect();
        let scores: Vec<f64> = keys
            .iter()
            .map(|&p| {
                let k = &kv.k_row(p)[kvh * d..(kvh + 1) * d];
                qh.iter().zip(k).map(|(a, b)| *a as f64 * b.to_f64()).sum::<f64>() * shape.scale as f64
            })
            .collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
        let total: f64 = w.iter().sum();
        (0..d)
            .map(|j| {
                keys.iter()
                    .zip(&w)
                    .map(|(&p, wi)| wi * kv.v_row(p)[kvh * d + j].to_f64())
                    .sum::<f64>()
                    / total
            })
            .collect()
    }

    #[test]
    fn matches_reference_and_is_independent_of_batching() {
        let pool = ThreadPool::new(2);
        for window in [None, Some(70)] {
            let shape = AttentionShape {
                n_head: 4,
                n_kv_head: 2,
                head_dim: 32,
                scale: 0.2,
                window,
            };
            let n_pos = 200;
            let width = shape.n_kv_head * shape.head_dim;
            let kv = Dense {
                k: values(n_pos * width, 1).into_iter().map(f16::from_f32).collect(),
                v: values(n_pos * width, 2).into_iter().map(f16::from_f32).collect(),
                width,
                run: 24,
            };
            let qw = shape.n_head * shape.head_dim;
            let positions: Vec<usize> = (130..200).collect();
            let q = values(positions.len() * qw, 3);
            let mut out = vec![0f32; q.len()];
            attend(&pool, &q, &positions, &kv, &shape, &mut out);
            for (r, &p) in positions.iter().enumerate() {
                for h in 0..shape.n_head {
                    let want = reference(&q[r * qw..(r + 1) * qw], p, &kv, &shape, h);
                    for j in 0..shape.head_dim {
                        let got = out[r * qw + h * shape.head_dim + j] as f64;
                        assert!(
                            (got - want[j]).abs() < 3e-3,
                            "row {r} head {h} dim {j}: {got} vs {}",
                            want[j]
                        );
                    }
                }
                // One row alone gives the same bits, on one thread (one task per KV head) and on four
                // (one task per query head).
                for threads in [1, 4] {
                    let mut single = vec![0f32; qw];
                    let one = &q[r * qw..(r + 1) * qw];
                    attend(&ThreadPool::new(threads), one, &[p], &kv, &shape, &mut single);
                    assert_eq!(single, out[r * qw..(r + 1) * qw], "row {r}, {threads} threads");
                }
            }
        }
    }

    /// Every level's kernels (AVX-512's sixteen keys side by side, its vector softmax) against the
    /// portable code, bit for bit: head sizes with and without whole vectors, key counts that leave
    /// partial groups of sixteen, windows, one row and a chunk.
    #[test]
    fn every_simd_level_attends_with_the_same_bits() {
        let pool = ThreadPool::new(3);
        for (n_head, n_kv_head, head_dim, window) in [
            (9, 3, 64, None),
            (4, 1, 256, Some(100)),
            (2, 2, 48, None),
            (4, 2, 40, Some(37)),
        ] {
            let shape = test_shape(n_head, n_kv_head, head_dim, window);
            let kv = Dense::random(300, n_kv_head * head_dim, 11, 256);
            let qw = n_head * head_dim;
            for positions in [vec![0], vec![299], vec![150], (183..300).collect::<Vec<_>>()] {
                let q = values(positions.len() * qw, 13);
                let run = |isa: Simd| {
                    let mut out = vec![f32::NAN; q.len()];
                    attend_with(&pool, isa, &q, &positions, &kv, &shape, &mut out);
                    bits(&out)
                };
                let want = run(Simd::Baseline);
                for isa in Simd::available() {
                    assert_eq!(
                        run(isa),
                        want,
                        "{isa:?}, head_dim {head_dim}, rows from {}",
                        positions[0]
                    );
                }
            }
        }
    }

    /// A decode step deep into the cache (the long-row route: key tiles split over tasks, four phases)
    /// gives the block route's bits, which the same row gets inside a chunk.
    #[test]
    fn a_long_row_gets_the_bits_it_gets_in_a_chunk() {
        for (n_head, n_kv_head, head_dim, window) in [(9, 3, 64, None), (4, 1, 256, Some(1500)), (4, 2, 40, None)] {
            let shape = test_shape(n_head, n_kv_head, head_dim, window);
            let n_pos = 2100;
            let kv = Dense::random(n_pos, n_kv_head * head_dim, 31, 100);
            let qw = n_head * head_dim;
            let positions: Vec<usize> = (n_pos - 3..n_pos).collect();
            let q = values(positions.len() * qw, 33);
            for isa in Simd::available() {
                let mut chunk = vec![f32::NAN; q.len()];
                attend_with(&ThreadPool::new(2), isa, &q, &positions, &kv, &shape, &mut chunk);
                for (r, &p) in positions.iter().enumerate() {
                    assert!(p + 1 - shape.first_visible(p) >= long_row::MIN_KEYS);
                    for threads in [2, 3] {
                        let mut single = vec![f32::NAN; qw];
                        let one = &q[r * qw..(r + 1) * qw];
                        attend_with(&ThreadPool::new(threads), isa, one, &[p], &kv, &shape, &mut single);
                        assert_eq!(
                            bits(&single),
                            bits(&chunk[r * qw..(r + 1) * qw]),
                            "{isa:?}, head_dim {head_dim}, row at {p}, {threads} threads"
                        );
                    }
                }
            }
        }
    }

    /// Rows of several sequences attended in one dispatch get the bits each gets alone: short and
    /// long (the long-row route) contexts, windows, one thread and several.
    #[test]
    fn a_batched_decode_step_gives_each_row_its_own_bits() {
        for (n_head, n_kv_head, head_dim, window) in [(9, 3, 64, None), (4, 1, 256, Some(100)), (4, 2, 40, None)] {
            let shape = test_shape(n_head, n_kv_head, head_dim, window);
            let qw = n_head * head_dim;
            let caches: Vec<Dense> = (0..4)
                .map(|i| Dense::random(1300, n_kv_head * head_dim, 41 + 2 * i, 100))
                .collect();
            let positions = [0, 77, 1299, 400];
            let q = values(positions.len() * qw, 43);
            for threads in [1, 2, 3] {
                let pool = ThreadPool::new(threads);
                let mut out = vec![f32::NAN; q.len()];
                let mut rows: Vec<DecodeRow> = out
                    .chunks_mut(qw)
                    .enumerate()
                    .map(|(i, out)| DecodeRow {
                        q: &q[i * qw..(i + 1) * qw],
                        position: positions[i],
                        kv: &caches[i],
                        out,
                    })
                    .collect();
                attend_decode_rows(&pool, &mut rows, &shape);
                for (i, &p) in positions.iter().enumerate() {
                    let mut alone = vec![f32::NAN; qw];
                    attend(&pool, &q[i * qw..(i + 1) * qw], &[p], &caches[i], &shape, &mut alone);
                    assert_eq!(
                        bits(&out[i * qw..(i + 1) * qw]),
                        bits(&alone),
                        "head_dim {head_dim}, row {i} at {p}, {threads} threads"
                    );
                }
            }
        }
    }

    #[test]
    fn every_simd_level_gives_the_same_bits() {
        let a = values(300, 5);
        let b = values(300, 6);
        for len in [0, 7, 16, 37, 64, 256, 300] {
            let want = dot(&a[..len], &b[..len]);
            let got = Simd::detect().dot(&a[..len], &b[..len]);
            assert_eq!(got.to_bits(), want.to_bits(), "len {len}");
        }
    }

    #[test]
    fn weighted_rows_match_the_plain_sum_bit_for_bit() {
        for d in [16, 64, 144, 256] {
            let rows = values(5 * d, 7);
            let w = values(5, 8);
            let base = values(d, 9);
            let (mut a, mut b) = (base.clone(), base.clone());
            weighted_rows(&mut a, &w, &rows);
            Simd::detect().weighted_rows(&mut b, &w, &rows);
            assert_eq!(bits(&a), bits(&b), "d {d}");
        }
    }

    #[test]
    fn exp_is_within_two_ulps_and_flushes_below_the_normal_range() {
        let mut x = 0f32;
        while x > -87.0 {
            let (got, want) = (exp_nonpositive(x), (x as f64).exp());
            // One ulp of an f32 near `want`: its power of two times epsilon.
            let ulp = f32::from_bits((want as f32).to_bits() & 0x7f80_0000) as f64 * f32::EPSILON as f64;
            assert!((got as f64 - want).abs() <= 2.0 * ulp, "exp({x}) = {got}, want {want}");
            x -= 0.0137;
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(-0.0), 1.0);
        assert_eq!(exp_nonpositive(-90.0), 0.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert!(exp_nonpositive(f32::NAN).is_nan());
    }

    #[test]
    fn softmax_kernels_give_the_same_bits_on_every_level() {
        for n in [1, 5, 16, 17, 64, 100, 1000] {
            let scores: Vec<f32> = values(n, 21).iter().map(|x| 30.0 * x).collect();
            let mut want = scores.clone();
            softmax_f16_weights(&mut want);
            let total: f64 = want.iter().map(|&x| x as f64).sum();
            assert!(
                (total - 1.0).abs() < 2e-3 * (n as f64).sqrt(),
                "n {n}: weights sum to {total}"
            );
            for isa in Simd::available() {
                let mut got = scores.clone();
                isa.softmax_f16_weights(&mut got);
                assert_eq!(bits(&got), bits(&want), "{isa:?}, n {n}");
            }
        }
    }

    #[test]
    fn dot_is_exact_on_small_integers() {
        let a: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..37).map(|i| (i % 5) as f32).collect();
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert_eq!(dot(&a, &b), want);
    }
}
