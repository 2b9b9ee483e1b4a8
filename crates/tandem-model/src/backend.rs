//! What the layer graph asks of a backend. The graph (`graph.rs`) is written once against this trait;
//! the CPU (`cpu.rs`) and CUDA (`tandem-cuda`) backends implement it, each choosing its kernels by the
//! shape of the call (one row: matvec; many rows: GEMM).
//!
//! The types a pass shares with the graph (`Span`, the row bundles) and the defaults of the trait's
//! composite steps live here, below the graph, which re-exports the defaults for backends falling back
//! to them.

use std::ops::Range;

use crate::config::{Activation, ModelConfig, MoeConfig, RopeParams};
use crate::kv::SequenceKv;
use crate::logits::Logits;
use crate::weights::{ExpertFfn, Matrix, Norm, Weights};
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

/// A sequence's KV cache as the graph sees it: how far it is filled and how far it may grow.
pub trait SequenceCache {
    /// Positions cached so far (the next position to be written).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The most positions it may hold.
    fn n_ctx(&self) -> usize;
    /// Checks that `t` more rows fit in the context.
    fn check_room(&self, t: usize) -> Result<(), ModelError> {
        if self.len() + t > self.n_ctx() {
            return Err(ModelError::ContextFull {
                n_ctx: self.n_ctx(),
                len: self.len(),
                adding: t,
            });
        }
        Ok(())
    }
    /// Bytes its storage holds now.
    fn bytes_allocated(&self) -> usize;
    /// Bytes its storage would hold at the full context.
    fn bytes_at_capacity(&self) -> usize;
}

/// A backend: activations of `rows × width` f32 values living where its kernels run.
pub trait Backend {
    type Act;
    type Kv: SequenceCache;
    /// Scratch reused across forward passes (staging buffers and the like).
    type Scratch: Default;

    fn config(&self) -> &ModelConfig;
    fn weights(&self) -> &Weights;
    /// A fresh KV cache for one sequence of up to `n_ctx` positions.
    fn new_kv(&self, n_ctx: usize) -> Result<Self::Kv, ModelError>;
    /// One forward pass: the layer graph (`graph::forward`), unless the backend has a faster way to
    /// the same result for some shapes (the CUDA backend replays captured graphs for decode steps).
    fn run(&self, scratch: &mut Self::Scratch, spans: &mut [Span<Self::Kv>]) -> Result<Vec<Logits>, ModelError>
    where
        Self: Sized;

    /// Rows of the token embedding table for `tokens`, scaled for Gemma.
    fn embed(&self, tokens: &[u32]) -> Result<Self::Act, ModelError>;
    /// An activation whose every row the caller writes before reading (contents unspecified).
    fn output_rows(&self, rows: usize, width: usize) -> Result<Self::Act, ModelError>;
    /// RMS norm of every `group`-wide slice of every row, times `weight`.
    fn rms_norm(&self, x: &mut Self::Act, group: usize, weight: &Norm) -> Result<(), ModelError>;
    /// A normed copy of `x` (whole rows): what a pre-norm block reads while `x` stays the residual.
    fn normed(&self, x: &Self::Act, weight: &Norm) -> Result<Self::Act, ModelError>;
    /// The residual update `x += norm(y)` (`x += y` without a norm): a block's output joining the stream.
    fn add_normed(&self, x: &mut Self::Act, y: Self::Act, norm: Option<&Norm>) -> Result<(), ModelError>;
    /// `add_normed(x, y, post)`, then `normed(x, norm)`: a block's output joining the residual and the
    /// next block's pre-norm, which a backend may do in one pass.
    fn add_and_norm(
        &self,
        x: &mut Self::Act,
        y: Self::Act,
        post: Option<&Norm>,
        norm: &Norm,
    ) -> Result<Self::Act, ModelError> {
        self.add_normed(x, y, post)?;
        self.normed(x, norm)
    }
    /// `x · mᵀ`: one output row per input row.
    fn matmul(&self, m: &Matrix, x: &Self::Act) -> Result<Self::Act, ModelError>;
    /// `x · mᵀ` for each of `ms` (matrices reading the same input, `Weights::input_groups`), with the
    /// bits of separate `matmul`s; a backend may launch them together.
    fn matmuls(&self, ms: &[&Matrix], x: &Self::Act) -> Result<Vec<Self::Act>, ModelError> {
        ms.iter().map(|m| self.matmul(m, x)).collect()
    }
    /// Rotates every head of row r by the angles of `positions[r]`.
    fn rope(&self, x: &mut Self::Act, positions: &[usize], rope: &RopeParams) -> Result<(), ModelError>;
    /// `rope` of q and of k, which a backend may do in one pass.
    fn rope_qk(
        &self,
        q: &mut Self::Act,
        k: &mut Self::Act,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        self.rope(q, positions, rope)?;
        self.rope(k, positions, rope)
    }
    /// Stores rows `rows` of `k` and `v` in layer `layer` of `kv`, then attends the same rows of `q`
    /// (at `positions`, one per row) over the cache into the same rows of `out`.
    #[allow(clippy::too_many_arguments)]
    fn store_and_attend(
        &self,
        scratch: &mut Self::Scratch,
        layer: usize,
        kv: &mut Self::Kv,
        io: AttendRows<'_, Self::Act>,
        rows: Range<usize>,
        positions: &[usize],
    ) -> Result<(), ModelError>;
    /// `gate = act(gate) * up`; `reader` is the matrix that multiplies the result next, and its only
    /// reader (so a backend may keep the result only in the input form that kernel reads).
    fn gated(&self, gate: &mut Self::Act, up: &Self::Act, act: Activation, reader: &Matrix) -> Result<(), ModelError>;
    /// One layer's attention over the batch: the head norms (`qkv.head_norms`), `rope_qk`, then
    /// `store_and_attend` for each span (`span_rows[i]`: span i's rows). A backend may norm and rotate
    /// K as it stores it.
    #[allow(clippy::too_many_arguments)]
    fn rope_store_and_attend(
        &self,
        scratch: &mut Self::Scratch,
        layer: usize,
        spans: &mut [Span<Self::Kv>],
        span_rows: &[Range<usize>],
        qkv: QkvRows<'_, Self::Act>,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError>
    where
        Self: Sized,
    {
        rope_then_attend_each(self, scratch, layer, spans, span_rows, qkv, positions, rope)
    }
    /// The attention block's projections of its pre-normed input `x` (`m`: q, k and v), then
    /// `rope_store_and_attend` over them into `out`. A backend may make the three products in one
    /// launch and cut, rotate and store them in another, so that K and V never exist on their own;
    /// the default is `matmuls`, then `rope_store_and_attend`.
    #[allow(clippy::too_many_arguments)]
    fn project_and_attend(
        &self,
        scratch: &mut Self::Scratch,
        layer: usize,
        spans: &mut [Span<Self::Kv>],
        span_rows: &[Range<usize>],
        x: Self::Act,
        m: [&Matrix; 3],
        out: &mut Self::Act,
        head_norms: Option<HeadNorms<'_>>,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError>
    where
        Self: Sized,
    {
        project_then_attend(
            self, scratch, layer, spans, span_rows, x, m, out, head_norms, positions, rope,
        )
    }
    /// `act(x · gateᵀ) * (x · upᵀ)`: the feed-forward block's input to `reader` (its down projection).
    /// Nothing else reads the two products, so a backend may make them in one launch and keep them in
    /// a narrower form; the default is `matmuls` then `gated`.
    fn gated_products(
        &self,
        x: &Self::Act,
        gate: &Matrix,
        up: &Matrix,
        act: Activation,
        reader: &Matrix,
    ) -> Result<Self::Act, ModelError> {
        let [mut g, u] = exactly(self.matmuls(&[gate, up], x)?)?;
        self.gated(&mut g, &u, act, reader)?;
        Ok(g)
    }
    /// A mixture-of-experts block over the pre-normed rows `x` (`moe::Routing` says which experts
    /// each row reads and with what weights; `moe::combine` how their outputs sum): each routed
    /// expert's gated MLP over the rows that chose it. A row's result must not depend on the other
    /// rows of the pass.
    fn expert_ffn(
        &self,
        layer: usize,
        x: &Self::Act,
        experts: &ExpertFfn,
        moe: &MoeConfig,
        act: Activation,
    ) -> Result<Self::Act, ModelError>;
    /// A new activation of the listed rows, in order.
    fn gather_rows(&self, x: &Self::Act, rows: &[usize]) -> Result<Self::Act, ModelError>;
    fn to_host(&self, x: Self::Act) -> Result<Vec<f32>, ModelError>;
    /// A pass's logits on the host, span by span: `x` holds `rows[i]` rows for span i, in order. The
    /// default copies them out with `to_host` and splits them; a GPU backend lends page-locked memory
    /// instead.
    fn logits_to_host(&self, x: Self::Act, rows: &[usize]) -> Result<Vec<Logits>, ModelError> {
        split_logits(self.to_host(x)?, rows)
    }
}

/// `all` (every span's rows of logits, in order) as one `Logits` a span: `rows[i]` rows for span i.
pub fn split_logits(all: Vec<f32>, rows: &[usize]) -> Result<Vec<Logits>, ModelError> {
    if let [_] = rows {
        return Ok(vec![Logits::from(all)]);
    }
    let total: usize = rows.iter().sum();
    if total == 0 || !all.len().is_multiple_of(total) {
        return Err(ModelError::Kernel(format!(
            "{} logits do not split into {total} rows",
            all.len()
        )));
    }
    let n_vocab = all.len() / total;
    let mut rest = all.as_slice();
    let mut out = Vec::with_capacity(rows.len());
    for &n in rows {
        let (mine, after) = rest.split_at(n * n_vocab);
        out.push(Logits::from(mine.to_vec()));
        rest = after;
    }
    Ok(out)
}

/// A layer's projections before RoPE (and before their per-head norms, when it has them), and its
/// attention output.
pub struct QkvRows<'a, A> {
    pub q: &'a mut A,
    pub k: &'a mut A,
    pub v: &'a A,
    pub out: &'a mut A,
    pub head_norms: Option<HeadNorms<'a>>,
}

/// QK-norm (Gemma 3, Qwen3): an RMS norm over each `head_dim`-wide head of q and of k, applied
/// before RoPE (`Backend::rms_norm` with that group).
#[derive(Clone, Copy)]
pub struct HeadNorms<'a> {
    pub q: &'a Norm,
    pub k: &'a Norm,
    pub head_dim: usize,
}

/// The activations one attention call reads and writes.
pub struct AttendRows<'a, A> {
    pub q: &'a A,
    pub k: &'a A,
    pub v: &'a A,
    pub out: &'a mut A,
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
    fn logits_split_span_by_span_and_a_mismatch_is_an_error() {
        // Three spans of a 2-word vocabulary: one row, none, two rows.
        let all: Vec<f32> = (0..6).map(|x| x as f32).collect();
        let spans = split_logits(all.clone(), &[1, 0, 2]).unwrap();
        let got: Vec<Vec<f32>> = spans.iter().map(|l| l.to_vec()).collect();
        assert_eq!(got, vec![vec![0.0, 1.0], vec![], vec![2.0, 3.0, 4.0, 5.0]]);
        // One span takes the vector whole.
        assert_eq!(split_logits(all.clone(), &[3]).unwrap()[0].len(), 6);
        assert!(split_logits(all, &[2, 2]).is_err(), "6 logits are not 4 rows");
    }
}
