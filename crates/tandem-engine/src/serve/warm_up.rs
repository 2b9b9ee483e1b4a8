//! A throwaway pass before the server takes requests, as llama.cpp's server does at start.
//!
//! A backend's first pass at a shape costs more than the next: a GPU library loads the kernels it picked
//! for each GEMM shape on first use (about 0.17 s for the 8B's prefill shapes on the H200), and a CPU
//! model's memory-mapped weights are read in from the page cache or the disk. Without a warm-up the
//! first request pays that in its time to first token, and the first decode step at each batch size
//! (on the GPU, batches of more than 8 rows take cuBLAS) pays it in a gap between tokens.

use std::time::{Duration, Instant};

use tandem_model::{Backend, LogitRows, ModelError, Span};

/// The chunk sizes to warm, smallest first: each of `rows` clamped to the context, zeros and repeats
/// dropped.
pub fn warm_up_rows(rows: &[usize], n_ctx: usize) -> Vec<usize> {
    let mut out: Vec<usize> = rows.iter().map(|&r| r.min(n_ctx)).filter(|&r| r > 0).collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Runs one chunk of each size in `rows` (see `warm_up_rows`) through a sequence of its own, then one
/// decode step of each batch size in `batches` (that many sequences of a row each); every cache is
/// dropped afterwards. Returns the time it took. Token 0 fills every row: any id in the vocabulary
/// takes the same kernels.
pub fn warm_up<B: Backend>(model: &B, rows: &[usize], batches: &[usize], n_ctx: usize) -> Result<Duration, ModelError> {
    let t0 = Instant::now();
    let mut scratch = B::Scratch::default();
    for t in warm_up_rows(rows, n_ctx) {
        let mut kv = model.new_kv(t)?;
        let tokens = vec![0u32; t];
        let mut spans = [Span {
            kv: &mut kv,
            tokens: &tokens,
            logits: LogitRows::Last,
        }];
        model.run(&mut scratch, &mut spans)?;
    }
    let token = [0u32];
    for n in warm_up_rows(batches, usize::MAX) {
        let mut kvs = (0..n).map(|_| model.new_kv(1)).collect::<Result<Vec<_>, _>>()?;
        let mut spans: Vec<Span<B::Kv>> = kvs
            .iter_mut()
            .map(|kv| Span {
                kv,
                tokens: &token,
                logits: LogitRows::Last,
            })
            .collect();
        model.run(&mut scratch, &mut spans)?;
    }
    Ok(t0.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_clamped_to_the_context_sorted_and_unique() {
        assert_eq!(warm_up_rows(&[512, 64, 1], 4096), vec![1, 64, 512]);
        assert_eq!(warm_up_rows(&[512, 64, 1, 64], 100), vec![1, 64, 100]);
        assert_eq!(warm_up_rows(&[0, 512], 512), vec![512]);
        assert!(warm_up_rows(&[], 512).is_empty());
    }
}
