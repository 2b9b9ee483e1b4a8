//! The CPU backend of the layer graph: activations are row-major `Vec<f32>`, kernels come from
//! `tandem-backend` and run on the model's thread pool, the KV cache is `SequenceKv`.

use std::ops::Range;

use tandem_backend::cpu::attention::{attend, attend_decode_rows, AttentionShape, DecodeRow};
use tandem_backend::cpu::ops::{self, rope_angles, rope_row};

use crate::backend::{AttendRows, Backend, QkvRows, SequenceCache, Span};
use crate::config::{Activation, ModelConfig, MoeConfig, RopeParams};
use crate::graph;
use crate::kv::{SequenceKv, StagingBuffers};
use crate::logits::Logits;
use crate::moe::{combine, Routing};
use crate::weights::{ExpertFfn, Matrix, Norm, Weights};
use crate::{Model, ModelError};

/// Row-major f32 activations: `rows` rows of `width`.
pub struct Rows {
    pub data: Vec<f32>,
    pub width: usize,
}

impl Rows {
    pub fn zeros(rows: usize, width: usize) -> Self {
        Rows {
            data: vec![0.0; rows * width],
            width,
        }
    }

    pub fn n_rows(&self) -> usize {
        self.data.len() / self.width
    }

    fn range(&self, rows: &Range<usize>) -> Range<usize> {
        rows.start * self.width..rows.end * self.width
    }
}

/// Scratch reused across CPU forward passes.
#[derive(Default)]
pub struct Workspace {
    staging: StagingBuffers,
}

impl SequenceCache for SequenceKv {
    fn len(&self) -> usize {
        SequenceKv::len(self)
    }

    fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    fn bytes_allocated(&self) -> usize {
        SequenceKv::bytes_allocated(self)
    }

    fn bytes_at_capacity(&self) -> usize {
        SequenceKv::bytes_at_capacity(self)
    }
}

impl Model {
    fn attention_shape(&self, layer: usize) -> AttentionShape {
        let c = &self.config;
        AttentionShape {
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            scale: c.attn_scale,
            window: c.layers[layer].window,
        }
    }
}

impl Backend for Model {
    type Act = Rows;
    type Kv = SequenceKv;
    type Scratch = Workspace;

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn weights(&self) -> &Weights {
        &self.weights
    }

    fn new_kv(&self, n_ctx: usize) -> Result<SequenceKv, ModelError> {
        Ok(self.new_sequence(n_ctx))
    }

    /// The layer graph, op by op.
    fn run(&self, ws: &mut Workspace, spans: &mut [Span<SequenceKv>]) -> Result<Vec<Logits>, ModelError> {
        graph::forward(self, ws, spans)
    }

    fn embed(&self, tokens: &[u32]) -> Result<Rows, ModelError> {
        let c = &self.config;
        let table = &self.weights.token_embd;
        let bytes = table.bytes(&self.file);
        let row_bytes = table.row_bytes();
        let mut x = Rows::zeros(tokens.len(), c.d_model);
        for (row, &id) in x.data.chunks_exact_mut(c.d_model).zip(tokens) {
            let id = id as usize;
            if id >= table.rows {
                return Err(ModelError::Token {
                    id: id as u32,
                    n_vocab: table.rows,
                });
            }
            tandem_quant::dequantize_row(table.ty, &bytes[id * row_bytes..(id + 1) * row_bytes], row)
                .map_err(|e| ModelError::Kernel(format!("token_embd.weight: {e}")))?;
            if let Some(s) = c.embed_scale {
                ops::scale_in_place(row, s);
            }
        }
        Ok(x)
    }

    fn output_rows(&self, rows: usize, width: usize) -> Result<Rows, ModelError> {
        Ok(Rows::zeros(rows, width))
    }

    fn rms_norm(&self, x: &mut Rows, group: usize, weight: &Norm) -> Result<(), ModelError> {
        let width = x.width;
        let eps = self.config.eps;
        ops::par_rows(&self.pool, &mut x.data, width, &|_, row| {
            ops::rms_norm(row, group, Some(weight), eps)
        });
        Ok(())
    }

    fn matmul(&self, m: &Matrix, x: &Rows) -> Result<Rows, ModelError> {
        let mut out = Rows::zeros(x.n_rows(), m.rows);
        let w = tandem_backend::cpu::matmul::WeightMatrix {
            ty: m.ty,
            data: m.bytes(&self.file),
            rows: m.rows,
            cols: m.cols,
        };
        tandem_backend::cpu::matmul::matmul(&self.pool, &w, &x.data, x.n_rows(), &mut out.data)
            .map_err(|e| ModelError::Kernel(format!("{}: {e}", m.name)))?;
        Ok(out)
    }

    fn rope(&self, x: &mut Rows, positions: &[usize], rope: &RopeParams) -> Result<(), ModelError> {
        let width = x.width;
        let head_dim = self.config.head_dim;
        ops::par_rows(&self.pool, &mut x.data, width, &|r, row| {
            let mut angles = Vec::with_capacity(rope.n_rot / 2);
            rope_angles(positions[r], rope.n_rot, rope.freq_base, rope.freq_scale, &mut angles);
            rope_row(row, head_dim, &angles, rope.neox());
        });
        Ok(())
    }

    fn store_and_attend(
        &self,
        ws: &mut Workspace,
        layer: usize,
        kv: &mut SequenceKv,
        io: AttendRows<'_, Rows>,
        rows: Range<usize>,
        positions: &[usize],
    ) -> Result<(), ModelError> {
        let shape = self.attention_shape(layer);
        let q_rows = &io.q.data[io.q.range(&rows)];
        let out_range = io.out.range(&rows);
        let out_rows = &mut io.out.data[out_range];
        kv.layers[layer].store_and_attend(
            &io.k.data[io.k.range(&rows)],
            &io.v.data[io.v.range(&rows)],
            rows.len(),
            &mut ws.staging,
            |view| attend(&self.pool, q_rows, positions, view, &shape, out_rows),
        )
    }

    /// A batched decode step (one row of each of several sequences): the head norms and RoPE on
    /// every row, each row stored into its cache, then every row attended in one dispatch of the
    /// pool (`attend_decode_rows`), each with the bits `store_and_attend` gives it alone. Anything
    /// else: the default, each span's `store_and_attend` in turn.
    fn rope_store_and_attend(
        &self,
        ws: &mut Workspace,
        layer: usize,
        spans: &mut [Span<SequenceKv>],
        span_rows: &[Range<usize>],
        qkv: QkvRows<'_, Rows>,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        if !graph::is_decode_batch(span_rows) || span_rows.len() != spans.len() {
            return graph::rope_then_attend_each(self, ws, layer, spans, span_rows, qkv, positions, rope);
        }
        if let Some(n) = qkv.head_norms {
            graph::norm_heads(self, qkv.q, qkv.k, n)?;
        }
        self.rope_qk(qkv.q, qkv.k, positions, rope)?;
        let (qw, kw) = (qkv.q.width, qkv.k.width);
        for (i, span) in spans.iter_mut().enumerate() {
            let (k, v) = (&qkv.k.data[i * kw..(i + 1) * kw], &qkv.v.data[i * kw..(i + 1) * kw]);
            span.kv.layers[layer].store_row(k, v)?;
        }
        let views: Vec<_> = spans.iter().map(|s| s.kv.layers[layer].view()).collect();
        let q = &qkv.q.data;
        let mut rows: Vec<DecodeRow> = qkv
            .out
            .data
            .chunks_mut(qw)
            .zip(&views)
            .zip(positions)
            .enumerate()
            .map(|(i, ((out, kv), &position))| DecodeRow {
                q: &q[i * qw..(i + 1) * qw],
                position,
                kv,
                out,
            })
            .collect();
        attend_decode_rows(&self.pool, &mut rows, &self.attention_shape(layer));
        Ok(())
    }

    fn normed(&self, x: &Rows, weight: &Norm) -> Result<Rows, ModelError> {
        let mut h = Rows {
            data: x.data.clone(),
            width: x.width,
        };
        self.rms_norm(&mut h, x.width, weight)?;
        Ok(h)
    }

    fn add_normed(&self, x: &mut Rows, mut y: Rows, norm: Option<&Norm>) -> Result<(), ModelError> {
        if let Some(n) = norm {
            let width = y.width;
            self.rms_norm(&mut y, width, n)?;
        }
        ops::add_in_place(&mut x.data, &y.data);
        Ok(())
    }

    fn gated(&self, gate: &mut Rows, up: &Rows, act: Activation, _reader: &Matrix) -> Result<(), ModelError> {
        let act = match act {
            Activation::Silu => ops::silu,
            Activation::GeluTanh => ops::gelu_tanh,
        };
        let d_ff = gate.width;
        ops::par_rows(&self.pool, &mut gate.data, d_ff, &|r, row| {
            ops::gated(row, &up.data[r * d_ff..][..d_ff], act)
        });
        Ok(())
    }

    /// The router's product, then each routed expert's gated MLP over its rows (a GEMM for many, a
    /// matvec for one), then each row's weighted sum.
    fn expert_ffn(
        &self,
        _layer: usize,
        x: &Rows,
        experts: &ExpertFfn,
        moe: &MoeConfig,
        act: Activation,
    ) -> Result<Rows, ModelError> {
        let logits = self.matmul(&experts.router, x)?;
        let routing = Routing::from_logits(&logits.data, moe)?;
        let groups = routing.by_expert();
        let mut outs = Vec::with_capacity(groups.len());
        for g in &groups {
            let rows: Vec<usize> = g.rows(routing.k).collect();
            let xe = self.gather_rows(x, &rows)?;
            let (gate, up, down) = (
                &experts.gate.experts[g.expert],
                &experts.up.experts[g.expert],
                &experts.down.experts[g.expert],
            );
            let gated = self.gated_products(&xe, gate, up, act, down)?;
            outs.push(self.matmul(down, &gated)?.data);
        }
        Ok(Rows {
            data: combine(&routing, &groups, &outs, x.width)?,
            width: x.width,
        })
    }

    fn gather_rows(&self, x: &Rows, rows: &[usize]) -> Result<Rows, ModelError> {
        let w = x.width;
        let mut out = Rows::zeros(rows.len(), w);
        for (dst, &r) in out.data.chunks_exact_mut(w).zip(rows) {
            dst.copy_from_slice(&x.data[r * w..(r + 1) * w]);
        }
        Ok(out)
    }

    fn to_host(&self, x: Rows) -> Result<Vec<f32>, ModelError> {
        Ok(x.data)
    }
}
