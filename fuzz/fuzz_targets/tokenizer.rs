//! Any text through both real-shaped tokenizers (a small SPM and a small BPE vocabulary built in memory):
//! encoding never panics, and decoding what was encoded never panics either.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tandem_gguf::{Array, GgufFile, GgufWriter, Value};
use tandem_tokenizer::Tokenizer;

fn build(model: &str) -> Tokenizer {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    w.add_metadata("tokenizer.ggml.model", model).unwrap();
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into(), "<tag>".into()];
    let mut types = vec![2, 3, 3, 4];
    if model == "llama" {
        tokens.extend((0u8..=255).map(|b| format!("<0x{b:02X}>")));
        types.extend(std::iter::repeat_n(6, 256));
        for t in ["▁", "a", "b", "ab", "▁a", "▁ab", "é", "日本"] {
            tokens.push(t.into());
            types.push(1);
        }
        let scores: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32)).collect();
        w.add_metadata("tokenizer.ggml.scores", Array::F32(scores)).unwrap();
    } else {
        let bytes = (0u8..=255).map(|b| {
            let printable = |b: u8| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
            if printable(b) {
                char::from(b)
            } else {
                char::from_u32(256 + (0u8..b).filter(|&x| !printable(x)).count() as u32).unwrap()
            }
        });
        tokens.extend(bytes.map(String::from));
        types.extend(std::iter::repeat_n(1, 256));
        for t in ["ab", "Ġa", "Ġab"] {
            tokens.push(t.into());
            types.push(1);
        }
        w.add_metadata("tokenizer.ggml.pre", "smollm").unwrap();
        w.add_metadata("tokenizer.ggml.merges", Array::String(vec!["a b".into(), "Ġ a".into(), "Ġa b".into()]))
            .unwrap();
    }
    w.add_metadata("tokenizer.ggml.tokens", Array::String(tokens)).unwrap();
    w.add_metadata("tokenizer.ggml.token_type", Array::I32(types)).unwrap();
    w.add_metadata("tokenizer.ggml.bos_token_id", Value::U32(1)).unwrap();
    w.add_metadata("tokenizer.ggml.eos_token_id", Value::U32(2)).unwrap();
    let bytes = w.write_all(Vec::new(), |_| &[]).unwrap();
    Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap()
}

fuzz_target!(|data: &[u8]| {
    static TOKENIZERS: OnceLock<[Tokenizer; 2]> = OnceLock::new();
    let toks = TOKENIZERS.get_or_init(|| [build("llama"), build("gpt2")]);
    let text = String::from_utf8_lossy(data);
    for tok in toks {
        for special in [false, true] {
            let ids = tok.encode(&text, true, special);
            let _ = tok.decode(&ids, special);
        }
        // Arbitrary ids, in range or not, decode without panicking.
        let ids: Vec<u32> = data.chunks(2).map(|c| c.iter().fold(0u32, |a, &b| a * 256 + b as u32)).collect();
        let _ = tok.decode(&ids, true);
    }
});
