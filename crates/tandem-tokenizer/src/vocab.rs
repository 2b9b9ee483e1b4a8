//! The vocabulary as llama.cpp's `llama_vocab::impl::load` builds it: token texts, scores and attributes,
//! the text → id map, special ids, the end-of-generation set and the special-token cache used to split
//! special tokens out of the input before model-specific tokenization.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use tandem_gguf::{Array, GgufFile, Value};

use crate::TokenizerError;

/// Token attributes (llama.cpp's `llama_token_attr` bit flags).
pub(crate) mod attr {
    pub const UNDEFINED: u16 = 0;
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

pub(crate) const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
pub(crate) const KEY_SCORES: &str = "tokenizer.ggml.scores";
pub(crate) const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
pub(crate) const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
pub(crate) const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
pub(crate) const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
pub(crate) const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
pub(crate) const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";

/// FxHash (rustc's hasher): far cheaper than SipHash for the 262k-entry maps built at load time.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Texts llama.cpp takes for an end-of-turn token when `tokenizer.ggml.eot_token_id` is absent.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Texts that end generation (llama.cpp's `special_eog_ids` detection); such tokens are forced to CONTROL.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Special ids llama.cpp reads from metadata, with the text lists it falls back to when a key is absent
/// (an empty list: no fallback). Fill-in-the-middle pad/repo/separator tokens end generation.
struct SpecialSlot {
    key: &'static str,
    texts: &'static [&'static str],
}

const SLOT_EOT: usize = 0;
const SLOT_EOM: usize = 1;
const SLOT_FIM_PAD: usize = 5;
const SLOT_FIM_REP: usize = 6;
const SLOT_FIM_SEP: usize = 7;

const SPECIAL_SLOTS: &[SpecialSlot] = &[
    SpecialSlot {
        key: "tokenizer.ggml.eot_token_id",
        texts: EOT_TEXTS,
    },
    SpecialSlot {
        key: "tokenizer.ggml.eom_token_id",
        texts: &["<|eom_id|>"],
    },
    SpecialSlot {
        key: "tokenizer.ggml.fim_pre_token_id",
        texts: &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
    },
    SpecialSlot {
        key: "tokenizer.ggml.fim_suf_token_id",
        texts: &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
    },
    SpecialSlot {
        key: "tokenizer.ggml.fim_mid_token_id",
        texts: &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
    },
    SpecialSlot {
        key: "tokenizer.ggml.fim_pad_token_id",
        texts: &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    },
    SpecialSlot {
        key: "tokenizer.ggml.fim_rep_token_id",
        texts: &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    },
    SpecialSlot {
        key: "tokenizer.ggml.fim_sep_token_id",
        texts: &["<|file_sep|>"],
    },
];

/// Deprecated spellings of the fill-in-the-middle keys, read after the current ones as llama.cpp does.
const DEPRECATED_FIM_KEYS: &[(&str, usize)] = &[
    ("tokenizer.ggml.prefix_token_id", 2),
    ("tokenizer.ggml.suffix_token_id", 3),
    ("tokenizer.ggml.middle_token_id", 4),
];

/// Defaults that depend on the tokenizer model and pre-tokenizer.
pub(crate) struct VocabDefaults {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub add_bos: bool,
    pub add_space_prefix: bool,
}

#[derive(Default)]
pub(crate) struct Vocab {
    pub texts: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u16>,
    pub token_to_id: FxMap<String, u32>,
    /// CONTROL, USER_DEFINED and UNKNOWN ids, longest text first (ties: lower id first).
    pub special_cache: Vec<u32>,
    /// Texts of the special-cache tokens, for finding which of them occur in an input at all.
    pub special_texts: FxMap<String, ()>,
    /// For each first byte, the distinct lengths of special texts starting with it.
    pub special_lens_by_first_byte: Vec<Vec<usize>>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub unk: Option<u32>,
    pub eog: BTreeSet<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
}

pub(crate) fn meta_err(key: &str, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::Metadata {
        key: key.to_string(),
        reason: reason.into(),
    }
}

pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("an array of {}", a.element_type()),
        other => format!("a {}", other.value_type()),
    }
}

/// A boolean key; `Ok(None)` when absent.
pub(crate) fn get_bool(file: &GgufFile, key: &str) -> Result<Option<bool>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(meta_err(key, format!("expected a bool, found {}", describe(other)))),
    }
}

/// A string key; `Ok(None)` when absent.
pub(crate) fn get_str<'a>(file: &'a GgufFile, key: &str) -> Result<Option<&'a str>, TokenizerError> {
    match file.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(meta_err(key, format!("expected a string, found {}", describe(other)))),
    }
}

/// A token id key. `Ok(None)` when absent or negative (converters write -1 for "no such token").
fn get_id(file: &GgufFile, key: &str, warnings: &mut Vec<String>) -> Result<Option<u64>, TokenizerError> {
    let Some(v) = file.get(key) else {
        return Ok(None);
    };
    if let Some(id) = v.as_u64() {
        return Ok(Some(id));
    }
    match v.as_f64() {
        Some(x) if x < 0.0 && !matches!(v, Value::F32(_) | Value::F64(_)) => {
            warnings.push(format!("{key} = {x}: negative, treated as absent"));
            Ok(None)
        }
        _ => Err(meta_err(key, format!("expected a token id, found {}", describe(v)))),
    }
}

fn integer_array(a: &Array) -> Option<Vec<i64>> {
    Some(match a {
        Array::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
        Array::U32(v) => v.iter().map(|&x| i64::from(x)).collect(),
        Array::I16(v) => v.iter().map(|&x| i64::from(x)).collect(),
        Array::U16(v) => v.iter().map(|&x| i64::from(x)).collect(),
        Array::I8(v) => v.iter().map(|&x| i64::from(x)).collect(),
        Array::U8(v) => v.iter().map(|&x| i64::from(x)).collect(),
        _ => return None,
    })
}

fn attr_from_type(t: i64) -> u16 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => attr::UNDEFINED,
    }
}

impl Vocab {
    pub fn n_tokens(&self) -> usize {
        self.texts.len()
    }

    pub fn id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    pub fn attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(attr::UNDEFINED)
    }

    /// Reads the vocabulary keys of a GGUF file. `defaults` carries what llama.cpp assumes for the
    /// tokenizer model when a key is absent.
    pub fn load(file: &GgufFile, defaults: VocabDefaults, warnings: &mut Vec<String>) -> Result<Vocab, TokenizerError> {
        let tokens = match file.get(KEY_TOKENS) {
            None => return Err(meta_err(KEY_TOKENS, "missing: the file carries no vocabulary")),
            Some(Value::Array(Array::String(v))) => v,
            Some(other) => {
                return Err(meta_err(
                    KEY_TOKENS,
                    format!("expected an array of strings, found {}", describe(other)),
                ))
            }
        };
        let n = tokens.len();
        if n == 0 {
            return Err(meta_err(KEY_TOKENS, "the vocabulary is empty"));
        }
        if n > i32::MAX as usize {
            return Err(meta_err(
                KEY_TOKENS,
                format!("{n} tokens is more than token ids can address"),
            ));
        }

        let scores: Vec<f32> = match file.get(KEY_SCORES) {
            None => vec![0.0; n],
            Some(Value::Array(a)) => {
                let scores: Vec<f32> = match a {
                    Array::F32(v) => v.clone(),
                    Array::I32(v) => v.iter().map(|&x| x as f32).collect(),
                    other => {
                        return Err(meta_err(
                            KEY_SCORES,
                            format!(
                                "expected an array of f32 or i32, found an array of {}",
                                other.element_type()
                            ),
                        ))
                    }
                };
                if scores.len() < n {
                    return Err(meta_err(
                        KEY_SCORES,
                        format!("{} scores for {n} tokens in {KEY_TOKENS}", scores.len()),
                    ));
                }
                if scores.len() > n {
                    warnings.push(format!(
                        "{KEY_SCORES}: {} scores for {n} tokens; extra ignored",
                        scores.len()
                    ));
                }
                scores[..n].to_vec()
            }
            Some(other) => {
                return Err(meta_err(
                    KEY_SCORES,
                    format!("expected an array, found {}", describe(other)),
                ))
            }
        };

        let mut attrs: Vec<u16> = match file.get(KEY_TOKEN_TYPE) {
            None => vec![attr::NORMAL; n],
            Some(Value::Array(a)) => {
                let types = integer_array(a).ok_or_else(|| {
                    meta_err(
                        KEY_TOKEN_TYPE,
                        format!("expected an array of integers, found an array of {}", a.element_type()),
                    )
                })?;
                if types.len() < n {
                    return Err(meta_err(
                        KEY_TOKEN_TYPE,
                        format!("{} token types for {n} tokens in {KEY_TOKENS}", types.len()),
                    ));
                }
                types[..n].iter().map(|&t| attr_from_type(t)).collect()
            }
            Some(other) => {
                return Err(meta_err(
                    KEY_TOKEN_TYPE,
                    format!("expected an array, found {}", describe(other)),
                ))
            }
        };

        let mut texts = Vec::with_capacity(n);
        let mut token_to_id: FxMap<String, u32> = FxMap::with_capacity_and_hasher(n, Default::default());
        let mut duplicates = 0usize;
        for (i, t) in tokens.iter().enumerate() {
            let text = if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            };
            if token_to_id.insert(text.clone(), i as u32).is_some() {
                duplicates += 1;
            }
            texts.push(text);
        }
        if duplicates > 0 {
            warnings.push(format!("{KEY_TOKENS}: {duplicates} duplicate texts; the later id wins"));
        }

        let mut v = Vocab {
            texts,
            scores,
            attrs: Vec::new(),
            token_to_id,
            add_bos: defaults.add_bos,
            add_eos: false,
            add_space_prefix: defaults.add_space_prefix,
            ..Default::default()
        };

        if let Some(b) = get_bool(file, KEY_ADD_SPACE_PREFIX)? {
            v.add_space_prefix = b;
        }

        // Special ids: defaults outside the vocabulary are dropped; keys outside it are refused for BOS/EOS
        // (the ids callers rely on) and ignored with a warning for the rest, as llama.cpp does.
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        v.bos = in_range(defaults.bos);
        v.eos = in_range(defaults.eos);
        v.unk = in_range(defaults.unk);
        for (key, slot) in [(KEY_BOS, &mut v.bos), (KEY_EOS, &mut v.eos)] {
            if let Some(id) = get_id(file, key, warnings)? {
                if id >= n as u64 {
                    return Err(meta_err(
                        key,
                        format!("token id {id} is outside the vocabulary of {n} tokens"),
                    ));
                }
                *slot = Some(id as u32);
            }
        }
        let read_soft = |key: &str, warnings: &mut Vec<String>| -> Result<Option<u32>, TokenizerError> {
            match get_id(file, key, warnings)? {
                Some(id) if id < n as u64 => Ok(Some(id as u32)),
                Some(id) => {
                    warnings.push(format!("{key} = {id} is outside the vocabulary of {n} tokens; ignored"));
                    Ok(None)
                }
                None => Ok(None),
            }
        };
        if let Some(id) = read_soft("tokenizer.ggml.unknown_token_id", warnings)? {
            v.unk = Some(id);
        }
        let mut slots: Vec<Option<u32>> = vec![None; SPECIAL_SLOTS.len()];
        for (i, slot) in SPECIAL_SLOTS.iter().enumerate() {
            slots[i] = read_soft(slot.key, warnings)?;
        }
        for &(key, i) in DEPRECATED_FIM_KEYS {
            if let Some(id) = read_soft(key, warnings)? {
                slots[i] = Some(id);
            }
        }

        if let Some(b) = get_bool(file, KEY_ADD_BOS)? {
            v.add_bos = b;
        }
        if let Some(b) = get_bool(file, KEY_ADD_EOS)? {
            v.add_eos = b;
        }
        if v.add_bos && v.bos.is_none() {
            return Err(meta_err(
                KEY_ADD_BOS,
                format!("BOS is to be added but {KEY_BOS} is not set"),
            ));
        }
        if v.add_eos && v.eos.is_none() {
            return Err(meta_err(
                KEY_ADD_EOS,
                format!("EOS is to be added but {KEY_EOS} is not set"),
            ));
        }

        // Auto-detect EOT / EOM / FIM tokens by text (the lowest id when several texts match; llama.cpp takes
        // whichever its hash map yields first); a detected token that is not CONTROL becomes CONTROL.
        for (s, slot) in SPECIAL_SLOTS.iter().enumerate() {
            if slots[s].is_some() {
                continue;
            }
            if let Some(id) = slot.texts.iter().filter_map(|t| v.id(t)).min() {
                slots[s] = Some(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        v.eot = slots[SLOT_EOT];

        // Control tokens whose text says "unused" are marked UNUSED.
        for (i, (a, text)) in attrs.iter_mut().zip(&v.texts).enumerate() {
            if *a & attr::CONTROL != 0 && text.contains("unused") && v.id(text) == Some(i as u32) {
                *a |= attr::UNUSED;
            }
        }

        // The end-of-generation set.
        let mut eog = BTreeSet::new();
        for s in [SLOT_FIM_PAD, SLOT_FIM_REP, SLOT_FIM_SEP] {
            if let Some(id) = slots[s] {
                eog.insert(id);
            }
        }
        for id in EOG_TEXTS.iter().filter_map(|t| v.id(t)) {
            eog.insert(id);
            attrs[id as usize] |= attr::CONTROL;
        }
        // gpt-oss: these always render.
        for id in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"]
            .iter()
            .filter_map(|t| v.id(t))
        {
            attrs[id as usize] = attr::USER_DEFINED;
        }
        for id in [v.eos, slots[SLOT_EOT], slots[SLOT_EOM]].into_iter().flatten() {
            eog.insert(id);
        }
        // o200k_harmony / solar-open: "<|end|>" is not an end of generation there.
        let has = |eog: &BTreeSet<u32>, t: &str| v.id(t).filter(|id| eog.contains(id));
        if let Some(end) = has(&eog, "<|end|>") {
            let ret = has(&eog, "<|return|>").is_some();
            let call = has(&eog, "<|call|>").is_some() || has(&eog, "<|calls|>").is_some();
            let flush = has(&eog, "<|flush|>").is_some();
            if call && (ret || flush) {
                eog.remove(&end);
                attrs[end as usize] = attr::USER_DEFINED;
            }
        }
        // gemma4 / paddleocr: "</s>" is not an end of generation when "<|tool_response>" exists.
        if has(&eog, "<|tool_response>").is_some() {
            if let Some(s) = has(&eog, "</s>") {
                eog.remove(&s);
                attrs[s as usize] = attr::NORMAL;
            }
        }
        v.eog = eog;

        // Per-model strip attributes (llama.cpp sets these by model name).
        let name = get_str(file, "general.name")
            .ok()
            .flatten()
            .unwrap_or("")
            .to_lowercase();
        let pre = get_str(file, "tokenizer.ggml.pre").ok().flatten().unwrap_or("");
        let arch = get_str(file, "general.architecture").ok().flatten().unwrap_or("");
        let set_attr = |attrs: &mut Vec<u16>, v: &Vocab, text: &str, a: u16, on: bool| {
            if let Some(id) = v.id(text) {
                let x = &mut attrs[id as usize];
                *x = if on { *x | a } else { *x & !a };
            }
        };
        let is_special = |a: u16| a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0;
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|p| pre.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"].iter().any(|a| arch.contains(a))
        {
            set_attr(&mut attrs, &v, "<mask>", attr::LSTRIP, true);
        } else if name.contains("phi-3") || name.contains("phi3") {
            for a in attrs.iter_mut().filter(|a| is_special(**a)) {
                *a |= attr::RSTRIP;
            }
            set_attr(&mut attrs, &v, "</s>", attr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set_attr(&mut attrs, &v, t, attr::RSTRIP, false);
            }
        }

        // The special-token cache, longest first (stable: equal lengths keep id order).
        let mut cache: Vec<u32> = (0..n as u32).filter(|&i| is_special(attrs[i as usize])).collect();
        cache.sort_by_key(|&i| std::cmp::Reverse(v.texts[i as usize].len()));
        let mut lens = vec![Vec::new(); 256];
        let mut special_texts = FxMap::default();
        for &id in &cache {
            let t = &v.texts[id as usize];
            let l: &mut Vec<usize> = &mut lens[t.as_bytes()[0] as usize];
            if !l.contains(&t.len()) {
                l.push(t.len());
            }
            special_texts.insert(t.clone(), ());
        }
        v.special_cache = cache;
        v.special_texts = special_texts;
        v.special_lens_by_first_byte = lens;
        v.attrs = attrs;
        Ok(v)
    }
}
