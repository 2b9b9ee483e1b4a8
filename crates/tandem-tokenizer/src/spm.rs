//! SentencePiece-style tokenization (`tokenizer.ggml.model = "llama"`), as llama.cpp's
//! `llm_tokenizer_spm_session`: start from UTF-8 characters, repeatedly merge the adjacent pair whose
//! concatenation is the vocabulary token with the highest score, and fall back to byte tokens for
//! whatever did not become a token.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

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
    score: f32,
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
    /// The greatest pops first: the highest score, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Byte-fallback ids: `<0xXX>`, else the byte itself as a token, else the unknown token.
pub(crate) fn byte_tokens(vocab: &Vocab) -> [Option<u32>; 256] {
    let mut t = [None; 256];
    for (b, slot) in t.iter_mut().enumerate() {
        let hex = format!("<0x{b:02X}>");
        *slot = vocab
            .id(&hex)
            .or_else(|| {
                if b < 0x80 {
                    vocab.id(&(b as u8 as char).to_string())
                } else {
                    None
                }
            })
            .or(vocab.unk);
    }
    t
}

/// Tokenizes one fragment whose spaces are already escaped as "▁", appending to `out`.
pub(crate) fn tokenize(vocab: &Vocab, bytes_to_ids: &[Option<u32>; 256], text: &str, out: &mut Vec<u32>) {
    if text.is_empty() {
        return;
    }
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    let mut iter = text.char_indices().peekable();
    while let Some((o, c)) = iter.next() {
        let i = symbols.len();
        let last = iter.peek().is_none();
        symbols.push(Symbol {
            start: o,
            n: c.len_utf8(),
            prev: if i == 0 { NONE } else { i - 1 },
            next: if last { NONE } else { i + 1 },
        });
    }

    let mut queue = BinaryHeap::with_capacity(symbols.len());
    let try_add = |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: usize, right: usize| {
        if left == NONE || right == NONE {
            return;
        }
        let (l, r) = (symbols[left], symbols[right]);
        let piece = &text[l.start..l.start + l.n + r.n];
        if let Some(id) = vocab.id(piece) {
            queue.push(Bigram {
                left,
                right,
                score: vocab.scores[id as usize],
                size: piece.len(),
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&symbols, &mut queue, i - 1, i);
    }

    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
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
        try_add(&symbols, &mut queue, prev, b.left);
        try_add(&symbols, &mut queue, b.left, next);
    }

    let mut i = 0;
    while i != NONE {
        let s = symbols[i];
        let piece = &text[s.start..s.start + s.n];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| bytes_to_ids[b as usize])),
        }
        i = s.next;
    }
}
