//! Kernel launchers shared by the backend, the load-time tuning and the kernel tests: each takes
//! device buffers and shapes, checks its sizes fit the kernels' ints, and reports failures as
//! `CudaError` naming the kernel.

use std::ffi::c_void;

use cudarc::cublas::{result::gemm_ex, sys as blas};
use cudarc::driver::{CudaSlice, CudaView, DevicePtr, DevicePtrMut, PushKernelArg};
use tandem_gguf::GgmlType;

use crate::matmul::kinds::MatvecFamily;
use crate::routes::MV_BATCH;
use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::runtime::grid::blocks;
use crate::runtime::grid::i32_of;
use crate::runtime::grid::launch_cfg;
use crate::CudaError;

/// The kernel-name suffix of a weight type, or `None` when no CUDA kernel reads it.
pub fn type_suffix(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::BF16 => "bf16",
        GgmlType::Q4_0 => "q4_0",
        GgmlType::Q4_1 => "q4_1",
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q4_K => "q4_k",
        GgmlType::Q5_K => "q5_k",
        GgmlType::Q6_K => "q6_k",
        _ => return None,
    })
}

/// `out[t] = W · x[t]` with the matvec kernel for weight type `suffix` (see `routes`).
#[allow(clippy::too_many_arguments)]
pub fn matvec_into(
    gpu: &Gpu,
    family: MatvecFamily,
    suffix: &str,
    w: &CudaView<'_, u8>,
    x: &CudaSlice<f32>,
    t: usize,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    // One row of activations takes the single kernel, more the batched one: same sums, same bits.
    let batched = t > 1;
    let name = format!("{}{suffix}", family.prefix(batched));
    let per_block = if batched { MV_BATCH } else { 1 };
    let f = gpu.function(&name)?;
    let (r, c, n) = (i32_of(rows, "rows")?, i32_of(cols, "cols")?, i32_of(t, "t")?);
    let mut b = gpu.launch_builder(f)?;
    b.arg(w).arg(x).arg(out).arg(&r).arg(&c).arg(&n);
    let row_blocks = match family {
        MatvecFamily::Segmented => rows as u32,
        MatvecFamily::WarpPerRow | MatvecFamily::Lanewise => blocks(rows, 4),
    };
    driver(&name, unsafe {
        b.launch(launch_cfg((row_blocks, blocks(t, per_block), 1), 128))
    })?;
    Ok(())
}

/// Dequantizes a whole matrix of type `suffix` to f16 (the GEMM route's operand).
pub fn dequant_f16(
    gpu: &Gpu,
    suffix: &str,
    w: &CudaSlice<u8>,
    rows: usize,
    cols: usize,
) -> Result<CudaSlice<u16>, CudaError> {
    let mut out = gpu.alloc_out::<u16>(rows * cols)?;
    let f = gpu.function(&format!("dequant_f16_{suffix}"))?;
    let units = rows * (cols / 32);
    let (r, c) = (i32_of(rows, "rows")?, i32_of(cols, "cols")?);
    let mut b = gpu.launch_builder(f)?;
    b.arg(w).arg(&mut out).arg(&r).arg(&c);
    driver(&format!("dequant_f16_{suffix}"), unsafe {
        b.launch(launch_cfg((blocks(units, 256), 1, 1), 256))
    })?;
    Ok(out)
}

/// The first `n` values of `x` rounded to f16 into `out` (a tensor-core GEMM operand).
pub fn to_f16_into(gpu: &Gpu, x: &CudaView<'_, f32>, out: &mut CudaSlice<u16>, n: usize) -> Result<(), CudaError> {
    let f = gpu.function("to_f16")?;
    let mut b = gpu.launch_builder(f)?;
    let n64 = n as u64;
    b.arg(x).arg(out).arg(&n64);
    driver("to_f16", unsafe { b.launch(launch_cfg((blocks(n, 256), 1, 1), 256)) })?;
    Ok(())
}

/// Most parts `split_columns_into` cuts a row into (the kernel's three outputs).
const SPLIT_PARTS: usize = 3;

/// Whether `split_columns_into` can cut rows into parts of these widths: one to three parts, each
/// a whole number of the kernel's float4s.
pub fn splits_into(widths: &[usize]) -> bool {
    !widths.is_empty() && widths.len() <= SPLIT_PARTS && widths.iter().all(|w| w.is_multiple_of(4))
}

/// Rows of `src` (`rows` of the parts' widths summed) cut into `parts`: part i gets the i-th run of
/// `parts[i].1` columns of each row (q, k and v from one stacked GEMM). Widths are multiples of 4.
pub fn split_columns_into(
    gpu: &Gpu,
    src: &CudaSlice<f32>,
    rows: usize,
    parts: &mut [(&mut CudaSlice<f32>, usize)],
) -> Result<(), CudaError> {
    let widths: Vec<usize> = parts.iter().map(|p| p.1).collect();
    let width: usize = widths.iter().sum();
    let fits = splits_into(&widths)
        && parts.iter().all(|(out, w)| out.len() >= rows * w)
        && src.len() >= rows * width
        && rows <= u16::MAX as usize;
    if !fits {
        return Err(CudaError::Driver {
            what: "split_columns".into(),
            err: format!(
                "{rows} rows of {width} into {} parts of widths {widths:?} (at most {SPLIT_PARTS}, multiples of 4)",
                parts.len()
            ),
        });
    }
    let n = parts.len();
    let widths: Vec<i32> = (0..SPLIT_PARTS)
        .map(|i| widths.get(i).map_or(Ok(0), |&w| i32_of(w, "split width")))
        .collect::<Result<_, _>>()?;
    let f = gpu.function("split_columns")?;
    let mut b = gpu.launch_builder(f)?;
    b.arg(src);
    for ((out, _), w) in parts.iter_mut().zip(&widths) {
        b.arg(&mut **out).arg(w);
    }
    // An absent part gets width 0, so the kernel never writes through its pointer (src's).
    for w in &widths[n..] {
        b.arg(src).arg(w);
    }
    let grid = (blocks(width / 4, 256), rows as u32, 1);
    driver("split_columns", unsafe { b.launch(launch_cfg(grid, 256)) })?;
    Ok(())
}

/// `out[t] = W16 · f16(x[t])` through cuBLAS GemmEx: f16 operands, f32 accumulation and output.
/// `x16` (at least `t * cols` elements) receives the f16 activations.
#[allow(clippy::too_many_arguments)]
pub fn gemm_into(
    gpu: &Gpu,
    w16: &CudaView<'_, u16>,
    x: &CudaSlice<f32>,
    x16: &mut CudaSlice<u16>,
    t: usize,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    to_f16_into(gpu, &x.as_view(), x16, t * cols)?;
    gemm_f16_into(gpu, w16, x16, t, rows, cols, out)
}

/// `out[t] = W16 · x16[t]` for activations already in f16.
pub fn gemm_f16_into(
    gpu: &Gpu,
    w16: &CudaView<'_, u16>,
    x16: &CudaSlice<u16>,
    t: usize,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    let (c, _gc) = out.device_ptr_mut(&gpu.stream);
    let out = GemmOut {
        ptr: c,
        ty: blas::cudaDataType_t::CUDA_R_32F,
        ld: rows,
    };
    // SAFETY: `out` holds `t * rows` f32 values (checked by the callers' pool sizes), row-major.
    unsafe { gemm_f16_raw(gpu, w16, x16, t, rows, cols, out) }
}

/// `out[t][offset..offset + rows] = W16 · x16[t]`, rounded to f16, in rows of `ld` values: a product
/// written beside another in one buffer (gate and up, for the gating kernel that reads both).
#[allow(clippy::too_many_arguments)]
pub fn gemm_f16_out(
    gpu: &Gpu,
    w16: &CudaView<'_, u16>,
    x16: &CudaSlice<u16>,
    t: usize,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<u16>,
    offset: usize,
    ld: usize,
) -> Result<(), CudaError> {
    if offset + rows > ld || out.len() < t * ld {
        return Err(CudaError::Driver {
            what: format!("cublasGemmEx {rows}x{cols} by {t}"),
            err: format!("{} f16 outputs cannot hold rows of {ld} at offset {offset}", out.len()),
        });
    }
    let (c, _gc) = out.device_ptr_mut(&gpu.stream);
    let out = GemmOut {
        ptr: c + 2 * offset as u64,
        ty: blas::cudaDataType_t::CUDA_R_16F,
        ld,
    };
    // SAFETY: checked above: every written element lies inside `out`.
    unsafe { gemm_f16_raw(gpu, w16, x16, t, rows, cols, out) }
}

/// Where a GEMM writes: `t` rows of `ld` elements of type `ty` from `ptr`.
struct GemmOut {
    ptr: u64,
    ty: blas::cudaDataType_t,
    ld: usize,
}

/// cuBLAS GemmEx: f16 operands, f32 accumulation. Unsafe: `out` must hold `t` rows of `out.ld`.
unsafe fn gemm_f16_raw(
    gpu: &Gpu,
    w16: &CudaView<'_, u16>,
    x16: &CudaSlice<u16>,
    t: usize,
    rows: usize,
    cols: usize,
    out: GemmOut,
) -> Result<(), CudaError> {
    let stream = &gpu.stream;
    let (alpha, beta) = (1f32, 0f32);
    let (a, _ga) = w16.device_ptr(stream);
    let (bx, _gb) = x16.device_ptr(stream);
    // Column-major view: C (rows × t) = Wᵀ (W is cols × rows column-major) · X (cols × t).
    unsafe {
        gemm_ex(
            *gpu.blas.handle(),
            blas::cublasOperation_t::CUBLAS_OP_T,
            blas::cublasOperation_t::CUBLAS_OP_N,
            i32_of(rows, "rows")?,
            i32_of(t, "t")?,
            i32_of(cols, "cols")?,
            &alpha as *const f32 as *const c_void,
            a as *const c_void,
            blas::cudaDataType_t::CUDA_R_16F,
            i32_of(cols, "lda")?,
            bx as *const c_void,
            blas::cudaDataType_t::CUDA_R_16F,
            i32_of(cols, "ldb")?,
            &beta as *const f32 as *const c_void,
            out.ptr as *mut c_void,
            out.ty,
            i32_of(out.ld, "ldc")?,
            blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| CudaError::Blas {
        what: format!("cublasGemmEx {rows}x{cols} by {t}"),
        err: format!("{e:?}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_columns_takes_one_to_three_parts_of_whole_float4s() {
        assert!(splits_into(&[4096, 1024, 1024]));
        assert!(splits_into(&[384, 128]));
        assert!(splits_into(&[8]));
        assert!(!splits_into(&[]));
        assert!(!splits_into(&[4, 4, 4, 4]), "more parts than the kernel's outputs");
        assert!(!splits_into(&[4096, 1026]), "a part not a whole number of float4s");
    }
}
