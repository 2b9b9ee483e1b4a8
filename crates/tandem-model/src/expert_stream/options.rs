//! The typed options of the expert stream, as the CUDA backend's options will hold them:
//! `--expert-stream off|all|routed` and `--expert-stream-depth N`.

use std::fmt;
use std::str::FromStr;

use super::error::StreamError;

/// Rows from which a prefill chunk streams its non-resident experts through the ring; a smaller chunk
/// routes few enough experts that staging only the routed ones wins.
pub const STREAM_MIN_ROWS: usize = 1024;

/// Which walk a streamed prefill chunk takes (`--expert-stream`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ExpertStreamMode {
    /// No streaming: every chunk stages only its routed experts.
    Off,
    /// Copy every non-resident expert of every layer through the ring.
    All,
    /// As `All`, but an entry not yet issued whose layer's routing is published and whose expert no row
    /// routes to is skipped. The default: the consumer never reads such an entry, so the products are
    /// the same bits as `All`'s.
    #[default]
    Routed,
}

/// What the issuer does with an entry whose expert no row routes to (`issue_walk`'s mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WalkMode {
    /// Copy every entry.
    All,
    /// Skip an unrouted entry of a published layer that is not yet issued.
    Routed,
}

impl ExpertStreamMode {
    /// The walk a chunk of `rows` rows takes, `None` when it does not stream (the mode is off or the
    /// chunk is under `STREAM_MIN_ROWS`).
    pub fn walk_for_rows(self, rows: usize) -> Option<WalkMode> {
        match self {
            _ if rows < STREAM_MIN_ROWS => None,
            ExpertStreamMode::Off => None,
            ExpertStreamMode::All => Some(WalkMode::All),
            ExpertStreamMode::Routed => Some(WalkMode::Routed),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ExpertStreamMode::Off => "off",
            ExpertStreamMode::All => "all",
            ExpertStreamMode::Routed => "routed",
        }
    }
}

impl fmt::Display for ExpertStreamMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ExpertStreamMode {
    type Err = StreamError;

    fn from_str(s: &str) -> Result<Self, StreamError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Ok(ExpertStreamMode::Off),
            "all" => Ok(ExpertStreamMode::All),
            "routed" => Ok(ExpertStreamMode::Routed),
            _ => Err(StreamError::Mode(s.to_string())),
        }
    }
}

/// Copies the issuer may have queued ahead of the link and not yet seen land (`--expert-stream-depth`),
/// 1 to 256, 16 by default. A shallow queue keeps copies uncommitted until the link is about to take
/// them, so an expert whose layer's routing lands meanwhile can still be skipped; a deep one hides the
/// issuer's own latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamDepth(u16);

impl StreamDepth {
    pub const MIN: usize = 1;
    pub const MAX: usize = 256;
    pub const DEFAULT: StreamDepth = StreamDepth(16);

    pub fn new(depth: usize) -> Result<Self, StreamError> {
        if (Self::MIN..=Self::MAX).contains(&depth) {
            // At most 256, so it fits.
            Ok(StreamDepth(depth as u16))
        } else {
            Err(StreamError::Depth(depth.to_string()))
        }
    }

    pub fn get(self) -> usize {
        usize::from(self.0)
    }
}

impl Default for StreamDepth {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for StreamDepth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for StreamDepth {
    type Err = StreamError;

    fn from_str(s: &str) -> Result<Self, StreamError> {
        let depth: usize = s.trim().parse().map_err(|_| StreamError::Depth(s.to_string()))?;
        StreamDepth::new(depth).map_err(|_| StreamError::Depth(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for mode in [ExpertStreamMode::Off, ExpertStreamMode::All, ExpertStreamMode::Routed] {
            assert_eq!(mode.to_string().parse::<ExpertStreamMode>(), Ok(mode));
        }
        assert_eq!(" Routed ".parse(), Ok(ExpertStreamMode::Routed));
        assert_eq!(ExpertStreamMode::default(), ExpertStreamMode::Routed);
        assert!(matches!("some".parse::<ExpertStreamMode>(), Err(StreamError::Mode(_))));
        assert!("".parse::<ExpertStreamMode>().is_err());
    }

    #[test]
    fn small_chunks_and_off_do_not_stream() {
        let rows = STREAM_MIN_ROWS;
        assert_eq!(ExpertStreamMode::Off.walk_for_rows(rows), None);
        assert_eq!(ExpertStreamMode::All.walk_for_rows(rows), Some(WalkMode::All));
        assert_eq!(ExpertStreamMode::Routed.walk_for_rows(rows), Some(WalkMode::Routed));
        assert_eq!(ExpertStreamMode::Routed.walk_for_rows(rows - 1), None);
    }

    #[test]
    fn depth_is_one_to_256() {
        assert_eq!(StreamDepth::default().get(), 16);
        assert_eq!("1".parse::<StreamDepth>().map(StreamDepth::get), Ok(1));
        assert_eq!("256".parse::<StreamDepth>().map(StreamDepth::get), Ok(256));
        for bad in ["0", "257", "-1", "1.5", "", "sixteen", "99999999999999999999999"] {
            assert_eq!(
                bad.parse::<StreamDepth>(),
                Err(StreamError::Depth(bad.to_string())),
                "{bad:?}"
            );
        }
        assert!(StreamDepth::new(0).is_err());
        assert_eq!(StreamDepth::new(300), Err(StreamError::Depth("300".into())));
    }
}
