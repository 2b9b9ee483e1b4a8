//! Per-sequence KV caches on the GPU: f16 K and V per layer, placed by the same `RingPlacement`
//! metadata as the CPU cache (global layers grow to the context, sliding-window layers are rings of
//! `window` rows). Storage is allocated for the whole capacity when the sequence is made.

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::CudaSlice;
use tandem_model::kv::RingPlacement;
use tandem_model::{ModelConfig, SequenceCache};

use crate::device::Gpu;
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
}

impl GpuSequenceKv {
    pub fn new(gpu: &Gpu, config: &ModelConfig, n_ctx: usize) -> Result<Self, CudaError> {
        let w = config.kv_width();
        let mut layers = Vec::with_capacity(config.layers.len());
        for spec in &config.layers {
            let capacity = spec.window.map_or(n_ctx, |win| win.min(n_ctx));
            layers.push(GpuLayerCache {
                placement: RingPlacement::new(capacity),
                window: spec.window,
                k: gpu.alloc::<u16>(capacity * w)?,
                v: gpu.alloc::<u16>(capacity * w)?,
            });
        }
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Ok(GpuSequenceKv {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            layers,
            n_ctx,
            kv_width: w,
        })
    }

    /// Device bytes held by K and V of every layer.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| 2 * l.placement.capacity * self.kv_width * 2)
            .sum()
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
