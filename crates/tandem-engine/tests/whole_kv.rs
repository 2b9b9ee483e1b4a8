//! The serving engine over a backend whose caches are sized whole, as the GPU allocates them, played by
//! the CPU model: admission reserves the whole cache whatever a request's length, queues what does not
//! fit the budget beside the running ones and refuses what never could fit.

mod common;

use std::ops::Range;
use std::time::{Duration, Instant};

use common::*;
use tandem_engine::serve::{EngineHandle, Event, GenerationRequest, ServingConfig, ServingEngine, SubmitError};
use tandem_gguf::GgufFile;
use tandem_model::config::{Activation, MoeConfig, RopeParams};
use tandem_model::weights::{ExpertFfn, Matrix, Norm, Weights};
use tandem_model::{
    graph, AttendRows, Backend, KvSizing, Logits, Model, ModelConfig, ModelError, Rows, SequenceKv, ServingBackend,
    Span, Workspace,
};
use tandem_tokenizer::Tokenizer;

/// The CPU model, except that its sequences are sized as allocated whole.
struct Whole(Model);

impl Backend for Whole {
    type Act = Rows;
    type Kv = SequenceKv;
    type Scratch = Workspace;

    fn config(&self) -> &ModelConfig {
        self.0.config()
    }
    fn weights(&self) -> &Weights {
        self.0.weights()
    }
    fn new_kv(&self, n_ctx: usize) -> Result<SequenceKv, ModelError> {
        self.0.new_kv(n_ctx)
    }
    fn run(&self, scratch: &mut Workspace, spans: &mut [Span<SequenceKv>]) -> Result<Vec<Logits>, ModelError> {
        graph::forward(self, scratch, spans)
    }
    fn embed(&self, tokens: &[u32]) -> Result<Rows, ModelError> {
        self.0.embed(tokens)
    }
    fn output_rows(&self, rows: usize, width: usize) -> Result<Rows, ModelError> {
        self.0.output_rows(rows, width)
    }
    fn rms_norm(&self, x: &mut Rows, group: usize, weight: &Norm) -> Result<(), ModelError> {
        self.0.rms_norm(x, group, weight)
    }
    fn normed(&self, x: &Rows, weight: &Norm) -> Result<Rows, ModelError> {
        self.0.normed(x, weight)
    }
    fn add_normed(&self, x: &mut Rows, y: Rows, norm: Option<&Norm>) -> Result<(), ModelError> {
        self.0.add_normed(x, y, norm)
    }
    fn matmul(&self, m: &Matrix, x: &Rows) -> Result<Rows, ModelError> {
        self.0.matmul(m, x)
    }
    fn rope(&self, x: &mut Rows, positions: &[usize], rope: &RopeParams) -> Result<(), ModelError> {
        self.0.rope(x, positions, rope)
    }
    fn store_and_attend(
        &self,
        scratch: &mut Workspace,
        layer: usize,
        kv: &mut SequenceKv,
        io: AttendRows<'_, Rows>,
        rows: Range<usize>,
        positions: &[usize],
    ) -> Result<(), ModelError> {
        self.0.store_and_attend(scratch, layer, kv, io, rows, positions)
    }
    fn gated(&self, gate: &mut Rows, up: &Rows, act: Activation, reader: &Matrix) -> Result<(), ModelError> {
        self.0.gated(gate, up, act, reader)
    }
    fn expert_ffn(
        &self,
        layer: usize,
        x: &Rows,
        experts: &ExpertFfn,
        moe: &MoeConfig,
        act: Activation,
    ) -> Result<Rows, ModelError> {
        self.0.expert_ffn(layer, x, experts, moe, act)
    }
    fn gather_rows(&self, x: &Rows, rows: &[usize]) -> Result<Rows, ModelError> {
        self.0.gather_rows(x, rows)
    }
    fn to_host(&self, x: Rows) -> Result<Vec<f32>, ModelError> {
        self.0.to_host(x)
    }
}

impl ServingBackend for Whole {
    fn set_kv_budget(&mut self, bytes: usize) {
        self.0.set_kv_budget(bytes);
    }
    fn set_ring_slack(&mut self, rows: usize) {
        self.0.set_ring_slack(rows);
    }
    fn kv_sizing(&self, n_ctx: usize) -> KvSizing {
        KvSizing::new(&self.0.config, n_ctx, self.0.ring_slack, None)
    }
    fn kv_bytes_in_use(&self) -> usize {
        self.0.kv_bytes_in_use()
    }
}

/// Gemma 3 270M at a context of 512: 18 layers × 512 rows × 1 KiB of K and V, whatever the length.
const WHOLE_SEQUENCE: usize = 18 * 512 * 1024;

fn engine(kv_budget_bytes: usize) -> (ServingEngine, Tokenizer) {
    let tok = Tokenizer::from_gguf(&GgufFile::open(model_path(GEMMA.1)).unwrap()).unwrap();
    let config = ServingConfig {
        n_ctx: 512,
        kv_budget_bytes,
        cache_budget_bytes: 0,
        ..Default::default()
    };
    let path = model_path(GEMMA.1);
    let load = move || Model::from_file(GgufFile::open(path)?, threads()).map(Whole);
    (ServingEngine::start_with(load, config).unwrap(), tok)
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    greedy_request(prompt, max_tokens, None)
}

#[test]
fn a_short_request_reserves_the_whole_cache() {
    let (engine, tok) = engine(WHOLE_SEQUENCE - 1);
    assert_eq!(engine.kv_bytes_for(1), WHOLE_SEQUENCE);
    // Four positions would take one 256-row block per layer if sized by length; whole, they do not fit.
    let refused = engine.submit(request(tok.encode("hi", true, false), 2));
    assert!(
        matches!(
            refused,
            Err(SubmitError::KvBudget {
                need: WHOLE_SEQUENCE,
                ..
            })
        ),
        "{refused:?}"
    );
}

#[test]
fn what_does_not_fit_beside_the_running_waits() {
    // One and a half sequences: the second request waits for the first to finish.
    let (engine, tok) = engine(WHOLE_SEQUENCE * 3 / 2);
    let receivers: Vec<_> = ["Once upon a time", "Water boils at"]
        .iter()
        .map(|p| engine.submit(request(tok.encode(p, true, false), 16)).unwrap())
        .collect();
    let most_running = std::thread::scope(|scope| {
        let watch = scope.spawn(|| {
            let mut most = 0;
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                let st = engine.stats();
                most = most.max(st.running);
                if st.requests_total >= 2 && st.running == 0 && st.queued == 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            most
        });
        for mut rx in receivers {
            let mut tokens = 0;
            while let Some(e) = rx.blocking_recv() {
                match e {
                    Event::Token { .. } => tokens += 1,
                    Event::Failed(m) => panic!("request failed: {m}"),
                    Event::Done { .. } => break,
                    Event::Started { .. } | Event::KvRows(_) => {}
                }
            }
            assert_eq!(tokens, 16);
        }
        watch.join().unwrap()
    });
    assert_eq!(most_running, 1, "the budget holds one whole sequence at a time");
}
