//! What a hand-over between two dependent steps costs on this GPU (`tandem-dev bench handover`). A
//! decode step of an 8B model is about 260 dependent kernels, and part of its time past the weights'
//! bytes is those hand-overs: a kernel's blocks wait for the one before to finish and its writes to
//! become visible, then read them back from L2. Three ways to chain the same trivial steps
//! (`handover_link` / `handover_resident` in ops.cu), each step reading what another block wrote in
//! the step before:
//! - launches captured in a graph with programmatic edges, as decode steps run now;
//! - the same graph with plain edges;
//! - one resident grid crossing a grid-wide barrier between steps, as a persistent decode kernel
//!   would (the question this answers: what such a kernel would save on hand-overs alone).

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, PushKernelArg};

use crate::matmul::tune::time_back_to_back;
use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::runtime::grid::launch_cfg;
use crate::CudaError;

/// Threads a block in every variant.
const THREADS: u32 = 128;

/// Mean microseconds a step in each way of chaining `steps` steps over `blocks` blocks.
#[derive(Clone, Copy, Debug)]
pub struct Handover {
    pub blocks: u32,
    pub steps: usize,
    pub programmatic_us: f64,
    pub plain_us: f64,
    /// `None` when the grid would not be resident at once (the barrier would never open).
    pub resident_us: Option<f64>,
}

/// Times the three ways for one grid size.
pub fn bench_handover(gpu: &Gpu, blocks: u32, steps: usize) -> Result<Handover, CudaError> {
    let n = (blocks * THREADS) as usize;
    let mut rows = [gpu.alloc::<f32>(n)?, gpu.alloc::<f32>(n)?];
    let programmatic_us = time_chain(gpu, &mut rows, blocks, steps, true)?;
    let plain_us = time_chain(gpu, &mut rows, blocks, steps, false)?;
    let f = gpu.function("handover_resident")?;
    let per_sm = driver(
        "handover_resident occupancy",
        f.occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None),
    )?;
    let resident_us = if blocks <= per_sm * gpu.sm_count {
        Some(time_resident(gpu, blocks, steps)?)
    } else {
        None
    };
    Ok(Handover {
        blocks,
        steps,
        programmatic_us,
        plain_us,
        resident_us,
    })
}

/// `steps` launches of `handover_link` captured into a graph (programmatic edges or plain ones),
/// replayed; mean µs a launch.
fn time_chain(
    gpu: &Gpu,
    rows: &mut [CudaSlice<f32>; 2],
    blocks: u32,
    steps: usize,
    programmatic: bool,
) -> Result<f64, CudaError> {
    let f = gpu.function("handover_link")?;
    let stream = &gpu.stream;
    driver(
        "cuStreamBeginCapture (handover)",
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
    )?;
    gpu.set_programmatic_capture(programmatic && gpu.major >= 9);
    let mut recorded = Ok(());
    for s in 0..steps {
        let [a, b] = rows;
        let (src, dst) = if s % 2 == 0 { (&*a, b) } else { (&*b, a) };
        let launched = gpu.launch_builder(f).and_then(|mut l| {
            l.arg(src).arg(dst);
            // SAFETY: both rows hold blocks * THREADS floats, every thread's index.
            driver("handover_link", unsafe {
                l.launch(launch_cfg((blocks, 1, 1), THREADS))
            })
            .map(|_| ())
        });
        if let Err(e) = launched {
            recorded = Err(e);
            break;
        }
    }
    gpu.set_programmatic_capture(false);
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    recorded?;
    let graph = driver("cuStreamEndCapture (handover)", ended)?.ok_or_else(|| CudaError::Driver {
        what: "handover graph".into(),
        err: "the capture recorded nothing".into(),
    })?;
    driver("cuGraphLaunch (handover)", graph.launch())?;
    let secs = time_back_to_back(gpu, &mut || driver("cuGraphLaunch (handover)", graph.launch()))?;
    Ok(secs * 1e6 / steps as f64)
}

/// One `handover_resident` launch of `steps` steps (its arrival counter zeroed before each);
/// mean µs a step.
fn time_resident(gpu: &Gpu, blocks: u32, steps: usize) -> Result<f64, CudaError> {
    let f = gpu.function("handover_resident")?;
    let buf = gpu.alloc::<f32>(2 * (blocks * THREADS) as usize)?;
    let mut arrived = gpu.alloc::<u32>(1)?;
    let steps_i = i32::try_from(steps).map_err(|_| CudaError::Driver {
        what: "handover_resident".into(),
        err: format!("{steps} steps"),
    })?;
    let mut run = || -> Result<(), CudaError> {
        driver("zero the arrival counter", gpu.stream.memset_zeros(&mut arrived))?;
        let mut l = gpu.launch_builder(f)?;
        l.arg(&buf).arg(&arrived).arg(&steps_i);
        // SAFETY: buf holds two rows of blocks * THREADS floats; the grid is resident at once.
        driver("handover_resident", unsafe {
            l.launch(launch_cfg((blocks, 1, 1), THREADS))
        })?;
        Ok(())
    };
    run()?;
    // The memset rides inside each timed span: subtract one memset alone.
    let total = time_back_to_back(gpu, &mut run)?;
    let memset = time_back_to_back(gpu, &mut || {
        driver("zero the arrival counter", gpu.stream.memset_zeros(&mut arrived))
    })?;
    Ok((total - memset).max(0.0) * 1e6 / steps as f64)
}
