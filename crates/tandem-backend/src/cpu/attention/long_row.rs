//! One query row over a long span of keys: a decode step deep into a conversation.
//!
//! The block route gives a task one KV head's whole span, so with fewer KV heads than threads some
//! threads idle, and splitting the task per query head makes each head read its KV head's rows again
//! (at 4,096 keys a decode step then reads several times the cache from memory). Here every task takes
//! a range of key tiles of one KV head, in four phases: the scores of the group's heads; the softmax of
//! each head; each tile's weighted partial sum; the partials added in tile order. Every value is formed
//! by the block route's kernels in the block route's order, so the bits are the same (the tests compare
//! the two routes).

use super::{add, load_tile, query_as_f16, tile_span, AttentionShape, KvRows, OutPtr, Simd, KV_TILE};
use crate::cpu::pool::ThreadPool;

/// The fewest visible keys for which one row takes this route: below it the block route's single
/// pass costs less than this route's four hand-overs to the pool.
pub(super) const MIN_KEYS: usize = 1024;

/// `out` = attention of the one query row `q` at position `pos` over `kv`.
pub(super) fn attend(
    pool: &ThreadPool,
    simd: Simd,
    q: &[f32],
    pos: usize,
    kv: &dyn KvRows,
    shape: &AttentionShape,
    out: &mut [f32],
) {
    let d = shape.head_dim;
    let group = shape.n_head / shape.n_kv_head;
    let from = shape.first_visible(pos);
    let span = pos + 1 - from;
    let first_tile = from / KV_TILE;
    let n_tiles = pos / KV_TILE + 1 - first_tile;
    // Enough tasks per KV head that the threads stay busy; each a contiguous range of tiles.
    let chunks = (4 * pool.n_threads()).div_ceil(shape.n_kv_head).clamp(1, n_tiles);
    let tiles_of = |chunk: usize| first_tile + chunk * n_tiles / chunks..first_tile + (chunk + 1) * n_tiles / chunks;
    let q16: Vec<f32> = query_as_f16(q).collect();

    // Scores of head h at keys from..=pos: scores[h * span..][..span].
    let mut scores = vec![0f32; shape.n_head * span];
    let scores_ptr = OutPtr(scores.as_mut_ptr());
    pool.run(shape.n_kv_head * chunks, &|task| {
        let (kv_head, chunk) = (task / chunks, task % chunks);
        let mut tile = vec![0f32; KV_TILE * d];
        for t in tiles_of(chunk) {
            let (first, last) = tile_span(t, from, pos);
            load_tile(kv, shape, kv_head, simd, false, (first, last), &mut tile);
            for h in kv_head * group..(kv_head + 1) * group {
                // SAFETY: this task alone writes head h's scores at keys first..=last (tiles are
                // disjoint across tasks); the slice lies inside `scores`, which outlives the run.
                let s = unsafe {
                    std::slice::from_raw_parts_mut(scores_ptr.get().add(h * span + first - from), last + 1 - first)
                };
                simd.scores(&q16[h * d..][..d], &tile[..(last + 1 - first) * d], shape.scale, s);
            }
        }
    });
    pool.run(shape.n_head, &|h| {
        // SAFETY: one task per head, each its own span of `scores`.
        let s = unsafe { std::slice::from_raw_parts_mut(scores_ptr.get().add(h * span), span) };
        simd.softmax_f16_weights(s);
    });

    // Tile t's weighted partial sum for head h: partials[(h * n_tiles + t - first_tile) * d..][..d].
    let mut partials = vec![0f32; shape.n_head * n_tiles * d];
    let partials_ptr = OutPtr(partials.as_mut_ptr());
    let scores = &scores;
    pool.run(shape.n_kv_head * chunks, &|task| {
        let (kv_head, chunk) = (task / chunks, task % chunks);
        let mut tile = vec![0f32; KV_TILE * d];
        for t in tiles_of(chunk) {
            let (first, last) = tile_span(t, from, pos);
            load_tile(kv, shape, kv_head, simd, true, (first, last), &mut tile);
            for h in kv_head * group..(kv_head + 1) * group {
                let weights = &scores[h * span + first - from..][..last + 1 - first];
                // SAFETY: this task alone writes tile t's partial of head h; it lies inside `partials`.
                let partial = unsafe {
                    std::slice::from_raw_parts_mut(partials_ptr.get().add((h * n_tiles + t - first_tile) * d), d)
                };
                simd.weighted_rows(partial, weights, &tile[..weights.len() * d]);
            }
        }
    });
    let partials = &partials;
    let out_ptr = OutPtr(out.as_mut_ptr());
    pool.run(shape.n_head, &|h| {
        // SAFETY: one task per head, each its own head of `out`.
        let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(h * d), d) };
        o.iter_mut().for_each(|v| *v = 0.0);
        for t in 0..n_tiles {
            add(o, &partials[(h * n_tiles + t) * d..][..d]);
        }
    });
}
