//! Load-time kernel choice: each matrix's one-row kernel (`tune_decode`), the one launch a group of
//! matrices reading one input may share (`tune_group`), and the route of each decode batch of 2 to
//! `routes::BATCH_TUNED_MAX_ROWS` rows (`batch_routes`, `tune_group_batches`), all chosen by timing
//! the candidates on the GPU as a decode step meets them: weights cold in L2.

use cudarc::driver::{sys, CudaSlice, CudaView, PushKernelArg};

use crate::matmul::dqmma::{self, DqmmaScratch};
use crate::matmul::int8::{mmvq_group_into, mmvq_into, quantize_act_into, variants, MmvqTarget};
use crate::matmul::kinds::DecodeKernel;
use crate::matmul::kinds::MatvecFamily;
use crate::matmul::kinds::{ActQuant, MmvqVariant};
use crate::matmul::qmma;
use crate::routes::{self, BatchRoutes, MatmulRoute};
use crate::runtime::checked::driver;
use crate::runtime::device::Gpu;
use crate::runtime::grid::launch_cfg;
use crate::runtime::launch::{gemm_f16_into, gemm_into, matvec_into, to_f16_into};
use crate::CudaError;

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
    let on = gpu.options.lab.tune_flush;
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
    time_with_input(gpu, flush, &mut |input| if input { Ok(()) } else { f() })
}

/// `time_launches` for a product whose input is made first, as in a decode step: `f(true)` makes the
/// input (quantizes the activations, or converts them to f16) after the flush and outside the timed
/// span, `f(false)` runs the product, timed. The input is then in L2 as the kernel before leaves it
/// in a step, and the weights are not; and the input's conversion, which a step's norm or gating
/// kernel writes in the reader's form, is not charged to the product. Timed with the conversion
/// and a cold input, the batch routes sent the 8B's v projection to cuBLAS from 3 rows (back to
/// back its staged matvec took 6.5 µs against 11.7) and kept gemma3-270m's small matrices off
/// cuBLAS; timed this way, gemma3-270m decodes 2-4 sequences 14-23% faster.
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
/// own instructions and round trips, not by memory: `tandem-dev bench l2`.
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
fn offered(gpu: &Gpu, suffix: &str, rows: &[usize], cols: usize, deterministic: bool) -> Vec<MmvqVariant> {
    let fitting: Vec<MmvqVariant> = variants(suffix)
        .into_iter()
        .filter(|v| v.fits(rows, cols) && (!deterministic || v.split == 1))
        .collect();
    let Some(wanted) = &gpu.options.lab.mmvq else {
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
/// are timed. `int8_only`: where there is an integer kernel, only its variants are timed (a mixture's
/// experts, whose decode route finds them through address tables that only the integer kernels read).
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
    int8_only: bool,
) -> Result<Tuning, CudaError> {
    let x = tuning_input(gpu, cols)?;
    let mut flush = l2_flush_buffer(gpu)?;
    let mut out = gpu.alloc::<f32>(rows)?;
    let mut best = (f64::INFINITY, DecodeKernel::Float(MatvecFamily::WarpPerRow));
    let families: &[MatvecFamily] = match (deterministic || int8_only, int8.is_some()) {
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
            matvec_into(gpu, family, suffix, &w.as_view(), &x, 1, rows, cols, &mut out)
        })?;
        if secs < best.0 {
            best = (secs, DecodeKernel::Float(family));
        }
    }
    if let Some((fmt, wq)) = int8 {
        let mut a = gpu.alloc_out::<u8>(fmt.bytes(1, cols))?;
        for variant in offered(gpu, suffix, &[rows], cols, deterministic) {
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
        batch_routes(gpu, &mut flush, suffix, kernel, &[Timed { rows, w, w16 }], cols)?
    };
    Ok(Tuning { kernel, cublas, batch })
}

/// A matrix whose batch routes are timed: its rows, the weights its matvec kernel reads, and its f16
/// copy where it has one.
struct Timed<'a> {
    rows: usize,
    w: &'a CudaSlice<u8>,
    w16: Option<&'a CudaView<'a, u16>>,
}

/// For each batch of 2 to `routes::BATCH_TUNED_MAX_ROWS` rows, the fastest route of `members`
/// (one matrix, or a group reading one input and sharing `kernel`, timed as the group): `kernel`
/// batched (one launch for a group), `qmma` where it takes every member (`qmma::takes`; one
/// launch), cuBLAS over each member's f16 copy where all have one. Each is timed with its input
/// made just before (`time_with_input`); only where there is a choice is anything timed. The batched
/// matvec reads the quantized weights once but repeats its per-row work; qmma and cuBLAS barely grow
/// with the rows (cuBLAS reads 4x the bytes of Q4 weights), so the winner depends on the shape and
/// the rows.
fn batch_routes(
    gpu: &Gpu,
    flush: &mut L2Flush,
    suffix: &str,
    kernel: DecodeKernel,
    members: &[Timed<'_>],
    cols: usize,
) -> Result<BatchRoutes, CudaError> {
    let quant_mma = members.iter().all(|m| qmma::takes(gpu, &kernel, suffix, m.rows));
    let f16: Option<Vec<&CudaView<'_, u16>>> = members.iter().map(|m| m.w16).collect();
    if f16.is_none() && !quant_mma {
        return Ok(BatchRoutes::MATVEC);
    }
    let mut routes = [(MatmulRoute::Matvec, None); routes::BATCH_TUNED_MAX_ROWS + 1];
    let rows: Vec<usize> = members.iter().map(|m| m.rows).collect();
    // The dequantizing tensor-core kernel, where it takes the members: its scratch for the timings.
    let mut dequant = match dqmma::takes(gpu, &kernel, suffix, &rows, cols) {
        true => Some(DqmmaScratch::new(gpu, rows.iter().sum())?),
        false => None,
    };
    for t in 2..=routes::BATCH_TUNED_MAX_ROWS {
        let x = tuning_input(gpu, t * cols)?;
        let mut outs = members
            .iter()
            .map(|m| gpu.alloc_out::<f32>(t * m.rows))
            .collect::<Result<Vec<_>, _>>()?;
        let mut best = match kernel {
            DecodeKernel::Int8 { fmt, variant } => {
                let mut a = gpu.alloc_out::<u8>(fmt.bytes(t, cols))?;
                // `Some(v)`: variant v batched; `None`: qmma.
                let mut one_launch = |matvec: Option<MmvqVariant>| {
                    time_with_input(gpu, flush, &mut |input| {
                        if input {
                            return quantize_act_into(gpu, fmt, &x, t, cols, &mut a);
                        }
                        let mut targets = member_targets(members, &mut outs);
                        match matvec {
                            Some(v) => mmvq_group_into(gpu, suffix, v, &mut targets, &a, t, cols),
                            None => qmma::qmma_group_into(gpu, suffix, &mut targets, &a, t, cols),
                        }
                    })
                };
                let mut best = (one_launch(Some(variant))?, MatmulRoute::Matvec, None);
                for other in batch_variants(gpu, suffix, variant, &rows, cols) {
                    let secs = one_launch(Some(other))?;
                    if secs < best.0 {
                        best = (secs, MatmulRoute::Matvec, Some(other));
                    }
                }
                if quant_mma {
                    let secs = one_launch(None)?;
                    if secs < best.0 {
                        best = (secs, MatmulRoute::QuantMma, None);
                    }
                }
                best
            }
            DecodeKernel::Float(family) => {
                let secs = time_with_input(gpu, flush, &mut |input| {
                    if input {
                        return Ok(());
                    }
                    for (m, out) in members.iter().zip(outs.iter_mut()) {
                        matvec_into(gpu, family, suffix, &m.w.as_view(), &x, t, m.rows, cols, out)?;
                    }
                    Ok(())
                })?;
                (secs, MatmulRoute::Matvec, None)
            }
        };
        if let Some(f16) = &f16 {
            let secs = time_gemm_f16(gpu, flush, members, f16, &x, t, cols)?;
            if secs < best.0 {
                best = (secs, MatmulRoute::Gemm, None);
            }
        }
        if let Some(scratch) = dequant.as_mut() {
            let secs = time_dqmma(gpu, flush, suffix, members, &x, t, cols, scratch)?;
            if secs < best.0 {
                best = (secs, MatmulRoute::DequantMma, None);
            }
        }
        routes[t] = (best.1, best.2);
    }
    let batch = BatchRoutes::with_variants(|t| routes[t]);
    match (&f16, dequant.as_mut()) {
        (Some(f16), Some(scratch)) => {
            Ok(batch.with_wide(wide_routes(gpu, flush, suffix, members, f16, cols, scratch)?))
        }
        _ => Ok(batch),
    }
}

/// For each bucket of `routes::WIDE_ROWS` (batches past `BATCH_TUNED_MAX_ROWS`), whether `members`
/// (one matrix, or a group reading one input, in one launch) take the dequantizing tensor-core
/// kernel or cuBLAS over their f16 copies, timed at the bucket's top row count with the f16 input
/// made just before. cuBLAS reads 3.6x the bytes; the kernel's products grow with the rows.
fn wide_routes(
    gpu: &Gpu,
    flush: &mut L2Flush,
    suffix: &str,
    members: &[Timed<'_>],
    f16: &[&CudaView<'_, u16>],
    cols: usize,
    scratch: &mut DqmmaScratch,
) -> Result<[MatmulRoute; routes::WIDE_ROWS.len()], CudaError> {
    let mut wide = [MatmulRoute::Gemm; routes::WIDE_ROWS.len()];
    for (route, t) in wide.iter_mut().zip(routes::WIDE_ROWS) {
        let x = tuning_input(gpu, t * cols)?;
        let dequant = time_dqmma(gpu, flush, suffix, members, &x, t, cols, scratch)?;
        let gemm = time_gemm_f16(gpu, flush, members, f16, &x, t, cols)?;
        if dequant < gemm {
            *route = MatmulRoute::DequantMma;
        }
    }
    Ok(wide)
}

/// Each member's quantized weights and its output, as one launch's targets.
fn member_targets<'a>(members: &'a [Timed<'_>], outs: &'a mut [CudaSlice<f32>]) -> Vec<MmvqTarget<'a>> {
    members
        .iter()
        .zip(outs.iter_mut())
        .map(|(m, out)| MmvqTarget {
            w: m.w,
            rows: m.rows,
            out,
        })
        .collect()
}

/// A timed product's f16 input (`t` rows of `cols`) and its members' outputs.
fn timing_buffers(
    gpu: &Gpu,
    members: &[Timed<'_>],
    t: usize,
    cols: usize,
) -> Result<(CudaSlice<u16>, Vec<CudaSlice<f32>>), CudaError> {
    let x16 = gpu.alloc_out::<u16>(t * cols)?;
    let outs = members
        .iter()
        .map(|m| gpu.alloc_out::<f32>(t * m.rows))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((x16, outs))
}

/// Seconds of `t` rows of `x` through cuBLAS over the members' f16 copies (`f16`, one GEMM each),
/// their f16 input made just before (`time_with_input`).
fn time_gemm_f16(
    gpu: &Gpu,
    flush: &mut L2Flush,
    members: &[Timed<'_>],
    f16: &[&CudaView<'_, u16>],
    x: &CudaSlice<f32>,
    t: usize,
    cols: usize,
) -> Result<f64, CudaError> {
    let (mut x16, mut outs) = timing_buffers(gpu, members, t, cols)?;
    time_with_input(gpu, flush, &mut |input| {
        if input {
            return to_f16_into(gpu, &x.as_view(), &mut x16, t * cols);
        }
        for ((m, w16), out) in members.iter().zip(f16).zip(outs.iter_mut()) {
            gemm_f16_into(gpu, w16, &x16, t, m.rows, cols, out)?;
        }
        Ok(())
    })
}

/// Seconds of `t` rows of `x` through the dequantizing tensor-core kernel, all `members` in one
/// launch, its f16 input made just before (`time_with_input`).
#[allow(clippy::too_many_arguments)]
fn time_dqmma(
    gpu: &Gpu,
    flush: &mut L2Flush,
    suffix: &str,
    members: &[Timed<'_>],
    x: &CudaSlice<f32>,
    t: usize,
    cols: usize,
    scratch: &mut DqmmaScratch,
) -> Result<f64, CudaError> {
    let (mut x16, mut outs) = timing_buffers(gpu, members, t, cols)?;
    time_with_input(gpu, flush, &mut |input| {
        if input {
            return to_f16_into(gpu, &x.as_view(), &mut x16, t * cols);
        }
        let mut targets = member_targets(members, &mut outs);
        dqmma::dqmma_group_into(gpu, suffix, &mut targets, &x16, t, cols, scratch)
    })
}

/// The other integer variants a batch of a matrix (or group) on `chosen` may take: those of its split,
/// so a batch row keeps the bits it has alone, each batched kernel once (a staged and an unstaged
/// one-row variant of one unroll and rows share their batched kernels). A batch's work per weight
/// grows with its rows, so the loads in flight that suit one row (`chosen`) may not suit it.
fn batch_variants(gpu: &Gpu, suffix: &str, chosen: MmvqVariant, rows: &[usize], cols: usize) -> Vec<MmvqVariant> {
    let mut seen = vec![(chosen.unroll, chosen.rows)];
    let mut out = Vec::new();
    for v in offered(gpu, suffix, rows, cols, false) {
        if v.split == chosen.split && !seen.contains(&(v.unroll, v.rows)) {
            seen.push((v.unroll, v.rows));
            out.push(v);
        }
    }
    out
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
                DecodeKernel::Float(family) => {
                    matvec_into(gpu, family, suffix, &m.original.as_view(), &x, 1, m.rows, cols, out)?
                }
                DecodeKernel::Int8 { variant, .. } => {
                    mmvq_into(gpu, suffix, variant, m.int8_layout(suffix)?, &a, 1, m.rows, cols, out)?
                }
            }
        }
        Ok(())
    })?;
    let mut best = (alone, None);
    let rows: Vec<usize> = members.iter().map(|m| m.rows).collect();
    for variant in offered(gpu, suffix, &rows, cols, deterministic) {
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
/// (`variant`; q, k and v, gate and up), timed as the group (`batch_routes`): its matvec and qmma
/// routes take one launch for all members (`CudaBackend::matmul_group`), so a small member's own
/// fastest route, timed alone, would take it out of that launch at a cost the timing alone does not
/// see (the 8B's k and v leaving q's qmma launch for cuBLAS at 4-8 rows: 0.91x at 6 sequences).
pub(crate) fn tune_group_batches(
    gpu: &Gpu,
    suffix: &str,
    fmt: ActQuant,
    variant: MmvqVariant,
    members: &[GroupMember<'_>],
    cols: usize,
) -> Result<BatchRoutes, CudaError> {
    let mut flush = l2_flush_buffer(gpu)?;
    let timed = members
        .iter()
        .map(|m| {
            Ok(Timed {
                rows: m.rows,
                w: m.int8_layout(suffix)?,
                w16: m.f16.as_ref(),
            })
        })
        .collect::<Result<Vec<_>, CudaError>>()?;
    batch_routes(
        gpu,
        &mut flush,
        suffix,
        DecodeKernel::Int8 { fmt, variant },
        &timed,
        cols,
    )
}
