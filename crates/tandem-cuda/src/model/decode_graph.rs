//! Decode steps captured as CUDA graphs and replayed (`cache/graphs.rs` holds the cache's types).

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, DevicePtr};
use tandem_model::{graph, LogitRows, Logits, ModelError, Span};

use crate::cache::graphs::all_placements;
use crate::cache::graphs::graph_key;
use crate::cache::graphs::placements;
use crate::cache::graphs::set_placements;
use crate::cache::graphs::warm_up;
use crate::cache::graphs::Ahead;
use crate::cache::graphs::DecodeGraph;
use crate::cache::graphs::GraphKey;
use crate::cache::graphs::ReplayMarks;
use crate::cache::graphs::SpanShape;
use crate::cache::graphs::MAX_GRAPHS;
use crate::cache::kv::GpuSequenceKv;
use crate::model::{CudaModel, GpuScratch, Mode};
use crate::runtime::checked::driver;
use crate::runtime::programmatic;
use crate::CudaError;

impl CudaModel {
    pub(crate) fn run_with_graphs(
        &self,
        scratch: &mut GpuScratch,
        spans: &mut [Span<GpuSequenceKv>],
    ) -> Result<Vec<Logits>, ModelError> {
        let shape: Vec<SpanShape> = spans.iter().map(|s| SpanShape::of(s)).collect();
        let key = graph_key(&shape, self.graphs.batch_enabled.get())
            .filter(|_| self.graphs.enabled.get() && self.graphs.blocked.is_none())
            .filter(|_| spans.len() <= self.graphs.max_batch_rows);
        let Some(key) = key else {
            let Some(clock) = &self.diagnostics.pass_clock else {
                return graph::forward(self, scratch, spans);
            };
            clock.begin(&self.gpu)?;
            let out = graph::forward(self, scratch, spans)?;
            clock.end(spans.iter().map(|s| s.tokens.len()).sum())?;
            return Ok(out);
        };
        // The position first: `replay` borrows the graphs mutably, and an `if let` on the borrow
        // would hold it through its body.
        let cached = self.graphs.cache.borrow().iter().position(|g| g.key == key);
        if let Some(i) = cached {
            // Kept last, so the graph evicted first is the one replayed longest ago (a server's batch
            // sizes come and go around its load).
            let mut graphs = self.graphs.cache.borrow_mut();
            let g = graphs.remove(i);
            graphs.push(g);
            let last = graphs.len() - 1;
            drop(graphs);
            return self.replay(scratch, spans, last);
        }
        if warm_up(&mut self.graphs.warmed.borrow_mut(), key) {
            // First decode step of this sequence or batch shape: run it directly, which sizes the pool.
            return graph::forward(self, scratch, spans);
        }
        self.capture(scratch, spans, key)
    }

    /// The logits a graph wrote to `out`, a row a span, lent from page-locked memory.
    fn lend_graph_logits(&self, out: &CudaSlice<f32>, spans: usize) -> Result<Vec<Logits>, CudaError> {
        if spans == 1 {
            return Ok(vec![self.lend_logits(out)?]);
        }
        self.lend_logit_rows(out, &vec![1; spans])
    }

    fn upload_params(&self) -> Result<(), ModelError> {
        let staging = self.pass.staging.borrow();
        if staging.is_empty() {
            return Ok(());
        }
        let stream = &self.gpu.stream;
        let (dst, _sync) = self.pass.arena.device_ptr(stream);
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
    ) -> Result<Vec<Logits>, ModelError> {
        // Timed (`TANDEM_CUDA_PASS_TIMES=1`): the host's part (the dry pass, the parameters, the
        // launch) is the enqueue time; the GPU is idle until it ends.
        let clock = self.diagnostics.pass_clock.as_ref();
        if let Some(clock) = clock {
            clock.begin(&self.gpu)?;
        }
        let mut marks = ReplayMarks::new(clock.is_some());
        if !self.take_ahead(spans)? {
            self.pass.staging.borrow_mut().clear();
            self.pass.mode.set(Mode::Dry);
            let dry = graph::forward(self, scratch, spans);
            self.pass.mode.set(Mode::Normal);
            dry?;
        }
        marks.mark(0);
        self.upload_params()?;
        marks.mark(1);
        let mut graphs = self.graphs.cache.borrow_mut();
        let g = &mut graphs[i];
        if let Some(w) = &self.diagnostics.profiler_window {
            w.before_replay()?;
        }
        driver("cuGraphLaunch", g.graph.launch())?;
        if spans.len() > 1 {
            self.graphs.batch_replays.set(self.graphs.batch_replays.get() + 1);
        }
        marks.mark(2);
        // The GPU runs this step for about 2 ms; the host's dry pass of the next one (tens of µs)
        // fits in that time instead of in the gap between steps. (One sequence's: a batch's next
        // step may hold other sequences.)
        if self.graphs.ahead_enabled && spans.len() == 1 {
            self.prepare_ahead(scratch, spans);
        }
        if let Some(clock) = clock {
            clock.enqueued(&self.gpu)?;
            // Timed: the wait for the graph apart from the copy.
            self.gpu.synchronize()?;
            marks.mark(3);
        }
        let logits = self.lend_graph_logits(&g.out, spans.len())?;
        marks.mark(4);
        if let Some(w) = &self.diagnostics.profiler_window {
            w.after_replay()?;
        }
        if let Some(clock) = clock {
            clock.end(spans.len())?;
            eprintln!("{}", marks.line());
        }
        Ok(logits)
    }

    /// Takes the next step's parameters made ahead when they fit this step: the staging filled in
    /// with its token and the placements advanced. False when there are none that fit.
    fn take_ahead(&self, spans: &mut [Span<GpuSequenceKv>]) -> Result<bool, ModelError> {
        let Some(ahead) = self.graphs.ahead.borrow_mut().take() else {
            return Ok(false);
        };
        let [span] = spans else {
            return Ok(false);
        };
        let kv = &mut *span.kv;
        let n_vocab = self.cpu.weights.token_embd.rows;
        let Some((staging, after)) = ahead.take_for(kv.id, span.tokens, &placements(kv), n_vocab)? else {
            return Ok(false);
        };
        *self.pass.staging.borrow_mut() = staging;
        set_placements(kv, &after);
        self.graphs.ahead_taken.set(self.graphs.ahead_taken.get() + 1);
        Ok(true)
    }

    /// The dry pass of the sequence's next decode step (one token, not yet known: a placeholder in
    /// its slot), kept as `Ahead`; the placements and this step's staging are left as they were.
    fn prepare_ahead(&self, scratch: &mut GpuScratch, spans: &mut [Span<GpuSequenceKv>]) {
        let kv = &mut *spans[0].kv;
        let before = placements(kv);
        let this_step = std::mem::take(&mut *self.pass.staging.borrow_mut());
        self.pass.token_slot.set(None);
        self.pass.mode.set(Mode::Dry);
        let placeholder = [0u32];
        let mut next = [Span {
            kv: &mut *kv,
            tokens: &placeholder,
            logits: LogitRows::Last,
        }];
        let dry = graph::forward(self, scratch, &mut next);
        self.pass.mode.set(Mode::Normal);
        let staging = std::mem::replace(&mut *self.pass.staging.borrow_mut(), this_step);
        let after = placements(kv);
        set_placements(kv, &before);
        // A pass that fails now (a full cache, say) fails again, with its error, on the step itself.
        if let (Ok(_), Some(token_slot)) = (dry, self.pass.token_slot.get()) {
            *self.graphs.ahead.borrow_mut() = Some(Ahead {
                seq: kv.id,
                before,
                after,
                staging,
                token_slot,
            });
        }
    }

    fn capture(
        &self,
        scratch: &mut GpuScratch,
        spans: &mut [Span<GpuSequenceKv>],
        key: GraphKey,
    ) -> Result<Vec<Logits>, ModelError> {
        let saved = all_placements(spans);
        self.pass.staging.borrow_mut().clear();
        self.graphs.captured_out.borrow_mut().take();
        let stream = &self.gpu.stream;
        driver(
            "cuStreamBeginCapture",
            stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        )?;
        self.pass.mode.set(Mode::Capture);
        // Kernels launched during the capture get programmatic edges from the kernel before (sm_90+).
        self.gpu
            .set_programmatic_capture(programmatic::wanted(self.gpu.major, self.gpu.options.pdl));
        let recorded = graph::forward(self, scratch, spans);
        self.gpu.set_programmatic_capture(false);
        self.pass.mode.set(Mode::Normal);
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        let out = self.graphs.captured_out.borrow_mut().take();
        match (recorded, ended, out) {
            (Ok(_), Ok(Some(graph)), Some(out)) => {
                self.upload_params()?;
                driver("cuGraphLaunch", graph.launch())?;
                let logits = self.lend_graph_logits(&out, spans.len())?;
                let mut graphs = self.graphs.cache.borrow_mut();
                if graphs.len() == MAX_GRAPHS {
                    graphs.remove(0);
                }
                graphs.push(DecodeGraph { key, graph, out });
                Ok(logits)
            }
            (recorded, ended, _) => {
                // Nothing ran: undo the placement updates and take the direct route for good (for
                // batched steps only, when a batched step failed).
                for (span, saved) in spans.iter_mut().zip(&saved) {
                    set_placements(span.kv, saved);
                }
                let why = match (recorded, ended) {
                    (Err(e), _) => e.to_string(),
                    (_, Err(e)) => format!("{e:?}"),
                    _ => "capture produced no graph".into(),
                };
                match key {
                    GraphKey::Sequence(_) => {
                        eprintln!("tandem: CUDA graph capture failed ({why}); decoding without graphs");
                        self.graphs.enabled.set(false);
                    }
                    GraphKey::Batch { .. } => {
                        eprintln!(
                            "tandem: CUDA graph capture of a batched step failed ({why}); batched steps without graphs"
                        );
                        self.graphs.batch_enabled.set(false);
                    }
                }
                graph::forward(self, scratch, spans)
            }
        }
    }
}
