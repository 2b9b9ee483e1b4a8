//! Mixtures of experts on the CPU: a row's logits do not depend on which rows share its chunk or its
//! batch (the router picks each row's experts, and the experts' GEMMs group rows by expert, so a
//! different chunk groups different rows together), and malformed mixtures are refused with the rule
//! they break.

mod common;

use common::*;
use tandem_engine::score::ScoreOptions;
use tandem_engine::Engine;
use tandem_gguf::{GgufFile, GgufWriter, Value};
use tandem_model::{LogitRows, Model};

fn load(name: &str) -> (Engine, Vec<u32>) {
    let model = reference_model(name);
    let path = scratch("moe").join(format!("{name}.gguf"));
    synth(&synth_args(&model), &path);
    let engine = Engine::new(Model::from_file(GgufFile::open(&path).unwrap(), threads()).unwrap());
    std::fs::remove_file(&path).ok();
    // The reference's longest prompt (700 tokens).
    let prompt = ids(&model["prompts"].as_array().unwrap().last().unwrap()["ids"]);
    (engine, prompt)
}

fn check_chunking(name: &str) {
    let (mut engine, tokens) = load(name);
    let mut hash_of = |opts: ScoreOptions| {
        let mut kv = engine.new_sequence(tokens.len());
        engine.score(&mut kv, &tokens, &opts).unwrap().logits_sha256
    };
    let reference = hash_of(ScoreOptions::chunked(tokens.len()));
    let mut cases = vec![];
    for chunk in [512, 64, 7, 1] {
        cases.push((format!("chunks of {chunk}"), hash_of(ScoreOptions::chunked(chunk))));
    }
    cases.push((
        "prefill 300 then decode".to_string(),
        hash_of(ScoreOptions {
            first_chunk: Some(300),
            ..ScoreOptions::chunked(1)
        }),
    ));
    for (what, hash) in &cases {
        assert_eq!(hash, &reference, "{name}: {what} differs from the whole-prompt pass");
    }
}

#[test]
fn moe_logits_do_not_depend_on_chunking() {
    check_chunking("qwen3moe-tiny");
}

#[test]
fn moe_logits_with_skewed_routers_do_not_depend_on_chunking() {
    check_chunking("qwen3moe-tiny-skewed");
}

#[test]
fn a_batched_moe_step_gives_each_sequence_its_own_logits() {
    let (mut engine, tokens) = load("qwen3moe-tiny");
    let lens = [5, 300, 17, 64];
    let mut kvs: Vec<_> = lens.iter().map(|&n| engine.new_sequence(n + 2)).collect();
    for (kv, &n) in kvs.iter_mut().zip(&lens) {
        engine.prefill(kv, &tokens[..n], 64).unwrap();
    }
    let next: Vec<u32> = lens.iter().map(|&n| tokens[n]).collect();
    let mut alone = Vec::new();
    for (&n, &t) in lens.iter().zip(&next) {
        let mut kv = engine.new_sequence(n + 2);
        engine.prefill(&mut kv, &tokens[..n], 64).unwrap();
        alone.push(engine.forward(&mut kv, &[t], LogitRows::Last).unwrap());
    }
    let together = engine.forward_each(&mut kvs, &next).unwrap();
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a[..], b[..], "sequence {i}: batched logits differ from its own step");
    }
}

/// The tiny mixture's file with one metadata value replaced or one tensor's expert count cut to 15.
fn broken(meta: Option<(&str, Value)>, cut_experts_of: Option<&str>) -> Result<Model, String> {
    let path = scratch("moe-broken").join("base.gguf");
    synth(&synth_args(&reference_model("qwen3moe-tiny")), &path);
    let file = GgufFile::open(&path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        let v = match &meta {
            Some((key, new)) if key == k => new.clone(),
            _ => v.clone(),
        };
        w.add_metadata(k, v).unwrap();
    }
    for t in file.tensors() {
        let mut dims = t.dims.clone();
        if cut_experts_of == Some(t.name.as_str()) {
            dims[2] -= 1;
        }
        w.add_tensor(&t.name, &dims, t.ty).unwrap();
    }
    let sizes: Vec<usize> = w.tensors().iter().map(|t| t.size as usize).collect();
    let mut next = 0;
    let bytes = w
        .write_all(Vec::new(), |t| {
            let size = sizes[next];
            next += 1;
            &file.tensor_data(file.tensor_info(&t.name).unwrap())[..size]
        })
        .unwrap();
    Model::from_file(GgufFile::from_bytes(bytes).unwrap(), 1).map_err(|e| e.to_string())
}

#[test]
fn malformed_mixtures_are_refused_with_the_rule_they_break() {
    let err = |r: Result<Model, String>| r.err().expect("a malformed mixture must not load");
    let too_many = err(broken(Some(("qwen3moe.expert_used_count", Value::U32(17))), None));
    assert!(too_many.contains("17 of 16 experts used"), "{too_many}");
    let none = err(broken(Some(("qwen3moe.expert_used_count", Value::U32(0))), None));
    assert!(none.contains("0 of 16 experts used"), "{none}");
    let short = err(broken(None, Some("blk.1.ffn_up_exps.weight")));
    assert!(
        short.contains("blk.1.ffn_up_exps.weight") && short.contains("expected [256, 256, 16]"),
        "{short}"
    );
    assert!(broken(None, None).is_ok(), "the unbroken copy must load");
}
