//! The two real models (fetched by `tandem pull`, which the README's test command runs first): both parse,
//! and re-writing them from what was read gives the original bytes.

use std::path::PathBuf;

use tandem_gguf::{GgmlType, GgufFile, GgufWriter};

fn model(file: &str) -> PathBuf {
    let home = std::env::var_os("TANDEM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tandem"));
    let p = home.join("models").join(file);
    assert!(
        p.exists(),
        "{} is missing: run `tandem pull gemma3-270m` and `tandem pull smollm2-135m` first",
        p.display()
    );
    p
}

fn rewrite_matches(path: PathBuf) -> GgufFile {
    let f = GgufFile::open(&path).unwrap();
    let w = GgufWriter::from_file(&f).unwrap();
    assert_eq!(w.file_size(), f.bytes().len() as u64, "layout of {}", path.display());
    let bytes = w
        .write_all(Vec::with_capacity(f.bytes().len()), |t| f.tensor_data(t))
        .unwrap();
    assert!(bytes == f.bytes(), "rewritten {} differs", path.display());
    f
}

#[test]
fn gemma3_reads_and_rewrites_identically() {
    let f = rewrite_matches(model("gemma-3-270m-q4_k_m.gguf"));
    assert_eq!(f.architecture().unwrap(), "gemma3");
    assert_eq!(f.get_u64("gemma3.block_count").unwrap(), Some(18));
    assert_eq!(f.tensors().len(), 236);
    let (emb, data) = f.tensor("token_embd.weight").unwrap();
    assert_eq!((emb.ty, emb.dims.as_slice()), (GgmlType::Q8_0, &[640, 262144][..]));
    assert_eq!(data.len() as u64, 640 / 32 * 34 * 262144);
    assert_eq!(f.get_array("tokenizer.ggml.tokens").unwrap().unwrap().len(), 262144);
}

#[test]
fn smollm2_reads_and_rewrites_identically() {
    let f = rewrite_matches(model("SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), Some("smollm"));
    assert_eq!(f.tensor_info("blk.0.ffn_down.weight").unwrap().ty, GgmlType::Q4_1);
}
