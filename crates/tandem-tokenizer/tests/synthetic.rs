//! Small vocabularies built in memory: hostile metadata must give errors naming the key (never a panic),
//! and hand-checkable BPE / SPM behaviour.

use tandem_gguf::{Array, GgufFile, GgufWriter, Value};
use tandem_tokenizer::{Tokenizer, TokenizerError, TokenizerKind};

fn file(meta: &[(&str, Value)]) -> GgufFile {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama").unwrap();
    for (k, v) in meta {
        w.add_metadata(k, v.clone()).unwrap();
    }
    let bytes = w.write_all(Vec::new(), |_| &[]).unwrap();
    GgufFile::from_bytes(bytes).unwrap()
}

fn strings(v: &[&str]) -> Value {
    Value::Array(Array::String(v.iter().map(|s| s.to_string()).collect()))
}

fn build(meta: &[(&str, Value)]) -> Result<Tokenizer, TokenizerError> {
    Tokenizer::from_gguf(&file(meta))
}

fn err_key(meta: &[(&str, Value)]) -> String {
    match build(meta) {
        Err(TokenizerError::Metadata { key, reason }) => {
            assert!(!reason.is_empty());
            key
        }
        Err(other) => panic!("expected a metadata error, got {other}"),
        Ok(_) => panic!("expected an error"),
    }
}

/// A byte-level BPE vocabulary: single characters, a few merges, specials at ids 0 and 1.
fn bpe_meta(pre: &str) -> Vec<(&'static str, Value)> {
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_end|>".into()];
    for c in "abcdehlorwĠ0123456789!,.'stĊ".chars() {
        tokens.push(c.to_string());
    }
    for t in [
        "he", "ll", "llo", "hello", "Ġw", "or", "orl", "Ġworl", "Ġworld", "12", "123",
    ] {
        tokens.push(t.to_string());
    }
    let types: Vec<i32> = tokens
        .iter()
        .enumerate()
        .map(|(i, _)| if i < 2 { 3 } else { 1 })
        .collect();
    let merges = [
        "h e", "l l", "ll o", "he llo", "Ġ w", "o r", "or l", "Ġw orl", "Ġworl d", "1 2", "12 3",
    ];
    vec![
        ("tokenizer.ggml.model", Value::from("gpt2")),
        ("tokenizer.ggml.pre", Value::from(pre)),
        ("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
        ("tokenizer.ggml.merges", strings(&merges)),
        ("tokenizer.ggml.bos_token_id", Value::U32(0)),
        ("tokenizer.ggml.eos_token_id", Value::U32(0)),
    ]
}

fn texts(t: &Tokenizer, ids: &[u32]) -> Vec<String> {
    ids.iter().map(|&i| t.token_text(i).unwrap().to_string()).collect()
}

#[test]
fn bpe_merges_and_pre_tokenizers() {
    for pre in ["default", "llama-bpe", "qwen2", "gpt-2"] {
        let t = build(&bpe_meta(pre)).unwrap();
        assert_eq!(t.kind(), TokenizerKind::Bpe { pre: pre.into() });
        let ids = t.encode("hello world", false, false);
        assert_eq!(texts(&t, &ids), ["hello", "Ġworld"], "{pre}");
        assert_eq!(t.decode(&ids, false), "hello world");
        // Merges apply by rank: "hell" has no merge into one piece except through "llo".
        assert_eq!(texts(&t, &t.encode("hell", false, false)), ["he", "ll"], "{pre}");
    }
    // Numbers: the default sequence splits 123456 into 123|456; llama-bpe into 123|456 too (groups of three);
    // qwen2 into single digits.
    let default = build(&bpe_meta("default")).unwrap();
    assert_eq!(texts(&default, &default.encode("1234", false, false)), ["123", "4"]);
    let llama = build(&bpe_meta("llama-bpe")).unwrap();
    assert_eq!(texts(&llama, &llama.encode("1234", false, false)), ["123", "4"]);
    assert!(llama.adds_bos(), "llama-bpe adds BOS by default");
    assert_eq!(llama.encode("a", true, false), [0, llama.token_id("a").unwrap()]);
    let qwen = build(&bpe_meta("qwen2")).unwrap();
    assert_eq!(texts(&qwen, &qwen.encode("1234", false, false)), ["1", "2", "3", "4"]);
    assert!(!qwen.adds_bos());
    // Special tokens: parsed only when asked; both end generation.
    let im_end = qwen.token_id("<|im_end|>").unwrap();
    assert_eq!(
        qwen.encode("a<|im_end|>", false, true),
        [qwen.token_id("a").unwrap(), im_end]
    );
    assert!(!qwen.encode("a<|im_end|>", false, false).contains(&im_end));
    assert!(qwen.is_eog(im_end) && qwen.is_eog(0));
    // Characters outside the vocabulary are dropped (no byte tokens for them), as in llama.cpp.
    assert_eq!(texts(&qwen, &qwen.encode("a€", false, false)), ["a"]);
}

#[test]
fn unknown_pre_warns_and_uses_default() {
    let t = build(&bpe_meta("some-new-model")).unwrap();
    assert!(
        t.warnings().iter().any(|w| w.contains("some-new-model")),
        "{:?}",
        t.warnings()
    );
    assert_eq!(
        texts(&t, &t.encode("hello, world", false, false)),
        ["hello", ",", "Ġworld"]
    );
}

/// An SPM vocabulary with scores, byte fallback and a user-defined token.
fn spm_meta() -> Vec<(&'static str, Value)> {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into(), "<|user|>".into()];
    let mut types = vec![2, 3, 3, 4];
    let mut scores = vec![0.0f32; 4];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (t, s) in [
        ("▁", -1.0),
        ("a", -2.0),
        ("b", -2.0),
        ("ab", -3.0),
        ("▁ab", -1.5),
        ("ba", -0.5),
        ("c", -2.0),
    ] {
        tokens.push(t.into());
        types.push(1);
        scores.push(s);
    }
    vec![
        ("tokenizer.ggml.model", Value::from("llama")),
        ("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
        ("tokenizer.ggml.scores", Value::Array(Array::F32(scores))),
    ]
}

#[test]
fn spm_scores_bytes_and_prefix_space() {
    let t = build(&spm_meta()).unwrap();
    assert_eq!(t.kind(), TokenizerKind::Spm);
    assert_eq!((t.bos(), t.eos()), (Some(1), Some(2)), "llama.cpp's SPM defaults");
    // add_space_prefix defaults to true: "ab" becomes "▁ab". The highest-scoring pair merges first:
    // "▁a"? not a token; "ab" (-3.0) is, then "▁" + "ab" = "▁ab" (-1.5).
    let ids = t.encode("ab", true, false);
    assert_eq!(texts(&t, &ids), ["<s>", "▁ab"]);
    assert_eq!(t.decode(&ids, false), " ab");
    // "bab": "ba" (-0.5) beats "ab" (-3.0); then "▁" stays alone.
    assert_eq!(texts(&t, &t.encode("bab", false, false)), ["▁", "ba", "b"]);
    // Unknown characters fall back to bytes; "é" is two.
    let ids = t.encode("é", false, false);
    assert_eq!(texts(&t, &ids), ["▁", "<0xC3>", "<0xA9>"]);
    assert_eq!(t.decode(&ids, false), " é");
    // The user-defined token is always split out; llama.cpp prefixes a space to every text fragment that
    // follows a special one, as to the first.
    let ids = t.encode("a<|user|>b", false, false);
    assert_eq!(texts(&t, &ids), ["▁", "a", "<|user|>", "▁", "b"]);
    // Control tokens only with parse_special.
    assert_eq!(texts(&t, &t.encode("</s>", false, true)), ["</s>"]);
    assert_eq!(
        texts(&t, &t.encode("</s>", false, false)),
        ["▁", "<0x3C>", "<0x2F>", "<0x73>", "<0x3E>"]
    );
    assert!(t.is_eog(2));
}

#[test]
fn shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<Tokenizer>();
    assert_send_sync::<tandem_tokenizer::StreamDecoder>();
    assert_send_sync::<tandem_tokenizer::ChatTemplate>();
}

#[test]
fn no_vocab_model() {
    let t = build(&[
        ("tokenizer.ggml.model", Value::from("none")),
        ("llama.vocab_size", Value::U32(10)),
    ])
    .unwrap();
    assert_eq!(t.kind(), TokenizerKind::None);
    assert_eq!(t.n_vocab(), 10);
    assert!(matches!(
        t.try_encode("hi", true, false),
        Err(TokenizerError::NoVocab { .. })
    ));
    assert!(t.encode("hi", true, false).is_empty());
    assert_eq!(t.decode(&[3, 7], false), "<3><7>");
    assert_eq!((t.bos(), t.eos(), t.is_eog(0)), (None, None, false));
}

#[test]
fn hostile_metadata() {
    let tokens = || ("tokenizer.ggml.tokens", strings(&["a", "b", "c"]));
    let llama = || ("tokenizer.ggml.model", Value::from("llama"));
    let gpt2 = || ("tokenizer.ggml.model", Value::from("gpt2"));

    assert_eq!(err_key(&[]), "tokenizer.ggml.model");
    assert_eq!(
        err_key(&[("tokenizer.ggml.model", Value::U32(1))]),
        "tokenizer.ggml.model"
    );
    assert_eq!(
        err_key(&[("tokenizer.ggml.model", Value::from("bert")), tokens()]),
        "tokenizer.ggml.model"
    );
    assert_eq!(err_key(&[llama()]), "tokenizer.ggml.tokens");
    assert_eq!(
        err_key(&[llama(), ("tokenizer.ggml.tokens", Value::Array(Array::I32(vec![1])))]),
        "tokenizer.ggml.tokens"
    );
    assert_eq!(
        err_key(&[llama(), ("tokenizer.ggml.tokens", strings(&[]))]),
        "tokenizer.ggml.tokens"
    );
    assert_eq!(
        err_key(&[
            llama(),
            tokens(),
            ("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0; 2])))
        ]),
        "tokenizer.ggml.scores"
    );
    assert_eq!(
        err_key(&[
            llama(),
            tokens(),
            (
                "tokenizer.ggml.scores",
                Value::Array(Array::String(vec!["x".into(); 3]))
            )
        ]),
        "tokenizer.ggml.scores"
    );
    assert_eq!(
        err_key(&[llama(), tokens(), ("tokenizer.ggml.scores", Value::F32(1.0))]),
        "tokenizer.ggml.scores"
    );
    assert_eq!(
        err_key(&[
            llama(),
            tokens(),
            ("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![1])))
        ]),
        "tokenizer.ggml.token_type"
    );
    assert_eq!(
        err_key(&[
            llama(),
            tokens(),
            ("tokenizer.ggml.token_type", Value::Array(Array::F32(vec![1.0; 3])))
        ]),
        "tokenizer.ggml.token_type"
    );
    assert_eq!(
        err_key(&[llama(), tokens(), ("tokenizer.ggml.bos_token_id", Value::U32(3))]),
        "tokenizer.ggml.bos_token_id"
    );
    assert_eq!(
        err_key(&[llama(), tokens(), ("tokenizer.ggml.eos_token_id", Value::U64(1 << 40))]),
        "tokenizer.ggml.eos_token_id"
    );
    assert_eq!(
        err_key(&[llama(), tokens(), ("tokenizer.ggml.bos_token_id", Value::from("x"))]),
        "tokenizer.ggml.bos_token_id"
    );
    assert_eq!(
        err_key(&[llama(), tokens(), ("tokenizer.ggml.add_bos_token", Value::U32(1))]),
        "tokenizer.ggml.add_bos_token"
    );
    // A vocabulary too small for the default BOS (1) when BOS is to be added.
    assert_eq!(
        err_key(&[llama(), ("tokenizer.ggml.tokens", strings(&["a"]))]),
        "tokenizer.ggml.add_bos_token"
    );
    assert_eq!(err_key(&[gpt2(), tokens()]), "tokenizer.ggml.merges");
    assert_eq!(
        err_key(&[gpt2(), tokens(), ("tokenizer.ggml.merges", strings(&["ab"]))]),
        "tokenizer.ggml.merges"
    );
    assert_eq!(
        err_key(&[gpt2(), tokens(), ("tokenizer.ggml.merges", strings(&[" a"]))]),
        "tokenizer.ggml.merges"
    );
    assert_eq!(
        err_key(&[gpt2(), tokens(), ("tokenizer.ggml.merges", Value::from("a b"))]),
        "tokenizer.ggml.merges"
    );
    assert_eq!(
        err_key(&[gpt2(), tokens(), ("tokenizer.ggml.pre", Value::U32(0))]),
        "tokenizer.ggml.pre"
    );
    assert_eq!(
        err_key(&[
            llama(),
            tokens(),
            ("tokenizer.ggml.add_space_prefix", Value::from("yes"))
        ]),
        "tokenizer.ggml.add_space_prefix"
    );

    // Tolerated as llama.cpp tolerates them: optional ids out of range, empty and duplicate texts.
    let t = build(&[
        llama(),
        ("tokenizer.ggml.tokens", strings(&["", "a", "a", "<0x41>"])),
        ("tokenizer.ggml.padding_token_id", Value::U32(99)),
        ("tokenizer.ggml.eot_token_id", Value::I32(-1)),
    ])
    .unwrap();
    assert_eq!(t.token_text(0), Some("[EMPTY_0]"));
    assert_eq!(t.token_id("a"), Some(2));
    assert!(!t.warnings().is_empty());
    // Garbage in, no panic out.
    for text in ["", "a", "\u{0}", "▁▁", "<0x41>", "日本", "a a a"] {
        let ids = t.encode(text, true, true);
        let _ = t.decode(&ids, true);
    }
    // A scores array longer than the vocabulary is tolerated with a warning.
    let t = build(&[
        llama(),
        tokens(),
        ("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.0; 5]))),
    ])
    .unwrap();
    assert!(t.warnings().iter().any(|w| w.contains("scores")));
}

#[test]
fn bpe_decode_odd_vocab_text() {
    // A NORMAL token whose text is outside GPT-2's byte alphabet decodes as llama.cpp's [UNK_BYTE_…] marker.
    let mut meta = bpe_meta("gpt-2");
    if let Value::Array(Array::String(t)) = &mut meta[2].1 {
        t.push("€".into());
    }
    if let Value::Array(Array::I32(t)) = &mut meta[3].1 {
        t.push(1);
    }
    let t = build(&meta).unwrap();
    let id = t.token_id("€").unwrap();
    assert_eq!(t.decode(&[id], false), "[UNK_BYTE_0xe282ac€]");
}
