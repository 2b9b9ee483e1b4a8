//! `Backend` for `CudaModel`: the layer graph's ops, each in the pass's `Mode`.

use std::ops::Range;

use cudarc::driver::PushKernelArg;
use tandem_model::backend::{split_logits, AttendRows, Backend, HeadNorms, QkvRows};
use tandem_model::config::{Activation, MoeConfig, RopeParams};
use tandem_model::weights::{ExpertFfn, Matrix, Norm, Weights};
use tandem_model::{Logits, ModelConfig, ModelError, Span};

use crate::cache::kv::GpuSequenceKv;
use crate::model::CudaModel;
use crate::model::GpuAct;
use crate::model::GpuScratch;
use crate::model::Mode;
use crate::model::Param;
use crate::ops::rows::rms_norm_into;
use crate::runtime::checked::driver;
use crate::runtime::grid::{blocks, i32_of, launch_cfg};

fn no_norm_output() -> ModelError {
    ModelError::Kernel("add_norm_to made no normed output".into())
}

impl Backend for CudaModel {
    type Act = GpuAct;
    type Kv = GpuSequenceKv;
    type Scratch = GpuScratch;

    fn config(&self) -> &ModelConfig {
        &self.cpu.config
    }

    fn weights(&self) -> &Weights {
        &self.cpu.weights
    }

    fn new_kv(&self, n_ctx: usize) -> Result<GpuSequenceKv, ModelError> {
        Ok(self.new_sequence(n_ctx)?)
    }

    fn run(&self, scratch: &mut GpuScratch, spans: &mut [Span<GpuSequenceKv>]) -> Result<Vec<Logits>, ModelError> {
        self.run_with_graphs(scratch, spans)
    }

    fn embed(&self, tokens: &[u32]) -> Result<GpuAct, ModelError> {
        self.profiled("embed", || {
            let c = &self.cpu.config;
            let table = &self.cpu.weights.token_embd;
            if let Some(&id) = tokens.iter().find(|&&id| id as usize >= table.rows) {
                return Err(ModelError::Token {
                    id,
                    n_vocab: table.rows,
                });
            }
            // A pass starts here: uploads from the previous pass are not reused. Not while capturing: a
            // buffer freed during capture would become part of the graph (and fail the capture).
            if self.pass.mode.get() != Mode::Capture {
                self.pass.uploads.borrow_mut().clear();
                self.pass.plans.borrow_mut().clear();
            }
            let g = self.matrix(table)?;
            let ids: Vec<usize> = tokens.iter().map(|&t| t as usize).collect();
            let ids = self.param(&ids, "token id")?;
            if let Param::Arena(r) = &ids {
                self.pass.token_slot.set(Some(r.start));
            }
            let mut out = self.act(tokens.len(), c.d_model)?;
            if self.dry() {
                return Ok(out);
            }
            let (n, cols) = (i32_of(tokens.len(), "tokens")?, i32_of(c.d_model, "d_model")?);
            let scale = c.embed_scale.unwrap_or(1.0);
            let ids_v = self.view(&ids);
            let f = self.gpu.function(&format!("embed_{}", g.suffix))?;
            let rows = g.embedding_rows();
            let mut b = self.gpu.launch_builder(f)?;
            b.arg(&rows)
                .arg(&ids_v)
                .arg(out.buf_mut()?)
                .arg(&n)
                .arg(&cols)
                .arg(&scale);
            let units = tokens.len() * c.d_model / 32;
            driver("embed", unsafe {
                b.launch(launch_cfg((blocks(units, 256), 1, 1), 256))
            })?;
            Ok(out)
        })
    }

    fn output_rows(&self, rows: usize, width: usize) -> Result<GpuAct, ModelError> {
        Ok(self.act(rows, width)?)
    }

    fn rms_norm(&self, x: &mut GpuAct, group: usize, weight: &Norm) -> Result<(), ModelError> {
        self.profiled("rms_norm (q/k norm)", || {
            if self.dry() {
                return Ok(());
            }
            let w = self.norm(weight)?;
            let len = x.rows * x.width;
            Ok(rms_norm_into(
                &self.gpu,
                x.buf_mut()?,
                len,
                w,
                group,
                self.cpu.config.eps,
            )?)
        })
    }

    fn normed(&self, x: &GpuAct, weight: &Norm) -> Result<GpuAct, ModelError> {
        self.residual_norm(x, None, None, Some(weight))?
            .ok_or_else(no_norm_output)
    }

    fn add_normed(&self, x: &mut GpuAct, y: GpuAct, norm: Option<&Norm>) -> Result<(), ModelError> {
        // The residual is written in place: drop its quantized forms first.
        x.int8.get_mut().clear();
        self.residual_norm(x, Some(&y), norm, None).map(|_| ())
    }

    fn add_and_norm(&self, x: &mut GpuAct, y: GpuAct, post: Option<&Norm>, norm: &Norm) -> Result<GpuAct, ModelError> {
        x.int8.get_mut().clear();
        self.residual_norm(x, Some(&y), post, Some(norm))?
            .ok_or_else(no_norm_output)
    }

    fn matmul(&self, m: &Matrix, x: &GpuAct) -> Result<GpuAct, ModelError> {
        self.matmul_rows(m, x)
    }

    fn matmuls(&self, ms: &[&Matrix], x: &GpuAct) -> Result<Vec<GpuAct>, ModelError> {
        self.matmul_group(ms, x)
    }

    fn rope(&self, x: &mut GpuAct, positions: &[usize], rope: &RopeParams) -> Result<(), ModelError> {
        self.rope_heads(x, None, positions, rope)
    }

    fn rope_qk(
        &self,
        q: &mut GpuAct,
        k: &mut GpuAct,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        self.rope_heads(q, Some(k), positions, rope)
    }

    fn store_and_attend(
        &self,
        scratch: &mut GpuScratch,
        layer: usize,
        kv: &mut GpuSequenceKv,
        io: AttendRows<'_, GpuAct>,
        rows: Range<usize>,
        positions: &[usize],
    ) -> Result<(), ModelError> {
        self.store_kv_and_attend(scratch, layer, kv, io, rows, positions)
    }

    fn rope_store_and_attend(
        &self,
        scratch: &mut GpuScratch,
        layer: usize,
        spans: &mut [Span<GpuSequenceKv>],
        span_rows: &[Range<usize>],
        qkv: QkvRows<'_, GpuAct>,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        self.rope_store_attend(scratch, layer, spans, span_rows, qkv, positions, rope)
    }

    fn project_and_attend(
        &self,
        scratch: &mut GpuScratch,
        layer: usize,
        spans: &mut [Span<GpuSequenceKv>],
        span_rows: &[Range<usize>],
        x: GpuAct,
        m: [&Matrix; 3],
        out: &mut GpuAct,
        head_norms: Option<HeadNorms<'_>>,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        self.project_rope_store_attend(scratch, layer, spans, span_rows, x, m, out, head_norms, positions, rope)
    }

    fn gated(&self, gate: &mut GpuAct, up: &GpuAct, act: Activation, reader: &Matrix) -> Result<(), ModelError> {
        self.gate_rows(gate, up, act, reader)
    }

    fn gated_products(
        &self,
        x: &GpuAct,
        gate: &Matrix,
        up: &Matrix,
        act: Activation,
        reader: &Matrix,
    ) -> Result<GpuAct, ModelError> {
        self.gated_pair_products(x, gate, up, act, reader)
    }

    /// Several spans' logits (a batched decode step: tens of megabytes for the 8B's vocabulary) come
    /// back in one page-locked buffer, each span lent its rows; one span's, as `to_host` gives them.
    fn logits_to_host(&self, x: GpuAct, rows: &[usize]) -> Result<Vec<Logits>, ModelError> {
        if rows.len() < 2 || self.pass.mode.get() != Mode::Normal {
            return split_logits(self.to_host(x)?, rows);
        }
        if let Some(clock) = &self.diagnostics.pass_clock {
            clock.enqueued(&self.gpu)?;
        }
        let logits = self.lend_logit_rows(x.buf()?, rows)?;
        if let Some(p) = &self.diagnostics.profile {
            p.collect()?;
        }
        Ok(logits)
    }

    /// Routing on the device; the experts by ids on the device for decode, by rows grouped on the
    /// host for prefill; combined on the device (`experts.rs`).
    fn expert_ffn(
        &self,
        layer: usize,
        x: &GpuAct,
        experts: &ExpertFfn,
        moe: &MoeConfig,
        act: Activation,
    ) -> Result<GpuAct, ModelError> {
        self.mixture(layer, x, experts, moe, act)
    }

    fn gather_rows(&self, x: &GpuAct, rows: &[usize]) -> Result<GpuAct, ModelError> {
        self.profiled("gather_rows", || {
            let idx = self.param(rows, "row")?;
            let mut out = self.act(rows.len(), x.width)?;
            if self.dry() {
                return Ok(out);
            }
            let wi = i32_of(x.width, "width")?;
            let idx_v = self.view(&idx);
            let f = self.gpu.function("gather_rows")?;
            let mut b = self.gpu.launch_builder(f)?;
            b.arg(x.buf()?).arg(&idx_v).arg(out.buf_mut()?).arg(&wi);
            driver("gather_rows", unsafe {
                b.launch(launch_cfg((rows.len() as u32, 1, 1), 256))
            })?;
            Ok(out)
        })
    }

    fn to_host(&self, x: GpuAct) -> Result<Vec<f32>, ModelError> {
        match self.pass.mode.get() {
            Mode::Normal => {
                if let Some(clock) = &self.diagnostics.pass_clock {
                    clock.enqueued(&self.gpu)?;
                }
                let host = self.gpu.download(x.buf()?)?;
                if let Some(p) = &self.diagnostics.profile {
                    p.collect()?;
                }
                Ok(host)
            }
            // The graph's output: read after the graph runs.
            Mode::Capture => {
                *self.graphs.captured_out.borrow_mut() = x.buf;
                Ok(Vec::new())
            }
            Mode::Dry => Ok(Vec::new()),
        }
    }
}
