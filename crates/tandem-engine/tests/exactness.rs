//! Bit exactness: a sequence's logits do not depend on how its prompt was chunked. On the 1,138-token
//! prompts (Gemma 3's 512-row rings wrap twice) every chunking gives the same sha256 over all logits —
//! chunk size 1 (every row through the decode route), 7, 64, 512, the whole prompt — and so does a
//! shorter prefill followed by one token at a time.

mod common;

use common::*;
use tandem_engine::score::ScoreOptions;
use tandem_model::LogitRows;

fn check_model((key, file): (&str, &str)) {
    let golden = golden();
    let tokens = ids(&prompt(&golden, key, "gpl3-long")["ids"]);
    assert_eq!(tokens.len(), 1138);
    let (mut engine, _) = load(file);
    let mut hash_of = |opts: ScoreOptions| {
        let mut kv = engine.new_sequence(tokens.len());
        engine.score(&mut kv, &tokens, &opts).unwrap().logits_sha256
    };
    let reference = hash_of(ScoreOptions::chunked(tokens.len()));
    let mut cases = vec![];
    for chunk in [512, 64, 7, 1] {
        cases.push((format!("chunks of {chunk}"), hash_of(ScoreOptions::chunked(chunk))));
    }
    // A 600-row prefill (the ring has wrapped), then every later token decoded alone.
    cases.push((
        "prefill 600 then decode".into(),
        hash_of(ScoreOptions {
            first_chunk: Some(600),
            ..ScoreOptions::chunked(1)
        }),
    ));
    // A prefill that ends just before a tile and ring boundary, then chunks that straddle it.
    cases.push((
        "prefill 511 then 65s".into(),
        hash_of(ScoreOptions {
            first_chunk: Some(511),
            ..ScoreOptions::chunked(65)
        }),
    ));
    for (what, hash) in &cases {
        assert_eq!(hash, &reference, "{key}: {what} differs from the whole-prompt pass");
    }
    eprintln!("{key}: {} chunkings, all logits sha256 {reference}", cases.len() + 1);
}

#[test]
fn gemma3_logits_do_not_depend_on_chunking() {
    check_model(GEMMA);
}

#[test]
fn smollm2_logits_do_not_depend_on_chunking() {
    check_model(SMOLLM);
}

/// A decode step batched across sequences (`Engine::forward_each`, one forward pass for all, as the
/// server and `tandem bench --parallel` run it) gives each sequence the logits it gets alone: on
/// SmolLM2, and on Gemma 3 with one sequence past its 512-row rings (windowed layers, QK-norm).
#[test]
fn a_batched_step_gives_each_sequence_its_own_logits() {
    check_batched(SMOLLM, &[5, 40, 17]);
    check_batched(GEMMA, &[5, 600, 17, 130]);
}

fn check_batched((key, file): (&str, &str), lens: &[usize]) {
    let golden = golden();
    let tokens = ids(&prompt(&golden, key, "gpl3-long")["ids"]);
    let (mut engine, _) = load(file);
    let mut kvs: Vec<_> = lens.iter().map(|&n| engine.new_sequence(n + 2)).collect();
    for (kv, &n) in kvs.iter_mut().zip(lens) {
        engine.prefill(kv, &tokens[..n], 64).unwrap();
    }
    let next: Vec<u32> = lens.iter().map(|&n| tokens[n]).collect();
    let mut alone_kvs: Vec<_> = lens.iter().map(|&n| engine.new_sequence(n + 2)).collect();
    let mut alone = Vec::new();
    for ((kv, &n), &t) in alone_kvs.iter_mut().zip(lens).zip(&next) {
        engine.prefill(kv, &tokens[..n], 64).unwrap();
        alone.push(engine.forward(kv, &[t], LogitRows::Last).unwrap());
    }
    let together = engine.forward_each(&mut kvs, &next).unwrap();
    assert_eq!(together.len(), lens.len());
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(
            a[..],
            b[..],
            "{key}: sequence {i}: batched logits differ from its own step"
        );
    }
    assert!(
        engine.forward_each(&mut kvs, &next[..lens.len() - 1]).is_err(),
        "a token short must be an error"
    );
}
