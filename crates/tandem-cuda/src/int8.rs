//! Launchers of the integer decode route (`kernels/mmvq.cu`): activations quantized to int8 as the CPU
//! backend quantizes them, weights repacked once into aligned blocks where their ggml layout is not,
//! and matvecs that multiply the two with `dp4a`.

use cudarc::driver::{CudaSlice, PushKernelArg};
use tandem_gguf::GgmlType;

use crate::device::{driver, Gpu};
use crate::launch::{blocks, i32_of, launch_cfg};
use crate::routes::MV_BATCH;
use crate::CudaError;

/// How activation rows are quantized for the integer kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActQuant {
    /// 256-element blocks, f32 scale, sums of each 16 quants (for K-quant weights).
    Q8K,
    /// 32-element blocks, scale rounded to f16 (for Q8_0 weights).
    Q8,
}

impl ActQuant {
    pub fn block(self) -> usize {
        match self {
            ActQuant::Q8K => 256,
            ActQuant::Q8 => 32,
        }
    }

    /// Bytes of `t` quantized rows of `cols`: quants, then (Q8_K) sums of 16, then block scales.
    pub fn bytes(self, t: usize, cols: usize) -> usize {
        let sums = match self {
            ActQuant::Q8K => t * (cols / 16) * 4,
            ActQuant::Q8 => 0,
        };
        t * cols + t * (cols / self.block()) * 4 + sums
    }
}

/// The activation format of a weight type's integer kernel, or `None` when it has none.
pub fn int8_format(ty: GgmlType) -> Option<ActQuant> {
    match ty {
        GgmlType::Q4_K | GgmlType::Q6_K => Some(ActQuant::Q8K),
        GgmlType::Q8_0 => Some(ActQuant::Q8),
        _ => None,
    }
}

/// Quantizes `t` rows of `cols` f32 activations into `out` (at least `fmt.bytes(t, cols)` bytes).
pub fn quantize_act_into(
    gpu: &Gpu,
    fmt: ActQuant,
    x: &CudaSlice<f32>,
    t: usize,
    cols: usize,
    out: &mut CudaSlice<u8>,
) -> Result<(), CudaError> {
    let (n, c) = (i32_of(t, "t")?, i32_of(cols, "cols")?);
    let (name, cfg) = match fmt {
        ActQuant::Q8K => ("quantize_q8k", launch_cfg(((cols / 256) as u32, t as u32, 1), 256)),
        ActQuant::Q8 => ("quantize_q8", launch_cfg((blocks(cols / 32, 4), t as u32, 1), 128)),
    };
    let f = gpu.function(name)?;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(x).arg(out).arg(&n).arg(&c);
    driver(name, unsafe { b.launch(cfg) })?;
    Ok(())
}

/// The weights in the layout the integer kernel reads: a new buffer of the same size for Q6_K and
/// Q8_0 (aligned quant blocks, scales in a table after all rows), `None` where the ggml layout is
/// read as it is (Q4_K).
pub fn repack(
    gpu: &Gpu,
    ty: GgmlType,
    w: &CudaSlice<u8>,
    rows: usize,
    cols: usize,
) -> Result<Option<CudaSlice<u8>>, CudaError> {
    // (blocks, block bytes, quant offset, quant bytes, scale offset): see `repack_scales_out`.
    let (n_blocks, block_bytes, quant_off, quant_len, scale_off) = match ty {
        GgmlType::Q6_K => (rows * (cols / 256), 210, 0, 208, 208),
        GgmlType::Q8_0 => (rows * (cols / 32), 34, 2, 32, 0),
        _ => return Ok(None),
    };
    let mut out = gpu.alloc_out::<u8>(w.len())?;
    let n = n_blocks as u64;
    let f = gpu.function("repack_scales_out")?;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(w).arg(&mut out).arg(&n);
    b.arg(&block_bytes).arg(&quant_off).arg(&quant_len).arg(&scale_off);
    driver("repack_scales_out", unsafe {
        b.launch(launch_cfg((blocks(n_blocks, 256), 1, 1), 256))
    })?;
    Ok(Some(out))
}

/// `out[t] = W · x[t]` from weights `w` (integer-route layout) and quantized activations `a`.
#[allow(clippy::too_many_arguments)]
pub fn mmvq_into(
    gpu: &Gpu,
    suffix: &str,
    w: &CudaSlice<u8>,
    a: &CudaSlice<u8>,
    t: usize,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    // One row takes the single kernel, more the batched one: same sums, same bits.
    let (name, per_block) = if t > 1 {
        (format!("mmvqb_{suffix}"), MV_BATCH)
    } else {
        (format!("mmvq_{suffix}"), 1)
    };
    let f = gpu.function(&name)?;
    let (r, c, n) = (i32_of(rows, "rows")?, i32_of(cols, "cols")?, i32_of(t, "t")?);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(w).arg(a).arg(out).arg(&r).arg(&c).arg(&n);
    driver(&name, unsafe {
        b.launch(launch_cfg((blocks(rows, 4), blocks(t, per_block), 1), 128))
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_activation_sizes_cover_quants_scales_and_sums() {
        // 2 rows of 512: 1024 quants, 4 f32 scales, 64 sums of 16.
        assert_eq!(ActQuant::Q8K.bytes(2, 512), 1024 + 16 + 256);
        // 2 rows of 64: 128 quants, 4 f32 scales, no sums.
        assert_eq!(ActQuant::Q8.bytes(2, 64), 128 + 16);
    }

    #[test]
    fn only_types_with_a_dp4a_kernel_take_the_integer_route() {
        assert_eq!(int8_format(GgmlType::Q4_K), Some(ActQuant::Q8K));
        assert_eq!(int8_format(GgmlType::Q6_K), Some(ActQuant::Q8K));
        assert_eq!(int8_format(GgmlType::Q8_0), Some(ActQuant::Q8));
        assert_eq!(int8_format(GgmlType::Q5_K), None);
        assert_eq!(int8_format(GgmlType::F16), None);
    }
}
