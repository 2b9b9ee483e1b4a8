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

use half::f16;

use super::pool::ThreadPool;

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
    fn k_row(&self, pos: usize) -> &[f16];
    fn v_row(&self, pos: usize) -> &[f16];
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
    let width = shape.n_head * shape.head_dim;
    assert_eq!(q.len(), positions.len() * width, "query rows");
    assert_eq!(out.len(), q.len(), "output rows");
    assert!(
        shape.n_kv_head > 0 && shape.n_head.is_multiple_of(shape.n_kv_head),
        "GQA grouping"
    );
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "positions ascend");
    let out_ptr = OutPtr(out.as_mut_ptr());
    let n_blocks = positions.len().div_ceil(Q_BLOCK);
    let isa = Simd::detect();
    let group = shape.n_head / shape.n_kv_head;
    // Too few (block, kv head) pairs to keep every thread busy (a decode step): give each query head
    // its own task. A head's result is the same either way.
    let parts = if n_blocks * shape.n_kv_head < pool.n_threads() {
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

/// The widest vectors the attention loops may be compiled for. Every level runs the same operations in
/// the same order (no fused multiply-add), so the level changes speed, never bits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Simd {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Simd {
    fn detect() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Simd::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Simd::Avx2;
            }
        }
        Simd::Baseline
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
        let kv_cols = self.kv_head * d..(self.kv_head + 1) * d;
        let head_of = |r: usize, h: usize| (self.first_row + r) * width + (first_head + h) * d;
        let lo = shape.first_visible(self.positions[0]);
        let hi = *self.positions.last().expect("a block has rows");

        // The queries as f16 values, as llama.cpp converts them for its f16 × f16 dot products.
        let n = self.positions.len();
        let q16: Vec<f32> = (0..n * group)
            .flat_map(|i| &self.q[head_of(i / group, i % group)..][..d])
            .map(|&x| f16::from_f32(x).to_f32())
            .collect();
        // Scores per (row, head), indexed by key position from each row's own first visible key.
        let spans: Vec<(usize, usize)> = self.positions.iter().map(|&p| (shape.first_visible(p), p)).collect();
        let mut scores: Vec<Vec<f32>> = (0..n * group)
            .map(|i| vec![0f32; spans[i / group].1 + 1 - spans[i / group].0])
            .collect();

        let mut tile_rows = vec![0f32; KV_TILE * d];
        // Sweep 1: scores, tile by tile; each tile converted once for the whole block.
        for tile in lo / KV_TILE..=hi / KV_TILE {
            let (first, last) = ((tile * KV_TILE).max(lo), (tile * KV_TILE + KV_TILE - 1).min(hi));
            for p in first..=last {
                to_f32(
                    &self.kv.k_row(p)[kv_cols.clone()],
                    &mut tile_rows[(p - first) * d..][..d],
                );
            }
            for (i, s) in scores.iter_mut().enumerate() {
                let (from, to) = spans[i / group];
                let qh = &q16[i * d..(i + 1) * d];
                for p in first.max(from)..=last.min(to) {
                    s[p - from] = self.simd.dot(qh, &tile_rows[(p - first) * d..][..d]) * shape.scale;
                }
            }
        }
        // Sweep 2: softmax weights, each rounded to f16 (llama.cpp converts them for the f16 V product).
        for s in &mut scores {
            let max = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f64;
            for x in s.iter_mut() {
                *x = (*x - max).exp();
                sum += *x as f64;
            }
            let inv = (1.0 / sum) as f32;
            s.iter_mut().for_each(|x| *x = f16::from_f32(*x * inv).to_f32());
        }
        // Sweep 3: weighted values, one partial sum per tile, tiles added in order.
        // SAFETY: this task alone writes these (row, head) slices of the output (see `attend`), which
        // outlives the task; each slice lies inside it.
        let mut outs: Vec<&mut [f32]> = (0..n * group)
            .map(|i| unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(head_of(i / group, i % group)), d) })
            .collect();
        outs.iter_mut().for_each(|o| o.iter_mut().for_each(|v| *v = 0.0));
        for tile in lo / KV_TILE..=hi / KV_TILE {
            let (first, last) = ((tile * KV_TILE).max(lo), (tile * KV_TILE + KV_TILE - 1).min(hi));
            for p in first..=last {
                to_f32(
                    &self.kv.v_row(p)[kv_cols.clone()],
                    &mut tile_rows[(p - first) * d..][..d],
                );
            }
            for (i, s) in scores.iter().enumerate() {
                let (from, to) = spans[i / group];
                if first.max(from) > last.min(to) {
                    continue;
                }
                let (a, b) = (first.max(from), last.min(to));
                let weights = &s[a - from..=b - from];
                let rows = &tile_rows[(a - first) * d..(b - first + 1) * d];
                self.simd.add_weighted_rows(outs[i], weights, rows);
            }
        }
    }
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
    let mut width = 8;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0]
}

impl Simd {
    /// `add_weighted_rows`, vectorized where the head is a whole number of 16-lane vectors.
    #[inline(always)]
    fn add_weighted_rows(self, out: &mut [f32], weights: &[f32], rows: &[f32]) {
        match self {
            // SAFETY: `Simd::detect` checked the feature; every load and store is inside the slices.
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 if out.len().is_multiple_of(16) => unsafe { add_weighted_rows_avx512(out, weights, rows) },
            _ => add_weighted_rows(out, weights, rows),
        }
    }

    /// `dot` with the partial sums held in vector registers.
    #[inline(always)]
    fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        debug_assert_eq!(a.len(), b.len());
        match self {
            // SAFETY: `Simd::detect` checked the features; loads stay inside the slices (whole chunks).
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 => unsafe { dot_avx512(a, b) },
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 => unsafe { dot_avx2(a, b) },
            Simd::Baseline => dot(a, b),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let chunks = a.len().min(b.len()) / 16;
    let mut acc = _mm512_setzero_ps();
    for c in 0..chunks {
        let x = _mm512_loadu_ps(a.as_ptr().add(16 * c));
        let y = _mm512_loadu_ps(b.as_ptr().add(16 * c));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(x, y));
    }
    if chunks * 16 == a.len() {
        // The tree 16 → 8 → 4 → 2 → 1 of `finish_dot`, in registers: upper half onto lower each time.
        let lo8 = _mm512_castps512_ps256(acc);
        let hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
        let s8 = _mm256_add_ps(lo8, hi8);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
        return _mm_cvtss_f32(s1);
    }
    let mut lanes = [0f32; 16];
    _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
    finish_dot(lanes, a, b, chunks * 16)
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

#[inline(always)]
fn axpy(acc: &mut [f32], w: f32, v: &[f32]) {
    acc.iter_mut().zip(v).for_each(|(a, &x)| *a += w * x);
}

/// `out += Σ_i weights[i] · rows[i]`, where the sum over `i` is formed first, from zero, in order (one
/// tile's partial sum), and then added to `out`.
#[inline(always)]
fn add_weighted_rows(out: &mut [f32], weights: &[f32], rows: &[f32]) {
    let d = out.len();
    let mut partial = vec![0f32; d];
    for (w, row) in weights.iter().zip(rows.chunks_exact(d)) {
        axpy(&mut partial, *w, row);
    }
    add(out, &partial);
}

/// `add_weighted_rows` with up to eight 16-lane partial sums held in registers across the rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_weighted_rows_avx512(out: &mut [f32], weights: &[f32], rows: &[f32]) {
    use std::arch::x86_64::*;
    let d = out.len();
    debug_assert!(d.is_multiple_of(16) && rows.len() == weights.len() * d);
    let mut j = 0;
    while j < d {
        let lanes = ((d - j) / 16).min(8);
        let mut acc = [_mm512_setzero_ps(); 8];
        for (i, &w) in weights.iter().enumerate() {
            let wv = _mm512_set1_ps(w);
            let row = rows.as_ptr().add(i * d + j);
            for (k, a) in acc.iter_mut().enumerate().take(lanes) {
                *a = _mm512_add_ps(*a, _mm512_mul_ps(wv, _mm512_loadu_ps(row.add(16 * k))));
            }
        }
        for (k, a) in acc.iter().enumerate().take(lanes) {
            let o = out.as_mut_ptr().add(j + 16 * k);
            _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), *a));
        }
        j += 16 * lanes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dense {
        k: Vec<f16>,
        v: Vec<f16>,
        width: usize,
    }

    impl KvRows for Dense {
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
            add_weighted_rows(&mut a, &w, &rows);
            Simd::detect().add_weighted_rows(&mut b, &w, &rows);
            assert_eq!(
                a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "d {d}"
            );
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
