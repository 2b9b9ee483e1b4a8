//! The CUDA backend's row kernels: the residual add with the next pre-norm, RoPE, and the gated
//! activation. The norm and gating kernels also write their output in the form its reader takes:
//! quantized for the integer matvecs, or f16 for the GEMM route.

use cudarc::driver::{CudaSlice, LaunchArgs, PushKernelArg};
use tandem_model::config::{RopeParams, RopeStyle};

use crate::matmul::kinds::ActQuant;
use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::runtime::grid::{blocks, i32_of, launch_cfg};
use crate::CudaError;

/// Threads of the `add_norm_to` kernel (`RN_THREADS` in `kernels/ops.cu`): one block a row, each
/// thread holding float4s. Fixed, so a row's sums never depend on the batch.
pub(crate) const NORM_THREADS: u32 = 512;

/// Flags of the `add_norm_to` kernel (`kernels/ops.cu`).
const RN_ADD: i32 = 1;
const RN_POST: i32 = 2;
pub(crate) const RN_NORM: i32 = 4;
const RN_Q8K: i32 = 8;
const RN_Q8: i32 = 16;
pub(crate) const RN_F16: i32 = 32;
pub(crate) const RN_MAX_Q8K_WIDTH: usize = 8192;
/// float4s an `add_norm_rows` thread holds: rows of up to 1024 × RNR_VECS values.
pub(crate) const RNR_VECS: usize = 8;
/// Heads one `rope` thread rotates (`ROPE_HEADS` in `kernels/ops.cu`).
pub(crate) const ROPE_HEADS: usize = 8;

/// The residual half of the row kernels' flags: an add when there is a `y`, normed by a post-norm
/// when there is one.
pub(crate) fn residual_flags(add: bool, post: bool) -> i32 {
    (if add { RN_ADD } else { 0 }) | (if post { RN_POST } else { 0 })
}

/// The kernels' flag for writing activations quantized as `fmt`.
pub fn quant_flag(fmt: ActQuant) -> i32 {
    match fmt {
        ActQuant::Q8K => RN_Q8K,
        ActQuant::Q8 => RN_Q8,
    }
}

/// The `rms_norm` kernel: each `group`-wide slice of `x` (its first `len` elements) normed and times
/// `weight`, in place (QK-norm: a slice per head).
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
/// `h = f16(norm(x) * weight)` for `rows × width` rows (`shape`: rows, width, eps).
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
/// integer matvecs read it).
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
        let src = crate::runtime::nvrtc::assemble(&crate::runtime::nvrtc::OPS);
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
