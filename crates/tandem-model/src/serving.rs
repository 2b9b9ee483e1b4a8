//! What the serving engine asks of a backend beyond the layer graph: sizing a request's KV before it
//! runs, a cap on KV memory, and cutting a finished conversation's cache back (or restoring a
//! checkpoint of its sliding-window rings) so a follow-up turn reuses it. The CPU implementation is
//! here; the CUDA one lives with its cache in `tandem-cuda`.

use crate::backend::{Backend, SequenceCache};
use crate::config::ModelConfig;
use crate::kv::wire::LayerRows;
use crate::kv::{layer_rows, Checkpoint, SequenceKv, BLOCK_ROWS};
use crate::{Model, ModelError};

/// How many KV bytes a sequence holds at a given length: what admission reserves for a request. Plain
/// data, so the engine's handle sizes requests on any thread without the backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvSizing {
    /// Rows each layer may hold: the context, or the window of a sliding-window layer.
    pub layer_rows: Vec<usize>,
    /// Bytes of one row of K and V together.
    pub row_bytes: usize,
    /// Storage grows in steps of this many rows; `None`: every layer is allocated whole up front.
    pub grow_rows: Option<usize>,
}

impl KvSizing {
    /// A sequence of up to `n_ctx` positions with `config`'s layers (f16 K and V), rings keeping
    /// `ring_slack` rows past their window.
    pub fn new(config: &ModelConfig, n_ctx: usize, ring_slack: usize, grow_rows: Option<usize>) -> Self {
        KvSizing {
            layer_rows: config
                .layers
                .iter()
                .map(|l| layer_rows(l.window, n_ctx, ring_slack))
                .collect(),
            row_bytes: config.kv_width() * 2 * 2,
            grow_rows,
        }
    }

    /// Bytes the sequence holds once it has `len` positions.
    pub fn bytes_at(&self, len: usize) -> usize {
        self.layer_rows
            .iter()
            .map(|&rows| match self.grow_rows {
                Some(step) => len.min(rows).div_ceil(step) * step * self.row_bytes,
                None => rows * self.row_bytes,
            })
            .sum()
    }
}

/// A copy of a sequence's state at one position, to go back to later.
pub trait KvCheckpoint {
    /// The position it was taken at.
    fn pos(&self) -> usize;
    /// Bytes of KV storage it holds.
    fn bytes(&self) -> usize;
}

/// A sequence cache the serving loop can reuse across turns.
pub trait ServingCache: SequenceCache {
    type Checkpoint: KvCheckpoint;
    /// Drops every position from `pos` on; false (and nothing changed) when a sliding-window layer has
    /// already overwritten rows a query at `pos` would need.
    fn truncate(&mut self, pos: usize) -> bool;
    /// Rows a pass may write past the current end and still be cut back (`truncate`) to any position
    /// after the end: what bounds a speculative verify pass. `usize::MAX` without sliding-window layers.
    fn rewind_room(&self) -> usize;
    /// Copies what `truncate` cannot take back (the sliding-window layers) at the current position;
    /// fails when the KV budget has no room for the copy.
    fn checkpoint(&self) -> Result<Self::Checkpoint, ModelError>;
    /// Bytes a checkpoint taken now would hold (0: nothing to copy).
    fn checkpoint_bytes(&self) -> usize;
    /// Goes back to a checkpoint taken earlier on this sequence, cut back to `pos` (at most the
    /// checkpoint's position); false when it cannot serve `pos`, and then the cache is unchanged or,
    /// if copying failed midway, empty.
    fn restore(&mut self, cp: &Self::Checkpoint, pos: usize) -> bool;
    /// Bytes the cache will hold once it has grown to `len` positions from where it is now: what a
    /// request continuing on it must reserve (storage it holds is not given back while it grows).
    fn bytes_reaching(&self, len: usize) -> usize;
    /// Makes this cache (fresh from `new_kv`, of the same context) a copy of `other`: the same rows at the
    /// same physical places, the same placement. A remote prefill continues a conversation in such a copy,
    /// so the conversation stays untouched until the stream is complete. Fails when the KV budget has no
    /// room for the copy.
    fn copy_from(&mut self, other: &Self) -> Result<(), ModelError>
    where
        Self: Sized;
    /// Copies the cached rows `from..to` of layer `layer` for a peer (`kv::wire`).
    fn export_rows(&self, layer: usize, from: usize, to: usize) -> Result<LayerRows, ModelError>;
    /// Per layer, the first row a stream filling `0..to` ships from now: what the layer keeps at `to`,
    /// and no row it no longer holds.
    fn export_from(&self, to: usize) -> Vec<usize>;
    /// Writes a peer's rows into this detached cache, which the stream fills to `to`
    /// (`kv::wire::check_install` first; the same placement a local prefill gives).
    fn install_rows(&mut self, rows: &LayerRows, to: usize) -> Result<(), ModelError>;
    /// Checks that an installed stream filled every layer to `to` with every row a query at `to` sees.
    fn check_installed(&self, to: usize) -> Result<(), ModelError>;
}

/// A backend the serving engine can run: its caches are reusable and its KV memory capped.
pub trait ServingBackend: Backend<Kv: ServingCache> {
    /// Caps the KV bytes of every sequence and checkpoint together; takes effect for caches made
    /// afterwards.
    fn set_kv_budget(&mut self, bytes: usize);
    /// Rows sliding-window layers keep past their window in caches made afterwards.
    fn set_ring_slack(&mut self, rows: usize);
    /// How a sequence of up to `n_ctx` positions grows.
    fn kv_sizing(&self, n_ctx: usize) -> KvSizing;
    /// KV bytes held now by every sequence and checkpoint.
    fn kv_bytes_in_use(&self) -> usize;
    /// What a mixture's experts outside device memory have cost so far (`None`: all are where the
    /// backend computes them).
    fn expert_traffic(&self) -> Option<ExpertTraffic> {
        None
    }
}

/// Counters of a mixture's experts kept in host memory and copied to the device as they are used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertTraffic {
    /// Experts a step or short chunk found in a device slot already.
    pub cache_hits: u64,
    /// Experts copied into a slot for a step or short chunk.
    pub cache_copies: u64,
    /// Experts a decode step computed on the CPU instead.
    pub cpu_experts: u64,
    /// Experts a long prefill chunk streamed, and skipped because no row routed to them.
    pub stream_copies: u64,
    pub stream_skips: u64,
    /// Bytes copied from host memory.
    pub bytes: u64,
}

impl KvCheckpoint for Checkpoint {
    fn pos(&self) -> usize {
        self.pos
    }

    fn bytes(&self) -> usize {
        Checkpoint::bytes(self)
    }
}

impl ServingCache for SequenceKv {
    type Checkpoint = Checkpoint;

    fn truncate(&mut self, pos: usize) -> bool {
        SequenceKv::truncate(self, pos)
    }

    fn rewind_room(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.placement.rewind_room(l.window, self.n_ctx))
            .min()
            .unwrap_or(usize::MAX)
    }

    fn checkpoint(&self) -> Result<Checkpoint, ModelError> {
        SequenceKv::checkpoint(self)
    }

    fn checkpoint_bytes(&self) -> usize {
        SequenceKv::checkpoint_bytes(self)
    }

    fn restore(&mut self, cp: &Checkpoint, pos: usize) -> bool {
        SequenceKv::restore(self, cp, pos)
    }

    fn bytes_reaching(&self, len: usize) -> usize {
        SequenceKv::bytes_reaching(self, len)
    }

    fn copy_from(&mut self, other: &SequenceKv) -> Result<(), ModelError> {
        *self = other.try_clone()?;
        Ok(())
    }

    fn export_rows(&self, layer: usize, from: usize, to: usize) -> Result<LayerRows, ModelError> {
        SequenceKv::export_rows(self, layer, from, to)
    }

    fn export_from(&self, to: usize) -> Vec<usize> {
        SequenceKv::export_from(self, to)
    }

    fn install_rows(&mut self, rows: &LayerRows, to: usize) -> Result<(), ModelError> {
        SequenceKv::install_rows(self, rows, to)
    }

    fn check_installed(&self, to: usize) -> Result<(), ModelError> {
        SequenceKv::check_installed(self, to)
    }
}

impl ServingBackend for Model {
    fn set_kv_budget(&mut self, bytes: usize) {
        Model::set_kv_budget(self, bytes);
    }

    fn set_ring_slack(&mut self, rows: usize) {
        self.ring_slack = rows;
    }

    /// CPU caches take blocks from the pool as they grow.
    fn kv_sizing(&self, n_ctx: usize) -> KvSizing {
        KvSizing::new(&self.config, n_ctx, self.ring_slack, Some(BLOCK_ROWS))
    }

    fn kv_bytes_in_use(&self) -> usize {
        self.kv_pool.bytes_in_use()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Activation, Arch, LayerSpec, RopeParams, RopeStyle};
    use crate::kv::{KvPool, RING_SLACK};

    fn config(windows: &[Option<usize>], kv_heads: usize) -> ModelConfig {
        let rope = RopeParams {
            style: RopeStyle::Neox,
            n_rot: 64,
            freq_base: 10_000.0,
            freq_scale: 1.0,
        };
        ModelConfig {
            arch: Arch::Gemma3,
            n_vocab: 512,
            d_model: 256,
            n_head: 4,
            n_kv_head: kv_heads,
            head_dim: 64,
            d_ff: 512,
            eps: 1e-6,
            context_length: 8192,
            layers: windows.iter().map(|&window| LayerSpec { window, rope }).collect(),
            attn_scale: 0.125,
            embed_scale: None,
            activation: Activation::GeluTanh,
            qk_norm: true,
            post_norms: true,
            moe: None,
        }
    }

    #[test]
    fn cpu_sizing_matches_what_the_cache_allocates() {
        for (windows, kv_heads, n_ctx) in [
            (vec![None, None], 1, 4096),
            (vec![Some(512), Some(512), None], 2, 3000),
            (vec![Some(1024), None], 4, 700),
            (vec![Some(8); 5], 1, 100),
        ] {
            let c = config(&windows, kv_heads);
            let kv = SequenceKv::new(&c, n_ctx, RING_SLACK, &KvPool::new(c.kv_width(), None));
            let sizing = KvSizing::new(&c, n_ctx, RING_SLACK, Some(BLOCK_ROWS));
            for len in [0, 1, 255, 256, 257, 511, 512, 513, 699, 700, 1500, 2999, 3000, 4096] {
                assert_eq!(
                    sizing.bytes_at(len),
                    kv.bytes_at(len),
                    "{windows:?} n_ctx {n_ctx} len {len}"
                );
            }
        }
    }

    #[test]
    fn whole_allocation_is_the_full_capacity_at_any_length() {
        let c = config(&[Some(512), None, Some(512)], 2);
        let sizing = KvSizing::new(&c, 2048, RING_SLACK, None);
        let ring = 512 + RING_SLACK;
        let whole = (ring + 2048 + ring) * c.kv_width() * 4;
        assert_eq!(sizing.bytes_at(1), whole);
        assert_eq!(sizing.bytes_at(2048), whole);
        // A context shorter than the window caps the ring too.
        assert_eq!(
            KvSizing::new(&c, 100, RING_SLACK, None).bytes_at(5),
            300 * c.kv_width() * 4
        );
    }
}
