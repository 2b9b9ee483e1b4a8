//! `TANDEM_CUDA_PROFILE=1`: GPU time per backend op, from CUDA events recorded around each op, printed
//! to stderr when the model is dropped. Ops are not nested, so the rows add up to the total. Decode
//! graphs are turned off while profiling (an event per op needs direct launches). Before each op the
//! GPU is held busy for `HOLD_NS` (`gpu_hold`), so the host has enqueued the whole op when the GPU
//! reaches its start event: a row is the op's GPU time, not the host's time to launch it (which,
//! for the small kernels of a decode step, is longer). The step's wall time is not the sum of rows.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Instant;

use cudarc::driver::{sys, CudaEvent, PushKernelArg};

use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::runtime::grid::launch_cfg;

/// What a model measures and reports about its passes (`CudaModel::diagnostics`), each from a
/// `TANDEM_CUDA_*` switch.
pub(crate) struct Diagnostics {
    /// GPU time per op (`TANDEM_CUDA_PROFILE=1`).
    pub(crate) profile: Option<OpProfile>,
    /// Enqueue, GPU and wall time per pass (`TANDEM_CUDA_PASS_TIMES=1`).
    pub(crate) pass_clock: Option<PassClock>,
    /// The decode-graph replays a profiler collects (`TANDEM_CUDA_PROFILE_REPLAYS=FROM-TO`).
    pub(crate) profiler_window: Option<ProfilerWindow>,
    /// Kernels left out of every pass (`TANDEM_CUDA_SKIP=add_norm_to,gated_quant,...`, names from
    /// `upload::SKIPPABLE_KERNELS`): a timing
    /// experiment only, which measures what those launches cost inside a decode step's graph. The
    /// logits are wrong while it is set, and the CLI says so.
    pub(crate) skipped_kernels: Vec<String>,
}

/// Longer than the host takes to launch any one op (a few kernels and index uploads).
const HOLD_NS: i64 = 200_000;
use crate::CudaError;

#[derive(Default)]
pub(crate) struct OpProfile {
    pending: RefCell<Vec<(String, CudaEvent, CudaEvent)>>,
    /// Milliseconds and calls per op name.
    totals: RefCell<HashMap<String, (f64, u64)>>,
}

impl OpProfile {
    fn event(gpu: &Gpu) -> Result<CudaEvent, CudaError> {
        driver(
            "profile event",
            gpu.stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)),
        )
    }

    fn hold(gpu: &Gpu) -> Result<(), CudaError> {
        let f = gpu.function("gpu_hold")?;
        let mut b = gpu.launch_builder(f)?;
        b.arg(&HOLD_NS);
        driver("gpu_hold", unsafe { b.launch(launch_cfg((1, 1, 1), 1)) })?;
        Ok(())
    }

    /// Runs `f`, which enqueues the work of op `name`, between two recorded events.
    pub(crate) fn time<T, E: From<CudaError>>(
        &self,
        gpu: &Gpu,
        name: String,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        Self::hold(gpu)?;
        let start = Self::event(gpu)?;
        let out = f()?;
        let end = Self::event(gpu)?;
        self.pending.borrow_mut().push((name, start, end));
        Ok(out)
    }

    /// Waits for the recorded ops and adds their times to the totals.
    pub(crate) fn collect(&self) -> Result<(), CudaError> {
        let mut totals = self.totals.borrow_mut();
        for (name, start, end) in self.pending.borrow_mut().drain(..) {
            let ms = driver("profile elapsed", start.elapsed_ms(&end))? as f64;
            let e = totals.entry(name).or_default();
            e.0 += ms;
            e.1 += 1;
        }
        Ok(())
    }

    /// The totals, largest first, as a table.
    pub(crate) fn report(&self) -> String {
        let totals = self.totals.borrow();
        let all: f64 = totals.values().map(|v| v.0).sum();
        let mut rows: Vec<_> = totals.iter().collect();
        rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        let mut s = format!("GPU time per op ({all:.1} ms in all)\n");
        for (name, (ms, n)) in rows {
            s += &format!(
                "{:>9.2} ms {:>5.1}% {:>7} calls {:>8.1} us/call  {name}\n",
                ms,
                100.0 * ms / all.max(1e-9),
                n,
                1e3 * ms / *n as f64
            );
        }
        s
    }
}

/// `TANDEM_CUDA_PASS_TIMES=1`: per forward pass, the host's time to enqueue it (up to the logits'
/// download), the GPU's time from the pass's start to that point, and the wall time, on stderr.
/// Where the enqueue time nears the wall time, the host is what the GPU waits for; where the GPU time
/// exceeds the op profile's sum, the difference is spent between kernels. For a decode step replayed
/// from a graph, the enqueue time is the host's preparation, during which the GPU idles, and a second
/// line (`decode_graph.rs`) splits the host's part: dry pass, upload, launch, wait, logits copy.
#[derive(Default)]
pub(crate) struct PassClock {
    start: RefCell<Option<(Instant, CudaEvent)>>,
    enqueued: RefCell<Option<(Instant, CudaEvent)>>,
}

impl PassClock {
    fn mark(gpu: &Gpu) -> Result<(Instant, CudaEvent), CudaError> {
        Ok((Instant::now(), OpProfile::event(gpu)?))
    }

    pub(crate) fn begin(&self, gpu: &Gpu) -> Result<(), CudaError> {
        *self.start.borrow_mut() = Some(Self::mark(gpu)?);
        *self.enqueued.borrow_mut() = None;
        Ok(())
    }

    /// The pass has enqueued its last kernel (called before the logits' download).
    pub(crate) fn enqueued(&self, gpu: &Gpu) -> Result<(), CudaError> {
        if self.start.borrow().is_some() {
            *self.enqueued.borrow_mut() = Some(Self::mark(gpu)?);
        }
        Ok(())
    }

    pub(crate) fn end(&self, rows: usize) -> Result<(), CudaError> {
        let (Some((t0, e0)), Some((t1, e1))) = (self.start.borrow_mut().take(), self.enqueued.borrow_mut().take())
        else {
            return Ok(());
        };
        let gpu_ms = driver("pass elapsed", e0.elapsed_ms(&e1))?;
        eprintln!(
            "pass: {rows} rows, enqueue {:.2} ms, gpu {gpu_ms:.2} ms, wall {:.2} ms",
            1e3 * (t1 - t0).as_secs_f64(),
            1e3 * t0.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// `TANDEM_CUDA_PROFILE_REPLAYS=FROM-TO`: a profiler collects only around the decode-graph replays
/// FROM to TO (numbered from 1 per model), as `cuProfilerStart` and `cuProfilerStop` bracket them.
/// Run under `ncu --profile-from-start off` (or `nsys --capture-range=cudaProfilerApi`), a profile
/// then holds the kernels of decode steps as the graph runs them, not the load-time timing's
/// thousands of launches of the same kernels, where an unbounded profile lands first.
#[derive(Debug)]
pub(crate) struct ProfilerWindow {
    from: u64,
    to: u64,
    replays: std::cell::Cell<u64>,
}

impl ProfilerWindow {
    /// The window of replays FROM to TO (`LabOptions::profile_replays`).
    pub(crate) fn new(from: u64, to: u64) -> Self {
        ProfilerWindow {
            from,
            to,
            replays: std::cell::Cell::new(0),
        }
    }

    /// Counts a replay about to launch; the first of the window starts the profiler.
    pub(crate) fn before_replay(&self) -> Result<(), CudaError> {
        let n = self.replays.get() + 1;
        self.replays.set(n);
        if n == self.from {
            // SAFETY: no arguments; the context is current on this thread (the model's stream).
            driver("cuProfilerStart", unsafe { sys::cuProfilerStart() }.result())?;
        }
        Ok(())
    }

    /// After a replay's logits arrived (the GPU is done with it): the last of the window stops it.
    pub(crate) fn after_replay(&self) -> Result<(), CudaError> {
        if self.replays.get() == self.to {
            // SAFETY: as in `before_replay`.
            driver("cuProfilerStop", unsafe { sys::cuProfilerStop() }.result())?;
        }
        Ok(())
    }
}
