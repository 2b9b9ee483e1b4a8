//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`), as llama.cpp's `llm_tokenizer_bpe_session`: each
//! pre-tokenized word is mapped byte by byte through GPT-2's byte → character table, then adjacent
//! symbols are merged by the rank of their pair in `tokenizer.ggml.merges`, lowest rank first.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::OnceLock;

use tandem_gguf::{Array, GgufFile, Value};

use crate::pretokenize::{self, PreConfig};
use crate::vocab::{describe, meta_err, FxMap, Vocab};
use crate::TokenizerError;

pub(crate) const KEY_MERGES: &str = "tokenizer.ggml.merges";

/// GPT-2's byte ↔ character tables: printable bytes stand for themselves, the rest map to U+0100 onwards.
struct ByteMap {
    to_char: [char; 256],
    /// Indexed by code point (all below U+0144).
    to_byte: [Option<u8>; 512],
}

fn byte_map() -> &'static ByteMap {
    static MAP: OnceLock<ByteMap> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut to_char = ['\0'; 256];
        let mut to_byte = [None; 512];
        let mut n = 0u32;
        for b in 0..256u32 {
            let printable = (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
            let cp = if printable {
                b
            } else {
                n += 1;
                255 + n
            };
            let c = char::from_u32(cp).unwrap_or('\0');
            to_char[b as usize] = c;
            to_byte[cp as usize] = Some(b as u8);
        }
        ByteMap { to_char, to_byte }
    })
}

/// Maps raw bytes to GPT-2's printable characters.
pub(crate) fn byte_encode(word: &str, out: &mut String) {
    let m = byte_map();
    out.clear();
    out.extend(word.bytes().map(|b| m.to_char[b as usize]));
}

/// The inverse of [`byte_encode`] for a token's text (llama.cpp's `llama_decode_text`): a character outside
/// the table becomes `[UNK_BYTE_0x..]`, as there.
pub(crate) fn decode_text(text: &str, out: &mut Vec<u8>) {
    let m = byte_map();
    for c in text.chars() {
        match m.to_byte.get(c as usize).copied().flatten() {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

pub(crate) struct Bpe {
    /// Merge rank by "left right" (pieces never contain a space once byte-encoded).
    ranks: FxMap<String, u32>,
    pub pre: PreConfig,
}

impl Bpe {
    pub fn load(file: &GgufFile, pre: PreConfig) -> Result<Self, TokenizerError> {
        let merges = match file.get(KEY_MERGES) {
            None => return Err(meta_err(KEY_MERGES, "missing: a BPE tokenizer needs its merges")),
            Some(Value::Array(Array::String(v))) => v,
            Some(other) => {
                return Err(meta_err(
                    KEY_MERGES,
                    format!("expected an array of strings, found {}", describe(other)),
                ))
            }
        };
        let mut ranks: FxMap<String, u32> = FxMap::with_capacity_and_hasher(merges.len(), Default::default());
        for (i, m) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let sep = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
            let Some(sep) = sep else {
                return Err(meta_err(
                    KEY_MERGES,
                    format!("merge #{i} {m:?} is not two pieces separated by a space"),
                ));
            };
            let rank = u32::try_from(i).map_err(|_| meta_err(KEY_MERGES, "too many merges"))?;
            let key = format!("{} {}", &m[..sep], &m[sep + 1..]);
            ranks.entry(key).or_insert(rank);
        }
        Ok(Bpe { ranks, pre })
    }

    /// Tokenizes one raw fragment (special tokens already split out), appending to `out`.
    pub fn tokenize(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut word = String::new();
        let mut key = String::new();
        for w in pretokenize::split(self.pre.kind, text) {
            byte_encode(w, &mut word);
            self.tokenize_word(vocab, &word, &mut key, out);
        }
    }

    fn rank(&self, key: &mut String, left: &str, right: &str) -> Option<u32> {
        key.clear();
        key.push_str(left);
        key.push(' ');
        key.push_str(right);
        self.ranks.get(key.as_str()).copied()
    }

    fn tokenize_word(&self, vocab: &Vocab, word: &str, key: &mut String, out: &mut Vec<u32>) {
        if self.pre.ignore_merges {
            if let Some(id) = vocab.id(word) {
                out.push(id);
                return;
            }
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        let mut iter = word.char_indices().peekable();
        while let Some((o, c)) = iter.next() {
            let i = symbols.len();
            symbols.push(Symbol {
                start: o,
                n: c.len_utf8(),
                prev: if i == 0 { NONE } else { i - 1 },
                next: if iter.peek().is_none() { NONE } else { i + 1 },
            });
        }

        let mut queue = BinaryHeap::new();
        let mut add = |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: usize, right: usize| {
            if left == NONE || right == NONE {
                return;
            }
            let (l, r) = (symbols[left], symbols[right]);
            let lt = &word[l.start..l.start + l.n];
            let rt = &word[r.start..r.start + r.n];
            if let Some(rank) = self.rank(key, lt, rt) {
                queue.push(Bigram {
                    left,
                    right,
                    rank,
                    size: l.n + r.n,
                });
            }
        };
        for i in 1..symbols.len() {
            add(&symbols, &mut queue, i - 1, i);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // Symbols stay contiguous and only grow, so an unchanged concatenation is an unchanged size.
            if l.n == 0 || r.n == 0 || l.n + r.n != b.size {
                continue;
            }
            symbols[b.left].n += r.n;
            symbols[b.right].n = 0;
            symbols[b.left].next = r.next;
            if r.next != NONE {
                symbols[r.next].prev = b.left;
            }
            let (prev, next) = (symbols[b.left].prev, symbols[b.left].next);
            add(&symbols, &mut queue, prev, b.left);
            add(&symbols, &mut queue, b.left, next);
        }

        let mut i = if symbols.is_empty() { NONE } else { 0 };
        while i != NONE {
            let s = symbols[i];
            let piece = &word[s.start..s.start + s.n];
            match vocab.id(piece) {
                Some(id) => out.push(id),
                None => {
                    // Byte by byte: only single-byte (ASCII) pieces can be tokens.
                    let mut buf = [0u8; 4];
                    for b in piece.bytes().filter(u8::is_ascii) {
                        if let Some(id) = vocab.id((b as char).encode_utf8(&mut buf)) {
                            out.push(id);
                        }
                    }
                }
            }
            i = s.next;
        }
    }
}

const NONE: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    n: usize,
    prev: usize,
    next: usize,
}

struct Bigram {
    left: usize,
    right: usize,
    rank: u32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bigram {
    /// The greatest pops first: the lowest rank, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        other.rank.cmp(&self.rank).then_with(|| other.left.cmp(&self.left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        let text = String::from_utf8_lossy(&all).into_owned();
        let mut enc = String::new();
        byte_encode(&text, &mut enc);
        assert!(!enc.contains(' '), "space must be remapped");
        let mut dec = Vec::new();
        decode_text(&enc, &mut dec);
        assert_eq!(dec, text.as_bytes());
        let mut s = String::new();
        byte_encode(" ", &mut s);
        assert_eq!(s, "Ġ");
        byte_encode("\n", &mut s);
        assert_eq!(s, "Ċ");
    }
}
