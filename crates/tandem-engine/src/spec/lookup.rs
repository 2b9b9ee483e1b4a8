//! Prompt lookup: drafts copied from the sequence's own context. The last `n` tokens (n from
//! `max_ngram` down to `min_ngram`) are searched for earlier in the sequence; the tokens that followed
//! their latest earlier occurrence are the draft. Code, quoted documents and repeated clauses are
//! continued this way for free; where nothing matches, no draft is made and the step is a plain one.
//! (llama.cpp's lookup decoding and vLLM's n-gram proposer work alike.)
//!
//! A match less than `k` tokens before the end says the text repeats with that period (a run of one
//! token, a short loop); its continuation runs into the end of the sequence, so the draft goes on
//! through the tokens it has just drafted, as the repetition would, rather than stopping short.
//! (llama.cpp's n-gram cache drafts such runs in full too.)

use super::{Draft, Proposer};
use crate::EngineError;

#[derive(Clone, Debug)]
pub struct PromptLookup {
    pub min_ngram: usize,
    pub max_ngram: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup {
            min_ngram: 2,
            max_ngram: 4,
        }
    }
}

impl PromptLookup {
    /// The tokens after the latest earlier occurrence of `history`'s longest matching suffix, at most
    /// `k` of them, the repetition carried on past the end of `history` where the match is that close
    /// to it.
    pub fn lookup(&self, history: &[u32], k: usize) -> Vec<u32> {
        if k == 0 {
            return Vec::new();
        }
        let len = history.len();
        for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if n >= len {
                continue;
            }
            let pattern = &history[len - n..];
            // Latest start before the suffix itself, scanning backwards.
            for start in (0..len - n).rev() {
                if &history[start..start + n] == pattern {
                    // Token i of the draft is the one `period` tokens before it, in the history or
                    // among the draft's own earlier tokens.
                    let period = len - (start + n);
                    let mut draft = Vec::with_capacity(k);
                    for i in 0..k {
                        let token = if i < period {
                            history[len - period + i]
                        } else {
                            draft[i - period]
                        };
                        draft.push(token);
                    }
                    return draft;
                }
            }
        }
        Vec::new()
    }
}

impl Proposer for PromptLookup {
    fn propose(&mut self, history: &[u32], k: usize) -> Result<Draft, EngineError> {
        Ok(Draft {
            tokens: self.lookup(history, k),
            dists: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_the_latest_earlier_match_of_the_longest_suffix() {
        let l = PromptLookup::default();
        // "1 2 3" appears twice before the end; the later one is followed by 9 9.
        let h = [1, 2, 3, 4, 5, 1, 2, 3, 9, 9, 7, 1, 2, 3];
        assert_eq!(l.lookup(&h, 2), vec![9, 9]);
        assert_eq!(l.lookup(&h, 6), vec![9, 9, 7, 1, 2, 3]);
        // Only a 2-gram matches.
        let h = [5, 6, 7, 8, 0, 7, 8];
        assert_eq!(l.lookup(&h, 3), vec![0, 7, 8]);
        // A longer match wins over a later shorter one: "4 7 8" is matched, not the later "7 8".
        let h = [4, 7, 8, 1, 2, 7, 8, 3, 4, 7, 8];
        assert_eq!(l.lookup(&h, 1), vec![1]);
    }

    #[test]
    fn no_match_no_draft() {
        let l = PromptLookup::default();
        assert!(l.lookup(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(l.lookup(&[], 4).is_empty());
        assert!(l.lookup(&[1, 1], 0).is_empty());
        // A single repeated token is no 2-gram match below min_ngram 2 until it repeats twice.
        assert!(l.lookup(&[3, 1, 3], 2).is_empty());
        assert_eq!(l.lookup(&[3, 3, 3], 2), vec![3, 3]);
    }

    #[test]
    fn a_match_near_the_end_continues_its_repetition() {
        let l = PromptLookup::default();
        // A run of one token drafts that token k times.
        assert_eq!(l.lookup(&[5, 3, 3, 3, 3], 6), vec![3; 6]);
        // A loop of period 3 ("1 2 3", suffix "2 3" last seen 3 tokens back) goes on round the loop.
        let h = [9, 1, 2, 3, 1, 2, 3];
        assert_eq!(l.lookup(&h, 8), vec![1, 2, 3, 1, 2, 3, 1, 2]);
        // The period is the distance to the latest match: here "1 2 3" is followed by "9 9 7 1 2 3",
        // and the draft then goes round that.
        let h = [1, 2, 3, 9, 9, 7, 1, 2, 3];
        assert_eq!(l.lookup(&h, 8), vec![9, 9, 7, 1, 2, 3, 9, 9]);
    }
}
