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

/// `out[r]` = attention of query row `r` (at `positions[r]`) over `kv`. `q` and `out` are
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
    let out_ptr = OutPtr(out.as_mut_ptr());
    let n_tasks = positions.len() * shape.n_kv_head;
    pool.run(n_tasks, &|task| {
        let (row, kv_head) = (task / shape.n_kv_head, task % shape.n_kv_head);
        let group = shape.n_head / shape.n_kv_head;
        let heads = kv_head * group..(kv_head + 1) * group;
        let q_row = &q[row * width..(row + 1) * width];
        let q_heads = &q_row[heads.start * shape.head_dim..heads.end * shape.head_dim];
        // SAFETY: task (row, kv_head) alone writes this row's heads of this group; `out` outlives `run`.
        let out_heads = unsafe {
            std::slice::from_raw_parts_mut(
                out_ptr.get().add(row * width + heads.start * shape.head_dim),
                group * shape.head_dim,
            )
        };
        attend_group(q_heads, positions[row], kv, kv_head, shape, out_heads);
    });
}

/// One query row's heads that share `kv_head`.
fn attend_group(q: &[f32], pos: usize, kv: &dyn KvRows, kv_head: usize, shape: &AttentionShape, out: &mut [f32]) {
    let d = shape.head_dim;
    let group = q.len() / d;
    let lo = shape.first_visible(pos);
    let n_keys = pos + 1 - lo;
    let kv_cols = kv_head * d..(kv_head + 1) * d;

    // The query as f16 values, as llama.cpp converts it for its f16 × f16 dot products.
    let q16: Vec<f32> = q.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
    let mut k_row = vec![0f32; d];
    let mut v_row = vec![0f32; d];
    let mut scores = vec![0f32; group * n_keys];

    // Sweep 1: scores, tile by tile.
    for tile in lo / KV_TILE..=pos / KV_TILE {
        let first = (tile * KV_TILE).max(lo);
        let last = (tile * KV_TILE + KV_TILE - 1).min(pos);
        for p in first..=last {
            to_f32(&kv.k_row(p)[kv_cols.clone()], &mut k_row);
            for h in 0..group {
                scores[h * n_keys + p - lo] = dot(&q16[h * d..(h + 1) * d], &k_row) * shape.scale;
            }
        }
    }
    // Sweep 2: softmax weights, each rounded to f16 (llama.cpp converts them for the f16 V product).
    for h in 0..group {
        let s = &mut scores[h * n_keys..(h + 1) * n_keys];
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
    out.iter_mut().for_each(|v| *v = 0.0);
    let mut partial = vec![0f32; group * d];
    for tile in lo / KV_TILE..=pos / KV_TILE {
        let first = (tile * KV_TILE).max(lo);
        let last = (tile * KV_TILE + KV_TILE - 1).min(pos);
        partial.iter_mut().for_each(|v| *v = 0.0);
        for p in first..=last {
            to_f32(&kv.v_row(p)[kv_cols.clone()], &mut v_row);
            for h in 0..group {
                axpy(&mut partial[h * d..(h + 1) * d], scores[h * n_keys + p - lo], &v_row);
            }
        }
        add(out, &partial);
    }
}

fn add(acc: &mut [f32], x: &[f32]) {
    acc.iter_mut().zip(x).for_each(|(a, &b)| *a += b);
}

fn to_f32(src: &[f16], dst: &mut [f32]) {
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

/// A dot product with 16 independent partial sums combined in a fixed tree: the same bits on any ISA
/// (no fused multiply-add, no reassociation), and easy for the compiler to vectorize.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = a.len() / 16;
    for c in 0..chunks {
        let (x, y) = (&a[c * 16..c * 16 + 16], &b[c * 16..c * 16 + 16]);
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    for i in chunks * 16..a.len() {
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

#[inline]
fn axpy(acc: &mut [f32], w: f32, v: &[f32]) {
    acc.iter_mut().zip(v).for_each(|(a, &x)| *a += w * x);
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
                // One row alone, on one thread, gives the same bits.
                let mut single = vec![0f32; qw];
                attend(
                    &ThreadPool::new(1),
                    &q[r * qw..(r + 1) * qw],
                    &[p],
                    &kv,
                    &shape,
                    &mut single,
                );
                assert_eq!(single, out[r * qw..(r + 1) * qw], "row {r}");
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
