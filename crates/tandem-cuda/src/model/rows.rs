//! The model's row ops (`ops/rows.rs`): norms, RoPE and gating in each mode.

use cudarc::driver::PushKernelArg;
use tandem_model::config::Activation;
use tandem_model::config::RopeParams;
use tandem_model::weights::{Matrix, Norm};
use tandem_model::ModelError;

use crate::matmul::kinds::ActQuant;
use crate::model::{CudaModel, GpuAct, Mode};
use crate::ops::rows::add_norm_rows_into;
use crate::ops::rows::quant_flag;
use crate::ops::rows::residual_flags;
use crate::ops::rows::rope_into;
use crate::ops::rows::NORM_THREADS;
use crate::ops::rows::RNR_VECS;
use crate::ops::rows::RN_F16;
use crate::ops::rows::RN_MAX_Q8K_WIDTH;
use crate::ops::rows::RN_NORM;
use crate::runtime::checked::driver;
use crate::runtime::grid::{blocks, i32_of, launch_cfg};

impl CudaModel {
    /// One `add_norm_to` launch: `x += y` (normed by `post` when given) when `y` is given, then (when
    /// `norm` is given) a new activation `norm(x)`, also quantized when the matrices reading it take
    /// the integer route. The caller has cleared `x`'s quantized forms if `y` changes it.
    pub(crate) fn residual_norm(
        &self,
        x: &GpuAct,
        y: Option<&GpuAct>,
        post: Option<&Norm>,
        norm: Option<&Norm>,
    ) -> Result<Option<GpuAct>, ModelError> {
        let name = match (y.is_some(), norm.is_some()) {
            (true, true) => "add_and_norm",
            (true, false) => "add_normed",
            _ => "normed",
        };
        let readers = norm.and_then(|n| self.weights.norm_readers.get(&n.name));
        // Every reader takes the GEMM route: the f16 operand is the only output (`add_norm_rows`).
        let gemm_only = !self.dry()
            && readers.is_some_and(|rs| rs.iter().all(|r| self.f16_input(r, x.rows)))
            && x.width.is_multiple_of(4)
            && x.width <= 1024 * RNR_VECS;
        if gemm_only {
            return self.profiled(name, || self.residual_norm_rows(x, y, post, norm).map(Some));
        }
        self.profiled(name, || {
            let mut out = match norm {
                Some(_) => Some(self.act(x.rows, x.width)?),
                None => None,
            };
            if self.dry() {
                return Ok(out);
            }
            let first_reader = readers.and_then(|rs| rs.first());
            // Q8_K rows are staged in the kernel's shared memory (`RN_MAX_Q8K_WIDTH`).
            let quant = first_reader
                .and_then(|reader| self.int8_input(reader, x.rows))
                .filter(|&fmt| fmt != ActQuant::Q8K || x.width <= RN_MAX_Q8K_WIDTH);
            let mut flags = residual_flags(y.is_some(), post.is_some());
            if norm.is_some() {
                flags |= RN_NORM;
            }
            if let Some(fmt) = quant {
                flags |= quant_flag(fmt);
            }
            // Otherwise rounded to f16 here when its readers take the GEMM route.
            let half = quant.is_none() && first_reader.is_some_and(|reader| self.f16_input(reader, x.rows));
            if half {
                flags |= RN_F16;
            }
            let may_allocate = self.pass.mode.get() == Mode::Normal;
            let mut a = match quant {
                Some(fmt) => Some(
                    self.buffers
                        .u8_pool
                        .take(&self.gpu, fmt.bytes(x.rows, x.width), may_allocate)?,
                ),
                None => None,
            };
            let mut h = if half {
                Some(self.buffers.u16_pool.take(&self.gpu, x.rows * x.width, may_allocate)?)
            } else {
                None
            };
            // Pointers the flags leave unread stand in for absent operands.
            let any_norm = self.norm(&self.cpu.weights.output_norm)?;
            let post_w = post.map(|n| self.norm(n)).transpose()?.unwrap_or(any_norm);
            let norm_w = norm.map(|n| self.norm(n)).transpose()?.unwrap_or(any_norm);
            let (width, eps) = (i32_of(x.width, "width")?, self.cpu.config.eps);
            let n_t = i32_of(x.rows, "rows")?;
            let f = self.gpu.function("add_norm_to")?;
            let mut b = self.gpu.launch_builder(f)?;
            let x_buf = x.buf()?;
            b.arg(x_buf)
                .arg(y.map(|y| y.buf()).transpose()?.unwrap_or(x_buf))
                .arg(post_w);
            match out.as_mut() {
                Some(o) => b.arg(o.buf_mut()?),
                None => b.arg(x_buf),
            };
            b.arg(norm_w).arg(&width).arg(&eps).arg(&flags);
            let no_quants = 0u64;
            match (a.as_deref_mut(), h.as_deref_mut()) {
                (Some(a), _) => b.arg(a),
                (None, Some(h)) => b.arg(h),
                (None, None) => b.arg(&no_quants),
            };
            b.arg(&n_t);
            if !self.skips("add_norm_to") {
                driver("add_norm_to", unsafe {
                    b.launch(launch_cfg((x.rows as u32, 1, 1), NORM_THREADS))
                })?;
            }
            if let (Some(o), Some(fmt), Some(a)) = (out.as_ref(), quant, a) {
                o.int8.borrow_mut().push((fmt, a));
            }
            if let (Some(o), Some(h)) = (out.as_ref(), h) {
                *o.f16.borrow_mut() = Some(h);
            }
            Ok(out)
        })
    }

    /// `residual_norm` when every reader of the normed rows takes the GEMM route: `add_norm_rows`
    /// writes them only as the GEMMs' f16 operand. `norm` is given (the caller checked its readers).
    fn residual_norm_rows(
        &self,
        x: &GpuAct,
        y: Option<&GpuAct>,
        post: Option<&Norm>,
        norm: Option<&Norm>,
    ) -> Result<GpuAct, ModelError> {
        let norm = norm.ok_or_else(|| ModelError::Kernel("add_norm_rows without a norm".into()))?;
        let norm_w = self.norm(norm)?;
        let post_w = post.map(|n| self.norm(n)).transpose()?;
        let may_allocate = self.pass.mode.get() == Mode::Normal;
        let mut h = self.buffers.u16_pool.take(&self.gpu, x.rows * x.width, may_allocate)?;
        let y = y.map(|y| y.buf()).transpose()?;
        let shape = (x.rows, x.width, self.cpu.config.eps);
        add_norm_rows_into(&self.gpu, x.buf()?, y, post_w, norm_w, shape, &mut h)?;
        Ok(GpuAct::f16_only(x.rows, x.width, h))
    }

    /// RoPE on every head of `x` and, in the same launch, of `y`.
    pub(crate) fn rope_heads(
        &self,
        x: &mut GpuAct,
        mut y: Option<&mut GpuAct>,
        positions: &[usize],
        rope: &RopeParams,
    ) -> Result<(), ModelError> {
        // Index lists are uploaded outside the profiled span (they are in the graph's arena anyway).
        let pos = self.param(positions, "position")?;
        if self.dry() {
            return Ok(());
        }
        self.profiled("rope", || {
            let hd = self.cpu.config.head_dim;
            let (rows, xw) = (x.rows, x.width);
            let yw = y.as_ref().map_or(0, |y| y.width);
            let y = match y.as_mut() {
                Some(y) => Some(y.buf_mut()?),
                None => None,
            };
            rope_into(&self.gpu, x.buf_mut()?, y, &self.view(&pos), (rows, xw, yw, hd), rope)?;
            Ok(())
        })
    }

    /// `Backend::gated`.
    pub(crate) fn gate_rows(
        &self,
        gate: &mut GpuAct,
        up: &GpuAct,
        act: Activation,
        reader: &Matrix,
    ) -> Result<(), ModelError> {
        // Quantized here for the reader's integer kernel, when it takes one; else rounded to f16 here,
        // and kept only so, when the reader takes the GEMM route (it is the result's one reader:
        // `Backend::gated`).
        let quant = self.int8_input(&reader.name, gate.rows);
        let f16_only = quant.is_none() && self.f16_input(&reader.name, gate.rows);
        self.gate_rows_into(gate, up, act, quant, f16_only)
    }

    /// `gate = act(gate) · up`, also written quantized as `quant` where its rows are whole 256s, or
    /// written only in f16 (`f16_only`).
    pub(crate) fn gate_rows_into(
        &self,
        gate: &mut GpuAct,
        up: &GpuAct,
        act: Activation,
        quant: Option<ActQuant>,
        f16_only: bool,
    ) -> Result<(), ModelError> {
        self.profiled("gated", || {
            if self.dry() {
                return Ok(());
            }
            let a = crate::ops::ffn::gate_code(act);
            let quant = quant.filter(|_| gate.width.is_multiple_of(256));
            let may_allocate = self.pass.mode.get() == Mode::Normal;
            let Some(fmt) = quant else {
                let n = gate.rows * gate.width;
                let mut h = if f16_only {
                    Some(self.buffers.u16_pool.take(&self.gpu, n, may_allocate)?)
                } else {
                    None
                };
                let n64 = n as u64;
                let f = self.gpu.function("gated")?;
                let mut b = self.gpu.launch_builder(f)?;
                b.arg(gate.buf_mut()?).arg(up.buf()?).arg(&n64).arg(&a);
                let no_half = 0u64;
                match h.as_deref_mut() {
                    Some(h) => b.arg(h),
                    None => b.arg(&no_half),
                };
                driver("gated", unsafe {
                    b.launch(launch_cfg((blocks(n.div_ceil(4), 256), 1, 1), 256))
                })?;
                if h.is_some() {
                    // The f32 rows were not written: drop them, so that no one reads stale values.
                    gate.buf = None;
                    *gate.f16.get_mut() = h;
                }
                return Ok(());
            };
            let mut q = self
                .buffers
                .u8_pool
                .take(&self.gpu, fmt.bytes(gate.rows, gate.width), may_allocate)?;
            let qfmt = quant_flag(fmt);
            let (width, n_t) = (i32_of(gate.width, "width")?, i32_of(gate.rows, "rows")?);
            let grid = ((gate.width / 256) as u32, gate.rows as u32, 1);
            let f = self.gpu.function("gated_quant")?;
            let mut b = self.gpu.launch_builder(f)?;
            b.arg(gate.buf_mut()?)
                .arg(up.buf()?)
                .arg(&width)
                .arg(&a)
                .arg(&qfmt)
                .arg(&mut *q)
                .arg(&n_t);
            if !self.skips("gated_quant") {
                driver("gated_quant", unsafe { b.launch(launch_cfg(grid, 256)) })?;
            }
            gate.int8.get_mut().push((fmt, q));
            Ok(())
        })
    }
}
