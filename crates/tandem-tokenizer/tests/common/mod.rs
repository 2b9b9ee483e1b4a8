//! Shared helpers: locating the real models and the llama.cpp goldens, and reporting id mismatches.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::Value;
use tandem_gguf::GgufFile;
use tandem_tokenizer::Tokenizer;

pub const GEMMA_FILE: &str = "gemma-3-270m-q4_k_m.gguf";
pub const GEMMA_KEY: &str = "gemma3-270m-q4_k_m";
pub const SMOL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const SMOL_KEY: &str = "smollm2-135m-instruct-q4_1";

/// `$TANDEM_HOME/models/<file>` (default `$HOME/.cache/tandem`). A missing model fails the test: these
/// tests are the parity check and must not pass by skipping.
pub fn model_path(file: &str) -> PathBuf {
    let alias = match file {
        GEMMA_FILE => "gemma3-270m",
        SMOL_FILE => "smollm2-135m",
        other => other,
    };
    let home = std::env::var_os("TANDEM_HOME").map(PathBuf::from).unwrap_or_else(|| {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/root"));
        home.join(".cache").join("tandem")
    });
    let path = home.join("models").join(file);
    assert!(
        path.is_file(),
        "model {} not found: run `tandem pull {alias}` first (or set TANDEM_HOME)",
        path.display()
    );
    path
}

pub struct Model {
    pub file: GgufFile,
    pub tok: Tokenizer,
}

fn load(file: &str) -> Model {
    let path = model_path(file);
    let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let t0 = std::time::Instant::now();
    let tok = Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("tokenizer of {}: {e}", path.display()));
    eprintln!(
        "{file}: tokenizer built in {:?}, warnings {:?}",
        t0.elapsed(),
        tok.warnings()
    );
    Model { file: gguf, tok }
}

pub fn gemma() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| load(GEMMA_FILE))
}

pub fn smol() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| load(SMOL_FILE))
}

/// The goldens: `$TANDEM_GOLDEN`, else the repository's copy, `tests/data/golden-visible.json`.
pub fn golden() -> &'static Value {
    static G: OnceLock<Value> = OnceLock::new();
    G.get_or_init(|| {
        let path = std::env::var_os("TANDEM_GOLDEN")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/golden-visible.json"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("golden file {} unreadable ({e}); set TANDEM_GOLDEN", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("golden file {}: {e}", path.display()))
    })
}

pub fn golden_model(key: &str) -> &'static Value {
    let m = &golden()["models"][key];
    assert!(m.is_object(), "golden file has no model {key:?}");
    m
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an id array")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// `None` when equal, else a report of the first difference with the tokens around it.
pub fn mismatch(tok: &Tokenizer, label: &str, text: &str, got: &[u32], want: &[u32]) -> Option<String> {
    if got == want {
        return None;
    }
    let at = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let show = |ids: &[u32]| {
        let lo = at.saturating_sub(3);
        let hi = (at + 4).min(ids.len());
        ids[lo..hi]
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let mark = if lo + i == at { ">>" } else { "" };
                format!("{mark}{id}:{:?}", tok.token_text(id).unwrap_or("?"))
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    let preview: String = text.chars().take(80).collect();
    Some(format!(
        "{label} {preview:?}: first difference at index {at} (got {} ids, want {})\n  got:  {}\n  want: {}",
        got.len(),
        want.len(),
        show(got),
        show(want)
    ))
}
