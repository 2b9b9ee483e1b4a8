//! The layer graph, written once for any number of rows and any backend.
//!
//! A forward pass takes a batch of rows (one or more sequences, each a run of consecutive positions) and
//! walks every layer over all rows at once. The graph never asks how many rows there are or where they
//! live: the backend's matmul takes the decode route (matvec) for one row and the GEMM route for many,
//! and attention runs per query row. Llama and Gemma 3 differ only in the switches of `ModelConfig`
//! (QK-norm, sandwich norms, embedding scale, activation, RoPE style and per-layer window), which mirror
//! llama.cpp's builders.

use std::ops::Range;

use tandem_backend::cpu::ops::RopeParams;

use crate::backend::{AttendRows, Backend, HeadNorms, QkvRows, SequenceCache};
use crate::kv::SequenceKv;
use crate::logits::Logits;
use crate::weights::Matrix;
use crate::ModelError;

/// Which rows of a sequence's chunk produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    None,
    Last,
    All,
}

/// One sequence's share of a batch: its cache, its new tokens (at positions `kv.len()..`), and which
/// logits it wants.
pub struct Span<'a, K = SequenceKv> {
    pub kv: &'a mut K,
    pub tokens: &'a [u32],
    pub logits: LogitRows,
}

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

        // Feed-forward block.
        let [gate, up] = lw.gate_up();
        let gated = b.gated_products(&ffn_in, gate, up, c.activation, &lw.down)?;
        drop(ffn_in);
        let f = b.matmul(&lw.down, &gated)?;
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

/// `Backend::project_and_attend`'s default: `matmuls` for q, k and v, then `rope_store_and_attend`.
#[allow(clippy::too_many_arguments)]
pub fn project_then_attend<B: Backend>(
    b: &B,
    scratch: &mut B::Scratch,
    layer: usize,
    spans: &mut [Span<B::Kv>],
    span_rows: &[Range<usize>],
    x: B::Act,
    m: [&Matrix; 3],
    out: &mut B::Act,
    head_norms: Option<HeadNorms<'_>>,
    positions: &[usize],
    rope: &RopeParams,
) -> Result<(), ModelError> {
    let [mut q, mut k, v] = exactly(b.matmuls(&m, &x)?)?;
    drop(x);
    let qkv = QkvRows {
        q: &mut q,
        k: &mut k,
        v: &v,
        out,
        head_norms,
    };
    b.rope_store_and_attend(scratch, layer, spans, span_rows, qkv, positions, rope)
}

/// `Backend::rope_store_and_attend`'s default: the head norms and RoPE on every row of q and k, then
/// each span's `store_and_attend`.
#[allow(clippy::too_many_arguments)]
pub fn rope_then_attend_each<B: Backend>(
    b: &B,
    scratch: &mut B::Scratch,
    layer: usize,
    spans: &mut [Span<B::Kv>],
    span_rows: &[Range<usize>],
    qkv: QkvRows<'_, B::Act>,
    positions: &[usize],
    rope: &RopeParams,
) -> Result<(), ModelError> {
    if let Some(n) = qkv.head_norms {
        norm_heads(b, qkv.q, qkv.k, n)?;
    }
    b.rope_qk(qkv.q, qkv.k, positions, rope)?;
    for (span, rows) in spans.iter_mut().zip(span_rows) {
        let io = AttendRows {
            q: &*qkv.q,
            k: &*qkv.k,
            v: qkv.v,
            out: &mut *qkv.out,
        };
        b.store_and_attend(scratch, layer, span.kv, io, rows.clone(), &positions[rows.clone()])?;
    }
    Ok(())
}

/// QK-norm on every head of q and of k (`Backend::rms_norm`, one head a group).
pub fn norm_heads<B: Backend>(b: &B, q: &mut B::Act, k: &mut B::Act, n: HeadNorms<'_>) -> Result<(), ModelError> {
    b.rms_norm(q, n.head_dim, n.q)?;
    b.rms_norm(k, n.head_dim, n.k)
}

/// The `N` products a backend's `matmuls` returned for `N` matrices.
pub fn exactly<A, const N: usize>(v: Vec<A>) -> Result<[A; N], ModelError> {
    v.try_into()
        .map_err(|v: Vec<A>| ModelError::Kernel(format!("a backend returned {} products for {N} matrices", v.len())))
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
