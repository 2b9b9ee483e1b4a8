//! Kernel launchers shared by the backend, the load-time tuning and `tandem gpu-check`: each takes
//! device buffers and shapes, checks its sizes fit the kernels' ints, and reports failures as
//! `CudaError` naming the kernel.

use std::ffi::c_void;

use cudarc::cublas::{result::gemm_ex, sys as blas};
use cudarc::driver::{sys, CudaSlice, CudaView, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use tandem_gguf::GgmlType;

use crate::device::{driver, Gpu};
use crate::int8::{mmvq_group_into, mmvq_into, quantize_act_into, variants, ActQuant, MmvqTarget, MmvqVariant};
use crate::qmma;
use crate::routes::{self, BatchRoutes, MatmulRoute, MV_BATCH};
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

/// The three float matvec kernel families (`kernels/quant.cu`): same function, different summation
/// orders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatvecFamily {
    /// A block per row; warps take 1024-element segments staged in shared memory.
    Segmented,
    /// A warp per row; lanes read their units straight from global memory.
    WarpPerRow,
    /// A warp per row; lane l takes element l of every unit (coalesced loads for every layout).
    Lanewise,
}

impl MatvecFamily {
    pub fn prefix(self, batched: bool) -> &'static str {
        match (self, batched) {
            (MatvecFamily::Segmented, false) => "matvec_",
            (MatvecFamily::Segmented, true) => "matvecb_",
            (MatvecFamily::WarpPerRow, false) => "matvec2_",
            (MatvecFamily::WarpPerRow, true) => "matvec2b_",
            (MatvecFamily::Lanewise, false) => "matvec3_",
            (MatvecFamily::Lanewise, true) => "matvec3b_",
        }
    }
}

pub(crate) fn launch_cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: grid,
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per).max(1) as u32
}

pub(crate) fn i32_of(n: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(n).map_err(|_| CudaError::Driver {
        what: what.into(),
        err: format!("{n} does not fit a kernel's int"),
    })
}

/// `out[t] = W · x[t]` with the matvec kernel for weight type `suffix` (see `routes`).
#[allow(clippy::too_many_arguments)]
pub fn matvec_into(
    gpu: &Gpu,
    family: MatvecFamily,
    suffix: &str,
    w: &CudaSlice<u8>,
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

/// The kernel that takes a matrix's matvec route (decode and very short chunks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeKernel {
    /// A float matvec family over the ggml layout.
    Float(MatvecFamily),
    /// The integer (`dp4a`) kernel `variant` over the integer-route layout, activations quantized as
    /// `fmt`.
    Int8 { fmt: ActQuant, variant: MmvqVariant },
}

/// A matrix's decode choice: its matvec-route kernel, and whether cuBLAS over the f16 copy beat it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tuning {
    pub(crate) kernel: DecodeKernel,
    pub(crate) cublas: bool,
    /// The route of each batch of 2 to `routes::BATCH_TUNED_MAX_ROWS` rows (`batch_routes`).
    pub(crate) batch: BatchRoutes,
}

/// Runs `f` once, then `TUNE_ITERS` times, each after `flush` was read through; returns the GPU
/// seconds of those runs alone (CUDA events around each). A decode step streams every layer's
/// weights, so a matrix is never in L2 when its product starts: reading a buffer larger than L2 first
/// makes the timing read the weights from memory as the step does, where back-to-back launches would
/// find a small matrix (the 4096×4096 projections of an 8B model are 9 MB, L2 holds 50 MB) in L2 and
/// reward the kernel that is fastest from there. `TANDEM_CUDA_TUNE_FLUSH=0` times back to back.
const TUNE_ITERS: usize = 20;

/// Bytes read before each timed launch: more than any Hopper L2 (50-60 MB).
const L2_FLUSH_BYTES: usize = 128 << 20;

/// What `time_launches` reads between launches (`None`: back to back), and where `l2_flush` would
/// write (never does).
pub(crate) struct L2Flush {
    buf: Option<CudaSlice<u8>>,
    sink: CudaSlice<u32>,
}

impl L2Flush {
    /// Enqueues the read of the whole buffer (nothing when timing back to back).
    pub(crate) fn launch(&mut self, gpu: &Gpu) -> Result<(), CudaError> {
        let Some(buf) = &self.buf else {
            return Ok(());
        };
        let words = (L2_FLUSH_BYTES / 16) as u64;
        let mut b = gpu.launch_builder(gpu.function("l2_flush")?)?;
        b.arg(buf).arg(&words).arg(&mut self.sink);
        driver("l2_flush", unsafe {
            b.launch(launch_cfg((gpu.sm_count * 4, 1, 1), 512))
        })?;
        Ok(())
    }
}

pub(crate) fn l2_flush_buffer(gpu: &Gpu) -> Result<L2Flush, CudaError> {
    let on = std::env::var("TANDEM_CUDA_TUNE_FLUSH").map_or(true, |v| v != "0");
    Ok(L2Flush {
        buf: on.then(|| gpu.alloc_out::<u8>(L2_FLUSH_BYTES)).transpose()?,
        sink: gpu.alloc::<u32>(1)?,
    })
}

fn time_launches(
    gpu: &Gpu,
    flush: &mut L2Flush,
    f: &mut dyn FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    f()?;
    let event = || {
        driver(
            "tuning event",
            gpu.stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)),
        )
    };
    let mut marks = Vec::with_capacity(TUNE_ITERS);
    for _ in 0..TUNE_ITERS {
        flush.launch(gpu)?;
        let start = event()?;
        f()?;
        marks.push((start, event()?));
    }
    gpu.synchronize()?;
    let mut ms = 0.0;
    for (start, end) in &marks {
        ms += driver("tuning elapsed", start.elapsed_ms(end))? as f64;
    }
    Ok(ms / 1e3)
}

/// `time_launches` for a product whose input is made first, as in a decode step: `f(true)` makes the
/// input (quantizes the activations, or converts them to f16) after the flush and outside the timed
/// span, `f(false)` runs the product, timed. The input is then in L2 as the kernel before leaves it
/// in a step, and the weights are not; and the input's conversion, which a step's norm or gating
/// kernel writes in the reader's form, is not charged to the product. Timed with the conversion
/// and a cold input, the batch routes sent the 8B's v projection to cuBLAS from 3 rows (back to
/// back its staged matvec took 6.5 µs against 11.7) and kept gemma3-270m's small matrices off
/// cuBLAS; timed this way, gemma3-270m decodes 2-4 sequences 14-23% faster (staged session, c5).
fn time_with_input(
    gpu: &Gpu,
    flush: &mut L2Flush,
    f: &mut dyn FnMut(bool) -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    f(true)?;
    f(false)?;
    let event = || {
        driver(
            "tuning event",
            gpu.stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)),
        )
    };
    let mut marks = Vec::with_capacity(TUNE_ITERS);
    for _ in 0..TUNE_ITERS {
        flush.launch(gpu)?;
        f(true)?;
        let start = event()?;
        f(false)?;
        marks.push((start, event()?));
    }
    gpu.synchronize()?;
    let mut ms = 0.0;
    for (start, end) in &marks {
        ms += driver("tuning elapsed", start.elapsed_ms(end))? as f64;
    }
    Ok(ms / 1e3)
}

/// Mean seconds of `run` after an L2 flush (as a decode step meets a matrix) and right after another
/// `run` (its weights in L2 as far as they fit). A kernel barely faster hot than cold is bound by its
/// own instructions and round trips, not by memory: `tandem gpu-check --bench-l2`.
pub fn time_cold_and_hot(gpu: &Gpu, run: &mut dyn FnMut() -> Result<(), CudaError>) -> Result<[f64; 2], CudaError> {
    let mut flush = l2_flush_buffer(gpu)?;
    let cold = time_launches(gpu, &mut flush, run)?;
    Ok([cold / TUNE_ITERS as f64, time_back_to_back(gpu, run)?])
}

/// Mean seconds of `run`, run after run with nothing between (`handover.rs`, the hot half above).
pub(crate) fn time_back_to_back(gpu: &Gpu, run: &mut dyn FnMut() -> Result<(), CudaError>) -> Result<f64, CudaError> {
    let mut nothing = L2Flush {
        buf: None,
        sink: gpu.alloc::<u32>(1)?,
    };
    Ok(time_launches(gpu, &mut nothing, run)? / TUNE_ITERS as f64)
}

/// A fixed, non-zero input: timings on zeros can flatter a kernel.
fn tuning_input(gpu: &Gpu, cols: usize) -> Result<CudaSlice<f32>, CudaError> {
    let xs: Vec<f32> = (0..cols).map(|i| ((i as f32) * 0.37).sin()).collect();
    gpu.upload(&xs)
}

/// The integer variants on offer: in deterministic mode only those of one summation order (split 1),
/// so the bits a matrix gives do not depend on which variant a run's timing picked.
/// `TANDEM_CUDA_MMVQ=label,...` (labels as `--verbose` prints them, e.g. `u2r1s1p`) keeps only those
/// for the shapes where one of them fits, so a run can time the decode step with a variant the
/// load-time timing (which sees each kernel alone) would not pick.
fn offered(suffix: &str, rows: &[usize], cols: usize, deterministic: bool) -> Vec<MmvqVariant> {
    let fitting: Vec<MmvqVariant> = variants(suffix)
        .into_iter()
        .filter(|v| v.fits(rows, cols) && (!deterministic || v.split == 1))
        .collect();
    let Ok(wanted) = std::env::var("TANDEM_CUDA_MMVQ") else {
        return fitting;
    };
    let kept: Vec<MmvqVariant> = fitting
        .iter()
        .copied()
        .filter(|v| wanted.split(',').any(|w| w.trim() == v.label()))
        .collect();
    if kept.is_empty() {
        fitting
    } else {
        kept
    }
}

/// Times one-row products of this matrix with each matvec family, the integer kernel's variants
/// (when `int8` gives its format and weights) and cuBLAS over the f16 copy (when there is one), and
/// returns the fastest: "measure both, keep the faster per shape". The integer timing includes
/// quantizing the activations, which the model does once per input however many matrices read it.
/// `deterministic`: the choice is fixed by the type (the integer kernel where there is one, else
/// the warp-per-row family), so every run sums in the same order; only bit-identical variants of it
/// are timed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tune_decode(
    gpu: &Gpu,
    suffix: &str,
    w: &CudaSlice<u8>,
    int8: Option<(ActQuant, &CudaSlice<u8>)>,
    w16: Option<&CudaView<'_, u16>>,
    rows: usize,
    cols: usize,
    deterministic: bool,
) -> Result<Tuning, CudaError> {
    let x = tuning_input(gpu, cols)?;
    let mut flush = l2_flush_buffer(gpu)?;
    let mut out = gpu.alloc::<f32>(rows)?;
    let mut best = (f64::INFINITY, DecodeKernel::Float(MatvecFamily::WarpPerRow));
    let families: &[MatvecFamily] = match (deterministic, int8.is_some()) {
        (true, true) => &[],
        (true, false) => &[MatvecFamily::WarpPerRow],
        (false, _) => &[
            MatvecFamily::Segmented,
            MatvecFamily::WarpPerRow,
            MatvecFamily::Lanewise,
        ],
    };
    for &family in families {
        let secs = time_launches(gpu, &mut flush, &mut || {
            matvec_into(gpu, family, suffix, w, &x, 1, rows, cols, &mut out)
        })?;
        if secs < best.0 {
            best = (secs, DecodeKernel::Float(family));
        }
    }
    if let Some((fmt, wq)) = int8 {
        let mut a = gpu.alloc_out::<u8>(fmt.bytes(1, cols))?;
        for variant in offered(suffix, &[rows], cols, deterministic) {
            let secs = time_launches(gpu, &mut flush, &mut || {
                quantize_act_into(gpu, fmt, &x, 1, cols, &mut a)?;
                mmvq_into(gpu, suffix, variant, wq, &a, 1, rows, cols, &mut out)
            })?;
            if secs < best.0 {
                best = (secs, DecodeKernel::Int8 { fmt, variant });
            }
        }
    }
    let cublas = match w16 {
        Some(w16) => {
            let mut x16 = gpu.alloc_out::<u16>(cols)?;
            time_launches(gpu, &mut flush, &mut || {
                gemm_into(gpu, w16, &x, &mut x16, 1, rows, cols, &mut out)
            })? < best.0
        }
        None => false,
    };
    let kernel = best.1;
    let batch = if deterministic {
        BatchRoutes::MATVEC
    } else {
        let w = match kernel {
            DecodeKernel::Int8 { .. } => int8.map(|(_, wq)| wq).ok_or_else(|| CudaError::Driver {
                what: format!("{rows}x{cols} {suffix}"),
                err: "an integer kernel chosen without its layout".into(),
            })?,
            DecodeKernel::Float(_) => w,
        };
        batch_routes(gpu, &mut flush, suffix, kernel, w, w16, rows, cols)?
    };
    Ok(Tuning { kernel, cublas, batch })
}

/// For each batch of 2 to `routes::BATCH_TUNED_MAX_ROWS` rows, the fastest route this matrix has:
/// `kernel` (its one-row choice, reading `w`) batched, `qmma` where it takes the matrix
/// (`qmma::takes`), cuBLAS over the f16 copy `w16` where there is one, each timed with its input
/// made just before (`time_with_input`). Only where there is a choice is anything timed. The
/// batched matvec reads the quantized weights once but repeats its per-row
/// work; qmma and cuBLAS barely grow with the rows (cuBLAS reads 4x the bytes of Q4 weights), so the
/// winner depends on the shape and the rows.
#[allow(clippy::too_many_arguments)]
fn batch_routes(
    gpu: &Gpu,
    flush: &mut L2Flush,
    suffix: &str,
    kernel: DecodeKernel,
    w: &CudaSlice<u8>,
    w16: Option<&CudaView<'_, u16>>,
    rows: usize,
    cols: usize,
) -> Result<BatchRoutes, CudaError> {
    let quant_mma = qmma::takes(&kernel, suffix, rows);
    if w16.is_none() && !quant_mma {
        return Ok(BatchRoutes::MATVEC);
    }
    let mut routes = [MatmulRoute::Matvec; routes::BATCH_TUNED_MAX_ROWS + 1];
    for t in 2..=routes::BATCH_TUNED_MAX_ROWS {
        let x = tuning_input(gpu, t * cols)?;
        let mut out = gpu.alloc_out::<f32>(t * rows)?;
        let mut best = match kernel {
            DecodeKernel::Int8 { fmt, variant } => {
                let mut a = gpu.alloc_out::<u8>(fmt.bytes(t, cols))?;
                let matvec = time_with_input(gpu, flush, &mut |input| match input {
                    true => quantize_act_into(gpu, fmt, &x, t, cols, &mut a),
                    false => mmvq_into(gpu, suffix, variant, w, &a, t, rows, cols, &mut out),
                })?;
                let mut best = (matvec, MatmulRoute::Matvec);
                if quant_mma {
                    let secs = time_with_input(gpu, flush, &mut |input| match input {
                        true => quantize_act_into(gpu, fmt, &x, t, cols, &mut a),
                        false => {
                            let mut targets = [MmvqTarget { w, rows, out: &mut out }];
                            qmma::qmma_group_into(gpu, suffix, &mut targets, &a, t, cols)
                        }
                    })?;
                    if secs < best.0 {
                        best = (secs, MatmulRoute::QuantMma);
                    }
                }
                best
            }
            DecodeKernel::Float(family) => {
                let secs = time_with_input(gpu, flush, &mut |input| match input {
                    true => Ok(()),
                    false => matvec_into(gpu, family, suffix, w, &x, t, rows, cols, &mut out),
                })?;
                (secs, MatmulRoute::Matvec)
            }
        };
        if let Some(w16) = w16 {
            let mut x16 = gpu.alloc_out::<u16>(t * cols)?;
            let secs = time_with_input(gpu, flush, &mut |input| match input {
                true => to_f16_into(gpu, &x.as_view(), &mut x16, t * cols),
                false => gemm_f16_into(gpu, w16, &x16, t, rows, cols, &mut out),
            })?;
            if secs < best.0 {
                best = (secs, MatmulRoute::Gemm);
            }
        }
        routes[t] = best.1;
    }
    Ok(BatchRoutes::from_fn(|t| routes[t]))
}

/// A member of a group of matrices reading one input, as tuned alone.
pub(crate) struct GroupMember<'a> {
    pub(crate) rows: usize,
    pub(crate) kernel: DecodeKernel,
    /// The ggml layout (what the float kernels read).
    pub(crate) original: &'a CudaSlice<u8>,
    /// The integer-route layout.
    pub(crate) int8: Option<&'a CudaSlice<u8>>,
    /// The GEMM route's f16 operand (none in deterministic mode).
    pub(crate) f16: Option<CudaView<'a, u16>>,
}

impl<'a> GroupMember<'a> {
    fn int8_layout(&self, suffix: &str) -> Result<&'a CudaSlice<u8>, CudaError> {
        self.int8.ok_or_else(|| CudaError::Driver {
            what: format!("group of {suffix} matrices"),
            err: "a member has no integer-route layout".into(),
        })
    }
}

/// Times a group's one-row products as the members' own kernels (one quantization shared) against one
/// integer launch for all of them in each variant; returns the group's kernel when one launch is
/// faster (`deterministic`: variants of the fixed order only).
pub(crate) fn tune_group(
    gpu: &Gpu,
    suffix: &str,
    fmt: ActQuant,
    members: &[GroupMember<'_>],
    cols: usize,
    deterministic: bool,
) -> Result<Option<DecodeKernel>, CudaError> {
    let x = tuning_input(gpu, cols)?;
    let mut flush = l2_flush_buffer(gpu)?;
    let mut a = gpu.alloc_out::<u8>(fmt.bytes(1, cols))?;
    let mut outs = members
        .iter()
        .map(|m| gpu.alloc::<f32>(m.rows))
        .collect::<Result<Vec<_>, _>>()?;
    let alone = time_launches(gpu, &mut flush, &mut || {
        if members.iter().any(|m| matches!(m.kernel, DecodeKernel::Int8 { .. })) {
            quantize_act_into(gpu, fmt, &x, 1, cols, &mut a)?;
        }
        for (m, out) in members.iter().zip(outs.iter_mut()) {
            match m.kernel {
                DecodeKernel::Float(family) => matvec_into(gpu, family, suffix, m.original, &x, 1, m.rows, cols, out)?,
                DecodeKernel::Int8 { variant, .. } => {
                    mmvq_into(gpu, suffix, variant, m.int8_layout(suffix)?, &a, 1, m.rows, cols, out)?
                }
            }
        }
        Ok(())
    })?;
    let mut best = (alone, None);
    let rows: Vec<usize> = members.iter().map(|m| m.rows).collect();
    for variant in offered(suffix, &rows, cols, deterministic) {
        let secs = time_launches(gpu, &mut flush, &mut || {
            quantize_act_into(gpu, fmt, &x, 1, cols, &mut a)?;
            let mut targets = members
                .iter()
                .zip(outs.iter_mut())
                .map(|(m, out)| {
                    Ok(MmvqTarget {
                        w: m.int8_layout(suffix)?,
                        rows: m.rows,
                        out,
                    })
                })
                .collect::<Result<Vec<_>, CudaError>>()?;
            mmvq_group_into(gpu, suffix, variant, &mut targets, &a, 1, cols)
        })?;
        if secs < best.0 {
            best = (secs, Some(DecodeKernel::Int8 { fmt, variant }));
        }
    }
    Ok(best.1)
}

/// The batch routes of a group of matrices that read one input and share one integer kernel
/// (`variant`; q, k and v, gate and up), timed as the group: its matvec and qmma routes take one
/// launch for all members (`CudaBackend::matmul_group`), so a small member's own fastest route,
/// timed alone, would take it out of that launch at a cost the timing alone does not see (the 8B's
/// k and v leaving q's qmma launch for cuBLAS at 4-8 rows: 0.91x at 6 sequences, call c1 of the
/// staged session). For each batch of 2 to `routes::BATCH_TUNED_MAX_ROWS` rows: one matvec launch,
/// one qmma launch where it takes every member, or cuBLAS over each member's f16 copy where all
/// have one.
pub(crate) fn tune_group_batches(
    gpu: &Gpu,
    suffix: &str,
    fmt: ActQuant,
    variant: MmvqVariant,
    members: &[GroupMember<'_>],
    cols: usize,
) -> Result<BatchRoutes, CudaError> {
    let mut flush = l2_flush_buffer(gpu)?;
    let weights = members
        .iter()
        .map(|m| m.int8_layout(suffix))
        .collect::<Result<Vec<_>, _>>()?;
    let kernel = DecodeKernel::Int8 { fmt, variant };
    let quant_mma = members.iter().all(|m| qmma::takes(&kernel, suffix, m.rows));
    let f16: Option<Vec<&CudaView<'_, u16>>> = members.iter().map(|m| m.f16.as_ref()).collect();
    let mut routes = [MatmulRoute::Matvec; routes::BATCH_TUNED_MAX_ROWS + 1];
    for t in 2..=routes::BATCH_TUNED_MAX_ROWS {
        let x = tuning_input(gpu, t * cols)?;
        let mut a = gpu.alloc_out::<u8>(fmt.bytes(t, cols))?;
        let mut outs = members
            .iter()
            .map(|m| gpu.alloc_out::<f32>(t * m.rows))
            .collect::<Result<Vec<_>, _>>()?;
        let mut one_launch = |qmma_route: bool| -> Result<f64, CudaError> {
            time_with_input(gpu, &mut flush, &mut |input| {
                if input {
                    return quantize_act_into(gpu, fmt, &x, t, cols, &mut a);
                }
                let mut targets: Vec<MmvqTarget> = members
                    .iter()
                    .zip(&weights)
                    .zip(outs.iter_mut())
                    .map(|((m, w), out)| MmvqTarget { w, rows: m.rows, out })
                    .collect();
                match qmma_route {
                    true => qmma::qmma_group_into(gpu, suffix, &mut targets, &a, t, cols),
                    false => mmvq_group_into(gpu, suffix, variant, &mut targets, &a, t, cols),
                }
            })
        };
        let mut best = (one_launch(false)?, MatmulRoute::Matvec);
        if quant_mma {
            let secs = one_launch(true)?;
            if secs < best.0 {
                best = (secs, MatmulRoute::QuantMma);
            }
        }
        if let Some(f16) = &f16 {
            let mut x16 = gpu.alloc_out::<u16>(t * cols)?;
            let secs = time_with_input(gpu, &mut flush, &mut |input| {
                if input {
                    return to_f16_into(gpu, &x.as_view(), &mut x16, t * cols);
                }
                for ((m, w16), out) in members.iter().zip(f16).zip(outs.iter_mut()) {
                    gemm_f16_into(gpu, w16, &x16, t, m.rows, cols, out)?;
                }
                Ok(())
            })?;
            if secs < best.0 {
                best = (secs, MatmulRoute::Gemm);
            }
        }
        routes[t] = best.1;
    }
    Ok(BatchRoutes::from_fn(|t| routes[t]))
}
