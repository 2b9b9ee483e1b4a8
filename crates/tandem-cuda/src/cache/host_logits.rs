//! Logits come back to the host in page-locked memory, lent to the caller as `Logits` (no copy into a
//! vector; `tandem_model::logits` says why): a decode graph's step (`lend_logits`), and a batched
//! step's rows, each span lending its own rows of one shared buffer (`lend_logit_rows`).

use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, DevicePtr};
use tandem_model::LentLogits;

use crate::runtime::checked::driver;
use crate::CudaError;
use crate::Gpu;

/// Page-locked host memory for a graph's logits. A copy into pageable memory goes through the
/// driver's staging buffers: about 62 µs for the 8B's 513 KB on the H200 machine, against 44-51 for
/// the copy into this buffer and from it into the returned vector.
pub(crate) struct HostLogits {
    pub(crate) ptr: *mut f32,
    pub(crate) len: usize,
}

impl HostLogits {
    fn new(len: usize) -> Result<Self, CudaError> {
        // SAFETY: a fresh allocation of `len` f32s (cached: the host reads it), freed in Drop.
        let ptr = driver("cuMemHostAlloc (logits)", unsafe {
            cudarc::driver::result::malloc_host(len * std::mem::size_of::<f32>(), 0)
        })?;
        Ok(HostLogits { ptr: ptr.cast(), len })
    }

    /// Copies `out` in, once the stream has finished everything before; returns how many logits.
    pub(crate) fn download(&mut self, gpu: &Gpu, out: &CudaSlice<f32>) -> Result<usize, CudaError> {
        let n = out.len().min(self.len);
        let stream = &gpu.stream;
        let (src, _sync) = out.device_ptr(stream);
        // SAFETY: `ptr` holds `len` >= n f32s for the life of `self`; the copy is ordered after the
        // graph on the stream, and the host reads the memory only after synchronizing with it.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.ptr, n) };
        let copied = unsafe { cudarc::driver::result::memcpy_dtoh_async(dst, src, stream.cu_stream()) };
        driver("cuMemcpyDtoHAsync (logits)", copied)?;
        gpu.synchronize()?;
        Ok(n)
    }

    fn slice(&self, n: usize) -> &[f32] {
        // SAFETY: `ptr` holds `len` f32s; a buffer is lent (and so read) only after `download` has
        // copied into it and synchronized.
        unsafe { std::slice::from_raw_parts(self.ptr, n.min(self.len)) }
    }
}

/// The page-locked buffers of a model's decode graphs, all of one length (the vocabulary): taken for
/// a step's logits, given back when the caller drops them. Two are in use in a generation loop (the
/// logits sampled from, and the next step's); a new one is allocated only when none is free.
#[derive(Default)]
pub(crate) struct PinnedLogits {
    free: Mutex<Vec<HostLogits>>,
}

impl PinnedLogits {
    /// A free buffer of at least `len` logits, or a new one (a batched step's logits need a longer
    /// one than a single step's; both stay in the pool).
    pub(crate) fn take(&self, len: usize) -> Result<HostLogits, CudaError> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        match free.iter().position(|h| h.len >= len) {
            Some(i) => Ok(free.swap_remove(i)),
            None => {
                drop(free);
                HostLogits::new(len)
            }
        }
    }

    pub(crate) fn give_back(&self, h: HostLogits) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(h);
    }
}

/// A step's logits in a page-locked buffer, lent to the caller as `Logits`.
pub(crate) struct LentHost {
    pub(crate) host: Option<HostLogits>,
    pub(crate) n: usize,
    pub(crate) pool: Arc<PinnedLogits>,
}

impl LentLogits for LentHost {
    fn logits(&self) -> &[f32] {
        self.host.as_ref().map_or(&[], |h| h.slice(self.n))
    }
}

impl Drop for LentHost {
    fn drop(&mut self) {
        if let Some(h) = self.host.take() {
            self.pool.give_back(h);
        }
    }
}

// SAFETY: plain host memory owned by this value alone.
unsafe impl Send for HostLogits {}

impl Drop for HostLogits {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from malloc_host and is freed once; no copy into it is pending (each
        // download synchronizes before it returns).
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr.cast()) };
    }
}

/// A batched step's logits: one page-locked buffer, back to the pool once every span's rows are
/// dropped.
pub(crate) struct SharedHost {
    pub(crate) host: Option<HostLogits>,
    pub(crate) pool: Arc<PinnedLogits>,
}

impl Drop for SharedHost {
    fn drop(&mut self) {
        if let Some(h) = self.host.take() {
            self.pool.give_back(h);
        }
    }
}

/// One span's rows of a `SharedHost`.
pub(crate) struct LentRows {
    pub(crate) shared: Arc<SharedHost>,
    pub(crate) range: Range<usize>,
}

impl LentLogits for LentRows {
    fn logits(&self) -> &[f32] {
        self.shared
            .host
            .as_ref()
            .map_or(&[], |h| &h.slice(self.range.end)[self.range.clone()])
    }
}

// SAFETY: the buffer is written only by `download`, before it is shared; afterwards every holder only
// reads it.
unsafe impl Sync for HostLogits {}
