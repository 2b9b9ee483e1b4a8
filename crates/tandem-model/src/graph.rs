//! The layer graph, written once for any number of rows.
//!
//! A forward pass takes a batch of rows (one or more sequences, each a run of consecutive positions) and
//! walks every layer over all rows at once. The graph never asks how many rows there are: the backend's
//! matmul takes the decode route (matvec) for one row and the GEMM route for many, and attention runs
//! per query row. Llama and Gemma 3 differ only in the switches of `ModelConfig` (QK-norm, sandwich norms,
//! embedding scale, activation, RoPE style and per-layer window), which mirror llama.cpp's builders.

use tandem_backend::cpu::attention::{attend, AttentionShape};
use tandem_backend::cpu::ops::{self, rope_angles, rope_row};

use crate::config::Activation;
use crate::kv::{SequenceKv, StagingBuffers};
use crate::{Model, ModelError};

/// Which rows of a sequence's chunk produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitRows {
    None,
    Last,
    All,
}

/// One sequence's share of a batch: its cache, its new tokens (at positions `kv.len()..`), and which
/// logits it wants.
pub struct Span<'a> {
    pub kv: &'a mut SequenceKv,
    pub tokens: &'a [u32],
    pub logits: LogitRows,
}

/// Scratch reused across forward passes.
#[derive(Default)]
pub struct Workspace {
    staging: StagingBuffers,
}

/// Row-major f32 activations: `rows` rows of `width`.
pub(crate) struct Rows {
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

    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        &mut self.data[r * self.width..(r + 1) * self.width]
    }
}

impl Model {
    /// RMS norm of every `group`-wide slice of every row, times `weight`, rows spread over the pool.
    fn norm(&self, x: &mut Rows, group: usize, weight: &[f32]) {
        let width = x.width;
        let eps = self.config.eps;
        ops::par_rows(&self.pool, &mut x.data, width, &|_, row| {
            ops::rms_norm(row, group, Some(weight), eps)
        });
    }

    fn matmul(&self, m: &crate::weights::Matrix, x: &Rows) -> Result<Rows, ModelError> {
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

    /// Runs the layer graph over every span's tokens; returns, per span, the logits of the rows it asked
    /// for (`rows × n_vocab`, row-major).
    pub fn forward(&self, ws: &mut Workspace, spans: &mut [Span]) -> Result<Vec<Vec<f32>>, ModelError> {
        let c = &self.config;
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
            return Ok(spans.iter().map(|_| Vec::new()).collect());
        }

        let mut x = self.embed(spans)?;
        let attn_shape = |window| AttentionShape {
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            scale: c.attn_scale,
            window,
        };
        for (l, (lw, spec)) in self.weights.layers.iter().zip(&c.layers).enumerate() {
            // Attention block.
            let mut h = Rows {
                data: x.data.clone(),
                width: c.d_model,
            };
            ops::rms_norm(&mut h.data, c.d_model, Some(&lw.attn_norm), c.eps);
            let mut q = self.matmul(&lw.wq, &h)?;
            let mut k = self.matmul(&lw.wk, &h)?;
            let v = self.matmul(&lw.wv, &h)?;
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                self.norm(&mut q, c.head_dim, qn);
                self.norm(&mut k, c.head_dim, kn);
            }
            for rows in [&mut q, &mut k] {
                let width = rows.width;
                ops::par_rows(&self.pool, &mut rows.data, width, &|r, row| {
                    let mut angles = Vec::with_capacity(spec.rope.n_rot / 2);
                    rope_angles(positions[r], &spec.rope, &mut angles);
                    rope_row(row, c.head_dim, &angles, spec.rope.style);
                });
            }
            let mut attn = Rows::zeros(t, c.q_width());
            let shape = attn_shape(spec.window);
            for (span, rows) in spans.iter_mut().zip(&span_rows) {
                let (qw, kw) = (c.q_width(), c.kv_width());
                let q_rows = &q.data[rows.start * qw..rows.end * qw];
                let out_rows = &mut attn.data[rows.start * qw..rows.end * qw];
                let pos = &positions[rows.clone()];
                span.kv.layers[l].store_and_attend(
                    &k.data[rows.start * kw..rows.end * kw],
                    &v.data[rows.start * kw..rows.end * kw],
                    rows.len(),
                    &mut ws.staging,
                    |view| attend(&self.pool, q_rows, pos, view, &shape, out_rows),
                )?;
            }
            let mut o = self.matmul(&lw.wo, &attn)?;
            if let Some(n) = &lw.post_attn_norm {
                self.norm(&mut o, c.d_model, n);
            }
            ops::add_in_place(&mut x.data, &o.data);

            // Feed-forward block.
            let mut h = Rows {
                data: x.data.clone(),
                width: c.d_model,
            };
            ops::rms_norm(&mut h.data, c.d_model, Some(&lw.ffn_norm), c.eps);
            let mut gate = self.matmul(&lw.gate, &h)?;
            let up = self.matmul(&lw.up, &h)?;
            let act = match c.activation {
                Activation::Silu => ops::silu,
                Activation::GeluTanh => ops::gelu_tanh,
            };
            let d_ff = gate.width;
            ops::par_rows(&self.pool, &mut gate.data, d_ff, &|r, row| {
                ops::gated(row, &up.data[r * d_ff..][..d_ff], act)
            });
            let mut f = self.matmul(&lw.down, &gate)?;
            if let Some(n) = &lw.post_ffn_norm {
                self.norm(&mut f, c.d_model, n);
            }
            ops::add_in_place(&mut x.data, &f.data);
        }

        // Logits for the rows each span asked for.
        let mut out = Vec::with_capacity(spans.len());
        for (span, rows) in spans.iter().zip(&span_rows) {
            let picked: Vec<usize> = match span.logits {
                LogitRows::None => vec![],
                LogitRows::Last => vec![rows.end - 1],
                LogitRows::All => rows.clone().collect(),
            };
            if picked.is_empty() {
                out.push(Vec::new());
                continue;
            }
            let mut h = Rows::zeros(picked.len(), c.d_model);
            for (i, &r) in picked.iter().enumerate() {
                h.row_mut(i)
                    .copy_from_slice(&x.data[r * c.d_model..(r + 1) * c.d_model]);
            }
            ops::rms_norm(&mut h.data, c.d_model, Some(&self.weights.output_norm), c.eps);
            out.push(self.matmul(&self.weights.output, &h)?.data);
        }
        Ok(out)
    }

    /// Token embeddings (dequantized rows of `token_embd`), scaled for Gemma.
    fn embed(&self, spans: &[Span]) -> Result<Rows, ModelError> {
        let c = &self.config;
        let table = &self.weights.token_embd;
        let bytes = table.bytes(&self.file);
        let row_bytes = table.row_bytes();
        let n_rows: usize = spans.iter().map(|s| s.tokens.len()).sum();
        let mut x = Rows::zeros(n_rows, c.d_model);
        for (r, &id) in spans.iter().flat_map(|s| s.tokens).enumerate() {
            let id = id as usize;
            if id >= table.rows {
                return Err(ModelError::Token {
                    id: id as u32,
                    n_vocab: table.rows,
                });
            }
            tandem_quant::dequantize_row(table.ty, &bytes[id * row_bytes..(id + 1) * row_bytes], x.row_mut(r))
                .map_err(|e| ModelError::Kernel(format!("token_embd.weight: {e}")))?;
            if let Some(s) = c.embed_scale {
                ops::scale_in_place(x.row_mut(r), s);
            }
        }
        Ok(x)
    }
}
