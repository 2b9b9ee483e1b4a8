//! Per-sequence KV caches on the GPU: f16 K and V per layer, placed by the same `RingPlacement`
//! metadata as the CPU cache (global layers grow to the context, sliding-window layers are rings of
//! `window` rows). Storage is allocated for the whole capacity when the sequence is made.
//!
//! For serving, caches and their checkpoints count their device bytes in the GPU's `KvLedger`, the
//! counterpart of the CPU's block pool: `--kv-budget` caps them the same way. A checkpoint copies the
//! sliding-window rings device to device; a restore copies them back into the same buffers, so a decode
//! graph captured for the sequence (which holds their addresses) stays valid.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use half::f16;
use tandem_model::kv::wire::{self, LayerRows};
use tandem_model::kv::RingPlacement;
use tandem_model::{KvCheckpoint, KvSizing, ModelConfig, ModelError, SequenceCache, ServingCache};

use crate::attention::rows::buffer_table;
use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::runtime::ledger::KvGrant;
use crate::CudaError;

pub struct GpuLayerCache {
    pub placement: RingPlacement,
    pub window: Option<usize>,
    pub k: CudaSlice<u16>,
    pub v: CudaSlice<u16>,
}

pub struct GpuSequenceKv {
    /// Unique per sequence: captured decode graphs are keyed by it (they hold its buffers' addresses).
    pub id: u64,
    pub layers: Vec<GpuLayerCache>,
    pub n_ctx: usize,
    pub kv_width: usize,
    /// Every layer's K and V buffer addresses (K then V, layer by layer), in device memory: a batched
    /// decode step's attention kernel finds each row's caches through them (`attend_rope_rows_*`).
    pub buffers: CudaSlice<u64>,
    grant: KvGrant,
}

impl GpuSequenceKv {
    pub fn new(gpu: &Gpu, config: &ModelConfig, n_ctx: usize, ring_slack: usize) -> Result<Self, CudaError> {
        let w = config.kv_width();
        // The serving engine reserves exactly these bytes for a request: one formula for both.
        let sizing = KvSizing::new(config, n_ctx, ring_slack, None);
        let grant = gpu.kv_ledger.grant(sizing.bytes_at(n_ctx))?;
        let mut layers = Vec::with_capacity(config.layers.len());
        for (spec, &capacity) in config.layers.iter().zip(&sizing.layer_rows) {
            layers.push(GpuLayerCache {
                placement: RingPlacement::new(capacity),
                window: spec.window,
                k: gpu.alloc::<u16>(capacity * w)?,
                v: gpu.alloc::<u16>(capacity * w)?,
            });
        }
        // The buffers never move (a restore copies into them), so their addresses are written once.
        let buffers = buffer_table(gpu, layers.iter().map(|l| (&l.k, &l.v)))?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Ok(GpuSequenceKv {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            layers,
            n_ctx,
            kv_width: w,
            buffers,
            grant,
        })
    }

    /// Device bytes held by K and V of every layer.
    pub fn bytes(&self) -> usize {
        self.grant.bytes
    }
}

impl SequenceCache for GpuSequenceKv {
    fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.placement.end())
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn bytes_allocated(&self) -> usize {
        self.bytes()
    }

    /// Device caches are allocated whole when the sequence is made.
    fn bytes_at_capacity(&self) -> usize {
        self.bytes()
    }
}

/// Device copies of a sequence's sliding-window layers at one position.
pub struct GpuCheckpoint {
    pub pos: usize,
    rings: Vec<RingCopy>,
    grant: KvGrant,
}

struct RingCopy {
    layer: usize,
    placement: RingPlacement,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
}

impl KvCheckpoint for GpuCheckpoint {
    fn pos(&self) -> usize {
        self.pos
    }

    fn bytes(&self) -> usize {
        self.grant.bytes
    }
}

impl GpuSequenceKv {
    /// Copies `cp`'s rings back into this sequence's buffers.
    fn copy_back(&mut self, cp: &GpuCheckpoint) -> Result<(), CudaError> {
        for ring in &cp.rings {
            let layer = &mut self.layers[ring.layer];
            let stream = Arc::clone(layer.k.stream());
            driver("cuMemcpyDtoD (restore K)", stream.memcpy_dtod(&ring.k, &mut layer.k))?;
            driver("cuMemcpyDtoD (restore V)", stream.memcpy_dtod(&ring.v, &mut layer.v))?;
            layer.placement = ring.placement;
        }
        Ok(())
    }
}

impl ServingCache for GpuSequenceKv {
    type Checkpoint = GpuCheckpoint;

    fn truncate(&mut self, pos: usize) -> bool {
        if !self.layers.iter().all(|l| l.placement.can_truncate(pos, l.window)) {
            return false;
        }
        // The whole capacity stays allocated: only the placement moves back.
        self.layers.iter_mut().for_each(|l| l.placement.truncate(pos));
        true
    }

    fn rewind_room(&self) -> usize {
        self.layers
            .iter()
            .map(|l| l.placement.rewind_room(l.window, self.n_ctx()))
            .min()
            .unwrap_or(usize::MAX)
    }

    fn checkpoint(&self) -> Result<GpuCheckpoint, ModelError> {
        let rings: Vec<(usize, &GpuLayerCache)> = self
            .layers
            .iter()
            .enumerate()
            .filter(|(_, l)| l.window.is_some())
            .collect();
        let bytes = rings.iter().map(|(_, l)| l.k.num_bytes() + l.v.num_bytes()).sum();
        let grant = self.grant.ledger.grant(bytes)?;
        let mut copies = Vec::with_capacity(rings.len());
        for (layer, l) in rings {
            copies.push(RingCopy {
                layer,
                placement: l.placement,
                k: driver("cuMemcpyDtoD (checkpoint K)", l.k.try_clone())?,
                v: driver("cuMemcpyDtoD (checkpoint V)", l.v.try_clone())?,
            });
        }
        Ok(GpuCheckpoint {
            pos: self.len(),
            rings: copies,
            grant,
        })
    }

    fn checkpoint_bytes(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.window.is_some())
            .map(|l| l.k.num_bytes() + l.v.num_bytes())
            .sum()
    }

    /// As on the CPU, except that the rings are copied back into the same buffers (a captured decode
    /// graph holds their addresses), and a device copy failing midway leaves the sequence empty.
    fn restore(&mut self, cp: &GpuCheckpoint, pos: usize) -> bool {
        let fits = pos <= cp.pos
            && self.layers.iter().enumerate().all(|(i, l)| {
                match cp.rings.iter().find(|r| r.layer == i) {
                    // Same buffer sizes: a checkpoint of this sequence (the copy needs no bounds of its own).
                    Some(r) => {
                        r.k.len() == l.k.len() && r.v.len() == l.v.len() && r.placement.can_truncate(pos, l.window)
                    }
                    None => l.window.is_none() && l.placement.can_truncate(pos, None),
                }
            });
        if !fits {
            return false;
        }
        if self.copy_back(cp).is_err() {
            for l in &mut self.layers {
                l.placement = RingPlacement::new(l.placement.capacity);
            }
            return false;
        }
        self.layers.iter_mut().for_each(|l| l.placement.truncate(pos));
        true
    }

    /// Device caches are allocated whole: they never grow.
    fn bytes_reaching(&self, _len: usize) -> usize {
        self.bytes()
    }

    /// Device to device into this cache's own buffers, so its buffer table stays valid.
    fn copy_from(&mut self, other: &GpuSequenceKv) -> Result<(), ModelError> {
        let same = self.layers.len() == other.layers.len()
            && self
                .layers
                .iter()
                .zip(&other.layers)
                .all(|(a, b)| a.k.len() == b.k.len() && a.v.len() == b.v.len());
        if !same {
            return Err(ModelError::Kv("copying a KV cache of another context".into()));
        }
        for (a, b) in self.layers.iter_mut().zip(&other.layers) {
            let stream = Arc::clone(a.k.stream());
            driver("cuMemcpyDtoD (copy K)", stream.memcpy_dtod(&b.k, &mut a.k))?;
            driver("cuMemcpyDtoD (copy V)", stream.memcpy_dtod(&b.v, &mut a.v))?;
            a.placement = b.placement;
        }
        Ok(())
    }

    /// Device to host, one copy per contiguous physical run (at most two: a ring wraps once).
    fn export_rows(&self, layer: usize, from: usize, to: usize) -> Result<LayerRows, ModelError> {
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
        let w = self.kv_width;
        let physical: Vec<Option<usize>> = (from..to).map(|p| l.placement.physical(p)).collect();
        let mut k = vec![0u16; (to - from) * w];
        let mut v = vec![0u16; (to - from) * w];
        let stream = Arc::clone(l.k.stream());
        for (at, r, n) in runs(&physical) {
            let (src, dst) = (r * w..(r + n) * w, at * w..(at + n) * w);
            driver(
                "cuMemcpyDtoH (export K)",
                stream.memcpy_dtoh(&l.k.slice(src.clone()), &mut k[dst.clone()]),
            )?;
            driver(
                "cuMemcpyDtoH (export V)",
                stream.memcpy_dtoh(&l.v.slice(src), &mut v[dst]),
            )?;
        }
        driver("cuStreamSynchronize (export)", stream.synchronize())?;
        Ok(LayerRows {
            layer,
            first: from,
            placement: l.placement,
            k: k.into_iter().map(f16::from_bits).collect(),
            v: v.into_iter().map(f16::from_bits).collect(),
        })
    }

    fn export_from(&self, to: usize) -> Vec<usize> {
        self.layers
            .iter()
            .map(|l| to.saturating_sub(l.placement.capacity).max(l.placement.origin_logical))
            .collect()
    }

    /// Host to device into the whole-capacity buffers, at the rows a local prefill would write.
    fn install_rows(&mut self, rows: &LayerRows, to: usize) -> Result<(), ModelError> {
        let w = self.kv_width;
        let l = self
            .layers
            .get_mut(rows.layer)
            .ok_or_else(|| ModelError::Kv(format!("rows for layer {}, the model has fewer", rows.layer)))?;
        if let Some(start) = wire::check_install(&l.placement, l.window, rows, w, to)? {
            l.placement = start;
        }
        let (physical, after) = l.placement.append(rows.n_rows(w));
        let k: Vec<u16> = rows.k.iter().map(|x| x.to_bits()).collect();
        let v: Vec<u16> = rows.v.iter().map(|x| x.to_bits()).collect();
        let stream = Arc::clone(l.k.stream());
        for (at, r, n) in runs(&physical) {
            let (dst, src) = (r * w..(r + n) * w, at * w..(at + n) * w);
            driver(
                "cuMemcpyHtoD (install K)",
                stream.memcpy_htod(&k[src.clone()], &mut l.k.slice_mut(dst.clone())),
            )?;
            driver(
                "cuMemcpyHtoD (install V)",
                stream.memcpy_htod(&v[src], &mut l.v.slice_mut(dst)),
            )?;
        }
        driver("cuStreamSynchronize (install)", stream.synchronize())?;
        l.placement = after;
        Ok(())
    }

    fn check_installed(&self, to: usize) -> Result<(), ModelError> {
        wire::check_complete(self.layers.iter().map(|l| (l.placement, l.window)), to)
    }
}

/// `(index, physical row, rows)` of each run of consecutive physical rows in `rows` (`None`: skipped).
fn runs(rows: &[Option<usize>]) -> Vec<(usize, usize, usize)> {
    let mut out: Vec<(usize, usize, usize)> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let Some(r) = *r else { continue };
        match out.last_mut() {
            Some((at, start, n)) if *at + *n == i && *start + *n == r => *n += 1,
            _ => out.push((i, r, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_model::config::{Activation, Arch, LayerSpec};
    use tandem_model::config::{RopeParams, RopeStyle};

    /// A ring of 4 rows and a global layer, one KV head of 32.
    fn small_config() -> ModelConfig {
        let rope = RopeParams {
            style: RopeStyle::Neox,
            n_rot: 32,
            freq_base: 10_000.0,
            freq_scale: 1.0,
        };
        ModelConfig {
            arch: Arch::Gemma3,
            n_vocab: 512,
            d_model: 64,
            n_head: 2,
            n_kv_head: 1,
            head_dim: 32,
            d_ff: 128,
            eps: 1e-6,
            context_length: 16,
            layers: vec![LayerSpec { window: Some(4), rope }, LayerSpec { window: None, rope }],
            attn_scale: 0.18,
            embed_scale: None,
            activation: Activation::GeluTanh,
            qk_norm: true,
            post_norms: true,
            moe: None,
        }
    }

    /// A CPU cache's rows (a wrapped ring and a global layer) installed on the device and exported back:
    /// the same rows and placement. Runs only where a GPU is.
    #[test]
    fn kv_rows_install_and_export_on_the_device() {
        use tandem_model::kv::{KvPool, SequenceKv, StagingBuffers, RING_SLACK};
        let gpu = match Gpu::new(0, crate::options::CudaOptions::default()) {
            Ok(gpu) => gpu,
            Err(CudaError::Unavailable(why)) => {
                eprintln!("no GPU, KV install not exercised: {why}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let config = small_config();
        let n_ctx = 300;
        let w = config.kv_width();
        let mut cpu = SequenceKv::new(&config, n_ctx, RING_SLACK, &KvPool::new(w, None));
        let mut staging = StagingBuffers::default();
        for t in [100, 150, 40] {
            let start = cpu.len();
            for (li, layer) in cpu.layers.iter_mut().enumerate() {
                let k: Vec<f32> = (0..t * w)
                    .map(|i| (li * 500 + start + i / w) as f32 + (i % w) as f32 / 64.0)
                    .collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                layer.store_and_attend(&k, &v, t, &mut staging, |_| {}).unwrap();
            }
        }
        let to = cpu.len();
        assert!(cpu.layers[0].placement.is_wrapped(), "the ring wrapped");
        let mut dev = GpuSequenceKv::new(&gpu, &config, n_ctx, RING_SLACK).unwrap();
        let from = cpu.export_from(to);
        for (layer, &f) in from.iter().enumerate() {
            // In two pieces, as chunks arrive.
            let mid = (f + to) / 2;
            dev.install_rows(&cpu.export_rows(layer, f, mid).unwrap(), to).unwrap();
            dev.install_rows(&cpu.export_rows(layer, mid, to).unwrap(), to).unwrap();
        }
        dev.check_installed(to).unwrap();
        assert_eq!(dev.export_from(to), from);
        for (layer, &f) in from.iter().enumerate() {
            assert_eq!(dev.layers[layer].placement, cpu.layers[layer].placement);
            let (a, b) = (
                dev.export_rows(layer, f, to).unwrap(),
                cpu.export_rows(layer, f, to).unwrap(),
            );
            assert_eq!((a.k, a.v), (b.k, b.v), "layer {layer}");
        }
    }

    /// Runs only where a GPU is; elsewhere `Gpu::new` must say why not.
    #[test]
    fn checkpoint_and_restore_on_the_device() {
        let gpu = match Gpu::new(0, crate::options::CudaOptions::default()) {
            Ok(gpu) => gpu,
            Err(CudaError::Unavailable(why)) => {
                eprintln!("no GPU, device copies not exercised: {why}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let config = small_config();
        // The ring holds its window of 4 plus the slack; the context lets it wrap.
        let n_ctx = 4 + tandem_model::kv::RING_SLACK + 40;
        let mut kv = GpuSequenceKv::new(&gpu, &config, n_ctx, tandem_model::kv::RING_SLACK).unwrap();
        let ring_rows = 4 + tandem_model::kv::RING_SLACK;
        let at = ring_rows + 2;
        let fill = |kv: &mut GpuSequenceKv, value: u16, rows: usize| {
            for l in &mut kv.layers {
                let n = l.k.len();
                gpu.stream.memcpy_htod(&vec![value; n], &mut l.k).unwrap();
                gpu.stream.memcpy_htod(&vec![value + 1; n], &mut l.v).unwrap();
                l.placement = l.placement.append(rows).1;
            }
        };
        fill(&mut kv, 10, at);
        let ring_at_cp = kv.layers[0].placement;
        assert!(ring_at_cp.is_wrapped());
        let cp = kv.checkpoint().unwrap();
        assert_eq!((cp.pos, cp.bytes()), (at, 2 * ring_rows * 32 * 2));
        assert_eq!(gpu.kv_ledger.in_use(), kv.bytes() + cp.bytes());
        fill(&mut kv, 20, 3);
        assert!(!kv.truncate(6), "the ring moved past what position 6 needs");
        assert!(!kv.restore(&cp, at + 1), "a checkpoint serves no position past its own");
        assert!(kv.restore(&cp, at));
        assert_eq!(kv.len(), at);
        assert_eq!(kv.layers[0].placement, ring_at_cp);
        assert_eq!(kv.layers[1].placement.end(), at);
        let ring_k = gpu.download(&kv.layers[0].k).unwrap();
        let ring_v = gpu.download(&kv.layers[0].v).unwrap();
        assert!(ring_k.iter().all(|&x| x == 10) && ring_v.iter().all(|&x| x == 11));
        assert!(kv.truncate(at - 5), "a restored cache cuts back like any other");
        // No room in the budget: the checkpoint is refused, not allocated past it.
        gpu.kv_ledger.set_budget(Some(gpu.kv_ledger.in_use()));
        assert!(matches!(kv.checkpoint(), Err(ModelError::KvFull { .. })));
        drop(cp);
        assert_eq!(gpu.kv_ledger.in_use(), kv.bytes());
    }
}
