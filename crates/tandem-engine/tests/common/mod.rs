//! Shared by the real-model tests: model paths, goldens, engines.

#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;
use tandem_engine::serve::GenerationRequest;
use tandem_engine::{Engine, SamplingParams};
use tandem_gguf::GgufFile;
use tandem_model::Model;
use tandem_tokenizer::Tokenizer;

pub const GEMMA: (&str, &str) = ("gemma3-270m-q4_k_m", "gemma-3-270m-q4_k_m.gguf");
pub const SMOLLM: (&str, &str) = ("smollm2-135m-instruct-q4_1", "SmolLM2-135M-Instruct.Q4_1.gguf");

pub fn model_path(file: &str) -> PathBuf {
    let home = std::env::var_os("TANDEM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tandem"));
    let p = home.join("models").join(file);
    assert!(p.exists(), "{} is missing: run `tandem pull all` first", p.display());
    p
}

pub fn golden() -> Value {
    let path = std::env::var_os("TANDEM_GOLDEN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/golden-visible.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden json")
}

pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub fn load(file: &str) -> (Engine, Tokenizer) {
    let gguf = GgufFile::open(model_path(file)).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    (Engine::new(Model::from_file(gguf, threads()).unwrap()), tok)
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The prompt named `name` of a model in the goldens.
pub fn prompt<'a>(golden: &'a Value, key: &str, name: &str) -> &'a Value {
    golden["models"][key]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{key} has no prompt {name}"))
}

/// A greedy request (temperature 0, no stop ids) for the serving-engine tests.
pub fn greedy_request(prompt: Vec<u32>, max_tokens: usize, top_logprobs: Option<usize>) -> GenerationRequest {
    GenerationRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        stop_ids: vec![],
        top_logprobs,
        speculative: None,
    }
}
