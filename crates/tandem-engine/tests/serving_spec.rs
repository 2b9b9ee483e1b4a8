//! Speculative decoding in the serving engine, on both real models: a request with prompt-lookup drafts
//! sends the same tokens with the same logprobs (bits) as without, alone and batched beside requests
//! that do not speculate, stops at exactly `max_tokens`, leaves a cached conversation that a follow-up
//! turn reuses, keeps the KV books balanced, and shows its drafts in the stats. On Gemma 3 the licence
//! prompt runs past the sliding window, so verify passes wrap the rings and are cut back inside them.
//! A server with a draft model drafts with it for the requests that ask.

mod common;

use common::*;
use tandem_engine::serve::{EngineHandle, Event, FinishReason, GenerationRequest, ServingConfig, ServingEngine};
use tandem_engine::spec::{SpecMode, SpecSettings};
use tandem_gguf::GgufFile;
use tandem_model::Model;

fn load(file: &str) -> Model {
    Model::from_file(GgufFile::open(model_path(file)).unwrap(), threads()).unwrap()
}

fn engine(file: &str) -> ServingEngine {
    let config = ServingConfig {
        n_ctx: 2048,
        ..Default::default()
    };
    ServingEngine::start(load(file), config)
}

fn request(prompt: &[u32], max_tokens: usize, spec: Option<SpecSettings>) -> GenerationRequest {
    GenerationRequest {
        speculative: spec,
        ..greedy_request(prompt.to_vec(), max_tokens, Some(2))
    }
}

fn lookup(draft_max: usize, adaptive: bool) -> Option<SpecSettings> {
    Some(SpecSettings {
        mode: SpecMode::Lookup,
        draft_max,
        adaptive,
    })
}

/// Tokens with their logprobs' bits, and the finish reason.
fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> (Vec<(u32, u32)>, FinishReason, usize) {
    let (mut tokens, mut reused) = (vec![], 0);
    while let Some(e) = rx.blocking_recv() {
        match e {
            Event::Started { reused: r, .. } => reused = r,
            Event::Token { id, logprob } => tokens.push((id, logprob.expect("logprobs asked for").logprob.to_bits())),
            Event::Done { reason, .. } => return (tokens, reason, reused),
            Event::Failed(m) => panic!("request failed: {m}"),
            Event::KvRows(_) => panic!("a generation sent KV rows"),
        }
    }
    panic!("the stream ended without Done")
}

fn check_model((key, file): (&str, &str)) {
    let golden = golden();
    let engine = engine(file);
    let licence = ids(&prompt(&golden, key, "gpl3-long")["ids"]);
    let code = ids(&prompt(&golden, key, "code")["ids"]);
    let n = 40;
    let plain = |p: &[u32]| {
        engine.flush_cache();
        collect(engine.submit(request(p, n, None)).unwrap())
    };
    let want_licence = plain(&licence);
    let want_code = plain(&code);

    for spec in [lookup(4, false), lookup(8, true), lookup(16, false)] {
        engine.flush_cache();
        let got = collect(engine.submit(request(&licence, n, spec)).unwrap());
        assert_eq!(
            got.0, want_licence.0,
            "{key} licence {spec:?}: tokens or logprobs differ"
        );
        assert_eq!(got.1, FinishReason::Length);
        assert_eq!(got.0.len(), n, "exactly max_tokens");
    }
    let stats = engine.stats();
    assert!(
        stats.spec.drafted > 0 && stats.spec.accepted > 0,
        "{key}: {:?}",
        stats.spec
    );
    assert!(
        stats.spec.emitted > stats.spec.steps,
        "{key}: drafts gained tokens: {:?}",
        stats.spec
    );

    // Batched: one request speculates, the other does not; each sends what it sends alone.
    engine.flush_cache();
    let a = engine.submit(request(&licence, n, lookup(8, false))).unwrap();
    let b = engine.submit(request(&code, n, None)).unwrap();
    let (a, b) = (collect(a), collect(b));
    assert_eq!(a.0, want_licence.0, "{key}: speculating beside a plain request");
    assert_eq!(b.0, want_code.0, "{key}: plain beside a speculating request");

    // The speculating conversation was cached with only what it fed: a follow-up turn reuses it all.
    let mut follow = licence.clone();
    follow.extend(a.0.iter().map(|t| t.0));
    follow.extend(&code[1..]);
    let cont = collect(engine.submit(request(&follow, 8, lookup(8, true))).unwrap());
    assert_eq!(
        cont.2,
        licence.len() + n - 1,
        "{key}: the follow-up reuses the whole first turn"
    );
    engine.flush_cache();
    let fresh = collect(engine.submit(request(&follow, 8, None)).unwrap());
    assert_eq!(cont.0, fresh.0, "{key}: a follow-up on a speculated conversation");

    // A step never drafts past max_tokens: short requests end exactly there.
    for max_tokens in [1, 2, 3] {
        let got = collect(engine.submit(request(&licence, max_tokens, lookup(8, false))).unwrap());
        assert_eq!(
            got.0[..],
            want_licence.0[..max_tokens],
            "{key}: max_tokens {max_tokens}"
        );
    }
    assert_eq!(engine.stats().kv_accounting_violations, 0);
}

#[test]
fn gemma3_speculating_requests_send_the_same_bits() {
    check_model(GEMMA);
}

#[test]
fn smollm2_speculating_requests_send_the_same_bits() {
    check_model(SMOLLM);
}

/// A server whose draft model is the target itself (which agrees with every greedy draft).
fn drafting_engine(file: &'static str, config: ServingConfig) -> ServingEngine {
    ServingEngine::start_with_draft(
        move || Ok::<_, std::convert::Infallible>((load(file), Some(load(file)))),
        true,
        config,
    )
    .unwrap_or_else(|e| match e {})
}

/// A server with a draft model (here the target itself, which agrees with every greedy draft): requests
/// that draft with it send the same bits as plain ones, alone and two at a time, past Gemma 3's window,
/// their draft caches reading the prompt a busy chunk a step first; a follow-up turn's draft continues
/// from the finished turn's draft cache.
#[test]
fn a_draft_model_drafts_for_requests() {
    let golden = golden();
    let (key, file) = GEMMA;
    let config = ServingConfig {
        n_ctx: 2048,
        ..Default::default()
    };
    let engine = drafting_engine(file, config);
    let licence = ids(&prompt(&golden, key, "gpl3-long")["ids"]);
    let code = ids(&prompt(&golden, key, "code")["ids"]);
    // The licence is 1,138 tokens: its draft cache catches up 64 rows a step (no drafts meanwhile),
    // then drafts for the rest.
    let n = 48;
    let draft = Some(SpecSettings {
        mode: SpecMode::Draft,
        draft_max: 6,
        adaptive: false,
    });
    let want: Vec<_> = [&licence, &code]
        .iter()
        .map(|p| {
            engine.flush_cache();
            collect(engine.submit(request(p, n, None)).unwrap()).0
        })
        .collect();
    engine.flush_cache();
    let got = collect(engine.submit(request(&licence, n, draft)).unwrap());
    assert_eq!(got.0, want[0], "drafted by the model itself");
    // A later request's tokens come after the earlier step's stats are published.
    collect(engine.submit(request(&code, 1, None)).unwrap());
    let s = engine.stats().spec;
    assert!(s.drafted > 0 && s.accepted == s.drafted, "{s:?}");
    engine.flush_cache();
    let a = engine.submit(request(&licence, n, draft)).unwrap();
    let b = engine.submit(request(&code, n, draft)).unwrap();
    assert_eq!(collect(a).0, want[0], "two drafting requests at once");
    assert_eq!(collect(b).0, want[1], "two drafting requests at once");
    // A follow-up turn: its draft continues from the licence request's kept draft cache (drafting
    // from its first step) and sends the bits of a plain request.
    let reused = engine.stats().draft_prefix_tokens_reused_total;
    let answer = want[0].iter().map(|&(token, _)| token);
    let follow: Vec<u32> = licence
        .iter()
        .copied()
        .chain(answer)
        .chain(code[1..20].iter().copied())
        .collect();
    let plain = collect(engine.submit(request(&follow, 16, None)).unwrap()).0;
    let drafted = collect(engine.submit(request(&follow, 16, draft)).unwrap()).0;
    assert_eq!(drafted, plain, "a follow-up turn drafting from a kept draft cache");
    collect(engine.submit(request(&code, 1, None)).unwrap());
    let s = engine.stats();
    assert!(
        s.draft_prefix_tokens_reused_total >= reused + licence.len() as u64,
        "the follow-up's draft took over the licence's: {} then {}",
        reused,
        s.draft_prefix_tokens_reused_total
    );
    assert_eq!(s.kv_accounting_violations, 0);
}

#[test]
fn draft_model_requests_are_refused_with_a_reason() {
    let engine = engine(SMOLLM.1);
    let spec = Some(SpecSettings {
        mode: SpecMode::Draft,
        draft_max: 4,
        adaptive: true,
    });
    let err = engine.submit(request(&[1, 2, 3], 4, spec)).unwrap_err();
    assert!(err.to_string().contains("lookup"), "{err}");
    let too_long = Some(SpecSettings {
        draft_max: 10_000,
        ..lookup(4, true).unwrap()
    });
    assert!(engine.submit(request(&[1, 2, 3], 4, too_long)).is_err());
    // The engine keeps serving.
    let (tokens, reason, _) = collect(engine.submit(request(&[1, 2, 3], 4, lookup(4, true))).unwrap());
    assert_eq!((tokens.len(), reason), (4, FinishReason::Length));
}

/// Kept draft caches give way to new requests: with a KV budget of about two requests, drafting
/// requests one after another each still draft (the kept caches of earlier ones given back when the
/// draft pool is full) and send the bits of plain requests.
#[test]
fn kept_draft_caches_give_way_when_the_draft_pool_is_full() {
    use tandem_model::ServingBackend;
    let golden = golden();
    let (key, file) = SMOLLM;
    let (n_ctx, prompt_len, n) = (512, 240, 12);
    let budget = 2 * load(file).kv_sizing(n_ctx).bytes_at(prompt_len + n);
    let config = ServingConfig {
        n_ctx,
        kv_budget_bytes: budget,
        cache_budget_bytes: budget,
        ..Default::default()
    };
    let engine = drafting_engine(file, config);
    let licence = ids(&prompt(&golden, key, "gpl3-long")["ids"]);
    let prompts: Vec<&[u32]> = licence.chunks_exact(prompt_len).take(4).collect();
    assert_eq!(prompts.len(), 4, "the licence holds four prompts");
    let want: Vec<_> = prompts
        .iter()
        .map(|p| collect(engine.submit(request(p, n, None)).unwrap()).0)
        .collect();
    engine.flush_cache();
    let draft = Some(SpecSettings {
        mode: SpecMode::Draft,
        draft_max: 4,
        adaptive: false,
    });
    for (i, p) in prompts.iter().enumerate() {
        let before = engine.stats().spec.drafted;
        assert_eq!(
            collect(engine.submit(request(p, n, draft)).unwrap()).0,
            want[i],
            "request {i}"
        );
        // A later request's tokens come after the earlier step's stats are published.
        collect(engine.submit(request(&p[..8], 1, None)).unwrap());
        assert!(engine.stats().spec.drafted > before, "request {i} drafted");
    }
    assert_eq!(engine.stats().kv_accounting_violations, 0);
}
