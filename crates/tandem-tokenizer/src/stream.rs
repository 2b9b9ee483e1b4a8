//! Incremental detokenization: token pieces are byte strings that may split a UTF-8 character (byte-fallback
//! tokens, byte-level BPE), so text is released only once its characters are complete.

use crate::Tokenizer;

/// Turns a stream of token ids into text, holding back the bytes of an unfinished UTF-8 character.
///
/// The concatenation of everything [`push`](Self::push) and [`flush`](Self::flush) return equals
/// [`Tokenizer::decode`] of all the ids: invalid bytes become U+FFFD exactly where a lossy decode of the
/// whole puts them.
#[derive(Clone)]
pub struct StreamDecoder {
    tokenizer: Tokenizer,
    render_special: bool,
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new(tokenizer: &Tokenizer, render_special: bool) -> Self {
        StreamDecoder {
            tokenizer: tokenizer.clone(),
            render_special,
            pending: Vec::new(),
        }
    }

    /// Adds one token; returns the text completed by it (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        let piece = self.tokenizer.token_to_piece(id, self.render_special);
        self.pending.extend_from_slice(&piece);
        self.take_complete()
    }

    /// Bytes held back for an unfinished character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Releases whatever is held back, an unfinished character becoming U+FFFD.
    pub fn flush(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut at = 0;
        loop {
            match std::str::from_utf8(&self.pending[at..]) {
                Ok(s) => {
                    out.push_str(s);
                    at = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The first `valid_up_to` bytes are valid UTF-8 by definition.
                    out.push_str(std::str::from_utf8(&self.pending[at..at + valid]).unwrap_or_default());
                    at += valid;
                    match e.error_len() {
                        // An invalid sequence, whatever follows: one U+FFFD, as a lossy decode gives.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            at += n;
                        }
                        // An unfinished character at the end: wait for more bytes.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..at);
        out
    }
}
