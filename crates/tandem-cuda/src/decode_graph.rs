//! Decode steps as CUDA graphs. A decode step launches a few hundred small kernels; launched one by
//! one, their launch costs outweigh the weight reads. So a sequence's second decode step is captured
//! into a graph (the first fills the buffer pool, so capture allocates nothing), and later steps
//! replay it: the layer graph runs "dry" on the host only (placement updates; per-step values such as
//! positions, cache rows and tile spans written to the parameter arena in the same order as during
//! capture), the arena is uploaded, and the graph is launched. Kernels read every per-step value from
//! the arena, so replays compute exactly what a direct launch would (`tandem gpu-check` compares bits).

use std::collections::VecDeque;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, DevicePtr};
use tandem_model::kv::RingPlacement;
use tandem_model::{graph, LogitRows, ModelError, Span};

use crate::device::driver;
use crate::kv::GpuSequenceKv;
use crate::model::{CudaModel, GpuScratch, Mode};
use crate::pool::DevBuf;
use crate::programmatic;

/// Graphs kept at once (one per sequence being decoded; the oldest goes first).
const MAX_GRAPHS: usize = 8;
/// Sequences remembered as having taken their direct first step (the oldest is forgotten first, so a
/// long-running server holds a bounded list; a forgotten one takes one more direct step).
const MAX_WARMED: usize = 64;

/// Whether `seq` is on its first decode step (then remembered, within `MAX_WARMED`).
fn warm_up(warmed: &mut VecDeque<u64>, seq: u64) -> bool {
    if warmed.contains(&seq) {
        return false;
    }
    if warmed.len() == MAX_WARMED {
        warmed.pop_front();
    }
    warmed.push_back(seq);
    true
}

pub(crate) struct DecodeGraph {
    seq: u64,
    graph: CudaGraph,
    /// The logits buffer the graph writes.
    out: DevBuf<f32>,
}

impl CudaModel {
    pub(crate) fn run_with_graphs(
        &self,
        scratch: &mut GpuScratch,
        spans: &mut [Span<GpuSequenceKv>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let decode_step = spans.len() == 1 && spans[0].tokens.len() == 1 && spans[0].logits == LogitRows::Last;
        if !self.graphs_enabled.get() || !decode_step {
            let Some(clock) = &self.pass_clock else {
                return graph::forward(self, scratch, spans);
            };
            clock.begin(&self.gpu)?;
            let out = graph::forward(self, scratch, spans)?;
            clock.end(spans.iter().map(|s| s.tokens.len()).sum())?;
            return Ok(out);
        }
        let seq = spans[0].kv.id;
        if let Some(i) = self.graphs.borrow().iter().position(|g| g.seq == seq) {
            return self.replay(scratch, spans, i);
        }
        if warm_up(&mut self.warmed.borrow_mut(), seq) {
            // First decode step of this sequence: run it directly, which sizes the pool.
            return graph::forward(self, scratch, spans);
        }
        self.capture(scratch, spans, seq)
    }

    fn upload_params(&self) -> Result<(), ModelError> {
        let staging = self.staging.borrow();
        if staging.is_empty() {
            return Ok(());
        }
        let stream = &self.gpu.stream;
        let (dst, _sync) = self.arena.device_ptr(stream);
        // SAFETY: the arena holds ARENA_INTS ints and `param_ints` never stages more; the copy is
        // ordered on the stream before the kernels that read it, and from pageable memory the call
        // returns only once `staging` has been copied out.
        let copied = unsafe { cudarc::driver::result::memcpy_htod_async(dst, &staging[..], stream.cu_stream()) };
        driver("upload graph parameters", copied)?;
        Ok(())
    }

    fn replay(
        &self,
        scratch: &mut GpuScratch,
        spans: &mut [Span<GpuSequenceKv>],
        i: usize,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        // Timed (`TANDEM_CUDA_PASS_TIMES=1`): the host's part (the dry pass, the parameters, the
        // launch) is the enqueue time; the GPU is idle until it ends.
        if let Some(clock) = &self.pass_clock {
            clock.begin(&self.gpu)?;
        }
        self.staging.borrow_mut().clear();
        self.mode.set(Mode::Dry);
        let dry = graph::forward(self, scratch, spans);
        self.mode.set(Mode::Normal);
        dry?;
        self.upload_params()?;
        let graphs = self.graphs.borrow();
        let g = &graphs[i];
        driver("cuGraphLaunch", g.graph.launch())?;
        if let Some(clock) = &self.pass_clock {
            clock.enqueued(&self.gpu)?;
        }
        let logits = self.gpu.download(&g.out)?;
        if let Some(clock) = &self.pass_clock {
            clock.end(1)?;
        }
        Ok(vec![logits])
    }

    fn capture(
        &self,
        scratch: &mut GpuScratch,
        spans: &mut [Span<GpuSequenceKv>],
        seq: u64,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let saved: Vec<RingPlacement> = spans[0].kv.layers.iter().map(|l| l.placement).collect();
        self.staging.borrow_mut().clear();
        self.captured_out.borrow_mut().take();
        let stream = &self.gpu.stream;
        driver(
            "cuStreamBeginCapture",
            stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        )?;
        self.mode.set(Mode::Capture);
        // Kernels launched during the capture get programmatic edges from the kernel before (sm_90+).
        self.gpu.set_programmatic_capture(programmatic::wanted(self.gpu.major));
        let recorded = graph::forward(self, scratch, spans);
        self.gpu.set_programmatic_capture(false);
        self.mode.set(Mode::Normal);
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        let out = self.captured_out.borrow_mut().take();
        match (recorded, ended, out) {
            (Ok(_), Ok(Some(graph)), Some(out)) => {
                self.upload_params()?;
                driver("cuGraphLaunch", graph.launch())?;
                let logits = self.gpu.download(&out)?;
                let mut graphs = self.graphs.borrow_mut();
                if graphs.len() == MAX_GRAPHS {
                    graphs.remove(0);
                }
                graphs.push(DecodeGraph { seq, graph, out });
                Ok(vec![logits])
            }
            (recorded, ended, _) => {
                // Nothing ran: undo the placement updates and take the direct route for good.
                for (layer, p) in spans[0].kv.layers.iter_mut().zip(saved) {
                    layer.placement = p;
                }
                let why = match (recorded, ended) {
                    (Err(e), _) => e.to_string(),
                    (_, Err(e)) => format!("{e:?}"),
                    _ => "capture produced no graph".into(),
                };
                eprintln!("tandem: CUDA graph capture failed ({why}); decoding without graphs");
                self.graphs_enabled.set(false);
                graph::forward(self, scratch, spans)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_warms_up_once_and_the_list_stays_bounded() {
        let mut warmed = VecDeque::new();
        assert!(warm_up(&mut warmed, 1));
        assert!(!warm_up(&mut warmed, 1));
        for seq in 2..=(MAX_WARMED as u64 + 1) {
            assert!(warm_up(&mut warmed, seq));
        }
        assert_eq!(warmed.len(), MAX_WARMED);
        // Sequence 1 was the oldest and is forgotten: one more direct step.
        assert!(warm_up(&mut warmed, 1));
    }
}
