//! Speculative decoding on the real models: greedy output is the same token for token with drafts from
//! prompt lookup, from a draft model, and from a proposer that is always wrong (every step rolls the
//! cache back), on a short code prompt and on a long licence whose continuation runs past Gemma 3's
//! sliding window (the verify passes wrap its rings and are cut back inside them). This holds because a
//! row's logits do not depend on how many rows share its pass (`exactness.rs` tests that chunk
//! invariance directly).

mod common;

use common::*;
use tandem_engine::spec::{Draft, DraftLength, DraftModel, PromptLookup, Proposer, SpecStats};
use tandem_engine::{Engine, EngineError, GenerateOptions, SamplingParams};
use tandem_model::kv::RING_SLACK;
use tandem_model::{ServingBackend, ServingCache};

/// Drafts tokens the target will not pick: every verify pass is rejected at its first draft.
struct Wrong {
    n_vocab: u32,
}

impl Proposer for Wrong {
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Draft, EngineError> {
        let last = history.last().copied().unwrap_or(0);
        Ok(Draft {
            tokens: (1..=k as u32).map(|i| (last + 7919 * i) % self.n_vocab).collect(),
            dists: None,
        })
    }
}

fn options(max_tokens: usize, sampling: SamplingParams) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        prefill_chunk: 256,
        sampling,
        stop_ids: vec![],
    }
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..Default::default()
    }
}

fn plain(engine: &mut Engine, prompt: &[u32], n: usize, sampling: SamplingParams) -> Vec<u32> {
    let mut kv = engine.new_sequence(4096);
    engine
        .generate(&mut kv, prompt, &options(n, sampling), |_| true)
        .unwrap()
        .0
}

fn speculative(
    engine: &mut Engine,
    prompt: &[u32],
    n: usize,
    sampling: SamplingParams,
    proposer: &mut dyn Proposer,
    length: &mut DraftLength,
) -> (Vec<u32>, SpecStats) {
    let mut kv = engine.new_sequence(4096);
    let (out, _, stats) = engine
        .generate_speculative(&mut kv, prompt, &options(n, sampling), proposer, length, |_| true)
        .unwrap();
    assert_eq!(
        kv.len(),
        prompt.len() + out.len() - 1,
        "the cache holds what was fed, no drafts"
    );
    (out, stats)
}

fn check_model((key, file): (&str, &str)) {
    let golden = golden();
    let (mut engine, _) = load(file);
    let (draft_engine, _) = load(file);
    let rings = engine.model.config.layers.iter().any(|l| l.window.is_some());
    // Without slack a ring cannot be cut back past a pass that wrapped it: no drafts are made, and the
    // output is still the same.
    let prompt0 = ids(&prompt(&golden, key, "gpl3-long")["ids"]);
    assert_eq!(
        engine.new_sequence(4096).rewind_room() == usize::MAX,
        !rings,
        "{key}: only rings limit a verify pass"
    );
    let want = plain(&mut engine, &prompt0, 8, greedy());
    let (got, stats) = speculative(
        &mut engine,
        &prompt0,
        8,
        greedy(),
        &mut PromptLookup::default(),
        &mut DraftLength::new(4, false),
    );
    assert_eq!(got, want, "{key}: no ring slack");
    assert_eq!(stats.drafted == 0, rings, "{key}: {stats:?}");
    engine.model.set_ring_slack(RING_SLACK);
    let n_vocab = engine.model.config.n_vocab as u32;
    let mut draft = DraftModel::new(draft_engine, 4096, 256, greedy()).unwrap();
    for (name, n) in [("code", 48), ("gpl3-long", 64)] {
        let prompt = ids(&prompt(&golden, key, name)["ids"]);
        let want = plain(&mut engine, &prompt, n, greedy());
        let label = format!("{key} {name}");

        let (got, stats) = speculative(
            &mut engine,
            &prompt,
            n,
            greedy(),
            &mut PromptLookup::default(),
            &mut DraftLength::new(4, false),
        );
        assert_eq!(got, want, "{label}: lookup, 4 drafts a step");
        if name == "gpl3-long" {
            assert!(
                stats.accepted > 0,
                "{label}: a licence continues from its own text: {stats:?}"
            );
        }

        let (got, _) = speculative(
            &mut engine,
            &prompt,
            n,
            greedy(),
            &mut PromptLookup::default(),
            &mut DraftLength::new(16, true),
        );
        assert_eq!(got, want, "{label}: lookup, adaptive length");

        // The target drafting for itself: every draft is kept.
        let (got, stats) = speculative(
            &mut engine,
            &prompt,
            n,
            greedy(),
            &mut draft,
            &mut DraftLength::new(5, false),
        );
        assert_eq!(got, want, "{label}: draft model");
        assert_eq!(
            stats.accepted, stats.drafted,
            "{label}: a model agrees with itself: {stats:?}"
        );
        assert!(stats.tokens_per_step() > 4.0, "{label}: {stats:?}");

        // Every draft rejected: each step writes 7 rows and keeps 1.
        let (got, stats) = speculative(
            &mut engine,
            &prompt,
            n,
            greedy(),
            &mut Wrong { n_vocab },
            &mut DraftLength::new(6, false),
        );
        assert_eq!(got, want, "{label}: wrong drafts");
        assert_eq!(stats.accepted, 0, "{label}: {stats:?}");
        assert!(stats.verify_steps as usize >= n - 2, "{label}: {stats:?}");
    }
}

#[test]
fn gemma3_greedy_tokens_do_not_depend_on_drafts() {
    check_model(GEMMA);
}

#[test]
fn smollm2_greedy_tokens_do_not_depend_on_drafts() {
    check_model(SMOLLM);
}

/// Sampled speculation draws from the target's distribution (the rule is tested statistically in
/// `spec::accept`); here: on a real model a seed fixes the output, and the tokens are the model's own
/// likely ones (a draft model sampling for itself keeps most drafts).
#[test]
fn sampled_speculation_is_reproducible_and_keeps_most_self_drafts() {
    let (mut engine, _) = load(SMOLLM.1);
    let golden = golden();
    let prompt = ids(&prompt(&golden, SMOLLM.0, "code")["ids"]);
    let sampling = SamplingParams {
        temperature: 0.8,
        seed: 5,
        ..Default::default()
    };
    let mut run = || {
        let (draft_engine, _) = load(SMOLLM.1);
        let mut draft = DraftModel::new(draft_engine, 4096, 256, sampling.clone()).unwrap();
        speculative(
            &mut engine,
            &prompt,
            40,
            sampling.clone(),
            &mut draft,
            &mut DraftLength::new(4, false),
        )
    };
    let (a, stats) = run();
    let (b, _) = run();
    assert_eq!(a, b, "same seed, same tokens");
    assert!(stats.acceptance() > 0.5, "{stats:?}");
}
