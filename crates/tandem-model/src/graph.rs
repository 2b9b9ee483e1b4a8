//! The layer graph, written once for any number of rows and any backend.
//!
//! A forward pass takes a batch of rows (one or more sequences, each a run of consecutive positions) and
//! walks every layer over all rows at once. The graph never asks how many rows there are or where they
//! live: the backend's matmul takes the decode route (matvec) for one row and the GEMM route for many,
//! and attention runs per query row. Llama, Gemma 3 and Qwen3 differ only in the switches of
//! `ModelConfig` (QK-norm, sandwich norms, embedding scale, activation, RoPE style and per-layer
//! window), which mirror llama.cpp's builders; Qwen3-MoE's feed-forward block is the backend's
//! `expert_ffn`.

use std::ops::Range;

use crate::backend::{Backend, HeadNorms, LogitRows, SequenceCache, Span};
use crate::logits::Logits;
use crate::weights::FeedForward;
use crate::ModelError;

// The defaults of `Backend`'s composite steps live beside the trait; a backend overriding one may fall
// back to them here, beside the graph.
pub use crate::backend::{exactly, norm_heads, project_then_attend, rope_then_attend_each};

/// Runs the layer graph over every span's tokens; returns, per span, the logits of the rows it asked
/// for (`rows × n_vocab`, row-major). What `Backend::run` does when the graph is launched op by op.
pub fn forward<B: Backend>(
    b: &B,
    scratch: &mut B::Scratch,
    spans: &mut [Span<B::Kv>],
) -> Result<Vec<Logits>, ModelError> {
    let c = b.config();
    let w = b.weights();
    let mut positions = Vec::new();
    let mut span_rows = Vec::with_capacity(spans.len());
    for s in spans.iter() {
        s.kv.check_room(s.tokens.len())?;
        let start = positions.len();
        positions.extend((0..s.tokens.len()).map(|i| s.kv.len() + i));
        span_rows.push(start..positions.len());
    }
    let t = positions.len();
    if t == 0 {
        return Ok(spans.iter().map(|_| Logits::default()).collect());
    }

    let tokens: Vec<u32> = spans.iter().flat_map(|s| s.tokens.iter().copied()).collect();
    let mut x = b.embed(&tokens)?;
    // Each block's pre-norm is made in the pass that adds the previous block's output to the residual.
    let mut h = match w.layers.first() {
        Some(first) => Some(b.normed(&x, &first.attn_norm)?),
        None => None,
    };
    for (l, (lw, spec)) in w.layers.iter().zip(&c.layers).enumerate() {
        // Attention block.
        let attn_in = h
            .take()
            .ok_or_else(|| ModelError::Kernel(format!("layer {l}: no pre-norm")))?;
        let head_norms = match (&lw.q_norm, &lw.k_norm) {
            (Some(q), Some(k)) => Some(HeadNorms {
                q,
                k,
                head_dim: c.head_dim,
            }),
            _ => None,
        };
        let mut attn = b.output_rows(t, c.q_width())?;
        b.project_and_attend(
            scratch,
            l,
            spans,
            &span_rows,
            attn_in,
            lw.qkv(),
            &mut attn,
            head_norms,
            &positions,
            &spec.rope,
        )?;
        let o = b.matmul(&lw.wo, &attn)?;
        let ffn_in = b.add_and_norm(&mut x, o, lw.post_attn_norm.as_ref(), &lw.ffn_norm)?;

        // Feed-forward block: one gated MLP, or the experts each row routes to.
        let f = match (&lw.ffn, &c.moe) {
            (FeedForward::Dense { gate, up, down }, _) => {
                let gated = b.gated_products(&ffn_in, gate, up, c.activation, down)?;
                drop(ffn_in);
                b.matmul(down, &gated)?
            }
            (FeedForward::Experts(experts), Some(moe)) => b.expert_ffn(l, &ffn_in, experts, moe, c.activation)?,
            (FeedForward::Experts(_), None) => {
                return Err(ModelError::Config(format!(
                    "layer {l}: experts without an expert config"
                )))
            }
        };
        match w.layers.get(l + 1) {
            Some(next) => h = Some(b.add_and_norm(&mut x, f, lw.post_ffn_norm.as_ref(), &next.attn_norm)?),
            None => b.add_normed(&mut x, f, lw.post_ffn_norm.as_ref())?,
        }
    }

    // Logits for the rows each span asked for, every span's in one pass over the output matrix (a
    // batched decode step reads it once, not once a sequence).
    let picked: Vec<Vec<usize>> = spans
        .iter()
        .zip(&span_rows)
        .map(|(span, rows)| match span.logits {
            LogitRows::None => vec![],
            LogitRows::Last => vec![rows.end - 1],
            LogitRows::All => rows.clone().collect(),
        })
        .collect();
    let all: Vec<usize> = picked.iter().flatten().copied().collect();
    if all.is_empty() {
        return Ok(spans.iter().map(|_| Logits::default()).collect());
    }
    // The final norm as a pre-norm of the output matrix: a backend writes it in the form that matrix
    // reads (the CUDA backend: one kernel that also quantizes it for the integer matvec).
    let h = b.normed(&b.gather_rows(&x, &all)?, &w.output_norm)?;
    let counts: Vec<usize> = picked.iter().map(Vec::len).collect();
    b.logits_to_host(b.matmul(&w.output, &h)?, &counts)
}

/// Whether a pass's rows (`span_rows[i]`: span i's) are a batched decode step: several spans of one
/// row each, in span order. A backend may attend those rows together, each against its own cache.
pub fn is_decode_batch(span_rows: &[Range<usize>]) -> bool {
    span_rows.len() > 1 && span_rows.iter().enumerate().all(|(i, r)| *r == (i..i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_batch_is_several_spans_of_one_row_each_in_order() {
        assert!(is_decode_batch(&[0..1, 1..2, 2..3]));
        let one_span = vec![Range { start: 0, end: 1 }];
        assert!(!is_decode_batch(&one_span), "one span");
        assert!(!is_decode_batch(&[0..2, 2..3]), "a chunk");
        assert!(!is_decode_batch(&[0..1, 2..3]), "rows out of place");
        assert!(!is_decode_batch(&[]));
    }
}
