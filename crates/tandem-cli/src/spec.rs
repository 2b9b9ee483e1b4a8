//! `--spec`, `--draft-model`, `--draft-max`: speculative decoding for `run`, `chat` and `bench`. The
//! proposer (prompt lookup, or a draft model loaded on the target's device) and the adaptive draft
//! length live in a [`Speculator`], which generates with or without drafts.

use anyhow::{bail, Context, Result};
use clap::Args;
use tandem_engine::spec::{DraftLength, DraftModel, PromptLookup, SpecMode, SpecSettings, SpecStats};
use tandem_engine::{Engine, GenerateOptions, SamplingParams, Timings};
use tandem_model::kv::RING_SLACK;
use tandem_model::ServingBackend;
use tandem_runtime::{AnyEngine, EngineBackend};

/// Speculative decoding.
#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    /// Speculative decoding: `lookup` drafts from n-grams seen earlier in the sequence's own context,
    /// `draft` from `--draft-model`; the target verifies each step's drafts in one pass. Greedy output
    /// is the same tokens as `off`; sampled output follows the same distribution.
    #[arg(long = "spec", default_value = "off", value_name = "MODE")]
    pub mode: SpecMode,
    /// A smaller model with the target's vocabulary that drafts for it (`--spec draft`; a GGUF path or
    /// a known alias), run on the same device with a KV cache of its own.
    #[arg(long = "draft-model", value_name = "MODEL")]
    pub draft_model: Option<String>,
    /// The most tokens drafted a step (1 to 256).
    #[arg(long = "draft-max", default_value_t = 8, value_name = "K")]
    pub draft_max: usize,
    /// Always draft `--draft-max` tokens (as far as the proposer reaches), instead of choosing the length
    /// from the acceptance rate and the measured cost of wider passes.
    #[arg(long = "draft-fixed")]
    pub draft_fixed: bool,
}

impl SpecArgs {
    /// The checked settings: a draft model needs `--spec draft` and the reverse.
    pub fn settings(&self) -> Result<SpecSettings> {
        match (self.mode, &self.draft_model) {
            (SpecMode::Draft, None) => bail!("--spec draft needs --draft-model"),
            (SpecMode::Off | SpecMode::Lookup, Some(_)) => bail!("--draft-model needs --spec draft"),
            _ => {}
        }
        Ok(SpecSettings {
            mode: self.mode,
            draft_max: self.draft_max,
            adaptive: !self.draft_fixed,
        }
        .validated()?)
    }
}

enum Source<B: ServingBackend> {
    Off,
    Lookup(PromptLookup),
    Draft(Box<DraftModel<B>>),
}

/// Generates with the drafts `--spec` names, keeping the draft length's estimates and the counters
/// across calls (the turns of a chat).
pub struct Speculator<B: ServingBackend> {
    settings: SpecSettings,
    source: Source<B>,
    length: DraftLength,
    pub stats: SpecStats,
}

impl<B: EngineBackend> Speculator<B> {
    /// A speculator for `engine`'s sequences of up to `n_ctx` positions, drafting with `draft` (the
    /// loaded `--draft-model`, on the target's device) under `--spec draft`. Gives the target's
    /// sliding-window rings room to be cut back past a verify pass, in caches `engine` makes from now on.
    pub fn new(
        args: &SpecArgs,
        engine: &mut Engine<B>,
        draft: Option<AnyEngine>,
        n_ctx: usize,
        prefill_chunk: usize,
        sampling: &SamplingParams,
    ) -> Result<Self> {
        let settings = args.settings()?;
        let source = match (settings.mode, draft) {
            (SpecMode::Off, _) => Source::Off,
            (SpecMode::Lookup, _) => Source::Lookup(PromptLookup::default()),
            (SpecMode::Draft, Some(draft)) => {
                let Ok(draft) = B::take_engine(draft) else {
                    bail!("the draft model runs on another device than the target");
                };
                let (want, got) = (engine.model.config().n_vocab, draft.model.config().n_vocab);
                if want != got {
                    bail!("the draft model has {got} tokens in its vocabulary, the target {want}: they must share one");
                }
                let draft = DraftModel::new(draft, n_ctx, prefill_chunk, sampling.clone()).context("draft model")?;
                Source::Draft(Box::new(draft))
            }
            (SpecMode::Draft, None) => bail!("--spec draft needs --draft-model"),
        };
        if settings.mode != SpecMode::Off {
            engine.model.set_ring_slack(RING_SLACK);
        }
        Ok(Speculator {
            settings,
            source,
            length: DraftLength::new(settings.draft_max, settings.adaptive),
            stats: SpecStats::default(),
        })
    }

    pub fn enabled(&self) -> bool {
        self.settings.mode != SpecMode::Off
    }

    /// Forgets the draft length's estimates and the counters (a benchmark's next repetition starts as
    /// the first did).
    pub fn reset(&mut self) {
        self.length = DraftLength::new(self.settings.draft_max, self.settings.adaptive);
        self.stats = SpecStats::default();
    }

    /// `Engine::generate`, with drafts when `--spec` asks for them.
    pub fn generate(
        &mut self,
        engine: &mut Engine<B>,
        kv: &mut B::Kv,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, Timings)> {
        self.generate_after(&[], engine, kv, prompt, opts, on_token)
    }

    /// `generate` on a cache that holds `earlier` already (a chat's previous turns), which the drafts
    /// are drawn from too.
    pub fn generate_after(
        &mut self,
        earlier: &[u32],
        engine: &mut Engine<B>,
        kv: &mut B::Kv,
        prompt: &[u32],
        opts: &GenerateOptions,
        on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, Timings)> {
        let proposer: &mut dyn tandem_engine::spec::Proposer = match &mut self.source {
            Source::Off => return Ok(engine.generate(kv, prompt, opts, on_token)?),
            Source::Lookup(lookup) => lookup,
            Source::Draft(draft) => {
                draft.reset_sampling(opts.sampling.clone());
                draft.as_mut()
            }
        };
        let (completion, timings, stats) =
            engine.generate_speculative_after(earlier, kv, prompt, opts, proposer, &mut self.length, on_token)?;
        self.stats.add(&stats);
        Ok((completion, timings))
    }

    /// One line for stderr: what drafting did.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        format!(
            "speculation ({:?}): {} drafted, {} accepted ({:.1}%), {:.2} tokens per decode step over {} steps",
            self.settings.mode,
            s.drafted,
            s.accepted,
            100.0 * s.acceptance(),
            s.tokens_per_step(),
            s.steps
        )
    }

    pub fn json(&self) -> serde_json::Value {
        let s = &self.stats;
        serde_json::json!({
            "mode": format!("{:?}", self.settings.mode).to_lowercase(),
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance": s.acceptance(),
            "verify_steps": s.verify_steps,
            "steps": s.steps,
            "tokens_per_step": s.tokens_per_step(),
        })
    }
}
