//! The non-resident experts' bytes in page-locked host memory, in the layout the device kernels read
//! (the integer route's repacked one where that is the kernel: the bytes a slot receives are the bytes
//! a resident copy would hold), one allocation per mixture layer: expert after expert, each its gate,
//! up and down matrices in that order.

use cudarc::driver::{CudaSlice, DevicePtr, PinnedHostSlice};

use crate::offload::residency::Residency;
use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::CudaError;

/// An expert's three matrices, in the order an entry holds them.
pub const PARTS: [&str; 3] = ["gate", "up", "down"];

/// One layer's non-resident experts: `first..n_expert`, each `part_bytes` (gate, up, down) long.
struct HostLayer {
    first: usize,
    part_bytes: [usize; 3],
    bytes: PinnedHostSlice<u8>,
}

impl HostLayer {
    fn entry_bytes(&self) -> usize {
        self.part_bytes.iter().sum()
    }
}

/// Every mixture layer's non-resident experts in page-locked memory.
pub struct HostExperts {
    layers: Vec<Option<HostLayer>>,
}

/// Where an expert's bytes lie in host memory: its gate, up and down matrices one after another.
#[derive(Clone, Copy, Debug)]
pub struct HostEntry {
    /// The first byte's address (page-locked memory the model owns).
    pub addr: usize,
    pub part_bytes: [usize; 3],
}

impl HostEntry {
    pub fn bytes(&self) -> usize {
        self.part_bytes.iter().sum()
    }

    /// Part `p`'s bytes (gate, up, down).
    pub fn part(&self, p: usize) -> (usize, usize) {
        let offset: usize = self.part_bytes[..p].iter().sum();
        (self.addr + offset, self.part_bytes[p])
    }
}

impl HostExperts {
    /// Page-locked room for each layer's non-resident experts; `part_bytes[l]`: layer l's gate, up
    /// and down matrix bytes (for mixture layers).
    pub fn new(gpu: &Gpu, residency: &Residency, part_bytes: &[Option<[usize; 3]>]) -> Result<Self, CudaError> {
        let n = residency.n_expert();
        let mut layers = Vec::with_capacity(part_bytes.len());
        for (l, parts) in part_bytes.iter().enumerate() {
            let layer = match (parts, residency.resident_in(l)) {
                (Some(parts), Some(first)) if first < n => {
                    let len = (n - first) * parts.iter().sum::<usize>();
                    // SAFETY: page-locked bytes the load fills (`write`) before any copy reads them.
                    let bytes = driver("cuMemHostAlloc (host experts)", unsafe {
                        gpu.ctx.alloc_pinned::<u8>(len)
                    })?;
                    Some(HostLayer {
                        first,
                        part_bytes: *parts,
                        bytes,
                    })
                }
                _ => None,
            };
            layers.push(layer);
        }
        Ok(HostExperts { layers })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.iter().flatten().map(|l| l.bytes.len()).sum()
    }

    /// Where `layer`'s `expert` lies, if it is held here.
    pub fn entry(&self, layer: usize, expert: usize) -> Option<HostEntry> {
        let l = self.layers.get(layer)?.as_ref()?;
        let i = expert.checked_sub(l.first)?;
        let start = i * l.entry_bytes();
        if start + l.entry_bytes() > l.bytes.len() {
            return None;
        }
        let base = l.bytes.as_ptr().ok()? as usize;
        Some(HostEntry {
            addr: base + start,
            part_bytes: l.part_bytes,
        })
    }

    /// Copies `src` (the device's settled bytes of `layer`'s `expert`, part `part`) into its place,
    /// and waits for the copy.
    pub fn write(
        &mut self,
        gpu: &Gpu,
        layer: usize,
        expert: usize,
        part: usize,
        src: &CudaSlice<u8>,
    ) -> Result<(), CudaError> {
        let fail = |err: String| CudaError::Driver {
            what: format!(
                "host experts (layer {layer}, expert {expert}, {})",
                PARTS.get(part).unwrap_or(&"?")
            ),
            err,
        };
        let l = self
            .layers
            .get_mut(layer)
            .and_then(|l| l.as_mut())
            .ok_or_else(|| fail("not a layer with experts in host memory".into()))?;
        let entry = l.entry_bytes();
        let i = expert
            .checked_sub(l.first)
            .ok_or_else(|| fail("a resident expert".into()))?;
        let (offset, len) = match l.part_bytes.get(part) {
            Some(&len) => (i * entry + l.part_bytes[..part].iter().sum::<usize>(), len),
            None => return Err(fail("no such part".into())),
        };
        if src.len() != len || offset + len > l.bytes.len() {
            return Err(fail(format!("{} bytes for a part of {len}", src.len())));
        }
        let dst = &mut driver("page-locked host memory", l.bytes.as_mut_slice())?[offset..offset + len];
        let (ptr, _record) = src.device_ptr(&gpu.stream);
        // SAFETY: `dst` is `len` bytes of page-locked memory, `ptr` the start of `len` device bytes;
        // the stream is synchronized before the host memory is read or the source dropped.
        driver("cuMemcpyDtoHAsync (host experts)", unsafe {
            cudarc::driver::result::memcpy_dtoh_async(dst, ptr, gpu.stream.cu_stream())
        })?;
        driver("cuStreamSynchronize", gpu.stream.synchronize())
    }
}
