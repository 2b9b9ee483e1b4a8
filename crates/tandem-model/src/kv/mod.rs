//! The KV cache of one sequence: per layer, f16 K and V rows under a `RingPlacement`.
//!
//! Every chunk is stored before it is attended, and attention reads f16 rows (from the cache or from a
//! staged copy of it), so a prefilled position is attended with exactly the bits a later decode step reads.

pub mod file_digest;
mod placement;
mod pool;
pub mod wire;

pub use placement::{ChunkRoute, RingPlacement};
pub use pool::{KvPool, BLOCK_ROWS};

use std::sync::Arc;

use half::f16;
use tandem_backend::cpu::attention::KvRows;

use crate::config::ModelConfig;
use crate::ModelError;

use pool::Block;

/// Storage grows in steps of this many rows (one pool block), so a short conversation does not pay for
/// the whole context.
const GROW_ROWS: usize = BLOCK_ROWS;

/// Rows a sliding-window layer keeps beyond its window when its caches are reused across requests (the
/// serving engine; llama.cpp sizes its SWA cache at the window plus a micro-batch the same way). With
/// them a cache, or a checkpoint of its rings, can be cut back by up to this many positions: a repeated
/// prompt re-reads only its last token from the state before it, and conversations that share a long
/// prefix and then differ reuse the prefix. One pool block, so the slack costs a block per ring.
pub const RING_SLACK: usize = BLOCK_ROWS;

/// Rows a layer's cache holds at a context of `n_ctx`: the context for a global layer, the window plus
/// `ring_slack` (at most the context) for a sliding-window one.
pub fn layer_rows(window: Option<usize>, n_ctx: usize, ring_slack: usize) -> usize {
    window.map_or(n_ctx, |w| (w + ring_slack).min(n_ctx))
}

pub struct LayerCache {
    pub placement: RingPlacement,
    pub window: Option<usize>,
    width: usize,
    /// Physical row r lives in block r / BLOCK_ROWS.
    blocks: Vec<Block>,
    pool: Arc<KvPool>,
}

impl Drop for LayerCache {
    fn drop(&mut self) {
        self.pool.give(self.blocks.drain(..));
    }
}

/// Scratch for the staged route, reused across layers and chunks.
#[derive(Default)]
pub struct StagingBuffers {
    k: Vec<f16>,
    v: Vec<f16>,
}

impl LayerCache {
    fn new(capacity: usize, window: Option<usize>, pool: Arc<KvPool>) -> Self {
        LayerCache {
            placement: RingPlacement::new(capacity),
            window,
            width: pool.width(),
            blocks: Vec::new(),
            pool,
        }
    }

    fn ensure_rows(&mut self, rows: usize) -> Result<(), ModelError> {
        let rows = rows.min(self.placement.capacity);
        while self.blocks.len() * BLOCK_ROWS < rows {
            self.blocks.push(self.pool.take()?);
        }
        Ok(())
    }

    /// Where logical row `pos` lives and how many rows from it are contiguous in memory: to the end of
    /// its block, the end of the ring, or the last cached row, whichever comes first.
    fn run_at(&self, pos: usize) -> (usize, usize) {
        let r = self.placement.physical(pos).expect("attention reads only cached rows");
        let cached = self.placement.end() - pos;
        let n = (BLOCK_ROWS - r % BLOCK_ROWS)
            .min(self.placement.capacity - r)
            .min(cached);
        (r, n)
    }

    fn k_at(&self, r: usize) -> &[f16] {
        &self.blocks[r / BLOCK_ROWS].k[(r % BLOCK_ROWS) * self.width..][..self.width]
    }

    fn v_at(&self, r: usize) -> &[f16] {
        &self.blocks[r / BLOCK_ROWS].v[(r % BLOCK_ROWS) * self.width..][..self.width]
    }

    /// A copy with blocks of its own from the pool.
    fn try_clone(&self) -> Result<LayerCache, ModelError> {
        let mut copy = LayerCache::new(self.placement.capacity, self.window, Arc::clone(&self.pool));
        copy.placement = self.placement;
        for b in &self.blocks {
            let mut nb = self
                .pool
                .take()
                .inspect_err(|_| drop(std::mem::take(&mut copy.blocks)))?;
            nb.k.copy_from_slice(&b.k);
            nb.v.copy_from_slice(&b.v);
            copy.blocks.push(nb);
        }
        Ok(copy)
    }

    fn bytes(&self) -> usize {
        self.blocks.len() * self.pool.block_bytes()
    }

    /// Writes `t` rows of K and V (f32, `width` each) at the end of the cache, evicting the oldest rows
    /// of a full ring.
    fn commit(&mut self, k: &[f32], v: &[f32], t: usize) -> Result<(), ModelError> {
        self.commit_with(t, |i, w, kd, vd| {
            to_f16(&k[i * w..(i + 1) * w], kd);
            to_f16(&v[i * w..(i + 1) * w], vd);
        })
    }

    /// Appends `t` rows at the end of the cache, `write(i, width, k_row, v_row)` filling row `i` of them
    /// (rows a full ring evicts within the append are not written).
    fn commit_with(
        &mut self,
        t: usize,
        mut write: impl FnMut(usize, usize, &mut [f16], &mut [f16]),
    ) -> Result<(), ModelError> {
        let (rows, after) = self.placement.append(t);
        let needed = rows.iter().flatten().max().map_or(0, |&r| r + 1);
        self.ensure_rows(needed)?;
        let w = self.width;
        for (i, phys) in rows.iter().enumerate() {
            if let Some(r) = *phys {
                let block = &mut self.blocks[r / BLOCK_ROWS];
                let at = (r % BLOCK_ROWS) * w;
                write(i, w, &mut block.k[at..at + w], &mut block.v[at..at + w]);
            }
        }
        self.placement = after;
        Ok(())
    }

    /// Stores one decode row: as `store_and_attend` does for a chunk of one row, which every route
    /// takes in place (`RingPlacement::route`). `view` then shows every row its query may see.
    pub fn store_row(&mut self, k: &[f32], v: &[f32]) -> Result<(), ModelError> {
        self.commit(k, v, 1)
    }

    /// The cached rows, as attention reads them in place.
    pub fn view(&self) -> impl KvRows + '_ {
        CacheView { layer: self }
    }

    /// Stores a chunk of `t` rows and calls `attend` with a view of every row its queries may see.
    /// The route (store then attend, or stage → attend → commit) follows `RingPlacement::route`.
    pub fn store_and_attend(
        &mut self,
        k: &[f32],
        v: &[f32],
        t: usize,
        staging: &mut StagingBuffers,
        attend: impl FnOnce(&dyn KvRows),
    ) -> Result<(), ModelError> {
        match self.placement.route(t, self.window) {
            ChunkRoute::StoreThenAttend => {
                self.commit(k, v, t)?;
                attend(&self.view());
            }
            ChunkRoute::Staged { retained_from } => {
                let w = self.width;
                let end = self.placement.end();
                let rows = end - retained_from + t;
                staging.k.clear();
                staging.v.clear();
                staging.k.reserve(rows * w);
                staging.v.reserve(rows * w);
                for logical in retained_from..end {
                    let r = self.placement.physical(logical).expect("retained rows are cached");
                    staging.k.extend_from_slice(self.k_at(r));
                    staging.v.extend_from_slice(self.v_at(r));
                }
                let old = staging.k.len();
                staging.k.resize(rows * w, f16::ZERO);
                staging.v.resize(rows * w, f16::ZERO);
                to_f16(k, &mut staging.k[old..]);
                to_f16(v, &mut staging.v[old..]);
                attend(&StagedView {
                    k: &staging.k,
                    v: &staging.v,
                    first: retained_from,
                    width: w,
                });
                // Committed only after attention consumed the staged rows.
                self.commit(k, v, t)?;
            }
        }
        Ok(())
    }
}

fn to_f16(src: &[f32], dst: &mut [f16]) {
    use half::slice::HalfFloatSliceExt;
    dst.convert_from_f32_slice(src);
}

struct CacheView<'a> {
    layer: &'a LayerCache,
}

impl KvRows for CacheView<'_> {
    fn k_rows(&self, pos: usize) -> &[f16] {
        let (r, n) = self.layer.run_at(pos);
        let b = &self.layer.blocks[r / BLOCK_ROWS];
        &b.k[(r % BLOCK_ROWS) * self.layer.width..][..n * self.layer.width]
    }

    fn v_rows(&self, pos: usize) -> &[f16] {
        let (r, n) = self.layer.run_at(pos);
        let b = &self.layer.blocks[r / BLOCK_ROWS];
        &b.v[(r % BLOCK_ROWS) * self.layer.width..][..n * self.layer.width]
    }
}

struct StagedView<'a> {
    k: &'a [f16],
    v: &'a [f16],
    first: usize,
    width: usize,
}

impl KvRows for StagedView<'_> {
    fn k_rows(&self, pos: usize) -> &[f16] {
        &self.k[(pos - self.first) * self.width..]
    }

    fn v_rows(&self, pos: usize) -> &[f16] {
        &self.v[(pos - self.first) * self.width..]
    }
}

/// A copy of a sequence's sliding-window layers at one position: enough, with the global layers cut back
/// to the same position, to continue from there after the rings have moved on.
pub struct Checkpoint {
    pub pos: usize,
    rings: Vec<(usize, LayerCache)>,
}

impl Checkpoint {
    pub fn bytes(&self) -> usize {
        self.rings.iter().map(|(_, l)| l.bytes()).sum()
    }
}

impl LayerCache {
    /// Whether the cache still holds every row a query at `pos` would see, once rows from `pos` on
    /// are dropped.
    fn can_truncate(&self, pos: usize) -> bool {
        self.placement.can_truncate(pos, self.window)
    }

    fn truncate(&mut self, pos: usize) {
        self.placement.truncate(pos);
        // While nothing was evicted, physical rows are logical ones and the rows past the cut are free
        // again; a ring that wrapped keeps its blocks (the cut rows are spread over them).
        if self.placement.origin_logical == 0 {
            let keep = pos.div_ceil(BLOCK_ROWS);
            if self.blocks.len() > keep {
                self.pool.give(self.blocks.drain(keep..));
            }
        }
    }
}

/// All layers' caches of one sequence.
pub struct SequenceKv {
    pub layers: Vec<LayerCache>,
    pub n_ctx: usize,
}

impl SequenceKv {
    /// A cache for up to `n_ctx` positions: global layers may grow to `n_ctx` rows, sliding-window layers
    /// to their window plus `ring_slack`.
    pub fn new(config: &ModelConfig, n_ctx: usize, ring_slack: usize, pool: &Arc<KvPool>) -> Self {
        debug_assert_eq!(pool.width(), config.kv_width());
        let layers = config
            .layers
            .iter()
            .map(|l| LayerCache::new(layer_rows(l.window, n_ctx, ring_slack), l.window, Arc::clone(pool)))
            .collect();
        SequenceKv { layers, n_ctx }
    }

    /// Positions cached so far (the next position to be written).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.placement.end())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks that `t` more rows fit in the context.
    pub fn check_room(&self, t: usize) -> Result<(), ModelError> {
        if self.len() + t > self.n_ctx {
            return Err(ModelError::ContextFull {
                n_ctx: self.n_ctx,
                len: self.len(),
                adding: t,
            });
        }
        Ok(())
    }

    /// A copy with storage of its own from the pool: the same rows at the same physical places, the
    /// same placement. Fails (giving back what it took) when the KV budget has no room for it.
    pub fn try_clone(&self) -> Result<SequenceKv, ModelError> {
        let layers = self
            .layers
            .iter()
            .map(LayerCache::try_clone)
            .collect::<Result<_, _>>()?;
        Ok(SequenceKv {
            layers,
            n_ctx: self.n_ctx,
        })
    }

    /// Drops every position from `pos` on, keeping the sequence usable from there; false (and nothing
    /// changed) when a sliding-window layer has already overwritten rows a query at `pos` would need.
    pub fn truncate(&mut self, pos: usize) -> bool {
        if !self.layers.iter().all(|l| l.can_truncate(pos)) {
            return false;
        }
        self.layers.iter_mut().for_each(|l| l.truncate(pos));
        true
    }

    /// Copies the sliding-window layers at the current position (blocks from the pool, so this fails
    /// when the budget is spent).
    pub fn checkpoint(&self) -> Result<Checkpoint, ModelError> {
        let mut rings = Vec::new();
        for (i, l) in self.layers.iter().enumerate().filter(|(_, l)| l.window.is_some()) {
            rings.push((i, l.try_clone()?));
        }
        Ok(Checkpoint { pos: self.len(), rings })
    }

    /// Bytes a checkpoint taken now would hold.
    pub fn checkpoint_bytes(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.window.is_some())
            .map(LayerCache::bytes)
            .sum()
    }

    /// Goes back to a checkpoint taken earlier on this sequence, cut back to `pos` (at most the
    /// checkpoint's position): global layers are cut back, sliding-window layers replaced by copies of
    /// its rings. False when it cannot serve `pos`; the cache is then unchanged, or empty if the pool had
    /// no room for the copies (each ring's blocks go back before its copy is taken, so with the blocks
    /// the checkpoint was taken with that cannot happen).
    pub fn restore(&mut self, cp: &Checkpoint, pos: usize) -> bool {
        let ring_for = |i: usize| cp.rings.iter().find(|(j, _)| *j == i).map(|(_, l)| l);
        let fits = pos <= cp.pos
            && self.layers.iter().enumerate().all(|(i, l)| match ring_for(i) {
                Some(ring) => ring.can_truncate(pos),
                None => l.window.is_none() && l.can_truncate(pos),
            });
        if !fits {
            return false;
        }
        for (i, ring) in &cp.rings {
            let layer = &mut self.layers[*i];
            *layer = LayerCache::new(layer.placement.capacity, layer.window, Arc::clone(&layer.pool));
            match ring.try_clone() {
                Ok(copy) => *layer = copy,
                Err(_) => {
                    for l in &mut self.layers {
                        *l = LayerCache::new(l.placement.capacity, l.window, Arc::clone(&l.pool));
                    }
                    return false;
                }
            }
        }
        self.layers.iter_mut().for_each(|l| l.truncate(pos));
        true
    }

    /// Copies the cached rows `from..to` of layer `layer` (f16 K and V, in logical order) with the
    /// layer's placement, for a peer to install (`kv::wire`).
    pub fn export_rows(&self, layer: usize, from: usize, to: usize) -> Result<wire::LayerRows, ModelError> {
        let l = self
            .layers
            .get(layer)
            .ok_or_else(|| ModelError::Kv(format!("no layer {layer} to export")))?;
        if from >= to || l.placement.physical(from).is_none() || l.placement.physical(to - 1).is_none() {
            return Err(ModelError::Kv(format!(
                "layer {layer} does not hold rows {from}..{to} (it holds {}..{})",
                l.placement.origin_logical,
                l.placement.end()
            )));
        }
        let mut k = Vec::with_capacity((to - from) * l.width);
        let mut v = Vec::with_capacity((to - from) * l.width);
        for pos in from..to {
            let r = l.placement.physical(pos).expect("checked above: the range is cached");
            k.extend_from_slice(l.k_at(r));
            v.extend_from_slice(l.v_at(r));
        }
        Ok(wire::LayerRows {
            layer,
            first: from,
            placement: l.placement,
            k,
            v,
        })
    }

    /// Writes rows a peer exported into this (detached) cache, for a stream that fills positions
    /// `0..to`: checked with `wire::check_install` first, then appended as a local prefill would have
    /// (the same physical placement for the same capacity). Blocks come from the pool, so this fails
    /// when the KV budget is spent.
    pub fn install_rows(&mut self, rows: &wire::LayerRows, to: usize) -> Result<(), ModelError> {
        let width = self.layers.first().map_or(0, |l| l.width);
        let l = self
            .layers
            .get_mut(rows.layer)
            .ok_or_else(|| ModelError::Kv(format!("rows for layer {}, the model has fewer", rows.layer)))?;
        let start = wire::check_install(&l.placement, l.window, rows, width, to)?;
        if let Some(placement) = start {
            l.placement = placement;
        }
        let n = rows.n_rows(width);
        l.commit_with(n, |i, w, kd, vd| {
            kd.copy_from_slice(&rows.k[i * w..(i + 1) * w]);
            vd.copy_from_slice(&rows.v[i * w..(i + 1) * w]);
        })
    }

    /// Checks that an installed stream filled every layer to `to` with every row a query at `to` sees.
    pub fn check_installed(&self, to: usize) -> Result<(), ModelError> {
        wire::check_complete(self.layers.iter().map(|l| (l.placement, l.window)), to)
    }

    /// Per layer, the first row a stream filling `0..to` ships from here: what the layer's ring keeps
    /// at `to`, and no row it no longer holds.
    pub fn export_from(&self, to: usize) -> Vec<usize> {
        self.layers
            .iter()
            .map(|l| to.saturating_sub(l.placement.capacity).max(l.placement.origin_logical))
            .collect()
    }

    /// Bytes of K and V storage allocated now.
    pub fn bytes_allocated(&self) -> usize {
        self.layers.iter().map(LayerCache::bytes).sum()
    }

    /// Bytes the cache will hold once it has grown to `len` positions from what it holds now (storage
    /// grows in blocks and keeps them while it grows, so a ring cut back keeps its blocks).
    pub fn bytes_reaching(&self, len: usize) -> usize {
        self.layers
            .iter()
            .map(|l| l.blocks.len().max(len.min(l.placement.capacity).div_ceil(GROW_ROWS)) * l.pool.block_bytes())
            .sum()
    }

    /// Bytes the cache will hold once it has `len` positions (storage grows in steps of 256 rows).
    pub fn bytes_at(&self, len: usize) -> usize {
        self.layers
            .iter()
            .map(|l| len.min(l.placement.capacity).div_ceil(GROW_ROWS) * l.pool.block_bytes())
            .sum()
    }

    /// Bytes the cache would hold with every layer full.
    pub fn bytes_at_capacity(&self) -> usize {
        self.layers.iter().map(|l| l.placement.capacity * l.width * 2 * 2).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Activation, Arch, LayerSpec, RopeParams, RopeStyle};

    /// Gemma 3 270M's shape: 18 layers, every 6th global, window 512, one KV head of 256.
    fn gemma3_270m() -> ModelConfig {
        let rope = RopeParams {
            style: RopeStyle::Neox,
            n_rot: 256,
            freq_base: 10_000.0,
            freq_scale: 1.0,
        };
        ModelConfig {
            arch: Arch::Gemma3,
            n_vocab: 262144,
            d_model: 640,
            n_head: 4,
            n_kv_head: 1,
            head_dim: 256,
            d_ff: 2048,
            eps: 1e-6,
            context_length: 32768,
            layers: (0..18)
                .map(|i| LayerSpec {
                    window: (i % 6 != 5).then_some(512),
                    rope,
                })
                .collect(),
            attn_scale: 1.0 / 16.0,
            embed_scale: Some(640f32.sqrt()),
            activation: Activation::GeluTanh,
            qk_norm: true,
            post_norms: true,
            moe: None,
        }
    }

    #[test]
    fn gemma3_kv_at_32k_context_fits_110_mb() {
        let config = gemma3_270m();
        let mut kv = SequenceKv::new(&config, 32768, 0, &KvPool::new(config.kv_width(), None));
        assert_eq!(kv.bytes_at_capacity(), 3 * 32768 * 1024 + 15 * 512 * 1024);
        let mut staging = StagingBuffers::default();
        let width = config.kv_width();
        let chunk = 512;
        let k = vec![0.5f32; chunk * width];
        while kv.len() < 32768 {
            for layer in &mut kv.layers {
                layer.store_and_attend(&k, &k, chunk, &mut staging, |_| {}).unwrap();
            }
        }
        assert_eq!(kv.len(), 32768);
        assert!(
            kv.bytes_allocated() <= 110_000_000,
            "{} bytes of KV",
            kv.bytes_allocated()
        );
        assert_eq!(kv.bytes_allocated(), kv.bytes_at_capacity());
        assert!(kv.check_room(1).is_err(), "the context is full");
    }

    /// Gemma 3 270M's first six layers: five sliding-window layers and a global one.
    fn six_gemma_layers() -> ModelConfig {
        ModelConfig {
            layers: gemma3_270m().layers[..6].to_vec(),
            ..gemma3_270m()
        }
    }

    /// Stores `t` rows of ones in every layer of `kv`, as one chunk.
    fn fill(kv: &mut SequenceKv, t: usize, staging: &mut StagingBuffers) {
        let k = vec![1.0f32; t * kv.layers[0].width];
        for layer in &mut kv.layers {
            layer.store_and_attend(&k, &k, t, staging, |_| {}).unwrap();
        }
    }

    #[test]
    fn truncate_and_checkpoints() {
        let config = six_gemma_layers();
        let mut staging = StagingBuffers::default();
        let mut kv = SequenceKv::new(&config, 4096, RING_SLACK, &KvPool::new(config.kv_width(), None));
        fill(&mut kv, 300, &mut staging);
        assert!(kv.truncate(200), "rings have not wrapped: any point works");
        assert_eq!(kv.len(), 200);
        let cp = kv.checkpoint().unwrap();
        fill(&mut kv, 1000, &mut staging);
        assert_eq!(kv.len(), 1200);
        let later = kv.checkpoint().unwrap();
        assert!(!kv.truncate(500), "the rings lost rows 432..500 needs");
        assert_eq!(kv.len(), 1200, "a refused truncate changes nothing");
        // A query at the cut needs the 511 rows before it: the ring holds 768, so the cut may go back
        // RING_SLACK + 1 rows.
        let deepest = 1200 - RING_SLACK - 1;
        assert!(!kv.truncate(deepest - 1), "one row past the slack");
        assert!(
            kv.truncate(deepest),
            "the ring's slack keeps the window of a cut this deep"
        );
        // A checkpoint taken after the rings wrapped, cut back as deep as the slack allows.
        assert!(!kv.restore(&later, deepest - 1));
        assert_eq!(kv.len(), deepest, "a refused restore changes nothing");
        assert!(kv.restore(&later, deepest));
        assert_eq!(kv.len(), deepest);
        assert!(kv.layers.iter().all(|l| l.placement.end() == deepest));
        assert!(kv.restore(&cp, 200));
        assert_eq!(kv.len(), 200);
        assert!(kv.layers.iter().all(|l| l.placement.end() == 200));
        assert!(!kv.restore(&cp, 201), "a checkpoint serves no position past its own");
        assert!(kv.restore(&cp, 150), "a checkpoint serves positions before its own");
        assert_eq!(kv.len(), 150);
    }

    /// A verify pass of up to `rewind_room` drafts (plus the fed token) over a wrapped ring can always be
    /// cut back to keep only the fed token; one draft more than the slack allows can not.
    #[test]
    fn a_pass_within_the_rewind_room_can_be_cut_back() {
        use crate::ServingCache;
        let config = six_gemma_layers();
        let width = config.kv_width();
        let mut staging = StagingBuffers::default();
        // A ring as long as the context never wraps: nothing limits a pass.
        let pool = KvPool::new(width, None);
        assert_eq!(SequenceKv::new(&config, 400, 0, &pool).rewind_room(), usize::MAX);
        for slack in [0, 8, RING_SLACK] {
            let pool = KvPool::new(width, None);
            assert_eq!(SequenceKv::new(&config, 4096, slack, &pool).rewind_room(), slack);
            for drafts in [0, slack, slack + 1, slack + 2] {
                let mut kv = SequenceKv::new(&config, 4096, slack, &pool);
                fill(&mut kv, 1000, &mut staging);
                fill(&mut kv, drafts + 1, &mut staging);
                assert_eq!(kv.truncate(1001), drafts <= slack + 1, "slack {slack} drafts {drafts}");
            }
        }
    }

    /// Rows seen by the attention callback for each chunk, checked against the window rule.
    #[test]
    fn every_route_shows_exactly_the_visible_rows() {
        let config = ModelConfig {
            layers: vec![gemma3_270m().layers[0]; 1],
            ..gemma3_270m()
        };
        let window = 512;
        for chunks in [
            vec![1138],
            vec![1; 1100],
            vec![600, 1, 1, 64, 64, 7, 400],
            vec![511, 65, 65, 65, 512],
        ] {
            let mut kv = SequenceKv::new(&config, 4096, 0, &KvPool::new(config.kv_width(), None));
            let mut staging = StagingBuffers::default();
            let width = config.kv_width();
            for t in chunks {
                let start = kv.len();
                // Row values encode their position, so a view that returns the wrong row is caught.
                let k: Vec<f32> = (0..t * width).map(|i| ((start + i / width) % 2048) as f32).collect();
                kv.layers[0]
                    .store_and_attend(&k, &k, t, &mut staging, |view| {
                        for p in start..start + t {
                            for key in (p + 1).saturating_sub(window)..=p {
                                // The run from `key`: whole rows of consecutive positions, `key` first.
                                let (k_run, v_run) = (view.k_rows(key), view.v_rows(key));
                                assert!(!k_run.is_empty() && k_run.len().is_multiple_of(width));
                                assert_eq!(k_run.len(), v_run.len(), "key {key}");
                                for (i, (kr, vr)) in
                                    k_run.chunks_exact(width).zip(v_run.chunks_exact(width)).enumerate()
                                {
                                    let want = ((key + i) % 2048) as f32;
                                    assert_eq!(kr[0].to_f32(), want, "row {i} of the run at key {key} for query {p}");
                                    assert_eq!(vr[width - 1].to_f32(), want, "row {i} of the run at key {key}");
                                }
                            }
                        }
                    })
                    .unwrap();
            }
        }
    }
}
