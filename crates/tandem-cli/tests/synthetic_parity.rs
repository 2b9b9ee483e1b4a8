//! Parity with llama.cpp on architectures no real model on the package index has (Qwen3, Qwen3-MoE):
//! `tandem synth` writes small files of those architectures, their sha256 must be the one the
//! reference was made from (`tests/data/synthetic-parity.json`, by `scripts/synthetic_reference.py`),
//! and Tandem's logits must meet the dense parity test's criteria against llama.cpp's on them: top-1
//! wherever llama.cpp's margin is at least 0.4, greedy tokens up to the first step below that
//! margin, mean NLL within 1%.

mod common;

use common::*;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tandem_engine::score::ScoreOptions;
use tandem_engine::{Engine, GenerateOptions, SamplingParams};
use tandem_gguf::GgufFile;
use tandem_model::Model;

const ENFORCED_MARGIN: f64 = 0.4;

fn check(model: &Value) -> Vec<String> {
    let name = model["name"].as_str().unwrap();
    let args = synth_args(model);
    let path = scratch("synparity").join(format!("{name}.gguf"));
    synth(&args, &path);
    let bytes = std::fs::read(&path).unwrap();
    let digest: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        digest,
        model["sha256"].as_str().unwrap(),
        "{name}: `tandem synth {}` no longer writes the file the reference was made from",
        args.join(" ")
    );
    let mut engine = Engine::new(Model::from_file(GgufFile::open(&path).unwrap(), threads()).unwrap());
    let mut failures = Vec::new();
    for (i, p) in model["prompts"].as_array().unwrap().iter().enumerate() {
        let prompt = ids(&p["ids"]);
        let opts = ScoreOptions {
            top_k: 1,
            positions: (0..prompt.len()).collect(),
            keep_rows: true,
            ..ScoreOptions::chunked(512)
        };
        let mut kv = engine.new_sequence(prompt.len());
        let score = engine.score(&mut kv, &prompt, &opts).unwrap();
        let (mut checked, mut max_diff) = (0, 0f64);
        for ((pos, row), want) in score.rows.iter().zip(p["top2"].as_array().unwrap()) {
            let (best, l1, l2) = (
                want[0].as_u64().unwrap() as usize,
                want[1].as_f64().unwrap(),
                want[3].as_f64().unwrap(),
            );
            max_diff = max_diff.max((row[best] as f64 - l1).abs());
            if l1 - l2 >= ENFORCED_MARGIN {
                checked += 1;
                let ours = tandem_engine::sampling::argmax(row);
                if ours as usize != best {
                    failures.push(format!(
                        "{name} prompt {i}: top-1 at {pos} is {ours}, llama.cpp {best} (margin {:.3})",
                        l1 - l2
                    ));
                }
            }
        }
        let want_nll = p["mean_nll"].as_f64().unwrap();
        let nll_err = (score.mean_nll - want_nll).abs() / want_nll;
        if nll_err >= 0.01 {
            failures.push(format!(
                "{name} prompt {i}: mean NLL {:.5} vs llama.cpp {want_nll:.5}",
                score.mean_nll
            ));
        }

        let want_greedy = ids(&p["greedy_ids"]);
        let margins: Vec<f64> = p["greedy_top2_margin"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();
        let enforced = margins
            .iter()
            .position(|&m| m < ENFORCED_MARGIN)
            .unwrap_or(want_greedy.len());
        let opts = GenerateOptions {
            max_tokens: want_greedy.len(),
            prefill_chunk: 512,
            sampling: SamplingParams {
                temperature: 0.0,
                ..Default::default()
            },
            stop_ids: vec![],
        };
        let mut kv = engine.new_sequence(prompt.len() + want_greedy.len());
        let (got, _) = engine.generate(&mut kv, &prompt, &opts, |_| true).unwrap();
        let same = got.iter().zip(&want_greedy).take_while(|(a, b)| a == b).count();
        if same < enforced {
            failures.push(format!(
                "{name} prompt {i}: greedy differs at step {same} (llama.cpp margin {:.3}): {got:?} vs {want_greedy:?}",
                margins[same]
            ));
        }
        eprintln!(
            "{name} prompt {i} ({} tokens): mean NLL {:.5} vs {want_nll:.5} ({:.3}%), top-1 checked at {checked}, \
             max |Δ top logit| {max_diff:.4}, greedy {same} of {} equal ({enforced} required)",
            prompt.len(),
            score.mean_nll,
            nll_err * 100.0,
            want_greedy.len()
        );
    }
    std::fs::remove_file(&path).ok();
    failures
}

fn check_named(name: &str) {
    let failures = check(&reference_model(name));
    assert!(
        failures.is_empty(),
        "{name} differs from llama.cpp:\n  {}",
        failures.join("\n  ")
    );
}

#[test]
fn qwen3_matches_llama_cpp_on_a_synthetic_file() {
    check_named("qwen3-tiny");
}

#[test]
fn qwen3moe_matches_llama_cpp_on_a_synthetic_file() {
    check_named("qwen3moe-tiny");
}

#[test]
fn qwen3moe_with_skewed_routers_matches_llama_cpp() {
    check_named("qwen3moe-tiny-skewed");
}
