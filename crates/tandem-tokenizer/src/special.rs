//! Splitting special tokens out of the input before model-specific tokenization (llama.cpp's
//! `tokenizer_st_partition`). Special tokens are tried longest first; each one splits every remaining raw
//! fragment at its occurrences, left to right. CONTROL and UNKNOWN tokens take part only when special
//! tokens are parsed; USER_DEFINED ones always do.

use std::ops::Range;

use crate::vocab::{attr, FxMap, Vocab};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// A byte range of the input still to be tokenized.
    Raw(Range<usize>),
    Token(u32),
}

/// C's `isspace` in the "C" locale.
fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// The special-cache texts that occur anywhere in `text`: a token absent from the whole input cannot split
/// any fragment of it, so checking this first skips most of a large special vocabulary cheaply.
fn present_texts<'t>(vocab: &Vocab, text: &'t str) -> FxMap<&'t str, ()> {
    let bytes = text.as_bytes();
    let mut found = FxMap::default();
    for (p, &b) in bytes.iter().enumerate() {
        let lens = &vocab.special_lens_by_first_byte[b as usize];
        if lens.is_empty() || !text.is_char_boundary(p) {
            continue;
        }
        for &l in lens {
            if let Some(s) = text.get(p..p + l) {
                if vocab.special_texts.contains_key(s) {
                    found.insert(s, ());
                }
            }
        }
    }
    found
}

pub(crate) fn partition(vocab: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut frags = vec![Fragment::Raw(0..text.len())];
    let present = present_texts(vocab, text);
    if present.is_empty() {
        return frags;
    }
    let bytes = text.as_bytes();
    for &id in &vocab.special_cache {
        let a = vocab.attrs[id as usize];
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let needle = vocab.texts[id as usize].as_str();
        if !present.contains_key(needle) {
            continue;
        }
        let mut out = Vec::with_capacity(frags.len() + 2);
        for f in frags {
            let Fragment::Raw(r) = f else {
                out.push(f);
                continue;
            };
            let (mut start, end) = (r.start, r.end);
            loop {
                let Some(m) = text[start..end].find(needle) else {
                    if start < end {
                        out.push(Fragment::Raw(start..end));
                    }
                    break;
                };
                let m = start + m;
                let mut left_end = m;
                if a & attr::LSTRIP != 0 {
                    while left_end > start && c_isspace(bytes[left_end - 1]) {
                        left_end -= 1;
                    }
                }
                if left_end > start {
                    out.push(Fragment::Raw(start..left_end));
                }
                out.push(Fragment::Token(id));
                start = m + needle.len();
                if a & attr::RSTRIP != 0 {
                    while start < end && c_isspace(bytes[start]) {
                        start += 1;
                    }
                }
                if start >= end {
                    break;
                }
            }
        }
        frags = out;
    }
    frags
}
