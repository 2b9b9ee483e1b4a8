//! Launchers of the integer route (`kernels/mmvq.cu`; `kernels/mmq.cu` for prefill chunks): activations
//! quantized to int8 as the CPU backend quantizes them, weights repacked once into aligned blocks where
//! their ggml layout is not, and matvecs that multiply the two with `dp4a` (or `mma.sync`).

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg, SyncOnDrop};
use tandem_gguf::GgmlType;

use crate::matmul::kinds::staged_bytes;
use crate::matmul::kinds::ActQuant;
use crate::matmul::kinds::MmvqVariant;
use crate::matmul::kinds::STAGED_MAX_BYTES;
use crate::routes::MV_BATCH;
use crate::runtime::checked::driver;
use crate::runtime::device::{allow_dynamic_shared, Gpu};
use crate::runtime::grid::{blocks, i32_of, launch_cfg};
use crate::CudaError;

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
        ActQuant::Q8K => ("quantize_q8k", launch_cfg((blocks(cols / 256, 4), t as u32, 1), 128)),
        ActQuant::Q8 => ("quantize_q8", launch_cfg((blocks(cols / 32, 4), t as u32, 1), 128)),
    };
    let f = gpu.function(name)?;
    let mut b = gpu.launch_builder(f)?;
    b.arg(x).arg(out).arg(&n).arg(&c);
    driver(name, unsafe { b.launch(cfg) })?;
    Ok(())
}

/// The weights in the layout the integer kernel reads: a new buffer of the same size
/// (`repacked_source` says where each byte comes from), or `None` for types without an integer
/// kernel.
pub fn repack(
    gpu: &Gpu,
    ty: GgmlType,
    w: &CudaSlice<u8>,
    rows: usize,
    cols: usize,
) -> Result<Option<CudaSlice<u8>>, CudaError> {
    let mut out = gpu.alloc_out::<u8>(w.len())?;
    match ty {
        GgmlType::Q4_K | GgmlType::Q6_K => {
            let nsb = cols / 256;
            let (r, n) = (i32_of(rows, "rows")?, i32_of(nsb, "super-blocks")?);
            let name = if ty == GgmlType::Q4_K {
                "repack_q4_k_regions"
            } else {
                "repack_q6_k_regions"
            };
            let mut b = gpu.launch_builder(gpu.function(name)?)?;
            b.arg(w).arg(&mut out).arg(&r).arg(&n);
            driver(name, unsafe {
                b.launch(launch_cfg((blocks(rows * nsb, 128), 1, 1), 128))
            })?;
        }
        GgmlType::Q8_0 => {
            // (blocks, block bytes, quant offset, quant bytes, scale offset): see `repack_scales_out`.
            let n_blocks = rows * (cols / 32);
            let (block_bytes, quant_off, quant_len, scale_off) = (34i32, 2i32, 32i32, 0i32);
            let n = n_blocks as u64;
            let mut b = gpu.launch_builder(gpu.function("repack_scales_out")?)?;
            b.arg(w).arg(&mut out).arg(&n);
            b.arg(&block_bytes).arg(&quant_off).arg(&quant_len).arg(&scale_off);
            driver("repack_scales_out", unsafe {
                b.launch(launch_cfg((blocks(n_blocks, 256), 1, 1), 256))
            })?;
        }
        _ => return Ok(None),
    }
    Ok(Some(out))
}

/// For each byte of the integer-route layout of a `rows × cols` matrix of type `ty`, the offset of
/// the ggml-layout byte it holds (`None` for types without an integer kernel). The GPU's `repack`
/// writes exactly this; the kernel tests compare the two.
/// - Q4_K, per row of `nsb` super-blocks: region A (each super-block's four 16-byte quant pieces
///   that start its 32-byte chunks), region B (the chunks' second pieces), then the 16-byte heads
///   (d, dmin, scales).
/// - Q6_K, per row: regions A (ql at 64h + 16g for lane 2h + g), B (ql at 64h + 32 + 16g), H (qh at
///   32h + 16g) and the 16 scale bytes of each super-block; after all rows, every super-block's f16 d.
/// - Q8_0: each block's 32 quants in order per row; after all rows, every block's f16 scale.
pub fn repacked_source(ty: GgmlType, rows: usize, cols: usize) -> Option<Vec<usize>> {
    let nsb = cols / 256;
    let mut src = Vec::new();
    match ty {
        GgmlType::Q4_K => {
            for r in 0..rows {
                let block = |sb: usize| (r * nsb + sb) * 144;
                for half in 0..2 {
                    for sb in 0..nsb {
                        for c in 0..4 {
                            src.extend((0..16).map(|b| block(sb) + 16 + 32 * c + 16 * half + b));
                        }
                    }
                }
                for sb in 0..nsb {
                    src.extend((0..16).map(|b| block(sb) + b));
                }
            }
        }
        GgmlType::Q6_K => {
            for r in 0..rows {
                let block = |sb: usize| (r * nsb + sb) * 210;
                for region in [0, 32, 128] {
                    for sb in 0..nsb {
                        for k in 0..4 {
                            let (h, g) = (k / 2, k % 2);
                            let at = if region == 128 { 128 + 32 * h } else { 64 * h + region };
                            src.extend((0..16).map(|b| block(sb) + at + 16 * g + b));
                        }
                    }
                }
                for sb in 0..nsb {
                    src.extend((0..16).map(|b| block(sb) + 192 + b));
                }
            }
            for i in 0..rows * nsb {
                src.extend([i * 210 + 208, i * 210 + 209]);
            }
        }
        GgmlType::Q8_0 => {
            let n = rows * (cols / 32);
            for i in 0..n {
                src.extend((0..32).map(|b| i * 34 + 2 + b));
            }
            for i in 0..n {
                src.extend([i * 34, i * 34 + 1]);
            }
        }
        _ => return None,
    }
    Some(src)
}

/// Shared-memory bytes a staged batch kernel gives each activation row (`staged_row_int4s` in
/// mmvq.cu: `staged_bytes` rounded up to whole 16-byte words, so each row's copy starts aligned).
pub fn staged_row_bytes(cols: usize) -> usize {
    staged_bytes(cols).div_ceil(16) * 16
}

/// The most shared memory a staged batch launch takes: two blocks of eight warps still fit a Hopper
/// multiprocessor (228 KB), so a block's copy is never the only one streaming weights there.
const STAGED_BATCH_MAX_BYTES: usize = 112 * 1024;

/// Threads of a staged batch block (`mmvqpb*`): eight warps share one copy of the rows.
const STAGED_BATCH_THREADS: u32 = 256;

/// Batch sizes a staged batch kernel is instantiated for (`mmvqpb<NB>_*`).
pub(crate) const STAGED_BATCH_SIZES: [usize; 3] = [2, 4, 8];

/// Whether staged batch kernels may be used (`TANDEM_CUDA_STAGED_BATCH=0`: the unstaged batched
/// kernels instead, to measure one against the other; same bits).
pub fn staged_batch_enabled(gpu: &Gpu) -> bool {
    gpu.options.staged_batch
}

/// The staged batch kernel size (NB) that takes `t` activation rows of `cols` times a matrix of type
/// `suffix` under `variant`, if any: a K-quant (the staged copy is of Q8_K rows), split 1 (the order
/// the staged kernels sum in, so a batch row keeps its lone bits), 2 to 8 rows whose copies fit
/// `STAGED_BATCH_MAX_BYTES`.
pub fn staged_batch(suffix: &str, variant: MmvqVariant, t: usize, cols: usize) -> Option<usize> {
    if !matches!(suffix, "q4_k" | "q6_k") || variant.split != 1 || t < 2 {
        return None;
    }
    if t * staged_row_bytes(cols) > STAGED_BATCH_MAX_BYTES {
        return None;
    }
    STAGED_BATCH_SIZES.into_iter().find(|&nb| nb >= t)
}

/// The variants `kernels/mmvq.cu` instantiates for `suffix`.
pub fn variants(suffix: &str) -> Vec<MmvqVariant> {
    let v = |unroll, rows, split| MmvqVariant {
        unroll,
        rows,
        split,
        staged: false,
    };
    let p = |unroll, rows| MmvqVariant {
        unroll,
        rows,
        split: 1,
        staged: true,
    };
    match suffix {
        // Q4_K's rows of 4096 are 16 super-blocks, too few to split four ways; four rows a warp and
        // every split lost to two rows a warp on every 8B shape timed.
        "q4_k" => vec![
            v(1, 1, 1),
            v(2, 1, 1),
            v(4, 1, 1),
            v(1, 2, 1),
            v(2, 2, 1),
            p(1, 1),
            p(2, 1),
            p(1, 2),
            p(2, 2),
            p(4, 1),
        ],
        "q8_0" => vec![v(2, 1, 1), v(4, 1, 1), v(8, 1, 1), v(1, 1, 4), v(2, 1, 4)],
        _ => vec![
            v(1, 1, 1),
            v(2, 1, 1),
            v(4, 1, 1),
            v(1, 1, 4),
            v(2, 1, 4),
            p(1, 1),
            p(2, 1),
            p(4, 1),
        ],
    }
}

/// One matrix of an integer matvec launch: its weights (integer-route layout), rows and output.
pub struct MmvqTarget<'a> {
    pub w: &'a CudaSlice<u8>,
    pub rows: usize,
    pub out: &'a mut CudaSlice<f32>,
}

/// `out[t] = W · x[t]` from weights `w` (integer-route layout) and quantized activations `a`.
#[allow(clippy::too_many_arguments)]
pub fn mmvq_into(
    gpu: &Gpu,
    suffix: &str,
    variant: MmvqVariant,
    w: &CudaSlice<u8>,
    a: &CudaSlice<u8>,
    t: usize,
    rows: usize,
    cols: usize,
    out: &mut CudaSlice<f32>,
) -> Result<(), CudaError> {
    mmvq_group_into(gpu, suffix, variant, &mut [MmvqTarget { w, rows, out }], a, t, cols)
}

/// Activation rows from which a product of a split-1 variant takes the tensor cores (`mmq_*` in
/// mmq.cu: the same integers through `mma.sync`, the same float steps and order, so the same bits).
pub const MMQ_MIN_ROWS: usize = 16;

/// Whether `t` activation rows times matrices of `rows` of type `suffix`, under `variant`, take the
/// tensor-core kernel: Q4_K, Q6_K and Q8_0, the split-1 order it reproduces, whole groups of eight
/// weight rows (one mma's n).
pub fn mmq_takes(suffix: &str, variant: MmvqVariant, t: usize, rows: &[usize]) -> bool {
    t >= MMQ_MIN_ROWS
        && matches!(suffix, "q4_k" | "q6_k" | "q8_0")
        && variant.split == 1
        && rows.iter().all(|r| r.is_multiple_of(8))
}

/// `out[t] = W · x[t]` for all `t` rows on the tensor cores (`mmq_takes` must hold).
fn mmq_into(
    gpu: &Gpu,
    suffix: &str,
    target: &mut MmvqTarget<'_>,
    a: &CudaSlice<u8>,
    t: usize,
    cols: usize,
) -> Result<(), CudaError> {
    let name = format!("mmq_{suffix}");
    let f = gpu.function(&name)?;
    let (rows, c, n) = (i32_of(target.rows, "rows")?, i32_of(cols, "cols")?, i32_of(t, "t")?);
    let mut b = gpu.launch_builder(f)?;
    b.arg(target.w).arg(a).arg(&mut *target.out);
    b.arg(&rows).arg(&c).arg(&n);
    let cfg = launch_cfg((blocks(t, 16), blocks(target.rows, 32), 1), 128);
    // SAFETY: weights in the integer-route layout of rows x cols, `a` quantized for t rows of cols,
    // out holds t x rows floats; the kernel reads and writes inside those.
    driver(&name, unsafe { b.launch(cfg) })?;
    Ok(())
}

/// One launch for up to three matrices of type `suffix` and width `cols` that read the same
/// quantized activations `a` (q, k and v; gate and up): fewer launches, and the small matrices'
/// rows fill the GPU alongside the big one's. Each output row has the bits it has alone. Chunks of
/// `MMQ_MIN_ROWS` or more take the tensor cores where `mmq_takes` allows (one launch a matrix).
pub fn mmvq_group_into(
    gpu: &Gpu,
    suffix: &str,
    variant: MmvqVariant,
    targets: &mut [MmvqTarget<'_>],
    a: &CudaSlice<u8>,
    t: usize,
    cols: usize,
) -> Result<(), CudaError> {
    mmvq_group_into_with(gpu, suffix, variant, targets, a, t, cols, MmvqKernels::all(gpu))
}

/// Which kernels `mmvq_group_into_with` may take besides the plain (unstaged) ones; all give the same
/// bits (the kernel tests compare them; `tandem-dev bench qmma` times one against another).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmvqKernels {
    /// `mmq_*` on the tensor cores for chunks of `MMQ_MIN_ROWS` or more.
    pub tensor_cores: bool,
    /// `mmvqpb*` for batches of 2-8 rows (`staged_batch`).
    pub staged_batch: bool,
}

impl MmvqKernels {
    /// What a model's products take on `gpu`.
    pub fn all(gpu: &Gpu) -> Self {
        MmvqKernels {
            tensor_cores: true,
            staged_batch: staged_batch_enabled(gpu),
        }
    }
}

/// `mmvq_group_into`, with the tensor-core and staged batch kernels allowed or not.
#[allow(clippy::too_many_arguments)]
pub fn mmvq_group_into_with(
    gpu: &Gpu,
    suffix: &str,
    variant: MmvqVariant,
    targets: &mut [MmvqTarget<'_>],
    a: &CudaSlice<u8>,
    t: usize,
    cols: usize,
    kernels: MmvqKernels,
) -> Result<(), CudaError> {
    let row_counts: Vec<usize> = targets.iter().map(|g| g.rows).collect();
    if kernels.tensor_cores && mmq_takes(suffix, variant, t, &row_counts) {
        for target in targets.iter_mut() {
            mmq_into(gpu, suffix, target, a, t, cols)?;
        }
        return Ok(());
    }
    if targets.is_empty() || targets.len() > 3 {
        return Err(CudaError::Driver {
            what: format!("mmvq_{suffix}"),
            err: format!("{} matrices in one launch (1 to 3)", targets.len()),
        });
    }
    // One row takes the single kernel, more the batched one: same sums, same bits.
    let name = variant.kernel(suffix, t > 1);
    let per_block = if t > 1 { MV_BATCH } else { 1 };
    if !variant.fits(&row_counts, cols) {
        return Err(CudaError::Driver {
            what: name,
            err: format!(
                "rows {row_counts:?} are not whole groups of {}, or {cols} columns are too wide to stage",
                variant.rows
            ),
        });
    }
    let total: usize = row_counts.iter().sum();
    if let Some(nb) = staged_batch(suffix, variant, t, cols).filter(|_| kernels.staged_batch) {
        return staged_batch_into(gpu, suffix, variant, nb, targets, a, t, cols, total);
    }
    let cfg = if variant.staged && t == 1 {
        // No more than one row group a warp.
        resident_grid(gpu, &name, variant.blocks(total), 128, staged_bytes(cols))?
    } else {
        launch_cfg((variant.blocks(total), blocks(t, per_block), 1), 128)
    };
    launch_grouped(gpu, &name, cfg, targets, a, t, cols)
}

/// A launch of kernel `name` for the staged kernels, which copy their input into `smem` bytes of
/// shared memory once per block: at most `blocks` blocks of `threads`, and no more than are resident
/// on the GPU at once, so no second wave of blocks copies the input again late.
fn resident_grid(gpu: &Gpu, name: &str, blocks: u32, threads: u32, smem: usize) -> Result<LaunchConfig, CudaError> {
    let f = gpu.function(name)?;
    if smem > STAGED_MAX_BYTES {
        allow_dynamic_shared(name, f, smem)?;
    }
    let per_sm = driver(
        name,
        f.occupancy_max_active_blocks_per_multiprocessor(threads, smem, None),
    )?;
    let mut cfg = launch_cfg((blocks.min(per_sm.max(1) * gpu.sm_count), 1, 1), threads);
    cfg.shared_mem_bytes = smem as u32;
    Ok(cfg)
}

/// A batch of `t` rows (at most `nb`) through the staged batch kernel `mmvqpb<nb>` of `variant`'s
/// unroll and rows: a grid of the blocks resident at once, each copying the rows into shared memory.
#[allow(clippy::too_many_arguments)]
fn staged_batch_into(
    gpu: &Gpu,
    suffix: &str,
    variant: MmvqVariant,
    nb: usize,
    targets: &mut [MmvqTarget<'_>],
    a: &CudaSlice<u8>,
    t: usize,
    cols: usize,
    total_rows: usize,
) -> Result<(), CudaError> {
    let name = variant.staged_batch_kernel(suffix, nb);
    let warps = (STAGED_BATCH_THREADS / 32) as usize;
    let groups = total_rows / variant.rows as usize;
    let smem = t * staged_row_bytes(cols);
    let cfg = resident_grid(gpu, &name, blocks(groups, warps), STAGED_BATCH_THREADS, smem)?;
    launch_grouped(gpu, &name, cfg, targets, a, t, cols)
}

/// Launches `name`, a kernel taking up to three matrices that read one input (`W0, W1, W2, A, Y0, Y1,
/// Y2, rows0, rows1, rows2, cols, n_t`), over `targets`.
pub(crate) fn launch_grouped(
    gpu: &Gpu,
    name: &str,
    cfg: cudarc::driver::LaunchConfig,
    targets: &mut [MmvqTarget<'_>],
    a: &CudaSlice<u8>,
    t: usize,
    cols: usize,
) -> Result<(), CudaError> {
    let f = gpu.function(name)?;
    let (c, n) = (i32_of(cols, "cols")?, i32_of(t, "t")?);
    let g = grouped_args(&gpu.stream, targets)?;
    let mut b = gpu.launch_builder(f)?;
    b.arg(&g.w[0]).arg(&g.w[1]).arg(&g.w[2]).arg(a);
    b.arg(&g.y[0]).arg(&g.y[1]).arg(&g.y[2]);
    b.arg(&g.rows[0]).arg(&g.rows[1]).arg(&g.rows[2]).arg(&c).arg(&n);
    // SAFETY: each target's weights are in the integer-route layout of rows x cols and its output
    // holds t x rows floats; `a` is quantized for t rows of cols; unused slots have zero rows.
    driver(name, unsafe { b.launch(cfg) })?;
    Ok(())
}

/// The per-matrix arguments of a launch over up to three matrices reading one input: weight and
/// output pointers (a slot past the targets repeats the first, and its zero rows keep it unread)
/// and row counts, with the guards that record the buffers' use on the stream when dropped, after
/// the launch.
pub(crate) struct GroupedArgs<'a> {
    pub(crate) w: [u64; 3],
    pub(crate) y: [u64; 3],
    pub(crate) rows: [i32; 3],
    _guards: Vec<SyncOnDrop<'a>>,
}

/// `targets`' `GroupedArgs` (at most three; their rows, and the rows together, must fit an i32).
pub(crate) fn grouped_args<'a>(
    stream: &'a CudaStream,
    targets: &'a mut [MmvqTarget<'_>],
) -> Result<GroupedArgs<'a>, CudaError> {
    if targets.len() > 3 {
        return Err(CudaError::Driver {
            what: "grouped launch".into(),
            err: format!("{} matrices in one launch: at most 3", targets.len()),
        });
    }
    let mut rows = [0i32; 3];
    for (r, g) in rows.iter_mut().zip(targets.iter()) {
        *r = i32_of(g.rows, "rows")?;
    }
    i32_of(targets.iter().map(|g| g.rows).sum(), "rows")?;
    let (mut w, mut y) = ([0u64; 3], [0u64; 3]);
    let mut guards = Vec::with_capacity(6);
    let n_targets = targets.len();
    for (i, g) in targets.iter_mut().enumerate() {
        let (wp, gw) = g.w.device_ptr(stream);
        let (yp, gy) = g.out.device_ptr_mut(stream);
        (w[i], y[i]) = (wp, yp);
        guards.push(gw);
        guards.push(gy);
    }
    for i in n_targets..3 {
        (w[i], y[i]) = (w[0], y[0]);
    }
    Ok(GroupedArgs {
        w,
        y,
        rows,
        _guards: guards,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `q6_word` in int8.cuh subtracts 32 from four bytes of 0..63 on the whole word.
    #[test]
    fn six_bit_quants_minus_32_on_the_word_match_per_byte_subtraction() {
        let src = crate::runtime::nvrtc::assemble(&crate::runtime::nvrtc::MMVQ);
        assert!(src.contains("(((lo | hi | 0x80808080u) - 0x20202020u) ^ 0x80808080u)"));
        let word = |v: u32| ((v | 0x8080_8080).wrapping_sub(0x2020_2020)) ^ 0x8080_8080;
        for q in 0..64u32 {
            for other in 0..64u32 {
                for pos in 0..4 {
                    let bytes: Vec<u32> = (0..4)
                        .map(|b| if b == pos { q } else { (other + 17 * b) % 64 })
                        .collect();
                    let v = bytes.iter().enumerate().fold(0u32, |w, (b, &x)| w | x << (8 * b));
                    let got = word(v).to_le_bytes().map(|b| b as i8);
                    let want: Vec<i8> = bytes.iter().map(|&x| x as i8 - 32).collect();
                    assert_eq!(got.to_vec(), want, "bytes {bytes:?}");
                }
            }
        }
    }

    #[test]
    fn quantized_activation_sizes_cover_quants_scales_and_sums() {
        // 2 rows of 512: 1024 quants, 4 f32 scales, 64 sums of 16.
        assert_eq!(ActQuant::Q8K.bytes(2, 512), 1024 + 16 + 256);
        // 2 rows of 64: 128 quants, 4 f32 scales, no sums.
        assert_eq!(ActQuant::Q8.bytes(2, 64), 128 + 16);
    }

    fn variant(unroll: u32, rows: u32, split: u32, staged: bool) -> MmvqVariant {
        MmvqVariant {
            unroll,
            rows,
            split,
            staged,
        }
    }

    #[test]
    fn variants_take_whole_row_groups() {
        let two = variant(1, 2, 1, false);
        assert!(two.fits(&[4096, 1024, 1024], 4096));
        assert!(!two.fits(&[4096, 1023], 4096));
        // Four warps a block, two rows a warp: 4096 rows in 512 blocks.
        assert_eq!(two.blocks(4096), 512);
        assert_eq!(variant(4, 1, 1, false).blocks(1026), 257);
        assert_eq!(two.kernel("q4_k", true), "mmvqb_q4_k_u1_r2_s1");
        // One row a warp fits anything, so every type has a variant for every shape.
        for suffix in ["q4_k", "q6_k", "q8_0"] {
            assert!(variants(suffix).iter().any(|v| v.fits(&[1, 3, 5], 1 << 20)), "{suffix}");
        }
    }

    #[test]
    fn batches_of_k_quants_take_the_smallest_staged_kernel_that_holds_them() {
        let v = variant(2, 2, 1, false);
        assert_eq!(staged_batch("q4_k", v, 1, 4096), None);
        assert_eq!(staged_batch("q4_k", v, 2, 4096), Some(2));
        assert_eq!(staged_batch("q4_k", v, 3, 4096), Some(4));
        assert_eq!(staged_batch("q6_k", v, 5, 4096), Some(8));
        assert_eq!(staged_batch("q4_k", v, 8, 4096), Some(8));
        assert_eq!(staged_batch("q4_k", v, 9, 4096), None);
        assert_eq!(v.staged_batch_kernel("q4_k", 4), "mmvqpb4_q4_k_u2_r2_s1");
        // The 8B's down projection (14336 wide, 18,144 bytes a row) up to 6 rows in 112 KiB.
        assert_eq!(staged_row_bytes(14336), 18144);
        assert_eq!(staged_batch("q6_k", v, 6, 14336), Some(8));
        assert_eq!(staged_batch("q6_k", v, 7, 14336), None);
        // Rows start on whole 16-byte words (2560 wide: 4,776 bytes of copy).
        assert_eq!(staged_row_bytes(2560), 4784);
        // Only K-quants, only the split-1 order.
        assert_eq!(staged_batch("q8_0", variant(2, 1, 1, false), 2, 4096), None);
        assert_eq!(staged_batch("q6_k", variant(2, 1, 4, false), 2, 4096), None);
    }

    #[test]
    fn every_split_one_k_quant_variant_has_its_staged_batch_kernels() {
        let names = crate::runtime::device::kernel_names(crate::runtime::nvrtc::MMVQ.body);
        for suffix in ["q4_k", "q6_k"] {
            for v in variants(suffix).into_iter().filter(|v| v.split == 1) {
                for nb in STAGED_BATCH_SIZES {
                    let name = v.staged_batch_kernel(suffix, nb);
                    assert!(names.contains(&name), "{name}");
                }
            }
        }
    }

    #[test]
    fn staged_variants_fit_rows_whose_activation_fits_in_shared_memory() {
        let p = variant(2, 1, 1, true);
        assert_eq!(p.kernel("q4_k", false), "mmvqp_q4_k_u2_r1_s1");
        // Batched launches that no staged batch kernel takes: the unstaged kernel, the same sums.
        assert_eq!(p.kernel("q4_k", true), "mmvqb_q4_k_u2_r1_s1");
        assert_eq!(p.label(), "u2r1s1p");
        // 16 super-blocks: two groups of eight (4 KiB of quants), 1 KiB of sums, 64 B of scales.
        assert_eq!(staged_bytes(4096), 4096 + 1024 + 64);
        // A partial group of eight takes a whole group's quant space.
        assert_eq!(staged_bytes(2560), 4096 + 640 + 40);
        assert!(p.fits(&[4096], 14336));
        // Gemma-3-27B's down projection is 21504 wide; 53248 would need more than 48 KiB.
        assert!(p.fits(&[5376], 21504));
        assert!(!p.fits(&[4096], 53248));
        assert!(variant(2, 1, 1, false).fits(&[4096], 53248));
        // Only K-quants stage, and only unsplit.
        assert!(variants("q8_0").iter().all(|v| !v.staged));
        assert!(variants("q4_k")
            .iter()
            .chain(&variants("q6_k"))
            .filter(|v| v.staged)
            .all(|v| v.split == 1));
    }

    #[test]
    fn chunks_of_many_rows_take_the_tensor_cores_only_in_the_order_they_reproduce() {
        let one = variant(2, 1, 1, false);
        assert!(mmq_takes("q4_k", one, MMQ_MIN_ROWS, &[4096, 1024, 1024]));
        assert!(mmq_takes("q6_k", variant(1, 1, 1, true), 512, &[128256]));
        // Decode steps and very short chunks keep the matvec.
        assert!(!mmq_takes("q4_k", one, MMQ_MIN_ROWS - 1, &[4096]));
        // The split-4 order is not the one the tensor-core kernels' chains reproduce.
        assert!(!mmq_takes("q6_k", variant(2, 1, 4, false), 512, &[4096]));
        // Weight rows come eight to an mma; Q8_0's split-1 order too, other types have no kernel.
        assert!(!mmq_takes("q4_k", one, 512, &[4096, 300]));
        assert!(mmq_takes("q8_0", one, 512, &[4096]));
        assert!(!mmq_takes("q5_k", one, 512, &[4096]));
    }

    #[test]
    fn a_split_group_takes_a_whole_block() {
        // Four warps share one group: a block per group, so 4096 rows make 4096 blocks (a grid sized
        // for one group per warp would leave three quarters of the rows unwritten).
        let split = variant(1, 1, 4, false);
        assert_eq!(split.blocks(4096), 4096);
        assert_eq!(split.kernel("q8_0", false), "mmvq_q8_0_u1_r1_s4");
        assert!(variants("q8_0").contains(&split));
        // Every split variant on offer has a one-split sibling of the same rows, which
        // `--deterministic` keeps to.
        for suffix in ["q4_k", "q6_k", "q8_0"] {
            for v in variants(suffix).into_iter().filter(|v| v.split > 1) {
                assert!(
                    variants(suffix).iter().any(|w| w.split == 1 && w.rows == v.rows),
                    "{suffix} {v:?}"
                );
            }
        }
    }

    #[test]
    fn repacked_layouts_move_every_byte_once() {
        for (ty, block_bytes, per_block) in [
            (GgmlType::Q4_K, 144, 256),
            (GgmlType::Q6_K, 210, 256),
            (GgmlType::Q8_0, 34, 32),
        ] {
            let (rows, cols) = (3, 768);
            let src = repacked_source(ty, rows, cols).expect("integer type");
            let n = rows * cols / per_block * block_bytes;
            assert_eq!(src.len(), n, "{ty}");
            let mut seen = vec![false; n];
            for &i in &src {
                assert!(!seen[i], "{ty}: byte {i} twice");
                seen[i] = true;
            }
        }
        assert!(repacked_source(GgmlType::Q5_K, 1, 256).is_none());
    }

    #[test]
    fn a_warps_q4_k_load_reads_consecutive_bytes() {
        // Lane 4s + c of a warp reads, in its first load, chunk c's first 16 quant bytes of
        // super-block s: 32 lanes, 512 consecutive bytes of the repacked row.
        let (rows, cols) = (1, 4096);
        let src = repacked_source(GgmlType::Q4_K, rows, cols).unwrap();
        for lane in 0..32 {
            let (sb, c) = (lane / 4, lane % 4);
            assert_eq!(src[lane * 16], sb * 144 + 16 + 32 * c, "lane {lane}");
        }
        // The heads follow both quant regions: 16 super-blocks, 128 bytes of quants each.
        assert_eq!(src[16 * 128 + 16], 144);
        // Q6_K: lane 2h + g of super-block 1, first load: its ql at 64h + 16g.
        let q6 = repacked_source(GgmlType::Q6_K, rows, cols).unwrap();
        for k in 0..4 {
            assert_eq!(q6[64 + k * 16], 210 + 64 * (k / 2) + 16 * (k % 2));
        }
        // The d table after the rows.
        assert_eq!(q6[16 * 208], 208);
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
