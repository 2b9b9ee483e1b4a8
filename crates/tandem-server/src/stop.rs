//! Stop strings matched on the generated text as it arrives.

/// Finds stop strings in text that arrives in pieces. Text that could be the start of a stop string is held
/// back until it is known not to be one; the stop string itself and whatever follows it are never released.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds text; returns what can be released and, when a stop string was found, which one (the
    /// earliest in the text; nothing is released after it).
    pub fn push(&mut self, text: &str) -> (String, Option<String>) {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), None);
        }
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, word)) = found {
            let word = word.clone();
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, Some(word));
        }
        let cut = self.held.len() - self.partial_suffix();
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, None)
    }

    /// Releases what is held back (the text ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The length of the longest end of the held text that begins some stop string.
    fn partial_suffix(&self) -> usize {
        let held = self.held.as_bytes();
        let mut best = 0;
        for s in &self.stops {
            let longest = (s.len() - 1).min(held.len());
            for k in (best + 1..=longest).rev() {
                let at = held.len() - k;
                if self.held.is_char_boundary(at) && s.as_bytes().starts_with(&held[at..]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    /// Feeds the pieces; returns the released text and the stop string found.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (text, word) = m.push(p);
            out.push_str(&text);
            if word.is_some() {
                return (out, word);
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn finds_stop_strings_across_pieces() {
        assert_eq!(
            run(&["STOP"], &["ab", "cS", "TO", "Pxyz"]),
            ("abc".into(), Some("STOP".into()))
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), Some("\n\n".into())));
        // The earliest match wins, whichever stop string it is.
        assert_eq!(run(&["xyz", "b"], &["abxyz"]), ("a".into(), Some("b".into())));
    }

    #[test]
    fn releases_partial_matches_that_fail() {
        assert_eq!(run(&["STOP"], &["ST", "OR", "E"]), ("STORE".into(), None));
        assert_eq!(run(&["STOP"], &["abcST"]), ("abcST".into(), None));
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("abcST"), ("abc".into(), None));
        assert_eq!(m.push("x"), ("STx".into(), None));
    }

    #[test]
    fn multibyte_text_and_stops() {
        assert_eq!(run(&["é!"], &["caf", "é", "!", "x"]), ("caf".into(), Some("é!".into())));
        assert_eq!(
            run(&["日本"], &["日", "x日", "本"]),
            ("日x".into(), Some("日本".into()))
        );
        assert_eq!(run(&[""], &["abc"]), ("abc".into(), None));
        assert_eq!(run(&[], &["abc"]), ("abc".into(), None));
    }
}
