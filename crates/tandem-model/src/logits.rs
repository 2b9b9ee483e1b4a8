//! One span's logits as a backend hands them over.
//!
//! The CPU backend computes logits into its own vector. A GPU backend copies them from the device
//! into page-locked host memory (a copy into ordinary memory goes through the driver's staging
//! buffers and costs more), and moving them from there into a fresh vector would read and write
//! every logit once more on the host between two decode steps: 34 µs for the 8B shape's 513 KB on
//! the H200 machine, with the GPU idle. So the buffer itself is lent to the caller, and goes back to
//! its backend when the `Logits` are dropped. llama.cpp does the same: `llama_get_logits` points into
//! its output buffer.

use std::fmt;
use std::ops::Deref;

/// Memory a backend lends with its logits; dropping it gives it back.
pub trait LentLogits: Send {
    fn logits(&self) -> &[f32];
}

/// A span's logits (the rows `LogitRows` asked for, row after row), read as a slice.
pub struct Logits(Store);

enum Store {
    Owned(Vec<f32>),
    Lent(Box<dyn LentLogits>),
}

impl Logits {
    /// Logits in memory a backend lends (`LentLogits`).
    pub fn lent(buffer: Box<dyn LentLogits>) -> Self {
        Logits(Store::Lent(buffer))
    }

    /// The logits as a vector of their own (a copy when they are lent).
    pub fn into_vec(self) -> Vec<f32> {
        match self.0 {
            Store::Owned(v) => v,
            Store::Lent(b) => b.logits().to_vec(),
        }
    }
}

impl Deref for Logits {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.0 {
            Store::Owned(v) => v,
            Store::Lent(b) => b.logits(),
        }
    }
}

impl<'a> IntoIterator for &'a Logits {
    type Item = &'a f32;
    type IntoIter = std::slice::Iter<'a, f32>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl From<Vec<f32>> for Logits {
    fn from(v: Vec<f32>) -> Self {
        Logits(Store::Owned(v))
    }
}

impl Default for Logits {
    fn default() -> Self {
        Logits::from(Vec::new())
    }
}

impl Clone for Logits {
    fn clone(&self) -> Self {
        Logits::from(self.to_vec())
    }
}

impl fmt::Debug for Logits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.0 {
            Store::Owned(_) => "owned",
            Store::Lent(_) => "lent",
        };
        write!(f, "Logits({} values, {kind})", self.len())
    }
}

impl PartialEq for Logits {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Buffer {
        values: Vec<f32>,
        returned: Arc<AtomicUsize>,
    }

    impl LentLogits for Buffer {
        fn logits(&self) -> &[f32] {
            &self.values
        }
    }

    impl Drop for Buffer {
        fn drop(&mut self) {
            self.returned.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn lent_logits_read_as_a_slice_and_go_back_when_dropped() {
        let returned = Arc::new(AtomicUsize::new(0));
        let lent = Logits::lent(Box::new(Buffer {
            values: vec![1.0, -2.0, 3.5],
            returned: returned.clone(),
        }));
        assert_eq!(&*lent, &[1.0, -2.0, 3.5]);
        assert_eq!(lent, Logits::from(vec![1.0, -2.0, 3.5]));
        let copy = lent.clone();
        assert_eq!(format!("{copy:?}"), "Logits(3 values, owned)");
        assert_eq!(format!("{lent:?}"), "Logits(3 values, lent)");
        assert_eq!(returned.load(Ordering::SeqCst), 0);
        assert_eq!(lent.into_vec(), vec![1.0, -2.0, 3.5]);
        assert_eq!(
            returned.load(Ordering::SeqCst),
            1,
            "into_vec copies, then gives the buffer back"
        );
        assert_eq!(copy.into_vec(), vec![1.0, -2.0, 3.5]);
        assert!(Logits::default().is_empty());
    }
}
