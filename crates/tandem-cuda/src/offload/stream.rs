//! A long prefill chunk's expert stream on the GPU: the CUDA `Link` the issuer thread drives
//! (`tandem_model::expert_stream::issue_walk`, one copy stream, a copied and a slot-free event per
//! ring slot) and the chunk's stream as the compute thread holds it across the layers of one pass.
//!
//! Per slot, `copied` is recorded on the copy stream after an entry's bytes and `free` on the compute
//! stream after the last kernel that read the slot. A copy waits on its slot's `free` (so it never
//! overwrites bytes a kernel has yet to read); the compute stream waits on `copied` before the
//! kernels that read the entry. One event a slot serves every entry through it: entry k + ring is
//! issued only once entry k was released, after the compute stream enqueued its wait on k's copy.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use tandem_model::expert_stream::{
    issue_walk, ChunkStream, Link, StreamDepth, StreamEntry, StreamPlan, WalkMode, WalkStats,
};

use crate::offload::host::{HostEntry, HostExperts};
use crate::offload::residency::Residency;
use crate::offload::slots::{copy_entry, SlotPool};
use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::CudaError;

/// The ring's copy stream and per-slot events, made once at load.
pub struct StreamRing {
    copy: Arc<CudaStream>,
    copied: Vec<Arc<CudaEvent>>,
    free: Vec<Arc<CudaEvent>>,
}

impl StreamRing {
    pub fn new(gpu: &Gpu, slots: usize) -> Result<Self, CudaError> {
        let copy = driver("cuStreamCreate (expert copies)", gpu.ctx.new_stream())?;
        let event = || -> Result<Arc<CudaEvent>, CudaError> {
            let e = gpu.ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING));
            Ok(Arc::new(driver("cuEventCreate (expert ring)", e)?))
        };
        Ok(StreamRing {
            copy,
            copied: (0..slots).map(|_| event()).collect::<Result<_, _>>()?,
            free: (0..slots).map(|_| event()).collect::<Result<_, _>>()?,
        })
    }
}

/// The link of one chunk: entry k's host bytes into slot k % ring on the copy stream.
struct CudaLink {
    copy: Arc<CudaStream>,
    copied: Vec<Arc<CudaEvent>>,
    free: Vec<Arc<CudaEvent>>,
    /// Each plan entry's host bytes, in plan order.
    sources: Vec<HostEntry>,
    /// Each slot's three device addresses and sizes.
    slots: Vec<([u64; 3], [usize; 3])>,
}

impl Link for CudaLink {
    type Error = CudaError;

    fn issue_copy(&mut self, k: usize, _entry: &StreamEntry, slot: usize) -> Result<(), CudaError> {
        let (source, &(dst, room)) = match (self.sources.get(k), self.slots.get(slot)) {
            (Some(s), Some(d)) => (s, d),
            _ => {
                return Err(CudaError::Driver {
                    what: "expert stream".into(),
                    err: format!("entry {k} or slot {slot} outside the plan"),
                })
            }
        };
        driver("cuStreamWaitEvent (slot free)", self.copy.wait(&self.free[slot]))?;
        copy_entry(&self.copy, source, dst, room)?;
        driver("cuEventRecord (copied)", self.copied[slot].record(&self.copy))
    }

    fn landed(&mut self, k: usize) -> Result<bool, CudaError> {
        let slot = k % self.copied.len();
        driver("cuEventQuery (copied)", self.copied[slot].try_is_complete())
    }
}

/// The index of `layer`'s `expert` in `plan` (whose layers list their experts in ascending order).
pub fn entry_index(plan: &StreamPlan, layer: usize, expert: usize) -> Option<usize> {
    let range = plan.layer_entries(layer);
    let within = plan.entries().get(range.clone())?;
    within
        .binary_search_by_key(&expert, |e| e.expert)
        .ok()
        .map(|i| range.start + i)
}

/// A chunk's stream while its pass runs: the shared state, the issuer thread, and what the trace
/// reports at the end.
pub struct ActiveStream {
    chunk: Arc<ChunkStream>,
    issuer: Option<JoinHandle<Result<WalkStats, CudaError>>>,
    copied: Vec<Arc<CudaEvent>>,
    free: Vec<Arc<CudaEvent>>,
    copy: Arc<CudaStream>,
    started: Instant,
    pub rows: usize,
}

impl ActiveStream {
    /// Plans every non-resident expert of every layer through `slots` and starts the issuer.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        gpu: &Gpu,
        ring: &StreamRing,
        slots: &SlotPool,
        host: &HostExperts,
        residency: &Residency,
        n_layers: usize,
        mode: WalkMode,
        depth: StreamDepth,
        rows: usize,
    ) -> Result<Self, CudaError> {
        let fail = |err: String| CudaError::Driver {
            what: "expert stream".into(),
            err,
        };
        let n = residency.n_expert();
        let plan = StreamPlan::non_resident(
            n_layers,
            n,
            slots.n_slots(),
            |l, e| residency.is_resident(l, e),
            |l, e| host.entry(l, e).map_or(0, |h| h.bytes() as u64),
        )
        .map_err(|e| fail(e.to_string()))?;
        let sources = plan
            .entries()
            .iter()
            .map(|e| host.entry(e.layer, e.expert))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| fail("a non-resident expert without host bytes".into()))?;
        let slot_addresses = (0..slots.n_slots())
            .map(|s| slots.addresses(gpu, s).map(|a| (a, slots.room(s))))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| fail("a slot without buffers".into()))?;
        let chunk = Arc::new(ChunkStream::new(plan));
        let mut link = CudaLink {
            copy: Arc::clone(&ring.copy),
            copied: ring.copied.clone(),
            free: ring.free.clone(),
            sources,
            slots: slot_addresses,
        };
        let shared = Arc::clone(&chunk);
        let issuer = std::thread::Builder::new()
            .name("expert-stream".into())
            .spawn(move || issue_walk(&shared, &mut link, mode, depth))
            .map_err(|e| fail(format!("issuer thread: {e}")))?;
        Ok(ActiveStream {
            chunk,
            issuer: Some(issuer),
            copied: ring.copied.clone(),
            free: ring.free.clone(),
            copy: Arc::clone(&ring.copy),
            started: Instant::now(),
            rows,
        })
    }

    pub fn chunk(&self) -> &ChunkStream {
        &self.chunk
    }

    /// Entry index of `layer`'s `expert` (a non-resident one), from the plan.
    pub fn entry(&self, layer: usize, expert: usize) -> Option<usize> {
        entry_index(self.chunk.plan(), layer, expert)
    }

    /// Waits for entry k's copy to be issued and makes `compute` wait for it to land; returns the slot.
    /// Entries before k are released first (the consumer is done with them, routed or not).
    pub fn acquire(&self, compute: &CudaStream, k: usize) -> Result<usize, CudaError> {
        self.chunk.release_through(k);
        let slot = self.chunk.wait_copy(k).map_err(|e| CudaError::Driver {
            what: "expert stream".into(),
            err: e.to_string(),
        })?;
        driver("cuStreamWaitEvent (copied)", compute.wait(&self.copied[slot]))?;
        Ok(slot)
    }

    /// After the kernels reading entry k's slot are enqueued on `compute`: marks the slot free for the
    /// copy that follows and releases the entry.
    pub fn release(&self, compute: &CudaStream, k: usize) -> Result<(), CudaError> {
        let slot = self.chunk.plan().slot(k);
        driver("cuEventRecord (slot free)", self.free[slot].record(compute))?;
        self.chunk.release_through(k + 1);
        Ok(())
    }

    /// Ends the stream: every entry released, the issuer joined, and `compute` ordered after every
    /// copy the issuer queued (read or not), so the slots may be written again. Returns the walk's
    /// stats and how long the stream ran.
    pub fn finish(mut self, compute: &CudaStream) -> Result<(WalkStats, std::time::Duration), CudaError> {
        self.chunk.release_through(self.chunk.plan().len());
        let stats = self.join()?;
        driver("cuStreamWaitEvent (expert copies)", compute.join(&self.copy))?;
        Ok((stats, self.started.elapsed()))
    }

    fn join(&mut self) -> Result<WalkStats, CudaError> {
        match self.issuer.take() {
            None => Ok(WalkStats::default()),
            Some(h) => h.join().map_err(|_| CudaError::Driver {
                what: "expert stream".into(),
                err: "the issuer thread panicked".into(),
            })?,
        }
    }
}

impl Drop for ActiveStream {
    /// An unfinished stream (a pass that failed) stops its issuer and waits for it and its copies.
    fn drop(&mut self) {
        if self.issuer.is_some() {
            self.chunk.stop();
            let _ = self.join();
            let _ = self.copy.synchronize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_non_resident_expert_finds_its_entry() {
        // Layers 0 and 2 keep experts 0..2 and 0..1 of 4; layer 1 is dense.
        let resident = |l: usize, e: usize| match l {
            0 => e < 2,
            1 => true,
            _ => e < 1,
        };
        let plan = StreamPlan::non_resident(3, 4, 2, resident, |_, _| 10).unwrap();
        assert_eq!(plan.len(), 2 + 3);
        for (k, e) in plan.entries().iter().enumerate() {
            assert_eq!(entry_index(&plan, e.layer, e.expert), Some(k));
        }
        assert_eq!(entry_index(&plan, 0, 1), None, "resident");
        assert_eq!(entry_index(&plan, 1, 3), None, "a dense layer");
        assert_eq!(entry_index(&plan, 2, 0), None, "resident");
        assert_eq!(entry_index(&plan, 2, 3), Some(4));
        assert_eq!(entry_index(&plan, 7, 0), None, "past the model");
    }
}
