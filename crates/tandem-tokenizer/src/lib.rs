//! Tokenizers built from GGUF metadata that reproduce llama.cpp's token ids exactly (SentencePiece-style
//! `llama` vocabularies and byte-level BPE `gpt2` ones), a streaming detokenizer and chat templates.
//!
//! Encoding follows llama.cpp's `llama_vocab::impl::tokenize`: special tokens are split out of the text
//! first (`special.rs`), then each remaining fragment goes through the model's algorithm (`spm.rs`, or
//! `pretokenize.rs` plus `bpe.rs`). Decoding concatenates token pieces as llama.cpp's `token_to_piece`
//! gives them (no leading-space stripping, no BPE space clean-up).

mod bpe;
pub mod chat;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod vocab;

use std::sync::Arc;

use tandem_gguf::GgufFile;

pub use chat::{BuiltinTemplate, ChatMessage, ChatTemplate};
pub use stream::StreamDecoder;

use special::Fragment;
use vocab::{attr, get_str, meta_err, Vocab, VocabDefaults};

pub const KEY_MODEL: &str = "tokenizer.ggml.model";
pub const KEY_PRE: &str = "tokenizer.ggml.pre";

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// Metadata that is missing, of the wrong type or inconsistent; `key` names the GGUF key.
    #[error("GGUF metadata {key:?}: {reason}")]
    Metadata { key: String, reason: String },
    #[error("the model has no vocabulary ({KEY_MODEL} = {model:?}): it cannot encode text")]
    NoVocab { model: String },
    #[error("chat template: {0}")]
    Template(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// SentencePiece-style (`tokenizer.ggml.model = "llama"`).
    Spm,
    /// Byte-level BPE (`"gpt2"`), with its `tokenizer.ggml.pre` name.
    Bpe { pre: String },
    /// No vocabulary (`"none"` / `"no_vocab"`): ids decode as `<id>`, text cannot be encoded.
    None,
}

enum Engine {
    Spm { bytes: Box<[Option<u32>; 256]> },
    Bpe(bpe::Bpe),
    None { n_vocab: usize },
}

struct Inner {
    kind: TokenizerKind,
    model: String,
    vocab: Vocab,
    engine: Engine,
    warnings: Vec<String>,
}

/// A tokenizer; cheap to clone (shared), `Send` and `Sync`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.inner.kind)
            .field("n_vocab", &self.n_vocab())
            .field("bos", &self.bos())
            .field("eos", &self.eos())
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes. Errors name the offending metadata key.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        let model = get_str(file, KEY_MODEL)?.ok_or_else(|| meta_err(KEY_MODEL, "missing"))?;
        let mut warnings = Vec::new();
        let (kind, vocab, engine) = match model {
            "none" | "no_vocab" => {
                let arch = get_str(file, "general.architecture")?.unwrap_or("");
                let key = format!("{arch}.vocab_size");
                let n_vocab = match file.get(&key) {
                    None => 0,
                    Some(v) => v
                        .as_u64()
                        .ok_or_else(|| meta_err(&key, "expected a non-negative integer"))?
                        as usize,
                };
                (TokenizerKind::None, Vocab::default(), Engine::None { n_vocab })
            }
            "llama" => {
                let defaults = VocabDefaults {
                    bos: Some(1),
                    eos: Some(2),
                    unk: Some(0),
                    add_bos: true,
                    add_space_prefix: true,
                };
                let vocab = Vocab::load(file, defaults, &mut warnings)?;
                let bytes = Box::new(spm::byte_tokens(&vocab));
                (TokenizerKind::Spm, vocab, Engine::Spm { bytes })
            }
            "gpt2" => {
                let pre_name = get_str(file, KEY_PRE)?;
                let pre = pretokenize::resolve(pre_name);
                warnings.extend(pre.warning.clone());
                let defaults = VocabDefaults {
                    bos: if pre.no_default_bos { None } else { Some(11) },
                    eos: Some(11),
                    unk: None,
                    add_bos: pre.add_bos,
                    add_space_prefix: false,
                };
                let bpe = bpe::Bpe::load(file, pre)?;
                let vocab = Vocab::load(file, defaults, &mut warnings)?;
                let kind = TokenizerKind::Bpe {
                    pre: pre_name.unwrap_or("default").to_string(),
                };
                (kind, vocab, Engine::Bpe(bpe))
            }
            other => {
                return Err(meta_err(
                    KEY_MODEL,
                    format!("tokenizer model {other:?} is not supported (llama, gpt2 and none are)"),
                ))
            }
        };
        Ok(Tokenizer {
            inner: Arc::new(Inner {
                kind,
                model: model.to_string(),
                vocab,
                engine,
                warnings,
            }),
        })
    }

    /// Encodes text. `add_bos`: add the model's BOS (and EOS) as its `add_bos_token` (`add_eos_token`) says;
    /// `parse_special`: turn the text of CONTROL tokens into those tokens (USER_DEFINED tokens are always
    /// matched). A model without vocabulary yields nothing; see [`try_encode`](Self::try_encode).
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        self.try_encode(text, add_bos, parse_special).unwrap_or_default()
    }

    /// As [`encode`](Self::encode), but a model without vocabulary is an error.
    pub fn try_encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let v = &self.inner.vocab;
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        let frags = match &self.inner.engine {
            Engine::None { .. } => {
                return Err(TokenizerError::NoVocab {
                    model: self.inner.model.clone(),
                })
            }
            _ => special::partition(v, text, parse_special),
        };
        let add_special = add_bos;
        if add_special && v.add_bos {
            out.extend(v.bos);
        }
        match &self.inner.engine {
            Engine::Spm { bytes } => {
                let mut prev_special = true;
                let mut buf = String::new();
                for f in &frags {
                    match f {
                        Fragment::Raw(r) => {
                            buf.clear();
                            if v.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(&text[r.clone()]);
                            let escaped = buf.replace(' ', "\u{2581}");
                            spm::tokenize(v, bytes, &escaped, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(*id);
                            prev_special = true;
                        }
                    }
                }
            }
            Engine::Bpe(b) => {
                for f in &frags {
                    match f {
                        Fragment::Raw(r) => b.tokenize(v, &text[r.clone()], &mut out),
                        Fragment::Token(id) => out.push(*id),
                    }
                }
            }
            Engine::None { .. } => {}
        }
        if add_special && v.add_eos {
            out.extend(v.eos);
        }
        Ok(out)
    }

    /// Concatenates the pieces of `ids` (see [`token_to_piece`](Self::token_to_piece)); bytes that are not
    /// valid UTF-8 (such as a character cut off at the end) become U+FFFD.
    pub fn decode(&self, ids: &[u32], render_special: bool) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            self.append_piece(id, render_special, &mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes a token stands for (llama.cpp's `token_to_piece` without lstrip). CONTROL and UNKNOWN
    /// tokens are empty unless `render_special`; unknown ids are empty.
    pub fn token_to_piece(&self, id: u32, render_special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        self.append_piece(id, render_special, &mut out);
        out
    }

    fn append_piece(&self, id: u32, render_special: bool, out: &mut Vec<u8>) {
        let v = &self.inner.vocab;
        if let Engine::None { .. } = self.inner.engine {
            out.extend_from_slice(format!("<{id}>").as_bytes());
            return;
        }
        let Some(text) = v.texts.get(id as usize) else {
            return;
        };
        let a = v.attr(id);
        if !render_special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return;
        }
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            match self.inner.engine {
                Engine::Bpe(_) => bpe::decode_text(text, out),
                _ => out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes()),
            }
        } else if a & attr::BYTE != 0 {
            if let Some(b) = text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
            }
        }
    }

    /// A decoder for streamed ids that releases text only in whole characters.
    pub fn stream_decoder(&self, render_special: bool) -> StreamDecoder {
        StreamDecoder::new(self, render_special)
    }

    pub fn n_vocab(&self) -> usize {
        match self.inner.engine {
            Engine::None { n_vocab } => n_vocab,
            _ => self.inner.vocab.n_tokens(),
        }
    }

    pub fn bos(&self) -> Option<u32> {
        self.inner.vocab.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.inner.vocab.eos
    }

    /// The end-of-turn token (`tokenizer.ggml.eot_token_id`, else found by text like llama.cpp does).
    pub fn eot(&self) -> Option<u32> {
        self.inner.vocab.eot
    }

    /// Whether a token ends generation: EOS, EOT, EOM, fill-in-the-middle pad/repo/separator tokens and the
    /// texts llama.cpp knows (`<end_of_turn>`, `<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.inner.vocab.eog.contains(&id)
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        self.inner.vocab.eog.iter().copied().collect()
    }

    /// Whether a token is CONTROL (after llama.cpp's adjustments, e.g. end-of-turn tokens are forced CONTROL).
    pub fn is_control(&self, id: u32) -> bool {
        self.inner.vocab.attr(id) & attr::CONTROL != 0
    }

    /// The token's vocabulary text (with "▁" or GPT-2 byte characters as stored).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.inner.vocab.texts.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary text, if any (for duplicates, the last id).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.vocab.id(text)
    }

    /// Whether `encode(.., add_bos = true, ..)` prepends BOS.
    pub fn adds_bos(&self) -> bool {
        self.inner.vocab.add_bos && self.inner.vocab.bos.is_some()
    }

    pub fn adds_eos(&self) -> bool {
        self.inner.vocab.add_eos && self.inner.vocab.eos.is_some()
    }

    pub fn kind(&self) -> TokenizerKind {
        self.inner.kind.clone()
    }

    /// Things the metadata did that may make ids differ from llama.cpp's or that it only tolerates
    /// (an unsupported pre-tokenizer name, duplicate token texts, out-of-range optional ids, ...).
    pub fn warnings(&self) -> &[String] {
        &self.inner.warnings
    }
}
