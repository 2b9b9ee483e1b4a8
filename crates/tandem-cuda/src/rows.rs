//! The CUDA backend's row kernels: the residual add with the next pre-norm, RoPE, and the gated
//! activation. The norm and gating kernels also write their output in the form its reader takes:
//! quantized for the integer matvecs, or f16 for the GEMM route.

use cudarc::driver::{CudaSlice, LaunchArgs, PushKernelArg};
use tandem_backend::cpu::ops::{RopeParams, RopeStyle};
use tandem_model::config::Activation;
use tandem_model::weights::{Matrix, Norm};
use tandem_model::ModelError;

use crate::device::{driver, Gpu};
use crate::int8::ActQuant;
use crate::launch::{blocks, i32_of, launch_cfg};
use crate::model::{CudaModel, GpuAct, Mode};
use crate::CudaError;

/// Threads of the `add_norm_to` kernel (`RN_THREADS` in `kernels/ops.cu`): one block a row, each
/// thread holding float4s. Fixed, so a row's sums never depend on the batch.
pub(crate) const NORM_THREADS: u32 = 512;

/// Flags of the `add_norm_to` kernel (`kernels/ops.cu`).
const RN_ADD: i32 = 1;
const RN_POST: i32 = 2;
const RN_NORM: i32 = 4;
const RN_Q8K: i32 = 8;
const RN_Q8: i32 = 16;
const RN_F16: i32 = 32;
const RN_MAX_Q8K_WIDTH: usize = 8192;
/// float4s an `add_norm_rows` thread holds: rows of up to 1024 × RNR_VECS values.
const RNR_VECS: usize = 8;
/// Heads one `rope` thread rotates (`ROPE_HEADS` in `kernels/ops.cu`).
pub(crate) const ROPE_HEADS: usize = 8;

/// The residual half of the row kernels' flags: an add when there is a `y`, normed by a post-norm
/// when there is one.
fn residual_flags(add: bool, post: bool) -> i32 {
    (if add { RN_ADD } else { 0 }) | (if post { RN_POST } else { 0 })
}

/// The kernels' flag for writing activations quantized as `fmt` (public for `tandem gpu-check`).
pub fn quant_flag(fmt: ActQuant) -> i32 {
    match fmt {
        ActQuant::Q8K => RN_Q8K,
        ActQuant::Q8 => RN_Q8,
    }
}

/// The `rms_norm` kernel: each `group`-wide slice of `x` (its first `len` elements) normed and times
/// `weight`, in place (QK-norm: a slice per head). Public for `tandem gpu-check`.
pub fn rms_norm_into(
    gpu: &Gpu,
    x: &mut CudaSlice<f32>,
    len: usize,
    weight: &CudaSlice<f32>,
    group: usize,
    eps: f32,
) -> Result<(), CudaError> {
    if group == 0 || !len.is_multiple_of(group) || x.len() < len || weight.len() < group {
        return Err(CudaError::Driver {
            what: "rms_norm".into(),
            err: format!(
                "{len} of {} elements in slices of {group} with {} weights",
                x.len(),
                weight.len()
            ),
        });
    }
    let g = i32_of(group, "group")?;
    let f = gpu.function("rms_norm")?;
    let mut b = gpu.launch_builder(f)?;
    b.arg(x).arg(weight).arg(&g).arg(&eps);
    let threads = if group >= 1024 { 256 } else { 128 };
    driver("rms_norm", unsafe {
        b.launch(launch_cfg(((len / group) as u32, 1, 1), threads))
    })?;
    Ok(())
}

/// The `add_norm_rows` kernel: `x += y` (normed by `post` when given; `y` absent: no add), then
/// `h = f16(norm(x) * weight)` for `rows × width` rows (`shape`: rows, width, eps). Public for
/// `tandem gpu-check`.
pub fn add_norm_rows_into(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    y: Option<&CudaSlice<f32>>,
    post: Option<&CudaSlice<f32>>,
    weight: &CudaSlice<f32>,
    shape: (usize, usize, f32),
    h: &mut CudaSlice<u16>,
) -> Result<(), CudaError> {
    let (rows, width, eps) = shape;
    if !width.is_multiple_of(4) || width > 1024 * RNR_VECS || x.len() < rows * width || h.len() < rows * width {
        return Err(CudaError::Driver {
            what: "add_norm_rows".into(),
            err: format!("{rows} rows of {width} (a multiple of 4, at most {})", 1024 * RNR_VECS),
        });
    }
    let flags = RN_NORM | residual_flags(y.is_some(), post.is_some());
    let w = i32_of(width, "width")?;
    let f = gpu.function("add_norm_rows")?;
    let mut b = gpu.launch_builder(f)?;
    // Pointers the flags leave unread stand in for absent operands.
    b.arg(x).arg(y.unwrap_or(x)).arg(post.unwrap_or(weight)).arg(weight);
    b.arg(&w).arg(&eps).arg(&flags).arg(h);
    driver("add_norm_rows", unsafe {
        b.launch(launch_cfg((rows as u32, 1, 1), 256))
    })?;
    Ok(())
}

/// The decode route's `add_norm_to` kernel on `rows × width` rows, as a decode step launches it
/// (`NORM_THREADS`): `x += y` (normed by `post` when given; `y` absent: no add), then `out =
/// norm(x) * weight` (`shape`: rows, width, eps), also quantized into `quants` when given (as the
/// integer matvecs read it). Public for `tandem gpu-check`.
#[allow(clippy::too_many_arguments)]
pub fn add_norm_to_into(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    y: Option<&CudaSlice<f32>>,
    post: Option<&CudaSlice<f32>>,
    weight: &CudaSlice<f32>,
    shape: (usize, usize, f32),
    out: &mut CudaSlice<f32>,
    quants: Option<(ActQuant, &mut CudaSlice<u8>)>,
) -> Result<(), CudaError> {
    let (rows, width, eps) = shape;
    // Q8_K rows are staged in the kernel's shared memory (`RN_MAX_Q8K_WIDTH`), as `residual_norm` says.
    let quant_short = quants.as_ref().is_some_and(|(fmt, a)| {
        a.len() < fmt.bytes(rows, width)
            || !width.is_multiple_of(fmt.block())
            || (*fmt == ActQuant::Q8K && width > RN_MAX_Q8K_WIDTH)
    });
    if x.len() < rows * width || out.len() < rows * width || weight.len() < width || quant_short {
        return Err(CudaError::Driver {
            what: "add_norm_to".into(),
            err: format!("{rows} rows of {width}: buffers too short, or a width the quantization cannot take"),
        });
    }
    let quant = quants.as_ref().map_or(0, |(fmt, _)| quant_flag(*fmt));
    let flags = RN_NORM | quant | residual_flags(y.is_some(), post.is_some());
    let (w, n_t) = (i32_of(width, "width")?, i32_of(rows, "rows")?);
    let f = gpu.function("add_norm_to")?;
    let mut b = gpu.launch_builder(f)?;
    // Pointers the flags leave unread stand in for absent operands.
    b.arg(x)
        .arg(y.unwrap_or(x))
        .arg(post.unwrap_or(weight))
        .arg(&mut *out)
        .arg(weight);
    b.arg(&w).arg(&eps).arg(&flags);
    let no_quants = 0u64;
    match quants {
        Some((_, a)) => b.arg(a),
        None => b.arg(&no_quants),
    };
    b.arg(&n_t);
    driver("add_norm_to", unsafe {
        b.launch(launch_cfg((rows as u32, 1, 1), NORM_THREADS))
    })?;
    Ok(())
}

/// The shape arguments every RoPE kernel (`rope`, `rope_kv_store`, `split_rope_kv_store`) takes after
/// its buffers, in their order: rows, heads of the first kind (q, or x), heads of the second (K, or
/// y), head size, n_rot; RoPE's base and frequency scale; whether pairs are NeoX's.
pub(crate) struct RopeArgs {
    ints: [i32; 5],
    floats: [f32; 2],
    neox: i32,
}

impl RopeArgs {
    pub(crate) fn new(
        rows: usize,
        heads: usize,
        more_heads: usize,
        head_dim: usize,
        rope: &RopeParams,
    ) -> Result<Self, CudaError> {
        Ok(RopeArgs {
            ints: [
                i32_of(rows, "rows")?,
                i32_of(heads, "heads")?,
                i32_of(more_heads, "heads")?,
                i32_of(head_dim, "head dim")?,
                i32_of(rope.n_rot, "n_rot")?,
            ],
            floats: [rope.freq_base, rope.freq_scale],
            neox: i32::from(rope.style == RopeStyle::Neox),
        })
    }

    pub(crate) fn push<'a>(&'a self, l: &mut LaunchArgs<'a>) {
        for i in &self.ints {
            l.arg(i);
        }
        for f in &self.floats {
            l.arg(f);
        }
        l.arg(&self.neox);
    }
}

/// The `rope` kernel (`kernels/ops.cu`): RoPE in place on every `hd`-wide head of `rows` rows of `x`
/// (`xw` wide) and of `y` (`yw` wide; none: 0), row r at position `pos[r]`.
pub fn rope_into(
    gpu: &Gpu,
    x: &mut CudaSlice<f32>,
    y: Option<&mut CudaSlice<f32>>,
    pos: &cudarc::driver::CudaView<'_, i32>,
    (rows, xw, yw, hd): (usize, usize, usize, usize),
    rope: &RopeParams,
) -> Result<(), CudaError> {
    let (nx, ny) = (xw / hd.max(1), yw / hd.max(1));
    let fits = hd > 0
        && xw.is_multiple_of(hd)
        && yw.is_multiple_of(hd)
        && x.len() >= rows * xw
        && y.as_ref().map_or(yw == 0, |y| y.len() >= rows * yw)
        && pos.len() >= rows
        && rope.n_rot.is_multiple_of(2)
        && rope.n_rot <= hd;
    if !fits {
        return Err(CudaError::Driver {
            what: "rope".into(),
            err: format!("{rows} rows of {xw} + {yw} in heads of {hd} (n_rot {})", rope.n_rot),
        });
    }
    let n = rows * (nx + ny).div_ceil(ROPE_HEADS) * (rope.n_rot / 2);
    let tail = RopeArgs::new(rows, nx, ny, hd, rope)?;
    let f = gpu.function("rope")?;
    let mut b = gpu.launch_builder(f)?;
    let no_heads = 0u64;
    b.arg(x);
    match y {
        Some(y) => b.arg(y),
        None => b.arg(&no_heads),
    };
    b.arg(pos);
    tail.push(&mut b);
    // SAFETY: the arguments match the kernel's signature in order and type, every buffer holds its
    // rows (checked above), and an absent `y` has no heads, so the kernel never reads its pointer.
    driver("rope", unsafe { b.launch(launch_cfg((blocks(n, 256), 1, 1), 256)) })?;
    Ok(())
}

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
        let readers = norm.and_then(|n| self.norm_readers.get(&n.name));
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
            let may_allocate = self.mode.get() == Mode::Normal;
            let mut a = match quant {
                Some(fmt) => Some(self.u8_pool.take(&self.gpu, fmt.bytes(x.rows, x.width), may_allocate)?),
                None => None,
            };
            let mut h = if half {
                Some(self.u16_pool.take(&self.gpu, x.rows * x.width, may_allocate)?)
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
        let may_allocate = self.mode.get() == Mode::Normal;
        let mut h = self.u16_pool.take(&self.gpu, x.rows * x.width, may_allocate)?;
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
        self.profiled("gated", || {
            if self.dry() {
                return Ok(());
            }
            let a = crate::ffn::gate_code(act);
            // Quantized here for the reader's integer kernel, when it takes one (rows in 256s).
            let quant = self
                .int8_input(&reader.name, gate.rows)
                .filter(|_| gate.width.is_multiple_of(256));
            let may_allocate = self.mode.get() == Mode::Normal;
            let Some(fmt) = quant else {
                // Rounded to f16 here, and kept only so, when the reader takes the GEMM route (it is the
                // result's one reader: `Backend::gated`).
                let n = gate.rows * gate.width;
                let mut h = if self.f16_input(&reader.name, gate.rows) {
                    Some(self.u16_pool.take(&self.gpu, n, may_allocate)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_flags_name_the_add_and_the_post_norm() {
        assert_eq!(residual_flags(false, false), 0);
        assert_eq!(residual_flags(true, false), RN_ADD);
        assert_eq!(residual_flags(true, true), RN_ADD | RN_POST);
        assert_eq!(RN_NORM | residual_flags(false, true), RN_NORM | RN_POST);
    }

    #[test]
    fn row_kernel_constants_match_the_kernels() {
        // ops.cu as NVRTC compiles it, common.cuh (where the quantization flags live) included.
        let src = crate::nvrtc::assemble(&crate::nvrtc::OPS);
        for (name, v) in [
            ("RN_ADD", RN_ADD),
            ("RN_POST", RN_POST),
            ("RN_NORM", RN_NORM),
            ("RN_Q8K", RN_Q8K),
            ("RN_Q8", RN_Q8),
            ("RN_F16", RN_F16),
            ("RN_MAX_Q8K_WIDTH", RN_MAX_Q8K_WIDTH as i32),
            ("RNR_VECS", RNR_VECS as i32),
            ("RN_THREADS", NORM_THREADS as i32),
            ("ROPE_HEADS", ROPE_HEADS as i32),
        ] {
            let value = v.to_string();
            let defined = src.lines().any(|l| {
                let words: Vec<&str> = l.split_whitespace().take(3).collect();
                words == ["#define", name, value.as_str()]
            });
            assert!(defined, "{name} = {v} in ops.cu or common.cuh");
        }
    }
}
