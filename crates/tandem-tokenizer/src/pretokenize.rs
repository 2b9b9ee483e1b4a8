//! Pre-tokenizers of byte-level BPE models: llama.cpp's `unicode_regex_split`, which applies a list of
//! regexes one after another, each refining the pieces the previous left (a regex's matches and the gaps
//! between them both become pieces). The two big regexes (GPT-2's and Llama 3's) are llama.cpp's
//! hand-written splitters; the small ones are simple scans with the same results as its `std::regex`
//! fallback on "collapsed" text.

use unicode_general_category::{get_general_category, GeneralCategory as G};

/// Which sequence of splits a `tokenizer.ggml.pre` name selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreKind {
    /// llama.cpp's fallback: `[\p{P}$+<=>^~|]+`, the GPT-2 regex, `\p{N}+`, `[0-9][0-9][0-9]`.
    Default,
    /// The GPT-2 regex alone.
    Gpt2,
    /// The Llama 3 regex, with numbers in groups of at most `max_digits` (3 for Llama 3, 1 for Qwen 2).
    Llama3 { max_digits: usize },
    /// Every `\p{N}` its own piece, then the GPT-2 regex (StarCoder, SmolLM, Refact, Command-R, ...).
    Digits,
    /// `[\p{P}$+<=>^~|`]+`, the GPT-2 regex, `[0-9][0-9][0-9]`.
    Falcon,
}

/// What a pre-tokenizer name implies besides the splits.
#[derive(Clone, Debug)]
pub(crate) struct PreConfig {
    pub kind: PreKind,
    /// A word that already is a token is emitted whole, without merging.
    pub ignore_merges: bool,
    /// llama.cpp's default for `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
    /// llama.cpp sets no default BOS for these.
    pub no_default_bos: bool,
    /// Set when the name is missing or not one this crate reproduces.
    pub warning: Option<String>,
}

/// Maps a `tokenizer.ggml.pre` value to its splits, as llama.cpp's `llama_vocab::impl::load` does.
pub(crate) fn resolve(pre: Option<&str>) -> PreConfig {
    let cfg = |kind| PreConfig {
        kind,
        ignore_merges: false,
        add_bos: false,
        no_default_bos: false,
        warning: None,
    };
    let name = match pre {
        None | Some("") => {
            let mut c = cfg(PreKind::Default);
            c.warning = Some("tokenizer.ggml.pre is missing: using the default pre-tokenizer".into());
            return c;
        }
        Some(p) => p,
    };
    match name {
        "default" => cfg(PreKind::Default),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" => PreConfig {
            ignore_merges: true,
            add_bos: true,
            ..cfg(PreKind::Llama3 { max_digits: 3 })
        },
        "dbrx" | "smaug-bpe" => cfg(PreKind::Llama3 { max_digits: 3 }),
        "glm4" | "chatglm-bpe" => PreConfig {
            no_default_bos: true,
            ..cfg(PreKind::Llama3 { max_digits: 3 })
        },
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "hunyuan" | "megrez" | "solar-open" => {
            cfg(PreKind::Llama3 { max_digits: 1 })
        }
        "falcon" => cfg(PreKind::Falcon),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            cfg(PreKind::Digits)
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "modern-bert" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" | "exaone4" | "jina-v1-en"
        | "jina-v2-code" | "roberta-bpe" => cfg(PreKind::Gpt2),
        other => {
            let mut c = cfg(PreKind::Default);
            c.warning = Some(format!(
                "tokenizer.ggml.pre = {other:?} is not supported: using the default pre-tokenizer, \
                 token ids may differ from llama.cpp's"
            ));
            c
        }
    }
}

/// Splits `text` into words the way the named pre-tokenizer does.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn pre_tokenize<'a>(pre: &str, text: &'a str) -> Vec<&'a str> {
    split(resolve(Some(pre)).kind, text)
}

#[derive(Clone, Copy, Default)]
struct Flags {
    letter: bool,
    number: bool,
    whitespace: bool,
    /// In range: llama.cpp's `flags.as_uint() != 0`, false only past the end of the piece.
    any: bool,
}

fn is_whitespace(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | ' '
            | '\u{85}'
            | '\u{A0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200A}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202F}'
            | '\u{205F}'
            | '\u{3000}'
    )
}

fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    matches!(
        get_general_category(c),
        G::UppercaseLetter | G::LowercaseLetter | G::TitlecaseLetter | G::ModifierLetter | G::OtherLetter
    )
}

fn is_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    matches!(
        get_general_category(c),
        G::DecimalNumber | G::LetterNumber | G::OtherNumber
    )
}

fn is_punctuation(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_punctuation() && !"$+<=>^`|~".contains(c);
    }
    matches!(
        get_general_category(c),
        G::ConnectorPunctuation
            | G::DashPunctuation
            | G::OpenPunctuation
            | G::ClosePunctuation
            | G::InitialPunctuation
            | G::FinalPunctuation
            | G::OtherPunctuation
    )
}

fn flags_of(c: char) -> Flags {
    Flags {
        letter: is_letter(c),
        number: is_number(c),
        whitespace: is_whitespace(c),
        any: true,
    }
}

/// The text as code points with their byte offsets, and the pieces as code point ranges.
struct Cpts {
    chars: Vec<char>,
    flags: Vec<Flags>,
    /// Byte offset of each code point, plus the text's length at the end.
    offs: Vec<usize>,
}

type Pieces = Vec<(usize, usize)>;

pub(crate) fn split(kind: PreKind, text: &str) -> Vec<&str> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut chars = Vec::with_capacity(text.len());
    let mut offs = Vec::with_capacity(text.len() + 1);
    for (o, c) in text.char_indices() {
        chars.push(c);
        offs.push(o);
    }
    offs.push(text.len());
    let flags = chars.iter().map(|&c| flags_of(c)).collect();
    let cp = Cpts { chars, flags, offs };
    let mut pieces: Pieces = vec![(0, cp.chars.len())];
    let punct = |c: char| is_punctuation(c) || "$+<=>^~|".contains(c);
    let punct_falcon = |c: char| punct(c) || c == '`';
    match kind {
        PreKind::Default => {
            pieces = runs(&cp, &pieces, punct);
            pieces = gpt2(&cp, &pieces);
            pieces = runs(&cp, &pieces, is_number);
            pieces = digit_triples(&cp, &pieces);
        }
        PreKind::Gpt2 => pieces = gpt2(&cp, &pieces),
        PreKind::Llama3 { max_digits } => pieces = llama3(&cp, &pieces, max_digits),
        PreKind::Digits => {
            pieces = isolate(&cp, &pieces, is_number);
            pieces = gpt2(&cp, &pieces);
        }
        PreKind::Falcon => {
            pieces = runs(&cp, &pieces, punct_falcon);
            pieces = gpt2(&cp, &pieces);
            pieces = digit_triples(&cp, &pieces);
        }
    }
    pieces
        .into_iter()
        .filter(|&(a, b)| a < b)
        .map(|(a, b)| &text[cp.offs[a]..cp.offs[b]])
        .collect()
}

/// `[class]+`: maximal runs of matching code points and the gaps between them.
fn runs(cp: &Cpts, pieces: &Pieces, class: impl Fn(char) -> bool) -> Pieces {
    let mut out = Vec::with_capacity(pieces.len());
    for &(a, b) in pieces {
        let mut start = a;
        for i in a + 1..b {
            if class(cp.chars[i]) != class(cp.chars[i - 1]) {
                out.push((start, i));
                start = i;
            }
        }
        if start < b {
            out.push((start, b));
        }
    }
    out
}

/// `[class]` (no `+`): each matching code point alone; the runs between stay together.
fn isolate(cp: &Cpts, pieces: &Pieces, class: impl Fn(char) -> bool) -> Pieces {
    let mut out = Vec::with_capacity(pieces.len());
    for &(a, b) in pieces {
        let mut start = a;
        for i in a..b {
            if class(cp.chars[i]) {
                if start < i {
                    out.push((start, i));
                }
                out.push((i, i + 1));
                start = i + 1;
            }
        }
        if start < b {
            out.push((start, b));
        }
    }
    out
}

/// `[0-9][0-9][0-9]`, searched left to right.
fn digit_triples(cp: &Cpts, pieces: &Pieces) -> Pieces {
    let digit = |i: usize| cp.chars[i].is_ascii_digit();
    let mut out = Vec::with_capacity(pieces.len());
    for &(a, b) in pieces {
        let mut start = a;
        let mut i = a;
        while i + 3 <= b {
            if digit(i) && digit(i + 1) && digit(i + 2) {
                if start < i {
                    out.push((start, i));
                }
                out.push((i, i + 3));
                i += 3;
                start = i;
            } else {
                i += 1;
            }
        }
        if start < b {
            out.push((start, b));
        }
    }
    out
}

const OUT_OF_RANGE: char = '\u{FFFF}';

/// llama.cpp's `unicode_regex_split_custom_gpt2`:
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn gpt2(cp: &Cpts, pieces: &Pieces) -> Pieces {
    let mut out = Vec::with_capacity(pieces.len() * 2);
    for &(ini, end) in pieces {
        let cpt = |p: usize| {
            if p >= ini && p < end {
                Some(cp.chars[p])
            } else {
                None
            }
        };
        let fl = |p: usize| {
            if p >= ini && p < end {
                cp.flags[p]
            } else {
                Flags::default()
            }
        };
        let mut prev = ini;
        let mut add = |e: usize, out: &mut Pieces| {
            let len = e - prev;
            if len > 0 {
                out.push((prev, e));
            }
            prev = e;
            len
        };
        let mut pos = ini;
        while pos < end {
            let c = cp.chars[pos];
            let f = cp.flags[pos];
            if c == '\'' && pos + 1 < end {
                let n1 = cpt(pos + 1).unwrap_or(OUT_OF_RANGE);
                if matches!(n1, 's' | 't' | 'm' | 'd') {
                    pos += add(pos + 2, &mut out);
                    continue;
                }
                if pos + 2 < end {
                    let n2 = cpt(pos + 2).unwrap_or(OUT_OF_RANGE);
                    if matches!((n1, n2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                        pos += add(pos + 3, &mut out);
                        continue;
                    }
                }
            }
            let mut f2 = if c == ' ' { fl(pos + 1) } else { f };
            if f2.letter {
                pos += usize::from(c == ' ');
                while f2.letter {
                    pos += 1;
                    f2 = fl(pos);
                }
                add(pos, &mut out);
                continue;
            }
            if f2.number {
                pos += usize::from(c == ' ');
                while f2.number {
                    pos += 1;
                    f2 = fl(pos);
                }
                add(pos, &mut out);
                continue;
            }
            let other = |f: Flags| !(f.whitespace || f.letter || f.number) && f.any;
            if other(f2) {
                pos += usize::from(c == ' ');
                while other(f2) {
                    pos += 1;
                    f2 = fl(pos);
                }
                add(pos, &mut out);
                continue;
            }
            let mut n_ws = 0;
            while fl(pos + n_ws).whitespace {
                n_ws += 1;
            }
            if n_ws > 1 && cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                add(pos, &mut out);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                add(pos, &mut out);
                continue;
            }
            pos += 1;
            add(pos, &mut out);
        }
    }
    out
}

/// llama.cpp's `unicode_regex_split_custom_llama3`: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|
/// \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`, with `{1,max_digits}` for numbers.
fn llama3(cp: &Cpts, pieces: &Pieces, max_digits: usize) -> Pieces {
    let mut out = Vec::with_capacity(pieces.len() * 2);
    for &(ini, end) in pieces {
        let cpt = |p: usize| {
            if p >= ini && p < end {
                Some(cp.chars[p])
            } else {
                None
            }
        };
        let fl = |p: usize| {
            if p >= ini && p < end {
                cp.flags[p]
            } else {
                Flags::default()
            }
        };
        let lower = |p: usize| cpt(p).map(|c| c.to_ascii_lowercase()).unwrap_or(OUT_OF_RANGE);
        let mut prev = ini;
        let mut add = |e: usize, out: &mut Pieces| {
            let len = e - prev;
            if len > 0 {
                out.push((prev, e));
            }
            prev = e;
            len
        };
        let mut pos = ini;
        while pos < end {
            let c = cp.chars[pos];
            let f = cp.flags[pos];
            if c == '\'' && pos + 1 < end {
                let n1 = lower(pos + 1);
                if matches!(n1, 's' | 't' | 'm' | 'd') {
                    pos += add(pos + 2, &mut out);
                    continue;
                }
                if pos + 2 < end {
                    let n2 = lower(pos + 2);
                    if matches!((n1, n2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                        pos += add(pos + 3, &mut out);
                        continue;
                    }
                }
            }
            if !(c == '\r' || c == '\n' || f.number) && (f.letter || fl(pos + 1).letter) {
                pos += 1;
                while fl(pos).letter {
                    pos += 1;
                }
                add(pos, &mut out);
                continue;
            }
            if f.number {
                let mut start = pos;
                while fl(pos).number {
                    pos += 1;
                    if pos - start >= max_digits {
                        add(pos, &mut out);
                        start = pos;
                    }
                }
                add(pos, &mut out);
                continue;
            }
            let mut f2 = if c == ' ' { fl(pos + 1) } else { f };
            let other = |f: Flags| !(f.whitespace || f.letter || f.number) && f.any;
            if !(f2.whitespace || f2.letter || f2.number) && f.any {
                pos += usize::from(c == ' ');
                while other(f2) {
                    pos += 1;
                    f2 = fl(pos);
                }
                while matches!(cpt(pos), Some('\r' | '\n')) {
                    pos += 1;
                }
                add(pos, &mut out);
                continue;
            }
            let mut n_ws = 0;
            let mut last_rn = 0;
            while fl(pos + n_ws).whitespace {
                if matches!(cpt(pos + n_ws), Some('\r' | '\n')) {
                    last_rn = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            if last_rn > 0 {
                pos = last_rn;
                add(pos, &mut out);
                continue;
            }
            if n_ws > 1 && cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                add(pos, &mut out);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                add(pos, &mut out);
                continue;
            }
            pos += 1;
            add(pos, &mut out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::pre_tokenize;

    fn check(pre: &str, text: &str, want: &[&str]) {
        let got = pre_tokenize(pre, text);
        assert_eq!(got, want, "pre {pre:?} on {text:?}");
        assert_eq!(got.concat(), text, "pieces must cover the text");
    }

    #[test]
    fn gpt2_regex() {
        // 's|'t|... first; then " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+", "\s+(?!\S)", "\s+".
        check("gpt-2", "Hello world", &["Hello", " world"]);
        check("gpt-2", "don't you're I'll", &["don", "'t", " you", "'re", " I", "'ll"]);
        // Contractions are case-sensitive here: "'S" is punctuation then a letter.
        check("gpt-2", "IT'S", &["IT", "'", "S"]);
        check("gpt-2", "hello   world  ", &["hello", "  ", " world", "  "]);
        check(
            "gpt-2",
            "x=y+z; // code",
            &["x", "=", "y", "+", "z", ";", " //", " code"],
        );
        check("gpt-2", "3.14 and 1,000", &["3", ".", "14", " and", " 1", ",", "000"]);
        check("gpt-2", "a\n\nb", &["a", "\n", "\n", "b"]);
        check("gpt-2", "\t tab", &["\t", " tab"]);
        check("gpt-2", "café 東京", &["café", " 東京"]);
        check("gpt-2", "🙂🚀 ok", &["🙂🚀", " ok"]);
    }

    #[test]
    fn default_sequence() {
        // [\p{P}$+<=>^~|]+ first: punctuation runs are cut out before the GPT-2 regex sees them, then
        // \p{N}+ and [0-9]{3} split numbers.
        check("default", "Hello, world!", &["Hello", ",", " world", "!"]);
        check(
            "default",
            "x=y+z; // code",
            &["x", "=", "y", "+", "z", ";", " ", "//", " code"],
        );
        check("default", "1234567", &["123", "456", "7"]);
        check("default", " 12345 ", &[" ", "123", "45", " "]);
        check("default", "a$b", &["a", "$", "b"]);
        check("default", "don't", &["don", "'", "t"]);
        // Unknown names fall back to the default sequence.
        check("no-such-pre", "Hello, world!", &["Hello", ",", " world", "!"]);
    }

    #[test]
    fn llama3_regex() {
        // Case-insensitive contractions, an optional non-letter before letters, numbers in threes.
        check("llama-bpe", "IT'S fine", &["IT", "'S", " fine"]);
        check("llama-bpe", "12345 apples", &["123", "45", " apples"]);
        check("llama-bpe", "(hello)", &["(hello", ")"]);
        check("llama-bpe", "a.\n\nb", &["a", ".\n\n", "b"]);
        check("llama-bpe", "x  \n  y", &["x", "  \n", " ", " y"]);
        check("llama-bpe", "hello   world", &["hello", "  ", " world"]);
        check("llama-bpe", "end   ", &["end", "   "]);
        check("llama-bpe", " !!", &[" !!"]);
        check("llama3", "3.14159", &["3", ".", "141", "59"]);
    }

    #[test]
    fn qwen2_regex() {
        // As Llama 3 but one digit per number piece.
        check("qwen2", "12345 apples", &["1", "2", "3", "4", "5", " apples"]);
        check("qwen2", "I'VE got 42!", &["I", "'VE", " got", " ", "4", "2", "!"]);
    }

    #[test]
    fn digits_then_gpt2() {
        // SmolLM / StarCoder: every \p{N} alone, the GPT-2 regex on what lies between.
        check("smollm", "abc 123 def", &["abc", " ", "1", "2", "3", " def"]);
        check("smollm", "v2.0", &["v", "2", ".", "0"]);
    }
}
