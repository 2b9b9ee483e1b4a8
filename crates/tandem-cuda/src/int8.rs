//! Launchers of the integer decode route (`kernels/mmvq.cu`): activations quantized to int8 as the CPU
//! backend quantizes them, weights repacked once into aligned blocks where their ggml layout is not,
//! and matvecs that multiply the two with `dp4a`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
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
        ActQuant::Q8K => ("quantize_q8k", launch_cfg((blocks(cols / 256, 4), t as u32, 1), 128)),
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

/// One of the integer kernels of a weight type: `unroll` steps of loads a lane issues before it
/// computes, `rows` consecutive weight rows per group (sharing the activation loads), `split` warps
/// per group (1, or 4 splitting a row's blocks). Variants of one `split` give the same bits; `split`
/// sets the order of a row's sums, and a matrix keeps one variant for every row count. The load-time
/// timing keeps the fastest per shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmvqVariant {
    pub unroll: u32,
    pub rows: u32,
    pub split: u32,
}

impl MmvqVariant {
    pub fn kernel(self, suffix: &str, batched: bool) -> String {
        let b = if batched { "b" } else { "" };
        format!("mmvq{b}_{suffix}_u{}_r{}_s{}", self.unroll, self.rows, self.split)
    }

    /// Thread blocks (of four warps) for `rows` weight rows.
    pub fn blocks(self, rows: usize) -> u32 {
        let groups = rows / self.rows as usize;
        if self.split == 1 {
            blocks(groups, 4)
        } else {
            groups.max(1) as u32
        }
    }

    /// Whether it can take matrices of these row counts (whole groups of `rows`).
    pub fn fits(self, rows: &[usize]) -> bool {
        rows.iter().all(|r| r.is_multiple_of(self.rows as usize))
    }
}

/// The variants `kernels/mmvq.cu` instantiates for `suffix`.
pub fn variants(suffix: &str) -> Vec<MmvqVariant> {
    let v = |unroll, rows, split| MmvqVariant { unroll, rows, split };
    match suffix {
        // Q4_K's rows of 4096 are 16 super-blocks, too few to split four ways; four rows a warp and
        // every split lost to two rows a warp on every 8B shape timed (docs/gpu-runs/2026-11-29-late).
        "q4_k" => vec![v(1, 1, 1), v(2, 1, 1), v(4, 1, 1), v(1, 2, 1), v(2, 2, 1)],
        "q8_0" => vec![v(2, 1, 1), v(4, 1, 1), v(8, 1, 1), v(1, 1, 4), v(2, 1, 4)],
        _ => vec![v(1, 1, 1), v(2, 1, 1), v(4, 1, 1), v(1, 1, 4), v(2, 1, 4)],
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

/// One launch for up to three matrices of type `suffix` and width `cols` that read the same
/// quantized activations `a` (q, k and v; gate and up): fewer launches, and the small matrices'
/// rows fill the GPU alongside the big one's. Each output row has the bits it has alone.
pub fn mmvq_group_into(
    gpu: &Gpu,
    suffix: &str,
    variant: MmvqVariant,
    targets: &mut [MmvqTarget<'_>],
    a: &CudaSlice<u8>,
    t: usize,
    cols: usize,
) -> Result<(), CudaError> {
    if targets.is_empty() || targets.len() > 3 {
        return Err(CudaError::Driver {
            what: format!("mmvq_{suffix}"),
            err: format!("{} matrices in one launch (1 to 3)", targets.len()),
        });
    }
    // One row takes the single kernel, more the batched one: same sums, same bits.
    let name = variant.kernel(suffix, t > 1);
    let per_block = if t > 1 { MV_BATCH } else { 1 };
    let row_counts: Vec<usize> = targets.iter().map(|g| g.rows).collect();
    if !variant.fits(&row_counts) {
        return Err(CudaError::Driver {
            what: name,
            err: format!("rows {row_counts:?} are not whole groups of {}", variant.rows),
        });
    }
    let f = gpu.function(&name)?;
    let stream = &gpu.stream;
    let total: usize = row_counts.iter().sum();
    let mut rows = [0i32; 3];
    for (r, g) in rows.iter_mut().zip(targets.iter()) {
        *r = i32_of(g.rows, "rows")?;
    }
    let (c, n) = (i32_of(cols, "cols")?, i32_of(t, "t")?);
    i32_of(total, "rows")?;
    // Raw pointers: a slot past the targets repeats the first, and its zero rows keep it unread.
    let mut w_ptrs = [0u64; 3];
    let mut y_ptrs = [0u64; 3];
    let n_targets = targets.len();
    let mut guards = Vec::with_capacity(6);
    for (i, g) in targets.iter_mut().enumerate() {
        let (w, gw) = g.w.device_ptr(stream);
        let (y, gy) = g.out.device_ptr_mut(stream);
        (w_ptrs[i], y_ptrs[i]) = (w, y);
        guards.push(gw);
        guards.push(gy);
    }
    for i in n_targets..3 {
        (w_ptrs[i], y_ptrs[i]) = (w_ptrs[0], y_ptrs[0]);
    }
    let mut b = stream.launch_builder(f);
    b.arg(&w_ptrs[0]).arg(&w_ptrs[1]).arg(&w_ptrs[2]).arg(a);
    b.arg(&y_ptrs[0]).arg(&y_ptrs[1]).arg(&y_ptrs[2]);
    b.arg(&rows[0]).arg(&rows[1]).arg(&rows[2]).arg(&c).arg(&n);
    driver(&name, unsafe {
        b.launch(launch_cfg((variant.blocks(total), blocks(t, per_block), 1), 128))
    })?;
    drop(guards);
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
    fn variants_take_whole_row_groups() {
        let two = MmvqVariant {
            unroll: 1,
            rows: 2,
            split: 1,
        };
        assert!(two.fits(&[4096, 1024, 1024]));
        assert!(!two.fits(&[4096, 1023]));
        // Four warps a block, two rows a warp: 4096 rows in 512 blocks.
        assert_eq!(two.blocks(4096), 512);
        assert_eq!(
            MmvqVariant {
                unroll: 4,
                rows: 1,
                split: 1
            }
            .blocks(1026),
            257
        );
        assert_eq!(two.kernel("q4_k", true), "mmvqb_q4_k_u1_r2_s1");
        // One row a warp fits anything, so every type has a variant for every shape.
        for suffix in ["q4_k", "q6_k", "q8_0"] {
            assert!(variants(suffix).iter().any(|v| v.fits(&[1, 3, 5])), "{suffix}");
        }
    }

    #[test]
    fn a_split_group_takes_a_whole_block() {
        // Four warps share one group: a block per group, so 4096 rows make 4096 blocks (a grid sized
        // for one group per warp would leave three quarters of the rows unwritten).
        let split = MmvqVariant {
            unroll: 1,
            rows: 1,
            split: 4,
        };
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
    fn only_types_with_a_dp4a_kernel_take_the_integer_route() {
        assert_eq!(int8_format(GgmlType::Q4_K), Some(ActQuant::Q8K));
        assert_eq!(int8_format(GgmlType::Q6_K), Some(ActQuant::Q8K));
        assert_eq!(int8_format(GgmlType::Q8_0), Some(ActQuant::Q8));
        assert_eq!(int8_format(GgmlType::Q5_K), None);
        assert_eq!(int8_format(GgmlType::F16), None);
    }
}
