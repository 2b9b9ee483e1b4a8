//! The device slots non-resident experts pass through: each slot one expert's gate, up and down
//! matrices, in allocations sized for the largest type each part takes. A slot is read through a
//! `GpuMatrix` per (part, weight type) that shares its allocation (`slot_matrix_name`), so an expert in
//! a slot runs through the same ops, kernels and routes as a resident one.
//!
//! Outside a streamed chunk the slots are a cache filled on the compute stream (`stage`): an expert
//! already in a slot is a hit, else the least recently used slot takes it, its copy ordered before
//! the kernels that read it and after those that read the slot's last expert, all on one stream. A
//! streamed chunk uses them as its ring (`offload::stream`) and leaves the cache empty.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::offload::host::{HostEntry, HostExperts, PARTS};
use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::CudaError;

/// The name under which part `part` (0: gate, 1: up, 2: down) of slot `slot` is read as weight type
/// `suffix` in the model's matrices.
pub fn slot_matrix_name(slot: usize, part: usize, suffix: &str) -> String {
    format!("expert-slot{slot}.{}.{suffix}", PARTS.get(part).unwrap_or(&"part"))
}

/// Expert traffic counters (for `--verbose`, `--trace` and the server's metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertCounters {
    /// Non-resident experts found in a slot already.
    pub cache_hits: u64,
    /// Non-resident experts copied into a slot on the compute stream.
    pub cache_copies: u64,
    /// Non-resident experts a decode step computed on the CPU (`--expert-decode`).
    pub cpu_experts: u64,
    /// Entries a streamed chunk copied, and skipped as unrouted.
    pub stream_copies: u64,
    pub stream_skips: u64,
    /// Bytes moved from host memory, by the cache and the stream.
    pub bytes: u64,
}

/// The slots, their device buffers and what each holds.
pub struct SlotPool {
    buffers: Vec<[Rc<CudaSlice<u8>>; 3]>,
    held: RefCell<Vec<Option<(usize, usize)>>>,
    last_use: RefCell<Vec<u64>>,
    tick: Cell<u64>,
    pub counters: Cell<ExpertCounters>,
}

impl SlotPool {
    /// `n` slots of `part_bytes` (the largest gate, up and down matrix of any layer).
    pub fn new(gpu: &Gpu, n: usize, part_bytes: [usize; 3]) -> Result<Self, CudaError> {
        let buffers = (0..n)
            .map(|_| -> Result<[Rc<CudaSlice<u8>>; 3], CudaError> {
                let [g, u, d] = part_bytes.map(|b| gpu.alloc_out::<u8>(b.max(1)));
                Ok([Rc::new(g?), Rc::new(u?), Rc::new(d?)])
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SlotPool {
            buffers,
            held: RefCell::new(vec![None; n]),
            last_use: RefCell::new(vec![0; n]),
            tick: Cell::new(0),
            counters: Cell::new(ExpertCounters::default()),
        })
    }

    pub fn n_slots(&self) -> usize {
        self.buffers.len()
    }

    /// Slot `slot`'s buffer for part `part`, to share with the matrices that read it.
    pub fn buffer(&self, slot: usize, part: usize) -> Option<Rc<CudaSlice<u8>>> {
        self.buffers.get(slot)?.get(part).cloned()
    }

    /// Device bytes of all slots.
    pub fn bytes(&self) -> usize {
        self.buffers.iter().flatten().map(|b| b.len()).sum()
    }

    /// Slot `slot`'s three device addresses.
    pub fn addresses(&self, gpu: &Gpu, slot: usize) -> Option<[u64; 3]> {
        let b = self.buffers.get(slot)?;
        Some([0, 1, 2].map(|p| b[p].device_ptr(&gpu.stream).0))
    }

    /// Slot `slot`'s buffer sizes.
    pub fn room(&self, slot: usize) -> [usize; 3] {
        self.buffers.get(slot).map_or([0; 3], |b| b.each_ref().map(|b| b.len()))
    }

    /// Forgets what every slot holds (a streamed chunk overwrote them).
    pub fn forget(&self) {
        self.held.borrow_mut().iter_mut().for_each(|h| *h = None);
    }

    fn count(&self, f: impl FnOnce(&mut ExpertCounters)) {
        let mut c = self.counters.get();
        f(&mut c);
        self.counters.set(c);
    }

    /// Whether a slot holds `layer`'s `expert` now (a hit for `stage`).
    pub fn holds(&self, layer: usize, expert: usize) -> bool {
        self.held.borrow().contains(&Some((layer, expert)))
    }

    /// Counts experts a decode step computed on the CPU.
    pub fn count_cpu(&self, n: usize) {
        self.count(|c| c.cpu_experts += n as u64);
    }

    /// Counts a streamed chunk's copies and skips.
    pub fn count_stream(&self, copied: usize, skipped: usize, bytes: u64) {
        self.count(|c| {
            c.stream_copies += copied as u64;
            c.stream_skips += skipped as u64;
            c.bytes += bytes;
        });
    }

    /// The slot holding `layer`'s `expert`, copied in from `host` on the compute stream unless a slot
    /// holds it already.
    pub fn stage(&self, gpu: &Gpu, host: &HostExperts, layer: usize, expert: usize) -> Result<usize, CudaError> {
        let tick = self.tick.get() + 1;
        self.tick.set(tick);
        let hit = self.held.borrow().iter().position(|h| *h == Some((layer, expert)));
        if let Some(slot) = hit {
            self.last_use.borrow_mut()[slot] = tick;
            self.count(|c| c.cache_hits += 1);
            return Ok(slot);
        }
        let entry = host.entry(layer, expert).ok_or_else(|| CudaError::Driver {
            what: "expert cache".into(),
            err: format!("layer {layer} expert {expert} is neither resident nor in host memory"),
        })?;
        let slot = {
            let last = self.last_use.borrow();
            (0..last.len())
                .min_by_key(|&s| last[s])
                .ok_or_else(|| CudaError::Driver {
                    what: "expert cache".into(),
                    err: "no slots".into(),
                })?
        };
        let addresses = self.addresses(gpu, slot).ok_or_else(|| CudaError::Driver {
            what: "expert cache".into(),
            err: format!("no slot {slot}"),
        })?;
        copy_entry(&gpu.stream, &entry, addresses, self.room(slot))?;
        self.held.borrow_mut()[slot] = Some((layer, expert));
        self.last_use.borrow_mut()[slot] = tick;
        self.count(|c| {
            c.cache_copies += 1;
            c.bytes += entry.bytes() as u64;
        });
        Ok(slot)
    }
}

/// Enqueues the copy of `entry`'s three matrices into a slot's buffers (`dst`, of `room` bytes each)
/// on `stream` (whose context is bound to this thread first).
pub fn copy_entry(stream: &CudaStream, entry: &HostEntry, dst: [u64; 3], room: [usize; 3]) -> Result<(), CudaError> {
    driver("bind context", stream.context().bind_to_thread())?;
    for p in 0..3 {
        let (addr, len) = entry.part(p);
        if len > room[p] {
            return Err(CudaError::Driver {
                what: "expert copy".into(),
                err: format!("{} of {len} bytes into a slot of {}", PARTS[p], room[p]),
            });
        }
        // SAFETY: `addr` is `len` bytes of page-locked host memory the model owns for its lifetime
        // (`HostExperts`), filled at load and never written again; `dst[p]` is a slot buffer of at
        // least `len` bytes, which the caller has ordered after the slot's last reader.
        let src = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        driver("cuMemcpyHtoDAsync (expert)", unsafe {
            cudarc::driver::result::memcpy_htod_async(dst[p], src, stream.cu_stream())
        })?;
    }
    Ok(())
}
