//! Dot products of one weight row (ggml block layout) with one activation row, per weight type
//! and instruction set, plus the AVX-512 GEMM microkernels that reproduce them tile-wise.
//!
//! Quantized weights meet activations quantized by [`super::act_quant`]: sums of integer
//! products inside each block are exact, and only the float combination with the block scales
//! rounds. Every ISA level combines them in one canonical order (documented in `avx512`), so
//! results are bit-identical across levels as well as across routes: the same model gives the
//! same logits on a machine with AVX-512, with AVX2 only, or with neither. Files:
//! `layout` (block formats, portable), `scalar`, `decode_x86` (AVX2 block decoders), `avx2`,
//! `avx512` (row kernels), `gemm_avx512` and `gemm_avx2` (tiles), `gemm_pack` (their activation
//! layout).

pub(crate) mod layout;
pub(crate) mod scalar;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod decode_x86;
#[cfg(target_arch = "x86_64")]
pub(crate) mod gemm_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod gemm_avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod gemm_pack;

use tandem_gguf::GgmlType;

use super::act_quant::{ActFormat, Q8KRow, Q8Row};
pub use super::isa::Isa;
use crate::BackendError;

/// How a weight type's rows are multiplied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightClass {
    /// 32-element blocks against [`ActFormat::Q8`] activations.
    Legacy,
    /// 256-element super-blocks against [`ActFormat::Q8K`] activations.
    KQuant,
    /// F32 / F16 / BF16 against f32 activations.
    Float,
}

impl WeightClass {
    /// The class of `ty`, or `None` when there is no kernel for it.
    pub fn of(ty: GgmlType) -> Option<WeightClass> {
        use GgmlType::*;
        match ty {
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 => Some(WeightClass::Legacy),
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => Some(WeightClass::KQuant),
            F32 | F16 | BF16 => Some(WeightClass::Float),
            _ => None,
        }
    }

    /// The activation format consumed, `None` for float weights (which take f32).
    pub fn act_format(self) -> Option<ActFormat> {
        match self {
            WeightClass::Legacy => Some(ActFormat::Q8),
            WeightClass::KQuant => Some(ActFormat::Q8K),
            WeightClass::Float => None,
        }
    }
}

pub(crate) type DotQ8 = unsafe fn(&[u8], &Q8Row) -> f32;
pub(crate) type Dot4Q8 = unsafe fn([&[u8]; 4], &Q8Row) -> [f32; 4];
/// Four weight rows against `N` activation rows, each decoded weight block serving them all, with
/// each activation row's `Dot4Q8` bits.
pub(crate) type Dot4xnQ8<const N: usize> = unsafe fn([&[u8]; 4], [&Q8Row; N]) -> [[f32; 4]; N];
pub(crate) type DotQ8K = unsafe fn(&[u8], &Q8KRow) -> f32;
pub(crate) type Dot4Q8K = unsafe fn([&[u8]; 4], &Q8KRow) -> [f32; 4];
/// As [`Dot4xnQ8`], for K-quant weights against Q8_K rows (each row with its `Dot4Q8K` bits).
pub(crate) type Dot4xnQ8K<const N: usize> = unsafe fn([&[u8]; 4], [&Q8KRow; N]) -> [[f32; 4]; N];
/// [`Dot4xnQ8`] or [`Dot4xnQ8K`] for activation rows of type `A`, which code serving both takes.
pub(crate) type Dot4xn<A, const N: usize> = unsafe fn([&[u8]; 4], [&A; N]) -> [[f32; 4]; N];
/// A row kernel's batched forms: four weight rows against two, three or four activation rows a pass.
#[derive(Clone, Copy)]
pub(crate) struct Batched<F2, F3, F4> {
    pub(crate) two: F2,
    pub(crate) three: F3,
    pub(crate) four: F4,
}

/// The batched forms for activation rows of type `A` ([`Dot4xn`]), which code serving both takes.
pub(crate) type BatchedFor<A> = Batched<Dot4xn<A, 2>, Dot4xn<A, 3>, Dot4xn<A, 4>>;
pub(crate) type BatchedQ8 = Batched<Dot4xnQ8<2>, Dot4xnQ8<3>, Dot4xnQ8<4>>;
pub(crate) type BatchedQ8K = Batched<Dot4xnQ8K<2>, Dot4xnQ8K<3>, Dot4xnQ8K<4>>;

pub(crate) type DotF = unsafe fn(&[u8], &[f32]) -> f32;
pub(crate) type Dot4F = unsafe fn([&[u8]; 4], &[f32]) -> [f32; 4];
pub(crate) type TileF = unsafe fn([&[u8]; 4], [&[f32]; 4]) -> [[f32; 4]; 4];

/// The row kernels of one weight type at one ISA level. Calling them is sound once the level
/// has been checked available (as [`row_kernel`] does) and slices have the right sizes.
#[derive(Clone, Copy)]
pub(crate) enum RowKernel {
    Q8 {
        dot: DotQ8,
        dot4: Option<Dot4Q8>,
        /// Batches of activation rows (two to four at a time), where the level has them.
        batch: Option<BatchedQ8>,
    },
    Q8K {
        dot: DotQ8K,
        dot4: Option<Dot4Q8K>,
        /// As for `Q8`.
        batch: Option<BatchedQ8K>,
    },
    /// `tile` (4 weight rows × 4 activation rows) serves batches.
    Float {
        dot: DotF,
        dot4: Option<Dot4F>,
        tile: Option<TileF>,
    },
}

macro_rules! by_legacy {
    ($ty:expr, $f:ident) => {
        match $ty {
            GgmlType::Q4_0 => $f::<layout::Q4_0>,
            GgmlType::Q4_1 => $f::<layout::Q4_1>,
            GgmlType::Q5_0 => $f::<layout::Q5_0>,
            GgmlType::Q5_1 => $f::<layout::Q5_1>,
            _ => $f::<layout::Q8_0>,
        }
    };
}

macro_rules! by_kquant {
    ($ty:expr, $f:ident) => {
        match $ty {
            GgmlType::Q2_K => $f::<layout::Q2K>,
            GgmlType::Q3_K => $f::<layout::Q3K>,
            GgmlType::Q4_K => $f::<layout::Q4K>,
            GgmlType::Q5_K => $f::<layout::Q5K>,
            _ => $f::<layout::Q6K>,
        }
    };
}

macro_rules! by_float {
    ($ty:expr, $f:ident $(, $extra:tt)?) => {
        match $ty {
            GgmlType::F32 => $f::<0 $(, $extra)?>,
            GgmlType::F16 => $f::<1 $(, $extra)?>,
            _ => $f::<2 $(, $extra)?>,
        }
    };
}

/// The kernels for `ty` at `isa` (downgraded to scalar if the CPU lacks it).
pub(crate) fn row_kernel(isa: Isa, ty: GgmlType) -> Option<RowKernel> {
    let class = WeightClass::of(ty)?;
    #[cfg(target_arch = "x86_64")]
    {
        use x86_wrap::*;
        match (isa.or_scalar(), class) {
            (Isa::Avx512, WeightClass::Legacy) => {
                return Some(RowKernel::Q8 {
                    dot: by_legacy!(ty, dot1_legacy_512),
                    dot4: Some(by_legacy!(ty, dot4_legacy_512)),
                    batch: Some(Batched {
                        two: by_legacy!(ty, dot4x2_legacy_512),
                        three: by_legacy!(ty, dot4x3_legacy_512),
                        four: by_legacy!(ty, dot4x4_legacy_512),
                    }),
                })
            }
            (Isa::Avx2, WeightClass::Legacy) => {
                return Some(RowKernel::Q8 {
                    dot: by_legacy!(ty, dot1_legacy_256),
                    dot4: Some(by_legacy!(ty, dot4_legacy_256)),
                    batch: Some(Batched {
                        two: by_legacy!(ty, dot4x2_legacy_256),
                        three: by_legacy!(ty, dot4x3_legacy_256),
                        four: by_legacy!(ty, dot4x4_legacy_256),
                    }),
                })
            }
            (Isa::Avx512, WeightClass::KQuant) => {
                return Some(RowKernel::Q8K {
                    dot: by_kquant!(ty, dot_kquant_512),
                    dot4: Some(by_kquant!(ty, dot4_kquant_512)),
                    batch: Some(Batched {
                        two: by_kquant!(ty, dot4x2_kquant_512),
                        three: by_kquant!(ty, dot4x3_kquant_512),
                        four: by_kquant!(ty, dot4x4_kquant_512),
                    }),
                })
            }
            (Isa::Avx2, WeightClass::KQuant) => {
                return Some(RowKernel::Q8K {
                    dot: by_kquant!(ty, dot_kquant_256),
                    dot4: Some(by_kquant!(ty, dot4_kquant_256)),
                    batch: Some(Batched {
                        two: by_kquant!(ty, dot4x2_kquant_256),
                        three: by_kquant!(ty, dot4x3_kquant_256),
                        four: by_kquant!(ty, dot4x4_kquant_256),
                    }),
                })
            }
            (Isa::Avx512, WeightClass::Float) => {
                return Some(RowKernel::Float {
                    dot: by_float!(ty, dot1_float_512),
                    dot4: Some(by_float!(ty, dot4_float_512)),
                    tile: Some(by_float!(ty, tile4x4_float_512)),
                })
            }
            (Isa::Avx2, WeightClass::Float) => {
                return Some(RowKernel::Float {
                    dot: by_float!(ty, dot_float_256),
                    dot4: None,
                    tile: None,
                })
            }
            _ => {}
        }
    }
    let _ = isa; // only x86 has levels above scalar
    use scalar::*;
    Some(match class {
        WeightClass::Legacy => RowKernel::Q8 {
            dot: by_legacy!(ty, dot_legacy),
            dot4: None,
            batch: None,
        },
        WeightClass::KQuant => RowKernel::Q8K {
            dot: by_kquant!(ty, dot_kquant),
            dot4: None,
            batch: None,
        },
        WeightClass::Float => RowKernel::Float {
            dot: by_float!(ty, dot_float),
            dot4: None,
            tile: None,
        },
    })
}

/// Monomorphic entry points with the signatures of [`RowKernel`].
#[cfg(target_arch = "x86_64")]
mod x86_wrap {
    use super::super::act_quant::{Q8KRow, Q8Row};
    use super::decode_x86::KDecode;
    use super::layout::Legacy;
    use super::{avx2, avx512};

    pub(crate) unsafe fn dot4_legacy_512<T: Legacy>(w: [&[u8]; 4], a: &Q8Row) -> [f32; 4] {
        unsafe { avx512::dot4_legacy::<T>(w, a) }
    }
    pub(crate) unsafe fn dot4x2_legacy_512<T: Legacy>(w: [&[u8]; 4], a: [&Q8Row; 2]) -> [[f32; 4]; 2] {
        unsafe { avx512::dot4xn_legacy::<T, 2>(w, a) }
    }
    pub(crate) unsafe fn dot4x3_legacy_512<T: Legacy>(w: [&[u8]; 4], a: [&Q8Row; 3]) -> [[f32; 4]; 3] {
        unsafe { avx512::dot4xn_legacy::<T, 3>(w, a) }
    }
    pub(crate) unsafe fn dot4x4_legacy_512<T: Legacy>(w: [&[u8]; 4], a: [&Q8Row; 4]) -> [[f32; 4]; 4] {
        unsafe { avx512::dot4xn_legacy::<T, 4>(w, a) }
    }
    pub(crate) unsafe fn dot1_legacy_512<T: Legacy>(w: &[u8], a: &Q8Row) -> f32 {
        unsafe { avx512::dot4_legacy::<T>([w; 4], a)[0] }
    }
    pub(crate) unsafe fn dot1_legacy_256<T: Legacy>(w: &[u8], a: &Q8Row) -> f32 {
        unsafe { avx2::dot4xn_legacy::<T, 1>([w; 4], [a])[0][0] }
    }
    pub(crate) unsafe fn dot4_legacy_256<T: Legacy>(w: [&[u8]; 4], a: &Q8Row) -> [f32; 4] {
        unsafe { avx2::dot4xn_legacy::<T, 1>(w, [a])[0] }
    }
    pub(crate) unsafe fn dot4x2_legacy_256<T: Legacy>(w: [&[u8]; 4], a: [&Q8Row; 2]) -> [[f32; 4]; 2] {
        unsafe { avx2::dot4xn_legacy::<T, 2>(w, a) }
    }
    pub(crate) unsafe fn dot4x3_legacy_256<T: Legacy>(w: [&[u8]; 4], a: [&Q8Row; 3]) -> [[f32; 4]; 3] {
        unsafe { avx2::dot4xn_legacy::<T, 3>(w, a) }
    }
    pub(crate) unsafe fn dot4x4_legacy_256<T: Legacy>(w: [&[u8]; 4], a: [&Q8Row; 4]) -> [[f32; 4]; 4] {
        unsafe { avx2::dot4xn_legacy::<T, 4>(w, a) }
    }
    pub(crate) unsafe fn dot_kquant_512<T: KDecode>(w: &[u8], a: &Q8KRow) -> f32 {
        unsafe { avx512::dot_kquant::<T>(w, a) }
    }
    pub(crate) unsafe fn dot4_kquant_512<T: KDecode>(w: [&[u8]; 4], a: &Q8KRow) -> [f32; 4] {
        unsafe { avx512::dot4_kquant::<T>(w, a) }
    }
    pub(crate) unsafe fn dot4x2_kquant_512<T: KDecode>(w: [&[u8]; 4], a: [&Q8KRow; 2]) -> [[f32; 4]; 2] {
        unsafe { avx512::dot4xn_kquant::<T, 2>(w, a) }
    }
    pub(crate) unsafe fn dot4x3_kquant_512<T: KDecode>(w: [&[u8]; 4], a: [&Q8KRow; 3]) -> [[f32; 4]; 3] {
        unsafe { avx512::dot4xn_kquant::<T, 3>(w, a) }
    }
    pub(crate) unsafe fn dot4x4_kquant_512<T: KDecode>(w: [&[u8]; 4], a: [&Q8KRow; 4]) -> [[f32; 4]; 4] {
        unsafe { avx512::dot4xn_kquant::<T, 4>(w, a) }
    }
    pub(crate) unsafe fn dot_kquant_256<T: KDecode>(w: &[u8], a: &Q8KRow) -> f32 {
        unsafe { avx2::dot_kquant::<T>(w, a) }
    }
    pub(crate) unsafe fn dot4_kquant_256<T: KDecode>(w: [&[u8]; 4], a: &Q8KRow) -> [f32; 4] {
        unsafe { avx2::dot4xn_kquant::<T, 1>(w, [a])[0] }
    }
    pub(crate) unsafe fn dot4x2_kquant_256<T: KDecode>(w: [&[u8]; 4], a: [&Q8KRow; 2]) -> [[f32; 4]; 2] {
        unsafe { avx2::dot4xn_kquant::<T, 2>(w, a) }
    }
    pub(crate) unsafe fn dot4x3_kquant_256<T: KDecode>(w: [&[u8]; 4], a: [&Q8KRow; 3]) -> [[f32; 4]; 3] {
        unsafe { avx2::dot4xn_kquant::<T, 3>(w, a) }
    }
    pub(crate) unsafe fn dot4x4_kquant_256<T: KDecode>(w: [&[u8]; 4], a: [&Q8KRow; 4]) -> [[f32; 4]; 4] {
        unsafe { avx2::dot4xn_kquant::<T, 4>(w, a) }
    }
    pub(crate) unsafe fn dot1_float_512<const F: u8>(w: &[u8], x: &[f32]) -> f32 {
        unsafe { avx512::dot_tile_float::<F, 1, 1>([w], [x])[0][0] }
    }
    pub(crate) unsafe fn dot4_float_512<const F: u8>(w: [&[u8]; 4], x: &[f32]) -> [f32; 4] {
        unsafe { avx512::dot_tile_float::<F, 4, 1>(w, [x]).map(|r| r[0]) }
    }
    pub(crate) unsafe fn tile4x4_float_512<const F: u8>(w: [&[u8]; 4], x: [&[f32]; 4]) -> [[f32; 4]; 4] {
        unsafe { avx512::dot_tile_float::<F, 4, 4>(w, x) }
    }
    pub(crate) unsafe fn dot_float_256<const F: u8>(w: &[u8], x: &[f32]) -> f32 {
        unsafe { avx2::dot_float::<F>(w, x) }
    }
}

/// A GEMM task runner (quantized types only).
#[cfg(target_arch = "x86_64")]
pub(crate) type GemmTask = unsafe fn(&gemm_avx512::TaskSpec, &mut gemm_avx512::Panel, gemm_avx512::OutTile);

/// One level's GEMM for one weight type: its task runner and how it packs activations.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Gemm {
    pub(crate) task: GemmTask,
    /// Activation rows per vector, and per packed group.
    pub(crate) lanes: usize,
    /// Activation groups per register tile, at most.
    pub(crate) nr: usize,
    /// Packs group `g` of the quantized activations into the slice.
    pub(crate) pack: fn(&super::act_quant::QuantizedActs, usize, &mut [u8]),
    /// Bytes of one packed group of `k` columns.
    pub(crate) group_bytes: fn(usize) -> usize,
}

/// The GEMM for `ty` at `isa` (AVX-512 VNNI or AVX2; quantized types only).
#[cfg(target_arch = "x86_64")]
pub(crate) fn gemm(isa: Isa, ty: GgmlType) -> Option<Gemm> {
    macro_rules! tasks {
        ($m:ident) => {{
            use $m::{task_kquant, task_legacy};
            let task: GemmTask = match WeightClass::of(ty)? {
                WeightClass::Legacy => by_legacy!(ty, task_legacy),
                WeightClass::KQuant => match ty {
                    GgmlType::Q2_K => task_kquant::<layout::Q2K, 16>,
                    GgmlType::Q3_K => task_kquant::<layout::Q3K, 16>,
                    GgmlType::Q4_K => task_kquant::<layout::Q4K, 32>,
                    GgmlType::Q5_K => task_kquant::<layout::Q5K, 32>,
                    _ => task_kquant::<layout::Q6K, 16>,
                },
                WeightClass::Float => return None,
            };
            let kq = WeightClass::of(ty) == Some(WeightClass::KQuant);
            Gemm {
                task,
                lanes: $m::LANES,
                nr: $m::NR,
                pack: if kq { $m::pack_group_q8k } else { $m::pack_group_q8 },
                group_bytes: if kq {
                    |k| $m::group_bytes(true, k)
                } else {
                    |k| $m::group_bytes(false, k)
                },
            }
        }};
    }
    Some(match isa.or_scalar() {
        Isa::Avx512 => tasks!(gemm_avx512),
        // Q8_0's bytes would saturate the AVX2 tile's i16 pair sums unless split into nibbles, two
        // products each, and so split its GEMM lost to the row kernels (four activation rows a
        // pass) at every batch measured: 2 threads, Gemma 3's 640 × 262,144 head and SmolLM2's 576
        // × 49,152, 84-90 against 126 GFLOP/s at t = 16 and 32; one thread, 640 × 16,384, 45-46
        // against 64 from t = 16 to 64.
        Isa::Avx2 if ty == GgmlType::Q8_0 => return None,
        Isa::Avx2 => tasks!(gemm_avx2),
        Isa::Scalar => return None,
    })
}

/// How far ahead of the current position the row kernels prefetch weights.
pub(crate) const PREFETCH_BYTES: usize = 768;

/// Asks for the cache lines of `bytes` (a no-op off x86-64).
#[inline]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..bytes.len()).step_by(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: prefetching has no side effects, and the address lies within `bytes`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().add(off) as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

fn check_row(ty: GgmlType, w: &[u8], cols: usize) -> Result<(), BackendError> {
    let block = ty.block_elems();
    if !cols.is_multiple_of(block) {
        return Err(BackendError::NotWholeBlocks { ty, cols, block });
    }
    let expected = cols / block * ty.block_bytes();
    if w.len() != expected {
        return Err(BackendError::WeightSize {
            ty,
            rows: 1,
            cols,
            expected,
            got: w.len(),
        });
    }
    Ok(())
}

fn check_q8_row(cols: usize, nb: usize, a_d: usize, extra: &[usize]) -> Result<(), BackendError> {
    if a_d != nb || extra.iter().any(|&l| l != nb) || cols != nb * 32 {
        return Err(BackendError::ActivationRow { cols });
    }
    Ok(())
}

/// One legacy-type weight row (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`) against one Q8 row.
pub fn dot_q8(isa: Isa, ty: GgmlType, w: &[u8], a: &Q8Row) -> Result<f32, BackendError> {
    if WeightClass::of(ty) != Some(WeightClass::Legacy) {
        return Err(BackendError::UnsupportedType(ty));
    }
    let cols = a.qs.len();
    check_row(ty, w, cols)?;
    check_q8_row(cols, cols / 32, a.d.len(), &[a.sum.len(), a.s.len()])?;
    match row_kernel(isa, ty) {
        // SAFETY: `row_kernel` checked the ISA; sizes were checked above.
        Some(RowKernel::Q8 { dot, .. }) => Ok(unsafe { dot(w, a) }),
        _ => Err(BackendError::UnsupportedType(ty)),
    }
}

/// One K-quant weight row (`Q2_K` … `Q6_K`) against one Q8_K row.
pub fn dot_q8k(isa: Isa, ty: GgmlType, w: &[u8], a: &Q8KRow) -> Result<f32, BackendError> {
    if WeightClass::of(ty) != Some(WeightClass::KQuant) {
        return Err(BackendError::UnsupportedType(ty));
    }
    let cols = a.qs.len();
    check_row(ty, w, cols)?;
    if a.d.len() * 256 != cols || a.bsums.len() * 16 != cols {
        return Err(BackendError::ActivationRow { cols });
    }
    match row_kernel(isa, ty) {
        // SAFETY: as in `dot_q8`.
        Some(RowKernel::Q8K { dot, .. }) => Ok(unsafe { dot(w, a) }),
        _ => Err(BackendError::UnsupportedType(ty)),
    }
}

/// One float weight row (`F32`, `F16`, `BF16`) against f32 activations.
pub fn dot_f32(isa: Isa, ty: GgmlType, w: &[u8], x: &[f32]) -> Result<f32, BackendError> {
    if WeightClass::of(ty) != Some(WeightClass::Float) {
        return Err(BackendError::UnsupportedType(ty));
    }
    check_row(ty, w, x.len())?;
    match row_kernel(isa, ty) {
        // SAFETY: as in `dot_q8`.
        Some(RowKernel::Float { dot, .. }) => Ok(unsafe { dot(w, x) }),
        _ => Err(BackendError::UnsupportedType(ty)),
    }
}
