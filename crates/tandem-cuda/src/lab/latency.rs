//! How much slower a memory round trip gets while the GPU streams weights (`tandem-dev bench
//! latency`). An overlapping decode step (`docs/OVERLAPPED-DECODE.md`) would run its
//! latency-bound work (add + norm, attention) while other SMs stream the next weights; every earlier
//! attempt at overlap lost because those kernels slowed under the stream. This times the cause
//! directly: one thread chasing a random cycle (`chase_latency` in ops.cu), each step one dependent
//! load, over a cycle that stays in L2 (what add + norm and attention mostly read: activations just
//! written, a short KV cache) and one that misses it; alone, and on a second stream while
//! `stream_weights` reads a large buffer on every SM (the chase launched first, so that it is
//! resident when the stream fills the GPU; the kernels' own clocks check that the two overlapped).

use cudarc::driver::{CudaSlice, CudaStream, PushKernelArg};

use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::runtime::grid::{i32_of, launch_cfg};
use crate::CudaError;

/// One cycle's round trip, alone and under the stream.
#[derive(Clone, Debug)]
pub struct Latency {
    /// The cycle's bytes.
    pub cycle_bytes: usize,
    pub alone_ns: f64,
    pub loaded_ns: f64,
    /// The stream's rate alone and beside the chase (TB/s).
    pub stream_tbs: f64,
    pub stream_loaded_tbs: f64,
    /// The share of the loaded chase's time during which the stream ran (from the kernels' clocks).
    pub overlap: f64,
}

/// A random cycle through `lines` 128-byte lines of a buffer of u32 indices: each line's first word
/// holds the index of the next line's first word. Also the word indices of the cycle's first line
/// and of the line halfway round, so that two chases of fewer than `lines / 2` links from them touch
/// no line in common.
fn cycle(lines: usize, seed: u64) -> (Vec<u32>, [u32; 2]) {
    let mut order: Vec<u32> = (0..lines as u32).collect();
    let mut s = seed | 1;
    for i in (1..lines).rev() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        order.swap(i, (s % (i as u64 + 1)) as usize);
    }
    let mut next = vec![0u32; lines * 32];
    for w in 0..lines {
        let (from, to) = (order[w] as usize, order[(w + 1) % lines]);
        next[from * 32] = to * 32;
    }
    (next, [order[0] * 32, order[lines / 2] * 32])
}

fn sync(s: &CudaStream) -> Result<(), CudaError> {
    driver("cuStreamSynchronize (latency)", s.synchronize())
}

/// Nanoseconds from a kernel's clock pair (start, end).
fn span_ns(c: &[u64]) -> f64 {
    c[1].saturating_sub(c[0]) as f64
}

/// Times the chase over cycles of `sizes` bytes (each rounded to 128-byte lines), `steps` links
/// each, alone and under a stream over `stream_bytes`. A cycle that fits in L2 is walked once first
/// and then twice over the same links (hits); one that does not is walked from two points half a
/// cycle apart, so neither walk finds the other's lines in L2 (`steps` below half its lines). Under
/// load the chase is launched first and the stream right after on another stream, with passes enough
/// to outlast it; the kernels' own clocks give the times and the overlap.
pub fn bench_latency(gpu: &Gpu, sizes: &[(usize, usize)], stream_bytes: usize) -> Result<Vec<Latency>, CudaError> {
    let side = driver("cuStreamCreate (latency)", gpu.ctx.new_stream())?;
    let main = &gpu.stream;
    let pieces = stream_bytes / 16;
    let weights = gpu.alloc::<u8>(pieces * 16)?;
    let sink = gpu.alloc::<u32>(1)?;
    let chase_f = gpu.function("chase_latency")?;
    let stream_f = gpu.function("stream_weights")?;
    // One block of 512 threads an SM: four 16-byte loads in flight a thread keep about 4 MB in
    // flight, and leave room on every SM for the chase's one-thread block.
    let grid = gpu.sm_count;
    // The stream on `main`, `passes` times over `weights`; its clock pair (start, end) in `clock`.
    let launch_stream = |passes: i32, clock: &mut CudaSlice<u64>| -> Result<(), CudaError> {
        let mut l = main.launch_builder(stream_f);
        l.arg(&weights).arg(&pieces).arg(&passes).arg(&sink).arg(clock);
        // SAFETY: `weights` holds `pieces` 16-byte pieces; one sink word; two clock words.
        driver("stream_weights", unsafe { l.launch(launch_cfg((grid, 1, 1), 512)) })?;
        Ok(())
    };
    let stream_clock = |passes: i32| -> Result<Vec<u64>, CudaError> {
        let mut clock = gpu.upload(&[u64::MAX, 0])?;
        launch_stream(passes, &mut clock)?;
        sync(main)?;
        gpu.download(&clock)
    };
    stream_clock(1)?;
    let pass_ns = span_ns(&stream_clock(2)?) / 2.0;
    let stream_tbs = (pieces * 16) as f64 / pass_ns / 1e3;
    let mut out = Vec::new();
    for (i, &(bytes, steps)) in sizes.iter().enumerate() {
        let lines = (bytes / 128).max(2);
        let (host_next, starts) = cycle(lines, 0x51ed_270b + i as u64);
        let next = gpu.upload(&host_next)?;
        drop(host_next);
        let end = gpu.alloc::<u32>(1)?;
        let steps_i = i32_of(steps, "chase steps")?;
        let mut chase_clock = gpu.alloc::<u64>(2)?;
        let chase = |start: u32, clock: &mut CudaSlice<u64>| -> Result<(), CudaError> {
            let mut l = side.launch_builder(chase_f);
            l.arg(&next).arg(&start).arg(&steps_i).arg(&end).arg(clock);
            // SAFETY: `next` is a cycle of indices into itself and `start` one of them; one output
            // word, two clock words.
            driver("chase_latency", unsafe { l.launch(launch_cfg((1, 1, 1), 1)) })?;
            Ok(())
        };
        let in_l2 = bytes <= 8 << 20;
        let (first, second) = if in_l2 {
            chase(starts[0], &mut chase_clock)?;
            (starts[0], starts[0])
        } else {
            (starts[0], starts[1])
        };
        chase(first, &mut chase_clock)?;
        sync(&side)?;
        let alone_ns = span_ns(&gpu.download(&chase_clock)?) / steps as f64;
        // Enough passes to outlast the chase even if it runs eight times slower beside them.
        let passes = (alone_ns * steps as f64 * 8.0 / pass_ns)
            .ceil()
            .clamp(2.0, (1 << 24) as f64) as i32;
        let mut clock = gpu.upload(&[u64::MAX, 0])?;
        chase(second, &mut chase_clock)?;
        launch_stream(passes, &mut clock)?;
        sync(&side)?;
        sync(main)?;
        let (c, st) = (gpu.download(&chase_clock)?, gpu.download(&clock)?);
        let loaded_ns = span_ns(&c) / steps as f64;
        let during = c[1].min(st[1]).saturating_sub(c[0].max(st[0])) as f64;
        out.push(Latency {
            cycle_bytes: lines * 128,
            alone_ns,
            loaded_ns,
            stream_tbs,
            stream_loaded_tbs: (passes as usize * pieces * 16) as f64 / span_ns(&st) / 1e3,
            overlap: during / span_ns(&c).max(1.0),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cycle_visits_every_line_once() {
        let lines = 1000;
        let (next, starts) = cycle(lines, 7);
        assert_eq!(starts[0] % 32, 0);
        let mut seen = vec![false; lines];
        let mut i = starts[0] as usize;
        for _ in 0..lines {
            assert_eq!(i % 32, 0);
            assert!(!seen[i / 32], "line {} twice", i / 32);
            seen[i / 32] = true;
            i = next[i] as usize;
        }
        assert_eq!(i, starts[0] as usize, "back at the start after every line");
        assert!(seen.iter().all(|&s| s));
    }
}
