//! The serving engine on the real Gemma 3 model: batch invariance, prefix reuse across turns (ring
//! layers included), cancellation freeing KV, and a decoder not starved by a long prefill.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tandem_engine::serve::{EngineHandle, Event, FinishReason, GenerationRequest, ServingConfig, ServingEngine};
use tandem_gguf::GgufFile;
use tandem_model::Model;
use tandem_tokenizer::Tokenizer;

fn engine(config: ServingConfig) -> (ServingEngine, Tokenizer) {
    let gguf = GgufFile::open(model_path(GEMMA.1)).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    (
        ServingEngine::start(Model::from_file(gguf, threads()).unwrap(), config),
        tok,
    )
}

fn request(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    greedy_request(prompt, max_tokens, Some(2))
}

/// Collects a request's events: (reused, tokens with their logprobs, finish reason).
fn collect(mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>) -> (usize, Vec<(u32, f32)>, FinishReason) {
    let (mut reused, mut tokens) = (0, vec![]);
    while let Some(e) = rx.blocking_recv() {
        match e {
            Event::Started { reused: r, .. } => reused = r,
            Event::Token { id, logprob } => tokens.push((id, logprob.map_or(f32::NAN, |l| l.logprob))),
            Event::Done { reason, .. } => return (reused, tokens, reason),
            Event::Failed(m) => panic!("request failed: {m}"),
            Event::KvRows(_) => panic!("a generation sent KV rows"),
        }
    }
    panic!("the stream ended without Done")
}

fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    [
        "The capital of France is",
        "fn main() {",
        "Once upon a time",
        "The three primary colors are",
        "def fibonacci(n):",
        "Water boils at",
        "The largest planet in the solar system",
        "In 1969, astronauts",
    ]
    .iter()
    .map(|p| tok.encode(p, true, false))
    .collect()
}

#[test]
fn batched_outputs_equal_each_request_alone() {
    let (engine, tok) = engine(ServingConfig {
        n_ctx: 512,
        ..Default::default()
    });
    let prompts = prompts(&tok);
    let alone: Vec<_> = prompts
        .iter()
        .map(|p| collect(engine.submit(request(p.clone(), 24)).unwrap()))
        .collect();
    engine.flush_cache();
    let receivers: Vec<_> = prompts
        .iter()
        .map(|p| engine.submit(request(p.clone(), 24)).unwrap())
        .collect();
    let together: Vec<_> = receivers.into_iter().map(collect).collect();
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        let bits = |v: &Vec<(u32, f32)>| v.iter().map(|(t, l)| (*t, l.to_bits())).collect::<Vec<_>>();
        assert_eq!(
            bits(&a.1),
            bits(&b.1),
            "prompt {i}: tokens or logprobs differ when batched"
        );
    }
    // Stats are published at the end of each engine step, just after the last event went out.
    let deadline = Instant::now() + Duration::from_secs(5);
    while engine.stats().running != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = engine.stats();
    assert_eq!(stats.running, 0);
    assert!(stats.decode_tokens_total > 0 && stats.requests_total == 16);
}

#[test]
fn a_follow_up_turn_reuses_the_conversation_even_past_the_ring() {
    let (engine, tok) = engine(ServingConfig {
        n_ctx: 2048,
        ..Default::default()
    });
    let golden = golden();
    // 1,138 tokens: every sliding-window ring has wrapped twice.
    let first = ids(&prompt(&golden, GEMMA.0, "gpl3-long")["ids"]);
    let (reused, reply, _) = collect(engine.submit(request(first.clone(), 16)).unwrap());
    assert_eq!(reused, 0);
    // The next turn: the whole conversation so far, then new text.
    let mut second = first.clone();
    second.extend(reply.iter().map(|(t, _)| *t));
    second.extend(tok.encode("\nSummarize the license in one sentence:", false, false));
    let (reused_second, continued, _) = collect(engine.submit(request(second.clone(), 16)).unwrap());
    assert!(
        reused_second >= first.len() + reply.len() - 1,
        "reused {reused_second} of {}",
        second.len()
    );
    // A turn that diverges inside the previous reply: the rings cannot be cut back there, so the
    // checkpoint at the end of the first prompt serves, and only the rest is read.
    let mut third = first.clone();
    third.extend(tok.encode(" A different reply.", false, false));
    let (reused, diverged, _) = collect(engine.submit(request(third.clone(), 4)).unwrap());
    assert_eq!(
        reused,
        first.len(),
        "restored from the checkpoint at the end of the first prompt"
    );

    // Reused or read afresh, the same bits.
    let bits = |v: &Vec<(u32, f32)>| v.iter().map(|(t, l)| (*t, l.to_bits())).collect::<Vec<_>>();
    for (prompt, reused_run) in [(&second, &continued), (&third, &diverged)] {
        engine.flush_cache();
        let (reused_fresh, fresh, _) = collect(engine.submit(request(prompt.clone(), reused_run.len())).unwrap());
        assert_eq!(reused_fresh, 0);
        assert_eq!(
            bits(reused_run),
            bits(&fresh),
            "reused KV must give the same bits as reading it all"
        );
    }

    eprintln!(
        "follow-up turn: prompt {} = {reused_second} reused + {} read",
        second.len(),
        second.len() - reused_second
    );
}

#[test]
fn a_dropped_client_frees_its_kv_at_once() {
    let (engine, tok) = engine(ServingConfig {
        n_ctx: 1024,
        cache_budget_bytes: 0,
        ..Default::default()
    });
    let mut rx = engine
        .submit(request(tok.encode("Tell me a long story", true, false), 500))
        .unwrap();
    let mut seen = 0;
    while seen < 3 {
        if let Some(Event::Token { .. }) = rx.blocking_recv() {
            seen += 1;
        }
    }
    assert_eq!(engine.stats().running, 1);
    assert!(engine.stats().kv_bytes_used > 0);
    drop(rx);
    let deadline = Instant::now() + Duration::from_secs(5);
    while engine.stats().running != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = engine.stats();
    assert_eq!(
        (stats.running, stats.kv_bytes_used),
        (0, 0),
        "cancelled sequence still holds KV"
    );
}

#[test]
fn queue_and_limits_refuse_cleanly() {
    let (engine, tok) = engine(ServingConfig {
        n_ctx: 64,
        max_queue: 1,
        max_tokens_limit: 100,
        ..Default::default()
    });
    let long = vec![2u32; 80];
    assert!(matches!(
        engine.submit(request(long, 4)),
        Err(tandem_engine::serve::SubmitError::PromptTooLong {
            n_prompt: 80,
            n_ctx: 64
        })
    ));
    assert!(engine.submit(request(tok.encode("hi", true, false), 101)).is_err());
    assert!(engine.submit(request(vec![], 4)).is_err());

    // A request that could never fit the whole KV budget is refused up front, not failed midway.
    // (`crate::engine`: the local `engine` shadows the helper.)
    let (small, tok) = crate::engine(ServingConfig {
        n_ctx: 4096,
        kv_budget_bytes: 8 << 20,
        ..Default::default()
    });
    let refused = small.submit(request(tok.encode("hi", true, false), 2000));
    assert!(
        matches!(refused, Err(tandem_engine::serve::SubmitError::KvBudget { .. })),
        "{refused:?}"
    );
    assert!(small.submit(request(tok.encode("hi", true, false), 16)).is_ok());
}

#[test]
fn a_long_prefill_does_not_starve_a_decoder() {
    let (engine, tok) = engine(ServingConfig {
        n_ctx: 4608,
        ..Default::default()
    });
    let golden = golden();
    let gpl = ids(&prompt(&golden, GEMMA.0, "gpl3-long")["ids"]);
    let long: Vec<u32> = gpl.iter().cycle().take(4000).copied().collect();

    let mut stream = engine
        .submit(request(tok.encode("Once upon a time", true, false), 64))
        .unwrap();
    let mut times = vec![];
    while times.len() < 4 {
        if let Some(Event::Token { .. }) = stream.blocking_recv() {
            times.push(Instant::now());
        }
    }
    let big = engine.submit(request(long, 1)).unwrap();
    while let Some(e) = stream.blocking_recv() {
        match e {
            Event::Token { .. } => times.push(Instant::now()),
            Event::Done { .. } => break,
            _ => {}
        }
    }
    let (_, _, _) = collect(big);
    let worst = times.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    // The costs of a 64-row chunk (at the depth this prompt reached) and of a decode step, as the
    // engine measured them during this very run.
    let stats = engine.stats();
    let chunk64 = Duration::from_secs_f64(stats.max_busy_prefill_chunk_seconds);
    let step = Duration::from_secs_f64(stats.max_decode_step_seconds);
    assert!(chunk64 > Duration::ZERO, "the long prompt was prefilled in busy chunks");
    let bound = 2 * (chunk64 + step);
    eprintln!("longest gap {worst:?}; one 64-row chunk {chunk64:?}, one decode step {step:?}, bound {bound:?}");
    assert!(worst <= bound, "a decoder waited {worst:?}, over {bound:?}");
}

#[test]
fn the_kv_budget_queues_what_does_not_fit() {
    // One Gemma sequence of up to 256 positions takes 18 blocks of 256 rows × 1 KiB: 4.7 MB. A 6 MB pool
    // runs one at a time; the second waits in the queue, then runs once the first has finished.
    let budget = 6 << 20;
    let (engine, tok) = engine(ServingConfig {
        n_ctx: 512,
        kv_budget_bytes: budget,
        cache_budget_bytes: budget,
        ..Default::default()
    });
    let prompts = prompts(&tok);
    let alone: Vec<_> = prompts[..2]
        .iter()
        .map(|p| collect(engine.submit(request(p.clone(), 24)).unwrap()))
        .collect();
    let receivers: Vec<_> = prompts[..2]
        .iter()
        .map(|p| engine.submit(request(p.clone(), 24)).unwrap())
        .collect();
    let watcher = std::thread::scope(|scope| {
        let watch = scope.spawn(|| {
            let (mut most_running, mut most_bytes) = (0, 0);
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                let st = engine.stats();
                most_running = most_running.max(st.running);
                most_bytes = most_bytes.max(st.kv_bytes_used);
                if st.requests_total >= 4 && st.running == 0 && st.queued == 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            (most_running, most_bytes)
        });
        let together: Vec<_> = receivers.into_iter().map(collect).collect();
        for (a, b) in alone.iter().zip(&together) {
            assert_eq!(
                a.1.iter().map(|t| t.0).collect::<Vec<_>>(),
                b.1.iter().map(|t| t.0).collect::<Vec<_>>()
            );
        }
        watch.join().unwrap()
    });
    let (most_running, most_bytes) = watcher;
    assert_eq!(most_running, 1, "the budget fits one sequence at a time");
    assert!(
        most_bytes <= budget,
        "{most_bytes} bytes of KV in use, over the {budget}-byte budget"
    );
    assert!(engine.stats().kv_bytes_budget == budget);
}

#[test]
fn a_backend_made_and_warmed_up_on_the_engine_thread_serves_and_its_load_error_comes_back() {
    let refused = ServingEngine::start_with(|| Err::<Model, _>("no device here"), ServingConfig::default());
    assert!(matches!(refused, Err("no device here")));
    let panicked = std::panic::catch_unwind(|| {
        ServingEngine::start_with(
            || -> Result<Model, String> { panic!("load blew up") },
            ServingConfig::default(),
        )
    });
    let why = panicked.err().expect("a panic while loading reaches the caller");
    assert_eq!(why.downcast_ref::<&str>(), Some(&"load blew up"));

    let config = ServingConfig {
        n_ctx: 512,
        ..Default::default()
    };
    let path = model_path(GEMMA.1);
    // Made on the engine thread, and warmed up there as `tandem serve` does: the throwaway pass leaves
    // no trace in what the engine then computes.
    let made = ServingEngine::start_with(
        move || -> Result<Model, Box<dyn std::error::Error + Send + Sync>> {
            let model = Model::from_file(GgufFile::open(path)?, threads())?;
            let took = tandem_engine::serve::warm_up(&model, &[1, 64, 512, 4096], &[2, 5], 512)?;
            assert!(took > std::time::Duration::ZERO);
            Ok(model)
        },
        config.clone(),
    )
    .expect("the model loads and warms up on the engine thread");
    let (given, tok) = engine(config);
    let prompt = tok.encode("The capital of France is", true, false);
    let bits = |(_, tokens, _): (usize, Vec<(u32, f32)>, FinishReason)| {
        tokens.iter().map(|(t, l)| (*t, l.to_bits())).collect::<Vec<_>>()
    };
    let a = bits(collect(made.submit(request(prompt.clone(), 8)).unwrap()));
    let b = bits(collect(given.submit(request(prompt, 8)).unwrap()));
    assert_eq!(a.len(), 8);
    assert_eq!(a, b, "the same model gives the same bits however it reached the engine");
}

/// Gemma 3's sliding-window rings: the same long prompt sent again (a retry, a regenerated reply)
/// reuses all but its last token, which it reads from the state before it; and two conversations that
/// share a long system prompt and then differ reuse the shared part. Reused or read afresh, the same
/// bits.
#[test]
fn repeated_prompts_and_shared_system_prompts_reuse_their_kv_past_the_ring() {
    let (engine, tok) = engine(ServingConfig {
        n_ctx: 2048,
        ..Default::default()
    });
    let golden = golden();
    let long = ids(&prompt(&golden, GEMMA.0, "gpl3-long")["ids"]);
    let bits = |v: &Vec<(u32, f32)>| v.iter().map(|(t, l)| (*t, l.to_bits())).collect::<Vec<_>>();

    let (reused, first, _) = collect(engine.submit(request(long.clone(), 24)).unwrap());
    assert_eq!(reused, 0);
    let (reused, again, _) = collect(engine.submit(request(long.clone(), 24)).unwrap());
    assert_eq!(reused, long.len() - 1, "a repeated prompt re-reads only its last token");
    assert_eq!(bits(&first), bits(&again));

    // A 1,000-token "system prompt" (the licence's first 1,000 tokens), then two different questions.
    let system = &long[..1000];
    let ask = |question: &str| {
        let mut p = system.to_vec();
        p.extend(tok.encode(question, false, false));
        p
    };
    let (a, b) = (
        ask("\nWho wrote this license?"),
        ask("\nCan I sell copies of the program?"),
    );
    collect(engine.submit(request(a, 16)).unwrap());
    let (reused, shared, _) = collect(engine.submit(request(b.clone(), 16)).unwrap());
    assert!(
        reused >= 900,
        "the second conversation reused {reused} of its shared 1,000 tokens"
    );
    engine.flush_cache();
    let (fresh_reused, fresh, _) = collect(engine.submit(request(b, 16)).unwrap());
    assert_eq!(fresh_reused, 0);
    assert_eq!(
        bits(&shared),
        bits(&fresh),
        "reused KV must give the same bits as reading it all"
    );
}
